/*
 * task_scheduler.c: tasks onto the backend's free slots, in submission order; failed
 * attempts retried up to max_attempts, after which the job fails with the last cause.
 * Runs on the scheduler thread only.
 */
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"

static void pending_push(scheduler *s, sched_task *t) {
  t->pending_next = NULL;
  t->pending_since_ns = common_now_ns();
  if (s->pending_tail) s->pending_tail->pending_next = t; else s->pending_head = t;
  s->pending_tail = t;
}

static void back_up_queued(scheduler *s);

/* ---- barrier stages: gangs ------------------------------------------------------------- */

static uint32_t gang_capacity(scheduler *s, bool gpu) {
  const backend_ops *ops = s->backend->ops;
  return ops->gang_capacity ? ops->gang_capacity(s->backend, gpu) : s->backend->slots;
}

static bool stage_gpu(const sched_stage *st) {
  const rdd_barrier_state *bs = st->barrier->state;
  return bs && bs->gpu;
}

/* Fails the job of a gang the cluster cannot run at all (too few slots, or none with a
 * GPU); true when it did. */
static bool gang_impossible(scheduler *s, sched_stage *st) {
  bool gpu = stage_gpu(st);
  uint32_t cap = gang_capacity(s, gpu);
  if (cap >= st->num_tasks) return false;
  sched_job *job = st->tasks[0].job;
  char why[1024] = "";
  const backend_ops *ops = s->backend->ops;
  if (ops->gang_shortfall) ops->gang_shortfall(s->backend, gpu, why, sizeof why);
  dag_scheduler_job_failed(s, job, FL_ESLOTS,
                           "job %llu: barrier stage of dataset %llu needs %u %s at once, but the cluster "
                           "has %u (%s%s%s)",
                           (unsigned long long)job->id, (unsigned long long)st->barrier->id, st->num_tasks,
                           gpu ? "GPU executors" : "task slots", cap,
                           gpu ? "executors started with --gpu" : "executors x cores, or local threads",
                           *why ? "; " : "", why);
  return true;
}

void task_scheduler_submit_gang(scheduler *s, sched_stage *st) {
  if (gang_impossible(s, st)) return;
  sched_job *job = st->tasks[0].job;
  fl_status rs = barrier_stage_start(s->barriers, job->id, job->group, job->tag, st->id, st->barrier_attempt,
                                     st->num_tasks);
  if (rs != FL_OK) {
    dag_scheduler_job_failed(s, job, rs, "job %llu: %s", (unsigned long long)job->id, fl_last_error());
    return;
  }
  for (uint32_t i = 0; i < st->num_tasks; i++) {
    sched_task *t = &st->tasks[i];
    t->barrier_ok = false;
    t->rt.barrier = (rdd_barrier_info){.on = true, .stage = st->id, .attempt = st->barrier_attempt,
                                       .world = st->num_tasks, .gpu = -1};
  }
  st->barrier_succeeded = 0;
  st->barrier_aborted = false;
  st->barrier_next = NULL;
  sched_stage **p = &s->gangs_head;
  while (*p) p = &(*p)->barrier_next;
  *p = st;
}

static void launch(scheduler *s, sched_task *t) {
  s->free_slots--;
  t->job->running++;
  t->rt.attempt++;
  t->running = true;
  t->launched_ns = common_now_ns();
  atomic_fetch_add(&s->tasks_run, 1);
  s->backend->ops->launch(s->backend, t);
}

/* Launches every waiting gang that fits now, in order; true when one was launched. */
static bool offer_gangs(scheduler *s) {
  const backend_ops *ops = s->backend->ops;
  bool launched = false;
  sched_stage **p = &s->gangs_head;
  while (*p) {
    sched_stage *st = *p;
    sched_job *job = st->tasks[0].job;
    if (job->status != FL_OK) { /* dropped with its job */
      *p = st->barrier_next;
      continue;
    }
    if (gang_impossible(s, st)) continue; /* the failure dropped it from the list */
    if (s->free_slots < (int64_t)st->num_tasks ||
        (ops->gang_place && !ops->gang_place(s->backend, st->tasks, st->num_tasks, stage_gpu(st)))) {
      p = &st->barrier_next;
      continue;
    }
    *p = st->barrier_next;
    st->barrier_running = st->num_tasks;
    for (uint32_t i = 0; i < st->num_tasks; i++) launch(s, &st->tasks[i]);
    launched = true;
  }
  return launched;
}

/* The current attempt of a barrier stage is over once every task ended: the stage runs
 * again (attempt + 1), or the job fails after max_attempts failed attempts. */
static void gang_maybe_retry(scheduler *s, sched_stage *st) {
  if (st->barrier_running > 0) return;
  sched_job *job = st->tasks[0].job;
  for (uint32_t i = 0; i < st->num_tasks; i++) {
    sched_task *t = &st->tasks[i];
    rdd_task_clear(&t->rt);
    t->result.len = 0;
    t->barrier_ok = false;
    t->executor_lost = false;
  }
  char *cause = st->barrier_cause;
  st->barrier_cause = NULL;
  /* No usable device is no passing fault: where every task runs in this process (no
   * gang_capacity: the local backend) the next attempt would find none either. A cluster
   * gives up the executor instead (gang_shortfall says why), and the stage runs again on
   * the others, or fails at once when too few are left. */
  bool deterministic = st->barrier_cause_status == FL_ENODEVICE && !s->backend->ops->gang_capacity;
  if (st->barrier_failures >= s->max_attempts || deterministic) {
    dag_scheduler_job_failed(s, job, FL_EJOB,
                             "job %llu failed: barrier stage of dataset %llu (%u tasks) failed %u times; last "
                             "error (partition %u): %s",
                             (unsigned long long)job->id, (unsigned long long)st->barrier->id, st->num_tasks,
                             st->barrier_failures, st->barrier_cause_partition,
                             cause ? cause : fl_strerror(st->barrier_cause_status));
    common_free(cause);
    return;
  }
  if (gang_impossible(s, st)) { /* the failure gave up the executors it needs (no device) */
    common_free(cause);
    return;
  }
  common_log(LOG_WARN, "job %llu: barrier stage of dataset %llu runs again (attempt %u) after partition %u "
             "failed: %s", (unsigned long long)job->id, (unsigned long long)st->barrier->id,
             st->barrier_attempt + 1, st->barrier_cause_partition, cause ? cause : "");
  common_free(cause);
  st->barrier_attempt++;
  task_scheduler_submit_gang(s, st);
}

/* An attempt of a barrier stage's task ended (its job still runs). Successes are held until
 * every task of the attempt succeeded; a failure abandons the attempt, stops the others and
 * retries the whole stage once they all ended. */
static void gang_task_ended(scheduler *s, sched_task *t) {
  sched_stage *st = t->stage;
  rdd_task *rt = &t->rt;
  st->barrier_running--;
  if (st->barrier_aborted) { /* this attempt is lost already */
    rdd_task_clear(rt);
    gang_maybe_retry(s, st);
    return;
  }
  if (rt->status == FL_OK) {
    t->barrier_ok = true;
    if (++st->barrier_succeeded < st->num_tasks) return;
    /* Every task succeeded: commit them all. The last commit may finish (and free) the job. */
    uint32_t n = st->num_tasks;
    for (uint32_t i = 0; i < n; i++) {
      sched_task *x = &st->tasks[i];
      x->done = true;
      x->duration_ns = common_now_ns() - x->launched_ns;
      rdd_task_commit_accumulators(&x->rt);
      rdd_task_clear(&x->rt);
    }
    sched_task *tasks = st->tasks;
    for (uint32_t i = 0; i < n; i++) dag_scheduler_task_succeeded(s, &tasks[i]);
    return;
  }
  atomic_fetch_add(&s->tasks_failed, 1);
  sched_job *job = t->job;
  st->barrier_aborted = true;
  if (!t->executor_lost) st->barrier_failures++;
  common_free(st->barrier_cause);
  st->barrier_cause = rt->error;
  rt->error = NULL;
  st->barrier_cause_status = rt->status;
  st->barrier_cause_partition = rt->partition;
  rdd_task_clear(rt);
  barrier_stage_abort(s->barriers, job->id, st->id);
  const backend_ops *ops = s->backend->ops;
  if (ops->kill_attempt)
    for (uint32_t i = 0; i < st->num_tasks; i++)
      if (st->tasks[i].running) ops->kill_attempt(s->backend, &st->tasks[i]);
  gang_maybe_retry(s, st);
}

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
  bool launched = s->gangs_head && offer_gangs(s);
  sched_task **link = &s->pending_head, *last = NULL;
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
    launch(s, t);
    launched = true;
  }
  /* The tail may have moved if the last tasks were taken. */
  if (!*link) s->pending_tail = last;
  if (launched && ops->flush) ops->flush(s->backend, s->pending_head != NULL || s->gangs_head != NULL);
}

void task_scheduler_drop_job(scheduler *s, sched_job *job) {
  for (sched_stage **g = &s->gangs_head; *g;) {
    if ((*g)->tasks[0].job == job) *g = (*g)->barrier_next;
    else g = &(*g)->barrier_next;
  }
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
 * the event is through, a finished job goes back to its caller, which frees it and its
 * tasks. */
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

/* Fails t's job: t failed max_attempts times, the last with `cause` (status cause_status).
 * The job's status is FL_EJOB, but for corrupt input (FL_ECORRUPT: a truncated file, a
 * checksum that does not match), which callers tell apart from other failures. Nothing of t
 * may be used afterwards (the job's caller may free it). */
static void task_failed_job(scheduler *s, sched_task *t, fl_status cause_status, const char *cause) {
  const sched_stage *st = t->stage;
  char where[96] = "";
  if (st->dep) snprintf(where, sizeof where, " (a map task of shuffle %llu)", (unsigned long long)st->dep->shuffle_id);
  dag_scheduler_job_failed(s, t->job, cause_status == FL_ECORRUPT ? FL_ECORRUPT : FL_EJOB,
                           "job %llu failed: partition %u of dataset %llu (%s)%s failed %u times "
                           "on executor '%s'; last error: %s",
                           (unsigned long long)t->job->id, t->rt.partition, (unsigned long long)st->rdd->id,
                           st->rdd->ops->name, where, t->failures, s->backend->ops->name, cause);
}

void task_scheduler_task_ended(scheduler *s, sched_task *t) {
  sched_job *job = t->job;
  sched_task *task = t->original ? t->original : t; /* the task this attempt ran */
  sched_task *other = t->original ? t->original : t->backup;
  t->running = false;
  job->stats.attempts++;
  job->stats.attempts_failed += t->rt.status != FL_OK;
  job->stats.task_ns += t->rt.run_ns;
  job->stats.blocks_mapped += t->rt.blocks_mapped;
  job->stats.blocks_fetched += t->rt.blocks_fetched;
  atomic_fetch_add(&s->task_ns, t->rt.run_ns);
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
  if (t->stage->barrier) { /* no backups run for barrier stages */
    gang_task_ended(s, t);
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
  rt->error = NULL;
  rdd_task_clear(rt);
  task_failed_job(s, t, cause_status, cause ? cause : fl_strerror(cause_status));
  common_free(cause);
}

void task_scheduler_charge(scheduler *s, uint64_t job_id, uint32_t stage_id, uint32_t index, const char *why) {
  sched_job *job = s->active;
  while (job && job->id != job_id) job = job->active_next;
  sched_stage *st = job && job->status == FL_OK ? job->stages : NULL;
  while (st && st->id != stage_id) st = st->next;
  if (!st || index >= st->num_tasks || st->barrier) return;
  sched_task *t = &st->tasks[index];
  if (t->done) return;
  t->failures++;
  common_log(LOG_WARN, "job %llu: partition %u of dataset %llu has failed %u times (the last: %s)",
             (unsigned long long)job_id, t->rt.partition, (unsigned long long)st->rdd->id, t->failures, why);
  if (t->failures >= s->max_attempts) task_failed_job(s, t, FL_ENET, why);
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
    if (t->job->status != FL_OK || t->stage->barrier || !back_up(s, t)) continue;
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
      if (st->submitted && !st->finished && st->tasks && !st->barrier) speculate_stage(s, job, st, now);
  }
}
