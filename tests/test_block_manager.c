/* test_block_manager.c: unit tests of executor/storage/: the block codec and the block manager
 * behind rdd_cache_ops. */
#include "test_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "executor/storage/storage.h"

/* Under AddressSanitizer an allocation too large to serve returns NULL (as malloc does)
 * instead of aborting the whole program, so that such a failure is one failed test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ---- helpers ---------------------------------------------------------------------------- */

/* n records; record i has (i * 7 + seed) % (max_len + 1) bytes (so some are empty). */
static void make_batch(rdd_batch *b, size_t n, uint32_t seed, size_t max_len) {
  *b = (rdd_batch){FL_BUF_INIT, 0};
  uint8_t rec[4096];
  assert_true(max_len <= sizeof rec);
  for (size_t i = 0; i < n; i++) {
    size_t len = (i * 7 + seed) % (max_len + 1);
    for (size_t j = 0; j < len; j++) rec[j] = (uint8_t)(seed * 31 + i * 13 + j);
    assert_ok(rdd_batch_append(b, rec, len));
  }
  assert_int_equal(b->count, n);
}

/* A batch of exactly `bytes` bytes: records of 99 bytes plus a 1-byte length. */
static void make_sized_batch(rdd_batch *b, size_t bytes, uint32_t seed) {
  assert_int_equal(bytes % 100, 0);
  *b = (rdd_batch){FL_BUF_INIT, 0};
  uint8_t rec[99];
  for (size_t i = 0; i < bytes / 100; i++) {
    for (size_t j = 0; j < sizeof rec; j++) rec[j] = (uint8_t)(seed * 17 + i * 5 + j);
    assert_ok(rdd_batch_append(b, rec, sizeof rec));
  }
  assert_int_equal(b->buf.len, bytes);
}

/* Records of pseudo-random bytes: LZ4 cannot compress them. */
static void make_random_batch(rdd_batch *b, size_t n, size_t len, uint64_t seed) {
  *b = (rdd_batch){FL_BUF_INIT, 0};
  common_rng rng;
  common_rng_seed(&rng, seed);
  uint8_t *rec = malloc(len ? len : 1);
  assert_non_null(rec);
  for (size_t i = 0; i < n; i++) {
    for (size_t j = 0; j < len; j++) rec[j] = (uint8_t)common_rng_next(&rng);
    assert_ok(rdd_batch_append(b, rec, len));
  }
  free(rec);
}

static void copy_batch(rdd_batch *dst, const rdd_batch *src) {
  *dst = (rdd_batch){FL_BUF_INIT, 0};
  assert_ok(fl_buf_append(&dst->buf, src->buf.data, src->buf.len));
  dst->count = src->count;
}

static void assert_batch_equal(const rdd_batch *got, const rdd_batch *want) {
  assert_non_null(got);
  assert_int_equal(got->count, want->count);
  assert_int_equal(got->buf.len, want->buf.len);
  if (want->buf.len) assert_memory_equal(got->buf.data, want->buf.data, want->buf.len);
  assert_true(rdd_batch_valid(got->buf.data, got->buf.len, got->count));
}

static void set_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

static rdd_block_key key_of(uint64_t rdd_id, uint32_t partition) {
  rdd_block_key k = {rdd_id, partition};
  return k;
}

typedef struct fixture {
  char dir[512];
  block_manager *bm;
} fixture;

static int fixture_setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f) return -1;
  test_tmpdir(f->dir, sizeof f->dir);
  *state = f;
  return 0;
}

static int fixture_teardown(void **state) {
  fixture *f = *state;
  test_rmtree(f->dir);
  free(f);
  return 0;
}

static block_manager *open_bm(fixture *f, uint64_t limit) {
  assert_ok(block_manager_create(limit, f->dir, false, &f->bm));
  assert_non_null(f->bm);
  return f->bm;
}

static void close_bm(fixture *f) {
  block_manager_destroy(f->bm);
  f->bm = NULL;
}

/* Puts a copy of `content`; checks the put contract (batch emptied, stored readable and
 * equal). Returns the handle, still held. */
static void *put_hold(block_manager *bm, rdd_block_key key, fl_storage_level level,
                      const rdd_batch *content, const rdd_batch **stored_out) {
  rdd_batch b;
  copy_batch(&b, content);
  const rdd_batch *stored = NULL;
  void *handle = NULL;
  assert_ok(block_manager_cache_ops.put(bm, key, level, &b, &stored, &handle));
  assert_null(b.buf.data); /* taken */
  assert_int_equal(b.count, 0);
  assert_non_null(handle);
  assert_batch_equal(stored, content);
  if (stored_out) *stored_out = stored;
  return handle;
}

static void put_release(block_manager *bm, rdd_block_key key, fl_storage_level level,
                        const rdd_batch *content) {
  void *h = put_hold(bm, key, level, content, NULL);
  block_manager_cache_ops.release(bm, h);
}

/* A get that, on a hit, checks the content and releases. */
static bool get_check(block_manager *bm, rdd_block_key key, const rdd_batch *want) {
  const rdd_batch *got = NULL;
  void *handle = NULL;
  if (!block_manager_cache_ops.get(bm, key, &got, &handle)) return false;
  assert_non_null(handle);
  assert_batch_equal(got, want);
  block_manager_cache_ops.release(bm, handle);
  return true;
}

static block_manager_stats stats_of(block_manager *bm) {
  block_manager_stats s;
  memset(&s, 0xff, sizeof s);
  block_manager_stats_get(bm, &s);
  return s;
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

static void block_path(const fixture *f, uint64_t rdd_id, uint32_t p, char *buf, size_t len) {
  snprintf(buf, len, "%s/rdd_%llu_%u.blk", f->dir, (unsigned long long)rdd_id, p);
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* ---- codec: round trips ----------------------------------------------------------------- */

static void codec_round_trip(const rdd_batch *in) {
  fl_buf enc = FL_BUF_INIT;
  assert_ok(rdd_batch_encode(in, &enc));
  assert_true(enc.len >= 20);
  assert_memory_equal(enc.data, "FLB1", 4);
  rdd_batch out = {FL_BUF_INIT, 0};
  assert_ok(rdd_batch_decode(fl_buf_bytes(&enc), "round trip", &out));
  assert_batch_equal(&out, in);
  rdd_batch_free(&out);
  fl_buf_free(&enc);
}

static void test_codec_round_trip_empty_batch(void **state) {
  (void)state;
  rdd_batch b = {FL_BUF_INIT, 0};
  codec_round_trip(&b);
}

static void test_codec_round_trip_one_record(void **state) {
  (void)state;
  rdd_batch b = {FL_BUF_INIT, 0};
  assert_ok(rdd_batch_append(&b, "hello\0world", 11));
  codec_round_trip(&b);
  rdd_batch_free(&b);
  /* One empty record. */
  assert_ok(rdd_batch_append(&b, "", 0));
  codec_round_trip(&b);
  rdd_batch_free(&b);
}

static void test_codec_round_trip_10000_records_with_empty_ones(void **state) {
  (void)state;
  rdd_batch b;
  make_batch(&b, 10000, 3, 299);
  size_t empty = 0;
  rdd_cursor c = {b.buf.data, b.buf.data + b.buf.len};
  fl_bytes rec;
  while (rdd_cursor_next(&c, &rec)) empty += rec.len == 0;
  assert_true(empty > 0);
  codec_round_trip(&b);
  rdd_batch_free(&b);
}

static void test_codec_round_trip_incompressible_records(void **state) {
  (void)state;
  rdd_batch b;
  make_random_batch(&b, 50, 2000, 11);
  codec_round_trip(&b);
  rdd_batch_free(&b);
}

static void test_codec_compresses_repetitive_data(void **state) {
  (void)state;
  rdd_batch b = {FL_BUF_INIT, 0};
  for (int i = 0; i < 5000; i++) assert_ok(rdd_batch_append(&b, "the same record again", 21));
  fl_buf enc = FL_BUF_INIT;
  assert_ok(rdd_batch_encode(&b, &enc));
  assert_true(enc.len < b.buf.len / 10);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

/* ---- codec: corrupt input --------------------------------------------------------------- */

/* Decoding `in` must fail with FL_ECORRUPT naming `what`, and leave *out alone. */
static void expect_corrupt(fl_bytes in, const char *needle) {
  rdd_batch out = {{(uint8_t *)0x1, 7, 7}, 5}; /* sentinel: must stay as is */
  assert_fails_with(rdd_batch_decode(in, "blk-under-test", &out), FL_ECORRUPT, "blk-under-test");
  if (needle) assert_fails_with(rdd_batch_decode(in, "blk-under-test", &out), FL_ECORRUPT, needle);
  assert_ptr_equal(out.buf.data, (uint8_t *)0x1);
  assert_int_equal(out.buf.len, 7);
  assert_int_equal(out.count, 5);
}

static void encode_sample(fl_buf *enc, rdd_batch *b) {
  make_batch(b, 500, 9, 100);
  *enc = (fl_buf)FL_BUF_INIT;
  assert_ok(rdd_batch_encode(b, enc));
}

static void test_codec_decode_bad_magic(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  enc.data[0] ^= 0x20;
  expect_corrupt(fl_buf_bytes(&enc), "bad header");
  enc.data[0] ^= 0x20;
  enc.data[3] = '2'; /* "FLB2" */
  expect_corrupt(fl_buf_bytes(&enc), "bad header");
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_header_truncated(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  expect_corrupt(fl_bytes_of(enc.data, 0), "bad header");
  expect_corrupt(fl_bytes_of(enc.data, 4), "bad header");
  expect_corrupt(fl_bytes_of(enc.data, 19), "bad header");
  /* The header alone, without its frame. */
  expect_corrupt(fl_bytes_of(enc.data, 20), NULL);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_flipped_payload_byte_fails_checksum(void **state) {
  (void)state;
  rdd_batch b;
  make_random_batch(&b, 4, 1000, 5); /* stored as is in the frame: a flip changes content only */
  fl_buf enc = FL_BUF_INIT;
  assert_ok(rdd_batch_encode(&b, &enc));
  size_t mid = 20 + (enc.len - 20) / 2;
  enc.data[mid] ^= 0x01;
  expect_corrupt(fl_buf_bytes(&enc), "hecksum");
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

/* A flipped byte anywhere in a block is either caught (FL_ECORRUPT) or, when it only picks
 * an equivalent LZ4 encoding (say, a match offset into identical bytes), decodes to exactly
 * the original records: a damaged block never yields different data. */
static void test_codec_decode_any_flipped_byte_fails_or_is_harmless(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  size_t caught = 0;
  for (size_t i = 0; i < enc.len; i++) {
    if (i >= 12 && i < 20) continue; /* the raw length: see test_codec_decode_huge_raw_length */
    enc.data[i] ^= 0xff;
    rdd_batch out = {FL_BUF_INIT, 0};
    fl_status s = rdd_batch_decode(fl_buf_bytes(&enc), "flip", &out);
    if (s == FL_OK) {
      if (out.count != b.count || out.buf.len != b.buf.len ||
          memcmp(out.buf.data, b.buf.data, b.buf.len) != 0)
        fprintf(stderr, "flipping byte %zu of %zu decoded to different records\n", i, enc.len);
      assert_batch_equal(&out, &b);
      rdd_batch_free(&out);
    } else {
      assert_int_equal(s, FL_ECORRUPT);
      assert_non_null(strstr(fl_last_error(), "flip"));
      caught++;
    }
    enc.data[i] ^= 0xff;
  }
  assert_true(caught > (enc.len - 8) * 9 / 10);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

/* A damaged raw-length field must be reported as corruption, not trusted as the size of
 * the buffer to allocate (up to 1 TiB passes the plausibility check). */
static void test_codec_decode_huge_raw_length(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  set_u64(enc.data + 12, (1ull << 40) - 1);
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  set_u64(enc.data + 12, b.buf.len ^ (0xffull << 32)); /* one byte flipped */
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_frame_truncated_by_one_byte(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  expect_corrupt(fl_bytes_of(enc.data, enc.len - 1), NULL);
  /* Any shorter cut fails too. */
  for (size_t cut = 20; cut < enc.len; cut += 37) expect_corrupt(fl_bytes_of(enc.data, cut), NULL);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_trailing_garbage(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  assert_ok(fl_buf_append(&enc, "junk", 4));
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  enc.len -= 3; /* a single extra byte */
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_count_mismatch(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  set_u64(enc.data + 4, b.count + 1);
  expect_corrupt(fl_buf_bytes(&enc), "do not match");
  set_u64(enc.data + 4, b.count - 1);
  expect_corrupt(fl_buf_bytes(&enc), "do not match");
  set_u64(enc.data + 4, 0);
  expect_corrupt(fl_buf_bytes(&enc), "do not match");
  set_u64(enc.data + 4, b.buf.len + 1); /* more records than bytes */
  expect_corrupt(fl_buf_bytes(&enc), "implausible");
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

static void test_codec_decode_raw_length_mismatch(void **state) {
  (void)state;
  fl_buf enc;
  rdd_batch b;
  encode_sample(&enc, &b);
  set_u64(enc.data + 12, b.buf.len - 1);
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  set_u64(enc.data + 12, b.buf.len + 1);
  expect_corrupt(fl_buf_bytes(&enc), NULL);
  set_u64(enc.data + 12, UINT64_MAX);
  expect_corrupt(fl_buf_bytes(&enc), "implausible");
  fl_buf_free(&enc);
  rdd_batch_free(&b);
}

/* ---- block manager: memory ------------------------------------------------------------- */

static void test_bm_put_memory_only_then_get_hits(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch content;
  make_batch(&content, 1000, 1, 50);
  const rdd_batch *stored;
  void *h = put_hold(bm, key_of(1, 0), FL_MEMORY_ONLY, &content, &stored);
  block_manager_cache_ops.release(bm, h);

  const rdd_batch *got = NULL;
  void *h2 = NULL;
  assert_true(block_manager_cache_ops.get(bm, key_of(1, 0), &got, &h2));
  assert_batch_equal(got, &content);
  assert_ptr_equal(got, stored); /* the stored block itself, no copy */
  block_manager_cache_ops.release(bm, h2);
  assert_true(get_check(bm, key_of(1, 0), &content)); /* a second get still hits */

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_in_memory, 1);
  assert_int_equal(s.memory_used, content.buf.len);
  assert_int_equal(s.memory_limit, 1 << 20);
  assert_int_equal(s.blocks_on_disk, 0);
  assert_int_equal(s.disk_used, 0);
  assert_int_equal(s.evictions, 0);
  assert_int_equal(count_files(f->dir), 0);
  close_bm(f);
  rdd_batch_free(&content);
}

static void test_bm_get_unknown_key_misses(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch content;
  make_batch(&content, 10, 1, 20);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &content);
  const rdd_batch *got = NULL;
  void *h = NULL;
  assert_false(block_manager_cache_ops.get(bm, key_of(1, 1), &got, &h));
  assert_false(block_manager_cache_ops.get(bm, key_of(2, 0), &got, &h));
  assert_null(got);
  assert_null(h);
  close_bm(f);
  rdd_batch_free(&content);
}

static void test_bm_put_existing_key_keeps_first_block(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch first, second;
  make_batch(&first, 10, 1, 20);
  make_batch(&second, 12, 2, 20);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &first);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &second); /* the caller still reads its own */
  assert_true(get_check(bm, key_of(1, 0), &first));
  assert_int_equal(stats_of(bm).blocks_in_memory, 1);
  assert_int_equal(stats_of(bm).memory_used, first.buf.len);
  close_bm(f);
  rdd_batch_free(&first);
  rdd_batch_free(&second);
}

static void test_bm_lru_evicts_least_recently_used_other_rdd(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500); /* room for two 1000-byte blocks */
  rdd_batch a, b, c;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &b);
  assert_int_equal(stats_of(bm).memory_used, 2000);
  put_release(bm, key_of(3, 0), FL_MEMORY_ONLY, &c);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.blocks_in_memory, 2);
  assert_int_equal(s.memory_used, 2000);
  assert_false(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(2, 0), &b));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
}

static void test_bm_get_refreshes_recency(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &b);
  assert_true(get_check(bm, key_of(1, 0), &a)); /* 1 is now the most recent */
  put_release(bm, key_of(3, 0), FL_MEMORY_ONLY, &c);

  assert_int_equal(stats_of(bm).evictions, 1);
  assert_false(get_check(bm, key_of(2, 0), &b));
  assert_true(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
}

static void test_bm_same_rdd_blocks_are_not_evicted_for_it(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch p0, p1, p2;
  make_sized_batch(&p0, 1000, 1);
  make_sized_batch(&p1, 1000, 2);
  make_sized_batch(&p2, 1000, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &p0);
  put_release(bm, key_of(1, 1), FL_MEMORY_ONLY, &p1);
  /* No room without evicting rdd 1 itself: put succeeds with a private, readable batch. */
  const rdd_batch *stored;
  void *h = put_hold(bm, key_of(1, 2), FL_MEMORY_ONLY, &p2, &stored);
  assert_batch_equal(stored, &p2);
  block_manager_cache_ops.release(bm, h);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 0);
  assert_int_equal(s.blocks_in_memory, 2);
  assert_int_equal(s.memory_used, 2000);
  assert_false(get_check(bm, key_of(1, 2), &p2));
  assert_true(get_check(bm, key_of(1, 0), &p0));
  assert_true(get_check(bm, key_of(1, 1), &p1));
  close_bm(f);
  rdd_batch_free(&p0);
  rdd_batch_free(&p1);
  rdd_batch_free(&p2);
}

static void test_bm_pinned_block_is_not_evicted(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c, d;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  make_sized_batch(&d, 1000, 4);
  const rdd_batch *a_stored;
  void *ha = put_hold(bm, key_of(1, 0), FL_MEMORY_ONLY, &a, &a_stored); /* pinned, LRU */
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &b);
  const rdd_batch *c_stored;
  void *hc = put_hold(bm, key_of(3, 0), FL_MEMORY_ONLY, &c, &c_stored);

  assert_int_equal(stats_of(bm).evictions, 1);
  assert_false(get_check(bm, key_of(2, 0), &b)); /* evicted instead of the pinned one */
  assert_batch_equal(a_stored, &a);

  /* Everything in memory is pinned now: the next block is not cached, yet put works. */
  put_release(bm, key_of(4, 0), FL_MEMORY_ONLY, &d);
  assert_int_equal(stats_of(bm).evictions, 1);
  assert_false(get_check(bm, key_of(4, 0), &d));
  assert_batch_equal(a_stored, &a);
  assert_batch_equal(c_stored, &c);

  block_manager_cache_ops.release(bm, ha);
  block_manager_cache_ops.release(bm, hc);
  assert_true(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
  rdd_batch_free(&d);
}

static void test_bm_block_larger_than_limit_is_not_cached(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch small, big;
  make_sized_batch(&small, 1000, 1);
  make_sized_batch(&big, 3000, 2);
  put_release(bm, key_of(1, 0), FL_MEMORY_ONLY, &small);
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &big); /* checks the private batch */

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 0); /* nothing evicted for a block that cannot fit */
  assert_int_equal(s.memory_used, 1000);
  assert_int_equal(s.blocks_in_memory, 1);
  assert_false(get_check(bm, key_of(2, 0), &big));
  assert_true(get_check(bm, key_of(1, 0), &small));
  close_bm(f);
  rdd_batch_free(&small);
  rdd_batch_free(&big);
}

static void test_bm_empty_batch_round_trip(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch empty = {FL_BUF_INIT, 0};
  const fl_storage_level levels[] = {FL_MEMORY_ONLY, FL_MEMORY_SER, FL_MEMORY_AND_DISK, FL_DISK_ONLY};
  for (uint32_t i = 0; i < 4; i++) {
    put_release(bm, key_of(1, i), levels[i], &empty);
    assert_true(get_check(bm, key_of(1, i), &empty));
  }
  close_bm(f);
}

/* ---- block manager: serialized and disk levels ----------------------------------------- */

static void test_bm_memory_and_disk_evicted_block_goes_to_disk(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_AND_DISK, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_AND_DISK, &b);
  assert_int_equal(count_files(f->dir), 0); /* in memory only, so far */
  put_release(bm, key_of(3, 0), FL_MEMORY_AND_DISK, &c);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.blocks_on_disk, 1);
  assert_int_equal(s.blocks_in_memory, 2);
  assert_int_equal(s.memory_used, 2000);
  char path[1024];
  block_path(f, 1, 0, path, sizeof path);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(s.disk_used, (uint64_t)st.st_size);
  assert_int_equal(count_files(f->dir), 1);

  assert_true(get_check(bm, key_of(1, 0), &a)); /* read back from disk */
  assert_true(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(2, 0), &b));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
}

static void test_bm_memory_and_disk_too_big_goes_straight_to_disk(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch big;
  make_sized_batch(&big, 5000, 1);
  put_release(bm, key_of(1, 0), FL_MEMORY_AND_DISK, &big);
  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_on_disk, 1);
  assert_int_equal(s.blocks_in_memory, 0);
  assert_int_equal(s.memory_used, 0);
  char path[1024];
  block_path(f, 1, 0, path, sizeof path);
  assert_true(file_exists(path));
  assert_true(get_check(bm, key_of(1, 0), &big));
  close_bm(f);
  rdd_batch_free(&big);
}

/* When spilling an evicted block fails (here: its folder is gone), the block is dropped;
 * the blocks left in memory must stay counted and on the LRU list. */
static void test_bm_failed_spill_drops_block_and_keeps_accounting(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_AND_DISK, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_AND_DISK, &b);
  test_rmtree(f->dir); /* the spill of block 1 cannot be written */
  put_release(bm, key_of(3, 0), FL_MEMORY_AND_DISK, &c);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.blocks_on_disk, 0);
  assert_int_equal(s.memory_used, 2000);
  assert_int_equal(s.blocks_in_memory, 2);
  assert_false(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(2, 0), &b));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
}

static void test_bm_disk_only_round_trip(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch content;
  make_batch(&content, 3000, 4, 40);
  const rdd_batch *stored;
  void *h = put_hold(bm, key_of(5, 2), FL_DISK_ONLY, &content, &stored);
  block_manager_cache_ops.release(bm, h);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_on_disk, 1);
  assert_int_equal(s.blocks_in_memory, 0);
  assert_int_equal(s.memory_used, 0);
  char path[1024];
  block_path(f, 5, 2, path, sizeof path);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(s.disk_used, (uint64_t)st.st_size);
  assert_true(get_check(bm, key_of(5, 2), &content));
  assert_true(get_check(bm, key_of(5, 2), &content));
  close_bm(f);
  rdd_batch_free(&content);
}

static void test_bm_memory_ser_stores_compressed(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch content = {FL_BUF_INIT, 0};
  for (int i = 0; i < 5000; i++) assert_ok(rdd_batch_append(&content, "repeated record!", 16));
  put_release(bm, key_of(1, 0), FL_MEMORY_SER, &content);

  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_in_memory, 1);
  assert_true(s.memory_used > 0);
  if (s.memory_used >= content.buf.len / 4)
    fprintf(stderr, "MEMORY_SER block of %zu raw bytes counts %llu bytes\n", content.buf.len,
            (unsigned long long)s.memory_used);
  assert_true(s.memory_used < content.buf.len / 4);
  assert_int_equal(s.blocks_on_disk, 0);
  assert_int_equal(count_files(f->dir), 0);
  assert_true(get_check(bm, key_of(1, 0), &content));
  assert_true(get_check(bm, key_of(1, 0), &content));
  close_bm(f);
  rdd_batch_free(&content);
}

static void test_bm_memory_ser_is_evicted_like_memory(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c;
  make_random_batch(&a, 1, 900, 1); /* incompressible: about 1000 encoded bytes each */
  make_random_batch(&b, 1, 900, 2);
  make_random_batch(&c, 1, 900, 3);
  put_release(bm, key_of(1, 0), FL_MEMORY_SER, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_SER, &b);
  put_release(bm, key_of(3, 0), FL_MEMORY_SER, &c);
  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.evictions, 1);
  assert_int_equal(s.blocks_in_memory, 2);
  assert_int_equal(count_files(f->dir), 0); /* dropped, not spilled */
  assert_false(get_check(bm, key_of(1, 0), &a));
  assert_true(get_check(bm, key_of(2, 0), &b));
  assert_true(get_check(bm, key_of(3, 0), &c));
  close_bm(f);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
}

static void overwrite_middle(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(st.st_size > 64);
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  const uint8_t junk[8] = {0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67};
  assert_int_equal(pwrite(fd, junk, sizeof junk, st.st_size / 2), (ssize_t)sizeof junk);
  assert_int_equal(close(fd), 0);
}

static void test_bm_corrupt_disk_block_is_a_miss_and_dropped(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch content;
  make_random_batch(&content, 20, 100, 8);
  put_release(bm, key_of(1, 0), FL_DISK_ONLY, &content);
  char path[1024];
  block_path(f, 1, 0, path, sizeof path);
  overwrite_middle(path);

  const rdd_batch *got = NULL;
  void *h = NULL;
  assert_false(block_manager_cache_ops.get(bm, key_of(1, 0), &got, &h));
  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_on_disk, 0);
  assert_int_equal(s.disk_used, 0);
  assert_false(file_exists(path));
  assert_false(block_manager_cache_ops.get(bm, key_of(1, 0), &got, &h));
  fl_storage_info info;
  memset(&info, 0, sizeof info);
  block_manager_cache_ops.info(bm, 1, &info);
  assert_int_equal(info.cached_partitions, 0);
  /* The partition can be cached again. */
  put_release(bm, key_of(1, 0), FL_DISK_ONLY, &content);
  assert_true(get_check(bm, key_of(1, 0), &content));
  close_bm(f);
  rdd_batch_free(&content);
}

static void test_bm_missing_disk_file_is_a_miss(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch content;
  make_batch(&content, 100, 2, 30);
  put_release(bm, key_of(1, 0), FL_DISK_ONLY, &content);
  char path[1024];
  block_path(f, 1, 0, path, sizeof path);
  assert_int_equal(unlink(path), 0);
  const rdd_batch *got;
  void *h;
  assert_false(block_manager_cache_ops.get(bm, key_of(1, 0), &got, &h));
  assert_int_equal(stats_of(bm).blocks_on_disk, 0);
  assert_int_equal(stats_of(bm).disk_used, 0);
  close_bm(f);
  rdd_batch_free(&content);
}

/* ---- block manager: remove, info, table growth, destroy -------------------------------- */

static void test_bm_remove_rdd_while_pinned(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch p0, p1, other;
  make_batch(&p0, 200, 1, 30);
  make_batch(&p1, 200, 2, 30);
  make_batch(&other, 200, 3, 30);
  put_release(bm, key_of(5, 0), FL_MEMORY_ONLY, &p0);
  put_release(bm, key_of(5, 1), FL_DISK_ONLY, &p1);
  put_release(bm, key_of(6, 0), FL_MEMORY_ONLY, &other);
  const rdd_batch *pinned = NULL;
  void *h = NULL;
  assert_true(block_manager_cache_ops.get(bm, key_of(5, 0), &pinned, &h));

  block_manager_cache_ops.remove_rdd(bm, 5);
  assert_false(get_check(bm, key_of(5, 0), &p0));
  assert_false(get_check(bm, key_of(5, 1), &p1));
  assert_true(get_check(bm, key_of(6, 0), &other));
  char path[1024];
  block_path(f, 5, 1, path, sizeof path);
  assert_false(file_exists(path));
  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_in_memory, 1);
  assert_int_equal(s.memory_used, other.buf.len);
  assert_int_equal(s.blocks_on_disk, 0);

  assert_batch_equal(pinned, &p0); /* the reader still reads its batch */
  block_manager_cache_ops.release(bm, h);
  assert_false(get_check(bm, key_of(5, 0), &p0));
  /* The key can be cached again. */
  put_release(bm, key_of(5, 0), FL_MEMORY_ONLY, &p0);
  assert_true(get_check(bm, key_of(5, 0), &p0));
  close_bm(f);
  rdd_batch_free(&p0);
  rdd_batch_free(&p1);
  rdd_batch_free(&other);
}

static void test_bm_info_counts_partitions_and_bytes(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 1 << 20);
  rdd_batch m0, d1, s2, o;
  make_sized_batch(&m0, 1000, 1);
  make_batch(&d1, 300, 2, 40);
  make_batch(&s2, 300, 3, 40);
  make_sized_batch(&o, 2000, 4);
  put_release(bm, key_of(7, 0), FL_MEMORY_ONLY, &m0);
  put_release(bm, key_of(8, 0), FL_MEMORY_ONLY, &o);
  uint64_t before_ser = stats_of(bm).memory_used;
  put_release(bm, key_of(7, 2), FL_MEMORY_SER, &s2);
  uint64_t ser_bytes = stats_of(bm).memory_used - before_ser;
  assert_true(ser_bytes > 0);
  put_release(bm, key_of(7, 1), FL_DISK_ONLY, &d1);
  char path[1024];
  block_path(f, 7, 1, path, sizeof path);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);

  fl_storage_info info;
  memset(&info, 0, sizeof info);
  block_manager_cache_ops.info(bm, 7, &info);
  assert_int_equal(info.cached_partitions, 3);
  assert_int_equal(info.memory_bytes, 1000 + ser_bytes);
  assert_int_equal(info.disk_bytes, (uint64_t)st.st_size);

  memset(&info, 0, sizeof info);
  block_manager_cache_ops.info(bm, 8, &info);
  assert_int_equal(info.cached_partitions, 1);
  assert_int_equal(info.memory_bytes, 2000);
  assert_int_equal(info.disk_bytes, 0);

  memset(&info, 0, sizeof info);
  block_manager_cache_ops.info(bm, 99, &info);
  assert_int_equal(info.cached_partitions, 0);
  assert_int_equal(info.memory_bytes, 0);
  assert_int_equal(info.disk_bytes, 0);
  close_bm(f);
  rdd_batch_free(&m0);
  rdd_batch_free(&d1);
  rdd_batch_free(&s2);
  rdd_batch_free(&o);
}

static void test_bm_many_blocks_survive_table_growth(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 64 << 20);
  enum { N = 300 };
  rdd_batch *contents = calloc(N, sizeof *contents);
  assert_non_null(contents);
  for (uint32_t i = 0; i < N; i++) {
    make_batch(&contents[i], 5 + i % 7, i, 20);
    put_release(bm, key_of(1 + i % 3, i), i % 5 == 0 ? FL_DISK_ONLY : FL_MEMORY_ONLY, &contents[i]);
  }
  for (uint32_t i = 0; i < N; i++) assert_true(get_check(bm, key_of(1 + i % 3, i), &contents[i]));
  fl_storage_info info;
  memset(&info, 0, sizeof info);
  block_manager_cache_ops.info(bm, 2, &info);
  assert_int_equal(info.cached_partitions, N / 3);
  block_manager_stats s = stats_of(bm);
  assert_int_equal(s.blocks_on_disk, N / 5);
  assert_int_equal(s.blocks_in_memory, N - N / 5);
  close_bm(f);
  for (uint32_t i = 0; i < N; i++) rdd_batch_free(&contents[i]);
  free(contents);
}

static void test_bm_destroy_removes_files(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  rdd_batch a, b, c, d;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  make_batch(&d, 100, 4, 20);
  put_release(bm, key_of(1, 0), FL_MEMORY_AND_DISK, &a);
  put_release(bm, key_of(2, 0), FL_MEMORY_AND_DISK, &b);
  put_release(bm, key_of(3, 0), FL_MEMORY_AND_DISK, &c); /* spills block 1 */
  put_release(bm, key_of(4, 0), FL_DISK_ONLY, &d);
  put_release(bm, key_of(4, 1), FL_DISK_ONLY, &d);
  assert_int_equal(count_files(f->dir), 3);
  close_bm(f);
  assert_int_equal(count_files(f->dir), 0);
  assert_true(file_exists(f->dir)); /* the folder is the caller's */
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
  rdd_batch_free(&d);
}

/* ---- block manager: threads ------------------------------------------------------------ */

enum { WORKERS = 4, WORKER_ROUNDS = 300, WORKER_PARTS = 20 };

typedef struct worker {
  block_manager *bm;
  uint32_t id;
  int errors, hits;
} worker;

/* Content is a function of the key, so any thread can check any block. */
static void key_content(rdd_batch *b, rdd_block_key key) {
  *b = (rdd_batch){FL_BUF_INIT, 0};
  uint8_t rec[64];
  for (uint32_t i = 0; i < 8; i++) {
    size_t len = (key.partition + i) % sizeof rec;
    for (size_t j = 0; j < len; j++) rec[j] = (uint8_t)(key.rdd_id * 7 + key.partition * 3 + i + j);
    if (rdd_batch_append(b, rec, len) != FL_OK) abort();
  }
}

static bool same_batch(const rdd_batch *a, const rdd_batch *b) {
  return a->count == b->count && a->buf.len == b->buf.len &&
         (a->buf.len == 0 || memcmp(a->buf.data, b->buf.data, a->buf.len) == 0);
}

static void *worker_main(void *arg) {
  worker *w = arg;
  common_rng rng;
  common_rng_seed(&rng, w->id);
  const fl_storage_level levels[] = {FL_MEMORY_ONLY, FL_MEMORY_SER, FL_MEMORY_AND_DISK, FL_DISK_ONLY};
  for (int r = 0; r < WORKER_ROUNDS; r++) {
    rdd_block_key key = key_of(1 + common_rng_next(&rng) % WORKERS, (uint32_t)(common_rng_next(&rng) % WORKER_PARTS));
    rdd_batch want;
    key_content(&want, key);
    const rdd_batch *got;
    void *h;
    if (block_manager_cache_ops.get(w->bm, key, &got, &h)) {
      w->hits++;
      if (!same_batch(got, &want)) w->errors++;
      block_manager_cache_ops.release(w->bm, h);
    } else {
      rdd_batch b;
      key_content(&b, key);
      fl_storage_level level = levels[key.rdd_id % 4];
      if (block_manager_cache_ops.put(w->bm, key, level, &b, &got, &h) != FL_OK) {
        w->errors++;
      } else {
        if (!same_batch(got, &want)) w->errors++;
        block_manager_cache_ops.release(w->bm, h);
      }
      rdd_batch_free(&b);
    }
    if (r % 100 == 99) block_manager_cache_ops.remove_rdd(w->bm, 1 + w->id % WORKERS);
    rdd_batch_free(&want);
  }
  return NULL;
}

static void test_bm_concurrent_get_put_remove(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 4000); /* small: evictions and spills happen */
  worker w[WORKERS];
  pthread_t th[WORKERS];
  for (uint32_t i = 0; i < WORKERS; i++) {
    w[i] = (worker){bm, i, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
  }
  int hits = 0;
  for (uint32_t i = 0; i < WORKERS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(w[i].errors, 0);
    hits += w[i].hits;
  }
  assert_true(hits > 0);
  block_manager_stats s = stats_of(bm);
  assert_true(s.memory_used <= s.memory_limit);
  close_bm(f);
  assert_int_equal(count_files(f->dir), 0);
}

/* ---- shared blocks: what executors on one node read in place ---------------------------- */

static block_manager *open_shared_bm(fixture *f, uint64_t limit) {
  assert_ok(block_manager_create(limit, f->dir, true, &f->bm));
  return f->bm;
}

/* A batch over SHARED_BLOCK_MIN: 3000 records of 99 bytes. */
static void make_shareable_batch(rdd_batch *b, uint32_t seed) {
  make_sized_batch(b, 300000, seed);
  assert_true(b->buf.len >= SHARED_BLOCK_MIN);
}

/* Another process (a child, as an executor beside this one) maps the block in place and reads
 * exactly the records; its copy in memory is the owner's (counted once, by the owner). */
static void test_shared_block_read_by_another_process(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  rdd_batch content;
  make_shareable_batch(&content, 3);
  const rdd_batch *stored;
  block_manager_cache_ops.release(bm, put_hold(bm, key_of(7, 2), FL_MEMORY_ONLY, &content, &stored));
  block_manager_stats st = stats_of(bm);
  assert_int_equal(st.blocks_shared, 1);
  assert_true(st.memory_used >= content.buf.len && st.memory_used < content.buf.len + 4096);
  pid_t owner = getpid(), child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/child", f->dir);
    block_manager *reader;
    int code = mkdir(dir, 0700) != 0 || block_manager_create(10u << 20, dir, false, &reader) != FL_OK;
    const rdd_batch *got = NULL;
    void *h = NULL;
    if (!code && block_manager_get_peer(reader, key_of(7, 2), (uint32_t)owner, &got, &h) != FL_OK) code = 2;
    if (!code && (got->count != content.count || got->buf.len != content.buf.len ||
                  memcmp(got->buf.data, content.buf.data, content.buf.len) != 0))
      code = 3;
    if (!code) {
      block_manager_stats rs;
      block_manager_stats_get(reader, &rs);
      if (rs.peer_blocks != 1 || rs.memory_used != 0) code = 4;
      block_manager_cache_ops.release(reader, h);
      block_manager_destroy(reader);
    }
    _exit(code);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  rdd_batch_free(&content);
  close_bm(f);
}

/* A mapped block stays readable and unchanged after its owner drops it (the bytes are sealed),
 * and a second read reuses the mapping; unpersisting the dataset unmaps it. */
static void test_shared_block_outlives_the_owners_copy(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  rdd_batch content;
  make_shareable_batch(&content, 4);
  const rdd_batch *stored;
  block_manager_cache_ops.release(bm, put_hold(bm, key_of(9, 0), FL_MEMORY_ONLY, &content, &stored));
  const rdd_batch *got;
  void *h;
  /* Its own process as the peer: the lookup under /proc/PID/fd is the same. */
  assert_ok(block_manager_get_peer(bm, key_of(9, 0), (uint32_t)getpid(), &got, &h));
  block_manager_cache_ops.remove_rdd(bm, 8); /* another dataset: nothing happens */
  assert_int_equal(stats_of(bm).peer_blocks, 1);
  /* The owner's copy goes; the reader's mapping does not. */
  rdd_block_key other = key_of(10, 0);
  block_manager_cache_ops.release(bm, put_hold(bm, other, FL_MEMORY_ONLY, &content, &stored));
  assert_batch_equal(got, &content);
  block_manager_cache_ops.release(bm, h);
  const rdd_batch *again;
  assert_ok(block_manager_get_peer(bm, key_of(9, 0), (uint32_t)getpid(), &again, &h));
  assert_ptr_equal(again, got); /* the same mapping */
  block_manager_cache_ops.release(bm, h);
  block_manager_cache_ops.remove_rdd(bm, 9);
  assert_int_equal(stats_of(bm).peer_blocks, 0);
  assert_int_equal(stats_of(bm).blocks_shared, 1); /* rdd 10's */
  rdd_batch_free(&content);
  close_bm(f);
}

/* What is not there: a block too small to share, a block never cached, a process that does
 * not exist. Each is FL_ENOENT (the caller then fetches the block), and nothing is kept. */
static void test_shared_block_missing(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  rdd_batch small;
  make_batch(&small, 100, 1, 50);
  const rdd_batch *stored, *got;
  void *h;
  block_manager_cache_ops.release(bm, put_hold(bm, key_of(1, 0), FL_MEMORY_ONLY, &small, &stored));
  assert_int_equal(stats_of(bm).blocks_shared, 0);
  assert_int_equal(block_manager_get_peer(bm, key_of(1, 0), (uint32_t)getpid(), &got, &h), FL_ENOENT);
  assert_int_equal(block_manager_get_peer(bm, key_of(2, 0), (uint32_t)getpid(), &got, &h), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "rdd_2_0"));
  assert_int_equal(block_manager_get_peer(bm, key_of(1, 0), 0x7ffffff0u, &got, &h), FL_ENOENT);
  assert_int_equal(stats_of(bm).peer_blocks, 0);
  rdd_batch_free(&small);
  close_bm(f);
}

/* A descriptor with a block's name that is not a good block (unsealed, another block's
 * header, malformed records) is refused with FL_ECORRUPT naming the cause, never mapped. */
static void test_shared_block_bad_descriptor(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  struct { const char *cause; bool seal; uint64_t rdd; uint64_t count; } cases[] = {
      {"not sealed", false, 5, 1}, {"does not hold", true, 6, 1}, {"malformed", true, 5, 1000}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int fd = memfd_create("flint-block-5-3", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    uint8_t bytes[64 + 16] = "FLNTSHB1";
    set_u64(bytes + 8, cases[i].rdd);
    uint32_t partition = 3;
    memcpy(bytes + 16, &partition, 4);
    set_u64(bytes + 24, cases[i].count);
    set_u64(bytes + 32, 16);
    bytes[64] = 15; /* one record of 15 bytes */
    assert_int_equal(write(fd, bytes, sizeof bytes), (ssize_t)sizeof bytes);
    if (cases[i].seal) assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), 0);
    const rdd_batch *got;
    void *h;
    assert_int_equal(block_manager_get_peer(bm, key_of(5, 3), (uint32_t)getpid(), &got, &h), FL_ECORRUPT);
    assert_non_null(strstr(fl_last_error(), cases[i].cause));
    close(fd);
  }
  assert_int_equal(stats_of(bm).peer_blocks, 0);
  close_bm(f);
}

/* The owner's bytes cannot change under a reader: the descriptor refuses writes. */
static void test_shared_block_is_sealed(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  rdd_batch content;
  make_shareable_batch(&content, 5);
  const rdd_batch *stored;
  block_manager_cache_ops.release(bm, put_hold(bm, key_of(3, 1), FL_MEMORY_ONLY, &content, &stored));
  char path[64];
  int found = 0;
  for (int fd = 3; fd < 1024 && !found; fd++) {
    char link[128] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n > 0 && strstr(link, "/memfd:flint-block-3-1")) found = fd;
  }
  assert_true(found > 0);
  assert_true(fcntl(found, F_GET_SEALS) & F_SEAL_WRITE);
  assert_true(write(found, "x", 1) < 0);
  assert_int_equal(ftruncate(found, 0), -1);
  rdd_batch_free(&content);
  close_bm(f);
}

/* Mapped peer blocks stay within the memory limit: one too large for it is read and then
 * unmapped, not kept. */
static void test_shared_block_peer_limit(void **state) {
  fixture *f = *state;
  block_manager *bm = open_shared_bm(f, 10u << 20);
  rdd_batch content;
  make_shareable_batch(&content, 6);
  const rdd_batch *stored, *got;
  void *h;
  block_manager_cache_ops.release(bm, put_hold(bm, key_of(4, 0), FL_MEMORY_ONLY, &content, &stored));
  block_manager *small;
  char dir[600];
  snprintf(dir, sizeof dir, "%s/small", f->dir);
  assert_int_equal(mkdir(dir, 0700), 0);
  assert_ok(block_manager_create(100000, dir, false, &small)); /* less than the block */
  assert_ok(block_manager_get_peer(small, key_of(4, 0), (uint32_t)getpid(), &got, &h));
  assert_batch_equal(got, &content);
  block_manager_stats s;
  block_manager_stats_get(small, &s);
  assert_int_equal(s.peer_blocks, 0);
  assert_int_equal(s.peer_bytes, 0);
  block_manager_cache_ops.release(small, h);
  block_manager_destroy(small);
  rdd_batch_free(&content);
  close_bm(f);
}

/* ---- block manager: its listener (the web UI's storage page) ---------------------------- */

typedef struct told {
  rdd_block_key key;
  fl_storage_level level;
  uint64_t memory, disk;
} told;

typedef struct told_list {
  told items[32];
  size_t n;
} told_list;

static void on_change(void *arg, rdd_block_key key, fl_storage_level level, uint64_t memory, uint64_t disk) {
  told_list *l = arg;
  assert_true(l->n < 32);
  l->items[l->n++] = (told){key, level, memory, disk};
}

static void assert_told(const told_list *l, size_t i, uint64_t rdd_id, fl_storage_level level, bool memory,
                        bool disk) {
  assert_true(i < l->n);
  assert_int_equal(l->items[i].key.rdd_id, rdd_id);
  assert_int_equal(l->items[i].key.partition, 0);
  assert_int_equal(l->items[i].level, level);
  assert_int_equal(l->items[i].memory != 0, memory);
  assert_int_equal(l->items[i].disk != 0, disk);
}

/* Every change of a block is told, in order, with the bytes it holds: stored in memory,
 * evicted to disk or dropped, stored on disk, removed; a block kept by another task's copy,
 * one that does not fit, and the blocks freed with the block manager are not. */
static void test_bm_listener_told_each_change(void **state) {
  fixture *f = *state;
  block_manager *bm = open_bm(f, 2500);
  told_list l = {.n = 0};
  block_manager_set_listener(bm, on_change, &l);
  rdd_batch a, b, c, d, big;
  make_sized_batch(&a, 1000, 1);
  make_sized_batch(&b, 1000, 2);
  make_sized_batch(&c, 1000, 3);
  make_sized_batch(&d, 1000, 4);
  make_sized_batch(&big, 5000, 5);
  put_release(bm, key_of(1, 0), FL_MEMORY_AND_DISK, &a);
  assert_int_equal(l.n, 1);
  assert_told(&l, 0, 1, FL_MEMORY_AND_DISK, true, false);
  assert_int_equal(l.items[0].memory, 1000);
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &b);
  put_release(bm, key_of(2, 0), FL_MEMORY_ONLY, &b); /* cached already: no change */
  assert_int_equal(l.n, 2);
  put_release(bm, key_of(3, 0), FL_MEMORY_ONLY, &c); /* evicts 1 to disk */
  assert_int_equal(l.n, 4);
  assert_told(&l, 2, 1, FL_MEMORY_AND_DISK, false, true);
  block_manager_stats s = stats_of(bm);
  assert_int_equal(l.items[2].disk, s.disk_used);
  assert_told(&l, 3, 3, FL_MEMORY_ONLY, true, false);
  put_release(bm, key_of(4, 0), FL_MEMORY_ONLY, &d); /* evicts 2: dropped */
  assert_int_equal(l.n, 6);
  assert_told(&l, 4, 2, FL_MEMORY_ONLY, false, false);
  assert_told(&l, 5, 4, FL_MEMORY_ONLY, true, false);
  put_release(bm, key_of(5, 0), FL_MEMORY_ONLY, &big); /* does not fit: not cached */
  assert_int_equal(l.n, 6);
  put_release(bm, key_of(6, 0), FL_DISK_ONLY, &a);
  assert_int_equal(l.n, 7);
  assert_told(&l, 6, 6, FL_DISK_ONLY, false, true);
  block_manager_cache_ops.remove_rdd(bm, 1);
  assert_int_equal(l.n, 8);
  assert_told(&l, 7, 1, FL_MEMORY_AND_DISK, false, false);
  block_manager_set_listener(bm, NULL, NULL);
  block_manager_cache_ops.remove_rdd(bm, 3);
  assert_int_equal(l.n, 8);
  block_manager_set_listener(bm, on_change, &l);
  close_bm(f); /* the blocks left go untold */
  assert_int_equal(l.n, 8);
  rdd_batch_free(&a);
  rdd_batch_free(&b);
  rdd_batch_free(&c);
  rdd_batch_free(&d);
  rdd_batch_free(&big);
}

#define BM_TEST(fn) cmocka_unit_test_setup_teardown(fn, fixture_setup, fixture_teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      BM_TEST(test_shared_block_read_by_another_process),
      BM_TEST(test_shared_block_outlives_the_owners_copy),
      BM_TEST(test_shared_block_missing),
      BM_TEST(test_shared_block_bad_descriptor),
      BM_TEST(test_shared_block_is_sealed),
      BM_TEST(test_shared_block_peer_limit),
      cmocka_unit_test(test_codec_round_trip_empty_batch),
      cmocka_unit_test(test_codec_round_trip_one_record),
      cmocka_unit_test(test_codec_round_trip_10000_records_with_empty_ones),
      cmocka_unit_test(test_codec_round_trip_incompressible_records),
      cmocka_unit_test(test_codec_compresses_repetitive_data),
      cmocka_unit_test(test_codec_decode_bad_magic),
      cmocka_unit_test(test_codec_decode_header_truncated),
      cmocka_unit_test(test_codec_decode_flipped_payload_byte_fails_checksum),
      cmocka_unit_test(test_codec_decode_any_flipped_byte_fails_or_is_harmless),
      cmocka_unit_test(test_codec_decode_huge_raw_length),
      cmocka_unit_test(test_codec_decode_frame_truncated_by_one_byte),
      cmocka_unit_test(test_codec_decode_trailing_garbage),
      cmocka_unit_test(test_codec_decode_count_mismatch),
      cmocka_unit_test(test_codec_decode_raw_length_mismatch),
      BM_TEST(test_bm_put_memory_only_then_get_hits),
      BM_TEST(test_bm_get_unknown_key_misses),
      BM_TEST(test_bm_put_existing_key_keeps_first_block),
      BM_TEST(test_bm_lru_evicts_least_recently_used_other_rdd),
      BM_TEST(test_bm_get_refreshes_recency),
      BM_TEST(test_bm_same_rdd_blocks_are_not_evicted_for_it),
      BM_TEST(test_bm_pinned_block_is_not_evicted),
      BM_TEST(test_bm_block_larger_than_limit_is_not_cached),
      BM_TEST(test_bm_empty_batch_round_trip),
      BM_TEST(test_bm_memory_and_disk_evicted_block_goes_to_disk),
      BM_TEST(test_bm_memory_and_disk_too_big_goes_straight_to_disk),
      BM_TEST(test_bm_failed_spill_drops_block_and_keeps_accounting),
      BM_TEST(test_bm_disk_only_round_trip),
      BM_TEST(test_bm_memory_ser_stores_compressed),
      BM_TEST(test_bm_memory_ser_is_evicted_like_memory),
      BM_TEST(test_bm_corrupt_disk_block_is_a_miss_and_dropped),
      BM_TEST(test_bm_missing_disk_file_is_a_miss),
      BM_TEST(test_bm_remove_rdd_while_pinned),
      BM_TEST(test_bm_info_counts_partitions_and_bytes),
      BM_TEST(test_bm_many_blocks_survive_table_growth),
      BM_TEST(test_bm_destroy_removes_files),
      BM_TEST(test_bm_concurrent_get_put_remove),
      BM_TEST(test_bm_listener_told_each_change),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
