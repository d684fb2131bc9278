/*
 * error.c: the error helpers of common.h (FL_ERR, common_error_wrap, common_error_clear) and
 * the report of a broken invariant.
 *
 * They keep no state: the thread's message lives in libflint (status.c) and is reached only
 * through the public fl_set_error and fl_last_error, so that this file can be linked into
 * flint's add-on libraries too (libflint_gpu): a message set there is the one
 * fl_last_error() returns, as there is one copy of the message per process.
 */
#include <string.h>

#include "common/common.h"

#define ERROR_MESSAGE_MAX 1024 /* as status.c's */

fl_status common_error_at(const char *file, int line, fl_status status, const char *fmt, ...) {
  /* Keep the path from the project root: "rdd/source.c", not the build machine's path. */
  static const char *const folders[] = {"common/", "net/", "proto/", "rdd/", "shuffle/", "executor/",
                                        "driver/", "client/", "cli/", "ml/", "gpu/"};
  const char *short_file = file;
  for (const char *p = file; *p; p++)
    for (size_t i = 0; p[0] == '/' && i < sizeof folders / sizeof *folders; i++)
      if (strncmp(p + 1, folders[i], strlen(folders[i])) == 0) short_file = p + 1;
  char message[ERROR_MESSAGE_MAX];
  int n = 0;
  if (status == FL_ENOMEM || status == FL_EINTERNAL) {
    n = snprintf(message, sizeof message, "%s:%d: ", short_file, line);
    if (n < 0 || (size_t)n >= sizeof message) n = 0;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message + n, sizeof message - (size_t)n, fmt, ap);
  va_end(ap);
  return fl_set_error(status, "%s", message);
}

fl_status common_error_wrap(fl_status status, const char *fmt, ...) {
  char inner[ERROR_MESSAGE_MAX], message[ERROR_MESSAGE_MAX];
  const char *last = fl_last_error();
  snprintf(inner, sizeof inner, "%s", last[0] ? last : fl_strerror(status));
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof message)
    snprintf(message + n, sizeof message - (size_t)n, "%s", inner);
  return fl_set_error(status, "%s", message);
}

void common_error_clear(void) { fl_set_error(FL_OK, "%s", ""); }

void common_assert_failed(const char *file, int line, const char *what) {
  fprintf(stderr, "flint: %s:%d: internal invariant broken: %s\n", file, line, what);
  abort();
}
