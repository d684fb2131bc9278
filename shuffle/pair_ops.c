/*
 * pair_ops.c: the public wide transformations. Each makes a shuffled dataset (reader.c)
 * through make_shuffled, which reads an input straight from its parent when the parent is
 * already partitioned like the result (no shuffle: the PageRank effect of the RDD paper)
 * and through a shuffle dependency otherwise. join, subtract_by_key, distinct,
 * count_by_key and repartition are compositions with flint's own functions below.
 */
#include <string.h>

#include "shuffle/shuffle.h"

/* The partitioner of a result: the one given, else (with no partition count given) a
 * parent's own, else a hash partitioner over num_partitions or the first parent's count. */
static fl_status resolve_partitioner(const fl_partitioner *given, uint32_t num_partitions,
                                     fl_dataset *const *ins, uint32_t n_in,
                                     const fl_partitioner **out) {
  if (given) {
    rdd_partitioner_retain(given);
    *out = given;
    return FL_OK;
  }
  if (num_partitions == 0)
    for (uint32_t i = 0; i < n_in; i++)
      if (ins[i]->partitioner) {
        rdd_partitioner_retain(ins[i]->partitioner);
        *out = ins[i]->partitioner;
        return FL_OK;
      }
  fl_partitioner *p;
  uint32_t n = num_partitions ? num_partitions : ins[0]->num_partitions;
  fl_status st = fl_partitioner_hash(n ? n : 1, &p);
  if (st == FL_OK) *out = p;
  return st;
}

typedef struct shuffled_spec {
  shuffled_mode mode;
  const char *kind;            /* for messages: "reduce_by_key" ... */
  void (*fn)(void);            /* the user function named in messages */
  const void *arg;
  size_t arg_len;
  const rdd_aggregator *agg;   /* aggregate: functions (arg and zero are filled in here) */
  const fl_bytes *zero;
  bool map_side_combine;
  fl_compare_fn key_order;     /* sort */
  bool descending;
} shuffled_spec;

/* Takes a reference on `part` (the caller keeps its own). */
static fl_status make_shuffled(fl_dataset *const *ins, uint32_t n_in, const fl_partitioner *part,
                               const shuffled_spec *spec, fl_dataset **out) {
  fl_context *ctx = ins[0]->ctx;
  for (uint32_t i = 1; i < n_in; i++)
    if (ins[i]->ctx != ctx) return FL_ERR(FL_EINVAL, "%s: datasets of different contexts", spec->kind);
  shuffled_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "%s: out of memory", spec->kind);
  st->mode = spec->mode;
  st->num_inputs = n_in;
  rdd *narrow[2];
  uint32_t n_narrow = 0;
  for (uint32_t i = 0; i < n_in; i++) {
    if (rdd_partitioner_equal(ins[i]->partitioner, part)) {
      st->inputs[i].parent = ins[i];
      narrow[n_narrow++] = ins[i];
    }
  }
  rdd *r;
  fl_status s = rdd_create(ctx, &shuffled_ops, part->num_partitions, narrow, n_narrow, spec->fn,
                           spec->kind, spec->arg, spec->arg_len, &r);
  if (s != FL_OK) {
    common_free(st);
    return s;
  }
  if (spec->agg) {
    st->agg = *spec->agg;
    st->agg.arg = r->arg;
    if (spec->zero) {
      if ((s = fl_buf_append(&st->zero, spec->zero->data, spec->zero->len)) != FL_OK) {
        common_free(st);
        rdd_release(r);
        return s;
      }
      st->agg.zero = fl_buf_bytes(&st->zero);
      st->agg.has_zero = true;
    }
  }
  st->key_order = spec->key_order;
  st->descending = spec->descending;
  rdd_partitioner_retain(part);
  r->partitioner = part;
  for (uint32_t i = 0; i < n_in; i++)
    if (!st->inputs[i].parent)
      shuffle_add_dep(r, st, i, atomic_fetch_add(&ctx->next_rdd_id, 1), ins[i],
                       spec->agg && spec->map_side_combine, NULL);
  r->state = st;
  *out = r;
  return FL_OK;
}

/* Validates, resolves the partitioner and makes the dataset. */
static fl_status shuffled(const char *what, fl_dataset *const *ins, uint32_t n_in,
                          const fl_partitioner *given, uint32_t num_partitions,
                          const shuffled_spec *spec, fl_dataset **out) {
  common_error_clear();
  for (uint32_t i = 0; i < n_in; i++)
    if (!ins[i]) return FL_ERR(FL_EINVAL, "%s: dataset is NULL", what);
  if (!out) return FL_ERR(FL_EINVAL, "%s: out is NULL", what);
  if (spec->arg_len && !spec->arg) return FL_ERR(FL_EINVAL, "%s: arg_len without arg", what);
  const fl_partitioner *part;
  fl_status s = resolve_partitioner(given, num_partitions, ins, n_in, &part);
  if (s != FL_OK) return s;
  s = make_shuffled(ins, n_in, part, spec, out);
  rdd_partitioner_release(part);
  return s;
}

/* ---- combining ------------------------------------------------------------------------- */

fl_status fl_combine_by_key(fl_dataset *pairs, fl_map_fn create, fl_reduce_fn merge_value,
                            fl_reduce_fn merge_combiners, const void *arg, size_t arg_len,
                            const fl_partitioner *partitioner, uint32_t num_partitions,
                            bool map_side_combine, fl_dataset **out) {
  if (!create || !merge_value || !merge_combiners)
    return FL_ERR(FL_EINVAL, "fl_combine_by_key: create, merge_value and merge_combiners are needed");
  rdd_aggregator agg = {.create = create, .merge_value = merge_value, .merge_combiners = merge_combiners};
  shuffled_spec spec = {SHUFFLED_AGGREGATE, "combine_by_key", (void (*)(void))merge_value, arg,
                        arg_len, &agg, NULL, map_side_combine, NULL, false};
  return shuffled("fl_combine_by_key", &pairs, 1, partitioner, num_partitions, &spec, out);
}

fl_status fl_reduce_by_key(fl_dataset *pairs, fl_reduce_fn fn, const void *arg, size_t arg_len,
                           const fl_partitioner *partitioner, uint32_t num_partitions,
                           fl_dataset **out) {
  if (!fn) return FL_ERR(FL_EINVAL, "fl_reduce_by_key: function is NULL");
  rdd_aggregator agg = {.merge_value = fn, .merge_combiners = fn};
  shuffled_spec spec = {SHUFFLED_AGGREGATE, "reduce_by_key", (void (*)(void))fn, arg, arg_len,
                        &agg, NULL, true, NULL, false};
  return shuffled("fl_reduce_by_key", &pairs, 1, partitioner, num_partitions, &spec, out);
}

fl_status fl_fold_by_key(fl_dataset *pairs, fl_bytes zero, fl_reduce_fn fn, const void *arg,
                         size_t arg_len, const fl_partitioner *partitioner,
                         uint32_t num_partitions, fl_dataset **out) {
  if (!fn || (zero.len && !zero.data)) return FL_ERR(FL_EINVAL, "fl_fold_by_key: function or zero is NULL");
  rdd_aggregator agg = {.merge_value = fn, .merge_combiners = fn};
  shuffled_spec spec = {SHUFFLED_AGGREGATE, "fold_by_key", (void (*)(void))fn, arg, arg_len,
                        &agg, &zero, true, NULL, false};
  return shuffled("fl_fold_by_key", &pairs, 1, partitioner, num_partitions, &spec, out);
}

fl_status fl_aggregate_by_key(fl_dataset *pairs, fl_bytes zero, fl_reduce_fn seq,
                              fl_reduce_fn comb, const void *arg, size_t arg_len,
                              const fl_partitioner *partitioner, uint32_t num_partitions,
                              fl_dataset **out) {
  if (!seq || !comb || (zero.len && !zero.data))
    return FL_ERR(FL_EINVAL, "fl_aggregate_by_key: seq, comb or zero is NULL");
  rdd_aggregator agg = {.merge_value = seq, .merge_combiners = comb};
  shuffled_spec spec = {SHUFFLED_AGGREGATE, "aggregate_by_key", (void (*)(void))seq, arg,
                        arg_len, &agg, &zero, true, NULL, false};
  return shuffled("fl_aggregate_by_key", &pairs, 1, partitioner, num_partitions, &spec, out);
}

/* ---- grouping -------------------------------------------------------------------------- */

fl_status fl_group_by_key(fl_dataset *pairs, const fl_partitioner *partitioner,
                          uint32_t num_partitions, fl_dataset **out) {
  shuffled_spec spec = {SHUFFLED_GROUP, "group_by_key", NULL, NULL, 0, NULL, NULL, false, NULL, false};
  return shuffled("fl_group_by_key", &pairs, 1, partitioner, num_partitions, &spec, out);
}

bool fl_group_next(fl_bytes group, size_t *pos, fl_bytes *value) {
  if (!pos || !value || *pos >= group.len) return false;
  rdd_cursor c = {group.data + *pos, group.data + group.len};
  if (!rdd_cursor_next(&c, value)) return false;
  *pos = (size_t)(c.p - group.data);
  return true;
}

fl_status fl_cogroup(fl_dataset *a, fl_dataset *b, const fl_partitioner *partitioner,
                     uint32_t num_partitions, fl_dataset **out) {
  fl_dataset *ins[2] = {a, b};
  shuffled_spec spec = {SHUFFLED_COGROUP, "cogroup", NULL, NULL, 0, NULL, NULL, false, NULL, false};
  return shuffled("fl_cogroup", ins, 2, partitioner, num_partitions, &spec, out);
}

fl_status fl_cogroup_get(fl_bytes cogroup, fl_bytes *group_a, fl_bytes *group_b) {
  if (!group_a || !group_b) return fl_set_error(FL_EINVAL, "fl_cogroup_get: NULL argument");
  uint64_t la;
  size_t n = common_varint_get(cogroup.data, cogroup.data + cogroup.len, &la);
  if (n == 0 || la > cogroup.len - n) return fl_set_error(FL_EFORMAT, "not a cogroup value");
  *group_a = fl_bytes_of(cogroup.data + n, (size_t)la);
  *group_b = fl_bytes_of(cogroup.data + n + la, cogroup.len - n - (size_t)la);
  return FL_OK;
}

/* ---- sorting and placing --------------------------------------------------------------- */

fl_status fl_sort_by_key(fl_dataset *pairs, bool ascending, fl_compare_fn compare,
                         const void *arg, size_t arg_len, uint32_t num_partitions,
                         fl_dataset **out) {
  common_error_clear();
  if (!pairs || !out) return FL_ERR(FL_EINVAL, "fl_sort_by_key: NULL argument");
  fl_partitioner *range;
  uint32_t n = num_partitions ? num_partitions : pairs->num_partitions;
  fl_status s = fl_partitioner_range(pairs, n ? n : 1, ascending, compare, arg, arg_len, &range);
  if (s != FL_OK) return s;
  shuffled_spec spec = {SHUFFLED_SORT, "sort_by_key", (void (*)(void))compare, arg, arg_len,
                        NULL, NULL, false, compare, !ascending};
  s = make_shuffled(&pairs, 1, range, &spec, out);
  fl_partitioner_free(range);
  return s;
}

fl_status fl_partition_by(fl_dataset *pairs, const fl_partitioner *partitioner, fl_dataset **out) {
  common_error_clear();
  if (!pairs || !partitioner || !out) return FL_ERR(FL_EINVAL, "fl_partition_by: NULL argument");
  if (rdd_partitioner_equal(pairs->partitioner, partitioner)) {
    rdd_retain(pairs); /* already placed so: the same dataset, as in Spark */
    *out = pairs;
    return FL_OK;
  }
  shuffled_spec spec = {SHUFFLED_PLAIN, "partition_by", NULL, NULL, 0, NULL, NULL, false, NULL, false};
  return make_shuffled(&pairs, 1, partitioner, &spec, out);
}

/* ---- compositions with flint's own functions ------------------------------------------ */

/* joined value: one flag byte (1: has a, 2: has b), varint length of a, a, b. */
static fl_status put_joined(fl_buf *out, fl_bytes key, const fl_bytes *a, const fl_bytes *b,
                            fl_buf *scratch) {
  uint8_t head[1 + COMMON_VARINT_MAX];
  head[0] = (uint8_t)((a ? 1 : 0) | (b ? 2 : 0));
  size_t n = 1 + common_varint_put(head + 1, a ? a->len : 0);
  scratch->len = 0;
  fl_status s = fl_buf_append(scratch, head, n);
  if (s == FL_OK && a) s = fl_buf_append(scratch, a->data, a->len);
  if (s == FL_OK && b) s = fl_buf_append(scratch, b->data, b->len);
  if (s == FL_OK) s = fl_buf_put_pair(out, key, fl_buf_bytes(scratch));
  return s;
}

fl_status fl_joined_get(fl_bytes joined, bool *has_a, fl_bytes *a, bool *has_b, fl_bytes *b) {
  if (!has_a || !a || !has_b || !b) return fl_set_error(FL_EINVAL, "fl_joined_get: NULL argument");
  uint64_t la;
  size_t n = joined.len ? common_varint_get(joined.data + 1, joined.data + joined.len, &la) : 0;
  if (n == 0 || la > joined.len - 1 - n || joined.data[0] > 3)
    return fl_set_error(FL_EFORMAT, "not a joined value");
  *has_a = joined.data[0] & 1;
  *has_b = (joined.data[0] & 2) != 0;
  *a = fl_bytes_of(joined.data + 1 + n, (size_t)la);
  *b = fl_bytes_of(joined.data + 1 + n + la, joined.len - 1 - n - (size_t)la);
  return FL_OK;
}

/* Emits the pairs of a cogroup that a join of the given kind keeps. */
static fl_status join_emit(fl_bytes rec, fl_emitter *out, const void *arg) {
  fl_join_kind kind = *(const fl_join_kind *)arg;
  fl_bytes key, cg, ga, gb, va, vb;
  fl_status s = fl_pair(rec, &key, &cg);
  if (s == FL_OK) s = fl_cogroup_get(cg, &ga, &gb);
  if (s != FL_OK) return s;
  fl_buf one = FL_BUF_INIT, scratch = FL_BUF_INIT;
  bool outer_a = kind == FL_JOIN_LEFT || kind == FL_JOIN_FULL;
  bool outer_b = kind == FL_JOIN_RIGHT || kind == FL_JOIN_FULL;
  size_t pa = 0;
  if (ga.len == 0 && outer_b) { /* b's values with no a */
    size_t pb = 0;
    while (s == FL_OK && fl_group_next(gb, &pb, &vb)) {
      one.len = 0;
      if ((s = put_joined(&one, key, NULL, &vb, &scratch)) == FL_OK) s = fl_emit(out, one.data, one.len);
    }
  }
  while (s == FL_OK && fl_group_next(ga, &pa, &va)) {
    size_t pb = 0;
    bool any = false;
    while (s == FL_OK && fl_group_next(gb, &pb, &vb)) {
      any = true;
      one.len = 0;
      if ((s = put_joined(&one, key, &va, &vb, &scratch)) == FL_OK) s = fl_emit(out, one.data, one.len);
    }
    if (s == FL_OK && !any && outer_a) {
      one.len = 0;
      if ((s = put_joined(&one, key, &va, NULL, &scratch)) == FL_OK) s = fl_emit(out, one.data, one.len);
    }
  }
  fl_buf_free(&one);
  fl_buf_free(&scratch);
  return s;
}

/* Emits (key, value) for the values of a whose key has none in b. */
static fl_status subtract_emit(fl_bytes rec, fl_emitter *out, const void *arg) {
  (void)arg;
  fl_bytes key, cg, ga, gb, va;
  fl_status s = fl_pair(rec, &key, &cg);
  if (s == FL_OK) s = fl_cogroup_get(cg, &ga, &gb);
  if (s != FL_OK || gb.len > 0) return s;
  fl_buf one = FL_BUF_INIT;
  size_t pa = 0;
  while (s == FL_OK && fl_group_next(ga, &pa, &va)) {
    one.len = 0;
    if ((s = fl_buf_put_pair(&one, key, va)) == FL_OK) s = fl_emit(out, one.data, one.len);
  }
  fl_buf_free(&one);
  return s;
}

/* A cogroup followed by a flat map; the result keeps the cogroup's partitioner, since the
 * keys do not change. */
static fl_status cogroup_then(const char *what, fl_dataset *a, fl_dataset *b,
                              const fl_partitioner *partitioner, uint32_t num_partitions,
                              fl_flat_map_fn fn, const void *arg, size_t arg_len, fl_dataset **out) {
  common_error_clear();
  if (!a || !b || !out) return FL_ERR(FL_EINVAL, "%s: NULL argument", what);
  fl_dataset *cg;
  fl_status s = fl_cogroup(a, b, partitioner, num_partitions, &cg);
  if (s != FL_OK) return s;
  s = fl_flat_map(cg, fn, arg, arg_len, out);
  if (s == FL_OK) {
    rdd_partitioner_retain(cg->partitioner);
    (*out)->partitioner = cg->partitioner;
  }
  fl_dataset_free(cg);
  return s;
}

fl_status fl_join(fl_dataset *a, fl_dataset *b, fl_join_kind kind, const fl_partitioner *partitioner,
                  uint32_t num_partitions, fl_dataset **out) {
  if (kind < FL_JOIN_INNER || kind > FL_JOIN_FULL) return FL_ERR(FL_EINVAL, "fl_join: unknown join kind %d", (int)kind);
  return cogroup_then("fl_join", a, b, partitioner, num_partitions, join_emit, &kind, sizeof kind, out);
}

fl_status fl_subtract_by_key(fl_dataset *a, fl_dataset *b, const fl_partitioner *partitioner,
                             uint32_t num_partitions, fl_dataset **out) {
  return cogroup_then("fl_subtract_by_key", a, b, partitioner, num_partitions, subtract_emit,
                      NULL, 0, out);
}

static fl_status record_to_key(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_pair(out, rec, fl_bytes_of(NULL, 0));
}

static fl_status keep_first(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)b, (void)arg;
  return fl_buf_append(out, a.data, a.len);
}

static fl_status pair_key(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes key, value;
  fl_status s = fl_pair(rec, &key, &value);
  return s == FL_OK ? fl_buf_append(out, key.data, key.len) : s;
}

static fl_status pair_value(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes key, value;
  fl_status s = fl_pair(rec, &key, &value);
  return s == FL_OK ? fl_buf_append(out, value.data, value.len) : s;
}

fl_status fl_distinct(fl_dataset *ds, uint32_t num_partitions, fl_dataset **out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_distinct: NULL argument");
  fl_dataset *keyed = NULL, *reduced = NULL;
  fl_status s = fl_map(ds, record_to_key, NULL, 0, &keyed);
  if (s == FL_OK) s = fl_reduce_by_key(keyed, keep_first, NULL, 0, NULL, num_partitions ? num_partitions : ds->num_partitions, &reduced);
  if (s == FL_OK) s = fl_map(reduced, pair_key, NULL, 0, out);
  fl_dataset_free(reduced);
  fl_dataset_free(keyed);
  return s;
}

static fl_status one_i64(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)rec, (void)arg;
  return fl_buf_put_i64(out, 1);
}

static fl_status add_i64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

static int compare_pair_keys(const void *x, const void *y) {
  fl_bytes a = *(const fl_bytes *)x, b = *(const fl_bytes *)y, ka, kb, v;
  fl_pair(a, &ka, &v);
  fl_pair(b, &kb, &v);
  return rdd_compare_keys(NULL, NULL, ka, kb);
}

fl_status fl_count_by_key(fl_dataset *pairs, fl_records **out) {
  common_error_clear();
  if (!pairs || !out) return FL_ERR(FL_EINVAL, "fl_count_by_key: NULL argument");
  fl_dataset *ones = NULL, *counts = NULL, *sorted = NULL;
  fl_status s = fl_map_values(pairs, one_i64, NULL, 0, &ones);
  if (s == FL_OK) s = fl_reduce_by_key(ones, add_i64, NULL, 0, NULL, 0, &counts);
  /* In key order, as the header promises: sort the (few) counts by key on one partition. */
  fl_records *r = NULL;
  if (s == FL_OK) s = fl_collect(counts, &r);
  if (s == FL_OK) {
    size_t n = fl_records_count(r);
    fl_bytes *views = common_malloc((n ? n : 1) * sizeof *views);
    if (!views) {
      s = FL_ERR(FL_ENOMEM, "fl_count_by_key: out of memory");
    } else {
      for (size_t i = 0; i < n; i++) views[i] = fl_records_get(r, i);
      qsort(views, n, sizeof *views, compare_pair_keys);
      s = fl_parallelize(pairs->ctx, views, n, 1, &sorted);
      if (s == FL_OK) s = fl_collect(sorted, out);
      common_free(views);
    }
  }
  fl_records_free(r);
  fl_dataset_free(sorted);
  fl_dataset_free(counts);
  fl_dataset_free(ones);
  return s;
}

/* repartition: each record gets the next of n target partitions, round robin from a start
 * that depends on its source partition (as Spark), then is placed by an identity
 * partitioner and unwrapped. */
static fl_status round_robin_keys(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  uint32_t n = *(const uint32_t *)arg;
  uint32_t next = (uint32_t)(common_hash64(partition) % n);
  fl_buf one = FL_BUF_INIT;
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    one.len = 0;
    uint32_t key = next;
    next = next + 1 == n ? 0 : next + 1;
    if ((s = fl_buf_put_pair(&one, fl_bytes_of(&key, 4), rec)) == FL_OK) s = fl_emit(out, one.data, one.len);
  }
  fl_buf_free(&one);
  return s;
}

static uint32_t identity_partition(fl_bytes key, uint32_t n, const void *arg) {
  (void)arg;
  uint32_t k = 0;
  if (key.len == 4) memcpy(&k, key.data, 4);
  return k % n;
}

fl_status fl_repartition(fl_dataset *ds, uint32_t num_partitions, fl_dataset **out) {
  common_error_clear();
  if (!ds || !out || num_partitions == 0)
    return FL_ERR(FL_EINVAL, "fl_repartition: needs a dataset and num_partitions > 0");
  fl_dataset *keyed = NULL, *placed = NULL;
  fl_partitioner *identity = NULL;
  fl_status s = fl_map_partitions(ds, round_robin_keys, &num_partitions, sizeof num_partitions, &keyed);
  if (s == FL_OK) s = fl_partitioner_custom(num_partitions, identity_partition, NULL, 0, &identity);
  if (s == FL_OK) s = fl_partition_by(keyed, identity, &placed);
  if (s == FL_OK) s = fl_map(placed, pair_value, NULL, 0, out);
  fl_partitioner_free(identity);
  fl_dataset_free(placed);
  fl_dataset_free(keyed);
  return s;
}

/* ---- the functions above, by name, for plans ------------------------------------------- */

static bool join_arg_ok(const void *arg, size_t len) {
  if (len != sizeof(fl_join_kind)) return false;
  fl_join_kind kind;
  memcpy(&kind, arg, sizeof kind);
  return kind >= FL_JOIN_INNER && kind <= FL_JOIN_FULL;
}

static bool round_robin_arg_ok(const void *arg, size_t len) {
  uint32_t n;
  if (len != sizeof n) return false;
  memcpy(&n, arg, sizeof n);
  return n > 0;
}

/* The names are part of the plan format: never rename one, only add. */
const rdd_builtin shuffle_builtins[] = {
    {"shuffle.join_emit", (void (*)(void))join_emit, join_arg_ok},
    {"shuffle.subtract_emit", (void (*)(void))subtract_emit, NULL},
    {"shuffle.record_to_key", (void (*)(void))record_to_key, NULL},
    {"shuffle.keep_first", (void (*)(void))keep_first, NULL},
    {"shuffle.pair_key", (void (*)(void))pair_key, NULL},
    {"shuffle.pair_value", (void (*)(void))pair_value, NULL},
    {"shuffle.one_i64", (void (*)(void))one_i64, NULL},
    {"shuffle.add_i64", (void (*)(void))add_i64, NULL},
    {"shuffle.round_robin_keys", (void (*)(void))round_robin_keys, round_robin_arg_ok},
    {"shuffle.identity_partition", (void (*)(void))identity_partition, NULL},
    {NULL, NULL, NULL},
};
