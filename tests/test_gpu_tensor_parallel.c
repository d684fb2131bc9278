/*
 * test_gpu_tensor_parallel.c: the transformer of gpu/parallel/transformer.h on the cpu device.
 *
 * - The new device operations against reference loops and finite differences.
 * - One block's input gradient and parameter gradients against central differences.
 * - Tensor parallelism: the whole model split over 1, 2 and 4 ranks (threads with host
 *   communicators) gives the single rank's weights (bit for bit: the init is keyed), logits
 *   and gradients, with dropout 0 and 0.1.
 * - Pipeline chunks: the model cut at every unit boundary, y and dy passed by hand, gives the
 *   one-chunk logits and gradients.
 * - Slots: two micro-batches in flight give the gradients of the full batch.
 * - Bad specs and calls.
 *
 * Float comparisons of whole tensors use err = max_i |got_i - want_i| / max_i |want_i| (the
 * error relative to the tensor's largest element): reordered float sums (the allreduce adds
 * partial products in another order) make errors relative to the tensor's scale, so an
 * element-wise relative error would fail spuriously on elements near zero.
 */
#include "test_util.h"

#include <math.h>
#include <pthread.h>

#include "common/common.h"
#include "gpu/comm/comm.h"
#include "gpu/device/device.h"
#include "gpu/parallel/transformer.h"

#define MAX_TP 4
#define BATCH 4

#include "gpu_test_data.h"

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* The error relative to the largest element of want (see the top of the file). */
static double rel_max_err(const float *got, const float *want, size_t n) {
  double top = 0, err = 0;
  for (size_t i = 0; i < n; i++) {
    top = fmax(top, fabs(want[i]));
    err = fmax(err, fabs((double)got[i] - want[i]));
  }
  return top > 0 ? err / top : err;
}

static void expect_close(const float *got, const float *want, size_t n, double tol,
                         const char *what, double *worst) {
  double e = rel_max_err(got, want, n);
  if (worst && e > *worst) *worst = e;
  if (e > tol) {
    fprintf(stderr, "%s: relative error %.3g over %zu elements (tolerance %.1g)\n", what, e, n, tol);
    fail();
  }
}

static bool fd_close(double fd, double analytic) {
  return fabs(fd - analytic) <= 5e-3 + 2e-2 * fmax(fabs(fd), fabs(analytic));
}

static const tfm_spec small_spec = {.seq = 6, .features = 5, .hidden = 16, .heads = 4, .ffn = 32,
                                    .blocks = 2, .classes = 3, .dropout = 0.1f, .seed = 42};

static void make_tensor(fl_tensor *t, int ndim, const int64_t *shape, const float *v) {
  *t = (fl_tensor){0};
  assert_ok(tensor_ensure(t, dev, ndim, shape));
  if (v) memcpy(t->data, v, t->numel * sizeof(float));
}

/* ---- the new device operations ----------------------------------------------------------- */

static void test_gemm_batched_matches_loop(void **state) {
  (void)state;
  int m = 3, n = 4, k = 5, batch = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 1;
      size_t sa = (size_t)lda * (ta ? k : m) + 3, sb = (size_t)ldb * (tb ? n : k) + 1,
             sc = (size_t)ldc * m + 2;
      float *a = rand_buf(sa * batch), *b = rand_buf(sb * batch), *c = rand_buf(sc * batch);
      float *want = malloc(sc * batch * sizeof *want);
      memcpy(want, c, sc * batch * sizeof *want);
      assert_ok(dev->ops->gemm_batched(dev, ta, tb, m, n, k, 0.5f, a, lda, sa, b, ldb, sb, 2.0f, c,
                                       ldc, sc, batch));
      for (int i = 0; i < batch; i++)
        for (int r = 0; r < m; r++)
          for (int col = 0; col < n; col++) {
            double s = 0;
            for (int e = 0; e < k; e++) {
              float av = ta ? a[i * sa + (size_t)e * lda + r] : a[i * sa + (size_t)r * lda + e];
              float bv = tb ? b[i * sb + (size_t)col * ldb + e] : b[i * sb + (size_t)e * ldb + col];
              s += (double)av * bv;
            }
            float *w = &want[i * sc + (size_t)r * ldc + col];
            *w = (float)(0.5 * s + 2.0 * *w);
          }
      /* Padding between matrices is left alone, so comparing the whole buffers checks that too. */
      expect_close(c, want, sc * batch, 1e-6, "gemm_batched", NULL);
      free(a);
      free(b);
      free(c);
      free(want);
    }
}

static void test_gelu_matches_formula_and_finite_differences(void **state) {
  (void)state;
  size_t n = 64;
  float *x = rand_buf(n), *y = malloc(n * sizeof *y), *dy = rand_buf(n), *dx = malloc(n * sizeof *dx);
  for (size_t i = 0; i < n; i++) x[i] *= 4;
  assert_ok(dev->ops->gelu_forward(dev, n, x, y));
  assert_ok(dev->ops->gelu_backward(dev, n, x, dy, dx));
  for (size_t i = 0; i < n; i++) {
    double v = x[i], want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    assert_true(fabs(y[i] - want) <= 1e-6 * (1 + fabs(want)));
    double e = 1e-3, vp = v + e, vm = v - e;
    double fp = 0.5 * vp * (1 + tanh(sqrt(2 / M_PI) * (vp + 0.044715 * vp * vp * vp)));
    double fm = 0.5 * vm * (1 + tanh(sqrt(2 / M_PI) * (vm + 0.044715 * vm * vm * vm)));
    double fd = dy[i] * (fp - fm) / (2 * e);
    if (fabs(fd - dx[i]) > 1e-4 * (1 + fabs(fd))) {
      fprintf(stderr, "gelu'[%zu] at %g: %g, finite difference %g\n", i, v, dx[i], fd);
      fail();
    }
  }
  free(x);
  free(y);
  free(dy);
  free(dx);
}

static void test_softmax_rows_is_stable_and_backward_matches(void **state) {
  (void)state;
  int rows = 5, cols = 7;
  size_t n = (size_t)rows * cols;
  float scale = 0.7f;
  float *x = rand_buf(n), *y = malloc(n * sizeof *y), *dy = rand_buf(n), *dx = malloc(n * sizeof *dx);
  for (int j = 0; j < cols; j++) x[j] = 1000.0f + (float)j; /* would overflow expf unshifted */
  assert_ok(dev->ops->softmax_rows_forward(dev, rows, cols, scale, x, y));
  for (int r = 0; r < rows; r++) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < cols; j++) mx = fmax(mx, scale * (double)x[r * cols + j]);
    for (int j = 0; j < cols; j++) sum += exp(scale * (double)x[r * cols + j] - mx);
    for (int j = 0; j < cols; j++) {
      double want = exp(scale * (double)x[r * cols + j] - mx) / sum;
      assert_true(isfinite(y[r * cols + j]));
      assert_true(fabs(y[r * cols + j] - want) <= 1e-6);
    }
  }
  /* Backward against central differences of L = <softmax(scale x), dy>. */
  for (int j = 0; j < cols; j++) x[j] = urand();
  assert_ok(dev->ops->softmax_rows_forward(dev, rows, cols, scale, x, y));
  assert_ok(dev->ops->softmax_rows_backward(dev, rows, cols, scale, y, dy, dx));
  float *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n; i++) {
    float keep = x[i];
    double e = 1e-2;
    x[i] = keep + (float)e;
    assert_ok(dev->ops->softmax_rows_forward(dev, rows, cols, scale, x, t));
    double lp = dot(t, dy, n);
    x[i] = keep - (float)e;
    assert_ok(dev->ops->softmax_rows_forward(dev, rows, cols, scale, x, t));
    double lm = dot(t, dy, n);
    x[i] = keep;
    double fd = (lp - lm) / (2 * e);
    if (!fd_close(fd, dx[i])) {
      fprintf(stderr, "softmax dx[%zu]: %g, finite difference %g\n", i, dx[i], fd);
      fail();
    }
  }
  free(t);
  free(x);
  free(y);
  free(dy);
  free(dx);
}

static void test_dropout_follows_its_keys(void **state) {
  (void)state;
  int outer = 3, inner = 8, cols = 50;
  int64_t inner_total = 20, outer0 = 7, inner0 = 5;
  size_t n = (size_t)outer * inner * cols;
  float p = 0.3f;
  uint64_t seed = 1234;
  float *x = rand_buf(n), *y = malloc(n * sizeof *y), *dx = malloc(n * sizeof *dx);
  assert_ok(dev->ops->dropout_forward(dev, outer, inner, cols, outer0, inner0, inner_total, p, seed,
                                      x, y));
  size_t kept = 0;
  for (int i = 0; i < outer; i++)
    for (int j = 0; j < inner; j++)
      for (int k = 0; k < cols; k++) {
        size_t at = ((size_t)i * inner + j) * cols + k;
        uint64_t g = (uint64_t)(((outer0 + i) * inner_total + inner0 + j) * cols + k);
        bool keep = dropout_keep(seed, g, p);
        assert_true(y[at] == (keep ? x[at] * (1.0f / (1.0f - p)) : 0.0f));
        kept += keep;
      }
  /* 1200 draws at p 0.3: the kept fraction is 0.7 +- 0.013 (one sigma). */
  double frac = (double)kept / (double)n;
  assert_true(frac > 0.64 && frac < 0.76);
  /* A slice (rows 1..2, inner 3..7) keyed by its offsets masks exactly as the whole. */
  float *part = malloc(n * sizeof *part);
  for (int i = 1; i < outer; i++) {
    const float *src = x + ((size_t)i * inner + 3) * cols;
    assert_ok(dev->ops->dropout_forward(dev, 1, inner - 3, cols, outer0 + i, inner0 + 3,
                                        inner_total, p, seed, src, part));
    assert_memory_equal(part, y + ((size_t)i * inner + 3) * cols, (size_t)(inner - 3) * cols * 4);
  }
  /* Backward applies the same mask and scale, in place too. */
  memcpy(dx, x, n * sizeof *dx);
  assert_ok(dev->ops->dropout_backward(dev, outer, inner, cols, outer0, inner0, inner_total, p,
                                       seed, dx, dx));
  assert_memory_equal(dx, y, n * sizeof *dx);
  /* Another seed, another mask. */
  assert_ok(dev->ops->dropout_forward(dev, outer, inner, cols, outer0, inner0, inner_total, p,
                                      seed + 1, x, part));
  assert_true(memcmp(part, y, n * sizeof *y) != 0);
  free(part);
  free(x);
  free(y);
  free(dx);
}

static void test_mean_tokens_and_its_adjoint(void **state) {
  (void)state;
  int n = 3, s = 5, h = 4;
  float *x = rand_buf((size_t)n * s * h), *y = malloc((size_t)n * h * sizeof *y);
  float *r = rand_buf((size_t)n * h), *dx = malloc((size_t)n * s * h * sizeof *dx);
  assert_ok(dev->ops->mean_tokens_forward(dev, n, s, h, x, y));
  for (int i = 0; i < n; i++)
    for (int c = 0; c < h; c++) {
      double m = 0;
      for (int t = 0; t < s; t++) m += x[((size_t)i * s + t) * h + c];
      assert_true(fabs(y[i * h + c] - m / s) <= 1e-6);
    }
  assert_ok(dev->ops->mean_tokens_backward(dev, n, s, h, r, dx));
  /* <mean(x), r> = <x, mean^T(r)> */
  double lhs = dot(y, r, (size_t)n * h), rhs = dot(x, dx, (size_t)n * s * h);
  assert_true(fabs(lhs - rhs) <= 1e-5 * (1 + fabs(lhs)));
  free(x);
  free(y);
  free(r);
  free(dx);
}

/* ---- one block by finite differences ----------------------------------------------------- */

static double block_loss(tfm_chunk *c, const fl_tensor *x, const tfm_batch *b, const float *r) {
  const fl_tensor *y;
  assert_ok(tfm_chunk_forward(c, 0, x, b, true, &y));
  return dot(y->data, r, y->numel);
}

/* Compares one analytic derivative with a central difference of `v` (a float the loss reads). */
static bool fd_agrees(tfm_chunk *c, const fl_tensor *x, const tfm_batch *b, const float *r,
                      float *v, double analytic, double eps, const char *what, size_t i) {
  float keep = *v;
  *v = keep + (float)eps;
  double lp = block_loss(c, x, b, r);
  *v = keep - (float)eps;
  double lm = block_loss(c, x, b, r);
  *v = keep;
  double fd = (lp - lm) / (2 * eps);
  bool ok = fd_close(fd, analytic);
  if (!ok) fprintf(stderr, "block %s[%zu]: backward %g, finite difference %g\n", what, i, analytic, fd);
  return ok;
}

static void test_block_gradients_by_finite_differences(void **state) {
  (void)state;
  tfm_spec sp = small_spec;
  tfm_chunk *c;
  assert_ok(tfm_chunk_create(dev, &sp, 1, 2, NULL, 0, 1, &c));
  /* The init's scale (1 / sqrt(fan_in)) already keeps attention away from uniform and GELU
   * curved; the noise makes the zero biases nonzero. */
  fl_tensor *values = tfm_chunk_values(c);
  for (size_t i = 0; i < values->numel; i++) values->data[i] = values->data[i] + 0.05f * urand();
  int n = 2;
  int64_t shape[3] = {n, sp.seq, sp.hidden};
  size_t numel = (size_t)n * sp.seq * sp.hidden;
  float *xv = rand_buf(numel), *r = rand_buf(numel);
  fl_tensor x, dy;
  make_tensor(&x, 3, shape, xv);
  make_tensor(&dy, 3, shape, r);
  tfm_batch b = {.row0 = 3, .step = 7}; /* dropout is on, with fixed keys: L stays smooth */
  const fl_tensor *y, *dx;
  assert_ok(tfm_chunk_forward(c, 0, &x, &b, true, &y));
  assert_ok(tfm_chunk_backward(c, 0, &dy, &dx));
  assert_non_null(dx);
  float *dxv = malloc(numel * sizeof *dxv);
  memcpy(dxv, dx->data, numel * sizeof *dxv);
  fl_tensor *grads = tfm_chunk_grads(c);
  float *g = malloc(grads->numel * sizeof *g);
  memcpy(g, grads->data, grads->numel * sizeof *g);

  int bad = 0, total = 0;
  double eps = 1e-2;
  for (size_t i = 0; i < numel; i += 7) {
    bad += !fd_agrees(c, &x, &b, r, &x.data[i], dxv[i], eps, "dx", i);
    total++;
  }
  for (size_t p = 0; p < tfm_chunk_param_count(c); p++) {
    nn_param *prm = tfm_chunk_param(c, p);
    for (size_t k = 0; k < 6; k++) {
      size_t i = (k * 7919 + p) % prm->value.numel;
      bad += !fd_agrees(c, &x, &b, r, &prm->value.data[i], g[prm->offset + i], eps, prm->name, i);
      total++;
    }
  }
  if (bad) fprintf(stderr, "%d of %d derivatives disagree\n", bad, total);
  assert_int_equal(bad, 0);
  assert_true(total > 60);
  free(xv);
  free(r);
  free(dxv);
  free(g);
  tensor_release(&x);
  tensor_release(&dy);
  tfm_chunk_destroy(c);
}

/* ---- tensor parallel: ranks as threads --------------------------------------------------- */

/* What one rank's run of the whole model leaves behind, copied out for the main thread. */
typedef struct param_copy {
  char name[64];
  tfm_param_place place;
  int64_t lrows, lcols; /* the shard's shape */
  size_t offset;
} param_copy;

typedef struct run_result {
  float logits[BATCH * 8];
  float *values, *grads;
  size_t nvalues, nparams;
  param_copy *params;
  float loss;
} run_result;

typedef struct tp_run {
  tfm_spec spec;
  int tp;
  float *x;           /* [BATCH, seq, features] */
  int32_t *labels;    /* [BATCH] */
  fl_comm_endpoint *eps[MAX_TP];
  const char *addrs[MAX_TP];
  char addr_buf[MAX_TP][96];
  run_result res[MAX_TP];
  fl_status status[MAX_TP];
  char msg[MAX_TP][512];
} tp_run;

typedef struct rank_arg {
  tp_run *run;
  int rank;
} rank_arg;

static void result_free(run_result *r) {
  free(r->values);
  free(r->grads);
  free(r->params);
  memset(r, 0, sizeof *r);
}

/* Forward of BATCH samples (row0 0, step 5), the loss with grad_scale 1/BATCH, backward;
 * copies everything out. Runs on a rank thread: no cmocka asserts here. */
static fl_status run_whole_model(fl_device *d, const tfm_spec *sp, fl_comm *comm, int rank, int tp,
                                 const float *xv, const int32_t *labels, run_result *out) {
  fl_status status = FL_OK;
  tfm_chunk *c = NULL;
  fl_tensor x = {0}, dlogits = {0};
  float stats[2] = {0, 0};
  int64_t shape[3] = {BATCH, sp->seq, sp->features};
  const fl_tensor *logits;
  tfm_batch b = {.row0 = 0, .step = 5};
  FL_CHECK(tfm_chunk_create(d, sp, 0, tfm_units(sp), comm, rank, tp, &c));
  FL_CHECK(tensor_ensure(&x, d, 3, shape));
  FL_CHECK(fl_tensor_write(&x, xv, x.numel));
  FL_CHECK(tfm_chunk_forward(c, 0, &x, &b, true, &logits));
  FL_CHECK(tensor_ensure(&dlogits, d, 2, logits->shape));
  FL_CHECK(d->ops->softmax_xent(d, BATCH, sp->classes, logits->data, labels, 0.0f, 1.0f / BATCH,
                                dlogits.data, stats));
  memcpy(out->logits, logits->data, logits->numel * sizeof(float));
  FL_CHECK(tfm_chunk_backward(c, 0, &dlogits, NULL));
  out->loss = stats[0];
  out->nvalues = tfm_chunk_values(c)->numel;
  out->nparams = tfm_chunk_param_count(c);
  out->values = malloc(out->nvalues * sizeof(float));
  out->grads = malloc(out->nvalues * sizeof(float));
  out->params = calloc(out->nparams, sizeof *out->params);
  if (!out->values || !out->grads || !out->params) FL_CHECK(FL_ERR(FL_ENOMEM, "test: out of memory"));
  memcpy(out->values, tfm_chunk_values(c)->data, out->nvalues * sizeof(float));
  memcpy(out->grads, tfm_chunk_grads(c)->data, out->nvalues * sizeof(float));
  for (size_t i = 0; i < out->nparams; i++) {
    nn_param *p = tfm_chunk_param(c, i);
    param_copy *q = &out->params[i];
    snprintf(q->name, sizeof q->name, "%s", p->name);
    q->place = tfm_chunk_param_place(c, i);
    q->lcols = p->value.ndim == 2 ? p->value.shape[1] : p->value.shape[0];
    q->lrows = (int64_t)p->value.numel / q->lcols;
    q->offset = p->offset;
  }
cleanup:
  tensor_release(&x);
  tensor_release(&dlogits);
  tfm_chunk_destroy(c);
  return status;
}

static void *tp_rank_main(void *p) {
  rank_arg *a = p;
  tp_run *run = a->run;
  int r = a->rank;
  fl_device *d = NULL;
  fl_comm *comm = NULL;
  fl_status st = fl_device_open(FL_DEVICE_CPU, 0, &d);
  if (st == FL_OK && run->tp > 1) {
    fl_comm_endpoint *ep = run->eps[r];
    run->eps[r] = NULL; /* taken by create, even on failure */
    st = fl_comm_host_create(ep, r, run->tp, run->addrs, 10000, &comm);
  }
  if (st == FL_OK)
    st = run_whole_model(d, &run->spec, comm, r, run->tp, run->x, run->labels, &run->res[r]);
  run->status[r] = st;
  snprintf(run->msg[r], sizeof run->msg[r], "%s", st ? fl_last_error() : "");
  fl_comm_destroy(comm);
  fl_device_close(d);
  return NULL;
}

static void run_tp(tp_run *run) {
  pthread_t th[MAX_TP];
  rank_arg args[MAX_TP];
  for (int r = 0; r < run->tp && run->tp > 1; r++) {
    assert_ok(fl_comm_listen("127.0.0.1", &run->eps[r]));
    snprintf(run->addr_buf[r], sizeof run->addr_buf[r], "%s", fl_comm_endpoint_address(run->eps[r]));
    run->addrs[r] = run->addr_buf[r];
  }
  for (int r = 0; r < run->tp; r++) {
    args[r] = (rank_arg){run, r};
    assert_int_equal(pthread_create(&th[r], NULL, tp_rank_main, &args[r]), 0);
  }
  for (int r = 0; r < run->tp; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
  for (int r = 0; r < run->tp; r++) {
    if (run->status[r] != FL_OK)
      fprintf(stderr, "tp rank %d of %d: %s: %s\n", r, run->tp, fl_status_name(run->status[r]), run->msg[r]);
    assert_int_equal(run->status[r], FL_OK);
  }
}

/* The slice of the unsplit tensor `full` (of reference param q) that shard p holds. */
static void slice_of(const param_copy *p, const float *full, float *out) {
  for (int64_t r = 0; r < p->lrows; r++)
    for (int64_t j = 0; j < p->lcols; j++)
      out[r * p->lcols + j] = full[(p->place.row0 + r) * p->place.cols + p->place.col0 + j];
}

static void make_inputs(const tfm_spec *sp, float **x, int32_t **labels) {
  *x = rand_buf((size_t)BATCH * sp->seq * sp->features);
  *labels = malloc(BATCH * sizeof **labels);
  for (int i = 0; i < BATCH; i++) (*labels)[i] = i % sp->classes;
}

static void test_tensor_parallel_matches_one_rank(void **state) {
  (void)state;
  const float dropouts[2] = {0.0f, 0.1f};
  const int tps[3] = {1, 2, 4};
  float *x;
  int32_t *labels;
  make_inputs(&small_spec, &x, &labels);
  float logits_by_p[2][BATCH * 8];
  double worst_logits = 0, worst_grads = 0;
  for (int pi = 0; pi < 2; pi++) {
    run_result ref = {0};
    tfm_spec sp = small_spec;
    sp.dropout = dropouts[pi];
    assert_ok(run_whole_model(dev, &sp, NULL, 0, 1, x, labels, &ref));
    memcpy(logits_by_p[pi], ref.logits, sizeof ref.logits);
    assert_true(isfinite(ref.loss) && ref.loss > 0);
    for (int ti = 0; ti < 3; ti++) {
      tp_run *run = calloc(1, sizeof *run);
      run->spec = sp;
      run->tp = tps[ti];
      run->x = x;
      run->labels = labels;
      run_tp(run);
      for (int r = 0; r < run->tp; r++) {
        run_result *res = &run->res[r];
        char what[160];
        snprintf(what, sizeof what, "tp %d rank %d dropout %.1f logits", run->tp, r, (double)sp.dropout);
        expect_close(res->logits, ref.logits, (size_t)BATCH * sp.classes, 1e-5, what, &worst_logits);
        assert_int_equal(res->nparams, ref.nparams);
        size_t held = 0;
        for (size_t i = 0; i < res->nparams; i++) {
          param_copy *p = &res->params[i], *q = &ref.params[i];
          assert_string_equal(p->name, q->name);
          assert_true(p->place.rows == q->lrows && p->place.cols == q->lcols);
          assert_true(p->place.row0 + p->lrows <= p->place.rows);
          assert_true(p->place.col0 + p->lcols <= p->place.cols);
          assert_true(p->place.replicated == (p->lrows == p->place.rows && p->lcols == p->place.cols));
          if (run->tp > 1 && strstr(p->name, "qkv.weight")) assert_false(p->place.replicated);
          size_t cnt = (size_t)(p->lrows * p->lcols);
          float *want = malloc(cnt * sizeof *want);
          /* The keyed init: a shard's weights are exactly the slice. */
          slice_of(p, ref.values + q->offset, want);
          assert_memory_equal(res->values + p->offset, want, cnt * sizeof *want);
          slice_of(p, ref.grads + q->offset, want);
          snprintf(what, sizeof what, "tp %d rank %d dropout %.1f grad %s", run->tp, r,
                   (double)sp.dropout, p->name);
          expect_close(res->grads + p->offset, want, cnt, 1e-5, what, &worst_grads);
          free(want);
          held += cnt;
        }
        assert_int_equal(held, res->nvalues);
        /* Sharding divides the split tensors: 4 ranks hold less than 1. */
        if (run->tp == 4) assert_true(res->nvalues < ref.nvalues);
        result_free(res);
      }
      free(run);
    }
    result_free(&ref);
  }
  /* Dropout changed the logits (the masks are in effect), so the equality above meant something. */
  assert_true(rel_max_err(logits_by_p[1], logits_by_p[0], (size_t)BATCH * small_spec.classes) > 1e-3);
  printf("tensor parallel vs one rank: logits error %.2g, gradient error %.2g (relative to max)\n",
         worst_logits, worst_grads);
  free(x);
  free(labels);
}

/* ---- pipeline chunks and slots ----------------------------------------------------------- */

static void input_tensor(fl_tensor *t, const tfm_spec *sp, int n, const float *xv) {
  int64_t shape[3] = {n, sp->seq, sp->features};
  make_tensor(t, 3, shape, xv);
}

static void test_chunks_cut_anywhere_match_one_chunk(void **state) {
  (void)state;
  tfm_spec sp = small_spec;
  int units = tfm_units(&sp);
  float *xv;
  int32_t *labels;
  make_inputs(&sp, &xv, &labels);
  run_result ref = {0};
  assert_ok(run_whole_model(dev, &sp, NULL, 0, 1, xv, labels, &ref));
  fl_tensor x, dl = {0};
  input_tensor(&x, &sp, BATCH, xv);
  tfm_batch b = {.row0 = 0, .step = 5};
  for (int k = 1; k < units; k++) {
    tfm_chunk *a, *z;
    assert_ok(tfm_chunk_create(dev, &sp, 0, k, NULL, 0, 1, &a));
    assert_ok(tfm_chunk_create(dev, &sp, k, units, NULL, 0, 1, &z));
    const fl_tensor *ya, *logits, *dx, *dx0;
    float stats[2] = {0, 0};
    assert_ok(tfm_chunk_forward(a, 0, &x, &b, true, &ya));
    assert_int_equal(ya->ndim, 3);
    assert_int_equal(ya->shape[2], sp.hidden);
    assert_ok(tfm_chunk_forward(z, 0, ya, &b, true, &logits));
    assert_ok(tensor_ensure(&dl, dev, 2, logits->shape));
    assert_ok(dev->ops->softmax_xent(dev, BATCH, sp.classes, logits->data, labels, 0.0f, 1.0f / BATCH,
                                     dl.data, stats));
    char what[64];
    snprintf(what, sizeof what, "cut at %d: logits", k);
    expect_close(logits->data, ref.logits, (size_t)BATCH * sp.classes, 1e-6, what, NULL);
    assert_ok(tfm_chunk_backward(z, 0, &dl, &dx));
    assert_non_null(dx);
    assert_int_equal(dx->numel, ya->numel);
    assert_ok(tfm_chunk_backward(a, 0, dx, &dx0));
    assert_null(dx0); /* the chunk starts at unit 0 */
    size_t na = tfm_chunk_values(a)->numel, nz = tfm_chunk_values(z)->numel;
    assert_int_equal(na + nz, ref.nvalues);
    assert_int_equal(tfm_chunk_param_count(a) + tfm_chunk_param_count(z), ref.nparams);
    for (size_t i = 0; i < tfm_chunk_param_count(z); i++)
      assert_string_equal(tfm_chunk_param(z, i)->name, ref.params[tfm_chunk_param_count(a) + i].name);
    assert_memory_equal(tfm_chunk_values(a)->data, ref.values, na * sizeof(float));
    assert_memory_equal(tfm_chunk_values(z)->data, ref.values + na, nz * sizeof(float));
    snprintf(what, sizeof what, "cut at %d: gradients before", k);
    expect_close(tfm_chunk_grads(a)->data, ref.grads, na, 1e-6, what, NULL);
    snprintf(what, sizeof what, "cut at %d: gradients after", k);
    expect_close(tfm_chunk_grads(z)->data, ref.grads + na, nz, 1e-6, what, NULL);
    tfm_chunk_destroy(a);
    tfm_chunk_destroy(z);
  }
  tensor_release(&x);
  tensor_release(&dl);
  result_free(&ref);
  free(xv);
  free(labels);
}

static void test_two_slots_in_flight_match_the_full_batch(void **state) {
  (void)state;
  tfm_spec sp = small_spec; /* dropout 0.1 */
  float *xv;
  int32_t *labels;
  make_inputs(&sp, &xv, &labels);
  run_result ref = {0};
  assert_ok(run_whole_model(dev, &sp, NULL, 0, 1, xv, labels, &ref));

  tfm_chunk *c;
  assert_ok(tfm_chunk_create(dev, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c));
  int half = BATCH / 2;
  size_t per = (size_t)sp.seq * sp.features;
  fl_tensor x0, x1, dl0 = {0}, dl1 = {0};
  input_tensor(&x0, &sp, half, xv);
  input_tensor(&x1, &sp, half, xv + half * per);
  tfm_batch b0 = {.row0 = 0, .step = 5}, b1 = {.row0 = half, .step = 5};
  const fl_tensor *y0, *y1, *dx;
  float stats[2] = {0, 0};
  assert_int_equal(tfm_chunk_activation_bytes(c), 0);
  assert_ok(tfm_chunk_forward(c, 0, &x0, &b0, true, &y0));
  size_t one = tfm_chunk_activation_bytes(c);
  assert_true(one > 0);
  assert_ok(tfm_chunk_forward(c, 1, &x1, &b1, true, &y1));
  size_t two = tfm_chunk_activation_bytes(c);
  assert_int_equal(two, 2 * one); /* same micro-batch size, same bytes */
  assert_int_equal(tfm_chunk_peak_activation_bytes(c), two);
  /* Each micro-batch's logits are the full batch's rows: the masks follow the global row. */
  expect_close(y0->data, ref.logits, (size_t)half * sp.classes, 1e-6, "slot 0 logits", NULL);
  expect_close(y1->data, ref.logits + half * sp.classes, (size_t)half * sp.classes, 1e-6,
               "slot 1 logits", NULL);
  assert_ok(tensor_ensure(&dl1, dev, 2, y1->shape));
  assert_ok(dev->ops->softmax_xent(dev, half, sp.classes, y1->data, labels + half, 0.0f, 1.0f / BATCH,
                                   dl1.data, stats));
  assert_ok(tfm_chunk_backward(c, 1, &dl1, &dx));
  assert_null(dx);
  assert_int_equal(tfm_chunk_activation_bytes(c), one);
  assert_ok(tensor_ensure(&dl0, dev, 2, y0->shape));
  assert_ok(dev->ops->softmax_xent(dev, half, sp.classes, y0->data, labels, 0.0f, 1.0f / BATCH, dl0.data,
                                   stats));
  assert_ok(tfm_chunk_backward(c, 0, &dl0, NULL));
  assert_int_equal(tfm_chunk_activation_bytes(c), 0);
  assert_int_equal(tfm_chunk_peak_activation_bytes(c), two);
  tfm_chunk_reset_peak(c);
  assert_int_equal(tfm_chunk_peak_activation_bytes(c), 0);
  double err = 0;
  expect_close(tfm_chunk_grads(c)->data, ref.grads, ref.nvalues, 1e-5, "two slots: gradients", &err);
  printf("two slots vs the full batch: gradient error %.2g (relative to max)\n", err);
  /* A slot is freed by its backward: a second backward has nothing to run. */
  assert_fails_with(tfm_chunk_backward(c, 0, &dl0, NULL), FL_ESTATE, "holds no forward");
  /* zero_grad, then the same two micro-batches again accumulate the same gradients. */
  assert_ok(tfm_chunk_zero_grad(c));
  for (size_t i = 0; i < ref.nvalues; i++) assert_true(tfm_chunk_grads(c)->data[i] == 0.0f);
  tensor_release(&x0);
  tensor_release(&x1);
  tensor_release(&dl0);
  tensor_release(&dl1);
  tfm_chunk_destroy(c);
  result_free(&ref);
  free(xv);
  free(labels);
}

static void test_inference_has_no_dropout(void **state) {
  (void)state;
  tfm_spec sp = small_spec, none = small_spec;
  none.dropout = 0;
  float *xv;
  int32_t *labels;
  make_inputs(&sp, &xv, &labels);
  tfm_chunk *c, *d;
  assert_ok(tfm_chunk_create(dev, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c));
  assert_ok(tfm_chunk_create(dev, &none, 0, tfm_units(&sp), NULL, 0, 1, &d));
  fl_tensor x;
  input_tensor(&x, &sp, BATCH, xv);
  const fl_tensor *yc, *yd;
  assert_ok(tfm_chunk_forward(c, 0, &x, NULL, false, &yc));
  assert_ok(tfm_chunk_forward(d, 0, &x, NULL, true, &yd));
  assert_memory_equal(yc->data, yd->data, yc->numel * sizeof(float));
  tensor_release(&x);
  tfm_chunk_destroy(c);
  tfm_chunk_destroy(d);
  free(xv);
  free(labels);
}

/* ---- bad specs and calls ----------------------------------------------------------------- */

static void test_bad_specs_and_calls(void **state) {
  (void)state;
  tfm_spec sp;
  tfm_chunk *c = NULL;
#define BAD_SPEC(field, value, tp, needle)                                                   \
  do {                                                                                       \
    sp = small_spec;                                                                         \
    sp.field = value;                                                                        \
    assert_fails_with(tfm_spec_check(&sp, tp), FL_EINVAL, needle);                           \
    assert_fails_with(tfm_chunk_create(dev, &sp, 0, 1, NULL, 0, tp, &c), FL_EINVAL, needle); \
  } while (0)
  BAD_SPEC(heads, 3, 1, "heads (3) must divide hidden (16)");
  BAD_SPEC(heads, 4, 3, "heads (4) must be a multiple of the tensor-parallel size 3");
  BAD_SPEC(ffn, 30, 4, "ffn (30) must be a multiple");
  BAD_SPEC(ffn, -1, 1, "ffn is -1");
  BAD_SPEC(dropout, 1.0f, 1, "dropout is 1");
  BAD_SPEC(dropout, -0.1f, 1, "dropout is -0.1");
  BAD_SPEC(dropout, NAN, 1, "dropout is nan");
  BAD_SPEC(blocks, 0, 1, "blocks is 0");
  BAD_SPEC(seq, 0, 1, "seq is 0");
  BAD_SPEC(features, -2, 1, "features is -2");
  BAD_SPEC(hidden, 0, 1, "hidden is 0");
  BAD_SPEC(classes, 0, 1, "classes is 0");
#undef BAD_SPEC
  sp = small_spec;
  assert_ok(tfm_spec_check(&sp, 4));
  assert_fails_with(tfm_spec_check(&sp, 0), FL_EINVAL, "tensor-parallel size 0");
  assert_fails_with(tfm_chunk_create(dev, &sp, 2, 2, NULL, 0, 1, &c), FL_EINVAL, "units [2, 2)");
  assert_fails_with(tfm_chunk_create(dev, &sp, 0, 5, NULL, 0, 1, &c), FL_EINVAL, "model's 4");
  assert_fails_with(tfm_chunk_create(dev, &sp, 0, 4, NULL, 0, 2, &c), FL_EINVAL, "needs a communicator");
  assert_fails_with(tfm_chunk_create(dev, &sp, 0, 4, NULL, 2, 2, &c), FL_EINVAL, "rank 2 of 2");
  assert_null(c);

  assert_ok(tfm_chunk_create(dev, &sp, 1, 3, NULL, 0, 1, &c));
  int64_t wrong[3] = {2, sp.seq, sp.features}, right[3] = {2, sp.seq, sp.hidden};
  fl_tensor x, dy;
  make_tensor(&x, 3, wrong, NULL);
  const fl_tensor *y, *dx;
  assert_fails_with(tfm_chunk_forward(c, 0, &x, NULL, true, &y), FL_EINVAL, "expected [n, 6, 16]");
  tensor_release(&x);
  make_tensor(&x, 3, right, NULL);
  assert_fails_with(tfm_chunk_forward(c, -1, &x, NULL, true, &y), FL_EINVAL, "slot -1");
  make_tensor(&dy, 3, right, NULL);
  assert_fails_with(tfm_chunk_backward(c, 0, &dy, &dx), FL_ESTATE, "holds no forward");
  assert_ok(tfm_chunk_forward(c, 3, &x, NULL, true, &y));
  assert_fails_with(tfm_chunk_backward(c, 2, &dy, &dx), FL_ESTATE, "slot 2");
  tensor_release(&dy);
  make_tensor(&dy, 3, wrong, NULL);
  assert_fails_with(tfm_chunk_backward(c, 3, &dy, &dx), FL_ESTATE, "does not match");
  tensor_release(&dy);
  tensor_release(&x);
  tfm_chunk_destroy(c);
  tfm_chunk_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_batched_matches_loop),
      cmocka_unit_test(test_gelu_matches_formula_and_finite_differences),
      cmocka_unit_test(test_softmax_rows_is_stable_and_backward_matches),
      cmocka_unit_test(test_dropout_follows_its_keys),
      cmocka_unit_test(test_mean_tokens_and_its_adjoint),
      cmocka_unit_test(test_block_gradients_by_finite_differences),
      cmocka_unit_test(test_tensor_parallel_matches_one_rank),
      cmocka_unit_test(test_chunks_cut_anywhere_match_one_chunk),
      cmocka_unit_test(test_two_slots_in_flight_match_the_full_batch),
      cmocka_unit_test(test_inference_has_no_dropout),
      cmocka_unit_test(test_bad_specs_and_calls),
  };
  rng_state = 0x9e3779b97f4a7c15ull; /* the seed its tolerances were measured with */
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
