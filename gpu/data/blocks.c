/*
 * gpu/data/blocks.c: image blocks (the record layout of gpu/data/data.h), how a partition's
 * images are laid out over the data set (ranges, interleaved, runs) and emitted as blocks by
 * any source (gpu/data/sources.h).
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/sources.h"

/* ---- blocks ----------------------------------------------------------------------------- */

static size_t labels_padded(uint32_t count) { return ((size_t)count * 4 + 7) & ~(size_t)7; }

fl_status data_block_encode(uint32_t count, uint32_t channels, uint32_t height, uint32_t width, uint32_t classes,
                            data_split split, uint64_t first, uint32_t stride, const int32_t *labels,
                            const float *images, fl_buf *out) {
  if (stride == 0) return fl_set_error(FL_EINVAL, "image block: stride 0");
  if (channels > UINT16_MAX || height > UINT16_MAX || width > UINT16_MAX)
    return fl_set_error(FL_EINVAL, "image block: images of %u x %u x %u (at most 65535 each)", channels, height, width);
  size_t floats = (size_t)count * channels * height * width;
  size_t total = DATA_BLOCK_HEADER + labels_padded(count) + floats * sizeof(float);
  out->len = 0;
  fl_status s = fl_buf_reserve(out, total);
  if (s != FL_OK) return s;
  uint32_t head[2] = {DATA_BLOCK_MAGIC, count}, tail[2] = {classes, stride};
  uint16_t dims[4] = {(uint16_t)channels, (uint16_t)height, (uint16_t)width, (uint16_t)split};
  uint8_t *p = out->data;
  memcpy(p, head, 8);
  memcpy(p + 8, dims, 8);
  memcpy(p + 16, tail, 8);
  memcpy(p + 24, &first, 8);
  memset(p + DATA_BLOCK_HEADER, 0, labels_padded(count));
  if (count) memcpy(p + DATA_BLOCK_HEADER, labels, (size_t)count * 4);
  if (floats) memcpy(p + DATA_BLOCK_HEADER + labels_padded(count), images, floats * sizeof(float));
  out->len = total;
  return FL_OK;
}

fl_status data_block_view(fl_bytes rec, data_block *out) {
  uint32_t head[2], classes;
  uint16_t dims[4];
  if (rec.len < DATA_BLOCK_HEADER) return fl_set_error(FL_ECORRUPT, "image block of %zu bytes (too short)", rec.len);
  memcpy(head, rec.data, 8);
  memcpy(dims, rec.data + 8, 8);
  memcpy(&classes, rec.data + 16, 4);
  if (head[0] != DATA_BLOCK_MAGIC) return fl_set_error(FL_ECORRUPT, "not an image block (magic 0x%08x)", head[0]);
  if (dims[3] > DATA_SPLIT_TEST) return fl_set_error(FL_ECORRUPT, "image block of split %u", dims[3]);
  data_block b = {.count = head[1], .channels = dims[0], .height = dims[1], .width = dims[2], .classes = classes,
                  .split = (data_split)dims[3]};
  memcpy(&b.stride, rec.data + 20, 4);
  if (b.stride == 0) b.stride = 1; /* blocks written before the field: consecutive images */
  memcpy(&b.first, rec.data + 24, 8);
  uint64_t per = (uint64_t)b.channels * b.height * b.width;
  if (b.count == 0 || per == 0 || b.classes == 0 || per > (1u << 28))
    return fl_set_error(FL_ECORRUPT, "image block of %u images of %u x %u x %u, %u classes", b.count, b.channels,
                        b.height, b.width, b.classes);
  uint64_t want = DATA_BLOCK_HEADER + labels_padded(b.count) + (uint64_t)b.count * per * sizeof(float);
  if (rec.len != want)
    return fl_set_error(FL_ECORRUPT, "image block of %zu bytes, its header makes it %llu", rec.len,
                        (unsigned long long)want);
  b.labels = rec.data + DATA_BLOCK_HEADER;
  b.images = b.labels + labels_padded(b.count);
  for (uint32_t i = 0; i < b.count; i++) {
    int32_t l;
    memcpy(&l, b.labels + 4 * (size_t)i, 4);
    if (l < 0 || (uint32_t)l >= b.classes)
      return fl_set_error(FL_ECORRUPT, "image block: image %llu has label %d, outside [0, %u)",
                          (unsigned long long)(b.first + i), l, b.classes);
  }
  *out = b;
  return FL_OK;
}

void data_set_free(data_set *d) {
  if (!d) return;
  fl_dataset_free(d->blocks);
  fl_buf_free(&d->source);
  fl_broadcast_destroy(d->shared);
  memset(d, 0, sizeof *d);
}

/* The k-th piece of partition p of `parts` over `images` images (false after the last).
 * run 0: one contiguous range (the default); run 1: every parts-th image from p (interleave);
 * run r > 1: runs of r consecutive images, the (k parts + p)-th run for k = 0, 1, ... */
bool data_partition_piece(uint64_t images, uint32_t parts, uint32_t p, uint32_t run, uint64_t k,
                          data_part_range *out) {
  if (run <= 1) {
    if (k > 0) return false;
    if (run == 1) *out = (data_part_range){p, p < images ? (images - p + parts - 1) / parts : 0, parts};
    else *out = (data_part_range){images * p / parts, images * (p + 1) / parts - images * p / parts, 1};
    return true;
  }
  uint64_t start = (k * parts + p) * run;
  if (start >= images) return false;
  *out = (data_part_range){start, (start + run < images ? start + run : images) - start, 1};
  return true;
}

/* Emits partition p's images in blocks (none crossing a piece), filling each with fill();
 * base is added to every image index (a data set that starts further on). */
fl_status data_emit_blocks(fl_emitter *out, uint64_t images_total, uint32_t parts, uint32_t p, uint32_t run,
                           uint64_t base, uint32_t block_images, uint32_t c, uint32_t h, uint32_t w,
                           uint32_t classes, data_split split, data_fill_fn fill, const void *ctx) {
  size_t per = (size_t)c * h * w;
  uint64_t n = 0, blocks = 0;
  data_part_range pr;
  for (uint64_t k = 0; data_partition_piece(images_total, parts, p, run, k, &pr); k++) {
    n += pr.n;
    blocks += (pr.n + block_images - 1) / block_images;
  }
  fl_status s = FL_OK;
  if (n == 0) return FL_OK;
  /* One allocation for the partition's output (a cached map_partitions keeps it as is). */
  size_t bytes = (size_t)blocks * (DATA_BLOCK_HEADER + labels_padded(block_images)) + (size_t)n * per * sizeof(float);
  if ((s = fl_emit_reserve(out, blocks, bytes)) != FL_OK) return s;
  int32_t *labels = common_malloc((size_t)block_images * sizeof *labels);
  float *images = common_malloc((size_t)block_images * per * sizeof *images);
  fl_buf rec = FL_BUF_INIT;
  if (!labels || !images) s = fl_set_error(FL_ENOMEM, "image blocks: out of memory");
  for (uint64_t k = 0; s == FL_OK && data_partition_piece(images_total, parts, p, run, k, &pr); k++)
    for (uint64_t done = 0; s == FL_OK && done < pr.n; done += block_images) {
      uint32_t count = (uint32_t)(pr.n - done < block_images ? pr.n - done : block_images);
      uint64_t at = base + pr.first + done * pr.stride;
      if ((s = fill(ctx, at, pr.stride, count, labels, images)) != FL_OK) break;
      if ((s = data_block_encode(count, c, h, w, classes, split, at, pr.stride, labels, images, &rec)) != FL_OK)
        break;
      s = fl_emit(out, rec.data, rec.len);
    }
  fl_buf_free(&rec);
  common_free(images);
  common_free(labels);
  return s;
}

/* The run length the tasks' arguments carry: 0 ranges, 1 interleave, r > 1 runs of r. */
uint32_t data_layout_run(const data_options *o) { return o->interleave ? (o->run ? o->run : 1) : 0; }

uint32_t data_partitions_for(fl_context *ctx, const data_options *o, uint64_t images) {
  uint32_t p = o && o->partitions ? o->partitions : fl_context_cores(ctx);
  if (p == 0) p = 1;
  if (images && p > images) p = (uint32_t)images;
  return p;
}

fl_status data_source_encode(uint32_t kind, const void *arg, size_t len, fl_buf *out) {
  uint32_t head[2] = {kind, (uint32_t)len};
  fl_status s = fl_buf_append(out, head, sizeof head);
  return s == FL_OK ? fl_buf_append(out, arg, len) : s;
}

fl_status data_source_load(fl_context *ctx, uint32_t kind, uint32_t parts, fl_map_partitions_fn fn, const void *arg,
                           size_t len, fl_dataset **blocks, fl_buf *source) {
  fl_dataset *seeds = NULL, *made = NULL;
  fl_buf encoded = FL_BUF_INIT;
  fl_status s = fl_range(ctx, 0, parts, 1, parts, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, fn, arg, len, &made);
  if (s == FL_OK) s = fl_persist(made, FL_MEMORY_ONLY);
  if (s == FL_OK) s = data_source_encode(kind, arg, len, &encoded);
  fl_dataset_free(seeds);
  if (s != FL_OK) {
    fl_dataset_free(made);
    fl_buf_free(&encoded);
    return s;
  }
  *blocks = made;
  *source = encoded;
  return FL_OK;
}
