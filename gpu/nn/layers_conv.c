/*
 * gpu/nn/layers_conv.c: the layers over images (NCHW) of gpu/nn/layers.h: conv2d by im2col
 * and GEMM, max and average pooling, global average pooling and batch norm.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

/* ---- conv2d ---------------------------------------------------------------------------- */

typedef struct conv_layer {
  layer base;
  int in_c, out_c, k, stride, pad;
  int groups; /* > 1: each group of in_c / groups channels makes out_c / groups of the output */
  bool bias;
  int n, h, w, oh, ow; /* of the last forward */
} conv_layer;

/* Grouped convolutions (groups > 1: depthwise and the like) go a sample and a group at a time:
 * a group's input channels of one sample are contiguous in NCHW, and so are its output
 * channels, so each is one im2col and one GEMM straight into y, with no transpose. More calls
 * than the batched path, which serves groups == 1. */
typedef struct group_geom {
  int cg, ocg, kk, p; /* channels in and out per group, a column's height, output pixels */
} group_geom;

static group_geom group_geom_of(const conv_layer *C) {
  group_geom g = {.cg = C->in_c / C->groups, .ocg = C->out_c / C->groups, .p = C->oh * C->ow};
  g.kk = g.cg * C->k * C->k;
  return g;
}

static fl_status grouped_forward(conv_layer *C, const fl_tensor *x) {
  layer *l = &C->base;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  group_geom G = group_geom_of(C);
  int64_t col_shape[2] = {G.kk, G.p}, y_shape[4] = {C->n, C->out_c, C->oh, C->ow};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  FL_CHECK(tensor_ensure(&l->y, dev, 4, y_shape));
  size_t plane = (size_t)C->h * C->w;
  for (int i = 0; i < C->n; i++)
    for (int g = 0; g < C->groups; g++) {
      FL_CHECK(dev->ops->im2col(dev, 1, G.cg, C->h, C->w, C->k, C->k, C->stride, C->pad,
                                x->data + ((size_t)i * C->in_c + (size_t)g * G.cg) * plane, s->work[0].data));
      FL_CHECK(dev->ops->gemm(dev, false, false, G.ocg, G.p, G.kk, 1.0f,
                              layer_param_value(l, 0) + (size_t)g * G.ocg * G.kk, G.kk, s->work[0].data, G.p, 0.0f,
                              l->y.data + ((size_t)i * C->out_c + (size_t)g * G.ocg) * G.p, G.p));
    }
  if (C->bias)
    FL_CHECK(dev->ops->bias_add_channels(dev, C->n, C->out_c, G.p, layer_param_value(l, 1), l->y.data));
cleanup:
  return status;
}

static fl_status grouped_backward(conv_layer *C, const fl_tensor *dy, bool need_dx) {
  layer *l = &C->base;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  group_geom G = group_geom_of(C);
  int64_t col_shape[2] = {G.kk, G.p};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  if (C->bias)
    FL_CHECK(dev->ops->bias_grad_channels(dev, C->n, C->out_c, G.p, dy->data, layer_param_grad(l, 1)));
  if (need_dx) {
    FL_CHECK(layer_ensure_like(l, &l->dx, l->x));
    FL_CHECK(dev->ops->memset0(dev, l->dx.data, l->dx.numel * sizeof(float)));
  }
  size_t plane = (size_t)C->h * C->w;
  for (int i = 0; i < C->n; i++)
    for (int g = 0; g < C->groups; g++) {
      size_t in_at = ((size_t)i * C->in_c + (size_t)g * G.cg) * plane;
      const float *dyg = dy->data + ((size_t)i * C->out_c + (size_t)g * G.ocg) * G.p;
      const float *w = layer_param_value(l, 0) + (size_t)g * G.ocg * G.kk;
      FL_CHECK(dev->ops->im2col(dev, 1, G.cg, C->h, C->w, C->k, C->k, C->stride, C->pad, l->x->data + in_at,
                                s->work[0].data));
      /* dW_g[ocg, kk] += dY_g[ocg, p] col[kk, p]^T */
      FL_CHECK(dev->ops->gemm(dev, false, true, G.ocg, G.kk, G.p, 1.0f, dyg, G.p, s->work[0].data, G.p, 1.0f,
                              layer_param_grad(l, 0) + (size_t)g * G.ocg * G.kk, G.kk));
      if (!need_dx) continue;
      /* dcol[kk, p] = W_g^T dY_g, folded back onto the group's channels (the columns are spent). */
      FL_CHECK(dev->ops->gemm(dev, true, false, G.kk, G.p, G.ocg, 1.0f, w, G.kk, dyg, G.p, 0.0f, s->work[0].data,
                              G.p));
      FL_CHECK(dev->ops->col2im(dev, 1, G.cg, C->h, C->w, C->k, C->k, C->stride, C->pad, s->work[0].data,
                                l->dx.data + in_at));
    }
cleanup:
  return status;
}

/* Ungrouped convolutions on the cpu go through im2col and the GEMM a chunk of images at a
 * time. The whole batch's columns are kk times its input (160 MB for 5x5 from 32 channels
 * over 256 images of 14x14): written by im2col and read back by the GEMM's packing, they cost
 * memory bandwidth that columns kept in cache do not. A chunk's columns are about
 * CONV_COL_BYTES, a quarter of a core's L2 (1 MB here; on the CNN, 64 KB to 4 MB measured the
 * smaller the faster, by a few percent), but at least the weights' size, since each GEMM call
 * packs the weights again (ResNet's 3x3 from 512 channels on 4x4 images would otherwise pay
 * 9 MB of packing per image). */
#define CONV_COL_BYTES (256u << 10)

static int conv_chunk(const conv_layer *C) {
  /* A GPU has no such cache to fit and wants the one large GEMM. */
  if (fl_device_kind_of(C->base.store->dev) != FL_DEVICE_CPU) return C->n;
  size_t kk = (size_t)C->in_c * C->k * C->k;
  size_t per_image = kk * (size_t)C->oh * C->ow * sizeof(float), weights = kk * (size_t)C->out_c * sizeof(float);
  size_t want = weights > CONV_COL_BYTES ? weights : CONV_COL_BYTES;
  size_t chunk = per_image ? want / per_image : (size_t)C->n;
  if (chunk < 1) chunk = 1;
  return chunk < (size_t)C->n ? (int)chunk : C->n;
}

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
    return layer_bad_input(l, x, want);
  }
  C->n = (int)x->shape[0];
  C->h = (int)x->shape[2];
  C->w = (int)x->shape[3];
  C->oh = layer_out_size(C->h, C->k, C->stride, C->pad);
  C->ow = layer_out_size(C->w, C->k, C->stride, C->pad);
  if (C->groups > 1) return grouped_forward(C, x);
  int kk = C->in_c * C->k * C->k, ohw = C->oh * C->ow, chunk = conv_chunk(C);
  int64_t col_shape[2] = {kk, (int64_t)chunk * ohw}, yt_shape[2] = {C->out_c, (int64_t)chunk * ohw};
  int64_t y_shape[4] = {C->n, C->out_c, C->oh, C->ow};
  size_t in_img = (size_t)C->in_c * C->h * C->w, out_img = (size_t)C->out_c * ohw;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  if (chunk > 1) FL_CHECK(tensor_ensure(&s->work[1], dev, 2, yt_shape));
  FL_CHECK(tensor_ensure(&l->y, dev, 4, y_shape));
  for (int i = 0; i < C->n; i += chunk) {
    int c = C->n - i < chunk ? C->n - i : chunk, p = c * ohw;
    float *y = l->y.data + (size_t)i * out_img;
    FL_CHECK(dev->ops->im2col(dev, c, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                              x->data + (size_t)i * in_img, s->work[0].data));
    /* Y'[out_c, c*oh*ow] = W[out_c, kk] col[kk, c*oh*ow]: NCHW itself for one image, else
     * NCHW by swapping the chunk's n and c. */
    FL_CHECK(dev->ops->gemm(dev, false, false, C->out_c, p, kk, 1.0f, layer_param_value(l, 0),
                            kk, s->work[0].data, p, 0.0f, c == 1 ? y : s->work[1].data, p));
    if (c > 1) FL_CHECK(dev->ops->swap01(dev, C->out_c, c, ohw, s->work[1].data, y));
  }
  if (C->bias)
    FL_CHECK(dev->ops->bias_add_channels(dev, C->n, C->out_c, ohw, layer_param_value(l, 1), l->y.data));
cleanup:
  return status;
}

static fl_status conv_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  conv_layer *C = (conv_layer *)l;
  layer_store *s = l->store;
  fl_device *dev = s->dev;
  if (C->groups > 1) return grouped_backward(C, dy, need_dx);
  int kk = C->in_c * C->k * C->k, ohw = C->oh * C->ow, chunk = conv_chunk(C);
  int64_t col_shape[2] = {kk, (int64_t)chunk * ohw}, yt_shape[2] = {C->out_c, (int64_t)chunk * ohw};
  size_t in_img = (size_t)C->in_c * C->h * C->w, out_img = (size_t)C->out_c * ohw;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&s->work[0], dev, 2, col_shape));
  if (chunk > 1) FL_CHECK(tensor_ensure(&s->work[1], dev, 2, yt_shape));
  if (C->bias)
    FL_CHECK(dev->ops->bias_grad_channels(dev, C->n, C->out_c, ohw, dy->data, layer_param_grad(l, 1)));
  if (need_dx) {
    FL_CHECK(layer_ensure_like(l, &l->dx, l->x));
    FL_CHECK(dev->ops->memset0(dev, l->dx.data, l->dx.numel * sizeof(float)));
  }
  for (int i = 0; i < C->n; i += chunk) {
    int c = C->n - i < chunk ? C->n - i : chunk, p = c * ohw;
    /* dY'[out_c, c*oh*ow]: the image's own dy for one, else the chunk's n and c swapped. */
    const float *dyt = dy->data + (size_t)i * out_img;
    if (c > 1) {
      FL_CHECK(dev->ops->swap01(dev, c, C->out_c, ohw, dyt, s->work[1].data));
      dyt = s->work[1].data;
    }
    /* The columns are recomputed: the scratch is shared by every convolution of the model,
     * which costs an im2col but keeps one column buffer instead of one per layer. */
    FL_CHECK(dev->ops->im2col(dev, c, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                              l->x->data + (size_t)i * in_img, s->work[0].data));
    /* dW[out_c, kk] += dY'[out_c, p] col[kk, p]^T */
    FL_CHECK(dev->ops->gemm(dev, false, true, C->out_c, kk, p, 1.0f, dyt, p, s->work[0].data, p,
                            1.0f, layer_param_grad(l, 0), kk));
    if (!need_dx) continue;
    /* dcol[kk, p] = W[out_c, kk]^T dY'[out_c, p] (the columns are spent), folded back onto the
     * chunk's images by col2im. */
    FL_CHECK(dev->ops->gemm(dev, true, false, kk, p, C->out_c, 1.0f, layer_param_value(l, 0), kk,
                            dyt, p, 0.0f, s->work[0].data, p));
    FL_CHECK(dev->ops->col2im(dev, c, C->in_c, C->h, C->w, C->k, C->k, C->stride, C->pad,
                              s->work[0].data, l->dx.data + (size_t)i * in_img));
  }
cleanup:
  return status;
}

static const layer_ops conv_ops = {"conv2d", conv_forward, conv_backward, NULL};

fl_status layer_conv2d_grouped_create(layer_store *s, const char *name, int in_c, int out_c, int k, int stride,
                                      int pad, int groups, bool bias, layer **out_l) {
  if (in_c < 1 || out_c < 1 || k < 1 || stride < 1 || pad < 0)
    return fl_set_error(FL_EINVAL, "conv2d %s: bad geometry (in %d, out %d, kernel %d, stride "
                        "%d, pad %d)", name, in_c, out_c, k, stride, pad);
  if (groups < 1 || in_c % groups || out_c % groups)
    return fl_set_error(FL_EINVAL, "conv2d %s: %d groups must divide both %d input and %d output channels", name,
                        groups, in_c, out_c);
  layer *l = NULL;
  fl_status st = layer_new(s, &conv_ops, name, sizeof(conv_layer), &l);
  if (st != FL_OK) return st;
  conv_layer *C = (conv_layer *)l;
  C->in_c = in_c;
  C->out_c = out_c;
  C->k = k;
  C->stride = stride;
  C->pad = pad;
  C->groups = groups;
  C->bias = bias;
  size_t idx;
  int fan_in = in_c / groups * k * k;
  int64_t wshape[4] = {out_c, in_c / groups, k, k}, bshape[1] = {out_c};
  st = layer_store_add_param(s, name, "weight", 4, wshape, LAYER_INIT_WEIGHT, fan_in, &idx);
  if (st == FL_OK && bias)
    st = layer_store_add_param(s, name, "bias", 1, bshape, LAYER_INIT_BIAS, fan_in, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

fl_status layer_conv2d_create(layer_store *s, const char *name, int in_c, int out_c, int k, int stride, int pad,
                              bool bias, layer **out_l) {
  return layer_conv2d_grouped_create(s, name, in_c, out_c, k, stride, pad, 1, bias, out_l);
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
    return layer_bad_input(l, x, want);
  }
  int n = (int)x->shape[0], c = (int)x->shape[1], h = (int)x->shape[2], w = (int)x->shape[3];
  int64_t shape[4] = {n, c, layer_out_size(h, P->k, P->stride, P->pad),
                      layer_out_size(w, P->k, P->stride, P->pad)};
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
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
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
  if (x->ndim != 4) return layer_bad_input(l, x, "[n, c, h, w]");
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
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
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
    return layer_bad_input(l, x, want);
  }
  int n = (int)x->shape[0];
  int hw = (int)(x->numel / ((size_t)n * B->c));
  int64_t cshape[1] = {B->c};
  fl_status status = FL_OK;
  FL_CHECK(layer_ensure_like(l, &l->y, x));
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
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
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
