/* test_gpu_layers.c: the cpu device's operations against plain reference loops, every layer's
 * gradients against finite differences, and the models of gpu/nn.h (shapes, gradients, the
 * grads-ready callback, and loss going down under a few hand-made SGD steps). */
#include "test_util.h"

#include <math.h>

#include "common/common.h"
#include "gpu/device.h"

static fl_device *dev;

static int setup_device(void **state) {
  (void)state;
  return fl_device_open(FL_DEVICE_CPU, 0, &dev) == FL_OK ? 0 : -1;
}

static int teardown_device(void **state) {
  (void)state;
  fl_device_close(dev);
  dev = NULL;
  return 0;
}

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567u;

/* Uniform in [-1, 1): a small xorshift is enough for test data. */
static float urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *rand_buf(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = urand();
  return p;
}

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
  assert_ok(dev->ops->softmax_xent(dev, n, c, z, labels, scale, d, stats));
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
  assert_fails_with(dev->ops->softmax_xent(dev, n, c, z, high, 1, d, stats), FL_EINVAL,
                    "row 2 has label 4 outside [0, 4)");
  assert_fails_with(dev->ops->softmax_xent(dev, n, c, z, negative, 1, d, stats), FL_EINVAL,
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_all_transposes_match_reference),
      cmocka_unit_test(test_elementwise_ops_match_reference),
      cmocka_unit_test(test_bias_ops_add_and_accumulate),
      cmocka_unit_test(test_softmax_xent_matches_reference_and_is_stable),
      cmocka_unit_test(test_softmax_xent_rejects_bad_label),
      cmocka_unit_test(test_im2col_matches_reference_and_col2im_is_its_adjoint),
      cmocka_unit_test(test_swap01_transposes_the_outer_axes),
      cmocka_unit_test(test_maxpool_matches_reference),
      cmocka_unit_test(test_avgpool_matches_reference_and_backward_is_adjoint),
      cmocka_unit_test(test_batchnorm_forward_matches_reference),
      cmocka_unit_test(test_sgd_step_matches_pytorch_rule),
  };
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
