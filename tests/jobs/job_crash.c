/*
 * job_crash: a job binary for test_processes that dies by SIGSEGV after printing a line, so
 * that the test can check that `flint submit` on a driver passes on the line, names the
 * signal and exits 128 + 11, and that the driver outlives its job.
 *
 * Output (stdout, flushed before the crash): job_crash: about to crash
 */
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>

#include "flint/flint.h"

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  (void)ctx;
  (void)argc;
  (void)argv;
  printf("job_crash: about to crash\n");
  fflush(stdout);
  /* No core file (slow, and litter in the driver's folder). The default action: a sanitizer
   * build installs its own SIGSEGV handler, which would exit(1) instead of dying by the
   * signal that the test looks for. */
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
  return 0; /* not reached */
}
