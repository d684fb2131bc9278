/*
 * libraries.c: applications' libraries (the shared objects that hold their functions). A
 * client asks whether the driver has a library (by content id) and uploads it when not; the
 * driver keeps each once in its work folder and serves it to executors from its block server
 * (DP_LIBRARY). The names clients give libraries only make messages readable (the function
 * that killed an executor, say).
 *
 * Threading: any handler thread; library names are under d->lock, an application's list
 * under app->lock. Files are written under a temporary name and renamed into place.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver/driver_internal.h"

/* A library's file name as its client gave it, by content id: for messages. */
typedef struct library_name {
  char id[40];
  char name[128];
  struct library_name *next;
} library_name;

/* Library ids are 32 lowercase hex digits (client/plan_send.c's content ids). */
static bool library_id_valid(const char *id) {
  if (!id || strlen(id) != 32) return false;
  for (const char *p = id; *p; p++)
    if (!strchr("0123456789abcdef", *p)) return false;
  return true;
}

static void library_path(driver_state *d, const char *id, char *path, size_t len) {
  snprintf(path, len, "%s/lib/%s.so", d->work_dir, id);
}

static fl_status app_add_library(driver_app *app, const char *id) {
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  bool have = false;
  for (size_t i = 0; i < app->num_libraries; i++) have |= strcmp(app->libraries[i], id) == 0;
  if (!have) {
    char **grown = common_realloc(app->libraries, (app->num_libraries + 1) * sizeof *grown);
    char *copy = common_strdup(id);
    if (grown) app->libraries = grown;
    if (!grown || !copy) {
      common_free(copy);
      st = FL_ERR(FL_ENOMEM, "out of memory");
    } else {
      app->libraries[app->num_libraries++] = copy;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return st;
}

/* Records the file name that a client gives library `id` (its last path element). */
static void library_name_note(driver_state *d, const char *id, const char *name) {
  if (!name || !*name) return;
  const char *slash = strrchr(name, '/');
  if (slash) name = slash + 1;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  library_name *n = d->library_names;
  while (n && strcmp(n->id, id) != 0) n = n->next;
  if (!n && (n = common_calloc(1, sizeof *n))) {
    snprintf(n->id, sizeof n->id, "%s", id);
    n->next = d->library_names;
    d->library_names = n;
  }
  if (n) snprintf(n->name, sizeof n->name, "%s", name);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* The name of the library an executor stores as `file` (content id + ".so"), into buf; the
 * file itself when the driver knows no name. */
void libraries_name_of(driver_state *d, const char *file, char *buf, size_t len) {
  snprintf(buf, len, "%s", file);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (library_name *n = d->library_names; n; n = n->next)
    if (strncmp(file, n->id, strlen(n->id)) == 0 && strcmp(file + strlen(n->id), ".so") == 0)
      snprintf(buf, len, "%s", n->name);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

fl_status libraries_handle_has(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__HasLibraryRequest, req, body, "HasLibrary");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK && !library_id_valid(req->id)) st = FL_ERR(FL_EPROTO, "HasLibrary: malformed library id");
  if (st == FL_OK) library_name_note(d, req->id, req->name);
  if (st == FL_OK) {
    char path[PATH_MAX + 64];
    library_path(d, req->id, path, sizeof path);
    Flint__HasLibraryReply reply = FLINT__HAS_LIBRARY_REPLY__INIT;
    reply.present = access(path, R_OK) == 0;
    if (reply.present) st = app_add_library(app, req->id);
    if (st == FL_OK) st = proto_pack(&reply.base, response);
  }
  apps_unpin(d, app);
  flint__has_library_request__free_unpacked(req, NULL);
  return st;
}

fl_status libraries_handle_upload(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__UploadLibraryRequest, req, body, "UploadLibrary");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK && !library_id_valid(req->id)) st = FL_ERR(FL_EPROTO, "UploadLibrary: malformed library id");
  if (st == FL_OK) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    library_path(d, req->id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)gettid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, req->content.data, req->content.len) == (ssize_t)req->content.len;
    if (fd >= 0) close(fd);
    if (!ok || rename(tmp, path) != 0) {
      unlink(tmp);
      st = FL_ERR(FL_EIO, "cannot store library %s: %s", req->name, strerror(errno));
    } else {
      st = app_add_library(app, req->id);
      library_name_note(d, req->id, req->name);
    }
  }
  apps_unpin(d, app);
  if (st == FL_OK) st = driver_empty_reply(response);
  flint__upload_library_request__free_unpacked(req, NULL);
  return st;
}

/* The block server: libraries, by content id. */
fl_status libraries_serve(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                          uint64_t *total) {
  driver_state *d = arg;
  if (req->kind == DP_LIBRARY) {
    char id[40], path[PATH_MAX + 64];
    snprintf(id, sizeof id, "%016llx%016llx", (unsigned long long)req->key[0], (unsigned long long)req->key[1]);
    library_path(d, id, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FL_ERR(FL_ENOENT, "no library %s on the driver", id);
    struct stat stbuf;
    fstat(fd, &stbuf);
    *total = (uint64_t)stbuf.st_size;
    uint64_t want = req->offset >= *total ? 0 : *total - req->offset;
    if (req->len && req->len < want) want = req->len;
    fl_status st = fl_buf_reserve(out, want);
    if (st == FL_OK && want && pread(fd, out->data + out->len, want, (off_t)req->offset) != (ssize_t)want)
      st = FL_ERR(FL_EIO, "cannot read library %s", id);
    if (st == FL_OK) out->len += want;
    close(fd);
    return st;
  }
  return FL_ERR(FL_ENOENT, "the driver serves libraries only");
}

void libraries_free_names(driver_state *d) {
  while (d->library_names) {
    library_name *next = d->library_names->next;
    common_free(d->library_names);
    d->library_names = next;
  }
}
