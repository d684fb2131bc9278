/*
 * gpu/nn/model.c: models as include/flint/train.h defines them (fl_model, which gpu/nn/nn.h
 * also calls nn_model): a sequence of layers of gpu/nn/layers.h over one parameter store,
 * built by appending layers whose input shapes follow from the layers before them. The
 * built-in models (gpu/nn/models.c) are built through the same calls.
 *
 * While building, `open` is the stack of residual blocks not yet ended: a new layer goes to
 * the innermost one's current path, or to the model's own sequence when none is open.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/layers.h"

#define MODEL_MAX_NESTING 16

/* Returns the status of `call` when it fails. */
#define TRY(call)                                                                            \
  do {                                                                                       \
    fl_status try_status_ = (call);                                                          \
    if (try_status_ != FL_OK) return try_status_;                                            \
  } while (0)

/* The per-sample shape of a tensor flowing between layers. */
typedef struct sample_shape {
  int ndim;
  int64_t dims[FL_MODEL_MAX_SAMPLE_DIMS];
} sample_shape;

typedef struct open_block {
  layer *block;
  bool in_shortcut;
  sample_shape input;    /* the block's input */
  sample_shape main_out; /* the main path's output, once the shortcut began */
} open_block;

struct fl_model {
  fl_device *dev;
  layer_store store;
  layer **layers; /* the model's own sequence */
  size_t nlayers, cap;
  sample_shape input, shape; /* the input, and the output of the layers so far */
  open_block open[MODEL_MAX_NESTING];
  int nopen;
  uint64_t layer_keys; /* layers made so far: keys dropout masks apart */
  bool finished;
  const fl_tensor *y;  /* the last forward's output; NULL before one */
  fl_tensor dy;        /* the last loss's gradient of y */
  bool have_loss;
  int32_t *labels_d;   /* fl_model_cross_entropy's labels on the device */
  size_t labels_cap;
  float *stats_d;      /* 2 floats: loss sum and correct count */
  float loss_scale;    /* the losses' gradients are multiplied by it (a loss scaler's; 1) */
};

static void shape_text(const sample_shape *s, char *buf, size_t len) {
  size_t at = (size_t)snprintf(buf, len, "[n");
  for (int i = 0; i < s->ndim && at < len; i++) at += (size_t)snprintf(buf + at, len - at, ", %lld", (long long)s->dims[i]);
  if (at < len) snprintf(buf + at, len - at, "]");
}

static int64_t shape_numel(const sample_shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
  return n;
}

static bool shape_equal(const sample_shape *a, const sample_shape *b) {
  if (shape_numel(a) != shape_numel(b)) return false;
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

/* FL_ESTATE once finished (layers can no longer be added). */
static fl_status check_building(const fl_model *m, const char *what) {
  if (!m) return fl_set_error(FL_EINVAL, "%s: the model is NULL", what);
  if (m->finished) return fl_set_error(FL_ESTATE, "%s: the model is finished (add layers before fl_model_finish)", what);
  return FL_OK;
}

/* FL_EINVAL naming the layer and the shape it was given, unless `ok`. */
static fl_status need_shape(const fl_model *m, bool ok, const char *layer_name, const char *expected) {
  if (ok) return FL_OK;
  char got[96];
  shape_text(&m->shape, got, sizeof got);
  return fl_set_error(FL_EINVAL, "%s: its input would be %s, expected %s", layer_name, got, expected);
}

/* Puts a new layer (created on m->store) where the model is building, with its output shape.
 * Takes the layer (destroys it on failure). */
static fl_status place(fl_model *m, layer *l, const sample_shape *out) {
  m->layer_keys++;
  if (m->nopen > 0) {
    open_block *b = &m->open[m->nopen - 1];
    fl_status st = layer_residual_append(b->block, b->in_shortcut, l);
    if (st != FL_OK) return st;
  } else {
    if (m->nlayers == m->cap) {
      size_t cap = m->cap ? 2 * m->cap : 16;
      layer **grown = common_realloc(m->layers, cap * sizeof *grown);
      if (!grown) {
        layer_destroy(l);
        return FL_ERR(FL_ENOMEM, "fl_model: out of memory for %zu layers", cap);
      }
      m->layers = grown;
      m->cap = cap;
    }
    m->layers[m->nlayers++] = l;
  }
  m->shape = *out;
  return FL_OK;
}

/* The name a layer gets: `name` (users name layers with parameters), else its kind. */
static const char *name_or(const char *name, const char *kind) { return name && *name ? name : kind; }

/* Whether `name` is a usable prefix (parameter names are "<name>.weight"). */
static fl_status check_name(const char *name, const char *what) {
  if (!name || !*name) return fl_set_error(FL_EINVAL, "%s: a layer with parameters needs a name", what);
  if (strlen(name) >= 48) return fl_set_error(FL_EINVAL, "%s: the name '%.60s' is longer than 47 bytes", what, name);
  return FL_OK;
}

/* ---- building ------------------------------------------------------------------------- */

fl_status fl_model_create(fl_device *dev, int ndim, const int64_t *shape, fl_model **out) {
  common_error_clear();
  if (!dev || !shape || !out) return fl_set_error(FL_EINVAL, "fl_model_create: NULL argument");
  if (ndim < 1 || ndim > FL_MODEL_MAX_SAMPLE_DIMS)
    return fl_set_error(FL_EINVAL, "fl_model_create: a sample has %d dimensions (1 to %d)", ndim,
                        FL_MODEL_MAX_SAMPLE_DIMS);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 1 || shape[i] > INT32_MAX)
      return fl_set_error(FL_EINVAL, "fl_model_create: dimension %d of a sample is %lld", i, (long long)shape[i]);
  fl_model *m = common_calloc(1, sizeof *m);
  if (m) m->loss_scale = 1.0f;
  if (!m) return FL_ERR(FL_ENOMEM, "fl_model_create: out of memory");
  m->dev = dev;
  layer_store_init(&m->store, dev);
  m->input.ndim = ndim;
  for (int i = 0; i < ndim; i++) m->input.dims[i] = shape[i];
  m->shape = m->input;
  *out = m;
  return FL_OK;
}

void fl_model_destroy(fl_model *m) {
  if (!m) return;
  for (int i = m->nopen; i-- > 0;) layer_destroy(m->open[i].block); /* owns what it holds */
  for (size_t i = 0; i < m->nlayers; i++) layer_destroy(m->layers[i]);
  common_free(m->layers);
  tensor_release(&m->dy);
  if (m->labels_d) m->dev->ops->free(m->dev, m->labels_d);
  if (m->stats_d) m->dev->ops->free(m->dev, m->stats_d);
  layer_store_release(&m->store);
  common_free(m);
}

fl_status fl_model_linear(fl_model *m, const char *name, int out_features, bool bias) {
  common_error_clear();
  TRY(check_building(m, "fl_model_linear"));
  TRY(check_name(name, "fl_model_linear"));
  if (out_features < 1) return fl_set_error(FL_EINVAL, "linear %s: %d output features (at least 1)", name, out_features);
  int64_t in = m->shape.dims[m->shape.ndim - 1];
  layer *l;
  TRY(layer_linear_create(&m->store, name, (int)in, out_features, bias, &l));
  sample_shape out = m->shape;
  out.dims[out.ndim - 1] = out_features;
  return place(m, l, &out);
}

fl_status fl_model_conv2d(fl_model *m, const char *name, const fl_conv2d_options *o) {
  common_error_clear();
  TRY(check_building(m, "fl_model_conv2d"));
  TRY(check_name(name, "fl_model_conv2d"));
  if (!o) return fl_set_error(FL_EINVAL, "conv2d %s: options are NULL", name);
  int stride = o->stride ? o->stride : 1, groups = o->groups ? o->groups : 1;
  char want[64];
  snprintf(want, sizeof want, "[n, C, H, W] with H, W >= %d", o->kernel - 2 * o->padding > 1 ? o->kernel - 2 * o->padding : 1);
  const sample_shape *s = &m->shape;
  TRY(need_shape(m, s->ndim == 3 && s->dims[1] + 2 * o->padding >= o->kernel &&
                                    s->dims[2] + 2 * o->padding >= o->kernel, name, want));
  layer *l;
  TRY(layer_conv2d_grouped_create(&m->store, name, (int)s->dims[0], o->out_channels, o->kernel, stride, o->padding,
                                  groups, o->bias, &l));
  sample_shape out = {3, {o->out_channels, layer_out_size((int)s->dims[1], o->kernel, stride, o->padding),
                          layer_out_size((int)s->dims[2], o->kernel, stride, o->padding)}};
  return place(m, l, &out);
}

fl_status fl_model_batchnorm(fl_model *m, const char *name, bool zero_gamma) {
  common_error_clear();
  TRY(check_building(m, "fl_model_batchnorm"));
  TRY(check_name(name, "fl_model_batchnorm"));
  TRY(need_shape(m, m->shape.ndim >= 1, name, "[n, C, ...]"));
  int64_t c = m->shape.dims[0];
  layer *l;
  TRY(layer_batchnorm_create(&m->store, name, (int)c, &l));
  if (zero_gamma) layer_store_set_init(&m->store, l->first_param, LAYER_INIT_ZERO);
  sample_shape out = m->shape;
  return place(m, l, &out);
}

/* The layers without parameters whose output has the input's shape. */
static fl_status add_elementwise(fl_model *m, const char *what, fl_status (*create)(layer_store *, layer **)) {
  common_error_clear();
  TRY(check_building(m, what));
  layer *l;
  TRY(create(&m->store, &l));
  sample_shape out = m->shape;
  return place(m, l, &out);
}

fl_status fl_model_relu(fl_model *m) { return add_elementwise(m, "fl_model_relu", layer_relu_create); }
fl_status fl_model_gelu(fl_model *m) { return add_elementwise(m, "fl_model_gelu", layer_gelu_create); }

fl_status fl_model_dropout(fl_model *m, double p) {
  common_error_clear();
  TRY(check_building(m, "fl_model_dropout"));
  layer *l;
  TRY(layer_dropout_create(&m->store, (float)p, m->layer_keys, &l));
  sample_shape out = m->shape;
  return place(m, l, &out);
}

static fl_status add_pool(fl_model *m, bool max, int k, int stride, int pad) {
  common_error_clear();
  const char *what = max ? "maxpool" : "avgpool";
  TRY(check_building(m, what));
  if (k < 1 || stride < 1 || pad < 0 || pad > k / 2)
    return fl_set_error(FL_EINVAL, "%s: kernel %d, stride %d, padding %d (kernel and stride >= 1, 0 <= padding <= "
                        "kernel / 2)", what, k, stride, pad);
  const sample_shape *s = &m->shape;
  char want[64];
  snprintf(want, sizeof want, "[n, C, H, W] with H, W >= %d", k - 2 * pad > 1 ? k - 2 * pad : 1);
  TRY(need_shape(m, s->ndim == 3 && s->dims[1] + 2 * pad >= k && s->dims[2] + 2 * pad >= k, what, want));
  layer *l;
  TRY(max ? layer_maxpool_create(&m->store, k, stride, pad, &l)
                      : layer_avgpool_create(&m->store, k, stride, pad, &l));
  sample_shape out = {3, {s->dims[0], layer_out_size((int)s->dims[1], k, stride, pad),
                          layer_out_size((int)s->dims[2], k, stride, pad)}};
  return place(m, l, &out);
}

fl_status fl_model_maxpool(fl_model *m, int k, int stride, int pad) { return add_pool(m, true, k, stride, pad); }
fl_status fl_model_avgpool(fl_model *m, int k, int stride, int pad) { return add_pool(m, false, k, stride, pad); }

fl_status fl_model_global_avgpool(fl_model *m) {
  common_error_clear();
  TRY(check_building(m, "global_avgpool"));
  TRY(need_shape(m, m->shape.ndim == 3, "global_avgpool", "[n, C, H, W]"));
  layer *l;
  TRY(layer_global_avgpool_create(&m->store, &l));
  sample_shape out = {1, {m->shape.dims[0]}};
  return place(m, l, &out);
}

fl_status fl_model_flatten(fl_model *m) {
  common_error_clear();
  TRY(check_building(m, "flatten"));
  layer *l;
  TRY(layer_flatten_create(&m->store, &l));
  sample_shape out = {1, {shape_numel(&m->shape)}};
  return place(m, l, &out);
}

fl_status fl_model_layernorm(fl_model *m, const char *name) {
  common_error_clear();
  TRY(check_building(m, "fl_model_layernorm"));
  TRY(check_name(name, "fl_model_layernorm"));
  layer *l;
  TRY(layer_layernorm_create(&m->store, name, (int)m->shape.dims[m->shape.ndim - 1], 1e-5f, &l));
  sample_shape out = m->shape;
  return place(m, l, &out);
}

fl_status fl_model_embedding(fl_model *m, const char *name, int vocab, int dim) {
  common_error_clear();
  TRY(check_building(m, "fl_model_embedding"));
  TRY(check_name(name, "fl_model_embedding"));
  TRY(need_shape(m, m->shape.ndim < FL_MODEL_MAX_SAMPLE_DIMS, name, "ids of at most 2 dimensions a sample"));
  layer *l;
  TRY(layer_embedding_create(&m->store, name, vocab, dim, &l));
  sample_shape out = m->shape;
  out.dims[out.ndim++] = dim;
  return place(m, l, &out);
}

fl_status fl_model_attention(fl_model *m, const char *name, int heads) {
  common_error_clear();
  TRY(check_building(m, "fl_model_attention"));
  TRY(check_name(name, "fl_model_attention"));
  TRY(need_shape(m, m->shape.ndim == 2, name, "[n, tokens, hidden]"));
  layer *l;
  TRY(layer_attention_create(&m->store, name, (int)m->shape.dims[1], heads, &l));
  sample_shape out = m->shape;
  return place(m, l, &out);
}

fl_status fl_model_mean_tokens(fl_model *m) {
  common_error_clear();
  TRY(check_building(m, "fl_model_mean_tokens"));
  TRY(need_shape(m, m->shape.ndim == 2, "mean_tokens", "[n, tokens, h]"));
  layer *l;
  TRY(layer_mean_tokens_create(&m->store, &l));
  sample_shape out = {1, {m->shape.dims[1]}};
  return place(m, l, &out);
}

fl_status fl_model_residual_begin(fl_model *m, const char *name) {
  common_error_clear();
  TRY(check_building(m, "fl_model_residual_begin"));
  if (m->nopen == MODEL_MAX_NESTING)
    return fl_set_error(FL_ELIMIT, "fl_model_residual_begin: more than %d residual blocks inside each other",
                        MODEL_MAX_NESTING);
  layer *l;
  TRY(layer_residual_create(&m->store, name_or(name, "residual"), &l));
  m->open[m->nopen++] = (open_block){l, false, m->shape, {0}};
  return FL_OK;
}

fl_status fl_model_residual_shortcut(fl_model *m) {
  common_error_clear();
  TRY(check_building(m, "fl_model_residual_shortcut"));
  open_block *b = m->nopen ? &m->open[m->nopen - 1] : NULL;
  if (!b || b->in_shortcut)
    return fl_set_error(FL_ESTATE, "fl_model_residual_shortcut: %s", b ? "the block's shortcut has begun already"
                                                                        : "no residual block is open");
  b->in_shortcut = true;
  b->main_out = m->shape;
  m->shape = b->input;
  return FL_OK;
}

fl_status fl_model_residual_end(fl_model *m) {
  common_error_clear();
  TRY(check_building(m, "fl_model_residual_end"));
  if (!m->nopen) return fl_set_error(FL_ESTATE, "fl_model_residual_end: no residual block is open");
  open_block b = m->open[m->nopen - 1];
  sample_shape main_out = b.in_shortcut ? b.main_out : m->shape, short_out = b.in_shortcut ? m->shape : b.input;
  if (!shape_equal(&main_out, &short_out)) {
    char a[96], c[96];
    shape_text(&main_out, a, sizeof a);
    shape_text(&short_out, c, sizeof c);
    return fl_set_error(FL_EINVAL, "residual block %s: the main path gives %s but the shortcut %s%s", b.block->name, a,
                        c, b.in_shortcut ? "" : " (the identity: add a shortcut projection)");
  }
  m->nopen--;
  layer_residual_close(b.block);
  m->shape = b.input; /* place() sets the output */
  return place(m, b.block, &main_out);
}

fl_status fl_model_finish(fl_model *m, uint64_t seed) {
  common_error_clear();
  TRY(check_building(m, "fl_model_finish"));
  if (m->nopen) return fl_set_error(FL_ESTATE, "fl_model_finish: residual block %s is not ended", m->open[m->nopen - 1].block->name);
  if (!m->nlayers) return fl_set_error(FL_EINVAL, "fl_model_finish: the model has no layers");
  TRY(layer_store_finish(&m->store, seed));
  m->finished = true;
  return FL_OK;
}

void nn_model_set_init_style(fl_model *m, layer_init_style style) { m->store.init_style = style; }

/* ---- what a model is ------------------------------------------------------------------ */

int fl_model_output_shape(const fl_model *m, int64_t shape[FL_MODEL_MAX_SAMPLE_DIMS]) {
  for (int i = 0; i < m->shape.ndim; i++) shape[i] = m->shape.dims[i];
  return m->shape.ndim;
}

size_t fl_model_num_params(const fl_model *m) { return m->store.nparams; }
const char *fl_model_param_name(const fl_model *m, size_t i) {
  return i < m->store.nparams ? m->store.params[i].name : NULL;
}
size_t fl_model_num_weights(const fl_model *m) { return m->store.nvalues; }
fl_tensor *fl_model_weights(fl_model *m) { return m->finished ? &m->store.values : NULL; }
fl_tensor *fl_model_gradients(fl_model *m) { return m->finished ? &m->store.grads : NULL; }
fl_tensor *fl_model_param(fl_model *m, size_t i) {
  return m->finished && i < m->store.nparams ? &m->store.params[i].value : NULL;
}

size_t nn_model_param_count(const nn_model *m) { return m->store.nparams; }
nn_param *nn_model_param(nn_model *m, size_t i) { return i < m->store.nparams ? &m->store.params[i] : NULL; }
fl_tensor *nn_model_values(nn_model *m) { return &m->store.values; }
fl_tensor *nn_model_grads(nn_model *m) { return &m->store.grads; }
fl_tensor *nn_model_buffers(nn_model *m) { return &m->store.buffers; }

/* ---- running it ------------------------------------------------------------------------ */

fl_status nn_model_forward(nn_model *m, const fl_tensor *x, bool train, const fl_tensor **y) {
  if (!m || !x || !y) return fl_set_error(FL_EINVAL, "fl_model_forward: NULL argument");
  if (!m->finished) return fl_set_error(FL_ESTATE, "fl_model_forward: the model is not finished (fl_model_finish)");
  bool ok = x->ndim == m->input.ndim + 1 && x->shape[0] >= 1;
  for (int i = 0; ok && i < m->input.ndim; i++) ok = x->shape[i + 1] == m->input.dims[i];
  if (!ok) {
    char got[96], want[96];
    layer_shape_text(x, got, sizeof got);
    shape_text(&m->input, want, sizeof want);
    return fl_set_error(FL_EINVAL, "fl_model_forward: input %s, expected %s", got, want);
  }
  if (x->dev != m->dev)
    return fl_set_error(FL_EINVAL, "fl_model_forward: input on device %s, model on %s", fl_device_name(x->dev),
                        m->dev->name);
  m->y = NULL;
  m->have_loss = false;
  const fl_tensor *t = x;
  for (size_t i = 0; i < m->nlayers; i++) {
    fl_status st = layer_forward(m->layers[i], t, train, &t);
    if (st != FL_OK) return st;
  }
  m->y = t;
  *y = t;
  return FL_OK;
}

fl_status fl_model_forward(fl_model *m, const fl_tensor *x, bool train, const fl_tensor **y) {
  common_error_clear();
  return nn_model_forward(m, x, train, y);
}

fl_status nn_model_loss_smoothed(nn_model *m, const int32_t *labels, float smoothing, float grad_scale, float *stats) {
  if (!m || !labels || !stats) return fl_set_error(FL_EINVAL, "nn_model_loss: NULL argument");
  if (!m->y) return fl_set_error(FL_ESTATE, "the loss: no forward to take the loss of");
  if (m->y->ndim != 2)
    return fl_set_error(FL_EINVAL, "cross-entropy: the model's output has %d dimensions, expected [n, classes]",
                        m->y->ndim);
  fl_status st = tensor_ensure(&m->dy, m->dev, m->y->ndim, m->y->shape);
  if (st != FL_OK) return st;
  st = m->dev->ops->softmax_xent(m->dev, (int)m->y->shape[0], (int)m->y->shape[1], m->y->data, labels, smoothing,
                                 grad_scale * m->loss_scale, m->dy.data, stats);
  if (st != FL_OK) return st;
  m->have_loss = true;
  return FL_OK;
}

fl_status nn_model_loss(nn_model *m, const int32_t *labels, float grad_scale, float *stats) {
  return nn_model_loss_smoothed(m, labels, 0.0f, grad_scale, stats);
}

fl_status fl_model_cross_entropy(fl_model *m, const int32_t *labels, size_t n, double label_smoothing, double *loss,
                                 uint64_t *correct) {
  common_error_clear();
  if (!m || !labels) return fl_set_error(FL_EINVAL, "fl_model_cross_entropy: NULL argument");
  if (!m->y) return fl_set_error(FL_ESTATE, "fl_model_cross_entropy: no forward to take the loss of");
  if (n != (size_t)m->y->shape[0])
    return fl_set_error(FL_EINVAL, "fl_model_cross_entropy: %zu labels for a batch of %lld", n, (long long)m->y->shape[0]);
  if (!(label_smoothing >= 0.0 && label_smoothing < 1.0))
    return fl_set_error(FL_EINVAL, "fl_model_cross_entropy: label smoothing %g must be in [0, 1)", label_smoothing);
  int64_t classes = m->y->ndim == 2 ? m->y->shape[1] : 0;
  for (size_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= classes)
      return fl_set_error(FL_EINVAL, "fl_model_cross_entropy: label %d of sample %zu is outside [0, %lld)",
                          (int)labels[i], i, (long long)classes);
  fl_device *dev = m->dev;
  fl_status status = FL_OK;
  if (m->labels_cap < n) {
    if (m->labels_d) dev->ops->free(dev, m->labels_d);
    m->labels_d = NULL;
    m->labels_cap = 0;
    FL_CHECK(dev->ops->alloc(dev, n * sizeof(int32_t), (void **)&m->labels_d));
    m->labels_cap = n;
  }
  if (!m->stats_d) FL_CHECK(dev->ops->alloc(dev, 2 * sizeof(float), (void **)&m->stats_d));
  FL_CHECK(dev->ops->from_host(dev, m->labels_d, labels, n * sizeof(int32_t)));
  FL_CHECK(dev->ops->memset0(dev, m->stats_d, 2 * sizeof(float)));
  FL_CHECK(nn_model_loss_smoothed(m, m->labels_d, (float)label_smoothing, 1.0f / (float)n, m->stats_d));
  float stats[2];
  FL_CHECK(dev->ops->to_host(dev, stats, m->stats_d, sizeof stats));
  if (loss) *loss = (double)stats[0] / (double)n;
  if (correct) *correct = (uint64_t)stats[1];
cleanup:
  return status;
}

fl_status fl_model_mse(fl_model *m, const fl_tensor *target, double *loss) {
  common_error_clear();
  if (!m || !target) return fl_set_error(FL_EINVAL, "fl_model_mse: NULL argument");
  if (!m->y) return fl_set_error(FL_ESTATE, "fl_model_mse: no forward to take the loss of");
  if (target->numel != m->y->numel || target->dev != m->dev) {
    char got[96], want[96];
    layer_shape_text(target, got, sizeof got);
    layer_shape_text(m->y, want, sizeof want);
    return fl_set_error(FL_EINVAL, "fl_model_mse: target %s%s, the output is %s", got,
                        target->dev != m->dev ? " on another device" : "", want);
  }
  fl_device *dev = m->dev;
  size_t n = m->y->numel;
  fl_status st = tensor_ensure(&m->dy, dev, m->y->ndim, m->y->shape);
  /* dy = 2 (y - t) / numel, the gradient of mean((y - t)^2). */
  if (st == FL_OK) st = dev->ops->copy(dev, m->dy.data, m->y->data, n * sizeof(float));
  if (st == FL_OK) st = dev->ops->axpy(dev, n, -1.0f, target->data, m->dy.data);
  double sum = 0;
  if (st == FL_OK) st = dev->ops->sum_squares(dev, n, m->dy.data, &sum);
  if (st == FL_OK) st = dev->ops->scale(dev, n, 2.0f * m->loss_scale / (float)n, m->dy.data);
  if (st != FL_OK) return st;
  if (loss) *loss = sum / (double)n;
  m->have_loss = true;
  return FL_OK;
}

fl_status nn_model_backward(nn_model *m, nn_grads_ready_fn ready, void *user) {
  if (!m) return fl_set_error(FL_EINVAL, "fl_model_backward: the model is NULL");
  if (!m->have_loss)
    return fl_set_error(FL_ESTATE, "fl_model_backward: no loss since the last forward (take a loss first)");
  /* Layers before the first one with parameters (a flatten) need no backward at all, and
   * the first one with parameters needs no input gradient. */
  size_t first = 0;
  while (first < m->nlayers && m->layers[first]->nparams == 0) first++;
  const fl_tensor *dy = &m->dy;
  for (size_t i = m->nlayers; i-- > first;) {
    layer *l = m->layers[i];
    fl_status st = layer_backward(l, dy, i > first, &dy);
    if (st != FL_OK) return st;
    if (ready && l->nparams) {
      st = ready(l->first_param, l->nparams, user);
      if (st != FL_OK) return st;
    }
  }
  return FL_OK;
}

fl_status nn_model_backward_from(nn_model *m, const fl_tensor *dy, nn_grads_ready_fn ready, void *user) {
  if (!m || !dy) return fl_set_error(FL_EINVAL, "nn_model_backward_from: NULL argument");
  if (!m->y) return fl_set_error(FL_ESTATE, "nn_model_backward_from: no forward to take the gradient of");
  bool same = dy->ndim == m->y->ndim;
  for (int i = 0; same && i < dy->ndim; i++) same = dy->shape[i] == m->y->shape[i];
  if (!same) {
    char got[96], want[96];
    layer_shape_text(dy, got, sizeof got);
    layer_shape_text(m->y, want, sizeof want);
    return fl_set_error(FL_EINVAL, "nn_model_backward_from: gradient %s, the output is %s", got, want);
  }
  fl_status st = tensor_ensure(&m->dy, m->dev, m->y->ndim, m->y->shape);
  if (st == FL_OK) st = m->dev->ops->copy(m->dev, m->dy.data, dy->data, dy->numel * sizeof(float));
  if (st != FL_OK) return st;
  m->have_loss = true;
  return nn_model_backward(m, ready, user);
}

fl_status fl_model_backward(fl_model *m) {
  common_error_clear();
  return nn_model_backward(m, NULL, NULL);
}

fl_status nn_model_zero_grad(nn_model *m) {
  if (!m) return fl_set_error(FL_EINVAL, "fl_model_zero_grad: the model is NULL");
  if (!m->store.nvalues) return FL_OK;
  return m->dev->ops->memset0(m->dev, m->store.grads.data, m->store.nvalues * sizeof(float));
}

fl_status fl_model_zero_grad(fl_model *m) {
  common_error_clear();
  return nn_model_zero_grad(m);
}

void fl_model_set_step(fl_model *m, uint64_t step) { m->store.step = step; }

void nn_model_set_loss_scale(nn_model *m, float scale) { m->loss_scale = scale; }
