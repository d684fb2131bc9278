/*
 * ui.c: the UI's life (ui.h): the UI thread, which takes posted event lines in order, gives
 * each application's number its id, applies the event to the store and appends it to the
 * event log; and the HTTP routes: /api/v1/... (api.c) and the pages (pages.c).
 *
 * The UI must cost the scheduler nothing measurable (bench_cluster's ui_overhead row). So a
 * task's note is copied as it is (a memcpy, no formatting) onto a list under a mutex that
 * nobody waits on, posting wakes no thread, and the UI thread, at the lowest priority, takes
 * the whole list every UI_DRAIN_MS: formatting, parsing, the store and the disk are its own
 * work, done when a core is spare. Events reach the pages within that period.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "driver/ui/ui_internal.h"
#include "net/net.h"

/* How often the UI thread takes what was posted. */
#define UI_DRAIN_MS 10
/* The most of a task's error message that its note keeps. */
#define UI_NOTE_ERROR_MAX 1024
/* Task notes waiting for the UI thread beyond which new ones are dropped (counted, and said
 * once a drain): the UI thread runs only on a spare core, and a machine kept busy for long must
 * not grow the queue without bound (Spark's listener bus drops events the same way). */
#define UI_QUEUE_MAX 200000

typedef struct ui_node {
  struct ui_node *next;
  uint64_t time_ms;
  common_event *sync; /* a ui_sync marker */
  bool is_note;       /* a task's note (note), else an event's text */
  sched_note note;    /* note.error points into text */
  size_t len;
  char text[];
} ui_node;

struct ui {
  char prefix[48];
  char *title;
  char *(*live)(void *arg, const char *what, uint64_t app);
  void *live_arg;
  pthread_mutex_t lock; /* posted: head..tail, oldest first */
  ui_node *head, *tail;
  size_t queued;    /* nodes on the list */
  uint64_t dropped; /* task notes dropped for a full list, not yet said */
  atomic_bool stopping;
  pthread_t thread;
  bool started;
  ui_store *store;
  event_log *log;
  http_server *http;
};

static void enqueue(ui *u, ui_node *n) {
  n->next = NULL;
  FL_PCHECK(pthread_mutex_lock(&u->lock));
  bool drop = n->is_note && u->queued >= UI_QUEUE_MAX &&
              (n->note.kind == SCHED_TASK_STARTED || n->note.kind == SCHED_TASK_ENDED);
  if (drop) {
    u->dropped++;
  } else {
    if (u->tail) u->tail->next = n;
    else u->head = n;
    u->tail = n;
    u->queued++;
  }
  FL_PCHECK(pthread_mutex_unlock(&u->lock));
  if (drop) common_free(n);
}

const char *ui_app_id(const ui *u, uint64_t app, char *buf, size_t cap) {
  snprintf(buf, cap, "app-%s-%04llu", u->prefix, (unsigned long long)app);
  return buf;
}

static void post_text(ui *u, const char *text, size_t len) {
  ui_node *n = common_malloc(sizeof *n + len + 1);
  if (!n) {
    common_log(LOG_WARN, "web UI: out of memory: an event is lost");
    return;
  }
  n->time_ms = ui_wall_ms();
  n->sync = NULL;
  n->is_note = false;
  n->len = len;
  memcpy(n->text, text, len);
  n->text[len] = 0;
  enqueue(u, n);
}

void ui_post(ui *u, const char *json) {
  if (u && json) post_text(u, json, strlen(json));
}

void ui_postf(ui *u, const char *fmt, ...) {
  if (!u) return;
  va_list ap;
  va_start(ap, fmt);
  char *text = NULL;
  int n = vasprintf(&text, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  post_text(u, text, (size_t)n);
  free(text);
}

void ui_scheduler_note(void *arg, const sched_note *note) {
  ui *u = arg;
  if (note->kind == SCHED_JOB_STARTED) { /* rare, and its stages are borrowed: formatted now */
    fl_buf line = FL_BUF_INIT;
    if (ui_job_started_line(note, &line)) post_text(u, (const char *)line.data, line.len);
    fl_buf_free(&line);
    return;
  }
  size_t len = note->error ? strnlen(note->error, UI_NOTE_ERROR_MAX) : 0;
  ui_node *n = common_malloc(sizeof *n + len + 1);
  if (!n) return;
  n->time_ms = ui_wall_ms();
  n->sync = NULL;
  n->is_note = true;
  n->note = *note;
  n->len = len;
  if (len) memcpy(n->text, note->error, len);
  n->text[len] = 0;
  n->note.error = note->error ? n->text : NULL;
  n->note.stages = NULL;
  enqueue(u, n);
}

void ui_post_application(ui *u, uint64_t app, const char *name, const char *master) {
  if (!u) return;
  fl_buf b = FL_BUF_INIT;
  if (ui_application_start_line(app, name, master, &b)) ui_post(u, (const char *)b.data);
  b.len = 0;
  if (ui_environment_line(app, &b)) ui_post(u, (const char *)b.data);
  fl_buf_free(&b);
}

void ui_sync(ui *u) {
  common_event done;
  common_event_init(&done);
  ui_node *n = common_calloc(1, sizeof *n);
  if (!n) {
    common_event_destroy(&done);
    return;
  }
  n->sync = &done;
  enqueue(u, n);
  common_event_wait(&done, 0);
  common_event_destroy(&done);
}

/* Applies one event: "App" becomes the application's id, "Time" is added when absent, then
 * the store takes it and the log writes it as it now reads. */
static void apply_event(ui *u, json_t *ev, uint64_t time_ms) {
  json_t *app = json_object_get(ev, "App");
  char id[96];
  if (json_is_integer(app)) {
    ui_app_id(u, (uint64_t)json_integer_value(app), id, sizeof id);
    json_object_set_new(ev, "App", json_string(id));
  }
  if (!json_object_get(ev, "Time")) json_object_set_new(ev, "Time", json_integer((json_int_t)time_ms));
  store_apply(u->store, ev);
  if (!u->log) return;
  const char *app_id = json_string_value(json_object_get(ev, "App"));
  const char *kind = json_string_value(json_object_get(ev, "Event"));
  char *line = json_dumps(ev, JSON_COMPACT);
  if (!line) return;
  event_log_write(u->log, app_id, kind, line, strlen(line));
  free(line);
  /* A new application's log begins with the executors it starts with. */
  if (app_id && strcmp(kind, "ApplicationStart") == 0) {
    json_t *execs = store_live_executors(u->store), *x;
    size_t i;
    json_array_foreach(execs, i, x) {
      json_t *copy = json_copy(x);
      json_object_set_new(copy, "App", json_string(app_id));
      char *text = json_dumps(copy, JSON_COMPACT);
      if (text) event_log_write(u->log, app_id, "ExecutorAdded", text, strlen(text));
      free(text);
      json_decref(copy);
    }
    json_decref(execs);
  }
}

static void take(ui *u, ui_node *n) {
  if (n->sync) {
    common_event_set(n->sync);
    return;
  }
  if (n->is_note && !u->log &&
      (n->note.kind == SCHED_TASK_STARTED || n->note.kind == SCHED_TASK_ENDED)) {
    /* the most frequent notes, with no log to write: straight into the store */
    char id[96];
    store_apply_task(u->store, ui_app_id(u, n->note.group, id, sizeof id), &n->note, n->time_ms);
    return;
  }
  if (n->is_note) {
    json_t *ev = ui_note_event(&n->note);
    if (ev) apply_event(u, ev, n->time_ms);
    json_decref(ev);
    return;
  }
  json_error_t err;
  json_t *ev = json_loadb(n->text, n->len, 0, &err);
  if (json_is_object(ev) && json_is_string(json_object_get(ev, "Event")))
    apply_event(u, ev, n->time_ms);
  else
    common_log(LOG_WARN, "web UI: a malformed event is dropped (%s): %.80s", err.text, n->text);
  json_decref(ev);
}

static void *ui_main(void *arg) {
  ui *u = arg;
  pthread_setname_np(pthread_self(), "fl-ui");
  /* the lowest priority: the UI waits for a spare core, never the scheduler for it */
  struct sched_param none = {0};
  if (sched_setscheduler(0, SCHED_IDLE, &none) != 0) setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  for (;;) {
    bool stopping = atomic_load(&u->stopping);
    FL_PCHECK(pthread_mutex_lock(&u->lock));
    ui_node *n = u->head;
    u->head = u->tail = NULL;
    u->queued = 0;
    uint64_t dropped = u->dropped;
    u->dropped = 0;
    FL_PCHECK(pthread_mutex_unlock(&u->lock));
    if (dropped)
      common_log(LOG_WARN, "web UI: %llu task events dropped: the UI thread had no spare core to take them "
                 "(the pages miss those tasks)", (unsigned long long)dropped);
    while (n) {
      ui_node *next = n->next;
      take(u, n);
      common_free(n);
      n = next;
    }
    if (stopping) return NULL; /* what was posted before ui_destroy is applied */
    usleep(UI_DRAIN_MS * 1000);
  }
}

json_t *api_get(void *arg, const char *path, int *status) {
  ui *u = arg;
  return api_answer(u->store, u->live, u->live_arg, path, status, NULL);
}

int ui_get(ui *u, const char *path, const char *query, fl_buf *body, const char **content_type) {
  static const char api_prefix[] = "/api/v1";
  if (strncmp(path, api_prefix, sizeof api_prefix - 1) == 0 &&
      (path[sizeof api_prefix - 1] == '/' || path[sizeof api_prefix - 1] == 0)) {
    int status = 200;
    api_answer(u->store, u->live, u->live_arg, path + sizeof api_prefix - 1, &status, body);
    *content_type = "application/json";
    if (status != 200) {
      char what[600];
      snprintf(what, sizeof what, "no such resource: %.500s", path);
      body->len = 0;
      if (common_buf_printf(body, "{\"error\":") != FL_OK || ui_json_string(body, what) != FL_OK ||
          common_buf_printf(body, "}") != FL_OK)
        body->len = 0;
    }
    return status;
  }
  *content_type = "text/html; charset=utf-8";
  return pages_render(api_get, u, u->title, path, query, body);
}

static int http_get(void *arg, const char *path, const char *query, fl_buf *body, const char **content_type) {
  return ui_get(arg, path, query, body, content_type);
}

/* Binds the HTTP server: at cfg->port, else (a default port taken) at the next ones, as
 * Spark's UI does, else at a free port. */
static fl_status start_http(ui *u, const ui_config *cfg) {
  http_server_config hc = {.host = cfg->host, .port = cfg->port, .secret = cfg->secret, .get = http_get, .arg = u};
  fl_status st = http_server_start(&hc, &u->http);
  for (int i = 1; st == FL_ENET && cfg->port > 0 && cfg->port_retries && i <= 16; i++) {
    hc.port = cfg->port + i;
    st = http_server_start(&hc, &u->http);
  }
  if (st == FL_ENET && cfg->port > 0 && cfg->port_retries) {
    common_log(LOG_WARN, "web UI: ports %d to %d are taken: using a free one", cfg->port, cfg->port + 16);
    hc.port = 0;
    st = http_server_start(&hc, &u->http);
  }
  return st;
}

fl_status ui_create(const ui_config *cfg, ui **out) {
  *out = NULL;
  ui *u = common_calloc(1, sizeof *u);
  if (!u) return FL_ERR(FL_ENOMEM, "out of memory");
  fl_status status = FL_OK;
  FL_PCHECK(pthread_mutex_init(&u->lock, NULL));
  if (cfg->app_prefix) {
    snprintf(u->prefix, sizeof u->prefix, "%s", cfg->app_prefix);
  } else {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d%H%M%S", &tm);
    snprintf(u->prefix, sizeof u->prefix, "%s-%d", stamp, (int)getpid());
  }
  u->title = common_strdup(cfg->title ? cfg->title : "flint");
  u->live = cfg->live;
  u->live_arg = cfg->live_arg;
  if (!u->title) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory"));
  FL_CHECK(store_create(&u->store));
  if (cfg->log_dir && *cfg->log_dir) FL_CHECK(event_log_open(cfg->log_dir, &u->log));
  if (pthread_create(&u->thread, NULL, ui_main, u) != 0) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the UI thread"));
  u->started = true;
  if (cfg->port >= 0) FL_CHECK(start_http(u, cfg));
  *out = u;
  return FL_OK;
cleanup:
  ui_destroy(u);
  return status;
}

int ui_port(const ui *u) { return u && u->http ? http_server_port(u->http) : -1; }

void ui_destroy(ui *u) {
  if (!u) return;
  http_server_stop(u->http); /* no request reads the store any more */
  atomic_store(&u->stopping, true);
  if (u->started) FL_PCHECK(pthread_join(u->thread, NULL));
  for (ui_node *n = u->head, *next; n; n = next) {
    next = n->next;
    common_free(n);
  }
  pthread_mutex_destroy(&u->lock);
  event_log_close(u->log);
  store_destroy(u->store);
  common_free(u->title);
  common_free(u);
}

static void replay_apply(void *arg, json_t *ev) {
  ui *u = arg;
  if (!json_object_get(ev, "App") || json_is_string(json_object_get(ev, "App"))) store_apply(u->store, ev);
}

fl_status ui_history_load(ui *u, const char *dir) {
  uint32_t files = 0;
  fl_status st = event_log_replay_dir(dir, replay_apply, u, &files);
  if (st == FL_OK) common_log(LOG_INFO, "history: %u event logs read from %s", files, dir);
  return st;
}

fl_status ui_post_program_event(ui *u, uint64_t app, const char *json) {
  static const char *const allowed[] = {"TrainStart", "TrainStep", "TrainPipeline", "TrainEnd"};
  size_t len = strlen(json);
  if (len > UI_PROGRAM_EVENT_MAX)
    return FL_ERR(FL_EINVAL, "an event of %zu bytes (at most %zu)", len, UI_PROGRAM_EVENT_MAX);
  json_error_t err;
  json_t *ev = json_loadb(json, len, 0, &err);
  if (!json_is_object(ev)) {
    json_decref(ev);
    return FL_ERR(FL_EINVAL, "an event is not a JSON object: %s at column %d", ev ? "another value" : err.text,
                  err.column);
  }
  const char *kind = json_string_value(json_object_get(ev, "Event"));
  bool ok = false;
  for (size_t i = 0; kind && i < sizeof allowed / sizeof *allowed; i++) ok = ok || strcmp(kind, allowed[i]) == 0;
  if (!ok) {
    fl_status st = FL_ERR(FL_EINVAL, "event '%s' is not one a program may post (TrainStart, TrainStep, "
                          "TrainPipeline, TrainEnd)", kind ? kind : "(no Event field)");
    json_decref(ev);
    return st;
  }
  json_object_set_new(ev, "App", json_integer((json_int_t)app));
  char *text = json_dumps(ev, JSON_COMPACT);
  json_decref(ev);
  if (!text) return FL_ERR(FL_ENOMEM, "out of memory");
  ui_post(u, text);
  free(text);
  return FL_OK;
}
