/*
 * gpu/parallel/moe.c: the mixture-of-experts layer of gpu/parallel/moe.h: its parameters and
 * keyed initialisation, and forward and backward over the expert-parallel group, written
 * against the device operations only.
 *
 * With S = E * groups * capacity slots on every rank, R = ep * groups * capacity rows per
 * local expert and El = E / ep local experts (S = El * R):
 *   forward:  logits = x Wr^T -> host routing -> ids, gates
 *             disp[S, H] = gather(x | zero row, ids)             (embedding_forward)
 *             alltoall: block j (experts of rank j) -> rank j; recv [ep, El, g*cap, H]
 *             permute to [El, ep, g*cap, H]; per local expert: fc1, GELU, fc2
 *             permute back, alltoall back -> back[S, H]
 *             y = scatter_add(gate * back, ids)                   (embedding_backward)
 *   backward: dback = gate * gather(dy | 0, ids), dgate = rows' dot(gather(dy), back),
 *             the same path reversed to the experts and back, dx = scatter_add(.., ids),
 *             then the router: dlogits (host) -> dWr += dlogits^T x, dx += dlogits Wr.
 * The per-row gate products are gemm_batched of 1 x 1 by 1 x H (and 1 x H by H x 1 for the
 * dots), so no new device operation is needed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/keyed.h"
#include "gpu/parallel/moe.h"

/* ---- parameters ------------------------------------------------------------------------- */

size_t moe_param_count(const moe_config *cfg, int ep_size) {
  return 1 + (size_t)(cfg->experts / ep_size) * MOE_EXPERT_NPARAMS;
}

fl_status moe_params_add(layer_store *s, const char *prefix, const moe_config *cfg, int ep_rank,
                         int ep_size, size_t *first) {
  fl_status st = moe_config_check(cfg, ep_size);
  if (st != FL_OK) return st;
  if (ep_rank < 0 || ep_rank >= ep_size)
    return fl_set_error(FL_EINVAL, "moe: expert-parallel rank %d of %d", ep_rank, ep_size);
  const int64_t H = cfg->hidden, F = cfg->ffn;
  const int local = cfg->experts / ep_size;
  char pre[96];
  snprintf(pre, sizeof pre, "%s%srouter", prefix, *prefix ? "." : "");
  int64_t router[2] = {cfg->experts, H};
  st = layer_store_add_param(s, pre, "weight", 2, router, LAYER_INIT_ZERO, 0, first);
  for (int i = 0; st == FL_OK && i < local; i++) {
    snprintf(pre, sizeof pre, "%s%sexperts.%d", prefix, *prefix ? "." : "", ep_rank * local + i);
    int64_t w1[2] = {F, H}, w2[2] = {H, F};
    size_t idx;
    st = layer_store_add_param(s, pre, "fc1.weight", 2, w1, LAYER_INIT_ZERO, 0, &idx);
    if (st == FL_OK) st = layer_store_add_param(s, pre, "fc1.bias", 1, &F, LAYER_INIT_ZERO, 0, &idx);
    if (st == FL_OK) st = layer_store_add_param(s, pre, "fc2.weight", 2, w2, LAYER_INIT_ZERO, 0, &idx);
    if (st == FL_OK) st = layer_store_add_param(s, pre, "fc2.bias", 1, &H, LAYER_INIT_ZERO, 0, &idx);
  }
  return st;
}

fl_status moe_params_init(layer_store *s, size_t first, size_t count, uint64_t seed) {
  if (!s->finished || count == 0 || first + count > s->nparams)
    return fl_set_error(FL_EINVAL, "moe: parameters [%zu, %zu) are not in a finished store",
                        first, first + count);
  const nn_param *last = &s->params[first + count - 1];
  size_t base = s->params[first].offset, n = last->offset + last->value.numel - base;
  float *host = common_malloc(n * sizeof *host);
  if (!host) return FL_ERR(FL_ENOMEM, "moe: out of memory for %zu weights", n);
  for (size_t i = first; i < first + count; i++) {
    const nn_param *p = &s->params[i];
    float *v = host + (p->offset - base);
    if (p->value.ndim == 1) {
      memset(v, 0, p->value.numel * sizeof *v); /* biases */
      continue;
    }
    double std = 1.0 / sqrt((double)p->value.shape[1]);
    uint64_t key = seed ^ keyed_name_hash(p->name);
    for (size_t j = 0; j < p->value.numel; j++) v[j] = (float)(std * keyed_normal(key, j));
  }
  fl_status st = s->dev->ops->from_host(s->dev, s->values.data + base, host, n * sizeof *host);
  common_free(host);
  return st;
}

/* ---- forward and backward ----------------------------------------------------------------- */

typedef struct geom {
  int T, H, F, E, El, ep, slots, rows, block; /* block: g * cap, one (rank, expert) run */
} geom;

static geom geom_of(const moe_layer *k, int T, const moe_route *r) {
  geom g = {.T = T, .H = k->cfg.hidden, .F = k->cfg.ffn, .E = k->cfg.experts, .ep = k->ep_size};
  g.El = g.E / g.ep;
  g.block = r->groups * r->capacity;
  g.slots = g.E * g.block;
  g.rows = g.ep * g.block;
  return g;
}

static nn_param *expert_param(const moe_layer *k, int e, int which) {
  return &k->params[1 + (size_t)e * MOE_EXPERT_NPARAMS + which];
}

static fl_status ensure_host(moe_scratch *S, size_t n) {
  if (S->host_cap >= n) return FL_OK;
  float *p = common_realloc(S->host, n * sizeof *p);
  if (!p) return FL_ERR(FL_ENOMEM, "moe: out of memory for %zu host floats", n);
  S->host = p;
  S->host_cap = n;
  return FL_OK;
}

/* x (rows * H floats) into S->ext with a zero row after it, the row empty slots read. */
static fl_status extend(const moe_layer *k, const float *x, int T) {
  fl_device *dev = k->dev;
  moe_scratch *S = k->scratch;
  size_t th = (size_t)T * k->cfg.hidden;
  int64_t shape[2] = {T + 1, k->cfg.hidden};
  fl_status st = tensor_ensure(&S->ext, dev, 2, shape);
  if (st == FL_OK) st = dev->ops->copy(dev, S->ext.data, x, th * sizeof(float));
  if (st == FL_OK) st = dev->ops->memset0(dev, S->ext.data + th, (size_t)k->cfg.hidden * sizeof(float));
  return st;
}

/* Moves the blocks of src [a, b, block, H] to dst [b, a, block, H]. */
static fl_status permute(const moe_layer *k, const geom *G, int a, int b, const float *src,
                         float *dst) {
  size_t blk = (size_t)G->block * G->H;
  for (int i = 0; i < a; i++)
    for (int j = 0; j < b; j++) {
      fl_status st = k->dev->ops->copy(k->dev, dst + ((size_t)j * a + i) * blk,
                                       src + ((size_t)i * b + j) * blk, blk * sizeof(float));
      if (st != FL_OK) return st;
    }
  return FL_OK;
}

/* From this rank's [E, g*cap, H] slots (in) to its experts' [El, ep, g*cap, H] rows (out),
 * through tmp; `back` reverses it. out may be in; tmp is neither. With one rank it is a copy. */
static fl_status exchange(const moe_layer *k, const geom *G, bool back, fl_tensor *in,
                          fl_tensor *tmp, fl_tensor *out) {
  if (!k->comm)
    return in == out ? FL_OK : k->dev->ops->copy(k->dev, out->data, in->data, in->numel * sizeof(float));
  if (!back) {
    fl_status st = fl_comm_alltoall(k->comm, in, tmp);
    return st != FL_OK ? st : permute(k, G, G->ep, G->El, tmp->data, out->data);
  }
  fl_status st = permute(k, G, G->El, G->ep, in->data, tmp->data);
  return st != FL_OK ? st : fl_comm_alltoall(k->comm, tmp, out);
}

/* Each slot's row scaled by its gate: out[s, :] = gates[s] * in[s, :]. */
static fl_status scale_rows(const moe_layer *k, const geom *G, const float *gates,
                            const float *in, float *out) {
  return k->dev->ops->gemm_batched(k->dev, false, false, 1, G->H, 1, 1.0f, gates, 1, 1, in,
                                   G->H, (size_t)G->H, 0.0f, out, G->H, (size_t)G->H, G->slots);
}

static fl_status check_x(const moe_layer *k, const fl_tensor *x, int groups, int *T) {
  if (!x || x->dev != k->dev || x->numel == 0 || x->numel % (size_t)k->cfg.hidden)
    return fl_set_error(FL_EINVAL, "moe: the input must be rows of hidden (%d) floats on the "
                        "layer's device", k->cfg.hidden);
  /* The slot tables hold row indices as floats (the embedding operations' ids): exact
   * below 2^24. */
  if (x->numel / (size_t)k->cfg.hidden >= (1u << 24))
    return fl_set_error(FL_EINVAL, "moe: %zu rows are too many for one call (at most %u)",
                        x->numel / (size_t)k->cfg.hidden, (1u << 24) - 1);
  *T = (int)(x->numel / (size_t)k->cfg.hidden);
  if (groups < 1 || *T % groups)
    return fl_set_error(FL_EINVAL, "moe: %d rows cannot be cut into %d equal routing groups",
                        *T, groups);
  return FL_OK;
}

fl_status moe_forward(const moe_layer *k, const fl_tensor *x, int groups, float aux_weight,
                      moe_acts *a) {
  fl_device *dev = k->dev;
  const device_ops *op = dev->ops;
  moe_scratch *S = k->scratch;
  int T;
  fl_status status = check_x(k, x, groups, &T);
  if (status != FL_OK) return status;
  const int H = k->cfg.hidden, E = k->cfg.experts;
  nn_param *router = &k->params[0];

  /* Route on the host. */
  int64_t lshape[2] = {T, E};
  FL_CHECK(tensor_ensure(&S->logits, dev, 2, lshape));
  FL_CHECK(op->gemm(dev, false, true, T, E, H, 1.0f, x->data, H, router->value.data, H, 0.0f,
                    S->logits.data, E));
  FL_CHECK(ensure_host(S, (size_t)T * E));
  FL_CHECK(op->to_host(dev, S->host, S->logits.data, (size_t)T * E * sizeof(float)));
  FL_CHECK(moe_route_compute(&k->cfg, S->host, T, groups, &a->route));
  /* The slots and each expert's rows are GEMM dimensions: they must be ints. */
  if ((int64_t)E * groups * a->route.capacity > INT32_MAX / 2)
    FL_CHECK(fl_set_error(FL_EINVAL, "moe: %d experts x %d groups x capacity %d slots are too "
                          "many", E, groups, a->route.capacity));
  a->aux_weight = aux_weight;
  a->aux_loss = a->route.balance * aux_weight;
  const geom G = geom_of(k, T, &a->route);

  /* The slot tables on the device: empty slots read and write row T. */
  int64_t sshape[1] = {G.slots}, bshape[2] = {G.slots, H};
  int64_t eshape[3] = {G.El, G.rows, H}, fshape[3] = {G.El, G.rows, G.F};
  FL_CHECK(tensor_ensure(&a->ids, dev, 1, sshape));
  FL_CHECK(tensor_ensure(&a->gates, dev, 1, sshape));
  FL_CHECK(ensure_host(S, (size_t)G.slots));
  for (int s = 0; s < G.slots; s++)
    S->host[s] = a->route.slot_token[s] < 0 ? (float)T : (float)a->route.slot_token[s];
  FL_CHECK(op->from_host(dev, a->ids.data, S->host, (size_t)G.slots * sizeof(float)));
  FL_CHECK(op->from_host(dev, a->gates.data, a->route.slot_gate, (size_t)G.slots * sizeof(float)));

  /* Dispatch. */
  FL_CHECK(tensor_ensure(&S->buf_a, dev, 2, bshape));
  FL_CHECK(tensor_ensure(&S->buf_b, dev, 2, bshape));
  FL_CHECK(tensor_ensure(&a->expert_in, dev, 3, eshape));
  FL_CHECK(tensor_ensure(&a->h1, dev, 3, fshape));
  FL_CHECK(tensor_ensure(&a->act, dev, 3, fshape));
  FL_CHECK(tensor_ensure(&a->back, dev, 2, bshape));
  FL_CHECK(tensor_ensure(&a->y, dev, x->ndim, x->shape));
  FL_CHECK(extend(k, x->data, T));
  FL_CHECK(op->embedding_forward(dev, (size_t)G.slots, H, T + 1, a->ids.data, S->ext.data,
                                 S->buf_a.data));
  FL_CHECK(exchange(k, &G, false, &S->buf_a, &S->buf_b, &a->expert_in));

  /* The local experts, each on its R rows; outputs into buf_a as [El, ep, g*cap, H]. */
  for (int e = 0; e < G.El; e++) {
    size_t rh = (size_t)e * G.rows * H, rf = (size_t)e * G.rows * G.F;
    FL_CHECK(op->gemm(dev, false, true, G.rows, G.F, H, 1.0f, a->expert_in.data + rh, H,
                      expert_param(k, e, MOE_FC1_W)->value.data, H, 0.0f, a->h1.data + rf, G.F));
    FL_CHECK(op->bias_add_rows(dev, G.rows, G.F, expert_param(k, e, MOE_FC1_B)->value.data,
                               a->h1.data + rf));
    FL_CHECK(op->gelu_forward(dev, (size_t)G.rows * G.F, a->h1.data + rf, a->act.data + rf));
    FL_CHECK(op->gemm(dev, false, true, G.rows, H, G.F, 1.0f, a->act.data + rf, G.F,
                      expert_param(k, e, MOE_FC2_W)->value.data, G.F, 0.0f, S->buf_a.data + rh, H));
    FL_CHECK(op->bias_add_rows(dev, G.rows, H, expert_param(k, e, MOE_FC2_B)->value.data,
                               S->buf_a.data + rh));
  }
  FL_CHECK(exchange(k, &G, true, &S->buf_a, &S->buf_b, &a->back));

  /* Combine: each slot's output times its gate, added onto its token. */
  FL_CHECK(scale_rows(k, &G, a->gates.data, a->back.data, S->buf_a.data));
  FL_CHECK(op->memset0(dev, S->ext.data, S->ext.numel * sizeof(float)));
  FL_CHECK(op->embedding_backward(dev, (size_t)G.slots, H, T + 1, a->ids.data, S->buf_a.data,
                                  S->ext.data));
  FL_CHECK(op->copy(dev, a->y.data, S->ext.data, (size_t)T * H * sizeof(float)));
cleanup:
  return status;
}

fl_status moe_backward(const moe_layer *k, const fl_tensor *x, const moe_acts *a,
                       const fl_tensor *dy, fl_tensor *dx) {
  fl_device *dev = k->dev;
  const device_ops *op = dev->ops;
  moe_scratch *S = k->scratch;
  int T;
  if (!a || a->route.tokens == 0) return fl_set_error(FL_ESTATE, "moe: backward without a forward");
  fl_status status = check_x(k, x, a->route.groups, &T);
  if (status != FL_OK) return status;
  if (a->route.tokens != T || !dy || dy->numel != x->numel || dy->dev != dev)
    return fl_set_error(FL_EINVAL, "moe: backward of %d rows after a forward of %d, or dy of "
                        "another shape", T, a->route.tokens);
  const int H = k->cfg.hidden, E = k->cfg.experts;
  const geom G = geom_of(k, T, &a->route);
  nn_param *router = &k->params[0];
  int64_t sshape[1] = {G.slots}, bshape[2] = {G.slots, H}, fshape[3] = {G.El, G.rows, G.F};
  int64_t lshape[2] = {T, E};
  FL_CHECK(tensor_ensure(dx, dev, x->ndim, x->shape));
  FL_CHECK(tensor_ensure(&S->buf_a, dev, 2, bshape));
  FL_CHECK(tensor_ensure(&S->buf_b, dev, 2, bshape));
  FL_CHECK(tensor_ensure(&S->d_ffn, dev, 3, fshape));
  FL_CHECK(tensor_ensure(&S->dgate, dev, 1, sshape));
  FL_CHECK(tensor_ensure(&S->logits, dev, 2, lshape));

  /* Combine's backward: the slots' output gradients and the gates'. */
  FL_CHECK(extend(k, dy->data, T));
  FL_CHECK(op->embedding_forward(dev, (size_t)G.slots, H, T + 1, a->ids.data, S->ext.data,
                                 S->buf_a.data));
  FL_CHECK(op->gemm_batched(dev, false, true, 1, 1, H, 1.0f, S->buf_a.data, H, (size_t)H,
                            a->back.data, H, (size_t)H, 0.0f, S->dgate.data, 1, 1, G.slots));
  FL_CHECK(scale_rows(k, &G, a->gates.data, S->buf_a.data, S->buf_b.data));
  /* To the experts: their output gradients, as [El, ep, g*cap, H] in buf_b. */
  FL_CHECK(exchange(k, &G, false, &S->buf_b, &S->buf_a, &S->buf_b));
  for (int e = 0; e < G.El; e++) {
    size_t rh = (size_t)e * G.rows * H, rf = (size_t)e * G.rows * G.F;
    const float *d_out = S->buf_b.data + rh;
    FL_CHECK(op->bias_grad_rows(dev, G.rows, H, d_out, expert_param(k, e, MOE_FC2_B)->grad.data));
    FL_CHECK(op->gemm(dev, true, false, H, G.F, G.rows, 1.0f, d_out, H, a->act.data + rf, G.F,
                      1.0f, expert_param(k, e, MOE_FC2_W)->grad.data, G.F));
    FL_CHECK(op->gemm(dev, false, false, G.rows, G.F, H, 1.0f, d_out, H,
                      expert_param(k, e, MOE_FC2_W)->value.data, G.F, 0.0f, S->d_ffn.data + rf,
                      G.F));
    FL_CHECK(op->gelu_backward(dev, (size_t)G.rows * G.F, a->h1.data + rf, S->d_ffn.data + rf,
                               S->d_ffn.data + rf));
    FL_CHECK(op->gemm(dev, true, false, G.F, H, G.rows, 1.0f, S->d_ffn.data + rf, G.F,
                      a->expert_in.data + rh, H, 1.0f,
                      expert_param(k, e, MOE_FC1_W)->grad.data, H));
    FL_CHECK(op->bias_grad_rows(dev, G.rows, G.F, S->d_ffn.data + rf,
                                expert_param(k, e, MOE_FC1_B)->grad.data));
    FL_CHECK(op->gemm(dev, false, false, G.rows, H, G.F, 1.0f, S->d_ffn.data + rf, G.F,
                      expert_param(k, e, MOE_FC1_W)->value.data, H, 0.0f, S->buf_a.data + rh, H));
  }
  /* Back to the tokens' ranks, then onto the tokens. */
  FL_CHECK(exchange(k, &G, true, &S->buf_a, &S->buf_b, &S->buf_a));
  FL_CHECK(op->memset0(dev, S->ext.data, S->ext.numel * sizeof(float)));
  FL_CHECK(op->embedding_backward(dev, (size_t)G.slots, H, T + 1, a->ids.data, S->buf_a.data,
                                  S->ext.data));
  FL_CHECK(op->copy(dev, dx->data, S->ext.data, (size_t)T * H * sizeof(float)));

  /* The router: gate and balancing gradients to the logits on the host, then Wr and x. */
  size_t nl = (size_t)T * E;
  FL_CHECK(ensure_host(S, nl + (size_t)G.slots));
  FL_CHECK(op->to_host(dev, S->host + nl, S->dgate.data, (size_t)G.slots * sizeof(float)));
  FL_CHECK(moe_route_backward(&k->cfg, &a->route, S->host + nl, a->aux_weight, S->host));
  FL_CHECK(op->from_host(dev, S->logits.data, S->host, nl * sizeof(float)));
  FL_CHECK(op->gemm(dev, true, false, E, H, T, 1.0f, S->logits.data, E, x->data, H, 1.0f,
                    router->grad.data, H));
  FL_CHECK(op->gemm(dev, false, false, T, H, E, 1.0f, S->logits.data, E, router->value.data, H,
                    1.0f, dx->data, H));
cleanup:
  return status;
}

void moe_acts_release(moe_acts *a) {
  moe_route_release(&a->route);
  tensor_release(&a->ids);
  tensor_release(&a->gates);
  tensor_release(&a->expert_in);
  tensor_release(&a->h1);
  tensor_release(&a->act);
  tensor_release(&a->back);
  tensor_release(&a->y);
}

size_t moe_acts_bytes(const moe_acts *a) {
  const fl_tensor *t[] = {&a->ids, &a->gates, &a->expert_in, &a->h1, &a->act, &a->back, &a->y};
  size_t bytes = 0;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) bytes += t[i]->numel * sizeof(float);
  return bytes;
}

void moe_scratch_release(moe_scratch *s) {
  tensor_release(&s->ext);
  tensor_release(&s->buf_a);
  tensor_release(&s->buf_b);
  tensor_release(&s->d_ffn);
  tensor_release(&s->logits);
  tensor_release(&s->dgate);
  common_free(s->host);
  s->host = NULL;
  s->host_cap = 0;
}

size_t moe_alltoall_bytes(const moe_config *cfg, int ep_size, int rows, int groups) {
  if (ep_size < 2 || groups < 1) return 0;
  size_t slots = (size_t)cfg->experts * groups * moe_capacity(cfg, rows / groups);
  return 4 * slots * (size_t)cfg->hidden * sizeof(float) / (size_t)ep_size * (size_t)(ep_size - 1);
}
