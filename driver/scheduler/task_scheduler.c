/*
 * task_scheduler.c: pending tasks onto free slots, in submission order (where each runs is
 * locality.c's choice; barrier stages' gangs are gang.c's, backups speculation.c's), and
 * the ends of attempts: a failed attempt is retried up to max_attempts, after which the job
 * fails with the last cause; a success (or a task that could not read map output) is the
 * outcome that the event loop hands to the DAG scheduler. Scheduler thread only.
 */
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"

/* Tasks launch in submission order; one that waits for its preferred executor (delay
 * scheduling) stays pending while later ones go ahead. */
void task_scheduler_offer(scheduler *s) {
  const backend_ops *ops = s->backend->ops;
  bool placed = !s->backend->threads; /* on executors, by locality_place */
  speculation_back_up_queued(s);
  uint64_t now = placed ? common_now_ns() : 0;
  s->retry_at_ns = 0;
  bool launched = s->gangs_head && gang_offer(s);
  sched_task **link = &s->pending_head, *last = NULL;
  while (s->free_slots > 0 && *link) {
    sched_task *t = *link;
    uint64_t retry_at = 0;
    if (t->original && (t->original->done || !t->original->running)) { /* a backup not needed now */
      *link = t->pending_next;
      continue;
    }
    if (placed && !locality_place(s, t, now, &retry_at)) {
      if (retry_at && (!s->retry_at_ns || retry_at < s->retry_at_ns)) s->retry_at_ns = retry_at;
      last = t;
      link = &t->pending_next;
      continue;
    }
    *link = t->pending_next;
    task_queue_launch(s, t);
    launched = true;
  }
  /* The tail may have moved if the last tasks were taken. */
  if (!*link) s->pending_tail = last;
  if (launched && ops->flush) ops->flush(s->backend, s->pending_head != NULL || s->gangs_head != NULL);
}

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
  job_end_fail(s, t->job, cause_status == FL_ECORRUPT ? FL_ECORRUPT : FL_EJOB,
                           "job %llu failed: partition %u of dataset %llu (%s)%s failed %u times "
                           "on executor '%s'; last error: %s",
                           (unsigned long long)t->job->id, t->rt.partition, (unsigned long long)st->rdd->id,
                           st->rdd->ops->name, where, t->failures, s->backend->ops->name, cause);
}

task_outcome task_scheduler_task_ended(scheduler *s, sched_task *t) {
  sched_job *job = t->job;
  sched_task *task = t->original ? t->original : t; /* the task this attempt ran */
  sched_task *other = t->original ? t->original : t->backup;
  t->running = false;
  if (common_log_enabled(LOG_DEBUG))
    common_log(LOG_DEBUG, "job %llu: stage %u: task %u (partition %u, attempt %u) ends: %s after %.1f ms",
               (unsigned long long)job->id, t->stage->id, t->index, t->rt.partition, t->rt.attempt,
               t->rt.status == FL_OK ? "ok" : fl_status_name(t->rt.status),
               (double)(common_now_ns() - t->launched_ns) / 1e6);
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
  uint64_t ran = 0; /* the executor that ran it, when the backend says */
  bool counts = t->rt.status == FL_OK && job->status == FL_OK;
  if (s->backend->ops->ended) ran = s->backend->ops->ended(s->backend, t, counts);
  executors_attempt_ended(s, t, ran);
  notes_task_ended(s, t, ran);
  s->free_slots++;
  job->running--;
  rdd_task *rt = &t->rt;
  if (job->status != FL_OK || superfluous) { /* this attempt no longer matters */
    rdd_task_clear(rt);
    job_end_maybe_finish(s, job);
    return TASK_OUTCOME_NONE;
  }
  if (rt->status == FL_OK) { /* before a backup's outcome is adopted: its bytes are its own */
    job->stats.input_bytes += rt->input_bytes;
    job->stats.shuffle_read_bytes += rt->shuffle_read_bytes;
    job->stats.shuffle_write_bytes += rt->shuffle_write_bytes;
    atomic_fetch_add(&s->input_bytes, rt->input_bytes);
    atomic_fetch_add(&s->shuffle_read_bytes, rt->shuffle_read_bytes);
    atomic_fetch_add(&s->shuffle_write_bytes, rt->shuffle_write_bytes);
  }
  if (t->stage->barrier) return gang_task_ended(s, t); /* no backups run for barrier stages */
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
    return (task_outcome){TASK_SUCCEEDED, t, 1};
  }
  atomic_fetch_add(&s->tasks_failed, 1);
  if (rt->status == FL_EFETCH && rt->fetch_failed) /* the map output is lost, not the task */
    return (task_outcome){TASK_FETCH_FAILED, t, 1};
  if (t->executor_lost) { /* not the task's fault: it runs again elsewhere */
    t->executor_lost = false;
    rdd_task_clear(rt);
    task_queue_push(s, t);
    return TASK_OUTCOME_NONE;
  }
  t->failures++;
  if (t->failures < s->max_attempts && rt->status != FL_ECANCELLED && !rt->no_retry) {
    rdd_task_clear(rt);
    task_queue_push(s, t);
    return TASK_OUTCOME_NONE;
  }
  /* Failing the job may hand it back to its caller, who frees the tasks: take what the
   * message needs and clear the task first. */
  char *cause = rt->error;
  fl_status cause_status = rt->status;
  rt->error = NULL;
  rdd_task_clear(rt);
  task_failed_job(s, t, cause_status, cause ? cause : fl_strerror(cause_status));
  common_free(cause);
  return TASK_OUTCOME_NONE;
}


void scheduler_charge_task(scheduler *s, uint64_t job_id, uint32_t stage_id, uint32_t index, const char *why) {
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
