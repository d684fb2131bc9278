/*
 * gpu/parallel/compress_powersgd.c: PowerSGD (Vogels et al. 2019) with error feedback, as
 * PyTorch's powerSGD_hook, a hook of gpu/parallel/compress.h.
 *
 * Each parameter of a bucket is a rows x cols matrix M (a weight [d0, d1, ...] is d0 x (d1 x
 * ...)). One of rank r' = min(R, rows, cols) is compressed when rows x cols >= min_rate x r' x
 * (rows + cols) (it saves bytes); vectors and the others go uncompressed. Every step:
 *   1. the uncompressed parameters, packed, in one allreduce (averaged);
 *   2. for each compressed one, M = g + e and P = M Q (rows x r'), Q its cols x r' matrix
 *      from the step before (the warm start; at first seeded normal values, the same on every
 *      rank); all the bucket's P in one allreduce (summed);
 *   3. each P orthonormalised (Gram-Schmidt; a column that vanishes stays zero);
 *   4. Q = M^T P, all the bucket's in one allreduce (averaged): the estimate is P Q^T, the
 *      mean of the ranks' projections P P^T M, and Q is kept for the next step;
 *   5. e = M - P Q^T, against the averaged estimate, as Vogels et al. and PyTorch take it: what
 *      this rank was given and the update did not carry. A residual against the rank's own
 *      projection (M - P P^T M) keeps the same sum over ranks, but trained the MLP at rank 1
 *      and lr 0.1 into a dead network within an epoch, where this one trains.
 * Bytes: 4 x (the uncompressed elements + the sum of (rows + cols) x r'). With r' = min(rows,
 * cols) P spans the sum of the ranks' M and the result is the exact average (the test's
 * check; min_rate 0 forces compression there); the residuals then add up to zero. Products by OpenBLAS's cblas_sgemm.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/compress.h"

typedef struct psgd_matrix {
  size_t at;        /* offset into the bucket */
  size_t rows, cols, r;
  size_t p_at, q_at; /* offsets into the packed P and Q buffers */
} psgd_matrix;

typedef struct psgd_state {
  size_t n;
  int world;
  psgd_matrix *mats;
  size_t nmats;
  size_t *plain_at, *plain_len; /* the uncompressed parameters */
  size_t nplain, plain_total;
  size_t p_total, q_total;
  float *residual; /* n (0 outside the compressed matrices) */
  float *plain;    /* plain_total */
  float *p;        /* p_total */
  float *q;        /* q_total: the warm start, kept across steps */
  float *qnew;     /* q_total */
  uint64_t steps;
} psgd_state;

static void psgd_destroy(void *vs) {
  psgd_state *s = vs;
  if (!s) return;
  common_free(s->mats);
  common_free(s->plain_at);
  common_free(s->residual);
  common_free(s->plain);
  common_free(s->p);
  common_free(s->q);
  common_free(s->qnew);
  common_free(s);
}

/* Seeded standard normal values (splitmix64 and Box-Muller): every rank makes the same Q. */
static void fill_normal(float *x, size_t n, size_t stride, uint64_t seed) {
  uint64_t st = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (size_t i = 0; i < n; i += 2) {
    double u[2];
    for (int j = 0; j < 2; j++) {
      uint64_t z = (st += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      u[j] = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
    }
    double rad = sqrt(-2 * log(u[0])), th = 6.283185307179586 * u[1];
    x[i * stride] = (float)(rad * cos(th));
    if (i + 1 < n) x[(i + 1) * stride] = (float)(rad * sin(th));
  }
}

static fl_status psgd_create(const compress_spec *spec, const compress_bucket *b, int world, void **out) {
  psgd_state *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory for PowerSGD's state");
  s->n = b->n;
  s->world = world;
  size_t np = b->nparams ? b->nparams : 1;
  s->mats = common_malloc(np * sizeof *s->mats);
  s->plain_at = common_malloc(2 * np * sizeof(size_t));
  if (!s->mats || !s->plain_at) goto oom;
  s->plain_len = s->plain_at + np;
  for (size_t j = 0; j < b->nparams; j++) {
    const compress_param *pa = &b->params[j];
    size_t rows = pa->rows, cols = pa->cols, at = pa->offset - b->offset;
    size_t r = spec->rank < rows ? spec->rank : rows;
    if (r > cols) r = cols;
    bool matrix = rows > 1 && cols > 1;
    if (matrix && (double)rows * (double)cols >= spec->min_rate * (double)r * (double)(rows + cols)) {
      s->mats[s->nmats++] = (psgd_matrix){.at = at, .rows = rows, .cols = cols, .r = r, .p_at = s->p_total,
                                          .q_at = s->q_total};
      s->p_total += rows * r;
      s->q_total += cols * r;
    } else {
      s->plain_at[s->nplain] = at;
      s->plain_len[s->nplain++] = rows * cols;
      s->plain_total += rows * cols;
    }
  }
  s->residual = common_calloc(s->n, sizeof(float));
  s->plain = common_malloc((s->plain_total + 1) * sizeof(float));
  s->p = common_malloc((s->p_total + 1) * sizeof(float));
  s->q = common_malloc((s->q_total + 1) * sizeof(float));
  s->qnew = common_malloc((s->q_total + 1) * sizeof(float));
  if (!s->residual || !s->plain || !s->p || !s->q || !s->qnew) goto oom;
  for (size_t m = 0; m < s->nmats; m++)
    fill_normal(s->q + s->mats[m].q_at, s->mats[m].cols * s->mats[m].r, 1, b->offset + s->mats[m].at + 1);
  *out = s;
  return FL_OK;
oom:
  psgd_destroy(s);
  return FL_ERR(FL_ENOMEM, "out of memory for PowerSGD's state (%zu elements)", b->n);
}

/* A column of Q that is all zeros (the matrix's gradients were, as a frozen or unused
 * weight's) would make P, and every later Q, zero: it starts again from seeded values. Q is
 * the same on every rank after its allreduce, so every rank reseeds alike. */
static void reseed_zero_columns(float *q, size_t cols, size_t r, uint64_t seed) {
  for (size_t j = 0; j < r; j++) {
    bool zero = true;
    for (size_t i = 0; i < cols && zero; i++) zero = q[i * r + j] == 0;
    if (!zero) continue;
    fill_normal(q + j, cols, r, seed + j);
  }
}

/* Orthonormal columns of the rows x r row-major matrix p (modified Gram-Schmidt, sums in
 * double). A column that is (nearly) a combination of those before becomes zero. */
static void orthonormalize(float *p, size_t rows, size_t r) {
  for (size_t j = 0; j < r; j++) {
    for (size_t k = 0; k < j; k++) {
      double dot = 0;
      for (size_t i = 0; i < rows; i++) dot += (double)p[i * r + j] * p[i * r + k];
      for (size_t i = 0; i < rows; i++) p[i * r + j] -= (float)dot * p[i * r + k];
    }
    double norm = 0;
    for (size_t i = 0; i < rows; i++) norm += (double)p[i * r + j] * p[i * r + j];
    norm = sqrt(norm);
    float inv = norm > 1e-20 ? (float)(1 / norm) : 0.0f;
    for (size_t i = 0; i < rows; i++) p[i * r + j] *= inv;
  }
}

static fl_status psgd_run(void *vs, compress_io *io, compress_bucket *b) {
  psgd_state *s = vs;
  float *v = b->data;
  fl_status st;
  /* 1. The uncompressed parameters. */
  for (size_t j = 0, o = 0; j < s->nplain; o += s->plain_len[j++])
    memcpy(s->plain + o, v + s->plain_at[j], s->plain_len[j] * sizeof(float));
  if ((st = compress_allreduce(io, s->plain, s->plain_total, FL_REDUCE_AVG)) != FL_OK) return st;
  for (size_t j = 0, o = 0; j < s->nplain; o += s->plain_len[j++])
    memcpy(v + s->plain_at[j], s->plain + o, s->plain_len[j] * sizeof(float));
  if (s->nmats == 0) return FL_OK;
  /* 2. M = g + e; P = M Q. */
  for (size_t m = 0; m < s->nmats; m++) {
    const psgd_matrix *x = &s->mats[m];
    float *mm = v + x->at, *e = s->residual + x->at;
    for (size_t i = 0; i < x->rows * x->cols; i++) mm[i] += e[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)x->rows, (int)x->r, (int)x->cols, 1.0f, mm,
                (int)x->cols, s->q + x->q_at, (int)x->r, 0.0f, s->p + x->p_at, (int)x->r);
  }
  if ((st = compress_allreduce(io, s->p, s->p_total, FL_REDUCE_SUM)) != FL_OK) return st;
  for (size_t m = 0; m < s->nmats; m++) {
    const psgd_matrix *x = &s->mats[m];
    float *mm = v + x->at, *e = s->residual + x->at, *p = s->p + x->p_at, *q = s->qnew + x->q_at;
    /* 3, 4. P orthonormal; this rank's Q = M^T P; e holds M until the estimate is known. */
    orthonormalize(p, x->rows, x->r);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)x->cols, (int)x->r, (int)x->rows, 1.0f, mm,
                (int)x->cols, p, (int)x->r, 0.0f, q, (int)x->r);
    memcpy(e, mm, x->rows * x->cols * sizeof(float));
  }
  /* The average of the ranks' P Q^T is P (mean Q)^T. */
  if ((st = compress_allreduce(io, s->qnew, s->q_total, FL_REDUCE_AVG)) != FL_OK) return st;
  memcpy(s->q, s->qnew, s->q_total * sizeof(float));
  s->steps++;
  for (size_t m = 0; m < s->nmats; m++) {
    const psgd_matrix *x = &s->mats[m];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)x->rows, (int)x->cols, (int)x->r, 1.0f, s->p + x->p_at,
                (int)x->r, s->q + x->q_at, (int)x->r, 0.0f, v + x->at, (int)x->cols);
    /* 5. e = M - P Q^T. */
    float *e = s->residual + x->at;
    for (size_t i = 0; i < x->rows * x->cols; i++) e[i] -= v[x->at + i];
    reseed_zero_columns(s->q + x->q_at, x->cols, x->r, (b->offset + x->at + 1) ^ (s->steps << 40));
  }
  return FL_OK;
}

static const float *psgd_residual(const void *vs) { return ((const psgd_state *)vs)->residual; }

const compress_hook compress_hook_powersgd = {.name = "powersgd", .create = psgd_create, .destroy = psgd_destroy,
                                              .run = psgd_run, .residual = psgd_residual};
