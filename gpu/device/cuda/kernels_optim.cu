/*
 * gpu/device/cuda/kernels_optim.cu: the optimizer steps beyond SGD (whose kernel is in
 * kernels.cu): Adam/AdamW element-wise, and the layer-wise LARS and LAMB over segments of the
 * flat buffers (the rules are device_ops' in gpu/device/backend.h).
 *
 * The layer-wise steps take two kernels on a grid of (blocks, segments): the first sums the
 * squares a segment's trust ratio needs into norms (doubles, block sums then one atomicAdd a
 * block, as sum_squares), the second applies the step with the ratio it computes from them.
 * A step is thus queued work with no copy to the host, however many parameters there are.
 * LAMB's first kernel also updates the moments, and its second computes the update again from
 * them rather than keeping it in an n-float scratch buffer.
 */
#include "gpu/device/cuda/kernels_common.cuh"
#include "gpu/device/backend.h" /* optim_segment */

namespace {

constexpr unsigned kMaxSegmentsY = 65535; /* gridDim.y's limit: more segments loop */

__global__ void adam_step_kernel(size_t n, float lr, float beta1, float beta2, float eps,
                                 float l2, float shrink, float bias1, float bias2,
                                 const float *grad, float *m, float *v, float *w) {
  GRID_STRIDE(i, n) {
    float g = grad[i] + l2 * w[i];
    float mi = beta1 * m[i] + (1 - beta1) * g, vi = beta2 * v[i] + (1 - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * shrink - lr * (mi / bias1) / (sqrtf(vi / bias2) + eps);
  }
}

#define SEGMENT_STRIDE(i, seg)                                                               \
  for (size_t i = (seg).offset + (size_t)blockIdx.x * blockDim.x + threadIdx.x;              \
       i < (seg).offset + (seg).count; i += (size_t)blockDim.x * gridDim.x)

/* norms[2s] += ||w_s||^2, norms[2s + 1] += ||g_s||^2 over the segments that adapt. */
__global__ void lars_norms_kernel(int nseg, const optim_segment *segs, const float *grad,
                                  const float *w, double *norms) {
  __shared__ double shared[32];
  for (int s = blockIdx.y; s < nseg; s += gridDim.y) {
    optim_segment seg = segs[s];
    if (!seg.adapt) continue; /* the same for the whole block: no thread skips a barrier */
    double ww = 0, gg = 0;
    SEGMENT_STRIDE(i, seg) {
      double a = w[i], b = grad[i];
      ww += a * a;
      gg += b * b;
    }
    ww = block_sum(ww, shared);
    gg = block_sum(gg, shared);
    if (threadIdx.x == 0) {
      atomicAdd(&norms[2 * s], ww);
      atomicAdd(&norms[2 * s + 1], gg);
    }
  }
}

__global__ void lars_apply_kernel(int nseg, const optim_segment *segs, float lr, float momentum,
                                  float trust_coef, const float *grad, float *velocity,
                                  float *w, const double *norms) {
  for (int s = blockIdx.y; s < nseg; s += gridDim.y) {
    optim_segment seg = segs[s];
    float ratio = 1.0f;
    if (seg.adapt) {
      double wn = sqrt(norms[2 * s]), gn = sqrt(norms[2 * s + 1]);
      if (wn > 0 && gn > 0) ratio = (float)(trust_coef * wn / (gn + seg.weight_decay * wn));
    }
    float scaled = lr * ratio, wd = seg.weight_decay;
    SEGMENT_STRIDE(i, seg) {
      float u = momentum * velocity[i] + scaled * (grad[i] + wd * w[i]);
      velocity[i] = u;
      w[i] -= u;
    }
  }
}

/* The moments, and norms[2s] += ||w_s||^2, norms[2s + 1] += ||r_s||^2 (segments that adapt). */
__global__ void lamb_moments_kernel(int nseg, const optim_segment *segs, float beta1,
                                    float beta2, float eps, float bias1, float bias2,
                                    const float *grad, float *m, float *v, const float *w,
                                    double *norms) {
  __shared__ double shared[32];
  for (int s = blockIdx.y; s < nseg; s += gridDim.y) {
    optim_segment seg = segs[s];
    double ww = 0, rr = 0;
    SEGMENT_STRIDE(i, seg) {
      float g = grad[i];
      float mi = beta1 * m[i] + (1 - beta1) * g, vi = beta2 * v[i] + (1 - beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      float r = (mi / bias1) / (sqrtf(vi / bias2) + eps) + seg.weight_decay * w[i];
      ww += (double)w[i] * w[i];
      rr += (double)r * r;
    }
    if (!seg.adapt) continue;
    ww = block_sum(ww, shared);
    rr = block_sum(rr, shared);
    if (threadIdx.x == 0) {
      atomicAdd(&norms[2 * s], ww);
      atomicAdd(&norms[2 * s + 1], rr);
    }
  }
}

__global__ void lamb_apply_kernel(int nseg, const optim_segment *segs, float lr, float eps,
                                  float bias1, float bias2, const float *m, const float *v,
                                  float *w, const double *norms) {
  for (int s = blockIdx.y; s < nseg; s += gridDim.y) {
    optim_segment seg = segs[s];
    float ratio = 1.0f;
    if (seg.adapt) {
      double wn = sqrt(norms[2 * s]), rn = sqrt(norms[2 * s + 1]);
      if (wn > 0 && rn > 0) ratio = (float)(wn / rn);
    }
    float step = lr * ratio;
    SEGMENT_STRIDE(i, seg) {
      float r = (m[i] / bias1) / (sqrtf(v[i] / bias2) + eps) + seg.weight_decay * w[i];
      w[i] -= step * r;
    }
  }
}

/* Blocks per segment: enough to cover the average segment, so that a model of many small
 * parameters does not launch thousands of idle blocks; big segments loop. */
dim3 segment_grid(int nseg, size_t n) {
  size_t per = n / (size_t)nseg + 1;
  unsigned x = grid_for(per);
  if (x > 64) x = 64;
  unsigned y = (unsigned)nseg < kMaxSegmentsY ? (unsigned)nseg : kMaxSegmentsY;
  return dim3(x ? x : 1, y);
}

} // namespace

extern "C" {

cudaError_t kernels_adam_step(cudaStream_t s, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, bool decoupled, float bias1,
                              float bias2, const float *grad, float *m, float *v, float *w) {
  if (n == 0) return cudaSuccess;
  float l2 = decoupled ? 0.0f : weight_decay, shrink = decoupled ? 1.0f - lr * weight_decay : 1.0f;
  adam_step_kernel<<<grid_for(n), kThreads, 0, s>>>(n, lr, beta1, beta2, eps, l2, shrink, bias1,
                                                    bias2, grad, m, v, w);
  return cudaGetLastError();
}

cudaError_t kernels_lars_step(cudaStream_t s, int nseg, const optim_segment *segs, size_t n,
                              float lr, float momentum, float trust_coef, const float *grad,
                              float *velocity, float *w, double *norms) {
  if (nseg <= 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaMemsetAsync(norms, 0, 2 * (size_t)nseg * sizeof *norms, s);
  if (err != cudaSuccess) return err;
  dim3 grid = segment_grid(nseg, n);
  lars_norms_kernel<<<grid, kThreads, 0, s>>>(nseg, segs, grad, w, norms);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  lars_apply_kernel<<<grid, kThreads, 0, s>>>(nseg, segs, lr, momentum, trust_coef, grad,
                                              velocity, w, norms);
  return cudaGetLastError();
}

cudaError_t kernels_lamb_step(cudaStream_t s, int nseg, const optim_segment *segs, size_t n,
                              float lr, float beta1, float beta2, float eps, float bias1,
                              float bias2, const float *grad, float *m, float *v, float *w,
                              double *norms) {
  if (nseg <= 0 || n == 0) return cudaSuccess;
  cudaError_t err = cudaMemsetAsync(norms, 0, 2 * (size_t)nseg * sizeof *norms, s);
  if (err != cudaSuccess) return err;
  dim3 grid = segment_grid(nseg, n);
  lamb_moments_kernel<<<grid, kThreads, 0, s>>>(nseg, segs, beta1, beta2, eps, bias1, bias2,
                                                grad, m, v, w, norms);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  lamb_apply_kernel<<<grid, kThreads, 0, s>>>(nseg, segs, lr, eps, bias1, bias2, m, v, w, norms);
  return cudaGetLastError();
}

} // extern "C"
