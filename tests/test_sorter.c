/* test_sorter.c: unit tests of the external sorter behind both sides of a shuffle
 * (shuffle/sorter.c): order by partition, or by (partition, key) ascending, descending or
 * by a user compare; aggregation with and without create, zero and map-side combiners;
 * memory budgets from huge to tiny (one run per entry) giving the same output; combining
 * equal keys across runs; the append path of combiners that change length; zero-length
 * keys and values; entries larger than a run chunk; spill files removed by destroy; and
 * user functions that fail. */
#include "test_util.h"

#include <dirent.h>
#include <stdatomic.h>

#include "shuffle/shuffle.h"

static char dir[4096]; /* where the runs go; empty between tests */

static int setup(void **state) {
  (void)state;
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/flint-sorter-XXXXXX", base && *base ? base : "/tmp");
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  test_rmtree(dir);
  return 0;
}

static size_t count_files(void) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* ---- entries ---------------------------------------------------------------------------- */

typedef struct ent {
  uint32_t part;
  fl_buf key, value;
} ent;

typedef struct ents {
  ent *v;
  size_t n, cap;
} ents;

static void ents_push(ents *e, uint32_t part, fl_bytes key, fl_bytes value) {
  if (e->n == e->cap) {
    e->cap = e->cap ? e->cap * 2 : 256;
    e->v = realloc(e->v, e->cap * sizeof *e->v);
    assert_non_null(e->v);
  }
  ent *x = &e->v[e->n++];
  x->part = part;
  x->key = (fl_buf)FL_BUF_INIT;
  x->value = (fl_buf)FL_BUF_INIT;
  /* Empty keys and values still point at memory here; views without any are tested on
   * their own (test_empty_views_without_data). */
  assert_ok(fl_buf_reserve(&x->key, 1));
  assert_ok(fl_buf_reserve(&x->value, 1));
  assert_ok(fl_buf_append(&x->key, key.data, key.len));
  assert_ok(fl_buf_append(&x->value, value.data, value.len));
}

static void ents_free(ents *e) {
  for (size_t i = 0; i < e->n; i++) {
    fl_buf_free(&e->v[i].key);
    fl_buf_free(&e->v[i].value);
  }
  free(e->v);
  *e = (ents){0};
}

static fl_bytes kb(const ent *x) { return fl_buf_bytes(&x->key); }
static fl_bytes vb(const ent *x) { return fl_buf_bytes(&x->value); }

static int bytes_cmp(fl_bytes a, fl_bytes b) { return rdd_compare_keys(NULL, NULL, a, b); }
static bool bytes_eq(fl_bytes a, fl_bytes b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0);
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef enum { KEY_BYTES, KEY_I64 } key_kind;
typedef enum { VAL_I64, VAL_VAR, VAL_BIG } val_kind;

/* Key number id: KEY_BYTES gives "\0\0\0", "\0", "\0\0" and then keys with zero bytes
 * of 3 to 7 bytes (prefixes of each other for some ids); KEY_I64 gives int64 of both
 * signs. The empty key has its own test (test_zero_length_keys_and_values). */
static void make_key(key_kind kind, uint32_t id, fl_buf *out) {
  out->len = 0;
  if (kind == KEY_I64) {
    int64_t v = ((int64_t)id - 500) * 1000003;
    assert_ok(fl_buf_put_i64(out, v));
    return;
  }
  static const uint8_t zeros[3] = {0, 0, 0};
  if (id < 3) {
    assert_ok(fl_buf_append(out, zeros, id ? id : 3));
    return;
  }
  uint8_t k[8] = {(uint8_t)id, 0, (uint8_t)(id >> 8), 'a', 'a', 'a', 'a', 0};
  assert_ok(fl_buf_append(out, k, 3 + id % 5));
}

static void make_value(val_kind kind, uint64_t r, fl_buf *out) {
  out->len = 0;
  if (kind == VAL_I64) {
    assert_ok(fl_buf_put_i64(out, (int64_t)(r % 2001) - 1000));
  } else if (kind == VAL_VAR) {
    uint8_t v[12];
    size_t len = (size_t)(r % 13); /* 0..12 bytes, often with zero bytes */
    for (size_t i = 0; i < len; i++) v[i] = (uint8_t)((r >> (8 + i * 4)) & 0x13);
    assert_ok(fl_buf_append(out, v, len));
  } else {
    size_t len = 10000 + (size_t)(r % 500);
    assert_ok(fl_buf_reserve(out, len));
    for (size_t i = 0; i < len; i++) out->data[i] = (uint8_t)(r * 31 + i * 7 + (i >> 5));
    out->len = len;
  }
}

static void make_input(ents *e, size_t n, uint32_t parts, uint32_t distinct, key_kind kk,
                       val_kind vk, uint64_t seed) {
  fl_buf key = FL_BUF_INIT, value = FL_BUF_INIT;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(&seed);
    make_key(kk, (uint32_t)(r % distinct), &key);
    make_value(vk, rng_next(&seed), &value);
    ents_push(e, (uint32_t)((r >> 32) % parts), fl_buf_bytes(&key), fl_buf_bytes(&value));
  }
  fl_buf_free(&key);
  fl_buf_free(&value);
}

/* ---- user functions (exported, so that failures name them) ---------------------------- */

static const uint32_t compare_magic = 0x5eed;
static atomic_int bad_compare_arg;

int compare_i64_keys(fl_bytes a, fl_bytes b, const void *arg) {
  if (!arg || *(const uint32_t *)arg != compare_magic) atomic_store(&bad_compare_arg, 1);
  int64_t x = fl_i64(a), y = fl_i64(b);
  return (x > y) - (x < y);
}

fl_status sum_i64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

/* combiner (sum, count) */
fl_status pair_create(fl_bytes v, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t c[2] = {fl_i64(v), 1};
  return fl_buf_append(out, c, sizeof c);
}
fl_status pair_add_value(fl_bytes acc, fl_bytes v, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t c[2];
  memcpy(c, acc.data, sizeof c);
  c[0] += fl_i64(v);
  c[1] += 1;
  return fl_buf_append(out, c, sizeof c);
}
fl_status pair_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x[2], y[2];
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  x[0] += y[0];
  x[1] += y[1];
  return fl_buf_append(out, x, sizeof x);
}

#define BOUND 40
/* Concatenation keeping the last BOUND bytes: associative, and its length changes. */
fl_status bounded_concat(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  fl_status s = fl_buf_append(out, a.data, a.len);
  if (s == FL_OK) s = fl_buf_append(out, b.data, b.len);
  if (s == FL_OK && out->len > BOUND) {
    memmove(out->data, out->data + out->len - BOUND, BOUND);
    out->len = BOUND;
  }
  return s;
}
fl_status concat(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  fl_status s = fl_buf_append(out, a.data, a.len);
  return s == FL_OK ? fl_buf_append(out, b.data, b.len) : s;
}

fl_status fail_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)a, (void)b, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "merge refused");
}
fl_status fail_merge_combiners(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)a, (void)b, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "combiners refused");
}
fl_status fail_create(fl_bytes v, fl_buf *out, const void *arg) {
  (void)v, (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "create refused");
}

/* ---- running the sorter ------------------------------------------------------------------ */

/* From the engine's default (64 MiB: no spill here) through budgets that spill runs of
 * some entries (the sorter counts its 8 KiB entry index and, aggregating, its 32 KiB
 * table) down to one run per entry. A run is a file: budget 1 is used sparingly, as
 * creating files costs about 0.1 ms each here. */
static const uint64_t budgets[] = {64u << 20, 1u << 20, 64u << 10, 48u << 10, 1};
#define NUM_BUDGETS (sizeof budgets / sizeof budgets[0])

/* Inserts one at a time, or through shuffle_sorter_insert_batch in batches of 1 to
 * RDD_ITER_BATCH entries, with the keys' hashes given (as the map side does) in every
 * other batch. */
static bool use_batches;

static void insert_all(shuffle_sorter *s, const ents *in) {
  if (!use_batches) {
    for (size_t i = 0; i < in->n; i++)
      assert_ok(shuffle_sorter_insert(s, in->v[i].part, kb(&in->v[i]), vb(&in->v[i])));
    return;
  }
  uint32_t parts[RDD_ITER_BATCH];
  fl_bytes keys[RDD_ITER_BATCH], values[RDD_ITER_BATCH];
  uint64_t hashes[RDD_ITER_BATCH];
  uint64_t seed = in->n;
  for (size_t i = 0, batch = 0; i < in->n; batch++) {
    uint32_t n = (uint32_t)(rng_next(&seed) % RDD_ITER_BATCH) + 1;
    if (i % 3 == 0) n = RDD_ITER_BATCH;
    if (n > in->n - i) n = (uint32_t)(in->n - i);
    for (uint32_t j = 0; j < n; j++) {
      parts[j] = in->v[i + j].part;
      keys[j] = kb(&in->v[i + j]);
      values[j] = vb(&in->v[i + j]);
      hashes[j] = common_hash_bytes(keys[j].data, keys[j].len);
    }
    assert_ok(shuffle_sorter_insert_batch(s, n, parts, keys, values, batch % 2 ? hashes : NULL));
    i += n;
  }
}

/* Inserts everything, finishes, drains; checks the spill files are there while the sorter
 * lives and gone after destroy. Returns the number of runs spilled. */
static uint32_t run_sorter(const shuffle_sorter_config *cfg, const ents *in, ents *out) {
  shuffle_sorter *s;
  assert_int_equal(count_files(), 0);
  assert_ok(shuffle_sorter_create(cfg, &s));
  insert_all(s, in);
  assert_ok(shuffle_sorter_finish(s));
  uint32_t spills = shuffle_sorter_spills(s);
  /* A file per run on disk: at least one once anything spilled, and never more than the
   * 64 that trigger a merge of the runs into one. */
  if (spills == 0) assert_int_equal(count_files(), 0);
  else assert_true(count_files() >= 1 && count_files() <= 64);
  uint32_t part;
  fl_bytes k, v;
  while (shuffle_sorter_next(s, &part, &k, &v)) ents_push(out, part, k, v);
  if (cfg->task->status != FL_OK) fprintf(stderr, "sorter failed: %s\n", cfg->task->error);
  assert_int_equal(cfg->task->status, FL_OK);
  assert_false(shuffle_sorter_next(s, &part, &k, &v)); /* the end stays the end */
  shuffle_sorter_destroy(s);
  assert_int_equal(count_files(), 0);
  return spills;
}

static int entry_order(const shuffle_sorter_config *cfg, const ent *a, const ent *b) {
  if (a->part != b->part) return a->part < b->part ? -1 : 1;
  if (!cfg->order_keys) return 0;
  int c = rdd_compare_keys(cfg->key_order, cfg->key_order_arg, kb(a), kb(b));
  return cfg->descending ? -c : c;
}

static void assert_ordered(const shuffle_sorter_config *cfg, const ents *out) {
  for (size_t i = 1; i < out->n; i++) {
    if (entry_order(cfg, &out->v[i - 1], &out->v[i]) > 0) fprintf(stderr, "out of order at %zu\n", i);
    assert_true(entry_order(cfg, &out->v[i - 1], &out->v[i]) <= 0);
  }
}

/* Entries as comparable byte strings: [part][key length][key][value]. */
static int cmp_canon(const void *x, const void *y) {
  return bytes_cmp(fl_buf_bytes(x), fl_buf_bytes(y));
}
static fl_buf *canon(const ents *e) {
  fl_buf *c = calloc(e->n ? e->n : 1, sizeof *c);
  assert_non_null(c);
  for (size_t i = 0; i < e->n; i++) {
    uint32_t h[2] = {__builtin_bswap32(e->v[i].part), (uint32_t)e->v[i].key.len};
    assert_ok(fl_buf_append(&c[i], h, sizeof h));
    assert_ok(fl_buf_append(&c[i], e->v[i].key.data, e->v[i].key.len));
    assert_ok(fl_buf_append(&c[i], e->v[i].value.data, e->v[i].value.len));
  }
  qsort(c, e->n, sizeof *c, cmp_canon);
  return c;
}

static void assert_same_multiset(const ents *a, const ents *b) {
  assert_int_equal(a->n, b->n);
  fl_buf *ca = canon(a), *cb = canon(b);
  for (size_t i = 0; i < a->n; i++) {
    assert_true(bytes_eq(fl_buf_bytes(&ca[i]), fl_buf_bytes(&cb[i])));
  }
  for (size_t i = 0; i < a->n; i++) {
    fl_buf_free(&ca[i]);
    fl_buf_free(&cb[i]);
  }
  free(ca);
  free(cb);
}

/* The same entries in the same order. */
static void assert_same_sequence(const ents *a, const ents *b) {
  assert_int_equal(a->n, b->n);
  for (size_t i = 0; i < a->n; i++) {
    if (a->v[i].part != b->v[i].part || !bytes_eq(kb(&a->v[i]), kb(&b->v[i])) ||
        !bytes_eq(vb(&a->v[i]), vb(&b->v[i])))
      fprintf(stderr, "entries differ at %zu (part %u/%u, key %zu/%zu bytes, value %zu/%zu bytes)\n", i,
              a->v[i].part, b->v[i].part, a->v[i].key.len, b->v[i].key.len, a->v[i].value.len,
              b->v[i].value.len);
    assert_int_equal(a->v[i].part, b->v[i].part);
    assert_true(bytes_eq(kb(&a->v[i]), kb(&b->v[i])));
    assert_true(bytes_eq(vb(&a->v[i]), vb(&b->v[i])));
  }
}

/* The reference of an aggregation: input sorted (stably) by the config's order, then each
 * (partition, key) folded in insertion order: first = create(v) or merge_value(zero, v) or
 * v, then merge_value(acc, v). */
static const shuffle_sorter_config *sort_cfg;
static const ents *sort_in;
static int cmp_index(const void *x, const void *y) {
  size_t i = *(const size_t *)x, j = *(const size_t *)y;
  int c = entry_order(sort_cfg, &sort_in->v[i], &sort_in->v[j]);
  if (c) return c;
  return (i > j) - (i < j);
}
static size_t *sorted_indexes(const shuffle_sorter_config *cfg, const ents *in) {
  size_t *idx = malloc((in->n ? in->n : 1) * sizeof *idx);
  assert_non_null(idx);
  for (size_t i = 0; i < in->n; i++) idx[i] = i;
  static shuffle_sorter_config keyed;
  keyed = *cfg;
  keyed.order_keys = true; /* equal keys adjacent */
  sort_cfg = &keyed;
  sort_in = in;
  qsort(idx, in->n, sizeof *idx, cmp_index);
  return idx;
}

static void reference_aggregate(const shuffle_sorter_config *cfg, const ents *in, ents *out) {
  const rdd_aggregator *a = cfg->agg;
  size_t *idx = sorted_indexes(cfg, in);
  fl_buf acc = FL_BUF_INIT, next = FL_BUF_INIT;
  for (size_t i = 0; i < in->n;) {
    const ent *first = &in->v[idx[i]];
    acc.len = 0;
    if (cfg->values_are_combiners || (!a->create && !a->has_zero))
      assert_ok(fl_buf_append(&acc, first->value.data, first->value.len));
    else if (a->create)
      assert_ok(a->create(vb(first), &acc, a->arg));
    else
      assert_ok(a->merge_value(a->zero, vb(first), &acc, a->arg));
    size_t j = i + 1;
    for (; j < in->n && in->v[idx[j]].part == first->part && bytes_eq(kb(&in->v[idx[j]]), kb(first)); j++) {
      next.len = 0;
      fl_reduce_fn f = cfg->values_are_combiners ? a->merge_combiners : a->merge_value;
      assert_ok(f(fl_buf_bytes(&acc), vb(&in->v[idx[j]]), &next, a->arg));
      fl_buf t = acc;
      acc = next;
      next = t;
    }
    ents_push(out, first->part, kb(first), fl_buf_bytes(&acc));
    i = j;
  }
  fl_buf_free(&acc);
  fl_buf_free(&next);
  free(idx);
}

/* Runs the aggregation under every budget, inserting one by one and in batches, with and
 * without key order: each output equals the reference (exactly, in key order; as a
 * multiset in partition order otherwise). Returns the runs of the smallest budget. */
static uint32_t check_aggregate_all_budgets(shuffle_sorter_config cfg, const ents *in) {
  rdd_task task = {0};
  cfg.task = &task;
  cfg.dir = dir;
  ents want = {0};
  reference_aggregate(&cfg, in, &want);
  /* The sorter raises tiny budgets to a 16 KiB floor: its smallest budget must spill
   * more than once only when the combined entries are well past that. */
  size_t combined_bytes = 0;
  for (size_t i = 0; i < want.n; i++) combined_bytes += 16 + want.v[i].key.len + want.v[i].value.len;
  bool must_spill = combined_bytes > (64u << 10);
  uint32_t spills = 0;
  for (int mode = 0; mode < 4; mode++) {
    use_batches = mode & 1;
    cfg.order_keys = mode < 2;
    for (size_t b = 0; b < NUM_BUDGETS - (mode != 0); b++) { /* budget 1: one mode */
      ents got = {0};
      cfg.memory = budgets[b];
      spills = run_sorter(&cfg, in, &got);
      if (b == 0) assert_int_equal(spills, 0);
      if (b == NUM_BUDGETS - 1 && must_spill) assert_true(spills > 1);
      assert_ordered(&cfg, &got);
      if (cfg.order_keys) {
        assert_same_sequence(&got, &want);
      } else {
        assert_same_multiset(&got, &want);
      }
      ents_free(&got);
    }
  }
  use_batches = false;
  ents_free(&want);
  rdd_task_clear(&task);
  return spills;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_order_by_partition_only(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 6000, 7, 3000, KEY_BYTES, VAL_VAR, 1);
  for (int many = 0; many < 2; many++) {
    if (many) { /* a thousand partitions, spread up to 100000 */
      for (size_t i = 0; i < in.n; i++) in.v[i].part = (uint32_t)(i * 7919 % 1000) * 100;
    }
    rdd_task task = {0};
    shuffle_sorter_config cfg = {.dir = dir, .order_keys = false, .task = &task};
    for (size_t b = 0; b < 2 * NUM_BUDGETS - 1; b++) {
      ents got = {0};
      cfg.memory = budgets[b % NUM_BUDGETS];
      use_batches = b >= NUM_BUDGETS;
      uint32_t spills = run_sorter(&cfg, &in, &got);
      if (b % NUM_BUDGETS == 0) {
        assert_int_equal(spills, 0);
        /* No run: partition order only, insertion order kept within a partition. */
        ents want = {0};
        for (uint32_t p = 0; p <= 100000; p++)
          for (size_t i = 0; i < in.n; i++)
            if (in.v[i].part == p) ents_push(&want, p, kb(&in.v[i]), vb(&in.v[i]));
        assert_same_sequence(&got, &want);
        ents_free(&want);
      }
      if (cfg.memory == 1) assert_true(spills > 1);
      assert_ordered(&cfg, &got);
      assert_same_multiset(&got, &in);
      ents_free(&got);
    }
    use_batches = false;
    rdd_task_clear(&task);
  }
  ents_free(&in);
}

static void test_order_by_key_asc_desc_and_user_compare(void **state) {
  (void)state;
  for (int variant = 0; variant < 4; variant++) {
    bool numeric = variant >= 2, desc = variant % 2 == 1;
    ents in = {0};
    make_input(&in, 6000, 3, 3000, numeric ? KEY_I64 : KEY_BYTES, VAL_VAR, 10 + (uint64_t)variant);
    rdd_task task = {0};
    shuffle_sorter_config cfg = {.dir = dir, .order_keys = true, .descending = desc, .task = &task};
    if (numeric) {
      cfg.key_order = compare_i64_keys;
      cfg.key_order_arg = &compare_magic;
    }
    ents first = {0};
    for (size_t b = 0; b < 2 * NUM_BUDGETS - 1; b++) {
      ents got = {0};
      cfg.memory = budgets[b % NUM_BUDGETS];
      use_batches = b >= NUM_BUDGETS;
      uint32_t spills = run_sorter(&cfg, &in, &got);
      if (cfg.memory == 1) assert_true(spills > 1);
      assert_ordered(&cfg, &got);
      assert_same_multiset(&got, &in);
      if (b == 0) {
        first = got;
        continue;
      }
      /* The (partition, key) sequence is the same whatever the budget. */
      assert_int_equal(got.n, first.n);
      for (size_t i = 0; i < got.n; i++) {
        assert_int_equal(got.v[i].part, first.v[i].part);
        assert_true(bytes_eq(kb(&got.v[i]), kb(&first.v[i])));
      }
      ents_free(&got);
    }
    use_batches = false;
    if (numeric) { /* the user order is not bytewise: some neighbours are out of bytewise order */
      bool differs = false;
      for (size_t i = 1; i < first.n; i++)
        if (first.v[i].part == first.v[i - 1].part &&
            bytes_cmp(kb(&first.v[i - 1]), kb(&first.v[i])) * (desc ? -1 : 1) > 0)
          differs = true;
      assert_true(differs);
    }
    ents_free(&first);
    ents_free(&in);
    rdd_task_clear(&task);
  }
  assert_int_equal(atomic_load(&bad_compare_arg), 0);
}

static void test_aggregate_sum_across_runs(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 6000, 5, 2000, KEY_BYTES, VAL_I64, 20);
  rdd_aggregator agg = {.merge_value = sum_i64, .merge_combiners = sum_i64};
  shuffle_sorter_config cfg = {.agg = &agg};
  check_aggregate_all_budgets(cfg, &in);
  /* Descending key order, and a user order over numeric keys. */
  cfg.descending = true;
  check_aggregate_all_budgets(cfg, &in);
  ents_free(&in);
  make_input(&in, 6000, 2, 2000, KEY_I64, VAL_I64, 21);
  cfg.key_order = compare_i64_keys;
  cfg.key_order_arg = &compare_magic;
  check_aggregate_all_budgets(cfg, &in);
  cfg.descending = false;
  check_aggregate_all_budgets(cfg, &in);
  /* Every entry one key: one combiner, merged across as many runs as entries. */
  for (size_t i = 0; i < in.n; i++) in.v[i].part = 0, in.v[i].key.data[0] = 'k', in.v[i].key.len = 1;
  cfg.key_order = NULL;
  check_aggregate_all_budgets(cfg, &in);
  ents_free(&in);
  assert_int_equal(atomic_load(&bad_compare_arg), 0);
}

static void test_aggregate_create_zero_and_combiners(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 1200, 4, 150, KEY_BYTES, VAL_I64, 30);
  /* create / merge_value / merge_combiners with a 16-byte combiner. */
  rdd_aggregator with_create = {.create = pair_create, .merge_value = pair_add_value, .merge_combiners = pair_merge};
  shuffle_sorter_config cfg = {.agg = &with_create};
  check_aggregate_all_budgets(cfg, &in);

  /* A zero: each key starts from merge_value(zero, v). A neutral zero gives the sums under
   * every budget. */
  int64_t zero = 0;
  rdd_aggregator with_zero = {.merge_value = sum_i64, .merge_combiners = sum_i64,
                              .zero = fl_bytes_of(&zero, 8), .has_zero = true};
  cfg.agg = &with_zero;
  check_aggregate_all_budgets(cfg, &in);

  /* Without spills a non-neutral zero is used exactly once per (partition, key). */
  int64_t thousand = 1000;
  with_zero.zero = fl_bytes_of(&thousand, 8);
  rdd_task task = {0};
  cfg.task = &task;
  cfg.dir = dir;
  cfg.memory = 64u << 20;
  cfg.order_keys = true;
  ents got = {0}, sums = {0};
  assert_int_equal(run_sorter(&cfg, &in, &got), 0);
  rdd_aggregator plain = {.merge_value = sum_i64, .merge_combiners = sum_i64};
  shuffle_sorter_config ref_cfg = {.agg = &plain, .order_keys = true};
  reference_aggregate(&ref_cfg, &in, &sums);
  assert_int_equal(got.n, sums.n);
  for (size_t i = 0; i < got.n; i++) {
    assert_true(bytes_eq(kb(&got.v[i]), kb(&sums.v[i])));
    assert_int_equal(fl_i64(vb(&got.v[i])), fl_i64(vb(&sums.v[i])) + 1000);
  }
  ents_free(&got);
  ents_free(&sums);
  rdd_task_clear(&task);

  /* Inserted values that are already combiners: only merge_combiners may run. */
  rdd_aggregator combiners = {.create = fail_create, .merge_value = fail_merge, .merge_combiners = sum_i64};
  cfg = (shuffle_sorter_config){.agg = &combiners, .values_are_combiners = true};
  check_aggregate_all_budgets(cfg, &in);
  ents_free(&in);
}

static void test_append_path_changing_combiner_length(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 1500, 3, 60, KEY_BYTES, VAL_VAR, 40);
  /* The combiner grows (appended as a new entry), stays at BOUND bytes (replaced in place)
   * or shrinks. Runs are merged in order, so the result is the insertion-order fold. */
  rdd_aggregator bounded = {.merge_value = bounded_concat, .merge_combiners = bounded_concat};
  check_aggregate_all_budgets((shuffle_sorter_config){.agg = &bounded}, &in);
  /* Unbounded growth: every merge appends; under a budget the arena spills mid-key. */
  rdd_aggregator grow = {.merge_value = concat, .merge_combiners = concat};
  uint32_t runs = check_aggregate_all_budgets((shuffle_sorter_config){.agg = &grow}, &in);
  assert_true(runs > 1);
  ents_free(&in);
}

static void test_zero_length_keys_and_values(void **state) {
  (void)state;
  ents in = {0};
  for (size_t i = 0; i < 300; i++) ents_push(&in, (uint32_t)(i % 3), fl_bytes_of(NULL, 0), fl_bytes_of(NULL, 0));
  rdd_task task = {0};
  /* Without aggregation every entry comes back, empty, in partition order. */
  shuffle_sorter_config cfg = {.dir = dir, .order_keys = true, .task = &task};
  for (size_t b = 0; b < NUM_BUDGETS; b++) {
    ents got = {0};
    cfg.memory = budgets[b];
    run_sorter(&cfg, &in, &got);
    assert_int_equal(got.n, 300);
    for (size_t i = 0; i < got.n; i++) {
      assert_int_equal(got.v[i].key.len, 0);
      assert_int_equal(got.v[i].value.len, 0);
      assert_int_equal(got.v[i].part, i / 100);
    }
    ents_free(&got);
  }
  rdd_task_clear(&task);
  /* Aggregated: one empty combiner per partition (replaced in place at length 0). */
  rdd_aggregator agg = {.merge_value = concat, .merge_combiners = concat};
  check_aggregate_all_budgets((shuffle_sorter_config){.agg = &agg}, &in);
  /* Empty keys with counting combiners made by create. */
  for (size_t i = 0; i < in.n; i++) assert_ok(fl_buf_put_i64(&in.v[i].value, 1));
  rdd_aggregator counts = {.create = pair_create, .merge_value = pair_add_value, .merge_combiners = pair_merge};
  check_aggregate_all_budgets((shuffle_sorter_config){.agg = &counts}, &in);
  ents_free(&in);

  /* Mixed: zero-length keys and values among others. */
  make_input(&in, 1000, 2, 40, KEY_BYTES, VAL_VAR, 41);
  for (size_t i = 0; i < in.n; i += 7) in.v[i].key.len = 0;
  size_t empty_keys = 0, empty_values = 0;
  for (size_t i = 0; i < in.n; i++) empty_keys += in.v[i].key.len == 0, empty_values += in.v[i].value.len == 0;
  assert_true(empty_keys > 0 && empty_values > 0);
  shuffle_sorter_config by_key = {.dir = dir, .order_keys = true, .task = &task};
  for (size_t b = 0; b < NUM_BUDGETS; b++) {
    ents got = {0};
    by_key.memory = budgets[b];
    run_sorter(&by_key, &in, &got);
    assert_ordered(&by_key, &got);
    assert_same_multiset(&got, &in);
    ents_free(&got);
  }
  rdd_task_clear(&task);
  ents_free(&in);
}

static void test_entries_larger_than_a_run_chunk(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 300, 2, 30, KEY_BYTES, VAL_BIG, 50); /* about 3 MB */
  rdd_task task = {0};
  shuffle_sorter_config cfg = {.dir = dir, .order_keys = true, .task = &task};
  const uint64_t mem[] = {64u << 20, 2u << 20, 1u << 20, 1};
  for (size_t b = 0; b < 4; b++) {
    ents got = {0};
    cfg.memory = mem[b];
    uint32_t spills = run_sorter(&cfg, &in, &got);
    assert_true(b == 0 ? spills == 0 : spills >= 1);
    assert_ordered(&cfg, &got);
    assert_same_multiset(&got, &in);
    ents_free(&got);
  }
  rdd_task_clear(&task);
  ents_free(&in);
  /* One key's combiner of 110 big values grows past a run chunk (1 MiB). */
  for (size_t i = 0; i < 110; i++) {
    fl_buf value = FL_BUF_INIT;
    make_value(VAL_BIG, i, &value);
    ents_push(&in, 0, fl_bytes_str("big"), fl_buf_bytes(&value));
    fl_buf_free(&value);
  }
  rdd_aggregator grow = {.merge_value = concat, .merge_combiners = concat};
  cfg.agg = &grow;
  ents want = {0};
  reference_aggregate(&cfg, &in, &want);
  assert_int_equal(want.n, 1);
  assert_true(want.v[0].value.len > (1u << 20));
  for (size_t b = 0; b < 4; b++) {
    ents got = {0};
    cfg.memory = mem[b];
    uint32_t spills = run_sorter(&cfg, &in, &got);
    assert_true(b == 0 ? spills == 0 : spills >= 1);
    assert_same_sequence(&got, &want);
    ents_free(&got);
  }
  ents_free(&want);
  rdd_task_clear(&task);
  ents_free(&in);
}

static void test_spill_files_removed_by_destroy(void **state) {
  (void)state;
  ents in = {0};
  make_input(&in, 6000, 4, 2000, KEY_BYTES, VAL_I64, 60);
  rdd_task task = {0};
  rdd_aggregator agg = {.merge_value = sum_i64, .merge_combiners = sum_i64};
  for (int with_agg = 0; with_agg < 2; with_agg++) {
    shuffle_sorter_config cfg = {.memory = 4096, .dir = dir, .order_keys = true, .task = &task,
                                 .agg = with_agg ? &agg : NULL};
    for (int stage = 0; stage < 3; stage++) {
      shuffle_sorter *s;
      assert_int_equal(count_files(), 0);
      assert_ok(shuffle_sorter_create(&cfg, &s));
      for (size_t i = 0; i < in.n; i++)
        assert_ok(shuffle_sorter_insert(s, in.v[i].part, kb(&in.v[i]), vb(&in.v[i])));
      assert_true(shuffle_sorter_spills(s) > 0);
      /* A file per run on disk, at most 64 (more are merged into one). */
      size_t files = count_files();
      assert_true(files >= 1 && files <= 64 && files <= shuffle_sorter_spills(s));
      if (stage >= 1) { /* finished, then partly read */
        assert_ok(shuffle_sorter_finish(s));
        files = count_files();
        assert_true(files >= 1 && files <= 64);
        uint32_t part;
        fl_bytes k, v;
        for (int i = 0; i < (stage == 1 ? 3 : 1000000); i++)
          if (!shuffle_sorter_next(s, &part, &k, &v)) break;
        assert_int_equal(task.status, FL_OK);
      }
      shuffle_sorter_destroy(s);
      assert_int_equal(count_files(), 0);
    }
  }
  shuffle_sorter_destroy(NULL);
  ents_free(&in);
  rdd_task_clear(&task);
}

/* Nothing inserted: no run, no entry, with or without key order and aggregation (the
 * reduce side of an empty partition). */
static void test_finish_with_nothing_inserted(void **state) {
  (void)state;
  rdd_task task = {0};
  rdd_aggregator agg = {.merge_value = sum_i64, .merge_combiners = sum_i64};
  for (int variant = 0; variant < 4; variant++) {
    shuffle_sorter *s;
    shuffle_sorter_config cfg = {.memory = variant < 2 ? 1 : 64u << 20, .dir = dir,
                                 .order_keys = variant % 2 == 0, .agg = variant == 3 ? &agg : NULL,
                                 .task = &task};
    assert_ok(shuffle_sorter_create(&cfg, &s));
    assert_ok(shuffle_sorter_finish(s));
    uint32_t part;
    fl_bytes k, v;
    assert_false(shuffle_sorter_next(s, &part, &k, &v));
    assert_int_equal(shuffle_sorter_spills(s), 0);
    assert_int_equal(task.status, FL_OK);
    shuffle_sorter_destroy(s);
    assert_int_equal(count_files(), 0);
  }
  rdd_task_clear(&task);
}

/* Empty keys and values as views without memory (fl_bytes_of(NULL, 0), as the engine itself
 * makes them), hashed, combined in place at length 0, sorted and spilled. */
static void test_empty_views_without_data(void **state) {
  (void)state;
  rdd_task task = {0};
  fl_bytes none = fl_bytes_of(NULL, 0);
  int64_t one = 1;
  rdd_aggregator empty_concat = {.merge_value = concat, .merge_combiners = concat};
  rdd_aggregator counts = {.create = pair_create, .merge_value = pair_add_value, .merge_combiners = pair_merge};
  for (int variant = 0; variant < 6; variant++) {
    const rdd_aggregator *agg = variant % 3 == 0 ? NULL : variant % 3 == 1 ? &empty_concat : &counts;
    shuffle_sorter *s;
    shuffle_sorter_config cfg = {.memory = variant < 3 ? 64u << 20 : 1, .dir = dir, .order_keys = true,
                                 .agg = agg, .task = &task};
    assert_ok(shuffle_sorter_create(&cfg, &s));
    fl_bytes value = agg == &counts ? fl_bytes_of(&one, 8) : none;
    for (uint32_t i = 0; i < 50; i++) assert_ok(shuffle_sorter_insert(s, i % 2, none, value));
    assert_ok(shuffle_sorter_finish(s));
    uint32_t part, seen = 0;
    fl_bytes k, v;
    while (shuffle_sorter_next(s, &part, &k, &v)) {
      assert_int_equal(part, agg ? seen : seen / 25);
      assert_int_equal(k.len, 0);
      if (agg == &counts) {
        int64_t c[2];
        assert_int_equal(v.len, sizeof c);
        memcpy(c, v.data, sizeof c);
        assert_int_equal(c[0], 25);
        assert_int_equal(c[1], 25);
      } else {
        assert_int_equal(v.len, 0);
      }
      seen++;
    }
    assert_int_equal(task.status, FL_OK);
    assert_int_equal(seen, agg ? 2 : 50);
    shuffle_sorter_destroy(s);
    assert_int_equal(count_files(), 0);
  }
  rdd_task_clear(&task);
}

static void test_user_function_failures(void **state) {
  (void)state;
  rdd_task task = {0};
  int64_t one = 1;
  fl_bytes v = fl_bytes_of(&one, 8), key = fl_bytes_str("k");
  shuffle_sorter *s;

  /* merge_value fails on the second value of a key: insert reports it, naming the function. */
  rdd_aggregator failing_merge = {.merge_value = fail_merge, .merge_combiners = sum_i64};
  shuffle_sorter_config cfg = {.memory = 64u << 20, .dir = dir, .agg = &failing_merge, .task = &task};
  assert_ok(shuffle_sorter_create(&cfg, &s));
  assert_ok(shuffle_sorter_insert(s, 0, key, v));
  assert_fails_with(shuffle_sorter_insert(s, 0, key, v), FL_EUSER, "fail_merge");
  assert_non_null(strstr(fl_last_error(), "merge refused"));
  shuffle_sorter_destroy(s);

  /* create fails on the first value. */
  rdd_aggregator failing_create = {.create = fail_create, .merge_value = sum_i64, .merge_combiners = sum_i64};
  cfg.agg = &failing_create;
  assert_ok(shuffle_sorter_create(&cfg, &s));
  assert_fails_with(shuffle_sorter_insert(s, 0, key, v), FL_EUSER, "fail_create");
  assert_non_null(strstr(fl_last_error(), "create refused"));
  shuffle_sorter_destroy(s);
  assert_int_equal(task.status, FL_OK);

  /* merge_combiners fails while runs are merged: next() ends and the task has the cause.
   * Entries larger than the sorter's memory floor spill one run each. */
  rdd_aggregator failing_comb = {.merge_value = sum_i64, .merge_combiners = fail_merge_combiners};
  cfg.agg = &failing_comb;
  cfg.memory = 1;
  static uint8_t big_value[32u << 10];
  memcpy(big_value, &one, 8);
  fl_bytes big = fl_bytes_of(big_value, sizeof big_value);
  assert_ok(shuffle_sorter_create(&cfg, &s));
  assert_ok(shuffle_sorter_insert(s, 0, fl_bytes_str("a"), big));
  assert_ok(shuffle_sorter_insert(s, 0, key, big));
  assert_ok(shuffle_sorter_insert(s, 0, key, big));
  assert_true(shuffle_sorter_spills(s) >= 2);
  assert_ok(shuffle_sorter_finish(s));
  uint32_t part;
  fl_bytes k, val;
  assert_true(shuffle_sorter_next(s, &part, &k, &val)); /* "a": one run, no merge */
  assert_true(bytes_eq(k, fl_bytes_str("a")));
  assert_false(shuffle_sorter_next(s, &part, &k, &val));
  assert_int_equal(task.status, FL_EUSER);
  assert_non_null(task.error);
  assert_non_null(strstr(task.error, "fail_merge_combiners"));
  assert_non_null(strstr(task.error, "combiners refused"));
  assert_false(shuffle_sorter_next(s, &part, &k, &val));
  shuffle_sorter_destroy(s);
  assert_int_equal(count_files(), 0);
  rdd_task_clear(&task);
  assert_int_equal(task.status, FL_OK);
}

/* In the sanitizer build, undefined behaviour in the sorter aborts the program (see the
 * report of these tests): the tests that reach it come last, so that the others run.
 * FLINT_TEST_FILTER (a cmocka pattern such as "test_agg*") runs some tests only. */
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_by_partition_only),
      cmocka_unit_test(test_order_by_key_asc_desc_and_user_compare),
      cmocka_unit_test(test_aggregate_sum_across_runs),
      cmocka_unit_test(test_aggregate_create_zero_and_combiners),
      cmocka_unit_test(test_append_path_changing_combiner_length),
      cmocka_unit_test(test_entries_larger_than_a_run_chunk),
      cmocka_unit_test(test_spill_files_removed_by_destroy),
      cmocka_unit_test(test_user_function_failures),
      /* combiners of length 0 replaced in place: memcpy from a NULL scratch buffer */
      cmocka_unit_test(test_zero_length_keys_and_values),
      /* finish with nothing inserted, in key order: qsort_r of NULL */
      cmocka_unit_test(test_finish_with_nothing_inserted),
      /* hashing an empty key without memory: memcpy from NULL in common_hash_bytes */
      cmocka_unit_test(test_empty_views_without_data),
  };
  const char *filter = getenv("FLINT_TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, setup, teardown);
}
