/* test_transforms.c: the narrow transformations against naive references, on one and many
 * partitions, with empty partitions and chains of them. */
#include "test_util.h"

static fl_context *ctx;

static int setup(void **state) {
  (void)state;
  return fl_context_open("local[3]", NULL, &ctx) == FL_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  fl_context_close(ctx);
  return 0;
}

/* The int64 values of a dataset, in order. Returns the count. */
static size_t collect_i64(fl_dataset *ds, int64_t *out, size_t max) {
  fl_records *r;
  assert_ok(fl_collect(ds, &r));
  size_t n = fl_records_count(r);
  assert_true(n <= max);
  for (size_t i = 0; i < n; i++) out[i] = fl_i64(fl_records_get(r, i));
  fl_records_free(r);
  return n;
}

fl_status times_k(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) * *(const int64_t *)arg);
}

fl_status keep_odd(fl_bytes rec, bool *keep, const void *arg) {
  (void)arg;
  *keep = fl_i64(rec) % 2 != 0;
  return FL_OK;
}

/* x -> x copies of x (0 gives none). */
fl_status repeat_self(fl_bytes rec, fl_emitter *out, const void *arg) {
  (void)arg;
  int64_t v = fl_i64(rec);
  for (int64_t i = 0; i < v % 4; i++) {
    fl_status s = fl_emit(out, &v, 8);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

/* Emits the partition index, then the sum of the partition's values. */
fl_status partition_sum(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)arg;
  int64_t sum = 0, p = partition;
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) sum += fl_i64(rec);
  fl_status s = fl_emit(out, &p, 8);
  return s != FL_OK ? s : fl_emit(out, &sum, 8);
}

static void test_map_filter_flat_map_chain(void **state) {
  (void)state;
  static int64_t got[100000];
  for (uint32_t parts = 1; parts <= 9; parts += 4) {
    fl_dataset *src, *m, *f, *fm;
    int64_t k = 3;
    assert_ok(fl_range(ctx, 0, 1000, 1, parts, &src));
    assert_ok(fl_map(src, times_k, &k, sizeof k, &m));
    assert_ok(fl_filter(m, keep_odd, NULL, 0, &f));
    assert_ok(fl_flat_map(f, repeat_self, NULL, 0, &fm));
    size_t n = collect_i64(fm, got, 100000), j = 0;
    for (int64_t x = 0; x < 1000; x++) {
      int64_t v = x * 3;
      if (v % 2 == 0) continue;
      for (int64_t c = 0; c < v % 4; c++) assert_int_equal(got[j++], v);
    }
    assert_int_equal(n, j);
    fl_dataset_free(fm);
    fl_dataset_free(f);
    fl_dataset_free(m);
    fl_dataset_free(src);
  }
}

static void test_map_partitions_sees_each_partition(void **state) {
  (void)state;
  fl_dataset *src, *mp;
  assert_ok(fl_range(ctx, 0, 100, 1, 4, &src));
  assert_ok(fl_map_partitions(src, partition_sum, NULL, 0, &mp));
  int64_t got[8];
  assert_int_equal(collect_i64(mp, got, 8), 8);
  for (int p = 0; p < 4; p++) {
    int64_t sum = 0;
    for (int64_t x = 25 * p; x < 25 * (p + 1); x++) sum += x;
    assert_int_equal(got[2 * p], p);
    assert_int_equal(got[2 * p + 1], sum);
  }
  fl_dataset_free(mp);
  fl_dataset_free(src);
}

/* Reserves room for the partition's records, then emits each input value and its square;
 * arg (when given) makes partition 2 fail after its first record. */
fl_status reserve_and_square(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  fl_status s = fl_emit_reserve(out, 50, 50 * 8);
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    int64_t v = fl_i64(rec), sq = v * v;
    if ((s = fl_emit(out, &v, 8)) == FL_OK) s = fl_emit(out, &sq, 8);
    if (arg && partition == 2) return fl_set_error(FL_EINVAL, "partition 2 fails on purpose");
  }
  return s;
}

/* A cached map_partitions dataset keeps the function's own output as its block (no copy):
 * the records read back are the same, from the cache, and a failure caches nothing. */
static void test_cached_map_partitions_keeps_its_output(void **state) {
  (void)state;
  fl_dataset *src, *mp, *bad;
  assert_ok(fl_range(ctx, 0, 100, 1, 4, &src));
  assert_ok(fl_map_partitions(src, reserve_and_square, NULL, 0, &mp));
  assert_ok(fl_cache(mp));
  int64_t got[200];
  for (int round = 0; round < 2; round++) {
    assert_int_equal(collect_i64(mp, got, 200), 200);
    for (int64_t x = 0; x < 100; x++) {
      assert_int_equal(got[2 * x], x);
      assert_int_equal(got[2 * x + 1], x * x);
    }
  }
  fl_storage_info si;
  assert_ok(fl_storage_info_get(mp, &si));
  assert_int_equal(si.cached_partitions, 4);
  assert_true(si.memory_bytes >= 200 * 9 && si.memory_bytes < 200 * 9 + 64); /* no growth slack */

  int one = 1;
  assert_ok(fl_map_partitions(src, reserve_and_square, &one, sizeof one, &bad));
  assert_ok(fl_cache(bad));
  fl_records *r = NULL;
  assert_int_equal(fl_collect(bad, &r), FL_EJOB); /* after its retries */
  assert_non_null(strstr(fl_last_error(), "partition 2 fails on purpose"));
  assert_ok(fl_storage_info_get(bad, &si));
  assert_true(si.cached_partitions < 4);

  assert_int_equal(fl_emit_reserve(NULL, 1, 8), FL_EINVAL);
  fl_dataset_free(bad);
  fl_dataset_free(mp);
  fl_dataset_free(src);
}

static void test_sample_is_seeded_and_plausible(void **state) {
  (void)state;
  fl_dataset *src, *a, *b, *c, *w;
  assert_ok(fl_range(ctx, 0, 100000, 1, 8, &src));
  assert_ok(fl_sample(src, false, 0.1, 42, &a));
  assert_ok(fl_sample(src, false, 0.1, 42, &b));
  assert_ok(fl_sample(src, false, 0.1, 43, &c));
  assert_ok(fl_sample(src, true, 2.0, 7, &w));
  static int64_t ga[100000], gb[100000], gc[100000], gw[400000];
  size_t na = collect_i64(a, ga, 100000), nb = collect_i64(b, gb, 100000), nc = collect_i64(c, gc, 100000);
  assert_int_equal(na, nb);
  assert_memory_equal(ga, gb, na * 8); /* same seed, same sample */
  assert_true(na > 9000 && na < 11000);
  assert_true(nc != na || memcmp(ga, gc, na * 8) != 0);
  for (size_t i = 1; i < na; i++) assert_true(ga[i] > ga[i - 1]); /* without replacement: no repeats */
  size_t nw = collect_i64(w, gw, 400000);
  assert_true(nw > 190000 && nw < 210000); /* Poisson(2) per record */
  /* Recomputing gives the same sample (what lineage recovery relies on). */
  size_t nw2 = collect_i64(w, gw + 0, 400000);
  assert_int_equal(nw, nw2);
  fl_dataset *bad;
  assert_fails_with(fl_sample(src, false, 1.5, 1, &bad), FL_EINVAL, "fraction");
  assert_fails_with(fl_sample(src, true, -1, 1, &bad), FL_EINVAL, "fraction");
  fl_dataset_free(w);
  fl_dataset_free(c);
  fl_dataset_free(b);
  fl_dataset_free(a);
  fl_dataset_free(src);
}

static void test_union_and_coalesce(void **state) {
  (void)state;
  fl_dataset *a, *b, *u, *c1, *c3, *c99;
  assert_ok(fl_range(ctx, 0, 10, 1, 3, &a));
  assert_ok(fl_range(ctx, 100, 105, 1, 2, &b));
  assert_ok(fl_union(a, b, &u));
  assert_int_equal(fl_dataset_partitions(u), 5);
  int64_t got[32];
  assert_int_equal(collect_i64(u, got, 32), 15);
  for (int i = 0; i < 10; i++) assert_int_equal(got[i], i);
  for (int i = 0; i < 5; i++) assert_int_equal(got[10 + i], 100 + i);
  assert_ok(fl_coalesce(u, 1, &c1));
  assert_ok(fl_coalesce(u, 3, &c3));
  assert_ok(fl_coalesce(u, 99, &c99));
  assert_int_equal(fl_dataset_partitions(c1), 1);
  assert_int_equal(fl_dataset_partitions(c3), 3);
  assert_int_equal(fl_dataset_partitions(c99), 5); /* no shuffle: never more partitions */
  int64_t g2[32];
  assert_int_equal(collect_i64(c3, g2, 32), 15);
  assert_memory_equal(got, g2, 15 * 8);
  assert_int_equal(collect_i64(c1, g2, 32), 15);
  assert_memory_equal(got, g2, 15 * 8);
  fl_dataset *bad;
  assert_int_equal(fl_coalesce(u, 0, &bad), FL_EINVAL);
  fl_context *other;
  assert_ok(fl_context_open("local", NULL, &other));
  fl_dataset *foreign;
  assert_ok(fl_range(other, 0, 1, 1, 1, &foreign));
  assert_fails_with(fl_union(a, foreign, &bad), FL_EINVAL, "different contexts");
  fl_dataset_free(foreign);
  fl_context_close(other);
  fl_dataset_free(c99);
  fl_dataset_free(c3);
  fl_dataset_free(c1);
  fl_dataset_free(u);
  fl_dataset_free(b);
  fl_dataset_free(a);
}

static void test_zip_with_index_key_by_map_values(void **state) {
  (void)state;
  fl_dataset *src, *f, *z, *kb, *mv;
  assert_ok(fl_range(ctx, 0, 50, 1, 6, &src));
  assert_ok(fl_filter(src, keep_odd, NULL, 0, &f)); /* uneven partitions */
  assert_ok(fl_zip_with_index(f, &z));
  fl_records *r;
  assert_ok(fl_collect(z, &r));
  assert_int_equal(fl_records_count(r), 25);
  for (size_t i = 0; i < 25; i++) {
    fl_bytes k, v;
    assert_ok(fl_pair(fl_records_get(r, i), &k, &v));
    assert_int_equal(fl_i64(k), 2 * (int64_t)i + 1);
    assert_int_equal(fl_i64(v), (int64_t)i);
  }
  fl_records_free(r);

  int64_t ten = 10;
  assert_ok(fl_key_by(f, times_k, &ten, sizeof ten, &kb));      /* (10x, x) */
  assert_ok(fl_map_values(kb, times_k, &ten, sizeof ten, &mv)); /* (10x, 10x) */
  assert_ok(fl_collect(mv, &r));
  assert_int_equal(fl_records_count(r), 25);
  for (size_t i = 0; i < 25; i++) {
    fl_bytes k, v;
    assert_ok(fl_pair(fl_records_get(r, i), &k, &v));
    assert_int_equal(fl_i64(k), 10 * (2 * (int64_t)i + 1));
    assert_int_equal(fl_i64(v), 10 * (2 * (int64_t)i + 1));
  }
  fl_records_free(r);

  /* map_values over records that are not pairs fails the job with a clear message. */
  fl_dataset *notpairs, *bad;
  const char junk[] = {(char)0xff, (char)0xff, (char)0xff};
  fl_bytes rec = fl_bytes_of(junk, 3);
  assert_ok(fl_parallelize(ctx, &rec, 1, 1, &notpairs));
  assert_ok(fl_map_values(notpairs, times_k, &ten, sizeof ten, &bad));
  uint64_t n;
  assert_fails_with(fl_count(bad, &n), FL_EJOB, "not a pair");
  fl_dataset_free(bad);
  fl_dataset_free(notpairs);
  fl_dataset_free(mv);
  fl_dataset_free(kb);
  fl_dataset_free(z);
  fl_dataset_free(f);
  fl_dataset_free(src);
}

static void test_argument_errors_and_lineage(void **state) {
  (void)state;
  fl_dataset *src, *out;
  assert_ok(fl_range(ctx, 0, 4, 1, 2, &src));
  assert_fails_with(fl_map(NULL, times_k, NULL, 0, &out), FL_EINVAL, "fl_map");
  assert_fails_with(fl_map(src, NULL, NULL, 0, &out), FL_EINVAL, "function is NULL");
  assert_fails_with(fl_filter(src, keep_odd, NULL, 8, &out), FL_EINVAL, "arg_len");
  assert_int_equal(fl_flat_map(src, repeat_self, NULL, 0, NULL), FL_EINVAL);
  assert_int_equal(fl_zip_with_index(NULL, &out), FL_EINVAL);

  /* A child keeps its parents alive after their handles are freed. */
  int64_t two = 2;
  fl_dataset *m;
  assert_ok(fl_map(src, times_k, &two, sizeof two, &m));
  two = 1000; /* the blob was copied */
  fl_dataset_free(src);
  int64_t got[4];
  assert_int_equal(collect_i64(m, got, 4), 4);
  assert_int_equal(got[3], 6);
  char *lineage = fl_dataset_lineage(m);
  assert_non_null(strstr(lineage, "map"));
  assert_non_null(strstr(lineage, "range"));
  free(lineage);
  fl_dataset_free(m);
  fl_dataset_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_map_filter_flat_map_chain),
      cmocka_unit_test(test_map_partitions_sees_each_partition),
      cmocka_unit_test(test_cached_map_partitions_keeps_its_output),
      cmocka_unit_test(test_sample_is_seeded_and_plausible),
      cmocka_unit_test(test_union_and_coalesce),
      cmocka_unit_test(test_zip_with_index_key_by_map_values),
      cmocka_unit_test(test_argument_errors_and_lineage),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
