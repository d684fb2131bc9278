/*
 * gpu/nn/layers.c: what every layer of gpu/nn/layers.h shares (creation, the checked forward
 * and backward, destruction) and the layers without spatial structure: linear, relu and
 * flatten. The convolutional layers are gpu/nn/layers_conv.c, the ResNet block
 * gpu/nn/layers_block.c. Every layer calls only device operations, so one implementation
 * serves the cpu and cuda devices.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

/* ---- the common part of every layer ---------------------------------------------------- */

void layer_shape_text(const fl_tensor *t, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < t->ndim && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

fl_status layer_bad_input(const layer *l, const fl_tensor *x, const char *expected) {
  char shape[96];
  layer_shape_text(x, shape, sizeof shape);
  return fl_set_error(FL_EINVAL, "%s %s: input %s, expected %s", l->ops->name, l->name, shape,
                      expected);
}

fl_status layer_new(layer_store *s, const layer_ops *ops, const char *name, size_t size,
                    layer **out) {
  layer *l = common_calloc(1, size);
  if (!l) return FL_ERR(FL_ENOMEM, "creating layer %s: out of memory", name);
  l->ops = ops;
  l->store = s;
  l->first_param = s->nparams;
  snprintf(l->name, sizeof l->name, "%s", name);
  *out = l;
  return FL_OK;
}

/* Ends a layer's creation: its parameters are those registered since layer_new. */
void layer_done(layer *l) { l->nparams = l->store->nparams - l->first_param; }

fl_status layer_forward(layer *l, const fl_tensor *x, bool train, const fl_tensor **y) {
  if (!l || !x) return fl_set_error(FL_EINVAL, "layer_forward: NULL argument");
  if (x->ndim < 1 || x->shape[0] < 1) return layer_bad_input(l, x, "a batch of at least one");
  FL_ASSERT(l->store->finished);
  l->x = x;
  fl_status st = l->ops->forward(l, x, train);
  if (st != FL_OK) {
    l->x = NULL;
    return st;
  }
  if (y) *y = &l->y;
  return FL_OK;
}

fl_status layer_backward(layer *l, const fl_tensor *dy, bool need_dx, const fl_tensor **dx) {
  if (!l || !dy) return fl_set_error(FL_EINVAL, "layer_backward: NULL argument");
  if (!l->x)
    return fl_set_error(FL_ESTATE, "%s %s: backward without a forward", l->ops->name, l->name);
  if (dy->numel != l->y.numel || dy->ndim != l->y.ndim) {
    char got[96], want[96];
    layer_shape_text(dy, got, sizeof got);
    layer_shape_text(&l->y, want, sizeof want);
    return fl_set_error(FL_ESTATE, "%s %s: output gradient %s does not match the output %s",
                        l->ops->name, l->name, got, want);
  }
  fl_status st = l->ops->backward(l, dy, need_dx);
  if (st != FL_OK) return st;
  if (dx) *dx = need_dx ? &l->dx : NULL;
  return FL_OK;
}

void layer_destroy(layer *l) {
  if (!l) return;
  if (l->ops->destroy) l->ops->destroy(l);
  tensor_release(&l->y);
  tensor_release(&l->dx);
  common_free(l);
}

float *layer_param_value(const layer *l, size_t i) {
  FL_ASSERT(i < l->nparams);
  return l->store->params[l->first_param + i].value.data;
}

float *layer_param_grad(const layer *l, size_t i) {
  FL_ASSERT(i < l->nparams);
  return l->store->params[l->first_param + i].grad.data;
}

fl_status layer_ensure_like(layer *l, fl_tensor *t, const fl_tensor *like) {
  return tensor_ensure(t, l->store->dev, like->ndim, like->shape);
}

int layer_out_size(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* ---- linear ---------------------------------------------------------------------------- */

typedef struct linear_layer {
  layer base;
  int in, out;
} linear_layer;

static fl_status linear_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  linear_layer *L = (linear_layer *)l;
  fl_device *dev = l->store->dev;
  if (x->ndim < 2 || x->shape[x->ndim - 1] != L->in) {
    char want[64];
    snprintf(want, sizeof want, "[n, ..., %d]", L->in);
    return layer_bad_input(l, x, want);
  }
  int64_t n = (int64_t)(x->numel / (size_t)L->in); /* rows: every position of every sample */
  int64_t shape[FL_TENSOR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[x->ndim - 1] = L->out;
  fl_status st = tensor_ensure(&l->y, dev, x->ndim, shape);
  if (st != FL_OK) return st;
  /* y[n, out] = x[n, in] W[out, in]^T */
  st = dev->ops->gemm(dev, false, true, (int)n, L->out, L->in, 1.0f, x->data, L->in,
                      layer_param_value(l, 0), L->in, 0.0f, l->y.data, L->out);
  if (st != FL_OK || l->nparams < 2) return st;
  return dev->ops->bias_add_rows(dev, (int)n, L->out, layer_param_value(l, 1), l->y.data);
}

static fl_status linear_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  linear_layer *L = (linear_layer *)l;
  fl_device *dev = l->store->dev;
  int n = (int)(l->x->numel / (size_t)L->in);
  /* dW[out, in] += dy[n, out]^T x[n, in];  db += column sums of dy */
  fl_status st = dev->ops->gemm(dev, true, false, L->out, L->in, n, 1.0f, dy->data, L->out,
                                l->x->data, L->in, 1.0f, layer_param_grad(l, 0), L->in);
  if (st == FL_OK && l->nparams > 1) st = dev->ops->bias_grad_rows(dev, n, L->out, dy->data, layer_param_grad(l, 1));
  if (st != FL_OK || !need_dx) return st;
  st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  /* dx[n, in] = dy[n, out] W[out, in] */
  return dev->ops->gemm(dev, false, false, n, L->in, L->out, 1.0f, dy->data, L->out,
                        layer_param_value(l, 0), L->in, 0.0f, l->dx.data, L->in);
}

static const layer_ops linear_ops = {"linear", linear_forward, linear_backward, NULL};

fl_status layer_linear_create(layer_store *s, const char *name, int in, int out, bool bias, layer **out_l) {
  if (in < 1 || out < 1)
    return fl_set_error(FL_EINVAL, "linear %s: sizes %d -> %d must be positive", name, in, out);
  layer *l = NULL;
  fl_status st = layer_new(s, &linear_ops, name, sizeof(linear_layer), &l);
  if (st != FL_OK) return st;
  linear_layer *L = (linear_layer *)l;
  L->in = in;
  L->out = out;
  size_t idx;
  int64_t wshape[2] = {out, in}, bshape[1] = {out};
  st = layer_store_add_param(s, name, "weight", 2, wshape, LAYER_INIT_WEIGHT, in, &idx);
  if (st == FL_OK && bias) st = layer_store_add_param(s, name, "bias", 1, bshape, LAYER_INIT_BIAS, in, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

/* ---- relu ------------------------------------------------------------------------------ */

static fl_status relu_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  fl_status st = layer_ensure_like(l, &l->y, x);
  if (st != FL_OK) return st;
  return l->store->dev->ops->relu_forward(l->store->dev, x->numel, x->data, l->y.data);
}

static fl_status relu_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  if (!need_dx) return FL_OK;
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  return l->store->dev->ops->relu_backward(l->store->dev, dy->numel, l->y.data, dy->data,
                                           l->dx.data);
}

static const layer_ops relu_ops = {"relu", relu_forward, relu_backward, NULL};

fl_status layer_relu_create(layer_store *s, layer **out_l) {
  fl_status st = layer_new(s, &relu_ops, "relu", sizeof(layer), out_l);
  if (st == FL_OK) layer_done(*out_l);
  return st;
}

/* ---- flatten --------------------------------------------------------------------------- */

static fl_status flatten_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  int64_t shape[2] = {x->shape[0], (int64_t)(x->numel / (size_t)x->shape[0])};
  /* A view: the next layer reads its input and never writes it. */
  return tensor_view((fl_tensor *)x, 0, 2, shape, &l->y);
}

static fl_status flatten_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  if (!need_dx) return FL_OK;
  return tensor_view((fl_tensor *)dy, 0, l->x->ndim, l->x->shape, &l->dx);
}

static const layer_ops flatten_ops = {"flatten", flatten_forward, flatten_backward, NULL};

fl_status layer_flatten_create(layer_store *s, layer **out_l) {
  fl_status st = layer_new(s, &flatten_ops, "flatten", sizeof(layer), out_l);
  if (st == FL_OK) layer_done(*out_l);
  return st;
}

/* ---- gelu ------------------------------------------------------------------------------ */

static fl_status gelu_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  fl_status st = layer_ensure_like(l, &l->y, x);
  if (st != FL_OK) return st;
  return l->store->dev->ops->gelu_forward(l->store->dev, x->numel, x->data, l->y.data);
}

static fl_status gelu_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  if (!need_dx) return FL_OK;
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  return l->store->dev->ops->gelu_backward(l->store->dev, dy->numel, l->x->data, dy->data, l->dx.data);
}

static const layer_ops gelu_ops = {"gelu", gelu_forward, gelu_backward, NULL};

fl_status layer_gelu_create(layer_store *s, layer **out_l) {
  fl_status st = layer_new(s, &gelu_ops, "gelu", sizeof(layer), out_l);
  if (st == FL_OK) layer_done(*out_l);
  return st;
}

/* ---- dropout --------------------------------------------------------------------------- */

typedef struct dropout_layer {
  layer base;
  float p;
  uint64_t key;
  bool dropped; /* the last forward applied a mask (training with p > 0) */
} dropout_layer;

/* The mask's seed for the current step: the store's seed, step and the layer's key mixed. */
static uint64_t dropout_seed(const dropout_layer *D) {
  const layer_store *s = D->base.store;
  return dropout_mix(dropout_mix(s->seed ^ 0x64726f706f7574ull /* "dropout" */) ^ s->step) ^ D->key;
}

static fl_status dropout_forward_(layer *l, const fl_tensor *x, bool train) {
  dropout_layer *D = (dropout_layer *)l;
  fl_device *dev = l->store->dev;
  fl_status st = layer_ensure_like(l, &l->y, x);
  if (st != FL_OK) return st;
  D->dropped = train && D->p > 0.0f;
  if (!D->dropped) return dev->ops->copy(dev, l->y.data, x->data, x->numel * sizeof(float));
  int n = (int)x->shape[0], cols = (int)(x->numel / (size_t)n);
  return dev->ops->dropout_forward(dev, n, 1, cols, 0, 0, 1, D->p, dropout_seed(D), x->data, l->y.data);
}

static fl_status dropout_backward_(layer *l, const fl_tensor *dy, bool need_dx) {
  dropout_layer *D = (dropout_layer *)l;
  fl_device *dev = l->store->dev;
  if (!need_dx) return FL_OK;
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  if (!D->dropped) return dev->ops->copy(dev, l->dx.data, dy->data, dy->numel * sizeof(float));
  int n = (int)dy->shape[0], cols = (int)(dy->numel / (size_t)n);
  return dev->ops->dropout_backward(dev, n, 1, cols, 0, 0, 1, D->p, dropout_seed(D), dy->data, l->dx.data);
}

static const layer_ops dropout_ops = {"dropout", dropout_forward_, dropout_backward_, NULL};

fl_status layer_dropout_create(layer_store *s, float p, uint64_t key, layer **out_l) {
  if (!(p >= 0.0f && p < 1.0f))
    return fl_set_error(FL_EINVAL, "dropout: probability %g must be in [0, 1)", (double)p);
  fl_status st = layer_new(s, &dropout_ops, "dropout", sizeof(dropout_layer), out_l);
  if (st != FL_OK) return st;
  dropout_layer *D = (dropout_layer *)*out_l;
  D->p = p;
  D->key = key;
  layer_done(*out_l);
  return FL_OK;
}
