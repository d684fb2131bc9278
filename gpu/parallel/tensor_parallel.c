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
 * Sequence parallelism (dims.sp, Korthikanti et al. 2022): outside the two tensor-parallel
 * regions (attention and MLP) every rank holds only its slice of the sequence, so the residual
 * adds, the dropouts after the projections and the layer norms run on seq / tp tokens and keep
 * a tp-th of their activations. Entering a region, the slices are all-gathered into the full
 * sequence (Megatron's f becomes g-bar: all-gather forward, reduce-scatter backward); leaving
 * it, the row-parallel layer's partial sums are reduce-scattered along the sequence instead
 * of allreduced (g: reduce-scatter forward, all-gather backward). Parameters applied to slices
 * (the layer norms, the row-parallel biases) get a slice's gradient on each rank, summed over
 * the group once per backward (one allreduce of tp_scratch.rep).
 *
 * The slice layout: the model's activations are [n, seq, hidden], so a rank's tokens
 * [seq0, seq0 + seq/tp) are not contiguous across samples. Megatron lays activations out as
 * [seq, n, hidden] to make them so; here the block keeps [n, seq, hidden] (attention, the
 * dropout keys and the embedding and head stay as they are) and a rank's slice is its own
 * contiguous [n, seq/tp, hidden] tensor. The collectives move whole slices, in rank order:
 * all-gather yields [tp, n, seq/tp, hidden], which one swap of the first two axes (swap01)
 * turns into [n, seq, hidden], and the partial sums are swapped the other way before the
 * reduce-scatter. That costs one local copy of the full activation per collective, against
 * changing the layout of everything else.
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

/* A flat view of count floats at data (for the collectives). */
static fl_tensor flat(fl_device *dev, const float *data, size_t count) {
  fl_tensor t = {0};
  t.dev = dev;
  t.ndim = 1;
  t.shape[0] = (int64_t)count;
  t.numel = count;
  t.data = (float *)data;
  t.capacity = count;
  return t;
}

/* Dropout of this rank's [n, local_seq, hidden] activation in place (a site after a
 * projection), keyed by the token's place in the whole sequence. */
static fl_status drop_hidden(const tp_block *k, const tp_keys *keys, int site, int n, float *t,
                             bool backward) {
  if (!keys->active) return FL_OK;
  fl_device *dev = k->dev;
  const tp_dims *D = &k->dims;
  if (backward)
    return dev->ops->dropout_backward(dev, n, D->local_seq, D->hidden, keys->row0, D->seq0, D->seq,
                                      D->dropout, keys->seed[site], t, t);
  return dev->ops->dropout_forward(dev, n, D->local_seq, D->hidden, keys->row0, D->seq0, D->seq,
                                   D->dropout, keys->seed[site], t, t);
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

/* The probabilities after dropout: S->dropped when dropout is active, else probs. */
static fl_status dropped_probs(const tp_block *k, const tp_keys *keys, int n, const float *probs,
                               const float **out) {
  *out = probs;
  if (!keys->active) return FL_OK;
  *out = k->scratch->dropped.data;
  return drop_probs(k, keys, n, probs, k->scratch->dropped.data, false);
}

/* A block's sizes for a micro-batch of n samples (see the top of the file for the names):
 * T tokens in all, Tl in this rank's slice (T unless sequence parallel). */
typedef struct geom {
  int n, s, sl, H, d, hl, T, Tl, q3, F;
  int64_t qkv_shape[2], p_shape[4], ctx_shape[2], h_shape[3], hl_shape[3], f_shape[2], tl_shape[1];
} geom;

static geom geom_of(const tp_dims *D, int n) {
  geom g = {.n = n, .s = D->seq, .sl = D->local_seq, .H = D->hidden, .d = D->head_dim,
            .hl = D->local_heads, .F = D->local_ffn};
  g.T = n * g.s;
  g.Tl = n * g.sl;
  g.q3 = g.hl * 3 * g.d;
  int64_t qkv[2] = {g.T, g.q3}, p[4] = {n, g.hl, g.s, g.s}, ctx[2] = {g.T, g.hl * g.d};
  int64_t h[3] = {n, g.s, g.H}, hl[3] = {n, g.sl, g.H}, f[2] = {g.T, g.F}, tl[1] = {g.Tl};
  memcpy(g.qkv_shape, qkv, sizeof qkv);
  memcpy(g.p_shape, p, sizeof p);
  memcpy(g.ctx_shape, ctx, sizeof ctx);
  memcpy(g.h_shape, h, sizeof h);
  memcpy(g.hl_shape, hl, sizeof hl);
  memcpy(g.f_shape, f, sizeof f);
  memcpy(g.tl_shape, tl, sizeof tl);
  return g;
}

/* This rank's heads in the [heads, 3, d] packing of qkv. */
static attn_layout layout_of(const tp_block *k, const geom *G) {
  return (attn_layout){.n = G->n, .s = G->s, .d = G->d, .heads = G->hl, .qkv_ld = G->q3,
                       .part_offset = {0, G->d, 2 * G->d}, .head_step = 3 * G->d,
                       .causal = k->dims.gpt};
}

#define TP_LN_EPS 1e-5f

static float *val(const tp_block *k, int i) { return k->p[i]->value.data; }
static float *grad(const tp_block *k, int i) { return k->p[i]->grad.data; }

/* Sequence parallel: the parameters applied to slices, in tp_scratch.rep's order. */
static const int rep_params[] = {TP_OUT_B, TP_FC2_B, TP_LN1_G, TP_LN1_B, TP_LN2_G, TP_LN2_B};
#define REP_PARAMS (int)(sizeof rep_params / sizeof rep_params[0])

/* Where backward accumulates parameter i's gradient: its own, or (sequence parallel, a
 * parameter applied to slices) its place in S->rep, summed over the group at the end. */
static float *grad_at(const tp_block *k, int i) {
  if (!k->dims.sp) return grad(k, i);
  for (int j = 0; j < REP_PARAMS; j++)
    if (rep_params[j] == i) return k->scratch->rep.data + (size_t)j * k->dims.hidden;
  return grad(k, i);
}

/* Sequence parallel: the full [n, seq, hidden] from every rank's slice `mine` (all-gather,
 * then the slices from rank order into sequence order). */
static fl_status sp_gather(const tp_block *k, const geom *G, const float *mine, float *full) {
  tp_scratch *S = k->scratch;
  size_t local = (size_t)G->Tl * G->H;
  fl_tensor in = flat(k->dev, mine, local), out = flat(k->dev, S->gathered.data, local * k->dims.tp_size);
  fl_status st = fl_comm_allgather(k->comm, &in, &out);
  if (st != FL_OK) return st;
  return k->dev->ops->swap01(k->dev, k->dims.tp_size, G->n, G->sl * G->H, S->gathered.data, full);
}

/* Sequence parallel: this rank's slice of the group's sum of `partial` [n, seq, hidden]
 * (the slices into rank order, then reduce-scatter). */
static fl_status sp_reduce_scatter(const tp_block *k, const geom *G, const float *partial, float *mine) {
  tp_scratch *S = k->scratch;
  size_t local = (size_t)G->Tl * G->H;
  fl_status st = k->dev->ops->swap01(k->dev, G->n, k->dims.tp_size, G->sl * G->H, partial, S->gathered.data);
  if (st != FL_OK) return st;
  fl_tensor in = flat(k->dev, S->gathered.data, local * k->dims.tp_size), out = flat(k->dev, mine, local);
  return fl_comm_reduce_scatter(k->comm, &in, &out, FL_REDUCE_SUM);
}

/* Leaving a tensor-parallel region: `out` [n, local_seq, hidden] = the group's sum of the
 * partial products at `partial` (the allreduce in place when not sequence parallel, where
 * partial is out's memory). */
static fl_status reduce_out(const tp_block *k, const geom *G, const float *partial, fl_tensor *out) {
  if (k->dims.sp) return sp_reduce_scatter(k, G, partial, out->data);
  if (!k->comm) return FL_OK;
  return fl_comm_allreduce(k->comm, out, FL_REDUCE_SUM);
}

/* Entering one: the full sequence of the slice `mine` (itself when not sequence parallel). */
static fl_status enter_full(const tp_block *k, const geom *G, const float *mine, fl_tensor *buf,
                            const float **full) {
  *full = mine;
  if (!k->dims.sp) return FL_OK;
  *full = buf->data;
  return sp_gather(k, G, mine, buf->data);
}

fl_status tp_block_forward(const tp_block *k, const fl_tensor *x, const tp_keys *keys,
                           tp_block_acts *a) {
  fl_device *dev = k->dev;
  const device_ops *op = dev->ops;
  tp_scratch *S = k->scratch;
  const geom G = geom_of(&k->dims, (int)x->shape[0]);
  int n = G.n, H = G.H, d = G.d, hl = G.hl, T = G.T, Tl = G.Tl, q3 = G.q3, F = G.F;
  const bool gpt = k->dims.gpt, sp = k->dims.sp, selective = k->dims.selective;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->qkv, dev, 2, G.qkv_shape));
  FL_CHECK(tensor_ensure(selective ? &S->probs : &a->probs, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&a->ctx, dev, 2, G.ctx_shape));
  FL_CHECK(tensor_ensure(&a->x1, dev, 3, G.hl_shape));
  FL_CHECK(tensor_ensure(&a->h1, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&a->act, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&a->y, dev, 3, G.hl_shape));
  FL_CHECK(tensor_ensure(&S->scores, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&S->dropped, dev, 4, G.p_shape));
  if (gpt) {
    FL_CHECK(tensor_ensure(&a->xn1, dev, 3, G.hl_shape));
    FL_CHECK(tensor_ensure(&a->xn2, dev, 3, G.hl_shape));
    FL_CHECK(tensor_ensure(&a->mean1, dev, 1, G.tl_shape));
    FL_CHECK(tensor_ensure(&a->rstd1, dev, 1, G.tl_shape));
    FL_CHECK(tensor_ensure(&a->mean2, dev, 1, G.tl_shape));
    FL_CHECK(tensor_ensure(&a->rstd2, dev, 1, G.tl_shape));
  }
  if (sp) {
    FL_CHECK(tensor_ensure(&S->full, dev, 3, G.h_shape));
    FL_CHECK(tensor_ensure(&S->partial, dev, 3, G.h_shape));
    FL_CHECK(tensor_ensure(&S->gathered, dev, 3, G.h_shape));
  }
  float *probs = selective ? S->probs.data : a->probs.data;

  /* Attention (GPT: of ln1(x)), on the full sequence. */
  const float *attn_in = x->data, *in_full;
  if (gpt) {
    FL_CHECK(op->layernorm_forward(dev, Tl, H, TP_LN_EPS, x->data, val(k, TP_LN1_G), val(k, TP_LN1_B),
                                   a->xn1.data, a->mean1.data, a->rstd1.data));
    attn_in = a->xn1.data;
  }
  FL_CHECK(enter_full(k, &G, attn_in, &S->full, &in_full));
  FL_CHECK(op->gemm(dev, false, true, T, q3, H, 1.0f, in_full, H, val(k, TP_QKV_W), H, 0.0f,
                    a->qkv.data, q3));
  FL_CHECK(op->bias_add_rows(dev, T, q3, val(k, TP_QKV_B), a->qkv.data));
  const attn_layout L = layout_of(k, &G);
  FL_CHECK(attn_probs_forward(dev, &L, a->qkv.data, S->scores.data, probs));
  const float *pd;
  FL_CHECK(dropped_probs(k, keys, n, probs, &pd));
  FL_CHECK(attn_context_forward(dev, &L, pd, a->qkv.data, a->ctx.data));
  float *part = sp ? S->partial.data : a->x1.data;
  FL_CHECK(op->gemm(dev, false, true, T, H, hl * d, 1.0f, a->ctx.data, hl * d, val(k, TP_OUT_W),
                    hl * d, 0.0f, part, H));
  FL_CHECK(reduce_out(k, &G, part, &a->x1));
  FL_CHECK(op->bias_add_rows(dev, Tl, H, val(k, TP_OUT_B), a->x1.data));
  FL_CHECK(drop_hidden(k, keys, TP_SITE_ATTN_OUT, n, a->x1.data, false));
  FL_CHECK(op->axpy(dev, (size_t)Tl * H, 1.0f, x->data, a->x1.data));

  /* MLP (GPT: of ln2(x1)). */
  const float *mlp_in = a->x1.data;
  if (gpt) {
    FL_CHECK(op->layernorm_forward(dev, Tl, H, TP_LN_EPS, a->x1.data, val(k, TP_LN2_G), val(k, TP_LN2_B),
                                   a->xn2.data, a->mean2.data, a->rstd2.data));
    mlp_in = a->xn2.data;
  }
  FL_CHECK(enter_full(k, &G, mlp_in, &S->full, &in_full));
  FL_CHECK(op->gemm(dev, false, true, T, F, H, 1.0f, in_full, H, val(k, TP_FC1_W), H, 0.0f,
                    a->h1.data, F));
  FL_CHECK(op->bias_add_rows(dev, T, F, val(k, TP_FC1_B), a->h1.data));
  FL_CHECK(op->gelu_forward(dev, (size_t)T * F, a->h1.data, a->act.data));
  part = sp ? S->partial.data : a->y.data;
  FL_CHECK(op->gemm(dev, false, true, T, H, F, 1.0f, a->act.data, F, val(k, TP_FC2_W), F, 0.0f,
                    part, H));
  FL_CHECK(reduce_out(k, &G, part, &a->y));
  FL_CHECK(op->bias_add_rows(dev, Tl, H, val(k, TP_FC2_B), a->y.data));
  FL_CHECK(drop_hidden(k, keys, TP_SITE_MLP_OUT, n, a->y.data, false));
  FL_CHECK(op->axpy(dev, (size_t)Tl * H, 1.0f, a->x1.data, a->y.data));
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
  int n = G.n, H = G.H, d = G.d, hl = G.hl, T = G.T, Tl = G.Tl, q3 = G.q3, F = G.F;
  size_t th = (size_t)Tl * H;
  const bool gpt = k->dims.gpt, sp = k->dims.sp, selective = k->dims.selective;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(dx, dev, 3, G.hl_shape));
  FL_CHECK(tensor_ensure(&S->d_hidden, dev, 3, G.hl_shape));
  FL_CHECK(tensor_ensure(&S->d_partial, dev, 3, G.h_shape));
  FL_CHECK(tensor_ensure(&S->d_ffn, dev, 2, G.f_shape));
  FL_CHECK(tensor_ensure(&S->d_ctx, dev, 2, G.ctx_shape));
  FL_CHECK(tensor_ensure(&S->d_qkv, dev, 2, G.qkv_shape));
  FL_CHECK(tensor_ensure(&S->dropped, dev, 4, G.p_shape));
  FL_CHECK(tensor_ensure(&S->d_probs, dev, 4, G.p_shape));
  if (gpt) FL_CHECK(tensor_ensure(&S->d_norm, dev, 3, G.hl_shape));
  if (sp) {
    int64_t rep[1] = {(int64_t)REP_PARAMS * H};
    FL_CHECK(tensor_ensure(&S->d_local, dev, 3, G.hl_shape));
    FL_CHECK(tensor_ensure(&S->full, dev, 3, G.h_shape));
    FL_CHECK(tensor_ensure(&S->full_grad, dev, 3, G.h_shape));
    FL_CHECK(tensor_ensure(&S->gathered, dev, 3, G.h_shape));
    FL_CHECK(tensor_ensure(&S->rep, dev, 1, rep));
    FL_CHECK(op->memset0(dev, S->rep.data, S->rep.numel * sizeof(float)));
  }
  if (selective) {
    FL_CHECK(tensor_ensure(&S->probs, dev, 4, G.p_shape));
    FL_CHECK(tensor_ensure(&S->scores, dev, 4, G.p_shape));
  }
  const float *attn_in = gpt ? a->xn1.data : x->data, *mlp_in = gpt ? a->xn2.data : a->x1.data;
  const float *full;

  /* MLP: the gradient at fc2's output is dropout's backward of dy (g's backward: the identity,
   * or sequence parallel an all-gather). */
  const float *d_out = dy->data;
  if (keys->active) {
    FL_CHECK(op->copy(dev, S->d_hidden.data, dy->data, th * sizeof(float)));
    FL_CHECK(drop_hidden(k, keys, TP_SITE_MLP_OUT, n, S->d_hidden.data, true));
    d_out = S->d_hidden.data;
  }
  FL_CHECK(op->bias_grad_rows(dev, Tl, H, d_out, grad_at(k, TP_FC2_B)));
  FL_CHECK(enter_full(k, &G, d_out, &S->full_grad, &d_out));
  FL_CHECK(op->gemm(dev, true, false, H, F, T, 1.0f, d_out, H, a->act.data, F, 1.0f,
                    grad(k, TP_FC2_W), F));
  FL_CHECK(op->gemm(dev, false, false, T, F, H, 1.0f, d_out, H, val(k, TP_FC2_W), F, 0.0f,
                    S->d_ffn.data, F));
  FL_CHECK(op->gelu_backward(dev, (size_t)T * F, a->h1.data, S->d_ffn.data, S->d_ffn.data));
  /* fc1's input again: sequence parallel keeps only the slice (as Megatron, which gathers it
   * again in backward rather than keep the full sequence). */
  FL_CHECK(enter_full(k, &G, mlp_in, &S->full, &full));
  FL_CHECK(op->gemm(dev, true, false, F, H, T, 1.0f, S->d_ffn.data, F, full, H, 1.0f,
                    grad(k, TP_FC1_W), H));
  FL_CHECK(op->bias_grad_rows(dev, T, F, S->d_ffn.data, grad(k, TP_FC1_B)));
  /* dx1 = dy (the residual) + the group's sum of fc1's input gradient (f's backward: an
   * allreduce, or a reduce-scatter), through ln2's backward in the GPT form. */
  {
    fl_tensor *to = gpt ? &S->d_norm : dx;
    FL_CHECK(op->gemm(dev, false, false, T, H, F, 1.0f, S->d_ffn.data, F, val(k, TP_FC1_W), H,
                      0.0f, sp ? S->d_partial.data : to->data, H));
    FL_CHECK(reduce_out(k, &G, S->d_partial.data, to));
  }
  if (gpt)
    FL_CHECK(op->layernorm_backward(dev, Tl, H, a->x1.data, S->d_norm.data, val(k, TP_LN2_G),
                                    a->mean2.data, a->rstd2.data, dx->data, grad_at(k, TP_LN2_G),
                                    grad_at(k, TP_LN2_B)));
  FL_CHECK(op->axpy(dev, th, 1.0f, dy->data, dx->data));

  /* Attention, from dx1 (in dx) through the out projection's dropout. */
  const float *d_attn = dx->data;
  if (keys->active) {
    FL_CHECK(op->copy(dev, S->d_hidden.data, dx->data, th * sizeof(float)));
    FL_CHECK(drop_hidden(k, keys, TP_SITE_ATTN_OUT, n, S->d_hidden.data, true));
    d_attn = S->d_hidden.data;
  }
  FL_CHECK(op->bias_grad_rows(dev, Tl, H, d_attn, grad_at(k, TP_OUT_B)));
  FL_CHECK(enter_full(k, &G, d_attn, &S->full_grad, &d_attn));
  FL_CHECK(op->gemm(dev, true, false, H, hl * d, T, 1.0f, d_attn, H, a->ctx.data, hl * d, 1.0f,
                    grad(k, TP_OUT_W), hl * d));
  FL_CHECK(op->gemm(dev, false, false, T, hl * d, H, 1.0f, d_attn, H, val(k, TP_OUT_W), hl * d,
                    0.0f, S->d_ctx.data, hl * d));
  const attn_layout L = layout_of(k, &G);
  /* Selective recomputation: the probabilities again from the kept qkv (the same operations
   * on the same inputs: the same bits). */
  const float *probs = a->probs.data;
  if (selective) {
    FL_CHECK(attn_probs_forward(dev, &L, a->qkv.data, S->scores.data, S->probs.data));
    probs = S->probs.data;
  }
  /* The dropped probabilities are recomputed from their keys rather than kept in the slot. */
  const float *pd;
  FL_CHECK(dropped_probs(k, keys, n, probs, &pd));
  FL_CHECK(attn_context_backward(dev, &L, pd, a->qkv.data, S->d_ctx.data, S->d_probs.data, S->d_qkv.data));
  if (keys->active) FL_CHECK(drop_probs(k, keys, n, S->d_probs.data, S->d_probs.data, true));
  /* The score gradient goes where the dropped probabilities were (no longer needed). */
  FL_CHECK(attn_probs_backward(dev, &L, probs, S->d_probs.data, a->qkv.data, S->dropped.data, S->d_qkv.data));
  FL_CHECK(enter_full(k, &G, attn_in, &S->full, &full));
  FL_CHECK(op->gemm(dev, true, false, q3, H, T, 1.0f, S->d_qkv.data, q3, full, H, 1.0f,
                    grad(k, TP_QKV_W), H));
  FL_CHECK(op->bias_grad_rows(dev, T, q3, S->d_qkv.data, grad(k, TP_QKV_B)));
  /* The input gradient through qkv (and ln1, whose parameters need it even when dx is not
   * wanted); every rank of the group passes the same need_dx. */
  if (gpt || need_dx) {
    fl_tensor *to = gpt ? &S->d_norm : sp ? &S->d_local : &S->d_partial;
    FL_CHECK(op->gemm(dev, false, false, T, H, q3, 1.0f, S->d_qkv.data, q3, val(k, TP_QKV_W), H,
                      0.0f, sp ? S->d_partial.data : to->data, H));
    FL_CHECK(reduce_out(k, &G, S->d_partial.data, to));
    if (gpt) {
      fl_tensor *dn = sp ? &S->d_local : &S->d_partial;
      FL_CHECK(op->layernorm_backward(dev, Tl, H, x->data, S->d_norm.data, val(k, TP_LN1_G),
                                      a->mean1.data, a->rstd1.data, dn->data, grad_at(k, TP_LN1_G),
                                      grad_at(k, TP_LN1_B)));
      to = dn;
    }
    if (need_dx) FL_CHECK(op->axpy(dev, th, 1.0f, to->data, dx->data));
  }
  /* Sequence parallel: the slice-applied parameters' gradients, summed over the group. */
  if (sp) {
    FL_CHECK(fl_comm_allreduce(k->comm, &S->rep, FL_REDUCE_SUM));
    for (int j = 0; j < REP_PARAMS; j++)
      if (k->p[rep_params[j]])
        FL_CHECK(op->axpy(dev, (size_t)H, 1.0f, S->rep.data + (size_t)j * H, grad(k, rep_params[j])));
  }
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
  tensor_release(&s->d_local);
  tensor_release(&s->probs);
  tensor_release(&s->full);
  tensor_release(&s->full_grad);
  tensor_release(&s->partial);
  tensor_release(&s->gathered);
  tensor_release(&s->rep);
}
