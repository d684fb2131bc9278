/*
 * bench_shuffle: two measurements of flint's shuffle, through the public API only.
 *
 *   bench_shuffle [--json] [--records N] [--sort-mb B]
 *
 * 1. reduce_by_key_50M: aggregation through a shuffle. --records pairs (default 50,000,000)
 *    are made from fl_range(0, N) (default partitions, i.e. one per task thread) by a map
 *    that gives record i the key splitmix64(i) % 1,000,000 (a uint64, as 8 bytes) and the
 *    value i (int64), and fl_reduce_by_key sums the values per key (wrapping int64 add,
 *    combined map-side, then shuffled to as many reduce partitions as map partitions) in
 *    local[2] with the default shuffle memory. The result is read by one fl_aggregate that
 *    computes the number of keys, the sum of all the sums and a checksum (the wrapping sum
 *    over keys of digest(key, sum)). The baseline, in the same process and run, is what a
 *    programmer would write without an engine: one thread making the same pairs with the
 *    same function and summing them in an open-addressing hash table (linear probing,
 *    2^21 slots for the 1M keys), then walking the table for the same three figures. Both
 *    timings cover everything from the first record to the three figures (the engine's
 *    includes building the datasets, but not opening the context). Each side runs 3 times,
 *    alternating, and the best time of each is reported (each engine run builds fresh
 *    datasets, so no shuffle output of an earlier run is reused). The figures of both
 *    sides must be equal in every run, and the sum must be N(N-1)/2 (wrapping): if not,
 *    the benchmark fails (exit 1). Reported: records/s of both, the ratio engine/plain
 *    (target >= 0.5: two threads keep at least half of one plain core's speed), and the
 *    bytes shuffled: the total size of the shuffle_*.data files in the context's work
 *    folder (fl_options.work_dir is set to a fresh temporary folder), read after the first
 *    run's job and before its result is freed (freeing it deletes them). Map-side combining
 *    leaves each map task one pair per distinct key it saw, so far fewer than N pairs are
 *    shuffled: pairs_shuffled is derived, outside the timings, by one more job over the
 *    same pairs that counts the distinct keys of each map partition (a bitmap per
 *    partition). Two ratios are given: input_ratio = input_bytes / shuffled_bytes, with
 *    input_bytes = 16 * N (the raw pairs: what the shuffle would move with neither
 *    combining nor compression), and codec_ratio = 16 * pairs_shuffled / shuffled_bytes,
 *    the compression of what is actually written (the files also hold each pair's length
 *    prefixes, 2 bytes a pair here, and each chunk's header, so without compression the
 *    ratio would be about 16/18).
 *
 * 2. sort_by_key_4x: an external sort of four times its memory budget. The context (local[2],
 *    so two tasks run at once) has fl_options.shuffle_memory = B (--sort-mb, default 32 MiB
 *    per task), so the run's budget is 2 * B. 8 * B bytes of pairs (8-byte key: splitmix64(i)
 *    big-endian, so bytewise order is numeric order; 56-byte value: i, then 48 bytes of
 *    hash, i.e. incompressible) are made by fl_range + fl_map (not cached: the engine makes
 *    them again for each job), sorted by fl_sort_by_key into 2 partitions (its range
 *    partitioner first runs a count and a sampling job) and consumed by fl_count: that is
 *    the timed part. Then a check job (fl_map_partitions + fl_collect, reading the sorted
 *    dataset again) verifies, per partition, that the keys never decrease, that every
 *    value belongs to its key (value i has key splitmix64(i)), the first and last keys,
 *    the count and the wrapping sum of the keys; across partitions, that each partition's
 *    last key is <= the next one's first key; overall, that the count and key sum equal
 *    those of the generator (computed by a plain loop). Any failure is exit 1. The row runs
 *    first, in a forked child (before the parent has touched much memory), so that the
 *    child's peak resident memory (getrusage RUSAGE_SELF ru_maxrss: a high-water mark of
 *    the pages mapped in the child, which after fork starts from the few the child holds
 *    privately; pages of the binary and the libraries count once the child touches them)
 *    measures this row alone. Reported: dataset bytes (64 * records), budget (2 * B), the
 *    baseline RSS (the child's peak after opening the context and running one tiny job, so
 *    that the code it runs, the task threads and their stacks are in), the peak RSS over
 *    the whole row (sort and check), the fixed overhead = peak - budget, and whether
 *    peak <= baseline + budget + allowance, where the allowance is ALLOWANCE_PER_TASK_MIB
 *    (16 MiB) per task thread, stated before the run, for what a task holds besides its
 *    sorter's entries: the sorter's index and table grow by doubling and its sort may take
 *    a temporary copy of the index (glibc's qsort_r merge sort); a run being written, a
 *    shuffle block being written and a block being read each hold a raw chunk (up to
 *    1 MiB) and its LZ4 frame; the final merge holds one decoded chunk per spilled run
 *    (about 5 runs of B for a map task of 4 * B bytes); plus the records in flight (256 per
 *    iterator batch) and the C library's heap slack. Target: peak <= baseline + budget +
 *    allowance; the figures themselves are printed, so the overhead can be read without
 *    the allowance. (The range partitioner samples 60 keys per output partition, so the two
 *    partitions can differ in size by tens of percent; their counts are printed.)
 *
 * Output: a table on stdout, or with --json one JSON object per row (the same figures) and
 * nothing else on stdout. Exit status: 0 when both rows ran and their results are right (a
 * missed target is reported, not an error); 1 on an engine error or a wrong result; 2 on a
 * bad option.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flint/flint.h"
#include "splitmix.h"

#define BENCH_NAME "bench_shuffle"
#include "bench_util.h"

#define MASTER "local[2]"
#define TASK_THREADS 2
#define RBK_KEYS 1000000u
#define RBK_TABLE_BITS 21
#define RBK_TARGET_RATIO 0.5
#define RBK_RUNS 3 /* each side, alternating; the best time of each is reported */
#define SORT_KEY_LEN 8
#define SORT_VALUE_LEN 56
#define SORT_RECORD_LEN (SORT_KEY_LEN + SORT_VALUE_LEN)
#define SORT_PARTITIONS 2
#define SORT_FACTOR 4 /* dataset = SORT_FACTOR x the run's budget */
#define ALLOWANCE_PER_TASK_MIB 16
#define MIB (1024.0 * 1024.0)

typedef struct options {
  bool json;
  uint64_t records;
  uint64_t sort_mb;
} options;

/* ---- work folders ---------------------------------------------------------------------- */

/* A fresh folder for a context's work_dir (the context makes its own folder inside). */
static char *make_temp_dir(void) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  char path[4096];
  snprintf(path, sizeof path, "%s/bench_shuffle-XXXXXX", base);
  if (!mkdtemp(path)) {
    fprintf(stderr, "bench_shuffle: cannot create a folder in %s: %s\n", base, strerror(errno));
    return NULL;
  }
  return strdup(path);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void remove_temp_dir(char *dir) {
  if (!dir) return;
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

/* Total size and number of the files named shuffle_*.data anywhere under dir. */
static uint64_t shuffle_bytes_total, shuffle_files_total;
static int add_shuffle_file(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  const char *name = path + ftw->base;
  size_t n = strlen(name);
  if (flag == FTW_F && strncmp(name, "shuffle_", 8) == 0 && n > 13 && strcmp(name + n - 5, ".data") == 0) {
    shuffle_bytes_total += (uint64_t)sb->st_size;
    shuffle_files_total++;
  }
  return 0;
}

static void shuffle_files(const char *dir, uint64_t *bytes, uint64_t *files) {
  shuffle_bytes_total = shuffle_files_total = 0;
  nftw(dir, add_shuffle_file, 16, FTW_PHYS);
  *bytes = shuffle_bytes_total;
  *files = shuffle_files_total;
}

/* ---- reduce_by_key_50M ----------------------------------------------------------------- */

static inline uint64_t rbk_key(uint64_t i) { return splitmix(i) % RBK_KEYS; }

/* What the checksum adds up for one key and its sum. */
static inline uint64_t digest(uint64_t key, uint64_t sum) {
  return splitmix(key * 0xd6e8feb86659fd93u ^ sum);
}

typedef struct rbk_figures {
  uint64_t keys, sum, checksum;
} rbk_figures;

static fl_status rbk_make_pair(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t i = fl_i64(rec);
  uint64_t key = rbk_key((uint64_t)i);
  return fl_buf_put_pair(out, fl_bytes_of(&key, 8), fl_bytes_of(&i, 8));
}

static fl_status rbk_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

/* aggregate: figures += one (key, sum) pair. */
static fl_status rbk_fold(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  rbk_figures f;
  fl_bytes key, value;
  fl_status s = fl_pair(rec, &key, &value);
  if (s != FL_OK) return s;
  if (key.len != 8 || value.len != 8)
    return fl_set_error(FL_EFORMAT, "result pair of %zu + %zu bytes, expected 8 + 8", key.len, value.len);
  memcpy(&f, acc.data, sizeof f);
  uint64_t k = (uint64_t)fl_i64(key), v = (uint64_t)fl_i64(value);
  f.keys++;
  f.sum += v;
  f.checksum += digest(k, v);
  return fl_buf_append(out, &f, sizeof f);
}

static fl_status rbk_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  rbk_figures x, y;
  memcpy(&x, a.data, sizeof x);
  memcpy(&y, b.data, sizeof y);
  x.keys += y.keys;
  x.sum += y.sum;
  x.checksum += y.checksum;
  return fl_buf_append(out, &x, sizeof x);
}

/* map_partitions: the number of distinct keys of a map partition (what its map-side
 * combine leaves to shuffle), as one uint64 record. */
static fl_status rbk_distinct_keys(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition, (void)arg;
  uint64_t *bits = calloc(RBK_KEYS / 64 + 1, sizeof *bits), distinct = 0;
  if (!bits) return fl_set_error(FL_ENOMEM, "no memory for a bitmap of %u keys", RBK_KEYS);
  fl_bytes rec, key, value;
  while (fl_iter_next(in, &rec)) {
    fl_status s = fl_pair(rec, &key, &value);
    if (s != FL_OK) {
      free(bits);
      return s;
    }
    uint64_t k = (uint64_t)fl_i64(key);
    if (k >= RBK_KEYS) continue;
    uint64_t m = 1ull << (k % 64);
    if (!(bits[k / 64] & m)) {
      bits[k / 64] |= m;
      distinct++;
    }
  }
  free(bits);
  return fl_emit(out, &distinct, sizeof distinct);
}

typedef struct rbk_slot {
  uint64_t key_plus_1; /* 0: empty */
  uint64_t sum;
} rbk_slot;

/* The baseline: one thread, the same pairs, an open-addressing table. */
__attribute__((noinline)) static int plain_aggregate(uint64_t n, rbk_figures *out) {
  const size_t slots = (size_t)1 << RBK_TABLE_BITS;
  rbk_slot *table = calloc(slots, sizeof *table);
  if (!table) {
    fprintf(stderr, "bench_shuffle: out of memory for the plain table\n");
    return 1;
  }
  volatile uint64_t bound = n;
  uint64_t end = bound;
  for (uint64_t i = 0; i < end; i++) {
    uint64_t key = rbk_key(i);
    size_t h = (size_t)((key * 0x9e3779b97f4a7c15u) >> (64 - RBK_TABLE_BITS));
    while (table[h].key_plus_1 != 0 && table[h].key_plus_1 != key + 1) h = (h + 1) & (slots - 1);
    table[h].key_plus_1 = key + 1;
    table[h].sum += i;
  }
  rbk_figures f = {0, 0, 0};
  for (size_t h = 0; h < slots; h++) {
    if (!table[h].key_plus_1) continue;
    f.keys++;
    f.sum += table[h].sum;
    f.checksum += digest(table[h].key_plus_1 - 1, table[h].sum);
  }
  free(table);
  *out = f;
  return 0;
}

typedef struct rbk_result {
  uint64_t records;
  int runs;
  uint32_t map_partitions, reduce_partitions;
  uint64_t shuffle_memory;
  double engine_s, plain_s, engine_rps, plain_rps, ratio;
  rbk_figures engine, plain;
  uint64_t expected_sum;
  bool equal;
  uint64_t shuffled_bytes, shuffle_files, pairs_shuffled, input_bytes;
  double input_ratio, codec_ratio;
  bool met;
} rbk_result;

/* One engine run: fresh datasets (so no shuffle output of an earlier run is reused), the
 * three figures, and (when dir is given) the shuffle files' size, read before the result is
 * freed. */
static int engine_run(fl_context *ctx, uint64_t n, const char *dir, rbk_figures *out, double *secs,
                      rbk_result *res) {
  fl_dataset *range = NULL, *pairs = NULL, *sums = NULL;
  fl_buf figures = FL_BUF_INIT;
  rbk_figures zero = {0, 0, 0};
  int rc = 1;
  double t0 = now_s();
  if (fl_range(ctx, 0, (int64_t)n, 1, 0, &range) != FL_OK ||
      fl_map(range, rbk_make_pair, NULL, 0, &pairs) != FL_OK ||
      fl_reduce_by_key(pairs, rbk_add, NULL, 0, NULL, 0, &sums) != FL_OK ||
      fl_aggregate(sums, fl_bytes_of(&zero, sizeof zero), rbk_fold, rbk_merge, NULL, 0, &figures) != FL_OK) {
    fail_flint("reduce_by_key (fl_range/fl_map/fl_reduce_by_key/fl_aggregate)");
    goto done;
  }
  *secs = now_s() - t0;
  if (figures.len != sizeof *out) {
    fprintf(stderr, "bench_shuffle: aggregate returned %zu bytes, expected %zu\n", figures.len, sizeof *out);
    goto done;
  }
  memcpy(out, figures.data, sizeof *out);
  if (dir) {
    shuffle_files(dir, &res->shuffled_bytes, &res->shuffle_files);
    res->map_partitions = fl_dataset_partitions(pairs);
    res->reduce_partitions = fl_dataset_partitions(sums);
  }
  rc = 0;
done:
  fl_buf_free(&figures);
  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_dataset_free(range);
  return rc;
}

static bool figures_equal(const rbk_figures *a, const rbk_figures *b) {
  return a->keys == b->keys && a->sum == b->sum && a->checksum == b->checksum;
}

static int bench_reduce_by_key(const options *o, rbk_result *res) {
  char *dir = make_temp_dir();
  if (!dir) return 1;
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = dir;
  fl_context *ctx = NULL;
  fl_dataset *range = NULL, *pairs = NULL, *distinct = NULL;
  fl_records *per_map = NULL;
  int rc = 1;
  memset(res, 0, sizeof *res);
  res->records = o->records;
  res->runs = RBK_RUNS;
  res->engine_s = res->plain_s = 1e300;
  res->equal = true;
  if (fl_context_open(MASTER, &opts, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    goto done;
  }
  uint64_t n = o->records;
  res->expected_sum = n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2); /* wrapping */
  for (int run = 0; run < RBK_RUNS; run++) {
    rbk_figures e, p;
    double es, ps;
    if (engine_run(ctx, n, run == 0 ? dir : NULL, &e, &es, res) != 0) goto done;
    double t0 = now_s();
    if (plain_aggregate(n, &p) != 0) goto done;
    ps = now_s() - t0;
    if (es < res->engine_s) res->engine_s = es;
    if (ps < res->plain_s) res->plain_s = ps;
    if (run > 0 && (!figures_equal(&e, &res->engine) || !figures_equal(&p, &res->plain))) res->equal = false;
    res->engine = e;
    res->plain = p;
    if (!figures_equal(&e, &p) || e.sum != res->expected_sum) res->equal = false;
  }

  /* Outside the timings: the pairs each map task's combine leaves to shuffle. */
  if (fl_range(ctx, 0, (int64_t)n, 1, 0, &range) != FL_OK ||
      fl_map(range, rbk_make_pair, NULL, 0, &pairs) != FL_OK ||
      fl_map_partitions(pairs, rbk_distinct_keys, NULL, 0, &distinct) != FL_OK ||
      fl_collect(distinct, &per_map) != FL_OK) {
    fail_flint("the distinct-keys job (fl_map_partitions/fl_collect)");
    goto done;
  }
  for (size_t i = 0; i < fl_records_count(per_map); i++)
    res->pairs_shuffled += (uint64_t)fl_i64(fl_records_get(per_map, i));

  const char *env = getenv("FLINT_SHUFFLE_MEMORY");
  res->shuffle_memory = 64ull << 20;
  if (env && *env) fl_parse_size(env, &res->shuffle_memory);
  res->engine_rps = (double)n / res->engine_s;
  res->plain_rps = (double)n / res->plain_s;
  res->ratio = res->engine_rps / res->plain_rps;
  res->input_bytes = 16 * n;
  res->input_ratio = res->shuffled_bytes ? (double)res->input_bytes / (double)res->shuffled_bytes : 0;
  res->codec_ratio = res->shuffled_bytes ? 16.0 * (double)res->pairs_shuffled / (double)res->shuffled_bytes : 0;
  res->met = res->ratio >= RBK_TARGET_RATIO;
  rc = 0;
done:
  fl_records_free(per_map);
  fl_dataset_free(distinct);
  fl_dataset_free(pairs);
  fl_dataset_free(range);
  fl_context_close(ctx);
  remove_temp_dir(dir);
  return rc;
}

/* ---- sort_by_key_4x -------------------------------------------------------------------- */

static inline void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static inline uint64_t get_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

static inline uint64_t sort_key(uint64_t i) { return splitmix(i); }

/* i -> (big-endian splitmix64(i), [i][48 bytes of hash of i]). */
static fl_status sort_make_pair(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  uint64_t i = (uint64_t)fl_i64(rec);
  uint8_t key[SORT_KEY_LEN];
  uint64_t value[SORT_VALUE_LEN / 8];
  put_be64(key, sort_key(i));
  value[0] = i;
  for (int j = 1; j < SORT_VALUE_LEN / 8; j++) value[j] = splitmix(i * 8 + (uint64_t)j);
  return fl_buf_put_pair(out, fl_bytes_of(key, sizeof key), fl_bytes_of(value, sizeof value));
}

/* What the check job finds in one sorted partition. */
typedef struct sort_part_check {
  uint32_t partition;
  uint32_t sorted;     /* 1 when keys never decrease */
  uint64_t count;
  uint64_t first, last; /* keys, when count > 0 */
  uint64_t key_sum;     /* wrapping */
  uint64_t bad_pairs;   /* values that do not belong to their key, or malformed pairs */
} sort_part_check;

static fl_status sort_check_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)arg;
  sort_part_check c = {partition, 1, 0, 0, 0, 0, 0};
  fl_bytes rec, key, value;
  while (fl_iter_next(in, &rec)) {
    if (fl_pair(rec, &key, &value) != FL_OK || key.len != SORT_KEY_LEN || value.len != SORT_VALUE_LEN) {
      c.bad_pairs++;
      continue;
    }
    uint64_t k = get_be64(key.data), i;
    memcpy(&i, value.data, 8);
    if (sort_key(i) != k) c.bad_pairs++;
    if (c.count == 0) c.first = k;
    else if (k < c.last) c.sorted = 0;
    c.last = k;
    c.key_sum += k;
    c.count++;
  }
  return fl_emit(out, &c, sizeof c);
}

typedef struct sort_result {
  int ran;           /* 1: the sort and the check job completed */
  int ok;            /* 1: ran and verified */
  uint64_t records, dataset_bytes, budget_bytes, per_task_budget;
  uint32_t partitions;
  double sort_s, check_s;
  uint64_t counted, checked, key_sum, expected_key_sum, bad_pairs;
  uint32_t unsorted_partitions, boundary_violations;
  uint64_t part_counts[SORT_PARTITIONS];
  uint64_t shuffled_bytes;
  long baseline_kib, peak_kib;
  double overhead_mib, allowance_mib, bound_mib;
  bool met;
} sort_result;

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss; /* KiB on Linux */
}

/* Runs in the forked child: fills *res; returns 0 when it ran and verified. */
static int sort_child(const options *o, sort_result *res) {
  memset(res, 0, sizeof *res);
  res->per_task_budget = o->sort_mb << 20;
  res->budget_bytes = res->per_task_budget * TASK_THREADS;
  res->records = SORT_FACTOR * res->budget_bytes / SORT_RECORD_LEN;
  res->dataset_bytes = res->records * SORT_RECORD_LEN;
  res->partitions = SORT_PARTITIONS;
  res->allowance_mib = (double)ALLOWANCE_PER_TASK_MIB * TASK_THREADS;
  char *dir = make_temp_dir();
  if (!dir) return 1;
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = dir;
  opts.shuffle_memory = res->per_task_budget;
  fl_context *ctx = NULL;
  fl_dataset *warm = NULL, *range = NULL, *pairs = NULL, *sorted = NULL, *checks = NULL;
  fl_records *parts = NULL;
  int rc = 1;
  uint64_t n;
  if (fl_context_open(MASTER, &opts, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    goto done;
  }
  if (fl_range(ctx, 0, 1000, 1, 0, &warm) != FL_OK || fl_count(warm, &n) != FL_OK) {
    fail_flint("the warm-up count");
    goto done;
  }
  res->baseline_kib = max_rss_kib();

  double t0 = now_s();
  if (fl_range(ctx, 0, (int64_t)res->records, 1, 0, &range) != FL_OK ||
      fl_map(range, sort_make_pair, NULL, 0, &pairs) != FL_OK ||
      fl_sort_by_key(pairs, true, NULL, NULL, 0, SORT_PARTITIONS, &sorted) != FL_OK ||
      fl_count(sorted, &res->counted) != FL_OK) {
    fail_flint("sort (fl_range/fl_map/fl_sort_by_key/fl_count)");
    goto done;
  }
  double t1 = now_s();
  uint64_t files;
  shuffle_files(dir, &res->shuffled_bytes, &files);
  if (fl_map_partitions(sorted, sort_check_partition, NULL, 0, &checks) != FL_OK ||
      fl_collect(checks, &parts) != FL_OK) {
    fail_flint("the check job (fl_map_partitions/fl_collect)");
    goto done;
  }
  double t2 = now_s();
  res->peak_kib = max_rss_kib();
  res->ran = 1;
  res->sort_s = t1 - t0;
  res->check_s = t2 - t1;

  /* The generator's figures, by a plain loop. */
  for (uint64_t i = 0; i < res->records; i++) res->expected_key_sum += sort_key(i);
  bool have_last = false;
  uint64_t last = 0;
  size_t np = fl_records_count(parts);
  for (size_t j = 0; j < np; j++) {
    fl_bytes r = fl_records_get(parts, j);
    sort_part_check c;
    if (r.len != sizeof c) {
      fprintf(stderr, "bench_shuffle: check record of %zu bytes\n", r.len);
      goto done;
    }
    memcpy(&c, r.data, sizeof c);
    if (c.partition != j) {
      fprintf(stderr, "bench_shuffle: check record %zu is for partition %u\n", j, c.partition);
      goto done;
    }
    if (j < SORT_PARTITIONS) res->part_counts[j] = c.count;
    res->checked += c.count;
    res->key_sum += c.key_sum;
    res->bad_pairs += c.bad_pairs;
    if (!c.sorted) res->unsorted_partitions++;
    if (c.count > 0) {
      if (have_last && c.first < last) res->boundary_violations++;
      last = c.last;
      have_last = true;
    }
  }
  res->overhead_mib = ((double)res->peak_kib * 1024.0 - (double)res->budget_bytes) / MIB;
  res->bound_mib = (double)res->baseline_kib / 1024.0 + (double)res->budget_bytes / MIB + res->allowance_mib;
  res->met = (double)res->peak_kib / 1024.0 <= res->bound_mib;
  res->ok = np == SORT_PARTITIONS && res->counted == res->records && res->checked == res->records &&
            res->key_sum == res->expected_key_sum && res->bad_pairs == 0 &&
            res->unsorted_partitions == 0 && res->boundary_violations == 0;
  if (!res->ok)
    fprintf(stderr,
            "bench_shuffle: sort_by_key_4x is wrong: %zu partitions, count %" PRIu64 ", checked %" PRIu64
            " of %" PRIu64 ", key sum %" PRIu64 " (expected %" PRIu64 "), %" PRIu64
            " bad pairs, %u unsorted partitions, %u boundary violations\n",
            np, res->counted, res->checked, res->records, res->key_sum, res->expected_key_sum,
            res->bad_pairs, res->unsorted_partitions, res->boundary_violations);
  rc = res->ok ? 0 : 1;
done:
  fl_records_free(parts);
  fl_dataset_free(checks);
  fl_dataset_free(sorted);
  fl_dataset_free(pairs);
  fl_dataset_free(range);
  fl_dataset_free(warm);
  fl_context_close(ctx);
  remove_temp_dir(dir);
  return rc;
}

/* Runs sort_child in a fresh child process and reads its result through a pipe. */
static int bench_sort(const options *o, sort_result *res) {
  int fds[2];
  if (pipe(fds) != 0) {
    fprintf(stderr, "bench_shuffle: pipe: %s\n", strerror(errno));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "bench_shuffle: fork: %s\n", strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(fds[0]);
    sort_result r;
    int rc = sort_child(o, &r);
    const uint8_t *p = (const uint8_t *)&r;
    size_t left = sizeof r;
    while (left > 0) {
      ssize_t w = write(fds[1], p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) _exit(1);
      p += w;
      left -= (size_t)w;
    }
    close(fds[1]);
    fflush(stderr);
    _exit(rc);
  }
  close(fds[1]);
  uint8_t *p = (uint8_t *)res;
  size_t got = 0;
  while (got < sizeof *res) {
    ssize_t r = read(fds[0], p + got, sizeof *res - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (got != sizeof *res || !WIFEXITED(status)) {
    memset(res, 0, sizeof *res);
    fprintf(stderr, "bench_shuffle: the sort child ended without a result (status %d)\n", status);
    return 1;
  }
  return WEXITSTATUS(status) == 0 && res->ok ? 0 : 1;
}

/* ---- output ---------------------------------------------------------------------------- */

#define BENCH_COLUMN 18

static const bench_columns columns = {BENCH_COLUMN, 26, 22, 20};

static void print_row(const char *bench, const char *metric, const char *value, const char *target,
                      const char *met) {
  bench_print_row(&columns, bench, metric, value, target, met);
}

static void print_header(const options *o) {
  printf("flint bench_shuffle (flint %s, master %s)\n", FL_VERSION_STRING, MASTER);
  printf("  sort_by_key_4x: %d x (2 tasks x %" PRIu64 " MiB shuffle memory) of 64-byte pairs, sorted into "
         "%d partitions and counted, in a forked child; peak RSS vs baseline + budget + %d MiB/task\n",
         SORT_FACTOR, o->sort_mb, SORT_PARTITIONS, ALLOWANCE_PER_TASK_MIB);
  printf("  reduce_by_key_50M: %" PRIu64 " (8-byte key, 8-byte value) pairs, %u keys, summed per key vs "
         "a plain C hash table on one core; best of %d runs each\n\n",
         o->records, RBK_KEYS, RBK_RUNS);
  printf("%-*s %-26s %22s  %-20s %s\n", BENCH_COLUMN, "bench", "metric", "value", "target", "met");
  printf("%-*s %-26s %22s  %-20s %s\n", BENCH_COLUMN, "------------------", "--------------------------",
         "----------------------", "--------------------", "---");
}

static void print_sort(const options *o, const sort_result *r) {
  if (o->json) {
    printf("{\"bench\": \"sort_by_key_4x\", \"master\": \"%s\", \"records\": %" PRIu64
           ", \"record_bytes\": %d, \"dataset_bytes\": %" PRIu64 ", \"shuffle_memory_per_task\": %" PRIu64
           ", \"budget_bytes\": %" PRIu64 ", \"partitions\": %u, \"partition_counts\": [%" PRIu64 ", %" PRIu64
           "], \"sort_s\": %.3f, \"check_s\": %.3f, \"records_per_s\": %.0f, \"shuffled_bytes\": %" PRIu64
           ", \"baseline_rss_bytes\": %" PRIu64 ", \"peak_rss_bytes\": %" PRIu64
           ", \"overhead_bytes\": %" PRId64 ", \"allowance_bytes\": %" PRIu64 ", \"bound_bytes\": %" PRIu64
           ", \"verified\": %s, \"target\": \"peak_rss <= baseline_rss + budget + %d MiB x %d tasks\", "
           "\"met\": %s}\n",
           MASTER, r->records, SORT_RECORD_LEN, r->dataset_bytes, r->per_task_budget, r->budget_bytes,
           r->partitions, r->part_counts[0], r->part_counts[1], r->sort_s, r->check_s,
           (double)r->records / r->sort_s, r->shuffled_bytes, (uint64_t)r->baseline_kib * 1024,
           (uint64_t)r->peak_kib * 1024, (int64_t)r->peak_kib * 1024 - (int64_t)r->budget_bytes,
           (uint64_t)(r->allowance_mib * MIB), (uint64_t)(r->bound_mib * MIB), r->ok ? "true" : "false",
           ALLOWANCE_PER_TASK_MIB, TASK_THREADS, r->met ? "true" : "false");
    return;
  }
  char v[64], t[64];
  const char *b = "sort_by_key_4x";
  snprintf(v, sizeof v, "%" PRIu64, r->records);
  print_row(b, "records", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->dataset_bytes / MIB);
  print_row("", "dataset_bytes", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->budget_bytes / MIB);
  print_row("", "budget (2 tasks)", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->sort_s);
  print_row("", "sort_s (sort + count)", v, "", "");
  snprintf(v, sizeof v, "%.0f", (double)r->records / r->sort_s);
  print_row("", "records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->check_s);
  print_row("", "check_s", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->shuffled_bytes / MIB);
  print_row("", "shuffled_bytes", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->baseline_kib / 1024.0);
  print_row("", "baseline_rss", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->peak_kib / 1024.0);
  snprintf(t, sizeof t, "<= %.1f MiB", r->bound_mib);
  print_row("", "peak_rss", v, t, r->met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.1f MiB", r->overhead_mib);
  print_row("", "overhead (peak - budget)", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", r->allowance_mib);
  print_row("", "allowance (stated)", v, "", "");
  snprintf(v, sizeof v, "%" PRIu64 " + %" PRIu64, r->part_counts[0], r->part_counts[1]);
  print_row("", "partition_counts", v, "", "");
  print_row("", "verified", r->ok ? "yes" : "NO", "", "");
}

static void print_rbk(const options *o, const rbk_result *r) {
  if (o->json) {
    printf("{\"bench\": \"reduce_by_key_50M\", \"master\": \"%s\", \"records\": %" PRIu64 ", \"keys\": %u"
           ", \"map_partitions\": %u, \"reduce_partitions\": %u, \"shuffle_memory_per_task\": %" PRIu64
           ", \"runs\": %d, \"engine_best_s\": %.3f, \"plain_best_s\": %.3f, \"engine_records_per_s\": %.0f"
           ", \"plain_records_per_s\": %.0f, \"ratio\": %.3f, \"engine_keys\": %" PRIu64
           ", \"plain_keys\": %" PRIu64 ", \"engine_sum\": %" PRIu64 ", \"plain_sum\": %" PRIu64
           ", \"expected_sum\": %" PRIu64 ", \"engine_checksum\": %" PRIu64 ", \"plain_checksum\": %" PRIu64
           ", \"results_equal\": %s, \"input_bytes\": %" PRIu64 ", \"shuffled_bytes\": %" PRIu64
           ", \"shuffle_files\": %" PRIu64 ", \"pairs_shuffled\": %" PRIu64
           ", \"input_ratio\": %.2f, \"codec_ratio\": %.3f, \"target\": \"ratio >= %.1f\", \"met\": %s}\n",
           MASTER, r->records, RBK_KEYS, r->map_partitions, r->reduce_partitions, r->shuffle_memory,
           r->runs, r->engine_s, r->plain_s, r->engine_rps, r->plain_rps, r->ratio, r->engine.keys, r->plain.keys,
           r->engine.sum, r->plain.sum, r->expected_sum, r->engine.checksum, r->plain.checksum,
           r->equal ? "true" : "false", r->input_bytes, r->shuffled_bytes, r->shuffle_files,
           r->pairs_shuffled, r->input_ratio, r->codec_ratio, RBK_TARGET_RATIO, r->met ? "true" : "false");
    return;
  }
  char v[64], t[32];
  const char *b = "reduce_by_key_50M";
  snprintf(v, sizeof v, "%.0f", r->engine_rps);
  print_row(b, "engine_records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.0f", r->plain_rps);
  print_row("", "plain_records_per_s", v, "", "");
  snprintf(t, sizeof t, ">= %.1f", RBK_TARGET_RATIO);
  snprintf(v, sizeof v, "%.3f", r->ratio);
  print_row("", "ratio", v, t, r->met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.3f", r->engine_s);
  print_row("", "engine_best_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->plain_s);
  print_row("", "plain_best_s", v, "", "");
  snprintf(v, sizeof v, "%" PRIu64, r->engine.keys);
  print_row("", "keys (engine = plain)", v, "", r->equal ? "" : "MISMATCH");
  snprintf(v, sizeof v, "%" PRIu64, r->engine.sum);
  print_row("", "sum of values", v, "", "");
  snprintf(v, sizeof v, "%016" PRIx64, r->engine.checksum);
  print_row("", "checksum", v, "", "");
  snprintf(v, sizeof v, "%.1f MiB", (double)r->input_bytes / MIB);
  print_row("", "input_bytes (16 x N)", v, "", "");
  snprintf(v, sizeof v, "%" PRIu64, r->pairs_shuffled);
  print_row("", "pairs_shuffled", v, "", "");
  snprintf(v, sizeof v, "%.2f MiB", (double)r->shuffled_bytes / MIB);
  print_row("", "shuffled_bytes", v, "", "");
  snprintf(v, sizeof v, "%.1f", r->input_ratio);
  print_row("", "input_ratio", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->codec_ratio);
  print_row("", "codec_ratio", v, "", "");
}

/* ---- options --------------------------------------------------------------------------- */

static const char usage_text[] =
    "usage: bench_shuffle [--json] [--records N] [--sort-mb B]\n"
    "  --json          one JSON object per row instead of a table\n"
    "  --records N     pairs for reduce_by_key_50M (default 50000000)\n"
    "  --sort-mb B     shuffle memory per task in MiB for sort_by_key_4x (default 32);\n"
    "                  the dataset is 4 x 2 x B MiB\n"
    "  --help          this text\n";

int main(int argc, char **argv) {
  options o = {false, 50000000ull, 32};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      o.json = true;
      continue;
    }
    bool records = strcmp(argv[i], "--records") == 0;
    if (records || strcmp(argv[i], "--sort-mb") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "bench_shuffle: %s needs a value\n%s", argv[i], usage_text);
        return 2;
      }
      uint64_t max = records ? (uint64_t)INT64_MAX : 1u << 20;
      if (!parse_count(argv[i + 1], max, records ? &o.records : &o.sort_mb)) {
        fprintf(stderr, "bench_shuffle: %s '%s' is not a whole number in 1..%" PRIu64 "\n%s", argv[i],
                argv[i + 1], max, usage_text);
        return 2;
      }
      i++;
      continue;
    }
    fprintf(stderr, "bench_shuffle: unknown option '%s'\n%s", argv[i], usage_text);
    return 2;
  }

  sort_result sr;
  rbk_result rr;
  memset(&sr, 0, sizeof sr);
  int sort_rc = bench_sort(&o, &sr); /* first: the child forks from a small process */
  if (!sr.ran) return 1;
  if (bench_reduce_by_key(&o, &rr) != 0) return 1;

  if (!o.json) print_header(&o);
  print_sort(&o, &sr);
  print_rbk(&o, &rr);
  fflush(stdout);
  int rc = sort_rc;
  if (!rr.equal) {
    fprintf(stderr,
            "bench_shuffle: reduce_by_key_50M: engine (keys %" PRIu64 ", sum %" PRIu64 ", checksum %" PRIu64
            ") differs from plain (keys %" PRIu64 ", sum %" PRIu64 ", checksum %" PRIu64
            ") or from the expected sum %" PRIu64 "\n",
            rr.engine.keys, rr.engine.sum, rr.engine.checksum, rr.plain.keys, rr.plain.sum,
            rr.plain.checksum, rr.expected_sum);
    rc = 1;
  }
  return rc;
}
