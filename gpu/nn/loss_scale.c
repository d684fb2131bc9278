/*
 * gpu/nn/loss_scale.c: dynamic loss scaling for fp16 products (nn.h's loss_scaler) and its
 * public face, include/flint/train.h's fl_grad_scaler.
 */
#include <math.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"

/* Beyond 2^24 a float scale no longer helps fp16 (whose smallest subnormal is 2^-24) and
 * products of it with large gradients overflow fp32 itself. Below 2^-24 halving would reach
 * 0 after some 150 bad steps, and 1 / 0 would turn the next gradients into NaN. */
#define MAX_SCALE 16777216.0f
#define MIN_SCALE (1.0f / 16777216.0f)

fl_status loss_scaler_unscale(loss_scaler *s, fl_tensor *grads, bool *step) {
  fl_device *dev = grads->dev;
  double sum = 0;
  /* An inf or NaN anywhere makes the sum of squares non-finite; finite fp32 squares cannot
   * overflow a double. */
  fl_status st = grads->numel ? dev->ops->sum_squares(dev, grads->numel, grads->data, &sum) : FL_OK;
  if (st != FL_OK) return st;
  *step = isfinite(sum);
  if (!*step) {
    if (s->scale * 0.5f >= MIN_SCALE) s->scale *= 0.5f;
    s->good_steps = 0;
    s->skipped++;
    return FL_OK;
  }
  if (s->scale != 1.0f && grads->numel) st = dev->ops->scale(dev, grads->numel, 1.0f / s->scale, grads->data);
  if (++s->good_steps >= s->growth_interval) {
    s->good_steps = 0;
    if (s->scale * 2.0f <= MAX_SCALE) s->scale *= 2.0f;
  }
  return st;
}

struct fl_grad_scaler {
  fl_model *model;
  loss_scaler s;
};

fl_status fl_grad_scaler_create(fl_model *m, const fl_grad_scaler_options *opts, fl_grad_scaler **out) {
  common_error_clear();
  if (!m || !out) return fl_set_error(FL_EINVAL, "fl_grad_scaler_create: NULL argument");
  if (!fl_model_gradients(m)) return fl_set_error(FL_ESTATE, "fl_grad_scaler_create: the model is not finished");
  fl_grad_scaler_options def = FL_GRAD_SCALER_OPTIONS_INIT, o = opts ? *opts : def;
  if (!(o.init_scale >= 1 && o.init_scale <= MAX_SCALE))
    return fl_set_error(FL_EINVAL, "fl_grad_scaler_create: init_scale %g must be in [1, 2^24]", o.init_scale);
  if (o.growth_interval < 1) return fl_set_error(FL_EINVAL, "fl_grad_scaler_create: growth_interval 0");
  fl_grad_scaler *g = common_calloc(1, sizeof *g);
  if (!g) return FL_ERR(FL_ENOMEM, "fl_grad_scaler_create: out of memory");
  g->model = m;
  g->s = (loss_scaler)LOSS_SCALER_INIT;
  g->s.scale = (float)o.init_scale;
  g->s.growth_interval = o.growth_interval;
  nn_model_set_loss_scale(m, g->s.scale);
  *out = g;
  return FL_OK;
}

void fl_grad_scaler_destroy(fl_grad_scaler *g) {
  if (!g) return;
  nn_model_set_loss_scale(g->model, 1.0f);
  common_free(g);
}

double fl_grad_scaler_scale(const fl_grad_scaler *g) { return g ? g->s.scale : 1.0; }

uint64_t fl_grad_scaler_skipped(const fl_grad_scaler *g) { return g ? g->s.skipped : 0; }

fl_status fl_grad_scaler_unscale(fl_grad_scaler *g, bool *step) {
  common_error_clear();
  if (!g || !step) return fl_set_error(FL_EINVAL, "fl_grad_scaler_unscale: NULL argument");
  fl_status st = loss_scaler_unscale(&g->s, fl_model_gradients(g->model), step);
  nn_model_set_loss_scale(g->model, g->s.scale);
  return st;
}
