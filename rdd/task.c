/* task.c: the body of a task: open the partition's iterator chain and apply the action. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rdd/rdd.h"

static _Thread_local rdd_task *current_task;

rdd_task *rdd_task_current(void) { return current_task; }

fl_status rdd_task_fn_failed(rdd_task *task, const rdd *r, fl_status status) {
  char name[256];
  common_symbol_name((const void *)r->fn, name, sizeof name);
  common_error_wrap(status == FL_OK ? FL_EUSER : status,
                    "%s function '%s' failed on partition %u: ", r->fn_kind, name,
                    task->partition);
  return rdd_task_fail(task, status == FL_OK ? FL_EUSER : status);
}

void rdd_task_clear(rdd_task *task) {
  common_free(task->error);
  task->error = NULL;
  task->status = FL_OK;
  for (uint32_t i = 0; i < task->num_acc_updates; i++) fl_buf_free(&task->acc_updates[i].value);
  common_free(task->acc_updates);
  task->acc_updates = NULL;
  task->num_acc_updates = task->cap_acc_updates = 0;
  task->fetch_failed = false;
  task->no_retry = false;
  task->run_ns = 0;
  task->blocks_mapped = task->blocks_fetched = 0;
  task->input_bytes = task->shuffle_read_bytes = task->shuffle_write_bytes = 0;
}

void rdd_task_crashed(rdd_task *task, rdd_task *outer, const char *message) {
  current_task = outer;
  task->opened = NULL; /* leaked: closing them would run code over what the crash left */
  if (task->status == FL_OK) {
    task->status = FL_EJOB;
    common_free(task->error);
    task->error = common_strdup(message);
  } else { /* an earlier failure was recorded first: the crash is what ended it */
    char *was = task->error;
    size_t len = strlen(message) + (was ? strlen(was) : 0) + 32;
    char *both = common_malloc(len);
    if (both) snprintf(both, len, "%s (after: %s)", message, was ? was : fl_strerror(task->status));
    task->status = FL_EJOB;
    task->error = both ? both : common_strdup(message);
    common_free(was);
  }
  task->no_retry = true;
}

static void close_iterators(rdd_task *task) {
  fl_iter *it = task->opened;
  while (it) {
    fl_iter *before = it->opened_before;
    if (it->close) it->close(it);
    common_free(it->ahead);
    common_free(it);
    it = before;
  }
  task->opened = NULL;
}

static fl_status cancelled(rdd_task *task) {
  return rdd_task_fail(task, FL_ERR(FL_ECANCELLED, "job cancelled"));
}

static fl_status run_count(rdd_task *task, fl_iter *in, fl_buf *result) {
  uint64_t n = 0;
  if (!in->count || !in->count(in, &n)) {
    fl_bytes recs[RDD_ITER_BATCH];
    uint32_t got;
    while ((got = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
      n += got;
      if (rdd_task_cancelled(task)) return cancelled(task);
    }
  }
  if (task->status != FL_OK) return task->status;
  return fl_buf_append(result, &n, sizeof n);
}

static fl_status run_collect(rdd_task *task, fl_iter *in, uint64_t limit, fl_buf *result) {
  rdd_batch batch = {FL_BUF_INIT, 0};
  fl_status status = FL_OK;
  fl_bytes recs[RDD_ITER_BATCH];
  for (;;) {
    uint64_t want = limit == 0 ? RDD_ITER_BATCH : limit - batch.count;
    if (want == 0) break;
    uint32_t got = in->next(in, recs, want < RDD_ITER_BATCH ? (uint32_t)want : RDD_ITER_BATCH);
    if (got == 0) break;
    for (uint32_t i = 0; i < got; i++) FL_CHECK(rdd_batch_append(&batch, recs[i].data, recs[i].len));
    if (rdd_task_cancelled(task)) {
      status = FL_ERR(FL_ECANCELLED, "job cancelled");
      goto cleanup;
    }
  }
  if (task->status != FL_OK) goto cleanup;
  uint8_t head[COMMON_VARINT_MAX];
  size_t n = common_varint_put(head, batch.count);
  FL_CHECK(fl_buf_reserve(result, n + batch.buf.len));
  fl_buf_append(result, head, n);
  fl_buf_append(result, batch.buf.data, batch.buf.len);
cleanup:
  rdd_batch_free(&batch);
  if (status != FL_OK) return rdd_task_fail(task, status);
  return task->status;
}

/*
 * An accumulator and its output alternate between two buffers, chosen by an index: copying
 * the fl_buf structs instead would load {data, len} as one 16-byte word just after the user
 * function stored len, a store-forwarding stall that cost most of the time per record.
 * Reduce (no zero; the function is associative and commutative) keeps REDUCE_LANES
 * accumulators fed round-robin and merges them at the end, so that each call waits on its
 * own lane's previous result rather than on the call just before it. Fold and aggregate
 * keep one accumulator, so that their zero is used once per partition (as in Spark).
 */
#define REDUCE_LANES 4

static __attribute__((noinline, cold)) fl_status seq_failed(rdd_task *task, const rdd_action *a,
                                                           fl_status s) {
  char name[256];
  common_symbol_name((const void *)a->seq, name, sizeof name);
  return common_error_wrap(s, "%s function '%s' failed on partition %u: ",
                           a->has_zero ? "aggregate" : "reduce", name, task->partition);
}

typedef struct lane {
  fl_buf bufs[2];
  unsigned cur; /* bufs[cur] is the accumulator */
  bool has;
} lane;

static inline __attribute__((always_inline)) fl_status lane_apply(rdd_task *task, const rdd_action *a,
                                                                  lane *l, fl_bytes rec) {
  fl_buf *acc = &l->bufs[l->cur], *out = &l->bufs[l->cur ^ 1];
  if (!l->has) {
    acc->len = 0;
    l->has = true;
    return fl_buf_append(acc, rec.data, rec.len);
  }
  out->len = 0;
  fl_status s = a->seq(fl_buf_bytes(acc), rec, out, a->arg);
  if (__builtin_expect(s != FL_OK, 0)) return seq_failed(task, a, s);
  l->cur ^= 1;
  return FL_OK;
}

static fl_status run_aggregate(rdd_task *task, fl_iter *in, const rdd_action *a,
                               fl_buf *result) {
  lane lanes[REDUCE_LANES];
  memset(lanes, 0, sizeof lanes);
  uint32_t num_lanes = a->has_zero ? 1 : REDUCE_LANES;
  fl_status status = FL_OK;
  if (a->has_zero) {
    FL_CHECK(fl_buf_append(&lanes[0].bufs[0], a->zero.data, a->zero.len));
    lanes[0].has = true;
  }
  fl_bytes recs[RDD_ITER_BATCH];
  uint32_t got;
  while ((got = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
    uint32_t i = 0;
    if (num_lanes == REDUCE_LANES)
      for (; i + REDUCE_LANES <= got; i += REDUCE_LANES)
        for (uint32_t k = 0; k < REDUCE_LANES; k++) FL_CHECK(lane_apply(task, a, &lanes[k], recs[i + k]));
    for (; i < got; i++) FL_CHECK(lane_apply(task, a, &lanes[0], recs[i]));
    if (rdd_task_cancelled(task)) {
      status = FL_ERR(FL_ECANCELLED, "job cancelled");
      goto cleanup;
    }
  }
  if (task->status != FL_OK) goto cleanup;
  for (uint32_t k = 1; k < num_lanes; k++)
    if (lanes[k].has) FL_CHECK(lane_apply(task, a, &lanes[0], fl_buf_bytes(&lanes[k].bufs[lanes[k].cur])));
  uint8_t flag = lanes[0].has;
  FL_CHECK(fl_buf_append(result, &flag, 1));
  if (flag) FL_CHECK(fl_buf_append(result, lanes[0].bufs[lanes[0].cur].data, lanes[0].bufs[lanes[0].cur].len));
cleanup:
  for (uint32_t k = 0; k < REDUCE_LANES; k++) {
    fl_buf_free(&lanes[k].bufs[0]);
    fl_buf_free(&lanes[k].bufs[1]);
  }
  if (status != FL_OK) return rdd_task_fail(task, status);
  return task->status;
}

static fl_status run_foreach(rdd_task *task, fl_iter *in, const rdd_action *a) {
  fl_bytes recs[RDD_ITER_BATCH];
  uint32_t got;
  while ((got = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
    for (uint32_t i = 0; i < got; i++) {
      fl_status s = a->foreach_fn(recs[i], a->arg);
      if (s != FL_OK) {
        char name[256];
        common_symbol_name((const void *)a->foreach_fn, name, sizeof name);
        common_error_wrap(s, "foreach function '%s' failed on partition %u: ", name,
                          task->partition);
        return rdd_task_fail(task, s);
      }
    }
    if (rdd_task_cancelled(task)) return cancelled(task);
  }
  return task->status;
}

/* Writes to a hidden attempt file and renames it into place, so a failed or retried
 * attempt never leaves a partial part file behind. */
static fl_status run_save_text(rdd_task *task, fl_iter *in, const char *dir) {
  char tmp[4096], final[4096];
  snprintf(tmp, sizeof tmp, "%s/.part-%05u.attempt-%u", dir, task->partition, task->attempt);
  snprintf(final, sizeof final, "%s/part-%05u", dir, task->partition);
  FILE *f = fopen(tmp, "w");
  if (!f) return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot create %s: %s", tmp, strerror(errno)));
  fl_bytes recs[RDD_ITER_BATCH];
  uint32_t got;
  bool ok = true;
  while (ok && (got = in->next(in, recs, RDD_ITER_BATCH)) > 0)
    for (uint32_t i = 0; ok && i < got; i++)
      ok = (recs[i].len == 0 || fwrite(recs[i].data, 1, recs[i].len, f) == recs[i].len) &&
           fputc('\n', f) != EOF;
  if (fclose(f) != 0) ok = false;
  if (task->status != FL_OK) {
    unlink(tmp);
    return task->status;
  }
  if (!ok) {
    int e = errno;
    unlink(tmp);
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot write %s: %s", tmp, strerror(e)));
  }
  if (rename(tmp, final) != 0) {
    int e = errno;
    unlink(tmp);
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(e)));
  }
  return FL_OK;
}

fl_status rdd_task_run(rdd_task *task, rdd *r, const rdd_action *action, fl_buf *result) {
  rdd_task *outer = current_task;
  current_task = task;
  uint64_t start = common_now_ns();
  result->len = 0;
  task->input_bytes = task->shuffle_read_bytes = task->shuffle_write_bytes = 0; /* this attempt's */
  fl_iter *in = NULL;
  fl_status status = rdd_task_cancelled(task) ? cancelled(task)
                                              : rdd_iterate(r, task->partition, task, &in);
  if (status == FL_OK) {
    switch (action->kind) {
    case RDD_ACTION_COUNT: status = run_count(task, in, result); break;
    case RDD_ACTION_COLLECT: status = run_collect(task, in, action->limit, result); break;
    case RDD_ACTION_AGGREGATE: status = run_aggregate(task, in, action, result); break;
    case RDD_ACTION_FOREACH: status = run_foreach(task, in, action); break;
    case RDD_ACTION_SAVE_TEXT: status = run_save_text(task, in, action->path); break;
    case RDD_ACTION_CHECKPOINT: status = rdd_checkpoint_write(task, in, action->path, result); break;
    case RDD_ACTION_SHUFFLE_WRITE: status = action->dep->write(task, in, action->dep, result); break;
    }
  }
  if (status != FL_OK) rdd_task_fail(task, status);
  close_iterators(task);
  current_task = outer;
  task->run_ns = common_now_ns() - start;
  if (task->status != FL_OK) {
    result->len = 0;
    return task->status;
  }
  return FL_OK;
}
