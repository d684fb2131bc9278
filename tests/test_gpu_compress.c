/*
 * test_gpu_compress.c: the gradient compression hooks (gpu/parallel/compress.h), with ranks as
 * threads over the host backend (tests/rank_threads.h), each rank with its own compressor over
 * a flat buffer of three parameters (a 12 x 10 matrix, a vector of 7, a 5 x 9 matrix) cut in
 * two buckets, as the trainer cuts them.
 *
 * - Error feedback (top-k, 1-bit, PowerSGD): over several steps of random gradients, the sum of
 *   the averaged estimates equals the mean over the ranks of (the sum of a rank's gradients
 *   less its final residual): what a rank sent plus what it kept is what it was given. For
 *   PowerSGD, whose residual is against the averaged estimate, for each rank alone.
 * - Every rank ends each step with the same floats (their replicas stay identical).
 * - PowerSGD at full rank (every matrix compressed) is the plain average.
 * - fp16 and bf16 are the fp32 average within the format's rounding.
 * - The bytes each hook reports sending; a device that is not the host's (a cuda stand-in) is
 *   staged through host memory; buckets that are not whole parameters, specs and trainer
 *   options that are refused, with the reason.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "common/common.h"
#include "gpu/comm/comm.h"
#include "gpu/device/device.h"
#include "gpu/parallel/compress.h"
#include "gpu/parallel/train.h"

#include "rank_threads.h"

enum { STEPS = 6, TOTAL = 120 + 7 + 45, SPLIT = 127 };
static const compress_param params[] = {{0, 12, 10}, {120, 7, 1}, {127, 5, 9}};
static fl_device *cpu;

/* Rank r's gradient element i at step t: uniform in [-1, 1), seeded. */
static float grad(int r, int t, size_t i) {
  uint64_t x = ((uint64_t)(r + 1) << 48) ^ ((uint64_t)(t + 1) << 32) ^ (i * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 32;
  return (float)((double)(x >> 11) / 4503599627370496.0 - 1.0);
}

typedef struct hook_case {
  compress_spec spec;
  bool staged;                 /* the buffer on the cuda stand-in */
  float out[MAX_RANKS][STEPS][TOTAL]; /* each rank's estimate after each step */
  double grads[MAX_RANKS][TOTAL];     /* each rank's gradients summed over the steps */
  float residual[MAX_RANKS][TOTAL];   /* and its residual at the end (0: none kept) */
  uint64_t sent[MAX_RANKS];
} hook_case;

/* ---- a device whose memory is not the host's (cuda without a GPU) -------------------------- */

static device_ops staged_ops;
static fl_device staged_dev;
static atomic_int staged_copies;

static fl_status staged_to_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  atomic_fetch_add(&staged_copies, 1);
  return cpu->ops->to_host(cpu, dst, src, bytes);
}
static fl_status staged_from_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  atomic_fetch_add(&staged_copies, 1);
  return cpu->ops->from_host(cpu, dst, src, bytes);
}

static void staged_init(void) {
  staged_ops = *cpu->ops;
  staged_ops.name = "staged";
  staged_ops.to_host = staged_to_host;
  staged_ops.from_host = staged_from_host;
  staged_dev = *cpu;
  staged_dev.ops = &staged_ops;
  staged_dev.kind = FL_DEVICE_CUDA;
  snprintf(staged_dev.name, sizeof staged_dev.name, "staged (cuda stand-in)");
}

/* ---- one rank: STEPS steps of both buckets ------------------------------------------------ */

static fl_status hook_rank(rank_job *job) {
  hook_case *hc = job->arg;
  int r = job->rank;
  compressor *c = NULL;
  fl_device *dev = hc->staged ? &staged_dev : cpu;
  int64_t shape[1] = {TOTAL};
  fl_tensor *g = NULL;
  fl_status status = FL_OK;
  FL_CHECK(compressor_create(&hc->spec, params, 3, TOTAL, job->size, &c));
  FL_CHECK(fl_tensor_create(cpu, 1, shape, &g));
  g->dev = dev; /* the stand-in's memory is the host's: only its copies differ */
  float v[TOTAL];
  for (int t = 0; t < STEPS; t++) {
    for (size_t i = 0; i < TOTAL; i++) {
      v[i] = grad(r, t, i);
      hc->grads[r][i] += v[i];
    }
    memcpy(g->data, v, sizeof v);
    /* The trainer's order: the last bucket first. */
    fl_tensor b1, b0;
    int64_t s1[1] = {TOTAL - SPLIT}, s0[1] = {SPLIT};
    FL_CHECK(tensor_view(g, SPLIT, 1, s1, &b1));
    FL_CHECK(tensor_view(g, 0, 1, s0, &b0));
    FL_CHECK(compressor_run(c, job->comm, g, &b1));
    FL_CHECK(compressor_run(c, job->comm, g, &b0));
    memcpy(hc->out[r][t], g->data, sizeof v);
  }
  const float *e0 = compressor_residual(c, 0), *e1 = compressor_residual(c, SPLIT);
  if (e0) memcpy(hc->residual[r], e0, SPLIT * sizeof(float));
  if (e1) memcpy(hc->residual[r] + SPLIT, e1, (TOTAL - SPLIT) * sizeof(float));
  hc->sent[r] = compressor_sent(c);
cleanup:
  if (g) g->dev = cpu;
  fl_tensor_destroy(g);
  compressor_destroy(c);
  return status;
}

static void run_case(hook_case *hc, int ranks) {
  memset(hc->grads, 0, sizeof hc->grads);
  memset(hc->residual, 0, sizeof hc->residual);
  group g;
  group_create(&g, ranks);
  rank_job jobs[MAX_RANKS];
  run_ranks(ranks, g.comms, hook_rank, hc, jobs);
  expect_all_ok(ranks, jobs);
  group_destroy(&g);
  /* Every rank holds the same estimate, bit for bit. */
  for (int r = 1; r < ranks; r++) assert_memory_equal(hc->out[r], hc->out[0], sizeof hc->out[0]);
}

/* Error feedback: sum over steps of the estimates = mean over ranks of (gradients - residual).
 * With per_rank (PowerSGD, whose residual is taken against the averaged estimate, what every
 * rank "sent" once decompressed) it holds for each rank alone on the compressed matrices. */
static void check_error_feedback(const hook_case *hc, int ranks, const char *what, bool per_rank) {
  double worst = 0;
  for (size_t i = 0; i < TOTAL; i++) {
    double got = 0, want = 0;
    for (int t = 0; t < STEPS; t++) got += hc->out[0][t][i];
    for (int r = 0; r < ranks; r++) {
      double mine = hc->grads[r][i] - hc->residual[r][i];
      want += mine;
      bool vector = i >= params[1].offset && i < params[2].offset; /* plainly averaged: no residual */
      if (per_rank && !vector && fabs(got - mine) > worst) worst = fabs(got - mine);
    }
    want /= ranks;
    double err = fabs(got - want);
    if (err > worst) worst = err;
  }
  if (worst > 1e-4) fail_msg("%s at %d ranks: the estimates are %g from gradients less residuals", what, ranks, worst);
}

/* Momentum correction (DGC): every rank accumulates velocities u = m u + g into v, sends the
 * top k of v per bucket and zeroes u and v there; the step is the averaged sparse velocity
 * s_t, and the hook hands the optimizer s_t - m s_{t-1} so that SGD's own velocity
 * (m velocity + g) is s_t. A reference in the test against the hook's output, and the
 * optimizer's velocity against s_t. */
static void test_topk_momentum_correction(void **state) {
  (void)state;
  static hook_case hc;
  const float m = 0.9f;
  const double ratio = 0.1;
  for (int ranks = 1; ranks <= 3; ranks += 2) {
    memset(&hc, 0, sizeof hc);
    hc.spec = (compress_spec){.kind = COMPRESS_TOPK, .ratio = ratio, .rank = 1, .min_rate = 1, .momentum = m};
    run_case(&hc, ranks);
    static float u[MAX_RANKS][TOTAL], v[MAX_RANKS][TOTAL];
    float last[TOTAL] = {0}, vel[TOTAL] = {0};
    memset(u, 0, sizeof u), memset(v, 0, sizeof v);
    const size_t lo[2] = {0, SPLIT}, hi[2] = {SPLIT, TOTAL};
    double worst_out = 0, worst_vel = 0;
    for (int t = 0; t < STEPS; t++) {
      float sum[TOTAL] = {0};
      for (int r = 0; r < ranks; r++)
        for (int b = 0; b < 2; b++) {
          size_t n = hi[b] - lo[b], k = (size_t)ceil(ratio * (double)n);
          float mag[TOTAL];
          for (size_t i = lo[b]; i < hi[b]; i++) {
            u[r][i] = m * u[r][i] + grad(r, t, i);
            v[r][i] = u[r][i] + v[r][i];
            mag[i - lo[b]] = fabsf(v[r][i]);
          }
          /* The k-th largest magnitude, by a partial selection sort (n is small). */
          for (size_t j = 0; j < k; j++)
            for (size_t q = j + 1; q < n; q++)
              if (mag[q] > mag[j]) {
                float x = mag[j];
                mag[j] = mag[q], mag[q] = x;
              }
          for (size_t i = lo[b]; i < hi[b]; i++)
            if (fabsf(v[r][i]) >= mag[k - 1]) {
              sum[i] += v[r][i];
              v[r][i] = 0, u[r][i] = 0;
            }
        }
      for (size_t i = 0; i < TOTAL; i++) {
        float st = sum[i] * (1.0f / (float)ranks);
        double e = fabs((double)hc.out[0][t][i] - ((double)st - (double)m * last[i]));
        if (e > worst_out) worst_out = e;
        vel[i] = m * vel[i] + hc.out[0][t][i];
        if (fabs((double)vel[i] - st) > worst_vel) worst_vel = fabs((double)vel[i] - st);
        last[i] = st;
      }
    }
    if (worst_out > 1e-5 || worst_vel > 1e-4)
      fail_msg("momentum correction at %d ranks: output %g, optimizer velocity %g from the reference", ranks,
               worst_out, worst_vel);
    for (int r = 0; r < ranks; r++)
      for (size_t i = 0; i < TOTAL; i++) assert_true(fabs((double)hc.residual[r][i] - v[r][i]) < 1e-5);
  }
}

static void test_error_feedback(void **state) {
  (void)state;
  static hook_case hc;
  const compress_spec specs[] = {
      {.kind = COMPRESS_TOPK, .ratio = 0.1, .rank = 1, .min_rate = 1},
      {.kind = COMPRESS_ONEBIT, .ratio = 0.01, .rank = 1, .min_rate = 1},
      {.kind = COMPRESS_POWERSGD, .ratio = 0.01, .rank = 2, .min_rate = 1},
      {.kind = COMPRESS_POWERSGD, .ratio = 0.01, .rank = 1, .min_rate = 0},
  };
  for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
    for (int ranks = 1; ranks <= 3; ranks++) {
      char name[32];
      compress_spec_format(&specs[k], name, sizeof name);
      hc.spec = specs[k];
      hc.staged = false;
      run_case(&hc, ranks);
      check_error_feedback(&hc, ranks, name, specs[k].kind == COMPRESS_POWERSGD);
      /* Something was kept back: the hooks did compress. */
      double kept = 0;
      for (size_t i = 0; i < TOTAL; i++) kept += fabsf(hc.residual[0][i]);
      assert_true(kept > 0.1);
    }
  }
}

/* Bytes a rank hands to collectives, per hook, over the STEPS steps of both buckets. */
static void test_bytes_sent(void **state) {
  (void)state;
  static hook_case hc;
  hc.staged = false;
  /* top-k 0.1: ceil(12.7) = 13 and ceil(4.5) = 5 pairs of 8 bytes a step. */
  hc.spec = (compress_spec){.kind = COMPRESS_TOPK, .ratio = 0.1, .rank = 1, .min_rate = 1};
  run_case(&hc, 2);
  assert_int_equal(hc.sent[0], STEPS * 8 * (13 + 5));
  /* 1-bit: a scale per row (the vector is one) and a word per 32 elements: (12 + 1 + 4) +
   * (5 + 2) floats. */
  hc.spec.kind = COMPRESS_ONEBIT;
  run_case(&hc, 2);
  assert_int_equal(hc.sent[0], STEPS * 4 * (12 + 1 + 4 + 5 + 2));
  /* PowerSGD rank 2: the vector plain (7), P and Q of 12 x 10 (2 x 22) and of 5 x 9 (2 x 14). */
  hc.spec.kind = COMPRESS_POWERSGD;
  hc.spec.rank = 2;
  run_case(&hc, 2);
  assert_int_equal(hc.sent[0], STEPS * 4 * (7 + 44 + 28));
  /* rank 4 on 5 x 9: 4 x 14 = 56 > 45 / 1: sent plain, with the vector. */
  hc.spec.rank = 4;
  run_case(&hc, 2);
  assert_int_equal(hc.sent[0], STEPS * 4 * (7 + 88 + 45));
  hc.spec.kind = COMPRESS_FP16;
  run_case(&hc, 2);
  assert_int_equal(hc.sent[0], STEPS * 2 * TOTAL);
}

/* PowerSGD at full rank, every matrix compressed: the plain average, step by step. */
static void test_powersgd_full_rank(void **state) {
  (void)state;
  static hook_case hc;
  hc.spec = (compress_spec){.kind = COMPRESS_POWERSGD, .rank = 12, .min_rate = 0};
  for (int ranks = 2; ranks <= 3; ranks++) {
    hc.staged = ranks == 3;
    atomic_store(&staged_copies, 0);
    run_case(&hc, ranks);
    if (hc.staged) assert_int_equal(atomic_load(&staged_copies), ranks * STEPS * 2 * 2);
    double worst = 0;
    for (int t = 0; t < STEPS; t++)
      for (size_t i = 0; i < TOTAL; i++) {
        double avg = 0;
        for (int r = 0; r < ranks; r++) avg += grad(r, t, i);
        avg /= ranks;
        double err = fabs(hc.out[0][t][i] - avg);
        if (err > worst) worst = err;
      }
    if (worst > 1e-4) fail_msg("PowerSGD at full rank, %d ranks: %g from the average", ranks, worst);
    /* A rank's residual is what of its M lies outside the span of the sum (rows > cols), but
     * the residuals add up to nothing. */
    for (size_t i = 0; i < TOTAL; i++) {
      double sum = 0;
      for (int r = 0; r < ranks; r++) sum += hc.residual[r][i];
      assert_true(fabs(sum) < 1e-4);
    }
  }
}

/* fp16 and bf16: the fp32 average within the format's rounding (of each input and each
 * partial sum of the ring). */
static void test_half(void **state) {
  (void)state;
  static hook_case hc;
  for (int bf = 0; bf < 2; bf++) {
    hc.spec = (compress_spec){.kind = bf ? COMPRESS_BF16 : COMPRESS_FP16, .rank = 1, .min_rate = 1};
    double u = bf ? 1.0 / 256 : 1.0 / 2048; /* the unit roundoff: 2^-8, 2^-11 */
    for (int ranks = 1; ranks <= 3; ranks++) {
      hc.staged = false;
      run_case(&hc, ranks);
      double worst = 0, exact_at = 0;
      for (int t = 0; t < STEPS; t++)
        for (size_t i = 0; i < TOTAL; i++) {
          double avg = 0, mag = 0;
          for (int r = 0; r < ranks; r++) avg += grad(r, t, i), mag += fabs(grad(r, t, i));
          avg /= ranks;
          double err = fabs(hc.out[0][t][i] - avg), bound = 2 * ranks * u * mag / ranks + 1e-7;
          if (err > bound) fail_msg("%s, %d ranks, step %d element %zu: %g, not %g within %g", bf ? "bf16" : "fp16",
                                    ranks, t, i, hc.out[0][t][i], avg, bound);
          if (err > worst) worst = err;
          exact_at += err == 0;
        }
      /* Rounding happened: not a plain fp32 allreduce in disguise. */
      assert_true(worst > 0);
      assert_true(exact_at < STEPS * TOTAL);
    }
  }
}

/* A range that is not whole parameters, or a bucket cut differently from before. */
static fl_status bad_bucket_rank(rank_job *job) {
  compressor *c = NULL;
  compress_spec spec = {.kind = COMPRESS_TOPK, .ratio = 0.5, .rank = 1, .min_rate = 1};
  int64_t shape[1] = {TOTAL};
  fl_tensor *g = NULL, view;
  fl_status status = FL_OK;
  FL_CHECK(compressor_create(&spec, params, 3, TOTAL, 1, &c));
  FL_CHECK(fl_tensor_create(cpu, 1, shape, &g));
  int64_t s[1] = {50};
  FL_CHECK(tensor_view(g, 10, 1, s, &view));
  status = compressor_run(c, job->comm, g, &view);
  if (status != FL_EINVAL || !strstr(fl_last_error(), "elements [10, 60) are not whole parameters")) {
    status = fl_set_error(FL_EINTERNAL, "a bucket inside a parameter: %s", fl_last_error());
    goto cleanup;
  }
  s[0] = 120;
  FL_CHECK(tensor_view(g, 0, 1, s, &view));
  FL_CHECK(compressor_run(c, job->comm, g, &view));
  s[0] = SPLIT;
  FL_CHECK(tensor_view(g, 0, 1, s, &view));
  status = compressor_run(c, job->comm, g, &view);
  if (status != FL_EINVAL || !strstr(fl_last_error(), "holds 127 elements, not 120 as before")) {
    status = fl_set_error(FL_EINTERNAL, "a bucket cut anew: %s", fl_last_error());
    goto cleanup;
  }
  status = FL_OK;
cleanup:
  fl_tensor_destroy(g);
  compressor_destroy(c);
  return status;
}

static void test_bad_buckets(void **state) {
  (void)state;
  group g;
  group_create(&g, 1);
  rank_job jobs[1];
  run_ranks(1, g.comms, bad_bucket_rank, NULL, jobs);
  expect_all_ok(1, jobs);
  group_destroy(&g);
}

static void test_specs(void **state) {
  (void)state;
  compress_spec s;
  char text[32];
  assert_ok(compress_spec_parse(NULL, &s));
  assert_int_equal(s.kind, COMPRESS_NONE);
  const char *good[] = {"none", "fp16", "bf16", "topk:0.01", "topk:1", "powersgd:4", "powersgd:1", "onebit"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    assert_ok(compress_spec_parse(good[i], &s));
    compress_spec_format(&s, text, sizeof text);
    assert_string_equal(text, good[i]);
  }
  assert_ok(compress_spec_parse("topk", &s));
  assert_true(s.kind == COMPRESS_TOPK && s.ratio == 0.01);
  assert_ok(compress_spec_parse("powersgd", &s));
  assert_true(s.kind == COMPRESS_POWERSGD && s.rank == 1 && s.min_rate == 1);
  assert_fails_with(compress_spec_parse("topk:0", &s), FL_EINVAL, "'topk:0': the ratio is outside (0, 1]");
  assert_fails_with(compress_spec_parse("topk:1.5", &s), FL_EINVAL, "the ratio is outside (0, 1]");
  assert_fails_with(compress_spec_parse("topk:-0.1", &s), FL_EINVAL, "the ratio is outside (0, 1]");
  assert_fails_with(compress_spec_parse("topk:lots", &s), FL_EINVAL, "the ratio is not a number");
  assert_fails_with(compress_spec_parse("topk:", &s), FL_EINVAL, "the ratio is not a number");
  assert_fails_with(compress_spec_parse("powersgd:0", &s), FL_EINVAL, "'powersgd:0': the rank is less than 1");
  assert_fails_with(compress_spec_parse("powersgd:-2", &s), FL_EINVAL, "the rank is less than 1");
  assert_fails_with(compress_spec_parse("powersgd:2.5", &s), FL_EINVAL, "the rank is not a whole number");
  assert_fails_with(compress_spec_parse("powersgd:5000", &s), FL_EINVAL, "the rank is too large");
  assert_fails_with(compress_spec_parse("fp16:2", &s), FL_EINVAL, "this method takes no argument");
  assert_fails_with(compress_spec_parse("zip", &s), FL_EINVAL, "'zip': unknown method (expected none, fp16");
}

/* The trainer's options: a spec that does not parse, and gradients that are not allreduced. */
static void test_options(void **state) {
  (void)state;
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.compress = "topk:0.01";
  assert_ok(gpu_train_options_validate(&o));
  o.compress = "powersgd:0";
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--compress 'powersgd:0': the rank is less than 1");
  o.compress = "onebit";
  o.sync = GPU_TRAIN_SYNC_LOCAL;
  o.tau = 4;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--compress onebit needs --sync bsp: local SGD");
  o.sync = GPU_TRAIN_SYNC_ASP;
  o.optim.momentum = 0;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "with asp and ssp the workers push");
  o = (gpu_train_options)GPU_TRAIN_OPTIONS_INIT;
  o.model = NN_TRANSFORMER;
  o.compress = "fp16";
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--compress fp16 is for the data-parallel models");
  o.compress = "none";
  assert_ok(gpu_train_options_validate(&o));
}

int main(void) {
  must_ok(fl_device_open(FL_DEVICE_CPU, 0, &cpu));
  staged_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_specs),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_error_feedback),
      cmocka_unit_test(test_topk_momentum_correction),
      cmocka_unit_test(test_bytes_sent),
      cmocka_unit_test(test_powersgd_full_rank),
      cmocka_unit_test(test_half),
      cmocka_unit_test(test_bad_buckets),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fl_device_close(cpu);
  return rc;
}
