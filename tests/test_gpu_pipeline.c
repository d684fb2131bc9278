/*
 * test_gpu_pipeline.c: the hybrid trainer (gpu/parallel/pipeline.h) against one rank, on the cpu
 * device, with ranks as threads over loopback.
 *
 *   - equivalence: for tp in {1, 2, 4} and pp in {1, 2, 4}, every schedule (interleaved with
 *     2 chunks per pipeline rank) and m from 1 to 16 micro-batches, the loss and every
 *     parameter gradient of one step equal the single-rank computation of the same global
 *     batch within 1e-5 (relative to the parameter's largest gradient), dropout on;
 *     data parallel and all three dimensions at once too;
 *   - weights after 10 steps equal the single rank's (1f1b and interleaved, tp 2, pp 2; SGD,
 *     AdamW, and LAMB with tp 1);
 *   - recomputation gives the same gradients and holds less activation memory;
 *   - every rank runs its forwards and backwards in its schedule's order, and that order's
 *     bubble on a simulated clock (a forward one unit, a backward two) is (p-1)/(m+p-1), or
 *     (p-1)/(vm+p-1) interleaved; the trainer reports pp_bubble_theory. The measured bubble
 *     depends on the host's load, so bench_pipeline prints it, no test asserts on it;
 *   - GPipe's peak activation memory grows with m while 1F1B's stays bounded by p;
 *   - the automatic cut covers the units in order; bad grids, cuts and batches are errors.
 * Every run finishes, so no schedule deadlocks (a hang would trip the comm timeout, set to
 * 20 s here, and the test's time bound).
 */
#define TEST_TIME_BOUND_S 600
#include <math.h>

#include "rank_threads.h"
#include "kept_params.h"

#include "gpu/device/device.h"
#include "gpu/parallel/pipeline.h"

static fl_device *cpu;

#define BLOCKS 6 /* units: embedding, 6 blocks, head = 8: pp 4 x 2 chunks fits */
#define MAX_BATCH 32

static tfm_spec spec_small(void) {
  return (tfm_spec){.seq = 4, .features = 3, .hidden = 8, .heads = 4, .ffn = 16, .blocks = BLOCKS,
                    .classes = 3, .dropout = 0.1f, .seed = 11};
}

/* The global batch: seeded inputs and labels. */
static float xs[MAX_BATCH * 4 * 3];
static int32_t ys[MAX_BATCH];
static void make_batch(void) {
  uint64_t z = 5;
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    xs[i] = (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  for (int i = 0; i < MAX_BATCH; i++) ys[i] = (int32_t)((i * 7 + 3) % 3);
}

/* ---- one run of the trainer on every rank ------------------------------------------------ */

typedef struct run_spec {
  pp_options o;
  int global_batch; /* split over dp replicas */
  int steps;        /* 0: gradients of one step; else values after that many steps */
  float lr;
  /* results, per rank */
  double loss[MAX_RANKS], bubble[MAX_RANKS], theory;
  size_t peak[MAX_RANKS];
  pp_op *ops[MAX_RANKS]; /* the forwards and backwards of the first step, in the order run */
  size_t nops[MAX_RANKS];
  kept_param *kept[MAX_RANKS];
  size_t nkept[MAX_RANKS];
} run_spec;

/* The forwards and backwards of a step's timeline, in the order they ran. */
static fl_status keep_ops(const pp_step_stats *st, pp_op **out, size_t *nout) {
  pp_op *ops = malloc((st->num_events ? st->num_events : 1) * sizeof *ops);
  if (!ops) return FL_ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < st->num_events; i++) {
    const pp_event *e = &st->events[i];
    if (e->kind == PP_EV_FORWARD || e->kind == PP_EV_BACKWARD)
      ops[n++] = (pp_op){e->kind == PP_EV_FORWARD ? PP_FORWARD : PP_BACKWARD, e->microbatch, e->chunk};
  }
  *out = ops;
  *nout = n;
  return FL_OK;
}

static fl_status trainer_rank(rank_job *job) {
  run_spec *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  pp_coords me = pp_trainer_coords(t);
  int batch = rs->global_batch / rs->o.grid.dp;
  const float *x = xs + (size_t)me.dp * batch * 4 * 3;
  const int32_t *y = ys + (size_t)me.dp * batch;
  pp_step_stats st;
  int steps = rs->steps ? rs->steps : 1;
  for (int i = 0; i < steps && s == FL_OK; i++) {
    s = pp_trainer_compute_gradients(t, x, y, batch, (uint64_t)i, &st);
    if (s == FL_OK && i == 0) {
      rs->loss[job->rank] = st.loss;
      rs->bubble[job->rank] = st.bubble;
      rs->theory = st.bubble_theory;
      rs->peak[job->rank] = st.peak_activation_bytes;
      s = keep_ops(&st, &rs->ops[job->rank], &rs->nops[job->rank]);
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
    free(rs->ops[r]);
    rs->ops[r] = NULL;
    rs->nops[r] = 0;
  }
}

static void run_on(group *g, run_spec *rs) {
  rank_job jobs[MAX_RANKS];
  run_ranks(g->size, g->comms, trainer_rank, rs, jobs);
  expect_all_ok(g->size, jobs);
}

/* ---- comparing with the single rank ------------------------------------------------------- */

/* The largest difference of any rank's shard from its slice of the reference
 * (kept_worst_difference, which also checks that every reference parameter is held). */
static double worst_difference(const run_spec *ref, const run_spec *rs, int ranks, const char *what) {
  return kept_worst_difference(rs->kept, rs->nkept, ranks, ref->kept[0], ref->nkept[0], 1e-5, what, NULL);
}

static group_cache worlds;

static group *world(int size) { return group_cache_get(&worlds, size); }

/* The single rank's gradients (steps 0) or weights after `steps`, for a global batch, with
 * `optim` (NULL: SGD's defaults). */
static void reference_with(run_spec *ref, int global_batch, int steps, const optim_options *optim) {
  memset(ref, 0, sizeof *ref);
  ref->o = (pp_options){.spec = spec_small(), .grid = {1, 1, 1}, .schedule = PP_GPIPE, .microbatches = 1,
                        .optim = OPTIM_OPTIONS_INIT};
  if (optim) ref->o.optim = *optim;
  ref->global_batch = global_batch;
  ref->steps = steps;
  ref->lr = 0.05f;
  run_on(world(1), ref);
}

static void reference(run_spec *ref, int global_batch, int steps) { reference_with(ref, global_batch, steps, NULL); }

static const int units_bounds_pp2[] = {0, 4, 8};
static const int units_bounds_pp4[] = {0, 2, 4, 6, 8};
static const int units_bounds_pp2x2[] = {0, 2, 4, 6, 8};
static const int units_bounds_pp4x2[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};

static const int *bounds_for(int pp, int v) {
  static const int whole[] = {0, 8};
  if (pp == 1) return whole;
  if (pp == 2) return v == 2 ? units_bounds_pp2x2 : units_bounds_pp2;
  return v == 2 ? units_bounds_pp4x2 : units_bounds_pp4;
}

static void check_grid(pp_grid grid, pp_schedule s, int m, int global_batch, const run_spec *ref) {
  run_spec rs = {0};
  int v = s == PP_INTERLEAVED ? 2 : 1;
  rs.o = (pp_options){.spec = spec_small(), .grid = grid, .schedule = s, .microbatches = m, .chunks = v,
                      .bounds = bounds_for(grid.pp, v), .optim = ref->o.optim};
  rs.global_batch = global_batch;
  int ranks = grid.dp * grid.tp * grid.pp;
  run_on(world(ranks), &rs);
  char what[96];
  snprintf(what, sizeof what, "dp %d tp %d pp %d %s m %d", grid.dp, grid.tp, grid.pp, pp_schedule_name(s), m);
  for (int r = 0; r < ranks; r++) {
    double rel = fabs(rs.loss[r] - ref->loss[0]) / fabs(ref->loss[0]);
    if (rel > 1e-5) fail_msg("%s: rank %d loss %.9g, single rank %.9g", what, r, rs.loss[r], ref->loss[0]);
  }
  double worst = worst_difference(ref, &rs, ranks, what);
  if (worst > 1e-5) fail_msg("%s: a gradient differs by %.3g of its scale", what, worst);
  run_free(&rs, ranks);
}

/* tp x pp, every schedule, m = 1..16 (global batch 16: m micro-batches of 16/m rows when m
 * divides 16, else a batch of m rows). */
static void test_equivalence_matrix(void **state) {
  (void)state;
  static const int tps[] = {1, 2, 4}, pps[] = {1, 2, 4};
  run_spec refs[17] = {0};
  bool have[17] = {false};
  for (size_t a = 0; a < 3; a++)
    for (size_t b = 0; b < 3; b++)
      for (int s = PP_GPIPE; s <= PP_INTERLEAVED; s++)
        for (int m = 1; m <= 16; m++) {
          /* every m for the pipelines of tp 1; a spread of m when tensor parallel too */
          if (tps[a] > 1 && m != 1 && m != 3 && m != 8 && m != 16) continue;
          if (pps[b] == 1 && s != PP_GPIPE) continue; /* one stage: the schedules coincide */
          int gb = 16 % m == 0 ? 16 : m;
          if (!have[gb]) {
            reference(&refs[gb], gb, 0);
            have[gb] = true;
          }
          check_grid((pp_grid){1, tps[a], pps[b]}, (pp_schedule)s, m, gb, &refs[gb]);
        }
  for (int i = 0; i <= 16; i++)
    if (have[i]) run_free(&refs[i], 1);
}

/* Data parallel alone and all three dimensions at once (dp 2 x tp 2 x pp 2 = 8 ranks). */
static void test_hybrid_grids(void **state) {
  (void)state;
  run_spec ref;
  reference(&ref, 16, 0);
  check_grid((pp_grid){2, 1, 1}, PP_GPIPE, 1, 16, &ref);
  check_grid((pp_grid){2, 2, 1}, PP_GPIPE, 2, 16, &ref);
  check_grid((pp_grid){2, 1, 2}, PP_1F1B, 4, 16, &ref);
  check_grid((pp_grid){2, 2, 2}, PP_1F1B, 4, 16, &ref);
  check_grid((pp_grid){2, 2, 2}, PP_INTERLEAVED, 4, 16, &ref);
  run_free(&ref, 1);
}

/* Ten steps (SGD with momentum and weight decay; AdamW; LAMB, whose trust ratios need whole
 * weights, without tensor parallelism) reach the single rank's weights within tol. */
static void weights_after_ten_steps(const optim_options *optim, int tp, double tol) {
  run_spec ref;
  reference_with(&ref, 16, 10, optim);
  static const pp_schedule kinds[] = {PP_1F1B, PP_INTERLEAVED};
  for (int i = 0; i < 2; i++) {
    run_spec rs = {0};
    int v = kinds[i] == PP_INTERLEAVED ? 2 : 1;
    rs.o = (pp_options){.spec = spec_small(), .grid = {1, tp, 2}, .schedule = kinds[i], .microbatches = 4,
                        .chunks = v, .bounds = bounds_for(2, v), .optim = ref.o.optim};
    rs.global_batch = 16;
    rs.steps = 10;
    rs.lr = ref.lr;
    run_on(world(2 * tp), &rs);
    double worst = worst_difference(&ref, &rs, 2 * tp, pp_schedule_name(kinds[i]));
    fprintf(stderr, "  10 %s steps, tp %d pp 2 %s: weights differ by at most %.3g of their scale\n",
            optim_kind_name(ref.o.optim.kind), tp, pp_schedule_name(kinds[i]), worst);
    assert_true(worst <= tol);
    run_free(&rs, 2 * tp);
  }
  run_free(&ref, 1);
}

static void test_weights_after_ten_steps(void **state) {
  (void)state;
  weights_after_ten_steps(NULL, 2, 1e-5);
  optim_options o = OPTIM_OPTIONS_INIT;
  o.kind = OPTIM_ADAMW;
  o.weight_decay = 0.01f;
  /* Attention's key bias has a gradient of exactly 0 (softmax ignores a constant added to
   * every key), so what it gets is rounding, which differs with the split; Adam's m / sqrt(v)
   * would blow that noise up to steps of the full rate. An eps far above the noise (1e-9)
   * and below most real gradients (1e-2) keeps Adam's rule for the rest. Adam's step divides
   * a gradient by its own size, so the rounding of a small coordinate passes to its step in
   * full, where SGD scales it by the coordinate: 1e-4 (ten times SGD's bound). */
  o.eps = 1e-3f;
  weights_after_ten_steps(&o, 2, 1e-4);
  o.kind = OPTIM_LAMB;
  weights_after_ten_steps(&o, 1, 1e-4);
}

/* Recomputation: the same gradients, less activation memory held on the first stage. */
static void test_recompute(void **state) {
  (void)state;
  run_spec ref, plain = {0}, again = {0};
  reference(&ref, 16, 0);
  plain.o = (pp_options){.spec = spec_small(), .grid = {1, 1, 2}, .schedule = PP_GPIPE, .microbatches = 8,
                         .bounds = bounds_for(2, 1), .optim = ref.o.optim};
  plain.global_batch = again.global_batch = 16;
  again.o = plain.o;
  again.o.recompute = true;
  run_on(world(2), &plain);
  run_on(world(2), &again);
  assert_true(worst_difference(&ref, &again, 2, "recompute") <= 1e-5);
  fprintf(stderr, "  peak activation bytes, rank 0, gpipe m 8: %zu stored, %zu with recompute\n",
          plain.peak[0], again.peak[0]);
  assert_true(again.peak[0] < plain.peak[0]);
  run_free(&ref, 1);
  run_free(&plain, 2);
  run_free(&again, 2);
}

/* ---- the bubble and activation memory ------------------------------------------------------ */

static void bubble_case(pp_schedule s, int p, int m, int v, double fwd_s, run_spec *rs) {
  memset(rs, 0, sizeof *rs);
  rs->o = (pp_options){.spec = spec_small(), .grid = {1, 1, p}, .schedule = s, .microbatches = m, .chunks = v,
                       .bounds = bounds_for(p, v), .synthetic_forward_s = fwd_s};
  rs->global_batch = m;
  run_on(world(p), rs);
}

/* Whether rank r ran exactly its schedule's op list; a message for the first difference. */
static bool ran_schedule(const run_spec *rs, int r, char *why, size_t cap) {
  const pp_options *o = &rs->o;
  pp_op *want = NULL;
  size_t n = 0;
  fl_status s = pp_schedule_ops(o->schedule, o->grid.pp, o->microbatches, o->chunks, r, &want, &n);
  if (s != FL_OK) {
    snprintf(why, cap, "pp_schedule_ops: %s", fl_status_name(s));
    return false;
  }
  bool same = n == rs->nops[r];
  if (!same) snprintf(why, cap, "rank %d ran %zu ops, its schedule has %zu", r, rs->nops[r], n);
  for (size_t i = 0; same && i < n; i++) {
    const pp_op *a = &rs->ops[r][i], *b = &want[i];
    same = a->kind == b->kind && a->microbatch == b->microbatch && a->chunk == b->chunk;
    if (!same)
      snprintf(why, cap, "rank %d op %zu: ran %s mb %d chunk %d, the schedule has %s mb %d chunk %d", r, i,
               a->kind == PP_FORWARD ? "forward" : "backward", a->microbatch, a->chunk,
               b->kind == PP_FORWARD ? "forward" : "backward", b->microbatch, b->chunk);
  }
  free(want);
  return same;
}

/* The bubble is the schedule's, checked on a simulated clock rather than measured (a measured
 * bubble depends on what else the host runs; bench_pipeline prints it beside the theory).
 * Every rank runs its forwards and backwards in its schedule's order, and the orders that ran,
 * simulated with a forward one unit and a backward two, idle (p-1)/(m+p-1) of the step, the
 * theory; interleaved, (p-1)/(vm+p-1), the fraction of the step that the theory's
 * (p-1)/(m+p-1)/v of the ideal time is (gpu/parallel/pipeline_schedule.h). The trainer reports
 * pp_bubble_theory. */
static void test_bubble_of_the_schedule_run(void **state) {
  (void)state;
  struct {
    pp_schedule s;
    int p, m, v;
  } cases[] = {{PP_GPIPE, 4, 8, 1}, {PP_1F1B, 4, 8, 1}, {PP_1F1B, 2, 4, 1}, {PP_1F1B, 4, 3, 1},
               {PP_INTERLEAVED, 4, 8, 2}, {PP_INTERLEAVED, 2, 4, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int p = cases[i].p, m = cases[i].m, v = cases[i].v;
    run_spec rs;
    bubble_case(cases[i].s, p, m, v, 0, &rs);
    char why[256] = "";
    bool in_order = true;
    for (int r = 0; in_order && r < p; r++) in_order = ran_schedule(&rs, r, why, sizeof why);
    double makespan = -1, bubble = -1;
    const pp_op *lists[MAX_RANKS];
    for (int r = 0; r < p; r++) lists[r] = rs.ops[r];
    fl_status sim = pp_simulate_ops(p, v, lists, rs.nops, 1, 2, &makespan, &bubble);
    double theory = pp_bubble_theory(cases[i].s, p, m, v), reported = rs.theory;
    run_free(&rs, p); /* before any assertion, so that a failure leaks nothing */
    double want = (double)(p - 1) / (v * m + p - 1);
    fprintf(stderr, "  %s p %d m %d v %d: simulated bubble of the run %.4f, want %.4f, theory %.4f\n",
            pp_schedule_name(cases[i].s), p, m, v, bubble, want, theory);
    if (!in_order) fail_msg("%s p %d m %d v %d: %s", pp_schedule_name(cases[i].s), p, m, v, why);
    assert_int_equal(sim, FL_OK);
    assert_true(fabs(bubble - want) < 1e-12);
    /* with unit times, the makespan is the work of a device, 3vm, plus the fill and drain */
    assert_true(fabs(makespan - 3.0 * (v * m + p - 1)) < 1e-9);
    if (v == 1) assert_true(fabs(bubble - theory) < 1e-12);
    assert_true(reported == theory);
  }
}

/* GPipe holds every micro-batch's activations on the first stage; 1F1B at most p of them. */
static void test_peak_activation_memory(void **state) {
  (void)state;
  size_t gpipe[2], one_f[2];
  int ms[2] = {8, 16};
  for (int i = 0; i < 2; i++) {
    run_spec a, b;
    bubble_case(PP_GPIPE, 4, ms[i], 1, 0, &a);
    bubble_case(PP_1F1B, 4, ms[i], 1, 0, &b);
    gpipe[i] = a.peak[0];
    one_f[i] = b.peak[0];
    fprintf(stderr, "  m %d, rank 0 peak activation bytes: gpipe %zu, 1f1b %zu\n", ms[i], gpipe[i], one_f[i]);
    run_free(&a, 4);
    run_free(&b, 4);
  }
  /* micro-batches of one row: the same bytes per micro-batch at both m */
  assert_true(gpipe[1] > gpipe[0] * 3 / 2);
  assert_int_equal(one_f[0], one_f[1]);
  assert_true(one_f[0] * 3 / 2 < gpipe[0]);
}

/* ---- the cut and bad input ------------------------------------------------------------------ */

static fl_status auto_cut_rank(rank_job *job) {
  pp_options *o = job->arg;
  pp_trainer *t;
  fl_status s = pp_trainer_create(cpu, job->comm, o, &t);
  if (s != FL_OK) return s;
  const int *b = pp_trainer_bounds(t);
  int stages = o->grid.pp * (o->chunks ? o->chunks : 1);
  bool ok = b[0] == 0 && b[stages] == tfm_units(&o->spec);
  for (int i = 0; i < stages; i++) ok = ok && b[i] < b[i + 1];
  pp_trainer_destroy(t);
  return ok ? FL_OK : fl_set_error(FL_EINTERNAL, "rank %d: the automatic cut is not in order", job->rank);
}

static void test_automatic_cut(void **state) {
  (void)state;
  pp_options o = {.spec = spec_small(), .grid = {1, 1, 4}, .schedule = PP_1F1B, .microbatches = 4};
  rank_job jobs[MAX_RANKS];
  run_ranks(4, world(4)->comms, auto_cut_rank, &o, jobs);
  expect_all_ok(4, jobs);
}

static fl_status create_fails_rank(rank_job *job) {
  pp_options *o = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, o, &t);
  pp_trainer_destroy(t);
  return s;
}

static void expect_create_error(pp_options *o, int ranks, const char *needle) {
  rank_job jobs[MAX_RANKS];
  run_ranks(ranks, world(ranks)->comms, create_fails_rank, o, jobs);
  for (int r = 0; r < ranks; r++) {
    assert_int_equal(jobs[r].status, FL_EINVAL);
    if (!strstr(jobs[r].msg, needle)) fail_msg("rank %d: '%s' does not say '%s'", r, jobs[r].msg, needle);
  }
}

static void test_bad_options(void **state) {
  (void)state;
  pp_options o = {.spec = spec_small(), .grid = {1, 2, 2}, .schedule = PP_1F1B, .microbatches = 2};
  expect_create_error(&o, 2, "world has 2");
  o.grid = (pp_grid){1, 1, 2};
  o.chunks = 2;
  expect_create_error(&o, 2, "interleaved");
  o.chunks = 1;
  static const int short_cut[] = {0, 4, 5}, empty[] = {0, 8, 8};
  o.bounds = short_cut;
  expect_create_error(&o, 2, "end at 8");
  o.bounds = empty;
  expect_create_error(&o, 2, "stage 1 is empty");
  o.bounds = NULL;
  o.grid = (pp_grid){1, 1, 2};
  o.chunks = 8;
  o.schedule = PP_INTERLEAVED;
  expect_create_error(&o, 2, "only 8 units");
  o.chunks = 1;
  o.microbatches = 0;
  expect_create_error(&o, 2, "micro-batches");
  o.microbatches = 2;
  o.schedule = PP_1F1B;
  o.grid = (pp_grid){1, 2, 1};
  o.optim = (optim_options)OPTIM_OPTIONS_INIT;
  o.optim.kind = OPTIM_LAMB;
  expect_create_error(&o, 2, "lamb needs each weight's whole norm, but tp 2");
  o.optim.kind = OPTIM_ADAM;
  o.optim.eps = 0;
  expect_create_error(&o, 2, "adam: eps 0");

  pp_grid g;
  assert_int_equal(pp_grid_parse("2x1", &g), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "DPxTPxPP"));
  assert_int_equal(pp_grid_parse("2x2x1", &g), FL_OK);
  assert_int_equal(g.dp * 100 + g.tp * 10 + g.pp, 221);
}

static fl_status bad_batch_rank(rank_job *job) {
  pp_options o = {.spec = spec_small(), .grid = {1, 1, 1}, .schedule = PP_GPIPE, .microbatches = 3};
  pp_trainer *t;
  fl_status s = pp_trainer_create(cpu, job->comm, &o, &t);
  if (s != FL_OK) return s;
  pp_step_stats st;
  s = pp_trainer_compute_gradients(t, xs, ys, 16, 0, &st);
  pp_trainer_destroy(t);
  return s;
}

static void test_bad_batch(void **state) {
  (void)state;
  rank_job jobs[MAX_RANKS];
  run_ranks(1, world(1)->comms, bad_batch_rank, NULL, jobs);
  assert_int_equal(jobs[0].status, FL_EINVAL);
  assert_non_null(strstr(jobs[0].msg, "3 equal micro-batches"));
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
      cmocka_unit_test_setup_teardown(test_bad_options, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bad_batch, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_automatic_cut, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_equivalence_matrix, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_hybrid_grids, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_weights_after_ten_steps, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_recompute, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bubble_of_the_schedule_run, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_peak_activation_memory, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
