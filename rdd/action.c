/* action.c: the public actions. Each builds an rdd_action, runs one job (take may run a
 * few) through the context's runtime, and merges the per-partition results. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <sys/stat.h>

#include "rdd/rdd.h"

struct fl_records {
  rdd_batch batch;
  size_t *offsets; /* start of each record's length prefix */
};

size_t fl_records_count(const fl_records *r) { return r ? (size_t)r->batch.count : 0; }

fl_bytes fl_records_get(const fl_records *r, size_t i) {
  fl_bytes rec = {NULL, 0};
  if (!r || i >= r->batch.count) return rec;
  rdd_cursor c = {r->batch.buf.data + r->offsets[i], r->batch.buf.data + r->batch.buf.len};
  rdd_cursor_next(&c, &rec);
  return rec;
}

void fl_records_free(fl_records *r) {
  if (!r) return;
  rdd_batch_free(&r->batch);
  common_free(r->offsets);
  common_free(r);
}

static fl_status records_index(fl_records *r);

fl_status rdd_records_from_batch(rdd_batch *batch, fl_records **out) {
  fl_records *r = common_calloc(1, sizeof *r);
  if (!r) return FL_ERR(FL_ENOMEM, "out of memory");
  r->batch = *batch;
  *batch = (rdd_batch){FL_BUF_INIT, 0};
  fl_status s = records_index(r);
  if (s != FL_OK) {
    *batch = r->batch;
    common_free(r);
    return s;
  }
  *out = r;
  return FL_OK;
}

fl_status rdd_run_job(rdd *r, const uint32_t *parts, uint32_t num_parts,
                      const rdd_action *action, fl_buf *results) {
  uint32_t *all = NULL;
  if (!parts) {
    all = common_malloc((num_parts ? num_parts : 1) * sizeof *all);
    if (!all) return FL_ERR(FL_ENOMEM, "cannot allocate a job's partition list");
    for (uint32_t i = 0; i < num_parts; i++) all[i] = i;
    parts = all;
  }
  fl_status s = r->ctx->runtime->run_job(r->ctx->runtime_impl, r, parts, num_parts, action, results);
  common_free(all);
  return s;
}

/* Runs `action` on every partition; the caller frees the results with free_results. */
static fl_status run_all(rdd *r, const rdd_action *action, fl_buf **results) {
  uint32_t n = r->num_partitions;
  fl_buf *res = common_calloc(n ? n : 1, sizeof *res);
  if (!res) return FL_ERR(FL_ENOMEM, "cannot allocate job results");
  fl_status s = n ? rdd_run_job(r, NULL, n, action, res) : FL_OK;
  if (s != FL_OK) {
    for (uint32_t i = 0; i < n; i++) fl_buf_free(&res[i]);
    common_free(res);
    return s;
  }
  *results = res;
  return FL_OK;
}

static void free_results(fl_buf *res, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) fl_buf_free(&res[i]);
  common_free(res);
}

fl_status fl_count(fl_dataset *ds, uint64_t *out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_count: NULL argument");
  rdd_action a = {.kind = RDD_ACTION_COUNT};
  fl_buf *res;
  fl_status s = run_all(ds, &a, &res);
  if (s != FL_OK) return s;
  uint64_t total = 0;
  for (uint32_t i = 0; i < ds->num_partitions; i++) total += (uint64_t)fl_i64(fl_buf_bytes(&res[i]));
  free_results(res, ds->num_partitions);
  *out = total;
  return FL_OK;
}

/* Appends a collect result (varint count + batch) to `into`, at most `limit` records
 * (0: all). */
static fl_status append_collected(fl_records *into, fl_bytes result, uint64_t limit) {
  uint64_t count;
  size_t n = common_varint_get(result.data, result.data + result.len, &count);
  if (n == 0) return FL_ERR(FL_ECORRUPT, "malformed collect result");
  rdd_cursor c = {result.data + n, result.data + result.len};
  fl_bytes rec;
  for (uint64_t i = 0; i < count && (limit == 0 || into->batch.count < limit); i++) {
    if (!rdd_cursor_next(&c, &rec)) return FL_ERR(FL_ECORRUPT, "malformed collect result");
    fl_status s = rdd_batch_append(&into->batch, rec.data, rec.len);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

static fl_status records_index(fl_records *r) {
  r->offsets = common_malloc((r->batch.count ? r->batch.count : 1) * sizeof *r->offsets);
  if (!r->offsets) return FL_ERR(FL_ENOMEM, "cannot index %llu records", (unsigned long long)r->batch.count);
  rdd_cursor c = {r->batch.buf.data, r->batch.buf.data + r->batch.buf.len};
  fl_bytes rec;
  for (uint64_t i = 0; i < r->batch.count; i++) {
    r->offsets[i] = (size_t)(c.p - r->batch.buf.data);
    rdd_cursor_next(&c, &rec);
  }
  return FL_OK;
}

fl_status fl_collect(fl_dataset *ds, fl_records **out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_collect: NULL argument");
  rdd_action a = {.kind = RDD_ACTION_COLLECT};
  fl_buf *res;
  fl_status status = run_all(ds, &a, &res);
  if (status != FL_OK) return status;
  fl_records *r = common_calloc(1, sizeof *r);
  if (!r) {
    status = FL_ERR(FL_ENOMEM, "fl_collect: out of memory");
    goto cleanup;
  }
  for (uint32_t i = 0; i < ds->num_partitions; i++)
    FL_CHECK(append_collected(r, fl_buf_bytes(&res[i]), 0));
  FL_CHECK(records_index(r));
  *out = r;
  r = NULL;
cleanup:
  fl_records_free(r);
  free_results(res, ds->num_partitions);
  return status;
}

/* As Spark's take: one partition first, then up to 4x as many as were scanned so far,
 * estimated from how many records each partition gave. */
fl_status fl_take(fl_dataset *ds, size_t n, fl_records **out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_take: NULL argument");
  fl_status status = FL_OK;
  fl_records *r = common_calloc(1, sizeof *r);
  uint32_t *parts = common_malloc((ds->num_partitions ? ds->num_partitions : 1) * sizeof *parts);
  fl_buf *res = common_calloc(ds->num_partitions ? ds->num_partitions : 1, sizeof *res);
  if (!r || !parts || !res) {
    status = FL_ERR(FL_ENOMEM, "fl_take: out of memory");
    goto cleanup;
  }
  uint32_t scanned = 0;
  while (r->batch.count < n && scanned < ds->num_partitions) {
    uint64_t want = scanned == 0 ? 1 : (uint64_t)scanned * 4;
    if (scanned > 0 && r->batch.count > 0) {
      uint64_t est = (uint64_t)(1.5 * (double)(n - r->batch.count) * scanned / (double)r->batch.count) + 1;
      if (est < want) want = est;
    }
    uint32_t batch = (uint32_t)(want < ds->num_partitions - scanned ? want : ds->num_partitions - scanned);
    for (uint32_t i = 0; i < batch; i++) parts[i] = scanned + i;
    rdd_action a = {.kind = RDD_ACTION_COLLECT, .limit = n - r->batch.count};
    FL_CHECK(rdd_run_job(ds, parts, batch, &a, res));
    for (uint32_t i = 0; i < batch; i++) {
      if (status == FL_OK) status = append_collected(r, fl_buf_bytes(&res[i]), n);
      fl_buf_free(&res[i]);
    }
    if (status != FL_OK) goto cleanup;
    scanned += batch;
  }
  FL_CHECK(records_index(r));
  *out = r;
  r = NULL;
cleanup:
  fl_records_free(r);
  common_free(parts);
  common_free(res);
  return status;
}

fl_status fl_first(fl_dataset *ds, fl_buf *out) {
  common_error_clear();
  if (!ds || !out) return FL_ERR(FL_EINVAL, "fl_first: NULL argument");
  fl_records *r;
  fl_status s = fl_take(ds, 1, &r);
  if (s != FL_OK) return s;
  if (fl_records_count(r) == 0) {
    fl_records_free(r);
    return FL_ERR(FL_EEMPTY, "fl_first: dataset %llu is empty", (unsigned long long)ds->id);
  }
  fl_bytes rec = fl_records_get(r, 0);
  out->len = 0;
  s = fl_buf_append(out, rec.data, rec.len);
  fl_records_free(r);
  return s;
}

/* Combines a and b with fn into *acc (swapping through scratch). */
static fl_status combine(const char *what, fl_reduce_fn fn, const void *arg, fl_buf *acc,
                         fl_bytes b, fl_buf *scratch) {
  scratch->len = 0;
  fl_status s = fn(fl_buf_bytes(acc), b, scratch, arg);
  if (s != FL_OK) {
    char name[256];
    common_symbol_name((const void *)fn, name, sizeof name);
    return common_error_wrap(s, "%s function '%s' failed merging partition results: ", what, name);
  }
  fl_buf t = *acc;
  *acc = *scratch;
  *scratch = t;
  return FL_OK;
}

/*
 * The shared body of reduce, fold, aggregate and tree_aggregate: seq within partitions (in
 * the tasks), then comb over the partition results. depth > 1 combines them in a tree whose
 * nodes read about n^(1/depth) inputs each, so the floating-point order is the tree's.
 */
static fl_status aggregate(const char *what, fl_dataset *ds, const fl_bytes *zero,
                           fl_reduce_fn seq, fl_reduce_fn comb, const void *arg,
                           size_t arg_len, uint32_t depth, fl_buf *out) {
  rdd_action a = {.kind = RDD_ACTION_AGGREGATE, .seq = seq, .arg = arg, .arg_len = arg_len};
  if (zero) {
    a.zero = *zero;
    a.has_zero = true;
  }
  fl_buf *res;
  fl_status status = run_all(ds, &a, &res);
  if (status != FL_OK) return status;
  uint32_t n = ds->num_partitions;
  /* Keep the partitions that have a value, without their flag byte. */
  uint32_t live = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (res[i].len == 0 || res[i].data[0] == 0) continue;
    memmove(res[i].data, res[i].data + 1, res[i].len - 1);
    res[i].len--;
    fl_buf t = res[live];
    res[live++] = res[i];
    res[i] = t;
  }
  fl_buf scratch = FL_BUF_INIT;
  uint32_t scale = 2;
  if (depth > 1) {
    double s = ceil(pow((double)live, 1.0 / depth));
    scale = s < 2 ? 2 : (uint32_t)s;
  }
  while (depth > 1 && live > scale) {
    uint32_t groups = (live + scale - 1) / scale;
    for (uint32_t g = 0; g < groups; g++) {
      uint32_t lo = g * scale, hi = lo + scale < live ? lo + scale : live;
      for (uint32_t i = lo + 1; i < hi; i++)
        FL_CHECK(combine(what, comb, arg, &res[lo], fl_buf_bytes(&res[i]), &scratch));
      fl_buf t = res[g];
      res[g] = res[lo];
      res[lo] = t;
    }
    live = groups;
  }
  fl_buf acc = FL_BUF_INIT;
  if (zero) {
    FL_CHECK(fl_buf_append(&acc, zero->data, zero->len));
  } else if (live == 0) {
    status = FL_ERR(FL_EEMPTY, "%s: dataset %llu is empty", what, (unsigned long long)ds->id);
    goto cleanup;
  } else {
    FL_CHECK(fl_buf_append(&acc, res[0].data, res[0].len));
  }
  for (uint32_t i = zero ? 0 : 1; i < live; i++) {
    status = combine(what, comb, arg, &acc, fl_buf_bytes(&res[i]), &scratch);
    if (status != FL_OK) {
      fl_buf_free(&acc);
      goto cleanup;
    }
  }
  fl_buf_free(out);
  *out = acc;
cleanup:
  fl_buf_free(&scratch);
  free_results(res, n);
  return status;
}

#define CHECK_AGG_ARGS(what, ds, fn, arg, arg_len, out)                                      \
  do {                                                                                       \
    common_error_clear();                                                                    \
    if (!(ds) || !(fn) || !(out)) return FL_ERR(FL_EINVAL, "%s: NULL argument", what);      \
    if ((arg_len) && !(arg)) return FL_ERR(FL_EINVAL, "%s: arg_len without arg", what);     \
  } while (0)

fl_status fl_reduce(fl_dataset *ds, fl_reduce_fn fn, const void *arg, size_t arg_len,
                    fl_buf *out) {
  CHECK_AGG_ARGS("fl_reduce", ds, fn, arg, arg_len, out);
  return aggregate("reduce", ds, NULL, fn, fn, arg, arg_len, 1, out);
}

fl_status fl_fold(fl_dataset *ds, fl_bytes zero, fl_reduce_fn fn, const void *arg,
                  size_t arg_len, fl_buf *out) {
  CHECK_AGG_ARGS("fl_fold", ds, fn, arg, arg_len, out);
  return aggregate("fold", ds, &zero, fn, fn, arg, arg_len, 1, out);
}

fl_status fl_aggregate(fl_dataset *ds, fl_bytes zero, fl_reduce_fn seq, fl_reduce_fn comb,
                       const void *arg, size_t arg_len, fl_buf *out) {
  CHECK_AGG_ARGS("fl_aggregate", ds, seq, arg, arg_len, out);
  if (!comb) return FL_ERR(FL_EINVAL, "fl_aggregate: comb is NULL");
  return aggregate("aggregate", ds, &zero, seq, comb, arg, arg_len, 1, out);
}

fl_status fl_tree_aggregate(fl_dataset *ds, fl_bytes zero, fl_reduce_fn seq,
                            fl_reduce_fn comb, const void *arg, size_t arg_len, uint32_t depth,
                            fl_buf *out) {
  CHECK_AGG_ARGS("fl_tree_aggregate", ds, seq, arg, arg_len, out);
  if (!comb) return FL_ERR(FL_EINVAL, "fl_tree_aggregate: comb is NULL");
  if (depth < 1) return FL_ERR(FL_EINVAL, "fl_tree_aggregate: depth must be >= 1");
  return aggregate("tree_aggregate", ds, &zero, seq, comb, arg, arg_len, depth, out);
}

fl_status fl_foreach(fl_dataset *ds, fl_foreach_fn fn, const void *arg, size_t arg_len) {
  common_error_clear();
  if (!ds || !fn) return FL_ERR(FL_EINVAL, "fl_foreach: NULL argument");
  if (arg_len && !arg) return FL_ERR(FL_EINVAL, "fl_foreach: arg_len without arg");
  rdd_action a = {.kind = RDD_ACTION_FOREACH, .foreach_fn = fn, .arg = arg, .arg_len = arg_len};
  fl_buf *res;
  fl_status s = run_all(ds, &a, &res);
  if (s == FL_OK) free_results(res, ds->num_partitions);
  return s;
}

fl_status fl_save_as_text_file(fl_dataset *ds, const char *path) {
  common_error_clear();
  if (!ds || !path || !*path) return FL_ERR(FL_EINVAL, "fl_save_as_text_file: NULL argument");
  struct stat st;
  if (stat(path, &st) == 0) return FL_ERR(FL_EEXIST, "output folder %s already exists", path);
  fl_status s = common_mkdirs(path);
  if (s != FL_OK) return s;
  rdd_action a = {.kind = RDD_ACTION_SAVE_TEXT, .path = path};
  fl_buf *res;
  s = run_all(ds, &a, &res);
  if (s != FL_OK) {
    common_remove_tree(path); /* no half-written output is left to be mistaken for a result */
    return s;
  }
  free_results(res, ds->num_partitions);
  char marker[4096];
  snprintf(marker, sizeof marker, "%s/_SUCCESS", path);
  FILE *f = fopen(marker, "w");
  if (!f || fclose(f) != 0)
    return FL_ERR(FL_EIO, "cannot write %s: %s", marker, strerror(errno));
  return FL_OK;
}
