/*
 * gpu/comm/comm.h: collectives inside gpu/, what the rest of gpu/ (and tests and benchmarks)
 * may use of gpu/comm/ beyond the public fl_comm_* calls of flint/gpu.h: the rules that pick
 * an algorithm and lay out blocks, the host backend's socket options and single-copy count,
 * and the comm worker that overlaps allreduces with backward.
 *
 * The public entry points (gpu/comm/comm.c) validate their arguments in one place, keep a
 * failure on the handle and dispatch to a backend, which is a small vtable with a name
 * (gpu/comm/backend.h): "host" (TCP between ranks, gpu/comm/host.c over the transport of
 * gpu/comm/host_transport.h, one file per algorithm) and "nccl" (gpu/comm/nccl.c, only when
 * CUDA is built).
 *
 * Threading: a communicator is used by one thread at a time (its rank's thread, or the rank's
 * communication thread while that holds it: the comm worker below).
 */
#ifndef FLINT_GPU_COMM_H
#define FLINT_GPU_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"
#include "gpu/device/device.h"

/* The algorithm an allreduce of `bytes` runs on c: the one set with fl_comm_set_allreduce_algo,
 * or AUTO's choice for this communicator, the least predicted time of the cost model
 * (gpu/comm/cost_model.h) with the parameters measured when c formed. Every rank of a group
 * gets the same answer. */
fl_allreduce_algo comm_pick_algo(const fl_comm *c, size_t bytes);

/* The cost model for planners that predict groups they have not formed (gpu/parallel/plan.h).
 * Its parameters (gpu/comm/cost_model.h) are opaque here: a copy of those c measured when it
 * formed (c NULL: the defaults used without calibration), to be released with common_free;
 * NULL when out of memory. */
typedef struct comm_cost_params comm_cost_params;
comm_cost_params *comm_cost_params_of(const fl_comm *c);
/* Predicted seconds, by p, of an allreduce of `bytes` over `ranks` ranks on one host (by
 * AUTO's algorithm, the least predicted), and of one message of `bytes` between two of them
 * (latency plus the bytes at the link's rate). 0 for no bytes or fewer than 2 ranks. */
double comm_cost_predict_allreduce(const comm_cost_params *p, int ranks, size_t bytes);
double comm_cost_predict_message(const comm_cost_params *p, size_t bytes);

/* Element types a collective may carry on the wire: the public calls move fp32; the
 * gradient-compression hooks (gpu/parallel/) also allreduce 16-bit floats. */
typedef enum comm_dtype { COMM_F32 = 0, COMM_F16, COMM_BF16 } comm_dtype;
typedef enum comm_half_kind { COMM_HALF_FP16 = COMM_F16, COMM_HALF_BF16 = COMM_BF16 } comm_half_kind;

/* IEEE half and bfloat16 from and to fp32, rounding to nearest even (NaN stays NaN). */
static inline float comm_f16_to_f32(uint16_t h) {
  _Float16 x;
  __builtin_memcpy(&x, &h, 2);
  return (float)x;
}
static inline uint16_t comm_f32_to_f16(float f) {
  _Float16 x = (_Float16)f;
  uint16_t h;
  __builtin_memcpy(&h, &x, 2);
  return h;
}
static inline float comm_bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t comm_f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* The same over n elements (gpu/comm/reduce.c: fp16 by the F16C instructions where the CPU
 * has them, the same bits as the scalar casts). */
void comm_half_from_f32(comm_half_kind kind, uint16_t *dst, const float *src, size_t n);
void comm_half_to_f32(comm_half_kind kind, float *dst, const uint16_t *src, size_t n);
/* dst += src over n 16-bit elements, summed in fp32 and rounded back. */
void comm_reduce_add_half(comm_half_kind kind, uint16_t *dst, const uint16_t *src, size_t n);

/* Allreduce (sum) of n 16-bit floats in host memory at `data`, in place: each step sums in
 * fp32 and rounds back, so the result is within the format's rounding of the fp32 sum. The
 * host backend runs its ring (half the bytes of an fp32 allreduce); other backends
 * FL_EINVAL. Blocks; a failure is sticky as for the public calls. */
fl_status comm_allreduce_half(fl_comm *c, uint16_t *data, size_t n, comm_half_kind kind);

/* The uneven block rule of reduce_scatter: block r of n over p is n/p elements, plus one
 * when r < n % p. */
static inline size_t comm_block_count(size_t n, int p, int r) {
  return n / (size_t)p + ((size_t)r < n % (size_t)p ? 1 : 0);
}
static inline size_t comm_block_offset(size_t n, int p, int r) {
  size_t q = n / (size_t)p, m = n % (size_t)p;
  return q * (size_t)r + ((size_t)r < m ? (size_t)r : m);
}

/* ---- the host backend (gpu/comm/host.c, gpu/comm/host_mesh.c) ----------------------------- */
/* TCP_NODELAY and FLINT_COMM_SOCKBUF-sized buffers: what every comm socket gets (the
 * benchmark's point-to-point baseline uses it too). */
void comm_host_socket_options(int fd);
/* How many peers this rank's ring steps reach by a single copy (0 on other backends). */
int comm_host_single_copy_peers(const fl_comm *c);
/* How many peers this rank talks to through shared-memory rings (0 on other backends). */
int comm_host_shm_peers(const fl_comm *c);

/* ---- the comm worker (gpu/comm/worker.c) --------------------------------------------------
 * A communication thread that allreduces tensors in the order they are posted, so that the
 * posting thread can go on computing (the data-parallel trainer posts gradient buckets
 * during backward: PyTorch DDP's overlap).
 *
 * Design. One worker per rank owns its communicator while work is queued: the rank's thread
 * posts (a bounded FIFO; post blocks while it is full), the worker takes each tensor in turn
 * and calls fl_comm_allreduce on it, and the rank's thread calls comm_worker_wait before it
 * reads the results. Every rank posts the same tensors in the same order, so the collectives
 * match across ranks as if the rank's thread had called them itself, and each tensor is
 * reduced by the same algorithm over the same bytes: the results are bit for bit those of
 * the synchronous calls.
 *
 * Threading. A communicator is used by one thread at a time (above): between the first post
 * and the wait that follows it, only the worker may touch the communicator; after that
 * wait (and before the next post) the posting thread may use it directly (evaluation sums,
 * checkpoints). The tensors posted must stay allocated, and nothing may write them, until
 * the wait returns.
 *
 * Devices. comm_worker_post first waits for the tensor's device (synchronize), so the worker
 * reads final values even where the producing kernels were only queued (cuda). The worker
 * then reaches the device from its own thread only through the communicator's backend: the
 * host backend stages a cuda tensor with to_host / from_host, NCCL synchronizes the device
 * before it queues on its own stream. Those cuda operations start with cudaSetDevice (the
 * current device is per thread) and queue on the device's stream, whose order the CUDA
 * runtime keeps across threads; the copy back lands among kernels that the posting thread
 * queued after the post, which never touch a range that was final (gpu/nn/nn.h), and from_host
 * blocks until it is done, so the wait orders it before anything the poster queues next.
 *
 * Errors. The first failure of an allreduce is kept on the worker, with its message: later
 * posts return it at once (so backward can stop early), queued tensors are not reduced, and
 * every wait returns it. The communicator keeps it too (sticky), so a worker that failed is
 * done; the rank's attempt fails and its stage is retried. A wait is bounded by the
 * communicator's own failure detection: a peer that leaves is FL_EPEER at once, a peer that
 * hangs FL_ETIMEDOUT after FLINT_COMM_TIMEOUT_MS (host backend).
 */
typedef struct comm_worker comm_worker;

/* Starts the worker's thread for `comm` (not owned: destroy it after comm_worker_stop).
 * FL_ENOMEM, or FL_EINTERNAL naming pthread_create's failure. */
fl_status comm_worker_start(fl_comm *comm, comm_worker **out);
/* Queues an allreduce of t with `op`. t is copied (a view is fine); its memory is the
 * worker's until the next comm_worker_wait. Synchronizes t's device first; blocks while the
 * queue is full. An error return (the worker's kept failure, or the device's) means t was not
 * queued. A tensor of 0 elements is accepted and skipped. */
fl_status comm_worker_post(comm_worker *w, const fl_tensor *t, fl_reduce_op op);
/* A job the worker runs in place of an allreduce: fn(comm, t, user) on the worker's thread,
 * in posting order among the allreduces (the trainer's gradient compression hooks, which
 * reduce a bucket their own way). fn may call any collective on comm; its failure is kept as
 * an allreduce's. */
typedef fl_status (*comm_worker_fn)(fl_comm *comm, fl_tensor *t, void *user);
/* As comm_worker_post, with fn run instead of the allreduce; user must outlive the wait. */
fl_status comm_worker_post_fn(comm_worker *w, const fl_tensor *t, comm_worker_fn fn, void *user);
/* Blocks until every posted tensor is reduced. FL_OK, or the first failure since the worker
 * started, with its message (fl_last_error). */
fl_status comm_worker_wait(comm_worker *w);
/* Tensors reduced since the worker started (for tests and reports). Takes the lock. */
uint64_t comm_worker_reduced(comm_worker *w);
/* Cancels what is queued and not yet started, waits for the allreduce in progress (if any)
 * and joins the thread. Never blocks on more than that one collective. NULL does nothing. */
void comm_worker_stop(comm_worker *w);

#endif /* FLINT_GPU_COMM_H */
