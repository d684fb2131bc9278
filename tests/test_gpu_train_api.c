/*
 * test_gpu_train_api: fl_train (include/flint/train.h) as a program uses it: datasets of
 * example records made on the client, a builder of the program's own in local mode, and a
 * builder from a shared library (tests/jobs/model_user.c) on a local cluster, where a builder
 * of the program is refused with a message that says what to do; and every gradient
 * compression hook (the options' compress) trains.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "flint/train.h"
#include "train_examples.h"

#define assert_ok(call)                                                                      \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    if (s_ != FL_OK) fail_msg("%s: %s: %s", #call, fl_status_name(s_), fl_last_error());    \
  } while (0)



static atomic_int built; /* the ranks are threads that build at once */

static fl_status my_model(fl_model *m, uint32_t classes) {
  built++;
  fl_status s = fl_model_linear(m, "fc1", 32, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc2", (int)classes, true);
  return s;
}

static fl_status wrong_classes(fl_model *m, uint32_t classes) {
  return fl_model_linear(m, "fc", (int)classes + 1, true);
}

static void test_local_program_builder(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *train = examples(ctx, 600, 1), *test = examples(ctx, 150, 2);
  fl_train_options o = FL_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.batch = 32;
  o.schedule.lr = 0.4;
  o.epochs = 3;
  o.label_smoothing = 0.05;
  int64_t shape[1] = {FEATURES};
  fl_train_result r;
  built = 0;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  assert_true(built >= 3); /* the client's check and both ranks */
  assert_int_equal(r.epochs, 3);
  assert_true(r.steps >= 3 * (600 / 32) - 3);
  assert_true(r.test_acc > 0.9);

  /* Bad calls: named, nothing run. */
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, wrong_classes, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "output is [n, 4], expected [n, 3]"));
  int64_t other[1] = {FEATURES + 1};
  assert_int_not_equal(fl_train(ctx, train, test, 1, other, CLASSES, my_model, &o, &r), FL_OK);
  assert_non_null(strstr(fl_last_error(), "an example of 28 bytes, but a label and 7 floats take 32"));
  assert_int_not_equal(fl_train(ctx, train, test, 1, shape, 2, my_model, &o, &r), FL_OK); /* found by the tasks */
  assert_non_null(strstr(fl_last_error(), "label 2 is not a class in [0, 2)"));
  o.optimizer.kind = "rmsprop";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "rmsprop"));
  o.optimizer.kind = "sgd";
  o.schedule.decay = "exponential";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "unknown decay 'exponential'"));
  o.schedule.decay = NULL;
  o.schedule.epochs = 7;
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "schedule.epochs 7 must be 0 or the options' batch 32 and epochs 3"));
  o.schedule.epochs = 0;
  o.precision = FL_PRECISION_BF16;
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "needs --device cuda: the cpu device computes in fp32 only"));
  o.precision = FL_PRECISION_FP32;
  /* Adam with a step decay trains as well. */
  o.optimizer = (fl_optimizer_options)FL_OPTIMIZER_OPTIONS_INIT;
  o.optimizer.kind = "adam";
  o.schedule.lr = 0.01;
  o.schedule.decay = "step";
  o.schedule.milestones[0] = 2;
  o.schedule.num_milestones = 1;
  o.label_smoothing = 0;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  assert_true(r.test_acc > 0.9);
  assert_int_equal(r.resumed_epoch, 0);

  /* Checkpoint after 2 epochs, then resume to 3: the run starts at epoch 2. */
  char path[] = "/tmp/flint-test-train-api-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  o.epochs = 2;
  o.schedule.milestones[0] = 1;
  o.checkpoint_path = path;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  o.epochs = 3;
  o.checkpoint_path = NULL;
  o.resume_path = path;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  assert_int_equal(r.resumed_epoch, 2);
  assert_int_equal(r.epochs, 3);
  assert_true(r.test_acc > 0.9);
  unlink(path);
  o.resume_path = NULL;
  /* Gradient accumulation: 4 micro-batches of 4 per rank train as well; a batch that does not
   * split into ranks x accumulate equal parts is refused, naming both. */
  o.accumulate = 4;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  assert_true(r.test_acc > 0.9);
  o.accumulate = 3;
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "--batch 32 is not a multiple of --ranks 2 x --accumulate 3"));
  o.accumulate = 1;
  /* The parameter servers (sync "ssp:1", Downpour's periods): the servers' sgd has no
   * momentum, and the default's 0.9 is refused saying so. The examples' partitions may differ
   * in size: each worker takes its own steps and retires when done. */
  o = (fl_train_options)FL_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.batch = 32;
  o.schedule.lr = 0.4;
  o.epochs = 3;
  o.sync = "ssp:1";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "--momentum 0.9 with --sync ssp"));
  o.optimizer.momentum = 0;
  o.ps_fetch = 2;
  o.ps_push = 2;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
  assert_int_equal(r.epochs, 3);
  assert_true(r.test_acc > 0.9);
  fl_dataset_free(train);
  fl_dataset_free(test);
  fl_context_close(ctx);
}

/* Gradient compression (the options' compress): every hook trains the examples at 2 ranks to a
 * finite loss and well above chance (3 classes), sending fewer bytes than the gradients hold;
 * bad specs and local SGD are refused, naming the cause. */
static void test_compress(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *train = examples(ctx, 600, 1), *test = examples(ctx, 150, 2);
  fl_train_options o = FL_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.batch = 32;
  o.schedule.lr = 0.4;
  o.epochs = 3;
  int64_t shape[1] = {FEATURES};
  fl_train_result r;
  const char *specs[] = {"none", "fp16", "bf16", "topk:0.1", "powersgd:2", "onebit"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    o.compress = specs[i];
    assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r));
    fprintf(stderr, "  --compress %-10s loss %.4f, test accuracy %.3f, %llu of %llu bytes sent\n", specs[i],
            r.train_loss, r.test_acc, (unsigned long long)r.sent_bytes, (unsigned long long)r.reduced_bytes);
    assert_int_equal(r.epochs, 3);
    assert_true(isfinite(r.train_loss));
    assert_true(r.test_acc > 0.6);
    assert_true(r.reduced_bytes > 0);
    if (i == 0) assert_int_equal(r.sent_bytes, r.reduced_bytes);
    else if (i <= 2) assert_int_equal(r.sent_bytes, r.reduced_bytes / 2);
    else assert_true(r.sent_bytes < r.reduced_bytes);
  }
  o.compress = "topk:0";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "--compress 'topk:0': the ratio is outside (0, 1]"));
  o.compress = "powersgd:0";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "the rank is less than 1"));
  o.compress = "gzip";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "unknown method"));
  o.compress = "fp16";
  o.sync = "local:4";
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "needs --sync bsp: local SGD and AdaComm allreduce no gradients"));
  fl_dataset_free(train);
  fl_dataset_free(test);
  fl_context_close(ctx);
}

static void test_cluster_library_builder(void **state) {
  (void)state;
  const char *bin = getenv("FLINT_BIN");
  assert_non_null(bin);
  char path[4096];
  snprintf(path, sizeof path, "%s/model_user.so", bin);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  assert_non_null(lib);
  fl_model_builder from_library = (fl_model_builder)(uintptr_t)dlsym(lib, "flint_model");
  assert_non_null((void *)(uintptr_t)from_library);
  fl_context *ctx;
  assert_ok(fl_context_open("local-cluster[2,1,512]", NULL, &ctx));
  /* model_user's flint_model flattens the sample first: images of 1 x 2 x 3. */
  fl_dataset *train = examples(ctx, 300, 3), *test = examples(ctx, 90, 4);
  fl_train_options o = FL_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.batch = 30;
  o.schedule.lr = 0.3;
  o.epochs = 2;
  int64_t shape[3] = {1, 2, 3};
  fl_train_result r;
  assert_ok(fl_train(ctx, train, test, 3, shape, CLASSES, from_library, &o, &r));
  assert_int_equal(r.epochs, 2);
  /* A builder of this program cannot reach an executor. */
  int64_t flat[1] = {FEATURES};
  assert_int_equal(fl_train(ctx, train, test, 1, flat, CLASSES, my_model, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "is in the program itself: in cluster mode put it in a shared library"));
  fl_dataset_free(train);
  fl_dataset_free(test);
  fl_context_close(ctx);
  dlclose(lib);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_program_builder),
      cmocka_unit_test(test_compress),
      cmocka_unit_test(test_cluster_library_builder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
