/*
 * gpu/parallel/curves.c: training curves as CSV and SVG, and the per-epoch progress line.
 *
 * The SVG is written by hand (no library): two panels, each with a frame, "nice" ticks
 * (1, 2 or 5 times a power of ten), tick labels, axis titles, a legend and one <polyline>
 * per series. Points whose value is NaN are left out of their series.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/curves.h"
#include "gpu/parallel/train.h"

fl_status curves_append(curves *c, const curves_row *row) {
  if (c->count == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    curves_row *rows = common_realloc(c->rows, cap * sizeof *rows);
    if (!rows) return fl_set_error(FL_ENOMEM, "curves_append: out of memory");
    c->rows = rows;
    c->cap = cap;
  }
  c->rows[c->count++] = *row;
  return FL_OK;
}

void curves_free(curves *c) {
  common_free(c->rows);
  *c = (curves)CURVES_INIT;
}

static fl_status appendf(fl_buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fl_status appendf(fl_buf *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return fl_set_error(FL_EINTERNAL, "curves: bad format");
  fl_status s = fl_buf_reserve(out, (size_t)n + 1);
  if (s != FL_OK) return s;
  va_start(ap, fmt);
  vsnprintf((char *)out->data + out->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  out->len += (size_t)n;
  return FL_OK;
}

/* A CSV number: empty for NaN. */
static fl_status csv_num(fl_buf *out, double v, bool last) {
  return isnan(v) ? appendf(out, "%s", last ? "\n" : ",") : appendf(out, "%.6g%s", v, last ? "\n" : ",");
}

fl_status curves_csv(const curves *c, fl_buf *out) {
  out->len = 0;
  fl_status s = appendf(out, "%s\n", CURVES_CSV_HEADER);
  double elapsed = 0;
  for (size_t i = 0; s == FL_OK && i < c->count; i++) {
    const curves_row *r = &c->rows[i];
    elapsed += r->seconds;
    s = appendf(out, "%u,", r->epoch);
    double v[] = {r->train_loss, r->train_acc,    r->test_loss, r->test_acc, r->lr,
                  r->images_per_s, r->seconds, elapsed,       r->reduced_mb};
    enum { FIELDS = sizeof v / sizeof v[0] };
    for (int k = 0; s == FL_OK && k < FIELDS; k++) s = csv_num(out, v[k], k == FIELDS - 1);
  }
  return s;
}

/* ---- SVG -------------------------------------------------------------------------------- */

#define SVG_W 960
#define SVG_H 400
#define PANEL_W 400
#define PANEL_H 280
#define PANEL_TOP 60
#define PANEL_LEFT0 70
#define PANEL_LEFT1 550

/* A tick step of 1, 2 or 5 times a power of ten giving about `ticks` ticks over span. */
static double nice_step(double span, int ticks) {
  if (!(span > 0)) return 1;
  double raw = span / ticks, mag = pow(10, floor(log10(raw))), f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

typedef struct panel {
  double x0, x1, y0, y1; /* data ranges */
  int left, top;         /* pixels */
} panel;

static double px(const panel *p, double x) { return p->left + (x - p->x0) / (p->x1 - p->x0) * PANEL_W; }
static double py(const panel *p, double y) { return p->top + PANEL_H - (y - p->y0) / (p->y1 - p->y0) * PANEL_H; }

/* A panel's frame, ticks and axis titles; whole_x: x ticks at whole numbers only (epochs). */
static fl_status svg_axes(fl_buf *out, const panel *p, const char *title, const char *xlabel, bool whole_x,
                          const char *ylabel, double ystep) {
  fl_status s = appendf(out,
                        "<g class=\"panel\">\n"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n"
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
                        p->left + PANEL_W / 2, p->top - 12, title, p->left, p->top, PANEL_W, PANEL_H);
  double xstep = nice_step(p->x1 - p->x0, 10);
  if (whole_x && xstep < 1) xstep = 1;
  for (double x = ceil(p->x0 / xstep) * xstep; s == FL_OK && x <= p->x1 + 1e-9; x += xstep)
    s = appendf(out,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#000\"/>"
                "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\">%g</text>\n",
                px(p, x), p->top + PANEL_H, px(p, x), p->top + PANEL_H + 5, px(p, x), p->top + PANEL_H + 18, x);
  for (double y = ceil(p->y0 / ystep) * ystep; s == FL_OK && y <= p->y1 + 1e-9 * ystep; y += ystep)
    s = appendf(out,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#000\"/>"
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%g</text>\n",
                p->left - 5, py(p, y), p->left, py(p, y), p->left + 1, py(p, y), p->left + PANEL_W - 1, py(p, y),
                p->left - 8, py(p, y) + 4, fabs(y) < 1e-12 ? 0 : y);
  if (s == FL_OK)
    s = appendf(out,
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">%s</text>\n"
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" "
                "transform=\"rotate(-90 %d %d)\">%s</text>\n",
                p->left + PANEL_W / 2, p->top + PANEL_H + 36, xlabel, p->left - 48, p->top + PANEL_H / 2,
                p->left - 48, p->top + PANEL_H / 2, ylabel);
  return s;
}

/* One series as a polyline of the points (x[i], y[i]) whose y is a number, with its legend
 * entry (the name, escaped). */
static fl_status svg_text(fl_buf *out, const char *text);
static fl_status svg_polyline(fl_buf *out, const panel *p, const double *x, const double *y, size_t n,
                              const char *name, const char *color, bool dashed, int legend_row) {
  fl_status s = appendf(out, "<polyline class=\"");
  if (s == FL_OK) s = svg_text(out, name);
  if (s == FL_OK)
    s = appendf(out, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", color,
                dashed ? " stroke-dasharray=\"6 4\"" : "");
  bool first = true;
  for (size_t i = 0; s == FL_OK && i < n; i++) {
    if (isnan(y[i]) || isnan(x[i])) continue;
    s = appendf(out, "%s%.1f,%.1f", first ? "" : " ", px(p, x[i]), py(p, y[i]));
    first = false;
  }
  int lx = p->left + PANEL_W - 150, ly = p->top + 16 + 16 * legend_row;
  if (s == FL_OK)
    s = appendf(out,
                "\"/>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                "<text x=\"%d\" y=\"%d\" font-size=\"11\">",
                lx, ly, lx + 24, ly, color, dashed ? " stroke-dasharray=\"6 4\"" : "", lx + 30, ly + 4);
  if (s == FL_OK) s = svg_text(out, name);
  if (s == FL_OK) s = appendf(out, "</text>\n");
  return s;
}

/* One series of the curves against the epoch; `field` is the offset of a double in curves_row. */
static fl_status svg_series(fl_buf *out, const panel *p, const curves *c, size_t field, const char *name,
                            const char *color, bool dashed, int legend_row) {
  double *x = common_calloc(c->count + 1, sizeof *x), *y = common_calloc(c->count + 1, sizeof *y);
  fl_status s = x && y ? FL_OK : fl_set_error(FL_ENOMEM, "curves: out of memory");
  for (size_t i = 0; s == FL_OK && i < c->count; i++) {
    x[i] = c->rows[i].epoch;
    memcpy(&y[i], (const char *)&c->rows[i] + field, sizeof y[i]);
  }
  if (s == FL_OK) s = svg_polyline(out, p, x, y, c->count, name, color, dashed, legend_row);
  common_free(x);
  common_free(y);
  return s;
}

/* Escapes the few characters that matter in SVG text. */
static fl_status svg_text(fl_buf *out, const char *text) {
  fl_status s = FL_OK;
  for (const char *t = text; s == FL_OK && *t; t++) {
    switch (*t) {
    case '<': s = appendf(out, "&lt;"); break;
    case '>': s = appendf(out, "&gt;"); break;
    case '&': s = appendf(out, "&amp;"); break;
    case '"': s = appendf(out, "&quot;"); break;
    default: s = fl_buf_append(out, t, 1);
    }
  }
  return s;
}

/* The document's start: its size, a white background and the title above the panels. */
static fl_status svg_begin(fl_buf *out, const char *title) {
  fl_status s = appendf(out,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
                        "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
                        "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">",
                        SVG_W, SVG_H, SVG_W, SVG_H, SVG_W / 2);
  if (s == FL_OK) s = svg_text(out, title);
  if (s == FL_OK) s = appendf(out, "</text>\n");
  return s;
}

fl_status curves_svg(const curves *c, const char *title, fl_buf *out) {
  out->len = 0;
  double x1 = 1, lmax = 0;
  for (size_t i = 0; i < c->count; i++) {
    const curves_row *r = &c->rows[i];
    if (r->epoch > x1) x1 = r->epoch;
    if (isfinite(r->train_loss) && r->train_loss > lmax) lmax = r->train_loss;
    if (isfinite(r->test_loss) && r->test_loss > lmax) lmax = r->test_loss;
  }
  if (!(lmax > 0)) lmax = 1;
  double lstep = nice_step(lmax, 6);
  panel loss = {0, x1, 0, ceil(lmax / lstep) * lstep, PANEL_LEFT0, PANEL_TOP};
  panel acc = {0, x1, 0, 1, PANEL_LEFT1, PANEL_TOP};
  fl_status s = svg_begin(out, title ? title : "training curves");
  if (s == FL_OK) s = svg_axes(out, &loss, "loss", "epoch", true, "cross-entropy loss", lstep);
  if (s == FL_OK) s = svg_series(out, &loss, c, offsetof(curves_row, train_loss), "train loss", "#1f77b4", false, 0);
  if (s == FL_OK) s = svg_series(out, &loss, c, offsetof(curves_row, test_loss), "test loss", "#ff7f0e", true, 1);
  if (s == FL_OK) s = appendf(out, "</g>\n");
  if (s == FL_OK) s = svg_axes(out, &acc, "accuracy", "epoch", true, "accuracy", 0.2);
  if (s == FL_OK) s = svg_series(out, &acc, c, offsetof(curves_row, train_acc), "train accuracy", "#1f77b4", false, 0);
  if (s == FL_OK) s = svg_series(out, &acc, c, offsetof(curves_row, test_acc), "test accuracy", "#ff7f0e", true, 1);
  if (s == FL_OK) s = appendf(out, "</g>\n</svg>\n");
  return s;
}

static fl_status write_file(const char *path, const fl_buf *b) {
  FILE *f = fopen(path, "wb");
  if (!f) return fl_set_error(FL_EIO, "cannot create %s: %s", path, strerror(errno));
  bool ok = (b->len == 0 || fwrite(b->data, 1, b->len, f) == b->len);
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  return ok ? FL_OK : fl_set_error(FL_EIO, "cannot write %s: %s", path, strerror(err));
}

fl_status curves_write_csv(const curves *c, const char *path) {
  fl_buf b = FL_BUF_INIT;
  fl_status s = curves_csv(c, &b);
  if (s == FL_OK) s = write_file(path, &b);
  fl_buf_free(&b);
  return s;
}

fl_status curves_write_svg(const curves *c, const char *title, const char *path) {
  fl_buf b = FL_BUF_INIT;
  fl_status s = curves_svg(c, title, &b);
  if (s == FL_OK) s = write_file(path, &b);
  fl_buf_free(&b);
  return s;
}

#define BAR_WIDTH 20

int curves_progress_format(char *buf, size_t cap, uint32_t epoch, uint32_t epochs, double fraction, double loss,
                           double acc, double images_per_s) {
  if (!(fraction > 0)) fraction = 0;
  if (fraction > 1) fraction = 1;
  char bar[BAR_WIDTH + 1];
  int full = (int)(fraction * BAR_WIDTH + 1e-9);
  for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < full ? '#' : '.';
  bar[BAR_WIDTH] = '\0';
  return snprintf(buf, cap, "epoch %u/%u [%s] %3d%% loss %.3f acc %.3f %.0f img/s", epoch, epochs, bar,
                  (int)(fraction * 100 + 1e-9), loss, acc, images_per_s);
}

void curves_progress_print(FILE *f, bool in_place, uint32_t epoch, uint32_t epochs, double fraction, double loss,
                           double acc, double images_per_s, const char *eta, bool done) {
  if (!in_place && !done) return;
  char line[160];
  curves_progress_format(line, sizeof line, epoch, epochs, fraction, loss, acc, images_per_s);
  /* "\033[K" would clear the rest of the line; trailing blanks do that on any terminal. */
  fprintf(f, "%s%s%s%s%s", in_place ? "\r" : "", line, eta ? "  " : "", eta ? eta : "",
          done ? "\n" : "   ");
  fflush(f);
}

/* ---- comparing runs ---------------------------------------------------------------------- */

void curves_run_free(curves_run *r) {
  common_free(r->elapsed);
  common_free(r->mb);
  common_free(r->loss);
  memset(r, 0, sizeof *r);
}

/* The index of the first of `names` (NULL-terminated) among the header's columns, or -1. */
static int column_of(char *const *cols, int ncols, const char *const *names) {
  for (const char *const *n = names; *n; n++)
    for (int i = 0; i < ncols; i++)
      if (strcmp(cols[i], *n) == 0) return i;
  return -1;
}

#define RUN_MAX_COLUMNS 64

/* Splits a CSV line in place at commas (no quoting: flint's curves have none). */
static int split_csv(char *line, char **cols) {
  int n = 0;
  line[strcspn(line, "\r\n")] = 0;
  for (char *p = line; n < RUN_MAX_COLUMNS;) {
    cols[n++] = p;
    char *comma = strchr(p, ',');
    if (!comma) break;
    *comma = 0;
    p = comma + 1;
  }
  return n;
}

static bool parse_number(const char *text, double *out) {
  if (!*text) {
    *out = NAN; /* an empty field: not measured */
    return true;
  }
  char *end;
  errno = 0;
  *out = strtod(text, &end);
  return end != text && *end == 0 && errno == 0 && isfinite(*out);
}

fl_status curves_run_read(const char *path, const char *label, curves_run *out) {
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "r");
  if (!f) return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot read %s: %s", path, strerror(errno));
  static const char *const loss_names[] = {"train_loss", "loss", NULL};
  static const char *const time_names[] = {"elapsed_s", NULL};
  static const char *const mb_names[] = {"sent_mb", "reduced_mb", NULL};
  char line[4096], *cols[RUN_MAX_COLUMNS];
  fl_status st = FL_OK;
  int iloss = -1, itime = -1, imb = -1, ncols = 0;
  if (!fgets(line, sizeof line, f)) {
    st = fl_set_error(FL_EFORMAT, "%s is empty: no header line", path);
  } else {
    ncols = split_csv(line, cols);
    iloss = column_of(cols, ncols, loss_names);
    itime = column_of(cols, ncols, time_names);
    imb = column_of(cols, ncols, mb_names);
    if (iloss < 0 || itime < 0 || imb < 0)
      st = fl_set_error(FL_EFORMAT, "%s:1: the header lacks a column %s (curves need train_loss, elapsed_s and "
                        "sent_mb or reduced_mb)", path, iloss < 0 ? "train_loss" : itime < 0 ? "elapsed_s" : "sent_mb");
  }
  size_t cap = 0;
  for (unsigned lineno = 2; st == FL_OK && fgets(line, sizeof line, f); lineno++) {
    if (line[0] == '\n' || line[0] == 0) continue;
    int n = split_csv(line, cols);
    double loss, t, mb;
    if (n != ncols || !parse_number(cols[iloss], &loss) || !parse_number(cols[itime], &t) ||
        !parse_number(cols[imb], &mb)) {
      st = fl_set_error(FL_EFORMAT, "%s:%u: %s", path, lineno,
                        n != ncols ? "a row of another number of columns than the header" : "a field is not a number");
      break;
    }
    if (out->n == cap) {
      cap = cap ? 2 * cap : 32;
      double *a = common_realloc(out->elapsed, cap * sizeof *a), *b = a ? common_realloc(out->mb, cap * sizeof *b) : NULL,
             *c = b ? common_realloc(out->loss, cap * sizeof *c) : NULL;
      if (a) out->elapsed = a;
      if (b) out->mb = b;
      if (c) out->loss = c;
      if (!a || !b || !c) {
        st = fl_set_error(FL_ENOMEM, "curves: out of memory");
        break;
      }
    }
    out->elapsed[out->n] = t, out->mb[out->n] = mb, out->loss[out->n] = loss;
    out->n++;
  }
  if (st == FL_OK && ferror(f)) st = fl_set_error(FL_EIO, "cannot read %s: %s", path, strerror(errno));
  if (st == FL_OK && out->n == 0) st = fl_set_error(FL_EFORMAT, "%s has a header and no rows", path);
  fclose(f);
  if (st == FL_OK) {
    const char *base = strrchr(path, '/');
    snprintf(out->label, sizeof out->label, "%s", label && *label ? label : base ? base + 1 : path);
  } else {
    curves_run_free(out);
  }
  return st;
}

fl_status curves_compare_svg(const curves_run *runs, size_t n, const char *title, fl_buf *out) {
  static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                        "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  out->len = 0;
  if (n == 0 || n > CURVES_COMPARE_MAX)
    return fl_set_error(FL_EINVAL, "curves: %zu runs to compare (1 to %d)", n, CURVES_COMPARE_MAX);
  double tmax = 0, mbmax = 0, lmax = 0;
  for (size_t r = 0; r < n; r++)
    for (size_t i = 0; i < runs[r].n; i++) {
      if (runs[r].elapsed[i] > tmax) tmax = runs[r].elapsed[i];
      if (runs[r].mb[i] > mbmax) mbmax = runs[r].mb[i];
      if (isfinite(runs[r].loss[i]) && runs[r].loss[i] > lmax) lmax = runs[r].loss[i];
    }
  if (!(tmax > 0)) tmax = 1;
  if (!(mbmax > 0)) mbmax = 1;
  if (!(lmax > 0)) lmax = 1;
  double lstep = nice_step(lmax, 6);
  panel by_time = {0, tmax, 0, ceil(lmax / lstep) * lstep, PANEL_LEFT0, PANEL_TOP};
  panel by_bytes = {0, mbmax, 0, ceil(lmax / lstep) * lstep, PANEL_LEFT1, PANEL_TOP};
  fl_status s = svg_begin(out, title ? title : "training loss by run");
  if (s == FL_OK) s = svg_axes(out, &by_time, "against time", "seconds", false, "training loss", lstep);
  for (size_t r = 0; s == FL_OK && r < n; r++)
    s = svg_polyline(out, &by_time, runs[r].elapsed, runs[r].loss, runs[r].n, runs[r].label, palette[r % 10], r >= 10,
                     (int)r);
  if (s == FL_OK) s = appendf(out, "</g>\n");
  if (s == FL_OK) s = svg_axes(out, &by_bytes, "against bytes sent", "MiB sent per worker", false, "training loss", lstep);
  for (size_t r = 0; s == FL_OK && r < n; r++)
    s = svg_polyline(out, &by_bytes, runs[r].mb, runs[r].loss, runs[r].n, runs[r].label, palette[r % 10], r >= 10,
                     (int)r);
  if (s == FL_OK) s = appendf(out, "</g>\n</svg>\n");
  return s;
}

fl_status curves_write_compare_svg(const curves_run *runs, size_t n, const char *title, const char *path) {
  fl_buf b = FL_BUF_INIT;
  fl_status s = curves_compare_svg(runs, n, title, &b);
  if (s == FL_OK) s = write_file(path, &b);
  fl_buf_free(&b);
  return s;
}
