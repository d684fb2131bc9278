/*
 * main.c: the flint command: the dispatch to the commands, which live in cli/cluster.c
 * (submit, driver, executor, status), cli/config.c, cli/ml.c and cli/train.c; the usage text
 * is cli/usage.c's.
 *
 * Exit status: 0 for --help and --version (also after a command); the job's own status for
 * submit; 2 for a usage error, a bad option value included; 1 when the work failed (missing
 * library, missing flint_main, bad master, unreachable driver). Errors read "flint CMD: cause".
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "flint/flint.h"

/* `flint train ARGS` runs flint-train ARGS, the program beside this one (cli/cli.h says
 * why). args: main's argv from "train" on, NULL-terminated; its first slot is reused. */
static int run_train_program(char **args) {
  char self[PATH_MAX], path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || n == (ssize_t)sizeof self - 1) { /* the second: cut short */
    return cli_failure("train", "cannot find this program's own path: %s", n <= 0 ? strerror(errno) : "too long");
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  int len = snprintf(path, sizeof path, "%.*s/flint-train", slash ? (int)(slash - self) : 0, self);
  if (len < 0 || (size_t)len >= sizeof path) {
    return cli_failure("train", "the path of flint-train beside %s is too long", self);
  }
  args[0] = path;
  execv(path, args);
  return cli_failure("train", "cannot run %s (flint train is that program): %s", path, strerror(errno));
}

int main(int argc, char **argv) {
  if (argc < 2) return cli_usage_error(NULL, "no command given");
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    fputs(cli_usage_text, stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) return cli_print_version();
  if (strcmp(argv[1], "submit") == 0) return cmd_submit(argc - 2, argv + 2);
  if (strcmp(argv[1], "driver") == 0) return cmd_driver(argc - 2, argv + 2);
  if (strcmp(argv[1], "executor") == 0) return cmd_executor(argc - 2, argv + 2, argv);
  if (strcmp(argv[1], "status") == 0) return cmd_status(argc - 2, argv + 2);
  if (strcmp(argv[1], "config") == 0) return cmd_config(argc - 2, argv + 2);
  if (strcmp(argv[1], "shell") == 0) return cmd_shell(argc - 2, argv + 2);
  if (strcmp(argv[1], "ml") == 0) return cmd_ml(argc - 2, argv + 2);
  if (strcmp(argv[1], "train") == 0) return run_train_program(argv + 1);
  if (argv[1][0] == '-') return cli_usage_error(NULL, "unknown option '%s' (a command comes first)", argv[1]);
  return cli_usage_error(NULL, "unknown command '%s'", argv[1]);
}
