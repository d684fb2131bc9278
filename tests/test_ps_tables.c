/*
 * test_ps_tables: flint/ps.h in a local context: tables on the context's own servers,
 * workers that are tasks (a map_partitions over a dataset, each partition a worker) or the
 * client itself, SSP between tasks, checkpoints and bad options.
 */
#include "test_util.h"

#include "flint/ps.h"

#define KEYS 64

typedef struct task_arg {
  uint8_t handle[4096];
  uint32_t handle_len;
  uint32_t staleness;
  uint32_t iterations;
} task_arg;

/* Worker `partition`: each iteration pulls the model (recording how stale it may be), pushes
 * a gradient of (partition + 1) on every key, and ends its clock. Emits, per iteration, the
 * clock it read at and the freshness the servers gave. */
static fl_status train_worker(uint32_t partition, fl_iter *in, fl_emitter *out, const void *varg) {
  (void)in;
  const task_arg *a = varg;
  fl_ps_worker *w;
  fl_status st = fl_ps_worker_open(fl_bytes_of(a->handle, a->handle_len), partition, &w);
  if (st != FL_OK) return st;
  fl_ps_worker_set_staleness(w, a->staleness);
  float model[KEYS], grad[KEYS];
  for (int k = 0; k < KEYS; k++) grad[k] = (float)(partition + 1);
  for (uint32_t it = 0; st == FL_OK && it < a->iterations; it++) {
    uint64_t t, fresh = 0, clock = fl_ps_worker_stats_get(w).clock;
    st = fl_ps_pull_range(w, 0, KEYS, model, &t);
    if (st == FL_OK) st = fl_ps_wait(w, t, &fresh);
    uint64_t rec[2] = {clock, fresh};
    if (st == FL_OK) st = fl_emit(out, rec, sizeof rec);
    if (st == FL_OK) st = fl_ps_push_range(w, 0, KEYS, grad, &t);
    if (st == FL_OK) st = fl_ps_wait(w, t, NULL);
    if (st == FL_OK) st = fl_ps_clock(w, &t);
    if (st == FL_OK) st = fl_ps_wait(w, t, NULL);
  }
  fl_ps_worker_close(w);
  return st;
}

static void run_workers(fl_context *ctx, fl_ps_table *t, uint32_t workers, uint32_t staleness, uint32_t iterations) {
  task_arg a = {.staleness = staleness, .iterations = iterations};
  fl_bytes h = fl_ps_table_handle(t);
  assert_true(h.len <= sizeof a.handle);
  memcpy(a.handle, h.data, h.len);
  a.handle_len = (uint32_t)h.len;
  fl_dataset *parts, *out;
  assert_int_equal(fl_range(ctx, 0, workers, 1, workers, &parts), FL_OK);
  assert_int_equal(fl_map_partitions(parts, train_worker, &a, sizeof a, &out), FL_OK);
  fl_records *recs;
  assert_int_equal(fl_collect(out, &recs), FL_OK);
  assert_int_equal(fl_records_count(recs), (size_t)workers * iterations);
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    uint64_t rec[2];
    memcpy(rec, fl_records_get(recs, i).data, sizeof rec);
    if (staleness != FL_PS_ASYNC) assert_true(rec[1] + staleness >= rec[0]); /* SSP's bound */
  }
  fl_records_free(recs);
  fl_dataset_free(out);
  fl_dataset_free(parts);
}

static void test_tasks_are_workers(void **state) {
  (void)state;
  const uint32_t bounds[] = {0, 2, FL_PS_ASYNC};
  for (int b = 0; b < 3; b++) {
    fl_context *ctx;
    assert_int_equal(fl_context_open("local[4]", NULL, &ctx), FL_OK);
    fl_ps_options o = FL_PS_OPTIONS_INIT;
    o.keys = KEYS;
    o.workers = 4;
    o.shards = 3;
    fl_ps_table *t;
    assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_OK);
    run_workers(ctx, t, 4, bounds[b], 10);
    /* The client reads the sum of every acknowledged push: 10 x (1 + 2 + 3 + 4). */
    fl_ps_worker *w;
    assert_int_equal(fl_ps_worker_open(fl_ps_table_handle(t), 0, &w), FL_OK);
    float v[KEYS];
    uint64_t tk;
    assert_int_equal(fl_ps_pull_range(w, 0, KEYS, v, &tk), FL_OK);
    assert_int_equal(fl_ps_wait(w, tk, NULL), FL_OK);
    for (int k = 0; k < KEYS; k++) assert_true(v[k] == 100.0f);
    fl_ps_worker_close(w);
    fl_ps_table_destroy(t);
    fl_context_close(ctx);
  }
}

static void test_save_load_and_destroy(void **state) {
  (void)state;
  fl_context *ctx;
  assert_int_equal(fl_context_open("local[2]", NULL, &ctx), FL_OK);
  fl_ps_options o = FL_PS_OPTIONS_INIT;
  o.sparse = true;
  o.width = 2;
  o.update = FL_PS_ADAGRAD;
  o.lr = 0.1f;
  fl_ps_table *t;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_OK);
  fl_ps_worker *w;
  assert_int_equal(fl_ps_worker_open(fl_ps_table_handle(t), 0, &w), FL_OK);
  uint64_t keys[3] = {1ull << 40, 17, 99999}, tk;
  float g[6] = {1, -1, 2, -2, 3, -3}, before[6], after[6];
  assert_int_equal(fl_ps_push(w, keys, 3, g, &tk), FL_OK);
  assert_int_equal(fl_ps_wait(w, tk, NULL), FL_OK);
  assert_int_equal(fl_ps_pull(w, keys, 3, before, &tk), FL_OK);
  assert_int_equal(fl_ps_wait(w, tk, NULL), FL_OK);
  char path[] = "/tmp/flint-pst-XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  assert_int_equal(fl_ps_table_save(t, path), FL_OK);
  assert_int_equal(fl_ps_push(w, keys, 3, g, &tk), FL_OK);
  assert_int_equal(fl_ps_wait(w, tk, NULL), FL_OK);
  assert_int_equal(fl_ps_table_load(t, path), FL_OK);
  assert_int_equal(fl_ps_pull(w, keys, 3, after, &tk), FL_OK);
  assert_int_equal(fl_ps_wait(w, tk, NULL), FL_OK);
  assert_memory_equal(before, after, sizeof before);
  /* Another table's checkpoint does not fit this one. */
  fl_ps_options o2 = FL_PS_OPTIONS_INIT;
  o2.keys = 10;
  o2.shards = 3;
  fl_ps_table *t2;
  assert_int_equal(fl_ps_table_create(ctx, &o2, &t2), FL_OK);
  assert_int_equal(fl_ps_table_load(t2, path), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "shards"));
  fl_ps_table_destroy(t2);
  unlink(path);
  /* Once destroyed, the table's shards are gone from the servers. */
  fl_ps_table_destroy(t);
  assert_int_equal(fl_ps_pull(w, keys, 3, after, &tk), FL_OK);
  assert_int_equal(fl_ps_wait(w, tk, NULL), FL_ENOENT);
  fl_ps_worker_close(w);
  fl_context_close(ctx);
}

static void test_bad_options_and_handles(void **state) {
  (void)state;
  fl_context *ctx;
  assert_int_equal(fl_context_open("local[2]", NULL, &ctx), FL_OK);
  fl_ps_table *t;
  fl_ps_options o = FL_PS_OPTIONS_INIT; /* dense with 0 keys */
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "fl_ps_table_create"));
  o.keys = 5;
  o.width = 0;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_EINVAL);
  o.width = 1;
  o.workers = 0;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "worker"));
  o.workers = 2;
  o.update = (fl_ps_update)9;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_EINVAL);
  o.update = FL_PS_SGD;
  o.lr = -1;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_EINVAL);
  o.lr = 0.1f;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_OK);
  fl_ps_worker *w;
  assert_int_equal(fl_ps_worker_open(fl_ps_table_handle(t), 2, &w), FL_EINVAL); /* worker 2 of 2 */
  assert_int_equal(fl_ps_worker_open(fl_bytes_str("not a handle"), 0, &w), FL_EFORMAT);
  fl_bytes h = fl_ps_table_handle(t);
  uint8_t *bad = malloc(h.len);
  memcpy(bad, h.data, h.len);
  bad[90] ^= 1;
  assert_int_equal(fl_ps_worker_open(fl_bytes_of(bad, h.len), 0, &w), FL_ECORRUPT);
  free(bad);
  assert_int_equal(fl_ps_push(NULL, NULL, 0, NULL, NULL), FL_EINVAL);
  fl_ps_table_destroy(t);
  fl_ps_table_destroy(NULL);
  fl_context_close(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tasks_are_workers),
      cmocka_unit_test(test_save_load_and_destroy),
      cmocka_unit_test(test_bad_options_and_handles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
