/* source.c: datasets made in memory: parallelize (records copied into one batch per
 * partition) and range (int64 values made on the fly), and their plan codecs. Datasets read
 * from files are in files.c. */

#include <string.h>

#include "proto/plan.pb-c.h"
#include "rdd/ops.h"

/* parallelize: the records, one batch per partition (count == num_partitions). */
typedef struct memory_state {
  rdd_batch *batches;
  uint32_t count;
} memory_state;

/* range: `total` values start, start + step, ... split evenly over the partitions. */
typedef struct range_state {
  int64_t start, step;
  uint64_t total;
} range_state;

static uint32_t partitions_or_default(fl_context *ctx, uint32_t n) {
  return n ? n : ctx->default_parallelism;
}

/* ---- parallelize: records copied into one batch per partition --------------------------- */

static fl_status memory_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  memory_state *st = r->state;
  return rdd_iter_batch(task, &st->batches[p], NULL, NULL, out);
}

static void memory_state_free(void *state) {
  memory_state *st = state;
  if (!st) return;
  for (uint32_t i = 0; i < st->count; i++) rdd_batch_free(&st->batches[i]);
  common_free(st->batches);
  common_free(st);
}

static void memory_destroy(rdd *r) { memory_state_free(r->state); }

static const rdd_ops rdd_parallelize_ops = {"parallelize", memory_open, memory_destroy};

fl_status fl_parallelize(fl_context *ctx, const fl_bytes *records, size_t count,
                         uint32_t num_partitions, fl_dataset **out) {
  common_error_clear();
  if (!ctx || !out || (count && !records))
    return FL_ERR(FL_EINVAL, "fl_parallelize: NULL argument");
  uint32_t parts = partitions_or_default(ctx, num_partitions);
  fl_status status = FL_OK;
  rdd *r = NULL;
  memory_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "fl_parallelize: out of memory");
  st->batches = common_calloc(parts, sizeof *st->batches);
  if (!st->batches) {
    common_free(st);
    return FL_ERR(FL_ENOMEM, "fl_parallelize: out of memory");
  }
  st->count = parts;
  for (uint32_t p = 0; p < parts; p++) {
    size_t lo = (size_t)((unsigned __int128)count * p / parts);
    size_t hi = (size_t)((unsigned __int128)count * (p + 1) / parts);
    for (size_t i = lo; i < hi; i++) {
      if (records[i].len && !records[i].data) {
        status = FL_ERR(FL_EINVAL, "fl_parallelize: record %zu has length %zu but no data", i,
                        records[i].len);
        goto cleanup;
      }
      FL_CHECK(rdd_batch_append(&st->batches[p], records[i].data, records[i].len));
    }
  }
  FL_CHECK(rdd_create(ctx, &rdd_parallelize_ops, parts, NULL, 0, NULL, "parallelize", NULL, 0, &r));
  r->state = st;
  *out = r;
  return FL_OK;
cleanup:
  memory_state_free(st);
  return status;
}

/* ---- range: int64 values made on the fly ------------------------------------------------ */

typedef struct range_iter {
  fl_iter base;
  int64_t value, step;
  uint64_t left;
  int64_t values[RDD_ITER_BATCH];
} range_iter;

static uint32_t range_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  range_iter *r = (range_iter *)it;
  uint32_t n = r->left < max ? (uint32_t)r->left : max;
  uint64_t v = (uint64_t)r->value, step = (uint64_t)r->step; /* wrapping, like the values */
  for (uint32_t i = 0; i < n; i++, v += step) {
    r->values[i] = (int64_t)v;
    out[i].data = (const uint8_t *)&r->values[i];
    out[i].len = 8;
  }
  r->value = (int64_t)v;
  r->left -= n;
  return n;
}

static bool range_count(fl_iter *it, uint64_t *left) {
  *left = ((range_iter *)it)->left;
  return true;
}

static fl_status range_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  range_state *st = r->state;
  uint64_t lo = (uint64_t)((unsigned __int128)st->total * p / r->num_partitions);
  uint64_t hi = (uint64_t)((unsigned __int128)st->total * (p + 1) / r->num_partitions);
  range_iter *it = rdd_iter_new(task, sizeof *it, range_next, NULL);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->base.count = range_count;
  it->value = (int64_t)((uint64_t)st->start + lo * (uint64_t)st->step);
  it->step = st->step;
  it->left = hi - lo;
  *out = &it->base;
  return FL_OK;
}

static void range_destroy(rdd *r) { common_free(r->state); }

static const rdd_ops rdd_range_ops = {"range", range_open, range_destroy};

fl_status fl_range(fl_context *ctx, int64_t start, int64_t end, int64_t step,
                   uint32_t num_partitions, fl_dataset **out) {
  common_error_clear();
  if (!ctx || !out) return FL_ERR(FL_EINVAL, "fl_range: NULL argument");
  if (step == 0) return FL_ERR(FL_EINVAL, "fl_range: step must not be 0");
  __int128 span = (__int128)end - start;
  uint64_t total = 0;
  if (step > 0 && span > 0) total = (uint64_t)((span + step - 1) / step);
  if (step < 0 && span < 0) total = (uint64_t)((-span + (-(__int128)step) - 1) / -(__int128)step);
  range_state *st = common_malloc(sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "fl_range: out of memory");
  st->start = start;
  st->step = step;
  st->total = total;
  rdd *r;
  fl_status status = rdd_create(ctx, &rdd_range_ops, partitions_or_default(ctx, num_partitions),
                                NULL, 0, NULL, "range", NULL, 0, &r);
  if (status != FL_OK) {
    common_free(st);
    return status;
  }
  r->state = st;
  *out = r;
  return FL_OK;
}

/* ---- plan codecs --------------------------------------------------------------------------- */

static fl_status memory_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  const memory_state *st = r->state;
  m->n_partitions = st->count;
  if (!(m->partitions = rdd_plan_enc_alloc(e, st->count * sizeof *m->partitions))) return rdd_plan_enc_nomem();
  for (uint32_t i = 0; i < st->count; i++)
    m->partitions[i] = (ProtobufCBinaryData){st->batches[i].buf.len, st->batches[i].buf.data};
  return FL_OK;
}

static fl_status memory_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                               void **state) {
  if (m->n_partitions != m->num_partitions)
    return rdd_plan_bad(d, "%zu partitions of data for %u partitions", m->n_partitions, m->num_partitions);
  memory_state *st = common_calloc(1, sizeof *st);
  if (!st || !(st->batches = common_calloc(m->num_partitions ? m->num_partitions : 1, sizeof *st->batches))) {
    common_free(st);
    return FL_ERR(FL_ENOMEM, "cannot decode parallelized data");
  }
  st->count = m->num_partitions;
  fl_status status = FL_OK;
  for (uint32_t i = 0; i < m->num_partitions; i++) {
    uint64_t count;
    if (!rdd_batch_count(m->partitions[i].data, m->partitions[i].len, &count)) {
      status = rdd_plan_bad(d, "partition %u of its data is malformed", i);
      goto cleanup;
    }
    FL_CHECK(fl_buf_append(&st->batches[i].buf, m->partitions[i].data, m->partitions[i].len));
    st->batches[i].count = count;
  }
  *state = st;
  return FL_OK;
cleanup:
  memory_state_free(st);
  return status;
}

static fl_status range_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  const range_state *st = r->state;
  Flint__PlanRange *range = rdd_plan_enc_alloc(e, sizeof *range);
  if (!range) return rdd_plan_enc_nomem();
  flint__plan_range__init(range);
  range->start = st->start;
  range->step = st->step;
  range->total = st->total;
  m->range = range;
  return FL_OK;
}

static fl_status range_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                              void **state) {
  if (!m->range || m->range->step == 0) return rdd_plan_bad(d, "range without a step");
  range_state *st = common_malloc(sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a range");
  *st = (range_state){m->range->start, m->range->step, m->range->total};
  *state = st;
  return FL_OK;
}

const rdd_op_codec rdd_source_codecs[] = {
    {&rdd_parallelize_ops, RDD_SHAPE_SOURCE, RDD_PLAN_PARTITIONS, NULL, memory_encode, memory_decode,
     memory_state_free, NULL},
    {&rdd_range_ops, RDD_SHAPE_SOURCE, RDD_PLAN_RANGE, NULL, range_encode, range_decode, common_free, NULL},
    {NULL},
};
