/*
 * main.c: the flint command: the dispatch to the commands, which live in cli/cluster.c
 * (submit, driver, executor, status), cli/config.c, cli/ml.c and cli/train.c; the usage text
 * is cli/usage.c's.
 *
 * Exit status: 0 for --help and --version (also after a command); the job's own status for
 * submit; 2 for a usage error, a bad option value included; 1 when the work failed (missing
 * library, missing flint_main, bad master, unreachable driver). Errors read "flint CMD: cause".
 *
 * Settings (common/config.h): `--conf KEY=VALUE`, any number, on every command, is taken
 * here before the command sees its arguments; it overrides the environment and
 * flint-defaults.conf, for this process and (set in the environment) the processes it starts.
 * Then an invalid flint-defaults.conf, or an unknown FLINT_LOG level, stops every command
 * (status 1) but `flint config`, which shows them.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/config.h"
#include "flint/flint.h"

/* submit's options that take no value: its options end at JOB.so, the first word that is
 * neither an option nor an option's value, and what follows is the job's (--conf too). */
static bool takes_no_value(const char *arg) {
  static const char *const flags[] = {"--detach", "--in-process", "--help", "-h", "--version", "-V", NULL};
  if (arg[0] == '-' && arg[1] != '-') return true; /* -h, -V: submit's short options take none */
  if (strchr(arg, '=')) return true;               /* --opt=value */
  for (int i = 0; flags[i]; i++)
    if (strcmp(arg, flags[i]) == 0) return true;
  return false;
}

/* Takes every `--conf KEY=VALUE` and `--conf=KEY=VALUE` out of the command's arguments
 * (args[0 .. *argc), shifting the rest down) and applies it; stops at "--" and, for submit,
 * at JOB.so. Returns 0, or the status of the usage error it reported. */
static int take_conf_options(const char *cmd, int *argc, char **args) {
  bool submit = strcmp(cmd, "submit") == 0;
  int out = 0, i = 0;
  for (; i < *argc; i++) {
    const char *arg = args[i], *assignment = NULL;
    if (strcmp(arg, "--") == 0) break;
    if (strcmp(arg, "--conf") == 0) {
      if (i + 1 >= *argc) return cli_usage_error(cmd, "--conf needs a value (KEY=VALUE)");
      assignment = args[++i];
    } else if (strncmp(arg, "--conf=", 7) == 0) {
      assignment = arg + 7;
    }
    if (!assignment) {
      args[out++] = args[i];
      if (submit && arg[0] != '-') { /* JOB.so */
        i++;
        break;
      }
      if (submit && arg[0] == '-' && !takes_no_value(arg) && i + 1 < *argc) args[out++] = args[++i];
      continue;
    }
    if (config_set_command_line(assignment) != FL_OK) return cli_usage_error(cmd, "--conf: %s", fl_last_error());
    config_id id;
    char key[96];
    snprintf(key, sizeof key, "%.*s", (int)(strchr(assignment, '=') - assignment), assignment);
    if (config_find_key(key, &id) && config_check(id) != FL_OK)
      return cli_usage_error(cmd, "--conf: %s", fl_last_error());
  }
  for (; i < *argc; i++) args[out++] = args[i]; /* the rest ("--" on), untouched */
  args[out] = NULL;
  *argc = out;
  return 0;
}

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
  if (argv[1][0] != '-') {
    const char *cmd = argv[1];
    int rest = argc - 2;
    int status = take_conf_options(cmd, &rest, argv + 2);
    if (status) return status;
    argc = rest + 2;
    if (strcmp(cmd, "config") != 0) {
      if (config_file_status() != FL_OK) return cli_failure(cmd, "%s", fl_last_error());
      if (common_log_check() != FL_OK) return cli_failure(cmd, "%s", fl_last_error());
    }
  }
  if (strcmp(argv[1], "submit") == 0) return cmd_submit(argc - 2, argv + 2);
  if (strcmp(argv[1], "driver") == 0) return cmd_driver(argc - 2, argv + 2);
  if (strcmp(argv[1], "executor") == 0) return cmd_executor(argc - 2, argv + 2, argv);
  if (strcmp(argv[1], "status") == 0) return cmd_status(argc - 2, argv + 2);
  if (strcmp(argv[1], "history") == 0) return cmd_history(argc - 2, argv + 2);
  if (strcmp(argv[1], "config") == 0) return cmd_config(argc - 2, argv + 2);
  if (strcmp(argv[1], "shell") == 0) return cmd_shell(argc - 2, argv + 2);
  if (strcmp(argv[1], "ml") == 0) return cmd_ml(argc - 2, argv + 2);
  if (strcmp(argv[1], "train") == 0) return run_train_program(argv + 1);
  if (argv[1][0] == '-') return cli_usage_error(NULL, "unknown option '%s' (a command comes first)", argv[1]);
  return cli_usage_error(NULL, "unknown command '%s'", argv[1]);
}
