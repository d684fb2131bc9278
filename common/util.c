/* util.c: buffers, pairs, limits from the environment, sizes, symbols, files, logging and
 * the trace. */

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"

/* ---- buffers and pairs ----------------------------------------------------------------- */

fl_status fl_buf_reserve(fl_buf *buf, size_t extra) {
  if (!buf) return fl_set_error(FL_EINVAL, "fl_buf_reserve: buf is NULL");
  if (buf->cap - buf->len >= extra) return FL_OK;
  if (extra > SIZE_MAX / 2 - buf->len)
    return fl_set_error(FL_ELIMIT, "buffer of %zu bytes cannot grow by %zu", buf->len, extra);
  size_t cap = buf->cap ? buf->cap : 64;
  while (cap < buf->len + extra) cap *= 2;
  uint8_t *data = common_realloc(buf->data, cap);
  if (!data) return fl_set_error(FL_ENOMEM, "buffer: cannot allocate %zu bytes", cap);
  buf->data = data;
  buf->cap = cap;
  return FL_OK;
}

void fl_buf_free(fl_buf *buf) {
  if (!buf) return;
  common_free(buf->data);
  buf->data = NULL;
  buf->len = buf->cap = 0;
}

fl_status fl_buf_put_pair(fl_buf *buf, fl_bytes key, fl_bytes value) {
  if (!buf) return fl_set_error(FL_EINVAL, "fl_buf_put_pair: buf is NULL");
  uint8_t head[COMMON_VARINT_MAX];
  size_t n = common_varint_put(head, key.len);
  fl_status s = fl_buf_reserve(buf, n + key.len + value.len);
  if (s != FL_OK) return s;
  fl_buf_append(buf, head, n);
  fl_buf_append(buf, key.data, key.len);
  fl_buf_append(buf, value.data, value.len);
  return FL_OK;
}

fl_status fl_pair(fl_bytes rec, fl_bytes *key, fl_bytes *value) {
  if (!key || !value) return fl_set_error(FL_EINVAL, "fl_pair: key and value must not be NULL");
  uint64_t klen;
  size_t n = common_varint_get(rec.data, rec.data + rec.len, &klen);
  if (n == 0 || klen > rec.len - n)
    return fl_set_error(FL_EFORMAT, "record of %zu bytes is not a pair (bad key length)",
                        rec.len);
  key->data = rec.data + n;
  key->len = klen;
  value->data = rec.data + n + klen;
  value->len = rec.len - n - klen;
  return FL_OK;
}

/* ---- machine, sizes, symbols, files ---------------------------------------------------- */

uint32_t common_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (uint32_t)n;
}

fl_status fl_parse_size(const char *text, uint64_t *out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_parse_size: out is NULL");
  if (!common_parse_size(text, out))
    return fl_set_error(FL_EINVAL, "'%s' is not a size (examples: 512m, 2g, 1048576)",
                        text ? text : "(null)");
  return FL_OK;
}

const char *common_symbol_name(const void *fn, char *buf, size_t len) {
  Dl_info info;
  /* dladdr needs a data pointer; a function pointer converts through uintptr_t. */
  void *addr = (void *)(uintptr_t)fn;
  bool found = dladdr(addr, &info) != 0;
  if (found && info.dli_sname && info.dli_saddr == addr) {
    snprintf(buf, len, "%s", info.dli_sname);
  } else if (found && info.dli_fname && info.dli_fbase) {
    /* A static or hidden function has no dynamic symbol: name its library and offset,
     * which addr2line turns into a source line, and say how to get the name. */
    const char *base = strrchr(info.dli_fname, '/');
    snprintf(buf, len, "%s+0x%lx (not exported; make it non-static with default visibility to see its name)",
             base ? base + 1 : info.dli_fname, (unsigned long)((uintptr_t)addr - (uintptr_t)info.dli_fbase));
  } else {
    snprintf(buf, len, "%p", addr);
  }
  return buf;
}

fl_status common_mkdirs(const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
    return FL_ERR(FL_EINVAL, "path too long: %s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return FL_ERR(FL_EIO, "cannot create folder %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return FL_ERR(FL_EIO, "cannot create folder %s: %s", tmp, strerror(errno));
  return FL_OK;
}

void common_remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char child[4096];
      snprintf(child, sizeof child, "%s/%s", path, e->d_name);
      struct stat st;
      if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))
        common_remove_tree(child);
      else
        unlink(child);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

/* ---- trace (see common.h) -------------------------------------------------------------- */

static atomic_int trace_fd = -2; /* -2: FLINT_TRACE not looked at yet; -1: off */

bool common_trace_on(void) {
  int fd = atomic_load_explicit(&trace_fd, memory_order_relaxed);
  if (fd == -2) {
    const char *path = config_string(CONFIG_TRACE);
    int opened = path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    int err = errno, expected = -2;
    if (atomic_compare_exchange_strong(&trace_fd, &expected, opened)) { /* the first look decides */
      if (path && opened < 0)
        fprintf(stderr, "flint: FLINT_TRACE=%s cannot be opened (%s): no trace\n", path, strerror(err));
    } else if (opened >= 0) {
      close(opened);
    }
    fd = atomic_load(&trace_fd);
  }
  return fd >= 0;
}

void common_trace_partition(const char *event, uint32_t partition) {
  if (!common_trace_on()) return;
  char part[16];
  snprintf(part, sizeof part, "%u", partition);
  common_trace(event, part);
}

void common_trace(const char *event, const char *detail) {
  int fd = atomic_load_explicit(&trace_fd, memory_order_relaxed);
  if (fd < 0) return;
  char thread[16] = "?", role[64], line[256];
  pthread_getname_np(pthread_self(), thread, sizeof thread);
  snprintf(role, sizeof role, "%s", common_log_role());
  for (char *c = role; *c; c++) /* "executor 3" -> "executor-3": one field */
    if (*c == ' ') *c = '-';
  int n = snprintf(line, sizeof line, "%llu %d %s %s %s %s\n", (unsigned long long)(common_now_ns() / 1000),
                   (int)getpid(), role, thread, event, detail && *detail ? detail : "-");
  if (n > (int)sizeof line - 1) { /* a cut line still ends the record */
    n = (int)sizeof line - 1;
    line[n - 1] = '\n';
  }
  ssize_t w = n > 0 ? write(fd, line, (size_t)n) : 0;
  (void)w; /* a full disk ends the trace, not the process */
}

void common_advise_huge(void *p, size_t len) {
#ifdef MADV_HUGEPAGE
  const uintptr_t huge = 2u << 20;
  uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + len) & ~(huge - 1);
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* a hint: failure changes nothing */
#else
  (void)p;
  (void)len;
#endif
}

fl_status common_write_all(int fd, const void *data, size_t len, const char *what) {
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return FL_ERR(FL_EIO, "cannot write %s: %s", what, n < 0 ? strerror(errno) : "no progress");
    p += n;
    len -= (size_t)n;
  }
  return FL_OK;
}

fl_status common_buf_vprintf(fl_buf *b, const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  fl_status st = n < 0 ? FL_ERR(FL_EFORMAT, "cannot format '%s'", fmt) : fl_buf_reserve(b, (size_t)n + 1);
  if (st == FL_OK) {
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, again);
    b->len += (size_t)n;
  }
  va_end(again);
  return st;
}

fl_status common_buf_printf(fl_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fl_status st = common_buf_vprintf(b, fmt, ap);
  va_end(ap);
  return st;
}

fl_status common_read_file(const char *path, fl_buf *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return FL_ERR(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  fl_status s = FL_OK;
  if (fstat(fd, &st) != 0) {
    s = FL_ERR(FL_EIO, "cannot stat %s: %s", path, strerror(errno));
  } else if ((s = fl_buf_reserve(out, (size_t)st.st_size)) == FL_OK) {
    while (out->len < (size_t)st.st_size) {
      ssize_t n = read(fd, out->data + out->len, (size_t)st.st_size - out->len);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s = FL_ERR(FL_EIO, "cannot read %s: %s", path, n < 0 ? strerror(errno) : "file shrank");
        break;
      }
      out->len += (size_t)n;
    }
  }
  close(fd);
  return s;
}
