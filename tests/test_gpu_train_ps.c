/* test_gpu_train_ps.c: the trainer's parameter-server modes (gpu/parallel/train_ps.c, --sync asp
 * and ssp:S), on the cpu device in local mode, Fashion-MNIST subsets:
 *   - ssp:0 with sgd and momentum 0 is --sync bsp step for step: the same final weights and
 *     the same epoch rows, within EQ_TOL;
 *   - asp, ssp:2, asp with Downpour's --ps-fetch 2 --ps-push 2, and adagrad on the servers
 *     train the MLP to a sane accuracy; under ssp:2 no pull's weights were more than 2 steps
 *     behind the pulling worker (the clocks the servers return with every pull), in every
 *     epoch row and over the run;
 *   - a worker whose task fails once (FLINT_TRAIN_PS_FAIL) is retried alone and resumes at the
 *     servers' clock for it, under asp and ssp:0: the run finishes, and the servers count
 *     every step of every worker;
 *   - refusals: batch-norm models, momentum, optimizers the servers do not have, too few task
 *     slots, the parser's bad texts; a diverging run fails naming the step.
 * Links the shared libraries (the workers' function is libflint_gpu's). Needs Fashion-MNIST
 * (skipped without it). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/parallel/train.h"

#define TEST_TIME_BOUND_S 300
#include "test_util.h"
#include "fashion_data.h"

/* 20 steps of a global batch of 48 over 3 workers. */
#define EQ_BATCH 48u
#define EQ_STEPS 20u
/* max_i |w_ssp[i] - w_bsp[i]| / max(1, |w_bsp[i]|). Both runs take the same steps from the
 * same weights on the same batches: bsp averages the ranks' gradients in the allreduce and
 * steps w -= lr (g + wd w); ssp:0's servers add each worker's -lr (g_r + wd w) / 3 in the
 * order the pushes arrive. Only the order and grouping of float32 additions differ: a few
 * ulps (~1e-7 relative) per step over 40 steps (measured: 6e-8). 1e-5 is test_gpu_train's
 * EQ_TOL, with its margin, and below what a step taken wrong makes: one step's update is
 * ~1e-4 here, and weight decay 0.05 moves the weights by ~3e-5 over the run, so a decay
 * applied to the wrong group or the wrong weights would show. lr 0.03 keeps ReLU decisions
 * off rounding (test_gpu_train.c explains; at weight decay 5e-4 a shuffled second epoch
 * amplified rounding to 4e-6, inside the tolerance but closer). */
#define EQ_TOL 1e-5

static char tmp_dir[128];

static gpu_train_options ps_options(uint32_t ranks, const char *master) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.master = master;
  o.model = NN_MLP;
  o.ranks = ranks;
  o.batch = EQ_BATCH;
  o.epochs = 1;
  o.lr = 0.03;
  o.decay = OPTIM_DECAY_NONE;
  o.optim.momentum = 0;
  o.optim.weight_decay = 0.05f; /* large enough that a decay taken wrong would show in EQ_TOL */
  o.seed = 7;
  o.max_train_images = (uint64_t)EQ_STEPS * EQ_BATCH;
  o.max_test_images = 60;
  return o;
}

/* The weights of a checkpoint file (its layout: gpu/nn/checkpoint.c; test_gpu_train reads it
 * the same way). */
static float *load_weights(const char *path, uint64_t *count) {
  FILE *f = fopen(path, "rb");
  if (!f) fprintf(stderr, "cannot open %s: %s\n", path, strerror(errno));
  assert_non_null(f);
  uint8_t head[88];
  assert_int_equal(fread(head, 1, sizeof head, f), sizeof head);
  assert_memory_equal(head, "FLNTCKPT", 8);
  memcpy(count, head + 16, 8);
  float *w = malloc(*count * sizeof(float) + 1);
  assert_non_null(w);
  assert_int_equal(fread(w, sizeof(float), *count, f), *count);
  fclose(f);
  return w;
}

typedef struct rows {
  gpu_train_epoch e[8];
  uint32_t count;
} rows;

static void keep_row(const gpu_train_epoch *e, void *user) {
  rows *r = user;
  if (r->count < 8) r->e[r->count++] = *e;
}

static void run(gpu_train_options *o, const char *name, rows *r, gpu_train_result *res) {
  o->on_epoch = keep_row;
  o->user = r;
  assert_ok(gpu_train_run(o, res));
  fprintf(stderr, "  %-24s loss %.4f, test acc %.4f, staleness <= %llu, %.1f MiB a worker, %.1f s\n", name,
          res->train_loss, res->test_acc, (unsigned long long)res->max_staleness,
          (double)res->reduced_bytes / (1 << 20), res->seconds);
  assert_int_equal(r->count, o->epochs);
}

static void test_ssp0_equals_bsp(void **state) {
  (void)state;
  NEED_DATA();
  char bsp_path[256], ssp_path[256];
  snprintf(bsp_path, sizeof bsp_path, "%s/bsp.ckpt", tmp_dir);
  snprintf(ssp_path, sizeof ssp_path, "%s/ssp0.ckpt", tmp_dir);
  gpu_train_options o = ps_options(3, "local[3]");
  o.epochs = 2;
  o.checkpoint_path = bsp_path;
  rows rb = {0}, rs = {0};
  gpu_train_result res;
  run(&o, "bsp", &rb, &res);
  o.sync = GPU_TRAIN_SYNC_SSP;
  o.staleness = 0;
  o.checkpoint_path = ssp_path;
  run(&o, "ssp:0", &rs, &res);
  assert_int_equal(res.max_staleness, 0);
  assert_int_equal(res.worker_steps_min, 2 * EQ_STEPS);
  assert_int_equal(res.steps, 2 * EQ_STEPS);
  uint64_t nb, ns;
  float *wb = load_weights(bsp_path, &nb), *ws = load_weights(ssp_path, &ns);
  assert_int_equal(nb, ns);
  double d = 0;
  for (uint64_t i = 0; i < nb; i++) {
    double x = fabs((double)ws[i] - wb[i]) / fmax(1.0, fabs((double)wb[i]));
    if (!(x <= d)) d = x;
  }
  fprintf(stderr, "  ssp:0 vs bsp: max |w_ssp - w_bsp| / max(1, |w_bsp|) = %.3g (tolerance %g)\n", d, EQ_TOL);
  assert_true(d <= EQ_TOL);
  /* Every epoch's row: the training loss over all workers' batches, and the test set on the
   * servers' weights, as bsp's ranks saw them. */
  for (uint32_t i = 0; i < 2; i++) {
    assert_int_equal(rs.e[i].epoch, i + 1);
    assert_true(fabs(rs.e[i].train_loss - rb.e[i].train_loss) <= EQ_TOL);
    assert_true(fabs(rs.e[i].test_loss - rb.e[i].test_loss) <= EQ_TOL);
    assert_true(fabs(rs.e[i].train_acc - rb.e[i].train_acc) <= EQ_TOL);
    assert_true(rs.e[i].reduced_bytes > 0);
  }
  /* Moved away from the start: the comparison is not between two untrained models. */
  assert_true(rs.e[1].train_loss < rs.e[0].train_loss);
  free(wb);
  free(ws);
  unlink(bsp_path);
  unlink(ssp_path);
}

/* The modes that do not wait (or wait little) still train: above 60% test accuracy after 2
 * epochs of 4800 images (chance is 10%; bsp reaches about 75% here). */
static void test_asp_and_ssp_train(void **state) {
  (void)state;
  NEED_DATA();
  char csv[256];
  snprintf(csv, sizeof csv, "%s/ps.csv", tmp_dir);
  struct {
    const char *name;
    gpu_train_sync sync;
    uint32_t staleness, fetch, push;
    optim_kind kind;
    double lr;
  } cases[] = {
      {"asp", GPU_TRAIN_SYNC_ASP, 0, 1, 1, OPTIM_SGD, 0.2},
      {"ssp:2", GPU_TRAIN_SYNC_SSP, 2, 1, 1, OPTIM_SGD, 0.2},
      {"asp fetch 2 push 2", GPU_TRAIN_SYNC_ASP, 0, 2, 2, OPTIM_SGD, 0.2},
      {"ssp:1 adagrad", GPU_TRAIN_SYNC_SSP, 1, 1, 1, OPTIM_ADAGRAD, 0.05},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    gpu_train_options o = ps_options(4, "local[4]");
    o.batch = 64;
    o.epochs = 2;
    o.max_train_images = 4800;
    o.max_test_images = 1000;
    o.sync = cases[i].sync;
    o.staleness = cases[i].staleness;
    o.ps_fetch = cases[i].fetch;
    o.ps_push = cases[i].push;
    o.optim.kind = cases[i].kind;
    o.lr = cases[i].lr;
    o.csv_path = csv;
    rows r = {0};
    gpu_train_result res;
    run(&o, cases[i].name, &r, &res);
    assert_true(res.test_acc > 0.6);
    assert_int_equal(res.worker_steps_min, 2 * (4800 / 4 / 16));
    if (o.sync == GPU_TRAIN_SYNC_SSP) {
      /* Ho et al.'s bound, from the clocks the servers answered every pull with. */
      assert_true(res.max_staleness <= o.staleness);
      for (uint32_t e = 0; e < r.count; e++) assert_true(r.e[e].max_staleness <= o.staleness);
    }
    /* The curves carry each epoch's MiB pushed and pulled by a worker. */
    FILE *f = fopen(csv, "r");
    assert_non_null(f);
    char line[512], last[512] = "";
    assert_non_null(fgets(line, sizeof line, f));
    while (fgets(line, sizeof line, f)) snprintf(last, sizeof last, "%s", line);
    fclose(f);
    assert_int_equal(atoi(last), 2);
    const char *mb = strrchr(last, ',');
    assert_non_null(mb);
    assert_true(fabs(strtod(mb + 1, NULL) - (double)r.e[1].reduced_bytes / (1 << 20)) < 1e-3);
    unlink(csv);
  }
}

/* A worker's task fails once at step 5: it alone is retried, opens the same worker and goes
 * on from the servers' clock for it, so that every worker's every step is trained. */
static void check_fails_once(gpu_train_sync sync, const char *name, const char *master) {
  setenv("FLINT_TRAIN_PS_FAIL", "1:5", 1); /* local-cluster's executors inherit it */
  gpu_train_options o = ps_options(3, master);
  o.epochs = 2;
  o.sync = sync;
  rows r = {0};
  gpu_train_result res;
  run(&o, name, &r, &res);
  unsetenv("FLINT_TRAIN_PS_FAIL");
  assert_int_equal(res.resumed_workers, 1);
  assert_int_equal(res.worker_steps_min, 2 * EQ_STEPS);
  assert_true(res.train_loss < log(10.0)); /* below chance's: it learned */
}

static void test_worker_fails_once(void **state) {
  (void)state;
  NEED_DATA();
  check_fails_once(GPU_TRAIN_SYNC_ASP, "asp, worker 1 fails", "local[3]");
  /* ssp:0: the others wait in their pulls until the retry catches up. */
  check_fails_once(GPU_TRAIN_SYNC_SSP, "ssp:0, worker 1 fails", "local[3]");
}

/* The same on a local cluster: the workers are the executors' tasks (the function shipped
 * from libflint_gpu.so), the table's shards are replicated on the two executors, and the
 * retried task may run on the other executor. */
static void test_local_cluster_worker_fails_once(void **state) {
  (void)state;
  NEED_DATA();
  check_fails_once(GPU_TRAIN_SYNC_SSP, "local-cluster ssp:0, worker 1 fails", "local-cluster[2,2,1024]");
}

static void expect_invalid(const gpu_train_options *o, const char *needle) {
  assert_int_equal(gpu_train_options_validate(o), FL_EINVAL);
  if (!strstr(fl_last_error(), needle)) fprintf(stderr, "message: %s\n", fl_last_error());
  assert_non_null(strstr(fl_last_error(), needle));
}

static void test_options(void **state) {
  (void)state;
  gpu_train_sync sync;
  uint32_t tau, s;
  assert_ok(gpu_train_sync_parse("asp", &sync, &tau, &s));
  assert_int_equal(sync, GPU_TRAIN_SYNC_ASP);
  assert_ok(gpu_train_sync_parse("ssp:0", &sync, &tau, &s));
  assert_int_equal(sync, GPU_TRAIN_SYNC_SSP);
  assert_int_equal(s, 0);
  assert_ok(gpu_train_sync_parse("ssp:3", &sync, &tau, &s));
  assert_int_equal(s, 3);
  assert_ok(gpu_train_sync_parse("local:4", &sync, &tau, &s));
  assert_int_equal(s, 0);
  assert_int_equal(tau, 4);
  const char *bad[] = {"ssp:-1", "ssp:x", "ssp:", "ssp", "ssp:100001", "ssp:1x", "asp:1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(gpu_train_sync_parse(bad[i], &sync, &tau, &s), FL_EINVAL);
    assert_non_null(strstr(fl_last_error(), bad[i]));
    assert_non_null(strstr(fl_last_error(), "ssp:S"));
  }
  gpu_train_options o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_ASP;
  assert_ok(gpu_train_options_validate(&o));
  o.optim.momentum = 0.9f;
  expect_invalid(&o, "--momentum 0.9 with --sync asp: the parameter servers apply plain SGD steps");
  o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_SSP;
  o.optim.kind = OPTIM_ADAMW;
  expect_invalid(&o, "--optimizer adamw with --sync ssp");
  o.optim.kind = OPTIM_ADAM;
  assert_ok(gpu_train_options_validate(&o));
  o.decay = OPTIM_DECAY_COSINE;
  expect_invalid(&o, "fixed rate");
  o = ps_options(2, "local[2]");
  o.optim.kind = OPTIM_ADAGRAD; /* with bsp */
  expect_invalid(&o, "adagrad is an update the parameter servers apply");
  o = ps_options(2, "local[2]");
  o.ps_fetch = 2; /* with bsp */
  expect_invalid(&o, "--ps-fetch, --ps-push and a staleness are for --sync asp and ssp:S");
  o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_ASP;
  o.staleness = 3;
  expect_invalid(&o, "--sync asp has no staleness bound");
  o.staleness = 0;
  o.accumulate = 2;
  expect_invalid(&o, "--accumulate is for --sync bsp");
  o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_SSP;
  o.model = NN_TRANSFORMER;
  expect_invalid(&o, "--sync ssp is for the data-parallel models");
}

/* Refusals that need the run's model or context, and a diverging run. */
static void test_refusals_and_divergence(void **state) {
  (void)state;
  NEED_DATA();
  gpu_train_options o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_ASP;
  o.model = NN_CNN; /* batch norm */
  gpu_train_result res;
  assert_int_equal(gpu_train_run(&o, &res), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "batch-norm statistics"));
  o = ps_options(3, "local[2]");
  o.sync = GPU_TRAIN_SYNC_SSP;
  o.staleness = 1;
  assert_int_equal(gpu_train_run(&o, &res), FL_ESLOTS);
  assert_non_null(strstr(fl_last_error(), "3 workers need 3 task slots at once"));
  o = ps_options(2, "local[2]");
  o.sync = GPU_TRAIN_SYNC_ASP;
  o.lr = 1e6;
  assert_int_equal(gpu_train_run(&o, &res), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "training diverged at step"));
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/flint-test-gpu-train-ps-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  const struct CMUnitTest tests[] = {
      T(test_options),
      T(test_ssp0_equals_bsp),
      T(test_asp_and_ssp_train),
      T(test_worker_fails_once),
      T(test_local_cluster_worker_fails_once),
      T(test_refusals_and_divergence),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  int failed = cmocka_run_group_tests_name("gpu_train_ps", tests, NULL, NULL);
  rmdir(tmp_dir);
  return failed;
}
