/*
 * gpu/parallel/transformer.h: a transformer encoder for classification whose units can be split
 * over a tensor-parallel group (Megatron-LM style) and cut into pipeline chunks.
 *
 * The model is a sequence of units: unit 0 is the embedding (a linear map of each token's
 * features to hidden, plus a bias and a learned position embedding [seq, hidden]), units
 * 1..blocks are the blocks and unit blocks + 1 is the head (the mean over tokens, then a
 * linear map to classes -> logits [n, classes]).
 *
 * A block has no layer norm, to keep the device's operation set small:
 *   x1 = x + dropout(attn(x));  y = x1 + dropout(mlp(x1)).
 * Attention is bidirectional (no causal mask): per head softmax(q k^T / sqrt(d)) with
 * dropout on the probabilities, times v, then the out projection. The MLP is fc1, GELU, fc2.
 *
 * Tensor parallelism (Shoeybi et al., Megatron-LM): attention is split by heads (qkv
 * column-parallel, out projection row-parallel) and the MLP by its inner width (fc1
 * column-parallel, fc2 row-parallel). The partial outputs of the row-parallel layers are
 * summed by an allreduce over the group (Megatron's g; identity in backward), and the input
 * gradients of the column-parallel layers likewise (Megatron's f; identity in forward). The
 * embedding, the head and the biases of the row-parallel layers are replicated: every rank
 * computes the same values and the same gradients for them.
 *
 * Every rank, chunk and micro-batch holds exactly a slice of the single-rank model:
 * - weights are drawn per element from (spec seed, parameter name, index in the unsplit
 *   tensor), so a shard holds the slice of the unsplit weights (tfm_chunk_param_place);
 * - dropout masks are keyed by (spec seed, step, unit, site), the global sample
 *   (tfm_batch.row0 + i) and the global head, never by the rank, so neither the split nor
 *   the micro-batching changes them.
 * Results then agree with a single rank up to float rounding (the allreduce sums in another
 * order).
 *
 * The qkv projection's rows are ordered by head, q, k and v of head 0 first: [heads, 3, d]
 * (d = hidden / heads), so that a rank's heads are one contiguous block of rows.
 *
 * The GPT form (spec.kind TFM_GPT), a byte-level language model: each token is an id in
 * [0, vocab) (x [n, seq, 1], the ids as floats); unit 0 looks up a token embedding
 * [vocab, hidden] and adds the learned positions [seq, hidden]; blocks are pre-LN,
 *   x1 = x + dropout(attn(ln1(x)));  y = x1 + dropout(mlp(ln2(x1))),
 * with causal attention (a position attends to itself and earlier ones); the head is a final
 * layer norm and a linear map to vocab per token -> logits [n, seq, vocab], trained on the
 * mean cross-entropy of every token's next one. Layer norms, like the embedding and the head,
 * are replicated over the tensor-parallel group.
 *
 * Threading: a chunk is used by one thread at a time. Every rank of a tensor-parallel group
 * calls forward and backward on its chunk in the same order with the same arguments (x and dy
 * are full, replicated tensors on every rank), since both run collectives.
 */
#ifndef FLINT_GPU_TRANSFORMER_H
#define FLINT_GPU_TRANSFORMER_H

#include "gpu/nn/nn.h"

typedef enum tfm_kind {
  TFM_ENCODER = 0, /* the classifier above: features in, classes out (the default) */
  TFM_GPT,         /* the causal language model: token ids in, next-token logits out */
} tfm_kind;

typedef struct tfm_spec {
  int seq;       /* tokens per sample */
  int features;  /* input features per token */
  int hidden;    /* model width */
  int heads;     /* attention heads; hidden % heads == 0 */
  int ffn;       /* MLP inner width (0: 4 * hidden) */
  int blocks;    /* transformer blocks */
  int classes;
  float dropout; /* probability in [0, 1) for every dropout site */
  uint64_t seed; /* weights and dropout masks */
  tfm_kind kind; /* TFM_ENCODER (0) or TFM_GPT, which ignores features and classes */
  int vocab;     /* TFM_GPT: token ids in [0, vocab) (bytes: 256) */
  /* Sequence parallelism (Korthikanti et al. 2022; gpu/parallel/tensor_parallel.c): between
   * the tensor-parallel regions each rank of the group keeps seq / tp of the tokens. Needs a
   * group of tp > 1 dividing seq. A chunk's input and output stay whole: it slices its input
   * before its first block and all-gathers after its last. */
  bool sequence_parallel;
  /* Selective activation recomputation (the same paper): no [n, heads, seq, seq] tensor is
   * kept; backward recomputes the attention probabilities from the kept q, k and v. */
  bool selective_recompute;
} tfm_spec;

/* The number of units: blocks + 2. */
int tfm_units(const tfm_spec *spec);
/* Floats per input token: features (encoder) or 1 (GPT, the token id). */
int tfm_input_width(const tfm_spec *spec);
/* Logits per prediction (classes or vocab) and predictions per sample (1, or seq for GPT:
 * one per token, against the next token). */
int tfm_output_classes(const tfm_spec *spec);
int tfm_targets_per_sample(const tfm_spec *spec);
/* FL_OK when the spec can be built and split over tp_size ranks; FL_EINVAL with
 * fl_last_error() naming the field ("heads", "ffn", "dropout", "sequence parallel", ...)
 * otherwise. */
fl_status tfm_spec_check(const tfm_spec *spec, int tp_size);

/* What one micro-batch is, for dropout keys: */
typedef struct tfm_batch {
  int64_t row0;  /* global index of this micro-batch's first sample within the mini-batch */
  uint64_t step; /* optimizer step */
} tfm_batch;

typedef struct tfm_chunk tfm_chunk;

/* Units [first_unit, end_unit) on dev, split over a tensor-parallel group of tp_size ranks
 * (tp_comm: that group's communicator, NULL when tp_size == 1; this rank is tp_rank in it;
 * borrowed, it must outlive the chunk). Weights are initialised as described above and
 * gradients zeroed. FL_EINVAL names a bad spec, unit range or group. */
fl_status tfm_chunk_create(fl_device *dev, const tfm_spec *spec, int first_unit, int end_unit,
                           fl_comm *tp_comm, int tp_rank, int tp_size, tfm_chunk **out);
/* Frees the chunk and every slot. NULL does nothing. */
void tfm_chunk_destroy(tfm_chunk *c);

/* Forward of one micro-batch in activation slot `slot` (>= 0; slots are created on first use,
 * each holds the activations of one micro-batch from its forward until its backward, so that
 * several micro-batches can be in flight, as pipeline schedules need). x: [n, seq, features]
 * ([n, seq, 1] for GPT) if the chunk starts at unit 0, else [n, seq, hidden]; it is copied into the slot, so the
 * caller may reuse it at once. b: the micro-batch's keys (NULL: row0 0, step 0). train
 * selects dropout. *y (owned by the slot, valid until the slot's next forward):
 * [n, seq, hidden], or [n, classes] ([n, seq, vocab] for GPT) when the chunk ends with the head. A forward into a slot
 * still in flight replaces its activations (inference needs no backward).
 * FL_EINVAL names a bad slot or shape; collective failures come back as the comm's codes. */
fl_status tfm_chunk_forward(tfm_chunk *c, int slot, const fl_tensor *x, const tfm_batch *b,
                            bool train, const fl_tensor **y);
/* Backward of the slot's forward from dy (shaped as its y): ACCUMULATES parameter gradients;
 * *dx shaped as x (NULL when dx is NULL or the chunk starts at unit 0; owned by the slot,
 * valid until the slot's next backward). Frees the slot for reuse (its memory is kept).
 * FL_ESTATE when the slot holds no forward or dy has the wrong shape. */
fl_status tfm_chunk_backward(tfm_chunk *c, int slot, const fl_tensor *dy, const fl_tensor **dx);

/* Parameters: one flat value buffer and one flat gradient buffer (as nn_model), in order:
 * per unit, embed.{weight, bias, position}; blocks.<b>.attn.qkv.{weight, bias},
 * blocks.<b>.attn.out.{weight, bias}, blocks.<b>.mlp.fc1.{weight, bias},
 * blocks.<b>.mlp.fc2.{weight, bias} (b = unit - 1); head.{weight, bias}. GPT: embed.{token,
 * position}; blocks.<b>.ln1.{weight, bias}, the attention's four, blocks.<b>.ln2.{weight,
 * bias}, the MLP's four; head.ln.{weight, bias}, head.{weight, bias}. Owned by the chunk. */
fl_tensor *tfm_chunk_values(tfm_chunk *c);
fl_tensor *tfm_chunk_grads(tfm_chunk *c);
fl_status tfm_chunk_zero_grad(tfm_chunk *c);
size_t tfm_chunk_param_count(const tfm_chunk *c);
nn_param *tfm_chunk_param(tfm_chunk *c, size_t i);

/* Where parameter i sits in the UNSPLIT model: its full shape is [rows, cols] (vectors: rows
 * 1), and this rank holds rows [row0, row0 + value rows) and cols [col0, col0 + value cols) of
 * it; replicated parameters have row0 = col0 = 0 and the full shape. */
typedef struct tfm_param_place {
  int64_t rows, cols, row0, col0;
  bool replicated;
} tfm_param_place;
tfm_param_place tfm_chunk_param_place(const tfm_chunk *c, size_t i);

/* Activation memory: bytes held by slots between their forward and their backward now (the
 * slot's copy of x and every saved activation, at the micro-batch's size), and the most held
 * at once since the last reset. */
size_t tfm_chunk_activation_bytes(const tfm_chunk *c);
size_t tfm_chunk_peak_activation_bytes(const tfm_chunk *c);
void tfm_chunk_reset_peak(tfm_chunk *c);

#endif /* FLINT_GPU_TRANSFORMER_H */
