/*
 * test_ml_ps.c: fl_ml_logreg's ps solver (ml/ps_logreg.c): sparse logistic regression through
 * parameter-server tables, with workers as tasks over the cached partitions. BSP against
 * L-BFGS on the same data, ASP and SSP converging, hashed text features at 2^20 columns, a
 * worker task that fails once, the curve rows, and bad options.
 */
#include <math.h>

#define TEST_TIME_BOUND_S 240
#include "flint/ml.h"
#include "test_util.h"

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

/* A click-log-like LIBSVM file: `rows` rows of 10 features of value 1 out of `cols`, drawn
 * with a skew (a few hot features, many rare), labels from a logistic model with weights
 * N(0, 1) and intercept -0.5. */
static void write_clicks(const char *path, uint32_t rows, uint32_t cols, uint64_t seed) {
  uint64_t s = seed;
  double *w = malloc(cols * sizeof *w);
  for (uint32_t j = 0; j < cols; j++) {
    double u1 = rng_unit(&s) + 1e-12, u2 = rng_unit(&s);
    w[j] = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
  }
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (uint32_t i = 0; i < rows; i++) {
    uint32_t idx[10];
    int n = 0;
    while (n < 10) {
      double u = rng_unit(&s);
      uint32_t j = (uint32_t)(u * u * u * cols); /* skewed toward low ids */
      bool dup = false;
      for (int k = 0; k < n; k++) dup |= idx[k] == j;
      if (!dup) idx[n++] = j;
    }
    for (int a = 1; a < n; a++) /* ascending, as LIBSVM lines are */
      for (int b = a; b > 0 && idx[b - 1] > idx[b]; b--) {
        uint32_t t = idx[b];
        idx[b] = idx[b - 1];
        idx[b - 1] = t;
      }
    double m = -0.5;
    for (int k = 0; k < n; k++) m += w[idx[k]];
    int y = rng_unit(&s) < 1 / (1 + exp(-m));
    fprintf(f, "%d", y);
    for (int k = 0; k < n; k++) fprintf(f, " %u:1", idx[k] + 1);
    fputc('\n', f);
  }
  assert_int_equal(fclose(f), 0);
  free(w);
}

typedef struct fixture {
  char dir[256], path[300];
  fl_context *ctx;
  fl_ml_data *data;
} fixture;

static void open_clicks(fixture *fx, const char *master, uint32_t rows, uint32_t partitions) {
  test_tmpdir(fx->dir, sizeof fx->dir);
  snprintf(fx->path, sizeof fx->path, "%s/clicks.svm", fx->dir);
  write_clicks(fx->path, rows, 500, 7);
  assert_ok(fl_context_open(master, NULL, &fx->ctx));
  fl_ml_load_options lo = {.partitions = partitions, .num_features = 500};
  assert_ok(fl_ml_load(fx->ctx, fx->path, FL_ML_LIBSVM, &lo, &fx->data));
  assert_true(fx->data->sparse);
}

static void close_fixture(fixture *fx) {
  fl_ml_data_free(fx->data);
  fl_context_close(fx->ctx);
  test_rmtree(fx->dir);
}

typedef struct curve {
  fl_ml_ps_epoch rows[64];
  uint32_t n;
} curve;

static fl_status keep_row(void *arg, const fl_ml_ps_epoch *e) {
  curve *c = arg;
  if (c->n < 64) c->rows[c->n++] = *e;
  return FL_OK;
}

static fl_ml_train_options ps_options(fl_ml_sync sync, uint32_t staleness, uint32_t epochs, curve *c) {
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_PS, .l2 = 1e-3};
  o.ps.sync = sync;
  o.ps.staleness = staleness;
  o.ps.epochs = epochs;
  o.ps.batch = 50;
  o.ps.lr = 0.2;
  o.ps.on_epoch = keep_row;
  o.ps.on_epoch_arg = c;
  return o;
}

static double objective(const fl_ml_model *m, const fl_ml_data *data, double l2) {
  size_t n = (size_t)m->outputs * (m->cols + 1);
  double *g = malloc(n * sizeof *g), loss;
  assert_ok(fl_ml_loss_gradient(m, data, l2, &loss, g));
  free(g);
  return loss;
}

/* BSP's model reaches nearly L-BFGS's optimum of the same objective: within 0.02 of its
 * mean log-loss (about 3% here), with one curve row per epoch whose loss falls. */
static void test_bsp_matches_lbfgs(void **state) {
  (void)state;
  fixture fx;
  open_clicks(&fx, "local[4]", 4000, 4);
  fl_ml_train_options lb = {.solver = FL_ML_SOLVER_LBFGS, .l2 = 1e-3, .max_iterations = 200};
  fl_ml_model *ref, *m;
  assert_ok(fl_ml_logreg(fx.data, &lb, &ref));
  double ref_loss = objective(ref, fx.data, 1e-3);
  curve c = {0};
  fl_ml_train_options o = ps_options(FL_ML_SYNC_BSP, 0, 20, &c);
  assert_ok(fl_ml_logreg(fx.data, &o, &m));
  double loss = objective(m, fx.data, 1e-3);
  printf("lbfgs %.5f  ps bsp %.5f  (%u curve rows)\n", ref_loss, loss, c.n);
  assert_true(loss <= ref_loss + 0.02);
  assert_true(loss >= ref_loss - 1e-6); /* L-BFGS's optimum is the floor */
  assert_int_equal(m->kind, FL_ML_LOGISTIC_BINARY);
  assert_int_equal(m->cols, 500);
  /* One row per epoch, 1..20, in order; the data's 4000 rows are all evaluation rows, so the
   * last row's loss is the final model's objective (to float rounding). */
  assert_true(c.n >= 2 && c.n <= 20);
  assert_int_equal(c.rows[c.n - 1].epoch, 20);
  for (uint32_t i = 1; i < c.n; i++) {
    assert_true(c.rows[i].epoch > c.rows[i - 1].epoch);
    assert_true(c.rows[i].seconds >= c.rows[i - 1].seconds);
    assert_true(c.rows[i].bytes_sent >= c.rows[i - 1].bytes_sent);
  }
  assert_true(c.rows[c.n - 1].loss < c.rows[0].loss);
  assert_true(fabs(c.rows[c.n - 1].loss - loss) < 1e-3);
  assert_true(c.rows[c.n - 1].bytes_sent > 0 && c.rows[c.n - 1].bytes_received > 0);
  assert_int_equal(m->num_history, c.n);
  fl_ml_metrics mt;
  assert_ok(fl_ml_evaluate(m, fx.data, &mt));
  fl_ml_metrics rt;
  assert_ok(fl_ml_evaluate(ref, fx.data, &rt));
  assert_true(mt.accuracy >= rt.accuracy - 0.02);
  fl_ml_model_free(m);
  fl_ml_model_free(ref);
  close_fixture(&fx);
}

/* ASP and SSP 3 converge too (every worker's steps are done; the loss is within 0.05 of
 * BSP's bound above), with n_fetch and n_push above 1 and the other update rules. */
static void test_asp_and_ssp_converge(void **state) {
  (void)state;
  fixture fx;
  open_clicks(&fx, "local[4]", 4000, 4);
  fl_ml_train_options lb = {.solver = FL_ML_SOLVER_LBFGS, .l2 = 1e-3, .max_iterations = 200};
  fl_ml_model *ref;
  assert_ok(fl_ml_logreg(fx.data, &lb, &ref));
  double ref_loss = objective(ref, fx.data, 1e-3);
  fl_ml_model_free(ref);
  struct {
    fl_ml_sync sync;
    uint32_t staleness, fetch, push;
    fl_ml_ps_update update;
    double lr;
  } cases[] = {{FL_ML_SYNC_ASP, 0, 1, 1, FL_ML_PS_ADAGRAD, 0.2},
               {FL_ML_SYNC_SSP, 3, 1, 1, FL_ML_PS_ADAGRAD, 0.2},
               {FL_ML_SYNC_SSP, 3, 2, 3, FL_ML_PS_ADAGRAD, 0.2},
               {FL_ML_SYNC_ASP, 0, 1, 1, FL_ML_PS_SGD, 2.0},
               {FL_ML_SYNC_BSP, 0, 1, 1, FL_ML_PS_ADAM, 0.02}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    curve c = {0};
    fl_ml_train_options o = ps_options(cases[i].sync, cases[i].staleness, 20, &c);
    o.ps.fetch_every = cases[i].fetch;
    o.ps.push_every = cases[i].push;
    o.ps.update = cases[i].update;
    o.ps.lr = cases[i].lr;
    fl_ml_model *m;
    assert_ok(fl_ml_logreg(fx.data, &o, &m));
    double loss = objective(m, fx.data, 1e-3);
    printf("case %zu: loss %.5f (lbfgs %.5f), first row %.5f, %u rows, %llu steps\n", i, loss, ref_loss,
           c.rows[0].loss, c.n, (unsigned long long)c.rows[c.n - 1].steps);
    assert_true(loss <= ref_loss + 0.05);
    assert_true(c.n >= 1 && c.rows[c.n - 1].epoch == 20);
    /* 4000 rows, 4 workers, batch 50: 20 steps an epoch each */
    assert_int_equal(c.rows[c.n - 1].steps, 4ull * 20 * 20);
    fl_ml_model_free(m);
  }
  close_fixture(&fx);
}

/* Text tokens hashed into 2^20 columns: the OSDI'14 workload's shape. The model has 2^20
 * coefficients (pulled from the servers: keys never pushed are 0) and separates the data. */
static void test_hashed_text_2_20(void **state) {
  (void)state;
  char dir[256], path[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/clicks.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  uint64_t s = 99;
  for (int i = 0; i < 3000; i++) {
    uint32_t ad = (uint32_t)(rng_unit(&s) * 40), site = (uint32_t)(rng_unit(&s) * 25), hour = (uint32_t)(rng_unit(&s) * 24);
    double m = (ad % 3 == 0 ? 1.5 : -1.0) + (site % 2 ? 0.8 : -0.8);
    int y = rng_unit(&s) < 1 / (1 + exp(-2 * m));
    fprintf(f, "%d ad=%u site=%u hour=%u\n", y, ad, site, hour);
  }
  assert_int_equal(fclose(f), 0);
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_load_options lo = {.partitions = 2, .hash_bits = 20};
  fl_ml_data *data;
  assert_ok(fl_ml_load(ctx, path, FL_ML_TEXT, &lo, &data));
  assert_int_equal(data->cols, 1u << 20);
  curve c = {0};
  fl_ml_train_options o = ps_options(FL_ML_SYNC_SSP, 2, 5, &c);
  fl_ml_model *m;
  assert_ok(fl_ml_logreg(data, &o, &m));
  assert_int_equal(m->cols, 1u << 20);
  size_t nonzero = 0;
  for (uint32_t j = 0; j < m->cols; j++) nonzero += m->coef[j] != 0;
  assert_true(nonzero > 0 && nonzero <= 89); /* 40 ads, 25 sites, 24 hours at most */
  fl_ml_metrics mt;
  assert_ok(fl_ml_evaluate(m, data, &mt));
  printf("hashed: accuracy %.4f, %zu non-zero weights\n", mt.accuracy, nonzero);
  assert_true(mt.accuracy > 0.75);
  fl_ml_model_free(m);
  fl_ml_data_free(data);
  fl_context_close(ctx);
  test_rmtree(dir);
}

/* Worker 1's task fails at step 7; it is retried, opens its worker again at the clock the
 * servers have for it, and the fit completes with every step done once. */
static void test_failed_worker_is_retried(void **state) {
  (void)state;
  fixture fx;
  open_clicks(&fx, "local[4]", 2000, 4);
  fl_context_stats before, after;
  assert_ok(fl_context_stats_get(fx.ctx, &before));
  for (int sync = 0; sync < 2; sync++) {
    curve c = {0};
    fl_ml_train_options o = ps_options(sync ? FL_ML_SYNC_ASP : FL_ML_SYNC_BSP, 0, 5, &c);
    o.ps.fail_worker = 2; /* worker 1 */
    o.ps.fail_step = 7;
    fl_ml_model *m;
    assert_ok(fl_ml_logreg(fx.data, &o, &m));
    assert_int_equal(c.rows[c.n - 1].steps, 4ull * 10 * 5);
    fl_ml_metrics mt;
    assert_ok(fl_ml_evaluate(m, fx.data, &mt));
    assert_true(mt.accuracy > 0.6);
    fl_ml_model_free(m);
  }
  assert_ok(fl_context_stats_get(fx.ctx, &after));
  assert_true(after.tasks_failed >= before.tasks_failed + 2);
  close_fixture(&fx);
}

/* More partitions than task slots: the data is coalesced, one worker a slot. */
static void test_more_partitions_than_slots(void **state) {
  (void)state;
  fixture fx;
  open_clicks(&fx, "local[2]", 1000, 7);
  curve c = {0};
  fl_ml_train_options o = ps_options(FL_ML_SYNC_BSP, 0, 3, &c);
  fl_ml_model *m;
  assert_ok(fl_ml_logreg(fx.data, &o, &m));
  /* 2 workers, 1000 rows, batch 50: 10 steps an epoch each */
  assert_int_equal(c.rows[c.n - 1].steps, 2ull * 10 * 3);
  fl_ml_model_free(m);
  close_fixture(&fx);
}

static fl_status stop_at_two(void *arg, const fl_ml_ps_epoch *e) {
  (void)arg;
  return e->epoch >= 2 ? fl_set_error(FL_ECANCELLED, "stopped by the test at epoch %u", e->epoch) : FL_OK;
}

static void test_bad_options(void **state) {
  (void)state;
  fl_ml_sync sync;
  uint32_t st;
  assert_fails_with(fl_ml_sync_parse("x", &sync, &st), FL_EINVAL, "unknown sync 'x'");
  assert_fails_with(fl_ml_sync_parse("ssp:-2", &sync, &st), FL_EINVAL, "ssp:-2");
  assert_fails_with(fl_ml_sync_parse("ssp:", &sync, &st), FL_EINVAL, "whole number");
  assert_fails_with(fl_ml_sync_parse("ssp:99999999999", &sync, &st), FL_EINVAL, "whole number");
  assert_ok(fl_ml_sync_parse("ssp:3", &sync, &st));
  assert_true(sync == FL_ML_SYNC_SSP && st == 3);
  assert_ok(fl_ml_sync_parse("bsp", &sync, &st));
  assert_true(sync == FL_ML_SYNC_BSP && st == 0);
  assert_ok(fl_ml_sync_parse("asp", &sync, &st));
  assert_true(sync == FL_ML_SYNC_ASP);
  fl_ml_ps_update u;
  assert_fails_with(fl_ml_ps_update_parse("rmsprop", &u), FL_EINVAL, "adagrad, sgd or adam");
  assert_ok(fl_ml_ps_update_parse("adam", &u));
  assert_true(u == FL_ML_PS_ADAM);
  fl_ml_solver sv;
  assert_ok(fl_ml_solver_parse("ps", &sv));
  assert_true(sv == FL_ML_SOLVER_PS);

  fixture fx;
  open_clicks(&fx, "local[2]", 600, 2);
  fl_ml_model *m = NULL;
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_PS, .l1 = 0.1};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_EINVAL, "l1 is for the batch solvers");
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .max_iterations = 5};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_EINVAL, "max_iterations");
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .ps.lr = -1};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_EINVAL, "lr");
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .ps.sync = (fl_ml_sync)7};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_EINVAL, "unknown sync");
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS};
  assert_fails_with(fl_ml_linreg(fx.data, &o, &m), FL_EINVAL, "logistic regression only");
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .classes = 3};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_EINVAL, "binary");
  /* A callback's error stops the workers and comes back as is; the context goes on. */
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .ps.epochs = 50, .ps.batch = 10, .ps.on_epoch = stop_at_two};
  assert_fails_with(fl_ml_logreg(fx.data, &o, &m), FL_ECANCELLED, "stopped by the test");
  assert_null(m);
  o = (fl_ml_train_options){.solver = FL_ML_SOLVER_PS, .ps.epochs = 2};
  assert_ok(fl_ml_logreg(fx.data, &o, &m));
  fl_ml_model_free(m);
  close_fixture(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_bsp_matches_lbfgs, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_asp_and_ssp_converge, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_hashed_text_2_20, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_failed_worker_is_retried, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_more_partitions_than_slots, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bad_options, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
