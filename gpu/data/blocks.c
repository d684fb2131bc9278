/*
 * gpu/data/blocks.c: image datasets (IDX / Fashion-MNIST, synthetic-imagenet) as flint datasets of
 * image blocks, and the rank's mini-batch reader. Layouts and promises are in gpu/data.h.
 *
 * gpu/ reads datasets through the public flint API only. ml/load.c has an IDX reader, but it
 * lives in libflint_ml and makes float64 row blocks; a training image wants float32 NCHW, so
 * this file has its own small reader (gzip through zlib, which also reads plain files).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "gpu/data/data.h"

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u
#define DEFAULT_BLOCK_IMAGES 256u

/* ---- seeded numbers (splitmix64: each value a pure function of its input) --------------- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Uniform in [0, 1) from 53 bits. */
static double unit_of(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

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
  memset(d, 0, sizeof *d);
}

/* Fills labels[count] and images with images index, index + stride, ... of the data set. */
typedef fl_status (*fill_fn)(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                             float *images);

/* A piece of a partition: n images, first, first + stride, ... */
typedef struct part_range {
  uint64_t first, n;
  uint32_t stride;
} part_range;

/* The k-th piece of partition p of `parts` over `images` images (false after the last).
 * run 0: one contiguous range (the default); run 1: every parts-th image from p (interleave);
 * run r > 1: runs of r consecutive images, the (k parts + p)-th run for k = 0, 1, ... */
static bool partition_piece(uint64_t images, uint32_t parts, uint32_t p, uint32_t run, uint64_t k, part_range *out) {
  if (run <= 1) {
    if (k > 0) return false;
    if (run == 1) *out = (part_range){p, p < images ? (images - p + parts - 1) / parts : 0, parts};
    else *out = (part_range){images * p / parts, images * (p + 1) / parts - images * p / parts, 1};
    return true;
  }
  uint64_t start = (k * parts + p) * run;
  if (start >= images) return false;
  *out = (part_range){start, (start + run < images ? start + run : images) - start, 1};
  return true;
}

/* Emits partition p's images in blocks (none crossing a piece), filling each with fill();
 * base is added to every image index (a data set that starts further on). */
static fl_status emit_blocks(fl_emitter *out, uint64_t images_total, uint32_t parts, uint32_t p, uint32_t run,
                             uint64_t base, uint32_t block_images, uint32_t c, uint32_t h, uint32_t w,
                             uint32_t classes, data_split split, fill_fn fill, const void *ctx) {
  size_t per = (size_t)c * h * w;
  uint64_t n = 0, blocks = 0;
  part_range pr;
  for (uint64_t k = 0; partition_piece(images_total, parts, p, run, k, &pr); k++) {
    n += pr.n;
    blocks += (pr.n + block_images - 1) / block_images;
  }
  fl_status s = FL_OK;
  if (n == 0) return FL_OK;
  /* One allocation for the partition's output (a cached map_partitions keeps it as is). */
  size_t bytes = (size_t)blocks * (DATA_BLOCK_HEADER + labels_padded(block_images)) + (size_t)n * per * sizeof(float);
  if ((s = fl_emit_reserve(out, blocks, bytes)) != FL_OK) return s;
  int32_t *labels = malloc((size_t)block_images * sizeof *labels);
  float *images = malloc((size_t)block_images * per * sizeof *images);
  fl_buf rec = FL_BUF_INIT;
  if (!labels || !images) s = fl_set_error(FL_ENOMEM, "image blocks: out of memory");
  for (uint64_t k = 0; s == FL_OK && partition_piece(images_total, parts, p, run, k, &pr); k++)
    for (uint64_t done = 0; s == FL_OK && done < pr.n; done += block_images) {
      uint32_t count = (uint32_t)(pr.n - done < block_images ? pr.n - done : block_images);
      uint64_t at = base + pr.first + done * pr.stride;
      if ((s = fill(ctx, at, pr.stride, count, labels, images)) != FL_OK) break;
      if ((s = data_block_encode(count, c, h, w, classes, split, at, pr.stride, labels, images, &rec)) != FL_OK)
        break;
      s = fl_emit(out, rec.data, rec.len);
    }
  fl_buf_free(&rec);
  free(images);
  free(labels);
  return s;
}

/* The run length the tasks' arguments carry: 0 ranges, 1 interleave, r > 1 runs of r. */
static uint32_t layout_run(const data_options *o) { return o->interleave ? (o->run ? o->run : 1) : 0; }

/* A data set's source, for data_pair: u32 kind, u32 arg bytes, the partition task's arg. */
enum { SOURCE_IDX = 1, SOURCE_SYNTHETIC = 2 };

static fl_status source_encode(uint32_t kind, const void *arg, size_t len, fl_buf *out) {
  uint32_t head[2] = {kind, (uint32_t)len};
  fl_status s = fl_buf_append(out, head, sizeof head);
  return s == FL_OK ? fl_buf_append(out, arg, len) : s;
}

/* ---- IDX -------------------------------------------------------------------------------- */

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

static fl_status idx_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
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
    s = emit_blocks(out, a.n, a.parts, partition, a.interleave, 0, a.block_images, 1, a.rows, a.cols, a.classes,
                    split, idx_fill, &r);
  free(r.pixels);
  if (r.fi) gzclose(r.fi);
  if (r.fl) gzclose(r.fl);
  return s;
}

FL_API fl_status gpu_data_idx_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return idx_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

static uint32_t partitions_for(fl_context *ctx, const data_options *o, uint64_t images) {
  uint32_t p = o && o->partitions ? o->partitions : fl_context_cores(ctx);
  if (p == 0) p = 1;
  if (images && p > images) p = (uint32_t)images;
  return p;
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
  uint32_t parts = partitions_for(ctx, &o, used);
  idx_arg a = {.n = used, .parts = parts, .block_images = o.block_images ? o.block_images : DEFAULT_BLOCK_IMAGES,
               .rows = dims[1], .cols = dims[2], .classes = classes, .offset = 0, .scale = 1.0f / 255,
               .interleave = layout_run(&o)};
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
  if (s == FL_OK) s = source_encode(SOURCE_IDX, arg.data, arg.len, &source);
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

/* ---- synthetic-imagenet ---------------------------------------------------------------- */

#define IMNET_C DATA_IMAGENET_CHANNELS
#define IMNET_S DATA_IMAGENET_SIZE

void data_synthetic_image(uint64_t seed, uint64_t index, float *image, int32_t *label) {
  uint64_t base = mix64(seed ^ 0x5157a1d3u);
  uint32_t cls = (uint32_t)(mix64(base ^ mix64(index)) % DATA_IMAGENET_CLASSES);
  *label = (int32_t)cls;
  /* Noise: xorshift64* seeded from (seed, index). */
  uint64_t x = mix64(base + 0x632be59bd9b4e019ull * (index + 1)) | 1;
  for (int c = 0; c < IMNET_C; c++) {
    uint64_t k = mix64(base ^ ((uint64_t)cls << 8 | (uint64_t)c));
    double mean = unit_of(mix64(k + 1)) - 0.5;
    double fy = 0.02 + 0.2 * unit_of(mix64(k + 2)), py = 6.283185307179586 * unit_of(mix64(k + 3));
    double fx = 0.02 + 0.2 * unit_of(mix64(k + 4)), pxh = 6.283185307179586 * unit_of(mix64(k + 5));
    float row[IMNET_S], col[IMNET_S];
    for (int i = 0; i < IMNET_S; i++) {
      row[i] = (float)(mean + 0.25 * sin(fy * i + py));
      col[i] = (float)(0.25 * sin(fx * i + pxh));
    }
    float *plane = image + (size_t)c * IMNET_S * IMNET_S;
    for (int i = 0; i < IMNET_S; i++)
      for (int j = 0; j < IMNET_S; j++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        float noise = (float)((x * 0x2545f4914f6cdd1dull) >> 40) * 0x1.0p-24f - 0.5f;
        plane[i * IMNET_S + j] = row[i] + col[j] + noise;
      }
  }
}

typedef struct synth_arg {
  uint64_t seed, first, count;
  uint32_t parts, block_images;
  uint32_t interleave, pad; /* interleave: layout_run (0 ranges, 1 single images, r > 1 runs) */
} synth_arg;

static fl_status synth_fill(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                            float *images) {
  const synth_arg *a = ctx;
  size_t per = (size_t)IMNET_C * IMNET_S * IMNET_S;
  for (uint32_t i = 0; i < count; i++)
    data_synthetic_image(a->seed, index + (uint64_t)i * stride, images + i * per, &labels[i]);
  return FL_OK;
}

static fl_status synth_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
  synth_arg a;
  memcpy(&a, arg, sizeof a);
  return emit_blocks(out, a.count, a.parts, partition, a.interleave, a.first, a.block_images, IMNET_C, IMNET_S,
                     IMNET_S, DATA_IMAGENET_CLASSES, split, synth_fill, &a);
}

FL_API fl_status gpu_data_synthetic_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return synth_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

fl_status data_synthetic_imagenet(fl_context *ctx, uint64_t seed, uint64_t first, uint64_t count,
                                  const data_options *opts, data_set *out) {
  if (!ctx || !out) return fl_set_error(FL_EINVAL, "data_synthetic_imagenet: NULL argument");
  if (count == 0) return fl_set_error(FL_EINVAL, "synthetic-imagenet: 0 images");
  if (count > (1ull << 40) || first > (1ull << 62))
    return fl_set_error(FL_EINVAL, "synthetic-imagenet: %llu images from %llu", (unsigned long long)count,
                        (unsigned long long)first);
  data_options o = opts ? *opts : (data_options)DATA_OPTIONS_INIT;
  uint32_t parts = partitions_for(ctx, &o, count);
  /* An image is 588 KiB: blocks of 16 keep a record near 10 MiB. */
  synth_arg a = {.seed = seed, .first = first, .count = count, .parts = parts,
                 .block_images = o.block_images ? o.block_images : 16, .interleave = layout_run(&o)};
  fl_dataset *seeds = NULL, *blocks = NULL;
  fl_buf source = FL_BUF_INIT;
  fl_status s = fl_range(ctx, 0, parts, 1, parts, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, gpu_data_synthetic_partition, &a, sizeof a, &blocks);
  if (s == FL_OK) s = fl_persist(blocks, FL_MEMORY_ONLY);
  if (s == FL_OK) s = source_encode(SOURCE_SYNTHETIC, &a, sizeof a, &source);
  fl_dataset_free(seeds);
  if (s != FL_OK) {
    fl_dataset_free(blocks);
    fl_buf_free(&source);
    return s;
  }
  *out = (data_set){.blocks = blocks, .images = count, .channels = IMNET_C, .height = IMNET_S, .width = IMNET_S,
                    .classes = DATA_IMAGENET_CLASSES, .partitions = parts, .source = source};
  return FL_OK;
}

/* ---- train and test in one dataset ------------------------------------------------------ */

/* Emits partition `partition` of the source at *p (advancing *p past it). */
static fl_status source_emit(uint32_t partition, fl_emitter *out, const uint8_t **p, data_split split) {
  uint32_t head[2];
  memcpy(head, *p, 8);
  const uint8_t *arg = *p + 8;
  *p = arg + head[1];
  switch (head[0]) {
  case SOURCE_IDX: return idx_emit(partition, out, arg, split);
  case SOURCE_SYNTHETIC: return synth_emit(partition, out, arg, split);
  default: return fl_set_error(FL_EINTERNAL, "image blocks: unknown source %u", head[0]);
  }
}

FL_API fl_status gpu_data_pair_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  const uint8_t *p = arg;
  fl_status s = source_emit(partition, out, &p, DATA_SPLIT_TRAIN);
  return s == FL_OK ? source_emit(partition, out, &p, DATA_SPLIT_TEST) : s;
}

fl_status data_pair(fl_context *ctx, const data_set *train, const data_set *test, fl_dataset **out) {
  if (!ctx || !train || !test || !out) return fl_set_error(FL_EINVAL, "data_pair: NULL argument");
  if (!train->source.len || !test->source.len) return fl_set_error(FL_EINVAL, "data_pair: a data set without a source");
  if (train->partitions != test->partitions)
    return fl_set_error(FL_EINVAL, "data_pair: %u training partitions but %u test partitions", train->partitions,
                        test->partitions);
  fl_buf arg = FL_BUF_INIT;
  fl_dataset *seeds = NULL, *pair = NULL;
  fl_status s = fl_buf_append(&arg, train->source.data, train->source.len);
  if (s == FL_OK) s = fl_buf_append(&arg, test->source.data, test->source.len);
  if (s == FL_OK) s = fl_range(ctx, 0, train->partitions, 1, train->partitions, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, gpu_data_pair_partition, arg.data, arg.len, &pair);
  if (s == FL_OK) s = fl_persist(pair, FL_MEMORY_ONLY);
  fl_dataset_free(seeds);
  fl_buf_free(&arg);
  if (s != FL_OK) {
    fl_dataset_free(pair);
    return s;
  }
  *out = pair;
  return FL_OK;
}

/* ---- the reader ------------------------------------------------------------------------- */

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
};

fl_status data_reader_create(uint32_t batch, data_reader **out) {
  if (batch == 0) return fl_set_error(FL_EINVAL, "data_reader_create: batch 0");
  data_reader *r = calloc(1, sizeof *r);
  if (!r) return fl_set_error(FL_ENOMEM, "data_reader_create: out of memory");
  r->batch = batch;
  *out = r;
  return FL_OK;
}

void data_reader_destroy(data_reader *r) {
  if (!r) return;
  free(r->labels);
  free(r->images);
  free(r->order);
  free(r);
}

fl_status data_reader_add_block(data_reader *r, fl_bytes rec) {
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
    int32_t *labels = realloc(r->labels, cap * sizeof *labels);
    if (labels) r->labels = labels;
    float *images = labels ? realloc(r->images, cap * r->per * sizeof *images) : NULL;
    if (images) r->images = images;
    uint64_t *order = images ? realloc(r->order, cap * sizeof *order) : NULL;
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
  for (uint64_t i = 0; i < r->n; i++) r->order[i] = i;
  if (!shuffle) return;
  uint64_t state = mix64(seed ^ mix64(0xe90c5u + epoch));
  for (uint64_t i = r->n; i > 1; i--) {
    state = mix64(state);
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
    memcpy(images + (size_t)i * r->per, r->images + k * r->per, r->per * sizeof(float));
  }
  r->pos += count;
  r->handed++;
  return count;
}
