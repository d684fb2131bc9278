/*
 * usage.c: the flint command's usage, which `flint --help` and --help after any command
 * print, and the one way a command reports a usage error.
 */
#include <stdio.h>

#include "cli/cli.h"

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
