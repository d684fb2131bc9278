/*
 * gpu/data/idx.c: IDX image and label files (MNIST, Fashion-MNIST) as a data set of image
 * blocks: the calling process checks both headers, the counts and every label; each
 * partition's task then reads its images from the files (so in cluster mode the path must be
 * readable where the executors run, as for fl_text_file). The files are read with flint's one
 * IDX reader (fl_ml_idx_* of flint/ml.h, in libflint_ml), which fl_ml_load uses too.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "flint/ml.h"
#include "gpu/data/sources.h"

#define DEFAULT_BLOCK_IMAGES 256u

/* The task's argument, followed by the images' and labels' paths, each NUL-terminated.
 * n: the images used (the file's first n); partition p holds images [n p / parts,
 * n (p + 1) / parts), or as data_partition_piece lays it out for the run in `interleave`. */
typedef struct idx_arg {
  uint32_t n, parts, block_images, rows, cols, classes;
  float offset, scale; /* value = pixel * scale + offset */
  uint32_t interleave, pad; /* interleave: data_layout_run (0 ranges, 1 single images, r > 1 runs) */
} idx_arg;

typedef struct idx_reading {
  const idx_arg *a;
  const char *images_path, *labels_path;
  fl_ml_idx *fi, *fl;
  uint8_t *pixels;
} idx_reading;

/* Positions both files at image `index` (forward only: a .gz seeks by reading). */
static fl_status idx_seek(const idx_reading *r, uint64_t index) {
  fl_status s = fl_ml_idx_seek(r->fi, index);
  return s == FL_OK ? fl_ml_idx_seek(r->fl, index) : s;
}

static fl_status idx_fill(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                          float *images) {
  const idx_reading *r = ctx;
  size_t per = (size_t)r->a->rows * r->a->cols, got;
  if (stride > 1) { /* one image at a time, each after a seek */
    for (uint32_t i = 0; i < count; i++) {
      fl_status s = idx_fill(ctx, index + (uint64_t)i * stride, 1, 1, labels + i, images + (size_t)i * per);
      if (s != FL_OK) return s;
    }
    return FL_OK;
  }
  /* Consecutive images: from `index` on (a no-op seek when the last fill ended there). */
  fl_status sk = idx_seek(r, index);
  if (sk != FL_OK) return sk;
  uint8_t raw[256];
  for (uint32_t done = 0; done < count;) {
    uint32_t piece = count - done < sizeof raw ? count - done : (uint32_t)sizeof raw;
    fl_status s = fl_ml_idx_read(r->fl, raw, piece, &got);
    if (s != FL_OK) return s;
    if (got < piece)
      return fl_set_error(FL_EFORMAT, "%s: truncated at label %llu (the header says %u labels)", r->labels_path,
                          (unsigned long long)(index + done + got + 1), r->a->n);
    for (uint32_t i = 0; i < piece; i++) {
      if (raw[i] >= r->a->classes)
        return fl_set_error(FL_EFORMAT, "%s: label %llu is %u, outside [0, %u)", r->labels_path,
                            (unsigned long long)(index + done + i + 1), raw[i], r->a->classes);
      labels[done + i] = raw[i];
    }
    done += piece;
  }
  for (uint32_t i = 0; i < count; i++) {
    fl_status s = fl_ml_idx_read(r->fi, r->pixels, per, &got);
    if (s != FL_OK) return s;
    if (got < per)
      return fl_set_error(FL_EFORMAT, "%s: truncated in image %llu (the header says %u images of %u x %u)",
                          r->images_path, (unsigned long long)(index + i + 1), r->a->n, r->a->rows, r->a->cols);
    float *x = images + (size_t)i * per;
    for (size_t k = 0; k < per; k++) x[k] = (float)r->pixels[k] * r->a->scale + r->a->offset;
  }
  return FL_OK;
}

fl_status data_idx_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
  idx_arg a;
  memcpy(&a, arg, sizeof a);
  idx_reading r = {.a = &a, .images_path = (const char *)arg + sizeof a};
  r.labels_path = r.images_path + strlen(r.images_path) + 1;
  uint32_t dims[3];
  fl_status s = fl_ml_idx_open(r.images_path, FL_ML_IDX_IMAGES, dims, &r.fi);
  if (s == FL_OK) s = fl_ml_idx_open(r.labels_path, FL_ML_IDX_LABELS, dims, &r.fl);
  if (s == FL_OK && !(r.pixels = common_malloc((size_t)a.rows * a.cols)))
    s = fl_set_error(FL_ENOMEM, "%s: out of memory", r.images_path);
  if (s == FL_OK)
    s = data_emit_blocks(out, a.n, a.parts, partition, a.interleave, 0, a.block_images, 1, a.rows, a.cols, a.classes,
                    split, idx_fill, &r);
  common_free(r.pixels);
  fl_ml_idx_close(r.fi);
  fl_ml_idx_close(r.fl);
  return s;
}

FL_API fl_status gpu_data_idx_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return data_idx_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

/* Reads the whole labels file (flint's IDX reader checks that it holds its header's count)
 * to check the count against the images' and every label. */
static fl_status idx_check_labels(const char *path, uint32_t n_images, const char *images_path, uint32_t classes) {
  fl_buf labels = FL_BUF_INIT;
  fl_status s = fl_ml_idx_read_labels(path, &labels);
  if (s == FL_OK && labels.len != n_images)
    s = fl_set_error(FL_EFORMAT, "%s has %u images but %s has %zu labels", images_path, n_images, path, labels.len);
  for (size_t i = 0; s == FL_OK && i < labels.len; i++)
    if (labels.data[i] >= classes)
      s = fl_set_error(FL_EFORMAT, "%s: label %llu is %u, outside [0, %u)", path, (unsigned long long)(i + 1),
                       labels.data[i], classes);
  fl_buf_free(&labels);
  return s;
}

/* An uncompressed images file must have exactly the header's size (a .gz is checked by the
 * tasks as they read). */
static fl_status idx_check_size(const char *path, uint64_t n, uint64_t per) {
  size_t len = strlen(path);
  if (len > 3 && strcmp(path + len - 3, ".gz") == 0) return FL_OK;
  struct stat st;
  if (stat(path, &st) != 0) return fl_set_error(FL_EIO, "cannot stat %s: %s", path, strerror(errno));
  uint64_t want = 16 + n * per;
  if ((uint64_t)st.st_size < want)
    return fl_set_error(FL_EFORMAT, "%s: truncated: %llu bytes, the header's %llu images make %llu", path,
                        (unsigned long long)st.st_size, (unsigned long long)n, (unsigned long long)want);
  if ((uint64_t)st.st_size > want)
    return fl_set_error(FL_EFORMAT, "%s: trailing bytes after %llu images", path, (unsigned long long)n);
  return FL_OK;
}

fl_status data_load_idx(fl_context *ctx, const char *images_path, const char *labels_path, uint32_t classes,
                        const data_options *opts, data_set *out) {
  if (!ctx || !images_path || !labels_path || !out) return fl_set_error(FL_EINVAL, "data_load_idx: NULL argument");
  data_options o = opts ? *opts : (data_options)DATA_OPTIONS_INIT;
  if (!classes) classes = 10;
  if (classes > 256) return fl_set_error(FL_EINVAL, "data_load_idx: %u classes (IDX labels are bytes)", classes);
  uint32_t dims[3] = {0};
  fl_ml_idx *f;
  fl_status s = fl_ml_idx_open(images_path, FL_ML_IDX_IMAGES, dims, &f);
  if (s != FL_OK) return s;
  fl_ml_idx_close(f);
  uint64_t per = (uint64_t)dims[1] * dims[2];
  if (per == 0 || dims[1] > 65536 || dims[2] > 65536 || per > (1u << 26))
    return fl_set_error(FL_EFORMAT, "%s: images of %u x %u pixels", images_path, dims[1], dims[2]);
  if (dims[0] == 0) return fl_set_error(FL_EEMPTY, "%s: no images", images_path);
  if ((s = idx_check_size(images_path, dims[0], per)) != FL_OK) return s;
  if ((s = idx_check_labels(labels_path, dims[0], images_path, classes)) != FL_OK) return s;
  /* Tasks open the files themselves, maybe from another folder: absolute paths. */
  char images_abs[PATH_MAX], labels_abs[PATH_MAX];
  if (!realpath(images_path, images_abs)) return fl_set_error(FL_EIO, "%s: %s", images_path, strerror(errno));
  if (!realpath(labels_path, labels_abs)) return fl_set_error(FL_EIO, "%s: %s", labels_path, strerror(errno));
  uint32_t used = o.max_images && o.max_images < dims[0] ? (uint32_t)o.max_images : dims[0];
  uint32_t parts = data_partitions_for(ctx, &o, used);
  idx_arg a = {.n = used, .parts = parts, .block_images = o.block_images ? o.block_images : DEFAULT_BLOCK_IMAGES,
               .rows = dims[1], .cols = dims[2], .classes = classes, .offset = 0, .scale = 1.0f / 255,
               .interleave = data_layout_run(&o)};
  if (o.norm == DATA_NORM_STANDARD) {
    a.scale = (float)(1.0 / (255 * DATA_FASHION_MNIST_STD));
    a.offset = (float)(-DATA_FASHION_MNIST_MEAN / DATA_FASHION_MNIST_STD);
  }
  fl_buf arg = FL_BUF_INIT, source = FL_BUF_INIT;
  fl_dataset *blocks = NULL;
  if ((s = fl_buf_append(&arg, &a, sizeof a)) == FL_OK && (s = fl_buf_append(&arg, images_abs, strlen(images_abs) + 1)) == FL_OK)
    s = fl_buf_append(&arg, labels_abs, strlen(labels_abs) + 1);
  if (s == FL_OK) s = data_source_load(ctx, SOURCE_IDX, parts, gpu_data_idx_partition, arg.data, arg.len, &blocks, &source);
  fl_buf_free(&arg);
  if (s != FL_OK) return s;
  *out = (data_set){.blocks = blocks, .images = used, .channels = 1, .height = dims[1], .width = dims[2],
                    .classes = classes, .partitions = parts, .source = source};
  return FL_OK;
}

/* dir/name when it exists, else dir/name.gz (whose absence is then the error). */
static void pick_file(char *buf, size_t cap, const char *dir, const char *name) {
  snprintf(buf, cap, "%s/%s", dir, name);
  struct stat st;
  if (stat(buf, &st) != 0) snprintf(buf, cap, "%s/%s.gz", dir, name);
}

fl_status data_fashion_mnist(fl_context *ctx, const char *dir, bool train, const data_options *opts, data_set *out) {
  char images[PATH_MAX], labels[PATH_MAX];
  if (!dir) dir = DATA_FASHION_MNIST_DIR;
  pick_file(images, sizeof images, dir, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
  pick_file(labels, sizeof labels, dir, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
  return data_load_idx(ctx, images, labels, 10, opts, out);
}
