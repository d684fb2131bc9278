/*
 * test_gpu_optim.c: the training stack around the model, on the cpu device: SGD steps against
 * hand-computed values (momentum, Nesterov, weight decay), every optimizer (SGD, Adam, AdamW,
 * LARS, LAMB) against a double-precision reference of the published formulas over two
 * parameter groups, the no-decay rule, gradient clipping, the schedules at chosen points,
 * checkpoint round trips and every corrupt blob, the curves' CSV, SVG and progress line, the
 * image datasets (a tiny IDX pair written here, plain and gzip'd, and every bad input),
 * the rank's reader and synthetic-imagenet's determinism.
 */
#include <math.h>
#include <zlib.h>

#include "test_util.h"

#include "gpu/data/data.h"
#include "gpu/device/device.h"
#include "gpu/nn/nn.h"
#include "gpu/parallel/curves.h"
#include "gpu/parallel/train.h"

static fl_device *open_cpu(void) {
  fl_device *dev = NULL;
  assert_ok(fl_device_open(FL_DEVICE_CPU, 0, &dev));
  return dev;
}

static fl_tensor *tensor_of(fl_device *dev, const float *v, size_t n) {
  fl_tensor *t = NULL;
  int64_t shape[1] = {(int64_t)n};
  assert_ok(fl_tensor_create(dev, 1, shape, &t));
  assert_ok(fl_tensor_write(t, v, n));
  return t;
}

static void expect_values(const fl_tensor *t, const float *want, size_t n, float tol) {
  float got[64];
  assert_true(n <= 64);
  assert_ok(fl_tensor_read(t, got, n));
  for (size_t i = 0; i < n; i++) {
    if (fabsf(got[i] - want[i]) > tol) fprintf(stderr, "[%zu] got %.7f want %.7f\n", i, got[i], want[i]);
    assert_true(fabsf(got[i] - want[i]) <= tol);
  }
}

/* ---- SGD ------------------------------------------------------------------------------- */

/* An optimizer of n values in one parameter of the decay group (the old single-group SGD). */
static optim *sgd_of(fl_device *dev, size_t n, float momentum, bool nesterov, float wd) {
  optim_options o = OPTIM_OPTIONS_INIT;
  o.momentum = momentum;
  o.nesterov = nesterov;
  o.weight_decay = wd;
  optim *opt = NULL;
  assert_ok(optim_create(dev, &o, n, NULL, 0, &opt));
  return opt;
}

/* w = 1, grad 0.5 twice, lr 0.1, momentum 0.9, weight decay 0.1, worked by hand:
 *   step 1: g = 0.5 + 0.1 * 1 = 0.6; v = 0.6; w = 1 - 0.06 = 0.94
 *   step 2: g = 0.5 + 0.094 = 0.594; v = 0.54 + 0.594 = 1.134; w = 0.94 - 0.1134 = 0.8266
 * Nesterov: step 1: w = 1 - 0.1 * (0.6 + 0.54) = 0.886
 *   step 2: g = 0.5 + 0.0886 = 0.5886; v = 0.54 + 0.5886 = 1.1286;
 *           w = 0.886 - 0.1 * (0.5886 + 1.01574) = 0.725566 */
static void run_two_steps(bool nesterov, float w1, float w2, float v2) {
  fl_device *dev = open_cpu();
  float w[3] = {1, 1, 1}, g[3] = {0.5f, 0.5f, 0.5f};
  fl_tensor *values = tensor_of(dev, w, 3), *grads = tensor_of(dev, g, 3);
  optim *opt = sgd_of(dev, 3, 0.9f, nesterov, 0.1f);
  assert_ok(optim_step(opt, 0.1f, grads, values));
  float want1[3] = {w1, w1, w1};
  expect_values(values, want1, 3, 1e-6f);
  assert_ok(optim_step(opt, 0.1f, grads, values));
  float want2[3] = {w2, w2, w2}, vel[3];
  expect_values(values, want2, 3, 1e-6f);
  assert_int_equal(optim_steps(opt), 2);
  assert_ok(dev->ops->to_host(dev, vel, optim_state(opt), sizeof vel));
  for (int i = 0; i < 3; i++) assert_true(fabsf(vel[i] - v2) < 1e-6f);
  /* reset: a fresh start behaves as step 1 again from the current weights. */
  assert_ok(optim_reset(opt));
  assert_int_equal(optim_steps(opt), 0);
  assert_ok(dev->ops->to_host(dev, vel, optim_state(opt), sizeof vel));
  for (int i = 0; i < 3; i++) assert_true(vel[i] == 0);
  optim_destroy(opt);
  fl_tensor_destroy(values);
  fl_tensor_destroy(grads);
  fl_device_close(dev);
}

static void test_sgd_momentum_weight_decay(void **state) {
  (void)state;
  run_two_steps(false, 0.94f, 0.8266f, 1.134f);
}

static void test_sgd_nesterov(void **state) {
  (void)state;
  run_two_steps(true, 0.886f, 0.725566f, 1.1286f);
}

/* Momentum 0, no decay: plain w -= lr * g, element by element. */
static void test_sgd_plain(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  float w[4] = {1, -2, 3, 0}, g[4] = {1, 1, -2, 0.25f};
  fl_tensor *values = tensor_of(dev, w, 4), *grads = tensor_of(dev, g, 4);
  optim *opt = sgd_of(dev, 4, 0, false, 0);
  assert_ok(optim_step(opt, 0.5f, grads, values));
  float want[4] = {0.5f, -2.5f, 4, -0.125f};
  expect_values(values, want, 4, 1e-7f);
  optim_destroy(opt);
  fl_tensor_destroy(values);
  fl_tensor_destroy(grads);
  fl_device_close(dev);
}

static void test_optim_bad_arguments(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  optim *opt = NULL;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.momentum = 1.0f;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "momentum");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  o.momentum = 0;
  o.nesterov = true;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "Nesterov");
  o.kind = OPTIM_ADAM;
  o.momentum = 0.9f;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "Nesterov momentum is for sgd");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  o.weight_decay = -1;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "weight decay");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_ADAMW;
  o.beta2 = 1;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "adamw: beta1 0.9 and beta2 1");
  o.beta2 = 0.999f;
  o.eps = 0;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "eps");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_LARS;
  o.trust_coef = 0;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "trust coefficient");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  o.kind = (optim_kind)7;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "unknown optimizer 7");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  assert_fails_with(optim_create(dev, &o, 0, NULL, 0, &opt), FL_EINVAL, "no parameters");
  /* Parameters must tile the values in order. */
  optim_param gap[2] = {{0, 2, false}, {3, 1, true}}, short_[1] = {{0, 2, false}}, over[1] = {{0, 5, false}};
  assert_fails_with(optim_create(dev, &o, 4, gap, 2, &opt), FL_EINVAL, "parameter 1 covers [3, +1)");
  assert_fails_with(optim_create(dev, &o, 4, short_, 1, &opt), FL_EINVAL, "cover 2 of the 4");
  assert_fails_with(optim_create(dev, &o, 4, over, 1, &opt), FL_EINVAL, "parameter 0");
  assert_null(opt);
  optim_kind k;
  assert_ok(optim_kind_parse("lamb", &k));
  assert_int_equal(k, OPTIM_LAMB);
  assert_fails_with(optim_kind_parse("adagrd", &k), FL_EINVAL, "'adagrd'");
  /* Downpour's adagrad names the parameter servers' update (flint train --sync asp): no device step. */
  assert_ok(optim_kind_parse("adagrad", &k));
  o.kind = k;
  assert_fails_with(optim_create(dev, &o, 3, NULL, 0, &opt), FL_EINVAL, "the parameter servers apply");
  o = (optim_options)OPTIM_OPTIONS_INIT;
  assert_string_equal(optim_kind_name(OPTIM_ADAMW), "adamw");

  opt = sgd_of(dev, 3, 0.9f, false, 1e-4f);
  float v[4] = {0};
  fl_tensor *three = tensor_of(dev, v, 3), *four = tensor_of(dev, v, 4);
  assert_fails_with(optim_step(opt, 0.1f, four, three), FL_EINVAL, "4 gradients");
  assert_fails_with(optim_step(opt, -0.1f, three, three), FL_EINVAL, "learning rate");
  assert_fails_with(optim_step(opt, NAN, three, three), FL_EINVAL, "learning rate");
  assert_int_equal(optim_steps(opt), 0); /* refused steps do not count */
  optim_destroy(opt);
  optim_destroy(NULL);
  fl_tensor_destroy(three);
  fl_tensor_destroy(four);
  fl_device_close(dev);
}

/* ---- every optimizer against the published formulas ------------------------------------ */

/* Four parameters in two groups: [0, 6) and [9, 17) decay, [6, 9) and [17, 19) do not (as a
 * weight, bias, weight, bias would by the default rule). */
#define REF_N 19
static const optim_param ref_params[4] = {{0, 6, false}, {6, 3, true}, {9, 8, false}, {17, 2, true}};

typedef struct ref_state {
  double w[REF_N], s0[REF_N], s1[REF_N];
  uint64_t t;
} ref_state;

static double ref_norm(const double *x, size_t o, size_t c) {
  double s = 0;
  for (size_t i = o; i < o + c; i++) s += x[i] * x[i];
  return sqrt(s);
}

/* One step in double, written from the papers' and PyTorch's formulas, independently of the
 * device code: PyTorch's SGD, Adam and AdamW; You et al. 2017 (LARS, Algorithm 2) and 2019
 * (LAMB, Algorithm 2); excluded parameters take no decay and trust ratio 1. */
static void ref_step(const optim_options *o, double lr, const double *g, ref_state *r) {
  r->t++;
  double bc1 = 1 - pow(o->beta1, (double)r->t), bc2 = 1 - pow(o->beta2, (double)r->t);
  for (int p = 0; p < 4; p++) {
    size_t off = ref_params[p].offset, c = ref_params[p].count;
    bool excluded = ref_params[p].no_decay && !o->decay_all;
    double wd = excluded ? 0 : o->weight_decay, mom = o->momentum;
    double *w = r->w, *a = r->s0, *b = r->s1;
    if (o->kind == OPTIM_LARS) {
      double wn = ref_norm(w, off, c), gn = ref_norm(g, off, c);
      double ratio = !excluded && wn > 0 && gn > 0 ? o->trust_coef * wn / (gn + wd * wn) : 1;
      for (size_t i = off; i < off + c; i++) {
        a[i] = mom * a[i] + lr * ratio * (g[i] + wd * w[i]);
        w[i] -= a[i];
      }
      continue;
    }
    if (o->kind == OPTIM_LAMB) {
      double rr[REF_N];
      for (size_t i = off; i < off + c; i++) {
        a[i] = o->beta1 * a[i] + (1 - o->beta1) * g[i];
        b[i] = o->beta2 * b[i] + (1 - o->beta2) * g[i] * g[i];
        rr[i] = (a[i] / bc1) / (sqrt(b[i] / bc2) + o->eps) + wd * w[i];
      }
      double wn = ref_norm(w, off, c), rn = ref_norm(rr, off, c);
      double ratio = !excluded && wn > 0 && rn > 0 ? wn / rn : 1;
      for (size_t i = off; i < off + c; i++) w[i] -= lr * ratio * rr[i];
      continue;
    }
    for (size_t i = off; i < off + c; i++) {
      if (o->kind == OPTIM_SGD) {
        double gi = g[i] + wd * w[i];
        a[i] = mom * a[i] + gi;
        w[i] -= lr * (o->nesterov ? gi + mom * a[i] : a[i]);
      } else {
        double gi = g[i];
        if (o->kind == OPTIM_ADAMW) w[i] *= 1 - lr * wd;
        else gi += wd * w[i];
        a[i] = o->beta1 * a[i] + (1 - o->beta1) * gi;
        b[i] = o->beta2 * b[i] + (1 - o->beta2) * gi * gi;
        w[i] -= lr * (a[i] / bc1) / (sqrt(b[i] / bc2) + o->eps);
      }
    }
  }
}

/* Step t's gradient: varied in sign and size from element to element and step to step. */
static void ref_grad(int t, double *g) {
  for (int i = 0; i < REF_N; i++) g[i] = sin(0.7 * i + 1.3 * t) * (1 + i % 3) + (i == 4 ? 0.05 * t : 0);
}

/* Four steps of `o` at rate lr on the device against ref_step; the state too. */
static void check_against_reference(optim_options o, double lr) {
  fl_device *dev = open_cpu();
  ref_state ref = {0};
  float w[REF_N], gf[REF_N];
  for (int i = 0; i < REF_N; i++) w[i] = (float)(0.5 * cos(1.1 * i) + (i % 4 == 0 ? 0.3 : -0.1));
  for (int i = 0; i < REF_N; i++) ref.w[i] = w[i];
  fl_tensor *values = tensor_of(dev, w, REF_N), *grads = tensor_of(dev, w, REF_N);
  optim *opt = NULL;
  assert_ok(optim_create(dev, &o, REF_N, ref_params, 4, &opt));
  assert_int_equal(optim_param_count(opt), 4);
  assert_int_equal(optim_param_no_decay(opt, 1), !o.decay_all);
  assert_false(optim_param_no_decay(opt, 2));
  for (int t = 1; t <= 4; t++) {
    double g[REF_N];
    ref_grad(t, g);
    for (int i = 0; i < REF_N; i++) gf[i] = (float)g[i];
    assert_ok(fl_tensor_write(grads, gf, REF_N));
    assert_ok(optim_step(opt, (float)lr, grads, values));
    ref_step(&o, lr, g, &ref);
    float got[REF_N], st[2 * REF_N];
    assert_ok(fl_tensor_read(values, got, REF_N));
    size_t slots = optim_state_slots(o.kind);
    assert_ok(dev->ops->to_host(dev, st, optim_state(opt), slots * REF_N * sizeof(float)));
    for (int i = 0; i < REF_N; i++) {
      double want[3] = {ref.w[i], ref.s0[i], ref.s1[i]}, have[3] = {got[i], st[i], slots == 2 ? st[REF_N + i] : 0};
      for (int k = 0; k < (slots == 2 ? 3 : 2); k++) {
        if (fabs(have[k] - want[k]) > 2e-5 * (1 + fabs(want[k])))
          fprintf(stderr, "%s step %d [%d] %s: got %.8f want %.8f\n", optim_kind_name(o.kind), t, i,
                  k == 0 ? "w" : k == 1 ? "state 0" : "state 1", have[k], want[k]);
        assert_true(fabs(have[k] - want[k]) <= 2e-5 * (1 + fabs(want[k])));
      }
    }
  }
  assert_int_equal(optim_steps(opt), 4);
  optim_destroy(opt);
  fl_tensor_destroy(values);
  fl_tensor_destroy(grads);
  fl_device_close(dev);
}

static void test_sgd_against_reference(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.weight_decay = 0.1f;
  check_against_reference(o, 0.1);
  o.nesterov = true;
  check_against_reference(o, 0.1);
  o.nesterov = false;
  o.decay_all = true;
  check_against_reference(o, 0.1);
}

static void test_adam_adamw_against_reference(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_ADAM;
  o.weight_decay = 0.1f;
  check_against_reference(o, 0.01);
  o.kind = OPTIM_ADAMW;
  check_against_reference(o, 0.01);
  o.beta1 = 0.5f;
  o.beta2 = 0.9f;
  o.eps = 1e-3f;
  o.weight_decay = 0.5f;
  check_against_reference(o, 0.05);
}

static void test_lars_against_reference(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_LARS;
  o.weight_decay = 0.05f;
  o.trust_coef = 0.02f;
  check_against_reference(o, 2.0);
  o.momentum = 0;
  o.decay_all = true;
  check_against_reference(o, 2.0);
}

static void test_lamb_against_reference(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_LAMB;
  o.weight_decay = 0.1f;
  o.eps = 1e-6f;
  check_against_reference(o, 0.01);
  o.decay_all = true;
  check_against_reference(o, 0.01);
}

/* The default rule on a real model: biases are 1-D (no decay), weights are not; decay_all puts
 * them all in the decay group. With zero gradients and SGD without momentum, a step shrinks
 * the decay group's weights by 1 - lr * wd and leaves the others as they were. */
static void test_no_decay_rule(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  nn_model_spec spec = {.kind = NN_MLP, .channels = 1, .height = 4, .width = 4, .classes = 3, .hidden = 8, .seed = 5};
  nn_model *m = NULL;
  assert_ok(nn_model_create(dev, &spec, &m));
  optim_options o = OPTIM_OPTIONS_INIT;
  o.momentum = 0;
  o.weight_decay = 0.5f;
  optim *opt = NULL, *all = NULL;
  assert_ok(optim_create_for_model(dev, &o, m, &opt));
  o.decay_all = true;
  assert_ok(optim_create_for_model(dev, &o, m, &all));
  size_t np = nn_model_param_count(m), biases = 0;
  assert_int_equal(optim_param_count(opt), np);
  for (size_t i = 0; i < np; i++) {
    nn_param *p = nn_model_param(m, i);
    bool bias = strstr(p->name, "bias") != NULL;
    assert_int_equal(p->value.ndim == 1, bias);
    assert_int_equal(optim_param_no_decay(opt, i), bias);
    assert_false(optim_param_no_decay(all, i));
    biases += bias;
  }
  assert_true(biases >= 2);
  size_t n = fl_tensor_numel(nn_model_values(m));
  float *before = malloc(n * sizeof *before), *after = malloc(n * sizeof *after);
  assert_non_null(before);
  assert_non_null(after);
  assert_ok(nn_model_zero_grad(m));
  assert_ok(fl_tensor_read(nn_model_values(m), before, n));
  assert_ok(optim_step(opt, 0.1f, nn_model_grads(m), nn_model_values(m)));
  assert_ok(fl_tensor_read(nn_model_values(m), after, n));
  for (size_t i = 0; i < np; i++) {
    nn_param *p = nn_model_param(m, i);
    float f = optim_param_no_decay(opt, i) ? 1.0f : 0.95f;
    for (size_t k = p->offset; k < p->offset + p->value.numel; k++) assert_true(fabsf(after[k] - f * before[k]) <= 1e-7f);
  }
  free(before);
  free(after);
  optim_destroy(opt);
  optim_destroy(all);
  nn_model_destroy(m);
  fl_device_close(dev);
}

/* clip_grad_norm_: the norm is returned; above max_norm the gradients are scaled by
 * max_norm / (norm + 1e-6), at or below it they are left alone. */
static void test_clip_grad_norm(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  float g[4] = {3, 0, -4, 0}; /* norm 5 */
  fl_tensor *t = tensor_of(dev, g, 4);
  double norm = 0;
  assert_ok(optim_clip_grad_norm(t, 10, &norm));
  assert_true(fabs(norm - 5) < 1e-12);
  expect_values(t, g, 4, 0);
  assert_ok(optim_clip_grad_norm(t, 5.5, NULL));
  expect_values(t, g, 4, 0);
  assert_ok(optim_clip_grad_norm(t, 1, &norm));
  assert_true(fabs(norm - 5) < 1e-12);
  double c = 1 / (5 + 1e-6);
  float want[4] = {(float)(3 * c), 0, (float)(-4 * c), 0};
  expect_values(t, want, 4, 1e-7f);
  /* Now just below the bound (by the 1e-6): PyTorch's rule scales by a hair less than 1. */
  assert_ok(optim_clip_grad_norm(t, 1, &norm));
  assert_true(fabs(norm - 1) < 1e-6);
  expect_values(t, want, 4, 1e-6f);
  assert_fails_with(optim_clip_grad_norm(t, 0, NULL), FL_EINVAL, "max norm 0");
  assert_fails_with(optim_clip_grad_norm(t, INFINITY, NULL), FL_EINVAL, "max norm");
  assert_fails_with(optim_clip_grad_norm(NULL, 1, NULL), FL_EINVAL, "NULL");
  /* A NaN gradient: the norm says so and nothing is scaled. */
  float bad[4] = {1, NAN, 0, 2};
  assert_ok(fl_tensor_write(t, bad, 4));
  assert_ok(optim_clip_grad_norm(t, 1, &norm));
  assert_true(isnan(norm));
  float back[4];
  assert_ok(fl_tensor_read(t, back, 4));
  assert_true(back[0] == 1 && back[3] == 2);
  fl_tensor_destroy(t);
  fl_device_close(dev);
}

/* ---- loss scaling and precision ------------------------------------------------------- */

static void test_loss_scaler(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  float g[3] = {1024, -512, 0.5f};
  fl_tensor *t = tensor_of(dev, g, 3);
  loss_scaler ls = LOSS_SCALER_INIT;
  assert_true(ls.scale == 65536.0f);
  ls.scale = 1024;
  ls.growth_interval = 2;
  bool step = false;
  /* Finite: divided by the scale (exactly: a power of two), and one good step counted. */
  assert_ok(loss_scaler_unscale(&ls, t, &step));
  assert_true(step);
  float want[3] = {1, -0.5f, 0.5f / 1024};
  expect_values(t, want, 3, 0);
  assert_true(ls.scale == 1024 && ls.good_steps == 1);
  /* The second finite step in a row doubles the scale. */
  assert_ok(loss_scaler_unscale(&ls, t, &step));
  assert_true(step && ls.scale == 2048 && ls.good_steps == 0);
  /* An inf or a NaN: skip, halve, and leave the gradients as they were. */
  float bad[3] = {1, INFINITY, 2};
  assert_ok(fl_tensor_write(t, bad, 3));
  assert_ok(loss_scaler_unscale(&ls, t, &step));
  assert_false(step);
  assert_true(ls.scale == 1024 && ls.good_steps == 0 && ls.skipped == 1);
  float back[3];
  assert_ok(fl_tensor_read(t, back, 3));
  assert_true(back[0] == 1 && isinf(back[1]) && back[2] == 2);
  bad[1] = NAN;
  assert_ok(fl_tensor_write(t, bad, 3));
  assert_ok(loss_scaler_unscale(&ls, t, &step));
  assert_false(step);
  assert_true(ls.scale == 512 && ls.skipped == 2);
  fl_tensor_destroy(t);
  fl_device_close(dev);
}

static void test_precision_on_cpu(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  assert_int_equal(fl_device_precision(dev), FL_PRECISION_FP32);
  assert_ok(fl_device_set_precision(dev, FL_PRECISION_FP32));
  assert_fails_with(fl_device_set_precision(dev, FL_PRECISION_BF16), FL_EINVAL,
                    "device cpu computes in fp32 only: precision bf16 needs a cuda device");
  assert_fails_with(fl_device_set_precision(dev, FL_PRECISION_FP16), FL_EINVAL, "precision fp16");
  assert_fails_with(fl_device_set_precision(dev, (fl_precision)9), FL_EINVAL, "unknown precision 9");
  assert_fails_with(fl_device_set_precision(NULL, FL_PRECISION_FP32), FL_EINVAL, "NULL");
  assert_int_equal(fl_device_precision(dev), FL_PRECISION_FP32);
  static const char *names[] = {"fp32", "tf32", "bf16", "fp16"};
  for (int i = 0; i < 4; i++) {
    fl_precision p;
    assert_ok(fl_precision_parse(names[i], &p));
    assert_int_equal(p, i);
    assert_string_equal(fl_precision_name(p), names[i]);
  }
  fl_precision p;
  assert_fails_with(fl_precision_parse("fp8", &p), FL_EINVAL, "unknown precision 'fp8'");
  assert_string_equal(fl_precision_name((fl_precision)7), "?");
  fl_device_close(dev);
}

/* ---- schedules ----------------------------------------------------------------------- */

#define assert_near(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-9 * (1 + fabs((double)(b))))

static void test_schedule_linear_scaling_and_warmup(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 8192, .warmup_epochs = 5, .epochs = 90};
  assert_ok(optim_schedule_validate(&s));
  assert_near(optim_schedule_peak_lr(&s), 3.2); /* 0.1 x 8192 / 256 */
  assert_near(optim_lr_at(&s, 0), 0.1);          /* warmup starts at the small-batch rate */
  assert_near(optim_lr_at(&s, 2.5), 0.1 + 3.1 * 0.5);
  assert_near(optim_lr_at(&s, 1.0 / 7), 0.1 + 3.1 * (1.0 / 7) / 5); /* per step, not per epoch */
  assert_near(optim_lr_at(&s, 5), 3.2);
  assert_near(optim_lr_at(&s, 40), 3.2);
  assert_near(optim_lr_at(&s, -1), 0.1);
  /* batch 256: peak = base, warmup is flat. */
  s.global_batch = 256;
  assert_near(optim_lr_at(&s, 1), 0.1);
  /* batch 128: peak 0.05, warmup starts at the smaller rate (min(base, peak)). */
  s.global_batch = 128;
  assert_near(optim_lr_at(&s, 0), 0.05);
  s.reference_batch = 128;
  assert_near(optim_schedule_peak_lr(&s), 0.1);
}

static void test_schedule_step_and_cosine(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 512, .warmup_epochs = 0, .epochs = 90,
                      .decay = OPTIM_DECAY_STEP, .milestones = {30, 60, 80}, .num_milestones = 3};
  assert_ok(optim_schedule_validate(&s));
  assert_near(optim_lr_at(&s, 29.99), 0.2);
  assert_near(optim_lr_at(&s, 30), 0.02);
  assert_near(optim_lr_at(&s, 60), 0.002);
  assert_near(optim_lr_at(&s, 85), 0.0002);
  s.step_factor = 0.5;
  assert_near(optim_lr_at(&s, 61), 0.05);

  optim_schedule c = {.base_lr = 0.1, .global_batch = 1024, .warmup_epochs = 10, .epochs = 50,
                      .decay = OPTIM_DECAY_COSINE};
  assert_ok(optim_schedule_validate(&c));
  assert_near(optim_lr_at(&c, 10), 0.4);  /* the peak at the end of warmup */
  assert_near(optim_lr_at(&c, 30), 0.2);  /* half way down */
  assert_near(optim_lr_at(&c, 20), 0.2 * (1 + cos(M_PI / 4)));
  assert_near(optim_lr_at(&c, 50), 0.0);
  assert_near(optim_lr_at(&c, 70), 0.0);  /* past the end: the end */
  assert_near(optim_lr_at(&c, 5), 0.1 + 0.3 * 0.5);

  /* Polynomial decay (power 2 by default) from the peak at the end of warmup to 0. */
  optim_schedule p = {.base_lr = 0.1, .global_batch = 1024, .warmup_epochs = 10, .epochs = 50,
                      .decay = OPTIM_DECAY_POLY};
  assert_ok(optim_schedule_validate(&p));
  assert_near(optim_lr_at(&p, 10), 0.4);
  assert_near(optim_lr_at(&p, 30), 0.4 * 0.25);
  assert_near(optim_lr_at(&p, 40), 0.4 * 0.0625);
  assert_near(optim_lr_at(&p, 50), 0.0);
  assert_near(optim_lr_at(&p, 5), 0.1 + 0.3 * 0.5); /* warmup as before */
  p.power = 1;
  assert_near(optim_lr_at(&p, 30), 0.2);
  p.power = -1;
  assert_fails_with(optim_schedule_validate(&p), FL_EINVAL, "polynomial power -1");
}

/* The public schedule: the same rules through flint/train.h. */
static void test_public_schedule(void **state) {
  (void)state;
  fl_lr_schedule s = FL_LR_SCHEDULE_INIT;
  s.lr = 0.1;
  s.batch = 1024;
  s.warmup_epochs = 2;
  s.epochs = 10;
  double lr;
  assert_ok(fl_lr_schedule_at(&s, 0, &lr));
  assert_near(lr, 0.1); /* warmup starts at the small-batch rate */
  assert_ok(fl_lr_schedule_at(&s, 1, &lr));
  assert_near(lr, 0.25);
  assert_ok(fl_lr_schedule_at(&s, 2, &lr));
  assert_near(lr, 0.4); /* the peak: 0.1 x 1024 / 256, then cosine */
  assert_ok(fl_lr_schedule_at(&s, 6, &lr));
  assert_near(lr, 0.2);
  assert_ok(fl_lr_schedule_at(&s, 10, &lr));
  assert_near(lr, 0);
  s.decay = "step"; /* default milestones: 5 and 7.5 */
  assert_ok(fl_lr_schedule_at(&s, 4.9, &lr));
  assert_near(lr, 0.4);
  assert_ok(fl_lr_schedule_at(&s, 5, &lr));
  assert_near(lr, 0.04);
  assert_ok(fl_lr_schedule_at(&s, 8, &lr));
  assert_near(lr, 0.004);
  s.milestones[0] = 3;
  s.num_milestones = 1;
  assert_ok(fl_lr_schedule_at(&s, 8, &lr));
  assert_near(lr, 0.04);
  s.decay = "poly";
  assert_fails_with(fl_lr_schedule_at(&s, 8, &lr), FL_EINVAL, "milestones are for the \"step\" decay");
  s.num_milestones = 0;
  assert_ok(fl_lr_schedule_at(&s, 6, &lr));
  assert_near(lr, 0.4 * 0.25); /* (1 - 0.5)^2 */
  s.decay = "none";
  s.batch = 0;
  assert_ok(fl_lr_schedule_at(&s, 9, &lr));
  assert_near(lr, 0.1);
  s.decay = "linear";
  assert_fails_with(fl_lr_schedule_at(&s, 1, &lr), FL_EINVAL, "unknown decay 'linear'");
  s.decay = NULL;
  s.epochs = 0;
  assert_fails_with(fl_lr_schedule_at(&s, 1, &lr), FL_EINVAL, "0 epochs");
  s.epochs = 10;
  s.lr = -1;
  assert_fails_with(fl_lr_schedule_at(&s, 1, &lr), FL_EINVAL, "learning rate -1");
  assert_fails_with(fl_lr_schedule_at(NULL, 1, &lr), FL_EINVAL, "NULL");
}

static void test_schedule_validation(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 256, .epochs = 10};
  assert_ok(optim_schedule_validate(&s));
  s.base_lr = 0;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "base learning rate");
  s.base_lr = 0.1;
  s.global_batch = 0;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "global batch");
  s.global_batch = 256;
  s.warmup_epochs = 10;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "warmup");
  s.warmup_epochs = 1;
  s.decay = OPTIM_DECAY_STEP;
  s.num_milestones = 2;
  s.milestones[0] = 5;
  s.milestones[1] = 3;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "milestone 3");
  optim_decay d;
  assert_ok(optim_decay_parse("cosine", &d));
  assert_int_equal(d, OPTIM_DECAY_COSINE);
  assert_fails_with(optim_decay_parse("linear", &d), FL_EINVAL, "'linear'");
  assert_ok(optim_decay_parse("poly", &d));
  assert_int_equal(d, OPTIM_DECAY_POLY);
  assert_string_equal(optim_decay_name(OPTIM_DECAY_STEP), "step");
}

/* ---- checkpoints --------------------------------------------------------------------- */

typedef struct ckpt_fixture {
  fl_device *dev;
  fl_tensor *values, *buffers;
  optim *opt;
  fl_buf blob;
} ckpt_fixture;

static const float ck_values[5] = {0.5f, -1.25f, 3, 7.5f, -0.125f};
static const float ck_buffers[2] = {0.25f, 4};

static void ckpt_make(ckpt_fixture *f) {
  f->dev = open_cpu();
  f->values = tensor_of(f->dev, ck_values, 5);
  f->buffers = tensor_of(f->dev, ck_buffers, 2);
  f->opt = sgd_of(f->dev, 5, 0.9f, false, 1e-4f);
  float vel[5] = {1, 2, 3, 4, 5};
  assert_ok(f->dev->ops->from_host(f->dev, optim_state(f->opt), vel, sizeof vel));
  optim_set_steps(f->opt, 1234);
  checkpoint_state st = {.epoch = 3, .step = 1234, .position = 3.0, .lr = 0.4, .loss_scale = 2048.0f,
                         .loss_scale_good = 17};
  f->blob = (fl_buf)FL_BUF_INIT;
  assert_ok(checkpoint_encode(f->values, f->buffers, f->opt, &st, &f->blob));
  assert_int_equal(f->blob.len, 88 + 4 * (5 + 2 + 5) + 4);
  assert_memory_equal(f->blob.data, CHECKPOINT_MAGIC, 8);
}

static void ckpt_free(ckpt_fixture *f) {
  fl_buf_free(&f->blob);
  optim_destroy(f->opt);
  fl_tensor_destroy(f->values);
  fl_tensor_destroy(f->buffers);
  fl_device_close(f->dev);
}

static void test_checkpoint_round_trip(void **state) {
  (void)state;
  ckpt_fixture f;
  ckpt_make(&f);
  /* Into a second "model" of the same shape. */
  float zeros[5] = {0};
  fl_tensor *v2 = tensor_of(f.dev, zeros, 5), *b2 = tensor_of(f.dev, zeros, 2);
  optim *opt2 = sgd_of(f.dev, 5, 0.9f, false, 1e-4f);
  checkpoint_state st = {0};
  assert_ok(checkpoint_decode(fl_buf_bytes(&f.blob), v2, b2, opt2, &st));
  expect_values(v2, ck_values, 5, 0);
  expect_values(b2, ck_buffers, 2, 0);
  float vel[5];
  assert_ok(f.dev->ops->to_host(f.dev, vel, optim_state(opt2), sizeof vel));
  assert_int_equal(optim_steps(opt2), 1234);
  for (int i = 0; i < 5; i++) assert_true(vel[i] == (float)(i + 1));
  assert_int_equal(st.epoch, 3);
  assert_int_equal(st.step, 1234);
  assert_true(st.position == 3.0 && st.lr == 0.4);
  assert_true(st.loss_scale == 2048.0f);
  assert_int_equal(st.loss_scale_good, 17);
  /* Without an optimizer (evaluation) the velocity is skipped. */
  assert_ok(checkpoint_decode(fl_buf_bytes(&f.blob), v2, b2, NULL, &st));
  /* And through a file. */
  char dir[256], path[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/run.ckpt", dir);
  assert_ok(checkpoint_save_file(path, fl_buf_bytes(&f.blob)));
  fl_buf back = FL_BUF_INIT;
  assert_ok(checkpoint_load_file(path, &back));
  assert_int_equal(back.len, f.blob.len);
  assert_memory_equal(back.data, f.blob.data, back.len);
  fl_buf_free(&back);
  snprintf(path, sizeof path, "%s/missing.ckpt", dir);
  assert_fails_with(checkpoint_load_file(path, &back), FL_ENOENT, "missing.ckpt");
  snprintf(path, sizeof path, "%s/no/such/dir/x.ckpt", dir);
  assert_fails_with(checkpoint_save_file(path, fl_buf_bytes(&f.blob)), FL_EIO, "x.ckpt");
  test_rmtree(dir);
  optim_destroy(opt2);
  fl_tensor_destroy(v2);
  fl_tensor_destroy(b2);
  ckpt_free(&f);
}

/* Decodes a damaged copy; the model must be left as it was. */
static void expect_bad_blob(ckpt_fixture *f, const uint8_t *data, size_t len, fl_status code, const char *needle) {
  float sentinel[5] = {9, 9, 9, 9, 9};
  assert_ok(fl_tensor_write(f->values, sentinel, 5));
  checkpoint_state st = {.epoch = 77};
  assert_fails_with(checkpoint_decode(fl_bytes_of(data, len), f->values, f->buffers, f->opt, &st), code, needle);
  expect_values(f->values, sentinel, 5, 0);
  assert_int_equal(st.epoch, 77);
}

static void test_checkpoint_corrupt_blobs(void **state) {
  (void)state;
  ckpt_fixture f;
  ckpt_make(&f);
  size_t n = f.blob.len;
  uint8_t *copy = malloc(n + 8);
  assert_non_null(copy);
  /* wrong magic */
  memcpy(copy, f.blob.data, n);
  copy[0] = 'X';
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "not a flint checkpoint");
  expect_bad_blob(&f, copy, 0, FL_EFORMAT, "not a flint checkpoint");
  /* truncated: inside the header, and by one byte */
  memcpy(copy, f.blob.data, n);
  expect_bad_blob(&f, copy, 40, FL_EFORMAT, "truncated");
  expect_bad_blob(&f, copy, n - 1, FL_EFORMAT, "truncated");
  /* trailing bytes */
  memcpy(copy + n, "abcd", 4);
  expect_bad_blob(&f, copy, n + 4, FL_EFORMAT, "trailing");
  /* an unknown version, and a version 1 header size in a version 2 blob */
  copy[8] = 9;
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "version 9");
  copy[8] = 2;
  copy[12] = 72;
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "header of 72 bytes, expected 88");
  copy[12] = 88;
  /* a count that would overflow */
  memset(copy + 16, 0xff, 8);
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "truncated");
  memcpy(copy, f.blob.data, n);
  /* checksum: a flipped bit in the payload, and in the header's step */
  copy[80] ^= 0x10;
  expect_bad_blob(&f, copy, n, FL_ECORRUPT, "checksum");
  copy[80] ^= 0x10;
  copy[48] ^= 1;
  expect_bad_blob(&f, copy, n, FL_ECORRUPT, "checksum");
  /* a loss scale that is not a number >= 0, under a valid checksum */
  memcpy(copy, f.blob.data, n);
  float nan = NAN;
  memcpy(copy + 80, &nan, 4);
  uint32_t nan_crc = (uint32_t)crc32(0L, copy, (uInt)(n - 4));
  memcpy(copy + n - 4, &nan_crc, 4);
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "a loss scale of nan");
  /* a model of another shape */
  float zeros[6] = {0};
  fl_tensor *six = tensor_of(f.dev, zeros, 6);
  checkpoint_state st;
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), six, f.buffers, f.opt, &st), FL_EINVAL,
                    "weights of 5 floats does not match this model's 6");
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), f.values, NULL, f.opt, &st), FL_EINVAL,
                    "batch-norm buffers of 2");
  optim *opt6 = sgd_of(f.dev, 6, 0.9f, false, 1e-4f);
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), f.values, f.buffers, opt6, &st), FL_EINVAL,
                    "optimizer state of 5 floats does not match this model's 6");
  optim_destroy(opt6);
  /* state of another optimizer */
  optim_options ao = OPTIM_OPTIONS_INIT;
  ao.kind = OPTIM_ADAM;
  optim *adam = NULL;
  assert_ok(optim_create(f.dev, &ao, 5, NULL, 0, &adam));
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), f.values, f.buffers, adam, &st), FL_EINVAL,
                    "it holds sgd's optimizer state, but this run's optimizer is adam");
  optim_destroy(adam);
  /* an unknown optimizer kind, checksum made right */
  memcpy(copy, f.blob.data, n);
  copy[44] = 9;
  uint32_t crc = (uint32_t)crc32(0L, copy, (uInt)(n - 4));
  memcpy(copy + n - 4, &crc, 4);
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "unknown optimizer 9");
  fl_tensor_destroy(six);
  free(copy);
  ckpt_free(&f);
}

/* Every optimizer's state survives a round trip: two steps, a checkpoint, a fresh optimizer
 * restored from it, then one more step on both gives the same weights bit for bit (Adam's
 * bias correction needs the step count, LARS's momentum its velocity). */
static void test_checkpoint_every_optimizer(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  for (int k = OPTIM_SGD; k <= OPTIM_LAMB; k++) {
    optim_options o = OPTIM_OPTIONS_INIT;
    o.kind = (optim_kind)k;
    o.weight_decay = 0.01f;
    float w[REF_N], gf[REF_N];
    for (int i = 0; i < REF_N; i++) w[i] = (float)(0.3 + 0.1 * i);
    fl_tensor *v1 = tensor_of(dev, w, REF_N), *v2 = tensor_of(dev, w, REF_N), *grads = tensor_of(dev, w, REF_N);
    optim *a = NULL, *b = NULL;
    assert_ok(optim_create(dev, &o, REF_N, ref_params, 4, &a));
    assert_ok(optim_create(dev, &o, REF_N, ref_params, 4, &b));
    for (int t = 1; t <= 2; t++) {
      double g[REF_N];
      ref_grad(t, g);
      for (int i = 0; i < REF_N; i++) gf[i] = (float)g[i];
      assert_ok(fl_tensor_write(grads, gf, REF_N));
      assert_ok(optim_step(a, 0.01f, grads, v1));
    }
    fl_buf blob = FL_BUF_INIT;
    checkpoint_state cs = {.epoch = 1, .step = 2, .position = 1, .lr = 0.01};
    assert_ok(checkpoint_encode(v1, NULL, a, &cs, &blob));
    size_t slots = optim_state_slots(o.kind);
    assert_int_equal(blob.len, 88 + 4 * REF_N * (1 + slots) + 4);
    checkpoint_state back;
    assert_ok(checkpoint_decode(fl_buf_bytes(&blob), v2, NULL, b, &back));
    assert_int_equal(optim_steps(b), 2);
    float sa[2 * REF_N], sb[2 * REF_N];
    assert_ok(dev->ops->to_host(dev, sa, optim_state(a), slots * REF_N * sizeof(float)));
    assert_ok(dev->ops->to_host(dev, sb, optim_state(b), slots * REF_N * sizeof(float)));
    assert_memory_equal(sa, sb, slots * REF_N * sizeof(float));
    bool nonzero = false;
    for (size_t i = 0; i < slots * REF_N; i++) nonzero |= sa[i] != 0;
    assert_true(nonzero);
    double g[REF_N];
    ref_grad(3, g);
    for (int i = 0; i < REF_N; i++) gf[i] = (float)g[i];
    assert_ok(fl_tensor_write(grads, gf, REF_N));
    assert_ok(optim_step(a, 0.01f, grads, v1));
    assert_ok(optim_step(b, 0.01f, grads, v2));
    float wa[REF_N], wb[REF_N];
    assert_ok(fl_tensor_read(v1, wa, REF_N));
    assert_ok(fl_tensor_read(v2, wb, REF_N));
    assert_memory_equal(wa, wb, sizeof wa);
    fl_buf_free(&blob);
    optim_destroy(a);
    optim_destroy(b);
    fl_tensor_destroy(v1);
    fl_tensor_destroy(v2);
    fl_tensor_destroy(grads);
  }
  fl_device_close(dev);
}

/* A version 1 blob (72-byte header, SGD's velocity), as the last release wrote it, is read into
 * an SGD optimizer, and refused, naming both, by any other. */
static void test_checkpoint_reads_version_1(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  uint8_t blob[72 + 4 * (3 + 3) + 4] = {0};
  memcpy(blob, CHECKPOINT_MAGIC, 8);
  uint32_t u32[2] = {1, 72};
  uint64_t counts[3] = {3, 0, 3}, step = 77;
  uint32_t epoch = 2;
  double position = 2, lr = 0.25;
  memcpy(blob + 8, u32, 8);
  memcpy(blob + 16, counts, 24);
  memcpy(blob + 40, &epoch, 4);
  memcpy(blob + 48, &step, 8);
  memcpy(blob + 56, &position, 8);
  memcpy(blob + 64, &lr, 8);
  float data[6] = {1, 2, 3, 0.5f, 0.25f, 0.125f};
  memcpy(blob + 72, data, sizeof data);
  uint32_t crc = (uint32_t)crc32(0L, blob, (uInt)(sizeof blob - 4));
  memcpy(blob + sizeof blob - 4, &crc, 4);
  float zeros[3] = {0};
  fl_tensor *values = tensor_of(dev, zeros, 3);
  optim *sgd = sgd_of(dev, 3, 0.9f, false, 0);
  checkpoint_state st = {0};
  assert_ok(checkpoint_decode(fl_bytes_of(blob, sizeof blob), values, NULL, sgd, &st));
  expect_values(values, data, 3, 0);
  float vel[3];
  assert_ok(dev->ops->to_host(dev, vel, optim_state(sgd), sizeof vel));
  assert_memory_equal(vel, data + 3, sizeof vel);
  assert_int_equal(st.epoch, 2);
  assert_int_equal(st.step, 77);
  assert_int_equal(optim_steps(sgd), 77);
  assert_true(st.lr == 0.25);
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_LARS;
  optim *lars = NULL;
  assert_ok(optim_create(dev, &o, 3, NULL, 0, &lars));
  assert_fails_with(checkpoint_decode(fl_bytes_of(blob, sizeof blob), values, NULL, lars, &st), FL_EINVAL,
                    "sgd's optimizer state (a version 1 file), but this run's optimizer is lars");
  optim_destroy(lars);
  optim_destroy(sgd);
  fl_tensor_destroy(values);
  fl_device_close(dev);
}

/* ---- curves -------------------------------------------------------------------------- */

static size_t count_of(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static void test_curves_csv_svg_progress(void **state) {
  (void)state;
  curves c = CURVES_INIT;
  curves_row r1 = {1, 0.9, 0.7, 0.8, 0.75, 0.1, 1234.5, 2.5, 1.5, 0, 0, 0};
  curves_row r2 = {2, 0.5, 0.85, NAN, NAN, 0.05, 2000, 2.25, 3, 0, 0, 0};
  assert_ok(curves_append(&c, &r1));
  assert_ok(curves_append(&c, &r2));
  fl_buf b = FL_BUF_INIT;
  assert_ok(curves_csv(&c, &b));
  assert_ok(fl_buf_append(&b, "", 1));
  assert_string_equal((char *)b.data, CURVES_CSV_HEADER "\n"
                                      "1,0.9,0.7,0.8,0.75,0.1,1234.5,2.5,2.5,1.5\n"
                                      "2,0.5,0.85,,,0.05,2000,2.25,4.75,3\n");
  assert_ok(curves_svg(&c, "mlp <fashion-mnist> & more", &b));
  assert_ok(fl_buf_append(&b, "", 1));
  const char *svg = (const char *)b.data;
  assert_true(strncmp(svg, "<svg ", 5) == 0);
  assert_non_null(strstr(svg, "</svg>\n"));
  assert_int_equal(count_of(svg, "<polyline"), 4);
  assert_int_equal(count_of(svg, "<g "), count_of(svg, "</g>"));
  assert_int_equal(count_of(svg, "<text"), count_of(svg, "</text>"));
  assert_non_null(strstr(svg, "mlp &lt;fashion-mnist&gt; &amp; more"));
  assert_non_null(strstr(svg, ">epoch</text>"));
  assert_non_null(strstr(svg, ">accuracy</text>"));
  /* The test series has one point (epoch 2's is NaN). */
  const char *test_acc = strstr(svg, "class=\"test accuracy\"");
  assert_non_null(test_acc);
  const char *pts = strstr(test_acc, "points=\"");
  assert_non_null(pts);
  assert_true(strchr(pts + 8, '"') - (pts + 8) < 16 && !memchr(pts + 8, ' ', (size_t)(strchr(pts + 8, '"') - (pts + 8))));

  char dir[256], csv[300], svgp[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svgp, sizeof svgp, "%s/c.svg", dir);
  assert_ok(curves_write_csv(&c, csv));
  assert_ok(curves_write_svg(&c, NULL, svgp));
  fl_buf file = FL_BUF_INIT;
  assert_ok(checkpoint_load_file(csv, &file));
  assert_true(file.len > strlen(CURVES_CSV_HEADER));
  fl_buf_free(&file);
  snprintf(csv, sizeof csv, "%s/nope/c.csv", dir);
  assert_fails_with(curves_write_csv(&c, csv), FL_EIO, "nope/c.csv");
  test_rmtree(dir);

  char line[160];
  curves_progress_format(line, sizeof line, 3, 10, 0.52, 0.512, 0.83, 1234);
  assert_string_equal(line, "epoch 3/10 [##########..........]  52% loss 0.512 acc 0.830 1234 img/s");
  curves_progress_format(line, sizeof line, 10, 10, 1.5, 0.1, 0.9, 0);
  assert_non_null(strstr(line, "[####################] 100%"));
  fl_buf_free(&b);
  curves_free(&c);
  assert_int_equal(c.count, 0);
}

/* Runs' curves read back by their columns' names and drawn together (flint train compare). */
static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_curves_compare_runs(void **state) {
  (void)state;
  char dir[256], a[300], b[300], bad[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(a, sizeof a, "%s/bsp.csv", dir);
  snprintf(b, sizeof b, "%s/local.csv", dir);
  snprintf(bad, sizeof bad, "%s/bad.csv", dir);
  write_text(a, CURVES_CSV_HEADER "\n1,0.9,0.7,0.8,0.75,0.1,1234.5,2.5,2.5,1.5\n2,0.5,0.85,,,0.05,2000,2.25,4.75,3\n");
  write_text(b, "epoch,loss,elapsed_s,sent_mb\n1,1.5,1,0.25\n2,,2,0.5\n3,0.7,3,0.75\n");
  curves_run runs[2];
  assert_ok(curves_run_read(a, NULL, &runs[0]));
  assert_ok(curves_run_read(b, "local <8>", &runs[1]));
  assert_string_equal(runs[0].label, "bsp.csv");
  assert_int_equal(runs[0].n, 2);
  assert_true(runs[0].elapsed[1] == 4.75 && runs[0].mb[1] == 3 && runs[0].loss[1] == 0.5);
  assert_int_equal(runs[1].n, 3);
  assert_true(isnan(runs[1].loss[1]));
  fl_buf svg = FL_BUF_INIT;
  assert_ok(curves_compare_svg(runs, 2, NULL, &svg));
  assert_ok(fl_buf_append(&svg, "", 1));
  const char *t = (const char *)svg.data;
  assert_int_equal(count_of(t, "<polyline"), 4); /* a series per run in each panel */
  assert_int_equal(count_of(t, "<text"), count_of(t, "</text>"));
  assert_non_null(strstr(t, "local &lt;8&gt;"));
  assert_non_null(strstr(t, ">MiB sent per worker</text>"));
  assert_non_null(strstr(t, ">seconds</text>"));
  assert_fails_with(curves_compare_svg(runs, 0, NULL, &svg), FL_EINVAL, "runs");
  fl_buf_free(&svg);
  curves_run_free(&runs[0]);
  curves_run_free(&runs[1]);
  /* Bad files name the file and the line. */
  curves_run r;
  write_text(bad, "epoch,train_loss,elapsed_s\n1,2,3\n");
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_EFORMAT, "bad.csv:1");
  write_text(bad, "epoch,train_loss,elapsed_s,reduced_mb\n1,2,3,4\n2,x,3,4\n");
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_EFORMAT, "bad.csv:3");
  write_text(bad, "epoch,train_loss,elapsed_s,reduced_mb\n1,2,3\n");
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_EFORMAT, "bad.csv:2");
  write_text(bad, "epoch,train_loss,elapsed_s,reduced_mb\n");
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_EFORMAT, "no rows");
  write_text(bad, "");
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_EFORMAT, "empty");
  snprintf(bad, sizeof bad, "%s/missing.csv", dir);
  assert_fails_with(curves_run_read(bad, NULL, &r), FL_ENOENT, "missing.csv");
  test_rmtree(dir);
}

/* ---- data ------------------------------------------------------------------------------ */

static char data_dir[256];

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* n images of 2 x 3 pixels (pixel k of image i = 10 i + k) and n_labels labels (i % 4). */
static void write_idx(const char *name, uint32_t n, uint32_t n_labels, uint32_t magic, bool gz, char *images,
                      char *labels) {
  uint8_t buf[16 + 64 * 6];
  put_be32(buf, magic);
  put_be32(buf + 4, n);
  put_be32(buf + 8, 2);
  put_be32(buf + 12, 3);
  for (uint32_t i = 0; i < n; i++)
    for (int k = 0; k < 6; k++) buf[16 + i * 6 + k] = (uint8_t)(10 * i + k);
  uint8_t lab[8 + 64];
  put_be32(lab, 0x801);
  put_be32(lab + 4, n_labels);
  for (uint32_t i = 0; i < n_labels; i++) lab[8 + i] = (uint8_t)(i % 4);
  snprintf(images, 300, "%s/%s-images%s", data_dir, name, gz ? ".gz" : "");
  snprintf(labels, 300, "%s/%s-labels%s", data_dir, name, gz ? ".gz" : "");
  if (!gz) {
    test_write_file(images, buf, 16 + n * 6);
    test_write_file(labels, lab, 8 + n_labels);
    return;
  }
  gzFile f = gzopen(images, "wb");
  assert_non_null(f);
  assert_int_equal(gzwrite(f, buf, 16 + n * 6), (int)(16 + n * 6));
  assert_int_equal(gzclose(f), Z_OK);
  f = gzopen(labels, "wb");
  assert_non_null(f);
  assert_int_equal(gzwrite(f, lab, 8 + n_labels), (int)(8 + n_labels));
  assert_int_equal(gzclose(f), Z_OK);
}

static int data_setup(void **state) {
  test_tmpdir(data_dir, sizeof data_dir);
  fl_context *ctx = NULL;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) return -1;
  *state = ctx;
  return 0;
}

static int data_teardown(void **state) {
  fl_context_close(*state);
  test_rmtree(data_dir);
  return 0;
}

/* Collects a dataset of blocks into a reader (in partition order). */
static data_reader *read_all(fl_dataset *ds, uint32_t batch, data_reader *test) {
  fl_records *recs = NULL;
  assert_ok(fl_collect(ds, &recs));
  data_reader *r = NULL;
  assert_ok(data_reader_create(batch, &r));
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    data_block b;
    assert_ok(data_block_view(fl_records_get(recs, i), &b));
    assert_ok(data_reader_add_block(b.split == DATA_SPLIT_TEST && test ? test : r, fl_records_get(recs, i)));
  }
  fl_records_free(recs);
  return r;
}

static void check_idx(fl_context *ctx, bool gz) {
  char images[300], labels[300];
  write_idx(gz ? "gz" : "plain", 5, 5, 0x803, gz, images, labels);
  data_options o = {.partitions = 2, .block_images = 2};
  data_set d = {0};
  assert_ok(data_load_idx(ctx, images, labels, 4, &o, &d));
  assert_int_equal(d.images, 5);
  assert_int_equal(d.channels, 1);
  assert_int_equal(d.height, 2);
  assert_int_equal(d.width, 3);
  assert_int_equal(d.partitions, 2);
  assert_int_equal(fl_dataset_partitions(d.blocks), 2);
  uint64_t blocks = 0;
  assert_ok(fl_count(d.blocks, &blocks));
  assert_int_equal(blocks, 3); /* images 0-1 | 2-3, 4 */
  data_reader *r = read_all(d.blocks, 5, NULL);
  assert_int_equal(data_reader_images(r), 5);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  float x[5 * 6];
  int32_t y[5];
  assert_int_equal(data_reader_next(r, x, y), 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(y[i], i % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * i + k) / 255) < 1e-7f);
  }
  data_reader_destroy(r);
  data_set_free(&d);
  /* Interleaved over 2 partitions, the first 4 images: partition 0 holds 0, 2 and partition
   * 1 holds 1, 3 (blocks of stride 2). */
  data_options oi = {.partitions = 2, .block_images = 2, .interleave = true, .max_images = 4};
  assert_ok(data_load_idx(ctx, images, labels, 4, &oi, &d));
  assert_int_equal(d.images, 4);
  r = read_all(d.blocks, 4, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 4);
  static const int order[4] = {0, 2, 1, 3};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(y[i], order[i] % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * order[i] + k) / 255) < 1e-7f);
  }
  fl_records *recs = NULL;
  assert_ok(fl_collect(d.blocks, &recs));
  data_block blk;
  assert_ok(data_block_view(fl_records_get(recs, 1), &blk));
  assert_int_equal(blk.first, 1);
  assert_int_equal(blk.stride, 2);
  fl_records_free(recs);
  data_reader_destroy(r);
  data_set_free(&d);
  /* Runs of 2 over 2 partitions, all 5 images: partition 0 holds runs 0 and 2 (images 0, 1,
   * 4), partition 1 run 1 (images 2, 3); no block crosses a run. */
  data_options orun = {.partitions = 2, .block_images = 4, .interleave = true, .run = 2};
  assert_ok(data_load_idx(ctx, images, labels, 4, &orun, &d));
  assert_int_equal(d.images, 5);
  r = read_all(d.blocks, 5, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 5);
  static const int runs[5] = {0, 1, 4, 2, 3};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(y[i], runs[i] % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * runs[i] + k) / 255) < 1e-7f);
  }
  assert_ok(fl_collect(d.blocks, &recs));
  assert_int_equal(fl_records_count(recs), 3); /* 0-1 | 4 | 2-3 */
  assert_ok(data_block_view(fl_records_get(recs, 1), &blk));
  assert_int_equal(blk.first, 4);
  assert_int_equal(blk.count, 1);
  fl_records_free(recs);
  data_reader_destroy(r);
  data_set_free(&d);
  /* Standardized pixels. */
  o.norm = DATA_NORM_STANDARD;
  assert_ok(data_load_idx(ctx, images, labels, 4, &o, &d));
  r = read_all(d.blocks, 1, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 1);
  assert_true(fabsf(x[1] - (float)((1 / 255.0 - DATA_FASHION_MNIST_MEAN) / DATA_FASHION_MNIST_STD)) < 1e-5f);
  data_reader_destroy(r);
  data_set_free(&d);
}

static void test_data_idx_plain_and_gz(void **state) {
  check_idx(*state, false);
  check_idx(*state, true);
}

static void test_data_idx_bad_input(void **state) {
  fl_context *ctx = *state;
  char images[300], labels[300], other[300], other_labels[300];
  data_set d = {0};
  /* count mismatch between images and labels */
  write_idx("mismatch", 5, 4, 0x803, false, images, labels);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "has 5 images but");
  assert_non_null(strstr(fl_last_error(), "mismatch-labels"));
  /* bad magic (a labels file given as the images) */
  write_idx("magic", 5, 5, 0x801, false, images, labels);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "bad magic");
  assert_non_null(strstr(fl_last_error(), "magic-images"));
  /* the labels file given for images, the other way round */
  write_idx("good", 5, 5, 0x803, false, images, labels);
  assert_fails_with(data_load_idx(ctx, labels, images, 4, NULL, &d), FL_EFORMAT, "bad magic");
  /* labels out of range for 3 classes (label 3) */
  assert_fails_with(data_load_idx(ctx, images, labels, 3, NULL, &d), FL_EFORMAT, "label 4 is 3");
  /* missing file, named */
  snprintf(other, sizeof other, "%s/no-such-images", data_dir);
  assert_fails_with(data_load_idx(ctx, other, labels, 4, NULL, &d), FL_ENOENT, "no-such-images");
  snprintf(other_labels, sizeof other_labels, "%s/no-such-labels", data_dir);
  assert_fails_with(data_load_idx(ctx, images, other_labels, 4, NULL, &d), FL_ENOENT, "no-such-labels");
  /* a truncated images file (plain: checked by size) */
  FILE *f = fopen(images, "r+b");
  assert_non_null(f);
  assert_int_equal(ftruncate(fileno(f), 16 + 4 * 6 + 3), 0);
  fclose(f);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "truncated");
  /* Fashion-MNIST from a folder without it */
  assert_fails_with(data_fashion_mnist(ctx, data_dir, true, NULL, &d), FL_ENOENT, "train-images-idx3-ubyte.gz");
  assert_null(d.blocks);
}

static void test_data_fashion_mnist_if_installed(void **state) {
  fl_context *ctx = *state;
  struct stat st;
  if (stat(DATA_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", &st) != 0) skip();
  data_options o = {.partitions = 3};
  data_set d = {0};
  assert_ok(data_fashion_mnist(ctx, NULL, false, &o, &d));
  assert_int_equal(d.images, 10000);
  assert_int_equal(d.height, 28);
  assert_int_equal(d.classes, 10);
  data_reader *r = read_all(d.blocks, 100, NULL);
  assert_int_equal(data_reader_images(r), 10000);
  assert_int_equal(data_reader_batches(r, false), 100);
  data_reader_destroy(r);
  data_set_free(&d);
}

static void test_reader_shuffle_and_batches(void **state) {
  (void)state;
  data_reader *r = NULL;
  assert_fails_with(data_reader_create(0, &r), FL_EINVAL, "batch 0");
  assert_ok(data_reader_create(4, &r));
  /* 10 images of 1x1x1 whose pixel is their index, in blocks of 3, 3, 4. */
  fl_buf rec = FL_BUF_INIT;
  for (int blk = 0, at = 0; blk < 3; blk++) {
    int n = blk < 2 ? 3 : 4;
    float px[4];
    int32_t lab[4];
    for (int i = 0; i < n; i++) {
      px[i] = (float)(at + i);
      lab[i] = (at + i) % 2;
    }
    assert_ok(data_block_encode((uint32_t)n, 1, 1, 1, 2, DATA_SPLIT_TRAIN, (uint64_t)at, 1, lab, px, &rec));
    assert_ok(data_reader_add_block(r, fl_buf_bytes(&rec)));
    at += n;
  }
  /* A block of another shape is refused. */
  float big[4] = {0};
  int32_t l0 = 0;
  assert_ok(data_block_encode(1, 1, 2, 2, 2, DATA_SPLIT_TRAIN, 0, 1, &l0, big, &rec));
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "after blocks");
  /* And a corrupt one. */
  assert_ok(data_block_encode(1, 1, 1, 1, 2, DATA_SPLIT_TRAIN, 0, 1, &l0, big, &rec));
  rec.data[0] ^= 1;
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "not an image block");
  int32_t l5 = 5;
  assert_ok(data_block_encode(1, 1, 1, 1, 2, DATA_SPLIT_TRAIN, 0, 1, &l5, big, &rec));
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "label 5");
  fl_buf_free(&rec);
  assert_int_equal(data_reader_images(r), 10);
  assert_int_equal(data_reader_batches(r, false), 2);
  assert_int_equal(data_reader_batches(r, true), 3);

  float x[4];
  int32_t y[4];
  int order1[8], order2[8], order3[8];
  for (int pass = 0; pass < 3; pass++) {
    int *order = pass == 0 ? order1 : pass == 1 ? order2 : order3;
    data_reader_start_epoch(r, 42, pass == 2 ? 1 : 0, true, 0, false);
    int k = 0;
    uint32_t n;
    while ((n = data_reader_next(r, x, y)) > 0) {
      assert_int_equal(n, 4); /* the short last batch is dropped */
      for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(y[i], (int)x[i] % 2); /* labels travel with their images */
        order[k++] = (int)x[i];
      }
    }
    assert_int_equal(k, 8);
  }
  assert_memory_equal(order1, order2, sizeof order1); /* same seed and epoch: same order */
  assert_memory_not_equal(order1, order3, sizeof order1); /* another epoch: another order */
  /* No shuffle, partial batches: the stored order, 4 + 4 + 2. */
  data_reader_start_epoch(r, 42, 0, false, 0, true);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_true(x[0] == 0 && x[3] == 3);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_int_equal(data_reader_next(r, x, y), 2);
  assert_true(x[1] == 9);
  assert_int_equal(data_reader_next(r, x, y), 0);
  /* A cap on the batches (the ranks' common step count). */
  data_reader_start_epoch(r, 42, 0, true, 1, false);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_int_equal(data_reader_next(r, x, y), 0);
  data_reader_destroy(r);
}

static void test_synthetic_imagenet_is_deterministic(void **state) {
  fl_context *ctx = *state;
  size_t per = 3 * 224 * 224;
  float *a = malloc(per * sizeof *a), *b = malloc(per * sizeof *b);
  assert_non_null(a);
  assert_non_null(b);
  int32_t la, lb;
  data_synthetic_image(7, 3, a, &la);
  data_synthetic_image(7, 3, b, &lb);
  assert_int_equal(la, lb);
  assert_true(la >= 0 && la < 1000);
  assert_memory_equal(a, b, per * sizeof *a);
  data_synthetic_image(8, 3, b, &lb);
  assert_memory_not_equal(a, b, per * sizeof *a);
  /* Centred values of a small spread. */
  double sum = 0;
  for (size_t i = 0; i < per; i++) {
    assert_true(fabsf(a[i]) < 1.6f);
    sum += a[i];
  }
  assert_true(fabs(sum / (double)per) < 0.6);

  /* As datasets: 1 and 3 partitions give the same images, and they are the generator's. */
  data_options o1 = {.partitions = 1, .block_images = 2}, o3 = {.partitions = 3, .block_images = 2};
  data_set d1 = {0}, d3 = {0};
  assert_ok(data_synthetic_imagenet(ctx, 7, 100, 5, &o1, &d1));
  assert_ok(data_synthetic_imagenet(ctx, 7, 100, 5, &o3, &d3));
  assert_int_equal(d3.partitions, 3);
  data_reader *r1 = read_all(d1.blocks, 5, NULL), *r3 = read_all(d3.blocks, 5, NULL);
  float *x1 = malloc(5 * per * sizeof *x1), *x3 = malloc(5 * per * sizeof *x3);
  int32_t y1[5], y3[5];
  data_reader_start_epoch(r1, 0, 0, false, 0, false);
  data_reader_start_epoch(r3, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r1, x1, y1), 5);
  assert_int_equal(data_reader_next(r3, x3, y3), 5);
  assert_memory_equal(x1, x3, 5 * per * sizeof *x1);
  assert_memory_equal(y1, y3, sizeof y1);
  data_synthetic_image(7, 102, a, &la);
  assert_int_equal(y1[2], la);
  assert_memory_equal(x1 + 2 * per, a, per * sizeof *a);
  /* A pair: training and test shares in each partition, told apart by split. */
  data_set tr = {0}, te = {0};
  data_options o2 = {.partitions = 2, .block_images = 4};
  assert_ok(data_synthetic_imagenet(ctx, 7, 0, 6, &o2, &tr));
  assert_ok(data_synthetic_imagenet(ctx, 7, 6, 2, &o2, &te));
  fl_dataset *pair = NULL;
  assert_fails_with(data_pair(ctx, &tr, &d3, &pair), FL_EINVAL, "2 training partitions but 3");
  assert_ok(data_pair(ctx, &tr, &te, &pair));
  assert_int_equal(fl_dataset_partitions(pair), 2);
  data_reader *test_r = NULL;
  assert_ok(data_reader_create(1, &test_r));
  data_reader *train_r = read_all(pair, 3, test_r);
  assert_int_equal(data_reader_images(train_r), 6);
  assert_int_equal(data_reader_images(test_r), 2);
  data_reader_start_epoch(test_r, 0, 0, false, 0, true);
  assert_int_equal(data_reader_next(test_r, x1, y1), 1);
  data_synthetic_image(7, 6, a, &la);
  assert_memory_equal(x1, a, per * sizeof *a);
  data_reader_destroy(test_r);
  data_reader_destroy(train_r);
  fl_dataset_free(pair);
  data_set_free(&tr);
  data_set_free(&te);
  data_reader_destroy(r1);
  data_reader_destroy(r3);
  data_set_free(&d1);
  data_set_free(&d3);
  free(x1);
  free(x3);
  free(a);
  free(b);
}


/* The pieces together on a real model: the reader's batches, the loss, one optimizer step per
 * step (the loss falls by half), then a checkpoint restores the weights into a model of
 * another seed, which then gives the same logits. */
static void model_steps_and_checkpoint(optim_options o, float lr) {
  fl_device *dev = open_cpu();
  data_reader *r = NULL;
  assert_ok(data_reader_create(8, &r));
  /* 32 images of 1x4x4 whose class (0..3) sets which quarter is bright. */
  float px[32 * 16];
  int32_t lab[32];
  for (int i = 0; i < 32; i++) {
    lab[i] = i % 4;
    for (int k = 0; k < 16; k++) px[i * 16 + k] = (k / 4 == lab[i] ? 1.0f : 0.0f) + 0.01f * (float)((i * 7 + k) % 5);
  }
  fl_buf rec = FL_BUF_INIT;
  assert_ok(data_block_encode(32, 1, 4, 4, 4, DATA_SPLIT_TRAIN, 0, 1, lab, px, &rec));
  assert_ok(data_reader_add_block(r, fl_buf_bytes(&rec)));
  fl_buf_free(&rec);
  nn_model_spec spec = {.kind = NN_MLP, .channels = 1, .height = 4, .width = 4, .classes = 4, .hidden = 16, .seed = 3};
  nn_model *m = NULL;
  assert_ok(nn_model_create(dev, &spec, &m));
  optim *opt = NULL;
  assert_ok(optim_create_for_model(dev, &o, m, &opt));
  int64_t xs[4] = {8, 1, 4, 4};
  fl_tensor *x = NULL;
  assert_ok(fl_tensor_create(dev, 4, xs, &x));
  int32_t *labels_d = NULL;
  float *stats_d = NULL;
  assert_ok(dev->ops->alloc(dev, 8 * sizeof(int32_t), (void **)&labels_d));
  assert_ok(dev->ops->alloc(dev, 2 * sizeof(float), (void **)&stats_d));
  float xb[8 * 16], first = 0, last = 0;
  int32_t yb[8];
  for (uint32_t epoch = 0; epoch < 15; epoch++) {
    data_reader_start_epoch(r, 5, epoch, true, 0, false);
    assert_ok(dev->ops->memset0(dev, stats_d, 2 * sizeof(float)));
    while (data_reader_next(r, xb, yb) == 8) {
      const fl_tensor *logits;
      assert_ok(fl_tensor_write(x, xb, 8 * 16));
      assert_ok(dev->ops->from_host(dev, labels_d, yb, sizeof yb));
      assert_ok(nn_model_zero_grad(m));
      assert_ok(nn_model_forward(m, x, true, &logits));
      assert_ok(nn_model_loss(m, labels_d, 1.0f / 8, stats_d));
      assert_ok(nn_model_backward(m, NULL, NULL));
      assert_ok(optim_step(opt, lr, nn_model_grads(m), nn_model_values(m)));
    }
    float st[2];
    assert_ok(dev->ops->to_host(dev, st, stats_d, sizeof st));
    if (epoch == 0) first = st[0] / 32;
    last = st[0] / 32;
  }
  if (!(last < 0.5f * first)) fprintf(stderr, "%s: loss %g -> %g\n", optim_kind_name(o.kind), first, last);
  assert_true(last < 0.5f * first);

  fl_buf blob = FL_BUF_INIT;
  checkpoint_state cs = {.epoch = 15, .step = 60, .position = 15, .lr = 0.1};
  assert_ok(checkpoint_encode(nn_model_values(m), nn_model_buffers(m), opt, &cs, &blob));
  spec.seed = 99;
  nn_model *m2 = NULL;
  optim *opt2 = NULL;
  assert_ok(nn_model_create(dev, &spec, &m2));
  assert_ok(optim_create_for_model(dev, &o, m2, &opt2));
  checkpoint_state back;
  assert_ok(checkpoint_decode(fl_buf_bytes(&blob), nn_model_values(m2), nn_model_buffers(m2), opt2, &back));
  assert_int_equal(back.step, 60);
  assert_int_equal(optim_steps(opt2), 60);
  const fl_tensor *l1, *l2;
  float a[32], b[32];
  assert_ok(nn_model_forward(m, x, false, &l1));
  assert_ok(fl_tensor_read(l1, a, 32));
  assert_ok(nn_model_forward(m2, x, false, &l2));
  assert_ok(fl_tensor_read(l2, b, 32));
  assert_memory_equal(a, b, sizeof a);
  fl_buf_free(&blob);
  dev->ops->free(dev, labels_d);
  dev->ops->free(dev, stats_d);
  fl_tensor_destroy(x);
  optim_destroy(opt2);
  optim_destroy(opt);
  nn_model_destroy(m2);
  nn_model_destroy(m);
  data_reader_destroy(r);
  fl_device_close(dev);
}

static void test_model_steps_and_checkpoint(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  model_steps_and_checkpoint(o, 0.1f);
}

/* A short mlp training with AdamW (decoupled weight decay) lowers the loss as SGD does; so do
 * LAMB and LARS with their trust ratios. */
static void test_model_steps_adamw_lamb_lars(void **state) {
  (void)state;
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_ADAMW;
  o.weight_decay = 0.01f;
  model_steps_and_checkpoint(o, 0.01f);
  o.kind = OPTIM_LAMB;
  model_steps_and_checkpoint(o, 0.02f);
  o.kind = OPTIM_LARS;
  o.weight_decay = 1e-4f;
  o.trust_coef = 0.02f;
  model_steps_and_checkpoint(o, 1.0f);
}

/* ---- training options ------------------------------------------------------------------ */

static void test_train_options(void **state) {
  (void)state;
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  assert_ok(gpu_train_options_validate(&o));
  nn_model_kind k;
  assert_ok(gpu_train_model_parse("resnet18", &k));
  assert_int_equal(k, NN_RESNET18);
  assert_fails_with(gpu_train_model_parse("vgg", &k), FL_EINVAL, "'vgg'");
  gpu_train_dataset d;
  assert_ok(gpu_train_dataset_parse("synthetic-imagenet", &d));
  assert_fails_with(gpu_train_dataset_parse("mnist", &d), FL_EINVAL, "'mnist'");
  o.ranks = 3;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--batch 256 is not a multiple of --ranks 3");
  o.ranks = 4;
  o.warmup_epochs = 10;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--warmup");
  o.warmup_epochs = 2;
  o.num_milestones = 1;
  o.milestones[0] = 5;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--milestones is for --decay step");
  o.decay = OPTIM_DECAY_STEP;
  assert_ok(gpu_train_options_validate(&o));
  optim_schedule s;
  gpu_train_schedule(&o, &s);
  assert_int_equal(s.num_milestones, 1);
  assert_near(optim_lr_at(&s, 6), 0.01);
  o.num_milestones = 0;
  gpu_train_schedule(&o, &s); /* default milestones: 50% and 75% of the epochs */
  assert_int_equal(s.num_milestones, 2);
  assert_near(s.milestones[0], 5);
  assert_near(s.milestones[1], 7.5);
  o.optim.nesterov = true;
  o.optim.momentum = 0;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--nesterov");
  o.optim.momentum = 0.9f;
  o.optim.kind = OPTIM_ADAMW;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--nesterov is for --optimizer sgd");
  o.optim.nesterov = false;
  assert_ok(gpu_train_options_validate(&o));
  o.optim.beta1 = 1;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--beta1 1");
  o.optim.beta1 = 0.9f;
  o.clip_grad_norm = -1;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--clip-grad-norm -1");
  o.clip_grad_norm = 1;
  o.decay_power = 2;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--power is for --decay poly");
  o.decay = OPTIM_DECAY_POLY;
  o.num_milestones = 0;
  assert_ok(gpu_train_options_validate(&o));
  gpu_train_schedule(&o, &s);
  assert_near(s.power, 2);
  /* The transformer: LARS and LAMB need whole weights, clipping the whole gradient. */
  gpu_train_options t = GPU_TRAIN_OPTIONS_INIT;
  t.model = NN_TRANSFORMER;
  t.tp = 2;
  t.optim.kind = OPTIM_LAMB;
  assert_fails_with(gpu_train_options_validate(&t), FL_EINVAL, "--optimizer lamb needs each weight's whole norm");
  t.optim.kind = OPTIM_ADAM;
  assert_ok(gpu_train_options_validate(&t));
  t.clip_grad_norm = 1;
  assert_fails_with(gpu_train_options_validate(&t), FL_EINVAL, "--clip-grad-norm is for the data-parallel");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_momentum_weight_decay),
      cmocka_unit_test(test_sgd_nesterov),
      cmocka_unit_test(test_sgd_plain),
      cmocka_unit_test(test_optim_bad_arguments),
      cmocka_unit_test(test_sgd_against_reference),
      cmocka_unit_test(test_adam_adamw_against_reference),
      cmocka_unit_test(test_lars_against_reference),
      cmocka_unit_test(test_lamb_against_reference),
      cmocka_unit_test(test_no_decay_rule),
      cmocka_unit_test(test_clip_grad_norm),
      cmocka_unit_test(test_loss_scaler),
      cmocka_unit_test(test_precision_on_cpu),
      cmocka_unit_test(test_schedule_linear_scaling_and_warmup),
      cmocka_unit_test(test_schedule_step_and_cosine),
      cmocka_unit_test(test_schedule_validation),
      cmocka_unit_test(test_public_schedule),
      cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_checkpoint_corrupt_blobs),
      cmocka_unit_test(test_checkpoint_every_optimizer),
      cmocka_unit_test(test_checkpoint_reads_version_1),
      cmocka_unit_test(test_curves_csv_svg_progress),
      cmocka_unit_test(test_curves_compare_runs),
      cmocka_unit_test(test_reader_shuffle_and_batches),
      cmocka_unit_test(test_train_options),
      cmocka_unit_test(test_model_steps_and_checkpoint),
      cmocka_unit_test(test_model_steps_adamw_lamb_lars),
  };
  const struct CMUnitTest data_tests[] = {
      cmocka_unit_test(test_data_idx_plain_and_gz),
      cmocka_unit_test(test_data_idx_bad_input),
      cmocka_unit_test(test_data_fashion_mnist_if_installed),
      cmocka_unit_test(test_synthetic_imagenet_is_deterministic),
  };
  int failed = cmocka_run_group_tests_name("gpu_optim", tests, NULL, NULL);
  failed += cmocka_run_group_tests_name("gpu_data", data_tests, data_setup, data_teardown);
  return failed;
}
