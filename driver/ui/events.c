/*
 * events.c: the scheduler's notes as event lines (docs/ui.md), and the JSON text helper the
 * driver's producers use. A note becomes text on the scheduler thread (a few hundred bytes of
 * snprintf, no JSON tree): the UI thread parses it like any posted event, so the scheduler
 * pays for no store update and no disk write.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "driver/ui/ui_internal.h"

fl_status ui_json_string(fl_buf *out, const char *s) {
  static const char hex[] = "0123456789abcdef";
  if (!s) s = "";
  fl_status st = fl_buf_reserve(out, strlen(s) * 6 + 3);
  if (st != FL_OK) return st;
  char *p = (char *)out->data + out->len;
  *p++ = '"';
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      *p++ = '\\';
      *p++ = (char)*c;
    } else if (*c < 0x20) {
      memcpy(p, "\\u00", 4);
      p[4] = hex[*c >> 4];
      p[5] = hex[*c & 15];
      p += 6;
    } else {
      *p++ = (char)*c;
    }
  }
  *p++ = '"';
  out->len = (size_t)(p - (char *)out->data);
  return FL_OK;
}
