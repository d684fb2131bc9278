/*
 * local_backend.c: the in-process executor backend: tasks run on a pool of threads of this
 * process, against the context's own block manager. Nothing is placed: the pool's threads
 * are the backend's (backend.threads), and a barrier stage's gang fits when as many threads
 * are idle (gang.c). launch runs on the scheduler thread; the attempts on the pool's, which
 * post their ends.
 */
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
} local_backend;

/* One attempt in the pool's queue. */
typedef struct local_work {
  task_pool_work work; /* first: the pool hands this back */
  backend *b;
  sched_task *task;
} local_work;

static void local_run(task_pool_work *work) {
  local_work *w = (local_work *)work;
  sched_task *t = w->task;
  scheduler *s = w->b->sched;
  common_free(w);
  common_trace_partition("task.start", t->rt.partition); /* as executors trace theirs */
  rdd_task_run(&t->rt, sched_task_rdd(t), sched_task_action(t), &t->result);
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

fl_status local_backend_create(scheduler *sched, uint32_t threads, backend **out) {
  local_backend *lb = common_calloc(1, sizeof *lb);
  if (!lb) return FL_ERR(FL_ENOMEM, "cannot allocate the local backend");
  fl_status s = task_pool_create(threads, "fl-task", &lb->pool);
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
