/*
 * gpu/nn/schedule.c: the learning-rate schedules of Goyal et al. (linear scaling, gradual
 * warmup, step and cosine decay) and the polynomial decay of You et al.'s LARS runs. Pure
 * functions; see gpu/nn/nn.h for the rules.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"

static const char *const decay_names[] = {"none", "step", "cosine", "poly"};
#define NUM_DECAYS 4

fl_status optim_decay_parse(const char *text, optim_decay *out) {
  for (int i = 0; i < NUM_DECAYS; i++)
    if (text && strcmp(text, decay_names[i]) == 0) {
      *out = (optim_decay)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown decay '%s' (none, step, cosine or poly)", text ? text : "(null)");
}

const char *optim_decay_name(optim_decay decay) {
  return (unsigned)decay < NUM_DECAYS ? decay_names[decay] : "unknown";
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
  if ((unsigned)s->decay > OPTIM_DECAY_POLY) return fl_set_error(FL_EINVAL, "schedule: unknown decay %d", (int)s->decay);
  if (s->decay == OPTIM_DECAY_STEP) {
    if (s->num_milestones < 0 || s->num_milestones > OPTIM_MAX_MILESTONES)
      return fl_set_error(FL_EINVAL, "schedule: %d milestones (at most %d)", s->num_milestones, OPTIM_MAX_MILESTONES);
    for (int i = 0; i < s->num_milestones; i++)
      if (!(s->milestones[i] > 0) || (i > 0 && !(s->milestones[i] > s->milestones[i - 1])))
        return fl_set_error(FL_EINVAL, "schedule: milestone %g must be > 0 and after the one before", s->milestones[i]);
    if (s->step_factor != 0 && !(s->step_factor > 0 && s->step_factor < 1))
      return fl_set_error(FL_EINVAL, "schedule: step factor %g must be in (0, 1)", s->step_factor);
  }
  if (!(s->power >= 0) || !(s->power <= 100))
    return fl_set_error(FL_EINVAL, "schedule: polynomial power %g must be in [0, 100] (0: 2)", s->power);
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
  case OPTIM_DECAY_COSINE:
  case OPTIM_DECAY_POLY: {
    double span = s->epochs - s->warmup_epochs;
    double t = span > 0 ? (epoch - s->warmup_epochs) / span : 1;
    if (s->decay == OPTIM_DECAY_COSINE) return 0.5 * peak * (1 + cos(M_PI * t));
    return peak * pow(1 - t, s->power > 0 ? s->power : 2);
  }
  default:
    return peak;
  }
}

void optim_schedule_default_milestones(optim_schedule *s) {
  if (s->num_milestones) return;
  s->milestones[0] = 0.5 * s->epochs;
  s->milestones[1] = 0.75 * s->epochs;
  s->num_milestones = s->milestones[0] > 0 && s->milestones[1] > s->milestones[0] ? 2 : 0;
}

fl_status optim_schedule_of(const fl_lr_schedule *in, optim_schedule *out) {
  if (!in) return fl_set_error(FL_EINVAL, "schedule: NULL");
  memset(out, 0, sizeof *out);
  fl_status s = in->decay ? optim_decay_parse(in->decay, &out->decay) : FL_OK;
  if (!in->decay) out->decay = OPTIM_DECAY_COSINE;
  if (s != FL_OK) return s;
  if (in->num_milestones < 0 || in->num_milestones > FL_LR_MAX_MILESTONES)
    return fl_set_error(FL_EINVAL, "schedule: %d milestones (at most %d)", in->num_milestones, FL_LR_MAX_MILESTONES);
  if (in->num_milestones && out->decay != OPTIM_DECAY_STEP)
    return fl_set_error(FL_EINVAL, "schedule: milestones are for the \"step\" decay, not \"%s\"",
                        optim_decay_name(out->decay));
  out->base_lr = in->lr;
  out->global_batch = in->batch ? in->batch : 256;
  out->reference_batch = 256;
  out->warmup_epochs = in->warmup_epochs;
  out->epochs = in->epochs;
  memcpy(out->milestones, in->milestones, sizeof(double) * (size_t)in->num_milestones);
  out->num_milestones = in->num_milestones;
  if (out->decay == OPTIM_DECAY_STEP) optim_schedule_default_milestones(out);
  out->step_factor = 0.1;
  out->power = in->power;
  return optim_schedule_validate(out);
}

fl_status fl_lr_schedule_at(const fl_lr_schedule *s, double epoch, double *lr) {
  common_error_clear();
  if (!lr) return fl_set_error(FL_EINVAL, "fl_lr_schedule_at: lr is NULL");
  optim_schedule o;
  fl_status st = optim_schedule_of(s, &o);
  if (st != FL_OK) return st;
  *lr = optim_lr_at(&o, epoch);
  return FL_OK;
}
