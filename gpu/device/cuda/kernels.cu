/*
 * gpu/device/cuda/kernels.cu: the cuda device's own kernels (everything but GEMM, which is
 * cuBLAS), with kernels_image.cu and kernels_transformer.cu; they share kernels_common.cuh.
 *
 * Conventions: 256 threads a block; element-wise kernels use grid-stride loops over size_t
 * indices, with the grid capped (a few blocks per SM is enough to saturate memory); every
 * launcher returns early for empty work, since a zero-sized grid is a launch error, and
 * returns cudaGetLastError() after its launches. Reductions (bias gradients, batch-norm
 * statistics, sum of squares) reduce within a block by warp shuffles and shared memory, in
 * double where the sum can be long, and accumulate into their outputs. Inverse operations
 * that scatter (col2im, pooling backward) are written as gathers per input element, so they
 * need no atomics and give the same bits on every run. Row-wise kernels (softmax) give a
 * row to a warp when it is short and to a block when it is long.
 *
 * This file: element-wise operations, bias gradients, softmax cross-entropy and the SGD step;
 * the image kernels are kernels_image.cu, the transformer's kernels_transformer.cu.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/device/cuda/kernels_common.cuh"

namespace {

/* ---- element-wise ---------------------------------------------------------------------- */

__global__ void fill_kernel(size_t n, float value, float *x) {
  GRID_STRIDE(i, n) x[i] = value;
}

/* Round to nearest even; fp16 saturates to infinity above 65504 (what a loss scaler watches). */
__global__ void to_bf16_kernel(size_t n, const float *x, __nv_bfloat16 *y) {
  GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_fp16_kernel(size_t n, const float *x, __half *y) {
  GRID_STRIDE(i, n) y[i] = __float2half_rn(x[i]);
}

__global__ void axpy_kernel(size_t n, float a, const float *x, float *y) {
  GRID_STRIDE(i, n) y[i] = a * x[i] + y[i];
}

__global__ void scale_kernel(size_t n, float a, float *x) {
  GRID_STRIDE(i, n) x[i] = a * x[i];
}

__global__ void sum_squares_kernel(size_t n, const float *x, double *out) {
  __shared__ double shared[32];
  double acc = 0;
  GRID_STRIDE(i, n) {
    double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

__global__ void relu_forward_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

__global__ void relu_backward_kernel(size_t n, const float *y, const float *dy, float *dx) {
  GRID_STRIDE(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void bias_add_rows_kernel(size_t total, int cols, const float *b, float *y) {
  GRID_STRIDE(i, total) y[i] += b[i % (size_t)cols];
}

__global__ void bias_add_channels_kernel(size_t total, int c, int hw, const float *b, float *y) {
  GRID_STRIDE(i, total) y[i] += b[(i / (size_t)hw) % (size_t)c];
}

__global__ void sgd_step_kernel(size_t n, float lr, float momentum, float weight_decay,
                                bool nesterov, const float *grad, float *velocity, float *w) {
  GRID_STRIDE(i, n) {
    float g = grad[i] + weight_decay * w[i];
    float v = momentum * velocity[i] + g;
    velocity[i] = v;
    w[i] -= lr * (nesterov ? g + momentum * v : v);
  }
}

/* ---- bias gradients -------------------------------------------------------------------- */

/* db[c] += sum_r dy[r, c]. A block is 32 columns x 8 row lanes, so that a warp reads 32
 * neighbouring columns of one row (coalesced); blockIdx.y splits the rows when there are
 * many, and those partial sums meet in db by atomicAdd. */
constexpr int kRowLanes = 8;
__global__ void bias_grad_rows_kernel(int rows, int cols, const float *dy, float *db) {
  __shared__ float part[kRowLanes][33];
  int col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (int r = blockIdx.y * kRowLanes + threadIdx.y; r < rows; r += kRowLanes * gridDim.y)
      acc += dy[(size_t)r * cols + col];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float sum = 0.0f;
    for (int k = 0; k < kRowLanes; k++) sum += part[k][threadIdx.x];
    if (gridDim.y == 1)
      db[col] += sum;
    else
      atomicAdd(&db[col], sum);
  }
}

/* db[ch] += sum over n and hw of dy[n, ch, :]: blockIdx.x is the channel, blockIdx.y splits
 * its n*hw elements when there are many. */
__global__ void bias_grad_channels_kernel(int n, int c, int hw, const float *dy, float *db) {
  __shared__ double shared[32];
  int ch = blockIdx.x;
  size_t m = (size_t)n * hw;
  double acc = 0;
  for (size_t i = (size_t)blockIdx.y * blockDim.x + threadIdx.x; i < m;
       i += (size_t)blockDim.x * gridDim.y) {
    size_t b = i / (size_t)hw, s = i % (size_t)hw;
    acc += dy[(b * c + ch) * hw + s];
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) {
    if (gridDim.y == 1)
      db[ch] += (float)acc;
    else
      atomicAdd(&db[ch], (float)acc);
  }
}

/* ---- softmax cross-entropy: one warp per row ------------------------------------------- */

__global__ void softmax_xent_kernel(int n, int c, const float *logits, const int32_t *labels,
                                    float smoothing, float grad_scale, float *dlogits,
                                    float *stats, int *bad_label) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= n) return; /* the whole warp leaves together; no block barrier follows */
  const float *x = logits + (size_t)row * c;
  float *d = dlogits + (size_t)row * c;

  /* Max for a stable exp, and the argmax (the first index on ties, as a loop would). */
  float best = -INFINITY;
  int best_j = c;
  for (int j = lane; j < c; j += 32) {
    float v = x[j];
    if (v > best) {
      best = v;
      best_j = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oj = __shfl_xor_sync(0xffffffffu, best_j, o);
    if (ov > best || (ov == best && oj < best_j)) {
      best = ov;
      best_j = oj;
    }
  }
  float sum = 0.0f, zsum = 0.0f;
  for (int j = lane; j < c; j += 32) {
    sum += expf(x[j] - best);
    zsum += x[j] - best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    zsum += __shfl_xor_sync(0xffffffffu, zsum, o);
  }

  int label = labels[row];
  bool ok = label >= 0 && label < c;
  float x_label = ok ? x[label] : 0.0f;
  __syncwarp(); /* every lane has read x[label] before any lane writes dlogits (may alias) */
  float inv_sum = 1.0f / sum;
  float off = smoothing / (float)c, on = 1.0f - smoothing + off;
  for (int j = lane; j < c; j += 32) {
    float p = expf(x[j] - best) * inv_sum;
    d[j] = (p - (ok && j == label ? on : off)) * grad_scale;
  }
  if (lane == 0) {
    if (!ok) {
      *(volatile int *)bad_label = 1;
    } else {
      float log_sum = logf(sum);
      atomicAdd(&stats[0], (1.0f - smoothing) * (log_sum - (x_label - best)) +
                               smoothing * (log_sum - zsum / (float)c));
      if (best_j == label) atomicAdd(&stats[1], 1.0f);
    }
  }
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------- */

extern "C" {

cudaError_t kernels_fill(cudaStream_t s, size_t n, float value, float *x) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(n, value, x);
  return cudaGetLastError();
}

cudaError_t kernels_to_16bit(cudaStream_t s, size_t n, const float *x, bool bf16, void *y) {
  if (n == 0) return cudaSuccess;
  if (bf16)
    to_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, (__nv_bfloat16 *)y);
  else
    to_fp16_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, (__half *)y);
  return cudaGetLastError();
}

cudaError_t kernels_axpy(cudaStream_t s, size_t n, float a, const float *x, float *y) {
  if (n == 0) return cudaSuccess;
  axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(n, a, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_scale(cudaStream_t s, size_t n, float a, float *x) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(n, a, x);
  return cudaGetLastError();
}

cudaError_t kernels_sum_squares(cudaStream_t s, size_t n, const float *x, double *out) {
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof *out, s);
  if (err != cudaSuccess || n == 0) return err;
  sum_squares_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, out);
  return cudaGetLastError();
}

cudaError_t kernels_relu_forward(cudaStream_t s, size_t n, const float *x, float *y) {
  if (n == 0) return cudaSuccess;
  relu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_relu_backward(cudaStream_t s, size_t n, const float *y, const float *dy,
                                  float *dx) {
  if (n == 0) return cudaSuccess;
  relu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t kernels_bias_add_rows(cudaStream_t s, int rows, int cols, const float *b,
                                  float *y) {
  size_t total = (size_t)rows * cols;
  if (total == 0) return cudaSuccess;
  bias_add_rows_kernel<<<grid_for(total), kThreads, 0, s>>>(total, cols, b, y);
  return cudaGetLastError();
}

cudaError_t kernels_bias_grad_rows(cudaStream_t s, int rows, int cols, const float *dy,
                                   float *db) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  /* Split the rows over more blocks only when the columns alone give too few. */
  unsigned col_blocks = (unsigned)((cols + 31) / 32);
  unsigned row_blocks = 1;
  while (col_blocks * row_blocks < 256 && (size_t)row_blocks * kRowLanes * 64 < (size_t)rows)
    row_blocks *= 2;
  dim3 grid(col_blocks, row_blocks), block(32, kRowLanes);
  bias_grad_rows_kernel<<<grid, block, 0, s>>>(rows, cols, dy, db);
  return cudaGetLastError();
}

cudaError_t kernels_bias_add_channels(cudaStream_t s, int n, int c, int hw, const float *b,
                                      float *y) {
  size_t total = (size_t)n * c * hw;
  if (total == 0) return cudaSuccess;
  bias_add_channels_kernel<<<grid_for(total), kThreads, 0, s>>>(total, c, hw, b, y);
  return cudaGetLastError();
}

cudaError_t kernels_bias_grad_channels(cudaStream_t s, int n, int c, int hw, const float *dy,
                                       float *db) {
  size_t m = (size_t)n * hw;
  if (m == 0 || c == 0) return cudaSuccess;
  unsigned split = 1;
  while ((unsigned)c * split < 256 && (size_t)split * kThreads * 16 < m && split < 65535)
    split *= 2;
  bias_grad_channels_kernel<<<dim3((unsigned)c, split), kThreads, 0, s>>>(n, c, hw, dy, db);
  return cudaGetLastError();
}

cudaError_t kernels_softmax_xent(cudaStream_t s, int n, int c, const float *logits,
                                 const int32_t *labels, float smoothing, float grad_scale,
                                 float *dlogits, float *stats, int *bad_label) {
  if (n == 0 || c == 0) return cudaSuccess;
  unsigned blocks = (unsigned)((n + kRowsPerBlock - 1) / kRowsPerBlock);
  softmax_xent_kernel<<<blocks, kThreads, 0, s>>>(n, c, logits, labels, smoothing, grad_scale,
                                                   dlogits, stats, bad_label);
  return cudaGetLastError();
}

cudaError_t kernels_sgd_step(cudaStream_t s, size_t n, float lr, float momentum,
                             float weight_decay, bool nesterov, const float *grad,
                             float *velocity, float *w) {
  if (n == 0) return cudaSuccess;
  sgd_step_kernel<<<grid_for(n), kThreads, 0, s>>>(n, lr, momentum, weight_decay, nesterov,
                                                   grad, velocity, w);
  return cudaGetLastError();
}

} // extern "C"
