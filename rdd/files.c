/* files.c: datasets read from files: text files (lines) and fixed-size binary records, and
 * their plan codecs. A file source lists and checks its files when the dataset is made (so a
 * REPL user hears of a missing file at once), splits them, and reads its split in the task. */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "proto/plan.pb-c.h"
#include "rdd/ops.h"

/* The files, listed when the dataset was made, and one split (bytes [start, end) of one
 * file) per partition. */
typedef struct file_list {
  char **paths;
  uint64_t *sizes;
  size_t count, cap;
} file_list;

typedef struct file_split {
  uint32_t file;
  uint64_t start, end;
} file_split;

typedef struct file_state {
  file_list files;
  file_split *splits;
  size_t record_len; /* binary records; 0 for text */
} file_state;

/* ---- file listing ---------------------------------------------------------------------- */

static void file_list_free(file_list *l) {
  for (size_t i = 0; i < l->count; i++) common_free(l->paths[i]);
  common_free(l->paths);
  common_free(l->sizes);
  memset(l, 0, sizeof *l);
}

static fl_status file_list_add(file_list *l, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return FL_ERR(FL_ENOENT, "cannot read %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return FL_OK; /* folders inside folders and globs: skipped */
  if (access(path, R_OK) != 0)
    return FL_ERR(FL_EIO, "cannot read %s: %s", path, strerror(errno));
  if (l->count == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 8;
    char **paths = common_realloc(l->paths, cap * sizeof *paths);
    if (!paths) return FL_ERR(FL_ENOMEM, "out of memory listing files");
    l->paths = paths;
    uint64_t *sizes = common_realloc(l->sizes, cap * sizeof *sizes);
    if (!sizes) return FL_ERR(FL_ENOMEM, "out of memory listing files");
    l->sizes = sizes;
    l->cap = cap;
  }
  /* Kept absolute: in cluster mode executors open the files, from folders of their own
   * (a relative path is the client's, as Spark qualifies one with the driver's folder). */
  char cwd[PATH_MAX];
  bool relative = path[0] != '/';
  if (relative && !getcwd(cwd, sizeof cwd))
    return FL_ERR(FL_EIO, "cannot make %s absolute: this process's folder is unknown: %s", path, strerror(errno));
  size_t len = (relative ? strlen(cwd) + 1 : 0) + strlen(path) + 1;
  char *copy = common_malloc(len);
  if (!copy) return FL_ERR(FL_ENOMEM, "out of memory listing files");
  snprintf(copy, len, "%s%s%s", relative ? cwd : "", relative ? "/" : "", path);
  l->paths[l->count] = copy;
  l->sizes[l->count++] = (uint64_t)st.st_size;
  return FL_OK;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, the visible files of a folder (sorted), or the files matching a glob (sorted). */
static fl_status list_files(const char *path, file_list *out) {
  struct stat st;
  fl_status status = FL_OK;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return FL_ERR(FL_EIO, "cannot open folder %s: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.' || e->d_name[0] == '_') continue;
      if (n == cap) {
        cap = cap ? cap * 2 : 16;
        char **grown = common_realloc(names, cap * sizeof *names);
        if (!grown) {
          status = FL_ERR(FL_ENOMEM, "out of memory listing %s", path);
          break;
        }
        names = grown;
      }
      size_t len = strlen(path) + strlen(e->d_name) + 2;
      if (!(names[n] = common_malloc(len))) {
        status = FL_ERR(FL_ENOMEM, "out of memory listing %s", path);
        break;
      }
      snprintf(names[n++], len, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (status == FL_OK) qsort(names, n, sizeof *names, compare_names);
    for (size_t i = 0; i < n; i++) {
      if (status == FL_OK) status = file_list_add(out, names[i]);
      common_free(names[i]);
    }
    common_free(names);
    return status;
  }
  if (strpbrk(path, "*?[")) {
    glob_t g;
    int rc = glob(path, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) return FL_ERR(FL_ENOENT, "no files match %s", path);
    if (rc != 0) return FL_ERR(FL_EIO, "cannot expand %s", path);
    for (size_t i = 0; i < g.gl_pathc && status == FL_OK; i++)
      status = file_list_add(out, g.gl_pathv[i]);
    globfree(&g);
    return status;
  }
  return file_list_add(out, path);
}

static bool is_gzip_name(const char *path) {
  size_t n = strlen(path);
  return n > 3 && strcmp(path + n - 3, ".gz") == 0;
}

static void file_state_free(void *state) {
  file_state *st = state;
  if (!st) return;
  file_list_free(&st->files);
  common_free(st->splits);
  common_free(st);
}

static void file_state_destroy(rdd *r) { file_state_free(r->state); }

/* Builds the dataset once files and splits are known; takes `st` in every case. */
static fl_status file_dataset(fl_context *ctx, const rdd_ops *ops, file_state *st,
                              uint32_t num_splits, fl_dataset **out) {
  rdd *r;
  fl_status status = rdd_create(ctx, ops, num_splits, NULL, 0, NULL, ops->name, NULL, 0, &r);
  if (status != FL_OK) {
    file_state_free(st);
    return status;
  }
  r->state = st;
  *out = r;
  return FL_OK;
}

/* ---- text files ------------------------------------------------------------------------ */

#define READ_CHUNK (1u << 20)
#define MAX_LINE (256u << 20)

/*
 * A line belongs to the split in which it starts (as in Hadoop's LineRecordReader): a
 * split that does not start at 0 skips the line in progress, and the last line of a split
 * is read to its end even past the split.
 */
typedef struct line_iter {
  fl_iter base;
  const char *path;
  int fd;
  gzFile gz;
  uint64_t file_pos; /* file offset of buf[0] */
  uint64_t end;      /* lines starting at or after this offset belong to the next split */
  uint64_t line_no;  /* for messages: lines read so far in this split */
  /* Plain files: the offset of the split's first line, once open; the task's input is the
   * bytes of the lines it consumed (from here to where it stopped), so that the splits of a
   * file read whole add up to its size although each reads ahead past its end. */
  uint64_t first_line;
  bool opened;
  char *buf;
  size_t len, off, cap;
  bool eof;
} line_iter;

static fl_status line_fill(line_iter *it) {
  if (it->off > 0) {
    memmove(it->buf, it->buf + it->off, it->len - it->off);
    it->file_pos += it->off;
    it->len -= it->off;
    it->off = 0;
  }
  if (it->cap - it->len < READ_CHUNK / 2) {
    if (it->cap >= MAX_LINE)
      return FL_ERR(FL_ELIMIT, "%s: line %llu of the split is longer than %u bytes", it->path,
                    (unsigned long long)it->line_no + 1, MAX_LINE);
    size_t cap = it->cap ? it->cap * 2 : READ_CHUNK;
    char *buf = common_realloc(it->buf, cap);
    if (!buf) return FL_ERR(FL_ENOMEM, "%s: cannot allocate a %zu-byte line buffer", it->path, cap);
    it->buf = buf;
    it->cap = cap;
  }
  ssize_t n;
  if (it->gz) {
    int got = gzread(it->gz, it->buf + it->len, (unsigned)(it->cap - it->len));
    int err;
    const char *msg = gzerror(it->gz, &err);
    if (got < 0)
      return FL_ERR(FL_ECORRUPT, "%s: bad gzip data at byte %lld of the file: %s", it->path,
                    (long long)gzoffset(it->gz), err == Z_ERRNO ? strerror(errno) : msg);
    /* At a premature end of the file zlib returns what it inflated, then 0, and keeps
     * Z_BUF_ERROR ("unexpected end of file"); gzeof() is true then as at a proper end, so
     * only the error tells a cut file from a whole one. */
    if (got == 0 && err == Z_BUF_ERROR)
      return FL_ERR(FL_ECORRUPT,
                    "%s: truncated gzip data: the file ends at byte %lld, inside the compressed "
                    "stream (after %lld bytes of text)",
                    it->path, (long long)gzoffset(it->gz), (long long)gztell(it->gz));
    n = got;
  } else {
    do {
      n = pread(it->fd, it->buf + it->len, it->cap - it->len, (off_t)(it->file_pos + it->len));
    } while (n < 0 && errno == EINTR);
    if (n < 0) return FL_ERR(FL_EIO, "%s: read failed: %s", it->path, strerror(errno));
  }
  if (n == 0) it->eof = true;
  it->len += (size_t)n;
  return FL_OK;
}

/* Lines are views into the read buffer, and refilling it moves its bytes: so a batch ends
 * where the buffer needs a refill, unless it is still empty. */
static uint32_t line_next(fl_iter *base, fl_bytes *out, uint32_t max) {
  line_iter *it = (line_iter *)base;
  uint32_t n = 0;
  while (n < max) {
    if (it->file_pos + it->off >= it->end) break;
    char *start = it->buf + it->off;
    char *nl = it->len > it->off ? memchr(start, '\n', it->len - it->off) : NULL;
    if (nl || (it->eof && it->off < it->len)) {
      size_t len = nl ? (size_t)(nl - start) : it->len - it->off;
      it->off += len + (nl ? 1 : 0);
      if (len > 0 && start[len - 1] == '\r') len--;
      out[n].data = (const uint8_t *)start;
      out[n++].len = len;
      it->line_no++;
      continue;
    }
    if (it->eof || n > 0) break;
    fl_status s = line_fill(it);
    if (s != FL_OK) {
      rdd_task_fail(base->task, s);
      return 0;
    }
  }
  return n;
}

static void line_close(fl_iter *base) {
  line_iter *it = (line_iter *)base;
  if (it->gz) {
    z_off_t read = gzoffset(it->gz); /* compressed bytes consumed, as in the file */
    if (read > 0) base->task->input_bytes += (uint64_t)read;
  } else if (it->opened) {
    base->task->input_bytes += it->file_pos + it->off - it->first_line;
  }
  if (it->gz) gzclose(it->gz);
  if (it->fd >= 0) close(it->fd);
  common_free(it->buf);
}

/* zlib reads a file without the gzip magic as it is ("transparent" mode), so a file named
 * .gz that holds text, or nothing, would be read as lines: check the magic first. Reads with
 * pread, so that the descriptor stays at offset 0 for gzdopen. */
static fl_status gzip_check_magic(int fd, const char *path) {
  unsigned char magic[2] = {0, 0};
  ssize_t n;
  do {
    n = pread(fd, magic, sizeof magic, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return FL_ERR(FL_EIO, "%s: read failed: %s", path, strerror(errno));
  if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) return FL_OK;
  if (n == 0)
    return FL_ERR(FL_ECORRUPT, "%s: named .gz but not gzip data: the file is empty", path);
  if (n == 1)
    return FL_ERR(FL_ECORRUPT, "%s: named .gz but not gzip data: the file is 1 byte long", path);
  return FL_ERR(FL_ECORRUPT,
                "%s: named .gz but not gzip data: it starts with bytes %02x %02x, not 1f 8b "
                "(rename a plain text file so that it does not end in .gz)",
                path, magic[0], magic[1]);
}

static fl_status text_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  file_state *st = r->state;
  const file_split *sp = &st->splits[p];
  line_iter *it = rdd_iter_new(task, sizeof *it, line_next, line_close);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->path = st->files.paths[sp->file];
  it->fd = open(it->path, O_RDONLY | O_CLOEXEC);
  if (it->fd < 0)
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot open %s: %s", it->path, strerror(errno)));
  it->end = sp->end;
  if (is_gzip_name(it->path)) {
    fl_status s = gzip_check_magic(it->fd, it->path);
    if (s != FL_OK) return rdd_task_fail(task, s);
    it->gz = gzdopen(it->fd, "rb");
    if (!it->gz) return rdd_task_fail(task, FL_ERR(FL_ENOMEM, "%s: cannot start gzip reader", it->path));
    it->fd = -1; /* now owned by gz */
    it->end = UINT64_MAX;
  } else if (sp->start > 0) {
    /* Skip the line in progress: start one byte early so a split that begins exactly at a
     * line start keeps that line. */
    it->file_pos = sp->start - 1;
    for (;;) {
      fl_status s = line_fill(it);
      if (s != FL_OK) return rdd_task_fail(task, s);
      char *nl = memchr(it->buf + it->off, '\n', it->len - it->off);
      if (nl) {
        it->off = (size_t)(nl - it->buf) + 1;
        break;
      }
      if (it->eof) {
        it->off = it->len;
        break;
      }
      it->off = it->len;
    }
  }
  it->first_line = it->file_pos + it->off;
  it->opened = true;
  *out = &it->base;
  return FL_OK;
}

static const rdd_ops rdd_text_file_ops = {"text_file", text_open, file_state_destroy};

/* Largest split of a plain file: keeps tasks small enough to balance and to retry. */
#define MAX_SPLIT (32ull << 20)

fl_status fl_text_file(fl_context *ctx, const char *path, uint32_t min_partitions,
                       fl_dataset **out) {
  common_error_clear();
  if (!ctx || !path || !out) return FL_ERR(FL_EINVAL, "fl_text_file: NULL argument");
  fl_status status;
  file_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "fl_text_file: out of memory");
  FL_CHECK(list_files(path, &st->files));
  uint64_t total = 0;
  for (size_t i = 0; i < st->files.count; i++)
    if (!is_gzip_name(st->files.paths[i])) total += st->files.sizes[i];
  uint64_t goal = total / (min_partitions ? min_partitions : ctx->default_parallelism);
  uint64_t split = goal < 1 ? 1 : goal > MAX_SPLIT ? MAX_SPLIT : goal;
  size_t n = 0, cap = 0;
  for (size_t i = 0; i < st->files.count; i++) {
    uint64_t size = st->files.sizes[i];
    bool whole = is_gzip_name(st->files.paths[i]) || size == 0;
    uint64_t pieces = whole ? 1 : (size + split - 1) / split;
    if (n + pieces > UINT32_MAX) {
      status = FL_ERR(FL_ELIMIT, "fl_text_file: %s needs too many splits", path);
      goto cleanup;
    }
    if (n + pieces > cap) {
      cap = (n + pieces) * 2;
      file_split *grown = common_realloc(st->splits, cap * sizeof *grown);
      if (!grown) {
        status = FL_ERR(FL_ENOMEM, "fl_text_file: out of memory");
        goto cleanup;
      }
      st->splits = grown;
    }
    for (uint64_t k = 0; k < pieces; k++) {
      uint64_t lo = whole ? 0 : k * split, hi = whole ? size : (k + 1 == pieces ? size : lo + split);
      st->splits[n++] = (file_split){(uint32_t)i, lo, hi};
    }
  }
  return file_dataset(ctx, &rdd_text_file_ops, st, (uint32_t)n, out);
cleanup:
  file_state_free(st);
  return status;
}

/* ---- fixed-size binary records ---------------------------------------------------------- */

typedef struct binary_iter {
  fl_iter base;
  const char *path;
  int fd;
  size_t record_len;
  uint64_t pos, end; /* next file offset to read, split end */
  uint8_t *buf;
  size_t len, off, cap;
} binary_iter;

static uint32_t binary_next(fl_iter *base, fl_bytes *out, uint32_t max) {
  binary_iter *it = (binary_iter *)base;
  if (it->len - it->off < it->record_len) {
    if (it->pos >= it->end) return 0;
    uint64_t want = it->end - it->pos;
    if (want > it->cap) want = it->cap;
    ssize_t n;
    do n = pread(it->fd, it->buf, (size_t)want, (off_t)it->pos);
    while (n < 0 && errno == EINTR);
    if (n < 0 || (uint64_t)n < want) {
      rdd_task_fail(base->task,
                    n < 0 ? FL_ERR(FL_EIO, "%s: read failed: %s", it->path, strerror(errno))
                          : FL_ERR(FL_EIO, "%s: file shrank while being read (offset %llu)",
                                   it->path, (unsigned long long)(it->pos + (uint64_t)n)));
      return 0;
    }
    it->pos += want;
    base->task->input_bytes += want;
    it->len = (size_t)want;
    it->off = 0;
  }
  uint32_t n = 0;
  while (n < max && it->len - it->off >= it->record_len) {
    out[n].data = it->buf + it->off;
    out[n++].len = it->record_len;
    it->off += it->record_len;
  }
  return n;
}

static void binary_close(fl_iter *base) {
  binary_iter *it = (binary_iter *)base;
  if (it->fd >= 0) close(it->fd);
  common_free(it->buf);
}

static fl_status binary_open(rdd *r, uint32_t p, rdd_task *task, fl_iter **out) {
  file_state *st = r->state;
  const file_split *sp = &st->splits[p];
  binary_iter *it = rdd_iter_new(task, sizeof *it, binary_next, binary_close);
  if (!it) return rdd_task_fail(task, FL_ENOMEM);
  it->path = st->files.paths[sp->file];
  it->record_len = st->record_len;
  it->pos = sp->start;
  it->end = sp->end;
  it->cap = READ_CHUNK < st->record_len ? st->record_len : READ_CHUNK / st->record_len * st->record_len;
  it->fd = open(it->path, O_RDONLY | O_CLOEXEC);
  if (it->fd < 0)
    return rdd_task_fail(task, FL_ERR(FL_EIO, "cannot open %s: %s", it->path, strerror(errno)));
  if (!(it->buf = common_malloc(it->cap)))
    return rdd_task_fail(task, FL_ERR(FL_ENOMEM, "%s: cannot allocate a read buffer", it->path));
  *out = &it->base;
  return FL_OK;
}

static const rdd_ops rdd_binary_records_ops = {"binary_records", binary_open, file_state_destroy};

fl_status fl_binary_records(fl_context *ctx, const char *path, size_t record_len,
                            fl_dataset **out) {
  common_error_clear();
  if (!ctx || !path || !out) return FL_ERR(FL_EINVAL, "fl_binary_records: NULL argument");
  if (record_len == 0) return FL_ERR(FL_EINVAL, "fl_binary_records: record_len must be > 0");
  fl_status status;
  file_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "fl_binary_records: out of memory");
  st->record_len = record_len;
  FL_CHECK(list_files(path, &st->files));
  uint64_t total = 0;
  for (size_t i = 0; i < st->files.count; i++) {
    if (st->files.sizes[i] % record_len != 0) {
      status = FL_ERR(FL_EFORMAT,
                      "%s: size %llu is not a multiple of the record length %zu",
                      st->files.paths[i], (unsigned long long)st->files.sizes[i], record_len);
      goto cleanup;
    }
    total += st->files.sizes[i];
  }
  /* Splits of whole records, about default_parallelism of them in all. */
  uint64_t records_per_split = total / record_len / ctx->default_parallelism;
  if (records_per_split == 0) records_per_split = 1;
  if (records_per_split * record_len > MAX_SPLIT) records_per_split = MAX_SPLIT / record_len + 1;
  uint64_t split = records_per_split * record_len;
  size_t n = 0;
  for (size_t i = 0; i < st->files.count; i++)
    n += (size_t)((st->files.sizes[i] + split - 1) / split);
  st->splits = common_calloc(n ? n : 1, sizeof *st->splits);
  if (!st->splits) {
    status = FL_ERR(FL_ENOMEM, "fl_binary_records: out of memory");
    goto cleanup;
  }
  n = 0;
  for (size_t i = 0; i < st->files.count; i++)
    for (uint64_t lo = 0; lo < st->files.sizes[i]; lo += split) {
      uint64_t hi = lo + split < st->files.sizes[i] ? lo + split : st->files.sizes[i];
      st->splits[n++] = (file_split){(uint32_t)i, lo, hi};
    }
  return file_dataset(ctx, &rdd_binary_records_ops, st, (uint32_t)n, out);
cleanup:
  file_state_free(st);
  return status;
}

/* ---- plan codecs --------------------------------------------------------------------------- */

static fl_status files_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *m) {
  const file_state *st = r->state;
  Flint__PlanFiles *f = rdd_plan_enc_alloc(e, sizeof *f);
  if (!f) return rdd_plan_enc_nomem();
  flint__plan_files__init(f);
  f->n_paths = f->n_sizes = st->files.count;
  f->paths = st->files.paths;
  f->sizes = st->files.sizes;
  f->record_len = st->record_len;
  f->n_splits = r->num_partitions;
  if (!(f->splits = rdd_plan_enc_alloc(e, r->num_partitions * sizeof *f->splits))) return rdd_plan_enc_nomem();
  for (uint32_t i = 0; i < r->num_partitions; i++) {
    Flint__PlanSplit *sp = rdd_plan_enc_alloc(e, sizeof *sp);
    if (!sp) return rdd_plan_enc_nomem();
    flint__plan_split__init(sp);
    sp->file = st->splits[i].file;
    sp->start = st->splits[i].start;
    sp->end = st->splits[i].end;
    f->splits[i] = sp;
  }
  m->files = f;
  return FL_OK;
}

static fl_status files_decode(rdd_plan_dec *d, const Flint__PlanNode *m, bool binary, void **state) {
  const Flint__PlanFiles *f = m->files;
  if (!f) return rdd_plan_bad(d, "%s without files", m->op);
  if (f->n_paths != f->n_sizes) return rdd_plan_bad(d, "%zu paths but %zu sizes", f->n_paths, f->n_sizes);
  if (f->n_splits != m->num_partitions)
    return rdd_plan_bad(d, "%zu splits for %u partitions", f->n_splits, m->num_partitions);
  if (f->n_paths > UINT32_MAX) return rdd_plan_bad(d, "too many files");
  if (binary ? f->record_len == 0 || f->record_len > (1u << 30) : f->record_len != 0)
    return rdd_plan_bad(d, "record length %llu for %s", (unsigned long long)f->record_len, m->op);
  for (size_t i = 0; i < f->n_paths; i++)
    if (!f->paths[i][0] || strlen(f->paths[i]) >= 4096)
      return rdd_plan_bad(d, "file %zu has an empty or overlong path", i);
  for (size_t i = 0; i < f->n_splits; i++) {
    const Flint__PlanSplit *sp = f->splits[i];
    if (sp->file >= f->n_paths || sp->start > sp->end || sp->end > f->sizes[sp->file])
      return rdd_plan_bad(d, "split %zu (file %u, bytes %llu-%llu) is not within its file", i, sp->file,
                          (unsigned long long)sp->start, (unsigned long long)sp->end);
    if (binary && (sp->start % f->record_len || (sp->end - sp->start) % f->record_len))
      return rdd_plan_bad(d, "split %zu is not whole records of %llu bytes", i,
                          (unsigned long long)f->record_len);
  }
  file_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a file source");
  st->record_len = (size_t)f->record_len;
  size_t n = f->n_paths;
  st->files.paths = common_calloc(n ? n : 1, sizeof *st->files.paths);
  st->files.sizes = common_malloc((n ? n : 1) * sizeof *st->files.sizes);
  st->splits = common_malloc((f->n_splits ? f->n_splits : 1) * sizeof *st->splits);
  if (!st->files.paths || !st->files.sizes || !st->splits) goto nomem;
  st->files.cap = n;
  for (size_t i = 0; i < n; i++) {
    if (!(st->files.paths[i] = common_strdup(f->paths[i]))) goto nomem;
    st->files.count = i + 1;
    st->files.sizes[i] = f->sizes[i];
  }
  for (size_t i = 0; i < f->n_splits; i++)
    st->splits[i] = (file_split){f->splits[i]->file, f->splits[i]->start, f->splits[i]->end};
  *state = st;
  return FL_OK;
nomem:
  file_state_free(st);
  return FL_ERR(FL_ENOMEM, "cannot decode a file source");
}

static fl_status text_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                             void **state) {
  return files_decode(d, m, false, state);
}

static fl_status binary_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                               void **state) {
  return files_decode(d, m, true, state);
}

const rdd_op_codec rdd_file_codecs[] = {
    {&rdd_text_file_ops, RDD_SHAPE_SOURCE, RDD_PLAN_FILES, NULL, files_encode, text_decode, file_state_free, NULL},
    {&rdd_binary_records_ops, RDD_SHAPE_SOURCE, RDD_PLAN_FILES, NULL, files_encode, binary_decode,
     file_state_free, NULL},
    {NULL},
};
