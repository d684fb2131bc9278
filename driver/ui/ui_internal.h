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

/* ---- the store (store.c) ----------------------------------------------------------------- */
typedef struct ui_store ui_store;
FL_INTERNAL fl_status store_create(ui_store **out);
FL_INTERNAL void store_destroy(ui_store *s);
/* Applies one event (its "App" already the application's id). Unknown events are ignored;
 * events of unknown applications make them. Locks the store. */
FL_INTERNAL void store_apply(ui_store *s, json_t *event);
FL_INTERNAL void store_lock(ui_store *s);
FL_INTERNAL void store_unlock(ui_store *s);

/* ---- the REST API (api.c) ---------------------------------------------------------------- */
/* The value at `path` (what follows /api/v1, e.g. "/applications/app-1-0001/jobs"): a new
 * reference, or NULL with *status set (404 unknown, 400 malformed). Locks the store. */
typedef json_t *(*ui_api_fn)(void *arg, const char *path, int *status);
FL_INTERNAL json_t *api_get(void *ui, const char *path, int *status);

/* ---- pages (pages.c, svg.c) -------------------------------------------------------------- */
/* Renders page `path` ("/", "/jobs/", "/stage/", ...; docs/ui.md) with its query string
 * ("app=...&id=3", or NULL) into *html, reading everything through api(arg, ...). Returns
 * the HTTP status: 200, or 404 with a small error page for an unknown page, application, job
 * or stage. `title`: the heading ("driver", "local", "history"). */
FL_INTERNAL int pages_render(ui_api_fn api, void *arg, const char *title, const char *path, const char *query,
                             fl_buf *html);

#endif /* FLINT_DRIVER_UI_INTERNAL_H */
