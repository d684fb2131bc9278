/*
 * checkpoint.c: fl_checkpoint. One job writes every partition of a dataset to a file in a
 * durable folder; then the dataset's lineage is cut: it becomes a source whose partitions
 * are read from those files (rdd_checkpoint_ops), and its parents are released.
 *
 * A part file is a 32-byte header, then chunks as in shuffle blocks ([uint32 length][batch
 * encoded by rdd/batch_codec.c, an LZ4 frame with its own checksum]):
 *
 *   "FLCK" | u32 version (1) | u32 partition | u32 CRC32C of the chunks
 *   | u64 record count | u64 length of the chunks
 *
 * all little-endian. The writer holds one chunk (1 MiB of records) at a time, writes the
 * header last, fsyncs, renames the file into place and fsyncs the folder, so that a part
 * file either is whole or is not there. The reader checks the header against the file's size
 * at open, decodes one chunk at a time, and at the end checks the CRC and the record count;
 * any mismatch fails the task with FL_ECORRUPT naming the file (a missing or unreadable file
 * is FL_EIO). Being durable data, nothing is recomputed in its place.
 *
 * Truncation in a context that ships plans (cluster mode) gives the dataset a fresh id, as a
 * plan node never changes once sent: the driver and executors see a new source dataset,
 * and the old id is released like a freed dataset (design-notes.md, "Checkpoints").
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "proto/plan.pb-c.h"
#include "rdd/ops.h"

/* The state of a checkpointed dataset: the folder of its part files (an absolute path); the
 * dataset has no parents. */
typedef struct checkpoint_state {
  char *dir;
} checkpoint_state;

#define CKPT_MAGIC "FLCK"
#define CKPT_VERSION 1u
#define CKPT_HEADER 32
#define CKPT_CHUNK (1u << 20)
/* A chunk holds about CKPT_CHUNK raw bytes (one record may be larger): a longer length in a
 * file is corruption, not a request for memory. */
#define CKPT_MAX_CHUNK (1u << 30)

typedef struct ckpt_header {
  uint32_t version, partition, crc;
  uint64_t records, payload;
} ckpt_header;

static void header_pack(const ckpt_header *h, uint8_t out[CKPT_HEADER]) {
  memcpy(out, CKPT_MAGIC, 4);
  memcpy(out + 4, &h->version, 4);
  memcpy(out + 8, &h->partition, 4);
  memcpy(out + 12, &h->crc, 4);
  memcpy(out + 16, &h->records, 8);
  memcpy(out + 24, &h->payload, 8);
}

static bool header_unpack(const uint8_t in[CKPT_HEADER], ckpt_header *h) {
  if (memcmp(in, CKPT_MAGIC, 4) != 0) return false;
  memcpy(&h->version, in + 4, 4);
  memcpy(&h->partition, in + 8, 4);
  memcpy(&h->crc, in + 12, 4);
  memcpy(&h->records, in + 16, 8);
  memcpy(&h->payload, in + 24, 8);
  return true;
}

static void part_path(const char *dir, uint32_t p, char *out, size_t len) {
  snprintf(out, len, "%s/part-%05u", dir, p);
}

/* pread of exactly len bytes; false (errno set, 0 for a short file) otherwise. */
static bool read_exact(int fd, void *buf, size_t len, uint64_t offset) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = pread(fd, p, len, (off_t)offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    p += n;
    len -= (size_t)n;
    offset += (uint64_t)n;
  }
  return true;
}

/* ---- writing: the body of a checkpoint task --------------------------------------------- */

static fl_status write_header(int fd, const char *path, const ckpt_header *h) {
  uint8_t head[CKPT_HEADER];
  header_pack(h, head);
  ssize_t n;
  do n = pwrite(fd, head, sizeof head, 0);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)sizeof head)
    return FL_ERR(FL_EIO, "cannot write %s: %s", path, n < 0 ? strerror(errno) : "short write");
  return FL_OK;
}

/* Makes the rename durable: a folder's entries reach the disk when the folder is synced. */
static fl_status sync_folder(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FL_ERR(FL_EIO, "cannot open checkpoint folder %s: %s", dir, strerror(errno));
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  /* Some file systems cannot sync a folder (EINVAL); the rename is then as durable as it gets. */
  if (rc != 0 && e != EINVAL) return FL_ERR(FL_EIO, "cannot sync checkpoint folder %s: %s", dir, strerror(e));
  return FL_OK;
}

fl_status rdd_checkpoint_write(rdd_task *task, fl_iter *in, const char *dir, fl_buf *result) {
  char tmp[PATH_MAX + 64], final[PATH_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s/.part-%05u.attempt-%u.%ld", dir, task->partition, task->attempt,
           (long)getpid());
  part_path(dir, task->partition, final, sizeof final);
  fl_status status = common_mkdirs(dir); /* an executor on another machine sees it first here */
  if (status != FL_OK) return rdd_task_fail(task, status);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot create %s: %s", tmp, strerror(errno)));
  rdd_batch chunk = {FL_BUF_INIT, 0};
  fl_buf enc = FL_BUF_INIT;
  ckpt_header h = {CKPT_VERSION, task->partition, 0, 0, 0};
  uint64_t offset = CKPT_HEADER;
  if (lseek(fd, CKPT_HEADER, SEEK_SET) != CKPT_HEADER) {
    status = FL_ERR(FL_EIO, "cannot write %s: %s", tmp, strerror(errno));
    goto cleanup;
  }
  fl_bytes recs[RDD_ITER_BATCH];
  uint32_t got;
  while ((got = in->next(in, recs, RDD_ITER_BATCH)) > 0) {
    for (uint32_t i = 0; i < got; i++) FL_CHECK(rdd_batch_append(&chunk, recs[i].data, recs[i].len));
    h.records += got;
    if (chunk.buf.len >= CKPT_CHUNK) FL_CHECK(rdd_batch_write_chunk(fd, tmp, &chunk, &enc, &offset, &h.crc));
    if (rdd_task_cancelled(task)) {
      status = FL_ERR(FL_ECANCELLED, "job cancelled");
      goto cleanup;
    }
  }
  if ((status = task->status) != FL_OK) goto cleanup;
  FL_CHECK(rdd_batch_write_chunk(fd, tmp, &chunk, &enc, &offset, &h.crc));
  h.payload = offset - CKPT_HEADER;
  FL_CHECK(write_header(fd, tmp, &h));
  if (fsync(fd) != 0) {
    status = FL_ERR(FL_EIO, "cannot sync %s: %s", tmp, strerror(errno));
    goto cleanup;
  }
  int rc = close(fd);
  fd = -1;
  if (rc != 0) {
    status = FL_ERR(FL_EIO, "cannot write %s: %s", tmp, strerror(errno));
    goto cleanup;
  }
  if (rename(tmp, final) != 0) {
    status = FL_ERR(FL_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    goto cleanup;
  }
  FL_CHECK(sync_folder(dir));
  FL_CHECK(fl_buf_append(result, &h.records, sizeof h.records));
cleanup:
  if (fd >= 0) close(fd);
  if (status != FL_OK) unlink(tmp);
  rdd_batch_free(&chunk);
  fl_buf_free(&enc);
  if (status != FL_OK) return rdd_task_fail(task, status);
  return FL_OK;
}

/* ---- reading: the checkpointed dataset's partitions ------------------------------------- */

typedef struct ckpt_iter {
  fl_iter base;
  char path[PATH_MAX + 16];
  int fd;
  ckpt_header head;
  uint64_t pos, end; /* file offsets: the next chunk, the end of the chunks */
  uint64_t records;  /* handed out so far */
  uint32_t crc;      /* of the chunks read so far */
  rdd_batch chunk;
  rdd_cursor cursor;
  fl_buf enc;
} ckpt_iter;

static fl_status corrupt(const ckpt_iter *it, const char *what) {
  return FL_ERR(FL_ECORRUPT, "checkpoint file %s is corrupt: %s", it->path, what);
}

/* Reads and decodes the chunk at it->pos. */
static fl_status next_chunk(ckpt_iter *it) {
  uint32_t len;
  if (it->end - it->pos < 4) return corrupt(it, "a chunk runs past the end");
  if (!read_exact(it->fd, &len, 4, it->pos))
    return errno ? FL_ERR(FL_EIO, "cannot read checkpoint file %s: %s", it->path, strerror(errno))
                 : corrupt(it, "the file is shorter than its header says");
  if (len == 0 || len > CKPT_MAX_CHUNK || len > it->end - it->pos - 4)
    return corrupt(it, "a chunk length does not fit the file");
  it->enc.len = 0;
  fl_status s = fl_buf_reserve(&it->enc, len);
  if (s != FL_OK) return s;
  if (!read_exact(it->fd, it->enc.data, len, it->pos + 4))
    return errno ? FL_ERR(FL_EIO, "cannot read checkpoint file %s: %s", it->path, strerror(errno))
                 : corrupt(it, "the file is shorter than its header says");
  it->enc.len = len;
  it->crc = common_crc32c(it->crc, &len, 4);
  it->crc = common_crc32c(it->crc, it->enc.data, len);
  rdd_batch_free(&it->chunk);
  if ((s = rdd_batch_decode(fl_buf_bytes(&it->enc), it->path, &it->chunk)) != FL_OK)
    return common_error_wrap(s, "checkpoint file is corrupt: ");
  it->pos += 4 + (uint64_t)len;
  it->base.task->input_bytes += 4 + (uint64_t)len;
  it->cursor = (rdd_cursor){it->chunk.buf.data, it->chunk.buf.data + it->chunk.buf.len};
  return FL_OK;
}

/* Records are views into the current chunk, which the next read replaces: so a batch ends
 * where a chunk ends, unless it is still empty. */
static uint32_t ckpt_next(fl_iter *base, fl_bytes *out, uint32_t max) {
  ckpt_iter *it = (ckpt_iter *)base;
  uint32_t n = 0;
  while (n < max) {
    if (rdd_cursor_next(&it->cursor, &out[n])) {
      n++;
      continue;
    }
    if (n > 0) break;
    fl_status s = FL_OK;
    if (it->pos == it->end) {
      if (it->records != it->head.records) s = corrupt(it, "it holds fewer records than its header says");
      else if (it->crc != it->head.crc) s = corrupt(it, "CRC32C mismatch");
      if (s != FL_OK) rdd_task_fail(base->task, s);
      return 0;
    }
    if ((s = next_chunk(it)) != FL_OK) {
      rdd_task_fail(base->task, s);
      return 0;
    }
    if (it->records + it->chunk.count > it->head.records) {
      rdd_task_fail(base->task, corrupt(it, "it holds more records than its header says"));
      return 0;
    }
    it->records += it->chunk.count;
  }
  return n;
}

static void ckpt_close(fl_iter *base) {
  ckpt_iter *it = (ckpt_iter *)base;
  if (it->fd >= 0) close(it->fd);
  rdd_batch_free(&it->chunk);
  fl_buf_free(&it->enc);
}

static fl_status ckpt_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  const checkpoint_state *st = r->state;
  ckpt_iter *it = rdd_iter_new(task, sizeof *it, ckpt_next, ckpt_close);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  part_path(st->dir, p, it->path, sizeof it->path);
  it->fd = open(it->path, O_RDONLY | O_CLOEXEC);
  if (it->fd < 0)
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot open checkpoint file %s of dataset %llu: %s",
                                      it->path, (unsigned long long)r->id, strerror(errno)));
  uint8_t head[CKPT_HEADER];
  struct stat sb;
  if (fstat(it->fd, &sb) != 0)
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot read checkpoint file %s: %s", it->path, strerror(errno)));
  if (!read_exact(it->fd, head, sizeof head, 0)) {
    if (errno) return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot read checkpoint file %s: %s", it->path, strerror(errno)));
    return rdd_task_fail(task, corrupt(it, "truncated header"));
  }
  if (!header_unpack(head, &it->head)) return rdd_task_fail(task, corrupt(it, "bad magic"));
  if (it->head.version != CKPT_VERSION) {
    char what[64];
    snprintf(what, sizeof what, "unknown version %u", it->head.version);
    return rdd_task_fail(task, corrupt(it, what));
  }
  if (it->head.partition != p) return rdd_task_fail(task, corrupt(it, "it holds another partition"));
  if (it->head.payload != (uint64_t)sb.st_size - CKPT_HEADER) {
    char what[128];
    snprintf(what, sizeof what, "the header says %llu bytes of records, the file holds %lld",
             (unsigned long long)it->head.payload, (long long)sb.st_size - CKPT_HEADER);
    return rdd_task_fail(task, corrupt(it, what));
  }
  it->pos = CKPT_HEADER;
  it->end = (uint64_t)sb.st_size;
  task->input_bytes += CKPT_HEADER;
  *out = &it->base;
  return FL_OK;
}

static void ckpt_state_free(void *state) {
  checkpoint_state *st = state;
  if (!st) return;
  common_free(st->dir);
  common_free(st);
}

static void ckpt_destroy(rdd *r) { ckpt_state_free(r->state); }

static const rdd_ops rdd_checkpoint_ops = {"checkpoint", ckpt_open, ckpt_destroy};

/* ---- fl_checkpoint --------------------------------------------------------------------- */

static pthread_mutex_t name_lock = PTHREAD_MUTEX_INITIALIZER;

/* The context's folder name: the process id and 64 random bits (Spark uses a UUID per
 * context), so that contexts of one process and applications of many never collide. */
static const char *context_name(fl_context *ctx) {
  FL_PCHECK(pthread_mutex_lock(&name_lock));
  if (!ctx->checkpoint_name[0]) {
    uint64_t bits = common_random_u64();
    snprintf(ctx->checkpoint_name, sizeof ctx->checkpoint_name, "ctx-%ld-%016llx", (long)getpid(),
             (unsigned long long)bits);
  }
  FL_PCHECK(pthread_mutex_unlock(&name_lock));
  return ctx->checkpoint_name;
}

/* Cuts r's lineage: r becomes a checkpoint source reading `dir` (taken). */
static void truncate_lineage(rdd *r, checkpoint_state *st) {
  fl_context *ctx = r->ctx;
  if (ctx->runtime->rdd_destroyed) {
    /* The old node may have been sent: the truncated dataset is a new one to the driver. */
    uint64_t old = r->id;
    r->id = atomic_fetch_add(&ctx->next_rdd_id, 1);
    ctx->runtime->rdd_destroyed(ctx->runtime_impl, old);
  }
  if (r->ops->destroy) r->ops->destroy(r); /* shuffled: releases its dependencies */
  r->num_shuffle_deps = 0;
  for (uint32_t i = 0; i < r->num_parents; i++) {
    rdd_release(r->parents[i]);
    r->parents[i] = NULL;
  }
  r->num_parents = 0;
  common_free(r->arg);
  r->arg = NULL;
  r->arg_len = 0;
  r->fn = NULL;
  r->fn_kind = "checkpoint";
  fl_buf_free(&r->plan_node);
  r->ops = &rdd_checkpoint_ops;
  r->state = st;
}

fl_status fl_checkpoint(fl_dataset *ds, const char *dir) {
  common_error_clear();
  if (!ds) return FL_ERR(FL_EINVAL, "fl_checkpoint: dataset is NULL");
  if (!dir || !*dir) return FL_ERR(FL_EINVAL, "fl_checkpoint: the checkpoint folder is NULL or empty");
  if (ds->ops == &rdd_checkpoint_ops) return FL_OK;
  char folder[PATH_MAX], real[PATH_MAX];
  if (snprintf(folder, sizeof folder, "%s/%s/rdd-%llu", dir, context_name(ds->ctx),
               (unsigned long long)ds->id) >= (int)sizeof folder)
    return FL_ERR(FL_EINVAL, "fl_checkpoint: checkpoint folder %s: path too long", dir);
  fl_status status = common_mkdirs(folder);
  if (status != FL_OK) return common_error_wrap(status, "fl_checkpoint: checkpoint folder %s: ", dir);
  if (!realpath(folder, real)) return FL_ERR(FL_EIO, "fl_checkpoint: cannot resolve %s: %s", folder, strerror(errno));
  if (access(real, W_OK | X_OK) != 0)
    return FL_ERR(FL_EIO, "fl_checkpoint: checkpoint folder %s is not writable: %s", real, strerror(errno));

  uint32_t n = ds->num_partitions;
  fl_buf *results = common_calloc(n ? n : 1, sizeof *results);
  checkpoint_state *st = common_calloc(1, sizeof *st);
  if (!results || !st || !(st->dir = common_strdup(real))) {
    status = FL_ERR(FL_ENOMEM, "fl_checkpoint: out of memory");
    goto cleanup;
  }
  rdd_action a = {.kind = RDD_ACTION_CHECKPOINT, .path = real};
  if (n) FL_CHECK(rdd_run_job(ds, NULL, n, &a, results));
  for (uint32_t i = 0; i < n; i++)
    if (results[i].len != 8) {
      status = FL_ERR(FL_EINTERNAL, "checkpoint of partition %u gave a result of %zu bytes", i, results[i].len);
      goto cleanup;
    }
  truncate_lineage(ds, st);
  st = NULL;
cleanup:
  if (status != FL_OK) common_remove_tree(real); /* no half checkpoint is left behind */
  for (uint32_t i = 0; results && i < n; i++) fl_buf_free(&results[i]);
  common_free(results);
  if (st) {
    common_free(st->dir);
    common_free(st);
  }
  return status;
}

/* ---- plan codec ---------------------------------------------------------------------------- */

static fl_status ckpt_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  m->checkpoint = ((const checkpoint_state *)r->state)->dir;
  return FL_OK;
}

static fl_status ckpt_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                             void **state) {
  if (m->checkpoint[0] != '/' || strlen(m->checkpoint) >= 4096)
    return rdd_plan_bad(d, "checkpoint folder '%.64s' is not an absolute path of at most 4095 bytes",
                        m->checkpoint);
  checkpoint_state *st = common_calloc(1, sizeof *st);
  if (!st || !(st->dir = common_strdup(m->checkpoint))) {
    common_free(st);
    return FL_ERR(FL_ENOMEM, "cannot decode a checkpoint");
  }
  *state = st;
  return FL_OK;
}

const rdd_op_codec rdd_checkpoint_codecs[] = {
    {&rdd_checkpoint_ops, RDD_SHAPE_SOURCE, RDD_PLAN_CHECKPOINT, NULL, ckpt_encode, ckpt_decode,
     ckpt_state_free, NULL},
    {NULL},
};
