/*
 * test_gpu_model: the public model API (include/flint/train.h) on the cpu device, used as a
 * user would: building with shape inference and its errors, residual blocks, PyTorch's
 * default initialisation, gradients against finite differences, the losses, dropout, backward
 * adding into the gradients (micro-batches against one batch), saving and loading, and a small
 * training loop written against the API alone.
 */
#include <math.h>
#include <unistd.h>

#include "test_util.h"

#include "flint/train.h"

static fl_device *dev;

static int open_device(void **state) {
  (void)state;
  return fl_device_open(FL_DEVICE_CPU, 0, &dev) == FL_OK ? 0 : -1;
}

static int close_device(void **state) {
  (void)state;
  fl_device_close(dev);
  return 0;
}

static fl_model *image_model(int c, int h, int w) {
  int64_t shape[3] = {c, h, w};
  fl_model *m = NULL;
  assert_ok(fl_model_create(dev, 3, shape, &m));
  return m;
}

static fl_tensor *tensor_of(int ndim, const int64_t *shape, const float *values) {
  fl_tensor *t;
  assert_ok(fl_tensor_create(dev, ndim, shape, &t));
  if (values) assert_ok(fl_tensor_write(t, values, fl_tensor_numel(t)));
  return t;
}

static float *read_all(const fl_tensor *t) {
  size_t n = fl_tensor_numel(t);
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  assert_ok(fl_tensor_read(t, v, n));
  return v;
}

static uint64_t rng = 12345;
static float *rand_values(size_t n) {
  float *v = malloc(n * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++) v[i] = test_urand_signed(&rng);
  return v;
}

/* conv - bn - relu - a block with a projection shortcut - a block with the identity -
 * global pooling - linear. */
static fl_model *small_resnet(uint64_t seed, bool zero_gamma) {
  fl_model *m = image_model(2, 6, 6);
  assert_ok(fl_model_conv2d(m, "conv1", &(fl_conv2d_options){.out_channels = 4, .kernel = 3, .padding = 1}));
  assert_ok(fl_model_batchnorm(m, "bn1", false));
  assert_ok(fl_model_relu(m));
  assert_ok(fl_model_residual_begin(m, "down"));
  assert_ok(fl_model_conv2d(m, "down.conv", &(fl_conv2d_options){.out_channels = 6, .kernel = 3, .stride = 2, .padding = 1}));
  assert_ok(fl_model_batchnorm(m, "down.bn", zero_gamma));
  assert_ok(fl_model_residual_shortcut(m));
  assert_ok(fl_model_conv2d(m, "down.proj", &(fl_conv2d_options){.out_channels = 6, .kernel = 1, .stride = 2}));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_relu(m));
  assert_ok(fl_model_residual_begin(m, "same"));
  assert_ok(fl_model_conv2d(m, "same.conv", &(fl_conv2d_options){.out_channels = 6, .kernel = 3, .padding = 1, .bias = true}));
  assert_ok(fl_model_gelu(m));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_global_avgpool(m));
  assert_ok(fl_model_linear(m, "fc", 3, true));
  assert_ok(fl_model_finish(m, seed));
  return m;
}

static void test_shapes_and_names(void **state) {
  (void)state;
  fl_model *m = small_resnet(7, true);
  int64_t out[FL_MODEL_MAX_SAMPLE_DIMS];
  assert_int_equal(fl_model_output_shape(m, out), 1);
  assert_int_equal(out[0], 3);
  static const char *const names[] = {"conv1.weight", "bn1.weight", "bn1.bias", "down.conv.weight", "down.bn.weight",
                                      "down.bn.bias", "down.proj.weight", "same.conv.weight", "same.conv.bias",
                                      "fc.weight", "fc.bias"};
  assert_int_equal(fl_model_num_params(m), 11);
  for (size_t i = 0; i < 11; i++) assert_string_equal(fl_model_param_name(m, i), names[i]);
  assert_null(fl_model_param_name(m, 11));
  size_t want = 4 * 2 * 9 + 4 + 4 + 6 * 4 * 9 + 6 + 6 + 6 * 4 + 6 * 6 * 9 + 6 + 3 * 6 + 3;
  assert_int_equal(fl_model_num_weights(m), want);
  assert_int_equal(fl_tensor_numel(fl_model_weights(m)), want);
  assert_int_equal(fl_tensor_numel(fl_model_param(m, 9)), 18);
  assert_int_equal(fl_tensor_dim(fl_model_param(m, 9), 0), 3);

  /* A forward of a batch gives [n, 3]. */
  int64_t xs[4] = {5, 2, 6, 6};
  float *xv = rand_values(5 * 72);
  fl_tensor *x = tensor_of(4, xs, xv);
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, true, &y));
  assert_int_equal(fl_tensor_ndim(y), 2);
  assert_int_equal(fl_tensor_dim(y, 0), 5);
  assert_int_equal(fl_tensor_dim(y, 1), 3);
  fl_tensor_destroy(x);
  free(xv);
  fl_model_destroy(m);
}

static void test_building_errors(void **state) {
  (void)state;
  fl_model *m = image_model(3, 8, 8);
  assert_fails_with(fl_model_linear(m, NULL, 4, true), FL_EINVAL, "needs a name");
  assert_fails_with(fl_model_linear(m, "fc", 0, true), FL_EINVAL, "0 output features");
  assert_fails_with(fl_model_conv2d(m, "c", &(fl_conv2d_options){.out_channels = 4, .kernel = 9}), FL_EINVAL,
                    "its input would be [n, 3, 8, 8], expected [n, C, H, W] with H, W >= 9");
  assert_fails_with(fl_model_conv2d(m, "g", &(fl_conv2d_options){.out_channels = 4, .kernel = 3, .groups = 3}),
                    FL_EINVAL, "3 groups must divide both 3 input and 4 output channels");
  assert_fails_with(fl_model_maxpool(m, 2, 0, 0), FL_EINVAL, "stride 0");
  assert_fails_with(fl_model_dropout(m, 1.0), FL_EINVAL, "must be in [0, 1)");
  assert_fails_with(fl_model_residual_end(m), FL_ESTATE, "no residual block is open");
  assert_fails_with(fl_model_residual_shortcut(m), FL_ESTATE, "no residual block is open");
  assert_fails_with(fl_model_finish(m, 1), FL_EINVAL, "no layers");

  /* A block whose main path changes the shape needs a projection. */
  assert_ok(fl_model_residual_begin(m, "b"));
  assert_ok(fl_model_conv2d(m, "b.conv", &(fl_conv2d_options){.out_channels = 4, .kernel = 3, .padding = 1}));
  assert_fails_with(fl_model_residual_end(m), FL_EINVAL,
                    "residual block b: the main path gives [n, 4, 8, 8] but the shortcut [n, 3, 8, 8] (the identity");
  assert_fails_with(fl_model_finish(m, 1), FL_ESTATE, "residual block b is not ended");
  assert_ok(fl_model_residual_shortcut(m));
  assert_fails_with(fl_model_residual_shortcut(m), FL_ESTATE, "has begun already");
  assert_ok(fl_model_conv2d(m, "b.proj", &(fl_conv2d_options){.out_channels = 4, .kernel = 1}));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_global_avgpool(m));
  assert_fails_with(fl_model_global_avgpool(m), FL_EINVAL, "its input would be [n, 4], expected [n, C, H, W]");

  /* Before finish a forward is refused; after it, adding layers is. */
  int64_t xs[4] = {1, 3, 8, 8};
  fl_tensor *x = tensor_of(4, xs, NULL);
  const fl_tensor *y;
  assert_fails_with(fl_model_forward(m, x, false, &y), FL_ESTATE, "not finished");
  assert_ok(fl_model_finish(m, 1));
  assert_fails_with(fl_model_relu(m), FL_ESTATE, "the model is finished");
  assert_fails_with(fl_model_finish(m, 1), FL_ESTATE, "the model is finished");
  assert_fails_with(fl_model_backward(m), FL_ESTATE, "no loss since the last forward");
  int64_t bad[4] = {1, 3, 7, 8};
  fl_tensor *wrong = tensor_of(4, bad, NULL);
  assert_fails_with(fl_model_forward(m, wrong, false, &y), FL_EINVAL, "input [1, 3, 7, 8], expected [n, 3, 8, 8]");
  fl_tensor_destroy(wrong);
  fl_tensor_destroy(x);
  fl_model_destroy(m);

  int64_t zero[1] = {0};
  assert_fails_with(fl_model_create(dev, 1, zero, &m), FL_EINVAL, "dimension 0 of a sample is 0");
  assert_fails_with(fl_model_create(dev, 4, xs, &m), FL_EINVAL, "4 dimensions");
  fl_model_destroy(NULL);
}

/* PyTorch's defaults: weights and biases of linear and conv layers uniform in +-1/sqrt(fan_in)
 * (so std bound/sqrt(3)), batch norm gamma 1 (0 when asked) and beta 0; the same seed gives
 * the same weights. */
static void test_pytorch_initialisation(void **state) {
  (void)state;
  int64_t in[1] = {400};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc", 300, true));
  assert_ok(fl_model_batchnorm(m, "bn", false));
  assert_ok(fl_model_batchnorm(m, "bn0", true));
  assert_ok(fl_model_finish(m, 99));
  float *w = read_all(fl_model_param(m, 0)), *b = read_all(fl_model_param(m, 1));
  double bound = 1.0 / sqrt(400.0), sum = 0, sq = 0;
  for (size_t i = 0; i < 120000; i++) {
    assert_true(fabs(w[i]) <= bound);
    sum += w[i];
    sq += (double)w[i] * w[i];
  }
  double mean = sum / 120000, sd = sqrt(sq / 120000 - mean * mean);
  assert_true(fabs(mean) < 0.002);
  assert_true(fabs(sd - bound / sqrt(3.0)) < 0.002);
  int nonzero = 0;
  for (size_t i = 0; i < 300; i++) {
    assert_true(fabs(b[i]) <= bound);
    nonzero += b[i] != 0.0f;
  }
  assert_true(nonzero > 290);
  float *g = read_all(fl_model_param(m, 2)), *beta = read_all(fl_model_param(m, 3)), *g0 = read_all(fl_model_param(m, 4));
  for (size_t i = 0; i < 300; i++) {
    assert_true(g[i] == 1.0f && beta[i] == 0.0f && g0[i] == 0.0f);
  }
  /* The same seed, the same weights; another seed, others. */
  fl_model *same, *other;
  assert_ok(fl_model_create(dev, 1, in, &same));
  assert_ok(fl_model_linear(same, "fc", 300, true));
  assert_ok(fl_model_finish(same, 99));
  assert_ok(fl_model_create(dev, 1, in, &other));
  assert_ok(fl_model_linear(other, "fc", 300, true));
  assert_ok(fl_model_finish(other, 100));
  float *ws = read_all(fl_model_param(same, 0)), *wo = read_all(fl_model_param(other, 0));
  assert_memory_equal(w, ws, 120000 * sizeof(float));
  assert_memory_not_equal(w, wo, 120000 * sizeof(float));
  free(w), free(b), free(g), free(beta), free(g0), free(ws), free(wo);
  fl_model_destroy(m);
  fl_model_destroy(same);
  fl_model_destroy(other);
}

/* The mean loss of the batch, forward in training mode (batch statistics, deterministic). */
static double loss_of(fl_model *m, const fl_tensor *x, const int32_t *labels, size_t n, double smoothing) {
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, true, &y));
  double loss;
  assert_ok(fl_model_cross_entropy(m, labels, n, smoothing, &loss, NULL));
  return loss;
}

/* Backward's gradients against central differences of the loss, over every parameter tensor
 * (a few elements of each), with label smoothing on. Returns how many disagreed. */
static size_t check_gradients(fl_model *m, const fl_tensor *x, const int32_t *labels, size_t n) {
  assert_ok(fl_model_zero_grad(m));
  loss_of(m, x, labels, n, 0.1);
  assert_ok(fl_model_backward(m));
  float *grads = read_all(fl_model_gradients(m));
  fl_tensor *wt = fl_model_weights(m);
  size_t nw = fl_tensor_numel(wt);
  float *w = read_all(wt);
  size_t offset = 0, checked = 0, bad = 0;
  const double eps = 5e-3;
  for (size_t p = 0; p < fl_model_num_params(m); p++) {
    size_t count = fl_tensor_numel(fl_model_param(m, p));
    for (size_t k = 0; k < count; k += count / 3 + 1) {
      size_t i = offset + k;
      float keep = w[i];
      w[i] = keep + (float)eps;
      assert_ok(fl_tensor_write(wt, w, nw));
      double up = loss_of(m, x, labels, n, 0.1);
      w[i] = keep - (float)eps;
      assert_ok(fl_tensor_write(wt, w, nw));
      double down = loss_of(m, x, labels, n, 0.1);
      w[i] = keep;
      double numeric = (up - down) / (2 * eps);
      double err = fabs(numeric - grads[i]) / (fabs(numeric) + fabs(grads[i]) + 1e-3);
      if (err > 0.05) {
        bad++;
        fprintf(stderr, "%s[%zu]: backward %g, finite difference %g\n", fl_model_param_name(m, p), k, grads[i], numeric);
      }
      checked++;
    }
    offset += count;
  }
  assert_ok(fl_tensor_write(wt, w, nw));
  assert_true(checked >= 2 * fl_model_num_params(m));
  free(grads);
  free(w);
  return bad;
}

/* (Not with a zero gamma: the block's output would then sit right at the following relu's
 * kink.) */
static void test_gradients_match_finite_differences(void **state) {
  (void)state;
  fl_model *m = small_resnet(3, false);
  int64_t xs[4] = {4, 2, 6, 6};
  float *xv = rand_values(4 * 72);
  fl_tensor *x = tensor_of(4, xs, xv);
  int32_t labels[4] = {0, 2, 1, 2};
  assert_true(check_gradients(m, x, labels, 4) <= 2); /* a relu kink may fall between the two sides */
  free(xv);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* A small transformer encoder for sequences of token ids, built from the sequence layers: its
 * shapes, its errors, and its gradients. */
static void test_sequence_layers(void **state) {
  (void)state;
  enum { TOKENS = 5, VOCAB = 11, DIM = 8 };
  int64_t in[1] = {TOKENS};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_fails_with(fl_model_attention(m, "attn", 2), FL_EINVAL, "expected [n, tokens, hidden]");
  assert_ok(fl_model_embedding(m, "tok", VOCAB, DIM));
  assert_fails_with(fl_model_attention(m, "attn", 3), FL_EINVAL, "3 heads must divide 8 features");
  assert_ok(fl_model_residual_begin(m, "attn_block"));
  assert_ok(fl_model_layernorm(m, "ln1"));
  assert_ok(fl_model_attention(m, "attn", 2));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_residual_begin(m, "mlp_block"));
  assert_ok(fl_model_layernorm(m, "ln2"));
  assert_ok(fl_model_linear(m, "fc1", 16, true)); /* per token, as nn.Linear */
  assert_fails_with(fl_model_residual_end(m), FL_EINVAL, "the main path gives [n, 5, 16] but the shortcut [n, 5, 8]");
  assert_ok(fl_model_gelu(m));
  assert_ok(fl_model_linear(m, "fc2", DIM, true));
  assert_ok(fl_model_residual_end(m));
  int64_t out[FL_MODEL_MAX_SAMPLE_DIMS];
  assert_int_equal(fl_model_output_shape(m, out), 2);
  assert_int_equal(out[0], TOKENS);
  assert_int_equal(out[1], DIM);
  fl_model_destroy(m);

  /* A whole encoder block, then pooling and a classifier. */
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_embedding(m, "tok", VOCAB, DIM));
  assert_ok(fl_model_residual_begin(m, "attn_block"));
  assert_ok(fl_model_layernorm(m, "ln1"));
  assert_ok(fl_model_attention(m, "attn", 2));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_residual_begin(m, "mlp_block"));
  assert_ok(fl_model_linear(m, "fc1", 16, true));
  assert_ok(fl_model_gelu(m));
  assert_ok(fl_model_linear(m, "fc2", DIM, true));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_layernorm(m, "ln_f"));
  assert_ok(fl_model_mean_tokens(m));
  assert_ok(fl_model_linear(m, "head", 3, true));
  assert_ok(fl_model_finish(m, 21));
  static const char *const names[] = {"tok.weight",  "ln1.weight", "ln1.bias",  "attn.in_proj_weight",
                                      "attn.in_proj_bias", "attn.out_proj.weight", "attn.out_proj.bias",
                                      "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                      "ln_f.weight", "ln_f.bias", "head.weight", "head.bias"};
  assert_int_equal(fl_model_num_params(m), 15);
  for (size_t i = 0; i < 15; i++) assert_string_equal(fl_model_param_name(m, i), names[i]);
  int64_t xs[2] = {3, TOKENS};
  float ids[3 * TOKENS] = {1, 2, 3, 4, 5, 10, 0, 0, 7, 7, 9, 8, 6, 5, 4};
  fl_tensor *x = tensor_of(2, xs, ids);
  int32_t labels[3] = {2, 0, 1};
  assert_int_equal(check_gradients(m, x, labels, 3), 0);

  /* An id outside the table is refused, naming it. */
  ids[4] = VOCAB;
  assert_ok(fl_tensor_write(x, ids, 3 * TOKENS));
  const fl_tensor *y;
  assert_fails_with(fl_model_forward(m, x, true, &y), FL_EINVAL, "id 11 at 4 is not a whole number in [0, 11)");
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* Grouped and depthwise convolutions: a depthwise output against a loop over its one input
 * channel, and the gradients of a model of both kinds against finite differences. */
static void test_grouped_convolutions(void **state) {
  (void)state;
  fl_model *m = image_model(4, 6, 6);
  assert_ok(fl_model_conv2d(m, "g2", &(fl_conv2d_options){.out_channels = 8, .kernel = 3, .padding = 1, .groups = 2,
                                                          .bias = true}));
  assert_ok(fl_model_gelu(m)); /* smooth: no kink between the two sides of a difference */
  assert_ok(fl_model_conv2d(m, "dw", &(fl_conv2d_options){.out_channels = 8, .kernel = 3, .stride = 2, .padding = 1,
                                                          .groups = 8}));
  assert_ok(fl_model_global_avgpool(m));
  assert_ok(fl_model_linear(m, "fc", 3, true));
  assert_ok(fl_model_finish(m, 8));
  assert_int_equal(fl_tensor_dim(fl_model_param(m, 0), 1), 2); /* [8, 4 / 2, 3, 3] */
  assert_int_equal(fl_tensor_dim(fl_model_param(m, 2), 1), 1); /* depthwise: [8, 1, 3, 3] */
  int64_t xs[4] = {3, 4, 6, 6};
  float *xv = rand_values(3 * 144);
  fl_tensor *x = tensor_of(4, xs, xv);
  int32_t labels[3] = {1, 0, 2};
  assert_int_equal(check_gradients(m, x, labels, 3), 0);
  free(xv);
  fl_tensor_destroy(x);
  fl_model_destroy(m);

  /* Depthwise alone: output channel c of sample i is input channel c convolved with its own 3x3. */
  m = image_model(2, 4, 4);
  assert_ok(fl_model_conv2d(m, "dw", &(fl_conv2d_options){.out_channels = 2, .kernel = 3, .padding = 1, .groups = 2}));
  assert_ok(fl_model_finish(m, 9));
  int64_t ds[4] = {2, 2, 4, 4};
  float *dv = rand_values(64);
  fl_tensor *d = tensor_of(4, ds, dv);
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, d, false, &y));
  float *yv = read_all(y), *w = read_all(fl_model_param(m, 0));
  for (int i = 0; i < 2; i++)
    for (int c = 0; c < 2; c++)
      for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
          double want = 0;
          for (int a = -1; a <= 1; a++)
            for (int b = -1; b <= 1; b++)
              if (r + a >= 0 && r + a < 4 && q + b >= 0 && q + b < 4)
                want += (double)w[c * 9 + (a + 1) * 3 + (b + 1)] * dv[((i * 2 + c) * 4 + r + a) * 4 + q + b];
          assert_true(fabs(yv[((i * 2 + c) * 4 + r) * 4 + q] - want) < 1e-5);
        }
  free(dv), free(yv), free(w);
  fl_tensor_destroy(d);
  fl_model_destroy(m);
}

/* Layer norm's forward against its formula, in double. */
static void test_layernorm_values(void **state) {
  (void)state;
  int64_t in[2] = {2, 6};
  fl_model *m;
  assert_ok(fl_model_create(dev, 2, in, &m));
  assert_ok(fl_model_layernorm(m, "ln"));
  assert_ok(fl_model_finish(m, 1));
  float gamma[6] = {1, 2, 0.5f, -1, 1, 3}, beta[6] = {0, 0.1f, 0.2f, 0.3f, -0.4f, 0};
  assert_ok(fl_tensor_write(fl_model_param(m, 0), gamma, 6));
  assert_ok(fl_tensor_write(fl_model_param(m, 1), beta, 6));
  int64_t xs[3] = {2, 2, 6};
  float *xv = rand_values(24);
  fl_tensor *x = tensor_of(3, xs, xv);
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, false, &y));
  float *yv = read_all(y);
  for (int r = 0; r < 4; r++) {
    double mean = 0, var = 0;
    for (int c = 0; c < 6; c++) mean += xv[r * 6 + c] / 6.0;
    for (int c = 0; c < 6; c++) var += (xv[r * 6 + c] - mean) * (xv[r * 6 + c] - mean) / 6.0;
    for (int c = 0; c < 6; c++) {
      double want = (xv[r * 6 + c] - mean) / sqrt(var + 1e-5) * gamma[c] + beta[c];
      assert_true(fabs(yv[r * 6 + c] - want) < 1e-4);
    }
  }
  free(xv), free(yv);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* The losses against formulas computed here in double. */
static void test_losses(void **state) {
  (void)state;
  int64_t in[1] = {3};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc", 4, true));
  assert_ok(fl_model_finish(m, 5));
  int64_t xs[2] = {2, 3};
  float xv[6] = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f};
  fl_tensor *x = tensor_of(2, xs, xv);
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, false, &y));
  float *z = read_all(y);
  int32_t labels[2] = {3, 1};
  double want = 0, eps = 0.2;
  uint64_t want_correct = 0;
  for (int r = 0; r < 2; r++) {
    double mx = -1e30, lse = 0, mean = 0;
    int arg = 0;
    for (int j = 0; j < 4; j++)
      if (z[r * 4 + j] > mx) mx = z[r * 4 + j], arg = j;
    for (int j = 0; j < 4; j++) lse += exp(z[r * 4 + j] - mx), mean += z[r * 4 + j];
    lse = log(lse) + mx;
    want += (1 - eps) * (lse - z[r * 4 + labels[r]]) + eps * (lse - mean / 4);
    want_correct += arg == labels[r];
  }
  want /= 2;
  double loss;
  uint64_t correct;
  assert_ok(fl_model_cross_entropy(m, labels, 2, eps, &loss, &correct));
  assert_true(fabs(loss - want) < 1e-5);
  assert_int_equal(correct, want_correct);
  int32_t out_of_range[2] = {0, 4};
  assert_fails_with(fl_model_cross_entropy(m, out_of_range, 2, 0, &loss, NULL), FL_EINVAL,
                    "label 4 of sample 1 is outside [0, 4)");
  assert_fails_with(fl_model_cross_entropy(m, labels, 3, 0, &loss, NULL), FL_EINVAL, "3 labels for a batch of 2");
  assert_fails_with(fl_model_cross_entropy(m, labels, 2, 1.0, &loss, NULL), FL_EINVAL, "label smoothing 1");

  /* MSE: mean of squares, and its gradient drives the weights toward the target. */
  int64_t ts[2] = {2, 4};
  float tv[8] = {1, 2, 3, 4, -1, -2, -3, -4};
  fl_tensor *t = tensor_of(2, ts, tv);
  double sq = 0;
  for (int i = 0; i < 8; i++) sq += (z[i] - tv[i]) * (z[i] - tv[i]);
  assert_ok(fl_model_forward(m, x, true, &y));
  assert_ok(fl_model_mse(m, t, &loss));
  assert_true(fabs(loss - sq / 8) < 1e-5);
  assert_ok(fl_model_zero_grad(m));
  assert_ok(fl_model_backward(m));
  float *w = read_all(fl_model_weights(m)), *g = read_all(fl_model_gradients(m));
  size_t nw = fl_model_num_weights(m);
  for (size_t i = 0; i < nw; i++) w[i] -= 0.05f * g[i];
  assert_ok(fl_tensor_write(fl_model_weights(m), w, nw));
  double after;
  assert_ok(fl_model_forward(m, x, true, &y));
  assert_ok(fl_model_mse(m, t, &after));
  assert_true(after < loss);
  int64_t other[2] = {2, 3};
  fl_tensor *wrong = tensor_of(2, other, NULL);
  assert_fails_with(fl_model_mse(m, wrong, &loss), FL_EINVAL, "target [2, 3], the output is [2, 4]");
  fl_tensor_destroy(wrong);
  free(z), free(w), free(g);
  fl_tensor_destroy(t);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* fl_grad_scaler: backward under a scale gives scale x the gradients (cross-entropy's and
 * MSE's), unscale gives them back exactly (a power of two), the losses are never scaled, and
 * an overflowed gradient skips the step and halves the scale. Device-independent: the cpu
 * runs it although only cuda multiplies in fp16. */
static void test_grad_scaler(void **state) {
  (void)state;
  int64_t in[1] = {3};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc", 4, true));
  fl_grad_scaler *gs = NULL;
  assert_fails_with(fl_grad_scaler_create(m, NULL, &gs), FL_ESTATE, "not finished");
  assert_ok(fl_model_finish(m, 5));
  int64_t xs[2] = {2, 3}, ts[2] = {2, 4};
  float xv[6] = {0.5f, -1.0f, 2.0f, 1.5f, 0.25f, -0.75f}, tv[8] = {1, 2, 3, 4, -1, -2, -3, -4};
  fl_tensor *x = tensor_of(2, xs, xv), *t = tensor_of(2, ts, tv);
  int32_t labels[2] = {3, 1};
  size_t nw = fl_model_num_weights(m);
  const fl_tensor *y;
  double plain_loss, scaled_loss;
  for (int mse = 0; mse < 2; mse++) {
    assert_ok(fl_model_zero_grad(m));
    assert_ok(fl_model_forward(m, x, true, &y));
    if (mse) assert_ok(fl_model_mse(m, t, &plain_loss));
    else assert_ok(fl_model_cross_entropy(m, labels, 2, 0, &plain_loss, NULL));
    assert_ok(fl_model_backward(m));
    float *plain = read_all(fl_model_gradients(m));

    fl_grad_scaler_options o = {1024, 2000};
    assert_ok(fl_grad_scaler_create(m, &o, &gs));
    assert_true(fl_grad_scaler_scale(gs) == 1024);
    assert_ok(fl_model_zero_grad(m));
    assert_ok(fl_model_forward(m, x, true, &y));
    if (mse) assert_ok(fl_model_mse(m, t, &scaled_loss));
    else assert_ok(fl_model_cross_entropy(m, labels, 2, 0, &scaled_loss, NULL));
    assert_true(scaled_loss == plain_loss);
    assert_ok(fl_model_backward(m));
    float *scaled = read_all(fl_model_gradients(m));
    for (size_t i = 0; i < nw; i++) assert_true(fabsf(scaled[i] - 1024 * plain[i]) <= 1e-4f * fabsf(1024 * plain[i]) + 1e-9f);
    bool step = false;
    assert_ok(fl_grad_scaler_unscale(gs, &step));
    assert_true(step);
    float *back = read_all(fl_model_gradients(m));
    for (size_t i = 0; i < nw; i++) assert_true(back[i] == scaled[i] / 1024);
    /* An overflowed gradient: no step, half the scale, one skipped. */
    back[0] = INFINITY;
    assert_ok(fl_tensor_write(fl_model_gradients(m), back, nw));
    assert_ok(fl_grad_scaler_unscale(gs, &step));
    assert_false(step);
    assert_true(fl_grad_scaler_scale(gs) == 512);
    assert_int_equal(fl_grad_scaler_skipped(gs), 1);
    fl_grad_scaler_destroy(gs);
    /* Destroyed: the gradients are unscaled again. */
    assert_ok(fl_model_zero_grad(m));
    assert_ok(fl_model_forward(m, x, true, &y));
    if (mse) assert_ok(fl_model_mse(m, t, &plain_loss));
    else assert_ok(fl_model_cross_entropy(m, labels, 2, 0, &plain_loss, NULL));
    assert_ok(fl_model_backward(m));
    float *again = read_all(fl_model_gradients(m));
    for (size_t i = 0; i < nw; i++) assert_true(fabsf(again[i] - plain[i]) <= 1e-6f * fabsf(plain[i]) + 1e-9f);
    free(plain), free(scaled), free(back), free(again);
  }
  fl_grad_scaler_options bad = {0.5, 2000};
  assert_fails_with(fl_grad_scaler_create(m, &bad, &gs), FL_EINVAL, "init_scale 0.5");
  bad = (fl_grad_scaler_options){1024, 0};
  assert_fails_with(fl_grad_scaler_create(m, &bad, &gs), FL_EINVAL, "growth_interval 0");
  bool step;
  assert_fails_with(fl_grad_scaler_unscale(NULL, &step), FL_EINVAL, "NULL");
  fl_grad_scaler_destroy(NULL);
  fl_tensor_destroy(t);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* fl_checkpoint_save/load: a run stopped after 3 Adam steps and resumed in a fresh model and
 * optimizer takes the same 4th step as the run that went on (Adam's moments and step count
 * came back); mismatches are named and change nothing. */
static fl_model *ckpt_model(uint64_t seed) {
  int64_t in[1] = {4};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc1", 6, true));
  assert_ok(fl_model_relu(m));
  assert_ok(fl_model_linear(m, "fc2", 3, true));
  assert_ok(fl_model_finish(m, seed));
  return m;
}

static void adam_step(fl_model *m, fl_optimizer *opt, fl_tensor *x, const int32_t *labels, int n) {
  const fl_tensor *y;
  assert_ok(fl_model_zero_grad(m));
  assert_ok(fl_model_forward(m, x, true, &y));
  assert_ok(fl_model_cross_entropy(m, labels, (size_t)n, 0, NULL, NULL));
  assert_ok(fl_model_backward(m));
  assert_ok(fl_optimizer_step(opt, 0.05));
}

static void test_checkpoint_resume(void **state) {
  (void)state;
  enum { N = 12 };
  float *xv = rand_values(N * 4);
  int32_t labels[N];
  for (int i = 0; i < N; i++) labels[i] = i % 3;
  int64_t xs[2] = {N, 4};
  fl_tensor *x = tensor_of(2, xs, xv);
  fl_optimizer_options adam = FL_OPTIMIZER_OPTIONS_INIT;
  adam.kind = "adam";
  fl_model *a = ckpt_model(1), *b = ckpt_model(2);
  fl_optimizer *oa, *ob;
  assert_ok(fl_optimizer_create(a, &adam, &oa));
  assert_ok(fl_optimizer_create(b, &adam, &ob));
  for (int i = 0; i < 3; i++) adam_step(a, oa, x, labels, N);
  char path[] = "/tmp/flint-test-ckpt-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_ok(fl_checkpoint_save(a, oa, 1, 3, path));
  uint32_t epoch = 0;
  uint64_t step = 0;
  assert_ok(fl_checkpoint_load(b, ob, path, &epoch, &step));
  assert_int_equal(epoch, 1);
  assert_int_equal(step, 3);
  adam_step(a, oa, x, labels, N);
  adam_step(b, ob, x, labels, N);
  size_t nw = fl_model_num_weights(a);
  float *wa = read_all(fl_model_weights(a)), *wb = read_all(fl_model_weights(b));
  assert_memory_equal(wa, wb, nw * sizeof(float));
  /* Weights only (no optimizer), and fl_model_load reads the same file. */
  fl_model *c = ckpt_model(3);
  assert_ok(fl_checkpoint_load(c, NULL, path, NULL, NULL));
  assert_ok(fl_model_load(c, path));
  /* Another optimizer's state, another architecture, another model's optimizer: named. */
  fl_optimizer_options sgd = FL_OPTIMIZER_OPTIONS_INIT;
  fl_optimizer *oc;
  assert_ok(fl_optimizer_create(c, &sgd, &oc));
  assert_fails_with(fl_checkpoint_load(c, oc, path, NULL, NULL), FL_EINVAL, "holds adam's optimizer state");
  assert_fails_with(fl_checkpoint_load(c, oa, path, NULL, NULL), FL_EINVAL, "the optimizer steps another model");
  int64_t in[1] = {4};
  fl_model *d;
  assert_ok(fl_model_create(dev, 1, in, &d));
  assert_ok(fl_model_linear(d, "fc", 3, true));
  assert_ok(fl_model_finish(d, 1));
  float *wd = read_all(fl_model_weights(d));
  assert_fails_with(fl_checkpoint_load(d, NULL, path, NULL, NULL), FL_EINVAL, "does not match this model");
  float *wd2 = read_all(fl_model_weights(d));
  assert_memory_equal(wd, wd2, fl_model_num_weights(d) * sizeof(float));
  unlink(path);
  assert_int_equal(fl_checkpoint_load(c, NULL, path, NULL, NULL), FL_ENOENT);
  assert_fails_with(fl_checkpoint_save(a, oa, 1, 3, "/nonexistent/dir/x.ckpt"), FL_EIO, "x.ckpt");
  free(wa), free(wb), free(wd), free(wd2), free(xv);
  fl_optimizer_destroy(oa);
  fl_optimizer_destroy(ob);
  fl_optimizer_destroy(oc);
  fl_tensor_destroy(x);
  fl_model_destroy(a);
  fl_model_destroy(b);
  fl_model_destroy(c);
  fl_model_destroy(d);
}

static void test_dropout(void **state) {
  (void)state;
  int64_t in[1] = {1000};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_dropout(m, 0.25));
  assert_ok(fl_model_finish(m, 11));
  int64_t xs[2] = {4, 1000};
  float *ones = malloc(4000 * sizeof *ones);
  for (int i = 0; i < 4000; i++) ones[i] = 1.0f;
  fl_tensor *x = tensor_of(2, xs, ones);
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, false, &y));
  float *eval = read_all(y);
  assert_memory_equal(eval, ones, 4000 * sizeof(float));
  assert_ok(fl_model_forward(m, x, true, &y));
  float *a = read_all(y);
  int dropped = 0;
  for (int i = 0; i < 4000; i++) {
    assert_true(a[i] == 0.0f || fabsf(a[i] - 1.0f / 0.75f) < 1e-6f);
    dropped += a[i] == 0.0f;
  }
  assert_true(dropped > 850 && dropped < 1150);
  assert_ok(fl_model_forward(m, x, true, &y));
  float *again = read_all(y);
  assert_memory_equal(a, again, 4000 * sizeof(float)); /* the same step, the same mask */
  fl_model_set_step(m, 1);
  assert_ok(fl_model_forward(m, x, true, &y));
  float *next = read_all(y);
  assert_memory_not_equal(a, next, 4000 * sizeof(float));
  free(ones), free(eval), free(a), free(again), free(next);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* ---- gradient accumulation ----------------------------------------------------------------
 * The trainer's --accumulate runs a step's batch as micro-batches whose backward passes add
 * into the gradients (gpu/parallel/train_dp.c). That needs every layer's backward to add into
 * its parameters' gradients, never overwrite them. */

/* Forward, the mean cross-entropy over the n samples, and backward on x, adding into the
 * gradients (zeroed first when `zero`). */
static void grad_pass(fl_model *m, const fl_tensor *x, const int32_t *labels, size_t n, bool zero) {
  const fl_tensor *y;
  double loss;
  if (zero) assert_ok(fl_model_zero_grad(m));
  assert_ok(fl_model_forward(m, x, true, &y));
  assert_ok(fl_model_cross_entropy(m, labels, n, 0.0, &loss, NULL));
  assert_ok(fl_model_backward(m));
}

/* max_i |a[i] - b[i]| / max_i |b[i]|. */
static double grad_diff(const float *a, const float *b, size_t n) {
  double d = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d)) d = e; /* NaN propagates */
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return scale > 0 ? d / scale : d;
}

/* Every parameter tensor got some gradient: the check covered each layer with parameters. */
static void assert_every_param_has_grad(fl_model *m, const float *g) {
  size_t offset = 0;
  for (size_t p = 0; p < fl_model_num_params(m); p++) {
    size_t count = fl_tensor_numel(fl_model_param(m, p)), nonzero = 0;
    for (size_t k = 0; k < count; k++) nonzero += g[offset + k] != 0.0f;
    if (!nonzero) fprintf(stderr, "%s has no gradient\n", fl_model_param_name(m, p));
    assert_true(nonzero > 0);
    offset += count;
  }
}

/* Two passes over the same batch without zeroing give twice one pass's gradients. */
static void check_backward_adds(fl_model *m, const fl_tensor *x, const int32_t *labels, size_t n) {
  size_t nw = fl_model_num_weights(m);
  grad_pass(m, x, labels, n, true);
  float *once = read_all(fl_model_gradients(m));
  assert_every_param_has_grad(m, once);
  grad_pass(m, x, labels, n, false);
  float *twice = read_all(fl_model_gradients(m));
  for (size_t i = 0; i < nw; i++) once[i] *= 2.0f;
  double d = grad_diff(twice, once, nw);
  if (!(d < 1e-6)) fprintf(stderr, "two passes against twice one: %g\n", d);
  assert_true(d < 1e-6);
  free(once), free(twice);
}

/* Every image layer kind but batch norm and dropout (whose outputs depend on how the batch is
 * split); with both, for the check that backward adds. */
static fl_model *image_layers_model(bool bn_and_dropout) {
  fl_model *m = image_model(4, 6, 6);
  assert_ok(fl_model_conv2d(m, "conv", &(fl_conv2d_options){.out_channels = 6, .kernel = 3, .padding = 1, .bias = true}));
  if (bn_and_dropout) assert_ok(fl_model_batchnorm(m, "bn", false));
  assert_ok(fl_model_relu(m));
  assert_ok(fl_model_maxpool(m, 2, 2, 0)); /* 3x3 */
  assert_ok(fl_model_conv2d(m, "grouped", &(fl_conv2d_options){.out_channels = 6, .kernel = 3, .padding = 1,
                                                               .groups = 3, .bias = true}));
  assert_ok(fl_model_gelu(m));
  assert_ok(fl_model_avgpool(m, 3, 1, 1));
  if (bn_and_dropout) assert_ok(fl_model_dropout(m, 0.25));
  assert_ok(fl_model_flatten(m));
  assert_ok(fl_model_linear(m, "fc1", 8, false));
  assert_ok(fl_model_layernorm(m, "ln"));
  assert_ok(fl_model_linear(m, "fc2", 3, true));
  assert_ok(fl_model_finish(m, 17));
  return m;
}

enum { SEQ_TOKENS = 5, SEQ_VOCAB = 11, SEQ_DIM = 8 };

/* An encoder block over token ids: embedding, layer norm, attention, residuals, mean over tokens. */
static fl_model *sequence_model(void) {
  int64_t in[1] = {SEQ_TOKENS};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_embedding(m, "tok", SEQ_VOCAB, SEQ_DIM));
  assert_ok(fl_model_residual_begin(m, "attn_block"));
  assert_ok(fl_model_layernorm(m, "ln1"));
  assert_ok(fl_model_attention(m, "attn", 2));
  assert_ok(fl_model_residual_end(m));
  assert_ok(fl_model_mean_tokens(m));
  assert_ok(fl_model_linear(m, "head", 3, true));
  assert_ok(fl_model_finish(m, 23));
  return m;
}

static void test_backward_accumulates(void **state) {
  (void)state;
  int64_t xs[4] = {4, 2, 6, 6};
  float *xv = rand_values(4 * 72);
  fl_tensor *x = tensor_of(4, xs, xv);
  int32_t labels[6] = {0, 2, 1, 2, 1, 0};
  fl_model *m = small_resnet(3, false); /* batch norm, residual blocks with a projection */
  check_backward_adds(m, x, labels, 4);
  fl_model_destroy(m);
  fl_tensor_destroy(x);
  free(xv);

  int64_t is[4] = {4, 4, 6, 6};
  xv = rand_values(4 * 144);
  x = tensor_of(4, is, xv);
  m = image_layers_model(true);
  check_backward_adds(m, x, labels, 4);
  fl_model_destroy(m);
  fl_tensor_destroy(x);
  free(xv);

  int64_t ss[2] = {3, SEQ_TOKENS};
  float ids[3 * SEQ_TOKENS] = {1, 2, 3, 4, 5, 10, 0, 0, 7, 7, 9, 8, 6, 5, 4};
  x = tensor_of(2, ss, ids);
  m = sequence_model();
  check_backward_adds(m, x, labels, 3);
  fl_model_destroy(m);
  fl_tensor_destroy(x);
}

/* k micro-batches of n / k samples, each with its own mean loss, add up to k times the
 * gradients of the whole batch's mean loss: the same to float rounding. One micro-batch
 * alone is far from it, so the comparison can fail. */
static void check_micro_batches(fl_model *m, int ndim, const int64_t *shape, const float *xv, const int32_t *labels,
                                size_t k) {
  size_t n = (size_t)shape[0], mb = n / k, nw = fl_model_num_weights(m), per = 1;
  for (int d = 1; d < ndim; d++) per *= (size_t)shape[d];
  fl_tensor *x = tensor_of(ndim, shape, xv);
  grad_pass(m, x, labels, n, true);
  float *whole = read_all(fl_model_gradients(m));
  assert_every_param_has_grad(m, whole);
  int64_t ms[4];
  memcpy(ms, shape, (size_t)ndim * sizeof *ms);
  ms[0] = (int64_t)mb;
  assert_ok(fl_model_zero_grad(m));
  for (size_t j = 0; j < k; j++) {
    fl_tensor *part = tensor_of(ndim, ms, xv + j * mb * per);
    grad_pass(m, part, labels + j * mb, mb, false);
    fl_tensor_destroy(part);
  }
  float *summed = read_all(fl_model_gradients(m));
  for (size_t i = 0; i < nw; i++) summed[i] /= (float)k;
  double d = grad_diff(summed, whole, nw);
  fprintf(stderr, "  %zu micro-batches of %zu against one batch of %zu: %.3g\n", k, mb, n, d);
  assert_true(d < 1e-5);
  fl_tensor *last = tensor_of(ndim, ms, xv + (k - 1) * mb * per);
  grad_pass(m, last, labels + (k - 1) * mb, mb, true);
  float *one = read_all(fl_model_gradients(m));
  assert_true(grad_diff(one, whole, nw) > 1e-3);
  fl_tensor_destroy(last);
  fl_tensor_destroy(x);
  free(whole), free(summed), free(one);
}

static void test_micro_batches_match_one_batch(void **state) {
  (void)state;
  int32_t labels[6] = {0, 2, 1, 2, 1, 0};
  int64_t is[4] = {6, 4, 6, 6};
  float *xv = rand_values(6 * 144);
  fl_model *m = image_layers_model(false);
  check_micro_batches(m, 4, is, xv, labels, 3);
  check_micro_batches(m, 4, is, xv, labels, 2);
  fl_model_destroy(m);
  free(xv);
  int64_t ss[2] = {6, SEQ_TOKENS};
  float ids[6 * SEQ_TOKENS] = {1, 2, 3, 4, 5, 10, 0, 0, 7, 7, 9, 8, 6, 5, 4, 3, 3, 1, 0, 2, 8, 8, 6, 4, 2, 10, 9, 1, 0, 5};
  m = sequence_model();
  check_micro_batches(m, 2, ss, ids, labels, 3);
  fl_model_destroy(m);
}

static void test_save_and_load(void **state) {
  (void)state;
  char path[] = "/tmp/flint-model-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  fl_model *a = small_resnet(1, true), *b = small_resnet(2, true);
  /* A training forward moves the batch-norm statistics, which are saved too. */
  int64_t xs[4] = {3, 2, 6, 6};
  float *xv = rand_values(3 * 72);
  fl_tensor *x = tensor_of(4, xs, xv);
  const fl_tensor *y;
  assert_ok(fl_model_forward(a, x, true, &y));
  assert_ok(fl_model_save(a, path));
  assert_ok(fl_model_load(b, path));
  float *wa = read_all(fl_model_weights(a)), *wb = read_all(fl_model_weights(b));
  assert_memory_equal(wa, wb, fl_model_num_weights(a) * sizeof(float));
  assert_ok(fl_model_forward(a, x, false, &y));
  float *ya = read_all(y);
  assert_ok(fl_model_forward(b, x, false, &y));
  float *yb = read_all(y);
  assert_memory_equal(ya, yb, 9 * sizeof(float));

  /* Another architecture, a damaged file, a missing one: refused, nothing changed. */
  int64_t in[1] = {4};
  fl_model *c;
  assert_ok(fl_model_create(dev, 1, in, &c));
  assert_ok(fl_model_linear(c, "fc", 2, true));
  assert_ok(fl_model_finish(c, 1));
  assert_fails_with(fl_model_load(c, path), FL_EINVAL, "does not match this model");
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 100, SEEK_SET);
  fputc('!', f);
  fclose(f);
  assert_int_not_equal(fl_model_load(b, path), FL_OK);
  assert_non_null(strstr(fl_last_error(), path));
  float *wb2 = read_all(fl_model_weights(b));
  assert_memory_equal(wa, wb2, fl_model_num_weights(a) * sizeof(float));
  unlink(path);
  assert_int_equal(fl_model_load(b, path), FL_ENOENT);
  free(wa), free(wb), free(wb2), free(ya), free(yb), free(xv);
  fl_tensor_destroy(x);
  fl_model_destroy(a);
  fl_model_destroy(b);
  fl_model_destroy(c);
}

/* A user's training loop over the API alone: two Gaussian blobs, an MLP with dropout, plain
 * SGD on the flat buffers; the loss falls and the accuracy rises. */
static void test_training_loop(void **state) {
  (void)state;
  enum { N = 64, D = 8 };
  float xv[N * D];
  int32_t labels[N];
  for (int i = 0; i < N; i++) {
    labels[i] = i % 2;
    for (int j = 0; j < D; j++) xv[i * D + j] = test_urand_signed(&rng) + (labels[i] ? 1.0f : -1.0f);
  }
  int64_t in[1] = {D}, xs[2] = {N, D};
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc1", 16, true));
  assert_ok(fl_model_relu(m));
  assert_ok(fl_model_dropout(m, 0.1));
  assert_ok(fl_model_linear(m, "fc2", 2, true));
  assert_ok(fl_model_finish(m, 4));
  fl_tensor *x = tensor_of(2, xs, xv);
  size_t nw = fl_model_num_weights(m);
  float *w = malloc(nw * sizeof *w), *g = malloc(nw * sizeof *g);
  double first = 0, last = 0;
  uint64_t correct = 0;
  for (int step = 0; step < 60; step++) {
    const fl_tensor *y;
    double loss;
    fl_model_set_step(m, (uint64_t)step);
    assert_ok(fl_model_zero_grad(m));
    assert_ok(fl_model_forward(m, x, true, &y));
    assert_ok(fl_model_cross_entropy(m, labels, N, 0.0, &loss, NULL));
    assert_ok(fl_model_backward(m));
    assert_ok(fl_tensor_read(fl_model_weights(m), w, nw));
    assert_ok(fl_tensor_read(fl_model_gradients(m), g, nw));
    for (size_t i = 0; i < nw; i++) w[i] -= 0.2f * g[i];
    assert_ok(fl_tensor_write(fl_model_weights(m), w, nw));
    if (step == 0) first = loss;
    last = loss;
  }
  const fl_tensor *y;
  assert_ok(fl_model_forward(m, x, false, &y));
  double loss;
  assert_ok(fl_model_cross_entropy(m, labels, N, 0.0, &loss, &correct));
  assert_true(last < first * 0.5);
  assert_true(correct >= 60);
  free(w), free(g);
  fl_tensor_destroy(x);
  fl_model_destroy(m);
}

/* The public optimizers in a loop of one's own: each lowers the loss of a small classifier,
 * with clipping on; a bad option is named. */
static void test_optimizer_loop(void **state) {
  (void)state;
  enum { N = 48, D = 5 };
  float xv[N * D];
  int32_t labels[N];
  for (int i = 0; i < N; i++) {
    labels[i] = i % 3;
    for (int j = 0; j < D; j++) xv[i * D + j] = 0.3f * test_urand_signed(&rng) + (j == labels[i] ? 1.5f : 0.0f);
  }
  int64_t in[1] = {D}, xs[2] = {N, D};
  static const char *const kinds[] = {"sgd", "adam", "adamw", "lars", "lamb"};
  static const double rates[] = {0.2, 0.02, 0.02, 2.0, 0.05};
  for (size_t k = 0; k < 5; k++) {
    fl_model *m;
    assert_ok(fl_model_create(dev, 1, in, &m));
    assert_ok(fl_model_linear(m, "fc1", 16, true));
    assert_ok(fl_model_layernorm(m, "ln"));
    assert_ok(fl_model_gelu(m));
    assert_ok(fl_model_linear(m, "fc2", 3, true));
    assert_ok(fl_model_finish(m, 5));
    fl_optimizer_options oo = FL_OPTIMIZER_OPTIONS_INIT;
    oo.kind = kinds[k];
    oo.weight_decay = 1e-4;
    fl_optimizer *opt;
    assert_ok(fl_optimizer_create(m, &oo, &opt));
    fl_tensor *x = tensor_of(2, xs, xv);
    double first = 0, last = 0, norm = 0;
    for (int step = 0; step < 40; step++) {
      const fl_tensor *y;
      double loss;
      assert_ok(fl_model_zero_grad(m));
      assert_ok(fl_model_forward(m, x, true, &y));
      assert_ok(fl_model_cross_entropy(m, labels, N, 0.1, &loss, NULL));
      assert_ok(fl_model_backward(m));
      assert_ok(fl_model_clip_grad_norm(m, 5.0, &norm));
      assert_true(isfinite(norm));
      assert_ok(fl_optimizer_step(opt, rates[k]));
      if (step == 0) first = loss;
      last = loss;
    }
    if (!(last < first * 0.7)) fprintf(stderr, "%s: loss %g -> %g\n", kinds[k], first, last);
    assert_true(last < first * 0.7);
    fl_optimizer_destroy(opt);
    fl_tensor_destroy(x);
    fl_model_destroy(m);
  }
  fl_model *m;
  assert_ok(fl_model_create(dev, 1, in, &m));
  assert_ok(fl_model_linear(m, "fc", 3, true));
  fl_optimizer *opt;
  assert_fails_with(fl_optimizer_create(m, NULL, &opt), FL_ESTATE, "not finished");
  assert_ok(fl_model_finish(m, 1));
  fl_optimizer_options bad = FL_OPTIMIZER_OPTIONS_INIT;
  bad.kind = "rmsprop";
  assert_fails_with(fl_optimizer_create(m, &bad, &opt), FL_EINVAL, "rmsprop");
  bad.kind = "sgd";
  bad.momentum = 1.5;
  assert_int_equal(fl_optimizer_create(m, &bad, &opt), FL_EINVAL);
  fl_optimizer_destroy(NULL);
  fl_model_destroy(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shapes_and_names),
      cmocka_unit_test(test_building_errors),
      cmocka_unit_test(test_pytorch_initialisation),
      cmocka_unit_test(test_gradients_match_finite_differences),
      cmocka_unit_test(test_sequence_layers),
      cmocka_unit_test(test_layernorm_values),
      cmocka_unit_test(test_grouped_convolutions),
      cmocka_unit_test(test_losses),
      cmocka_unit_test(test_grad_scaler),
      cmocka_unit_test(test_dropout),
      cmocka_unit_test(test_backward_accumulates),
      cmocka_unit_test(test_micro_batches_match_one_batch),
      cmocka_unit_test(test_save_and_load),
      cmocka_unit_test(test_checkpoint_resume),
      cmocka_unit_test(test_training_loop),
      cmocka_unit_test(test_optimizer_loop),
  };
  return cmocka_run_group_tests(tests, open_device, close_device);
}
