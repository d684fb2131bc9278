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
#include <getopt.h>

/* flint submit, driver, executor and status (cli/cluster.c). cmd_executor's `whole` is the
 * command line as run, for the supervised child that runs it again. */
int cmd_submit(int argc, char **argv);
int cmd_driver(int argc, char **argv);
int cmd_executor(int argc, char **argv, char **whole);
int cmd_status(int argc, char **argv);
int cmd_history(int argc, char **argv);
/* flint config [--json] (cli/config.c): every setting with its value and its source. */
int cmd_config(int argc, char **argv);
/* flint ml linreg|logreg ... (cli/ml.c): trains a model with libflint_ml. */
int cmd_ml(int argc, char **argv);
/* flint train --model ... --data ... (cli/train.c): data-parallel SGD with libflint_gpu. It is
 * the program flint-train (cli/train_main.c), which `flint train` runs: only it links
 * libflint_gpu and with it CUDA's libraries, whose loading (0.4 s) would otherwise slow the
 * start of every flint process (drivers, executors, submit). */
int cmd_train(int argc, char **argv);
/* `flint train compare`: runs' curves in one SVG (cli/train_compare.c, in flint-train). */
int cmd_train_compare(int argc, char **argv);

/* flint shell [--master M] (cli/shell.c): a prompt where C typed by the user runs at once
 * against a live context. */
int cmd_shell(int argc, char **argv);

/* The usage of flint and of each command (cli/usage.c): `flint --help` prints the first,
 * `flint CMD --help` its command's. */
extern const char cli_usage_text[];
extern const char cli_submit_usage[];
extern const char cli_driver_usage[];
extern const char cli_history_usage[];
extern const char cli_executor_usage[];
extern const char cli_status_usage[];
extern const char cli_config_usage[];
extern const char cli_shell_usage[];

/* The one error form of every command (cli/args.c), on stderr: "flint CMD: cause" (cmd NULL: "flint:
 * cause"). cli_usage_error adds the line "Run 'flint CMD --help' for usage." and returns 2,
 * the status of a usage error; cli_failure returns 1, the status of work that failed. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_failure(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "flint VERSION" on stdout (--version, anywhere); returns 0. */
int cli_print_version(void);

/* getopt_long for a command (cli/args.c): the options every command takes besides its own.
 * CLI_COMMON_LONG_OPTIONS ends a command's option table (before its {0} row); its short
 * options are "hV"; getopt_long returns CLI_OPT_HELP or CLI_OPT_VERSION for them. */
enum { CLI_OPT_HELP = 'h', CLI_OPT_VERSION = 'V' };
#define CLI_COMMON_LONG_OPTIONS {"help", no_argument, NULL, CLI_OPT_HELP}, {"version", no_argument, NULL, CLI_OPT_VERSION}
/* Reports what getopt_long returned '?' or ':' for (an unknown option, a missing value, a
 * value given to an option that takes none) in the one error form; returns 2. The optstring
 * must start with ':' (or "+:") so that a missing value is ':' and getopt prints nothing. */
int cli_option_error(const char *cmd, int c, char **argv, const struct option *longopts);

/* Strict option values (cli/args.c): false unless the whole text is the number, in range. */
bool cli_parse_double(const char *text, double *out);
bool cli_parse_u64(const char *text, uint64_t max, uint64_t *out);
bool cli_parse_u32(const char *text, uint32_t *out);
/* A memory option (--memory): common_parse_memory's sizes (a bare number is MiB), but not 0.
 * False for anything else. */
bool cli_parse_memory(const char *text, uint64_t *bytes);

#endif
