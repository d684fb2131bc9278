/*
 * config_table.c: the settings table (config.h), what it says of each setting, and a
 * setting's raw text (--conf, the environment, flint-defaults.conf): what the log, which
 * config.c warns through, reads its level with. The one place that reads the environment.
 *
 * Threads: any; the table is constant. The file is read once (pthread_once) into `file`,
 * which nothing changes afterwards but the tests' config_file_use; --conf's values are set
 * before threads start (config.h).
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <strings.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"

static const config_setting settings[CONFIG_SETTINGS] = {
#define CONFIG_ROW_(name, type, readers, flags, min, max, def, doc)                                             \
  {"FLINT_" #name, CONFIG_TYPE_##type, CONFIG_READ_##readers, (flags), (min), (max), (def), (doc)},
    CONFIG_TABLE(CONFIG_ROW_)
#undef CONFIG_ROW_
};

/* ---- the table ------------------------------------------------------------------------- */

const config_setting *config_setting_of(config_id id) {
  FL_ASSERT((unsigned)id < CONFIG_SETTINGS);
  return &settings[id];
}

bool config_find(const char *name, config_id *out) {
  for (unsigned i = 0; name && i < CONFIG_SETTINGS; i++)
    if (strcmp(settings[i].name, name) == 0) {
      *out = (config_id)i;
      return true;
    }
  return false;
}

const char *config_type_name(config_type type) {
  static const char *const names[] = {"bool", "count", "ms", "us", "size", "memory", "real", "string", "path"};
  return (unsigned)type < sizeof names / sizeof *names ? names[type] : "?";
}

const char *config_unit(config_type type) {
  switch (type) {
  case CONFIG_TYPE_MS: return "ms";
  case CONFIG_TYPE_US: return "us";
  case CONFIG_TYPE_SIZE: return "bytes";
  case CONFIG_TYPE_MEMORY: return "MiB";
  default: return "";
  }
}

const char *config_readers_text(config_readers readers) {
  switch (readers) {
  case CONFIG_READ_ANY: return "any";
  case CONFIG_READ_CLIENT: return "client";
  case CONFIG_READ_DRIVER: return "driver";
  case CONFIG_READ_EXECUTOR: return "executor";
  case CONFIG_READ_SERVERS: return "driver, executor";
  case CONFIG_READ_TASKS: return "client, executor";
  }
  return "?";
}

bool config_find_key(const char *key, config_id *out) {
  char name[96];
  size_t len = strlen(key);
  bool has_prefix = len > 6 && strncasecmp(key, "FLINT_", 6) == 0;
  if (len + 7 > sizeof name || len == 0) return false;
  int n = snprintf(name, sizeof name, "%s%s", has_prefix ? "" : "FLINT_", key);
  for (int i = 0; i < n; i++) name[i] = (char)toupper((unsigned char)name[i]);
  return config_find(name, out);
}

/* ---- flint-defaults.conf and --conf ----------------------------------------------------- */

#define CONFIG_FILE_NAME "flint-defaults.conf"

static pthread_once_t file_once = PTHREAD_ONCE_INIT;
static struct {
  fl_status status;
  char error[PATH_MAX + 256]; /* "FILE:LINE: cause" */
  char *path;                 /* the file in use; NULL: none */
  char *text[CONFIG_SETTINGS];
  unsigned line[CONFIG_SETTINGS];
} file;
static atomic_bool file_error_logged;
static char *command_line[CONFIG_SETTINGS];

static void file_clear(void) {
  free(file.path);
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) free(file.text[i]);
  memset(&file, 0, sizeof file);
}

static char *trim(char *p) {
  while (isspace((unsigned char)*p)) p++;
  size_t n = strlen(p);
  while (n && isspace((unsigned char)p[n - 1])) p[--n] = '\0';
  return p;
}

/* Why `key` cannot be set by a file or --conf, as a format for the key; NULL when it can. */
static const char *refused(const char *key, config_id *id) {
  if (!config_find_key(key, id)) return "unknown setting '%s' ('flint config' lists them)";
  if (settings[*id].flags & CONFIG_INTERNAL) return "'%s' is internal: flint sets it for the processes it starts";
  return NULL;
}

/* An invalid file is not used at all: its values go, with its path. */
static fl_status file_invalid(void) {
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    free(file.text[i]);
    file.text[i] = NULL;
    file.line[i] = 0;
  }
  free(file.path);
  file.path = NULL;
  return file.status = FL_EINVAL;
}

__attribute__((format(printf, 3, 4))) static fl_status file_fail(const char *path, unsigned line, const char *fmt,
                                                                 ...) {
  snprintf(file.error, sizeof file.error, "%s:%u: ", path, line);
  size_t n = strlen(file.error);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(file.error + n, sizeof file.error - n, fmt, ap);
  va_end(ap);
  return file_invalid();
}

/* Reads `path` into `file` (config.h gives the syntax); a missing file is no file. */
static fl_status file_read(const char *path) {
  file_clear();
  FILE *f = fopen(path, "r");
  if (!f && errno == ENOENT) return FL_OK;
  if (!f) { /* there, but not for us: not silently skipped */
    snprintf(file.error, sizeof file.error, "%s: cannot be read: %s", path, strerror(errno));
    return file.status = FL_EINVAL;
  }
  file.path = strdup(path);
  char *buf = NULL;
  size_t cap = 0;
  unsigned line = 0;
  fl_status st = FL_OK;
  while (st == FL_OK && getline(&buf, &cap, f) >= 0) {
    line++;
    char *p = trim(buf);
    if (!*p || *p == '#') continue;
    size_t klen = strcspn(p, "= \t");
    char sep = p[klen], *rest = p + klen;
    if (sep) *rest++ = '\0';
    rest = trim(rest);
    if (sep != '=' && *rest == '=') rest = trim(rest + 1); /* "KEY = VALUE" */
    config_id id;
    const char *why = klen ? refused(p, &id) : NULL;
    if (!klen) st = file_fail(path, line, "a line must be KEY VALUE or KEY=VALUE");
    else if (why) st = file_fail(path, line, why, p);
    else if (id == CONFIG_CONF_DIR) st = file_fail(path, line, "FLINT_CONF_DIR cannot be set in the file it finds");
    else if (!*rest) st = file_fail(path, line, "%s has no value (KEY VALUE or KEY=VALUE)", settings[id].name);
    else {
      free(file.text[id]);
      file.text[id] = strdup(rest);
      file.line[id] = line;
    }
  }
  if (st == FL_OK && ferror(f)) { /* a folder, say */
    snprintf(file.error, sizeof file.error, "%s: cannot be read: %s", path, strerror(errno));
    st = file_invalid();
  }
  free(buf);
  fclose(f);
  return st;
}

static void file_find(void) {
  char path[PATH_MAX];
  const char *dir = config_text(CONFIG_CONF_DIR); /* which does not read the file */
  if (dir && *dir) {
    snprintf(path, sizeof path, "%s/" CONFIG_FILE_NAME, dir);
    file_read(path);
    return;
  }
  const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
  if (xdg && *xdg) snprintf(path, sizeof path, "%s/flint/" CONFIG_FILE_NAME, xdg);
  else if (home && *home) snprintf(path, sizeof path, "%s/.config/flint/" CONFIG_FILE_NAME, home);
  else path[0] = '\0';
  if (path[0] && access(path, F_OK) == 0) {
    file_read(path);
    return;
  }
  file_read("/etc/flint-dataflow/" CONFIG_FILE_NAME);
}

fl_status config_file_status(void) {
  pthread_once(&file_once, file_find);
  atomic_store(&file_error_logged, true); /* the caller reports it */
  if (file.status != FL_OK) return fl_set_error(file.status, "%s", file.error);
  return FL_OK;
}

const char *config_file_path(void) {
  pthread_once(&file_once, file_find);
  return file.path;
}

unsigned config_file_line(config_id id) {
  pthread_once(&file_once, file_find);
  return file.line[id];
}

fl_status config_file_use(const char *path) {
  pthread_once(&file_once, file_find);
  file_clear();
  atomic_store(&file_error_logged, false);
  if (path) file_read(path);
  return config_file_status();
}

fl_status config_set_command_line(const char *assignment) {
  const char *eq = strchr(assignment, '=');
  if (!eq) return fl_set_error(FL_EINVAL, "'%s' is not KEY=VALUE", assignment);
  char key[96];
  if ((size_t)(eq - assignment) >= sizeof key) return fl_set_error(FL_EINVAL, "unknown setting '%s'", assignment);
  memcpy(key, assignment, (size_t)(eq - assignment));
  key[eq - assignment] = '\0';
  config_id id;
  const char *why = refused(key, &id);
  if (why) return fl_set_error(FL_EINVAL, why, key);
  char *value = strdup(eq + 1);
  if (!value || setenv(settings[id].name, value, 1) != 0) {
    free(value);
    return fl_set_error(FL_ENOMEM, "cannot set %s", settings[id].name);
  }
  free(command_line[id]);
  command_line[id] = value;
  return FL_OK;
}

/* ---- the raw text ---------------------------------------------------------------------- */

const char *config_text_from(config_id id, config_source *from) {
  const config_setting *s = config_setting_of(id);
  config_source where = CONFIG_FROM_COMMAND_LINE;
  const char *text = command_line[id];
  if (!text || !*text) where = CONFIG_FROM_ENVIRONMENT, text = getenv(s->name);
  if ((!text || !*text) && id != CONFIG_CONF_DIR) {
    pthread_once(&file_once, file_find);
    /* A library user has no flint command to refuse the file: the log says so, once (after
     * the load, as the log reads its level here). */
    if (file.status != FL_OK && !atomic_exchange(&file_error_logged, true))
      common_log(LOG_ERROR, "%s (the file is ignored)", file.error);
    where = CONFIG_FROM_FILE, text = file.text[id];
  }
  if (!text || !*text) where = CONFIG_FROM_DEFAULT, text = NULL;
  if (from) *from = where;
  return text;
}

const char *config_text(config_id id) { return config_text_from(id, NULL); }
