/* data.c: facts about block datasets that loaders and generators share. */
#include <math.h>
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "ml/ml.h"

/* flint runs BLAS single-threaded inside tasks and gets its parallelism from tasks: on tall,
 * narrow blocks one dsyrk per core is about 2x faster than threaded BLAS (DESIGN.md). */
__attribute__((constructor)) static void ml_single_threaded_blas(void) { openblas_set_num_threads(1); }

uint32_t ml_default_partitions(fl_context *ctx, uint32_t requested) {
  if (requested) return requested;
  uint32_t cores = fl_context_cores(ctx);
  return (cores ? cores : 1) * ML_PARTITIONS_PER_CORE;
}

/* seen: bit y + 1 for every label y that occurs, while all are integers in
 * ML_LABEL_LOW..ML_LABEL_HIGH (classes travels then; past that the set is dropped). */
typedef struct shape {
  uint64_t rows, nnz;
  uint32_t cols;
  uint8_t sparse, weighted, any, integers;
  uint8_t classes, zero[7];
  double label_min, label_max;
  uint64_t seen[FL_ML_LABEL_WORDS];
} shape;

static bool label_in_set_range(double y) { return y == floor(y) && y >= -1 && y <= 65535; }

/* seq: a block into the running shape; comb: two shapes. Both reduce_fn-shaped. */
FL_ML_KERNEL fl_status ml_shape_seq(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  shape s;
  memcpy(&s, acc.data, sizeof s);
  fl_buf scratch = FL_BUF_INIT;
  fl_ml_block b;
  fl_status st = fl_ml_block_view(rec, &scratch, &b);
  if (st == FL_OK) {
    s.rows += b.rows;
    s.nnz += b.sparse ? b.nnz : (uint64_t)b.rows * b.cols;
    if (b.cols > s.cols) s.cols = b.cols;
    s.sparse |= b.sparse;
    s.weighted |= b.weights != NULL;
    s.any = 1;
    for (uint32_t i = 0; i < b.rows; i++) {
      double y = b.labels[i];
      s.label_min = fmin(s.label_min, y);
      s.label_max = fmax(s.label_max, y);
      if (y != floor(y)) s.integers = 0;
      if (s.classes && !label_in_set_range(y)) s.classes = 0;
      if (s.classes) {
        uint32_t bit = (uint32_t)(int32_t)y + 1;
        s.seen[bit / 64] |= 1ull << (bit % 64);
      }
    }
  }
  fl_buf_free(&scratch);
  if (st != FL_OK) return st;
  out->len = 0;
  return fl_buf_append(out, &s, sizeof s);
}

FL_ML_KERNEL fl_status ml_shape_comb(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  shape x, y;
  memcpy(&x, a.data, sizeof x);
  memcpy(&y, b.data, sizeof y);
  x.rows += y.rows;
  x.nnz += y.nnz;
  if (y.cols > x.cols) x.cols = y.cols;
  x.sparse |= y.sparse;
  x.weighted |= y.weighted;
  x.any |= y.any;
  x.integers &= y.integers;
  x.label_min = fmin(x.label_min, y.label_min);
  x.label_max = fmax(x.label_max, y.label_max);
  x.classes &= y.classes;
  for (size_t w = 0; w < FL_ML_LABEL_WORDS; w++) x.seen[w] = x.classes ? x.seen[w] | y.seen[w] : 0;
  out->len = 0;
  return fl_buf_append(out, &x, sizeof x);
}

fl_status ml_data_describe(fl_ml_data *data, uint64_t *nnz) {
  shape zero;
  memset(&zero, 0, sizeof zero); /* padding too: the bytes travel */
  zero.integers = 1;
  zero.classes = 1;
  zero.label_min = INFINITY;
  zero.label_max = -INFINITY;
  fl_buf out = FL_BUF_INIT;
  fl_status s = fl_aggregate(data->blocks, (fl_bytes){(const uint8_t *)&zero, sizeof zero}, ml_shape_seq,
                             ml_shape_comb, NULL, 0, &out);
  if (s == FL_OK && out.len != sizeof(shape)) s = fl_set_error(FL_EINTERNAL, "shape of %zu bytes", out.len);
  if (s == FL_OK) {
    shape r;
    memcpy(&r, out.data, sizeof r);
    data->rows = r.rows;
    if (nnz) *nnz = r.nnz;
    if (r.cols > data->cols) data->cols = r.cols;
    data->sparse = r.sparse;
    data->weighted = r.weighted;
    data->label_min = r.label_min;
    data->label_max = r.label_max;
    data->labels_integer = r.integers;
    s = ml_data_set_labels(data, r.classes && r.any ? r.seen : NULL);
  }
  fl_buf_free(&out);
  return s;
}

fl_status ml_data_set_labels(fl_ml_data *data, const uint64_t *seen) {
  free(data->label_seen);
  data->label_seen = NULL;
  data->label_count = 0;
  if (!seen) return FL_OK;
  data->label_seen = malloc(FL_ML_LABEL_WORDS * sizeof *seen);
  if (!data->label_seen) return fl_set_error(FL_ENOMEM, "out of memory");
  memcpy(data->label_seen, seen, FL_ML_LABEL_WORDS * sizeof *seen);
  for (size_t w = 0; w < FL_ML_LABEL_WORDS; w++) data->label_count += (uint32_t)__builtin_popcountll(seen[w]);
  return FL_OK;
}

bool ml_label_seen(const uint64_t *seen, int64_t y) {
  if (y < -1 || y > 65535) return false;
  uint64_t bit = (uint64_t)(y + 1);
  return seen[bit / 64] >> (bit % 64) & 1;
}

size_t ml_format_labels(const uint64_t *seen, int64_t lo, int64_t hi, bool want, char *buf, size_t len) {
  size_t n = 0, count = 0;
  if (len) buf[0] = '\0';
  for (int64_t y = lo; y <= hi; y++) {
    if (ml_label_seen(seen, y) != want) continue;
    int64_t end = y;
    while (end < hi && ml_label_seen(seen, end + 1) == want) end++;
    int w = end > y ? snprintf(buf + n, n < len ? len - n : 0, "%s%lld..%lld", count ? ", " : "", (long long)y,
                               (long long)end)
                    : snprintf(buf + n, n < len ? len - n : 0, "%s%lld", count ? ", " : "", (long long)y);
    if (w > 0) n += (size_t)w;
    count += (size_t)(end - y + 1);
    y = end;
  }
  if (len && n >= len && len > 4) memcpy(buf + len - 4, "...", 4); /* cut short: say so */
  return count;
}

void fl_ml_data_describe_labels(const fl_ml_data *data, char *buf, size_t len) {
  if (!buf || !len) return;
  if (!data || !(data->rows > 0)) {
    snprintf(buf, len, "no labels");
  } else if (!data->label_seen) {
    snprintf(buf, len, "labels from %g to %g%s", data->label_min, data->label_max,
             data->labels_integer ? "" : ", not all integers");
  } else {
    int w = snprintf(buf, len, "%u label value%s: ", data->label_count, data->label_count == 1 ? "" : "s");
    if (w > 0 && (size_t)w < len) ml_format_labels(data->label_seen, -1, 65535, true, buf + w, len - (size_t)w);
  }
}

fl_status fl_ml_data_from_blocks(fl_dataset *blocks, uint32_t cols, fl_ml_data **out) {
  if (!blocks || !out) return fl_set_error(FL_EINVAL, "fl_ml_data_from_blocks: blocks and out are required");
  fl_ml_data *d = calloc(1, sizeof *d);
  if (!d) return fl_set_error(FL_ENOMEM, "out of memory");
  d->blocks = blocks;
  d->cols = cols;
  fl_status s = fl_cache(blocks);
  if (s == FL_OK) s = ml_data_describe(d, NULL);
  if (s != FL_OK) {
    free(d);
    return s;
  }
  *out = d;
  return FL_OK;
}
