/*
 * job_exit3: a job binary for test_cli. It prints its arguments, runs one tiny action to
 * show that the context it was given works, and returns 3, which `flint submit` must pass
 * on as its own exit status.
 *
 * Output (stdout):
 *   job_exit3 argv[0]: PATH-OF-THIS-LIBRARY
 *   job_exit3 args: ARG1 ARG2 ...
 *   job_exit3 count: 10
 */
#include <stdio.h>

#include "flint/flint.h"

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  printf("job_exit3 argv[0]: %s\n", argc > 0 ? argv[0] : "(none)");
  printf("job_exit3 args:");
  for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
  printf("\n");

  fl_dataset *ds = NULL;
  uint64_t n = 0;
  if (fl_range(ctx, 0, 10, 1, 2, &ds) != FL_OK || fl_count(ds, &n) != FL_OK) {
    fprintf(stderr, "job_exit3: %s\n", fl_last_error());
    fl_dataset_free(ds);
    return 1;
  }
  fl_dataset_free(ds);
  printf("job_exit3 count: %llu\n", (unsigned long long)n);
  return 3;
}
