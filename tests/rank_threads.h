/*
 * rank_threads.h: ranks as threads for the tests of gpu/ collectives and trainers. Each rank
 * listens on 127.0.0.1:0, the addresses are shared through the test (the stand-in for the
 * barrier-stage bootstrap) and each thread builds its host communicator.
 */
#ifndef FLINT_TEST_RANK_THREADS_H
#define FLINT_TEST_RANK_THREADS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "flint/gpu.h"

#ifndef MAX_RANKS
#define MAX_RANKS 16
#endif

/* ---- ranks as threads -------------------------------------------------------------------- */

typedef struct rank_job rank_job;
typedef fl_status (*rank_fn)(rank_job *job);
struct rank_job {
  int rank, size;
  fl_comm *comm;
  void *arg;
  rank_fn fn;
  fl_status status;
  char msg[512];
};

static inline void *rank_main(void *p) {
  rank_job *job = p;
  job->status = job->fn(job);
  snprintf(job->msg, sizeof job->msg, "%s", job->status ? fl_last_error() : "");
  return NULL;
}

/* Runs fn on `size` threads at once, one per rank; statuses and messages land in jobs. */
static inline void run_ranks(int size, fl_comm **comms, rank_fn fn, void *arg, rank_job *jobs) {
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < size; r++) {
    jobs[r] = (rank_job){.rank = r, .size = size, .comm = comms ? comms[r] : NULL, .arg = arg, .fn = fn};
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < size; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
}

static inline void expect_all_ok(int size, rank_job *jobs) {
  for (int r = 0; r < size; r++) {
    if (jobs[r].status != FL_OK)
      fprintf(stderr, "rank %d of %d: %s: %s\n", r, size, fl_status_name(jobs[r].status), jobs[r].msg);
    assert_int_equal(jobs[r].status, FL_OK);
  }
}

typedef struct group {
  int size;
  fl_comm_endpoint *eps[MAX_RANKS];
  char addrs[MAX_RANKS][96];
  const char *addr_ptrs[MAX_RANKS];
  uint32_t timeout_ms;
  bool skip[MAX_RANKS]; /* ranks that listen but never join */
  fl_comm *comms[MAX_RANKS];
} group;

static inline fl_status create_rank(rank_job *job) {
  group *g = job->arg;
  if (g->skip[job->rank]) return FL_OK;
  fl_comm_endpoint *ep = g->eps[job->rank];
  g->eps[job->rank] = NULL; /* taken by create, even on failure */
  return fl_comm_host_create(ep, job->rank, job->size, g->addr_ptrs, g->timeout_ms,
                             &g->comms[job->rank]);
}

static inline void group_listen(group *g, int size) {
  memset(g, 0, sizeof *g);
  g->size = size;
  g->timeout_ms = 10000;
  for (int r = 0; r < size; r++) {
    assert_ok(fl_comm_listen("127.0.0.1", &g->eps[r]));
    snprintf(g->addrs[r], sizeof g->addrs[r], "%s", fl_comm_endpoint_address(g->eps[r]));
    g->addr_ptrs[r] = g->addrs[r];
  }
}

static inline void group_connect(group *g, rank_job *jobs) { run_ranks(g->size, NULL, create_rank, g, jobs); }

static inline void group_create(group *g, int size) {
  rank_job jobs[MAX_RANKS];
  group_listen(g, size);
  group_connect(g, jobs);
  expect_all_ok(size, jobs);
  for (int r = 0; r < size; r++) {
    assert_int_equal(fl_comm_rank(g->comms[r]), r);
    assert_int_equal(fl_comm_size(g->comms[r]), size);
    assert_string_equal(fl_comm_backend(g->comms[r]), "host");
  }
}

static inline void group_destroy(group *g) {
  for (int r = 0; r < g->size; r++) {
    fl_comm_destroy(g->comms[r]);
    fl_comm_endpoint_destroy(g->eps[r]);
  }
}

/* ---- groups kept for a whole test program, one per size -------------------------------- */

/* Connecting a group costs more than most runs on it: a program's tests share one a size,
 * made on first use and destroyed by its teardown. */
typedef struct group_cache {
  group of[MAX_RANKS + 1];
  bool made[MAX_RANKS + 1];
} group_cache;

static inline group *group_cache_get(group_cache *c, int size) {
  assert_true(size >= 1 && size <= MAX_RANKS);
  if (!c->made[size]) {
    group_create(&c->of[size], size);
    c->made[size] = true;
  }
  return &c->of[size];
}

static inline void group_cache_destroy(group_cache *c) {
  for (int i = 0; i <= MAX_RANKS; i++)
    if (c->made[i]) group_destroy(&c->of[i]);
  memset(c, 0, sizeof *c);
}

#endif /* FLINT_TEST_RANK_THREADS_H */
