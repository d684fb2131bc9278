/*
 * gpu/parallel/keyed.c: the keyed draw of gpu/parallel/keyed.h. The formulas are fixed: the
 * equivalence tests compare split runs with one rank bit for bit, and checkpoints of earlier
 * runs were drawn with them.
 */
#include <math.h>

#include "gpu/device/device.h"
#include "gpu/parallel/keyed.h"

uint64_t keyed_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
  return h;
}

double keyed_uniform(uint64_t key, uint64_t counter) {
  uint64_t z = dropout_mix(key ^ dropout_mix(counter));
  return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

double keyed_normal(uint64_t key, uint64_t g) {
  double u1 = keyed_uniform(key, 2 * g), u2 = keyed_uniform(key, 2 * g + 1);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double keyed_symmetric(uint64_t key, uint64_t g) {
  uint64_t z = dropout_mix(key ^ dropout_mix(g));
  return 2.0 * ((double)(z >> 11) / 9007199254740992.0) - 1.0;
}
