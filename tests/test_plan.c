/* test_plan.c: plans (rdd/plan.c). Every operation and action is built in context A,
 * encoded, decoded into a plan over context B, run in both, and the results compared
 * exactly; then known ids, stored re-encoding, release, functions that cannot be named,
 * unresolved decoding, and malformed plans. The user functions below are exported (the
 * test is linked with -rdynamic), so the test codec resolves them with dlsym. */
#include <dlfcn.h>

#include "test_util.h"

#include "proto/plan.pb-c.h"
#include "rdd/rdd.h"

/* ---- the codec: main-program functions allowed, resolved with dlsym ----------------------- */

static fl_status test_library_id(void *arg, const char *path, bool in_main, char *id, size_t id_len) {
  (void)arg;
  snprintf(id, id_len, "%s", in_main ? "main" : path);
  return FL_OK;
}
static fl_status test_resolve(void *arg, const char *id, const char *symbol, void (**fn)(void)) {
  (void)arg, (void)id;
  void *p = dlsym(RTLD_DEFAULT, symbol);
  if (!p) return fl_set_error(FL_ENOENT, "no symbol %s", symbol);
  *fn = (void (*)(void))(uintptr_t)p;
  return FL_OK;
}
static fl_status refusing_library_id(void *arg, const char *path, bool in_main, char *id, size_t id_len) {
  (void)arg, (void)path, (void)id, (void)id_len;
  if (in_main) return fl_set_error(FL_EINVAL, "functions of the main program cannot be shipped");
  return FL_OK;
}
static const rdd_fn_codec codec = {test_library_id, test_resolve, NULL};

/* ---- user functions (exported) ----------------------------------------------------------- */

fl_status plan_square(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t v = fl_i64(rec);
  return fl_buf_put_i64(out, v * v);
}
fl_status plan_add_arg(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) + *(const int64_t *)arg);
}
fl_status plan_mod_key(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) % *(const int64_t *)arg);
}
fl_status plan_keep_even(fl_bytes rec, bool *keep, const void *arg) {
  (void)arg;
  *keep = fl_i64(rec) % 2 == 0;
  return FL_OK;
}
fl_status plan_twice(fl_bytes rec, fl_emitter *out, const void *arg) {
  (void)arg;
  fl_status s = fl_emit(out, rec.data, rec.len);
  return s == FL_OK ? fl_emit(out, rec.data, rec.len) : s;
}
fl_status plan_partition_sum(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)arg;
  int64_t sum = partition;
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) sum += fl_i64(rec);
  return fl_emit(out, &sum, 8);
}
fl_status plan_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) + fl_i64(b));
}
fl_status plan_max(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) > fl_i64(b) ? fl_i64(a) : fl_i64(b));
}
fl_status plan_neg(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, -fl_i64(rec));
}
int plan_compare_desc_i64(fl_bytes a, fl_bytes b, const void *arg) {
  (void)arg;
  int64_t x = fl_i64(a), y = fl_i64(b);
  return (x < y) - (x > y);
}
uint32_t plan_partition_low(fl_bytes key, uint32_t n, const void *arg) {
  (void)arg;
  return (uint32_t)((uint64_t)fl_i64(key) % n);
}
fl_status plan_to_text(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  char line[32];
  int n = snprintf(line, sizeof line, "%lld", (long long)fl_i64(rec));
  return fl_buf_append(out, line, (size_t)n);
}
static atomic_llong foreach_sum;
fl_status plan_foreach_add(fl_bytes rec, const void *arg) {
  (void)arg;
  atomic_fetch_add(&foreach_sum, fl_i64(rec));
  return FL_OK;
}
/* Not exported: a plan cannot name it. */
static fl_status hidden_map(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_append(out, rec.data, rec.len);
}

/* ---- fixtures ------------------------------------------------------------------------------ */

typedef struct fixture {
  fl_context *a, *b;
  rdd_plan *plan;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  assert_ok(fl_context_open("local[2]", NULL, &f->a));
  assert_ok(fl_context_open("local[2]", NULL, &f->b));
  assert_ok(rdd_plan_create(f->b, &codec, &f->plan));
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  rdd_plan_destroy(f->plan);
  fl_context_close(f->a);
  fl_context_close(f->b);
  free(f);
  return 0;
}

/* Sends ds (and its lineage) to the plan over B; returns the decoded dataset (borrowed). */
static fl_dataset *send(fixture *f, fl_dataset *ds) {
  fl_buf buf = FL_BUF_INIT;
  assert_ok(rdd_plan_encode(ds, NULL, NULL, &codec, &buf));
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&buf)));
  fl_buf_free(&buf);
  rdd *r = rdd_plan_find(f->plan, ds->id);
  assert_non_null(r);
  assert_ptr_equal(r->ctx, f->b);
  assert_int_equal(r->num_partitions, ds->num_partitions);
  assert_int_equal(atomic_load(&r->level), atomic_load(&ds->level));
  return r;
}

static void assert_same_records(fl_records *x, fl_records *y) {
  assert_int_equal(fl_records_count(x), fl_records_count(y));
  for (size_t i = 0; i < fl_records_count(x); i++) {
    fl_bytes a = fl_records_get(x, i), b = fl_records_get(y, i);
    assert_int_equal(a.len, b.len);
    if (a.len) assert_memory_equal(a.data, b.data, a.len);
  }
}

/* Collects both in partition order and compares them exactly; returns the count. */
static size_t assert_same(fl_dataset *orig, fl_dataset *decoded) {
  fl_records *x, *y;
  assert_ok(fl_collect(orig, &x));
  assert_ok(fl_collect(decoded, &y));
  assert_same_records(x, y);
  size_t n = fl_records_count(x);
  fl_records_free(x);
  fl_records_free(y);
  return n;
}

/* Sends ds, compares, frees the caller's handle. */
static size_t check_roundtrip(fixture *f, fl_dataset *ds) {
  size_t n = assert_same(ds, send(f, ds));
  fl_dataset_free(ds);
  return n;
}

static fl_dataset *nums(fixture *f, int64_t n, uint32_t parts) {
  fl_dataset *ds;
  assert_ok(fl_range(f->a, 0, n, 1, parts, &ds));
  return ds;
}

/* Pairs (i % 7, i) for i in [0, n). */
static fl_dataset *pairs(fixture *f, int64_t n, uint32_t parts) {
  fl_dataset *r = nums(f, n, parts), *p;
  int64_t m = 7;
  assert_ok(fl_key_by(r, plan_mod_key, &m, sizeof m, &p));
  fl_dataset_free(r);
  return p;
}

/* ---- every operation ---------------------------------------------------------------------- */

static void edited(const fl_buf *good, size_t index, void (*edit)(Flint__PlanNode *), fl_buf *out);
static size_t node_with_op(const fl_buf *good, const char *op);
static fl_status try_add(fixture *f, fl_bytes bytes);
static void relative_checkpoint(Flint__PlanNode *n) { n->checkpoint = "relative/dir"; }

static void test_sources(void **state) {
  fixture *f = *state;
  fl_bytes recs[50];
  char text[50][8];
  for (int i = 0; i < 50; i++) {
    snprintf(text[i], sizeof text[i], "r%d", i);
    recs[i] = fl_bytes_str(text[i]);
  }
  fl_dataset *ds;
  assert_ok(fl_parallelize(f->a, recs, 50, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 50);
  assert_ok(fl_parallelize(f->a, NULL, 0, 2, &ds));
  assert_int_equal(check_roundtrip(f, ds), 0);
  assert_ok(fl_range(f->a, 100, -7, -3, 4, &ds));
  assert_int_equal(check_roundtrip(f, ds), 36);

  char dir[256], path[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/lines.txt", dir);
  char body[4000];
  size_t len = 0;
  for (int i = 0; i < 300; i++) len += (size_t)snprintf(body + len, sizeof body - len, "line %d\n", i);
  test_write_file(path, body, len);
  assert_ok(fl_text_file(f->a, path, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 300);
  snprintf(path, sizeof path, "%s/recs.bin", dir);
  int64_t bin[200];
  for (int i = 0; i < 200; i++) bin[i] = i * 3;
  test_write_file(path, bin, sizeof bin);
  assert_ok(fl_binary_records(f->a, path, 16, &ds));
  assert_int_equal(check_roundtrip(f, ds), 100);

  /* A checkpointed dataset travels as its folder (and its partitioner); the receiver reads
   * the files. A relative folder is refused. */
  fl_dataset *red, *p = pairs(f, 60, 3);
  assert_ok(fl_reduce_by_key(p, plan_sum, NULL, 0, NULL, 4, &red));
  fl_dataset_free(p);
  assert_ok(fl_checkpoint(red, dir));
  assert_int_equal(strcmp(red->ops->name, "checkpoint"), 0);
  fl_buf enc = FL_BUF_INIT, bad = FL_BUF_INIT;
  assert_ok(rdd_plan_encode(red, NULL, NULL, &codec, &enc));
  edited(&enc, node_with_op(&enc, "checkpoint"), relative_checkpoint, &bad);
  assert_fails_with(try_add(f, fl_buf_bytes(&bad)), FL_EPROTO, "not an absolute path");
  fl_buf_free(&enc);
  fl_buf_free(&bad);
  fl_dataset *decoded = send(f, red);
  assert_non_null(decoded->partitioner);
  assert_true(rdd_partitioner_equal(decoded->partitioner, red->partitioner));
  assert_int_equal(check_roundtrip(f, red), 7);
  test_rmtree(dir);
}

static void test_narrow(void **state) {
  fixture *f = *state;
  fl_dataset *r = nums(f, 1000, 4), *ds, *ds2;
  int64_t k = 5;
  assert_ok(fl_map(r, plan_square, NULL, 0, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_map(r, plan_add_arg, &k, sizeof k, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_filter(r, plan_keep_even, NULL, 0, &ds));
  assert_int_equal(check_roundtrip(f, ds), 500);
  assert_ok(fl_flat_map(r, plan_twice, NULL, 0, &ds));
  assert_int_equal(check_roundtrip(f, ds), 2000);
  assert_ok(fl_map_partitions(r, plan_partition_sum, NULL, 0, &ds));
  assert_int_equal(check_roundtrip(f, ds), 4);
  assert_ok(fl_key_by(r, plan_mod_key, &k, sizeof k, &ds));
  assert_ok(fl_map_values(ds, plan_neg, NULL, 0, &ds2));
  fl_dataset_free(ds);
  check_roundtrip(f, ds2);
  assert_ok(fl_sample(r, false, 0.3, 42, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_sample(r, true, 1.5, 7, &ds));
  check_roundtrip(f, ds);
  fl_dataset *other = nums(f, 10, 3);
  assert_ok(fl_union(r, other, &ds));
  assert_int_equal(check_roundtrip(f, ds), 1010);
  fl_dataset_free(other);
  assert_ok(fl_coalesce(r, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 1000);
  assert_ok(fl_zip_with_index(r, &ds));
  assert_int_equal(check_roundtrip(f, ds), 1000);
  fl_dataset_free(r);
}

static void test_cached(void **state) {
  fixture *f = *state;
  fl_dataset *r = nums(f, 500, 3), *sq;
  assert_ok(fl_map(r, plan_square, NULL, 0, &sq));
  assert_ok(fl_persist(sq, FL_MEMORY_SER));
  fl_dataset *d = send(f, sq);
  assert_int_equal(atomic_load(&d->level), FL_MEMORY_SER);
  assert_same(sq, d);
  assert_same(sq, d); /* from the cache in both */
  fl_storage_info info;
  assert_ok(fl_storage_info_get(d, &info));
  assert_int_equal(info.cached_partitions, 3);
  fl_dataset_free(sq);
  fl_dataset_free(r);
}

static void test_shuffles(void **state) {
  fixture *f = *state;
  fl_dataset *p = pairs(f, 2000, 4), *ds;
  int64_t zero = 0;
  assert_ok(fl_reduce_by_key(p, plan_sum, NULL, 0, NULL, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 7);
  assert_ok(fl_fold_by_key(p, fl_bytes_of(&zero, 8), plan_sum, NULL, 0, NULL, 2, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_aggregate_by_key(p, fl_bytes_of(&zero, 8), plan_max, plan_sum, NULL, 0, NULL, 0, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_combine_by_key(p, plan_neg, plan_sum, plan_sum, NULL, 0, NULL, 5, false, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_group_by_key(p, NULL, 3, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_sort_by_key(p, false, plan_compare_desc_i64, NULL, 0, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 2000);
  assert_ok(fl_sort_by_key(p, true, NULL, NULL, 0, 4, &ds));
  check_roundtrip(f, ds);
  assert_ok(fl_distinct(p, 3, &ds));
  assert_int_equal(check_roundtrip(f, ds), 2000);
  assert_ok(fl_repartition(p, 5, &ds));
  assert_int_equal(check_roundtrip(f, ds), 2000);

  fl_partitioner *custom;
  assert_ok(fl_partitioner_custom(3, plan_partition_low, NULL, 0, &custom));
  fl_dataset *placed;
  assert_ok(fl_partition_by(p, custom, &placed));
  fl_dataset *d = send(f, placed);
  assert_non_null(d->partitioner);
  assert_int_equal(d->partitioner->kind, PARTITIONER_CUSTOM);
  assert_same(placed, d);

  fl_dataset *q = pairs(f, 300, 2);
  assert_ok(fl_cogroup(p, q, NULL, 4, &ds));
  check_roundtrip(f, ds);
  for (int kind = FL_JOIN_INNER; kind <= FL_JOIN_FULL; kind++) {
    assert_ok(fl_join(p, q, (fl_join_kind)kind, NULL, 3, &ds));
    check_roundtrip(f, ds);
  }
  assert_ok(fl_subtract_by_key(p, q, NULL, 2, &ds));
  check_roundtrip(f, ds);
  /* Co-partitioned: the placed input is read narrowly, q through a shuffle. */
  assert_ok(fl_join(placed, q, FL_JOIN_INNER, custom, 0, &ds));
  rdd *cg = ds->parents[0];
  assert_int_equal(cg->num_parents, 1);
  assert_int_equal(cg->num_shuffle_deps, 1);
  d = send(f, ds);
  rdd *dcg = d->parents[0];
  assert_int_equal(dcg->num_parents, 1);
  assert_int_equal(dcg->num_shuffle_deps, 1);
  assert_int_equal(dcg->shuffle_deps[0]->shuffle_id, cg->shuffle_deps[0]->shuffle_id);
  assert_non_null(rdd_plan_find_shuffle(f->plan, cg->shuffle_deps[0]->shuffle_id));
  assert_same(ds, d);
  fl_dataset_free(ds);

  fl_partitioner_free(custom);
  fl_dataset_free(placed);
  fl_dataset_free(q);
  fl_dataset_free(p);
}

/* Public actions on decoded datasets run through B, with flint's own functions there. */
static void test_public_actions(void **state) {
  fixture *f = *state;
  fl_dataset *p = pairs(f, 777, 3);
  fl_dataset *d = send(f, p);
  fl_records *x, *y;
  assert_ok(fl_count_by_key(p, &x));
  assert_ok(fl_count_by_key(d, &y));
  assert_same_records(x, y);
  fl_records_free(x);
  fl_records_free(y);
  uint64_t n1, n2;
  assert_ok(fl_count(p, &n1));
  assert_ok(fl_count(d, &n2));
  assert_int_equal(n1, n2);
  assert_ok(fl_take(p, 10, &x));
  assert_ok(fl_take(d, 10, &y));
  assert_same_records(x, y);
  fl_records_free(x);
  fl_records_free(y);
  fl_dataset *r = nums(f, 1000, 4);
  d = send(f, r);
  fl_buf a = FL_BUF_INIT, b = FL_BUF_INIT;
  int64_t zero = 0;
  assert_ok(fl_reduce(r, plan_sum, NULL, 0, &a));
  assert_ok(fl_reduce(d, plan_sum, NULL, 0, &b));
  assert_int_equal(fl_i64(fl_buf_bytes(&a)), fl_i64(fl_buf_bytes(&b)));
  assert_ok(fl_fold(r, fl_bytes_of(&zero, 8), plan_max, NULL, 0, &a));
  assert_ok(fl_fold(d, fl_bytes_of(&zero, 8), plan_max, NULL, 0, &b));
  assert_int_equal(fl_i64(fl_buf_bytes(&a)), 999);
  assert_int_equal(fl_i64(fl_buf_bytes(&b)), 999);
  assert_ok(fl_aggregate(r, fl_bytes_of(&zero, 8), plan_sum, plan_sum, NULL, 0, &a));
  assert_ok(fl_aggregate(d, fl_bytes_of(&zero, 8), plan_sum, plan_sum, NULL, 0, &b));
  assert_int_equal(fl_i64(fl_buf_bytes(&a)), fl_i64(fl_buf_bytes(&b)));
  fl_buf_free(&a);
  fl_buf_free(&b);
  fl_dataset_free(r);
  fl_dataset_free(p);
}

/* Runs `action` on every partition of r and returns the results joined. */
static void run_action(fl_dataset *r, const rdd_action *action, fl_buf *joined) {
  fl_buf *res = calloc(r->num_partitions, sizeof *res);
  assert_ok(rdd_run_job(r, NULL, r->num_partitions, action, res));
  joined->len = 0;
  for (uint32_t i = 0; i < r->num_partitions; i++) {
    assert_ok(fl_buf_append(joined, res[i].data, res[i].len));
    fl_buf_free(&res[i]);
  }
  free(res);
}

/* An action encoded, decoded and run on the decoded dataset gives what it gives on A. */
static void check_action(fixture *f, fl_dataset *r, const rdd_action *action) {
  fl_dataset *d = send(f, r);
  fl_buf enc = FL_BUF_INIT, x = FL_BUF_INIT, y = FL_BUF_INIT;
  assert_ok(rdd_action_encode(action, &codec, &enc));
  rdd_action decoded;
  assert_ok(rdd_action_decode(f->plan, fl_buf_bytes(&enc), &decoded));
  assert_int_equal(decoded.kind, action->kind);
  assert_int_equal(decoded.arg_len, action->arg_len);
  run_action(r, action, &x);
  run_action(d, &decoded, &y);
  assert_int_equal(x.len, y.len);
  if (x.len) assert_memory_equal(x.data, y.data, x.len);
  rdd_action_clear(&decoded);
  fl_buf_free(&enc);
  fl_buf_free(&x);
  fl_buf_free(&y);
}

static void test_actions(void **state) {
  fixture *f = *state;
  fl_dataset *r = nums(f, 1234, 4);
  int64_t zero = 10, arg = 3;
  rdd_action count = {.kind = RDD_ACTION_COUNT};
  check_action(f, r, &count);
  rdd_action collect = {.kind = RDD_ACTION_COLLECT, .limit = 17};
  check_action(f, r, &collect);
  rdd_action reduce = {.kind = RDD_ACTION_AGGREGATE, .seq = plan_sum};
  check_action(f, r, &reduce);
  rdd_action fold = {.kind = RDD_ACTION_AGGREGATE, .seq = plan_max, .zero = fl_bytes_of(&zero, 8),
                     .has_zero = true, .arg = &arg, .arg_len = sizeof arg};
  check_action(f, r, &fold);

  atomic_store(&foreach_sum, 0);
  rdd_action each = {.kind = RDD_ACTION_FOREACH, .foreach_fn = plan_foreach_add};
  check_action(f, r, &each);
  assert_int_equal(atomic_load(&foreach_sum), 2 * (1233 * 1234 / 2));

  char dir[256], out_a[300], out_b[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(out_a, sizeof out_a, "%s/a", dir);
  snprintf(out_b, sizeof out_b, "%s/b", dir);
  fl_dataset *text;
  assert_ok(fl_map(r, plan_to_text, NULL, 0, &text));
  fl_dataset *d = send(f, text);
  rdd_action save = {.kind = RDD_ACTION_SAVE_TEXT, .path = out_b};
  fl_buf enc = FL_BUF_INIT, res = FL_BUF_INIT;
  assert_ok(rdd_action_encode(&save, &codec, &enc));
  rdd_action decoded;
  assert_ok(rdd_action_decode(f->plan, fl_buf_bytes(&enc), &decoded));
  assert_string_equal(decoded.path, out_b);
  assert_int_equal(mkdir(out_b, 0755), 0);
  run_action(d, &decoded, &res);
  rdd_action_clear(&decoded);
  assert_ok(fl_save_as_text_file(text, out_a));
  for (uint32_t p = 0; p < text->num_partitions; p++) {
    char pa[400], pb[400], ca[20000], cb[20000];
    snprintf(pa, sizeof pa, "%s/part-%05u", out_a, p);
    snprintf(pb, sizeof pb, "%s/part-%05u", out_b, p);
    FILE *fa = fopen(pa, "r"), *fb = fopen(pb, "r");
    assert_non_null(fa);
    assert_non_null(fb);
    size_t na = fread(ca, 1, sizeof ca, fa), nb = fread(cb, 1, sizeof cb, fb);
    fclose(fa);
    fclose(fb);
    assert_int_equal(na, nb);
    assert_memory_equal(ca, cb, na);
  }
  fl_buf_free(&enc);
  fl_buf_free(&res);
  fl_dataset_free(text);
  test_rmtree(dir);
  fl_dataset_free(r);
}

/* ---- known ids, stored bytes, release ------------------------------------------------------ */

typedef struct id_set {
  uint64_t ids[8];
  int n;
} id_set;
static bool in_set(void *arg, uint64_t id) {
  id_set *s = arg;
  for (int i = 0; i < s->n; i++)
    if (s->ids[i] == id) return true;
  return false;
}

/* Node ids of an encoded plan, in order. */
static int plan_ids(fl_buf *buf, uint64_t *ids, int max) {
  Flint__Plan *plan = flint__plan__unpack(NULL, buf->len, buf->data);
  assert_non_null(plan);
  int n = 0;
  for (size_t i = 0; i < plan->n_nodes && n < max; i++) {
    Flint__PlanNode *node = flint__plan_node__unpack(NULL, plan->nodes[i].len, plan->nodes[i].data);
    assert_non_null(node);
    ids[n++] = node->id;
    flint__plan_node__free_unpacked(node, NULL);
  }
  flint__plan__free_unpacked(plan, NULL);
  return n;
}

static void test_known_and_stored(void **state) {
  fixture *f = *state;
  fl_dataset *r = nums(f, 100, 2), *sq, *ev;
  assert_ok(fl_map(r, plan_square, NULL, 0, &sq));
  assert_ok(fl_filter(sq, plan_keep_even, NULL, 0, &ev));
  fl_buf all = FL_BUF_INIT, part = FL_BUF_INIT;
  assert_ok(rdd_plan_encode(ev, NULL, NULL, &codec, &all));
  uint64_t ids[8];
  assert_int_equal(plan_ids(&all, ids, 8), 3);
  assert_int_equal(ids[0], r->id); /* parents first */
  assert_int_equal(ids[1], sq->id);
  assert_int_equal(ids[2], ev->id);
  id_set known = {{sq->id}, 1};
  assert_ok(rdd_plan_encode(ev, in_set, &known, &codec, &part));
  assert_int_equal(plan_ids(&part, ids, 8), 1); /* sq and its ancestor r skipped */
  assert_int_equal(ids[0], ev->id);
  /* Without its parent the part is refused, and the plan is left as it was. */
  assert_fails_with(rdd_plan_add(f->plan, fl_buf_bytes(&part)), FL_EPROTO, "not in the plan");
  assert_null(rdd_plan_find(f->plan, ev->id));
  /* Parent first, then the part. */
  fl_buf head = FL_BUF_INIT;
  assert_ok(rdd_plan_encode(sq, NULL, NULL, &codec, &head));
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&head)));
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&part)));
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&all))); /* all known: nothing new */
  rdd *d = rdd_plan_find(f->plan, ev->id);
  assert_same(ev, d);

  /* Stored bytes come back as they were sent, and decode in another plan. */
  fl_buf stored = FL_BUF_INIT;
  assert_ok(rdd_plan_encode_stored(f->plan, ev->id, NULL, NULL, &stored));
  assert_int_equal(stored.len, all.len);
  assert_memory_equal(stored.data, all.data, all.len);
  stored.len = 0;
  assert_ok(rdd_plan_encode_stored(f->plan, ev->id, in_set, &known, &stored));
  assert_int_equal(stored.len, part.len);
  assert_memory_equal(stored.data, part.data, part.len);
  assert_int_equal(rdd_plan_encode_stored(f->plan, 999999, NULL, NULL, &stored), FL_ENOENT);

  fl_context *c;
  assert_ok(fl_context_open("local[2]", NULL, &c));
  rdd_plan *other;
  assert_ok(rdd_plan_create(c, &codec, &other));
  assert_ok(rdd_plan_add(other, fl_buf_bytes(&all)));
  assert_same(ev, rdd_plan_find(other, ev->id));
  rdd_plan_destroy(other);
  fl_context_close(c);

  /* Releasing the middle keeps it (ev needs it); releasing ev drops both. */
  rdd_plan_release(f->plan, sq->id);
  assert_non_null(rdd_plan_find(f->plan, sq->id));
  rdd_plan_release(f->plan, ev->id);
  assert_null(rdd_plan_find(f->plan, ev->id));
  assert_null(rdd_plan_find(f->plan, sq->id));
  assert_non_null(rdd_plan_find(f->plan, r->id)); /* still held */
  rdd_plan_release(f->plan, r->id);
  assert_null(rdd_plan_find(f->plan, r->id));
  rdd_plan_release(f->plan, 424242); /* unknown: ignored */

  fl_buf_free(&all);
  fl_buf_free(&part);
  fl_buf_free(&head);
  fl_buf_free(&stored);
  fl_dataset_free(ev);
  fl_dataset_free(sq);
  fl_dataset_free(r);
}

/* ---- functions that cannot travel, and decoding without resolving ----------------------------- */

static void test_unnamed_functions(void **state) {
  fixture *f = *state;
  fl_dataset *r = nums(f, 10, 2), *m;
  assert_ok(fl_map(r, hidden_map, NULL, 0, &m));
  fl_buf buf = FL_BUF_INIT;
  char want[64];
  snprintf(want, sizeof want, "of dataset %llu is not exported", (unsigned long long)m->id);
  assert_fails_with(rdd_plan_encode(m, NULL, NULL, &codec, &buf), FL_EINVAL, want);
  assert_non_null(strstr(fl_last_error(), "map function at test_plan+0x"));
  assert_non_null(strstr(fl_last_error(), "make it non-static"));
  fl_dataset_free(m);

  assert_ok(fl_map(r, plan_square, NULL, 0, &m));
  rdd_fn_codec refusing = {refusing_library_id, NULL, NULL};
  buf.len = 0;
  assert_fails_with(rdd_plan_encode(m, NULL, NULL, &refusing, &buf), FL_EINVAL,
                    "map function 'plan_square' of dataset");
  assert_non_null(strstr(fl_last_error(), "cannot be shipped"));
  /* flint's own functions need no codec at all. */
  fl_dataset *dist;
  assert_ok(fl_distinct(r, 2, &dist));
  buf.len = 0;
  assert_ok(rdd_plan_encode(dist, NULL, NULL, NULL, &buf));
  assert_int_equal(plan_ids(&buf, (uint64_t[8]){0}, 8), 4);
  fl_dataset_free(dist);
  fl_buf_free(&buf);
  fl_dataset_free(m);
  fl_dataset_free(r);
}

static void test_unresolved(void **state) {
  fixture *f = *state;
  fl_dataset *p = pairs(f, 100, 3), *red, *sorted;
  assert_ok(fl_reduce_by_key(p, plan_sum, NULL, 0, NULL, 4, &red));
  assert_ok(fl_sort_by_key(red, true, plan_compare_desc_i64, NULL, 0, 2, &sorted));
  fl_buf buf = FL_BUF_INIT;
  assert_ok(rdd_plan_encode(sorted, NULL, NULL, &codec, &buf));
  rdd_plan *driver;
  assert_ok(rdd_plan_create(f->b, NULL, &driver));
  assert_ok(rdd_plan_add(driver, fl_buf_bytes(&buf)));
  rdd *d = rdd_plan_find(driver, sorted->id);
  assert_non_null(d);
  assert_int_equal(d->num_partitions, sorted->num_partitions);
  assert_int_equal(d->num_shuffle_deps, 1);
  const rdd_shuffle_dep *dep = rdd_plan_find_shuffle(driver, sorted->shuffle_deps[0]->shuffle_id);
  assert_ptr_equal(dep, d->shuffle_deps[0]);
  assert_int_equal(dep->parent->id, red->id);
  assert_int_equal(dep->parent->shuffle_deps[0]->parent->num_partitions, 3);
  assert_non_null(d->fn); /* a placeholder, never called here */
  assert_ptr_not_equal(d->fn, (void (*)(void))plan_compare_desc_i64);
  /* ... and forwards the same bytes. */
  fl_buf stored = FL_BUF_INIT;
  assert_ok(rdd_plan_encode_stored(driver, sorted->id, NULL, NULL, &stored));
  assert_int_equal(stored.len, buf.len);
  assert_memory_equal(stored.data, buf.data, buf.len);
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&stored)));
  assert_same(sorted, rdd_plan_find(f->plan, sorted->id));
  rdd_plan_destroy(driver);
  fl_buf_free(&buf);
  fl_buf_free(&stored);
  fl_dataset_free(sorted);
  fl_dataset_free(red);
  fl_dataset_free(p);
}

/* ---- malformed plans ---------------------------------------------------------------------- */

/* A valid plan with one node of each kind that carries data. */
static void sample_plan(fixture *f, fl_buf *out) {
  fl_bytes recs[3] = {fl_bytes_str("a"), fl_bytes_str("bb"), fl_bytes_str("")};
  fl_dataset *par, *p, *u, *red, *j, *z, *srt;
  assert_ok(fl_parallelize(f->a, recs, 3, 2, &par));
  p = pairs(f, 50, 2);
  assert_ok(fl_union(par, par, &u));
  assert_ok(fl_zip_with_index(u, &z));
  assert_ok(fl_reduce_by_key(p, plan_sum, NULL, 0, NULL, 3, &red));
  assert_ok(fl_join(red, z, FL_JOIN_LEFT, NULL, 2, &j));
  assert_ok(fl_sort_by_key(j, false, NULL, NULL, 0, 3, &srt));
  assert_ok(rdd_plan_encode(srt, NULL, NULL, &codec, out));
  fl_dataset *all[] = {par, p, u, red, j, z, srt};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) fl_dataset_free(all[i]);
}

/* Decodes bytes into a fresh plan; returns the status (the plan must be empty after a failure). */
static fl_status try_add(fixture *f, fl_bytes bytes) {
  rdd_plan *p;
  assert_ok(rdd_plan_create(f->b, &codec, &p));
  fl_status s = rdd_plan_add(p, bytes);
  if (s != FL_OK) assert_true(strlen(fl_last_error()) > 0);
  rdd_plan_destroy(p);
  return s;
}

static void test_truncated_and_random(void **state) {
  fixture *f = *state;
  fl_buf good = FL_BUF_INIT;
  sample_plan(f, &good);
  assert_int_equal(try_add(f, fl_buf_bytes(&good)), FL_OK);
  int failed = 0;
  for (size_t len = 0; len < good.len; len++) {
    fl_status s = try_add(f, fl_bytes_of(good.data, len));
    if (s != FL_OK) {
      failed++;
      assert_true(s == FL_EPROTO);
    }
  }
  assert_true(failed > (int)good.len / 2);
  common_rng rng;
  common_rng_seed(&rng, 1234);
  uint8_t junk[512];
  for (int i = 0; i < 300; i++) {
    size_t len = common_rng_next(&rng) % sizeof junk;
    for (size_t k = 0; k < len; k++) junk[k] = (uint8_t)common_rng_next(&rng);
    try_add(f, fl_bytes_of(junk, len));
  }
  /* Flipped bytes in a valid plan: anything but a crash or a leak. FLINT_PLAN_FUZZ raises
   * the number of rounds for a longer run by hand. */
  int flip_rounds = getenv("FLINT_PLAN_FUZZ") ? atoi(getenv("FLINT_PLAN_FUZZ")) : 1000;
  uint8_t *copy = malloc(good.len);
  for (int i = 0; i < flip_rounds; i++) {
    memcpy(copy, good.data, good.len);
    int flips = 1 + (int)(common_rng_next(&rng) % 3);
    for (int k = 0; k < flips; k++) copy[common_rng_next(&rng) % good.len] ^= (uint8_t)(1u << (common_rng_next(&rng) % 8));
    try_add(f, fl_bytes_of(copy, good.len));
  }
  free(copy);
  fl_buf_free(&good);
}

/* Edits point message fields at static data, so the edited messages come from an arena
 * that is freed as a whole rather than by free_unpacked. */
static void *arena_ptrs[4096];
static size_t arena_count;
static void *arena_alloc(void *data, size_t size) {
  (void)data;
  assert_true(arena_count < sizeof arena_ptrs / sizeof *arena_ptrs);
  return arena_ptrs[arena_count++] = malloc(size ? size : 1);
}
static void arena_free(void *data, void *p) { (void)data, (void)p; }
static void arena_release(void) {
  for (size_t i = 0; i < arena_count; i++) free(arena_ptrs[i]);
  arena_count = 0;
}
static ProtobufCAllocator arena = {arena_alloc, arena_free, NULL};

/* Re-encodes `good` after `edit` changed node `index` (the rest as they were). */
static void edited(const fl_buf *good, size_t index, void (*edit)(Flint__PlanNode *), fl_buf *out) {
  Flint__Plan *plan = flint__plan__unpack(&arena, good->len, good->data);
  assert_non_null(plan);
  assert_true(index < plan->n_nodes);
  Flint__PlanNode *node = flint__plan_node__unpack(&arena, plan->nodes[index].len, plan->nodes[index].data);
  assert_non_null(node);
  edit(node);
  size_t len = flint__plan_node__get_packed_size(node);
  uint8_t *bytes = malloc(len ? len : 1);
  flint__plan_node__pack(node, bytes);
  plan->nodes[index] = (ProtobufCBinaryData){len, bytes};
  out->len = 0;
  assert_ok(fl_buf_reserve(out, flint__plan__get_packed_size(plan)));
  out->len = flint__plan__pack(plan, out->data);
  free(bytes);
  arena_release();
}

/* Index of the first node with this op in `good`. */
static size_t node_with_op(const fl_buf *good, const char *op) {
  Flint__Plan *plan = flint__plan__unpack(NULL, good->len, good->data);
  size_t found = SIZE_MAX;
  for (size_t i = 0; i < plan->n_nodes && found == SIZE_MAX; i++) {
    Flint__PlanNode *node = flint__plan_node__unpack(NULL, plan->nodes[i].len, plan->nodes[i].data);
    if (strcmp(node->op, op) == 0) found = i;
    flint__plan_node__free_unpacked(node, NULL);
  }
  flint__plan__free_unpacked(plan, NULL);
  assert_true(found != SIZE_MAX);
  return found;
}

static void wrong_parent(Flint__PlanNode *n) { n->parents[0] = 987654321; }
static void more_partitions(Flint__PlanNode *n) { n->num_partitions++; }
static void huge_partitions(Flint__PlanNode *n) { n->num_partitions = UINT32_MAX; }
static void unknown_op(Flint__PlanNode *n) { n->op = "teleport"; }
static void zero_id(Flint__PlanNode *n) { n->id = 0; }
static void bad_level(Flint__PlanNode *n) { n->level = 9; }
static void unknown_builtin(Flint__PlanNode *n) { n->fn->builtin = "shuffle.no_such_fn"; }
static void unknown_symbol(Flint__PlanNode *n) { n->fn->symbol = "plan_no_such_symbol"; }
static void no_fn(Flint__PlanNode *n) { n->fn = NULL; }
static void bad_mode(Flint__PlanNode *n) { n->shuffled->mode = 7; }
static void drop_inputs(Flint__PlanNode *n) { n->shuffled->n_inputs = 0; }
static void reused_shuffle_id(Flint__PlanNode *n) { n->shuffled->inputs[0]->shuffle_id = n->id; }
static void too_many_bounds(Flint__PlanNode *n) {
  static ProtobufCBinaryData bounds[5] = {{1, (uint8_t *)"a"}, {1, (uint8_t *)"b"}, {1, (uint8_t *)"c"},
                                          {1, (uint8_t *)"d"}, {1, (uint8_t *)"e"}};
  n->partitioner->n_bounds = 5;
  n->partitioner->bounds = bounds;
}
static void bad_partitioner_kind(Flint__PlanNode *n) { n->partitioner->kind = 3; }
static void short_starts(Flint__PlanNode *n) { n->n_starts--; }
static void bad_records(Flint__PlanNode *n) {
  static uint8_t junk[] = {0x7f, 'x'};
  n->partitions[0] = (ProtobufCBinaryData){sizeof junk, junk};
}
static void union_one_parent(Flint__PlanNode *n) { n->n_parents = 1; }
static void join_bad_arg(Flint__PlanNode *n) {
  static int kind = 9;
  n->arg = (ProtobufCBinaryData){sizeof kind, (uint8_t *)&kind};
}

static void test_malformed_nodes(void **state) {
  fixture *f = *state;
  fl_buf good = FL_BUF_INIT, bad = FL_BUF_INIT;
  sample_plan(f, &good);
  struct {
    const char *op;
    void (*edit)(Flint__PlanNode *);
    fl_status status;
    const char *needle;
  } cases[] = {
      {"union", wrong_parent, FL_EPROTO, "parent 987654321 is not in the plan"},
      {"key_by", more_partitions, FL_EPROTO, "partitions over a parent"},
      {"range", huge_partitions, FL_EPROTO, "4294967295 partitions"},
      {"union", unknown_op, FL_EPROTO, "unknown operation 'teleport'"},
      {"range", zero_id, FL_EPROTO, "dataset id 0"},
      {"key_by", bad_level, FL_EPROTO, "unknown storage level 9"},
      {"flat_map", unknown_builtin, FL_EPROTO, "unknown builtin 'shuffle.no_such_fn'"},
      {"key_by", unknown_symbol, FL_ENOENT, "plan_no_such_symbol"},
      {"key_by", no_fn, FL_EPROTO, "without a function"},
      {"shuffled", bad_mode, FL_EPROTO, "unknown shuffled mode 7"},
      {"shuffled", drop_inputs, FL_EPROTO, "0 inputs"},
      {"shuffled", reused_shuffle_id, FL_EPROTO, "already in use"},
      {"shuffled", too_many_bounds, FL_EPROTO, "bounds"},
      {"shuffled", bad_partitioner_kind, FL_EPROTO, "unknown partitioner kind 3"},
      {"zip_with_index", short_starts, FL_EPROTO, "starts for"},
      {"parallelize", bad_records, FL_EPROTO, "malformed"},
      {"union", union_one_parent, FL_EPROTO, "union with 1 parents"},
      {"flat_map", join_bad_arg, FL_EPROTO, "unfit for builtin 'shuffle.join_emit'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    edited(&good, node_with_op(&good, cases[i].op), cases[i].edit, &bad);
    assert_fails_with(try_add(f, fl_buf_bytes(&bad)), cases[i].status, cases[i].needle);
  }
  /* A failed add leaves an existing plan as it was: nothing half-added. */
  edited(&good, node_with_op(&good, "shuffled"), bad_mode, &bad);
  assert_int_equal(rdd_plan_add(f->plan, fl_buf_bytes(&bad)), FL_EPROTO);
  assert_ok(rdd_plan_add(f->plan, fl_buf_bytes(&good)));

  /* Actions. */
  rdd_action out;
  uint8_t junk[] = {0x08, 0x09}; /* kind 9 */
  assert_fails_with(rdd_action_decode(f->plan, fl_bytes_of(junk, 2), &out), FL_EPROTO, "unknown action kind 9");
  uint8_t trunc[] = {0x1a, 0x10, 0x0a};
  assert_fails_with(rdd_action_decode(f->plan, fl_bytes_of(trunc, 3), &out), FL_EPROTO, "PlanAction");
  fl_buf enc = FL_BUF_INIT;
  rdd_action foreach_no_fn = {.kind = RDD_ACTION_AGGREGATE};
  assert_ok(rdd_action_encode(&foreach_no_fn, &codec, &enc));
  assert_fails_with(rdd_action_decode(f->plan, fl_buf_bytes(&enc), &out), FL_EPROTO, "do not fit");
  rdd_action shuffle_write = {.kind = RDD_ACTION_SHUFFLE_WRITE};
  assert_int_equal(rdd_action_encode(&shuffle_write, &codec, &enc), FL_EINVAL);
  fl_buf_free(&enc);
  fl_buf_free(&good);
  fl_buf_free(&bad);
}

/* Every allocation of a decode failing in turn: FL_ENOMEM, the plan as it was, no leak. */
static void test_out_of_memory(void **state) {
  fixture *f = *state;
  fl_buf good = FL_BUF_INIT;
  sample_plan(f, &good);
  bool succeeded = false;
  for (long n = 0; !succeeded && n < 100000; n++) {
    rdd_plan *p;
    assert_ok(rdd_plan_create(f->b, &codec, &p));
    flint_test_fail_alloc_after(n);
    fl_status s = rdd_plan_add(p, fl_buf_bytes(&good));
    flint_test_fail_alloc_after(-1);
    if (s == FL_OK) succeeded = true;
    else assert_int_equal(s, FL_ENOMEM);
    rdd_plan_destroy(p);
  }
  assert_true(succeeded);
  fl_buf_free(&good);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_sources, setup, teardown),
      cmocka_unit_test_setup_teardown(test_narrow, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cached, setup, teardown),
      cmocka_unit_test_setup_teardown(test_shuffles, setup, teardown),
      cmocka_unit_test_setup_teardown(test_public_actions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_actions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_known_and_stored, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unnamed_functions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unresolved, setup, teardown),
      cmocka_unit_test_setup_teardown(test_truncated_and_random, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_nodes, setup, teardown),
      cmocka_unit_test_setup_teardown(test_out_of_memory, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
