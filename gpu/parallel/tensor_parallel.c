/*
 * gpu/parallel/tensor_parallel.c: one transformer block split over a tensor-parallel group,
 * written against the device operations only.
 *
 * With T = n * seq tokens, d = head_dim, hl = local_heads and F = local_ffn on this rank:
 *   qkv[T, hl*3d] = x Wqkv^T + bqkv                         (column-parallel: own heads)
 *   per head: probs = softmax(q k^T / sqrt(d)), ctx = dropout(probs) v
 *   x1[T, H] = x + dropout(allreduce(ctx Wout^T) + bout)      (row-parallel, then g)
 *   h1[T, F] = x1 W1^T + b1, act = gelu(h1)                   (column-parallel)
 *   y[T, H]  = x1 + dropout(allreduce(act W2^T) + b2)         (row-parallel, then g)
 * Backward mirrors it; the input gradients of the two column-parallel layers are partial
 * sums over the group's heads or inner width and are allreduced (Megatron's f).
 *
 * The GPT form (dims.gpt) is pre-LN with causal attention: the column-parallel layers read
 * ln1(x) and ln2(x1) instead of x and x1, and the scores are masked above the diagonal before
 * the softmax. The layer norms are replicated: their input gradient is allreduced first (f),
 * so every rank computes the same parameter gradients for them.
 *
 * Per head, the products run batched over the samples: head h of sample b starts at
 * b * seq * hl*3d + h*3d in qkv, a constant stride between samples. The scores are laid out
 * [n, hl, seq, seq], so the probabilities' dropout key (sample, head * seq + query row) is
 * the device's (outer, inner) with inner0 = head0 * seq.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/tensor_parallel.h"

static fl_status reduce_partial(const tp_block *k, fl_tensor *t) {
  if (!k->comm) return FL_OK;
  return fl_comm_allreduce(k->comm, t, FL_REDUCE_SUM);
}

/* Dropout of a [n, seq, hidden] activation in place (site after a projection). */
static fl_status drop_hidden(const tp_block *k, const tp_keys *keys, int site, int n, float *t,
                             bool backward) {
  if (!keys->active) return FL_OK;
  fl_device *dev = k->dev;
  const tp_dims *D = &k->dims;
  if (backward)
    return dev->ops->dropout_backward(dev, n, D->seq, D->hidden, keys->row0, 0, D->seq,
                                      D->dropout, keys->seed[site], t, t);
  return dev->ops->dropout_forward(dev, n, D->seq, D->hidden, keys->row0, 0, D->seq, D->dropout,
                                   keys->seed[site], t, t);
}

/* Dropout of the probabilities [n, hl, seq, seq], keyed by the global head. */
static fl_status drop_probs(const tp_block *k, const tp_keys *keys, int n, const float *in,
                            float *out, bool backward) {
  fl_device *dev = k->dev;
  const tp_dims *D = &k->dims;
  int inner = D->local_heads * D->seq;
  int64_t inner0 = (int64_t)D->head0 * D->seq, total = (int64_t)D->heads * D->seq;
  uint64_t seed = keys->seed[TP_SITE_PROBS];
  if (backward)
    return dev->ops->dropout_backward(dev, n, inner, D->seq, keys->row0, inner0, total,
                                      D->dropout, seed, in, out);
  return dev->ops->dropout_forward(dev, n, inner, D->seq, keys->row0, inner0, total, D->dropout,
                                   seed, in, out);
}

/* The probabilities after dropout: S->dropped when dropout is active, else a->probs. */
static fl_status dropped_probs(const tp_block *k, const tp_keys *keys, int n,
                               const tp_block_acts *a, const float **out) {
  *out = a->probs.data;
  if (!keys->active) return FL_OK;
  *out = k->scratch->dropped.data;
  return drop_probs(k, keys, n, a->probs.data, k->scratch->dropped.data, false);
}

/* A block's sizes for a micro-batch of n samples (see the top of the file for the names). */
typedef struct geom {
  int n, s, H, d, hl, T, q3, F;
  int64_t qkv_shape[2], p_shape[4], ctx_shape[2], h_shape[3], f_shape[2];
} geom;

static geom geom_of(const tp_dims *D, int n) {
  geom g = {.n = n, .s = D->seq, .H = D->hidden, .d = D->head_dim, .hl = D->local_heads,
            .F = D->local_ffn};
  g.T = n * g.s;
  g.q3 = g.hl * 3 * g.d;
  int64_t qkv[2] = {g.T, g.q3}, p[4] = {n, g.hl, g.s, g.s}, ctx[2] = {g.T, g.hl * g.d};
  int64_t h[3] = {n, g.s, g.H}, f[2] = {g.T, g.F};
  memcpy(g.qkv_shape, qkv, sizeof qkv);
  memcpy(g.p_shape, p, sizeof p);
  memcpy(g.ctx_shape, ctx, sizeof ctx);
  memcpy(g.h_shape, h, sizeof h);
  memcpy(g.f_shape, f, sizeof f);
  return g;
}

/* This rank's heads in the [heads, 3, d] packing of qkv. */
static attn_layout layout_of(const tp_block *k, const geom *G) {
  return (attn_layout){.n = G->n, .s = G->s, .d = G->d, .heads = G->hl, .qkv_ld = G->q3,
                       .part_offset = {0, G->d, 2 * G->d}, .head_step = 3 * G->d,
                       .causal = k->dims.gpt};
}

/* GPT form: a layer norm's output and statistics, shaped for T tokens. */
static fl_status ensure_norm(fl_device *dev, const geom *G, fl_tensor *xn, fl_tensor *mean,
                             fl_tensor *rstd) {
  int64_t t[1] = {G->T};
  fl_status s = tensor_ensure(xn, dev, 3, G->h_shape);
  if (s == FL_OK) s = tensor_ensure(mean, dev, 1, t);
  if (s == FL_OK) s = tensor_ensure(rstd, dev, 1, t);
  return s;
}

#define TP_LN_EPS 1e-5f

static float *val(const tp_block *k, int i) { return k->p[i]->value.data; }
static float *grad(const tp_block *k, int i) { return k->p[i]->grad.data; }

fl_status tp_block_forward(const tp_block *k, const fl_tensor *x, const tp_keys *keys,
                           tp_block_acts *a) {
  fl_device *dev = k->dev;
  const device_ops *op = dev->ops;
  tp_scratch *S = k->scratch;
  const geom G = geom_of(&k->dims, (int)x->shape[0]);
  int n = G.n, H = G.H, d = G.d, hl = G.hl, T = G.T, q3 = G.q3, F = G.F;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->qkv, dev, 2, G.qkv_shape));
  FL_CHECK(tensor_ensure(&a->probs, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&a->ctx, dev, 2, G.ctx_shape));
  FL_CHECK(tensor_ensure(&a->x1, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&a->h1, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&a->act, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&a->y, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&S->scores, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&S->dropped, dev, 4, G.p_shape));
  const bool gpt = k->dims.gpt;
  if (gpt) {
    FL_CHECK(ensure_norm(dev, &G, &a->xn1, &a->mean1, &a->rstd1));
    FL_CHECK(ensure_norm(dev, &G, &a->xn2, &a->mean2, &a->rstd2));
  }

  /* Attention (GPT: of ln1(x)). */
  const float *attn_in = x->data;
  if (gpt) {
    FL_CHECK(op->layernorm_forward(dev, T, H, TP_LN_EPS, x->data, val(k, TP_LN1_G), val(k, TP_LN1_B),
                                   a->xn1.data, a->mean1.data, a->rstd1.data));
    attn_in = a->xn1.data;
  }
  FL_CHECK(op->gemm(dev, false, true, T, q3, H, 1.0f, attn_in, H, val(k, TP_QKV_W), H, 0.0f,
                    a->qkv.data, q3));
  FL_CHECK(op->bias_add_rows(dev, T, q3, val(k, TP_QKV_B), a->qkv.data));
  const attn_layout L = layout_of(k, &G);
  FL_CHECK(attn_probs_forward(dev, &L, a->qkv.data, S->scores.data, a->probs.data));
  const float *pd;
  FL_CHECK(dropped_probs(k, keys, n, a, &pd));
  FL_CHECK(attn_context_forward(dev, &L, pd, a->qkv.data, a->ctx.data));
  FL_CHECK(op->gemm(dev, false, true, T, H, hl * d, 1.0f, a->ctx.data, hl * d, val(k, TP_OUT_W),
                    hl * d, 0.0f, a->x1.data, H));
  FL_CHECK(reduce_partial(k, &a->x1));
  FL_CHECK(op->bias_add_rows(dev, T, H, val(k, TP_OUT_B), a->x1.data));
  FL_CHECK(drop_hidden(k, keys, TP_SITE_ATTN_OUT, n, a->x1.data, false));
  FL_CHECK(op->axpy(dev, (size_t)T * H, 1.0f, x->data, a->x1.data));

  /* MLP (GPT: of ln2(x1)). */
  const float *mlp_in = a->x1.data;
  if (gpt) {
    FL_CHECK(op->layernorm_forward(dev, T, H, TP_LN_EPS, a->x1.data, val(k, TP_LN2_G), val(k, TP_LN2_B),
                                   a->xn2.data, a->mean2.data, a->rstd2.data));
    mlp_in = a->xn2.data;
  }
  FL_CHECK(op->gemm(dev, false, true, T, F, H, 1.0f, mlp_in, H, val(k, TP_FC1_W), H, 0.0f,
                    a->h1.data, F));
  FL_CHECK(op->bias_add_rows(dev, T, F, val(k, TP_FC1_B), a->h1.data));
  FL_CHECK(op->gelu_forward(dev, (size_t)T * F, a->h1.data, a->act.data));
  FL_CHECK(op->gemm(dev, false, true, T, H, F, 1.0f, a->act.data, F, val(k, TP_FC2_W), F, 0.0f,
                    a->y.data, H));
  FL_CHECK(reduce_partial(k, &a->y));
  FL_CHECK(op->bias_add_rows(dev, T, H, val(k, TP_FC2_B), a->y.data));
  FL_CHECK(drop_hidden(k, keys, TP_SITE_MLP_OUT, n, a->y.data, false));
  FL_CHECK(op->axpy(dev, (size_t)T * H, 1.0f, a->x1.data, a->y.data));
cleanup:
  return status;
}

fl_status tp_block_backward(const tp_block *k, const fl_tensor *x, const tp_keys *keys,
                            const tp_block_acts *a, const fl_tensor *dy, bool need_dx,
                            fl_tensor *dx) {
  fl_device *dev = k->dev;
  const device_ops *op = dev->ops;
  tp_scratch *S = k->scratch;
  const geom G = geom_of(&k->dims, (int)x->shape[0]);
  int n = G.n, H = G.H, d = G.d, hl = G.hl, T = G.T, q3 = G.q3, F = G.F;
  size_t th = (size_t)T * H;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(dx, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&S->d_hidden, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&S->d_partial, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&S->d_ffn, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&S->d_ctx, dev, 2, G.ctx_shape));
  FL_CHECK(tensor_ensure(&S->d_qkv, dev, 2, G.qkv_shape));
  FL_CHECK(tensor_ensure(&S->dropped, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&S->d_probs, dev, 4, G.p_shape));
  const bool gpt = k->dims.gpt;
  if (gpt) FL_CHECK(tensor_ensure(&S->d_norm, dev, 3, G.h_shape));
  const float *attn_in = gpt ? a->xn1.data : x->data, *mlp_in = gpt ? a->xn2.data : a->x1.data;

  /* MLP: the gradient at fc2's output is dropout's backward of dy (g is the identity). */
  const float *d_out = dy->data;
  if (keys->active) {
    FL_CHECK(op->copy(dev, S->d_hidden.data, dy->data, th * sizeof(float)));
    FL_CHECK(drop_hidden(k, keys, TP_SITE_MLP_OUT, n, S->d_hidden.data, true));
    d_out = S->d_hidden.data;
  }
  FL_CHECK(op->bias_grad_rows(dev, T, H, d_out, grad(k, TP_FC2_B)));
  FL_CHECK(op->gemm(dev, true, false, H, F, T, 1.0f, d_out, H, a->act.data, F, 1.0f,
                    grad(k, TP_FC2_W), F));
  FL_CHECK(op->gemm(dev, false, false, T, F, H, 1.0f, d_out, H, val(k, TP_FC2_W), F, 0.0f,
                    S->d_ffn.data, F));
  FL_CHECK(op->gelu_backward(dev, (size_t)T * F, a->h1.data, S->d_ffn.data, S->d_ffn.data));
  FL_CHECK(op->gemm(dev, true, false, F, H, T, 1.0f, S->d_ffn.data, F, mlp_in, H, 1.0f,
                    grad(k, TP_FC1_W), H));
  FL_CHECK(op->bias_grad_rows(dev, T, F, S->d_ffn.data, grad(k, TP_FC1_B)));
  /* dx1 = dy (the residual) + allreduce(this rank's part of fc1's input gradient), through
   * ln2's backward in the GPT form. */
  if (gpt) {
    FL_CHECK(op->gemm(dev, false, false, T, H, F, 1.0f, S->d_ffn.data, F, val(k, TP_FC1_W), H,
                      0.0f, S->d_norm.data, H));
    FL_CHECK(reduce_partial(k, &S->d_norm));
    FL_CHECK(op->layernorm_backward(dev, T, H, a->x1.data, S->d_norm.data, val(k, TP_LN2_G),
                                    a->mean2.data, a->rstd2.data, dx->data, grad(k, TP_LN2_G),
                                    grad(k, TP_LN2_B)));
  } else {
    FL_CHECK(op->gemm(dev, false, false, T, H, F, 1.0f, S->d_ffn.data, F, val(k, TP_FC1_W), H,
                      0.0f, dx->data, H));
    FL_CHECK(reduce_partial(k, dx));
  }
  FL_CHECK(op->axpy(dev, th, 1.0f, dy->data, dx->data));

  /* Attention, from dx1 (in dx) through the out projection's dropout. */
  const float *d_attn = dx->data;
  if (keys->active) {
    FL_CHECK(op->copy(dev, S->d_hidden.data, dx->data, th * sizeof(float)));
    FL_CHECK(drop_hidden(k, keys, TP_SITE_ATTN_OUT, n, S->d_hidden.data, true));
    d_attn = S->d_hidden.data;
  }
  FL_CHECK(op->bias_grad_rows(dev, T, H, d_attn, grad(k, TP_OUT_B)));
  FL_CHECK(op->gemm(dev, true, false, H, hl * d, T, 1.0f, d_attn, H, a->ctx.data, hl * d, 1.0f,
                    grad(k, TP_OUT_W), hl * d));
  FL_CHECK(op->gemm(dev, false, false, T, hl * d, H, 1.0f, d_attn, H, val(k, TP_OUT_W), hl * d,
                    0.0f, S->d_ctx.data, hl * d));
  /* The dropped probabilities are recomputed from their keys rather than kept in the slot. */
  const float *pd;
  FL_CHECK(dropped_probs(k, keys, n, a, &pd));
  const attn_layout L = layout_of(k, &G);
  FL_CHECK(attn_context_backward(dev, &L, pd, a->qkv.data, S->d_ctx.data, S->d_probs.data, S->d_qkv.data));
  if (keys->active) FL_CHECK(drop_probs(k, keys, n, S->d_probs.data, S->d_probs.data, true));
  /* The score gradient goes where the dropped probabilities were (no longer needed). */
  FL_CHECK(attn_probs_backward(dev, &L, a->probs.data, S->d_probs.data, a->qkv.data, S->dropped.data, S->d_qkv.data));
  FL_CHECK(op->gemm(dev, true, false, q3, H, T, 1.0f, S->d_qkv.data, q3, attn_in, H, 1.0f,
                    grad(k, TP_QKV_W), H));
  FL_CHECK(op->bias_grad_rows(dev, T, q3, S->d_qkv.data, grad(k, TP_QKV_B)));
  if (gpt) { /* ln1's parameters need its input gradient even when dx is not wanted */
    FL_CHECK(op->gemm(dev, false, false, T, H, q3, 1.0f, S->d_qkv.data, q3, val(k, TP_QKV_W), H,
                      0.0f, S->d_norm.data, H));
    FL_CHECK(reduce_partial(k, &S->d_norm));
    FL_CHECK(op->layernorm_backward(dev, T, H, x->data, S->d_norm.data, val(k, TP_LN1_G),
                                    a->mean1.data, a->rstd1.data, S->d_partial.data,
                                    grad(k, TP_LN1_G), grad(k, TP_LN1_B)));
    if (need_dx) FL_CHECK(op->axpy(dev, th, 1.0f, S->d_partial.data, dx->data));
    goto cleanup;
  }
  if (!need_dx) goto cleanup;
  FL_CHECK(op->gemm(dev, false, false, T, H, q3, 1.0f, S->d_qkv.data, q3, val(k, TP_QKV_W), H,
                    0.0f, S->d_partial.data, H));
  FL_CHECK(reduce_partial(k, &S->d_partial));
  FL_CHECK(op->axpy(dev, th, 1.0f, S->d_partial.data, dx->data));
cleanup:
  return status;
}

/* The saved tensors of a block, for release and accounting. */
static void acts_list(const tp_block_acts *a, const fl_tensor *out[TP_BLOCK_ACTS]) {
  const fl_tensor *list[TP_BLOCK_ACTS] = {&a->qkv, &a->probs, &a->ctx,   &a->x1,    &a->h1,
                                          &a->act, &a->y,     &a->xn1,   &a->xn2,   &a->mean1,
                                          &a->rstd1, &a->mean2, &a->rstd2};
  for (int i = 0; i < TP_BLOCK_ACTS; i++) out[i] = list[i];
}

void tp_block_acts_release(tp_block_acts *a) {
  const fl_tensor *t[TP_BLOCK_ACTS];
  acts_list(a, t);
  for (int i = 0; i < TP_BLOCK_ACTS; i++) tensor_release((fl_tensor *)t[i]);
}

size_t tp_block_acts_bytes(const tp_block_acts *a) {
  const fl_tensor *t[TP_BLOCK_ACTS];
  acts_list(a, t);
  size_t bytes = 0;
  for (int i = 0; i < TP_BLOCK_ACTS; i++) bytes += t[i]->numel * sizeof(float);
  return bytes;
}

void tp_scratch_release(tp_scratch *s) {
  tensor_release(&s->scores);
  tensor_release(&s->dropped);
  tensor_release(&s->d_probs);
  tensor_release(&s->d_hidden);
  tensor_release(&s->d_partial);
  tensor_release(&s->d_ffn);
  tensor_release(&s->d_ctx);
  tensor_release(&s->d_qkv);
  tensor_release(&s->d_norm);
}
