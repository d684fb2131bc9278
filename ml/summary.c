/*
 * summary.c: count, weighted mean, variance, min and max of every column in one
 * fl_tree_aggregate, and standardization from them.
 *
 * Each block is summarized in two passes while it is in cache (its mean, then the squared
 * deviations from it), and summaries are merged with Chan et al.'s update, so that the
 * variance of columns with a large mean keeps its digits (no sum of squares minus square of
 * sums). Sparse blocks count their implicit zeros.
 */
#include <math.h>
#include <stdlib.h>

#include "ml/ml.h"

/* acc: [count, W, W2 (sum of squared weights), label_min, label_max, mean[d], m2[d],
 *       min[d], max[d]] */
#define HEAD 5
static size_t summary_len(uint32_t d) { return HEAD + 4 * (size_t)d; }

static void merge(double *acc, const double *part, uint32_t d) {
  double W = acc[1], Wb = part[1];
  if (Wb == 0 && part[0] == 0) return;
  double T = W + Wb;
  acc[0] += part[0];
  acc[2] += part[2];
  acc[3] = fmin(acc[3], part[3]);
  acc[4] = fmax(acc[4], part[4]);
  double *mean = acc + HEAD, *m2 = mean + d, *mn = m2 + d, *mx = mn + d;
  const double *bmean = part + HEAD, *bm2 = bmean + d, *bmn = bm2 + d, *bmx = bmn + d;
  for (uint32_t j = 0; j < d; j++) {
    double delta = bmean[j] - mean[j];
    if (T > 0) {
      mean[j] += delta * Wb / T;
      m2[j] += bm2[j] + delta * delta * W * Wb / T;
    }
    mn[j] = fmin(mn[j], bmn[j]);
    mx[j] = fmax(mx[j], bmx[j]);
  }
  acc[1] = T;
}

static void empty_summary(double *acc, uint32_t d) {
  memset(acc, 0, summary_len(d) * sizeof *acc);
  acc[3] = INFINITY;
  acc[4] = -INFINITY;
  for (uint32_t j = 0; j < d; j++) {
    acc[HEAD + 2 * (size_t)d + j] = INFINITY;
    acc[HEAD + 3 * (size_t)d + j] = -INFINITY;
  }
}

/* One block's summary into `part` (summary_len(d) doubles); nz is d scratch doubles. */
static void summarize_block(const fl_ml_block *b, uint32_t d, double *part, double *nz) {
  empty_summary(part, d);
  double *mean = part + HEAD, *m2 = mean + d, *mn = m2 + d, *mx = mn + d, W = 0, W2 = 0;
  for (uint32_t i = 0; i < b->rows; i++) {
    double w = b->weights ? b->weights[i] : 1.0;
    W += w;
    W2 += w * w;
    part[3] = fmin(part[3], b->labels[i]);
    part[4] = fmax(part[4], b->labels[i]);
  }
  part[0] = b->rows;
  part[1] = W;
  part[2] = W2;
  if (b->rows == 0 || W == 0) return;
  if (!b->sparse) {
    for (uint32_t i = 0; i < b->rows; i++) {
      const double *x = b->x + (size_t)i * d;
      double w = b->weights ? b->weights[i] : 1.0;
      for (uint32_t j = 0; j < d; j++) {
        mean[j] += w * x[j];
        mn[j] = fmin(mn[j], x[j]);
        mx[j] = fmax(mx[j], x[j]);
      }
    }
    for (uint32_t j = 0; j < d; j++) mean[j] /= W;
    for (uint32_t i = 0; i < b->rows; i++) {
      const double *x = b->x + (size_t)i * d;
      double w = b->weights ? b->weights[i] : 1.0;
      for (uint32_t j = 0; j < d; j++) m2[j] += w * (x[j] - mean[j]) * (x[j] - mean[j]);
    }
    return;
  }
  /* sparse: nz[j] = weight of the rows that store column j; count rows per column too */
  memset(nz, 0, d * sizeof *nz);
  uint32_t *stored = calloc(d, sizeof *stored);
  for (uint32_t i = 0; i < b->rows; i++) {
    double w = b->weights ? b->weights[i] : 1.0;
    for (uint64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
      uint32_t j = b->col[k];
      mean[j] += w * b->x[k];
      nz[j] += w;
      if (stored) stored[j]++;
      mn[j] = fmin(mn[j], b->x[k]);
      mx[j] = fmax(mx[j], b->x[k]);
    }
  }
  for (uint32_t j = 0; j < d; j++) {
    mean[j] /= W;
    m2[j] = (W - nz[j]) * mean[j] * mean[j]; /* the implicit zeros */
    if (!stored || stored[j] < b->rows) { /* some row has a zero here */
      mn[j] = fmin(mn[j], 0.0);
      mx[j] = fmax(mx[j], 0.0);
    }
  }
  free(stored);
  for (uint32_t i = 0; i < b->rows; i++) {
    double w = b->weights ? b->weights[i] : 1.0;
    for (uint64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
      double dev = b->x[k] - mean[b->col[k]];
      m2[b->col[k]] += w * dev * dev;
    }
  }
}

FL_ML_KERNEL fl_status ml_summary_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  uint32_t d;
  memcpy(&d, arg, sizeof d);
  size_t len = summary_len(d);
  double *acc = malloc((2 * len + d) * sizeof *acc);
  if (!acc) return fl_set_error(FL_ENOMEM, "out of memory");
  double *part = acc + len, *nz = part + len;
  empty_summary(acc, d);
  fl_buf scratch = FL_BUF_INIT;
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > d || (!b.sparse && b.cols != d)) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the data %u", b.cols, d);
      break;
    }
    summarize_block(&b, d, part, nz);
    merge(acc, part, d);
  }
  if (s == FL_OK) s = fl_emit(out, acc, len * sizeof *acc);
  fl_buf_free(&scratch);
  free(acc);
  return s;
}

FL_ML_KERNEL fl_status ml_summary_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  uint32_t d;
  memcpy(&d, arg, sizeof d);
  size_t len = summary_len(d) * sizeof(double);
  if (a.len != len || b.len != len) return fl_set_error(FL_EINTERNAL, "summaries of %zu and %zu bytes", a.len, b.len);
  fl_status s = fl_buf_reserve(out, len);
  if (s != FL_OK) return s;
  double *acc = (double *)out->data, *part = malloc(len);
  if (!part) return fl_set_error(FL_ENOMEM, "out of memory");
  memcpy(acc, a.data, len);
  memcpy(part, b.data, len);
  merge(acc, part, d);
  free(part);
  out->len = len;
  return FL_OK;
}

fl_status fl_ml_summarize(const fl_ml_data *data, fl_ml_summary *out) {
  if (!data || !data->blocks || !out) return fl_set_error(FL_EINVAL, "fl_ml_summarize: data and out are required");
  memset(out, 0, sizeof *out);
  uint32_t d = data->cols;
  size_t len = summary_len(d);
  double *zero = malloc(len * sizeof *zero);
  if (!zero) return fl_set_error(FL_ENOMEM, "out of memory");
  empty_summary(zero, d);
  fl_dataset *parts = NULL;
  fl_buf sum = FL_BUF_INIT;
  fl_status s = fl_map_partitions(data->blocks, ml_summary_partition, &d, sizeof d, &parts);
  if (s == FL_OK)
    s = fl_tree_aggregate(parts, fl_bytes_of(zero, len * 8), ml_summary_merge, ml_summary_merge, &d, sizeof d,
                          ml_tree_depth(parts, 0), &sum);
  fl_dataset_free(parts);
  free(zero);
  if (s == FL_OK && sum.len != len * 8) s = fl_set_error(FL_EINTERNAL, "a summary of %zu bytes", sum.len);
  double *v = s == FL_OK ? calloc(4 * (size_t)d + 1, sizeof *v) : NULL;
  if (s == FL_OK && !v) s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s != FL_OK) {
    fl_buf_free(&sum);
    return s;
  }
  const double *acc = (const double *)sum.data;
  out->count = (uint64_t)acc[0];
  out->weight_sum = acc[1];
  out->cols = d;
  out->label_min = acc[3];
  out->label_max = acc[4];
  out->mean = v;
  out->variance = v + d;
  out->min = v + 2 * (size_t)d;
  out->max = v + 3 * (size_t)d;
  double denom = acc[1] - (acc[1] > 0 ? acc[2] / acc[1] : 0); /* unbiased for reliability weights */
  for (uint32_t j = 0; j < d; j++) {
    out->mean[j] = acc[HEAD + j];
    out->variance[j] = denom > 0 ? acc[HEAD + d + j] / denom : 0.0;
    out->min[j] = acc[HEAD + 2 * (size_t)d + j];
    out->max[j] = acc[HEAD + 3 * (size_t)d + j];
    /* A constant column: the rounding of sum / W (0.1 three times over 3 is not 0.1) would
     * leave a mean a little off and a variance of 1e-33 instead of 0, and standardization
     * would then scale the column by 1e16 instead of leaving it alone. */
    if (out->min[j] == out->max[j] && acc[1] > 0) {
      out->mean[j] = out->min[j];
      out->variance[j] = 0.0;
    }
  }
  fl_buf_free(&sum);
  return FL_OK;
}

void fl_ml_summary_free(fl_ml_summary *s) {
  if (!s) return;
  free(s->mean); /* one allocation holds the four arrays */
  memset(s, 0, sizeof *s);
}

/* ---- standardization ------------------------------------------------------------------- */

/* The argument: uint32 cols, then shift[cols] and scale[cols] (in the plan itself rather
 * than a broadcast, so that a lost cached block can be made again from lineage). */

FL_ML_KERNEL fl_status ml_standardize_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  uint32_t cols;
  memcpy(&cols, arg, sizeof cols);
  double *shift = malloc((size_t)cols * (8 + 8 + 8 + 4));
  if (!shift) return fl_set_error(FL_ENOMEM, "out of memory");
  memcpy(shift, (const uint8_t *)arg + 8, 2 * (size_t)cols * 8);
  double *scale = shift + cols, *row = scale + cols;
  uint32_t *idx = (uint32_t *)(row + cols);
  fl_status s = FL_OK;
  fl_ml_block_builder *bb = NULL;
  fl_buf scratch = FL_BUF_INIT, rec_out = FL_BUF_INIT;
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > cols || (!b.sparse && b.cols != cols)) { /* shift, scale and row have cols values */
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the data %u", b.cols, cols);
      break;
    }
    if (!bb && (s = fl_ml_block_builder_create(b.sparse ? 0 : cols, b.sparse, b.weights != NULL, b.rows ? b.rows : 1,
                                               &bb)) != FL_OK)
      break;
    for (uint32_t i = 0; s == FL_OK && i < b.rows; i++) {
      double w = b.weights ? b.weights[i] : 1.0;
      if (!b.sparse) {
        for (uint32_t j = 0; j < cols; j++) row[j] = (b.x[(size_t)i * cols + j] - shift[j]) * scale[j];
        s = fl_ml_block_builder_add_dense(bb, b.labels[i], w, row);
      } else {
        uint32_t n = 0;
        for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) {
          idx[n] = b.col[k];
          row[n++] = b.x[k] * scale[b.col[k]];
        }
        s = fl_ml_block_builder_add_sparse(bb, b.labels[i], w, idx, row, n);
      }
    }
    if (s == FL_OK && (s = fl_ml_block_builder_take(bb, &rec_out)) == FL_OK && rec_out.len)
      s = fl_emit(out, rec_out.data, rec_out.len);
  }
  fl_ml_block_builder_free(bb);
  fl_buf_free(&scratch);
  fl_buf_free(&rec_out);
  free(shift);
  return s;
}

fl_status fl_ml_standardize(const fl_ml_data *data, const fl_ml_summary *sm, bool with_mean, fl_ml_data **out) {
  if (!data || !sm || !out) return fl_set_error(FL_EINVAL, "fl_ml_standardize: data, summary and out are required");
  if (sm->cols != data->cols)
    return fl_set_error(FL_EINVAL, "the summary has %u columns, the data %u", sm->cols, data->cols);
  if (with_mean && data->sparse)
    return fl_set_error(FL_EINVAL, "centering sparse data would make it dense: standardize it without the mean");
  uint32_t d = data->cols;
  size_t arg_len = 8 + 2 * (size_t)d * 8;
  uint8_t *arg = calloc(1, arg_len);
  fl_ml_data *res = calloc(1, sizeof *res);
  fl_status s = arg && res ? FL_OK : fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    memcpy(arg, &d, sizeof d);
    for (uint32_t j = 0; j < d; j++) {
      double sd = sqrt(sm->variance[j]), shift = with_mean ? sm->mean[j] : 0.0, scale = sd > 0 ? 1.0 / sd : 1.0;
      memcpy(arg + 8 + 8 * (size_t)j, &shift, 8);
      memcpy(arg + 8 + 8 * ((size_t)d + j), &scale, 8);
    }
    s = fl_map_partitions(data->blocks, ml_standardize_partition, arg, arg_len, &res->blocks);
  }
  if (s == FL_OK) s = fl_persist(res->blocks, ML_STORAGE);
  free(arg);
  if (s != FL_OK) {
    fl_ml_data_free(res);
    return s;
  }
  *res = (fl_ml_data){.blocks = res->blocks, .rows = data->rows, .cols = d, .sparse = data->sparse,
                      .weighted = data->weighted, .label_min = data->label_min, .label_max = data->label_max,
                      .labels_integer = data->labels_integer};
  s = ml_data_set_labels(res, data->label_seen); /* standardizing keeps the labels */
  if (s != FL_OK) {
    fl_ml_data_free(res);
    return s;
  }
  *out = res;
  return FL_OK;
}
