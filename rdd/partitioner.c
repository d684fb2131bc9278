/* partitioner.c: where a key goes: hash, range (boundaries sampled from the data, made by
 * partitioner_range.c) or a user function. Datasets hold references to their partitioner, so that a dataset already
 * partitioned the way a wide operation needs is combined without another shuffle. */
#include <string.h>

#include "rdd/rdd.h"

fl_partitioner *rdd_partitioner_new(rdd_partitioner_kind kind, uint32_t n, const void *arg, size_t arg_len) {
  fl_partitioner *p = common_calloc(1, sizeof *p);
  if (!p) return NULL;
  if (arg_len && !(p->arg = common_memdup(arg, arg_len))) {
    common_free(p);
    return NULL;
  }
  atomic_init(&p->refs, 1);
  p->kind = kind;
  p->num_partitions = n;
  p->arg_len = arg_len;
  return p;
}

fl_status fl_partitioner_hash(uint32_t num_partitions, fl_partitioner **out) {
  common_error_clear();
  if (!out || num_partitions == 0)
    return FL_ERR(FL_EINVAL, "fl_partitioner_hash: num_partitions must be > 0");
  if (!(*out = rdd_partitioner_new(PARTITIONER_HASH, num_partitions, NULL, 0)))
    return FL_ERR(FL_ENOMEM, "cannot allocate a partitioner");
  return FL_OK;
}

fl_status fl_partitioner_custom(uint32_t num_partitions, fl_partition_fn fn, const void *arg,
                                size_t arg_len, fl_partitioner **out) {
  common_error_clear();
  if (!out || !fn || num_partitions == 0 || (arg_len && !arg))
    return FL_ERR(FL_EINVAL, "fl_partitioner_custom: needs a function and num_partitions > 0");
  fl_partitioner *p = rdd_partitioner_new(PARTITIONER_CUSTOM, num_partitions, arg, arg_len);
  if (!p) return FL_ERR(FL_ENOMEM, "cannot allocate a partitioner");
  p->fn = fn;
  *out = p;
  return FL_OK;
}

uint32_t fl_partitioner_partitions(const fl_partitioner *p) { return p ? p->num_partitions : 0; }

void fl_partitioner_free(fl_partitioner *p) {
  if (p) rdd_partitioner_release(p);
}

void rdd_partitioner_retain(const fl_partitioner *p) {
  atomic_fetch_add_explicit(&((fl_partitioner *)p)->refs, 1, memory_order_relaxed);
}

void rdd_partitioner_release(const fl_partitioner *cp) {
  fl_partitioner *p = (fl_partitioner *)cp;
  if (!p || atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1) return;
  rdd_batch_free(&p->bounds);
  common_free(p->bound_views);
  common_free(p->arg);
  common_free(p);
}

bool rdd_partitioner_equal(const fl_partitioner *a, const fl_partitioner *b) {
  if (a == b) return true;
  if (!a || !b || a->kind != b->kind || a->num_partitions != b->num_partitions) return false;
  bool same_arg = a->arg_len == b->arg_len && (a->arg_len == 0 || memcmp(a->arg, b->arg, a->arg_len) == 0);
  switch (a->kind) {
  case PARTITIONER_HASH: return true;
  case PARTITIONER_CUSTOM: return a->fn == b->fn && same_arg;
  case PARTITIONER_RANGE:
    return a->compare == b->compare && a->ascending == b->ascending && same_arg &&
           a->bounds.buf.len == b->bounds.buf.len &&
           (a->bounds.buf.len == 0 || memcmp(a->bounds.buf.data, b->bounds.buf.data, a->bounds.buf.len) == 0);
  }
  return false;
}

uint32_t rdd_partitioner_place(const fl_partitioner *p, fl_bytes key) {
  return rdd_partitioner_place_hashed(p, key, p->kind == PARTITIONER_HASH ? common_hash_bytes(key.data, key.len) : 0);
}

uint32_t rdd_partitioner_place_hashed(const fl_partitioner *p, fl_bytes key, uint64_t key_hash) {
  switch (p->kind) {
  case PARTITIONER_HASH:
    return (uint32_t)(key_hash % p->num_partitions);
  case PARTITIONER_CUSTOM: {
    uint32_t i = p->fn(key, p->num_partitions, p->arg);
    /* A user function that answers out of range is reduced into range, not trusted. */
    return i < p->num_partitions ? i : i % p->num_partitions;
  }
  case PARTITIONER_RANGE: {
    /* The first bound >= key; keys above every bound go to the last range. */
    size_t lo = 0, hi = (size_t)p->bounds.count;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (rdd_compare_keys(p->compare, p->arg, p->bound_views[mid], key) < 0) lo = mid + 1;
      else hi = mid;
    }
    uint32_t ranges = (uint32_t)p->bounds.count + 1;
    uint32_t i = (uint32_t)lo;
    /* Fewer distinct bounds than partitions leave the top partitions empty. */
    return p->ascending ? i : ranges - 1 - i;
  }
  }
  return 0;
}
