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

static fl_status svg_axes(fl_buf *out, const panel *p, const char *title, const char *ylabel, double ystep) {
  fl_status s = appendf(out,
                        "<g class=\"panel\">\n"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n"
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
                        p->left + PANEL_W / 2, p->top - 12, title, p->left, p->top, PANEL_W, PANEL_H);
  /* x ticks: whole epochs. */
  double xstep = nice_step(p->x1 - p->x0, 10);
  if (xstep < 1) xstep = 1;
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
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">epoch</text>\n"
                "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\" "
                "transform=\"rotate(-90 %d %d)\">%s</text>\n",
                p->left + PANEL_W / 2, p->top + PANEL_H + 36, p->left - 48, p->top + PANEL_H / 2, p->left - 48,
                p->top + PANEL_H / 2, ylabel);
  return s;
}

/* One series as a polyline; `field` is the offset of a double in curves_row. */
static fl_status svg_series(fl_buf *out, const panel *p, const curves *c, size_t field, const char *name,
                            const char *color, bool dashed, int legend_row) {
  fl_status s = appendf(out, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"",
                        name, color, dashed ? " stroke-dasharray=\"6 4\"" : "");
  for (size_t i = 0; s == FL_OK && i < c->count; i++) {
    double v;
    memcpy(&v, (const char *)&c->rows[i] + field, sizeof v);
    if (isnan(v)) continue;
    s = appendf(out, "%s%.1f,%.1f", i ? " " : "", px(p, c->rows[i].epoch), py(p, v));
  }
  int lx = p->left + PANEL_W - 110, ly = p->top + 16 + 16 * legend_row;
  if (s == FL_OK)
    s = appendf(out,
                "\"/>\n<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                "<text x=\"%d\" y=\"%d\" font-size=\"11\">%s</text>\n",
                lx, ly, lx + 24, ly, color, dashed ? " stroke-dasharray=\"6 4\"" : "", lx + 30, ly + 4, name);
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
  fl_status s = appendf(out,
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
                        "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
                        "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">",
                        SVG_W, SVG_H, SVG_W, SVG_H, SVG_W / 2);
  if (s == FL_OK) s = svg_text(out, title ? title : "training curves");
  if (s == FL_OK) s = appendf(out, "</text>\n");
  if (s == FL_OK) s = svg_axes(out, &loss, "loss", "cross-entropy loss", lstep);
  if (s == FL_OK) s = svg_series(out, &loss, c, offsetof(curves_row, train_loss), "train loss", "#1f77b4", false, 0);
  if (s == FL_OK) s = svg_series(out, &loss, c, offsetof(curves_row, test_loss), "test loss", "#ff7f0e", true, 1);
  if (s == FL_OK) s = appendf(out, "</g>\n");
  if (s == FL_OK) s = svg_axes(out, &acc, "accuracy", "accuracy", 0.2);
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

void curves_progress_print(FILE *f, uint32_t epoch, uint32_t epochs, double fraction, double loss, double acc,
                           double images_per_s, bool done) {
  char line[160];
  curves_progress_format(line, sizeof line, epoch, epochs, fraction, loss, acc, images_per_s);
  /* "\033[K" would clear the rest of the line; trailing blanks do that on any terminal. */
  fprintf(f, "\r%s   %s", line, done ? "\n" : "");
  fflush(f);
}
