/*
 * job_slow_sums: a job binary for test_recovery's multi-host test. It sums the numbers
 * 0..3999 by their remainder mod 7 through a shuffle, with map tasks that sleep first, so
 * that a test can cut a host off while the map stage runs; the output does not depend on
 * where tasks ran, so a run on a cluster can be compared with one on local[2].
 *
 *   flint submit --master MASTER job_slow_sums.so NAP_MS
 *
 * 16 map tasks of NAP_MS each, 4 reduce partitions. Output: one "KEY SUM" line per key, by
 * key; on failure, flint's message on stderr and exit status 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flint/flint.h"

#define JOB_EXPORT __attribute__((visibility("default")))
#define NUM_RECORDS 4000
#define MAP_PARTS 16
#define REDUCE_PARTS 4
#define NUM_KEYS 7

/* The functions travel by name in cluster mode: exported, with a prefix of their own. */
JOB_EXPORT fl_status jss_slow_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  int64_t ms;
  memcpy(&ms, arg, sizeof ms);
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) s = fl_emit(out, rec.data, rec.len);
  return s;
}

JOB_EXPORT fl_status jss_key_mod7(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(rec) % NUM_KEYS);
}

JOB_EXPORT fl_status jss_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

JOB_EXPORT int flint_main(fl_context *ctx, int argc, char **argv) {
  int64_t nap_ms = argc > 1 ? atoll(argv[1]) : 0;
  fl_dataset *src = NULL, *slow = NULL, *pairs = NULL, *sums = NULL;
  fl_records *recs = NULL;
  int64_t by_key[NUM_KEYS] = {0};
  bool seen[NUM_KEYS] = {false};
  int rc = 1;
  if (fl_range(ctx, 0, NUM_RECORDS, 1, MAP_PARTS, &src) != FL_OK ||
      fl_map_partitions(src, jss_slow_partition, &nap_ms, sizeof nap_ms, &slow) != FL_OK ||
      fl_key_by(slow, jss_key_mod7, NULL, 0, &pairs) != FL_OK ||
      fl_reduce_by_key(pairs, jss_sum, NULL, 0, NULL, REDUCE_PARTS, &sums) != FL_OK ||
      fl_collect(sums, &recs) != FL_OK) {
    fprintf(stderr, "job_slow_sums: %s\n", fl_last_error());
    goto done;
  }
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    fl_bytes k, v;
    if (fl_pair(fl_records_get(recs, i), &k, &v) != FL_OK) {
      fprintf(stderr, "job_slow_sums: %s\n", fl_last_error());
      goto done;
    }
    int64_t key = fl_i64(k);
    if (key < 0 || key >= NUM_KEYS || seen[key]) {
      fprintf(stderr, "job_slow_sums: unexpected key %lld\n", (long long)key);
      goto done;
    }
    seen[key] = true;
    by_key[key] = fl_i64(v);
  }
  for (int k = 0; k < NUM_KEYS; k++)
    if (seen[k]) printf("%d %lld\n", k, (long long)by_key[k]);
  rc = 0;
done:
  fl_records_free(recs);
  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_dataset_free(slow);
  fl_dataset_free(src);
  return rc;
}
