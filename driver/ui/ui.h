/*
 * ui.h: the web UI, the REST API and the event log (driver/ui/, docs/ui.md), as the driver
 * process, local contexts and `flint history` use them.
 *
 * Everything the UI shows is built from events: JSON objects, one per line of the event log
 * (docs/ui.md lists them). Producers post them from any thread (ui_post); the UI thread applies
 * each to the store (the model the pages and the API read) and appends it to the event log.
 * The history server replays logs into a store of its own, so it shows what the live UI showed.
 *
 * Threading: ui_post and ui_scheduler_note never block (the scheduler calls the latter on its
 * thread); the UI thread applies events; HTTP requests run on the server's thread and read the
 * store under its lock.
 */
#ifndef FLINT_DRIVER_UI_H
#define FLINT_DRIVER_UI_H

#include "driver/scheduler/scheduler.h"

typedef struct ui ui;

typedef struct ui_config {
  const char *host;    /* where the HTTP server binds (the driver's RPC host) */
  int port;            /* 0: a free port; -1: no HTTP server (store and log only) */
  bool port_retries;   /* port is a default: when taken, the next 16 are tried, then a free one */
  const char *secret;  /* requests must carry it (docs/ui.md); NULL or "": none */
  const char *log_dir; /* the event log's folder; NULL or "": no log */
  const char *title;   /* "driver", "local", "history": the pages' heading */
  /* Application ids are "app-<prefix>-<number>"; NULL: "<YYYYMMDDhhmmss>-<pid>". */
  const char *app_prefix;
  /* Optional: live figures that no event carries (executors' last heartbeats, parameter
   * servers' clocks), merged into API answers: called on the HTTP thread with the API path
   * ("executors", "ps") and the application number; returns a JSON text or NULL (malloc'd,
   * the UI frees it). */
  char *(*live)(void *arg, const char *what, uint64_t app);
  void *live_arg;
} ui_config;

/* Starts the UI thread, the event log and (port >= 0) the HTTP server. */
FL_INTERNAL fl_status ui_create(const ui_config *cfg, ui **out);
/* Applies what was posted, closes the log and stops the server. NULL: nothing. */
FL_INTERNAL void ui_destroy(ui *u);
/* The HTTP port, or -1 without a server. */
FL_INTERNAL int ui_port(const ui *u);
/* The id of application `app` ("app-<prefix>-0001"), into buf. */
FL_INTERNAL const char *ui_app_id(const ui *u, uint64_t app, char *buf, size_t cap);

/* Any thread: posts one event, a JSON object as docs/ui.md says, with "App" the
 * application's number (the UI puts its id in its place) and "Time" added when absent.
 * Copied; never blocks. Malformed text is logged and dropped. */
FL_INTERNAL void ui_post(ui *u, const char *json);
FL_INTERNAL void ui_postf(ui *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Posts an application's start and its environment (the settings in force, secrets hidden). */
FL_INTERNAL void ui_post_application(ui *u, uint64_t app, const char *name, const char *master);
/* A program's event (fl_context_post_event) for application `app`: checked (a JSON object
 * of at most UI_PROGRAM_EVENT_MAX bytes whose Event is a Train* event; FL_EINVAL naming what
 * is wrong), then posted with "App" set to `app`. */
#define UI_PROGRAM_EVENT_MAX ((size_t)64 << 10)
FL_INTERNAL fl_status ui_post_program_event(ui *u, uint64_t app, const char *json);
/* Blocks until everything posted before the call is applied (tests, the history server). */
FL_INTERNAL void ui_sync(ui *u);
/* The scheduler's listener (scheduler_set_listener's fn; arg: the ui). */
FL_INTERNAL void ui_scheduler_note(void *arg, const sched_note *note);

/* The answer to GET `path` ("/api/v1/..." or a page, with its query), as the HTTP server gives
 * it: the status (200, 404, ...) and the body into *body, its type into *content_type. */
FL_INTERNAL int ui_get(ui *u, const char *path, const char *query, fl_buf *body, const char **content_type);

/* The history server: replays every *.jsonl file of `dir` into the store (a truncated last
 * line is skipped with a warning). FL_EIO naming the folder when it cannot be read. */
FL_INTERNAL fl_status ui_history_load(ui *u, const char *dir);

/* Appends `s` to *out as a JSON string (quotes and escapes), for producers of events. */
FL_INTERNAL fl_status ui_json_string(fl_buf *out, const char *s);

#endif /* FLINT_DRIVER_UI_H */
