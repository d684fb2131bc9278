/*
 * gpu/device/cuda/kernels_image.cu: the cuda device's kernels over images (NCHW): im2col and
 * col2im, the CNHW <-> NCHW swap, pooling and batch norm. Conventions:
 * gpu/device/cuda/kernels.cu.
 */
#include "gpu/device/cuda/kernels_common.cuh"

namespace {

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

} // namespace

/* ---- launchers ------------------------------------------------------------------------- */

extern "C" {

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

} // extern "C"
