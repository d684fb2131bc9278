/*
 * test_gpu_comm_worker.c: the communication thread (gpu/comm_worker.h), with ranks as threads
 * over loopback host communicators:
 *   - results: 1 to 4 ranks post many buckets of a flat buffer (more than the queue holds,
 *     sizes 0, 1, odd and large) through the worker; the buffer equals, bit for bit, one
 *     reduced bucket by bucket with fl_comm_allreduce on the rank's own thread (random floats,
 *     so a different order of additions or a wrong range would show);
 *   - the communicator is the rank's again after a wait (a direct collective follows);
 *   - a peer that leaves: the survivor's wait returns FL_EPEER or FL_ENET with a message
 *     naming the failed allreduce, well within the time bound, and later posts return it too;
 *   - stop with nothing queued, and stop of NULL.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test_util.h"

#include "flint/gpu.h"
#include "gpu/comm.h"
#include "gpu/comm_worker.h"
#include "gpu/device.h"

#define MAX_RANKS 4

static fl_device *cpu;

/* On rank threads cmocka's asserts may not fail (they longjmp): a failure returns a status
 * and the main thread checks it. */
typedef struct rank_job {
  int rank, size;
  fl_comm *comm;
  const void *arg;
  fl_status (*fn)(struct rank_job *job);
  fl_status status;
  char msg[512];
  double seconds;
} rank_job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *rank_main(void *p) {
  rank_job *job = p;
  double t0 = now_s();
  job->status = job->fn(job);
  job->seconds = now_s() - t0;
  snprintf(job->msg, sizeof job->msg, "%s", job->status ? fl_last_error() : "");
  return NULL;
}

static void run_ranks(int size, fl_comm **comms, fl_status (*fn)(rank_job *), const void *arg, rank_job *jobs) {
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < size; r++) {
    jobs[r] = (rank_job){.rank = r, .size = size, .comm = comms ? comms[r] : NULL, .arg = arg, .fn = fn};
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
  }
  for (int r = 0; r < size; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
}

/* ---- groups of host communicators ---------------------------------------------------------- */

typedef struct group {
  int size;
  fl_comm_endpoint *eps[MAX_RANKS];
  char addrs[MAX_RANKS][96];
  const char *addr_ptrs[MAX_RANKS];
  fl_comm *comms[MAX_RANKS];
} group;

static fl_status create_rank(rank_job *job) {
  group *g = (group *)job->arg;
  fl_comm_endpoint *ep = g->eps[job->rank];
  g->eps[job->rank] = NULL; /* taken by create, even on failure */
  return fl_comm_host_create(ep, job->rank, job->size, g->addr_ptrs, 10000, &g->comms[job->rank]);
}

static void group_create(group *g, int size) {
  memset(g, 0, sizeof *g);
  g->size = size;
  for (int r = 0; r < size; r++) {
    assert_ok(fl_comm_listen("127.0.0.1", &g->eps[r]));
    snprintf(g->addrs[r], sizeof g->addrs[r], "%s", fl_comm_endpoint_address(g->eps[r]));
    g->addr_ptrs[r] = g->addrs[r];
  }
  rank_job jobs[MAX_RANKS];
  run_ranks(size, NULL, create_rank, g, jobs);
  for (int r = 0; r < size; r++) {
    if (jobs[r].status != FL_OK) fprintf(stderr, "rank %d: %s\n", r, jobs[r].msg);
    assert_int_equal(jobs[r].status, FL_OK);
  }
}

static void group_destroy(group *g) {
  for (int r = 0; r < g->size; r++) fl_comm_destroy(g->comms[r]);
}

/* ---- results equal the synchronous calls ----------------------------------------------------- */

/* Bucket sizes in floats: empty, one, odd, large, and enough of them (130) to fill the queue
 * twice over. */
#define BUCKETS 130
static size_t bucket_len(int i) {
  static const size_t sizes[] = {0, 1, 7, 1000, 4099, 1u << 18, 3, 65537};
  return sizes[i % 8];
}

/* Rank r's input: seeded floats of mixed signs and magnitudes (sums round differently in any
 * other order). */
static void fill_random(float *x, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * (float)(1 + (s & 1023));
  }
}

typedef struct results_case {
  size_t total;
  fl_allreduce_algo algo;
} results_case;

static fl_status compare_rank(rank_job *job) {
  const results_case *c = job->arg;
  fl_status st = FL_OK;
  int64_t shape[1] = {(int64_t)c->total};
  fl_tensor *via_worker = NULL, *direct = NULL;
  comm_worker *w = NULL;
  if ((st = fl_tensor_create(cpu, 1, shape, &via_worker)) != FL_OK) goto done;
  if ((st = fl_tensor_create(cpu, 1, shape, &direct)) != FL_OK) goto done;
  fill_random(via_worker->data, c->total, (uint64_t)job->rank + 1);
  memcpy(direct->data, via_worker->data, c->total * sizeof(float));
  if ((st = fl_comm_set_allreduce_algo(job->comm, c->algo)) != FL_OK) goto done;
  /* Synchronous, bucket by bucket from the end of the buffer down (as backward reports). */
  size_t hi = c->total;
  for (int i = 0; i < BUCKETS; i++) {
    size_t n = bucket_len(i);
    fl_tensor view;
    int64_t vs[1] = {(int64_t)n};
    if ((st = tensor_view(direct, hi - n, 1, vs, &view)) != FL_OK) goto done;
    if (n && (st = fl_comm_allreduce(job->comm, &view, FL_REDUCE_AVG)) != FL_OK) goto done;
    hi -= n;
  }
  /* The same buckets through the worker. */
  if ((st = comm_worker_start(job->comm, &w)) != FL_OK) goto done;
  hi = c->total;
  for (int i = 0; i < BUCKETS; i++) {
    size_t n = bucket_len(i);
    fl_tensor view;
    int64_t vs[1] = {(int64_t)n};
    if ((st = tensor_view(via_worker, hi - n, 1, vs, &view)) != FL_OK) goto done;
    if ((st = comm_worker_post(w, &view, FL_REDUCE_AVG)) != FL_OK) goto done;
    hi -= n;
  }
  if ((st = comm_worker_wait(w)) != FL_OK) goto done;
  uint64_t nonempty = 0;
  for (int i = 0; i < BUCKETS; i++) nonempty += bucket_len(i) > 0;
  if (comm_worker_reduced(w) != nonempty) {
    st = fl_set_error(FL_EINTERNAL, "the worker reduced %llu buckets, not %llu",
                      (unsigned long long)comm_worker_reduced(w), (unsigned long long)nonempty);
    goto done;
  }
  for (size_t i = 0; i < c->total; i++)
    if (memcmp(&via_worker->data[i], &direct->data[i], sizeof(float)) != 0) {
      st = fl_set_error(FL_EINTERNAL, "element %zu: %.9g through the worker, %.9g directly", i,
                        (double)via_worker->data[i], (double)direct->data[i]);
      goto done;
    }
  /* After the wait the communicator is this thread's again. */
  st = fl_comm_barrier(job->comm);
done:
  comm_worker_stop(w);
  fl_tensor_destroy(direct);
  fl_tensor_destroy(via_worker);
  return st;
}

static void test_results_equal_synchronous(void **state) {
  (void)state;
  size_t total = 0;
  for (int i = 0; i < BUCKETS; i++) total += bucket_len(i);
  static const fl_allreduce_algo algos[] = {FL_ALLREDUCE_AUTO, FL_ALLREDUCE_RING, FL_ALLREDUCE_TREE};
  for (int size = 1; size <= MAX_RANKS; size++) {
    for (size_t a = 0; a < sizeof algos / sizeof *algos; a++) {
      group g;
      group_create(&g, size);
      results_case c = {.total = total, .algo = algos[a]};
      rank_job jobs[MAX_RANKS];
      run_ranks(size, g.comms, compare_rank, &c, jobs);
      for (int r = 0; r < size; r++) {
        if (jobs[r].status != FL_OK)
          fprintf(stderr, "%d ranks, %s, rank %d: %s\n", size, fl_allreduce_algo_name(algos[a]), r, jobs[r].msg);
        assert_int_equal(jobs[r].status, FL_OK);
      }
      group_destroy(&g);
    }
  }
}

/* ---- a peer that leaves ---------------------------------------------------------------------- */

/* Rank 1 reduces the first bucket with rank 0, then leaves; rank 0 has posted three. */
static fl_status leave_after_one(rank_job *job) {
  int64_t shape[1] = {1 << 16};
  fl_tensor *t = NULL;
  comm_worker *w = NULL;
  fl_status st = fl_tensor_create(cpu, 1, shape, &t);
  if (st != FL_OK) return st;
  fl_tensor bucket[3];
  int64_t quarter[1] = {shape[0] / 4};
  for (int i = 0; i < 3 && st == FL_OK; i++) st = tensor_view(t, (size_t)i * (size_t)quarter[0], 1, quarter, &bucket[i]);
  if (st == FL_OK) st = comm_worker_start(job->comm, &w);
  if (st != FL_OK) goto done;
  if (job->rank == 1) {
    st = comm_worker_post(w, &bucket[0], FL_REDUCE_AVG);
    if (st == FL_OK) st = comm_worker_wait(w);
    comm_worker_stop(w);
    w = NULL;
    fl_comm_destroy(job->comm); /* leaves: its sockets close */
    job->comm = NULL;
    goto done;
  }
  for (int i = 0; i < 3 && st == FL_OK; i++) st = comm_worker_post(w, &bucket[i], FL_REDUCE_AVG);
  /* A post may already see the failure; the wait must report it either way. */
  fl_status waited = comm_worker_wait(w);
  if (waited == FL_OK) {
    st = fl_set_error(FL_EINTERNAL, "the wait succeeded although rank 1 left");
    goto done;
  }
  char msg[512];
  snprintf(msg, sizeof msg, "%s", fl_last_error());
  /* Kept: a later post fails at once with the same error. */
  fl_status again = comm_worker_post(w, &bucket[0], FL_REDUCE_AVG);
  if (again != waited || !strstr(fl_last_error(), "communication thread")) {
    st = fl_set_error(FL_EINTERNAL, "not kept: %s then %s (%s)", fl_status_name(waited), fl_status_name(again),
                      fl_last_error());
    goto done;
  }
  st = fl_set_error(waited, "%s", msg);
done:
  comm_worker_stop(w);
  fl_tensor_destroy(t);
  return st;
}

static void test_peer_leaves(void **state) {
  (void)state;
  group g;
  group_create(&g, 2);
  rank_job jobs[MAX_RANKS];
  run_ranks(2, g.comms, leave_after_one, NULL, jobs);
  g.comms[1] = NULL; /* destroyed by its rank */
  if (jobs[1].status != FL_OK) fprintf(stderr, "rank 1: %s\n", jobs[1].msg);
  assert_int_equal(jobs[1].status, FL_OK);
  fprintf(stderr, "  rank 0: %s in %.3f s: %s\n", fl_status_name(jobs[0].status), jobs[0].seconds, jobs[0].msg);
  assert_true(jobs[0].status == FL_EPEER || jobs[0].status == FL_ENET);
  assert_non_null(strstr(jobs[0].msg, "communication thread"));
  assert_non_null(strstr(jobs[0].msg, "fl_comm_allreduce"));
  assert_non_null(strstr(jobs[0].msg, "rank 1"));
  /* No waiting for a timeout (FLINT_COMM_TIMEOUT_MS is 300 s): the closed sockets tell. */
  assert_true(jobs[0].seconds < 10.0);
  group_destroy(&g);
}

static void test_stop(void **state) {
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

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  if (fl_device_open(FL_DEVICE_CPU, 0, &cpu) != FL_OK) {
    fprintf(stderr, "cpu device: %s\n", fl_last_error());
    return 1;
  }
  const struct CMUnitTest tests[] = {
      T(test_results_equal_synchronous),
      T(test_peer_leaves),
      T(test_stop),
  };
  int failed = cmocka_run_group_tests_name("gpu_comm_worker", tests, NULL, NULL);
  fl_device_close(cpu);
  return failed;
}
