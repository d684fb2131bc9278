/*
 * dag_scheduler.c: jobs into stages into tasks, and the end of jobs.
 *
 * Every dependency in the lineage is narrow for now, so a job is one result stage whose
 * tasks pipeline the whole chain; shuffle dependencies will cut the lineage into parent
 * stages that run first. Runs on the scheduler thread only.
 */
#include <stdarg.h>
#include <stdio.h>

#include "driver/driver.h"

void dag_scheduler_job_submitted(scheduler *s, sched_job *job) {
  atomic_fetch_add(&s->jobs_run, 1);
  for (uint32_t i = 0; i < job->num_parts; i++) {
    sched_task *t = &job->tasks[i];
    t->job = job;
    t->index = i;
    t->rt.ctx = job->rdd->ctx;
    t->rt.job_id = job->id;
    t->rt.partition = job->parts[i];
    t->rt.cancelled = &job->cancelled;
  }
  job->remaining = job->num_parts;
  task_scheduler_submit(s, job->tasks, job->num_parts);
}

void dag_scheduler_maybe_finish(scheduler *s, sched_job *job) {
  (void)s;
  bool failed = job->status != FL_OK;
  if (job->running > 0 || (!failed && job->remaining > 0)) return;
  if (failed) atomic_fetch_add(&s->jobs_failed, 1);
  /* After this the caller owns the job again; the scheduler must not touch it. */
  common_event_set(&job->done);
}

void dag_scheduler_task_succeeded(scheduler *s, sched_task *task) {
  sched_job *job = task->job;
  fl_buf t = job->results[task->index];
  job->results[task->index] = task->result;
  task->result = t;
  job->remaining--;
  dag_scheduler_maybe_finish(s, job);
}

void dag_scheduler_job_failed(scheduler *s, sched_job *job, fl_status status, const char *fmt, ...) {
  if (job->status != FL_OK) return; /* the first cause is the one reported */
  job->status = status;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  job->error = common_strdup(msg);
  atomic_store(&job->cancelled, true);
  task_scheduler_drop_job(s, job);
  dag_scheduler_maybe_finish(s, job);
}
