/* batch_codec.c: record batches: counting and checking their records, and their encoding
 * as LZ4 frames with a content checksum.
 *
 * Layout: "FLB1", record count (u64 LE), raw length (u64 LE), then one LZ4 frame of the
 * batch's bytes. Decoding checks the magic, the frame (its checksum included), the raw
 * length and every record's length prefix before the batch is used. */
#include <errno.h>
#include <lz4frame.h>
#include <string.h>
#include <unistd.h>

#include "rdd/rdd.h"

/* ---- batches (rdd.h) ------------------------------------------------------------------ */

void rdd_batch_free(rdd_batch *b) {
  fl_buf_free(&b->buf);
  b->count = 0;
}

bool rdd_batch_count(const uint8_t *data, size_t len, uint64_t *count) {
  rdd_cursor c = {data, data + len};
  fl_bytes rec;
  uint64_t n = 0;
  while (c.p < c.end) {
    if (!rdd_cursor_next(&c, &rec)) return false;
    n++;
  }
  *count = n;
  return true;
}

bool rdd_batch_valid(const uint8_t *data, size_t len, uint64_t count) {
  uint64_t n;
  return rdd_batch_count(data, len, &n) && n == count;
}

/* ---- the codec ------------------------------------------------------------------------- */

#define CODEC_MAGIC "FLB1"
#define CODEC_HEADER 20
/* A decoded block larger than this is taken as a corrupt header, not a request for memory. */
#define CODEC_MAX_RAW (1ull << 40)

fl_status rdd_batch_encode(const rdd_batch *batch, fl_buf *out) {
  LZ4F_preferences_t prefs;
  memset(&prefs, 0, sizeof prefs);
  prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  prefs.frameInfo.contentSize = batch->buf.len;
  size_t bound = LZ4F_compressFrameBound(batch->buf.len, &prefs);
  out->len = 0;
  fl_status s = fl_buf_reserve(out, CODEC_HEADER + bound);
  if (s != FL_OK) return s;
  uint64_t count = batch->count, raw = batch->buf.len;
  memcpy(out->data, CODEC_MAGIC, 4);
  memcpy(out->data + 4, &count, 8);
  memcpy(out->data + 12, &raw, 8);
  size_t n = LZ4F_compressFrame(out->data + CODEC_HEADER, bound, batch->buf.data, batch->buf.len, &prefs);
  if (LZ4F_isError(n)) return FL_ERR(FL_EINTERNAL, "LZ4 compression failed: %s", LZ4F_getErrorName(n));
  out->len = CODEC_HEADER + n;
  /* The bound is far above what LZ4 needs on compressible data: keep only what is used,
   * since cached serialized blocks are counted by their capacity. */
  uint8_t *shrunk = common_realloc(out->data, out->len);
  if (shrunk) {
    out->data = shrunk;
    out->cap = out->len;
  }
  return FL_OK;
}

fl_status rdd_batch_decode(fl_bytes in, const char *what, rdd_batch *out) {
  if (in.len < CODEC_HEADER || memcmp(in.data, CODEC_MAGIC, 4) != 0)
    return FL_ERR(FL_ECORRUPT, "%s: not a flint block (bad header)", what);
  uint64_t count, raw;
  memcpy(&count, in.data + 4, 8);
  memcpy(&raw, in.data + 12, 8);
  /* LZ4 expands at most 255-fold, so a header claiming more than that of the frame is
   * corrupt; checking before allocating keeps a flipped bit from asking for terabytes. */
  uint64_t frame = in.len - CODEC_HEADER;
  if (raw > CODEC_MAX_RAW || count > raw || raw > frame * 255 + 64)
    return FL_ERR(FL_ECORRUPT, "%s: implausible block header (%llu records, %llu bytes)", what,
                  (unsigned long long)count, (unsigned long long)raw);
  rdd_batch batch = {FL_BUF_INIT, 0};
  fl_status status = fl_buf_reserve(&batch.buf, (size_t)raw);
  if (status != FL_OK) return status;
  LZ4F_dctx *dctx;
  if (LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION))) {
    rdd_batch_free(&batch);
    return FL_ERR(FL_ENOMEM, "%s: cannot create an LZ4 context", what);
  }
  const uint8_t *src = in.data + CODEC_HEADER;
  size_t src_left = in.len - CODEC_HEADER, dst_len = 0;
  size_t hint = 1;
  while (hint != 0) {
    size_t src_size = src_left, dst_size = (size_t)raw - dst_len;
    hint = LZ4F_decompress(dctx, batch.buf.data + dst_len, &dst_size, src, &src_size, NULL);
    if (LZ4F_isError(hint)) {
      status = FL_ERR(FL_ECORRUPT, "%s: bad LZ4 frame: %s", what, LZ4F_getErrorName(hint));
      goto cleanup;
    }
    src += src_size;
    src_left -= src_size;
    dst_len += dst_size;
    if (hint != 0 && src_size == 0 && dst_size == 0) {
      status = FL_ERR(FL_ECORRUPT, "%s: truncated LZ4 frame", what);
      goto cleanup;
    }
  }
  if (src_left != 0 || dst_len != raw) {
    status = FL_ERR(FL_ECORRUPT, "%s: block holds %zu bytes, header says %llu", what, dst_len,
                    (unsigned long long)raw);
    goto cleanup;
  }
  batch.buf.len = dst_len;
  batch.count = count;
  if (!rdd_batch_valid(batch.buf.data, batch.buf.len, count)) {
    status = FL_ERR(FL_ECORRUPT, "%s: records do not match the header", what);
    goto cleanup;
  }
  *out = batch;
  batch = (rdd_batch){FL_BUF_INIT, 0};
cleanup:
  LZ4F_freeDecompressionContext(dctx);
  rdd_batch_free(&batch);
  return status;
}

fl_status rdd_batch_write_chunk(int fd, const char *path, rdd_batch *batch, fl_buf *enc,
                                uint64_t *offset, uint32_t *crc) {
  if (batch->count == 0) return FL_OK;
  fl_status st = rdd_batch_encode(batch, enc);
  if (st != FL_OK) return st;
  if (enc->len > UINT32_MAX) return FL_ERR(FL_ELIMIT, "%s: a chunk of %zu bytes", path, enc->len);
  uint32_t head = (uint32_t)enc->len;
  const uint8_t *parts[2] = {(const uint8_t *)&head, enc->data};
  size_t lens[2] = {4, enc->len};
  for (int i = 0; i < 2; i++) {
    if (crc) *crc = common_crc32c(*crc, parts[i], lens[i]);
    const uint8_t *p = parts[i];
    size_t len = lens[i];
    while (len > 0) {
      ssize_t n = write(fd, p, len);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return FL_ERR(FL_EIO, "cannot write %s: %s", path, n < 0 ? strerror(errno) : "no space");
      p += n;
      len -= (size_t)n;
    }
  }
  *offset += 4 + enc->len;
  batch->buf.len = 0;
  batch->count = 0;
  return FL_OK;
}
