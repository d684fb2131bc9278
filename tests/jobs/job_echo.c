/*
 * job_echo: a job binary for test_processes. It prints its arguments on stdout and a line on
 * stderr, runs one tiny action to show that the context it was given works, and returns 3,
 * which `flint submit` must pass on as its own exit status, with both streams, also when the
 * job runs on a driver (flint://).
 *
 *   job_echo [--sleep-ms N] ARGS...   (--sleep-ms: sleep N ms before the action, so that a
 *                                       test can see the job still running)
 *
 * Output:
 *   stdout: job_echo args: ARG1 ARG2 ...
 *   stderr: job_echo: this line goes to stderr
 *   stdout: job_echo count: 10
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flint/flint.h"

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  int first = 1;
  long sleep_ms = 0;
  if (argc > 2 && strcmp(argv[1], "--sleep-ms") == 0) {
    sleep_ms = atol(argv[2]);
    first = 3;
  }
  printf("job_echo args:");
  for (int i = first; i < argc; i++) printf(" %s", argv[i]);
  printf("\n");
  fflush(stdout);
  fprintf(stderr, "job_echo: this line goes to stderr\n");
  if (sleep_ms > 0) {
    struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }

  fl_dataset *ds = NULL;
  uint64_t n = 0;
  if (fl_range(ctx, 0, 10, 1, 2, &ds) != FL_OK || fl_count(ds, &n) != FL_OK) {
    fprintf(stderr, "job_echo: %s\n", fl_last_error());
    fl_dataset_free(ds);
    return 1;
  }
  fl_dataset_free(ds);
  printf("job_echo count: %llu\n", (unsigned long long)n);
  return 3;
}
