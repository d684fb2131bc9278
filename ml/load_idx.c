/*
 * load_idx.c: fl_ml_load of IDX (MNIST) files: the calling process checks both headers and
 * reads the labels whole, then each partition's task reads its range of images from the
 * file into row blocks; bad images are reported as load.c reports bad lines. The files are
 * read with the IDX reader of flint/ml.h (idx.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "ml/load_bad.h"
#include "ml/load_idx.h"

/* The IDX kernel's argument: followed by the images' and the labels' paths, each
 * NUL-terminated. Partition p reads images [n p / parts, n (p + 1) / parts). */
typedef struct ml_idx_arg {
  uint64_t bad_acc, first_acc; /* accumulator ids: bad images, the first bad image */
  uint32_t n, parts, size, rows_per_block;
  uint32_t dims[2];
  double scale;
} ml_idx_arg;

/* Offers an IDX error as the load's first bad "line" (the image number), as the text
 * kernels do, so that fl_ml_load reports it as FL_EFORMAT. */
static fl_status note_bad_image(const ml_idx_arg *a, uint64_t image, const char *message) {
  return ml_load_note_bad_line(a->bad_acc, a->first_acc, 0, image, message);
}

/* Reads one partition's images and labels from the files (both seekable through zlib, gzip'd
 * or not) into row blocks; the last partition also checks that nothing follows. */
FL_ML_KERNEL fl_status ml_load_idx_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  ml_idx_arg a;
  memcpy(&a, arg, sizeof a);
  const char *images = (const char *)arg + sizeof a, *labels_path = images + strlen(images) + 1;
  uint32_t lo = (uint32_t)((uint64_t)a.n * partition / a.parts), hi = (uint32_t)((uint64_t)a.n * (partition + 1) / a.parts);
  fl_ml_idx *fi = NULL, *fl = NULL;
  uint32_t dims[3];
  fl_buf labels = FL_BUF_INIT, pixels = FL_BUF_INIT, x = FL_BUF_INIT, rec = FL_BUF_INIT;
  fl_ml_block_builder *b = NULL;
  char cause[ML_LOAD_CAUSE_MAX] = "";
  fl_status s = fl_ml_idx_open(images, FL_ML_IDX_IMAGES, dims, &fi);
  if (s == FL_OK) s = fl_ml_idx_open(labels_path, FL_ML_IDX_LABELS, dims, &fl);
  if (s == FL_OK && hi > lo && (fl_ml_idx_seek(fi, lo) != FL_OK || fl_ml_idx_seek(fl, lo) != FL_OK))
    snprintf(cause, sizeof cause, "%s", fl_last_error());
  size_t got;
  if (s == FL_OK && !*cause && (s = fl_buf_reserve(&labels, hi - lo + 1)) == FL_OK &&
      (s = fl_ml_idx_read(fl, labels.data, hi - lo, &got)) == FL_OK && got < hi - lo)
    snprintf(cause, sizeof cause, "%s: truncated: label %zu of %u is missing (the header says %u labels)", labels_path,
             lo + got + 1, a.n, a.n);
  if (s == FL_OK) s = fl_buf_reserve(&pixels, a.size);
  if (s == FL_OK) s = fl_buf_reserve(&x, (size_t)a.size * 8);
  if (s == FL_OK) s = fl_ml_block_builder_create(a.size, false, false, a.rows_per_block, &b);
  double *xs = (double *)x.data;
  bool reserved = false;
  for (uint32_t i = lo; s == FL_OK && !*cause && i < hi; i++) {
    if ((s = fl_ml_idx_read(fi, pixels.data, a.size, &got)) != FL_OK) {
      if (s == FL_ECORRUPT) { /* the file's fault, as a truncated image is: no retries */
        snprintf(cause, sizeof cause, "%s", fl_last_error());
        s = FL_OK;
      }
      break;
    }
    if (got < a.size) {
      snprintf(cause, sizeof cause, "%s: image %u: truncated (the header says %u images of %u x %u)", images, i + 1, a.n,
               a.dims[0], a.dims[1]);
      break;
    }
    for (size_t k = 0; k < a.size; k++) xs[k] = pixels.data[k] * a.scale;
    s = fl_ml_block_builder_add_dense(b, labels.data[i - lo], 1, xs);
    if (s == FL_OK && (fl_ml_block_builder_full(b) || i + 1 == hi) && (s = fl_ml_block_builder_take(b, &rec)) == FL_OK)
      s = ml_emit_block(out, &rec, i + 1 - lo, hi - lo, &reserved);
  }
  if (s == FL_OK && !*cause && partition + 1 == a.parts) {
    char what[64];
    snprintf(what, sizeof what, "%u images", a.n);
    if ((s = fl_ml_idx_expect_end(fi, what)) == FL_EFORMAT || s == FL_ECORRUPT) {
      snprintf(cause, sizeof cause, "%s", fl_last_error());
      s = FL_OK;
    }
  }
  if (*cause) s = note_bad_image(&a, lo, cause); /* the load fails with it: the partition is moot */
  fl_ml_idx_close(fi);
  fl_ml_idx_close(fl);
  fl_ml_block_builder_free(b);
  fl_buf_free(&labels);
  fl_buf_free(&pixels);
  fl_buf_free(&x);
  fl_buf_free(&rec);
  return s;
}

/* IDX: the calling process checks both headers and reads the labels whole (one byte per
 * image), then each partition's task reads its images from the file, as text files are read:
 * the path must be readable where the executors run. */
fl_status ml_load_idx(fl_context *ctx, const char *path, const fl_ml_load_options *o, uint32_t parts,
                      fl_ml_data *data) {
  if (!o->labels_path)
    return fl_set_error(FL_EINVAL, "%s: IDX needs labels_path (the idx1-ubyte labels file)", path);
  fl_buf labels = FL_BUF_INIT, arg = FL_BUF_INIT, first_value = FL_BUF_INIT;
  fl_accumulator *bad = NULL, *first = NULL;
  fl_dataset *seeds = NULL;
  fl_ml_idx *f = NULL;
  uint32_t dims[3] = {0};
  char images_abs[PATH_MAX], labels_abs[PATH_MAX];
  fl_status s = fl_ml_idx_read_labels(o->labels_path, &labels);
  if (s == FL_OK) s = fl_ml_idx_open(path, FL_ML_IDX_IMAGES, dims, &f);
  fl_ml_idx_close(f);
  uint32_t n = dims[0];
  uint64_t size = (uint64_t)dims[1] * dims[2];
  if (s == FL_OK && n != labels.len)
    s = fl_set_error(FL_EFORMAT, "%s has %u images but %s has %zu labels", path, n, o->labels_path, labels.len);
  if (s == FL_OK && (size == 0 || size >= UINT32_MAX / 8))
    s = fl_set_error(FL_EFORMAT, "%s: images of %u x %u pixels", path, dims[1], dims[2]);
  if (s == FL_OK && (!realpath(path, images_abs) || !realpath(o->labels_path, labels_abs)))
    s = fl_set_error(FL_EIO, "%s: %s", path, strerror(errno));
  fl_buf_free(&labels);
  if (s == FL_OK && n < parts) parts = n ? n : 1;
  uint32_t rows_per_block = o->rows_per_block;
  if (s == FL_OK && !rows_per_block) {
    /* The builder's default, made smaller where needed for a block per partition. */
    uint64_t r = ML_BLOCK_BYTES / (8 * size);
    uint64_t spread = ((uint64_t)n + parts - 1) / parts;
    rows_per_block = (uint32_t)(r < 1 ? 1 : r < spread || spread == 0 ? r : spread);
  }
  ml_bad_line none = ML_BAD_LINE_NONE;
  if (s == FL_OK) s = fl_accumulator_create_i64(ctx, &bad);
  if (s == FL_OK) s = fl_accumulator_create(ctx, fl_bytes_of(&none, sizeof none), ml_load_first_bad_line, NULL, 0, &first);
  if (s == FL_OK) {
    ml_idx_arg head = {.bad_acc = fl_accumulator_id(bad), .first_acc = fl_accumulator_id(first), .n = n,
                       .parts = parts, .size = (uint32_t)size, .rows_per_block = rows_per_block,
                       .dims = {dims[1], dims[2]}, .scale = o->pixel_scale != 0 ? o->pixel_scale : 1.0 / 255};
    if ((s = fl_buf_append(&arg, &head, sizeof head)) == FL_OK &&
        (s = fl_buf_append(&arg, images_abs, strlen(images_abs) + 1)) == FL_OK)
      s = fl_buf_append(&arg, labels_abs, strlen(labels_abs) + 1);
  }
  if (s == FL_OK) s = fl_range(ctx, 0, parts, 1, parts, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, ml_load_idx_partition, arg.data, arg.len, &data->blocks);
  if (s == FL_OK) s = fl_persist(data->blocks, ML_STORAGE);
  if (s == FL_OK) s = ml_data_describe(data, NULL);
  int64_t errors = 0;
  if (s == FL_OK) s = fl_accumulator_value_i64(bad, &errors);
  if (s == FL_OK && errors > 0 && (s = fl_accumulator_value(first, &first_value)) == FL_OK) {
    const char *message = (const char *)first_value.data + sizeof(ml_bad_line);
    int len = first_value.len > sizeof(ml_bad_line) ? (int)(first_value.len - sizeof(ml_bad_line)) : 0;
    s = fl_set_error(FL_EFORMAT, "%.*s", len, message);
  }
  if (s == FL_OK && data->rows == 0) s = fl_set_error(FL_EEMPTY, "%s: no images", path);
  fl_buf_free(&first_value);
  fl_buf_free(&arg);
  fl_accumulator_destroy(first);
  fl_accumulator_destroy(bad);
  fl_dataset_free(seeds);
  return s;
}
