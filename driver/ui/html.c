/*
 * html.c: the pages' output (ui_internal.h: ui_out): text appended to a growing buffer, and
 * the one escaping of text that came from the API. pages.c and svg.c both write through it.
 * An allocation failure is kept in the ui_out (the answer becomes a 500).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "driver/ui/ui_internal.h"

void pages_append(ui_out *o, const char *s, size_t n) {
  if (o->st != FL_OK) return;
  o->st = fl_buf_append(o->buf, s, n);
}

void pages_put(ui_out *o, const char *s) {
  if (s) pages_append(o, s, strlen(s));
}

void pages_printf(ui_out *o, const char *fmt, ...) {
  if (o->st != FL_OK) return;
  va_list ap;
  va_start(ap, fmt);
  o->st = common_buf_vprintf(o->buf, fmt, ap);
  va_end(ap);
}

void pages_escape(ui_out *o, const char *s) {
  if (!s) return;
  const char *run = s;
  for (; *s; s++) {
    const char *rep;
    switch (*s) {
    case '&': rep = "&amp;"; break;
    case '<': rep = "&lt;"; break;
    case '>': rep = "&gt;"; break;
    case '"': rep = "&quot;"; break;
    case '\'': rep = "&#39;"; break;
    default: continue;
    }
    pages_append(o, run, (size_t)(s - run));
    pages_put(o, rep);
    run = s + 1;
  }
  pages_append(o, run, (size_t)(s - run));
}
