/*
 * gpu/parallel/pipeline_timeline.c: the hybrid trainer's timeline: the events of a step
 * (gpu/parallel/pipeline_internal.h) and the timelines of every rank as CSV and SVG files
 * (gpu/parallel/pipeline.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_internal.h"

const char *pp_event_kind_name(pp_event_kind k) {
  static const char *const names[PP_EV_KINDS] = {"forward", "backward", "recv",
                                                 "send",    "allreduce", "optimizer"};
  return (unsigned)k < PP_EV_KINDS ? names[k] : "?";
}

double pp_timeline_now(const pp_trainer *t) {
  return (double)(common_now_ns() - t->step_start_ns) * 1e-9;
}

fl_status pp_timeline_add(pp_trainer *t, pp_event_kind kind, int mb, int chunk, double t0) {
  if (t->nevents == t->events_cap) {
    size_t cap = t->events_cap ? 2 * t->events_cap : 64;
    pp_event *e = common_realloc(t->events, cap * sizeof *e);
    if (!e) return FL_ERR(FL_ENOMEM, "out of memory for the timeline");
    t->events = e;
    t->events_cap = cap;
  }
  t->events[t->nevents++] = (pp_event){kind, mb, chunk, t0, pp_timeline_now(t)};
  return FL_OK;
}

/* ---- the timeline as files ------------------------------------------------------------------ */

static const char *const event_colour[PP_EV_KINDS] = {"#4c78a8", "#f58518", "#e45756",
                                                       "#9d755d", "#72b7b2", "#54a24b"};

fl_status pp_timeline_write_csv(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n) {
  FILE *f = fopen(path, "w");
  if (!f) return fl_set_error(FL_EIO, "cannot write the timeline '%s': %s", path, strerror(errno));
  fprintf(f, "rank,kind,microbatch,chunk,t0,t1\n");
  for (int r = 0; r < ranks; r++)
    for (size_t i = 0; i < n[r]; i++) {
      const pp_event *e = &events[r][i];
      fprintf(f, "%d,%s,%d,%d,%.6f,%.6f\n", r, pp_event_kind_name(e->kind), e->microbatch, e->chunk,
              e->t0, e->t1);
    }
  if (fclose(f) != 0) return fl_set_error(FL_EIO, "cannot write the timeline '%s': %s", path, strerror(errno));
  return FL_OK;
}

fl_status pp_timeline_write_svg(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n, double seconds, const char *title) {
  const double left = 70, top = 40, row_h = 26, width = 900;
  double height = top + ranks * row_h + 50, scale = seconds > 0 ? width / seconds : 0;
  FILE *f = fopen(path, "w");
  if (!f) return fl_set_error(FL_EIO, "cannot write the timeline chart '%s': %s", path, strerror(errno));
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
             "font-family=\"sans-serif\" font-size=\"11\">\n", left + width + 20, height);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"%.0f\" y=\"20\" font-size=\"13\">%s</text>\n", left, title ? title : "");
  for (int r = 0; r < ranks; r++) {
    double y = top + r * row_h;
    fprintf(f, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + row_h * 0.65, r);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"#f2f2f2\"/>\n", left, y,
            width, row_h - 4);
    for (size_t i = 0; i < n[r]; i++) {
      const pp_event *e = &events[r][i];
      double x0 = left + e->t0 * scale, w = fmax((e->t1 - e->t0) * scale, 0.5);
      fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\">"
                 "<title>%s mb %d chunk %d: %.3f-%.3f ms</title></rect>\n",
              x0, y, w, row_h - 4, event_colour[e->kind], pp_event_kind_name(e->kind), e->microbatch,
              e->chunk, e->t0 * 1e3, e->t1 * 1e3);
      if ((e->kind == PP_EV_FORWARD || e->kind == PP_EV_BACKWARD) && w > 14)
        fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" font-size=\"9\">%d</text>\n", x0 + 2,
                y + row_h * 0.6, e->microbatch);
    }
  }
  double ay = top + ranks * row_h + 14;
  fprintf(f, "<text x=\"%.0f\" y=\"%.1f\">0</text><text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f ms"
             "</text>\n", left, ay, left + width, ay, seconds * 1e3);
  for (int k = 0; k < PP_EV_KINDS; k++)
    fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" "
               "y=\"%.1f\">%s</text>\n", left + k * 110, ay + 12, event_colour[k], left + k * 110 + 14,
            ay + 21, pp_event_kind_name((pp_event_kind)k));
  fprintf(f, "</svg>\n");
  if (fclose(f) != 0)
    return fl_set_error(FL_EIO, "cannot write the timeline chart '%s': %s", path, strerror(errno));
  return FL_OK;
}
