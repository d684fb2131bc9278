/*
 * bench/bench_ranks.h: a benchmark's ranks as threads of its process, joined by host
 * communicators over loopback: run_ranks runs fn on every rank and joins them, world_create
 * connects `size` ranks (bench_pipeline, bench_moe). Static functions: include it in one
 * file of a benchmark.
 */
#ifndef FLINT_BENCH_RANKS_H
#define FLINT_BENCH_RANKS_H

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "flint/gpu.h"

#define BENCH_MAX_RANKS 8

typedef fl_status (*rank_fn)(void *arg, int rank, fl_comm *comm);

typedef struct rank_job {
  rank_fn fn;
  void *arg;
  int rank;
  fl_comm *comm;
  fl_status status;
  char msg[512];
} rank_job;

static void *rank_main(void *p) {
  rank_job *job = p;
  job->status = job->fn(job->arg, job->rank, job->comm);
  snprintf(job->msg, sizeof job->msg, "%s", job->status != FL_OK ? fl_last_error() : "");
  return NULL;
}

/* Runs fn on `size` threads at once, one per rank; the first failure becomes this thread's
 * error, naming the rank. */
static fl_status run_ranks(int size, fl_comm **comms, rank_fn fn, void *arg) {
  pthread_t th[BENCH_MAX_RANKS];
  rank_job jobs[BENCH_MAX_RANKS];
  int started = 0;
  fl_status st = FL_OK;
  for (int r = 0; r < size; r++) {
    jobs[r] = (rank_job){.fn = fn, .arg = arg, .rank = r, .comm = comms ? comms[r] : NULL};
    if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
      st = fl_set_error(FL_EINTERNAL, "cannot start the thread of rank %d", r);
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  for (int r = 0; st == FL_OK && r < started; r++)
    if (jobs[r].status != FL_OK)
      st = fl_set_error(jobs[r].status, "rank %d of %d: %s", r, size, jobs[r].msg);
  return st;
}

typedef struct world {
  int size;
  fl_comm_endpoint *eps[BENCH_MAX_RANKS];
  const char *addrs[BENCH_MAX_RANKS];
  fl_comm *comms[BENCH_MAX_RANKS];
} world;

static fl_status connect_rank(void *arg, int rank, fl_comm *comm) {
  (void)comm;
  world *w = arg;
  fl_comm_endpoint *ep = w->eps[rank];
  w->eps[rank] = NULL; /* taken by create, even on failure */
  return fl_comm_host_create(ep, rank, w->size, w->addrs, 20000, &w->comms[rank]);
}

static void world_destroy(world *w) {
  for (int r = 0; r < w->size; r++) {
    fl_comm_destroy(w->comms[r]);
    fl_comm_endpoint_destroy(w->eps[r]);
  }
  memset(w, 0, sizeof *w);
}

/* `size` host communicators over 127.0.0.1, one per rank. */
static fl_status world_create(int size, world *w) {
  char addrs[BENCH_MAX_RANKS][96];
  memset(w, 0, sizeof *w);
  w->size = size;
  fl_status st = FL_OK;
  for (int r = 0; st == FL_OK && r < size; r++) {
    st = fl_comm_listen("127.0.0.1", &w->eps[r]);
    if (st == FL_OK) {
      snprintf(addrs[r], sizeof addrs[r], "%s", fl_comm_endpoint_address(w->eps[r]));
      w->addrs[r] = addrs[r];
    }
  }
  if (st == FL_OK) st = run_ranks(size, NULL, connect_rank, w);
  for (int r = 0; r < size; r++) w->addrs[r] = NULL; /* they pointed at this frame */
  if (st != FL_OK) world_destroy(w);
  return st;
}

#endif /* FLINT_BENCH_RANKS_H */
