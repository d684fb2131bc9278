/*
 * cli/cli.h: the subcommands of the flint command that live in their own files.
 *
 * Each takes the arguments after its name and returns the process's exit status: 0 on
 * success, 2 for a usage error (one line on stderr and a hint), 1 when the work failed.
 */
#ifndef FLINT_CLI_H
#define FLINT_CLI_H

/* flint ml linreg|logreg ... (cli/ml.c): trains a model with libflint_ml. */
int cmd_ml(int argc, char **argv);
/* flint train --model ... --data ... (cli/train.c): data-parallel SGD with libflint_gpu. */
int cmd_train(int argc, char **argv);

#endif
