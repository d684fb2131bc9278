/*
 * train_examples.h: the training tests' small data set: n examples of three separable classes
 * (6 features) made on the client as records (no function to ship), seeded.
 */
#ifndef FLINT_TESTS_TRAIN_EXAMPLES_H
#define FLINT_TESTS_TRAIN_EXAMPLES_H

#include <stdlib.h>

#include "flint/train.h"

enum { FEATURES = 6, CLASSES = 3 };

static inline fl_dataset *examples(fl_context *ctx, int n, uint64_t seed) {
  fl_buf *bufs = calloc((size_t)n, sizeof *bufs);
  fl_bytes *recs = calloc((size_t)n, sizeof *recs);
  assert_non_null(bufs);
  assert_non_null(recs);
  uint64_t st = seed;
  for (int i = 0; i < n; i++) {
    float x[FEATURES];
    int k = i % CLASSES;
    for (int j = 0; j < FEATURES; j++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      x[j] = (float)((double)(st >> 11) / 9007199254740992.0) - 0.5f + (j % CLASSES == k ? 2.0f : 0.0f);
    }
    if (fl_example_put(&bufs[i], k, x, FEATURES) != FL_OK) fail_msg("fl_example_put: %s", fl_last_error());
    recs[i] = fl_buf_bytes(&bufs[i]);
  }
  fl_dataset *ds;
  if (fl_parallelize(ctx, recs, (size_t)n, 3, &ds) != FL_OK) fail_msg("fl_parallelize: %s", fl_last_error());
  for (int i = 0; i < n; i++) fl_buf_free(&bufs[i]);
  free(bufs);
  free(recs);
  return ds;
}

#endif /* FLINT_TESTS_TRAIN_EXAMPLES_H */
