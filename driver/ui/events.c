/*
 * events.c: the scheduler's notes as event lines (docs/ui.md), and the JSON text helper the
 * driver's producers use. A note becomes text on the scheduler thread (a few hundred bytes of
 * snprintf, no JSON tree): the UI thread parses it like any posted event, so the scheduler
 * pays for no store update and no disk write.
 */
#include <stdarg.h>
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

static const char *locality_name(uint8_t l) {
  return l == SCHED_PROCESS_LOCAL ? "PROCESS_LOCAL" : l == SCHED_NODE_LOCAL ? "NODE_LOCAL" : "ANY";
}

static const char *task_status(fl_status st) {
  return st == FL_OK ? "SUCCESS" : st == FL_ECANCELLED ? "KILLED" : "FAILED";
}

/* Appends printf-formatted text; false when out of memory. */
static bool append(fl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool append(fl_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || fl_buf_reserve(b, (size_t)n + 1) != FL_OK) return false;
  va_start(ap, fmt);
  vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return true;
}

static bool append_error(fl_buf *b, fl_status status, const char *error) {
  if (status == FL_OK) return true;
  return append(b, ",\"Error\":") && ui_json_string(b, error && *error ? error : fl_strerror(status)) == FL_OK;
}

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

bool ui_note_line(const sched_note *n, fl_buf *b) {
  unsigned long long app = (unsigned long long)n->group, job = (unsigned long long)n->job;
  unsigned long long task = (unsigned long long)n->task_id;
  switch (n->kind) {
  case SCHED_JOB_STARTED: return job_started_line(b, n);
  case SCHED_JOB_ENDED:
    return append(b, "{\"Event\":\"JobEnd\",\"App\":%llu,\"Job\":%llu,\"Result\":\"%s\"", app, job,
                  n->status == FL_OK ? "SUCCEEDED" : "FAILED") &&
           append_error(b, n->status, n->error) && append(b, "}");
  case SCHED_STAGE_SUBMITTED:
    return append(b, "{\"Event\":\"StageSubmitted\",\"App\":%llu,\"Job\":%llu,\"Stage\":%u,\"Attempt\":%u,\"Tasks\":%u}",
                  app, job, n->stage, n->stage_attempt, n->num_tasks);
  case SCHED_STAGE_COMPLETED:
    return append(b, "{\"Event\":\"StageCompleted\",\"App\":%llu,\"Job\":%llu,\"Stage\":%u,\"Attempt\":%u,\"Failed\":%s",
                  app, job, n->stage, n->stage_attempt, n->status == FL_OK ? "false" : "true") &&
           append_error(b, n->status, n->error) && append(b, "}");
  case SCHED_TASK_STARTED:
    return append(b,
                  "{\"Event\":\"TaskStart\",\"App\":%llu,\"Job\":%llu,\"Stage\":%u,\"StageAttempt\":%u,\"Task\":%llu,"
                  "\"Index\":%u,\"Attempt\":%u,\"Executor\":%llu,\"Locality\":\"%s\",\"Speculative\":%s}",
                  app, job, n->stage, n->stage_attempt, task, n->index, n->attempt, (unsigned long long)n->executor,
                  locality_name(n->locality), n->speculative ? "true" : "false");
  case SCHED_TASK_ENDED:
    return append(b,
                  "{\"Event\":\"TaskEnd\",\"App\":%llu,\"Job\":%llu,\"Stage\":%u,\"StageAttempt\":%u,\"Task\":%llu,"
                  "\"Index\":%u,\"Attempt\":%u,\"Executor\":%llu,\"Status\":\"%s\",\"Duration\":%.3f,"
                  "\"RunTime\":%.3f,\"InputBytes\":%llu,\"ShuffleReadBytes\":%llu,\"ShuffleWriteBytes\":%llu",
                  app, job, n->stage, n->stage_attempt, task, n->index, n->attempt, (unsigned long long)n->executor,
                  task_status(n->status), (double)n->duration_ns / 1e6, (double)n->run_ns / 1e6,
                  (unsigned long long)n->input_bytes, (unsigned long long)n->shuffle_read_bytes,
                  (unsigned long long)n->shuffle_write_bytes) &&
           append_error(b, n->status, n->error) && append(b, "}");
  }
  return false;
}

void ui_post_application(ui *u, uint64_t app, const char *name, const char *master) {
  if (!u) return;
  fl_buf b = FL_BUF_INIT;
  const char *user = getenv("USER");
  bool ok = append(&b, "{\"Event\":\"ApplicationStart\",\"App\":%llu,\"Name\":", (unsigned long long)app) &&
            ui_json_string(&b, name) == FL_OK && append(&b, ",\"User\":") &&
            ui_json_string(&b, user ? user : "") == FL_OK && append(&b, ",\"Master\":") &&
            ui_json_string(&b, master) == FL_OK && append(&b, "}");
  if (ok) ui_post(u, (const char *)b.data);
  /* Environment: every setting with its value where one is given (secrets hidden). */
  b.len = 0;
  ok = append(&b, "{\"Event\":\"Environment\",\"App\":%llu,\"Properties\":[", (unsigned long long)app);
  bool first = true;
  for (int id = 0; ok && id < CONFIG_SETTINGS; id++) {
    const config_setting *row = config_setting_of((config_id)id);
    const char *given = config_text((config_id)id);
    const char *value = !given ? row->default_text : row->flags & CONFIG_HIDDEN ? "(hidden)" : given;
    ok = append(&b, "%s[", first ? "" : ",") && ui_json_string(&b, row->name) == FL_OK && append(&b, ",") &&
         ui_json_string(&b, value) == FL_OK && append(&b, "]");
    first = false;
  }
  if (ok && append(&b, "]}")) ui_post(u, (const char *)b.data);
  fl_buf_free(&b);
}
