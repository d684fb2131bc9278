/*
 * objective.c: loss and gradient of a generalized linear model over cached row blocks, as
 * one dataflow stage (the Sandblaster pattern).
 *
 * The parameters (outputs x cols coefficients, then `outputs` intercepts) go out as a
 * broadcast; each task runs ml_eval_partition over its blocks and emits one record, [loss
 * sum, weight sum, gradient sums]; fl_tree_aggregate adds them up. X is read from memory
 * once: each dense block (about 1 MiB, so it stays in cache) gets its margins by one BLAS
 * call (X w, or X W' for the multinomial loss), then the rows' losses and derivatives dz,
 * then the gradient update by a second BLAS call (X' dz, or dZ' X) before the next block.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ml/ml.h"

/* Dense rows per step of the fused gradient: well inside a core's L2. */
#define ML_CHUNK_BYTES (64u << 10)
/* Rows whose exp and log are taken together, four at a time (on the stack: 4 KiB). */
#define ML_MATH_ROWS 256u

typedef struct eval_arg {
  uint32_t loss, cols, outputs, intercept;
  uint64_t params_id; /* broadcast: outputs * (cols + 1) doubles */
  double fraction;    /* < 1: a mini-batch of about this fraction of the rows */
  uint64_t seed;
} eval_arg;

/* ---- row kernels ----------------------------------------------------------------------- */

/* e[i] = exp(-|z[i] + bias|) and l[i] = log(1 + e[i]): the logistic loss's transcendental
 * part. glibc's scalar exp and log take about 14 ns a row; with AVX2 they go four at a time
 * through glibc's libmvec (within 4 ulp, 2.6 ns a row; in the fused pass part of either
 * hides behind memory stalls). Every row, the tail included, goes through the same vector
 * code, so that a row's loss does not depend on where a block boundary falls. */
static void softplus_parts_scalar(const double *z, double bias, uint32_t n, double *e, double *l) {
  for (uint32_t i = 0; i < n; i++) {
    e[i] = exp(-fabs(z[i] + bias));
    l[i] = log(1.0 + e[i]);
  }
}

#if defined(__x86_64__)
extern __m256d _ZGVdN4v_exp(__m256d x); /* libmvec, AVX2 variants */
extern __m256d _ZGVdN4v_log(__m256d x);

/* Four rows: z (without the bias) in, e and l out. */
__attribute__((target("avx2,fma"))) static inline void softplus_four(const double *z, __m256d bias, double *e,
                                                                     double *l) {
  const __m256d sign = _mm256_set1_pd(-0.0), one = _mm256_set1_pd(1.0);
  __m256d ex = _ZGVdN4v_exp(_mm256_or_pd(_mm256_add_pd(_mm256_loadu_pd(z), bias), sign)); /* exp(-|m|) */
  _mm256_storeu_pd(e, ex);
  _mm256_storeu_pd(l, _ZGVdN4v_log(_mm256_add_pd(one, ex)));
}

__attribute__((target("avx2,fma"))) static void softplus_parts_avx2(const double *z, double bias, uint32_t n,
                                                                    double *e, double *l) {
  const __m256d b = _mm256_set1_pd(bias);
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) softplus_four(z + i, b, e + i, l + i);
  if (i < n) { /* the tail, padded to four */
    double pz[4] = {0, 0, 0, 0}, pe[4], pl[4];
    memcpy(pz, z + i, (n - i) * sizeof *pz);
    softplus_four(pz, b, pe, pl);
    memcpy(e + i, pe, (n - i) * sizeof *pe);
    memcpy(l + i, pl, (n - i) * sizeof *pl);
  }
}
#endif

static void softplus_parts(const double *z, double bias, uint32_t n, double *e, double *l) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    softplus_parts_avx2(z, bias, n, e, l);
    return;
  }
#endif
  softplus_parts_scalar(z, bias, n, e, l);
}

static inline bool sampled(const eval_arg *a, uint32_t partition, uint64_t block, uint32_t row) {
  if (a->fraction >= 1.0) return true;
  uint64_t z = a->seed ^ ((uint64_t)partition << 40) ^ (block << 20) ^ row;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1p-53 < a->fraction;
}

/* The rows' losses, given their margins in z (without the bias): adds the weighted loss,
 * weight and derivative sums to acc[0], acc[1] and *dsum, and leaves wt * dloss/dmargin in
 * z. Branch-free: labels and margin signs are random, and mispredicted branches cost more
 * than exp and log. False at a label the loss does not take (*bad names it). Inlined with
 * constant flags, so the common case (no weights, every row) carries neither test. */
static inline __attribute__((always_inline)) bool row_losses_as(const eval_arg *a, const fl_ml_block *b, uint32_t lo,
                                                                uint32_t hi, double bias, double *restrict z,
                                                                double *acc, double *dsum, uint32_t partition,
                                                                uint64_t block, double *bad, const bool logistic,
                                                                const bool weighted, const bool sample) {
  const double *restrict labels = b->labels, *restrict weights = b->weights;
  double L = 0, W = 0, D = 0;
  bool ok = true;
  for (uint32_t s = lo; s < hi; s += ML_MATH_ROWS) {
    uint32_t end = hi - s < ML_MATH_ROWS ? hi : s + ML_MATH_ROWS;
    double ev[ML_MATH_ROWS], lv[ML_MATH_ROWS];
    if (logistic) softplus_parts(z + s, bias, end - s, ev, lv);
    for (uint32_t i = s; i < end; i++) {
      double y = labels[i], wt = weighted ? weights[i] : 1.0, m = z[i] + bias, loss, dm;
      if (sample) wt = sampled(a, partition, block, i) ? wt : 0.0;
      if (logistic) { /* log(1 + e^m) - y m without overflow; labels 0/1 or -1/+1 */
        ok &= (y == 1.0) | (y == 0.0) | (y == -1.0);
        /* log(1 + e) for e in (0, 1] is within 2.3e-16 of log1p(e), absolutely, at a
         * quarter of its cost (log1p was the kernel's largest part) */
        double y01 = y == 1.0 ? 1.0 : 0.0, e = ev[i - s];
        loss = (m > 0 ? m : 0.0) + lv[i - s] - y01 * m;
        dm = (m >= 0 ? 1.0 : e) / (1.0 + e) - y01;
      } else {
        dm = m - y;
        loss = 0.5 * dm * dm;
      }
      L += wt * loss;
      W += wt;
      D += wt * dm;
      z[i] = wt * dm;
    }
  }
  if (!ok)
    for (uint32_t i = lo; i < hi; i++)
      if (labels[i] != 1.0 && labels[i] != 0.0 && labels[i] != -1.0) *bad = labels[i];
  acc[0] += L;
  acc[1] += W;
  *dsum += D;
  return ok;
}

static bool row_losses(const eval_arg *a, const fl_ml_block *b, uint32_t lo, uint32_t hi, double bias, double *z,
                       double *acc, double *dsum, uint32_t partition, uint64_t block, double *bad) {
  const bool logistic = a->loss == ML_LOSS_LOGISTIC;
  if (!b->weights && a->fraction >= 1.0)
    return logistic ? row_losses_as(a, b, lo, hi, bias, z, acc, dsum, partition, block, bad, true, false, false)
                    : row_losses_as(a, b, lo, hi, bias, z, acc, dsum, partition, block, bad, false, false, false);
  return row_losses_as(a, b, lo, hi, bias, z, acc, dsum, partition, block, bad, logistic, b->weights != NULL, true);
}

/* acc: [loss, weight, grad coef (cols), grad intercept]. Margins z = X w (one dgemv over a
 * dense block), the rows' losses, then g += X' dz (a second dgemv while the block is still
 * in cache). z is scratch of b->rows. */
static fl_status block_scalar(const eval_arg *a, const fl_ml_block *b, const double *w, double *acc, double *z,
                              uint32_t partition, uint64_t block) {
  const uint32_t d = a->cols;
  const double bias = a->intercept ? w[d] : 0.0;
  double *g = acc + 2, bad = 0;
  if (b->sparse) {
    for (uint32_t i = 0; i < b->rows; i++) {
      double m = 0;
      for (uint64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) m += b->x[k] * w[b->col[k]];
      z[i] = m;
    }
    if (!row_losses(a, b, 0, b->rows, bias, z, acc, &g[d], partition, block, &bad))
      return fl_set_error(FL_EINVAL, "binary logistic regression needs labels 0/1 or -1/+1, not %g", bad);
    for (uint32_t i = 0; i < b->rows; i++)
      for (uint64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) g[b->col[k]] += z[i] * b->x[k];
    return FL_OK;
  }
  /* Dense: chunks of rows small enough to stay in the core's L2 between the two dgemvs */
  uint32_t chunk = (uint32_t)(ML_CHUNK_BYTES / (8 * (size_t)d));
  if (chunk == 0) chunk = 1;
  for (uint32_t lo = 0; lo < b->rows; lo += chunk) {
    uint32_t n = b->rows - lo < chunk ? b->rows - lo : chunk;
    const double *x = b->x + (size_t)lo * d;
    cblas_dgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)d, 1.0, x, (int)d, w, 1, 0.0, z + lo, 1);
    if (!row_losses(a, b, lo, lo + n, bias, z, acc, &g[d], partition, block, &bad))
      return fl_set_error(FL_EINVAL, "binary logistic regression needs labels 0/1 or -1/+1, not %g", bad);
    cblas_dgemv(CblasRowMajor, CblasTrans, (int)n, (int)d, 1.0, x, (int)d, z + lo, 1, 1.0, g, 1);
  }
  return FL_OK;
}

/* Softmax over K outputs. Z is scratch of rows x K. */
static fl_status block_softmax(const eval_arg *a, const fl_ml_block *b, const double *w, double *acc, double *z,
                               uint32_t partition, uint64_t block) {
  const uint32_t d = a->cols, K = a->outputs;
  const double *bias = w + (size_t)K * d;
  double *g = acc + 2, *gb = g + (size_t)K * d;
  if (!b->sparse) /* Z = X W' */
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b->rows, (int)K, (int)b->cols, 1.0, b->x, (int)b->cols,
                w, (int)d, 0.0, z, (int)K);
  for (uint32_t i = 0; i < b->rows; i++) {
    double *zi = z + (size_t)i * K, wt = b->weights ? b->weights[i] : 1.0, label = b->labels[i];
    if (!(label >= 0 && label < K && label == floor(label)))
      return fl_set_error(FL_EINVAL, "multinomial logistic regression with %u classes needs labels 0..%u, not %g", K,
                          K - 1, label);
    if (!sampled(a, partition, block, i) || wt == 0) {
      for (uint32_t k = 0; k < K; k++) zi[k] = 0; /* no part in the gradient */
      continue;
    }
    if (b->sparse) {
      for (uint32_t k = 0; k < K; k++) {
        double m = 0;
        for (uint64_t p = b->row_ptr[i]; p < b->row_ptr[i + 1]; p++) m += b->x[p] * w[(size_t)k * d + b->col[p]];
        zi[k] = m;
      }
    }
    double top = -INFINITY, sum = 0;
    for (uint32_t k = 0; k < K; k++) {
      zi[k] += a->intercept ? bias[k] : 0.0;
      if (zi[k] > top) top = zi[k];
    }
    for (uint32_t k = 0; k < K; k++) sum += exp(zi[k] - top);
    uint32_t y = (uint32_t)label;
    acc[0] += wt * (top + log(sum) - zi[y]);
    acc[1] += wt;
    for (uint32_t k = 0; k < K; k++) { /* dZ, weighted */
      zi[k] = wt * (exp(zi[k] - top) / sum - (k == y));
      gb[k] += zi[k];
    }
    if (b->sparse)
      for (uint32_t k = 0; k < K; k++)
        for (uint64_t p = b->row_ptr[i]; p < b->row_ptr[i + 1]; p++) g[(size_t)k * d + b->col[p]] += zi[k] * b->x[p];
  }
  if (!b->sparse) /* G += dZ' X */
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)K, (int)b->cols, (int)b->rows, 1.0, z, (int)K, b->x,
                (int)b->cols, 1.0, g, (int)d);
  return FL_OK;
}

/* A partition's [loss sum, weight sum, gradient sums] at w (aligned) into acc (n + 2, zeroed). */
static fl_status partition_sums(const eval_arg *ap, uint32_t partition, fl_iter *in, const double *w, double *acc) {
  const eval_arg a = *ap;
  fl_status s = FL_OK;
  double *z = NULL;
  size_t z_cap = 0;
  fl_buf scratch = FL_BUF_INIT;
  fl_bytes rec;
  uint64_t block = 0;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > a.cols) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the model %u", b.cols, a.cols);
      break;
    }
    if (!b.sparse && b.cols != a.cols) {
      s = fl_set_error(FL_EINVAL, "a dense row block has %u features, the model %u", b.cols, a.cols);
      break;
    }
    size_t z_need = (size_t)b.rows * (a.loss == ML_LOSS_SOFTMAX ? a.outputs : 1);
    if (z_need > z_cap) {
      free(z);
      z_cap = z_need;
      if (!(z = malloc(z_cap * sizeof *z))) {
        s = fl_set_error(FL_ENOMEM, "out of memory");
        break;
      }
    }
    s = a.loss == ML_LOSS_SOFTMAX ? block_softmax(&a, &b, w, acc, z, partition, block)
                                  : block_scalar(&a, &b, w, acc, z, partition, block);
    block++;
  }
  fl_buf_free(&scratch);
  free(z);
  return s;
}

FL_ML_KERNEL fl_status ml_eval_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  eval_arg a;
  memcpy(&a, arg, sizeof a);
  size_t n = (size_t)a.outputs * (a.cols + 1);
  fl_bytes params;
  fl_status s = fl_broadcast_value(a.params_id, &params);
  if (s != FL_OK) return s;
  if (params.len != n * sizeof(double))
    return fl_set_error(FL_EINTERNAL, "parameters of %zu bytes, expected %zu", params.len, n * sizeof(double));
  double *w = malloc((n + 2 + n) * sizeof *w); /* an aligned copy of the parameters, then acc */
  if (!w) return fl_set_error(FL_ENOMEM, "out of memory");
  memcpy(w, params.data, n * sizeof *w);
  double *acc = w + n;
  memset(acc, 0, (n + 2) * sizeof *acc);
  s = partition_sums(&a, partition, in, w, acc);
  if (s == FL_OK) s = fl_emit(out, acc, (n + 2) * sizeof *acc);
  free(w);
  return s;
}

fl_status ml_glm_partition_sums(const ml_glm *p, uint32_t partition, fl_iter *in, const double *w, double *acc) {
  eval_arg a = {.loss = p->loss, .cols = p->cols, .outputs = p->outputs, .intercept = p->intercept, .fraction = 1.0};
  memset(acc, 0, ((size_t)p->outputs * (p->cols + 1) + 2) * sizeof *acc);
  return partition_sums(&a, partition, in, w, acc);
}

/* Adds two vectors of doubles: the tree_aggregate of the partitions' records. */
FL_ML_KERNEL fl_status ml_add_f64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  if (a.len != b.len || a.len % 8) return fl_set_error(FL_EINTERNAL, "adding vectors of %zu and %zu bytes", a.len, b.len);
  fl_status s = fl_buf_reserve(out, a.len);
  if (s != FL_OK) return s;
  size_t n = a.len / 8;
  for (size_t i = 0; i < n; i++) {
    double x, y;
    memcpy(&x, a.data + 8 * i, 8);
    memcpy(&y, b.data + 8 * i, 8);
    x += y;
    memcpy(out->data + 8 * i, &x, 8);
  }
  out->len = a.len;
  return FL_OK;
}

uint32_t ml_tree_depth(const fl_dataset *ds, uint32_t requested) {
  if (requested) return requested;
  return fl_dataset_partitions(ds) > 32 ? 2 : 1;
}

fl_status ml_sum_partitions(fl_dataset *parts, size_t n, uint32_t depth, double *out) {
  double *zero = calloc(n ? n : 1, sizeof *zero);
  if (!zero) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_buf sum = FL_BUF_INIT;
  fl_status s = fl_tree_aggregate(parts, fl_bytes_of(zero, n * 8), ml_add_f64, ml_add_f64, NULL, 0,
                                  ml_tree_depth(parts, depth), &sum);
  if (s == FL_OK && sum.len != n * 8) s = fl_set_error(FL_EINTERNAL, "a sum of %zu bytes, expected %zu", sum.len, n * 8);
  if (s == FL_OK) memcpy(out, sum.data, n * 8);
  fl_buf_free(&sum);
  free(zero);
  return s;
}

fl_status ml_glm_eval(ml_glm *p, const double *w, double fraction, uint64_t seed, double *loss, double *grad) {
  const size_t n = (size_t)p->outputs * (p->cols + 1);
  fl_context *ctx = fl_dataset_context(p->data->blocks);
  fl_broadcast *bc = NULL;
  fl_dataset *parts = NULL;
  double *sums = malloc((n + 2) * sizeof *sums);
  if (!sums) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_status s = fl_broadcast_create(ctx, w, n * sizeof *w, &bc);
  if (s == FL_OK) {
    eval_arg a = {.loss = p->loss, .cols = p->cols, .outputs = p->outputs, .intercept = p->intercept,
                  .params_id = fl_broadcast_id(bc), .fraction = fraction > 0 && fraction < 1 ? fraction : 1.0,
                  .seed = seed};
    s = fl_map_partitions(p->data->blocks, ml_eval_partition, &a, sizeof a, &parts);
  }
  if (s == FL_OK) s = ml_sum_partitions(parts, n + 2, p->tree_depth, sums);
  fl_dataset_free(parts);
  fl_broadcast_destroy(bc);
  p->evaluations++;
  if (s == FL_OK && !(sums[1] > 0)) s = fl_set_error(FL_EEMPTY, "no rows (or only rows of weight 0) to fit");
  if (s != FL_OK) {
    free(sums);
    return s;
  }
  /* mean over the weight, plus (l2 / 2) |coef|^2 in the solver's scale */
  double W = sums[1], reg = p->l2_in_sum_units ? p->l2 / W : p->l2, sq = 0;
  const size_t ncoef = (size_t)p->outputs * p->cols;
  for (size_t i = 0; i < ncoef; i++) {
    grad[i] = sums[2 + i] / W + reg * w[i];
    sq += w[i] * w[i];
  }
  for (size_t i = ncoef; i < n; i++) grad[i] = p->intercept ? sums[2 + i] / W : 0.0;
  *loss = sums[0] / W + 0.5 * reg * sq;
  p->weight_sum = W;
  free(sums);
  return FL_OK;
}

