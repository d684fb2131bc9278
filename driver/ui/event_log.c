/*
 * event_log.c: the event log (docs/ui.md): one file of JSON lines per application,
 * DIR/<application id>.jsonl, each line written with one write(2) as its event is applied, so
 * that a driver killed at any moment leaves every event before the last whole; and its replay
 * for the history server, which skips a truncated last line with a warning.
 *
 * A file that cannot be written is logged once and dropped: the application runs on without
 * its log. UI thread only (the writer); the replay runs on its caller's thread.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "driver/ui/ui_internal.h"

typedef struct log_file {
  char app[96];
  int fd;
  struct log_file *next;
} log_file;

struct event_log {
  char dir[PATH_MAX];
  log_file *files;
};

fl_status event_log_open(const char *dir, event_log **out) {
  *out = NULL;
  if (strlen(dir) >= PATH_MAX - 128) return FL_ERR(FL_EINVAL, "FLINT_EVENT_LOG_DIR '%s' is too long", dir);
  fl_status st = common_mkdirs(dir);
  if (st != FL_OK) return st;
  event_log *l = common_calloc(1, sizeof *l);
  if (!l) return FL_ERR(FL_ENOMEM, "out of memory");
  snprintf(l->dir, sizeof l->dir, "%s", dir);
  *out = l;
  return FL_OK;
}

static void file_close(log_file *f) {
  if (f->fd >= 0) close(f->fd);
  common_free(f);
}

void event_log_close(event_log *l) {
  if (!l) return;
  while (l->files) {
    log_file *f = l->files;
    l->files = f->next;
    file_close(f);
  }
  common_free(l);
}

static log_file *file_of(event_log *l, const char *app) {
  for (log_file *f = l->files; f; f = f->next)
    if (strcmp(f->app, app) == 0) return f;
  return NULL;
}

/* Writes the line (with its '\n') to f; on failure logs and forgets the file. */
static void write_line(event_log *l, log_file *f, const char *line, size_t len) {
  char *buf = common_malloc(len + 1);
  fl_status st = buf ? FL_OK : FL_ERR(FL_ENOMEM, "out of memory");
  if (buf) {
    memcpy(buf, line, len);
    buf[len] = '\n';
    st = common_write_all(f->fd, buf, len + 1, "the event log");
    common_free(buf);
  }
  if (st == FL_OK) return;
  common_log(LOG_WARN, "event log of %s: %s; it stops here", f->app, fl_last_error());
  for (log_file **p = &l->files; *p; p = &(*p)->next)
    if (*p == f) {
      *p = f->next;
      break;
    }
  file_close(f);
}

void event_log_write(event_log *l, const char *app, const char *kind, const char *line, size_t len) {
  if (!app) { /* the driver's: every open application's */
    for (log_file *f = l->files, *next; f; f = next) {
      next = f->next;
      write_line(l, f, line, len);
    }
    return;
  }
  log_file *f = file_of(l, app);
  if (!f && strcmp(kind, "ApplicationStart") == 0) {
    f = common_calloc(1, sizeof *f);
    if (!f) return;
    snprintf(f->app, sizeof f->app, "%s", app);
    char path[PATH_MAX + 128];
    snprintf(path, sizeof path, "%s/%s.jsonl", l->dir, app);
    f->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f->fd < 0) {
      common_log(LOG_WARN, "cannot open the event log %s: %s; %s has none", path, strerror(errno), app);
      common_free(f);
      return;
    }
    f->next = l->files;
    l->files = f;
  }
  if (!f) return;
  write_line(l, f, line, len);
  if (strcmp(kind, "ApplicationEnd") == 0) {
    for (log_file **p = &l->files; *p; p = &(*p)->next)
      if (*p == f) {
        *p = f->next;
        break;
      }
    file_close(f);
  }
}

fl_status event_log_replay(const char *path, void (*apply)(void *arg, json_t *event), void *arg) {
  fl_buf text = FL_BUF_INIT;
  fl_status st = common_read_file(path, &text);
  if (st != FL_OK) return st;
  size_t pos = 0, line_no = 0, bad = 0;
  while (pos < text.len) {
    const char *start = (const char *)text.data + pos;
    const char *nl = memchr(start, '\n', text.len - pos);
    size_t len = nl ? (size_t)(nl - start) : text.len - pos;
    pos += len + (nl != NULL);
    line_no++;
    if (len == 0) continue;
    json_error_t err;
    json_t *ev = json_loadb(start, len, 0, &err);
    if (!json_is_object(ev) || !json_is_string(json_object_get(ev, "Event"))) {
      if (!nl) common_log(LOG_WARN, "%s: line %zu is truncated (the driver stopped mid-line): skipped", path, line_no);
      else bad++;
      json_decref(ev);
      continue;
    }
    apply(arg, ev);
    json_decref(ev);
  }
  if (bad) common_log(LOG_WARN, "%s: %zu malformed lines skipped", path, bad);
  fl_buf_free(&text);
  return FL_OK;
}

fl_status event_log_replay_dir(const char *dir, void (*apply)(void *arg, json_t *event), void *arg,
                               uint32_t *files) {
  *files = 0;
  /* In name order: an application's id carries its driver's start time. */
  struct dirent **names = NULL;
  int n = scandir(dir, &names, NULL, alphasort);
  if (n < 0) return FL_ERR(FL_EIO, "cannot read the event log folder %s: %s", dir, strerror(errno));
  fl_status st = FL_OK;
  for (int i = 0; i < n; i++) {
    const char *name = names[i]->d_name;
    size_t len = strlen(name);
    if (len > 6 && strcmp(name + len - 6, ".jsonl") == 0 && st == FL_OK) {
      char path[2 * PATH_MAX];
      snprintf(path, sizeof path, "%s/%s", dir, name);
      fl_status one = event_log_replay(path, apply, arg);
      if (one == FL_OK) (*files)++;
      else common_log(LOG_WARN, "event log %s skipped: %s", path, fl_last_error());
    }
    free(names[i]);
  }
  free(names);
  return st;
}
