/*
 * job_fails: a job whose map function fails on every record, so every attempt of every
 * task fails and the job fails. flint_main prints flint's message to stderr and returns 4.
 *
 * fail_every_record is exported (default visibility) so that the engine can name it in
 * its message: it finds a function's name with dladdr, which sees only exported symbols.
 */
#include <stdio.h>

#include "flint/flint.h"

__attribute__((visibility("default"))) fl_status fail_every_record(fl_bytes rec, fl_buf *out,
                                                                   const void *arg) {
  (void)out;
  (void)arg;
  return fl_set_error(FL_EFORMAT, "bad record %lld", (long long)fl_i64(rec));
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  (void)argc;
  (void)argv;
  fl_dataset *range = NULL, *mapped = NULL;
  uint64_t n = 0;
  int rc = 0;
  if (fl_range(ctx, 0, 100, 1, 4, &range) != FL_OK ||
      fl_map(range, fail_every_record, NULL, 0, &mapped) != FL_OK) {
    fprintf(stderr, "job_fails: cannot build the dataset: %s\n", fl_last_error());
    rc = 1;
  } else if (fl_count(mapped, &n) != FL_OK) {
    fprintf(stderr, "job_fails: count failed: %s\n", fl_last_error());
    rc = 4;
  } else {
    printf("job_fails: count unexpectedly succeeded: %llu\n", (unsigned long long)n);
    rc = 0;
  }
  fl_dataset_free(mapped);
  fl_dataset_free(range);
  return rc;
}
