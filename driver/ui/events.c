/*
 * events.c: the scheduler's notes as events (docs/ui.md), and the JSON text helpers of the
 * driver's producers. A job's start, whose stages the note only borrows, becomes a line of
 * text on the scheduler's thread; every other note is copied as it is and becomes a JSON
 * object on the UI thread (ui_note_event), with no text to format or parse in between.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/config.h"
#include "driver/ui/ui_internal.h"

fl_status ui_json_string(fl_buf *out, const char *s) {
  static const char hex[] = "0123456789abcdef";
  if (!s) s = "";
  fl_status st = fl_buf_reserve(out, strlen(s) * 6 + 3);
  if (st != FL_OK) return st;
  char *p = (char *)out->data + out->len;
  *p++ = '"';
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    if (*c == '"' || *c == '\\') {
      *p++ = '\\';
      *p++ = (char)*c;
    } else if (*c < 0x20) {
      memcpy(p, "\\u00", 4);
      p[4] = hex[*c >> 4];
      p[5] = hex[*c & 15];
      p += 6;
    } else {
      *p++ = (char)*c;
    }
  }
  *p++ = '"';
  out->len = (size_t)(p - (char *)out->data);
  return FL_OK;
}

uint64_t ui_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Appends printf-formatted text (common_buf_printf); false when out of memory. */
#define append(b, ...) (common_buf_printf((b), __VA_ARGS__) == FL_OK)

static bool job_started_line(fl_buf *b, const sched_note *n) {
  bool ok = append(b, "{\"Event\":\"JobStart\",\"App\":%llu,\"Job\":%llu,\"Name\":", (unsigned long long)n->group,
                   (unsigned long long)n->job) &&
            ui_json_string(b, n->num_stages ? n->stages[0].name : "job") == FL_OK && append(b, ",\"Stages\":[");
  for (uint32_t i = 0; ok && i < n->num_stages; i++) {
    const sched_stage_desc *d = &n->stages[i];
    ok = append(b, "%s{\"Stage\":%u,\"Name\":", i ? "," : "", d->id) && ui_json_string(b, d->name) == FL_OK &&
         append(b, ",\"Tasks\":%u,\"Parents\":[", d->num_tasks);
    for (uint32_t k = 0; ok && k < d->num_parents; k++) ok = append(b, "%s%u", k ? "," : "", d->parents[k]);
    ok = ok && append(b, "],\"RDDs\":[");
    for (uint32_t k = 0; ok && k < d->num_rdds; k++) {
      const rdd *r = d->rdds[k];
      ok = append(b, "%s{\"RDD\":%llu,\"Name\":", k ? "," : "", (unsigned long long)r->id) &&
           ui_json_string(b, r->ops && r->ops->name ? r->ops->name : "dataset") == FL_OK &&
           append(b, ",\"Partitions\":%u,\"Cached\":%s}", r->num_partitions,
                  atomic_load(&((rdd *)r)->level) != FL_STORAGE_NONE ? "true" : "false");
    }
    ok = ok && append(b, "]}");
  }
  return ok && append(b, "]}");
}

bool ui_job_started_line(const sched_note *n, fl_buf *b) { return job_started_line(b, n); }

bool ui_application_start_line(uint64_t app, const char *name, const char *master, fl_buf *b) {
  const char *user = getenv("USER");
  return append(b, "{\"Event\":\"ApplicationStart\",\"App\":%llu,\"Name\":", (unsigned long long)app) &&
         ui_json_string(b, name) == FL_OK && append(b, ",\"User\":") &&
         ui_json_string(b, user ? user : "") == FL_OK && append(b, ",\"Master\":") &&
         ui_json_string(b, master) == FL_OK && append(b, "}");
}

bool ui_environment_line(uint64_t app, fl_buf *b) {
  /* every setting with its value where one is given (secrets hidden) */
  bool ok = append(b, "{\"Event\":\"Environment\",\"App\":%llu,\"Properties\":[", (unsigned long long)app);
  bool first = true;
  for (int id = 0; ok && id < CONFIG_SETTINGS; id++) {
    const config_setting *row = config_setting_of((config_id)id);
    const char *given = config_text((config_id)id);
    const char *value = !given ? row->default_text : row->flags & CONFIG_HIDDEN ? "(hidden)" : given;
    ok = append(b, "%s[", first ? "" : ",") && ui_json_string(b, row->name) == FL_OK && append(b, ",") &&
         ui_json_string(b, value) == FL_OK && append(b, "]");
    first = false;
  }
  return ok && append(b, "]}");
}

/* json_object_set_new for the hot path: the keys are literals, so no copy is needed. */
static void put_int(json_t *o, const char *key, json_int_t v) { json_object_set_new_nocheck(o, key, json_integer(v)); }
static void put_str(json_t *o, const char *key, const char *v) {
  json_object_set_new_nocheck(o, key, json_string(v));
}
static void put_error(json_t *o, fl_status status, const char *error) {
  if (status != FL_OK) put_str(o, "Error", error && *error ? error : fl_strerror(status));
}

json_t *ui_note_event(const sched_note *n) {
  json_t *ev = json_object();
  if (!ev) return NULL;
  static const char *const names[] = {[SCHED_JOB_STARTED] = "JobStart", [SCHED_JOB_ENDED] = "JobEnd",         [SCHED_STAGE_SUBMITTED] = "StageSubmitted",
                                      [SCHED_STAGE_COMPLETED] = "StageCompleted", [SCHED_TASK_STARTED] = "TaskStart",
                                      [SCHED_TASK_ENDED] = "TaskEnd"};
  put_str(ev, "Event", names[n->kind]);
  put_int(ev, "App", (json_int_t)n->group);
  put_int(ev, "Job", (json_int_t)n->job);
  switch (n->kind) {
  case SCHED_JOB_STARTED: /* ui_job_started_line's: its stages are borrowed */
    break;
  case SCHED_JOB_ENDED:
    put_str(ev, "Result", n->status == FL_OK ? "SUCCEEDED" : "FAILED");
    put_error(ev, n->status, n->error);
    break;
  case SCHED_STAGE_SUBMITTED:
  case SCHED_STAGE_COMPLETED:
    put_int(ev, "Stage", n->stage);
    put_int(ev, "Attempt", n->stage_attempt);
    if (n->kind == SCHED_STAGE_SUBMITTED) {
      put_int(ev, "Tasks", n->num_tasks);
    } else {
      json_object_set_new_nocheck(ev, "Failed", json_boolean(n->status != FL_OK));
      put_error(ev, n->status, n->error);
    }
    break;
  case SCHED_TASK_STARTED:
  case SCHED_TASK_ENDED:
    put_int(ev, "Stage", n->stage);
    put_int(ev, "StageAttempt", n->stage_attempt);
    put_int(ev, "Task", (json_int_t)n->task_id);
    put_int(ev, "Index", n->index);
    put_int(ev, "Attempt", n->attempt);
    put_int(ev, "Executor", (json_int_t)n->executor);
    if (n->kind == SCHED_TASK_STARTED) {
      put_str(ev, "Locality", ui_locality_name(n->locality));
      json_object_set_new_nocheck(ev, "Speculative", json_boolean(n->speculative));
    } else {
      put_str(ev, "Status", ui_task_status(n->status));
      json_object_set_new_nocheck(ev, "Duration", json_real((double)n->duration_ns / 1e6));
      json_object_set_new_nocheck(ev, "RunTime", json_real((double)n->run_ns / 1e6));
      put_int(ev, "InputBytes", (json_int_t)n->input_bytes);
      put_int(ev, "ShuffleReadBytes", (json_int_t)n->shuffle_read_bytes);
      put_int(ev, "ShuffleWriteBytes", (json_int_t)n->shuffle_write_bytes);
      put_error(ev, n->status, n->error);
    }
    break;
  }
  return ev;
}
