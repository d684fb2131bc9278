/* test_context.c: opening and closing contexts: masters, options, environment, stats. */
#include "test_util.h"

static void test_local_masters(void **state) {
  (void)state;
  const struct { const char *master; uint32_t cores; } ok[] = {{"local", 1}, {"local[1]", 1}, {"local[3]", 3}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    fl_context *ctx = NULL;
    assert_ok(fl_context_open(ok[i].master, NULL, &ctx));
    assert_int_equal(fl_context_cores(ctx), ok[i].cores);
    fl_context_close(ctx);
  }
  fl_context *ctx = NULL;
  assert_ok(fl_context_open("local[*]", NULL, &ctx));
  assert_int_equal(fl_context_cores(ctx), (uint32_t)sysconf(_SC_NPROCESSORS_ONLN));
  fl_context_close(ctx);
}

static void test_bad_masters(void **state) {
  (void)state;
  const char *bad[] = {"", "local[]", "local[0]", "local[-2]", "local[2", "local[2]x", "local[x]",
                       "spark://host:7077", "LOCAL", "local[99999999999]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    fl_context *ctx = (fl_context *)0x1;
    fl_status s = fl_context_open(bad[i], NULL, &ctx);
    assert_int_equal(s, FL_EINVAL);
    assert_ptr_equal(ctx, (fl_context *)0x1); /* out untouched on failure */
    assert_non_null(strstr(fl_last_error(), "master"));
  }
}

static void test_null_arguments(void **state) {
  (void)state;
  fl_context *ctx;
  assert_int_equal(fl_context_open(NULL, NULL, &ctx), FL_EINVAL);
  assert_int_equal(fl_context_open("local", NULL, NULL), FL_EINVAL);
  fl_context_close(NULL); /* does nothing */
  assert_int_equal(fl_context_cores(NULL), 0);
  fl_context_stats st;
  assert_int_equal(fl_context_stats_get(NULL, &st), FL_EINVAL);
}

static void test_options_and_default_parallelism(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.default_parallelism = 7;
  opts.memory_limit = 1 << 20;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 100, 1, 0, &ds));
  assert_int_equal(fl_dataset_partitions(ds), 7);
  fl_dataset_free(ds);
  fl_context_close(ctx);
}

static void test_bad_memory_environment(void **state) {
  (void)state;
  setenv("FLINT_MEMORY", "lots", 1);
  fl_context *ctx;
  assert_fails_with(fl_context_open("local", NULL, &ctx), FL_EINVAL, "FLINT_MEMORY");
  setenv("FLINT_MEMORY", "64m", 1);
  assert_ok(fl_context_open("local", NULL, &ctx));
  fl_context_close(ctx);
  unsetenv("FLINT_MEMORY");
}

static void test_work_dir_made_and_removed(void **state) {
  (void)state;
  char base[256], cmd[512];
  test_tmpdir(base, sizeof base);
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = base;
  fl_context *ctx;
  assert_ok(fl_context_open("local", &opts, &ctx));
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 1", base);
  assert_int_equal(system(cmd), 0); /* one flint-XXXXXX folder */
  fl_context_close(ctx);
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s' | wc -l) -eq 0", base);
  assert_int_equal(system(cmd), 0);
  test_rmtree(base);
}

static void test_unwritable_work_dir(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = "/proc/flint-cannot-exist";
  fl_context *ctx;
  assert_fails_with(fl_context_open("local", &opts, &ctx), FL_EIO, "/proc/flint-cannot-exist");
}

static void test_stats_count_jobs_and_tasks(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 10, 1, 5, &ds));
  uint64_t n;
  assert_ok(fl_count(ds, &n));
  assert_ok(fl_count(ds, &n));
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_int_equal(st.jobs_run, 2);
  assert_int_equal(st.tasks_run, 10);
  assert_int_equal(st.jobs_failed, 0);
  assert_int_equal(st.tasks_failed, 0);
  fl_dataset_free(ds);
  fl_context_close(ctx);
}

static void test_open_survives_out_of_memory(void **state) {
  (void)state;
  /* Fail each allocation of open in turn: every one must give FL_ENOMEM (or succeed), and
   * nothing may leak or crash (the sanitizer build checks the leaks). */
  for (long k = 0; k < 40; k++) {
    fl_context *ctx = NULL;
    flint_test_fail_alloc_after(k);
    fl_status s = fl_context_open("local[2]", NULL, &ctx);
    flint_test_fail_alloc_after(-1);
    if (s == FL_OK) {
      fl_context_close(ctx);
      continue;
    }
    assert_int_equal(s, FL_ENOMEM);
  }
}


int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_masters),
      cmocka_unit_test(test_bad_masters),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_options_and_default_parallelism),
      cmocka_unit_test(test_bad_memory_environment),
      cmocka_unit_test(test_work_dir_made_and_removed),
      cmocka_unit_test(test_unwritable_work_dir),
      cmocka_unit_test(test_stats_count_jobs_and_tasks),
      cmocka_unit_test(test_open_survives_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
