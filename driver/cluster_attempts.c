/*
 * cluster_attempts.c: the cluster backend's attempts in flight: launched, their end not
 * reported yet. Each has a record (cluster_attempt: its key, placement and claims) from its
 * launch until the scheduler handles its end; the in-flight list is how task ends, kills and
 * losses find it, and whoever takes it out of the list posts its end, exactly once.
 *
 * Threading: the list and the claims are under cb->lock (any thread); records are freed on
 * the scheduler thread (cluster_ended).
 */
#include <string.h>

#include "driver/cluster_internal.h"

void cluster_inflight_add(cluster_backend *cb, sched_task *t) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  if (cb->num_inflight == cb->cap_inflight) {
    size_t cap = cb->cap_inflight ? cb->cap_inflight * 2 : 64;
    sched_task **grown = common_realloc(cb->inflight, cap * sizeof *grown);
    FL_ASSERT(grown); /* a few pointers; out of memory here has no way back */
    cb->inflight = grown;
    cb->cap_inflight = cap;
  }
  cb->inflight[cb->num_inflight++] = t;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
}

/* Takes attempt `key` out of the in-flight list; NULL when it is not there (it ended). */
sched_task *cluster_inflight_take(cluster_backend *cb, uint64_t key) {
  for (size_t i = 0; i < cb->num_inflight; i++)
    if (cluster_att(cb->inflight[i])->key == key) {
      sched_task *t = cb->inflight[i];
      cb->inflight[i] = cb->inflight[--cb->num_inflight];
      return t;
    }
  return NULL;
}

/* Whether attempt `key` is in flight (cb->lock). */
bool cluster_inflight_has(const cluster_backend *cb, uint64_t key) {
  for (size_t i = 0; i < cb->num_inflight; i++)
    if (cluster_att(cb->inflight[i])->key == key) return true;
  return false;
}

/* Ends attempt `key` if it is still in flight (it never reached its executor, or its job
 * was killed). lost: its executor is gone (a retry that does not count as a failure). */
void cluster_fail_attempt(cluster_backend *cb, uint64_t key, fl_status status, const char *msg, bool lost) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  sched_task *t = cluster_inflight_take(cb, key);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!t) return;
  t->rt.status = status;
  t->rt.error = common_strdup(msg);
  t->executor_lost = lost;
  scheduler_post_task_end(cb->base.sched, t);
}

/* Whether attempt t (in flight) runs or may run on e, whose loss then ends it (cb->lock): the
 * node peer that told it claimed the attempt (runner); else its placement, or, once the
 * placement has said a node peer claimed it, any executor of its node but the placement. */
bool cluster_ran_on(const sched_task *t, const executor_ref *e) {
  const cluster_attempt *a = cluster_att(t);
  const executor_ref *placed = a->placement;
  if (a->runner) return a->runner == e;
  if (!a->claimed) return placed == e;
  return placed != e && placed && strcmp(placed->node, e->node) == 0;
}

bool cluster_key_in(uint64_t key, const uint64_t *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (keys[i] == key) return true;
  return false;
}
