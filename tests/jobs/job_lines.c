/*
 * job_lines: a job binary that reports as users' jobs do, with printf and no fflush, for
 * test_processes: one line on stdout per action, then a wait that a test ends.
 *
 *   job_lines ACTIONS [UNTIL_FILE]
 *
 * Runs ACTIONS counts of 10 records in 2 partitions (so ACTIONS jobs of 2 tasks), printing
 * "job_lines action K: 10" after each; then prints "job_lines waiting" and, given
 * UNTIL_FILE, waits until that file exists (at most 60 s, so that a broken test still
 * ends); then prints "job_lines done" and returns 0. A test that sees "job_lines waiting"
 * while the job waits has its lines as they were written, not at its end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "flint/flint.h"

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  int actions = argc > 1 ? atoi(argv[1]) : 1;
  for (int k = 1; k <= actions; k++) {
    fl_dataset *ds = NULL;
    uint64_t n = 0;
    if (fl_range(ctx, 0, 10, 1, 2, &ds) != FL_OK || fl_count(ds, &n) != FL_OK) {
      fprintf(stderr, "job_lines: %s\n", fl_last_error());
      fl_dataset_free(ds);
      return 1;
    }
    fl_dataset_free(ds);
    printf("job_lines action %d: %llu\n", k, (unsigned long long)n);
  }
  printf("job_lines waiting\n");
  if (argc > 2) {
    struct timespec ts = {0, 10000000L};
    for (int i = 0; access(argv[2], F_OK) != 0 && i < 6000; i++) nanosleep(&ts, NULL);
  }
  printf("job_lines done\n");
  return 0;
}
