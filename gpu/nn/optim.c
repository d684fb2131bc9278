/*
 * gpu/nn/optim.c: the optimizers (SGD, Adam, AdamW, LARS, LAMB) over a model's flat buffers,
 * their parameter groups, and gradient clipping by global norm. See gpu/nn/nn.h for the rules;
 * the arithmetic is the device's (device_ops.sgd_step, adam_step, lars_step, lamb_step).
 *
 * Design. At creation the parameters become segments (optim_segment: a range of the flat
 * buffers and its group's weight decay and trust-ratio switch), uploaded once to the device.
 * Neighbouring parameters that need no norm of their own are merged into one segment (all
 * of them for SGD and Adam, the no-decay runs for LARS and LAMB), so that a step is as few
 * calls as the groups allow: SGD and Adam call their element-wise step once per segment,
 * LARS and LAMB make one segmented call for all of them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/nn.h"

struct optim {
  fl_device *dev;
  size_t n;
  optim_options opts;
  uint64_t steps;
  float *state;          /* device memory, optim_state_slots(kind) * n floats */
  bool *no_decay;        /* host, per parameter */
  size_t nparams;
  optim_segment *segs;   /* host copy */
  int nseg;
  optim_segment *segs_d; /* device copy (the layer-wise steps read it there) */
  double *norms_d;       /* device scratch: 2 doubles a segment */
};

static const char *const kind_names[] = {"sgd", "adam", "adamw", "lars", "lamb", "adagrad"};
#define NUM_KINDS 6

fl_status optim_kind_parse(const char *text, optim_kind *out) {
  for (int i = 0; i < NUM_KINDS; i++)
    if (text && strcmp(text, kind_names[i]) == 0) {
      *out = (optim_kind)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown optimizer '%s' (sgd, adam, adamw, lars, lamb, or adagrad on parameter "
                      "servers)", text ? text : "(null)");
}

const char *optim_kind_name(optim_kind kind) { return (unsigned)kind < NUM_KINDS ? kind_names[kind] : "unknown"; }

size_t optim_state_slots(optim_kind kind) {
  return kind == OPTIM_ADAM || kind == OPTIM_ADAMW || kind == OPTIM_LAMB ? 2 : 1;
}

static bool layer_wise(optim_kind kind) { return kind == OPTIM_LARS || kind == OPTIM_LAMB; }
static bool uses_betas(optim_kind kind) { return kind == OPTIM_ADAM || kind == OPTIM_ADAMW || kind == OPTIM_LAMB; }

fl_status optim_options_validate(const optim_options *o) {
  if (!o) return fl_set_error(FL_EINVAL, "optimizer options are NULL");
  if ((unsigned)o->kind >= NUM_KINDS) return fl_set_error(FL_EINVAL, "unknown optimizer %d", (int)o->kind);
  const char *name = kind_names[o->kind];
  /* Downpour's Adagrad is the parameter servers' update (flint/ps.h), not a device step. */
  if (o->kind == OPTIM_ADAGRAD)
    return fl_set_error(FL_EINVAL, "adagrad is an update the parameter servers apply (Downpour's): train with --sync "
                        "asp or ssp:S");
  if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
    return fl_set_error(FL_EINVAL, "%s: weight decay %g must be a finite number >= 0", name, (double)o->weight_decay);
  if (o->kind == OPTIM_SGD || o->kind == OPTIM_LARS) {
    if (!(o->momentum >= 0 && o->momentum < 1))
      return fl_set_error(FL_EINVAL, "%s: momentum %g must be in [0, 1)", name, (double)o->momentum);
  }
  if (o->nesterov && o->kind != OPTIM_SGD)
    return fl_set_error(FL_EINVAL, "%s: Nesterov momentum is for sgd", name);
  if (o->nesterov && o->momentum == 0) return fl_set_error(FL_EINVAL, "sgd: Nesterov momentum needs momentum > 0");
  if (uses_betas(o->kind)) {
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
      return fl_set_error(FL_EINVAL, "%s: beta1 %g and beta2 %g must be in [0, 1)", name, (double)o->beta1,
                          (double)o->beta2);
    if (!(o->eps > 0) || !isfinite(o->eps))
      return fl_set_error(FL_EINVAL, "%s: eps %g must be a finite number > 0", name, (double)o->eps);
  }
  if (o->kind == OPTIM_LARS && (!(o->trust_coef > 0) || !isfinite(o->trust_coef)))
    return fl_set_error(FL_EINVAL, "lars: trust coefficient %g must be a finite number > 0", (double)o->trust_coef);
  return FL_OK;
}

optim_param optim_param_of(const nn_param *p, const optim_options *o) {
  return (optim_param){.offset = p->offset, .count = p->value.numel, .no_decay = !o->decay_all && p->value.ndim <= 1};
}

void optim_destroy(optim *opt) {
  if (!opt) return;
  if (opt->state) opt->dev->ops->free(opt->dev, opt->state);
  if (opt->segs_d) opt->dev->ops->free(opt->dev, opt->segs_d);
  if (opt->norms_d) opt->dev->ops->free(opt->dev, opt->norms_d);
  common_free(opt->segs);
  common_free(opt->no_decay);
  common_free(opt);
}

/* The segments of the parameters (see the top): merged where no norm of their own is needed. */
static fl_status build_segments(optim *opt, const optim_param *params, size_t nparams) {
  opt->segs = common_calloc(nparams, sizeof *opt->segs);
  if (!opt->segs) return fl_set_error(FL_ENOMEM, "optimizer: out of memory for %zu parameters", nparams);
  bool lw = layer_wise(opt->opts.kind);
  int nseg = 0;
  for (size_t i = 0; i < nparams; i++) {
    bool no_decay = opt->no_decay[i];
    optim_segment seg = {.offset = params[i].offset, .count = params[i].count,
                         .weight_decay = no_decay ? 0.0f : opt->opts.weight_decay, .adapt = lw && !no_decay};
    optim_segment *last = nseg ? &opt->segs[nseg - 1] : NULL;
    if (last && !seg.adapt && !last->adapt && last->weight_decay == seg.weight_decay) {
      last->count += seg.count;
      continue;
    }
    opt->segs[nseg++] = seg;
  }
  opt->nseg = nseg;
  if (!lw) return FL_OK;
  fl_device *dev = opt->dev;
  fl_status s = dev->ops->alloc(dev, (size_t)nseg * sizeof *opt->segs_d, (void **)&opt->segs_d);
  if (s == FL_OK) s = dev->ops->from_host(dev, opt->segs_d, opt->segs, (size_t)nseg * sizeof *opt->segs_d);
  if (s == FL_OK) s = dev->ops->alloc(dev, 2 * (size_t)nseg * sizeof(double), (void **)&opt->norms_d);
  return s;
}

fl_status optim_create(fl_device *dev, const optim_options *opts, size_t n, const optim_param *params,
                       size_t nparams, optim **out) {
  if (!dev || !opts || !out || (nparams && !params)) return fl_set_error(FL_EINVAL, "optim_create: NULL argument");
  *out = NULL;
  if (n == 0) return fl_set_error(FL_EINVAL, "optim_create: a model with no parameters");
  fl_status s = optim_options_validate(opts);
  if (s != FL_OK) return s;
  optim_param all = {.offset = 0, .count = n, .no_decay = false};
  if (nparams == 0) {
    params = &all;
    nparams = 1;
  }
  size_t next = 0;
  for (size_t i = 0; i < nparams; i++) {
    if (params[i].offset != next || params[i].count == 0 || params[i].count > n - next)
      return fl_set_error(FL_EINVAL, "optim_create: parameter %zu covers [%zu, +%zu) but the parameters must tile "
                          "the %zu values in order (the next starts at %zu)", i, params[i].offset, params[i].count,
                          n, next);
    next += params[i].count;
  }
  if (next != n)
    return fl_set_error(FL_EINVAL, "optim_create: the parameters cover %zu of the %zu values", next, n);
  if (nparams > (size_t)INT32_MAX) return fl_set_error(FL_EINVAL, "optim_create: %zu parameters", nparams);
  optim *opt = common_calloc(1, sizeof *opt);
  if (!opt) return fl_set_error(FL_ENOMEM, "optim_create: out of memory");
  opt->dev = dev;
  opt->n = n;
  opt->opts = *opts;
  opt->nparams = nparams;
  opt->no_decay = common_calloc(nparams, sizeof *opt->no_decay);
  if (!opt->no_decay) s = fl_set_error(FL_ENOMEM, "optim_create: out of memory");
  for (size_t i = 0; s == FL_OK && i < nparams; i++) opt->no_decay[i] = params[i].no_decay && !opts->decay_all;
  size_t bytes = optim_state_slots(opts->kind) * n * sizeof(float);
  if (s == FL_OK) s = build_segments(opt, params, nparams);
  if (s == FL_OK) s = dev->ops->alloc(dev, bytes, (void **)&opt->state);
  if (s == FL_OK) s = dev->ops->memset0(dev, opt->state, bytes);
  if (s != FL_OK) {
    optim_destroy(opt);
    return s;
  }
  *out = opt;
  return FL_OK;
}

fl_status optim_create_for_model(fl_device *dev, const optim_options *opts, nn_model *m, optim **out) {
  if (!m || !opts) return fl_set_error(FL_EINVAL, "optim_create_for_model: NULL argument");
  size_t np = nn_model_param_count(m);
  optim_param *params = common_calloc(np ? np : 1, sizeof *params);
  if (!params) return fl_set_error(FL_ENOMEM, "optim_create_for_model: out of memory");
  for (size_t i = 0; i < np; i++) params[i] = optim_param_of(nn_model_param(m, i), opts);
  fl_status s = optim_create(dev, opts, fl_tensor_numel(nn_model_values(m)), params, np, out);
  common_free(params);
  return s;
}

fl_status optim_step(optim *opt, float lr, const fl_tensor *grads, fl_tensor *values) {
  if (!opt || !grads || !values) return fl_set_error(FL_EINVAL, "optim_step: NULL argument");
  if (grads->numel != opt->n || values->numel != opt->n)
    return fl_set_error(FL_EINVAL, "optim_step: %zu gradients and %zu values for an optimizer of %zu",
                        grads->numel, values->numel, opt->n);
  if (grads->dev != opt->dev || values->dev != opt->dev)
    return fl_set_error(FL_EINVAL, "optim_step: tensors on another device than the optimizer's (%s)",
                        opt->dev->name);
  if (!(lr >= 0) || !isfinite(lr))
    return fl_set_error(FL_EINVAL, "optim_step: learning rate %g is not a finite number >= 0", (double)lr);
  fl_device *dev = opt->dev;
  const optim_options *o = &opt->opts;
  const float *g = grads->data;
  float *w = values->data, *s0 = opt->state, *s1 = opt->state + opt->n;
  uint64_t t = opt->steps + 1;
  /* Bias corrections in double: 1 - beta^t loses every digit in float once beta^t is near 1. */
  float bias1 = (float)(1 - pow(o->beta1, (double)t)), bias2 = (float)(1 - pow(o->beta2, (double)t));
  fl_status s = FL_OK;
  switch (o->kind) {
  case OPTIM_SGD:
  case OPTIM_ADAM:
  case OPTIM_ADAMW:
    for (int i = 0; i < opt->nseg && s == FL_OK; i++) {
      const optim_segment *seg = &opt->segs[i];
      size_t off = seg->offset;
      if (o->kind == OPTIM_SGD)
        s = dev->ops->sgd_step(dev, seg->count, lr, o->momentum, seg->weight_decay, o->nesterov, g + off, s0 + off,
                               w + off);
      else
        s = dev->ops->adam_step(dev, seg->count, lr, o->beta1, o->beta2, o->eps, seg->weight_decay,
                                o->kind == OPTIM_ADAMW, bias1, bias2, g + off, s0 + off, s1 + off, w + off);
    }
    break;
  case OPTIM_LARS:
    s = dev->ops->lars_step(dev, opt->nseg, opt->segs_d, opt->n, lr, o->momentum, o->trust_coef, g, s0, w,
                            opt->norms_d);
    break;
  case OPTIM_LAMB:
    s = dev->ops->lamb_step(dev, opt->nseg, opt->segs_d, opt->n, lr, o->beta1, o->beta2, o->eps, bias1, bias2, g,
                            s0, s1, w, opt->norms_d);
    break;
  case OPTIM_ADAGRAD: /* optim_create refused it: the parameter servers' update */
    FL_ASSERT(false);
    break;
  }
  if (s == FL_OK) opt->steps = t;
  return s;
}

fl_status optim_reset(optim *opt) {
  opt->steps = 0;
  return opt->dev->ops->memset0(opt->dev, opt->state, optim_state_slots(opt->opts.kind) * opt->n * sizeof(float));
}

size_t optim_size(const optim *opt) { return opt->n; }
const optim_options *optim_get_options(const optim *opt) { return &opt->opts; }
fl_device *optim_device(const optim *opt) { return opt->dev; }
size_t optim_param_count(const optim *opt) { return opt->nparams; }
bool optim_param_no_decay(const optim *opt, size_t i) { return i < opt->nparams && opt->no_decay[i]; }
float *optim_state(optim *opt) { return opt->state; }
uint64_t optim_steps(const optim *opt) { return opt->steps; }
void optim_set_steps(optim *opt, uint64_t steps) { opt->steps = steps; }

/* ---- clipping --------------------------------------------------------------------------- */

fl_status optim_clip_grad_norm(fl_tensor *grads, double max_norm, double *norm) {
  if (!grads) return fl_set_error(FL_EINVAL, "optim_clip_grad_norm: NULL gradients");
  if (!(max_norm > 0) || !isfinite(max_norm))
    return fl_set_error(FL_EINVAL, "clip_grad_norm: max norm %g must be a finite number > 0", max_norm);
  fl_device *dev = grads->dev;
  double sq = 0;
  fl_status s = dev->ops->sum_squares(dev, grads->numel, grads->data, &sq);
  if (s != FL_OK) return s;
  double total = sqrt(sq);
  if (norm) *norm = total;
  /* PyTorch's rule; a NaN or infinite norm fails the comparison and leaves them be. */
  double coef = max_norm / (total + 1e-6);
  if (isfinite(total) && coef < 1) s = dev->ops->scale(dev, grads->numel, (float)coef, grads->data);
  return s;
}
