/* splitmix.h: the splitmix64 finalizer (Steele, Lea and Flood), the benchmarks' cheap,
 * deterministic mixing of a counter into a pseudo-random 64-bit value. */
#ifndef FLINT_BENCH_SPLITMIX_H
#define FLINT_BENCH_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

#endif
