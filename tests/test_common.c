/* test_common.c: unit tests of common/ (status table, errors, buffers, pairs, varints, rng, sizes, queue, events, allocator hook, symbols). */
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>

#include "common/common.h"

/* ---- status table ---------------------------------------------------------------------- */

static void test_strerror_matches_table_for_every_code(void **state) {
  (void)state;
  int checked = 0;
#define CHECK_TEXT_(name, value, text)                                                       \
  assert_int_equal((int)FL_##name, value);                                                   \
  assert_string_equal(fl_strerror(FL_##name), text);                                         \
  checked++;
  FL_STATUS_TABLE(CHECK_TEXT_)
#undef CHECK_TEXT_
  /* Codes are dense from 0, so the table has one entry per code up to the last. */
  int last = 0;
#define LAST_CODE_(name, value, text) last = value > last ? value : last;
  FL_STATUS_TABLE(LAST_CODE_)
#undef LAST_CODE_
  assert_int_equal(checked, last + 1);
}

static void test_status_name_matches_table_for_every_code(void **state) {
  (void)state;
#define CHECK_NAME_(name, value, text) assert_string_equal(fl_status_name(FL_##name), "FL_" #name);
  FL_STATUS_TABLE(CHECK_NAME_)
#undef CHECK_NAME_
}

static void test_unknown_status_has_text_and_name(void **state) {
  (void)state;
  fl_status unknown = (fl_status)999;
  assert_non_null(fl_strerror(unknown));
  assert_non_null(fl_status_name(unknown));
  assert_string_equal(fl_strerror(unknown), "unknown status");
  assert_string_equal(fl_status_name(unknown), "FL_UNKNOWN");
  int last = 0;
#define LAST_CODE_(name, value, text) last = value > last ? value : last;
  FL_STATUS_TABLE(LAST_CODE_)
#undef LAST_CODE_
  assert_string_equal(fl_status_name((fl_status)(last + 1)), "FL_UNKNOWN");
}

/* ---- thread-local error message -------------------------------------------------------- */

static void test_set_error_formats_and_returns_status(void **state) {
  (void)state;
  assert_int_equal(fl_set_error(FL_EFORMAT, "bad number '%s' at %d", "x1", 7), FL_EFORMAT);
  assert_string_equal(fl_last_error(), "bad number 'x1' at 7");
  assert_int_equal(fl_set_error(FL_EIO, "second"), FL_EIO);
  assert_string_equal(fl_last_error(), "second");
}

static void test_set_error_truncates_long_message(void **state) {
  (void)state;
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  fl_set_error(FL_EINVAL, "%s", big);
  size_t n = strlen(fl_last_error());
  assert_true(n > 0);
  assert_true(n < sizeof big - 1);
  assert_int_equal(fl_last_error()[0], 'a');
}

static void test_error_clear_and_wrap(void **state) {
  (void)state;
  fl_set_error(FL_EIO, "inner cause");
  common_error_wrap(FL_EIO, "reading %s: ", "f.txt");
  assert_string_equal(fl_last_error(), "reading f.txt: inner cause");
  common_error_clear();
  assert_string_equal(fl_last_error(), "");
  /* With no message, wrap puts the code's description after the prefix. */
  assert_int_equal(common_error_wrap(FL_ENOENT, "open: "), FL_ENOENT);
  assert_string_equal(fl_last_error(), "open: no such file or object");
}

typedef struct error_thread {
  char seen_at_start[64];
  char seen_after_set[64];
} error_thread;

static void *error_thread_main(void *arg) {
  error_thread *t = arg;
  snprintf(t->seen_at_start, sizeof t->seen_at_start, "%s", fl_last_error());
  fl_set_error(FL_EIO, "message of thread two");
  snprintf(t->seen_after_set, sizeof t->seen_after_set, "%s", fl_last_error());
  return NULL;
}

static void test_last_error_is_thread_local(void **state) {
  (void)state;
  fl_set_error(FL_EINVAL, "message of thread one");
  error_thread t;
  memset(&t, 0, sizeof t);
  strcpy(t.seen_at_start, "not run");
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, error_thread_main, &t), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_string_equal(t.seen_at_start, "");
  assert_string_equal(t.seen_after_set, "message of thread two");
  assert_string_equal(fl_last_error(), "message of thread one");
}

/* ---- buffers ---------------------------------------------------------------------------- */

static void test_buf_reserve_on_empty_allocates(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  assert_ok(fl_buf_reserve(&b, 10));
  assert_non_null(b.data);
  assert_true(b.cap >= 10);
  assert_int_equal(b.len, 0);
  size_t cap = b.cap;
  /* Room is already there: nothing changes. */
  assert_ok(fl_buf_reserve(&b, cap));
  assert_int_equal(b.cap, cap);
  fl_buf_free(&b);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  assert_int_equal(b.cap, 0);
}

static void test_buf_append_grows_geometrically_and_keeps_bytes(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  size_t cap_changes = 0, last_cap = 0;
  for (size_t i = 0; i < 100000; i++) {
    uint8_t byte = (uint8_t)(i * 31 + 7);
    assert_ok(fl_buf_append(&b, &byte, 1));
    assert_true(b.cap >= b.len);
    if (b.cap != last_cap) {
      cap_changes++;
      last_cap = b.cap;
    }
  }
  assert_int_equal(b.len, 100000);
  /* Doubling: about log2(100000 / 64) + 1 growths, not one per append. */
  assert_true(cap_changes <= 20);
  for (size_t i = 0; i < 100000; i++) assert_int_equal(b.data[i], (uint8_t)(i * 31 + 7));
  fl_buf_free(&b);
}

static void test_buf_append_large_chunk(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  assert_ok(fl_buf_append(&b, "ab", 2));
  uint8_t big[5000];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)i;
  assert_ok(fl_buf_append(&b, big, sizeof big));
  assert_int_equal(b.len, 2 + sizeof big);
  assert_memory_equal(b.data, "ab", 2);
  assert_memory_equal(b.data + 2, big, sizeof big);
  /* Appending nothing (even from NULL) is fine. */
  assert_ok(fl_buf_append(&b, NULL, 0));
  assert_int_equal(b.len, 2 + sizeof big);
  fl_buf_free(&b);
}

static void test_buf_null_is_einval(void **state) {
  (void)state;
  assert_fails_with(fl_buf_reserve(NULL, 1), FL_EINVAL, "NULL");
  assert_fails_with(fl_buf_put_pair(NULL, fl_bytes_str("k"), fl_bytes_str("v")), FL_EINVAL, "NULL");
  fl_buf_free(NULL); /* does nothing */
}

static void test_buf_reserve_overflow_is_elimit(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  assert_ok(fl_buf_append(&b, "x", 1));
  uint8_t *data = b.data;
  size_t cap = b.cap;
  assert_int_equal(fl_buf_reserve(&b, SIZE_MAX), FL_ELIMIT);
  assert_ptr_equal(b.data, data);
  assert_int_equal(b.cap, cap);
  assert_int_equal(b.len, 1);
  fl_buf_free(&b);
}

/* ---- pairs ------------------------------------------------------------------------------ */

static void check_pair_round_trip(fl_bytes key, fl_bytes value) {
  fl_buf b = FL_BUF_INIT;
  assert_ok(fl_buf_put_pair(&b, key, value));
  fl_bytes k = {NULL, 99}, v = {NULL, 99};
  assert_ok(fl_pair(fl_buf_bytes(&b), &k, &v));
  assert_int_equal(k.len, key.len);
  assert_int_equal(v.len, value.len);
  if (key.len) assert_memory_equal(k.data, key.data, key.len);
  if (value.len) assert_memory_equal(v.data, value.data, value.len);
  /* The views point into the record. */
  assert_true(k.data >= b.data && k.data + k.len <= b.data + b.len);
  assert_true(v.data >= b.data && v.data + v.len <= b.data + b.len);
  fl_buf_free(&b);
}

static void test_pair_round_trip_with_zero_bytes(void **state) {
  (void)state;
  const uint8_t key[] = {0, 'k', 0, 0, 'y'};
  const uint8_t value[] = {0, 0, 0, 'v', 0};
  check_pair_round_trip(fl_bytes_of(key, sizeof key), fl_bytes_of(value, sizeof value));
}

static void test_pair_round_trip_empty_key_and_value(void **state) {
  (void)state;
  check_pair_round_trip(fl_bytes_of("", 0), fl_bytes_str("value"));
  check_pair_round_trip(fl_bytes_str("key"), fl_bytes_of("", 0));
  check_pair_round_trip(fl_bytes_of("", 0), fl_bytes_of("", 0));
}

static void test_pair_round_trip_100k_key(void **state) {
  (void)state;
  size_t n = 100 * 1024;
  uint8_t *key = malloc(n);
  assert_non_null(key);
  for (size_t i = 0; i < n; i++) key[i] = (uint8_t)(i * 131 + (i >> 8));
  check_pair_round_trip(fl_bytes_of(key, n), fl_bytes_str("v\0w"));
  check_pair_round_trip(fl_bytes_str("k"), fl_bytes_of(key, n));
  free(key);
}

static void test_pairs_append_one_after_another(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  assert_ok(fl_buf_put_pair(&b, fl_bytes_str("a"), fl_bytes_str("1")));
  size_t first = b.len;
  assert_ok(fl_buf_put_pair(&b, fl_bytes_str("bb"), fl_bytes_str("22")));
  fl_bytes k, v;
  assert_ok(fl_pair(fl_bytes_of(b.data + first, b.len - first), &k, &v));
  assert_int_equal(k.len, 2);
  assert_memory_equal(k.data, "bb", 2);
  assert_memory_equal(v.data, "22", 2);
  fl_buf_free(&b);
}

static void test_pair_truncated_varint_is_eformat(void **state) {
  (void)state;
  const uint8_t rec[] = {0x80};
  const uint8_t rec2[] = {0xff, 0xff};
  fl_bytes k, v;
  assert_fails_with(fl_pair(fl_bytes_of(rec, sizeof rec), &k, &v), FL_EFORMAT, "not a pair");
  assert_fails_with(fl_pair(fl_bytes_of(rec2, sizeof rec2), &k, &v), FL_EFORMAT, "not a pair");
  assert_fails_with(fl_pair(fl_bytes_of(rec, 0), &k, &v), FL_EFORMAT, "not a pair");
}

static void test_pair_key_longer_than_record_is_eformat(void **state) {
  (void)state;
  const uint8_t rec[] = {5, 'a', 'b', 'c', 'd'}; /* says 5 key bytes, has 4 */
  fl_bytes k, v;
  assert_fails_with(fl_pair(fl_bytes_of(rec, sizeof rec), &k, &v), FL_EFORMAT, "not a pair");
  /* A key length near 2^64 must not wrap around. */
  uint8_t huge[COMMON_VARINT_MAX + 2];
  size_t n = common_varint_put(huge, UINT64_MAX);
  huge[n] = 'x';
  assert_fails_with(fl_pair(fl_bytes_of(huge, n + 1), &k, &v), FL_EFORMAT, "not a pair");
  /* Exactly the record: fine, empty value. */
  const uint8_t exact[] = {4, 'a', 'b', 'c', 'd'};
  assert_ok(fl_pair(fl_bytes_of(exact, sizeof exact), &k, &v));
  assert_int_equal(k.len, 4);
  assert_int_equal(v.len, 0);
}

static void test_pair_null_outputs_are_einval(void **state) {
  (void)state;
  const uint8_t rec[] = {1, 'a', 'b'};
  fl_bytes k;
  assert_fails_with(fl_pair(fl_bytes_of(rec, sizeof rec), &k, NULL), FL_EINVAL, "NULL");
  assert_fails_with(fl_pair(fl_bytes_of(rec, sizeof rec), NULL, &k), FL_EINVAL, "NULL");
}

/* ---- varints ---------------------------------------------------------------------------- */

static void test_varint_round_trip(void **state) {
  (void)state;
  const struct {
    uint64_t v;
    size_t len;
  } cases[] = {{0, 1},       {1, 1},          {127, 1},         {128, 2},
               {300, 2},     {16383, 2},      {16384, 3},       {1ull << 32, 5},
               {UINT64_MAX - 1, 10}, {UINT64_MAX, 10}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint8_t buf[COMMON_VARINT_MAX + 1];
    memset(buf, 0xAA, sizeof buf);
    size_t n = common_varint_put(buf, cases[i].v);
    assert_int_equal(n, cases[i].len);
    assert_int_equal(buf[n], 0xAA); /* wrote nothing past its length */
    uint64_t back = 12345;
    assert_int_equal(common_varint_get(buf, buf + n, &back), n);
    assert_true(back == cases[i].v);
    /* Trailing bytes are not read. */
    assert_int_equal(common_varint_get(buf, buf + sizeof buf, &back), n);
    assert_true(back == cases[i].v);
  }
}

static void test_varint_known_encoding(void **state) {
  (void)state;
  uint8_t buf[COMMON_VARINT_MAX];
  assert_int_equal(common_varint_put(buf, 300), 2);
  assert_int_equal(buf[0], 0xAC);
  assert_int_equal(buf[1], 0x02);
  assert_int_equal(common_varint_put(buf, UINT64_MAX), 10);
  for (int i = 0; i < 9; i++) assert_int_equal(buf[i], 0xFF);
  assert_int_equal(buf[9], 0x01);
}

static void test_varint_truncated_returns_zero(void **state) {
  (void)state;
  const uint64_t values[] = {128, 1ull << 32, UINT64_MAX};
  for (size_t i = 0; i < 3; i++) {
    uint8_t buf[COMMON_VARINT_MAX];
    size_t n = common_varint_put(buf, values[i]);
    for (size_t cut = 0; cut < n; cut++) {
      uint64_t v = 77;
      assert_int_equal(common_varint_get(buf, buf + cut, &v), 0);
      assert_true(v == 77); /* untouched */
    }
  }
  /* Eleven continuation bytes: longer than any varint. */
  uint8_t cont[11];
  memset(cont, 0x80, sizeof cont);
  uint64_t v;
  assert_int_equal(common_varint_get(cont, cont + sizeof cont, &v), 0);
}

/* ---- random numbers --------------------------------------------------------------------- */

static void test_rng_same_seed_same_stream(void **state) {
  (void)state;
  common_rng a, b;
  common_rng_seed(&a, 42);
  common_rng_seed(&b, 42);
  for (int i = 0; i < 10000; i++) assert_true(common_rng_next(&a) == common_rng_next(&b));
}

static void test_rng_different_seeds_differ(void **state) {
  (void)state;
  common_rng a, b;
  common_rng_seed(&a, 1);
  common_rng_seed(&b, 2);
  int equal = 0;
  for (int i = 0; i < 1000; i++) equal += common_rng_next(&a) == common_rng_next(&b);
  assert_int_equal(equal, 0);
  /* Seed 0 still gives a working (non-zero) stream. */
  common_rng z;
  common_rng_seed(&z, 0);
  uint64_t any = 0;
  for (int i = 0; i < 4; i++) any |= common_rng_next(&z);
  assert_true(any != 0);
}

static void test_rng_uniform_in_unit_interval(void **state) {
  (void)state;
  common_rng r;
  common_rng_seed(&r, 7);
  double sum = 0, lo = 1, hi = 0;
  const int n = 200000;
  for (int i = 0; i < n; i++) {
    double u = common_rng_uniform(&r);
    assert_true(u >= 0.0);
    assert_true(u < 1.0);
    sum += u;
    if (u < lo) lo = u;
    if (u > hi) hi = u;
  }
  assert_true(fabs(sum / n - 0.5) < 0.01);
  assert_true(lo < 0.001);
  assert_true(hi > 0.999);
}

static void poisson_moments(double mean, double *got_mean, double *got_var) {
  common_rng r;
  common_rng_seed(&r, 1234 + (uint64_t)(mean * 10));
  const int n = 200000;
  double sum = 0, sum2 = 0;
  for (int i = 0; i < n; i++) {
    double k = common_rng_poisson(&r, mean);
    sum += k;
    sum2 += k * k;
  }
  *got_mean = sum / n;
  *got_var = sum2 / n - *got_mean * *got_mean;
}

static void check_poisson_mean(double mean) {
  double m, var;
  poisson_moments(mean, &m, &var);
  if (fabs(m - mean) > 0.03 * mean) fprintf(stderr, "poisson(%g): mean %g\n", mean, m);
  assert_true(fabs(m - mean) <= 0.03 * mean);
}

static void test_rng_poisson_mean_half(void **state) {
  (void)state;
  check_poisson_mean(0.5);
}
static void test_rng_poisson_mean_3(void **state) {
  (void)state;
  check_poisson_mean(3);
}
static void test_rng_poisson_mean_50(void **state) {
  (void)state;
  check_poisson_mean(50);
}

static void test_rng_poisson_variance_equals_mean(void **state) {
  (void)state;
  const double means[] = {0.5, 3, 50};
  for (int i = 0; i < 3; i++) {
    double m, var;
    poisson_moments(means[i], &m, &var);
    if (fabs(var - means[i]) > 0.05 * means[i])
      fprintf(stderr, "poisson(%g): variance %g\n", means[i], var);
    assert_true(fabs(var - means[i]) <= 0.05 * means[i]);
  }
}

static void test_rng_poisson_nonpositive_mean_is_zero(void **state) {
  (void)state;
  common_rng r;
  common_rng_seed(&r, 3);
  for (int i = 0; i < 100; i++) {
    assert_int_equal(common_rng_poisson(&r, 0), 0);
    assert_int_equal(common_rng_poisson(&r, -2.5), 0);
  }
}

/* ---- sizes ------------------------------------------------------------------------------ */

static void test_parse_size_accepts_units(void **state) {
  (void)state;
  uint64_t v = 0;
  assert_ok(fl_parse_size("512m", &v));
  assert_true(v == 512ull << 20);
  assert_ok(fl_parse_size("2G", &v));
  assert_true(v == 2ull << 30);
  assert_ok(fl_parse_size("1048576", &v));
  assert_true(v == 1048576);
  assert_ok(fl_parse_size("1kb", &v));
  assert_true(v == 1024);
  assert_ok(fl_parse_size("3T", &v));
  assert_true(v == 3ull << 40);
  assert_ok(fl_parse_size("0", &v));
  assert_true(v == 0);
}

static void test_parse_size_rejects_bad_input(void **state) {
  (void)state;
  const char *bad[] = {"", "-1", "12x", "m", "1kbx", "k", "1 k", "18446744073709551616",
                       "16777216T"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t v = 4242;
    if (fl_parse_size(bad[i], &v) == FL_OK) fprintf(stderr, "accepted '%s'\n", bad[i]);
    assert_int_equal(FL_EINVAL, fl_parse_size(bad[i], &v));
    assert_true(v == 4242); /* untouched */
  }
  uint64_t v;
  assert_int_equal(FL_EINVAL, fl_parse_size(NULL, &v));
}

/* strtoull skips leading blanks and then negates "-1" to 2^64-1; the '-' check in
 * the parser must not let strtoull skip spaces and a sign. */
static void test_parse_size_rejects_negative_after_whitespace(void **state) {
  (void)state;
  uint64_t v = 4242;
  bool ok = fl_parse_size(" -1", &v) == FL_OK;
  if (ok) fprintf(stderr, "' -1' parsed as %llu\n", (unsigned long long)v);
  assert_false(ok);
}

/* ---- queue ------------------------------------------------------------------------------ */

#define PRODUCERS 4
#define ITEMS_PER_PRODUCER 10000

typedef struct test_item {
  common_qnode node;
  int producer, seq;
} test_item;

typedef struct producer_arg {
  common_queue *q;
  test_item *items;
} producer_arg;

static void *producer_main(void *arg) {
  producer_arg *p = arg;
  for (int i = 0; i < ITEMS_PER_PRODUCER; i++) common_queue_push(p->q, &p->items[i].node);
  return NULL;
}

typedef struct consumer_result {
  common_queue *q;
  int received, duplicates, out_of_order, bad;
  bool seen[PRODUCERS][ITEMS_PER_PRODUCER];
} consumer_result;

static void *consumer_main(void *arg) {
  consumer_result *c = arg;
  int next[PRODUCERS] = {0};
  for (int i = 0; i < PRODUCERS * ITEMS_PER_PRODUCER; i++) {
    common_qnode *node = common_queue_pop(c->q, 20000);
    if (!node) {
      c->bad++;
      break;
    }
    test_item *it = (test_item *)node;
    if (it->producer < 0 || it->producer >= PRODUCERS || it->seq < 0 || it->seq >= ITEMS_PER_PRODUCER) {
      c->bad++;
      continue;
    }
    if (c->seen[it->producer][it->seq]) c->duplicates++;
    c->seen[it->producer][it->seq] = true;
    if (it->seq != next[it->producer]) c->out_of_order++;
    next[it->producer] = it->seq + 1;
    c->received++;
  }
  return NULL;
}

static void test_queue_many_producers_one_consumer(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  test_item *items = calloc(PRODUCERS * ITEMS_PER_PRODUCER, sizeof *items);
  consumer_result *c = calloc(1, sizeof *c);
  assert_non_null(items);
  assert_non_null(c);
  c->q = &q;
  for (int p = 0; p < PRODUCERS; p++)
    for (int i = 0; i < ITEMS_PER_PRODUCER; i++) {
      items[p * ITEMS_PER_PRODUCER + i].producer = p;
      items[p * ITEMS_PER_PRODUCER + i].seq = i;
    }
  pthread_t consumer, producers[PRODUCERS];
  producer_arg args[PRODUCERS];
  assert_int_equal(pthread_create(&consumer, NULL, consumer_main, c), 0);
  for (int p = 0; p < PRODUCERS; p++) {
    args[p].q = &q;
    args[p].items = &items[p * ITEMS_PER_PRODUCER];
    assert_int_equal(pthread_create(&producers[p], NULL, producer_main, &args[p]), 0);
  }
  for (int p = 0; p < PRODUCERS; p++) assert_int_equal(pthread_join(producers[p], NULL), 0);
  assert_int_equal(pthread_join(consumer, NULL), 0);

  assert_int_equal(c->bad, 0);
  assert_int_equal(c->duplicates, 0);
  assert_int_equal(c->out_of_order, 0);
  assert_int_equal(c->received, PRODUCERS * ITEMS_PER_PRODUCER);
  for (int p = 0; p < PRODUCERS; p++)
    for (int i = 0; i < ITEMS_PER_PRODUCER; i++) assert_true(c->seen[p][i]);
  assert_int_equal(atomic_load(&q.depth), 0);
  assert_null(q.head);
  common_queue_destroy(&q);
  free(c);
  free(items);
}

/* Several poppers share a queue, as rpc handler threads do: only one spins at a time and the
 * others sleep, yet every item reaches exactly one of them and the spinner's claim is given
 * back. */
#define CONSUMERS 4
typedef struct shared_consumer {
  common_queue *q;
  atomic_int *left; /* items still to pop, over all consumers */
  int received;
  bool *seen;       /* PRODUCERS x ITEMS_PER_PRODUCER, shared: each slot set once */
  atomic_int *duplicates;
} shared_consumer;

static void *shared_consumer_main(void *arg) {
  shared_consumer *c = arg;
  while (atomic_fetch_sub(c->left, 1) > 0) {
    test_item *it = (test_item *)common_queue_pop(c->q, 50000);
    if (!it) break;
    bool *slot = &c->seen[it->producer * ITEMS_PER_PRODUCER + it->seq];
    if (__atomic_exchange_n(slot, true, __ATOMIC_RELAXED)) atomic_fetch_add(c->duplicates, 1);
    c->received++;
  }
  return NULL;
}

static void test_queue_many_consumers_share_one_spinner(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  test_item *items = calloc(PRODUCERS * ITEMS_PER_PRODUCER, sizeof *items);
  bool *seen = calloc(PRODUCERS * ITEMS_PER_PRODUCER, sizeof *seen);
  assert_non_null(items);
  assert_non_null(seen);
  for (int p = 0; p < PRODUCERS; p++)
    for (int i = 0; i < ITEMS_PER_PRODUCER; i++) {
      items[p * ITEMS_PER_PRODUCER + i].producer = p;
      items[p * ITEMS_PER_PRODUCER + i].seq = i;
    }
  atomic_int left = PRODUCERS * ITEMS_PER_PRODUCER, duplicates = 0;
  shared_consumer cs[CONSUMERS];
  pthread_t consumers[CONSUMERS], producers[PRODUCERS];
  producer_arg args[PRODUCERS];
  for (int i = 0; i < CONSUMERS; i++) {
    cs[i] = (shared_consumer){.q = &q, .left = &left, .seen = seen, .duplicates = &duplicates};
    assert_int_equal(pthread_create(&consumers[i], NULL, shared_consumer_main, &cs[i]), 0);
  }
  for (int p = 0; p < PRODUCERS; p++) {
    args[p] = (producer_arg){.q = &q, .items = &items[p * ITEMS_PER_PRODUCER]};
    assert_int_equal(pthread_create(&producers[p], NULL, producer_main, &args[p]), 0);
  }
  for (int p = 0; p < PRODUCERS; p++) assert_int_equal(pthread_join(producers[p], NULL), 0);
  int received = 0;
  for (int i = 0; i < CONSUMERS; i++) {
    assert_int_equal(pthread_join(consumers[i], NULL), 0);
    received += cs[i].received;
  }
  assert_int_equal(received, PRODUCERS * ITEMS_PER_PRODUCER);
  assert_int_equal(atomic_load(&duplicates), 0);
  for (int i = 0; i < PRODUCERS * ITEMS_PER_PRODUCER; i++) assert_true(seen[i]);
  assert_false(atomic_load(&q.spinning));
  assert_int_equal(atomic_load(&q.depth), 0);
  common_queue_destroy(&q);
  free(seen);
  free(items);
}

static void test_queue_single_thread_fifo_and_depth(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  test_item items[5];
  for (int i = 0; i < 5; i++) {
    items[i].seq = i;
    common_queue_push(&q, &items[i].node);
    assert_int_equal(atomic_load(&q.depth), (size_t)i + 1);
  }
  for (int i = 0; i < 5; i++) {
    test_item *it = (test_item *)common_queue_pop(&q, 0);
    assert_non_null(it);
    assert_int_equal(it->seq, i);
  }
  assert_int_equal(atomic_load(&q.depth), 0);
  common_queue_destroy(&q);
}

static void test_queue_close_returns_remaining_items_then_null(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  test_item a = {{NULL}, 0, 1}, b = {{NULL}, 0, 2};
  common_queue_push(&q, &a.node);
  common_queue_push(&q, &b.node);
  common_queue_close(&q);
  assert_ptr_equal(common_queue_pop(&q, 0), &a.node);
  assert_ptr_equal(common_queue_pop(&q, 0), &b.node);
  assert_null(common_queue_pop(&q, 0));
  assert_null(common_queue_pop(&q, 1000));
  common_queue_destroy(&q);
}

typedef struct blocked_pop {
  common_queue *q;
  common_qnode *result;
  atomic_bool returned;
} blocked_pop;

static void *blocked_pop_main(void *arg) {
  blocked_pop *b = arg;
  b->result = common_queue_pop(b->q, 0);
  atomic_store(&b->returned, true);
  return NULL;
}

static int queue_sleepers(common_queue *q) {
  pthread_mutex_lock(&q->lock);
  int n = q->sleepers;
  pthread_mutex_unlock(&q->lock);
  return n;
}

static void test_queue_close_wakes_blocked_pop(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  blocked_pop b;
  b.q = &q;
  b.result = (common_qnode *)&b; /* anything but NULL */
  atomic_init(&b.returned, false);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, blocked_pop_main, &b), 0);
  /* Wait until the consumer sleeps on the condition variable (counted under the lock). */
  while (queue_sleepers(&q) == 0) {
    assert_false(atomic_load(&b.returned)); /* an empty open queue must not return */
    sched_yield();
  }
  assert_false(atomic_load(&b.returned));
  common_queue_close(&q);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_true(atomic_load(&b.returned));
  assert_null(b.result);
  common_queue_destroy(&q);
}

static void test_queue_push_wakes_blocked_pop(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  blocked_pop b;
  b.q = &q;
  b.result = NULL;
  atomic_init(&b.returned, false);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, blocked_pop_main, &b), 0);
  while (queue_sleepers(&q) == 0) sched_yield();
  test_item it = {{NULL}, 0, 9};
  common_queue_push(&q, &it.node);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_ptr_equal(b.result, &it.node);
  common_queue_destroy(&q);
}

/* A chain goes in whole, behind what was there, in its own order; an empty chain is
 * nothing; two consumers blocked on the queue both wake for a chain of two. */
static void test_queue_push_chain_keeps_order_and_wakes_enough(void **state) {
  (void)state;
  common_queue q;
  common_queue_init(&q);
  test_item items[6];
  for (int i = 0; i < 6; i++) items[i].seq = i;
  common_queue_push(&q, &items[0].node);
  for (int i = 1; i < 4; i++) items[i].node.next = &items[i + 1].node;
  common_queue_push_chain(&q, &items[1].node, &items[4].node, 4);
  common_queue_push_chain(&q, NULL, NULL, 0);
  common_queue_push(&q, &items[5].node);
  assert_int_equal(atomic_load(&q.depth), 6);
  for (int i = 0; i < 6; i++) {
    test_item *it = (test_item *)common_queue_pop(&q, 0);
    assert_non_null(it);
    assert_int_equal(it->seq, i);
  }
  assert_int_equal(atomic_load(&q.depth), 0);

  blocked_pop b[2];
  pthread_t consumers[2];
  for (int i = 0; i < 2; i++) {
    b[i].q = &q;
    b[i].result = NULL;
    atomic_init(&b[i].returned, false);
    assert_int_equal(pthread_create(&consumers[i], NULL, blocked_pop_main, &b[i]), 0);
  }
  while (queue_sleepers(&q) < 2) sched_yield();
  items[0].node.next = &items[1].node;
  common_queue_push_chain(&q, &items[0].node, &items[1].node, 2);
  for (int i = 0; i < 5000 && !(atomic_load(&b[0].returned) && atomic_load(&b[1].returned)); i++) usleep(1000);
  bool both = atomic_load(&b[0].returned) && atomic_load(&b[1].returned);
  if (!both) common_queue_close(&q); /* frees a consumer that never woke, to fail, not hang */
  for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(consumers[i], NULL), 0);
  assert_true(both); /* both woke, within 5 s */
  assert_true(b[0].result != b[1].result && b[0].result && b[1].result);
  assert_int_equal(atomic_load(&q.depth), 0);
  common_queue_destroy(&q);
}

/* ---- events ----------------------------------------------------------------------------- */

typedef struct event_waiter {
  common_event *e;
  uint64_t spin_ns;
  const atomic_int *payload;
  atomic_bool started, done;
  int seen_payload;
} event_waiter;

static void *event_waiter_main(void *arg) {
  event_waiter *w = arg;
  atomic_store(&w->started, true);
  common_event_wait(w->e, w->spin_ns);
  w->seen_payload = atomic_load_explicit(w->payload, memory_order_relaxed);
  atomic_store(&w->done, true);
  return NULL;
}

static void test_event_set_releases_waiters(void **state) {
  (void)state;
  common_event e;
  common_event_init(&e);
  atomic_int payload;
  atomic_init(&payload, 0);
  event_waiter w[3];
  pthread_t th[3];
  const uint64_t spins[3] = {0, 1000, 200000};
  for (int i = 0; i < 3; i++) {
    w[i].e = &e;
    w[i].spin_ns = spins[i];
    w[i].payload = &payload;
    w[i].seen_payload = -1;
    atomic_init(&w[i].started, false);
    atomic_init(&w[i].done, false);
    assert_int_equal(pthread_create(&th[i], NULL, event_waiter_main, &w[i]), 0);
  }
  for (int i = 0; i < 3; i++)
    while (!atomic_load(&w[i].started)) sched_yield();
  /* Give the waiters every chance to return early if wait were broken. */
  for (int r = 0; r < 1000; r++) sched_yield();
  for (int i = 0; i < 3; i++) assert_false(atomic_load(&w[i].done));
  atomic_store_explicit(&payload, 42, memory_order_relaxed);
  common_event_set(&e);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_true(atomic_load(&w[i].done));
    assert_int_equal(w[i].seen_payload, 42);
  }
  common_event_destroy(&e);
}

static void test_event_wait_after_set_returns_at_once(void **state) {
  (void)state;
  common_event e;
  common_event_init(&e);
  assert_false(atomic_load(&e.set));
  common_event_set(&e);
  assert_true(atomic_load(&e.set));
  common_event_wait(&e, 0); /* would hang if it did not see the flag */
  common_event_wait(&e, 1000000);
  common_event_destroy(&e);
}

/* ---- allocator hook --------------------------------------------------------------------- */

static int reset_alloc_hook(void **state) {
  (void)state;
  flint_test_fail_alloc_after(-1);
  return 0;
}

static void test_fail_alloc_makes_reserve_enomem(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  flint_test_fail_alloc_after(0);
  assert_fails_with(fl_buf_reserve(&b, 16), FL_ENOMEM, "cannot allocate");
  flint_test_fail_alloc_after(-1);
  assert_null(b.data);
  assert_int_equal(b.len, 0);
  assert_int_equal(b.cap, 0);
  assert_ok(fl_buf_reserve(&b, 16));
  assert_non_null(b.data);
  fl_buf_free(&b);
}

static void test_fail_alloc_after_one_leaves_buffer_unchanged(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  flint_test_fail_alloc_after(1);
  assert_ok(fl_buf_append(&b, "hello", 5)); /* the one allocation that succeeds */
  uint8_t *data = b.data;
  size_t cap = b.cap;
  uint8_t big[4096] = {0};
  assert_int_equal(fl_buf_append(&b, big, sizeof big), FL_ENOMEM);
  flint_test_fail_alloc_after(-1);
  assert_ptr_equal(b.data, data);
  assert_int_equal(b.cap, cap);
  assert_int_equal(b.len, 5);
  assert_memory_equal(b.data, "hello", 5);
  /* Reset: allocations work again. */
  assert_ok(fl_buf_append(&b, big, sizeof big));
  assert_int_equal(b.len, 5 + sizeof big);
  fl_buf_free(&b);
}

static void test_fail_alloc_applies_to_common_malloc(void **state) {
  (void)state;
  flint_test_fail_alloc_after(2);
  void *a = common_malloc(8), *b = common_calloc(2, 8), *c = common_malloc(8);
  flint_test_fail_alloc_after(-1);
  assert_non_null(a);
  assert_non_null(b);
  assert_null(c);
  common_free(a);
  common_free(b);
  void *d = common_strdup("x");
  assert_non_null(d);
  common_free(d);
}

/* ---- symbols ---------------------------------------------------------------------------- */

/* Exported (the test program is linked with -rdynamic), so dladdr can name it. */
void test_common_exported_function(void);
void test_common_exported_function(void) {}

static void local_static_function(void) {}

static void test_symbol_name_of_exported_function(void **state) {
  (void)state;
  char buf[128];
  const char *name = common_symbol_name((const void *)(uintptr_t)test_common_exported_function, buf, sizeof buf);
  assert_ptr_equal(name, buf);
  assert_string_equal(name, "test_common_exported_function");
}

static void test_symbol_name_of_static_function_is_library_offset(void **state) {
  (void)state;
  char buf[256];
  const void *fn = (const void *)(uintptr_t)local_static_function;
  common_symbol_name(fn, buf, sizeof buf);
  /* Not exported: named by its object and offset (addr2line-able), with a hint. */
  assert_non_null(strstr(buf, "test_common+0x"));
  assert_non_null(strstr(buf, "not exported"));
}

static void test_symbol_name_of_random_pointer_is_address(void **state) {
  (void)state;
  char buf[128];
  const void *p = (const void *)(uintptr_t)0x1234;
  common_symbol_name(p, buf, sizeof buf);
  assert_string_equal(buf, "0x1234");
  /* An address inside a function (not its start) is not named after it either. */
  const void *inside = (const void *)((uintptr_t)test_common_exported_function + 1);
  common_symbol_name(inside, buf, sizeof buf);
  assert_null(strstr(buf, "test_common_exported_function"));
  assert_non_null(strstr(buf, "+0x"));
}

static void test_symbol_name_truncates_to_buffer(void **state) {
  (void)state;
  char buf[8];
  memset(buf, 'z', sizeof buf);
  common_symbol_name((const void *)(uintptr_t)test_common_exported_function, buf, sizeof buf);
  assert_string_equal(buf, "test_co");
}

/* common_buf_printf appends, grows the buffer past any size, and keeps a NUL after. */
static void test_buf_printf(void **state) {
  (void)state;
  fl_buf b = FL_BUF_INIT;
  assert_int_equal(common_buf_printf(&b, "%s=%d", "a", 1), FL_OK);
  assert_int_equal(b.len, 3);
  assert_string_equal((const char *)b.data, "a=1");
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  assert_int_equal(common_buf_printf(&b, ",%s", big), FL_OK);
  assert_int_equal(b.len, 3 + 1 + sizeof big - 1);
  assert_int_equal(strlen((const char *)b.data), b.len);
  assert_int_equal(common_buf_printf(&b, "%s", ""), FL_OK);
  assert_int_equal(b.len, 3 + sizeof big);
  fl_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_strerror_matches_table_for_every_code),
      cmocka_unit_test(test_status_name_matches_table_for_every_code),
      cmocka_unit_test(test_unknown_status_has_text_and_name),
      cmocka_unit_test(test_set_error_formats_and_returns_status),
      cmocka_unit_test(test_set_error_truncates_long_message),
      cmocka_unit_test(test_error_clear_and_wrap),
      cmocka_unit_test(test_last_error_is_thread_local),
      cmocka_unit_test(test_buf_reserve_on_empty_allocates),
      cmocka_unit_test(test_buf_append_grows_geometrically_and_keeps_bytes),
      cmocka_unit_test(test_buf_append_large_chunk),
      cmocka_unit_test(test_buf_null_is_einval),
      cmocka_unit_test(test_buf_reserve_overflow_is_elimit),
      cmocka_unit_test(test_pair_round_trip_with_zero_bytes),
      cmocka_unit_test(test_pair_round_trip_empty_key_and_value),
      cmocka_unit_test(test_pair_round_trip_100k_key),
      cmocka_unit_test(test_pairs_append_one_after_another),
      cmocka_unit_test(test_pair_truncated_varint_is_eformat),
      cmocka_unit_test(test_pair_key_longer_than_record_is_eformat),
      cmocka_unit_test(test_pair_null_outputs_are_einval),
      cmocka_unit_test(test_varint_round_trip),
      cmocka_unit_test(test_varint_known_encoding),
      cmocka_unit_test(test_varint_truncated_returns_zero),
      cmocka_unit_test(test_rng_same_seed_same_stream),
      cmocka_unit_test(test_rng_different_seeds_differ),
      cmocka_unit_test(test_rng_uniform_in_unit_interval),
      cmocka_unit_test(test_rng_poisson_mean_half),
      cmocka_unit_test(test_rng_poisson_mean_3),
      cmocka_unit_test(test_rng_poisson_mean_50),
      cmocka_unit_test(test_rng_poisson_variance_equals_mean),
      cmocka_unit_test(test_rng_poisson_nonpositive_mean_is_zero),
      cmocka_unit_test(test_parse_size_accepts_units),
      cmocka_unit_test(test_parse_size_rejects_bad_input),
      cmocka_unit_test(test_parse_size_rejects_negative_after_whitespace),
      cmocka_unit_test(test_queue_single_thread_fifo_and_depth),
      cmocka_unit_test(test_queue_push_chain_keeps_order_and_wakes_enough),
      cmocka_unit_test(test_queue_many_producers_one_consumer),
      cmocka_unit_test(test_queue_many_consumers_share_one_spinner),
      cmocka_unit_test(test_queue_close_returns_remaining_items_then_null),
      cmocka_unit_test(test_queue_close_wakes_blocked_pop),
      cmocka_unit_test(test_queue_push_wakes_blocked_pop),
      cmocka_unit_test(test_event_set_releases_waiters),
      cmocka_unit_test(test_event_wait_after_set_returns_at_once),
      cmocka_unit_test_teardown(test_fail_alloc_makes_reserve_enomem, reset_alloc_hook),
      cmocka_unit_test_teardown(test_fail_alloc_after_one_leaves_buffer_unchanged, reset_alloc_hook),
      cmocka_unit_test_teardown(test_fail_alloc_applies_to_common_malloc, reset_alloc_hook),
      cmocka_unit_test(test_symbol_name_of_exported_function),
      cmocka_unit_test(test_symbol_name_of_static_function_is_library_offset),
      cmocka_unit_test(test_symbol_name_of_random_pointer_is_address),
      cmocka_unit_test(test_symbol_name_truncates_to_buffer),
      cmocka_unit_test(test_buf_printf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
