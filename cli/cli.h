/*
 * cli/cli.h: the commands of the flint command, each in its own file, and what they share.
 *
 * Each takes the arguments after its name and returns the process's exit status: 0 on
 * success, 2 for a usage error (one line on stderr and a hint), 1 when the work failed.
 */
#ifndef FLINT_CLI_H
#define FLINT_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* flint submit, driver, executor and status (cli/cluster.c). cmd_executor's `whole` is the
 * command line as run, for the supervised child that runs it again. */
int cmd_submit(int argc, char **argv);
int cmd_driver(int argc, char **argv);
int cmd_executor(int argc, char **argv, char **whole);
int cmd_status(int argc, char **argv);
/* flint config [--json] (cli/config.c): every setting with its value and its source. */
int cmd_config(int argc, char **argv);
/* flint ml linreg|logreg ... (cli/ml.c): trains a model with libflint_ml. */
int cmd_ml(int argc, char **argv);
/* flint train --model ... --data ... (cli/train.c): data-parallel SGD with libflint_gpu. It is
 * the program flint-train (cli/train_main.c), which `flint train` runs: only it links
 * libflint_gpu and with it CUDA's libraries, whose loading (0.4 s) would otherwise slow the
 * start of every flint process (drivers, executors, submit). */
int cmd_train(int argc, char **argv);

/* flint's usage (cli/usage.c), which --help after any command prints. */
extern const char cli_usage_text[];
/* Prints "flint: " fmt (with arg) and a pointer to --help on stderr; returns 2. */
int cli_usage_error(const char *fmt, const char *arg);

/* Strict option values (cli/args.c): false unless the whole text is the number, in range. */
bool cli_parse_double(const char *text, double *out);
bool cli_parse_u64(const char *text, uint64_t max, uint64_t *out);
bool cli_parse_u32(const char *text, uint32_t *out);

#endif
