/*
 * gpu/device/cuda/kernels.cu: the cuda device's own kernels (everything but GEMM, which is cuBLAS).
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
 */
#include <math.h>

#include "gpu/device/cuda/kernels.h"
#include "gpu/device/backend.h" /* dropout_keep: the one mask function, shared with the cpu device */

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 8192;
constexpr int kReduceThreads = 512; /* one block per channel: more threads per block */

unsigned grid_for(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return blocks > kMaxBlocks ? kMaxBlocks : (unsigned)blocks;
}

#define GRID_STRIDE(i, n)                                                                    \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
       i += (size_t)blockDim.x * gridDim.x)

/* The sum of v over the block, returned to every thread. blockDim.x must be a multiple of
 * 32 (at most 1024); `shared` holds 32 values. */
template <typename T>
__device__ T block_sum(T v, T *shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads(); /* an earlier call's readers of shared[0] are done */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int warps = blockDim.x >> 5;
    v = lane < warps ? shared[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

/* The maximum of v over the block, returned to every thread (as block_sum). */
__device__ float block_max(float v, float *shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int warps = blockDim.x >> 5;
    v = lane < warps ? shared[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

/* ---- element-wise ---------------------------------------------------------------------- */

__global__ void fill_kernel(size_t n, float value, float *x) {
  GRID_STRIDE(i, n) x[i] = value;
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

constexpr int kRowsPerBlock = kThreads / 32;
__global__ void softmax_xent_kernel(int n, int c, const float *logits, const int32_t *labels,
                                    float grad_scale, float *dlogits, float *stats,
                                    int *bad_label) {
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
  float sum = 0.0f;
  for (int j = lane; j < c; j += 32) sum += expf(x[j] - best);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);

  int label = labels[row];
  bool ok = label >= 0 && label < c;
  float x_label = ok ? x[label] : 0.0f;
  __syncwarp(); /* every lane has read x[label] before any lane writes dlogits (may alias) */
  float inv_sum = 1.0f / sum;
  for (int j = lane; j < c; j += 32) {
    float p = expf(x[j] - best) * inv_sum;
    d[j] = (p - (ok && j == label ? 1.0f : 0.0f)) * grad_scale;
  }
  if (lane == 0) {
    if (!ok) {
      *(volatile int *)bad_label = 1;
    } else {
      atomicAdd(&stats[0], logf(sum) - (x_label - best));
      if (best_j == label) atomicAdd(&stats[1], 1.0f);
    }
  }
}

/* ---- convolution helpers --------------------------------------------------------------- */

__global__ void im2col_kernel(size_t total, int n, int c, int h, int w, int kh, int kw,
                              int stride, int pad, int oh, int ow, const float *x,
                              float *col) {
  size_t cols = (size_t)n * oh * ow;
  GRID_STRIDE(i, total) {
    size_t row = i / cols, cc = i % cols;
    int ci = (int)(row / ((size_t)kh * kw));
    int kk = (int)(row % ((size_t)kh * kw));
    int ki = kk / kw, kj = kk % kw;
    size_t b = cc / ((size_t)oh * ow);
    int p = (int)(cc % ((size_t)oh * ow));
    int iy = (p / ow) * stride - pad + ki, ix = (p % ow) * stride - pad + kj;
    float v = 0.0f;
    if (iy >= 0 && iy < h && ix >= 0 && ix < w) v = x[((b * c + ci) * h + iy) * w + ix];
    col[i] = v;
  }
}

/* dx[b, ci, y, x] += every col entry that im2col copied from there. */
__global__ void col2im_kernel(size_t total, int n, int c, int h, int w, int kh, int kw,
                              int stride, int pad, int oh, int ow, const float *col,
                              float *dx) {
  size_t cols = (size_t)n * oh * ow;
  GRID_STRIDE(i, total) {
    int xx = (int)(i % w);
    int yy = (int)((i / w) % h);
    int ci = (int)((i / ((size_t)w * h)) % c);
    size_t b = i / ((size_t)w * h * c);
    float acc = 0.0f;
    for (int ki = 0; ki < kh; ki++) {
      int ty = yy + pad - ki;
      if (ty < 0 || ty % stride != 0) continue;
      int oy = ty / stride;
      if (oy >= oh) continue;
      for (int kj = 0; kj < kw; kj++) {
        int tx = xx + pad - kj;
        if (tx < 0 || tx % stride != 0) continue;
        int ox = tx / stride;
        if (ox >= ow) continue;
        size_t row = ((size_t)ci * kh + ki) * kw + kj;
        acc += col[row * cols + (b * oh + oy) * ow + ox];
      }
    }
    dx[i] += acc;
  }
}

__global__ void swap01_kernel(size_t total, int a_dim, int b_dim, int s_dim, const float *x,
                              float *y) {
  GRID_STRIDE(i, total) {
    size_t s = i % (size_t)s_dim;
    size_t a = (i / (size_t)s_dim) % (size_t)a_dim;
    size_t b = i / ((size_t)s_dim * a_dim);
    y[i] = x[(a * b_dim + b) * s_dim + s];
  }
}

/* ---- pooling --------------------------------------------------------------------------- */

/* The output rows (or columns) whose window covers input row i: [*lo, *hi]. */
__device__ void covering(int i, int k, int stride, int pad, int out, int *lo, int *hi) {
  int t = i + pad - k + 1;
  *lo = t <= 0 ? 0 : (t + stride - 1) / stride;
  int h = (i + pad) / stride;
  *hi = h < out - 1 ? h : out - 1;
}

__global__ void maxpool_forward_kernel(size_t total, int h, int w, int k, int stride, int pad,
                                       int oh, int ow, const float *x, float *y,
                                       int32_t *argmax) {
  GRID_STRIDE(i, total) {
    int ox = (int)(i % ow), oy = (int)((i / ow) % oh);
    size_t plane = i / ((size_t)oh * ow);
    const float *xp = x + plane * h * w;
    float best = -INFINITY;
    int best_at = -1;
    for (int ki = 0; ki < k; ki++) {
      int iy = oy * stride - pad + ki;
      if (iy < 0 || iy >= h) continue;
      for (int kj = 0; kj < k; kj++) {
        int ix = ox * stride - pad + kj;
        if (ix < 0 || ix >= w) continue;
        float v = xp[iy * w + ix];
        if (best_at < 0 || v > best) {
          best = v;
          best_at = iy * w + ix;
        }
      }
    }
    y[i] = best_at < 0 ? 0.0f : best;
    argmax[i] = best_at;
  }
}

__global__ void maxpool_backward_kernel(size_t total, int h, int w, int k, int stride, int pad,
                                        int oh, int ow, const float *dy, const int32_t *argmax,
                                        float *dx) {
  GRID_STRIDE(i, total) {
    int ix = (int)(i % w), iy = (int)((i / w) % h);
    size_t plane = i / ((size_t)h * w);
    int here = iy * w + ix, y0, y1, x0, x1;
    covering(iy, k, stride, pad, oh, &y0, &y1);
    covering(ix, k, stride, pad, ow, &x0, &x1);
    float acc = 0.0f;
    for (int oy = y0; oy <= y1; oy++)
      for (int ox = x0; ox <= x1; ox++) {
        size_t o = (plane * oh + oy) * ow + ox;
        if (argmax[o] == here) acc += dy[o];
      }
    dx[i] = acc;
  }
}

__global__ void avgpool_forward_kernel(size_t total, int h, int w, int k, int stride, int pad,
                                       int oh, int ow, const float *x, float *y) {
  GRID_STRIDE(i, total) {
    int ox = (int)(i % ow), oy = (int)((i / ow) % oh);
    size_t plane = i / ((size_t)oh * ow);
    const float *xp = x + plane * h * w;
    float acc = 0.0f;
    for (int ki = 0; ki < k; ki++) {
      int iy = oy * stride - pad + ki;
      if (iy < 0 || iy >= h) continue;
      for (int kj = 0; kj < k; kj++) {
        int ix = ox * stride - pad + kj;
        if (ix >= 0 && ix < w) acc += xp[iy * w + ix];
      }
    }
    y[i] = acc / (float)(k * k);
  }
}

__global__ void avgpool_backward_kernel(size_t total, int h, int w, int k, int stride, int pad,
                                        int oh, int ow, const float *dy, float *dx) {
  GRID_STRIDE(i, total) {
    int ix = (int)(i % w), iy = (int)((i / w) % h);
    size_t plane = i / ((size_t)h * w);
    int y0, y1, x0, x1;
    covering(iy, k, stride, pad, oh, &y0, &y1);
    covering(ix, k, stride, pad, ow, &x0, &x1);
    float acc = 0.0f;
    for (int oy = y0; oy <= y1; oy++)
      for (int ox = x0; ox <= x1; ox++) acc += dy[(plane * oh + oy) * ow + ox];
    dx[i] = acc / (float)(k * k);
  }
}

/* ---- batch norm ------------------------------------------------------------------------ */

/* One block per channel: mean, then the variance around it (two passes over the channel,
 * more accurate than E[x^2] - E[x]^2), saved for backward; running statistics updated. */
__global__ void bn_stats_kernel(int n, int c, int hw, const float *x, float *running_mean,
                                float *running_var, float momentum, float eps,
                                float *saved_mean, float *saved_inv_std) {
  __shared__ double shared[32];
  int ch = blockIdx.x;
  size_t m = (size_t)n * hw;
  double acc = 0;
  for (size_t i = threadIdx.x; i < m; i += blockDim.x)
    acc += x[((i / hw) * c + ch) * hw + i % hw];
  double mean = block_sum(acc, shared) / (double)m;
  acc = 0;
  for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
    double d = x[((i / hw) * c + ch) * hw + i % hw] - mean;
    acc += d * d;
  }
  double var = block_sum(acc, shared) / (double)m;
  if (threadIdx.x == 0) {
    saved_mean[ch] = (float)mean;
    saved_inv_std[ch] = (float)(1.0 / sqrt(var + (double)eps));
    /* PyTorch updates the running variance with the unbiased estimate; one value per
     * channel has none, so it keeps the biased one rather than divide by zero. */
    double unbiased = m > 1 ? var * (double)m / (double)(m - 1) : var;
    running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * (float)mean;
    running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * (float)unbiased;
  }
}

/* y = gamma * (x - mean) * inv_std + beta; in inference mean and var are the running ones. */
__global__ void bn_apply_kernel(size_t total, int c, int hw, const float *x, const float *gamma,
                                const float *beta, const float *mean, const float *inv_std,
                                const float *running_var, float eps, float *y) {
  GRID_STRIDE(i, total) {
    int ch = (int)((i / (size_t)hw) % (size_t)c);
    float inv = inv_std ? inv_std[ch] : 1.0f / sqrtf(running_var[ch] + eps);
    y[i] = gamma[ch] * (x[i] - mean[ch]) * inv + beta[ch];
  }
}

/* Per channel: sum dy and sum dy * xhat (into scratch, for dx) and accumulate them into
 * dbeta and dgamma. */
__global__ void bn_grad_sums_kernel(int n, int c, int hw, const float *x, const float *dy,
                                    const float *mean, const float *inv_std, float *scratch,
                                    float *dgamma, float *dbeta) {
  __shared__ double shared[32];
  int ch = blockIdx.x;
  size_t m = (size_t)n * hw;
  float mu = mean[ch], inv = inv_std[ch];
  double sdy = 0, sdyx = 0;
  for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
    size_t at = ((i / hw) * c + ch) * hw + i % hw;
    double g = dy[at];
    sdy += g;
    sdyx += g * (double)((x[at] - mu) * inv);
  }
  sdy = block_sum(sdy, shared);
  sdyx = block_sum(sdyx, shared);
  if (threadIdx.x == 0) {
    scratch[ch] = (float)sdy;
    scratch[c + ch] = (float)sdyx;
    dbeta[ch] += (float)sdy;
    dgamma[ch] += (float)sdyx;
  }
}

/* dx = gamma * inv_std / m * (m * dy - sum dy - xhat * sum(dy * xhat)). */
__global__ void bn_dx_kernel(size_t total, int c, int hw, float m, const float *x,
                             const float *dy, const float *gamma, const float *mean,
                             const float *inv_std, const float *scratch, float *dx) {
  GRID_STRIDE(i, total) {
    int ch = (int)((i / (size_t)hw) % (size_t)c);
    float inv = inv_std[ch];
    float xhat = (x[i] - mean[ch]) * inv;
    dx[i] = gamma[ch] * inv / m * (m * dy[i] - scratch[ch] - xhat * scratch[c + ch]);
  }
}

/* ---- transformer operations ------------------------------------------------------------ */

/* GELU, tanh approximation (gpu/device/device.h). tanhf, not the fast intrinsic: the cpu device
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

/* Inverted dropout over x [outer, inner, cols] with the keyed mask of gpu/device/device.h; forward
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

cudaError_t kernels_fill(cudaStream_t s, size_t n, float value, float *x) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(n, value, x);
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
                                 const int32_t *labels, float grad_scale, float *dlogits,
                                 float *stats, int *bad_label) {
  if (n == 0 || c == 0) return cudaSuccess;
  unsigned blocks = (unsigned)((n + kRowsPerBlock - 1) / kRowsPerBlock);
  softmax_xent_kernel<<<blocks, kThreads, 0, s>>>(n, c, logits, labels, grad_scale, dlogits,
                                                   stats, bad_label);
  return cudaGetLastError();
}

cudaError_t kernels_im2col(cudaStream_t s, int n, int c, int h, int w, int kh, int kw,
                           int stride, int pad, const float *x, float *col) {
  int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
  size_t total = (size_t)c * kh * kw * n * oh * ow;
  if (total == 0) return cudaSuccess;
  im2col_kernel<<<grid_for(total), kThreads, 0, s>>>(total, n, c, h, w, kh, kw, stride, pad,
                                                     oh, ow, x, col);
  return cudaGetLastError();
}

cudaError_t kernels_col2im(cudaStream_t s, int n, int c, int h, int w, int kh, int kw,
                           int stride, int pad, const float *col, float *dx) {
  int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
  size_t total = (size_t)n * c * h * w;
  if (total == 0) return cudaSuccess;
  col2im_kernel<<<grid_for(total), kThreads, 0, s>>>(total, n, c, h, w, kh, kw, stride, pad,
                                                     oh, ow, col, dx);
  return cudaGetLastError();
}

cudaError_t kernels_swap01(cudaStream_t s, int a_dim, int b_dim, int s_dim, const float *x,
                           float *y) {
  size_t total = (size_t)a_dim * b_dim * s_dim;
  if (total == 0) return cudaSuccess;
  swap01_kernel<<<grid_for(total), kThreads, 0, s>>>(total, a_dim, b_dim, s_dim, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_maxpool_forward(cudaStream_t s, int n, int c, int h, int w, int k,
                                    int stride, int pad, const float *x, float *y,
                                    int32_t *argmax) {
  int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  size_t total = (size_t)n * c * oh * ow;
  if (total == 0) return cudaSuccess;
  maxpool_forward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, h, w, k, stride, pad, oh,
                                                              ow, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t kernels_maxpool_backward(cudaStream_t s, int n, int c, int h, int w, int k,
                                     int stride, int pad, const float *dy,
                                     const int32_t *argmax, float *dx) {
  int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  size_t total = (size_t)n * c * h * w;
  if (total == 0) return cudaSuccess;
  maxpool_backward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, h, w, k, stride, pad, oh,
                                                               ow, dy, argmax, dx);
  return cudaGetLastError();
}

cudaError_t kernels_avgpool_forward(cudaStream_t s, int n, int c, int h, int w, int k,
                                    int stride, int pad, const float *x, float *y) {
  int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  size_t total = (size_t)n * c * oh * ow;
  if (total == 0) return cudaSuccess;
  avgpool_forward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, h, w, k, stride, pad, oh,
                                                              ow, x, y);
  return cudaGetLastError();
}

cudaError_t kernels_avgpool_backward(cudaStream_t s, int n, int c, int h, int w, int k,
                                     int stride, int pad, const float *dy, float *dx) {
  int oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  size_t total = (size_t)n * c * h * w;
  if (total == 0) return cudaSuccess;
  avgpool_backward_kernel<<<grid_for(total), kThreads, 0, s>>>(total, h, w, k, stride, pad, oh,
                                                               ow, dy, dx);
  return cudaGetLastError();
}

cudaError_t kernels_batchnorm_forward(cudaStream_t s, int n, int c, int hw, const float *x,
                                      const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum,
                                      float eps, bool train, float *saved_mean,
                                      float *saved_inv_std, float *y) {
  size_t total = (size_t)n * c * hw;
  if (total == 0) return cudaSuccess;
  if (train) {
    bn_stats_kernel<<<(unsigned)c, kReduceThreads, 0, s>>>(n, c, hw, x, running_mean,
                                                           running_var, momentum, eps,
                                                           saved_mean, saved_inv_std);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    bn_apply_kernel<<<grid_for(total), kThreads, 0, s>>>(total, c, hw, x, gamma, beta,
                                                         saved_mean, saved_inv_std, NULL, eps,
                                                         y);
  } else {
    bn_apply_kernel<<<grid_for(total), kThreads, 0, s>>>(total, c, hw, x, gamma, beta,
                                                         running_mean, NULL, running_var, eps,
                                                         y);
  }
  return cudaGetLastError();
}

cudaError_t kernels_batchnorm_backward(cudaStream_t s, int n, int c, int hw, const float *x,
                                       const float *dy, const float *gamma,
                                       const float *saved_mean, const float *saved_inv_std,
                                       float *dx, float *dgamma, float *dbeta,
                                       float *scratch) {
  size_t total = (size_t)n * c * hw;
  if (total == 0) return cudaSuccess;
  bn_grad_sums_kernel<<<(unsigned)c, kReduceThreads, 0, s>>>(n, c, hw, x, dy, saved_mean,
                                                             saved_inv_std, scratch, dgamma,
                                                             dbeta);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  bn_dx_kernel<<<grid_for(total), kThreads, 0, s>>>(total, c, hw, (float)((size_t)n * hw), x,
                                                    dy, gamma, saved_mean, saved_inv_std,
                                                    scratch, dx);
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
