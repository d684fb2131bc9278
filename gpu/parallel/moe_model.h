/*
 * gpu/parallel/moe_model.h: a small token classifier around the mixture-of-experts layer
 * (gpu/parallel/moe.h), with its training step over an expert-parallel group: enough to test
 * expert parallelism end to end and to benchmark it (bench/bench_moe.c).
 *
 * Per token: h = x Win^T + b_in ([rows, features] -> [rows, hidden]); z = h + moe(h) (the
 * residual carries dropped tokens); logits = z Wh^T + b_h ([rows, classes]); softmax
 * cross-entropy against int32 labels, plus the layer's balancing loss.
 *
 * Parallelism: every rank of the group holds the input, head and router weights (data
 * parallel: their gradients are summed over the group) and E / ep experts; each rank feeds
 * its own rows. A one-rank model (comm NULL) that is given the rows of all ep ranks and
 * ep times their routing groups computes the same losses, gradients and steps (see moe.h).
 *
 * Threading: a model is used by one thread at a time; every rank of the group calls the
 * same functions in the same order.
 */
#ifndef FLINT_GPU_MOE_MODEL_H
#define FLINT_GPU_MOE_MODEL_H

#include "gpu/parallel/moe.h"

typedef struct moe_model_spec {
  int features, classes;
  moe_config moe;
  uint64_t seed; /* every weight, keyed (the same on every rank) */
} moe_model_spec;

typedef struct moe_model moe_model;

/* Builds the model on dev, holding the experts of this rank of ep_comm (borrowed, it must
 * outlive the model; NULL: one rank holding every expert). FL_EINVAL names a bad spec
 * (features, classes, or the moe config over the group's size). */
fl_status moe_model_create(fl_device *dev, const moe_model_spec *spec, fl_comm *ep_comm,
                           moe_model **out);
/* NULL does nothing. */
void moe_model_destroy(moe_model *m);

typedef struct moe_model_stats {
  double xent_sum; /* the rows' cross-entropy, summed */
  double correct;  /* rows whose argmax is the label */
  double aux_loss; /* the balancing loss, weighted */
  int dropped;     /* expert choices dropped over capacity */
} moe_model_stats;

/* Forward and backward of rows x [rows, features] (device) with labels (int32, device,
 * rows of them) cut into `groups` routing groups: ACCUMULATES the gradients of
 * grad_scale * (sum of the cross-entropies) + aux_weight * (sum of the groups' balancing
 * losses) into this rank's parameters. A trainer of N rows over all ranks and G groups in
 * all passes grad_scale 1 / N and aux_weight 1 / G. *stats (may be NULL) gets this rank's
 * figures. */
fl_status moe_model_forward_backward(moe_model *m, const fl_tensor *x, const int32_t *labels,
                                     int groups, float grad_scale, float aux_weight,
                                     moe_model_stats *stats);
/* The last forward's logits [rows, classes] and moe output [rows, hidden] (owned). */
const fl_tensor *moe_model_logits(const moe_model *m);
const fl_tensor *moe_model_moe_out(const moe_model *m);
/* Sums the replicated parameters' gradients over the group (the experts' already hold the
 * gradient of every rank's rows). Nothing for one rank. */
fl_status moe_model_sync_grads(moe_model *m);
/* One training step: zero the gradients, forward and backward, sync, then plain SGD
 * w -= lr * grad. */
fl_status moe_model_train_step(moe_model *m, const fl_tensor *x, const int32_t *labels,
                               int groups, float grad_scale, float aux_weight, float lr,
                               moe_model_stats *stats);
fl_status moe_model_zero_grad(moe_model *m);

/* Parameters in order: in.{weight, bias}, head.{weight, bias}, then the layer's
 * (moe.router.weight, moe.experts.<e>.*: see moe_params_add). Owned by the model. */
size_t moe_model_param_count(const moe_model *m);
nn_param *moe_model_param(moe_model *m, size_t i);

#endif /* FLINT_GPU_MOE_MODEL_H */
