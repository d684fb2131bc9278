/*
 * gpu/nn/optim_api.c: the public optimizers of include/flint/train.h over gpu/nn/optim.c.
 */
#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"

struct fl_optimizer {
  optim *opt;
  fl_model *model;
};

fl_status optim_options_of(const fl_optimizer_options *o, optim_options *out) {
  optim_options oo = OPTIM_OPTIONS_INIT;
  fl_status s = optim_kind_parse(o->kind ? o->kind : "sgd", &oo.kind);
  if (s != FL_OK) return s;
  oo.momentum = (float)o->momentum;
  oo.nesterov = o->nesterov;
  oo.beta1 = (float)o->beta1;
  oo.beta2 = (float)o->beta2;
  oo.eps = (float)o->eps;
  oo.weight_decay = (float)o->weight_decay;
  oo.trust_coef = (float)o->trust_coef;
  oo.decay_all = o->decay_all;
  *out = oo;
  return FL_OK;
}

fl_status fl_optimizer_create(fl_model *m, const fl_optimizer_options *opts, fl_optimizer **out) {
  common_error_clear();
  if (!m || !out) return fl_set_error(FL_EINVAL, "fl_optimizer_create: NULL argument");
  if (!fl_model_weights(m)) return fl_set_error(FL_ESTATE, "fl_optimizer_create: the model is not finished");
  fl_optimizer_options def = FL_OPTIMIZER_OPTIONS_INIT, o = opts ? *opts : def;
  optim_options oo;
  fl_status s = optim_options_of(&o, &oo);
  if (s != FL_OK) return s;
  fl_optimizer *opt = common_calloc(1, sizeof *opt);
  if (!opt) return FL_ERR(FL_ENOMEM, "fl_optimizer_create: out of memory");
  opt->model = m;
  s = optim_create_for_model(fl_tensor_device(fl_model_weights(m)), &oo, m, &opt->opt);
  if (s != FL_OK) {
    common_free(opt);
    return s;
  }
  *out = opt;
  return FL_OK;
}

optim *optim_of_public(fl_optimizer *opt) { return opt ? opt->opt : NULL; }

fl_model *optim_public_model(fl_optimizer *opt) { return opt ? opt->model : NULL; }

void fl_optimizer_destroy(fl_optimizer *opt) {
  if (!opt) return;
  optim_destroy(opt->opt);
  common_free(opt);
}

fl_status fl_optimizer_step(fl_optimizer *opt, double lr) {
  common_error_clear();
  if (!opt) return fl_set_error(FL_EINVAL, "fl_optimizer_step: NULL optimizer");
  return optim_step(opt->opt, (float)lr, fl_model_gradients(opt->model), fl_model_weights(opt->model));
}

fl_status fl_model_clip_grad_norm(fl_model *m, double max_norm, double *norm) {
  common_error_clear();
  if (!m || !fl_model_gradients(m)) return fl_set_error(FL_EINVAL, "fl_model_clip_grad_norm: no finished model");
  return optim_clip_grad_norm(fl_model_gradients(m), max_norm, norm);
}
