/*
 * gpu/parallel/moe_model.c: the token classifier of gpu/parallel/moe_model.h around one
 * mixture-of-experts layer, and its training step.
 *
 * Design: one layer_store holds every parameter in the order in, head, moe (router, then
 * this rank's experts), so the replicated ones (in, head, router) are one prefix of the flat
 * gradient buffer, summed over the group with one allreduce. in and head take the store's
 * seeded draw (registered first, so their draws do not depend on how many experts follow);
 * the layer's parameters take moe_params_init's keyed draw.
 */
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/moe_model.h"

enum { P_IN_W = 0, P_IN_B, P_HEAD_W, P_HEAD_B, P_MOE };

struct moe_model {
  fl_device *dev;
  moe_model_spec spec;
  fl_comm *comm;
  int ep_rank, ep_size;
  layer_store store;
  size_t replicated; /* elements of the flat buffers' replicated prefix */
  moe_layer layer;
  moe_scratch scratch;
  moe_acts acts;
  fl_tensor h, z, logits, dlogits, dz, dh, stats;
};

fl_status moe_model_create(fl_device *dev, const moe_model_spec *spec, fl_comm *ep_comm,
                           moe_model **out) {
  if (!dev || !spec || !out) return fl_set_error(FL_EINVAL, "moe_model_create: NULL argument");
  if (spec->features < 1 || spec->classes < 1)
    return fl_set_error(FL_EINVAL, "moe model: features (%d) and classes (%d) must be at "
                        "least 1", spec->features, spec->classes);
  int ep_size = ep_comm ? fl_comm_size(ep_comm) : 1, ep_rank = ep_comm ? fl_comm_rank(ep_comm) : 0;
  fl_status status = moe_config_check(&spec->moe, ep_size);
  if (status != FL_OK) return status;
  moe_model *m = common_calloc(1, sizeof *m);
  if (!m) return FL_ERR(FL_ENOMEM, "moe model: out of memory");
  m->dev = dev;
  m->spec = *spec;
  m->comm = ep_size > 1 ? ep_comm : NULL;
  m->ep_rank = ep_rank;
  m->ep_size = ep_size;
  layer_store_init(&m->store, dev);
  const int64_t H = spec->moe.hidden, C = spec->classes, Fin = spec->features;
  int64_t win[2] = {H, Fin}, wh[2] = {C, H};
  size_t idx, first;
  FL_CHECK(layer_store_add_param(&m->store, "in", "weight", 2, win, LAYER_INIT_WEIGHT, (int)Fin, &idx));
  FL_CHECK(layer_store_add_param(&m->store, "in", "bias", 1, &H, LAYER_INIT_BIAS, (int)Fin, &idx));
  FL_CHECK(layer_store_add_param(&m->store, "head", "weight", 2, wh, LAYER_INIT_WEIGHT, (int)H, &idx));
  FL_CHECK(layer_store_add_param(&m->store, "head", "bias", 1, &C, LAYER_INIT_BIAS, (int)H, &idx));
  FL_CHECK(moe_params_add(&m->store, "moe", &spec->moe, ep_rank, ep_size, &first));
  FL_CHECK(layer_store_finish(&m->store, spec->seed));
  size_t count = moe_param_count(&spec->moe, ep_size);
  FL_CHECK(moe_params_init(&m->store, first, count, spec->seed));
  const nn_param *router = &m->store.params[first];
  m->replicated = router->offset + router->value.numel;
  m->layer = (moe_layer){dev, m->comm, spec->moe, ep_rank, ep_size, &m->store.params[first],
                         &m->scratch};
  *out = m;
  return FL_OK;
cleanup:
  moe_model_destroy(m);
  return status;
}

void moe_model_destroy(moe_model *m) {
  if (!m) return;
  moe_acts_release(&m->acts);
  moe_scratch_release(&m->scratch);
  fl_tensor *t[] = {&m->h, &m->z, &m->logits, &m->dlogits, &m->dz, &m->dh, &m->stats};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) tensor_release(t[i]);
  layer_store_release(&m->store);
  common_free(m);
}

static float *val(moe_model *m, int i) { return m->store.params[i].value.data; }
static float *grad(moe_model *m, int i) { return m->store.params[i].grad.data; }

fl_status moe_model_forward_backward(moe_model *m, const fl_tensor *x, const int32_t *labels,
                                     int groups, float grad_scale, float aux_weight,
                                     moe_model_stats *stats) {
  if (!m || !x || !labels) return fl_set_error(FL_EINVAL, "moe_model_forward_backward: NULL argument");
  const int Fin = m->spec.features, H = m->spec.moe.hidden, C = m->spec.classes;
  if (x->dev != m->dev || x->numel == 0 || x->numel % (size_t)Fin ||
      x->numel / (size_t)Fin > INT32_MAX / 2)
    return fl_set_error(FL_EINVAL, "moe model: the input must be rows of %d features on the "
                        "model's device", Fin);
  fl_device *dev = m->dev;
  const device_ops *op = dev->ops;
  const int T = (int)(x->numel / (size_t)Fin);
  int64_t hs[2] = {T, H}, ls[2] = {T, C}, ss[1] = {2};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&m->h, dev, 2, hs));
  FL_CHECK(tensor_ensure(&m->z, dev, 2, hs));
  FL_CHECK(tensor_ensure(&m->logits, dev, 2, ls));
  FL_CHECK(tensor_ensure(&m->dlogits, dev, 2, ls));
  FL_CHECK(tensor_ensure(&m->stats, dev, 1, ss));

  /* Forward. */
  FL_CHECK(op->gemm(dev, false, true, T, H, Fin, 1.0f, x->data, Fin, val(m, P_IN_W), Fin, 0.0f,
                    m->h.data, H));
  FL_CHECK(op->bias_add_rows(dev, T, H, val(m, P_IN_B), m->h.data));
  FL_CHECK(moe_forward(&m->layer, &m->h, groups, aux_weight, &m->acts));
  FL_CHECK(op->copy(dev, m->z.data, m->h.data, (size_t)T * H * sizeof(float)));
  FL_CHECK(op->axpy(dev, (size_t)T * H, 1.0f, m->acts.y.data, m->z.data));
  FL_CHECK(op->gemm(dev, false, true, T, C, H, 1.0f, m->z.data, H, val(m, P_HEAD_W), H, 0.0f,
                    m->logits.data, C));
  FL_CHECK(op->bias_add_rows(dev, T, C, val(m, P_HEAD_B), m->logits.data));
  FL_CHECK(op->memset0(dev, m->stats.data, 2 * sizeof(float)));
  FL_CHECK(op->softmax_xent(dev, T, C, m->logits.data, labels, 0.0f, grad_scale,
                            m->dlogits.data, m->stats.data));

  /* Backward: head, then the layer and the residual, then in. */
  FL_CHECK(tensor_ensure(&m->dz, dev, 2, hs));
  FL_CHECK(op->bias_grad_rows(dev, T, C, m->dlogits.data, grad(m, P_HEAD_B)));
  FL_CHECK(op->gemm(dev, true, false, C, H, T, 1.0f, m->dlogits.data, C, m->z.data, H, 1.0f,
                    grad(m, P_HEAD_W), H));
  FL_CHECK(op->gemm(dev, false, false, T, H, C, 1.0f, m->dlogits.data, C, val(m, P_HEAD_W), H,
                    0.0f, m->dz.data, H));
  FL_CHECK(moe_backward(&m->layer, &m->h, &m->acts, &m->dz, &m->dh));
  FL_CHECK(op->axpy(dev, (size_t)T * H, 1.0f, m->dz.data, m->dh.data));
  FL_CHECK(op->bias_grad_rows(dev, T, H, m->dh.data, grad(m, P_IN_B)));
  FL_CHECK(op->gemm(dev, true, false, H, Fin, T, 1.0f, m->dh.data, H, x->data, Fin, 1.0f,
                    grad(m, P_IN_W), Fin));
  if (stats) {
    float s[2];
    FL_CHECK(op->to_host(dev, s, m->stats.data, sizeof s));
    *stats = (moe_model_stats){s[0], s[1], m->acts.aux_loss, m->acts.route.dropped};
  }
cleanup:
  return status;
}

const fl_tensor *moe_model_logits(const moe_model *m) { return &m->logits; }
const fl_tensor *moe_model_moe_out(const moe_model *m) { return &m->acts.y; }

fl_status moe_model_sync_grads(moe_model *m) {
  if (!m->comm) return FL_OK;
  fl_tensor view;
  int64_t shape[1] = {(int64_t)m->replicated};
  fl_status st = tensor_view(&m->store.grads, 0, 1, shape, &view);
  return st != FL_OK ? st : fl_comm_allreduce(m->comm, &view, FL_REDUCE_SUM);
}

fl_status moe_model_zero_grad(moe_model *m) {
  return m->dev->ops->memset0(m->dev, m->store.grads.data, m->store.nvalues * sizeof(float));
}

fl_status moe_model_train_step(moe_model *m, const fl_tensor *x, const int32_t *labels,
                               int groups, float grad_scale, float aux_weight, float lr,
                               moe_model_stats *stats) {
  fl_status status = FL_OK;
  FL_CHECK(moe_model_zero_grad(m));
  FL_CHECK(moe_model_forward_backward(m, x, labels, groups, grad_scale, aux_weight, stats));
  FL_CHECK(moe_model_sync_grads(m));
  FL_CHECK(m->dev->ops->axpy(m->dev, m->store.nvalues, -lr, m->store.grads.data,
                             m->store.values.data));
cleanup:
  return status;
}

size_t moe_model_param_count(const moe_model *m) { return m->store.nparams; }
nn_param *moe_model_param(moe_model *m, size_t i) {
  return i < m->store.nparams ? &m->store.params[i] : NULL;
}
