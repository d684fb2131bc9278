/*
 * test_gpu_comm_algorithms.c: every host allreduce algorithm and the all-to-all against a
 * reference, over the matrix of ranks (1, 2, 3, 5, 8, 13, 16) and sizes (0, 1, odd,
 * 1 MiB + 3 bytes' worth of floats), with ranks as threads and as processes; the
 * hierarchical allreduce across network namespaces that stand for hosts.
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

/* Runs one allreduce of `algo` over n floats on this rank and returns the number of wrong
 * elements (or -1 when the call failed). */
static long allreduce_case(fl_comm *c, fl_allreduce_algo algo, size_t n, fl_reduce_op op) {
  int r = fl_comm_rank(c), p = fl_comm_size(c);
  uint32_t seed = (uint32_t)(n * 31 + algo * 7 + (unsigned)op);
  fl_tensor *t = tensor_of(n);
  float *x = (float *)t->data;
  for (size_t i = 0; i < n; i++) x[i] = value(r, i, seed);
  fl_status st = fl_comm_set_allreduce_algo(c, algo);
  if (st == FL_OK) st = fl_comm_allreduce(c, t, op);
  long bad = st == FL_OK ? 0 : -1;
  for (size_t i = 0; st == FL_OK && i < n; i++) {
    float want = 0;
    for (int q = 0; q < p; q++) want += value(q, i, seed);
    if (op == FL_REDUCE_AVG) want *= 1.0f / (float)p;
    if (x[i] != want) bad++;
  }
  if (st != FL_OK) fprintf(stderr, "rank %d of %d, %s, %zu floats: %s\n", r, p, fl_allreduce_algo_name(algo), n, fl_last_error());
  else if (bad) fprintf(stderr, "rank %d of %d, %s, %zu floats: %ld wrong\n", r, p, fl_allreduce_algo_name(algo), n, bad);
  fl_tensor_destroy(t);
  return bad;
}

/* Every algorithm at every size on this rank: the count of failed cases. */
static int all_cases(fl_comm *c) {
  int failed = 0;
  for (int a = 0; a < FL_ALLREDUCE_ALGO_COUNT; a++) {
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
      failed += allreduce_case(c, (fl_allreduce_algo)a, sizes[s], FL_REDUCE_SUM) != 0;
    failed += allreduce_case(c, (fl_allreduce_algo)a, 1001, FL_REDUCE_AVG) != 0;
  }
  return failed;
}

static fl_status all_cases_rank(rank_job *job) {
  int *failed = job->arg;
  failed[job->rank] = all_cases(job->comm);
  return FL_OK;
}

static void test_matrix_threads(void **state) {
  (void)state;
  for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
    group g;
    group_create(&g, rank_counts[k]);
    int failed[MAX_RANKS] = {0};
    rank_job jobs[MAX_RANKS];
    run_ranks(g.size, g.comms, all_cases_rank, failed, jobs);
    expect_all_ok(g.size, jobs);
    for (int r = 0; r < g.size; r++) assert_int_equal(failed[r], 0);
    group_destroy(&g);
  }
}

/* ---- ranks as processes ------------------------------------------------------------------
 * The parent listens for every rank (so the addresses are known before the fork), forks
 * ranks 1..p-1 and is rank 0 itself; each child runs the matrix and exits with its count of
 * failed cases. */
static void test_matrix_processes(void **state) {
  (void)state;
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
    for (int r = 0; r < p; r++)
      if (r != me) fl_comm_endpoint_destroy(eps[r]);
    fl_comm *c = NULL;
    fl_status st = fl_comm_host_create(eps[me], me, p, ptrs, 30000, &c);
    int failed = st == FL_OK ? all_cases(c) : 100;
    if (st != FL_OK) fprintf(stderr, "rank %d of %d: %s\n", me, p, fl_last_error());
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

/* ---- all-to-all ------------------------------------------------------------------------- */

/* What rank `from` sends rank `to` at element i of the block. */
static float a2a_value(int from, int to, size_t i) { return (float)(from * 1000 + to * 10) + (float)(i % 7); }

static fl_status alltoall_rank(rank_job *job) {
  size_t m = *(size_t *)job->arg;
  int p = job->size, r = job->rank;
  fl_tensor *in = tensor_of(m * (size_t)p), *out = tensor_of(m * (size_t)p);
  float *x = (float *)in->data, *y = (float *)out->data;
  for (int to = 0; to < p; to++)
    for (size_t i = 0; i < m; i++) x[(size_t)to * m + i] = a2a_value(r, to, i);
  fl_status st = fl_comm_alltoall(job->comm, in, out);
  for (int from = 0; st == FL_OK && from < p; from++)
    for (size_t i = 0; i < m; i++)
      if (y[(size_t)from * m + i] != a2a_value(from, r, i))
        st = fl_set_error(FL_EINTERNAL, "rank %d: element %zu of rank %d's block is %g", r, i, from,
                          (double)y[(size_t)from * m + i]);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return st;
}

static void test_alltoall(void **state) {
  (void)state;
  static const size_t blocks[] = {0, 1, ODD, 65537};
  for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++) {
    group g;
    group_create(&g, rank_counts[k]);
    for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
      size_t m = blocks[b];
      rank_job jobs[MAX_RANKS];
      run_ranks(g.size, g.comms, alltoall_rank, &m, jobs);
      expect_all_ok(g.size, jobs);
    }
    if (g.size == 3) { /* bad arguments: clear errors, the communicator stays usable */
      fl_tensor *a = tensor_of(4), *b = tensor_of(4), *c6 = tensor_of(6);
      assert_fails_with(fl_comm_alltoall(g.comms[0], a, b), FL_EINVAL, "multiple of the 3 ranks");
      assert_fails_with(fl_comm_alltoall(g.comms[0], c6, c6), FL_EINVAL, "same memory");
      assert_fails_with(fl_comm_alltoall(g.comms[0], c6, a), FL_EINVAL, "out has 4 elements");
      assert_fails_with(fl_comm_alltoall(g.comms[0], NULL, a), FL_EINVAL, "in is NULL");
      fl_tensor_destroy(a);
      fl_tensor_destroy(b);
      fl_tensor_destroy(c6);
      size_t m = 5;
      rank_job jobs[MAX_RANKS];
      run_ranks(g.size, g.comms, alltoall_rank, &m, jobs);
      expect_all_ok(g.size, jobs);
    }
    group_destroy(&g);
  }
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
  failed += all_cases(c);
  fl_comm_destroy(c);
  return failed > 100 ? 100 : failed;
}

static void test_hierarchical_across_namespaces(void **state) {
  (void)state;
  if (!make_hosts()) skip();
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matrix_threads),
      cmocka_unit_test(test_every_rank_same_bits),
      cmocka_unit_test(test_alltoall),
      cmocka_unit_test(test_matrix_processes),
      cmocka_unit_test(test_hierarchical_across_namespaces),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
