/*
 * gpu/device/cuda/kernels_common.cuh: what the kernel files of the cuda device share (their
 * conventions are at the top of gpu/device/cuda/kernels.cu): block and grid sizes, the
 * grid-stride loop, and block-wide sums and maxima. Included by .cu files only; every
 * definition is internal to the file that includes it.
 */
#ifndef FLINT_GPU_DEVICE_CUDA_KERNELS_COMMON_CUH
#define FLINT_GPU_DEVICE_CUDA_KERNELS_COMMON_CUH

#include <math.h>

#include "gpu/device/cuda/kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 8192;
constexpr int kReduceThreads = 512; /* one block per channel: more threads per block */
constexpr int kRowsPerBlock = kThreads / 32; /* row kernels with one warp per row */

inline unsigned grid_for(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  return blocks > kMaxBlocks ? kMaxBlocks : (unsigned)blocks;
}

#define GRID_STRIDE(i, n)                                                                    \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
       i += (size_t)blockDim.x * gridDim.x)

/* The sum of v over the block, returned to every thread. blockDim.x must be a multiple of
 * 32 (at most 1024); `shared` holds 32 values. */
template <typename T>
__device__ inline T block_sum(T v, T *shared) {
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
__device__ inline float block_max(float v, float *shared) {
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

} // namespace

#endif /* FLINT_GPU_DEVICE_CUDA_KERNELS_COMMON_CUH */
