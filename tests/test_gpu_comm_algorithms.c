/*
 * test_gpu_comm_algorithms.c: the host backend's collectives against a reference, over the
 * issue's matrix of ranks (1, 2, 3, 5, 8, 13, 16) and sizes (0, 1, odd, 1 MiB + 3 bytes'
 * worth of floats), with ranks as threads and as processes, on both transports: shared
 * memory (every pair of ranks on this host through rings, the default) and TCP
 * (FLINT_COMM_SHM=0; ring steps from 128 KiB then move by one process_vm_readv where the
 * kernel allows it, which the ring allreduce, reduce-scatter and allgather reach at
 * 1 MiB + 3 up to 8 ranks).
 *
 * What runs: the full cross product, on every rank count, both transports, threads and
 * processes (on a busy 2-core machine, each of the two programs took 5-8 s in a
 * RelWithDebInfo build and 15-30 s under ASan):
 * - every allreduce algorithm (auto included) at every size, and averaged at 1001 floats;
 * - broadcast from root 0, the middle rank (p/2) and the last, at every size;
 * - allgather and all-to-all, a block of each size from every rank (the largest split
 *   between the ranks, so the whole stays 1 MiB + 3);
 * - reduce-scatter of every size (blocks uneven or empty), and averaged at 1001 floats.
 * Beside it: every rank's bits equal with random floats, bad sizes, roots and ops
 * (FL_EINVAL), and the hierarchical allreduce across network namespaces that stand for
 * hosts. The TCP matrix is a program of its own (see main).
 *
 * Inputs are small integers held as floats, so every sum is exact in any order and results
 * are compared bit for bit with the serial sum. With random floats (where the order of
 * additions shows), every rank must still end with the same bits as every other.
 */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "common/common.h"
#include "flint/gpu.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/comm.h"
#include "gpu/comm/host_transport.h"
#include "gpu/device/device.h"

#include "rank_threads.h"

static fl_device *cpu;

static const int rank_counts[] = {1, 2, 3, 5, 8, 13, 16};
#define ODD 7
#define BIG (((1u << 20) + 3 + 3) / 4) /* 1 MiB + 3 bytes, in whole floats: 262145 */
static const size_t sizes[] = {0, 1, ODD, BIG};

/* Rank r's element i: a small integer in [-16, 16], so sums of 16 ranks are exact. */
static float value(int r, size_t i, uint32_t seed) {
  uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(r + 1) << 40) ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return (float)((int)(x % 33) - 16);
}

static fl_tensor *tensor_of(size_t n) {
  int64_t shape[1] = {(int64_t)n};
  fl_tensor *t;
  must_ok(fl_tensor_create(cpu, 1, shape, &t));
  return t;
}

/* ---- transports ---------------------------------------------------------------------------
 * FLINT_COMM_SHM is read when a communicator forms: set around the forming only, so every
 * other test of the program keeps the default (shared memory between ranks on one host). */
typedef enum transport { TRANSPORT_SHM, TRANSPORT_TCP } transport;
static const char *const transport_names[] = {"shared memory", "tcp"};
static transport current; /* of the communicators under test, for the messages */

static void transport_select(transport tr) {
  current = tr;
  if (tr == TRANSPORT_TCP) setenv("FLINT_COMM_SHM", "0", 1);
}

static void transport_formed(void) { unsetenv("FLINT_COMM_SHM"); }

/* 0 when c talks to every peer over the transport asked for (threads and processes of one
 * host: every pair through rings, or none); else it says what it found. */
static int transport_check(fl_comm *c) {
  int p = fl_comm_size(c), shm = comm_host_shm_peers(c), want = current == TRANSPORT_SHM ? p - 1 : 0;
  if (shm == want) return 0;
  fprintf(stderr, "rank %d of %d: %d peers on shared memory, expected %d (%s)\n", fl_comm_rank(c), p, shm,
          want, transport_names[current]);
  return 1;
}

/* ---- one case on one rank ------------------------------------------------------------------
 * Each returns the number of wrong elements, or -1 when the call failed, and says which. */
static long report(fl_comm *c, const char *what, size_t n, fl_status st, long bad) {
  if (st != FL_OK) bad = -1;
  if (bad < 0)
    fprintf(stderr, "rank %d of %d (%s), %s, %zu floats: %s\n", fl_comm_rank(c), fl_comm_size(c),
            transport_names[current], what, n, fl_last_error());
  else if (bad)
    fprintf(stderr, "rank %d of %d (%s), %s, %zu floats: %ld wrong\n", fl_comm_rank(c), fl_comm_size(c),
            transport_names[current], what, n, bad);
  return bad;
}

static void fill(fl_tensor *t, int r, uint32_t seed) {
  float *x = (float *)t->data;
  for (size_t i = 0; i < t->numel; i++) x[i] = value(r, i, seed);
}

/* The reference: element i of the sum (or average) over p ranks. */
static float reduced(int p, size_t i, uint32_t seed, fl_reduce_op op) {
  float want = 0;
  for (int q = 0; q < p; q++) want += value(q, i, seed);
  return op == FL_REDUCE_AVG ? want * (1.0f / (float)p) : want;
}

static long allreduce_case(fl_comm *c, fl_allreduce_algo algo, size_t n, fl_reduce_op op) {
  int r = fl_comm_rank(c), p = fl_comm_size(c);
  uint32_t seed = (uint32_t)(n * 31 + algo * 7 + (unsigned)op);
  fl_tensor *t = tensor_of(n);
  float *x = (float *)t->data;
  fill(t, r, seed);
  fl_status st = fl_comm_set_allreduce_algo(c, algo);
  if (st == FL_OK) st = fl_comm_allreduce(c, t, op);
  long bad = 0;
  for (size_t i = 0; st == FL_OK && i < n; i++) bad += x[i] != reduced(p, i, seed, op);
  char what[64];
  snprintf(what, sizeof what, "allreduce %s%s", fl_allreduce_algo_name(algo), op == FL_REDUCE_AVG ? " avg" : "");
  fl_tensor_destroy(t);
  return report(c, what, n, st, bad);
}

/* Every rank starts with its own values, so a rank the root's data missed is seen. */
static long broadcast_case(fl_comm *c, size_t n, int root) {
  uint32_t seed = (uint32_t)(n * 17 + (size_t)root * 5 + 3);
  fl_tensor *t = tensor_of(n);
  float *x = (float *)t->data;
  fill(t, fl_comm_rank(c), seed);
  fl_status st = fl_comm_broadcast(c, t, root);
  long bad = 0;
  for (size_t i = 0; st == FL_OK && i < n; i++) bad += x[i] != value(root, i, seed);
  char what[64];
  snprintf(what, sizeof what, "broadcast from root %d", root);
  fl_tensor_destroy(t);
  return report(c, what, n, st, bad);
}

/* n floats from every rank; out starts as a value no rank sends. */
static long allgather_case(fl_comm *c, size_t n) {
  int r = fl_comm_rank(c), p = fl_comm_size(c);
  uint32_t seed = (uint32_t)(n * 13 + 1);
  fl_tensor *in = tensor_of(n), *out = tensor_of(n * (size_t)p);
  float *y = (float *)out->data;
  fill(in, r, seed);
  for (size_t i = 0; i < out->numel; i++) y[i] = 1000.0f;
  fl_status st = fl_comm_allgather(c, in, out);
  long bad = 0;
  for (int q = 0; st == FL_OK && q < p; q++)
    for (size_t i = 0; i < n; i++) bad += y[(size_t)q * n + i] != value(q, i, seed);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return report(c, "allgather", n, st, bad);
}

/* gpu.h's split, restated here rather than taken from gpu/comm: rank r's block is n/p
 * elements, plus one when r < n % p, and the blocks follow each other in rank order. */
static long reduce_scatter_case(fl_comm *c, size_t n, fl_reduce_op op) {
  int r = fl_comm_rank(c), p = fl_comm_size(c);
  size_t q = n / (size_t)p, m = n % (size_t)p, count = q + ((size_t)r < m);
  size_t offset = q * (size_t)r + ((size_t)r < m ? (size_t)r : m);
  uint32_t seed = (uint32_t)(n * 11 + (unsigned)op + 2);
  fl_tensor *in = tensor_of(n), *out = tensor_of(count);
  float *y = (float *)out->data;
  fill(in, r, seed);
  fl_status st = fl_comm_reduce_scatter(c, in, out, op);
  long bad = 0;
  for (size_t i = 0; st == FL_OK && i < count; i++) bad += y[i] != reduced(p, offset + i, seed, op);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return report(c, op == FL_REDUCE_AVG ? "reduce-scatter avg" : "reduce-scatter", n, st, bad);
}

/* What rank `from` sends rank `to` at element i of the block. */
static float a2a_value(int from, int to, size_t i) { return (float)(from * 1000 + to * 10) + (float)(i % 7); }

/* Blocks of m floats to and from every rank. */
static long alltoall_case(fl_comm *c, size_t m) {
  int r = fl_comm_rank(c), p = fl_comm_size(c);
  fl_tensor *in = tensor_of(m * (size_t)p), *out = tensor_of(m * (size_t)p);
  float *x = (float *)in->data, *y = (float *)out->data;
  for (int to = 0; to < p; to++)
    for (size_t i = 0; i < m; i++) x[(size_t)to * m + i] = a2a_value(r, to, i);
  fl_status st = fl_comm_alltoall(c, in, out);
  long bad = 0;
  for (int from = 0; st == FL_OK && from < p; from++)
    for (size_t i = 0; i < m; i++) bad += y[(size_t)from * m + i] != a2a_value(from, r, i);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return report(c, "all-to-all (floats a block)", m, st, bad);
}

/* ---- the matrix on one rank ---------------------------------------------------------------
 * Sizes are the tensor's for allreduce, broadcast and reduce-scatter (whose blocks are then
 * uneven, down to empty ones); for allgather and all-to-all, whose tensors are p blocks,
 * each block is a size of the matrix with the largest shared between the ranks (the whole
 * about 1 MiB + 3 bytes at any rank count). `nsizes`: the first that many of the sizes. */
static size_t share(size_t n, int p) { return n == BIG ? (n + (size_t)p - 1) / (size_t)p : n; }

static int all_cases(fl_comm *c, size_t nsizes) {
  int p = fl_comm_size(c), failed = 0;
  for (int a = 0; a < FL_ALLREDUCE_ALGO_COUNT; a++) {
    for (size_t s = 0; s < nsizes; s++)
      failed += allreduce_case(c, (fl_allreduce_algo)a, sizes[s], FL_REDUCE_SUM) != 0;
    failed += allreduce_case(c, (fl_allreduce_algo)a, 1001, FL_REDUCE_AVG) != 0;
  }
  const int roots[] = {0, p / 2, p - 1};
  for (size_t s = 0; s < nsizes; s++) {
    for (int k = 0; k < 3; k++)
      if (k == 0 || roots[k] != roots[k - 1]) failed += broadcast_case(c, sizes[s], roots[k]) != 0;
    failed += allgather_case(c, share(sizes[s], p)) != 0;
    failed += reduce_scatter_case(c, sizes[s], FL_REDUCE_SUM) != 0;
    failed += alltoall_case(c, share(sizes[s], p)) != 0;
  }
  failed += reduce_scatter_case(c, 1001, FL_REDUCE_AVG) != 0;
  return failed;
}

#define NSIZES (sizeof sizes / sizeof *sizes)

typedef struct matrix_arg {
  size_t nsizes;
  int failed[MAX_RANKS];
} matrix_arg;

static fl_status all_cases_rank(rank_job *job) {
  matrix_arg *m = job->arg;
  m->failed[job->rank] = transport_check(job->comm) + all_cases(job->comm, m->nsizes);
  return FL_OK;
}

static void matrix_threads(transport tr) {
  for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
    group g;
    transport_select(tr);
    group_create(&g, rank_counts[k]);
    transport_formed();
    matrix_arg m = {.nsizes = NSIZES};
    rank_job jobs[MAX_RANKS];
    run_ranks(g.size, g.comms, all_cases_rank, &m, jobs);
    expect_all_ok(g.size, jobs);
    for (int r = 0; r < g.size; r++) assert_int_equal(m.failed[r], 0);
    group_destroy(&g);
  }
}

static void test_matrix_threads_shm(void **state) {
  (void)state;
  matrix_threads(TRANSPORT_SHM);
}

static void test_matrix_threads_tcp(void **state) {
  (void)state;
  matrix_threads(TRANSPORT_TCP);
}

/* ---- ranks as processes ------------------------------------------------------------------
 * The parent listens for every rank (so the addresses are known before the fork), forks
 * ranks 1..p-1 and is rank 0 itself; each child runs the matrix and exits with its count of
 * failed cases. Over TCP, ring steps from 128 KiB move by one process_vm_readv where the
 * kernel allows it (the probe falls back to the socket where it does not; said once). */
static void matrix_processes(transport tr) {
  for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
    int p = rank_counts[k];
    fl_comm_endpoint *eps[MAX_RANKS];
    char addrs[MAX_RANKS][96];
    const char *ptrs[MAX_RANKS];
    for (int r = 0; r < p; r++) {
      must_ok(fl_comm_listen("127.0.0.1", &eps[r]));
      snprintf(addrs[r], sizeof addrs[r], "%s", fl_comm_endpoint_address(eps[r]));
      ptrs[r] = addrs[r];
    }
    transport_select(tr);
    fflush(NULL);
    pid_t kids[MAX_RANKS] = {0};
    int me = 0;
    for (int r = 1; r < p; r++) {
      pid_t pid = fork();
      assert_true(pid >= 0);
      if (pid == 0) {
        me = r;
        break;
      }
      kids[r] = pid;
    }
    if (me != 0) alarm(240); /* a hang is a failure, not a stuck suite */
    for (int r = 0; r < p; r++)
      if (r != me) fl_comm_endpoint_destroy(eps[r]);
    fl_comm *c = NULL;
    fl_status st = fl_comm_host_create(eps[me], me, p, ptrs, 30000, &c);
    transport_formed();
    int failed = 100;
    if (st == FL_OK) {
      int copy = comm_host_single_copy_peers(c);
      failed = transport_check(c) + (copy != 0 && copy != p - 1); /* each pair the same */
      if (me == 0 && tr == TRANSPORT_TCP && p == 2)
        fprintf(stderr, "  processes over tcp: single copy %s\n", copy ? "on" : "refused by this kernel");
      failed += all_cases(c, NSIZES);
    } else {
      fprintf(stderr, "rank %d of %d: %s\n", me, p, fl_last_error());
    }
    fl_comm_destroy(c);
    if (me != 0) _exit(failed > 100 ? 100 : failed);
    for (int r = 1; r < p; r++) {
      int status = 0;
      assert_int_equal(waitpid(kids[r], &status, 0), kids[r]);
      assert_true(WIFEXITED(status));
      assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(failed, 0);
  }
}

static void test_matrix_processes_shm(void **state) {
  (void)state;
  matrix_processes(TRANSPORT_SHM);
}

static void test_matrix_processes_tcp(void **state) {
  (void)state;
  matrix_processes(TRANSPORT_TCP);
}

/* ---- every rank the same bits ------------------------------------------------------------ */

static fl_status same_bits_rank(rank_job *job) {
  float **out = job->arg;
  size_t n = 70001;
  fl_tensor *t = tensor_of(n);
  float *x = (float *)t->data;
  uint64_t s = 0x1234567u + (uint64_t)job->rank * 0x9e3779b97f4a7c15ull;
  fl_status st = FL_OK;
  for (int a = 1; a < FL_ALLREDUCE_ALGO_COUNT && st == FL_OK; a++) {
    for (size_t i = 0; i < n; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 3.7f;
    }
    st = fl_comm_set_allreduce_algo(job->comm, (fl_allreduce_algo)a);
    if (st == FL_OK) st = fl_comm_allreduce(job->comm, t, FL_REDUCE_SUM);
    memcpy(out[job->rank] + (size_t)(a - 1) * n, x, n * sizeof(float));
  }
  fl_tensor_destroy(t);
  return st;
}

static void test_every_rank_same_bits(void **state) {
  (void)state;
  static const int counts[] = {3, 5, 13};
  size_t n = 70001, per = n * (FL_ALLREDUCE_ALGO_COUNT - 1);
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
    group g;
    group_create(&g, counts[k]);
    float *out[MAX_RANKS];
    for (int r = 0; r < g.size; r++) out[r] = calloc(per, sizeof(float));
    rank_job jobs[MAX_RANKS];
    run_ranks(g.size, g.comms, same_bits_rank, out, jobs);
    expect_all_ok(g.size, jobs);
    for (int r = 1; r < g.size; r++)
      for (int a = 1; a < FL_ALLREDUCE_ALGO_COUNT; a++) {
        bool same = memcmp(out[0] + (size_t)(a - 1) * n, out[r] + (size_t)(a - 1) * n, n * sizeof(float)) == 0;
        if (!same) fprintf(stderr, "%s, %d ranks: rank %d's bits differ from rank 0's\n",
                           fl_allreduce_algo_name((fl_allreduce_algo)a), g.size, r);
        assert_true(same);
      }
    for (int r = 0; r < g.size; r++) free(out[r]);
    group_destroy(&g);
  }
}

/* ---- bad arguments -------------------------------------------------------------------------
 * Sizes that do not fit the collective, and roots and ops out of range: FL_EINVAL naming the
 * cause, checked before any byte moves, so the communicator stays usable (a small matrix
 * runs after). Only rank 0 makes the bad calls; the other ranks never see them. */

static void test_bad_arguments(void **state) {
  (void)state;
  group g;
  transport_select(TRANSPORT_SHM);
  group_create(&g, 3);
  transport_formed();
  fl_comm *c = g.comms[0];
  fl_tensor *t0 = tensor_of(0), *t4 = tensor_of(4), *t5 = tensor_of(5), *t6 = tensor_of(6), *t12 = tensor_of(12);
  /* allgather: out must be 3 x in */
  assert_fails_with(fl_comm_allgather(c, t4, t6), FL_EINVAL, "out has 6 elements, expected 3 ranks x 4 = 12");
  assert_fails_with(fl_comm_allgather(c, t4, t4), FL_EINVAL, "out has 4 elements");
  assert_fails_with(fl_comm_allgather(c, t0, t4), FL_EINVAL, "expected 3 ranks x 0 = 0");
  assert_fails_with(fl_comm_allgather(c, NULL, t12), FL_EINVAL, "in is NULL");
  assert_fails_with(fl_comm_allgather(c, t4, NULL), FL_EINVAL, "out is NULL");
  /* reduce-scatter: rank 0's block of 4 over 3 ranks is 2, of 5 is 2, of 0 is 0 */
  assert_fails_with(fl_comm_reduce_scatter(c, t4, t4, FL_REDUCE_SUM), FL_EINVAL, "rank 0's block of 4 over 3 ranks has 2");
  assert_fails_with(fl_comm_reduce_scatter(c, t6, t4, FL_REDUCE_SUM), FL_EINVAL, "rank 0's block of 6 over 3 ranks has 2");
  assert_fails_with(fl_comm_reduce_scatter(c, t5, t0, FL_REDUCE_SUM), FL_EINVAL, "out has 0 elements");
  assert_fails_with(fl_comm_reduce_scatter(c, t0, t4, FL_REDUCE_SUM), FL_EINVAL, "block of 0 over 3 ranks has 0");
  assert_fails_with(fl_comm_reduce_scatter(c, t6, t6, (fl_reduce_op)7), FL_EINVAL, "unknown reduce op 7");
  assert_fails_with(fl_comm_reduce_scatter(c, NULL, t4, FL_REDUCE_SUM), FL_EINVAL, "in is NULL");
  /* broadcast: the root is a rank */
  assert_fails_with(fl_comm_broadcast(c, t4, -1), FL_EINVAL, "root -1 is outside 0..2");
  assert_fails_with(fl_comm_broadcast(c, t4, 3), FL_EINVAL, "root 3 is outside 0..2");
  assert_fails_with(fl_comm_broadcast(c, NULL, 0), FL_EINVAL, "tensor is NULL");
  /* all-to-all: p blocks of m, in and out apart */
  assert_fails_with(fl_comm_alltoall(c, t4, t5), FL_EINVAL, "multiple of the 3 ranks");
  assert_fails_with(fl_comm_alltoall(c, t6, t6), FL_EINVAL, "same memory");
  assert_fails_with(fl_comm_alltoall(c, t6, t4), FL_EINVAL, "out has 4 elements");
  assert_fails_with(fl_comm_alltoall(c, NULL, t4), FL_EINVAL, "in is NULL");
  /* allreduce: the op */
  assert_fails_with(fl_comm_allreduce(c, t4, (fl_reduce_op)-1), FL_EINVAL, "unknown reduce op -1");
  fl_tensor_destroy(t0);
  fl_tensor_destroy(t4);
  fl_tensor_destroy(t5);
  fl_tensor_destroy(t6);
  fl_tensor_destroy(t12);
  matrix_arg m = {.nsizes = NSIZES - 1};
  rank_job jobs[MAX_RANKS];
  run_ranks(g.size, g.comms, all_cases_rank, &m, jobs);
  expect_all_ok(g.size, jobs);
  for (int r = 0; r < g.size; r++) assert_int_equal(m.failed[r], 0);
  group_destroy(&g);
}

/* ---- hierarchical across hosts ------------------------------------------------------------
 * Two network namespaces joined by a veth pair stand for two hosts: ranks 0 and 1 in the
 * first, 2, 3 and 4 in the second (an uneven split). Each rank is a process that enters its
 * namespace (setns) before it listens on its host's address; the parent hands the addresses
 * around through pipes. Each rank checks that the mesh sees two hosts and runs every
 * algorithm (hierarchical among them) over the matrix's sizes. */
#define HOSTS_RANKS 5
static char ns_names[2][40];
static bool ns_made[2];

static int ip(const char *const *args) {
  static const char *const ips[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
  const char *path = NULL;
  for (size_t i = 0; i < sizeof ips / sizeof *ips && !path; i++)
    if (access(ips[i], X_OK) == 0) path = ips[i];
  if (!path) return -1;
  char *argv[16];
  int argc = 0;
  argv[argc++] = (char *)path;
  for (int i = 0; args[i] && argc < 15; i++) argv[argc++] = (char *)args[i];
  argv[argc] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2), dup2(devnull, 1);
    char *envp[] = {NULL};
    execve(path, argv, envp);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
#define IP(...) ip((const char *const[]){__VA_ARGS__, NULL})

static void delete_namespaces(void) {
  for (int i = 0; i < 2; i++)
    if (ns_made[i] && IP("netns", "del", ns_names[i]) == 0) ns_made[i] = false;
}

static bool make_hosts(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "skipped: network namespaces need root\n");
    return false;
  }
  for (int i = 0; i < 2; i++) {
    snprintf(ns_names[i], sizeof ns_names[i], "flintcomm%d%c", (int)getpid(), 'a' + i);
    if (IP("netns", "add", ns_names[i]) != 0) {
      fprintf(stderr, "skipped: cannot create a network namespace (ip netns add)\n");
      delete_namespaces();
      return false;
    }
    ns_made[i] = true;
  }
  assert_int_equal(IP("-n", ns_names[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", ns_names[1]), 0);
  assert_int_equal(IP("-n", ns_names[0], "addr", "add", "10.231.0.1/24", "dev", "eth0"), 0);
  assert_int_equal(IP("-n", ns_names[1], "addr", "add", "10.231.0.2/24", "dev", "eth0"), 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(IP("-n", ns_names[i], "link", "set", "eth0", "up"), 0);
    assert_int_equal(IP("-n", ns_names[i], "link", "set", "lo", "up"), 0);
  }
  return true;
}

/* One rank, in the child: enter the host's namespace, listen, report the address, read
 * everyone's, join, check the topology, run the matrix. Exit code: failed cases. */
static int host_rank(int me, int to_parent, int from_parent) {
  int host = me < 2 ? 0 : 1;
  char path[96];
  snprintf(path, sizeof path, "/var/run/netns/%s", ns_names[host]);
  int nsfd = open(path, O_RDONLY);
  if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) return 101;
  close(nsfd);
  fl_comm_endpoint *ep;
  if (fl_comm_listen(host ? "10.231.0.2" : "10.231.0.1", &ep) != FL_OK) return 102;
  char mine[96] = {0}, addrs[HOSTS_RANKS][96];
  snprintf(mine, sizeof mine, "%s", fl_comm_endpoint_address(ep));
  if (write(to_parent, mine, sizeof mine) != (ssize_t)sizeof mine) return 103;
  if (read(from_parent, addrs, sizeof addrs) != (ssize_t)sizeof addrs) return 104;
  const char *ptrs[HOSTS_RANKS];
  for (int r = 0; r < HOSTS_RANKS; r++) ptrs[r] = addrs[r];
  fl_comm *c = NULL;
  if (fl_comm_host_create(ep, me, HOSTS_RANKS, ptrs, 30000, &c) != FL_OK) {
    fprintf(stderr, "rank %d: %s\n", me, fl_last_error());
    return 105;
  }
  const comm_host *h = c->impl;
  int failed = h->nhosts == 2 && h->host_of[me] == host ? 0 : 50;
  if (failed) fprintf(stderr, "rank %d sees %d hosts, itself on host %d\n", me, h->nhosts, h->host_of[me]);
  failed += all_cases(c, NSIZES);
  fl_comm_destroy(c);
  return failed > 100 ? 100 : failed;
}

static void test_hierarchical_across_namespaces(void **state) {
  (void)state;
  if (!make_hosts()) skip();
  transport_select(TRANSPORT_SHM); /* within each host; TCP between them */
  int up[HOSTS_RANKS][2], down[HOSTS_RANKS][2];
  pid_t kids[HOSTS_RANKS];
  fflush(NULL);
  for (int r = 0; r < HOSTS_RANKS; r++) {
    assert_int_equal(pipe(up[r]), 0);
    assert_int_equal(pipe(down[r]), 0);
    kids[r] = fork();
    assert_true(kids[r] >= 0);
    if (kids[r] == 0) {
      alarm(240); /* a hang is a failure, not a stuck suite */
      _exit(host_rank(r, up[r][1], down[r][0]));
    }
    close(up[r][1]);
    close(down[r][0]);
  }
  char addrs[HOSTS_RANKS][96];
  bool all = true;
  for (int r = 0; r < HOSTS_RANKS; r++) all &= read(up[r][0], addrs[r], sizeof addrs[r]) == (ssize_t)sizeof addrs[r];
  for (int r = 0; r < HOSTS_RANKS; r++) {
    if (all) assert_int_equal(write(down[r][1], addrs, sizeof addrs), (ssize_t)sizeof addrs);
    close(down[r][1]);
    close(up[r][0]);
  }
  int codes[HOSTS_RANKS];
  for (int r = 0; r < HOSTS_RANKS; r++) {
    int status = 0;
    assert_int_equal(waitpid(kids[r], &status, 0), kids[r]);
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 200;
  }
  delete_namespaces();
  assert_true(all);
  for (int r = 0; r < HOSTS_RANKS; r++) {
    if (codes[r]) fprintf(stderr, "rank %d exited with %d\n", r, codes[r]);
    assert_int_equal(codes[r], 0);
  }
}

static int setup(void **state) {
  (void)state;
  return fl_device_open(FL_DEVICE_CPU, 0, &cpu) == FL_OK ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  delete_namespaces();
  fl_device_close(cpu);
  return 0;
}

/* Two programs from this file (tests/CMakeLists.txt), so that ctest -j2 runs the transports
 * side by side: test_gpu_comm_algorithms (shared memory, and the rest), and
 * test_gpu_comm_algorithms_tcp (TEST_COMM_TCP: the matrix over TCP). */
int main(void) {
  const struct CMUnitTest shm_tests[] = {
      cmocka_unit_test(test_matrix_threads_shm),
      cmocka_unit_test(test_every_rank_same_bits),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_matrix_processes_shm),
      cmocka_unit_test(test_hierarchical_across_namespaces),
  };
  const struct CMUnitTest tcp_tests[] = {
      cmocka_unit_test(test_matrix_threads_tcp),
      cmocka_unit_test(test_matrix_processes_tcp),
  };
#ifdef TEST_COMM_TCP
  (void)shm_tests;
  return cmocka_run_group_tests(tcp_tests, setup, teardown);
#else
  (void)tcp_tests;
  return cmocka_run_group_tests(shm_tests, setup, teardown);
#endif
}
