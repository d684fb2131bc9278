/*
 * writer.c: the body of a map task. Each pair of the partition goes to the reduce partition
 * its key is placed in; pairs are sorted by partition (and combined map-side when the
 * dependency says so) through the external sorter, then written as one data file per map
 * task: for every reduce partition in turn, its block: chunks of encoded pairs (LZ4 frames
 * with a checksum, see shuffle.h), none for an empty partition. An index file beside it
 * holds the R + 1 offsets. Both are
 * written under attempt names and renamed into place, so a retried or failed attempt never
 * leaves half a file for a reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shuffle/shuffle.h"

static fl_status write_file(const char *path, const void *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return FL_ERR(FL_EIO, "cannot create %s: %s", path, strerror(errno));
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      close(fd);
      return FL_ERR(FL_EIO, "cannot write %s: %s", path, strerror(e));
    }
    p += n;
    len -= (size_t)n;
  }
  if (close(fd) != 0) return FL_ERR(FL_EIO, "cannot write %s: %s", path, strerror(errno));
  return FL_OK;
}

/* Appends the pending pairs as one chunk ([uint32 length][encoded batch]) to the data file. */
static fl_status flush_chunk(int fd, const char *path, rdd_batch *chunk, fl_buf *enc,
                             uint64_t *offset) {
  return rdd_batch_write_chunk(fd, path, chunk, enc, offset, NULL);
}

fl_status shuffle_write(rdd_task *task, fl_iter *in, const rdd_shuffle_dep *dep, fl_buf *status) {
  fl_context *ctx = task->ctx;
  uint32_t reduces = dep->partitioner->num_partitions;
  shuffle_sorter_config cfg = {
      .memory = ctx->shuffle_memory,
      .dir = ctx->work_dir,
      .order_keys = dep->key_order != NULL,
      .key_order = dep->key_order,
      .key_order_arg = dep->key_order_arg,
      .agg = dep->map_combine,
      .task = task,
  };
  shuffle_sorter *sorter = NULL;
  uint64_t *offsets = common_calloc(reduces + 1, sizeof *offsets);
  rdd_batch block = {FL_BUF_INIT, 0};
  fl_buf enc = FL_BUF_INIT, pair = FL_BUF_INIT;
  char data_path[4096], tmp_data[4200], index_path[4200], tmp_index[4300];
  int fd = -1;
  fl_status st;
  if (!offsets) return rdd_task_fail(task, FL_ERR(FL_ENOMEM, "shuffle: out of memory"));
  if ((st = shuffle_sorter_create(&cfg, &sorter)) != FL_OK) goto cleanup;

  fl_bytes recs[RDD_ITER_BATCH], keys[RDD_ITER_BATCH], values[RDD_ITER_BATCH];
  uint32_t parts[RDD_ITER_BATCH];
  uint64_t hashes[RDD_ITER_BATCH]; /* each key hashed once, for its partition and the sorter */
  uint32_t got;
  while ((got = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
    for (uint32_t i = 0; i < got; i++) {
      if ((st = fl_pair(recs[i], &keys[i], &values[i])) != FL_OK) {
        common_error_wrap(st, "shuffle %llu, map %u: ", (unsigned long long)dep->shuffle_id,
                          task->partition);
        goto cleanup;
      }
      hashes[i] = common_hash_bytes(keys[i].data, keys[i].len);
      parts[i] = rdd_partitioner_place_hashed(dep->partitioner, keys[i], hashes[i]);
    }
    if ((st = shuffle_sorter_insert_batch(sorter, got, parts, keys, values, hashes)) != FL_OK) goto cleanup;
    if (rdd_task_cancelled(task)) {
      st = FL_ERR(FL_ECANCELLED, "job cancelled");
      goto cleanup;
    }
  }
  if ((st = task->status) != FL_OK) goto cleanup;
  if ((st = shuffle_sorter_finish(sorter)) != FL_OK) goto cleanup;

  ctx->cache->shuffle_path(ctx->cache_impl, dep->shuffle_id, task->partition, data_path, sizeof data_path);
  snprintf(tmp_data, sizeof tmp_data, "%s.attempt-%u", data_path, task->attempt);
  snprintf(index_path, sizeof index_path, "%s.index", data_path);
  snprintf(tmp_index, sizeof tmp_index, "%s.attempt-%u", index_path, task->attempt);
  fd = open(tmp_data, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    st = FL_ERR(FL_EIO, "cannot create %s: %s", tmp_data, strerror(errno));
    goto cleanup;
  }
  uint32_t part = 0, current = 0;
  fl_bytes key, value;
  uint64_t offset = 0;
  while (shuffle_sorter_next(sorter, &part, &key, &value)) {
    while (current < part) { /* end the blocks of the partitions before this one */
      if ((st = flush_chunk(fd, tmp_data, &block, &enc, &offset)) != FL_OK) goto cleanup;
      offsets[++current] = offset;
    }
    pair.len = 0;
    if ((st = fl_buf_put_pair(&pair, key, value)) != FL_OK ||
        (st = rdd_batch_append(&block, pair.data, pair.len)) != FL_OK)
      goto cleanup;
    if (block.buf.len >= SHUFFLE_CHUNK && (st = flush_chunk(fd, tmp_data, &block, &enc, &offset)) != FL_OK)
      goto cleanup;
  }
  if ((st = task->status) != FL_OK) goto cleanup;
  while (current < reduces) {
    if ((st = flush_chunk(fd, tmp_data, &block, &enc, &offset)) != FL_OK) goto cleanup;
    offsets[++current] = offset;
  }
  if (close(fd) != 0) {
    fd = -1;
    st = FL_ERR(FL_EIO, "cannot write %s: %s", tmp_data, strerror(errno));
    goto cleanup;
  }
  fd = -1;
  if ((st = write_file(tmp_index, offsets, (reduces + 1) * sizeof *offsets)) != FL_OK) goto cleanup;
  if (rename(tmp_data, data_path) != 0 || rename(tmp_index, index_path) != 0) {
    st = FL_ERR(FL_EIO, "cannot commit shuffle output %s: %s", data_path, strerror(errno));
    goto cleanup;
  }
  task->shuffle_write_bytes += offset; /* the data file; spilled runs are not output */
  /* The map status: bytes per reduce partition. */
  status->len = 0;
  for (uint32_t r = 0; r < reduces && st == FL_OK; r++) {
    uint64_t size = offsets[r + 1] - offsets[r];
    st = fl_buf_append(status, &size, 8);
  }
cleanup:
  if (fd >= 0) close(fd);
  if (st != FL_OK) {
    unlink(tmp_data);
    unlink(tmp_index);
  }
  shuffle_sorter_destroy(sorter);
  common_free(offsets);
  rdd_batch_free(&block);
  fl_buf_free(&enc);
  fl_buf_free(&pair);
  if (st != FL_OK) return rdd_task_fail(task, st);
  return FL_OK;
}
