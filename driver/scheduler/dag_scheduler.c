/*
 * dag_scheduler.c: jobs into stages into tasks, and what the tasks' ends mean for them.
 *
 * A job's result stage computes the job's partitions of its rdd. Walking the lineage from
 * there through narrow dependencies, every shuffle dependency whose map output is not all
 * registered in the map-output table becomes a map stage (found the same way from the
 * shuffle's parent), with tasks for its missing map partitions only. A stage is submitted
 * once its parents have finished; so a second action on a shuffled dataset, or a job over
 * a dataset whose partitions are all cached, runs no map stage again. Runs on the scheduler
 * thread only.
 */
#include <stdio.h>

#include "driver/scheduler/scheduler_internal.h"
#include "shuffle/shuffle.h"

static void init_task(sched_task *t, sched_job *job, sched_stage *stage, uint32_t index,
                      uint32_t partition) {
  t->job = job;
  t->stage = stage;
  t->index = index;
  t->rt.ctx = job->rdd->ctx;
  t->rt.job_id = job->id;
  t->rt.partition = partition;
  t->rt.cancelled = &job->cancelled;
}

static sched_stage *stage_new(sched_job *job, rdd *r, const rdd_shuffle_dep *dep) {
  sched_stage *st = common_calloc(1, sizeof *st);
  if (!st) return NULL;
  st->id = job->next_stage_id++;
  st->uid = job->sched->next_stage_uid++;
  st->job = job;
  st->rdd = r;
  st->dep = dep;
  st->next = job->stages;
  job->stages = st;
  return st;
}

static bool stage_add_parent(sched_stage *st, sched_stage *parent) {
  for (uint32_t i = 0; i < st->num_parents; i++)
    if (st->parents[i] == parent) return true;
  sched_stage **grown = common_realloc(st->parents, (st->num_parents + 1) * sizeof *grown);
  if (!grown) return false;
  st->parents = grown;
  st->parents[st->num_parents++] = parent;
  return true;
}

/* Whether every partition of r is in the cache (then nothing below it needs to run). */
static bool fully_cached(rdd *r) {
  if (atomic_load(&r->level) == FL_STORAGE_NONE) return false;
  fl_storage_info info = {0};
  r->ctx->cache->info(r->ctx->cache_impl, r->id, &info);
  return info.cached_partitions == r->num_partitions;
}

static fl_status add_missing_parents(scheduler *s, sched_job *job, sched_stage *stage, rdd *r);

typedef struct retired_tasks {
  sched_task *tasks;
  uint32_t count;
  struct retired_tasks *next;
} retired_tasks;

/* A map stage's tasks: one per map partition without output. Earlier tasks (a rerun) are
 * kept until the job ends, as a late attempt of them may still report. */
static fl_status make_map_tasks(sched_job *job, sched_stage *st) {
  const rdd_shuffle_dep *dep = st->dep;
  map_output_table *table = job->rdd->ctx->map_outputs;
  uint32_t maps = dep->parent->num_partitions, missing = 0;
  /* A barrier stage always runs whole: every rank takes part. */
  for (uint32_t m = 0; m < maps; m++) missing += st->barrier || !map_output_has(table, dep->shuffle_id, m);
  sched_task *tasks = common_calloc(missing ? missing : 1, sizeof *tasks);
  if (!tasks) return FL_ERR(FL_ENOMEM, "cannot allocate %u map tasks", missing);
  if (st->tasks) {
    retired_tasks *r = common_calloc(1, sizeof *r);
    if (!r) {
      common_free(tasks);
      return FL_ERR(FL_ENOMEM, "out of memory");
    }
    *r = (retired_tasks){st->tasks, st->num_tasks, st->retired};
    st->retired = r;
  }
  st->tasks = tasks;
  st->num_tasks = 0;
  for (uint32_t m = 0; m < maps; m++)
    if (st->barrier || !map_output_has(table, dep->shuffle_id, m)) {
      init_task(&st->tasks[st->num_tasks], job, st, st->num_tasks, m);
      st->num_tasks++;
    }
  st->remaining = st->num_tasks;
  return FL_OK;
}

/* The map stage of a shuffle within this job, made (with its own parents) when new. */
static fl_status map_stage_for(scheduler *s, sched_job *job, const rdd_shuffle_dep *dep,
                               sched_stage **out) {
  for (sched_stage *st = job->stages; st; st = st->next)
    if (st->dep == dep) {
      *out = st;
      return FL_OK;
    }
  sched_stage *st = stage_new(job, dep->parent, dep);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot allocate a stage");
  st->write = (rdd_action){.kind = RDD_ACTION_SHUFFLE_WRITE, .dep = dep};
  st->action = &st->write;
  st->barrier = rdd_barrier_find(dep->parent);
  fl_status made = make_map_tasks(job, st);
  if (made != FL_OK) return made;
  *out = st;
  return add_missing_parents(s, job, st, dep->parent);
}

/* Walks r's narrow lineage and makes the stage depend on the map stages of every shuffle
 * whose output is not complete. */
static fl_status add_missing_parents(scheduler *s, sched_job *job, sched_stage *stage, rdd *r) {
  rdd *stack[512];
  int top = 0;
  stack[top++] = r;
  while (top > 0) {
    rdd *cur = stack[--top];
    if (fully_cached(cur)) continue;
    for (uint32_t i = 0; i < cur->num_shuffle_deps; i++) {
      const rdd_shuffle_dep *dep = cur->shuffle_deps[i];
      if (dep->parent->num_partitions == 0 ||
          map_output_complete(cur->ctx->map_outputs, dep->shuffle_id))
        continue;
      sched_stage *parent = NULL;
      fl_status st = map_stage_for(s, job, dep, &parent);
      if (st != FL_OK) return st;
      if (!stage_add_parent(stage, parent)) return FL_ERR(FL_ENOMEM, "cannot link stages");
    }
    for (uint32_t i = 0; i < cur->num_parents; i++) {
      if (top == 512) return FL_ERR(FL_ELIMIT, "lineage wider than 512 datasets at one level");
      stack[top++] = cur->parents[i];
    }
  }
  return FL_OK;
}

/* Submits the stage's tasks when its parents are done; else submits the parents. */
static void submit_stage(scheduler *s, sched_job *job, sched_stage *st) {
  if (st->submitted) return;
  bool ready = true;
  for (uint32_t i = 0; i < st->num_parents; i++)
    if (!st->parents[i]->finished) {
      ready = false;
      submit_stage(s, job, st->parents[i]);
    }
  if (!ready) return;
  st->submitted = true;
  notes_stage_submitted(s, st);
  if (common_log_enabled(sched_event_level(s)))
    common_log(sched_event_level(s), "job %llu: stage %u (%s of dataset %llu%s) starts: %u tasks",
               (unsigned long long)job->id, st->id, st->dep ? "shuffle map" : "result", (unsigned long long)st->rdd->id,
               st->barrier ? ", barrier" : "", st->num_tasks);
  if (st->num_tasks == 0) {
    st->finished = true;
    common_log(sched_event_level(s), "job %llu: stage %u ends: nothing to run", (unsigned long long)job->id, st->id);
    notes_stage_completed(s, st, FL_OK, NULL);
    return;
  }
  if (st->barrier) gang_submit(s, st);
  else task_queue_submit(s, st->tasks, st->num_tasks);
}

/* After a stage finished: submit the stages that were waiting for it. */
static bool parents_finished(const sched_stage *st) {
  for (uint32_t i = 0; i < st->num_parents; i++)
    if (!st->parents[i]->finished) return false;
  return true;
}

static void submit_waiting(scheduler *s, sched_job *job) {
  for (sched_stage *st = job->stages; st; st = st->next) {
    if (!st->submitted) {
      submit_stage(s, job, st);
    } else if (st->parked && parents_finished(st)) { /* the lost map output is back */
      while (st->parked) {
        sched_task *t = st->parked;
        st->parked = t->pending_next;
        task_queue_submit(s, t, 1);
      }
    }
  }
}

/* How long the rerun of lost map output waits, so that the fetch failures of one lost
 * executor (and its loss itself) are handled in one go; Spark waits 200 ms too. */
#define DAG_RESUBMIT_DELAY_NS 200000000u
/* Times a map stage's output may be lost and computed again within one job. */
#define DAG_MAX_STAGE_ATTEMPTS 4

/* A task failed to read map output: the output is marked lost, and the task waits (parked)
 * until its map task ran again. */
static void fetch_failed(scheduler *s, sched_task *task) {
  sched_job *job = task->job;
  rdd_task *rt = &task->rt;
  map_output_unregister(job->rdd->ctx->map_outputs, rt->fetch_shuffle_id, rt->fetch_map);
  if (s->backend->ops->fetch_failed) s->backend->ops->fetch_failed(s->backend, task);
  common_log(LOG_WARN, "job %llu: partition %u of dataset %llu could not read map %u of shuffle %llu "
             "(%s); that map task runs again", (unsigned long long)job->id, rt->partition,
             (unsigned long long)task->stage->rdd->id, rt->fetch_map,
             (unsigned long long)rt->fetch_shuffle_id, rt->error ? rt->error : "");
  rdd_task_clear(rt);
  task->pending_next = task->stage->parked;
  task->stage->parked = task;
  if (!s->resubmit_at_ns) s->resubmit_at_ns = common_now_ns() + DAG_RESUBMIT_DELAY_NS;
}

/* Reruns, in one job, the lost outputs that its unfinished stages need. */
static void resubmit_job(scheduler *s, sched_job *job) {
  fl_status st = FL_OK;
  /* Stages waiting on lost output depend on the map stages that make it (new ones when the
   * output came from an earlier job). */
  for (sched_stage *x = job->stages; x && st == FL_OK; x = x->next)
    if (x->parked) st = add_missing_parents(s, job, x, x->rdd);
  /* A finished map stage that an unfinished stage reads, with output lost: run its missing
   * tasks again; until nothing changes, as rerunning it may need its own parents again. */
  for (bool changed = true; changed && st == FL_OK;) {
    changed = false;
    for (sched_stage *x = job->stages; x && st == FL_OK; x = x->next) {
      if (x->finished) continue;
      for (uint32_t i = 0; i < x->num_parents && st == FL_OK; i++) {
        sched_stage *p = x->parents[i];
        if (!p->finished || map_output_complete(job->rdd->ctx->map_outputs, p->dep->shuffle_id)) continue;
        if (++p->attempts >= DAG_MAX_STAGE_ATTEMPTS) {
          job_end_fail(s, job, FL_EFETCH,
                                   "job %llu failed: the output of shuffle %llu was lost %u times "
                                   "(executors lost or map output unreadable)",
                                   (unsigned long long)job->id, (unsigned long long)p->dep->shuffle_id,
                                   p->attempts);
          return;
        }
        if ((st = make_map_tasks(job, p)) != FL_OK) break;
        p->finished = p->submitted = false;
        changed = true;
      }
    }
  }
  if (st != FL_OK) {
    job_end_fail(s, job, st, "job %llu: %s", (unsigned long long)job->id, fl_last_error());
    return;
  }
  submit_waiting(s, job);
}

void dag_scheduler_resubmit(scheduler *s) {
  s->resubmit_at_ns = 0;
  sched_job *job = s->active;
  while (job) {
    sched_job *next = job->active_next; /* failing may finish (and free) the job */
    if (job->status == FL_OK) resubmit_job(s, job);
    job = next;
  }
}

void dag_scheduler_job_submitted(scheduler *s, sched_job *job) {
  atomic_fetch_add(&s->jobs_run, 1);
  job->submitted_ns = common_now_ns();
  if (common_log_enabled(sched_event_level(s)))
    common_log(sched_event_level(s), "job %llu: starts: %u partitions of dataset %llu", (unsigned long long)job->id,
               job->num_parts, (unsigned long long)job->rdd->id);
  job->active_prev = NULL;
  job->active_next = s->active;
  if (s->active) s->active->active_prev = job;
  s->active = job;
  sched_stage *result = stage_new(job, job->rdd, NULL);
  if (!result) {
    job_end_fail(s, job, FL_ENOMEM, "job %llu: cannot allocate its stages", (unsigned long long)job->id);
    return;
  }
  result->action = job->action;
  result->tasks = job->tasks;
  result->num_tasks = job->num_parts;
  for (uint32_t i = 0; i < job->num_parts; i++) init_task(&job->tasks[i], job, result, i, job->parts[i]);
  job->remaining = job->num_parts;
  if ((result->barrier = rdd_barrier_find(job->rdd))) {
    bool whole = job->num_parts == job->rdd->num_partitions;
    for (uint32_t i = 0; whole && i < job->num_parts; i++) whole = job->parts[i] == i;
    if (!whole) {
      job_end_fail(s, job, FL_EINVAL,
                               "job %llu: a job over barrier dataset %llu must compute all its %u partitions, "
                               "in order (it asked for %u)",
                               (unsigned long long)job->id, (unsigned long long)result->barrier->id,
                               job->rdd->num_partitions, job->num_parts);
      return;
    }
  }
  fl_status st = add_missing_parents(s, job, result, job->rdd);
  if (st != FL_OK) {
    job_end_fail(s, job, st, "job %llu: %s", (unsigned long long)job->id, fl_last_error());
    return;
  }
  notes_job_started(s, job);
  submit_stage(s, job, result);
  /* Stages with nothing to run finish at once; their children may be ready now. */
  submit_waiting(s, job);
}

/* A map task's output is registered (a stage that finished lets the stages waiting for it
 * go); a result task's result goes to the job, which may finish. */
static void task_succeeded(scheduler *s, sched_task *task) {
  sched_job *job = task->job;
  sched_stage *st = task->stage;
  if (st->dep) {
    fl_status rs = map_output_register(job->rdd->ctx->map_outputs, st->dep->shuffle_id,
                                       st->dep->parent->num_partitions, task->rt.partition,
                                       fl_buf_bytes(&task->result));
    if (rs != FL_OK) {
      job_end_fail(s, job, rs, "job %llu: %s", (unsigned long long)job->id, fl_last_error());
      return;
    }
    if (--st->remaining == 0) {
      st->finished = true;
      common_log(sched_event_level(s), "job %llu: stage %u ends: %u tasks done", (unsigned long long)job->id, st->id,
                 st->num_tasks);
      notes_stage_completed(s, st, FL_OK, NULL);
      /* Output lost while the stage ran (its executor went): those maps run again first. */
      if (!map_output_complete(job->rdd->ctx->map_outputs, st->dep->shuffle_id)) {
        if (!s->resubmit_at_ns) s->resubmit_at_ns = common_now_ns() + DAG_RESUBMIT_DELAY_NS;
        return;
      }
      submit_waiting(s, job);
    }
    return;
  }
  fl_buf t = job->results[task->index];
  job->results[task->index] = task->result;
  task->result = t;
  if (--job->remaining == 0) {
    common_log(sched_event_level(s), "job %llu: stage %u ends: %u tasks done", (unsigned long long)job->id, st->id,
               st->num_tasks);
    st->finished = true;
    notes_stage_completed(s, st, FL_OK, NULL);
  }
  job_end_maybe_finish(s, job);
}

void dag_scheduler_free_stages(sched_job *job) {
  sched_stage *st = job->stages;
  while (st) {
    sched_stage *next = st->next;
    if (st->dep) {
      for (uint32_t i = 0; i < st->num_tasks; i++) {
        fl_buf_free(&st->tasks[i].result);
        rdd_task_clear(&st->tasks[i].rt);
      }
      common_free(st->tasks);
    }
    while (st->retired) {
      retired_tasks *r = st->retired;
      st->retired = r->next;
      for (uint32_t i = 0; i < r->count; i++) {
        fl_buf_free(&r->tasks[i].result);
        rdd_task_clear(&r->tasks[i].rt);
      }
      common_free(r->tasks);
      common_free(r);
    }
    common_free(st->parents);
    common_free(st->barrier_cause);
    common_free(st);
    st = next;
  }
  job->stages = NULL;
}

void dag_scheduler_task_ended(scheduler *s, task_outcome outcome) {
  /* The last success may finish the job: it stays until the event is through. */
  for (uint32_t i = 0; outcome.kind == TASK_SUCCEEDED && i < outcome.count; i++)
    task_succeeded(s, &outcome.tasks[i]);
  if (outcome.kind == TASK_FETCH_FAILED) fetch_failed(s, outcome.tasks);
}
