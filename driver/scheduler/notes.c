/*
 * notes.c: the listener's notes (scheduler.h, scheduler_set_listener): jobs, stages and task
 * attempts starting and ending, as the web UI, the event log and progress bars read them.
 * Each function builds a note from the scheduler's own records and calls the listener; with
 * none set, each returns at once. Scheduler thread only.
 */
#include "driver/scheduler/scheduler_internal.h"

/* Most datasets of a stage's narrow lineage that a job's start describes. */
#define NOTES_MAX_RDDS 32

static void emit(scheduler *s, sched_note *n) { s->listener(s->listener_arg, n); }

/* The stage's narrow lineage, its own dataset first (depth first, each once). */
static uint32_t stage_rdds(const sched_stage *st, const rdd **out) {
  uint32_t n = 0;
  const rdd *stack[NOTES_MAX_RDDS];
  uint32_t top = 0;
  stack[top++] = st->rdd;
  while (top > 0 && n < NOTES_MAX_RDDS) {
    const rdd *r = stack[--top];
    bool seen = false;
    for (uint32_t i = 0; i < n && !seen; i++) seen = out[i] == r;
    if (seen) continue;
    out[n++] = r;
    for (uint32_t i = r->num_parents; i-- > 0 && top < NOTES_MAX_RDDS;) stack[top++] = r->parents[i];
  }
  return n;
}

static const char *action_name(const rdd_action *a) {
  switch (a->kind) {
  case RDD_ACTION_COUNT: return "count";
  case RDD_ACTION_COLLECT: return "collect";
  case RDD_ACTION_AGGREGATE: return "aggregate";
  case RDD_ACTION_FOREACH: return "foreach";
  case RDD_ACTION_SAVE_TEXT: return "save_text";
  case RDD_ACTION_CHECKPOINT: return "checkpoint";
  case RDD_ACTION_SHUFFLE_WRITE: return "shuffle map";
  }
  return "action";
}

void notes_job_started(scheduler *s, const sched_job *job) {
  if (!s->listener) return;
  uint32_t count = 0;
  for (const sched_stage *st = job->stages; st; st = st->next) count++;
  sched_stage_desc *descs = common_calloc(count ? count : 1, sizeof *descs);
  const rdd **rdds = common_calloc((size_t)(count ? count : 1) * NOTES_MAX_RDDS, sizeof *rdds);
  uint32_t *parents = NULL;
  uint32_t num_parents = 0;
  for (const sched_stage *st = job->stages; st; st = st->next) num_parents += st->num_parents;
  parents = common_calloc(num_parents ? num_parents : 1, sizeof *parents);
  if (!descs || !rdds || !parents) {
    common_log(LOG_WARN, "job %llu: out of memory describing its stages to the UI", (unsigned long long)job->id);
    count = 0;
  }
  /* job->stages is newest first; the result stage was made first: describe it first. */
  uint32_t i = count, p = 0;
  for (const sched_stage *st = job->stages; st && count; st = st->next) {
    sched_stage_desc *d = &descs[--i];
    d->id = st->uid;
    d->num_tasks = st->num_tasks;
    d->name = action_name(st->action);
    d->rdds = &rdds[(size_t)i * NOTES_MAX_RDDS];
    d->num_rdds = stage_rdds(st, (const rdd **)d->rdds);
    d->parents = &parents[p];
    d->num_parents = st->num_parents;
    for (uint32_t k = 0; k < st->num_parents; k++) parents[p++] = st->parents[k]->uid;
  }
  sched_note n = {.kind = SCHED_JOB_STARTED, .job = job->id, .group = job->group, .stages = descs,
                  .num_stages = count};
  emit(s, &n);
  common_free(descs);
  common_free(rdds);
  common_free(parents);
}

void notes_job_ended(scheduler *s, const sched_job *job) {
  if (!s->listener) return;
  /* Stages cut short by the job's failure end with it. */
  for (const sched_stage *st = job->stages; st; st = st->next)
    if (st->submitted && !st->finished) notes_stage_completed(s, st, job->status, job->error);
  sched_note n = {.kind = SCHED_JOB_ENDED, .job = job->id, .group = job->group, .status = job->status,
                  .error = job->error};
  emit(s, &n);
}

void notes_stage_submitted(scheduler *s, const sched_stage *st) {
  if (!s->listener) return;
  const sched_job *job = st->job;
  sched_note n = {.kind = SCHED_STAGE_SUBMITTED, .job = job->id, .group = job->group, .stage = st->uid,
                  .stage_attempt = st->attempts, .num_tasks = st->num_tasks};
  emit(s, &n);
}

void notes_stage_completed(scheduler *s, const sched_stage *st, fl_status status, const char *error) {
  if (!s->listener) return;
  const sched_job *job = st->job;
  sched_note n = {.kind = SCHED_STAGE_COMPLETED, .job = job->id, .group = job->group, .stage = st->uid,
                  .stage_attempt = st->attempts, .num_tasks = st->num_tasks, .status = status, .error = error};
  emit(s, &n);
}

static void task_note(sched_note *n, const sched_task *t) {
  n->job = t->job->id;
  n->group = t->job->group;
  n->stage = t->stage->uid;
  n->stage_attempt = t->stage->attempts;
  n->index = t->index;
  n->attempt = t->rt.attempt;
  n->task_id = t->task_id;
  n->executor = t->executor;
  n->locality = t->locality;
  n->speculative = t->original != NULL;
}

void notes_task_started(scheduler *s, const sched_task *t) {
  if (!s->listener) return;
  sched_note n = {.kind = SCHED_TASK_STARTED};
  task_note(&n, t);
  emit(s, &n);
}

void notes_task_ended(scheduler *s, const sched_task *t, uint64_t ran) {
  if (!s->listener) return;
  sched_note n = {.kind = SCHED_TASK_ENDED};
  task_note(&n, t);
  if (ran) n.executor = ran;
  n.duration_ns = common_now_ns() - t->launched_ns;
  n.run_ns = t->rt.run_ns;
  n.input_bytes = t->rt.input_bytes;
  n.shuffle_read_bytes = t->rt.shuffle_read_bytes;
  n.shuffle_write_bytes = t->rt.shuffle_write_bytes;
  n.status = t->rt.status;
  n.error = t->rt.error;
  emit(s, &n);
}
