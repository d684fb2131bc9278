/*
 * train.h: defining and running models of your own on flint's training stack (gpu.h's
 * devices and tensors).
 *
 * A model is built by appending layers to it, as torch.nn.Sequential does; each layer takes
 * the shape the one before it produces (its input features or channels are never given
 * twice), and a wrong combination fails at the call that makes it, naming the layer and
 * both shapes. Residual blocks make it a small graph: between fl_model_residual_begin and
 * fl_model_residual_end the layers form the main path; layers appended after
 * fl_model_residual_shortcut (optional) form the shortcut, the identity otherwise; the
 * block's output is main(x) + shortcut(x). Blocks nest.
 *
 *   fl_model *m;
 *   int64_t image[3] = {1, 28, 28};
 *   fl_model_create(dev, 3, image, &m);
 *   fl_model_conv2d(m, "conv1", &(fl_conv2d_options){.out_channels = 32, .kernel = 5, .padding = 2});
 *   fl_model_relu(m);
 *   fl_model_maxpool(m, 2, 2, 0);
 *   fl_model_flatten(m);
 *   fl_model_linear(m, "fc", 10, true);
 *   fl_model_finish(m, 42);
 *
 * Parameters: every weight of a model lives in one flat buffer and every gradient in
 * another, in the order the layers were appended, so that an optimizer step is one pass
 * and data-parallel training allreduces contiguous buckets. Parameter names are PyTorch's
 * ("conv1.weight", "bn1.running_mean" is a buffer, not a parameter). fl_model_finish draws
 * the initial weights as PyTorch does by default (nn.Linear and nn.Conv2d: uniform in
 * +-1/sqrt(fan_in) for weights and biases; batch norm: gamma 1, beta 0), from a seed, so
 * that every rank that builds the same model from the same seed holds the same weights.
 *
 * Conventions are flint.h's: fl_status returns, fl_last_error() for the cause,
 * out-parameters last, destroy(NULL) does nothing. Threads: a model is used by one thread at
 * a time (a rank's thread), on its device.
 */
#ifndef FLINT_TRAIN_H
#define FLINT_TRAIN_H

#include <stdio.h>

#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_model fl_model;

/* The most dimensions of one sample (a batch adds one in front). */
#define FL_MODEL_MAX_SAMPLE_DIMS 3

/* ---- building ------------------------------------------------------------------------- */

/* An empty model on `dev` for samples of `ndim` (1 to 3) dimensions `shape` ({C, H, W} for
 * images, {features} for vectors). FL_EINVAL for a bad shape. */
FL_API fl_status fl_model_create(fl_device *dev, int ndim, const int64_t *shape, fl_model **out);
/* Frees the model and everything it holds; tensors it returned become invalid. */
FL_API void fl_model_destroy(fl_model *m);

/* y = x W^T + b over the last dimension, as PyTorch's nn.Linear: {..., in} -> {..., out}
 * (flatten an image first). `name` prefixes its parameters ("fc1" -> "fc1.weight"). */
FL_API fl_status fl_model_linear(fl_model *m, const char *name, int out_features, bool bias);

typedef struct fl_conv2d_options {
  int out_channels; /* >= 1 */
  int kernel;       /* square, >= 1 */
  int stride;       /* 0: 1 */
  int padding;      /* zeros on every side, >= 0 */
  int groups;       /* 0: 1; must divide both channel counts (input channels: depthwise) */
  bool bias;
} fl_conv2d_options;
/* A 2-D convolution over [n, C, H, W]. */
FL_API fl_status fl_model_conv2d(fl_model *m, const char *name, const fl_conv2d_options *opts);
/* Batch norm over the channels of [n, C, ...] (eps 1e-5, momentum 0.1, as PyTorch): batch
 * statistics in training, running statistics otherwise. `zero_gamma`: gamma starts at 0
 * instead of 1 (Goyal et al. zero the last batch norm of each residual block). */
FL_API fl_status fl_model_batchnorm(fl_model *m, const char *name, bool zero_gamma);
FL_API fl_status fl_model_relu(fl_model *m);
/* GELU (tanh approximation, as PyTorch's approximate="tanh"). */
FL_API fl_status fl_model_gelu(fl_model *m);
FL_API fl_status fl_model_maxpool(fl_model *m, int kernel, int stride, int padding);
/* Average pooling; padding counts as zeros (count_include_pad, PyTorch's default). */
FL_API fl_status fl_model_avgpool(fl_model *m, int kernel, int stride, int padding);
/* [n, C, H, W] -> [n, C]: the mean of each plane. */
FL_API fl_status fl_model_global_avgpool(fl_model *m);
/* [n, ...] -> [n, features]. */
FL_API fl_status fl_model_flatten(fl_model *m);
/* Inverted dropout with probability p in [0, 1): in training each element is zeroed with
 * probability p and the rest scaled by 1 / (1 - p); identity in evaluation. The mask is
 * drawn from the model's seed, the step (fl_model_set_step) and the element. */
FL_API fl_status fl_model_dropout(fl_model *m, double p);

/* Layer norm over the last dimension (eps 1e-5, gamma 1, beta 0, as PyTorch's nn.LayerNorm). */
FL_API fl_status fl_model_layernorm(fl_model *m, const char *name);
/* Token ids -> vectors: a sample of ids {tokens} (floats holding whole numbers in
 * [0, vocab)) becomes {tokens, dim}; the table [vocab, dim] starts N(0, 1) (nn.Embedding). An
 * id outside the table fails the forward with FL_EINVAL (on cuda at the next synchronize). */
FL_API fl_status fl_model_embedding(fl_model *m, const char *name, int vocab, int dim);
/* Multi-head self-attention over {tokens, hidden} (PyTorch's nn.MultiheadAttention with
 * batch_first, query = key = value, no mask): parameters "NAME.in_proj_weight",
 * "NAME.in_proj_bias", "NAME.out_proj.weight", "NAME.out_proj.bias". heads must divide hidden. */
FL_API fl_status fl_model_attention(fl_model *m, const char *name, int heads);
/* {tokens, h} -> {h}: the mean over tokens (a sequence classifier's pooling). */
FL_API fl_status fl_model_mean_tokens(fl_model *m);

/* Residual blocks (see the top). _shortcut and _end fail with FL_ESTATE outside a block;
 * _end fails with FL_EINVAL when the two paths' shapes differ, naming both. */
FL_API fl_status fl_model_residual_begin(fl_model *m, const char *name);
FL_API fl_status fl_model_residual_shortcut(fl_model *m);
FL_API fl_status fl_model_residual_end(fl_model *m);

/* Ends building: allocates the parameters and draws them from `seed`. FL_ESTATE with a
 * residual block still open or on a finished model; FL_EINVAL for a model with no layers. */
FL_API fl_status fl_model_finish(fl_model *m, uint64_t seed);

/* ---- what a model is ------------------------------------------------------------------ */

/* The shape of one sample of the output as the layers so far make it (any time). */
FL_API int fl_model_output_shape(const fl_model *m, int64_t shape[FL_MODEL_MAX_SAMPLE_DIMS]);
/* Parameter tensors (weights and biases, not batch-norm statistics) and their names. */
FL_API size_t fl_model_num_params(const fl_model *m);
FL_API const char *fl_model_param_name(const fl_model *m, size_t i);
/* Trainable elements over all parameters, the length of the flat buffers below. */
FL_API size_t fl_model_num_weights(const fl_model *m);
/* The flat buffers (after finish; owned by the model). Gradients accumulate. */
FL_API fl_tensor *fl_model_weights(fl_model *m);
FL_API fl_tensor *fl_model_gradients(fl_model *m);
/* A parameter's view into the flat weights (after finish; owned by the model). */
FL_API fl_tensor *fl_model_param(fl_model *m, size_t i);

/* ---- running it ------------------------------------------------------------------------ */

/* Forward of a batch x [n, sample shape]; *y (owned by the model) is valid until the next
 * forward. `train`: batch statistics in batch norm, dropout on. */
FL_API fl_status fl_model_forward(fl_model *m, const fl_tensor *x, bool train, const fl_tensor **y);
/* Softmax cross-entropy of the last forward's output [n, classes] against labels (host
 * memory, n of them, each in [0, classes)): label_smoothing in [0, 1) mixes the one-hot
 * target with the uniform one, as PyTorch's CrossEntropyLoss. Writes the mean loss and the
 * number of correct predictions (either may be NULL) and keeps the gradient of the mean loss
 * for fl_model_backward. Blocks until the loss is known. FL_EINVAL for a label out of range. */
FL_API fl_status fl_model_cross_entropy(fl_model *m, const int32_t *labels, size_t n, double label_smoothing,
                                        double *loss, uint64_t *correct);
/* Mean squared error of the last forward's output against `target` (same shape, on the
 * model's device): mean over all elements, as PyTorch's MSELoss. */
FL_API fl_status fl_model_mse(fl_model *m, const fl_tensor *target, double *loss);
/* Backward from the last loss: ACCUMULATES into the gradients. FL_ESTATE without a loss
 * since the last forward. */
FL_API fl_status fl_model_backward(fl_model *m);
FL_API fl_status fl_model_zero_grad(fl_model *m);
/* The optimizer step dropout masks are drawn for (0 until set). */
FL_API void fl_model_set_step(fl_model *m, uint64_t step);

/* ---- optimizers ----------------------------------------------------------------------------
 * For a training loop of your own (fl_train has them built in): one step updates the model's
 * flat weights from its gradients on the model's device. Parameters of one dimension (biases,
 * normalisation gammas and betas) get no weight decay, and LARS and LAMB leave them out of
 * their trust ratios, unless decay_all (Goyal et al.; You et al.). */
typedef struct fl_optimizer fl_optimizer;
typedef struct fl_optimizer_options {
  const char *kind;   /* "sgd", "adam", "adamw", "lars", "lamb" */
  double momentum;    /* sgd, lars: [0, 1) */
  bool nesterov;      /* sgd */
  double beta1, beta2, eps; /* adam, adamw, lamb */
  double weight_decay;      /* >= 0 (adamw, lamb: decoupled) */
  double trust_coef;        /* lars: eta */
  bool decay_all;
} fl_optimizer_options;
#define FL_OPTIMIZER_OPTIONS_INIT {"sgd", 0.9, false, 0.9, 0.999, 1e-8, 0, 0.001, false}

/* An optimizer of a finished model's parameters, with zeroed state (opts NULL: the defaults).
 * FL_EINVAL names a bad option. The model must outlive it. */
FL_API fl_status fl_optimizer_create(fl_model *m, const fl_optimizer_options *opts, fl_optimizer **out);
FL_API void fl_optimizer_destroy(fl_optimizer *opt);
/* One step at rate lr (a finite number >= 0) from the model's gradients. */
FL_API fl_status fl_optimizer_step(fl_optimizer *opt, double lr);
/* Scales the model's gradients to global 2-norm max_norm when theirs is larger (PyTorch's
 * clip_grad_norm_); *norm (may be NULL) gets the norm before. Blocks. */
FL_API fl_status fl_model_clip_grad_norm(fl_model *m, double max_norm, double *norm);

/* ---- learning-rate schedules ----------------------------------------------------------------
 * Goyal et al.'s recipe: the linear scaling rule (the peak rate is lr x batch / 256), a
 * gradual warmup from lr to the peak over warmup_epochs (per step), then a decay: "cosine"
 * (half a cosine to 0 at `epochs`), "step" (x0.1 at each milestone epoch; none given: at 50%
 * and 75% of the epochs), "poly" (peak x (1 - t)^power to 0, You et al.'s LARS runs) or
 * "none". Plain data: any thread. */
#define FL_LR_MAX_MILESTONES 8
typedef struct fl_lr_schedule {
  double lr;              /* the rate for a batch of 256, a finite number > 0 */
  uint32_t batch;         /* the global batch (0: 256, no scaling) */
  double warmup_epochs;   /* >= 0, shorter than epochs */
  double epochs;          /* the length of training, > 0 */
  const char *decay;      /* NULL: "cosine" */
  double milestones[FL_LR_MAX_MILESTONES]; /* "step": ascending epochs */
  int num_milestones;
  double power;           /* "poly" (0: 2) */
} fl_lr_schedule;
/* Set `epochs` before fl_lr_schedule_at (fl_train sets it, and batch, itself). */
#define FL_LR_SCHEDULE_INIT {0.1, 0, 0, 0, NULL, {0}, 0, 0}
/* *lr = the rate at `epoch`, a real number (step i of n in epoch e is e + i / n; before 0
 * reads as 0, past the end as the end). FL_EINVAL names a bad field. */
FL_API fl_status fl_lr_schedule_at(const fl_lr_schedule *s, double epoch, double *lr);

/* ---- loss scaling for fp16 (PyTorch's GradScaler) ---------------------------------------
 * With fl_device_set_precision(dev, FL_PRECISION_FP16), gradients below 2^-24 vanish in the
 * products. A grad scaler multiplies the model's loss gradients by a large scale; after
 * backward, fl_grad_scaler_unscale divides the gradients by it, or, when some are inf or NaN
 * (an fp16 overflow), tells you to skip the optimizer step and halves the scale:
 *
 *   fl_grad_scaler_create(m, NULL, &gs);
 *   each step: zero_grad, forward, loss, backward;
 *              fl_grad_scaler_unscale(gs, &ok);   (clip here, on true gradients)
 *              if (ok) fl_optimizer_step(opt, lr);
 *
 * The losses' values are never scaled. One scaler per model; a thread at a time. */
typedef struct fl_grad_scaler fl_grad_scaler;
typedef struct fl_grad_scaler_options {
  double init_scale;         /* in [1, 2^24] */
  uint32_t growth_interval;  /* the scale doubles after this many finite steps in a row */
} fl_grad_scaler_options;
#define FL_GRAD_SCALER_OPTIONS_INIT {65536.0, 2000}
/* opts NULL: FL_GRAD_SCALER_OPTIONS_INIT (PyTorch's defaults). FL_ESTATE for an unfinished
 * model, FL_EINVAL for bad options. */
FL_API fl_status fl_grad_scaler_create(fl_model *m, const fl_grad_scaler_options *opts, fl_grad_scaler **out);
/* The model's loss gradients go back to unscaled: the model must outlive its scaler. */
FL_API void fl_grad_scaler_destroy(fl_grad_scaler *gs);
/* After fl_model_backward: *step true, with the gradients unscaled, when all are finite;
 * false (gradients untouched: skip the step) otherwise. Updates the scale, within [2^-24,
 * 2^24]. Blocks (reads a norm back from the device). A scaler's state is not part of
 * fl_checkpoint_save's file: a resumed loop starts again from the initial scale. */
FL_API fl_status fl_grad_scaler_unscale(fl_grad_scaler *gs, bool *step);
FL_API double fl_grad_scaler_scale(const fl_grad_scaler *gs);
/* Steps skipped so far. */
FL_API uint64_t fl_grad_scaler_skipped(const fl_grad_scaler *gs);

/* ---- models in libraries --------------------------------------------------------------- */

/* A model of your own for `flint train --model FILE.so[:SYMBOL]` (and gpu training runs): a
 * shared library exports a builder under SYMBOL (default FL_MODEL_BUILDER_SYMBOL) that
 * appends the layers to `m`, which was created for the data's samples ({C, H, W}; {1, 1, F}
 * for rows of F features), and returns FL_OK; the output must be [n, classes]. The trainer
 * calls fl_model_finish. The builder runs on every rank (in cluster mode the library is
 * shipped to the executors) and must build the same model each time.
 *
 *   #include <flint/train.h>
 *   fl_status flint_model(fl_model *m, uint32_t classes) {
 *     fl_status s = fl_model_linear(m, "fc1", 512, true);
 *     if (s == FL_OK) s = fl_model_relu(m);
 *     if (s == FL_OK) s = fl_model_linear(m, "fc2", (int)classes, true);
 *     return s;
 *   }
 */
typedef fl_status (*fl_model_builder)(fl_model *m, uint32_t classes);
#define FL_MODEL_BUILDER_SYMBOL "flint_model"

/* ---- training on flint datasets ----------------------------------------------------------
 *
 * fl_train runs synchronous data-parallel training (the engine of `flint train`) over any flint
 * dataset of examples: each record is a label and one sample's floats (fl_example_put), what a
 * map over your own data produces. The examples are dealt to `ranks` ranks by one shuffle and
 * cached; each rank is a task of one barrier stage, builds the model with `build` from the
 * same seed, and every step allreduces the gradients, so the ranks take identical steps (the
 * global batch is `batch`; the rate follows `schedule`, the optimizer is `optimizer`). The
 * test set is evaluated after every epoch. A lost rank reruns the stage from the last epoch's
 * checkpoint. In local mode `build` may be any function of the program; in cluster mode it
 * must be exported by a shared library, which is shipped to the executors (as a job's
 * functions are). Blocks the calling thread until training ends. */

/* An example record (replacing out's contents): the int32 label, then `count` floats. */
FL_API fl_status fl_example_put(fl_buf *out, int32_t label, const float *x, size_t count);

typedef struct fl_train_options {
  uint32_t ranks;           /* data-parallel ranks, one barrier task each (0: 1) */
  fl_device_kind device;    /* FL_DEVICE_CPU or FL_DEVICE_CUDA (a GPU per rank's executor) */
  uint32_t batch;           /* the global batch, a multiple of ranks (0: 256) */
  uint32_t epochs;          /* 0: 1 */
  fl_lr_schedule schedule;  /* its batch and epochs: 0 (fl_train's own above); lr 0: 0.1 */
  fl_optimizer_options optimizer;
  double clip_grad_norm;    /* > 0: clip the averaged gradients to this global norm */
  double label_smoothing;   /* the training loss's, in [0, 1) (PyTorch's CrossEntropyLoss's) */
  fl_precision precision;   /* of the products (flint/gpu.h); cuda only unless FP32 (the
                             * default); FP16 trains with a loss scaler */
  const char *sync;         /* NULL or "bsp": the gradients allreduced every step; "local:TAU":
                             * local SGD, the weights averaged every TAU steps; "adacomm" or
                             * "adacomm:TAU0": local SGD whose period shrinks from TAU0 (16)
                             * as the training loss falls (Wang and Joshi); "asp" or "ssp:S":
                             * the weights on parameter servers (flint/ps.h), the ranks their
                             * workers (ordinary tasks, Downpour SGD): asp never waits, ssp:S
                             * lets a worker run at most S steps ahead of the slowest (ssp:0:
                             * synchronous SGD). They take the optimizer "sgd" with momentum 0
                             * (the servers step w -= lr g / ranks per push), "adagrad" or "adam"
                             * (the servers' own updates, at a fixed rate: no warmup or decay),
                             * models without batch norm, and `ranks` task slots at once */
  uint64_t seed;            /* weights and shuffles */
  const char *checkpoint_path; /* the final weights and optimizer state (NULL: not written) */
  const char *resume_path;  /* start from this checkpoint (checkpoint_path's, or
                             * fl_checkpoint_save's with the same optimizer) at its epoch */
  FILE *progress;           /* a line per epoch (NULL: quiet) */
  uint32_t accumulate;      /* gradient accumulation: each rank's batch / ranks images of a step
                             * go through forward and backward as this many micro-batches, with
                             * one allreduce after the last (the same step, in less memory);
                             * batch must be a multiple of ranks x accumulate (0: 1, none) */
  uint32_t ps_fetch, ps_push; /* asp, ssp (Downpour's n_fetch, n_push): each worker pulls the
                             * weights every ps_fetch steps and pushes the gradients of ps_push
                             * steps at once (0: 1) */
  const char *compress;     /* gradient compression with sync bsp, as PyTorch DDP's comm hooks
                             * (NULL or "none": plain averaging): "fp16" or "bf16" (16-bit
                             * allreduce), "topk:RATIO" (the largest RATIO of each bucket, RATIO in
                             * (0, 1], with error feedback), "powersgd:R" (rank-R PowerSGD with
                             * error feedback), "onebit" (signs and a scale, error feedback).
                             * Ranks join over the host backend (the hooks run on host memory) */
} fl_train_options;
/* SGD with momentum 0.9 and weight decay 5e-4 at 0.1 x batch / 256, cosine decay. */
#define FL_TRAIN_OPTIONS_INIT                                                                         \
  {1, FL_DEVICE_CPU, 256, 1, FL_LR_SCHEDULE_INIT, {"sgd", 0.9, false, 0.9, 0.999, 1e-8, 5e-4, 0.001, false}, \
   0, 0, FL_PRECISION_FP32, NULL, 1, NULL, NULL, NULL, 1, 0, 0, NULL}

typedef struct fl_train_result {
  uint32_t epochs;
  uint64_t steps;
  double train_loss, train_acc; /* of the last epoch */
  double test_loss, test_acc;   /* of the last evaluation */
  double images_per_s;          /* training samples a second over all ranks */
  double seconds;
  uint32_t resumed_epoch;       /* the epoch resume_path's checkpoint stood at (0: none) */
  uint64_t reduced_bytes;       /* a rank's bytes of gradients or weights allreduced */
  uint64_t sent_bytes;          /* the bytes a rank handed to collectives for them: reduced_bytes,
                                 * or the compressed payload with `compress` */
} fl_train_result;

/* Trains build's model on `train`, evaluating on `test` (both datasets of fl_example_put
 * records whose samples have shape sample_shape[0 .. ndim), ndim 1 to 3, and labels in
 * [0, classes)). opts NULL: FL_TRAIN_OPTIONS_INIT. FL_EINVAL names a bad option, a builder that
 * fails or whose output is not [n, classes], and (from the tasks) an example of the wrong size
 * or label; a training loss that turns non-finite fails with the step and rate. */
FL_API fl_status fl_train(fl_context *ctx, fl_dataset *train, fl_dataset *test, int ndim, const int64_t *sample_shape,
                          uint32_t classes, fl_model_builder build, const fl_train_options *opts,
                          fl_train_result *result);

/* ---- weights on disk ------------------------------------------------------------------- */

/* Writes the weights and batch-norm statistics to `path` (through a temporary file and a
 * rename), in flint's checkpoint format without optimizer state. FL_EIO names the file. */
FL_API fl_status fl_model_save(fl_model *m, const char *path);
/* Reads what fl_model_save wrote into a finished model of the same architecture. FL_EFORMAT
 * for a file that is not a checkpoint (or is damaged), FL_EINVAL when its sizes are not this
 * model's; nothing changes then. */
FL_API fl_status fl_model_load(fl_model *m, const char *path);
/* A training checkpoint: the weights, batch-norm statistics and, with opt (NULL: none), the
 * optimizer's state (momenta, Adam's moments) and step count, with the epoch and step you
 * stand at; the format of fl_train's checkpoint_path and `flint train --checkpoint`, so either
 * side can resume the other's (torch.save of model and optimizer state_dicts). opt must step
 * m. Written through a temporary file and a rename; FL_EIO names the file. Blocks (reads the
 * device). */
FL_API fl_status fl_checkpoint_save(fl_model *m, fl_optimizer *opt, uint32_t epoch, uint64_t step, const char *path);
/* Reads it back into a finished model of the same architecture and an optimizer of the same
 * kind (NULL: weights only), and gives its epoch and step (each may be NULL). FL_ENOENT or
 * FL_EIO for the file, FL_EFORMAT for a damaged one, FL_EINVAL naming a size or optimizer
 * that differs, or an optimizer given for a file of weights only; nothing changes then.
 * Blocks. */
FL_API fl_status fl_checkpoint_load(fl_model *m, fl_optimizer *opt, const char *path, uint32_t *epoch, uint64_t *step);

#ifdef __cplusplus
}
#endif
#endif /* FLINT_TRAIN_H */
