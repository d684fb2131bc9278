/*
 * gpu/device/backend.h: what a device backend implements: the device (struct fl_device), its
 * operation table (device_ops) and what both backends share (bn_saved, dropout_keep). The
 * backends are gpu/device/device_cpu.c (plain C and OpenBLAS) and gpu/device/cuda/ (cuBLAS
 * plus the kernels in kernels.cu); gpu/device/device.c opens them. This header is the bottom
 * of gpu/: it includes nothing of it, so a backend depends on no other file of gpu/.
 *
 * Conventions for every operation:
 * - Pointers are device pointers of the same device (host memory for cpu). Shapes are in
 *   elements; matrices are row-major. Images are NCHW.
 * - Operations are queued in order on the device's one stream and may return before they
 *   finish (cuda); copies to the host and synchronize block. An error of an asynchronous
 *   operation may surface at a later call; it is then kept on the device (sticky).
 * - Operations that produce parameter gradients ACCUMULATE into them (grad += ...), as
 *   PyTorch does, so that micro-batches can add up; callers zero gradients per step.
 *   Operations that produce activations or input gradients OVERWRITE their output unless
 *   the name says accumulate.
 * - Returns FL_OK or FL_EDEVICE with fl_last_error() naming the call and the device.
 * - A device is used by one thread at a time, with one exception: while the data-parallel
 *   trainer overlaps its allreduces (the comm worker, gpu/comm/comm.h), the rank's
 *   communication thread calls synchronize, to_host, from_host, host_alloc and host_free
 *   (through the communicator's backend) as the rank's thread queues backward's work. The cpu
 *   device keeps no state in them; the cuda device's start with cudaSetDevice, queue on the
 *   stream (the CUDA runtime orders calls from several threads) and only read the device's
 *   state unless a call fails. A known gap: the sticky error (gpu/device/cuda/check.c) is
 *   recorded without a lock, so two threads failing at once race on its message.
 */
#ifndef FLINT_GPU_DEVICE_BACKEND_H
#define FLINT_GPU_DEVICE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"

typedef struct device_ops device_ops;

struct fl_device {
  const device_ops *ops;
  fl_device_kind kind;
  int ordinal;
  char name[128];
  char pci_bus_id[32]; /* cuda: the GPU's PCI address, which tells when ranks share a GPU */
  fl_precision precision; /* of gemm and gemm_batched (flint/gpu.h); set through set_precision */
  void *impl; /* the backend's state (cuda: stream, cuBLAS handle, allocator) */
};

/* Batch-norm per-channel scratch that forward saves for backward. */
typedef struct bn_saved {
  float *mean;    /* [C] batch mean */
  float *inv_std; /* [C] 1 / sqrt(var + eps) */
} bn_saved;

/* A range of an optimizer's flat buffers (one parameter, or a run of parameters of one
 * group) and its group's settings: what the layer-wise optimizer steps take per segment. */
typedef struct optim_segment {
  uint64_t offset, count; /* in elements */
  float weight_decay;
  int32_t adapt;          /* 1: LARS/LAMB's trust ratio; 0: ratio 1 (excluded parameters) */
} optim_segment;

struct device_ops {
  const char *name; /* "cpu", "cuda" */

  /* Memory. alloc returns memory the device can use (cuda: from the caching allocator; may
   * block on cudaMalloc). host_alloc returns pinned host memory on cuda (plain on cpu). */
  fl_status (*alloc)(fl_device *dev, size_t bytes, void **out);
  void (*free)(fl_device *dev, void *p);
  fl_status (*host_alloc)(fl_device *dev, size_t bytes, void **out);
  void (*host_free)(fl_device *dev, void *p);
  fl_status (*to_host)(fl_device *dev, void *dst, const void *src, size_t bytes);   /* blocks */
  fl_status (*from_host)(fl_device *dev, void *dst, const void *src, size_t bytes); /* blocks */
  fl_status (*copy)(fl_device *dev, void *dst, const void *src, size_t bytes);
  fl_status (*memset0)(fl_device *dev, void *p, size_t bytes);
  fl_status (*synchronize)(fl_device *dev);
  void (*destroy)(fl_device *dev);
  /* Checks that the device can multiply in `p` (fl_device_set_precision has checked the
   * value; the caller stores it in dev->precision). NULL: fp32 only (the cpu). Does not block. */
  fl_status (*check_precision)(fl_device *dev, fl_precision p);

  /* BLAS. C[m,n] = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k. */
  fl_status (*gemm)(fl_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                    float *c, int ldc);
  /* y = a * x + y */
  fl_status (*axpy)(fl_device *dev, size_t n, float a, const float *x, float *y);
  /* x = a * x */
  fl_status (*scale)(fl_device *dev, size_t n, float a, float *x);
  fl_status (*fill)(fl_device *dev, size_t n, float value, float *x);
  /* *out (host) = sum of x[i]^2, in double. Blocks. */
  fl_status (*sum_squares)(fl_device *dev, size_t n, const float *x, double *out);

  /* Activations. y may alias x in forward; dx may alias dy in backward. */
  fl_status (*relu_forward)(fl_device *dev, size_t n, const float *x, float *y);
  /* dx = dy where y > 0, else 0 (y is relu's output). */
  fl_status (*relu_backward)(fl_device *dev, size_t n, const float *y, const float *dy,
                             float *dx);

  /* Bias over rows (linear layers): y[r, c] += b[c]; db[c] += sum_r dy[r, c]. */
  fl_status (*bias_add_rows)(fl_device *dev, int rows, int cols, const float *b, float *y);
  fl_status (*bias_grad_rows)(fl_device *dev, int rows, int cols, const float *dy, float *db);
  /* Bias over channels (convolutions, NCHW with hw = H*W): y[n, c, :] += b[c];
   * db[c] += sum over n and hw of dy[n, c, :]. */
  fl_status (*bias_add_channels)(fl_device *dev, int n, int c, int hw, const float *b,
                                 float *y);
  fl_status (*bias_grad_channels)(fl_device *dev, int n, int c, int hw, const float *dy,
                                  float *db);

  /* Softmax cross-entropy over logits [n, c] with int32 labels [n] (device memory), against
   * the target t = (1 - smoothing) * onehot + smoothing / c (label smoothing, as PyTorch's):
   * writes dlogits = (softmax - t) * grad_scale and adds to stats (device, 2 floats):
   * stats[0] += sum of the rows' losses -sum_j t_j log softmax_j, stats[1] += number of rows
   * whose argmax equals the label. A label outside [0, c) is FL_EINVAL on cpu; kernels clamp nothing and report it
   * through the sticky error at the next synchronize. */
  fl_status (*softmax_xent)(fl_device *dev, int n, int c, const float *logits,
                            const int32_t *labels, float smoothing, float grad_scale,
                            float *dlogits, float *stats);

  /* Convolution helpers for a batch: x [n, c, h, w] -> col [c*kh*kw, n*oh*ow], with
   * oh = (h + 2*pad - kh) / stride + 1 (same for ow). col2im ACCUMULATES into dx. */
  fl_status (*im2col)(fl_device *dev, int n, int c, int h, int w, int kh, int kw, int stride,
                      int pad, const float *x, float *col);
  fl_status (*col2im)(fl_device *dev, int n, int c, int h, int w, int kh, int kw, int stride,
                      int pad, const float *col, float *dx);
  /* y[b, a, s] = x[a, b, s] for x [a_dim, b_dim, s_dim] (CNHW <-> NCHW). */
  fl_status (*swap01)(fl_device *dev, int a_dim, int b_dim, int s_dim, const float *x,
                      float *y);

  /* Pooling over x [n, c, h, w] with a k x k window. Max pooling saves the argmax (index
   * within the input plane) for backward; backward overwrites dx. A tie (common after a
   * relu: all zeros) goes to the first maximum in row-major window order, so that devices
   * agree on dx. */
  fl_status (*maxpool_forward)(fl_device *dev, int n, int c, int h, int w, int k, int stride,
                               int pad, const float *x, float *y, int32_t *argmax);
  fl_status (*maxpool_backward)(fl_device *dev, int n, int c, int h, int w, int k, int stride,
                                int pad, const float *dy, const int32_t *argmax, float *dx);
  /* Average pooling counts padding as zeros and divides by k*k (count_include_pad). */
  fl_status (*avgpool_forward)(fl_device *dev, int n, int c, int h, int w, int k, int stride,
                               int pad, const float *x, float *y);
  fl_status (*avgpool_backward)(fl_device *dev, int n, int c, int h, int w, int k, int stride,
                                int pad, const float *dy, float *dx);

  /* Batch norm over x [n, c, hw] per channel. Training: batch statistics of this rank only
   * (as Goyal et al.), saved for backward; running mean/var updated with `momentum`
   * (running = (1 - momentum) * running + momentum * batch, unbiased variance as PyTorch).
   * Inference (train false): running statistics. y = gamma * xhat + beta. */
  fl_status (*batchnorm_forward)(fl_device *dev, int n, int c, int hw, const float *x,
                                 const float *gamma, const float *beta, float *running_mean,
                                 float *running_var, float momentum, float eps, bool train,
                                 bn_saved saved, float *y);
  /* dx overwritten; dgamma, dbeta accumulated. */
  fl_status (*batchnorm_backward)(fl_device *dev, int n, int c, int hw, const float *x,
                                  const float *dy, const float *gamma, bn_saved saved,
                                  float *dx, float *dgamma, float *dbeta);

  /* SGD with momentum and weight decay (PyTorch's rule):
   *   g = grad + weight_decay * w;  v = momentum * v + g;
   *   w -= lr * (nesterov ? g + momentum * v : v). */
  fl_status (*sgd_step)(fl_device *dev, size_t n, float lr, float momentum,
                        float weight_decay, bool nesterov, const float *grad, float *velocity,
                        float *w);
  /* Adam (Kingma and Ba; PyTorch's rule), one weight decay for the n elements:
   *   decoupled (AdamW): w *= 1 - lr * weight_decay, g = grad;  else g = grad + weight_decay * w;
   *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
   *   w -= lr * (m / bias1) / (sqrt(v / bias2) + eps)
   * where bias1 = 1 - beta1^t and bias2 = 1 - beta2^t for the t-th step (t >= 1). */
  fl_status (*adam_step)(fl_device *dev, size_t n, float lr, float beta1, float beta2,
                         float eps, float weight_decay, bool decoupled, float bias1,
                         float bias2, const float *grad, float *m, float *v, float *w);
  /* The layer-wise optimizers over nseg segments of the flat buffers (segs and norms in
   * device memory; norms is scratch of 2 * nseg doubles). A segment whose adapt is 0 takes
   * the trust ratio 1.
   * LARS (You et al. 2017, with momentum), per segment with its weight decay wd:
   *   ratio = trust_coef * ||w|| / (||g|| + wd * ||w||)  (1 when either norm is 0);
   *   u = m * u + lr * ratio * (g + wd * w);  w -= u            (u: velocity)
   * LAMB (You et al. 2019), per segment: m and v as adam_step's (not decoupled), then
   *   r = (m / bias1) / (sqrt(v / bias2) + eps) + wd * w;
   *   ratio = ||w|| / ||r||  (1 when either norm is 0);  w -= lr * ratio * r */
  fl_status (*lars_step)(fl_device *dev, int nseg, const optim_segment *segs, size_t n,
                         float lr, float momentum, float trust_coef, const float *grad,
                         float *velocity, float *w, double *norms);
  fl_status (*lamb_step)(fl_device *dev, int nseg, const optim_segment *segs, size_t n,
                         float lr, float beta1, float beta2, float eps, float bias1,
                         float bias2, const float *grad, float *m, float *v, float *w,
                         double *norms);

  /* ---- transformer operations (tensor and pipeline parallelism) ---- */

  /* C_i = alpha * op(A_i) * op(B_i) + beta * C_i for i < batch, where X_i = x + i * stride_x
   * (strides in elements): attention's per-(sample, head) products in one call. */
  fl_status (*gemm_batched)(fl_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                            float alpha, const float *a, int lda, size_t stride_a,
                            const float *b, int ldb, size_t stride_b, float beta, float *c,
                            int ldc, size_t stride_c, int batch);
  /* GELU, tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
   * Backward overwrites dx = dy * gelu'(x) (x is the forward's input). */
  fl_status (*gelu_forward)(fl_device *dev, size_t n, const float *x, float *y);
  fl_status (*gelu_backward)(fl_device *dev, size_t n, const float *x, const float *dy,
                             float *dx);
  /* Row softmax of scale * x over x [rows, cols]. Backward (y is the forward's output):
   * dx = scale * y * (dy - sum_j dy_j y_j), overwritten. */
  fl_status (*softmax_rows_forward)(fl_device *dev, int rows, int cols, float scale,
                                    const float *x, float *y);
  fl_status (*softmax_rows_backward)(fl_device *dev, int rows, int cols, float scale,
                                     const float *y, const float *dy, float *dx);
  /* Inverted dropout with a keyed mask, so that the mask of an element does not depend on
   * how the tensor is split (tensor parallel shards, micro-batches, data-parallel ranks):
   * x is [outer, inner, cols]; element (i, j, k) has the global index
   *   g = ((outer0 + i) * inner_total + inner0 + j) * cols + k
   * and is kept when dropout_keep(seed, g, p) (below), then scaled by 1 / (1 - p), else 0.
   * y may alias x. Backward applies the same mask and scale to dy (dx may alias dy). */
  fl_status (*dropout_forward)(fl_device *dev, int outer, int inner, int cols, int64_t outer0,
                               int64_t inner0, int64_t inner_total, float p, uint64_t seed,
                               const float *x, float *y);
  fl_status (*dropout_backward)(fl_device *dev, int outer, int inner, int cols, int64_t outer0,
                                int64_t inner0, int64_t inner_total, float p, uint64_t seed,
                                const float *dy, float *dx);
  /* Mean over tokens: x [n, s, h] -> y [n, h]; backward dx[n, s, h] = dy[n, h] / s. */
  fl_status (*mean_tokens_forward)(fl_device *dev, int n, int s, int h, const float *x,
                                   float *y);
  fl_status (*mean_tokens_backward)(fl_device *dev, int n, int s, int h, const float *dy,
                                    float *dx);

  /* Layer norm over each row of x [rows, cols]: y = (x - mean) * rstd * gamma + beta with
   * rstd = 1 / sqrt(var + eps), the biased variance (PyTorch's); mean and rstd (rows floats
   * each) are saved for backward. Backward overwrites dx and ACCUMULATES dgamma and dbeta. */
  fl_status (*layernorm_forward)(fl_device *dev, int rows, int cols, float eps, const float *x,
                                 const float *gamma, const float *beta, float *y, float *mean,
                                 float *rstd);
  fl_status (*layernorm_backward)(fl_device *dev, int rows, int cols, const float *x,
                                  const float *dy, const float *gamma, const float *mean,
                                  const float *rstd, float *dx, float *dgamma, float *dbeta);
  /* Embedding: row i of y [count, dim] is row ids[i] of table [vocab, dim]; ids are floats
   * holding whole numbers in [0, vocab) (a model's input is float). An id outside is FL_EINVAL
   * on cpu (nothing written); kernels write zeros for it and report it at the next
   * synchronize, as softmax_xent's labels. Backward ACCUMULATES the rows of dy into dtable. */
  fl_status (*embedding_forward)(fl_device *dev, size_t count, int dim, int vocab,
                                 const float *ids, const float *table, float *y);
  fl_status (*embedding_backward)(fl_device *dev, size_t count, int dim, int vocab,
                                  const float *ids, const float *dy, float *dtable);
  /* Causal attention: sets the strictly upper triangle (column > row) of each of `batch`
   * [s, s] score matrices to -inf, so that a query attends to its own and earlier positions
   * only; softmax_rows then gives 0 there, and its backward a zero gradient. In place. */
  fl_status (*causal_mask)(fl_device *dev, int batch, int s, float *scores);
};

/* The dropout mask (both devices use this exact function; the cuda kernels include this
 * header): splitmix64 of seed ^ g, whose top 24 bits as a uniform in [0, 1) must be >= p. */
#ifdef __CUDACC__
#define DEVICE_SHARED_FN __host__ __device__ static inline
#else
#define DEVICE_SHARED_FN static inline
#endif
DEVICE_SHARED_FN uint64_t dropout_mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
DEVICE_SHARED_FN bool dropout_keep(uint64_t seed, uint64_t g, float p) {
  return (float)(dropout_mix(seed ^ (g * 0xd1b54a32d192ed03ull)) >> 40) * (1.0f / 16777216.0f) >= p;
}

/* The backends. cuda_device_init returns FL_EDEVICE when flint was built without CUDA. */
fl_status cpu_device_init(fl_device *dev);
fl_status cuda_device_init(fl_device *dev, int ordinal);
int cuda_device_count(void);

#endif /* FLINT_GPU_DEVICE_BACKEND_H */
