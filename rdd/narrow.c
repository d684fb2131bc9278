/* narrow.c: transformations whose partitions depend on one parent partition (or a run of
 * them): map, flat_map, filter, map_partitions, barrier_map_partitions, sample, union,
 * coalesce, zip_with_index, key_by, map_values. Each is an iterator that pulls from its
 * parent's. Their plan codecs are at the end. */
#include <string.h>

#include "proto/plan.pb-c.h"
#include "rdd/ops.h"

struct fl_emitter {
  rdd_batch batch;
};

fl_status fl_emit(fl_emitter *out, const void *data, size_t len) {
  if (!out || (len && !data)) return fl_set_error(FL_EINVAL, "fl_emit: NULL argument");
  return rdd_batch_append(&out->batch, data, len);
}

fl_status fl_emit_reserve(fl_emitter *out, uint64_t records, size_t bytes) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_emit_reserve: NULL emitter");
  if (records > (SIZE_MAX - bytes) / COMMON_VARINT_MAX)
    return fl_set_error(FL_ELIMIT, "fl_emit_reserve: %llu records of %zu bytes", (unsigned long long)records, bytes);
  return fl_buf_reserve(&out->batch.buf, bytes + records * COMMON_VARINT_MAX);
}

/* Validates the common arguments of a transformation and makes its rdd. */
static fl_status make_narrow(const char *what, fl_dataset *in, const rdd_ops *ops,
                             void (*fn)(void), const void *arg, size_t arg_len,
                             fl_dataset **out) {
  common_error_clear();
  if (!in || !out) return FL_ERR(FL_EINVAL, "%s: NULL dataset or out", what);
  if (!fn) return FL_ERR(FL_EINVAL, "%s: function is NULL", what);
  if (arg_len && !arg) return FL_ERR(FL_EINVAL, "%s: arg_len is %zu but arg is NULL", what, arg_len);
  return rdd_create(in->ctx, ops, in->num_partitions, &in, 1, fn, ops->name, arg, arg_len, out);
}

/* The fields every iterator over one parent partition starts with (map_iter, filter_iter,
 * emit_iter). */
typedef struct parent_iter {
  fl_iter base;
  fl_iter *in;
  rdd *r;
} parent_iter;

/* Opens partition p of r's parent and a new iterator of `size` bytes over it. */
static fl_status open_over_parent(rdd *r, uint32_t p, rdd_task *task, size_t size,
                                  uint32_t (*next)(fl_iter *, fl_bytes *, uint32_t),
                                  void (*close)(fl_iter *), fl_iter **out) {
  fl_iter *in;
  fl_status s = rdd_iterate(r->parents[0], p, task, &in);
  if (s != FL_OK) return s;
  parent_iter *it = rdd_iter_new(task, size, next, close);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->in = in;
  it->r = r;
  *out = &it->base;
  return FL_OK;
}

/* ---- map, key_by, map_values, zip_with_index ------------------------------------------ */

/* Each slot of a batch has its own output buffer, so no output is copied; the buffers are
 * reused from batch to batch. */
typedef struct map_iter {
  fl_iter base;
  fl_iter *in;
  rdd *r;
  int64_t index; /* zip_with_index: the next record's index */
  fl_bytes views[RDD_ITER_BATCH];
  fl_buf outs[RDD_ITER_BATCH];
  fl_buf scratch;
} map_iter;

static void map_close(fl_iter *it) {
  map_iter *m = (map_iter *)it;
  for (uint32_t i = 0; i < RDD_ITER_BATCH; i++) fl_buf_free(&m->outs[i]);
  fl_buf_free(&m->scratch);
}

static uint32_t map_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  map_iter *m = (map_iter *)it;
  uint32_t n = m->in->next(m->in, m->views, max);
  fl_map_fn fn = (fl_map_fn)m->r->fn;
  const void *arg = m->r->arg;
  for (uint32_t i = 0; i < n; i++) {
    fl_buf *o = &m->outs[i];
    o->len = 0;
    fl_status s = fn(m->views[i], o, arg);
    if (s != FL_OK) {
      rdd_task_fn_failed(it->task, m->r, s);
      return 0;
    }
    out[i].data = o->data;
    out[i].len = o->len;
  }
  return n;
}

static uint32_t key_by_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  map_iter *m = (map_iter *)it;
  uint32_t n = m->in->next(m->in, m->views, max);
  for (uint32_t i = 0; i < n; i++) {
    m->scratch.len = m->outs[i].len = 0;
    fl_status s = ((fl_map_fn)m->r->fn)(m->views[i], &m->scratch, m->r->arg);
    if (s != FL_OK) {
      rdd_task_fn_failed(it->task, m->r, s);
      return 0;
    }
    if ((s = fl_buf_put_pair(&m->outs[i], fl_buf_bytes(&m->scratch), m->views[i])) != FL_OK) {
      rdd_task_fail(it->task, s);
      return 0;
    }
    out[i] = fl_buf_bytes(&m->outs[i]);
  }
  return n;
}

static uint32_t map_values_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  map_iter *m = (map_iter *)it;
  uint32_t n = m->in->next(m->in, m->views, max);
  for (uint32_t i = 0; i < n; i++) {
    fl_bytes key, value;
    fl_status s = fl_pair(m->views[i], &key, &value);
    if (s != FL_OK) {
      common_error_wrap(s, "map_values on partition %u: ", it->task->partition);
      rdd_task_fail(it->task, s);
      return 0;
    }
    m->scratch.len = m->outs[i].len = 0;
    if ((s = ((fl_map_fn)m->r->fn)(value, &m->scratch, m->r->arg)) != FL_OK) {
      rdd_task_fn_failed(it->task, m->r, s);
      return 0;
    }
    if ((s = fl_buf_put_pair(&m->outs[i], key, fl_buf_bytes(&m->scratch))) != FL_OK) {
      rdd_task_fail(it->task, s);
      return 0;
    }
    out[i] = fl_buf_bytes(&m->outs[i]);
  }
  return n;
}

static uint32_t zip_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  map_iter *m = (map_iter *)it;
  uint32_t n = m->in->next(m->in, m->views, max);
  for (uint32_t i = 0; i < n; i++) {
    m->outs[i].len = 0;
    int64_t index = m->index++;
    fl_status s = fl_buf_put_pair(&m->outs[i], m->views[i], fl_bytes_of(&index, 8));
    if (s != FL_OK) {
      rdd_task_fail(it->task, s);
      return 0;
    }
    out[i] = fl_buf_bytes(&m->outs[i]);
  }
  return n;
}

static fl_status map_open(rdd *r, uint32_t p, rdd_task *t, fl_iter **o) {
  return open_over_parent(r, p, t, sizeof(map_iter), map_next, map_close, o);
}
static fl_status key_by_open(rdd *r, uint32_t p, rdd_task *t, fl_iter **o) {
  return open_over_parent(r, p, t, sizeof(map_iter), key_by_next, map_close, o);
}
static fl_status map_values_open(rdd *r, uint32_t p, rdd_task *t, fl_iter **o) {
  return open_over_parent(r, p, t, sizeof(map_iter), map_values_next, map_close, o);
}

static const rdd_ops rdd_map_ops = {"map", map_open, NULL};
static const rdd_ops rdd_key_by_ops = {"key_by", key_by_open, NULL};
static const rdd_ops rdd_map_values_ops = {"map_values", map_values_open, NULL};

fl_status fl_map(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                 fl_dataset **out) {
  return make_narrow("fl_map", in, &rdd_map_ops, (void (*)(void))fn, arg, arg_len, out);
}
fl_status fl_key_by(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                    fl_dataset **out) {
  return make_narrow("fl_key_by", in, &rdd_key_by_ops, (void (*)(void))fn, arg, arg_len, out);
}
/* Keys stay where they were: the result keeps the parent's partitioner. */
static fl_status keep_partitioner(fl_status s, fl_dataset *in, fl_dataset **out) {
  if (s == FL_OK && in->partitioner) {
    rdd_partitioner_retain(in->partitioner);
    (*out)->partitioner = in->partitioner;
  }
  return s;
}

fl_status fl_map_values(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                        fl_dataset **out) {
  return keep_partitioner(
      make_narrow("fl_map_values", in, &rdd_map_values_ops, (void (*)(void))fn, arg, arg_len, out),
      in, out);
}

/* ---- filter ---------------------------------------------------------------------------- */

typedef struct filter_iter {
  fl_iter base;
  fl_iter *in;
  rdd *r;
} filter_iter;

/* Keeps the kept views of the parent's batch in place; they stay valid until the parent's
 * next call, which only our own next call makes. */
static uint32_t filter_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  filter_iter *f = (filter_iter *)it;
  fl_filter_fn fn = (fl_filter_fn)f->r->fn;
  for (;;) {
    uint32_t n = f->in->next(f->in, out, max), kept = 0;
    if (n == 0) return 0;
    for (uint32_t i = 0; i < n; i++) {
      bool keep = false;
      fl_status s = fn(out[i], &keep, f->r->arg);
      if (s != FL_OK) {
        rdd_task_fn_failed(it->task, f->r, s);
        return 0;
      }
      if (keep) out[kept++] = out[i];
    }
    if (kept > 0) return kept;
  }
}

static fl_status filter_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  return open_over_parent(r, p, task, sizeof(filter_iter), filter_next, NULL, out);
}

static const rdd_ops rdd_filter_ops = {"filter", filter_open, NULL};

fl_status fl_filter(fl_dataset *in, fl_filter_fn fn, const void *arg, size_t arg_len,
                    fl_dataset **out) {
  return keep_partitioner(
      make_narrow("fl_filter", in, &rdd_filter_ops, (void (*)(void))fn, arg, arg_len, out), in, out);
}

/* ---- flat_map and map_partitions: output emitted into a batch, then served ------------- */

typedef struct emit_iter {
  fl_iter base;
  fl_iter *in;
  rdd *r;
  uint32_t partition;
  fl_emitter emitter;
  rdd_cursor cursor; /* over the emitter's records not yet handed out */
  bool done;         /* map_partitions: ran already */
  fl_bytes views[RDD_ITER_BATCH];
  uint32_t in_pos, in_len; /* flat_map: input records not yet mapped */
} emit_iter;

static void emit_close(fl_iter *it) { rdd_batch_free(&((emit_iter *)it)->emitter.batch); }

static uint32_t emit_serve(emit_iter *e, fl_bytes *out, uint32_t max) {
  uint32_t n = 0;
  while (n < max && rdd_cursor_next(&e->cursor, &out[n])) n++;
  return n;
}

/* Maps input records until about `max` outputs are buffered, then hands them out. */
static uint32_t flat_map_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  emit_iter *e = (emit_iter *)it;
  fl_flat_map_fn fn = (fl_flat_map_fn)e->r->fn;
  for (;;) {
    uint32_t n = emit_serve(e, out, max);
    if (n > 0) return n;
    e->emitter.batch.buf.len = 0;
    e->emitter.batch.count = 0;
    while (e->emitter.batch.count < max) {
      if (e->in_pos == e->in_len) {
        e->in_pos = 0;
        e->in_len = e->in->next(e->in, e->views, RDD_ITER_BATCH);
        if (e->in_len == 0) break;
      }
      fl_status s = fn(e->views[e->in_pos++], &e->emitter, e->r->arg);
      if (s != FL_OK) {
        rdd_task_fn_failed(it->task, e->r, s);
        return 0;
      }
    }
    if (e->emitter.batch.count == 0) return 0;
    e->cursor.p = e->emitter.batch.buf.data;
    e->cursor.end = e->emitter.batch.buf.data + e->emitter.batch.buf.len;
  }
}

/* Runs the function over the whole partition once; false after a failure. */
static bool map_partitions_run(emit_iter *e) {
  if (e->done) return true;
  e->done = true;
  fl_status s = e->r->ops == &rdd_barrier_ops_table
                    ? rdd_barrier_call(e->r, e->base.task, e->in, &e->emitter)
                    : ((fl_map_partitions_fn)e->r->fn)(e->partition, e->in, &e->emitter, e->r->arg);
  if (e->base.task->status != FL_OK) return false; /* an upstream failure wins */
  if (s != FL_OK) {
    rdd_task_fn_failed(e->base.task, e->r, s);
    return false;
  }
  e->cursor.p = e->emitter.batch.buf.data;
  e->cursor.end = e->emitter.batch.buf.data + e->emitter.batch.buf.len;
  return true;
}

static uint32_t map_partitions_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  emit_iter *e = (emit_iter *)it;
  return map_partitions_run(e) ? emit_serve(e, out, max) : 0;
}

static bool map_partitions_take(fl_iter *it, rdd_batch *out) {
  emit_iter *e = (emit_iter *)it;
  if (e->done && e->cursor.p != e->emitter.batch.buf.data) return false; /* some were read */
  if (map_partitions_run(e)) {
    *out = e->emitter.batch;
    e->emitter.batch = (rdd_batch){FL_BUF_INIT, 0};
    e->cursor.p = e->cursor.end = NULL;
  }
  return true;
}

static fl_status open_emitting(rdd *r, uint32_t p, rdd_task *task, fl_iter **out,
                               uint32_t (*next)(fl_iter *, fl_bytes *, uint32_t)) {
  fl_status s = open_over_parent(r, p, task, sizeof(emit_iter), next, emit_close, out);
  if (s == FL_OK) ((emit_iter *)*out)->partition = p;
  return s;
}

static fl_status flat_map_open(rdd *r, uint32_t p, rdd_task *t, fl_iter **o) {
  return open_emitting(r, p, t, o, flat_map_next);
}
static fl_status map_partitions_open(rdd *r, uint32_t p, rdd_task *t, fl_iter **o) {
  fl_status s = open_emitting(r, p, t, o, map_partitions_next);
  if (s == FL_OK) (*o)->take = map_partitions_take;
  return s;
}

static const rdd_ops rdd_flat_map_ops = {"flat_map", flat_map_open, NULL};
static const rdd_ops rdd_map_partitions_ops = {"map_partitions", map_partitions_open, NULL};

fl_status fl_flat_map(fl_dataset *in, fl_flat_map_fn fn, const void *arg, size_t arg_len,
                      fl_dataset **out) {
  return make_narrow("fl_flat_map", in, &rdd_flat_map_ops, (void (*)(void))fn, arg, arg_len, out);
}
fl_status fl_map_partitions(fl_dataset *in, fl_map_partitions_fn fn, const void *arg,
                            size_t arg_len, fl_dataset **out) {
  return make_narrow("fl_map_partitions", in, &rdd_map_partitions_ops, (void (*)(void))fn, arg,
                     arg_len, out);
}

/* ---- barrier_map_partitions: map_partitions run by a barrier stage (rdd/barrier.c) ------ */

static void barrier_destroy(rdd *r) { common_free(r->state); }

const rdd_ops rdd_barrier_ops_table = {"barrier_map_partitions", map_partitions_open, barrier_destroy};

fl_status fl_barrier_map_partitions(fl_dataset *in, fl_barrier_fn fn, const void *arg, size_t arg_len,
                                   const fl_barrier_options *options, fl_dataset **out) {
  rdd_barrier_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "out of memory");
  if (options) {
    st->gpu = options->gpu;
    st->on_report = options->on_report;
    st->user = options->user;
  }
  fl_dataset *made = NULL;
  fl_status s = make_narrow("fl_barrier_map_partitions", in, &rdd_barrier_ops_table, (void (*)(void))fn, arg,
                            arg_len, &made);
  if (s != FL_OK) {
    common_free(st);
    return s;
  }
  made->state = st;
  *out = made;
  return FL_OK;
}

/* ---- sample ---------------------------------------------------------------------------- */

/* The dataset's argument blob. */
typedef struct sample_args {
  bool with_replacement;
  double fraction;
  uint64_t seed;
} sample_args;

typedef struct sample_iter {
  fl_iter base;
  fl_iter *in;
  sample_args args;
  common_rng rng;
  fl_bytes views[RDD_ITER_BATCH];
  uint32_t in_pos, in_len;
  uint32_t repeats_left; /* with replacement: copies of views[in_pos - 1] still owed */
} sample_iter;

static uint32_t sample_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  sample_iter *s = (sample_iter *)it;
  uint32_t n = 0;
  while (n < max) {
    if (s->repeats_left > 0) {
      out[n++] = s->views[s->in_pos - 1];
      s->repeats_left--;
      continue;
    }
    if (s->in_pos == s->in_len) {
      /* Refilling invalidates the views handed out in this call: stop here if any were. */
      if (n > 0) break;
      s->in_pos = 0;
      s->in_len = s->in->next(s->in, s->views, RDD_ITER_BATCH);
      if (s->in_len == 0) break;
    }
    fl_bytes rec = s->views[s->in_pos++];
    if (!s->args.with_replacement) {
      if (common_rng_uniform(&s->rng) < s->args.fraction) out[n++] = rec;
    } else {
      s->repeats_left = common_rng_poisson(&s->rng, s->args.fraction);
    }
  }
  return n;
}

static fl_status sample_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  fl_iter *in;
  fl_status st = rdd_iterate(r->parents[0], p, task, &in);
  if (st != FL_OK) return st;
  sample_iter *it = rdd_iter_new(task, sizeof *it, sample_next, NULL);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->in = in;
  memcpy(&it->args, r->arg, sizeof it->args);
  /* One stream per partition, so a retried or recomputed partition samples the same. */
  common_rng_seed(&it->rng, common_hash64(it->args.seed) ^ common_hash64(p + 1));
  *out = &it->base;
  return FL_OK;
}

static const rdd_ops rdd_sample_ops = {"sample", sample_open, NULL};

fl_status fl_sample(fl_dataset *in, bool with_replacement, double fraction, uint64_t seed,
                    fl_dataset **out) {
  common_error_clear();
  if (!(fraction >= 0) || (!with_replacement && fraction > 1))
    return FL_ERR(FL_EINVAL, "fl_sample: fraction %g must be in [0, 1] (or >= 0 with replacement)",
                  fraction);
  if (!in || !out) return FL_ERR(FL_EINVAL, "fl_sample: NULL dataset or out");
  sample_args args = {with_replacement, fraction, seed};
  return rdd_create(in->ctx, &rdd_sample_ops, in->num_partitions, &in, 1, NULL, "sample", &args,
                    sizeof args, out);
}

/* ---- union and coalesce: partitions mapped onto parent partitions ---------------------- */

static fl_status union_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  rdd *a = r->parents[0];
  if (p < a->num_partitions) return rdd_iterate(a, p, task, out);
  return rdd_iterate(r->parents[1], p - a->num_partitions, task, out);
}

static const rdd_ops rdd_union_ops = {"union", union_open, NULL};

fl_status fl_union(fl_dataset *a, fl_dataset *b, fl_dataset **out) {
  common_error_clear();
  if (!a || !b || !out) return FL_ERR(FL_EINVAL, "fl_union: NULL argument");
  if (a->ctx != b->ctx) return FL_ERR(FL_EINVAL, "fl_union: datasets of different contexts");
  if ((uint64_t)a->num_partitions + b->num_partitions > UINT32_MAX)
    return FL_ERR(FL_ELIMIT, "fl_union: too many partitions");
  rdd *parents[2] = {a, b};
  return rdd_create(a->ctx, &rdd_union_ops, a->num_partitions + b->num_partitions, parents, 2, NULL,
                    "union", NULL, 0, out);
}

/* Coalesced partition p reads parent partitions [lo(p), lo(p+1)) one after another. */
typedef struct coalesce_iter {
  fl_iter base;
  rdd *parent;
  uint32_t next_part, end_part;
  fl_iter *in;
} coalesce_iter;

static uint32_t coalesce_lo(uint32_t parent_parts, uint32_t parts, uint32_t p) {
  return (uint32_t)((uint64_t)parent_parts * p / parts);
}

static uint32_t coalesce_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  coalesce_iter *c = (coalesce_iter *)it;
  for (;;) {
    if (c->in) {
      uint32_t n = c->in->next(c->in, out, max);
      if (n > 0) return n;
    }
    if (it->task->status != FL_OK || c->next_part >= c->end_part) return 0;
    if (rdd_iterate(c->parent, c->next_part++, it->task, &c->in) != FL_OK) return 0;
  }
}

static fl_status coalesce_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  coalesce_iter *it = rdd_iter_new(task, sizeof *it, coalesce_next, NULL);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->parent = r->parents[0];
  it->next_part = coalesce_lo(it->parent->num_partitions, r->num_partitions, p);
  it->end_part = coalesce_lo(it->parent->num_partitions, r->num_partitions, p + 1);
  *out = &it->base;
  return FL_OK;
}

static const rdd_ops rdd_coalesce_ops = {"coalesce", coalesce_open, NULL};

fl_status fl_coalesce(fl_dataset *in, uint32_t num_partitions, fl_dataset **out) {
  common_error_clear();
  if (!in || !out) return FL_ERR(FL_EINVAL, "fl_coalesce: NULL argument");
  if (num_partitions == 0) return FL_ERR(FL_EINVAL, "fl_coalesce: num_partitions must be > 0");
  /* Without a shuffle a coalesce can only merge partitions, as in Spark. */
  uint32_t parts = num_partitions < in->num_partitions ? num_partitions : in->num_partitions;
  return rdd_create(in->ctx, &rdd_coalesce_ops, parts, &in, 1, NULL, "coalesce", NULL, 0, out);
}

/* ---- zip_with_index -------------------------------------------------------------------- */

static fl_status zip_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  fl_status s = open_over_parent(r, p, task, sizeof(map_iter), zip_next, map_close, out);
  if (s == FL_OK) ((map_iter *)*out)->index = ((const int64_t *)r->state)[p];
  return s;
}

static void zip_destroy(rdd *r) { common_free(r->state); }

static const rdd_ops rdd_zip_with_index_ops = {"zip_with_index", zip_open, zip_destroy};

fl_status fl_zip_with_index(fl_dataset *in, fl_dataset **out) {
  common_error_clear();
  if (!in || !out) return FL_ERR(FL_EINVAL, "fl_zip_with_index: NULL argument");
  uint32_t n = in->num_partitions;
  fl_buf *counts = common_calloc(n ? n : 1, sizeof *counts);
  int64_t *starts = common_calloc(n ? n : 1, sizeof *starts);
  fl_status status = FL_OK;
  if (!counts || !starts) {
    status = FL_ERR(FL_ENOMEM, "fl_zip_with_index: out of memory");
    goto cleanup;
  }
  rdd_action count = {.kind = RDD_ACTION_COUNT};
  if (n) FL_CHECK(rdd_run_job(in, NULL, n, &count, counts));
  int64_t sum = 0;
  for (uint32_t p = 0; p < n; p++) {
    starts[p] = sum;
    sum += (int64_t)fl_i64(fl_buf_bytes(&counts[p]));
  }
  rdd *r;
  FL_CHECK(rdd_create(in->ctx, &rdd_zip_with_index_ops, n, &in, 1, NULL, "zip_with_index", NULL, 0, &r));
  r->state = starts;
  starts = NULL;
  *out = r;
cleanup:
  if (counts)
    for (uint32_t p = 0; p < n; p++) fl_buf_free(&counts[p]);
  common_free(counts);
  common_free(starts);
  return status;
}

/* ---- plan codecs --------------------------------------------------------------------------- */

static fl_status sample_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                               void **state) {
  sample_args a;
  if (m->arg.len != sizeof a) return rdd_plan_bad(d, "sample arguments of %zu bytes", m->arg.len);
  memcpy(&a, m->arg.data, sizeof a);
  uint8_t flag;
  memcpy(&flag, m->arg.data + offsetof(sample_args, with_replacement), 1);
  if (flag > 1 || !(a.fraction >= 0) || (!a.with_replacement && a.fraction > 1) || a.fraction > 1e9)
    return rdd_plan_bad(d, "sample fraction %g", a.fraction);
  return FL_OK;
}

static fl_status zip_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  m->n_starts = r->num_partitions;
  m->starts = r->state;
  return FL_OK;
}

static fl_status zip_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                            void **state) {
  if (m->n_starts != m->num_partitions)
    return rdd_plan_bad(d, "%zu starts for %u partitions", m->n_starts, m->num_partitions);
  int64_t *starts = common_memdup(m->starts, (m->n_starts ? m->n_starts : 1) * sizeof *starts);
  if (!starts) return FL_ERR(FL_ENOMEM, "cannot decode zip_with_index");
  *state = starts;
  return FL_OK;
}

/* Plans carry gpu alone: on_report and user live only where the dataset was made. */
static fl_status barrier_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  m->barrier = true;
  m->barrier_gpu = r->state && ((const rdd_barrier_state *)r->state)->gpu;
  return FL_OK;
}

static fl_status barrier_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                                void **state) {
  rdd_barrier_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a barrier dataset");
  st->gpu = m->barrier_gpu;
  *state = st;
  return FL_OK;
}

#define NARROW_FN_CODEC(ops) {&(ops), RDD_SHAPE_FN, RDD_PLAN_ARG, NULL, NULL, NULL, NULL, NULL}
const rdd_op_codec rdd_narrow_codecs[] = {
    NARROW_FN_CODEC(rdd_map_ops),
    NARROW_FN_CODEC(rdd_key_by_ops),
    NARROW_FN_CODEC(rdd_map_values_ops),
    NARROW_FN_CODEC(rdd_filter_ops),
    NARROW_FN_CODEC(rdd_flat_map_ops),
    NARROW_FN_CODEC(rdd_map_partitions_ops),
    {&rdd_barrier_ops_table, RDD_SHAPE_FN, RDD_PLAN_ARG | RDD_PLAN_BARRIER, NULL, barrier_encode,
     barrier_decode, common_free, NULL},
    {&rdd_sample_ops, RDD_SHAPE_UNARY, RDD_PLAN_ARG, NULL, NULL, sample_decode, NULL, NULL},
    {&rdd_zip_with_index_ops, RDD_SHAPE_UNARY, RDD_PLAN_STARTS, NULL, zip_encode, zip_decode, common_free,
     NULL},
    {&rdd_union_ops, RDD_SHAPE_UNION, 0, NULL, NULL, NULL, NULL, NULL},
    {&rdd_coalesce_ops, RDD_SHAPE_COALESCE, 0, NULL, NULL, NULL, NULL, NULL},
    {NULL},
};
