/*
 * gpu/parallel/moe_route.c: the mixture of experts' router on the host (gpu/parallel/moe.h):
 * softmax, top-k choice, capacity, the balancing loss, and their backward to the logits.
 *
 * Routing is data-dependent bookkeeping over [tokens, experts] numbers, small beside the
 * experts' products, so it runs on the host in double: both devices then route identically
 * and no new device operation is needed. The slot tables it makes drive the device's row
 * gather and scatter-add.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/moe.h"

fl_status moe_config_check(const moe_config *cfg, int ep_size) {
  if (!cfg) return fl_set_error(FL_EINVAL, "moe: NULL config");
  const struct {
    const char *name;
    int value;
  } positive[] = {{"hidden", cfg->hidden}, {"ffn", cfg->ffn}, {"experts", cfg->experts},
                  {"top_k", cfg->top_k}};
  for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
    if (positive[i].value < 1)
      return fl_set_error(FL_EINVAL, "moe: %s is %d, must be at least 1", positive[i].name,
                          positive[i].value);
  if (cfg->top_k > cfg->experts)
    return fl_set_error(FL_EINVAL, "moe: top_k (%d) is more than the %d experts", cfg->top_k,
                        cfg->experts);
  if (!(cfg->capacity_factor > 0.0f) || !isfinite(cfg->capacity_factor))
    return fl_set_error(FL_EINVAL, "moe: capacity_factor is %g, must be positive",
                        (double)cfg->capacity_factor);
  if (!(cfg->balance_alpha >= 0.0f) || !isfinite(cfg->balance_alpha))
    return fl_set_error(FL_EINVAL, "moe: balance_alpha is %g, must be at least 0",
                        (double)cfg->balance_alpha);
  if (ep_size < 1)
    return fl_set_error(FL_EINVAL, "moe: expert-parallel size %d, must be at least 1", ep_size);
  if (cfg->experts % ep_size)
    return fl_set_error(FL_EINVAL, "moe: experts (%d) must be a multiple of the "
                        "expert-parallel size %d", cfg->experts, ep_size);
  return FL_OK;
}

int moe_capacity(const moe_config *cfg, int group_tokens) {
  double c = ceil((double)cfg->capacity_factor * group_tokens * cfg->top_k / cfg->experts);
  return c < 1 ? 1 : c > INT32_MAX / 2 ? INT32_MAX / 2 : (int)c;
}

void moe_route_release(moe_route *r) {
  common_free(r->slot_token);
  common_free(r->slot_gate);
  common_free(r->probs);
  common_free(r->choice);
  common_free(r->choice_slot);
  common_free(r->gate);
  common_free(r->frac);
  memset(r, 0, sizeof *r);
}

/* The top_k experts of one row of p, best first, ties to the lower index. */
static void top_k(const float *p, int experts, int k, int32_t *out) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < experts; e++) {
      bool taken = false;
      for (int i = 0; i < j; i++) taken |= out[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    out[j] = best;
  }
}

/* (Re)allocates r's arrays for the sizes set in it: a route lives for one forward. */
static fl_status route_alloc(moe_route *r) {
  size_t slots = (size_t)r->experts * r->groups * r->capacity;
  size_t tk = (size_t)r->tokens * r->top_k;
  moe_route sizes = *r;
  moe_route_release(r);
  r->tokens = sizes.tokens;
  r->groups = sizes.groups;
  r->experts = sizes.experts;
  r->top_k = sizes.top_k;
  r->capacity = sizes.capacity;
  r->slot_token = common_malloc(slots * sizeof *r->slot_token);
  r->slot_gate = common_calloc(slots, sizeof *r->slot_gate);
  r->probs = common_malloc((size_t)r->tokens * r->experts * sizeof *r->probs);
  r->choice = common_malloc(tk * sizeof *r->choice);
  r->choice_slot = common_malloc(tk * sizeof *r->choice_slot);
  r->gate = common_malloc(tk * sizeof *r->gate);
  r->frac = common_calloc((size_t)r->groups * r->experts, sizeof *r->frac);
  if (!r->slot_token || !r->slot_gate || !r->probs || !r->choice || !r->choice_slot ||
      !r->gate || !r->frac)
    return FL_ERR(FL_ENOMEM, "moe: out of memory for the routing of %d tokens", r->tokens);
  for (size_t i = 0; i < slots; i++) r->slot_token[i] = -1;
  return FL_OK;
}

fl_status moe_route_compute(const moe_config *cfg, const float *logits, int tokens, int groups,
                            moe_route *r) {
  fl_status st = moe_config_check(cfg, 1);
  if (st != FL_OK) return st;
  if (groups < 1 || tokens < 1 || tokens % groups)
    return fl_set_error(FL_EINVAL, "moe: %d tokens cannot be cut into %d equal routing groups",
                        tokens, groups);
  const int E = cfg->experts, k = cfg->top_k, gt = tokens / groups;
  r->tokens = tokens;
  r->groups = groups;
  r->experts = E;
  r->top_k = k;
  r->capacity = moe_capacity(cfg, gt);
  st = route_alloc(r);
  if (st != FL_OK) return st;
  const int cap = r->capacity;
  r->balance = 0;
  r->dropped = 0;

  /* Softmax per token, in double. */
  for (int t = 0; t < tokens; t++) {
    const float *l = logits + (size_t)t * E;
    float *p = r->probs + (size_t)t * E;
    double top = l[0], sum = 0;
    for (int e = 1; e < E; e++) top = fmax(top, l[e]);
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - top);
    for (int e = 0; e < E; e++) p[e] = (float)(exp((double)l[e] - top) / sum);
    int32_t *ch = r->choice + (size_t)t * k;
    top_k(p, E, k, ch);
    float *g = r->gate + (size_t)t * k;
    double chosen = 0;
    for (int j = 0; j < k; j++) chosen += p[ch[j]];
    for (int j = 0; j < k; j++) g[j] = k == 1 ? p[ch[0]] : (float)(p[ch[j]] / chosen);
  }

  /* Capacity per group: every token's first choice in token order, then the second ones. */
  int *fill = common_calloc((size_t)E, sizeof *fill);
  if (!fill) return FL_ERR(FL_ENOMEM, "moe: out of memory");
  for (int grp = 0; grp < groups; grp++) {
    memset(fill, 0, (size_t)E * sizeof *fill);
    for (int j = 0; j < k; j++)
      for (int t = grp * gt; t < (grp + 1) * gt; t++) {
        size_t c = (size_t)t * k + j;
        int e = r->choice[c];
        if (fill[e] >= cap) {
          r->choice_slot[c] = -1;
          r->dropped++;
          continue;
        }
        int slot = (e * groups + grp) * cap + fill[e]++;
        r->choice_slot[c] = slot;
        r->slot_token[slot] = t;
        r->slot_gate[slot] = r->gate[c];
      }
    /* Switch's balancing loss: alpha * E * sum_e f_e P_e over the group. */
    float *f = r->frac + (size_t)grp * E;
    for (int t = grp * gt; t < (grp + 1) * gt; t++) f[r->choice[(size_t)t * k]] += 1.0f;
    double sum = 0;
    for (int e = 0; e < E; e++) {
      f[e] /= (float)gt;
      double P = 0;
      for (int t = grp * gt; t < (grp + 1) * gt; t++) P += r->probs[(size_t)t * E + e];
      sum += (double)f[e] * (P / gt);
    }
    r->balance += (double)cfg->balance_alpha * E * sum;
  }
  common_free(fill);
  return FL_OK;
}

fl_status moe_route_backward(const moe_config *cfg, const moe_route *r,
                             const float *dslot_gate, float aux_weight, float *dlogits) {
  const int E = r->experts, k = r->top_k, gt = r->tokens / r->groups;
  double *dp = common_malloc((size_t)E * sizeof *dp);
  if (!dp) return FL_ERR(FL_ENOMEM, "moe: out of memory");
  for (int t = 0; t < r->tokens; t++) {
    const float *p = r->probs + (size_t)t * E;
    const int32_t *ch = r->choice + (size_t)t * k;
    const int32_t *cs = r->choice_slot + (size_t)t * k;
    const float *g = r->gate + (size_t)t * k;
    /* The balancing loss: d/dp_e = weight * alpha * E * f_e / group_tokens. */
    const float *f = r->frac + (size_t)(t / gt) * E;
    double bal = (double)aux_weight * cfg->balance_alpha * E / gt;
    for (int e = 0; e < E; e++) dp[e] = bal * f[e];
    /* The gates: dropped choices had no output, so their gradient is 0. */
    if (k == 1) {
      if (cs[0] >= 0) dp[ch[0]] += dslot_gate[cs[0]];
    } else {
      /* g_j = p_j / s over the chosen: dp_j = (dg_j - sum_i dg_i g_i) / s. */
      double s = 0, dot = 0;
      for (int j = 0; j < k; j++) {
        s += p[ch[j]];
        if (cs[j] >= 0) dot += (double)dslot_gate[cs[j]] * g[j];
      }
      for (int j = 0; j < k; j++)
        dp[ch[j]] += ((cs[j] >= 0 ? dslot_gate[cs[j]] : 0.0) - dot) / s;
    }
    /* Softmax: dl_e = p_e (dp_e - sum_i dp_i p_i). */
    double dot = 0;
    for (int e = 0; e < E; e++) dot += dp[e] * p[e];
    for (int e = 0; e < E; e++) dlogits[(size_t)t * E + e] = (float)(p[e] * (dp[e] - dot));
  }
  common_free(dp);
  return FL_OK;
}
