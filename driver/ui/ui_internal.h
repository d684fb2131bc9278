/*
 * ui_internal.h: inside the web UI (driver/ui/): how its files call each other.
 *
 *   ui.c         the UI thread (posted events in, store and log out) and the HTTP routes
 *   events.c     the scheduler's notes as event lines; JSON text helpers
 *   store.c      the model the events build: applications, jobs, stages, tasks, executors,
 *                cached datasets, parameter-server tables, training runs
 *   api.c        the REST API (/api/v1) over the store, as JSON values
 *   pages.c      the HTML pages, read from the API's values
 *   svg.c        the pages' inline charts: timelines, curves, the stages' DAG
 *   html.c       the pages' output: a growing buffer and the one escaping
 *   event_log.c  the event log: one file per application; replay for the history server
 */
#ifndef FLINT_DRIVER_UI_INTERNAL_H
#define FLINT_DRIVER_UI_INTERNAL_H

#include <jansson.h>

#include "driver/ui/ui.h"

/* ---- events (events.c) ------------------------------------------------------------------- */
/* The wall clock in ms since the epoch (events' "Time"). */
FL_INTERNAL uint64_t ui_wall_ms(void);
/* A job's start (SCHED_JOB_STARTED) as an event line, with "App" the application's number,
 * appended to *b: on the scheduler's thread, as the note's stages are borrowed. */
FL_INTERNAL bool ui_job_started_line(const sched_note *n, fl_buf *b);
/* An application's start, and its environment (the settings in force, secrets hidden), as
 * event lines appended to *b (NUL-terminated). */
FL_INTERNAL bool ui_application_start_line(uint64_t app, const char *name, const char *master, fl_buf *b);
FL_INTERNAL bool ui_environment_line(uint64_t app, fl_buf *b);
/* Any other note as its event (a new JSON object, "App" the application's number; NULL when
 * out of memory): on the UI thread. */
FL_INTERNAL json_t *ui_note_event(const sched_note *n);
/* "PROCESS_LOCAL", "NODE_LOCAL", "ANY"; "SUCCESS", "KILLED" (FL_ECANCELLED), "FAILED". */
FL_INTERNAL const char *ui_locality_name(uint8_t locality);
FL_INTERNAL const char *ui_task_status(fl_status status);

/* ---- the store (store.c) ----------------------------------------------------------------- */
typedef struct ui_store ui_store;
FL_INTERNAL fl_status store_create(ui_store **out);
FL_INTERNAL void store_destroy(ui_store *s);
/* Applies one event (its "App" already the application's id). Unknown events are ignored;
 * events of unknown applications make them. Locks the store. */
FL_INTERNAL void store_apply(ui_store *s, json_t *event);
/* A task's start or end as its note says (the live path: the same as store_apply of the
 * note's event, without making the event). */
FL_INTERNAL void store_apply_task(ui_store *s, const char *app_id, const sched_note *n, uint64_t time_ms);
FL_INTERNAL void store_lock(ui_store *s);
FL_INTERNAL void store_unlock(ui_store *s);
/* The applications, id -> the store's record (under the store's lock; borrowed). */
FL_INTERNAL json_t *store_apps(ui_store *s);
/* The driver's live executors as ExecutorAdded events (a new array; locks the store): what a
 * new application's event log begins with. */
FL_INTERNAL json_t *store_live_executors(ui_store *s);

/* ---- the REST API (api.c) ---------------------------------------------------------------- */
/* The value at `path` (what follows /api/v1, e.g. "/applications/app-1-0001/jobs"): a new
 * reference, or NULL with *status set (404 unknown, 400 malformed). Locks the store. */
typedef json_t *(*ui_api_fn)(void *arg, const char *path, int *status);
/* arg: the ui. live: its ui_config.live (NULL: none). */
FL_INTERNAL json_t *api_get(void *ui, const char *path, int *status);
/* The same; with `text`, the answer is appended to *text as compact JSON instead (NULL is
 * returned, *status 200 when it was written). */
FL_INTERNAL json_t *api_answer(ui_store *s, char *(*live)(void *, const char *, uint64_t), void *live_arg,
                               const char *path, int *status, fl_buf *text);

/* ---- pages (pages.c, svg.c) -------------------------------------------------------------- */
/* Renders page `path` ("/", "/jobs/", "/stage/", ...; docs/ui.md) with its query string
 * ("app=...&id=3", or NULL) into *html, reading everything through api(arg, ...). Returns
 * the HTTP status: 200, or 404 with a small error page for an unknown page, application, job
 * or stage. `title`: the heading ("driver", "local", "history"). */
FL_INTERNAL int pages_render(ui_api_fn api, void *arg, const char *title, const char *path, const char *query,
                             fl_buf *html);

/* The pages' output: HTML (and its inline SVG) appended to `buf`. The first failure (out of
 * memory) is kept in `st` and every later write does nothing, so a page is written straight
 * through and checked once at the end. `ids` numbers the SVG definitions of one page. */
typedef struct ui_out {
  fl_buf *buf;
  fl_status st;
  unsigned ids;
} ui_out;
/* Appends `s` as is: markup of the pages' own, never text from the API. */
FL_INTERNAL void pages_put(ui_out *o, const char *s);
/* The same, n bytes. */
FL_INTERNAL void pages_append(ui_out *o, const char *s, size_t n);
/* Appends formatted markup as is: numbers and the pages' own strings only (no %s of text
 * from the API: that goes through pages_escape). No length limit. */
FL_INTERNAL void pages_printf(ui_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends text escaped for HTML content and quoted attribute values (& < > " '). NULL: "". The
 * one escaping helper of pages.c and svg.c: every name, error and value from the API goes
 * through it. */
FL_INTERNAL void pages_escape(ui_out *o, const char *s);

/* ---- charts (svg.c): inline SVG, sized in pixels, with <title> tooltips ------------------ */
/* A line chart: one polyline per series with one point per finite (x, y) pair, axes with
 * about five "nice" ticks each and their labels. No points at all: the axes and "no data".
 * A series longer than SVG_MAX_POINTS is thinned to every k-th point (and its last). */
#define SVG_MAX_POINTS 2000
typedef struct svg_series {
  const char *name;  /* the legend's text */
  const char *color; /* a CSS colour */
  const double *x, *y;
  size_t n;
} svg_series;
FL_INTERNAL void svg_line_chart(ui_out *o, const char *title, const char *x_label, const char *y_label,
                                const svg_series *series, size_t n_series);

/* A timeline (Gantt chart): labelled rows, bars on them from start to end (same unit as the
 * axis: milliseconds; the axis counts from t0). A bar's label is drawn inside it when it
 * fits; its tip is the tooltip; href (optional) makes it a link. */
typedef struct svg_bar {
  size_t row;
  double start, end;
  const char *color;
  const char *label; /* NULL: none */
  const char *tip;   /* NULL: none */
  const char *href;  /* NULL: none */
} svg_bar;
FL_INTERNAL void svg_timeline(ui_out *o, const char *title, const char *const *rows, size_t n_rows,
                              const svg_bar *bars, size_t n_bars, double t0, double t1);

/* A DAG drawn top to bottom: nodes are boxes placed by layer (0 at the top), left to right in
 * their order within a layer; each edge an arrow from node `from` to node `to`. */
typedef struct svg_node {
  int layer;
  const char *label;
  const char *sub;   /* a second, smaller line; NULL: none */
  const char *href;  /* NULL: none */
  const char *color; /* the box's fill; NULL: a default */
} svg_node;
typedef struct svg_edge {
  size_t from, to;
} svg_edge;
FL_INTERNAL void svg_dag(ui_out *o, const svg_node *nodes, size_t n_nodes, const svg_edge *edges, size_t n_edges);

/* ---- the event log (event_log.c) --------------------------------------------------------- */
typedef struct event_log event_log;
/* Makes the folder when missing. */
FL_INTERNAL fl_status event_log_open(const char *dir, event_log **out);
FL_INTERNAL void event_log_close(event_log *l);
/* Appends `line` to application app's file (ApplicationStart opens it, ApplicationEnd closes
 * it); app NULL: to every open application's. */
FL_INTERNAL void event_log_write(event_log *l, const char *app, const char *kind, const char *line, size_t len);
/* Applies each event of the file in order (borrowed); a truncated last line or a malformed one
 * is skipped with a warning. FL_ENOENT / FL_EIO when the file cannot be read. */
FL_INTERNAL fl_status event_log_replay(const char *path, void (*apply)(void *arg, json_t *event), void *arg);
/* Replays every *.jsonl of `dir` in name order; *files: how many were read. */
FL_INTERNAL fl_status event_log_replay_dir(const char *dir, void (*apply)(void *arg, json_t *event), void *arg,
                                           uint32_t *files);

#endif /* FLINT_DRIVER_UI_INTERNAL_H */
