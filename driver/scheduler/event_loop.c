/*
 * event_loop.c: the scheduler's event loop and its entry points (scheduler.h): jobs in (run,
 * submit, cancel) and out (handed back to their callers once an event is through), task
 * ends and calls from other threads, and the timers (locality waits, lost output to run
 * again, slow tasks, callers gone away). The loop's thread runs everything of the scheduler;
 * the entry points only queue events, but for scheduler_run_job, which then waits for its job.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "driver/scheduler/scheduler_internal.h"

typedef struct sched_call {
  sched_event base;
  void (*fn)(scheduler *, void *);
  void *arg;
} sched_call;

fl_status scheduler_post_call(scheduler *s, void (*fn)(scheduler *, void *), void *arg) {
  sched_call *call = common_calloc(1, sizeof *call);
  if (!call) return FL_ERR(FL_ENOMEM, "out of memory");
  call->base.type = EV_CALL;
  call->fn = fn;
  call->arg = arg;
  common_queue_push(&s->events, &call->base.node);
  return FL_OK;
}

typedef struct cancel_args {
  uint64_t group, tag;
} cancel_args;

static void cancel_on_loop(scheduler *s, void *arg) {
  cancel_args *c = arg;
  sched_job *job = s->active;
  while (job) {
    /* Failing a job may finish it, and its caller then frees it: step first. */
    sched_job *next = job->active_next;
    if (job->group == c->group && (c->tag == 0 || job->tag == c->tag))
      job_end_fail(s, job, FL_ECANCELLED, "job %llu cancelled", (unsigned long long)job->id);
    job = next;
  }
  common_free(c);
}

fl_status scheduler_cancel(scheduler *s, uint64_t group, uint64_t tag) {
  cancel_args *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "out of memory");
  c->group = group;
  c->tag = tag;
  fl_status st = scheduler_post_call(s, cancel_on_loop, c);
  if (st != FL_OK) common_free(c);
  return st;
}

/* How often running stages are checked for slow tasks, when speculation is on. */
#define SPECULATION_PERIOD_NS 100000000u
/* How often a job whose caller may go away checks for that. */
#define ABANDON_POLL_NS 20000000u
/* How often the caller of a job with barrier reports to deliver looks for them. */
#define REPORT_POLL_NS 10000000u

static void check_abandoned(scheduler *s, uint64_t now);
static void complete_ended(scheduler *s);

void scheduler_set_speculation(scheduler *s, const sched_speculation *spec) { s->speculation = *spec; }

void scheduler_set_listener(scheduler *s, void (*fn)(void *arg, const sched_note *note), void *arg) {
  s->listener = fn;
  s->listener_arg = arg;
}

/* Timed work due now: lost map output to run again, a look for slow tasks. */
static void run_timers(scheduler *s) {
  uint64_t now = common_now_ns();
  if (s->resubmit_at_ns && s->resubmit_at_ns <= now) dag_scheduler_resubmit(s);
  if (s->speculate_at_ns && s->speculate_at_ns <= now) {
    s->speculate_at_ns = 0;
    speculation_check_slow(s);
  }
  if (s->speculation.enabled && s->active && !s->speculate_at_ns) s->speculate_at_ns = now + SPECULATION_PERIOD_NS;
  if (s->abandon_check_at_ns && s->abandon_check_at_ns <= now) check_abandoned(s, now);
}

static void *scheduler_main(void *p) {
  pthread_setname_np(pthread_self(), "fl-scheduler");
  scheduler *s = p;
  uint64_t spin = fl_spin_ns();
  for (;;) {
    sched_event *ev;
    uint64_t wake = s->retry_at_ns;
    if (s->resubmit_at_ns && (!wake || s->resubmit_at_ns < wake)) wake = s->resubmit_at_ns;
    if (s->speculate_at_ns && (!wake || s->speculate_at_ns < wake)) wake = s->speculate_at_ns;
    if (s->abandon_check_at_ns && (!wake || s->abandon_check_at_ns < wake)) wake = s->abandon_check_at_ns;
    if (wake) {
      ev = (sched_event *)common_queue_pop_until(&s->events, spin, wake);
      if (!ev) { /* a locality wait ended, or a timer's work was due */
        run_timers(s);
        task_scheduler_offer(s);
        complete_ended(s);
        continue;
      }
    } else if (!(ev = (sched_event *)common_queue_pop(&s->events, spin))) {
      return NULL;
    }
    switch (ev->type) {
    case EV_JOB_SUBMITTED: {
      sched_job *job = (sched_job *)ev;
      COMMON_TRACE("job.start", NULL);
      if (job->done_fn && job->abandoned && !s->abandon_check_at_ns)
        s->abandon_check_at_ns = common_now_ns() + ABANDON_POLL_NS;
      dag_scheduler_job_submitted(s, job);
      break;
    }
    case EV_TASK_ENDED:
      dag_scheduler_task_ended(s, task_scheduler_task_ended(s, (sched_task *)ev));
      break;
    case EV_CALL: {
      sched_call *call = (sched_call *)ev;
      call->fn(s, call->arg);
      common_free(call);
      break;
    }
    case EV_STOP:
      return NULL;
    }
    run_timers(s);
    task_scheduler_offer(s);
    complete_ended(s);
  }
}

fl_status scheduler_create(uint32_t max_attempts, scheduler **out) {
  scheduler *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "cannot allocate the scheduler");
  if (barrier_table_create(&s->barriers) != FL_OK) {
    common_free(s);
    return FL_ERR(FL_ENOMEM, "cannot allocate the scheduler");
  }
  common_queue_init(&s->events);
  s->max_attempts = max_attempts;
  atomic_init(&s->next_job_id, 1);
  if (pthread_create(&s->thread, NULL, scheduler_main, s) != 0) {
    common_queue_destroy(&s->events);
    barrier_table_destroy(s->barriers);
    common_free(s);
    return FL_ERR(FL_ENOMEM, "cannot start the scheduler thread");
  }
  *out = s;
  return FL_OK;
}

void scheduler_set_backend(scheduler *s, backend *b) {
  /* Set before any job runs, so the loop thread sees it through the queue's lock. */
  s->backend = b;
  s->free_slots = (int64_t)b->slots;
}

void scheduler_destroy(scheduler *s) {
  if (!s) return;
  sched_event stop = {.type = EV_STOP};
  common_queue_push(&s->events, &stop.node);
  pthread_join(s->thread, NULL);
  if (s->backend) s->backend->ops->destroy(s->backend);
  /* Calls the backend's threads posted while it stopped, never run: freed. */
  sched_event *ev;
  while ((ev = (sched_event *)common_queue_pop_until(&s->events, 0, common_now_ns())))
    if (ev->type == EV_CALL) common_free(ev);
  common_queue_destroy(&s->events);
  barrier_table_destroy(s->barriers);
  while (s->executors) {
    sched_executor *x = s->executors;
    s->executors = x->next;
    common_free(x->no_device);
    common_free(x);
  }
  common_free(s);
}

void scheduler_post_task_end(scheduler *s, sched_task *task) { scheduler_post_task_ends(s, &task, 1); }

void scheduler_post_task_ends(scheduler *s, sched_task **tasks, size_t n) {
  for (size_t i = 0; i < n; i++) {
    tasks[i]->ended.type = EV_TASK_ENDED;
    if (i + 1 < n) tasks[i]->ended.node.next = &tasks[i + 1]->ended.node;
  }
  if (n) common_queue_push_chain(&s->events, &tasks[0]->ended.node, &tasks[n - 1]->ended.node, n);
}

static void deliver_batch(rdd_batch *b, void (*on_report)(void *, uint64_t, uint32_t, fl_bytes), void *arg) {
  rdd_cursor c = {b->buf.data, b->buf.data + b->buf.len};
  fl_bytes rec, msg;
  uint64_t rdd_id;
  uint32_t rank;
  while (rdd_cursor_next(&c, &rec))
    if (barrier_report_split(rec, &rdd_id, &rank, &msg)) on_report(arg, rdd_id, rank, msg);
}

static void deliver_reports(scheduler *s, sched_job *job) {
  rdd_batch b = {FL_BUF_INIT, 0};
  barrier_take_reports(s->barriers, job->id, &b);
  if (b.count) deliver_batch(&b, job->on_report, job->report_arg);
  rdd_batch_free(&b);
}

static fl_status check_parts(const rdd *r, const uint32_t *parts, uint32_t num_parts) {
  for (uint32_t i = 0; i < num_parts; i++)
    if (parts[i] >= r->num_partitions)
      return FL_ERR(FL_EINVAL, "partition %u of a dataset with %u partitions", parts[i], r->num_partitions);
  return FL_OK;
}

/* A job to submit, or NULL (out of memory, the thread's error set). */
static sched_job *job_new(scheduler *s, rdd *r, const uint32_t *parts, uint32_t num_parts,
                          const rdd_action *action, const sched_job_opts *opts, fl_buf *results) {
  sched_job *job = common_calloc(1, sizeof *job);
  if (job) job->tasks = common_calloc(num_parts, sizeof *job->tasks);
  if (!job || !job->tasks) {
    common_free(job);
    FL_ERR(FL_ENOMEM, "cannot allocate %u tasks", num_parts);
    return NULL;
  }
  job->submitted.type = EV_JOB_SUBMITTED;
  job->sched = s;
  job->id = atomic_fetch_add(&s->next_job_id, 1);
  job->rdd = r;
  job->action = action;
  job->parts = parts;
  job->num_parts = num_parts;
  job->results = results;
  if (opts) {
    job->group = opts->group;
    job->tag = opts->tag;
    job->stats_out = opts->stats;
    job->reports_left = opts->reports_left;
    job->on_report = opts->on_report;
    job->report_arg = opts->report_arg;
    job->abandoned = opts->abandoned;
  }
  atomic_init(&job->cancelled, false);
  common_event_init(&job->done);
  rdd_retain(r); /* the lineage must outlive every attempt, even a cancelled one */
  return job;
}

/* After the job ended (any thread): reports left and stats to where the caller asked, then
 * frees it. Returns its status, the thread's message set when it failed. */
static fl_status job_close(scheduler *s, sched_job *job) {
  rdd_batch left = {FL_BUF_INIT, 0};
  barrier_job_close(s->barriers, job->id, &left);
  if (job->on_report) {
    deliver_batch(&left, job->on_report, job->report_arg);
  } else if (job->reports_left && left.count) {
    if (fl_buf_append(&job->reports_left->buf, left.buf.data, left.buf.len) == FL_OK)
      job->reports_left->count += left.count;
  }
  rdd_batch_free(&left);
  if (job->stats_out) *job->stats_out = job->stats;
  fl_status status = job->status;
  if (status != FL_OK) fl_set_error(status, "%s", job->error ? job->error : fl_strerror(status));
  for (uint32_t i = 0; i < job->num_parts; i++) fl_buf_free(&job->tasks[i].result);
  common_free(job->tasks);
  while (job->copies) {
    sched_task *b = job->copies;
    job->copies = b->next_copy;
    fl_buf_free(&b->result);
    rdd_task_clear(&b->rt);
    common_free(b);
  }
  dag_scheduler_free_stages(job);
  common_free(job->error);
  common_event_destroy(&job->done);
  rdd_release(job->rdd);
  common_free(job);
  return status;
}

/* On the scheduler thread, once an event is through: the jobs that ended go back to their
 * callers (an asynchronous job's callback, or scheduler_run_job's waiting thread, which then
 * owns and frees the job: the scheduler must not touch it after). */
static void complete_ended(scheduler *s) {
  while (s->ended) {
    sched_job *job = s->ended;
    s->ended = job->ended_next;
    if (!job->done_fn) {
      common_event_set(&job->done);
      continue;
    }
    sched_job_done_fn done = job->done_fn;
    void *arg = job->done_arg;
    fl_status status = job_close(s, job);
    done(arg, status, status == FL_OK ? NULL : fl_last_error());
  }
}

/* On the scheduler thread: asynchronous jobs whose caller went away are cancelled (as
 * scheduler_run_job's caller does for its own). */
static void check_abandoned(scheduler *s, uint64_t now) {
  bool watching = false;
  for (sched_job *job = s->active, *next; job; job = next) {
    next = job->active_next; /* failing a job may finish it */
    if (!job->done_fn || !job->abandoned || job->cancel_sent) continue;
    if (atomic_load(job->abandoned)) {
      job->cancel_sent = true;
      job_end_fail(s, job, FL_ECANCELLED, "job %llu cancelled: its caller went away",
                               (unsigned long long)job->id);
    } else {
      watching = true;
    }
  }
  s->abandon_check_at_ns = watching ? now + ABANDON_POLL_NS : 0;
}

fl_status scheduler_submit_job(scheduler *s, rdd *r, const uint32_t *parts, uint32_t num_parts,
                               const rdd_action *action, const sched_job_opts *opts, fl_buf *results,
                               sched_job_done_fn done, void *done_arg) {
  FL_ASSERT(done && (!opts || !opts->on_report));
  fl_status st = check_parts(r, parts, num_parts);
  if (st != FL_OK) return st;
  if (num_parts == 0) {
    if (opts && opts->stats) *opts->stats = (sched_job_stats){0};
    done(done_arg, FL_OK, NULL);
    return FL_OK;
  }
  sched_job *job = job_new(s, r, parts, num_parts, action, opts, results);
  if (!job) return FL_ENOMEM;
  job->done_fn = done;
  job->done_arg = done_arg;
  common_queue_push(&s->events, &job->submitted.node);
  return FL_OK;
}

fl_status scheduler_run_job(scheduler *s, rdd *r, const uint32_t *parts, uint32_t num_parts,
                            const rdd_action *action, const sched_job_opts *opts, fl_buf *results) {
  if (num_parts == 0) return FL_OK;
  fl_status st = check_parts(r, parts, num_parts);
  if (st != FL_OK) return st;
  sched_job *job = job_new(s, r, parts, num_parts, action, opts, results);
  if (!job) return FL_ENOMEM;
  common_queue_push(&s->events, &job->submitted.node);
  if (opts && opts->on_report) {
    bool cancel_sent = false;
    for (bool done = false; !done;) {
      done = common_event_wait_until(&job->done, common_now_ns() + REPORT_POLL_NS);
      deliver_reports(s, job);
      if (!done && !cancel_sent && opts->abandoned && atomic_load(opts->abandoned) &&
          scheduler_cancel(s, job->group, job->tag) == FL_OK)
        cancel_sent = true;
    }
  } else if (opts && opts->abandoned) {
    bool cancel_sent = false;
    while (!common_event_wait_until(&job->done, common_now_ns() + ABANDON_POLL_NS))
      if (!cancel_sent && atomic_load(opts->abandoned) && scheduler_cancel(s, job->group, job->tag) == FL_OK)
        cancel_sent = true;
  } else {
    common_event_wait(&job->done, fl_spin_ns());
  }
  return job_close(s, job);
}

void scheduler_stats_get(scheduler *s, scheduler_stats *out) {
  out->jobs_run = atomic_load(&s->jobs_run);
  out->jobs_failed = atomic_load(&s->jobs_failed);
  out->tasks_run = atomic_load(&s->tasks_run);
  out->tasks_failed = atomic_load(&s->tasks_failed);
  out->tasks_speculated = atomic_load(&s->tasks_speculated);
  out->task_ns = atomic_load(&s->task_ns);
  out->input_bytes = atomic_load(&s->input_bytes);
  out->shuffle_read_bytes = atomic_load(&s->shuffle_read_bytes);
  out->shuffle_write_bytes = atomic_load(&s->shuffle_write_bytes);
}

barrier_table *scheduler_barriers(scheduler *s) { return s->barriers; }

void scheduler_each_job(scheduler *s, void (*fn)(void *arg, uint64_t job, uint64_t submitted_ns), void *arg) {
  for (sched_job *job = s->active, *next; job; job = next) {
    next = job->active_next; /* failing a job may finish it */
    if (job->status == FL_OK) fn(arg, job->id, job->submitted_ns);
  }
}

void scheduler_fail_job(scheduler *s, uint64_t id, fl_status status, const char *fmt, ...) {
  sched_job *job = s->active;
  while (job && job->id != id) job = job->active_next;
  if (!job) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  job_end_fail(s, job, status, "%s", msg);
}
