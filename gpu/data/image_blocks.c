/*
 * gpu/data/image_blocks.c: an image folder as the trainer's input, a data set of image blocks
 * (gpu/data/data.h): each partition's task decodes its files (image_folder.c), caches them at
 * the folder options' resolution, applies a transform (image_transform.c) and emits blocks
 * of 3 x size x size floats, laid out over the partitions as every source is (ranges,
 * interleaved, runs: gpu/data/blocks.c). The blocks are what the rank's reader holds, so the
 * transform is applied once (epoch 0), not again each epoch; or, for a training split with
 * `records`, the cached image records in the same layout, which the rank's reader transforms
 * anew each epoch.
 *
 * The listing (label and path below the root of each image: 50 MB for ImageNet's 1.28 M) is a
 * broadcast, fetched once per executor, not part of every task's argument; the argument
 * (small, fixed size) names it, so a training set and a test set can be paired into one
 * partition per rank (gpu/data/pair.c).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"
#include "gpu/data/sources.h"

#define IMAGE_BLOCK_IMAGES 16u

/* The argument. The listing broadcast holds the root (NUL-terminated), then per image an
 * int32 label and its path below the root, NUL-terminated. */
typedef struct image_arg {
  fl_image_transform t;
  image_cache_size cache;
  uint32_t parts, block_images, interleave, classes;
  uint64_t images;
  uint32_t records, pad; /* emit the training split as image records (not blocks) */
  uint64_t listing;      /* the broadcast's id */
} image_arg;

typedef struct image_reading {
  image_arg a;
  const char *root;
  const uint8_t **entries; /* a.images pointers to (label, path) */
  fl_buf rec;
} image_reading;

static fl_status image_fill(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                            float *images) {
  image_reading *r = (image_reading *)ctx;
  size_t per = (size_t)3 * r->a.t.size * r->a.t.size;
  char path[PATH_MAX];
  for (uint32_t i = 0; i < count; i++) {
    uint64_t k = index + (uint64_t)i * stride;
    const uint8_t *e = r->entries[k];
    int32_t label;
    memcpy(&label, e, 4);
    if (snprintf(path, sizeof path, "%s/%s", r->root, (const char *)e + 4) >= (int)sizeof path)
      return fl_set_error(FL_EINVAL, "image folder %s: a path too long", r->root);
    fl_status s = image_load_record(path, label, k, &r->a.cache, &r->rec);
    fl_image_view v;
    if (s == FL_OK) s = fl_image_record_view(fl_buf_bytes(&r->rec), &v);
    if (s == FL_OK) s = image_transform_view(&r->a.t, 0, &v, images + i * per);
    if (s != FL_OK) return s;
    labels[i] = label;
  }
  return FL_OK;
}

fl_status data_image_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
  image_reading r = {.rec = FL_BUF_INIT};
  memcpy(&r.a, arg, sizeof r.a);
  fl_bytes listing;
  fl_status s = fl_broadcast_value(r.a.listing, &listing);
  if (s != FL_OK) return s;
  /* The client wrote it; a listing cut short is a bug there, checked anyway. */
  const uint8_t *p = listing.data, *end = listing.data + listing.len;
  r.root = (const char *)p;
  const uint8_t *nul = memchr(p, 0, listing.len);
  r.entries = common_malloc((r.a.images ? r.a.images : 1) * sizeof *r.entries);
  if (!r.entries) return fl_set_error(FL_ENOMEM, "image folder: out of memory for %llu paths",
                                      (unsigned long long)r.a.images);
  p = nul ? nul + 1 : end;
  for (uint64_t i = 0; i < r.a.images && s == FL_OK; i++) {
    const uint8_t *z = end - p > 4 ? memchr(p + 4, 0, (size_t)(end - p - 4)) : NULL;
    if (!nul || !z) {
      s = fl_set_error(FL_EINTERNAL, "image folder: the listing broadcast ends at image %llu of %llu",
                       (unsigned long long)i, (unsigned long long)r.a.images);
      break;
    }
    r.entries[i] = p;
    p = z + 1;
  }
  if (s != FL_OK) {
    common_free(r.entries);
    return s;
  }
  uint32_t n = r.a.t.size;
  if (r.a.records && split == DATA_SPLIT_TRAIN) {
    data_part_range pr;
    char path[PATH_MAX];
    for (uint64_t k = 0; s == FL_OK && data_partition_piece(r.a.images, r.a.parts, partition, r.a.interleave, k, &pr);
         k++)
      for (uint64_t j = 0; s == FL_OK && j < pr.n; j++) {
        uint64_t i = pr.first + j * pr.stride;
        int32_t label;
        memcpy(&label, r.entries[i], 4);
        if (snprintf(path, sizeof path, "%s/%s", r.root, (const char *)r.entries[i] + 4) >= (int)sizeof path)
          s = fl_set_error(FL_EINVAL, "image folder %s: a path too long", r.root);
        if (s == FL_OK) s = image_load_record(path, label, i, &r.a.cache, &r.rec);
        if (s == FL_OK) s = fl_emit(out, r.rec.data, r.rec.len);
      }
  } else {
    s = data_emit_blocks(out, r.a.images, r.a.parts, partition, r.a.interleave, 0, r.a.block_images, 3, n, n,
                         r.a.classes, split, image_fill, &r);
  }
  fl_buf_free(&r.rec);
  common_free(r.entries);
  return s;
}

FL_API fl_status gpu_data_image_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return data_image_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

fl_status data_image_folder(fl_context *ctx, const char *dir, const fl_image_folder_options *fo,
                            const fl_image_transform *t, bool records, const data_options *opts, data_set *out,
                            fl_image_classes **classes) {
  if (!ctx || !dir || !t || !out) return fl_set_error(FL_EINVAL, "data_image_folder: NULL argument");
  fl_image_folder_options f = fo ? *fo : (fl_image_folder_options)FL_IMAGE_FOLDER_OPTIONS_INIT;
  data_options o = opts ? *opts : (data_options)DATA_OPTIONS_INIT;
  if (f.skip_bad)
    return fl_set_error(FL_EINVAL, "image folder %s: skipping bad images is not available for training input", dir);
  image_arg a;
  memset(&a, 0, sizeof a); /* its bytes travel as they are */
  image_transform_copy(&a.t, t);
  a.block_images = o.block_images ? o.block_images : IMAGE_BLOCK_IMAGES;
  a.interleave = data_layout_run(&o);
  a.records = records;
  fl_status status = fl_image_transform_check(t);
  if (status == FL_OK) status = image_cache_of(&f, &a.cache);
  if (status != FL_OK) return status;
  image_listing l = {0};
  fl_buf listing = FL_BUF_INIT, source = FL_BUF_INIT;
  fl_broadcast *shared = NULL;
  fl_dataset *blocks = NULL;
  fl_image_classes *c = NULL;
  FL_CHECK(image_list(dir, f.allow_empty, &l));
  a.images = l.images;
  a.classes = l.classes;
  a.parts = data_partitions_for(ctx, &o, l.images);
  FL_CHECK(fl_buf_append(&listing, l.root, strlen(l.root) + 1));
  for (uint64_t i = 0; i < l.images; i++) {
    FL_CHECK(fl_buf_append(&listing, &l.labels[i], 4));
    FL_CHECK(fl_buf_append(&listing, l.paths[i], strlen(l.paths[i]) + 1));
  }
  FL_CHECK(fl_broadcast_create(ctx, listing.data, listing.len, &shared));
  a.listing = fl_broadcast_id(shared);
  FL_CHECK(data_source_load(ctx, SOURCE_IMAGES, a.parts, gpu_data_image_partition, &a, sizeof a, &blocks, &source));
  if (classes) FL_CHECK(image_classes_take(&l, &c));
  *out = (data_set){.blocks = blocks, .images = l.images, .channels = 3, .height = t->size, .width = t->size,
                    .classes = a.classes, .partitions = a.parts, .source = source, .shared = shared};
  blocks = NULL;
  shared = NULL;
  source = (fl_buf)FL_BUF_INIT;
  if (classes) *classes = c;
cleanup:
  fl_dataset_free(blocks);
  fl_broadcast_destroy(shared);
  fl_buf_free(&source);
  fl_buf_free(&listing);
  image_listing_free(&l);
  return status;
}
