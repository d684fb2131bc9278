/* test_gpu_layers.c: the cpu device's operations against plain reference loops, every layer's
 * gradients against finite differences, and the models of gpu/nn/nn.h (shapes, gradients, the
 * grads-ready callback, and loss going down under a few hand-made SGD steps). */
#include "test_util.h"

#include <math.h>

#include "common/common.h"
#include "gpu/device/device.h"
#include "gpu/nn/layers.h"

#include "gpu_test_data.h"

static float *zero_buf(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  assert_non_null(p);
  return p;
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

static void assert_close(double got, double want, double tol, const char *what, size_t i) {
  if (fabs(got - want) > tol * (1 + fabs(want))) {
    fprintf(stderr, "%s[%zu]: got %.7g, want %.7g\n", what, i, got, want);
    fail();
  }
}

static void assert_all_close(const float *got, const float *want, size_t n, double tol,
                             const char *what) {
  for (size_t i = 0; i < n; i++) assert_close(got[i], want[i], tol, what, i);
}

static int osz(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* ---- BLAS and elementwise ops ---------------------------------------------------------- */

static void test_gemm_all_transposes_match_reference(void **state) {
  (void)state;
  int m = 5, n = 7, k = 3;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      /* Leading dimensions wider than the matrices, so that ld is really used. */
      int lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      float *a = rand_buf((size_t)(ta ? k : m) * lda);
      float *b = rand_buf((size_t)(tb ? n : k) * ldb);
      float *c = rand_buf((size_t)m * ldc);
      float *want = malloc((size_t)m * ldc * sizeof *want);
      memcpy(want, c, (size_t)m * ldc * sizeof *want);
      float alpha = 1.5f, beta = 0.5f;
      for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
          double s = 0;
          for (int p = 0; p < k; p++)
            s += (double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                 (tb ? b[j * ldb + p] : b[p * ldb + j]);
          want[i * ldc + j] = (float)(alpha * s + beta * want[i * ldc + j]);
        }
      assert_ok(dev->ops->gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
      assert_all_close(c, want, (size_t)m * ldc, 1e-5, ta ? (tb ? "gemm TT" : "gemm TN")
                                                           : (tb ? "gemm NT" : "gemm NN"));
      free(a);
      free(b);
      free(c);
      free(want);
    }
  float a[4] = {0}, b[4] = {0}, c[4] = {0};
  assert_fails_with(dev->ops->gemm(dev, false, false, 2, 2, 2, 1, a, 1, b, 2, 0, c, 2), FL_EINVAL,
                    "lda=1");
  assert_fails_with(dev->ops->gemm(dev, false, false, -1, 2, 2, 1, a, 2, b, 2, 0, c, 2), FL_EINVAL,
                    "negative size");
}

static void test_elementwise_ops_match_reference(void **state) {
  (void)state;
  size_t n = 37;
  float *x = rand_buf(n), *y = rand_buf(n), *want = zero_buf(n);
  for (size_t i = 0; i < n; i++) want[i] = y[i] + 0.25f * x[i];
  assert_ok(dev->ops->axpy(dev, n, 0.25f, x, y));
  assert_all_close(y, want, n, 1e-6, "axpy");
  for (size_t i = 0; i < n; i++) want[i] = y[i] * -3.0f;
  assert_ok(dev->ops->scale(dev, n, -3.0f, y));
  assert_all_close(y, want, n, 1e-6, "scale");
  double ss = 0;
  for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  double got;
  assert_ok(dev->ops->sum_squares(dev, n, x, &got));
  assert_close(got, ss, 1e-12, "sum_squares", 0);
  assert_ok(dev->ops->fill(dev, n, 2.5f, y));
  for (size_t i = 0; i < n; i++) assert_true(y[i] == 2.5f);

  /* relu forward in place, then backward passes dy only where y > 0. */
  float *r = rand_buf(n), *dy = rand_buf(n), *dx = zero_buf(n);
  memcpy(want, r, n * sizeof *r);
  assert_ok(dev->ops->relu_forward(dev, n, r, r));
  for (size_t i = 0; i < n; i++) assert_true(r[i] == (want[i] > 0 ? want[i] : 0));
  assert_ok(dev->ops->relu_backward(dev, n, r, dy, dx));
  for (size_t i = 0; i < n; i++) assert_true(dx[i] == (want[i] > 0 ? dy[i] : 0));
  free(x);
  free(y);
  free(want);
  free(r);
  free(dy);
  free(dx);
}

static void test_bias_ops_add_and_accumulate(void **state) {
  (void)state;
  int rows = 4, cols = 5;
  float *b = rand_buf(cols), *y = rand_buf((size_t)rows * cols), *db = rand_buf(cols);
  float *want = malloc((size_t)rows * cols * sizeof *want), *db_want = malloc(cols * sizeof *db);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) want[r * cols + c] = y[r * cols + c] + b[c];
  for (int c = 0; c < cols; c++) {
    db_want[c] = db[c];
    for (int r = 0; r < rows; r++) db_want[c] += y[r * cols + c];
  }
  assert_ok(dev->ops->bias_grad_rows(dev, rows, cols, y, db));
  assert_all_close(db, db_want, cols, 1e-6, "bias_grad_rows");
  assert_ok(dev->ops->bias_add_rows(dev, rows, cols, b, y));
  assert_all_close(y, want, (size_t)rows * cols, 1e-6, "bias_add_rows");
  free(b);
  free(y);
  free(db);
  free(want);
  free(db_want);

  int n = 3, c = 4, hw = 6;
  size_t len = (size_t)n * c * hw;
  b = rand_buf(c);
  y = rand_buf(len);
  db = rand_buf(c);
  want = malloc(len * sizeof *want);
  db_want = malloc(c * sizeof *db_want);
  for (int ch = 0; ch < c; ch++) db_want[ch] = db[ch];
  for (int i = 0; i < n; i++)
    for (int ch = 0; ch < c; ch++)
      for (int s = 0; s < hw; s++) {
        size_t at = ((size_t)i * c + ch) * hw + s;
        want[at] = y[at] + b[ch];
        db_want[ch] += y[at];
      }
  assert_ok(dev->ops->bias_grad_channels(dev, n, c, hw, y, db));
  assert_all_close(db, db_want, c, 1e-5, "bias_grad_channels");
  assert_ok(dev->ops->bias_add_channels(dev, n, c, hw, b, y));
  assert_all_close(y, want, len, 1e-6, "bias_add_channels");
  free(b);
  free(y);
  free(db);
  free(want);
  free(db_want);
}

/* ---- loss ------------------------------------------------------------------------------ */

static void test_softmax_xent_matches_reference_and_is_stable(void **state) {
  (void)state;
  int n = 4, c = 5;
  float *z = rand_buf((size_t)n * c), *d = zero_buf((size_t)n * c);
  for (int i = 0; i < n * c; i++) z[i] *= 3;
  z[7] = 1e4f;  /* huge logits: exp() of them overflows without the max subtracted */
  z[8] = 9e3f;
  int32_t labels[4] = {0, 2, 4, 1};
  float stats[2] = {1.0f, 2.0f};
  float scale = 0.25f;
  assert_ok(dev->ops->softmax_xent(dev, n, c, z, labels, 0.0f, scale, d, stats));
  double loss = 0;
  int correct = 0;
  for (int r = 0; r < n; r++) {
    const float *row = z + r * c;
    double mx = row[0];
    int arg = 0;
    for (int j = 1; j < c; j++)
      if (row[j] > mx) mx = row[j], arg = j;
    double s = 0;
    for (int j = 0; j < c; j++) s += exp(row[j] - mx);
    loss += log(s) + mx - row[labels[r]];
    correct += arg == labels[r];
    for (int j = 0; j < c; j++) {
      double p = exp(row[j] - mx) / s;
      assert_close(d[r * c + j], (p - (j == labels[r])) * scale, 1e-5, "dlogits", (size_t)(r * c + j));
      assert_true(isfinite(d[r * c + j]));
    }
  }
  assert_close(stats[0], 1.0 + loss, 1e-5, "loss sum", 0);
  assert_close(stats[1], 2.0 + correct, 0, "correct", 0);
  assert_true(isfinite(stats[0]));
  free(z);
  free(d);
}

static void test_softmax_xent_rejects_bad_label(void **state) {
  (void)state;
  int n = 3, c = 4;
  float *z = rand_buf((size_t)n * c), *d = zero_buf((size_t)n * c);
  float stats[2] = {0, 0};
  int32_t high[3] = {0, 1, 4}, negative[3] = {-1, 0, 0};
  assert_fails_with(dev->ops->softmax_xent(dev, n, c, z, high, 0.0f, 1, d, stats), FL_EINVAL,
                    "row 2 has label 4 outside [0, 4)");
  assert_fails_with(dev->ops->softmax_xent(dev, n, c, z, negative, 0.0f, 1, d, stats), FL_EINVAL,
                    "row 0 has label -1");
  /* Nothing was written. */
  for (int i = 0; i < n * c; i++) assert_true(d[i] == 0);
  assert_true(stats[0] == 0 && stats[1] == 0);
  free(z);
  free(d);
}

/* ---- convolution helpers --------------------------------------------------------------- */

typedef struct conv_case {
  int n, c, h, w, kh, kw, stride, pad;
} conv_case;

static const conv_case conv_cases[] = {
    {2, 3, 5, 7, 3, 3, 1, 1}, {1, 2, 7, 5, 3, 3, 2, 1}, {3, 1, 6, 6, 2, 2, 2, 0},
    {2, 2, 5, 5, 1, 1, 2, 0}, {1, 3, 9, 8, 7, 7, 2, 3}, {2, 2, 4, 5, 3, 2, 1, 0},
    {2, 1, 2, 3, 3, 3, 1, 1}, {1, 2, 4, 4, 5, 5, 3, 2}, /* kernels wider than the image */
};

static void test_im2col_matches_reference_and_col2im_is_its_adjoint(void **state) {
  (void)state;
  for (size_t t = 0; t < sizeof conv_cases / sizeof conv_cases[0]; t++) {
    conv_case k = conv_cases[t];
    int oh = osz(k.h, k.kh, k.stride, k.pad), ow = osz(k.w, k.kw, k.stride, k.pad);
    size_t xn = (size_t)k.n * k.c * k.h * k.w;
    size_t rows = (size_t)k.c * k.kh * k.kw, cols = (size_t)k.n * oh * ow;
    float *x = rand_buf(xn), *col = rand_buf(rows * cols), *want = zero_buf(rows * cols);
    for (int ci = 0; ci < k.c; ci++)
      for (int ki = 0; ki < k.kh; ki++)
        for (int kj = 0; kj < k.kw; kj++)
          for (int img = 0; img < k.n; img++)
            for (int oy = 0; oy < oh; oy++)
              for (int ox = 0; ox < ow; ox++) {
                int iy = oy * k.stride - k.pad + ki, ix = ox * k.stride - k.pad + kj;
                size_t r = ((size_t)ci * k.kh + ki) * k.kw + kj;
                size_t cc = ((size_t)img * oh + oy) * ow + ox;
                want[r * cols + cc] = iy >= 0 && iy < k.h && ix >= 0 && ix < k.w
                                          ? x[(((size_t)img * k.c + ci) * k.h + iy) * k.w + ix]
                                          : 0;
              }
    assert_ok(dev->ops->im2col(dev, k.n, k.c, k.h, k.w, k.kh, k.kw, k.stride, k.pad, x, col));
    assert_all_close(col, want, rows * cols, 0, "im2col");
    /* <col2im(a), b> = <a, im2col(b)>; col2im accumulates onto what dx held. */
    float *a = rand_buf(rows * cols), *dx = rand_buf(xn), *dx0 = malloc(xn * sizeof *dx0);
    memcpy(dx0, dx, xn * sizeof *dx);
    assert_ok(dev->ops->col2im(dev, k.n, k.c, k.h, k.w, k.kh, k.kw, k.stride, k.pad, a, dx));
    double lhs = dot(dx, x, xn) - dot(dx0, x, xn), rhs = dot(a, col, rows * cols);
    assert_close(lhs, rhs, 1e-5, "col2im adjoint", t);
    free(x);
    free(col);
    free(want);
    free(a);
    free(dx);
    free(dx0);
  }
}

static void test_swap01_transposes_the_outer_axes(void **state) {
  (void)state;
  int A = 3, B = 4, S = 5;
  float *x = rand_buf((size_t)A * B * S), *y = zero_buf((size_t)A * B * S);
  assert_ok(dev->ops->swap01(dev, A, B, S, x, y));
  for (int a = 0; a < A; a++)
    for (int b = 0; b < B; b++)
      for (int s = 0; s < S; s++) assert_true(y[(b * A + a) * S + s] == x[(a * B + b) * S + s]);
  free(x);
  free(y);
}

/* ---- pooling --------------------------------------------------------------------------- */

typedef struct pool_case {
  int n, c, h, w, k, stride, pad;
} pool_case;

static const pool_case pool_cases[] = {
    {2, 3, 6, 6, 2, 2, 0}, {1, 2, 7, 5, 3, 2, 1}, {2, 1, 5, 5, 3, 1, 1}, {1, 2, 9, 9, 3, 3, 0},
};

static void test_maxpool_matches_reference(void **state) {
  (void)state;
  for (size_t t = 0; t < sizeof pool_cases / sizeof pool_cases[0]; t++) {
    pool_case p = pool_cases[t];
    int oh = osz(p.h, p.k, p.stride, p.pad), ow = osz(p.w, p.k, p.stride, p.pad);
    size_t xn = (size_t)p.n * p.c * p.h * p.w, yn = (size_t)p.n * p.c * oh * ow;
    float *x = rand_buf(xn), *y = zero_buf(yn), *dy = rand_buf(yn), *dx = rand_buf(xn);
    float *dx_want = zero_buf(xn);
    int32_t *am = calloc(yn, sizeof *am);
    assert_ok(dev->ops->maxpool_forward(dev, p.n, p.c, p.h, p.w, p.k, p.stride, p.pad, x, y, am));
    for (int pl = 0; pl < p.n * p.c; pl++)
      for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++) {
          float best = -INFINITY;
          int at = -1;
          for (int ki = 0; ki < p.k; ki++)
            for (int kj = 0; kj < p.k; kj++) {
              int iy = oy * p.stride - p.pad + ki, ix = ox * p.stride - p.pad + kj;
              if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) continue;
              float v = x[(size_t)pl * p.h * p.w + iy * p.w + ix];
              if (v > best) best = v, at = iy * p.w + ix;
            }
          size_t o = ((size_t)pl * oh + oy) * ow + ox;
          assert_true(y[o] == best);
          assert_int_equal(am[o], at);
          dx_want[(size_t)pl * p.h * p.w + at] += dy[o];
        }
    assert_ok(dev->ops->maxpool_backward(dev, p.n, p.c, p.h, p.w, p.k, p.stride, p.pad, dy, am, dx));
    assert_all_close(dx, dx_want, xn, 1e-6, "maxpool dx");
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(dx_want);
    free(am);
  }
}

static void test_maxpool_ties_go_to_the_first_in_the_window(void **state) {
  (void)state;
  /* All zeros, as after a relu: with pad 1 the first window starts outside the image. */
  float x[25] = {0}, y[9];
  int32_t am[9];
  assert_ok(dev->ops->maxpool_forward(dev, 1, 1, 5, 5, 3, 2, 1, x, y, am));
  int32_t want[9] = {0, 1, 3, 5, 6, 8, 15, 16, 18};
  assert_memory_equal(am, want, sizeof want);
}

static void test_avgpool_matches_reference_and_backward_is_adjoint(void **state) {
  (void)state;
  for (size_t t = 0; t < sizeof pool_cases / sizeof pool_cases[0]; t++) {
    pool_case p = pool_cases[t];
    int oh = osz(p.h, p.k, p.stride, p.pad), ow = osz(p.w, p.k, p.stride, p.pad);
    size_t xn = (size_t)p.n * p.c * p.h * p.w, yn = (size_t)p.n * p.c * oh * ow;
    float *x = rand_buf(xn), *y = zero_buf(yn), *dy = rand_buf(yn), *dx = rand_buf(xn);
    assert_ok(dev->ops->avgpool_forward(dev, p.n, p.c, p.h, p.w, p.k, p.stride, p.pad, x, y));
    for (int pl = 0; pl < p.n * p.c; pl++)
      for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++) {
          double s = 0;
          for (int ki = 0; ki < p.k; ki++)
            for (int kj = 0; kj < p.k; kj++) {
              int iy = oy * p.stride - p.pad + ki, ix = ox * p.stride - p.pad + kj;
              if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
                s += x[(size_t)pl * p.h * p.w + iy * p.w + ix];
            }
          size_t o = ((size_t)pl * oh + oy) * ow + ox;
          assert_close(y[o], s / (p.k * p.k), 1e-6, "avgpool", o);
        }
    /* Backward overwrites dx with the adjoint: <avg(x), dy> = <x, avg_backward(dy)>. */
    assert_ok(dev->ops->avgpool_backward(dev, p.n, p.c, p.h, p.w, p.k, p.stride, p.pad, dy, dx));
    assert_close(dot(dx, x, xn), dot(y, dy, yn), 1e-5, "avgpool adjoint", t);
    free(x);
    free(y);
    free(dy);
    free(dx);
  }
}

/* ---- batch norm ------------------------------------------------------------------------ */

static void test_batchnorm_forward_matches_reference(void **state) {
  (void)state;
  int n = 3, c = 2, hw = 5;
  size_t len = (size_t)n * c * hw;
  float *x = rand_buf(len), *y = zero_buf(len);
  for (size_t i = 0; i < len; i++) x[i] = x[i] * 2 + 10; /* a large mean */
  float gamma[2] = {1.5f, -0.5f}, beta[2] = {0.25f, 1}, rmean[2] = {0.5f, 0}, rvar[2] = {2, 1};
  float mean[2], inv_std[2];
  bn_saved saved = {mean, inv_std};
  float mom = 0.1f, eps = 1e-5f;
  assert_ok(dev->ops->batchnorm_forward(dev, n, c, hw, x, gamma, beta, rmean, rvar, mom, eps,
                                        true, saved, y));
  for (int ch = 0; ch < c; ch++) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < hw; j++) s += x[(i * c + ch) * hw + j];
    double mu = s / (n * hw);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < hw; j++) ss += pow(x[(i * c + ch) * hw + j] - mu, 2);
    double var = ss / (n * hw);
    assert_close(mean[ch], mu, 1e-6, "saved mean", ch);
    assert_close(inv_std[ch], 1 / sqrt(var + eps), 1e-5, "saved inv_std", ch);
    double rm0 = ch ? 0 : 0.5, rv0 = ch ? 1 : 2;
    assert_close(rmean[ch], 0.9 * rm0 + 0.1 * mu, 1e-6, "running mean", ch);
    assert_close(rvar[ch], 0.9 * rv0 + 0.1 * ss / (n * hw - 1), 1e-5, "running var", ch);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < hw; j++) {
        size_t at = (size_t)(i * c + ch) * hw + j;
        assert_close(y[at], gamma[ch] * (x[at] - mu) / sqrt(var + eps) + beta[ch], 1e-4, "bn y", at);
      }
  }
  /* Inference uses the running statistics and changes nothing. */
  float rm[2] = {rmean[0], rmean[1]}, rv[2] = {rvar[0], rvar[1]};
  assert_ok(dev->ops->batchnorm_forward(dev, n, c, hw, x, gamma, beta, rmean, rvar, mom, eps,
                                        false, saved, y));
  assert_true(rmean[0] == rm[0] && rvar[1] == rv[1]);
  for (int i = 0; i < n; i++)
    for (int ch = 0; ch < c; ch++)
      for (int j = 0; j < hw; j++) {
        size_t at = (size_t)(i * c + ch) * hw + j;
        assert_close(y[at], gamma[ch] * (x[at] - rm[ch]) / sqrt(rv[ch] + eps) + beta[ch], 1e-5,
                     "bn eval y", at);
      }
  free(x);
  free(y);
}

/* Batch statistics over long planes whose mean is large against their spread (100 +- 0.001),
 * now that planes sum in float: a one-pass variance (E[x^2] - E[x]^2) would lose it entirely. */
static void test_batchnorm_statistics_with_a_large_mean_over_long_planes(void **state) {
  (void)state;
  int n = 3, c = 2, hw = 4000;
  size_t len = (size_t)n * c * hw;
  float *x = rand_buf(len), *y = zero_buf(len);
  for (size_t i = 0; i < len; i++) x[i] = 100.0f + 0.001f * x[i];
  float gamma[2] = {1, 1}, beta[2] = {0, 0}, rmean[2] = {0, 0}, rvar[2] = {1, 1}, mean[2], inv_std[2];
  assert_ok(dev->ops->batchnorm_forward(dev, n, c, hw, x, gamma, beta, rmean, rvar, 0.1f, 1e-12f, true,
                                        (bn_saved){mean, inv_std}, y));
  for (int ch = 0; ch < c; ch++) {
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < hw; j++) s += x[((size_t)i * c + ch) * hw + j];
    double mu = s / ((double)n * hw);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < hw; j++) ss += pow(x[((size_t)i * c + ch) * hw + j] - mu, 2);
    assert_close(mean[ch], mu, 1e-7, "saved mean", (size_t)ch);
    assert_close(inv_std[ch], 1 / sqrt(ss / ((double)n * hw) + 1e-12), 1e-3, "saved inv_std", (size_t)ch);
  }
  free(x);
  free(y);
}

/* ---- optimizer ------------------------------------------------------------------------- */

static void test_sgd_step_matches_pytorch_rule(void **state) {
  (void)state;
  size_t n = 9;
  for (int nesterov = 0; nesterov < 2; nesterov++) {
    float *g = rand_buf(n), *v = rand_buf(n), *w = rand_buf(n);
    float *v_want = malloc(n * sizeof *v), *w_want = malloc(n * sizeof *w);
    float lr = 0.1f, mom = 0.9f, wd = 1e-2f;
    for (size_t i = 0; i < n; i++) {
      float gi = g[i] + wd * w[i];
      v_want[i] = mom * v[i] + gi;
      w_want[i] = w[i] - lr * (nesterov ? gi + mom * v_want[i] : v_want[i]);
    }
    assert_ok(dev->ops->sgd_step(dev, n, lr, mom, wd, nesterov, g, v, w));
    assert_all_close(v, v_want, n, 1e-6, "velocity");
    assert_all_close(w, w_want, n, 1e-6, "weights");
    free(g);
    free(v);
    free(w);
    free(v_want);
    free(w_want);
  }
}


/* ---- layers: gradients against finite differences -------------------------------------- */

/* The loss of a layer test is L = <y, r> for a fixed random r, so dL/dy = r. */
static double layer_loss(layer *l, const fl_tensor *x, const float *r) {
  const fl_tensor *y;
  assert_ok(layer_forward(l, x, true, &y));
  return dot(y->data, r, y->numel);
}

/* Compares one analytic derivative with a central difference of `v` (a float the loss reads);
 * returns whether they agree. */
static bool fd_agrees(layer *l, const fl_tensor *x, const float *r, float *v, double analytic,
                      double eps, const char *what, size_t i) {
  float keep = *v;
  *v = keep + (float)eps;
  double lp = layer_loss(l, x, r);
  *v = keep - (float)eps;
  double lm = layer_loss(l, x, r);
  *v = keep;
  double fd = (lp - lm) / (2 * eps);
  bool ok = fabs(fd - analytic) <= 5e-3 + 2e-2 * fmax(fabs(fd), fabs(analytic));
  if (!ok) fprintf(stderr, "%s %s[%zu]: finite difference %.6g, backward %.6g\n", l->name, what, i, fd, analytic);
  return ok;
}

/* Index k of `checks` spread over n elements (all of them when n <= checks). */
static size_t pick(size_t k, size_t n, size_t checks) {
  if (n <= checks) return k;
  return (size_t)((double)k * (double)n / (double)checks + (urand() + 1) * 0.5 * ((double)n / (double)checks - 1));
}

/* Runs forward and backward of a layer on x (shape and values given) and checks the input
 * gradient and every parameter's gradient by central differences at up to `checks` points
 * each. Layers with relus inside may cross a kink within eps: `misses` of them are allowed. */
static void check_layer(layer_store *s, layer *l, int ndim, const int64_t *shape,
                        const float *xv, double eps, size_t checks, int misses) {
  fl_tensor x = {0}, dy = {0};
  assert_ok(tensor_ensure(&x, dev, ndim, shape));
  memcpy(x.data, xv, x.numel * sizeof(float));
  const fl_tensor *y, *dx;
  assert_ok(layer_forward(l, &x, true, &y));
  assert_ok(tensor_ensure(&dy, dev, y->ndim, y->shape));
  float *r = rand_buf(y->numel);
  memcpy(dy.data, r, y->numel * sizeof(float));
  /* Gradients accumulate: start from a known nonzero value and subtract it after. */
  float *grads = s->grads.data;
  for (size_t i = 0; i < s->nvalues; i++) grads[i] = 0.5f;
  assert_ok(layer_backward(l, &dy, true, &dx));
  float *dxv = malloc(x.numel * sizeof(float));
  memcpy(dxv, dx->data, x.numel * sizeof(float));
  float *g = malloc((s->nvalues ? s->nvalues : 1) * sizeof(float));
  for (size_t i = 0; i < s->nvalues; i++) g[i] = grads[i] - 0.5f;

  int bad = 0, total = 0;
  for (size_t k = 0; k < checks && k < x.numel; k++) {
    size_t i = pick(k, x.numel, checks);
    bad += !fd_agrees(l, &x, r, &x.data[i], dxv[i], eps, "dx", i);
    total++;
  }
  for (size_t p = l->first_param; p < l->first_param + l->nparams; p++) {
    nn_param *prm = &s->params[p];
    for (size_t k = 0; k < checks && k < prm->value.numel; k++) {
      size_t i = pick(k, prm->value.numel, checks);
      bad += !fd_agrees(l, &x, r, &prm->value.data[i], g[prm->offset + i], eps, prm->name, i);
      total++;
    }
  }
  if (bad > misses) {
    fprintf(stderr, "%s: %d of %d derivatives disagree (%d allowed)\n", l->name, bad, total, misses);
    fail();
  }
  free(r);
  free(dxv);
  free(g);
  tensor_release(&x);
  tensor_release(&dy);
}

/* Values kept at least 0.1 away from 0, so that a relu's kink is never within eps. */
static float *away_from_zero(size_t n) {
  float *p = rand_buf(n);
  for (size_t i = 0; i < n; i++) p[i] = p[i] < 0 ? p[i] - 0.1f : p[i] + 0.1f;
  return p;
}

/* Distinct values 0.05 apart in random order, so that no pooling window has a near tie. */
static float *distinct(size_t n) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) p[i] = (float)i * 0.05f - (float)n * 0.025f;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)((urand() + 1) * 0.5 * (double)i) % i;
    float t = p[i - 1];
    p[i - 1] = p[j];
    p[j] = t;
  }
  return p;
}

static void finish(layer_store *s) {
  assert_ok(layer_store_finish(s, 42));
  /* Zero-initialised biases and batch-norm parameters would hide half of the math. */
  float *v = s->values.data;
  for (size_t i = 0; i < s->nvalues; i++) v[i] += 0.3f * urand();
}

static void test_linear_gradients(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *l;
  assert_ok(layer_linear_create(&s, "fc", 10, 7, true, &l));
  finish(&s);
  assert_int_equal(l->nparams, 2);
  assert_string_equal(s.params[0].name, "fc.weight");
  assert_string_equal(s.params[1].name, "fc.bias");
  int64_t shape[3] = {3, 2, 10}; /* over the last dimension: 6 rows of 10 features */
  float *x = rand_buf(60);
  check_layer(&s, l, 3, shape, x, 1e-2, 40, 0);
  int64_t wrong[2] = {3, 9};
  fl_tensor bad = {0};
  assert_ok(tensor_ensure(&bad, dev, 2, wrong));
  assert_fails_with(layer_forward(l, &bad, true, NULL), FL_EINVAL, "input [3, 9], expected [n, ..., 10]");
  tensor_release(&bad);
  free(x);
  layer_destroy(l);
  layer_store_release(&s);
}

static void test_relu_and_flatten_gradients(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *relu, *flat;
  assert_ok(layer_relu_create(&s, &relu));
  assert_ok(layer_flatten_create(&s, &flat));
  finish(&s);
  int64_t shape[4] = {2, 3, 2, 3};
  float *x = away_from_zero(36);
  check_layer(&s, relu, 4, shape, x, 1e-2, 36, 0);
  check_layer(&s, flat, 4, shape, x, 1e-2, 36, 0);
  const fl_tensor *y;
  fl_tensor xt = {0};
  assert_ok(tensor_ensure(&xt, dev, 4, shape));
  assert_ok(layer_forward(flat, &xt, true, &y));
  assert_int_equal(y->ndim, 2);
  assert_int_equal(y->shape[1], 18);
  assert_ptr_equal(y->data, xt.data); /* a view, no copy */
  tensor_release(&xt);
  free(x);
  layer_destroy(relu);
  layer_destroy(flat);
  layer_store_release(&s);
}

static void test_conv2d_gradients(void **state) {
  (void)state;
  static const struct {
    int n, c, h, w, oc, k, stride, pad;
    bool bias;
  } cases[] = {
      {2, 3, 5, 7, 4, 3, 1, 1, true},  {2, 2, 7, 6, 3, 3, 2, 1, false},
      {3, 3, 5, 5, 2, 1, 2, 0, false}, {1, 2, 9, 8, 3, 5, 2, 2, true},
  };
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    layer_store s;
    layer_store_init(&s, dev);
    layer *l;
    assert_ok(layer_conv2d_create(&s, "conv", cases[t].c, cases[t].oc, cases[t].k,
                                  cases[t].stride, cases[t].pad, cases[t].bias, &l));
    finish(&s);
    assert_int_equal(l->nparams, cases[t].bias ? 2 : 1);
    int64_t shape[4] = {cases[t].n, cases[t].c, cases[t].h, cases[t].w};
    size_t n = (size_t)shape[0] * shape[1] * shape[2] * shape[3];
    float *x = rand_buf(n);
    check_layer(&s, l, 4, shape, x, 1e-2, 30, 0);
    const fl_tensor *y;
    fl_tensor xt = {0};
    assert_ok(tensor_ensure(&xt, dev, 4, shape));
    assert_ok(layer_forward(l, &xt, true, &y));
    assert_int_equal(y->shape[1], cases[t].oc);
    assert_int_equal(y->shape[2], osz(cases[t].h, cases[t].k, cases[t].stride, cases[t].pad));
    assert_int_equal(y->shape[3], osz(cases[t].w, cases[t].k, cases[t].stride, cases[t].pad));
    /* Wrong channel count. */
    int64_t wrong[4] = {1, cases[t].c + 1, cases[t].h, cases[t].w};
    assert_ok(tensor_ensure(&xt, dev, 4, wrong));
    assert_fails_with(layer_forward(l, &xt, true, NULL), FL_EINVAL, "conv2d conv: input [1,");
    tensor_release(&xt);
    free(x);
    layer_destroy(l);
    layer_store_release(&s);
  }
}

/* Batches whose columns outgrow the layer's cache-sized chunk (256 KB) go through im2col and the
 * GEMM a few images at a time: 5 images of 8x19x19 in chunks of 2, 2 and 1, 3 of 8x32x32 one
 * at a time, 4 of 8x20x20 (5x5, stride 2) in chunks of 3 and 1. Output and gradients against a
 * direct convolution in double. */
static void test_conv2d_in_chunks_matches_direct_convolution(void **state) {
  (void)state;
  static const struct {
    int n, c, h, w, oc, k, stride, pad;
  } cases[] = {{5, 8, 19, 19, 4, 3, 1, 1}, {3, 8, 32, 32, 3, 3, 1, 1}, {4, 8, 20, 20, 4, 5, 2, 2}};
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    int n = cases[t].n, c = cases[t].c, h = cases[t].h, w = cases[t].w, oc = cases[t].oc, k = cases[t].k,
        st = cases[t].stride, pad = cases[t].pad;
    int oh = osz(h, k, st, pad), ow = osz(w, k, st, pad);
    layer_store s;
    layer_store_init(&s, dev);
    layer *l;
    assert_ok(layer_conv2d_create(&s, "conv", c, oc, k, st, pad, true, &l));
    finish(&s);
    memset(s.grads.data, 0, s.grads.numel * sizeof(float));
    size_t xn = (size_t)n * c * h * w, yn = (size_t)n * oc * oh * ow, wn = (size_t)oc * c * k * k;
    const float *wt = layer_param_value(l, 0), *b = layer_param_value(l, 1);
    float *x = rand_buf(xn), *dyv = rand_buf(yn);
    double *y_want = calloc(yn, sizeof *y_want), *dw_want = calloc(wn, sizeof *dw_want);
    double *db_want = calloc((size_t)oc, sizeof *db_want), *dx_want = calloc(xn, sizeof *dx_want);
    assert_non_null(y_want);
    assert_non_null(dw_want);
    assert_non_null(db_want);
    assert_non_null(dx_want);
    for (int i = 0; i < n; i++)
      for (int o = 0; o < oc; o++)
        for (int oy = 0; oy < oh; oy++)
          for (int ox = 0; ox < ow; ox++) {
            size_t yi = (((size_t)i * oc + o) * oh + oy) * ow + ox;
            double acc = b[o], g = dyv[yi];
            db_want[o] += g;
            for (int ci = 0; ci < c; ci++)
              for (int ki = 0; ki < k; ki++)
                for (int kj = 0; kj < k; kj++) {
                  int iy = oy * st - pad + ki, ix = ox * st - pad + kj;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  size_t xi = (((size_t)i * c + ci) * h + iy) * w + ix, wi = (((size_t)o * c + ci) * k + ki) * k + kj;
                  acc += (double)wt[wi] * x[xi];
                  dw_want[wi] += g * x[xi];
                  dx_want[xi] += g * wt[wi];
                }
            y_want[yi] = acc;
          }
    int64_t shape[4] = {n, c, h, w};
    fl_tensor xt = {0}, dyt = {0};
    assert_ok(tensor_ensure(&xt, dev, 4, shape));
    memcpy(xt.data, x, xn * sizeof *x);
    const fl_tensor *y, *dx;
    assert_ok(layer_forward(l, &xt, true, &y));
    assert_int_equal(y->numel, yn);
    assert_ok(layer_ensure_like(l, &dyt, y));
    memcpy(dyt.data, dyv, yn * sizeof *dyv);
    assert_ok(layer_backward(l, &dyt, true, &dx));
    for (size_t i = 0; i < yn; i++) assert_close(y->data[i], y_want[i], 1e-4, "y", i);
    for (size_t i = 0; i < wn; i++) assert_close(layer_param_grad(l, 0)[i], dw_want[i], 1e-4, "dW", i);
    for (int i = 0; i < oc; i++) assert_close(layer_param_grad(l, 1)[i], db_want[i], 1e-4, "db", (size_t)i);
    for (size_t i = 0; i < xn; i++) assert_close(dx->data[i], dx_want[i], 1e-4, "dx", i);
    tensor_release(&xt);
    tensor_release(&dyt);
    free(x);
    free(dyv);
    free(y_want);
    free(dw_want);
    free(db_want);
    free(dx_want);
    layer_destroy(l);
    layer_store_release(&s);
  }
}

static void test_pooling_gradients(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *max2, *max3, *avg2, *avg3, *gap;
  assert_ok(layer_maxpool_create(&s, 2, 2, 0, &max2));
  assert_ok(layer_maxpool_create(&s, 3, 2, 1, &max3));
  assert_ok(layer_avgpool_create(&s, 2, 2, 0, &avg2));
  assert_ok(layer_avgpool_create(&s, 3, 2, 1, &avg3));
  assert_ok(layer_global_avgpool_create(&s, &gap));
  assert_fails_with(layer_maxpool_create(&s, 2, 2, 2, &max2), FL_EINVAL, "pad 2");
  finish(&s);
  int64_t shape[4] = {2, 2, 5, 7};
  float *x = distinct(140);
  check_layer(&s, max2, 4, shape, x, 1e-2, 60, 0);
  check_layer(&s, max3, 4, shape, x, 1e-2, 60, 0);
  check_layer(&s, avg2, 4, shape, x, 1e-2, 60, 0);
  check_layer(&s, avg3, 4, shape, x, 1e-2, 60, 0);
  check_layer(&s, gap, 4, shape, x, 1e-2, 60, 0);
  fl_tensor xt = {0};
  const fl_tensor *y;
  assert_ok(tensor_ensure(&xt, dev, 4, shape));
  memcpy(xt.data, x, 140 * sizeof(float));
  assert_ok(layer_forward(gap, &xt, true, &y));
  assert_int_equal(y->ndim, 2);
  double mean = 0;
  for (int i = 0; i < 35; i++) mean += x[35 + i];
  assert_close(y->data[1], mean / 35, 1e-5, "global mean", 1);
  tensor_release(&xt);
  free(x);
  layer_destroy(max2);
  layer_destroy(max3);
  layer_destroy(avg2);
  layer_destroy(avg3);
  layer_destroy(gap);
  layer_store_release(&s);
}

static void test_batchnorm_gradients_in_training(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *bn4, *bn2;
  assert_ok(layer_batchnorm_create(&s, "bn", 3, &bn4));
  assert_ok(layer_batchnorm_create(&s, "bn1d", 5, &bn2));
  finish(&s);
  assert_int_equal(s.nbuffers, 16); /* running mean and var of both */
  int64_t shape4[4] = {3, 3, 2, 3}, shape2[2] = {4, 5};
  float *x = rand_buf(54);
  for (int i = 0; i < 54; i++) x[i] = x[i] * 2 + 1;
  check_layer(&s, bn4, 4, shape4, x, 1e-2, 40, 0);
  check_layer(&s, bn2, 2, shape2, x, 1e-2, 40, 0);
  /* Backward needs the statistics of a training forward. */
  fl_tensor xt = {0}, dy = {0};
  assert_ok(tensor_ensure(&xt, dev, 2, shape2));
  assert_ok(tensor_ensure(&dy, dev, 2, shape2));
  assert_ok(layer_forward(bn2, &xt, false, NULL));
  assert_fails_with(layer_backward(bn2, &dy, true, NULL), FL_ESTATE, "inference forward");
  tensor_release(&xt);
  tensor_release(&dy);
  free(x);
  layer_destroy(bn4);
  layer_destroy(bn2);
  layer_store_release(&s);
}

/* A ResNet basic block without its final relu: conv-bn-relu-conv-bn plus the shortcut, a
 * 1x1 convolution with batch norm when the shape changes. */
static layer *basic_block(layer_store *s, const char *name, int in_c, int out_c, int stride) {
  layer *b, *l;
  char sub[64];
#define SUB(suffix) (snprintf(sub, sizeof sub, "%s.%s", name, suffix), sub)
  assert_ok(layer_residual_create(s, name, &b));
  assert_ok(layer_conv2d_create(s, SUB("conv1"), in_c, out_c, 3, stride, 1, false, &l));
  assert_ok(layer_residual_append(b, false, l));
  assert_ok(layer_batchnorm_create(s, SUB("bn1"), out_c, &l));
  assert_ok(layer_residual_append(b, false, l));
  assert_ok(layer_relu_create(s, &l));
  assert_ok(layer_residual_append(b, false, l));
  assert_ok(layer_conv2d_create(s, SUB("conv2"), out_c, out_c, 3, 1, 1, false, &l));
  assert_ok(layer_residual_append(b, false, l));
  assert_ok(layer_batchnorm_create(s, SUB("bn2"), out_c, &l));
  assert_ok(layer_residual_append(b, false, l));
  if (stride != 1 || in_c != out_c) {
    assert_ok(layer_conv2d_create(s, SUB("downsample.0"), in_c, out_c, 1, stride, 0, false, &l));
    assert_ok(layer_residual_append(b, true, l));
    assert_ok(layer_batchnorm_create(s, SUB("downsample.1"), out_c, &l));
    assert_ok(layer_residual_append(b, true, l));
  }
#undef SUB
  layer_residual_close(b);
  return b;
}

static void test_basic_block_gradients(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *same = basic_block(&s, "layer1.0", 3, 3, 1);
  layer *down = basic_block(&s, "layer2.0", 3, 4, 2);
  finish(&s);
  assert_int_equal(same->nparams, 6);
  assert_int_equal(down->nparams, 9);
  assert_string_equal(s.params[same->first_param].name, "layer1.0.conv1.weight");
  assert_string_equal(s.params[down->first_param + 6].name, "layer2.0.downsample.0.weight");
  assert_string_equal(s.params[down->first_param + 8].name, "layer2.0.downsample.1.bias");
  int64_t shape[4] = {2, 3, 5, 5};
  float *x = rand_buf(150);
  /* Relus inside: a difference may straddle a kink now and then. */
  check_layer(&s, same, 4, shape, x, 3e-3, 12, 2);
  check_layer(&s, down, 4, shape, x, 3e-3, 12, 2);
  free(x);
  layer_destroy(same);
  layer_destroy(down);
  layer_store_release(&s);
}

static void test_backward_needs_forward_and_matching_gradient(void **state) {
  (void)state;
  layer_store s;
  layer_store_init(&s, dev);
  layer *l;
  assert_ok(layer_linear_create(&s, "fc", 4, 3, true, &l));
  finish(&s);
  fl_tensor x = {0}, dy = {0};
  int64_t xs[2] = {2, 4}, bad[2] = {2, 4};
  assert_ok(tensor_ensure(&x, dev, 2, xs));
  assert_ok(tensor_ensure(&dy, dev, 2, bad));
  assert_fails_with(layer_backward(l, &dy, true, NULL), FL_ESTATE, "backward without a forward");
  assert_ok(layer_forward(l, &x, true, NULL));
  assert_fails_with(layer_backward(l, &dy, true, NULL), FL_ESTATE, "does not match the output [2, 3]");
  tensor_release(&x);
  tensor_release(&dy);
  layer_destroy(l);
  layer_store_release(&s);
}

/* ---- models ---------------------------------------------------------------------------- */

typedef struct batch {
  fl_tensor x;
  int32_t labels[16];
  int n;
} batch;

static void make_batch(batch *b, const nn_model_spec *sp, int n) {
  *b = (batch){0};
  int64_t shape[4] = {n, sp->channels, sp->height, sp->width};
  assert_ok(tensor_ensure(&b->x, dev, 4, shape));
  for (size_t i = 0; i < b->x.numel; i++) b->x.data[i] = urand();
  b->n = n;
  for (int i = 0; i < n; i++) b->labels[i] = i % sp->classes;
}

/* Forward and loss of the batch (sum over rows, as grad_scale 1 makes the gradient). */
static double model_loss(nn_model *m, batch *b, float grad_scale) {
  const fl_tensor *logits;
  assert_ok(nn_model_forward(m, &b->x, true, &logits));
  float stats[2] = {0, 0};
  assert_ok(nn_model_loss(m, b->labels, grad_scale, stats));
  return stats[0];
}

typedef struct ready_log {
  nn_model *m;
  size_t next_end; /* the range reported next must end here */
  int calls;
  float *snapshot; /* gradients as they were when reported */
} ready_log;

static fl_status on_ready(size_t first, size_t count, void *user) {
  ready_log *r = user;
  assert_true(count > 0);
  assert_int_equal(first + count, r->next_end);
  r->next_end = first;
  r->calls++;
  nn_param *p0 = nn_model_param(r->m, first), *pl = nn_model_param(r->m, first + count - 1);
  size_t from = p0->offset, to = pl->offset + pl->value.numel;
  memcpy(r->snapshot + from, nn_model_grads(r->m)->data + from, (to - from) * sizeof(float));
  return FL_OK;
}

/* Sets every zero-initialised batch-norm gamma to 0.5: a block that starts as the identity
 * (ResNet-50's) puts the relu after its sum exactly on the kink at the zeros of its input, where
 * finite differences take half a slope that backward (rightly) does not. */
static void unzero_gammas(nn_model *m) {
  for (size_t i = 0; i < nn_model_param_count(m); i++) {
    nn_param *p = nn_model_param(m, i);
    if (!strstr(p->name, "bn") || !strstr(p->name, ".weight")) continue;
    for (size_t j = 0; j < p->value.numel; j++)
      if (p->value.data[j] == 0.0f) p->value.data[j] = 0.5f;
  }
}

static void check_model(const nn_model_spec *sp, size_t want_params, double eps, double max_rel) {
  nn_model *m = NULL;
  assert_ok(nn_model_create(dev, sp, &m));
  unzero_gammas(m);
  size_t np = nn_model_param_count(m);
  assert_int_equal(np, want_params);
  /* Parameters tile the flat buffers in order. */
  size_t at = 0;
  for (size_t i = 0; i < np; i++) {
    nn_param *p = nn_model_param(m, i);
    assert_int_equal(p->offset, at);
    assert_ptr_equal(p->value.data, nn_model_values(m)->data + at);
    assert_ptr_equal(p->grad.data, nn_model_grads(m)->data + at);
    at += p->value.numel;
  }
  assert_int_equal(at, nn_model_values(m)->numel);
  assert_int_equal(at, nn_model_grads(m)->numel);
  assert_null(nn_model_param(m, np));

  batch b;
  make_batch(&b, sp, 4);
  const fl_tensor *logits;
  assert_ok(nn_model_forward(m, &b.x, true, &logits));
  assert_int_equal(logits->ndim, 2);
  assert_int_equal(logits->shape[0], 4);
  assert_int_equal(logits->shape[1], sp->classes);

  /* Backward reports every parameter once, last first, each range already final. */
  assert_ok(nn_model_zero_grad(m));
  model_loss(m, &b, 1.0f);
  ready_log r = {m, np, 0, calloc(at, sizeof(float))};
  assert_ok(nn_model_backward(m, on_ready, &r));
  assert_int_equal(r.next_end, 0);
  assert_true(r.calls > 0);
  float *g = malloc(at * sizeof(float));
  memcpy(g, nn_model_grads(m)->data, at * sizeof(float));
  assert_memory_equal(r.snapshot, g, at * sizeof(float));
  free(r.snapshot);

  /* A second backward of the same loss adds the same gradients again. */
  assert_ok(nn_model_backward(m, NULL, NULL));
  for (size_t i = 0; i < at; i += 1 + at / 50)
    assert_close(nn_model_grads(m)->data[i], 2 * g[i], 1e-5, "accumulated", i);

  /* Finite differences along each parameter's own gradient: moving a parameter by eps in
   * the direction g/|g| must change the loss by eps |g|. Along a whole tensor, the relu
   * kinks that a step crosses average out, where single elements of early layers of a deep
   * net are too noisy to check in float. Every parameter must agree within max_rel, most of
   * them far closer. */
  float *w = nn_model_values(m)->data;
  float *keep = malloc(at * sizeof(float));
  memcpy(keep, w, at * sizeof(float));
  double *rels = calloc(np, sizeof(double));
  size_t checked = 0;
  for (size_t k = 0; k < np; k++) {
    nn_param *p = nn_model_param(m, k);
    const float *gp = g + p->offset;
    double norm = sqrt(dot(gp, gp, p->value.numel));
    if (norm < 1e-2) continue; /* too small to tell from rounding */
    double lp, lm;
    for (size_t i = 0; i < p->value.numel; i++) w[p->offset + i] = keep[p->offset + i] + (float)(eps * gp[i] / norm);
    lp = model_loss(m, &b, 1.0f);
    for (size_t i = 0; i < p->value.numel; i++) w[p->offset + i] = keep[p->offset + i] - (float)(eps * gp[i] / norm);
    lm = model_loss(m, &b, 1.0f);
    memcpy(w + p->offset, keep + p->offset, p->value.numel * sizeof(float));
    double fd = (lp - lm) / (2 * eps), rel = fabs(fd - norm) / norm;
    if (rel > max_rel)
      fprintf(stderr, "%s %s: finite difference %.6g, |g| %.6g\n", nn_model_kind_name(sp->kind),
              p->name, fd, norm);
    assert_true(rel <= max_rel);
    rels[checked++] = rel;
  }
  assert_true(checked >= np / 2);
  size_t close = 0;
  for (size_t k = 0; k < checked; k++) close += rels[k] < 0.02;
  if (close < checked * 3 / 4) fprintf(stderr, "only %zu of %zu within 2%%\n", close, checked);
  assert_true(close >= checked * 3 / 4);
  free(rels);
  free(keep);

  /* A few steps of plain SGD (w -= lr * g through the device's axpy) lower the loss. */
  double first = 0, last = 0;
  for (int step = 0; step < 6; step++) {
    assert_ok(nn_model_zero_grad(m));
    double loss = model_loss(m, &b, 1.0f / b.n) / b.n;
    if (step == 0) first = loss;
    last = loss;
    assert_ok(nn_model_backward(m, NULL, NULL));
    assert_ok(dev->ops->axpy(dev, at, -0.05f, nn_model_grads(m)->data, nn_model_values(m)->data));
  }
  if (!(last < first)) fprintf(stderr, "%s: loss %g -> %g\n", nn_model_kind_name(sp->kind), first, last);
  assert_true(last < first);

  /* Inference works on a smaller batch without reallocation trouble. */
  batch small;
  make_batch(&small, sp, 2);
  assert_ok(nn_model_forward(m, &small.x, false, &logits));
  assert_int_equal(logits->shape[0], 2);
  for (size_t i = 0; i < logits->numel; i++) assert_true(isfinite(logits->data[i]));
  tensor_release(&small.x);
  tensor_release(&b.x);
  free(g);
  nn_model_destroy(m);
}

static void test_mlp_model(void **state) {
  (void)state;
  nn_model_spec sp = {.kind = NN_MLP, .channels = 1, .height = 6, .width = 5, .classes = 4,
                      .hidden = 16, .seed = 7};
  check_model(&sp, 6, 1e-3, 0.02);
  nn_model *m;
  sp.hidden = 0; /* default 256 */
  assert_ok(nn_model_create(dev, &sp, &m));
  assert_int_equal(nn_model_values(m)->numel, 30 * 256 + 256 + 256 * 256 + 256 + 256 * 4 + 4);
  assert_int_equal(nn_model_buffers(m)->numel, 0);
  assert_string_equal(nn_model_param(m, 0)->name, "fc1.weight");
  nn_model_destroy(m);
}

static void test_cnn_model(void **state) {
  (void)state;
  nn_model_spec sp = {.kind = NN_CNN, .channels = 1, .height = 12, .width = 10, .classes = 3,
                      .seed = 3};
  check_model(&sp, 10, 1e-3, 0.02);
  /* Fashion-MNIST: fc1 takes 64 x 7 x 7; 224x224 is averaged down to 7x7 first. */
  nn_model *m;
  nn_model_spec fm = {.kind = NN_CNN, .channels = 1, .height = 28, .width = 28, .classes = 10};
  assert_ok(nn_model_create(dev, &fm, &m));
  assert_int_equal(nn_model_param(m, 6)->value.shape[1], 64 * 7 * 7);
  nn_model_destroy(m);
  nn_model_spec big = {.kind = NN_CNN, .channels = 3, .height = 224, .width = 224, .classes = 10};
  assert_ok(nn_model_create(dev, &big, &m));
  assert_string_equal(nn_model_param(m, 6)->name, "fc1.weight");
  assert_int_equal(nn_model_param(m, 6)->value.shape[1], 64 * 7 * 7);
  nn_model_destroy(m);
}

/* ResNet-50: bottleneck blocks whose last batch norm starts at gamma 0 (Goyal et al.), and
 * torchvision's resnet50 parameter count at the ImageNet shape. */
static void test_resnet50_model(void **state) {
  (void)state;
  nn_model_spec sp = {.kind = NN_RESNET50, .channels = 1, .height = 16, .width = 16,
                      .classes = 5, .width_mult = 4, .seed = 11};
  /* A small step: sixteen blocks of tiny feature maps bend the loss within 3e-4. */
  check_model(&sp, 161, 5e-5, 0.15);
  nn_model *m;
  nn_model_spec in = {.kind = NN_RESNET50, .channels = 3, .height = 224, .width = 224, .classes = 1000, .seed = 1};
  assert_ok(nn_model_create(dev, &in, &m));
  assert_int_equal(nn_model_values(m)->numel, 25557032);
  size_t zero_gammas = 0, blocks = 0;
  for (size_t i = 0; i < nn_model_param_count(m); i++) {
    nn_param *p = nn_model_param(m, i);
    size_t len = strlen(p->name);
    if (len > 11 && strcmp(p->name + len - 11, ".bn3.weight") == 0) {
      blocks++;
      bool all_zero = true;
      for (size_t j = 0; j < p->value.numel; j++) all_zero &= p->value.data[j] == 0.0f;
      zero_gammas += all_zero;
    }
  }
  assert_int_equal(blocks, 16);
  assert_int_equal(zero_gammas, 16);
  nn_model_destroy(m);
}

static void test_resnet18_model(void **state) {
  (void)state;
  nn_model_spec sp = {.kind = NN_RESNET18, .channels = 1, .height = 16, .width = 16,
                      .classes = 5, .width_mult = 4, .seed = 11};
  check_model(&sp, 62, 3e-4, 0.15);
  /* The ImageNet shape has PyTorch's resnet18 parameter count. */
  nn_model *m;
  nn_model_spec in = {.kind = NN_RESNET18, .channels = 3, .height = 224, .width = 224,
                      .classes = 1000, .seed = 1};
  assert_ok(nn_model_create(dev, &in, &m));
  assert_int_equal(nn_model_values(m)->numel, 11689512);
  assert_int_equal(nn_model_buffers(m)->numel, 2 * 4800);
  assert_string_equal(nn_model_param(m, 0)->name, "conv1.weight");
  assert_int_equal(nn_model_param(m, 0)->value.shape[3], 7);
  assert_string_equal(nn_model_param(m, 61)->name, "fc.bias");
  bool found = false;
  for (size_t i = 0; i < nn_model_param_count(m); i++)
    found |= strcmp(nn_model_param(m, i)->name, "layer3.0.downsample.1.weight") == 0;
  assert_true(found);
  /* He init: conv1's weights have std sqrt(2 / (3 * 7 * 7)). */
  nn_param *c1 = nn_model_param(m, 0);
  double ss = 0;
  for (size_t i = 0; i < c1->value.numel; i++) ss += (double)c1->value.data[i] * c1->value.data[i];
  assert_close(sqrt(ss / c1->value.numel), sqrt(2.0 / 147), 0.05, "he std", 0);
  nn_model_destroy(m);
}

/* One training step's logits and gradients, from a model made fresh. */
static void fresh_step(const nn_model_spec *sp, batch *b, float *logits_out, float *grads_out) {
  nn_model *m;
  assert_ok(nn_model_create(dev, sp, &m));
  const fl_tensor *logits;
  assert_ok(nn_model_forward(m, &b->x, true, &logits));
  memcpy(logits_out, logits->data, logits->numel * sizeof(float));
  float stats[2] = {0, 0};
  assert_ok(nn_model_loss(m, b->labels, 1.0f, stats));
  assert_ok(nn_model_zero_grad(m));
  assert_ok(nn_model_backward(m, NULL, NULL));
  memcpy(grads_out, nn_model_grads(m)->data, nn_model_grads(m)->numel * sizeof(float));
  nn_model_destroy(m);
}

static void test_models_follow_batches_that_shrink_and_grow(void **state) {
  (void)state;
  /* The ImageNet stem (7x7/2 conv, 3x3/2 max pool) above 64 pixels a side, and the CNN's
   * extra averaging above 28x28, on a batch of 2, then 5, then 2 again. */
  nn_model_spec specs[2] = {
      {.kind = NN_RESNET18, .channels = 3, .height = 72, .width = 68, .classes = 3,
       .width_mult = 2, .seed = 9},
      {.kind = NN_CNN, .channels = 2, .height = 56, .width = 60, .classes = 4, .seed = 9},
  };
  for (int t = 0; t < 2; t++) {
    nn_model_spec *sp = &specs[t];
    nn_model *m;
    assert_ok(nn_model_create(dev, sp, &m));
    size_t np = nn_model_grads(m)->numel;
    float *g = malloc(np * sizeof(float)), *g_fresh = malloc(np * sizeof(float));
    float logits_fresh[5 * 4];
    int sizes[3] = {2, 5, 2};
    for (int k = 0; k < 3; k++) {
      batch b;
      make_batch(&b, sp, sizes[k]);
      const fl_tensor *logits;
      assert_ok(nn_model_forward(m, &b.x, true, &logits));
      assert_int_equal(logits->shape[0], sizes[k]);
      float stats[2] = {0, 0};
      assert_ok(nn_model_loss(m, b.labels, 1.0f, stats));
      assert_true(isfinite(stats[0]));
      assert_ok(nn_model_zero_grad(m));
      assert_ok(nn_model_backward(m, NULL, NULL));
      memcpy(g, nn_model_grads(m)->data, np * sizeof(float));
      /* The same as a model that never saw another batch size. */
      fresh_step(sp, &b, logits_fresh, g_fresh);
      assert_ok(nn_model_forward(m, &b.x, true, &logits));
      assert_all_close(logits->data, logits_fresh, logits->numel, 1e-5, "logits");
      assert_all_close(g, g_fresh, np, 1e-4, "grads");
      tensor_release(&b.x);
    }
    free(g);
    free(g_fresh);
    nn_model_destroy(m);
  }
}

static void test_models_are_seeded(void **state) {
  (void)state;
  nn_model_spec sp = {.kind = NN_RESNET18, .channels = 3, .height = 8, .width = 8,
                      .classes = 2, .width_mult = 2, .seed = 5};
  nn_model *a, *b, *c;
  assert_ok(nn_model_create(dev, &sp, &a));
  assert_ok(nn_model_create(dev, &sp, &b));
  sp.seed = 6;
  assert_ok(nn_model_create(dev, &sp, &c));
  size_t n = nn_model_values(a)->numel;
  assert_memory_equal(nn_model_values(a)->data, nn_model_values(b)->data, n * sizeof(float));
  assert_memory_not_equal(nn_model_values(a)->data, nn_model_values(c)->data, n * sizeof(float));
  /* Running statistics start at mean 0, variance 1 and move in training forwards. */
  fl_tensor *buf = nn_model_buffers(a);
  assert_true(buf->data[0] == 0.0f && buf->data[2] == 1.0f);
  nn_model_destroy(a);
  nn_model_destroy(b);
  nn_model_destroy(c);
}

#ifdef TEST_GPU_LAYERS_CUDA
/* |a - b| within tol of the largest |b|: sums in another order differ by rounding only. */
static void assert_close_to_scale(const float *a, const float *b, size_t n, double tol,
                                  const char *what) {
  double scale = 0;
  for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
  for (size_t i = 0; i < n; i++)
    if (fabs((double)a[i] - b[i]) > tol * (scale > 0 ? scale : 1)) {
      fprintf(stderr, "%s[%zu]: cuda %.7g, cpu %.7g (scale %.3g)\n", what, i, a[i], b[i], scale);
      fail();
    }
}

static float *read_all(const fl_tensor *t) {
  float *p = malloc((t->numel ? t->numel : 1) * sizeof *p);
  assert_non_null(p);
  assert_ok(fl_tensor_read(t, p, t->numel));
  return p;
}

/* The layers are written once against the device operations: on a GPU the same models give
 * the cpu's weights, logits, loss, gradients and running statistics. Built as
 * test_gpu_layers_cuda, which is reported skipped without a GPU. */
static void test_models_match_between_cpu_and_cuda(void **state) {
  (void)state;
  fl_device *gpu;
  assert_ok(fl_device_open(FL_DEVICE_CUDA, 0, &gpu));
  nn_model_spec specs[] = {
      {.kind = NN_MLP, .channels = 1, .height = 6, .width = 5, .classes = 4, .hidden = 16, .seed = 7},
      {.kind = NN_CNN, .channels = 2, .height = 28, .width = 28, .classes = 10, .seed = 3},
      {.kind = NN_RESNET18, .channels = 1, .height = 16, .width = 16, .classes = 5,
       .width_mult = 4, .seed = 11},
      {.kind = NN_RESNET18, .channels = 3, .height = 72, .width = 68, .classes = 3,
       .width_mult = 2, .seed = 9},
  };
  for (size_t t = 0; t < sizeof specs / sizeof specs[0]; t++) {
    const nn_model_spec *sp = &specs[t];
    const char *name = nn_model_kind_name(sp->kind);
    nn_model *mc, *mg;
    assert_ok(nn_model_create(dev, sp, &mc));
    assert_ok(nn_model_create(gpu, sp, &mg));
    float *vc = read_all(nn_model_values(mc)), *vg = read_all(nn_model_values(mg));
    assert_memory_equal(vc, vg, nn_model_values(mc)->numel * sizeof(float));

    batch b;
    make_batch(&b, sp, 6);
    fl_tensor *xg;
    assert_ok(fl_tensor_create(gpu, 4, b.x.shape, &xg));
    assert_ok(fl_tensor_write(xg, b.x.data, b.x.numel));
    int32_t *labels_g;
    float *stats_g;
    assert_ok(gpu->ops->alloc(gpu, sizeof b.labels, (void **)&labels_g));
    assert_ok(gpu->ops->from_host(gpu, labels_g, b.labels, sizeof b.labels));
    assert_ok(gpu->ops->alloc(gpu, 2 * sizeof(float), (void **)&stats_g));
    assert_ok(gpu->ops->memset0(gpu, stats_g, 2 * sizeof(float)));

    const fl_tensor *lc, *lg;
    float stats_c[2] = {0, 0}, stats_h[2];
    assert_ok(nn_model_forward(mc, &b.x, true, &lc));
    assert_ok(nn_model_forward(mg, xg, true, &lg));
    float *logits_g = read_all(lg);
    assert_close_to_scale(logits_g, lc->data, lc->numel, 1e-4, name);
    assert_ok(nn_model_loss(mc, b.labels, 1.0f / 6, stats_c));
    assert_ok(nn_model_loss(mg, labels_g, 1.0f / 6, stats_g));
    assert_ok(nn_model_zero_grad(mc));
    assert_ok(nn_model_zero_grad(mg));
    assert_ok(nn_model_backward(mc, NULL, NULL));
    assert_ok(nn_model_backward(mg, NULL, NULL));
    assert_ok(gpu->ops->to_host(gpu, stats_h, stats_g, sizeof stats_h));
    assert_close(stats_h[0], stats_c[0], 1e-4, "loss", t);
    assert_close(stats_h[1], stats_c[1], 0, "correct", t);
    float *gg = read_all(nn_model_grads(mg)), *bg = read_all(nn_model_buffers(mg));
    assert_close_to_scale(gg, nn_model_grads(mc)->data, nn_model_grads(mc)->numel, 1e-3, name);
    assert_close_to_scale(bg, nn_model_buffers(mc)->data, nn_model_buffers(mc)->numel, 1e-4, name);

    gpu->ops->free(gpu, labels_g);
    gpu->ops->free(gpu, stats_g);
    free(vc);
    free(vg);
    free(logits_g);
    free(gg);
    free(bg);
    fl_tensor_destroy(xg);
    tensor_release(&b.x);
    nn_model_destroy(mc);
    nn_model_destroy(mg);
  }
  fl_device_close(gpu);
}
#endif /* TEST_GPU_LAYERS_CUDA */

static void test_model_bad_specs_and_calls(void **state) {
  (void)state;
  nn_model *m = NULL;
  nn_model_spec sp = {.kind = NN_RESNET18, .channels = 1, .height = 6, .width = 28, .classes = 10};
  assert_fails_with(nn_model_create(dev, &sp, &m), FL_EINVAL, "6x28 image is too small");
  sp = (nn_model_spec){.kind = NN_CNN, .channels = 1, .height = 3, .width = 3, .classes = 10};
  assert_fails_with(nn_model_create(dev, &sp, &m), FL_EINVAL, "too small");
  sp = (nn_model_spec){.kind = NN_MLP, .channels = 1, .height = 3, .width = 3, .classes = 0};
  assert_fails_with(nn_model_create(dev, &sp, &m), FL_EINVAL, "0 classes");
  sp.classes = 2;
  sp.kind = (nn_model_kind)9;
  assert_fails_with(nn_model_create(dev, &sp, &m), FL_EINVAL, "unknown model kind 9");
  assert_null(m);
  nn_model_kind kind;
  assert_ok(nn_model_kind_parse("resnet18", &kind));
  assert_int_equal(kind, NN_RESNET18);
  assert_ok(nn_model_kind_parse("cnn", &kind));
  assert_int_equal(kind, NN_CNN);
  assert_fails_with(nn_model_kind_parse("vgg", &kind), FL_EINVAL, "unknown model 'vgg'");
  assert_string_equal(nn_model_kind_name(NN_MLP), "mlp");

  sp = (nn_model_spec){.kind = NN_MLP, .channels = 1, .height = 3, .width = 3, .classes = 2, .hidden = 4};
  assert_ok(nn_model_create(dev, &sp, &m));
  float stats[2] = {0, 0};
  int32_t labels[2] = {0, 5};
  assert_fails_with(nn_model_loss(m, labels, 1, stats), FL_ESTATE, "no forward");
  assert_fails_with(nn_model_backward(m, NULL, NULL), FL_ESTATE, "no loss");
  batch b;
  make_batch(&b, &sp, 2);
  const fl_tensor *logits;
  assert_ok(nn_model_forward(m, &b.x, true, &logits));
  assert_fails_with(nn_model_loss(m, labels, 1, stats), FL_EINVAL, "row 1 has label 5");
  fl_tensor wrong = {0};
  int64_t ws[4] = {2, 1, 3, 4};
  assert_ok(tensor_ensure(&wrong, dev, 4, ws));
  assert_fails_with(nn_model_forward(m, &wrong, true, &logits), FL_EINVAL, "expected [n, 1, 3, 3]");
  tensor_release(&wrong);
  tensor_release(&b.x);
  nn_model_destroy(m);
  nn_model_destroy(NULL);
}

int main(void) {
#ifdef TEST_GPU_LAYERS_CUDA
  /* test_gpu_layers_cuda: the same file, only the comparison with a GPU (77: skipped). */
  if (fl_cuda_device_count() == 0) {
    printf("test_gpu_layers_cuda: skipped: no usable GPU\n");
    return 77;
  }
  const struct CMUnitTest cuda_tests[] = {cmocka_unit_test(test_models_match_between_cpu_and_cuda)};
  return cmocka_run_group_tests(cuda_tests, setup_device, teardown_device);
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_all_transposes_match_reference),
      cmocka_unit_test(test_elementwise_ops_match_reference),
      cmocka_unit_test(test_bias_ops_add_and_accumulate),
      cmocka_unit_test(test_softmax_xent_matches_reference_and_is_stable),
      cmocka_unit_test(test_softmax_xent_rejects_bad_label),
      cmocka_unit_test(test_im2col_matches_reference_and_col2im_is_its_adjoint),
      cmocka_unit_test(test_swap01_transposes_the_outer_axes),
      cmocka_unit_test(test_maxpool_matches_reference),
      cmocka_unit_test(test_maxpool_ties_go_to_the_first_in_the_window),
      cmocka_unit_test(test_avgpool_matches_reference_and_backward_is_adjoint),
      cmocka_unit_test(test_batchnorm_forward_matches_reference),
      cmocka_unit_test(test_sgd_step_matches_pytorch_rule),
      cmocka_unit_test(test_linear_gradients),
      cmocka_unit_test(test_relu_and_flatten_gradients),
      cmocka_unit_test(test_conv2d_gradients),
      cmocka_unit_test(test_pooling_gradients),
      cmocka_unit_test(test_batchnorm_gradients_in_training),
      cmocka_unit_test(test_basic_block_gradients),
      cmocka_unit_test(test_backward_needs_forward_and_matching_gradient),
      cmocka_unit_test(test_mlp_model),
      cmocka_unit_test(test_cnn_model),
      cmocka_unit_test(test_resnet18_model),
      cmocka_unit_test(test_resnet50_model),
      cmocka_unit_test(test_models_follow_batches_that_shrink_and_grow),
      cmocka_unit_test(test_models_are_seeded),
      cmocka_unit_test(test_model_bad_specs_and_calls),
      /* Last: their random data would shift the inputs of the finite-difference checks after them. */
      cmocka_unit_test(test_conv2d_in_chunks_matches_direct_convolution),
      cmocka_unit_test(test_batchnorm_statistics_with_a_large_mean_over_long_planes),
  };
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
