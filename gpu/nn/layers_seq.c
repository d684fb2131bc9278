/*
 * gpu/nn/layers_seq.c: the layers of sequence models in gpu/nn/layers.h: layer norm,
 * embedding and multi-head self-attention. Tokens are rows: an activation [n, s, h] is n * s
 * rows of h features.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

/* ---- layer norm ------------------------------------------------------------------------ */

typedef struct layernorm_layer {
  layer base;
  int cols;
  float eps;
  fl_tensor mean, rstd; /* of the last forward, a float a row */
} layernorm_layer;

static fl_status layernorm_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  layernorm_layer *N = (layernorm_layer *)l;
  fl_device *dev = l->store->dev;
  if (x->shape[x->ndim - 1] != N->cols) {
    char want[64];
    snprintf(want, sizeof want, "[..., %d]", N->cols);
    return layer_bad_input(l, x, want);
  }
  int64_t rows[1] = {(int64_t)(x->numel / (size_t)N->cols)};
  fl_status st = layer_ensure_like(l, &l->y, x);
  if (st == FL_OK) st = tensor_ensure(&N->mean, dev, 1, rows);
  if (st == FL_OK) st = tensor_ensure(&N->rstd, dev, 1, rows);
  if (st != FL_OK) return st;
  return dev->ops->layernorm_forward(dev, (int)rows[0], N->cols, N->eps, x->data, layer_param_value(l, 0),
                                     layer_param_value(l, 1), l->y.data, N->mean.data, N->rstd.data);
}

static fl_status layernorm_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  (void)need_dx; /* dx is the by-product of the parameters' gradients */
  layernorm_layer *N = (layernorm_layer *)l;
  fl_device *dev = l->store->dev;
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  return dev->ops->layernorm_backward(dev, (int)N->mean.numel, N->cols, l->x->data, dy->data, layer_param_value(l, 0),
                                      N->mean.data, N->rstd.data, l->dx.data, layer_param_grad(l, 0),
                                      layer_param_grad(l, 1));
}

static void layernorm_destroy(layer *l) {
  layernorm_layer *N = (layernorm_layer *)l;
  tensor_release(&N->mean);
  tensor_release(&N->rstd);
}

static const layer_ops layernorm_ops = {"layernorm", layernorm_forward, layernorm_backward, layernorm_destroy};

fl_status layer_layernorm_create(layer_store *s, const char *name, int cols, float eps, layer **out_l) {
  if (cols < 1 || !(eps > 0)) return fl_set_error(FL_EINVAL, "layernorm %s: %d features, eps %g", name, cols, (double)eps);
  layer *l = NULL;
  fl_status st = layer_new(s, &layernorm_ops, name, sizeof(layernorm_layer), &l);
  if (st != FL_OK) return st;
  layernorm_layer *N = (layernorm_layer *)l;
  N->cols = cols;
  N->eps = eps;
  size_t idx;
  int64_t shape[1] = {cols};
  st = layer_store_add_param(s, name, "weight", 1, shape, LAYER_INIT_ONE, 0, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "bias", 1, shape, LAYER_INIT_ZERO, 0, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

/* ---- embedding ------------------------------------------------------------------------- */

typedef struct embedding_layer {
  layer base;
  int vocab, dim;
} embedding_layer;

static fl_status embedding_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  embedding_layer *E = (embedding_layer *)l;
  fl_device *dev = l->store->dev;
  if (x->ndim > FL_TENSOR_MAX_DIMS - 1) return layer_bad_input(l, x, "ids of at most 3 dimensions");
  int64_t shape[FL_TENSOR_MAX_DIMS];
  memcpy(shape, x->shape, (size_t)x->ndim * sizeof *shape);
  shape[x->ndim] = E->dim;
  fl_status st = tensor_ensure(&l->y, dev, x->ndim + 1, shape);
  if (st != FL_OK) return st;
  return dev->ops->embedding_forward(dev, x->numel, E->dim, E->vocab, x->data, layer_param_value(l, 0), l->y.data);
}

static fl_status embedding_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  embedding_layer *E = (embedding_layer *)l;
  fl_device *dev = l->store->dev;
  fl_status st = dev->ops->embedding_backward(dev, l->x->numel, E->dim, E->vocab, l->x->data, dy->data,
                                              layer_param_grad(l, 0));
  if (st != FL_OK || !need_dx) return st;
  /* Ids have no gradient: a layer before this one gets zeros. */
  st = layer_ensure_like(l, &l->dx, l->x);
  return st == FL_OK ? dev->ops->memset0(dev, l->dx.data, l->dx.numel * sizeof(float)) : st;
}

static const layer_ops embedding_ops = {"embedding", embedding_forward, embedding_backward, NULL};

fl_status layer_embedding_create(layer_store *s, const char *name, int vocab, int dim, layer **out_l) {
  if (vocab < 1 || dim < 1) return fl_set_error(FL_EINVAL, "embedding %s: %d ids of %d features", name, vocab, dim);
  layer *l = NULL;
  fl_status st = layer_new(s, &embedding_ops, name, sizeof(embedding_layer), &l);
  if (st != FL_OK) return st;
  embedding_layer *E = (embedding_layer *)l;
  E->vocab = vocab;
  E->dim = dim;
  size_t idx;
  int64_t shape[2] = {vocab, dim};
  st = layer_store_add_param(s, name, "weight", 2, shape, LAYER_INIT_NORMAL, 0, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

/* ---- multi-head self-attention --------------------------------------------------------- */

/* As PyTorch's nn.MultiheadAttention with batch_first and q = k = v = x, without masks:
 * qkv = x in_proj^T + in_bias packed [q | k | v], attention per head (gpu/nn/attention.c),
 * y = ctx out_proj^T + out_bias. */
typedef struct attention_layer {
  layer base;
  int hidden, heads;
  fl_tensor qkv, scores, probs, ctx;    /* of the last forward */
  fl_tensor d_qkv, d_ctx, d_probs;      /* backward's */
} attention_layer;

static attn_layout attention_layout(const attention_layer *A, int n, int s) {
  int d = A->hidden / A->heads;
  return (attn_layout){.n = n, .s = s, .d = d, .heads = A->heads, .qkv_ld = 3 * A->hidden,
                       .part_offset = {0, A->hidden, 2 * A->hidden}, .head_step = d};
}

static fl_status attention_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  attention_layer *A = (attention_layer *)l;
  fl_device *dev = l->store->dev;
  int H = A->hidden;
  if (x->ndim != 3 || x->shape[2] != H) {
    char want[64];
    snprintf(want, sizeof want, "[n, tokens, %d]", H);
    return layer_bad_input(l, x, want);
  }
  int n = (int)x->shape[0], s = (int)x->shape[1], T = n * s;
  attn_layout L = attention_layout(A, n, s);
  int64_t qkv_shape[2] = {T, 3 * H}, p_shape[4] = {n, A->heads, s, s}, ctx_shape[2] = {T, H};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&A->qkv, dev, 2, qkv_shape));
  FL_CHECK(tensor_ensure(&A->scores, dev, 4, p_shape));
  FL_CHECK(tensor_ensure(&A->probs, dev, 4, p_shape));
  FL_CHECK(tensor_ensure(&A->ctx, dev, 2, ctx_shape));
  FL_CHECK(layer_ensure_like(l, &l->y, x));
  FL_CHECK(dev->ops->gemm(dev, false, true, T, 3 * H, H, 1.0f, x->data, H, layer_param_value(l, 0), H, 0.0f,
                          A->qkv.data, 3 * H));
  FL_CHECK(dev->ops->bias_add_rows(dev, T, 3 * H, layer_param_value(l, 1), A->qkv.data));
  FL_CHECK(attn_probs_forward(dev, &L, A->qkv.data, A->scores.data, A->probs.data));
  FL_CHECK(attn_context_forward(dev, &L, A->probs.data, A->qkv.data, A->ctx.data));
  FL_CHECK(dev->ops->gemm(dev, false, true, T, H, H, 1.0f, A->ctx.data, H, layer_param_value(l, 2), H, 0.0f,
                          l->y.data, H));
  FL_CHECK(dev->ops->bias_add_rows(dev, T, H, layer_param_value(l, 3), l->y.data));
cleanup:
  return status;
}

static fl_status attention_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  attention_layer *A = (attention_layer *)l;
  fl_device *dev = l->store->dev;
  const device_ops *op = dev->ops;
  int H = A->hidden, n = (int)l->x->shape[0], s = (int)l->x->shape[1], T = n * s;
  attn_layout L = attention_layout(A, n, s);
  fl_status status = FL_OK;
  FL_CHECK(layer_ensure_like(l, &A->d_qkv, &A->qkv));
  FL_CHECK(layer_ensure_like(l, &A->d_ctx, &A->ctx));
  FL_CHECK(layer_ensure_like(l, &A->d_probs, &A->probs));
  /* The out projection. */
  FL_CHECK(op->gemm(dev, true, false, H, H, T, 1.0f, dy->data, H, A->ctx.data, H, 1.0f, layer_param_grad(l, 2), H));
  FL_CHECK(op->bias_grad_rows(dev, T, H, dy->data, layer_param_grad(l, 3)));
  FL_CHECK(op->gemm(dev, false, false, T, H, H, 1.0f, dy->data, H, layer_param_value(l, 2), H, 0.0f, A->d_ctx.data, H));
  /* Attention: the score gradient goes to the forward's scores (no longer needed). */
  FL_CHECK(attn_context_backward(dev, &L, A->probs.data, A->qkv.data, A->d_ctx.data, A->d_probs.data, A->d_qkv.data));
  FL_CHECK(attn_probs_backward(dev, &L, A->probs.data, A->d_probs.data, A->qkv.data, A->scores.data, A->d_qkv.data));
  /* The in projection. */
  FL_CHECK(op->gemm(dev, true, false, 3 * H, H, T, 1.0f, A->d_qkv.data, 3 * H, l->x->data, H, 1.0f,
                    layer_param_grad(l, 0), H));
  FL_CHECK(op->bias_grad_rows(dev, T, 3 * H, A->d_qkv.data, layer_param_grad(l, 1)));
  if (!need_dx) goto cleanup;
  FL_CHECK(layer_ensure_like(l, &l->dx, l->x));
  FL_CHECK(op->gemm(dev, false, false, T, H, 3 * H, 1.0f, A->d_qkv.data, 3 * H, layer_param_value(l, 0), H, 0.0f,
                    l->dx.data, H));
cleanup:
  return status;
}

static void attention_destroy(layer *l) {
  attention_layer *A = (attention_layer *)l;
  fl_tensor *t[] = {&A->qkv, &A->scores, &A->probs, &A->ctx, &A->d_qkv, &A->d_ctx, &A->d_probs};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) tensor_release(t[i]);
}

static const layer_ops attention_ops = {"attention", attention_forward, attention_backward, attention_destroy};

fl_status layer_attention_create(layer_store *s, const char *name, int hidden, int heads, layer **out_l) {
  if (hidden < 1 || heads < 1 || hidden % heads)
    return fl_set_error(FL_EINVAL, "attention %s: %d heads must divide %d features", name, heads, hidden);
  layer *l = NULL;
  fl_status st = layer_new(s, &attention_ops, name, sizeof(attention_layer), &l);
  if (st != FL_OK) return st;
  attention_layer *A = (attention_layer *)l;
  A->hidden = hidden;
  A->heads = heads;
  size_t idx;
  /* PyTorch's initialisation: in_proj Xavier-uniform, out_proj as nn.Linear, both biases 0. */
  int64_t in_w[2] = {3 * hidden, hidden}, in_b[1] = {3 * hidden}, out_w[2] = {hidden, hidden}, out_b[1] = {hidden};
  st = layer_store_add_param(s, name, "in_proj_weight", 2, in_w, LAYER_INIT_XAVIER, hidden + 3 * hidden, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "in_proj_bias", 1, in_b, LAYER_INIT_ZERO, 0, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "out_proj.weight", 2, out_w, LAYER_INIT_WEIGHT, hidden, &idx);
  if (st == FL_OK) st = layer_store_add_param(s, name, "out_proj.bias", 1, out_b, LAYER_INIT_ZERO, 0, &idx);
  if (st != FL_OK) {
    layer_destroy(l);
    return st;
  }
  layer_done(l);
  *out_l = l;
  return FL_OK;
}

/* ---- mean over tokens ------------------------------------------------------------------ */

static fl_status mean_tokens_forward(layer *l, const fl_tensor *x, bool train) {
  (void)train;
  fl_device *dev = l->store->dev;
  if (x->ndim != 3) return layer_bad_input(l, x, "[n, tokens, h]");
  int64_t shape[2] = {x->shape[0], x->shape[2]};
  fl_status st = tensor_ensure(&l->y, dev, 2, shape);
  if (st != FL_OK) return st;
  return dev->ops->mean_tokens_forward(dev, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2], x->data, l->y.data);
}

static fl_status mean_tokens_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  fl_device *dev = l->store->dev;
  if (!need_dx) return FL_OK;
  fl_status st = layer_ensure_like(l, &l->dx, l->x);
  if (st != FL_OK) return st;
  const fl_tensor *x = l->x;
  return dev->ops->mean_tokens_backward(dev, (int)x->shape[0], (int)x->shape[1], (int)x->shape[2], dy->data,
                                        l->dx.data);
}

static const layer_ops mean_tokens_ops = {"mean_tokens", mean_tokens_forward, mean_tokens_backward, NULL};

fl_status layer_mean_tokens_create(layer_store *s, layer **out_l) {
  fl_status st = layer_new(s, &mean_tokens_ops, "mean_tokens", sizeof(layer), out_l);
  if (st == FL_OK) layer_done(*out_l);
  return st;
}
