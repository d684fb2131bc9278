/*
 * gpu/comm/nccl.c: the NCCL backend, one GPU per rank. Compiled only when CUDA is built.
 *
 * Design: the communicator owns its own CUDA stream on the rank's GPU, so that it depends on
 * nothing inside the cuda device but its ordinal. Each collective first waits for the
 * device's queued work (dev->ops->synchronize: the tensor's contents are final), queues the
 * NCCL call on the communicator's stream and waits for that stream, so the tensor is ready
 * for the device's next operation when the call returns. Correct first: a later version can
 * order the two streams with an event instead of blocking the host.
 *
 * NCCL's reduce-scatter needs equal blocks; flint's rule gives rank r n/p elements, plus one
 * when r < n % p. Uneven sizes therefore go through a padded copy: block r is copied to
 * r x ceil(n/p) in a scratch buffer whose tails are zero, NCCL reduce-scatters ceil(n/p) per
 * rank, and each rank keeps the first count_r elements of its block.
 *
 * Errors: an NCCL or CUDA failure is FL_EDEVICE naming the call (FL_EPEER for NCCL's remote
 * error); gpu/comm/comm.c keeps it on the handle and calls abort, which is ncclCommAbort.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/comm.h"

_Static_assert(FL_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "FL_NCCL_ID_BYTES must match NCCL");

typedef struct nccl_impl {
  ncclComm_t comm;
  cudaStream_t stream;
  int ordinal;
  bool aborted;
  void *scratch; /* device memory for the padded reduce-scatter */
  size_t scratch_bytes;
} nccl_impl;

static fl_status nccl_fail(ncclResult_t r, const char *call, int ordinal) {
  return fl_set_error(r == ncclRemoteError ? FL_EPEER : FL_EDEVICE, "%s on cuda:%d: %s (%s)",
                      call, ordinal, ncclGetErrorString(r),
                      r == ncclRemoteError ? "a peer rank failed" : "NCCL");
}

static fl_status cuda_fail(cudaError_t e, const char *call, int ordinal) {
  return fl_set_error(FL_EDEVICE, "%s on cuda:%d: %s", call, ordinal, cudaGetErrorString(e));
}

#define NCCL_TRY(call)                                                                       \
  do {                                                                                       \
    ncclResult_t nccl_r_ = (call);                                                           \
    if (nccl_r_ != ncclSuccess) return nccl_fail(nccl_r_, #call, impl->ordinal);             \
  } while (0)
#define CUDA_TRY(call)                                                                       \
  do {                                                                                       \
    cudaError_t cuda_e_ = (call);                                                            \
    if (cuda_e_ != cudaSuccess) return cuda_fail(cuda_e_, #call, impl->ordinal);             \
  } while (0)

static nccl_impl *impl_of(fl_comm *c) { return c->impl; }

/* Before a collective: the device's queued work is done, and NCCL runs on our GPU. */
static fl_status begin(fl_comm *c) {
  nccl_impl *impl = impl_of(c);
  fl_status st = c->dev->ops->synchronize(c->dev);
  if (st != FL_OK) return st;
  CUDA_TRY(cudaSetDevice(impl->ordinal));
  return FL_OK;
}

/* After: the stream has finished, and no asynchronous NCCL error is pending. */
static fl_status end(fl_comm *c) {
  nccl_impl *impl = impl_of(c);
  CUDA_TRY(cudaStreamSynchronize(impl->stream));
  ncclResult_t async = ncclSuccess;
  NCCL_TRY(ncclCommGetAsyncError(impl->comm, &async));
  if (async != ncclSuccess) return nccl_fail(async, "ncclCommGetAsyncError", impl->ordinal);
  return FL_OK;
}

static fl_status nccl_allreduce(fl_comm *c, fl_tensor *t, fl_reduce_op op) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (t->numel)
    NCCL_TRY(ncclAllReduce(t->data, t->data, t->numel, ncclFloat32,
                           op == FL_REDUCE_AVG ? ncclAvg : ncclSum, impl->comm, impl->stream));
  return end(c);
}

static fl_status nccl_broadcast(fl_comm *c, fl_tensor *t, int root) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (t->numel)
    NCCL_TRY(ncclBroadcast(t->data, t->data, t->numel, ncclFloat32, root, impl->comm, impl->stream));
  return end(c);
}

static fl_status nccl_allgather(fl_comm *c, const fl_tensor *in, fl_tensor *out) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (in->numel)
    NCCL_TRY(ncclAllGather(in->data, out->data, in->numel, ncclFloat32, impl->comm, impl->stream));
  return end(c);
}

static fl_status scratch(nccl_impl *impl, size_t bytes, void **out) {
  if (impl->scratch_bytes < bytes) {
    if (impl->scratch) (void)cudaFree(impl->scratch);
    impl->scratch = NULL;
    impl->scratch_bytes = 0;
    CUDA_TRY(cudaMalloc(&impl->scratch, bytes));
    impl->scratch_bytes = bytes;
  }
  *out = impl->scratch;
  return FL_OK;
}

static fl_status nccl_reduce_scatter(fl_comm *c, const fl_tensor *in, fl_tensor *out,
                                     fl_reduce_op op) {
  nccl_impl *impl = impl_of(c);
  int p = c->size;
  size_t n = in->numel, per = (n + (size_t)p - 1) / (size_t)p;
  ncclRedOp_t rop = op == FL_REDUCE_AVG ? ncclAvg : ncclSum;
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (per == 0) return end(c);
  if (n % (size_t)p == 0) {
    NCCL_TRY(ncclReduceScatter(in->data, out->data, per, ncclFloat32, rop, impl->comm, impl->stream));
    return end(c);
  }
  /* Uneven: a padded copy (input blocks at r x per, zero tails), then even blocks; the
   * output block lands after the input in the same scratch. */
  void *s = NULL;
  st = scratch(impl, (size_t)(p + 1) * per * sizeof(float), &s);
  if (st != FL_OK) return st;
  float *padded = s, *mine = padded + (size_t)p * per;
  CUDA_TRY(cudaMemsetAsync(padded, 0, (size_t)p * per * sizeof(float), impl->stream));
  for (int r = 0; r < p; r++) {
    size_t cnt = comm_block_count(n, p, r);
    if (cnt)
      CUDA_TRY(cudaMemcpyAsync(padded + (size_t)r * per, in->data + comm_block_offset(n, p, r),
                               cnt * sizeof(float), cudaMemcpyDeviceToDevice, impl->stream));
  }
  NCCL_TRY(ncclReduceScatter(padded, mine, per, ncclFloat32, rop, impl->comm, impl->stream));
  if (out->numel)
    CUDA_TRY(cudaMemcpyAsync(out->data, mine, out->numel * sizeof(float),
                             cudaMemcpyDeviceToDevice, impl->stream));
  return end(c);
}

/* All-to-all: one NCCL group of a send and a receive per peer (NCCL's own recipe), and the
 * block for this rank copied on the stream. A failure inside the group still ends it. */
static fl_status nccl_alltoall(fl_comm *c, const fl_tensor *in, fl_tensor *out) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  size_t m = in->numel / (size_t)c->size;
  if (m == 0) return end(c);
  const float *src = in->data;
  float *dst = out->data;
  CUDA_TRY(cudaMemcpyAsync(dst + (size_t)c->rank * m, src + (size_t)c->rank * m, m * sizeof(float),
                           cudaMemcpyDeviceToDevice, impl->stream));
  NCCL_TRY(ncclGroupStart());
  ncclResult_t r = ncclSuccess;
  for (int peer = 0; peer < c->size && r == ncclSuccess; peer++) {
    if (peer == c->rank) continue;
    r = ncclSend(src + (size_t)peer * m, m, ncclFloat32, peer, impl->comm, impl->stream);
    if (r == ncclSuccess) r = ncclRecv(dst + (size_t)peer * m, m, ncclFloat32, peer, impl->comm, impl->stream);
  }
  ncclResult_t e = ncclGroupEnd();
  NCCL_TRY(r != ncclSuccess ? r : e);
  return end(c);
}

static fl_status nccl_send(fl_comm *c, const fl_tensor *t, int peer) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (t->numel) NCCL_TRY(ncclSend(t->data, t->numel, ncclFloat32, peer, impl->comm, impl->stream));
  return end(c);
}

static fl_status nccl_recv(fl_comm *c, fl_tensor *t, int peer) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  if (t->numel) NCCL_TRY(ncclRecv(t->data, t->numel, ncclFloat32, peer, impl->comm, impl->stream));
  return end(c);
}

/* NCCL has no barrier: an allreduce of one float, waited for, is one. */
static fl_status nccl_barrier(fl_comm *c) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  void *s = NULL;
  st = scratch(impl, sizeof(float), &s);
  if (st != FL_OK) return st;
  NCCL_TRY(ncclAllReduce(s, s, 1, ncclFloat32, ncclSum, impl->comm, impl->stream));
  return end(c);
}

static const comm_backend_ops nccl_ops;

static fl_status wrap(fl_device *dev, int rank, int size, ncclComm_t comm, fl_comm **out) {
  nccl_impl *impl = common_calloc(1, sizeof *impl);
  if (!impl) return FL_ERR(FL_ENOMEM, "out of memory for an NCCL communicator");
  impl->comm = comm;
  impl->ordinal = dev->ordinal;
  cudaError_t e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    common_free(impl);
    return cuda_fail(e, "cudaStreamCreateWithFlags", dev->ordinal);
  }
  fl_status st = comm_alloc(&nccl_ops, rank, size, impl, out);
  if (st != FL_OK) {
    (void)cudaStreamDestroy(impl->stream);
    common_free(impl);
    return st;
  }
  (*out)->dev = dev;
  return FL_OK;
}

static fl_status nccl_split(fl_comm *c, int color, int key, fl_comm **out) {
  nccl_impl *impl = impl_of(c);
  fl_status st = begin(c);
  if (st != FL_OK) return st;
  ncclComm_t sub = NULL;
  NCCL_TRY(ncclCommSplit(impl->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, NULL));
  if (!sub) {
    *out = NULL;
    return FL_OK;
  }
  int rank = 0, size = 0;
  ncclResult_t r = ncclCommUserRank(sub, &rank);
  if (r == ncclSuccess) r = ncclCommCount(sub, &size);
  if (r != ncclSuccess) {
    (void)ncclCommDestroy(sub);
    return nccl_fail(r, "ncclCommUserRank/ncclCommCount", impl->ordinal);
  }
  st = wrap(c->dev, rank, size, sub, out);
  if (st != FL_OK) (void)ncclCommDestroy(sub);
  else (*out)->algo = c->algo;
  return st;
}

static void nccl_abort(fl_comm *c) {
  nccl_impl *impl = impl_of(c);
  if (!impl->aborted) (void)ncclCommAbort(impl->comm);
  impl->aborted = true;
}

static void nccl_destroy(fl_comm *c) {
  nccl_impl *impl = impl_of(c);
  (void)cudaSetDevice(impl->ordinal);
  if (!impl->aborted) {
    (void)cudaStreamSynchronize(impl->stream);
    (void)ncclCommDestroy(impl->comm);
  }
  if (impl->scratch) (void)cudaFree(impl->scratch);
  (void)cudaStreamDestroy(impl->stream);
  common_free(impl);
}

static const comm_backend_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .alltoall = nccl_alltoall,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

FL_API fl_status fl_comm_nccl_unique_id(uint8_t id[FL_NCCL_ID_BYTES]) {
  if (!id) return fl_set_error(FL_EINVAL, "fl_comm_nccl_unique_id: id is NULL");
  ncclUniqueId uid;
  ncclResult_t r = ncclGetUniqueId(&uid);
  if (r != ncclSuccess)
    return fl_set_error(FL_EDEVICE, "ncclGetUniqueId: %s", ncclGetErrorString(r));
  memcpy(id, uid.internal, FL_NCCL_ID_BYTES);
  return FL_OK;
}

FL_API fl_status fl_comm_nccl_create(fl_device *dev, int rank, int size,
                                     const uint8_t id[FL_NCCL_ID_BYTES], fl_comm **out) {
  static const char fn[] = "fl_comm_nccl_create";
  if (!dev || !id || !out) return fl_set_error(FL_EINVAL, "%s: NULL argument", fn);
  if (dev->kind != FL_DEVICE_CUDA)
    return fl_set_error(FL_EINVAL, "%s: the NCCL backend needs a cuda device, not %s", fn, dev->name);
  if (size < 1 || rank < 0 || rank >= size)
    return fl_set_error(FL_EINVAL, "%s: rank %d is outside 0..%d", fn, rank, size - 1);
  cudaError_t e = cudaSetDevice(dev->ordinal);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice", dev->ordinal);
  ncclUniqueId uid;
  memcpy(uid.internal, id, FL_NCCL_ID_BYTES);
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, size, uid, rank);
  if (r != ncclSuccess)
    return fl_set_error(r == ncclRemoteError ? FL_EPEER : FL_EDEVICE,
                        "%s: ncclCommInitRank (rank %d of %d on cuda:%d): %s", fn, rank, size,
                        dev->ordinal, ncclGetErrorString(r));
  fl_status st = wrap(dev, rank, size, comm, out);
  if (st != FL_OK) (void)ncclCommDestroy(comm);
  return st;
}
