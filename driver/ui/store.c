/*
 * store.c: the model the events build (docs/ui.md): per application its jobs, stages and their
 * tasks, executors, cached datasets, environment, parameter-server tables and training runs.
 * The model is JSON values in the REST API's shapes, so that api.c hands out copies of them;
 * fields that start with '_' are the store's own and never leave it. An application's tasks
 * are kept by stage in its "_tasks" (stage id -> task id -> task), apart from the stages.
 *
 * Retention, as Spark's spark.ui.retainedJobs and retainedTasks: an application keeps its
 * STORE_RETAINED_JOBS newest jobs (with their stages) and a stage its STORE_RETAINED_TASKS
 * newest attempts of tasks, so a long-running driver's memory stays bounded.
 *
 * Threading: every entry point locks the store; the UI thread applies, the HTTP thread reads.
 */
#include <stdio.h>
#include <string.h>

#include "driver/ui/ui_internal.h"

#define STORE_RETAINED_JOBS 1000
#define STORE_RETAINED_TASKS 10000
/* Training steps kept per run (the curves need no more points). */
#define STORE_RETAINED_STEPS 20000

struct ui_store {
  pthread_mutex_t lock;
  json_t *apps;      /* id -> application, oldest first */
  json_t *executors; /* the driver's live executors: id -> their ExecutorAdded event */
};

fl_status store_create(ui_store **out) {
  ui_store *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory");
  s->apps = json_object();
  s->executors = json_object();
  if (!s->apps || !s->executors) {
    store_destroy(s);
    return FL_ERR(FL_ENOMEM, "out of memory");
  }
  FL_PCHECK(pthread_mutex_init(&s->lock, NULL));
  *out = s;
  return FL_OK;
}

void store_destroy(ui_store *s) {
  if (!s) return;
  json_decref(s->apps);
  json_decref(s->executors);
  pthread_mutex_destroy(&s->lock);
  common_free(s);
}

void store_lock(ui_store *s) { FL_PCHECK(pthread_mutex_lock(&s->lock)); }
void store_unlock(ui_store *s) { FL_PCHECK(pthread_mutex_unlock(&s->lock)); }

/* ---- small JSON helpers ------------------------------------------------------------------ */
static json_int_t geti(const json_t *o, const char *key) {
  const json_t *v = json_object_get(o, key);
  return json_is_integer(v) ? json_integer_value(v) : json_is_real(v) ? (json_int_t)json_real_value(v) : 0;
}
static double getd(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }
static const char *gets(const json_t *o, const char *key, const char *dflt) {
  const char *v = json_string_value(json_object_get(o, key));
  return v ? v : dflt;
}
/* The setters change a value of the same type in place: a task's counters change at every
 * event, and a new value each time would cost an allocation and a free. */
static void seti(json_t *o, const char *key, json_int_t v) {
  json_t *old = json_object_get(o, key);
  if (json_is_integer(old)) json_integer_set(old, v);
  else json_object_set_new(o, key, json_integer(v));
}
static void addi(json_t *o, const char *key, json_int_t d) { seti(o, key, geti(o, key) + d); }
static void addd(json_t *o, const char *key, double d) {
  json_t *old = json_object_get(o, key);
  if (json_is_real(old)) json_real_set(old, json_real_value(old) + d);
  else json_object_set_new(o, key, json_real(getd(o, key) + d));
}
static void sets(json_t *o, const char *key, const char *v) {
  json_t *old = json_object_get(o, key);
  if (json_is_string(old)) json_string_set(old, v ? v : "");
  else json_object_set_new(o, key, json_string(v ? v : ""));
}
static void setb(json_t *o, const char *key, bool v) { json_object_set_new(o, key, json_boolean(v)); }
/* o[key] as an object, made when absent. */
static json_t *child(json_t *o, const char *key) {
  json_t *c = json_object_get(o, key);
  if (!json_is_object(c)) {
    c = json_object();
    json_object_set_new(o, key, c);
  }
  return c;
}
static void key_of(char *buf, size_t cap, json_int_t v) { snprintf(buf, cap, "%lld", (long long)v); }

/* An executor's id as the API names it: local contexts run tasks on the "driver". */
static void executor_key(char *buf, size_t cap, json_int_t id) {
  if (id == 0) snprintf(buf, cap, "driver");
  else key_of(buf, cap, id);
}

/* ---- the vocabulary of notes' fields ---------------------------------------------------- */
const char *ui_locality_name(uint8_t l) {
  return l == SCHED_PROCESS_LOCAL ? "PROCESS_LOCAL" : l == SCHED_NODE_LOCAL ? "NODE_LOCAL" : "ANY";
}

const char *ui_task_status(fl_status st) {
  return st == FL_OK ? "SUCCESS" : st == FL_ECANCELLED ? "KILLED" : "FAILED";
}

/* ---- applications and executors ---------------------------------------------------------- */
static json_t *app_get(ui_store *s, const char *id) {
  json_t *a = json_object_get(s->apps, id);
  if (a) return a;
  a = json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:b}", "id", id, "name", id, "user", "", "master", "", "startTime",
                (json_int_t)0, "endTime", (json_int_t)-1, "completed", 0);
  if (!a) return NULL;
  json_object_set_new(a, "jobs", json_object());
  json_object_set_new(a, "stages", json_object());
  json_object_set_new(a, "executors", json_object());
  json_object_set_new(a, "rdds", json_object());
  json_object_set_new(a, "environment", json_array());
  json_object_set_new(a, "ps", json_object());
  json_object_set_new(a, "training", json_object());
  json_object_set_new(s->apps, id, a);
  return a;
}

static void executor_added(json_t *app, const json_t *ev, json_int_t time) {
  char key[32];
  executor_key(key, sizeof key, geti(ev, "Executor"));
  json_t *x = child(child(app, "executors"), key);
  sets(x, "id", key);
  sets(x, "hostPort", gets(ev, "Host", "localhost"));
  setb(x, "isActive", true);
  seti(x, "totalCores", geti(ev, "Cores"));
  seti(x, "maxMemory", geti(ev, "Memory"));
  seti(x, "gpu", json_object_get(ev, "GPU") ? geti(ev, "GPU") : -1);
  seti(x, "addTime", geti(ev, "Time") ? geti(ev, "Time") : time);
  static const char *const zero[] = {"rddBlocks",      "memoryUsed",     "diskUsed",   "activeTasks", "failedTasks",
                                     "completedTasks", "totalTasks",     "totalDuration"};
  for (size_t i = 0; i < sizeof zero / sizeof *zero; i++)
    if (!json_object_get(x, zero[i])) seti(x, zero[i], 0);
}

/* The application's record of executor `id`, made (as seen only through its tasks) when new. */
static json_t *executor_of(json_t *app, json_int_t id) {
  char key[32];
  executor_key(key, sizeof key, id);
  json_t *x = json_object_get(json_object_get(app, "executors"), key);
  if (x) return x;
  json_t *ev = json_pack("{s:I, s:s}", "Executor", id, "Host", id == 0 ? "localhost" : "");
  executor_added(app, ev, 0);
  json_decref(ev);
  return json_object_get(json_object_get(app, "executors"), key);
}

static void drop_blocks(json_t *app, json_t *r, const char *exec);

static void executor_removed(json_t *app, const json_t *ev) {
  char key[32];
  executor_key(key, sizeof key, geti(ev, "Executor"));
  json_t *x = json_object_get(json_object_get(app, "executors"), key);
  if (!x) return;
  /* its cached blocks went with it */
  const char *id;
  json_t *r;
  json_object_foreach(json_object_get(app, "rdds"), id, r) drop_blocks(app, r, key);
  setb(x, "isActive", false);
  seti(x, "removeTime", geti(ev, "Time"));
  sets(x, "removeReason", gets(ev, "Reason", "lost"));
}

/* ---- jobs and stages --------------------------------------------------------------------- */
/* A persisted dataset a job uses ({RDD, Name, Partitions} of JobStart): the storage page's
 * name and partition count for it, unless its blocks' events gave them (a local context's
 * block manager knows no names). */
static void cached_dataset(json_t *app, const json_t *r) {
  char key[32];
  key_of(key, sizeof key, geti(r, "RDD"));
  json_t *c = child(child(app, "rdds"), key);
  seti(c, "id", geti(r, "RDD"));
  if (!*gets(c, "name", "")) sets(c, "name", gets(r, "Name", ""));
  if (!geti(c, "numPartitions")) seti(c, "numPartitions", geti(r, "Partitions"));
}

static void forget_oldest_job(json_t *app) {
  json_t *jobs = json_object_get(app, "jobs"), *stages = json_object_get(app, "stages");
  void *it = json_object_iter(jobs);
  if (!it) return;
  json_t *job = json_object_iter_value(it);
  size_t i;
  json_t *id;
  json_array_foreach(json_object_get(job, "stageIds"), i, id) {
    char key[32];
    key_of(key, sizeof key, json_integer_value(id));
    json_object_del(stages, key);
    json_object_del(json_object_get(app, "_tasks"), key);
  }
  json_object_del(jobs, json_object_iter_key(it));
}

static void job_start(json_t *app, const json_t *ev) {
  json_t *jobs = child(app, "jobs"), *stages = child(app, "stages");
  json_int_t id = geti(ev, "Job"), time = geti(ev, "Time"), tasks = 0;
  json_t *stage_ids = json_array();
  size_t i;
  json_t *d;
  json_array_foreach(json_object_get(ev, "Stages"), i, d) {
    json_int_t sid = geti(d, "Stage");
    char key[32];
    key_of(key, sizeof key, sid);
    json_array_append_new(stage_ids, json_integer(sid));
    tasks += geti(d, "Tasks");
    json_t *rdds = json_array(), *r;
    size_t k;
    json_array_foreach(json_object_get(d, "RDDs"), k, r) {
      json_array_append_new(rdds, json_pack("{s:I, s:s, s:I, s:b}", "id", geti(r, "RDD"), "name",
                                            gets(r, "Name", ""), "numPartitions", geti(r, "Partitions"), "cached",
                                            json_is_true(json_object_get(r, "Cached"))));
      if (json_is_true(json_object_get(r, "Cached"))) cached_dataset(app, r);
    }
    json_t *parents = json_object_get(d, "Parents");
    json_t *st = json_pack("{s:I, s:I, s:s, s:s, s:[I], s:O, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, "
                           "s:o}",
                           "stageId", sid, "attemptId", (json_int_t)0, "name", gets(d, "Name", "stage"), "status",
                           "PENDING", "jobIds", id, "parentIds", parents ? parents : json_null(), "numTasks",
                           geti(d, "Tasks"), "numActiveTasks", (json_int_t)0, "numCompleteTasks", (json_int_t)0,
                           "numFailedTasks", (json_int_t)0, "numKilledTasks", (json_int_t)0, "submissionTime",
                           (json_int_t)-1, "completionTime", (json_int_t)-1, "executorRunTime", 0.0, "inputBytes",
                           (json_int_t)0, "shuffleReadBytes", (json_int_t)0, "shuffleWriteBytes", (json_int_t)0,
                           "rddInfos", rdds);
    if (st) json_object_set_new(stages, key, st);
  }
  json_t *job = json_pack("{s:I, s:s, s:I, s:I, s:o, s:s, s:I, s:I, s:I, s:I, s:I}", "jobId", id, "name",
                          gets(ev, "Name", "job"), "submissionTime", time, "completionTime", (json_int_t)-1,
                          "stageIds", stage_ids, "status", "RUNNING", "numTasks", tasks, "numActiveTasks",
                          (json_int_t)0, "numCompletedTasks", (json_int_t)0, "numFailedTasks", (json_int_t)0,
                          "numKilledTasks", (json_int_t)0);
  char key[32];
  key_of(key, sizeof key, id);
  if (job) json_object_set_new(jobs, key, job);
  while (json_object_size(jobs) > STORE_RETAINED_JOBS) forget_oldest_job(app);
}

static json_t *job_of(json_t *app, const json_t *ev) {
  char key[32];
  key_of(key, sizeof key, geti(ev, "Job"));
  return json_object_get(json_object_get(app, "jobs"), key);
}

static json_t *stage_of(json_t *app, const json_t *ev) {
  char key[32];
  key_of(key, sizeof key, geti(ev, "Stage"));
  return json_object_get(json_object_get(app, "stages"), key);
}

static void job_end(json_t *app, const json_t *ev) {
  json_t *job = job_of(app, ev);
  if (!job) return;
  sets(job, "status", gets(ev, "Result", "FAILED"));
  seti(job, "completionTime", geti(ev, "Time"));
  if (json_object_get(ev, "Error")) sets(job, "errorMessage", gets(ev, "Error", ""));
  /* Stages that never ran were skipped (their output was there already). */
  size_t i;
  json_t *id;
  json_array_foreach(json_object_get(job, "stageIds"), i, id) {
    char key[32];
    key_of(key, sizeof key, json_integer_value(id));
    json_t *st = json_object_get(json_object_get(app, "stages"), key);
    if (st && strcmp(gets(st, "status", ""), "PENDING") == 0) sets(st, "status", "SKIPPED");
  }
}

static void stage_submitted(json_t *app, const json_t *ev) {
  json_t *st = stage_of(app, ev);
  if (!st) return;
  json_int_t attempt = geti(ev, "Attempt");
  if (attempt != geti(st, "attemptId") || strcmp(gets(st, "status", ""), "PENDING") != 0) {
    /* a new attempt (lost map output run again): its own counts */
    seti(st, "numCompleteTasks", 0);
    seti(st, "numFailedTasks", 0);
    seti(st, "numKilledTasks", 0);
  }
  seti(st, "attemptId", attempt);
  seti(st, "numTasks", geti(ev, "Tasks"));
  sets(st, "status", "ACTIVE");
  seti(st, "submissionTime", geti(ev, "Time"));
  seti(st, "completionTime", -1);
}

static void stage_completed(json_t *app, const json_t *ev) {
  json_t *st = stage_of(app, ev);
  if (!st) return;
  bool failed = json_is_true(json_object_get(ev, "Failed"));
  sets(st, "status", failed ? "FAILED" : "COMPLETE");
  seti(st, "completionTime", geti(ev, "Time"));
  if (failed) sets(st, "failureReason", gets(ev, "Error", ""));
}

/* ---- tasks ------------------------------------------------------------------------------- */
static void forget_oldest_task(json_t *tasks) {
  void *it = json_object_iter(tasks);
  /* Keep running attempts: they still end. */
  while (it && strcmp(gets(json_object_iter_value(it), "status", ""), "RUNNING") == 0)
    it = json_object_iter_next(tasks, it);
  if (it) json_object_del(tasks, json_object_iter_key(it));
  else json_object_del(tasks, json_object_iter_key(json_object_iter(tasks)));
}

/* A task event's fields, read from the event (a log's line) or from the scheduler's note
 * itself (store_apply_task: the live path, with no event made). */
typedef struct task_fields {
  json_int_t job, stage, stage_attempt, task, index, attempt, executor, time;
  const char *locality, *status, *error;
  bool speculative;
  double duration, run_ms;
  json_int_t in, rd, wr;
} task_fields;

static task_fields fields_of_event(const json_t *ev) {
  return (task_fields){.job = geti(ev, "Job"),
                       .stage = geti(ev, "Stage"),
                       .stage_attempt = geti(ev, "StageAttempt"),
                       .task = geti(ev, "Task"),
                       .index = geti(ev, "Index"),
                       .attempt = geti(ev, "Attempt"),
                       .executor = geti(ev, "Executor"),
                       .time = geti(ev, "Time"),
                       .locality = gets(ev, "Locality", "ANY"),
                       .status = gets(ev, "Status", "FAILED"),
                       .error = gets(ev, "Error", NULL),
                       .speculative = json_is_true(json_object_get(ev, "Speculative")),
                       .duration = getd(ev, "Duration"),
                       .run_ms = getd(ev, "RunTime"),
                       .in = geti(ev, "InputBytes"),
                       .rd = geti(ev, "ShuffleReadBytes"),
                       .wr = geti(ev, "ShuffleWriteBytes")};
}

static json_t *by_number(json_t *app, const char *what, json_int_t n) {
  char key[32];
  key_of(key, sizeof key, n);
  return json_object_get(json_object_get(app, what), key);
}

static json_t *stage_tasks(json_t *app, json_int_t stage) {
  char key[32];
  key_of(key, sizeof key, stage);
  return child(child(app, "_tasks"), key);
}

static void task_start(json_t *app, const task_fields *f) {
  json_t *st = by_number(app, "stages", f->stage), *job = by_number(app, "jobs", f->job);
  json_t *x = executor_of(app, f->executor);
  if (st) {
    json_t *tasks = stage_tasks(app, f->stage);
    char key[32];
    key_of(key, sizeof key, f->task);
    json_t *t = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:s, s:s, s:b}", "taskId", f->task, "index",
                          f->index, "attempt", f->attempt, "stageAttemptId", f->stage_attempt, "launchTime", f->time,
                          "duration", (json_int_t)-1, "executorId", gets(x, "id", ""), "host", gets(x, "hostPort", ""),
                          "status", "RUNNING", "taskLocality", f->locality, "speculative", f->speculative);
    if (t) json_object_set_new(tasks, key, t);
    while (json_object_size(tasks) > STORE_RETAINED_TASKS) forget_oldest_task(tasks);
    addi(st, "numActiveTasks", 1);
  }
  if (job) addi(job, "numActiveTasks", 1);
  if (x) addi(x, "activeTasks", 1);
}

static void task_end(json_t *app, const task_fields *f) {
  json_t *st = by_number(app, "stages", f->stage), *job = by_number(app, "jobs", f->job);
  json_t *x = executor_of(app, f->executor);
  bool ok = strcmp(f->status, "SUCCESS") == 0, killed = strcmp(f->status, "KILLED") == 0;
  if (st) {
    char key[32];
    key_of(key, sizeof key, f->task);
    json_t *t = json_object_get(stage_tasks(app, f->stage), key);
    if (t) {
      sets(t, "status", f->status);
      json_object_set_new(t, "duration", json_real(f->duration));
      /* the executor that ran it (a node peer may run what was placed elsewhere) */
      sets(t, "executorId", gets(x, "id", ""));
      sets(t, "host", gets(x, "hostPort", ""));
      if (f->error) sets(t, "errorMessage", f->error);
      json_object_set_new(t, "taskMetrics",
                          json_pack("{s:f, s:{s:I}, s:{s:I}, s:{s:I}}", "executorRunTime", f->run_ms, "inputMetrics",
                                    "bytesRead", f->in, "shuffleReadMetrics", "remoteBytesRead", f->rd,
                                    "shuffleWriteMetrics", "bytesWritten", f->wr));
    }
    addi(st, "numActiveTasks", -1);
    addi(st, ok ? "numCompleteTasks" : killed ? "numKilledTasks" : "numFailedTasks", 1);
    addd(st, "executorRunTime", f->run_ms);
    addi(st, "inputBytes", f->in);
    addi(st, "shuffleReadBytes", f->rd);
    addi(st, "shuffleWriteBytes", f->wr);
  }
  if (job) {
    addi(job, "numActiveTasks", -1);
    addi(job, ok ? "numCompletedTasks" : killed ? "numKilledTasks" : "numFailedTasks", 1);
  }
  if (x) {
    addi(x, "activeTasks", -1);
    addi(x, ok ? "completedTasks" : "failedTasks", 1);
    addi(x, "totalTasks", 1);
    addd(x, "totalDuration", f->duration);
  }
}

void store_apply_task(ui_store *s, const char *app_id, const sched_note *n, uint64_t time_ms) {
  task_fields f = {.job = (json_int_t)n->job,
                   .stage = n->stage,
                   .stage_attempt = n->stage_attempt,
                   .task = (json_int_t)n->task_id,
                   .index = n->index,
                   .attempt = n->attempt,
                   .executor = (json_int_t)n->executor,
                   .time = (json_int_t)time_ms,
                   .locality = ui_locality_name(n->locality),
                   .status = ui_task_status(n->status),
                   .error = n->status == FL_OK ? NULL : n->error && *n->error ? n->error : fl_strerror(n->status),
                   .speculative = n->speculative,
                   .duration = (double)n->duration_ns / 1e6,
                   .run_ms = (double)n->run_ns / 1e6,
                   .in = (json_int_t)n->input_bytes,
                   .rd = (json_int_t)n->shuffle_read_bytes,
                   .wr = (json_int_t)n->shuffle_write_bytes};
  store_lock(s);
  json_t *app = app_get(s, app_id);
  if (app && n->kind == SCHED_TASK_STARTED) task_start(app, &f);
  else if (app) task_end(app, &f);
  store_unlock(s);
}

/* ---- cached datasets --------------------------------------------------------------------- */
static void block_updated(json_t *app, const json_t *ev) {
  char key[32], block[64];
  key_of(key, sizeof key, geti(ev, "RDD"));
  json_t *r = child(child(app, "rdds"), key);
  seti(r, "id", geti(ev, "RDD"));
  if (json_object_get(ev, "Name")) sets(r, "name", gets(ev, "Name", ""));
  if (json_object_get(ev, "Partitions")) seti(r, "numPartitions", geti(ev, "Partitions"));
  if (json_object_get(ev, "Level")) sets(r, "storageLevel", gets(ev, "Level", ""));
  json_t *x = executor_of(app, geti(ev, "Executor"));
  snprintf(block, sizeof block, "rdd_%lld_%lld@%s", (long long)geti(ev, "RDD"), (long long)geti(ev, "Partition"),
           gets(x, "id", ""));
  json_t *blocks = child(r, "_blocks");
  json_t *old = json_object_get(blocks, block);
  json_int_t mem = geti(ev, "Memory"), disk = geti(ev, "Disk");
  if (x) {
    addi(x, "memoryUsed", mem - geti(old, "memoryUsed"));
    addi(x, "diskUsed", disk - geti(old, "diskUsed"));
    addi(x, "rddBlocks", (mem || disk) - (old != NULL));
  }
  if (mem || disk)
    json_object_set_new(blocks, block,
                        json_pack("{s:I, s:s, s:I, s:I}", "partition", geti(ev, "Partition"), "executor",
                                  gets(x, "id", ""), "memoryUsed", mem, "diskUsed", disk));
  else
    json_object_del(blocks, block);
}

/* Drops the blocks of dataset `r` whose executor is `exec` (NULL: every one), with their
 * executors' figures. */
static void drop_blocks(json_t *app, json_t *r, const char *exec) {
  json_t *blocks = json_object_get(r, "_blocks"), *b;
  const char *k;
  void *tmp;
  json_object_foreach_safe(blocks, tmp, k, b) {
    const char *owner = gets(b, "executor", "");
    if (exec && strcmp(owner, exec) != 0) continue;
    json_t *x = json_object_get(json_object_get(app, "executors"), owner);
    if (x) {
      addi(x, "memoryUsed", -geti(b, "memoryUsed"));
      addi(x, "diskUsed", -geti(b, "diskUsed"));
      addi(x, "rddBlocks", -1);
    }
    json_object_del(blocks, k);
  }
}

/* RDDUnpersisted: every block of the dataset is gone. */
static void rdd_unpersisted(json_t *app, const json_t *ev) {
  char key[32];
  key_of(key, sizeof key, geti(ev, "RDD"));
  json_t *r = json_object_get(json_object_get(app, "rdds"), key);
  if (r) drop_blocks(app, r, NULL);
}

/* ---- parameter servers and training runs ------------------------------------------------- */
static void ps_table(json_t *app, const json_t *ev) {
  char key[32];
  key_of(key, sizeof key, geti(ev, "Table"));
  json_t *shards = json_array(), *s;
  size_t i;
  json_array_foreach(json_object_get(ev, "Shards"), i, s) {
    json_t *replicas = json_object_get(s, "Replicas"), *backups = json_array();
    for (size_t k = 1; k < json_array_size(replicas); k++)
      json_array_append(backups, json_array_get(replicas, k));
    json_array_append_new(shards, json_pack("{s:I, s:I, s:o}", "shard", geti(s, "Shard"), "primary",
                                            json_integer_value(json_array_get(replicas, 0)), "backups", backups));
  }
  json_object_set_new(child(app, "ps"), key,
                      json_pack("{s:I, s:s, s:o}", "table", geti(ev, "Table"), "name", gets(ev, "Name", ""),
                                "shards", shards));
}

static json_t *run_of(json_t *app, const json_t *ev) {
  char key[32];
  key_of(key, sizeof key, geti(ev, "Run"));
  json_t *run = json_object_get(child(app, "training"), key);
  if (run) return run;
  run = json_pack("{s:I, s:s, s:{}, s:s, s:[], s:n}", "run", geti(ev, "Run"), "name", "training", "config", "status",
                  "RUNNING", "steps", "pipeline");
  json_object_set_new(child(app, "training"), key, run);
  return run;
}

static void train_event(json_t *app, const char *kind, const json_t *ev) {
  json_t *run = run_of(app, ev);
  if (!run) return;
  if (strcmp(kind, "TrainStart") == 0) {
    sets(run, "name", gets(ev, "Name", "training"));
    json_t *cfg = json_object_get(ev, "Config");
    if (json_is_object(cfg)) json_object_set(run, "config", cfg);
    seti(run, "startTime", geti(ev, "Time"));
  } else if (strcmp(kind, "TrainStep") == 0) {
    json_t *steps = json_object_get(run, "steps");
    if (json_array_size(steps) >= STORE_RETAINED_STEPS) json_array_remove(steps, 0);
    json_array_append_new(steps, json_pack("{s:I, s:I, s:I, s:O?, s:O?, s:O?, s:O?, s:I}", "epoch", geti(ev, "Epoch"),
                                           "step", geti(ev, "Step"), "time", geti(ev, "Time"), "loss",
                                           json_object_get(ev, "Loss"), "accuracy", json_object_get(ev, "Accuracy"),
                                           "testAccuracy", json_object_get(ev, "TestAccuracy"), "imagesPerSecond",
                                           json_object_get(ev, "ImagesPerSecond"), "bytesSent",
                                           geti(ev, "BytesSent")));
  } else if (strcmp(kind, "TrainPipeline") == 0) {
    json_object_set(run, "pipeline", json_object_get(ev, "Stages"));
  } else if (strcmp(kind, "TrainEnd") == 0) {
    sets(run, "status", gets(ev, "Status", "FINISHED"));
    if (json_object_get(ev, "Error")) sets(run, "error", gets(ev, "Error", ""));
    seti(run, "endTime", geti(ev, "Time"));
  }
}

/* ---- events ------------------------------------------------------------------------------ */
void store_apply(ui_store *s, json_t *ev) {
  const char *kind = gets(ev, "Event", "");
  const char *app_id = json_string_value(json_object_get(ev, "App"));
  json_int_t time = geti(ev, "Time");
  store_lock(s);
  /* The driver's executors are everyone's: those of no application go to every running one. */
  if (!app_id && strcmp(kind, "ExecutorAdded") == 0) {
    char key[32];
    key_of(key, sizeof key, geti(ev, "Executor"));
    json_object_set(s->executors, key, ev);
  } else if (!app_id && strcmp(kind, "ExecutorRemoved") == 0) {
    char key[32];
    key_of(key, sizeof key, geti(ev, "Executor"));
    json_object_del(s->executors, key);
  }
  if (!app_id) {
    const char *id;
    json_t *app;
    json_object_foreach(s->apps, id, app) {
      if (json_is_true(json_object_get(app, "completed"))) continue;
      if (strcmp(kind, "ExecutorAdded") == 0) executor_added(app, ev, time);
      else if (strcmp(kind, "ExecutorRemoved") == 0) executor_removed(app, ev);
    }
    store_unlock(s);
    return;
  }
  json_t *app = app_get(s, app_id);
  if (!app) {
    store_unlock(s);
    return;
  }
  if (strcmp(kind, "ApplicationStart") == 0) {
    sets(app, "name", gets(ev, "Name", app_id));
    sets(app, "user", gets(ev, "User", ""));
    sets(app, "master", gets(ev, "Master", ""));
    seti(app, "startTime", time);
    const char *id;
    json_t *x;
    json_object_foreach(s->executors, id, x) executor_added(app, x, time);
  } else if (strcmp(kind, "ApplicationEnd") == 0) {
    seti(app, "endTime", time);
    setb(app, "completed", true);
  } else if (strcmp(kind, "Environment") == 0) {
    json_t *p = json_object_get(ev, "Properties");
    if (json_is_array(p)) json_object_set(app, "environment", p);
  } else if (strcmp(kind, "ExecutorAdded") == 0) {
    executor_added(app, ev, time);
  } else if (strcmp(kind, "ExecutorRemoved") == 0) {
    executor_removed(app, ev);
  } else if (strcmp(kind, "JobStart") == 0) {
    job_start(app, ev);
  } else if (strcmp(kind, "JobEnd") == 0) {
    job_end(app, ev);
  } else if (strcmp(kind, "StageSubmitted") == 0) {
    stage_submitted(app, ev);
  } else if (strcmp(kind, "StageCompleted") == 0) {
    stage_completed(app, ev);
  } else if (strcmp(kind, "TaskStart") == 0) {
    task_fields f = fields_of_event(ev);
    task_start(app, &f);
  } else if (strcmp(kind, "TaskEnd") == 0) {
    task_fields f = fields_of_event(ev);
    task_end(app, &f);
  } else if (strcmp(kind, "BlockUpdated") == 0) {
    block_updated(app, ev);
  } else if (strcmp(kind, "RDDUnpersisted") == 0) {
    rdd_unpersisted(app, ev);
  } else if (strcmp(kind, "PsTable") == 0) {
    ps_table(app, ev);
  } else if (strncmp(kind, "Train", 5) == 0) {
    train_event(app, kind, ev);
  }
  store_unlock(s);
}

json_t *store_apps(ui_store *s) { return s->apps; }

json_t *store_live_executors(ui_store *s) {
  store_lock(s);
  json_t *out = json_array();
  const char *id;
  json_t *x;
  json_object_foreach(s->executors, id, x) json_array_append(out, x);
  store_unlock(s);
  return out;
}
