/*
 * bench_cluster_fns: the user functions of bench_cluster, in a shared library of their own.
 * In cluster mode functions travel to executor processes as (library, symbol) and the engine
 * finds the library with dladdr, so they must live in a shared library and be exported
 * (non-static, default visibility); the same functions run in local mode. Names start with
 * bcf_ so that they cannot clash with the program's symbols.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "flint/flint.h"
#include "splitmix.h"

#define BCF_EXPORT __attribute__((visibility("default")))

/* ---- reduce_by_key -------------------------------------------------------------------- */

/* The figures the aggregate computes over the (key, sum) pairs; bench_cluster.c has the same
 * layout. */
typedef struct bcf_figures {
  uint64_t keys, sum, checksum;
} bcf_figures;

BCF_EXPORT uint64_t bcf_key(uint64_t i, uint64_t keys) { return splitmix(i) % keys; }

/* i -> (key splitmix64(i) % keys as 8 bytes, i as int64); arg: the uint64 number of keys. */
BCF_EXPORT fl_status bcf_make_pair(fl_bytes rec, fl_buf *out, const void *arg) {
  uint64_t keys;
  memcpy(&keys, arg, sizeof keys);
  int64_t i = fl_i64(rec);
  uint64_t key = splitmix((uint64_t)i) % keys;
  return fl_buf_put_pair(out, fl_bytes_of(&key, 8), fl_bytes_of(&i, 8));
}

/* Wrapping int64 add. */
BCF_EXPORT fl_status bcf_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

/* What the checksum adds up for one key and its sum. */
BCF_EXPORT uint64_t bcf_digest(uint64_t key, uint64_t sum) {
  return splitmix(key * 0xd6e8feb86659fd93u ^ sum);
}

/* aggregate: figures += one (key, sum) pair. */
BCF_EXPORT fl_status bcf_fold(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  bcf_figures f;
  fl_bytes key, value;
  fl_status s = fl_pair(rec, &key, &value);
  if (s != FL_OK) return s;
  if (key.len != 8 || value.len != 8 || acc.len != sizeof f)
    return fl_set_error(FL_EFORMAT, "result pair of %zu + %zu bytes, expected 8 + 8", key.len, value.len);
  memcpy(&f, acc.data, sizeof f);
  uint64_t k = (uint64_t)fl_i64(key), v = (uint64_t)fl_i64(value);
  f.keys++;
  f.sum += v;
  f.checksum += bcf_digest(k, v);
  return fl_buf_append(out, &f, sizeof f);
}

BCF_EXPORT fl_status bcf_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  bcf_figures x, y;
  if (a.len != sizeof x || b.len != sizeof y)
    return fl_set_error(FL_EFORMAT, "figures of %zu and %zu bytes", a.len, b.len);
  memcpy(&x, a.data, sizeof x);
  memcpy(&y, b.data, sizeof y);
  x.keys += y.keys;
  x.sum += y.sum;
  x.checksum += y.checksum;
  return fl_buf_append(out, &x, sizeof x);
}

/* ---- broadcast_100MB ------------------------------------------------------------------ */

/* What a probe task returns: the broadcast's length as the task saw it, the process it ran
 * in (so the program can check that each executor ran one task) and a digest of samples of
 * the bytes (so it can check that they arrived whole, without hashing 100 MB in the timing). */
typedef struct bcf_probe {
  uint64_t len, pid, digest;
} bcf_probe;

/* A cheap digest of `len` bytes: the length and one 8-byte word every 64 KiB, the last word
 * included, each mixed with its offset. The program computes it over its own copy. */
BCF_EXPORT uint64_t bcf_sample_digest(const uint8_t *data, size_t len) {
  uint64_t h = splitmix(len);
  if (len < 8) {
    for (size_t i = 0; i < len; i++) h = splitmix(h ^ data[i]);
    return h;
  }
  for (size_t off = 0;; off += 65536) {
    size_t at = off + 8 <= len ? off : len - 8;
    uint64_t w;
    memcpy(&w, data + at, 8);
    h = splitmix(h ^ w ^ ((uint64_t)at << 1));
    if (at == len - 8) break;
  }
  return h;
}

/* map over a one-record partition: reads broadcast `arg` (its uint64 id) and returns a
 * bcf_probe. The first read in an executor fetches the value from the driver. */
BCF_EXPORT fl_status bcf_broadcast_probe(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)rec;
  uint64_t id;
  memcpy(&id, arg, sizeof id);
  fl_bytes v;
  fl_status s = fl_broadcast_value(id, &v);
  if (s != FL_OK) return s;
  bcf_probe p = {v.len, (uint64_t)getpid(), bcf_sample_digest(v.data, v.len)};
  return fl_buf_append(out, &p, sizeof p);
}
