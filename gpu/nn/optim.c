/*
 * gpu/nn/optim.c: SGD with momentum, Nesterov and weight decay over a model's flat buffers, and
 * the learning-rate schedules of Goyal et al. (linear scaling, gradual warmup, step and
 * cosine decay). See gpu/nn/nn.h for the rules.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/nn.h"

struct optim_sgd {
  fl_device *dev;
  size_t n;
  optim_sgd_options opts;
  float *velocity; /* device memory, n floats */
};

fl_status optim_sgd_create(fl_device *dev, size_t n, const optim_sgd_options *opts,
                           optim_sgd **out) {
  if (!dev || !opts || !out) return fl_set_error(FL_EINVAL, "optim_sgd_create: NULL argument");
  if (n == 0) return fl_set_error(FL_EINVAL, "optim_sgd_create: a model with no parameters");
  if (!(opts->momentum >= 0 && opts->momentum < 1))
    return fl_set_error(FL_EINVAL, "sgd: momentum %g must be in [0, 1)", (double)opts->momentum);
  if (!(opts->weight_decay >= 0) || !isfinite(opts->weight_decay))
    return fl_set_error(FL_EINVAL, "sgd: weight decay %g must be a finite number >= 0",
                        (double)opts->weight_decay);
  if (opts->nesterov && opts->momentum == 0)
    return fl_set_error(FL_EINVAL, "sgd: Nesterov momentum needs momentum > 0");
  optim_sgd *opt = common_calloc(1, sizeof *opt);
  if (!opt) return fl_set_error(FL_ENOMEM, "optim_sgd_create: out of memory");
  opt->dev = dev;
  opt->n = n;
  opt->opts = *opts;
  fl_status st = dev->ops->alloc(dev, n * sizeof(float), (void **)&opt->velocity);
  if (st == FL_OK) st = dev->ops->memset0(dev, opt->velocity, n * sizeof(float));
  if (st != FL_OK) {
    optim_sgd_destroy(opt);
    return st;
  }
  *out = opt;
  return FL_OK;
}

void optim_sgd_destroy(optim_sgd *opt) {
  if (!opt) return;
  if (opt->velocity) opt->dev->ops->free(opt->dev, opt->velocity);
  common_free(opt);
}

fl_status optim_sgd_step(optim_sgd *opt, float lr, const fl_tensor *grads, fl_tensor *values) {
  if (!opt || !grads || !values) return fl_set_error(FL_EINVAL, "optim_sgd_step: NULL argument");
  if (grads->numel != opt->n || values->numel != opt->n)
    return fl_set_error(FL_EINVAL, "optim_sgd_step: %zu gradients and %zu values for an optimizer of %zu",
                        grads->numel, values->numel, opt->n);
  if (grads->dev != opt->dev || values->dev != opt->dev)
    return fl_set_error(FL_EINVAL, "optim_sgd_step: tensors on another device than the optimizer's (%s)",
                        opt->dev->name);
  if (!(lr >= 0) || !isfinite(lr))
    return fl_set_error(FL_EINVAL, "optim_sgd_step: learning rate %g is not a finite number >= 0", (double)lr);
  return opt->dev->ops->sgd_step(opt->dev, opt->n, lr, opt->opts.momentum, opt->opts.weight_decay,
                                 opt->opts.nesterov, grads->data, opt->velocity, values->data);
}

fl_status optim_sgd_reset(optim_sgd *opt) {
  return opt->dev->ops->memset0(opt->dev, opt->velocity, opt->n * sizeof(float));
}

size_t optim_sgd_size(const optim_sgd *opt) { return opt->n; }
const optim_sgd_options *optim_sgd_get_options(const optim_sgd *opt) { return &opt->opts; }
float *optim_sgd_velocity(optim_sgd *opt) { return opt->velocity; }
fl_device *optim_sgd_device(const optim_sgd *opt) { return opt->dev; }

/* ---- schedules ------------------------------------------------------------------------ */

static const char *const decay_names[] = {"none", "step", "cosine"};

fl_status optim_decay_parse(const char *text, optim_decay *out) {
  for (int i = 0; i < 3; i++)
    if (text && strcmp(text, decay_names[i]) == 0) {
      *out = (optim_decay)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown decay '%s' (none, step or cosine)", text ? text : "(null)");
}

const char *optim_decay_name(optim_decay decay) {
  return (unsigned)decay < 3 ? decay_names[decay] : "unknown";
}

static uint32_t reference_batch(const optim_schedule *s) {
  return s->reference_batch ? s->reference_batch : 256;
}

fl_status optim_schedule_validate(const optim_schedule *s) {
  if (!s) return fl_set_error(FL_EINVAL, "schedule: NULL");
  if (!(s->base_lr > 0) || !isfinite(s->base_lr))
    return fl_set_error(FL_EINVAL, "schedule: base learning rate %g must be a finite number > 0", s->base_lr);
  if (s->global_batch == 0) return fl_set_error(FL_EINVAL, "schedule: global batch 0");
  if (!(s->epochs > 0) || !isfinite(s->epochs))
    return fl_set_error(FL_EINVAL, "schedule: %g epochs (must be > 0)", s->epochs);
  if (!(s->warmup_epochs >= 0) || !(s->warmup_epochs < s->epochs || s->warmup_epochs == 0))
    return fl_set_error(FL_EINVAL, "schedule: warmup of %g epochs must be >= 0 and shorter than the %g epochs "
                        "of training", s->warmup_epochs, s->epochs);
  if ((unsigned)s->decay > OPTIM_DECAY_COSINE) return fl_set_error(FL_EINVAL, "schedule: unknown decay %d", (int)s->decay);
  if (s->decay == OPTIM_DECAY_STEP) {
    if (s->num_milestones < 0 || s->num_milestones > OPTIM_MAX_MILESTONES)
      return fl_set_error(FL_EINVAL, "schedule: %d milestones (at most %d)", s->num_milestones, OPTIM_MAX_MILESTONES);
    for (int i = 0; i < s->num_milestones; i++)
      if (!(s->milestones[i] > 0) || (i > 0 && !(s->milestones[i] > s->milestones[i - 1])))
        return fl_set_error(FL_EINVAL, "schedule: milestone %g must be > 0 and after the one before", s->milestones[i]);
    if (s->step_factor != 0 && !(s->step_factor > 0 && s->step_factor < 1))
      return fl_set_error(FL_EINVAL, "schedule: step factor %g must be in (0, 1)", s->step_factor);
  }
  return FL_OK;
}

double optim_schedule_peak_lr(const optim_schedule *s) {
  return s->base_lr * (double)s->global_batch / (double)reference_batch(s);
}

double optim_lr_at(const optim_schedule *s, double epoch) {
  double peak = optim_schedule_peak_lr(s);
  if (!(epoch > 0)) epoch = 0; /* NaN too */
  if (epoch > s->epochs) epoch = s->epochs;
  if (s->warmup_epochs > 0 && epoch < s->warmup_epochs) {
    double start = s->base_lr < peak ? s->base_lr : peak;
    return start + (peak - start) * (epoch / s->warmup_epochs);
  }
  switch (s->decay) {
  case OPTIM_DECAY_STEP: {
    double factor = s->step_factor ? s->step_factor : 0.1, lr = peak;
    for (int i = 0; i < s->num_milestones; i++)
      if (epoch >= s->milestones[i]) lr *= factor;
    return lr;
  }
  case OPTIM_DECAY_COSINE: {
    double span = s->epochs - s->warmup_epochs;
    double t = span > 0 ? (epoch - s->warmup_epochs) / span : 1;
    return 0.5 * peak * (1 + cos(M_PI * t));
  }
  default:
    return peak;
  }
}
