/*
 * test_ml_cli: `flint ml`, run as a child process the way a user runs it: training on tiny
 * CSV and LIBSVM files written here, the model file, `flint ml predict` and `evaluate` with
 * it, every usage error (exit 2, one line on stderr naming the cause, and the hint), a
 * missing data file and a bad model file (exit 1).
 *
 * The binary is $FLINT_BIN/flint (ctest sets FLINT_BIN to <build>/bin). Each run captures
 * stdout and stderr apart and is bounded: the child has alarm(CHILD_ALARM_S) (kept across
 * exec), and the parent kills it if its pipes stay open past PARENT_LIMIT_S.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "test_util.h"
#include "run_child.h"

#define CHILD_ALARM_S 90
#define PARENT_LIMIT_S 120

static char flint_path[PATH_MAX];
static char tmp_dir[PATH_MAX];



/* Runs `flint ARGS...` (NULL-terminated, without "flint"); the caller frees the result. */
static run_result *run_flint(const char *const *args) {
  return run_child(flint_path, NULL, args, CHILD_ALARM_S, PARENT_LIMIT_S);
}
#define RUN_FLINT(...) run_flint((const char *const[]){__VA_ARGS__, NULL})


static void expect_status(const run_result *r, int status) {
  if (r->status != status) {
    fprintf(stderr, "expected exit status %d\n", status);
    run_dump(r);
  }
  assert_int_equal(r->status, status);
}

static void expect_contains(const run_result *r, const char *text, const char *which, const char *needle) {
  if (!strstr(text, needle)) {
    fprintf(stderr, "%s lacks '%s'\n", which, needle);
    run_dump(r);
  }
  assert_non_null(strstr(text, needle));
}
#define EXPECT_OUT(r, needle) expect_contains((r), (r)->out, "stdout", (needle))
#define EXPECT_ERR(r, needle) expect_contains((r), (r)->err, "stderr", (needle))

/* The number after `key` on stdout (NAN when missing). */
static double number_after(const run_result *r, const char *key) {
  const char *p = strstr(r->out, key);
  return p ? strtod(p + strlen(key), NULL) : NAN;
}

static const char *tmp_file(const char *name) {
  static char bufs[4][PATH_MAX + 64];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", tmp_dir, name);
  return b;
}

/* y = 1 + 2 x1 - 3 x2 + 0.5 x3 + a little deterministic noise; the label first. */
static const char *write_csv(void) {
  const char *path = tmp_file("tiny.csv");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 200; i++) {
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1, x3 = (i % 7) / 3.0 - 1;
    double noise = 0.01 * ((i * 7919) % 13 - 6) / 6.0;
    fprintf(f, "%.6f,%.6f,%.6f,%.6f\n", 1 + 2 * x1 - 3 * x2 + 0.5 * x3 + noise, x1, x2, x3);
  }
  assert_int_equal(fclose(f), 0);
  return path;
}

/* Two overlapping classes in 4 sparse features (1-based indices). */
static const char *write_libsvm(void) {
  const char *path = tmp_file("tiny.svm");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 300; i++) {
    int y = i % 2;
    double a = (i % 23) / 11.0 - 1 + (y ? 0.6 : -0.6), b = (i % 19) / 9.0 - 1;
    fprintf(f, "%d 1:%.6f %d:%.6f%s\n", y, a, i % 3 == 0 ? 2 : 3, b, i % 5 == 0 ? " 4:1" : "");
  }
  assert_int_equal(fclose(f), 0);
  return path;
}

/* ---- training --------------------------------------------------------------------------- */

static void test_help(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("ml", "--help");
  expect_status(r, 0);
  EXPECT_OUT(r, "usage: flint ml linreg|logreg");
  EXPECT_OUT(r, "--standardize");
  EXPECT_OUT(r, "FLINT_MEMORY"); /* how memory is used */
  free(r);
  r = RUN_FLINT("--help");
  expect_status(r, 0);
  EXPECT_OUT(r, "ml linreg|logreg");
  free(r);
}

static void test_linreg_csv_normal(void **state) {
  (void)state;
  const char *csv = write_csv();
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[2]", "--data", csv, "--format", "csv", "--solver",
                            "normal", "--test", csv, "--partitions", "3");
  expect_status(r, 0);
  EXPECT_OUT(r, "iter   1  loss ");
  EXPECT_OUT(r, "rows         200\n");
  EXPECT_OUT(r, "features     3\n");
  EXPECT_OUT(r, "classes      ");
  EXPECT_OUT(r, "solver       normal equations");
  EXPECT_OUT(r, "iterations   1\n");
  EXPECT_OUT(r, "converged    yes\n");
  EXPECT_OUT(r, "train time   ");
  EXPECT_OUT(r, "RMSE ");
  double r2 = number_after(r, "R^2 ");
  if (!(r2 > 0.999)) run_dump(r);
  assert_true(r2 > 0.999);
  EXPECT_OUT(r, "\ntest ");
  free(r);
}

/* Training data larger than the memory for cached blocks: its blocks go to local disk, not
 * re-parsed each pass, and stderr says so once per data set (not once per block), naming
 * the data and how much did not fit. */
static void test_memory_warning(void **state) {
  (void)state;
  const char *path = tmp_file("big.csv");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 6000; i++) {
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1, x3 = (i % 7) / 3.0 - 1;
    fprintf(f, "%.6f,%.6f,%.6f,%.6f\n", 1 + 2 * x1 - 3 * x2 + 0.5 * x3, x1, x2, x3);
  }
  assert_int_equal(fclose(f), 0);
  assert_int_equal(setenv("FLINT_MEMORY", "32k", 1), 0);
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[2]", "--data", path, "--format", "csv", "--solver",
                            "lbfgs", "--iterations", "5", "--partitions", "8");
  unsetenv("FLINT_MEMORY");
  expect_status(r, 0);
  EXPECT_ERR(r, "not enough space to cache rdd_");
  EXPECT_ERR(r, "in memory (32.0 KiB limit");
  const char *first = strstr(r->err, "not enough space");
  if (first && strstr(first + 1, "not enough space")) run_dump(r);
  assert_null(first ? strstr(first + 1, "not enough space") : NULL); /* once, not per block */
  EXPECT_ERR(r, "big.csv does not fit in the memory for cached blocks: ");
  EXPECT_ERR(r, "on local disk");
  EXPECT_OUT(r, "rows         6000\n");
  free(r);
}

static void test_linreg_lbfgs_standardized(void **state) {
  (void)state;
  const char *csv = write_csv();
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[2]", "--data", csv, "--format", "csv", "--solver",
                            "lbfgs", "--standardize", "--iterations", "50", "--tol", "1e-9", "--lambda", "0");
  expect_status(r, 0);
  EXPECT_OUT(r, "standardized 3 features");
  EXPECT_OUT(r, "iter   2  loss ");
  EXPECT_OUT(r, "solver       lbfgs\n");
  double r2 = number_after(r, "R^2 ");
  if (!(r2 > 0.999)) run_dump(r);
  assert_true(r2 > 0.999);
  free(r);
}

/* The Sandblaster solver from the command line: the same model as lbfgs's. */
static void test_logreg_sandblaster(void **state) {
  (void)state;
  const char *svm = write_libsvm();
  double acc[2];
  const char *solvers[] = {"lbfgs", "sandblaster"};
  for (int i = 0; i < 2; i++) {
    run_result *r = RUN_FLINT("ml", "logreg", "--master", "local[2]", "--data", svm, "--format", "libsvm", "--lambda",
                              "0.01", "--iterations", "50", "--solver", solvers[i]);
    expect_status(r, 0);
    EXPECT_OUT(r, "iter   1  loss ");
    if (i == 1) EXPECT_OUT(r, "solver       sandblaster (L-BFGS on parameter-server shards)\n");
    acc[i] = number_after(r, "accuracy ");
    free(r);
  }
  assert_true(acc[0] > 0.5);
  assert_true(fabs(acc[0] - acc[1]) < 1e-9);
}

static void test_logreg_libsvm_out(void **state) {
  (void)state;
  const char *svm = write_libsvm(), *model = tmp_file("model.txt");
  run_result *r = RUN_FLINT("ml", "logreg", "--master", "local[2]", "--data", svm, "--format", "libsvm", "--lambda",
                            "0.01", "--iterations", "30", "--out", model);
  expect_status(r, 0);
  EXPECT_OUT(r, "iter   1  loss ");
  EXPECT_OUT(r, "|grad| ");
  EXPECT_OUT(r, "rows         300\n");
  EXPECT_OUT(r, "features     4\n");
  EXPECT_OUT(r, "classes      2 (binary)\n");
  EXPECT_OUT(r, "solver       lbfgs\n");
  EXPECT_OUT(r, "converged    ");
  EXPECT_OUT(r, "accuracy ");
  EXPECT_OUT(r, "log-loss ");
  EXPECT_OUT(r, "AUC ");
  EXPECT_OUT(r, "written to ");
  EXPECT_OUT(r, model);
  double acc = number_after(r, "accuracy ");
  if (!(acc > 0.6 && acc <= 1)) run_dump(r);
  assert_true(acc > 0.6 && acc <= 1);
  free(r);
  FILE *f = fopen(model, "r");
  assert_non_null(f);
  char line[64] = {0};
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  assert_string_equal(line, "flint-model 1\n");
}

/* ---- failures --------------------------------------------------------------------------- */

/* Each row: the arguments after "flint ml" (NULL-terminated) and what stderr must name. */
typedef struct bad_case {
  const char *args[12];
  const char *needle;
} bad_case;

/* Labels {1, 2, 5}: the loaded line reports them; inferring 6 classes with 0, 3 and 4 empty
 * is an error naming them, and --classes 6 says it is meant. */
static void test_logreg_empty_classes(void **state) {
  (void)state;
  const char *path = tmp_file("l125.csv");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 30; i++) fprintf(f, "%d,%d,%d\n", i % 3 == 2 ? 5 : i % 3 + 1, i % 7, i % 5);
  assert_int_equal(fclose(f), 0);
  run_result *r = RUN_FLINT("ml", "logreg", "--master", "local[1]", "--data", path, "--format", "csv");
  expect_status(r, 1);
  EXPECT_OUT(r, "l125.csv: 3 label values: 1..2, 5\n");
  EXPECT_ERR(r, "labels 0..5 span 6 classes but 3 of them have no rows (labels 0, 3..4)");
  free(r);
  r = RUN_FLINT("ml", "logreg", "--master", "local[1]", "--data", path, "--format", "csv", "--classes", "6",
                "--iterations", "3");
  expect_status(r, 0);
  EXPECT_OUT(r, "classes      6 (multinomial)\n");
  free(r);
  r = RUN_FLINT("ml", "linreg", "--data", path, "--format", "csv", "--classes", "6");
  expect_status(r, 2);
  EXPECT_ERR(r, "--classes is for logreg only");
  free(r);
}

static void test_usage_errors(void **state) {
  (void)state;
  static const bad_case cases[] = {
      {{NULL}, "no model given"},
      {{"svm", NULL}, "unknown model 'svm'"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--bogus", NULL}, "unknown option '--bogus'"},
      {{"linreg", "--format", "csv", "--data", NULL}, "--data needs a value"},
      {{"linreg", "--data", "d.csv", "--format", NULL}, "--format needs a value"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--lambda", NULL}, "--lambda needs a value"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--lambda", "abc", NULL}, "--lambda 'abc' is not a number"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--lambda", "1e-3x", NULL}, "--lambda '1e-3x' is not a number"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--lambda", "", NULL}, "--lambda '' is not a number"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--lambda", "-1", NULL}, "--lambda '-1' must be >= 0"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--l1", "-0.5", NULL}, "--l1 '-0.5' must be >= 0"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--l1", "inf", NULL}, "--l1 'inf' is not a number"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--tol", "nan", NULL}, "--tol 'nan' is not a number"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--tol", "-1e-6", NULL}, "--tol '-1e-6' must be > 0"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--tol", "0", NULL}, "--tol '0' must be > 0"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--iterations", "12x", NULL}, "--iterations '12x' is not"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--iterations", "-3", NULL}, "--iterations '-3' is not"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--iterations", "0", NULL}, "--iterations '0' is not"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--iterations", "99999999999", NULL}, "--iterations '99999999999'"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--partitions", "0", NULL}, "--partitions '0' is not"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--partitions", " 4", NULL}, "--partitions ' 4' is not"},
      {{"linreg", "--data", "d.csv", "--format", "xml", NULL}, "unknown format 'xml'"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--solver", "newton", NULL}, "unknown solver 'newton'"},
      {{"linreg", "--format", "csv", NULL}, "--data PATH is required"},
      {{"logreg", "--data", "d.csv", NULL}, "--format is required"},
      {{"logreg", "--data", "img.gz", "--format", "idx", NULL}, "--format idx needs --labels"},
      {{"logreg", "--data", "i.gz", "--format", "idx", "--labels", "l.gz", "--test", "t.gz", NULL}, "--test-labels"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--labels", "l.gz", NULL}, "for --format idx only"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "normal", NULL}, "for linreg only"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--solver", "normal", "--l1", "0.1", NULL}, "--l1 has no normal"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "sandblaster", "--l1", "0.1", NULL},
       "--solver sandblaster takes no --l1"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "sandblast", NULL}, "gd, sandblaster or ps)"},
      {{"predict", "--data", "d.csv", "--format", "csv", NULL}, "predict needs --model MODEL"},
      {{"evaluate", "--data", "d.csv", "--format", "csv", NULL}, "evaluate needs --model MODEL"},
      {{"predict", "--model", "m.txt", "--format", "csv", NULL}, "--data PATH is required"},
      {{"predict", "--model", "m.txt", "--data", "d.csv", NULL}, "--format is required"},
      {{"predict", "--model", "m.txt", "--data", "d.csv", "--format", "csv", "--lambda", "1", NULL},
       "--lambda is for training (linreg, logreg), not predict"},
      {{"evaluate", "--model=m.txt", "--data=d.csv", "--format=csv", "--standardize", NULL},
       "--standardize is for training (linreg, logreg), not evaluate"},
      {{"evaluate", "--model", "m.txt", "--data", "d.csv", "--format", "csv", "--out", "p.txt", NULL},
       "--out is for predict and training"},
      {{"linreg", "--model", "m.txt", "--data", "d.csv", "--format", "csv", NULL}, "--model is for predict and evaluate"},
      {{"predict", "evaluate", "--model", "m.txt", "--data", "d.csv", "--format", "csv", NULL},
       "unexpected argument 'evaluate'"},
      {{"logreg", "--data", "d.txt", "--format", "text", NULL}, "--format text needs --hash-bits B"},
      {{"logreg", "--data", "d.txt", "--format", "text", "--hash-bits", "0", NULL}, "--hash-bits '0' is not"},
      {{"logreg", "--data", "d.txt", "--format", "text", "--hash-bits", "32", NULL}, "--hash-bits '32' is not"},
      {{"logreg", "--data", "d.csv", "--format", "csv", "--hash-bits", "8", NULL}, "--hash-bits is for --format libsvm"},
      /* the ps solver's options */
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--sync", "x", NULL}, "unknown sync 'x'"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--sync", "ssp:-2", NULL},
       "sync 'ssp:-2': the staleness after ssp: must be a whole number"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--sync", "ssp:", NULL}, "sync 'ssp:'"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--l1", "0.1", NULL},
       "--l1 is for the batch solvers (lbfgs, gd), not --solver ps"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--iterations", "5", NULL},
       "--iterations is for the batch solvers"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--batch", "0", NULL}, "--batch '0' is not"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--epochs", "0", NULL}, "--epochs '0' is not"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--ps-fetch", "x", NULL}, "--ps-fetch 'x'"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--ps-push", "-1", NULL}, "--ps-push '-1'"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--lr", "0", NULL}, "--lr '0' is not a number > 0"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--update", "rmsprop", NULL},
       "unknown update 'rmsprop'"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "ps", "--classes", "3", NULL}, "two classes"},
      {{"linreg", "--data", "d.csv", "--format", "csv", "--solver", "ps", NULL}, "--solver ps is for logreg only"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--sync", "asp", NULL}, "--sync is for --solver ps"},
      {{"logreg", "--data", "d.svm", "--format", "libsvm", "--solver", "lbfgs", "--curves", "c.csv", NULL},
       "--curves is for --solver ps"},
      {{"evaluate", "--model", "m.txt", "--data", "d.csv", "--format", "csv", "--epochs", "3", NULL},
       "--epochs is for training (linreg, logreg), not evaluate"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *argv[16] = {"ml"};
    int n = 1;
    for (int k = 0; cases[i].args[k]; k++) argv[n++] = cases[i].args[k];
    argv[n] = NULL;
    run_result *r = run_flint(argv);
    expect_status(r, 2);
    EXPECT_ERR(r, "flint ml: ");
    EXPECT_ERR(r, cases[i].needle);
    EXPECT_ERR(r, "Run 'flint ml --help' for usage.");
    /* one line of error and the hint: nothing more, nothing on stdout */
    const char *nl = strchr(r->err, '\n');
    assert_non_null(nl);
    assert_string_equal(nl + 1, "Run 'flint ml --help' for usage.\n");
    assert_int_equal(r->out_len, 0);
    free(r);
  }
}

static void test_missing_data_file(void **state) {
  (void)state;
  const char *missing = tmp_file("no-such-file.csv");
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[1]", "--data", missing, "--format", "csv");
  expect_status(r, 1);
  EXPECT_ERR(r, "flint ml: ");
  EXPECT_ERR(r, "no-such-file.csv");
  free(r);
}

static void test_bad_master(void **state) {
  (void)state;
  const char *csv = write_csv();
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[zz]", "--data", csv, "--format", "csv");
  expect_status(r, 1);
  EXPECT_ERR(r, "flint ml: ");
  EXPECT_ERR(r, "unknown master 'local[zz]'");
  free(r);
}

/* ---- predict and evaluate ------------------------------------------------------------- */

/* The lines of `text` as numbers; returns how many (at most max). */
static size_t read_numbers(const char *text, double *out, size_t max) {
  size_t n = 0;
  for (const char *p = text; *p && n < max;) {
    char *end;
    out[n++] = strtod(p, &end);
    assert_true(end > p && *end == '\n');
    p = end + 1;
  }
  return n;
}

static char *slurp_file(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[RUN_CHILD_OUT_CAP];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* A linreg model, saved, predicts every row in the data's order (each close to its own
 * label), to stdout or to a file, and evaluate prints what training printed. */
static void test_predict_evaluate_linreg(void **state) {
  (void)state;
  const char *csv = write_csv(), *model = tmp_file("linreg.txt"), *preds = tmp_file("preds.txt");
  run_result *r = RUN_FLINT("ml", "linreg", "--master", "local[2]", "--data", csv, "--format", "csv", "--out", model);
  expect_status(r, 0);
  double train_rmse = number_after(r, "train        RMSE ");
  free(r);

  r = RUN_FLINT("ml", "predict", "--master", "local[2]", "--model", model, "--data", csv, "--format", "csv",
                "--partitions", "3");
  expect_status(r, 0);
  assert_int_equal(r->err_len, 0);
  static double got[400];
  size_t n = read_numbers(r->out, got, 400);
  assert_int_equal(n, 200);
  for (int i = 0; i < 200; i++) { /* the rows of write_csv, in order */
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1, x3 = (i % 7) / 3.0 - 1;
    double y = 1 + 2 * x1 - 3 * x2 + 0.5 * x3;
    if (fabs(got[i] - y) > 0.02) fail_msg("row %d: predicted %g, expected about %g", i, got[i], y);
  }
  char stdout_copy[RUN_CHILD_OUT_CAP];
  snprintf(stdout_copy, sizeof stdout_copy, "%s", r->out);
  free(r);

  r = RUN_FLINT("ml", "predict", "--model", model, "--data", csv, "--format", "csv", "--out", preds);
  expect_status(r, 0);
  assert_int_equal(r->out_len, 0);
  assert_string_equal(slurp_file(preds), stdout_copy);
  free(r);

  r = RUN_FLINT("ml", "evaluate", "--model", model, "--data", csv, "--format", "csv");
  expect_status(r, 0);
  EXPECT_OUT(r, "data         RMSE ");
  EXPECT_OUT(r, "(200 rows)");
  assert_true(fabs(number_after(r, "data         RMSE ") - train_rmse) <= 1e-6 * (1 + train_rmse));
  assert_true(number_after(r, "R^2 ") > 0.999);
  free(r);
}

/* A logreg model: classes 0 and 1, whose agreement with the labels is evaluate's accuracy. */
static void test_predict_evaluate_logreg(void **state) {
  (void)state;
  const char *svm = write_libsvm(), *model = tmp_file("logreg.txt");
  run_result *r = RUN_FLINT("ml", "logreg", "--data", svm, "--format", "libsvm", "--out", model);
  expect_status(r, 0);
  double train_accuracy = number_after(r, "train        accuracy ");
  free(r);

  r = RUN_FLINT("ml", "evaluate", "--model", model, "--data", svm, "--format", "libsvm");
  expect_status(r, 0);
  double accuracy = number_after(r, "data         accuracy ");
  assert_true(fabs(accuracy - train_accuracy) < 1e-9);
  EXPECT_OUT(r, "log-loss ");
  EXPECT_OUT(r, "AUC ");
  EXPECT_OUT(r, "(300 rows)");
  free(r);

  r = RUN_FLINT("ml", "predict", "--model", model, "--data", svm, "--format", "libsvm");
  expect_status(r, 0);
  static double got[400];
  assert_int_equal(read_numbers(r->out, got, 400), 300);
  int right = 0;
  for (int i = 0; i < 300; i++) {
    assert_true(got[i] == 0 || got[i] == 1);
    right += got[i] == i % 2; /* write_libsvm's label */
  }
  assert_true(fabs(right / 300.0 - accuracy) < 1e-4);
  free(r);
}

/* Hashed text: train, then evaluate with the same --hash-bits; another --hash-bits is refused
 * naming both widths. */
static void test_logreg_hashed_text(void **state) {
  (void)state;
  const char *path = tmp_file("reviews.txt"), *model = tmp_file("text-model.txt");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  static const char *noise[] = {"movie", "plot", "actor", "scene", "ending"};
  for (int i = 0; i < 200; i++)
    fprintf(f, "%d %s %s %s\n", i % 2, noise[i % 5], i % 2 ? "great" : "dull", noise[(i / 3) % 5]);
  assert_int_equal(fclose(f), 0);
  run_result *r = RUN_FLINT("ml", "logreg", "--master", "local[2]", "--data", path, "--format", "text", "--hash-bits",
                            "18", "--out", model);
  expect_status(r, 0);
  EXPECT_OUT(r, "262144 features, sparse");
  assert_true(number_after(r, "train        accuracy ") == 1.0);
  free(r);
  r = RUN_FLINT("ml", "evaluate", "--model", model, "--data", path, "--format", "text", "--hash-bits", "18");
  expect_status(r, 0);
  assert_true(number_after(r, "data         accuracy ") == 1.0);
  free(r);
  r = RUN_FLINT("ml", "evaluate", "--model", model, "--data", path, "--format", "text", "--hash-bits", "12");
  expect_status(r, 1);
  EXPECT_ERR(r, "--hash-bits 12 makes 4096 columns, but the model");
  EXPECT_ERR(r, "has 262144 features");
  free(r);
}

/* --solver ps on hashed text tokens at 2^20 columns, in a local cluster (the worker tasks run
 * in executors, the tables on their servers): one line and one --curves row per epoch, and a
 * model that separates the classes. */
static void test_logreg_ps_cluster_curves(void **state) {
  (void)state;
  const char *path = tmp_file("clicks.txt"), *curves = tmp_file("curves.csv");
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 2000; i++) {
    int ad = (i * 7919) % 37, site = (i * 104729) % 23, y = (ad % 3 == 0) ^ (i % 11 == 0);
    fprintf(f, "%d ad=%d site=%d hour=%d\n", y, ad, site, i % 24);
  }
  assert_int_equal(fclose(f), 0);
  run_result *r = RUN_FLINT("ml", "logreg", "--master", "local-cluster[2,2,512]", "--data", path, "--format", "text",
                            "--hash-bits", "20", "--partitions", "4", "--solver", "ps", "--sync", "ssp:1", "--epochs",
                            "4", "--batch", "25", "--lr", "0.3", "--curves", curves);
  expect_status(r, 0);
  EXPECT_OUT(r, "1048576 features, sparse");
  EXPECT_OUT(r, "solver       ps");
  EXPECT_OUT(r, "epoch   4  loss ");
  EXPECT_OUT(r, "epochs       4\n");
  assert_true(number_after(r, "train        accuracy ") >= 0.85);
  free(r);
  const char *csv = slurp_file(curves); /* a static buffer */
  static const char header[] = "epoch,seconds,loss,accuracy,steps,bytes_sent,bytes_received\n";
  assert_true(strncmp(csv, header, sizeof header - 1) == 0);
  int lines = 0;
  for (const char *p = csv; *p; p++) lines += *p == '\n';
  assert_true(lines >= 2 && lines <= 5); /* the header and up to one row an epoch, the 4th last */
  assert_non_null(strstr(csv, "\n4,"));
}

/* A missing or bad model file, data that does not fit the model, an output that cannot be
 * written: exit 1, one error naming the cause, no predictions and no partial file. */
static void test_predict_failures(void **state) {
  (void)state;
  /* tmp_file's buffers rotate: each path the cases use gets its own copy. */
  char csv[PATH_MAX + 64], model[PATH_MAX + 64], bad[PATH_MAX + 64], narrow[PATH_MAX + 64], no_dir[PATH_MAX + 64],
      no_model[PATH_MAX + 64], no_data[PATH_MAX + 64];
  snprintf(csv, sizeof csv, "%s", write_csv());
  snprintf(model, sizeof model, "%s", tmp_file("m3.txt"));
  snprintf(bad, sizeof bad, "%s", tmp_file("bad-model.txt"));
  snprintf(narrow, sizeof narrow, "%s", tmp_file("narrow.csv"));
  snprintf(no_dir, sizeof no_dir, "%s", tmp_file("no-such-dir/preds.txt"));
  snprintf(no_model, sizeof no_model, "%s", tmp_file("no-such-model.txt"));
  snprintf(no_data, sizeof no_data, "%s", tmp_file("no-such-data.csv"));
  run_result *r = RUN_FLINT("ml", "linreg", "--data", csv, "--format", "csv", "--out", model);
  expect_status(r, 0);
  free(r);
  FILE *f = fopen(bad, "w");
  assert_non_null(f);
  fputs("this is not a model\n", f);
  assert_int_equal(fclose(f), 0);
  assert_non_null(f = fopen(narrow, "w"));
  fputs("1,2\n3,4\n", f);
  assert_int_equal(fclose(f), 0);

  struct {
    const char *verb, *model, *data, *out, *needle;
  } cases[] = {
      {"predict", no_model, csv, NULL, "cannot read "},
      {"evaluate", no_model, csv, NULL, "no-such-model.txt"},
      {"predict", bad, csv, NULL, "not a flint model file"},
      {"evaluate", bad, csv, NULL, "bad-model.txt"},
      {"predict", model, narrow, NULL, "has 1 features, the model "},
      {"evaluate", model, narrow, NULL, "the model"},
      {"predict", model, tmp_file("no-such-data.csv"), NULL, "no-such-data.csv"},
      {"predict", model, csv, no_dir, "cannot write "},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *argv[16] = {"ml", cases[i].verb, "--model", cases[i].model, "--data", cases[i].data, "--format", "csv"};
    int n = 8;
    if (cases[i].out) {
      argv[n++] = "--out";
      argv[n++] = cases[i].out;
    }
    argv[n] = NULL;
    r = run_flint(argv);
    expect_status(r, 1);
    EXPECT_ERR(r, "flint ml: ");
    EXPECT_ERR(r, cases[i].needle);
    assert_int_equal(r->out_len, 0);
    free(r);
  }
  assert_int_not_equal(access(no_dir, F_OK), 0);
}

static int setup(void **state) {
  (void)state;
  const char *dir = getenv("FLINT_BIN");
  snprintf(flint_path, sizeof flint_path, "%s/flint", dir && *dir ? dir : ".");
  if (access(flint_path, X_OK) != 0) {
    fprintf(stderr, "test_ml_cli: %s is not executable (set FLINT_BIN)\n", flint_path);
    return -1;
  }
  test_tmpdir(tmp_dir, sizeof tmp_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  test_rmtree(tmp_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_linreg_csv_normal),
      cmocka_unit_test(test_memory_warning),
      cmocka_unit_test(test_linreg_lbfgs_standardized),
      cmocka_unit_test(test_logreg_libsvm_out),
      cmocka_unit_test(test_logreg_sandblaster),
      cmocka_unit_test(test_logreg_empty_classes),
      cmocka_unit_test(test_usage_errors),
      cmocka_unit_test(test_missing_data_file),
      cmocka_unit_test(test_bad_master),
      cmocka_unit_test(test_predict_evaluate_linreg),
      cmocka_unit_test(test_predict_evaluate_logreg),
      cmocka_unit_test(test_predict_failures),
      cmocka_unit_test(test_logreg_hashed_text),
      cmocka_unit_test(test_logreg_ps_cluster_curves),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
