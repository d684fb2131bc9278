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

static void back_up_queued(scheduler *s);

void task_scheduler_submit(scheduler *s, sched_task *tasks, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) pending_push(s, &tasks[i]);
}

/* Tasks launch in submission order; one that waits for its preferred executor (delay
 * scheduling, decided by the backend's place) stays pending while later ones go ahead. */
void task_scheduler_offer(scheduler *s) {
  const backend_ops *ops = s->backend->ops;
  back_up_queued(s);
  uint64_t now = ops->place ? common_now_ns() : 0;
  s->retry_at_ns = 0;
  sched_task **link = &s->pending_head, *last = NULL;
  bool launched = false;
  while (s->free_slots > 0 && *link) {
    sched_task *t = *link;
    uint64_t retry_at = 0;
    if (t->original && (t->original->done || !t->original->running)) { /* a backup not needed now */
      *link = t->pending_next;
      continue;
    }
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
    t->running = true;
    t->launched_ns = common_now_ns();
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
/* The backup's outcome becomes the task's, so that the rest of the scheduler sees one task. */
static void adopt_outcome(sched_task *task, sched_task *backup) {
  rdd_task_clear(&task->rt);
  task->rt.status = backup->rt.status;
  task->rt.error = backup->rt.error;
  task->rt.acc_updates = backup->rt.acc_updates;
  task->rt.num_acc_updates = backup->rt.num_acc_updates;
  task->rt.cap_acc_updates = backup->rt.cap_acc_updates;
  task->rt.fetch_failed = backup->rt.fetch_failed;
  task->rt.fetch_shuffle_id = backup->rt.fetch_shuffle_id;
  task->rt.fetch_map = backup->rt.fetch_map;
  backup->rt.error = NULL;
  backup->rt.acc_updates = NULL;
  backup->rt.num_acc_updates = backup->rt.cap_acc_updates = 0;
  rdd_task_clear(&backup->rt);
  fl_buf r = task->result;
  task->result = backup->result;
  backup->result = r;
  task->executor_lost = backup->executor_lost;
  task->launched_ns = backup->launched_ns;
}

void task_scheduler_task_ended(scheduler *s, sched_task *t) {
  sched_job *job = t->job;
  sched_task *task = t->original ? t->original : t; /* the task this attempt ran */
  sched_task *other = t->original ? t->original : t->backup;
  t->running = false;
  bool other_running = other && other->running;
  /* The other attempt won already: nothing of this one counts (results, accumulators). */
  if (task->done && t->rt.status == FL_OK) t->rt.status = FL_ECANCELLED;
  bool superfluous = task->done || (t->rt.status != FL_OK && other_running);
  if (s->backend->ops->ended) s->backend->ops->ended(s->backend, t);
  s->free_slots++;
  job->running--;
  rdd_task *rt = &t->rt;
  if (job->status != FL_OK || superfluous) { /* this attempt no longer matters */
    rdd_task_clear(rt);
    dag_scheduler_maybe_finish(s, job);
    return;
  }
  if (rt->status == FL_OK && other_running && s->backend->ops->kill_attempt)
    s->backend->ops->kill_attempt(s->backend, other);
  if (t != task) { /* the backup's end is the task's */
    adopt_outcome(task, t);
    t = task;
    rt = &t->rt;
  }
  if (rt->status == FL_OK) {
    t->done = true;
    t->duration_ns = common_now_ns() - t->launched_ns;
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

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* A second attempt of running task `t`, pending; it will be placed away from t's executor. */
static bool back_up(scheduler *s, sched_task *t) {
  sched_task *b = common_calloc(1, sizeof *b);
  if (!b) return false;
  sched_job *job = t->job;
  b->job = job;
  b->stage = t->stage;
  b->index = t->index;
  b->rt.ctx = t->rt.ctx;
  b->rt.job_id = t->rt.job_id;
  b->rt.partition = t->rt.partition;
  b->rt.cancelled = t->rt.cancelled;
  b->original = t;
  t->backup = b;
  b->next_copy = job->copies;
  job->copies = b;
  atomic_fetch_add(&s->tasks_speculated, 1);
  pending_push(s, b);
  return true;
}

/* One stage: once enough of its tasks succeeded, backups for the slow running ones. */
static void speculate_stage(scheduler *s, sched_job *job, sched_stage *st, uint64_t now) {
  const sched_speculation *sp = &s->speculation;
  uint32_t n = st->num_tasks, done = 0;
  for (uint32_t i = 0; i < n; i++) done += st->tasks[i].done;
  if (done == 0 || done == n || (double)done < sp->quantile * n) return;
  uint64_t *d = common_calloc(done, sizeof *d);
  if (!d) return;
  for (uint32_t i = 0, k = 0; i < n; i++)
    if (st->tasks[i].done) d[k++] = st->tasks[i].duration_ns;
  qsort(d, done, sizeof *d, cmp_u64);
  uint64_t median = d[done / 2];
  common_free(d);
  uint64_t threshold = (uint64_t)(sp->multiplier * (double)median);
  if (threshold < sp->min_ns) threshold = sp->min_ns;
  for (uint32_t i = 0; i < n; i++) {
    sched_task *t = &st->tasks[i];
    if (t->done || !t->running || t->backup || now - t->launched_ns <= threshold) continue;
    if (!back_up(s, t)) return;
    common_log(LOG_INFO, "job %llu: partition %u of dataset %llu has run %.0f ms (median %.0f ms): "
               "a backup copy runs elsewhere", (unsigned long long)job->id, t->rt.partition,
               (unsigned long long)st->rdd->id, (double)(now - t->launched_ns) / 1e6, (double)median / 1e6);
  }
}

/* Late binding: tasks were handed to executors ahead of time (slots_per_core), so a slow
 * executor's queue can hold tasks that a fast, idle one could run now. With nothing pending,
 * each idle core takes a copy of a task that has waited at least the speculation minimum in
 * another executor's queue; the first copy to finish wins, as with any backup. */
static void back_up_queued(scheduler *s) {
  enum { MAX_AT_ONCE = 16 };
  const backend_ops *ops = s->backend->ops;
  if (!s->speculation.enabled || !ops->queued_behind || s->pending_head || !s->active) return;
  uint64_t now = common_now_ns();
  sched_task *found[MAX_AT_ONCE];
  size_t n = ops->queued_behind(s->backend, now - s->speculation.min_ns, found, MAX_AT_ONCE);
  for (size_t i = 0; i < n; i++) {
    sched_task *t = found[i];
    if (t->job->status != FL_OK || !back_up(s, t)) continue;
    common_log(LOG_INFO, "job %llu: partition %u of dataset %llu has waited %.0f ms in a busy executor's "
               "queue while another executor is idle: a backup copy runs elsewhere",
               (unsigned long long)t->job->id, t->rt.partition, (unsigned long long)t->stage->rdd->id,
               (double)(now - t->launched_ns) / 1e6);
  }
}

void task_scheduler_speculate(scheduler *s) {
  uint64_t now = common_now_ns();
  for (sched_job *job = s->active; job; job = job->active_next) {
    if (job->status != FL_OK) continue;
    for (sched_stage *st = job->stages; st; st = st->next)
      if (st->submitted && !st->finished && st->tasks) speculate_stage(s, job, st, now);
  }
}
