/*
 * job_no_main: a shared library that exports a function but no flint_main, so that
 * `flint submit` must refuse it (exit 1) with a message naming flint_main.
 */
#include "flint/flint.h"

__attribute__((visibility("default"))) int not_flint_main(fl_context *ctx, int argc, char **argv) {
  (void)ctx;
  (void)argv;
  return argc;
}
