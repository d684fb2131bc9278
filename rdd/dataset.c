/* dataset.c: lineage nodes, their lifetime, persistence, opening a partition, and the
 * failure of the task that opens it. */
#include <string.h>

#include "rdd/rdd.h"

fl_status rdd_create(fl_context *ctx, const rdd_ops *ops, uint32_t num_partitions,
                     rdd *const *parents, uint32_t num_parents, void (*fn)(void),
                     const char *fn_kind, const void *arg, size_t arg_len, rdd **out) {
  return rdd_create_id(ctx, atomic_fetch_add(&ctx->next_rdd_id, 1), ops, num_partitions, parents,
                       num_parents, fn, fn_kind, arg, arg_len, out);
}

fl_status rdd_create_id(fl_context *ctx, uint64_t id, const rdd_ops *ops,
                        uint32_t num_partitions, rdd *const *parents, uint32_t num_parents,
                        void (*fn)(void), const char *fn_kind, const void *arg, size_t arg_len,
                        rdd **out) {
  FL_ASSERT(num_parents <= 2);
  rdd *r = common_calloc(1, sizeof *r);
  if (!r) return FL_ERR(FL_ENOMEM, "cannot allocate a dataset");
  if (arg_len) {
    r->arg = common_memdup(arg, arg_len);
    if (!r->arg) {
      common_free(r);
      return FL_ERR(FL_ENOMEM, "cannot copy an argument blob of %zu bytes", arg_len);
    }
    r->arg_len = arg_len;
  }
  atomic_init(&r->refs, 1);
  r->id = id;
  r->ctx = ctx;
  r->ops = ops;
  r->num_partitions = num_partitions;
  for (uint32_t i = 0; i < num_parents; i++) {
    r->parents[i] = parents[i];
    rdd_retain(parents[i]);
  }
  r->num_parents = num_parents;
  r->fn = fn;
  r->fn_kind = fn_kind;
  atomic_init(&r->level, FL_STORAGE_NONE);
  *out = r;
  return FL_OK;
}

void rdd_retain(rdd *r) { atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); }

void rdd_release(rdd *r) {
  /* Iterative rather than recursive: long lineages (many iterations) must not overflow. */
  while (r && atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) {
    if (atomic_load(&r->level) != FL_STORAGE_NONE) r->ctx->cache->remove_rdd(r->ctx->cache_impl, r->id);
    if (r->ctx->runtime->rdd_destroyed) r->ctx->runtime->rdd_destroyed(r->ctx->runtime_impl, r->id);
    if (r->ops->destroy) r->ops->destroy(r);
    if (r->partitioner) rdd_partitioner_release(r->partitioner);
    rdd *next = r->parents[0];
    if (r->num_parents > 1) rdd_release(r->parents[1]);
    common_free(r->arg);
    fl_buf_free(&r->plan_node);
    common_free(r);
    r = next;
  }
}

void fl_dataset_free(fl_dataset *ds) { rdd_release(ds); }

uint32_t fl_dataset_partitions(const fl_dataset *ds) { return ds ? ds->num_partitions : 0; }

fl_context *fl_dataset_context(const fl_dataset *ds) { return ds ? ds->ctx : NULL; }

char *fl_dataset_lineage(const fl_dataset *ds) {
  if (!ds) return NULL;
  fl_buf out = FL_BUF_INIT;
  char line[256];
  /* Depth-first, indenting each parent under its child, as Spark's toDebugString. */
  const rdd *stack[256];
  int depth[256], top = 0;
  stack[top] = ds;
  depth[top++] = 0;
  while (top > 0) {
    top--;
    const rdd *r = stack[top];
    int d = depth[top];
    fl_storage_level level = atomic_load(&r->level);
    int n = snprintf(line, sizeof line, "%*s(%u) %s [%llu]%s\n", 2 * d, "", r->num_partitions,
                     r->fn_kind ? r->fn_kind : r->ops->name,
                     (unsigned long long)r->id,
                     level != FL_STORAGE_NONE ? " cached" : "");
    if (fl_buf_append(&out, line, (size_t)n) != FL_OK) break;
    for (int i = (int)r->num_shuffle_deps - 1; i >= 0 && top < 256; i--) {
      stack[top] = r->shuffle_deps[i]->parent;
      depth[top++] = d + 1;
    }
    for (int i = (int)r->num_parents - 1; i >= 0 && top < 256; i--) {
      stack[top] = r->parents[i];
      depth[top++] = d + 1;
    }
  }
  if (fl_buf_append(&out, "", 1) != FL_OK) {
    fl_buf_free(&out);
    return NULL;
  }
  return (char *)out.data;
}

/* ---- a task's failure (rdd.h), which every iterator may report ----------------------- */

fl_status rdd_task_fail(rdd_task *task, fl_status status) {
  FL_ASSERT(status != FL_OK);
  if (task->status == FL_OK) {
    task->status = status;
    const char *msg = fl_last_error();
    task->error = common_strdup(msg[0] ? msg : fl_strerror(status));
  }
  return task->status;
}

/* ---- iterators ------------------------------------------------------------------------- */

void *rdd_iter_new(rdd_task *task, size_t size, uint32_t (*next)(fl_iter *, fl_bytes *, uint32_t),
                   void (*close)(fl_iter *)) {
  fl_iter *it = common_calloc(1, size);
  if (!it) {
    FL_ERR(FL_ENOMEM, "cannot allocate an iterator");
    return NULL;
  }
  it->next = next;
  it->close = close;
  it->task = task;
  it->opened_before = task->opened;
  task->opened = it;
  return it;
}

bool fl_iter_next(fl_iter *it, fl_bytes *rec) {
  if (!it || !rec) return false;
  if (it->ahead_pos == it->ahead_len) {
    if (!it->ahead && !(it->ahead = common_malloc(RDD_ITER_BATCH * sizeof *it->ahead))) {
      rdd_task_fail(it->task, FL_ERR(FL_ENOMEM, "cannot allocate an iterator buffer"));
      return false;
    }
    it->ahead_pos = 0;
    it->ahead_len = it->next(it, it->ahead, RDD_ITER_BATCH);
    if (it->ahead_len == 0) return false;
  }
  *rec = it->ahead[it->ahead_pos++];
  return true;
}

typedef struct batch_iter {
  fl_iter base;
  rdd_cursor cursor;
  uint64_t left;
  void (*release)(void *handle);
  void *handle;
} batch_iter;

static uint32_t batch_iter_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  batch_iter *b = (batch_iter *)it;
  uint32_t n = 0;
  while (n < max && rdd_cursor_next(&b->cursor, &out[n])) n++;
  b->left -= n;
  return n;
}

static bool batch_iter_count(fl_iter *it, uint64_t *left) {
  *left = ((batch_iter *)it)->left;
  return true;
}

static void batch_iter_close(fl_iter *it) {
  batch_iter *b = (batch_iter *)it;
  if (b->release) b->release(b->handle);
}

fl_status rdd_iter_batch(rdd_task *task, const rdd_batch *batch, void (*release)(void *),
                         void *handle, fl_iter **out) {
  batch_iter *it = rdd_iter_new(task, sizeof *it, batch_iter_next, batch_iter_close);
  if (!it) {
    if (release) release(handle);
    return rdd_task_fail(task, FL_ENOMEM);
  }
  it->base.count = batch_iter_count;
  it->cursor.p = batch->buf.data;
  it->cursor.end = batch->buf.data + batch->buf.len;
  it->left = batch->count;
  it->release = release;
  it->handle = handle;
  *out = &it->base;
  return FL_OK;
}

/* ---- opening a partition, through the cache -------------------------------------------- */

/* The cache's release, bound to its context for batch_iter's one-argument callback. */
typedef struct cache_handle {
  fl_context *ctx;
  void *handle;
} cache_handle;

static void cache_handle_release(void *p) {
  cache_handle *h = p;
  h->ctx->cache->release(h->ctx->cache_impl, h->handle);
  common_free(h);
}

static fl_status iterate_block(rdd_task *task, fl_context *ctx, const rdd_batch *batch,
                               void *handle, fl_iter **out) {
  cache_handle *h = common_malloc(sizeof *h);
  if (!h) {
    ctx->cache->release(ctx->cache_impl, handle);
    return rdd_task_fail(task, FL_ERR(FL_ENOMEM, "cannot allocate a block handle"));
  }
  h->ctx = ctx;
  h->handle = handle;
  return rdd_iter_batch(task, batch, cache_handle_release, h, out);
}

fl_status rdd_iterate(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  fl_storage_level level = atomic_load(&r->level);
  if (level == FL_STORAGE_NONE) return r->ops->open(r, p, task, out);

  fl_context *ctx = r->ctx;
  rdd_block_key key = {r->id, p};
  const rdd_batch *cached;
  void *handle;
  if (ctx->cache->get(ctx->cache_impl, key, &cached, &handle))
    return iterate_block(task, ctx, cached, handle, out);

  /* A miss: compute the whole partition, store it, then read it back from the store. */
  fl_iter *in;
  fl_status status = r->ops->open(r, p, task, &in);
  if (status != FL_OK) return status;
  rdd_batch batch = {FL_BUF_INIT, 0};
  fl_bytes recs[RDD_ITER_BATCH];
  uint32_t n;
  bool taken = in->take && in->take(in, &batch); /* the records' own batch, without a copy */
  while (!taken && (n = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
    for (uint32_t i = 0; i < n; i++) {
      if ((status = rdd_batch_append(&batch, recs[i].data, recs[i].len)) != FL_OK) {
        rdd_batch_free(&batch);
        return rdd_task_fail(task, status);
      }
    }
  }
  if (task->status != FL_OK) {
    rdd_batch_free(&batch);
    return task->status;
  }
  status = ctx->cache->put(ctx->cache_impl, key, level, &batch, &cached, &handle);
  rdd_batch_free(&batch);
  if (status != FL_OK) return rdd_task_fail(task, status);
  return iterate_block(task, ctx, cached, handle, out);
}

/* ---- persistence ----------------------------------------------------------------------- */

fl_status fl_persist(fl_dataset *ds, fl_storage_level level) {
  common_error_clear();
  if (!ds) return FL_ERR(FL_EINVAL, "fl_persist: dataset is NULL");
  if (level < FL_MEMORY_ONLY || level > FL_DISK_ONLY)
    return FL_ERR(FL_EINVAL, "fl_persist: unknown storage level %d", (int)level);
  fl_storage_level none = FL_STORAGE_NONE;
  if (atomic_compare_exchange_strong(&ds->level, &none, level) || none == level) return FL_OK;
  return FL_ERR(FL_ESTATE,
                "dataset %llu is already persisted at another level; unpersist it first",
                (unsigned long long)ds->id);
}

fl_status fl_cache(fl_dataset *ds) { return fl_persist(ds, FL_MEMORY_ONLY); }

fl_status fl_unpersist(fl_dataset *ds) {
  common_error_clear();
  if (!ds) return FL_ERR(FL_EINVAL, "fl_unpersist: dataset is NULL");
  if (atomic_exchange(&ds->level, FL_STORAGE_NONE) != FL_STORAGE_NONE)
    ds->ctx->cache->remove_rdd(ds->ctx->cache_impl, ds->id);
  return FL_OK;
}

fl_status fl_storage_info_get(fl_dataset *ds, fl_storage_info *out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_storage_info_get: NULL argument");
  fl_storage_info info = {0};
  ds->ctx->cache->info(ds->ctx->cache_impl, ds->id, &info);
  info.level = atomic_load(&ds->level);
  info.partitions = ds->num_partitions;
  *out = info;
  return FL_OK;
}
