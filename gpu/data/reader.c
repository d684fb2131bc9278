/*
 * gpu/data/reader.c: the rank's reader of gpu/data/data.h: a partition's images in host
 * memory, handed out as (shuffled) mini-batches. One rank's thread.
 *
 * A reader given a transform (data_reader_set_transform) holds image records (uint8, at the
 * cache's resolution) instead of float images, and transforms each one as it hands it out,
 * with the epoch of data_reader_start_epoch: a new random crop of every image every epoch.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"
#include "gpu/data/sources.h"


struct data_reader {
  uint32_t batch;
  uint32_t channels, height, width, classes;
  size_t per; /* floats per image */
  uint64_t n, cap;
  int32_t *labels;
  float *images;
  uint64_t *order; /* this epoch's order, n entries */
  uint64_t pos, handed, max_batches;
  bool partial;
  /* With a transform: image records back to back in `raw`, image i's at raw_off[i]. */
  bool transform;
  fl_image_transform t;
  uint32_t epoch;
  fl_buf raw;
  uint64_t *raw_off;
  fl_status failed; /* a transform's failure in data_reader_next (data_reader_status) */
};

fl_status data_reader_create(uint32_t batch, data_reader **out) {
  if (batch == 0) return fl_set_error(FL_EINVAL, "data_reader_create: batch 0");
  data_reader *r = common_calloc(1, sizeof *r);
  if (!r) return fl_set_error(FL_ENOMEM, "data_reader_create: out of memory");
  r->batch = batch;
  *out = r;
  return FL_OK;
}

void data_reader_destroy(data_reader *r) {
  if (!r) return;
  common_free(r->labels);
  common_free(r->images);
  common_free(r->order);
  common_free(r->raw_off);
  fl_buf_free(&r->raw);
  common_free(r);
}

fl_status data_reader_set_transform(data_reader *r, const fl_image_transform *t, uint32_t classes) {
  if (r->n || r->per) return fl_set_error(FL_ESTATE, "data reader: a transform after images were added");
  fl_status s = fl_image_transform_check(t);
  if (s != FL_OK) return s;
  if (classes == 0) return fl_set_error(FL_EINVAL, "data reader: 0 classes");
  r->transform = true;
  r->t = *t;
  r->channels = 3;
  r->height = r->width = t->size;
  r->classes = classes;
  r->per = (size_t)3 * t->size * t->size;
  return FL_OK;
}

fl_status data_reader_status(const data_reader *r) { return r->failed; }

/* Room for one more image's label, order and offset (a transforming reader). */
static fl_status raw_grow(data_reader *r) {
  if (r->n < r->cap) return FL_OK;
  uint64_t cap = r->cap ? r->cap * 2 : 1024;
  int32_t *labels = common_realloc(r->labels, cap * sizeof *labels);
  if (labels) r->labels = labels;
  uint64_t *order = labels ? common_realloc(r->order, cap * sizeof *order) : NULL;
  if (order) r->order = order;
  uint64_t *off = order ? common_realloc(r->raw_off, cap * sizeof *off) : NULL;
  if (!off) return fl_set_error(FL_ENOMEM, "data reader: out of memory for %llu images", (unsigned long long)cap);
  r->raw_off = off;
  r->cap = cap;
  return FL_OK;
}

fl_status data_reader_add_image(data_reader *r, fl_bytes rec) {
  if (!r->transform)
    return fl_set_error(FL_ECORRUPT, "image blocks: an image record where only image blocks were expected");
  fl_image_view v;
  fl_status s = fl_image_record_view(rec, &v);
  if (s != FL_OK) return s;
  if (v.label < 0 || (uint32_t)v.label >= r->classes)
    return fl_set_error(FL_ECORRUPT, "image record %llu: label %d outside [0, %u)", (unsigned long long)v.index,
                        v.label, r->classes);
  if ((s = raw_grow(r)) != FL_OK) return s;
  r->raw_off[r->n] = r->raw.len;
  if ((s = fl_buf_append(&r->raw, rec.data, rec.len)) != FL_OK) return s;
  r->labels[r->n] = v.label;
  r->order[r->n] = r->n;
  r->n++;
  return FL_OK;
}

fl_status data_reader_add_block(data_reader *r, fl_bytes rec) {
  if (r->transform) return fl_set_error(FL_ECORRUPT, "image blocks: a block where only image records were expected");
  data_block b;
  fl_status s = data_block_view(rec, &b);
  if (s != FL_OK) return s;
  if (r->per == 0) {
    r->channels = b.channels;
    r->height = b.height;
    r->width = b.width;
    r->classes = b.classes;
    r->per = (size_t)b.channels * b.height * b.width;
  } else if (b.channels != r->channels || b.height != r->height || b.width != r->width || b.classes != r->classes) {
    return fl_set_error(FL_ECORRUPT, "image block of %u x %u x %u images (%u classes) after blocks of %u x %u x %u "
                        "(%u classes)", b.channels, b.height, b.width, b.classes, r->channels, r->height, r->width,
                        r->classes);
  }
  if (r->n + b.count > r->cap) {
    uint64_t cap = r->cap ? r->cap : 1024;
    while (cap < r->n + b.count) cap *= 2;
    int32_t *labels = common_realloc(r->labels, cap * sizeof *labels);
    if (labels) r->labels = labels;
    float *images = labels ? common_realloc(r->images, cap * r->per * sizeof *images) : NULL;
    if (images) r->images = images;
    uint64_t *order = images ? common_realloc(r->order, cap * sizeof *order) : NULL;
    if (!order) return fl_set_error(FL_ENOMEM, "data reader: out of memory for %llu images", (unsigned long long)cap);
    r->order = order;
    r->cap = cap;
  }
  memcpy(r->labels + r->n, b.labels, (size_t)b.count * 4);
  memcpy(r->images + r->n * r->per, b.images, (size_t)b.count * r->per * sizeof(float));
  for (uint32_t i = 0; i < b.count; i++) r->order[r->n + i] = r->n + i;
  r->n += b.count;
  return FL_OK;
}

fl_status data_reader_add_all(fl_iter *in, data_reader *train, data_reader *test) {
  fl_bytes rec;
  while (fl_iter_next(in, &rec)) {
    uint32_t magic = 0;
    if (rec.len >= 4) memcpy(&magic, rec.data, 4);
    if (magic == FL_IMAGE_MAGIC) { /* image records are training images, to be transformed */
      fl_status s = data_reader_add_image(train, rec);
      if (s != FL_OK) return s;
      continue;
    }
    data_block b = {0}; /* gcc's -O3 cannot see that b.split is read only when the view succeeded */
    fl_status s = data_block_view(rec, &b);
    if (s == FL_OK && b.split == DATA_SPLIT_TEST && !test)
      s = fl_set_error(FL_ECORRUPT, "image blocks: a test block where only training blocks were expected");
    if (s == FL_OK) s = data_reader_add_block(b.split == DATA_SPLIT_TEST ? test : train, rec);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

uint64_t data_reader_images(const data_reader *r) { return r->n; }
uint32_t data_reader_channels(const data_reader *r) { return r->channels; }
uint32_t data_reader_height(const data_reader *r) { return r->height; }
uint32_t data_reader_width(const data_reader *r) { return r->width; }
uint32_t data_reader_classes(const data_reader *r) { return r->classes; }
size_t data_reader_image_floats(const data_reader *r) { return r->per; }

uint64_t data_reader_batches(const data_reader *r, bool partial) {
  return partial ? (r->n + r->batch - 1) / r->batch : r->n / r->batch;
}

void data_reader_start_epoch(data_reader *r, uint64_t seed, uint32_t epoch, bool shuffle, uint64_t max_batches,
                             bool partial) {
  r->pos = 0;
  r->handed = 0;
  r->max_batches = max_batches;
  r->partial = partial;
  r->epoch = epoch;
  for (uint64_t i = 0; i < r->n; i++) r->order[i] = i;
  if (!shuffle) return;
  uint64_t state = data_mix64(seed ^ data_mix64(0xe90c5u + epoch));
  for (uint64_t i = r->n; i > 1; i--) {
    state = data_mix64(state);
    /* Multiply-shift maps 64 random bits onto [0, i) (bias below 2^-40 for these sizes). */
    uint64_t j = (uint64_t)(((unsigned __int128)state * i) >> 64);
    uint64_t t = r->order[i - 1];
    r->order[i - 1] = r->order[j];
    r->order[j] = t;
  }
}

uint32_t data_reader_next(data_reader *r, float *images, int32_t *labels) {
  if (r->max_batches && r->handed >= r->max_batches) return 0;
  uint64_t left = r->n - r->pos;
  if (left == 0 || (left < r->batch && !r->partial)) return 0;
  uint32_t count = left < r->batch ? (uint32_t)left : r->batch;
  for (uint32_t i = 0; i < count; i++) {
    uint64_t k = r->order[r->pos + i];
    labels[i] = r->labels[k];
    if (!r->transform) {
      memcpy(images + (size_t)i * r->per, r->images + k * r->per, r->per * sizeof(float));
      continue;
    }
    fl_image_view v;
    uint64_t end = k + 1 < r->n ? r->raw_off[k + 1] : r->raw.len;
    fl_status s = fl_image_record_view(fl_bytes_of(r->raw.data + r->raw_off[k], end - r->raw_off[k]), &v);
    if (s == FL_OK) s = image_transform_view(&r->t, r->epoch, &v, images + (size_t)i * r->per);
    if (s != FL_OK) {
      r->failed = s;
      return 0;
    }
  }
  r->pos += count;
  r->handed++;
  return count;
}
