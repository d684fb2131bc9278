/*
 * gpu/parallel/transformer.c: the transformer chunks of gpu/parallel/transformer.h: spec
 * checks, parameters and their keyed initialisation, activation slots, and the embedding and
 * head units. The blocks are gpu/parallel/tensor_parallel.c.
 *
 * Design: a chunk registers its units' parameters (this rank's shards) with a layer_store,
 * which lays them out in one flat value and one flat gradient buffer; the values are then
 * overwritten with the keyed draw, so that a shard holds exactly its slice of the unsplit
 * model. A slot holds one micro-batch's copy of its input and every unit's saved
 * activations, and grows with tensor_ensure; scratch that only lives inside one forward or
 * backward is shared by the whole chunk.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/nn.h"
#include "gpu/parallel/tensor_parallel.h"
#include "gpu/parallel/transformer.h"

/* Initial weights: N(0, 1 / fan_in) (LeCun), so that activations keep unit scale through the
 * blocks without layer norm; the projections back into the residual stream (attn.out,
 * mlp.fc2) are scaled down by sqrt(2 x blocks) more (GPT-2's residual scaling), so the
 * stream grows slowly with depth. GPT-2's flat 0.02 relies on layer norm: here it left the
 * blocks' branches ~1e-3 of the stream and training barely used them. The position
 * embedding starts small beside the token embedding. */
static double fan_in_std(int64_t fan_in) { return 1.0 / sqrt((double)fan_in); }
#define TFM_POSITION_STD 0.02
/* GPT: a token's embedding starts at unit scale, as the blocks' branches do after their
 * layer norms (PyTorch's nn.Embedding draws N(0, 1)); positions start smaller. Layer norms
 * start as the identity: gain 1 (TFM_ONES, below), bias 0. */
#define TFM_TOKEN_STD 1.0
#define TFM_GPT_POSITION_STD 0.1
#define TFM_ONES (-1.0)
#define TFM_LN_EPS 1e-5f

typedef enum unit_kind { UNIT_EMBED, UNIT_BLOCK, UNIT_HEAD } unit_kind;

typedef struct tfm_unit {
  unit_kind kind;
  int index;          /* the unit's global index */
  size_t first_param; /* into the store */
  int block_param[TP_NPARAMS]; /* UNIT_BLOCK: the store index of each TP_* parameter, or -1 */
  tp_block block;     /* UNIT_BLOCK only */
} tfm_unit;

/* One unit's saved activations in a slot. */
typedef struct unit_acts {
  tp_block_acts block; /* UNIT_BLOCK */
  fl_tensor out;       /* UNIT_EMBED: [n, seq, hidden]; UNIT_HEAD: logits [n, classes] (GPT:
                        * [n, seq, vocab]) */
  fl_tensor mean;      /* UNIT_HEAD: [n, hidden] (GPT: the final layer norm's output
                        * [n, seq, hidden]) */
  fl_tensor ln_mean, ln_rstd; /* UNIT_HEAD, GPT: the final layer norm's statistics [n * seq] */
  /* Sequence parallel, UNIT_BLOCK: this rank's slice of the input of the chunk's first block
   * after a whole tensor (in_slice), and the all-gathered output of a block before one
   * (out_full): the chunk's ends, the embedding and the head see whole tensors. */
  fl_tensor in_slice, out_full;
} unit_acts;

typedef struct tfm_slot {
  bool in_flight; /* forward done, backward not yet */
  bool train;
  tfm_batch batch;
  fl_tensor x;  /* the copy of the forward's input */
  fl_tensor dx; /* the last backward's input gradient */
  unit_acts *units;
  size_t bytes; /* activation bytes of the forward in flight */
} tfm_slot;

struct tfm_chunk {
  fl_device *dev;
  tfm_spec spec;
  int first, end, nunits;
  fl_comm *comm;
  int tp_rank, tp_size;
  tp_dims dims;
  layer_store store;
  tfm_param_place *places;
  tfm_unit *units;
  tfm_slot *slots;
  int nslots;
  tp_scratch scratch;
  fl_tensor grad_a, grad_b; /* ping-pong input gradients between units in backward */
  fl_tensor d_mean;         /* the head's gradient at the token mean (GPT: at the layer norm) */
  fl_tensor head_dx;        /* GPT: the head's input gradient when the caller wants none */
  fl_tensor g_slice, dx_slice; /* sequence parallel: gradients at the blocks' slices */
  size_t bytes, peak;
};

/* ---- the spec ---------------------------------------------------------------------------- */

int tfm_units(const tfm_spec *spec) { return spec->blocks + 2; }
int tfm_input_width(const tfm_spec *spec) { return spec->kind == TFM_GPT ? 1 : spec->features; }
int tfm_output_classes(const tfm_spec *spec) { return spec->kind == TFM_GPT ? spec->vocab : spec->classes; }
int tfm_targets_per_sample(const tfm_spec *spec) { return spec->kind == TFM_GPT ? spec->seq : 1; }

static int spec_ffn(const tfm_spec *spec) { return spec->ffn ? spec->ffn : 4 * spec->hidden; }

fl_status tfm_spec_check(const tfm_spec *spec, int tp_size) {
  if (!spec) return fl_set_error(FL_EINVAL, "transformer spec: NULL");
  if (spec->kind != TFM_ENCODER && spec->kind != TFM_GPT)
    return fl_set_error(FL_EINVAL, "transformer spec: kind %d is neither the encoder nor GPT", (int)spec->kind);
  bool gpt = spec->kind == TFM_GPT;
  const struct {
    const char *name;
    int value;
  } positive[] = {{"seq", spec->seq},
                  {gpt ? "vocab" : "features", gpt ? spec->vocab : spec->features},
                  {"hidden", spec->hidden},
                  {"heads", spec->heads},
                  {"blocks", spec->blocks},
                  {gpt ? "vocab" : "classes", gpt ? spec->vocab : spec->classes}};
  for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
    if (positive[i].value < 1)
      return fl_set_error(FL_EINVAL, "transformer spec: %s is %d, must be at least 1",
                          positive[i].name, positive[i].value);
  if (spec->hidden % spec->heads)
    return fl_set_error(FL_EINVAL, "transformer spec: heads (%d) must divide hidden (%d)",
                        spec->heads, spec->hidden);
  if (spec->ffn < 0)
    return fl_set_error(FL_EINVAL, "transformer spec: ffn is %d, must be positive (or 0 for "
                        "4 * hidden)", spec->ffn);
  if (!(spec->dropout >= 0.0f && spec->dropout < 1.0f))
    return fl_set_error(FL_EINVAL, "transformer spec: dropout is %g, must be in [0, 1)",
                        (double)spec->dropout);
  if (tp_size < 1)
    return fl_set_error(FL_EINVAL, "transformer: tensor-parallel size %d, must be at least 1",
                        tp_size);
  if (spec->heads % tp_size)
    return fl_set_error(FL_EINVAL, "transformer spec: heads (%d) must be a multiple of the "
                        "tensor-parallel size %d", spec->heads, tp_size);
  if (spec->sequence_parallel && tp_size < 2)
    return fl_set_error(FL_EINVAL, "transformer spec: sequence parallel needs a tensor-parallel group of at least "
                        "2 ranks (tp is %d)", tp_size);
  if (spec->sequence_parallel && spec->seq % tp_size)
    return fl_set_error(FL_EINVAL, "transformer spec: sequence parallel needs seq (%d) to be a multiple of the "
                        "tensor-parallel size %d", spec->seq, tp_size);
  if (spec_ffn(spec) % tp_size)
    return fl_set_error(FL_EINVAL, "transformer spec: ffn (%d) must be a multiple of the "
                        "tensor-parallel size %d", spec_ffn(spec), tp_size);
  /* The largest activation, [seq, seq] scores per head and 3 * hidden per token, must have
   * int dimensions for the device operations. */
  if ((int64_t)spec->seq * spec->seq > INT32_MAX / 4 || (int64_t)spec->hidden * 3 > INT32_MAX)
    return fl_set_error(FL_EINVAL, "transformer spec: seq (%d) or hidden (%d) too large",
                        spec->seq, spec->hidden);
  return FL_OK;
}

/* ---- parameters ------------------------------------------------------------------------- */

/* The keyed draw: N(0, 1) for element g of parameter `name`, from two counter-based uniforms
 * (splitmix64 of the seed, the name's FNV-1a hash and the index) through Box-Muller. */
static uint64_t name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

static double keyed_uniform(uint64_t key, uint64_t counter) {
  uint64_t z = dropout_mix(key ^ dropout_mix(counter));
  return ((double)(z >> 11) + 0.5) / 9007199254740992.0; /* in (0, 1): log() stays finite */
}

static double keyed_normal(uint64_t key, uint64_t g) {
  double u1 = keyed_uniform(key, 2 * g), u2 = keyed_uniform(key, 2 * g + 1);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

typedef struct param_def {
  const char *suffix;
  int64_t rows, cols;   /* the unsplit shape (rows 1 for a vector) */
  int split;            /* 0 replicated, 1 by rows, 2 by columns */
  int64_t start, count; /* this rank's rows or columns when split */
  double std;           /* 0: zeros */
} param_def;

static fl_status add_param(tfm_chunk *c, const char *prefix, param_def def) {
  /* A group of one holds every tensor whole: replicated, as the place promises. */
  tfm_param_place place = {def.rows, def.cols, 0, 0, def.split == 0 || c->tp_size == 1};
  int64_t rows = def.rows, cols = def.cols;
  if (def.split == 1) {
    place.row0 = def.start;
    rows = def.count;
  } else if (def.split == 2) {
    place.col0 = def.start;
    cols = def.count;
  }
  int64_t shape[2] = {rows, cols};
  bool vector = def.rows == 1;
  size_t idx;
  fl_status st = layer_store_add_param(&c->store, prefix, def.suffix, vector ? 1 : 2,
                                       vector ? shape + 1 : shape, LAYER_INIT_ZERO, 0, &idx);
  if (st != FL_OK) return st;
  c->places[idx] = place;
  return FL_OK;
}

/* Registers unit u's parameters (this rank's shards) in order. */
static fl_status add_unit_params(tfm_chunk *c, tfm_unit *u, double *stds, size_t *nstd) {
  const tfm_spec *sp = &c->spec;
  const tp_dims *D = &c->dims;
  int64_t H = sp->hidden, F = spec_ffn(sp), d = D->head_dim;
  double residual = 1.0 / sqrt(2.0 * sp->blocks);
  bool gpt = sp->kind == TFM_GPT;
  param_def defs[TP_NPARAMS];
  int tp_of[TP_NPARAMS]; /* blocks: each def's TP_* index */
  int ndefs = 0;
  char prefix[64];
  u->first_param = c->store.nparams;
  for (int i = 0; i < TP_NPARAMS; i++) u->block_param[i] = -1;
  if (u->kind == UNIT_EMBED && gpt) {
    snprintf(prefix, sizeof prefix, "embed");
    defs[ndefs++] = (param_def){"token", sp->vocab, H, 0, 0, 0, TFM_TOKEN_STD};
    defs[ndefs++] = (param_def){"position", sp->seq, H, 0, 0, 0, TFM_GPT_POSITION_STD};
  } else if (u->kind == UNIT_HEAD && gpt) {
    snprintf(prefix, sizeof prefix, "head");
    defs[ndefs++] = (param_def){"ln.weight", 1, H, 0, 0, 0, TFM_ONES};
    defs[ndefs++] = (param_def){"ln.bias", 1, H, 0, 0, 0, 0};
    defs[ndefs++] = (param_def){"weight", sp->vocab, H, 0, 0, 0, fan_in_std(H)};
    defs[ndefs++] = (param_def){"bias", 1, sp->vocab, 0, 0, 0, 0};
  } else if (u->kind == UNIT_EMBED) {
    snprintf(prefix, sizeof prefix, "embed");
    defs[ndefs++] = (param_def){"weight", H, sp->features, 0, 0, 0, fan_in_std(sp->features)};
    defs[ndefs++] = (param_def){"bias", 1, H, 0, 0, 0, 0};
    defs[ndefs++] = (param_def){"position", sp->seq, H, 0, 0, 0, TFM_POSITION_STD};
  } else if (u->kind == UNIT_HEAD) {
    snprintf(prefix, sizeof prefix, "head");
    defs[ndefs++] = (param_def){"weight", sp->classes, H, 0, 0, 0, fan_in_std(H)};
    defs[ndefs++] = (param_def){"bias", 1, sp->classes, 0, 0, 0, 0};
  } else {
    snprintf(prefix, sizeof prefix, "blocks.%d", u->index - 1);
    int64_t q0 = (int64_t)D->head0 * 3 * d, qn = (int64_t)D->local_heads * 3 * d;
    int64_t c0 = (int64_t)D->head0 * d, cn = (int64_t)D->local_heads * d;
    int64_t f0 = (int64_t)c->tp_rank * D->local_ffn, fn = D->local_ffn;
    if (gpt) {
      tp_of[ndefs] = TP_LN1_G, defs[ndefs++] = (param_def){"ln1.weight", 1, H, 0, 0, 0, TFM_ONES};
      tp_of[ndefs] = TP_LN1_B, defs[ndefs++] = (param_def){"ln1.bias", 1, H, 0, 0, 0, 0};
    }
    tp_of[ndefs] = TP_QKV_W, defs[ndefs++] = (param_def){"attn.qkv.weight", 3 * H, H, 1, q0, qn, fan_in_std(H)};
    tp_of[ndefs] = TP_QKV_B, defs[ndefs++] = (param_def){"attn.qkv.bias", 1, 3 * H, 2, q0, qn, 0};
    tp_of[ndefs] = TP_OUT_W, defs[ndefs++] = (param_def){"attn.out.weight", H, H, 2, c0, cn, fan_in_std(H) * residual};
    tp_of[ndefs] = TP_OUT_B, defs[ndefs++] = (param_def){"attn.out.bias", 1, H, 0, 0, 0, 0};
    if (gpt) {
      tp_of[ndefs] = TP_LN2_G, defs[ndefs++] = (param_def){"ln2.weight", 1, H, 0, 0, 0, TFM_ONES};
      tp_of[ndefs] = TP_LN2_B, defs[ndefs++] = (param_def){"ln2.bias", 1, H, 0, 0, 0, 0};
    }
    tp_of[ndefs] = TP_FC1_W, defs[ndefs++] = (param_def){"mlp.fc1.weight", F, H, 1, f0, fn, fan_in_std(H)};
    tp_of[ndefs] = TP_FC1_B, defs[ndefs++] = (param_def){"mlp.fc1.bias", 1, F, 2, f0, fn, 0};
    tp_of[ndefs] = TP_FC2_W, defs[ndefs++] = (param_def){"mlp.fc2.weight", H, F, 2, f0, fn, fan_in_std(F) * residual};
    tp_of[ndefs] = TP_FC2_B, defs[ndefs++] = (param_def){"mlp.fc2.bias", 1, H, 0, 0, 0, 0};
  }
  for (int i = 0; i < ndefs; i++) {
    if (u->kind == UNIT_BLOCK) u->block_param[tp_of[i]] = (int)c->store.nparams;
    fl_status st = add_param(c, prefix, defs[i]);
    if (st != FL_OK) return st;
    stds[(*nstd)++] = defs[i].std;
  }
  return FL_OK;
}

/* Overwrites every parameter with its keyed draw: element (i, j) of a shard is element
 * (row0 + i, col0 + j) of the unsplit tensor. */
static fl_status fill_keyed(tfm_chunk *c, const double *stds) {
  layer_store *s = &c->store;
  if (!s->nvalues) return FL_OK;
  float *host = common_malloc(s->nvalues * sizeof *host);
  if (!host) return FL_ERR(FL_ENOMEM, "transformer: out of memory for %zu weights", s->nvalues);
  for (size_t i = 0; i < s->nparams; i++) {
    const nn_param *p = &s->params[i];
    tfm_param_place pl = c->places[i];
    int64_t cols = p->value.ndim == 2 ? p->value.shape[1] : p->value.shape[0];
    int64_t rows = (int64_t)p->value.numel / cols;
    uint64_t key = c->spec.seed ^ name_hash(p->name);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t j = 0; j < cols; j++) {
        uint64_t g = (uint64_t)((pl.row0 + r) * pl.cols + pl.col0 + j);
        host[p->offset + (size_t)(r * cols + j)] =
            stds[i] == TFM_ONES ? 1.0f : stds[i] > 0 ? (float)(stds[i] * keyed_normal(key, g)) : 0.0f;
      }
  }
  fl_status st = c->dev->ops->from_host(c->dev, s->values.data, host, s->nvalues * sizeof *host);
  common_free(host);
  return st;
}

/* ---- create and destroy ------------------------------------------------------------------ */

static fl_status check_group(fl_comm *comm, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    return fl_set_error(FL_EINVAL, "transformer: tensor-parallel rank %d of %d", tp_rank, tp_size);
  if (tp_size == 1 && comm && fl_comm_size(comm) != 1)
    return fl_set_error(FL_EINVAL, "transformer: tensor-parallel size 1 with a communicator "
                        "of %d ranks", fl_comm_size(comm));
  if (tp_size > 1 && !comm)
    return fl_set_error(FL_EINVAL, "transformer: tensor-parallel size %d needs a communicator",
                        tp_size);
  if (tp_size > 1 && (fl_comm_size(comm) != tp_size || fl_comm_rank(comm) != tp_rank))
    return fl_set_error(FL_EINVAL, "transformer: the communicator is rank %d of %d, the chunk "
                        "was given rank %d of %d", fl_comm_rank(comm), fl_comm_size(comm),
                        tp_rank, tp_size);
  return FL_OK;
}

fl_status tfm_chunk_create(fl_device *dev, const tfm_spec *spec, int first_unit, int end_unit,
                           fl_comm *tp_comm, int tp_rank, int tp_size, tfm_chunk **out) {
  if (!dev || !out) return fl_set_error(FL_EINVAL, "tfm_chunk_create: NULL argument");
  fl_status status = tfm_spec_check(spec, tp_size);
  if (status != FL_OK) return status;
  if (first_unit < 0 || end_unit <= first_unit || end_unit > tfm_units(spec))
    return fl_set_error(FL_EINVAL, "transformer: units [%d, %d) are not a non-empty range of "
                        "the model's %d", first_unit, end_unit, tfm_units(spec));
  status = check_group(tp_comm, tp_rank, tp_size);
  if (status != FL_OK) return status;
  double *stds = NULL;
  tfm_chunk *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "transformer: out of memory");
  c->dev = dev;
  c->spec = *spec;
  c->first = first_unit;
  c->end = end_unit;
  c->nunits = end_unit - first_unit;
  c->comm = tp_size > 1 ? tp_comm : NULL;
  c->tp_rank = tp_rank;
  c->tp_size = tp_size;
  int local_heads = spec->heads / tp_size;
  c->dims = (tp_dims){spec->seq, spec->hidden, spec->heads, spec->hidden / spec->heads,
                      local_heads, tp_rank * local_heads, spec_ffn(spec) / tp_size, spec->dropout,
                      spec->kind == TFM_GPT, spec->sequence_parallel, tp_size,
                      spec->sequence_parallel ? spec->seq / tp_size : spec->seq,
                      spec->sequence_parallel ? tp_rank * (spec->seq / tp_size) : 0,
                      spec->selective_recompute};
  layer_store_init(&c->store, dev);
  size_t most = (size_t)c->nunits * TP_NPARAMS;
  c->places = common_calloc(most, sizeof *c->places);
  c->units = common_calloc((size_t)c->nunits, sizeof *c->units);
  stds = common_calloc(most, sizeof *stds);
  if (!c->places || !c->units || !stds) FL_CHECK(FL_ERR(FL_ENOMEM, "transformer: out of memory"));
  size_t nstd = 0;
  for (int i = 0; i < c->nunits; i++) {
    tfm_unit *u = &c->units[i];
    u->index = first_unit + i;
    u->kind = u->index == 0 ? UNIT_EMBED : u->index == spec->blocks + 1 ? UNIT_HEAD : UNIT_BLOCK;
    FL_CHECK(add_unit_params(c, u, stds, &nstd));
  }
  FL_CHECK(layer_store_finish(&c->store, spec->seed));
  FL_CHECK(fill_keyed(c, stds));
  for (int i = 0; i < c->nunits; i++) {
    tfm_unit *u = &c->units[i];
    if (u->kind != UNIT_BLOCK) continue;
    u->block = (tp_block){dev, c->comm, c->dims, {0}, &c->scratch};
    for (int j = 0; j < TP_NPARAMS; j++)
      u->block.p[j] = u->block_param[j] >= 0 ? &c->store.params[u->block_param[j]] : NULL;
  }
  common_free(stds);
  *out = c;
  return FL_OK;
cleanup:
  common_free(stds);
  tfm_chunk_destroy(c);
  return status;
}

static void slot_release(tfm_chunk *c, tfm_slot *s) {
  tensor_release(&s->x);
  tensor_release(&s->dx);
  for (int i = 0; s->units && i < c->nunits; i++) {
    tp_block_acts_release(&s->units[i].block);
    tensor_release(&s->units[i].out);
    tensor_release(&s->units[i].mean);
    tensor_release(&s->units[i].ln_mean);
    tensor_release(&s->units[i].ln_rstd);
    tensor_release(&s->units[i].in_slice);
    tensor_release(&s->units[i].out_full);
  }
  common_free(s->units);
}

void tfm_chunk_destroy(tfm_chunk *c) {
  if (!c) return;
  for (int i = 0; i < c->nslots; i++) slot_release(c, &c->slots[i]);
  common_free(c->slots);
  tp_scratch_release(&c->scratch);
  tensor_release(&c->grad_a);
  tensor_release(&c->grad_b);
  tensor_release(&c->d_mean);
  tensor_release(&c->head_dx);
  tensor_release(&c->g_slice);
  tensor_release(&c->dx_slice);
  layer_store_release(&c->store);
  common_free(c->places);
  common_free(c->units);
  common_free(c);
}

/* ---- the embedding and the head ---------------------------------------------------------- */

static float *pval(tfm_chunk *c, const tfm_unit *u, int i) {
  return c->store.params[u->first_param + (size_t)i].value.data;
}
static float *pgrad(tfm_chunk *c, const tfm_unit *u, int i) {
  return c->store.params[u->first_param + (size_t)i].grad.data;
}

/* out[n, seq, hidden] = x W^T + b + position (the position embedding is a bias over rows of
 * [n, seq * hidden]). */
static fl_status embed_forward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, unit_acts *a) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden, f = c->spec.features;
  int64_t shape[3] = {n, s, H};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->out, dev, 3, shape));
  FL_CHECK(dev->ops->gemm(dev, false, true, n * s, H, f, 1.0f, x->data, f, pval(c, u, 0), f,
                          0.0f, a->out.data, H));
  FL_CHECK(dev->ops->bias_add_rows(dev, n * s, H, pval(c, u, 1), a->out.data));
  FL_CHECK(dev->ops->bias_add_rows(dev, n, s * H, pval(c, u, 2), a->out.data));
cleanup:
  return status;
}

static fl_status embed_backward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x,
                                const fl_tensor *dy) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden, f = c->spec.features;
  fl_status status = FL_OK;
  FL_CHECK(dev->ops->gemm(dev, true, false, H, f, n * s, 1.0f, dy->data, H, x->data, f, 1.0f,
                          pgrad(c, u, 0), f));
  FL_CHECK(dev->ops->bias_grad_rows(dev, n * s, H, dy->data, pgrad(c, u, 1)));
  FL_CHECK(dev->ops->bias_grad_rows(dev, n, s * H, dy->data, pgrad(c, u, 2)));
cleanup:
  return status;
}

/* GPT: out[n, seq, hidden] = token[ids] + position. */
static fl_status gpt_embed_forward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, unit_acts *a) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden;
  int64_t shape[3] = {n, s, H};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->out, dev, 3, shape));
  FL_CHECK(dev->ops->embedding_forward(dev, (size_t)n * s, H, c->spec.vocab, x->data, pval(c, u, 0), a->out.data));
  FL_CHECK(dev->ops->bias_add_rows(dev, n, s * H, pval(c, u, 1), a->out.data));
cleanup:
  return status;
}

static fl_status gpt_embed_backward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, const fl_tensor *dy) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden;
  fl_status status = FL_OK;
  FL_CHECK(dev->ops->embedding_backward(dev, (size_t)n * s, H, c->spec.vocab, x->data, dy->data, pgrad(c, u, 0)));
  FL_CHECK(dev->ops->bias_grad_rows(dev, n, s * H, dy->data, pgrad(c, u, 1)));
cleanup:
  return status;
}

/* GPT: logits[n, seq, vocab] = ln(x) W^T + b (parameters: ln gain, ln bias, W, b). */
static fl_status gpt_head_forward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, unit_acts *a) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden, V = c->spec.vocab, T = n * s;
  int64_t xshape[3] = {n, s, H}, lshape[3] = {n, s, V}, tshape[1] = {T};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->mean, dev, 3, xshape));
  FL_CHECK(tensor_ensure(&a->ln_mean, dev, 1, tshape));
  FL_CHECK(tensor_ensure(&a->ln_rstd, dev, 1, tshape));
  FL_CHECK(tensor_ensure(&a->out, dev, 3, lshape));
  FL_CHECK(dev->ops->layernorm_forward(dev, T, H, TFM_LN_EPS, x->data, pval(c, u, 0), pval(c, u, 1), a->mean.data,
                                       a->ln_mean.data, a->ln_rstd.data));
  FL_CHECK(dev->ops->gemm(dev, false, true, T, V, H, 1.0f, a->mean.data, H, pval(c, u, 2), H, 0.0f, a->out.data, V));
  FL_CHECK(dev->ops->bias_add_rows(dev, T, V, pval(c, u, 3), a->out.data));
cleanup:
  return status;
}

/* The layer norm's parameters need its input gradient even when the caller wants no dx. */
static fl_status gpt_head_backward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, const unit_acts *a,
                                   const fl_tensor *dy, fl_tensor *dx) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden, V = c->spec.vocab, T = n * s;
  int64_t xshape[3] = {n, s, H};
  fl_status status = FL_OK;
  if (!dx) dx = &c->head_dx;
  FL_CHECK(tensor_ensure(&c->d_mean, dev, 3, xshape));
  FL_CHECK(tensor_ensure(dx, dev, 3, xshape));
  FL_CHECK(dev->ops->gemm(dev, true, false, V, H, T, 1.0f, dy->data, V, a->mean.data, H, 1.0f, pgrad(c, u, 2), H));
  FL_CHECK(dev->ops->bias_grad_rows(dev, T, V, dy->data, pgrad(c, u, 3)));
  FL_CHECK(dev->ops->gemm(dev, false, false, T, H, V, 1.0f, dy->data, V, pval(c, u, 2), H, 0.0f, c->d_mean.data, H));
  FL_CHECK(dev->ops->layernorm_backward(dev, T, H, x->data, c->d_mean.data, pval(c, u, 0), a->ln_mean.data,
                                        a->ln_rstd.data, dx->data, pgrad(c, u, 0), pgrad(c, u, 1)));
cleanup:
  return status;
}

static fl_status head_forward(tfm_chunk *c, const tfm_unit *u, const fl_tensor *x, unit_acts *a) {
  fl_device *dev = c->dev;
  int n = (int)x->shape[0], s = c->spec.seq, H = c->spec.hidden, k = c->spec.classes;
  int64_t mshape[2] = {n, H}, lshape[2] = {n, k};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&a->mean, dev, 2, mshape));
  FL_CHECK(tensor_ensure(&a->out, dev, 2, lshape));
  FL_CHECK(dev->ops->mean_tokens_forward(dev, n, s, H, x->data, a->mean.data));
  FL_CHECK(dev->ops->gemm(dev, false, true, n, k, H, 1.0f, a->mean.data, H, pval(c, u, 0), H,
                          0.0f, a->out.data, k));
  FL_CHECK(dev->ops->bias_add_rows(dev, n, k, pval(c, u, 1), a->out.data));
cleanup:
  return status;
}

static fl_status head_backward(tfm_chunk *c, const tfm_unit *u, const unit_acts *a,
                               const fl_tensor *dy, fl_tensor *dx) {
  fl_device *dev = c->dev;
  int n = (int)a->mean.shape[0], s = c->spec.seq, H = c->spec.hidden, k = c->spec.classes;
  int64_t mshape[2] = {n, H}, xshape[3] = {n, s, H};
  fl_status status = FL_OK;
  FL_CHECK(dev->ops->gemm(dev, true, false, k, H, n, 1.0f, dy->data, k, a->mean.data, H, 1.0f,
                          pgrad(c, u, 0), H));
  FL_CHECK(dev->ops->bias_grad_rows(dev, n, k, dy->data, pgrad(c, u, 1)));
  if (!dx) goto cleanup;
  FL_CHECK(tensor_ensure(&c->d_mean, dev, 2, mshape));
  FL_CHECK(tensor_ensure(dx, dev, 3, xshape));
  FL_CHECK(dev->ops->gemm(dev, false, false, n, H, k, 1.0f, dy->data, k, pval(c, u, 0), H, 0.0f,
                          c->d_mean.data, H));
  FL_CHECK(dev->ops->mean_tokens_backward(dev, n, s, H, c->d_mean.data, dx->data));
cleanup:
  return status;
}

/* ---- slots, forward and backward --------------------------------------------------------- */

static fl_status get_slot(tfm_chunk *c, int slot, tfm_slot **out) {
  if (slot < 0) return fl_set_error(FL_EINVAL, "transformer: slot %d is negative", slot);
  if (slot >= c->nslots) {
    tfm_slot *s = common_realloc(c->slots, (size_t)(slot + 1) * sizeof *s);
    if (!s) return FL_ERR(FL_ENOMEM, "transformer: out of memory for slot %d", slot);
    c->slots = s;
    for (int i = c->nslots; i <= slot; i++) {
      s[i] = (tfm_slot){0};
      s[i].units = common_calloc((size_t)c->nunits, sizeof *s[i].units);
      if (!s[i].units) {
        c->nslots = i;
        return FL_ERR(FL_ENOMEM, "transformer: out of memory for slot %d", slot);
      }
    }
    c->nslots = slot + 1;
  }
  *out = &c->slots[slot];
  return FL_OK;
}

/* The dropout keys of one unit: seeds from (spec seed, step, unit, site), never the rank. */
static tp_keys unit_keys(const tfm_chunk *c, const tfm_slot *s, int unit) {
  tp_keys k = {s->train && c->spec.dropout > 0.0f, s->batch.row0, {0}};
  uint64_t base = dropout_mix(dropout_mix(c->spec.seed ^ 0x74666d64726f7000ull /* "tfmdrop" */) ^ s->batch.step);
  for (int site = 0; site < TP_NSITES; site++)
    k.seed[site] = dropout_mix(base ^ dropout_mix(((uint64_t)unit << 8) | (uint64_t)site));
  return k;
}

/* Sequence parallel: blocks pass slices between them; a run of blocks takes a whole tensor in
 * (the chunk's input or the embedding's output) and gives one out. */
static bool sp_first_of_run(const tfm_chunk *c, int i) {
  return c->spec.sequence_parallel && c->units[i].kind == UNIT_BLOCK && (i == 0 || c->units[i - 1].kind != UNIT_BLOCK);
}
static bool sp_last_of_run(const tfm_chunk *c, int i) {
  return c->spec.sequence_parallel && c->units[i].kind == UNIT_BLOCK &&
         (i == c->nunits - 1 || c->units[i + 1].kind != UNIT_BLOCK);
}

static const fl_tensor *unit_output(const tfm_chunk *c, int i, const unit_acts *a) {
  if (c->units[i].kind != UNIT_BLOCK) return &a->out;
  return sp_last_of_run(c, i) ? &a->out_full : &a->block.y;
}

/* Sequence parallel: this rank's slice [n, seq/tp, hidden] of a whole [n, seq, hidden] (the
 * samples' slices into rank order, then rank tp_rank's block; see tensor_parallel.c). */
static fl_status sp_to_slice(tfm_chunk *c, const fl_tensor *whole, fl_tensor *slice) {
  fl_device *dev = c->dev;
  int n = (int)whole->shape[0], sl = c->dims.local_seq, H = c->spec.hidden, t = c->tp_size;
  int64_t shape[3] = {n, sl, H};
  size_t local = (size_t)n * sl * H;
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&c->scratch.gathered, dev, 3, whole->shape));
  FL_CHECK(tensor_ensure(slice, dev, 3, shape));
  FL_CHECK(dev->ops->swap01(dev, n, t, sl * H, whole->data, c->scratch.gathered.data));
  FL_CHECK(dev->ops->copy(dev, slice->data, c->scratch.gathered.data + (size_t)c->tp_rank * local,
                          local * sizeof(float)));
cleanup:
  return status;
}

/* Sequence parallel: the whole [n, seq, hidden] from every rank's slice (all-gather). */
static fl_status sp_to_whole(tfm_chunk *c, const fl_tensor *slice, fl_tensor *whole) {
  fl_device *dev = c->dev;
  int n = (int)slice->shape[0], sl = c->dims.local_seq, H = c->spec.hidden, t = c->tp_size;
  int64_t shape[3] = {n, c->spec.seq, H};
  fl_status status = FL_OK;
  FL_CHECK(tensor_ensure(&c->scratch.gathered, dev, 3, shape));
  FL_CHECK(tensor_ensure(whole, dev, 3, shape));
  FL_CHECK(fl_comm_allgather(c->comm, slice, &c->scratch.gathered));
  FL_CHECK(dev->ops->swap01(dev, t, n, sl * H, c->scratch.gathered.data, whole->data));
cleanup:
  return status;
}

static size_t slot_bytes(const tfm_chunk *c, const tfm_slot *s) {
  size_t bytes = s->x.numel * sizeof(float);
  for (int i = 0; i < c->nunits; i++) {
    const unit_acts *a = &s->units[i];
    bytes += c->units[i].kind == UNIT_BLOCK
                 ? tp_block_acts_bytes(&a->block) + (a->in_slice.numel + a->out_full.numel) * sizeof(float)
                 : (a->out.numel + a->mean.numel + a->ln_mean.numel + a->ln_rstd.numel) * sizeof(float);
  }
  return bytes;
}

fl_status tfm_chunk_forward(tfm_chunk *c, int slot, const fl_tensor *x, const tfm_batch *b,
                            bool train, const fl_tensor **y) {
  if (!c || !x || !y) return fl_set_error(FL_EINVAL, "tfm_chunk_forward: NULL argument");
  int width = c->first == 0 ? tfm_input_width(&c->spec) : c->spec.hidden;
  if (x->ndim != 3 || x->shape[0] < 1 || x->shape[1] != c->spec.seq || x->shape[2] != width) {
    char got[96];
    layer_shape_text(x, got, sizeof got);
    return fl_set_error(FL_EINVAL, "transformer units [%d, %d): input %s, expected [n, %d, %d]",
                        c->first, c->end, got, c->spec.seq, width);
  }
  tfm_slot *s = NULL;
  fl_status status = get_slot(c, slot, &s);
  if (status != FL_OK) return status;
  if (s->in_flight) {
    c->bytes -= s->bytes;
    s->in_flight = false;
  }
  s->train = train;
  s->batch = b ? *b : (tfm_batch){0};
  FL_CHECK(tensor_ensure(&s->x, c->dev, 3, x->shape));
  FL_CHECK(c->dev->ops->copy(c->dev, s->x.data, x->data, x->numel * sizeof(float)));
  const fl_tensor *in = &s->x;
  for (int i = 0; i < c->nunits; i++) {
    const tfm_unit *u = &c->units[i];
    unit_acts *a = &s->units[i];
    bool gpt = c->spec.kind == TFM_GPT;
    if (u->kind == UNIT_EMBED) {
      FL_CHECK(gpt ? gpt_embed_forward(c, u, in, a) : embed_forward(c, u, in, a));
    } else if (u->kind == UNIT_HEAD) {
      FL_CHECK(gpt ? gpt_head_forward(c, u, in, a) : head_forward(c, u, in, a));
    } else {
      tp_keys keys = unit_keys(c, s, u->index);
      if (sp_first_of_run(c, i)) {
        FL_CHECK(sp_to_slice(c, in, &a->in_slice));
        in = &a->in_slice;
      }
      FL_CHECK(tp_block_forward(&u->block, in, &keys, &a->block));
      if (sp_last_of_run(c, i)) FL_CHECK(sp_to_whole(c, &a->block.y, &a->out_full));
    }
    in = unit_output(c, i, a);
  }
  s->in_flight = true;
  s->bytes = slot_bytes(c, s);
  c->bytes += s->bytes;
  if (c->bytes > c->peak) c->peak = c->bytes;
  *y = in;
cleanup:
  return status;
}

fl_status tfm_chunk_backward(tfm_chunk *c, int slot, const fl_tensor *dy, const fl_tensor **dx) {
  if (!c || !dy) return fl_set_error(FL_EINVAL, "tfm_chunk_backward: NULL argument");
  if (slot < 0 || slot >= c->nslots || !c->slots[slot].in_flight)
    return fl_set_error(FL_ESTATE, "transformer units [%d, %d): backward of slot %d, which holds "
                        "no forward", c->first, c->end, slot);
  tfm_slot *s = &c->slots[slot];
  const fl_tensor *y = unit_output(c, c->nunits - 1, &s->units[c->nunits - 1]);
  if (dy->ndim != y->ndim || memcmp(dy->shape, y->shape, (size_t)y->ndim * sizeof y->shape[0])) {
    char got[96], want[96];
    layer_shape_text(dy, got, sizeof got);
    layer_shape_text(y, want, sizeof want);
    return fl_set_error(FL_ESTATE, "transformer units [%d, %d): output gradient %s does not "
                        "match the output %s", c->first, c->end, got, want);
  }
  bool want_dx = dx && c->first > 0;
  fl_status status = FL_OK;
  const fl_tensor *g = dy;
  for (int i = c->nunits - 1; i >= 0; i--) {
    const tfm_unit *u = &c->units[i];
    const unit_acts *a = &s->units[i];
    const fl_tensor *in = i ? unit_output(c, i - 1, &s->units[i - 1]) : &s->x;
    /* The first unit writes the slot's dx; the others alternate between two buffers, so
     * that a unit never writes the gradient it reads. */
    fl_tensor *out = i == 0 ? &s->dx : (i % 2 ? &c->grad_a : &c->grad_b);
    bool need = i > 0 || want_dx;
    bool gpt = c->spec.kind == TFM_GPT;
    if (u->kind == UNIT_EMBED) {
      FL_CHECK(gpt ? gpt_embed_backward(c, u, in, g) : embed_backward(c, u, in, g));
    } else if (u->kind == UNIT_HEAD) {
      FL_CHECK(gpt ? gpt_head_backward(c, u, in, a, g, need ? out : NULL) : head_backward(c, u, a, g, need ? out : NULL));
    } else {
      tp_keys keys = unit_keys(c, s, u->index);
      bool first = sp_first_of_run(c, i);
      if (first) in = &a->in_slice;
      /* A whole gradient comes in at a run's end (the chunk's dy, the head's dx): each rank
       * computed all of it, so its slice is this rank's share. */
      if (sp_last_of_run(c, i)) {
        FL_CHECK(sp_to_slice(c, g, &c->g_slice));
        g = &c->g_slice;
      }
      FL_CHECK(tp_block_backward(&u->block, in, &keys, &a->block, g, need, first ? &c->dx_slice : out));
      if (first && need) FL_CHECK(sp_to_whole(c, &c->dx_slice, out));
    }
    g = out;
  }
  c->bytes -= s->bytes;
  s->bytes = 0;
  s->in_flight = false;
  if (dx) *dx = want_dx ? &s->dx : NULL;
cleanup:
  return status;
}

/* ---- accessors --------------------------------------------------------------------------- */

fl_tensor *tfm_chunk_values(tfm_chunk *c) { return &c->store.values; }
fl_tensor *tfm_chunk_grads(tfm_chunk *c) { return &c->store.grads; }

fl_status tfm_chunk_zero_grad(tfm_chunk *c) {
  if (!c->store.nvalues) return FL_OK;
  return c->dev->ops->memset0(c->dev, c->store.grads.data, c->store.nvalues * sizeof(float));
}

size_t tfm_chunk_param_count(const tfm_chunk *c) { return c->store.nparams; }

nn_param *tfm_chunk_param(tfm_chunk *c, size_t i) {
  FL_ASSERT(i < c->store.nparams);
  return &c->store.params[i];
}

tfm_param_place tfm_chunk_param_place(const tfm_chunk *c, size_t i) {
  FL_ASSERT(i < c->store.nparams);
  return c->places[i];
}

size_t tfm_chunk_activation_bytes(const tfm_chunk *c) { return c->bytes; }
size_t tfm_chunk_peak_activation_bytes(const tfm_chunk *c) { return c->peak; }
void tfm_chunk_reset_peak(tfm_chunk *c) { c->peak = c->bytes; }
