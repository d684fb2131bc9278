/* local_backend.c: the in-process executor backend: tasks run on a pool of threads of this
 * process, against the context's own block manager. */
#include "driver/driver.h"

/* The backend offers this many slots per thread: tasks beyond the threads wait in the
 * pool's queue, so a thread that finishes a task starts the next at once instead of
 * waiting for a round trip through the scheduler thread (two hand-offs per task, which
 * dominated the latency of short jobs). Queued attempts of a failed job end at once. */
#define LOCAL_SLOTS_PER_THREAD 8

typedef struct local_backend {
  backend base;
  task_pool *pool;
} local_backend;

static void local_run(task_pool_work *work) {
  sched_task *t = (sched_task *)((char *)work - offsetof(sched_task, work));
  rdd_task_run(&t->rt, t->stage->rdd, t->stage->action, &t->result);
  scheduler_post_task_end(t->job->sched, t);
}

static void local_launch(backend *b, sched_task *t) {
  t->work.run = local_run;
  task_pool_submit(((local_backend *)b)->pool, &t->work);
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
  fl_status s = task_pool_create(threads, &lb->pool);
  if (s != FL_OK) {
    common_free(lb);
    return s;
  }
  lb->base.ops = &local_ops;
  lb->base.sched = sched;
  lb->base.slots = threads * LOCAL_SLOTS_PER_THREAD;
  *out = &lb->base;
  return FL_OK;
}
