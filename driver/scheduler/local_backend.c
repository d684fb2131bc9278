/*
 * local_backend.c: the in-process executor backend: tasks run on a pool of threads of this
 * process, against the context's own block manager. Nothing is placed: the pool's threads
 * are the backend's (backend.threads), and a barrier stage's gang fits when as many threads
 * are idle (gang.c). launch runs on the scheduler thread; the attempts on the pool's, which
 * post their ends.
 *
 * With contain_task_crashes (fl_options), each attempt runs behind common_crash_guard_run: a
 * SIGSEGV, SIGBUS, SIGFPE or SIGILL on its thread fails the attempt, naming the signal, the
 * user function and the partition, instead of ending the process. The job then fails at once
 * (no retry: user code would crash again). What the task held stays as the crash left it.
 */
#include <signal.h>
#include <string.h>

#include "driver/scheduler/scheduler.h"
#include "executor/executor.h"

/* The backend offers this many slots per thread: tasks beyond the threads wait in the
 * pool's queue, so a thread that finishes a task starts the next at once instead of
 * waiting for a round trip through the scheduler thread (two hand-offs per task, which
 * dominated the latency of short jobs). Queued attempts of a failed job end at once. */
#define LOCAL_SLOTS_PER_THREAD 8

typedef struct local_backend {
  backend base;
  task_pool *pool;
  bool contain_crashes;
} local_backend;

/* One attempt in the pool's queue. */
typedef struct local_work {
  task_pool_work work; /* first: the pool hands this back */
  backend *b;
  sched_task *task;
} local_work;

static void run_attempt(void *arg) {
  sched_task *t = arg;
  rdd_task_run(&t->rt, sched_task_rdd(t), sched_task_action(t), &t->result);
}

/* The attempt behind the crash guard; a crash fails it with what and where. */
static void run_contained(sched_task *t) {
  rdd_task *outer = rdd_task_current();
  uint64_t start = common_now_ns();
  common_crash crash;
  if (common_crash_guard_run(run_attempt, t, &crash)) return;
  char where[400];
  if (crash.function[0]) snprintf(where, sizeof where, "function %s of %s", crash.function, crash.library);
  else if (crash.library[0])
    snprintf(where, sizeof where, "an unnamed function of %s (+0x%lx; export it to see its name)", crash.library,
             (unsigned long)crash.offset);
  else snprintf(where, sizeof where, "an unknown function");
  char message[600];
  snprintf(message, sizeof message, "task crashed: signal %d (%s) in %s, running partition %u of dataset %llu",
           crash.signal, strsignal(crash.signal), where, t->rt.partition,
           (unsigned long long)sched_task_rdd(t)->id);
  common_log(LOG_ERROR, "%s; the process goes on (contain_task_crashes), with what the task held as it was",
             message);
  t->result.len = 0;
  rdd_task_crashed(&t->rt, outer, message);
  t->rt.run_ns = common_now_ns() - start;
}

static void local_run(task_pool_work *work) {
  local_work *w = (local_work *)work;
  sched_task *t = w->task;
  scheduler *s = w->b->sched;
  bool contain = ((local_backend *)w->b)->contain_crashes;
  common_free(w);
  common_trace_partition("task.start", t->rt.partition); /* as executors trace theirs */
  if (contain) run_contained(t);
  else run_attempt(t);
  common_trace_partition("task.end", t->rt.partition);
  scheduler_post_task_end(s, t);
}

static void local_launch(backend *b, sched_task *t) {
  local_work *w = common_malloc(sizeof *w);
  if (!w) { /* the attempt ends at once, as a failure */
    t->rt.status = FL_ENOMEM;
    t->rt.error = common_strdup("out of memory: cannot queue the task");
    scheduler_post_task_end(b->sched, t);
    return;
  }
  w->work.run = local_run;
  w->b = b;
  w->task = t;
  task_pool_submit(((local_backend *)b)->pool, &w->work);
}

static void local_destroy(backend *b) {
  local_backend *lb = (local_backend *)b;
  task_pool_destroy(lb->pool);
  common_free(lb);
}

static const backend_ops local_ops = {.name = "local", .launch = local_launch, .destroy = local_destroy};

fl_status local_backend_create(scheduler *sched, uint32_t threads, bool contain_crashes, backend **out) {
  fl_status s = contain_crashes ? common_crash_guard_install() : FL_OK;
  if (s != FL_OK) return s;
  local_backend *lb = common_calloc(1, sizeof *lb);
  if (!lb) return FL_ERR(FL_ENOMEM, "cannot allocate the local backend");
  lb->contain_crashes = contain_crashes;
  s = task_pool_create(threads, "fl-task", &lb->pool);
  if (s != FL_OK) {
    common_free(lb);
    return s;
  }
  lb->base.ops = &local_ops;
  lb->base.sched = sched;
  lb->base.threads = threads;
  lb->base.slots = threads * LOCAL_SLOTS_PER_THREAD;
  *out = &lb->base;
  return FL_OK;
}
