/*
 * random.c: unpredictable ids (common_random_u64), hashing, and seeded random numbers
 * (xoshiro256** seeded through splitmix64). No state beyond the caller's common_rng, so it
 * is linked into flint's add-on libraries too (libflint_gpu).
 */
#include <math.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/common.h"

uint64_t common_random_u64(void) {
  uint64_t x;
  if (getrandom(&x, sizeof x, 0) == (ssize_t)sizeof x) return x;
  return common_hash64(common_now_ns() ^ ((uint64_t)getpid() << 32));
}

uint64_t common_hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t common_hash_bytes(const void *data, size_t len) {
  const uint8_t *p = data;
  uint64_t h = 0x243f6a8885a308d3ull ^ len;
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = common_hash64(h ^ w);
    p += 8;
    len -= 8;
  }
  uint64_t tail = 0;
  if (len) memcpy(&tail, p, len);
  return common_hash64(h ^ tail ^ ((uint64_t)len << 56));
}

void common_rng_seed(common_rng *rng, uint64_t seed) {
  for (int i = 0; i < 4; i++) {
    seed = common_hash64(seed);
    rng->s[i] = seed;
  }
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t common_rng_next(common_rng *rng) {
  uint64_t *s = rng->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double common_rng_uniform(common_rng *rng) {
  return (double)(common_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

uint32_t common_rng_poisson(common_rng *rng, double mean) {
  if (mean <= 0) return 0;
  if (mean > 30) {
    /* Box-Muller normal approximation, rounded and clamped at 0. */
    double u1 = common_rng_uniform(rng), u2 = common_rng_uniform(rng);
    double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2 * M_PI * u2);
    double v = floor(mean + sqrt(mean) * z + 0.5);
    return v < 0 ? 0 : (uint32_t)v;
  }
  double limit = exp(-mean), p = common_rng_uniform(rng);
  uint32_t k = 0;
  double cum = limit;
  while (p > cum && k < 1000) {
    k++;
    limit *= mean / k;
    cum += limit;
  }
  return k;
}
