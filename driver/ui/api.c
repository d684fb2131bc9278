/*
 * api.c: the REST API (/api/v1, docs/ui.md) over the store, in Spark's shapes where they fit:
 * copies of the store's records without its own ('_') fields, lists newest first as Spark's
 * are. Live figures that no event carries (executors' last heartbeats, parameter servers'
 * clocks) are merged in from the driver when it gives a `live` source. Runs on the HTTP
 * thread; locks the store while it copies.
 */
#include <stdlib.h>
#include <string.h>

#include "driver/ui/ui_internal.h"

#define API_MAX_SEGMENTS 8

/* A deep copy of v without the store's own fields. */
static json_t *public_copy(const json_t *v) {
  if (json_is_object(v)) {
    json_t *out = json_object();
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
      if (k[0] != '_') json_object_set_new(out, k, public_copy(x));
    }
    return out;
  }
  if (json_is_array(v)) {
    json_t *out = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) json_array_append_new(out, public_copy(x));
    return out;
  }
  return json_deep_copy(v);
}

/* The values of an object as an array, newest (last inserted) first: copies, or (borrow) the
 * store's own values, for an answer written out before the store is unlocked. */
static json_t *values_newest_first(const json_t *obj, bool borrow) {
  json_t *out = json_array();
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)obj, k, x) {
    if (borrow) json_array_insert(out, 0, x);
    else json_array_insert_new(out, 0, public_copy(x));
  }
  return out;
}

static json_t *application_summary(const json_t *app) {
  json_int_t start = json_integer_value(json_object_get(app, "startTime"));
  json_int_t end = json_integer_value(json_object_get(app, "endTime"));
  bool completed = json_is_true(json_object_get(app, "completed"));
  return json_pack("{s:s, s:s, s:[{s:I, s:I, s:I, s:b, s:s}]}", "id", json_string_value(json_object_get(app, "id")),
                   "name", json_string_value(json_object_get(app, "name")), "attempts", "startTime", start, "endTime",
                   end, "duration", completed && end >= start ? end - start : (json_int_t)0, "completed", completed,
                   "sparkUser", json_string_value(json_object_get(app, "user")));
}

/* An application's number: the digits after its id's last '-'. */
static uint64_t app_number(const char *id) {
  const char *dash = strrchr(id, '-');
  return dash ? strtoull(dash + 1, NULL, 10) : 0;
}

/* Merges the live figures of `what` (a JSON object of objects, keyed as `into`'s items by
 * `key`) into the array `into`. */
static void merge_live(json_t *into, const char *key, const char *text) {
  json_t *live = text ? json_loads(text, 0, NULL) : NULL;
  if (!json_is_object(live)) {
    json_decref(live);
    return;
  }
  size_t i;
  json_t *item;
  json_array_foreach(into, i, item) {
    const json_t *k = json_object_get(item, key);
    char buf[32];
    const char *name = json_string_value(k);
    if (!name) {
      snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(k));
      name = buf;
    }
    json_t *extra = json_object_get(live, name);
    if (json_is_object(extra)) json_object_update(item, extra);
  }
  json_decref(live);
}

static json_t *storage_rdd(const json_t *r) {
  json_t *out = public_copy(r);
  json_t *dist = json_object(), *parts = json_object();
  json_int_t mem = 0, disk = 0;
  const char *k;
  json_t *b;
  json_object_foreach(json_object_get(r, "_blocks"), k, b) {
    json_int_t m = json_integer_value(json_object_get(b, "memoryUsed"));
    json_int_t d = json_integer_value(json_object_get(b, "diskUsed"));
    const char *exec = json_string_value(json_object_get(b, "executor"));
    mem += m;
    disk += d;
    json_t *e = json_object_get(dist, exec);
    if (!e) {
      e = json_pack("{s:s, s:I, s:I}", "address", exec, "memoryUsed", (json_int_t)0, "diskUsed", (json_int_t)0);
      json_object_set_new(dist, exec, e);
    }
    json_object_set_new(e, "memoryUsed", json_integer(json_integer_value(json_object_get(e, "memoryUsed")) + m));
    json_object_set_new(e, "diskUsed", json_integer(json_integer_value(json_object_get(e, "diskUsed")) + d));
    char name[48];
    snprintf(name, sizeof name, "rdd_%lld_%lld", (long long)json_integer_value(json_object_get(r, "id")),
             (long long)json_integer_value(json_object_get(b, "partition")));
    json_t *p = json_object_get(parts, name);
    if (!p) {
      p = json_pack("{s:s, s:I, s:I, s:[]}", "blockName", name, "memoryUsed", (json_int_t)0, "diskUsed",
                    (json_int_t)0, "executors");
      json_object_set_new(parts, name, p);
    }
    json_object_set_new(p, "memoryUsed", json_integer(json_integer_value(json_object_get(p, "memoryUsed")) + m));
    json_object_set_new(p, "diskUsed", json_integer(json_integer_value(json_object_get(p, "diskUsed")) + d));
    json_array_append_new(json_object_get(p, "executors"), json_string(exec));
  }
  json_t *dist_list = json_array(), *part_list = json_array(), *x;
  json_object_foreach(dist, k, x) json_array_append(dist_list, x);
  json_object_foreach(parts, k, x) json_array_append(part_list, x);
  json_decref(dist);
  json_decref(parts);
  json_object_set_new(out, "numCachedPartitions", json_integer((json_int_t)json_array_size(part_list)));
  json_object_set_new(out, "memoryUsed", json_integer(mem));
  json_object_set_new(out, "diskUsed", json_integer(disk));
  json_object_set_new(out, "dataDistribution", dist_list);
  json_object_set_new(out, "partitions", part_list);
  if (!json_object_get(out, "name")) json_object_set_new(out, "name", json_string("dataset"));
  if (!json_object_get(out, "storageLevel")) json_object_set_new(out, "storageLevel", json_string("MEMORY"));
  return out;
}

static json_t *not_found(int *status) {
  *status = 404;
  return NULL;
}

/* One application's part of the API: seg[0] is what ("jobs", ...), the rest its arguments. */
/* live figures to merge once the store is unlocked (the driver's source may block) */
typedef struct live_want {
  const char *what, *key; /* what to ask for; the items' field it is keyed by */
  uint64_t app;
} live_want;

/* borrow: the lists of jobs and stages may hold the store's own values (see api_answer). */
static json_t *app_answer(const json_t *app, char **seg, int n, bool borrow, live_want *want, int *status) {
  const char *what = seg[0];
  char *end;
  if (strcmp(what, "jobs") == 0) {
    const json_t *jobs = json_object_get(app, "jobs");
    if (n == 1) return values_newest_first(jobs, borrow);
    if (n != 2) return not_found(status);
    strtoull(seg[1], &end, 10);
    const json_t *job = *end ? NULL : json_object_get(jobs, seg[1]);
    return job ? public_copy(job) : not_found(status);
  }
  if (strcmp(what, "stages") == 0) {
    const json_t *stages = json_object_get(app, "stages");
    if (n == 1) return values_newest_first(stages, borrow);
    strtoull(seg[1], &end, 10);
    const json_t *st = *end ? NULL : json_object_get(stages, seg[1]);
    if (!st) return not_found(status);
    const json_t *tasks = json_object_get(json_object_get(app, "_tasks"), seg[1]);
    if (n == 2) {
      json_t *one = public_copy(st);
      json_object_set_new(one, "tasks", tasks ? public_copy(tasks) : json_object());
      return json_pack("[o]", one);
    }
    if (n == 4 && strcmp(seg[3], "taskList") == 0) {
      json_int_t attempt = strtoll(seg[2], &end, 10);
      if (*end) return not_found(status);
      json_t *out = json_array();
      const char *k;
      json_t *t;
      json_object_foreach((json_t *)tasks, k, t) {
        if (json_integer_value(json_object_get(t, "stageAttemptId")) == attempt)
          json_array_append_new(out, public_copy(t));
      }
      return out;
    }
    return not_found(status);
  }
  uint64_t number = app_number(json_string_value(json_object_get(app, "id")));
  if (strcmp(what, "executors") == 0 && n == 1) {
    json_t *out = json_array();
    const char *k;
    json_t *x;
    json_object_foreach(json_object_get(app, "executors"), k, x) json_array_append_new(out, public_copy(x));
    if (!json_is_true(json_object_get(app, "completed"))) *want = (live_want){"executors", "id", number};
    return out;
  }
  if (strcmp(what, "storage") == 0 && n >= 2 && strcmp(seg[1], "rdd") == 0) {
    const json_t *rdds = json_object_get(app, "rdds");
    if (n == 2) {
      json_t *out = json_array();
      const char *k;
      json_t *r;
      json_object_foreach((json_t *)rdds, k, r) {
        if (json_object_size(json_object_get(r, "_blocks"))) json_array_append_new(out, storage_rdd(r));
      }
      return out;
    }
    const json_t *r = n == 3 ? json_object_get(rdds, seg[2]) : NULL;
    return r ? storage_rdd(r) : not_found(status);
  }
  if (strcmp(what, "environment") == 0 && n == 1)
    return json_pack("{s:O}", "flintProperties", json_object_get(app, "environment"));
  if (strcmp(what, "ps") == 0 && n == 1) {
    json_t *out = json_array();
    const char *k;
    json_t *t;
    json_object_foreach(json_object_get(app, "ps"), k, t) json_array_append_new(out, public_copy(t));
    if (!json_is_true(json_object_get(app, "completed"))) *want = (live_want){"ps", "table", number};
    return out;
  }
  if (strcmp(what, "training") == 0 && n == 1) {
    json_t *out = json_array();
    const char *k;
    json_t *r;
    json_object_foreach(json_object_get(app, "training"), k, r) json_array_append_new(out, public_copy(r));
    return out;
  }
  return not_found(status);
}

json_t *api_answer(ui_store *s, char *(*live)(void *, const char *, uint64_t), void *live_arg, const char *path,
                   int *status, fl_buf *text) {
  *status = 200;
  char copy[512];
  if (strlen(path) >= sizeof copy) return not_found(status);
  snprintf(copy, sizeof copy, "%s", path);
  char *seg[API_MAX_SEGMENTS], *save = NULL;
  int n = 0;
  for (char *t = strtok_r(copy, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
    if (n == API_MAX_SEGMENTS) return not_found(status);
    seg[n++] = t;
  }
  if (n == 0 || strcmp(seg[0], "applications") != 0) return not_found(status);
  live_want want = {0};
  store_lock(s);
  json_t *apps = store_apps(s), *out = NULL;
  if (n == 1) {
    out = json_array();
    const char *k;
    json_t *a;
    json_object_foreach(apps, k, a) json_array_insert_new(out, 0, application_summary(a));
  } else {
    const json_t *app = json_object_get(apps, seg[1]);
    if (strcmp(seg[1], "current") == 0) { /* the newest application */
      const char *k;
      json_t *a;
      json_object_foreach(apps, k, a) app = a;
    }
    if (!app) out = not_found(status);
    else if (n == 2) out = application_summary(app);
    else out = app_answer(app, seg + 2, n - 2, text != NULL, &want, status);
  }
  /* Written out now, under the lock, the answer may hold the store's values uncopied: a
   * dashboard polling a thousand jobs costs the UI a pass over them, not a copy of them. */
  if (text && out && !want.what) {
    size_t len = json_dumpb(out, NULL, 0, JSON_COMPACT);
    if (len == 0 || fl_buf_reserve(text, len + 1) != FL_OK || json_dumpb(out, (char *)text->data + text->len, len,
                                                                         JSON_COMPACT) != len)
      *status = 500;
    else text->len += len;
    json_decref(out);
    store_unlock(s);
    return NULL;
  }
  store_unlock(s);
  if (out && want.what && live) {
    char *figures = live(live_arg, want.what, want.app);
    merge_live(out, want.key, figures);
    free(figures);
  }
  if (text && out) { /* live figures merged into copies */
    char *dumped = json_dumps(out, JSON_COMPACT);
    if (!dumped || fl_buf_append(text, dumped, strlen(dumped)) != FL_OK) *status = 500;
    free(dumped);
    json_decref(out);
    return NULL;
  }
  return out;
}
