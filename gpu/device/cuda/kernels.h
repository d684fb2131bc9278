/*
 * gpu/device/cuda/kernels.h: launchers of the cuda device's kernels (kernels*.cu), for C.
 *
 * Each launcher queues its kernels on `stream` and returns at once with the launch's status
 * (cudaGetLastError after each launch); faults while the kernel runs surface at a later
 * synchronizing call. Sizes of zero queue nothing. Semantics are those of the matching
 * device_ops slot in gpu/device/backend.h; arguments were validated by the caller.
 */
#ifndef FLINT_GPU_CUDA_KERNELS_H
#define FLINT_GPU_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t kernels_fill(cudaStream_t s, size_t n, float value, float *x);
/* y = x rounded to bfloat16 (bf16) or IEEE half, n elements of 2 bytes: a 16-bit GEMM's input. */
cudaError_t kernels_to_16bit(cudaStream_t s, size_t n, const float *x, bool bf16, void *y);
cudaError_t kernels_axpy(cudaStream_t s, size_t n, float a, const float *x, float *y);
cudaError_t kernels_scale(cudaStream_t s, size_t n, float a, float *x);
/* *out (device) = sum of x[i]^2 in double (out is overwritten). */
cudaError_t kernels_sum_squares(cudaStream_t s, size_t n, const float *x, double *out);

cudaError_t kernels_relu_forward(cudaStream_t s, size_t n, const float *x, float *y);
cudaError_t kernels_relu_backward(cudaStream_t s, size_t n, const float *y, const float *dy,
                                  float *dx);

cudaError_t kernels_bias_add_rows(cudaStream_t s, int rows, int cols, const float *b,
                                  float *y);
cudaError_t kernels_bias_grad_rows(cudaStream_t s, int rows, int cols, const float *dy,
                                   float *db);
cudaError_t kernels_bias_add_channels(cudaStream_t s, int n, int c, int hw, const float *b,
                                      float *y);
cudaError_t kernels_bias_grad_channels(cudaStream_t s, int n, int c, int hw, const float *dy,
                                       float *db);

/* bad_label (device-visible, e.g. mapped pinned memory) is set to 1 by a row whose label is
 * outside [0, c); that row's dlogits get the softmax without the one-hot term and its stats
 * are not counted. */
cudaError_t kernels_softmax_xent(cudaStream_t s, int n, int c, const float *logits,
                                 const int32_t *labels, float smoothing, float grad_scale,
                                 float *dlogits, float *stats, int *bad_label);

cudaError_t kernels_im2col(cudaStream_t s, int n, int c, int h, int w, int kh, int kw,
                           int stride, int pad, const float *x, float *col);
cudaError_t kernels_col2im(cudaStream_t s, int n, int c, int h, int w, int kh, int kw,
                           int stride, int pad, const float *col, float *dx);
cudaError_t kernels_swap01(cudaStream_t s, int a_dim, int b_dim, int s_dim, const float *x,
                           float *y);

cudaError_t kernels_maxpool_forward(cudaStream_t s, int n, int c, int h, int w, int k,
                                    int stride, int pad, const float *x, float *y,
                                    int32_t *argmax);
cudaError_t kernels_maxpool_backward(cudaStream_t s, int n, int c, int h, int w, int k,
                                     int stride, int pad, const float *dy,
                                     const int32_t *argmax, float *dx);
cudaError_t kernels_avgpool_forward(cudaStream_t s, int n, int c, int h, int w, int k,
                                    int stride, int pad, const float *x, float *y);
cudaError_t kernels_avgpool_backward(cudaStream_t s, int n, int c, int h, int w, int k,
                                     int stride, int pad, const float *dy, float *dx);

cudaError_t kernels_batchnorm_forward(cudaStream_t s, int n, int c, int hw, const float *x,
                                      const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum,
                                      float eps, bool train, float *saved_mean,
                                      float *saved_inv_std, float *y);
/* scratch: 2*c floats of device memory for the per-channel sums. */
cudaError_t kernels_batchnorm_backward(cudaStream_t s, int n, int c, int hw, const float *x,
                                       const float *dy, const float *gamma,
                                       const float *saved_mean, const float *saved_inv_std,
                                       float *dx, float *dgamma, float *dbeta, float *scratch);

cudaError_t kernels_sgd_step(cudaStream_t s, size_t n, float lr, float momentum,
                             float weight_decay, bool nesterov, const float *grad,
                             float *velocity, float *w);
/* kernels_optim.cu. The layer-wise steps zero norms (2 * nseg doubles) and fill it. */
struct optim_segment; /* gpu/device/backend.h */
cudaError_t kernels_adam_step(cudaStream_t s, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, bool decoupled, float bias1,
                              float bias2, const float *grad, float *m, float *v, float *w);
cudaError_t kernels_lars_step(cudaStream_t s, int nseg, const struct optim_segment *segs,
                              size_t n, float lr, float momentum, float trust_coef,
                              const float *grad, float *velocity, float *w, double *norms);
cudaError_t kernels_lamb_step(cudaStream_t s, int nseg, const struct optim_segment *segs,
                              size_t n, float lr, float beta1, float beta2, float eps,
                              float bias1, float bias2, const float *grad, float *m, float *v,
                              float *w, double *norms);

/* Transformer operations. The mean over tokens calls its token count `tokens` (the slot's s),
 * since `s` is the stream here. */
cudaError_t kernels_gelu_forward(cudaStream_t s, size_t n, const float *x, float *y);
cudaError_t kernels_gelu_backward(cudaStream_t s, size_t n, const float *x, const float *dy,
                                  float *dx);
cudaError_t kernels_softmax_rows_forward(cudaStream_t s, int rows, int cols, float scale,
                                         const float *x, float *y);
cudaError_t kernels_softmax_rows_backward(cudaStream_t s, int rows, int cols, float scale,
                                          const float *y, const float *dy, float *dx);
/* Serves dropout_forward (x, y) and dropout_backward (dy, dx): the same mask and scale. */
cudaError_t kernels_dropout(cudaStream_t s, int outer, int inner, int cols, int64_t outer0,
                            int64_t inner0, int64_t inner_total, float p, uint64_t seed,
                            const float *x, float *y);
cudaError_t kernels_mean_tokens_forward(cudaStream_t s, int n, int tokens, int h,
                                        const float *x, float *y);
cudaError_t kernels_mean_tokens_backward(cudaStream_t s, int n, int tokens, int h,
                                         const float *dy, float *dx);
/* -inf above the diagonal of each of `batch` [tokens, tokens] score matrices. */
cudaError_t kernels_causal_mask(cudaStream_t s, int batch, int tokens, float *scores);

/* gpu/device/cuda/kernels_norm.cu: layer norm (a warp per row; dgamma and dbeta by atomics)
 * and embeddings (an id outside [0, vocab) writes zeros and sets *bad_id). */
cudaError_t kernels_layernorm_forward(cudaStream_t s, int rows, int cols, float eps, const float *x,
                                      const float *gamma, const float *beta, float *y, float *mean,
                                      float *rstd);
cudaError_t kernels_layernorm_backward(cudaStream_t s, int rows, int cols, const float *x, const float *dy,
                                       const float *gamma, const float *mean, const float *rstd, float *dx,
                                       float *dgamma, float *dbeta);
cudaError_t kernels_embedding_forward(cudaStream_t s, size_t count, int dim, int vocab, const float *ids,
                                      const float *table, float *y, int *bad_id);
cudaError_t kernels_embedding_backward(cudaStream_t s, size_t count, int dim, int vocab, const float *ids,
                                       const float *dy, float *dtable, int *bad_id);

#ifdef __cplusplus
}
#endif
#endif /* FLINT_GPU_CUDA_KERNELS_H */
