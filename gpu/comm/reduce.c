/*
 * gpu/comm/reduce.c: the reduction kernels of the host collectives: sums of fp32 buffers
 * (plain loops that the compiler vectorizes, -fopenmp-simd), of 16-bit ones (summed in fp32
 * and rounded back), from unaligned bytes (a shared-memory ring), and the conversions between
 * fp32 and the 16-bit formats the compression hooks put on the wire (fp16, bf16).
 *
 * flint builds for the x86-64 baseline, where a cast to _Float16 is a software routine
 * (about 6 ns an element); so fp16 goes through the F16C instructions when the CPU has them
 * (every x86 CPU since 2012), picked at run time, eight elements at a time. Both round to
 * nearest even, so the results are the same bits either way. bf16 is a shift and a rounding
 * add.
 */
#include <immintrin.h>
#include <string.h>

#include "gpu/comm/comm.h"
#include "gpu/comm/host_transport.h"

/* ---- sums ------------------------------------------------------------------------------------ */
void comm_reduce_add(float *restrict dst, const float *restrict src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void comm_reduce_add_dtype(comm_dtype type, void *dst, const void *src, size_t n) {
  switch (type) {
  case COMM_F16: comm_reduce_add_half(COMM_HALF_FP16, dst, src, n); break;
  case COMM_BF16: comm_reduce_add_half(COMM_HALF_BF16, dst, src, n); break;
  default: comm_reduce_add(dst, src, n); break;
  }
}

/* src may start at any byte (a shared-memory ring after messages of odd lengths): loads go
 * through memcpy, which the compiler turns into unaligned vector loads. */
void comm_reduce_add_unaligned(comm_dtype type, void *dst, const uint8_t *src, size_t n) {
  if ((uintptr_t)src % comm_dtype_size(type) == 0) {
    comm_reduce_add_dtype(type, dst, src, n);
    return;
  }
  if (type == COMM_F32) {
    float *restrict d = dst;
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
      float v;
      memcpy(&v, src + 4 * i, sizeof v);
      d[i] += v;
    }
    return;
  }
  uint16_t *d = dst;
  for (size_t i = 0; i < n; i++) {
    uint16_t v;
    memcpy(&v, src + 2 * i, sizeof v);
    comm_reduce_add_dtype(type, &d[i], &v, 1);
  }
}

size_t comm_dtype_size(comm_dtype type) { return type == COMM_F32 ? 4 : 2; }

void comm_reduce_scale(float *dst, float a, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] *= a;
}

/* ---- 16 bits ----------------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_F16C_PATH 1
__attribute__((target("avx,f16c"))) static void f16_from_f32_f16c(uint16_t *dst, const float *src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) dst[i] = comm_f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(float *dst, const uint16_t *src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = comm_f16_to_f32(src[i]);
}

static bool have_f16c(void) { return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx"); }
#endif

void comm_half_from_f32(comm_half_kind kind, uint16_t *dst, const float *src, size_t n) {
  if (kind == COMM_HALF_BF16) {
    for (size_t i = 0; i < n; i++) dst[i] = comm_f32_to_bf16(src[i]);
    return;
  }
#ifdef HAVE_F16C_PATH
  if (have_f16c()) {
    f16_from_f32_f16c(dst, src, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) dst[i] = comm_f32_to_f16(src[i]);
}

void comm_half_to_f32(comm_half_kind kind, float *dst, const uint16_t *src, size_t n) {
  if (kind == COMM_HALF_BF16) {
    for (size_t i = 0; i < n; i++) dst[i] = comm_bf16_to_f32(src[i]);
    return;
  }
#ifdef HAVE_F16C_PATH
  if (have_f16c()) {
    f16_to_f32_f16c(dst, src, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) dst[i] = comm_f16_to_f32(src[i]);
}

/* dst += src in fp32, rounded back, a block at a time through two stack buffers. */
void comm_reduce_add_half(comm_half_kind kind, uint16_t *dst, const uint16_t *src, size_t n) {
  float a[512], b[512];
  for (size_t at = 0; at < n; at += 512) {
    size_t k = n - at < 512 ? n - at : 512;
    comm_half_to_f32(kind, a, dst + at, k);
    comm_half_to_f32(kind, b, src + at, k);
    comm_reduce_add(a, b, k);
    comm_half_from_f32(kind, dst + at, a, k);
  }
}
