/*
 * barrier.c: a barrier task's view of its stage (fl_barrier, flint.h). The task's rank,
 * world and attempt come from the scheduler through rdd_task.barrier; all_gather, report
 * and checkpoints go to the stage's coordinator through the context's rdd_barrier_ops (an
 * in-process table in local mode, RPCs to the driver in an executor: driver/scheduler/barrier.c).
 */
#include <string.h>

#include "rdd/ops.h"

struct fl_barrier {
  rdd_task *task;
  rdd *r;          /* the barrier dataset (checkpoints are kept under its id) */
  uint32_t round;  /* all_gather calls so far */
};

/* Runs the barrier function of r over one partition (called by rdd/narrow.c). */
fl_status rdd_barrier_call(rdd *r, rdd_task *task, fl_iter *in, fl_emitter *out) {
  if (!task->barrier.on)
    return FL_ERR(FL_ESTATE, "dataset %llu is a barrier dataset but its task was not launched as one of a "
                  "barrier stage (a partial job over it?)", (unsigned long long)r->id);
  fl_barrier b = {task, r, 0};
  return ((fl_barrier_fn)r->fn)(&b, in, out, r->arg);
}

uint32_t fl_barrier_rank(const fl_barrier *b) { return b ? b->task->partition : 0; }
uint32_t fl_barrier_world(const fl_barrier *b) { return b ? b->task->barrier.world : 0; }
uint32_t fl_barrier_attempt(const fl_barrier *b) { return b ? b->task->barrier.attempt : 0; }
int fl_barrier_gpu(const fl_barrier *b) { return b ? b->task->barrier.gpu : -1; }

static fl_status check(const fl_barrier *b, const char *what) {
  if (!b) return FL_ERR(FL_EINVAL, "%s: NULL barrier", what);
  if (!b->task->ctx->barrier)
    return FL_ERR(FL_ESTATE, "%s: this context runs no barrier tasks", what);
  return FL_OK;
}

fl_status fl_barrier_all_gather(fl_barrier *b, fl_bytes mine, uint32_t timeout_ms, fl_records **all) {
  common_error_clear();
  fl_status c = check(b, "fl_barrier_all_gather");
  if (c != FL_OK) return c;
  if (!all || (mine.len && !mine.data)) return FL_ERR(FL_EINVAL, "fl_barrier_all_gather: NULL argument");
  if (mine.len > RDD_BARRIER_GATHER_MAX)
    return FL_ERR(FL_ELIMIT, "fl_barrier_all_gather: a message of %zu bytes (at most %zu)", mine.len,
                  RDD_BARRIER_GATHER_MAX);
  if (timeout_ms == 0) timeout_ms = RDD_BARRIER_TIMEOUT_MS;
  fl_context *ctx = b->task->ctx;
  rdd_batch batch = {FL_BUF_INIT, 0};
  fl_status s = ctx->barrier->all_gather(ctx->barrier_impl, b->task, b->round, mine, timeout_ms, &batch);
  if (s == FL_OK) {
    b->round++;
    if (batch.count != b->task->barrier.world) {
      rdd_batch_free(&batch);
      return FL_ERR(FL_EPROTO, "fl_barrier_all_gather: %llu messages for a world of %u",
                    (unsigned long long)batch.count, b->task->barrier.world);
    }
    s = rdd_records_from_batch(&batch, all);
  }
  rdd_batch_free(&batch);
  return s;
}

fl_status fl_barrier_report(fl_barrier *b, fl_bytes message) {
  common_error_clear();
  fl_status c = check(b, "fl_barrier_report");
  if (c != FL_OK) return c;
  if (message.len && !message.data) return FL_ERR(FL_EINVAL, "fl_barrier_report: NULL message");
  if (message.len > RDD_BARRIER_REPORT_MAX)
    return FL_ERR(FL_ELIMIT, "fl_barrier_report: a message of %zu bytes (at most %zu)", message.len,
                  RDD_BARRIER_REPORT_MAX);
  return b->task->ctx->barrier->report(b->task->ctx->barrier_impl, b->task, b->r->id, message);
}

fl_status fl_barrier_checkpoint_put(fl_barrier *b, fl_bytes state) {
  common_error_clear();
  fl_status c = check(b, "fl_barrier_checkpoint_put");
  if (c != FL_OK) return c;
  if (state.len && !state.data) return FL_ERR(FL_EINVAL, "fl_barrier_checkpoint_put: NULL state");
  if (state.len > RDD_BARRIER_CHECKPOINT_MAX)
    return FL_ERR(FL_ELIMIT, "fl_barrier_checkpoint_put: a state of %zu bytes (at most %zu)", state.len,
                  RDD_BARRIER_CHECKPOINT_MAX);
  return b->task->ctx->barrier->checkpoint_put(b->task->ctx->barrier_impl, b->task, b->r->id, state);
}

fl_status fl_barrier_checkpoint_get(fl_barrier *b, fl_buf *out) {
  common_error_clear();
  fl_status c = check(b, "fl_barrier_checkpoint_get");
  if (c != FL_OK) return c;
  if (!out) return FL_ERR(FL_EINVAL, "fl_barrier_checkpoint_get: NULL out");
  fl_buf got = FL_BUF_INIT;
  fl_status s = b->task->ctx->barrier->checkpoint_get(b->task->ctx->barrier_impl, b->task, b->r->id, &got);
  if (s == FL_OK) {
    fl_buf_free(out);
    *out = got;
  } else {
    fl_buf_free(&got);
  }
  return s;
}

/* Whether every partition of r is cached (then the tasks read blocks and run nothing below). */
static bool fully_cached(rdd *r) {
  if (atomic_load(&r->level) == FL_STORAGE_NONE) return false;
  fl_storage_info info = {0};
  r->ctx->cache->info(r->ctx->cache_impl, r->id, &info);
  return info.cached_partitions == r->num_partitions;
}

rdd *rdd_barrier_find(rdd *r) {
  while (r) {
    if (fully_cached(r)) return NULL;
    if (r->ops == &rdd_barrier_ops_table) return r;
    /* Only one-to-one narrow parents keep a task's partition its rank; below anything else a
     * barrier dataset's tasks fail with FL_ESTATE (rdd_barrier_call). */
    if (r->num_parents != 1 || r->num_shuffle_deps || r->parents[0]->num_partitions != r->num_partitions)
      return NULL;
    r = r->parents[0];
  }
  return NULL;
}

/* The first barrier dataset in root's lineage (across shuffles) that match() accepts. */
static rdd *lineage_find(rdd *root, bool (*match)(rdd *r, uint64_t id), uint64_t id) {
  rdd *stack[256];
  int top = 0;
  stack[top++] = root;
  while (top > 0) {
    rdd *r = stack[--top];
    if (r->ops == &rdd_barrier_ops_table && match(r, id)) return r;
    for (uint32_t i = 0; i < r->num_parents && top < 256; i++) stack[top++] = r->parents[i];
    for (uint32_t i = 0; i < r->num_shuffle_deps && top < 256; i++) stack[top++] = r->shuffle_deps[i]->parent;
  }
  return NULL;
}

static bool has_on_report(rdd *r, uint64_t id) {
  (void)id;
  return r->state && ((rdd_barrier_state *)r->state)->on_report;
}
static bool has_id(rdd *r, uint64_t id) { return r->id == id && has_on_report(r, id); }

bool rdd_barrier_reports_wanted(rdd *root) { return root && lineage_find(root, has_on_report, 0); }

bool rdd_barrier_deliver(rdd *root, uint64_t rdd_id, uint32_t rank, fl_bytes message) {
  rdd *r = root ? lineage_find(root, has_id, rdd_id) : NULL;
  if (!r) return false;
  const rdd_barrier_state *st = r->state;
  st->on_report(rank, message, st->user);
  return true;
}
