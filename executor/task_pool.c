/* task_pool.c: a fixed pool of threads fed by one spin-then-block queue (an executor's task
 * threads, the local backend's, the driver's reply packers). */
#include "executor/executor.h"

struct task_pool {
  common_queue queue;
  pthread_t *threads;
  uint32_t count;
  const char *name;
};

static void *pool_main(void *p) {
  task_pool *pool = p;
  pthread_setname_np(pthread_self(), pool->name);
  uint64_t spin = fl_spin_ns();
  common_qnode *node;
  while ((node = common_queue_pop(&pool->queue, spin))) {
    task_pool_work *work = (task_pool_work *)node;
    work->run(work);
  }
  return NULL;
}

fl_status task_pool_create(uint32_t threads, const char *name, task_pool **out) {
  task_pool *pool = common_calloc(1, sizeof *pool);
  if (!pool) return FL_ERR(FL_ENOMEM, "cannot allocate a task pool");
  pool->name = name;
  pool->threads = common_calloc(threads, sizeof *pool->threads);
  if (!pool->threads) {
    common_free(pool);
    return FL_ERR(FL_ENOMEM, "cannot allocate %u task threads", threads);
  }
  common_queue_init(&pool->queue);
  for (uint32_t i = 0; i < threads; i++) {
    if (pthread_create(&pool->threads[i], NULL, pool_main, pool) != 0) {
      pool->count = i;
      task_pool_destroy(pool);
      return FL_ERR(FL_ENOMEM, "cannot start thread %u of %u (%s)", i + 1, threads, name);
    }
  }
  pool->count = threads;
  *out = pool;
  return FL_OK;
}

void task_pool_submit(task_pool *pool, task_pool_work *work) {
  common_queue_push(&pool->queue, &work->node);
}

void task_pool_destroy(task_pool *pool) {
  if (!pool) return;
  common_queue_close(&pool->queue);
  for (uint32_t i = 0; i < pool->count; i++) pthread_join(pool->threads[i], NULL);
  common_queue_destroy(&pool->queue);
  common_free(pool->threads);
  common_free(pool);
}
