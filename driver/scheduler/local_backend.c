/* local_backend.c: the in-process executor backend: tasks run on a pool of threads of this
 * process, against the context's own block manager. */
#include "driver/scheduler/scheduler_internal.h"

/* The backend offers this many slots per thread: tasks beyond the threads wait in the
 * pool's queue, so a thread that finishes a task starts the next at once instead of
 * waiting for a round trip through the scheduler thread (two hand-offs per task, which
 * dominated the latency of short jobs). Queued attempts of a failed job end at once. */
#define LOCAL_SLOTS_PER_THREAD 8

typedef struct local_backend {
  backend base;
  task_pool *pool;
  uint32_t threads;
  uint32_t running; /* attempts launched and not ended (scheduler thread) */
} local_backend;

static void local_run(task_pool_work *work) {
  sched_task *t = (sched_task *)((char *)work - offsetof(sched_task, work));
  common_trace_partition("task.start", t->rt.partition); /* as executors trace theirs */
  rdd_task_run(&t->rt, t->stage->rdd, t->stage->action, &t->result);
  common_trace_partition("task.end", t->rt.partition);
  scheduler_post_task_end(t->job->sched, t);
}

static void local_launch(backend *b, sched_task *t) {
  ((local_backend *)b)->running++;
  t->work.run = local_run;
  task_pool_submit(((local_backend *)b)->pool, &t->work);
}

static void local_destroy(backend *b) {
  local_backend *lb = (local_backend *)b;
  task_pool_destroy(lb->pool);
  common_free(lb);
}

static void local_ended(backend *b, sched_task *t) {
  (void)t;
  ((local_backend *)b)->running--;
}

/* A barrier stage's tasks each need a thread of their own at the same moment (they wait for
 * each other), so the threads are the gang's slots, GPU or not. */
static uint32_t local_gang_capacity(backend *b, bool gpu) {
  (void)gpu;
  return ((local_backend *)b)->threads;
}

static bool local_gang_place(backend *b, sched_task *tasks, uint32_t n, bool gpu) {
  (void)tasks;
  (void)gpu;
  local_backend *lb = (local_backend *)b;
  return lb->running + n <= lb->threads;
}

static const backend_ops local_ops = {.name = "local",
                                      .launch = local_launch,
                                      .ended = local_ended,
                                      .gang_capacity = local_gang_capacity,
                                      .gang_place = local_gang_place,
                                      .destroy = local_destroy};

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
  lb->base.slots = threads * LOCAL_SLOTS_PER_THREAD;
  lb->threads = threads;
  *out = &lb->base;
  return FL_OK;
}
