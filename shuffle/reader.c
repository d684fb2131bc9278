/*
 * reader.c: the reduce side. A shuffled dataset's partition p reads, from each of its
 * inputs, either the block of p from every map task of a shuffle or (when the input is
 * already partitioned the same way) the parent's partition p itself, and then:
 *   plain      hands the pairs on as they come (partition_by, repartition);
 *   aggregate  combines the values of each key (combine_by_key and its family);
 *   group      gathers each key's values into one group (group_by_key);
 *   sort       orders the pairs by key (sort_by_key);
 *   cogroup    gathers each key's values from both inputs (cogroup, join, subtract).
 * All but plain go through the external sorter, so memory stays within the budget.
 * A block that is missing or fails its checks fails the task with FL_EFETCH, naming the
 * shuffle, the map and the reduce partition.
 */
#include <stdio.h>
#include <string.h>

#include "shuffle/shuffle.h"

/* ---- fetching -------------------------------------------------------------------------- */

/* A block read chunk by chunk (see shuffle.h), so that a reader holds one chunk at a time. */
typedef struct block_stream {
  const rdd_shuffle_dep *dep;
  uint32_t map, reduce;
  uint64_t pos, len;
  bool started;
  fl_buf enc;
} block_stream;

static void block_stream_start(block_stream *b, const rdd_shuffle_dep *dep, uint32_t map,
                               uint32_t reduce) {
  b->dep = dep;
  b->map = map;
  b->reduce = reduce;
  b->pos = b->len = 0;
  b->started = false;
}

/* Notes on the task which map output failed (the scheduler reruns that map task). */
static fl_status fetch_failed(rdd_task *task, const block_stream *b, fl_status st) {
  if (st == FL_EFETCH && !task->fetch_failed) {
    task->fetch_failed = true;
    task->fetch_shuffle_id = b->dep->shuffle_id;
    task->fetch_map = b->map;
  }
  return st;
}

static fl_status stream_error(rdd_task *task, const block_stream *b, const char *why) {
  return fetch_failed(task, b, FL_ERR(FL_EFETCH, "fetch failed: shuffle %llu, map %u, reduce %u: %s",
                                      (unsigned long long)b->dep->shuffle_id, b->map, b->reduce, why));
}

/* The next chunk of the block, decoded and checked, into *chunk; *got is false at the end. */
static fl_status block_stream_next(rdd_task *task, block_stream *b, rdd_batch *chunk, bool *got) {
  fl_context *ctx = task->ctx;
  *got = false;
  if (b->started && b->pos >= b->len) return FL_OK;
  uint64_t id = b->dep->shuffle_id;
  fl_status st = ctx->cache->shuffle_fetch(ctx->cache_impl, id, b->map, b->reduce, b->pos, 4,
                                           &b->enc, &b->len);
  if (st != FL_OK) return fetch_failed(task, b, common_error_wrap(FL_EFETCH, "fetch failed: "));
  b->started = true;
  if (b->pos >= b->len) return FL_OK;
  if (b->enc.len != 4) return stream_error(task, b, "block is truncated");
  uint32_t chunk_len;
  memcpy(&chunk_len, b->enc.data, 4);
  if (chunk_len > b->len - b->pos - 4) return stream_error(task, b, "chunk runs past the block");
  uint64_t block_len;
  st = ctx->cache->shuffle_fetch(ctx->cache_impl, id, b->map, b->reduce, b->pos + 4, chunk_len,
                                 &b->enc, &block_len);
  if (st != FL_OK) return fetch_failed(task, b, common_error_wrap(FL_EFETCH, "fetch failed: "));
  if (b->enc.len != chunk_len) return stream_error(task, b, "block is truncated");
  char what[128];
  snprintf(what, sizeof what, "shuffle %llu, map %u, reduce %u", (unsigned long long)id, b->map, b->reduce);
  rdd_batch_free(chunk);
  if ((st = rdd_batch_decode(fl_buf_bytes(&b->enc), what, chunk)) != FL_OK)
    return fetch_failed(task, b, common_error_wrap(FL_EFETCH, "fetch failed: "));
  b->pos += 4 + (uint64_t)chunk_len;
  task->shuffle_read_bytes += 4 + (uint64_t)chunk_len; /* the block's bytes, as written */
  *got = true;
  return FL_OK;
}

/* Called with the pairs of input `side` for partition p, a batch at a time. */
typedef fl_status (*pairs_fn)(void *ctx, uint32_t side, uint32_t n, const fl_bytes *keys,
                              const fl_bytes *values);

/* Splits records into keys and values and hands them to fn, a batch at a time. */
static fl_status pass_pairs(uint32_t side, uint32_t n, const fl_bytes *recs, fl_bytes *keys,
                            fl_bytes *values, pairs_fn fn, void *fn_ctx) {
  for (uint32_t i = 0; i < n; i++) {
    fl_status s = fl_pair(recs[i], &keys[i], &values[i]);
    if (s != FL_OK) return s;
  }
  return n ? fn(fn_ctx, side, n, keys, values) : FL_OK;
}

static fl_status for_each_input_pair(rdd_task *task, const shuffled_state *st, uint32_t p,
                                     pairs_fn fn, void *fn_ctx) {
  fl_status s = FL_OK;
  rdd_batch chunk = {FL_BUF_INIT, 0};
  block_stream b = {0};
  fl_bytes recs[RDD_ITER_BATCH], keys[RDD_ITER_BATCH], values[RDD_ITER_BATCH];
  for (uint32_t side = 0; side < st->num_inputs && s == FL_OK; side++) {
    const shuffle_input *input = &st->inputs[side];
    if (input->dep) {
      uint32_t maps = input->dep->parent->num_partitions;
      for (uint32_t m = 0; m < maps && s == FL_OK; m++) {
        block_stream_start(&b, input->dep, m, p);
        bool got;
        while (s == FL_OK && (s = block_stream_next(task, &b, &chunk, &got)) == FL_OK && got) {
          rdd_cursor c = {chunk.buf.data, chunk.buf.data + chunk.buf.len};
          uint32_t n;
          do {
            for (n = 0; n < RDD_ITER_BATCH && rdd_cursor_next(&c, &recs[n]); n++) {}
            s = pass_pairs(side, n, recs, keys, values, fn, fn_ctx);
          } while (s == FL_OK && n == RDD_ITER_BATCH);
        }
        if (s == FL_OK && rdd_task_cancelled(task)) s = FL_ERR(FL_ECANCELLED, "job cancelled");
      }
    } else {
      fl_iter *in;
      if ((s = rdd_iterate(input->parent, p, task, &in)) != FL_OK) break;
      uint32_t got;
      while (s == FL_OK && (got = in->next(in, recs, RDD_ITER_BATCH)) > 0)
        s = pass_pairs(side, got, recs, keys, values, fn, fn_ctx);
      if (s == FL_OK) s = task->status;
    }
  }
  rdd_batch_free(&chunk);
  fl_buf_free(&b.enc);
  return s;
}

/* ---- the iterator ---------------------------------------------------------------------- */

typedef struct shuffled_iter {
  fl_iter base;
  rdd *r;
  const shuffled_state *st;
  uint32_t partition;
  shuffle_sorter *sorter;
  fl_buf tagged; /* cogroup: [side][value] */
  /* plain */
  uint32_t side, map;
  bool started, in_block;
  block_stream stream;
  rdd_batch block;
  rdd_cursor cursor;
  fl_iter *narrow;
  /* group and cogroup: the first entry of the next key, read ahead */
  bool pending;
  fl_buf pending_key, pending_value;
  rdd_batch groups[2];
  fl_buf outs[RDD_ITER_BATCH];
} shuffled_iter;

static void shuffled_close(fl_iter *it) {
  shuffled_iter *s = (shuffled_iter *)it;
  shuffle_sorter_destroy(s->sorter);
  fl_buf_free(&s->tagged);
  fl_buf_free(&s->stream.enc);
  rdd_batch_free(&s->block);
  fl_buf_free(&s->pending_key);
  fl_buf_free(&s->pending_value);
  rdd_batch_free(&s->groups[0]);
  rdd_batch_free(&s->groups[1]);
  for (uint32_t i = 0; i < RDD_ITER_BATCH; i++) fl_buf_free(&s->outs[i]);
}

static fl_status insert_pairs(void *ctx, uint32_t side, uint32_t n, const fl_bytes *keys,
                              const fl_bytes *values) {
  shuffled_iter *s = ctx;
  if (s->st->mode != SHUFFLED_COGROUP) {
    static const uint32_t zeros[RDD_ITER_BATCH];
    return shuffle_sorter_insert_batch(s->sorter, n, zeros, keys, values, NULL);
  }
  /* Cogroup: each value carries its side in front. */
  uint8_t tag = (uint8_t)side;
  fl_status st = FL_OK;
  for (uint32_t i = 0; i < n && st == FL_OK; i++) {
    s->tagged.len = 0;
    st = fl_buf_append(&s->tagged, &tag, 1);
    if (st == FL_OK) st = fl_buf_append(&s->tagged, values[i].data, values[i].len);
    if (st == FL_OK) st = shuffle_sorter_insert(s->sorter, 0, keys[i], fl_buf_bytes(&s->tagged));
  }
  return st;
}

/* Plain: the pairs of each input block (or narrow parent) in turn. */
static uint32_t plain_next(shuffled_iter *s, fl_bytes *out, uint32_t max) {
  rdd_task *task = s->base.task;
  for (;;) {
    if (s->narrow) {
      uint32_t n = s->narrow->next(s->narrow, out, max);
      if (n > 0 || task->status != FL_OK) return n;
      s->narrow = NULL;
      s->side++;
      s->map = 0;
      continue;
    }
    uint32_t n = 0;
    while (n < max && rdd_cursor_next(&s->cursor, &out[n])) n++;
    if (n > 0) return n;
    if (s->side >= s->st->num_inputs) return 0;
    const shuffle_input *input = &s->st->inputs[s->side];
    if (!input->dep) {
      if (rdd_iterate(input->parent, s->partition, task, &s->narrow) != FL_OK) return 0;
      continue;
    }
    if (!s->in_block) {
      if (s->map >= input->dep->parent->num_partitions) {
        s->side++;
        s->map = 0;
        continue;
      }
      block_stream_start(&s->stream, input->dep, s->map++, s->partition);
      s->in_block = true;
    }
    bool got;
    fl_status st = block_stream_next(task, &s->stream, &s->block, &got);
    if (st != FL_OK) {
      rdd_task_fail(task, st);
      return 0;
    }
    if (!got) {
      s->in_block = false;
      continue;
    }
    s->cursor.p = s->block.buf.data;
    s->cursor.end = s->block.buf.data + s->block.buf.len;
  }
}

static bool take_entry(shuffled_iter *s, fl_bytes *key, fl_bytes *value) {
  if (s->pending) {
    s->pending = false;
    *key = fl_buf_bytes(&s->pending_key);
    *value = fl_buf_bytes(&s->pending_value);
    return true;
  }
  uint32_t part;
  return shuffle_sorter_next(s->sorter, &part, key, value);
}

/* Group and cogroup: gathers the values of the next key into s->groups; false at the end. */
static fl_status next_group(shuffled_iter *s, fl_buf *key_out, bool *found) {
  fl_bytes key, value;
  *found = false;
  if (!take_entry(s, &key, &value)) return s->base.task->status;
  fl_status st;
  key_out->len = 0;
  if ((st = fl_buf_append(key_out, key.data, key.len)) != FL_OK) return st;
  for (int g = 0; g < 2; g++) {
    s->groups[g].buf.len = 0;
    s->groups[g].count = 0;
  }
  *found = true;
  for (;;) {
    uint32_t side = 0;
    if (s->st->mode == SHUFFLED_COGROUP) {
      side = value.data[0] ? 1 : 0;
      value.data++;
      value.len--;
    }
    if ((st = rdd_batch_append(&s->groups[side], value.data, value.len)) != FL_OK) return st;
    uint32_t part;
    if (!shuffle_sorter_next(s->sorter, &part, &key, &value)) return s->base.task->status;
    if (key.len != key_out->len || (key.len && memcmp(key.data, key_out->data, key.len) != 0)) {
      /* The first entry of the next key: keep it for the next call. */
      s->pending_key.len = s->pending_value.len = 0;
      if ((st = fl_buf_append(&s->pending_key, key.data, key.len)) != FL_OK ||
          (st = fl_buf_append(&s->pending_value, value.data, value.len)) != FL_OK)
        return st;
      s->pending = true;
      return FL_OK;
    }
  }
}

static uint32_t shuffled_next(fl_iter *it, fl_bytes *out, uint32_t max) {
  shuffled_iter *s = (shuffled_iter *)it;
  rdd_task *task = it->task;
  fl_status st;
  if (s->st->mode == SHUFFLED_PLAIN) return plain_next(s, out, max);
  if (!s->started) {
    s->started = true;
    shuffle_sorter_config cfg = {
        .memory = task->ctx->shuffle_memory,
        .dir = task->ctx->work_dir,
        /* Groups need equal keys adjacent and sorts need order; aggregation needs neither. */
        .order_keys = s->st->mode != SHUFFLED_AGGREGATE,
        .key_order = s->st->mode == SHUFFLED_SORT ? s->st->key_order : NULL,
        .key_order_arg = s->r->arg,
        .descending = s->st->descending,
        .agg = s->st->mode == SHUFFLED_AGGREGATE ? &s->st->agg : NULL,
        .values_are_combiners = s->st->values_are_combiners,
        .task = task,
        .fn_owner = s->r,
    };
    if ((st = shuffle_sorter_create(&cfg, &s->sorter)) != FL_OK ||
        (st = for_each_input_pair(task, s->st, s->partition, insert_pairs, s)) != FL_OK ||
        (st = shuffle_sorter_finish(s->sorter)) != FL_OK) {
      rdd_task_fail(task, st);
      return 0;
    }
  }
  uint32_t n = 0;
  fl_buf key = FL_BUF_INIT, blob = FL_BUF_INIT;
  while (n < max) {
    fl_buf *o = &s->outs[n];
    o->len = 0;
    if (s->st->mode == SHUFFLED_AGGREGATE || s->st->mode == SHUFFLED_SORT) {
      uint32_t part;
      fl_bytes k, v;
      if (!shuffle_sorter_next(s->sorter, &part, &k, &v)) break;
      if ((st = fl_buf_put_pair(o, k, v)) != FL_OK) goto failed;
    } else {
      bool found;
      if ((st = next_group(s, &key, &found)) != FL_OK) goto failed;
      if (!found) break;
      blob.len = 0;
      if (s->st->mode == SHUFFLED_COGROUP) {
        uint8_t head[COMMON_VARINT_MAX];
        size_t h = common_varint_put(head, s->groups[0].buf.len);
        if ((st = fl_buf_append(&blob, head, h)) != FL_OK ||
            (st = fl_buf_append(&blob, s->groups[0].buf.data, s->groups[0].buf.len)) != FL_OK ||
            (st = fl_buf_append(&blob, s->groups[1].buf.data, s->groups[1].buf.len)) != FL_OK)
          goto failed;
      } else if ((st = fl_buf_append(&blob, s->groups[0].buf.data, s->groups[0].buf.len)) != FL_OK) {
        goto failed;
      }
      if ((st = fl_buf_put_pair(o, fl_buf_bytes(&key), fl_buf_bytes(&blob))) != FL_OK) goto failed;
    }
    out[n] = fl_buf_bytes(o);
    n++;
  }
  fl_buf_free(&key);
  fl_buf_free(&blob);
  return task->status == FL_OK ? n : 0;
failed:
  fl_buf_free(&key);
  fl_buf_free(&blob);
  rdd_task_fail(task, st);
  return 0;
}

static fl_status shuffled_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  shuffled_iter *it = rdd_iter_new(task, sizeof *it, shuffled_next, shuffled_close);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->r = r;
  it->st = r->state;
  it->partition = p;
  *out = &it->base;
  return FL_OK;
}

static void shuffled_destroy(rdd *r) {
  shuffled_state *st = r->state;
  if (!st) return;
  fl_context *ctx = r->ctx;
  for (uint32_t i = 0; i < st->num_inputs; i++) {
    rdd_shuffle_dep *dep = st->inputs[i].dep;
    if (!dep) continue;
    ctx->cache->shuffle_remove(ctx->cache_impl, dep->shuffle_id, dep->parent->num_partitions);
    map_output_forget(ctx->map_outputs, dep->shuffle_id);
    rdd_partitioner_release(dep->partitioner);
    rdd_release(dep->parent);
  }
  fl_buf_free(&st->zero);
  common_free(st);
}

const rdd_ops shuffled_ops = {"shuffled", shuffled_open, shuffled_destroy};

void shuffle_add_dep(rdd *r, shuffled_state *st, uint32_t i, uint64_t shuffle_id, rdd *parent,
                      bool map_combine, fl_compare_fn key_order) {
  rdd_shuffle_dep *dep = &st->deps[i];
  dep->shuffle_id = shuffle_id;
  dep->parent = parent;
  rdd_retain(parent);
  dep->partitioner = r->partitioner;
  rdd_partitioner_retain(r->partitioner);
  dep->map_combine = map_combine ? &st->agg : NULL;
  dep->key_order = key_order;
  dep->key_order_arg = key_order ? r->arg : NULL;
  dep->write = shuffle_write;
  st->inputs[i].dep = dep;
  r->shuffle_deps[r->num_shuffle_deps++] = dep;
  if (dep->map_combine) st->values_are_combiners = true;
}
