/*
 * bench_local: three measurements of flint's local backend, through the public API only.
 *
 *   bench_local [--json] [--records N] [--iterations N]
 *
 * 1. count_cached_latency: the fixed cost of running one job. A 16-partition range of
 *    16,000 int64 records is cached in local[2]; after one warm-up count (which fills the
 *    cache), --iterations counts (default 2000) are timed one by one with CLOCK_MONOTONIC
 *    and their p50 and p99 latencies reported. A count over cached partitions does almost no
 *    work per record, so this is the scheduling overhead an interactive or iterative
 *    program pays per action (16 tasks launched, run and collected). Target: p50 <= 100 us.
 *
 * 2. map_reduce_100M: the per-record cost of the engine's data path. fl_range over
 *    --records int64 values (default 100,000,000; default partitions, i.e. one per thread)
 *    is mapped through mix_record() and summed with fl_reduce (wrapping int64 add) in
 *    local[2]. The baseline is a plain C loop on one core, in the same process and run,
 *    over the SAME values calling the SAME static inline mix_record() and summing the same
 *    way: what a programmer would write without an engine. The ratio engine/loop of
 *    records per second says how much of one core's plain-C speed the engine keeps with
 *    two threads; the target is ratio >= 0.5 (two threads may lose up to 4x per record to
 *    the engine's iterators, function pointers and record buffers, but no more). Each side
 *    runs 3 times (alternating) and the best time of each is reported. Opening the context
 *    (thread start-up) is outside the timings; building the range and map datasets is
 *    inside the engine's. The loop's values are made opaque to the optimiser (see
 *    loop_sum) so that it multiplies per record as the engine must. Also reported: the
 *    time per record of one task thread and of the loop, which show the engine's
 *    per-record overhead directly. The two sums are printed and compared: if they differ,
 *    the benchmark fails (exit 1), since a fast wrong answer measures nothing.
 *
 * 3. map_reduce_100M_splitmix: row 2 again, by the same code path and method (same range,
 *    partitions, reduce, runs, timing and sum check), with the splitmix64 finalizer as the
 *    per-record function in both the map and the loop: an add, three xor-shifts and two
 *    64-bit multiplies, against mix_record's one multiply and one xor-shift. It has no
 *    target; it is there to read row 2's ratio against. Row 2's loop does sub-nanosecond
 *    work per record (about 0.4 ns), so any per-record function call (about 1.5 ns), and
 *    the engine makes two per record (map and reduce, through pointers), dominates row 2's
 *    ratio however lean the rest of the data path is. Row 3 shows the ratio when a
 *    record's own arithmetic costs more, so that the engine's fixed per-record overhead
 *    can be read against the arithmetic's cost: engine_ns_per_record_per_thread minus
 *    loop_ns_per_record, taken in both rows, estimates that overhead twice, and if the two
 *    estimates agree the overhead is a fixed cost per record, not a multiple of the work.
 *    (Successive records' multiplies overlap in the pipeline, so the splitmix loop still
 *    runs at about 0.8 ns a record on the 2-core machine this was written on: twice row
 *    2's, not the ~15 cycles of its dependency chain.)
 *
 * Output: a table on stdout, or with --json one JSON object per row (same figures) and
 * nothing else on stdout; row 3 has target and met null in JSON ("(info)" and "-" in the
 * table) and a "purpose" key. Exit status: 0 when the runs completed and the sums agree (a
 * missed target is reported, not an error); 1 on an engine error or a sum mismatch in
 * either map_reduce row; 2 on a bad option.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flint/flint.h"

#define BENCH_NAME "bench_local"
#include "bench_util.h"

#define MASTER "local[2]"
#define LATENCY_RECORDS 16000
#define LATENCY_PARTITIONS 16
#define LATENCY_TARGET_P50_US 100.0
#define MAP_REDUCE_RUNS 3
#define MAP_REDUCE_TARGET_RATIO 0.5

typedef struct options {
  bool json;
  uint64_t records;
  uint64_t iterations;
} options;


/* ---- count_cached_latency ------------------------------------------------------------ */

typedef struct latency_result {
  uint64_t iterations;
  double p50_us, p99_us, mean_us, min_us, max_us;
  bool met;
} latency_result;

/* The value at quantile q (0..1) of sorted samples: the smallest sample with at least a
 * fraction q of the samples at or below it (nearest rank). */
static double quantile(const double *sorted, size_t n, double q) {
  size_t rank = (size_t)(q * (double)n + 0.999999999);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return sorted[rank - 1];
}

static int bench_count_latency(const options *o, latency_result *res) {
  fl_context *ctx = NULL;
  fl_dataset *ds = NULL;
  double *samples = calloc(o->iterations, sizeof *samples);
  int rc = 1;
  if (!samples) {
    fprintf(stderr, "bench_local: out of memory\n");
    return 1;
  }
  if (fl_context_open(MASTER, NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    goto done;
  }
  if (fl_range(ctx, 0, LATENCY_RECORDS, 1, LATENCY_PARTITIONS, &ds) != FL_OK ||
      fl_cache(ds) != FL_OK) {
    fail_flint("fl_range/fl_cache");
    goto done;
  }
  uint64_t n = 0;
  if (fl_count(ds, &n) != FL_OK) { /* warm-up: computes and caches the 16 partitions */
    fail_flint("fl_count (warm-up)");
    goto done;
  }
  if (n != LATENCY_RECORDS) {
    fprintf(stderr, "bench_local: warm-up count is %" PRIu64 ", expected %d\n", n, LATENCY_RECORDS);
    goto done;
  }
  double sum = 0;
  for (uint64_t i = 0; i < o->iterations; i++) {
    double t0 = now_s();
    fl_status s = fl_count(ds, &n);
    double t1 = now_s();
    if (s != FL_OK) {
      fail_flint("fl_count");
      goto done;
    }
    if (n != LATENCY_RECORDS) {
      fprintf(stderr, "bench_local: count %" PRIu64 " is %" PRIu64 ", expected %d\n", i, n,
              LATENCY_RECORDS);
      goto done;
    }
    samples[i] = (t1 - t0) * 1e6;
    sum += samples[i];
  }
  qsort(samples, o->iterations, sizeof *samples, bench_cmp_double);
  res->iterations = o->iterations;
  res->p50_us = quantile(samples, o->iterations, 0.50);
  res->p99_us = quantile(samples, o->iterations, 0.99);
  res->mean_us = sum / (double)o->iterations;
  res->min_us = samples[0];
  res->max_us = samples[o->iterations - 1];
  res->met = res->p50_us <= LATENCY_TARGET_P50_US;
  rc = 0;
done:
  fl_dataset_free(ds);
  fl_context_close(ctx);
  free(samples);
  return rc;
}

/* ---- map_reduce_100M and map_reduce_100M_splitmix ---------------------------------- */

/* The per-record work of map_reduce_100M, shared by the engine's map function and the plain
 * loop: a multiplicative hash (Knuth's constant) folded with a shift, in wrapping uint64. */
static inline int64_t mix_record(int64_t x) {
  uint64_t u = (uint64_t)x;
  return (int64_t)((u * 2654435761u) ^ (u >> 7));
}

/* The per-record work of map_reduce_100M_splitmix: the splitmix64 finalizer (golden-ratio
 * increment, then three xor-shift and multiply rounds), in wrapping uint64. */
static inline int64_t splitmix_record(int64_t x) {
  uint64_t z = (uint64_t)x + 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return (int64_t)(z ^ (z >> 31));
}

static inline int64_t wrapping_add(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a + (uint64_t)b);
}

/* The engine's map functions: one record in, record_fn(record) out. */
static fl_status map_mix(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, mix_record(fl_i64(rec)));
}

static fl_status map_splitmix(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, splitmix_record(fl_i64(rec)));
}

static fl_status reduce_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, wrapping_add(fl_i64(a), fl_i64(b)));
}

/* The baseline: the same values as fl_range(0, n, 1), the same function, the same sum.
 * loop_sum is always inlined into one noinline wrapper per record function (loop_sum_mix,
 * loop_sum_splitmix below), where `record_fn` is a constant: the compiler inlines it, so
 * each wrapper is a plain loop with the arithmetic in its body and no call per record.
 * noinline and a volatile bound keep the compiler from merging or hoisting the repeated
 * runs; the caller prints and checks the result, so the loop cannot be dropped.
 *
 * The empty asm makes each value opaque to the optimiser (it emits no instruction). Without
 * it, GCC sees that the values are consecutive and strength-reduces `i * 2654435761` to
 * one add per step, so the loop would no longer do the multiply the engine's map function
 * must do on each record it is given; the baseline would then measure the compiler's
 * knowledge of the range, not the per-record work. The loop still runs as plain C (and on
 * the 2-core machine this was written on, both forms ran at about 0.4 ns a record). */
static inline __attribute__((always_inline)) int64_t loop_sum(uint64_t n,
                                                              int64_t (*record_fn)(int64_t)) {
  volatile uint64_t bound = n;
  uint64_t end = bound;
  int64_t sum = 0;
  for (uint64_t i = 0; i < end; i++) {
    int64_t x = (int64_t)i;
    __asm__("" : "+r"(x));
    sum = wrapping_add(sum, record_fn(x));
  }
  return sum;
}

__attribute__((noinline)) static int64_t loop_sum_mix(uint64_t n) {
  return loop_sum(n, mix_record);
}

__attribute__((noinline)) static int64_t loop_sum_splitmix(uint64_t n) {
  return loop_sum(n, splitmix_record);
}

/* One map_reduce row: the engine's map function and the loop that computes the same sum
 * in plain C, both over the same record function. */
typedef struct map_reduce_bench {
  const char *name;
  fl_map_fn map;
  int64_t (*loop)(uint64_t n);
  double target_ratio; /* met when ratio >= target_ratio; 0: no target (an "(info)" row) */
  const char *purpose; /* for a row with no target: why it is there (JSON "purpose") */
} map_reduce_bench;

static const map_reduce_bench map_reduce_benches[] = {
    {"map_reduce_100M", map_mix, loop_sum_mix, MAP_REDUCE_TARGET_RATIO, NULL},
    {"map_reduce_100M_splitmix", map_splitmix, loop_sum_splitmix, 0,
     "shows the ratio for a heavier per-record function (the splitmix64 finalizer: two "
     "multiplies and three xor-shifts, against one multiply and one xor-shift in "
     "map_reduce_100M), so that the engine's fixed per-record overhead can be read against "
     "the arithmetic's cost"},
};
#define MAP_REDUCE_BENCHES (sizeof map_reduce_benches / sizeof map_reduce_benches[0])

static int engine_sum(fl_context *ctx, uint64_t n, fl_map_fn map, int64_t *out) {
  fl_dataset *range = NULL, *mapped = NULL;
  fl_buf sum = FL_BUF_INIT;
  int rc = 1;
  if (fl_range(ctx, 0, (int64_t)n, 1, 0, &range) != FL_OK ||
      fl_map(range, map, NULL, 0, &mapped) != FL_OK ||
      fl_reduce(mapped, reduce_sum, NULL, 0, &sum) != FL_OK) {
    fail_flint("map_reduce (fl_range/fl_map/fl_reduce)");
    goto done;
  }
  if (sum.len != 8) {
    fprintf(stderr, "bench_local: reduce returned %zu bytes, expected 8\n", sum.len);
    goto done;
  }
  *out = fl_i64(fl_buf_bytes(&sum));
  rc = 0;
done:
  fl_buf_free(&sum);
  fl_dataset_free(mapped);
  fl_dataset_free(range);
  return rc;
}

typedef struct map_reduce_result {
  const map_reduce_bench *bench;
  uint64_t records;
  uint32_t partitions;
  double engine_best_s, loop_best_s;
  double engine_rps, loop_rps, ratio;
  double engine_ns_per_record_thread, loop_ns_per_record;
  int64_t engine_sum, loop_sum;
  bool sums_equal, met; /* met: false for a row with no target */
} map_reduce_result;

static int bench_map_reduce(const options *o, const map_reduce_bench *b, map_reduce_result *res) {
  fl_context *ctx = NULL;
  int rc = 1;
  if (fl_context_open(MASTER, NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    return 1;
  }
  res->bench = b;
  res->records = o->records;
  res->partitions = fl_context_cores(ctx); /* fl_range with 0 partitions: the default */
  res->engine_best_s = res->loop_best_s = 1e300;
  res->sums_equal = true;
  for (int run = 0; run < MAP_REDUCE_RUNS; run++) {
    int64_t es = 0, ls;
    double t0 = now_s();
    if (engine_sum(ctx, o->records, b->map, &es) != 0) goto done;
    double t1 = now_s();
    ls = b->loop(o->records);
    double t2 = now_s();
    if (t1 - t0 < res->engine_best_s) res->engine_best_s = t1 - t0;
    if (t2 - t1 < res->loop_best_s) res->loop_best_s = t2 - t1;
    if (run > 0 && (es != res->engine_sum || ls != res->loop_sum)) res->sums_equal = false;
    res->engine_sum = es;
    res->loop_sum = ls;
    if (es != ls) res->sums_equal = false;
  }
  res->engine_rps = (double)o->records / res->engine_best_s;
  res->loop_rps = (double)o->records / res->loop_best_s;
  res->ratio = res->engine_rps / res->loop_rps;
  /* Thread time per record: wall time times the task threads, all busy on the range. */
  res->engine_ns_per_record_thread =
      res->engine_best_s * 1e9 * fl_context_cores(ctx) / (double)o->records;
  res->loop_ns_per_record = res->loop_best_s * 1e9 / (double)o->records;
  res->met = b->target_ratio > 0 && res->ratio >= b->target_ratio;
  rc = 0;
done:
  fl_context_close(ctx);
  return rc;
}

/* ---- output -------------------------------------------------------------------------- */

#define BENCH_COLUMN 24 /* wide enough for "map_reduce_100M_splitmix" */

static void print_table_header(const options *o) {
  printf("flint bench_local (flint %s, master %s)\n", FL_VERSION_STRING, MASTER);
  printf("  count_cached_latency: %d records in %d cached partitions, 1 warm-up count, "
         "%" PRIu64 " timed counts\n",
         LATENCY_RECORDS, LATENCY_PARTITIONS, o->iterations);
  printf("  map_reduce_100M: %" PRIu64 " int64 records, map + reduce (sum) vs a plain C "
         "loop on one core; best of %d runs each\n",
         o->records, MAP_REDUCE_RUNS);
  printf("  map_reduce_100M_splitmix: the same with the splitmix64 finalizer per record "
         "(2 multiplies); no target, for reading the ratio against heavier work\n\n");
  printf("%-*s %-32s %22s  %-12s %s\n", BENCH_COLUMN, "bench", "metric", "value", "target",
         "met");
  printf("%-*s %-32s %22s  %-12s %s\n", BENCH_COLUMN, "------------------------",
         "--------------------------------", "----------------------", "------------", "---");
}

static const bench_columns columns = {BENCH_COLUMN, 32, 22, 12};

static void print_row(const char *bench, const char *metric, const char *value, const char *target,
                      const char *met) {
  bench_print_row(&columns, bench, metric, value, target, met);
}

static void print_latency(const options *o, const latency_result *r) {
  char v[64];
  if (o->json) {
    printf("{\"bench\": \"count_cached_latency\", \"master\": \"%s\", \"records\": %d, "
           "\"partitions\": %d, \"iterations\": %" PRIu64 ", \"p50_us\": %.2f, \"p99_us\": %.2f, "
           "\"mean_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"target\": \"p50_us <= %.0f\", "
           "\"met\": %s}\n",
           MASTER, LATENCY_RECORDS, LATENCY_PARTITIONS, r->iterations, r->p50_us, r->p99_us,
           r->mean_us, r->min_us, r->max_us, LATENCY_TARGET_P50_US, r->met ? "true" : "false");
    return;
  }
  char target[32];
  snprintf(target, sizeof target, "<= %.0f us", LATENCY_TARGET_P50_US);
  snprintf(v, sizeof v, "%.2f", r->p50_us);
  print_row("count_cached_latency", "p50_us", v, target, r->met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.2f", r->p99_us);
  print_row("", "p99_us", v, "", "");
  snprintf(v, sizeof v, "%.2f", r->mean_us);
  print_row("", "mean_us", v, "", "");
}

static void print_map_reduce(const options *o, const map_reduce_result *r) {
  const map_reduce_bench *b = r->bench;
  bool has_target = b->target_ratio > 0;
  char v[64];
  if (o->json) {
    printf("{\"bench\": \"%s\", \"master\": \"%s\", \"records\": %" PRIu64 ", "
           "\"partitions\": %u, \"runs\": %d, \"engine_best_s\": %.4f, \"loop_best_s\": %.4f, "
           "\"engine_records_per_s\": %.0f, \"loop_records_per_s\": %.0f, \"ratio\": %.3f, "
           "\"engine_ns_per_record_per_thread\": %.2f, \"loop_ns_per_record\": %.2f, "
           "\"engine_sum\": %" PRId64 ", \"loop_sum\": %" PRId64 ", \"sums_equal\": %s, ",
           b->name, MASTER, r->records, r->partitions, MAP_REDUCE_RUNS, r->engine_best_s,
           r->loop_best_s, r->engine_rps, r->loop_rps, r->ratio, r->engine_ns_per_record_thread,
           r->loop_ns_per_record, r->engine_sum, r->loop_sum, r->sums_equal ? "true" : "false");
    if (has_target)
      printf("\"target\": \"ratio >= %.1f\", \"met\": %s}\n", b->target_ratio,
             r->met ? "true" : "false");
    else
      printf("\"target\": null, \"met\": null, \"purpose\": \"%s\"}\n", b->purpose);
    return;
  }
  char target[32];
  if (has_target)
    snprintf(target, sizeof target, ">= %.1f", b->target_ratio);
  else
    snprintf(target, sizeof target, "(info)");
  const char *met = !has_target ? "-" : r->met ? "yes" : "NO";
  snprintf(v, sizeof v, "%.0f", r->engine_rps);
  print_row(b->name, "engine_records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.0f", r->loop_rps);
  print_row("", "loop_records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->ratio);
  print_row("", "ratio", v, target, met);
  snprintf(v, sizeof v, "%.2f", r->engine_ns_per_record_thread);
  print_row("", "engine_ns_per_record_per_thread", v, "", "");
  snprintf(v, sizeof v, "%.2f", r->loop_ns_per_record);
  print_row("", "loop_ns_per_record", v, "", "");
  snprintf(v, sizeof v, "%.4f", r->engine_best_s);
  print_row("", "engine_best_s", v, "", "");
  snprintf(v, sizeof v, "%.4f", r->loop_best_s);
  print_row("", "loop_best_s", v, "", "");
  snprintf(v, sizeof v, "%" PRId64, r->engine_sum);
  print_row("", "engine_sum", v, "", "");
  snprintf(v, sizeof v, "%" PRId64, r->loop_sum);
  print_row("", "loop_sum", v, "", r->sums_equal ? "" : "MISMATCH");
}

/* ---- options ------------------------------------------------------------------------- */

static const char usage_text[] =
    "usage: bench_local [--json] [--records N] [--iterations N]\n"
    "  --json          one JSON object per row instead of a table\n"
    "  --records N     records for map_reduce_100M and map_reduce_100M_splitmix\n"
    "                  (default 100000000)\n"
    "  --iterations N  timed counts for count_cached_latency (default 2000)\n"
    "  --help          this text\n";

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "bench_local: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage_text);
  return 2;
}


int main(int argc, char **argv) {
  options o = {false, 100000000ull, 2000};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      o.json = true;
      continue;
    }
    if (strcmp(argv[i], "--records") == 0 || strcmp(argv[i], "--iterations") == 0) {
      if (i + 1 >= argc) return usage_error("%s needs a value", argv[i]);
      uint64_t *dst = strcmp(argv[i], "--records") == 0 ? &o.records : &o.iterations;
      if (!parse_count(argv[i + 1], INT64_MAX, dst)) {
        fprintf(stderr, "bench_local: %s '%s' is not a positive whole number\n%s", argv[i],
                argv[i + 1], usage_text);
        return 2;
      }
      i++;
      continue;
    }
    return usage_error("unknown option '%s'", argv[i]);
  }

  latency_result lat = {0};
  map_reduce_result mr[MAP_REDUCE_BENCHES] = {{0}};
  if (bench_count_latency(&o, &lat) != 0) return 1;
  for (size_t i = 0; i < MAP_REDUCE_BENCHES; i++)
    if (bench_map_reduce(&o, &map_reduce_benches[i], &mr[i]) != 0) return 1;

  if (!o.json) print_table_header(&o);
  print_latency(&o, &lat);
  for (size_t i = 0; i < MAP_REDUCE_BENCHES; i++) print_map_reduce(&o, &mr[i]);
  fflush(stdout);
  int rc = 0;
  for (size_t i = 0; i < MAP_REDUCE_BENCHES; i++) {
    if (mr[i].sums_equal) continue;
    fprintf(stderr,
            "bench_local: %s: engine sum %" PRId64 " differs from loop sum %" PRId64
            " (or a run differed from another)\n",
            mr[i].bench->name, mr[i].engine_sum, mr[i].loop_sum);
    rc = 1;
  }
  return rc;
}
