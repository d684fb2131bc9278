/*
 * job_echo: a job binary for test_processes. It prints its arguments on stdout and a line on
 * stderr, runs one tiny action to show that the context it was given works, and returns 3,
 * which `flint submit` must pass on as its own exit status, with both streams, also when the
 * job runs on a driver (flint://).
 *
 *   job_echo [--ignore-term] [--handle-int] [--sleep-ms N | --until-file PATH | --slow-until-file PATH] ARGS...
 *
 * --ignore-term: ignores SIGTERM, as a job that handles it and goes on would (so that a test
 * sees `flint submit --kill` end it with SIGKILL). *
 * --handle-int: SIGINT writes "job_echo: SIGINT handled" on stderr and the job goes on, as an
 * interactive program that catches Ctrl-C does.
 * --sleep-ms: sleeps N ms before the action, so that a test can see the job binary still
 * running; --until-file: waits before the action until PATH exists; --slow-until-file: the
 * action's map function waits on one record until PATH exists, so that a test can act while
 * the driver runs the job. The waits end when the test makes the file, not after a time, so
 * that a test sees the job binary or its task running for as long as it needs however slow
 * the host (at most 60 s, so that a broken test still ends).
 *
 * Output:
 *   stdout: job_echo args: ARG1 ARG2 ...
 *   stderr: job_echo: this line goes to stderr
 *   stdout: job_echo count: 10
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flint/flint.h"

static void nap(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Waits until path exists, at most 60 s. */
static void wait_for_file(const char *path) {
  for (int i = 0; access(path, F_OK) != 0 && i < 6000; i++) nap(10);
}

/* The map function of --slow-until-file (arg: the path, NUL-terminated): exported, as cluster
 * mode ships functions by name. */
__attribute__((visibility("default"))) fl_status job_echo_slow(fl_bytes rec, fl_buf *out, const void *arg) {
  if (fl_i64(rec) == 0) wait_for_file(arg);
  return fl_buf_append(out, rec.data, rec.len);
}

/* --handle-int: a Ctrl-C that the program handles and goes on, as the shell does. */
static void on_sigint(int sig) {
  (void)sig;
  static const char line[] = "job_echo: SIGINT handled\n";
  ssize_t n = write(STDERR_FILENO, line, sizeof line - 1);
  (void)n;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  int first = 1;
  long sleep_ms = 0;
  const char *until_file = NULL, *slow_until_file = NULL;
  if (argc > 1 && strcmp(argv[1], "--ignore-term") == 0) {
    signal(SIGTERM, SIG_IGN);
    argc--;
    argv++;
  }
  if (argc > 1 && strcmp(argv[1], "--handle-int") == 0) {
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    argc--;
    argv++;
  }
  if (argc > 2 && strcmp(argv[1], "--sleep-ms") == 0) {
    sleep_ms = atol(argv[2]);
    first = 3;
  } else if (argc > 2 && strcmp(argv[1], "--slow-until-file") == 0) {
    slow_until_file = argv[2];
    first = 3;
  } else if (argc > 2 && strcmp(argv[1], "--until-file") == 0) {
    until_file = argv[2];
    first = 3;
  }
  printf("job_echo args:");
  for (int i = first; i < argc; i++) printf(" %s", argv[i]);
  printf("\n");
  fflush(stdout);
  fprintf(stderr, "job_echo: this line goes to stderr\n");
  if (sleep_ms > 0) nap(sleep_ms);
  if (until_file) wait_for_file(until_file);

  fl_dataset *ds = NULL, *mapped = NULL;
  uint64_t n = 0;
  if (fl_range(ctx, 0, 10, 1, 2, &ds) != FL_OK ||
      (slow_until_file &&
       fl_map(ds, job_echo_slow, slow_until_file, strlen(slow_until_file) + 1, &mapped) != FL_OK) ||
      fl_count(mapped ? mapped : ds, &n) != FL_OK) {
    fprintf(stderr, "job_echo: %s\n", fl_last_error());
    fl_dataset_free(mapped);
    fl_dataset_free(ds);
    return 1;
  }
  fl_dataset_free(mapped);
  fl_dataset_free(ds);
  printf("job_echo count: %llu\n", (unsigned long long)n);
  return 3;
}
