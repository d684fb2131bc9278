/* test_gpu_train_trick.c: `flint train --model cnn --trick` (gpu/parallel/train_trick.c) end
 * to end, as a barrier stage:
 *   - equivalence: without shuffling, rank r of R reads images r, r + R, ..., so R ranks take
 *     the same global batches as one rank; the trick's split computes the one-rank network,
 *     so 2 and 4 ranks train to the same losses and accuracies, epoch by epoch, as one rank;
 *   - bytes: the ranks report what their collectives sent, none on one rank;
 *   - options: what --trick refuses is named.
 * Links the shared libraries: the barrier function ships to executors by (library, symbol).
 * Needs Fashion-MNIST in /usr/share/datasets/fashion-mnist (the tests skip without it). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/parallel/train.h"

#define TEST_TIME_BOUND_S 240 /* per test; the ASan build is a few times slower */
#include "test_util.h"
#include "fashion_data.h"

/* Relative tolerance between rank counts: the runs differ only in the order of float sums
 * (the FC layers' GEMMs by blocks, the allreduces), over 16 steps. */
#define EQ_TOL 1e-4

typedef struct rows {
  gpu_train_epoch seen[4];
  uint32_t count;
} rows;

static void keep_row(const gpu_train_epoch *e, void *user) {
  rows *r = user;
  if (r->count < 4) r->seen[r->count++] = *e;
}

static gpu_train_options trick_options(uint32_t ranks, rows *r) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.master = "local[4]";
  o.model = NN_CNN;
  o.trick = true;
  o.ranks = ranks;
  o.batch = 32;
  o.epochs = 2;
  o.lr = 0.2;
  o.seed = 3;
  o.shuffle = false;
  o.max_train_images = 256; /* 8 steps an epoch */
  o.max_test_images = 128;
  o.csv_path = NULL;
  o.svg_path = NULL;
  o.progress = NULL;
  o.on_epoch = keep_row;
  o.user = r;
  return o;
}

static bool close_rel(double a, double b) { return fabs(a - b) <= EQ_TOL * fmax(fabs(b), 1e-3); }

static void test_ranks_train_as_one_rank(void **state) {
  (void)state;
  NEED_DATA();
  rows one = {0};
  gpu_train_options o = trick_options(1, &one);
  gpu_train_result res1;
  assert_ok(gpu_train_run(&o, &res1));
  assert_int_equal(one.count, 2);
  assert_int_equal(res1.sent_bytes, 0);
  assert_true(one.seen[1].train_loss < one.seen[0].train_loss); /* it learns */
  for (uint32_t ranks = 2; ranks <= 4; ranks += 2) {
    rows many = {0};
    o = trick_options(ranks, &many);
    gpu_train_result res;
    assert_ok(gpu_train_run(&o, &res));
    assert_int_equal(many.count, 2);
    assert_int_equal(res.steps, res1.steps);
    for (uint32_t e = 0; e < 2; e++) {
      const gpu_train_epoch *a = &many.seen[e], *b = &one.seen[e];
      if (!close_rel(a->train_loss, b->train_loss) || !close_rel(a->test_loss, b->test_loss))
        fprintf(stderr, "%u ranks, epoch %u: train loss %.8g (one rank %.8g), test loss %.8g (%.8g)\n", ranks, e + 1,
                a->train_loss, b->train_loss, a->test_loss, b->test_loss);
      assert_true(close_rel(a->train_loss, b->train_loss));
      assert_true(close_rel(a->train_acc, b->train_acc));
      assert_true(close_rel(a->test_loss, b->test_loss));
      assert_true(close_rel(a->test_acc, b->test_acc));
    }
    /* Sent: activations and the conv gradients; the latter are what it reduced. */
    assert_true(res.sent_bytes > res.reduced_bytes);
    assert_true(res.reduced_bytes > 0);
  }
}

static void test_options_it_refuses(void **state) {
  (void)state;
  rows r = {0};
  gpu_train_options o = trick_options(2, &r);
  assert_ok(gpu_train_options_validate(&o));
  o.model = NN_MLP;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--trick is for --model cnn");
  o = trick_options(3, &r);
  o.batch = 30;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--ranks 3 must divide the FC layers' 512 units");
  o = trick_options(2, &r);
  o.checkpoint_path = "/tmp/never-written";
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--checkpoint and --resume are not available");
  o = trick_options(2, &r);
  o.sync = GPU_TRAIN_SYNC_LOCAL;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--trick needs --sync bsp");
  o = trick_options(2, &r);
  o.label_smoothing = 0.1;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--label-smoothing");
  o = trick_options(2, &r);
  o.optim.kind = OPTIM_LAMB;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--optimizer lamb needs each weight's whole norm");
  o = trick_options(2, &r);
  o.compress = "fp16";
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--compress is not available with --trick");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_ranks_train_as_one_rank, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_options_it_refuses, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
