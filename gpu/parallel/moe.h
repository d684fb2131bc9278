/*
 * gpu/parallel/moe.h: a mixture-of-experts MLP layer (Shazeer et al. 2017; GShard, Lepikhin
 * et al. 2020; Switch Transformer, Fedus et al. 2021) with expert parallelism, meant to take
 * the place of a transformer block's MLP: tokens x [rows, hidden] -> y [rows, hidden], y
 * being the experts' weighted output only (the caller adds the residual, which carries the
 * tokens the experts dropped).
 *
 * Routing (gpu/parallel/moe_route.c, on the host): logits = x Wr^T ([rows, E], no bias),
 * p = softmax(logits). Each token picks its top_k experts (ties to the lower index); with
 * top_k 1 the gate is p of the chosen expert (Switch), with top_k >= 2 the chosen p are
 * renormalised to sum to 1 (GShard's top-2). The rows are cut into `groups` equal groups of
 * tokens, each routed on its own: an expert takes at most
 *   capacity = ceil(capacity_factor * group_tokens * top_k / E)
 * tokens of a group, first choices first (in token order), then second choices; the choices
 * over capacity are dropped (their contribution is zero). The load-balancing loss per group
 * is Switch's alpha * E * sum_e f_e * P_e, f_e the fraction of the group's tokens whose first
 * choice is e (before dropping) and P_e the mean of p over them; the layer's loss is the sum
 * over its groups times the forward's aux_weight (a trainer passes 1 / groups over all ranks,
 * which makes it the mean over every group of the global batch).
 *
 * Experts: E GELU MLPs (fc1 [ffn, hidden], GELU, fc2 [hidden, ffn], with biases).
 *
 * Expert parallelism over an ep-rank communicator (E % ep == 0; rank r holds experts
 * [r E/ep, (r+1) E/ep)): every rank routes its own tokens into a fixed-size dispatch buffer
 * [E, groups, capacity, hidden] (a row gather: the device's embedding_forward, empty slots
 * reading a zero row), fl_comm_alltoall sends expert e's block to its owner, which runs its
 * experts on [source rank, groups, capacity] rows each, and a second all-to-all brings the
 * outputs back; combine scales each slot by its gate and scatter-adds it onto its token
 * (embedding_backward). Backward runs the same way reversed, and the gate gradients go back
 * through the renormalisation and the softmax to the router (with the balancing loss's).
 *
 * Equivalence: a rank holding every expert that is given the tokens of all ep ranks with
 * groups = ep * g computes exactly the function of ep ranks with g groups each: the expert
 * inputs are laid out identically ([source rank, group, capacity] rows per expert), so the
 * experts' products and gradients run on the same rows in the same order. Every rank of the
 * group must call forward and backward in the same order with the same rows and groups (the
 * all-to-all buffers have a fixed size).
 *
 * In a transformer block (gpu/parallel/tensor_parallel.c, transformer.h's spec.experts): the
 * MLP becomes y = x1 + dropout(moe(x1)) on the [n * seq, hidden] rows, with groups = n (one
 * routing group per sample): capacity is then per sample, so neither micro-batching nor a
 * data-parallel split of the batch changes which tokens are dropped, and the balancing loss
 * with aux_weight 1 / (samples of the replica's batch) is, after the data-parallel average,
 * the mean over samples. The router and the experts are replicated over a tensor-parallel
 * group, the expert-parallel group being the data-parallel one; the moe_acts join the
 * slot's saved activations (moe_acts_bytes).
 *
 * Threading: a layer and its scratch are used by one thread at a time.
 */
#ifndef FLINT_GPU_MOE_H
#define FLINT_GPU_MOE_H

#include "gpu/nn/nn.h"

typedef struct moe_config {
  int hidden;            /* token width */
  int ffn;               /* experts' inner width */
  int experts;           /* E, over the whole expert-parallel group */
  int top_k;             /* 1: Switch; 2: GShard; at most experts */
  float capacity_factor; /* > 0 */
  float balance_alpha;   /* the balancing loss's alpha (Switch: 0.01); >= 0 */
} moe_config;

/* FL_OK when the config can run over ep_size ranks; FL_EINVAL naming the field otherwise
 * ("experts (6) must be a multiple of the expert-parallel size 4", "top_k", ...). */
fl_status moe_config_check(const moe_config *cfg, int ep_size);
/* ceil(capacity_factor * group_tokens * top_k / experts): the slots per expert and group. */
int moe_capacity(const moe_config *cfg, int group_tokens);

/* ---- routing (host) ---------------------------------------------------------------------- */

/* One forward's routing of `tokens` rows cut into `groups` groups. Slots are indexed
 * slot = (expert * groups + group) * capacity + position. */
typedef struct moe_route {
  int tokens, groups, experts, top_k, capacity;
  int32_t *slot_token; /* [experts * groups * capacity]: the row in the slot, -1 when empty */
  float *slot_gate;    /* [same]: the gate of the slot's token for that expert, 0 when empty */
  float *probs;        /* [tokens, experts]: the router's softmax */
  int32_t *choice;     /* [tokens, top_k]: the chosen experts, best first */
  int32_t *choice_slot; /* [tokens, top_k]: their slots, -1 when dropped over capacity */
  float *gate;         /* [tokens, top_k]: their gates */
  float *frac;         /* [groups, experts]: f_e, the fraction of first choices */
  double balance;      /* sum over the groups of alpha * E * sum_e f_e P_e (unweighted) */
  int dropped;         /* choices dropped over capacity */
} moe_route;

/* Routes logits (host, [tokens, experts]) into r (its arrays are allocated here; release
 * with moe_route_release, which a failed call leaves r ready for). FL_EINVAL when tokens is
 * not a positive multiple of groups or the config is bad. */
fl_status moe_route_compute(const moe_config *cfg, const float *logits, int tokens, int groups,
                            moe_route *r);
/* The router logits' gradient (host, [tokens, experts], overwritten) from the slots' gate
 * gradients (host, [experts * groups * capacity]) and the balancing loss weighted by
 * aux_weight. FL_ENOMEM only. */
fl_status moe_route_backward(const moe_config *cfg, const moe_route *r,
                             const float *dslot_gate, float aux_weight, float *dlogits);
void moe_route_release(moe_route *r);

/* ---- the layer ----------------------------------------------------------------------------- */

/* The layer's parameters, registered in a layer_store in this order (views into its flat
 * buffers after layer_store_finish): <prefix>.router.weight [E, hidden] (replicated over the
 * expert-parallel group: its gradient must be summed over the group by the caller, like
 * data-parallel weights), then per expert held here, e global:
 * <prefix>.experts.<e>.{fc1.weight [ffn, hidden], fc1.bias [ffn], fc2.weight [hidden, ffn],
 * fc2.bias [hidden]}. */
enum { MOE_FC1_W = 0, MOE_FC1_B, MOE_FC2_W, MOE_FC2_B, MOE_EXPERT_NPARAMS };
/* The number of parameters this rank registers: 1 + (E / ep) * MOE_EXPERT_NPARAMS. */
size_t moe_param_count(const moe_config *cfg, int ep_size);
/* Registers this rank's parameters; *first is the router's index in the store. */
fl_status moe_params_add(layer_store *s, const char *prefix, const moe_config *cfg, int ep_rank,
                         int ep_size, size_t *first);
/* After layer_store_finish: overwrites the `count` parameters from `first` on (those
 * moe_params_add registered) with their keyed draw
 * (as gpu/parallel/transformer.c's: N(0, 1 / fan_in) per element, keyed by the seed, the
 * parameter's name and the element's index; biases 0), so that an expert's weights do not
 * depend on which rank holds it. */
fl_status moe_params_init(layer_store *s, size_t first, size_t count, uint64_t seed);

/* What a forward saves for its backward. */
typedef struct moe_acts {
  moe_route route;
  float aux_weight;
  double aux_loss;    /* route.balance * aux_weight */
  fl_tensor ids;      /* [slots]: slot -> row, as floats for the embedding ops; rows: empty */
  fl_tensor gates;    /* [slots] */
  fl_tensor expert_in; /* [E / ep, ep * groups * capacity, hidden]: the local experts' rows */
  fl_tensor h1, act;  /* [E / ep, ep * groups * capacity, ffn]: before and after GELU */
  fl_tensor back;     /* [E, groups * capacity, hidden]: the outputs back at the tokens' rank */
  fl_tensor y;        /* shaped as x */
} moe_acts;

/* Scratch of forward and backward (one runs at a time). */
typedef struct moe_scratch {
  fl_tensor ext;           /* [rows + 1, hidden]: x or dy with a zero row for empty slots */
  fl_tensor buf_a, buf_b;  /* [slots, hidden] */
  fl_tensor d_ffn;         /* [E / ep, ep * groups * capacity, ffn] */
  fl_tensor logits;        /* [rows, E] */
  fl_tensor dgate;         /* [slots] */
  float *host;             /* logits, gate and logit gradients on the host */
  size_t host_cap;
} moe_scratch;

typedef struct moe_layer {
  fl_device *dev;
  fl_comm *comm; /* the expert-parallel group; NULL for one rank */
  moe_config cfg;
  int ep_rank, ep_size;
  nn_param *params; /* moe_param_count of them, consecutive: router, then the experts' */
  moe_scratch *scratch;
} moe_layer;

/* Forward of x ([rows, hidden], or any shape of rows * hidden elements) cut into `groups`
 * routing groups into a->y, saving what backward needs in a (a zeroed moe_acts the first
 * time; reused across calls). aux_weight weighs the balancing loss (a->aux_loss).
 * FL_EINVAL names a bad shape or groups; collective failures come back as the comm's. */
fl_status moe_forward(const moe_layer *k, const fl_tensor *x, int groups, float aux_weight,
                      moe_acts *a);
/* Backward from dy (shaped as y) after the forward that filled a from x: ACCUMULATES every
 * parameter gradient (the router's with the balancing loss's part) and overwrites dx (shaped
 * as x, not aliasing dy). */
fl_status moe_backward(const moe_layer *k, const fl_tensor *x, const moe_acts *a,
                       const fl_tensor *dy, fl_tensor *dx);
void moe_acts_release(moe_acts *a);
/* Device bytes a holds for the backward (its tensors; the host routing tables not counted),
 * as tp_block_acts_bytes, for a chunk's activation accounting. */
size_t moe_acts_bytes(const moe_acts *a);
void moe_scratch_release(moe_scratch *s);
/* All-to-all bytes this rank sends to other ranks in one forward and backward (four
 * exchanges of its [slots, hidden] buffer, minus the 1 / ep that stays). */
size_t moe_alltoall_bytes(const moe_config *cfg, int ep_size, int rows, int groups);

#endif /* FLINT_GPU_MOE_H */
