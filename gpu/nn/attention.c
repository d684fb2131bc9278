/*
 * gpu/nn/attention.c: the core of scaled dot-product attention over a packed qkv activation,
 * per head and batched over the samples (gpu/nn/nn.h's attn_*), shared by the attention
 * layer (gpu/nn/layers_seq.c) and the tensor-parallel transformer block
 * (gpu/parallel/tensor_parallel.c), which pack q, k and v differently (attn_layout).
 *
 * Per head h of sample b: scores = q k^T (s x s), probs = softmax(scores / sqrt(d)),
 * ctx = probs' v, where probs' is probs after whatever the caller does between the two
 * steps (dropout). Scores and probabilities are [n, heads, s, s]; ctx is [n * s, heads * d],
 * head h at column h * d.
 */
#include <math.h>

#include "common/common.h"
#include "gpu/nn/nn.h"

static size_t part_at(const attn_layout *L, int part, int h) {
  return (size_t)L->part_offset[part] + (size_t)h * L->head_step;
}

static size_t probs_stride(const attn_layout *L) { return (size_t)L->heads * L->s * L->s; }
static size_t qkv_stride(const attn_layout *L) { return (size_t)L->s * L->qkv_ld; }
static size_t ctx_stride(const attn_layout *L) { return (size_t)L->s * L->heads * L->d; }

fl_status attn_probs_forward(fl_device *dev, const attn_layout *L, const float *qkv, float *scores, float *probs) {
  const device_ops *op = dev->ops;
  int s = L->s, d = L->d;
  for (int h = 0; h < L->heads; h++) {
    fl_status st = op->gemm_batched(dev, false, true, s, s, d, 1.0f, qkv + part_at(L, 0, h), L->qkv_ld, qkv_stride(L),
                                    qkv + part_at(L, 1, h), L->qkv_ld, qkv_stride(L), 0.0f,
                                    scores + (size_t)h * s * s, s, probs_stride(L), L->n);
    if (st != FL_OK) return st;
  }
  if (L->causal) {
    fl_status st = op->causal_mask(dev, L->n * L->heads, s, scores);
    if (st != FL_OK) return st;
  }
  return op->softmax_rows_forward(dev, L->n * L->heads * s, s, 1.0f / sqrtf((float)d), scores, probs);
}

fl_status attn_context_forward(fl_device *dev, const attn_layout *L, const float *probs, const float *qkv, float *ctx) {
  int s = L->s, d = L->d, ld = L->heads * d;
  for (int h = 0; h < L->heads; h++) {
    fl_status st = dev->ops->gemm_batched(dev, false, false, s, d, s, 1.0f, probs + (size_t)h * s * s, s,
                                          probs_stride(L), qkv + part_at(L, 2, h), L->qkv_ld, qkv_stride(L), 0.0f,
                                          ctx + (size_t)h * d, ld, ctx_stride(L), L->n);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status attn_context_backward(fl_device *dev, const attn_layout *L, const float *probs, const float *qkv,
                                const float *d_ctx, float *d_probs, float *d_qkv) {
  int s = L->s, d = L->d, ld = L->heads * d;
  for (int h = 0; h < L->heads; h++) {
    const float *dctx = d_ctx + (size_t)h * d;
    /* d(probs') = dctx v^T;  dv = probs'^T dctx */
    fl_status st = dev->ops->gemm_batched(dev, false, true, s, s, d, 1.0f, dctx, ld, ctx_stride(L),
                                          qkv + part_at(L, 2, h), L->qkv_ld, qkv_stride(L), 0.0f,
                                          d_probs + (size_t)h * s * s, s, probs_stride(L), L->n);
    if (st == FL_OK)
      st = dev->ops->gemm_batched(dev, true, false, s, d, s, 1.0f, probs + (size_t)h * s * s, s, probs_stride(L),
                                  dctx, ld, ctx_stride(L), 0.0f, d_qkv + part_at(L, 2, h), L->qkv_ld, qkv_stride(L),
                                  L->n);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status attn_probs_backward(fl_device *dev, const attn_layout *L, const float *probs, const float *d_probs,
                              const float *qkv, float *d_scores, float *d_qkv) {
  const device_ops *op = dev->ops;
  int s = L->s, d = L->d;
  fl_status st = op->softmax_rows_backward(dev, L->n * L->heads * s, s, 1.0f / sqrtf((float)d), probs, d_probs,
                                           d_scores);
  for (int h = 0; st == FL_OK && h < L->heads; h++) {
    const float *ds = d_scores + (size_t)h * s * s;
    /* dq = dscores k;  dk = dscores^T q */
    st = op->gemm_batched(dev, false, false, s, d, s, 1.0f, ds, s, probs_stride(L), qkv + part_at(L, 1, h), L->qkv_ld,
                          qkv_stride(L), 0.0f, d_qkv + part_at(L, 0, h), L->qkv_ld, qkv_stride(L), L->n);
    if (st == FL_OK)
      st = op->gemm_batched(dev, true, false, s, d, s, 1.0f, ds, s, probs_stride(L), qkv + part_at(L, 0, h), L->qkv_ld,
                            qkv_stride(L), 0.0f, d_qkv + part_at(L, 1, h), L->qkv_ld, qkv_stride(L), L->n);
  }
  return st;
}
