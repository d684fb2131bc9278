/*
 * gpu/device/cuda/kernels_transformer.cu: the cuda device's kernels for the transformer: GELU,
 * row softmax, keyed dropout and the mean over tokens. Conventions: gpu/device/cuda/kernels.cu.
 */
#include "gpu/device/cuda/kernels_common.cuh"
#include "gpu/device/backend.h" /* dropout_keep: the one mask function, shared with the cpu device */

namespace {

/* ---- transformer operations ------------------------------------------------------------ */

/* GELU, tanh approximation (gpu/device/backend.h). tanhf, not the fast intrinsic: the cpu device
 * must agree to about 1e-5. */
constexpr float kGeluC = 0.7978845608028654f; /* sqrt(2 / pi) */
constexpr float kGeluA = 0.044715f;

__global__ void gelu_forward_kernel(size_t n, const float *x, float *y) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

__global__ void gelu_backward_kernel(size_t n, const float *x, const float *dy, float *dx) {
  GRID_STRIDE(i, n) {
    float v = x[i];
    float t = tanhf(kGeluC * (v + kGeluA * v * v * v));
    float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

/* Rows up to this long go one to a warp (kRowsPerBlock a block); longer ones one to a block
 * of kThreads, so that a long row is not left to 32 threads. */
constexpr int kSoftmaxWarpCols = 1024;

/* Row softmax of scale * x, a warp per row. The max is subtracted before exp; each element
 * is read and written by one lane only after the row's reductions, so y may alias x. */
__global__ void softmax_rows_warp_kernel(int rows, int cols, float scale, const float *x,
                                         float *y) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return; /* the whole warp leaves together */
  const float *xr = x + (size_t)row * cols;
  float *yr = y + (size_t)row * cols;
  float m = -INFINITY;
  for (int j = lane; j < cols; j += 32) m = fmaxf(m, scale * xr[j]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  float sum = 0.0f;
  for (int j = lane; j < cols; j += 32) sum += expf(scale * xr[j] - m);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  float inv = 1.0f / sum;
  for (int j = lane; j < cols; j += 32) yr[j] = expf(scale * xr[j] - m) * inv;
}

/* The same with a block per row (blockIdx.x is the row). */
__global__ void softmax_rows_block_kernel(int cols, float scale, const float *x, float *y) {
  __shared__ float shared[32];
  const float *xr = x + (size_t)blockIdx.x * cols;
  float *yr = y + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, scale * xr[j]);
  m = block_max(m, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(scale * xr[j] - m);
  float inv = 1.0f / block_sum(sum, shared);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = expf(scale * xr[j] - m) * inv;
}

/* dx = scale * y * (dy - sum_j dy_j y_j), a warp per row; dx may alias dy or y. */
__global__ void softmax_rows_backward_warp_kernel(int rows, int cols, float scale,
                                                  const float *y, const float *dy,
                                                  float *dx) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  size_t base = (size_t)row * cols;
  float dot = 0.0f;
  for (int j = lane; j < cols; j += 32) dot += dy[base + j] * y[base + j];
  for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
  for (int j = lane; j < cols; j += 32)
    dx[base + j] = scale * y[base + j] * (dy[base + j] - dot);
}

__global__ void softmax_rows_backward_block_kernel(int cols, float scale, const float *y,
                                                   const float *dy, float *dx) {
  __shared__ float shared[32];
  size_t base = (size_t)blockIdx.x * cols;
  float dot = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) dot += dy[base + j] * y[base + j];
  dot = block_sum(dot, shared);
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    dx[base + j] = scale * y[base + j] * (dy[base + j] - dot);
}

/* Inverted dropout over x [outer, inner, cols] with the keyed mask of gpu/device/backend.h; forward
 * and backward are the same map (x, y) or (dy, dx), and y may alias x. */
__global__ void dropout_kernel(size_t total, int inner, int cols, int64_t outer0,
                               int64_t inner0, int64_t inner_total, float p, float keep_scale,
                               uint64_t seed, const float *x, float *y) {
  GRID_STRIDE(i, total) {
    size_t k = i % (size_t)cols;
    size_t row = i / (size_t)cols;
    size_t j = row % (size_t)inner, o = row / (size_t)inner;
    uint64_t g = ((uint64_t)(outer0 + (int64_t)o) * (uint64_t)inner_total +
                  (uint64_t)(inner0 + (int64_t)j)) *
                     (uint64_t)cols +
                 k;
    y[i] = dropout_keep(seed, g, p) ? x[i] * keep_scale : 0.0f;
  }
}

/* y[b, c] = mean over t of x[b, t, c]: a thread per output, whose loop over tokens reads
 * neighbouring columns across the warp (coalesced). */
__global__ void mean_tokens_forward_kernel(size_t total, int s, int h, const float *x,
                                           float *y) {
  GRID_STRIDE(i, total) {
    size_t b = i / (size_t)h, c = i % (size_t)h;
    const float *xb = x + b * (size_t)s * h + c;
    float acc = 0.0f;
    for (int t = 0; t < s; t++) acc += xb[(size_t)t * h];
    y[i] = acc / (float)s;
  }
}

__global__ void mean_tokens_backward_kernel(size_t total, int s, int h, const float *dy,
                                            float *dx) {
  GRID_STRIDE(i, total) {
    size_t c = i % (size_t)h, b = i / ((size_t)s * h);
    dx[i] = dy[b * h + c] / (float)s;
  }
}

} // namespace

/* ---- launchers ------------------------------------------------------------------------- */

extern "C" {

__global__ void causal_mask_kernel(size_t total, int s, float *scores) {
  GRID_STRIDE(i, total) {
    size_t within = i % ((size_t)s * s);
    if ((int)(within % s) > (int)(within / s)) scores[i] = -INFINITY;
  }
}

cudaError_t kernels_gelu_forward(cudaStream_t s, size_t n, const float *x, float *y) {
  if (n == 0) return cudaSuccess;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_gelu_backward(cudaStream_t s, size_t n, const float *x, const float *dy,
                                  float *dx) {
  if (n == 0) return cudaSuccess;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, dy, dx);
  return cudaGetLastError();
}

cudaError_t kernels_softmax_rows_forward(cudaStream_t s, int rows, int cols, float scale,
                                         const float *x, float *y) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (cols <= kSoftmaxWarpCols) {
    unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    softmax_rows_warp_kernel<<<blocks, kThreads, 0, s>>>(rows, cols, scale, x, y);
  } else {
    softmax_rows_block_kernel<<<(unsigned)rows, kThreads, 0, s>>>(cols, scale, x, y);
  }
  return cudaGetLastError();
}

cudaError_t kernels_softmax_rows_backward(cudaStream_t s, int rows, int cols, float scale,
                                          const float *y, const float *dy, float *dx) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (cols <= kSoftmaxWarpCols) {
    unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    softmax_rows_backward_warp_kernel<<<blocks, kThreads, 0, s>>>(rows, cols, scale, y, dy,
                                                                   dx);
  } else {
    softmax_rows_backward_block_kernel<<<(unsigned)rows, kThreads, 0, s>>>(cols, scale, y, dy,
                                                                           dx);
  }
  return cudaGetLastError();
}

cudaError_t kernels_dropout(cudaStream_t s, int outer, int inner, int cols, int64_t outer0,
                            int64_t inner0, int64_t inner_total, float p, uint64_t seed,
                            const float *x, float *y) {
  size_t total = (size_t)outer * inner * cols;
  if (total == 0) return cudaSuccess;
  /* p == 1 keeps nothing (dropout_keep is never true), so its scale is never used. */
  float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  dropout_kernel<<<grid_for(total), kThreads, 0, s>>>(total, inner, cols, outer0, inner0,
                                                      inner_total, p, keep_scale, seed, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_mean_tokens_forward(cudaStream_t s, int n, int tokens, int h,
                                        const float *x, float *y) {
  size_t total = (size_t)n * h;
  if (total == 0) return cudaSuccess;
  mean_tokens_forward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, tokens, h, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_mean_tokens_backward(cudaStream_t s, int n, int tokens, int h,
                                         const float *dy, float *dx) {
  size_t total = (size_t)n * tokens * h;
  if (total == 0) return cudaSuccess;
  mean_tokens_backward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, tokens, h, dy, dx);
  return cudaGetLastError();
}

} // extern "C"

cudaError_t kernels_causal_mask(cudaStream_t s, int batch, int tokens, float *scores) {
  size_t total = (size_t)batch * tokens * tokens;
  if (total == 0) return cudaSuccess;
  causal_mask_kernel<<<grid_for(total), kThreads, 0, s>>>(total, tokens, scores);
  return cudaGetLastError();
}
