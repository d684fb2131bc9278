/*
 * gpu/parallel/hybrid_cnn.c: the "one weird trick" trainer of gpu/parallel/hybrid_cnn.h.
 *
 * Design: the conv stack is an nn_model (gpu/nn) of its own, run on the rank's b examples;
 * its backward starts from the reduce-scattered feature gradient (nn_model_backward_from).
 * The FC layers are hand-written GEMMs over a layer_store of this rank's slices, because
 * their input is the whole batch and arrives in K feature blocks. Both parts get their keyed
 * weights after their stores are laid out. One code path serves both modes: in data-parallel
 * mode the FC layers are split in P = 1 part over R = b rows, and the collectives between
 * them vanish; in trick mode P = K and R = K b.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/comm/comm.h"
#include "gpu/parallel/keyed.h"
#include "gpu/parallel/hybrid_cnn.h"

/* ---- the spec ---------------------------------------------------------------------------- */

fl_status hcnn_mode_parse(const char *text, hcnn_mode *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "hcnn_mode_parse: NULL argument");
  if (strcmp(text, "trick") == 0) *out = HCNN_TRICK;
  else if (strcmp(text, "dp") == 0) *out = HCNN_DATA_PARALLEL;
  else return fl_set_error(FL_EINVAL, "unknown hybrid CNN mode '%s' (expected trick or dp)", text);
  return FL_OK;
}

const char *hcnn_mode_name(hcnn_mode mode) { return mode == HCNN_TRICK ? "trick" : "dp"; }

/* The image side after the conv blocks' poolings (each 2x2, stride 2, floor). */
static int pooled(int side, int nconv) {
  for (int i = 0; i < nconv; i++) side /= 2;
  return side;
}

int64_t hcnn_features(const hcnn_spec *sp) {
  int c = sp->nconv ? sp->conv[sp->nconv - 1] : sp->channels;
  return (int64_t)c * pooled(sp->height, sp->nconv) * pooled(sp->width, sp->nconv);
}

int64_t hcnn_weights(const hcnn_spec *sp) {
  int64_t n = 0, in_c = sp->channels, in = hcnn_features(sp);
  for (int i = 0; i < sp->nconv; i++) {
    n += (int64_t)sp->conv[i] * in_c * 9 + sp->conv[i];
    in_c = sp->conv[i];
  }
  for (int i = 0; i < sp->nfc; i++) {
    n += (int64_t)sp->fc[i] * in + sp->fc[i];
    in = sp->fc[i];
  }
  return n + (int64_t)sp->classes * in + sp->classes;
}

fl_status hcnn_spec_check(const hcnn_spec *sp, hcnn_mode mode, int ranks) {
  if (!sp) return fl_set_error(FL_EINVAL, "hybrid CNN spec: NULL");
  if (mode != HCNN_TRICK && mode != HCNN_DATA_PARALLEL)
    return fl_set_error(FL_EINVAL, "hybrid CNN: mode %d is neither trick nor dp", (int)mode);
  if (ranks < 1) return fl_set_error(FL_EINVAL, "hybrid CNN: %d ranks, must be at least 1", ranks);
  if (sp->channels < 1 || sp->height < 1 || sp->width < 1)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: image %dx%dx%d, every side must be at least 1",
                        sp->channels, sp->height, sp->width);
  if (sp->nconv < 1 || sp->nconv > HCNN_MAX_CONV)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: nconv is %d, must be 1 to %d", sp->nconv,
                        HCNN_MAX_CONV);
  if (sp->nfc < 1 || sp->nfc > HCNN_MAX_FC)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: nfc is %d, must be 1 to %d", sp->nfc, HCNN_MAX_FC);
  for (int i = 0; i < sp->nconv; i++)
    if (sp->conv[i] < 1)
      return fl_set_error(FL_EINVAL, "hybrid CNN spec: conv[%d] is %d channels, must be at least 1", i,
                          sp->conv[i]);
  if (pooled(sp->height, sp->nconv) < 1 || pooled(sp->width, sp->nconv) < 1)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: a %dx%d image is too small for %d 2x2 poolings",
                        sp->height, sp->width, sp->nconv);
  if (sp->classes < 1)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: classes is %d, must be at least 1", sp->classes);
  for (int i = 0; i < sp->nfc; i++) {
    if (sp->fc[i] < 1)
      return fl_set_error(FL_EINVAL, "hybrid CNN spec: fc[%d] is %d units, must be at least 1", i, sp->fc[i]);
    if (mode == HCNN_TRICK && sp->fc[i] % ranks)
      return fl_set_error(FL_EINVAL, "hybrid CNN spec: fc[%d] has %d units, which %d ranks do not divide "
                          "(each rank holds an equal share of every FC layer)", i, sp->fc[i], ranks);
  }
  /* GEMM dimensions are ints. */
  if (hcnn_features(sp) > INT32_MAX / 4 || hcnn_weights(sp) > INT32_MAX)
    return fl_set_error(FL_EINVAL, "hybrid CNN spec: the model is too large (%lld weights)",
                        (long long)hcnn_weights(sp));
  return FL_OK;
}

/* ---- bytes ------------------------------------------------------------------------------- */

/* A rank's verdict on its own b labels, sent to the others before any rank may fail: a bad
 * flag (1, or -1: none), its first bad example and that label, each in two 16-bit halves
 * (exact in a float, whatever the int32). */
#define LABEL_CHECK 5

static uint64_t ring_allgather(int k, uint64_t per_rank) { return (uint64_t)(k - 1) * per_rank * 4; }
static uint64_t ring_reduce_scatter(int k, uint64_t total) { return (uint64_t)(k - 1) * total / (uint64_t)k * 4; }
static uint64_t ring_allreduce(int k, uint64_t total) { return 2 * (uint64_t)(k - 1) * total / (uint64_t)k * 4; }

static uint64_t conv_weights(const hcnn_spec *sp) {
  uint64_t n = 0;
  int in_c = sp->channels;
  for (int i = 0; i < sp->nconv; i++) {
    n += (uint64_t)sp->conv[i] * (uint64_t)in_c * 9 + (uint64_t)sp->conv[i];
    in_c = sp->conv[i];
  }
  return n;
}

hcnn_bytes hcnn_predict_bytes(const hcnn_spec *sp, hcnn_mode mode, int k, int b) {
  hcnn_bytes out = {0, 0};
  if (k < 2) return out;
  if (mode == HCNN_DATA_PARALLEL) {
    out.activations = ring_allgather(k, LABEL_CHECK) /* the labels' check */
                      + ring_allreduce(k, 2);          /* the loss statistics */
    out.gradients = ring_allreduce(k, (uint64_t)hcnn_weights(sp));
    return out;
  }
  uint64_t rows = (uint64_t)k * (uint64_t)b, f = (uint64_t)hcnn_features(sp);
  out.activations = ring_allgather(k, (uint64_t)b + LABEL_CHECK) /* labels and their check */
                    + ring_allgather(k, (uint64_t)b * f) + ring_reduce_scatter(k, rows * f);
  for (int i = 0; i + 1 < sp->nfc; i++) {
    uint64_t local = rows * (uint64_t)(sp->fc[i] / k);
    out.activations += ring_allgather(k, local) + ring_reduce_scatter(k, local * (uint64_t)k);
  }
  out.activations += ring_allreduce(k, rows * (uint64_t)sp->classes);
  out.gradients = ring_allreduce(k, conv_weights(sp));
  return out;
}

/* ---- keyed weights ----------------------------------------------------------------------- */

/* Writes p's keyed values (gpu/parallel/keyed.h, so any slice of a tensor is drawn alike on
 * any rank): element (i, j) of the slice is element (row0 + i, col0 + j) of the unsplit
 * [rows, cols] tensor, uniform in +-1 / sqrt(fan_in). */
static fl_status fill_keyed(fl_device *dev, uint64_t seed, const nn_param *p, hcnn_param_place pl, int64_t fan_in) {
  size_t n = p->value.numel;
  if (!n) return FL_OK;
  float *host = common_malloc(n * sizeof *host);
  if (!host) return FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory for %zu weights of %s", n, p->name);
  int64_t cols = (int64_t)n / (p->value.ndim == 1 ? 1 : p->value.shape[0]); /* the slice's */
  double bound = 1.0 / sqrt((double)fan_in);
  uint64_t key = seed ^ keyed_name_hash(p->name);
  for (size_t e = 0; e < n; e++) {
    int64_t r = (int64_t)e / cols, j = (int64_t)e % cols;
    uint64_t g = (uint64_t)((pl.row0 + r) * pl.cols + pl.col0 + j);
    host[e] = (float)(bound * keyed_symmetric(key, g));
  }
  fl_status st = dev->ops->from_host(dev, p->value.data, host, n * sizeof *host);
  common_free(host);
  return st;
}

/* ---- the trainer ------------------------------------------------------------------------- */

struct hcnn {
  fl_device *dev;
  fl_comm *comm; /* NULL for one rank */
  int rank, ranks;
  hcnn_spec spec;
  hcnn_mode mode;
  int parts; /* P: the FC layers' split (K in trick mode, 1 in dp) */
  int64_t features;
  nn_model *conv;
  layer_store fc; /* per hidden layer weight, bias; then the classifier's */
  hcnn_param_place *places; /* of every parameter, conv's first */
  int64_t *fan_in;
  optim *conv_opt, *fc_opt;
  /* Activations of the step (R rows: K b in trick mode, b in dp). */
  fl_tensor feat_all;            /* [R, F] (trick with K > 1) */
  fl_tensor act[HCNN_MAX_FC];    /* [R, fc_i / P]: this rank's units after relu */
  fl_tensor gathered[HCNN_MAX_FC]; /* P blocks [R, fc_i / P] (trick with K > 1, not the last) */
  fl_tensor logits, dlogits;     /* [R, classes] */
  fl_tensor d_act, d_part, d_in; /* gradients between layers */
  fl_tensor labels_f, labels_all_f; /* the labels as floats, for the all-gather */
  fl_tensor stats_t;             /* loss sum and correct count, for dp's allreduce */
  int32_t *labels_host;
  int32_t *labels_dev;
  size_t labels_cap;
  float *stats_dev;
  fl_tensor x;                   /* the rank's images on the device */
  hcnn_bytes bytes;
};

size_t hcnn_param_count(const hcnn *h) { return nn_model_param_count(h->conv) + h->fc.nparams; }

nn_param *hcnn_param(hcnn *h, size_t i) {
  size_t nc = nn_model_param_count(h->conv);
  return i < nc ? nn_model_param(h->conv, i) : i - nc < h->fc.nparams ? &h->fc.params[i - nc] : NULL;
}

hcnn_param_place hcnn_param_place_of(const hcnn *h, size_t i) {
  return i < hcnn_param_count(h) ? h->places[i] : (hcnn_param_place){0, 0, 0, 0, false};
}

static fl_status build_conv(hcnn *h) {
  const hcnn_spec *sp = &h->spec;
  int64_t shape[3] = {sp->channels, sp->height, sp->width};
  fl_status status = FL_OK;
  char name[32];
  FL_CHECK(fl_model_create(h->dev, 3, shape, &h->conv));
  for (int i = 0; i < sp->nconv; i++) {
    const fl_conv2d_options o = {.out_channels = sp->conv[i], .kernel = 3, .padding = 1, .bias = true};
    snprintf(name, sizeof name, "conv%d", i + 1);
    FL_CHECK(fl_model_conv2d(h->conv, name, &o));
    FL_CHECK(fl_model_relu(h->conv));
    FL_CHECK(fl_model_maxpool(h->conv, 2, 2, 0));
  }
  FL_CHECK(fl_model_flatten(h->conv));
  FL_CHECK(fl_model_finish(h->conv, sp->seed));
cleanup:
  return status;
}

/* Registers the FC slices of this rank; places[] from index `first`. */
static fl_status build_fc(hcnn *h, size_t first) {
  const hcnn_spec *sp = &h->spec;
  int P = h->parts, r = h->mode == HCNN_TRICK ? h->rank : 0;
  int64_t in = h->features;
  char prefix[32];
  size_t idx;
  fl_status status = FL_OK;
  layer_store_init(&h->fc, h->dev);
  for (int i = 0; i <= sp->nfc; i++) {
    bool classifier = i == sp->nfc;
    int64_t out = classifier ? sp->classes : sp->fc[i];
    if (classifier) snprintf(prefix, sizeof prefix, "classifier");
    else snprintf(prefix, sizeof prefix, "fc%d", i + 1);
    /* Hidden layers: rows [r out / P, ...) (column parallel); the classifier: columns
     * [r in / P, ...) (row parallel) and the whole bias. */
    int64_t wshape[2] = {classifier ? out : out / P, classifier ? in / P : in};
    int64_t bshape[1] = {classifier ? out : out / P};
    FL_CHECK(layer_store_add_param(&h->fc, prefix, "weight", 2, wshape, LAYER_INIT_ZERO, 0, &idx));
    h->places[first + idx] = (hcnn_param_place){out, in, classifier ? 0 : r * wshape[0],
                                                classifier ? r * wshape[1] : 0, P == 1};
    h->fan_in[first + idx] = in;
    FL_CHECK(layer_store_add_param(&h->fc, prefix, "bias", 1, bshape, LAYER_INIT_ZERO, 0, &idx));
    h->places[first + idx] = (hcnn_param_place){1, out, 0, classifier ? 0 : r * bshape[0], P == 1 || classifier};
    h->fan_in[first + idx] = in;
    in = out;
  }
  FL_CHECK(layer_store_finish(&h->fc, sp->seed));
cleanup:
  return status;
}

static fl_status make_optimizers(hcnn *h, const optim_options *opts) {
  fl_status status = FL_OK;
  optim_param *ps = common_calloc(h->fc.nparams, sizeof *ps);
  if (!ps) return FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory");
  FL_CHECK(optim_create_for_model(h->dev, opts, h->conv, &h->conv_opt));
  for (size_t i = 0; i < h->fc.nparams; i++) ps[i] = optim_param_of(&h->fc.params[i], opts);
  FL_CHECK(optim_create(h->dev, opts, h->fc.nvalues, ps, h->fc.nparams, &h->fc_opt));
cleanup:
  common_free(ps);
  return status;
}

fl_status hcnn_create(fl_device *dev, fl_comm *comm, const hcnn_spec *spec, hcnn_mode mode,
                      const optim_options *opt, hcnn **out) {
  if (!dev || !spec || !out) return fl_set_error(FL_EINVAL, "hcnn_create: NULL argument");
  int ranks = comm ? fl_comm_size(comm) : 1;
  fl_status status = hcnn_spec_check(spec, mode, ranks);
  if (status != FL_OK) return status;
  optim_options defaults = OPTIM_OPTIONS_INIT;
  defaults.weight_decay = 0.0f;
  if (!opt) opt = &defaults;
  status = optim_options_validate(opt);
  if (status != FL_OK) return status;
  hcnn *h = common_calloc(1, sizeof *h);
  if (!h) return FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory");
  h->dev = dev;
  h->comm = ranks > 1 ? comm : NULL;
  h->rank = comm ? fl_comm_rank(comm) : 0;
  h->ranks = ranks;
  h->spec = *spec;
  h->mode = mode;
  h->parts = mode == HCNN_TRICK ? ranks : 1;
  h->features = hcnn_features(spec);
  size_t most = 2 * (size_t)(spec->nconv + spec->nfc + 1);
  h->places = common_calloc(most, sizeof *h->places);
  h->fan_in = common_calloc(most, sizeof *h->fan_in);
  if (!h->places || !h->fan_in) FL_CHECK(FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory"));
  FL_CHECK(build_conv(h));
  size_t nc = nn_model_param_count(h->conv);
  for (size_t i = 0; i < nc; i++) {
    const nn_param *p = nn_model_param(h->conv, i);
    int64_t rows = p->value.ndim == 1 ? 1 : p->value.shape[0];
    int64_t cols = (int64_t)p->value.numel / rows;
    h->places[i] = (hcnn_param_place){rows, cols, 0, 0, true};
    /* A conv bias reads the same inputs as its kernel: in_c x 3 x 3. */
    const nn_param *w = p->value.ndim == 1 ? nn_model_param(h->conv, i - 1) : p;
    h->fan_in[i] = (int64_t)w->value.numel / w->value.shape[0];
  }
  FL_CHECK(build_fc(h, nc));
  for (size_t i = 0; i < hcnn_param_count(h); i++)
    FL_CHECK(fill_keyed(dev, spec->seed, hcnn_param(h, i), h->places[i], h->fan_in[i]));
  FL_CHECK(nn_model_zero_grad(h->conv));
  FL_CHECK(dev->ops->memset0(dev, h->fc.grads.data, h->fc.nvalues * sizeof(float)));
  FL_CHECK(make_optimizers(h, opt));
  FL_CHECK(dev->ops->alloc(dev, 2 * sizeof(float), (void **)&h->stats_dev));
  *out = h;
  return FL_OK;
cleanup:
  hcnn_destroy(h);
  return status;
}

void hcnn_destroy(hcnn *h) {
  if (!h) return;
  fl_device *dev = h->dev;
  optim_destroy(h->conv_opt);
  optim_destroy(h->fc_opt);
  nn_model_destroy(h->conv);
  layer_store_release(&h->fc);
  fl_tensor *ts[] = {&h->feat_all, &h->logits, &h->dlogits, &h->d_act, &h->d_part, &h->d_in,
                     &h->labels_f, &h->labels_all_f, &h->stats_t, &h->x};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) tensor_release(ts[i]);
  for (int i = 0; i < HCNN_MAX_FC; i++) {
    tensor_release(&h->act[i]);
    tensor_release(&h->gathered[i]);
  }
  if (h->labels_dev) dev->ops->free(dev, h->labels_dev);
  if (h->stats_dev) dev->ops->free(dev, h->stats_dev);
  common_free(h->labels_host);
  common_free(h->places);
  common_free(h->fan_in);
  common_free(h);
}

/* ---- collectives, counted ---------------------------------------------------------------- */

static fl_status gather(hcnn *h, const fl_tensor *in, fl_tensor *out, uint64_t *bytes) {
  *bytes += ring_allgather(h->ranks, in->numel);
  return fl_comm_allgather(h->comm, in, out);
}

static fl_status scatter_sum(hcnn *h, const fl_tensor *in, fl_tensor *out, uint64_t *bytes) {
  *bytes += ring_reduce_scatter(h->ranks, in->numel);
  return fl_comm_reduce_scatter(h->comm, in, out, FL_REDUCE_SUM);
}

static fl_status allreduce_sum(hcnn *h, fl_tensor *t, uint64_t *bytes) {
  *bytes += ring_allreduce(h->ranks, t->numel);
  return fl_comm_allreduce(h->comm, t, FL_REDUCE_SUM);
}

/* ---- one step ---------------------------------------------------------------------------- */

static float *fc_value(hcnn *h, int layer, int which) { return h->fc.params[2 * layer + which].value.data; }
static float *fc_grad(hcnn *h, int layer, int which) { return h->fc.params[2 * layer + which].grad.data; }

static void label_check_fill(const int32_t *labels, int b, int classes, float out[LABEL_CHECK]) {
  out[0] = -1;
  out[1] = out[2] = out[3] = out[4] = 0;
  for (int i = 0; i < b; i++)
    if (labels[i] < 0 || labels[i] >= classes) {
      uint32_t u = (uint32_t)labels[i];
      out[0] = 1;
      out[1] = (float)((uint32_t)i >> 16);
      out[2] = (float)((uint32_t)i & 0xffffu);
      out[3] = (float)(u >> 16);
      out[4] = (float)(u & 0xffffu);
      return;
    }
}

/* FL_EINVAL naming the first bad label of the lowest rank with one, when any has one: the
 * same verdict on every rank. checks: rank r's LABEL_CHECK floats at r stride. */
static fl_status label_check_read(const float *checks, size_t stride, int ranks, int b, int classes) {
  for (int r = 0; r < ranks; r++) {
    const float *c = checks + (size_t)r * stride;
    if (c[0] < 0) continue;
    int i = (int)(((uint32_t)c[1] << 16) | (uint32_t)c[2]);
    int32_t label = (int32_t)(((uint32_t)c[3] << 16) | (uint32_t)c[4]);
    return fl_set_error(FL_EINVAL, "hybrid CNN: label %d of example %lld (rank %d's %d) is outside [0, %d)",
                        (int)label, (long long)r * b + i, r, i, classes);
  }
  return FL_OK;
}

/* The labels of the step's R rows on the device, checked. With K > 1 ranks every rank's
 * verdict on its own labels is all-gathered first (in trick mode together with the labels
 * themselves, as floats: class indices are exact in them), so that a bad label anywhere
 * fails every rank alike, at once, and none waits in a later collective. */
static fl_status load_labels(hcnn *h, const int32_t *labels, int b, int rows) {
  fl_device *dev = h->dev;
  fl_status status = FL_OK;
  int K = h->ranks, C = h->spec.classes;
  if (h->labels_cap < (size_t)rows) {
    if (h->labels_dev) dev->ops->free(dev, h->labels_dev);
    h->labels_dev = NULL;
    common_free(h->labels_host);
    h->labels_host = common_malloc((size_t)rows * sizeof *h->labels_host);
    h->labels_cap = 0;
    if (!h->labels_host) return FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory for %d labels", rows);
    FL_CHECK(dev->ops->alloc(dev, (size_t)rows * sizeof(int32_t), (void **)&h->labels_dev));
    h->labels_cap = (size_t)rows;
  }
  if (K == 1) {
    float check[LABEL_CHECK];
    label_check_fill(labels, b, C, check);
    FL_CHECK(label_check_read(check, LABEL_CHECK, 1, b, C));
  } else {
    /* Each rank's record: (trick mode) its b labels, a bad one sent as 0; then its check. */
    int lab = rows == b ? 0 : b, width = lab + LABEL_CHECK;
    int64_t ls[1] = {width}, as[1] = {(int64_t)K * width};
    float *host = common_malloc((size_t)K * width * sizeof *host);
    if (!host) return FL_ERR(FL_ENOMEM, "hybrid CNN: out of memory for %d labels", rows);
    for (int i = 0; i < lab; i++) host[i] = labels[i] >= 0 && labels[i] < C ? (float)labels[i] : 0;
    label_check_fill(labels, b, C, host + lab);
    status = tensor_ensure(&h->labels_f, dev, 1, ls);
    if (status == FL_OK) status = tensor_ensure(&h->labels_all_f, dev, 1, as);
    if (status == FL_OK) status = dev->ops->from_host(dev, h->labels_f.data, host, (size_t)width * sizeof *host);
    if (status == FL_OK) status = gather(h, &h->labels_f, &h->labels_all_f, &h->bytes.activations);
    if (status == FL_OK)
      status = dev->ops->to_host(dev, host, h->labels_all_f.data, (size_t)K * width * sizeof *host);
    if (status == FL_OK) status = label_check_read(host + lab, (size_t)width, K, b, C);
    for (int r = 0; status == FL_OK && r < K && lab; r++)
      for (int i = 0; i < b; i++) h->labels_host[r * b + i] = (int32_t)host[(size_t)r * width + i];
    common_free(host);
    if (status != FL_OK) return status;
  }
  if (rows == b) memcpy(h->labels_host, labels, (size_t)b * sizeof *labels);
  FL_CHECK(dev->ops->from_host(dev, h->labels_dev, h->labels_host, (size_t)rows * sizeof(int32_t)));
cleanup:
  return status;
}

/* y [R, out] (beta 0) = the blocked input times w^T, block k of `in` being [R, width] at
 * k R width and reading columns [k width, (k + 1) width) of w [out, nblocks width]. */
static fl_status blocked_forward(fl_device *dev, int rows, int nblocks, int width, const float *in,
                                 int out, const float *w, float *y) {
  int ld = nblocks * width;
  for (int k = 0; k < nblocks; k++) {
    fl_status st = dev->ops->gemm(dev, false, true, rows, out, width, 1.0f, in + (size_t)k * rows * width,
                                  width, w + (size_t)k * width, ld, k ? 1.0f : 0.0f, y, out);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

/* The backward of blocked_forward from dy [R, out]: dw += dy^T in (block by block), and,
 * when din is not NULL, din (blocked as in) = dy w. */
static fl_status blocked_backward(fl_device *dev, int rows, int nblocks, int width, const float *in,
                                  int out, const float *w, const float *dy, float *dw, float *din) {
  int ld = nblocks * width;
  for (int k = 0; k < nblocks; k++) {
    fl_status st = dev->ops->gemm(dev, true, false, out, width, rows, 1.0f, dy, out,
                                  in + (size_t)k * rows * width, width, 1.0f, dw + (size_t)k * width, ld);
    if (st == FL_OK && din)
      st = dev->ops->gemm(dev, false, false, rows, width, out, 1.0f, dy, out, w + (size_t)k * width, ld, 0.0f,
                          din + (size_t)k * rows * width, width);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

/* The step's forward to the loss: the global batch's loss sum and correct count in st2 (every
 * rank's the same), the logits' gradient in h->dlogits; *feat_out: the FC layers' input. */
static fl_status step_forward(hcnn *h, const float *x, const int32_t *labels, int b, float st2[2],
                              const fl_tensor **feat_out) {
  if (!h || !x || !labels) return fl_set_error(FL_EINVAL, "hybrid CNN: NULL argument");
  if (b < 1) return fl_set_error(FL_EINVAL, "hybrid CNN: a batch of %d examples per rank, must be at least 1", b);
  const hcnn_spec *sp = &h->spec;
  fl_device *dev = h->dev;
  int K = h->ranks, P = h->parts, nfc = sp->nfc, C = sp->classes;
  bool split = P > 1;
  if ((int64_t)b * K * h->features > INT32_MAX / 2 || (int64_t)b * K * sp->channels * sp->height * sp->width > INT32_MAX / 2)
    return fl_set_error(FL_EINVAL, "hybrid CNN: a batch of %d examples per rank is too large for this model", b);
  int R = split ? b * K : b, F = (int)h->features;
  fl_status status = FL_OK;
  h->bytes = (hcnn_bytes){0, 0};
  FL_CHECK(load_labels(h, labels, b, R));

  /* Convolutions on the rank's own examples, then the switch: every rank gets all features. */
  int64_t xshape[4] = {b, sp->channels, sp->height, sp->width};
  FL_CHECK(tensor_ensure(&h->x, dev, 4, xshape));
  FL_CHECK(dev->ops->from_host(dev, h->x.data, x, h->x.numel * sizeof(float)));
  const fl_tensor *feat;
  FL_CHECK(nn_model_forward(h->conv, &h->x, true, &feat));
  if (split) {
    int64_t fshape[2] = {R, F};
    FL_CHECK(tensor_ensure(&h->feat_all, dev, 2, fshape));
    FL_CHECK(gather(h, feat, &h->feat_all, &h->bytes.activations));
    feat = &h->feat_all;
  }

  /* Hidden layers: this rank's units for all R rows; all-gathered for the next layer. */
  const float *in = feat->data;
  int nblocks = 1, width = F;
  for (int i = 0; i < nfc; i++) {
    int out = sp->fc[i] / P;
    int64_t ashape[2] = {R, out};
    FL_CHECK(tensor_ensure(&h->act[i], dev, 2, ashape));
    FL_CHECK(blocked_forward(dev, R, nblocks, width, in, out, fc_value(h, i, 0), h->act[i].data));
    FL_CHECK(dev->ops->bias_add_rows(dev, R, out, fc_value(h, i, 1), h->act[i].data));
    FL_CHECK(dev->ops->relu_forward(dev, h->act[i].numel, h->act[i].data, h->act[i].data));
    in = h->act[i].data;
    nblocks = 1;
    width = out;
    if (split && i + 1 < nfc) {
      int64_t gshape[2] = {R, sp->fc[i]};
      FL_CHECK(tensor_ensure(&h->gathered[i], dev, 2, gshape));
      FL_CHECK(gather(h, &h->act[i], &h->gathered[i], &h->bytes.activations));
      in = h->gathered[i].data;
      nblocks = P;
    }
  }

  /* The classifier: partial logits from this rank's units, summed; the loss of the batch. */
  int last = sp->fc[nfc - 1] / P;
  int64_t lshape[2] = {R, C};
  FL_CHECK(tensor_ensure(&h->logits, dev, 2, lshape));
  FL_CHECK(tensor_ensure(&h->dlogits, dev, 2, lshape));
  FL_CHECK(dev->ops->gemm(dev, false, true, R, C, last, 1.0f, h->act[nfc - 1].data, last, fc_value(h, nfc, 0),
                          last, 0.0f, h->logits.data, C));
  if (split) FL_CHECK(allreduce_sum(h, &h->logits, &h->bytes.activations));
  FL_CHECK(dev->ops->bias_add_rows(dev, R, C, fc_value(h, nfc, 1), h->logits.data));
  FL_CHECK(dev->ops->memset0(dev, h->stats_dev, 2 * sizeof(float)));
  FL_CHECK(dev->ops->softmax_xent(dev, R, C, h->logits.data, h->labels_dev, 0.0f, 1.0f / ((float)b * (float)K),
                                  h->dlogits.data, h->stats_dev));
  FL_CHECK(dev->ops->to_host(dev, st2, h->stats_dev, 2 * sizeof *st2));
  if (!split && K > 1) {
    int64_t sshape[1] = {2};
    FL_CHECK(tensor_ensure(&h->stats_t, dev, 1, sshape));
    FL_CHECK(dev->ops->from_host(dev, h->stats_t.data, st2, 2 * sizeof *st2));
    FL_CHECK(allreduce_sum(h, &h->stats_t, &h->bytes.activations));
    FL_CHECK(dev->ops->to_host(dev, st2, h->stats_t.data, 2 * sizeof *st2));
  }
  *feat_out = feat;
cleanup:
  return status;
}

/* The step's backward from h->dlogits, after step_forward of b examples per rank. */
static fl_status step_backward(hcnn *h, int b, const fl_tensor *feat) {
  const hcnn_spec *sp = &h->spec;
  fl_device *dev = h->dev;
  int P = h->parts, nfc = sp->nfc, C = sp->classes, K = h->ranks;
  bool split = P > 1;
  int R = split ? b * K : b, F = (int)h->features, last = sp->fc[nfc - 1] / P;
  fl_status status = FL_OK;

  /* Backward through the classifier and the hidden layers. */
  int64_t dshape[2] = {R, last};
  FL_CHECK(tensor_ensure(&h->d_act, dev, 2, dshape));
  FL_CHECK(blocked_backward(dev, R, 1, last, h->act[nfc - 1].data, C, fc_value(h, nfc, 0), h->dlogits.data,
                            fc_grad(h, nfc, 0), h->d_act.data));
  FL_CHECK(dev->ops->bias_grad_rows(dev, R, C, h->dlogits.data, fc_grad(h, nfc, 1)));
  for (int i = nfc - 1; i >= 0; i--) {
    int out = sp->fc[i] / P;
    FL_CHECK(dev->ops->relu_backward(dev, h->d_act.numel, h->act[i].data, h->d_act.data, h->d_act.data));
    FL_CHECK(dev->ops->bias_grad_rows(dev, R, out, h->d_act.data, fc_grad(h, i, 1)));
    const float *lin = i ? (split ? h->gathered[i - 1].data : h->act[i - 1].data) : feat->data;
    int lblocks = i && split ? P : 1, lwidth = i ? sp->fc[i - 1] / lblocks : F;
    int64_t pshape[2] = {R, (int64_t)lblocks * lwidth};
    FL_CHECK(tensor_ensure(&h->d_part, dev, 2, pshape));
    FL_CHECK(blocked_backward(dev, R, lblocks, lwidth, lin, out, fc_value(h, i, 0), h->d_act.data,
                              fc_grad(h, i, 0), h->d_part.data));
    /* The input gradient is the sum of every rank's part; each rank keeps its own block:
     * its units of the layer below, or at the switch its own examples' features. */
    int64_t nshape[2] = {i ? R : b, i ? sp->fc[i - 1] / P : F};
    fl_tensor *next = i ? &h->d_act : &h->d_in;
    if (split) {
      FL_CHECK(tensor_ensure(next, dev, 2, nshape));
      FL_CHECK(scatter_sum(h, &h->d_part, next, &h->bytes.activations));
    } else {
      FL_CHECK(tensor_ensure(next, dev, 2, nshape));
      FL_CHECK(dev->ops->copy(dev, next->data, h->d_part.data, next->numel * sizeof(float)));
    }
  }

  /* The convolutions' backward on the rank's examples; replicated gradients summed. */
  FL_CHECK(nn_model_backward_from(h->conv, &h->d_in, NULL, NULL));
  if (K > 1) {
    FL_CHECK(allreduce_sum(h, nn_model_grads(h->conv), &h->bytes.gradients));
    if (!split) FL_CHECK(allreduce_sum(h, &h->fc.grads, &h->bytes.gradients));
  }
cleanup:
  return status;
}

fl_status hcnn_compute_gradients(hcnn *h, const float *x, const int32_t *labels, int b, hcnn_stats *stats) {
  float st2[2];
  const fl_tensor *feat = NULL;
  fl_status status = FL_OK;
  FL_CHECK(step_forward(h, x, labels, b, st2, &feat));
  FL_CHECK(step_backward(h, b, feat));
  if (stats) {
    stats->loss = (double)st2[0] / ((double)b * h->ranks);
    stats->accuracy = (double)st2[1] / ((double)b * h->ranks);
    stats->bytes = h->bytes;
  }
cleanup:
  return status;
}

fl_status hcnn_evaluate(hcnn *h, const float *x, const int32_t *labels, int b, double *loss_sum, double *correct) {
  float st2[2];
  const fl_tensor *feat = NULL;
  fl_status status = step_forward(h, x, labels, b, st2, &feat);
  if (status != FL_OK) return status;
  if (loss_sum) *loss_sum = st2[0];
  if (correct) *correct = st2[1];
  return FL_OK;
}

fl_status hcnn_apply(hcnn *h, float lr) {
  if (!h) return fl_set_error(FL_EINVAL, "hcnn_apply: NULL argument");
  fl_status status = FL_OK;
  FL_CHECK(optim_step(h->conv_opt, lr, nn_model_grads(h->conv), nn_model_values(h->conv)));
  FL_CHECK(optim_step(h->fc_opt, lr, &h->fc.grads, &h->fc.values));
  FL_CHECK(nn_model_zero_grad(h->conv));
  FL_CHECK(h->dev->ops->memset0(h->dev, h->fc.grads.data, h->fc.nvalues * sizeof(float)));
cleanup:
  return status;
}
