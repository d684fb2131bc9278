/* gpu_test_data.h: what the gpu layer tests share: the cpu device opened per group and seeded
 * uniform test data. */
#ifndef FLINT_TEST_GPU_TEST_DATA_H
#define FLINT_TEST_GPU_TEST_DATA_H

#include <stdint.h>
#include <stdlib.h>

#include "test_util.h"

#include "flint/gpu.h"

static fl_device *dev;

static inline int setup_device(void **state) {
  (void)state;
  return fl_device_open(FL_DEVICE_CPU, 0, &dev) == FL_OK ? 0 : -1;
}

static inline int teardown_device(void **state) {
  (void)state;
  fl_device_close(dev);
  dev = NULL;
  return 0;
}

/* The generator's state: a test may reseed it. */
static uint64_t rng_state = 0x1234567u;

/* Uniform in [-1, 1): a small xorshift is enough for test data. */
static inline float urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static inline float *rand_buf(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) p[i] = urand();
  return p;
}

#endif /* FLINT_TEST_GPU_TEST_DATA_H */
