/*
 * bench_recovery_fns: the user functions of bench_recovery, in a shared library of their own
 * (cluster mode ships functions as (library, symbol); see bench_cluster_fns.c). Names start
 * with brf_. The layouts of brf_gen_args, brf_figures and brf_probe are repeated in
 * bench_recovery.c.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "flint/flint.h"
#include "splitmix.h"

#define BRF_EXPORT __attribute__((visibility("default")))

/* What brf_generate makes of one partition index. */
typedef struct brf_gen_args {
  uint64_t records; /* records per index */
  uint64_t rounds;  /* splitmix rounds per record: the deterministic cost */
} brf_gen_args;

/* flat_map: int64 index p -> `records` uint64 records, record j being `rounds` dependent
 * splitmix64 rounds of p * records + j. The cost per record is fixed (a chain of multiplies
 * that the compiler cannot shorten), so every partition costs the same to compute. */
BRF_EXPORT fl_status brf_generate(fl_bytes rec, fl_emitter *out, const void *arg) {
  brf_gen_args a;
  memcpy(&a, arg, sizeof a);
  uint64_t p = (uint64_t)fl_i64(rec);
  for (uint64_t j = 0; j < a.records; j++) {
    uint64_t x = p * a.records + j;
    for (uint64_t r = 0; r < a.rounds; r++) x = splitmix(x);
    fl_status s = fl_emit(out, &x, sizeof x);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

/* One iteration's figures over the records: their number and a sum that depends on the
 * iteration, so that every iteration reads every record and has its own answer. */
typedef struct brf_figures {
  uint64_t count, sum;
} brf_figures;

/* aggregate seq: acc += record; arg: the uint64 iteration number. */
BRF_EXPORT fl_status brf_step(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  uint64_t iter, x;
  brf_figures f;
  if (acc.len != sizeof f || rec.len != sizeof x)
    return fl_set_error(FL_EFORMAT, "figures of %zu bytes and a record of %zu, expected %zu and 8", acc.len,
                        rec.len, sizeof f);
  memcpy(&iter, arg, sizeof iter);
  memcpy(&f, acc.data, sizeof f);
  memcpy(&x, rec.data, sizeof x);
  f.count++;
  f.sum += splitmix(x ^ (iter * 0xd6e8feb86659fd93u));
  return fl_buf_append(out, &f, sizeof f);
}

/* aggregate seq as brf_step, with more work a record: arg {iteration, rounds}, each record
 * put through `rounds` dependent splitmix64 rounds (tasks long enough that which executor
 * runs them, not the job's fixed cost, sets the time). */
BRF_EXPORT fl_status brf_heavy_step(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  uint64_t a[2], x;
  brf_figures f;
  if (acc.len != sizeof f || rec.len != sizeof x)
    return fl_set_error(FL_EFORMAT, "figures of %zu bytes and a record of %zu, expected %zu and 8", acc.len,
                        rec.len, sizeof f);
  memcpy(a, arg, sizeof a);
  memcpy(&f, acc.data, sizeof f);
  memcpy(&x, rec.data, sizeof x);
  for (uint64_t r = 0; r < a[1]; r++) x = splitmix(x ^ (a[0] * 0xd6e8feb86659fd93u));
  f.count++;
  f.sum += x;
  return fl_buf_append(out, &f, sizeof f);
}

/* aggregate comb. */
BRF_EXPORT fl_status brf_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  brf_figures x, y;
  if (a.len != sizeof x || b.len != sizeof y) return fl_set_error(FL_EFORMAT, "figures of %zu and %zu bytes", a.len, b.len);
  memcpy(&x, a.data, sizeof x);
  memcpy(&y, b.data, sizeof y);
  x.count += y.count;
  x.sum += y.sum;
  return fl_buf_append(out, &x, sizeof x);
}

/* Where a partition was read: its index, the process that read it and its records. */
typedef struct brf_probe {
  uint64_t partition, pid, records;
} brf_probe;

/* map_partitions: one brf_probe per partition. */
BRF_EXPORT fl_status brf_probe_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)arg;
  brf_probe p = {partition, (uint64_t)getpid(), 0};
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) p.records++;
  return fl_emit(out, &p, sizeof p);
}
