/* task.c: the body of a task: open the partition's iterator chain and apply the action. */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rdd/rdd.h"

static _Thread_local rdd_task *current_task;

rdd_task *rdd_task_current(void) { return current_task; }

fl_status rdd_task_fail(rdd_task *task, fl_status status) {
  FL_ASSERT(status != FL_OK);
  if (task->status == FL_OK) {
    task->status = status;
    const char *msg = fl_last_error();
    task->error = common_strdup(msg[0] ? msg : fl_strerror(status));
  }
  return task->status;
}

fl_status rdd_task_fn_failed(rdd_task *task, const rdd *r, fl_status status) {
  char name[128];
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
}

static void close_iterators(rdd_task *task) {
  fl_iter *it = task->opened;
  while (it) {
    fl_iter *before = it->opened_before;
    if (it->close) it->close(it);
    common_free(it);
    it = before;
  }
  task->opened = NULL;
}

/* How often the terminal loops look at the job's cancel flag. */
#define CANCEL_CHECK_MASK 4095u

static inline bool task_cancelled(rdd_task *task, uint64_t n) {
  return (n & CANCEL_CHECK_MASK) == 0 && task->cancelled &&
         atomic_load_explicit(task->cancelled, memory_order_relaxed);
}

static fl_status run_count(rdd_task *task, fl_iter *in, fl_buf *result) {
  uint64_t n = 0;
  fl_bytes rec;
  while (in->next(in, &rec))
    if (task_cancelled(task, ++n)) return rdd_task_fail(task, FL_ERR(FL_ECANCELLED, "job cancelled"));
  if (task->status != FL_OK) return task->status;
  return fl_buf_append(result, &n, sizeof n);
}

static fl_status run_collect(rdd_task *task, fl_iter *in, uint64_t limit, fl_buf *result) {
  rdd_batch batch = {FL_BUF_INIT, 0};
  fl_status status = FL_OK;
  fl_bytes rec;
  while ((limit == 0 || batch.count < limit) && in->next(in, &rec)) {
    if ((status = rdd_batch_append(&batch, rec.data, rec.len)) != FL_OK) goto cleanup;
    if (task_cancelled(task, batch.count)) {
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

/* The accumulator and the output swap between two buffers, so no call copies. */
static fl_status run_aggregate(rdd_task *task, fl_iter *in, const rdd_action *a,
                               fl_buf *result) {
  fl_buf acc = FL_BUF_INIT, out = FL_BUF_INIT;
  fl_status status = FL_OK;
  bool has = false;
  if (a->has_zero) {
    FL_CHECK(fl_buf_append(&acc, a->zero.data, a->zero.len));
    has = true;
  }
  fl_bytes rec;
  uint64_t n = 0;
  while (in->next(in, &rec)) {
    if (!has) {
      acc.len = 0;
      FL_CHECK(fl_buf_append(&acc, rec.data, rec.len));
      has = true;
      continue;
    }
    out.len = 0;
    fl_status s = a->seq(fl_buf_bytes(&acc), rec, &out, a->arg);
    if (s != FL_OK) {
      char name[128];
      common_symbol_name((const void *)a->seq, name, sizeof name);
      common_error_wrap(s, "aggregate function '%s' failed on partition %u: ", name,
                        task->partition);
      status = s;
      goto cleanup;
    }
    fl_buf t = acc;
    acc = out;
    out = t;
    if (task_cancelled(task, ++n)) {
      status = FL_ERR(FL_ECANCELLED, "job cancelled");
      goto cleanup;
    }
  }
  if (task->status != FL_OK) goto cleanup;
  uint8_t flag = has;
  FL_CHECK(fl_buf_append(result, &flag, 1));
  if (has) FL_CHECK(fl_buf_append(result, acc.data, acc.len));
cleanup:
  fl_buf_free(&acc);
  fl_buf_free(&out);
  if (status != FL_OK) return rdd_task_fail(task, status);
  return task->status;
}

static fl_status run_foreach(rdd_task *task, fl_iter *in, const rdd_action *a) {
  fl_bytes rec;
  uint64_t n = 0;
  while (in->next(in, &rec)) {
    fl_status s = a->foreach_fn(rec, a->arg);
    if (s != FL_OK) {
      char name[128];
      common_symbol_name((const void *)a->foreach_fn, name, sizeof name);
      common_error_wrap(s, "foreach function '%s' failed on partition %u: ", name,
                        task->partition);
      return rdd_task_fail(task, s);
    }
    if (task_cancelled(task, ++n)) return rdd_task_fail(task, FL_ERR(FL_ECANCELLED, "job cancelled"));
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
  fl_bytes rec;
  bool ok = true;
  while (ok && in->next(in, &rec))
    ok = fwrite(rec.data, 1, rec.len, f) == rec.len && fputc('\n', f) != EOF;
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
  result->len = 0;
  fl_iter *in = NULL;
  fl_status status = rdd_iterate(r, task->partition, task, &in);
  if (status == FL_OK) {
    switch (action->kind) {
    case RDD_ACTION_COUNT: status = run_count(task, in, result); break;
    case RDD_ACTION_COLLECT: status = run_collect(task, in, action->limit, result); break;
    case RDD_ACTION_AGGREGATE: status = run_aggregate(task, in, action, result); break;
    case RDD_ACTION_FOREACH: status = run_foreach(task, in, action); break;
    case RDD_ACTION_SAVE_TEXT: status = run_save_text(task, in, action->path); break;
    }
  }
  if (status != FL_OK) rdd_task_fail(task, status);
  close_iterators(task);
  current_task = outer;
  if (task->status != FL_OK) {
    result->len = 0;
    return task->status;
  }
  return FL_OK;
}
