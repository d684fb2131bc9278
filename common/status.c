/* status.c: the error table and the thread-local message of the last failure: one per
 * thread of the process, in libflint; everything else reaches it through fl_set_error and
 * fl_last_error (common/error.c). */
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

fl_status fl_set_error(fl_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}
