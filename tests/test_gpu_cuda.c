/* test_gpu_cuda.c: the cuda device against the cpu device. Every operation of
 * gpu/device/backend.h runs on both with the same random inputs (outputs poisoned with NaN
 * first, so an element a kernel forgets to write shows up), accumulating operations run twice,
 * sizes include 1, odd ones and 1000003, and convolution and pooling run with strides and
 * padding. Also: the caching allocator's reuse and stats, a bad ordinal, and the sticky error
 * of a bad label. Without a usable GPU the program exits 77, which ctest reports as skipped. */
#include "test_util.h"

#include <math.h>

#include "gpu/device/device.h"
#ifdef FLINT_HAVE_CUDA
#include "gpu/device/cuda/allocator.h"
#endif

#define SKIP_CODE 77
#define BIG 1000003

static fl_device *cpu, *gpu;

static int setup_devices(void **state) {
  (void)state;
  if (fl_device_open(FL_DEVICE_CPU, 0, &cpu) != FL_OK) return -1;
  if (fl_device_open(FL_DEVICE_CUDA, 0, &gpu) != FL_OK) {
    fprintf(stderr, "cannot open cuda:0: %s\n", fl_last_error());
    return -1;
  }
  return 0;
}

static int teardown_devices(void **state) {
  (void)state;
  fl_device_close(gpu);
  fl_device_close(cpu);
  return 0;
}

/* ---- buffers on both devices ----------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Uniform in +-[0.05, 1): never zero, so that a kernel that writes zeros cannot pass. */
static float urand(void) { return test_urand_signed(&rng_state); }

/* The same values on the cpu device (cpu) and on the GPU (gpu). */
typedef struct fpair {
  size_t n;
  float *cpu, *gpu;
} fpair;

typedef struct ipair {
  size_t n;
  int32_t *cpu, *gpu;
} ipair;

static void *dev_alloc(fl_device *d, size_t bytes) {
  void *p = NULL;
  assert_ok(d->ops->alloc(d, bytes ? bytes : 4, &p));
  assert_non_null(p);
  return p;
}

static fpair fpair_from(const float *host, size_t n) {
  fpair p = {n, dev_alloc(cpu, n * sizeof(float)), dev_alloc(gpu, n * sizeof(float))};
  memcpy(p.cpu, host, n * sizeof(float));
  assert_ok(gpu->ops->from_host(gpu, p.gpu, host, n * sizeof(float)));
  return p;
}

static fpair fpair_rand(size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = urand();
  fpair p = fpair_from(h, n);
  free(h);
  return p;
}

/* Positive values in [lo, lo + 1) (variances). */
static fpair fpair_rand_pos(size_t n, float lo) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = lo + fabsf(urand());
  fpair p = fpair_from(h, n);
  free(h);
  return p;
}

/* NaN everywhere: outputs start like this. */
static fpair fpair_poison(size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  fpair p = fpair_from(h, n);
  free(h);
  return p;
}

static void fpair_free(fpair *p) {
  cpu->ops->free(cpu, p->cpu);
  gpu->ops->free(gpu, p->gpu);
}

static ipair ipair_from(const int32_t *host, size_t n) {
  ipair p = {n, dev_alloc(cpu, n * sizeof(int32_t)), dev_alloc(gpu, n * sizeof(int32_t))};
  memcpy(p.cpu, host, n * sizeof(int32_t));
  assert_ok(gpu->ops->from_host(gpu, p.gpu, host, n * sizeof(int32_t)));
  return p;
}

static ipair ipair_fill(size_t n, int32_t v) {
  int32_t *h = malloc((n ? n : 1) * sizeof *h);
  assert_non_null(h);
  for (size_t i = 0; i < n; i++) h[i] = v;
  ipair p = ipair_from(h, n);
  free(h);
  return p;
}

static void ipair_free(ipair *p) {
  cpu->ops->free(cpu, p->cpu);
  gpu->ops->free(gpu, p->gpu);
}

/* Runs one operation on both devices: P(x) is x's buffer on the device in turn. */
#define P(x) (side ? (x).gpu : (x).cpu)
#define BOTH(op, ...)                                                                        \
  for (int side = 0; side < 2; side++) {                                                     \
    fl_device *d_ = side ? gpu : cpu;                                                        \
    fl_status st_ = d_->ops->op(d_, __VA_ARGS__);                                            \
    if (st_ != FL_OK) fail_msg("%s on %s: %s", #op, d_->name, fl_last_error());              \
  }

/* Compares the GPU's values with the cpu's. Element-wise (norm false): |g - c| <= tol *
 * (1 + |c|). Reductions and GEMM (norm true): |g - c| <= tol * max|c|, since a sum whose
 * terms cancel has no meaningful element-wise relative error. NaN (an unwritten output) fails
 * either way. */
static void expect_close(const fpair *p, double tol, bool norm, const char *what) {
  size_t n = p->n;
  float *g = malloc((n ? n : 1) * sizeof *g);
  assert_non_null(g);
  assert_ok(gpu->ops->to_host(gpu, g, p->gpu, n * sizeof(float)));
  double scale = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs(p->cpu[i]) > scale) scale = fabs(p->cpu[i]);
  size_t bad = n;
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double c = p->cpu[i], d = fabs((double)g[i] - c);
    double allowed = norm ? tol * (scale > 0 ? scale : 1) : tol * (1 + fabs(c));
    if (isnan(g[i]) || isnan(c) || d > allowed) {
      if (bad == n) bad = i;
    }
    if (!isnan(d) && d > worst) worst = d;
  }
  if (bad != n) {
    fprintf(stderr, "%s: %zu elements, first mismatch [%zu]: cuda %.9g, cpu %.9g (max abs diff "
                    "%.3g, max |cpu| %.3g)\n",
            what, n, bad, g[bad], p->cpu[bad], worst, scale);
    free(g);
    fail();
  }
  free(g);
}

static void expect_equal_ints(const ipair *p, const char *what) {
  int32_t *g = malloc((p->n ? p->n : 1) * sizeof *g);
  assert_non_null(g);
  assert_ok(gpu->ops->to_host(gpu, g, p->gpu, p->n * sizeof(int32_t)));
  for (size_t i = 0; i < p->n; i++)
    if (g[i] != p->cpu[i]) {
      fprintf(stderr, "%s[%zu]: cuda %d, cpu %d\n", what, i, g[i], p->cpu[i]);
      free(g);
      fail();
    }
  free(g);
}

static const size_t sizes[] = {1, 7, 1000, BIG};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* ---- memory ---------------------------------------------------------------------------- */

static void test_name_and_copies(void **state) {
  (void)state;
  assert_int_equal(fl_device_kind_of(gpu), FL_DEVICE_CUDA);
  assert_int_equal(strncmp(fl_device_name(gpu), "cuda:0 (", 8), 0);
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = sizes[s];
    fpair a = fpair_rand(n), b = fpair_poison(n);
    BOTH(copy, P(b), P(a), n * sizeof(float));
    expect_close(&b, 0, false, "copy");
    BOTH(memset0, P(b), n * sizeof(float));
    expect_close(&b, 0, false, "memset0");
    /* Overlapping copy, forwards and backwards (memmove semantics). */
    if (n > 2) {
      BOTH(copy, P(a) + 1, P(a), (n - 2) * sizeof(float));
      expect_close(&a, 0, false, "copy overlapping forwards");
      BOTH(copy, P(a), P(a) + 2, (n - 2) * sizeof(float));
      expect_close(&a, 0, false, "copy overlapping backwards");
    }
    fpair_free(&a);
    fpair_free(&b);
  }
  void *pinned = NULL;
  assert_ok(gpu->ops->host_alloc(gpu, 4096, &pinned));
  assert_non_null(pinned);
  memset(pinned, 1, 4096);
  gpu->ops->host_free(gpu, pinned);
  assert_ok(fl_device_synchronize(gpu));
}

/* ---- BLAS ------------------------------------------------------------------------------ */

static void run_gemm(bool ta, bool tb, int m, int n, int k, int pad, float alpha, float beta) {
  int rows_a = ta ? k : m, cols_a = ta ? m : k;
  int rows_b = tb ? n : k, cols_b = tb ? k : n;
  int lda = cols_a + pad, ldb = cols_b + pad, ldc = n + pad;
  fpair a = fpair_rand((size_t)rows_a * lda), b = fpair_rand((size_t)rows_b * ldb);
  fpair c = beta == 0 ? fpair_poison((size_t)m * ldc) : fpair_rand((size_t)m * ldc);
  BOTH(gemm, ta, tb, m, n, k, alpha, P(a), lda, P(b), ldb, beta, P(c), ldc);
  if (beta == 0) {
    /* The padding columns of C are not part of the product: give both sides the same. */
    for (int side = 0; side < 2; side++)
      for (int i = 0; i < m; i++)
        for (int j = n; j < ldc; j++) {
          float zero = 0;
          if (side)
            assert_ok(gpu->ops->from_host(gpu, P(c) + (size_t)i * ldc + j, &zero, sizeof zero));
          else
            P(c)[(size_t)i * ldc + j] = 0;
        }
  }
  char what[96];
  snprintf(what, sizeof what, "gemm ta=%d tb=%d m=%d n=%d k=%d pad=%d beta=%g", ta, tb, m, n, k,
           pad, beta);
  expect_close(&c, 1e-4, true, what);
  fpair_free(&a);
  fpair_free(&b);
  fpair_free(&c);
}

static void test_gemm(void **state) {
  (void)state;
  static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 256, 96}, {3, 1000, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) {
      bool ta = t & 1, tb = t & 2;
      run_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 0, 1.5f, 0.0f);
      run_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 3, 0.75f, 0.5f);
    }
}

static void test_blas1(void **state) {
  (void)state;
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = sizes[s];
    fpair x = fpair_rand(n), y = fpair_rand(n);
    BOTH(axpy, n, -0.375f, P(x), P(y));
    expect_close(&y, 1e-6, false, "axpy");
    BOTH(scale, n, 1.25f, P(y));
    expect_close(&y, 1e-6, false, "scale");
    BOTH(fill, n, 3.5f, P(x));
    expect_close(&x, 0, false, "fill");
    /* On the same inputs (y above differs by the rounding of a fused multiply-add), both
     * sums are of exact squares in double: only the order of the additions differs. */
    fpair z = fpair_rand(n);
    double got[2];
    for (int side = 0; side < 2; side++) {
      fl_device *d = side ? gpu : cpu;
      assert_ok(d->ops->sum_squares(d, n, P(z), &got[side]));
    }
    fpair_free(&z);
    assert_true(got[0] > 0);
    if (fabs(got[1] - got[0]) > 1e-9 * got[0]) {
      fprintf(stderr, "sum_squares n=%zu: cuda %.17g, cpu %.17g\n", n, got[1], got[0]);
      fail();
    }
    fpair_free(&x);
    fpair_free(&y);
  }
}

/* ---- activations, biases, loss --------------------------------------------------------- */

static void test_relu(void **state) {
  (void)state;
  for (size_t s = 0; s < NSIZES; s++) {
    size_t n = sizes[s];
    fpair x = fpair_rand(n), y = fpair_poison(n), dy = fpair_rand(n), dx = fpair_poison(n);
    BOTH(relu_forward, n, P(x), P(y));
    expect_close(&y, 0, false, "relu_forward");
    BOTH(relu_backward, n, P(y), P(dy), P(dx));
    expect_close(&dx, 0, false, "relu_backward");
    /* In place, as layers call it. */
    BOTH(relu_forward, n, P(x), P(x));
    expect_close(&x, 0, false, "relu_forward in place");
    BOTH(relu_backward, n, P(x), P(dy), P(dy));
    expect_close(&dy, 0, false, "relu_backward in place");
    fpair_free(&x);
    fpair_free(&y);
    fpair_free(&dy);
    fpair_free(&dx);
  }
}

static void test_bias_rows(void **state) {
  (void)state;
  static const int shapes[][2] = {{1, 1}, {7, 13}, {1000, 37}, {3, 100003}, {100003, 3}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int rows = shapes[s][0], cols = shapes[s][1];
    size_t total = (size_t)rows * cols;
    fpair b = fpair_rand((size_t)cols), y = fpair_rand(total), db = fpair_rand((size_t)cols);
    BOTH(bias_add_rows, rows, cols, P(b), P(y));
    expect_close(&y, 1e-6, false, "bias_add_rows");
    for (int round = 0; round < 2; round++) {
      BOTH(bias_grad_rows, rows, cols, P(y), P(db));
      expect_close(&db, 1e-5, true, "bias_grad_rows (accumulating)");
    }
    fpair_free(&b);
    fpair_free(&y);
    fpair_free(&db);
  }
}

static void test_bias_channels(void **state) {
  (void)state;
  static const int shapes[][3] = {{1, 1, 1}, {2, 7, 9}, {64, 16, 1}, {4, 3, 40000}, {3, 5, 7}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2];
    size_t total = (size_t)n * c * hw;
    fpair b = fpair_rand((size_t)c), y = fpair_rand(total), db = fpair_rand((size_t)c);
    BOTH(bias_add_channels, n, c, hw, P(b), P(y));
    expect_close(&y, 1e-6, false, "bias_add_channels");
    for (int round = 0; round < 2; round++) {
      BOTH(bias_grad_channels, n, c, hw, P(y), P(db));
      expect_close(&db, 1e-5, true, "bias_grad_channels (accumulating)");
    }
    fpair_free(&b);
    fpair_free(&y);
    fpair_free(&db);
  }
}

static void test_softmax_xent(void **state) {
  (void)state;
  static const int shapes[][2] = {{1, 1}, {7, 10}, {33, 1000}, {300, 3}, {1000, 37}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], c = shapes[s][1];
    fpair logits = fpair_rand((size_t)n * c), dlogits = fpair_poison((size_t)n * c);
    /* Larger logits, so that the max subtraction matters and argmax hits are common. */
    BOTH(scale, (size_t)n * c, 8.0f, P(logits));
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    assert_non_null(lab);
    for (int i = 0; i < n; i++) lab[i] = (int32_t)(rng_state++ % (uint64_t)c);
    ipair labels = ipair_from(lab, (size_t)n);
    free(lab);
    fpair stats = fpair_rand(2);
    for (int round = 0; round < 2; round++) {
      /* The second round with label smoothing. */
      BOTH(softmax_xent, n, c, P(logits), P(labels), round ? 0.1f : 0.0f, 1.0f / (float)n, P(dlogits), P(stats));
      expect_close(&dlogits, 1e-5, false, "softmax_xent dlogits");
      expect_close(&stats, 1e-5, false, "softmax_xent stats (accumulating)");
    }
    fpair_free(&logits);
    fpair_free(&dlogits);
    fpair_free(&stats);
    ipair_free(&labels);
  }
}

/* ---- convolution helpers and pooling --------------------------------------------------- */

typedef struct conv_case {
  int n, c, h, w, kh, kw, stride, pad;
} conv_case;

static void test_im2col_col2im(void **state) {
  (void)state;
  static const conv_case cases[] = {
      {1, 1, 1, 1, 1, 1, 1, 0}, {2, 3, 7, 5, 3, 3, 1, 1}, {3, 4, 9, 9, 3, 3, 2, 1},
      {2, 2, 8, 8, 5, 5, 3, 2}, {1, 2, 6, 7, 2, 3, 2, 0}, {4, 16, 32, 32, 3, 3, 1, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    conv_case k = cases[i];
    int oh = (k.h + 2 * k.pad - k.kh) / k.stride + 1, ow = (k.w + 2 * k.pad - k.kw) / k.stride + 1;
    size_t xn = (size_t)k.n * k.c * k.h * k.w;
    size_t coln = (size_t)k.c * k.kh * k.kw * k.n * oh * ow;
    fpair x = fpair_rand(xn), col = fpair_poison(coln), dcol = fpair_rand(coln);
    fpair dx = fpair_rand(xn);
    BOTH(im2col, k.n, k.c, k.h, k.w, k.kh, k.kw, k.stride, k.pad, P(x), P(col));
    expect_close(&col, 0, false, "im2col");
    for (int round = 0; round < 2; round++) {
      BOTH(col2im, k.n, k.c, k.h, k.w, k.kh, k.kw, k.stride, k.pad, P(dcol), P(dx));
      expect_close(&dx, 1e-5, false, "col2im (accumulating)");
    }
    fpair_free(&x);
    fpair_free(&col);
    fpair_free(&dcol);
    fpair_free(&dx);
  }
}

static void test_swap01(void **state) {
  (void)state;
  static const int shapes[][3] = {{1, 1, 1}, {3, 7, 5}, {64, 16, 49}, {5, 3, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    size_t total = (size_t)shapes[s][0] * shapes[s][1] * shapes[s][2];
    fpair x = fpair_rand(total), y = fpair_poison(total);
    BOTH(swap01, shapes[s][0], shapes[s][1], shapes[s][2], P(x), P(y));
    expect_close(&y, 0, false, "swap01");
    fpair_free(&x);
    fpair_free(&y);
  }
}

typedef struct pool_case {
  int n, c, h, w, k, stride, pad;
} pool_case;

static void test_pooling(void **state) {
  (void)state;
  static const pool_case cases[] = {
      {1, 1, 1, 1, 1, 1, 0}, {2, 3, 7, 7, 3, 2, 1}, {2, 2, 8, 8, 2, 2, 0},
      {1, 3, 9, 5, 3, 1, 1}, {2, 2, 10, 10, 3, 3, 1}, {8, 16, 32, 32, 3, 2, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pool_case k = cases[i];
    int oh = (k.h + 2 * k.pad - k.k) / k.stride + 1, ow = (k.w + 2 * k.pad - k.k) / k.stride + 1;
    size_t xn = (size_t)k.n * k.c * k.h * k.w, yn = (size_t)k.n * k.c * oh * ow;
    fpair x = fpair_rand(xn), y = fpair_poison(yn), dy = fpair_rand(yn), dx = fpair_poison(xn);
    ipair argmax = ipair_fill(yn, -7);
    BOTH(maxpool_forward, k.n, k.c, k.h, k.w, k.k, k.stride, k.pad, P(x), P(y), P(argmax));
    expect_close(&y, 0, false, "maxpool_forward");
    expect_equal_ints(&argmax, "maxpool_forward argmax");
    BOTH(maxpool_backward, k.n, k.c, k.h, k.w, k.k, k.stride, k.pad, P(dy), P(argmax), P(dx));
    expect_close(&dx, 1e-6, false, "maxpool_backward");
    fpair_free(&y);
    fpair_free(&dx);
    y = fpair_poison(yn);
    dx = fpair_poison(xn);
    BOTH(avgpool_forward, k.n, k.c, k.h, k.w, k.k, k.stride, k.pad, P(x), P(y));
    expect_close(&y, 1e-6, false, "avgpool_forward");
    BOTH(avgpool_backward, k.n, k.c, k.h, k.w, k.k, k.stride, k.pad, P(dy), P(dx));
    expect_close(&dx, 1e-6, false, "avgpool_backward");
    fpair_free(&x);
    fpair_free(&y);
    fpair_free(&dy);
    fpair_free(&dx);
    ipair_free(&argmax);
  }
}

/* ---- batch norm and SGD ---------------------------------------------------------------- */

static void test_batchnorm(void **state) {
  (void)state;
  static const int shapes[][3] = {{2, 3, 5}, {8, 16, 49}, {64, 4, 1}, {4, 3, 70000}, {1, 2, 3}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], c = shapes[s][1], hw = shapes[s][2];
    size_t total = (size_t)n * c * hw;
    fpair x = fpair_rand(total), y = fpair_poison(total), dy = fpair_rand(total);
    fpair dx = fpair_poison(total);
    /* A mean far from zero, as after a ReLU, tests the two-pass variance. */
    fpair ones = fpair_rand(total);
    BOTH(fill, total, 1.0f, P(ones));
    BOTH(axpy, total, 3.0f, P(ones), P(x));
    fpair gamma = fpair_rand((size_t)c), beta = fpair_rand((size_t)c);
    fpair rmean = fpair_rand((size_t)c), rvar = fpair_rand_pos((size_t)c, 0.5f);
    fpair smean = fpair_poison((size_t)c), sinv = fpair_poison((size_t)c);
    fpair dgamma = fpair_rand((size_t)c), dbeta = fpair_rand((size_t)c);
    for (int round = 0; round < 2; round++) {
      BOTH(batchnorm_forward, n, c, hw, P(x), P(gamma), P(beta), P(rmean), P(rvar), 0.1f, 1e-5f,
           true, ((bn_saved){P(smean), P(sinv)}), P(y));
      expect_close(&y, 1e-5, false, "batchnorm_forward y");
      expect_close(&smean, 1e-5, false, "batchnorm_forward saved mean");
      expect_close(&sinv, 1e-5, false, "batchnorm_forward saved inv_std");
      expect_close(&rmean, 1e-5, false, "batchnorm_forward running mean");
      expect_close(&rvar, 1e-5, false, "batchnorm_forward running var");
      BOTH(batchnorm_backward, n, c, hw, P(x), P(dy), P(gamma), ((bn_saved){P(smean), P(sinv)}),
           P(dx), P(dgamma), P(dbeta));
      expect_close(&dx, 1e-4, true, "batchnorm_backward dx");
      expect_close(&dgamma, 1e-5, true, "batchnorm_backward dgamma (accumulating)");
      expect_close(&dbeta, 1e-5, true, "batchnorm_backward dbeta (accumulating)");
    }
    fpair_free(&y);
    y = fpair_poison(total);
    BOTH(batchnorm_forward, n, c, hw, P(x), P(gamma), P(beta), P(rmean), P(rvar), 0.1f, 1e-5f,
         false, ((bn_saved){P(smean), P(sinv)}), P(y));
    expect_close(&y, 1e-5, false, "batchnorm_forward inference");
    fpair *all[] = {&x, &y, &dy, &dx, &ones, &gamma, &beta, &rmean, &rvar, &smean, &sinv,
                    &dgamma, &dbeta};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fpair_free(all[i]);
  }
}

static void test_sgd_step(void **state) {
  (void)state;
  for (size_t s = 0; s < NSIZES; s++)
    for (int variant = 0; variant < 8; variant++) {
      size_t n = sizes[s];
      float momentum = variant & 1 ? 0.9f : 0.0f, wd = variant & 2 ? 5e-4f : 0.0f;
      bool nesterov = variant & 4;
      fpair w = fpair_rand(n), v = fpair_rand(n), g = fpair_rand(n);
      for (int step = 0; step < 3; step++) {
        BOTH(sgd_step, n, 0.1f, momentum, wd, nesterov, P(g), P(v), P(w));
        expect_close(&w, 1e-6, false, "sgd_step w");
        expect_close(&v, 1e-6, false, "sgd_step velocity");
      }
      fpair_free(&w);
      fpair_free(&v);
      fpair_free(&g);
    }
}

static void test_adam_step(void **state) {
  (void)state;
  for (size_t s = 0; s < NSIZES; s++)
    for (int decoupled = 0; decoupled < 2; decoupled++) {
      size_t n = sizes[s];
      fpair w = fpair_rand(n), m = fpair_rand(n), v = fpair_rand_pos(n, 0.01f), g = fpair_rand(n);
      for (int step = 1; step <= 3; step++) {
        float b1 = 1 - powf(0.9f, (float)step), b2 = 1 - powf(0.999f, (float)step);
        BOTH(adam_step, n, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, decoupled, b1, b2, P(g), P(m), P(v), P(w));
        expect_close(&w, 1e-5, false, "adam_step w");
        expect_close(&m, 1e-6, false, "adam_step m");
        expect_close(&v, 1e-6, false, "adam_step v");
      }
      fpair_free(&w);
      fpair_free(&m);
      fpair_free(&v);
      fpair_free(&g);
    }
}

/* The layer-wise steps over segments of every kind: big and tiny, adapting or not, and more
 * of them than a block's worth. */
static void test_lars_lamb_steps(void **state) {
  (void)state;
  enum { TINY = 300 };
  optim_segment segs[3 + TINY];
  uint64_t off = 0;
  segs[0] = (optim_segment){off, 7, 0.01f, 1};
  off += 7;
  segs[1] = (optim_segment){off, 1000, 0.0f, 0};
  off += 1000;
  segs[2] = (optim_segment){off, BIG, 5e-4f, 1};
  off += BIG;
  for (int i = 0; i < TINY; i++, off += 3) segs[3 + i] = (optim_segment){off, 3, i % 2 ? 0.1f : 0.0f, i % 3 != 0};
  int nseg = 3 + TINY;
  size_t n = (size_t)off;
  optim_segment *segs_gpu = dev_alloc(gpu, sizeof segs);
  assert_ok(gpu->ops->from_host(gpu, segs_gpu, segs, sizeof segs));
  double *norms_cpu = dev_alloc(cpu, 2 * sizeof(double) * (size_t)nseg);
  double *norms_gpu = dev_alloc(gpu, 2 * sizeof(double) * (size_t)nseg);
#define SEGS (side ? segs_gpu : segs)
#define NORMS (side ? norms_gpu : norms_cpu)
  fpair w = fpair_rand(n), u = fpair_rand(n), g = fpair_rand(n);
  for (int step = 0; step < 3; step++) {
    BOTH(lars_step, nseg, SEGS, n, 0.5f, 0.9f, 0.001f, P(g), P(u), P(w), NORMS);
    expect_close(&w, 1e-5, false, "lars_step w");
    expect_close(&u, 1e-5, false, "lars_step velocity");
  }
  fpair m = fpair_rand(n), v = fpair_rand_pos(n, 0.01f);
  for (int step = 1; step <= 3; step++) {
    float b1 = 1 - powf(0.9f, (float)step), b2 = 1 - powf(0.999f, (float)step);
    BOTH(lamb_step, nseg, SEGS, n, 0.01f, 0.9f, 0.999f, 1e-6f, b1, b2, P(g), P(m), P(v), P(w), NORMS);
    expect_close(&w, 1e-5, false, "lamb_step w");
    expect_close(&m, 1e-6, false, "lamb_step m");
    expect_close(&v, 1e-6, false, "lamb_step v");
  }
#undef SEGS
#undef NORMS
  fpair *all[] = {&w, &u, &g, &m, &v};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fpair_free(all[i]);
  gpu->ops->free(gpu, segs_gpu);
  gpu->ops->free(gpu, norms_gpu);
  cpu->ops->free(cpu, norms_cpu);
}

/* ---- the device itself ----------------------------------------------------------------- */

#ifdef FLINT_HAVE_CUDA
static void test_allocator(void **state) {
  (void)state;
  assert_int_equal(cuda_allocator_round(1), 512);
  assert_int_equal(cuda_allocator_round(1000), 1024);
  assert_int_equal(cuda_allocator_round(3u << 20), 4u << 20);
  assert_ok(cuda_device_flush_cache(gpu));
  cuda_allocator_stats before, after;
  assert_ok(cuda_device_allocator_stats(gpu, &before));
  assert_int_equal(before.cached, 0);

  void *p = NULL, *q = NULL, *r = NULL;
  assert_ok(gpu->ops->alloc(gpu, 1000, &p));
  gpu->ops->free(gpu, p);
  assert_ok(cuda_device_allocator_stats(gpu, &after));
  assert_int_equal(after.cached, 1024);
  assert_int_equal(after.allocated, before.allocated);
  /* 700 bytes round to the same 1024: the cached block comes back without cudaMalloc. */
  assert_ok(gpu->ops->alloc(gpu, 700, &q));
  assert_ptr_equal(q, p);
  cuda_allocator_stats hit;
  assert_ok(cuda_device_allocator_stats(gpu, &hit));
  assert_int_equal(hit.cache_hits, after.cache_hits + 1);
  assert_int_equal(hit.cuda_mallocs, after.cuda_mallocs);
  assert_int_equal(hit.cached, 0);
  assert_int_equal(hit.allocated, before.allocated + 1024);

  /* A large block, used by a kernel, freed and taken back. */
  assert_ok(gpu->ops->alloc(gpu, 3u << 20, &r));
  assert_ok(gpu->ops->fill(gpu, (3u << 20) / sizeof(float), 2.0f, r));
  cuda_allocator_stats big;
  assert_ok(cuda_device_allocator_stats(gpu, &big));
  assert_int_equal(big.allocated, before.allocated + 1024 + (4u << 20));
  assert_true(big.peak_allocated >= big.allocated);
  gpu->ops->free(gpu, r);
  void *r2 = NULL;
  assert_ok(gpu->ops->alloc(gpu, (3u << 20) + 5, &r2));
  assert_ptr_equal(r2, r);
  gpu->ops->free(gpu, r2);
  gpu->ops->free(gpu, q);
  assert_ok(cuda_device_flush_cache(gpu));
  assert_ok(cuda_device_allocator_stats(gpu, &after));
  assert_int_equal(after.cached, 0);
  assert_int_equal(after.allocated, before.allocated);
  assert_true(after.cache_flushes > before.cache_flushes);
  assert_ok(fl_device_synchronize(gpu));
}
#endif

static void test_bad_ordinal(void **state) {
  (void)state;
  int count = fl_cuda_device_count();
  fl_device *d = NULL;
  char needle[32];
  snprintf(needle, sizeof needle, "cuda:%d", count + 3);
  assert_fails_with(fl_device_open(FL_DEVICE_CUDA, count + 3, &d), FL_ENODEVICE, needle);
  assert_null(d);
}

/* A label outside [0, c) is found by the kernel and reported at the next synchronize; the
 * device then stays failed (sticky) until it is closed. */
static void test_bad_label_is_sticky(void **state) {
  (void)state;
  fl_device *d = NULL;
  assert_ok(fl_device_open(FL_DEVICE_CUDA, 0, &d));
  float *logits = NULL, *dlogits = NULL, *stats = NULL;
  int32_t *labels = NULL;
  assert_ok(d->ops->alloc(d, 4 * 5 * sizeof(float), (void **)&logits));
  assert_ok(d->ops->alloc(d, 4 * 5 * sizeof(float), (void **)&dlogits));
  assert_ok(d->ops->alloc(d, 2 * sizeof(float), (void **)&stats));
  assert_ok(d->ops->alloc(d, 4 * sizeof(int32_t), (void **)&labels));
  int32_t lab[4] = {0, 4, 9, 1};
  assert_ok(d->ops->from_host(d, labels, lab, sizeof lab));
  assert_ok(d->ops->fill(d, 20, 0.5f, logits));
  assert_ok(d->ops->memset0(d, stats, 2 * sizeof(float)));
  assert_ok(d->ops->softmax_xent(d, 4, 5, logits, labels, 0.0f, 1.0f, dlogits, stats));
  assert_fails_with(d->ops->synchronize(d), FL_EINVAL, "label");
  assert_fails_with(d->ops->fill(d, 20, 1.0f, logits), FL_EINVAL, "cuda:0");
  d->ops->free(d, logits);
  d->ops->free(d, dlogits);
  d->ops->free(d, stats);
  d->ops->free(d, labels);
  fl_device_close(d);
}

int main(void) {
  if (fl_cuda_device_count() == 0) {
    printf("test_gpu_cuda: skipped: no usable CUDA GPU (fl_cuda_device_count() == 0)\n");
    return SKIP_CODE;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_name_and_copies),
      cmocka_unit_test(test_gemm),
      cmocka_unit_test(test_blas1),
      cmocka_unit_test(test_relu),
      cmocka_unit_test(test_bias_rows),
      cmocka_unit_test(test_bias_channels),
      cmocka_unit_test(test_softmax_xent),
      cmocka_unit_test(test_im2col_col2im),
      cmocka_unit_test(test_swap01),
      cmocka_unit_test(test_pooling),
      cmocka_unit_test(test_batchnorm),
      cmocka_unit_test(test_sgd_step),
      cmocka_unit_test(test_adam_step),
      cmocka_unit_test(test_lars_lamb_steps),
#ifdef FLINT_HAVE_CUDA
      cmocka_unit_test(test_allocator),
#endif
      cmocka_unit_test(test_bad_ordinal),
      cmocka_unit_test(test_bad_label_is_sticky),
  };
  return cmocka_run_group_tests(tests, setup_devices, teardown_devices);
}
