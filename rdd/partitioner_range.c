/* partitioner_range.c: a range partitioner, its boundaries sampled from the data by a job
 * (as Spark's RangePartitioner), apart from partitioner.c, which datasets use as they go. */
#include <string.h>

#include "rdd/rdd.h"

/* qsort_r's comparison over key views. */
typedef struct key_order {
  fl_compare_fn cmp;
  const void *arg;
} key_order;


/* Keys sampled per output partition: Spark SQL's default (its RDD API samples 20). Each
 * input partition keeps a reservoir of 3x its share, as Spark's RangePartitioner.sketch. */
#define RANGE_SAMPLES_PER_PARTITION 100
#define RANGE_MAX_SAMPLES 1000000

typedef struct reservoir_args {
  uint32_t size;
  uint64_t seed;
} reservoir_args;

/* One pass over a partition: emits its record count (a record starting with 0), then up to
 * `size` of its keys drawn uniformly (records starting with 1), by reservoir sampling. */
static fl_status reservoir_sample(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  const reservoir_args *a = arg;
  fl_buf *slots = common_calloc(a->size ? a->size : 1, sizeof *slots);
  if (!slots) return fl_set_error(FL_ENOMEM, "range sampling: out of memory");
  common_rng rng;
  common_rng_seed(&rng, a->seed ^ common_hash64(partition + 1));
  uint64_t seen = 0;
  fl_status st = FL_OK;
  fl_bytes rec, key, value;
  while (st == FL_OK && fl_iter_next(in, &rec)) {
    if ((st = fl_pair(rec, &key, &value)) != FL_OK) break;
    uint64_t j = seen < a->size ? seen : common_rng_next(&rng) % (seen + 1);
    seen++;
    if (j >= a->size) continue;
    slots[j].len = 0;
    uint8_t tag = 1;
    if ((st = fl_buf_append(&slots[j], &tag, 1)) == FL_OK) st = fl_buf_append(&slots[j], key.data, key.len);
  }
  uint8_t head[9] = {0};
  memcpy(head + 1, &seen, 8);
  if (st == FL_OK) st = fl_emit(out, head, sizeof head);
  for (uint64_t i = 0; st == FL_OK && i < seen && i < a->size; i++) st = fl_emit(out, slots[i].data, slots[i].len);
  for (uint32_t i = 0; i < a->size; i++) fl_buf_free(&slots[i]);
  common_free(slots);
  return st;
}

static bool reservoir_arg_ok(const void *arg, size_t len) {
  (void)arg;
  return len == sizeof(reservoir_args);
}

const rdd_builtin rdd_partitioner_builtins[] = {
    {"rdd.reservoir_sample", (void (*)(void))reservoir_sample, reservoir_arg_ok},
    {NULL, NULL, NULL},
};

typedef struct weighted_key {
  fl_bytes key;
  double weight; /* records of its partition per sampled key */
} weighted_key;

static int compare_weighted(const void *a, const void *b, void *order) {
  const key_order *o = order;
  return rdd_compare_keys(o->cmp, o->arg, ((const weighted_key *)a)->key, ((const weighted_key *)b)->key);
}

fl_status fl_partitioner_range(fl_dataset *pairs, uint32_t num_partitions, bool ascending,
                               fl_compare_fn compare, const void *arg, size_t arg_len,
                               fl_partitioner **out) {
  common_error_clear();
  if (!pairs || !out || num_partitions == 0 || (arg_len && !arg))
    return FL_ERR(FL_EINVAL, "fl_partitioner_range: needs a dataset and num_partitions > 0");
  fl_status status = FL_OK;
  fl_partitioner *p = rdd_partitioner_new(PARTITIONER_RANGE, num_partitions, arg, arg_len);
  fl_dataset *sample = NULL;
  fl_records *keys = NULL;
  weighted_key *views = NULL;
  if (!p) return FL_ERR(FL_ENOMEM, "cannot allocate a partitioner");
  p->compare = compare;
  p->ascending = ascending;
  if (num_partitions > 1 && pairs->num_partitions > 0) {
    uint64_t total = (uint64_t)RANGE_SAMPLES_PER_PARTITION * num_partitions;
    if (total > RANGE_MAX_SAMPLES) total = RANGE_MAX_SAMPLES;
    reservoir_args ra = {(uint32_t)((3 * total + pairs->num_partitions - 1) / pairs->num_partitions),
                         0x5eed ^ pairs->id};
    FL_CHECK(fl_map_partitions(pairs, reservoir_sample, &ra, sizeof ra, &sample));
    FL_CHECK(fl_collect(sample, &keys));
    size_t n = fl_records_count(keys), m = 0;
    views = common_malloc((n ? n : 1) * sizeof *views);
    if (!views) {
      status = FL_ERR(FL_ENOMEM, "cannot sort %zu sampled keys", n);
      goto cleanup;
    }
    /* A partition's count comes before its keys; each key stands for count / sampled. */
    double records = 0;
    for (size_t i = 0; i < n;) {
      fl_bytes head = fl_records_get(keys, i++);
      uint64_t count = 0;
      if (head.len == 9 && head.data[0] == 0) memcpy(&count, head.data + 1, 8);
      size_t first = m;
      while (i < n && fl_records_get(keys, i).len > 0 && fl_records_get(keys, i).data[0] == 1) {
        fl_bytes k = fl_records_get(keys, i++);
        views[m++] = (weighted_key){fl_bytes_of(k.data + 1, k.len - 1), 0};
      }
      for (size_t j = first; j < m; j++) views[j].weight = (double)count / (double)(m - first);
      records += (double)count;
    }
    key_order order = {compare, p->arg};
    qsort_r(views, m, sizeof *views, compare_weighted, &order);
    /* Bound i: the first key where the cumulative weight reaches (i + 1) / num_partitions of
     * the records; equal bounds are kept once, so no partition is empty by construction. */
    double step = records / num_partitions, cumulative = 0;
    uint32_t made = 0;
    fl_bytes last = {NULL, 0};
    bool have_last = false;
    for (size_t j = 0; j < m && made + 1 < num_partitions; j++) {
      cumulative += views[j].weight;
      if (cumulative < step * (made + 1)) continue;
      made++;
      if (have_last && rdd_compare_keys(compare, p->arg, views[j].key, last) == 0) continue;
      FL_CHECK(rdd_batch_append(&p->bounds, views[j].key.data, views[j].key.len));
      last = views[j].key;
      have_last = true;
    }
  }
  /* Views of the bounds, for binary search. */
  p->bound_views = common_malloc((p->bounds.count ? p->bounds.count : 1) * sizeof *p->bound_views);
  if (!p->bound_views) {
    status = FL_ERR(FL_ENOMEM, "cannot allocate range bounds");
    goto cleanup;
  }
  rdd_cursor c = {p->bounds.buf.data, p->bounds.buf.data + p->bounds.buf.len};
  for (uint64_t i = 0; i < p->bounds.count; i++) rdd_cursor_next(&c, &p->bound_views[i]);
  *out = p;
  p = NULL;
cleanup:
  common_free(views);
  fl_records_free(keys);
  fl_dataset_free(sample);
  if (p) rdd_partitioner_release(p);
  return status;
}
