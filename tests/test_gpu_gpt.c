/*
 * test_gpu_gpt.c: the GPT form of the transformer (gpu/parallel/transformer.h, kind TFM_GPT)
 * on the cpu device, with ranks as threads over loopback.
 *
 *   - the causal mask operation against its definition;
 *   - causality: changing a later token leaves every earlier position's logits as they were
 *     (bit for bit) and changes the later ones;
 *   - the gradients of the blocks and the head (layer norms, causal attention) against
 *     central differences on a tiny model, dropout on with fixed keys;
 *   - the hybrid trainer: the per-token loss and every gradient of one step on tp 2 x pp 2
 *     (every schedule), tp 4, dp 2 and dp 2 x tp 2 x pp 2 equal one rank's within 1e-5 of
 *     each parameter's scale, dropout on; weights after a few steps too;
 *   - sequence parallelism equals plain tensor parallelism within 1e-6 (tp 2 and 4, the
 *     encoder and the GPT form, with a pipeline, data parallelism and every schedule), and
 *     holds less; selective recomputation is exact; the activation bytes follow the formula
 *     of bench_pipeline's third table; bad sequence-parallel options are errors;
 *   - bad specs and token ids are errors that name the cause.
 */
#define TEST_TIME_BOUND_S 300
#include <math.h>

#include "rank_threads.h"
#include "kept_params.h"

#include "gpu/device/device.h"
#include "gpu/parallel/pipeline.h"

static fl_device *cpu;

#define SEQ 8
#define VOCAB 11
#define BLOCKS 2 /* units: embedding, 2 blocks, head = 4 */
#define MAX_BATCH 16

static tfm_spec gpt_spec(void) {
  return (tfm_spec){.seq = SEQ, .hidden = 16, .heads = 4, .ffn = 32, .blocks = BLOCKS, .dropout = 0.1f,
                    .seed = 23, .kind = TFM_GPT, .vocab = VOCAB};
}

/* The global batch: token ids [MAX_BATCH, SEQ] and their next tokens, from a seeded walk. */
static float xs[MAX_BATCH * SEQ];
static int32_t ys[MAX_BATCH * SEQ];
static void make_batch(void) {
  uint64_t z = 7;
  int32_t text[MAX_BATCH * SEQ + 1];
  for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    text[i] = (int32_t)((z >> 33) % VOCAB);
  }
  for (int i = 0; i < MAX_BATCH * SEQ; i++) {
    xs[i] = (float)text[i];
    ys[i] = text[i + 1];
  }
}

static double dot(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

static float urand_pm1(uint64_t *z) {
  *z = *z * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(*z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
}

/* ---- the causal mask ---------------------------------------------------------------------- */

static void test_causal_mask_op(void **state) {
  (void)state;
  int batch = 3, s = 5;
  size_t n = (size_t)batch * s * s;
  float *x = malloc(n * sizeof *x), *orig = malloc(n * sizeof *orig);
  uint64_t z = 3;
  for (size_t i = 0; i < n; i++) orig[i] = x[i] = urand_pm1(&z);
  assert_ok(cpu->ops->causal_mask(cpu, batch, s, x));
  for (int b = 0; b < batch; b++)
    for (int i = 0; i < s; i++)
      for (int j = 0; j < s; j++) {
        size_t at = ((size_t)b * s + i) * s + j;
        if (j > i) assert_true(isinf(x[at]) && x[at] < 0);
        else assert_true(x[at] == orig[at]);
      }
  /* The softmax of a masked row puts nothing above the diagonal, and its backward passes
   * nothing there. */
  float *y = malloc(n * sizeof *y), *dy = malloc(n * sizeof *dy), *dx = malloc(n * sizeof *dx);
  for (size_t i = 0; i < n; i++) dy[i] = urand_pm1(&z);
  assert_ok(cpu->ops->softmax_rows_forward(cpu, batch * s, s, 0.5f, x, y));
  assert_ok(cpu->ops->softmax_rows_backward(cpu, batch * s, s, 0.5f, y, dy, dx));
  for (int r = 0; r < batch * s; r++) {
    double sum = 0;
    for (int j = 0; j < s; j++) {
      float v = y[(size_t)r * s + j];
      assert_true(isfinite(v) && isfinite(dx[(size_t)r * s + j]));
      if (j > r % s) assert_true(v == 0.0f && dx[(size_t)r * s + j] == 0.0f);
      sum += v;
    }
    assert_true(fabs(sum - 1.0) < 1e-5);
  }
  free(x);
  free(orig);
  free(y);
  free(dy);
  free(dx);
}

/* ---- causality of the whole model --------------------------------------------------------- */

static void test_later_tokens_do_not_change_earlier_outputs(void **state) {
  (void)state;
  tfm_spec sp = gpt_spec();
  tfm_chunk *c;
  assert_ok(tfm_chunk_create(cpu, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c));
  int n = 2, V = VOCAB;
  int64_t shape[3] = {n, SEQ, 1};
  fl_tensor x = {0};
  assert_ok(tensor_ensure(&x, cpu, 3, shape));
  size_t per = (size_t)SEQ * V;
  float *before = malloc((size_t)n * per * sizeof *before);
  for (int at = 1; at < SEQ; at++) {
    memcpy(x.data, xs, (size_t)n * SEQ * sizeof(float));
    const fl_tensor *y;
    /* Dropout on, with the same keys both times: the masks do not depend on the tokens. */
    tfm_batch b = {.row0 = 0, .step = 3};
    assert_ok(tfm_chunk_forward(c, 0, &x, &b, true, &y));
    assert_int_equal(y->ndim, 3);
    assert_int_equal(y->shape[1], SEQ);
    assert_int_equal(y->shape[2], V);
    memcpy(before, y->data, (size_t)n * per * sizeof *before);
    x.data[1 * SEQ + at] = (float)(((int)x.data[1 * SEQ + at] + 5) % V); /* sample 1's token `at` */
    assert_ok(tfm_chunk_forward(c, 0, &x, &b, true, &y));
    /* Sample 0 and sample 1's positions before `at` are unchanged, bit for bit. */
    assert_memory_equal(y->data, before, per * sizeof(float));
    assert_memory_equal(y->data + per, before + per, (size_t)at * V * sizeof(float));
    /* Every later position sees the change. */
    for (int p = at; p < SEQ; p++) {
      double diff = 0;
      for (int v = 0; v < V; v++) diff = fmax(diff, fabs(y->data[per + (size_t)p * V + v] - before[per + (size_t)p * V + v]));
      if (!(diff > 1e-6)) fail_msg("changing token %d left position %d's logits as they were", at, p);
    }
  }
  free(before);
  tensor_release(&x);
  tfm_chunk_destroy(c);
}

/* ---- gradients against finite differences ----------------------------------------------- */

static bool fd_close(double fd, double analytic) {
  return fabs(fd - analytic) <= 5e-3 + 2e-2 * fmax(fabs(fd), fabs(analytic));
}

/* L = <logits, r> of chunk [1, units) (blocks and head) on hidden input x. */
static double chunk_loss(tfm_chunk *c, const fl_tensor *x, const tfm_batch *b, const float *r) {
  const fl_tensor *y;
  assert_ok(tfm_chunk_forward(c, 0, x, b, true, &y));
  return dot(y->data, r, y->numel);
}

static bool fd_agrees(tfm_chunk *c, const fl_tensor *x, const tfm_batch *b, const float *r, float *v,
                      double analytic, const char *what, size_t i) {
  const double eps = 1e-2;
  float keep = *v;
  *v = keep + (float)eps;
  double lp = chunk_loss(c, x, b, r);
  *v = keep - (float)eps;
  double lm = chunk_loss(c, x, b, r);
  *v = keep;
  double fd = (lp - lm) / (2 * eps);
  bool ok = fd_close(fd, analytic);
  if (!ok) fprintf(stderr, "%s[%zu]: backward %g, finite difference %g\n", what, i, analytic, fd);
  return ok;
}

static void test_gradients_by_finite_differences(void **state) {
  (void)state;
  tfm_spec sp = gpt_spec();
  sp.seq = 5;
  sp.hidden = 8;
  sp.heads = 2;
  sp.ffn = 16;
  sp.vocab = 6;
  tfm_chunk *c;
  assert_ok(tfm_chunk_create(cpu, &sp, 1, tfm_units(&sp), NULL, 0, 1, &c));
  /* Noise makes the zero biases and the unit gains generic. */
  fl_tensor *values = tfm_chunk_values(c);
  uint64_t z = 9;
  for (size_t i = 0; i < values->numel; i++) values->data[i] += 0.1f * urand_pm1(&z);
  int n = 2;
  int64_t shape[3] = {n, sp.seq, sp.hidden};
  size_t numel = (size_t)n * sp.seq * sp.hidden, nout = (size_t)n * sp.seq * sp.vocab;
  fl_tensor x = {0}, dy = {0};
  assert_ok(tensor_ensure(&x, cpu, 3, shape));
  for (size_t i = 0; i < numel; i++) x.data[i] = urand_pm1(&z);
  float *r = malloc(nout * sizeof *r);
  for (size_t i = 0; i < nout; i++) r[i] = urand_pm1(&z);
  tfm_batch b = {.row0 = 1, .step = 4};
  const fl_tensor *y, *dx;
  assert_ok(tfm_chunk_forward(c, 0, &x, &b, true, &y));
  assert_ok(tensor_ensure(&dy, cpu, y->ndim, y->shape));
  memcpy(dy.data, r, nout * sizeof *r);
  assert_ok(tfm_chunk_backward(c, 0, &dy, &dx));
  assert_non_null(dx);
  float *dxv = malloc(numel * sizeof *dxv);
  memcpy(dxv, dx->data, numel * sizeof *dxv);
  fl_tensor *grads = tfm_chunk_grads(c);
  float *g = malloc(grads->numel * sizeof *g);
  memcpy(g, grads->data, grads->numel * sizeof *g);
  int bad = 0, total = 0, ln = 0;
  for (size_t i = 0; i < numel; i += 3, total++) bad += !fd_agrees(c, &x, &b, r, &x.data[i], dxv[i], "dx", i);
  for (size_t p = 0; p < tfm_chunk_param_count(c); p++) {
    nn_param *prm = tfm_chunk_param(c, p);
    ln += strstr(prm->name, "ln") != NULL;
    for (size_t k = 0; k < 5; k++, total++) {
      size_t i = (k * 7919 + p) % prm->value.numel;
      bad += !fd_agrees(c, &x, &b, r, &prm->value.data[i], g[prm->offset + i], prm->name, i);
    }
  }
  if (bad) fprintf(stderr, "%d of %d derivatives disagree\n", bad, total);
  assert_int_equal(bad, 0);
  assert_int_equal(ln, 2 * 2 * BLOCKS + 2); /* ln1, ln2 per block and the head's: gain and bias */
  assert_true(total > 100);
  free(r);
  free(dxv);
  free(g);
  tensor_release(&x);
  tensor_release(&dy);
  tfm_chunk_destroy(c);
}

/* ---- the hybrid trainer against one rank ------------------------------------------------- */

typedef struct run_spec {
  pp_options o;
  const float *x;     /* the global batch (NULL: the text's xs and ys) */
  const int32_t *y;
  int global_batch;
  int steps; /* 0: gradients of one step; else values after that many steps */
  float lr;
  double loss[MAX_RANKS], accuracy[MAX_RANKS];
  size_t peak[MAX_RANKS];
  kept_param *kept[MAX_RANKS];
  size_t nkept[MAX_RANKS];
} run_spec;

static fl_status trainer_rank(rank_job *job) {
  run_spec *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  pp_coords me = pp_trainer_coords(t);
  int batch = rs->global_batch / rs->o.grid.dp;
  const tfm_spec *sp = &rs->o.spec;
  const float *x = (rs->x ? rs->x : xs) + (size_t)me.dp * batch * SEQ * tfm_input_width(sp);
  const int32_t *y = (rs->y ? rs->y : ys) + (size_t)me.dp * batch * tfm_targets_per_sample(sp);
  pp_step_stats st;
  int steps = rs->steps ? rs->steps : 1;
  for (int i = 0; i < steps && s == FL_OK; i++) {
    s = pp_trainer_compute_gradients(t, x, y, batch, (uint64_t)i, &st);
    if (s == FL_OK && i == 0) {
      rs->loss[job->rank] = st.loss;
      rs->accuracy[job->rank] = st.accuracy;
      rs->peak[job->rank] = st.peak_activation_bytes;
    }
    if (s == FL_OK && rs->steps) s = pp_trainer_apply(t, rs->lr, &st);
  }
  if (s == FL_OK) s = kept_take(t, rs->steps > 0, &rs->kept[job->rank], &rs->nkept[job->rank]);
  pp_trainer_destroy(t);
  return s;
}

static void run_free(run_spec *rs, int ranks) {
  for (int r = 0; r < ranks; r++) {
    kept_free(rs->kept[r], rs->nkept[r]);
    rs->kept[r] = NULL;
    rs->nkept[r] = 0;
  }
}

static group_cache worlds;

static group *world(int size) { return group_cache_get(&worlds, size); }

static void run_on(int ranks, run_spec *rs) {
  rank_job jobs[MAX_RANKS];
  group *g = world(ranks);
  run_ranks(g->size, g->comms, trainer_rank, rs, jobs);
  expect_all_ok(g->size, jobs);
}

/* The largest difference of any shard from its slice of the single rank's tensor
 * (kept_worst_difference, floored as test_gpu_pipeline's). */
static double worst_difference(const run_spec *ref, const run_spec *rs, int ranks, const char *what) {
  return kept_worst_difference(rs->kept, rs->nkept, ranks, ref->kept[0], ref->nkept[0], 1e-5, what, NULL);
}

static const int bounds_pp2[] = {0, 2, 4};
static const int bounds_pp2x2[] = {0, 1, 2, 3, 4};

static void reference(run_spec *ref, int global_batch, int steps) {
  memset(ref, 0, sizeof *ref);
  ref->o = (pp_options){.spec = gpt_spec(), .grid = {1, 1, 1}, .schedule = PP_GPIPE, .microbatches = 1,
                        .optim = OPTIM_OPTIONS_INIT};
  ref->global_batch = global_batch;
  ref->steps = steps;
  ref->lr = 0.1f;
  run_on(1, ref);
}

static void check_grid(const run_spec *ref, pp_grid grid, pp_schedule s, int m, bool recompute) {
  run_spec rs = {0};
  int v = s == PP_INTERLEAVED ? 2 : 1;
  rs.o = (pp_options){.spec = gpt_spec(), .grid = grid, .schedule = s, .microbatches = m, .chunks = v,
                      .recompute = recompute, .optim = ref->o.optim,
                      .bounds = grid.pp == 1 ? NULL : v == 2 ? bounds_pp2x2 : bounds_pp2};
  rs.global_batch = ref->global_batch;
  rs.steps = ref->steps;
  rs.lr = ref->lr;
  int ranks = grid.dp * grid.tp * grid.pp;
  run_on(ranks, &rs);
  char what[128];
  snprintf(what, sizeof what, "gpt dp %d tp %d pp %d %s m %d%s%s", grid.dp, grid.tp, grid.pp, pp_schedule_name(s), m,
           recompute ? " recompute" : "", ref->steps ? " weights" : "");
  for (int r = 0; r < ranks; r++) {
    double rel = fabs(rs.loss[r] - ref->loss[0]) / fabs(ref->loss[0]);
    if (rel > 1e-5) fail_msg("%s: rank %d loss %.9g, single rank %.9g", what, r, rs.loss[r], ref->loss[0]);
    assert_true(rs.accuracy[r] == ref->accuracy[0]);
  }
  double worst = worst_difference(ref, &rs, ranks, what);
  if (worst > 1e-5) fail_msg("%s: a tensor differs by %.3g of its scale", what, worst);
  run_free(&rs, ranks);
}

static void test_trainer_matches_one_rank(void **state) {
  (void)state;
  run_spec ref;
  reference(&ref, MAX_BATCH, 0);
  /* The loss is per token: near ln(vocab) at the start. */
  assert_true(fabs(ref.loss[0] - log(VOCAB)) < 0.5);
  for (int s = PP_GPIPE; s <= PP_INTERLEAVED; s++) check_grid(&ref, (pp_grid){1, 2, 2}, (pp_schedule)s, 4, false);
  check_grid(&ref, (pp_grid){1, 4, 1}, PP_GPIPE, 2, false);
  check_grid(&ref, (pp_grid){2, 1, 1}, PP_GPIPE, 1, false);
  check_grid(&ref, (pp_grid){1, 2, 2}, PP_1F1B, 4, true);
  check_grid(&ref, (pp_grid){2, 2, 2}, PP_1F1B, 2, false);
  run_free(&ref, 1);
}

static void test_weights_after_steps_match_one_rank(void **state) {
  (void)state;
  run_spec ref;
  reference(&ref, MAX_BATCH, 4);
  check_grid(&ref, (pp_grid){1, 2, 2}, PP_1F1B, 4, false);
  run_free(&ref, 1);
}

/* ---- sequence parallelism and selective recomputation ------------------------------------ */

/* The encoder's batch: [MAX_BATCH, SEQ, 3] features and a class per sample. */
static float xe[MAX_BATCH * SEQ * 3];
static int32_t ye[MAX_BATCH];

static tfm_spec encoder_spec(void) {
  return (tfm_spec){.seq = SEQ, .features = 3, .hidden = 16, .heads = 4, .ffn = 32, .blocks = BLOCKS,
                    .classes = 3, .dropout = 0.1f, .seed = 29};
}

/* One run of `spec` on a grid: the first step's loss and gradients (steps 0) or the weights
 * after `steps` SGD steps. */
static void run_grid_with(run_spec *rs, tfm_spec spec, pp_grid grid, pp_schedule sched, int steps) {
  memset(rs, 0, sizeof *rs);
  bool gpt = spec.kind == TFM_GPT;
  int v = sched == PP_INTERLEAVED ? 2 : 1;
  rs->o = (pp_options){.spec = spec, .grid = grid, .schedule = sched, .microbatches = grid.pp > 1 ? 4 : 2,
                       .chunks = v, .optim = OPTIM_OPTIONS_INIT,
                       .bounds = grid.pp == 1 ? NULL : v == 2 ? bounds_pp2x2 : bounds_pp2};
  rs->x = gpt ? xs : xe;
  rs->y = gpt ? ys : ye;
  rs->global_batch = MAX_BATCH;
  rs->steps = steps;
  rs->lr = 0.1f;
  run_on(grid.dp * grid.tp * grid.pp, rs);
}

static void run_grid(run_spec *rs, tfm_spec spec, pp_grid grid, int steps) {
  run_grid_with(rs, spec, grid, PP_1F1B, steps);
}

/* b against a (the same grid): every rank's loss and every tensor within tol of a's. */
static void expect_same_run(const run_spec *a, const run_spec *b, double tol, const char *what) {
  int ranks = a->o.grid.dp * a->o.grid.tp * a->o.grid.pp;
  for (int r = 0; r < ranks; r++) {
    double rel = fabs(b->loss[r] - a->loss[r]) / fabs(a->loss[r]);
    if (rel > tol) fail_msg("%s: rank %d loss %.9g, against %.9g", what, r, b->loss[r], a->loss[r]);
    assert_int_equal(a->nkept[r], b->nkept[r]);
    for (size_t i = 0; i < a->nkept[r]; i++) {
      const kept_param *p = &a->kept[r][i], *q = &b->kept[r][i];
      assert_string_equal(p->name, q->name);
      double scale = 0, diff = 0;
      for (size_t j = 0; j < p->n; j++) {
        scale = fmax(scale, fabs(p->data[j]));
        diff = fmax(diff, fabs(p->data[j] - q->data[j]));
      }
      if (diff > tol * fmax(scale, 1e-30)) fail_msg("%s: rank %d '%s' differs by %.3g of %.3g", what, r, p->name, diff, scale);
    }
  }
}

/* Sequence parallel = plain tensor parallel, to 1e-6 relative: the first step's loss and
 * gradients and the weights after 3 steps, tp 2 and 4, the encoder and the GPT form, and
 * with a pipeline too; sequence parallelism holds less activation memory. */
static void test_sequence_parallel_matches_tensor_parallel(void **state) {
  (void)state;
  const pp_grid grids[] = {{1, 2, 1}, {1, 4, 1}, {1, 2, 2}};
  for (int kind = 0; kind < 2; kind++)
    for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++)
      for (int steps = 0; steps <= 3; steps += 3) {
        tfm_spec spec = kind ? gpt_spec() : encoder_spec();
        run_spec tp, sp;
        run_grid(&tp, spec, grids[g], steps);
        spec.sequence_parallel = true;
        run_grid(&sp, spec, grids[g], steps);
        char what[128];
        snprintf(what, sizeof what, "%s tp %d pp %d sequence parallel %s", kind ? "gpt" : "encoder", grids[g].tp,
                 grids[g].pp, steps ? "weights after 3 steps" : "gradients");
        expect_same_run(&tp, &sp, 1e-6, what);
        /* A run of blocks also keeps its input slice and its gathered output (1 + 1/tp of the
         * stream): a stage of one encoder block saves less than that, so only whole models. */
        if (!steps && grids[g].pp == 1)
          for (int r = 0; r < grids[g].tp * grids[g].pp; r++) {
            if (!(sp.peak[r] < tp.peak[r])) fprintf(stderr, "%s rank %d: peak %zu, tensor parallel %zu\n", what, r, sp.peak[r], tp.peak[r]);
            assert_true(sp.peak[r] < tp.peak[r]);
          }
        run_free(&tp, grids[g].tp * grids[g].pp);
        run_free(&sp, grids[g].tp * grids[g].pp);
      }
}

/* The same with data parallelism and under the other schedules (GPT form, gradients). */
static void test_sequence_parallel_on_other_grids(void **state) {
  (void)state;
  const struct {
    pp_grid grid;
    pp_schedule sched;
  } cases[] = {{{2, 2, 1}, PP_GPIPE}, {{1, 2, 2}, PP_GPIPE}, {{1, 2, 2}, PP_INTERLEAVED}, {{2, 2, 2}, PP_1F1B}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tfm_spec spec = gpt_spec();
    run_spec tp, sp;
    int ranks = cases[i].grid.dp * cases[i].grid.tp * cases[i].grid.pp;
    run_grid_with(&tp, spec, cases[i].grid, cases[i].sched, 0);
    spec.sequence_parallel = true;
    run_grid_with(&sp, spec, cases[i].grid, cases[i].sched, 0);
    char what[128];
    snprintf(what, sizeof what, "gpt dp %d tp %d pp %d %s sequence parallel", cases[i].grid.dp, cases[i].grid.tp,
             cases[i].grid.pp, pp_schedule_name(cases[i].sched));
    expect_same_run(&tp, &sp, 1e-6, what);
    run_free(&tp, ranks);
    run_free(&sp, ranks);
  }
}

/* Selective recomputation gives the same bits as keeping the probabilities, with and without
 * sequence parallelism, and holds less. */
static void test_selective_recompute_is_exact(void **state) {
  (void)state;
  for (int with_sp = 0; with_sp < 2; with_sp++) {
    tfm_spec spec = gpt_spec();
    spec.sequence_parallel = with_sp;
    run_spec keep, again;
    pp_grid grid = {1, 2, 2};
    run_grid(&keep, spec, grid, 0);
    spec.selective_recompute = true;
    run_grid(&again, spec, grid, 0);
    expect_same_run(&keep, &again, 0.0, with_sp ? "selective recompute, sequence parallel" : "selective recompute");
    for (int r = 0; r < 4; r++) assert_true(again.peak[r] < keep.peak[r]);
    run_free(&keep, 4);
    run_free(&again, 4);
  }
}

/* The activation bytes a chunk of two GPT blocks holds for one micro-batch follow
 * bench_pipeline's formula for our storage exactly, for tp 1, 2 and 4, with and without
 * sequence parallelism and selective recomputation. */
typedef struct act_case {
  tfm_spec spec;
  int tp, n;
  size_t peak[MAX_RANKS];
} act_case;

static fl_status act_rank(rank_job *job) {
  act_case *ac = job->arg;
  tfm_chunk *c = NULL;
  fl_tensor x = {0};
  int64_t shape[3] = {ac->n, ac->spec.seq, ac->spec.hidden};
  fl_status s = tfm_chunk_create(cpu, &ac->spec, 1, 3, ac->tp > 1 ? job->comm : NULL, job->rank, ac->tp, &c);
  if (s == FL_OK) s = tensor_ensure(&x, cpu, 3, shape);
  for (size_t i = 0; s == FL_OK && i < x.numel; i++) x.data[i] = (float)(i % 7) * 0.1f;
  const fl_tensor *y;
  tfm_batch b = {.row0 = 0, .step = 1};
  if (s == FL_OK) s = tfm_chunk_forward(c, 0, &x, &b, true, &y);
  if (s == FL_OK) ac->peak[job->rank] = tfm_chunk_peak_activation_bytes(c);
  tensor_release(&x);
  tfm_chunk_destroy(c);
  return s;
}

static void test_activation_bytes_follow_the_formula(void **state) {
  (void)state;
  const int tps[] = {1, 2, 4};
  for (size_t i = 0; i < 3; i++)
    for (int mode = 0; mode < 3; mode++) {
      int t = tps[i];
      bool sp = mode >= 1, sel = mode == 2;
      if (sp && t == 1) continue;
      act_case ac = {.spec = gpt_spec(), .tp = t, .n = 3};
      ac.spec.ffn = 4 * ac.spec.hidden;
      ac.spec.sequence_parallel = sp;
      ac.spec.selective_recompute = sel;
      rank_job jobs[MAX_RANKS];
      group *g = world(t);
      run_ranks(g->size, g->comms, act_rank, &ac, jobs);
      expect_all_ok(t, jobs);
      double s = SEQ, b = ac.n, h = ac.spec.hidden, a = ac.spec.heads, sbh = s * b * h;
      double probs = sel ? 0 : 4 * a * s / h;
      double block = sp ? sbh / t * (64 + 16 / h + probs) : sbh * (16 + 16 / h + (48 + probs) / t);
      double want = 2 * block + 4 * sbh + (sp ? 4 * sbh * (1.0 / t + 1) : 0);
      for (int r = 0; r < t; r++)
        if (fabs((double)ac.peak[r] - want) > 0.5)
          fail_msg("tp %d%s%s rank %d: %zu activation bytes, the formula %.0f", t, sp ? " sp" : "",
                   sel ? " selective" : "", r, ac.peak[r], want);
    }
}

static fl_status create_fails_rank(rank_job *job) {
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, job->arg, &t);
  pp_trainer_destroy(t);
  return s;
}

static void expect_create_error(const pp_options *o, const char *needle) {
  int ranks = o->grid.dp * o->grid.tp * o->grid.pp;
  rank_job jobs[MAX_RANKS];
  group *g = world(ranks);
  run_ranks(g->size, g->comms, create_fails_rank, (void *)o, jobs);
  for (int r = 0; r < ranks; r++) {
    assert_int_equal(jobs[r].status, FL_EINVAL);
    if (!strstr(jobs[r].msg, needle)) fail_msg("rank %d: '%s' does not say '%s'", r, jobs[r].msg, needle);
  }
}

static void test_bad_sequence_parallel_options(void **state) {
  (void)state;
  pp_options o = {.spec = gpt_spec(), .grid = {1, 1, 1}, .schedule = PP_1F1B, .microbatches = 1,
                  .optim = OPTIM_OPTIONS_INIT};
  o.spec.sequence_parallel = true;
  expect_create_error(&o, "sequence parallel needs a tensor-parallel group of at least 2 ranks");
  o.grid = (pp_grid){1, 4, 1};
  o.spec.seq = 6; /* not a multiple of 4 */
  expect_create_error(&o, "sequence parallel needs seq (6) to be a multiple of the tensor-parallel size 4");
}

/* ---- bad input ----------------------------------------------------------------------------- */

static void test_bad_specs_and_ids(void **state) {
  (void)state;
  tfm_spec sp = gpt_spec();
  tfm_chunk *c = NULL;
  sp.vocab = 0;
  assert_int_equal(tfm_chunk_create(cpu, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "vocab"));
  sp = gpt_spec();
  sp.kind = (tfm_kind)7;
  assert_int_equal(tfm_chunk_create(cpu, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "kind"));
  sp = gpt_spec();
  assert_ok(tfm_chunk_create(cpu, &sp, 0, tfm_units(&sp), NULL, 0, 1, &c));
  fl_tensor x = {0};
  int64_t wide[3] = {1, SEQ, 3}, ids[3] = {1, SEQ, 1};
  const fl_tensor *y;
  /* The GPT form reads one id per token, not features. */
  assert_ok(tensor_ensure(&x, cpu, 3, wide));
  assert_int_equal(tfm_chunk_forward(c, 0, &x, NULL, false, &y), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "expected [n, 8, 1]"));
  assert_ok(tensor_ensure(&x, cpu, 3, ids));
  for (int i = 0; i < SEQ; i++) x.data[i] = (float)i;
  x.data[3] = VOCAB; /* outside [0, vocab) */
  assert_int_equal(tfm_chunk_forward(c, 0, &x, NULL, false, &y), FL_EINVAL);
  tensor_release(&x);
  tfm_chunk_destroy(c);
}

static int setup(void **state) {
  (void)state;
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1);
  make_batch();
  uint64_t z = 31;
  for (size_t i = 0; i < sizeof xe / sizeof xe[0]; i++) xe[i] = urand_pm1(&z);
  for (int i = 0; i < MAX_BATCH; i++) ye[i] = (int32_t)((i * 5 + 1) % 3);
  return fl_device_open(FL_DEVICE_CPU, 0, &cpu) == FL_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  group_cache_destroy(&worlds);
  fl_device_close(cpu);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_causal_mask_op, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_later_tokens_do_not_change_earlier_outputs, test_bound_arm,
                                      test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_gradients_by_finite_differences, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_trainer_matches_one_rank, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_weights_after_steps_match_one_rank, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_sequence_parallel_matches_tensor_parallel, test_bound_arm,
                                      test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_sequence_parallel_on_other_grids, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_selective_recompute_is_exact, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_activation_bytes_follow_the_formula, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bad_sequence_parallel_options, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bad_specs_and_ids, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
