/*
 * gpu/comm/worker.c: the communication thread of a rank (its contract is in gpu/comm/comm.h).
 *
 * The queue is a ring of COMM_WORKER_DEPTH jobs under one mutex with two condition variables:
 * `posted` wakes the worker, `progress` wakes a poster waiting for room or for the queue to
 * drain. A job stays in its slot while it runs (head moves on when it is done), so the ring
 * holds at most DEPTH jobs posted and not finished.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/comm/comm.h"

/* Buckets in flight per step: a model reports each layer's gradients once, so a step posts
 * at most one bucket per layer with parameters (ResNet-18: 62); a deeper queue only lets
 * backward run further ahead of the network, which it is already allowed to do. */
#define COMM_WORKER_DEPTH 64

typedef struct worker_job {
  fl_tensor t; /* a copy of the posted tensor's header (a view of its memory) */
  fl_reduce_op op;
  comm_worker_fn fn; /* NULL: an allreduce with op */
  void *user;
} worker_job;

struct comm_worker {
  fl_comm *comm;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t posted;   /* a job came, or stop was asked */
  pthread_cond_t progress; /* a job finished */
  worker_job ring[COMM_WORKER_DEPTH];
  uint64_t head, tail; /* jobs [head, tail) are queued; ring[head % DEPTH] may be running */
  uint64_t reduced;
  bool stopping;
  fl_status error; /* the first failure, kept */
  char error_msg[512];
};

static void *worker_main(void *arg) {
  comm_worker *w = arg;
  FL_PCHECK(pthread_mutex_lock(&w->lock));
  for (;;) {
    while (w->head == w->tail && !w->stopping) FL_PCHECK(pthread_cond_wait(&w->posted, &w->lock));
    if (w->head == w->tail) break; /* stopping, and nothing is queued */
    worker_job job = w->ring[w->head % COMM_WORKER_DEPTH];
    /* After a failure (kept) or a stop (cancelled) the queued jobs are dropped unrun. */
    bool run = w->error == FL_OK && !w->stopping && job.t.numel > 0;
    FL_PCHECK(pthread_mutex_unlock(&w->lock));
    fl_status st = FL_OK;
    if (run) st = job.fn ? job.fn(w->comm, &job.t, job.user) : fl_comm_allreduce(w->comm, &job.t, job.op);
    char msg[sizeof w->error_msg] = "";
    if (st != FL_OK) snprintf(msg, sizeof msg, "%s", fl_last_error());
    FL_PCHECK(pthread_mutex_lock(&w->lock));
    if (st != FL_OK && w->error == FL_OK) {
      w->error = st;
      memcpy(w->error_msg, msg, sizeof msg);
    }
    if (run && st == FL_OK) w->reduced++;
    w->head++;
    FL_PCHECK(pthread_cond_broadcast(&w->progress));
  }
  FL_PCHECK(pthread_mutex_unlock(&w->lock));
  return NULL;
}

fl_status comm_worker_start(fl_comm *comm, comm_worker **out) {
  if (!comm || !out) return fl_set_error(FL_EINVAL, "comm_worker_start: NULL argument");
  comm_worker *w = common_calloc(1, sizeof *w);
  if (!w) return fl_set_error(FL_ENOMEM, "out of memory for a communication thread");
  w->comm = comm;
  FL_PCHECK(pthread_mutex_init(&w->lock, NULL));
  FL_PCHECK(pthread_cond_init(&w->posted, NULL));
  FL_PCHECK(pthread_cond_init(&w->progress, NULL));
  int e = pthread_create(&w->thread, NULL, worker_main, w);
  if (e != 0) {
    pthread_cond_destroy(&w->progress);
    pthread_cond_destroy(&w->posted);
    pthread_mutex_destroy(&w->lock);
    common_free(w);
    return fl_set_error(FL_EINTERNAL, "pthread_create for the communication thread: %s", strerror(e));
  }
  *out = w;
  return FL_OK;
}

/* Under the lock: the kept failure as this thread's error. */
static fl_status worker_failure(comm_worker *w) {
  return fl_set_error(w->error, "a gradient allreduce on the communication thread failed: %s", w->error_msg);
}

static fl_status worker_post(comm_worker *w, const fl_tensor *t, fl_reduce_op op, comm_worker_fn fn, void *user) {
  if (!w || !t) return fl_set_error(FL_EINVAL, "comm_worker_post: NULL argument");
  /* The worker must read what the device's queued work produces, not what was there. */
  fl_status st = t->dev->ops->synchronize(t->dev);
  if (st != FL_OK) return st;
  FL_PCHECK(pthread_mutex_lock(&w->lock));
  while (w->error == FL_OK && w->tail - w->head == COMM_WORKER_DEPTH)
    FL_PCHECK(pthread_cond_wait(&w->progress, &w->lock));
  if (w->error != FL_OK) {
    st = worker_failure(w);
  } else {
    FL_ASSERT(!w->stopping);
    w->ring[w->tail % COMM_WORKER_DEPTH] = (worker_job){.t = *t, .op = op, .fn = fn, .user = user};
    w->ring[w->tail % COMM_WORKER_DEPTH].t.owns = false;
    w->tail++;
    FL_PCHECK(pthread_cond_signal(&w->posted));
  }
  FL_PCHECK(pthread_mutex_unlock(&w->lock));
  return st;
}

fl_status comm_worker_post(comm_worker *w, const fl_tensor *t, fl_reduce_op op) {
  return worker_post(w, t, op, NULL, NULL);
}

fl_status comm_worker_post_fn(comm_worker *w, const fl_tensor *t, comm_worker_fn fn, void *user) {
  if (!fn) return fl_set_error(FL_EINVAL, "comm_worker_post_fn: fn is NULL");
  return worker_post(w, t, FL_REDUCE_SUM, fn, user);
}

fl_status comm_worker_wait(comm_worker *w) {
  if (!w) return fl_set_error(FL_EINVAL, "comm_worker_wait: worker is NULL");
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&w->lock));
  while (w->head != w->tail) FL_PCHECK(pthread_cond_wait(&w->progress, &w->lock));
  if (w->error != FL_OK) st = worker_failure(w);
  FL_PCHECK(pthread_mutex_unlock(&w->lock));
  return st;
}

uint64_t comm_worker_reduced(comm_worker *w) {
  FL_PCHECK(pthread_mutex_lock(&w->lock));
  uint64_t n = w->reduced;
  FL_PCHECK(pthread_mutex_unlock(&w->lock));
  return n;
}

void comm_worker_stop(comm_worker *w) {
  if (!w) return;
  FL_PCHECK(pthread_mutex_lock(&w->lock));
  w->stopping = true;
  FL_PCHECK(pthread_cond_signal(&w->posted));
  FL_PCHECK(pthread_mutex_unlock(&w->lock));
  FL_PCHECK(pthread_join(w->thread, NULL));
  pthread_cond_destroy(&w->progress);
  pthread_cond_destroy(&w->posted);
  pthread_mutex_destroy(&w->lock);
  common_free(w);
}
