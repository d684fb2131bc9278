/* test_gpu_ops_cuda.c: the cuda device's transformer operations (gpu/device/backend.h:
 * gemm_batched, GELU, row softmax, keyed dropout, mean over tokens) against reference loops
 * written here in double, not against the cpu device, so that each device is checked against
 * the contract on its own.
 *
 * Tolerances are relative to the magnitude of the terms that make up each result (for a sum,
 * the sum of |terms|), which is what float arithmetic can promise when terms cancel:
 * |cuda - ref| <= tol * magnitude, tol 1e-5 (GEMM 1e-4). Outputs start as NaN, so an element
 * a kernel forgets to write fails. Dropout's mask must equal dropout_keep's decisions exactly,
 * and a shard's mask must equal the same elements' mask in the whole tensor. Shapes include
 * one row, one column, 1000 columns, rows longer than a warp's share, and batches of 3.
 * Without a usable GPU the program exits 77, which ctest reports as skipped. */
#include "test_util.h"

#include <math.h>

#include "gpu/device/device.h"

#define SKIP_CODE 77

static fl_device *gpu;

static int setup_device(void **state) {
  (void)state;
  if (fl_device_open(FL_DEVICE_CUDA, 0, &gpu) != FL_OK) {
    fprintf(stderr, "cannot open cuda:0: %s\n", fl_last_error());
    return -1;
  }
  return 0;
}

static int teardown_device(void **state) {
  (void)state;
  fl_device_close(gpu);
  return 0;
}

/* ---- host and device buffers ----------------------------------------------------------- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

/* Uniform in +-[0.05, 1): never zero, so that dropped elements are told from kept ones. */
static float urand(void) { return test_urand_signed(&rng_state); }

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

static float *host_rand(size_t n, float scale) {
  float *h = xmalloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = scale * urand();
  return h;
}

static float *dev_alloc(size_t n) {
  void *p = NULL;
  assert_ok(gpu->ops->alloc(gpu, (n ? n : 1) * sizeof(float), &p));
  assert_non_null(p);
  return p;
}

static float *dev_from(const float *h, size_t n) {
  float *d = dev_alloc(n);
  assert_ok(gpu->ops->from_host(gpu, d, h, n * sizeof(float)));
  return d;
}

/* Device memory full of NaN (outputs start like this). */
static float *dev_poison(size_t n) {
  float *h = xmalloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  float *d = dev_from(h, n);
  free(h);
  return d;
}

static float *host_from(const float *d, size_t n) {
  float *h = xmalloc(n * sizeof *h);
  assert_ok(gpu->ops->to_host(gpu, h, d, n * sizeof(float)));
  return h;
}

static void dev_free(float *d) { gpu->ops->free(gpu, d); }

/* Checks a device result against ref: |got - ref| <= tol * mag (mag NULL: |ref|). */
static void expect_close(const float *dev, const double *ref, const double *mag, size_t n,
                         double tol, const char *what) {
  float *got = host_from(dev, n);
  for (size_t i = 0; i < n; i++) {
    double m = mag ? mag[i] : fabs(ref[i]);
    double d = fabs((double)got[i] - ref[i]);
    if (isnan(got[i]) || !(d <= tol * m + 1e-30)) {
      fprintf(stderr, "%s: %zu elements, first mismatch [%zu]: cuda %.9g, reference %.9g "
                      "(allowed %.3g)\n",
              what, n, i, got[i], ref[i], tol * m);
      free(got);
      fail();
    }
  }
  free(got);
}

#define TOL 1e-5
#define GEMM_TOL 1e-4
static double gemm_tol = GEMM_TOL; /* test_gemm_precisions loosens it */

/* ---- gemm_batched ---------------------------------------------------------------------- */

/* One batched product: stride_x is the matrix's size plus `gap` (or 0 for b when
 * shared_b, every batch then reading the same B). */
static void run_gemm_batched(bool ta, bool tb, int m, int n, int k, int batch, int pad,
                             int gap, bool shared_b, float alpha, float beta) {
  int rows_a = ta ? k : m, cols_a = ta ? m : k;
  int rows_b = tb ? n : k, cols_b = tb ? k : n;
  int lda = (cols_a ? cols_a : 1) + pad, ldb = (cols_b ? cols_b : 1) + pad, ldc = n + pad;
  size_t sa = (size_t)rows_a * lda + gap, sb = shared_b ? 0 : (size_t)rows_b * ldb + gap;
  size_t sc = (size_t)m * ldc + gap;
  size_t na = sa * batch, nb = shared_b ? (size_t)rows_b * ldb : sb * batch, nc = sc * batch;
  float *ha = host_rand(na, 1.0f), *hb = host_rand(nb, 1.0f), *hc = host_rand(nc, 1.0f);
  if (beta == 0)
    for (size_t i = 0; i < nc; i++) hc[i] = NAN; /* beta 0 must not read C */
  float *a = dev_from(ha, na), *b = dev_from(hb, nb), *c = dev_from(hc, nc);

  double *ref = xmalloc(nc * sizeof *ref), *mag = xmalloc(nc * sizeof *mag);
  /* Elements outside the products (padding, gaps) must be left as they were. */
  for (size_t i = 0; i < nc; i++) {
    ref[i] = hc[i];
    mag[i] = 0;
  }
  for (int p = 0; p < batch; p++)
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double acc = 0, abs_acc = 0;
        for (int q = 0; q < k; q++) {
          double av = ta ? ha[p * sa + (size_t)q * lda + i] : ha[p * sa + (size_t)i * lda + q];
          double bv = tb ? hb[p * sb + (size_t)j * ldb + q] : hb[p * sb + (size_t)q * ldb + j];
          acc += av * bv;
          abs_acc += fabs(av * bv);
        }
        size_t at = p * sc + (size_t)i * ldc + j;
        double old = beta == 0 ? 0 : hc[at];
        ref[at] = alpha * acc + beta * old;
        mag[at] = fabs(alpha) * abs_acc + fabs(beta * old);
      }

  assert_ok(gpu->ops->gemm_batched(gpu, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta,
                                   c, ldc, sc, batch));
  float *got = host_from(c, nc);
  for (size_t i = 0; i < nc; i++) {
    bool outside = mag[i] == 0 && isnan(ref[i]);
    double d = fabs((double)got[i] - ref[i]);
    bool ok = outside ? isnan(got[i]) : (!isnan(got[i]) && d <= gemm_tol * mag[i] + 1e-30);
    if (!ok) {
      fprintf(stderr, "gemm_batched ta %d tb %d m %d n %d k %d batch %d pad %d gap %d "
                      "shared_b %d alpha %g beta %g: [%zu] cuda %.9g, reference %.9g\n",
              ta, tb, m, n, k, batch, pad, gap, shared_b, alpha, beta, i, got[i], ref[i]);
      fail();
    }
  }
  free(got);
  free(ref);
  free(mag);
  free(ha);
  free(hb);
  free(hc);
  dev_free(a);
  dev_free(b);
  dev_free(c);
}

static void test_gemm_batched(void **state) {
  (void)state;
  static const int shapes[][4] = {/* m, n, k, batch */
                                  {1, 1, 1, 1},   {1, 1, 1, 3},     {7, 5, 3, 3},
                                  {1, 1000, 9, 3}, {33, 1, 17, 2},   {16, 24, 1000, 3},
                                  {65, 31, 1, 1}, {4, 6, 0, 3}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) {
      bool ta = t & 1, tb = t & 2;
      const int *sh = shapes[s];
      run_gemm_batched(ta, tb, sh[0], sh[1], sh[2], sh[3], 0, 0, false, 1.0f, 0.0f);
      run_gemm_batched(ta, tb, sh[0], sh[1], sh[2], sh[3], 3, 5, false, 0.5f, -0.75f);
      run_gemm_batched(ta, tb, sh[0], sh[1], sh[2], sh[3], 1, 0, true, -1.5f, 1.0f);
    }
}

/* fl_device_set_precision: both products round their inputs (1 + 2^-12 is 1 in bf16 and
 * fp16, not in fp32), accumulate in fp32 to the precision's tolerance, and fp16 overflows
 * to infinity above 65504 (what a loss scaler watches for). */
static void test_gemm_precisions(void **state) {
  (void)state;
  static const fl_precision ps[] = {FL_PRECISION_TF32, FL_PRECISION_BF16, FL_PRECISION_FP16};
  static const double tol[] = {4e-3, 1.6e-2, 4e-3};
  float one_plus = 1.0f + 1.0f / 4096.0f, one = 1.0f;
  float *a = dev_from(&one_plus, 1), *b = dev_from(&one, 1), *c = dev_alloc(1);
  float got;
  assert_ok(gpu->ops->gemm(gpu, false, false, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, 1));
  assert_ok(gpu->ops->to_host(gpu, &got, c, sizeof got));
  assert_true(got == one_plus);
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    if (fl_device_set_precision(gpu, ps[i]) == FL_EDEVICE) { /* an older GPU: named, and refused */
      fprintf(stderr, "  precision %s: not on this GPU (%s)\n", fl_precision_name(ps[i]), fl_last_error());
      continue;
    }
    assert_int_equal(fl_device_precision(gpu), ps[i]);
    assert_ok(gpu->ops->gemm(gpu, false, false, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, 1));
    assert_ok(gpu->ops->to_host(gpu, &got, c, sizeof got));
    /* tf32 is cuBLAS's to apply, and it may pick a kernel without tensor cores (exact) for
     * a 1 x 1 product; bf16 and fp16 inputs are rounded by flint before cuBLAS sees them. */
    if (ps[i] != FL_PRECISION_TF32) {
      if (got != 1.0f)
        fprintf(stderr, "precision %s: (1 + 2^-12) x 1 = %.9g, expected 1\n", fl_precision_name(ps[i]), got);
      assert_true(got == 1.0f);
    }
    /* Large and strided products, single and batched, against the double reference. */
    for (int t = 0; t < 4; t++) {
      float *x = host_rand(64 * 300, 1.0f), *y = host_rand(300 * 48, 1.0f);
      float *dx = dev_from(x, 64 * 300), *dy = dev_from(y, 300 * 48), *dz = dev_poison(64 * 48);
      bool ta = t & 1, tb = t & 2;
      assert_ok(gpu->ops->gemm(gpu, ta, tb, 64, 48, 300, 1.0f, dx, ta ? 64 : 300, dy, tb ? 300 : 48, 0.0f, dz, 48));
      double *ref = xmalloc(64 * 48 * sizeof *ref), *mag = xmalloc(64 * 48 * sizeof *mag);
      for (int r = 0; r < 64; r++)
        for (int q = 0; q < 48; q++) {
          double acc = 0, abs_acc = 0;
          for (int z = 0; z < 300; z++) {
            double av = ta ? x[z * 64 + r] : x[r * 300 + z], bv = tb ? y[q * 300 + z] : y[z * 48 + q];
            acc += av * bv;
            abs_acc += fabs(av * bv);
          }
          ref[r * 48 + q] = acc;
          mag[r * 48 + q] = abs_acc;
        }
      expect_close(dz, ref, mag, 64 * 48, tol[i], fl_precision_name(ps[i]));
      free(ref);
      free(mag);
      free(x);
      free(y);
      dev_free(dx);
      dev_free(dy);
      dev_free(dz);
    }
    gemm_tol = tol[i];
    run_gemm_batched(true, false, 7, 5, 33, 3, 2, 3, false, 1.0f, 0.5f);
    run_gemm_batched(false, true, 16, 24, 1000, 3, 0, 0, true, -1.5f, 1.0f);
    run_gemm_batched(false, false, 4, 6, 0, 3, 1, 0, false, 1.0f, 0.0f);
    gemm_tol = GEMM_TOL;
  }
  assert_ok(fl_device_set_precision(gpu, FL_PRECISION_FP16)); /* compute capability 7.0: any GPU CUDA 13 runs on */
  float big = 70000.0f;
  assert_ok(gpu->ops->from_host(gpu, a, &big, sizeof big));
  assert_ok(gpu->ops->gemm(gpu, false, false, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, 1));
  assert_ok(gpu->ops->to_host(gpu, &got, c, sizeof got));
  assert_true(isinf(got));
  assert_ok(fl_device_set_precision(gpu, FL_PRECISION_FP32));
  assert_ok(gpu->ops->gemm(gpu, false, false, 1, 1, 1, 1.0f, a, 1, b, 1, 0.0f, c, 1));
  assert_ok(gpu->ops->to_host(gpu, &got, c, sizeof got));
  assert_true(got == big);
  dev_free(a);
  dev_free(b);
  dev_free(c);
}

static void test_gemm_batched_bad_arguments(void **state) {
  (void)state;
  float *a = dev_alloc(64);
  /* lda smaller than a row of A, and a negative batch: the caller's mistake, not the
   * device's failure (the device works afterwards). */
  assert_fails_with(gpu->ops->gemm_batched(gpu, false, false, 4, 4, 4, 1.0f, a, 3, 16, a, 4, 16,
                                           0.0f, a, 4, 16, 1),
                    FL_EINVAL, "gemm_batched");
  assert_fails_with(gpu->ops->gemm_batched(gpu, false, false, 2, 2, 2, 1.0f, a, 2, 4, a, 2, 4,
                                           0.0f, a, 2, 4, -1),
                    FL_EINVAL, "gemm_batched");
  /* Nothing to compute: C is left alone. */
  assert_ok(gpu->ops->fill(gpu, 64, 2.0f, a));
  assert_ok(gpu->ops->gemm_batched(gpu, false, false, 2, 2, 2, 1.0f, a, 2, 4, a, 2, 4, 0.0f,
                                   a + 32, 2, 4, 0));
  float *h = host_from(a, 64);
  for (int i = 0; i < 64; i++) assert_true(h[i] == 2.0f);
  free(h);
  assert_ok(fl_device_synchronize(gpu));
  dev_free(a);
}

/* ---- GELU ------------------------------------------------------------------------------ */

static const double kGeluC = 0.79788456080286535588; /* sqrt(2 / pi) */
static const double kGeluA = 0.044715;

static void test_gelu(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 7, 1000, 100003};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    /* Up to +-4, into the tails where 1 + tanh cancels. */
    float *hx = host_rand(n, 4.0f), *hdy = host_rand(n, 1.0f);
    double *ref = xmalloc(n * sizeof *ref), *mag = xmalloc(n * sizeof *mag);
    double *dref = xmalloc(n * sizeof *dref), *dmag = xmalloc(n * sizeof *dmag);
    for (size_t i = 0; i < n; i++) {
      double x = hx[i], t = tanh(kGeluC * (x + kGeluA * x * x * x));
      double du = kGeluC * (1 + 3 * kGeluA * x * x);
      ref[i] = 0.5 * x * (1 + t);
      mag[i] = 0.5 * fabs(x) * (1 + fabs(t));
      double slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du;
      double slope_mag = 0.5 * (1 + fabs(t)) + 0.5 * fabs(x) * (1 + t * t) * du;
      dref[i] = hdy[i] * slope;
      dmag[i] = fabs(hdy[i]) * slope_mag;
    }
    float *x = dev_from(hx, n), *dy = dev_from(hdy, n), *y = dev_poison(n), *dx = dev_poison(n);
    assert_ok(gpu->ops->gelu_forward(gpu, n, x, y));
    expect_close(y, ref, mag, n, TOL, "gelu_forward");
    assert_ok(gpu->ops->gelu_backward(gpu, n, x, dy, dx));
    expect_close(dx, dref, dmag, n, TOL, "gelu_backward");
    /* In place: y aliases x, dx aliases dy. */
    assert_ok(gpu->ops->gelu_backward(gpu, n, x, dy, dy));
    expect_close(dy, dref, dmag, n, TOL, "gelu_backward in place");
    assert_ok(gpu->ops->gelu_forward(gpu, n, x, x));
    expect_close(x, ref, mag, n, TOL, "gelu_forward in place");
    dev_free(x);
    dev_free(dy);
    dev_free(y);
    dev_free(dx);
    free(hx);
    free(hdy);
    free(ref);
    free(mag);
    free(dref);
    free(dmag);
  }
}

/* ---- row softmax ----------------------------------------------------------------------- */

static void run_softmax_rows(int rows, int cols, float scale) {
  size_t n = (size_t)rows * cols;
  /* Logits up to +-8 times scale: exp without the max subtracted would lose digits. */
  float *hx = host_rand(n, 8.0f), *hdy = host_rand(n, 1.0f);
  for (size_t i = 0; i < n; i++) hx[i] += 40.0f; /* far from 0: the max must be subtracted */
  double *ref = xmalloc(n * sizeof *ref), *dref = xmalloc(n * sizeof *dref);
  double *dmag = xmalloc(n * sizeof *dmag);
  float *hy = xmalloc(n * sizeof *hy);
  for (int r = 0; r < rows; r++) {
    const float *x = hx + (size_t)r * cols;
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < cols; j++) m = fmax(m, (double)scale * x[j]);
    for (int j = 0; j < cols; j++) sum += exp((double)scale * x[j] - m);
    for (int j = 0; j < cols; j++)
      ref[(size_t)r * cols + j] = exp((double)scale * x[j] - m) / sum;
  }
  float *x = dev_from(hx, n), *y = dev_poison(n);
  assert_ok(gpu->ops->softmax_rows_forward(gpu, rows, cols, scale, x, y));
  char what[128];
  snprintf(what, sizeof what, "softmax_rows_forward %d x %d scale %g", rows, cols, scale);
  expect_close(y, ref, NULL, n, TOL, what);

  /* Backward from the device's own y (the contract's input), against the reference
   * formula on those same values. */
  assert_ok(gpu->ops->to_host(gpu, hy, y, n * sizeof(float)));
  for (int r = 0; r < rows; r++) {
    size_t base = (size_t)r * cols;
    double dot = 0, abs_dot = 0;
    for (int j = 0; j < cols; j++) {
      dot += (double)hdy[base + j] * hy[base + j];
      abs_dot += fabs((double)hdy[base + j] * hy[base + j]);
    }
    for (int j = 0; j < cols; j++) {
      double yj = hy[base + j];
      dref[base + j] = scale * yj * (hdy[base + j] - dot);
      dmag[base + j] = fabs(scale * yj) * (fabs(hdy[base + j]) + abs_dot);
    }
  }
  float *dy = dev_from(hdy, n), *dx = dev_poison(n);
  assert_ok(gpu->ops->softmax_rows_backward(gpu, rows, cols, scale, y, dy, dx));
  snprintf(what, sizeof what, "softmax_rows_backward %d x %d scale %g", rows, cols, scale);
  expect_close(dx, dref, dmag, n, TOL, what);
  /* In place: dx aliases dy; then y aliases x. */
  assert_ok(gpu->ops->softmax_rows_backward(gpu, rows, cols, scale, y, dy, dy));
  expect_close(dy, dref, dmag, n, TOL, "softmax_rows_backward in place");
  assert_ok(gpu->ops->softmax_rows_forward(gpu, rows, cols, scale, x, x));
  expect_close(x, ref, NULL, n, TOL, "softmax_rows_forward in place");

  dev_free(x);
  dev_free(y);
  dev_free(dy);
  dev_free(dx);
  free(hx);
  free(hdy);
  free(hy);
  free(ref);
  free(dref);
  free(dmag);
}

static void test_softmax_rows(void **state) {
  (void)state;
  /* Up to 1024 columns a row goes to a warp, beyond to a block: both sides of that line. */
  static const int shapes[][2] = {{1, 1},    {3, 1},    {1, 1000}, {5, 7},    {9, 33},
                                  {7, 1000}, {2, 1024}, {2, 1025}, {3, 5000}, {1, 100003},
                                  {300, 129}};
  static const float scales[] = {1.0f, 0.125f, -0.5f};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++)
      run_softmax_rows(shapes[s][0], shapes[s][1], scales[k]);
}

/* ---- dropout --------------------------------------------------------------------------- */

/* x [outer, inner, cols] as the shard at (outer0, inner0) of a tensor with inner_total inner
 * rows: forward and backward against dropout_keep's decisions. */
static void run_dropout(int outer, int inner, int cols, int64_t outer0, int64_t inner0,
                        int64_t inner_total, float p, uint64_t seed) {
  size_t n = (size_t)outer * inner * cols, kept = 0;
  float *hx = host_rand(n, 1.0f);
  double *ref = xmalloc(n * sizeof *ref);
  for (int i = 0; i < outer; i++)
    for (int j = 0; j < inner; j++)
      for (int k = 0; k < cols; k++) {
        size_t at = ((size_t)i * inner + j) * cols + k;
        uint64_t g = (uint64_t)(((outer0 + i) * inner_total + inner0 + j) * cols + k);
        bool keep = dropout_keep(seed, g, p);
        kept += keep;
        ref[at] = keep ? hx[at] / (1.0 - (double)p) : 0.0;
      }
  /* Forward into y, backward (the same map) into dy, forward in place. */
  float *x = dev_from(hx, n), *y = dev_poison(n), *dx = dev_poison(n);
  assert_ok(gpu->ops->dropout_forward(gpu, outer, inner, cols, outer0, inner0, inner_total, p,
                                      seed, x, y));
  assert_ok(gpu->ops->dropout_backward(gpu, outer, inner, cols, outer0, inner0, inner_total, p,
                                       seed, x, dx));
  float *ys[3] = {y, dx, x};
  assert_ok(gpu->ops->dropout_forward(gpu, outer, inner, cols, outer0, inner0, inner_total, p,
                                      seed, x, x));
  for (int pass = 0; pass < 3; pass++) {
    float *got = host_from(ys[pass], n);
    for (size_t i = 0; i < n; i++) {
      bool kept_here = got[i] != 0.0f; /* x is never zero */
      if (kept_here != (ref[i] != 0.0) || isnan(got[i]) ||
          fabs(got[i] - ref[i]) > TOL * fabs(ref[i])) {
        fprintf(stderr, "dropout %s [%d, %d, %d] at (%lld, %lld) of %lld, p %g, seed %llu: "
                        "[%zu] cuda %.9g, reference %.9g\n",
                pass == 0 ? "forward" : pass == 1 ? "backward" : "forward in place", outer,
                inner, cols, (long long)outer0, (long long)inner0, (long long)inner_total, p,
                (unsigned long long)seed, i, got[i], ref[i]);
        fail();
      }
    }
    free(got);
  }
  /* The mask keeps about 1 - p of the elements (a check of dropout_keep itself). */
  if (n >= 10000) {
    double frac = (double)kept / (double)n;
    assert_true(fabs(frac - (1.0 - p)) < 0.02);
  }
  dev_free(x);
  dev_free(y);
  dev_free(dx);
  free(hx);
  free(ref);
}

static void test_dropout(void **state) {
  (void)state;
  static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {2, 4, 1000}, {1, 1, 100003}, {3, 1, 1}};
  static const float ps[] = {0.0f, 0.1f, 0.5f, 0.9f, 1.0f};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
      const int *sh = shapes[s];
      run_dropout(sh[0], sh[1], sh[2], 0, 0, sh[1], ps[k], 42 + s);
      run_dropout(sh[0], sh[1], sh[2], 2, 3, sh[1] + 5, ps[k], 0xfeedfacecafebeefull);
    }
}

/* A shard's mask is the whole tensor's mask restricted to the shard: the reason for keyed
 * dropout (tensor-parallel shards and micro-batches must drop what one device would). */
static void test_dropout_shards_agree(void **state) {
  (void)state;
  const int outer = 4, inner = 6, cols = 37;
  const float p = 0.3f;
  const uint64_t seed = 7;
  size_t n = (size_t)outer * inner * cols;
  float *hx = host_rand(n, 1.0f);
  float *x = dev_from(hx, n), *y = dev_poison(n);
  assert_ok(gpu->ops->dropout_forward(gpu, outer, inner, cols, 0, 0, inner, p, seed, x, y));
  float *whole = host_from(y, n);
  /* Shard: outer rows [1, 3), inner rows [2, 5). */
  const int so = 2, si = 3;
  size_t sn = (size_t)so * si * cols;
  float *hs = xmalloc(sn * sizeof *hs);
  for (int i = 0; i < so; i++)
    for (int j = 0; j < si; j++)
      memcpy(hs + ((size_t)i * si + j) * cols, hx + ((size_t)(1 + i) * inner + 2 + j) * cols,
             cols * sizeof(float));
  float *xs = dev_from(hs, sn), *ys = dev_poison(sn);
  assert_ok(gpu->ops->dropout_forward(gpu, so, si, cols, 1, 2, inner, p, seed, xs, ys));
  float *shard = host_from(ys, sn);
  for (int i = 0; i < so; i++)
    for (int j = 0; j < si; j++)
      for (int k = 0; k < cols; k++)
        assert_true(shard[((size_t)i * si + j) * cols + k] ==
                    whole[((size_t)(1 + i) * inner + 2 + j) * cols + k]);
  free(whole);
  free(shard);
  free(hx);
  free(hs);
  dev_free(x);
  dev_free(y);
  dev_free(xs);
  dev_free(ys);
}

/* ---- mean over tokens ------------------------------------------------------------------ */

static void test_mean_tokens(void **state) {
  (void)state;
  static const int shapes[][3] = {/* n, s, h */
                                  {1, 1, 1}, {3, 7, 5}, {2, 1, 1000}, {3, 1000, 1}, {4, 128, 257},
                                  {1, 3, 1000}};
  for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
    int n = shapes[q][0], s = shapes[q][1], h = shapes[q][2];
    size_t nx = (size_t)n * s * h, ny = (size_t)n * h;
    float *hx = host_rand(nx, 1.0f), *hdy = host_rand(ny, 1.0f);
    double *ref = xmalloc(ny * sizeof *ref), *mag = xmalloc(ny * sizeof *mag);
    double *dref = xmalloc(nx * sizeof *dref);
    for (int b = 0; b < n; b++)
      for (int c = 0; c < h; c++) {
        double acc = 0, abs_acc = 0;
        for (int t = 0; t < s; t++) {
          acc += hx[((size_t)b * s + t) * h + c];
          abs_acc += fabs(hx[((size_t)b * s + t) * h + c]);
        }
        ref[(size_t)b * h + c] = acc / s;
        mag[(size_t)b * h + c] = abs_acc / s;
        for (int t = 0; t < s; t++)
          dref[((size_t)b * s + t) * h + c] = hdy[(size_t)b * h + c] / (double)s;
      }
    float *x = dev_from(hx, nx), *y = dev_poison(ny), *dy = dev_from(hdy, ny);
    float *dx = dev_poison(nx);
    char what[96];
    snprintf(what, sizeof what, "mean_tokens_forward [%d, %d, %d]", n, s, h);
    assert_ok(gpu->ops->mean_tokens_forward(gpu, n, s, h, x, y));
    expect_close(y, ref, mag, ny, TOL, what);
    snprintf(what, sizeof what, "mean_tokens_backward [%d, %d, %d]", n, s, h);
    assert_ok(gpu->ops->mean_tokens_backward(gpu, n, s, h, dy, dx));
    expect_close(dx, dref, NULL, nx, TOL, what);
    dev_free(x);
    dev_free(y);
    dev_free(dy);
    dev_free(dx);
    free(hx);
    free(hdy);
    free(ref);
    free(mag);
    free(dref);
  }
  /* No tokens: no mean. */
  float *y = dev_alloc(4);
  assert_fails_with(gpu->ops->mean_tokens_forward(gpu, 2, 0, 2, y, y), FL_EINVAL,
                    "mean_tokens_forward");
  assert_ok(fl_device_synchronize(gpu));
  dev_free(y);
}

/* causal_mask: -inf strictly above each [s, s] matrix's diagonal, the rest untouched, as the
 * cpu device's (one odd size and one above a block of threads). */
static void test_causal_mask(void **state) {
  (void)state;
  const int shapes[][2] = {{1, 1}, {3, 5}, {2, 37}, {4, 130}};
  for (size_t q = 0; q < sizeof shapes / sizeof shapes[0]; q++) {
    int batch = shapes[q][0], s = shapes[q][1];
    size_t n = (size_t)batch * s * s;
    float *hx = host_rand(n, 1.0f);
    float *x = dev_from(hx, n);
    assert_ok(gpu->ops->causal_mask(gpu, batch, s, x));
    float *got = host_from(x, n);
    for (int b = 0; b < batch; b++)
      for (int i = 0; i < s; i++)
        for (int j = 0; j < s; j++) {
          size_t at = ((size_t)b * s + i) * s + j;
          if (j > i) assert_true(isinf(got[at]) && got[at] < 0);
          else assert_true(got[at] == hx[at]);
        }
    dev_free(x);
    free(hx);
    free(got);
  }
}

int main(void) {
  if (fl_cuda_device_count() == 0) {
    printf("test_gpu_ops_cuda: skipped: no usable CUDA GPU (fl_cuda_device_count() == 0)\n");
    return SKIP_CODE;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_batched),
      cmocka_unit_test(test_gemm_batched_bad_arguments),
      cmocka_unit_test(test_gemm_precisions),
      cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_softmax_rows),
      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_dropout_shards_agree),
      cmocka_unit_test(test_mean_tokens),
      cmocka_unit_test(test_causal_mask),
  };
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
