/*
 * test_gpu_nccl.c: collectives on cuda tensors. Exits 77 (skipped) without a usable GPU.
 *
 * - The NCCL backend with one rank on GPU 0 (and with one rank per GPU, as threads, when
 *   the machine has two or more): allreduce, broadcast, allgather, reduce-scatter (uneven),
 *   split, equal to the serial results.
 * - The host backend with 2 and 3 ranks as threads that share GPU 0: every collective on
 *   cuda tensors goes through pinned host memory and equals the serial sum.
 * Inputs are small integers held as floats, so sums are exact and compared bit for bit.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "flint/gpu.h"
#include "gpu/comm/comm.h"

#define MAX_RANKS 8

static float value(int r, size_t i) { return (float)((int)((i * 2654435761u + (size_t)r * 97u) % 29u) - 14); }

static fl_tensor *make(fl_device *dev, size_t n, int fill_rank) {
  int64_t shape[1] = {(int64_t)n};
  fl_tensor *t;
  must_ok(fl_tensor_create(dev, 1, shape, &t));
  if (fill_rank >= 0 && n) {
    float *buf = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) buf[i] = value(fill_rank, i);
    must_ok(fl_tensor_write(t, buf, n));
    free(buf);
  }
  return t;
}

static float *readback(const fl_tensor *t) {
  size_t n = fl_tensor_numel(t);
  float *buf = malloc(n * sizeof(float) + 4);
  if (n) must_ok(fl_tensor_read(t, buf, n));
  return buf;
}

/* Every collective on `comm` (rank r of p), checked against serial results. */
static fl_status check_all(fl_comm *comm, fl_device *dev, size_t n) {
  int r = fl_comm_rank(comm), p = fl_comm_size(comm);
  fl_status st;
  /* allreduce, sum and avg */
  for (int op = 0; op < 2; op++) {
    fl_tensor *t = make(dev, n, r);
    if ((st = fl_comm_allreduce(comm, t, (fl_reduce_op)op)) != FL_OK) return st;
    float *got = readback(t);
    for (size_t i = 0; i < n; i++) {
      float s = 0;
      for (int q = 0; q < p; q++) s += value(q, i);
      if (op == FL_REDUCE_AVG) s /= (float)p;
      if (op == FL_REDUCE_AVG ? (got[i] - s > 1e-5f || s - got[i] > 1e-5f) : got[i] != s)
        return fl_set_error(FL_EINTERNAL, "allreduce op %d rank %d: [%zu] = %g, want %g", op, r, i, got[i], s);
    }
    free(got);
    fl_tensor_destroy(t);
  }
  /* broadcast from the last rank */
  fl_tensor *t = make(dev, n, r);
  if ((st = fl_comm_broadcast(comm, t, p - 1)) != FL_OK) return st;
  float *got = readback(t);
  for (size_t i = 0; i < n; i++)
    if (got[i] != value(p - 1, i)) return fl_set_error(FL_EINTERNAL, "broadcast rank %d: [%zu]", r, i);
  free(got);
  fl_tensor_destroy(t);
  /* allgather */
  fl_tensor *in = make(dev, n, r), *out = make(dev, n * (size_t)p, -1);
  if ((st = fl_comm_allgather(comm, in, out)) != FL_OK) return st;
  got = readback(out);
  for (size_t i = 0; i < n * (size_t)p; i++)
    if (got[i] != value((int)(i / n), i % n)) return fl_set_error(FL_EINTERNAL, "allgather rank %d: [%zu]", r, i);
  free(got);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  /* reduce-scatter with this rank's uneven block */
  size_t cnt = comm_block_count(n, p, r), off = comm_block_offset(n, p, r);
  in = make(dev, n, r);
  out = make(dev, cnt, -1);
  if ((st = fl_comm_reduce_scatter(comm, in, out, FL_REDUCE_SUM)) != FL_OK) return st;
  got = readback(out);
  for (size_t i = 0; i < cnt; i++) {
    float s = 0;
    for (int q = 0; q < p; q++) s += value(q, off + i);
    if (got[i] != s) return fl_set_error(FL_EINTERNAL, "reduce_scatter rank %d: [%zu] = %g, want %g", r, i, got[i], s);
  }
  free(got);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  /* all-to-all: this rank's block for rank q is value(r*p + q, i) */
  float *buf = malloc(n * (size_t)p * sizeof(float) + 4);
  for (int q = 0; q < p; q++)
    for (size_t i = 0; i < n; i++) buf[(size_t)q * n + i] = value(r * p + q, i);
  in = make(dev, n * (size_t)p, -1);
  out = make(dev, n * (size_t)p, -1);
  if (n) must_ok(fl_tensor_write(in, buf, n * (size_t)p));
  free(buf);
  if ((st = fl_comm_alltoall(comm, in, out)) != FL_OK) return st;
  got = readback(out);
  for (int q = 0; q < p; q++)
    for (size_t i = 0; i < n; i++)
      if (got[(size_t)q * n + i] != value(q * p + r, i))
        return fl_set_error(FL_EINTERNAL, "alltoall rank %d: block %d [%zu]", r, q, i);
  free(got);
  fl_tensor_destroy(in);
  fl_tensor_destroy(out);
  return fl_comm_barrier(comm);
}

/* ---- NCCL -------------------------------------------------------------------------------- */

typedef struct nccl_rank {
  int rank, size;
  const uint8_t *id;
  fl_status status;
  char msg[512];
} nccl_rank;

static void *nccl_main(void *arg) {
  nccl_rank *nr = arg;
  fl_device *dev = NULL;
  fl_comm *comm = NULL, *sub = NULL;
  fl_status st = fl_device_open(FL_DEVICE_CUDA, nr->rank, &dev);
  if (st == FL_OK) st = fl_comm_nccl_create(dev, nr->rank, nr->size, nr->id, &comm);
  if (st == FL_OK && strcmp(fl_comm_backend(comm), "nccl") != 0) st = FL_EINTERNAL;
  static const size_t sizes[] = {1, 7, 1000, 65537, 1u << 20};
  for (size_t s = 0; s < 5 && st == FL_OK; s++) st = check_all(comm, dev, sizes[s]);
  if (st == FL_OK) st = fl_comm_split(comm, nr->rank % 2, 0, &sub);
  if (st == FL_OK && sub) st = check_all(sub, dev, 1001);
  nr->status = st;
  snprintf(nr->msg, sizeof nr->msg, "%s", st ? fl_last_error() : "");
  fl_comm_destroy(sub);
  fl_comm_destroy(comm);
  fl_device_close(dev);
  return NULL;
}

static void run_nccl(int size) {
  uint8_t id[FL_NCCL_ID_BYTES];
  assert_ok(fl_comm_nccl_unique_id(id));
  nccl_rank nr[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  for (int r = 0; r < size; r++) {
    nr[r] = (nccl_rank){.rank = r, .size = size, .id = id};
    assert_int_equal(pthread_create(&th[r], NULL, nccl_main, &nr[r]), 0);
  }
  for (int r = 0; r < size; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
  for (int r = 0; r < size; r++) {
    if (nr[r].status) fprintf(stderr, "nccl rank %d of %d: %s\n", r, size, nr[r].msg);
    assert_int_equal(nr[r].status, FL_OK);
  }
}

static void test_nccl_one_rank(void **state) {
  (void)state;
  run_nccl(1);
}

static void test_nccl_ranks_per_gpu(void **state) {
  (void)state;
  int gpus = fl_cuda_device_count();
  if (gpus < 2) skip();
  run_nccl(gpus > MAX_RANKS ? MAX_RANKS : gpus);
}

static void test_nccl_bad_arguments(void **state) {
  (void)state;
  fl_device *cpu;
  fl_comm *comm;
  uint8_t id[FL_NCCL_ID_BYTES];
  assert_ok(fl_comm_nccl_unique_id(id));
  assert_ok(fl_device_open(FL_DEVICE_CPU, 0, &cpu));
  assert_fails_with(fl_comm_nccl_create(cpu, 0, 1, id, &comm), FL_EINVAL, "cuda device");
  fl_device_close(cpu);
}

/* ---- the host backend on cuda tensors, ranks sharing GPU 0 ---------------------------------- */

typedef struct host_rank {
  int rank, size;
  fl_comm_endpoint *ep;
  const char *const *addrs;
  fl_status status;
  char msg[512];
} host_rank;

static void *host_main(void *arg) {
  host_rank *hr = arg;
  fl_device *dev = NULL;
  fl_comm *comm = NULL;
  fl_status st = fl_device_open(FL_DEVICE_CUDA, 0, &dev);
  if (st == FL_OK) st = fl_comm_host_create(hr->ep, hr->rank, hr->size, hr->addrs, 10000, &comm);
  else fl_comm_endpoint_destroy(hr->ep);
  static const size_t sizes[] = {1, 3, 1000, 65537, 1u << 20};
  for (int a = FL_ALLREDUCE_AUTO; a < FL_ALLREDUCE_ALGO_COUNT && st == FL_OK; a++) {
    st = fl_comm_set_allreduce_algo(comm, (fl_allreduce_algo)a);
    for (size_t s = 0; s < 5 && st == FL_OK; s++) st = check_all(comm, dev, sizes[s]);
  }
  hr->status = st;
  snprintf(hr->msg, sizeof hr->msg, "%s", st ? fl_last_error() : "");
  fl_comm_destroy(comm); /* before the device: its pinned staging buffers are the device's */
  fl_device_close(dev);
  return NULL;
}

static void test_host_staged_on_one_gpu(void **state) {
  (void)state;
  for (int p = 2; p <= 3; p++) {
    host_rank hr[MAX_RANKS];
    char addr[MAX_RANKS][96];
    const char *addrs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < p; r++) {
      hr[r] = (host_rank){.rank = r, .size = p, .addrs = addrs};
      assert_ok(fl_comm_listen("127.0.0.1", &hr[r].ep));
      snprintf(addr[r], sizeof addr[r], "%s", fl_comm_endpoint_address(hr[r].ep));
      addrs[r] = addr[r];
    }
    for (int r = 0; r < p; r++) assert_int_equal(pthread_create(&th[r], NULL, host_main, &hr[r]), 0);
    for (int r = 0; r < p; r++) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (int r = 0; r < p; r++) {
      if (hr[r].status) fprintf(stderr, "host rank %d of %d: %s\n", r, p, hr[r].msg);
      assert_int_equal(hr[r].status, FL_OK);
    }
  }
}

int main(void) {
  if (fl_cuda_device_count() < 1) {
    printf("test_gpu_nccl: no usable GPU, skipped\n");
    return 77;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nccl_bad_arguments),
      cmocka_unit_test(test_nccl_one_rank),
      cmocka_unit_test(test_nccl_ranks_per_gpu),
      cmocka_unit_test(test_host_staged_on_one_gpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
