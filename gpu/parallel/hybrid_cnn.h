/*
 * gpu/parallel/hybrid_cnn.h: Krizhevsky's "one weird trick" (2014): a CNN whose convolutional
 * layers are data parallel and whose fully connected layers are model parallel, on K ranks.
 *
 * The model: nconv times (3x3 convolution, padding 1, with bias; relu; 2x2 max pool), flatten
 * to F features, then nfc hidden fully connected layers (with bias, each followed by relu) and
 * the classifier (with bias) to `classes` logits; softmax cross-entropy, the mean over the
 * global batch of K x b examples. No batch norm, so that the split trains exactly as one rank
 * does (batch statistics would be per rank).
 *
 * The layouts. Rank r owns examples [r b, (r + 1) b) of the global batch.
 * - Convolutions: every rank holds the whole conv stack and runs it on its own b examples.
 * - Switch (the paper's scheme (a), no overlap): one all-gather of the conv features, so that
 *   every rank holds the features [K b, F] of the whole batch, in rank order.
 * - Hidden FC layers are column parallel: rank r holds output units [r o / K, (r + 1) o / K)
 *   of each (weight rows and bias), computes them for all K b examples, and between two hidden
 *   layers the activations are all-gathered along features (kept as K blocks [K b, o / K], so
 *   the next layer multiplies block by block: no transpose).
 * - The classifier is row parallel (Megatron's pairing): rank r holds its columns of the
 *   weight, the ones that read its own units of the last hidden layer, so the partial logits
 *   are summed by an allreduce; its bias is replicated. Every rank then has the logits of the
 *   whole batch and takes the same loss.
 * - Backward: the FC gradients are local (no averaging: each rank owns its slice); the input
 *   gradient of a hidden layer is the sum of the ranks' partial contributions, and a
 *   reduce-scatter hands each rank its own block of it (the feature block it computed, or for
 *   the conv features its own b examples); then the conv backward on the owner's examples,
 *   and an allreduce (sum) of the conv gradients. Each rank's conv gradient is already scaled
 *   by 1 / (K b), so the sum is the gradient of the global mean loss (the average of the
 *   ranks' own-mean gradients, as data parallelism takes it).
 *
 * Pure data parallelism of the same model (HCNN_DATA_PARALLEL) is the comparison: every rank
 * holds every layer whole, runs all of them on its b examples and allreduces every gradient.
 *
 * Keyed weights: every parameter element is drawn from (spec seed, parameter name, its index
 * in the unsplit tensor), uniform in +-1 / sqrt(fan_in) (PyTorch's default for nn.Linear and
 * nn.Conv2d), so a rank's slice is exactly the slice of the one-rank model, whatever K.
 *
 * Bytes: every collective adds to the step's counts the bytes this rank sends on the wire by
 * the bandwidth-optimal (ring) algorithms: all-gather of n floats per rank (K - 1) n,
 * reduce-scatter of N floats (K - 1) N / K, allreduce 2 (K - 1) N / K; times 4 bytes. The
 * host backend may pick another allreduce algorithm; the count is the algorithm-independent
 * figure the paper's argument uses.
 *
 * Threading: one trainer per rank, used by that rank's thread; every rank calls each
 * function in the same order (they run collectives).
 */
#ifndef FLINT_GPU_HYBRID_CNN_H
#define FLINT_GPU_HYBRID_CNN_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu/nn/nn.h"

#define HCNN_MAX_CONV 4
#define HCNN_MAX_FC 4

typedef struct hcnn_spec {
  int channels, height, width; /* input images, NCHW */
  int conv[HCNN_MAX_CONV];     /* output channels of each conv block */
  int nconv;                   /* 1 to HCNN_MAX_CONV */
  int fc[HCNN_MAX_FC];         /* widths of the hidden FC layers; K must divide each */
  int nfc;                     /* 1 to HCNN_MAX_FC */
  int classes;
  uint64_t seed;
} hcnn_spec;

typedef enum hcnn_mode {
  HCNN_TRICK = 0,         /* data-parallel convolutions, model-parallel FC layers */
  HCNN_DATA_PARALLEL = 1, /* every layer replicated, every gradient allreduced */
} hcnn_mode;

/* "trick", "dp"; FL_EINVAL otherwise. */
fl_status hcnn_mode_parse(const char *text, hcnn_mode *out);
const char *hcnn_mode_name(hcnn_mode mode);

/* FL_OK when the spec can be built and split over `ranks` ranks in `mode`; FL_EINVAL naming
 * the field otherwise (an image too small for its poolings, a width K does not divide ...). */
fl_status hcnn_spec_check(const hcnn_spec *spec, hcnn_mode mode, int ranks);
/* F: the conv features per example (what the switch all-gathers). */
int64_t hcnn_features(const hcnn_spec *spec);
/* Trainable weights of the whole (unsplit) model. */
int64_t hcnn_weights(const hcnn_spec *spec);

/* Bytes one step sends per rank, by kind (ring counts; see the top). */
typedef struct hcnn_bytes {
  uint64_t activations; /* the switch and the FC layers: all-gathers, reduce-scatters,
                           * the logits' allreduce, the labels' all-gather and
                           * the ranks' agreement on them (5 floats a rank) */
  uint64_t gradients;   /* the allreduce of replicated parameters' gradients */
} hcnn_bytes;

/* The same figures from the sizes alone (what a step will count), for plans and checks. */
hcnn_bytes hcnn_predict_bytes(const hcnn_spec *spec, hcnn_mode mode, int ranks, int batch);

typedef struct hcnn_stats {
  double loss;     /* mean over the global batch (the same on every rank) */
  double accuracy; /* fraction of the global batch whose argmax was the label */
  hcnn_bytes bytes; /* this step's */
} hcnn_stats;

typedef struct hcnn hcnn;

/* Collective over comm (K = its size; NULL: one rank): builds this rank's part of the model
 * with keyed weights and zeroed gradients, and an optimizer per parameter buffer with `opt`
 * (NULL: plain SGD, momentum 0.9, no weight decay). comm is borrowed and must outlive the
 * trainer. FL_EINVAL names a bad spec or option. */
fl_status hcnn_create(fl_device *dev, fl_comm *comm, const hcnn_spec *spec, hcnn_mode mode,
                      const optim_options *opt, hcnn **out);
/* NULL does nothing. */
void hcnn_destroy(hcnn *h);

/* Forward and backward of one step: x is this rank's b examples [b, channels, height, width]
 * and labels its b labels, host memory; every rank passes the same b (the global batch is
 * K b). ACCUMULATES into the gradients, which afterwards are those of the global mean loss
 * (conv: summed over the ranks; FC: this rank's slice). FL_EINVAL names a bad batch or label. */
fl_status hcnn_compute_gradients(hcnn *h, const float *x, const int32_t *labels, int batch,
                                 hcnn_stats *stats);
/* Forward only (no gradients; the network has no dropout or batch norm, so evaluation is
 * the training forward): the loss sum and correct count over the global batch, the same on
 * every rank. Collective as hcnn_compute_gradients. */
fl_status hcnn_evaluate(hcnn *h, const float *x, const int32_t *labels, int batch, double *loss_sum,
                        double *correct);
/* One optimizer step at rate lr on every parameter this rank holds, then zeroes the
 * gradients. */
fl_status hcnn_apply(hcnn *h, float lr);

/* The parameters this rank holds: the conv stack's ("conv<i>.weight", "conv<i>.bias", i from 1; always
 * whole), then the FC layers' ("fc<i>.weight", "fc<i>.bias", "classifier.weight",
 * "classifier.bias"). */
size_t hcnn_param_count(const hcnn *h);
nn_param *hcnn_param(hcnn *h, size_t i);

/* Where parameter i sits in the UNSPLIT model: its full shape is [rows, cols] (vectors: rows
 * 1; conv weights: [out, in k k]), and this rank holds rows [row0, row0 + its rows) and cols
 * [col0, col0 + its cols). */
typedef struct hcnn_param_place {
  int64_t rows, cols, row0, col0;
  bool replicated;
} hcnn_param_place;
hcnn_param_place hcnn_param_place_of(const hcnn *h, size_t i);

#endif /* FLINT_GPU_HYBRID_CNN_H */
