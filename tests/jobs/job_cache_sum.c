/*
 * job_cache_sum: a job binary for test_cluster_faults. It caches range(0, 1000) times FACTOR
 * in PARTS partitions, then sums it twice: once with reduce over the cached data, once
 * through a shuffle (reduce_by_key on x mod 7, then a sum of the sums). Both read what was
 * cached; a wrong cache or shuffle output shows as a wrong sum.
 *
 *   flint submit --master MASTER job_cache_sum.so FACTOR PARTS [WAIT_FILE]
 *
 * Output: "count N", "sum S", "shuffled sum S". With WAIT_FILE, it then keeps its application
 * open until that file exists (at most 50 s) and runs the sums once more on the same context,
 * printing "again: sum S" or the error on stderr ("again failed: ...") and exit status 2.
 * Exit status 1 when the first run fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flint/flint.h"

#define JOB_EXPORT __attribute__((visibility("default")))
#define NUM_RECORDS 1000
#define NUM_KEYS 7

JOB_EXPORT fl_status jcs_times(fl_bytes rec, fl_buf *out, const void *arg) {
  int64_t factor;
  memcpy(&factor, arg, sizeof factor);
  return fl_buf_put_i64(out, fl_i64(rec) * factor);
}

JOB_EXPORT fl_status jcs_mod7(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(rec) % NUM_KEYS);
}

JOB_EXPORT fl_status jcs_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) + fl_i64(b));
}

/* count, sum and shuffled sum of the cached data, printed; FL_OK or the failed call's. */
static fl_status sums(fl_dataset *cached, const char *prefix) {
  fl_dataset *pairs = NULL, *by_key = NULL;
  fl_records *groups = NULL;
  fl_buf sum = FL_BUF_INIT;
  int64_t shuffled = 0;
  uint64_t n = 0;
  fl_status s = fl_count(cached, &n);
  if (s == FL_OK) s = fl_reduce(cached, jcs_add, NULL, 0, &sum);
  if (s == FL_OK) s = fl_key_by(cached, jcs_mod7, NULL, 0, &pairs);
  if (s == FL_OK) s = fl_reduce_by_key(pairs, jcs_add, NULL, 0, NULL, 3, &by_key);
  if (s == FL_OK) s = fl_collect(by_key, &groups);
  for (size_t i = 0; s == FL_OK && i < fl_records_count(groups); i++) {
    fl_bytes key, value;
    s = fl_pair(fl_records_get(groups, i), &key, &value);
    if (s == FL_OK) shuffled += fl_i64(value);
  }
  if (s == FL_OK) {
    printf("%scount %llu\n%ssum %lld\n%sshuffled sum %lld\n", prefix, (unsigned long long)n, prefix,
           (long long)fl_i64((fl_bytes){sum.data, sum.len}), prefix,
           (long long)shuffled);
    fflush(stdout);
  }
  fl_buf_free(&sum);
  fl_records_free(groups);
  fl_dataset_free(by_key);
  fl_dataset_free(pairs);
  return s;
}

JOB_EXPORT int flint_main(fl_context *ctx, int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: job_cache_sum.so FACTOR PARTS [WAIT_FILE]\n");
    return 1;
  }
  int64_t factor = atoll(argv[1]);
  uint32_t parts = (uint32_t)atoi(argv[2]);
  fl_dataset *src = NULL, *cached = NULL;
  int rc = 1;
  if (fl_range(ctx, 0, NUM_RECORDS, 1, parts, &src) != FL_OK ||
      fl_map(src, jcs_times, &factor, sizeof factor, &cached) != FL_OK || fl_cache(cached) != FL_OK ||
      sums(cached, "") != FL_OK) {
    fprintf(stderr, "job_cache_sum failed: %s\n", fl_last_error());
    goto done;
  }
  rc = 0;
  if (argc > 3) {
    for (int i = 0; i < 5000 && access(argv[3], F_OK) != 0; i++) {
      struct timespec ts = {0, 10000000};
      nanosleep(&ts, NULL);
    }
    if (sums(cached, "again: ") != FL_OK) {
      fprintf(stderr, "again failed: %s\n", fl_last_error());
      rc = 2;
    }
  }
done:
  fl_dataset_free(cached);
  fl_dataset_free(src);
  return rc;
}
