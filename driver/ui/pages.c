/*
 * pages.c: the web UI's HTML pages (docs/ui.md "Pages"), rendered on the server from the REST
 * API's JSON values: applications, jobs, one job, one stage (DAG, tasks, timeline), storage,
 * executors, environment, parameter-server tables and training runs. Plain HTML with a little
 * inline CSS and inline SVG (svg.c); no script and nothing fetched from elsewhere.
 *
 * Pages read only through the api function (never the store), so they show what /api/v1
 * shows. Each page fetches what it needs first and answers 404 (a small error page) when the
 * API knows no such application, job or stage. Every text that comes from the API is written
 * through pages_escape; markup is written with pages_put and pages_printf, whose %s only ever
 * take the pages' own strings. Output grows an fl_buf, so no value can overflow a buffer; an
 * allocation failure is kept in the ui_out and turns the answer into a 500.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver/ui/ui_internal.h"

/* Past these, a timeline shows only the newest jobs or the first tasks. */
#define TIMELINE_MAX_JOBS 200
#define TIMELINE_MAX_TASKS 1000
/* Rows of a jobs' or tasks' table per page (?page=N). */
#define TABLE_ROWS 500

/* ---- one request -------------------------------------------------------------------------- */

typedef struct page {
  ui_out o;
  size_t start; /* where this page's text starts in the buffer */
  ui_api_fn api;
  void *arg;
  const char *title; /* "driver", "local", "history" */
  bool live;         /* not the history server: pages refresh themselves */
  const char *query;
  char *app;          /* the query's app ("current" when absent), checked by app_ok */
  const char *app_id; /* for links: the resolved id when known, else app */
  json_t *app_info;   /* the application's object, or NULL */
  json_t **held;      /* API answers, released at the end */
  size_t n_held, cap_held;
  char **strs; /* strings made for charts and links, freed at the end */
  size_t n_strs, cap_strs;
} page;

/* The array `arr` of n items of `size` bytes with room for one more: arr itself, or a larger
 * copy (*cap updated); NULL when out of memory (arr stays valid). */
static void *grow(void *arr, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return arr;
  size_t c = *cap ? *cap * 2 : 16;
  void *a = fl_realloc(arr, c * size);
  if (a) *cap = c;
  return a;
}

/* A string that lives until the page is done; NULL (and the page fails) when out of memory. */
static char *page_strf(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *page_strf(page *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *s = n < 0 ? NULL : fl_malloc((size_t)n + 1);
  char **strs = s ? grow(p->strs, &p->cap_strs, p->n_strs, sizeof *p->strs) : NULL;
  if (!strs) {
    fl_free(s);
    if (p->o.st == FL_OK) p->o.st = FL_ENOMEM;
    return NULL;
  }
  p->strs = strs;
  va_start(ap, fmt);
  vsnprintf(s, (size_t)n + 1, fmt, ap);
  va_end(ap);
  p->strs[p->n_strs++] = s;
  return s;
}

/* The API's value at the formatted path (held until the page is done), or NULL. */
static json_t *get(page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static json_t *get(page *p, const char *fmt, ...) {
  char path[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(path, sizeof path, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof path) return NULL; /* app ids are checked short; never here */
  int status = 0;
  json_t *v = p->api(p->arg, path, &status);
  if (!v) return NULL;
  json_t **held = grow(p->held, &p->cap_held, p->n_held, sizeof *p->held);
  if (!held) {
    json_decref(v);
    if (p->o.st == FL_OK) p->o.st = FL_ENOMEM;
    return NULL;
  }
  p->held = held;
  p->held[p->n_held++] = v;
  return v;
}

static json_t *get_array(page *p, const char *fmt, const char *app) {
  json_t *v = get(p, fmt, app);
  return json_is_array(v) ? v : NULL;
}

/* ---- the query ---------------------------------------------------------------------------- */

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* The decoded value of `key` in the page's query ("a=1&b=2"), malloc'd; NULL when absent (or
 * out of memory, which fails the page). */
static char *query_get(page *p, const char *key) {
  size_t klen = strlen(key);
  for (const char *q = p->query; q && *q;) {
    const char *end = q + strcspn(q, "&;");
    if ((size_t)(end - q) > klen && !strncmp(q, key, klen) && q[klen] == '=') {
      const char *v = q + klen + 1;
      char *out = fl_malloc((size_t)(end - v) + 1), *w = out;
      if (!out) {
        if (p->o.st == FL_OK) p->o.st = FL_ENOMEM;
        return NULL;
      }
      while (v < end) {
        if (*v == '%' && end - v >= 3 && hex_digit(v[1]) >= 0 && hex_digit(v[2]) >= 0) {
          char c = (char)(hex_digit(v[1]) * 16 + hex_digit(v[2]));
          *w++ = c ? c : '?'; /* a NUL would cut the value short */
          v += 3;
        } else {
          *w++ = *v == '+' ? ' ' : *v;
          v++;
        }
      }
      *w = '\0';
      return out;
    }
    q = *end ? end + 1 : end;
  }
  return NULL;
}

static bool unreserved(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~';
}

/* Application ids go into API paths as they are: URL-safe characters only, and short. */
static bool app_ok(const char *app) {
  size_t n = strlen(app);
  if (!n || n > 200) return false;
  for (size_t i = 0; i < n; i++)
    if (!unreserved(app[i])) return false;
  return true;
}

/* A job or stage number: decimal digits that fit an int64. */
static bool id_ok(const char *s, long long *out) {
  if (!s || !*s) return false;
  long long v = 0;
  for (const char *c = s; *c; c++) {
    if (*c < '0' || *c > '9' || v > (LLONG_MAX - (*c - '0')) / 10) return false;
    v = v * 10 + (*c - '0');
  }
  *out = v;
  return true;
}

/* ---- reading JSON values ------------------------------------------------------------------ */

static const char *jstr(const json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* A number field as a double; NaN when absent or not a number. */
static double jnum(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

/* An integer field; `dflt` when absent. Reals are clamped into int64's range. */
static long long jint(const json_t *o, const char *key, long long dflt) {
  json_t *v = json_object_get(o, key);
  if (json_is_integer(v)) return json_integer_value(v);
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (!(d == d)) return dflt;
    return d >= 9.2e18 ? (long long)9.2e18 : d <= -9.2e18 ? (long long)-9.2e18 : (long long)d;
  }
  return dflt;
}

static bool jbool(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

/* A time field in milliseconds since the epoch: a number, or Spark's text
 * ("2026-11-28T18:05:12.345GMT"); NaN when absent or negative (the store's -1: not yet). */
static double jtime(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (json_is_number(v)) return json_number_value(v) >= 0 ? json_number_value(v) : NAN; /* -1: not yet */
  const char *s = json_string_value(v);
  if (!s) return NAN;
  struct tm tm = {0};
  int ms = 0;
  if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
             &ms) < 6)
    return NAN;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return (double)timegm(&tm) * 1000.0 + ms;
}

static bool ok(double v) { return isfinite(v); }

/* The id field of an object as text into buf (number or string). */
static const char *jid(const json_t *o, const char *key, char *buf, size_t cap) {
  json_t *v = json_object_get(o, key);
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_integer(v)) {
    snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    return buf;
  }
  if (json_is_real(v)) {
    snprintf(buf, cap, "%.17g", json_real_value(v));
    return buf;
  }
  return "";
}

/* ---- formatted values --------------------------------------------------------------------- */

static void put_time(ui_out *o, double ms) {
  /* Times past year 9999 or before 1970 are printed as numbers (no time_t overflow). */
  if (!ok(ms) || ms <= 0) {
    pages_put(o, "-");
    return;
  }
  if (ms >= 253402300800000.0) {
    pages_printf(o, "%.15g ms", ms);
    return;
  }
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  char buf[64];
  if (!gmtime_r(&t, &tm) || !strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm)) {
    pages_printf(o, "%.15g ms", ms);
    return;
  }
  pages_put(o, buf);
}

static void put_duration(ui_out *o, double ms) {
  if (!ok(ms) || ms < 0)
    pages_put(o, "-");
  else if (ms < 1000)
    pages_printf(o, "%.0f ms", ms);
  else if (ms < 60e3)
    pages_printf(o, "%.1f s", ms / 1e3);
  else if (ms < 3600e3)
    pages_printf(o, "%.1f min", ms / 60e3);
  else
    pages_printf(o, "%.4g h", ms / 3600e3);
}

static void put_bytes(ui_out *o, double v) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (!ok(v) || v < 0) {
    pages_put(o, "-");
    return;
  }
  if (v < 1024) {
    pages_printf(o, "%.0f B", v);
    return;
  }
  int u = -1;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  pages_printf(o, v < 1e6 ? "%.1f %s" : "%.4g %s", v, units[u]);
}

/* Any JSON value as text: strings escaped, numbers as they are, containers as compact JSON. */
static void put_json(ui_out *o, const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_STRING: pages_escape(o, json_string_value(v)); break;
  case JSON_INTEGER: pages_printf(o, "%lld", (long long)json_integer_value(v)); break;
  case JSON_REAL: pages_printf(o, "%.6g", json_real_value(v)); break;
  case JSON_TRUE: pages_put(o, "true"); break;
  case JSON_FALSE: pages_put(o, "false"); break;
  case JSON_OBJECT:
  case JSON_ARRAY: {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s && o->st == FL_OK) o->st = FL_ENOMEM;
    pages_escape(o, s);
    free(s);
    break;
  }
  default: pages_put(o, "-");
  }
}

static void put_field(ui_out *o, const json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  if (v)
    put_json(o, v);
  else
    pages_put(o, "-");
}

/* A status as a coloured badge; the class comes from our own table, the text is escaped. */
static const char *status_class(const char *s) {
  static const struct {
    const char *status, *cls;
  } map[] = {{"RUNNING", "run"}, {"ACTIVE", "run"},     {"SUCCEEDED", "ok"},  {"SUCCESS", "ok"},
             {"COMPLETE", "ok"}, {"FINISHED", "ok"},    {"FAILED", "bad"},    {"KILLED", "kill"},
             {"PENDING", "pend"}, {"SKIPPED", "pend"}};
  for (size_t i = 0; s && i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(s, map[i].status)) return map[i].cls;
  return "pend";
}

static const char *status_color(const char *s) {
  const char *c = status_class(s);
  if (!strcmp(c, "ok")) return "#5cb85c";
  if (!strcmp(c, "bad")) return "#d9534f";
  if (!strcmp(c, "kill")) return "#999999";
  if (!strcmp(c, "run")) return "#4a90d9";
  return "#c8c8c8";
}

static void put_status(ui_out *o, const char *s) {
  pages_printf(o, "<span class=\"st %s\">", status_class(s));
  pages_escape(o, s ? s : "UNKNOWN");
  pages_put(o, "</span>");
}

/* A small progress bar: done of total, with the active and failed counts beside it. */
static void put_progress(ui_out *o, double done, double total, double active, double failed) {
  double pct = total > 0 && done > 0 ? done / total * 100 : 0;
  if (!(pct <= 100)) pct = 100;
  pages_printf(o, "<div class=\"pb\"><div class=\"pf\" style=\"width:%.1f%%\"></div></div> %.0f/%.0f", pct,
               ok(done) ? done : 0, ok(total) ? total : 0);
  if (ok(active) && active > 0) pages_printf(o, " (%.0f running)", active);
  if (ok(failed) && failed > 0) pages_printf(o, " <span class=\"err\">(%.0f failed)</span>", failed);
}

/* An error message: short ones inline, long ones (stack traces) folded. */
static void put_error(ui_out *o, const char *msg) {
  if (!msg || !*msg) return;
  if (strlen(msg) <= 100 && !strchr(msg, '\n')) {
    pages_put(o, "<span class=\"err\">");
    pages_escape(o, msg);
    pages_put(o, "</span>");
    return;
  }
  char head[81];
  size_t n = strcspn(msg, "\n");
  if (n > 72) n = 72;
  while (n > 0 && (msg[n] & 0xC0) == 0x80) n--; /* not inside a character */
  memcpy(head, msg, n);
  head[n] = '\0';
  pages_put(o, "<details class=\"err\"><summary>");
  pages_escape(o, head);
  pages_put(o, "\xE2\x80\xA6</summary><pre>");
  pages_escape(o, msg);
  pages_put(o, "</pre></details>");
}

/* ---- links -------------------------------------------------------------------------------- */

static void url_encode(ui_out *o, const char *s) {
  static const char hex[] = "0123456789ABCDEF";
  for (; s && *s; s++) {
    if (unreserved(*s)) {
      pages_append(o, s, 1);
    } else {
      char e[3] = {'%', hex[(unsigned char)*s >> 4], hex[*s & 15]};
      pages_append(o, e, 3);
    }
  }
}

/* "/stage/?app=A&id=3[&attempt=1][&page=2]" for the page's application (or `app`), as a page
 * string; -1: no such parameter. */
static char *link_full(page *p, const char *app, const char *path, long long id, long long attempt, long long pg) {
  fl_buf b = FL_BUF_INIT;
  ui_out o = {&b, FL_OK, 0};
  pages_put(&o, path);
  pages_put(&o, "?app=");
  url_encode(&o, app ? app : p->app_id);
  if (id >= 0) pages_printf(&o, "&id=%lld", id);
  if (attempt >= 0) pages_printf(&o, "&attempt=%lld", attempt);
  if (pg >= 0) pages_printf(&o, "&page=%lld", pg);
  pages_append(&o, "", 1);
  char *s = o.st == FL_OK ? page_strf(p, "%s", (char *)b.data) : NULL;
  if (o.st != FL_OK && p->o.st == FL_OK) p->o.st = o.st;
  fl_buf_free(&b);
  return s;
}

static char *link_to(page *p, const char *app, const char *path, long long id, long long attempt) {
  return link_full(p, app, path, id, attempt, -1);
}

static void put_a(page *p, const char *href) {
  pages_put(&p->o, "<a href=\"");
  pages_escape(&p->o, href);
  pages_put(&p->o, "\">");
}

/* ---- long tables, a page at a time (?page=N, from 1) -------------------------------------- */

/* The rows [*from, *to) of n that the query's page shows (the last page past the end). */
static void pager_range(page *p, size_t n, size_t *from, size_t *to) {
  char *text = query_get(p, "page");
  long long k = 1;
  if (!id_ok(text, &k) || k < 1) k = 1;
  fl_free(text);
  size_t pages = n ? (n + TABLE_ROWS - 1) / TABLE_ROWS : 1;
  if ((unsigned long long)k > pages) k = (long long)pages;
  *from = ((size_t)k - 1) * TABLE_ROWS;
  *to = n - *from < TABLE_ROWS ? n : *from + TABLE_ROWS;
}

/* "Rows a to b of n" and links to the first, previous, next and last pages. */
static void put_pager(page *p, const char *path, long long id, long long attempt, size_t n, size_t from, size_t to) {
  if (n <= TABLE_ROWS) return;
  size_t pages = (n + TABLE_ROWS - 1) / TABLE_ROWS, cur = from / TABLE_ROWS + 1;
  pages_printf(&p->o, "<p class=\"pager\">Rows %zu to %zu of %zu (page %zu of %zu).", from + 1, to, n, cur, pages);
  const struct {
    const char *name;
    size_t to;
  } links[] = {{"first", 1}, {"previous", cur - 1}, {"next", cur + 1}, {"last", pages}};
  for (size_t i = 0; i < 4; i++) {
    if (links[i].to < 1 || links[i].to > pages || links[i].to == cur) continue;
    pages_put(&p->o, " ");
    put_a(p, link_full(p, NULL, path, id, attempt, (long long)links[i].to));
    pages_printf(&p->o, "%s</a>", links[i].name);
  }
  pages_put(&p->o, "</p>\n");
}

/* ---- the frame of every page -------------------------------------------------------------- */

static const char CSS[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}"
    "header{background:#2b3e50;color:#fff;padding:8px 16px}header a{color:#fff;text-decoration:none}"
    ".brand{font-weight:bold;font-size:18px;margin-right:12px}.mode{opacity:.7;margin-right:16px}"
    "nav{background:#eef1f4;padding:6px 16px;border-bottom:1px solid #ccd}"
    "nav a{margin-right:14px;text-decoration:none;color:#235}nav a.on{font-weight:bold;border-bottom:2px solid #235}"
    "main{padding:8px 16px}h1{font-size:20px}h2{font-size:17px;margin-top:22px}h3{font-size:15px}"
    "table{border-collapse:collapse;margin:6px 0 12px}th,td{border:1px solid #ddd;padding:3px 7px;"
    "text-align:left;vertical-align:top}th{background:#f3f5f7}tr:nth-child(even) td{background:#fafbfc}"
    "td.n{text-align:right;font-variant-numeric:tabular-nums}"
    ".st{padding:1px 6px;border-radius:3px;font-size:12px;color:#fff}.ok{background:#5cb85c}"
    ".bad{background:#d9534f}.run{background:#4a90d9}.kill{background:#999}.pend{background:#aaa}"
    ".err{color:#b52b27}details.err pre{white-space:pre-wrap;max-width:900px}"
    ".pb{display:inline-block;width:90px;height:10px;background:#e4e4e4;border-radius:3px;vertical-align:middle}"
    ".pf{height:10px;background:#5cb85c;border-radius:3px}"
    "dl.sum{display:grid;grid-template-columns:max-content auto;gap:2px 14px}dl.sum dt{font-weight:bold}"
    "dl.sum dd{margin:0}svg{display:block;margin:8px 0;overflow:visible}"
    ".chart .ct{font-weight:bold;font-size:13px}.tk{font-size:11px;fill:#444}.bl{font-size:10px;fill:#fff}"
    ".plot{fill:#fcfcfc;stroke:#ddd}.grid{stroke:#e6e6e6}.axis{stroke:#666}.row0{fill:#f7f8fa}.row1{fill:#eef0f3}"
    ".line{fill:none;stroke-width:2}.bar{stroke:#fff;stroke-width:.5}.edge{stroke:#555;stroke-width:1.3}"
    ".node rect{stroke:#6b8bb0}.nl{font-size:12px;fill:#123}"
    ".charts{display:flex;flex-wrap:wrap;gap:12px}.cfg .hl td{background:#fff6d5}";

/* The page's <head> and banner; `tab` (NULL: none) marks the navigation bar of an app page. */
static void head(page *p, const char *heading, const char *tab, bool refresh) {
  ui_out *o = &p->o;
  pages_put(o, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>flint ");
  pages_escape(o, p->title);
  pages_put(o, ": ");
  pages_escape(o, heading);
  pages_put(o, "</title>");
  if (refresh && p->live) pages_put(o, "<meta http-equiv=\"refresh\" content=\"2\">");
  pages_put(o, "<style>");
  pages_put(o, CSS);
  pages_put(o, "</style></head>\n<body><header><a class=\"brand\" href=\"/\">flint</a><span class=\"mode\">");
  pages_escape(o, p->title);
  pages_put(o, "</span>");
  if (tab) {
    const char *name = jstr(p->app_info, "name");
    pages_put(o, "<a href=\"");
    pages_escape(o, link_to(p, NULL, "/jobs/", -1, -1));
    pages_put(o, "\">");
    if (name) {
      pages_escape(o, name);
      pages_put(o, " (");
    }
    pages_escape(o, p->app_id);
    if (name) pages_put(o, ")");
    pages_put(o, "</a>");
  }
  pages_put(o, "</header>\n");
  if (tab) {
    static const char *const tabs[][2] = {{"/jobs/", "Jobs"},           {"/storage/", "Storage"},
                                          {"/executors/", "Executors"}, {"/environment/", "Environment"},
                                          {"/ps/", "Parameter servers"}, {"/training/", "Training"}};
    pages_put(o, "<nav>");
    for (size_t i = 0; i < sizeof tabs / sizeof tabs[0]; i++) {
      pages_put(o, "<a href=\"");
      pages_escape(o, link_to(p, NULL, tabs[i][0], -1, -1));
      pages_printf(o, "\"%s>%s</a>", !strcmp(tab, tabs[i][0]) ? " class=\"on\"" : "", tabs[i][1]);
    }
    pages_put(o, "</nav>\n");
  }
  pages_put(o, "<main>\n");
}

static void foot(page *p) { pages_put(&p->o, "</main></body></html>\n"); }

/* The 404 page, in place of whatever was written. */
static int not_found(page *p, const char *what, const char *name) {
  p->o.buf->len = p->start;
  head(p, "not found", NULL, false);
  pages_put(&p->o, "<h1>Not found</h1><p>No ");
  pages_put(&p->o, what);
  pages_put(&p->o, " <code>");
  pages_escape(&p->o, name);
  pages_put(&p->o, "</code>.</p><p><a href=\"/\">All applications</a></p>\n");
  foot(p);
  return 404;
}

/* The application's object for the banner and the id for links: /applications/{app}, or the
 * list (where "current" is the newest). Best effort: pages work without it. */
static void resolve_app(page *p) {
  json_t *a = get(p, "/applications/%s", p->app);
  if (!json_is_object(a) || !jstr(a, "id")) {
    a = NULL;
    json_t *list = get(p, "/applications");
    double newest = -INFINITY;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e) {
      const char *id = jstr(e, "id");
      if (!id) continue;
      if (!strcmp(id, p->app)) {
        a = e;
        break;
      }
      double started = jtime(json_array_get(json_object_get(e, "attempts"), 0), "startTime");
      if (!strcmp(p->app, "current") && (!a || (ok(started) && started > newest))) {
        a = e;
        if (ok(started)) newest = started;
      }
    }
  }
  p->app_info = a;
  if (a) p->app_id = jstr(a, "id");
}

/* The newest time the page knows of, for bars still running: now on a live UI. */
static double now_ms(page *p, double latest) {
  if (p->live) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double now = (double)ts.tv_sec * 1000 + (double)ts.tv_nsec / 1e6;
    if (now > latest) return now;
  }
  return latest;
}

/* ---- "/": applications -------------------------------------------------------------------- */

static int page_applications(page *p) {
  ui_out *o = &p->o;
  json_t *apps = get(p, "/applications");
  head(p, "applications", NULL, true);
  pages_put(o, "<h1>Applications</h1>\n");
  if (!json_array_size(apps)) {
    pages_put(o, "<p>No applications yet.</p>\n");
    foot(p);
    return 200;
  }
  pages_put(o, "<table><tr><th>App ID</th><th>Name</th><th>User</th><th>Started</th><th>Ended</th>"
               "<th>Duration</th></tr>\n");
  size_t i;
  json_t *a;
  json_array_foreach(apps, i, a) {
    json_t *att = json_array_get(json_object_get(a, "attempts"), 0);
    const char *id = jstr(a, "id");
    pages_put(o, "<tr class=\"app\"><td>");
    put_a(p, link_to(p, id ? id : "", "/jobs/", -1, -1));
    pages_escape(o, id);
    pages_put(o, "</a></td><td>");
    pages_escape(o, jstr(a, "name"));
    pages_put(o, "</td><td>");
    pages_escape(o, jstr(att, "sparkUser"));
    pages_put(o, "</td><td>");
    put_time(o, jtime(att, "startTime"));
    pages_put(o, "</td><td>");
    if (jbool(att, "completed"))
      put_time(o, jtime(att, "endTime"));
    else
      pages_put(o, "<span class=\"st run\">running</span>");
    pages_put(o, "</td><td class=\"n\">");
    double start = jtime(att, "startTime");
    if (jbool(att, "completed"))
      put_duration(o, jnum(att, "duration"));
    else /* a running application's: so far (the history server's killed drivers: unknown) */
      put_duration(o, p->live && ok(start) && start > 0 ? now_ms(p, start) - start : NAN);
    pages_put(o, "</td></tr>\n");
  }
  pages_put(o, "</table>\n");
  foot(p);
  return 200;
}

/* ---- stages, shared by the job and stage pages -------------------------------------------- */

/* The newest attempt of each stage in the API's stage list, sorted by stage id. */
typedef struct stage_ref {
  long long id;
  json_t *stage;
} stage_ref;

static int cmp_stage_ref(const void *a, const void *b) {
  long long x = ((const stage_ref *)a)->id, y = ((const stage_ref *)b)->id;
  return x < y ? -1 : x > y;
}

static stage_ref *stage_index(page *p, json_t *stages, size_t *n_out) {
  *n_out = 0;
  size_t n = json_array_size(stages);
  stage_ref *refs = fl_malloc((n ? n : 1) * sizeof *refs);
  if (!refs) {
    if (p->o.st == FL_OK) p->o.st = FL_ENOMEM;
    return NULL;
  }
  for (size_t i = 0; i < n; i++) refs[i] = (stage_ref){jint(json_array_get(stages, i), "stageId", -1), json_array_get(stages, i)};
  qsort(refs, n, sizeof *refs, cmp_stage_ref);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k && refs[k - 1].id == refs[i].id) {
      if (jint(refs[i].stage, "attemptId", 0) >= jint(refs[k - 1].stage, "attemptId", 0)) refs[k - 1] = refs[i];
    } else {
      refs[k++] = refs[i];
    }
  }
  *n_out = k;
  return refs;
}

static json_t *stage_find(stage_ref *refs, size_t n, long long id) {
  stage_ref key = {id, NULL};
  stage_ref *r = refs ? bsearch(&key, refs, n, sizeof *refs, cmp_stage_ref) : NULL;
  return r ? r->stage : NULL;
}

static void stage_row(page *p, json_t *s) {
  ui_out *o = &p->o;
  long long id = jint(s, "stageId", -1);
  double sub = jtime(s, "submissionTime"), done = jtime(s, "completionTime");
  pages_put(o, "<tr class=\"stage\"><td class=\"n\">");
  put_a(p, link_to(p, NULL, "/stage/", id, -1));
  pages_printf(o, "%lld</a></td><td>", id);
  put_a(p, link_to(p, NULL, "/stage/", id, -1));
  pages_escape(o, jstr(s, "name"));
  pages_put(o, "</a></td><td>");
  put_status(o, jstr(s, "status"));
  pages_put(o, "</td><td>");
  put_time(o, sub);
  pages_put(o, "</td><td class=\"n\">");
  put_duration(o, ok(done) && ok(sub) ? done - sub : NAN);
  pages_put(o, "</td><td>");
  put_progress(o, jnum(s, "numCompleteTasks"), jnum(s, "numTasks"), jnum(s, "numActiveTasks"), jnum(s, "numFailedTasks"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(s, "inputBytes"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(s, "shuffleReadBytes"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(s, "shuffleWriteBytes"));
  pages_put(o, "</td></tr>\n");
}

static const char STAGE_HEADER[] = "<table><tr><th>Stage</th><th>Name</th><th>Status</th><th>Submitted</th>"
                                   "<th>Duration</th><th>Tasks</th><th>Input</th><th>Shuffle read</th>"
                                   "<th>Shuffle write</th></tr>\n";

/* ---- "/jobs/": the application's jobs ----------------------------------------------------- */

/* The newest jobs as bars, oldest at the top (the API lists the newest first). */
static void jobs_timeline(page *p, json_t *jobs) {
  ui_out *o = &p->o;
  size_t n = json_array_size(jobs), shown = n < TIMELINE_MAX_JOBS ? n : TIMELINE_MAX_JOBS;
  const char **rows = fl_calloc(shown, sizeof *rows);
  svg_bar *bars = fl_calloc(shown, sizeof *bars);
  if (!rows || !bars) {
    o->st = FL_ENOMEM;
    goto done;
  }
  double t0 = INFINITY, latest = -INFINITY;
  for (size_t k = 0; k < shown; k++) {
    json_t *jb = json_array_get(jobs, shown - 1 - k);
    double s = jtime(jb, "submissionTime"), e = jtime(jb, "completionTime");
    if (ok(s) && s < t0) t0 = s;
    if (ok(s) && s > latest) latest = s;
    if (ok(e) && e > latest) latest = e;
  }
  double now = now_ms(p, latest);
  for (size_t k = 0; k < shown; k++) {
    json_t *jb = json_array_get(jobs, shown - 1 - k);
    long long id = jint(jb, "jobId", -1);
    double s = jtime(jb, "submissionTime"), e = jtime(jb, "completionTime");
    const char *st = jstr(jb, "status"), *name = jstr(jb, "name");
    rows[k] = page_strf(p, "Job %lld", id);
    bars[k] = (svg_bar){k,
                        ok(s) ? s : t0,
                        ok(e) ? e : now,
                        status_color(st),
                        NULL,
                        page_strf(p, "Job %lld: %s (%s)", id, name ? name : "", st ? st : "?"),
                        link_to(p, NULL, "/job/", id, -1)};
  }
  pages_put(o, "<h2>Timeline</h2>\n");
  svg_timeline(o, shown < n ? "The newest jobs" : "Jobs", rows, shown, bars, shown, ok(t0) ? t0 : 0, now);
done:
  fl_free(rows);
  fl_free(bars);
}

static int page_jobs(page *p) {
  ui_out *o = &p->o;
  json_t *jobs = get_array(p, "/applications/%s/jobs", p->app);
  if (!jobs) return not_found(p, "application", p->app);
  resolve_app(p);
  size_t n_refs = 0;
  stage_ref *refs = stage_index(p, get(p, "/applications/%s/stages", p->app), &n_refs);
  head(p, "jobs", "/jobs/", true);
  size_t n = json_array_size(jobs), running = 0, failed = 0;
  size_t i;
  json_t *j;
  json_array_foreach(jobs, i, j) {
    const char *st = jstr(j, "status");
    if (st && !strcmp(st, "RUNNING")) running++;
    if (st && !strcmp(st, "FAILED")) failed++;
  }
  pages_printf(o, "<h1>Jobs</h1><p>%zu jobs: %zu running, %zu succeeded, %zu failed.</p>\n", n, running,
               n - running - failed, failed);
  if (!n) {
    pages_put(o, "<p>No jobs yet.</p>\n");
    fl_free(refs);
    foot(p);
    return 200;
  }

  jobs_timeline(p, jobs);

  size_t from, to;
  pager_range(p, n, &from, &to);
  pages_put(o, "<h2>All jobs</h2>\n");
  put_pager(p, "/jobs/", -1, -1, n, from, to);
  pages_put(o, "<table><tr><th>Job</th><th>Description</th><th>Status</th><th>Submitted</th>"
               "<th>Duration</th><th>Stages</th><th>Tasks</th></tr>\n");
  for (i = from; i < to; i++) {
    j = json_array_get(jobs, i);
    long long id = jint(j, "jobId", -1);
    double s = jtime(j, "submissionTime"), e = jtime(j, "completionTime");
    char *href = link_to(p, NULL, "/job/", id, -1);
    pages_put(o, "<tr class=\"job\"><td class=\"n\">");
    put_a(p, href);
    pages_printf(o, "%lld</a></td><td>", id);
    put_a(p, href);
    pages_escape(o, jstr(j, "name"));
    pages_put(o, "</a></td><td>");
    put_status(o, jstr(j, "status"));
    if (jstr(j, "errorMessage") && *jstr(j, "errorMessage")) pages_put(o, "<br>");
    put_error(o, jstr(j, "errorMessage"));
    pages_put(o, "</td><td>");
    put_time(o, s);
    pages_put(o, "</td><td class=\"n\">");
    put_duration(o, ok(s) ? (ok(e) ? e : now_ms(p, s)) - s : NAN);
    pages_put(o, "</td><td class=\"n\">");
    json_t *ids = json_object_get(j, "stageIds");
    size_t k, complete = 0;
    json_t *sid;
    json_array_foreach(ids, k, sid) {
      const char *st = jstr(stage_find(refs, n_refs, json_integer_value(sid)), "status");
      if (st && !strcmp(st, "COMPLETE")) complete++;
    }
    pages_printf(o, "%zu/%zu</td><td>", complete, json_array_size(ids));
    put_progress(o, jnum(j, "numCompletedTasks"), jnum(j, "numTasks"), jnum(j, "numActiveTasks"),
                 jnum(j, "numFailedTasks"));
    pages_put(o, "</td></tr>\n");
  }
  pages_put(o, "</table>\n");
  fl_free(refs);
  foot(p);
  return 200;
}

/* ---- "/job/": one job and its stages ------------------------------------------------------ */

static void summary_item(ui_out *o, const char *name) { pages_printf(o, "<dt>%s</dt><dd>", name); }

/* The stages' DAG: a box per stage, layered by their depth among `stages`, arrows from
 * parents. */
static void stages_dag(page *p, json_t **stages, size_t n) {
  svg_node *nodes = fl_calloc(n ? n : 1, sizeof *nodes);
  svg_edge *edges = NULL;
  size_t n_edges = 0, cap_edges = 0;
  if (!nodes) {
    p->o.st = FL_ENOMEM;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    long long id = jint(stages[i], "stageId", -1);
    const char *name = jstr(stages[i], "name");
    nodes[i] = (svg_node){0, page_strf(p, "Stage %lld", id), name, link_to(p, NULL, "/stage/", id, -1),
                          jstr(stages[i], "status") && !strcmp(jstr(stages[i], "status"), "FAILED") ? "#f6d6d5" : NULL};
    size_t k;
    json_t *par;
    json_array_foreach(json_object_get(stages[i], "parentIds"), k, par) {
      for (size_t f = 0; f < n; f++) {
        if (jint(stages[f], "stageId", -2) != json_integer_value(par) || !json_is_integer(par)) continue;
        svg_edge *more = grow(edges, &cap_edges, n_edges, sizeof *edges);
        if (!more) {
          p->o.st = FL_ENOMEM;
          break;
        }
        edges = more;
        edges[n_edges++] = (svg_edge){f, i};
      }
    }
  }
  /* Depth = 1 + the deepest parent's; n rounds settle any DAG, and a cycle stops there. */
  for (size_t round = 0; round < n; round++) {
    bool changed = false;
    for (size_t e = 0; e < n_edges; e++) {
      int want = nodes[edges[e].from].layer + 1;
      if (nodes[edges[e].to].layer < want && want <= (int)n) {
        nodes[edges[e].to].layer = want;
        changed = true;
      }
    }
    if (!changed) break;
  }
  svg_dag(&p->o, nodes, n, edges, n_edges);
  fl_free(nodes);
  fl_free(edges);
}

static int page_job(page *p) {
  ui_out *o = &p->o;
  char *id_text = query_get(p, "id");
  long long id = -1;
  bool valid = id_ok(id_text, &id);
  json_t *job = valid ? get(p, "/applications/%s/jobs/%lld", p->app, id) : NULL;
  if (!json_is_object(job)) {
    int status = not_found(p, "job", id_text ? id_text : "(none given)");
    fl_free(id_text);
    return status;
  }
  fl_free(id_text);
  resolve_app(p);
  json_t *all = get(p, "/applications/%s/stages", p->app);
  size_t n_refs = 0;
  stage_ref *refs = stage_index(p, all, &n_refs);
  head(p, "job", "/jobs/", true);
  double s = jtime(job, "submissionTime"), e = jtime(job, "completionTime");
  pages_printf(o, "<h1>Job %lld: ", id);
  pages_escape(o, jstr(job, "name"));
  pages_put(o, "</h1>\n<dl class=\"sum\">");
  summary_item(o, "Status");
  put_status(o, jstr(job, "status"));
  pages_put(o, "</dd>");
  summary_item(o, "Submitted");
  put_time(o, s);
  pages_put(o, "</dd>");
  summary_item(o, "Completed");
  put_time(o, e);
  pages_put(o, "</dd>");
  summary_item(o, "Duration");
  put_duration(o, ok(s) ? (ok(e) ? e : now_ms(p, s)) - s : NAN);
  pages_put(o, "</dd>");
  summary_item(o, "Tasks");
  put_progress(o, jnum(job, "numCompletedTasks"), jnum(job, "numTasks"), jnum(job, "numActiveTasks"),
               jnum(job, "numFailedTasks"));
  pages_put(o, "</dd>");
  if (jstr(job, "errorMessage") && *jstr(job, "errorMessage")) {
    summary_item(o, "Error");
    put_error(o, jstr(job, "errorMessage"));
    pages_put(o, "</dd>");
  }
  pages_put(o, "</dl>\n");

  /* The job's stages: its stageIds, found in the stage list (newest attempt each). */
  json_t *ids = json_object_get(job, "stageIds");
  size_t n_ids = json_array_size(ids), n = 0;
  json_t **stages = fl_calloc(n_ids ? n_ids : 1, sizeof *stages);
  if (!stages) {
    o->st = FL_ENOMEM;
  } else {
    for (size_t k = 0; k < n_ids; k++) {
      json_t *st = stage_find(refs, n_refs, json_integer_value(json_array_get(ids, k)));
      if (st) stages[n++] = st;
    }
    pages_put(o, "<h2>DAG</h2>\n");
    if (n)
      stages_dag(p, stages, n);
    else
      pages_put(o, "<p>No stages yet.</p>\n");
    pages_printf(o, "<h2>Stages (%zu)</h2>\n", n_ids);
    pages_put(o, STAGE_HEADER);
    for (size_t k = n; k-- > 0;) stage_row(p, stages[k]);
    pages_put(o, "</table>\n");
    for (size_t k = 0; k < n_ids; k++) { /* ids the stage list does not know (yet) */
      json_t *sid = json_array_get(ids, k);
      if (stage_find(refs, n_refs, json_integer_value(sid))) continue;
      pages_printf(o, "<p>Stage %lld: not submitted yet.</p>\n", (long long)json_integer_value(sid));
    }
  }
  fl_free(stages);
  fl_free(refs);
  foot(p);
  return 200;
}

/* ---- "/stage/": one stage: summary, DAG, tasks and their timeline ------------------------- */

static int cmp_task(const void *a, const void *b) {
  const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
  long long d[3][2] = {{jint(x, "index", 0), jint(y, "index", 0)},
                       {jint(x, "attempt", 0), jint(y, "attempt", 0)},
                       {jint(x, "taskId", 0), jint(y, "taskId", 0)}};
  for (int i = 0; i < 3; i++)
    if (d[i][0] != d[i][1]) return d[i][0] < d[i][1] ? -1 : 1;
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Executor ids in natural order: numbers first, by value ("2" before "10"), then the rest. */
static bool all_digits(const char *s) { return *s && !s[strspn(s, "0123456789")]; }

static int cmp_executor(const void *a, const void *b) {
  const char *x = *(const char *const *)a, *y = *(const char *const *)b;
  bool nx = all_digits(x), ny = all_digits(y);
  if (nx != ny) return nx ? -1 : 1;
  if (nx && strlen(x) != strlen(y)) return strlen(x) < strlen(y) ? -1 : 1;
  return strcmp(x, y);
}

/* The stage's DAG: its parent stages on top, then its datasets' chain from the oldest down
 * to the stage's own (rddInfos lists the stage's own first), each an arrow on. */
static void stage_dag(page *p, json_t *stage, stage_ref *refs, size_t n_refs) {
  json_t *parents = json_object_get(stage, "parentIds"), *rdds = json_object_get(stage, "rddInfos");
  size_t np = json_array_size(parents), nr = json_array_size(rdds);
  size_t n = np + (nr ? nr : 1);
  svg_node *nodes = fl_calloc(n, sizeof *nodes);
  svg_edge *edges = fl_calloc(n, sizeof *edges);
  if (!nodes || !edges) {
    p->o.st = FL_ENOMEM;
    goto done;
  }
  int top = np ? 1 : 0;
  for (size_t i = 0; i < np; i++) {
    long long pid = json_integer_value(json_array_get(parents, i));
    nodes[i] = (svg_node){0, page_strf(p, "Stage %lld", pid), jstr(stage_find(refs, n_refs, pid), "name"),
                          link_to(p, NULL, "/stage/", pid, -1), "#eeeeee"};
  }
  char idbuf[32];
  if (!nr) {
    nodes[np] = (svg_node){top, page_strf(p, "Stage %lld", jint(stage, "stageId", -1)), jstr(stage, "name"), NULL, NULL};
  }
  for (size_t i = 0; i < nr; i++) {
    json_t *r = json_array_get(rdds, nr - 1 - i);
    const char *op = jstr(r, "op"), *id = jid(r, "id", idbuf, sizeof idbuf);
    long long parts = jint(r, "numPartitions", -1);
    char nparts[48] = "";
    if (parts >= 0) snprintf(nparts, sizeof nparts, ", %lld partitions", parts);
    bool cached = jbool(r, "cached");
    nodes[np + i] = (svg_node){top + (int)i, jstr(r, "name") ? jstr(r, "name") : op ? op : page_strf(p, "RDD %s", id),
                               page_strf(p, "[%s]%s%s%s%s", id, op ? " " : "", op ? op : "", nparts, cached ? ", cached" : ""),
                               NULL, cached ? "#d8f0d8" : NULL};
  }
  size_t ne = 0;
  for (size_t i = 0; i < np; i++) edges[ne++] = (svg_edge){i, np};
  for (size_t i = 1; i < nr; i++) edges[ne++] = (svg_edge){np + i - 1, np + i};
  svg_dag(&p->o, nodes, n, edges, ne);
done:
  fl_free(nodes);
  fl_free(edges);
}

static void task_timeline(page *p, json_t **tasks, size_t n) {
  ui_out *o = &p->o;
  size_t shown = n < TIMELINE_MAX_TASKS ? n : TIMELINE_MAX_TASKS;
  const char **execs = fl_calloc(shown ? shown : 1, sizeof *execs);
  svg_bar *bars = fl_calloc(shown ? shown : 1, sizeof *bars);
  if (!execs || !bars) {
    o->st = FL_ENOMEM;
    goto done;
  }
  size_t n_exec = 0;
  double t0 = INFINITY, latest = -INFINITY;
  char idbuf[32];
  for (size_t i = 0; i < shown; i++) {
    const char *ex = jstr(tasks[i], "executorId");
    execs[n_exec++] = ex ? ex : "?";
    double s = jtime(tasks[i], "launchTime"), d = jnum(tasks[i], "duration");
    if (ok(s) && s < t0) t0 = s;
    if (ok(s) && s > latest) latest = s;
    if (ok(s) && ok(d) && s + d > latest) latest = s + d;
  }
  qsort(execs, n_exec, sizeof *execs, cmp_executor);
  size_t k = 0;
  for (size_t i = 0; i < n_exec; i++)
    if (!k || strcmp(execs[k - 1], execs[i])) execs[k++] = execs[i];
  n_exec = k;
  double now = now_ms(p, latest);
  if (!ok(t0)) t0 = now;
  for (size_t i = 0; i < shown; i++) {
    json_t *t = tasks[i];
    const char *ex = jstr(t, "executorId"), *st = jstr(t, "status");
    const char *key = ex ? ex : "?";
    const char **row = bsearch(&key, execs, n_exec, sizeof *execs, cmp_executor);
    double s = jtime(t, "launchTime"), d = jnum(t, "duration");
    bool running = st && !strcmp(st, "RUNNING");
    bars[i] = (svg_bar){row ? (size_t)(row - execs) : 0,
                        ok(s) ? s : t0,
                        ok(s) && ok(d) && !running ? s + d : now,
                        status_color(st),
                        page_strf(p, "%lld", jint(t, "index", 0)),
                        page_strf(p, "task %s (index %lld, attempt %lld) on %s: %s, %.0f ms%s",
                                  jid(t, "taskId", idbuf, sizeof idbuf), jint(t, "index", 0), jint(t, "attempt", 0),
                                  key, st ? st : "?", ok(d) ? d : 0, jbool(t, "speculative") ? ", speculative" : ""),
                        NULL};
  }
  const char **rows = fl_calloc(n_exec ? n_exec : 1, sizeof *rows);
  if (!rows) {
    o->st = FL_ENOMEM;
    goto done;
  }
  for (size_t i = 0; i < n_exec; i++) rows[i] = page_strf(p, "executor %s", execs[i]);
  if (shown < n) pages_printf(o, "<p>The first %zu of %zu tasks.</p>\n", shown, n);
  svg_timeline(o, "Tasks by executor", rows, n_exec, bars, shown, t0, now);
  fl_free(rows);
done:
  fl_free(execs);
  fl_free(bars);
}

static void task_quantiles(page *p, json_t **tasks, size_t n) {
  ui_out *o = &p->o;
  double *d = fl_malloc((n ? n : 1) * sizeof *d);
  if (!d) {
    o->st = FL_ENOMEM;
    return;
  }
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const char *st = jstr(tasks[i], "status");
    double v = jnum(tasks[i], "duration");
    if (ok(v) && (!st || strcmp(st, "RUNNING"))) d[m++] = v;
  }
  if (m) {
    qsort(d, m, sizeof *d, cmp_double);
    static const char *const names[] = {"Min", "25th percentile", "Median", "75th percentile", "Max"};
    pages_printf(o, "<h2>Summary of %zu finished tasks</h2>\n<table><tr><th>Metric</th>", m);
    for (int q = 0; q < 5; q++) pages_printf(o, "<th>%s</th>", names[q]);
    pages_put(o, "</tr><tr><td>Duration</td>");
    for (int q = 0; q < 5; q++) {
      pages_put(o, "<td class=\"n\">");
      put_duration(o, d[(size_t)((double)(m - 1) * q / 4.0 + 0.5)]);
      pages_put(o, "</td>");
    }
    pages_put(o, "</tr></table>\n");
  }
  fl_free(d);
}

static void task_row(page *p, json_t *t) {
  ui_out *o = &p->o;
  json_t *m = json_object_get(t, "taskMetrics");
  pages_put(o, "<tr class=\"task\"><td class=\"n\">");
  put_field(o, t, "taskId");
  pages_put(o, "</td><td class=\"n\">");
  put_field(o, t, "index");
  pages_put(o, "</td><td class=\"n\">");
  put_field(o, t, "attempt");
  pages_put(o, "</td><td>");
  put_field(o, t, "executorId");
  pages_put(o, "</td><td>");
  put_field(o, t, "host");
  pages_put(o, "</td><td>");
  put_status(o, jstr(t, "status"));
  pages_put(o, "</td><td>");
  put_field(o, t, "taskLocality");
  pages_put(o, "</td><td>");
  put_time(o, jtime(t, "launchTime"));
  pages_put(o, "</td><td class=\"n\">");
  put_duration(o, jnum(t, "duration"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(json_object_get(m, "inputMetrics"), "bytesRead"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(json_object_get(m, "shuffleReadMetrics"), "remoteBytesRead"));
  pages_put(o, "</td><td class=\"n\">");
  put_bytes(o, jnum(json_object_get(m, "shuffleWriteMetrics"), "bytesWritten"));
  pages_printf(o, "</td><td>%s</td><td>", jbool(t, "speculative") ? "yes" : "");
  put_error(o, jstr(t, "errorMessage"));
  pages_put(o, "</td></tr>\n");
}

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return x < y ? -1 : x > y;
}

/* Adds v to the set arr[0..*n) (grown as needed); false when out of memory. */
static bool add_attempt(long long **arr, size_t *n, size_t *cap, long long v) {
  for (size_t i = 0; i < *n; i++)
    if ((*arr)[i] == v) return true;
  long long *more = grow(*arr, cap, *n, sizeof **arr);
  if (!more) return false;
  *arr = more;
  (*arr)[(*n)++] = v;
  return true;
}

/* The stage page. The API answers one entry per attempt it keeps (the store keeps the newest),
 * each with the tasks of every attempt; a task's stageAttemptId says whose it is. So attempt k
 * is shown when an entry or a task names it, with the entry's figures (the newest's when k
 * has none) and k's tasks. */
static int page_stage(page *p) {
  ui_out *o = &p->o;
  char *id_text = query_get(p, "id"), *att_text = query_get(p, "attempt");
  long long id = -1, want = -1;
  bool valid = id_ok(id_text, &id) && (!att_text || id_ok(att_text, &want));
  json_t *attempts = valid ? get(p, "/applications/%s/stages/%lld", p->app, id) : NULL;
  json_t *newest = NULL, *exact = NULL, *a;
  size_t i;
  long long *atts = NULL;
  size_t n_atts = 0, cap_atts = 0;
  bool mem = true;
  json_array_foreach(attempts, i, a) {
    if (!json_is_object(a)) continue;
    long long at = jint(a, "attemptId", 0);
    if (!newest || at >= jint(newest, "attemptId", 0)) newest = a;
    if (at == want) exact = a;
    mem = mem && add_attempt(&atts, &n_atts, &cap_atts, at);
  }
  json_t *stage = exact ? exact : newest;
  long long shown = want >= 0 ? want : jint(stage, "attemptId", 0);

  /* Its tasks: the entry's "tasks" map, else the attempt's taskList; only the shown attempt's. */
  json_t *map = json_object_get(stage, "tasks");
  if (stage && !json_is_object(map)) map = get(p, "/applications/%s/stages/%lld/%lld/taskList", p->app, id, shown);
  size_t n = json_is_object(map) ? json_object_size(map) : json_array_size(map), n_tasks = 0;
  json_t **tasks = fl_calloc(n ? n : 1, sizeof *tasks);
  mem = mem && tasks;
  if (tasks && json_is_object(map)) {
    const char *key;
    json_t *t;
    json_object_foreach(map, key, t) if (json_is_object(t)) tasks[n_tasks++] = t;
  } else if (tasks) {
    json_t *t;
    json_array_foreach(map, i, t) if (json_is_object(t)) tasks[n_tasks++] = t;
  }
  size_t kept = 0;
  for (size_t k = 0; k < n_tasks; k++) {
    json_t *sa = json_object_get(tasks[k], "stageAttemptId");
    if (sa) mem = mem && add_attempt(&atts, &n_atts, &cap_atts, json_integer_value(sa));
    if (!sa || json_integer_value(sa) == shown) tasks[kept++] = tasks[k];
  }
  n_tasks = kept;
  if (!mem) o->st = FL_ENOMEM;
  bool known = false;
  for (size_t k = 0; k < n_atts; k++) known |= atts[k] == shown;
  if (!stage || !known) {
    const char *what = !id_text ? "(none given)" : att_text ? page_strf(p, "%s, attempt %s", id_text, att_text) : id_text;
    int status = not_found(p, "stage", what);
    fl_free(id_text);
    fl_free(att_text);
    fl_free(tasks);
    fl_free(atts);
    return status;
  }
  fl_free(id_text);
  fl_free(att_text);
  if (tasks) qsort(tasks, n_tasks, sizeof *tasks, cmp_task);
  qsort(atts, n_atts, sizeof *atts, cmp_ll);
  resolve_app(p);
  size_t n_refs = 0;
  stage_ref *refs = stage_index(p, get(p, "/applications/%s/stages", p->app), &n_refs);

  head(p, "stage", "/jobs/", true);
  pages_printf(o, "<h1>Stage %lld (attempt %lld): ", id, shown);
  pages_escape(o, jstr(stage, "name"));
  pages_put(o, "</h1>\n");
  if (n_atts > 1) {
    pages_put(o, "<p>Attempts:");
    for (size_t k = 0; k < n_atts; k++) {
      pages_put(o, " ");
      if (atts[k] == shown) {
        pages_printf(o, "<b>%lld</b>", atts[k]);
        continue;
      }
      put_a(p, link_to(p, NULL, "/stage/", id, atts[k]));
      pages_printf(o, "%lld</a>", atts[k]);
    }
    pages_put(o, "</p>\n");
  }
  if (!exact && want >= 0)
    pages_printf(o, "<p>The figures are attempt %lld's (the newest); the tasks are attempt %lld's.</p>\n",
                 jint(stage, "attemptId", 0), shown);
  double s = jtime(stage, "submissionTime"), e = jtime(stage, "completionTime");
  pages_put(o, "<dl class=\"sum\">");
  summary_item(o, "Status");
  put_status(o, jstr(stage, "status"));
  pages_put(o, "</dd>");
  summary_item(o, "Jobs");
  json_t *jid_v;
  json_array_foreach(json_object_get(stage, "jobIds"), i, jid_v) {
    long long jid_n = json_integer_value(jid_v);
    if (i) pages_put(o, ", ");
    put_a(p, link_to(p, NULL, "/job/", jid_n, -1));
    pages_printf(o, "%lld</a>", jid_n);
  }
  pages_put(o, "</dd>");
  summary_item(o, "Submitted");
  put_time(o, s);
  pages_put(o, "</dd>");
  summary_item(o, "Duration");
  put_duration(o, ok(s) ? (ok(e) ? e : now_ms(p, s)) - s : NAN);
  pages_put(o, "</dd>");
  summary_item(o, "Tasks");
  put_progress(o, jnum(stage, "numCompleteTasks"), jnum(stage, "numTasks"), jnum(stage, "numActiveTasks"),
               jnum(stage, "numFailedTasks"));
  pages_put(o, "</dd>");
  summary_item(o, "Executor run time");
  put_duration(o, jnum(stage, "executorRunTime"));
  pages_put(o, "</dd>");
  summary_item(o, "Input");
  put_bytes(o, jnum(stage, "inputBytes"));
  pages_put(o, "</dd>");
  summary_item(o, "Shuffle read");
  put_bytes(o, jnum(stage, "shuffleReadBytes"));
  pages_put(o, "</dd>");
  summary_item(o, "Shuffle write");
  put_bytes(o, jnum(stage, "shuffleWriteBytes"));
  pages_put(o, "</dd>");
  if (jstr(stage, "failureReason") && *jstr(stage, "failureReason")) {
    summary_item(o, "Failure");
    put_error(o, jstr(stage, "failureReason"));
    pages_put(o, "</dd>");
  }
  pages_put(o, "</dl>\n<h2>DAG</h2>\n");
  stage_dag(p, stage, refs, n_refs);
  pages_put(o, "<h2>Timeline</h2>\n");
  if (n_tasks)
    task_timeline(p, tasks, n_tasks);
  else
    pages_put(o, "<p>No tasks yet.</p>\n");
  task_quantiles(p, tasks, n_tasks);
  size_t from, to;
  pager_range(p, n_tasks, &from, &to);
  pages_printf(o, "<h2>Tasks (%zu)</h2>\n", n_tasks);
  put_pager(p, "/stage/", id, want, n_tasks, from, to);
  pages_put(o, "<table><tr><th>Task ID</th><th>Index</th><th>Attempt</th><th>Executor</th><th>Host</th>"
               "<th>Status</th><th>Locality</th><th>Launch time</th><th>Duration</th><th>Input</th>"
               "<th>Shuffle read</th><th>Shuffle write</th><th>Speculative</th><th>Error</th></tr>\n");
  for (size_t k = from; k < to; k++) task_row(p, tasks[k]);
  pages_put(o, "</table>\n");
  fl_free(tasks);
  fl_free(atts);
  fl_free(refs);
  foot(p);
  return 200;
}

/* ---- "/storage/": cached datasets --------------------------------------------------------- */

static int page_storage(page *p) {
  ui_out *o = &p->o;
  json_t *rdds = get_array(p, "/applications/%s/storage/rdd", p->app);
  if (!rdds) return not_found(p, "application", p->app);
  resolve_app(p);
  head(p, "storage", "/storage/", true);
  pages_put(o, "<h1>Storage</h1>\n");
  if (!json_array_size(rdds)) {
    pages_put(o, "<p>No cached datasets.</p>\n");
    foot(p);
    return 200;
  }
  pages_put(o, "<table><tr><th>Dataset</th><th>Storage level</th><th>Cached partitions</th>"
               "<th>Fraction cached</th><th>Size in memory</th><th>Size on disk</th></tr>\n");
  size_t i, k;
  json_t *r, *e;
  char idbuf[32];
  json_array_foreach(rdds, i, r) {
    double cached = jnum(r, "numCachedPartitions"), total = jnum(r, "numPartitions");
    pages_put(o, "<tr class=\"rdd\"><td><a href=\"#rdd-");
    pages_escape(o, jid(r, "id", idbuf, sizeof idbuf));
    pages_put(o, "\">");
    pages_escape(o, jstr(r, "name"));
    pages_put(o, " [");
    pages_escape(o, jid(r, "id", idbuf, sizeof idbuf));
    pages_put(o, "]</a></td><td>");
    put_field(o, r, "storageLevel");
    pages_printf(o, "</td><td class=\"n\">%.0f", ok(cached) ? cached : 0);
    if (ok(total)) pages_printf(o, " of %.0f", total);
    pages_put(o, "</td><td class=\"n\">");
    if (total > 0 && ok(cached))
      pages_printf(o, "%.0f%%", cached / total * 100);
    else
      pages_put(o, "-");
    pages_put(o, "</td><td class=\"n\">");
    put_bytes(o, jnum(r, "memoryUsed"));
    pages_put(o, "</td><td class=\"n\">");
    put_bytes(o, jnum(r, "diskUsed"));
    pages_put(o, "</td></tr>\n");
  }
  pages_put(o, "</table>\n");
  json_array_foreach(rdds, i, r) {
    pages_put(o, "<h2 id=\"rdd-");
    pages_escape(o, jid(r, "id", idbuf, sizeof idbuf));
    pages_put(o, "\">");
    pages_escape(o, jstr(r, "name"));
    pages_put(o, " [");
    pages_escape(o, jid(r, "id", idbuf, sizeof idbuf));
    pages_put(o, "]</h2>\n<h3>By executor</h3>\n<table><tr><th>Address</th><th>Memory</th><th>Disk</th></tr>\n");
    json_array_foreach(json_object_get(r, "dataDistribution"), k, e) {
      pages_put(o, "<tr class=\"dist\"><td>");
      put_field(o, e, "address");
      pages_put(o, "</td><td class=\"n\">");
      put_bytes(o, jnum(e, "memoryUsed"));
      pages_put(o, "</td><td class=\"n\">");
      put_bytes(o, jnum(e, "diskUsed"));
      pages_put(o, "</td></tr>\n");
    }
    json_t *parts = json_object_get(r, "partitions");
    pages_printf(o, "</table>\n<details><summary>%zu cached partitions</summary>\n"
                    "<table><tr><th>Block</th><th>Memory</th><th>Disk</th><th>Executors</th></tr>\n",
                 json_array_size(parts));
    json_array_foreach(parts, k, e) {
      pages_put(o, "<tr class=\"part\"><td>");
      put_field(o, e, "blockName");
      pages_put(o, "</td><td class=\"n\">");
      put_bytes(o, jnum(e, "memoryUsed"));
      pages_put(o, "</td><td class=\"n\">");
      put_bytes(o, jnum(e, "diskUsed"));
      pages_put(o, "</td><td>");
      json_t *ex = json_object_get(e, "executors");
      if (json_is_array(ex)) {
        size_t x;
        json_t *v;
        json_array_foreach(ex, x, v) {
          if (x) pages_put(o, ", ");
          put_json(o, v);
        }
      } else {
        put_field(o, e, "executors");
      }
      pages_put(o, "</td></tr>\n");
    }
    pages_put(o, "</table></details>\n");
  }
  foot(p);
  return 200;
}

/* ---- "/executors/" ------------------------------------------------------------------------ */

static int page_executors(page *p) {
  ui_out *o = &p->o;
  json_t *execs = get_array(p, "/applications/%s/executors", p->app);
  if (!execs) return not_found(p, "application", p->app);
  resolve_app(p);
  head(p, "executors", "/executors/", true);
  size_t i, active = 0;
  json_t *e;
  double cores = 0, tasks = 0;
  json_array_foreach(execs, i, e) {
    if (!jbool(e, "isActive")) continue;
    active++;
    if (ok(jnum(e, "totalCores"))) cores += jnum(e, "totalCores");
    if (ok(jnum(e, "activeTasks"))) tasks += jnum(e, "activeTasks");
  }
  pages_printf(o, "<h1>Executors</h1><p>%zu active (%.0f cores, %.0f tasks running), %zu removed.</p>\n", active, cores,
               tasks, json_array_size(execs) - active);
  if (!json_array_size(execs)) {
    pages_put(o, "<p>No executors yet.</p>\n");
    foot(p);
    return 200;
  }
  pages_put(o, "<table><tr><th>Executor</th><th>Address</th><th>Status</th><th>Cores</th><th>Memory</th>"
               "<th>GPU</th><th>RDD blocks</th><th>Storage memory</th><th>Disk used</th><th>Active tasks</th>"
               "<th>Failed tasks</th><th>Complete tasks</th><th>Total tasks</th><th>Task time</th><th>Added</th>"
               "<th>Last heartbeat</th></tr>\n");
  json_array_foreach(execs, i, e) {
    pages_put(o, "<tr class=\"executor\"><td>");
    put_field(o, e, "id");
    pages_put(o, "</td><td>");
    put_field(o, e, "hostPort");
    pages_put(o, "</td><td>");
    if (jbool(e, "isActive")) {
      pages_put(o, "<span class=\"st ok\">active</span>");
    } else {
      pages_put(o, "<span class=\"st kill\">removed</span> ");
      put_time(o, jtime(e, "removeTime"));
      pages_put(o, "<br>");
      put_error(o, jstr(e, "removeReason"));
    }
    pages_put(o, "</td><td class=\"n\">");
    put_field(o, e, "totalCores");
    pages_put(o, "</td><td class=\"n\">");
    put_bytes(o, jnum(e, "maxMemory"));
    pages_put(o, "</td><td class=\"n\">");
    json_t *gpu = json_object_get(e, "gpu");
    if (!gpu || json_is_null(gpu) || (json_is_number(gpu) && json_number_value(gpu) < 0))
      pages_put(o, "none");
    else
      put_json(o, gpu);
    pages_put(o, "</td><td class=\"n\">");
    put_field(o, e, "rddBlocks");
    pages_put(o, "</td><td class=\"n\">");
    put_bytes(o, jnum(e, "memoryUsed"));
    pages_put(o, " / ");
    put_bytes(o, jnum(e, "maxMemory"));
    pages_put(o, "</td><td class=\"n\">");
    put_bytes(o, jnum(e, "diskUsed"));
    static const char *const counts[] = {"activeTasks", "failedTasks", "completedTasks", "totalTasks"};
    for (size_t c = 0; c < 4; c++) {
      pages_put(o, "</td><td class=\"n\">");
      put_field(o, e, counts[c]);
    }
    pages_put(o, "</td><td class=\"n\">");
    put_duration(o, jnum(e, "totalDuration"));
    pages_put(o, "</td><td>");
    put_time(o, jtime(e, "addTime"));
    pages_put(o, "</td><td>");
    put_time(o, jtime(e, "lastHeartbeat"));
    pages_put(o, "</td></tr>\n");
  }
  pages_put(o, "</table>\n");
  foot(p);
  return 200;
}

/* ---- "/environment/" ---------------------------------------------------------------------- */

static int page_environment(page *p) {
  ui_out *o = &p->o;
  json_t *env = get(p, "/applications/%s/environment", p->app);
  if (!json_is_object(env)) return not_found(p, "application", p->app);
  resolve_app(p);
  head(p, "environment", "/environment/", true);
  pages_put(o, "<h1>Environment</h1>\n");
  /* flintProperties, and any other list of [name, value] pairs the API adds. */
  const char *key;
  json_t *list;
  json_object_foreach(env, key, list) {
    if (!json_is_array(list)) continue;
    pages_put(o, "<h2>");
    pages_escape(o, strcmp(key, "flintProperties") ? key : "flint properties");
    pages_put(o, "</h2>\n<table><tr><th>Name</th><th>Value</th></tr>\n");
    size_t i;
    json_t *pair;
    json_array_foreach(list, i, pair) {
      pages_put(o, "<tr class=\"prop\"><td>");
      put_json(o, json_array_get(pair, 0));
      pages_put(o, "</td><td>");
      put_json(o, json_array_get(pair, 1));
      pages_put(o, "</td></tr>\n");
    }
    if (!json_array_size(list)) pages_put(o, "<tr><td colspan=\"2\">none</td></tr>\n");
    pages_put(o, "</table>\n");
  }
  foot(p);
  return 200;
}

/* ---- "/ps/": parameter-server tables ------------------------------------------------------ */

static int page_ps(page *p) {
  ui_out *o = &p->o;
  json_t *tables = get_array(p, "/applications/%s/ps", p->app);
  if (!tables) return not_found(p, "application", p->app);
  resolve_app(p);
  head(p, "parameter servers", "/ps/", true);
  pages_put(o, "<h1>Parameter servers</h1>\n");
  if (!json_array_size(tables)) pages_put(o, "<p>No parameter-server tables.</p>\n");
  size_t i, k;
  json_t *t, *sh;
  json_array_foreach(tables, i, t) {
    json_t *shards = json_object_get(t, "shards");
    pages_put(o, "<h2>Table ");
    put_field(o, t, "table");
    if (jstr(t, "name") && *jstr(t, "name")) {
      pages_put(o, ": ");
      pages_escape(o, jstr(t, "name"));
    }
    pages_printf(o, " (%zu shards)</h2>\n<table><tr><th>Shard</th><th>Primary</th><th>Backups</th>"
                    "<th>Workers' clocks</th></tr>\n",
                 json_array_size(shards));
    json_array_foreach(shards, k, sh) {
      pages_put(o, "<tr class=\"shard\"><td class=\"n\">");
      put_field(o, sh, "shard");
      pages_put(o, "</td><td>");
      put_field(o, sh, "primary");
      pages_put(o, "</td><td>");
      json_t *backups = json_object_get(sh, "backups");
      if (json_is_array(backups)) {
        size_t b;
        json_t *v;
        json_array_foreach(backups, b, v) {
          if (b) pages_put(o, ", ");
          put_json(o, v);
        }
        if (!json_array_size(backups)) pages_put(o, "none");
      } else {
        put_field(o, sh, "backups");
      }
      pages_put(o, "</td><td>");
      json_t *clocks = json_object_get(sh, "clocks");
      if (json_is_object(clocks) && json_object_size(clocks)) {
        const char *w;
        json_t *c;
        bool first = true;
        json_object_foreach(clocks, w, c) {
          if (!first) pages_put(o, ", ");
          first = false;
          pages_escape(o, w);
          pages_put(o, ": ");
          put_json(o, c);
        }
      } else {
        pages_put(o, "-");
      }
      pages_put(o, "</td></tr>\n");
    }
    pages_put(o, "</table>\n");
  }
  foot(p);
  return 200;
}

/* ---- "/training/": runs, curves, pipeline ------------------------------------------------- */

/* A field read in either case of its first letter: the pipeline's entries are the event's
 * ("Op") or the API's ("op"). */
static json_t *jeither(const json_t *o, const char *lower, const char *upper) {
  json_t *v = json_object_get(o, lower);
  return v ? v : json_object_get(o, upper);
}

static void pipeline_chart(page *p, json_t *pipe) {
  if (json_is_object(pipe)) pipe = jeither(pipe, "stages", "Stages");
  size_t n_rows = json_array_size(pipe), n_bars = 0;
  if (!n_rows) return;
  for (size_t r = 0; r < n_rows; r++) n_bars += json_array_size(json_array_get(pipe, r));
  const char **rows = fl_calloc(n_rows, sizeof *rows);
  svg_bar *bars = fl_calloc(n_bars ? n_bars : 1, sizeof *bars);
  if (!rows || !bars) {
    p->o.st = FL_ENOMEM;
    goto done;
  }
  double t0 = INFINITY, t1 = -INFINITY;
  size_t b = 0;
  for (size_t r = 0; r < n_rows; r++) {
    rows[r] = page_strf(p, "stage %zu", r);
    size_t k;
    json_t *e;
    json_array_foreach(json_array_get(pipe, r), k, e) {
      const char *op = json_string_value(jeither(e, "op", "Op"));
      json_t *mb = jeither(e, "microBatch", "MicroBatch");
      json_t *sv = jeither(e, "start", "Start"), *ev = jeither(e, "end", "End");
      double s = json_is_number(sv) ? json_number_value(sv) : NAN, en = json_is_number(ev) ? json_number_value(ev) : NAN;
      if (!ok(s) || !ok(en)) continue;
      if (s < t0) t0 = s;
      if (en > t1) t1 = en;
      bool fwd = op && op[0] == 'F';
      bars[b++] = (svg_bar){r,
                            s,
                            en,
                            fwd ? "#4a90d9" : "#e8953a",
                            page_strf(p, "%s%lld", op ? op : "?", (long long)json_integer_value(mb)),
                            page_strf(p, "stage %zu: %s micro-batch %lld, %.6g to %.6g", r,
                                      fwd ? "forward" : "backward", (long long)json_integer_value(mb), s, en),
                            NULL};
    }
  }
  pages_put(&p->o, "<h3>Pipeline schedule</h3>\n");
  svg_timeline(&p->o, "Forward (F) and backward (B) passes per stage", rows, n_rows, bars, b, ok(t0) ? t0 : 0,
               ok(t1) ? t1 : 1);
done:
  fl_free(rows);
  fl_free(bars);
}

static void training_run(page *p, json_t *run) {
  ui_out *o = &p->o;
  json_t *steps = json_object_get(run, "steps"), *config = json_object_get(run, "config");
  size_t n = json_array_size(steps);
  pages_put(o, "<section class=\"trun\"><h2>Run ");
  put_field(o, run, "run");
  pages_put(o, ": ");
  pages_escape(o, jstr(run, "name"));
  pages_put(o, " ");
  put_status(o, jstr(run, "status"));
  pages_put(o, "</h2>\n");
  if (jstr(run, "error") && *jstr(run, "error")) {
    pages_put(o, "<p>");
    put_error(o, jstr(run, "error"));
    pages_put(o, "</p>\n");
  }
  /* The configuration, the allreduce algorithm marked. */
  pages_put(o, "<table class=\"cfg\"><tr><th>Setting</th><th>Value</th></tr>\n");
  const char *key;
  json_t *v;
  json_object_foreach(config, key, v) {
    pages_printf(o, "<tr%s><td>", strstr(key, "allreduce") ? " class=\"hl\"" : "");
    pages_escape(o, key);
    pages_put(o, "</td><td>");
    put_json(o, v);
    pages_put(o, "</td></tr>\n");
  }
  if (!json_object_size(config)) pages_put(o, "<tr><td colspan=\"2\">none</td></tr>\n");
  pages_put(o, "</table>\n");

  double *xs = fl_calloc(n ? n : 1, sizeof *xs), *ys = fl_calloc(5 * (n ? n : 1), sizeof *ys);
  if (!xs || !ys) {
    o->st = FL_ENOMEM;
    goto done;
  }
  double *loss = ys, *acc = ys + n, *test = ys + 2 * n, *ips = ys + 3 * n, *sent = ys + 4 * n;
  double bytes = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *s = json_array_get(steps, i);
    xs[i] = (double)(i + 1);
    loss[i] = jnum(s, "loss");
    acc[i] = jnum(s, "accuracy");
    test[i] = jnum(s, "testAccuracy");
    ips[i] = jnum(s, "imagesPerSecond");
    sent[i] = jnum(s, "bytesSent");
    if (ok(sent[i]) && sent[i] > bytes) bytes = sent[i]; /* a rank's bytes so far (docs/ui.md) */
  }
  json_t *last = json_array_get(steps, n ? n - 1 : 0);
  pages_printf(o, "<dl class=\"sum\"><dt>Steps</dt><dd>%zu</dd>", n);
  if (last) {
    pages_put(o, "<dt>Last</dt><dd>epoch ");
    put_field(o, last, "epoch");
    pages_put(o, ", step ");
    put_field(o, last, "step");
    pages_put(o, ": loss ");
    put_field(o, last, "loss");
    pages_put(o, ", accuracy ");
    put_field(o, last, "accuracy");
    pages_put(o, "</dd><dt>Images per second</dt><dd>");
    put_field(o, last, "imagesPerSecond");
    pages_put(o, "</dd>");
  }
  pages_put(o, "<dt>Bytes sent</dt><dd>");
  put_bytes(o, bytes);
  pages_put(o, "</dd></dl>\n<div class=\"charts\">");
  svg_series loss_s = {"loss", "#d9534f", xs, loss, n};
  svg_series acc_s[2] = {{"accuracy", "#4a90d9", xs, acc, n}, {"test accuracy", "#5cb85c", xs, test, n}};
  svg_series ips_s = {"images/s", "#8a6bb0", xs, ips, n};
  svg_line_chart(o, "Loss", "step", "loss", &loss_s, 1);
  svg_line_chart(o, "Accuracy", "step", "accuracy", acc_s, 2);
  svg_line_chart(o, "Throughput", "step", "images per second", &ips_s, 1);
  pages_put(o, "</div>\n");
  pipeline_chart(p, json_object_get(run, "pipeline"));
done:
  pages_put(o, "</section>\n");
  fl_free(xs);
  fl_free(ys);
}

static int page_training(page *p) {
  ui_out *o = &p->o;
  json_t *runs = get_array(p, "/applications/%s/training", p->app);
  if (!runs) return not_found(p, "application", p->app);
  resolve_app(p);
  head(p, "training", "/training/", true);
  pages_put(o, "<h1>Training</h1>\n");
  if (!json_array_size(runs)) pages_put(o, "<p>No training runs.</p>\n");
  size_t i;
  json_t *r;
  json_array_foreach(runs, i, r) training_run(p, r);
  foot(p);
  return 200;
}

/* ---- the entry point ---------------------------------------------------------------------- */

static const struct {
  const char *path;
  int (*render)(page *p);
} PAGES[] = {{"/jobs/", page_jobs},         {"/job/", page_job},
             {"/stage/", page_stage},       {"/storage/", page_storage},
             {"/executors/", page_executors}, {"/environment/", page_environment},
             {"/ps/", page_ps},             {"/training/", page_training}};

int pages_render(ui_api_fn api, void *arg, const char *title, const char *path, const char *query, fl_buf *html) {
  page p = {.o = {html, FL_OK, 0}, .start = html->len, .api = api, .arg = arg, .title = title ? title : "",
            .query = query};
  p.live = !title || strcmp(title, "history");
  if (!path || !*path) path = "/";
  int status = 404;
  if (!strcmp(path, "/") || !strcmp(path, "/index.html")) {
    status = page_applications(&p);
  } else {
    int (*render)(page *) = NULL;
    size_t plen = strlen(path);
    for (size_t i = 0; i < sizeof PAGES / sizeof PAGES[0] && !render; i++) {
      size_t n = strlen(PAGES[i].path);
      /* "/jobs/" or "/jobs" */
      if (!strcmp(path, PAGES[i].path) || (plen == n - 1 && !strncmp(path, PAGES[i].path, plen))) render = PAGES[i].render;
    }
    if (!render) {
      status = not_found(&p, "page", path);
    } else {
      p.app = query_get(&p, "app");
      if (!p.app && p.o.st == FL_OK && (p.app = fl_malloc(sizeof "current"))) memcpy(p.app, "current", sizeof "current");
      if (!p.app) {
        p.o.st = FL_ENOMEM;
      } else if (!app_ok(p.app)) {
        status = not_found(&p, "application", p.app);
      } else {
        p.app_id = p.app;
        status = render(&p);
      }
    }
  }
  for (size_t i = 0; i < p.n_held; i++) json_decref(p.held[i]);
  for (size_t i = 0; i < p.n_strs; i++) fl_free(p.strs[i]);
  fl_free(p.held);
  fl_free(p.strs);
  fl_free(p.app);
  if (p.o.st != FL_OK) {
    /* Out of memory part-way: whatever was written is dropped for a one-line answer. */
    html->len = p.start;
    p.o.st = FL_OK;
    pages_put(&p.o, "<!DOCTYPE html><title>error</title><p>The page could not be rendered: out of memory.</p>\n");
    status = 500;
  }
  /* A NUL after the text (not counted), so callers may read it as a string. */
  if (fl_buf_reserve(html, 1) == FL_OK) html->data[html->len] = '\0';
  return status;
}
