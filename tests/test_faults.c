/* test_faults.c: failing functions and retries, accumulators under retries, persistence at
 * every level, eviction under a tiny memory limit followed by recomputation, broadcasts. */
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>

#include "test_util.h"

static atomic_int failures_left;
static atomic_long computed; /* records produced by count_computed */

fl_status fail_a_few_times(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  if (atomic_fetch_sub(&failures_left, 1) > 0) return fl_set_error(FL_EUSER, "transient failure");
  return fl_buf_put_i64(out, fl_i64(rec));
}

fl_status always_fail(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)out, (void)arg;
  return fl_set_error(FL_EFORMAT, "bad value %lld", (long long)fl_i64(rec));
}

/* Adds 1 per record to the accumulator in arg, and fails the partition's first attempt
 * after the last record (so the failed attempt has added everything it saw). */
typedef struct acc_args {
  uint64_t acc;
  int64_t fail_at;
} acc_args;
static atomic_int acc_fail_once;
fl_status add_then_fail(fl_bytes rec, fl_buf *out, const void *arg) {
  const acc_args *a = arg;
  fl_status s = fl_accumulator_add_i64(a->acc, 1);
  if (s != FL_OK) return s;
  if (fl_i64(rec) == a->fail_at && atomic_exchange(&acc_fail_once, 0))
    return fl_set_error(FL_EUSER, "fail after adding");
  return fl_buf_put_i64(out, fl_i64(rec));
}

/* What a crashed task held is leaked on purpose (common/crash_guard.c): LeakSanitizer (the
 * sanitizer build) reads its default suppressions from this hook. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:common_crash_guard_run\n"; }

/* Crashes on record 7 (contain_task_crashes): a NULL dereference, or a division by zero
 * with arg. Exported, so that the message can name them. */
static volatile int *volatile nowhere;
static volatile int zero;
/* Not instrumented by UBSan (the sanitizer build), which would stop the program at the
 * NULL load or the division before the signal the test is about. */
__attribute__((no_sanitize_undefined)) fl_status crash_on_seven(fl_bytes rec, fl_buf *out, const void *arg) {
  int64_t v = fl_i64(rec);
  if (v == 7 && !arg) v += *nowhere;
  if (v == 7 && arg) v /= zero;
  return fl_buf_put_i64(out, v);
}

/* 1 KB records, counting how many are computed. */
fl_status count_computed(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  atomic_fetch_add(&computed, 1);
  fl_status s = fl_buf_reserve(out, 1024);
  if (s != FL_OK) return s;
  memset(out->data, (int)(fl_i64(rec) & 0x7f), 1024);
  memcpy(out->data, rec.data, 8);
  out->len = 1024;
  return FL_OK;
}

fl_status add_broadcast(fl_bytes rec, fl_buf *out, const void *arg) {
  fl_bytes b;
  fl_status s = fl_broadcast_value(*(const uint64_t *)arg, &b);
  if (s != FL_OK) return s;
  return fl_buf_put_i64(out, fl_i64(rec) + fl_i64(b));
}

/* Custom accumulator: keeps the maximum. */
fl_status max_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) > fl_i64(b) ? fl_i64(a) : fl_i64(b));
}
fl_status record_max(fl_bytes rec, const void *arg) {
  return fl_accumulator_add(*(const uint64_t *)arg, rec);
}

static void test_transient_failures_are_retried(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, 0, 100, 1, 4, &src));
  assert_ok(fl_map(src, fail_a_few_times, NULL, 0, &m));
  atomic_store(&failures_left, 3); /* no partition can fail 4 times */
  uint64_t n;
  assert_ok(fl_count(m, &n));
  assert_int_equal(n, 100);
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_int_equal(st.tasks_failed, 3);
  assert_int_equal(st.tasks_run, 4 + 3);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

static void test_permanent_failure_fails_the_job_not_the_process(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, 7, 8, 1, 1, &src));
  assert_ok(fl_map(src, always_fail, NULL, 0, &m));
  uint64_t n;
  assert_int_equal(fl_count(m, &n), FL_EJOB);
  const char *msg = fl_last_error();
  assert_non_null(strstr(msg, "always_fail"));    /* the function */
  assert_non_null(strstr(msg, "partition 0"));    /* the partition */
  assert_non_null(strstr(msg, "4 times"));        /* how often */
  assert_non_null(strstr(msg, "bad value 7"));    /* the function's own message */
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_int_equal(st.tasks_failed, 4);
  assert_int_equal(st.jobs_failed, 1);
  /* The context keeps working. */
  assert_ok(fl_count(src, &n));
  assert_int_equal(n, 1);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

/* A crash that no task raised: contain_task_crashes hands it to the handler before its own. */
static sigjmp_buf before_jump;
static volatile sig_atomic_t before_got;
static void before_handler(int sig) {
  before_got = sig;
  siglongjmp(before_jump, 1);
}

/* contain_task_crashes: a task whose function crashes fails its job (once: no retry), with
 * the signal, the function and the partition; the process and the context go on. First of
 * the tests: its handler must be installed before the guard's (installed once per process). */
static void test_contained_task_crash(void **state) {
  (void)state;
  struct sigaction sa = {.sa_handler = before_handler}, old;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGSEGV, &sa, &old), 0);
  fl_options opts = FL_OPTIONS_INIT;
  opts.contain_task_crashes = true;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *src, *m, *fpe, *ok;
  assert_ok(fl_range(ctx, 0, 10, 1, 2, &src));
  assert_ok(fl_map(src, crash_on_seven, NULL, 0, &m));
  uint64_t n = 0;
  assert_int_equal(fl_count(m, &n), FL_EJOB);
  const char *msg = fl_last_error();
  if (!strstr(msg, "task crashed: signal 11 (Segmentation fault) in function crash_on_seven of test_faults"))
    fprintf(stderr, "the message: %s\n", msg);
  assert_non_null(strstr(msg, "task crashed: signal 11 (Segmentation fault) in function crash_on_seven of test_faults"));
  assert_non_null(strstr(msg, "running partition 1 of dataset"));
  assert_non_null(strstr(msg, "failed 1 times")); /* not retried */
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_int_equal(st.tasks_failed, 1);
  assert_int_equal(st.jobs_failed, 1);
  /* Another signal, and the context still runs jobs, on the same threads. */
  assert_ok(fl_map(src, crash_on_seven, "divide", 7, &fpe));
  assert_fails_with(fl_count(fpe, &n), FL_EJOB, "task crashed: signal 8 (Floating point exception)");
  assert_ok(fl_map(src, fail_a_few_times, NULL, 0, &ok));
  atomic_store(&failures_left, 0);
  for (int i = 0; i < 3; i++) {
    assert_ok(fl_count(ok, &n));
    assert_int_equal(n, 10);
  }
  /* A SIGSEGV outside a task goes on to the handler that was there before. */
  before_got = 0;
  if (sigsetjmp(before_jump, 1) == 0) raise(SIGSEGV);
  assert_int_equal(before_got, SIGSEGV);
  fl_dataset_free(ok);
  fl_dataset_free(fpe);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
  /* The guard's handler stays for the process (other tests' crashes get the default). */
  assert_int_equal(sigaction(SIGSEGV, &old, NULL), 0);
}

static void test_max_attempts_option(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.max_task_attempts = 1;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, 0, 10, 1, 1, &src));
  assert_ok(fl_map(src, fail_a_few_times, NULL, 0, &m));
  atomic_store(&failures_left, 1);
  uint64_t n;
  assert_fails_with(fl_count(m, &n), FL_EJOB, "1 times");
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

static void test_accumulators_count_once_under_retries(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_accumulator *acc;
  assert_ok(fl_accumulator_create_i64(ctx, &acc));
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, 0, 1000, 1, 5, &src));
  acc_args a = {fl_accumulator_id(acc), 999}; /* the last record of the last partition */
  assert_ok(fl_map(src, add_then_fail, &a, sizeof a, &m));
  atomic_store(&acc_fail_once, 1);
  uint64_t n;
  assert_ok(fl_count(m, &n));
  assert_int_equal(n, 1000);
  int64_t v;
  assert_ok(fl_accumulator_value_i64(acc, &v));
  assert_int_equal(v, 1000); /* the failed attempt's 200 additions are not counted */
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_int_equal(st.tasks_failed, 1);
  fl_accumulator_destroy(acc);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

static void test_custom_accumulator_and_f64(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  int64_t lowest = INT64_MIN;
  fl_accumulator *mx;
  assert_ok(fl_accumulator_create(ctx, fl_bytes_of(&lowest, 8), max_merge, NULL, 0, &mx));
  fl_dataset *src;
  assert_ok(fl_range(ctx, -50, 77, 1, 6, &src));
  uint64_t id = fl_accumulator_id(mx);
  assert_ok(fl_foreach(src, record_max, &id, sizeof id));
  fl_buf out = FL_BUF_INIT;
  assert_ok(fl_accumulator_value(mx, &out));
  assert_int_equal(fl_i64(fl_buf_bytes(&out)), 76);
  fl_buf_free(&out);
  int64_t iv;
  assert_int_equal(fl_accumulator_value_i64(mx, &iv), FL_EINVAL);
  fl_accumulator_destroy(mx);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

static fl_dataset *kilobyte_records(fl_context *ctx, int64_t start, int64_t n, uint32_t parts) {
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, start, start + n, 1, parts, &src));
  assert_ok(fl_map(src, count_computed, NULL, 0, &m));
  fl_dataset_free(src);
  return m;
}

static int64_t sum_first_words(fl_dataset *ds) {
  fl_records *r;
  assert_ok(fl_collect(ds, &r));
  int64_t sum = 0;
  for (size_t i = 0; i < fl_records_count(r); i++) {
    fl_bytes b = fl_records_get(r, i);
    assert_int_equal(b.len, 1024);
    sum += fl_i64(b);
  }
  fl_records_free(r);
  return sum;
}

static void test_every_storage_level_caches(void **state) {
  (void)state;
  const fl_storage_level levels[] = {FL_MEMORY_ONLY, FL_MEMORY_SER, FL_MEMORY_AND_DISK, FL_DISK_ONLY};
  for (size_t i = 0; i < 4; i++) {
    fl_context *ctx;
    assert_ok(fl_context_open("local[2]", NULL, &ctx));
    fl_dataset *ds = kilobyte_records(ctx, 0, 400, 4);
    assert_ok(fl_persist(ds, levels[i]));
    atomic_store(&computed, 0);
    int64_t want = 399 * 400 / 2;
    assert_int_equal(sum_first_words(ds), want);
    assert_int_equal(atomic_load(&computed), 400);
    assert_int_equal(sum_first_words(ds), want); /* read from the cache */
    assert_int_equal(atomic_load(&computed), 400);
    fl_storage_info info;
    assert_ok(fl_storage_info_get(ds, &info));
    assert_int_equal(info.level, levels[i]);
    assert_int_equal(info.cached_partitions, 4);
    if (levels[i] == FL_DISK_ONLY) {
      assert_true(info.disk_bytes > 0);
      assert_int_equal(info.memory_bytes, 0);
    } else if (levels[i] == FL_MEMORY_SER) {
      assert_true(info.memory_bytes > 0 && info.memory_bytes < 400 * 1024 / 4); /* compressed */
    } else {
      assert_true(info.memory_bytes >= 400 * 1024);
    }
    assert_fails_with(fl_persist(ds, levels[(i + 1) % 4]), FL_ESTATE, "unpersist");
    assert_ok(fl_unpersist(ds));
    assert_ok(fl_storage_info_get(ds, &info));
    assert_int_equal(info.cached_partitions, 0);
    assert_int_equal(sum_first_words(ds), want); /* computed again */
    assert_int_equal(atomic_load(&computed), 800);
    fl_dataset_free(ds);
    fl_context_close(ctx);
  }
}

static void test_eviction_then_recomputation(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.memory_limit = 600 * 1024; /* one of the two datasets fits, not both */
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *a = kilobyte_records(ctx, 0, 400, 4), *b = kilobyte_records(ctx, 1000, 400, 4);
  assert_ok(fl_cache(a));
  assert_ok(fl_cache(b));
  int64_t want_a = 399 * 400 / 2, want_b = 400 * 1000 + want_a;
  atomic_store(&computed, 0);
  assert_int_equal(sum_first_words(a), want_a);
  assert_int_equal(sum_first_words(a), want_a);
  assert_int_equal(atomic_load(&computed), 400); /* a is cached */
  assert_int_equal(sum_first_words(b), want_b); /* evicts a to make room */
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  assert_true(st.blocks_evicted > 0);
  assert_true(st.memory_used <= opts.memory_limit);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(a, &info));
  assert_true(info.cached_partitions < 4);
  long before = atomic_load(&computed);
  assert_int_equal(sum_first_words(a), want_a); /* lost partitions come back from lineage */
  assert_true(atomic_load(&computed) > before);
  fl_dataset_free(b);
  fl_dataset_free(a);
  fl_context_close(ctx);
}

static void test_memory_and_disk_spills_instead_of_dropping(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.memory_limit = 600 * 1024;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *a = kilobyte_records(ctx, 0, 400, 4), *b = kilobyte_records(ctx, 1000, 400, 4);
  assert_ok(fl_persist(a, FL_MEMORY_AND_DISK));
  assert_ok(fl_persist(b, FL_MEMORY_AND_DISK));
  atomic_store(&computed, 0);
  assert_int_equal(sum_first_words(a), 399 * 400 / 2);
  assert_int_equal(sum_first_words(b), 400 * 1000 + 399 * 400 / 2);
  assert_int_equal(sum_first_words(a), 399 * 400 / 2);
  assert_int_equal(sum_first_words(b), 400 * 1000 + 399 * 400 / 2);
  assert_int_equal(atomic_load(&computed), 800); /* nothing computed twice */
  fl_storage_info ia, ib;
  assert_ok(fl_storage_info_get(a, &ia));
  assert_ok(fl_storage_info_get(b, &ib));
  assert_int_equal(ia.cached_partitions, 4);
  assert_int_equal(ib.cached_partitions, 4);
  assert_true(ia.disk_bytes + ib.disk_bytes > 0);
  fl_dataset_free(b);
  fl_dataset_free(a);
  fl_context_close(ctx);
}

static void test_partition_larger_than_memory_is_not_cached(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.memory_limit = 64 * 1024;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", &opts, &ctx));
  fl_dataset *a = kilobyte_records(ctx, 0, 400, 2); /* 200 KB partitions */
  assert_ok(fl_cache(a));
  atomic_store(&computed, 0);
  assert_int_equal(sum_first_words(a), 399 * 400 / 2);
  assert_int_equal(sum_first_words(a), 399 * 400 / 2);
  assert_int_equal(atomic_load(&computed), 800); /* recomputed, results still right */
  fl_dataset_free(a);
  fl_context_close(ctx);
}

static void test_broadcast(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  int64_t delta = 1000;
  fl_broadcast *b;
  assert_ok(fl_broadcast_create(ctx, &delta, 8, &b));
  uint64_t id = fl_broadcast_id(b);
  fl_dataset *src, *m;
  assert_ok(fl_range(ctx, 0, 10, 1, 3, &src));
  assert_ok(fl_map(src, add_broadcast, &id, sizeof id, &m));
  fl_buf first = FL_BUF_INIT;
  assert_ok(fl_first(m, &first));
  assert_int_equal(fl_i64(fl_buf_bytes(&first)), 1000);
  fl_broadcast_destroy(b);
  /* A destroyed broadcast is an error in the task, reported by the job. */
  assert_fails_with(fl_first(m, &first), FL_EJOB, "no broadcast");
  fl_bytes v;
  assert_int_equal(fl_broadcast_value(id, &v), FL_ESTATE); /* not in a task */
  fl_buf_free(&first);
  fl_broadcast_destroy(NULL);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_contained_task_crash), /* first: see there */
      cmocka_unit_test(test_transient_failures_are_retried),
      cmocka_unit_test(test_permanent_failure_fails_the_job_not_the_process),
      cmocka_unit_test(test_max_attempts_option),
      cmocka_unit_test(test_accumulators_count_once_under_retries),
      cmocka_unit_test(test_custom_accumulator_and_f64),
      cmocka_unit_test(test_every_storage_level_caches),
      cmocka_unit_test(test_eviction_then_recomputation),
      cmocka_unit_test(test_memory_and_disk_spills_instead_of_dropping),
      cmocka_unit_test(test_partition_larger_than_memory_is_not_cached),
      cmocka_unit_test(test_broadcast),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
