/*
 * gpu/data/image_folder.c: the image-folder source of include/flint/image.h: the listing of
 * DIR/CLASS/FILE on the calling thread, image records, and the task that decodes and caches
 * a partition's files on the executors.
 *
 * The listing travels as the records of a parallelized dataset (label, index, the path below
 * the root), so a task's argument stays small however many files the folder holds.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"

/* ---- records --------------------------------------------------------------------------- */

fl_status fl_image_record_view(fl_bytes rec, fl_image_view *out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_image_record_view: out is NULL");
  uint32_t head[6];
  if (!rec.data || rec.len < FL_IMAGE_HEADER)
    return fl_set_error(FL_EFORMAT, "image record of %zu bytes (shorter than its header)", rec.len);
  memcpy(head, rec.data, sizeof head);
  if (head[0] != FL_IMAGE_MAGIC) return fl_set_error(FL_EFORMAT, "not an image record (magic %08x)", head[0]);
  uint64_t want = FL_IMAGE_HEADER + (uint64_t)head[2] * head[3] * head[4];
  if (head[4] != 3 || head[2] == 0 || head[3] == 0 || head[2] > 65535 || head[3] > 65535 || rec.len != want)
    return fl_set_error(FL_EFORMAT, "image record of %u x %u x %u pixels in %zu bytes", head[2], head[3], head[4],
                        rec.len);
  out->label = (int32_t)head[1];
  out->height = head[2];
  out->width = head[3];
  out->channels = head[4];
  memcpy(&out->index, rec.data + 24, 8);
  out->pixels = rec.data + FL_IMAGE_HEADER;
  return FL_OK;
}

/* Writes the header and makes room for the pixels; returns where they go. */
static uint8_t *record_start(int32_t label, uint64_t index, uint32_t height, uint32_t width, fl_buf *out) {
  size_t total = FL_IMAGE_HEADER + (size_t)height * width * 3;
  out->len = 0;
  if (fl_buf_reserve(out, total) != FL_OK) return NULL;
  uint32_t head[6] = {FL_IMAGE_MAGIC, (uint32_t)label, height, width, 3, 0};
  memcpy(out->data, head, sizeof head);
  memcpy(out->data + 24, &index, 8);
  out->len = total;
  return out->data + FL_IMAGE_HEADER;
}

fl_status fl_image_record_encode(int32_t label, uint64_t index, uint32_t height, uint32_t width, const uint8_t *rgb,
                                 fl_buf *out) {
  if (!rgb || !out || !height || !width || height > 65535 || width > 65535)
    return fl_set_error(FL_EINVAL, "fl_image_record_encode: an image of %u x %u (or NULL)", width, height);
  uint8_t *px = record_start(label, index, height, width, out);
  if (!px) return fl_set_error(FL_ENOMEM, "image record: out of memory");
  memcpy(px, rgb, (size_t)height * width * 3);
  return FL_OK;
}

fl_status image_load_record(const char *path, int32_t label, uint64_t index, const image_cache_size *cs,
                            fl_buf *out) {
  bool exact = cs->width && cs->height;
  uint32_t min_side = exact ? (cs->width > cs->height ? cs->width : cs->height) : cs->size;
  uint8_t *rgb = NULL;
  uint32_t w, h, ow, oh;
  fl_status s = fl_image_decode_file(path, min_side, &rgb, &h, &w);
  if (s != FL_OK) return s;
  if (exact) ow = cs->width, oh = cs->height;
  else image_shorter_side(w, h, cs->size, &ow, &oh);
  uint8_t *px = record_start(label, index, oh, ow, out);
  if (!px) s = fl_set_error(FL_ENOMEM, "image %s: out of memory", path);
  else if (ow == w && oh == h) memcpy(px, rgb, (size_t)w * h * 3);
  else s = fl_image_resize(rgb, w, h, 0, 0, w, h, ow, oh, px);
  common_free(rgb);
  return s;
}

/* ---- the listing ----------------------------------------------------------------------- */

struct fl_image_classes {
  uint32_t count;
  char **names;
  uint64_t images;
};

uint32_t fl_image_classes_count(const fl_image_classes *c) { return c ? c->count : 0; }
const char *fl_image_classes_name(const fl_image_classes *c, uint32_t label) {
  return c && label < c->count ? c->names[label] : NULL;
}
uint64_t fl_image_classes_images(const fl_image_classes *c) { return c ? c->images : 0; }

static void free_names(char **names, size_t n) {
  for (size_t i = 0; names && i < n; i++) common_free(names[i]);
  common_free(names);
}

void fl_image_classes_free(fl_image_classes *c) {
  if (!c) return;
  free_names(c->names, c->count);
  common_free(c);
}

void image_listing_free(image_listing *l) {
  common_free(l->root);
  free_names(l->class_names, l->classes);
  free_names(l->paths, l->images);
  common_free(l->labels);
  memset(l, 0, sizeof *l);
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_image_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && dot != name &&
         (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0 || strcasecmp(dot, ".png") == 0);
}

/* The sorted names in `dir` that are folders (want_dirs) or image files (else), hidden ones
 * left out. */
static fl_status list_names(const char *dir, bool want_dirs, char ***names, size_t *count) {
  DIR *d = opendir(dir);
  if (!d)
    return fl_set_error(errno == ENOENT || errno == ENOTDIR ? FL_ENOENT : FL_EIO, "image folder %s: %s", dir,
                        strerror(errno));
  char **list = NULL, path[PATH_MAX];
  size_t n = 0, cap = 0;
  fl_status s = FL_OK;
  struct dirent *e;
  while (s == FL_OK && (errno = 0, e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (!want_dirs && !is_image_name(e->d_name)) continue;
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
      s = fl_set_error(FL_EINVAL, "image folder: path %s/%s is too long", dir, e->d_name);
      break;
    }
    if (stat(path, &st) != 0) continue; /* a dangling link is no image */
    if (want_dirs ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) continue;
    char **grown = common_grow(list, sizeof *list, n, &cap, 64);
    char *name = grown ? common_strdup(e->d_name) : NULL;
    if (grown) list = grown;
    if (!name) s = fl_set_error(FL_ENOMEM, "image folder %s: out of memory", dir);
    else list[n++] = name;
  }
  if (s == FL_OK && errno != 0) s = fl_set_error(FL_EIO, "image folder %s: %s", dir, strerror(errno));
  closedir(d);
  if (s != FL_OK) {
    free_names(list, n);
    return s;
  }
  if (n) qsort(list, n, sizeof *list, compare_names);
  *names = list;
  *count = n;
  return FL_OK;
}

fl_status image_list(const char *dir, bool allow_empty, image_listing *out) {
  image_listing l = {0};
  char root[PATH_MAX], sub[PATH_MAX];
  size_t classes = 0, cap = 0;
  fl_status s = FL_OK;
  if (!realpath(dir, root))
    return fl_set_error(errno == ENOENT || errno == ENOTDIR ? FL_ENOENT : FL_EIO, "image folder %s: %s", dir,
                        strerror(errno));
  if (!(l.root = common_strdup(root))) return fl_set_error(FL_ENOMEM, "image folder: out of memory");
  if ((s = list_names(root, true, &l.class_names, &classes)) != FL_OK) goto fail;
  l.classes = (uint32_t)classes;
  if (classes == 0) {
    s = fl_set_error(FL_EEMPTY, "image folder %s has no class folders (DIR/CLASS/*.jpg|jpeg|png)", dir);
    goto fail;
  }
  if (classes > INT32_MAX) {
    s = fl_set_error(FL_ELIMIT, "image folder %s: %zu classes", dir, classes);
    goto fail;
  }
  for (uint32_t c = 0; c < l.classes; c++) {
    char **files;
    size_t n;
    int len = snprintf(sub, sizeof sub, "%s/%s", root, l.class_names[c]);
    if (len < 0 || (size_t)len >= sizeof sub) {
      s = fl_set_error(FL_ELIMIT, "image folder %s: the path of class folder %s is too long", dir, l.class_names[c]);
      goto fail;
    }
    if ((s = list_names(sub, false, &files, &n)) != FL_OK) goto fail;
    if (n == 0 && !allow_empty) {
      free_names(files, n);
      s = fl_set_error(FL_EEMPTY, "image folder %s: class folder %s has no .jpg, .jpeg or .png files", dir,
                       l.class_names[c]);
      goto fail;
    }
    for (size_t i = 0; s == FL_OK && i < n; i++) {
      size_t need = l.images + 1;
      if (need > cap) {
        size_t ncap = cap ? cap * 2 : 1024;
        char **p = common_realloc(l.paths, ncap * sizeof *p);
        if (p) l.paths = p;
        int32_t *lb = p ? common_realloc(l.labels, ncap * sizeof *lb) : NULL;
        if (lb) l.labels = lb, cap = ncap;
        else s = fl_set_error(FL_ENOMEM, "image folder %s: out of memory", dir);
      }
      size_t len = strlen(l.class_names[c]) + 1 + strlen(files[i]) + 1;
      char *rel = s == FL_OK ? common_malloc(len) : NULL;
      if (s == FL_OK && !rel) s = fl_set_error(FL_ENOMEM, "image folder %s: out of memory", dir);
      if (s == FL_OK) {
        snprintf(rel, len, "%s/%s", l.class_names[c], files[i]);
        l.paths[l.images] = rel;
        l.labels[l.images] = (int32_t)c;
        l.images++;
      }
    }
    free_names(files, n);
    if (s != FL_OK) goto fail;
  }
  if (l.images == 0) {
    s = fl_set_error(FL_EEMPTY, "image folder %s has no .jpg, .jpeg or .png files in its class folders", dir);
    goto fail;
  }
  *out = l;
  return FL_OK;
fail:
  image_listing_free(&l);
  return s;
}

fl_status image_classes_take(image_listing *l, fl_image_classes **out) {
  fl_image_classes *c = common_calloc(1, sizeof *c);
  if (!c) return fl_set_error(FL_ENOMEM, "image folder: out of memory");
  c->count = l->classes;
  c->names = l->class_names;
  c->images = l->images;
  l->class_names = NULL;
  l->classes = 0;
  *out = c;
  return FL_OK;
}

/* ---- the decode task -------------------------------------------------------------------- */

/* The task's argument: the cache size, skip_bad, then the root, NUL-terminated. Each input
 * record: int32 label, uint32 zero, uint64 index, the path below the root. */
typedef struct decode_arg {
  image_cache_size cache;
  uint32_t skip_bad;
} decode_arg;

FL_API fl_status fl_image_decode_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  decode_arg a;
  memcpy(&a, arg, sizeof a);
  const char *root = (const char *)arg + sizeof a;
  char path[PATH_MAX];
  fl_buf rec = FL_BUF_INIT;
  fl_bytes item;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &item)) {
    int32_t label;
    uint64_t index;
    if (item.len < 16 || item.len - 16 >= PATH_MAX - strlen(root) - 2) {
      s = fl_set_error(FL_EINTERNAL, "image folder: a listing record of %zu bytes", item.len);
      break;
    }
    memcpy(&label, item.data, 4);
    memcpy(&index, item.data + 8, 8);
    snprintf(path, sizeof path, "%s/%.*s", root, (int)(item.len - 16), (const char *)item.data + 16);
    s = image_load_record(path, label, index, &a.cache, &rec);
    if (s != FL_OK && a.skip_bad && s != FL_ENOMEM) {
      common_log(LOG_WARN, "image folder: skipping a bad image: %s", fl_last_error());
      s = FL_OK;
      continue;
    }
    if (s == FL_OK) s = fl_emit(out, rec.data, rec.len);
  }
  fl_buf_free(&rec);
  return s;
}

fl_status image_cache_of(const fl_image_folder_options *o, image_cache_size *out) {
  bool exact = o->cache_width || o->cache_height;
  if (exact && !(o->cache_width && o->cache_height))
    return fl_set_error(FL_EINVAL, "image folder: cache_width %u and cache_height %u (set both or neither)",
                        o->cache_width, o->cache_height);
  if (o->cache_size > 65535 || o->cache_width > 65535 || o->cache_height > 65535)
    return fl_set_error(FL_EINVAL, "image folder: a cache size above 65535");
  *out = (image_cache_size){o->cache_size ? o->cache_size : 256, exact ? o->cache_width : 0,
                            exact ? o->cache_height : 0};
  return FL_OK;
}

fl_status fl_image_folder(fl_context *ctx, const char *dir, const fl_image_folder_options *opts, fl_dataset **out,
                          fl_image_classes **classes) {
  if (!ctx || !dir || !out) return fl_set_error(FL_EINVAL, "fl_image_folder: NULL argument");
  fl_image_folder_options o = opts ? *opts : (fl_image_folder_options)FL_IMAGE_FOLDER_OPTIONS_INIT;
  decode_arg a;
  memset(&a, 0, sizeof a); /* its bytes travel as they are */
  a.skip_bad = o.skip_bad;
  fl_status status = image_cache_of(&o, &a.cache);
  if (status != FL_OK) return status;
  image_listing l = {0};
  fl_bytes *items = NULL;
  uint8_t *blob = NULL;
  fl_buf arg = FL_BUF_INIT;
  fl_dataset *listing = NULL, *images = NULL;
  fl_image_classes *c = NULL;
  FL_CHECK(image_list(dir, o.allow_empty, &l));
  /* One blob holds every listing record; items are views into it. */
  size_t bytes = 0;
  for (uint64_t i = 0; i < l.images; i++) bytes += 16 + strlen(l.paths[i]);
  items = common_malloc(l.images * sizeof *items);
  blob = common_malloc(bytes);
  if (!items || !blob) {
    status = fl_set_error(FL_ENOMEM, "image folder %s: out of memory for %llu files", dir,
                          (unsigned long long)l.images);
    goto cleanup;
  }
  uint8_t *p = blob;
  for (uint64_t i = 0; i < l.images; i++) {
    int32_t head[2] = {l.labels[i], 0};
    size_t len = strlen(l.paths[i]);
    memcpy(p, head, 8);
    memcpy(p + 8, &i, 8);
    memcpy(p + 16, l.paths[i], len);
    items[i] = fl_bytes_of(p, 16 + len);
    p += 16 + len;
  }
  uint32_t parts = o.partitions && o.partitions > l.images ? (uint32_t)l.images : o.partitions; /* 0: default */
  FL_CHECK(fl_buf_append(&arg, &a, sizeof a));
  FL_CHECK(fl_buf_append(&arg, l.root, strlen(l.root) + 1));
  FL_CHECK(fl_parallelize(ctx, items, l.images, parts, &listing));
  FL_CHECK(fl_map_partitions(listing, fl_image_decode_partition, arg.data, arg.len, &images));
  if (classes) FL_CHECK(image_classes_take(&l, &c));
  *out = images;
  images = NULL;
  if (classes) *classes = c;
cleanup:
  fl_dataset_free(images);
  fl_dataset_free(listing);
  fl_buf_free(&arg);
  common_free(blob);
  common_free(items);
  image_listing_free(&l);
  return status;
}
