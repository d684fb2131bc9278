/*
 * gpu/nn/layer_store.c: the parameter store of gpu/nn/nn.h: every parameter of a model (or a
 * transformer chunk) in one flat value buffer and one flat gradient buffer, initialised from
 * a seeded generator so that every rank and device starts from the same weights.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/nn.h"

/* ---- the parameter store --------------------------------------------------------------- */

void layer_store_init(layer_store *s, fl_device *dev) {
  *s = (layer_store){0};
  s->dev = dev;
}

void layer_store_release(layer_store *s) {
  if (!s) return;
  for (size_t i = 0; i < s->nparams; i++) common_free((char *)s->params[i].name);
  common_free(s->params);
  common_free(s->info);
  common_free(s->buffer_info);
  tensor_release(&s->values);
  tensor_release(&s->grads);
  tensor_release(&s->buffers);
  tensor_release(&s->work[0]);
  tensor_release(&s->work[1]);
  fl_device *dev = s->dev;
  *s = (layer_store){0};
  s->dev = dev;
}

fl_status layer_store_add_param(layer_store *s, const char *prefix, const char *suffix,
                                int ndim, const int64_t *shape, layer_init init, int fan_in,
                                size_t *index) {
  FL_ASSERT(!s->finished && ndim >= 1 && ndim <= FL_TENSOR_MAX_DIMS);
  if (s->nparams == s->cap_params) {
    size_t cap = s->cap_params ? 2 * s->cap_params : 16;
    nn_param *p = common_realloc(s->params, cap * sizeof *p);
    if (!p) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
    s->params = p;
    layer_param_info *q = common_realloc(s->info, cap * sizeof *q);
    if (!q) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
    s->info = q;
    s->cap_params = cap;
  }
  size_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= (size_t)shape[i];
  char name[128];
  snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", suffix);
  char *copy = common_strdup(name);
  if (!copy) return FL_ERR(FL_ENOMEM, "layer_store_add_param: out of memory");
  nn_param *p = &s->params[s->nparams];
  *p = (nn_param){0};
  p->name = copy;
  p->offset = s->nvalues;
  /* The shape waits in the value tensor until finish points it at the flat buffer. */
  p->value.ndim = ndim;
  for (int i = 0; i < ndim; i++) p->value.shape[i] = shape[i];
  p->value.numel = numel;
  s->info[s->nparams] = (layer_param_info){init, fan_in};
  s->nvalues += numel;
  *index = s->nparams++;
  return FL_OK;
}

fl_status layer_store_add_buffer(layer_store *s, size_t count, float value, size_t *offset) {
  FL_ASSERT(!s->finished);
  if (s->nbuffer_ranges == s->cap_buffers) {
    size_t cap = s->cap_buffers ? 2 * s->cap_buffers : 8;
    layer_buffer_info *b = common_realloc(s->buffer_info, cap * sizeof *b);
    if (!b) return FL_ERR(FL_ENOMEM, "layer_store_add_buffer: out of memory");
    s->buffer_info = b;
    s->cap_buffers = cap;
  }
  s->buffer_info[s->nbuffer_ranges++] = (layer_buffer_info){s->nbuffers, count, value};
  *offset = s->nbuffers;
  s->nbuffers += count;
  return FL_OK;
}

/* splitmix64: a tiny generator with a 64-bit state that is enough for initial weights and is
 * the same on every platform, so that every rank draws the same model from the same seed. */
static uint64_t splitmix64_next(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1): never 0, so that log() in Box-Muller is finite. */
static double uniform_open(uint64_t *state) {
  return ((double)(splitmix64_next(state) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal01(uint64_t *state) {
  double u1 = uniform_open(state), u2 = uniform_open(state);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

fl_status layer_store_finish(layer_store *s, uint64_t seed) {
  FL_ASSERT(!s->finished);
  fl_status status = FL_OK;
  float *host = NULL;
  int64_t nv[1] = {(int64_t)s->nvalues}, nb[1] = {(int64_t)s->nbuffers};
  FL_CHECK(tensor_ensure(&s->values, s->dev, 1, nv));
  FL_CHECK(tensor_ensure(&s->grads, s->dev, 1, nv));
  FL_CHECK(tensor_ensure(&s->buffers, s->dev, 1, nb));
  size_t most = s->nvalues > s->nbuffers ? s->nvalues : s->nbuffers;
  host = common_malloc((most ? most : 1) * sizeof *host);
  if (!host) FL_CHECK(FL_ERR(FL_ENOMEM, "layer_store_finish: out of memory for %zu weights", most));

  s->seed = seed;
  uint64_t state = seed;
  for (size_t i = 0; i < s->nparams; i++) {
    nn_param *p = &s->params[i];
    int ndim = p->value.ndim;
    int64_t shape[FL_TENSOR_MAX_DIMS];
    memcpy(shape, p->value.shape, sizeof shape);
    FL_CHECK(tensor_view(&s->values, p->offset, ndim, shape, &p->value));
    FL_CHECK(tensor_view(&s->grads, p->offset, ndim, shape, &p->grad));
    float *w = host + p->offset;
    layer_param_info info = s->info[i];
    double fan_in = info.fan_in > 0 ? info.fan_in : 1;
    bool he = s->init_style == LAYER_INIT_STYLE_HE;
    double he_std = sqrt(2.0 / fan_in), bound = 1.0 / sqrt(fan_in);
    for (size_t j = 0; j < p->value.numel; j++) {
      switch (info.init) {
      case LAYER_INIT_WEIGHT:
        w[j] = (float)(he ? he_std * normal01(&state) : bound * (2.0 * uniform_open(&state) - 1.0));
        break;
      case LAYER_INIT_BIAS: w[j] = he ? 0.0f : (float)(bound * (2.0 * uniform_open(&state) - 1.0)); break;
      case LAYER_INIT_ZERO: w[j] = 0.0f; break;
      case LAYER_INIT_NORMAL: w[j] = (float)normal01(&state); break;
      case LAYER_INIT_XAVIER: w[j] = (float)(sqrt(6.0 / fan_in) * (2.0 * uniform_open(&state) - 1.0)); break;
      case LAYER_INIT_ONE: w[j] = 1.0f; break;
      }
    }
  }
  if (s->nvalues) {
    FL_CHECK(s->dev->ops->from_host(s->dev, s->values.data, host, s->nvalues * sizeof *host));
    FL_CHECK(s->dev->ops->memset0(s->dev, s->grads.data, s->nvalues * sizeof(float)));
  }
  for (size_t r = 0; r < s->nbuffer_ranges; r++) {
    layer_buffer_info b = s->buffer_info[r];
    for (size_t j = 0; j < b.count; j++) host[b.offset + j] = b.value;
  }
  if (s->nbuffers)
    FL_CHECK(s->dev->ops->from_host(s->dev, s->buffers.data, host, s->nbuffers * sizeof *host));
  s->finished = true;
cleanup:
  common_free(host);
  return status;
}

void layer_store_set_init(layer_store *s, size_t index, layer_init init) {
  FL_ASSERT(!s->finished && index < s->nparams);
  s->info[index].init = init;
}
