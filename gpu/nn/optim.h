/*
 * gpu/nn/optim.h: the optimizer, learning-rate schedules and checkpoints of the training stack.
 *
 * SGD keeps one velocity buffer on the device, as long as the model's flat parameter buffer
 * (gpu/nn/nn.h), and takes a step with ONE device_ops.sgd_step call over the whole buffer, so a
 * step costs one kernel however many layers the model has, and every rank that applies the
 * same averaged gradient to the same weights gets the same weights (data parallel).
 *
 * Weight decay is one coefficient for every parameter, biases and batch-norm gamma/beta
 * included. Goyal et al. (2017) decay those too in their ResNet-50 runs; leaving them out
 * would need a per-parameter mask and a second kernel per step, for a gain that does not
 * matter at the sizes trained here. The rule is device_ops.sgd_step's (PyTorch's):
 *   g = grad + weight_decay * w;  v = momentum * v + g;  w -= lr * (nesterov ? g + momentum * v : v)
 *
 * Schedules are pure functions of (schedule, epoch as a real number): the trainer asks for
 * the rate of each step at epoch + step / steps_per_epoch, so warmup ramps per step.
 *
 * Threading: an optimizer belongs to the thread that uses its device. Schedules and the
 * checkpoint codec are plain data and may be used anywhere.
 */
#ifndef FLINT_GPU_OPTIM_H
#define FLINT_GPU_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/device/device.h"

/* ---- SGD ------------------------------------------------------------------------------ */

typedef struct optim_sgd_options {
  float momentum;     /* 0 <= momentum < 1; 0: plain SGD (the velocity is then the gradient) */
  bool nesterov;      /* Nesterov momentum (needs momentum > 0) */
  float weight_decay; /* L2 coefficient >= 0, the same for every parameter (see above) */
} optim_sgd_options;
/* Goyal et al.'s ResNet settings: momentum 0.9, weight decay 1e-4, no Nesterov. */
#define OPTIM_SGD_OPTIONS_INIT {0.9f, false, 1e-4f}

typedef struct optim_sgd optim_sgd;

/* An optimizer for `n` parameters (n >= 1) on `dev`, with a zeroed velocity. FL_EINVAL names
 * a bad option; the device's error when the velocity cannot be allocated. */
fl_status optim_sgd_create(fl_device *dev, size_t n, const optim_sgd_options *opts,
                           optim_sgd **out);
/* Frees the velocity; NULL does nothing. */
void optim_sgd_destroy(optim_sgd *opt);
/* One step over the flat buffers: values (n floats) is updated in place from grads (n
 * floats), both on the optimizer's device. FL_EINVAL for a size or device mismatch, or a lr
 * that is negative or not finite. Queued on the device stream (may return before it ends). */
fl_status optim_sgd_step(optim_sgd *opt, float lr, const fl_tensor *grads, fl_tensor *values);
/* Zeroes the velocity (a fresh start). */
fl_status optim_sgd_reset(optim_sgd *opt);
size_t optim_sgd_size(const optim_sgd *opt);
const optim_sgd_options *optim_sgd_get_options(const optim_sgd *opt);
/* The velocity buffer (device memory, optim_sgd_size floats), for checkpoints and tests. */
float *optim_sgd_velocity(optim_sgd *opt);
fl_device *optim_sgd_device(const optim_sgd *opt);

/* ---- learning-rate schedules ---------------------------------------------------------- */

typedef enum optim_decay {
  OPTIM_DECAY_NONE = 0,
  OPTIM_DECAY_STEP,   /* times step_factor at each milestone epoch */
  OPTIM_DECAY_COSINE, /* half a cosine from the peak at the end of warmup to 0 at epochs */
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
} optim_schedule;

/* "none", "step", "cosine"; FL_EINVAL otherwise. */
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

/* ---- checkpoints ---------------------------------------------------------------------- */

/* Where training stands, saved with the weights. */
typedef struct checkpoint_state {
  uint32_t epoch;  /* epochs completed */
  uint64_t step;   /* optimizer steps taken since the start */
  double position; /* the schedule's position, in epochs (epoch + fraction) */
  double lr;       /* the rate of the last step, for the record */
} checkpoint_state;

/* The blob: a 72-byte header (magic "FLNTCKPT", version, the three float counts, epoch,
 * step, position, lr), the values, buffers and velocity as float32, and a CRC-32 of all of it;
 * the byte layout is at the top of gpu/checkpoint.c. */
#define CHECKPOINT_MAGIC "FLNTCKPT"
#define CHECKPOINT_VERSION 1u

/* Encodes values (the model's flat weights), buffers (batch-norm running statistics; NULL
 * or 0 elements for none) and the optimizer's velocity (opt may be NULL: no velocity) with
 * `st` into `out` (replacing its contents). Reads device memory (blocks). */
fl_status checkpoint_encode(const fl_tensor *values, const fl_tensor *buffers,
                            optim_sgd *opt, const checkpoint_state *st, fl_buf *out);
/* Validates `blob` completely, then writes it into values, buffers and the velocity (each
 * must have exactly the blob's size) and *st. Nothing is written unless all of it is valid.
 * FL_EFORMAT: not a checkpoint (magic), an unknown version, a truncated or overlong blob,
 * or a checksum mismatch; FL_EINVAL: a shape that does not match this model or optimizer
 * (naming both sizes). */
fl_status checkpoint_decode(fl_bytes blob, fl_tensor *values, fl_tensor *buffers,
                            optim_sgd *opt, checkpoint_state *st);
/* Writes the blob to `path` through a temporary file and a rename (so a crash leaves the old
 * file whole); FL_EIO names the file. */
fl_status checkpoint_save_file(const char *path, fl_bytes blob);
/* Reads a whole file into `out` (at most 4 GiB); FL_ENOENT / FL_EIO name the file. */
fl_status checkpoint_load_file(const char *path, fl_buf *out);

#endif /* FLINT_GPU_OPTIM_H */
