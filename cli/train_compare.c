/*
 * train_compare.c: `flint train compare`: several runs' curves (the CSV files of `flint train
 * --csv`, of any --sync mode, or of `flint ml ... --curves`) in one SVG: training loss against
 * time and against bytes sent, a series per run, as issue 35 compares synchronous, local,
 * stale-synchronous and asynchronous training.
 *
 * Exit status: 0; 2 for a usage error; 1 when a file cannot be read or written (the message
 * names it and the line).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gpu/parallel/train.h"

static const char compare_usage[] =
    "usage: flint train compare --svg OUT.svg [--title TEXT] RUN.csv[=LABEL]...\n"
    "\n"
    "Plots the training loss of each run against elapsed seconds and against MiB sent per\n"
    "worker, one series per run (the label defaults to the file's name). A run is a curves\n"
    "CSV with the columns train_loss (or loss), elapsed_s and sent_mb (or reduced_mb).\n";

int cmd_train_compare(int argc, char **argv) {
  const char *svg = NULL, *title = NULL;
  const char *files[CURVES_COMPARE_MAX];
  int nfiles = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(compare_usage, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--svg") == 0 || strcmp(argv[i], "--title") == 0) {
      if (i + 1 >= argc) return cli_usage_error("train compare", "%s needs a value", argv[i]);
      *(strcmp(argv[i], "--svg") == 0 ? &svg : &title) = argv[i + 1];
      i++;
      continue;
    }
    if (argv[i][0] == '-') return cli_usage_error("train compare", "unknown option %s", argv[i]);
    if (nfiles == CURVES_COMPARE_MAX)
      return cli_usage_error("train compare", "more than %d runs", CURVES_COMPARE_MAX);
    files[nfiles++] = argv[i];
  }
  if (!svg) return cli_usage_error("train compare", "--svg OUT.svg is required");
  if (nfiles == 0) return cli_usage_error("train compare", "no run to plot: give one CSV file or more");
  curves_run runs[CURVES_COMPARE_MAX] = {0};
  int read = 0;
  fl_status st = FL_OK;
  for (; st == FL_OK && read < nfiles; read++) {
    char path[4096];
    snprintf(path, sizeof path, "%s", files[read]);
    char *eq = strrchr(path, '=');
    if (eq) *eq = 0;
    st = curves_run_read(path, eq ? eq + 1 : NULL, &runs[read]);
    if (st != FL_OK) break;
  }
  if (st == FL_OK) st = curves_write_compare_svg(runs, (size_t)nfiles, title, svg);
  for (int i = 0; i < read; i++) curves_run_free(&runs[i]);
  if (st != FL_OK) return cli_failure("train compare", "%s", fl_last_error());
  printf("compared %d run%s in %s\n", nfiles, nfiles == 1 ? "" : "s", svg);
  return 0;
}
