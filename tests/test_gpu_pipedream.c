/*
 * test_gpu_pipedream.c: PipeDream in the hybrid trainer (gpu/parallel/pipeline.h) and its pure
 * logic (gpu/parallel/pipeline_schedule.h), on the cpu device with ranks as threads.
 *
 *   - the asynchronous schedules' bubble goes to 0 as the window grows (their op lists pass
 *     the simulator for every p and m in test_gpu_pipeline_schedule's matrix);
 *   - the version plans in closed form: PipeDream's newest-at-forward, vertical sync (the
 *     first stage's plan everywhere), 2BW's max(0, k - 1); the versions kept at once (2BW at
 *     most 2, PipeDream with m = 1 p - r on stage r);
 *   - the replicated partitioner: a slow stage gets replicated, brute force agrees on random
 *     small profiles, bad arguments;
 *   - the runtime: PipeDream with vertical sync and a flush every mini-batch trains as GPipe
 *     step for step (losses and weights, 1e-6); without flushes every micro-batch's backward
 *     used its forward's version on every stage, the plan's, and with vertical sync the same
 *     on every stage; the weights after 6 unflushed mini-batches are those of a one-rank
 *     reference that takes each micro-batch's gradient at the plan's versions of both stages
 *     (so each backward really ran on its forward's weights); 2BW keeps at most 2 versions and lands on the 1-stale formula's weights
 *     computed on one rank; replicated stages (1F1B-RR) equal the unreplicated pipeline; the
 *     link between stages is measured; bad options and calls are refused.
 */
#define TEST_TIME_BOUND_S 300
#include <math.h>

#include "rank_threads.h"

#include "common/common.h"
#include "gpu/device/device.h"
#include "gpu/parallel/pipeline.h"

static fl_device *cpu;

#define SEQ 4
#define FEATURES 3
#define MAX_ROWS 128
#define MAX_STEPS 8

static tfm_spec spec_small(void) {
  return (tfm_spec){.seq = SEQ, .features = FEATURES, .hidden = 8, .heads = 2, .ffn = 16, .blocks = 2,
                    .classes = 3, .dropout = 0.1f, .seed = 7};
}

static float xs[MAX_ROWS * SEQ * FEATURES];
static int32_t ys[MAX_ROWS];
static void make_data(void) {
  uint64_t z = 9;
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    xs[i] = (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  for (int i = 0; i < MAX_ROWS; i++) ys[i] = (int32_t)((i * 5 + 1) % 3);
}

#define expect_near(got, want, tol)                                                          \
  do {                                                                                       \
    double got_ = (got), want_ = (want);                                                     \
    if (!(fabs(got_ - want_) <= (tol)))                                                      \
      fprintf(stderr, "%s = %.17g, expected %.17g\n", #got, got_, want_);                    \
    assert_true(fabs(got_ - want_) <= (tol));                                                \
  } while (0)

/* ---- the schedules' logic ----------------------------------------------------------------- */

static void test_bubble_goes_to_zero(void **state) {
  (void)state;
  for (int s = PP_PIPEDREAM; s <= PP_2BW; s++) {
    double last = 1;
    for (int total = 4; total <= 4096; total *= 4) {
      double makespan, bubble;
      assert_ok(pp_schedule_simulate((pp_schedule)s, 4, total, 1, 1, 2, &makespan, &bubble));
      expect_near(bubble, 3.0 / (total + 3), 1e-12);
      assert_true(bubble < last);
      last = bubble;
    }
    assert_true(last < 1e-3);
  }
}

static int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

static void test_version_plans(void **state) {
  (void)state;
  int v[256], v0[256];
  for (int p = 1; p <= 6; p++)
    for (int m = 1; m <= 6; m++)
      for (int k = 1; k <= 5; k++)
        for (int r = 0; r < p; r++) {
          int total = m * k;
          /* Device r's forward of micro-batch i follows its backwards of 0..i - w - 1 (w its
           * warm-up), so it sees the updates of the mini-batches those complete. */
          int w = p - r - 1 < total ? p - r - 1 : total;
          assert_ok(pp_weight_versions(PP_PIPEDREAM, false, p, m, k, r, v));
          for (int i = 0; i < total; i++) {
            int want = floor_div(i - w, m);
            assert_int_equal(v[i], want < 0 ? 0 : want);
          }
          assert_ok(pp_weight_versions(PP_PIPEDREAM, true, p, m, k, r, v));
          assert_ok(pp_weight_versions(PP_PIPEDREAM, false, p, m, k, 0, v0));
          for (int i = 0; i < total; i++) assert_int_equal(v[i], v0[i]);
          if (m >= p) {
            assert_ok(pp_weight_versions(PP_2BW, false, p, m, k, r, v));
            for (int i = 0; i < total; i++) assert_int_equal(v[i], i / m > 0 ? i / m - 1 : 0);
            assert_true(pp_weight_versions_peak(PP_2BW, false, p, m, k, r) <= 2);
          } else {
            assert_fails_with(pp_weight_versions(PP_2BW, false, p, m, k, r, v), FL_EINVAL, "2bw needs");
            assert_int_equal(pp_weight_versions_peak(PP_2BW, false, p, m, k, r), -1);
          }
          int peak = pp_weight_versions_peak(PP_PIPEDREAM, false, p, m, k, r);
          assert_true(peak >= 1 && peak <= p - r + 1);
          /* One update per micro-batch: stage r holds its p - r micro-batches in flight on
           * p - r versions once the pipeline is full. */
          if (m == 1 && k > p) assert_int_equal(peak, p - r);
        }
  assert_fails_with(pp_weight_versions(PP_1F1B, false, 2, 2, 2, 0, v), FL_EINVAL, "not 1f1b");
  assert_fails_with(pp_weight_versions(PP_PIPEDREAM, false, 2, 2, 0, 0, v), FL_EINVAL, "0 mini-batches");
  assert_fails_with(pp_weight_versions(PP_PIPEDREAM, false, 2, 2, 2, 2, v), FL_EINVAL, "rank 2");
  assert_fails_with(pp_weight_versions(PP_PIPEDREAM, false, 2, 2, 2, 0, NULL), FL_EINVAL, "NULL");
}

/* Brute force over every cut and every replica count (n <= 6, world <= 5). */
static double stage_time(const double *t, const double *out, const double *wb, size_t i, size_t j, int r,
                         bool sends, double bw) {
  double sum = 0, weights = 0;
  for (size_t l = i; l < j; l++) sum += t[l], weights += bw > 0 ? wb[l] : 0;
  double x = sum / r;
  if (bw > 0) x += 2.0 * (r - 1) / r * weights / bw + (sends ? out[j - 1] / bw : 0);
  return x;
}

static double brute(const double *t, const double *out, const double *wb, size_t n, size_t from, int ranks,
                    int stages_left, double bw) {
  double best = INFINITY;
  if (stages_left < 1 || ranks < 1) return best;
  for (int r = 1; r <= ranks; r++)
    if (r == ranks) best = fmin(best, stage_time(t, out, wb, from, n, r, false, bw));
  for (size_t j = from + 1; j < n; j++)
    for (int r = 1; r < ranks; r++) {
      double rest = brute(t, out, wb, n, j, ranks - r, stages_left - 1, bw);
      best = fmin(best, fmax(stage_time(t, out, wb, from, j, r, true, bw), rest));
    }
  return best;
}

static void test_replicated_partitioner(void **state) {
  (void)state;
  /* The slow middle layer gets two replicas; its light weights make that cheap, while the
   * heavy weights of the others keep them unreplicated. */
  const double t[] = {1, 4, 1}, out[] = {0, 0, 0}, wb[] = {100, 1, 100};
  pp_stage_plan st[4];
  int ns = 0;
  double bottleneck = 0;
  assert_ok(pp_partition_replicated(t, out, wb, 3, 4, 4, 10, st, &ns, &bottleneck));
  assert_int_equal(ns, 3);
  assert_int_equal(st[1].first, 1);
  assert_int_equal(st[1].end, 2);
  assert_int_equal(st[1].replicas, 2);
  assert_int_equal(st[0].replicas, 1);
  assert_int_equal(st[2].replicas, 1);
  expect_near(bottleneck, 2.0 + 0.1, 1e-12);
  /* Free communication: all four ranks replicate the whole model (data parallelism). */
  assert_ok(pp_partition_replicated(t, NULL, NULL, 3, 4, 4, 0, st, &ns, &bottleneck));
  assert_int_equal(ns, 1);
  assert_int_equal(st[0].replicas, 4);
  expect_near(bottleneck, 6.0 / 4, 1e-12);
  /* One rank per stage at most three stages: the plain partitioner's answer. */
  size_t bounds[4];
  double plain;
  assert_ok(pp_partition(t, out, 3, 3, 10, bounds, &plain));
  assert_ok(pp_partition_replicated(t, out, wb, 3, 3, 3, 10, st, &ns, &bottleneck));
  expect_near(bottleneck, plain, 1e-12);

  uint64_t z = 77;
  for (int trial = 0; trial < 300; trial++) {
    double tt[6], oo[6], ww[6];
    size_t n = 1 + trial % 6;
    for (size_t i = 0; i < n; i++) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      tt[i] = (double)((z >> 33) % 17) / 4;
      oo[i] = (double)((z >> 45) % 9);
      ww[i] = (double)((z >> 52) % 13);
    }
    double bw = trial % 3 == 0 ? 0 : trial % 3 == 1 ? 8 : 2;
    int world = 1 + (trial / 6) % 5, smax = 1 + (trial / 30) % 5;
    assert_ok(pp_partition_replicated(tt, oo, ww, n, world, smax, bw, st, &ns, &bottleneck));
    double want = brute(tt, oo, ww, n, 0, world, smax, bw);
    expect_near(bottleneck, want, 1e-9);
    /* The plan covers the layers in order on exactly `world` ranks and achieves it. */
    size_t at = 0;
    int ranks = 0;
    double worst = 0;
    assert_true(ns >= 1 && ns <= smax);
    for (int k = 0; k < ns; k++) {
      assert_int_equal(st[k].first, at);
      assert_true(st[k].end > st[k].first);
      worst = fmax(worst, stage_time(tt, oo, ww, st[k].first, st[k].end, st[k].replicas, k + 1 < ns, bw));
      at = st[k].end;
      ranks += st[k].replicas;
    }
    assert_int_equal(at, n);
    assert_int_equal(ranks, world);
    expect_near(worst, bottleneck, 1e-9);
  }
  assert_fails_with(pp_partition_replicated(t, out, wb, 0, 2, 2, 1, st, &ns, &bottleneck), FL_EINVAL, "no layers");
  assert_fails_with(pp_partition_replicated(t, out, wb, 3, 0, 2, 1, st, &ns, &bottleneck), FL_EINVAL, "0 ranks");
  assert_fails_with(pp_partition_replicated(t, NULL, wb, 3, 2, 2, 1, st, &ns, &bottleneck), FL_EINVAL, "NULL");
  const double bad[] = {1, -1, 1};
  assert_fails_with(pp_partition_replicated(bad, out, wb, 3, 2, 2, 1, st, &ns, &bottleneck), FL_EINVAL,
                    "layer 1 has time -1");
  assert_fails_with(pp_partition_replicated(t, out, bad, 3, 2, 2, 1, st, &ns, &bottleneck), FL_EINVAL,
                    "layer 1 has output");
  assert_fails_with(pp_partition_replicated(t, out, wb, 3, 2, 2, NAN, st, &ns, &bottleneck), FL_EINVAL,
                    "not finite");
}

/* ---- the runtime -------------------------------------------------------------------------- */

typedef struct run {
  pp_options o;
  int batch;  /* global rows per mini-batch, split over dp replicas */
  int steps;  /* mini-batches */
  int window; /* mini-batches per pp_trainer_train_window call; 0: compute_gradients + apply */
  float lr;
  /* results */
  double loss[MAX_RANKS][MAX_STEPS];
  int *fwd[MAX_RANKS], *bwd[MAX_RANKS]; /* the last window's records */
  int total, stage[MAX_RANKS], peak[MAX_RANKS];
  double link[MAX_RANKS];
  float *values[MAX_RANKS]; /* every chunk's values after the run, concatenated */
  size_t nvalues[MAX_RANKS];
  int first_unit[MAX_RANKS], dp_index[MAX_RANKS], tp_index[MAX_RANKS], replica[MAX_RANKS];
  int nstages[MAX_RANKS], reps[MAX_RANKS][4], cut[MAX_RANKS][5]; /* the plan each rank built */
} run;

/* The replica's rows of mini-batch k: rows [k B + d b, k B + (d + 1) b) of the data. */
static void replica_rows(const run *rs, int dp_index, int k, int count, float *x, int32_t *y) {
  int b = rs->batch / rs->o.grid.dp;
  for (int j = 0; j < count; j++) {
    size_t row = (size_t)(k + j) * rs->batch + (size_t)dp_index * b;
    memcpy(x + (size_t)j * b * SEQ * FEATURES, xs + row * SEQ * FEATURES, (size_t)b * SEQ * FEATURES * sizeof(float));
    memcpy(y + (size_t)j * b, ys + row, (size_t)b * sizeof(int32_t));
  }
}

static fl_status keep_values(pp_trainer *t, run *rs, int rank) {
  size_t total = 0;
  for (int c = 0; c < pp_trainer_num_chunks(t); c++) total += tfm_chunk_values(pp_trainer_chunk(t, c))->numel;
  float *v = malloc(total * sizeof *v);
  if (!v) return FL_ENOMEM;
  size_t at = 0;
  for (int c = 0; c < pp_trainer_num_chunks(t); c++) {
    const fl_tensor *w = tfm_chunk_values(pp_trainer_chunk(t, c));
    memcpy(v + at, w->data, w->numel * sizeof(float));
    at += w->numel;
  }
  rs->values[rank] = v;
  rs->nvalues[rank] = total;
  int end;
  pp_trainer_chunk_units(t, 0, &rs->first_unit[rank], &end);
  return FL_OK;
}

static int ranks_of(const run *rs);

static fl_status trainer_rank(rank_job *job) {
  run *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  pp_coords me = pp_trainer_coords(t);
  int b = rs->batch / rs->o.grid.dp;
  float *x = malloc((size_t)MAX_STEPS * b * SEQ * FEATURES * sizeof *x);
  int32_t *y = malloc((size_t)MAX_STEPS * b * sizeof *y);
  float lr[MAX_STEPS];
  for (int k = 0; k < MAX_STEPS; k++) lr[k] = rs->lr;
  if (!x || !y) s = FL_ENOMEM;
  rs->link[job->rank] = pp_trainer_link_bytes_per_s(t);
  rs->nstages[job->rank] = pp_trainer_num_stages(t);
  for (int st = 0; st < rs->nstages[job->rank] && st < 4; st++) {
    rs->reps[job->rank][st] = pp_trainer_stage_replicas(t, st);
    rs->cut[job->rank][st + 1] = pp_trainer_bounds(t)[st + 1];
  }
  rs->stage[job->rank] = me.pp;
  rs->dp_index[job->rank] = me.dp;
  rs->tp_index[job->rank] = me.tp;
  if (rs->o.replicas) /* ranks of a stage are consecutive in each pipeline: its replica is the offset */
    for (int s2 = 0, base = 0, per = ranks_of(rs) / rs->o.grid.dp; s2 < rs->o.grid.pp; base += rs->o.replicas[s2], s2++)
      if (s2 == me.pp) rs->replica[job->rank] = job->rank % per - base;
  for (int k = 0; k < rs->steps && s == FL_OK;) {
    int count = rs->window ? rs->window : 1;
    if (count > rs->steps - k) count = rs->steps - k;
    replica_rows(rs, me.dp, k, count, x, y);
    if (rs->window) {
      pp_window_stats st;
      s = pp_trainer_train_window(t, x, y, b, count, (uint64_t)k, lr, &st);
      if (s != FL_OK) break;
      for (int j = 0; j < count; j++) rs->loss[job->rank][k + j] = st.loss[j];
      size_t n = (size_t)pp_trainer_num_chunks(t) * st.microbatches;
      free(rs->fwd[job->rank]);
      free(rs->bwd[job->rank]);
      rs->fwd[job->rank] = malloc(n * sizeof(int));
      rs->bwd[job->rank] = malloc(n * sizeof(int));
      if (!rs->fwd[job->rank] || !rs->bwd[job->rank]) s = FL_ENOMEM;
      else {
        memcpy(rs->fwd[job->rank], st.forward_version, n * sizeof(int));
        memcpy(rs->bwd[job->rank], st.backward_version, n * sizeof(int));
      }
      rs->total = st.microbatches;
      rs->peak[job->rank] = st.peak_versions;
      assert_int_equal(st.updates, count);
    } else {
      pp_step_stats st;
      s = pp_trainer_compute_gradients(t, x, y, b, (uint64_t)k, &st);
      if (s == FL_OK) s = pp_trainer_apply(t, rs->lr, &st);
      rs->loss[job->rank][k] = st.loss;
    }
    k += count;
  }
  if (s == FL_OK) s = keep_values(t, rs, job->rank);
  free(x);
  free(y);
  pp_trainer_destroy(t);
  return s;
}

static int ranks_of(const run *rs) {
  if (rs->o.replicas_auto) return rs->o.grid.dp * rs->o.replicas_auto;
  if (rs->o.replicas) {
    int n = 0;
    for (int s = 0; s < rs->o.grid.pp; s++) n += rs->o.replicas[s];
    return n * rs->o.grid.dp;
  }
  return rs->o.grid.dp * rs->o.grid.tp * rs->o.grid.pp;
}

static void run_free(run *rs) {
  for (int r = 0; r < MAX_RANKS; r++) {
    free(rs->fwd[r]);
    free(rs->bwd[r]);
    free(rs->values[r]);
    rs->fwd[r] = rs->bwd[r] = NULL;
    rs->values[r] = NULL;
  }
}

static group_cache worlds;

static void run_on(run *rs) {
  int n = ranks_of(rs);
  group *g = group_cache_get(&worlds, n);
  rank_job jobs[MAX_RANKS];
  run_ranks(n, g->comms, trainer_rank, rs, jobs);
  expect_all_ok(n, jobs);
}

static const int bounds2[] = {0, 2, 4};
static const int bounds4[] = {0, 1, 2, 3, 4};

static run run_of(pp_grid g, pp_schedule s, int m, int steps, int window) {
  return (run){.o = {.spec = spec_small(), .grid = g, .schedule = s, .microbatches = m,
                     .bounds = g.pp == 1 ? NULL : g.pp == 2 ? bounds2 : bounds4, .optim = OPTIM_OPTIONS_INIT},
               .batch = 8, .steps = steps, .window = window, .lr = 0.1f};
}

/* Every chunk's values of the first data-parallel replica's tensor rank 0, in stage order:
 * the single rank's flat buffer when tp is 1 (parameters are laid out unit by unit). */
static size_t flatten(const run *rs, float *out, size_t cap) {
  size_t at = 0;
  int n = ranks_of(rs), stages = rs->o.grid.pp;
  for (int s = 0; s < stages; s++)
    for (int r = 0; r < n; r++)
      if (rs->stage[r] == s && rs->dp_index[r] == 0 && rs->tp_index[r] == 0 && rs->replica[r] == 0) {
        assert_true(at + rs->nvalues[r] <= cap);
        memcpy(out + at, rs->values[r], rs->nvalues[r] * sizeof(float));
        at += rs->nvalues[r];
        break;
      }
  return at;
}

/* The largest difference between two runs' weights relative to the largest magnitude: rank
 * by rank on the same grid, else as flattened (one replica; tp 1). */
static double values_difference(const run *a, const run *b) {
  double diff = 0, scale = 0;
  int na = ranks_of(a), nb = ranks_of(b);
  if (na == nb && !a->o.replicas && !b->o.replicas) {
    for (int r = 0; r < na; r++) {
      assert_int_equal(a->nvalues[r], b->nvalues[r]);
      for (size_t i = 0; i < a->nvalues[r]; i++) {
        diff = fmax(diff, fabs(a->values[r][i] - b->values[r][i]));
        scale = fmax(scale, fabs(b->values[r][i]));
      }
    }
    return scale > 0 ? diff / scale : diff;
  }
  static float fa[1 << 14], fb[1 << 14];
  size_t n = flatten(a, fa, 1 << 14);
  assert_int_equal(n, flatten(b, fb, 1 << 14));
  assert_true(n > 0);
  for (size_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs(fa[i] - fb[i]));
    scale = fmax(scale, fabs(fb[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

static void expect_same_losses(const run *a, const run *b, double tol) {
  for (int k = 0; k < a->steps; k++) {
    double rel = fabs(a->loss[0][k] - b->loss[0][k]) / fabs(b->loss[0][k]);
    if (rel > tol) fprintf(stderr, "step %d: loss %.9g against %.9g\n", k, a->loss[0][k], b->loss[0][k]);
    assert_true(rel <= tol);
  }
}

/* PipeDream with vertical sync and a flush every mini-batch is GPipe, step for step. */
static void test_flushed_pipedream_is_gpipe(void **state) {
  (void)state;
  const pp_grid grids[] = {{1, 1, 2}, {1, 1, 4}, {2, 1, 2}, {1, 2, 2}};
  for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) {
    run gpipe = run_of(grids[g], PP_GPIPE, 4, 5, 0);
    run dream = run_of(grids[g], PP_PIPEDREAM, 4, 5, 1);
    dream.o.vertical_sync = true;
    run_on(&gpipe);
    run_on(&dream);
    expect_same_losses(&dream, &gpipe, 1e-6);
    double worst = values_difference(&dream, &gpipe);
    fprintf(stderr, "  grid %dx%dx%d: pipedream flushed, vertical sync, 5 steps: weights within %.3g of gpipe's\n",
            grids[g].dp, grids[g].tp, grids[g].pp, worst);
    assert_true(worst <= 1e-6);
    run_free(&gpipe);
    run_free(&dream);
  }
}

/* No flush for 6 mini-batches: each micro-batch's backward used its forward's version on
 * every stage, the plan's; with vertical sync the versions agree across stages; without, a
 * later stage sees newer weights than the first for some micro-batch. Also PipeDream's
 * classic update after every micro-batch (m = 1). */
static void test_weight_stashing_records(void **state) {
  (void)state;
  const int ms[] = {2, 1};
  for (int mi = 0; mi < 2; mi++)
    for (int vs = 0; vs <= 1; vs++) {
      run rs = run_of((pp_grid){1, 1, 4}, PP_PIPEDREAM, ms[mi], 6, 6);
      rs.o.vertical_sync = vs;
      run_on(&rs);
      int m = ms[mi], total = rs.total, plan[64];
      assert_int_equal(total, 6 * m);
      bool some_newer = false;
      for (int r = 0; r < 4; r++) {
        assert_ok(pp_weight_versions(PP_PIPEDREAM, vs, 4, m, 6, rs.stage[r], plan));
        for (int i = 0; i < total; i++) {
          assert_true(rs.fwd[r][i] >= 0);
          assert_int_equal(rs.fwd[r][i], rs.bwd[r][i]);
          assert_int_equal(rs.fwd[r][i], plan[i]);
          int r0 = -1;
          for (int j = 0; j < 4; j++)
            if (rs.stage[j] == 0) r0 = j;
          if (vs) assert_int_equal(rs.fwd[r][i], rs.fwd[r0][i]);
          if (rs.fwd[r][i] > rs.fwd[r0][i]) some_newer = true;
        }
        assert_int_equal(rs.peak[r], pp_weight_versions_peak(PP_PIPEDREAM, vs, 4, m, 6, rs.stage[r]));
        assert_true(rs.peak[r] > 1 || rs.stage[r] == 3);
      }
      assert_true(some_newer == !vs);
      for (int k = 0; k < 6; k++) assert_true(isfinite(rs.loss[0][k]));
      run_free(&rs);
    }
}

/* The single rank's 1-stale run: mini-batch k's gradient at W(max(0, k - 1)), applied to W(k);
 * with windows (rs->window) the staleness restarts at each window's first mini-batch k0:
 * W(k0 + max(0, k - k0 - 1)). */
static fl_status stale_rank(rank_job *job) {
  run *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  fl_tensor *w = tfm_chunk_values(pp_trainer_chunk(t, 0));
  size_t bytes = w->numel * sizeof(float);
  float *versions = malloc((size_t)(MAX_STEPS + 1) * bytes);
  if (!versions) s = FL_ENOMEM;
  else memcpy(versions, w->data, bytes);
  for (int k = 0; k < rs->steps && s == FL_OK; k++) {
    pp_step_stats st;
    int k0 = rs->window ? k / rs->window * rs->window : 0;
    memcpy(w->data, (char *)versions + (size_t)(k > k0 ? k - 1 : k0) * bytes, bytes);
    s = pp_trainer_compute_gradients(t, xs + (size_t)k * rs->batch * SEQ * FEATURES, ys + (size_t)k * rs->batch,
                                     rs->batch, (uint64_t)k, &st);
    rs->loss[0][k] = st.loss;
    memcpy(w->data, (char *)versions + (size_t)k * bytes, bytes);
    if (s == FL_OK) s = pp_trainer_apply(t, rs->lr, &st);
    memcpy((char *)versions + (size_t)(k + 1) * bytes, w->data, bytes);
  }
  if (s == FL_OK) s = keep_values(t, rs, 0);
  free(versions);
  pp_trainer_destroy(t);
  return s;
}

/* PipeDream's updates on one rank, micro-batch by micro-batch: micro-batch i's gradient at the
 * weights of stage 0's version v0[i] and stage 1's v1[i] (the plans), the mini-batch's summed
 * into one step of each stage from its newest version. Without dropout (a one-micro-batch
 * step would key its masks otherwise). rs->o.microbatches is the pipeline's m; the
 * reference itself runs batches of one micro-batch. */
typedef struct dream_ref {
  run *rs;
  int m, minibatches;
  const int *v0, *v1;
} dream_ref;

static fl_status dream_rank(rank_job *job) {
  dream_ref *d = job->arg;
  run *rs = d->rs;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  tfm_chunk *ch = pp_trainer_chunk(t, 0);
  fl_tensor *w = tfm_chunk_values(ch), *g = tfm_chunk_grads(ch);
  size_t n = w->numel, cut = 0; /* stage 0 holds units 0 and 1: embed.* and blocks.0.* */
  for (size_t i = 0; i < tfm_chunk_param_count(ch); i++) {
    const nn_param *p = tfm_chunk_param(ch, i);
    if (strncmp(p->name, "embed.", 6) == 0 || strncmp(p->name, "blocks.0.", 9) == 0) cut += p->value.numel;
  }
  int versions = d->minibatches + 1, mbs = rs->batch / d->m;
  float *hist = malloc((size_t)versions * n * sizeof *hist), *sum = malloc(n * sizeof *sum);
  if (!hist || !sum) s = FL_ENOMEM;
  if (s == FL_OK) memcpy(hist, w->data, n * sizeof(float));
  for (int k = 0; k < d->minibatches && s == FL_OK; k++) {
    memset(sum, 0, n * sizeof *sum);
    double loss = 0;
    for (int j = 0; j < d->m && s == FL_OK; j++) {
      int i = k * d->m + j;
      memcpy(w->data, hist + (size_t)d->v0[i] * n, cut * sizeof(float));
      memcpy(w->data + cut, hist + (size_t)d->v1[i] * n + cut, (n - cut) * sizeof(float));
      pp_step_stats st;
      size_t row = (size_t)k * rs->batch + (size_t)j * mbs;
      s = tfm_chunk_zero_grad(ch);
      if (s == FL_OK) s = pp_trainer_compute_gradients(t, xs + row * SEQ * FEATURES, ys + row, mbs, (uint64_t)k, &st);
      const float *gd = g->data;
      for (size_t e = 0; e < n; e++) sum[e] += gd[e] * (float)mbs / (float)rs->batch;
      loss += st.loss / d->m;
    }
    rs->loss[0][k] = loss;
    memcpy(w->data, hist + (size_t)k * n, n * sizeof(float));
    memcpy(g->data, sum, n * sizeof(float));
    if (s == FL_OK) s = pp_trainer_apply(t, rs->lr, NULL);
    memcpy(hist + (size_t)(k + 1) * n, w->data, n * sizeof(float));
  }
  if (s == FL_OK) s = keep_values(t, rs, 0);
  free(hist);
  free(sum);
  pp_trainer_destroy(t);
  return s;
}

/* The weights PipeDream reaches without flushes are those of its version plans: each stage's
 * updates chain on its newest weights, every micro-batch's gradient taken on the versions
 * its forwards used, on both stages (a backward on other weights than its forward's would
 * not match). Vertical sync and not, m 2 and PipeDream's classic m 1, and with recomputation
 * (whose second forward must use the stashed version too). */
static void test_pipedream_updates_follow_the_plan(void **state) {
  (void)state;
  group *g = group_cache_get(&worlds, 1);
  const struct {
    int m;
    bool vs, recompute;
  } cases[] = {{2, false, false}, {2, true, false}, {1, false, false}, {1, true, false}, {2, false, true}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int m = cases[c].m, vs = cases[c].vs, k = 6, v0[64], v1[64];
    run rs = run_of((pp_grid){1, 1, 2}, PP_PIPEDREAM, m, k, k);
    rs.o.spec.dropout = 0;
    rs.o.vertical_sync = vs;
    rs.o.recompute = cases[c].recompute;
    run_on(&rs);
    assert_ok(pp_weight_versions(PP_PIPEDREAM, vs, 2, m, k, 0, v0));
    assert_ok(pp_weight_versions(PP_PIPEDREAM, vs, 2, m, k, 1, v1));
    run ref = run_of((pp_grid){1, 1, 1}, PP_GPIPE, 1, k, 0);
    ref.o.spec.dropout = 0;
    dream_ref d = {&ref, m, k, v0, v1};
    rank_job job[1];
    run_ranks(1, g->comms, dream_rank, &d, job);
    expect_all_ok(1, job);
    expect_same_losses(&rs, &ref, 1e-5);
    double worst = values_difference(&rs, &ref);
    fprintf(stderr, "  pipedream pp 2 m %d%s%s, 6 mini-batches unflushed: weights within %.3g of the plan's\n", m,
            vs ? " vertical sync" : "", cases[c].recompute ? " recompute" : "", worst);
    assert_true(worst <= 1e-5);
    if (c == 0) {
      /* The comparison tells the plans apart: vertical sync's reference is another run. */
      run other = run_of((pp_grid){1, 1, 1}, PP_GPIPE, 1, k, 0);
      other.o.spec.dropout = 0;
      dream_ref dv = {&other, m, k, v0, v0};
      run_ranks(1, g->comms, dream_rank, &dv, job);
      expect_all_ok(1, job);
      double apart = values_difference(&rs, &other);
      fprintf(stderr, "    (%.3g from vertical sync's plan)\n", apart);
      assert_true(apart > 1e-4);
      run_free(&other);
    }
    /* and the plan is not the synchronous one: the staleness is real */
    run sync = run_of((pp_grid){1, 1, 1}, PP_GPIPE, 1, k, 0);
    sync.o.spec.dropout = 0;
    run_on(&sync);
    assert_true(values_difference(&rs, &sync) > 1e-4);
    run_free(&rs);
    run_free(&ref);
    run_free(&sync);
  }
}

static void test_2bw_one_stale(void **state) {
  (void)state;
  group *one = group_cache_get(&worlds, 1);
  run sync = run_of((pp_grid){1, 1, 1}, PP_GPIPE, 1, 8, 0);
  run_on(&sync);
  const pp_grid grids[] = {{1, 1, 2}, {1, 1, 4}, {2, 1, 2}, {1, 1, 2}};
  const int ms[] = {2, 4, 2, 2}, windows[] = {8, 8, 8, 3};
  for (int g = 0; g < 4; g++) {
    /* the reference's window is only where its staleness restarts */
    run ref = run_of((pp_grid){1, 1, 1}, PP_GPIPE, 1, 8, 0);
    ref.window = windows[g];
    rank_job job[1];
    run_ranks(1, one->comms, stale_rank, &ref, job);
    expect_all_ok(1, job);
    run rs = run_of(grids[g], PP_2BW, ms[g], 8, windows[g]);
    run_on(&rs);
    for (int r = 0; r < ranks_of(&rs); r++) {
      assert_true(rs.peak[r] <= 2);
      for (int i = 0; i < rs.total; i++) assert_int_equal(rs.fwd[r][i], rs.bwd[r][i]);
    }
    double stale = values_difference(&rs, &ref), fresh = values_difference(&rs, &sync);
    fprintf(stderr, "  2bw %dx%dx%d m %d, 8 steps, windows of %d: weights within %.3g of the 1-stale formula "
            "(%.3g from synchronous SGD)\n", grids[g].dp, grids[g].tp, grids[g].pp, ms[g], windows[g], stale, fresh);
    assert_true(stale <= 1e-5);
    assert_true(fresh > 1e-4); /* the staleness is real */
    /* the losses are those of the stale weights */
    expect_same_losses(&rs, &ref, 1e-5);
    run_free(&rs);
    run_free(&ref);
  }
  run_free(&sync);
}

/* Stage replication (1F1B-RR): the replicated pipeline trains as the unreplicated one, and
 * dp replicated pipelines as one unreplicated pipeline on the global batch. */
static void test_replicated_stages(void **state) {
  (void)state;
  static const int reps_a[] = {1, 2}, reps_b[] = {2, 1}, reps_c[] = {1, 3, 1, 1};
  const int *reps[] = {reps_a, reps_b, reps_c, reps_a, reps_b};
  const int pps[] = {2, 2, 4, 2, 2}, dps[] = {1, 1, 1, 2, 3};
  const pp_schedule kinds[] = {PP_1F1B, PP_GPIPE, PP_1F1B, PP_1F1B, PP_GPIPE};
  for (int i = 0; i < 5; i++) {
    run plain = run_of((pp_grid){1, 1, pps[i]}, kinds[i], 4, 4, 0);
    run rr = run_of((pp_grid){dps[i], 1, pps[i]}, kinds[i], 4, 4, 0);
    rr.batch = plain.batch = 8 * dps[i]; /* m 4 on each replica's batch of 8 */
    plain.o.microbatches = 4 * dps[i];
    rr.o.replicas = reps[i];
    run_on(&plain);
    run_on(&rr);
    expect_same_losses(&rr, &plain, 1e-6);
    double worst = values_difference(&rr, &plain);
    fprintf(stderr, "  %s, dp %d x %d stages, replicas %d,%d,...: 4 steps within %.3g of the unreplicated run\n",
            pp_schedule_name(kinds[i]), dps[i], pps[i], reps[i][0], reps[i][1], worst);
    assert_true(worst <= 1e-6);
    /* every replica of a stage holds the same weights */
    int n = ranks_of(&rr);
    for (int a = 0; a < n; a++)
      for (int b = 0; b < n; b++)
        if (rr.stage[a] == rr.stage[b])
          for (size_t j = 0; j < rr.nvalues[a]; j++) assert_true(rr.values[a][j] == rr.values[b][j]);
    run_free(&plain);
    run_free(&rr);
  }
}

/* Replicated stages under every schedule but interleaved: the replicas' lists (with the
 * updates of pipedream and 2bw as barriers of a stage's replicas) never deadlock; with one
 * replica a stage they are the schedule's (the same makespan); every replica runs its
 * micro-batches and each update once. */
static void test_replicated_lists_simulate(void **state) {
  (void)state;
  const pp_schedule kinds[] = {PP_GPIPE, PP_1F1B, PP_PIPEDREAM, PP_2BW};
  static const int reps[][4] = {{1, 1, 1, 1}, {1, 2, 1, 1}, {2, 1, 3, 1}, {3, 3, 1, 2}, {1, 1, 1, 4}, {4, 1, 2, 1}};
  int cases = 0;
  for (int k = 0; k < 4; k++)
    for (int p = 1; p <= 4; p++)
      for (int m = 1; m <= 6; m++)
        for (int mb = 1; mb <= 5; mb += 2)
          for (size_t r = 0; r < sizeof reps / sizeof *reps; r++) {
            if (kinds[k] == PP_2BW && m < p) continue;
            int total = kinds[k] == PP_GPIPE || kinds[k] == PP_1F1B ? m : m * mb;
            double span, bubble;
            fl_status st = pp_simulate_replicated(kinds[k], p, total, m, reps[r], 1, 2, &span, &bubble);
            if (st != FL_OK)
              fprintf(stderr, "%s p %d m %d total %d replicas %d,%d,...: %s\n", pp_schedule_name(kinds[k]), p, m, total,
                      reps[r][0], reps[r][1], fl_last_error());
            assert_ok(st);
            if (r == 0) {
              double span1, bubble1;
              assert_ok(pp_schedule_simulate(kinds[k], p, total, 1, 1, 2, &span1, &bubble1));
              assert_true(fabs(span - span1) < 1e-9);
            }
            for (int stage = 0; stage < p; stage++) {
              int fwd = 0, upd = 0;
              for (int j = 0; j < reps[r][stage]; j++) {
                pp_op *ops;
                size_t n;
                assert_ok(pp_replicated_ops(kinds[k], p, total, m, stage, reps[r][stage], j, &ops, &n));
                for (size_t i = 0; i < n; i++) {
                  if (ops[i].kind == PP_FORWARD) {
                    assert_int_equal(pp_replica_of(ops[i].microbatch, reps[r][stage]), j);
                    fwd++;
                  }
                  upd += ops[i].kind == PP_UPDATE;
                }
                common_free(ops);
              }
              assert_int_equal(fwd, total);
              assert_int_equal(upd, kinds[k] == PP_PIPEDREAM || kinds[k] == PP_2BW ? reps[r][stage] * (total / m) : 0);
            }
            cases++;
          }
  fprintf(stderr, "  %d replicated schedules simulated without deadlock\n", cases);
  pp_op *ops;
  size_t n;
  double span, bubble;
  assert_fails_with(pp_replicated_ops(PP_1F1B, 2, 4, 4, 0, 2, 2, &ops, &n), FL_EINVAL, "replica 2 of 2");
  assert_fails_with(pp_replicated_ops(PP_PIPEDREAM, 2, 6, 4, 0, 1, 0, &ops, &n), FL_EINVAL, "not whole mini-batches");
  assert_fails_with(pp_replicated_ops(PP_INTERLEAVED, 2, 4, 4, 0, 1, 0, &ops, &n), FL_EINVAL, "interleaved");
  static const int zero[] = {1, 0};
  assert_fails_with(pp_simulate_replicated(PP_1F1B, 2, 4, 4, zero, 1, 2, &span, &bubble), FL_EINVAL, "0 replicas");
}

/* Replicated stages under pipedream and 2bw (1F1B-RR, updates summed over the replicas) train
 * exactly as the unreplicated pipeline over unflushed windows, with the same versions. */
static void test_replicated_pipedream(void **state) {
  (void)state;
  static const int reps_a[] = {1, 2}, reps_b[] = {2, 1}, reps_c[] = {1, 3};
  const struct {
    const int *reps;
    int dp, m;
    pp_schedule kind;
    bool vs;
  } cases[] = {{reps_a, 1, 4, PP_PIPEDREAM, false}, {reps_b, 1, 2, PP_PIPEDREAM, true},
               {reps_c, 1, 4, PP_PIPEDREAM, false}, {reps_a, 2, 4, PP_PIPEDREAM, false},
               {reps_a, 1, 2, PP_2BW, false}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int dp = cases[c].dp, m = cases[c].m;
    /* (the plan depends on m: dp unreplicated pipelines are the reference) */
    run plain = run_of((pp_grid){dp, 1, 2}, cases[c].kind, m, 6, 3);
    run rr = run_of((pp_grid){dp, 1, 2}, cases[c].kind, m, 6, 3);
    plain.o.vertical_sync = rr.o.vertical_sync = cases[c].vs;
    plain.batch = rr.batch = 8 * dp;
    rr.o.replicas = cases[c].reps;
    run_on(&plain);
    run_on(&rr);
    expect_same_losses(&rr, &plain, 1e-6);
    double worst = values_difference(&rr, &plain);
    fprintf(stderr, "  %s%s, dp %d, replicas %d,%d, m %d, 6 mini-batches in windows of 3: within %.3g of unreplicated\n",
            pp_schedule_name(cases[c].kind), cases[c].vs ? " vertical sync" : "", dp, cases[c].reps[0], cases[c].reps[1],
            m, worst);
    assert_true(worst <= 1e-6);
    /* weight stashing on every replica: each of its micro-batches at the plan's version */
    int n = ranks_of(&rr), plan[64];
    for (int r = 0; r < n; r++) {
      int stage = rr.stage[r], reps = cases[c].reps[stage], j = rr.replica[r];
      assert_ok(pp_weight_versions(cases[c].kind, cases[c].vs, 2, m, 3, stage, plan));
      for (int i = 0; i < rr.total; i++) {
        bool mine = pp_replica_of(i, reps) == j;
        assert_int_equal(rr.fwd[r][i], mine ? plan[i] : -1);
        assert_int_equal(rr.bwd[r][i], rr.fwd[r][i]);
      }
      if (cases[c].kind == PP_2BW) assert_true(rr.peak[r] <= 2);
    }
    run_free(&plain);
    run_free(&rr);
  }
}

/* What the accuracy study in docs/parallelism.md rests on: under pipedream, every mini-batch
 * k >= 1 of a window has its first p - r - 1 micro-batches (of m >= p - r - 1) take their
 * forward on stage r at version k - 1, one update stale, the rest at k; with vertical sync
 * every stage has stage 0's p - 1 stale ones. */
static void test_stale_micro_batches(void **state) {
  (void)state;
  for (int p = 1; p <= 4; p++)
    for (int m = p; m <= 8; m++)
      for (int vs = 0; vs <= 1; vs++)
        for (int r = 0; r < p; r++) {
          int k = 4, v[64];
          assert_ok(pp_weight_versions(PP_PIPEDREAM, vs, p, m, k, r, v));
          int want = vs ? p - 1 : p - r - 1;
          for (int b = 1; b < k; b++) {
            int stale = 0;
            for (int i = 0; i < m; i++) {
              assert_true(v[b * m + i] == b || v[b * m + i] == b - 1);
              stale += v[b * m + i] == b - 1;
            }
            assert_int_equal(stale, want);
          }
        }
}

static void expect_create_error(run *rs, const char *needle);

/* replicas_auto: the partitioner's plan over 3 ranks a pipeline (at most 2 stages), the same on
 * every rank, replica counts adding up to 3, the link measured; whatever it chose, a flushing
 * schedule trains as one rank (as dp 2 pipelines of it on the global batch). */
static void test_replicas_auto(void **state) {
  (void)state;
  for (int dp = 1; dp <= 2; dp++) {
    run one = run_of((pp_grid){1, 1, 1}, PP_1F1B, 4 * dp, 4, 0);
    run rs = run_of((pp_grid){dp, 1, 2}, PP_1F1B, 4, 4, 0);
    one.batch = rs.batch = 8 * dp;
    rs.o.bounds = NULL;
    rs.o.replicas_auto = 3;
    run_on(&one);
    run_on(&rs);
    int n = ranks_of(&rs), stages = rs.nstages[0], sum = 0;
    assert_true(stages >= 1 && stages <= 2);
    for (int st = 0; st < stages; st++) sum += rs.reps[0][st];
    assert_int_equal(sum, 3);
    for (int r = 1; r < n; r++) {
      assert_int_equal(rs.nstages[r], stages);
      for (int st = 0; st < stages; st++) {
        assert_int_equal(rs.reps[r][st], rs.reps[0][st]);
        assert_int_equal(rs.cut[r][st + 1], rs.cut[0][st + 1]);
      }
      assert_true(rs.link[r] == rs.link[0]);
    }
    assert_true(rs.link[0] > 0);
    expect_same_losses(&rs, &one, 1e-6);
    double worst = values_difference(&rs, &one);
    fprintf(stderr, "  auto over dp %d x 3 ranks: %d stage%s, replicas %d", dp, stages, stages == 1 ? "" : "s",
            rs.reps[0][0]);
    if (stages > 1) fprintf(stderr, ",%d", rs.reps[0][1]);
    fprintf(stderr, ", link %.3g GB/s; within %.3g of one rank\n", rs.link[0] / 1e9, worst);
    assert_true(worst <= 1e-6);
    run_free(&one);
    run_free(&rs);
  }
  run bad = run_of((pp_grid){1, 2, 2}, PP_1F1B, 2, 1, 0);
  bad.o.bounds = NULL;
  bad.o.replicas_auto = 2;
  expect_create_error(&bad, "automatic replication needs tp 1");
}

/* The partitioner's link is measured when it cuts, and only then. */
static void test_link_measured(void **state) {
  (void)state;
  run rs = run_of((pp_grid){1, 1, 2}, PP_1F1B, 2, 1, 0);
  rs.o.bounds = NULL;
  run_on(&rs);
  fprintf(stderr, "  measured link between stages: %.3g GB/s\n", rs.link[0] / 1e9);
  assert_true(rs.link[0] > 0 && isfinite(rs.link[0]));
  assert_true(rs.link[1] == rs.link[0]); /* broadcast with the cut */
  run_free(&rs);
  run given = run_of((pp_grid){1, 1, 2}, PP_1F1B, 2, 1, 0);
  run_on(&given);
  assert_true(given.link[0] == 0);
  run_free(&given);
}

static fl_status expect_refused(rank_job *job) {
  run *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  pp_trainer_destroy(t);
  return s;
}

static void expect_create_error(run *rs, const char *needle) {
  int n = ranks_of(rs);
  group *g = group_cache_get(&worlds, n);
  rank_job jobs[MAX_RANKS];
  run_ranks(n, g->comms, expect_refused, rs, jobs);
  for (int r = 0; r < n; r++) {
    assert_int_equal(jobs[r].status, FL_EINVAL);
    if (!strstr(jobs[r].msg, needle)) fprintf(stderr, "'%s' lacks '%s'\n", jobs[r].msg, needle);
    assert_non_null(strstr(jobs[r].msg, needle));
  }
}

/* A call the trainer refuses, on one rank (it fails before any communication). */
static fl_status wrong_calls(rank_job *job) {
  run *rs = job->arg;
  pp_trainer *t = NULL;
  fl_status s = pp_trainer_create(cpu, job->comm, &rs->o, &t);
  if (s != FL_OK) return s;
  pp_step_stats st;
  pp_window_stats ws;
  float lr[2] = {0.1f, 0.1f};
  if (rs->o.schedule == PP_PIPEDREAM) {
    assert_fails_with(pp_trainer_compute_gradients(t, xs, ys, 8, 0, &st), FL_EINVAL, "pp_trainer_train_window");
    assert_fails_with(pp_trainer_train_window(t, xs, ys, 8, 0, 0, lr, &ws), FL_EINVAL, "0 mini-batches");
    assert_fails_with(pp_trainer_train_window(t, xs, ys, 7, 1, 0, lr, &ws), FL_EINVAL, "7 rows");
    assert_fails_with(pp_trainer_train_window(t, xs, ys, 8, 1, 0, NULL, &ws), FL_EINVAL, "NULL");
  } else {
    assert_fails_with(pp_trainer_train_window(t, xs, ys, 8, 1, 0, lr, &ws), FL_EINVAL, "not 1f1b");
  }
  pp_trainer_destroy(t);
  return FL_OK;
}

static void test_bad_options(void **state) {
  (void)state;
  run rs = run_of((pp_grid){1, 1, 2}, PP_1F1B, 2, 1, 0);
  rs.o.vertical_sync = true;
  expect_create_error(&rs, "vertical sync");
  rs = run_of((pp_grid){1, 1, 4}, PP_2BW, 2, 1, 1);
  expect_create_error(&rs, "2bw needs");
  static const int two[] = {1, 2}, zero[] = {0, 3};
  rs = run_of((pp_grid){1, 1, 2}, PP_INTERLEAVED, 2, 1, 0);
  rs.o.replicas = two;
  expect_create_error(&rs, "gpipe, 1f1b, pipedream or 2bw");
  rs = run_of((pp_grid){1, 1, 2}, PP_1F1B, 2, 1, 0);
  rs.o.replicas = zero;
  expect_create_error(&rs, "stage 0 has 0 replicas");
  rs = run_of((pp_grid){1, 1, 2}, PP_1F1B, 2, 1, 0);
  rs.o.replicas = two;
  rs.o.grid.pp = 2;
  {
    /* three ranks named by replicas {1, 2}, but a world of two */
    group *g = group_cache_get(&worlds, 2);
    rank_job jobs[MAX_RANKS];
    run_ranks(2, g->comms, expect_refused, &rs, jobs);
    for (int r = 0; r < 2; r++) {
      assert_int_equal(jobs[r].status, FL_EINVAL);
      assert_non_null(strstr(jobs[r].msg, "add up to 3 ranks"));
    }
  }
  for (int i = 0; i < 2; i++) {
    rs = run_of((pp_grid){1, 1, 1}, i ? PP_PIPEDREAM : PP_1F1B, 2, 1, 0);
    rank_job job[1];
    group *g = group_cache_get(&worlds, 1);
    run_ranks(1, g->comms, wrong_calls, &rs, job);
    expect_all_ok(1, job);
  }
}

static int setup(void **state) {
  (void)state;
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1);
  make_data();
  return fl_device_open(FL_DEVICE_CPU, 0, &cpu) == FL_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  group_cache_destroy(&worlds);
  fl_device_close(cpu);
  return 0;
}

#define BOUNDED(t) cmocka_unit_test_setup_teardown(t, test_bound_arm, test_bound_disarm)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOUNDED(test_bubble_goes_to_zero),
      BOUNDED(test_version_plans),
      BOUNDED(test_replicated_partitioner),
      BOUNDED(test_bad_options),
      BOUNDED(test_link_measured),
      BOUNDED(test_flushed_pipedream_is_gpipe),
      BOUNDED(test_weight_stashing_records),
      BOUNDED(test_pipedream_updates_follow_the_plan),
      BOUNDED(test_2bw_one_stale),
      BOUNDED(test_replicated_stages),
      BOUNDED(test_replicated_lists_simulate),
      BOUNDED(test_replicated_pipedream),
      BOUNDED(test_replicas_auto),
      BOUNDED(test_stale_micro_batches),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
