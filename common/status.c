/* status.c: the error table and the thread-local message of the last failure. */
#include <stdarg.h>
#include <string.h>

#include "common/common.h"

#define ERROR_MESSAGE_MAX 1024

static _Thread_local char last_error[ERROR_MESSAGE_MAX];

const char *fl_strerror(fl_status status) {
  switch (status) {
#define STATUS_TEXT_(name, value, text)                                                      \
  case FL_##name:                                                                            \
    return text;
    FL_STATUS_TABLE(STATUS_TEXT_)
#undef STATUS_TEXT_
  }
  return "unknown status";
}

const char *fl_status_name(fl_status status) {
  switch (status) {
#define STATUS_NAME_(name, value, text)                                                      \
  case FL_##name:                                                                            \
    return "FL_" #name;
    FL_STATUS_TABLE(STATUS_NAME_)
#undef STATUS_NAME_
  }
  return "FL_UNKNOWN";
}

const char *fl_last_error(void) { return last_error; }

void common_error_clear(void) { last_error[0] = '\0'; }

fl_status fl_set_error(fl_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

fl_status common_error_at(const char *file, int line, fl_status status, const char *fmt, ...) {
  /* Keep the path from the project root: "rdd/source.c", not the build machine's path. */
  const char *short_file = file;
  for (const char *p = file; *p; p++) {
    if (p[0] == '/' && (strncmp(p + 1, "common/", 7) == 0 || strncmp(p + 1, "rdd/", 4) == 0 ||
                        strncmp(p + 1, "driver/", 7) == 0 ||
                        strncmp(p + 1, "executor/", 9) == 0 || strncmp(p + 1, "cli/", 4) == 0 ||
                        strncmp(p + 1, "net/", 4) == 0))
      short_file = p + 1;
  }
  int n = 0;
  if (status == FL_ENOMEM || status == FL_EINTERNAL) {
    n = snprintf(last_error, sizeof last_error, "%s:%d: ", short_file, line);
    if (n < 0 || (size_t)n >= sizeof last_error) n = 0;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
  va_end(ap);
  return status;
}

fl_status common_error_wrap(fl_status status, const char *fmt, ...) {
  char inner[ERROR_MESSAGE_MAX];
  snprintf(inner, sizeof inner, "%s", last_error[0] ? last_error : fl_strerror(status));
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof last_error)
    snprintf(last_error + n, sizeof last_error - (size_t)n, "%s", inner);
  return status;
}

void common_assert_failed(const char *file, int line, const char *what) {
  fprintf(stderr, "flint: %s:%d: internal invariant broken: %s\n", file, line, what);
  abort();
}
