/*
 * test_gpu_train_cli: `flint train` run as a child process the way a user runs it: every
 * usage error exits 2 with one line on stderr naming the cause and the hint, --help exits 0,
 * and the top-level usage lists the command. (Training runs are tested where the trainer's
 * parts are: see test_gpu_optim and the trainer's own tests.)
 *
 * The binary is $FLINT_BIN/flint (ctest sets FLINT_BIN to <build>/bin).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>

#include "test_util.h"
#include "run_child.h"

#define CHILD_ALARM_S 30
#define PARENT_LIMIT_S 60

static char flint_path[PATH_MAX];

static run_result *run_flint(const char *const *args) {
  return run_child(flint_path, NULL, args, CHILD_ALARM_S, PARENT_LIMIT_S);
}
#define RUN_FLINT(...) run_flint((const char *const[]){__VA_ARGS__, NULL})

static void expect_usage_error(run_result *r, const char *needle) {
  if (r->status != 2 || !strstr(r->err, needle) || !strstr(r->err, "Run 'flint train --help' for usage.")) {
    fprintf(stderr, "expected exit 2 and '%s' on stderr\n", needle);
    run_dump(r);
  }
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "flint train: "));
  assert_non_null(strstr(r->err, needle));
  assert_non_null(strstr(r->err, "Run 'flint train --help' for usage."));
  assert_int_equal(r->out_len, 0); /* nothing started */
  free(r);
}

#define BASE "--model", "mlp", "--data", "fashion-mnist"

static void test_bad_options_exit_2(void **state) {
  (void)state;
  expect_usage_error(RUN_FLINT("train", "--model", "vgg", "--data", "fashion-mnist"), "unknown model 'vgg'");
  expect_usage_error(RUN_FLINT("train", BASE, "--batch", "0"), "--batch '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--batch", "-5"), "--batch '-5'");
  expect_usage_error(RUN_FLINT("train", BASE, "--batch", "12x"), "--batch '12x'");
  expect_usage_error(RUN_FLINT("train", BASE, "--ranks", "0"), "--ranks '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--device", "tpu"), "unknown device 'tpu'");
  expect_usage_error(RUN_FLINT("train", "--model", "mlp"), "--data is required");
  expect_usage_error(RUN_FLINT("train", "--data", "fashion-mnist"), "--model is required");
  expect_usage_error(RUN_FLINT("train", "--model", "mlp", "--data", "cifar"), "unknown data set 'cifar'");
  expect_usage_error(RUN_FLINT("train", BASE, "--lr", "0"), "--lr '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--lr", "abc"), "--lr 'abc'");
  expect_usage_error(RUN_FLINT("train", BASE, "--epochs", "0"), "--epochs '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--warmup", "-1"), "--warmup '-1'");
  expect_usage_error(RUN_FLINT("train", BASE, "--epochs", "5", "--warmup", "5"), "--warmup 5 must be >= 0 and less than --epochs 5");
  expect_usage_error(RUN_FLINT("train", BASE, "--ranks", "3", "--batch", "256"), "--batch 256 is not a multiple of --ranks 3");
  expect_usage_error(RUN_FLINT("train", BASE, "--decay", "linear"), "unknown decay 'linear'");
  expect_usage_error(RUN_FLINT("train", BASE, "--milestones", "5"), "--milestones is for --decay step");
  expect_usage_error(RUN_FLINT("train", BASE, "--decay", "step", "--milestones", "5,x"), "'x' is not a number");
  expect_usage_error(RUN_FLINT("train", BASE, "--momentum", "1"), "--momentum '1'");
  expect_usage_error(RUN_FLINT("train", BASE, "--momentum", "0", "--nesterov"), "--nesterov needs --momentum > 0");
  expect_usage_error(RUN_FLINT("train", BASE, "--weight-decay", "-0.1"), "--weight-decay '-0.1'");
  expect_usage_error(RUN_FLINT("train", BASE, "--frobnicate"), "unknown option '--frobnicate'");
  expect_usage_error(RUN_FLINT("train", BASE, "--epochs"), "--epochs needs a value");
  expect_usage_error(RUN_FLINT("train", BASE, "--synthetic-images", "100"), "--synthetic-images is for");
  expect_usage_error(RUN_FLINT("train", BASE, "--train-images", "0"), "--train-images '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--train-images", "100"), "--train-images 100 is less than one --batch 256");
  expect_usage_error(RUN_FLINT("train", BASE, "--ranks", "4", "--batch", "8", "--test-images", "3"),
                     "--test-images 3 is less than --ranks 4");
  expect_usage_error(RUN_FLINT("train", "--model", "cnn", "--data", "synthetic-imagenet", "--train-images", "512"),
                     "--train-images and --test-images are for --data fashion-mnist");
  expect_usage_error(RUN_FLINT("train", BASE, "--no-shuffle", "x"), "unknown option 'x'");
  expect_usage_error(RUN_FLINT("train", "--model", "cnn", "--data", "synthetic-imagenet", "--data-dir", "/tmp"),
                     "--data-dir is for --data fashion-mnist");
}

static void test_help(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("train", "--help");
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "usage: flint train --model mlp|cnn|resnet18"));
  assert_non_null(strstr(r->out, "--warmup E"));
  assert_non_null(strstr(r->out, "linear scaling"));
  free(r);
  r = RUN_FLINT("--help");
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "  train --model mlp|cnn|resnet18"));
  free(r);
}

int main(void) {
  const char *bin = getenv("FLINT_BIN");
  snprintf(flint_path, sizeof flint_path, "%s/flint", bin && *bin ? bin : "bin");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options_exit_2),
      cmocka_unit_test(test_help),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
