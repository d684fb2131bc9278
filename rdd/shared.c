/*
 * shared.c: broadcast variables and accumulators.
 *
 * Both live in a registry of the context, keyed by id, so that functions can name them in
 * their argument blobs. Tasks add to accumulators in a task-local list; the scheduler
 * merges that list into the registry only when the task succeeds, so failed and retried
 * attempts count nothing and every successful task counts once.
 */
#include <string.h>

#include "rdd/rdd.h"

typedef enum acc_kind { ACC_I64, ACC_F64, ACC_CUSTOM } acc_kind;

typedef struct shared_entry {
  enum { ENTRY_BROADCAST, ENTRY_ACCUMULATOR } type;
  /* The registry's reference and one per loan of a broadcast's bytes to the client's block
   * server (rdd_shared_lend), so that a destroy during a fetch frees nothing in use. */
  atomic_uint refs;
  fl_buf value; /* the broadcast's bytes, or the accumulator's merged value */
  acc_kind kind;
  fl_reduce_fn merge;
  void *arg;
} shared_entry;

struct rdd_shared {
  pthread_mutex_t lock;
  /* An executor's registry: broadcasts are fetched on first use (rdd_shared_set_remote). */
  fl_status (*fetch)(void *arg, uint64_t id, fl_buf *out);
  void *fetch_arg;
  shared_entry **entries; /* by id - 1; NULL once destroyed */
  uint64_t count, cap;
};

struct fl_broadcast {
  fl_context *ctx;
  uint64_t id;
};

struct fl_accumulator {
  fl_context *ctx;
  uint64_t id;
};

fl_status rdd_shared_create(rdd_shared **out) {
  rdd_shared *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "cannot allocate the shared-variable registry");
  FL_PCHECK(pthread_mutex_init(&s->lock, NULL));
  *out = s;
  return FL_OK;
}

static void entry_free(shared_entry *e) {
  if (!e) return;
  fl_buf_free(&e->value);
  common_free(e->arg);
  common_free(e);
}

static void entry_unref(shared_entry *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) entry_free(e);
}

static shared_entry *entry_new(int type) {
  shared_entry *e = common_calloc(1, sizeof *e);
  if (e) {
    e->type = type;
    atomic_init(&e->refs, 1);
  }
  return e;
}

void rdd_shared_destroy(rdd_shared *s) {
  if (!s) return;
  for (uint64_t i = 0; i < s->count; i++) entry_unref(s->entries[i]);
  common_free(s->entries);
  pthread_mutex_destroy(&s->lock);
  common_free(s);
}

/* Adds an entry (taken) and returns its id, or 0 when out of memory. */
static uint64_t shared_add(rdd_shared *s, shared_entry *e) {
  uint64_t id = 0;
  FL_PCHECK(pthread_mutex_lock(&s->lock));
  if (s->count == s->cap) {
    uint64_t cap = s->cap ? s->cap * 2 : 16;
    shared_entry **grown = common_realloc(s->entries, cap * sizeof *grown);
    if (!grown) goto unlock;
    s->entries = grown;
    s->cap = cap;
  }
  s->entries[s->count++] = e;
  id = s->count;
unlock:
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  return id;
}

/* Puts an entry (taken) at a given id, growing the table; false when out of memory or the
 * id is taken (then the entry is freed). */
static bool shared_put_at(rdd_shared *s, uint64_t id, shared_entry *e) {
  bool ok = false;
  FL_PCHECK(pthread_mutex_lock(&s->lock));
  if (id == 0 || id > (UINT32_MAX)) goto unlock;
  if (id > s->cap) {
    uint64_t cap = s->cap ? s->cap : 16;
    while (cap < id) cap *= 2;
    shared_entry **grown = common_realloc(s->entries, cap * sizeof *grown);
    if (!grown) goto unlock;
    s->entries = grown;
    s->cap = cap;
  }
  while (s->count < id) s->entries[s->count++] = NULL;
  if (!s->entries[id - 1]) {
    s->entries[id - 1] = e;
    e = NULL;
    ok = true;
  }
unlock:
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  entry_unref(e);
  return ok;
}

void rdd_shared_forget(rdd_shared *s, uint64_t id) {
  FL_PCHECK(pthread_mutex_lock(&s->lock));
  shared_entry *e = id >= 1 && id <= s->count ? s->entries[id - 1] : NULL;
  if (e && e->type == ENTRY_BROADCAST) s->entries[id - 1] = NULL;
  else e = NULL;
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  entry_unref(e);
}

fl_status rdd_shared_put_broadcast(rdd_shared *s, uint64_t id, fl_bytes value) {
  shared_entry *e = entry_new(ENTRY_BROADCAST);
  if (!e || fl_buf_append(&e->value, value.data, value.len) != FL_OK) {
    entry_unref(e);
    return FL_ERR(FL_ENOMEM, "cannot keep broadcast %llu of %zu bytes", (unsigned long long)id, value.len);
  }
  shared_put_at(s, id, e); /* one it has already (fetched, or sent twice) stays */
  return FL_OK;
}

void rdd_shared_set_remote(rdd_shared *s, fl_status (*fetch)(void *, uint64_t, fl_buf *),
                           void *arg) {
  s->fetch = fetch;
  s->fetch_arg = arg;
}

/* Looks an entry up under the lock (held on return when found). */
static shared_entry *shared_lock_entry(rdd_shared *s, uint64_t id, int type) {
  FL_PCHECK(pthread_mutex_lock(&s->lock));
  shared_entry *e = id >= 1 && id <= s->count ? s->entries[id - 1] : NULL;
  if (e && (int)e->type == type) return e;
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  return NULL;
}

static void shared_remove(rdd_shared *s, uint64_t id) {
  FL_PCHECK(pthread_mutex_lock(&s->lock));
  shared_entry *e = s->entries[id - 1];
  s->entries[id - 1] = NULL;
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  entry_unref(e);
}

/* ---- broadcasts ------------------------------------------------------------------------ */

fl_status fl_broadcast_create(fl_context *ctx, const void *data, size_t len, fl_broadcast **out) {
  common_error_clear();
  if (!ctx || !out || (len && !data)) return FL_ERR(FL_EINVAL, "fl_broadcast_create: NULL argument");
  fl_broadcast *b = common_malloc(sizeof *b);
  shared_entry *e = entry_new(ENTRY_BROADCAST);
  if (!b || !e || fl_buf_reserve(&e->value, len) != FL_OK) goto oom;
  /* In cluster mode this copy is what the executors fetch, straight from this process. */
  if (len >= (8u << 20)) common_advise_huge(e->value.data, len);
  if (len) fl_buf_append(&e->value, data, len); /* reserved: cannot fail */
  b->ctx = ctx;
  if (!(b->id = shared_add(ctx->shared, e))) goto oom;
  if (ctx->runtime->broadcast_created) {
    fl_status st = ctx->runtime->broadcast_created(ctx->runtime_impl, b->id, len);
    if (st != FL_OK) {
      shared_remove(ctx->shared, b->id);
      common_free(b);
      return st;
    }
  }
  *out = b;
  return FL_OK;
oom:
  common_free(b);
  entry_unref(e);
  return FL_ERR(FL_ENOMEM, "cannot broadcast %zu bytes", len);
}

uint64_t fl_broadcast_id(const fl_broadcast *b) { return b ? b->id : 0; }

fl_status fl_broadcast_value(uint64_t id, fl_bytes *out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_broadcast_value: out is NULL");
  rdd_task *task = rdd_task_current();
  if (!task) return fl_set_error(FL_ESTATE, "fl_broadcast_value: called outside a task");
  rdd_shared *s = task->ctx->shared;
  shared_entry *e = shared_lock_entry(s, id, ENTRY_BROADCAST);
  if (!e && s->fetch) {
    /* First use in this executor: fetch it once (two tasks racing both fetch; one keeps). */
    shared_entry *fetched = entry_new(ENTRY_BROADCAST);
    if (!fetched) return fl_set_error(FL_ENOMEM, "out of memory");
    fl_status st = s->fetch(s->fetch_arg, id, &fetched->value);
    if (st != FL_OK) {
      entry_unref(fetched);
      return common_error_wrap(st, "broadcast %llu: ", (unsigned long long)id);
    }
    shared_put_at(s, id, fetched);
    e = shared_lock_entry(s, id, ENTRY_BROADCAST);
  }
  if (!e) return fl_set_error(FL_ENOENT, "no broadcast with id %llu", (unsigned long long)id);
  *out = fl_buf_bytes(&e->value);
  FL_PCHECK(pthread_mutex_unlock(&task->ctx->shared->lock));
  return FL_OK;
}

fl_status rdd_shared_lend(rdd_shared *s, uint64_t id, uint64_t offset, uint64_t len,
                          dp_loan *loan, uint64_t *total) {
  shared_entry *e = shared_lock_entry(s, id, ENTRY_BROADCAST);
  if (!e) return fl_set_error(FL_ENOENT, "no broadcast %llu (destroyed?)", (unsigned long long)id);
  atomic_fetch_add(&e->refs, 1);
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  *total = e->value.len;
  uint64_t want = offset >= e->value.len ? 0 : e->value.len - offset;
  if (len && len < want) want = len;
  *loan = (dp_loan){e->value.data + (want ? offset : 0), want, rdd_shared_return, e};
  return FL_OK;
}

void rdd_shared_return(void *entry) { entry_unref(entry); }

void fl_broadcast_destroy(fl_broadcast *b) {
  if (!b) return;
  if (b->ctx->runtime->broadcast_destroyed)
    b->ctx->runtime->broadcast_destroyed(b->ctx->runtime_impl, b->id);
  shared_remove(b->ctx->shared, b->id);
  common_free(b);
}

/* ---- accumulators ---------------------------------------------------------------------- */

static fl_status accumulator_create(fl_context *ctx, acc_kind kind, fl_bytes zero,
                                    fl_reduce_fn merge, const void *arg, size_t arg_len,
                                    fl_accumulator **out) {
  fl_accumulator *a = common_malloc(sizeof *a);
  shared_entry *e = entry_new(ENTRY_ACCUMULATOR);
  if (!a || !e || fl_buf_append(&e->value, zero.data, zero.len) != FL_OK) goto oom;
  if (arg_len && !(e->arg = common_memdup(arg, arg_len))) goto oom;
  e->kind = kind;
  e->merge = merge;
  a->ctx = ctx;
  if (!(a->id = shared_add(ctx->shared, e))) goto oom;
  *out = a;
  return FL_OK;
oom:
  common_free(a);
  entry_unref(e);
  return FL_ERR(FL_ENOMEM, "cannot create an accumulator");
}

fl_status fl_accumulator_create_i64(fl_context *ctx, fl_accumulator **out) {
  common_error_clear();
  if (!ctx || !out) return FL_ERR(FL_EINVAL, "fl_accumulator_create_i64: NULL argument");
  int64_t zero = 0;
  return accumulator_create(ctx, ACC_I64, fl_bytes_of(&zero, 8), NULL, NULL, 0, out);
}

fl_status fl_accumulator_create_f64(fl_context *ctx, fl_accumulator **out) {
  common_error_clear();
  if (!ctx || !out) return FL_ERR(FL_EINVAL, "fl_accumulator_create_f64: NULL argument");
  double zero = 0;
  return accumulator_create(ctx, ACC_F64, fl_bytes_of(&zero, 8), NULL, NULL, 0, out);
}

fl_status fl_accumulator_create(fl_context *ctx, fl_bytes zero, fl_reduce_fn merge,
                                const void *arg, size_t arg_len, fl_accumulator **out) {
  common_error_clear();
  if (!ctx || !out || !merge || (zero.len && !zero.data) || (arg_len && !arg))
    return FL_ERR(FL_EINVAL, "fl_accumulator_create: NULL argument");
  return accumulator_create(ctx, ACC_CUSTOM, zero, merge, arg, arg_len, out);
}

uint64_t fl_accumulator_id(const fl_accumulator *acc) { return acc ? acc->id : 0; }

/* Merges `add` into `into` by the accumulator's rule. */
static fl_status acc_merge(acc_kind kind, fl_reduce_fn merge, const void *arg, fl_buf *into,
                           fl_bytes add) {
  if (kind == ACC_I64) {
    int64_t v = fl_i64(fl_buf_bytes(into)) + fl_i64(add);
    memcpy(into->data, &v, 8);
    return FL_OK;
  }
  if (kind == ACC_F64) {
    double v = fl_f64(fl_buf_bytes(into)) + fl_f64(add);
    memcpy(into->data, &v, 8);
    return FL_OK;
  }
  fl_buf out = FL_BUF_INIT;
  fl_status s = merge(fl_buf_bytes(into), add, &out, arg);
  if (s != FL_OK) {
    fl_buf_free(&out);
    char name[256];
    common_symbol_name((const void *)merge, name, sizeof name);
    return common_error_wrap(s, "accumulator merge function '%s' failed: ", name);
  }
  fl_buf_free(into);
  *into = out;
  return FL_OK;
}

/* A new update of the task: `prefix` (a list's length header, or empty) then `value`. */
static fl_status task_append_update(rdd_task *task, uint64_t id, fl_bytes prefix, fl_bytes value) {
  if (task->num_acc_updates == task->cap_acc_updates) {
    uint32_t cap = task->cap_acc_updates ? task->cap_acc_updates * 2 : 4;
    rdd_acc_update *grown = common_realloc(task->acc_updates, cap * sizeof *grown);
    if (!grown) return fl_set_error(FL_ENOMEM, "cannot record an accumulator update");
    task->acc_updates = grown;
    task->cap_acc_updates = cap;
  }
  rdd_acc_update *u = &task->acc_updates[task->num_acc_updates];
  u->id = id;
  u->value = (fl_buf)FL_BUF_INIT;
  fl_status st = fl_buf_append(&u->value, prefix.data, prefix.len);
  if (st == FL_OK) st = fl_buf_append(&u->value, value.data, value.len);
  if (st == FL_OK) task->num_acc_updates++;
  else fl_buf_free(&u->value);
  return st;
}

static fl_status accumulator_add(uint64_t id, acc_kind want, fl_bytes value) {
  rdd_task *task = rdd_task_current();
  if (!task) return fl_set_error(FL_ESTATE, "accumulator %llu: add called outside a task",
                                 (unsigned long long)id);
  rdd_shared *s = task->ctx->shared;
  shared_entry *e = shared_lock_entry(s, id, ENTRY_ACCUMULATOR);
  acc_kind kind = want;
  fl_reduce_fn merge = NULL;
  const void *arg = NULL;
  bool as_list = false; /* custom values kept for the client to merge */
  if (e) {
    kind = e->kind;
    merge = e->merge;
    arg = e->arg;
    FL_PCHECK(pthread_mutex_unlock(&s->lock));
  } else if (s->fetch) {
    as_list = want == ACC_CUSTOM;
  } else {
    return fl_set_error(FL_ENOENT, "no accumulator with id %llu", (unsigned long long)id);
  }
  if (kind != want)
    return fl_set_error(FL_EINVAL, "accumulator %llu is of another kind", (unsigned long long)id);
  uint8_t head[COMMON_VARINT_MAX];
  size_t head_len = as_list ? common_varint_put(head, value.len) : 0;

  for (uint32_t i = 0; i < task->num_acc_updates; i++)
    if (task->acc_updates[i].id == id) {
      fl_buf *v = &task->acc_updates[i].value;
      if (!as_list) return acc_merge(kind, merge, arg, v, value);
      fl_status st = fl_buf_append(v, head, head_len);
      return st == FL_OK ? fl_buf_append(v, value.data, value.len) : st;
    }
  return task_append_update(task, id, fl_bytes_of(head, head_len), value);
}

fl_status fl_accumulator_add_i64(uint64_t id, int64_t v) {
  return accumulator_add(id, ACC_I64, fl_bytes_of(&v, 8));
}

fl_status fl_accumulator_add_f64(uint64_t id, double v) {
  return accumulator_add(id, ACC_F64, fl_bytes_of(&v, 8));
}

fl_status fl_accumulator_add(uint64_t id, fl_bytes value) {
  if (value.len && !value.data) return fl_set_error(FL_EINVAL, "fl_accumulator_add: NULL data");
  return accumulator_add(id, ACC_CUSTOM, value);
}

void rdd_task_commit_accumulators(rdd_task *task) {
  rdd_shared *s = task->ctx->shared;
  for (uint32_t i = 0; i < task->num_acc_updates; i++) {
    shared_entry *e = shared_lock_entry(s, task->acc_updates[i].id, ENTRY_ACCUMULATOR);
    if (!e) continue; /* destroyed meanwhile: nobody can read it any more */
    /* A failing user merge here cannot fail the finished task; its message is kept on
     * stderr so that the loss is visible. */
    if (acc_merge(e->kind, e->merge, e->arg, &e->value, fl_buf_bytes(&task->acc_updates[i].value)) != FL_OK)
      fprintf(stderr, "flint: %s\n", fl_last_error());
    FL_PCHECK(pthread_mutex_unlock(&s->lock));
  }
}

fl_status rdd_shared_merge_update(rdd_shared *s, uint64_t id, fl_bytes update) {
  shared_entry *e = shared_lock_entry(s, id, ENTRY_ACCUMULATOR);
  if (!e) return FL_OK; /* destroyed meanwhile: nobody can read it any more */
  fl_status st = FL_OK;
  if (e->kind != ACC_CUSTOM) {
    if (update.len != 8) st = FL_ERR(FL_EPROTO, "accumulator %llu: update of %zu bytes, not 8",
                                     (unsigned long long)id, update.len);
    else st = acc_merge(e->kind, NULL, NULL, &e->value, update);
  } else { /* a list of values, merged in order */
    rdd_cursor c = {update.data, update.data + update.len};
    fl_bytes v;
    while (st == FL_OK && c.p < c.end) {
      if (!rdd_cursor_next(&c, &v))
        st = FL_ERR(FL_EPROTO, "accumulator %llu: malformed update", (unsigned long long)id);
      else st = acc_merge(e->kind, e->merge, e->arg, &e->value, v);
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&s->lock));
  return st;
}

static fl_status accumulator_read(fl_accumulator *acc, acc_kind want, fl_buf *out) {
  shared_entry *e = shared_lock_entry(acc->ctx->shared, acc->id, ENTRY_ACCUMULATOR);
  if (!e) return FL_ERR(FL_ENOENT, "accumulator %llu was destroyed", (unsigned long long)acc->id);
  fl_status s = e->kind == want ? FL_OK
                                : FL_ERR(FL_EINVAL, "accumulator %llu is of another kind",
                                         (unsigned long long)acc->id);
  if (s == FL_OK) {
    out->len = 0;
    s = fl_buf_append(out, e->value.data, e->value.len);
  }
  FL_PCHECK(pthread_mutex_unlock(&acc->ctx->shared->lock));
  return s;
}

fl_status fl_accumulator_value_i64(fl_accumulator *acc, int64_t *out) {
  common_error_clear();
  if (!acc || !out) return FL_ERR(FL_EINVAL, "fl_accumulator_value_i64: NULL argument");
  fl_buf b = FL_BUF_INIT;
  fl_status s = accumulator_read(acc, ACC_I64, &b);
  if (s == FL_OK) *out = fl_i64(fl_buf_bytes(&b));
  fl_buf_free(&b);
  return s;
}

fl_status fl_accumulator_value_f64(fl_accumulator *acc, double *out) {
  common_error_clear();
  if (!acc || !out) return FL_ERR(FL_EINVAL, "fl_accumulator_value_f64: NULL argument");
  fl_buf b = FL_BUF_INIT;
  fl_status s = accumulator_read(acc, ACC_F64, &b);
  if (s == FL_OK) *out = fl_f64(fl_buf_bytes(&b));
  fl_buf_free(&b);
  return s;
}

fl_status fl_accumulator_value(fl_accumulator *acc, fl_buf *out) {
  common_error_clear();
  if (!acc || !out) return FL_ERR(FL_EINVAL, "fl_accumulator_value: NULL argument");
  return accumulator_read(acc, ACC_CUSTOM, out);
}

void fl_accumulator_destroy(fl_accumulator *acc) {
  if (!acc) return;
  shared_remove(acc->ctx->shared, acc->id);
  common_free(acc);
}

fl_status rdd_task_add_accumulator(rdd_task *task, uint64_t id, fl_bytes value) {
  return task_append_update(task, id, fl_bytes_of(NULL, 0), value);
}

void rdd_task_clear_accumulators(rdd_task *task) {
  for (uint32_t i = 0; i < task->num_acc_updates; i++) fl_buf_free(&task->acc_updates[i].value);
  task->num_acc_updates = 0;
}
