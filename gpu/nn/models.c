/*
 * gpu/nn/models.c: flint's built-in models (MLP, a small CNN, ResNet-18), defined through the
 * public model API of include/flint/train.h like any user's model.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"


fl_status nn_model_kind_parse(const char *text, nn_model_kind *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "nn_model_kind_parse: NULL argument");
  for (int k = NN_MLP; k <= NN_RESNET50; k++)
    if (k != NN_LIBRARY && strcmp(text, nn_model_kind_name((nn_model_kind)k)) == 0) {
      *out = (nn_model_kind)k;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown model '%s' (expected mlp, cnn, resnet18, resnet50 or transformer)", text);
}

const char *nn_model_kind_name(nn_model_kind kind) {
  switch (kind) {
  case NN_MLP: return "mlp";
  case NN_CNN: return "cnn";
  case NN_RESNET18: return "resnet18";
  case NN_TRANSFORMER: return "transformer";
  case NN_LIBRARY: return "library";
  case NN_RESNET50: return "resnet50";
  }
  return "unknown";
}

/* The layers of the built-in models, appended through include/flint/train.h as a user's
 * model would be. */
#define ADD(call) FL_CHECK(call)

static fl_status build_mlp(nn_model *m, const nn_model_spec *sp) {
  int h = sp->hidden ? sp->hidden : 256;
  if (h < 1) return fl_set_error(FL_EINVAL, "mlp: hidden width %d must be positive", h);
  fl_status status = FL_OK;
  ADD(fl_model_flatten(m));
  ADD(fl_model_linear(m, "fc1", h, true));
  ADD(fl_model_relu(m));
  ADD(fl_model_linear(m, "fc2", h, true));
  ADD(fl_model_relu(m));
  ADD(fl_model_linear(m, "fc3", sp->classes, true));
cleanup:
  return status;
}

/* conv3x3 32 - bn - relu - maxpool2 - conv3x3 64 - bn - relu - maxpool2 - [avgpool] - fc 128 -
 * relu - fc classes. Batch norm (per-rank statistics, as Goyal et al.) is what lets the
 * linear scaling rule's large rates train it: without it, batch 8192 at 32x the rate of
 * batch 256 diverged on Fashion-MNIST (measured on an H100, docs/gpu.md). For large images
 * (224x224) the feature map after the two pools is averaged down to about 7x7 first, so that
 * fc1 stays at a few thousand inputs instead of 200000. */
static fl_status build_cnn(nn_model *m, const nn_model_spec *sp) {
  if (sp->height < 4 || sp->width < 4)
    return fl_set_error(FL_EINVAL, "cnn: a %dx%d image is too small for its two 2x2 poolings "
                        "(at least 4x4)", sp->height, sp->width);
  int fh = sp->height / 2 / 2, fw = sp->width / 2 / 2;
  int shrink = (fh < fw ? fh : fw) / 7;
  fl_status status = FL_OK;
  const fl_conv2d_options conv1 = {.out_channels = 32, .kernel = 3, .padding = 1};
  const fl_conv2d_options conv2 = {.out_channels = 64, .kernel = 3, .padding = 1};
  ADD(fl_model_conv2d(m, "conv1", &conv1));
  ADD(fl_model_batchnorm(m, "bn1", false));
  ADD(fl_model_relu(m));
  ADD(fl_model_maxpool(m, 2, 2, 0));
  ADD(fl_model_conv2d(m, "conv2", &conv2));
  ADD(fl_model_batchnorm(m, "bn2", false));
  ADD(fl_model_relu(m));
  ADD(fl_model_maxpool(m, 2, 2, 0));
  if (shrink >= 2) ADD(fl_model_avgpool(m, shrink, shrink, 0));
  ADD(fl_model_flatten(m));
  ADD(fl_model_linear(m, "fc1", 128, true));
  ADD(fl_model_relu(m));
  ADD(fl_model_linear(m, "fc2", sp->classes, true));
cleanup:
  return status;
}

static int conv_out(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* One convolution of a residual block's main path: its kernel, output channels and stride. */
typedef struct block_conv {
  int kernel, out_c, stride;
} block_conv;

/* A ResNet block: convK-bnK(-relu) for each of the convs (no relu after the last), plus the
 * shortcut: the identity, or a 1x1 convolution with `stride` and batch norm (torchvision's
 * downsample.0, .1) when the shape changes; then relu. zero_gamma: the last batch norm starts
 * at gamma 0 (Goyal et al.: each block starts as the identity, which lets the large-batch
 * recipe's high rates train from the start). Parameters as torchvision names them. */
static fl_status resnet_block(nn_model *m, const char *name, int in_c, int stride, const block_conv *convs, int n,
                              bool zero_gamma) {
  char sub[96];
#define SUB(fmt, i) (snprintf(sub, sizeof sub, fmt, name, i), sub)
  fl_status status = FL_OK;
  int out_c = convs[n - 1].out_c;
  ADD(fl_model_residual_begin(m, name));
  for (int i = 0; i < n; i++) {
    const fl_conv2d_options conv = {.out_channels = convs[i].out_c, .kernel = convs[i].kernel,
                                    .stride = convs[i].stride, .padding = convs[i].kernel / 2};
    ADD(fl_model_conv2d(m, SUB("%s.conv%d", i + 1), &conv));
    ADD(fl_model_batchnorm(m, SUB("%s.bn%d", i + 1), zero_gamma && i == n - 1));
    if (i < n - 1) ADD(fl_model_relu(m));
  }
  if (stride != 1 || in_c != out_c) {
    const fl_conv2d_options down = {.out_channels = out_c, .kernel = 1, .stride = stride};
    ADD(fl_model_residual_shortcut(m));
    ADD(fl_model_conv2d(m, SUB("%s.downsample.%d", 0), &down));
    ADD(fl_model_batchnorm(m, SUB("%s.downsample.%d", 1), false));
  }
  ADD(fl_model_residual_end(m));
  ADD(fl_model_relu(m));
#undef SUB
cleanup:
  return status;
}

/* The stem of both ResNets: images up to 64 pixels a side (28x28 Fashion-MNIST, 32x32 CIFAR)
 * get a 3x3 stride-1 convolution without max pooling, as is usual for them; larger ones the
 * ImageNet stem (7x7/2 convolution, 3x3/2 max pool). Weights He-normal, as torchvision
 * initialises its ResNets. */
static fl_status resnet_stem(nn_model *m, const nn_model_spec *sp, int w) {
  bool large = sp->height > 64 && sp->width > 64;
  nn_model_set_init_style(m, LAYER_INIT_STYLE_HE);
  fl_status status = FL_OK;
  const fl_conv2d_options stem_large = {.out_channels = w, .kernel = 7, .stride = 2, .padding = 3};
  const fl_conv2d_options stem_small = {.out_channels = w, .kernel = 3, .padding = 1};
  ADD(fl_model_conv2d(m, "conv1", large ? &stem_large : &stem_small));
  ADD(fl_model_batchnorm(m, "bn1", false));
  ADD(fl_model_relu(m));
  if (large) ADD(fl_model_maxpool(m, 3, 2, 1));
cleanup:
  return status;
}

/* ResNet-18: the stem, four stages of two basic blocks (3x3, 3x3; widths w, 2w, 4w, 8w; the
 * last three halve the resolution), global average pooling and a linear classifier. */
static fl_status build_resnet18(nn_model *m, const nn_model_spec *sp) {
  int w = sp->width_mult ? sp->width_mult : 64;
  if (w < 1) return fl_set_error(FL_EINVAL, "resnet18: width_mult %d must be positive", w);
  bool large = sp->height > 64 && sp->width > 64;
  int h = sp->height, wd = sp->width;
  if (large) {
    h = conv_out(conv_out(h, 7, 2, 3), 3, 2, 1);
    wd = conv_out(conv_out(wd, 7, 2, 3), 3, 2, 1);
  }
  for (int stage = 1; stage < 4; stage++) {
    h = conv_out(h, 3, 2, 1);
    wd = conv_out(wd, 3, 2, 1);
  }
  if (sp->height < 8 || sp->width < 8 || h < 1 || wd < 1)
    return fl_set_error(FL_EINVAL, "resnet18: a %dx%d image is too small for its downsampling "
                        "(at least 8x8)", sp->height, sp->width);
  fl_status status = FL_OK;
  ADD(resnet_stem(m, sp, w));
  int in_c = w;
  for (int stage = 0; stage < 4; stage++) {
    int out_c = w << stage;
    for (int b = 0; b < 2; b++) {
      char name[32];
      snprintf(name, sizeof name, "layer%d.%d", stage + 1, b);
      int stride = stage > 0 && b == 0 ? 2 : 1;
      const block_conv convs[2] = {{3, out_c, stride}, {3, out_c, 1}};
      ADD(resnet_block(m, name, in_c, stride, convs, 2, false));
      in_c = out_c;
    }
  }
  ADD(fl_model_global_avgpool(m));
  ADD(fl_model_linear(m, "fc", sp->classes, true));
cleanup:
  return status;
}

/* ResNet-50: the stem, then stages of 3, 4, 6 and 3 bottleneck blocks (1x1 reduce to width,
 * 3x3 with the stride as torchvision's "ResNet v1.5", 1x1 expand to 4 x width; widths w, 2w,
 * 4w, 8w) whose last batch norm starts at gamma 0, global average pooling and a linear
 * classifier. */
static fl_status build_resnet50(nn_model *m, const nn_model_spec *sp) {
  int w = sp->width_mult ? sp->width_mult : 64;
  if (w < 1) return fl_set_error(FL_EINVAL, "resnet50: width_mult %d must be positive", w);
  if (sp->height < 8 || sp->width < 8)
    return fl_set_error(FL_EINVAL, "resnet50: a %dx%d image is too small for its downsampling (at least 8x8)",
                        sp->height, sp->width);
  fl_status status = FL_OK;
  ADD(resnet_stem(m, sp, w));
  static const int blocks[4] = {3, 4, 6, 3};
  int in_c = w;
  for (int stage = 0; stage < 4; stage++) {
    int width = w << stage;
    for (int b = 0; b < blocks[stage]; b++) {
      char name[32];
      snprintf(name, sizeof name, "layer%d.%d", stage + 1, b);
      int stride = stage > 0 && b == 0 ? 2 : 1;
      const block_conv convs[3] = {{1, width, 1}, {3, width, stride}, {1, 4 * width, 1}};
      ADD(resnet_block(m, name, in_c, stride, convs, 3, true));
      in_c = 4 * width;
    }
  }
  ADD(fl_model_global_avgpool(m));
  ADD(fl_model_linear(m, "fc", sp->classes, true));
cleanup:
  return status;
}

#undef ADD

fl_status nn_model_create(fl_device *dev, const nn_model_spec *spec, nn_model **out) {
  if (!dev || !spec || !out) return fl_set_error(FL_EINVAL, "nn_model_create: NULL argument");
  if (spec->kind == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "nn_model_create: the transformer is built in chunks "
                        "(tfm_chunk_create in gpu/parallel/transformer.h)");
  if (spec->kind == NN_LIBRARY)
    return fl_set_error(FL_EINVAL, "nn_model_create: a library's model is built by its builder "
                        "(train_model_build in gpu/parallel/train_model.c)");
  if (spec->kind != NN_MLP && spec->kind != NN_CNN && spec->kind != NN_RESNET18 && spec->kind != NN_RESNET50)
    return fl_set_error(FL_EINVAL, "nn_model_create: unknown model kind %d", (int)spec->kind);
  const char *kind = nn_model_kind_name(spec->kind);
  if (spec->channels < 1 || spec->height < 1 || spec->width < 1)
    return fl_set_error(FL_EINVAL, "%s: input %dx%dx%d must have positive sizes", kind,
                        spec->channels, spec->height, spec->width);
  if (spec->classes < 1)
    return fl_set_error(FL_EINVAL, "%s: %d classes (at least 1)", kind, spec->classes);
  if (spec->hidden < 0 || spec->width_mult < 0)
    return fl_set_error(FL_EINVAL, "%s: negative hidden (%d) or width_mult (%d)", kind,
                        spec->hidden, spec->width_mult);
  int64_t shape[3] = {spec->channels, spec->height, spec->width};
  nn_model *m = NULL;
  fl_status status = FL_OK;
  FL_CHECK(fl_model_create(dev, 3, shape, &m));
  switch (spec->kind) {
  case NN_MLP: FL_CHECK(build_mlp(m, spec)); break;
  case NN_CNN: FL_CHECK(build_cnn(m, spec)); break;
  case NN_RESNET18: FL_CHECK(build_resnet18(m, spec)); break;
  case NN_RESNET50: FL_CHECK(build_resnet50(m, spec)); break;
  case NN_TRANSFORMER:
  case NN_LIBRARY: break; /* refused above */
  }
  FL_CHECK(fl_model_finish(m, spec->seed));
  *out = m;
  return FL_OK;
cleanup:
  fl_model_destroy(m);
  return status;
}

void nn_model_destroy(nn_model *m) { fl_model_destroy(m); }

