/*
 * gpu.h: flint's training stack. fp32 tensors on a device (cpu or cuda), collectives
 * between ranks (host TCP or NCCL), and synchronous data-parallel training run as a barrier
 * stage over a cached dataset.
 *
 * Conventions are flint.h's: fl_status returns, fl_last_error() for the cause, out-parameters
 * last, create/destroy pairs where destroying NULL does nothing. Everything here builds
 * without CUDA; the cuda device then reports FL_EDEVICE when opened.
 */
#ifndef FLINT_GPU_H
#define FLINT_GPU_H

#include "flint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------
 * Devices. A device handle is used by one thread at a time (a rank's thread); the cuda
 * device owns a stream, a cuBLAS handle and a caching allocator.
 * ------------------------------------------------------------------------------------- */
typedef enum fl_device_kind { FL_DEVICE_CPU = 0, FL_DEVICE_CUDA = 1 } fl_device_kind;
typedef struct fl_device fl_device;

/* Opens the cpu device (ordinal ignored) or CUDA GPU `ordinal`. FL_ENODEVICE names the cause
 * when there is no such GPU to use (CUDA not built in, no driver, no GPU, no such ordinal);
 * FL_EDEVICE when the GPU is there but fails (out of memory, a CUDA error). */
FL_API fl_status fl_device_open(fl_device_kind kind, int ordinal, fl_device **out);
/* Waits for the device's pending work and frees it; its tensors must be destroyed first. */
FL_API void fl_device_close(fl_device *dev);
/* "cpu", "cuda" (GPU 0) or "cuda:N". FL_EINVAL names the text otherwise. */
FL_API fl_status fl_device_parse(const char *text, fl_device_kind *kind, int *ordinal);
/* GPUs usable by this process: 0 without CUDA or without a GPU. Never fails. */
FL_API int fl_cuda_device_count(void);
FL_API fl_device_kind fl_device_kind_of(const fl_device *dev);
/* "cpu" or "cuda:0 (NVIDIA H100 80GB HBM3)"; owned by the device. */
FL_API const char *fl_device_name(const fl_device *dev);
/* Blocks until the device has finished all work queued on it. */
FL_API fl_status fl_device_synchronize(fl_device *dev);

/* The precision of a device's matrix products: every linear layer, convolution (im2col and
 * a GEMM) and attention product. Tensors, activations, weights (the fp32 "master" copy) and
 * every other operation stay fp32; a product's inputs are rounded to the precision, it
 * accumulates and writes fp32. As torch.set_float32_matmul_precision does (tf32: "high";
 * bf16: "medium"), not as autocast, which also keeps activations in 16 bits: activation
 * memory is not halved here.
 * - FP32: cuBLAS's plain SGEMM, the default; the cpu device's only one.
 * - TF32: tensor cores with 10-bit mantissas (GPUs of compute capability 8.0+).
 * - BF16: inputs rounded to bfloat16 (8-bit mantissa, fp32's range), compute capability 8.0+.
 * - FP16: inputs rounded to half (11-bit mantissa, largest 65504), 7.0+. Small gradients
 *   underflow and large activations overflow: train with a loss scaler (fl_grad_scaler in
 *   flint/train.h; fl_train and `flint train --precision fp16` use one). */
typedef enum fl_precision {
  FL_PRECISION_FP32 = 0,
  FL_PRECISION_TF32 = 1,
  FL_PRECISION_BF16 = 2,
  FL_PRECISION_FP16 = 3,
} fl_precision;
/* Sets dev's precision for the operations queued after it; call it from the thread using the
 * device (as every device call). Does not block. FL_EINVAL for a value outside the enum or
 * for any but FP32 on the cpu device (naming both); FL_EDEVICE for a GPU too old for it
 * (naming its compute capability). */
FL_API fl_status fl_device_set_precision(fl_device *dev, fl_precision precision);
FL_API fl_precision fl_device_precision(const fl_device *dev);
/* "fp32", "tf32", "bf16", "fp16" (and "?" for other values); never NULL. */
FL_API const char *fl_precision_name(fl_precision precision);
/* The reverse of fl_precision_name; FL_EINVAL names the text otherwise. */
FL_API fl_status fl_precision_parse(const char *text, fl_precision *out);

/* ---------------------------------------------------------------------------------------
 * Tensors: dense, row-major fp32, 1 to 4 dimensions, on one device.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_tensor fl_tensor;
#define FL_TENSOR_MAX_DIMS 4

/* A zero-filled tensor. FL_EINVAL for a bad shape, FL_ENOMEM/FL_EDEVICE when the device is
 * out of memory. */
FL_API fl_status fl_tensor_create(fl_device *dev, int ndim, const int64_t *shape,
                                  fl_tensor **out);
FL_API void fl_tensor_destroy(fl_tensor *t);
FL_API int fl_tensor_ndim(const fl_tensor *t);
FL_API int64_t fl_tensor_dim(const fl_tensor *t, int axis);
FL_API size_t fl_tensor_numel(const fl_tensor *t);
FL_API fl_device *fl_tensor_device(const fl_tensor *t);
/* Copies `count` floats (must equal numel) from host memory into t, or from t to host. Both
 * block until the copy is done. */
FL_API fl_status fl_tensor_write(fl_tensor *t, const float *src, size_t count);
FL_API fl_status fl_tensor_read(const fl_tensor *t, float *dst, size_t count);


/* ---------------------------------------------------------------------------------------
 * Collectives. A communicator joins `size` ranks (threads or processes, one handle each);
 * every member calls each collective in the same order. A collective works on a tensor in
 * place, on any device: the host backend stages cuda tensors through pinned host memory, so
 * several ranks may share one GPU; the NCCL backend needs one GPU per rank. A failed or lost
 * peer is kept on the handle: every later call returns the same error (FL_ENET/FL_EPEER).
 * Calls block the calling thread until this rank's part is done.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_comm fl_comm;
typedef struct fl_comm_endpoint fl_comm_endpoint;

typedef enum fl_reduce_op { FL_REDUCE_SUM = 0, FL_REDUCE_AVG = 1 } fl_reduce_op;
/* Allreduce algorithms of the host backend (docs/collectives.md gives each one's steps and
 * bytes). AUTO picks the one a cost model calibrated when the communicator formed predicts
 * fastest for the message size and rank count. */
typedef enum fl_allreduce_algo {
  FL_ALLREDUCE_AUTO = 0,
  FL_ALLREDUCE_RING,             /* reduce-scatter then allgather around a ring */
  FL_ALLREDUCE_HALVING_DOUBLING, /* recursive halving (reduce-scatter), doubling (allgather) */
  FL_ALLREDUCE_TREE,             /* reduce up a binary tree, broadcast down it */
  FL_ALLREDUCE_NAIVE,            /* every rank sends its whole vector to every other one */
  FL_ALLREDUCE_PARAMETER_SERVER, /* reduce-scatter to each block's owner, then gather from it */
  FL_ALLREDUCE_DOUBLE_TREE,      /* two complementary binary trees, each carrying half */
  FL_ALLREDUCE_BUTTERFLY,        /* recursive doubling: whole vectors exchanged log2(p) times */
  FL_ALLREDUCE_HIERARCHICAL,     /* reduce within each host, ring across hosts, broadcast within */
} fl_allreduce_algo;
#define FL_ALLREDUCE_ALGO_COUNT 9
/* "auto", "ring", "halving-doubling", "tree", "naive", "parameter-server", "double-tree",
 * "butterfly", "hierarchical"; FL_EINVAL otherwise. */
FL_API fl_status fl_allreduce_algo_parse(const char *text, fl_allreduce_algo *out);
FL_API const char *fl_allreduce_algo_name(fl_allreduce_algo algo);

/* Host backend bootstrap, step 1: listen on `host` (port 0: any free port). The endpoint's
 * address ("127.0.0.1:40123") is what the other ranks connect to. */
FL_API fl_status fl_comm_listen(const char *host, fl_comm_endpoint **out);
FL_API const char *fl_comm_endpoint_address(const fl_comm_endpoint *ep);
FL_API void fl_comm_endpoint_destroy(fl_comm_endpoint *ep);
/* Step 2: with every rank's address (addresses[r] for rank r, from the bootstrap), connect
 * the full mesh. Takes `ep` (destroyed on failure too). Fails with FL_ETIMEDOUT naming the
 * missing rank when a peer does not connect within timeout_ms (0: 30 s). */
FL_API fl_status fl_comm_host_create(fl_comm_endpoint *ep, int rank, int size,
                                     const char *const *addresses, uint32_t timeout_ms,
                                     fl_comm **out);
/* NCCL backend: rank 0 makes the unique id, the bootstrap hands it to every rank. */
#define FL_NCCL_ID_BYTES 128
FL_API fl_status fl_comm_nccl_unique_id(uint8_t id[FL_NCCL_ID_BYTES]);
FL_API fl_status fl_comm_nccl_create(fl_device *dev, int rank, int size,
                                     const uint8_t id[FL_NCCL_ID_BYTES], fl_comm **out);
/* Ranks with the same `color` form a sub-group, ordered by (key, rank); collective over
 * `comm`. *out is NULL for a rank whose color is negative. */
FL_API fl_status fl_comm_split(fl_comm *comm, int color, int key, fl_comm **out);
/* Before closing any device whose tensors the communicator reduced: the host backend keeps
 * pinned staging memory of that device. */
FL_API void fl_comm_destroy(fl_comm *comm);
FL_API int fl_comm_rank(const fl_comm *comm);
FL_API int fl_comm_size(const fl_comm *comm);
/* "host" or "nccl". */
FL_API const char *fl_comm_backend(const fl_comm *comm);
/* Picks the host allreduce algorithm (AUTO by default); NCCL ignores it. */
FL_API fl_status fl_comm_set_allreduce_algo(fl_comm *comm, fl_allreduce_algo algo);

FL_API fl_status fl_comm_allreduce(fl_comm *comm, fl_tensor *t, fl_reduce_op op);
FL_API fl_status fl_comm_broadcast(fl_comm *comm, fl_tensor *t, int root);
/* in: n elements on every rank; out: size x n elements, rank r's block at r*n. */
FL_API fl_status fl_comm_allgather(fl_comm *comm, const fl_tensor *in, fl_tensor *out);
/* in: n elements; out: this rank's block of the reduced tensor. Blocks are split as evenly as
 * possible: rank r gets n/size elements, plus one when r < n % size. */
FL_API fl_status fl_comm_reduce_scatter(fl_comm *comm, const fl_tensor *in, fl_tensor *out,
                                        fl_reduce_op op);
/* in and out: size x m elements each (distinct tensors); block j of `in` (elements
 * [j*m, (j+1)*m)) goes to rank j, and block j of `out` is what rank j sent this rank (the
 * dispatch and combine of expert parallelism). */
FL_API fl_status fl_comm_alltoall(fl_comm *comm, const fl_tensor *in, fl_tensor *out);
FL_API fl_status fl_comm_send(fl_comm *comm, const fl_tensor *t, int peer);
FL_API fl_status fl_comm_recv(fl_comm *comm, fl_tensor *t, int peer);
FL_API fl_status fl_comm_barrier(fl_comm *comm);

#ifdef __cplusplus
}
#endif
#endif /* FLINT_GPU_H */
