/*
 * test_ps: the parameter server's layer (ps/ps.h): tables, partitioning, shards and clocks.
 *
 * Shards' arithmetic is checked bit for bit against a reference written here (one flat table,
 * the same formulas, every push applied in order) over 1 to 8 shards and 1 to 8 workers whose
 * pushes are interleaved, with duplicate keys, skewed keys and empty pushes, for every update
 * function, dense and sparse. Clocks are checked by worker threads that record, with every
 * read, the clock they read at and the freshness the wait gave: SSP's bound must hold for
 * every read, whatever the scheduling.
 */
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "ps/ps.h"

/* ---- the reference: one table, every key's row on first use ----------------------------- */

typedef struct ref_table {
  ps_table_spec spec;
  uint64_t n, cap;
  uint64_t *keys;
  float *values, *m, *v; /* v doubles as Adagrad's accumulator */
  uint32_t *t;
} ref_table;

static uint64_t ref_row(ref_table *r, uint64_t key) {
  for (uint64_t i = 0; i < r->n; i++)
    if (r->keys[i] == key) return i;
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 64;
    size_t w = r->spec.width;
    r->keys = realloc(r->keys, r->cap * sizeof *r->keys);
    r->values = realloc(r->values, r->cap * w * sizeof(float));
    r->m = realloc(r->m, r->cap * w * sizeof(float));
    r->v = realloc(r->v, r->cap * w * sizeof(float));
    r->t = realloc(r->t, r->cap * sizeof *r->t);
    assert_true(r->keys && r->values && r->m && r->v && r->t);
  }
  size_t w = r->spec.width;
  r->keys[r->n] = key;
  memset(r->values + r->n * w, 0, w * sizeof(float));
  memset(r->m + r->n * w, 0, w * sizeof(float));
  memset(r->v + r->n * w, 0, w * sizeof(float));
  r->t[r->n] = 0;
  return r->n++;
}

static void ref_push(ref_table *r, uint64_t key, const float *g) {
  uint64_t i = ref_row(r, key);
  size_t w = r->spec.width;
  float *x = r->values + i * w, *m = r->m + i * w, *v = r->v + i * w;
  const ps_update *u = &r->spec.update;
  if (u->kind == PS_UPDATE_ADAM) r->t[i]++;
  float b1 = (float)(1.0 - pow(u->beta1, r->t[i])), b2 = (float)(1.0 - pow(u->beta2, r->t[i]));
  for (size_t j = 0; j < w; j++) {
    switch (u->kind) {
    case PS_UPDATE_ADD: x[j] += g[j]; break;
    case PS_UPDATE_SGD: x[j] -= u->lr * g[j]; break;
    case PS_UPDATE_ADAGRAD:
      v[j] += g[j] * g[j];
      x[j] -= u->lr * g[j] / (sqrtf(v[j]) + u->eps);
      break;
    case PS_UPDATE_ADAM:
      m[j] = u->beta1 * m[j] + (1 - u->beta1) * g[j];
      v[j] = u->beta2 * v[j] + (1 - u->beta2) * g[j] * g[j];
      x[j] -= u->lr * (m[j] / b1) / (sqrtf(v[j] / b2) + u->eps);
      break;
    }
  }
}

static void ref_free(ref_table *r) {
  free(r->keys), free(r->values), free(r->m), free(r->v), free(r->t);
}

/* ---- a group of shards, split the way a client would split a push ------------------------- */

typedef struct group {
  ps_table_spec spec;
  uint32_t shards;
  ps_shard *s[8];
} group;

static void group_open(group *g, const ps_table_spec *spec, uint32_t shards) {
  g->spec = *spec;
  g->shards = shards;
  for (uint32_t i = 0; i < shards; i++) assert_ok(ps_shard_create(spec, shards, i, &g->s[i]));
}

static void group_close(group *g) {
  for (uint32_t i = 0; i < g->shards; i++) ps_shard_destroy(g->s[i]);
}

/* Splits keys by shard, keeping their order within each shard. */
static void group_push(group *g, const uint64_t *keys, size_t n, const float *grads) {
  size_t w = g->spec.width;
  uint64_t *k = malloc((n ? n : 1) * sizeof *k);
  float *v = malloc((n ? n : 1) * w * sizeof *v);
  assert_true(k && v);
  for (uint32_t s = 0; s < g->shards; s++) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
      if (ps_shard_of(&g->spec, g->shards, keys[i]) == s) {
        k[m] = keys[i];
        memcpy(v + m * w, grads + i * w, w * sizeof(float));
        m++;
      }
    assert_ok(ps_shard_push(g->s[s], k, m, v));
  }
  free(k);
  free(v);
}

static void group_pull_one(group *g, uint64_t key, float *out) {
  assert_ok(ps_shard_pull(g->s[ps_shard_of(&g->spec, g->shards, key)], &key, 1, out));
}

static uint64_t rng = 0x1234567887654321ull;
static uint64_t next(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return rng;
}

/* A key: dense in [0, keys); sparse from a pool of 40 spread over the 64-bit space. Skewed:
 * half the draws are one of three hot keys. */
static uint64_t draw_key(const ps_table_spec *spec) {
  uint64_t r = next();
  uint64_t pick = (r & 1) ? (r >> 8) % 3 : (r >> 8) % 40;
  if (!spec->sparse) return pick % spec->keys;
  return common_hash64(pick * 7919 + 1) | (pick << 60);
}

static void check_against_reference(const ps_table_spec *spec, uint32_t shards, uint32_t workers) {
  group g;
  group_open(&g, spec, shards);
  ref_table ref = {.spec = *spec};
  size_t w = spec->width;
  enum { ROUNDS = 12, MAX_BATCH = 9 };
  uint64_t keys[MAX_BATCH];
  float grads[MAX_BATCH * 4];
  /* Round-robin over workers: worker k's push of round r. A batch may be empty. */
  for (int round = 0; round < ROUNDS; round++)
    for (uint32_t k = 0; k < workers; k++) {
      size_t n = next() % MAX_BATCH;
      for (size_t i = 0; i < n; i++) {
        keys[i] = draw_key(spec);
        for (size_t j = 0; j < w; j++) grads[i * w + j] = (float)((int64_t)(next() % 2001) - 1000) / 512.0f;
      }
      group_push(&g, keys, n, grads);
      for (size_t i = 0; i < n; i++) ref_push(&ref, keys[i], grads + i * w);
    }
  float got[4], want[4];
  for (uint64_t i = 0; i < ref.n; i++) {
    group_pull_one(&g, ref.keys[i], got);
    memcpy(want, ref.values + i * w, w * sizeof(float));
    if (memcmp(got, want, w * sizeof(float)) != 0) {
      fprintf(stderr, "%s %s, %u shards, %u workers: key %llu: %.9g, reference %.9g\n",
              spec->sparse ? "sparse" : "dense", ps_update_name(spec->update.kind), shards, workers,
              (unsigned long long)ref.keys[i], got[0], want[0]);
      fail();
    }
  }
  /* Sparse: exactly the keys pushed exist, spread over the shards. */
  if (spec->sparse) {
    uint64_t total = 0;
    for (uint32_t s = 0; s < shards; s++) total += ps_shard_size(g.s[s]);
    assert_int_equal(total, ref.n);
  }
  ref_free(&ref);
  group_close(&g);
}

static void test_arithmetic_matches_reference(void **state) {
  (void)state;
  for (int sparse = 0; sparse < 2; sparse++)
    for (int kind = PS_UPDATE_ADD; kind <= PS_UPDATE_ADAM; kind++)
      for (uint32_t shards = 1; shards <= 8; shards++)
        for (uint32_t workers = 1; workers <= 8; workers += (workers < 3 ? 1 : 5)) {
          ps_table_spec spec = {.sparse = sparse, .keys = sparse ? 0 : 37, .width = (uint32_t)(1 + (shards % 3)),
                                .update = PS_UPDATE_INIT};
          spec.update.kind = (ps_update_kind)kind;
          spec.update.lr = 0.125f;
          check_against_reference(&spec, shards, workers);
        }
}

/* ---- tables and partitioning ------------------------------------------------------------------ */

static void test_specs_and_partitions(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 10, .width = 1, .update = PS_UPDATE_INIT};
  assert_ok(ps_table_spec_check(&spec));
  spec.width = 0;
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "width 0");
  spec.width = 1;
  spec.keys = 0;
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "dense table of 0 keys");
  spec.keys = 10;
  spec.update.kind = PS_UPDATE_SGD;
  spec.update.lr = -1;
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "sgd's rate -1");
  spec.update.kind = PS_UPDATE_ADAM;
  spec.update.lr = 0.1f;
  spec.update.beta1 = 1;
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "adam's betas 1");
  spec.update.beta1 = 0.9f;
  spec.update.eps = 0;
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "adam's eps 0");
  spec = (ps_table_spec){.sparse = true, .keys = 5, .width = 1, .update = PS_UPDATE_INIT};
  assert_fails_with(ps_table_spec_check(&spec), FL_EINVAL, "sparse table has no key count");
  ps_update_kind k;
  assert_ok(ps_update_parse("adagrad", &k));
  assert_int_equal(k, PS_UPDATE_ADAGRAD);
  assert_fails_with(ps_update_parse("rmsprop", &k), FL_EINVAL, "unknown update function 'rmsprop'");
  assert_string_equal(ps_update_name(PS_UPDATE_ADAM), "adam");

  /* Dense ranges: contiguous, covering every key once, sizes within one of each other, and
   * ps_shard_of agreeing with them. */
  for (uint64_t keys = 1; keys <= 50; keys++)
    for (uint32_t shards = 1; shards <= 8 && shards <= keys; shards++) {
      ps_table_spec d = {.keys = keys, .width = 1, .update = PS_UPDATE_INIT};
      assert_int_equal(ps_range_lo(&d, shards, 0), 0);
      assert_int_equal(ps_range_lo(&d, shards, shards), keys);
      for (uint32_t s = 0; s < shards; s++) {
        uint64_t lo = ps_range_lo(&d, shards, s), hi = ps_range_lo(&d, shards, s + 1);
        assert_true(hi > lo && hi - lo <= keys / shards + 1);
        for (uint64_t key = lo; key < hi; key++) assert_int_equal(ps_shard_of(&d, shards, key), s);
      }
    }
  ps_shard *sh;
  ps_table_spec small = {.keys = 3, .width = 1, .update = PS_UPDATE_INIT};
  assert_fails_with(ps_shard_create(&small, 4, 0, &sh), FL_EINVAL, "3 keys over 4 shards");
  assert_fails_with(ps_shard_create(&small, 2, 2, &sh), FL_EINVAL, "shard 2 of 2");
}

/* Keys that are not the shard's are refused, naming the key, and nothing changes. */
/* A dense range pushed, set and pulled in one pass equals the same keys one by one, bit for
 * bit, for every update function; a range outside the shard, or of a sparse table, is refused. */
static void test_ranges_equal_keys(void **state) {
  (void)state;
  for (int kind = PS_UPDATE_ADD; kind <= PS_UPDATE_ADAM; kind++) {
    ps_table_spec spec = {.keys = 101, .width = 3, .update = PS_UPDATE_INIT};
    spec.update.kind = (ps_update_kind)kind;
    ps_shard *by_keys, *by_range;
    assert_int_equal(ps_shard_create(&spec, 2, 1, &by_keys), FL_OK); /* keys [51, 101) */
    assert_int_equal(ps_shard_create(&spec, 2, 1, &by_range), FL_OK);
    common_rng rng;
    common_rng_seed(&rng, 7 + (uint64_t)kind);
    float g[50 * 3], a[50 * 3], b[50 * 3];
    uint64_t keys[50];
    for (int round = 0; round < 20; round++) {
      uint64_t lo = 51 + common_rng_next(&rng) % 50, count = common_rng_next(&rng) % (101 - lo + 1);
      for (uint64_t i = 0; i < count; i++) keys[i] = lo + i;
      for (size_t j = 0; j < count * 3; j++) g[j] = (float)(common_rng_uniform(&rng) - 0.5);
      if (round == 5) {
        assert_int_equal(ps_shard_set(by_keys, keys, count, g), FL_OK);
        assert_int_equal(ps_shard_set_range(by_range, lo, count, g), FL_OK);
      } else {
        assert_int_equal(ps_shard_push(by_keys, keys, count, g), FL_OK);
        assert_int_equal(ps_shard_push_range(by_range, lo, count, g), FL_OK);
      }
    }
    for (uint64_t i = 0; i < 50; i++) keys[i] = 51 + i;
    assert_int_equal(ps_shard_pull(by_keys, keys, 50, a), FL_OK);
    assert_int_equal(ps_shard_pull_range(by_range, 51, 50, b), FL_OK);
    assert_memory_equal(a, b, sizeof a);
    fl_buf ba = FL_BUF_INIT, bb = FL_BUF_INIT; /* the update state too */
    assert_int_equal(ps_shard_encode(by_keys, &ba), FL_OK);
    assert_int_equal(ps_shard_encode(by_range, &bb), FL_OK);
    assert_int_equal(ba.len, bb.len);
    assert_memory_equal(ba.data, bb.data, ba.len);
    fl_buf_free(&ba);
    fl_buf_free(&bb);
    assert_int_equal(ps_shard_push_range(by_range, 50, 2, g), FL_EINVAL); /* key 50 is shard 0's */
    assert_non_null(strstr(fl_last_error(), "[50, 52)"));
    assert_int_equal(ps_shard_pull_range(by_range, 100, 2, a), FL_EINVAL); /* key 101 is outside */
    assert_int_equal(ps_shard_set_range(by_range, UINT64_MAX, 1, g), FL_EINVAL);
    ps_shard_destroy(by_keys);
    ps_shard_destroy(by_range);
  }
  ps_table_spec sparse = {.sparse = true, .width = 1, .update = PS_UPDATE_INIT};
  ps_shard *sp;
  float v = 0;
  assert_int_equal(ps_shard_create(&sparse, 1, 0, &sp), FL_OK);
  assert_int_equal(ps_shard_pull_range(sp, 0, 1, &v), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "sparse"));
  ps_shard_destroy(sp);
}

static void test_bad_keys(void **state) {
  (void)state;
  ps_table_spec spec = {.keys = 10, .width = 2, .update = PS_UPDATE_INIT};
  ps_shard *s;
  assert_ok(ps_shard_create(&spec, 2, 1, &s)); /* keys 5 .. 9 */
  uint64_t good[2] = {5, 9}, bad[3] = {6, 12, 7}, other[2] = {5, 3};
  float g[6] = {1, 2, 3, 4, 5, 6}, out[4];
  assert_ok(ps_shard_push(s, good, 2, g));
  assert_fails_with(ps_shard_push(s, bad, 3, g), FL_EINVAL, "key 12 (item 1) is outside the table");
  assert_fails_with(ps_shard_push(s, other, 2, g), FL_EINVAL, "key 3 (item 1) is another shard's");
  assert_fails_with(ps_shard_pull(s, bad, 3, g), FL_EINVAL, "key 12");
  assert_ok(ps_shard_pull(s, good, 2, out));
  float want[4] = {1, 2, 3, 4};
  assert_memory_equal(out, want, sizeof want);
  uint64_t six = 6;
  assert_ok(ps_shard_pull(s, &six, 1, out));
  assert_true(out[0] == 0 && out[1] == 0); /* the failed push changed nothing */
  assert_fails_with(ps_shard_push(s, NULL, 1, g), FL_EINVAL, "NULL");
  ps_shard_destroy(s);

  /* Sparse: a key of another shard; a key never pushed reads 0 and is not made. */
  ps_table_spec sp = {.sparse = true, .width = 1, .update = PS_UPDATE_INIT};
  assert_ok(ps_shard_create(&sp, 3, 0, &s));
  uint64_t mine = 0, theirs = 0;
  while (ps_shard_of(&sp, 3, mine) != 0) mine++;
  while (ps_shard_of(&sp, 3, theirs) == 0) theirs++;
  float one = 1;
  assert_fails_with(ps_shard_push(s, &theirs, 1, &one), FL_EINVAL, "not 0's");
  assert_ok(ps_shard_pull(s, &mine, 1, out));
  assert_true(out[0] == 0);
  assert_int_equal(ps_shard_size(s), 0);
  assert_ok(ps_shard_push(s, &mine, 1, &one));
  assert_int_equal(ps_shard_size(s), 1);
  ps_shard_destroy(s);
}

/* Many sparse keys: the index grows and every key keeps its value; set overwrites. */
static void test_sparse_growth_and_set(void **state) {
  (void)state;
  ps_table_spec sp = {.sparse = true, .width = 3, .update = PS_UPDATE_INIT};
  ps_shard *s;
  assert_ok(ps_shard_create(&sp, 1, 0, &s));
  enum { N = 5000 };
  for (uint64_t i = 0; i < N; i++) {
    uint64_t key = i * 0x9e3779b97f4a7c15ull;
    float g[3] = {(float)i, 1, -1};
    assert_ok(ps_shard_push(s, &key, 1, g));
  }
  assert_int_equal(ps_shard_size(s), N);
  for (uint64_t i = 0; i < N; i += 37) {
    uint64_t key = i * 0x9e3779b97f4a7c15ull;
    float out[3];
    assert_ok(ps_shard_pull(s, &key, 1, out));
    assert_true(out[0] == (float)i && out[1] == 1 && out[2] == -1);
  }
  uint64_t key = 12345;
  float v[3] = {7, 8, 9}, out[3];
  assert_ok(ps_shard_set(s, &key, 1, v));
  assert_ok(ps_shard_pull(s, &key, 1, out));
  assert_memory_equal(out, v, sizeof v);
  assert_int_equal(ps_shard_size(s), N + 1);
  ps_shard_destroy(s);
}

/* ---- blobs ------------------------------------------------------------------------------------ */

static void fill_shard(ps_shard *s, const ps_table_spec *spec, uint32_t shards, uint32_t index) {
  for (int round = 0; round < 20; round++) {
    uint64_t key = draw_key(spec);
    if (ps_shard_of(spec, shards, key) != index) continue;
    float g[2] = {(float)round / 8.0f, -0.5f};
    assert_ok(ps_shard_push(s, &key, 1, g));
  }
}

static void test_blob_round_trip_and_damage(void **state) {
  (void)state;
  for (int sparse = 0; sparse < 2; sparse++)
    for (int kind = PS_UPDATE_ADD; kind <= PS_UPDATE_ADAM; kind++) {
      ps_table_spec spec = {.sparse = sparse, .keys = sparse ? 0 : 30, .width = 2, .update = PS_UPDATE_INIT};
      spec.update.kind = (ps_update_kind)kind;
      ps_shard *a, *b;
      assert_ok(ps_shard_create(&spec, 2, 1, &a));
      assert_ok(ps_shard_create(&spec, 2, 1, &b));
      fill_shard(a, &spec, 2, 1);
      fl_buf blob = FL_BUF_INIT, again = FL_BUF_INIT;
      assert_ok(ps_shard_encode(a, &blob));
      assert_ok(ps_shard_decode(b, fl_buf_bytes(&blob)));
      assert_ok(ps_shard_encode(b, &again));
      assert_int_equal(blob.len, again.len);
      assert_memory_equal(blob.data, again.data, blob.len);
      /* The update's state came back too: the same pushes to both give the same blobs. */
      uint64_t saved = rng;
      fill_shard(a, &spec, 2, 1);
      rng = saved;
      fill_shard(b, &spec, 2, 1);
      assert_ok(ps_shard_encode(a, &blob));
      assert_ok(ps_shard_encode(b, &again));
      assert_int_equal(blob.len, again.len);
      assert_memory_equal(blob.data, again.data, blob.len);
      fl_buf_free(&again);
      fl_buf_free(&blob);
      ps_shard_destroy(a);
      ps_shard_destroy(b);
    }

  ps_table_spec spec = {.keys = 8, .width = 1, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAGRAD;
  ps_shard *a, *other;
  assert_ok(ps_shard_create(&spec, 1, 0, &a));
  uint64_t k = 3;
  float g = 2;
  assert_ok(ps_shard_push(a, &k, 1, &g));
  fl_buf blob = FL_BUF_INIT;
  assert_ok(ps_shard_encode(a, &blob));
  uint8_t *copy = malloc(blob.len);
  assert_non_null(copy);
  float before;
  assert_ok(ps_shard_pull(a, &k, 1, &before));
  memcpy(copy, blob.data, blob.len);
  copy[0] = 'X';
  assert_fails_with(ps_shard_decode(a, fl_bytes_of(copy, blob.len)), FL_EFORMAT, "magic");
  memcpy(copy, blob.data, blob.len);
  assert_fails_with(ps_shard_decode(a, fl_bytes_of(copy, blob.len - 1)), FL_EFORMAT, "do not hold");
  assert_fails_with(ps_shard_decode(a, fl_bytes_of(copy, 20)), FL_EFORMAT, "truncated");
  copy[80] ^= 1;
  assert_fails_with(ps_shard_decode(a, fl_bytes_of(copy, blob.len)), FL_ECORRUPT, "checksum");
  /* Another table's blob. */
  ps_table_spec wide = spec;
  wide.update.kind = PS_UPDATE_SGD;
  wide.update.lr = 0.5f;
  assert_ok(ps_shard_create(&wide, 1, 0, &other));
  assert_fails_with(ps_shard_decode(other, fl_buf_bytes(&blob)), FL_EINVAL, "not this shard");
  float after;
  assert_ok(ps_shard_pull(a, &k, 1, &after));
  assert_true(after == before);
  ps_shard_destroy(other);
  free(copy);
  fl_buf_free(&blob);
  ps_shard_destroy(a);

  /* Sparse: a key twice, with a valid checksum; the shard keeps what it held. */
  ps_table_spec sp = {.sparse = true, .width = 1, .update = PS_UPDATE_INIT};
  ps_shard *s;
  assert_ok(ps_shard_create(&sp, 1, 0, &s));
  uint64_t keys[2] = {11, 22};
  float gs[2] = {1, 2};
  assert_ok(ps_shard_push(s, keys, 2, gs));
  assert_ok(ps_shard_encode(s, &blob));
  copy = malloc(blob.len);
  assert_non_null(copy);
  memcpy(copy, blob.data, blob.len);
  memcpy(copy + 72 + 12, &keys[0], 8); /* the second row's key := the first's */
  uint32_t crc = common_crc32c(0, copy, blob.len - 4);
  memcpy(copy + blob.len - 4, &crc, 4);
  assert_fails_with(ps_shard_decode(s, fl_bytes_of(copy, blob.len)), FL_EFORMAT, "key 11 twice");
  float kept[2];
  assert_ok(ps_shard_pull(s, keys, 2, kept));
  assert_true(kept[0] == 1 && kept[1] == 2 && ps_shard_size(s) == 2);
  free(copy);
  fl_buf_free(&blob);
  ps_shard_destroy(s);
}

/* ---- clocks -------------------------------------------------------------------------------- */

enum { WORKERS = 4, ITERS = 60 };

/* The test's own record of progress, apart from ps_clocks: done[w] is how many iterations
 * worker w has finished, raised before its advance. A read at clock c under staleness s must
 * find every done[w] >= c - s once its wait returns. */
static atomic_uint_fast64_t done[WORKERS];

typedef struct ssp_run {
  ps_clocks *c;
  uint32_t staleness;
  uint32_t worker;
  uint64_t violations; /* reads staler than the bound, or a wait that failed */
  uint64_t stale_reads; /* reads that found some worker behind their clock (fine within s) */
} ssp_run;

/* A worker: for each iteration read (wait) at its clock, check the others' progress, then
 * advance. Worker 0 is slow (it yields a lot), so the others run ahead up to the bound. No
 * cmocka asserts here: a thread records, the test's thread checks. */
static void *ssp_worker(void *arg) {
  ssp_run *r = arg;
  for (uint64_t clock = 0; clock < ITERS; clock++) {
    if (ps_clocks_wait(r->c, clock, r->staleness, 60000, NULL) != FL_OK) {
      r->violations++;
      break;
    }
    for (uint32_t w = 0; w < WORKERS; w++) {
      uint64_t d = atomic_load(&done[w]);
      if (r->staleness != PS_STALENESS_ASYNC && d + r->staleness < clock) r->violations++;
      if (d < clock) r->stale_reads++;
    }
    for (int y = 0; y < (r->worker == 0 ? 200 : 1); y++) sched_yield();
    atomic_fetch_add(&done[r->worker], 1);
    if (ps_clocks_advance(r->c, r->worker, NULL) != FL_OK) {
      r->violations++;
      break;
    }
  }
  return NULL;
}

/* Runs the workers; returns the reads that found someone behind. */
static uint64_t run_ssp(uint32_t staleness) {
  ps_clocks *c;
  assert_ok(ps_clocks_create(WORKERS, &c));
  for (uint32_t i = 0; i < WORKERS; i++) atomic_store(&done[i], 0);
  pthread_t t[WORKERS];
  ssp_run runs[WORKERS];
  for (uint32_t i = 0; i < WORKERS; i++) {
    runs[i] = (ssp_run){.c = c, .staleness = staleness, .worker = i};
    assert_int_equal(pthread_create(&t[i], NULL, ssp_worker, &runs[i]), 0);
  }
  for (uint32_t i = 0; i < WORKERS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  uint64_t stale = 0;
  for (uint32_t i = 0; i < WORKERS; i++) {
    assert_int_equal(runs[i].violations, 0);
    stale += runs[i].stale_reads;
  }
  assert_int_equal(ps_clocks_min(c), ITERS);
  ps_clocks_destroy(c);
  return stale;
}

/* BSP reads never find anyone behind (each read waits for all); SSP and ASP stay within
 * their bounds whatever the scheduling. */
static void test_ssp_bound_holds(void **state) {
  (void)state;
  assert_int_equal(run_ssp(0), 0);
  run_ssp(1);
  run_ssp(3);
  run_ssp(PS_STALENESS_ASYNC);
}

typedef struct waiter {
  ps_clocks *c;
  fl_status status;
  uint64_t fresh;
} waiter;

static void *wait_at_2(void *arg) {
  waiter *w = arg;
  w->status = ps_clocks_wait(w->c, 2, 0, 60000, &w->fresh);
  return NULL;
}

/* A worker that left no longer holds the others back; a wait that cannot end times out,
 * naming the slowest worker; unknown and retired workers are refused. */
static void test_retire_and_timeout(void **state) {
  (void)state;
  ps_clocks *c;
  assert_ok(ps_clocks_create(3, &c));
  for (int i = 0; i < 2; i++) {
    assert_ok(ps_clocks_advance(c, 0, NULL));
    assert_ok(ps_clocks_advance(c, 1, NULL));
  }
  assert_fails_with(ps_clocks_wait(c, 2, 0, 50, NULL), FL_ETIMEDOUT, "worker 2, still at clock 0");
  waiter w = {.c = c, .status = FL_EINTERNAL};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, wait_at_2, &w), 0);
  assert_ok(ps_clocks_retire(c, 2));
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_ok(w.status);
  assert_int_equal(w.fresh, 2);
  assert_fails_with(ps_clocks_advance(c, 2, NULL), FL_EINVAL, "worker 2 is retired");
  assert_fails_with(ps_clocks_advance(c, 7, NULL), FL_EINVAL, "worker 7 is unknown");
  uint64_t clock = 0;
  assert_ok(ps_clocks_advance(c, 0, &clock));
  assert_int_equal(clock, 3);
  assert_ok(ps_clocks_retire(c, 0));
  assert_ok(ps_clocks_retire(c, 1));
  assert_int_equal(ps_clocks_min(c), UINT64_MAX);
  ps_clocks *none;
  assert_fails_with(ps_clocks_create(0, &none), FL_EINVAL, "0 workers");
  ps_clocks_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_specs_and_partitions),
      cmocka_unit_test(test_arithmetic_matches_reference),
      cmocka_unit_test(test_bad_keys),
      cmocka_unit_test(test_ranges_equal_keys),
      cmocka_unit_test(test_sparse_growth_and_set),
      cmocka_unit_test(test_blob_round_trip_and_damage),
      cmocka_unit_test(test_ssp_bound_holds),
      cmocka_unit_test(test_retire_and_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
