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
 *   event_log.c  the event log: one file per application; replay for the history server
 */
#ifndef FLINT_DRIVER_UI_INTERNAL_H
#define FLINT_DRIVER_UI_INTERNAL_H

#include <jansson.h>

#include "driver/ui/ui.h"

/* ---- events (events.c) ------------------------------------------------------------------- */
/* The wall clock in ms since the epoch (events' "Time"). */
FL_INTERNAL uint64_t ui_wall_ms(void);
/* A note as an event line (with "App" the application's number), appended to *b. */
FL_INTERNAL bool ui_note_line(const sched_note *n, fl_buf *b);

/* ---- the store (store.c) ----------------------------------------------------------------- */
typedef struct ui_store ui_store;
FL_INTERNAL fl_status store_create(ui_store **out);
FL_INTERNAL void store_destroy(ui_store *s);
/* Applies one event (its "App" already the application's id). Unknown events are ignored;
 * events of unknown applications make them. Locks the store. */
FL_INTERNAL void store_apply(ui_store *s, json_t *event);
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
FL_INTERNAL json_t *api_answer(ui_store *s, char *(*live)(void *, const char *, uint64_t), void *live_arg,
                               const char *path, int *status);

/* ---- pages (pages.c, svg.c) -------------------------------------------------------------- */
/* Renders page `path` ("/", "/jobs/", "/stage/", ...; docs/ui.md) with its query string
 * ("app=...&id=3", or NULL) into *html, reading everything through api(arg, ...). Returns
 * the HTTP status: 200, or 404 with a small error page for an unknown page, application, job
 * or stage. `title`: the heading ("driver", "local", "history"). */
FL_INTERNAL int pages_render(ui_api_fn api, void *arg, const char *title, const char *path, const char *query,
                             fl_buf *html);

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
