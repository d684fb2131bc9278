/* divergence_check.h: what the training tests (test_gpu_train, test_gpu_train_hybrid) expect
 * of a run stopped by a non-finite loss: FL_EINVAL, not the barrier stage's failure after its
 * retries, with a message that names the step (1 to max_step), the loss and the learning rate
 * and says what to change. */
#ifndef FLINT_TEST_DIVERGENCE_CHECK_H
#define FLINT_TEST_DIVERGENCE_CHECK_H

#include <stdio.h>
#include <string.h>

#include "test_util.h"

static inline void expect_divergence(fl_status s, const char *e, unsigned long long max_step) {
  assert_int_equal(s, FL_EINVAL);
  unsigned long long step = 0;
  const char *at = strstr(e, "diverged at step ");
  assert_non_null(at);
  assert_int_equal(sscanf(at, "diverged at step %llu", &step), 1);
  assert_true(step >= 1 && step <= max_step);
  assert_non_null(strstr(e, "learning rate"));
  assert_true(strstr(e, "loss nan") || strstr(e, "loss inf") || strstr(e, "loss -inf"));
  assert_non_null(strstr(e, "--lr"));
  assert_null(strstr(e, "barrier stage")); /* not the stage's failure after its retries */
}

#endif
