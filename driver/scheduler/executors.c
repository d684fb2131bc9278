/*
 * executors.c: the executors that tasks are placed on, as the task scheduler sees them:
 * their slots, the attempts placed on each, and which ones tasks leave out for a while
 * (Spark's excludeOnFailure: an executor whose tasks fail in a row) or for GPU work (no
 * usable device). Backends add and remove executors; locality.c, gang.c and speculation.c
 * choose among them. Scheduler thread only.
 */
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"

sched_executor *executors_find(scheduler *s, uint64_t id) {
  for (sched_executor *x = s->executors; x; x = x->next)
    if (x->id == id) return x;
  return NULL;
}

bool executors_excluded(const sched_executor *x, uint64_t now) { return now < x->excluded_until_ns; }

bool scheduler_executor_excluded(scheduler *s, uint64_t id, uint64_t now_ns) {
  const sched_executor *x = executors_find(s, id);
  return x && executors_excluded(x, now_ns);
}

void scheduler_executor_added(scheduler *s, const sched_executor_info *info) {
  sched_executor *x = common_calloc(1, sizeof *x);
  if (!x) {
    common_log(LOG_ERROR, "out of memory: executor %llu gets no tasks", (unsigned long long)info->id);
    return;
  }
  x->id = info->id;
  snprintf(x->node, sizeof x->node, "%s", info->node ? info->node : "");
  x->cores = info->cores;
  x->slots = info->slots;
  x->gpu = info->gpu;
  /* Newest (highest id) first, as the backend lists them: placement breaks ties in this
   * order, whatever order the joins were posted in. */
  sched_executor **p = &s->executors;
  while (*p && (*p)->id > x->id) p = &(*p)->next;
  x->next = *p;
  *p = x;
  s->free_slots += x->slots;
}

static void executor_free(scheduler *s, sched_executor *x) {
  for (sched_executor **p = &s->executors; *p; p = &(*p)->next)
    if (*p == x) {
      *p = x->next;
      break;
    }
  common_free(x->no_device);
  common_free(x);
}

void scheduler_executor_removed(scheduler *s, uint64_t id) {
  sched_executor *x = executors_find(s, id);
  if (!x || x->removed) return;
  x->removed = true;
  s->free_slots -= x->slots; /* its running attempts give theirs back as they end */
  if (x->running == 0) executor_free(s, x);
}

/* Task failures that say nothing about the executor. */
static bool executor_blameless(const sched_task *t) {
  return t->executor_lost || t->rt.status == FL_ECANCELLED || t->rt.fetch_failed;
}

void executors_attempt_ended(scheduler *s, const sched_task *t, uint64_t ran) {
  sched_executor *placed = t->executor ? executors_find(s, t->executor) : NULL;
  if (placed) placed->running--; /* its slot, wherever it ran */
  sched_executor *e = ran && ran != t->executor ? executors_find(s, ran) : placed;
  const sched_placement *p = &s->placement;
  if (e && t->rt.status != FL_OK && !executor_blameless(t) && p->exclude_failures &&
      ++e->failures_in_row >= p->exclude_failures) {
    e->failures_in_row = 0;
    e->excluded_until_ns = common_now_ns() + p->exclude_ns;
    common_log(LOG_WARN, "executor %llu excluded for %.0f s: %u tasks failed on it in a row (the last: %s)",
               (unsigned long long)e->id, (double)p->exclude_ns / 1e9, p->exclude_failures,
               t->rt.error ? t->rt.error : fl_strerror(t->rt.status));
  }
  if (e && t->rt.status == FL_OK) e->failures_in_row = 0;
  if (e && t->rt.status == FL_ENODEVICE && e->gpu >= 0 && !e->no_device) {
    e->no_device = common_strdup(t->rt.error ? t->rt.error : fl_strerror(t->rt.status));
    common_log(LOG_WARN, "executor %llu was started with --gpu %d but has no usable device; it gets no more GPU "
               "tasks: %s", (unsigned long long)e->id, (int)e->gpu, e->no_device ? e->no_device : "");
  }
  if (placed && placed->removed && placed->running == 0) executor_free(s, placed);
}

void scheduler_set_placement(scheduler *s, const sched_placement *placement) { s->placement = *placement; }
