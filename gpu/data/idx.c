/*
 * gpu/data/idx.c: IDX image and label files (MNIST, Fashion-MNIST) as a data set of image
 * blocks: the calling process checks both headers, the counts and every label; each
 * partition's task then reads its images from the files (so in cluster mode the path must be
 * readable where the executors run, as for fl_text_file).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "gpu/data/sources.h"

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
#define DEFAULT_BLOCK_IMAGES 256u


static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads up to len bytes; *got says how many came. A zlib error is FL_EIO naming the file. */
static fl_status gz_read(gzFile f, const char *path, void *buf, size_t len, size_t *got) {
  *got = 0;
  while (*got < len) {
    unsigned chunk = len - *got > (1u << 30) ? 1u << 30 : (unsigned)(len - *got);
    int n = gzread(f, (uint8_t *)buf + *got, chunk);
    if (n < 0) {
      int err;
      const char *msg = gzerror(f, &err);
      return fl_set_error(FL_EIO, "%s: read error: %s", path, err == Z_ERRNO ? strerror(errno) : msg);
    }
    if (n == 0) break;
    *got += (size_t)n;
  }
  return FL_OK;
}

/* Opens an IDX file (gzip'd or not) and reads its magic and `ndims` sizes. */
static fl_status idx_open(const char *path, uint32_t magic, const char *kind, int ndims, uint32_t *dims,
                          gzFile *out) {
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f)
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot open %s: %s", path,
                        errno ? strerror(errno) : "out of memory");
  uint8_t head[16];
  size_t want = 4 + 4 * (size_t)ndims, got;
  fl_status s = gz_read(f, path, head, want, &got);
  if (s == FL_OK && got >= 4 && be32(head) != magic)
    s = fl_set_error(FL_EFORMAT, "%s: bad magic 0x%08x (an %s file starts with 0x%08x)", path, be32(head), kind,
                     magic);
  if (s == FL_OK && got < want)
    s = fl_set_error(FL_EFORMAT, "%s: truncated: %zu bytes, shorter than an %s header", path, got, kind);
  if (s != FL_OK) {
    gzclose(f);
    return s;
  }
  for (int i = 0; i < ndims; i++) dims[i] = be32(head + 4 + 4 * i);
  *out = f;
  return FL_OK;
}

/* The task's argument, followed by the images' and labels' paths, each NUL-terminated.
 * n: the images used (the file's first n); partition p holds images [n p / parts,
 * n (p + 1) / parts), or as partition_piece lays it out for the run in `interleave`. */
typedef struct idx_arg {
  uint32_t n, parts, block_images, rows, cols, classes;
  float offset, scale; /* value = pixel * scale + offset */
  uint32_t interleave, pad; /* interleave: layout_run (0 ranges, 1 single images, r > 1 runs) */
} idx_arg;

typedef struct idx_reading {
  const idx_arg *a;
  const char *images_path, *labels_path;
  gzFile fi, fl;
  uint8_t *pixels;
} idx_reading;

/* Positions both files at image `index` (forward only: a .gz seeks by reading). */
static fl_status idx_seek(const idx_reading *r, uint64_t index) {
  size_t per = (size_t)r->a->rows * r->a->cols;
  if (gzseek(r->fi, (z_off_t)(16 + index * per), SEEK_SET) < 0 || gzseek(r->fl, (z_off_t)(8 + index), SEEK_SET) < 0)
    return fl_set_error(FL_EFORMAT, "%s: cannot seek to image %llu (truncated?)", r->images_path,
                        (unsigned long long)index + 1);
  return FL_OK;
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
    fl_status s = gz_read(r->fl, r->labels_path, raw, piece, &got);
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
    fl_status s = gz_read(r->fi, r->images_path, r->pixels, per, &got);
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
  fl_status s = idx_open(r.images_path, IDX_IMAGES_MAGIC, "idx3-ubyte (images)", 3, dims, &r.fi);
  if (s == FL_OK) s = idx_open(r.labels_path, IDX_LABELS_MAGIC, "idx1-ubyte (labels)", 1, dims, &r.fl);
  if (s == FL_OK && !(r.pixels = malloc((size_t)a.rows * a.cols)))
    s = fl_set_error(FL_ENOMEM, "%s: out of memory", r.images_path);
  if (s == FL_OK)
    s = data_emit_blocks(out, a.n, a.parts, partition, a.interleave, 0, a.block_images, 1, a.rows, a.cols, a.classes,
                    split, idx_fill, &r);
  free(r.pixels);
  if (r.fi) gzclose(r.fi);
  if (r.fl) gzclose(r.fl);
  return s;
}

FL_API fl_status gpu_data_idx_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return data_idx_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

/* Reads the whole labels file to check its count against the images' and every label. */
static fl_status idx_check_labels(const char *path, uint32_t n_images, const char *images_path, uint32_t classes) {
  uint32_t n;
  gzFile f;
  fl_status s = idx_open(path, IDX_LABELS_MAGIC, "idx1-ubyte (labels)", 1, &n, &f);
  if (s != FL_OK) return s;
  if (n != n_images) {
    gzclose(f);
    return fl_set_error(FL_EFORMAT, "%s has %u images but %s has %u labels", images_path, n_images, path, n);
  }
  uint8_t buf[65536];
  uint64_t seen = 0;
  size_t got;
  while (s == FL_OK && (s = gz_read(f, path, buf, sizeof buf, &got)) == FL_OK && got) {
    for (size_t i = 0; i < got && s == FL_OK; i++)
      if (seen + i < n && buf[i] >= classes)
        s = fl_set_error(FL_EFORMAT, "%s: label %llu is %u, outside [0, %u)", path,
                         (unsigned long long)(seen + i + 1), buf[i], classes);
    seen += got;
  }
  gzclose(f);
  if (s == FL_OK && seen < n)
    s = fl_set_error(FL_EFORMAT, "%s: truncated: %llu of the %u labels its header announces", path,
                     (unsigned long long)seen, n);
  if (s == FL_OK && seen > n) s = fl_set_error(FL_EFORMAT, "%s: trailing bytes after %u labels", path, n);
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
  gzFile f;
  fl_status s = idx_open(images_path, IDX_IMAGES_MAGIC, "idx3-ubyte (images)", 3, dims, &f);
  if (s != FL_OK) return s;
  gzclose(f);
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
  fl_buf arg = FL_BUF_INIT;
  fl_dataset *seeds = NULL, *blocks = NULL;
  if ((s = fl_buf_append(&arg, &a, sizeof a)) == FL_OK && (s = fl_buf_append(&arg, images_abs, strlen(images_abs) + 1)) == FL_OK)
    s = fl_buf_append(&arg, labels_abs, strlen(labels_abs) + 1);
  if (s == FL_OK) s = fl_range(ctx, 0, parts, 1, parts, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, gpu_data_idx_partition, arg.data, arg.len, &blocks);
  if (s == FL_OK) s = fl_persist(blocks, FL_MEMORY_ONLY);
  fl_buf source = FL_BUF_INIT;
  if (s == FL_OK) s = data_source_encode(SOURCE_IDX, arg.data, arg.len, &source);
  fl_dataset_free(seeds);
  fl_buf_free(&arg);
  if (s != FL_OK) {
    fl_dataset_free(blocks);
    fl_buf_free(&source);
    return s;
  }
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
