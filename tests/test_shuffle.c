/* test_shuffle.c: every wide operation against a naive reference computed here with plain
 * loops and qsort over the same generated input: on an empty dataset, empty partitions,
 * one partition and many, skewed keys, keys and values with zero bytes and 10 KB keys, into
 * 1, 3 and 16 partitions. Then the spill path (a tiny shuffle memory), reuse of shuffle
 * output and of partitioners (no new map stage), damaged shuffle files (a fetch failure
 * reruns the map task: the same results, never wrong data), and the error paths. */
#include "test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>

#include "shuffle/shuffle.h"

static fl_context *ctx; /* local[2] with an 8 MiB shuffle memory: nothing spills here */

static int setup(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.shuffle_memory = 8u << 20;
  return fl_context_open("local[2]", &opts, &ctx) == FL_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  fl_context_close(ctx);
  return 0;
}

/* ---- lists of records ------------------------------------------------------------------ */

typedef struct rec_list {
  fl_buf *v;
  size_t n, cap;
} rec_list;

static fl_buf *rl_add(rec_list *l) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 64;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    assert_non_null(l->v);
  }
  l->v[l->n] = (fl_buf)FL_BUF_INIT;
  return &l->v[l->n++];
}
static void rl_push(rec_list *l, fl_bytes rec) { assert_ok(fl_buf_append(rl_add(l), rec.data, rec.len)); }
static void rl_push_pair(rec_list *l, fl_bytes key, fl_bytes value) {
  assert_ok(fl_buf_put_pair(rl_add(l), key, value));
}
static fl_bytes rl_get(const rec_list *l, size_t i) { return fl_buf_bytes(&l->v[i]); }
static void rl_free(rec_list *l) {
  for (size_t i = 0; i < l->n; i++) fl_buf_free(&l->v[i]);
  free(l->v);
  *l = (rec_list){0};
}

static int bytes_cmp(fl_bytes a, fl_bytes b) { return rdd_compare_keys(NULL, NULL, a, b); }
static bool bytes_eq(fl_bytes a, fl_bytes b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}
static int cmp_bufs(const void *x, const void *y) { return bytes_cmp(fl_buf_bytes(x), fl_buf_bytes(y)); }
static int cmp_views(const void *x, const void *y) {
  return bytes_cmp(*(const fl_bytes *)x, *(const fl_bytes *)y);
}

static void split(fl_bytes rec, fl_bytes *key, fl_bytes *value) { assert_ok(fl_pair(rec, key, value)); }

static void rl_sort(rec_list *l) {
  if (l->n) qsort(l->v, l->n, sizeof *l->v, cmp_bufs);
}

/* Both lists hold the same records, in any order (both get sorted). */
static void assert_same_records(rec_list *got, rec_list *want, const char *what) {
  rl_sort(got);
  rl_sort(want);
  if (got->n != want->n) fprintf(stderr, "%s: %zu records, expected %zu\n", what, got->n, want->n);
  assert_int_equal(got->n, want->n);
  for (size_t i = 0; i < got->n; i++) {
    if (!bytes_eq(rl_get(got, i), rl_get(want, i)))
      fprintf(stderr, "%s: record %zu of %zu differs (%zu vs %zu bytes)\n", what, i, got->n,
              got->v[i].len, want->v[i].len);
    assert_true(bytes_eq(rl_get(got, i), rl_get(want, i)));
  }
}

/* ---- generated input ------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef enum { KEYS_PLAIN, KEYS_ZERO, KEYS_LONG, KEYS_I64 } key_style;
#define LONG_KEY 10240
#define HOT_KEY 7 /* the key of ~90% of the records of a skewed input */

/* Key number id in a style: "key-<id>"; zero bytes ("", "\0", "\0\0", then 7 bytes with
 * four zeros); 10 KB keys sharing all but their last bytes (with zero bytes inside); int64
 * of both signs. */
static void make_key(key_style style, uint32_t id, fl_buf *out) {
  out->len = 0;
  switch (style) {
  case KEYS_PLAIN: {
    char s[32];
    int n = snprintf(s, sizeof s, "key-%u", id);
    assert_ok(fl_buf_append(out, s, (size_t)n));
    break;
  }
  case KEYS_ZERO: {
    static const uint8_t zeros[2] = {0, 0};
    if (id < 3) {
      assert_ok(fl_buf_append(out, zeros, id));
    } else {
      uint8_t k[7] = {0, 'k', 0, (uint8_t)id, 0, (uint8_t)(id >> 8), 0};
      assert_ok(fl_buf_append(out, k, sizeof k));
    }
    break;
  }
  case KEYS_LONG: {
    size_t len = LONG_KEY - 1 + id % 3;
    assert_ok(fl_buf_reserve(out, len));
    for (size_t i = 0; i < len; i++) out->data[i] = i % 97 == 0 ? 0 : (uint8_t)('a' + i % 23);
    out->data[len - 4] = (uint8_t)(id >> 24);
    out->data[len - 3] = (uint8_t)(id >> 16);
    out->data[len - 2] = (uint8_t)(id >> 8);
    out->data[len - 1] = (uint8_t)id;
    out->len = len;
    break;
  }
  case KEYS_I64:
    assert_ok(fl_buf_put_i64(out, ((int64_t)id - 5000) * 1000003));
    break;
  }
}

typedef struct shape {
  const char *name;
  size_t n;
  uint32_t in_parts, distinct;
  key_style style;
  bool skew;
} shape;

static const shape shapes[] = {
    {"empty", 0, 3, 10, KEYS_PLAIN, false},
    {"sparse (empty partitions)", 5, 8, 3, KEYS_ZERO, false},
    {"one partition", 1500, 1, 200, KEYS_PLAIN, false},
    {"many partitions, zero bytes", 3000, 6, 400, KEYS_ZERO, false},
    {"skewed", 3000, 4, 300, KEYS_PLAIN, true},
    {"10 KB keys", 120, 3, 40, KEYS_LONG, false},
};
#define NUM_SHAPES (sizeof shapes / sizeof shapes[0])
static const uint32_t out_parts[] = {1, 3, 16};

/* n pairs: keys numbered from id_offset (90% HOT_KEY when skewed); values int64 in
 * [-1000, 1000] (zero bytes in most), or with var_values 0 to 8 bytes of one. */
static void gen_pairs(const shape *s, uint64_t seed, bool var_values, uint32_t id_offset, rec_list *out) {
  fl_buf key = FL_BUF_INIT;
  for (size_t i = 0; i < s->n; i++) {
    uint64_t r = rng_next(&seed);
    uint32_t id = s->skew && r % 10 != 0 ? HOT_KEY : (uint32_t)((r >> 8) % s->distinct) + id_offset;
    make_key(s->style, id, &key);
    int64_t v = (int64_t)(rng_next(&seed) % 2001) - 1000;
    size_t vlen = var_values ? (size_t)((r >> 40) % 9) : 8;
    rl_push_pair(out, fl_buf_bytes(&key), fl_bytes_of(&v, vlen));
  }
  fl_buf_free(&key);
}

static fl_dataset *make_ds(fl_context *c, const rec_list *l, uint32_t parts) {
  fl_bytes *views = calloc(l->n ? l->n : 1, sizeof *views);
  assert_non_null(views);
  for (size_t i = 0; i < l->n; i++) views[i] = rl_get(l, i);
  fl_dataset *ds;
  assert_ok(fl_parallelize(c, views, l->n, parts, &ds));
  free(views);
  assert_int_equal(fl_dataset_partitions(ds), parts);
  return ds;
}

/* The parallelized partition of record i of n (fl_parallelize slices evenly). */
static uint32_t map_of(size_t i, size_t n, uint32_t parts) {
  for (uint32_t p = 0; p < parts; p++)
    if (i < n * (p + 1) / parts) return p;
  fail();
  return 0;
}

/* ---- the reference: input records grouped by key ------------------------------------- */

typedef struct kv {
  fl_bytes key, value;
  size_t index;
} kv;

static int cmp_kv(const void *x, const void *y) {
  const kv *a = x, *b = y;
  int c = bytes_cmp(a->key, b->key);
  return c ? c : (a->index > b->index) - (a->index < b->index);
}

/* The input split into keys and values, sorted by key then position. */
static kv *sorted_kvs(const rec_list *in) {
  kv *a = calloc(in->n ? in->n : 1, sizeof *a);
  assert_non_null(a);
  for (size_t i = 0; i < in->n; i++) {
    split(rl_get(in, i), &a[i].key, &a[i].value);
    a[i].index = i;
  }
  qsort(a, in->n, sizeof *a, cmp_kv);
  return a;
}

/* End of the run of equal keys that starts at i. */
static size_t run_end(const kv *a, size_t n, size_t i) {
  size_t j = i + 1;
  while (j < n && bytes_eq(a[j].key, a[i].key)) j++;
  return j;
}

/* Number of parallelized partitions holding the run a[i, j) (sorted by position). */
static uint32_t maps_in_run(const kv *a, size_t i, size_t j, size_t n, uint32_t parts) {
  uint32_t maps = 0, last = UINT32_MAX;
  for (size_t x = i; x < j; x++) {
    uint32_t m = map_of(a[x].index, n, parts);
    if (m != last) maps++;
    last = m;
  }
  return maps;
}

/* Canonical encodings (u32 length before each field; value lists sorted) for comparing
 * groups, cogroups and joined pairs whatever their order. */
static void put_field(fl_buf *b, fl_bytes f) {
  uint32_t len = (uint32_t)f.len;
  assert_ok(fl_buf_append(b, &len, 4));
  assert_ok(fl_buf_append(b, f.data, f.len));
}
static void put_values(fl_buf *b, fl_bytes *vals, size_t n) {
  if (n) qsort(vals, n, sizeof *vals, cmp_views);
  uint32_t count = (uint32_t)n;
  assert_ok(fl_buf_append(b, &count, 4));
  for (size_t i = 0; i < n; i++) put_field(b, vals[i]);
}

typedef struct views {
  fl_bytes *v;
  size_t n, cap;
} views;
static void views_push(views *l, fl_bytes b) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 16;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    assert_non_null(l->v);
  }
  l->v[l->n++] = b;
}

static void group_values(fl_bytes group, views *out) {
  out->n = 0;
  size_t pos = 0;
  fl_bytes v;
  while (fl_group_next(group, &pos, &v)) views_push(out, v);
  assert_int_equal(pos, group.len); /* the whole group was read */
}

static void put_joined(fl_buf *b, fl_bytes key, bool has_a, fl_bytes a, bool has_b, fl_bytes bv) {
  put_field(b, key);
  uint8_t f[2] = {has_a, has_b};
  assert_ok(fl_buf_append(b, f, 2));
  put_field(b, has_a ? a : fl_bytes_of(NULL, 0));
  put_field(b, has_b ? bv : fl_bytes_of(NULL, 0));
}

/* ---- user functions (exported: the engine names them in errors) ---------------------- */

fl_status add_i64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

/* aggregate_by_key: (sum, count, zeros) where zero = (0, 0, 1), so that zeros counts how
 * many times the zero was used. */
fl_status agg_seq(fl_bytes acc, fl_bytes v, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t s[3];
  if (acc.len != sizeof s) return fl_set_error(FL_EFORMAT, "agg_seq: accumulator of %zu bytes", acc.len);
  memcpy(s, acc.data, sizeof s);
  s[0] += fl_i64(v);
  s[1] += 1;
  return fl_buf_append(out, s, sizeof s);
}
fl_status agg_comb(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x[3], y[3];
  if (a.len != sizeof x || b.len != sizeof y) return fl_set_error(FL_EFORMAT, "agg_comb: bad accumulators");
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  for (int i = 0; i < 3; i++) x[i] += y[i];
  return fl_buf_append(out, x, sizeof x);
}

/* combine_by_key: (sum, count), counting the calls of create and merge_combiners. */
static atomic_long create_calls, merge_combiners_calls;
fl_status comb_create(fl_bytes v, fl_buf *out, const void *arg) {
  (void)arg;
  atomic_fetch_add(&create_calls, 1);
  int64_t c[2] = {fl_i64(v), 1};
  return fl_buf_append(out, c, sizeof c);
}
fl_status comb_merge_value(fl_bytes acc, fl_bytes v, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t c[2];
  if (acc.len != sizeof c) return fl_set_error(FL_EFORMAT, "comb_merge_value: combiner of %zu bytes", acc.len);
  memcpy(c, acc.data, sizeof c);
  c[0] += fl_i64(v);
  c[1] += 1;
  return fl_buf_append(out, c, sizeof c);
}
fl_status comb_merge_combiners(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  atomic_fetch_add(&merge_combiners_calls, 1);
  int64_t x[2], y[2];
  if (a.len != sizeof x || b.len != sizeof y) return fl_set_error(FL_EFORMAT, "comb_merge_combiners: bad combiners");
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  x[0] += y[0];
  x[1] += y[1];
  return fl_buf_append(out, x, sizeof x);
}

static const uint32_t compare_magic = 0xc0ffee;
static atomic_int bad_compare_arg;
int compare_i64(fl_bytes a, fl_bytes b, const void *arg) {
  if (!arg || *(const uint32_t *)arg != compare_magic) atomic_store(&bad_compare_arg, 1);
  int64_t x = fl_i64(a), y = fl_i64(b);
  return (x > y) - (x < y);
}

/* Emits (partition index as u32, record) for every record. */
fl_status tag_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)arg;
  fl_buf one = FL_BUF_INIT;
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    one.len = 0;
    s = fl_buf_put_pair(&one, fl_bytes_of(&partition, 4), rec);
    if (s == FL_OK) s = fl_emit(out, one.data, one.len);
  }
  fl_buf_free(&one);
  return s;
}

/* A partition function answering mostly out of range: a 32-bit hash salted by the arg. */
uint32_t wild_partition(fl_bytes key, uint32_t n, const void *arg) {
  (void)n;
  uint32_t h = *(const uint32_t *)arg;
  for (size_t i = 0; i < key.len; i++) h = (h ^ key.data[i]) * 16777619u;
  return h | 0x80000000u;
}

fl_status fail_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)a, (void)b, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "sum refused");
}
fl_status fail_create(fl_bytes v, fl_buf *out, const void *arg) {
  (void)v, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "create refused");
}
fl_status fail_combine(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)a, (void)b, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "combine refused");
}

fl_status double_value(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(rec) * 2);
}
fl_status keep_positive(fl_bytes rec, bool *keep, const void *arg) {
  (void)arg;
  fl_bytes k, v;
  fl_status s = fl_pair(rec, &k, &v);
  *keep = s == FL_OK && fl_i64(v) > 0;
  return s;
}

/* ---- collecting ------------------------------------------------------------------------ */

static void collect_list(fl_dataset *ds, rec_list *out) {
  fl_records *r;
  assert_ok(fl_collect(ds, &r));
  for (size_t i = 0; i < fl_records_count(r); i++) rl_push(out, fl_records_get(r, i));
  fl_records_free(r);
}

/* The records of ds and, for each, the partition it is in. */
static uint32_t *collect_tagged(fl_dataset *ds, rec_list *out) {
  fl_dataset *tagged;
  assert_ok(fl_map_partitions(ds, tag_partition, NULL, 0, &tagged));
  rec_list t = {0};
  collect_list(tagged, &t);
  uint32_t *parts = calloc(t.n ? t.n : 1, sizeof *parts);
  assert_non_null(parts);
  for (size_t i = 0; i < t.n; i++) {
    fl_bytes k, v;
    split(rl_get(&t, i), &k, &v);
    assert_int_equal(k.len, 4);
    memcpy(&parts[i], k.data, 4);
    assert_true(parts[i] < fl_dataset_partitions(ds));
    rl_push(out, v);
  }
  rl_free(&t);
  fl_dataset_free(tagged);
  return parts;
}

/* Every record's key is in the partition p places it in. */
static void assert_placed(const rec_list *recs, const uint32_t *parts, const fl_partitioner *p) {
  for (size_t i = 0; i < recs->n; i++) {
    fl_bytes k, v;
    split(rl_get(recs, i), &k, &v);
    assert_int_equal(parts[i], rdd_partitioner_place(p, k));
  }
}

/* ---- aggregations ---------------------------------------------------------------------- */

static void check_reduce(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *red;
  assert_ok(fl_reduce_by_key(ds, add_i64, NULL, 0, NULL, outp, &red));
  assert_int_equal(fl_dataset_partitions(red), outp);
  rec_list got = {0}, want = {0};
  uint32_t *parts = collect_tagged(red, &got);
  fl_partitioner *hash;
  assert_ok(fl_partitioner_hash(outp, &hash));
  assert_placed(&got, parts, hash);
  kv *a = sorted_kvs(in);
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    int64_t sum = 0;
    for (size_t x = i; x < j; x++) sum += fl_i64(a[x].value);
    rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
  }
  assert_same_records(&got, &want, "reduce_by_key");
  free(a);
  free(parts);
  fl_partitioner_free(hash);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(red);
  fl_dataset_free(ds);
}

/* fold_by_key uses its zero once per key in each map partition holding the key (the
 * map-side combine), and the reduce side merges those partial folds with fn: so a
 * non-neutral zero of 1000 adds 1000 per map partition holding the key. */
static void check_fold(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *fold;
  int64_t zero = 1000;
  assert_ok(fl_fold_by_key(ds, fl_bytes_of(&zero, 8), add_i64, NULL, 0, NULL, outp, &fold));
  assert_int_equal(fl_dataset_partitions(fold), outp);
  rec_list got = {0}, want = {0};
  collect_list(fold, &got);
  kv *a = sorted_kvs(in);
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    int64_t sum = 1000 * (int64_t)maps_in_run(a, i, j, in->n, in_parts);
    for (size_t x = i; x < j; x++) sum += fl_i64(a[x].value);
    rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
  }
  assert_same_records(&got, &want, "fold_by_key");
  free(a);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(fold);
  fl_dataset_free(ds);
}

static void check_aggregate(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *agg;
  int64_t zero[3] = {0, 0, 1};
  assert_ok(fl_aggregate_by_key(ds, fl_bytes_of(zero, sizeof zero), agg_seq, agg_comb, NULL, 0,
                                NULL, outp, &agg));
  assert_int_equal(fl_dataset_partitions(agg), outp);
  rec_list got = {0}, want = {0};
  collect_list(agg, &got);
  kv *a = sorted_kvs(in);
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    int64_t s[3] = {0, (int64_t)(j - i), maps_in_run(a, i, j, in->n, in_parts)};
    for (size_t x = i; x < j; x++) s[0] += fl_i64(a[x].value);
    rl_push_pair(&want, a[i].key, fl_bytes_of(s, sizeof s));
  }
  assert_same_records(&got, &want, "aggregate_by_key");
  free(a);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(agg);
  fl_dataset_free(ds);
}

/* combine_by_key: with map_side_combine, create runs once per key per map partition and
 * merge_combiners joins those on the reduce side; without, create runs once per key on the
 * reduce side and merge_combiners never (nothing spills here). */
static void check_combine_with(const rec_list *in, uint32_t in_parts, uint32_t outp, bool map_side) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *comb;
  assert_ok(fl_combine_by_key(ds, comb_create, comb_merge_value, comb_merge_combiners, NULL, 0,
                              NULL, outp, map_side, &comb));
  assert_int_equal(fl_dataset_partitions(comb), outp);
  atomic_store(&create_calls, 0);
  atomic_store(&merge_combiners_calls, 0);
  rec_list got = {0}, want = {0};
  collect_list(comb, &got);
  kv *a = sorted_kvs(in);
  long creates = 0, merges = 0;
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    int64_t c[2] = {0, (int64_t)(j - i)};
    for (size_t x = i; x < j; x++) c[0] += fl_i64(a[x].value);
    rl_push_pair(&want, a[i].key, fl_bytes_of(c, sizeof c));
    uint32_t maps = maps_in_run(a, i, j, in->n, in_parts);
    creates += map_side ? maps : 1;
    merges += map_side ? maps - 1 : 0;
  }
  assert_same_records(&got, &want, map_side ? "combine_by_key (map side)" : "combine_by_key");
  assert_int_equal(atomic_load(&create_calls), creates);
  assert_int_equal(atomic_load(&merge_combiners_calls), merges);
  free(a);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(comb);
  fl_dataset_free(ds);
}
static void check_combine_map_side(const rec_list *in, uint32_t p, uint32_t o) { check_combine_with(in, p, o, true); }
static void check_combine_reduce_side(const rec_list *in, uint32_t p, uint32_t o) { check_combine_with(in, p, o, false); }

static void for_each_shape(void (*check)(const rec_list *, uint32_t, uint32_t), bool var_values) {
  for (size_t s = 0; s < NUM_SHAPES; s++) {
    rec_list in = {0};
    gen_pairs(&shapes[s], 100 + s, var_values, 0, &in);
    for (size_t o = 0; o < 3; o++) check(&in, shapes[s].in_parts, out_parts[o]);
    rl_free(&in);
  }
}

static void test_reduce_by_key(void **state) {
  (void)state;
  for_each_shape(check_reduce, false);
}
static void test_fold_by_key(void **state) {
  (void)state;
  for_each_shape(check_fold, false);
}
static void test_aggregate_by_key(void **state) {
  (void)state;
  for_each_shape(check_aggregate, false);
}
static void test_combine_by_key(void **state) {
  (void)state;
  for_each_shape(check_combine_map_side, false);
  for_each_shape(check_combine_reduce_side, false);
}

/* ---- grouping and sorting -------------------------------------------------------------- */

static void check_group(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *grp;
  assert_ok(fl_group_by_key(ds, NULL, outp, &grp));
  assert_int_equal(fl_dataset_partitions(grp), outp);
  rec_list got = {0}, want = {0}, canon = {0};
  uint32_t *parts = collect_tagged(grp, &got);
  fl_partitioner *hash;
  assert_ok(fl_partitioner_hash(outp, &hash));
  assert_placed(&got, parts, hash);
  views vals = {0};
  for (size_t i = 0; i < got.n; i++) {
    fl_bytes k, g;
    split(rl_get(&got, i), &k, &g);
    group_values(g, &vals);
    assert_true(vals.n > 0);
    fl_buf *b = rl_add(&canon);
    put_field(b, k);
    put_values(b, vals.v, vals.n);
  }
  kv *a = sorted_kvs(in);
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    vals.n = 0;
    for (size_t x = i; x < j; x++) views_push(&vals, a[x].value);
    fl_buf *b = rl_add(&want);
    put_field(b, a[i].key);
    put_values(b, vals.v, vals.n);
  }
  assert_same_records(&canon, &want, "group_by_key");
  free(vals.v);
  free(a);
  free(parts);
  fl_partitioner_free(hash);
  rl_free(&got);
  rl_free(&want);
  rl_free(&canon);
  fl_dataset_free(grp);
  fl_dataset_free(ds);
}

static void test_group_by_key(void **state) {
  (void)state;
  for_each_shape(check_group, true);
}

/* The concatenation of the partitions is in order and a permutation of the input. */
static void check_sorted(const rec_list *in, uint32_t in_parts, uint32_t outp, bool ascending,
                         fl_compare_fn cmp) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *sorted;
  const void *arg = cmp ? &compare_magic : NULL;
  assert_ok(fl_sort_by_key(ds, ascending, cmp, arg, cmp ? sizeof compare_magic : 0, outp, &sorted));
  assert_int_equal(fl_dataset_partitions(sorted), outp);
  rec_list got = {0}, want = {0};
  uint32_t *parts = collect_tagged(sorted, &got);
  for (size_t i = 1; i < got.n; i++) {
    fl_bytes k0, k1, v;
    split(rl_get(&got, i - 1), &k0, &v);
    split(rl_get(&got, i), &k1, &v);
    int c = rdd_compare_keys(cmp, arg, k0, k1);
    if (ascending ? c > 0 : c < 0) fprintf(stderr, "sort_by_key: records %zu and %zu out of order\n", i - 1, i);
    assert_true(ascending ? c <= 0 : c >= 0);
    assert_true(parts[i - 1] <= parts[i]); /* collect is in partition order */
  }
  for (size_t i = 0; i < in->n; i++) rl_push(&want, rl_get(in, i));
  assert_same_records(&got, &want, "sort_by_key");
  free(parts);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(sorted);
  fl_dataset_free(ds);
}
static void check_sort_asc(const rec_list *in, uint32_t p, uint32_t o) { check_sorted(in, p, o, true, NULL); }
static void check_sort_desc(const rec_list *in, uint32_t p, uint32_t o) { check_sorted(in, p, o, false, NULL); }

static void test_sort_by_key(void **state) {
  (void)state;
  for_each_shape(check_sort_asc, true);
  for_each_shape(check_sort_desc, true);
  /* Numeric order of int64 keys (not their bytewise order), both ways. */
  const shape numeric[] = {{"i64", 2000, 4, 10000, KEYS_I64, false},
                           {"i64 skewed", 2000, 3, 500, KEYS_I64, true},
                           {"i64 empty", 0, 2, 10, KEYS_I64, false}};
  for (size_t s = 0; s < 3; s++) {
    rec_list in = {0};
    gen_pairs(&numeric[s], 200 + s, true, 0, &in);
    for (size_t o = 0; o < 3; o++) {
      check_sorted(&in, numeric[s].in_parts, out_parts[o], true, compare_i64);
      check_sorted(&in, numeric[s].in_parts, out_parts[o], false, compare_i64);
    }
    rl_free(&in);
  }
  assert_int_equal(atomic_load(&bad_compare_arg), 0);
}

/* ---- two inputs: cogroup, joins, subtract ---------------------------------------------- */

static void check_two(const rec_list *a, uint32_t pa, const rec_list *b, uint32_t pb, uint32_t outp) {
  fl_dataset *da = make_ds(ctx, a, pa), *db = make_ds(ctx, b, pb), *cg;
  /* cogroup: every key of either side once, with both groups. */
  assert_ok(fl_cogroup(da, db, NULL, outp, &cg));
  assert_int_equal(fl_dataset_partitions(cg), outp);
  rec_list got = {0}, canon = {0}, want = {0};
  collect_list(cg, &got);
  views va = {0}, vb = {0};
  for (size_t i = 0; i < got.n; i++) {
    fl_bytes k, c, ga, gb;
    split(rl_get(&got, i), &k, &c);
    assert_ok(fl_cogroup_get(c, &ga, &gb));
    group_values(ga, &va);
    group_values(gb, &vb);
    assert_true(va.n + vb.n > 0);
    fl_buf *buf = rl_add(&canon);
    put_field(buf, k);
    put_values(buf, va.v, va.n);
    put_values(buf, vb.v, vb.n);
  }
  /* Reference: both inputs, values tagged by side, grouped by key. */
  rec_list both = {0};
  for (size_t i = 0; i < a->n + b->n; i++) {
    fl_bytes k, v;
    split(i < a->n ? rl_get(a, i) : rl_get(b, i - a->n), &k, &v);
    fl_buf tagged = FL_BUF_INIT;
    uint8_t side = i < a->n ? 0 : 1;
    assert_ok(fl_buf_append(&tagged, &side, 1));
    assert_ok(fl_buf_append(&tagged, v.data, v.len));
    rl_push_pair(&both, k, fl_buf_bytes(&tagged));
    fl_buf_free(&tagged);
  }
  kv *s = sorted_kvs(&both);
  for (size_t i = 0, j; i < both.n; i = j) {
    j = run_end(s, both.n, i);
    va.n = vb.n = 0;
    for (size_t x = i; x < j; x++)
      views_push(s[x].value.data[0] ? &vb : &va, fl_bytes_of(s[x].value.data + 1, s[x].value.len - 1));
    fl_buf *buf = rl_add(&want);
    put_field(buf, s[i].key);
    put_values(buf, va.v, va.n);
    put_values(buf, vb.v, vb.n);
  }
  assert_same_records(&canon, &want, "cogroup");
  rl_free(&got);
  rl_free(&canon);
  rl_free(&want);

  /* Joins against a nested loop. */
  static const char *names[] = {"inner join", "left join", "right join", "full join"};
  for (fl_join_kind kind = FL_JOIN_INNER; kind <= FL_JOIN_FULL; kind++) {
    fl_dataset *j;
    assert_ok(fl_join(da, db, kind, NULL, outp, &j));
    assert_int_equal(fl_dataset_partitions(j), outp);
    collect_list(j, &got);
    for (size_t i = 0; i < got.n; i++) {
      fl_bytes k, jv, x, y;
      bool has_a, has_b;
      split(rl_get(&got, i), &k, &jv);
      assert_ok(fl_joined_get(jv, &has_a, &x, &has_b, &y));
      put_joined(rl_add(&canon), k, has_a, x, has_b, y);
    }
    bool outer_a = kind == FL_JOIN_LEFT || kind == FL_JOIN_FULL;
    bool outer_b = kind == FL_JOIN_RIGHT || kind == FL_JOIN_FULL;
    for (size_t i = 0; i < a->n; i++) {
      fl_bytes ka, xa;
      split(rl_get(a, i), &ka, &xa);
      bool matched = false;
      for (size_t q = 0; q < b->n; q++) {
        fl_bytes kb, xb;
        split(rl_get(b, q), &kb, &xb);
        if (!bytes_eq(ka, kb)) continue;
        matched = true;
        put_joined(rl_add(&want), ka, true, xa, true, xb);
      }
      if (!matched && outer_a) put_joined(rl_add(&want), ka, true, xa, false, fl_bytes_of(NULL, 0));
    }
    if (outer_b)
      for (size_t q = 0; q < b->n; q++) {
        fl_bytes kb, xb;
        split(rl_get(b, q), &kb, &xb);
        bool matched = false;
        for (size_t i = 0; i < a->n && !matched; i++) {
          fl_bytes ka, xa;
          split(rl_get(a, i), &ka, &xa);
          matched = bytes_eq(ka, kb);
        }
        if (!matched) put_joined(rl_add(&want), kb, false, fl_bytes_of(NULL, 0), true, xb);
      }
    assert_same_records(&canon, &want, names[kind]);
    rl_free(&got);
    rl_free(&canon);
    rl_free(&want);
    fl_dataset_free(j);
  }

  /* subtract_by_key: the pairs of a whose key is nowhere in b. */
  fl_dataset *sub;
  assert_ok(fl_subtract_by_key(da, db, NULL, outp, &sub));
  assert_int_equal(fl_dataset_partitions(sub), outp);
  collect_list(sub, &got);
  for (size_t i = 0; i < a->n; i++) {
    fl_bytes ka, xa;
    split(rl_get(a, i), &ka, &xa);
    bool in_b = false;
    for (size_t q = 0; q < b->n && !in_b; q++) {
      fl_bytes kb, xb;
      split(rl_get(b, q), &kb, &xb);
      in_b = bytes_eq(ka, kb);
    }
    if (!in_b) rl_push(&want, rl_get(a, i));
  }
  assert_same_records(&got, &want, "subtract_by_key");
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(sub);

  free(s);
  rl_free(&both);
  free(va.v);
  free(vb.v);
  fl_dataset_free(cg);
  fl_dataset_free(da);
  fl_dataset_free(db);
}

static void test_cogroup_join_subtract(void **state) {
  (void)state;
  /* The key numbers of a and b start at a_offset and b_offset, so that some keys are on
   * one side only. */
  static const struct {
    shape a, b;
    uint32_t a_offset, b_offset;
  } cases[] = {
      {{"empty a", 0, 2, 10, KEYS_PLAIN, false}, {"b", 200, 3, 40, KEYS_PLAIN, false}, 0, 20},
      {{"a", 200, 3, 40, KEYS_PLAIN, false}, {"empty b", 0, 2, 10, KEYS_PLAIN, false}, 0, 5},
      {{"a", 300, 3, 60, KEYS_PLAIN, false}, {"b", 250, 2, 60, KEYS_PLAIN, false}, 0, 30},
      {{"a, one partition", 300, 1, 80, KEYS_ZERO, false}, {"b, sparse", 6, 7, 80, KEYS_ZERO, false}, 0, 40},
      {{"a skewed", 200, 4, 50, KEYS_PLAIN, true}, {"b skewed", 150, 3, 50, KEYS_PLAIN, true}, 0, 25},
      {{"a 10 KB keys", 60, 2, 20, KEYS_LONG, false}, {"b 10 KB keys", 50, 3, 20, KEYS_LONG, false}, 0, 10},
      /* the empty key, "\0" and "\0\0" on b's side only */
      {{"a zero bytes", 100, 2, 10, KEYS_ZERO, false}, {"b zero bytes", 100, 3, 20, KEYS_ZERO, false}, 13, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    rec_list a = {0}, b = {0};
    gen_pairs(&cases[c].a, 300 + c, true, cases[c].a_offset, &a);
    gen_pairs(&cases[c].b, 400 + c, true, cases[c].b_offset, &b);
    for (size_t o = 0; o < 3; o++) check_two(&a, cases[c].a.in_parts, &b, cases[c].b.in_parts, out_parts[o]);
    rl_free(&a);
    rl_free(&b);
  }
  /* A self-join: the same dataset on both sides gives every pair of its values per key. */
  const shape self = {"self", 400, 3, 50, KEYS_ZERO, false};
  rec_list in = {0};
  gen_pairs(&self, 350, true, 0, &in);
  fl_dataset *ds = make_ds(ctx, &in, 3), *j;
  assert_ok(fl_join(ds, ds, FL_JOIN_INNER, NULL, 4, &j));
  uint64_t n;
  assert_ok(fl_count(j, &n));
  kv *a = sorted_kvs(&in);
  uint64_t expected = 0;
  for (size_t i = 0, e; i < in.n; i = e) {
    e = run_end(a, in.n, i);
    expected += (uint64_t)(e - i) * (e - i);
  }
  assert_int_equal(n, expected);
  free(a);
  rl_free(&in);
  fl_dataset_free(j);
  fl_dataset_free(ds);
}

/* ---- distinct, count_by_key, partition_by, repartition, partitioners ------------------ */

static void check_distinct(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  /* Any records (here: the keys, not pairs), duplicates among them. */
  rec_list keys = {0}, got = {0}, want = {0};
  for (size_t i = 0; i < in->n; i++) {
    fl_bytes k, v;
    split(rl_get(in, i), &k, &v);
    rl_push(&keys, k);
  }
  fl_dataset *ds = make_ds(ctx, &keys, in_parts), *d;
  assert_ok(fl_distinct(ds, outp, &d));
  assert_int_equal(fl_dataset_partitions(d), outp);
  collect_list(d, &got);
  rl_sort(&keys);
  for (size_t i = 0; i < keys.n; i++)
    if (i == 0 || !bytes_eq(rl_get(&keys, i), rl_get(&keys, i - 1))) rl_push(&want, rl_get(&keys, i));
  assert_same_records(&got, &want, "distinct");
  rl_free(&keys);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(d);
  fl_dataset_free(ds);
}

static void check_count_by_key(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  (void)outp;
  fl_dataset *ds = make_ds(ctx, in, in_parts);
  fl_records *r;
  assert_ok(fl_count_by_key(ds, &r));
  kv *a = sorted_kvs(in);
  size_t n = 0;
  for (size_t i = 0, j; i < in->n; i = j, n++) {
    j = run_end(a, in->n, i);
    assert_true(n < fl_records_count(r));
    fl_bytes k, v;
    split(fl_records_get(r, n), &k, &v);
    assert_true(bytes_eq(k, a[i].key)); /* in key order */
    assert_int_equal(v.len, 8);
    assert_int_equal(fl_i64(v), (int64_t)(j - i));
  }
  assert_int_equal(fl_records_count(r), n);
  free(a);
  fl_records_free(r);
  fl_dataset_free(ds);
}

static void check_partition_by_with(const rec_list *in, uint32_t in_parts, const fl_partitioner *p,
                                     uint32_t salt) {
  fl_dataset *ds = make_ds(ctx, in, in_parts), *placed;
  assert_ok(fl_partition_by(ds, p, &placed));
  uint32_t n = fl_partitioner_partitions(p);
  assert_int_equal(fl_dataset_partitions(placed), n);
  rec_list got = {0}, want = {0};
  uint32_t *parts = collect_tagged(placed, &got);
  assert_placed(&got, parts, p);
  if (salt) /* custom: the function's answer, reduced into range */
    for (size_t i = 0; i < got.n; i++) {
      fl_bytes k, v;
      split(rl_get(&got, i), &k, &v);
      assert_int_equal(parts[i], wild_partition(k, n, &salt) % n);
    }
  for (size_t i = 0; i < in->n; i++) rl_push(&want, rl_get(in, i));
  assert_same_records(&got, &want, "partition_by");
  free(parts);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(placed);
  fl_dataset_free(ds);
}
static void check_partition_by_hash(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  fl_partitioner *p;
  assert_ok(fl_partitioner_hash(outp, &p));
  assert_int_equal(fl_partitioner_partitions(p), outp);
  check_partition_by_with(in, in_parts, p, 0);
  fl_partitioner_free(p);
}
static void check_partition_by_custom(const rec_list *in, uint32_t in_parts, uint32_t outp) {
  uint32_t salt = 0x9e37u + outp;
  fl_partitioner *p;
  assert_ok(fl_partitioner_custom(outp, wild_partition, &salt, sizeof salt, &p));
  check_partition_by_with(in, in_parts, p, salt);
  /* A reduce over the same out-of-range partitioner is still right. */
  fl_dataset *ds = make_ds(ctx, in, in_parts), *red;
  assert_ok(fl_reduce_by_key(ds, add_i64, NULL, 0, p, 0, &red));
  assert_int_equal(fl_dataset_partitions(red), outp);
  rec_list got = {0}, want = {0};
  uint32_t *parts = collect_tagged(red, &got);
  assert_placed(&got, parts, p);
  kv *a = sorted_kvs(in);
  for (size_t i = 0, j; i < in->n; i = j) {
    j = run_end(a, in->n, i);
    int64_t sum = 0;
    for (size_t x = i; x < j; x++) sum += fl_i64(a[x].value);
    rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
  }
  assert_same_records(&got, &want, "reduce_by_key over a custom partitioner");
  free(a);
  free(parts);
  rl_free(&got);
  rl_free(&want);
  fl_dataset_free(red);
  fl_dataset_free(ds);
  fl_partitioner_free(p);
}

static void test_distinct_and_count_by_key(void **state) {
  (void)state;
  /* Records that are pairs and records that are not, some repeated. */
  rec_list mixed = {0};
  const shape s = {"pairs", 200, 2, 20, KEYS_PLAIN, false};
  gen_pairs(&s, 1100, false, 0, &mixed);
  for (size_t i = 0; i < 10; i++) rl_push(&mixed, rl_get(&mixed, i * 3));
  rl_push(&mixed, fl_bytes_str("abc"));
  rl_push(&mixed, fl_bytes_of(NULL, 0));
  rl_push(&mixed, fl_bytes_of(NULL, 0));
  fl_dataset *ds = make_ds(ctx, &mixed, 3), *d;
  assert_ok(fl_distinct(ds, 2, &d));
  rec_list got = {0}, want = {0};
  collect_list(d, &got);
  rl_sort(&mixed);
  for (size_t i = 0; i < mixed.n; i++)
    if (i == 0 || !bytes_eq(rl_get(&mixed, i), rl_get(&mixed, i - 1))) rl_push(&want, rl_get(&mixed, i));
  assert_true(want.n > 2 && want.n < mixed.n);
  assert_same_records(&got, &want, "distinct of any records");
  rl_free(&got);
  rl_free(&want);
  rl_free(&mixed);
  fl_dataset_free(d);
  fl_dataset_free(ds);
  for_each_shape(check_distinct, false);
  for (size_t s = 0; s < NUM_SHAPES; s++) {
    rec_list in = {0};
    gen_pairs(&shapes[s], 500 + s, true, 0, &in);
    check_count_by_key(&in, shapes[s].in_parts, 0);
    rl_free(&in);
  }
}

static void test_partition_by(void **state) {
  (void)state;
  for_each_shape(check_partition_by_hash, true);
  for_each_shape(check_partition_by_custom, false);
}

static void test_repartition(void **state) {
  (void)state;
  const uint32_t in_parts[] = {1, 3, 7};
  for (size_t i = 0; i < 3; i++) {
    for (size_t o = 0; o < 3; o++) {
      for (size_t total = 0; total <= 1000; total += 1000) {
        rec_list in = {0}, got = {0}, want = {0};
        for (size_t r = 0; r < total; r++) { /* any records: not pairs, some empty */
          uint8_t rec[3] = {(uint8_t)r, 0, (uint8_t)(r >> 8)};
          rl_push(&in, fl_bytes_of(rec, r % 4));
        }
        fl_dataset *ds = make_ds(ctx, &in, in_parts[i]), *re;
        assert_ok(fl_repartition(ds, out_parts[o], &re));
        assert_int_equal(fl_dataset_partitions(re), out_parts[o]);
        uint64_t n;
        assert_ok(fl_count(re, &n));
        assert_int_equal(n, total);
        uint32_t *parts = collect_tagged(re, &got);
        /* Round robin from each source partition: within one record per source of even. */
        for (uint32_t p = 0; p < out_parts[o]; p++) {
          size_t count = 0;
          for (size_t r = 0; r < got.n; r++) count += parts[r] == p;
          double even = (double)total / out_parts[o];
          if (count + in_parts[i] < even || count > even + in_parts[i])
            fprintf(stderr, "repartition %zu -> %u: partition %u holds %zu\n", total, out_parts[o], p, count);
          assert_true(count + in_parts[i] >= even && count <= even + in_parts[i]);
        }
        for (size_t r = 0; r < in.n; r++) rl_push(&want, rl_get(&in, r));
        assert_same_records(&got, &want, "repartition");
        free(parts);
        rl_free(&in);
        rl_free(&got);
        rl_free(&want);
        fl_dataset_free(re);
        fl_dataset_free(ds);
      }
    }
  }
}

/* Fills the stack below the caller with non-zero bytes, so that a variable the next call
 * leaves uninitialised is unlikely to read as 0 (FL_OK) by chance. */
static void __attribute__((noinline)) scribble_stack(void) {
  volatile uint8_t junk[32768];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(0xa5 ^ i);
}

static void test_range_partitioner(void **state) {
  (void)state;
  /* Nothing to sample (an empty dataset, or one partition): one range, and success. */
  rec_list none = {0}, few = {0};
  const shape s3 = {"few", 30, 2, 10, KEYS_PLAIN, false};
  gen_pairs(&s3, 599, false, 0, &few);
  fl_dataset *empty = make_ds(ctx, &none, 3), *small = make_ds(ctx, &few, 2);
  for (int c = 0; c < 4; c++) {
    fl_partitioner *p = NULL;
    scribble_stack();
    fl_status st = fl_partitioner_range(c < 2 ? empty : small, c % 2 ? 4 : 1, c < 3, NULL, NULL, 0, &p);
    if (st != FL_OK) fprintf(stderr, "fl_partitioner_range (case %d): status %d '%s'\n", c, (int)st, fl_last_error());
    assert_int_equal(st, FL_OK);
    assert_non_null(p);
    assert_int_equal(fl_partitioner_partitions(p), c % 2 ? 4 : 1);
    if (c == 2) /* one partition: every key goes there */
      for (size_t i = 0; i < few.n; i++) {
        fl_bytes k, v;
        split(rl_get(&few, i), &k, &v);
        assert_int_equal(rdd_partitioner_place(p, k), 0);
      }
    fl_partitioner_free(p);
  }
  fl_dataset_free(empty);
  fl_dataset_free(small);
  rl_free(&few);
  const shape s = {"distinct", 20000, 5, 1000000, KEYS_PLAIN, false};
  rec_list in = {0};
  gen_pairs(&s, 600, false, 0, &in);
  fl_dataset *ds = make_ds(ctx, &in, s.in_parts);
  for (int asc = 0; asc < 2; asc++) {
    fl_partitioner *p;
    assert_ok(fl_partitioner_range(ds, 8, asc, NULL, NULL, 0, &p));
    assert_int_equal(fl_partitioner_partitions(p), 8);
    fl_dataset *placed;
    assert_ok(fl_partition_by(ds, p, &placed));
    rec_list got = {0};
    uint32_t *parts = collect_tagged(placed, &got);
    assert_int_equal(got.n, in.n);
    assert_placed(&got, parts, p);
    /* Balanced within half of even, and ranges in order: every key of a partition before
     * (ascending) or after (descending) every key of the next. */
    for (uint32_t q = 0; q < 8; q++) {
      size_t count = 0;
      for (size_t i = 0; i < got.n; i++) count += parts[i] == q;
      if (count < in.n / 16 || count > in.n * 3 / 16) fprintf(stderr, "range partition %u holds %zu\n", q, count);
      assert_true(count >= in.n / 16 && count <= in.n * 3 / 16);
    }
    for (size_t i = 0; i < got.n; i += 13)
      for (size_t j = 0; j < got.n; j += 97) {
        if (parts[i] >= parts[j]) continue;
        fl_bytes ki, kj, v;
        split(rl_get(&got, i), &ki, &v);
        split(rl_get(&got, j), &kj, &v);
        int c = bytes_cmp(ki, kj);
        assert_true(asc ? c < 0 : c > 0);
      }
    free(parts);
    rl_free(&got);
    fl_dataset_free(placed);
    fl_partitioner_free(p);
  }
  /* A user order: int64 keys in numeric order. */
  rec_list nums = {0};
  const shape ns = {"i64", 8000, 4, 100000, KEYS_I64, false};
  gen_pairs(&ns, 601, false, 0, &nums);
  fl_dataset *nds = make_ds(ctx, &nums, ns.in_parts), *placed;
  fl_partitioner *p;
  assert_ok(fl_partitioner_range(nds, 4, true, compare_i64, &compare_magic, sizeof compare_magic, &p));
  assert_ok(fl_partition_by(nds, p, &placed));
  rec_list got = {0};
  uint32_t *parts = collect_tagged(placed, &got);
  int64_t max_of[4] = {INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN}, min_of[4] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
  size_t counts[4] = {0};
  for (size_t i = 0; i < got.n; i++) {
    fl_bytes k, v;
    split(rl_get(&got, i), &k, &v);
    counts[parts[i]]++;
    if (fl_i64(k) > max_of[parts[i]]) max_of[parts[i]] = fl_i64(k);
    if (fl_i64(k) < min_of[parts[i]]) min_of[parts[i]] = fl_i64(k);
  }
  for (int q = 0; q < 4; q++) {
    assert_true(counts[q] >= nums.n / 8 && counts[q] <= nums.n * 3 / 8);
    if (q > 0) assert_true(max_of[q - 1] < min_of[q]);
  }
  assert_int_equal(atomic_load(&bad_compare_arg), 0);
  free(parts);
  rl_free(&got);
  rl_free(&nums);
  rl_free(&in);
  fl_dataset_free(placed);
  fl_dataset_free(nds);
  fl_dataset_free(ds);
  fl_partitioner_free(p);
}

/* ---- the spill path -------------------------------------------------------------------- */

/* An identity map that looks, every 16 records, for spill files of the sorter in the work
 * folder: put before a shuffle it sees the map side's runs (its task is feeding a sorter),
 * after one the reduce side's (its task is reading a sorter). */
typedef struct spy_arg {
  char dir[1024];
  int side; /* 0: map side, 1: reduce side */
} spy_arg;
static atomic_int spill_seen[2];
static atomic_long spy_calls;

fl_status spy_map(fl_bytes rec, fl_buf *out, const void *arg) {
  const spy_arg *a = arg;
  if (atomic_fetch_add(&spy_calls, 1) % 16 == 0 && !atomic_load(&spill_seen[a->side])) {
    DIR *d = opendir(a->dir);
    if (!d) return fl_set_error(FL_EIO, "spy: cannot open %s", a->dir);
    struct dirent *e;
    while ((e = readdir(d)))
      if (strncmp(e->d_name, "spill-", 6) == 0) atomic_store(&spill_seen[a->side], 1);
    closedir(d);
  }
  return fl_buf_append(out, rec.data, rec.len);
}

static void check_spills(fl_context *c, size_t n, bool expect_spills) {
  const shape s = {"spill", n, 8, (uint32_t)(n / 10), KEYS_PLAIN, false};
  rec_list in = {0};
  gen_pairs(&s, 700 + n, false, 0, &in);
  spy_arg map_side = {.side = 0}, reduce_side = {.side = 1};
  snprintf(map_side.dir, sizeof map_side.dir, "%s", c->work_dir);
  snprintf(reduce_side.dir, sizeof reduce_side.dir, "%s", c->work_dir);
  fl_dataset *ds = make_ds(c, &in, s.in_parts), *spied;
  assert_ok(fl_map(ds, spy_map, &map_side, sizeof map_side, &spied));
  kv *a = sorted_kvs(&in);

  for (int op = 0; op < 3; op++) {
    atomic_store(&spill_seen[0], 0);
    atomic_store(&spill_seen[1], 0);
    fl_dataset *shuffled, *out;
    if (op == 0) assert_ok(fl_reduce_by_key(spied, add_i64, NULL, 0, NULL, 4, &shuffled));
    if (op == 1) assert_ok(fl_group_by_key(spied, NULL, 4, &shuffled));
    if (op == 2) assert_ok(fl_sort_by_key(spied, true, NULL, NULL, 0, 4, &shuffled));
    assert_ok(fl_map(shuffled, spy_map, &reduce_side, sizeof reduce_side, &out));
    rec_list got = {0}, want = {0};
    collect_list(out, &got);
    assert_int_equal(atomic_load(&spill_seen[0]), expect_spills);
    assert_int_equal(atomic_load(&spill_seen[1]), expect_spills);
    if (op == 0) {
      for (size_t i = 0, j; i < in.n; i = j) {
        j = run_end(a, in.n, i);
        int64_t sum = 0;
        for (size_t x = i; x < j; x++) sum += fl_i64(a[x].value);
        rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
      }
      assert_same_records(&got, &want, "reduce_by_key (spilling)");
    } else if (op == 1) {
      rec_list canon = {0};
      views vals = {0};
      for (size_t i = 0; i < got.n; i++) {
        fl_bytes k, g;
        split(rl_get(&got, i), &k, &g);
        group_values(g, &vals);
        fl_buf *b = rl_add(&canon);
        put_field(b, k);
        put_values(b, vals.v, vals.n);
      }
      for (size_t i = 0, j; i < in.n; i = j) {
        j = run_end(a, in.n, i);
        vals.n = 0;
        for (size_t x = i; x < j; x++) views_push(&vals, a[x].value);
        fl_buf *b = rl_add(&want);
        put_field(b, a[i].key);
        put_values(b, vals.v, vals.n);
      }
      assert_same_records(&canon, &want, "group_by_key (spilling)");
      rl_free(&canon);
      free(vals.v);
    } else {
      for (size_t i = 1; i < got.n; i++) {
        fl_bytes k0, k1, v;
        split(rl_get(&got, i - 1), &k0, &v);
        split(rl_get(&got, i), &k1, &v);
        assert_true(bytes_cmp(k0, k1) <= 0);
      }
      for (size_t i = 0; i < in.n; i++) rl_push(&want, rl_get(&in, i));
      assert_same_records(&got, &want, "sort_by_key (spilling)");
    }
    rl_free(&got);
    rl_free(&want);
    fl_dataset_free(out);
    fl_dataset_free(shuffled);
  }
  /* No spill file is left behind. */
  DIR *d = opendir(c->work_dir);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d))) assert_int_not_equal(strncmp(e->d_name, "spill-", 6), 0);
  closedir(d);
  free(a);
  rl_free(&in);
  fl_dataset_free(spied);
  fl_dataset_free(ds);
}

static void test_spill_path(void **state) {
  (void)state;
  /* 64 KiB spills runs of hundreds of records on both sides; 4096 bytes is raised to the
   * sorter's floor (16 KiB) and spills runs of a few dozen records, merged 64 at a time so
   * that open files stay bounded. The 64 MiB control spills nothing, so the spy can tell. */
  const struct {
    uint64_t memory;
    size_t n;
    bool spills;
  } runs[] = {{64u << 10, 50000, true}, {4096, 20000, true}, {64u << 20, 50000, false}};
  for (size_t r = 0; r < 3; r++) {
    fl_options opts = FL_OPTIONS_INIT;
    opts.shuffle_memory = runs[r].memory;
    fl_context *c;
    assert_ok(fl_context_open("local[2]", &opts, &c));
    check_spills(c, runs[r].n, runs[r].spills);
    fl_context_close(c);
  }
}

/* ---- reuse ------------------------------------------------------------------------------ */

static uint64_t tasks_now(void) {
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  return st.tasks_run;
}

static void test_reuse_of_shuffle_output(void **state) {
  (void)state;
  const shape s = {"reuse", 2000, 4, 100, KEYS_PLAIN, false};
  rec_list in = {0}, got = {0};
  gen_pairs(&s, 800, false, 0, &in);
  fl_dataset *ds = make_ds(ctx, &in, 4), *red, *child;
  assert_ok(fl_reduce_by_key(ds, add_i64, NULL, 0, NULL, 3, &red));
  fl_context_stats before, after;
  assert_ok(fl_context_stats_get(ctx, &before));
  uint64_t n;
  assert_ok(fl_count(red, &n));
  assert_int_equal(n, 100);
  assert_ok(fl_context_stats_get(ctx, &after));
  assert_int_equal(after.jobs_run - before.jobs_run, 1);
  assert_int_equal(after.tasks_run - before.tasks_run, 4 + 3); /* map stage, then reduce */
  /* A second action, and one on a child: the reduce partitions only. */
  uint64_t t0 = tasks_now();
  collect_list(red, &got);
  assert_int_equal(got.n, 100);
  assert_int_equal(tasks_now() - t0, 3);
  assert_ok(fl_map_values(red, double_value, NULL, 0, &child));
  t0 = tasks_now();
  assert_ok(fl_count(child, &n));
  assert_int_equal(n, 100);
  assert_int_equal(tasks_now() - t0, 3);
  /* A new shuffle over the same parent runs its own map stage. */
  fl_dataset *red2;
  assert_ok(fl_reduce_by_key(ds, add_i64, NULL, 0, NULL, 2, &red2));
  t0 = tasks_now();
  assert_ok(fl_count(red2, &n));
  assert_int_equal(tasks_now() - t0, 4 + 2);
  rl_free(&in);
  rl_free(&got);
  fl_dataset_free(red2);
  fl_dataset_free(child);
  fl_dataset_free(red);
  fl_dataset_free(ds);
}

static void test_partitioner_reuse(void **state) {
  (void)state;
  const shape s = {"pagerank", 2000, 6, 150, KEYS_PLAIN, false};
  rec_list in = {0}, in2 = {0}, got = {0}, want = {0};
  gen_pairs(&s, 900, false, 0, &in);
  gen_pairs(&s, 901, false, 75, &in2);
  fl_partitioner *h4, *h4b;
  assert_ok(fl_partitioner_hash(4, &h4));
  assert_ok(fl_partitioner_hash(4, &h4b)); /* another object, an equal partitioner */
  fl_dataset *ds = make_ds(ctx, &in, 6), *placed, *same, *mapped, *filtered, *red, *red_default, *red5;
  assert_ok(fl_partition_by(ds, h4, &placed));
  assert_int_equal(placed->num_shuffle_deps, 1);
  uint64_t n, t0 = tasks_now();
  assert_ok(fl_count(placed, &n));
  assert_int_equal(n, in.n);
  assert_int_equal(tasks_now() - t0, 6 + 4);
  /* partition_by with an equal partitioner is the same dataset. */
  assert_ok(fl_partition_by(placed, h4b, &same));
  assert_ptr_equal(same, placed);
  fl_dataset_free(same);

  /* map_values and filter keep the partitioner: reduce_by_key over an equal one (given, or
   * taken from the parent) reads the parent's partitions, with no map stage. */
  assert_ok(fl_map_values(placed, double_value, NULL, 0, &mapped));
  assert_ok(fl_filter(mapped, keep_positive, NULL, 0, &filtered));
  assert_ok(fl_reduce_by_key(filtered, add_i64, NULL, 0, h4b, 0, &red));
  assert_ok(fl_reduce_by_key(filtered, add_i64, NULL, 0, NULL, 0, &red_default));
  assert_ok(fl_reduce_by_key(filtered, add_i64, NULL, 0, NULL, 5, &red5)); /* not equal */
  assert_int_equal(red->num_shuffle_deps, 0);
  assert_int_equal(red_default->num_shuffle_deps, 0);
  assert_int_equal(fl_dataset_partitions(red_default), 4);
  assert_int_equal(red5->num_shuffle_deps, 1);
  t0 = tasks_now();
  collect_list(red, &got);
  assert_int_equal(tasks_now() - t0, 4);
  t0 = tasks_now();
  assert_ok(fl_count(red_default, &n));
  assert_int_equal(tasks_now() - t0, 4);
  assert_int_equal(n, got.n);
  t0 = tasks_now();
  assert_ok(fl_count(red5, &n));
  assert_int_equal(tasks_now() - t0, 4 + 5);
  assert_int_equal(n, got.n);
  kv *a = sorted_kvs(&in);
  for (size_t i = 0, j; i < in.n; i = j) {
    j = run_end(a, in.n, i);
    int64_t sum = 0;
    bool any = false;
    for (size_t x = i; x < j; x++)
      if (fl_i64(a[x].value) * 2 > 0) sum += fl_i64(a[x].value) * 2, any = true;
    if (any) rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
  }
  assert_same_records(&got, &want, "reduce_by_key without a shuffle");
  rl_free(&got);
  rl_free(&want);
  /* The lineage still shows the one shuffle it reads from. */
  char *lineage = fl_dataset_lineage(red);
  assert_non_null(lineage);
  assert_non_null(strstr(lineage, "reduce_by_key"));
  assert_non_null(strstr(lineage, "partition_by"));
  free(lineage);

  /* A join of two datasets placed by equal partitioners: no map stage either. */
  fl_dataset *ds2 = make_ds(ctx, &in2, 3), *placed2, *joined, *joined_shuffled;
  assert_ok(fl_partition_by(ds2, h4b, &placed2));
  assert_ok(fl_count(placed2, &n));
  assert_ok(fl_join(placed, placed2, FL_JOIN_INNER, NULL, 0, &joined));
  assert_int_equal(fl_dataset_partitions(joined), 4);
  assert_int_equal(joined->num_parents, 1); /* a flat map over the cogroup */
  assert_int_equal(joined->parents[0]->num_shuffle_deps, 0);
  t0 = tasks_now();
  collect_list(joined, &got);
  assert_int_equal(tasks_now() - t0, 4);
  for (size_t i = 0; i < got.n; i++) {
    fl_bytes k, jv, x, y;
    bool has_a, has_b;
    split(rl_get(&got, i), &k, &jv);
    assert_ok(fl_joined_get(jv, &has_a, &x, &has_b, &y));
    assert_true(has_a && has_b);
  }
  size_t expected = 0;
  for (size_t i = 0; i < in.n; i++)
    for (size_t j = 0; j < in2.n; j++) {
      fl_bytes ka, kb, v;
      split(rl_get(&in, i), &ka, &v);
      split(rl_get(&in2, j), &kb, &v);
      expected += bytes_eq(ka, kb);
    }
  assert_true(expected > 0);
  assert_int_equal(got.n, expected);
  rl_free(&got);
  /* Against a dataset that is not placed so, only that side is shuffled. */
  assert_ok(fl_join(placed, ds2, FL_JOIN_INNER, NULL, 0, &joined_shuffled));
  assert_int_equal(joined_shuffled->parents[0]->num_shuffle_deps, 1);
  t0 = tasks_now();
  assert_ok(fl_count(joined_shuffled, &n));
  assert_int_equal(n, expected);
  assert_int_equal(tasks_now() - t0, 3 + 4);

  free(a);
  rl_free(&in);
  rl_free(&in2);
  fl_dataset_free(joined_shuffled);
  fl_dataset_free(joined);
  fl_dataset_free(placed2);
  fl_dataset_free(ds2);
  fl_dataset_free(red5);
  fl_dataset_free(red_default);
  fl_dataset_free(red);
  fl_dataset_free(filtered);
  fl_dataset_free(mapped);
  fl_dataset_free(placed);
  fl_dataset_free(ds);
  fl_partitioner_free(h4);
  fl_partitioner_free(h4b);
}

/* ---- damaged shuffle files ------------------------------------------------------------- */

typedef struct damage_state {
  char base[4096], sub[4600];
  fl_context *c;
} damage_state;

static int damage_setup(void **state) {
  damage_state *d = calloc(1, sizeof *d);
  if (!d) return -1;
  test_tmpdir(d->base, sizeof d->base);
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = d->base;
  if (fl_context_open("local[2]", &opts, &d->c) != FL_OK) return -1;
  /* The context made one folder flint-XXXXXX under the work dir. */
  DIR *dir = opendir(d->base);
  if (!dir) return -1;
  struct dirent *e;
  int found = 0;
  while ((e = readdir(dir)))
    if (strncmp(e->d_name, "flint-", 6) == 0) {
      snprintf(d->sub, sizeof d->sub, "%s/%s", d->base, e->d_name);
      found++;
    }
  closedir(dir);
  *state = d;
  return found == 1 ? 0 : -1;
}

static int damage_teardown(void **state) {
  damage_state *d = *state;
  fl_context_close(d->c);
  test_rmtree(d->base);
  free(d);
  return 0;
}

/* Names in the folder that start with prefix and end with suffix. */
static size_t count_named(const char *dir, const char *prefix, const char *suffix) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name), sl = strlen(suffix);
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && len >= sl && strcmp(e->d_name + len - sl, suffix) == 0) n++;
  }
  closedir(d);
  return n;
}

typedef enum { DAMAGE_CORRUPT, DAMAGE_TRUNCATE, DAMAGE_DELETE_INDEX } damage_kind;

static void reduce_and_check(fl_context *c, uint64_t seed, fl_dataset **ds_out, fl_dataset **red_out) {
  /* Random full-range values: the blocks do not compress to nothing. */
  rec_list in = {0}, got = {0}, want = {0};
  fl_buf key = FL_BUF_INIT;
  for (size_t i = 0; i < 4000; i++) {
    uint64_t r = rng_next(&seed);
    make_key(KEYS_PLAIN, (uint32_t)(r % 1500), &key);
    int64_t v = (int64_t)(rng_next(&seed) >> 8);
    rl_push_pair(&in, fl_buf_bytes(&key), fl_bytes_of(&v, 8));
  }
  fl_buf_free(&key);
  fl_dataset *ds = make_ds(c, &in, 3), *red;
  assert_ok(fl_reduce_by_key(ds, add_i64, NULL, 0, NULL, 3, &red));
  collect_list(red, &got);
  kv *a = sorted_kvs(&in);
  for (size_t i = 0, j; i < in.n; i = j) {
    j = run_end(a, in.n, i);
    int64_t sum = 0;
    for (size_t x = i; x < j; x++) sum = (int64_t)((uint64_t)sum + (uint64_t)fl_i64(a[x].value));
    rl_push_pair(&want, a[i].key, fl_bytes_of(&sum, 8));
  }
  assert_same_records(&got, &want, "reduce_by_key before damage");
  free(a);
  rl_free(&in);
  rl_free(&got);
  rl_free(&want);
  *ds_out = ds;
  *red_out = red;
}

static void damage_test(damage_state *d, damage_kind kind) {
  fl_dataset *ds, *red;
  reduce_and_check(d->c, 1000 + kind, &ds, &red);
  assert_int_equal(red->num_shuffle_deps, 1);
  unsigned long long id = (unsigned long long)red->shuffle_deps[0]->shuffle_id;
  uint64_t before = 0;
  assert_ok(fl_count(red, &before));
  char prefix[64], data[4800], index[4900];
  snprintf(prefix, sizeof prefix, "shuffle_%llu_", id);
  assert_int_equal(count_named(d->sub, prefix, ".data"), 3); /* one per map task */
  assert_int_equal(count_named(d->sub, prefix, ".data.index"), 3);
  snprintf(data, sizeof data, "%s/shuffle_%llu_1.data", d->sub, id);
  snprintf(index, sizeof index, "%s/shuffle_%llu_1.data.index", d->sub, id);

  /* The index of map 1: four offsets; the largest block is damaged in its middle. */
  uint64_t off[4];
  FILE *f = fopen(index, "rb");
  assert_non_null(f);
  assert_int_equal(fread(off, 8, 4, f), 4);
  fclose(f);
  uint32_t r = 0;
  for (uint32_t q = 1; q < 3; q++)
    if (off[q + 1] - off[q] > off[r + 1] - off[r]) r = q;
  assert_true(off[r + 1] - off[r] > 256);
  struct stat st;
  assert_int_equal(stat(data, &st), 0);
  assert_int_equal((uint64_t)st.st_size, off[3]);
  if (kind == DAMAGE_CORRUPT) {
    int fd = open(data, O_RDWR);
    assert_true(fd >= 0);
    uint8_t bytes[16];
    off_t at = (off_t)(off[r] + (off[r + 1] - off[r]) / 2);
    assert_int_equal(pread(fd, bytes, sizeof bytes, at), sizeof bytes);
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] ^= 0x5a;
    assert_int_equal(pwrite(fd, bytes, sizeof bytes, at), sizeof bytes);
    close(fd);
  } else if (kind == DAMAGE_TRUNCATE) {
    assert_int_equal(truncate(data, st.st_size / 2), 0);
  } else {
    assert_int_equal(unlink(index), 0);
  }

  /* A new action on the same dataset: the reduce task's fetch fails, the scheduler marks
   * map 1's output lost, runs that map task again (it writes its files anew) and then the
   * reduce tasks: the same results as before the damage, never wrong data. */
  uint64_t n = 0;
  assert_ok(fl_count(red, &n));
  assert_int_equal(n, before);
  assert_int_equal(stat(data, &st), 0);
  assert_int_equal((uint64_t)st.st_size, off[3]); /* written again, whole */
  fl_records *recs = NULL;
  assert_ok(fl_collect(red, &recs));
  assert_int_equal(fl_records_count(recs), before);
  fl_records_free(recs);
  /* The context goes on: another dataset's shuffle works. */
  fl_dataset *ds2, *red2;
  reduce_and_check(d->c, 2000 + kind, &ds2, &red2);
  fl_dataset_free(red2);
  fl_dataset_free(ds2);
  fl_dataset_free(red);
  fl_dataset_free(ds);
  /* Freeing the shuffled dataset removes its files. */
  assert_int_equal(count_named(d->sub, prefix, ".data"), 0);
}

static void test_corrupt_shuffle_block(void **state) { damage_test(*state, DAMAGE_CORRUPT); }
static void test_truncated_shuffle_file(void **state) { damage_test(*state, DAMAGE_TRUNCATE); }
static void test_deleted_shuffle_index(void **state) { damage_test(*state, DAMAGE_DELETE_INDEX); }

/* ---- bad input and errors -------------------------------------------------------------- */

static void test_bad_input_and_errors(void **state) {
  (void)state;
  /* Records that are not pairs among pairs. */
  rec_list good = {0}, bad = {0};
  const shape s = {"good", 200, 2, 20, KEYS_PLAIN, false};
  gen_pairs(&s, 1100, false, 0, &good);
  for (size_t i = 0; i < good.n; i++) rl_push(&bad, rl_get(&good, i));
  for (size_t i = 0; i < 10; i++) rl_push(&bad, rl_get(&good, i * 3)); /* repeated pairs */
  rl_push(&bad, fl_bytes_str("abc")); /* a key length of 97 */
  rl_push(&bad, fl_bytes_of(NULL, 0));
  fl_dataset *g = make_ds(ctx, &good, 2), *b = make_ds(ctx, &bad, 2), *out;
  uint64_t n;
  assert_ok(fl_reduce_by_key(b, add_i64, NULL, 0, NULL, 3, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "not a pair");
  fl_dataset_free(out);
  assert_ok(fl_group_by_key(b, NULL, 2, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "not a pair");
  fl_dataset_free(out);
  fl_partitioner *h3;
  assert_ok(fl_partitioner_hash(3, &h3));
  assert_ok(fl_partition_by(b, h3, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "not a pair");
  fl_dataset_free(out);
  assert_ok(fl_join(g, b, FL_JOIN_INNER, NULL, 2, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "not a pair");
  fl_dataset_free(out);
  assert_ok(fl_subtract_by_key(b, g, NULL, 2, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "not a pair");
  fl_dataset_free(out);
  fl_records *recs = NULL;
  assert_fails_with(fl_count_by_key(b, &recs), FL_EJOB, "not a pair");
  assert_null(recs);
  /* sort_by_key samples its keys first, in a job, and fails there like any wide operation. */
  out = NULL;
  assert_fails_with(fl_sort_by_key(b, true, NULL, NULL, 0, 2, &out), FL_EJOB, "not a pair");
  assert_null(out);
  /* repartition takes any records (distinct too: see test_distinct_and_count_by_key). */
  assert_ok(fl_repartition(b, 3, &out));
  assert_ok(fl_count(out, &n));
  assert_int_equal(n, bad.n);
  fl_dataset_free(out);

  /* NULL arguments and bad sizes. */
  fl_partitioner *p = NULL;
  out = NULL;
  assert_int_equal(fl_reduce_by_key(NULL, add_i64, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_reduce_by_key(g, NULL, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_reduce_by_key(g, add_i64, NULL, 0, NULL, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_reduce_by_key(g, add_i64, NULL, 4, NULL, 2, &out), FL_EINVAL);
  int64_t zero = 0;
  assert_int_equal(fl_fold_by_key(NULL, fl_bytes_of(&zero, 8), add_i64, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_fold_by_key(g, fl_bytes_of(&zero, 8), NULL, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_fold_by_key(g, fl_bytes_of(NULL, 8), add_i64, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_aggregate_by_key(g, fl_bytes_of(&zero, 8), NULL, add_i64, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_aggregate_by_key(g, fl_bytes_of(&zero, 8), add_i64, NULL, NULL, 0, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_combine_by_key(g, NULL, comb_merge_value, comb_merge_combiners, NULL, 0, NULL, 2, true, &out), FL_EINVAL);
  assert_int_equal(fl_combine_by_key(g, comb_create, NULL, comb_merge_combiners, NULL, 0, NULL, 2, true, &out), FL_EINVAL);
  assert_int_equal(fl_combine_by_key(g, comb_create, comb_merge_value, NULL, NULL, 0, NULL, 2, true, &out), FL_EINVAL);
  assert_int_equal(fl_combine_by_key(NULL, comb_create, comb_merge_value, comb_merge_combiners, NULL, 0, NULL, 2, true, &out), FL_EINVAL);
  assert_int_equal(fl_group_by_key(NULL, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_group_by_key(g, NULL, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_cogroup(g, NULL, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_cogroup(NULL, g, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_join(g, NULL, FL_JOIN_INNER, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_join(NULL, g, FL_JOIN_FULL, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_join(g, g, FL_JOIN_INNER, NULL, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_join(g, g, (fl_join_kind)7, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_subtract_by_key(g, NULL, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_subtract_by_key(NULL, g, NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_sort_by_key(NULL, true, NULL, NULL, 0, 2, &out), FL_EINVAL);
  assert_int_equal(fl_sort_by_key(g, true, NULL, NULL, 0, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_partition_by(g, NULL, &out), FL_EINVAL);
  assert_int_equal(fl_partition_by(NULL, h3, &out), FL_EINVAL);
  assert_int_equal(fl_partition_by(g, h3, NULL), FL_EINVAL);
  assert_int_equal(fl_repartition(NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_repartition(g, 0, &out), FL_EINVAL);
  assert_int_equal(fl_repartition(g, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_distinct(NULL, 2, &out), FL_EINVAL);
  assert_int_equal(fl_distinct(g, 2, NULL), FL_EINVAL);
  assert_int_equal(fl_count_by_key(NULL, &recs), FL_EINVAL);
  assert_int_equal(fl_count_by_key(g, NULL), FL_EINVAL);
  assert_null(out);
  assert_null(recs);
  assert_int_equal(fl_partitioner_hash(0, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_hash(2, NULL), FL_EINVAL);
  assert_int_equal(fl_partitioner_custom(2, NULL, NULL, 0, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_custom(0, wild_partition, &zero, 4, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_custom(2, wild_partition, NULL, 4, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_range(NULL, 2, true, NULL, NULL, 0, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_range(g, 0, true, NULL, NULL, 0, &p), FL_EINVAL);
  assert_int_equal(fl_partitioner_range(g, 2, true, NULL, NULL, 0, NULL), FL_EINVAL);
  assert_null(p);
  assert_int_equal(fl_partitioner_partitions(NULL), 0);
  fl_partitioner_free(NULL);
  fl_bytes ga, gb, x, y;
  bool has_a, has_b;
  assert_int_equal(fl_cogroup_get(fl_bytes_str("\x01" "a"), NULL, &gb), FL_EINVAL);
  assert_int_equal(fl_cogroup_get(fl_bytes_str("\x05" "a"), &ga, &gb), FL_EFORMAT);
  assert_int_equal(fl_joined_get(fl_bytes_str("\x03\x01" "ab"), NULL, &x, &has_b, &y), FL_EINVAL);
  assert_int_equal(fl_joined_get(fl_bytes_of(NULL, 0), &has_a, &x, &has_b, &y), FL_EFORMAT);
  assert_int_equal(fl_joined_get(fl_bytes_str("\x09\x01" "ab"), &has_a, &x, &has_b, &y), FL_EFORMAT);
  size_t pos = 0;
  fl_bytes v;
  assert_false(fl_group_next(fl_bytes_of(NULL, 0), &pos, &v));
  assert_false(fl_group_next(fl_bytes_str("\x01" "a"), NULL, &v));
  assert_false(fl_group_next(fl_bytes_str("\x07" "a"), &pos, &v)); /* runs past the end */

  /* User functions that fail: the job fails naming them and their message. */
  assert_ok(fl_reduce_by_key(g, fail_sum, NULL, 0, NULL, 2, &out)); /* map-side merge */
  assert_fails_with(fl_count(out, &n), FL_EJOB, "fail_sum");
  assert_non_null(strstr(fl_last_error(), "sum refused"));
  fl_dataset_free(out);
  assert_ok(fl_fold_by_key(g, fl_bytes_of(&zero, 8), fail_sum, NULL, 0, NULL, 2, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "fail_sum");
  fl_dataset_free(out);
  assert_ok(fl_combine_by_key(g, fail_create, comb_merge_value, comb_merge_combiners, NULL, 0, NULL, 2, false, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "fail_create"); /* reduce side */
  assert_non_null(strstr(fl_last_error(), "create refused"));
  fl_dataset_free(out);
  assert_ok(fl_combine_by_key(g, comb_create, comb_merge_value, fail_combine, NULL, 0, NULL, 2, true, &out));
  assert_fails_with(fl_count(out, &n), FL_EJOB, "fail_combine"); /* merging map outputs */
  assert_non_null(strstr(fl_last_error(), "combine refused"));
  fl_dataset_free(out);

  /* The context still works. */
  assert_ok(fl_reduce_by_key(g, add_i64, NULL, 0, NULL, 2, &out));
  assert_ok(fl_count(out, &n));
  assert_int_equal(n, 20);
  fl_dataset_free(out);
  fl_partitioner_free(h3);
  fl_dataset_free(g);
  fl_dataset_free(b);
  rl_free(&good);
  rl_free(&bad);
}

/* In the sanitizer build, undefined behaviour in the sorter aborts the program (see the
 * report of these tests): the tests that reach it come last, so that the others run.
 * FLINT_TEST_FILTER (a cmocka pattern such as "test_sort*") runs some tests only. */
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reduce_by_key),
      cmocka_unit_test(test_fold_by_key),
      cmocka_unit_test(test_aggregate_by_key),
      cmocka_unit_test(test_combine_by_key),
      cmocka_unit_test(test_partition_by),
      cmocka_unit_test(test_repartition),
      cmocka_unit_test(test_range_partitioner),
      cmocka_unit_test(test_spill_path),
      cmocka_unit_test(test_reuse_of_shuffle_output),
      cmocka_unit_test(test_partitioner_reuse),
      cmocka_unit_test_setup_teardown(test_corrupt_shuffle_block, damage_setup, damage_teardown),
      cmocka_unit_test_setup_teardown(test_truncated_shuffle_file, damage_setup, damage_teardown),
      cmocka_unit_test_setup_teardown(test_deleted_shuffle_index, damage_setup, damage_teardown),
      cmocka_unit_test(test_bad_input_and_errors),
      /* distinct: zero-length combiners replaced in place (sorter.c: memcpy from NULL) */
      cmocka_unit_test(test_distinct_and_count_by_key),
      /* empty reduce partitions sorted by key (sorter.c: qsort_r of NULL) */
      cmocka_unit_test(test_group_by_key),
      cmocka_unit_test(test_sort_by_key),
      cmocka_unit_test(test_cogroup_join_subtract),
  };
  const char *filter = getenv("FLINT_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, setup, teardown);
}
