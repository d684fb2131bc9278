/*
 * test_gpu_pipeline_schedule.c: the pipeline-parallel schedules over p = 1..8 devices,
 * m = 1..32 micro-batches and v = 1..4 chunks: every op exactly once and in a valid order,
 * Megatron's interleaved order where Megatron defines it (m % p == 0), no deadlock anywhere,
 * and the simulated bubble against the closed forms; the simulator on hand-made deadlocking
 * and malformed lists; peak activations held; the partitioner against brute force; every
 * refused argument with its message; out-of-memory at each allocation.
 */
#define TEST_TIME_BOUND_S 60
#include <math.h>

#include "test_util.h"

#include "gpu/parallel/pipeline_schedule.h"

#define MAX_P 8
#define MAX_M 32
#define MAX_V 4

/* This CMocka has no assert_double_equal. */
#define expect_near(got, want, tol)                                                          \
  do {                                                                                       \
    double got_ = (got), want_ = (want);                                                     \
    if (!(fabs(got_ - want_) <= (tol)))                                                      \
      fprintf(stderr, "%s = %.17g, expected %.17g\n", #got, got_, want_);                    \
    assert_true(fabs(got_ - want_) <= (tol));                                                \
  } while (0)

static int max_chunks(pp_schedule s) { return s == PP_INTERLEAVED ? MAX_V : 1; }

static pp_op *ops_of(pp_schedule s, int p, int m, int v, int rank, size_t *n) {
  pp_op *ops = NULL;
  assert_ok(pp_schedule_ops(s, p, m, v, rank, &ops, n));
  assert_non_null(ops);
  return ops;
}

/* Each (micro-batch, chunk) forward exactly once and backward exactly once, after it. */
static void expect_each_op_once(const pp_op *ops, size_t n, int m, int v) {
  assert_int_equal(n, 2 * (size_t)m * v);
  int seen[MAX_M][MAX_V][2];
  memset(seen, 0, sizeof seen);
  for (size_t i = 0; i < n; i++) {
    pp_op op = ops[i];
    assert_true(op.kind == PP_FORWARD || op.kind == PP_BACKWARD);
    assert_in_range(op.microbatch, 0, m - 1);
    assert_in_range(op.chunk, 0, v - 1);
    assert_int_equal(seen[op.microbatch][op.chunk][op.kind], 0);
    if (op.kind == PP_BACKWARD) assert_int_equal(seen[op.microbatch][op.chunk][PP_FORWARD], 1);
    seen[op.microbatch][op.chunk][op.kind] = 1;
  }
}

/* Megatron-LM's interleaved schedule for m % p == 0, written out as its code reads
 * (get_model_chunk_id, the micro-batch of a virtual index, warm-up, 1F1B, cool-down), to hold
 * pp_schedule_ops to it independently. */
static void megatron_interleaved(int p, int m, int v, int rank, pp_op *out) {
  int total = m * v, warmup = (p - rank - 1) * 2 + (v - 1) * p;
  if (warmup > total) warmup = total;
  size_t n = 0;
#define MEGATRON_OP(kind_, k_)                                                                 \
  do {                                                                                       \
    int in_group_ = (k_) % (p * v), chunk_ = in_group_ / p;                                 \
    out[n++] = (pp_op){(kind_), ((k_) / (p * v)) * p + in_group_ % p,                        \
                       (kind_) == PP_FORWARD ? chunk_ : v - chunk_ - 1};                      \
  } while (0)
  for (int k = 0; k < warmup; k++) MEGATRON_OP(PP_FORWARD, k);
  for (int k = 0; k < total - warmup; k++) {
    MEGATRON_OP(PP_FORWARD, k + warmup);
    MEGATRON_OP(PP_BACKWARD, k);
  }
  for (int k = total - warmup; k < total; k++) MEGATRON_OP(PP_BACKWARD, k);
#undef MEGATRON_OP
}

static void expect_same_ops(const pp_op *a, const pp_op *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (a[i].kind != b[i].kind || a[i].microbatch != b[i].microbatch || a[i].chunk != b[i].chunk)
      fprintf(stderr, "op %zu: (%d, mb %d, chunk %d) vs (%d, mb %d, chunk %d)\n", i, a[i].kind,
              a[i].microbatch, a[i].chunk, b[i].kind, b[i].microbatch, b[i].chunk);
    assert_int_equal(a[i].kind, b[i].kind);
    assert_int_equal(a[i].microbatch, b[i].microbatch);
    assert_int_equal(a[i].chunk, b[i].chunk);
  }
}

/* ---- names ------------------------------------------------------------------------------- */

static void test_parse_and_names(void **state) {
  (void)state;
  const char *names[] = {"gpipe", "1f1b", "interleaved", "pipedream", "2bw"};
  for (int i = 0; i < 5; i++) {
    pp_schedule s = (pp_schedule)-1;
    assert_ok(pp_schedule_parse(names[i], &s));
    assert_int_equal(s, i);
    assert_string_equal(pp_schedule_name(s), names[i]);
  }
  pp_schedule s = PP_1F1B;
  assert_fails_with(pp_schedule_parse("gpip", &s), FL_EINVAL, "'gpip'");
  assert_fails_with(pp_schedule_parse("gpip", &s), FL_EINVAL, "gpipe, 1f1b, interleaved, pipedream or 2bw");
  assert_fails_with(pp_schedule_parse("GPipe", &s), FL_EINVAL, "'GPipe'");
  assert_fails_with(pp_schedule_parse("", &s), FL_EINVAL, "expected");
  assert_int_equal(s, PP_1F1B); /* untouched on failure */
  assert_fails_with(pp_schedule_parse(NULL, &s), FL_EINVAL, "NULL");
  assert_fails_with(pp_schedule_parse("gpipe", NULL), FL_EINVAL, "NULL");
  assert_string_equal(pp_schedule_name((pp_schedule)5), "unknown");
  assert_string_equal(pp_schedule_name((pp_schedule)-1), "unknown");
}

/* ---- the schedules ----------------------------------------------------------------------- */

static void test_ops_bad_arguments(void **state) {
  (void)state;
  pp_op *ops = (pp_op *)&ops; /* a sentinel: must stay untouched */
  pp_op *const sentinel = ops;
  size_t n = 7;
  assert_fails_with(pp_schedule_ops(PP_1F1B, 0, 4, 1, 0, &ops, &n), FL_EINVAL, "0 devices");
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 0, 1, 0, &ops, &n), FL_EINVAL, "0 micro-batches");
  assert_fails_with(pp_schedule_ops(PP_INTERLEAVED, 4, 4, 0, 0, &ops, &n), FL_EINVAL,
                    "0 model chunks");
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 4, 1, -1, &ops, &n), FL_EINVAL, "rank -1");
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 4, 1, 4, &ops, &n), FL_EINVAL, "rank 4");
  assert_fails_with(pp_schedule_ops(PP_GPIPE, 4, 4, 2, 0, &ops, &n), FL_EINVAL, "gpipe");
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 4, 2, 0, &ops, &n), FL_EINVAL, "interleaved");
  assert_fails_with(pp_schedule_ops((pp_schedule)7, 4, 4, 1, 0, &ops, &n), FL_EINVAL,
                    "schedule 7");
  assert_fails_with(pp_schedule_ops(PP_INTERLEAVED, 4, 1 << 27, 4, 0, &ops, &n), FL_EINVAL,
                    "too large");
  assert_true(ops == sentinel);
  assert_int_equal(n, 7);
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 4, 1, 0, NULL, &n), FL_EINVAL, "NULL");
  assert_fails_with(pp_schedule_ops(PP_1F1B, 4, 4, 1, 0, &ops, NULL), FL_EINVAL, "NULL");
  double mk = 0, b = 0;
  assert_fails_with(pp_schedule_simulate(PP_GPIPE, 2, 4, 3, 1, 2, &mk, &b), FL_EINVAL, "gpipe");
  assert_fails_with(pp_schedule_simulate(PP_GPIPE, 2, 4, 1, -1, 2, &mk, &b), FL_EINVAL,
                    "finite and >= 0");
  assert_fails_with(pp_schedule_simulate(PP_GPIPE, 2, 4, 1, 1, NAN, &mk, &b), FL_EINVAL,
                    "finite and >= 0");
  assert_fails_with(pp_schedule_simulate(PP_GPIPE, 2, 4, 1, 1, 2, NULL, &b), FL_EINVAL, "NULL");
  assert_true(isnan(pp_bubble_theory(PP_GPIPE, 0, 4, 1)));
  assert_true(isnan(pp_bubble_theory(PP_1F1B, 4, 4, 2)));
  assert_true(isnan(pp_bubble_theory((pp_schedule)5, 4, 4, 1)));
}

/* Device `rank`'s list is exactly `want`. */
static void expect_order(pp_schedule s, int p, int m, int v, int rank, const pp_op *want,
                         size_t count) {
  size_t n;
  pp_op *ops = ops_of(s, p, m, v, rank, &n);
  assert_int_equal(n, count);
  expect_same_ops(ops, want, n);
  free(ops);
}

/* The hand-checked orders of small cases, as a reader of the papers would write them. */
static void test_small_orders_by_hand(void **state) {
  (void)state;
  /* GPipe, 2 micro-batches: F0 F1 B0 B1 on every device. */
  const pp_op gpipe[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 1, 0}, {PP_BACKWARD, 0, 0},
                         {PP_BACKWARD, 1, 0}};
  expect_order(PP_GPIPE, 2, 2, 1, 1, gpipe, 4);
  /* 1F1B, p = 4, m = 6, device 1: two warm-up forwards, then F2 B0 F3 B1 F4 B2 F5 B3, B4 B5. */
  const pp_op one_f_one_b[] = {{PP_FORWARD, 0, 0},  {PP_FORWARD, 1, 0},  {PP_FORWARD, 2, 0},
                               {PP_BACKWARD, 0, 0}, {PP_FORWARD, 3, 0},  {PP_BACKWARD, 1, 0},
                               {PP_FORWARD, 4, 0},  {PP_BACKWARD, 2, 0}, {PP_FORWARD, 5, 0},
                               {PP_BACKWARD, 3, 0}, {PP_BACKWARD, 4, 0}, {PP_BACKWARD, 5, 0}};
  expect_order(PP_1F1B, 4, 6, 1, 1, one_f_one_b, 12);
  /* Interleaved, p = 2, m = 3, v = 2, device 0: Megatron's order for m = 4 (warm-up
   * 2 + 2 = 4) without micro-batch 3: F(0,c0) F(1,c0) F(0,c1) F(1,c1) | F(2,c0) B(0,c1)
   * [F(3,c0) dropped] B(1,c1) F(2,c1) B(0,c0) [F(3,c1)] B(1,c0) | B(2,c1) [B(3,c1)] B(2,c0). */
  const pp_op interleaved[] = {{PP_FORWARD, 0, 0},  {PP_FORWARD, 1, 0},  {PP_FORWARD, 0, 1},
                               {PP_FORWARD, 1, 1},  {PP_FORWARD, 2, 0},  {PP_BACKWARD, 0, 1},
                               {PP_BACKWARD, 1, 1}, {PP_FORWARD, 2, 1},  {PP_BACKWARD, 0, 0},
                               {PP_BACKWARD, 1, 0}, {PP_BACKWARD, 2, 1}, {PP_BACKWARD, 2, 0}};
  expect_order(PP_INTERLEAVED, 2, 3, 2, 0, interleaved, 12);
}

/* Every schedule, p 1..8, m 1..32, v 1..4: ops once each, simulated without deadlock, the
 * bubble of the closed forms (pipedream and 2bw: m is their window's micro-batches). */
static void test_schedules_matrix(void **state) {
  (void)state;
  pp_op megatron[2 * MAX_M * MAX_V];
  for (int si = 0; si <= PP_2BW; si++) {
    pp_schedule s = (pp_schedule)si;
    for (int p = 1; p <= MAX_P; p++)
      for (int m = 1; m <= MAX_M; m++)
        for (int v = 1; v <= max_chunks(s); v++) {
          for (int r = 0; r < p; r++) {
            size_t n;
            pp_op *ops = ops_of(s, p, m, v, r, &n);
            expect_each_op_once(ops, n, m, v);
            if (s == PP_INTERLEAVED && v == 1) {
              size_t n1;
              pp_op *plain = ops_of(PP_1F1B, p, m, 1, r, &n1);
              assert_int_equal(n, n1);
              expect_same_ops(ops, plain, n);
              free(plain);
            }
            if (s == PP_INTERLEAVED && v > 1 && m % p == 0) {
              megatron_interleaved(p, m, v, r, megatron);
              expect_same_ops(ops, megatron, n);
            }
            free(ops);
          }
          double makespan = -1, bubble = -1;
          fl_status st = pp_schedule_simulate(s, p, m, v, 1, 2, &makespan, &bubble);
          if (st != FL_OK)
            fprintf(stderr, "%s p=%d m=%d v=%d: %s\n", pp_schedule_name(s), p, m, v,
                    fl_last_error());
          assert_int_equal(st, FL_OK);
          double gpipe = (double)(p - 1) / (m + p - 1);
          if (s != PP_INTERLEAVED) {
            expect_near(bubble, gpipe, 1e-12);
            expect_near(bubble, pp_bubble_theory(s, p, m, v), 1e-12);
            expect_near(makespan, 3.0 * (m + p - 1), 1e-12);
          } else if (m % p == 0) {
            /* Each chunk op is 1/v of a micro-batch's work on a device, so the fill and drain
             * cost p-1 chunk ops: (p-1)/(v*m+p-1) of the time, which is pp_bubble_theory
             * (p-1)/(m+p-1)/v only as m grows, and exactly it for p == 1 or v == 1. */
            expect_near(bubble, (double)(p - 1) / (v * m + p - 1), 1e-12);
            expect_near(makespan, 3.0 * (v * m + p - 1), 1e-12);
            assert_true(bubble >= pp_bubble_theory(s, p, m, v) - 1e-12);
            if (v == 1) expect_near(bubble, pp_bubble_theory(s, p, m, v), 1e-12);
          } else {
            assert_true(bubble <= gpipe + 1e-12);
            assert_true(bubble >= (double)(p - 1) / (v * m + p - 1) - 1e-12);
          }
        }
  }
}

/* GPipe's and 1F1B's makespan is (m + p - 1) * (t_fwd + t_bwd) whatever the two times. */
static void test_simulated_times_other_ratios(void **state) {
  (void)state;
  const double times[][2] = {{1, 1}, {0.5, 3}, {2, 0.25}};
  for (size_t t = 0; t < sizeof times / sizeof *times; t++)
    for (int si = 0; si < 2; si++)
      for (int p = 1; p <= MAX_P; p++)
        for (int m = 1; m <= 12; m++) {
          double makespan, bubble;
          assert_ok(pp_schedule_simulate((pp_schedule)si, p, m, 1, times[t][0], times[t][1],
                                         &makespan, &bubble));
          expect_near(makespan, (m + p - 1) * (times[t][0] + times[t][1]), 1e-12);
          expect_near(bubble, (double)(p - 1) / (m + p - 1), 1e-12);
        }
  double makespan = -1, bubble = -1;
  assert_ok(pp_schedule_simulate(PP_1F1B, 3, 4, 1, 0, 0, &makespan, &bubble));
  assert_true(makespan == 0 && bubble == 0);
}

/* ---- the simulator on hand-made lists -------------------------------------------------- */

static void test_simulator_detects_deadlock(void **state) {
  (void)state;
  double makespan = -1, bubble = -1;
  /* Device 1 (the last stage) lists its backward before the forward it needs. */
  pp_op d0[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}};
  pp_op d1[] = {{PP_BACKWARD, 0, 0}, {PP_FORWARD, 0, 0}};
  const pp_op *lists[] = {d0, d1};
  size_t n[] = {2, 2};
  assert_fails_with(pp_simulate_ops(2, 1, lists, n, 1, 2, &makespan, &bubble), FL_ESTATE,
                    "device 1 is blocked at op 0 (backward of micro-batch 0, chunk 0)");
  assert_true(makespan == -1 && bubble == -1);

  /* A cycle across devices: device 0 wants micro-batch 0's backward before it sends
   * micro-batch 1's forward, which device 1 wants before anything else. */
  pp_op e0[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}, {PP_FORWARD, 1, 0}, {PP_BACKWARD, 1, 0}};
  pp_op e1[] = {{PP_FORWARD, 1, 0}, {PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}, {PP_BACKWARD, 1, 0}};
  const pp_op *cycle[] = {e0, e1};
  size_t ne[] = {4, 4};
  assert_fails_with(pp_simulate_ops(2, 1, cycle, ne, 1, 2, &makespan, &bubble), FL_ESTATE,
                    "device 0 is blocked at op 1 (backward of micro-batch 0, chunk 0), waiting "
                    "for the backward of micro-batch 0, chunk 0 on device 1");

  /* Interleaved: device 0 waits for stage 1's forward before its chunk 1 (stage 2), and
   * device 1 lists stage 1's backward before that forward. */
  pp_op i0[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 1}, {PP_BACKWARD, 0, 0}};
  pp_op i1[] = {{PP_BACKWARD, 0, 0}, {PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 1}};
  const pp_op *inter[] = {i0, i1};
  assert_fails_with(pp_simulate_ops(2, 2, inter, ne, 1, 2, &makespan, &bubble), FL_ESTATE,
                    "device 1 is blocked");

  /* The same lists in a good order run, and the times are the hand-computed ones: stages
   * 0..3 forward at t = 0..4, backward at 4..12. */
  pp_op g0[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 1}, {PP_BACKWARD, 0, 0}};
  pp_op g1[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 1}, {PP_BACKWARD, 0, 0}};
  const pp_op *good[] = {g0, g1};
  assert_ok(pp_simulate_ops(2, 2, good, ne, 1, 2, &makespan, &bubble));
  expect_near(makespan, 12, 1e-12);
  expect_near(bubble, 1 - 12.0 / 24, 1e-12);
}

static void test_simulator_bad_lists(void **state) {
  (void)state;
  double makespan, bubble;
  pp_op twice[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}};
  const pp_op *l1[] = {twice};
  size_t n1[] = {3};
  assert_fails_with(pp_simulate_ops(1, 1, l1, n1, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "device 0 runs the forward of micro-batch 0, chunk 0 twice");
  /* Device 1 never runs micro-batch 1: no deadlock, but not a whole mini-batch either. */
  pp_op a[] = {{PP_FORWARD, 0, 0}, {PP_FORWARD, 1, 0}, {PP_BACKWARD, 0, 0}, {PP_BACKWARD, 1, 0}};
  pp_op b[] = {{PP_FORWARD, 0, 0}, {PP_BACKWARD, 0, 0}};
  const pp_op *l2[] = {a, b};
  size_t n2[] = {4, 2};
  assert_fails_with(pp_simulate_ops(2, 1, l2, n2, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "device 1 never runs the forward of micro-batch 1");
  pp_op chunk[] = {{PP_FORWARD, 0, 1}, {PP_BACKWARD, 0, 1}};
  const pp_op *l3[] = {chunk};
  assert_fails_with(pp_simulate_ops(1, 1, l3, n2 + 1, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "out of range");
  pp_op negative[] = {{PP_FORWARD, -1, 0}, {PP_BACKWARD, -1, 0}};
  const pp_op *l4[] = {negative};
  assert_fails_with(pp_simulate_ops(1, 1, l4, n2 + 1, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "out of range");
  const pp_op *l5[] = {NULL};
  assert_fails_with(pp_simulate_ops(1, 1, l5, n2 + 1, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "at NULL");
  assert_fails_with(pp_simulate_ops(0, 1, l5, n2, 1, 2, &makespan, &bubble), FL_EINVAL,
                    "0 devices");
  assert_fails_with(pp_simulate_ops(1, 1, NULL, n2, 1, 2, &makespan, &bubble), FL_EINVAL, "NULL");
  /* Empty lists: nothing to run, nothing idle. */
  size_t zero[] = {0, 0};
  const pp_op *none[] = {NULL, NULL};
  makespan = bubble = -1;
  assert_ok(pp_simulate_ops(2, 1, none, zero, 1, 2, &makespan, &bubble));
  assert_true(makespan == 0 && bubble == 0);
}

/* ---- activations held -------------------------------------------------------------------- */

static void test_peak_inflight(void **state) {
  (void)state;
  for (int p = 1; p <= MAX_P; p++)
    for (int m = 1; m <= MAX_M; m++)
      for (int r = 0; r < p; r++) {
        assert_int_equal(pp_schedule_peak_inflight(PP_GPIPE, p, m, 1, r), m);
        int want = m < p - r ? m : p - r;
        assert_int_equal(pp_schedule_peak_inflight(PP_1F1B, p, m, 1, r), want);
        assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, p, m, 1, r), want);
        for (int v = 2; v <= MAX_V; v++) {
          /* Megatron's warm-up plus the first steady forward, or everything. */
          int megatron = (p - r - 1) * 2 + (v - 1) * p + 1;
          if (megatron > m * v) megatron = m * v;
          int got = pp_schedule_peak_inflight(PP_INTERLEAVED, p, m, v, r);
          if (m % p == 0)
            assert_int_equal(got, megatron);
          else
            assert_true(got >= 1 && got <= megatron);
        }
      }
  /* Known values: p = 4, v = 2, m = 8: device 0 holds 3*2 + 4 + 1 = 11, device 3 holds 5;
   * p = 2, v = 3, m = 4: 2 + 4 + 1 = 7 and 5; p = 4, v = 2, m = 4: all 8 on device 0. */
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 4, 8, 2, 0), 11);
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 4, 8, 2, 3), 5);
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 2, 4, 3, 0), 7);
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 2, 4, 3, 1), 5);
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 4, 4, 2, 0), 8);
  /* p = 2, m = 3, v = 2, device 0: the hand-written order above holds 5 after F(2,c0). */
  assert_int_equal(pp_schedule_peak_inflight(PP_INTERLEAVED, 2, 3, 2, 0), 5);
  assert_int_equal(pp_schedule_peak_inflight(PP_1F1B, 4, 8, 2, 0), -1);
  assert_non_null(strstr(fl_last_error(), "interleaved"));
  assert_int_equal(pp_schedule_peak_inflight(PP_GPIPE, 4, 8, 1, 9), -1);
  assert_non_null(strstr(fl_last_error(), "rank 9"));
}

/* ---- the partitioner --------------------------------------------------------------------- */

/* The slowest stage of a given cut, as pp_partition defines it. */
static double cut_bottleneck(const double *t, const double *bytes, size_t n, int p, double bw,
                             const size_t *bounds) {
  double worst = 0;
  for (int k = 0; k < p; k++) {
    double stage = 0;
    for (size_t i = bounds[k]; i < bounds[k + 1]; i++) stage += t[i];
    if (k < p - 1 && bw > 0) stage += bytes[bounds[k + 1] - 1] / bw;
    if (stage > worst) worst = stage;
  }
  (void)n;
  return worst;
}

/* Every placement of the p-1 cuts, recursively; the least bottleneck. */
static double brute_force(const double *t, const double *bytes, size_t n, int p, double bw,
                          size_t *bounds, int k) {
  if (k == p) return cut_bottleneck(t, bytes, n, p, bw, bounds);
  double best = INFINITY;
  for (size_t b = bounds[k - 1] + 1; b + (size_t)(p - k) <= n; b++) {
    bounds[k] = b;
    double got = brute_force(t, bytes, n, p, bw, bounds, k + 1);
    if (got < best) best = got;
  }
  return best;
}

static uint64_t lcg_next(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return *s >> 33;
}

static void expect_valid_bounds(const size_t *bounds, size_t n, int p) {
  assert_int_equal(bounds[0], 0);
  assert_int_equal(bounds[p], n);
  for (int k = 0; k < p; k++) assert_true(bounds[k] < bounds[k + 1]);
}

static void test_partition_known_profiles(void **state) {
  (void)state;
  size_t bounds[5];
  double bottleneck = -1;
  const double t[] = {1, 1, 1, 1, 4, 1, 1, 1};
  assert_ok(pp_partition(t, NULL, 8, 3, 0, bounds, &bottleneck));
  expect_near(bottleneck, 4, 0);
  size_t want[] = {0, 4, 5, 8};
  for (int k = 0; k <= 3; k++) assert_int_equal(bounds[k], want[k]);
  /* One stage: everything; as many stages as layers: the slowest layer. */
  assert_ok(pp_partition(t, NULL, 8, 1, 0, bounds, &bottleneck));
  expect_near(bottleneck, 11, 0);
  assert_true(bounds[0] == 0 && bounds[1] == 8);
  size_t each[9];
  assert_ok(pp_partition(t, NULL, 8, 8, 0, each, &bottleneck));
  expect_near(bottleneck, 4, 0);
  for (int k = 0; k <= 8; k++) assert_int_equal(each[k], (size_t)k);

  /* Communication moves the cut: four equal layers cut in the middle when sending is free,
   * but layer 1's output takes 8 s to send, so the cut goes after layer 0 (1 + 1 and 3). The
   * last layer's output is never sent, however large. */
  const double eq[] = {1, 1, 1, 1}, bytes[] = {1, 8, 1, 1000};
  assert_ok(pp_partition(eq, bytes, 4, 2, 0, bounds, &bottleneck));
  assert_true(bounds[1] == 2 && bottleneck == 2);
  assert_ok(pp_partition(eq, bytes, 4, 2, -1, bounds, &bottleneck));
  assert_true(bounds[1] == 2 && bottleneck == 2);
  assert_ok(pp_partition(eq, bytes, 4, 2, 1, bounds, &bottleneck));
  assert_int_equal(bounds[1], 1);
  expect_near(bottleneck, 3, 0);
  /* Faster links: 8 bytes at 16 bytes/s is 0.5 s, and the middle cut is best again. */
  assert_ok(pp_partition(eq, bytes, 4, 2, 16, bounds, &bottleneck));
  assert_int_equal(bounds[1], 2);
  expect_near(bottleneck, 2.5, 0);
}

/* Seeded random profiles, n <= 10, p <= 4: the DP's bottleneck is brute force's, and its
 * bounds achieve it. Times are multiples of 1/8 and bandwidths powers of two, so every sum
 * is exact and the two can be compared with ==. */
static void test_partition_matches_brute_force(void **state) {
  (void)state;
  uint64_t seed = 20240611;
  const double bandwidths[] = {0, 4, 8, 0.5};
  for (int trial = 0; trial < 400; trial++) {
    size_t n = 1 + lcg_next(&seed) % 10;
    double t[10], bytes[10];
    for (size_t i = 0; i < n; i++) {
      t[i] = (double)(lcg_next(&seed) % 33) / 8;
      bytes[i] = (double)(lcg_next(&seed) % 17);
    }
    double bw = bandwidths[trial % 4];
    for (int p = 1; p <= 4 && (size_t)p <= n; p++) {
      size_t bounds[5], scratch[5] = {0};
      double bottleneck = -1;
      assert_ok(pp_partition(t, bytes, n, p, bw, bounds, &bottleneck));
      expect_valid_bounds(bounds, n, p);
      scratch[p] = n;
      double best = brute_force(t, bytes, n, p, bw, scratch, 1);
      if (bottleneck != best)
        fprintf(stderr, "trial %d n=%zu p=%d bw=%g: dp %g, brute force %g\n", trial, n, p, bw,
                bottleneck, best);
      assert_true(bottleneck == best);
      assert_true(cut_bottleneck(t, bytes, n, p, bw, bounds) == bottleneck);
    }
  }
}

static void test_partition_bad_arguments(void **state) {
  (void)state;
  const double t[] = {1, 2, 3}, bytes[] = {1, 1, 1};
  size_t bounds[5] = {9, 9, 9, 9, 9};
  double bottleneck = -1;
  assert_fails_with(pp_partition(t, bytes, 3, 4, 1, bounds, &bottleneck), FL_EINVAL,
                    "cannot cut 3 layers into 4");
  assert_fails_with(pp_partition(t, bytes, 3, 0, 1, bounds, &bottleneck), FL_EINVAL,
                    "into 0 non-empty stages");
  assert_fails_with(pp_partition(t, bytes, 0, 1, 1, bounds, &bottleneck), FL_EINVAL, "no layers");
  assert_fails_with(pp_partition(NULL, bytes, 3, 2, 1, bounds, &bottleneck), FL_EINVAL, "NULL");
  assert_fails_with(pp_partition(t, NULL, 3, 2, 1, bounds, &bottleneck), FL_EINVAL, "NULL");
  assert_fails_with(pp_partition(t, bytes, 3, 2, 1, NULL, &bottleneck), FL_EINVAL, "NULL");
  assert_fails_with(pp_partition(t, bytes, 3, 2, 1, bounds, NULL), FL_EINVAL, "NULL");
  const double negative[] = {1, -2, 3}, nan_time[] = {1, NAN, 3}, bad_bytes[] = {1, -1, 1};
  assert_fails_with(pp_partition(negative, bytes, 3, 2, 1, bounds, &bottleneck), FL_EINVAL,
                    "layer 1 has time -2");
  assert_fails_with(pp_partition(nan_time, bytes, 3, 2, 1, bounds, &bottleneck), FL_EINVAL,
                    "layer 1 has time nan");
  assert_fails_with(pp_partition(t, bad_bytes, 3, 2, 1, bounds, &bottleneck), FL_EINVAL,
                    "layer 1 has output size -1");
  assert_fails_with(pp_partition(t, bytes, 3, 2, INFINITY, bounds, &bottleneck), FL_EINVAL,
                    "not finite");
  for (int k = 0; k < 5; k++) assert_int_equal(bounds[k], 9);
  assert_true(bottleneck == -1);
}

/* ---- out of memory ----------------------------------------------------------------------- */

/* Each allocation in turn fails; every call reports FL_ENOMEM until there are enough. */
static void test_out_of_memory(void **state) {
  (void)state;
  int failures = 0;
  for (long k = 0;; k++) {
    double makespan, bubble;
    flint_test_fail_alloc_after(k);
    fl_status st = pp_schedule_simulate(PP_INTERLEAVED, 4, 6, 2, 1, 2, &makespan, &bubble);
    flint_test_fail_alloc_after(-1);
    if (st == FL_OK) break;
    assert_int_equal(st, FL_ENOMEM);
    failures++;
  }
  assert_true(failures >= 4 + 2 + 4); /* ops, n, four lists; two done tables, clock, next */
  for (long k = 0; k < 3; k++) {
    const double t[] = {1, 2, 3, 4};
    size_t bounds[3];
    double bottleneck;
    flint_test_fail_alloc_after(k);
    fl_status st = pp_partition(t, NULL, 4, 2, 0, bounds, &bottleneck);
    flint_test_fail_alloc_after(-1);
    assert_int_equal(st, FL_ENOMEM);
  }
  flint_test_fail_alloc_after(0);
  assert_int_equal(pp_schedule_peak_inflight(PP_GPIPE, 2, 2, 1, 0), -1);
  flint_test_fail_alloc_after(-1);
}

#define BOUNDED(t) cmocka_unit_test_setup_teardown(t, test_bound_arm, test_bound_disarm)

int main(void) {
  const struct CMUnitTest tests[] = {
      BOUNDED(test_parse_and_names),
      BOUNDED(test_ops_bad_arguments),
      BOUNDED(test_small_orders_by_hand),
      BOUNDED(test_schedules_matrix),
      BOUNDED(test_simulated_times_other_ratios),
      BOUNDED(test_simulator_detects_deadlock),
      BOUNDED(test_simulator_bad_lists),
      BOUNDED(test_peak_inflight),
      BOUNDED(test_partition_known_profiles),
      BOUNDED(test_partition_matches_brute_force),
      BOUNDED(test_partition_bad_arguments),
      BOUNDED(test_out_of_memory),
  };
  return cmocka_run_group_tests_name("gpu_pipeline_schedule", tests, NULL, NULL);
}
