/*
 * gpu/nn/models.c: the models of gpu/nn/nn.h (MLP, a small CNN, ResNet-18) as sequences of the
 * layers in gpu/nn/layers.h over one parameter store, so that all weights, all gradients and
 * all batch-norm statistics are three flat buffers.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

#define NN_MAX_LAYERS 32

struct nn_model {
  fl_device *dev;
  nn_model_spec spec;
  layer_store store;
  layer *layers[NN_MAX_LAYERS];
  size_t nlayers;
  const fl_tensor *logits; /* of the last forward; NULL before one */
  fl_tensor dlogits;
  bool have_loss; /* dlogits belong to the last forward */
};

fl_status nn_model_kind_parse(const char *text, nn_model_kind *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "nn_model_kind_parse: NULL argument");
  for (int k = NN_MLP; k <= NN_TRANSFORMER; k++)
    if (strcmp(text, nn_model_kind_name((nn_model_kind)k)) == 0) {
      *out = (nn_model_kind)k;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown model '%s' (expected mlp, cnn, resnet18 or transformer)", text);
}

const char *nn_model_kind_name(nn_model_kind kind) {
  switch (kind) {
  case NN_MLP: return "mlp";
  case NN_CNN: return "cnn";
  case NN_RESNET18: return "resnet18";
  case NN_TRANSFORMER: return "transformer";
  }
  return "unknown";
}

/* Appends a layer made by `call`, which writes it to *slot. */
#define ADD(call)                                                                            \
  do {                                                                                       \
    FL_ASSERT(m->nlayers < NN_MAX_LAYERS);                                                   \
    layer **slot = &m->layers[m->nlayers];                                                   \
    FL_CHECK(call);                                                                          \
    m->nlayers++;                                                                            \
  } while (0)

static fl_status build_mlp(nn_model *m) {
  const nn_model_spec *sp = &m->spec;
  layer_store *s = &m->store;
  int in = sp->channels * sp->height * sp->width, h = sp->hidden ? sp->hidden : 256;
  if (h < 1) return fl_set_error(FL_EINVAL, "mlp: hidden width %d must be positive", h);
  fl_status status = FL_OK;
  ADD(layer_flatten_create(s, slot));
  ADD(layer_linear_create(s, "fc1", in, h, slot));
  ADD(layer_relu_create(s, slot));
  ADD(layer_linear_create(s, "fc2", h, h, slot));
  ADD(layer_relu_create(s, slot));
  ADD(layer_linear_create(s, "fc3", h, sp->classes, slot));
cleanup:
  return status;
}

/* conv3x3 32 - bn - relu - maxpool2 - conv3x3 64 - bn - relu - maxpool2 - [avgpool] - fc 128 -
 * relu - fc classes. Batch norm (per-rank statistics, as Goyal et al.) is what lets the
 * linear scaling rule's large rates train it: without it, batch 8192 at 32x the rate of
 * batch 256 diverged on Fashion-MNIST (measured on an H100, docs/gpu.md). For large images
 * (224x224) the feature map after the two pools is averaged down to about 7x7 first, so that
 * fc1 stays at a few thousand inputs instead of 200000. */
static fl_status build_cnn(nn_model *m) {
  const nn_model_spec *sp = &m->spec;
  layer_store *s = &m->store;
  if (sp->height < 4 || sp->width < 4)
    return fl_set_error(FL_EINVAL, "cnn: a %dx%d image is too small for its two 2x2 poolings "
                        "(at least 4x4)", sp->height, sp->width);
  int fh = sp->height / 2 / 2, fw = sp->width / 2 / 2;
  int shrink = (fh < fw ? fh : fw) / 7;
  fl_status status = FL_OK;
  ADD(layer_conv2d_create(s, "conv1", sp->channels, 32, 3, 1, 1, false, slot));
  ADD(layer_batchnorm_create(s, "bn1", 32, slot));
  ADD(layer_relu_create(s, slot));
  ADD(layer_maxpool_create(s, 2, 2, 0, slot));
  ADD(layer_conv2d_create(s, "conv2", 32, 64, 3, 1, 1, false, slot));
  ADD(layer_batchnorm_create(s, "bn2", 64, slot));
  ADD(layer_relu_create(s, slot));
  ADD(layer_maxpool_create(s, 2, 2, 0, slot));
  if (shrink >= 2) {
    ADD(layer_avgpool_create(s, shrink, shrink, 0, slot));
    fh /= shrink;
    fw /= shrink;
  }
  ADD(layer_flatten_create(s, slot));
  ADD(layer_linear_create(s, "fc1", 64 * fh * fw, 128, slot));
  ADD(layer_relu_create(s, slot));
  ADD(layer_linear_create(s, "fc2", 128, sp->classes, slot));
cleanup:
  return status;
}

static int conv_out(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* ResNet-18: a stem, four stages of two basic blocks (widths w, 2w, 4w, 8w; the last three
 * halve the resolution), global average pooling and a linear classifier. Images up to 64
 * pixels a side (28x28 Fashion-MNIST, 32x32 CIFAR) get a 3x3 stride-1 stem without max
 * pooling, as is usual for them; larger ones the ImageNet stem (7x7/2 conv, 3x3/2 max pool). */
static fl_status build_resnet18(nn_model *m) {
  const nn_model_spec *sp = &m->spec;
  layer_store *s = &m->store;
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
  if (large) {
    ADD(layer_conv2d_create(s, "conv1", sp->channels, w, 7, 2, 3, false, slot));
  } else {
    ADD(layer_conv2d_create(s, "conv1", sp->channels, w, 3, 1, 1, false, slot));
  }
  ADD(layer_batchnorm_create(s, "bn1", w, slot));
  ADD(layer_relu_create(s, slot));
  if (large) ADD(layer_maxpool_create(s, 3, 2, 1, slot));
  int in_c = w;
  for (int stage = 0; stage < 4; stage++) {
    int out_c = w << stage;
    for (int b = 0; b < 2; b++) {
      char name[32];
      snprintf(name, sizeof name, "layer%d.%d", stage + 1, b);
      int stride = stage > 0 && b == 0 ? 2 : 1;
      ADD(layer_basic_block_create(s, name, in_c, out_c, stride, slot));
      in_c = out_c;
    }
  }
  ADD(layer_global_avgpool_create(s, slot));
  ADD(layer_linear_create(s, "fc", in_c, sp->classes, slot));
cleanup:
  return status;
}

#undef ADD

fl_status nn_model_create(fl_device *dev, const nn_model_spec *spec, nn_model **out) {
  if (!dev || !spec || !out) return fl_set_error(FL_EINVAL, "nn_model_create: NULL argument");
  if (spec->kind == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "nn_model_create: the transformer is built in chunks "
                        "(tfm_chunk_create in gpu/parallel/transformer.h)");
  if (spec->kind != NN_MLP && spec->kind != NN_CNN && spec->kind != NN_RESNET18)
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
  nn_model *m = common_calloc(1, sizeof *m);
  if (!m) return FL_ERR(FL_ENOMEM, "nn_model_create: out of memory");
  m->dev = dev;
  m->spec = *spec;
  layer_store_init(&m->store, dev);
  fl_status status = FL_OK;
  switch (spec->kind) {
  case NN_MLP: FL_CHECK(build_mlp(m)); break;
  case NN_CNN: FL_CHECK(build_cnn(m)); break;
  case NN_RESNET18: FL_CHECK(build_resnet18(m)); break;
  case NN_TRANSFORMER: break; /* refused above */
  }
  FL_CHECK(layer_store_finish(&m->store, spec->seed));
  *out = m;
  return FL_OK;
cleanup:
  nn_model_destroy(m);
  return status;
}

void nn_model_destroy(nn_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nlayers; i++) layer_destroy(m->layers[i]);
  tensor_release(&m->dlogits);
  layer_store_release(&m->store);
  common_free(m);
}

size_t nn_model_param_count(const nn_model *m) { return m->store.nparams; }

nn_param *nn_model_param(nn_model *m, size_t i) {
  return i < m->store.nparams ? &m->store.params[i] : NULL;
}

fl_tensor *nn_model_values(nn_model *m) { return &m->store.values; }
fl_tensor *nn_model_grads(nn_model *m) { return &m->store.grads; }
fl_tensor *nn_model_buffers(nn_model *m) { return &m->store.buffers; }

fl_status nn_model_forward(nn_model *m, const fl_tensor *x, bool train, const fl_tensor **logits) {
  if (!m || !x || !logits) return fl_set_error(FL_EINVAL, "nn_model_forward: NULL argument");
  const nn_model_spec *sp = &m->spec;
  if (x->ndim != 4 || x->shape[0] < 1 || x->shape[1] != sp->channels ||
      x->shape[2] != sp->height || x->shape[3] != sp->width)
    return fl_set_error(FL_EINVAL, "%s: input of %d dimensions [%lld, %lld, %lld, %lld], "
                        "expected [n, %d, %d, %d]", nn_model_kind_name(sp->kind), x->ndim,
                        (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2],
                        (long long)x->shape[3], sp->channels, sp->height, sp->width);
  if (x->dev != m->dev)
    return fl_set_error(FL_EINVAL, "%s: input on device %s, model on %s",
                        nn_model_kind_name(sp->kind), fl_device_name(x->dev), m->dev->name);
  m->logits = NULL;
  m->have_loss = false;
  const fl_tensor *t = x;
  for (size_t i = 0; i < m->nlayers; i++) {
    fl_status st = layer_forward(m->layers[i], t, train, &t);
    if (st != FL_OK) return st;
  }
  m->logits = t;
  *logits = t;
  return FL_OK;
}

fl_status nn_model_loss(nn_model *m, const int32_t *labels, float grad_scale, float *stats) {
  if (!m || !labels || !stats) return fl_set_error(FL_EINVAL, "nn_model_loss: NULL argument");
  if (!m->logits) return fl_set_error(FL_ESTATE, "nn_model_loss: no forward to take the loss of");
  fl_status st = tensor_ensure(&m->dlogits, m->dev, m->logits->ndim, m->logits->shape);
  if (st != FL_OK) return st;
  st = m->dev->ops->softmax_xent(m->dev, (int)m->logits->shape[0], (int)m->logits->shape[1],
                                 m->logits->data, labels, grad_scale, m->dlogits.data, stats);
  if (st != FL_OK) return st;
  m->have_loss = true;
  return FL_OK;
}

fl_status nn_model_backward(nn_model *m, nn_grads_ready_fn ready, void *user) {
  if (!m) return fl_set_error(FL_EINVAL, "nn_model_backward: model is NULL");
  if (!m->have_loss)
    return fl_set_error(FL_ESTATE, "nn_model_backward: no loss since the last forward "
                        "(call nn_model_loss first)");
  /* Layers before the first one with parameters (a flatten) need no backward at all, and
   * the first one with parameters needs no input gradient. */
  size_t first = 0;
  while (first < m->nlayers && m->layers[first]->nparams == 0) first++;
  const fl_tensor *dy = &m->dlogits;
  for (size_t i = m->nlayers; i-- > first;) {
    layer *l = m->layers[i];
    fl_status st = layer_backward(l, dy, i > first, &dy);
    if (st != FL_OK) return st;
    if (ready && l->nparams) {
      st = ready(l->first_param, l->nparams, user);
      if (st != FL_OK) return st;
    }
  }
  return FL_OK;
}

fl_status nn_model_zero_grad(nn_model *m) {
  if (!m) return fl_set_error(FL_EINVAL, "nn_model_zero_grad: model is NULL");
  if (!m->store.nvalues) return FL_OK;
  return m->dev->ops->memset0(m->dev, m->store.grads.data, m->store.nvalues * sizeof(float));
}
