/*
 * pi: estimates pi by Monte Carlo with map and reduce, as Spark's SparkPi.
 *
 *   flint submit --master local[4] build/bin/pi.so [SAMPLES] [PARTITIONS]
 *
 * Each record of a range is one sample; its point in the unit square comes from a hash of
 * the sample's index, so the estimate is the same on any number of threads.
 */
#include <stdio.h>
#include <stdlib.h>

#include "flint/flint.h"

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The functions handed to flint are exported (non-static, default visibility): in cluster
 * mode (flint://, local-cluster) executors find them by name in this library. */
#define PI_EXPORT __attribute__((visibility("default")))

/* Sample index -> 1 if its point falls inside the quarter circle, else 0. */
PI_EXPORT fl_status pi_inside(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  uint64_t h = mix((uint64_t)fl_i64(rec));
  double x = (double)(h >> 32) / 4294967296.0, y = (double)(h & 0xffffffffu) / 4294967296.0;
  return fl_buf_put_i64(out, x * x + y * y <= 1.0);
}

PI_EXPORT fl_status pi_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) + fl_i64(b));
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  long long samples = argc > 1 ? atoll(argv[1]) : 10000000;
  long long partitions = argc > 2 ? atoll(argv[2]) : 0;
  if (samples <= 0 || partitions < 0) {
    fprintf(stderr, "usage: pi [SAMPLES > 0] [PARTITIONS >= 0]\n");
    return 2;
  }
  fl_dataset *range = NULL, *hits = NULL;
  fl_buf sum = FL_BUF_INIT;
  int rc = 1;
  if (fl_range(ctx, 0, samples, 1, (uint32_t)partitions, &range) != FL_OK ||
      fl_map(range, pi_inside, NULL, 0, &hits) != FL_OK || fl_reduce(hits, pi_add, NULL, 0, &sum) != FL_OK) {
    fprintf(stderr, "pi: %s\n", fl_last_error());
    goto done;
  }
  printf("pi is roughly %.6f (%lld samples, %u partitions)\n",
         4.0 * (double)fl_i64(fl_buf_bytes(&sum)) / (double)samples, samples,
         fl_dataset_partitions(range));
  rc = 0;
done:
  fl_buf_free(&sum);
  fl_dataset_free(hits);
  fl_dataset_free(range);
  return rc;
}
