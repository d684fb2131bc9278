/*
 * gpu/nn/nn.h: what the rest of gpu/ uses of gpu/nn/: models of layers with forward and
 * backward on any device (the layers are gpu/nn/layers.h, private to gpu/nn/), the flat
 * parameter store models are built on, the optimizers (SGD, Adam, AdamW, LARS, LAMB) and
 * gradient clipping, learning-rate schedules and checkpoints.
 *
 * A model is a sequence of layers. All its parameters live in one flat device buffer and
 * their gradients in another, in parameter order (the order of the layers' forward pass),
 * so that the optimizer takes one step over the whole buffer and data-parallel training
 * allreduces contiguous ranges of it (buckets). Backward finishes parameters in reverse
 * order and says so through a callback as each layer's gradients are final, which lets the
 * trainer start a bucket's allreduce while backward goes on (overlap).
 *
 * Threading: a model is used by one thread at a time.
 */
#ifndef FLINT_GPU_NN_H
#define FLINT_GPU_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/device/device.h"
#include "flint/train.h"

/* NN_TRANSFORMER names gpu/parallel/transformer.h's model for the trainer's options; it is built in
 * chunks (tfm_chunk_create), not by nn_model_create. */
/* NN_LIBRARY is a user's model, built by the builder a library exports (include/flint/train.h;
 * gpu/parallel/train_model.c), not by nn_model_create. */
typedef enum nn_model_kind {
  NN_MLP = 0,
  NN_CNN = 1,
  NN_RESNET18 = 2,
  NN_TRANSFORMER = 3,
  NN_LIBRARY = 4,
  NN_RESNET50 = 5,
} nn_model_kind;

typedef struct nn_model_spec {
  nn_model_kind kind;
  int channels, height, width; /* input images, NCHW */
  int classes;
  int hidden;    /* MLP: width of its hidden layers (0: 256) */
  int width_mult; /* ResNet-18: channels of its first stage (0: 64) */
  uint64_t seed; /* weight initialisation (He/Kaiming), the same on every rank */
} nn_model_spec;

/* One parameter: views into the model's flat value and gradient buffers. */
typedef struct nn_param {
  const char *name; /* "conv1.weight", "layer2.0.bn1.bias", ... */
  fl_tensor value;
  fl_tensor grad;
  size_t offset; /* in elements, into the flat buffers */
} nn_param;

/* The model of include/flint/train.h (gpu/nn/model.c); the trainers use these names. */
typedef struct fl_model nn_model;

/* "mlp", "cnn", "resnet18", "transformer"; FL_EINVAL otherwise. */
FL_API fl_status nn_model_kind_parse(const char *text, nn_model_kind *out);
FL_API const char *nn_model_kind_name(nn_model_kind kind);
/* Builds the model on dev with seeded weights. FL_EINVAL names a spec that cannot work
 * (an image too small for the network's downsampling, zero classes, ...). */
fl_status nn_model_create(fl_device *dev, const nn_model_spec *spec, nn_model **out);
void nn_model_destroy(nn_model *m);

size_t nn_model_param_count(const nn_model *m);
nn_param *nn_model_param(nn_model *m, size_t i);
/* The flat buffers: n elements each (the number of trainable weights). */
fl_tensor *nn_model_values(nn_model *m);
fl_tensor *nn_model_grads(nn_model *m);
/* Non-trainable state that a checkpoint must keep (batch-norm running mean and var),
 * also one flat buffer; 0 elements for models without batch norm. */
fl_tensor *nn_model_buffers(nn_model *m);

/* Forward of a batch x [n, channels, height, width]; *logits [n, classes] is owned by the
 * model and valid until the next forward. `train` selects batch statistics in batch norm. */
fl_status nn_model_forward(nn_model *m, const fl_tensor *x, bool train, const fl_tensor **logits);
/* Softmax cross-entropy of the last forward against labels (int32, device memory, n of
 * them): sets the gradient of the logits to (softmax - onehot) * grad_scale and adds the
 * loss sum and correct count to stats (device, 2 floats). */
fl_status nn_model_loss(nn_model *m, const int32_t *labels, float grad_scale, float *stats);
/* nn_model_loss against label-smoothed targets (smoothing in [0, 1)). */
fl_status nn_model_loss_smoothed(nn_model *m, const int32_t *labels, float smoothing, float grad_scale, float *stats);
/* From now on the losses' gradients (cross-entropy's and MSE's) are multiplied by `scale`
 * as well (a loss scaler's; 1 at creation). The losses' values are not. */
void nn_model_set_loss_scale(nn_model *m, float scale);

/* Called during backward when the gradients of parameters [first, first + count) are final
 * (they are queued on the device stream; the callee orders its own work after them). */
typedef fl_status (*nn_grads_ready_fn)(size_t first, size_t count, void *user);
/* Backward from the loss's logit gradient, ACCUMULATING parameter gradients. `ready` may be
 * NULL. */
fl_status nn_model_backward(nn_model *m, nn_grads_ready_fn ready, void *user);
/* The same from a given gradient of the last forward's output (dy shaped as it; copied), for
 * a model that is one part of a larger one (gpu/parallel/hybrid_cnn.c). FL_ESTATE without a
 * forward; FL_EINVAL for a dy of another shape. */
fl_status nn_model_backward_from(nn_model *m, const fl_tensor *dy, nn_grads_ready_fn ready, void *user);
fl_status nn_model_zero_grad(nn_model *m);

/* ---- the parameter store --------------------------------------------------------------
 * Models are built on it (gpu/nn/layers.h), and so is the transformer (gpu/parallel/): each
 * layer registers its parameters (shape and initialisation) while it is created, and the store
 * then puts all of them in one flat value buffer and one flat gradient buffer
 * (layer_store_finish). Non-trainable state (batch-norm running statistics) goes to a third
 * flat buffer the same way. A store is used by one thread at a time. */

typedef enum layer_init {
  LAYER_INIT_WEIGHT = 0, /* weights of linear and conv layers: by the store's style, below */
  LAYER_INIT_BIAS,       /* biases of linear and conv layers: by the store's style */
  LAYER_INIT_ZERO,       /* batch-norm beta, zero-initialised gammas */
  LAYER_INIT_ONE,        /* batch-norm gamma */
  LAYER_INIT_NORMAL,     /* normal, std 1 (embeddings, as PyTorch's nn.Embedding) */
  LAYER_INIT_XAVIER,     /* uniform in +-sqrt(6 / fan), fan_in holding fan_in + fan_out */
} layer_init;

/* How the store draws LAYER_INIT_WEIGHT and LAYER_INIT_BIAS parameters (fan_in: inputs of
 * one output, in * k * k for a convolution). */
typedef enum layer_init_style {
  /* PyTorch's defaults for nn.Linear and nn.Conv2d (kaiming_uniform_ with a = sqrt(5)):
   * weights and biases uniform in +-1 / sqrt(fan_in). What fl_model builds by default, so
   * that a model defined the same way starts from the same distribution as in PyTorch. */
  LAYER_INIT_STYLE_TORCH = 0,
  /* He (Kaiming) normal weights, std sqrt(2 / fan_in), zero biases: torchvision's ResNets
   * (there with fan_out) and what flint's built-in models used before fl_model. */
  LAYER_INIT_STYLE_HE,
} layer_init_style;

typedef struct layer_param_info {
  layer_init init;
  int fan_in;
} layer_param_info;

typedef struct layer_buffer_info {
  size_t offset, count;
  float value; /* initial value */
} layer_buffer_info;

typedef struct layer_store {
  fl_device *dev;
  layer_init_style init_style; /* LAYER_INIT_STYLE_TORCH unless set before finish */
  uint64_t seed;               /* finish's: also keys dropout masks */
  uint64_t step;               /* the optimizer step, set by the model: keys dropout masks */
  nn_param *params; /* names owned by the store; value/grad are views after finish */
  layer_param_info *info;
  size_t nparams, cap_params;
  size_t nvalues;   /* elements of all parameters */
  layer_buffer_info *buffer_info;
  size_t nbuffer_ranges, cap_buffers;
  size_t nbuffers; /* elements of all buffers */
  bool finished;
  fl_tensor values, grads, buffers;
  /* Scratch shared by the convolutions (im2col columns and the pre-transpose output): one
   * convolution runs at a time, so one pair serves them all. */
  fl_tensor work[2];
} layer_store;

/* An empty store on dev; layer_store_release frees what it holds. */
void layer_store_init(layer_store *s, fl_device *dev);
void layer_store_release(layer_store *s);
/* Registers a parameter named "<prefix>.<suffix>" (or suffix alone when prefix is empty) and
 * returns its index. Only before finish. */
fl_status layer_store_add_param(layer_store *s, const char *prefix, const char *suffix,
                                int ndim, const int64_t *shape, layer_init init, int fan_in,
                                size_t *index);
/* Registers `count` non-trainable elements starting at `value`; returns their offset into
 * the buffers tensor. Only before finish. */
fl_status layer_store_add_buffer(layer_store *s, size_t count, float value, size_t *offset);
/* Allocates the flat buffers, points every parameter's value and grad at its range, fills
 * the values from a generator seeded with `seed` (deterministic: the same seed gives the
 * same weights on every rank and device), zeroes the gradients and fills the buffers. */
fl_status layer_store_finish(layer_store *s, uint64_t seed);

/* Changes how parameter `index` is initialised (before finish). */
void layer_store_set_init(layer_store *s, size_t index, layer_init init);
/* Draws a model's LAYER_INIT_WEIGHT/_BIAS parameters in `style` (before fl_model_finish). */
void nn_model_set_init_style(nn_model *m, layer_init_style style);

/* "[2, 3, 4]": t's shape for messages, cut to fit len. */
void layer_shape_text(const fl_tensor *t, char *buf, size_t len);

/* ---- optimizers -----------------------------------------------------------------------
 * One handle for every optimizer: SGD (momentum, Nesterov), Adam, AdamW, LARS and LAMB. Each
 * keeps its state on the device, as long as the model's flat parameter buffer (a velocity, or
 * Adam's two moments), and takes a step as device work over the flat buffers: element-wise
 * kernels for SGD and Adam, one call per run of parameters of one group; for LARS and LAMB,
 * whose trust ratio needs each parameter's norms, one segmented call over every parameter's
 * range (gpu/device/backend.h has the rules). A step reads nothing back to the host, and every
 * rank that applies the same averaged gradient to the same weights gets the same weights
 * (data parallel).
 *
 * Parameter groups. Parameters form two groups: the decay group, with the options' weight
 * decay (and, for LARS and LAMB, the trust ratio), and the no-decay group, without either
 * (LARS's then take plain SGD-momentum steps, LAMB's Adam steps: the usual implementations'
 * exclusion). By default the 1-D parameters (biases, batch- and layer-norm gamma and beta)
 * are in the no-decay group, as Goyal et al. and the LARS/LAMB recipes do; decay_all puts
 * every parameter in the decay group.
 *
 * The rules (lr is the step's rate, wd the parameter's group's weight decay, t the step
 * count from 1):
 *   sgd:   g = grad + wd w;  v = momentum v + g;  w -= lr (nesterov ? g + momentum v : v)
 *   adam:  g = grad + wd w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *          w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)         (PyTorch's Adam)
 *   adamw: w *= 1 - lr wd, then adam's step with wd 0 (decoupled weight decay, PyTorch's)
 *   lars:  ratio = trust_coef ||w|| / (||grad|| + wd ||w||) per parameter (1 when a norm is
 *          0, and in the no-decay group);  v = momentum v + lr ratio (grad + wd w);  w -= v
 *   lamb:  m, v as adam's with wd 0;  r = m-hat / (sqrt(v-hat) + eps) + wd w;
 *          ratio = ||w|| / ||r|| per parameter (1 as lars's);  w -= lr ratio r
 *
 * Threading: an optimizer belongs to the thread that uses its device. */

typedef enum optim_kind {
  OPTIM_SGD = 0,
  OPTIM_ADAM,
  OPTIM_ADAMW,
  OPTIM_LARS,
  OPTIM_LAMB,
  OPTIM_ADAGRAD, /* parameter servers only (train --sync asp|ssp:S): optim_create refuses it */
} optim_kind;

typedef struct optim_options {
  optim_kind kind;
  float momentum;     /* sgd, lars: 0 <= momentum < 1 (sgd's 0: plain SGD) */
  bool nesterov;      /* sgd: Nesterov momentum (needs momentum > 0) */
  float beta1, beta2; /* adam, adamw, lamb: in [0, 1) */
  float eps;          /* adam, adamw, lamb: > 0 */
  float weight_decay; /* the decay group's coefficient, >= 0 */
  float trust_coef;   /* lars: eta of the trust ratio, > 0 (You et al.: 0.001) */
  bool decay_all;     /* every parameter in the decay group (default: not the 1-D ones) */
} optim_options;
/* Goyal et al.'s ResNet settings: SGD, momentum 0.9, weight decay 1e-4, none on biases and
 * norms; Adam's defaults (PyTorch's) for the others. */
#define OPTIM_OPTIONS_INIT {OPTIM_SGD, 0.9f, false, 0.9f, 0.999f, 1e-8f, 1e-4f, 0.001f, false}

/* A parameter as the optimizer sees it: its range of the flat buffers and its group. */
typedef struct optim_param {
  size_t offset, count; /* in elements */
  bool no_decay;        /* in the no-decay group */
} optim_param;

typedef struct optim optim;

/* "sgd", "adam", "adamw", "lars", "lamb"; FL_EINVAL otherwise. */
FL_API fl_status optim_kind_parse(const char *text, optim_kind *out);
FL_API const char *optim_kind_name(optim_kind kind);
/* FL_EINVAL naming the first bad option (as optim_create would). Pure. */
FL_API fl_status optim_options_validate(const optim_options *opts);
/* The public options (flint/train.h) as these; FL_EINVAL names an unknown kind. Values are
 * checked by optim_options_validate (optim_create calls it). */
fl_status optim_options_of(const fl_optimizer_options *o, optim_options *out);
/* The optimizer behind a public one (NULL for NULL), and the model it steps. */
optim *optim_of_public(fl_optimizer *opt);
fl_model *optim_public_model(fl_optimizer *opt);
/* p's group by the default rule: the no-decay group for a 1-D (or 0-D) parameter, unless
 * opts->decay_all. */
optim_param optim_param_of(const nn_param *p, const optim_options *opts);

/* An optimizer for `n` flat parameters (n >= 1) on `dev`, with zeroed state. `params` (nparams
 * of them, copied) must tile [0, n) in order; NULL (nparams 0) makes one parameter of all n
 * in the decay group. opts->decay_all puts every parameter in the decay group, whatever its
 * no_decay says. FL_EINVAL names a bad option or a range that does not tile; the
 * device's error when the state cannot be allocated. */
fl_status optim_create(fl_device *dev, const optim_options *opts, size_t n,
                       const optim_param *params, size_t nparams, optim **out);
/* The same for a model's parameters, grouped by optim_param_of. */
fl_status optim_create_for_model(fl_device *dev, const optim_options *opts, nn_model *m,
                                 optim **out);
/* Frees the state; NULL does nothing. */
void optim_destroy(optim *opt);
/* One step at rate lr over the flat buffers: values (n floats) is updated in place from grads
 * (n floats), both on the optimizer's device; the step count goes up by one. FL_EINVAL for a
 * size or device mismatch, or a lr that is negative or not finite. Queued on the device
 * stream (may return before it ends). */
fl_status optim_step(optim *opt, float lr, const fl_tensor *grads, fl_tensor *values);
/* Zeroes the state and the step count (a fresh start). */
fl_status optim_reset(optim *opt);
size_t optim_size(const optim *opt);
const optim_options *optim_get_options(const optim *opt);
fl_device *optim_device(const optim *opt);
/* Whether parameter i (of optim_param_count) is in the no-decay group. */
size_t optim_param_count(const optim *opt);
bool optim_param_no_decay(const optim *opt, size_t i);
/* The state, for checkpoints and tests: optim_state_slots(kind) buffers of optim_size floats
 * back to back in device memory (sgd, lars: the velocity; adam, adamw, lamb: m then v), and
 * the steps taken (Adam's bias correction counts them). */
size_t optim_state_slots(optim_kind kind);
float *optim_state(optim *opt);
uint64_t optim_steps(const optim *opt);
void optim_set_steps(optim *opt, uint64_t steps);

/* Gradient clipping by global norm, as PyTorch's clip_grad_norm_: with norm the 2-norm of all
 * of grads, scales grads by c = max_norm / (norm + 1e-6) when c < 1 (the norm is above
 * max_norm, give or take the 1e-6). *norm (may be NULL)
 * gets the norm before clipping. FL_EINVAL for a max_norm that is not a finite number > 0.
 * Blocks (reads the norm back). A non-finite norm leaves the gradients as they are (the loss
 * check then stops the run). */
fl_status optim_clip_grad_norm(fl_tensor *grads, double max_norm, double *norm);

/* ---- dynamic loss scaling (gpu/nn/loss_scale.c) ----------------------------------------
 * For fp16 products (fl_precision): the loss's gradient is multiplied by a large scale, so
 * that small gradients survive half precision; after backward the gradients are checked and
 * divided by it. A step whose gradients are not all finite is skipped and the scale halved;
 * after `growth_interval` finite steps in a row it doubles. PyTorch's GradScaler's rule and
 * defaults (2^16, x2 every 2000 steps, x0.5). */
typedef struct loss_scaler {
  float scale;
  uint32_t good_steps;      /* finite steps in a row since the scale last changed */
  uint32_t growth_interval;
  uint64_t skipped;         /* steps skipped so far */
} loss_scaler;
#define LOSS_SCALER_INIT {65536.0f, 0, 2000, 0}
/* After backward (and, in data parallelism, the allreduce: every rank then decides alike):
 * *step is whether every gradient is finite; if so grads are divided by the scale. Either
 * way the scale is updated for the next step (the caller gives it to the model), within
 * [2^-24, 2^24]. Blocks. */
fl_status loss_scaler_unscale(loss_scaler *s, fl_tensor *grads, bool *step);

/* ---- learning-rate schedules ---------------------------------------------------------- */

/* Schedules are pure functions of (schedule, epoch as a real number): the trainer asks for
 * the rate of each step at epoch + step / steps_per_epoch, so warmup ramps per step. Plain
 * data, usable anywhere, as the checkpoint codec below. */

typedef enum optim_decay {
  OPTIM_DECAY_NONE = 0,
  OPTIM_DECAY_STEP,   /* times step_factor at each milestone epoch */
  OPTIM_DECAY_COSINE, /* half a cosine from the peak at the end of warmup to 0 at epochs */
  OPTIM_DECAY_POLY,   /* peak * (1 - t)^power, t from 0 at the end of warmup to 1 at epochs */
} optim_decay;

#define OPTIM_MAX_MILESTONES 8

typedef struct optim_schedule {
  /* The rate for a global batch of reference_batch images. The peak rate is the linear
   * scaling rule's: base_lr * global_batch / reference_batch (Goyal et al.). */
  double base_lr;
  uint32_t global_batch;    /* images per step over all ranks (>= 1) */
  uint32_t reference_batch; /* 0: 256 */
  /* Gradual warmup: over the first warmup_epochs the rate rises linearly, per step, from
   * min(base_lr, peak) to the peak (Goyal et al. start at the small-batch rate). 0: none. */
  double warmup_epochs;
  double epochs; /* the length of training (cosine reaches 0 there); > warmup_epochs */
  optim_decay decay;
  /* Step decay: the rate is multiplied by step_factor (0: 0.1) at each milestone epoch
   * (ascending), counted from the start of training. */
  double milestones[OPTIM_MAX_MILESTONES];
  int num_milestones;
  double step_factor;
  double power; /* polynomial decay's power (0: 2, as You et al.'s LARS runs) */
} optim_schedule;

/* "none", "step", "cosine", "poly"; FL_EINVAL otherwise. */
FL_API fl_status optim_decay_parse(const char *text, optim_decay *out);
FL_API const char *optim_decay_name(optim_decay decay);
/* FL_EINVAL naming the first bad field (rates that are not finite or not positive, a zero
 * batch, warmup beyond the end, milestones out of order, ...). */
fl_status optim_schedule_validate(const optim_schedule *s);
/* The peak rate: base_lr * global_batch / reference_batch. */
FL_API double optim_schedule_peak_lr(const optim_schedule *s);
/* The rate at `epoch` (a real number: epoch e, step i of n is e + i / n). Epochs before 0
 * read as 0 and after the end as the end. Pure; the schedule must be valid. */
double optim_lr_at(const optim_schedule *s, double epoch);
/* Step decay without milestones: x0.1 at half and at three quarters of training. Fills
 * s->milestones from s->epochs when s->num_milestones is 0. */
void optim_schedule_default_milestones(optim_schedule *s);
/* The public schedule (flint/train.h) as this one, validated (FL_EINVAL names a bad field). */
fl_status optim_schedule_of(const fl_lr_schedule *in, optim_schedule *out);

/* ---- attention (gpu/nn/attention.c) ---------------------------------------------------------
 * Scaled dot-product attention over a packed activation qkv [n * s, qkv_ld]: head h's q, k and
 * v (d columns each) start at column part_offset[0 / 1 / 2] + h * head_step of each row. The
 * attention layer packs them as PyTorch's in_proj ([q | k | v], head_step d); the
 * tensor-parallel block as [heads, 3, d] (head_step 3d). Scores and probabilities are
 * [n, heads, s, s]; ctx and its gradient [n * s, heads * d]. The caller may change the
 * probabilities between the two forward steps (dropout) and the probabilities' gradient
 * between the two backward steps (dropout's backward), passing the changed ones on. */
typedef struct attn_layout {
  int n, s, d, heads;
  int qkv_ld;
  int part_offset[3];
  int head_step;
  bool causal; /* a query attends to its own and earlier positions only (GPT) */
} attn_layout;

/* probs = softmax(q k^T / sqrt(d)) per head (causal: -inf above the diagonal first); scores
 * is scratch of probs' size. */
fl_status attn_probs_forward(fl_device *dev, const attn_layout *L, const float *qkv, float *scores, float *probs);
/* ctx = probs v per head. */
fl_status attn_context_forward(fl_device *dev, const attn_layout *L, const float *probs, const float *qkv, float *ctx);
/* From d_ctx: d_probs (overwritten) and the v columns of d_qkv (overwritten). */
fl_status attn_context_backward(fl_device *dev, const attn_layout *L, const float *probs, const float *qkv,
                                const float *d_ctx, float *d_probs, float *d_qkv);
/* From d_probs: the q and k columns of d_qkv (overwritten); d_scores is scratch. */
fl_status attn_probs_backward(fl_device *dev, const attn_layout *L, const float *probs, const float *d_probs,
                              const float *qkv, float *d_scores, float *d_qkv);

/* ---- checkpoints ---------------------------------------------------------------------- */

/* Where training stands, saved with the weights. */
typedef struct checkpoint_state {
  uint32_t epoch;  /* epochs completed */
  uint64_t step;   /* optimizer steps taken since the start */
  double position; /* the schedule's position, in epochs (epoch + fraction) */
  double lr;       /* the rate of the last step, for the record */
  float loss_scale; /* the loss scaler's scale and good steps (0: none; gpu/nn/loss_scale.c) */
  uint32_t loss_scale_good;
} checkpoint_state;

/* The blob: an 88-byte header (magic "FLNTCKPT", version, the three float counts, epoch,
 * the optimizer's kind, step, position, lr, the optimizer's own step count), the values,
 * buffers and optimizer state as float32, and a CRC-32 of all of it; the byte layout is at
 * the top of gpu/nn/checkpoint.c. Version 1 blobs (a 72-byte header, SGD's velocity) are
 * still read. */
#define CHECKPOINT_MAGIC "FLNTCKPT"
#define CHECKPOINT_VERSION 2u

/* Encodes values (the model's flat weights), buffers (batch-norm running statistics; NULL
 * or 0 elements for none) and the optimizer's state and step count (opt may be NULL: no
 * state) with `st` into `out` (replacing its contents). Reads device memory (blocks). */
fl_status checkpoint_encode(const fl_tensor *values, const fl_tensor *buffers, optim *opt,
                            const checkpoint_state *st, fl_buf *out);
/* Validates `blob` completely, then writes it into values, buffers and the optimizer's state
 * and step count (each must have exactly the blob's size) and *st. Nothing is written unless
 * all of it is valid. Without an optimizer (opt NULL: evaluation) the state is skipped.
 * FL_EFORMAT: not a checkpoint (magic), an unknown version, a truncated or overlong blob,
 * or a checksum mismatch; FL_EINVAL: a shape that does not match this model, or state of
 * another optimizer (naming both kinds) or size (naming both sizes). */
fl_status checkpoint_decode(fl_bytes blob, fl_tensor *values, fl_tensor *buffers, optim *opt,
                            checkpoint_state *st);
/* Writes the blob to `path` through a temporary file and a rename (so a crash leaves the old
 * file whole); FL_EIO names the file. */
fl_status checkpoint_save_file(const char *path, fl_bytes blob);
/* Reads a whole file into `out` (at most 4 GiB); FL_ENOENT / FL_EIO name the file. */
fl_status checkpoint_load_file(const char *path, fl_buf *out);

#endif /* FLINT_GPU_NN_H */
