/*
 * gpu/nn/layers.c: the parameter store and the layers of gpu/nn/layers.h (linear, relu, conv2d by
 * im2col + GEMM, max/average/global-average pooling, batch norm, flatten and the ResNet
 * basic block). Every layer calls only device operations, so one implementation serves the
 * cpu and cuda devices.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

/* ---- the parameter store --------------------------------------------------------------- */

void layer_store_init(layer_store *s, fl_device *dev) {
  *s = (layer_store){0};
  s->dev = dev;
}

void layer_store_release(layer_store *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nparams; i++) common_free((char *)s->params[i].name);
  common_free(s->params);
  common_free(s->info);
  common_free(s->buffer_info);
  tensor_release(&s->values);
  tensor_release(&s->grads);
  tensor_release(&s->buffers);
  tensor_release(&s->work[0]);
  tensor_release(&s->work[1]);
  fl_device *dev = s->dev;
  *s = (layer_store){0};
  s->dev = dev;
}

fl_status layer_store_add_param(layer_store *s, const char *prefix, const char *suffix,
                                int ndim, const int64_t *shape, layer_init init, int fan_in,
                                size_t *index) {
  FL_ASSERT(!s->finished && ndim >= 1 && ndim <= FL_TENSOR_MAX_DIMS);
  if (s->nparams == s->cap_params) {
    size_t cap = s->cap_params ? 2 * s->cap_params : 16;
    nn_param *p = common_realloc(s->params, cap * sizeof *p);
    if (!p) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
    s->params = p;
    layer_param_info *q = common_realloc(s->info, cap * sizeof *q);
    if (!q) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
    s->info = q;
    s->cap_params = cap;
  }
  size_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= (size_t)shape[i];
  char name[128];
  snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", suffix);
  char *copy = common_strdup(name);
  if (!copy) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
  nn_param *p = &s->params[s->nparams];
  *p = (nn_param){0};
  p->name = copy;
  p->offset = s->nvalues;
  /* The shape waits in the value tensor until finish points it at the flat buffer. */
  p->value.ndim = ndim;
  for (int i = 0; i < ndim; i++) p->value.shape[i] = shape[i];
  p->value.numel = numel;
  s->info[s->nparams] = (layer_param_info){init, fan_in};
  s->nvalues += numel;
  *index = s->nparams++;
  return FL_OK;
}

fl_status layer_store_add_buffer(layer_store *s, size_t count, float value, size_t *offset) {
  FL_ASSERT(!s->finished);
  if (s->nbuffer_ranges == s->cap_buffers) {
    size_t cap = s->cap_buffers ? 2 * s->cap_buffers : 8;
    layer_buffer_info *b = common_realloc(s->buffer_info, cap * sizeof *b);
    if (!b) return FL_ERR(FL_ENOMEM, "layer_store_add_buffer: out of memory");
    s->buffer_info = b;
    s->cap_buffers = cap;
  }
  s->buffer_info[s->nbuffer_ranges++] = (layer_buffer_info){s->nbuffers, count, value};
  *offset = s->nbuffers;
  s->nbuffers += count;
  return FL_OK;
}

/* splitmix64: a tiny generator with a 64-bit state that is enough for initial weights and is
 * the same on every platform, so that every rank draws the same model from the same seed. */
static uint64_t splitmix64_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so that log() in Box-Muller is finite. */
static double uniform_open(uint64_t *state) {
  return ((double)(splitmix64_next(state) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal01(uint64_t *state) {
  double u1 = uniform_open(state), u2 = uniform_open(state);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

fl_status layer_store_finish(layer_store *s, uint64_t seed) {
  FL_ASSERT(!s->finished);
  fl_status status = FL_OK;
  float *host = NULL;
  int64_t nv[1] = {(int64_t)s->nvalues}, nb[1] = {(int64_t)s->nbuffers};
  FL_CHECK(tensor_ensure(&s->values, s->dev, 1, nv));
  FL_CHECK(tensor_ensure(&s->grads, s->dev, 1, nv));
  FL_CHECK(tensor_ensure(&s->buffers, s->dev, 1, nb));
  size_t most = s->nvalues > s->nbuffers ? s->nvalues : s->nbuffers;
  host = common_malloc((most ? most : 1) * sizeof *host);
  if (!host) FL_CHECK(FL_ERR(FL_ENOMEM, "layer_store_finish: out of memory for %zu weights", most));

  uint64_t state = seed;
  for (size_t i = 0; i < s->nparams; i++) {
    nn_param *p = &s->params[i];
    int ndim = p->value.ndim;
    int64_t shape[FL_TENSOR_MAX_DIMS];
    memcpy(shape, p->value.shape, sizeof shape);
    FL_CHECK(tensor_view(&s->values, p->offset, ndim, shape, &p->value));
    FL_CHECK(tensor_view(&s->grads, p->offset, ndim, shape, &p->grad));
    float *w = host + p->offset;
    layer_param_info info = s->info[i];
    double std = info.init == LAYER_INIT_HE ? sqrt(2.0 / (info.fan_in > 0 ? info.fan_in : 1)) : 0;
    for (size_t j = 0; j < p->value.numel; j++)
      w[j] = info.init == LAYER_INIT_HE ? (float)(std * normal01(&state))
                                        : info.init == LAYER_INIT_ONE ? 1.0f : 0.0f;
  }
  if (s->nvalues) {
    FL_CHECK(s->dev->ops->from_host(s->dev, s->values.data, host, s->nvalues * sizeof *host));
    FL_CHECK(s->dev->ops->memset0(s->dev, s->grads.data, s->nvalues * sizeof(float)));
  }
  for (size_t r = 0; r < s->nbuffer_ranges; r++) {
    layer_buffer_info b = s->buffer_info[r];
    for (size_t j = 0; j < b.count; j++) host[b.offset + j] = b.value;
  }
  if (s->nbuffers)
    FL_CHECK(s->dev->ops->from_host(s->dev, s->buffers.data, host, s->nbuffers * sizeof *host));
  s->finished = true;
cleanup:
  common_free(host);
  return status;
}

/* ---- the common part of every layer ---------------------------------------------------- */

void layer_shape_text(const fl_tensor *t, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[");
  for (int i = 0; i < t->ndim && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

static fl_status bad_input(const layer *l, const fl_tensor *x, const char *expected) {
  char shape[96];
  layer_shape_text(x, shape, sizeof shape);
  return fl_set_error(FL_EINVAL, "%s %s: input %s, expected %s", l->ops->name, l->name, shape,
                      expected);
}

static fl_status layer_new(layer_store *s, const layer_ops *ops, const char *name, size_t size,
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
static void layer_done(layer *l) { l->nparams = l->store->nparams - l->first_param; }

fl_status layer_forward(layer *l, const fl_tensor *x, bool train, const fl_tensor **y) {
  if (!l || !x) return fl_set_error(FL_EINVAL, "layer_forward: NULL argument");
  if (x->ndim < 1 || x->shape[0] < 1) return bad_input(l, x, "a batch of at least one");
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

static fl_status ensure_like(layer *l, fl_tensor *t, const fl_tensor *like) {
  return tensor_ensure(t, l->store->dev, like->ndim, like->shape);
}

static int out_size(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* ---- linear ---------------------------------------------------------------------------- */

typedef struct linear_layer {
  layer base;
  int in, out;
} linear_layer;

static fl_status linear_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  linear_layer *L = (linear_layer *)l;
  fl_device *dev = l->store->dev;
  int64_t n = x->shape[0];
  if (x->numel != (size_t)n * (size_t)L->in) {
    char want[64];
    snprintf(want, sizeof want, "%d features a row", L->in);
    return bad_input(l, x, want);
  }
  int64_t shape[2] = {n, L->out};
  fl_status st = tensor_ensure(&l->y, dev, 2, shape);
  if (st != FL_OK) return st;
  /* y[n, out] = x[n, in] W[out, in]^T */
  st = dev->ops->gemm(dev, false, true, (int)n, L->out, L->in, 1.0f, x->data, L->in,
                      layer_param_value(l, 0), L->in, 0.0f, l->y.data, L->out);
  if (st != FL_OK) return st;
  return dev->ops->bias_add_rows(dev, (int)n, L->out, layer_param_value(l, 1), l->y.data);
}

static fl_status linear_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  linear_layer *L = (linear_layer *)l;
  fl_device *dev = l->store->dev;
  int n = (int)l->x->shape[0];
  /* dW[out, in] += dy[n, out]^T x[n, in];  db += column sums of dy */
  fl_status st = dev->ops->gemm(dev, true, false, L->out, L->in, n, 1.0f, dy->data, L->out,
                                l->x->data, L->in, 1.0f, layer_param_grad(l, 0), L->in);
  if (st == FL_OK) st = dev->ops->bias_grad_rows(dev, n, L->out, dy->data, layer_param_grad(l, 1));
  if (st != FL_OK || !need_dx) return st;
  st = ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  /* dx[n, in] = dy[n, out] W[out, in] */
  return dev->ops->gemm(dev, false, false, n, L->in, L->out, 1.0f, dy->data, L->out,
                        layer_param_value(l, 0), L->in, 0.0f, l->dx.data, L->in);
}

static const layer_ops linear_ops = {"linear", linear_forward, linear_backward, NULL};

fl_status layer_linear_create(layer_store *s, const char *name, int in, int out, layer **out_l) {
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
  st = layer_store_add_param(s, name, "weight", 2, wshape, LAYER_INIT_HE, in, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "bias", 1, bshape, LAYER_INIT_ZERO, 0, &idx);
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
  fl_status st = ensure_like(l, &l->y, x);
  if (st != FL_OK) return st;
  return l->store->dev->ops->relu_forward(l->store->dev, x->numel, x->data, l->y.data);
}

static fl_status relu_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  if (!need_dx) return FL_OK;
  fl_status st = ensure_like(l, &l->dx, l->x);
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

/* ---- conv2d ---------------------------------------------------------------------------- */

typedef struct conv_layer {
  layer base;
  int in_c, out_c, k, stride, pad;
  bool bias;
  int n, h, w, oh, ow; /* of the last forward */
} conv_layer;

static fl_status conv_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  conv_layer *C = (conv_layer *)l;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  if (x->ndim != 4 || x->shape[1] != C->in_c || x->shape[2] + 2 * C->pad < C->k ||
      x->shape[3] + 2 * C->pad < C->k) {
    char want[96];
    int least = C->k - 2 * C->pad > 1 ? C->k - 2 * C->pad : 1;
    snprintf(want, sizeof want, "[n, %d, h, w] with h, w >= %d", C->in_c, least);
    return bad_input(l, x, want);
  }
  C->n = (int)x->shape[0];
  C->h = (int)x->shape[2];
  C->w = (int)x->shape[3];
  C->oh = out_size(C->h, C->k, C->stride, C->pad);
  C->ow = out_size(C->w, C->k, C->stride, C->pad);
  int kk = C->in_c * C->k * C->k, p = C->n * C->oh * C->ow;
  int64_t col_shape[2] = {kk, p}, yt_shape[2] = {C->out_c, p};
  int64_t y_shape[4] = {C->n, C->out_c, C->oh, C->ow};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  FL_CHECK(tensor_ensure(&s->work[1], dev, 2, yt_shape));
  FL_CHECK(tensor_ensure(&l->y, dev, 4, y_shape));
  FL_CHECK(dev->ops->im2col(dev, C->n, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                            x->data, s->work[0].data));
  /* Y'[out_c, n*oh*ow] = W[out_c, kk] col[kk, n*oh*ow], then NCHW by swapping n and c. */
  FL_CHECK(dev->ops->gemm(dev, false, false, C->out_c, p, kk, 1.0f, layer_param_value(l, 0),
                          kk, s->work[0].data, p, 0.0f, s->work[1].data, p));
  FL_CHECK(dev->ops->swap01(dev, C->out_c, C->n, C->oh * C->ow, s->work[1].data, l->y.data));
  if (C->bias)
    FL_CHECK(dev->ops->bias_add_channels(dev, C->n, C->out_c, C->oh * C->ow,
                                         layer_param_value(l, 1), l->y.data));
cleanup:
  return status;
}

static fl_status conv_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  conv_layer *C = (conv_layer *)l;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  int kk = C->in_c * C->k * C->k, p = C->n * C->oh * C->ow;
  int64_t col_shape[2] = {kk, p}, yt_shape[2] = {C->out_c, p};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  FL_CHECK(tensor_ensure(&s->work[1], dev, 2, yt_shape));
  /* dY'[out_c, n*oh*ow] from dy NCHW. */
  FL_CHECK(dev->ops->swap01(dev, C->n, C->out_c, C->oh * C->ow, dy->data, s->work[1].data));
  if (C->bias)
    FL_CHECK(dev->ops->bias_grad_channels(dev, C->n, C->out_c, C->oh * C->ow, dy->data,
                                          layer_param_grad(l, 1)));
  /* The columns are recomputed: the scratch is shared by every convolution of the model,
   * which costs an im2col but keeps one column buffer instead of one per layer. */
  FL_CHECK(dev->ops->im2col(dev, C->n, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                            l->x->data, s->work[0].data));
  /* dW[out_c, kk] += dY'[out_c, p] col[kk, p]^T */
  FL_CHECK(dev->ops->gemm(dev, false, true, C->out_c, kk, p, 1.0f, s->work[1].data, p,
                          s->work[0].data, p, 1.0f, layer_param_grad(l, 0), kk));
  if (!need_dx) goto cleanup;
  /* dcol[kk, p] = W[out_c, kk]^T dY'[out_c, p], folded back onto the image by col2im. */
  FL_CHECK(dev->ops->gemm(dev, true, false, kk, p, C->out_c, 1.0f, layer_param_value(l, 0), kk,
                          s->work[1].data, p, 0.0f, s->work[0].data, p));
  FL_CHECK(ensure_like(l, &l->dx, l->x));
  FL_CHECK(dev->ops->memset0(dev, l->dx.data, l->dx.numel * sizeof(float)));
  FL_CHECK(dev->ops->col2im(dev, C->n, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                            s->work[0].data, l->dx.data));
cleanup:
  return status;
}

static const layer_ops conv_ops = {"conv2d", conv_forward, conv_backward, NULL};

fl_status layer_conv2d_create(layer_store *s, const char *name, int in_c, int out_c, int k,
                              int stride, int pad, bool bias, layer **out_l) {
  if (in_c < 1 || out_c < 1 || k < 1 || stride < 1 || pad < 0)
    return fl_set_error(FL_EINVAL, "conv2d %s: bad geometry (in %d, out %d, kernel %d, stride "
                        "%d, pad %d)", name, in_c, out_c, k, stride, pad);
  layer *l = NULL;
  fl_status st = layer_new(s, &conv_ops, name, sizeof(conv_layer), &l);
  if (st != FL_OK) return st;
  conv_layer *C = (conv_layer *)l;
  C->in_c = in_c;
  C->out_c = out_c;
  C->k = k;
  C->stride = stride;
  C->pad = pad;
  C->bias = bias;
  size_t idx;
  int64_t wshape[4] = {out_c, in_c, k, k}, bshape[1] = {out_c};
  st = layer_store_add_param(s, name, "weight", 4, wshape, LAYER_INIT_HE, in_c * k * k, &idx);
  if (st == FL_OK && bias)
    st = layer_store_add_param(s, name, "bias", 1, bshape, LAYER_INIT_ZERO, 0, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

/* ---- pooling --------------------------------------------------------------------------- */

typedef struct pool_layer {
  layer base;
  int k, stride, pad;
  bool max;
  /* Max pooling's argmax, int32 kept in a float tensor of the same element count (both are
   * 4 bytes), so that it grows with tensor_ensure like every other layer buffer. */
  fl_tensor argmax;
} pool_layer;

static fl_status pool_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  pool_layer *P = (pool_layer *)l;
  fl_device *dev = l->store->dev;
  if (x->ndim != 4 || x->shape[2] + 2 * P->pad < P->k || x->shape[3] + 2 * P->pad < P->k) {
    char want[64];
    int least = P->k - 2 * P->pad > 1 ? P->k - 2 * P->pad : 1;
    snprintf(want, sizeof want, "[n, c, h, w] with h, w >= %d", least);
    return bad_input(l, x, want);
  }
  int n = (int)x->shape[0], c = (int)x->shape[1], h = (int)x->shape[2], w = (int)x->shape[3];
  int64_t shape[4] = {n, c, out_size(h, P->k, P->stride, P->pad),
                      out_size(w, P->k, P->stride, P->pad)};
  fl_status st = tensor_ensure(&l->y, dev, 4, shape);
  if (st != FL_OK) return st;
  if (!P->max)
    return dev->ops->avgpool_forward(dev, n, c, h, w, P->k, P->stride, P->pad, x->data, l->y.data);
  st = tensor_ensure(&P->argmax, dev, 4, shape);
  if (st != FL_OK) return st;
  return dev->ops->maxpool_forward(dev, n, c, h, w, P->k, P->stride, P->pad, x->data, l->y.data,
                                   (int32_t *)P->argmax.data);
}

static fl_status pool_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  pool_layer *P = (pool_layer *)l;
  fl_device *dev = l->store->dev;
  if (!need_dx) return FL_OK;
  fl_status st = ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  int n = (int)l->x->shape[0], c = (int)l->x->shape[1], h = (int)l->x->shape[2],
      w = (int)l->x->shape[3];
  if (!P->max)
    return dev->ops->avgpool_backward(dev, n, c, h, w, P->k, P->stride, P->pad, dy->data,
                                      l->dx.data);
  return dev->ops->maxpool_backward(dev, n, c, h, w, P->k, P->stride, P->pad, dy->data,
                                    (const int32_t *)P->argmax.data, l->dx.data);
}

static void pool_destroy(layer *l) { tensor_release(&((pool_layer *)l)->argmax); }

static const layer_ops maxpool_ops = {"maxpool", pool_forward, pool_backward, pool_destroy};
static const layer_ops avgpool_ops = {"avgpool", pool_forward, pool_backward, pool_destroy};

static fl_status pool_create(layer_store *s, bool max, int k, int stride, int pad, layer **out_l) {
  /* A window must always cover one real input, or max pooling would have nothing to pick. */
  if (k < 1 || stride < 1 || pad < 0 || pad >= k)
    return fl_set_error(FL_EINVAL, "%s: bad window (kernel %d, stride %d, pad %d)",
                        max ? "maxpool" : "avgpool", k, stride, pad);
  layer *l = NULL;
  fl_status st = layer_new(s, max ? &maxpool_ops : &avgpool_ops, max ? "maxpool" : "avgpool",
                           sizeof(pool_layer), &l);
  if (st != FL_OK) return st;
  pool_layer *P = (pool_layer *)l;
  P->k = k;
  P->stride = stride;
  P->pad = pad;
  P->max = max;
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

fl_status layer_maxpool_create(layer_store *s, int k, int stride, int pad, layer **out_l) {
  return pool_create(s, true, k, stride, pad, out_l);
}

fl_status layer_avgpool_create(layer_store *s, int k, int stride, int pad, layer **out_l) {
  return pool_create(s, false, k, stride, pad, out_l);
}

/* ---- global average pooling ------------------------------------------------------------ */

/* As GEMMs against a vector of ones, so that it needs no kernel of its own and takes planes
 * of any shape: y[n*c] = x[n*c, hw] ones / hw, dx[n*c, hw] = dy[n*c] ones^T / hw. */
typedef struct gap_layer {
  layer base;
  fl_tensor ones;
} gap_layer;

static fl_status gap_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  gap_layer *G = (gap_layer *)l;
  fl_device *dev = l->store->dev;
  if (x->ndim != 4) return bad_input(l, x, "[n, c, h, w]");
  int rows = (int)(x->shape[0] * x->shape[1]), hw = (int)(x->shape[2] * x->shape[3]);
  int64_t ones_shape[1] = {hw}, shape[2] = {x->shape[0], x->shape[1]};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&G->ones, dev, 1, ones_shape));
  FL_CHECK(dev->ops->fill(dev, (size_t)hw, 1.0f, G->ones.data));
  FL_CHECK(tensor_ensure(&l->y, dev, 2, shape));
  FL_CHECK(dev->ops->gemm(dev, false, false, rows, 1, hw, 1.0f / (float)hw, x->data, hw,
                          G->ones.data, 1, 0.0f, l->y.data, 1));
cleanup:
  return status;
}

static fl_status gap_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  gap_layer *G = (gap_layer *)l;
  fl_device *dev = l->store->dev;
  if (!need_dx) return FL_OK;
  int rows = (int)(l->x->shape[0] * l->x->shape[1]), hw = (int)(l->x->shape[2] * l->x->shape[3]);
  fl_status st = ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  return dev->ops->gemm(dev, false, false, rows, hw, 1, 1.0f / (float)hw, dy->data, 1,
                        G->ones.data, hw, 0.0f, l->dx.data, hw);
}

static void gap_destroy(layer *l) { tensor_release(&((gap_layer *)l)->ones); }

static const layer_ops gap_ops = {"global_avgpool", gap_forward, gap_backward, gap_destroy};

fl_status layer_global_avgpool_create(layer_store *s, layer **out_l) {
  fl_status st = layer_new(s, &gap_ops, "avgpool", sizeof(gap_layer), out_l);
  if (st == FL_OK) layer_done(*out_l);
  return st;
}

/* ---- batch norm ------------------------------------------------------------------------ */

typedef struct bn_layer {
  layer base;
  int c;
  size_t running; /* offset of running mean [c], then running var [c], in the buffers */
  fl_tensor mean, inv_std; /* the batch statistics saved for backward */
  bool saved;              /* the last forward was a training one */
} bn_layer;

#define BN_MOMENTUM 0.1f
#define BN_EPS 1e-5f

static fl_status bn_forward(layer *l, const fl_tensor *x, bool train) {
  bn_layer *B = (bn_layer *)l;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  if (x->ndim < 2 || x->shape[1] != B->c) {
    char want[48];
    snprintf(want, sizeof want, "[n, %d, ...]", B->c);
    return bad_input(l, x, want);
  }
  int n = (int)x->shape[0];
  int hw = (int)(x->numel / ((size_t)n * B->c));
  int64_t cshape[1] = {B->c};
  fl_status status = FL_OK;
  FL_CHECK(ensure_like(l, &l->y, x));
  FL_CHECK(tensor_ensure(&B->mean, dev, 1, cshape));
  FL_CHECK(tensor_ensure(&B->inv_std, dev, 1, cshape));
  float *running = s->buffers.data + B->running;
  bn_saved saved = {B->mean.data, B->inv_std.data};
  FL_CHECK(dev->ops->batchnorm_forward(dev, n, B->c, hw, x->data, layer_param_value(l, 0),
                                       layer_param_value(l, 1), running, running + B->c,
                                       BN_MOMENTUM, BN_EPS, train, saved, l->y.data));
  B->saved = train;
cleanup:
  return status;
}

static fl_status bn_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  bn_layer *B = (bn_layer *)l;
  fl_device *dev = l->store->dev;
  if (!B->saved)
    return fl_set_error(FL_ESTATE, "batchnorm %s: backward after an inference forward (it "
                        "needs the batch statistics of a training one)", l->name);
  /* The input gradient is computed even when not asked for: the same pass gives the
   * parameter gradients. */
  (void)need_dx;
  int n = (int)l->x->shape[0];
  int hw = (int)(l->x->numel / ((size_t)n * B->c));
  fl_status st = ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  bn_saved saved = {B->mean.data, B->inv_std.data};
  return dev->ops->batchnorm_backward(dev, n, B->c, hw, l->x->data, dy->data,
                                      layer_param_value(l, 0), saved, l->dx.data,
                                      layer_param_grad(l, 0), layer_param_grad(l, 1));
}

static void bn_destroy(layer *l) {
  bn_layer *B = (bn_layer *)l;
  tensor_release(&B->mean);
  tensor_release(&B->inv_std);
}

static const layer_ops bn_ops = {"batchnorm", bn_forward, bn_backward, bn_destroy};

fl_status layer_batchnorm_create(layer_store *s, const char *name, int c, layer **out_l) {
  if (c < 1) return fl_set_error(FL_EINVAL, "batchnorm %s: %d channels", name, c);
  layer *l = NULL;
  fl_status st = layer_new(s, &bn_ops, name, sizeof(bn_layer), &l);
  if (st != FL_OK) return st;
  bn_layer *B = (bn_layer *)l;
  B->c = c;
  size_t idx, var_at;
  int64_t shape[1] = {c};
  st = layer_store_add_param(s, name, "weight", 1, shape, LAYER_INIT_ONE, 0, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "bias", 1, shape, LAYER_INIT_ZERO, 0, &idx);
  if (st == FL_OK) st = layer_store_add_buffer(s, (size_t)c, 0.0f, &B->running);
  if (st == FL_OK) st = layer_store_add_buffer(s, (size_t)c, 1.0f, &var_at);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
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

/* ---- ResNet basic block ---------------------------------------------------------------- */

typedef struct block_layer {
  layer base;
  layer *conv1, *bn1, *relu1, *conv2, *bn2;
  layer *down_conv, *down_bn; /* NULL for an identity shortcut */
  fl_tensor g;                /* gradient at the sum, before the final relu */
} block_layer;

static fl_status block_forward(layer *l, const fl_tensor *x, bool train) {
  block_layer *K = (block_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *t = NULL, *shortcut = x; /* = NULL: gcc 13 cannot see through FL_CHECK */
  fl_status status = FL_OK;
  FL_CHECK(layer_forward(K->conv1, x, train, &t));
  FL_CHECK(layer_forward(K->bn1, t, train, &t));
  FL_CHECK(layer_forward(K->relu1, t, train, &t));
  FL_CHECK(layer_forward(K->conv2, t, train, &t));
  FL_CHECK(layer_forward(K->bn2, t, train, &t));
  if (K->down_conv) {
    const fl_tensor *d;
    FL_CHECK(layer_forward(K->down_conv, x, train, &d));
    FL_CHECK(layer_forward(K->down_bn, d, train, &shortcut));
  }
  if (shortcut->numel != t->numel) {
    char want[64];
    snprintf(want, sizeof want, "as many elements as the block's output (%zu)", t->numel);
    FL_CHECK(bad_input(l, x, want));
  }
  FL_CHECK(ensure_like(l, &l->y, t));
  FL_CHECK(dev->ops->copy(dev, l->y.data, t->data, t->numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, t->numel, 1.0f, shortcut->data, l->y.data));
  FL_CHECK(dev->ops->relu_forward(dev, l->y.numel, l->y.data, l->y.data));
cleanup:
  return status;
}

static fl_status block_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  block_layer *K = (block_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *t, *dx_main = NULL, *dx_short = &K->g;
  fl_status status = FL_OK;
  FL_CHECK(ensure_like(l, &K->g, &l->y));
  FL_CHECK(dev->ops->relu_backward(dev, dy->numel, l->y.data, dy->data, K->g.data));
  FL_CHECK(layer_backward(K->bn2, &K->g, true, &t));
  FL_CHECK(layer_backward(K->conv2, t, true, &t));
  FL_CHECK(layer_backward(K->relu1, t, true, &t));
  FL_CHECK(layer_backward(K->bn1, t, true, &t));
  FL_CHECK(layer_backward(K->conv1, t, need_dx, &dx_main));
  if (K->down_conv) {
    FL_CHECK(layer_backward(K->down_bn, &K->g, true, &t));
    FL_CHECK(layer_backward(K->down_conv, t, need_dx, &dx_short));
  }
  if (!need_dx) goto cleanup;
  FL_CHECK(ensure_like(l, &l->dx, l->x));
  FL_CHECK(dev->ops->copy(dev, l->dx.data, dx_main->data, l->dx.numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, l->dx.numel, 1.0f, dx_short->data, l->dx.data));
cleanup:
  return status;
}

static void block_destroy(layer *l) {
  block_layer *K = (block_layer *)l;
  layer_destroy(K->conv1);
  layer_destroy(K->bn1);
  layer_destroy(K->relu1);
  layer_destroy(K->conv2);
  layer_destroy(K->bn2);
  layer_destroy(K->down_conv);
  layer_destroy(K->down_bn);
  tensor_release(&K->g);
}

static const layer_ops block_ops = {"basic_block", block_forward, block_backward, block_destroy};

fl_status layer_basic_block_create(layer_store *s, const char *name, int in_c, int out_c,
                                   int stride, layer **out_l) {
  if (in_c < 1 || out_c < 1 || stride < 1)
    return fl_set_error(FL_EINVAL, "basic block %s: bad geometry (in %d, out %d, stride %d)",
                        name, in_c, out_c, stride);
  layer *l = NULL;
  fl_status status = layer_new(s, &block_ops, name, sizeof(block_layer), &l);
  if (status != FL_OK) return status;
  block_layer *K = (block_layer *)l;
  char sub[96];
#define SUB(suffix) (snprintf(sub, sizeof sub, "%s.%s", name, suffix), sub)
  FL_CHECK(layer_conv2d_create(s, SUB("conv1"), in_c, out_c, 3, stride, 1, false, &K->conv1));
  FL_CHECK(layer_batchnorm_create(s, SUB("bn1"), out_c, &K->bn1));
  FL_CHECK(layer_relu_create(s, &K->relu1));
  FL_CHECK(layer_conv2d_create(s, SUB("conv2"), out_c, out_c, 3, 1, 1, false, &K->conv2));
  FL_CHECK(layer_batchnorm_create(s, SUB("bn2"), out_c, &K->bn2));
  if (stride != 1 || in_c != out_c) {
    FL_CHECK(layer_conv2d_create(s, SUB("downsample.0"), in_c, out_c, 1, stride, 0, false,
                                 &K->down_conv));
    FL_CHECK(layer_batchnorm_create(s, SUB("downsample.1"), out_c, &K->down_bn));
  }
#undef SUB
  layer_done(l);
  *out_l = l;
  return FL_OK;
cleanup:
  layer_destroy(l);
  return status;
}
