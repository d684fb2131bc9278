/*
 * locality.c: where a task runs (delay scheduling, as Spark's TaskSetManager does it). A
 * task over a cached partition goes to the executor that caches it when that one has a free
 * slot, else to another executor of its node (which maps the block in place), else it waits
 * up to the locality wait for either before it takes the least busy executor. A backup runs
 * away from its original's executor. Excluded executors are left out while any other is
 * live. Scheduler thread only.
 */
#include <string.h>

#include "driver/scheduler/scheduler_internal.h"

/* The live executor that caches t's input partition, or NULL (none, or not computed yet). */
static sched_executor *input_holder(scheduler *s, const sched_task *t) {
  const sched_placement *p = &s->placement;
  uint64_t where = p->input_at ? p->input_at(p->arg, t) : 0;
  sched_executor *x = where ? executors_find(s, where) : NULL;
  return x && !x->removed ? x : NULL;
}

bool locality_place(scheduler *s, sched_task *t, uint64_t now, uint64_t *retry_at) {
  sched_executor *holder = input_holder(s, t), *preferred;
  /* A backup runs away from its original's executor: the one that said it runs it, if a
   * node peer claimed it. */
  uint64_t avoid = t->original ? t->original->executor : 0, to;
  if (t->original && speculation_place_backup(s, t, now, &to, &avoid)) {
    t->executor = to;
    t->locality = SCHED_ANY;
    return true;
  }
  preferred = holder && !executors_excluded(holder, now) && holder->id != avoid ? holder : NULL;
  if (preferred && preferred->running < preferred->slots) {
    t->executor = preferred->id;
    t->locality = SCHED_PROCESS_LOCAL;
    t->stage->local_launch_ns = now;
    return true;
  }
  /* Node-local: another executor on the preferred one's node maps the block in place, at the
   * cost of a local read, so it takes the task now rather than idle while the holder is busy
   * (the least busy such executor). */
  if (holder && holder->node[0]) {
    sched_executor *best = NULL;
    for (sched_executor *x = s->executors; x; x = x->next)
      if (!x->removed && x->id != avoid && !executors_excluded(x, now) && x->running < x->slots &&
          strcmp(x->node, holder->node) == 0 &&
          (!best || x->slots - x->running > best->slots - best->running))
        best = x;
    if (best) {
      t->executor = best->id;
      t->locality = SCHED_NODE_LOCAL;
      return true;
    }
  }
  uint64_t wait = s->placement.locality_wait_ns;
  uint64_t since = t->pending_since_ns > t->stage->local_launch_ns ? t->pending_since_ns : t->stage->local_launch_ns;
  if (preferred && now < since + wait) {
    *retry_at = since + wait;
    return false;
  }
  /* The least busy executor, leaving out excluded ones unless every live one is. */
  sched_executor *best = NULL;
  bool all_excluded = true;
  for (sched_executor *x = s->executors; x; x = x->next)
    if (!x->removed && !executors_excluded(x, now)) all_excluded = false;
  for (sched_executor *x = s->executors; x; x = x->next)
    if (!x->removed && x->id != avoid && (all_excluded || !executors_excluded(x, now)) && x->running < x->slots &&
        (!best || x->slots - x->running > best->slots - best->running))
      best = x;
  if (!best) return false;
  t->executor = best->id;
  t->locality = SCHED_ANY;
  return true;
}
