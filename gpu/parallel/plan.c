/*
 * gpu/parallel/plan.c: the automatic plan's search (see gpu/parallel/plan.h for the model).
 *
 * A grid and m fix the micro-batch's samples and the tensor-parallel degree, so every
 * contiguous range of units has one cost (its forward and backward, its blocks' allreduces,
 * its sends) and, at each pipeline position, one memory: prefix sums make both O(1), and the
 * cut's dynamic program runs over them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/plan.h"

#define DEFAULT_MAX_MICROBATCHES 32

static double cost_at(plan_cost c, double rows) { return c.fixed_s + rows * c.row_s; }

static bool bad_number(double x) { return !(x >= 0) || !isfinite(x); }

/* Forward and backward of unit u at tp index k and `rows` samples: measured when the profile
 * has that size, else the fitted line. */
static double unit_compute(const plan_problem *p, const plan_unit *un, int k, double rows) {
  for (int i = 0; i < p->nrows; i++)
    if (p->rows[i] == rows) return un->fwd_at[k][i] + un->bwd_at[k][i];
  return cost_at(un->fwd[k], rows) + cost_at(un->bwd[k], rows);
}

fl_status plan_problem_check(const plan_problem *p) {
  if (!p) return fl_set_error(FL_EINVAL, "plan: NULL problem");
  if (p->world < 1) return fl_set_error(FL_EINVAL, "plan: world of %d ranks (needs at least 1)", p->world);
  if (p->batch < 1 || p->batch % p->world)
    return fl_set_error(FL_EINVAL, "plan: batch %d is not a positive multiple of the world's %d ranks", p->batch,
                        p->world);
  if (p->units < 1 || p->units > PLAN_MAX_UNITS || !p->unit)
    return fl_set_error(FL_EINVAL, "plan: %d units in the profile (needs 1 to %d)", p->units, PLAN_MAX_UNITS);
  if (p->ntp < 1 || p->ntp > PLAN_MAX_TPS)
    return fl_set_error(FL_EINVAL, "plan: %d tensor-parallel degrees in the profile (needs 1 to %d)", p->ntp,
                        PLAN_MAX_TPS);
  if (p->tp[0] != 1) return fl_set_error(FL_EINVAL, "plan: the profile's first tensor-parallel degree is %d, not 1", p->tp[0]);
  for (int k = 1; k < p->ntp; k++)
    if (p->tp[k] <= p->tp[k - 1])
      return fl_set_error(FL_EINVAL, "plan: tensor-parallel degrees must increase (%d after %d)", p->tp[k], p->tp[k - 1]);
  if (p->max_microbatches < 0)
    return fl_set_error(FL_EINVAL, "plan: max_microbatches %d is negative", p->max_microbatches);
  if (bad_number(p->memory_bytes) || bad_number(p->state_copies) || bad_number(p->optimizer_s_per_byte) ||
      bad_number(p->step_fixed_s) || bad_number(p->microbatch_s))
    return fl_set_error(FL_EINVAL, "plan: memory %g bytes, state copies %g, optimizer %g s/byte and step %g s must "
                        "be finite and >= 0", p->memory_bytes, p->state_copies, p->optimizer_s_per_byte,
                        p->step_fixed_s);
  if (bad_number(p->cores)) return fl_set_error(FL_EINVAL, "plan: %g cores", p->cores);
  if (p->nrows < 0 || p->nrows > PLAN_MAX_ROWS)
    return fl_set_error(FL_EINVAL, "plan: %d measured micro-batch sizes (0 to %d)", p->nrows, PLAN_MAX_ROWS);
  if (!p->allreduce_s || !p->send_s)
    return fl_set_error(FL_EINVAL, "plan: the communication model (allreduce_s, send_s) is missing");
  for (int u = 0; u < p->units; u++) {
    const plan_unit *un = &p->unit[u];
    if (bad_number(un->out_row_bytes) || un->tp_allreduces < 0)
      return fl_set_error(FL_EINVAL, "plan: unit %d has output %g bytes a sample and %d allreduces", u,
                          un->out_row_bytes, un->tp_allreduces);
    for (int k = 0; k < p->ntp; k++)
      if (bad_number(un->fwd[k].fixed_s) || bad_number(un->fwd[k].row_s) || bad_number(un->bwd[k].fixed_s) ||
          bad_number(un->bwd[k].row_s) || bad_number(un->param_bytes[k]) || bad_number(un->act_row_bytes[k]))
        return fl_set_error(FL_EINVAL, "plan: unit %d at tp %d has a negative or non-finite time or size", u,
                            p->tp[k]);
    for (int k = 0; k < p->ntp; k++)
      for (int i = 0; i < p->nrows; i++)
        if (bad_number(un->fwd_at[k][i]) || bad_number(un->bwd_at[k][i]))
          return fl_set_error(FL_EINVAL, "plan: unit %d at tp %d and %d samples has a negative or non-finite time",
                              u, p->tp[k], p->rows[i]);
  }
  return FL_OK;
}

/* ---- one grid and m: range costs by prefix sums ------------------------------------------- */

typedef struct grid_model {
  const plan_problem *p;
  pp_grid g;
  int m, n;
  double rows;
  double *compute, *comm, *params, *act; /* prefix sums over units, n + 1 each */
  double compute_total;                  /* one rank's forward and backward of every unit, one micro-batch */
} grid_model;

static void grid_model_free(grid_model *gm) {
  common_free(gm->compute);
  gm->compute = gm->comm = gm->params = gm->act = NULL;
}

static int tp_index(const plan_problem *p, int tp) {
  for (int k = 0; k < p->ntp; k++)
    if (p->tp[k] == tp) return k;
  return -1;
}

static fl_status check_grid(const plan_problem *p, pp_grid g, int m) {
  fl_status s = pp_grid_check(g, p->world);
  if (s != FL_OK) return s;
  if (tp_index(p, g.tp) < 0) return fl_set_error(FL_EINVAL, "plan: tp %d is not in the profile", g.tp);
  if (g.pp > p->units || g.pp > PLAN_MAX_STAGES)
    return fl_set_error(FL_EINVAL, "plan: %d pipeline stages but %d units (and at most %d stages)", g.pp, p->units,
                        PLAN_MAX_STAGES);
  int replica = p->batch / g.dp;
  if (m < 1 || replica % m)
    return fl_set_error(FL_EINVAL, "plan: %d micro-batches do not divide the replica's batch of %d", m, replica);
  return FL_OK;
}

static fl_status grid_model_init(const plan_problem *p, pp_grid g, int m, grid_model *gm) {
  *gm = (grid_model){.p = p, .g = g, .m = m, .n = p->units, .rows = (double)p->batch / g.dp / m};
  size_t w = (size_t)p->units + 1;
  gm->compute = common_calloc(4 * w, sizeof(double));
  if (!gm->compute) return FL_ERR(FL_ENOMEM, "out of memory for a plan of %d units", p->units);
  gm->comm = gm->compute + w;
  gm->params = gm->comm + w;
  gm->act = gm->params + w;
  int k = tp_index(p, g.tp);
  for (int u = 0; u < p->units; u++) {
    const plan_unit *un = &p->unit[u];
    double c = unit_compute(p, un, k, gm->rows);
    /* Megatron's g in forward and f in backward: the same allreduces both ways. */
    double tc = g.tp > 1 && un->tp_allreduces
                    ? 2.0 * un->tp_allreduces * p->allreduce_s(p->user, g.tp, gm->rows * un->out_row_bytes)
                    : 0;
    gm->compute[u + 1] = gm->compute[u] + c;
    gm->comm[u + 1] = gm->comm[u] + tc;
    gm->params[u + 1] = gm->params[u] + un->param_bytes[k];
    gm->act[u + 1] = gm->act[u] + un->act_row_bytes[k] * gm->rows;
  }
  gm->compute_total = gm->compute[p->units];
  return FL_OK;
}

/* f_s + b_s of units [i, j): compute, the blocks' allreduces, the output sent on (not by the
 * last stage) and the input gradient sent back (not by the first). */
static double range_cost(const grid_model *gm, int i, int j) {
  const plan_problem *p = gm->p;
  double c = gm->compute[j] - gm->compute[i] + gm->comm[j] - gm->comm[i] + p->microbatch_s;
  if (j < gm->n) c += p->send_s(p->user, gm->rows * p->unit[j - 1].out_row_bytes);
  if (i > 0) c += p->send_s(p->user, gm->rows * p->unit[i - 1].out_row_bytes);
  return c;
}

static double range_memory(const grid_model *gm, int i, int j, int position) {
  int inflight = gm->g.pp - position < gm->m ? gm->g.pp - position : gm->m;
  return (gm->params[j] - gm->params[i]) * (1 + gm->p->state_copies) + inflight * (gm->act[j] - gm->act[i]);
}

static bool fits(const grid_model *gm, int i, int j, int position) {
  return gm->p->memory_bytes <= 0 || range_memory(gm, i, j, position) <= gm->p->memory_bytes;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The best cut (see plan.h) into bounds; FL_ELIMIT when none fits the memory. */
static fl_status best_cut(const grid_model *gm, int *bounds, double *path) {
  int n = gm->n, P = gm->g.pp;
  size_t w = (size_t)n + 1, ncand = 0;
  fl_status status = FL_OK;
  double *cand = common_malloc(w * w * sizeof *cand);
  double *best = common_malloc((size_t)(P + 1) * w * sizeof *best);
  int *from = common_malloc((size_t)(P + 1) * w * sizeof *from);
  if (!cand || !best || !from) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory cutting %d units", n));
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j <= n; j++) cand[ncand++] = range_cost(gm, i, j);
  qsort(cand, ncand, sizeof *cand, compare_double);
  double best_obj = INFINITY;
  /* With one micro-batch the objective is the sum alone: only the loosest bound matters. */
  size_t first = gm->m == 1 ? ncand - 1 : 0;
  for (size_t c = first; c < ncand; c++) {
    double T = cand[c];
    if (c > first && cand[c - 1] == T) continue;
    if ((gm->m - 1) * T >= best_obj) break;
    for (size_t x = 0; x < (size_t)(P + 1) * w; x++) best[x] = INFINITY;
    best[0] = 0; /* no stage covers no unit */
    for (int k = 1; k <= P; k++)
      for (int j = k; j <= n - (P - k); j++)
        for (int i = k - 1; i < j; i++) {
          double before = best[(size_t)(k - 1) * w + i];
          if (before == INFINITY) continue;
          double rc = range_cost(gm, i, j);
          if (rc > T || !fits(gm, i, j, k - 1)) continue;
          if (before + rc < best[(size_t)k * w + j]) {
            best[(size_t)k * w + j] = before + rc;
            from[(size_t)k * w + j] = i;
          }
        }
    double sum = best[(size_t)P * w + n];
    if (sum == INFINITY) continue;
    int cut[PLAN_MAX_STAGES + 1];
    cut[P] = n;
    for (int k = P; k >= 1; k--) cut[k - 1] = from[(size_t)k * w + cut[k]];
    double worst = 0;
    for (int k = 0; k < P; k++) worst = fmax(worst, range_cost(gm, cut[k], cut[k + 1]));
    double obj = sum + (gm->m - 1) * worst;
    if (obj < best_obj) {
      best_obj = obj;
      memcpy(bounds, cut, (size_t)(P + 1) * sizeof *bounds);
    }
  }
  if (best_obj == INFINITY)
    FL_CHECK(fl_set_error(FL_ELIMIT, "plan: no cut of %d units into %d stages fits %.1f MiB a rank (dp %d x tp %d, "
                          "m %d)", n, P, gm->p->memory_bytes / (1 << 20), gm->g.dp, gm->g.tp, gm->m));
  *path = best_obj;
cleanup:
  common_free(cand);
  common_free(best);
  common_free(from);
  return status;
}

/* Fills out for the cut in bounds (checked); FL_ELIMIT when it does not fit the memory. */
static fl_status predict(const grid_model *gm, const int *bounds, plan_choice *out) {
  const plan_problem *p = gm->p;
  int P = gm->g.pp;
  memset(out, 0, sizeof *out);
  out->grid = gm->g;
  out->schedule = PP_1F1B;
  out->microbatches = gm->m;
  memcpy(out->bounds, bounds, (size_t)(P + 1) * sizeof *bounds);
  double sum = 0, worst = 0, params = 0, mem = 0;
  bool fit = true;
  for (int k = 0; k < P; k++) {
    double c = range_cost(gm, bounds[k], bounds[k + 1]);
    sum += c;
    worst = fmax(worst, c);
    params = fmax(params, gm->params[bounds[k + 1]] - gm->params[bounds[k]]);
    mem = fmax(mem, range_memory(gm, bounds[k], bounds[k + 1], k));
    fit = fit && fits(gm, bounds[k], bounds[k + 1], k);
  }
  out->path_s = sum + (gm->m - 1) * worst;
  out->slowest_stage_s = worst;
  out->pipeline_s = out->path_s;
  double share = 1;
  if (p->cores > 0) {
    double work = gm->compute_total + gm->g.pp * p->microbatch_s; /* a micro-batch through every stage */
    double spread = (double)gm->g.dp * gm->g.tp * gm->m * work / p->cores;
    out->pipeline_s = fmax(out->path_s, spread);
    share = fmax(1.0, (double)p->world / p->cores);
  }
  out->allreduce_s = gm->g.dp > 1 ? p->allreduce_s(p->user, gm->g.dp, params) : 0;
  out->optimizer_s = p->optimizer_s_per_byte * params * share;
  out->step_s = out->pipeline_s + out->allreduce_s + out->optimizer_s + p->step_fixed_s;
  out->memory_bytes = mem;
  if (!fit)
    return fl_set_error(FL_ELIMIT, "plan: dp %d x tp %d x pp %d needs %.1f MiB a rank, above the %.1f MiB limit",
                        gm->g.dp, gm->g.tp, gm->g.pp, mem / (1 << 20), p->memory_bytes / (1 << 20));
  return FL_OK;
}

static fl_status check_bounds(const plan_problem *p, pp_grid g, const int *bounds) {
  if (bounds[0] != 0 || bounds[g.pp] != p->units)
    return fl_set_error(FL_EINVAL, "plan: the cut must start at unit 0 and end at %d", p->units);
  for (int k = 0; k < g.pp; k++)
    if (bounds[k + 1] <= bounds[k])
      return fl_set_error(FL_EINVAL, "plan: stage %d of the cut is empty (units %d..%d)", k, bounds[k], bounds[k + 1]);
  return FL_OK;
}

fl_status plan_cut(const plan_problem *p, pp_grid grid, int microbatches, int *bounds, double *path_s) {
  if (!bounds || !path_s) return fl_set_error(FL_EINVAL, "plan_cut: NULL out-parameter");
  fl_status status = plan_problem_check(p);
  if (status != FL_OK) return status;
  if ((status = check_grid(p, grid, microbatches)) != FL_OK) return status;
  grid_model gm;
  if ((status = grid_model_init(p, grid, microbatches, &gm)) != FL_OK) return status;
  status = best_cut(&gm, bounds, path_s);
  grid_model_free(&gm);
  return status;
}

fl_status plan_evaluate(const plan_problem *p, pp_grid grid, int microbatches, const int *bounds, plan_choice *out) {
  if (!out) return fl_set_error(FL_EINVAL, "plan_evaluate: NULL out-parameter");
  fl_status status = plan_problem_check(p);
  if (status != FL_OK) return status;
  if ((status = check_grid(p, grid, microbatches)) != FL_OK) return status;
  grid_model gm;
  int cut[PLAN_MAX_STAGES + 1];
  double path;
  if ((status = grid_model_init(p, grid, microbatches, &gm)) != FL_OK) return status;
  if (bounds) {
    status = check_bounds(p, grid, bounds);
    if (status == FL_OK) memcpy(cut, bounds, (size_t)(grid.pp + 1) * sizeof *cut);
  } else {
    status = best_cut(&gm, cut, &path);
  }
  if (status == FL_OK) status = predict(&gm, cut, out);
  grid_model_free(&gm);
  return status;
}

static int compare_choice(const void *a, const void *b) {
  const plan_choice *x = a, *y = b;
  if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
  /* Ties (same prediction): fewer stages and less tensor parallelism first. */
  if (x->grid.pp != y->grid.pp) return x->grid.pp - y->grid.pp;
  return x->grid.tp - y->grid.tp;
}

fl_status plan_search(const plan_problem *p, plan_choice *out, size_t max_out, size_t *n_out) {
  if (!out || !n_out || max_out == 0) return fl_set_error(FL_EINVAL, "plan_search: no room for a plan");
  fl_status status = plan_problem_check(p);
  if (status != FL_OK) return status;
  int max_m = p->max_microbatches ? p->max_microbatches : DEFAULT_MAX_MICROBATCHES;
  size_t cap = 0;
  for (int dp = 1; dp <= p->world; dp++) cap += p->world % dp == 0 ? (size_t)p->ntp : 0;
  plan_choice *all = common_calloc(cap, sizeof *all);
  if (!all) return FL_ERR(FL_ENOMEM, "out of memory for %zu plans", cap);
  size_t n = 0;
  for (int dp = 1; dp <= p->world; dp++) {
    if (p->world % dp) continue;
    for (int k = 0; k < p->ntp; k++) {
      int tp = p->tp[k];
      if ((p->world / dp) % tp) continue;
      pp_grid g = {dp, tp, p->world / dp / tp};
      if (g.pp > p->units || g.pp > PLAN_MAX_STAGES) continue;
      int replica = p->batch / dp;
      bool found = false;
      for (int m = 1; m <= max_m && m <= replica; m++) {
        if (replica % m) continue;
        plan_choice c;
        fl_status s = plan_evaluate(p, g, m, NULL, &c);
        if (s == FL_ELIMIT) continue; /* this m does not fit the memory */
        if (s != FL_OK) {
          status = s;
          goto cleanup;
        }
        if (!found || c.step_s < all[n].step_s) all[n] = c;
        found = true;
      }
      if (found) n++;
    }
  }
  if (n == 0) {
    status = fl_set_error(FL_ELIMIT, "plan: no plan of %d ranks (up to %d micro-batches) fits %.2f MiB a rank: give "
                          "more memory or more ranks", p->world, max_m, p->memory_bytes / (1 << 20));
    goto cleanup;
  }
  qsort(all, n, sizeof *all, compare_choice);
  *n_out = n < max_out ? n : max_out;
  memcpy(out, all, *n_out * sizeof *out);
cleanup:
  common_free(all);
  return status;
}

int plan_microbatch_sizes(int world, int batch, int max_microbatches, int rows[PLAN_MAX_ROWS]) {
  int max_m = max_microbatches ? max_microbatches : DEFAULT_MAX_MICROBATCHES, n = 0;
  if (world < 1 || batch < 1) return 0;
  /* Every size is a divisor of batch: walk them in order and keep those some (dp, m) makes. */
  int all[1024];
  for (int r = 1; r <= batch && n < 1024; r++) {
    if (batch % r) continue;
    bool made = false;
    for (int dp = 1; dp <= world && !made; dp++)
      if (world % dp == 0 && batch % dp == 0 && (batch / dp) % r == 0 && (batch / dp) / r <= max_m) made = true;
    if (made) all[n++] = r;
  }
  if (n <= PLAN_MAX_ROWS) {
    memcpy(rows, all, (size_t)n * sizeof *rows);
    return n;
  }
  for (int i = 0; i < PLAN_MAX_ROWS; i++) rows[i] = all[(int)((double)i * (n - 1) / (PLAN_MAX_ROWS - 1) + 0.5)];
  return PLAN_MAX_ROWS;
}

void plan_choice_format(const plan_choice *c, char *buf, size_t size) {
  int len = snprintf(buf, size, "dp %d x tp %d x pp %d, %s, m %d, cut ", c->grid.dp, c->grid.tp, c->grid.pp,
                     pp_schedule_name(c->schedule), c->microbatches);
  for (int k = 0; k <= c->grid.pp && len >= 0 && (size_t)len < size; k++)
    len += snprintf(buf + len, size - (size_t)len, "%s%d", k ? "|" : "", c->bounds[k]);
  if (len >= 0 && (size_t)len < size)
    snprintf(buf + len, size - (size_t)len, ": %.2f ms (pipeline %.2f, allreduce %.2f, optimizer %.2f), %.2f MiB a rank",
             c->step_s * 1e3, c->pipeline_s * 1e3, c->allreduce_s * 1e3, c->optimizer_s * 1e3,
             c->memory_bytes / (1 << 20));
}
