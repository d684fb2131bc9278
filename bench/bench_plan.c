/*
 * bench_plan: the automatic plan (gpu/parallel/plan.h) against every hand plan (issue 38). For
 * the transformer on 4 and 8 ranks (threads of this program joined by host communicators over
 * loopback: bench_ranks.h), the profile is taken and the search run
 * (plan_profile_measure, plan_search), then every grid dp x tp x pp of the world that the
 * model allows is trained for a few steps with the m and the stage cut the search found best
 * for that grid (1F1B), and measured: one warm-up step, then --steps steps of
 * compute_gradients + apply; a step's time is the slowest rank's; a round's figure the median
 * over its steps. Three rounds go over all the plans in turn (so that the host's other load
 * falls on every plan alike) and the row's figure is the median of the three.
 *
 * Rows: world, grid, m, cut; the prediction's parts: the pipeline's critical path with every
 * rank on its own core ("path"), the pipeline term once the ranks share the cores ("pipe":
 * max(path, all compute / the cores measured)), the data-parallel gradient allreduce; the
 * predicted and measured ms a step, predicted / measured; the planner's choice is marked.
 * BENCH_PLAN_PROFILE=1 prints the profile on stderr; BENCH_PLAN_WORLD=N runs that world alone. A summary line per world: the chosen plan's measured time over
 * the best measured one (the target: within 10%), and the worst predicted / measured
 * (target: every plan within 25%).
 *
 * The model: seq 16, features 16, hidden 64, 4 heads, ffn 256, 6 blocks (8 units), 10
 * classes, dropout 0.1; global batch 32; m up to 16.
 *
 *   bench_plan [--json] [--device cpu|cuda|all] [--steps N] [--quick]
 *
 * --device: cpu, cuda (every rank on GPU 0) or all (default: cuda rows only when a GPU is
 * usable). --steps: measured steps a plan (default 10). --quick: 4 ranks only. With --json,
 * one JSON object per row and per summary. Exit 2 on a bad option, 1 when the engine fails.
 */
#define BENCH_NAME "bench_plan"
#include "bench_util.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "bench_ranks.h"
#include "flint/gpu.h"
#include "gpu/parallel/plan_profile.h"

#define MAX_RANKS BENCH_MAX_RANKS
#define MAX_STEPS 50
#define MAX_PLANS 64
#define BATCH 32
#define MAX_M 16
#define ROUNDS 3 /* every plan measured this many times, in turn with the others */

static const tfm_spec SPEC = {.seq = 16, .features = 16, .hidden = 64, .heads = 4, .ffn = 256, .blocks = 6,
                              .classes = 10, .dropout = 0.1f, .seed = 3};

/* ---- one plan on every rank ------------------------------------------------------------- */

typedef struct run {
  fl_device_kind kind;
  pp_options o;
  int replica_batch;
  const float *x;
  const int32_t *y;
  int steps;
  double step_s[MAX_RANKS][MAX_STEPS];
} run;

static fl_status train_rank(void *arg, int rank, fl_comm *comm) {
  run *ru = arg;
  fl_device *dev = NULL;
  pp_trainer *t = NULL;
  fl_status st = fl_device_open(ru->kind, 0, &dev);
  if (st == FL_OK) st = pp_trainer_create(dev, comm, &ru->o, &t);
  for (int i = 0; st == FL_OK && i <= ru->steps; i++) {
    pp_step_stats s;
    double t0 = now_s();
    st = pp_trainer_compute_gradients(t, ru->x, ru->y, ru->replica_batch, (uint64_t)i, &s);
    if (st == FL_OK) st = pp_trainer_apply(t, 0.01f, &s);
    if (st == FL_OK && i > 0) ru->step_s[rank][i - 1] = now_s() - t0; /* step 0 warms up */
  }
  pp_trainer_destroy(t);
  fl_device_close(dev);
  return st;
}

/* The slowest rank's step, median over the steps. */
static double measured_step(const run *ru, int ranks) {
  double slowest[MAX_STEPS];
  for (int i = 0; i < ru->steps; i++) {
    slowest[i] = 0;
    for (int r = 0; r < ranks; r++) slowest[i] = fmax(slowest[i], ru->step_s[r][i]);
  }
  return bench_median(slowest, (size_t)ru->steps);
}

static void cut_text(const plan_choice *c, char *buf, size_t size) {
  int len = 0;
  for (int k = 0; k <= c->grid.pp && (size_t)len < size; k++)
    len += snprintf(buf + len, size - (size_t)len, "%s%d", k ? "|" : "", c->bounds[k]);
}

static int bench_world(fl_device_kind kind, int W, int steps, bool json) {
  const char *dev = kind == FL_DEVICE_CPU ? "cpu" : "cuda";
  optim_options opt = {.kind = OPTIM_SGD, .momentum = 0.9f};
  plan_profile pr;
  int rows[PLAN_MAX_ROWS], nrows = plan_microbatch_sizes(W, BATCH, MAX_M, rows);
  double t0 = now_s();
  if (plan_profile_measure(kind, &SPEC, &opt, W, rows, nrows, &pr) != FL_OK) {
    fail_flint("plan_profile_measure");
    return 1;
  }
  double profile_s = now_s() - t0;
  if (getenv("BENCH_PLAN_PROFILE")) fprintf(stderr, "micro-batch overhead %.3f ms\n", pr.microbatch_s * 1e3);
  if (getenv("BENCH_PLAN_PROFILE"))
    for (int u = 0; u < pr.units; u++)
      for (int k = 0; k < pr.ntp; k++) {
        fprintf(stderr, "unit %d tp %d:", u, pr.tp[k]);
        for (int i = 0; i < pr.nrows; i++)
          fprintf(stderr, " %d:%.3f+%.3f", pr.rows[i], pr.unit[u].fwd_at[k][i] * 1e3, pr.unit[u].bwd_at[k][i] * 1e3);
        fprintf(stderr, " ms\n");
      }
  plan_problem p = {.world = W, .batch = BATCH, .max_microbatches = MAX_M};
  plan_profile_problem(&pr, &p);
  static plan_choice plans[MAX_PLANS];
  size_t n = 0;
  world w;
  if (plan_search(&p, plans, MAX_PLANS, &n) != FL_OK || world_create(W, &w) != FL_OK) {
    fail_flint("plan_search or world_create");
    plan_profile_free(&pr);
    return 1;
  }
  size_t features = (size_t)SPEC.seq * SPEC.features;
  float *x = malloc(BATCH * features * sizeof *x);
  int32_t *y = malloc(BATCH * sizeof *y);
  static run ru;
  int rc = 0;
  uint64_t seed = 1;
  for (size_t i = 0; x && i < BATCH * features; i++) x[i] = (float)((seed = seed * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
  for (int i = 0; y && i < BATCH; i++) y[i] = i % SPEC.classes;
  if (!x || !y) {
    fprintf(stderr, BENCH_NAME ": out of memory\n");
    rc = 1;
  }
  if (!json && rc == 0)
    printf("\n%d ranks on %s (%d cores, %.2f measured), profile %.1f s: seq %d, hidden %d, %d heads, ffn %d, %d blocks, batch %d\n"
           "%-14s %4s %-16s %9s %9s %9s %12s %12s %10s\n", W, dev, pr.cores, p.cores, profile_s, SPEC.seq, SPEC.hidden,
           SPEC.heads, SPEC.ffn, SPEC.blocks, BATCH, "dp x tp x pp", "m", "cut", "path ms", "pipe ms", "dp ar ms",
           "predicted ms", "measured ms", "pred/meas");
  double best_measured = INFINITY, chosen_measured = 0, worst_ratio = 1;
  /* Rounds over all the plans, so that the host's other load falls on every plan alike. */
  static double round_s[MAX_PLANS][ROUNDS];
  for (int round = 0; rc == 0 && round < ROUNDS; round++)
    for (size_t i = 0; rc == 0 && i < n; i++) {
      const plan_choice *c = &plans[i];
      ru = (run){.kind = kind, .x = x, .y = y, .steps = steps, .replica_batch = BATCH / c->grid.dp};
      ru.o = (pp_options){.spec = SPEC, .grid = c->grid, .schedule = c->schedule, .microbatches = c->microbatches,
                          .chunks = 1, .bounds = c->bounds, .optim = opt};
      if (run_ranks(W, w.comms, train_rank, &ru) != FL_OK) {
        fail_flint("training a plan");
        rc = 1;
      }
      round_s[i][round] = measured_step(&ru, W);
    }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const plan_choice *c = &plans[i];
    double meas = bench_median(round_s[i], ROUNDS), ratio = c->step_s / meas;
    if (i == 0) chosen_measured = meas;
    best_measured = fmin(best_measured, meas);
    if (fabs(log(ratio)) > fabs(log(worst_ratio))) worst_ratio = ratio;
    char cut[128], grid[32];
    cut_text(c, cut, sizeof cut);
    snprintf(grid, sizeof grid, "%dx%dx%d", c->grid.dp, c->grid.tp, c->grid.pp);
    if (json)
      printf("{\"bench\":\"plan\",\"device\":\"%s\",\"world\":%d,\"grid\":\"%s\",\"m\":%d,\"cut\":\"%s\","
             "\"chosen\":%s,\"path_ms\":%.3f,\"pipeline_ms\":%.3f,\"allreduce_ms\":%.3f,\"predicted_ms\":%.3f,"
             "\"measured_ms\":%.3f,\"predicted_over_measured\":%.3f}\n",
             dev, W, grid, c->microbatches, cut, i == 0 ? "true" : "false", c->path_s * 1e3, c->pipeline_s * 1e3,
             c->allreduce_s * 1e3, c->step_s * 1e3, meas * 1e3, ratio);
    else
      printf("%-14s %4d %-16s %9.2f %9.2f %9.2f %12.2f %12.2f %10.2f%s\n", grid, c->microbatches, cut, c->path_s * 1e3,
             c->pipeline_s * 1e3, c->allreduce_s * 1e3, c->step_s * 1e3, meas * 1e3, ratio, i == 0 ? "  <- chosen" : "");
    fflush(stdout);
  }
  if (rc == 0) {
    if (json)
      printf("{\"bench\":\"plan_summary\",\"device\":\"%s\",\"world\":%d,\"plans\":%zu,\"chosen_over_best\":%.3f,"
             "\"worst_predicted_over_measured\":%.3f}\n", dev, W, n, chosen_measured / best_measured, worst_ratio);
    else
      printf("chosen / best measured: %.3f (target <= 1.10); worst predicted / measured: %.2f (target 0.75..1.25)\n",
             chosen_measured / best_measured, worst_ratio);
  }
  free(x);
  free(y);
  world_destroy(&w);
  plan_profile_free(&pr);
  return rc;
}

int main(int argc, char **argv) {
  bench_device_args args = {.which = "all", .steps = 10};
  if (!bench_device_args_parse(argc, argv, MAX_STEPS, &args)) return 2;
  bool cuda = strcmp(args.which, "cpu") != 0 && fl_cuda_device_count() > 0;
  if (strcmp(args.which, "cuda") == 0 && !cuda) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no usable GPU (none found, or flint built without CUDA)\n");
    return 1;
  }
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1); /* a lost peer fails instead of hanging */
  int worlds[2] = {4, 8}, nw = args.quick ? 1 : 2, rc = 0;
  /* BENCH_PLAN_WORLD=N: that world alone (1 to 8), for looking at the model's parts. */
  const char *only = getenv("BENCH_PLAN_WORLD");
  if (only && atoi(only) >= 1 && atoi(only) <= MAX_RANKS) worlds[0] = atoi(only), nw = 1;
  for (int k = 0; k < 2 && rc == 0; k++) {
    fl_device_kind kind = k == 0 ? FL_DEVICE_CPU : FL_DEVICE_CUDA;
    if ((kind == FL_DEVICE_CPU && strcmp(args.which, "cuda") == 0) || (kind == FL_DEVICE_CUDA && !cuda)) continue;
    for (int i = 0; i < nw && rc == 0; i++) rc = bench_world(kind, worlds[i], (int)args.steps, args.json);
  }
  if (rc == 0 && !cuda && !args.json && strcmp(args.which, "all") == 0) printf("(cuda: no GPU here; rows skipped)\n");
  return rc;
}
