/*
 * ui_blocks.c: cached blocks as the web UI's BlockUpdated events (docs/ui.md), for its storage
 * page and the event log: the changes that executors report with their status updates and
 * heartbeats (executor/block_reports.c), named after their datasets from the applications'
 * plans, and a local context's, which its block manager tells (client/local_context.c).
 */
#include <stdio.h>
#include <string.h>

#include "driver/driver_internal.h"

static const char *level_name(fl_storage_level level) {
  switch (level) {
  case FL_MEMORY_ONLY: return "MEMORY_ONLY";
  case FL_MEMORY_SER: return "MEMORY_SER";
  case FL_MEMORY_AND_DISK: return "MEMORY_AND_DISK";
  case FL_DISK_ONLY: return "DISK_ONLY";
  case FL_STORAGE_NONE: break;
  }
  return "NONE";
}

void driver_ui_block(struct ui *u, uint64_t app, uint64_t executor, uint64_t rdd_id, uint32_t partition,
                     fl_storage_level level, uint64_t memory, uint64_t disk, const char *name, uint32_t partitions) {
  if (!u) return;
  char head[320];
  snprintf(head, sizeof head,
           "{\"Event\":\"BlockUpdated\",\"App\":%llu,\"RDD\":%llu,\"Partition\":%u,\"Executor\":%llu,\"Memory\":%llu,"
           "\"Disk\":%llu,\"Level\":\"%s\"",
           (unsigned long long)app, (unsigned long long)rdd_id, partition, (unsigned long long)executor,
           (unsigned long long)memory, (unsigned long long)disk, level_name(level));
  fl_buf b = FL_BUF_INIT;
  bool ok = fl_buf_append(&b, head, strlen(head)) == FL_OK;
  if (ok && partitions) {
    char n[48];
    snprintf(n, sizeof n, ",\"Partitions\":%u", partitions);
    ok = fl_buf_append(&b, n, strlen(n)) == FL_OK;
  }
  if (ok && name) ok = fl_buf_append(&b, ",\"Name\":", 8) == FL_OK && ui_json_string(&b, name) == FL_OK;
  ok = ok && fl_buf_append(&b, "}", 2) == FL_OK; /* with its terminating zero */
  if (ok) ui_post(u, (const char *)b.data);
  fl_buf_free(&b);
}

/* The name and partition count of dataset rdd_id of application `app_id`, when the driver
 * still has its plan (a closed application has none). */
static bool dataset_of(driver_state *d, uint64_t app_id, uint64_t rdd_id, char *name, size_t cap,
                       uint32_t *partitions) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = apps_find(d, app_id);
  driver_app *app = e ? e->app : NULL;
  if (app) e->users++; /* a close waits for apps_unpin */
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!app) return false;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  rdd *r = rdd_plan_find(app->plan, rdd_id);
  if (r) {
    snprintf(name, cap, "%s", r->ops && r->ops->name ? r->ops->name : "dataset");
    *partitions = r->num_partitions;
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  apps_unpin(d, app);
  return r != NULL;
}

/* Whether the driver knows application `app_id` (running, or finished and still listed). */
static bool app_known(driver_state *d, uint64_t app_id) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  bool known = apps_find(d, app_id) != NULL;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return known;
}

void apps_blocks_reported(void *arg, uint64_t executor, Flint__BlockUpdate *const *blocks, size_t n,
                          uint64_t dropped) {
  driver_state *d = arg;
  if (!d->ui) return;
  if (dropped)
    common_log(LOG_WARN, "executor %llu could not keep %llu changes of its cached blocks for telling: the web UI's "
               "storage page may be off for those blocks until they change again",
               (unsigned long long)executor, (unsigned long long)dropped);
  /* Reports come in runs of one dataset: look each up once. */
  uint64_t last_app = 0, last_rdd = 0;
  bool known = false, named = false;
  char name[128] = "";
  uint32_t partitions = 0;
  for (size_t i = 0; i < n; i++) {
    const Flint__BlockUpdate *u = blocks[i];
    if (u->app_id != last_app || u->rdd_id != last_rdd || i == 0) {
      last_app = u->app_id;
      last_rdd = u->rdd_id;
      partitions = 0;
      named = dataset_of(d, u->app_id, u->rdd_id, name, sizeof name, &partitions);
      known = named || app_known(d, u->app_id);
    }
    if (!known) continue; /* an application of no client of this driver's */
    fl_storage_level level = u->level >= FL_STORAGE_NONE && u->level <= FL_DISK_ONLY ? (fl_storage_level)u->level
                                                                                      : FL_STORAGE_NONE;
    driver_ui_block(d->ui, u->app_id, executor, u->rdd_id, u->partition, level, u->memory, u->disk,
                    named ? name : NULL, partitions);
  }
}
