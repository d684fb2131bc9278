/*
 * synthetic.c: seeded data made on the executors. Each row's features and label come from
 * a counter-based generator keyed by (seed, row index), so the data does not depend on
 * the partition count, and no data travels: a partition's task makes its own rows.
 */
#include <math.h>
#include <stdlib.h>

#include "ml/ml.h"

typedef struct synth_arg {
  uint32_t kind, cols, classes, partitions, rows_per_block;
  double noise;
  uint64_t rows, seed;
} synth_arg;

static uint64_t splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *state) { return ((double)(splitmix(state) >> 11) + 0.5) * 0x1p-53; }

static double normal(uint64_t *state) {
  double u = uniform(state), v = uniform(state);
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Where row r's draws start. splitmix steps its state by 0x9e37...; starting row r at
 * seed * c + r * 0x9e37... (the step itself) made row r + 1's draws row r's shifted by one,
 * so that rows were copies of each other shifted by a column. A hash of (seed, r) puts each
 * row at an unrelated point of the sequence instead. */
static uint64_t row_stream(uint64_t seed, uint64_t r) {
  uint64_t key = seed ^ 0x2545f4914f6cdd1dull;
  key = splitmix(&key);
  uint64_t st = key + r * 0x9e3779b97f4a7c15ull;
  return splitmix(&st);
}

/* The true model: outputs x cols weights and the intercepts, from the seed alone. */
static void true_model(const synth_arg *a, uint32_t outputs, double *w, double *b) {
  uint64_t st = a->seed ^ 0x5eed5eed5eed5eedull;
  double sd = a->kind == FL_ML_SYNTH_LINEAR ? 1.0 : 2.0 / sqrt((double)a->cols);
  for (size_t i = 0; i < (size_t)outputs * a->cols; i++) w[i] = sd * normal(&st);
  for (uint32_t k = 0; k < outputs; k++) b[k] = a->kind == FL_ML_SYNTH_LINEAR ? 0.5 : 0.25 * normal(&st);
}

FL_ML_KERNEL fl_status ml_synth_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  synth_arg a;
  memcpy(&a, arg, sizeof a);
  uint32_t outputs = a.kind == FL_ML_SYNTH_LINEAR ? 1 : (a.classes == 2 ? 1 : a.classes);
  uint64_t lo = a.rows * partition / a.partitions, hi = a.rows * (partition + 1ull) / a.partitions;
  double *w = malloc(((size_t)outputs * a.cols + outputs + a.cols + outputs) * sizeof *w);
  if (!w) return fl_set_error(FL_ENOMEM, "out of memory");
  double *b = w + (size_t)outputs * a.cols, *x = b + outputs, *z = x + a.cols;
  true_model(&a, outputs, w, b);
  fl_ml_block_builder *bb = NULL;
  fl_buf rec = FL_BUF_INIT;
  bool reserved = false;
  fl_status s = fl_ml_block_builder_create(a.cols, false, false, a.rows_per_block, &bb);
  for (uint64_t r = lo; s == FL_OK && r < hi; r++) {
    uint64_t st = row_stream(a.seed, r);
    for (uint32_t j = 0; j < a.cols; j++) x[j] = normal(&st);
    double label;
    for (uint32_t k = 0; k < outputs; k++) {
      z[k] = b[k];
      for (uint32_t j = 0; j < a.cols; j++) z[k] += w[(size_t)k * a.cols + j] * x[j];
    }
    if (a.kind == FL_ML_SYNTH_LINEAR) {
      label = z[0] + a.noise * normal(&st);
    } else if (outputs == 1) {
      label = uniform(&st) < 1.0 / (1.0 + exp(-z[0])) ? 1.0 : 0.0;
    } else { /* a draw from softmax(z) */
      double top = z[0], sum = 0, u;
      for (uint32_t k = 1; k < outputs; k++) top = z[k] > top ? z[k] : top;
      for (uint32_t k = 0; k < outputs; k++) sum += (z[k] = exp(z[k] - top));
      u = uniform(&st) * sum;
      label = outputs - 1;
      for (uint32_t k = 0; k < outputs; k++) {
        if (u < z[k]) {
          label = k;
          break;
        }
        u -= z[k];
      }
    }
    s = fl_ml_block_builder_add_dense(bb, label, 1.0, x);
    if (s == FL_OK && fl_ml_block_builder_full(bb) && (s = fl_ml_block_builder_take(bb, &rec)) == FL_OK)
      s = ml_emit_block(out, &rec, r + 1 - lo, hi - lo, &reserved);
  }
  if (s == FL_OK && (s = fl_ml_block_builder_take(bb, &rec)) == FL_OK && rec.len) s = fl_emit(out, rec.data, rec.len);
  fl_ml_block_builder_free(bb);
  fl_buf_free(&rec);
  free(w);
  return s;
}

fl_status fl_ml_synthetic(fl_context *ctx, const fl_ml_synth_options *opt, fl_ml_data **out) {
  if (!ctx || !opt || !out) return fl_set_error(FL_EINVAL, "fl_ml_synthetic: ctx, opt and out are required");
  if (opt->rows == 0 || opt->cols == 0) return fl_set_error(FL_EINVAL, "synthetic data needs rows and cols (got %llu x %u)",
                                                          (unsigned long long)opt->rows, opt->cols);
  if (opt->kind != FL_ML_SYNTH_LINEAR && opt->kind != FL_ML_SYNTH_LOGISTIC)
    return fl_set_error(FL_EINVAL, "synthetic data: unknown kind %d", (int)opt->kind);
  if (opt->kind == FL_ML_SYNTH_LOGISTIC && opt->classes < 2)
    return fl_set_error(FL_EINVAL, "synthetic logistic data needs 2 or more classes (got %u)", opt->classes);
  synth_arg a = {.kind = opt->kind, .cols = opt->cols, .classes = opt->classes,
                 .partitions = ml_default_partitions(ctx, opt->partitions), .rows_per_block = opt->rows_per_block,
                 .noise = opt->noise, .rows = opt->rows, .seed = opt->seed};
  fl_ml_data *d = calloc(1, sizeof *d);
  if (!d) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_dataset *seeds = NULL;
  fl_status s = fl_range(ctx, 0, a.partitions, 1, a.partitions, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, ml_synth_partition, &a, sizeof a, &d->blocks);
  fl_dataset_free(seeds);
  if (s == FL_OK) s = fl_persist(d->blocks, ML_STORAGE);
  d->cols = opt->cols;
  if (s == FL_OK) s = ml_data_describe(d, NULL);
  if (s != FL_OK) {
    fl_ml_data_free(d);
    return s;
  }
  *out = d;
  return FL_OK;
}
