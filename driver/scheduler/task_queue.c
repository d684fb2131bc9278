/*
 * task_queue.c: tasks waiting for a slot, and taking one. The pending tasks are a FIFO
 * (task_scheduler.c offers them in order); barrier stages wait as whole gangs on a list of
 * their own (gang.c). Launching an attempt takes a slot, of its executor too, and hands it to
 * the backend. Scheduler thread only.
 */
#include "driver/scheduler/scheduler_internal.h"

void task_queue_push(scheduler *s, sched_task *t) {
  t->pending_next = NULL;
  t->pending_since_ns = common_now_ns();
  if (s->pending_tail) s->pending_tail->pending_next = t; else s->pending_head = t;
  s->pending_tail = t;
}

void task_queue_submit(scheduler *s, sched_task *tasks, uint32_t count) {
  for (uint32_t i = 0; i < count; i++) task_queue_push(s, &tasks[i]);
}

void task_queue_launch(scheduler *s, sched_task *t) {
  s->free_slots--;
  t->job->running++;
  t->rt.attempt++;
  t->running = true;
  t->launched_ns = common_now_ns();
  t->task_id = s->next_task_id++;
  if (t->executor) {
    sched_executor *x = executors_find(s, t->executor);
    if (x) x->running++;
  }
  atomic_fetch_add(&s->tasks_run, 1);
  /* "%.0llu" prints no digit for 0: the local backend's threads have no executor id. */
  if (common_log_enabled(LOG_DEBUG))
    common_log(LOG_DEBUG, "job %llu: stage %u: task %u (partition %u, attempt %u%s) starts%s%.0llu",
               (unsigned long long)t->job->id, t->stage->id, t->index, t->rt.partition, t->rt.attempt,
               t->original ? ", a backup" : "", t->executor ? " on executor " : "", (unsigned long long)t->executor);
  notes_task_started(s, t);
  s->backend->ops->launch(s->backend, t);
}

void task_queue_drop_job(scheduler *s, sched_job *job) {
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

/* ---- what an attempt runs (for backends) ----------------------------------------------------- */

rdd *sched_task_rdd(const sched_task *task) { return task->stage->rdd; }
const rdd_shuffle_dep *sched_task_shuffle_dep(const sched_task *task) { return task->stage->dep; }
const rdd_action *sched_task_action(const sched_task *task) { return task->stage->action; }
uint32_t sched_task_stage(const sched_task *task) { return task->stage->id; }
