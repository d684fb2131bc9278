/*
 * svg.c: the pages' inline charts (docs/ui.md "Pages"): line charts with axes, timelines
 * (Gantt rows) and DAGs of boxes and arrows. Each draws one <svg> element of fixed size from
 * plain arrays the page fills, so it knows nothing of the API's JSON. Every text goes through
 * pages_escape; coordinates are computed in doubles and clamped, so no value (huge, negative,
 * NaN) makes a chart write outside its box or loop long.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "driver/ui/ui_internal.h"

#define MAX_TICKS 12

/* Writes at most `max_chars` characters of s (UTF-8 aware), escaped, with "…" when cut. */
static void put_fitted(ui_out *o, const char *s, size_t max_chars) {
  if (!s) return;
  char cut[4 * 32 + 8];
  size_t bytes = 0, chars = 0;
  while (s[bytes] && chars < max_chars && bytes < sizeof cut - 8) {
    bytes++;
    while ((s[bytes] & 0xC0) == 0x80 && bytes < sizeof cut - 4) bytes++; /* one character's tail */
    chars++;
  }
  if (!s[bytes]) {
    pages_escape(o, s);
    return;
  }
  memcpy(cut, s, bytes);
  cut[bytes] = '\0';
  pages_escape(o, cut);
  pages_put(o, "\xE2\x80\xA6");
}

static size_t utf8_chars(const char *s) {
  size_t n = 0;
  for (; s && *s; s++)
    if ((*s & 0xC0) != 0x80) n++;
  return n;
}

/* Where v falls between lo and hi, as a fraction in [0, 1]. Halves keep hi - lo finite when
 * the values are near DBL_MAX. */
static double frac(double v, double lo, double hi) {
  double span = hi / 2 - lo / 2;
  if (!(span > 0) || !isfinite(span)) return 0.5;
  double f = (v / 2 - lo / 2) / span;
  if (!(f >= 0)) return 0; /* NaN too */
  return f > 1 ? 1 : f;
}

/* A 1-2-5 step that cuts `span` into about `target` parts; 0 when there is none. */
static double nice_step(double span, int target) {
  if (!(span > 0) || !isfinite(span)) return 0;
  double raw = span / target;
  double mag = pow(10, floor(log10(raw)));
  if (!(mag > 0) || !isfinite(mag)) return 0;
  double f = raw / mag;
  double nice = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return nice * mag;
}

/* The tick values in [lo, hi] into ticks (at most MAX_TICKS); lo and hi when no step fits
 * (a span too large or too small for doubles to step through). */
static int ticks_of(double lo, double hi, double *ticks) {
  double step = nice_step(hi - lo, 5);
  int n = 0;
  if (step > 0) {
    double first = ceil(lo / step - 1e-9) * step; /* 2.1 / 0.1 is 21.000000000000004 */
    for (int i = 0; i < MAX_TICKS; i++) {
      double v = first + i * step;
      if (v > hi + step * 1e-9) break;
      if (n && v == ticks[n - 1]) break; /* a step below the values' precision */
      ticks[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
  }
  if (n < 2) {
    ticks[0] = lo;
    ticks[1] = hi;
    n = lo == hi ? 1 : 2;
  }
  return n;
}

static void widen(double *lo, double *hi) {
  if (*lo < *hi) return;
  double pad = fabs(*lo) > 1 ? fabs(*lo) * 0.1 : 1;
  *lo -= pad;
  *hi += pad;
}

/* ---- line charts ------------------------------------------------------------------------- */

enum { LC_W = 560, LC_H = 260, LC_L = 64, LC_R = 16, LC_T = 30, LC_B = 42 };

void svg_line_chart(ui_out *o, const char *title, const char *x_label, const char *y_label,
                    const svg_series *series, size_t n_series) {
  double xlo = 0, xhi = 0, ylo = 0, yhi = 0;
  bool any = false;
  for (size_t s = 0; s < n_series; s++) {
    for (size_t i = 0; i < series[s].n; i++) {
      double x = series[s].x[i], y = series[s].y[i];
      if (!isfinite(x) || !isfinite(y)) continue;
      if (!any || x < xlo) xlo = x;
      if (!any || x > xhi) xhi = x;
      if (!any || y < ylo) ylo = y;
      if (!any || y > yhi) yhi = y;
      any = true;
    }
  }
  if (!any) xhi = yhi = 1; /* empty axes from 0 to 1 */
  widen(&xlo, &xhi);
  widen(&ylo, &yhi);
  const double pw = LC_W - LC_L - LC_R, ph = LC_H - LC_T - LC_B;
  pages_printf(o, "<svg class=\"chart\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">", LC_W, LC_H, LC_W, LC_H);
  pages_printf(o, "<text x=\"%d\" y=\"18\" class=\"ct\">", LC_L);
  pages_escape(o, title);
  pages_put(o, "</text>");
  pages_printf(o, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" class=\"plot\"/>", LC_L, LC_T, pw, ph);
  double ticks[MAX_TICKS];
  int nt = ticks_of(ylo, yhi, ticks);
  for (int i = 0; i < nt; i++) {
    double y = LC_T + ph - frac(ticks[i], ylo, yhi) * ph;
    pages_printf(o, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" class=\"grid\"/>", LC_L, y, LC_L + pw, y);
    pages_printf(o, "<text x=\"%d\" y=\"%.1f\" class=\"tk\" text-anchor=\"end\">%.4g</text>", LC_L - 4, y + 4, ticks[i]);
  }
  nt = ticks_of(xlo, xhi, ticks);
  for (int i = 0; i < nt; i++) {
    double x = LC_L + frac(ticks[i], xlo, xhi) * pw;
    pages_printf(o, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" class=\"axis\"/>", x, LC_T + ph, x, LC_T + ph + 4);
    pages_printf(o, "<text x=\"%.1f\" y=\"%.0f\" class=\"tk\" text-anchor=\"middle\">%.4g</text>", x, LC_T + ph + 16, ticks[i]);
  }
  pages_printf(o, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%.0f\" class=\"axis\"/>", LC_L, LC_T, LC_L, LC_T + ph);
  pages_printf(o, "<line x1=\"%d\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" class=\"axis\"/>", LC_L, LC_T + ph, LC_L + pw, LC_T + ph);
  pages_printf(o, "<text x=\"%.0f\" y=\"%d\" class=\"tk\" text-anchor=\"middle\">", LC_L + pw / 2, LC_H - 6);
  pages_escape(o, x_label);
  pages_printf(o, "</text><text x=\"14\" y=\"%.0f\" class=\"tk\" text-anchor=\"middle\" transform=\"rotate(-90 14 %.0f)\">",
               LC_T + ph / 2, LC_T + ph / 2);
  pages_escape(o, y_label);
  pages_put(o, "</text>");
  if (!any)
    pages_printf(o, "<text x=\"%.0f\" y=\"%.0f\" class=\"tk\" text-anchor=\"middle\">no data</text>", LC_L + pw / 2,
                 LC_T + ph / 2);
  double lx = LC_L + pw;
  for (size_t s = n_series; s-- > 0;) { /* the legend, right-aligned at the top */
    lx -= 14 + 7.0 * (double)utf8_chars(series[s].name);
    pages_put(o, "<rect class=\"key\" fill=\"");
    pages_escape(o, series[s].color);
    pages_printf(o, "\" x=\"%.1f\" y=\"9\" width=\"10\" height=\"10\"/><text x=\"%.1f\" y=\"18\" class=\"tk\">", lx, lx + 13);
    pages_escape(o, series[s].name);
    pages_put(o, "</text>");
    lx -= 10;
  }
  for (size_t s = 0; s < n_series; s++) {
    size_t points = 0, stride = (series[s].n + SVG_MAX_POINTS - 1) / SVG_MAX_POINTS;
    double px = 0, py = 0;
    for (size_t i = 0; i < series[s].n; i++) {
      if (i % stride && i + 1 < series[s].n) continue;
      double x = series[s].x[i], y = series[s].y[i];
      if (!isfinite(x) || !isfinite(y)) continue;
      px = LC_L + frac(x, xlo, xhi) * pw;
      py = LC_T + ph - frac(y, ylo, yhi) * ph;
      if (!points) {
        pages_put(o, "<polyline class=\"line\" stroke=\"");
        pages_escape(o, series[s].color);
        pages_printf(o, "\" points=\"%.1f,%.1f", px, py);
      } else {
        pages_printf(o, " %.1f,%.1f", px, py);
      }
      points++;
    }
    if (points) {
      pages_put(o, "\"><title>");
      pages_escape(o, series[s].name);
      pages_put(o, "</title></polyline>");
    }
    if (points == 1) { /* a polyline of one point draws nothing */
      pages_put(o, "<circle r=\"3\" fill=\"");
      pages_escape(o, series[s].color);
      pages_printf(o, "\" cx=\"%.1f\" cy=\"%.1f\"/>", px, py);
    }
  }
  pages_put(o, "</svg>\n");
}

/* ---- timelines --------------------------------------------------------------------------- */

enum { TL_LABEL = 150, TL_PLOT = 700, TL_ROW = 22, TL_T = 26, TL_B = 30, TL_CHAR = 7 };

/* A tick of a timeline's axis: milliseconds from t0 in the unit that suits the whole span. */
static void put_ms_tick(ui_out *o, double ms, double span) {
  if (span < 2000)
    pages_printf(o, "%.4g ms", ms);
  else if (span < 120e3)
    pages_printf(o, "%.4g s", ms / 1e3);
  else if (span < 7200e3)
    pages_printf(o, "%.4g min", ms / 60e3);
  else
    pages_printf(o, "%.4g h", ms / 3600e3);
}

void svg_timeline(ui_out *o, const char *title, const char *const *rows, size_t n_rows, const svg_bar *bars,
                  size_t n_bars, double t0, double t1) {
  if (!isfinite(t0)) t0 = 0;
  if (!isfinite(t1) || t1 <= t0) t1 = t0 + 1;
  double span = t1 / 2 - t0 / 2 > 0 && isfinite(t1 - t0) ? t1 - t0 : 1;
  const int w = TL_LABEL + TL_PLOT + 16;
  const double h = TL_T + (double)n_rows * TL_ROW + TL_B;
  pages_printf(o, "<svg class=\"chart\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">", w, h, w, h);
  pages_printf(o, "<text x=\"%d\" y=\"16\" class=\"ct\">", TL_LABEL);
  pages_escape(o, title);
  pages_put(o, "</text>");
  for (size_t r = 0; r < n_rows; r++) {
    double y = TL_T + (double)r * TL_ROW;
    pages_printf(o, "<rect x=\"%d\" y=\"%.0f\" width=\"%d\" height=\"%d\" class=\"%s\"/>", TL_LABEL, y, TL_PLOT, TL_ROW,
                 r % 2 ? "row1" : "row0");
    pages_printf(o, "<text x=\"%d\" y=\"%.0f\" class=\"tk\" text-anchor=\"end\">", TL_LABEL - 6, y + 15);
    put_fitted(o, rows[r], 20);
    pages_put(o, "</text>");
  }
  double axis_y = TL_T + (double)n_rows * TL_ROW;
  double ticks[MAX_TICKS];
  int nt = ticks_of(0, span, ticks);
  for (int i = 0; i < nt; i++) {
    double x = TL_LABEL + frac(ticks[i], 0, span) * TL_PLOT;
    pages_printf(o, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.0f\" class=\"grid\"/>", x, TL_T, x, axis_y + 4);
    pages_printf(o, "<text x=\"%.1f\" y=\"%.0f\" class=\"tk\" text-anchor=\"middle\">", x, axis_y + 16);
    put_ms_tick(o, ticks[i], span);
    pages_put(o, "</text>");
  }
  pages_printf(o, "<line x1=\"%d\" y1=\"%.0f\" x2=\"%d\" y2=\"%.0f\" class=\"axis\"/>", TL_LABEL, axis_y, TL_LABEL + TL_PLOT,
               axis_y);
  if (!n_bars)
    pages_printf(o, "<text x=\"%d\" y=\"%.0f\" class=\"tk\">nothing yet</text>", TL_LABEL + 6, TL_T + 15.0);
  for (size_t i = 0; i < n_bars; i++) {
    const svg_bar *b = &bars[i];
    if (b->row >= n_rows) continue;
    double x0 = TL_LABEL + frac(b->start - t0, 0, span) * TL_PLOT;
    double x1 = TL_LABEL + frac(b->end - t0, 0, span) * TL_PLOT;
    double bw = x1 - x0 < 1.5 ? 1.5 : x1 - x0;
    double y = TL_T + (double)b->row * TL_ROW + 3;
    if (b->href) {
      pages_put(o, "<a href=\"");
      pages_escape(o, b->href);
      pages_put(o, "\">");
    }
    pages_put(o, "<rect class=\"bar\" fill=\"");
    pages_escape(o, b->color ? b->color : "#4a7fb5");
    pages_printf(o, "\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" height=\"%d\">", x0, y, bw, TL_ROW - 6);
    if (b->tip) {
      pages_put(o, "<title>");
      pages_escape(o, b->tip);
      pages_put(o, "</title>");
    }
    pages_put(o, "</rect>");
    if (b->label && bw >= (double)(TL_CHAR * utf8_chars(b->label) + 4)) {
      pages_printf(o, "<text x=\"%.1f\" y=\"%.0f\" class=\"bl\" text-anchor=\"middle\">", x0 + bw / 2, y + 12);
      pages_escape(o, b->label);
      pages_put(o, "</text>");
    }
    if (b->href) pages_put(o, "</a>");
  }
  pages_put(o, "</svg>\n");
}

/* ---- DAGs -------------------------------------------------------------------------------- */

enum { DG_W = 180, DG_H = 44, DG_GX = 24, DG_GY = 36, DG_M = 12, DG_MAX_LAYER = 4096 };

void svg_dag(ui_out *o, const svg_node *nodes, size_t n_nodes, const svg_edge *edges, size_t n_edges) {
  if (!n_nodes) return;
  size_t layers = 1;
  for (size_t i = 0; i < n_nodes; i++) {
    size_t l = nodes[i].layer < 0 ? 0 : nodes[i].layer > DG_MAX_LAYER ? DG_MAX_LAYER : (size_t)nodes[i].layer;
    if (l + 1 > layers) layers = l + 1;
  }
  /* A node's place: its index within its layer; the widest layer sets the width. */
  size_t *count = fl_calloc(layers, sizeof *count), *slot = fl_calloc(n_nodes, sizeof *slot);
  if (!count || !slot) {
    fl_free(count);
    fl_free(slot);
    o->st = FL_ENOMEM;
    return;
  }
  size_t widest = 1;
  for (size_t i = 0; i < n_nodes; i++) {
    size_t l = nodes[i].layer < 0 ? 0 : nodes[i].layer > DG_MAX_LAYER ? DG_MAX_LAYER : (size_t)nodes[i].layer;
    slot[i] = count[l]++;
    if (count[l] > widest) widest = count[l];
  }
  double w = DG_M * 2 + (double)widest * (DG_W + DG_GX) - DG_GX;
  double h = DG_M * 2 + (double)layers * (DG_H + DG_GY) - DG_GY;
  unsigned id = ++o->ids;
  pages_printf(o, "<svg class=\"dag\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">", w, h, w, h);
  pages_printf(o,
               "<defs><marker id=\"arrow%u\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" "
               "markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#555\"/></marker></defs>",
               id);
#define NODE_X(i) (DG_M + (double)slot[i] * (DG_W + DG_GX))
#define NODE_Y(i) \
  (DG_M + (double)(nodes[i].layer < 0 ? 0 : nodes[i].layer > DG_MAX_LAYER ? DG_MAX_LAYER : nodes[i].layer) * (DG_H + DG_GY))
  for (size_t e = 0; e < n_edges; e++) {
    size_t a = edges[e].from, b = edges[e].to;
    if (a >= n_nodes || b >= n_nodes || a == b) continue;
    double x1 = NODE_X(a) + DG_W / 2.0, y1 = NODE_Y(a) + DG_H, x2 = NODE_X(b) + DG_W / 2.0, y2 = NODE_Y(b);
    if (NODE_Y(b) <= NODE_Y(a)) { /* same layer or upwards: side to side */
      y1 = NODE_Y(a) + DG_H / 2.0;
      y2 = NODE_Y(b) + DG_H / 2.0;
      x1 = NODE_X(a) + (NODE_X(b) > NODE_X(a) ? DG_W : 0);
      x2 = NODE_X(b) + (NODE_X(b) > NODE_X(a) ? 0 : DG_W);
    }
    pages_printf(o, "<line class=\"edge\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" marker-end=\"url(#arrow%u)\"/>",
                 x1, y1, x2, y2, id);
  }
  for (size_t i = 0; i < n_nodes; i++) {
    const svg_node *nd = &nodes[i];
    double x = NODE_X(i), y = NODE_Y(i);
    if (nd->href) {
      pages_put(o, "<a href=\"");
      pages_escape(o, nd->href);
      pages_put(o, "\">");
    }
    pages_put(o, "<g class=\"node\"><title>");
    pages_escape(o, nd->label);
    if (nd->sub) {
      pages_put(o, "\n");
      pages_escape(o, nd->sub);
    }
    pages_put(o, "</title><rect fill=\"");
    pages_escape(o, nd->color ? nd->color : "#e3eef9");
    pages_printf(o, "\" x=\"%.0f\" y=\"%.0f\" width=\"%d\" height=\"%d\" rx=\"5\"/>", x, y, DG_W, DG_H);
    pages_printf(o, "<text x=\"%.0f\" y=\"%.0f\" class=\"nl\" text-anchor=\"middle\">", x + DG_W / 2.0, y + (nd->sub ? 18 : 27));
    put_fitted(o, nd->label, 24);
    pages_put(o, "</text>");
    if (nd->sub) {
      pages_printf(o, "<text x=\"%.0f\" y=\"%.0f\" class=\"tk\" text-anchor=\"middle\">", x + DG_W / 2.0, y + 34);
      put_fitted(o, nd->sub, 26);
      pages_put(o, "</text>");
    }
    pages_put(o, "</g>");
    if (nd->href) pages_put(o, "</a>");
  }
#undef NODE_X
#undef NODE_Y
  pages_put(o, "</svg>\n");
  fl_free(count);
  fl_free(slot);
}
