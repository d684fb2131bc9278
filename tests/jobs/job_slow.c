/*
 * job_slow: a job binary for test_progress: one stage of N tasks that each sleep MS
 * milliseconds, long enough for the console progress bar to show.
 *
 * Usage: flint submit [--master M] job_slow.so N MS
 * Output (stdout): job_slow count: N
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flint/flint.h"

/* Exported: a cluster's executors find it by name. */
__attribute__((visibility("default"))) fl_status job_slow_nap(uint32_t partition, fl_iter *in, fl_emitter *out,
                                                               const void *arg) {
  (void)partition;
  uint32_t ms;
  memcpy(&ms, arg, sizeof ms);
  usleep(ms * 1000u);
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) {
    fl_status st = fl_emit(out, rec.data, rec.len);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: job_slow N MS\n");
    return 2;
  }
  uint32_t n = (uint32_t)atoi(argv[1]), ms = (uint32_t)atoi(argv[2]);
  fl_dataset *ds = NULL, *slow = NULL;
  uint64_t count = 0;
  if (fl_range(ctx, 0, n, 1, n, &ds) != FL_OK || fl_map_partitions(ds, job_slow_nap, &ms, sizeof ms, &slow) != FL_OK ||
      fl_count(slow, &count) != FL_OK) {
    fprintf(stderr, "job_slow: %s\n", fl_last_error());
    fl_dataset_free(slow);
    fl_dataset_free(ds);
    return 1;
  }
  fl_dataset_free(slow);
  fl_dataset_free(ds);
  printf("job_slow count: %llu\n", (unsigned long long)count);
  return 0;
}
