/*
 * gpu/parallel/tensor_parallel.h: the transformer block split over a tensor-parallel group
 * (gpu/parallel/tensor_parallel.c), private to gpu/parallel/transformer.c. The block's layout
 * and its collectives are described in gpu/parallel/transformer.h.
 */
#ifndef FLINT_GPU_TENSOR_PARALLEL_H
#define FLINT_GPU_TENSOR_PARALLEL_H

#include "gpu/nn/nn.h"

/* A block's sizes on this rank. */
typedef struct tp_dims {
  int seq, hidden, heads; /* of the unsplit model */
  int head_dim;           /* hidden / heads */
  int local_heads, head0; /* this rank's heads: [head0, head0 + local_heads) */
  int local_ffn;          /* this rank's share of the MLP's inner width */
  float dropout;
  bool gpt; /* pre-LN block with causal attention (transformer.h's TFM_GPT) */
  /* Sequence parallelism (Korthikanti et al.): the block's input and output, its residual
   * adds, dropouts and layer norms are this rank's slice [n, local_seq, hidden] of the
   * sequence, tokens [seq0, seq0 + local_seq); else local_seq = seq, seq0 = 0. */
  bool sp;
  int tp_size, local_seq, seq0;
  bool selective; /* keep no [n, heads, seq, seq] tensor: recompute the probabilities in backward */
} tp_dims;

/* The block's parameters in order (views into the chunk's flat buffers). */
enum {
  TP_QKV_W = 0,
  TP_QKV_B,
  TP_OUT_W,
  TP_OUT_B,
  TP_FC1_W,
  TP_FC1_B,
  TP_FC2_W,
  TP_FC2_B,
  TP_LN1_G, /* the GPT form's layer norms (NULL in the encoder's blocks); replicated */
  TP_LN1_B,
  TP_LN2_G,
  TP_LN2_B,
  TP_NPARAMS
};

/* The dropout sites of a block; their seeds are derived per (step, unit, site). */
enum { TP_SITE_PROBS = 0, TP_SITE_ATTN_OUT, TP_SITE_MLP_OUT, TP_NSITES };

/* Dropout of one forward and its backward: `active` when training with dropout > 0. */
typedef struct tp_keys {
  bool active;
  int64_t row0; /* global index of the micro-batch's first sample */
  uint64_t seed[TP_NSITES];
} tp_keys;

/* What a block saves in a slot from its forward for its backward (the input is the slot's
 * previous activation, kept there). */
typedef struct tp_block_acts {
  fl_tensor qkv;   /* [n*seq, local_heads * 3 * head_dim] */
  fl_tensor probs; /* [n, local_heads, seq, seq], before dropout (empty when selective) */
  fl_tensor ctx;   /* [n*seq, local_heads * head_dim] */
  fl_tensor x1;    /* [n, local_seq, hidden] */
  fl_tensor h1;    /* [n*seq, local_ffn], before GELU */
  fl_tensor act;   /* [n*seq, local_ffn], after GELU */
  fl_tensor y;     /* [n, local_seq, hidden] */
  /* GPT form only (empty otherwise): the layer norms' outputs [n*local_seq, hidden] and
   * their per-token mean and 1 / std [n*local_seq]. */
  fl_tensor xn1, xn2, mean1, rstd1, mean2, rstd2;
} tp_block_acts;
#define TP_BLOCK_ACTS 13

/* Scratch shared by every block of a chunk: one forward or backward runs at a time. */
typedef struct tp_scratch {
  fl_tensor scores, dropped, d_probs;   /* [n, local_heads, seq, seq] */
  fl_tensor d_hidden;                   /* [n*local_seq, hidden] */
  fl_tensor d_partial;                  /* [n*seq, hidden] */
  fl_tensor d_ffn;                      /* [n*seq, local_ffn] */
  fl_tensor d_ctx;                      /* [n*seq, local_heads * head_dim] */
  fl_tensor d_qkv;                      /* [n*seq, local_heads * 3 * head_dim] */
  fl_tensor d_norm, d_local;            /* [n*local_seq, hidden] */
  fl_tensor probs;                      /* selective: [n, local_heads, seq, seq] */
  /* sequence parallel: [n, seq, hidden] each; `gathered` holds the group's slices in rank
   * order ([tp, n, local_seq, hidden]) on their way in and out of the collectives */
  fl_tensor full, full_grad, partial, gathered;
  fl_tensor rep; /* sequence parallel: the replicated parameters' gradients of one backward */
} tp_scratch;

typedef struct tp_block {
  fl_device *dev;
  fl_comm *comm; /* NULL for a group of one */
  tp_dims dims;
  nn_param *p[TP_NPARAMS];
  tp_scratch *scratch;
} tp_block;

/* Forward of x [n, local_seq, hidden] into a->y, saving what backward needs in a. */
fl_status tp_block_forward(const tp_block *k, const fl_tensor *x, const tp_keys *keys,
                           tp_block_acts *a);
/* Backward from dy [n, local_seq, hidden] after the forward that filled a from x: ACCUMULATES the
 * parameter gradients and overwrites dx (shaped as x, not aliasing dy) with the input
 * gradient. need_dx false skips the input gradient's last GEMM and allreduce, leaving dx
 * undefined (it is still used as scratch); every rank of the group must pass the same. */
fl_status tp_block_backward(const tp_block *k, const fl_tensor *x, const tp_keys *keys,
                            const tp_block_acts *a, const fl_tensor *dy, bool need_dx,
                            fl_tensor *dx);
void tp_block_acts_release(tp_block_acts *a);
size_t tp_block_acts_bytes(const tp_block_acts *a);
void tp_scratch_release(tp_scratch *s);

#endif /* FLINT_GPU_TENSOR_PARALLEL_H */
