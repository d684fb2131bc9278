/*
 * job_end.c: the end of a job. A job finishes once every result task succeeded, or fails at
 * its first cause (a task out of attempts, a stage that cannot run, a cancel); either way it
 * ends only when no attempt of it still runs, and goes back to its caller once the event
 * that ended it is through (event_loop.c). Scheduler thread only.
 */
#include <stdarg.h>
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"

void job_end_maybe_finish(scheduler *s, sched_job *job) {
  bool failed = job->status != FL_OK;
  if (job->running > 0 || (!failed && job->remaining > 0)) return;
  if (failed) atomic_fetch_add(&s->jobs_failed, 1);
  if (job->active_prev) job->active_prev->active_next = job->active_next;
  else s->active = job->active_next;
  if (job->active_next) job->active_next->active_prev = job->active_prev;
  /* A backup still pending (its original won before a slot came free) goes with the job,
   * which is freed once handed back. */
  task_queue_drop_job(s, job);
  COMMON_TRACE("job.end", failed ? "failed" : "ok");
  if (common_log_enabled(sched_event_level(s))) {
    double ms = (double)(common_now_ns() - job->submitted_ns) / 1e6;
    if (failed)
      common_log(sched_event_level(s), "job %llu: ends: failed after %.1f ms: %s", (unsigned long long)job->id, ms,
                 job->error ? job->error : fl_strerror(job->status));
    else
      common_log(sched_event_level(s), "job %llu: ends: ok after %.1f ms, %llu task attempts",
                 (unsigned long long)job->id, ms, (unsigned long long)job->stats.attempts);
  }
  /* Handed back by the loop once this event is through (complete_ended), not here: the
   * code that finished the job may still read it (a barrier stage that fails for want of
   * slots inside dag_scheduler_job_submitted, say), and a waiting caller frees it. */
  notes_job_ended(s, job);
  job->ended_next = s->ended;
  s->ended = job;
}

void job_end_fail(scheduler *s, sched_job *job, fl_status status, const char *fmt, ...) {
  if (job->status != FL_OK) return; /* the first cause is the one reported */
  job->status = status;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  job->error = common_strdup(msg);
  atomic_store(&job->cancelled, true);
  barrier_job_abort(s->barriers, job->id);
  task_queue_drop_job(s, job);
  if (job->running > 0 && s->backend->ops->kill_job) s->backend->ops->kill_job(s->backend, job);
  job_end_maybe_finish(s, job);
}
