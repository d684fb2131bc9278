/* count_thread.h: a count on a thread of its own, so that an integration test can act (kill
 * an executor, cancel, stop the driver) while it runs, and join it within a bound. Static
 * functions: the tests that use it link flint in different ways (shared or internal). */
#ifndef FLINT_TEST_COUNT_THREAD_H
#define FLINT_TEST_COUNT_THREAD_H

#include "proc_harness.h"

#include <pthread.h>
#include <stdbool.h>

typedef struct count_thread {
  fl_dataset *ds;
  pthread_t thread;
  fl_status status;
  char error[512]; /* fl_last_error() when it failed */
  double ended;    /* now_s() when fl_count returned */
} count_thread;

static void *count_main(void *arg) {
  count_thread *c = arg;
  uint64_t n;
  c->status = fl_count(c->ds, &n);
  if (c->status != FL_OK) snprintf(c->error, sizeof c->error, "%s", fl_last_error());
  c->ended = now_s();
  return NULL;
}

static void count_start(count_thread *c, fl_dataset *ds) {
  memset(c, 0, sizeof *c);
  c->ds = ds;
  c->status = FL_EINTERNAL;
  assert_int_equal(pthread_create(&c->thread, NULL, count_main, c), 0);
}

static bool count_joined_within(count_thread *c, double limit_s) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)limit_s;
  return pthread_timedjoin_np(c->thread, NULL, &until) == 0;
}

/* Joins it within limit_s; else cancels the context's jobs and fails the test once the count
 * has returned (it writes into *c), or ends the program when even the cancel does not end it
 * within 10 s. */
static void count_join(count_thread *c, double limit_s) {
  if (count_joined_within(c, limit_s)) return;
  fl_cancel_jobs(fl_dataset_context(c->ds));
  if (!count_joined_within(c, 10)) {
    fprintf(stderr, "the count did not return within %.0f s, nor 10 s after a cancel\n", limit_s);
    abort();
  }
  fail_msg("the count did not return within %.0f s (then it was cancelled)", limit_s);
}

#endif
