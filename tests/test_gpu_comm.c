/*
 * test_gpu_comm.c: the host collectives, with ranks as threads over loopback. Each rank
 * listens on 127.0.0.1:0, the addresses are shared through the test (the stand-in for the
 * barrier-stage bootstrap) and each thread builds its communicator.
 *
 * Inputs are small integers held as floats, so every sum is exact in any order and results
 * are compared bit for bit with the serial sum. The matrix: allreduce algorithms x 1..5 ranks
 * x sizes from 1 element to 4M floats (16 MB); broadcast from every root, allgather,
 * reduce-scatter with uneven blocks, send/recv, barrier, split; a device that stages through
 * host memory (the cuda path, without a GPU); and the failures: bad arguments, a rank that
 * never connects, a rank that leaves mid-collective, garbage on an endpoint.
 *
 * The communication thread (gpu/comm/comm.h, gpu/comm/worker.c) too: buckets posted through it
 * (more than its queue holds, sizes 0 to 256K floats, random floats so that any other order of
 * additions would show) end bit for bit as when the rank's thread reduces them, on the cpu and
 * the staged device (posting synchronizes the device); the communicator is the rank's again
 * after a wait; a peer that leaves fails the survivor's wait at once with the allreduce's
 * message, and later posts with it.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "common/common.h"
#include "flint/gpu.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/host_transport.h"
#include "gpu/device/device.h"

#include "rank_threads.h"

static fl_device *cpu;

/* ---- data -------------------------------------------------------------------------------- */

/* Rank r's element i: a small integer in [-16, 16], so sums of a few ranks are exact. */
static inline float value(int r, size_t i, uint32_t seed) {
  uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(r + 1) << 40) ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (float)((int)(x % 33) - 16);
}

static inline float sum_value(int size, size_t i, uint32_t seed) {
  float s = 0;
  for (int r = 0; r < size; r++) s += value(r, i, seed);
  return s;
}

static fl_tensor *tensor_on(fl_device *dev, size_t n) {
  int64_t shape[1] = {(int64_t)n};
  fl_tensor *t;
  must_ok(fl_tensor_create(dev, 1, shape, &t));
  return t;
}

static void fill(fl_tensor *t, int r, uint32_t seed) {
  size_t n = fl_tensor_numel(t);
  float *buf = malloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) buf[i] = value(r, i, seed);
  if (n) must_ok(fl_tensor_write(t, buf, n));
  free(buf);
}

/* Reads t and returns the index of the first element that differs from want(i), or -1. */
static long first_mismatch(const fl_tensor *t, float (*want)(size_t i, void *ctx), void *ctx) {
  size_t n = fl_tensor_numel(t);
  float *buf = malloc(n * sizeof(float) + 4);
  if (n) must_ok(fl_tensor_read(t, buf, n));
  long bad = -1;
  for (size_t i = 0; i < n && bad < 0; i++)
    if (buf[i] != want(i, ctx)) bad = (long)i;
  free(buf);
  return bad;
}

/* ---- allreduce matrix -------------------------------------------------------------------- */

typedef struct ar_case {
  fl_device *dev;
  size_t n;
  fl_allreduce_algo algo;
  fl_reduce_op op;
  uint32_t seed;
  int size;
  long bad[MAX_RANKS];
} ar_case;

static float want_allreduce(size_t i, void *ctx) {
  ar_case *c = ctx;
  float s = sum_value(c->size, i, c->seed);
  return c->op == FL_REDUCE_AVG ? s * (1.0f / (float)c->size) : s;
}

static fl_status allreduce_rank(rank_job *job) {
  ar_case *c = job->arg;
  fl_tensor *t = tensor_on(c->dev, c->n);
  fill(t, job->rank, c->seed);
  fl_status st = fl_comm_set_allreduce_algo(job->comm, c->algo);
  if (st == FL_OK) st = fl_comm_allreduce(job->comm, t, c->op);
  c->bad[job->rank] = st == FL_OK ? first_mismatch(t, want_allreduce, c) : -1;
  fl_tensor_destroy(t);
  return st;
}

static void check_allreduce(group *g, fl_device *dev, fl_allreduce_algo algo, size_t n,
                            fl_reduce_op op) {
  ar_case c = {.dev = dev, .n = n, .algo = algo, .op = op, .seed = (uint32_t)(n * 31 + algo), .size = g->size};
  rank_job jobs[MAX_RANKS];
  run_ranks(g->size, g->comms, allreduce_rank, &c, jobs);
  expect_all_ok(g->size, jobs);
  for (int r = 0; r < g->size; r++) {
    if (c.bad[r] >= 0)
      fprintf(stderr, "allreduce %s, %d ranks, %zu floats: rank %d differs at %ld\n",
              fl_allreduce_algo_name(algo), g->size, n, r, c.bad[r]);
    assert_int_equal(c.bad[r], -1);
  }
}

static void test_allreduce_matrix(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 2, 3, 7, 1000, 65537, 4u << 20};
  static const fl_allreduce_algo algos[] = {FL_ALLREDUCE_RING, FL_ALLREDUCE_HALVING_DOUBLING,
                                            FL_ALLREDUCE_TREE, FL_ALLREDUCE_AUTO};
  for (int p = 1; p <= 5; p++) {
    group g;
    group_create(&g, p);
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        check_allreduce(&g, cpu, algos[a], sizes[s], FL_REDUCE_SUM);
    /* avg, and an empty tensor, once per algorithm */
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
      check_allreduce(&g, cpu, algos[a], 1001, FL_REDUCE_AVG);
      check_allreduce(&g, cpu, algos[a], 0, FL_REDUCE_SUM);
    }
    group_destroy(&g);
  }
}

static void coll_case_sizes_check(group *g);

/* ---- 16-bit allreduce (the compression hooks' fp16/bf16) ------------------------------------
 * Small integers are exact in both formats, and so are their sums over up to 16 ranks. */
typedef struct half_case {
  size_t n;
  comm_half_kind kind;
  int size;
  long bad[MAX_RANKS];
} half_case;

static fl_status half_rank(rank_job *job) {
  half_case *c = job->arg;
  uint16_t *x = malloc(c->n * 2 + 2);
  for (size_t i = 0; i < c->n; i++) {
    float v = value(job->rank, i, 7);
    x[i] = c->kind == COMM_HALF_FP16 ? comm_f32_to_f16(v) : comm_f32_to_bf16(v);
  }
  fl_status st = comm_allreduce_half(job->comm, x, c->n, c->kind);
  c->bad[job->rank] = -1;
  for (size_t i = 0; st == FL_OK && i < c->n && c->bad[job->rank] < 0; i++) {
    float got = c->kind == COMM_HALF_FP16 ? comm_f16_to_f32(x[i]) : comm_bf16_to_f32(x[i]);
    if (got != sum_value(c->size, i, 7)) c->bad[job->rank] = (long)i;
  }
  free(x);
  return st;
}

static void test_allreduce_half(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 7, 65537, 300001};
  static const int ranks[] = {1, 2, 3, 5};
  for (size_t k = 0; k < sizeof ranks / sizeof *ranks; k++) {
    group g;
    group_create(&g, ranks[k]);
    for (int kind = COMM_HALF_FP16; kind <= COMM_HALF_BF16; kind++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        half_case c = {.n = sizes[s], .kind = (comm_half_kind)kind, .size = g.size};
        rank_job jobs[MAX_RANKS];
        run_ranks(g.size, g.comms, half_rank, &c, jobs);
        expect_all_ok(g.size, jobs);
        for (int r = 0; r < g.size; r++) assert_int_equal(c.bad[r], -1);
      }
    if (ranks[k] == 1) {
      uint16_t x = 0;
      assert_fails_with(comm_allreduce_half(g.comms[0], &x, 1, (comm_half_kind)9), FL_EINVAL, "16-bit");
      assert_fails_with(comm_allreduce_half(g.comms[0], NULL, 1, COMM_HALF_FP16), FL_EINVAL, "NULL");
    }
    group_destroy(&g);
  }
  /* The bulk conversions (F16C where the CPU has it) give the scalar casts' bits, over every
   * fp16 value and fp32 bit patterns of every kind: ties, subnormals, infinities, NaN. */
  enum { N = 1 << 16 };
  uint16_t *h = malloc(N * 2), *h2 = malloc(N * 2);
  float *f = malloc(N * 4);
  for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)i;
  comm_half_to_f32(COMM_HALF_FP16, f, h, N);
  for (uint32_t i = 0; i < N; i++) {
    float want = comm_f16_to_f32((uint16_t)i);
    assert_true(memcmp(&f[i], &want, 4) == 0 || (f[i] != f[i] && want != want));
  }
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint32_t i = 0; i < N; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint32_t bits = i < 4096 ? 0x33000000u + i * 0x1000u : (uint32_t)x; /* near fp16's subnormals, then random */
    memcpy(&f[i], &bits, 4);
  }
  for (int kind = COMM_HALF_FP16; kind <= COMM_HALF_BF16; kind++) {
    comm_half_from_f32((comm_half_kind)kind, h, f, N - 3); /* a ragged tail */
    for (uint32_t i = 0; i < N - 3; i++)
      h2[i] = kind == COMM_HALF_FP16 ? comm_f32_to_f16(f[i]) : comm_f32_to_bf16(f[i]);
    assert_memory_equal(h, h2, (N - 3) * 2);
  }
  free(h), free(h2), free(f);
  /* Rounding: bf16 keeps 8 bits of mantissa, fp16 11; both round to nearest even. */
  assert_true(comm_bf16_to_f32(comm_f32_to_bf16(1.00390625f)) == 1.0f);
  assert_true(comm_bf16_to_f32(comm_f32_to_bf16(1.01171875f)) == 1.015625f);
  assert_true(comm_f16_to_f32(comm_f32_to_f16(0.1f)) == (float)(_Float16)0.1f);
  assert_true(comm_bf16_to_f32(comm_f32_to_bf16(__builtin_nanf(""))) != comm_bf16_to_f32(comm_f32_to_bf16(__builtin_nanf(""))));
}

/* The other collectives at 8, 13 and 16 ranks (every allreduce algorithm runs over the
 * issue's matrix of ranks in test_gpu_comm_algorithms). */
static void test_allreduce_many_ranks(void **state) {
  (void)state;
  static const int ranks[] = {8, 13, 16};
  for (size_t k = 0; k < sizeof ranks / sizeof *ranks; k++) {
    group g;
    group_create(&g, ranks[k]);
    check_allreduce(&g, cpu, FL_ALLREDUCE_AUTO, 65537, FL_REDUCE_SUM);
    coll_case_sizes_check(&g);
    group_destroy(&g);
  }
}

static void test_algo_names(void **state) {
  (void)state;
  for (int a = FL_ALLREDUCE_AUTO; a < FL_ALLREDUCE_ALGO_COUNT; a++) {
    fl_allreduce_algo back;
    assert_ok(fl_allreduce_algo_parse(fl_allreduce_algo_name((fl_allreduce_algo)a), &back));
    assert_int_equal(back, a);
  }
  fl_allreduce_algo x;
  assert_fails_with(fl_allreduce_algo_parse("bitonic", &x), FL_EINVAL, "bitonic");
  assert_string_equal(fl_allreduce_algo_name(FL_ALLREDUCE_HALVING_DOUBLING), "halving-doubling");
}

/* ---- the cost model and the calibration ------------------------------------------------- */

/* Fixed parameters: a one-host link of 5 us and 2 GB/s, single copy at 4 GB/s from 128 KiB,
 * another host 30 us away at 1.1 GB/s, sums at 8 GB/s. */
static comm_link fixed_link(double alpha, double bytes_per_s, double ring_bytes_per_s) {
  comm_link l = {.alpha = alpha};
  for (int i = 0; i < COMM_COST_SIZES; i++) l.beta[i] = 1 / bytes_per_s, l.beta_ring[i] = 1 / ring_bytes_per_s;
  return l;
}

static comm_cost_model fixed_model(int size, int nhosts, int max_local, bool single_copy) {
  comm_cost_model m;
  comm_cost_model_init(&m, size);
  m.params.intra = fixed_link(5e-6, 2e9, single_copy ? 4e9 : 2e9);
  m.params.inter = fixed_link(30e-6, 1.1e9, 1.1e9);
  m.params.gamma[0] = 1 / 8e9, m.params.gamma[1] = 1 / 4e9;
  m.params.copy_min = single_copy ? 128u << 10 : 0;
  m.params.copy_max = UINT64_MAX;
  m.shape = (comm_cost_shape){size, nhosts, max_local};
  return m;
}

static void test_cost_model(void **state) {
  (void)state;
  /* 8 ranks, one host, single copy: the ring (bandwidth-optimal, its steps by one copy) wins
   * 64 MiB; 8 B goes to the fewest latencies, the butterfly's log2 8 = 3. */
  comm_cost_model m = fixed_model(8, 1, 8, true);
  assert_int_equal(comm_cost_best(&m, 64u << 20), FL_ALLREDUCE_RING);
  assert_int_equal(comm_cost_best(&m, 8), FL_ALLREDUCE_BUTTERFLY);
  double ring = comm_cost_predict(&m, FL_ALLREDUCE_RING, 8);
  double fly = comm_cost_predict(&m, FL_ALLREDUCE_BUTTERFLY, 8);
  assert_true(fly > 0 && fly * 4 < ring); /* 3 latencies against 14 */
  /* Without single copy, 6 ranks (not a power of two): halving-doubling's fold costs two whole
   * vectors, so the ring wins large messages; a log-step algorithm small ones. */
  m = fixed_model(6, 1, 6, false);
  assert_int_equal(comm_cost_best(&m, 64u << 20), FL_ALLREDUCE_RING);
  fl_allreduce_algo small = comm_cost_best(&m, 8);
  assert_true(small == FL_ALLREDUCE_BUTTERFLY || small == FL_ALLREDUCE_HALVING_DOUBLING ||
              small == FL_ALLREDUCE_TREE || small == FL_ALLREDUCE_DOUBLE_TREE);
  /* The naive exchange of whole vectors loses large messages by its (p-1) n bytes. */
  assert_true(comm_cost_predict(&m, FL_ALLREDUCE_NAIVE, 64u << 20) >
              2 * comm_cost_predict(&m, FL_ALLREDUCE_RING, 64u << 20));
  /* Predictions grow with the size; nothing to move costs nothing, and one rank nothing. */
  for (int a = FL_ALLREDUCE_RING; a < FL_ALLREDUCE_HIERARCHICAL; a++) {
    double t1 = comm_cost_predict(&m, (fl_allreduce_algo)a, 1u << 20);
    assert_true(t1 > 0 && comm_cost_predict(&m, (fl_allreduce_algo)a, 4u << 20) > t1);
    assert_true(comm_cost_predict(&m, (fl_allreduce_algo)a, 0) == 0);
  }
  /* beta by size: the measured figure at each size, log-linear between, flat outside. */
  double b[COMM_COST_SIZES];
  for (int i = 0; i < COMM_COST_SIZES; i++) b[i] = (i + 1) * 1e-9;
  assert_true(comm_link_beta(b, 8) == b[0]);
  assert_true(comm_link_beta(b, comm_cost_sizes[1]) == b[1]);
  assert_true(comm_link_beta(b, 1e12) == b[COMM_COST_SIZES - 1]);
  double mid = comm_link_beta(b, sqrt(comm_cost_sizes[0] * comm_cost_sizes[1]));
  assert_true(fabs(mid - 0.5 * (b[0] + b[1])) < 1e-15);
  /* gamma the same way between the in-cache and the past-the-caches size; a sum of a large
   * vector costs the memory's figure, so the butterfly's separate pass over 64 MiB costs
   * more than with the in-cache figure. */
  assert_true(comm_cost_gamma(&m.params, 1024) == m.params.gamma[0]);
  assert_true(comm_cost_gamma(&m.params, 1e12) == m.params.gamma[1]);
  double gmid = comm_cost_gamma(&m.params, sqrt(comm_gamma_sizes[0] * comm_gamma_sizes[1]));
  assert_true(fabs(gmid - 0.5 * (m.params.gamma[0] + m.params.gamma[1])) < 1e-15);
  double fly_mem = comm_cost_predict(&m, FL_ALLREDUCE_BUTTERFLY, 64u << 20);
  m.params.gamma[1] = m.params.gamma[0];
  assert_true(comm_cost_predict(&m, FL_ALLREDUCE_BUTTERFLY, 64u << 20) < fly_mem);
  comm_cost_model one = fixed_model(1, 1, 1, false);
  assert_true(comm_cost_predict(&one, FL_ALLREDUCE_RING, 1u << 20) == 0);
  /* AUTO, hierarchical on one host, and numbers outside the enum have no prediction. */
  assert_true(comm_cost_predict(&m, FL_ALLREDUCE_AUTO, 64) < 0);
  assert_false(comm_cost_applies(&m, FL_ALLREDUCE_HIERARCHICAL));
  assert_true(comm_cost_predict(&m, FL_ALLREDUCE_HIERARCHICAL, 64) < 0);
  assert_true(comm_cost_predict(&m, (fl_allreduce_algo)FL_ALLREDUCE_ALGO_COUNT, 64) < 0);
  assert_true(comm_cost_predict(&m, (fl_allreduce_algo)-1, 64) < 0);
  /* Two hosts of 4 ranks behind a slow link (1 Gb/s): reducing within the hosts first sends
   * each byte across once instead of a flat algorithm's 1.75 times, so hierarchical wins
   * large messages; it never applies to hosts of one rank each. */
  m = fixed_model(8, 2, 4, false);
  m.params.inter = fixed_link(30e-6, 0.125e9, 0.125e9);
  assert_true(comm_cost_applies(&m, FL_ALLREDUCE_HIERARCHICAL));
  assert_int_equal(comm_cost_best(&m, 64u << 20), FL_ALLREDUCE_HIERARCHICAL);
  m = fixed_model(4, 4, 1, false);
  assert_false(comm_cost_applies(&m, FL_ALLREDUCE_HIERARCHICAL));
  assert_int_not_equal(comm_cost_best(&m, 64u << 20), FL_ALLREDUCE_HIERARCHICAL);
  /* comm_pick_algo: a forced algorithm stays forced; AUTO is the model's choice. */
  group g;
  group_create(&g, 2);
  for (size_t b = 8; b <= (64u << 20); b *= 8)
    assert_int_equal(comm_pick_algo(g.comms[0], b), comm_cost_best(comm_cost_of(g.comms[0]), b));
  /* AUTO keeps its recent picks by size: asked again (many sizes, so that entries of the
   * cache are replaced) and after a new model, it answers what the model it holds says. */
  comm_cost_model slow_links = fixed_model(2, 1, 2, false), fast_links = fixed_model(2, 1, 2, true);
  slow_links.params.intra = fixed_link(1e-3, 1e12, 1e12); /* latency all that counts */
  slow_links.params.gamma[0] = slow_links.params.gamma[1] = 1e-15;
  const comm_cost_model *models[2] = {&slow_links, &fast_links};
  int differ = 0;
  for (int k = 0; k < 4; k++) {
    comm_set_cost_model(g.comms[0], models[k % 2]);
    for (int rep = 0; rep < 2; rep++)
      for (size_t b = 0; b <= (64u << 20); b = b * 3 + 1) {
        fl_allreduce_algo want = comm_cost_best(models[k % 2], b);
        assert_int_equal(comm_pick_algo(g.comms[0], b), want);
        differ += want != comm_cost_best(models[(k + 1) % 2], b);
      }
  }
  assert_true(differ > 0);
  /* One size the two models disagree on, asked right after the other model answered it. */
  size_t big = 64u << 20;
  assert_int_not_equal(comm_cost_best(&slow_links, big), comm_cost_best(&fast_links, big));
  for (int k = 0; k < 4; k++) {
    comm_set_cost_model(g.comms[0], models[k % 2]);
    assert_int_equal(comm_pick_algo(g.comms[0], big), comm_cost_best(models[k % 2], big));
  }
  assert_ok(fl_comm_set_allreduce_algo(g.comms[0], FL_ALLREDUCE_NAIVE));
  assert_int_equal(comm_pick_algo(g.comms[0], 8), FL_ALLREDUCE_NAIVE);
  assert_true(comm_predict_seconds(g.comms[0], FL_ALLREDUCE_AUTO, 1u << 20) ==
              comm_predict_seconds(g.comms[0], FL_ALLREDUCE_NAIVE, 1u << 20));
  group_destroy(&g);
}

/* Every rank holds the same figures, bit for bit, measured ones that make sense. */
static void expect_same_models(group *g, bool calibrated) {
  const comm_cost_model *m0 = comm_cost_of(g->comms[0]);
  assert_true(m0->params.calibrated == calibrated);
  for (int r = 1; r < g->size; r++) {
    const comm_cost_model *m = comm_cost_of(g->comms[r]);
    assert_true(m->params.calibrated == m0->params.calibrated);
    assert_memory_equal(&m->params.intra, &m0->params.intra, sizeof m->params.intra);
    assert_memory_equal(&m->params.inter, &m0->params.inter, sizeof m->params.inter);
    assert_memory_equal(&m->params.gamma, &m0->params.gamma, sizeof m->params.gamma);
    assert_int_equal(m->params.copy_min, m0->params.copy_min);
    assert_true(m->params.copy_max == m0->params.copy_max);
    assert_memory_equal(&m->shape, &m0->shape, sizeof m->shape);
  }
  const comm_link *links[2] = {&m0->params.intra, &m0->params.inter};
  for (int i = 0; i < 2; i++) {
    assert_true(links[i]->alpha > 0 && links[i]->alpha < 10);
    for (int k = 0; k < COMM_COST_SIZES; k++) {
      assert_true(links[i]->beta[k] > 0 && links[i]->beta[k] < 1e-3);
      assert_true(links[i]->beta_ring[k] > 0 && links[i]->beta_ring[k] < 1e-3);
    }
  }
  for (int k = 0; k < COMM_GAMMA_SIZES; k++) assert_true(m0->params.gamma[k] > 0 && m0->params.gamma[k] < 1e-3);
  assert_int_equal(m0->shape.size, g->size);
}

/* Ranks as threads on different sizes (odd ones leave a rank without a same-host partner);
 * a split's sub-communicators calibrate too; FLINT_COMM_CALIBRATE=0 keeps the defaults. */
static fl_status split_halves(rank_job *job) {
  group *subs = job->arg;
  return fl_comm_split(job->comm, job->rank % 2, job->rank, &subs[job->rank % 2].comms[job->rank / 2]);
}

static void test_calibration_agrees(void **state) {
  (void)state;
  static const int ranks[] = {2, 3, 5};
  for (size_t k = 0; k < sizeof ranks / sizeof *ranks; k++) {
    group g;
    group_create(&g, ranks[k]);
    expect_same_models(&g, true);
    const comm_cost_model *m = comm_cost_of(g.comms[0]);
    assert_int_equal(m->shape.nhosts, 1);
    assert_int_equal(m->shape.max_local, ranks[k]);
    /* Threads of one process pass the single-copy probe: a range of ring steps moves by
     * single copy (over shared memory 512 KiB to 4 MiB, over TCP from 128 KiB). */
    assert_true(m->params.copy_min > 0 && m->params.copy_max >= m->params.copy_min);
    for (int r = 0; r < ranks[k]; r++)
      assert_int_equal(comm_pick_algo(g.comms[r], 1000), comm_pick_algo(g.comms[0], 1000));
    check_allreduce(&g, cpu, FL_ALLREDUCE_AUTO, 1001, FL_REDUCE_SUM);
    if (ranks[k] == 5) {
      group subs[2];
      memset(subs, 0, sizeof subs);
      subs[0].size = 3, subs[1].size = 2;
      rank_job jobs[MAX_RANKS];
      run_ranks(5, g.comms, split_halves, subs, jobs);
      expect_all_ok(5, jobs);
      for (int c = 0; c < 2; c++) {
        expect_same_models(&subs[c], true);
        group_destroy(&subs[c]);
      }
    }
    group_destroy(&g);
  }
  setenv("FLINT_COMM_CALIBRATE", "0", 1);
  group g;
  group_create(&g, 3);
  unsetenv("FLINT_COMM_CALIBRATE");
  expect_same_models(&g, false);
  comm_cost_params def;
  comm_cost_defaults(&def);
  const comm_cost_params *q = &comm_cost_of(g.comms[1])->params;
  assert_memory_equal(&q->intra, &def.intra, sizeof def.intra);
  assert_memory_equal(&q->inter, &def.inter, sizeof def.inter);
  assert_memory_equal(q->gamma, def.gamma, sizeof def.gamma);
  assert_true(q->copy_min == def.copy_min);
  group_destroy(&g);
}

/* Two hosts of two ranks (the mesh's topology set by hand on every rank, then calibrated
 * again): the other-host pair is measured by the hosts' first ranks, and every rank still
 * ends with the same figures and a shape where hierarchical applies. */
static fl_status recalibrate_two_hosts(rank_job *job) {
  comm_host *h = job->comm->impl;
  for (int r = 0; r < h->size; r++) h->host_of[r] = r / 2;
  h->nhosts = 2;
  comm_cost_model m;
  fl_status st = comm_host_calibrate(h, &m);
  if (st == FL_OK) comm_set_cost_model(job->comm, &m);
  return st;
}

static void test_calibration_two_hosts(void **state) {
  (void)state;
  group g;
  group_create(&g, 4);
  rank_job jobs[MAX_RANKS];
  run_ranks(4, g.comms, recalibrate_two_hosts, NULL, jobs);
  expect_all_ok(4, jobs);
  expect_same_models(&g, true);
  const comm_cost_model *m = comm_cost_of(g.comms[0]);
  assert_int_equal(m->shape.nhosts, 2);
  assert_int_equal(m->shape.max_local, 2);
  assert_true(comm_cost_applies(m, FL_ALLREDUCE_HIERARCHICAL));
  check_allreduce(&g, cpu, FL_ALLREDUCE_AUTO, 4099, FL_REDUCE_SUM);
  group_destroy(&g);
}

/* A rank with FLINT_COMM_CALIBRATE=0 among ranks with 1 (rank 1 a forked child with its own
 * environment): nobody waits on an exchange that rank never starts; both keep the defaults
 * and the communicator works. */
static void test_calibration_one_rank_off(void **state) {
  (void)state;
  fl_comm_endpoint *eps[2];
  char addrs[2][96];
  const char *ptrs[2] = {addrs[0], addrs[1]};
  for (int r = 0; r < 2; r++) {
    must_ok(fl_comm_listen("127.0.0.1", &eps[r]));
    snprintf(addrs[r], sizeof addrs[r], "%s", fl_comm_endpoint_address(eps[r]));
  }
  fflush(NULL);
  pid_t child = fork();
  assert_true(child >= 0);
  int me = child == 0 ? 1 : 0;
  if (me == 1) setenv("FLINT_COMM_CALIBRATE", "0", 1);
  fl_comm_endpoint_destroy(eps[1 - me]);
  fl_comm *c = NULL;
  fl_status st = fl_comm_host_create(eps[me], me, 2, ptrs, 20000, &c);
  bool calibrated = st == FL_OK && comm_cost_of(c)->params.calibrated;
  long bad = -2;
  if (st == FL_OK) {
    fl_tensor *t = tensor_on(cpu, 1000);
    fill(t, me, 5);
    st = fl_comm_allreduce(c, t, FL_REDUCE_SUM);
    ar_case want = {.n = 1000, .op = FL_REDUCE_SUM, .seed = 5, .size = 2};
    if (st == FL_OK) bad = first_mismatch(t, want_allreduce, &want);
    fl_tensor_destroy(t);
  }
  fl_comm_destroy(c);
  if (child == 0) _exit(st == FL_OK && bad == -1 && !calibrated ? 0 : 1);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  if (st != FL_OK) fprintf(stderr, "rank 0: %s\n", fl_last_error());
  assert_int_equal(st, FL_OK);
  assert_int_equal(bad, -1);
  assert_false(calibrated);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- broadcast, allgather, reduce-scatter, send/recv, barrier ---------------------------- */

typedef struct coll_case {
  fl_device *dev;
  size_t n;
  int root;
  uint32_t seed;
  int size;
  int rank; /* for the want_* callbacks */
  long bad[MAX_RANKS];
} coll_case;

static float want_root(size_t i, void *ctx) {
  coll_case *c = ctx;
  return value(c->root, i, c->seed);
}

static fl_status broadcast_rank(rank_job *job) {
  coll_case *c = job->arg;
  fl_tensor *t = tensor_on(c->dev, c->n);
  if (job->rank == c->root) fill(t, job->rank, c->seed);
  else fill(t, job->rank, c->seed + 1); /* garbage that must be overwritten */
  fl_status st = fl_comm_broadcast(job->comm, t, c->root);
  c->bad[job->rank] = st == FL_OK ? first_mismatch(t, want_root, c) : -1;
  fl_tensor_destroy(t);
  return st;
}

static float want_gathered(size_t i, void *ctx) {
  coll_case *c = ctx;
  return value((int)(i / c->n), i % c->n, c->seed);
}

static fl_status allgather_rank(rank_job *job) {
  coll_case *c = job->arg;
  fl_tensor *in = tensor_on(c->dev, c->n), *out = tensor_on(c->dev, c->n * (size_t)job->size);
  fill(in, job->rank, c->seed);
  fl_status st = fl_comm_allgather(job->comm, in, out);
  c->bad[job->rank] = st == FL_OK && c->n ? first_mismatch(out, want_gathered, c) : -1;
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return st;
}

typedef struct rs_ctx {
  coll_case *c;
  int rank;
} rs_ctx;

static float want_block(size_t i, void *ctx) {
  rs_ctx *x = ctx;
  return sum_value(x->c->size, comm_block_offset(x->c->n, x->c->size, x->rank) + i, x->c->seed);
}

static fl_status reduce_scatter_rank(rank_job *job) {
  coll_case *c = job->arg;
  size_t cnt = comm_block_count(c->n, job->size, job->rank);
  fl_tensor *in = tensor_on(c->dev, c->n), *out = tensor_on(c->dev, cnt);
  fill(in, job->rank, c->seed);
  fl_status st = fl_comm_reduce_scatter(job->comm, in, out, FL_REDUCE_SUM);
  rs_ctx x = {c, job->rank};
  c->bad[job->rank] = st == FL_OK ? first_mismatch(out, want_block, &x) : -1;
  /* `in` is the caller's and stays as it was. */
  coll_case mine = *c;
  mine.root = job->rank;
  if (st == FL_OK && c->bad[job->rank] < 0) c->bad[job->rank] = first_mismatch(in, want_root, &mine);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return st;
}

static void run_coll(group *g, rank_fn fn, coll_case *c, const char *what) {
  rank_job jobs[MAX_RANKS];
  c->size = g->size;
  for (int r = 0; r < MAX_RANKS; r++) c->bad[r] = -1;
  run_ranks(g->size, g->comms, fn, c, jobs);
  expect_all_ok(g->size, jobs);
  for (int r = 0; r < g->size; r++) {
    if (c->bad[r] >= 0)
      fprintf(stderr, "%s, %d ranks, %zu floats, root %d: rank %d differs at %ld\n", what, g->size,
              c->n, c->root, r, c->bad[r]);
    assert_int_equal(c->bad[r], -1);
  }
}

static void check_collectives(group *g, fl_device *dev, const size_t *sizes, size_t nsizes) {
  for (size_t s = 0; s < nsizes; s++) {
    coll_case c = {.dev = dev, .n = sizes[s], .seed = (uint32_t)sizes[s] * 7 + 3};
    for (int root = 0; root < g->size; root++) {
      c.root = root;
      run_coll(g, broadcast_rank, &c, "broadcast");
    }
    run_coll(g, allgather_rank, &c, "allgather");
    run_coll(g, reduce_scatter_rank, &c, "reduce_scatter");
  }
}

static void coll_case_sizes_check(group *g) {
  static const size_t sizes[] = {1, 5, 17, 4099};
  check_collectives(g, cpu, sizes, sizeof sizes / sizeof *sizes);
}

static void test_collectives(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 2, 3, 7, 1000, 65537, 1u << 20};
  for (int p = 1; p <= 5; p++) {
    group g;
    group_create(&g, p);
    check_collectives(&g, cpu, sizes, sizeof sizes / sizeof *sizes);
    group_destroy(&g);
  }
}

/* Rank 2k sends to 2k+1, which answers with its own message; an odd last rank sends to 0
 * after the pairs are done (rank 0 receives it last). */
static float want_peer(size_t i, void *ctx) {
  coll_case *c = ctx;
  return value(c->root, i, c->seed);
}

static fl_status send_recv_rank(rank_job *job) {
  coll_case *mine = job->arg;
  coll_case c = *mine;
  int r = job->rank, p = job->size;
  fl_tensor *t = tensor_on(c.dev, c.n);
  fl_status st = FL_OK;
  long bad = -1;
  if (r % 2 == 0 && r + 1 < p) {
    fill(t, r, c.seed);
    st = fl_comm_send(job->comm, t, r + 1);
    if (st == FL_OK) st = fl_comm_recv(job->comm, t, r + 1);
    c.root = r + 1;
    if (st == FL_OK) bad = first_mismatch(t, want_peer, &c);
  } else if (r % 2 == 1) {
    st = fl_comm_recv(job->comm, t, r - 1);
    c.root = r - 1;
    if (st == FL_OK) bad = first_mismatch(t, want_peer, &c);
    fill(t, r, c.seed);
    if (st == FL_OK) st = fl_comm_send(job->comm, t, r - 1);
  }
  if (st == FL_OK && p % 2 == 1 && p > 1 && bad < 0) {
    if (r == p - 1) {
      fill(t, r, c.seed);
      st = fl_comm_send(job->comm, t, 0);
    } else if (r == 0) {
      st = fl_comm_recv(job->comm, t, p - 1);
      c.root = p - 1;
      if (st == FL_OK) bad = first_mismatch(t, want_peer, &c);
    }
  }
  mine->bad[r] = bad;
  fl_tensor_destroy(t);
  return st;
}

static atomic_int barrier_count;

static fl_status barrier_rank(rank_job *job) {
  for (int round = 1; round <= 5; round++) {
    /* Stagger the ranks so that a barrier that lets one through early is seen. */
    if (job->rank == round % job->size) usleep(2000);
    atomic_fetch_add(&barrier_count, 1);
    fl_status st = fl_comm_barrier(job->comm);
    if (st != FL_OK) return st;
    if (atomic_load(&barrier_count) < round * job->size)
      return fl_set_error(FL_EINTERNAL, "rank %d left barrier %d early", job->rank, round);
    st = fl_comm_barrier(job->comm); /* no rank starts the next round before all checked */
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

static void test_send_recv_barrier(void **state) {
  (void)state;
  for (int p = 1; p <= 5; p++) {
    group g;
    group_create(&g, p);
    static const size_t sizes[] = {1, 7, 65537, 1u << 20};
    for (size_t s = 0; s < 4; s++) {
      coll_case c = {.dev = cpu, .n = sizes[s], .seed = 99};
      run_coll(&g, send_recv_rank, &c, "send/recv");
    }
    atomic_store(&barrier_count, 0);
    rank_job jobs[MAX_RANKS];
    run_ranks(p, g.comms, barrier_rank, NULL, jobs);
    expect_all_ok(p, jobs);
    group_destroy(&g);
  }
}

/* ---- split --------------------------------------------------------------------------------- */

typedef struct split_case {
  fl_comm *sub[MAX_RANKS];
  long bad[MAX_RANKS];
} split_case;

static fl_status split_rank(rank_job *job) {
  split_case *c = job->arg;
  int color = job->rank == 4 ? -1 : job->rank % 2; /* rank 4 stays out */
  fl_comm *sub = NULL;
  fl_status st = fl_comm_split(job->comm, color, -job->rank, &sub);
  c->sub[job->rank] = sub;
  c->bad[job->rank] = -1;
  if (st != FL_OK || !sub) return st;
  /* Collectives within the sub-group, and on the parent after it. */
  fl_tensor *t = tensor_on(cpu, 1001);
  fill(t, job->rank, 5);
  st = fl_comm_allreduce(sub, t, FL_REDUCE_SUM);
  int parity = job->rank % 2;
  if (st == FL_OK) {
    /* ranks 0,2 (4 is out) and 1,3 */
    float *buf = malloc(1001 * sizeof(float));
    assert_ok(fl_tensor_read(t, buf, 1001));
    for (size_t i = 0; i < 1001 && c->bad[job->rank] < 0; i++) {
      float want = value(parity, i, 5) + value(parity + 2, i, 5);
      if (buf[i] != want) c->bad[job->rank] = (long)i;
    }
    free(buf);
  }
  if (st == FL_OK) st = fl_comm_barrier(sub);
  fl_tensor_destroy(t);
  return st;
}

static fl_status parent_after_split(rank_job *job) { return fl_comm_barrier(job->comm); }

static void test_split(void **state) {
  (void)state;
  group g;
  group_create(&g, 5);
  split_case c;
  memset(&c, 0, sizeof c);
  rank_job jobs[MAX_RANKS];
  run_ranks(5, g.comms, split_rank, &c, jobs);
  expect_all_ok(5, jobs);
  assert_null(c.sub[4]);
  for (int r = 0; r < 4; r++) {
    assert_non_null(c.sub[r]);
    assert_int_equal(fl_comm_size(c.sub[r]), 2);
    /* key = -rank: the higher parent rank comes first */
    assert_int_equal(fl_comm_rank(c.sub[r]), r < 2 ? 1 : 0);
    assert_int_equal(c.bad[r], -1);
  }
  run_ranks(5, g.comms, parent_after_split, NULL, jobs);
  expect_all_ok(5, jobs);
  for (int r = 0; r < 4; r++) fl_comm_destroy(c.sub[r]);
  group_destroy(&g);
}

/* ---- the staging path: a device whose memory is not the host's (cuda without a GPU) ----- */

static device_ops staged_ops;
static fl_device staged_dev;
static atomic_int staged_host_allocs, staged_copies, staged_syncs;

static fl_status staged_host_alloc(fl_device *dev, size_t bytes, void **out) {
  atomic_fetch_add(&staged_host_allocs, 1);
  return cpu->ops->host_alloc(cpu, bytes, out);
}
static fl_status staged_to_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  atomic_fetch_add(&staged_copies, 1);
  return cpu->ops->to_host(cpu, dst, src, bytes);
}
static fl_status staged_from_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  atomic_fetch_add(&staged_copies, 1);
  return cpu->ops->from_host(cpu, dst, src, bytes);
}

static fl_status staged_synchronize(fl_device *dev) {
  atomic_fetch_add(&staged_syncs, 1);
  return cpu->ops->synchronize(cpu);
}

static void staged_init(void) {
  staged_ops = *cpu->ops;
  staged_ops.name = "staged";
  staged_ops.host_alloc = staged_host_alloc;
  staged_ops.to_host = staged_to_host;
  staged_ops.from_host = staged_from_host;
  staged_ops.synchronize = staged_synchronize;
  staged_dev = *cpu;
  staged_dev.ops = &staged_ops;
  staged_dev.kind = FL_DEVICE_CUDA;
  snprintf(staged_dev.name, sizeof staged_dev.name, "staged (cuda stand-in)");
}

static void test_staged_device(void **state) {
  (void)state;
  staged_init();
  for (int p = 2; p <= 3; p++) {
    group g;
    group_create(&g, p);
    atomic_store(&staged_copies, 0);
    for (int a = FL_ALLREDUCE_AUTO; a <= FL_ALLREDUCE_TREE; a++)
      check_allreduce(&g, &staged_dev, (fl_allreduce_algo)a, 65537, FL_REDUCE_SUM);
    assert_true(atomic_load(&staged_copies) >= 2 * 4 * p); /* in and out, every rank */
    int allocs = atomic_load(&staged_host_allocs);
    check_allreduce(&g, &staged_dev, FL_ALLREDUCE_RING, 1000, FL_REDUCE_AVG);
    assert_int_equal(atomic_load(&staged_host_allocs), allocs); /* pinned buffers are kept */
    static const size_t sizes[] = {1, 7, 65537};
    check_collectives(&g, &staged_dev, sizes, 3);
    group_destroy(&g);
  }
}

/* ---- the communication thread (gpu/comm/worker.c) -------------------------------------- */

/* Bucket sizes in floats: empty, one, odd, large; 130 of them fill the queue twice over. */
#define WORKER_BUCKETS 130
static size_t worker_bucket_len(int i) {
  static const size_t sizes[] = {0, 1, 7, 1000, 4099, 1u << 18, 3, 65537};
  return sizes[i % 8];
}

/* Seeded floats of mixed signs and magnitudes: their sums round differently in any other
 * order. */
static void fill_random(float *x, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + (s & 1023));
  }
}

typedef struct worker_case {
  fl_device *dev;
  size_t total;
  fl_allreduce_algo algo;
} worker_case;

/* Reduces the buckets of t from its end down, as backward reports them: through the worker
 * when w is set, else on this thread. */
static fl_status reduce_buckets(fl_comm *comm, comm_worker *w, fl_tensor *t) {
  size_t hi = fl_tensor_numel(t);
  for (int i = 0; i < WORKER_BUCKETS; i++) {
    size_t n = worker_bucket_len(i);
    fl_tensor view;
    int64_t shape[1] = {(int64_t)n};
    fl_status st = tensor_view(t, hi - n, 1, shape, &view);
    if (st == FL_OK && w) st = comm_worker_post(w, &view, FL_REDUCE_AVG);
    if (st == FL_OK && !w && n) st = fl_comm_allreduce(comm, &view, FL_REDUCE_AVG);
    if (st != FL_OK) return st;
    hi -= n;
  }
  return w ? comm_worker_wait(w) : FL_OK;
}

static fl_status worker_compare_rank(rank_job *job) {
  const worker_case *c = job->arg;
  fl_tensor *via_worker = tensor_on(c->dev, c->total), *direct = tensor_on(c->dev, c->total);
  comm_worker *w = NULL;
  fill_random(via_worker->data, c->total, (uint64_t)job->rank + 1);
  memcpy(direct->data, via_worker->data, c->total * sizeof(float));
  fl_status st = fl_comm_set_allreduce_algo(job->comm, c->algo);
  if (st == FL_OK) st = reduce_buckets(job->comm, NULL, direct);
  if (st == FL_OK) st = comm_worker_start(job->comm, &w);
  if (st == FL_OK) st = reduce_buckets(job->comm, w, via_worker);
  uint64_t nonempty = 0;
  for (int i = 0; i < WORKER_BUCKETS; i++) nonempty += worker_bucket_len(i) > 0;
  if (st == FL_OK && comm_worker_reduced(w) != nonempty)
    st = fl_set_error(FL_EINTERNAL, "the worker reduced %llu buckets, not %llu",
                      (unsigned long long)comm_worker_reduced(w), (unsigned long long)nonempty);
  for (size_t i = 0; st == FL_OK && i < c->total; i++)
    if (memcmp(&via_worker->data[i], &direct->data[i], sizeof(float)) != 0)
      st = fl_set_error(FL_EINTERNAL, "element %zu: %.9g through the worker, %.9g directly", i,
                        (double)via_worker->data[i], (double)direct->data[i]);
  /* After the wait the communicator is this thread's again. */
  if (st == FL_OK) st = fl_comm_barrier(job->comm);
  comm_worker_stop(w);
  fl_tensor_destroy(direct);
  fl_tensor_destroy(via_worker);
  return st;
}

static void test_worker_equals_synchronous(void **state) {
  (void)state;
  staged_init();
  size_t total = 0;
  for (int i = 0; i < WORKER_BUCKETS; i++) total += worker_bucket_len(i);
  static const fl_allreduce_algo algos[] = {FL_ALLREDUCE_AUTO, FL_ALLREDUCE_RING, FL_ALLREDUCE_TREE};
  for (int p = 1; p <= 4; p++) {
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
      fl_device *dev = a == 0 ? &staged_dev : cpu;
      group g;
      group_create(&g, p);
      worker_case c = {.dev = dev, .total = total, .algo = algos[a]};
      rank_job jobs[MAX_RANKS];
      int syncs = atomic_load(&staged_syncs);
      run_ranks(p, g.comms, worker_compare_rank, &c, jobs);
      fprintf(stderr, "  worker: %d ranks, %s on %s\n", p, fl_allreduce_algo_name(algos[a]), dev->name);
      expect_all_ok(p, jobs);
      /* Every post waited for the device (the cuda rule). */
      if (dev == &staged_dev) assert_true(atomic_load(&staged_syncs) - syncs >= p * WORKER_BUCKETS);
      group_destroy(&g);
    }
  }
}

/* Rank 1 reduces the first bucket with rank 0, then leaves; rank 0 has posted three. */
static fl_status worker_leave_after_one(rank_job *job) {
  fl_tensor *t = tensor_on(cpu, 3u << 14);
  fl_tensor bucket[3];
  int64_t shape[1] = {1 << 14};
  comm_worker *w = NULL;
  fl_status st = FL_OK;
  for (int i = 0; i < 3 && st == FL_OK; i++) st = tensor_view(t, (size_t)i << 14, 1, shape, &bucket[i]);
  if (st == FL_OK) st = comm_worker_start(job->comm, &w);
  if (st == FL_OK && job->rank == 1) {
    st = comm_worker_post(w, &bucket[0], FL_REDUCE_AVG);
    if (st == FL_OK) st = comm_worker_wait(w);
    comm_worker_stop(w);
    w = NULL;
    fl_comm_destroy(job->comm); /* leaves: its sockets close */
    job->comm = NULL;
  } else if (st == FL_OK) {
    /* A post may see the failure already; the wait must report it either way. */
    for (int i = 0; i < 3 && st == FL_OK; i++) st = comm_worker_post(w, &bucket[i], FL_REDUCE_AVG);
    fl_status waited = comm_worker_wait(w);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fl_last_error());
    fl_status again = comm_worker_post(w, &bucket[0], FL_REDUCE_AVG); /* kept: fails at once */
    if (waited == FL_OK)
      st = fl_set_error(FL_EINTERNAL, "the wait succeeded although rank 1 left");
    else if (again != waited || !strstr(fl_last_error(), "communication thread"))
      st = fl_set_error(FL_EINTERNAL, "not kept: %s then %s (%s)", fl_status_name(waited), fl_status_name(again),
                        fl_last_error());
    else
      st = fl_set_error(waited, "%s", msg);
  }
  comm_worker_stop(w);
  fl_tensor_destroy(t);
  return st;
}

static void test_worker_peer_leaves(void **state) {
  (void)state;
  group g;
  group_create(&g, 2);
  rank_job jobs[MAX_RANKS];
  uint64_t t0 = common_now_ns();
  run_ranks(2, g.comms, worker_leave_after_one, NULL, jobs);
  double seconds = (double)(common_now_ns() - t0) / 1e9;
  g.comms[1] = NULL; /* destroyed by its rank */
  group_destroy(&g); /* before any assertion, so that a failure leaks nothing */
  if (jobs[1].status != FL_OK) fprintf(stderr, "rank 1: %s\n", jobs[1].msg);
  assert_int_equal(jobs[1].status, FL_OK);
  fprintf(stderr, "  rank 0: %s in %.3f s: %s\n", fl_status_name(jobs[0].status), seconds, jobs[0].msg);
  assert_true(jobs[0].status == FL_EPEER || jobs[0].status == FL_ENET);
  assert_non_null(strstr(jobs[0].msg, "communication thread"));
  assert_non_null(strstr(jobs[0].msg, "fl_comm_allreduce"));
  assert_non_null(strstr(jobs[0].msg, "rank 1"));
  /* No waiting for a timeout (FLINT_COMM_TIMEOUT_MS is 300 s): the closed sockets tell. The
   * status above (a timeout would be FL_ETIMEDOUT) is the check; the bound only catches a
   * hang, so that a busy host cannot trip it. */
  assert_true(seconds < 60.0);
}

static void test_worker_stop(void **state) {
  (void)state;
  comm_worker_stop(NULL);
  group g;
  group_create(&g, 1);
  comm_worker *w = NULL;
  assert_ok(comm_worker_start(g.comms[0], &w));
  assert_ok(comm_worker_wait(w)); /* nothing posted */
  assert_int_equal(comm_worker_reduced(w), 0);
  comm_worker_stop(w);
  group_destroy(&g);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void test_bad_arguments(void **state) {
  (void)state;
  group g;
  group_create(&g, 1);
  fl_comm *c = g.comms[0];
  fl_tensor *t = tensor_on(cpu, 8), *t3 = tensor_on(cpu, 3);
  assert_fails_with(fl_comm_allreduce(NULL, t, FL_REDUCE_SUM), FL_EINVAL, "comm is NULL");
  assert_fails_with(fl_comm_allreduce(c, NULL, FL_REDUCE_SUM), FL_EINVAL, "tensor is NULL");
  assert_fails_with(fl_comm_allreduce(c, t, (fl_reduce_op)7), FL_EINVAL, "reduce op");
  assert_fails_with(fl_comm_broadcast(c, t, 1), FL_EINVAL, "root 1");
  assert_fails_with(fl_comm_broadcast(c, t, -1), FL_EINVAL, "root -1");
  assert_fails_with(fl_comm_allgather(c, t, t3), FL_EINVAL, "out has 3 elements");
  assert_fails_with(fl_comm_reduce_scatter(c, t, t3, FL_REDUCE_SUM), FL_EINVAL, "out has 3");
  assert_fails_with(fl_comm_send(c, t, 0), FL_EINVAL, "this rank itself");
  assert_fails_with(fl_comm_recv(c, t, 3), FL_EINVAL, "peer 3");
  assert_fails_with(fl_comm_set_allreduce_algo(c, (fl_allreduce_algo)9), FL_EINVAL, "unknown");
  assert_fails_with(fl_comm_split(c, 0, 0, NULL), FL_EINVAL, "out is NULL");
  assert_fails_with(fl_comm_barrier(NULL), FL_EINVAL, "comm is NULL");
  /* Mismatched devices: in on the cpu, out on another device. */
  staged_ops = *cpu->ops;
  staged_dev = *cpu;
  staged_dev.ops = &staged_ops;
  snprintf(staged_dev.name, sizeof staged_dev.name, "other");
  fl_tensor *other = tensor_on(&staged_dev, 8);
  assert_fails_with(fl_comm_allgather(c, t, other), FL_EINVAL, "out on other");
  fl_tensor_destroy(other);
  /* Bad arguments leave the communicator usable. */
  assert_ok(fl_comm_allreduce(c, t, FL_REDUCE_SUM));
  assert_ok(fl_comm_barrier(c));
  /* Rank 1 of 1: the endpoint is taken (freed) on failure too; ASan sees a leak otherwise. */
  fl_comm_endpoint *ep;
  fl_comm *out;
  const char *addrs[1] = {"127.0.0.1:1"};
  assert_ok(fl_comm_listen("127.0.0.1", &ep));
  assert_fails_with(fl_comm_host_create(ep, 1, 1, addrs, 100, &out), FL_EINVAL, "rank 1");
  assert_ok(fl_comm_listen("127.0.0.1", &ep));
  const char *bad[2] = {"no-port-here", NULL};
  assert_fails_with(fl_comm_host_create(ep, 1, 2, bad, 100, &out), FL_EINVAL, "rank 1 is NULL");
  assert_ok(fl_comm_listen("127.0.0.1", &ep));
  const char *bad2[2] = {"no-port-here", "127.0.0.1:1"};
  assert_fails_with(fl_comm_host_create(ep, 1, 2, bad2, 100, &out), FL_EINVAL, "HOST:PORT");
#ifndef FLINT_HAVE_CUDA
  uint8_t id[FL_NCCL_ID_BYTES];
  assert_fails_with(fl_comm_nccl_unique_id(id), FL_EDEVICE, "without CUDA");
  assert_fails_with(fl_comm_nccl_create(cpu, 0, 1, id, &out), FL_EDEVICE, "without CUDA");
#endif
  fl_tensor_destroy(t);
  fl_tensor_destroy(t3);
  group_destroy(&g);
}

static void test_peer_never_connects(void **state) {
  (void)state;
  /* The last rank listens but never joins: the others wait for it to connect. */
  group g;
  rank_job jobs[MAX_RANKS];
  group_listen(&g, 3);
  g.timeout_ms = 300;
  g.skip[2] = true;
  group_connect(&g, jobs);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(jobs[r].status, FL_ETIMEDOUT);
    assert_non_null(strstr(jobs[r].msg, "rank 2 did not connect"));
    assert_null(g.comms[r]);
  }
  group_destroy(&g);
  /* Rank 0 never joins: its endpoint accepts in the kernel but never answers the hello. */
  group_listen(&g, 3);
  g.timeout_ms = 300;
  g.skip[0] = true;
  group_connect(&g, jobs);
  for (int r = 1; r < 3; r++) {
    assert_int_equal(jobs[r].status, FL_ETIMEDOUT);
    if (!strstr(jobs[r].msg, "rank 0")) fprintf(stderr, "rank %d: %s\n", r, jobs[r].msg);
    assert_non_null(strstr(jobs[r].msg, "rank 0"));
  }
  group_destroy(&g);
}

static fl_status leave_mid_allreduce(rank_job *job) {
  fl_tensor *t = tensor_on(cpu, 4u << 20);
  fill(t, job->rank, 1);
  fl_status st;
  if (job->rank == 2) {
    /* Sends part of its first message, then leaves. */
    comm_host *h = job->comm->impl;
    st = comm_host_send(h, 3, t->data, 4096);
    fl_comm_destroy(job->comm);
    job->comm = NULL;
  } else {
    (void)fl_comm_set_allreduce_algo(job->comm, FL_ALLREDUCE_RING);
    st = fl_comm_allreduce(job->comm, t, FL_REDUCE_SUM);
    if (st != FL_OK) {
      fl_status first = st;
      char msg[512];
      snprintf(msg, sizeof msg, "%s", fl_last_error());
      /* Sticky: every later call fails the same way, without touching the network. */
      fl_status again = fl_comm_barrier(job->comm);
      if (again != first || !strstr(fl_last_error(), "failed earlier")) {
        fl_set_error(FL_EINTERNAL, "not sticky: %s then %s (%s)", fl_status_name(first),
                     fl_status_name(again), fl_last_error());
        st = FL_EINTERNAL;
      } else {
        fl_set_error(first, "%s", msg);
      }
    }
  }
  fl_tensor_destroy(t);
  return st;
}

/* Over TCP (single copy off, so that rank 2's 4096 raw bytes are the start of a message). */
static void test_peer_leaves(void **state) {
  (void)state;
  group g;
  setenv("FLINT_COMM_SINGLE_COPY", "0", 1);
  group_create(&g, 4);
  unsetenv("FLINT_COMM_SINGLE_COPY");
  for (int r = 0; r < 4; r++) assert_int_equal(comm_host_single_copy_peers(g.comms[r]), 0);
  rank_job jobs[MAX_RANKS];
  run_ranks(4, g.comms, leave_mid_allreduce, NULL, jobs);
  g.comms[2] = NULL; /* destroyed by its rank */
  assert_int_equal(jobs[2].status, FL_OK);
  for (int r = 0; r < 4; r++) {
    if (r == 2) continue;
    if (jobs[r].status != FL_EPEER && jobs[r].status != FL_ENET)
      fprintf(stderr, "rank %d: %s: %s\n", r, fl_status_name(jobs[r].status), jobs[r].msg);
    assert_true(jobs[r].status == FL_EPEER || jobs[r].status == FL_ENET);
  }
  /* A survivor that saw the leaver first names it (the others may see a neighbour that gave
   * up first: every failing rank breaks its connections so that nobody waits). */
  assert_true(strstr(jobs[1].msg, "rank 2") || strstr(jobs[3].msg, "rank 2"));
  group_destroy(&g);
}

/* Strangers on rank 0's endpoint: garbage, a wrong group size, a silent connection and one
 * that closes at once. The mesh forms anyway. */
static int stranger(const char *address, const void *bytes, size_t len) {
  char host[64];
  snprintf(host, sizeof host, "%s", address);
  char *colon = strrchr(host, ':');
  *colon = '\0';
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, host, &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  if (len) assert_int_equal(send(fd, bytes, len, 0), (ssize_t)len);
  return fd;
}

/* ---- single copy ------------------------------------------------------------------------ */

/* Ranks that are threads of one process pass the probe with every peer. Over TCP
 * (FLINT_COMM_SHM=0) the matrix above then runs its ring steps from 128 KiB by single copy;
 * over shared memory those from 512 KiB to 4 MiB, or from FLINT_COMM_SINGLE_COPY_MIN when it
 * is set (docs/collectives.md), with the descriptors and acks on the rings. Off by
 * FLINT_COMM_SINGLE_COPY=0, and the ring gives the same sums every way. */
static void test_single_copy_probe(void **state) {
  (void)state;
  static const struct {
    const char *shm, *single_copy, *min;
    int peers;
  } modes[] = {{"0", NULL, NULL, 2}, {"0", "0", NULL, 0}, {NULL, NULL, NULL, 2}, {NULL, NULL, "128k", 2},
               {NULL, "0", "128k", 0}};
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
    if (modes[m].shm) setenv("FLINT_COMM_SHM", modes[m].shm, 1);
    if (modes[m].single_copy) setenv("FLINT_COMM_SINGLE_COPY", modes[m].single_copy, 1);
    if (modes[m].min) setenv("FLINT_COMM_SINGLE_COPY_MIN", modes[m].min, 1);
    group g;
    group_create(&g, 3);
    unsetenv("FLINT_COMM_SHM");
    unsetenv("FLINT_COMM_SINGLE_COPY");
    unsetenv("FLINT_COMM_SINGLE_COPY_MIN");
    for (int r = 0; r < 3; r++) {
      assert_int_equal(comm_host_single_copy_peers(g.comms[r]), modes[m].peers);
      assert_int_equal(comm_host_shm_peers(g.comms[r]), modes[m].shm ? 0 : 2);
    }
    check_allreduce(&g, cpu, FL_ALLREDUCE_RING, (1u << 20) + 3, FL_REDUCE_SUM);
    check_allreduce(&g, cpu, FL_ALLREDUCE_RING, 1000, FL_REDUCE_SUM); /* under the threshold */
    group_destroy(&g);
  }
}

/* The single-copy failure tests run over TCP and over shared memory (with the threshold
 * set, so that shared-memory pairs use single copy). */
static void single_copy_group(group *g, int size, bool shm) {
  if (!shm) setenv("FLINT_COMM_SHM", "0", 1);
  setenv("FLINT_COMM_SINGLE_COPY_MIN", "128k", 1);
  group_create(g, size);
  unsetenv("FLINT_COMM_SHM");
  unsetenv("FLINT_COMM_SINGLE_COPY_MIN");
  for (int r = 0; r < size; r++) {
    assert_int_equal(comm_host_single_copy_peers(g->comms[r]), size - 1);
    assert_int_equal(comm_host_shm_peers(g->comms[r]), shm ? size - 1 : 0);
  }
}

/* A descriptor whose length is not the step's: the receiver fails with FL_EPROTO naming the
 * sender and both lengths, instead of reading a wrong range. */
static fl_status bad_descriptor(rank_job *job) {
  fl_tensor *t = tensor_on(cpu, 1u << 20);
  fill(t, job->rank, 3);
  fl_status st;
  if (job->rank == 0) {
    uint64_t desc[2] = {(uint64_t)(uintptr_t)t->data, 12345};
    st = comm_host_send(job->comm->impl, 1, desc, sizeof desc);
    if (st == FL_OK) st = fl_comm_barrier(job->comm); /* fails once rank 1 gives up */
    st = FL_OK;
  } else {
    (void)fl_comm_set_allreduce_algo(job->comm, FL_ALLREDUCE_RING);
    st = fl_comm_allreduce(job->comm, t, FL_REDUCE_SUM);
  }
  fl_tensor_destroy(t);
  return st;
}

static void test_single_copy_bad_descriptor(void **state) {
  (void)state;
  for (int shm = 0; shm <= 1; shm++) {
    group g;
    single_copy_group(&g, 2, shm);
    rank_job jobs[MAX_RANKS];
    run_ranks(2, g.comms, bad_descriptor, NULL, jobs);
    assert_int_equal(jobs[1].status, FL_EPROTO);
    assert_non_null(strstr(jobs[1].msg, "rank 0 offered 12345 bytes where the ring step expects 2097152"));
    group_destroy(&g);
  }
}

/* A sender whose step fails while its descriptor is out (its other peer left) aborts and
 * writes its buffer again; the receiver, reading only then, must fail with FL_EPEER rather
 * than return what it read. Rank 1 starts its step once rank 0 has done all that. */
static atomic_int sender_gave_up;

static fl_status torn_read(rank_job *job) {
  const size_t n = 1u << 20;
  uint8_t *buf = calloc(n, 1);
  fl_status st = FL_OK;
  comm_host *h = job->comm->impl;
  if (job->rank == 2) {
    fl_comm_destroy(job->comm); /* leaves: rank 0's receive half fails */
    job->comm = NULL;
  } else if (job->rank == 0) {
    memset(buf, 0x11, n);
    uint8_t *rbuf = malloc(n);
    fl_status failed = comm_host_ring_step(h, 1, buf, n, 2, rbuf, n);
    free(rbuf);
    st = failed == FL_EPEER ? FL_OK : fl_set_error(FL_EINTERNAL, "rank 0's step: %s", fl_status_name(failed));
    job->comm->ops->abort(job->comm); /* as a failed collective does */
    memset(buf, 0xee, n);
    atomic_store(&sender_gave_up, 1);
  } else {
    for (int i = 0; i < 10000 && !atomic_load(&sender_gave_up); i++) usleep(1000);
    st = comm_host_ring_step(h, 2, NULL, 0, 0, buf, n);
  }
  free(buf);
  return st;
}

static void test_single_copy_sender_gives_up(void **state) {
  (void)state;
  for (int shm = 0; shm <= 1; shm++) {
    group g;
    single_copy_group(&g, 3, shm);
    atomic_store(&sender_gave_up, 0);
    rank_job jobs[MAX_RANKS];
    run_ranks(3, g.comms, torn_read, NULL, jobs);
    g.comms[2] = NULL; /* destroyed by its rank */
    assert_int_equal(jobs[0].status, FL_OK);
    assert_int_equal(jobs[1].status, FL_EPEER);
    assert_non_null(strstr(jobs[1].msg, "rank 1: rank 0 gave up while this rank read its buffer"));
    group_destroy(&g);
  }
}

/* Ranks as processes: rank 1 a forked child, so the probe reads another process's memory
 * (process_vm_readv), and the ring's result is checked on both sides. Where the kernel
 * refuses cross-memory reads (ptrace policy, seccomp), the probe must fail over to TCP and
 * the sums be the same. The threshold is set, so the pair uses single copy over its
 * shared-memory rings too. */
static void test_single_copy_processes(void **state) {
  (void)state;
  const size_t n = (1u << 20) + 5;
  fl_comm_endpoint *eps[2];
  char addrs[2][96];
  const char *ptrs[2] = {addrs[0], addrs[1]};
  for (int r = 0; r < 2; r++) {
    must_ok(fl_comm_listen("127.0.0.1", &eps[r]));
    snprintf(addrs[r], sizeof addrs[r], "%s", fl_comm_endpoint_address(eps[r]));
  }
  fflush(NULL);
  setenv("FLINT_COMM_SINGLE_COPY_MIN", "128k", 1); /* over shared memory too */
  pid_t child = fork();
  assert_true(child >= 0);
  int me = child == 0 ? 1 : 0;
  fl_comm_endpoint_destroy(eps[1 - me]);
  fl_comm *c = NULL;
  fl_status st = fl_comm_host_create(eps[me], me, 2, ptrs, 20000, &c);
  unsetenv("FLINT_COMM_SINGLE_COPY_MIN");
  int peers = st == FL_OK ? comm_host_single_copy_peers(c) : -1;
  long bad = -2;
  if (st == FL_OK) {
    fl_tensor *t = tensor_on(cpu, n);
    fill(t, me, 11);
    (void)fl_comm_set_allreduce_algo(c, FL_ALLREDUCE_RING);
    st = fl_comm_allreduce(c, t, FL_REDUCE_SUM);
    ar_case want = {.n = n, .op = FL_REDUCE_SUM, .seed = 11, .size = 2};
    if (st == FL_OK) bad = first_mismatch(t, want_allreduce, &want);
    fl_tensor_destroy(t);
  }
  fl_comm_destroy(c);
  if (child == 0) _exit(st == FL_OK && bad == -1 ? (peers == 1 ? 0 : 3) : 1);
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  if (st != FL_OK) fprintf(stderr, "rank 0: %s\n", fl_last_error());
  assert_int_equal(st, FL_OK);
  assert_int_equal(bad, -1);
  assert_true(WIFEXITED(status));
  assert_true(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3);
  /* Both ends agree on the pair: one single-copy peer on each, or none on either. */
  fprintf(stderr, "  two processes: single copy %s\n", peers == 1 ? "on" : "refused by this kernel, TCP");
  assert_int_equal(peers == 1, WEXITSTATUS(status) == 0);
}

static void test_garbage_on_endpoint(void **state) {
  (void)state;
  group g;
  group_listen(&g, 3);
  uint32_t wrong_size[4] = {0x544e4c46u, 1, 1, 7};
  int fds[4];
  fds[0] = stranger(g.addrs[0], "GET / HTTP/1.1\r\n\r\n", 18);
  fds[1] = stranger(g.addrs[0], wrong_size, sizeof wrong_size);
  fds[2] = stranger(g.addrs[0], NULL, 0); /* silent */
  fds[3] = stranger(g.addrs[0], NULL, 0);
  close(fds[3]);
  rank_job jobs[MAX_RANKS];
  group_connect(&g, jobs);
  expect_all_ok(3, jobs);
  check_allreduce(&g, cpu, FL_ALLREDUCE_AUTO, 1000, FL_REDUCE_SUM);
  for (int i = 0; i < 3; i++) close(fds[i]);
  group_destroy(&g);
  /* Only strangers: the mesh fails clearly, saying that it rejected them. */
  group_listen(&g, 2);
  g.timeout_ms = 300;
  g.skip[1] = true;
  fds[0] = stranger(g.addrs[0], "garbage garbage!", 16);
  group_connect(&g, jobs);
  assert_int_equal(jobs[0].status, FL_ETIMEDOUT);
  assert_non_null(strstr(jobs[0].msg, "bad hello"));
  close(fds[0]);
  group_destroy(&g);
}

static int setup(void **state) {
  (void)state;
  return fl_device_open(FL_DEVICE_CPU, 0, &cpu) == FL_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  fl_device_close(cpu);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_algo_names),
      cmocka_unit_test(test_allreduce_half),
      cmocka_unit_test(test_cost_model),
      cmocka_unit_test(test_calibration_agrees),
      cmocka_unit_test(test_calibration_two_hosts),
      cmocka_unit_test(test_calibration_one_rank_off),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_allreduce_matrix),
      cmocka_unit_test(test_allreduce_many_ranks),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_send_recv_barrier),
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_staged_device),
      cmocka_unit_test(test_peer_never_connects),
      cmocka_unit_test(test_peer_leaves),
      cmocka_unit_test(test_single_copy_probe),
      cmocka_unit_test(test_single_copy_bad_descriptor),
      cmocka_unit_test(test_single_copy_sender_gives_up),
      cmocka_unit_test(test_single_copy_processes),
      cmocka_unit_test(test_garbage_on_endpoint),
      cmocka_unit_test(test_worker_equals_synchronous),
      cmocka_unit_test(test_worker_peer_leaves),
      cmocka_unit_test(test_worker_stop),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
