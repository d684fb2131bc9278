/*
 * test_cli: the flint command, run as a child process the way a user runs it.
 *
 * The binary and the job libraries (pi.so, iterative.so, job_*.so) are taken from
 * $FLINT_BIN (ctest sets it to <build>/bin), else from this test's own folder. Each run
 * captures stdout and stderr separately and is bounded: the child has alarm(60) (kept
 * across exec), and the parent kills it if its output pipes stay open past 90 seconds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "test_util.h"
#include "cli/cli.h"
#include "common/common.h"
#include "run_child.h"

#define CHILD_ALARM_S 60
#define PARENT_LIMIT_S 90

static char bin_dir[PATH_MAX];
static char flint_path[PATH_MAX + 16];


/* Path of a file in the binary folder, in a small rotating set of static buffers so that
 * a test can hold a few at once. */
static const char *bin_file(const char *name) {
  static char bufs[4][PATH_MAX + 64];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", bin_dir, name);
  return b;
}


/* Runs `flint ARGS...` (argv NULL-terminated, without "flint") in folder `cwd` (NULL: this
 * process's folder); the caller frees the result. */
static run_result *run_flint_in(const char *cwd, const char *const *args) {
  return run_child(flint_path, cwd, args, CHILD_ALARM_S, PARENT_LIMIT_S);
}

#define RUN_FLINT(...) run_flint_in(NULL, (const char *const[]){__VA_ARGS__, NULL})
#define RUN_FLINT_IN(cwd, ...) run_flint_in((cwd), (const char *const[]){__VA_ARGS__, NULL})


static void expect_status(const run_result *r, int status) {
  if (r->status != status) {
    fprintf(stderr, "expected exit status %d\n", status);
    run_dump(r);
  }
  assert_int_equal(r->status, status);
}

/* Asserts that `text` (stdout or stderr of r) contains `needle`. */
static void expect_contains(const run_result *r, const char *text, const char *which,
                            const char *needle) {
  if (!strstr(text, needle)) {
    fprintf(stderr, "%s lacks '%s'\n", which, needle);
    run_dump(r);
  }
  assert_non_null(strstr(text, needle));
}
#define EXPECT_OUT(r, needle) expect_contains((r), (r)->out, "stdout", (needle))
#define EXPECT_ERR(r, needle) expect_contains((r), (r)->err, "stderr", (needle))

/* ---- top-level command --------------------------------------------------------------- */

static void test_help(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("--help");
  expect_status(r, 0);
  EXPECT_OUT(r, "usage: flint");
  EXPECT_OUT(r, "submit");
  EXPECT_OUT(r, "--master");
  assert_int_equal(r->err_len, 0);
  free(r);
}

static void test_version(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("--version");
  expect_status(r, 0);
  assert_string_equal(r->out, "flint 0.1.0\n");
  assert_string_equal(r->out, "flint " FL_VERSION_STRING "\n");
  free(r);
}

static void test_no_arguments(void **state) {
  (void)state;
  run_result *r = run_flint_in(NULL, (const char *const[]){NULL});
  expect_status(r, 2);
  EXPECT_ERR(r, "no command");
  EXPECT_ERR(r, "flint --help");
  assert_int_equal(r->out_len, 0);
  free(r);
}

static void test_unknown_command(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("frobnicate", "x");
  expect_status(r, 2);
  EXPECT_ERR(r, "unknown command");
  EXPECT_ERR(r, "frobnicate");
  free(r);
}

/* `flint train` is the flint-train program beside flint: it runs there with the same
 * arguments, and a flint without it says which program is missing. */
static void test_train_runs_flint_train(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("train", "--help");
  expect_status(r, 0);
  assert_non_null(strstr(r->out, "usage: flint train"));
  free(r);

  char dir[] = "/tmp/flint-lone-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char lone[PATH_MAX + 32];
  snprintf(lone, sizeof lone, "%s/flint", dir);
  /* A copy (a symbolic link would resolve back to the build folder, where flint-train is). */
  int in = open(flint_path, O_RDONLY), out = open(lone, O_WRONLY | O_CREAT | O_TRUNC, 0755);
  assert_true(in >= 0 && out >= 0);
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(in, buf, sizeof buf)) > 0) assert_int_equal(write(out, buf, (size_t)n), n);
  close(in);
  close(out);
  r = run_child(lone, NULL, (const char *const[]){"train", "--help", NULL}, CHILD_ALARM_S, PARENT_LIMIT_S);
  expect_status(r, 1);
  EXPECT_ERR(r, "cannot run");
  EXPECT_ERR(r, "/flint-train");
  free(r);
  unlink(lone);
  rmdir(dir);
}

/* ---- submit: usage errors (exit 2) --------------------------------------------------- */

static void test_submit_help(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--help");
  expect_status(r, 0);
  EXPECT_OUT(r, "submit");
  EXPECT_OUT(r, "flint_main");
  free(r);
}

static void test_submit_no_job(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit");
  expect_status(r, 2);
  EXPECT_ERR(r, "no job");
  free(r);

  r = RUN_FLINT("submit", "--master", "local[2]");
  expect_status(r, 2);
  EXPECT_ERR(r, "no job");
  free(r);
}

static void test_submit_master_without_value(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master");
  expect_status(r, 2);
  EXPECT_ERR(r, "--master");
  EXPECT_ERR(r, "needs a value");
  free(r);

  r = RUN_FLINT("submit", "--memory");
  expect_status(r, 2);
  EXPECT_ERR(r, "--memory");
  free(r);
}

static void test_submit_bad_memory(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--memory", "12x", bin_file("job_exit3.so"));
  expect_status(r, 2);
  EXPECT_ERR(r, "12x");
  assert_null(strstr(r->out, "job_exit3")); /* the job never ran */
  free(r);

  r = RUN_FLINT("submit", "--memory", "-5m", bin_file("job_exit3.so"));
  expect_status(r, 2);
  EXPECT_ERR(r, "-5m");
  free(r);
}

static void test_submit_unknown_option(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--frobnicate", bin_file("job_exit3.so"));
  expect_status(r, 2);
  EXPECT_ERR(r, "--frobnicate");
  free(r);
}

/* ---- every command: help, version, --opt=value, the one error form ------------------- */

static const char *const commands[] = {"submit", "driver", "executor", "status", "config", "ml", "train"};

/* `flint CMD -h` and `--help`: that command's usage (not flint's), with an example, on
 * stdout; exit 0, nothing on stderr. */
static void test_command_help(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    for (int form = 0; form < 2; form++) {
      run_result *r = RUN_FLINT(commands[i], form ? "--help" : "-h");
      expect_status(r, 0);
      char first[64];
      snprintf(first, sizeof first, "usage: flint %s", commands[i]);
      if (strncmp(r->out, first, strlen(first)) != 0) run_dump(r);
      assert_int_equal(strncmp(r->out, first, strlen(first)), 0);
      EXPECT_OUT(r, "example");
      EXPECT_OUT(r, "--version");
      EXPECT_OUT(r, "--conf KEY=VALUE"); /* main.c takes it for every command */
      assert_null(strstr(r->out, "commands:")); /* not flint's page of every command */
      assert_int_equal(r->err_len, 0);
      free(r);
    }
  }
}

/* --version after any command, even among other options, prints the version; exit 0. */
static void test_version_after_command(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    run_result *r = RUN_FLINT(commands[i], "--version");
    expect_status(r, 0);
    assert_string_equal(r->out, "flint " FL_VERSION_STRING "\n");
    assert_int_equal(r->err_len, 0);
    free(r);
  }
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", "--version");
  expect_status(r, 0);
  assert_string_equal(r->out, "flint " FL_VERSION_STRING "\n");
  free(r);
  r = RUN_FLINT("ml", "logreg", "--data", "d.csv", "--version");
  expect_status(r, 0);
  assert_string_equal(r->out, "flint " FL_VERSION_STRING "\n");
  free(r);
}

/* A usage error of command `cmd`: exit 2, nothing on stdout, and on stderr exactly
 * "flint CMD: " + a cause containing `needle`, then the hint line. */
static void expect_usage_error(run_result *r, const char *cmd, const char *needle) {
  expect_status(r, 2);
  char prefix[64], hint[96];
  snprintf(prefix, sizeof prefix, "flint %s: ", cmd);
  snprintf(hint, sizeof hint, "Run 'flint %s --help' for usage.\n", cmd);
  const char *nl = strchr(r->err, '\n');
  bool ok = strncmp(r->err, prefix, strlen(prefix)) == 0 && strstr(r->err, needle) && strstr(r->err, needle) < nl &&
            nl && strcmp(nl + 1, hint) == 0 && r->out_len == 0;
  if (!ok) {
    fprintf(stderr, "expected '%s...%s...' and the hint '%s'\n", prefix, needle, hint);
    run_dump(r);
  }
  assert_true(ok);
  free(r);
}

static void test_usage_errors_one_form(void **state) {
  (void)state;
  const char *job = bin_file("job_exit3.so");
  expect_usage_error(RUN_FLINT("submit", "--memory=12x", job), "submit", "--memory '12x' is not a size");
  expect_usage_error(RUN_FLINT("submit", "--memory", "2q", job), "submit", "--memory '2q' is not a size");
  expect_usage_error(RUN_FLINT("submit", "--frobnicate", job), "submit", "unknown option '--frobnicate'");
  expect_usage_error(RUN_FLINT("submit", "--detach=yes", job), "submit", "--detach takes no value");
  expect_usage_error(RUN_FLINT("submit", "--name="), "submit", "--name needs a non-empty name");
  expect_usage_error(RUN_FLINT("submit"), "submit", "no job library given");
  expect_usage_error(RUN_FLINT("submit", "--master"), "submit", "--master needs a value");
  expect_usage_error(RUN_FLINT("submit", "-x", job), "submit", "unknown option '-x'");
  expect_usage_error(RUN_FLINT("driver"), "driver", "--listen HOST:PORT is required");
  expect_usage_error(RUN_FLINT("driver", "--listen=127.0.0.1:0", "extra"), "driver", "unexpected argument 'extra'");
  expect_usage_error(RUN_FLINT("driver", "--listen"), "driver", "--listen needs a value");
  expect_usage_error(RUN_FLINT("executor", "--driver=127.0.0.1:1", "--cores=0", "--memory=1g"), "executor",
                     "--cores '0' must be 1 to 1024");
  expect_usage_error(RUN_FLINT("executor", "--driver=127.0.0.1:1", "--cores=2", "--memory=1.5x"), "executor",
                     "--memory '1.5x' is not a size");
  /* 0.5 MiB is a size, but less than an executor's least. */
  expect_usage_error(RUN_FLINT("executor", "--driver=127.0.0.1:1", "--cores=2", "--memory=0.5"), "executor",
                     "--memory '0.5' is not a size of at least 1m");
  expect_usage_error(RUN_FLINT("executor", "--driver=127.0.0.1:1", "--cores=2", "--memory=1g", "--gpu=x"),
                     "executor", "--gpu 'x'");
  expect_usage_error(RUN_FLINT("status"), "status", "--master flint://HOST:PORT is required");
  expect_usage_error(RUN_FLINT("status", "--bogus"), "status", "unknown option '--bogus'");
  expect_usage_error(RUN_FLINT("config", "--json=1"), "config", "--json takes no value");
  expect_usage_error(RUN_FLINT("config", "extra"), "config", "unexpected argument 'extra'");
  expect_usage_error(RUN_FLINT("ml", "linreg", "--data=d.csv", "--format=csv", "--lambda=-1"), "ml",
                     "--lambda '-1' must be >= 0");
  expect_usage_error(RUN_FLINT("ml", "linreg", "--data=d.csv", "--format=xml"), "ml", "unknown format 'xml'");
  expect_usage_error(RUN_FLINT("train", "--model=mlp", "--data=fashion-mnist", "--lr=fast"), "train",
                     "--lr 'fast' is not a number");
  expect_usage_error(RUN_FLINT("train", "--model=mlp", "--data=fashion-mnist", "--bogus"), "train",
                     "unknown option '--bogus'");
}

/* A failure of the work: exit 1, "flint CMD: cause", no hint. */
static void test_failures_one_form(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master=spark://x", bin_file("job_exit3.so"));
  expect_status(r, 1);
  assert_int_equal(strncmp(r->err, "flint submit: ", 14), 0);
  assert_null(strstr(r->err, "--help"));
  free(r);
  r = RUN_FLINT("status", "--master=local[2]");
  expect_status(r, 1);
  assert_int_equal(strncmp(r->err, "flint status: ", 14), 0);
  assert_null(strstr(r->err, "--help"));
  free(r);
}

/* --opt=value is --opt value: the master, the name and the memory reach the job. */
static void test_submit_option_equals_value(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master=local[2]", "--name=equals test", "--memory=64m",
                            bin_file("job_exit3.so"), "a", "--master=x");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_exit3 args: a --master=x\n"); /* the job's own options stay its own */
  EXPECT_OUT(r, "job_exit3 count: 10\n");
  free(r);
  /* A bare number is MiB, as in Spark: 64 is 64 MiB, enough to run. */
  r = RUN_FLINT("submit", "--memory", "64", "--master", "local[1]", bin_file("job_exit3.so"));
  expect_status(r, 3);
  EXPECT_OUT(r, "job_exit3 count: 10\n");
  free(r);
}

/* cli_parse_memory (cli/args.c, linked into this test): sizes as Spark reads them, by the
 * parser the memory settings share (common_parse_memory), which takes 0 where --memory does not. */
static void test_parse_memory(void **state) {
  (void)state;
  static const struct {
    const char *text;
    uint64_t bytes;
  } good[] = {
      {"2048", 2048ull << 20}, {"1", 1ull << 20},        {"1g", 1ull << 30},           {"1G", 1ull << 30},
      {"512m", 512ull << 20},  {"1.5g", 3ull << 29},     {"1GiB", 1ull << 30},         {"512MiB", 512ull << 20},
      {"64k", 64ull << 10},    {"64KB", 64ull << 10},    {"2t", 2ull << 40},           {"100b", 100},
      {"0.5", 1ull << 19},     {"1.", 1ull << 20},       {"1.25GB", 5ull << 28},       {"3mb", 3ull << 20},
  };
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    uint64_t v = 0;
    if (!cli_parse_memory(good[i].text, &v) || v != good[i].bytes)
      fprintf(stderr, "cli_parse_memory('%s') = %llu, not %llu\n", good[i].text, (unsigned long long)v,
              (unsigned long long)good[i].bytes);
    assert_true(cli_parse_memory(good[i].text, &v));
    assert_int_equal(v, good[i].bytes);
    uint64_t same = 0;
    assert_true(common_parse_memory(good[i].text, &same));
    assert_int_equal(same, good[i].bytes);
  }
  static const char *const bad[] = {"",    "g",    "-1g",   "+1g",  " 1g", "1g ", "1 g",  "1x",    "1gx",
                                    "1gb2", "1bb", "1kibb", ".5g", "1.2.3", "1e3", "0x10", "0",     "0m",
                                    "nan", "inf",  "1ki",  "9999999999999999t", "0.0000001b"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    uint64_t v = 42;
    if (cli_parse_memory(bad[i], &v)) fprintf(stderr, "cli_parse_memory('%s') took it\n", bad[i]);
    assert_false(cli_parse_memory(bad[i], &v));
    assert_int_equal(v, 42); /* untouched */
    bool zero = strcmp(bad[i], "0") == 0 || strcmp(bad[i], "0m") == 0;
    assert_int_equal(common_parse_memory(bad[i], &v), zero);
  }
}

/* ---- submit: the job cannot start (exit 1) ------------------------------------------- */

static void test_submit_bad_master(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master", "spark://x", bin_file("job_exit3.so"));
  expect_status(r, 1);
  EXPECT_ERR(r, "spark://x");
  assert_null(strstr(r->out, "job_exit3"));
  free(r);

  r = RUN_FLINT("submit", "--master", "local[0]", bin_file("job_exit3.so"));
  expect_status(r, 1);
  EXPECT_ERR(r, "local[0]");
  free(r);
}

static void test_submit_missing_job_file(void **state) {
  (void)state;
  const char *missing = bin_file("no_such_job.so");
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", missing);
  expect_status(r, 1);
  EXPECT_ERR(r, missing);
  EXPECT_ERR(r, "cannot load job");
  free(r);
}

static void test_submit_job_without_flint_main(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", bin_file("job_no_main.so"));
  expect_status(r, 1);
  EXPECT_ERR(r, "flint_main");
  EXPECT_ERR(r, "job_no_main.so");
  free(r);
}

/* ---- submit: the job's own status ---------------------------------------------------- */

static void test_submit_passes_args_and_exit_status(void **state) {
  (void)state;
  const char *job = bin_file("job_exit3.so");
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", "--memory", "64m", job, "a", "b");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_exit3 args: a b\n");
  EXPECT_OUT(r, "job_exit3 count: 10\n");
  char argv0[PATH_MAX + 64];
  snprintf(argv0, sizeof argv0, "job_exit3 argv[0]: %s\n", job);
  EXPECT_OUT(r, argv0); /* the job sees its own path as argv[0], as a program would */
  free(r);

  /* Options after the job belong to the job, not to flint. */
  r = RUN_FLINT("submit", job, "--master", "x");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_exit3 args: --master x\n");
  free(r);
}

static void test_submit_bare_name_in_current_folder(void **state) {
  (void)state;
  run_result *r = RUN_FLINT_IN(bin_dir, "submit", "--master", "local", "job_exit3.so", "c");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_exit3 args: c\n");
  EXPECT_OUT(r, "job_exit3 count: 10\n");
  free(r);
}

static void test_submit_failing_job(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", bin_file("job_fails.so"));
  expect_status(r, 4);
  EXPECT_ERR(r, "fail_every_record"); /* the engine names the user function that failed */
  EXPECT_ERR(r, "bad record");
  free(r);
}

static void test_submit_pi(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("submit", "--master", "local[2]", bin_file("pi.so"), "100000");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  EXPECT_OUT(r, "100000 samples");
  free(r);
}

static void test_submit_iterative(void **state) {
  (void)state;
  run_result *r =
      RUN_FLINT("submit", "--master", "local[2]", bin_file("iterative.so"), "5000", "4", "5", "4");
  expect_status(r, 0);
  EXPECT_OUT(r, "5000 points, 4 features, 4 partitions, 2 threads");
  EXPECT_OUT(r, "step  5");
  EXPECT_OUT(r, "distance from the true weights");
  free(r);
}

static void find_binaries(void) {
  const char *env = getenv("FLINT_BIN");
  if (env && *env) {
    snprintf(bin_dir, sizeof bin_dir, "%s", env);
  } else { /* this test's own folder: the build puts the binaries there too */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
      fprintf(stderr, "test_cli: set FLINT_BIN to the folder of the flint binary\n");
      exit(1);
    }
    self[n] = '\0';
    snprintf(bin_dir, sizeof bin_dir, "%s", dirname(self));
  }
  snprintf(flint_path, sizeof flint_path, "%s/flint", bin_dir);
  if (access(flint_path, X_OK) != 0) {
    fprintf(stderr, "test_cli: no flint binary at %s (set FLINT_BIN)\n", flint_path);
    exit(1);
  }
}

int main(void) {
  find_binaries();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_train_runs_flint_train),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_no_arguments),
      cmocka_unit_test(test_unknown_command),
      cmocka_unit_test(test_submit_help),
      cmocka_unit_test(test_submit_no_job),
      cmocka_unit_test(test_submit_master_without_value),
      cmocka_unit_test(test_submit_bad_memory),
      cmocka_unit_test(test_submit_unknown_option),
      cmocka_unit_test(test_command_help),
      cmocka_unit_test(test_version_after_command),
      cmocka_unit_test(test_usage_errors_one_form),
      cmocka_unit_test(test_failures_one_form),
      cmocka_unit_test(test_submit_option_equals_value),
      cmocka_unit_test(test_parse_memory),
      cmocka_unit_test(test_submit_bad_master),
      cmocka_unit_test(test_submit_missing_job_file),
      cmocka_unit_test(test_submit_job_without_flint_main),
      cmocka_unit_test(test_submit_passes_args_and_exit_status),
      cmocka_unit_test(test_submit_bare_name_in_current_folder),
      cmocka_unit_test(test_submit_failing_job),
      cmocka_unit_test(test_submit_pi),
      cmocka_unit_test(test_submit_iterative),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
