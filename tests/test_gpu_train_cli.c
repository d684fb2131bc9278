/*
 * test_gpu_train_cli: `flint train` run as a child process the way a user runs it: every
 * usage error exits 2 with one line on stderr naming the cause and the hint, --help exits 0,
 * the top-level usage lists the command, a run that diverges exits 1 naming the step (with
 * every optimizer), short runs with each optimizer succeed, and --resume goes on from a
 * --checkpoint file (with Adam's state too).
 * (Training runs are tested where the trainer's parts are: see test_gpu_optim and the
 * trainer's own tests.)
 *
 * The binary is $FLINT_BIN/flint (ctest sets FLINT_BIN to <build>/bin).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <sys/stat.h>

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

/* flint train compare: runs' curves in one SVG; its usage errors and a file it cannot read. */
static void test_compare_runs(void **state) {
  (void)state;
  char dir[256], a[300], svg[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(a, sizeof a, "%s/run.csv", dir);
  snprintf(svg, sizeof svg, "%s/cmp.svg", dir);
  FILE *f = fopen(a, "w");
  assert_non_null(f);
  fputs("epoch,train_loss,elapsed_s,reduced_mb\n1,2,1,10\n2,1,2,20\n", f);
  fclose(f);
  char labelled[320];
  snprintf(labelled, sizeof labelled, "%s=ssp:3", a);
  run_result *r = RUN_FLINT("train", "compare", "--svg", svg, "--title", "modes", a, labelled);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "compared 2 runs"));
  free(r);
  assert_int_equal(access(svg, R_OK), 0);
  r = RUN_FLINT("train", "compare", a);
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "--svg OUT.svg is required"));
  free(r);
  r = RUN_FLINT("train", "compare", "--svg", svg);
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "no run to plot"));
  free(r);
  r = RUN_FLINT("train", "compare", "--svg", svg, "/nonexistent/run.csv");
  assert_int_equal(r->status, 1);
  assert_non_null(strstr(r->err, "/nonexistent/run.csv"));
  free(r);
  test_rmtree(dir);
}
#define TFM_OPTS "--model", "transformer", "--data", "fashion-mnist"

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
  expect_usage_error(RUN_FLINT("train", BASE, "--compress", "topk:2"), "--compress 'topk:2': the ratio is outside (0, 1]");
  expect_usage_error(RUN_FLINT("train", BASE, "--compress", "powersgd:0"), "the rank is less than 1");
  expect_usage_error(RUN_FLINT("train", BASE, "--compress", "onebit", "--sync", "local:4"),
                     "--compress onebit needs --sync bsp");
  expect_usage_error(RUN_FLINT("train", BASE, "--epochs", "5", "--warmup", "5"), "--warmup 5 must be >= 0 and less than --epochs 5");
  expect_usage_error(RUN_FLINT("train", BASE, "--ranks", "3", "--batch", "256"), "--batch 256 is not a multiple of --ranks 3");
  expect_usage_error(RUN_FLINT("train", BASE, "--accumulate", "0"), "--accumulate '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--accumulate", "two"), "--accumulate 'two'");
  expect_usage_error(RUN_FLINT("train", BASE, "--ranks", "2", "--accumulate", "3"),
                     "--batch 256 is not a multiple of --ranks 2 x --accumulate 3 = 6");
  expect_usage_error(RUN_FLINT("train", "--model", "transformer", "--data", "fashion-mnist", "--accumulate", "2"),
                     "--accumulate is for the data-parallel models");
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
  expect_usage_error(RUN_FLINT("train", BASE, "--no-shuffle", "x"), "unexpected argument 'x'");
  expect_usage_error(RUN_FLINT("train", "--model", "cnn", "--data", "synthetic-imagenet", "--data-dir", "/tmp"),
                     "--data-dir is for --data fashion-mnist");
}

/* The optimizer's options: each bad value exits 2 naming it. */
static void test_bad_optimizer_options_exit_2(void **state) {
  (void)state;
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "adagrd"), "unknown optimizer 'adagrd'");
  /* Downpour's adagrad is the parameter servers' update. */
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "adagrad"), "adagrad is an update the parameter servers apply");
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer"), "--optimizer needs a value");
  expect_usage_error(RUN_FLINT("train", BASE, "--beta1", "1"), "--beta1 '1' is not a number in [0, 1)");
  expect_usage_error(RUN_FLINT("train", BASE, "--beta2", "-0.5"), "--beta2 '-0.5'");
  expect_usage_error(RUN_FLINT("train", BASE, "--eps", "0"), "--eps '0' is not a number > 0");
  expect_usage_error(RUN_FLINT("train", BASE, "--eps", "1e-300"), "--eps '1e-300'"); /* 0 as a float */
  expect_usage_error(RUN_FLINT("train", BASE, "--eps", "1e-6"), "--eps is for --optimizer adam, adamw, lamb or adagrad (this run's is sgd)");
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "lars", "--beta2", "0.9"), "--beta2 is for --optimizer adam");
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "lamb", "--trust-coef", "0.01"),
                     "--trust-coef is for --optimizer lars (this run's is lamb)");
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "adamw", "--momentum", "0.8"),
                     "--momentum is for --optimizer sgd or lars (this run's is adamw)");
  expect_usage_error(RUN_FLINT("train", BASE, "--trust-coef", "x"), "--trust-coef 'x'");
  expect_usage_error(RUN_FLINT("train", BASE, "--clip-grad-norm", "0"), "--clip-grad-norm '0' is not a number > 0");
  expect_usage_error(RUN_FLINT("train", BASE, "--clip-grad-norm", "inf"), "--clip-grad-norm 'inf'");
  expect_usage_error(RUN_FLINT("train", BASE, "--power", "0"), "--power '0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--power", "2"), "--power is for --decay poly");
  expect_usage_error(RUN_FLINT("train", BASE, "--decay", "quadratic"), "(cosine, step, poly or none)");
  expect_usage_error(RUN_FLINT("train", BASE, "--optimizer", "adam", "--nesterov"),
                     "--nesterov is for --optimizer sgd (this run's is adam)");
  expect_usage_error(RUN_FLINT("train", TFM_OPTS, "--tp", "2", "--optimizer", "lars"),
                     "--optimizer lars needs each weight's whole norm");
  expect_usage_error(RUN_FLINT("train", TFM_OPTS, "--clip-grad-norm", "1"), "--clip-grad-norm is for the data-parallel");
  /* --sync: bsp, local:TAU, adacomm[:TAU0]; local SGD is for the data-parallel models. */
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "bogus"),
                     "--sync 'bogus': expected bsp, local:TAU, adacomm[:TAU0], asp or ssp:S");
  /* asp and ssp:S: the parameter-server modes. */
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "ssp:-1"), "--sync 'ssp:-1'");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "ssp:x"), "--sync 'ssp:x'");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "ssp:"), "--sync 'ssp:'");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "asp", "--ps-fetch", "0"),
                     "--ps-fetch '0' is not a whole number of steps from 1 to 100000");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "asp", "--ps-push", "x"), "--ps-push 'x'");
  expect_usage_error(RUN_FLINT("train", BASE, "--ps-fetch", "2"), "--ps-fetch and --ps-push are for --sync asp and ssp:S");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "asp", "--momentum", "0.9"),
                     "--momentum 0.9 with --sync asp: the parameter servers apply plain SGD steps");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "ssp:2", "--optimizer", "lars"),
                     "--optimizer lars with --sync ssp: the parameter servers update with sgd, adagrad or adam");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "asp", "--optimizer", "adam", "--decay", "cosine"),
                     "runs on the servers at a fixed rate");
  expect_usage_error(RUN_FLINT("train", TFM_OPTS, "--sync", "asp"), "--sync asp is for the data-parallel models");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "local:0"), "--sync 'local:0'");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "local:"), "--sync 'local:'");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "adacomm:x"), "--sync 'adacomm:x'");
  expect_usage_error(RUN_FLINT("train", TFM_OPTS, "--sync", "local:4"), "--sync local and adacomm are for the data-parallel");
  expect_usage_error(RUN_FLINT("train", BASE, "--sync", "local:4", "--precision", "fp16", "--device", "cuda"),
                     "--precision fp16 needs --sync bsp");
  /* Mixed precision: cuda only, refused clearly on the cpu before anything starts. */
  expect_usage_error(RUN_FLINT("train", BASE, "--precision", "fp8"), "--precision 'fp8' is not fp32, tf32, bf16 or fp16");
  expect_usage_error(RUN_FLINT("train", BASE, "--precision", "bf16"),
                     "--precision bf16 needs --device cuda: the cpu device computes in fp32 only");
  expect_usage_error(RUN_FLINT("train", BASE, "--precision", "fp16", "--device", "cpu"),
                     "--precision fp16 needs --device cuda");
  expect_usage_error(RUN_FLINT("train", TFM_OPTS, "--precision", "fp16", "--device", "cuda"),
                     "--precision fp16 is for the data-parallel models");
}

#define TFM "--model", "transformer", "--data", "fashion-mnist"

static void test_bad_transformer_options_exit_2(void **state) {
  (void)state;
  expect_usage_error(RUN_FLINT("train", BASE, "--tp", "2"), "are for --model transformer");
  expect_usage_error(RUN_FLINT("train", BASE, "--recompute"), "are for --model transformer");
  expect_usage_error(RUN_FLINT("train", TFM, "--tp", "0"), "--tp '0'");
  expect_usage_error(RUN_FLINT("train", TFM, "--pp", "x"), "--pp 'x'");
  expect_usage_error(RUN_FLINT("train", TFM, "--dp", "2000"), "--dp '2000'");
  expect_usage_error(RUN_FLINT("train", TFM, "--schedule", "zigzag"), "unknown schedule 'zigzag'");
  expect_usage_error(RUN_FLINT("train", TFM, "--microbatches", "0"), "--microbatches '0'");
  expect_usage_error(RUN_FLINT("train", TFM, "--dropout", "1.5"), "--dropout '1.5'");
  expect_usage_error(RUN_FLINT("train", TFM, "--heads", "3"), "--heads 3 must divide --hidden 64");
  expect_usage_error(RUN_FLINT("train", TFM, "--tp", "8", "--batch", "256"), "--heads 4 must be a multiple of --tp 8");
  expect_usage_error(RUN_FLINT("train", TFM, "--pp", "3", "--batch", "256"),
                     "--batch 256 is not a multiple of --dp x --tp x --pp = 3");
  expect_usage_error(RUN_FLINT("train", TFM, "--pp", "2", "--microbatches", "3"),
                     "--microbatches 3 must divide the replica's batch");
  expect_usage_error(RUN_FLINT("train", TFM, "--chunks", "2"), "--chunks 2 needs --schedule interleaved");
  expect_usage_error(RUN_FLINT("train", TFM, "--pp", "4", "--schedule", "interleaved", "--chunks", "2"),
                     "8 stages, but the model has only 4 units");
  expect_usage_error(RUN_FLINT("train", TFM, "--bucket-mb", "1"), "--bucket-mb is for the data-parallel models");
  expect_usage_error(RUN_FLINT("train", TFM, "--resume", "x.ckpt"), "--resume is for the data-parallel models");
  expect_usage_error(RUN_FLINT("train", BASE, "--sequence-parallel"), "are for --model transformer");
  expect_usage_error(RUN_FLINT("train", TFM, "--sequence-parallel"), "--sequence-parallel splits the sequence");
  expect_usage_error(RUN_FLINT("train", TFM, "--tp", "8", "--heads", "8", "--batch", "256", "--sequence-parallel"),
                     "--sequence-parallel needs the sequence to be a multiple of --tp 8, but the encoder's is 28 "
                     "tokens (an image's rows: channels x height = 1 x 28)");
  expect_usage_error(RUN_FLINT("train", TFM, "--recompute", "sometimes"), "unexpected argument 'sometimes'");
  expect_usage_error(RUN_FLINT("train", "--model", "gpt", "--data", "fashion-mnist"),
                     "--model gpt trains on --data text:PATH");
  expect_usage_error(RUN_FLINT("train", "--model", "gpt", "--data", "text:"), "needs its file");
  expect_usage_error(RUN_FLINT("train", TFM, "--seq", "16"), "--seq is for --model gpt");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "1,x"), "--replicas '1,x' is not a list of replica counts");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "1,2", "--pp", "3"), "--replicas names 2 stages but --pp is 3");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "1,3", "--schedule", "interleaved"),
                     "--replicas runs --schedule gpipe, 1f1b, pipedream or 2bw, not interleaved");
  expect_usage_error(RUN_FLINT("train", BASE, "--replicas", "2"), "are for --model transformer");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "auto:0"), "auto:W takes W, the ranks of a pipeline");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "auto:3", "--batch", "256"),
                     "--batch 256 is not a multiple of --dp x W of --replicas auto:W = 3");
  expect_usage_error(RUN_FLINT("train", TFM, "--replicas", "auto:512", "--blocks", "200", "--batch", "512"),
                     "too large for the replicated partitioner");
  expect_usage_error(RUN_FLINT("train", TFM, "--experts", "3", "--dp", "2"), "--experts 3 must be a multiple of --dp 2");
  expect_usage_error(RUN_FLINT("train", TFM, "--top-k", "2"), "need --experts");
  expect_usage_error(RUN_FLINT("train", TFM, "--experts", "4", "--top-k", "0"), "--top-k '0'");
  expect_usage_error(RUN_FLINT("train", TFM, "--experts", "4", "--top-k", "8"), "--top-k 8 is more than --experts 4");
  expect_usage_error(RUN_FLINT("train", TFM, "--experts", "4", "--capacity-factor", "0"), "--capacity-factor '0'");
  expect_usage_error(RUN_FLINT("train", TFM, "--experts", "4", "--aux-alpha", "-1"), "--aux-alpha '-1'");
  expect_usage_error(RUN_FLINT("train", BASE, "--experts", "4"), "--experts is for --model transformer or gpt");
}

/* A short run with experts prints their settings, the balancing loss and the dropped share. */
static void test_experts_run(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    fprintf(stderr, "skipped: no Fashion-MNIST\n");
    skip();
  }
  char dir[] = "/tmp/flint-train-cli-XXXXXX", csv[64], svg[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  run_result *r = RUN_FLINT("train", TFM, "--dp", "2", "--experts", "4", "--top-k", "1", "--capacity-factor", "1",
                            "--moe-every", "2", "--batch", "32", "--epochs", "1", "--train-images", "256",
                            "--test-images", "64", "--hidden", "32", "--master", "local[2]", "--csv", csv, "--svg",
                            svg);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "experts      4 in every other block (2 a data-parallel rank), top-1, capacity "
                                 "factor 1, balancing loss alpha 0.01"));
  assert_non_null(strstr(r->out, "moe          balancing loss "));
  assert_non_null(strstr(r->out, " aux ")); /* the epoch line */
  unlink(csv);
  unlink(svg);
  free(r);
  rmdir(dir);
}

/* A short run of the hybrid trainer prints the grid, the bubble beside the theory and each
 * stage's peak activations, and writes the timeline files. */
static void test_transformer_run(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    fprintf(stderr, "skipped: no Fashion-MNIST\n");
    skip();
  }
  char dir[] = "/tmp/flint-train-cli-XXXXXX", csv[64], svg[64], tl_csv[64], tl_svg[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  snprintf(tl_csv, sizeof tl_csv, "%s/t.csv", dir);
  snprintf(tl_svg, sizeof tl_svg, "%s/t.svg", dir);
  run_result *r = RUN_FLINT("train", TFM, "--pp", "2", "--tp", "2", "--schedule", "gpipe", "--microbatches", "4",
                            "--batch", "32", "--epochs", "1", "--train-images", "256", "--test-images", "64",
                            "--hidden", "32", "--master", "local[4]", "--quiet", "--csv", csv, "--svg", svg,
                            "--timeline-csv", tl_csv, "--timeline-svg", tl_svg);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "grid         dp 1 x tp 2 x pp 2, gpipe schedule, 4 micro-batches of 8"));
  assert_non_null(strstr(r->out, "0.200 in theory")); /* (p-1)/(m+p-1) for p 2, m 4 */
  assert_non_null(strstr(r->out, "activations  peak per stage: "));
  const char *files[] = {csv, svg, tl_csv, tl_svg};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(stat(files[i], &st), 0);
    assert_true(st.st_size > 0);
    unlink(files[i]);
  }
  free(r);
  rmdir(dir);
}

/* A run that diverges (an absurd --lr) stops at the first non-finite loss: exit 1 and one
 * line naming the step, the epoch, the loss and the rate, with the hint; with every
 * optimizer. SGD's loss is NaN within steps at --lr 1e6; Adam's steps are bounded by the rate
 * (at 1e6 its loss stays a finite 1e19), and LARS's and LAMB's by the weights' norms, so they
 * get a rate whose steps overflow float. */
static void check_divergence_exits_1(const char *optimizer, const char *lr) {
  char dir[] = "/tmp/flint-train-cli-XXXXXX", csv[64], svg[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  run_result *r = RUN_FLINT("train", BASE, "--batch", "64", "--lr", lr, "--epochs", "2", "--train-images", "640",
                            "--test-images", "64", "--master", "local[1]", "--quiet", "--csv", csv, "--svg", svg,
                            "--optimizer", optimizer);
  if (r->status != 1 || !strstr(r->err, "diverged at step ")) {
    fprintf(stderr, "--optimizer %s:\n", optimizer);
    run_dump(r);
  }
  assert_int_equal(r->status, 1);
  assert_non_null(strstr(r->err, "flint train: "));
  assert_non_null(strstr(r->err, "training diverged at step "));
  assert_non_null(strstr(r->err, "(epoch "));
  assert_non_null(strstr(r->err, "learning rate"));
  assert_non_null(strstr(r->err, "--lr"));
  assert_null(strstr(r->out, "test         loss")); /* no result printed */
  struct stat st;
  assert_int_not_equal(stat(csv, &st), 0); /* no output file either */
  free(r);
  unlink(csv);
  unlink(svg);
  rmdir(dir);
}

static void test_divergence_exits_1(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    fprintf(stderr, "skipped: no Fashion-MNIST\n");
    skip();
  }
  const char *optimizers[] = {"sgd", "adam", "adamw", "lars", "lamb"};
  for (int i = 0; i < 5; i++) check_divergence_exits_1(optimizers[i], i == 0 ? "1e6" : "1e30");
}

/* A short run with each new optimizer, clipping and poly decay (lars with --accumulate) trains
 * to the end (exit 0) and says which optimizer it used. */
static void test_optimizers_run(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    fprintf(stderr, "skipped: no Fashion-MNIST\n");
    skip();
  }
  char dir[] = "/tmp/flint-train-cli-XXXXXX", csv[64], svg[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  const char *optimizers[] = {"adam", "adamw", "lars", "lamb"};
  for (int i = 0; i < 4; i++) {
    run_result *r = RUN_FLINT("train", BASE, "--batch", "64", "--lr", "0.01", "--epochs", "2", "--train-images",
                              "256", "--test-images", "64", "--master", "local[2]", "--ranks", "2", "--quiet",
                              "--csv", csv, "--svg", svg, "--optimizer", optimizers[i], "--clip-grad-norm", "1",
                              "--decay", "poly", "--power", "1", i % 2 ? "--decay-all" : "--no-decay-norm-bias",
                              /* lars with gradient accumulation: 2 micro-batches of 16 per rank */
                              i == 2 ? "--accumulate" : "--seed", i == 2 ? "2" : "1");
    if (r->status != 0) run_dump(r);
    assert_int_equal(r->status, 0);
    char want[64];
    snprintf(want, sizeof want, "per rank), %s, lr 0.01", optimizers[i]);
    assert_non_null(strstr(r->out, want));
    assert_non_null(strstr(r->out, "poly decay"));
    assert_non_null(strstr(r->out, "test         loss"));
    if (i == 2) assert_non_null(strstr(r->out, "accumulate   2 micro-batches of 16 per rank a step"));
    free(r);
  }
  unlink(csv);
  unlink(svg);
  rmdir(dir);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[4096];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void expect_failure(run_result *r, const char *needle) {
  if (r->status != 1 || !strstr(r->err, needle)) {
    fprintf(stderr, "expected exit 1 and '%s' on stderr\n", needle);
    run_dump(r);
  }
  assert_int_equal(r->status, 1);
  assert_non_null(strstr(r->err, "flint train: "));
  assert_non_null(strstr(r->err, needle));
  assert_null(strstr(r->out, "test         loss")); /* no result printed */
  free(r);
}

/* --model FILE.so: a user's model library, checked on the client (its symbol, its builder,
 * its output) and shipped to the ranks, in local mode and on a local cluster. */
static void test_user_model_library(void **state) {
  (void)state;
  struct stat st;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &st) != 0) {
    fprintf(stderr, "skipped: no Fashion-MNIST\n");
    skip();
  }
  const char *bin = getenv("FLINT_BIN");
  assert_non_null(bin);
  char lib[4096], with_symbol[4200];
  snprintf(lib, sizeof lib, "%s/model_user.so", bin);
#define USER_RUN "--data", "fashion-mnist", "--batch", "64", "--epochs", "1", "--train-images", "512", \
                 "--test-images", "128", "--quiet", "--lr", "0.05"
  run_result *r = RUN_FLINT("train", "--model", lib, USER_RUN, "--ranks", "2", "--master", "local[2]");
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "training library on fashion-mnist: 2 ranks"));
  assert_non_null(strstr(r->out, "test         loss"));
  free(r);
  r = RUN_FLINT("train", "--model", lib, USER_RUN, "--ranks", "2", "--master", "local-cluster[2,1,512]");
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "test         loss"));
  free(r);

  snprintf(with_symbol, sizeof with_symbol, "%s:nope", lib);
  expect_failure(RUN_FLINT("train", "--model", with_symbol, USER_RUN), "exports no nope");
  snprintf(with_symbol, sizeof with_symbol, "%s:wrong_output", lib);
  expect_failure(RUN_FLINT("train", "--model", with_symbol, USER_RUN), "its model's output is [n, 1, 28, 7], expected [n, 10]");
  snprintf(with_symbol, sizeof with_symbol, "%s:gives_up", lib);
  expect_failure(RUN_FLINT("train", "--model", with_symbol, USER_RUN),
                 "its builder failed: this builder wants 10 classes to be 3");
  expect_failure(RUN_FLINT("train", "--model", "/nonexistent/model.so", USER_RUN), "/nonexistent/model.so");
  char dir[] = "/tmp/flint-train-cli-XXXXXX", fake[64];
  assert_non_null(mkdtemp(dir));
  snprintf(fake, sizeof fake, "%s/fake.so", dir);
  FILE *f = fopen(fake, "w");
  assert_non_null(f);
  fputs("not a library\n", f);
  fclose(f);
  expect_failure(RUN_FLINT("train", "--model", fake, USER_RUN), "cannot load it as a shared library");
  unlink(fake);
  rmdir(dir);
#undef USER_RUN
}

/* Writes `n` rows of three separable classes: LIBSVM ("y i:v ...", 1-based, sparse: zeros left
 * out) or CSV ("y,v,..."). `labels` maps class k to the label written. */
static void write_rows(const char *path, int n, bool csv, const char *const *labels) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  uint64_t st = 99;
  for (int i = 0; i < n; i++) {
    int k = i % 3;
    fputs(labels[k], f);
    for (int j = 0; j < 6; j++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      double v = (double)(st >> 11) / 9007199254740992.0 - 0.5 + (j % 3 == k ? 2.0 : 0.0);
      if (csv) fprintf(f, ",%.4f", v);
      else if (j != 5 || k != 0) fprintf(f, " %d:%.4f", j + 1, v); /* feature 6 absent from class 0 */
    }
    fputc('\n', f);
  }
  fclose(f);
}

/* An uncompressed IDX pair of n 8x8 images: class k (of 4) has row 2k bright. */
static void write_idx_pair(const char *images, const char *labels, uint32_t n) {
  FILE *fi = fopen(images, "wb"), *fl = fopen(labels, "wb");
  assert_non_null(fi);
  assert_non_null(fl);
  const uint8_t ih[16] = {0, 0, 8, 3, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n,
                          0, 0, 0, 8, 0, 0, 0, 8};
  const uint8_t lh[8] = {0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  assert_int_equal(fwrite(ih, 1, 16, fi), 16);
  assert_int_equal(fwrite(lh, 1, 8, fl), 8);
  for (uint32_t i = 0; i < n; i++) {
    uint8_t k = (uint8_t)(i % 4), px[64];
    for (int j = 0; j < 64; j++) px[j] = (uint8_t)(j / 8 == 2 * k ? 200 + (i * 7 + (uint32_t)j) % 50 : (i * 13 + (uint32_t)j) % 40);
    assert_int_equal(fwrite(px, 1, 64, fi), 64);
    assert_int_equal(fwrite(&k, 1, 1, fl), 1);
  }
  fclose(fi);
  fclose(fl);
}

/* --data libsvm:, csv: and idx: with --test-data: the user's files, trained and evaluated. */
static void test_file_data(void **state) {
  (void)state;
  char dir[] = "/tmp/flint-train-cli-XXXXXX", train[64], test[64], csv_train[64], csv_test[64], bad[64];
  char d1[80], d2[80], d3[80], d4[80], d5[80];
  assert_non_null(mkdtemp(dir));
  snprintf(train, sizeof train, "%s/train.svm", dir);
  snprintf(test, sizeof test, "%s/test.svm", dir);
  snprintf(csv_train, sizeof csv_train, "%s/train.csv", dir);
  snprintf(csv_test, sizeof csv_test, "%s/test.csv", dir);
  snprintf(bad, sizeof bad, "%s/bad.svm", dir);
  static const char *const classes[] = {"0", "1", "2"}, *const halves[] = {"0.5", "1", "2"};
  write_rows(train, 600, false, classes);
  write_rows(test, 150, false, classes);
  write_rows(csv_train, 600, true, classes);
  write_rows(csv_test, 150, true, classes);
  write_rows(bad, 60, false, halves);
#define ROWS_RUN "--model", "mlp", "--batch", "32", "--epochs", "3", "--lr", "0.2", "--quiet", "--csv", \
                 "/dev/null", "--svg", "/dev/null"
  snprintf(d1, sizeof d1, "libsvm:%s", train);
  snprintf(d2, sizeof d2, "libsvm:%s", test);
  run_result *r = RUN_FLINT("train", ROWS_RUN, "--data", d1, "--test-data", d2, "--ranks", "2", "--master", "local[2]");
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "training mlp on libsvm: 2 ranks"));
  const char *acc = strstr(r->out, "test         loss");
  assert_non_null(acc);
  double loss, accuracy;
  assert_int_equal(sscanf(acc, "test         loss %lf  accuracy %lf", &loss, &accuracy), 2);
  assert_true(accuracy > 0.9); /* three well-separated blobs */
  free(r);
  snprintf(d3, sizeof d3, "csv:%s", csv_train);
  snprintf(d4, sizeof d4, "csv:%s", csv_test);
  r = RUN_FLINT("train", ROWS_RUN, "--data", d3, "--test-data", d4, "--master", "local[2]", "--label-smoothing", "0.1");
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  acc = strstr(r->out, "test         loss");
  assert_non_null(acc);
  assert_int_equal(sscanf(acc, "test         loss %lf  accuracy %lf", &loss, &accuracy), 2);
  assert_true(accuracy > 0.9);
  free(r);

  /* Usage errors exit 2; data that cannot be trained on exits 1 naming the cause. */
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", d1), "--data libsvm needs --test-data");
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", d1, "--test-data", d2, "--label-smoothing", "1"),
                     "--label-smoothing '1' is not a number in [0, 1)");
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", "libsvm:"), "needs its file: libsvm:PATH");
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", d1, "--test-data", d4), "is not in --data's format (libsvm:)");
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", "fashion-mnist", "--test-data", d2),
                     "--test-data is for --data libsvm:, csv: and idx:");
  expect_usage_error(RUN_FLINT("train", ROWS_RUN, "--data", "idx:only-one-file", "--test-data", "idx:a,b"),
                     "idx: takes IMAGES,LABELS");
  snprintf(d5, sizeof d5, "libsvm:%s", bad);
  expect_failure(RUN_FLINT("train", ROWS_RUN, "--data", d5, "--test-data", d2), "not all integers");
  expect_failure(RUN_FLINT("train", ROWS_RUN, "--data", "libsvm:/nonexistent/train.svm", "--test-data", d2),
                 "/nonexistent/train.svm");

  /* An IDX pair keeps the images' shape: the cnn trains on it (a small pair written here:
   * 8x8 images whose class is the row of their bright stripe). */
  char images[64], labels[64], idx[160];
  snprintf(images, sizeof images, "%s/images.idx", dir);
  snprintf(labels, sizeof labels, "%s/labels.idx", dir);
  write_idx_pair(images, labels, 384);
  snprintf(idx, sizeof idx, "idx:%s,%s", images, labels);
  r = RUN_FLINT("train", "--model", "cnn", "--data", idx, "--test-data", idx, "--batch", "64", "--epochs", "1",
                "--quiet", "--csv", "/dev/null", "--svg", "/dev/null", "--master", "local[2]");
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "training cnn on idx"));
  free(r);
  /* The encoder's sequence is the images' rows, known once the files are read: 8, which
   * --sequence-parallel cannot split over --tp 3; refused before any rank starts. */
  expect_failure(RUN_FLINT("train", "--model", "transformer", "--data", idx, "--test-data", idx, "--tp", "3",
                           "--heads", "3", "--hidden", "48", "--batch", "48", "--sequence-parallel", "--quiet",
                           "--csv", "/dev/null", "--svg", "/dev/null", "--master", "local[2]"),
                 "--sequence-parallel needs the sequence to be a multiple of --tp 3, but the encoder's is 8 tokens "
                 "(an image's rows: channels x height = 1 x 8)");
  unlink(images), unlink(labels);
#undef ROWS_RUN
  unlink(train), unlink(test), unlink(csv_train), unlink(csv_test), unlink(bad);
  rmdir(dir);
}

/* --resume: a run of 1 epoch writes a checkpoint, and a run of 2 started from it trains epoch
 * 2 only (its curves hold that row alone, and the steps go on from the checkpoint's). A file
 * that is missing, truncated, of another model or already at --epochs is exit 1 naming it. */
/* On 8 small IDX images (2 steps an epoch): what is checked is the file and the steps, and
 * synthetic-imagenet's 224x224 images made each run take a second. */
#define RESUME_BASE "--data", idx, "--test-data", idx, "--batch", "4", "--device", "cpu", "--master", "local[1]", \
                    "--quiet", "--csv", csv, "--svg", svg

static void test_resume(void **state) {
  (void)state;
  char dir[] = "/tmp/flint-train-cli-XXXXXX", csv[64], svg[64], ck[64], bad[64], missing[64];
  assert_non_null(mkdtemp(dir));
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svg, sizeof svg, "%s/c.svg", dir);
  snprintf(ck, sizeof ck, "%s/run.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
  snprintf(missing, sizeof missing, "%s/missing.ckpt", dir);
  char images[64], labels[64], idx[160];
  snprintf(images, sizeof images, "%s/images.idx", dir);
  snprintf(labels, sizeof labels, "%s/labels.idx", dir);
  write_idx_pair(images, labels, 8);
  snprintf(idx, sizeof idx, "idx:%s,%s", images, labels);
  run_result *r = RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "1", "--checkpoint", ck);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "epochs       1 (2 steps, 1 attempt)"));
  free(r);

  r = RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "2", "--resume", ck);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  char want[128];
  snprintf(want, sizeof want, "resumed      %s after epoch 1\n", ck);
  assert_non_null(strstr(r->out, want));
  assert_non_null(strstr(r->out, "epochs       2 (4 steps, 1 attempt)")); /* 2 steps from the file, 2 here */
  free(r);
  const char *rows = read_text(csv);
  assert_non_null(strstr(rows, "\n2,"));
  assert_null(strstr(rows, "\n1,")); /* epoch 1 was not trained again */

  expect_failure(RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "2", "--resume", missing),
                 "cannot open");
  FILE *f = fopen(bad, "w");
  assert_non_null(f);
  fputs("FLNTCKPT but not really a checkpoint", f);
  fclose(f);
  expect_failure(RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "2", "--resume", bad), bad);
  expect_failure(RUN_FLINT("train", "--model", "mlp", RESUME_BASE, "--epochs", "2", "--resume", ck),
                 "does not match this model");
  expect_failure(RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "1", "--resume", ck),
                 "nothing to train");
  /* Adam's moments and step count go with the weights; another optimizer cannot take them. */
  r = RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "1", "--optimizer", "adamw", "--lr", "0.001",
                "--checkpoint", ck);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  free(r);
  r = RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "2", "--optimizer", "adamw", "--lr", "0.001",
                "--resume", ck);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "epochs       2 (4 steps, 1 attempt)"));
  free(r);
  expect_failure(RUN_FLINT("train", "--model", "cnn", RESUME_BASE, "--epochs", "2", "--resume", ck),
                 "it holds adamw's optimizer state, but this run's optimizer is sgd");
  unlink(csv);
  unlink(svg);
  unlink(ck);
  unlink(bad);
  unlink(images), unlink(labels);
  rmdir(dir);
}

static void test_help(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("train", "--help");
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "usage: flint train --model mlp|cnn|resnet18|resnet50|transformer|gpt|FILE.so[:SYMBOL]"));
  assert_non_null(strstr(r->out, "--sequence-parallel"));
  assert_non_null(strstr(r->out, "--recompute [full|selective]"));
  assert_non_null(strstr(r->out, "--microbatches M"));
  assert_non_null(strstr(r->out, "--warmup E"));
  assert_non_null(strstr(r->out, "--resume PATH"));
  assert_non_null(strstr(r->out, "--optimizer O       sgd (default), adam, adamw"));
  assert_non_null(strstr(r->out, "--clip-grad-norm X"));
  assert_non_null(strstr(r->out, "--decay-all"));
  assert_non_null(strstr(r->out, "--accumulate K      gradient accumulation"));
  assert_non_null(strstr(r->out, "--batch 16384 --accumulate 32"));
  assert_non_null(strstr(r->out, "linear scaling"));
  /* The large-batch example uses a rate that converges at batch 8192 (docs/gpu.md: the cnn
   * diverges there from 0.05), and the 8-rank examples ask for 8 task slots whatever the
   * machine's cores. */
  assert_non_null(strstr(r->out, "--batch 8192 --lr 0.01 "));
  assert_non_null(strstr(r->out, "--epochs 30 --master 'local[8]'"));
  assert_non_null(strstr(r->out, "--epochs 1 --master 'local[8]'"));
  free(r);
  r = RUN_FLINT("--help");
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "  train --model mlp|cnn|resnet18|transformer"));
  free(r);
}

int main(void) {
  const char *bin = getenv("FLINT_BIN");
  snprintf(flint_path, sizeof flint_path, "%s/flint", bin && *bin ? bin : "bin");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_options_exit_2),
      cmocka_unit_test(test_compare_runs),
      cmocka_unit_test(test_bad_transformer_options_exit_2),
      cmocka_unit_test(test_bad_optimizer_options_exit_2),
      cmocka_unit_test(test_optimizers_run),
      cmocka_unit_test(test_transformer_run),
      cmocka_unit_test(test_experts_run),
      cmocka_unit_test(test_divergence_exits_1),
      cmocka_unit_test(test_user_model_library),
      cmocka_unit_test(test_file_data),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_help),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
