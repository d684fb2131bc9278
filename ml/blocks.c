/*
 * blocks.c: the row block record and its builder.
 *
 * Layout of a block record (all integers little-endian, as the machine's):
 *   u8 q, then q zero bytes        so that what follows is 8-byte aligned in a batch
 *   header (24 bytes): u32 magic "FLRB", u8 version 1, u8 flags (1 sparse, 2 weighted),
 *                      u16 0, u32 rows, u32 cols, u64 nnz (sparse; 0 for dense)
 *   f64 labels[rows], f64 weights[rows] (weighted only)
 *   dense:  f64 x[rows * cols]
 *   sparse: u64 row_ptr[rows + 1], f64 x[nnz], u32 col[nnz]
 *   0-7 zero bytes of tail padding
 * flint stores a partition's records one after another, each behind a varint (LEB128) of
 * its length, starting at an allocation's (aligned) start. The builder picks q and the tail
 * so that, with that prefix, every block's arrays and the next record's prefix stay 8-byte
 * aligned: kernels then read cached blocks in place. Where a record is not aligned anyway,
 * fl_ml_block_view copies it; the layout is an optimization, never a requirement.
 */
#include <stdlib.h>

#include "ml/ml.h"

#define BLOCK_MAGIC 0x42524c46u /* "FLRB" */
#define BLOCK_VERSION 1
#define FLAG_SPARSE 1u
#define FLAG_WEIGHTED 2u
#define HEADER_BYTES 24u

typedef struct block_header {
  uint32_t magic;
  uint8_t version, flags;
  uint16_t zero;
  uint32_t rows, cols;
  uint64_t nnz;
} block_header;
_Static_assert(sizeof(block_header) == HEADER_BYTES, "block header is 24 bytes");

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* ---- view -------------------------------------------------------------------------------- */

fl_status fl_ml_block_view(fl_bytes rec, fl_buf *scratch, fl_ml_block *out) {
  if (!rec.data || rec.len < 1 + HEADER_BYTES) return fl_set_error(FL_ECORRUPT, "row block of %zu bytes is too short", rec.len);
  size_t q = rec.data[0];
  if (q > 7 || rec.len < 1 + q + HEADER_BYTES) return fl_set_error(FL_ECORRUPT, "row block: bad padding %zu", q);
  const uint8_t *body = rec.data + 1 + q;
  size_t body_len = rec.len - 1 - q;
  if ((uintptr_t)body % 8 != 0) { /* not laid out as expected: read a copy */
    scratch->len = 0;
    fl_status s = fl_buf_reserve(scratch, body_len + 8);
    if (s != FL_OK) return s;
    uint8_t *aligned = (uint8_t *)(((uintptr_t)scratch->data + 7) & ~(uintptr_t)7);
    memcpy(aligned, body, body_len);
    body = aligned;
  }
  block_header h;
  memcpy(&h, body, sizeof h);
  if (h.magic != BLOCK_MAGIC || h.version != BLOCK_VERSION || h.zero != 0 || (h.flags & ~3u))
    return fl_set_error(FL_ECORRUPT, "not a row block (magic %08x, version %u)", h.magic, h.version);
  bool sparse = h.flags & FLAG_SPARSE, weighted = h.flags & FLAG_WEIGHTED;
  if (!sparse && h.nnz != 0) return fl_set_error(FL_ECORRUPT, "dense row block with nnz %llu", (unsigned long long)h.nnz);
  /* Sizes in 128 bits: a corrupt header must not wrap around. */
  unsigned __int128 need = HEADER_BYTES + (unsigned __int128)h.rows * 8 * (weighted ? 2 : 1);
  if (sparse) need += (unsigned __int128)(h.rows + 1ull) * 8 + (unsigned __int128)h.nnz * 12;
  else need += (unsigned __int128)h.rows * h.cols * 8;
  if (need > body_len || body_len - (size_t)need > 7)
    return fl_set_error(FL_ECORRUPT, "row block of %u x %u (nnz %llu) does not match its %zu bytes", h.rows, h.cols,
                        (unsigned long long)h.nnz, body_len);
  const uint8_t *p = body + HEADER_BYTES;
  fl_ml_block b = {.rows = h.rows, .cols = h.cols, .sparse = sparse, .nnz = h.nnz};
  b.labels = (const double *)p;
  p += (size_t)h.rows * 8;
  if (weighted) {
    b.weights = (const double *)p;
    p += (size_t)h.rows * 8;
  }
  if (!sparse) {
    b.x = (const double *)p;
  } else {
    b.row_ptr = (const uint64_t *)p;
    p += ((size_t)h.rows + 1) * 8;
    b.x = (const double *)p;
    p += h.nnz * 8;
    b.col = (const uint32_t *)p;
    if (b.row_ptr[0] != 0 || b.row_ptr[h.rows] != h.nnz)
      return fl_set_error(FL_ECORRUPT, "row block: row offsets do not span its %llu values", (unsigned long long)h.nnz);
    for (uint32_t i = 0; i < h.rows; i++) {
      uint64_t lo = b.row_ptr[i], hi = b.row_ptr[i + 1];
      if (hi < lo || hi > h.nnz) return fl_set_error(FL_ECORRUPT, "row block: bad offsets of row %u", i);
      for (uint64_t k = lo; k < hi; k++)
        if (b.col[k] >= h.cols || (k > lo && b.col[k] <= b.col[k - 1]))
          return fl_set_error(FL_ECORRUPT, "row block: row %u has column %u out of order or beyond %u", i, b.col[k], h.cols);
    }
  }
  *out = b;
  return FL_OK;
}

/* ---- builder ----------------------------------------------------------------------------- */

struct fl_ml_block_builder {
  uint32_t cols, rows_per_block, rows, width;
  bool sparse, weighted;
  fl_buf labels, weights, x, row_ptr, col;
};

fl_status fl_ml_block_builder_create(uint32_t cols, bool sparse, bool weighted, uint32_t rows_per_block,
                                     fl_ml_block_builder **out) {
  if (!sparse && cols == 0) return fl_set_error(FL_EINVAL, "a dense row block needs at least one column");
  fl_ml_block_builder *b = calloc(1, sizeof *b);
  if (!b) return fl_set_error(FL_ENOMEM, "out of memory");
  b->cols = cols;
  b->width = cols;
  b->sparse = sparse;
  b->weighted = weighted;
  if (!rows_per_block) rows_per_block = sparse ? UINT32_MAX : (uint32_t)(ML_BLOCK_BYTES / (8ull * cols) ? ML_BLOCK_BYTES / (8ull * cols) : 1);
  b->rows_per_block = rows_per_block;
  *out = b;
  return FL_OK;
}

static fl_status put(fl_buf *buf, const void *data, size_t len) {
  if (len == 0) return FL_OK; /* an empty sparse row: data and buf->data may both be NULL */
  fl_status s = fl_buf_reserve(buf, len);
  if (s != FL_OK) return s;
  if (len) memcpy(buf->data + buf->len, data, len); /* an empty row may pass NULL arrays */
  buf->len += len;
  return FL_OK;
}

static fl_status add_label(fl_ml_block_builder *b, double label, double weight) {
  fl_status s = put(&b->labels, &label, 8);
  if (s == FL_OK && b->weighted) s = put(&b->weights, &weight, 8);
  return s;
}

fl_status fl_ml_block_builder_add_dense(fl_ml_block_builder *b, double label, double weight, const double *x) {
  if (b->sparse) return fl_set_error(FL_EINVAL, "a dense row added to a sparse block");
  fl_status s = add_label(b, label, weight);
  if (s == FL_OK) s = put(&b->x, x, (size_t)b->cols * 8);
  if (s == FL_OK) b->rows++;
  return s;
}

fl_status fl_ml_block_builder_add_sparse(fl_ml_block_builder *b, double label, double weight, const uint32_t *idx,
                                         const double *values, uint32_t nnz) {
  if (!b->sparse) return fl_set_error(FL_EINVAL, "a sparse row added to a dense block");
  for (uint32_t k = 1; k < nnz; k++)
    if (idx[k] <= idx[k - 1]) return fl_set_error(FL_EINVAL, "sparse row: index %u after %u (indices must ascend)", idx[k], idx[k - 1]);
  if (nnz && idx[nnz - 1] == UINT32_MAX) return fl_set_error(FL_ELIMIT, "sparse row: index %u is too large", idx[nnz - 1]);
  fl_status s = FL_OK;
  if (b->rows == 0) {
    uint64_t zero = 0;
    if ((s = put(&b->row_ptr, &zero, 8)) != FL_OK) return s;
  }
  if ((s = add_label(b, label, weight)) != FL_OK || (s = put(&b->x, values, (size_t)nnz * 8)) != FL_OK ||
      (s = put(&b->col, idx, (size_t)nnz * 4)) != FL_OK)
    return s;
  uint64_t end = b->x.len / 8;
  if ((s = put(&b->row_ptr, &end, 8)) != FL_OK) return s;
  if (nnz && idx[nnz - 1] + 1 > b->width) b->width = idx[nnz - 1] + 1;
  b->rows++;
  return FL_OK;
}

uint32_t fl_ml_block_builder_rows(const fl_ml_block_builder *b) { return b->rows; }

bool fl_ml_block_builder_full(const fl_ml_block_builder *b) {
  return b->rows >= b->rows_per_block || b->rows == UINT32_MAX - 1 || (b->sparse && b->x.len >= ML_BLOCK_BYTES);
}

fl_status fl_ml_block_builder_take(fl_ml_block_builder *b, fl_buf *out) {
  out->len = 0;
  if (b->rows == 0) return FL_OK;
  size_t payload = b->labels.len + b->weights.len + b->x.len;
  if (b->sparse) payload += b->row_ptr.len + b->col.len;
  size_t body = HEADER_BYTES + payload, len = 0, q = 0;
  /* The varint prefix's length depends on the record's, which depends on the padding. */
  for (size_t p = 1; p <= 10; p++) {
    q = (8 - (p + 1) % 8) % 8;
    size_t len0 = 1 + q + body;
    len = len0 + (8 - (p + len0) % 8) % 8;
    if (varint_len(len) == p) break;
  }
  fl_status s = fl_buf_reserve(out, len);
  if (s != FL_OK) return s;
  uint8_t *p = out->data;
  memset(p, 0, len);
  p[0] = (uint8_t)q;
  block_header h = {.magic = BLOCK_MAGIC, .version = BLOCK_VERSION,
                    .flags = (uint8_t)((b->sparse ? FLAG_SPARSE : 0) | (b->weighted ? FLAG_WEIGHTED : 0)),
                    .rows = b->rows, .cols = b->width, .nnz = b->sparse ? b->x.len / 8 : 0};
  uint8_t *w = p + 1 + q;
  memcpy(w, &h, sizeof h);
  w += sizeof h;
  memcpy(w, b->labels.data, b->labels.len), w += b->labels.len;
  if (b->weighted) memcpy(w, b->weights.data, b->weights.len), w += b->weights.len;
  if (b->sparse) memcpy(w, b->row_ptr.data, b->row_ptr.len), w += b->row_ptr.len;
  if (b->x.len) memcpy(w, b->x.data, b->x.len), w += b->x.len;
  if (b->sparse && b->col.len) memcpy(w, b->col.data, b->col.len);
  out->len = len;
  b->rows = 0;
  b->width = b->cols;
  b->labels.len = b->weights.len = b->x.len = b->row_ptr.len = b->col.len = 0;
  return FL_OK;
}

void fl_ml_block_builder_free(fl_ml_block_builder *b) {
  if (!b) return;
  fl_buf_free(&b->labels);
  fl_buf_free(&b->weights);
  fl_buf_free(&b->x);
  fl_buf_free(&b->row_ptr);
  fl_buf_free(&b->col);
  free(b);
}

void fl_ml_data_free(fl_ml_data *data) {
  if (!data) return;
  fl_dataset_free(data->blocks);
  free(data->label_seen);
  free(data);
}

fl_status ml_emit_block(fl_emitter *out, const fl_buf *rec, uint64_t done, uint64_t rows, bool *reserved) {
  if (!*reserved && done) {
    uint64_t blocks = (rows + done - 1) / done;
    *reserved = true;
    fl_status s = fl_emit_reserve(out, blocks, blocks * rec->len);
    if (s != FL_OK) return s;
  }
  return fl_emit(out, rec->data, rec->len);
}
