/*
 * gpu/device/cuda/device_cuda.c: the cuda device. GEMM through cuBLAS, everything else through
 * the kernels of kernels.cu, memory through the caching allocator (allocator.c).
 *
 * Design: one non-blocking stream per device; every operation is queued on it and returns
 * (copies to the host, sum_squares and synchronize wait for it). A cuBLAS handle is bound to
 * the stream. Failures are reported by check.h: a failed CUDA call is kept as the device's
 * sticky error and returned by every later operation. A kernel that finds bad input it
 * cannot return (softmax_xent's labels) raises a flag in mapped pinned memory, which the
 * next synchronizing call turns into a sticky FL_EINVAL.
 *
 * Threading: a device is used by one thread at a time, but not always the thread that
 * opened it (a rank's thread), and the CUDA current device is per thread: every operation
 * starts with cudaSetDevice.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "gpu/device/cuda/allocator.h"
#include "gpu/device/cuda/check.h"
#include "gpu/device/cuda/kernels.h"

typedef struct cuda_impl {
  cuda_errstate es; /* first: the allocator reports into it */
  cudaStream_t stream;
  cublasHandle_t blas;
  cuda_allocator *alloc;
  double *sumsq_dev;   /* sum_squares' result on the device ... */
  double *sumsq_host;  /* ... and its pinned landing place */
  int *bad_label_host; /* mapped pinned flag raised by softmax_xent */
  int *bad_label_dev;  /* the same flag as the kernels see it */
  int cc_major, cc_minor; /* compute capability: which precisions the tensor cores take */
  void *half;          /* bf16/fp16 copies of a GEMM's two inputs (allocator memory) */
  size_t half_bytes;
} cuda_impl;

static const device_ops cuda_ops;

static cuda_impl *impl_of(fl_device *dev) { return dev->impl; }

/* Every operation starts here: a failed device stays failed, and the thread may not have
 * this GPU current. */
static fl_status enter(cuda_impl *impl) {
  fl_status st = cuda_error_check(&impl->es);
  if (st != FL_OK) return st;
  cudaError_t err = cudaSetDevice(impl->es.ordinal);
  if (err != cudaSuccess)
    return cuda_error_cuda(&impl->es, err, "cudaSetDevice(ordinal)", __FILE__, __LINE__);
  return FL_OK;
}

#define ENTER(dev)                                                                           \
  cuda_impl *impl = impl_of(dev);                                                            \
  do {                                                                                       \
    fl_status enter_status_ = enter(impl);                                                   \
    if (enter_status_ != FL_OK) return enter_status_;                                        \
  } while (0)

/* Bad arguments are the caller's bug, reported without failing the device. */
#define REQUIRE(cond, op)                                                                    \
  do {                                                                                       \
    if (!(cond))                                                                             \
      return fl_set_error(FL_EINVAL, "device cuda:%d: %s: invalid arguments (%s)",           \
                          impl->es.ordinal, (op), #cond);                                    \
  } while (0)

/* After the stream was synchronized: surfaces what the kernels flagged. */
static fl_status after_sync(cuda_impl *impl) {
  if (*(volatile int *)impl->bad_label_host)
    return cuda_error_sticky(&impl->es, FL_EINVAL,
                             "cuda:%d: a label outside [0, classes) (softmax_xent) or a token id "
                             "outside [0, vocabulary) (embedding), found when the device next synchronized",
                             impl->es.ordinal);
  return FL_OK;
}

static fl_status sync_stream(cuda_impl *impl) {
  fl_status status = FL_OK;
  CUDA_CHECK(&impl->es, cudaStreamSynchronize(impl->stream));
  status = after_sync(impl);
cleanup:
  return status;
}

/* ---- memory ---------------------------------------------------------------------------- */

static fl_status cuda_alloc(fl_device *dev, size_t bytes, void **out) {
  ENTER(dev);
  return cuda_allocator_alloc(impl->alloc, bytes, out);
}

static void cuda_free(fl_device *dev, void *p) {
  if (!p) return;
  cuda_impl *impl = impl_of(dev);
  /* Only host bookkeeping (and cudaFree when the host is out of memory) happens here. */
  (void)cudaSetDevice(impl->es.ordinal);
  cuda_allocator_free(impl->alloc, p);
}

static fl_status cuda_host_alloc(fl_device *dev, size_t bytes, void **out) {
  fl_status status = FL_OK;
  ENTER(dev);
  void *p = NULL;
  CUDA_CHECK(&impl->es, cudaMallocHost(&p, bytes ? bytes : 1));
  *out = p;
cleanup:
  return status;
}

static void cuda_host_free(fl_device *dev, void *p) {
  if (!p) return;
  cuda_impl *impl = impl_of(dev);
  (void)cudaSetDevice(impl->es.ordinal);
  cudaError_t err = cudaFreeHost(p);
  /* No status to return: a failure here is a failed device, kept for the next call. */
  if (err != cudaSuccess)
    (void)cuda_error_cuda(&impl->es, err, "cudaFreeHost(p)", __FILE__, __LINE__);
}

static fl_status cuda_to_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  fl_status status = FL_OK;
  ENTER(dev);
  if (bytes)
    CUDA_CHECK(&impl->es,
               cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, impl->stream));
  status = sync_stream(impl);
cleanup:
  return status;
}

static fl_status cuda_from_host(fl_device *dev, void *dst, const void *src, size_t bytes) {
  fl_status status = FL_OK;
  ENTER(dev);
  if (bytes)
    CUDA_CHECK(&impl->es,
               cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, impl->stream));
  /* Blocks so that the caller may reuse src at once (pageable memory is staged anyway). */
  status = sync_stream(impl);
cleanup:
  return status;
}

static fl_status cuda_copy(fl_device *dev, void *dst, const void *src, size_t bytes) {
  fl_status status = FL_OK;
  void *tmp = NULL;
  ENTER(dev);
  if (bytes == 0 || dst == src) return FL_OK;
  const char *d = dst, *s = src;
  if (d < s + bytes && s < d + bytes) {
    /* The cpu device's copy is memmove; cudaMemcpy is undefined for overlapping ranges, so
     * overlap goes through a temporary (freed in stream order, so no wait). */
    FL_CHECK(cuda_allocator_alloc(impl->alloc, bytes, &tmp));
    CUDA_CHECK(&impl->es,
               cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, impl->stream));
    src = tmp;
  }
  CUDA_CHECK(&impl->es, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                        impl->stream));
cleanup:
  cuda_allocator_free(impl->alloc, tmp);
  return status;
}

static fl_status cuda_memset0(fl_device *dev, void *p, size_t bytes) {
  ENTER(dev);
  if (bytes == 0) return FL_OK;
  CUDA_RETURN(&impl->es, cudaMemsetAsync(p, 0, bytes, impl->stream));
}

static fl_status cuda_synchronize(fl_device *dev) {
  ENTER(dev);
  return sync_stream(impl);
}

static void impl_destroy(cuda_impl *impl) {
  if (!impl) return;
  /* Best effort throughout: a failed device still gives back what it can. */
  (void)cudaSetDevice(impl->es.ordinal);
  if (impl->stream) (void)cudaStreamSynchronize(impl->stream);
  if (impl->half) cuda_allocator_free(impl->alloc, impl->half);
  cuda_allocator_destroy(impl->alloc);
  if (impl->sumsq_dev) (void)cudaFree(impl->sumsq_dev);
  if (impl->sumsq_host) (void)cudaFreeHost(impl->sumsq_host);
  if (impl->bad_label_host) (void)cudaFreeHost(impl->bad_label_host);
  if (impl->blas) (void)cublasDestroy(impl->blas);
  if (impl->stream) (void)cudaStreamDestroy(impl->stream);
  common_free(impl);
}

static void cuda_destroy(fl_device *dev) {
  impl_destroy(impl_of(dev));
  dev->impl = NULL;
}

/* ---- precision ------------------------------------------------------------------------ */

static fl_status cuda_check_precision(fl_device *dev, fl_precision p) {
  cuda_impl *impl = impl_of(dev);
  int need = p == FL_PRECISION_FP16 ? 7 : 8; /* Volta's tensor cores take half; Ampere's tf32 and bf16 */
  if (impl->cc_major < need)
    return fl_set_error(FL_EDEVICE, "device %s: precision %s needs compute capability %d.0 or newer, this GPU has %d.%d",
                        dev->name, fl_precision_name(p), need, impl->cc_major, impl->cc_minor);
  return FL_OK;
}

/* Floats a row-major operand spans: `batch` matrices `stride` apart, each `rows` rows of `ld`
 * of which the last is read up to `cols`. The gaps between rows are converted too: they are
 * the caller's memory, and one contiguous pass is the cheapest conversion. */
static size_t operand_span(int rows, int cols, int ld, size_t stride, int batch) {
  return (size_t)(batch - 1) * stride + (size_t)(rows - 1) * (size_t)ld + (size_t)cols;
}

/* C_i = alpha op(A_i) op(B_i) + beta C_i (row-major; batch 1 for a single product) in the
 * device's precision. fp32: SGEMM; tf32: cuBLAS rounds the fp32 inputs itself; bf16/fp16: the
 * inputs are rounded into the scratch buffer first (explicitly, so the result is the same on
 * every GPU and cuBLAS cannot fall back to tf32), then multiplied with fp32 accumulation. */
static fl_status gemm_in_precision(fl_device *dev, cuda_impl *impl, bool trans_a, bool trans_b, int m, int n, int k,
                                   float alpha, const float *a, int lda, size_t stride_a, const float *b, int ldb,
                                   size_t stride_b, float beta, float *c, int ldc, size_t stride_c, int batch) {
  fl_status status = FL_OK;
  /* cuBLAS is column-major, and a row-major matrix read as column-major is its transpose:
   * so compute C^T = op(B)^T op(A)^T, i.e. swap the operands and m with n. */
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  fl_precision p = dev->precision;
  if (p == FL_PRECISION_FP32) {
    if (batch == 1)
      CUBLAS_CHECK(&impl->es, cublasSgemm(impl->blas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    else
      CUBLAS_CHECK(&impl->es, cublasSgemmStridedBatched(impl->blas, op_b, op_a, n, m, k, &alpha, b, ldb,
                                                        (long long)stride_b, a, lda, (long long)stride_a, &beta, c,
                                                        ldc, (long long)stride_c, batch));
    return FL_OK;
  }
  const void *in_a = a, *in_b = b;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (p != FL_PRECISION_TF32) {
    bool bf16 = p == FL_PRECISION_BF16;
    type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    compute = CUBLAS_COMPUTE_32F;
    size_t span_a = k == 0 ? 0 : operand_span(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch);
    size_t span_b = k == 0 ? 0 : operand_span(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch);
    /* B starts 16-byte aligned, as the tensor cores' loads want. */
    size_t a_room = (span_a + 7) & ~(size_t)7;
    size_t bytes = (a_room + span_b) * 2;
    if (bytes > impl->half_bytes) {
      /* One stream: work queued on the old buffer runs before anything that reuses it. */
      cuda_allocator_free(impl->alloc, impl->half);
      impl->half = NULL;
      impl->half_bytes = 0;
      FL_CHECK(cuda_allocator_alloc(impl->alloc, bytes, &impl->half));
      impl->half_bytes = bytes;
    }
    uint16_t *half_a = impl->half, *half_b = half_a + a_room;
    CUDA_CHECK(&impl->es, kernels_to_16bit(impl->stream, span_a, a, bf16, half_a));
    CUDA_CHECK(&impl->es, kernels_to_16bit(impl->stream, span_b, b, bf16, half_b));
    in_a = half_a;
    in_b = half_b;
  }
  if (batch == 1)
    CUBLAS_CHECK(&impl->es, cublasGemmEx(impl->blas, op_b, op_a, n, m, k, &alpha, in_b, type, ldb, in_a, type, lda,
                                         &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT));
  else
    CUBLAS_CHECK(&impl->es, cublasGemmStridedBatchedEx(impl->blas, op_b, op_a, n, m, k, &alpha, in_b, type, ldb,
                                                       (long long)stride_b, in_a, type, lda, (long long)stride_a,
                                                       &beta, c, CUDA_R_32F, ldc, (long long)stride_c, batch,
                                                       compute, CUBLAS_GEMM_DEFAULT));
cleanup:
  return status;
}

/* ---- BLAS ------------------------------------------------------------------------------ */

static fl_status cuda_gemm(fl_device *dev, bool trans_a, bool trans_b, int m, int n, int k,
                           float alpha, const float *a, int lda, const float *b, int ldb,
                           float beta, float *c, int ldc) {
  ENTER(dev);
  REQUIRE(m >= 0 && n >= 0 && k >= 0, "gemm");
  if (m == 0 || n == 0) return FL_OK;
  return gemm_in_precision(dev, impl, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

static fl_status cuda_axpy(fl_device *dev, size_t n, float a, const float *x, float *y) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_axpy(impl->stream, n, a, x, y));
}

static fl_status cuda_scale(fl_device *dev, size_t n, float a, float *x) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_scale(impl->stream, n, a, x));
}

static fl_status cuda_fill(fl_device *dev, size_t n, float value, float *x) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_fill(impl->stream, n, value, x));
}

static fl_status cuda_sum_squares(fl_device *dev, size_t n, const float *x, double *out) {
  fl_status status = FL_OK;
  ENTER(dev);
  CUDA_CHECK(&impl->es, kernels_sum_squares(impl->stream, n, x, impl->sumsq_dev));
  CUDA_CHECK(&impl->es, cudaMemcpyAsync(impl->sumsq_host, impl->sumsq_dev, sizeof(double),
                                        cudaMemcpyDeviceToHost, impl->stream));
  FL_CHECK(sync_stream(impl));
  *out = *impl->sumsq_host;
cleanup:
  return status;
}

/* ---- activations and biases ------------------------------------------------------------ */

static fl_status cuda_relu_forward(fl_device *dev, size_t n, const float *x, float *y) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_relu_forward(impl->stream, n, x, y));
}

static fl_status cuda_relu_backward(fl_device *dev, size_t n, const float *y, const float *dy,
                                    float *dx) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_relu_backward(impl->stream, n, y, dy, dx));
}

static fl_status cuda_bias_add_rows(fl_device *dev, int rows, int cols, const float *b,
                                    float *y) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols >= 0, "bias_add_rows");
  CUDA_RETURN(&impl->es, kernels_bias_add_rows(impl->stream, rows, cols, b, y));
}

static fl_status cuda_bias_grad_rows(fl_device *dev, int rows, int cols, const float *dy,
                                     float *db) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols >= 0, "bias_grad_rows");
  CUDA_RETURN(&impl->es, kernels_bias_grad_rows(impl->stream, rows, cols, dy, db));
}

static fl_status cuda_bias_add_channels(fl_device *dev, int n, int c, int hw, const float *b,
                                        float *y) {
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && hw >= 0, "bias_add_channels");
  CUDA_RETURN(&impl->es, kernels_bias_add_channels(impl->stream, n, c, hw, b, y));
}

static fl_status cuda_bias_grad_channels(fl_device *dev, int n, int c, int hw, const float *dy,
                                         float *db) {
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && hw >= 0, "bias_grad_channels");
  CUDA_RETURN(&impl->es, kernels_bias_grad_channels(impl->stream, n, c, hw, dy, db));
}

static fl_status cuda_softmax_xent(fl_device *dev, int n, int c, const float *logits,
                                   const int32_t *labels, float smoothing, float grad_scale,
                                   float *dlogits, float *stats) {
  ENTER(dev);
  REQUIRE(n >= 0 && c > 0, "softmax_xent");
  CUDA_RETURN(&impl->es, kernels_softmax_xent(impl->stream, n, c, logits, labels, smoothing,
                                              grad_scale, dlogits, stats, impl->bad_label_dev));
}

/* ---- convolution helpers and pooling --------------------------------------------------- */

static fl_status cuda_im2col(fl_device *dev, int n, int c, int h, int w, int kh, int kw,
                             int stride, int pad, const float *x, float *col) {
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && h >= 0 && w >= 0 && kh > 0 && kw > 0 && stride > 0 && pad >= 0 &&
              h + 2 * pad >= kh && w + 2 * pad >= kw,
          "im2col");
  CUDA_RETURN(&impl->es, kernels_im2col(impl->stream, n, c, h, w, kh, kw, stride, pad, x, col));
}

static fl_status cuda_col2im(fl_device *dev, int n, int c, int h, int w, int kh, int kw,
                             int stride, int pad, const float *col, float *dx) {
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && h >= 0 && w >= 0 && kh > 0 && kw > 0 && stride > 0 && pad >= 0 &&
              h + 2 * pad >= kh && w + 2 * pad >= kw,
          "col2im");
  CUDA_RETURN(&impl->es, kernels_col2im(impl->stream, n, c, h, w, kh, kw, stride, pad, col, dx));
}

static fl_status cuda_swap01(fl_device *dev, int a_dim, int b_dim, int s_dim, const float *x,
                             float *y) {
  ENTER(dev);
  REQUIRE(a_dim >= 0 && b_dim >= 0 && s_dim >= 0 && (x != y || a_dim * (size_t)b_dim * s_dim == 0),
          "swap01");
  CUDA_RETURN(&impl->es, kernels_swap01(impl->stream, a_dim, b_dim, s_dim, x, y));
}

#define REQUIRE_POOL(op)                                                                     \
  REQUIRE(n >= 0 && c >= 0 && h >= 0 && w >= 0 && k > 0 && stride > 0 && pad >= 0 &&         \
              pad < k && h + 2 * pad >= k && w + 2 * pad >= k,                                \
          op)

static fl_status cuda_maxpool_forward(fl_device *dev, int n, int c, int h, int w, int k,
                                      int stride, int pad, const float *x, float *y,
                                      int32_t *argmax) {
  ENTER(dev);
  REQUIRE_POOL("maxpool_forward");
  CUDA_RETURN(&impl->es, kernels_maxpool_forward(impl->stream, n, c, h, w, k, stride, pad, x, y,
                                                 argmax));
}

static fl_status cuda_maxpool_backward(fl_device *dev, int n, int c, int h, int w, int k,
                                       int stride, int pad, const float *dy,
                                       const int32_t *argmax, float *dx) {
  ENTER(dev);
  REQUIRE_POOL("maxpool_backward");
  CUDA_RETURN(&impl->es, kernels_maxpool_backward(impl->stream, n, c, h, w, k, stride, pad, dy,
                                                  argmax, dx));
}

static fl_status cuda_avgpool_forward(fl_device *dev, int n, int c, int h, int w, int k,
                                      int stride, int pad, const float *x, float *y) {
  ENTER(dev);
  REQUIRE_POOL("avgpool_forward");
  CUDA_RETURN(&impl->es,
              kernels_avgpool_forward(impl->stream, n, c, h, w, k, stride, pad, x, y));
}

static fl_status cuda_avgpool_backward(fl_device *dev, int n, int c, int h, int w, int k,
                                       int stride, int pad, const float *dy, float *dx) {
  ENTER(dev);
  REQUIRE_POOL("avgpool_backward");
  CUDA_RETURN(&impl->es,
              kernels_avgpool_backward(impl->stream, n, c, h, w, k, stride, pad, dy, dx));
}

/* ---- batch norm and the optimizer ------------------------------------------------------ */

static fl_status cuda_batchnorm_forward(fl_device *dev, int n, int c, int hw, const float *x,
                                        const float *gamma, const float *beta,
                                        float *running_mean, float *running_var,
                                        float momentum, float eps, bool train, bn_saved saved,
                                        float *y) {
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && hw >= 0 && (!train || (saved.mean && saved.inv_std)),
          "batchnorm_forward");
  CUDA_RETURN(&impl->es, kernels_batchnorm_forward(impl->stream, n, c, hw, x, gamma, beta,
                                                   running_mean, running_var, momentum, eps,
                                                   train, saved.mean, saved.inv_std, y));
}

static fl_status cuda_batchnorm_backward(fl_device *dev, int n, int c, int hw, const float *x,
                                         const float *dy, const float *gamma, bn_saved saved,
                                         float *dx, float *dgamma, float *dbeta) {
  fl_status status = FL_OK;
  void *scratch = NULL;
  ENTER(dev);
  REQUIRE(n >= 0 && c >= 0 && hw >= 0 && saved.mean && saved.inv_std, "batchnorm_backward");
  if ((size_t)n * c * hw == 0) return FL_OK;
  /* Per-channel sums for dx. Freed at once: the allocator reuses blocks in stream order,
   * so the kernels below finish with it before anyone else's work can touch it. */
  FL_CHECK(cuda_allocator_alloc(impl->alloc, 2 * (size_t)c * sizeof(float), &scratch));
  CUDA_CHECK(&impl->es, kernels_batchnorm_backward(impl->stream, n, c, hw, x, dy, gamma,
                                                   saved.mean, saved.inv_std, dx, dgamma,
                                                   dbeta, scratch));
cleanup:
  cuda_allocator_free(impl->alloc, scratch);
  return status;
}

static fl_status cuda_sgd_step(fl_device *dev, size_t n, float lr, float momentum,
                               float weight_decay, bool nesterov, const float *grad,
                               float *velocity, float *w) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_sgd_step(impl->stream, n, lr, momentum, weight_decay,
                                          nesterov, grad, velocity, w));
}

static fl_status cuda_adam_step(fl_device *dev, size_t n, float lr, float beta1, float beta2,
                                float eps, float weight_decay, bool decoupled, float bias1,
                                float bias2, const float *grad, float *m, float *v, float *w) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_adam_step(impl->stream, n, lr, beta1, beta2, eps, weight_decay,
                                           decoupled, bias1, bias2, grad, m, v, w));
}

static fl_status cuda_lars_step(fl_device *dev, int nseg, const optim_segment *segs, size_t n,
                                float lr, float momentum, float trust_coef, const float *grad,
                                float *velocity, float *w, double *norms) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_lars_step(impl->stream, nseg, segs, n, lr, momentum, trust_coef,
                                           grad, velocity, w, norms));
}

static fl_status cuda_lamb_step(fl_device *dev, int nseg, const optim_segment *segs, size_t n,
                                float lr, float beta1, float beta2, float eps, float bias1,
                                float bias2, const float *grad, float *m, float *v, float *w,
                                double *norms) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_lamb_step(impl->stream, nseg, segs, n, lr, beta1, beta2, eps,
                                           bias1, bias2, grad, m, v, w, norms));
}

/* ---- transformer operations ------------------------------------------------------------ */

static fl_status cuda_gemm_batched(fl_device *dev, bool trans_a, bool trans_b, int m, int n,
                                   int k, float alpha, const float *a, int lda,
                                   size_t stride_a, const float *b, int ldb, size_t stride_b,
                                   float beta, float *c, int ldc, size_t stride_c, int batch) {
  ENTER(dev);
  /* The leading dimensions are checked here, not left to cuBLAS: its INVALID_VALUE would
   * fail the device for what is the caller's mistake. */
  REQUIRE(m >= 0 && n >= 0 && k >= 0 && batch >= 0 && lda >= 1 && ldb >= 1 && ldc >= 1 &&
              lda >= (trans_a ? m : k) && ldb >= (trans_b ? k : n) && ldc >= n &&
              stride_a <= (size_t)LLONG_MAX && stride_b <= (size_t)LLONG_MAX &&
              stride_c <= (size_t)LLONG_MAX,
          "gemm_batched");
  if (m == 0 || n == 0 || batch == 0) return FL_OK;
  return gemm_in_precision(dev, impl, trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                           ldc, stride_c, batch);
}

static fl_status cuda_gelu_forward(fl_device *dev, size_t n, const float *x, float *y) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_gelu_forward(impl->stream, n, x, y));
}

static fl_status cuda_gelu_backward(fl_device *dev, size_t n, const float *x, const float *dy,
                                    float *dx) {
  ENTER(dev);
  CUDA_RETURN(&impl->es, kernels_gelu_backward(impl->stream, n, x, dy, dx));
}

static fl_status cuda_softmax_rows_forward(fl_device *dev, int rows, int cols, float scale,
                                           const float *x, float *y) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols >= 0, "softmax_rows_forward");
  CUDA_RETURN(&impl->es, kernels_softmax_rows_forward(impl->stream, rows, cols, scale, x, y));
}

static fl_status cuda_softmax_rows_backward(fl_device *dev, int rows, int cols, float scale,
                                            const float *y, const float *dy, float *dx) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols >= 0, "softmax_rows_backward");
  CUDA_RETURN(&impl->es,
              kernels_softmax_rows_backward(impl->stream, rows, cols, scale, y, dy, dx));
}

#define REQUIRE_DROPOUT(op)                                                                  \
  REQUIRE(outer >= 0 && inner >= 0 && cols >= 0 && outer0 >= 0 && inner0 >= 0 &&             \
              inner0 + inner <= inner_total && p >= 0.0f && p <= 1.0f,                        \
          op)

static fl_status cuda_dropout_forward(fl_device *dev, int outer, int inner, int cols,
                                      int64_t outer0, int64_t inner0, int64_t inner_total,
                                      float p, uint64_t seed, const float *x, float *y) {
  ENTER(dev);
  REQUIRE_DROPOUT("dropout_forward");
  CUDA_RETURN(&impl->es, kernels_dropout(impl->stream, outer, inner, cols, outer0, inner0,
                                         inner_total, p, seed, x, y));
}

static fl_status cuda_dropout_backward(fl_device *dev, int outer, int inner, int cols,
                                       int64_t outer0, int64_t inner0, int64_t inner_total,
                                       float p, uint64_t seed, const float *dy, float *dx) {
  ENTER(dev);
  REQUIRE_DROPOUT("dropout_backward");
  CUDA_RETURN(&impl->es, kernels_dropout(impl->stream, outer, inner, cols, outer0, inner0,
                                         inner_total, p, seed, dy, dx));
}

static fl_status cuda_mean_tokens_forward(fl_device *dev, int n, int s, int h, const float *x,
                                          float *y) {
  ENTER(dev);
  /* No tokens has no mean (unless there is no output either). */
  REQUIRE(n >= 0 && s >= 0 && h >= 0 && (s > 0 || (size_t)n * h == 0), "mean_tokens_forward");
  CUDA_RETURN(&impl->es, kernels_mean_tokens_forward(impl->stream, n, s, h, x, y));
}

static fl_status cuda_mean_tokens_backward(fl_device *dev, int n, int s, int h,
                                           const float *dy, float *dx) {
  ENTER(dev);
  REQUIRE(n >= 0 && s >= 0 && h >= 0, "mean_tokens_backward");
  CUDA_RETURN(&impl->es, kernels_mean_tokens_backward(impl->stream, n, s, h, dy, dx));
}

static fl_status cuda_causal_mask(fl_device *dev, int batch, int s, float *scores) {
  ENTER(dev);
  REQUIRE(batch >= 0 && s >= 0, "causal_mask");
  CUDA_RETURN(&impl->es, kernels_causal_mask(impl->stream, batch, s, scores));
}

static fl_status cuda_layernorm_forward(fl_device *dev, int rows, int cols, float eps, const float *x,
                                        const float *gamma, const float *beta, float *y, float *mean, float *rstd) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols > 0 && eps >= 0, "layernorm_forward");
  CUDA_RETURN(&impl->es, kernels_layernorm_forward(impl->stream, rows, cols, eps, x, gamma, beta, y, mean, rstd));
}

static fl_status cuda_layernorm_backward(fl_device *dev, int rows, int cols, const float *x, const float *dy,
                                         const float *gamma, const float *mean, const float *rstd, float *dx,
                                         float *dgamma, float *dbeta) {
  ENTER(dev);
  REQUIRE(rows >= 0 && cols > 0, "layernorm_backward");
  CUDA_RETURN(&impl->es, kernels_layernorm_backward(impl->stream, rows, cols, x, dy, gamma, mean, rstd, dx, dgamma,
                                                    dbeta));
}

static fl_status cuda_embedding_forward(fl_device *dev, size_t count, int dim, int vocab, const float *ids,
                                        const float *table, float *y) {
  ENTER(dev);
  REQUIRE(dim > 0 && vocab > 0, "embedding_forward");
  CUDA_RETURN(&impl->es, kernels_embedding_forward(impl->stream, count, dim, vocab, ids, table, y,
                                                   impl->bad_label_dev));
}

static fl_status cuda_embedding_backward(fl_device *dev, size_t count, int dim, int vocab, const float *ids,
                                         const float *dy, float *dtable) {
  ENTER(dev);
  REQUIRE(dim > 0 && vocab > 0, "embedding_backward");
  CUDA_RETURN(&impl->es, kernels_embedding_backward(impl->stream, count, dim, vocab, ids, dy, dtable,
                                                    impl->bad_label_dev));
}

static const device_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .to_host = cuda_to_host,
    .from_host = cuda_from_host,
    .copy = cuda_copy,
    .memset0 = cuda_memset0,
    .synchronize = cuda_synchronize,
    .destroy = cuda_destroy,
    .check_precision = cuda_check_precision,
    .gemm = cuda_gemm,
    .axpy = cuda_axpy,
    .scale = cuda_scale,
    .fill = cuda_fill,
    .sum_squares = cuda_sum_squares,
    .relu_forward = cuda_relu_forward,
    .relu_backward = cuda_relu_backward,
    .bias_add_rows = cuda_bias_add_rows,
    .bias_grad_rows = cuda_bias_grad_rows,
    .bias_add_channels = cuda_bias_add_channels,
    .bias_grad_channels = cuda_bias_grad_channels,
    .softmax_xent = cuda_softmax_xent,
    .im2col = cuda_im2col,
    .col2im = cuda_col2im,
    .swap01 = cuda_swap01,
    .maxpool_forward = cuda_maxpool_forward,
    .maxpool_backward = cuda_maxpool_backward,
    .avgpool_forward = cuda_avgpool_forward,
    .avgpool_backward = cuda_avgpool_backward,
    .batchnorm_forward = cuda_batchnorm_forward,
    .batchnorm_backward = cuda_batchnorm_backward,
    .sgd_step = cuda_sgd_step,
    .adam_step = cuda_adam_step,
    .lars_step = cuda_lars_step,
    .lamb_step = cuda_lamb_step,
    .gemm_batched = cuda_gemm_batched,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .softmax_rows_forward = cuda_softmax_rows_forward,
    .softmax_rows_backward = cuda_softmax_rows_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .mean_tokens_forward = cuda_mean_tokens_forward,
    .mean_tokens_backward = cuda_mean_tokens_backward,
    .causal_mask = cuda_causal_mask,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
};

/* ---- opening ----------------------------------------------------------------------------- */

int cuda_device_count(void) {
  int count = 0;
  /* No driver, no GPU, or a driver older than the runtime: all mean "no usable GPU". */
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

fl_status cuda_device_init(fl_device *dev, int ordinal) {
  fl_status status = FL_OK;
  cuda_impl *impl = NULL;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return fl_set_error(FL_ENODEVICE, "device cuda:%d: no usable CUDA driver or GPU: %s (%s)",
                        ordinal, cudaGetErrorString(err), cudaGetErrorName(err));
  }
  if (ordinal < 0 || ordinal >= count) {
    if (count == 0)
      return fl_set_error(FL_ENODEVICE, "device cuda:%d: this process sees no CUDA GPU", ordinal);
    return fl_set_error(FL_ENODEVICE,
                        "device cuda:%d: no such GPU (this process sees %d: cuda:0 to "
                        "cuda:%d; CUDA_VISIBLE_DEVICES may hide others)",
                        ordinal, count, count - 1);
  }
  impl = common_calloc(1, sizeof *impl);
  if (!impl) return FL_ERR(FL_ENOMEM, "device cuda:%d: out of host memory", ordinal);
  impl->es.ordinal = ordinal;

  struct cudaDeviceProp prop;
  CUDA_CHECK(&impl->es, cudaSetDevice(ordinal));
  CUDA_CHECK(&impl->es, cudaGetDeviceProperties(&prop, ordinal));
  impl->cc_major = prop.major;
  impl->cc_minor = prop.minor;
  /* Non-blocking: the legacy default stream (used by libraries that pass 0) must not
   * serialize against the device's work. */
  CUDA_CHECK(&impl->es, cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(&impl->es, cublasCreate(&impl->blas));
  CUBLAS_CHECK(&impl->es, cublasSetStream(impl->blas, impl->stream));
  /* Plain fp32 (no TF32 tensor cores) unless fl_device_set_precision says otherwise:
   * results must agree with the cpu device to about 1e-5, and TF32 keeps only 10 bits of
   * mantissa. */
  CUBLAS_CHECK(&impl->es, cublasSetMathMode(impl->blas, CUBLAS_DEFAULT_MATH));
  FL_CHECK(cuda_allocator_create(&impl->es, &impl->alloc));
  CUDA_CHECK(&impl->es, cudaMalloc((void **)&impl->sumsq_dev, sizeof(double)));
  CUDA_CHECK(&impl->es, cudaMallocHost((void **)&impl->sumsq_host, sizeof(double)));
  CUDA_CHECK(&impl->es, cudaHostAlloc((void **)&impl->bad_label_host, sizeof(int),
                                      cudaHostAllocMapped));
  *impl->bad_label_host = 0;
  CUDA_CHECK(&impl->es,
             cudaHostGetDevicePointer((void **)&impl->bad_label_dev, impl->bad_label_host, 0));

  dev->ops = &cuda_ops;
  dev->kind = FL_DEVICE_CUDA;
  dev->ordinal = ordinal;
  /* The marketing name fits easily; %.100s only bounds it for the compiler. */
  snprintf(dev->name, sizeof dev->name, "cuda:%d (%.100s)", ordinal, prop.name);
  CUDA_CHECK(&impl->es, cudaDeviceGetPCIBusId(dev->pci_bus_id, (int)sizeof dev->pci_bus_id, ordinal));
  dev->impl = impl;
  impl = NULL;
cleanup:
  impl_destroy(impl);
  return status;
}

fl_status cuda_device_allocator_stats(fl_device *dev, cuda_allocator_stats *out) {
  if (!dev || dev->ops != &cuda_ops || !out)
    return fl_set_error(FL_EINVAL, "cuda_device_allocator_stats: not a cuda device");
  cuda_allocator_get_stats(impl_of(dev)->alloc, out);
  return FL_OK;
}

fl_status cuda_device_flush_cache(fl_device *dev) {
  if (!dev || dev->ops != &cuda_ops)
    return fl_set_error(FL_EINVAL, "cuda_device_flush_cache: not a cuda device");
  ENTER(dev);
  return cuda_allocator_flush(impl->alloc);
}
