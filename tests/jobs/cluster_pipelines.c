/*
 * cluster_pipelines: a shared library for test_cluster that runs most of the public API on
 * a context and writes a text report of every result, one line per check. test_cluster runs
 * it on local[2] and on local-cluster[2,1,512] and wants the two reports byte for byte equal.
 *
 * The report must not depend on the mode: every partition count is given explicitly (the
 * default parallelism may differ), results whose order depends on where records went are
 * sorted before printing, floating-point sums add exactly representable values (so the
 * order of additions cannot matter), and no path, pointer or full error message is printed.
 *
 * Every function handed to flint is exported (non-static, default visibility): in cluster
 * mode functions travel as (library, symbol), and the engine finds the symbol with dladdr.
 * Their names start with cp_ so that they cannot clash with the test program's symbols.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flint/flint.h"

#define CP_EXPORT __attribute__((visibility("default")))

#define NUM_BASE 4000
#define BASE_PARTS 8
#define PAIR_KEYS 23
#define BIG_BROADCAST_LEN (8u << 20)

/* Emits every record left in `in`: the tail of the slow and faulty copies below. */
static fl_status copy_partition(fl_iter *in, fl_emitter *out) {
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) s = fl_emit(out, rec.data, rec.len);
  return s;
}

/* Appends one byte to `path`: a run counted in a file, seen from the test's process. */
static fl_status append_byte(const char *path) {
  int fd = open(path, O_CREAT | O_APPEND | O_WRONLY, 0600);
  if (fd < 0 || write(fd, "x", 1) != 1) {
    if (fd >= 0) close(fd);
    return fl_set_error(FL_EIO, "cannot append to %s", path);
  }
  close(fd);
  return FL_OK;
}

/* Waits until `path` holds at least `bytes` bytes (0: until it exists), at most cap_ms;
 * false when the cap passed first. A task blocked so that only the behaviour under test can
 * let the job end: the test (or the other tasks) make the file. */
static bool wait_file(const char *path, int64_t bytes, int64_t cap_ms) {
  for (int64_t waited = 0;; waited += 10) {
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size >= bytes) return true;
    if (waited >= cap_ms) return false;
    usleep(10000);
  }
}

/* Leaves `path` (the gate of a task) + ".unreleased": the task stopped waiting at its cap, so
 * the job ended some other way than the test meant (the test looks for the file). */
static void mark_unreleased(const char *path) {
  char mark[280];
  snprintf(mark, sizeof mark, "%s.unreleased", path);
  (void)append_byte(mark);
}

/* ---- the report ------------------------------------------------------------------------ */

typedef struct run {
  fl_context *ctx;
  fl_buf *report;
  int rc;
} run;

static void say(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(run *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || fl_buf_reserve(r->report, (size_t)n + 1) != FL_OK) {
    r->rc = 1;
    return;
  }
  va_start(ap, fmt);
  vsnprintf((char *)r->report->data + r->report->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  r->report->len += (size_t)n;
}

/* Records a failed call (and flint's message, read before any other flint call). */
static void failed(run *r, const char *call, fl_status s) {
  const char *msg = fl_last_error();
  say(r, "FAILED: %s: %s: %s\n", call, fl_status_name(s), msg);
  r->rc = 1;
}

/* In a section: run a flint call; on failure report it and jump to the section's cleanup. */
#define TRY(call)                                                                            \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    if (s_ != FL_OK) {                                                                       \
      failed(r, #call, s_);                                                                  \
      goto done;                                                                             \
    }                                                                                        \
  } while (0)

/* A check of our own (not a flint call) that failed. */
#define EXPECT(cond)                                                                         \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      say(r, "FAILED: %s (line %d)\n", #cond, __LINE__);                                    \
      r->rc = 1;                                                                             \
      goto done;                                                                             \
    }                                                                                        \
  } while (0)

/* ---- lists of formatted items, printed sorted or in order ------------------------------ */

typedef struct items {
  char **v;
  size_t n, cap;
} items;

static int items_add(items *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int items_add(items *l, const char *fmt, ...) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 32;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v) return -1;
    l->v = v;
    l->cap = cap;
  }
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = n < 0 ? NULL : malloc((size_t)n + 1);
  if (!s) return -1;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  l->v[l->n++] = s;
  return 0;
}

static int cmp_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void items_sort(items *l) {
  if (l->n) qsort(l->v, l->n, sizeof *l->v, cmp_strings);
}

/* "label: item item ...\n" */
static void items_say(run *r, const char *label, const items *l) {
  say(r, "%s:", label);
  for (size_t i = 0; i < l->n; i++) say(r, " %s", l->v[i]);
  say(r, "\n");
}

static void items_free(items *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  *l = (items){0};
}

/* Formats one record as an item; returns 0, or -1 for a record it cannot read. */
typedef int (*fmt_fn)(fl_bytes rec, items *out);

/* Collects ds and prints its records formatted, sorted (when order depends on partitioning)
 * or in collect order. Returns 0, or 1 after reporting the failure. */
static int say_collected(run *r, const char *label, fl_dataset *ds, fmt_fn fmt, bool sorted) {
  fl_records *recs = NULL;
  items l = {0};
  fl_status s = fl_collect(ds, &recs);
  if (s != FL_OK) {
    char call[128];
    snprintf(call, sizeof call, "fl_collect (%s)", label);
    failed(r, call, s);
    return 1;
  }
  int rc = 0;
  for (size_t i = 0; i < fl_records_count(recs) && rc == 0; i++) rc = fmt(fl_records_get(recs, i), &l);
  if (rc != 0) {
    say(r, "FAILED: %s: a record could not be formatted\n", label);
    r->rc = 1;
  } else {
    if (sorted) items_sort(&l);
    items_say(r, label, &l);
  }
  items_free(&l);
  fl_records_free(recs);
  return rc ? 1 : 0;
}

static int fmt_i64(fl_bytes rec, items *out) {
  return rec.len == 8 ? items_add(out, "%lld", (long long)fl_i64(rec)) : -1;
}

/* A string key of a pair as text (our keys are printable). */
static int key_text(fl_bytes key, char *buf, size_t len) {
  if (key.len + 1 > len) return -1;
  memcpy(buf, key.data, key.len);
  buf[key.len] = '\0';
  return 0;
}

/* (string key, int64) -> "key=v" */
static int fmt_skey_i64(fl_bytes rec, items *out) {
  fl_bytes k, v;
  char key[64];
  if (fl_pair(rec, &k, &v) != FL_OK || key_text(k, key, sizeof key) || v.len != 8) return -1;
  return items_add(out, "%s=%lld", key, (long long)fl_i64(v));
}

/* (int64 key, int64) -> "key=v" */
static int fmt_ikey_i64(fl_bytes rec, items *out) {
  fl_bytes k, v;
  if (fl_pair(rec, &k, &v) != FL_OK || k.len != 8 || v.len != 8) return -1;
  return items_add(out, "%lld=%lld", (long long)fl_i64(k), (long long)fl_i64(v));
}

/* (string key, two int64) -> "key=a/b" */
static int fmt_skey_two(fl_bytes rec, items *out) {
  fl_bytes k, v;
  char key[64];
  int64_t two[2];
  if (fl_pair(rec, &k, &v) != FL_OK || key_text(k, key, sizeof key) || v.len != 16) return -1;
  memcpy(two, v.data, 16);
  return items_add(out, "%s=%lld/%lld", key, (long long)two[0], (long long)two[1]);
}

/* (string key, group of int64) -> "key=count/sum" */
static int fmt_skey_group(fl_bytes rec, items *out) {
  fl_bytes k, g, v;
  char key[64];
  if (fl_pair(rec, &k, &g) != FL_OK || key_text(k, key, sizeof key)) return -1;
  size_t pos = 0;
  int64_t n = 0, sum = 0;
  while (fl_group_next(g, &pos, &v)) {
    if (v.len != 8) return -1;
    n++;
    sum += fl_i64(v);
  }
  return items_add(out, "%s=%lld/%lld", key, (long long)n, (long long)sum);
}

/* (string key, joined int64 sides) -> "key:a,b" with '-' for a missing side. */
static int fmt_joined(fl_bytes rec, items *out) {
  fl_bytes k, j, a, b;
  bool has_a, has_b;
  char key[64], sa[32] = "-", sb[32] = "-";
  if (fl_pair(rec, &k, &j) != FL_OK || key_text(k, key, sizeof key) ||
      fl_joined_get(j, &has_a, &a, &has_b, &b) != FL_OK)
    return -1;
  if (has_a) snprintf(sa, sizeof sa, "%lld", (long long)fl_i64(a));
  if (has_b) snprintf(sb, sizeof sb, "%lld", (long long)fl_i64(b));
  return items_add(out, "%s:%s,%s", key, sa, sb);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The int64 values of a group, sorted, as "v,v,v" (the order within a group is the
 * order fetched, which depends on the mode). */
static int group_text(fl_bytes g, char *buf, size_t len) {
  int64_t vals[64];
  size_t n = 0, pos = 0;
  fl_bytes v;
  while (fl_group_next(g, &pos, &v)) {
    if (n == 64 || v.len != 8) return -1;
    vals[n++] = fl_i64(v);
  }
  qsort(vals, n, sizeof *vals, cmp_i64);
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    int w = snprintf(buf + used, len - used, "%s%lld", i ? "," : "", (long long)vals[i]);
    if (w < 0 || (size_t)w >= len - used) return -1;
    used += (size_t)w;
  }
  return 0;
}

/* (string key, cogroup) -> "key:[a values][b values]" */
static int fmt_cogroup(fl_bytes rec, items *out) {
  fl_bytes k, c, ga, gb;
  char key[64], ta[512], tb[512];
  if (fl_pair(rec, &k, &c) != FL_OK || key_text(k, key, sizeof key) ||
      fl_cogroup_get(c, &ga, &gb) != FL_OK || group_text(ga, ta, sizeof ta) ||
      group_text(gb, tb, sizeof tb))
    return -1;
  return items_add(out, "%s:[%s][%s]", key, ta, tb);
}

/* The per-partition records of cp_partition_stats: "p=count/sum/min/max". */
static int fmt_partition_stats(fl_bytes rec, items *out) {
  int64_t v[5];
  if (rec.len != sizeof v) return -1;
  memcpy(v, rec.data, sizeof v);
  if (v[1] == 0) return items_add(out, "p%lld=0", (long long)v[0]);
  return items_add(out, "p%lld=%lld/%lld/%lld/%lld", (long long)v[0], (long long)v[1],
                   (long long)v[2], (long long)v[3], (long long)v[4]);
}

/* ---- user functions (exported: they travel by symbol in cluster mode) ----------------- */

CP_EXPORT fl_status cp_times(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) * *(const int64_t *)arg);
}

CP_EXPORT fl_status cp_add_k(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) + *(const int64_t *)arg);
}

CP_EXPORT fl_status cp_mod(fl_bytes rec, fl_buf *out, const void *arg) {
  return fl_buf_put_i64(out, fl_i64(rec) % *(const int64_t *)arg);
}

CP_EXPORT fl_status cp_keep_even(fl_bytes rec, bool *keep, const void *arg) {
  (void)arg;
  *keep = fl_i64(rec) % 2 == 0;
  return FL_OK;
}

/* x -> |x| % 3 copies of x, then x + 1000000 when x is a multiple of 10. */
CP_EXPORT fl_status cp_repeat(fl_bytes rec, fl_emitter *out, const void *arg) {
  (void)arg;
  int64_t v = fl_i64(rec), n = (v < 0 ? -v : v) % 3;
  fl_status s = FL_OK;
  for (int64_t i = 0; i < n && s == FL_OK; i++) s = fl_emit(out, &v, 8);
  if (s == FL_OK && v % 10 == 0) {
    int64_t w = v + 1000000;
    s = fl_emit(out, &w, 8);
  }
  return s;
}

/* Emits one record per partition: int64 partition, count, sum, min, max of its values (the
 * key's int64 for pairs when arg says so). */
CP_EXPORT fl_status cp_partition_stats(uint32_t partition, fl_iter *in, fl_emitter *out,
                                       const void *arg) {
  bool pairs = arg && *(const uint8_t *)arg;
  int64_t v[5] = {partition, 0, 0, INT64_MAX, INT64_MIN};
  fl_bytes rec, key, value;
  while (fl_iter_next(in, &rec)) {
    int64_t x;
    if (pairs) {
      fl_status s = fl_pair(rec, &key, &value);
      if (s != FL_OK) return s;
      /* string keys count as their length, so that any pair can be counted */
      x = key.len == 8 ? fl_i64(key) : (int64_t)key.len;
    } else {
      x = fl_i64(rec);
    }
    v[1]++;
    v[2] += x;
    if (x < v[3]) v[3] = x;
    if (x > v[4]) v[4] = x;
  }
  return fl_emit(out, v, sizeof v);
}

/* Copies a record and counts the call in the i64 accumulator whose id is the arg: how often
 * a dataset was computed (test_cluster's remote cached reads). */
CP_EXPORT fl_status cp_counted_copy(fl_bytes rec, fl_buf *out, const void *arg) {
  uint64_t id;
  memcpy(&id, arg, sizeof id);
  fl_status s = fl_accumulator_add_i64(id, 1);
  if (s != FL_OK) return s;
  out->len = 0;
  return fl_buf_append(out, rec.data, rec.len);
}

/* Copies a partition after sleeping the arg's milliseconds (an int64) once: tasks of a known
 * length whatever their size (test_recovery's jobs, during which executors die). */
CP_EXPORT fl_status cp_slow_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  int64_t ms;
  memcpy(&ms, arg, sizeof ms);
  usleep((useconds_t)(ms * 1000));
  return copy_partition(in, out);
}

/* Copies a record after sleeping the arg's milliseconds (an int64): a slow job to cancel. */
CP_EXPORT fl_status cp_nap(fl_bytes rec, fl_buf *out, const void *arg) {
  int64_t ms;
  memcpy(&ms, arg, sizeof ms);
  usleep((useconds_t)(ms * 1000));
  out->len = 0;
  return fl_buf_append(out, rec.data, rec.len);
}

/* Copies a record and counts it in an i64 accumulator; the first call anywhere (the one
 * that creates the marker file) is slow: one slow task, for speculation. With a gate, the
 * slow call waits until the file `gate` holds gate_bytes bytes (0: exists), at most
 * sleep_ms, leaving gate.unreleased when that passes; without one it sleeps sleep_ms. Every
 * other call appends a byte to `tally` when one is named. */
typedef struct cp_slow_once_arg {
  uint64_t accumulator;
  uint32_t sleep_ms;
  char marker[200];
  char gate[200];
  uint32_t gate_bytes;
  char tally[200];
} cp_slow_once_arg;

CP_EXPORT fl_status cp_slow_once(fl_bytes rec, fl_buf *out, const void *arg) {
  cp_slow_once_arg a;
  memcpy(&a, arg, sizeof a);
  int fd = open(a.marker, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd >= 0) {
    close(fd);
    if (!a.gate[0])
      usleep((useconds_t)a.sleep_ms * 1000);
    else if (!wait_file(a.gate, a.gate_bytes, a.sleep_ms))
      mark_unreleased(a.gate);
  } else if (a.tally[0]) {
    fl_status s = append_byte(a.tally);
    if (s != FL_OK) return s;
  }
  fl_status s = fl_accumulator_add_i64(a.accumulator, 1);
  if (s != FL_OK) return s;
  out->len = 0;
  return fl_buf_append(out, rec.data, rec.len);
}

CP_EXPORT fl_status cp_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

CP_EXPORT fl_status cp_max(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) > fl_i64(b) ? fl_i64(a) : fl_i64(b));
}

/* aggregate's accumulator: int64 count, sum, min, max. */
CP_EXPORT fl_status cp_stats_seq(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t s[4], x = fl_i64(rec);
  if (acc.len != sizeof s) return fl_set_error(FL_EFORMAT, "stats accumulator of %zu bytes", acc.len);
  memcpy(s, acc.data, sizeof s);
  s[0]++;
  s[1] += x;
  if (x < s[2]) s[2] = x;
  if (x > s[3]) s[3] = x;
  return fl_buf_append(out, s, sizeof s);
}

CP_EXPORT fl_status cp_stats_comb(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x[4], y[4];
  if (a.len != sizeof x || b.len != sizeof y) return fl_set_error(FL_EFORMAT, "stats accumulators of %zu and %zu bytes", a.len, b.len);
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  x[0] += y[0];
  x[1] += y[1];
  if (y[2] < x[2]) x[2] = y[2];
  if (y[3] > x[3]) x[3] = y[3];
  return fl_buf_append(out, x, sizeof x);
}

typedef struct acc_ids {
  uint64_t sum, half, max;
} acc_ids;

/* Adds x to an i64 accumulator, x / 2 to an f64 one (exact in binary, so the order of the
 * additions cannot change the total) and x to a max accumulator. */
CP_EXPORT fl_status cp_foreach_accumulate(fl_bytes rec, const void *arg) {
  const acc_ids *ids = arg;
  int64_t x = fl_i64(rec);
  fl_status s = fl_accumulator_add_i64(ids->sum, x);
  if (s == FL_OK) s = fl_accumulator_add_f64(ids->half, (double)x / 2);
  if (s == FL_OK) s = fl_accumulator_add(ids->max, fl_bytes_of(&x, 8));
  return s;
}

typedef struct bc_args {
  uint64_t id;
  uint64_t len; /* the length the broadcast must have */
} bc_args;

/* x -> x * table[|x| % entries], the table an int64 array broadcast. */
CP_EXPORT fl_status cp_broadcast_lookup(fl_bytes rec, fl_buf *out, const void *arg) {
  const bc_args *a = arg;
  fl_bytes table;
  fl_status s = fl_broadcast_value(a->id, &table);
  if (s != FL_OK) return s;
  if (table.len != a->len) return fl_set_error(FL_ECORRUPT, "broadcast of %zu bytes, expected %llu", table.len, (unsigned long long)a->len);
  int64_t x = fl_i64(rec), e;
  size_t i = (size_t)((x < 0 ? -x : x) * 7919) % (table.len / 8);
  memcpy(&e, table.data + 8 * i, 8);
  return fl_buf_put_i64(out, x * e);
}

/* key_by's key: x % 7 as int64. */
CP_EXPORT fl_status cp_key_mod7(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(rec) % 7);
}

/* combine_by_key with (count, sum) combiners. */
CP_EXPORT fl_status cp_comb_create(fl_bytes value, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t c[2] = {1, fl_i64(value)};
  return fl_buf_append(out, c, sizeof c);
}
CP_EXPORT fl_status cp_comb_merge_value(fl_bytes comb, fl_bytes value, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t c[2];
  if (comb.len != sizeof c) return fl_set_error(FL_EFORMAT, "combiner of %zu bytes", comb.len);
  memcpy(c, comb.data, sizeof c);
  c[0]++;
  c[1] += fl_i64(value);
  return fl_buf_append(out, c, sizeof c);
}
CP_EXPORT fl_status cp_comb_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x[2], y[2];
  if (a.len != sizeof x || b.len != sizeof y) return fl_set_error(FL_EFORMAT, "combiners of %zu and %zu bytes", a.len, b.len);
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  x[0] += y[0];
  x[1] += y[1];
  return fl_buf_append(out, x, sizeof x);
}

/* Numeric order of int64 keys (bytewise order of little-endian int64 is not numeric). */
CP_EXPORT int cp_cmp_i64(fl_bytes a, fl_bytes b, const void *arg) {
  (void)arg;
  int64_t x = fl_i64(a), y = fl_i64(b);
  return (x > y) - (x < y);
}

/* int64 key -> its residue modulo the partition count (non-negative). */
CP_EXPORT uint32_t cp_partition_mod(fl_bytes key, uint32_t num_partitions, const void *arg) {
  (void)arg;
  int64_t n = num_partitions, k = fl_i64(key);
  return (uint32_t)(((k % n) + n) % n);
}

/* A line -> the line in upper case. */
CP_EXPORT fl_status cp_upper(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_status s = fl_buf_reserve(out, rec.len);
  if (s != FL_OK) return s;
  for (size_t i = 0; i < rec.len; i++) {
    uint8_t c = rec.data[i];
    out->data[i] = c >= 'a' && c <= 'z' ? (uint8_t)(c - 'a' + 'A') : c;
  }
  out->len = rec.len;
  return FL_OK;
}

/* Fails on every record. The message leaves out the function's name on purpose: the engine
 * must add it. */
CP_EXPORT fl_status cp_fail_record(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)out;
  (void)arg;
  return fl_set_error(FL_EFORMAT, "refusing record %lld", (long long)fl_i64(rec));
}

/* ---- inputs ---------------------------------------------------------------------------- */

static int64_t base_value(size_t i) { return (int64_t)((i * 37) % 1001) - 200; }

/* NUM_BASE int64 records in BASE_PARTS partitions. */
static fl_status make_base(fl_context *ctx, fl_dataset **out) {
  int64_t *vals = malloc(NUM_BASE * sizeof *vals);
  fl_bytes *views = malloc(NUM_BASE * sizeof *views);
  fl_status s = FL_ENOMEM;
  if (vals && views) {
    for (size_t i = 0; i < NUM_BASE; i++) {
      vals[i] = base_value(i);
      views[i] = fl_bytes_of(&vals[i], 8);
    }
    s = fl_parallelize(ctx, views, NUM_BASE, BASE_PARTS, out);
  }
  free(views);
  free(vals);
  return s;
}

/* Parallelizes pair records built by the caller. */
static fl_status make_pairs(fl_context *ctx, fl_buf *recs, size_t n, uint32_t parts, fl_dataset **out) {
  fl_bytes *views = malloc((n ? n : 1) * sizeof *views);
  if (!views) return FL_ENOMEM;
  for (size_t i = 0; i < n; i++) views[i] = fl_buf_bytes(&recs[i]);
  fl_status s = fl_parallelize(ctx, views, n, parts, out);
  free(views);
  return s;
}

static void free_recs(fl_buf *recs, size_t n) {
  if (!recs) return;
  for (size_t i = 0; i < n; i++) fl_buf_free(&recs[i]);
  free(recs);
}

/* ("kNN", int64) pairs: NUM_BASE of them over PAIR_KEYS keys, in BASE_PARTS partitions. */
static fl_status make_string_pairs(fl_context *ctx, fl_dataset **out) {
  fl_buf *recs = calloc(NUM_BASE, sizeof *recs);
  if (!recs) return FL_ENOMEM;
  fl_status s = FL_OK;
  for (size_t i = 0; i < NUM_BASE && s == FL_OK; i++) {
    char key[16];
    snprintf(key, sizeof key, "k%02zu", (i * 13 + i / 5) % PAIR_KEYS);
    int64_t v = base_value(i);
    s = fl_buf_put_pair(&recs[i], fl_bytes_str(key), fl_bytes_of(&v, 8));
  }
  if (s == FL_OK) s = make_pairs(ctx, recs, NUM_BASE, BASE_PARTS, out);
  free_recs(recs, NUM_BASE);
  return s;
}

/* 1000 pairs with distinct int64 keys in [-500, 500) in a scrambled order, values 0..999,
 * in 8 partitions of 125: small enough that range sampling keeps every key, so that range
 * bounds are the same whatever the sampling seed. */
static fl_status make_int_pairs(fl_context *ctx, fl_dataset **out) {
  fl_buf *recs = calloc(1000, sizeof *recs);
  if (!recs) return FL_ENOMEM;
  fl_status s = FL_OK;
  for (int64_t i = 0; i < 1000 && s == FL_OK; i++) {
    int64_t k = (i * 7919) % 1000 - 500;
    s = fl_buf_put_pair(&recs[i], fl_bytes_of(&k, 8), fl_bytes_of(&i, 8));
  }
  if (s == FL_OK) s = make_pairs(ctx, recs, 1000, 8, out);
  free_recs(recs, 1000);
  return s;
}

/* ("sNNNN", int64) pairs with distinct string keys, for bytewise sorting. */
static fl_status make_sortable_string_pairs(fl_context *ctx, fl_dataset **out) {
  fl_buf *recs = calloc(600, sizeof *recs);
  if (!recs) return FL_ENOMEM;
  fl_status s = FL_OK;
  for (int64_t i = 0; i < 600 && s == FL_OK; i++) {
    char key[16];
    snprintf(key, sizeof key, "s%04lld", (long long)((i * 7919) % 600));
    s = fl_buf_put_pair(&recs[i], fl_bytes_str(key), fl_bytes_of(&i, 8));
  }
  if (s == FL_OK) s = make_pairs(ctx, recs, 600, 5, out);
  free_recs(recs, 600);
  return s;
}

/* Join inputs: a has keys j0..j5 (two values each), b has j3..j8 (values 100..). */
static fl_status make_join_inputs(fl_context *ctx, fl_dataset **a, fl_dataset **b) {
  fl_buf ra[12] = {FL_BUF_INIT}, rb[9] = {FL_BUF_INIT};
  fl_status s = FL_OK;
  for (int64_t i = 0; i < 12 && s == FL_OK; i++) {
    char key[8];
    snprintf(key, sizeof key, "j%lld", (long long)(i % 6));
    s = fl_buf_put_pair(&ra[i], fl_bytes_str(key), fl_bytes_of(&i, 8));
  }
  for (int64_t i = 0; i < 9 && s == FL_OK; i++) {
    char key[8];
    int64_t v = 100 + i;
    snprintf(key, sizeof key, "j%lld", (long long)(3 + i % 6));
    s = fl_buf_put_pair(&rb[i], fl_bytes_str(key), fl_bytes_of(&v, 8));
  }
  if (s == FL_OK) s = make_pairs(ctx, ra, 12, 3, a);
  if (s == FL_OK) {
    s = make_pairs(ctx, rb, 9, 2, b);
    if (s != FL_OK) {
      fl_dataset_free(*a);
      *a = NULL;
    }
  }
  for (int i = 0; i < 12; i++) fl_buf_free(&ra[i]);
  for (int i = 0; i < 9; i++) fl_buf_free(&rb[i]);
  return s;
}

/* ---- sections: each prints its lines and frees what it made ---------------------------- */

static fl_status sum_i64(fl_dataset *ds, int64_t *out) {
  fl_buf b = FL_BUF_INIT;
  fl_status s = fl_reduce(ds, cp_sum, NULL, 0, &b);
  if (s == FL_OK) *out = fl_i64(fl_buf_bytes(&b));
  fl_buf_free(&b);
  return s;
}

static void sec_narrow(run *r) {
  fl_dataset *base = NULL, *m = NULL, *f = NULL, *fm = NULL, *mp = NULL;
  fl_records *recs = NULL;
  items l = {0};
  int64_t three = 3, sum = 0;
  uint64_t n = 0, nf = 0;
  TRY(make_base(r->ctx, &base));
  TRY(fl_count(base, &n));
  say(r, "parallelize: partitions=%u count=%llu\n", fl_dataset_partitions(base), (unsigned long long)n);
  TRY(fl_map(base, cp_times, &three, sizeof three, &m));
  TRY(fl_filter(m, cp_keep_even, NULL, 0, &f));
  TRY(fl_count(f, &nf));
  TRY(sum_i64(f, &sum));
  say(r, "map_filter_count: count=%llu sum=%lld\n", (unsigned long long)nf, (long long)sum);

  TRY(fl_flat_map(base, cp_repeat, NULL, 0, &fm));
  TRY(fl_count(fm, &n));
  TRY(sum_i64(fm, &sum));
  say(r, "flat_map: count=%llu sum=%lld\n", (unsigned long long)n, (long long)sum);

  TRY(fl_map_partitions(f, cp_partition_stats, NULL, 0, &mp));
  say_collected(r, "map_partitions", mp, fmt_partition_stats, false);

  /* collect keeps partition order without a shuffle: print the ends and a checksum. */
  TRY(fl_collect(f, &recs));
  n = fl_records_count(recs);
  EXPECT(n == nf);
  int64_t weighted = 0;
  for (size_t i = 0; i < n; i++) weighted += (int64_t)(i % 97) * fl_i64(fl_records_get(recs, i));
  for (size_t i = 0; i < n && i < 4; i++) EXPECT(items_add(&l, "%lld", (long long)fl_i64(fl_records_get(recs, i))) == 0);
  EXPECT(n > 0);
  say(r, "collect: count=%zu last=%lld weighted=%lld", (size_t)n,
      (long long)fl_i64(fl_records_get(recs, n - 1)), (long long)weighted);
  items_say(r, " head", &l);
  fl_records_free(recs);
  recs = NULL;
  items_free(&l);

  TRY(fl_take(f, 7, &recs));
  for (size_t i = 0; i < fl_records_count(recs); i++) EXPECT(items_add(&l, "%lld", (long long)fl_i64(fl_records_get(recs, i))) == 0);
  items_say(r, "take7", &l);
  fl_records_free(recs);
  recs = NULL;
  items_free(&l);
  /* take across partitions: more than the first partition holds */
  TRY(fl_take(f, 900, &recs));
  int64_t tsum = 0;
  for (size_t i = 0; i < fl_records_count(recs); i++) tsum += fl_i64(fl_records_get(recs, i));
  say(r, "take900: count=%zu sum=%lld\n", fl_records_count(recs), (long long)tsum);
  fl_records_free(recs);
  recs = NULL;

  fl_buf first = FL_BUF_INIT;
  fl_status s = fl_first(fm, &first);
  if (s != FL_OK) {
    failed(r, "fl_first(fm, &first)", s);
    fl_buf_free(&first);
    goto done;
  }
  say(r, "first: len=%zu value=%lld\n", first.len, (long long)fl_i64(fl_buf_bytes(&first)));
  fl_buf_free(&first);
done:
  items_free(&l);
  fl_records_free(recs);
  fl_dataset_free(mp);
  fl_dataset_free(fm);
  fl_dataset_free(f);
  fl_dataset_free(m);
  fl_dataset_free(base);
}

static void sec_aggregates(run *r) {
  fl_dataset *base = NULL;
  fl_buf out = FL_BUF_INIT;
  int64_t zero = 0, ten = 10, low = INT64_MIN;
  int64_t stats_zero[4] = {0, 0, INT64_MAX, INT64_MIN}, st[4];
  TRY(make_base(r->ctx, &base));
  TRY(fl_reduce(base, cp_sum, NULL, 0, &out));
  say(r, "reduce: sum=%lld\n", (long long)fl_i64(fl_buf_bytes(&out)));
  TRY(fl_reduce(base, cp_max, NULL, 0, &out));
  say(r, "reduce: max=%lld\n", (long long)fl_i64(fl_buf_bytes(&out)));
  TRY(fl_fold(base, fl_bytes_of(&zero, 8), cp_sum, NULL, 0, &out));
  say(r, "fold: zero=0 sum=%lld\n", (long long)fl_i64(fl_buf_bytes(&out)));
  /* A zero that is not neutral counts once per partition and once more (Spark's rule). */
  TRY(fl_fold(base, fl_bytes_of(&ten, 8), cp_sum, NULL, 0, &out));
  say(r, "fold: zero=10 sum=%lld\n", (long long)fl_i64(fl_buf_bytes(&out)));
  TRY(fl_fold(base, fl_bytes_of(&low, 8), cp_max, NULL, 0, &out));
  say(r, "fold: max=%lld\n", (long long)fl_i64(fl_buf_bytes(&out)));
  TRY(fl_aggregate(base, fl_bytes_of(stats_zero, sizeof stats_zero), cp_stats_seq, cp_stats_comb, NULL, 0, &out));
  EXPECT(out.len == sizeof st);
  memcpy(st, out.data, sizeof st);
  say(r, "aggregate: count=%lld sum=%lld min=%lld max=%lld\n", (long long)st[0], (long long)st[1],
      (long long)st[2], (long long)st[3]);
  for (uint32_t depth = 1; depth <= 3; depth++) {
    TRY(fl_tree_aggregate(base, fl_bytes_of(stats_zero, sizeof stats_zero), cp_stats_seq, cp_stats_comb, NULL, 0,
                          depth, &out));
    EXPECT(out.len == sizeof st);
    memcpy(st, out.data, sizeof st);
    say(r, "tree_aggregate: depth=%u count=%lld sum=%lld min=%lld max=%lld\n", depth, (long long)st[0],
        (long long)st[1], (long long)st[2], (long long)st[3]);
  }
done:
  fl_buf_free(&out);
  fl_dataset_free(base);
}

static void sec_accumulators(run *r) {
  fl_dataset *base = NULL;
  fl_accumulator *sum = NULL, *half = NULL, *max = NULL;
  fl_buf out = FL_BUF_INIT;
  int64_t low = INT64_MIN, s64 = 0;
  double f64 = 0;
  TRY(make_base(r->ctx, &base));
  TRY(fl_accumulator_create_i64(r->ctx, &sum));
  TRY(fl_accumulator_create_f64(r->ctx, &half));
  TRY(fl_accumulator_create(r->ctx, fl_bytes_of(&low, 8), cp_max, NULL, 0, &max));
  acc_ids ids = {fl_accumulator_id(sum), fl_accumulator_id(half), fl_accumulator_id(max)};
  TRY(fl_foreach(base, cp_foreach_accumulate, &ids, sizeof ids));
  TRY(fl_accumulator_value_i64(sum, &s64));
  TRY(fl_accumulator_value_f64(half, &f64));
  TRY(fl_accumulator_value(max, &out));
  say(r, "foreach_accumulators: i64=%lld f64=%.1f max=%lld\n", (long long)s64, f64,
      (long long)fl_i64(fl_buf_bytes(&out)));
  /* A second job adds to the same accumulators. */
  TRY(fl_foreach(base, cp_foreach_accumulate, &ids, sizeof ids));
  TRY(fl_accumulator_value_i64(sum, &s64));
  TRY(fl_accumulator_value_f64(half, &f64));
  say(r, "foreach_accumulators_again: i64=%lld f64=%.1f\n", (long long)s64, f64);
done:
  fl_buf_free(&out);
  fl_accumulator_destroy(max);
  fl_accumulator_destroy(half);
  fl_accumulator_destroy(sum);
  fl_dataset_free(base);
}

/* A broadcast table of `len` bytes (int64 entries i * 3 + 1), read inside a map. */
static void broadcast_case(run *r, fl_dataset *base, size_t len, const char *label) {
  fl_broadcast *b = NULL;
  fl_dataset *m = NULL;
  int64_t *table = malloc(len), sum = 0;
  uint64_t n = 0;
  EXPECT(table != NULL);
  for (size_t i = 0; i < len / 8; i++) table[i] = (int64_t)i * 3 + 1;
  TRY(fl_broadcast_create(r->ctx, table, len, &b));
  bc_args a = {fl_broadcast_id(b), len};
  TRY(fl_map(base, cp_broadcast_lookup, &a, sizeof a, &m));
  TRY(fl_count(m, &n));
  TRY(sum_i64(m, &sum));
  say(r, "%s: bytes=%zu count=%llu sum=%lld\n", label, len, (unsigned long long)n, (long long)sum);
done:
  fl_dataset_free(m);
  fl_broadcast_destroy(b);
  free(table);
}

static void sec_broadcasts(run *r) {
  fl_dataset *base = NULL;
  TRY(make_base(r->ctx, &base));
  broadcast_case(r, base, 80, "broadcast_small");
  broadcast_case(r, base, BIG_BROADCAST_LEN, "broadcast_8mib");
done:
  fl_dataset_free(base);
}

static void sec_cache(run *r) {
  fl_dataset *base = NULL, *m = NULL, *it = NULL;
  fl_storage_info info;
  uint64_t n1 = 0, n2 = 0, n3 = 0;
  int64_t two = 2, sum = 0;
  TRY(make_base(r->ctx, &base));
  TRY(fl_map(base, cp_times, &two, sizeof two, &m));
  TRY(fl_cache(m));
  TRY(fl_count(m, &n1));
  TRY(fl_count(m, &n2));
  TRY(fl_storage_info_get(m, &info));
  say(r, "cache: count1=%llu count2=%llu partitions=%u cached=%s\n", (unsigned long long)n1,
      (unsigned long long)n2, info.partitions, info.cached_partitions > 0 ? "yes" : "no");
  TRY(fl_unpersist(m));
  TRY(fl_count(m, &n3));
  TRY(sum_i64(m, &sum));
  say(r, "unpersist: count=%llu sum=%lld\n", (unsigned long long)n3, (long long)sum);
  /* The other levels, each after an unpersist (changing a level in place is refused). */
  static const struct {
    fl_storage_level level;
    const char *name;
  } levels[] = {{FL_MEMORY_SER, "memory_ser"}, {FL_MEMORY_AND_DISK, "memory_and_disk"}, {FL_DISK_ONLY, "disk_only"}};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
    TRY(fl_persist(m, levels[i].level));
    TRY(fl_count(m, &n1));
    TRY(sum_i64(m, &sum));
    TRY(fl_storage_info_get(m, &info));
    say(r, "persist_%s: count=%llu sum=%lld cached=%s\n", levels[i].name, (unsigned long long)n1, (long long)sum,
        info.cached_partitions > 0 ? "yes" : "no");
    TRY(fl_unpersist(m));
  }

  /* An iterative loop over a cached dataset: each pass maps and sums it. */
  TRY(fl_cache(base));
  say(r, "iterative:");
  for (int64_t i = 1; i <= 5; i++) {
    TRY(fl_map(base, cp_times, &i, sizeof i, &it));
    TRY(sum_i64(it, &sum));
    say(r, " %lld", (long long)sum);
    fl_dataset_free(it);
    it = NULL;
  }
  say(r, "\n");
  /* and a chain that grows by one map per pass */
  fl_dataset *cur = base;
  fl_dataset *chain[5] = {NULL};
  say(r, "iterative_chain:");
  for (int i = 0; i < 5; i++) {
    int64_t k = i + 1;
    fl_status s = fl_map(cur, cp_add_k, &k, sizeof k, &chain[i]);
    if (s == FL_OK) s = sum_i64(chain[i], &sum);
    if (s != FL_OK) {
      failed(r, "iterative chain step", s);
      for (int j = 0; j <= i; j++) fl_dataset_free(chain[j]);
      goto done;
    }
    say(r, " %lld", (long long)sum);
    cur = chain[i];
  }
  say(r, "\n");
  for (int i = 0; i < 5; i++) fl_dataset_free(chain[i]);
  TRY(fl_unpersist(base));
done:
  fl_dataset_free(it);
  fl_dataset_free(m);
  fl_dataset_free(base);
}

static void sec_sources_and_reshaping(run *r) {
  fl_dataset *rg = NULL, *down = NULL, *big = NULL, *s1 = NULL, *s2 = NULL, *s3 = NULL;
  fl_dataset *a = NULL, *b = NULL, *u = NULL, *c = NULL, *base = NULL, *f = NULL, *z = NULL;
  fl_dataset *kb = NULL, *mv = NULL;
  fl_records *recs = NULL;
  items l = {0};
  uint64_t n = 0;
  int64_t sum = 0, ten = 10;

  TRY(fl_range(r->ctx, -50, 1000, 7, 5, &rg));
  TRY(fl_count(rg, &n));
  TRY(sum_i64(rg, &sum));
  say(r, "range: partitions=%u count=%llu sum=%lld\n", fl_dataset_partitions(rg), (unsigned long long)n,
      (long long)sum);
  TRY(fl_range(r->ctx, 100, 0, -3, 3, &down));
  say_collected(r, "range_down", down, fmt_i64, false);

  TRY(fl_range(r->ctx, 0, 10000, 1, 8, &big));
  TRY(fl_sample(big, false, 0.3, 42, &s1));
  TRY(fl_sample(big, false, 0.3, 42, &s2));
  TRY(fl_sample(big, true, 1.5, 7, &s3));
  uint64_t n1, n2, n3;
  int64_t sum1, sum2, sum3;
  TRY(fl_count(s1, &n1));
  TRY(sum_i64(s1, &sum1));
  TRY(fl_count(s2, &n2));
  TRY(sum_i64(s2, &sum2));
  TRY(fl_count(s3, &n3));
  TRY(sum_i64(s3, &sum3));
  say(r, "sample: without=%llu/%lld same_seed_same=%s with=%llu/%lld\n", (unsigned long long)n1,
      (long long)sum1, n1 == n2 && sum1 == sum2 ? "yes" : "no", (unsigned long long)n3, (long long)sum3);

  TRY(fl_range(r->ctx, 0, 10, 1, 3, &a));
  TRY(fl_range(r->ctx, 100, 105, 1, 2, &b));
  TRY(fl_union(a, b, &u));
  say(r, "union: partitions=%u\n", fl_dataset_partitions(u));
  say_collected(r, "union_collect", u, fmt_i64, false);
  TRY(fl_coalesce(u, 2, &c));
  say(r, "coalesce: partitions=%u\n", fl_dataset_partitions(c));
  say_collected(r, "coalesce_collect", c, fmt_i64, false);

  /* zip_with_index over uneven partitions (a filter leaves them so) */
  TRY(make_base(r->ctx, &base));
  TRY(fl_filter(base, cp_keep_even, NULL, 0, &f));
  TRY(fl_zip_with_index(f, &z));
  TRY(fl_collect(z, &recs));
  int64_t check = 0;
  bool indexes_ok = true;
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    fl_bytes k, v;
    TRY(fl_pair(fl_records_get(recs, i), &k, &v));
    if (fl_i64(v) != (int64_t)i) indexes_ok = false;
    check += fl_i64(k) * (int64_t)(i % 101);
    if (i < 3) EXPECT(items_add(&l, "%lld@%lld", (long long)fl_i64(k), (long long)fl_i64(v)) == 0);
  }
  say(r, "zip_with_index: count=%zu indexes_in_order=%s check=%lld", fl_records_count(recs),
      indexes_ok ? "yes" : "no", (long long)check);
  items_say(r, " head", &l);
  items_free(&l);
  fl_records_free(recs);
  recs = NULL;

  /* key_by then map_values (narrow: partition order is kept) */
  TRY(fl_key_by(base, cp_key_mod7, NULL, 0, &kb));
  TRY(fl_map_values(kb, cp_times, &ten, sizeof ten, &mv));
  TRY(fl_take(mv, 6, &recs));
  for (size_t i = 0; i < fl_records_count(recs); i++) EXPECT(fmt_ikey_i64(fl_records_get(recs, i), &l) == 0);
  items_say(r, "key_by_map_values", &l);
  items_free(&l);
  fl_records_free(recs);
  recs = NULL;
done:
  items_free(&l);
  fl_records_free(recs);
  fl_dataset_free(mv);
  fl_dataset_free(kb);
  fl_dataset_free(z);
  fl_dataset_free(f);
  fl_dataset_free(base);
  fl_dataset_free(c);
  fl_dataset_free(u);
  fl_dataset_free(b);
  fl_dataset_free(a);
  fl_dataset_free(s3);
  fl_dataset_free(s2);
  fl_dataset_free(s1);
  fl_dataset_free(big);
  fl_dataset_free(down);
  fl_dataset_free(rg);
}

static void sec_by_key(run *r) {
  fl_dataset *p = NULL, *rbk = NULL, *cbk = NULL, *cbk2 = NULL, *fbk = NULL, *abk = NULL;
  fl_dataset *gbk = NULL, *base = NULL, *mod = NULL, *dist = NULL;
  fl_records *counts = NULL;
  items l = {0};
  int64_t zero = 0, low = INT64_MIN, fifty = 50;
  TRY(make_string_pairs(r->ctx, &p));
  TRY(fl_reduce_by_key(p, cp_sum, NULL, 0, NULL, 4, &rbk));
  say_collected(r, "reduce_by_key", rbk, fmt_skey_i64, true);
  TRY(fl_combine_by_key(p, cp_comb_create, cp_comb_merge_value, cp_comb_merge, NULL, 0, NULL, 3, true, &cbk));
  say_collected(r, "combine_by_key", cbk, fmt_skey_two, true);
  TRY(fl_combine_by_key(p, cp_comb_create, cp_comb_merge_value, cp_comb_merge, NULL, 0, NULL, 5, false, &cbk2));
  say_collected(r, "combine_by_key_no_map_side", cbk2, fmt_skey_two, true);
  TRY(fl_fold_by_key(p, fl_bytes_of(&zero, 8), cp_sum, NULL, 0, NULL, 4, &fbk));
  say_collected(r, "fold_by_key", fbk, fmt_skey_i64, true);
  TRY(fl_aggregate_by_key(p, fl_bytes_of(&low, 8), cp_max, cp_max, NULL, 0, NULL, 2, &abk));
  say_collected(r, "aggregate_by_key_max", abk, fmt_skey_i64, true);
  TRY(fl_group_by_key(p, NULL, 6, &gbk));
  say_collected(r, "group_by_key", gbk, fmt_skey_group, true);
  TRY(fl_count_by_key(p, &counts));
  for (size_t i = 0; i < fl_records_count(counts); i++) EXPECT(fmt_skey_i64(fl_records_get(counts, i), &l) == 0);
  items_say(r, "count_by_key", &l); /* in key order already */
  items_free(&l);

  TRY(make_base(r->ctx, &base));
  TRY(fl_map(base, cp_mod, &fifty, sizeof fifty, &mod));
  TRY(fl_distinct(mod, 4, &dist));
  say(r, "distinct: partitions=%u\n", fl_dataset_partitions(dist));
  say_collected(r, "distinct_sorted", dist, fmt_i64, true);
done:
  items_free(&l);
  fl_records_free(counts);
  fl_dataset_free(dist);
  fl_dataset_free(mod);
  fl_dataset_free(base);
  fl_dataset_free(gbk);
  fl_dataset_free(abk);
  fl_dataset_free(fbk);
  fl_dataset_free(cbk2);
  fl_dataset_free(cbk);
  fl_dataset_free(rbk);
  fl_dataset_free(p);
}

/* Prints a sorted dataset in collect order: its size, ends and whether keys are ordered. */
static void say_sorted(run *r, const char *label, fl_dataset *ds, bool numeric, bool ascending) {
  fl_records *recs = NULL;
  items l = {0};
  TRY(fl_collect(ds, &recs));
  size_t n = fl_records_count(recs);
  bool ordered = true;
  fl_bytes prev = {NULL, 0};
  for (size_t i = 0; i < n; i++) {
    fl_bytes k, v;
    TRY(fl_pair(fl_records_get(recs, i), &k, &v));
    if (i > 0) {
      int c;
      if (numeric) {
        c = cp_cmp_i64(prev, k, NULL);
      } else {
        size_t m = prev.len < k.len ? prev.len : k.len;
        c = memcmp(prev.data, k.data, m);
        if (c == 0) c = (prev.len > k.len) - (prev.len < k.len);
      }
      if (ascending ? c > 0 : c < 0) ordered = false;
    }
    prev = k;
    if (i < 3 || i + 3 >= n) {
      char key[32];
      if (numeric) snprintf(key, sizeof key, "%lld", (long long)fl_i64(k));
      else EXPECT(key_text(k, key, sizeof key) == 0);
      EXPECT(items_add(&l, "%s=%lld", key, (long long)fl_i64(v)) == 0);
    }
  }
  say(r, "%s: partitions=%u count=%zu ordered=%s", label, fl_dataset_partitions(ds), n, ordered ? "yes" : "no");
  items_say(r, " ends", &l);
done:
  items_free(&l);
  fl_records_free(recs);
}

static void sec_sort(run *r) {
  fl_dataset *ip = NULL, *sp = NULL, *a = NULL, *d = NULL, *ua = NULL, *ud = NULL;
  TRY(make_sortable_string_pairs(r->ctx, &sp));
  TRY(fl_sort_by_key(sp, true, NULL, NULL, 0, 4, &a));
  say_sorted(r, "sort_by_key_asc", a, false, true);
  TRY(fl_sort_by_key(sp, false, NULL, NULL, 0, 3, &d));
  say_sorted(r, "sort_by_key_desc", d, false, false);
  TRY(make_int_pairs(r->ctx, &ip));
  TRY(fl_sort_by_key(ip, true, cp_cmp_i64, NULL, 0, 4, &ua));
  say_sorted(r, "sort_by_key_cmp_asc", ua, true, true);
  TRY(fl_sort_by_key(ip, false, cp_cmp_i64, NULL, 0, 2, &ud));
  say_sorted(r, "sort_by_key_cmp_desc", ud, true, false);
done:
  fl_dataset_free(ud);
  fl_dataset_free(ua);
  fl_dataset_free(ip);
  fl_dataset_free(d);
  fl_dataset_free(a);
  fl_dataset_free(sp);
}

static void sec_joins(run *r) {
  fl_dataset *a = NULL, *b = NULL, *j = NULL, *cg = NULL, *sub = NULL;
  static const struct {
    fl_join_kind kind;
    const char *label;
  } kinds[] = {{FL_JOIN_INNER, "join_inner"}, {FL_JOIN_LEFT, "join_left"},
               {FL_JOIN_RIGHT, "join_right"}, {FL_JOIN_FULL, "join_full"}};
  TRY(make_join_inputs(r->ctx, &a, &b));
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    TRY(fl_join(a, b, kinds[i].kind, NULL, 3, &j));
    say_collected(r, kinds[i].label, j, fmt_joined, true);
    fl_dataset_free(j);
    j = NULL;
  }
  TRY(fl_cogroup(a, b, NULL, 4, &cg));
  say_collected(r, "cogroup", cg, fmt_cogroup, true);
  TRY(fl_subtract_by_key(a, b, NULL, 2, &sub));
  say_collected(r, "subtract_by_key", sub, fmt_skey_i64, true);
done:
  fl_dataset_free(sub);
  fl_dataset_free(cg);
  fl_dataset_free(j);
  fl_dataset_free(b);
  fl_dataset_free(a);
}

static void sec_partitioners(run *r) {
  fl_dataset *p = NULL, *ip = NULL, *hp = NULL, *cp = NULL, *rp = NULL, *rep = NULL;
  fl_dataset *st = NULL, *base = NULL;
  fl_partitioner *hash = NULL, *custom = NULL, *range = NULL;
  uint8_t pairs = 1;
  int64_t sum = 0;
  uint64_t n = 0;
  TRY(make_string_pairs(r->ctx, &p));
  TRY(fl_partitioner_hash(4, &hash));
  TRY(fl_partition_by(p, hash, &hp));
  TRY(fl_map_partitions(hp, cp_partition_stats, &pairs, 1, &st));
  say_collected(r, "partition_by_hash", st, fmt_partition_stats, false);
  fl_dataset_free(st);
  st = NULL;

  TRY(make_int_pairs(r->ctx, &ip));
  TRY(fl_partitioner_custom(3, cp_partition_mod, NULL, 0, &custom));
  TRY(fl_partition_by(ip, custom, &cp));
  TRY(fl_map_partitions(cp, cp_partition_stats, &pairs, 1, &st));
  say_collected(r, "partition_by_custom", st, fmt_partition_stats, false);
  fl_dataset_free(st);
  st = NULL;

  TRY(fl_partitioner_range(ip, 4, true, cp_cmp_i64, NULL, 0, &range));
  say(r, "partitioner_range: partitions=%u\n", fl_partitioner_partitions(range));
  TRY(fl_partition_by(ip, range, &rp));
  TRY(fl_map_partitions(rp, cp_partition_stats, &pairs, 1, &st));
  say_collected(r, "partition_by_range", st, fmt_partition_stats, false);
  fl_dataset_free(st);
  st = NULL;

  TRY(make_base(r->ctx, &base));
  TRY(fl_repartition(base, 5, &rep));
  TRY(fl_count(rep, &n));
  TRY(sum_i64(rep, &sum));
  say(r, "repartition: partitions=%u count=%llu sum=%lld\n", fl_dataset_partitions(rep),
      (unsigned long long)n, (long long)sum);
  TRY(fl_map_partitions(rep, cp_partition_stats, NULL, 0, &st));
  say_collected(r, "repartition_partitions", st, fmt_partition_stats, false);
done:
  fl_dataset_free(st);
  fl_dataset_free(rep);
  fl_dataset_free(base);
  fl_dataset_free(rp);
  fl_dataset_free(cp);
  fl_dataset_free(hp);
  fl_dataset_free(ip);
  fl_dataset_free(p);
  fl_partitioner_free(range);
  fl_partitioner_free(custom);
  fl_partitioner_free(hash);
}

/* Removes a folder and everything in it (ours: plain files and folders). */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
      char child[4096];
      snprintf(child, sizeof child, "%s/%s", path, e->d_name);
      struct stat st;
      if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(child);
      else unlink(child);
    }
    closedir(d);
  }
  rmdir(path);
}

#define TEXT_LINES 300

static void sec_text_files(run *r) {
  char dir[4096], input[4200], output[4200], probe[4300];
  fl_dataset *lines = NULL, *upper = NULL, *back = NULL, *bin = NULL;
  fl_records *recs = NULL;
  items want = {0}, got = {0};
  bool made_dir = false;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/flint-cluster-pipelines-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  EXPECT(mkdtemp(dir) != NULL);
  made_dir = true;
  snprintf(input, sizeof input, "%s/input.txt", dir);
  snprintf(output, sizeof output, "%s/out", dir);

  /* Lines of words, one empty and one ending in "\r\n" (read back without the '\r'). */
  static const char *words[] = {"alpha", "beta", "gamma", "delta", "epsilon"};
  FILE *f = fopen(input, "w");
  EXPECT(f != NULL);
  for (int i = 0; i < TEXT_LINES; i++) {
    char line[128];
    if (i == 17) line[0] = '\0';
    else snprintf(line, sizeof line, "line %03d %s %s", i, words[i % 5], words[(i * 3) % 5]);
    fprintf(f, "%s%s", line, i == 42 ? "\r\n" : "\n");
    for (char *c = line; *c; c++)
      if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
    if (items_add(&want, "[%s]", line) != 0) {
      fclose(f);
      EXPECT(false);
    }
  }
  EXPECT(fclose(f) == 0);
  items_sort(&want);

  TRY(fl_text_file(r->ctx, input, 3, &lines));
  uint64_t n = 0;
  TRY(fl_count(lines, &n));
  say(r, "text_file: lines=%llu\n", (unsigned long long)n);
  TRY(fl_map(lines, cp_upper, NULL, 0, &upper));
  TRY(fl_save_as_text_file(upper, output));
  /* one part file per partition, and _SUCCESS */
  uint32_t parts = 0;
  for (uint32_t i = 0; i < fl_dataset_partitions(upper); i++) {
    snprintf(probe, sizeof probe, "%s/part-%05u", output, i);
    if (access(probe, F_OK) == 0) parts++;
  }
  snprintf(probe, sizeof probe, "%s/_SUCCESS", output);
  say(r, "save_as_text_file: part_files_match_partitions=%s success_file=%s\n",
      parts == fl_dataset_partitions(upper) ? "yes" : "no", access(probe, F_OK) == 0 ? "yes" : "no");

  TRY(fl_text_file(r->ctx, output, 2, &back));
  TRY(fl_collect(back, &recs));
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    fl_bytes rec = fl_records_get(recs, i);
    EXPECT(items_add(&got, "[%.*s]", (int)rec.len, (const char *)rec.data) == 0);
  }
  items_sort(&got);
  bool same = got.n == want.n;
  for (size_t i = 0; same && i < got.n; i++) same = strcmp(got.v[i], want.v[i]) == 0;
  say(r, "text_file_readback: lines=%zu matches_written=%s\n", got.n, same ? "yes" : "no");
  /* Saving over an existing folder is refused. */
  fl_status s = fl_save_as_text_file(upper, output);
  say(r, "save_existing: %s\n", fl_status_name(s));

  /* Fixed-size binary records: 1000 int64 written here, summed there. */
  snprintf(probe, sizeof probe, "%s/records.bin", dir);
  f = fopen(probe, "wb");
  EXPECT(f != NULL);
  for (int64_t i = 0; i < 1000; i++) {
    int64_t v = base_value((size_t)i);
    if (fwrite(&v, 8, 1, f) != 1) {
      fclose(f);
      EXPECT(false);
    }
  }
  EXPECT(fclose(f) == 0);
  int64_t sum = 0;
  TRY(fl_binary_records(r->ctx, probe, 8, &bin));
  TRY(fl_count(bin, &n));
  TRY(sum_i64(bin, &sum));
  say(r, "binary_records: count=%llu sum=%lld\n", (unsigned long long)n, (long long)sum);
done:
  items_free(&got);
  items_free(&want);
  fl_records_free(recs);
  fl_dataset_free(bin);
  fl_dataset_free(back);
  fl_dataset_free(upper);
  fl_dataset_free(lines);
  if (made_dir) remove_tree(dir);
}

/* Checkpoints: a mapped dataset (children made before and after) and a shuffled one read
 * back the same records, and the counted map upstream never runs after its checkpoint. */
static void sec_checkpoint(run *r) {
  char dir[4096];
  fl_dataset *base = NULL, *copied = NULL, *before = NULL, *after = NULL, *pairs = NULL;
  fl_dataset *sums = NULL, *regrouped = NULL;
  fl_accumulator *calls = NULL;
  bool made_dir = false;
  int64_t at_checkpoint = 0, at_end = 0, sum_before = 0, sum_after = 0, three = 3;
  uint64_t n = 0;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/flint-cluster-checkpoint-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  EXPECT(mkdtemp(dir) != NULL);
  made_dir = true;
  TRY(make_base(r->ctx, &base));
  TRY(fl_accumulator_create_i64(r->ctx, &calls));
  uint64_t id = fl_accumulator_id(calls);
  TRY(fl_map(base, cp_counted_copy, &id, sizeof id, &copied));
  TRY(fl_map(copied, cp_times, &three, sizeof three, &before));
  TRY(fl_key_by(copied, cp_key_mod7, NULL, 0, &pairs));
  TRY(fl_reduce_by_key(pairs, cp_sum, NULL, 0, NULL, 4, &sums));
  say_collected(r, "checkpoint_sums_before", sums, fmt_ikey_i64, true);
  TRY(fl_checkpoint(copied, dir));
  TRY(fl_checkpoint(sums, dir));
  TRY(fl_accumulator_value_i64(calls, &at_checkpoint));
  TRY(fl_map(copied, cp_times, &three, sizeof three, &after));
  TRY(fl_count(copied, &n));
  TRY(sum_i64(before, &sum_before));
  TRY(sum_i64(after, &sum_after));
  say_collected(r, "checkpoint_sums_after", sums, fmt_ikey_i64, true);
  TRY(fl_reduce_by_key(sums, cp_sum, NULL, 0, NULL, 2, &regrouped));
  say_collected(r, "checkpoint_regrouped", regrouped, fmt_ikey_i64, true);
  TRY(fl_accumulator_value_i64(calls, &at_end));
  say(r, "checkpoint: partitions=%u/%u count=%llu sums=%lld/%lld calls=%lld upstream_calls_after=%lld\n",
      fl_dataset_partitions(copied), fl_dataset_partitions(sums), (unsigned long long)n,
      (long long)sum_before, (long long)sum_after, (long long)at_checkpoint,
      (long long)(at_end - at_checkpoint));
done:
  fl_dataset_free(regrouped);
  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_dataset_free(after);
  fl_dataset_free(before);
  fl_dataset_free(copied);
  fl_dataset_free(base);
  fl_accumulator_destroy(calls);
  if (made_dir) remove_tree(dir);
}

static void sec_user_error(run *r) {
  fl_dataset *src = NULL, *bad = NULL;
  uint64_t n = 0;
  TRY(fl_range(r->ctx, 0, 20, 1, 2, &src));
  TRY(fl_map(src, cp_fail_record, NULL, 0, &bad));
  fl_status s = fl_count(bad, &n);
  bool named = strstr(fl_last_error(), "cp_fail_record") != NULL;
  bool says_why = strstr(fl_last_error(), "refusing record") != NULL;
  say(r, "user_error: status=%s names_function=%s keeps_message=%s\n", fl_status_name(s), named ? "yes" : "no",
      says_why ? "yes" : "no");
  /* The context still runs jobs after a failed one. */
  TRY(fl_count(src, &n));
  say(r, "after_error: count=%llu\n", (unsigned long long)n);
done:
  fl_dataset_free(bad);
  fl_dataset_free(src);
}

/* Runs every section on ctx, appending the report; 0 when every call succeeded. */
CP_EXPORT int cluster_pipelines_run(fl_context *ctx, fl_buf *report) {
  run r = {ctx, report, 0};
  sec_narrow(&r);
  sec_aggregates(&r);
  sec_accumulators(&r);
  sec_broadcasts(&r);
  sec_cache(&r);
  sec_sources_and_reshaping(&r);
  sec_by_key(&r);
  sec_sort(&r);
  sec_joins(&r);
  sec_partitioners(&r);
  sec_text_files(&r);
  sec_checkpoint(&r);
  sec_user_error(&r);
  return r.rc;
}

/* One record of `bytes` (a uint32 arg) per input record, counted in the accumulator
 * `id`: partitions large enough for executors to share them in place (SHARED_BLOCK_MIN). */
typedef struct cp_big_arg {
  uint64_t accumulator;
  uint32_t bytes;
} cp_big_arg;

CP_EXPORT fl_status cp_big_record(fl_bytes rec, fl_buf *out, const void *arg) {
  cp_big_arg a;
  memcpy(&a, arg, sizeof a);
  fl_status s = fl_accumulator_add_i64(a.accumulator, 1);
  out->len = 0;
  if (s == FL_OK) s = fl_buf_reserve(out, a.bytes);
  if (s != FL_OK) return s;
  for (uint32_t i = 0; i < a.bytes; i++) out->data[i] = (uint8_t)(rec.len ? rec.data[0] + i : i);
  out->len = a.bytes;
  return FL_OK;
}

/* As cp_big_record, with the first 8 bytes the pid of the process that computed it: the
 * executor that caches it, wherever later tasks over it run (cp_head_i64 reads it back). */
CP_EXPORT fl_status cp_big_record_pid(fl_bytes rec, fl_buf *out, const void *arg) {
  fl_status s = cp_big_record(rec, out, arg);
  int64_t pid = getpid();
  if (s == FL_OK && out->len >= sizeof pid) memcpy(out->data, &pid, sizeof pid);
  return s;
}

/* A record's first 8 bytes. */
CP_EXPORT fl_status cp_head_i64(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  out->len = 0;
  return fl_buf_append(out, rec.data, rec.len < 8 ? rec.len : 8);
}

/* The executor process that runs the task, as an int64 record. */
CP_EXPORT fl_status cp_emit_pid(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  (void)in;
  (void)arg;
  int64_t pid = getpid();
  return fl_emit(out, &pid, sizeof pid);
}

/* Copies a partition; in the process whose pid is the arg's first int64 it first sleeps the
 * second one's milliseconds: one slow executor, wherever its tasks are placed. */
CP_EXPORT fl_status cp_slow_in_process(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  int64_t a[2];
  memcpy(a, arg, sizeof a);
  if (getpid() == a[0]) usleep((useconds_t)(a[1] * 1000));
  return copy_partition(in, out);
}

/* What cp_exit_if_peer and cp_slow_marked take. */
typedef struct cp_node_arg {
  int64_t pid;      /* the slow process (the owner of the partitions in mask) */
  int64_t ms;       /* how long its tasks sleep first */
  uint64_t mask;    /* cp_exit_if_peer: the partitions pid caches */
  int64_t peer_ms;  /* how long tasks in any other process sleep first (cp_slow_claimed: of
                       mask; cp_exit_if_peer: before it exits) */
  char dir[200];    /* a folder for markers */
  int64_t gated;    /* cp_slow_claimed: instead of sleeping peer_ms, wait for dir/release (at
                       most peer_ms, then leave dir/release.unreleased) */
} cp_node_arg;

/* Copies a partition; in process pid it first sleeps ms. In any other process, the first
 * task over a partition of mask (one of pid's, so a claimed offer) makes the process exit
 * after peer_ms, as a crash would, after leaving dir/crashed; later ones run. */
CP_EXPORT fl_status cp_exit_if_peer(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  cp_node_arg a;
  memcpy(&a, arg, sizeof a);
  if (getpid() == a.pid) {
    usleep((useconds_t)(a.ms * 1000));
  } else if (partition < 64 && (a.mask >> partition & 1)) {
    char path[256];
    snprintf(path, sizeof path, "%s/crashed", a.dir);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd >= 0) {
      usleep((useconds_t)(a.peer_ms * 1000));
      _exit(3);
    }
  }
  return copy_partition(in, out);
}

/* Copies a partition after sleeping ms in process pid and peer_ms in any other; every run
 * of partition p appends a byte to dir/part-p, so that a task run twice leaves two. */
CP_EXPORT fl_status cp_slow_marked(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  cp_node_arg a;
  memcpy(&a, arg, sizeof a);
  usleep((useconds_t)((getpid() == a.pid ? a.ms : a.peer_ms) * 1000));
  char path[256];
  snprintf(path, sizeof path, "%s/part-%u", a.dir, partition);
  fl_status s = append_byte(path);
  return s == FL_OK ? copy_partition(in, out) : s;
}

/* Copies a partition; in process pid it first sleeps ms, and in any other a partition of
 * mask (one of pid's, so a claimed offer) sleeps peer_ms first, or with `gated` waits for
 * dir/release. */
CP_EXPORT fl_status cp_slow_claimed(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  cp_node_arg a;
  memcpy(&a, arg, sizeof a);
  if (getpid() == a.pid) {
    usleep((useconds_t)(a.ms * 1000));
  } else if (partition < 64 && (a.mask >> partition & 1)) {
    char gate[256];
    snprintf(gate, sizeof gate, "%s/release", a.dir);
    if (!a.gated)
      usleep((useconds_t)(a.peer_ms * 1000));
    else if (!wait_file(gate, 0, a.peer_ms))
      mark_unreleased(gate);
  }
  return copy_partition(in, out);
}

/* map: copies a record, slowly. In process pid every record takes 2 ms; in any other, a
 * record of a partition in mask (one pid caches: a claimed offer) takes 100 us and appends a
 * byte to dir/stolen, so that a test sees the claimer working, and stopping. The partition
 * comes from the record: records are int64 r of fl_range(0, n, 1, P), partition r / (n / P)
 * with ms holding n / P. */
CP_EXPORT fl_status cp_crawl_if_peer(fl_bytes rec, fl_buf *out, const void *arg) {
  cp_node_arg a;
  memcpy(&a, arg, sizeof a);
  int64_t r = 0;
  if (rec.len >= sizeof r) memcpy(&r, rec.data, sizeof r);
  uint64_t partition = a.ms > 0 ? (uint64_t)(r / a.ms) : 0;
  if (getpid() == a.pid) {
    usleep(2000);
  } else if (partition < 64 && (a.mask >> partition & 1)) {
    usleep(100);
    char path[256];
    snprintf(path, sizeof path, "%s/stolen", a.dir);
    fl_status s = append_byte(path);
    if (s != FL_OK) return s;
  }
  out->len = 0;
  return fl_buf_append(out, rec.data, rec.len);
}

/* map: an int64 record r becomes (r, pid of the process that computed it): cached, the pid
 * says which executor holds the partition (cp_first_tag reads it back). */
CP_EXPORT fl_status cp_tag_pid(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t pid = getpid();
  out->len = 0;
  fl_status s = fl_buf_append(out, rec.data, rec.len);
  return s == FL_OK ? fl_buf_append(out, &pid, sizeof pid) : s;
}

/* map_partitions: the pid tag of a partition's first record (cp_tag_pid), one int64. */
CP_EXPORT fl_status cp_first_tag(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  (void)arg;
  fl_bytes rec;
  int64_t pid = 0;
  if (fl_iter_next(in, &rec) && rec.len >= 2 * sizeof pid) memcpy(&pid, rec.data + rec.len - sizeof pid, sizeof pid);
  return fl_emit(out, &pid, sizeof pid);
}
