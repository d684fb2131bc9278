/*
 * gang.c: barrier stages on the scheduler's side (docs/barrier.md): their tasks wait for each
 * other, so they are gang-scheduled: all start together, each on a core of its own (a GPU
 * stage: each on an idle executor with a GPU), or none does. A stage waits in the
 * scheduler's list of gangs until its whole gang fits; a failed task abandons the attempt,
 * stops the others and runs the whole stage again once they all ended. The rendezvous of the
 * tasks themselves is barrier.c's. Scheduler thread only.
 */
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"

static bool stage_gpu(const sched_stage *st) {
  const rdd_barrier_state *bs = st->barrier->state;
  return bs && bs->gpu;
}

/* Whether x can take barrier tasks: alive, not excluded, and for GPU work with a usable GPU. */
static bool gang_usable(const sched_executor *x, bool gpu, uint64_t now) {
  return !x->removed && !executors_excluded(x, now) && (!gpu || (x->gpu >= 0 && !x->no_device));
}

/* How many tasks of one gang can run at the same moment: each needs a core (a GPU gang: the
 * whole executor, one GPU) of its own; the local backend's threads, GPU or not. */
static uint32_t gang_capacity(scheduler *s, bool gpu) {
  if (s->backend->threads) return s->backend->threads;
  uint64_t now = common_now_ns();
  uint32_t n = 0;
  for (const sched_executor *x = s->executors; x; x = x->next)
    if (gang_usable(x, gpu, now)) n += gpu ? 1 : x->cores;
  return n;
}

/* Why live executors do not count in gang_capacity for GPU work (started with --gpu, but
 * with no usable device), in words into buf ("" when none). */
static void gang_shortfall(scheduler *s, bool gpu, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (const sched_executor *x = s->executors; gpu && x && used < len; x = x->next) {
    if (x->removed || x->gpu < 0 || !x->no_device) continue;
    int n = snprintf(buf + used, len - used, "%sexecutor %llu: --gpu %d but no usable device: %s", used ? "; " : "",
                     (unsigned long long)x->id, (int)x->gpu, x->no_device);
    if (n < 0) break;
    used += (size_t)n;
  }
}

/* Places all n tasks at once, each where it starts at once, or none (false). The local
 * backend's threads are its cores; executors are filled the least busy first. */
static bool gang_place(scheduler *s, sched_task *tasks, uint32_t n, bool gpu) {
  if (s->backend->threads) return (int64_t)s->backend->slots - s->free_slots + n <= s->backend->threads;
  uint64_t now = common_now_ns();
  uint32_t free_now = 0;
  for (const sched_executor *x = s->executors; x; x = x->next)
    if (gang_usable(x, gpu, now) && x->running < x->cores) free_now += gpu ? (x->running == 0) : x->cores - x->running;
  if (free_now < n) return false;
  /* Spread over executors in order; `running` is raised by each launch. */
  uint32_t i = 0;
  for (const sched_executor *x = s->executors; x && i < n; x = x->next) {
    if (!gang_usable(x, gpu, now) || x->running >= x->cores) continue;
    uint32_t take = gpu ? (x->running == 0) : x->cores - x->running;
    for (uint32_t k = 0; k < take && i < n; k++) tasks[i++].executor = x->id;
  }
  return i == n;
}

/* Fails the job of a gang the cluster cannot run at all (too few slots, or none with a
 * GPU); true when it did. */
static bool gang_impossible(scheduler *s, sched_stage *st) {
  bool gpu = stage_gpu(st);
  uint32_t cap = gang_capacity(s, gpu);
  if (cap >= st->num_tasks) return false;
  sched_job *job = st->tasks[0].job;
  char why[1024] = "";
  gang_shortfall(s, gpu, why, sizeof why);
  job_end_fail(s, job, FL_ESLOTS,
                           "job %llu: barrier stage of dataset %llu needs %u %s at once, but the cluster "
                           "has %u (%s%s%s)",
                           (unsigned long long)job->id, (unsigned long long)st->barrier->id, st->num_tasks,
                           gpu ? "GPU executors" : "task slots", cap,
                           gpu ? "executors started with --gpu" : "executors x cores, or local threads",
                           *why ? "; " : "", why);
  return true;
}

void gang_submit(scheduler *s, sched_stage *st) {
  if (gang_impossible(s, st)) return;
  sched_job *job = st->tasks[0].job;
  fl_status rs = barrier_stage_start(s->barriers, job->id, job->group, job->tag, st->id, st->barrier_attempt,
                                     st->num_tasks);
  if (rs != FL_OK) {
    job_end_fail(s, job, rs, "job %llu: %s", (unsigned long long)job->id, fl_last_error());
    return;
  }
  for (uint32_t i = 0; i < st->num_tasks; i++) {
    sched_task *t = &st->tasks[i];
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

bool gang_offer(scheduler *s) {
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
    if (s->free_slots < (int64_t)st->num_tasks || !gang_place(s, st->tasks, st->num_tasks, stage_gpu(st))) {
      p = &st->barrier_next;
      continue;
    }
    *p = st->barrier_next;
    st->barrier_running = st->num_tasks;
    for (uint32_t i = 0; i < st->num_tasks; i++) task_queue_launch(s, &st->tasks[i]);
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
    t->executor_lost = false;
  }
  char *cause = st->barrier_cause;
  st->barrier_cause = NULL;
  /* No usable device is no passing fault: where every task runs in this process (the local
   * backend) the next attempt would find none either. A cluster gives up the executor
   * instead (gang_shortfall says why), and the stage runs again on the others, or fails at
   * once when too few are left. */
  bool deterministic = st->barrier_cause_status == FL_ENODEVICE && s->backend->threads;
  if (st->barrier_failures >= s->max_attempts || deterministic) {
    job_end_fail(s, job, FL_EJOB,
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
  gang_submit(s, st);
}

/* Successes are held until every task of the attempt succeeded; a failure abandons the
 * attempt, stops the others and retries the whole stage once they all ended. */
task_outcome gang_task_ended(scheduler *s, sched_task *t) {
  sched_stage *st = t->stage;
  rdd_task *rt = &t->rt;
  st->barrier_running--;
  if (st->barrier_aborted) { /* this attempt is lost already */
    rdd_task_clear(rt);
    gang_maybe_retry(s, st);
    return TASK_OUTCOME_NONE;
  }
  if (rt->status == FL_OK) { /* held until every task of the attempt succeeded */
    if (++st->barrier_succeeded < st->num_tasks) return TASK_OUTCOME_NONE;
    /* Every task succeeded: commit them all, and the DAG scheduler takes them all. */
    uint32_t n = st->num_tasks;
    for (uint32_t i = 0; i < n; i++) {
      sched_task *x = &st->tasks[i];
      x->done = true;
      x->duration_ns = common_now_ns() - x->launched_ns;
      rdd_task_commit_accumulators(&x->rt);
      rdd_task_clear(&x->rt);
    }
    return (task_outcome){TASK_SUCCEEDED, st->tasks, n};
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
  return TASK_OUTCOME_NONE;
}
