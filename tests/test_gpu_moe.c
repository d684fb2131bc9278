/*
 * test_gpu_moe.c: the mixture-of-experts layer (gpu/parallel/moe.h) and its small model
 * (gpu/parallel/moe_model.h) on the cpu device.
 *
 * - Routing on hand-made logits: top-1 and top-2 choices, renormalised top-2 gates, ties,
 *   capacity per group (first choices before second ones) and dropping, the balancing loss.
 * - The router's backward (gates and balancing loss to the logits) and the whole layer's
 *   gradients (input, router, experts) against central differences.
 * - Expert parallelism: the model trained 3 steps on 2, 3 and 4 ranks (threads with host
 *   communicators), top-1 and top-2, equals one rank holding every expert that routes each
 *   rank's rows as its own groups: outputs, losses (with the balancing loss), drops, every
 *   gradient and the weights, to 1e-6 relative.
 * - With a GPU: the layer's forward and backward on cuda against the cpu (skipped without).
 * - Bad configs and calls.
 *
 * Whole tensors compare with err = max_i |got_i - want_i| / max_i |want_i| (as
 * test_gpu_tensor_parallel.c: the replicated gradients are summed in another order).
 */
#include "test_util.h"

#include <math.h>

#include "common/common.h"
#include "gpu/comm/comm.h"
#include "gpu/device/device.h"
#include "gpu/parallel/moe_model.h"

#include "gpu_test_data.h"
#include "rank_threads.h"

static double rel_max_err(const float *got, const float *want, size_t n) {
  double top = 0, err = 0;
  for (size_t i = 0; i < n; i++) {
    top = fmax(top, fabs(want[i]));
    err = fmax(err, fabs((double)got[i] - want[i]));
  }
  return top > 0 ? err / top : err;
}

static void expect_close(const float *got, const float *want, size_t n, double tol,
                         const char *what) {
  double e = rel_max_err(got, want, n);
  if (e > tol) {
    fprintf(stderr, "%s: relative error %.3g over %zu elements (tolerance %.1g)\n", what, e, n, tol);
    fail();
  }
}

static bool fd_close(double fd, double analytic) {
  return fabs(fd - analytic) <= 2e-3 + 2e-2 * fmax(fabs(fd), fabs(analytic));
}

static double softmax_at(const float *l, int E, int e) {
  double top = l[0], s = 0;
  for (int i = 1; i < E; i++) top = fmax(top, l[i]);
  for (int i = 0; i < E; i++) s += exp((double)l[i] - top);
  return exp((double)l[e] - top) / s;
}

/* ---- routing on hand-made logits ---------------------------------------------------------- */

static void test_top1_capacity_and_dropping(void **state) {
  (void)state;
  moe_config cfg = {.hidden = 4, .ffn = 4, .experts = 3, .top_k = 1, .capacity_factor = 1.0f,
                    .balance_alpha = 0.5f};
  /* capacity ceil(1 * 4 * 1 / 3) = 2: tokens 0, 1 and 2 want expert 0, the third is dropped;
   * token 3 ties experts 1 and 2 and takes the lower. */
  const float logits[4 * 3] = {2, 0, 0, 3, 1, 0, 1, 0, -1, 0, 1, 1};
  moe_route r = {0};
  assert_ok(moe_route_compute(&cfg, logits, 4, 1, &r));
  assert_int_equal(r.capacity, 2);
  assert_int_equal(moe_capacity(&cfg, 4), 2);
  const int want_choice[4] = {0, 0, 0, 1}, want_slot[4] = {0, 1, -1, 2};
  for (int t = 0; t < 4; t++) {
    assert_int_equal(r.choice[t], want_choice[t]);
    assert_int_equal(r.choice_slot[t], want_slot[t]);
    /* Switch: the gate is the router's probability, not renormalised. */
    assert_float_equal(r.gate[t], softmax_at(logits + 3 * t, 3, want_choice[t]), 1e-6);
  }
  const int want_token[6] = {0, 1, 3, -1, -1, -1};
  for (int s = 0; s < 6; s++) {
    assert_int_equal(r.slot_token[s], want_token[s]);
    if (want_token[s] < 0) assert_float_equal(r.slot_gate[s], 0.0f, 0);
  }
  assert_float_equal(r.slot_gate[1], r.gate[1], 0);
  assert_int_equal(r.dropped, 1);
  /* alpha * E * sum_e f_e P_e, f = (3/4, 1/4, 0). */
  double P[3] = {0}, f[3] = {0.75, 0.25, 0};
  for (int t = 0; t < 4; t++)
    for (int e = 0; e < 3; e++) P[e] += softmax_at(logits + 3 * t, 3, e) / 4;
  double want = 0.5 * 3 * (f[0] * P[0] + f[1] * P[1] + f[2] * P[2]);
  assert_float_equal(r.balance, want, 1e-6);
  for (int e = 0; e < 3; e++) assert_float_equal(r.frac[e], f[e], 1e-7);
  /* Four exchanges of the 3 x 2 slots of 4 floats, two thirds of them to other ranks. */
  assert_int_equal(moe_alltoall_bytes(&cfg, 3, 4, 1), 4 * 6 * 4 * sizeof(float) * 2 / 3);
  assert_int_equal(moe_alltoall_bytes(&cfg, 1, 4, 1), 0);
  moe_route_release(&r);
  moe_route_release(&r); /* twice is harmless */
}

static void test_top2_gates_second_choices_and_groups(void **state) {
  (void)state;
  moe_config cfg = {.hidden = 4, .ffn = 4, .experts = 4, .top_k = 2, .capacity_factor = 1.0f,
                    .balance_alpha = 0.01f};
  /* Two groups of 3 tokens: capacity ceil(3 * 2 / 4) = 2. Group 0: first choices 0, 0, 1,
   * second choices 1, 1, 0: the firsts fill expert 0 and take one place of expert 1, then
   * token 0's second choice takes expert 1's last place and tokens 1 and 2 lose theirs.
   * Group 1 fits: (3, 2), (2, 3), (1, 0). */
  const float logits[6 * 4] = {3, 2, 0, 0,  3, 2.5f, 0, -1, 1, 2, 0, 0,
                               0, 0, 1, 2,  0, 0, 2, 1,     1, 2, -1, -1};
  moe_route r = {0};
  assert_ok(moe_route_compute(&cfg, logits, 6, 2, &r));
  assert_int_equal(r.capacity, 2);
  const int want_choice[12] = {0, 1, 0, 1, 1, 0, 3, 2, 2, 3, 1, 0};
  /* slot = (expert * groups + group) * capacity + position */
  const int want_slot[12] = {0, 5, 1, -1, 4, -1, 14, 11, 10, 15, 6, 2};
  for (int c = 0; c < 12; c++) {
    assert_int_equal(r.choice[c], want_choice[c]);
    assert_int_equal(r.choice_slot[c], want_slot[c]);
  }
  assert_int_equal(r.dropped, 2);
  for (int t = 0; t < 6; t++) {
    /* GShard: the two chosen probabilities renormalised to sum to 1. */
    double p1 = softmax_at(logits + 4 * t, 4, want_choice[2 * t]);
    double p2 = softmax_at(logits + 4 * t, 4, want_choice[2 * t + 1]);
    assert_float_equal(r.gate[2 * t], p1 / (p1 + p2), 1e-6);
    assert_float_equal(r.gate[2 * t + 1], p2 / (p1 + p2), 1e-6);
    assert_float_equal(r.gate[2 * t] + r.gate[2 * t + 1], 1.0, 1e-6);
  }
  for (int c = 0; c < 12; c++)
    if (want_slot[c] >= 0) {
      assert_int_equal(r.slot_token[want_slot[c]], c / 2);
      assert_float_equal(r.slot_gate[want_slot[c]], r.gate[c], 0);
    }
  /* f per group counts first choices only. */
  assert_float_equal(r.frac[0], 2.0 / 3, 1e-6);
  assert_float_equal(r.frac[1], 1.0 / 3, 1e-6);
  assert_float_equal(r.frac[4 + 3], 1.0 / 3, 1e-6);
  moe_route_release(&r);
}

/* L(logits) = sum_s c_s slot_gate_s + w * balance with the routing held fixed. */
static double route_objective(const moe_config *cfg, const float *logits, int T, int groups,
                              const float *c, float w) {
  moe_route r = {0};
  assert_ok(moe_route_compute(cfg, logits, T, groups, &r));
  double L = w * r.balance;
  for (int s = 0; s < r.experts * r.groups * r.capacity; s++) L += (double)c[s] * r.slot_gate[s];
  moe_route_release(&r);
  return L;
}

static void test_router_backward_by_finite_differences(void **state) {
  (void)state;
  for (int k = 1; k <= 2; k++) {
    moe_config cfg = {.hidden = 4, .ffn = 4, .experts = 4, .top_k = k, .capacity_factor = 1.0f,
                      .balance_alpha = 0.3f};
    const int T = 8, groups = 2, E = 4;
    float *logits = rand_buf((size_t)T * E);
    for (int i = 0; i < T * E; i++) logits[i] *= 2;
    moe_route r = {0};
    assert_ok(moe_route_compute(&cfg, logits, T, groups, &r));
    int slots = E * groups * r.capacity;
    float *c = rand_buf((size_t)slots), dl[8 * 4];
    const float w = 0.7f;
    assert_ok(moe_route_backward(&cfg, &r, c, w, dl));
    int checked = 0;
    for (int i = 0; i < T * E; i++) {
      float keep = logits[i];
      const float eps = 1e-3f;
      logits[i] = keep + eps;
      double up = route_objective(&cfg, logits, T, groups, c, w);
      logits[i] = keep - eps;
      double down = route_objective(&cfg, logits, T, groups, c, w);
      logits[i] = keep;
      double fd = (up - down) / (2.0 * eps);
      if (!fd_close(fd, dl[i])) {
        fprintf(stderr, "top-%d: dlogits[%d]: fd %.6g analytic %.6g\n", k, i, fd, (double)dl[i]);
        fail();
      }
      checked += fabs(dl[i]) > 1e-3;
    }
    assert_true(checked > T * E / 2); /* the gradient is not trivially zero */
    moe_route_release(&r);
    free(c);
    free(logits);
  }
}

/* ---- the layer against central differences ------------------------------------------------ */

typedef struct layer_fixture {
  moe_config cfg;
  layer_store store;
  moe_layer layer;
  moe_scratch scratch;
  moe_acts acts;
  fl_tensor x, dy, dx;
  float *c; /* the objective's weights on y */
  int T, groups;
  float aux_weight;
} layer_fixture;

static void fixture_open(layer_fixture *f, int top_k, float cf) {
  memset(f, 0, sizeof *f);
  f->cfg = (moe_config){.hidden = 4, .ffn = 6, .experts = 3, .top_k = top_k,
                        .capacity_factor = cf, .balance_alpha = 0.2f};
  f->T = 6;
  f->groups = 2;
  f->aux_weight = 0.5f;
  layer_store_init(&f->store, dev);
  size_t first;
  assert_ok(moe_params_add(&f->store, "", &f->cfg, 0, 1, &first));
  assert_ok(layer_store_finish(&f->store, 7));
  assert_ok(moe_params_init(&f->store, first, moe_param_count(&f->cfg, 1), 7));
  /* Non-zero biases, so their gradients are checked too. */
  for (size_t i = 0; i < f->store.nparams; i++)
    if (f->store.params[i].value.ndim == 1)
      for (size_t j = 0; j < f->store.params[i].value.numel; j++)
        f->store.params[i].value.data[j] = 0.3f * urand();
  f->layer = (moe_layer){dev, NULL, f->cfg, 0, 1, &f->store.params[first], &f->scratch};
  int64_t shape[2] = {f->T, f->cfg.hidden};
  assert_ok(tensor_ensure(&f->x, dev, 2, shape));
  assert_ok(tensor_ensure(&f->dy, dev, 2, shape));
  for (size_t i = 0; i < f->x.numel; i++) f->x.data[i] = 1.5f * urand();
  f->c = rand_buf(f->x.numel);
  memcpy(f->dy.data, f->c, f->x.numel * sizeof(float));
}

static void fixture_close(layer_fixture *f) {
  moe_acts_release(&f->acts);
  moe_scratch_release(&f->scratch);
  tensor_release(&f->x);
  tensor_release(&f->dy);
  tensor_release(&f->dx);
  layer_store_release(&f->store);
  free(f->c);
}

/* sum(c * y) + the weighted balancing loss, from a fresh forward. */
static double layer_objective(layer_fixture *f, int *dropped) {
  assert_ok(moe_forward(&f->layer, &f->x, f->groups, f->aux_weight, &f->acts));
  double L = f->acts.aux_loss;
  for (size_t i = 0; i < f->x.numel; i++) L += (double)f->c[i] * f->acts.y.data[i];
  if (dropped) *dropped = f->acts.route.dropped;
  return L;
}

static void check_fd(layer_fixture *f, float *v, const float *g, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++) {
    float keep = v[i];
    const float eps = 2e-3f;
    v[i] = keep + eps;
    double up = layer_objective(f, NULL);
    v[i] = keep - eps;
    double down = layer_objective(f, NULL);
    v[i] = keep;
    double fd = (up - down) / (2.0 * eps);
    if (!fd_close(fd, g[i])) {
      fprintf(stderr, "top-%d %s[%zu]: fd %.6g analytic %.6g\n", f->cfg.top_k, what, i, fd, (double)g[i]);
      fail();
    }
  }
}

static void test_layer_gradients_by_finite_differences(void **state) {
  (void)state;
  rng_state = 0x51ed2701u;
  const float factors[2] = {0.75f, 3.0f}; /* with and without dropping */
  for (int k = 1; k <= 2; k++)
    for (int fi = 0; fi < 2; fi++) {
      layer_fixture f;
      fixture_open(&f, k, factors[fi]);
      int dropped;
      layer_objective(&f, &dropped);
      if (fi == 0) assert_true(dropped > 0);
      if (fi == 1) assert_int_equal(dropped, 0);
      assert_ok(moe_backward(&f.layer, &f.x, &f.acts, &f.dy, &f.dx));
      /* ids, gates, expert_in, h1, act, back, y at 3 experts x groups x capacity slots. */
      size_t slots = (size_t)3 * f.groups * f.acts.route.capacity;
      assert_int_equal(moe_acts_bytes(&f.acts),
                       sizeof(float) * (2 * slots + 2 * slots * 4 + 2 * slots * 6 + f.x.numel));
      float *dx = malloc(f.x.numel * sizeof *dx);
      memcpy(dx, f.dx.data, f.x.numel * sizeof *dx);
      check_fd(&f, f.x.data, dx, f.x.numel, "dx");
      for (size_t i = 0; i < f.store.nparams; i++) {
        nn_param *p = &f.store.params[i];
        float *g = malloc(p->grad.numel * sizeof *g);
        memcpy(g, p->grad.data, p->grad.numel * sizeof *g);
        check_fd(&f, p->value.data, g, p->value.numel, p->name);
        free(g);
      }
      free(dx);
      fixture_close(&f);
    }
}

/* ---- expert parallel = one rank holding every expert -------------------------------------- */

#define EP_ROWS 12   /* rows per rank */
#define EP_GROUPS 2  /* routing groups per rank */
#define EP_STEPS 3
#define EP_FEATURES 5
#define EP_CLASSES 3
#define MAX_EP 4

typedef struct param_snap {
  char name[64];
  size_t numel;
  float *grad[EP_STEPS], *value;
} param_snap;

typedef struct rank_snap {
  moe_model_stats stats[EP_STEPS];
  float *logits[EP_STEPS];
  float *moe_out[EP_STEPS];
  param_snap *params;
  size_t nparams;
} rank_snap;

typedef struct ep_run {
  moe_model_spec spec;
  int ep;
  const float *x;        /* [ep * EP_ROWS, features] */
  const int32_t *labels; /* [ep * EP_ROWS] */
  rank_snap snap[MAX_EP];
} ep_run;

static float *dup_floats(const float *p, size_t n) {
  float *q = malloc((n ? n : 1) * sizeof *q);
  if (q) memcpy(q, p, n * sizeof *q);
  return q;
}

/* Trains EP_STEPS steps on rows [row0, row0 + rows) with `groups` groups, snapshotting. On a
 * rank thread: no cmocka asserts here. */
static fl_status train_and_snap(fl_comm *comm, const ep_run *run, int row0, int rows, int groups,
                                rank_snap *out) {
  fl_device *d = NULL;
  moe_model *m = NULL;
  fl_tensor x = {0};
  const int N = run->ep * EP_ROWS, G = run->ep * EP_GROUPS;
  fl_status status = fl_device_open(FL_DEVICE_CPU, 0, &d);
  if (status != FL_OK) return status;
  FL_CHECK(moe_model_create(d, &run->spec, comm, &m));
  int64_t shape[2] = {rows, EP_FEATURES};
  FL_CHECK(tensor_ensure(&x, d, 2, shape));
  memcpy(x.data, run->x + (size_t)row0 * EP_FEATURES, x.numel * sizeof(float));
  out->nparams = moe_model_param_count(m);
  out->params = calloc(out->nparams, sizeof *out->params);
  if (!out->params) FL_CHECK(FL_ERR(FL_ENOMEM, "test: out of memory"));
  for (int s = 0; s < EP_STEPS; s++) {
    FL_CHECK(moe_model_train_step(m, &x, run->labels + row0, groups, 1.0f / N, 1.0f / G, 0.2f,
                                  &out->stats[s]));
    const fl_tensor *lg = moe_model_logits(m), *y = moe_model_moe_out(m);
    out->logits[s] = dup_floats(lg->data, lg->numel);
    out->moe_out[s] = dup_floats(y->data, y->numel);
    for (size_t i = 0; i < out->nparams; i++) {
      nn_param *p = moe_model_param(m, i);
      param_snap *q = &out->params[i];
      snprintf(q->name, sizeof q->name, "%s", p->name);
      q->numel = p->grad.numel;
      q->grad[s] = dup_floats(p->grad.data, p->grad.numel);
      if (s == EP_STEPS - 1) q->value = dup_floats(p->value.data, p->value.numel);
    }
  }
cleanup:
  tensor_release(&x);
  moe_model_destroy(m);
  fl_device_close(d);
  return status;
}

static fl_status ep_rank(rank_job *job) {
  ep_run *run = job->arg;
  return train_and_snap(job->comm, run, job->rank * EP_ROWS, EP_ROWS, EP_GROUPS,
                        &run->snap[job->rank]);
}

static void snap_free(rank_snap *s) {
  for (int t = 0; t < EP_STEPS; t++) {
    free(s->logits[t]);
    free(s->moe_out[t]);
  }
  for (size_t i = 0; s->params && i < s->nparams; i++) {
    for (int t = 0; t < EP_STEPS; t++) free(s->params[i].grad[t]);
    free(s->params[i].value);
  }
  free(s->params);
  memset(s, 0, sizeof *s);
}

static const param_snap *find_param(const rank_snap *s, const char *name) {
  for (size_t i = 0; i < s->nparams; i++)
    if (!strcmp(s->params[i].name, name)) return &s->params[i];
  return NULL;
}

static void test_expert_parallel_matches_one_rank(void **state) {
  (void)state;
  rng_state = 0x2545f4914f6cdd1dull;
  const int eps[3] = {2, 3, 4};
  int total_dropped = 0;
  for (int k = 1; k <= 2; k++)
    for (int ei = 0; ei < 3; ei++) {
      /* 6 experts for 3 ranks, 4 otherwise: E % ep == 0. */
      const int ep = eps[ei], N = ep * EP_ROWS, E = ep == 3 ? 6 : 4;
      ep_run run = {.ep = ep};
      run.spec = (moe_model_spec){.features = EP_FEATURES, .classes = EP_CLASSES, .seed = 11,
                                  .moe = {.hidden = 8, .ffn = 12, .experts = E, .top_k = k,
                                          .capacity_factor = 1.0f, .balance_alpha = 0.1f}};
      float *x = rand_buf((size_t)N * EP_FEATURES);
      for (int i = 0; i < N * EP_FEATURES; i++) x[i] *= 2;
      int32_t *labels = malloc((size_t)N * sizeof *labels);
      for (int i = 0; i < N; i++) labels[i] = (int32_t)((i * 7 + i / 3) % EP_CLASSES);
      run.x = x;
      run.labels = labels;

      rank_snap one = {0};
      assert_ok(train_and_snap(NULL, &run, 0, N, ep * EP_GROUPS, &one));
      group g;
      group_create(&g, ep);
      rank_job jobs[MAX_RANKS];
      run_ranks(ep, g.comms, ep_rank, &run, jobs);
      expect_all_ok(ep, jobs);
      group_destroy(&g);

      char what[128];
      for (int s = 0; s < EP_STEPS; s++) {
        moe_model_stats sum = {0};
        for (int r = 0; r < ep; r++) {
          sum.xent_sum += run.snap[r].stats[s].xent_sum;
          sum.correct += run.snap[r].stats[s].correct;
          sum.aux_loss += run.snap[r].stats[s].aux_loss;
          sum.dropped += run.snap[r].stats[s].dropped;
          size_t lo = (size_t)r * EP_ROWS;
          snprintf(what, sizeof what, "top-%d ep %d step %d rank %d logits", k, ep, s, r);
          expect_close(run.snap[r].logits[s], one.logits[s] + lo * EP_CLASSES,
                       (size_t)EP_ROWS * EP_CLASSES, 1e-6, what);
          snprintf(what, sizeof what, "top-%d ep %d step %d rank %d moe output", k, ep, s, r);
          expect_close(run.snap[r].moe_out[s], one.moe_out[s] + lo * 8, (size_t)EP_ROWS * 8,
                       1e-6, what);
        }
        assert_float_equal(sum.xent_sum, one.stats[s].xent_sum, 1e-6 * fabs(one.stats[s].xent_sum));
        assert_float_equal(sum.correct, one.stats[s].correct, 0);
        assert_true(one.stats[s].aux_loss > 0);
        assert_float_equal(sum.aux_loss, one.stats[s].aux_loss, 1e-6 * one.stats[s].aux_loss);
        assert_int_equal(sum.dropped, one.stats[s].dropped);
        total_dropped += one.stats[s].dropped;
        /* Every gradient: the replicated ones on every rank, each expert's on its owner. */
        size_t seen = 0;
        for (int r = 0; r < ep; r++)
          for (size_t i = 0; i < run.snap[r].nparams; i++) {
            const param_snap *p = &run.snap[r].params[i];
            const param_snap *q = find_param(&one, p->name);
            assert_non_null(q);
            assert_int_equal(p->numel, q->numel);
            snprintf(what, sizeof what, "top-%d ep %d step %d rank %d grad %s", k, ep, s, r, p->name);
            expect_close(p->grad[s], q->grad[s], p->numel, 1e-6, what);
            if (s == EP_STEPS - 1) {
              snprintf(what, sizeof what, "top-%d ep %d rank %d weights %s", k, ep, r, p->name);
              expect_close(p->value, q->value, p->numel, 1e-6, what);
            }
            seen += strstr(p->name, "experts.") != NULL;
          }
        assert_int_equal(seen, E * MOE_EXPERT_NPARAMS); /* each expert on exactly one rank */
      }
      /* Training moves the weights: the comparison is not of untouched copies. */
      const param_snap *w = find_param(&one, "moe.router.weight");
      assert_non_null(w);
      assert_true(rel_max_err(w->grad[0], w->grad[EP_STEPS - 1], w->numel) > 1e-4);
      for (int r = 0; r < ep; r++) snap_free(&run.snap[r]);
      snap_free(&one);
      free(x);
      free(labels);
    }
  assert_true(total_dropped > 0); /* capacity dropping took part */
}

/* ---- the cuda device against the cpu ------------------------------------------------------ */

/* One forward and backward of a fresh layer on d; y, dx and the flat gradients to the host. */
static fl_status layer_on(fl_device *d, const moe_config *cfg, const float *xv, int T, int groups,
                          const float *dyv, float *y, float *dx, float *grads, size_t *nvalues) {
  layer_store s;
  moe_scratch scratch = {0};
  moe_acts acts = {0};
  fl_tensor x = {0}, dy = {0}, dxt = {0};
  size_t first;
  fl_status status = FL_OK;
  layer_store_init(&s, d);
  int64_t shape[2] = {T, cfg->hidden};
  FL_CHECK(moe_params_add(&s, "moe", cfg, 0, 1, &first));
  FL_CHECK(layer_store_finish(&s, 3));
  FL_CHECK(moe_params_init(&s, first, moe_param_count(cfg, 1), 3));
  moe_layer k = {d, NULL, *cfg, 0, 1, &s.params[first], &scratch};
  FL_CHECK(tensor_ensure(&x, d, 2, shape));
  FL_CHECK(tensor_ensure(&dy, d, 2, shape));
  FL_CHECK(fl_tensor_write(&x, xv, x.numel));
  FL_CHECK(fl_tensor_write(&dy, dyv, dy.numel));
  FL_CHECK(moe_forward(&k, &x, groups, 0.25f, &acts));
  FL_CHECK(moe_backward(&k, &x, &acts, &dy, &dxt));
  FL_CHECK(fl_tensor_read(&acts.y, y, x.numel));
  FL_CHECK(fl_tensor_read(&dxt, dx, x.numel));
  *nvalues = s.nvalues;
  FL_CHECK(fl_tensor_read(&s.grads, grads, s.nvalues));
cleanup:
  moe_acts_release(&acts);
  moe_scratch_release(&scratch);
  tensor_release(&x);
  tensor_release(&dy);
  tensor_release(&dxt);
  layer_store_release(&s);
  return status;
}

static void test_cuda_matches_cpu(void **state) {
  (void)state;
  fl_device *gpu = NULL;
  if (fl_cuda_device_count() < 1 || fl_device_open(FL_DEVICE_CUDA, 0, &gpu) != FL_OK) {
    skip(); /* no GPU here */
    return;
  }
  for (int k = 1; k <= 2; k++) {
    moe_config cfg = {.hidden = 16, .ffn = 24, .experts = 4, .top_k = k, .capacity_factor = 1.0f,
                      .balance_alpha = 0.1f};
    const int T = 32, groups = 2;
    float *x = rand_buf((size_t)T * 16), *dy = rand_buf((size_t)T * 16);
    float y[2][32 * 16], dx[2][32 * 16];
    size_t n[2], want = (size_t)4 * 16 + 4 * (2 * 24 * 16 + 24 + 16);
    float *g[2] = {malloc(want * sizeof(float)), malloc(want * sizeof(float))};
    assert_ok(layer_on(dev, &cfg, x, T, groups, dy, y[0], dx[0], g[0], &n[0]));
    assert_ok(layer_on(gpu, &cfg, x, T, groups, dy, y[1], dx[1], g[1], &n[1]));
    assert_int_equal(n[0], want);
    assert_int_equal(n[1], want);
    expect_close(y[1], y[0], (size_t)T * 16, 1e-4, "cuda y");
    expect_close(dx[1], dx[0], (size_t)T * 16, 1e-4, "cuda dx");
    expect_close(g[1], g[0], n[0], 1e-4, "cuda gradients");
    free(g[0]);
    free(g[1]);
    free(x);
    free(dy);
  }
  fl_device_close(gpu);
}

/* ---- bad configs and calls ----------------------------------------------------------------- */

static void test_bad_configs_and_calls(void **state) {
  (void)state;
  const moe_config good = {.hidden = 4, .ffn = 4, .experts = 6, .top_k = 2,
                           .capacity_factor = 1.25f, .balance_alpha = 0.01f};
  assert_ok(moe_config_check(&good, 3));
  assert_fails_with(moe_config_check(&good, 4), FL_EINVAL,
                    "experts (6) must be a multiple of the expert-parallel size 4");
  moe_config c = good;
  c.top_k = 7;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "top_k (7) is more than the 6 experts");
  c.top_k = 0;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "top_k is 0");
  c = good;
  c.capacity_factor = 0;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "capacity_factor is 0, must be positive");
  c.capacity_factor = -1;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "capacity_factor is -1");
  c.capacity_factor = NAN;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "capacity_factor");
  c = good;
  c.balance_alpha = -0.5f;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "balance_alpha");
  c = good;
  c.hidden = 0;
  assert_fails_with(moe_config_check(&c, 1), FL_EINVAL, "hidden is 0");
  assert_fails_with(moe_config_check(&good, 0), FL_EINVAL, "expert-parallel size 0");
  assert_fails_with(moe_config_check(NULL, 1), FL_EINVAL, "NULL");

  /* The model and the store refuse them too, leaving nothing behind. */
  moe_model *m = NULL;
  moe_model_spec spec = {.features = 3, .classes = 2, .moe = good, .seed = 1};
  spec.moe.capacity_factor = 0;
  assert_fails_with(moe_model_create(dev, &spec, NULL, &m), FL_EINVAL, "capacity_factor");
  assert_null(m);
  spec.moe = good;
  spec.classes = 0;
  assert_fails_with(moe_model_create(dev, &spec, NULL, &m), FL_EINVAL, "classes (0)");
  layer_store s;
  layer_store_init(&s, dev);
  size_t first;
  assert_fails_with(moe_params_add(&s, "moe", &good, 3, 3, &first), FL_EINVAL, "rank 3 of 3");
  layer_store_release(&s);

  /* Routing: rows that are not whole groups. */
  float logits[5 * 6] = {0};
  moe_route r = {0};
  assert_fails_with(moe_route_compute(&good, logits, 5, 2, &r), FL_EINVAL,
                    "5 tokens cannot be cut into 2 equal routing groups");
  moe_route_release(&r);

  /* The layer: bad shapes and groups, a backward without its forward. */
  spec.classes = 2;
  assert_ok(moe_model_create(dev, &spec, NULL, &m));
  fl_tensor x = {0};
  int64_t shape[2] = {5, 4};
  assert_ok(tensor_ensure(&x, dev, 2, shape));
  memset(x.data, 0, x.numel * sizeof(float));
  int32_t labels[6] = {0, 1, 0, 1, 0, 1};
  assert_fails_with(moe_model_forward_backward(m, &x, labels, 1, 1.0f, 1.0f, NULL), FL_EINVAL,
                    "rows of 3 features");
  shape[0] = 6;
  shape[1] = 3;
  assert_ok(tensor_ensure(&x, dev, 2, shape));
  memset(x.data, 0, x.numel * sizeof(float));
  assert_fails_with(moe_model_forward_backward(m, &x, labels, 4, 1.0f, 1.0f, NULL), FL_EINVAL,
                    "6 rows cannot be cut into 4 equal routing groups");
  assert_fails_with(moe_model_forward_backward(m, &x, labels, 0, 1.0f, 1.0f, NULL), FL_EINVAL,
                    "0 equal routing groups");
  moe_model_stats st;
  assert_ok(moe_model_forward_backward(m, &x, labels, 3, 1.0f / 6, 1.0f / 3, &st));
  assert_true(st.xent_sum > 0 && isfinite(st.xent_sum));
  moe_model_destroy(m);
  moe_model_destroy(NULL);
  tensor_release(&x);

  layer_fixture f;
  fixture_open(&f, 1, 1.0f);
  assert_fails_with(moe_backward(&f.layer, &f.x, &f.acts, &f.dy, &f.dx), FL_ESTATE,
                    "backward without a forward");
  layer_objective(&f, NULL);
  int64_t other[2] = {3, 4};
  fl_tensor dy = {0};
  assert_ok(tensor_ensure(&dy, dev, 2, other));
  assert_fails_with(moe_backward(&f.layer, &f.x, &f.acts, &dy, &f.dx), FL_EINVAL,
                    "dy of another shape");
  tensor_release(&dy);
  fixture_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_top1_capacity_and_dropping),
      cmocka_unit_test(test_top2_gates_second_choices_and_groups),
      cmocka_unit_test(test_router_backward_by_finite_differences),
      cmocka_unit_test(test_layer_gradients_by_finite_differences),
      cmocka_unit_test(test_expert_parallel_matches_one_rank),
      cmocka_unit_test(test_cuda_matches_cpu),
      cmocka_unit_test(test_bad_configs_and_calls),
  };
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
