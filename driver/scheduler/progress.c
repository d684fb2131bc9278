/*
 * progress.c: what progress bars show (scheduler_progress): the active stages of a group's
 * running jobs, counted on the scheduler thread, which alone may read them.
 *
 * Threading: the caller posts a call and waits for its answer at most PROGRESS_WAIT_NS; a
 * caller that gave up leaves the request to the call, so the request has two owners and
 * whichever lets go last frees it.
 */
#include <stdlib.h>
#include <string.h>

#include "driver/scheduler/scheduler_internal.h"

/* A scheduler busy for longer than this misses a redraw, not more. */
#define PROGRESS_WAIT_NS 1000000000ull

typedef struct progress_request {
  common_event answered;
  atomic_int owners; /* the caller and the call */
  uint64_t group;
  uint32_t cap, count;
  sched_stage_progress items[];
} progress_request;

static void request_release(progress_request *r) {
  if (atomic_fetch_sub(&r->owners, 1) != 1) return;
  common_event_destroy(&r->answered);
  common_free(r);
}

static int by_stage(const void *a, const void *b) {
  uint32_t x = ((const sched_stage_progress *)a)->stage, y = ((const sched_stage_progress *)b)->stage;
  return x < y ? -1 : x > y;
}

/* A stage is active from its submission until its last task succeeds; a result stage is
 * never marked finished (its job's `remaining` counts its tasks). */
static bool stage_active(const sched_job *job, const sched_stage *st) {
  if (!st->submitted || st->num_tasks == 0) return false;
  return st->dep ? !st->finished : job->remaining > 0;
}

static void count_on_loop(scheduler *s, void *arg) {
  progress_request *r = arg;
  uint32_t n = 0;
  for (sched_job *job = s->active; job; job = job->active_next) {
    if (job->group != r->group || job->status != FL_OK) continue;
    for (sched_stage *st = job->stages; st; st = st->next) {
      if (!stage_active(job, st)) continue;
      if (n < r->cap) {
        sched_stage_progress *p = &r->items[n];
        *p = (sched_stage_progress){.stage = st->uid, .tasks = st->num_tasks};
        for (uint32_t i = 0; i < st->num_tasks; i++) {
          const sched_task *t = &st->tasks[i];
          if (t->done) p->completed++;
          else if (t->running || (t->backup && t->backup->running)) p->running++;
        }
      }
      n++;
    }
  }
  r->count = n;
  common_event_set(&r->answered);
  request_release(r);
}

fl_status scheduler_progress(scheduler *s, uint64_t group, sched_stage_progress *out, uint32_t cap,
                             uint32_t *count) {
  *count = 0;
  progress_request *r = common_calloc(1, sizeof *r + (size_t)cap * sizeof r->items[0]);
  if (!r) return FL_ERR(FL_ENOMEM, "out of memory");
  common_event_init(&r->answered);
  atomic_init(&r->owners, 2);
  r->group = group;
  r->cap = cap;
  fl_status st = scheduler_post_call(s, count_on_loop, r);
  if (st != FL_OK) {
    atomic_store(&r->owners, 1);
    request_release(r);
    return st;
  }
  if (!common_event_wait_until(&r->answered, common_now_ns() + PROGRESS_WAIT_NS)) {
    request_release(r);
    return FL_ERR(FL_ETIMEDOUT, "the scheduler did not say within 1 s which stages run");
  }
  uint32_t shown = r->count < cap ? r->count : cap;
  if (shown) { /* out and r->items may be NULL when there is nothing */
    memcpy(out, r->items, shown * sizeof *out);
    qsort(out, shown, sizeof *out, by_stage);
  }
  *count = r->count;
  request_release(r);
  return FL_OK;
}
