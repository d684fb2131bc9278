/*
 * ps/clock.c: the workers' clocks and the waits of the consistency models (ps/ps.h): a table
 * of clocks under one mutex, and a condition variable that every advance or retirement
 * broadcasts (waiters recheck the minimum; workers are few, tens, so the scan is cheap).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "ps/ps.h"

struct ps_clocks {
  pthread_mutex_t mu;
  pthread_cond_t changed;
  uint32_t workers;
  uint64_t *clock;
  bool *retired;
  bool closed; /* ps_clocks_close: waits end with FL_ECANCELLED */
};

fl_status ps_clocks_create(uint32_t workers, ps_clocks **out) {
  if (workers < 1) return fl_set_error(FL_EINVAL, "parameter server clocks: 0 workers");
  ps_clocks *c = common_calloc(1, sizeof *c);
  if (c) c->clock = common_calloc(workers, sizeof *c->clock);
  if (c) c->retired = common_calloc(workers, sizeof *c->retired);
  if (!c || !c->clock || !c->retired) {
    if (c) common_free(c->clock), common_free(c->retired);
    common_free(c);
    return fl_set_error(FL_ENOMEM, "parameter server clocks: out of memory for %u workers", workers);
  }
  c->workers = workers;
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc == 0) {
    rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* timeouts immune to wall-clock steps */
    if (rc == 0) rc = pthread_cond_init(&c->changed, &attr);
    pthread_condattr_destroy(&attr);
  }
  if (rc == 0 && (rc = pthread_mutex_init(&c->mu, NULL)) != 0) pthread_cond_destroy(&c->changed);
  if (rc != 0) {
    common_free(c->clock);
    common_free(c->retired);
    common_free(c);
    return fl_set_error(FL_EINTERNAL, "parameter server clocks: pthread init: %s", strerror(rc));
  }
  *out = c;
  return FL_OK;
}

void ps_clocks_destroy(ps_clocks *c) {
  if (!c) return;
  pthread_cond_destroy(&c->changed);
  pthread_mutex_destroy(&c->mu);
  common_free(c->clock);
  common_free(c->retired);
  common_free(c);
}

/* Under mu: the slowest live worker (workers when none is live) and its clock. */
static uint32_t slowest(const ps_clocks *c, uint64_t *clock) {
  uint32_t who = c->workers;
  uint64_t m = UINT64_MAX;
  for (uint32_t i = 0; i < c->workers; i++)
    if (!c->retired[i] && c->clock[i] < m) m = c->clock[i], who = i;
  *clock = m;
  return who;
}

static fl_status change(ps_clocks *c, uint32_t worker, bool retire, uint64_t *clock) {
  pthread_mutex_lock(&c->mu);
  fl_status st = FL_OK;
  if (worker >= c->workers || c->retired[worker]) {
    st = fl_set_error(FL_EINVAL, "parameter server clocks: worker %u is %s", worker,
                      worker >= c->workers ? "unknown" : "retired");
  } else if (retire) {
    c->retired[worker] = true;
  } else {
    c->clock[worker]++;
    if (clock) *clock = c->clock[worker];
  }
  if (st == FL_OK) pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->mu);
  return st;
}

fl_status ps_clocks_advance(ps_clocks *c, uint32_t worker, uint64_t *clock) { return change(c, worker, false, clock); }
fl_status ps_clocks_retire(ps_clocks *c, uint32_t worker) { return change(c, worker, true, NULL); }

uint64_t ps_clocks_of(ps_clocks *c, uint32_t worker) {
  pthread_mutex_lock(&c->mu);
  uint64_t v = worker < c->workers ? c->clock[worker] : 0;
  pthread_mutex_unlock(&c->mu);
  return v;
}

uint64_t ps_clocks_min(ps_clocks *c) {
  pthread_mutex_lock(&c->mu);
  uint64_t m;
  slowest(c, &m);
  pthread_mutex_unlock(&c->mu);
  return m;
}

fl_status ps_clocks_wait(ps_clocks *c, uint64_t clock, uint32_t staleness, uint32_t timeout_ms, uint64_t *fresh) {
  /* ASP reads at once; otherwise the minimum must reach clock - staleness. */
  uint64_t need = staleness == PS_STALENESS_ASYNC || clock < staleness ? 0 : clock - staleness;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&c->mu);
  uint64_t m;
  uint32_t who = slowest(c, &m);
  fl_status st = FL_OK;
  while (m < need) {
    if (c->closed) {
      st = fl_set_error(FL_ECANCELLED, "parameter server: a read at clock %llu was cancelled: the server stops",
                        (unsigned long long)clock);
      break;
    }
    int rc = timeout_ms ? pthread_cond_timedwait(&c->changed, &c->mu, &deadline) : pthread_cond_wait(&c->changed, &c->mu);
    who = slowest(c, &m);
    if (rc == ETIMEDOUT && m < need) {
      st = fl_set_error(FL_ETIMEDOUT, "parameter server: a read at clock %llu (staleness %u) waited %u ms for worker "
                        "%u, still at clock %llu", (unsigned long long)clock, staleness, timeout_ms, who,
                        (unsigned long long)m);
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (st == FL_OK && fresh) *fresh = m;
  return st;
}

void ps_clocks_close(ps_clocks *c) {
  pthread_mutex_lock(&c->mu);
  c->closed = true;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->mu);
}

uint64_t ps_clocks_state(ps_clocks *c, uint32_t worker, bool *retired) {
  pthread_mutex_lock(&c->mu);
  uint64_t v = worker < c->workers ? c->clock[worker] : 0;
  *retired = worker < c->workers && c->retired[worker];
  pthread_mutex_unlock(&c->mu);
  return v;
}

void ps_clocks_restore(ps_clocks *c, uint32_t worker, uint64_t clock, bool retired) {
  pthread_mutex_lock(&c->mu);
  if (worker < c->workers) c->clock[worker] = clock, c->retired[worker] = retired;
  pthread_cond_broadcast(&c->changed);
  pthread_mutex_unlock(&c->mu);
}
