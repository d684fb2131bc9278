/* bench_util.h: what every benchmark in bench/ shares: a monotonic clock, the report of a
 * failed flint call, and strict parsing of count options. Header-only; each benchmark is one
 * program. BENCH_NAME must be defined before including it. */
#ifndef FLINT_BENCH_UTIL_H
#define FLINT_BENCH_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flint/flint.h"

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void fail_flint(const char *what) {
  fprintf(stderr, BENCH_NAME ": %s failed: %s\n", what, fl_last_error());
}

/* A count in 1..max written as plain digits; false for anything else. */
static inline bool parse_count(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (!*s || *s == '-' || *s == '+') return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end != '\0' || v == 0 || v > max) return false;
  *out = v;
  return true;
}

#endif
