/*
 * test_gpu_comm_shm.c: the host backend's shared-memory transport (gpu/comm/host_shm.c)
 * between ranks on one host. Ranks as threads and as forked processes: shared memory is in
 * use between every same-host pair (and not with FLINT_COMM_SHM=0, where TCP gives the same
 * results); sends, receives and full-duplex exchanges of 0, 1 and odd bytes, of more than a
 * ring holds (both ranks sending at once) and of 1 MiB + 3 floats; every allreduce algorithm
 * and the 16-bit one on both, after transfers of odd lengths (so that elements are summed
 * straight from the ring at every misalignment, and across its end); three processes where
 * one pair talks through rings and the others over TCP (mixed waits); a peer process that
 * exits (without closing its rings) while this rank waits on them fails with FL_EPEER naming
 * it, receiving, sending, and with both ranks on one CPU; abort wakes a peer asleep on its
 * doorbell; a leaver's bytes are delivered before its close; and offers that cannot be
 * mapped leave the pair on TCP.
 *
 * No time is asserted on: every wait is bounded by FLINT_COMM_TIMEOUT_MS (30 s here) and the
 * loops that wait for a state by 10 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

/* Byte i of what rank r sends in a test: a pattern that differs by rank and position. */
static uint8_t pattern(int r, size_t i) { return (uint8_t)(i * 131u + (size_t)r * 71u + (i >> 12)); }

static long first_bad_byte(const uint8_t *buf, size_t n, int from) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != pattern(from, i)) return (long)i;
  return -1;
}

/* Small integers as floats: sums are exact in any order. */
static float value(int r, size_t i) { return (float)((int)((i * 7u + (size_t)r * 13u) % 33u) - 16); }

/* ---- one rank's checks, the same as a thread or a process -------------------------------- */

/* Sizes of the byte transfers: empty, one byte, odd, more than a ring (256 KiB) holds, and
 * 1 MiB + 3 floats. */
static const size_t byte_sizes[] = {0, 1, 1001, (600u << 10) + 7, (1u << 20) + 12};

/* AUTO, the ring, halving-doubling and the tree (test_gpu_comm_algorithms runs every
 * algorithm, over shared memory too) over counts[] floats on `ranks` ranks: rank r's element
 * i is value(r, i), and the sum must be exact. */
static fl_status allreduce_checks(fl_comm *c, int me, int ranks, const size_t *counts, size_t ncounts) {
  fl_status st = FL_OK;
  for (int a = FL_ALLREDUCE_AUTO; st == FL_OK && a <= FL_ALLREDUCE_TREE; a++)
    for (size_t k = 0; st == FL_OK && k < ncounts; k++) {
      size_t n = counts[k];
      int64_t shape[1] = {(int64_t)n};
      fl_tensor *t;
      must_ok(fl_tensor_create(cpu, 1, shape, &t));
      float *x = t->data;
      for (size_t i = 0; i < n; i++) x[i] = value(me, i);
      st = fl_comm_set_allreduce_algo(c, (fl_allreduce_algo)a);
      if (st == FL_OK) st = fl_comm_allreduce(c, t, FL_REDUCE_SUM);
      for (size_t i = 0; st == FL_OK && i < n; i++) {
        float want = 0;
        for (int r = 0; r < ranks; r++) want += value(r, i);
        if (x[i] != want)
          st = fl_set_error(FL_EINTERNAL, "allreduce %s of %zu floats: element %zu is %g",
                            fl_allreduce_algo_name((fl_allreduce_algo)a), n, i, (double)x[i]);
      }
      fl_tensor_destroy(t);
    }
  return st;
}

/* Rank `me` of 2 (peer 1 - me): a send then a receive in rank order, then an exchange where
 * both send at once, then every allreduce algorithm over 1 MiB + 3 floats and 3 floats.
 * Returns the first failure as a status, with its message. */
static fl_status pair_checks(fl_comm *c, int me) {
  comm_host *h = c->impl;
  int peer = 1 - me;
  fl_status st = FL_OK;
  size_t max = (1u << 20) + 12;
  uint8_t *out = malloc(max), *in = malloc(max);
  for (size_t i = 0; i < max; i++) out[i] = pattern(me, i);
  for (size_t k = 0; st == FL_OK && k < sizeof byte_sizes / sizeof *byte_sizes; k++) {
    size_t n = byte_sizes[k];
    memset(in, 0, max);
    if (me == 0) {
      st = comm_host_send(h, peer, out, n);
      if (st == FL_OK) st = comm_host_recv(h, peer, in, n);
    } else {
      st = comm_host_recv(h, peer, in, n);
      if (st == FL_OK) st = comm_host_send(h, peer, out, n);
    }
    if (st == FL_OK && first_bad_byte(in, n, peer) >= 0)
      st = fl_set_error(FL_EINTERNAL, "send/recv of %zu bytes: byte %ld differs", n, first_bad_byte(in, n, peer));
    if (st != FL_OK) break;
    memset(in, 0, max);
    st = comm_host_exchange(h, peer, out, n, peer, in, n); /* both directions at once */
    if (st == FL_OK && first_bad_byte(in, n, peer) >= 0)
      st = fl_set_error(FL_EINTERNAL, "exchange of %zu bytes: byte %ld differs", n, first_bad_byte(in, n, peer));
  }
  static const size_t counts[] = {(1u << 20) + 3, 3};
  if (st == FL_OK) st = allreduce_checks(c, me, 2, counts, 2);
  /* 16-bit elements after one more odd byte, so that they too lie across the ring's
   * element boundaries. */
  if (st == FL_OK) st = comm_host_exchange(h, peer, out, 1, peer, in, 1);
  for (int kind = COMM_HALF_FP16; st == FL_OK && kind <= COMM_HALF_BF16; kind++) {
    size_t n = 300001;
    uint16_t *x = malloc(n * 2);
    for (size_t i = 0; i < n; i++)
      x[i] = kind == COMM_HALF_FP16 ? comm_f32_to_f16(value(me, i)) : comm_f32_to_bf16(value(me, i));
    st = comm_allreduce_half(c, x, n, (comm_half_kind)kind);
    for (size_t i = 0; st == FL_OK && i < n; i++) {
      float got = kind == COMM_HALF_FP16 ? comm_f16_to_f32(x[i]) : comm_bf16_to_f32(x[i]);
      if (got != value(0, i) + value(1, i))
        st = fl_set_error(FL_EINTERNAL, "16-bit allreduce (kind %d): element %zu is %g", kind, i, (double)got);
    }
    free(x);
  }
  free(out);
  free(in);
  return st;
}

/* ---- ranks as threads --------------------------------------------------------------------- */

static fl_status pair_rank(rank_job *job) { return pair_checks(job->comm, job->rank); }

/* Threads of one process share memory with every peer; with FLINT_COMM_SHM=0 with none, and
 * the same transfers pass over TCP. */
static void test_threads_use_shm(void **state) {
  (void)state;
  for (int off = 0; off <= 1; off++) {
    if (off) setenv("FLINT_COMM_SHM", "0", 1);
    group g;
    group_create(&g, 2);
    unsetenv("FLINT_COMM_SHM");
    for (int r = 0; r < 2; r++) assert_int_equal(comm_host_shm_peers(g.comms[r]), off ? 0 : 1);
    rank_job jobs[MAX_RANKS];
    run_ranks(2, g.comms, pair_rank, NULL, jobs);
    expect_all_ok(2, jobs);
    group_destroy(&g);
  }
  /* Five ranks: every pair. */
  group g;
  group_create(&g, 5);
  for (int r = 0; r < 5; r++) assert_int_equal(comm_host_shm_peers(g.comms[r]), 4);
  group_destroy(&g);
}

/* ---- ranks as processes ------------------------------------------------------------------ */

typedef struct pair {
  fl_comm_endpoint *eps[2];
  char addrs[2][96];
  const char *ptrs[2];
} pair;

static void pair_listen(pair *p) {
  for (int r = 0; r < 2; r++) {
    must_ok(fl_comm_listen("127.0.0.1", &p->eps[r]));
    snprintf(p->addrs[r], sizeof p->addrs[r], "%s", fl_comm_endpoint_address(p->eps[r]));
    p->ptrs[r] = p->addrs[r];
  }
  fflush(NULL);
}

/* Forks rank 1; both ranks build their communicator (the endpoints are taken). Returns the
 * child's pid in the parent (rank 0), 0 in the child (rank 1). */
static pid_t pair_fork(pair *p, fl_comm **c, fl_status *st) {
  pid_t child = fork();
  assert_true(child >= 0);
  int me = child == 0 ? 1 : 0;
  fl_comm_endpoint_destroy(p->eps[1 - me]);
  *c = NULL;
  *st = fl_comm_host_create(p->eps[me], me, 2, p->ptrs, 20000, c);
  return child;
}

static int wait_child(pid_t child) {
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* Two processes: shared memory between them (the child checks its side too and exits 0 only
 * when all passed), or none with FLINT_COMM_SHM=0. */
static void test_processes(void **state) {
  (void)state;
  for (int off = 0; off <= 1; off++) {
    if (off) setenv("FLINT_COMM_SHM", "0", 1);
    pair p;
    pair_listen(&p);
    fl_comm *c;
    fl_status st;
    pid_t child = pair_fork(&p, &c, &st);
    unsetenv("FLINT_COMM_SHM");
    int peers = st == FL_OK ? comm_host_shm_peers(c) : -1;
    if (st == FL_OK) st = pair_checks(c, child == 0 ? 1 : 0);
    if (st != FL_OK) fprintf(stderr, "rank %d: %s\n", child == 0 ? 1 : 0, fl_last_error());
    fl_comm_destroy(c);
    if (child == 0) _exit(st != FL_OK ? 1 : peers != (off ? 0 : 1) ? 2 : 0);
    assert_int_equal(st, FL_OK);
    assert_int_equal(peers, off ? 0 : 1);
    assert_int_equal(wait_child(child), 0);
  }
}

/* Three processes where rank 2 turns shared memory off: the pair 0-1 talks through rings,
 * the pairs with rank 2 over TCP, so ring steps wait on a ring on one side and a socket on
 * the other (the mixed wait, as across hosts). Every algorithm gives the exact sum. */
static fl_status mixed_checks(fl_comm *c, int me) {
  static const size_t counts[] = {(1u << 20) + 3, 1001, 1};
  return allreduce_checks(c, me, 3, counts, sizeof counts / sizeof *counts);
}

static void test_mixed_pairs(void **state) {
  (void)state;
  fl_comm_endpoint *eps[3];
  char addrs[3][96];
  const char *ptrs[3];
  for (int r = 0; r < 3; r++) {
    must_ok(fl_comm_listen("127.0.0.1", &eps[r]));
    snprintf(addrs[r], sizeof addrs[r], "%s", fl_comm_endpoint_address(eps[r]));
    ptrs[r] = addrs[r];
  }
  fflush(NULL);
  pid_t kids[3] = {0, 0, 0};
  int me = 0;
  for (int r = 1; r < 3 && me == 0; r++) {
    kids[r] = fork();
    assert_true(kids[r] >= 0);
    if (kids[r] == 0) me = r;
  }
  for (int r = 0; r < 3; r++)
    if (r != me) fl_comm_endpoint_destroy(eps[r]);
  if (me == 2) setenv("FLINT_COMM_SHM", "0", 1);
  fl_comm *c = NULL;
  fl_status st = fl_comm_host_create(eps[me], me, 3, ptrs, 20000, &c);
  int peers = st == FL_OK ? comm_host_shm_peers(c) : -1;
  if (st == FL_OK) st = mixed_checks(c, me);
  if (st != FL_OK) fprintf(stderr, "rank %d: %s\n", me, fl_last_error());
  fl_comm_destroy(c);
  if (me != 0) _exit(st != FL_OK ? 1 : peers != (me == 2 ? 0 : 1) ? 2 : 0);
  assert_int_equal(st, FL_OK);
  assert_int_equal(peers, 1);
  for (int r = 1; r < 3; r++) assert_int_equal(wait_child(kids[r]), 0);
}

/* Rank 1 (the child) exits without closing anything, once rank 0 sleeps waiting for it
 * (receiving a message it never sends, or sending more than the ring holds): the exit closes
 * only its socket, and rank 0 must notice that between its sleeps and fail with FL_EPEER
 * naming rank 1 instead of waiting for the operation timeout. */
static void test_peer_process_exits(void **state) {
  (void)state;
  setenv("FLINT_COMM_TIMEOUT_MS", "30000", 1);
  cpu_set_t all;
  assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
  /* The third time both ranks run on one CPU, where a waiter yields instead of spinning:
   * it must still get to its sleeps and their checks. */
  for (int variant = 0; variant < 3; variant++) {
    int sending = variant == 1;
    if (variant == 2) {
      cpu_set_t one;
      CPU_ZERO(&one);
      for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &all)) {
          CPU_SET(i, &one);
          break;
        }
      assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    }
    pair p;
    pair_listen(&p);
    fl_comm *c;
    fl_status st;
    pid_t child = pair_fork(&p, &c, &st);
    if (child == 0) {
      if (st != FL_OK) _exit(1);
      int rc = comm_host_shm_peers(c) == 1 ? 0 : 2;
      uint8_t go = 0; /* waited for: the child's CPU is then on record in its doorbell */
      if (comm_host_recv(c->impl, 0, &go, 1) != FL_OK) rc = 4;
      for (int i = 0; i < 10000 && !comm_host_shm_peer_sleeping(c->impl, 0); i++) usleep(1000);
      if (!comm_host_shm_peer_sleeping(c->impl, 0)) rc = 3;
      _exit(rc); /* no fl_comm_destroy: as a crash */
    }
    assert_ok(st);
    usleep(20000);
    uint8_t go = 1;
    assert_ok(comm_host_send(c->impl, 1, &go, 1));
    size_t n = sending ? (4u << 20) : 64;
    uint8_t *buf = calloc(n, 1);
    st = sending ? comm_host_send(c->impl, 1, buf, n) : comm_host_recv(c->impl, 1, buf, n);
    free(buf);
    if (st != FL_EPEER) fprintf(stderr, "%s\n", fl_last_error());
    assert_int_equal(st, FL_EPEER);
    assert_non_null(strstr(fl_last_error(), "rank 0: rank 1 went away"));
    fl_comm_destroy(c);
    assert_int_equal(wait_child(child), 0);
  }
  assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
  unsetenv("FLINT_COMM_TIMEOUT_MS");
}

/* ---- abort -------------------------------------------------------------------------------- */

static atomic_int saw_sleeping;

/* Rank 0 waits for bytes rank 1 never sends; rank 1 aborts once rank 0 sleeps on its
 * doorbell. Rank 0 wakes on the closed ring (the message says so), not on a socket check. */
static fl_status abort_rank(rank_job *job) {
  comm_host *h = job->comm->impl;
  if (job->rank == 0) {
    uint8_t buf[64];
    return comm_host_recv(h, 1, buf, sizeof buf);
  }
  for (int i = 0; i < 10000 && !comm_host_shm_peer_sleeping(h, 0); i++) usleep(1000);
  atomic_store(&saw_sleeping, comm_host_shm_peer_sleeping(h, 0));
  job->comm->ops->abort(job->comm);
  return FL_OK;
}

static void test_abort_wakes_sleeper(void **state) {
  (void)state;
  setenv("FLINT_COMM_TIMEOUT_MS", "30000", 1);
  group g;
  group_create(&g, 2);
  unsetenv("FLINT_COMM_TIMEOUT_MS");
  atomic_store(&saw_sleeping, 0);
  rank_job jobs[MAX_RANKS];
  run_ranks(2, g.comms, abort_rank, NULL, jobs);
  assert_true(atomic_load(&saw_sleeping));
  assert_int_equal(jobs[1].status, FL_OK);
  assert_int_equal(jobs[0].status, FL_EPEER);
  assert_non_null(strstr(jobs[0].msg, "rank 0: rank 1 closed its shared-memory rings during a receive"));
  group_destroy(&g);
}

/* A peer that leaves normally (fl_comm_destroy) closes its rings: what it sent before is
 * still delivered, and the next receive fails with FL_EPEER. */
static fl_status leave_rank(rank_job *job) {
  comm_host *h = job->comm->impl;
  uint8_t buf[100];
  if (job->rank == 1) {
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = pattern(1, i);
    fl_status st = comm_host_send(h, 0, buf, sizeof buf);
    fl_comm_destroy(job->comm);
    job->comm = NULL;
    return st;
  }
  usleep(20000);
  fl_status st = comm_host_recv(h, 1, buf, sizeof buf);
  if (st != FL_OK) return st;
  if (first_bad_byte(buf, sizeof buf, 1) >= 0) return fl_set_error(FL_EINTERNAL, "bad bytes");
  return comm_host_recv(h, 1, buf, 1);
}

static void test_leaver_drains_then_closes(void **state) {
  (void)state;
  group g;
  group_create(&g, 2);
  rank_job jobs[MAX_RANKS];
  run_ranks(2, g.comms, leave_rank, NULL, jobs);
  g.comms[1] = NULL; /* destroyed by its rank */
  assert_int_equal(jobs[1].status, FL_OK);
  assert_int_equal(jobs[0].status, FL_EPEER);
  assert_non_null(strstr(jobs[0].msg, "rank 1 closed its shared-memory rings"));
  group_destroy(&g);
}

/* ---- offers that cannot be mapped ------------------------------------------------------- */

/* The mesh maps a peer's segment from its offer {pid, fd, bytes, nonce}; an offer naming no
 * process, no descriptor, the wrong size or a file that is not a segment is refused (the
 * pair then talks TCP) rather than mapped. */
static void test_bad_offers(void **state) {
  (void)state;
  group g;
  group_create(&g, 2);
  comm_host *h = g.comms[0]->impl;
  uint64_t pid = (uint64_t)getpid(), bytes = h->shm_seg_bytes;
  int fake = memfd_create("not-a-segment", MFD_CLOEXEC);
  assert_true(fake >= 0);
  assert_int_equal(ftruncate(fake, (off_t)bytes), 0);
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  assert_true(null_fd >= 0);
  const uint64_t offers[][4] = {
      {0, (uint64_t)fake, bytes, 1},                    /* no process */
      {(uint64_t)INT32_MAX + 1, (uint64_t)fake, bytes, 1},
      {pid, UINT64_MAX, bytes, 1},                      /* fd -1: the peer has no segment */
      {pid, 999999, bytes, 1},                          /* no such descriptor */
      {pid, (uint64_t)null_fd, bytes, 1},               /* not a segment's size */
      {pid, (uint64_t)fake, bytes + 4096, 1},           /* not this host's segment size */
      {pid, (uint64_t)fake, bytes, 1},                  /* zeros: no magic, no nonce */
  };
  for (size_t k = 0; k < sizeof offers / sizeof *offers; k++) assert_false(comm_host_shm_attach(h, 1, offers[k]));
  close(fake);
  close(null_fd);
  /* The pair still works (nothing was replaced). */
  rank_job jobs[MAX_RANKS];
  run_ranks(2, g.comms, pair_rank, NULL, jobs);
  expect_all_ok(2, jobs);
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
      cmocka_unit_test(test_threads_use_shm),
      cmocka_unit_test(test_processes),
      cmocka_unit_test(test_mixed_pairs),
      cmocka_unit_test(test_peer_process_exits),
      cmocka_unit_test(test_abort_wakes_sleeper),
      cmocka_unit_test(test_leaver_drains_then_closes),
      cmocka_unit_test(test_bad_offers),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
