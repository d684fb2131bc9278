/*
 * task_scheduler.c: tasks onto the backend's free slots, in submission order; failed
 * attempts retried up to max_attempts, after which the job fails with the last cause.
 * Runs on the scheduler thread only.
 */
#include <stdio.h>

#include "driver/driver.h"

static void pending_push(scheduler *s, sched_task *t) {
  t->pending_next = NULL;
  t->pending_since_ns = common_now_ns();
  if (s->pending_tail) s->pending_tail->pending_next = t; else s->pending_head = t;
  s->pending_tail = t;
}

void task_scheduler_submit(scheduler *s, sched_task *tasks, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) pending_push(s, &tasks[i]);
}

/* Tasks launch in submission order; one that waits for its preferred executor (delay
 * scheduling, decided by the backend's place) stays pending while later ones go ahead. */
void task_scheduler_offer(scheduler *s) {
  const backend_ops *ops = s->backend->ops;
  uint64_t now = ops->place ? common_now_ns() : 0;
  s->retry_at_ns = 0;
  sched_task **link = &s->pending_head, *last = NULL;
  bool launched = false;
  while (s->free_slots > 0 && *link) {
    sched_task *t = *link;
    uint64_t retry_at = 0;
    if (ops->place && !ops->place(s->backend, t, now, &retry_at)) {
      if (retry_at && (!s->retry_at_ns || retry_at < s->retry_at_ns)) s->retry_at_ns = retry_at;
      last = t;
      link = &t->pending_next;
      continue;
    }
    *link = t->pending_next;
    s->free_slots--;
    t->job->running++;
    t->rt.attempt++;
    atomic_fetch_add(&s->tasks_run, 1);
    ops->launch(s->backend, t);
    launched = true;
  }
  /* The tail may have moved if the last tasks were taken. */
  if (!*link) s->pending_tail = last;
  if (launched && ops->flush) ops->flush(s->backend);
}

void task_scheduler_drop_job(scheduler *s, sched_job *job) {
  sched_task **p = &s->pending_head, *last = NULL;
  while (*p) {
    if ((*p)->job == job) {
      *p = (*p)->pending_next;
    } else {
      last = *p;
      p = &(*p)->pending_next;
    }
  }
  s->pending_tail = last;
}

/* Whatever may finish the job (task_succeeded, job_failed, maybe_finish) comes last: once
 * the job is finished its caller owns (and frees) the job and its tasks. */
void task_scheduler_task_ended(scheduler *s, sched_task *t) {
  sched_job *job = t->job;
  if (s->backend->ops->ended) s->backend->ops->ended(s->backend, t);
  s->free_slots++;
  job->running--;
  rdd_task *rt = &t->rt;
  if (job->status != FL_OK) { /* the job already failed: this attempt no longer matters */
    rdd_task_clear(rt);
    dag_scheduler_maybe_finish(s, job);
    return;
  }
  if (rt->status == FL_OK) {
    rdd_task_commit_accumulators(rt);
    rdd_task_clear(rt);
    dag_scheduler_task_succeeded(s, t);
    return;
  }
  atomic_fetch_add(&s->tasks_failed, 1);
  if (rt->status == FL_EFETCH && rt->fetch_failed) { /* the map output is lost, not the task */
    dag_scheduler_fetch_failed(s, t);
    return;
  }
  if (t->executor_lost) { /* not the task's fault: it runs again elsewhere */
    t->executor_lost = false;
    rdd_task_clear(rt);
    pending_push(s, t);
    return;
  }
  t->failures++;
  if (t->failures < s->max_attempts && rt->status != FL_ECANCELLED) {
    rdd_task_clear(rt);
    pending_push(s, t);
    return;
  }
  /* Failing the job may hand it back to its caller, who frees the tasks: take what the
   * message needs and clear the task first. */
  char *cause = rt->error;
  fl_status cause_status = rt->status;
  uint32_t partition = rt->partition;
  rt->error = NULL;
  rdd_task_clear(rt);
  const sched_stage *st = t->stage;
  char where[96] = "";
  if (st->dep) snprintf(where, sizeof where, " (a map task of shuffle %llu)", (unsigned long long)st->dep->shuffle_id);
  dag_scheduler_job_failed(s, job, FL_EJOB,
                           "job %llu failed: partition %u of dataset %llu (%s)%s failed %u times "
                           "on executor '%s'; last error: %s",
                           (unsigned long long)job->id, partition, (unsigned long long)st->rdd->id,
                           st->rdd->ops->name, where, t->failures, s->backend->ops->name,
                           cause ? cause : fl_strerror(cause_status));
  common_free(cause);
}
