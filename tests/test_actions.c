/* test_actions.c: every action against a naive reference, on empty, single and many
 * partitions, and their error paths. */
#include "test_util.h"

static fl_context *ctx;

static int setup(void **state) {
  (void)state;
  return fl_context_open("local[2]", NULL, &ctx) == FL_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  fl_context_close(ctx);
  return 0;
}

fl_status add_i64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) + fl_i64(b));
}

/* acc = (sum, count, max) of int64 records. */
fl_status stats_seq(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t s[3];
  memcpy(s, acc.data, sizeof s);
  int64_t v = fl_i64(rec);
  s[0] += v;
  s[1] += 1;
  if (v > s[2]) s[2] = v;
  return fl_buf_append(out, s, sizeof s);
}

fl_status stats_comb(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x[3], y[3];
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  x[0] += y[0];
  x[1] += y[1];
  if (y[2] > x[2]) x[2] = y[2];
  return fl_buf_append(out, x, sizeof x);
}

/* Counts calls of the combine step, to see the shape of the tree. */
static int comb_calls;
fl_status counting_comb(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  comb_calls++;
  return stats_comb(a, b, out, arg);
}

fl_status fail_on_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)a, (void)b, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "merge refused");
}

fl_status count_into(fl_bytes rec, const void *arg) {
  return fl_accumulator_add_i64(*(const uint64_t *)arg, fl_i64(rec));
}

fl_status drop_all(fl_bytes rec, bool *keep, const void *arg) {
  (void)rec, (void)arg;
  *keep = false;
  return FL_OK;
}

static void test_count_collect_many_shapes(void **state) {
  (void)state;
  const uint32_t parts[] = {1, 2, 7, 64};
  for (size_t i = 0; i < 4; i++) {
    fl_dataset *ds;
    assert_ok(fl_range(ctx, 0, 1000, 1, parts[i], &ds));
    uint64_t n;
    assert_ok(fl_count(ds, &n));
    assert_int_equal(n, 1000);
    fl_records *r;
    assert_ok(fl_collect(ds, &r));
    assert_int_equal(fl_records_count(r), 1000);
    for (size_t j = 0; j < 1000; j++) assert_int_equal(fl_i64(fl_records_get(r, j)), (int64_t)j);
    assert_null(fl_records_get(r, 1000).data); /* out of range: an empty view */
    fl_records_free(r);
    fl_dataset_free(ds);
  }
  assert_int_equal(fl_count(NULL, NULL), FL_EINVAL);
  fl_records_free(NULL);
}

static void test_take_and_first(void **state) {
  (void)state;
  fl_dataset *ds, *empty, *sparse;
  assert_ok(fl_range(ctx, 0, 1000, 1, 50, &ds));
  fl_context_stats before, after;
  assert_ok(fl_context_stats_get(ctx, &before));
  fl_records *r;
  assert_ok(fl_take(ds, 5, &r));
  assert_ok(fl_context_stats_get(ctx, &after));
  assert_int_equal(fl_records_count(r), 5);
  for (size_t j = 0; j < 5; j++) assert_int_equal(fl_i64(fl_records_get(r, j)), (int64_t)j);
  fl_records_free(r);
  assert_int_equal(after.tasks_run - before.tasks_run, 1); /* the first partition had enough */

  assert_ok(fl_take(ds, 555, &r));
  assert_int_equal(fl_records_count(r), 555);
  for (size_t j = 0; j < 555; j++) assert_int_equal(fl_i64(fl_records_get(r, j)), (int64_t)j);
  fl_records_free(r);
  assert_ok(fl_take(ds, 5000, &r));
  assert_int_equal(fl_records_count(r), 1000);
  fl_records_free(r);
  assert_ok(fl_take(ds, 0, &r));
  assert_int_equal(fl_records_count(r), 0);
  fl_records_free(r);

  fl_buf first = FL_BUF_INIT;
  assert_ok(fl_first(ds, &first));
  assert_int_equal(fl_i64(fl_buf_bytes(&first)), 0);
  assert_ok(fl_filter(ds, drop_all, NULL, 0, &empty));
  assert_fails_with(fl_first(empty, &first), FL_EEMPTY, "empty");
  fl_buf_free(&first);

  /* Only the last of many partitions holds records: take still finds them. */
  fl_dataset *head, *tail;
  assert_ok(fl_filter(ds, drop_all, NULL, 0, &head));
  assert_ok(fl_range(ctx, 7, 9, 1, 1, &tail));
  assert_ok(fl_union(head, tail, &sparse));
  assert_ok(fl_take(sparse, 1, &r));
  assert_int_equal(fl_records_count(r), 1);
  assert_int_equal(fl_i64(fl_records_get(r, 0)), 7);
  fl_records_free(r);
  fl_dataset_free(sparse);
  fl_dataset_free(tail);
  fl_dataset_free(head);
  fl_dataset_free(empty);
  fl_dataset_free(ds);
}

static void test_reduce_fold_aggregate(void **state) {
  (void)state;
  fl_dataset *ds, *empty;
  assert_ok(fl_range(ctx, 1, 101, 1, 8, &ds));
  assert_ok(fl_filter(ds, drop_all, NULL, 0, &empty));
  fl_buf out = FL_BUF_INIT;
  assert_ok(fl_reduce(ds, add_i64, NULL, 0, &out));
  assert_int_equal(fl_i64(fl_buf_bytes(&out)), 5050);
  assert_fails_with(fl_reduce(empty, add_i64, NULL, 0, &out), FL_EEMPTY, "empty");

  int64_t zero = 0, ten = 10;
  assert_ok(fl_fold(ds, fl_bytes_of(&zero, 8), add_i64, NULL, 0, &out));
  assert_int_equal(fl_i64(fl_buf_bytes(&out)), 5050);
  /* As Spark: the zero is used once per partition and once more when merging. */
  assert_ok(fl_fold(ds, fl_bytes_of(&ten, 8), add_i64, NULL, 0, &out));
  assert_int_equal(fl_i64(fl_buf_bytes(&out)), 5050 + 10 * 9);
  assert_ok(fl_fold(empty, fl_bytes_of(&zero, 8), add_i64, NULL, 0, &out));
  assert_int_equal(fl_i64(fl_buf_bytes(&out)), 0);

  int64_t z3[3] = {0, 0, INT64_MIN}, s[3];
  assert_ok(fl_aggregate(ds, fl_bytes_of(z3, sizeof z3), stats_seq, stats_comb, NULL, 0, &out));
  memcpy(s, out.data, sizeof s);
  assert_int_equal(s[0], 5050);
  assert_int_equal(s[1], 100);
  assert_int_equal(s[2], 100);

  assert_fails_with(fl_reduce(ds, fail_on_merge, NULL, 0, &out), FL_EJOB, "merge refused");
  assert_int_equal(fl_aggregate(ds, fl_bytes_of(z3, 24), stats_seq, NULL, NULL, 0, &out), FL_EINVAL);
  fl_buf_free(&out);
  fl_dataset_free(empty);
  fl_dataset_free(ds);
}

static void test_tree_aggregate_depths(void **state) {
  (void)state;
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 10000, 1, 64, &ds));
  int64_t z3[3] = {0, 0, INT64_MIN};
  fl_buf out = FL_BUF_INIT;
  for (uint32_t depth = 1; depth <= 4; depth++) {
    comb_calls = 0;
    assert_ok(fl_tree_aggregate(ds, fl_bytes_of(z3, sizeof z3), stats_seq, counting_comb, NULL, 0, depth, &out));
    int64_t s[3];
    memcpy(s, out.data, sizeof s);
    assert_int_equal(s[0], 9999 * 10000 / 2);
    assert_int_equal(s[1], 10000);
    assert_int_equal(s[2], 9999);
    /* 64 partials need 63 merges in any tree, plus one for the zero at the root. */
    assert_int_equal(comb_calls, 64);
  }
  assert_fails_with(fl_tree_aggregate(ds, fl_bytes_of(z3, 24), stats_seq, stats_comb, NULL, 0, 0, &out),
                    FL_EINVAL, "depth");
  fl_buf_free(&out);
  fl_dataset_free(ds);
}

static void test_foreach_with_accumulator(void **state) {
  (void)state;
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 1000, 1, 9, &ds));
  fl_accumulator *acc;
  assert_ok(fl_accumulator_create_i64(ctx, &acc));
  uint64_t id = fl_accumulator_id(acc);
  assert_ok(fl_foreach(ds, count_into, &id, sizeof id));
  int64_t v;
  assert_ok(fl_accumulator_value_i64(acc, &v));
  assert_int_equal(v, 999 * 1000 / 2);
  double d;
  assert_int_equal(fl_accumulator_value_f64(acc, &d), FL_EINVAL); /* wrong kind */
  /* Outside a task, adding is a state error, not a crash. */
  assert_int_equal(fl_accumulator_add_i64(id, 1), FL_ESTATE);
  fl_accumulator_destroy(acc);
  fl_dataset_free(ds);
}

static void test_save_as_text_file_round_trip(void **state) {
  (void)state;
  char dir[256], out[300], path[400];
  test_tmpdir(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/out", dir);
  const char *lines[] = {"alpha", "", "gamma delta", "epsilon"};
  fl_bytes recs[4];
  for (int i = 0; i < 4; i++) recs[i] = fl_bytes_str(lines[i]);
  fl_dataset *ds, *back;
  assert_ok(fl_parallelize(ctx, recs, 4, 3, &ds));
  assert_ok(fl_save_as_text_file(ds, out));
  snprintf(path, sizeof path, "%s/_SUCCESS", out);
  assert_int_equal(access(path, F_OK), 0);
  snprintf(path, sizeof path, "%s/part-00002", out);
  assert_int_equal(access(path, F_OK), 0);
  assert_ok(fl_text_file(ctx, out, 1, &back));
  fl_records *r;
  assert_ok(fl_collect(back, &r));
  assert_int_equal(fl_records_count(r), 4);
  for (int i = 0; i < 4; i++) {
    fl_bytes b = fl_records_get(r, (size_t)i);
    assert_int_equal(b.len, strlen(lines[i]));
    assert_memory_equal(b.data, lines[i], b.len);
  }
  fl_records_free(r);
  assert_fails_with(fl_save_as_text_file(ds, out), FL_EEXIST, "already exists");
  fl_dataset_free(back);
  fl_dataset_free(ds);
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_count_collect_many_shapes),
      cmocka_unit_test(test_take_and_first),
      cmocka_unit_test(test_reduce_fold_aggregate),
      cmocka_unit_test(test_tree_aggregate_depths),
      cmocka_unit_test(test_foreach_with_accumulator),
      cmocka_unit_test(test_save_as_text_file_round_trip),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
