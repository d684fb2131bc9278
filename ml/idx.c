/*
 * idx.c: the IDX file reader of flint/ml.h, the one reader of MNIST's format: fl_ml_load
 * (load_idx.c) and libflint_gpu's image data sets (gpu/data/idx.c) read IDX files through it.
 * zlib reads gzip'd and plain files alike; what it does not check is checked here: a .gz name
 * over data that is not gzip (zlib would read it as it is), and gzip data cut short (zlib
 * returns 0 there as at the proper end, and only gzerror tells them apart).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

#include "ml/ml.h"

struct fl_ml_idx {
  gzFile f;
  uint32_t magic;
  uint64_t header_bytes, item_bytes; /* the header; one image or one label */
  char path[];
};

bool ml_is_gzip_name(const char *path) {
  size_t n = strlen(path);
  return n > 3 && strcmp(path + n - 3, ".gz") == 0;
}

/* Reads exactly len bytes; *got says how many came (fewer only at the end of the data). A
 * read error is FL_EIO; gzip data that is corrupt or cut short is FL_ECORRUPT naming the
 * byte of the file: at a premature end zlib returns 0 as at the proper one (gzeof() is true
 * for both) and keeps Z_BUF_ERROR, which only gzerror() tells. */
static fl_status gz_read(gzFile f, const char *path, void *buf, size_t len, size_t *got) {
  *got = 0;
  while (*got < len) {
    unsigned chunk = len - *got > (1u << 30) ? 1u << 30 : (unsigned)(len - *got);
    int n = gzread(f, (uint8_t *)buf + *got, chunk);
    int err;
    const char *msg = gzerror(f, &err);
    if (n < 0 && err == Z_ERRNO) return fl_set_error(FL_EIO, "%s: read error: %s", path, strerror(errno));
    if (n < 0)
      return fl_set_error(FL_ECORRUPT, "%s: bad gzip data at byte %lld of the file: %s", path,
                          (long long)gzoffset(f), msg);
    if (n == 0 && err == Z_BUF_ERROR)
      return fl_set_error(FL_ECORRUPT,
                          "%s: truncated gzip data: the file ends at byte %lld, inside the compressed stream "
                          "(after %lld bytes of data)",
                          path, (long long)gzoffset(f), (long long)gztell(f));
    if (n == 0) break;
    *got += (size_t)n;
  }
  return FL_OK;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

fl_status fl_ml_idx_open(const char *path, uint32_t magic, uint32_t *dims, fl_ml_idx **out) {
  if (!path || !dims || !out) return fl_set_error(FL_EINVAL, "fl_ml_idx_open: NULL argument");
  if (magic != FL_ML_IDX_IMAGES && magic != FL_ML_IDX_LABELS)
    return fl_set_error(FL_EINVAL, "fl_ml_idx_open: magic 0x%08x is neither idx3-ubyte images (0x%08x) nor "
                        "idx1-ubyte labels (0x%08x)", magic, FL_ML_IDX_IMAGES, FL_ML_IDX_LABELS);
  const char *kind = magic == FL_ML_IDX_IMAGES ? "idx3-ubyte (images)" : "idx1-ubyte (labels)";
  int ndims = (int)(magic & 0xffu);
  errno = 0;
  gzFile f = gzopen(path, "rb");
  if (!f)
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot open %s: %s", path,
                        errno ? strerror(errno) : "out of memory");
  uint8_t head[16];
  size_t want = 4 + 4 * (size_t)ndims, got;
  fl_status s = FL_OK;
  if (ml_is_gzip_name(path) && gzdirect(f))
    s = fl_set_error(FL_ECORRUPT, "%s: named .gz but not gzip data (it does not start with the gzip magic 1f 8b)",
                     path);
  if (s == FL_OK) s = gz_read(f, path, head, want, &got);
  if (s == FL_OK && got >= 4 && be32(head) != magic)
    s = fl_set_error(FL_EFORMAT, "%s: bad magic 0x%08x (an %s file starts with 0x%08x)", path, be32(head), kind, magic);
  if (s == FL_OK && got < want)
    s = fl_set_error(FL_EFORMAT, "%s: truncated: %zu bytes, shorter than an %s header", path, got, kind);
  fl_ml_idx *r = NULL;
  if (s == FL_OK && !(r = malloc(sizeof *r + strlen(path) + 1)))
    s = fl_set_error(FL_ENOMEM, "%s: out of memory", path);
  if (s != FL_OK) {
    gzclose(f);
    return s;
  }
  r->f = f;
  r->magic = magic;
  r->header_bytes = want;
  r->item_bytes = 1;
  for (int i = 0; i < ndims; i++) {
    dims[i] = be32(head + 4 + 4 * i);
    if (i > 0) r->item_bytes *= dims[i];
  }
  memcpy(r->path, path, strlen(path) + 1);
  *out = r;
  return FL_OK;
}

fl_status fl_ml_idx_read(fl_ml_idx *f, void *buf, size_t len, size_t *got) {
  return gz_read(f->f, f->path, buf, len, got);
}

fl_status fl_ml_idx_seek(fl_ml_idx *f, uint64_t index) {
  if (gzseek(f->f, (z_off_t)(f->header_bytes + index * f->item_bytes), SEEK_SET) < 0)
    return fl_set_error(FL_EFORMAT, "%s: cannot seek to %s %llu (truncated?)", f->path,
                        f->magic == FL_ML_IDX_IMAGES ? "image" : "label", (unsigned long long)index + 1);
  return FL_OK;
}

fl_status fl_ml_idx_expect_end(fl_ml_idx *f, const char *what) {
  uint8_t extra;
  size_t got;
  fl_status s = gz_read(f->f, f->path, &extra, 1, &got);
  if (s == FL_OK && got) s = fl_set_error(FL_EFORMAT, "%s: trailing bytes after %s", f->path, what);
  return s;
}

void fl_ml_idx_close(fl_ml_idx *f) {
  if (!f) return;
  gzclose(f->f);
  free(f);
}

fl_status fl_ml_idx_read_labels(const char *path, fl_buf *labels) {
  if (!labels) return fl_set_error(FL_EINVAL, "fl_ml_idx_read_labels: NULL labels");
  uint32_t n;
  fl_ml_idx *f;
  fl_status s = fl_ml_idx_open(path, FL_ML_IDX_LABELS, &n, &f);
  if (s != FL_OK) return s;
  size_t start = labels->len;
  char what[64];
  snprintf(what, sizeof what, "%u labels", n);
  /* In pieces, so that a corrupt count in the header allocates no more than the file has. */
  while (s == FL_OK && labels->len - start < n) {
    size_t left = n - (labels->len - start), piece = left < (1u << 20) ? left : 1u << 20, part;
    if ((s = fl_buf_reserve(labels, piece)) != FL_OK || (s = fl_ml_idx_read(f, labels->data + labels->len, piece, &part)) != FL_OK)
      break;
    labels->len += part;
    if (part < piece) break;
  }
  size_t got = labels->len - start;
  if (s == FL_OK && got < n)
    s = fl_set_error(FL_EFORMAT, "%s: truncated: label %zu of %u is missing (the header says %u labels)", path, got + 1,
                     n, n);
  if (s == FL_OK) s = fl_ml_idx_expect_end(f, what);
  fl_ml_idx_close(f);
  return s;
}
