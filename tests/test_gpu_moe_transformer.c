/*
 * test_gpu_moe_transformer.c: the transformer with mixture-of-experts blocks
 * (transformer.h's spec.experts) in the hybrid trainer against one rank holding every expert,
 * on the cpu device with ranks as threads over loopback.
 *
 *   - gradients of one step (loss, balancing loss, dropped fraction, every parameter's
 *     gradient) equal the single rank's within 1e-6 of the parameter's scale, with the experts
 *     spread over dp 2, over pp 2 stages, over dp 2 x pp 2 (1F1B and interleaved with 2 chunks),
 *     replicated over tp 2, and with dp 2 x tp 2; dropout on, capacity low enough that tokens are dropped;
 *   - weights after a few SGD steps equal the single rank's (the encoder and the GPT form with
 *     experts in every other block, dp 2 x pp 2);
 *   - the balancing loss's gradient reaches the routers of a first stage (it changes them);
 *   - bad specs and grids are errors naming the cause.
 */
#define TEST_TIME_BOUND_S 300
#include <math.h>

#include "rank_threads.h"
#include "kept_params.h"

#include "gpu/device/device.h"
#include "gpu/parallel/pipeline.h"

static fl_device *cpu;

#define MAX_BATCH 16
#define SEQ 4
#define FEATURES 3

static tfm_spec spec_encoder(void) {
  return (tfm_spec){.seq = SEQ, .features = FEATURES, .hidden = 8, .heads = 2, .ffn = 16, .blocks = 2,
                    .classes = 3, .dropout = 0.1f, .seed = 11, .experts = 4, .top_k = 2,
                    .capacity_factor = 1.0f, .moe_alpha = 0.1f, .moe_every = 1};
}

static tfm_spec spec_gpt(void) {
  return (tfm_spec){.seq = SEQ, .hidden = 8, .heads = 2, .ffn = 16, .blocks = 2, .dropout = 0.1f, .seed = 5,
                    .kind = TFM_GPT, .vocab = 16, .experts = 4, .top_k = 1, .capacity_factor = 1.0f,
                    .moe_alpha = 0.1f, .moe_every = 2};
}

/* The global batch: seeded features (encoder) or token ids (GPT), labels per sample or token. */
static float xs[MAX_BATCH * SEQ * FEATURES], ids[MAX_BATCH * SEQ];
static int32_t ys[MAX_BATCH], next[MAX_BATCH * SEQ];
static void make_batch(void) {
  uint64_t z = 5;
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    xs[i] = (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  for (int i = 0; i < MAX_BATCH; i++) ys[i] = (int32_t)((i * 7 + 3) % 3);
  for (int i = 0; i < MAX_BATCH * SEQ; i++) {
    ids[i] = (float)((i * 5 + i / SEQ) % 16);
    next[i] = (int32_t)((i * 5 + i / SEQ + 3) % 16);
  }
}

/* ---- one run of the trainer on every rank ------------------------------------------------ */

typedef struct run_spec {
  pp_options o;
  int global_batch;
  int steps; /* 0: gradients of one step; else values after that many SGD steps */
  double loss[MAX_RANKS], aux[MAX_RANKS], dropped[MAX_RANKS];
  kept_param *kept[MAX_RANKS];
  size_t nkept[MAX_RANKS];
} run_spec;

static fl_status trainer_rank(rank_job *job) {
  run_spec *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  pp_coords me = pp_trainer_coords(t);
  bool gpt = rs->o.spec.kind == TFM_GPT;
  int batch = rs->global_batch / rs->o.grid.dp;
  const float *x = gpt ? ids + (size_t)me.dp * batch * SEQ : xs + (size_t)me.dp * batch * SEQ * FEATURES;
  const int32_t *y = gpt ? next + (size_t)me.dp * batch * SEQ : ys + (size_t)me.dp * batch;
  pp_step_stats st;
  int steps = rs->steps ? rs->steps : 1;
  for (int i = 0; i < steps && s == FL_OK; i++) {
    s = pp_trainer_compute_gradients(t, x, y, batch, (uint64_t)i, &st);
    if (s == FL_OK && i == 0) {
      rs->loss[job->rank] = st.loss;
      rs->aux[job->rank] = st.aux_loss;
      rs->dropped[job->rank] = st.dropped_fraction;
    }
    if (s == FL_OK && rs->steps) s = pp_trainer_apply(t, 0.1f, &st);
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
  run_ranks(ranks, world(ranks)->comms, trainer_rank, rs, jobs);
  expect_all_ok(ranks, jobs);
}

/* ---- comparing with the single rank ------------------------------------------------------- */

/* The largest difference of any rank's parameter from the reference's, relative to the
 * reference parameter's largest magnitude (at least a hundredth of the model's largest, as
 * test_gpu_pipeline.c: a sum that cancels to near zero carries its terms' rounding). Every
 * reference parameter, each expert included, must be held by some rank, and no expert by
 * two ranks of one tensor-parallel index. */
static double worst_difference(const run_spec *ref, const run_spec *rs, int ranks, int tp, const char *what) {
  int *held = calloc(ref->nkept[0], sizeof *held);
  assert_non_null(held);
  double worst = kept_worst_difference(rs->kept, rs->nkept, ranks, ref->kept[0], ref->nkept[0], 1e-6, what, held);
  for (int r = 0; r < ranks; r++)
    for (size_t i = 0; i < rs->nkept[r]; i++) {
      const kept_param *k = &rs->kept[r][i];
      assert_true(k->place.replicated || tp > 1);
      if (k->place.expert != (strstr(k->name, ".experts.") != NULL))
        fail_msg("%s: '%s' is%s marked an expert's", what, k->name, k->place.expert ? "" : " not");
    }
  for (size_t i = 0; i < ref->nkept[0]; i++) {
    const char *name = ref->kept[0][i].name;
    if (!held[i]) fail_msg("%s: no rank holds '%s'", what, name);
    /* an expert lives on one rank of each tensor-parallel index (tp copies in all) */
    if (strstr(name, ".experts.") && held[i] != tp) fail_msg("%s: '%s' is held %d times", what, name, held[i]);
  }
  free(held);
  return worst;
}

static void reference(run_spec *ref, tfm_spec spec, int global_batch, int steps) {
  memset(ref, 0, sizeof *ref);
  ref->o = (pp_options){.spec = spec, .grid = {1, 1, 1}, .schedule = PP_GPIPE, .microbatches = 1,
                        .optim = OPTIM_OPTIONS_INIT};
  ref->global_batch = global_batch;
  ref->steps = steps;
  run_on(1, ref);
}

static const int bounds_pp2[] = {0, 2, 4}, bounds_pp2x2[] = {0, 1, 2, 3, 4};

static void check_grid(const run_spec *ref, pp_grid grid, pp_schedule s, int m, double tol) {
  run_spec rs = {0};
  bool interleaved = s == PP_INTERLEAVED;
  rs.o = (pp_options){.spec = ref->o.spec, .grid = grid, .schedule = s, .microbatches = m,
                      .chunks = interleaved ? 2 : 1,
                      .bounds = grid.pp == 2 ? (interleaved ? bounds_pp2x2 : bounds_pp2) : NULL,
                      .optim = OPTIM_OPTIONS_INIT};
  rs.global_batch = ref->global_batch;
  rs.steps = ref->steps;
  int ranks = grid.dp * grid.tp * grid.pp;
  run_on(ranks, &rs);
  char what[128];
  snprintf(what, sizeof what, "%s dp %d tp %d pp %d %s m %d%s", rs.o.spec.kind == TFM_GPT ? "gpt" : "encoder", grid.dp,
           grid.tp, grid.pp, pp_schedule_name(s), m, rs.steps ? " (weights)" : "");
  for (int r = 0; r < ranks; r++) {
    double rel = fabs(rs.loss[r] - ref->loss[0]) / fabs(ref->loss[0]);
    if (rel > 1e-6) fail_msg("%s: rank %d loss %.9g, single rank %.9g", what, r, rs.loss[r], ref->loss[0]);
    rel = fabs(rs.aux[r] - ref->aux[0]) / fabs(ref->aux[0]);
    if (rel > 1e-6) fail_msg("%s: rank %d balancing loss %.9g, single rank %.9g", what, r, rs.aux[r], ref->aux[0]);
    if (rs.dropped[r] != ref->dropped[0])
      fail_msg("%s: rank %d dropped %.6f of the choices, single rank %.6f", what, r, rs.dropped[r], ref->dropped[0]);
  }
  double worst = worst_difference(ref, &rs, ranks, grid.tp, what);
  if (worst > tol) fail_msg("%s: a parameter differs by %.3g of its scale", what, worst);
  run_free(&rs, ranks);
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_gradients_equal_one_rank(void **state) {
  (void)state;
  run_spec ref;
  reference(&ref, spec_encoder(), 8, 0);
  assert_true(ref.aux[0] > 0);
  /* capacity 1.0 with top-2 over 4 tokens a sample: some choices are dropped */
  assert_true(ref.dropped[0] > 0 && ref.dropped[0] < 1);
  check_grid(&ref, (pp_grid){2, 1, 1}, PP_GPIPE, 1, 1e-6);
  check_grid(&ref, (pp_grid){2, 1, 1}, PP_1F1B, 2, 1e-6);
  check_grid(&ref, (pp_grid){1, 1, 2}, PP_1F1B, 2, 1e-6);
  check_grid(&ref, (pp_grid){2, 1, 2}, PP_1F1B, 2, 1e-6);
  check_grid(&ref, (pp_grid){2, 1, 2}, PP_INTERLEAVED, 2, 1e-6);
  check_grid(&ref, (pp_grid){1, 2, 1}, PP_GPIPE, 1, 1e-6);
  check_grid(&ref, (pp_grid){2, 2, 1}, PP_GPIPE, 2, 1e-6);
  run_free(&ref, 1);
}

static void test_weights_after_steps(void **state) {
  (void)state;
  run_spec ref;
  reference(&ref, spec_encoder(), 8, 3);
  check_grid(&ref, (pp_grid){2, 1, 2}, PP_1F1B, 2, 1e-6);
  run_free(&ref, 1);
  reference(&ref, spec_gpt(), 8, 3);
  check_grid(&ref, (pp_grid){2, 1, 2}, PP_1F1B, 2, 1e-6);
  check_grid(&ref, (pp_grid){2, 1, 1}, PP_GPIPE, 1, 1e-6);
  run_free(&ref, 1);
}

/* The balancing loss's gradient has no dy: it must enter each block's backward, so the
 * routers of a first stage (which sees no loss) change with alpha. */
static void test_balancing_gradient_reaches_first_stage(void **state) {
  (void)state;
  run_spec a = {0}, b = {0};
  tfm_spec spec = spec_encoder();
  pp_options o = {.spec = spec, .grid = {1, 1, 2}, .schedule = PP_1F1B, .microbatches = 2, .bounds = bounds_pp2,
                  .optim = OPTIM_OPTIONS_INIT};
  a.o = o;
  a.global_batch = 8;
  b.o = o;
  b.o.spec.moe_alpha = 0;
  b.global_batch = 8;
  run_on(2, &a);
  run_on(2, &b);
  assert_true(a.aux[0] > 0);
  assert_true(b.aux[0] == 0);
  double diff = 0;
  bool seen = false;
  for (size_t i = 0; i < a.nkept[0]; i++) {
    if (!strstr(a.kept[0][i].name, "blocks.0.moe.router")) continue;
    seen = true;
    for (size_t j = 0; j < a.kept[0][i].n; j++) diff = fmax(diff, fabs(a.kept[0][i].data[j] - b.kept[0][i].data[j]));
  }
  assert_true(seen);
  assert_true(diff > 1e-4);
  run_free(&a, 2);
  run_free(&b, 2);
}

/* ---- bad input ----------------------------------------------------------------------------- */

static fl_status create_trainer_rank(rank_job *job) {
  pp_options *o = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, o, &t);
  pp_trainer_destroy(t);
  return s;
}

static void expect_create_error(pp_options *o, int ranks, const char *needle) {
  rank_job jobs[MAX_RANKS];
  run_ranks(ranks, world(ranks)->comms, create_trainer_rank, o, jobs);
  for (int r = 0; r < ranks; r++) {
    if (jobs[r].status == FL_OK) fail_msg("rank %d: created, expected an error with '%s'", r, needle);
    if (!strstr(jobs[r].msg, needle)) fail_msg("rank %d: '%s' does not name '%s'", r, jobs[r].msg, needle);
  }
}

static void test_bad_specs(void **state) {
  (void)state;
  tfm_spec s = spec_encoder();
  s.experts = 3;
  s.top_k = 2;
  pp_options o = {.spec = s, .grid = {2, 1, 1}, .schedule = PP_GPIPE, .microbatches = 1};
  expect_create_error(&o, 2, "multiple of the expert-parallel size 2");
  s = spec_encoder();
  s.top_k = 5;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "top_k"));
  s = spec_encoder();
  s.capacity_factor = 0;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "capacity"));
  s = spec_encoder();
  s.moe_every = 3;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "moe_every"));
  s.moe_every = 0;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "moe_every"));
  s = spec_encoder();
  s.experts = -1;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "experts"));
  s = spec_encoder();
  s.sequence_parallel = true;
  assert_int_equal(tfm_spec_check(&s, 2), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "sequence parallel"));
  s = spec_encoder();
  s.moe_alpha = -1;
  assert_int_equal(tfm_spec_check(&s, 1), FL_EINVAL);
  static const int replicas[] = {2, 1};
  o = (pp_options){.spec = spec_encoder(), .grid = {1, 1, 2}, .schedule = PP_GPIPE, .microbatches = 2,
                   .replicas = replicas};
  expect_create_error(&o, 3, "stage replication does not run with experts");
  o = (pp_options){.spec = spec_encoder(), .grid = {1, 1, 2}, .schedule = PP_PIPEDREAM, .microbatches = 2};
  expect_create_error(&o, 2, "experts run with the gpipe, 1f1b and interleaved schedules, not pipedream");
  /* without experts the other fields are ignored */
  s = spec_encoder();
  s.experts = 0;
  s.top_k = 0;
  s.moe_every = 0;
  assert_int_equal(tfm_spec_check(&s, 1), FL_OK);
}

static int setup(void **state) {
  (void)state;
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1);
  make_batch();
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
      cmocka_unit_test_setup_teardown(test_bad_specs, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_gradients_equal_one_rank, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_weights_after_steps, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_balancing_gradient_reaches_first_stage, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
