/*
 * main.c: the flint command: its usage and the dispatch to the commands, which live in
 * cli/cluster.c (submit, driver, executor, status), cli/config.c, cli/ml.c and cli/train.c.
 *
 * Exit status: the job's own status for submit; 2 for a usage error; 1 when something could
 * not be started (missing library, missing flint_main, bad master, unreachable driver).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "flint/flint.h"

const char cli_usage_text[] =
    "usage: flint <command> [options]\n"
    "\n"
    "commands:\n"
    "  submit [--master MASTER] [--memory SIZE] [--name NAME] [--detach] JOB.so [ARGS...]\n"
    "      Runs a job binary: a shared library exporting\n"
    "      int flint_main(fl_context *ctx, int argc, char **argv).\n"
    "      NAME: the application's name in 'flint status' (default: JOB.so's file name).\n"
    "      MASTER: local, local[N], local[*] (default), local-cluster[E,C,MB]\n"
    "      (starts a driver and E executors of C cores and MB megabytes here), or\n"
    "      flint://HOST:PORT: the driver runs the job, its output streams back here\n"
    "      and its exit status is flint's; --detach prints its id and returns.\n"
    "      SIZE: memory for cached blocks in local mode, e.g. 512m or 2g (default:\n"
    "      FLINT_MEMORY, else 60% of the machine's memory).\n"
    "  driver --listen HOST:PORT [--work-dir DIR] [--port-file FILE]\n"
    "      Runs a driver until SIGINT or SIGTERM.\n"
    "  executor --driver HOST:PORT --cores N --memory SIZE [--work-dir DIR] [--host HOST] [--gpu ID]\n"
    "      Runs an executor for that driver until SIGINT or SIGTERM.\n"
    "  status --master flint://HOST:PORT\n"
    "      Lists the driver's executors, applications and jobs.\n"
    "  ml linreg|logreg --data PATH --format libsvm|csv|idx [--master MASTER]\n"
    "      [--labels PATH] [--test PATH [--test-labels PATH]] [--lambda L] [--l1 L]\n"
    "      [--solver auto|normal|lbfgs|gd] [--iterations N] [--tol T] [--partitions P]\n"
    "      [--standardize] [--out MODEL]\n"
    "      Trains least squares or logistic regression (libflint_ml), printing each\n"
    "      iteration and the metrics; 'flint ml --help' explains the options.\n"
    "  train --model mlp|cnn|resnet18|transformer --data fashion-mnist|synthetic-imagenet\n"
    "      [--ranks R] [--device cpu|cuda] [--batch B] [--lr LR] [--warmup EPOCHS] [--epochs N]\n"
    "      [--dp D --tp T --pp P --schedule gpipe|1f1b|interleaved --microbatches M]\n"
    "      [--master M] [--csv PATH] [--svg PATH]\n"
    "      Synchronous data-parallel SGD (libflint_gpu) with a progress line per epoch\n"
    "      and the curves as CSV and SVG; the transformer trains on a data x tensor x\n"
    "      pipeline grid; 'flint train --help' explains the options.\n"
    "  config [--json]\n"
    "      Prints every setting (the FLINT_* environment variables): its value, where the\n"
    "      value came from (default or environment), its unit, the processes that read\n"
    "      it and what it does; --json prints one JSON object per setting.\n"
    "\n"
    "options:\n"
    "  --help     this text (also after a command)\n"
    "  --version  the version\n"
    "\n"
    "environment: FLINT_* variables set flint's tunables ('flint config' lists them), e.g.\n"
    "FLINT_SECRET or FLINT_SECRET_FILE (a shared secret that every process and client must\n"
    "present) and FLINT_LOG (error, warn, info, debug).\n";

int cli_usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "flint: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nRun 'flint --help' for usage.\n");
  return 2;
}

/* `flint train ARGS` runs flint-train ARGS, the program beside this one (cli/cli.h says
 * why). args: main's argv from "train" on, NULL-terminated; its first slot is reused. */
static int run_train_program(char **args) {
  char self[PATH_MAX], path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || n == (ssize_t)sizeof self - 1) { /* the second: cut short */
    fprintf(stderr, "flint train: cannot find this program's own path: %s\n",
            n <= 0 ? strerror(errno) : "too long");
    return 1;
  }
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  int len = snprintf(path, sizeof path, "%.*s/flint-train", slash ? (int)(slash - self) : 0, self);
  if (len < 0 || (size_t)len >= sizeof path) {
    fprintf(stderr, "flint train: the path of flint-train beside %s is too long\n", self);
    return 1;
  }
  args[0] = path;
  execv(path, args);
  fprintf(stderr, "flint train: cannot run %s (flint train is that program): %s\n", path, strerror(errno));
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) return cli_usage_error("%s", "no command given");
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    fputs(cli_usage_text, stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("flint %s\n", FL_VERSION_STRING);
    return 0;
  }
  if (strcmp(argv[1], "submit") == 0) return cmd_submit(argc - 2, argv + 2);
  if (strcmp(argv[1], "driver") == 0) return cmd_driver(argc - 2, argv + 2);
  if (strcmp(argv[1], "executor") == 0) return cmd_executor(argc - 2, argv + 2, argv);
  if (strcmp(argv[1], "status") == 0) return cmd_status(argc - 2, argv + 2);
  if (strcmp(argv[1], "config") == 0) return cmd_config(argc - 2, argv + 2);
  if (strcmp(argv[1], "ml") == 0) return cmd_ml(argc - 2, argv + 2);
  if (strcmp(argv[1], "train") == 0) return run_train_program(argv + 1);
  return cli_usage_error("unknown command '%s'", argv[1]);
}
