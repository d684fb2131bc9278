/*
 * test_gpu_plan: the automatic plan (gpu/parallel/plan.h, plan_profile.h) and `flint train
 * --plan auto`.
 * - On made-up profiles the search picks what a hand calculation says: pure data parallelism
 *   when communication is free; a pipeline when the memory of a rank forces it (and the
 *   deepest one when only it fits, a clear error when nothing does); no tensor parallelism
 *   when its activations' allreduces are dear, and tensor parallelism when the data-parallel
 *   gradient allreduce is the dear one.
 * - The dynamic program's cut is the brute force's optimum on small random cases, with and
 *   without a memory limit.
 * - Bad problems and bad plans are clear errors.
 * - The profiler measures a tiny model at tp 1 and 2 and its profile can be searched.
 * - `flint train --plan auto` end to end (a child process, local mode): it prints the chosen
 *   plan and its prediction, trains and prints the measured step time; with --tp it is a usage
 *   error. (Fashion-MNIST needed; skipped without it.)
 * No assertion is on a measured time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#define TEST_TIME_BOUND_S 120
#include "test_util.h"
#include "run_child.h"
#include "fashion_data.h"

#include "common/common.h"
#include "gpu/parallel/plan_profile.h"

/* ---- made-up profiles ------------------------------------------------------------------- */

typedef struct test_link {
  double alpha, beta; /* seconds a message, seconds a byte */
} test_link;

static double ring_allreduce(void *user, int ranks, double bytes) {
  const test_link *l = user;
  return l->alpha + 2.0 * (ranks - 1) / ranks * bytes * l->beta;
}
static double plain_send(void *user, double bytes) {
  const test_link *l = user;
  return l->alpha + bytes * l->beta;
}

/* n units of forward row_s a sample (backward twice that), `params` bytes and `act` bytes of
 * activations a sample each, output `out` bytes a sample; at tp t everything but the output
 * splits perfectly. Units 1..n-2 are blocks (two allreduces each at tp > 1). */
static void make_units(plan_unit *u, int n, const int *tps, int ntp, double row_s, double params, double act,
                       double out) {
  for (int i = 0; i < n; i++) {
    u[i] = (plan_unit){.out_row_bytes = out, .tp_allreduces = i > 0 && i < n - 1 ? 2 : 0};
    for (int k = 0; k < ntp; k++) {
      u[i].fwd[k] = (plan_cost){0, row_s / tps[k]};
      u[i].bwd[k] = (plan_cost){0, 2 * row_s / tps[k]};
      u[i].param_bytes[k] = params / tps[k];
      u[i].act_row_bytes[k] = act / tps[k];
    }
  }
}

static plan_problem problem(int world, int batch, const plan_unit *u, int n, const int *tps, int ntp, test_link *l) {
  plan_problem p = {.world = world, .batch = batch, .units = n, .unit = u, .ntp = ntp, .state_copies = 1,
                    .allreduce_s = ring_allreduce, .send_s = plain_send, .user = l};
  for (int k = 0; k < ntp; k++) p.tp[k] = tps[k];
  return p;
}

static void print_plans(const plan_choice *c, size_t n) {
  char line[512];
  for (size_t i = 0; i < n; i++) {
    plan_choice_format(&c[i], line, sizeof line);
    fprintf(stderr, "    %s\n", line);
  }
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(1, fabs(b)); }

/* Free communication, 4 ranks, 4 units of 3 ms a sample (forward 1, backward 2), batch 8.
 * dp 4: 2 samples a replica, m 1: 4 x 3 x 2 = 24 ms. dp 2 x pp 2 (cut 2|2): best m 4 (a
 * sample each): stages of 6 ms, 12 + 3 x 6 = 30 ms. pp 4: m 8, stages of 3 ms: 12 + 7 x 3 =
 * 33 ms. Data parallelism wins, the others follow in that order. */
static void test_free_communication_picks_data_parallel(void **state) {
  (void)state;
  int tps[1] = {1};
  plan_unit u[4];
  test_link l = {0, 0};
  make_units(u, 4, tps, 1, 1e-3, 1000, 100, 10);
  plan_problem p = problem(4, 8, u, 4, tps, 1, &l);
  plan_choice c[8];
  size_t n = 0;
  assert_ok(plan_search(&p, c, 8, &n));
  print_plans(c, n);
  assert_int_equal(n, 3);
  assert_int_equal(c[0].grid.dp, 4);
  assert_int_equal(c[0].grid.pp, 1);
  assert_int_equal(c[0].microbatches, 1);
  assert_true(near(c[0].step_s, 24e-3));
  assert_int_equal(c[1].grid.pp, 2);
  assert_int_equal(c[1].microbatches, 4);
  assert_int_equal(c[1].bounds[1], 2);
  assert_true(near(c[1].step_s, 30e-3));
  assert_int_equal(c[2].grid.pp, 4);
  assert_int_equal(c[2].microbatches, 8);
  assert_true(near(c[2].step_s, 33e-3));
  /* plan_evaluate agrees with the search on the chosen plan. */
  plan_choice e;
  assert_ok(plan_evaluate(&p, c[1].grid, 4, NULL, &e));
  assert_true(near(e.step_s, c[1].step_s));
}

/* The same model with 100 MB of parameters a unit (200 MB with their gradients): a rank of
 * 450 MB holds two units, not four, so dp 2 x pp 2 (30 ms) is chosen; with 250 MB only pp 4
 * fits; with 150 MB nothing does. */
static void test_memory_forces_a_pipeline(void **state) {
  (void)state;
  int tps[1] = {1};
  plan_unit u[4];
  test_link l = {0, 0};
  make_units(u, 4, tps, 1, 1e-3, 100e6, 100, 10);
  plan_problem p = problem(4, 8, u, 4, tps, 1, &l);
  plan_choice c[8];
  size_t n = 0;
  p.memory_bytes = 450e6;
  assert_ok(plan_search(&p, c, 8, &n));
  print_plans(c, n);
  assert_int_equal(n, 2);
  assert_int_equal(c[0].grid.dp, 2);
  assert_int_equal(c[0].grid.pp, 2);
  assert_int_equal(c[0].bounds[1], 2);
  assert_true(c[0].memory_bytes <= p.memory_bytes);
  p.memory_bytes = 250e6;
  assert_ok(plan_search(&p, c, 8, &n));
  assert_int_equal(n, 1);
  assert_int_equal(c[0].grid.pp, 4);
  /* A given plan over the limit: FL_ELIMIT, its memory still reported. */
  int whole[2] = {0, 4};
  plan_choice e;
  assert_fails_with(plan_evaluate(&p, (pp_grid){4, 1, 1}, 1, whole, &e), FL_ELIMIT, "above the");
  assert_true(e.memory_bytes >= 800e6);
  p.memory_bytes = 150e6;
  assert_fails_with(plan_search(&p, c, 8, &n), FL_ELIMIT, "give more memory or more ranks");
}

/* 2 ranks, 3 units (embedding, a block, head), batch 4. The block's output is 1 MB a sample
 * and the test_link moves 100 MB/s: tp 2's four allreduces of 4 MB cost 0.16 s, so tp 1 is chosen.
 * Free links but 1 GB of parameters a unit: dp 2's gradient allreduce costs seconds, tp 2
 * (18 ms: the whole batch at half the compute) beats pp 2 (27 ms at m 4). */
static void test_tensor_parallel_only_when_it_pays(void **state) {
  (void)state;
  int tps[2] = {1, 2};
  plan_unit u[3];
  test_link l = {0, 1e-8};
  make_units(u, 3, tps, 2, 1e-3, 1000, 100, 1e6);
  plan_problem p = problem(2, 4, u, 3, tps, 2, &l);
  plan_choice c[8];
  size_t n = 0;
  assert_ok(plan_search(&p, c, 8, &n));
  print_plans(c, n);
  assert_int_equal(c[0].grid.tp, 1);
  for (size_t i = 0; i < n; i++)
    if (c[i].grid.tp == 2) assert_true(c[i].step_s > 0.16);

  make_units(u, 3, tps, 2, 1e-3, 1e9, 100, 10);
  l = (test_link){0, 1e-8};
  /* Only the gradients' allreduce is dear: links are free for activations this small. */
  for (int i = 0; i < 3; i++) u[i].out_row_bytes = 0;
  assert_ok(plan_search(&p, c, 8, &n));
  print_plans(c, n);
  assert_int_equal(c[0].grid.tp, 2);
  assert_true(near(c[0].step_s, 18e-3));
}

/* ---- the cut against brute force ------------------------------------------------------- */

static uint64_t rng_state = 12345;
static double urand(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* The best path over every cut of n units into pp stages that fits, by enumeration (bounds in
 * cut, from stage k on); INFINITY when none fits. */
static double brute(const plan_problem *p, pp_grid g, int m, int *cut, int k) {
  int n = p->units;
  if (k == g.pp) {
    cut[g.pp] = n;
    plan_choice c;
    fl_status s = plan_evaluate(p, g, m, cut, &c);
    assert_true(s == FL_OK || s == FL_ELIMIT);
    return s == FL_OK ? c.path_s : INFINITY;
  }
  double best = INFINITY;
  /* Stage k starts at cut[k], after stage k - 1's units, leaving a unit for each later one. */
  for (int b = cut[k - 1] + 1; b <= n - (g.pp - k); b++) {
    cut[k] = b;
    double v = brute(p, g, m, cut, k + 1);
    if (v < best) best = v;
  }
  return best;
}

static void test_cut_is_optimal_against_brute_force(void **state) {
  (void)state;
  int tps[1] = {1};
  plan_unit u[8];
  int checked = 0, limited = 0;
  for (int trial = 0; trial < 300; trial++) {
    int n = 2 + (int)(urand() * 6); /* 2..7 units */
    int pp = 1 + (int)(urand() * (n < 4 ? n : 4));
    int ms[4] = {1, 2, 3, 4}, m = ms[(int)(urand() * 4)];
    test_link l = {urand() * 1e-4, urand() * 1e-8};
    double total = 0;
    for (int i = 0; i < n; i++) {
      u[i] = (plan_unit){.out_row_bytes = urand() * 1e5};
      u[i].fwd[0] = (plan_cost){urand() * 1e-3, urand() * 1e-3};
      u[i].bwd[0] = (plan_cost){urand() * 1e-3, urand() * 2e-3};
      u[i].param_bytes[0] = urand() * 1e6;
      u[i].act_row_bytes[0] = urand() * 1e5;
      total += u[i].param_bytes[0] * 2 + u[i].act_row_bytes[0] * 12 * m;
    }
    plan_problem p = problem(pp, 12 * pp, u, n, tps, 1, &l);
    if (trial % 2) p.memory_bytes = total * (0.2 + 0.8 * urand()); /* every other case limited */
    pp_grid g = {1, 1, pp};
    int cut[PLAN_MAX_STAGES + 1] = {0}, bounds[PLAN_MAX_STAGES + 1];
    double want = brute(&p, g, m, cut, 1), got = 0;
    fl_status s = plan_cut(&p, g, m, bounds, &got);
    if (want == INFINITY) {
      assert_int_equal(s, FL_ELIMIT);
      limited++;
      continue;
    }
    assert_ok(s);
    if (!near(got, want)) fprintf(stderr, "trial %d: n %d pp %d m %d: dp %.9g, brute %.9g\n", trial, n, pp, m, got, want);
    assert_true(near(got, want));
    /* Its cut is valid and achieves that value. */
    plan_choice c;
    assert_ok(plan_evaluate(&p, g, m, bounds, &c));
    assert_true(near(c.path_s, got));
    checked++;
  }
  /* Units that cost nothing make ranges of equal cost, the largest among them (m = 1 looks at
   * the largest only). */
  for (int i = 0; i < 3; i++) u[i] = (plan_unit){0};
  u[0].fwd[0].row_s = 1e-3;
  test_link free_link = {0, 0};
  plan_problem z = problem(2, 2, u, 3, tps, 1, &free_link);
  int zb[3];
  double zp;
  assert_ok(plan_cut(&z, (pp_grid){1, 1, 2}, 1, zb, &zp));
  assert_true(near(zp, 2e-3)); /* 2 samples of 1 ms */
  fprintf(stderr, "    %d cuts equal to brute force, %d cases where nothing fits\n", checked, limited);
  assert_true(checked > 150);
  assert_true(limited > 0);
}

/* ---- errors ------------------------------------------------------------------------------ */

static void test_bad_problems_are_clear_errors(void **state) {
  (void)state;
  int tps[2] = {1, 2};
  plan_unit u[3];
  test_link l = {0, 0};
  make_units(u, 3, tps, 2, 1e-3, 1000, 100, 10);
  plan_choice c[4];
  size_t n;
  plan_problem p = problem(2, 4, u, 3, tps, 2, &l);
  p.world = 0;
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "world of 0 ranks");
  p = problem(2, 5, u, 3, tps, 2, &l);
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "batch 5 is not a positive multiple");
  p = problem(2, 4, u, 3, tps, 2, &l);
  p.tp[0] = 2;
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "first tensor-parallel degree is 2");
  p = problem(2, 4, u, 3, tps, 2, &l);
  p.allreduce_s = NULL;
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "communication model");
  p = problem(2, 4, u, 3, tps, 2, &l);
  p.memory_bytes = NAN;
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "must be finite");
  u[1].bwd[1].row_s = -1;
  p = problem(2, 4, u, 3, tps, 2, &l);
  assert_fails_with(plan_search(&p, c, 4, &n), FL_EINVAL, "unit 1 at tp 2");
  make_units(u, 3, tps, 2, 1e-3, 1000, 100, 10);
  assert_fails_with(plan_search(&p, c, 0, &n), FL_EINVAL, "no room");
  /* Bad plans. */
  plan_choice e;
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 1, 1}, 1, NULL, &e), FL_EINVAL, "the world has 2");
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 1, 2}, 3, NULL, &e), FL_EINVAL, "3 micro-batches do not divide");
  int empty[3] = {0, 0, 3}, late[3] = {1, 2, 3};
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 1, 2}, 1, empty, &e), FL_EINVAL, "stage 0 of the cut is empty");
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 1, 2}, 1, late, &e), FL_EINVAL, "must start at unit 0");
  int one_tp[1] = {1};
  p = problem(2, 4, u, 3, one_tp, 1, &l);
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 2, 1}, 1, NULL, &e), FL_EINVAL, "tp 2 is not in the profile");
  p = problem(4, 8, u, 3, one_tp, 1, &l);
  assert_fails_with(plan_evaluate(&p, (pp_grid){1, 1, 4}, 1, NULL, &e), FL_EINVAL, "4 pipeline stages but 3 units");
}

/* ---- the profiler ------------------------------------------------------------------------ */

/* The cost model as planners see it (gpu/comm/comm.h): the defaults without a communicator. */
static void test_cost_model_for_planners(void **state) {
  (void)state;
  comm_cost_params *p = comm_cost_params_of(NULL);
  assert_non_null(p);
  assert_true(comm_cost_predict_allreduce(p, 1, 1 << 20) == 0);
  assert_true(comm_cost_predict_allreduce(p, 4, 0) == 0);
  double small = comm_cost_predict_allreduce(p, 4, 1 << 10), big = comm_cost_predict_allreduce(p, 4, 1 << 24);
  assert_true(small > 0 && big > small && isfinite(big));
  assert_true(comm_cost_predict_allreduce(p, 8, 1 << 24) >= comm_cost_predict_allreduce(p, 2, 1 << 24));
  assert_true(comm_cost_predict_message(p, 0) == 0);
  assert_true(comm_cost_predict_message(p, 1 << 20) > comm_cost_predict_message(p, 1 << 10));
  common_free(p);
}

static void test_profile_of_a_tiny_model(void **state) {
  (void)state;
  tfm_spec spec = {.seq = 4, .features = 4, .hidden = 8, .heads = 2, .blocks = 1, .classes = 3, .dropout = 0.1f,
                   .seed = 7};
  optim_options o = {.kind = OPTIM_SGD, .momentum = 0.9f};
  plan_profile pr;
  int rows[PLAN_MAX_ROWS];
  assert_int_equal(plan_microbatch_sizes(2, 8, 0, rows), 4); /* 1, 2, 4, 8 */
  assert_int_equal(rows[0], 1);
  assert_int_equal(rows[3], 8);
  assert_ok(plan_profile_measure(FL_DEVICE_CPU, &spec, &o, 2, rows, 4, &pr));
  assert_int_equal(pr.nrows, 4);
  assert_int_equal(pr.units, 3);
  assert_int_equal(pr.ntp, 2);
  assert_int_equal(pr.tp[1], 2);
  assert_true(pr.cores >= 1);
  assert_true(pr.state_copies == 2); /* gradients and momentum */
  assert_true(pr.microbatch_s >= 0 && isfinite(pr.microbatch_s));
  assert_true(pr.cores_measured >= 1 && pr.cores_measured <= pr.cores);
  for (int u = 0; u < 3; u++) {
    for (int k = 0; k < 2; k++) {
      assert_true(pr.unit[u].fwd[k].fixed_s + 4 * pr.unit[u].fwd[k].row_s > 0);
      assert_true(pr.unit[u].bwd[k].fixed_s + 4 * pr.unit[u].bwd[k].row_s > 0);
      assert_true(pr.unit[u].param_bytes[k] > 0);
    }
    assert_int_equal(pr.unit[u].tp_allreduces, u == 1 ? 2 : 0);
  }
  assert_true(pr.unit[0].out_row_bytes == 4 * 8 * sizeof(float));
  assert_true(pr.unit[1].out_row_bytes == 4 * 8 * sizeof(float));
  assert_true(pr.unit[2].out_row_bytes == 3 * sizeof(float));
  /* The block's weights split over tp 2 (its biases of the row-parallel layers do not). */
  assert_true(pr.unit[1].param_bytes[1] < pr.unit[1].param_bytes[0]);
  assert_true(pr.unit[1].act_row_bytes[0] > 0);
  plan_problem p = {.world = 2, .batch = 8};
  plan_profile_problem(&pr, &p);
  plan_choice c[4];
  size_t n = 0;
  assert_ok(plan_search(&p, c, 4, &n));
  print_plans(c, n);
  assert_int_equal(n, 3); /* dp 2, tp 2, pp 2 */
  assert_true(c[0].step_s > 0 && isfinite(c[0].step_s));
  plan_profile_free(&pr);
  assert_fails_with(plan_profile_measure(FL_DEVICE_CPU, &spec, &o, 0, rows, 4, &pr), FL_EINVAL, "world of 0");
  int down[2] = {4, 1};
  assert_fails_with(plan_profile_measure(FL_DEVICE_CPU, &spec, &o, 2, down, 2, &pr), FL_EINVAL, "increasing (1 at 1)");
  assert_fails_with(plan_profile_measure(FL_DEVICE_CPU, &spec, &o, 2, rows, 0, &pr), FL_EINVAL, "0 micro-batch sizes");
  spec.heads = 3;
  assert_fails_with(plan_profile_measure(FL_DEVICE_CPU, &spec, &o, 2, rows, 4, &pr), FL_EINVAL, "heads");
  /* Many sizes: at most PLAN_MAX_ROWS of them, the smallest and the largest kept. */
  assert_int_equal(plan_microbatch_sizes(1, 720720, 1 << 20, rows), PLAN_MAX_ROWS);
  assert_int_equal(rows[0], 1);
  assert_int_equal(rows[PLAN_MAX_ROWS - 1], 720720);
  for (int i = 1; i < PLAN_MAX_ROWS; i++) assert_true(rows[i] > rows[i - 1]);
}

/* ---- flint train --plan auto ----------------------------------------------------------- */

static char flint_path[PATH_MAX];
#define RUN_FLINT(...) run_child(flint_path, NULL, (const char *const[]){__VA_ARGS__, NULL}, 60, 90)
#define TFM "--model", "transformer", "--data", "fashion-mnist"

static void expect_usage_error(run_result *r, const char *needle) {
  if (r->status != 2 || !strstr(r->err, needle)) {
    fprintf(stderr, "expected exit 2 and '%s' on stderr; got %d:\n%s\n", needle, r->status, r->err);
  }
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, needle));
  free(r);
}

static void test_plan_auto_end_to_end(void **state) {
  (void)state;
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "auto", "--world", "4", "--tp", "2"),
                     "--plan auto chooses --dp, --tp, --pp and --microbatches itself");
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "auto", "--world", "2", "--dp", "1"), "but --dp was given");
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "auto"), "--plan auto needs --world W");
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "manual", "--world", "2"), "the only plan is auto");
  expect_usage_error(RUN_FLINT("train", TFM, "--world", "2"), "--world, --plan-memory and --plan-max-microbatches are "
                                                              "for --plan auto");
  expect_usage_error(RUN_FLINT("train", "--model", "mlp", "--data", "fashion-mnist", "--plan", "auto", "--world", "2"),
                     "--plan auto is for --model transformer");
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "auto", "--world", "2", "--sequence-parallel"),
                     "--plan auto plans --model transformer without --sequence-parallel");
  expect_usage_error(RUN_FLINT("train", TFM, "--plan", "auto", "--world", "3", "--batch", "32"),
                     "--batch 32 is not a multiple of --world 3");
  NEED_DATA();
  char dir[] = "/tmp/flint-plan-XXXXXX", csv[64], svg[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  run_result *r = RUN_FLINT("train", TFM, "--plan", "auto", "--world", "2", "--batch", "16", "--epochs", "1",
                            "--train-images", "128", "--test-images", "32", "--hidden", "16", "--heads", "2",
                            "--blocks", "2", "--plan-max-microbatches", "4", "--master", "local[2]", "--quiet", "--csv",
                            csv, "--svg", svg);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  fprintf(stderr, "%s", r->out);
  assert_non_null(strstr(r->out, "plan         profiled 4 units at tp 1,2"));
  assert_non_null(strstr(r->out, "plan         chosen    dp "));
  assert_non_null(strstr(r->out, "plan         runner-up dp "));
  assert_non_null(strstr(r->out, "a step, measured "));
  assert_non_null(strstr(r->out, "test         loss "));
  free(r);
  /* A memory limit no plan fits: a clear failure, nothing trained. */
  r = RUN_FLINT("train", TFM, "--plan", "auto", "--world", "2", "--batch", "16", "--epochs", "1", "--train-images",
                "128", "--test-images", "32", "--hidden", "16", "--heads", "2", "--blocks", "2", "--plan-memory",
                "0.001", "--master", "local[2]", "--quiet", "--csv", csv, "--svg", svg);
  if (r->status != 1) run_dump(r);
  assert_int_equal(r->status, 1);
  assert_non_null(strstr(r->err, "give more memory or more ranks"));
  free(r);
  unlink(csv);
  unlink(svg);
  rmdir(dir);
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  const char *bin = getenv("FLINT_BIN");
  snprintf(flint_path, sizeof flint_path, "%s/flint", bin && *bin ? bin : "bin");
  const struct CMUnitTest tests[] = {
      T(test_free_communication_picks_data_parallel),
      T(test_memory_forces_a_pipeline),
      T(test_tensor_parallel_only_when_it_pays),
      T(test_cut_is_optimal_against_brute_force),
      T(test_bad_problems_are_clear_errors),
      T(test_cost_model_for_planners),
      T(test_profile_of_a_tiny_model),
      T(test_plan_auto_end_to_end),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
