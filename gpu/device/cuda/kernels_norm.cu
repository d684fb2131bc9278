/*
 * gpu/device/cuda/kernels_norm.cu: the cuda device's layer norm and embedding kernels
 * (gpu/device/backend.h). Conventions: gpu/device/cuda/kernels.cu.
 */
#include "gpu/device/cuda/kernels_common.cuh"

namespace {

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* A warp per row: the mean, then the variance around it (two passes over the row, as the
 * cpu device, so that both agree closely), then y. */
__global__ void layernorm_forward_kernel(int rows, int cols, float eps, const float *x, const float *gamma,
                                         const float *beta, float *y, float *mean, float *rstd) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float *xr = x + (size_t)row * cols;
  float *yr = y + (size_t)row * cols;
  float sum = 0.0f;
  for (int c = lane; c < cols; c += 32) sum += xr[c];
  float m = warp_sum(sum) / (float)cols;
  float sq = 0.0f;
  for (int c = lane; c < cols; c += 32) sq += (xr[c] - m) * (xr[c] - m);
  float rs = rsqrtf(warp_sum(sq) / (float)cols + eps);
  for (int c = lane; c < cols; c += 32) yr[c] = (xr[c] - m) * rs * gamma[c] + beta[c];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__global__ void layernorm_backward_kernel(int rows, int cols, const float *x, const float *dy, const float *gamma,
                                          const float *mean, const float *rstd, float *dx, float *dgamma,
                                          float *dbeta) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float *xr = x + (size_t)row * cols, *dyr = dy + (size_t)row * cols;
  float *dxr = dx + (size_t)row * cols;
  float m = mean[row], rs = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int c = lane; c < cols; c += 32) {
    float xhat = (xr[c] - m) * rs, g = dyr[c] * gamma[c];
    sg += g;
    sgx += g * xhat;
    atomicAdd(&dgamma[c], dyr[c] * xhat);
    atomicAdd(&dbeta[c], dyr[c]);
  }
  float mg = warp_sum(sg) / (float)cols, mgx = warp_sum(sgx) / (float)cols;
  for (int c = lane; c < cols; c += 32) {
    float xhat = (xr[c] - m) * rs;
    dxr[c] = rs * (dyr[c] * gamma[c] - mg - xhat * mgx);
  }
}

__device__ bool id_ok(float id, int vocab) { return id >= 0.0f && id < (float)vocab && id == floorf(id); }

__global__ void embedding_forward_kernel(size_t count, int dim, int vocab, const float *ids, const float *table,
                                         float *y, int *bad_id) {
  GRID_STRIDE(i, count * (size_t)dim) {
    size_t row = i / (size_t)dim;
    float id = ids[row];
    if (id_ok(id, vocab)) {
      y[i] = table[(size_t)id * dim + i % (size_t)dim];
    } else {
      y[i] = 0.0f;
      *(volatile int *)bad_id = 1;
    }
  }
}

__global__ void embedding_backward_kernel(size_t count, int dim, int vocab, const float *ids, const float *dy,
                                          float *dtable, int *bad_id) {
  GRID_STRIDE(i, count * (size_t)dim) {
    float id = ids[i / (size_t)dim];
    if (id_ok(id, vocab)) atomicAdd(&dtable[(size_t)id * dim + i % (size_t)dim], dy[i]);
    else *(volatile int *)bad_id = 1;
  }
}

} // namespace

extern "C" {

cudaError_t kernels_layernorm_forward(cudaStream_t s, int rows, int cols, float eps, const float *x,
                                      const float *gamma, const float *beta, float *y, float *mean, float *rstd) {
  if (rows == 0) return cudaSuccess;
  unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_forward_kernel<<<blocks, kThreads, 0, s>>>(rows, cols, eps, x, gamma, beta, y, mean, rstd);
  return cudaGetLastError();
}

cudaError_t kernels_layernorm_backward(cudaStream_t s, int rows, int cols, const float *x, const float *dy,
                                       const float *gamma, const float *mean, const float *rstd, float *dx,
                                       float *dgamma, float *dbeta) {
  if (rows == 0) return cudaSuccess;
  unsigned blocks = (unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  layernorm_backward_kernel<<<blocks, kThreads, 0, s>>>(rows, cols, x, dy, gamma, mean, rstd, dx, dgamma, dbeta);
  return cudaGetLastError();
}

cudaError_t kernels_embedding_forward(cudaStream_t s, size_t count, int dim, int vocab, const float *ids,
                                      const float *table, float *y, int *bad_id) {
  if (count == 0) return cudaSuccess;
  embedding_forward_kernel<<<grid_for(count * (size_t)dim), kThreads, 0, s>>>(count, dim, vocab, ids, table, y,
                                                                             bad_id);
  return cudaGetLastError();
}

cudaError_t kernels_embedding_backward(cudaStream_t s, size_t count, int dim, int vocab, const float *ids,
                                       const float *dy, float *dtable, int *bad_id) {
  if (count == 0) return cudaSuccess;
  embedding_backward_kernel<<<grid_for(count * (size_t)dim), kThreads, 0, s>>>(count, dim, vocab, ids, dy, dtable,
                                                                              bad_id);
  return cudaGetLastError();
}

} // extern "C"
