/*
 * apps.c: applications. Each client opens one (OpenApplication) and keeps it alive with its
 * calls (a lease: FLINT_CLIENT_TIMEOUT_MS); the driver keeps a client's datasets, decoded
 * from its plans, in a context of the application's own, whose cache and shuffle operations
 * answer from the application's block locations and tell the executors to drop what goes.
 * An application ends when its client closes it, its lease runs out, or its job binary's
 * process ends: its jobs are cancelled, and its blocks, shuffle files and broadcasts go
 * everywhere.
 *
 * Threading: the list of applications is under d->lock; a call uses an application between
 * apps_lookup and apps_unpin, and a close waits for those calls. The leases' thread closes
 * silent clients' applications.
 */
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "driver/driver_internal.h"
#include "shuffle/shuffle.h"

#define MAX_APPS_KEPT 64 /* finished applications kept for status */

/* ---- an application's context in the driver -------------------------------------------- */

/* A job of a service the application's client called (fl_service_call): on the service's
 * thread, through the scheduler, as a RunJob of the client's would run. The cluster backend
 * sends executors the action's encoding, so it is encoded here (the services' actions name
 * no user function). */
static fl_status app_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t n,
                             const rdd_action *action, fl_buf *results) {
  driver_app *app = impl;
  if (atomic_load(&app->closing))
    return FL_ERR(FL_ECANCELLED, "application %llu is closing: its service starts no more jobs",
                  (unsigned long long)app->id);
  rdd_fn_codec none = {0};
  fl_buf encoded = FL_BUF_INIT;
  fl_status st = rdd_action_encode(action, &none, &encoded);
  if (st != FL_OK) return st;
  driver_action da = {.action = *action, .encoded = fl_buf_bytes(&encoded)};
  sched_job_opts opts = {.group = app->id};
  st = scheduler_run_job(app->sched, r, parts, n, &da.action, &opts, results);
  fl_buf_free(&encoded);
  return st;
}
static const rdd_runtime_ops app_runtime = {.run_job = app_run_job};

static bool app_cache_get(void *impl, rdd_block_key key, const rdd_batch **b, void **h) { return false; }
static fl_status app_cache_put(void *impl, rdd_block_key key, fl_storage_level level, rdd_batch *batch,
                               const rdd_batch **stored, void **handle) {
  return FL_ERR(FL_ESTATE, "the driver stores no blocks");
}
static void app_cache_release(void *impl, void *handle) {}
static void app_cache_remove_rdd(void *impl, uint64_t rdd_id) {
  driver_app *app = impl;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  locations_forget_id(app->blocks, rdd_id);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  cluster_remove(app->cluster, app->id, &rdd_id, 1, NULL, 0, false);
}
typedef struct info_ctx {
  fl_storage_info *out;
} info_ctx;
static void count_block(void *arg, uint32_t index, uint64_t executor) {
  ((info_ctx *)arg)->out->cached_partitions++;
}
static void app_cache_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
  driver_app *app = impl;
  info_ctx c = {out};
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  locations_each(app->blocks, rdd_id, count_block, &c);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
}
static void app_shuffle_path(void *impl, uint64_t s, uint32_t m, char *path, size_t len) {
  snprintf(path, len, "/nonexistent");
}
static fl_status app_shuffle_fetch(void *impl, uint64_t s, uint32_t m, uint32_t r, uint64_t off,
                                   uint64_t len, fl_buf *out, uint64_t *block_len) {
  return FL_ERR(FL_ESTATE, "the driver holds no shuffle output");
}
/* Called when a shuffled dataset is freed here: its output goes everywhere. The driver's
 * dataset lock is held by the caller (a plan release). */
static void app_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {
  driver_app *app = impl;
  locations_forget_id(app->maps, shuffle_id);
  cluster_remove(app->cluster, app->id, NULL, 0, &shuffle_id, 1, false);
}
static const rdd_cache_ops app_cache = {app_cache_get,      app_cache_put,     app_cache_release,
                                        app_cache_remove_rdd, app_cache_info,    app_shuffle_path,
                                        app_shuffle_fetch,  app_shuffle_remove};

static void app_free(driver_app *app) {
  if (!app) return;
  rdd_plan_destroy(app->plan);
  for (size_t i = 0; i < app->num_libraries; i++) common_free(app->libraries[i]);
  common_free(app->libraries);
  locations_destroy(app->maps);
  locations_destroy(app->blocks);
  fl_buf_free(&app->accumulators);
  while (app->parked) {
    parked_result *p = app->parked;
    app->parked = p->next;
    fl_buf_free(&p->data);
    common_free(p);
  }
  for (size_t i = 0; i < app->num_broadcasts; i++) fl_buf_free(&app->broadcasts[i].value);
  common_free(app->broadcasts);
  rdd_shared_destroy(app->ctx.shared);
  map_output_table_destroy(app->ctx.map_outputs);
  pthread_mutex_destroy(&app->lock);
  common_free(app);
}

static fl_status app_new(driver_state *d, uint64_t id, const char *name, driver_app **out) {
  driver_app *app = common_calloc(1, sizeof *app);
  if (!app) return FL_ERR(FL_ENOMEM, "out of memory");
  FL_PCHECK(pthread_mutex_init(&app->lock, NULL));
  app->id = id;
  snprintf(app->name, sizeof app->name, "%s", name && *name ? name : "unnamed");
  app->cluster = d->cluster;
  app->sched = d->sched;
  fl_status status = FL_OK;
  FL_CHECK(locations_create(&app->maps));
  FL_CHECK(locations_create(&app->blocks));
  FL_CHECK(rdd_shared_create(&app->ctx.shared));
  FL_CHECK(map_output_table_create(&app->ctx.map_outputs));
  app->ctx.runtime = &app_runtime;
  app->ctx.runtime_impl = app;
  app->ctx.cache = &app_cache;
  app->ctx.cache_impl = app;
  app->ctx.work_dir = d->work_dir;
  atomic_init(&app->ctx.next_rdd_id, 1);
  rdd_fn_codec codec = {0}; /* the driver never resolves user functions */
  FL_CHECK(rdd_plan_create(&app->ctx, &codec, &app->plan));
  *out = app;
  return FL_OK;
cleanup:
  app_free(app);
  return status;
}

/* The running application `id` (d->lock held by the caller). */
app_entry *apps_find(driver_state *d, uint64_t id) {
  for (app_entry *a = d->apps; a; a = a->next)
    if (a->id == id) return a;
  return NULL;
}

/* The running application `id` of this driver incarnation, which a close does not free until
 * app_unpin. */
fl_status apps_lookup(driver_state *d, uint64_t id, uint64_t incarnation, driver_app **out) {
  *out = NULL;
  if (incarnation != d->incarnation)
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to an earlier "
                  "driver process on %s, which has ended; open a new context", (unsigned long long)id, d->address);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *a = apps_find(d, id);
  *out = a ? a->app : NULL;
  if (*out) a->users++;
  if (*out) a->last_seen_ns = common_now_ns();
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!*out)
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver", (unsigned long long)id);
  return FL_OK;
}

void apps_unpin(driver_state *d, driver_app *app) {
  if (!app) return;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *a = apps_find(d, app->id);
  FL_ASSERT(a && a->users > 0);
  a->users--;
  pthread_cond_broadcast(&d->changed);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

fl_status apps_handle_open(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__OpenApplicationRequest, req, body, "OpenApplication");
  app_entry *e = common_calloc(1, sizeof *e);
  fl_status status = e ? FL_OK : FL_ERR(FL_ENOMEM, "out of memory");
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  uint64_t id = ++d->next_app_id;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (status == FL_OK) status = app_new(d, id, req->name, &e->app);
  if (status == FL_OK) {
    e->id = id;
    e->pid = req->pid;
    e->last_seen_ns = common_now_ns();
    snprintf(e->name, sizeof e->name, "%s", e->app->name);
    FL_PCHECK(pthread_mutex_lock(&d->lock));
    e->next = d->apps;
    d->apps = e;
    /* Bounded history: forget the oldest finished applications. */
    size_t finished = 0;
    for (app_entry **p = &d->apps; *p;) {
      if (!(*p)->app && !(*p)->users && ++finished > MAX_APPS_KEPT) {
        app_entry *old = *p;
        *p = old->next;
        common_free(old);
      } else {
        p = &(*p)->next;
      }
    }
    FL_PCHECK(pthread_mutex_unlock(&d->lock));
    common_log(LOG_INFO, "application %llu (%s) opened", (unsigned long long)id, e->name);
    ui_post_application(d->ui, id, e->name, d->address);
    Flint__OpenApplicationReply reply = FLINT__OPEN_APPLICATION_REPLY__INIT;
    reply.app_id = id;
    reply.incarnation = d->incarnation;
    reply.keepalive_ms = (uint32_t)(d->client_timeout_ns / 3000000u);
    reply.cores = cluster_cores(d->cluster);
    reply.ui_port = ui_port(d->ui) > 0 ? (uint32_t)ui_port(d->ui) : 0;
    reply.ui_https = config_bool(CONFIG_TLS);
    status = proto_pack(&reply.base, response);
  } else {
    common_free(e);
  }
  flint__open_application_request__free_unpacked(req, NULL);
  return status;
}

/* Ends application `id`: it is hidden from new calls, calls still using it (another
 * client's RunJob, say) finish first, then its datasets and blocks everywhere go. */
static fl_status app_close(driver_state *d, uint64_t id) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = apps_find(d, id);
  driver_app *app = e ? e->app : NULL;
  if (e) e->app = NULL; /* no call finds it any more */
  if (app) atomic_store(&app->closing, true); /* its services start no more jobs */
  if (app) scheduler_cancel(d->sched, id, 0); /* its running jobs end now */
  while (app && e->users > 0) FL_PCHECK(pthread_cond_wait(&d->changed, &d->lock));
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!app) return FL_ERR(FL_ENOENT, "no running application %llu", (unsigned long long)id);
  cluster_remove(d->cluster, id, NULL, 0, NULL, 0, true);
  placement_app_closed(d, id);
  app_free(app);
  common_log(LOG_INFO, "application %llu closed", (unsigned long long)id);
  ui_postf(d->ui, "{\"Event\":\"ApplicationEnd\",\"App\":%llu}", (unsigned long long)id);
  return FL_OK;
}

fl_status apps_handle_close(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__AppRequest, req, body, "CloseApplication");
  uint64_t id = req->app_id, incarnation = req->incarnation;
  flint__app_request__free_unpacked(req, NULL);
  fl_status st = incarnation == d->incarnation
                     ? app_close(d, id)
                     : FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to "
                              "an earlier driver process", (unsigned long long)id);
  return st == FL_OK ? driver_empty_reply(response) : st;
}

/* A client says it is alive (its lease). */
fl_status apps_handle_post_event(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__PostEventRequest, req, body, "PostEvent");
  fl_status st = FL_OK;
  if (req->incarnation != d->incarnation || !apps_find(d, req->app_id))
    st = FL_ERR(FL_ENOENT, "PostEvent: no running application %llu", (unsigned long long)req->app_id);
  else if (d->ui)
    st = ui_post_program_event(d->ui, req->app_id, req->json);
  flint__post_event_request__free_unpacked(req, NULL);
  return st == FL_OK ? driver_empty_reply(response) : st;
}

fl_status apps_handle_keepalive(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__AppRequest, req, body, "KeepAlive");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app); /* which renews the lease */
  apps_unpin(d, app);
  flint__app_request__free_unpacked(req, NULL);
  return st == FL_OK ? driver_empty_reply(response) : st;
}

/* Closes the applications whose clients' leases ran out: a client killed, or cut off, says
 * nothing; its application's blocks, shuffle files and broadcasts go everywhere. */
static void close_silent_apps(driver_state *d) {
  for (;;) {
    uint64_t id = 0, silent_ns = 0;
    char name[128] = "";
    FL_PCHECK(pthread_mutex_lock(&d->lock));
    uint64_t now = common_now_ns(); /* under the lock: no lease renewed after it */
    for (app_entry *a = d->apps; a && !id; a = a->next)
      if (a->app && now - a->last_seen_ns > d->client_timeout_ns) {
        id = a->id;
        silent_ns = now - a->last_seen_ns;
        snprintf(name, sizeof name, "%s", a->name);
      }
    FL_PCHECK(pthread_mutex_unlock(&d->lock));
    if (!id) return;
    common_log(LOG_WARN, "application %llu (%s): its client has not called for %.1f s (FLINT_CLIENT_TIMEOUT_MS): "
               "closing it", (unsigned long long)id, name, (double)silent_ns / 1e9);
    app_close(d, id);
  }
}

/* The leases' thread: twice a second, closes the applications of silent clients. Apart from
 * the main loop, since a close waits for the calls using the application to end. */
void *apps_lease_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-lease");
  driver_state *d = arg;
  while (!atomic_load(&d->leases_stop)) {
    usleep(100000);
    if (common_now_ns() >= d->next_lease_check_ns) {
      close_silent_apps(d);
      d->next_lease_check_ns = common_now_ns() + 500000000ull;
    }
  }
  return NULL;
}

/* A job binary that crashed or exited without closing its context leaves its applications
 * open: they end with its process. */
void apps_close_of_pid(driver_state *d, pid_t pid) {
  for (;;) {
    uint64_t id = 0;
    FL_PCHECK(pthread_mutex_lock(&d->lock));
    for (app_entry *a = d->apps; a && !id; a = a->next)
      if (a->app && a->pid == (uint32_t)pid) id = a->id;
    FL_PCHECK(pthread_mutex_unlock(&d->lock));
    if (!id || app_close(d, id) != FL_OK) return;
  }
}

fl_status apps_handle_storage_info(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__StorageInfoRequest, req, body, "StorageInfo");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) {
    /* The executors' own figures, for a dataset the driver knows blocks of (an unpersisted
     * one is gone at once, whether or not its removal reached the executors yet); the
     * driver's inferred locations when no executor answers */
    fl_storage_info info = {0}, asked = {0};
    uint64_t evictions = 0;
    if (req->rdd_id) {
      app_cache_info(app, req->rdd_id, &info);
      if (info.cached_partitions && cluster_storage_info(app->cluster, app->id, req->rdd_id, &asked, NULL)) info = asked;
    } else { /* the whole application (fl_context_stats): what its live executors say */
      cluster_storage_info(app->cluster, app->id, 0, &info, &evictions);
    }
    Flint__StorageInfoReply reply = FLINT__STORAGE_INFO_REPLY__INIT;
    reply.evictions = evictions;
    reply.cached_partitions = info.cached_partitions;
    reply.memory_bytes = info.memory_bytes;
    reply.disk_bytes = info.disk_bytes;
    st = proto_pack(&reply.base, response);
  }
  apps_unpin(d, app);
  flint__storage_info_request__free_unpacked(req, NULL);
  return st;
}

fl_status apps_handle_unpersist(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__UnpersistRequest, req, body, "Unpersist");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) {
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    rdd *r = rdd_plan_find(app->plan, req->rdd_id);
    if (r) atomic_store(&r->level, FL_STORAGE_NONE);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    app_cache_remove_rdd(app, req->rdd_id);
    /* gone from the storage page now, whether or not the executors' reports follow */
    ui_postf(d->ui, "{\"Event\":\"RDDUnpersisted\",\"App\":%llu,\"RDD\":%llu}", (unsigned long long)app->id,
             (unsigned long long)req->rdd_id);
    st = driver_empty_reply(response);
  }
  apps_unpin(d, app);
  flint__unpersist_request__free_unpacked(req, NULL);
  return st;
}

/* An executor is lost: its map outputs and cached blocks are gone for every application
 * (the scheduler runs those map tasks again; cached partitions are recomputed when next
 * read). On the scheduler thread. */
void apps_forget_executor(void *arg, uint64_t executor) {
  driver_state *d = arg;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (app_entry *e = d->apps; e; e = e->next)
    if (e->app) locations_forget_executor(e->app, executor);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  placement_executor_lost(d, executor);
}

void apps_free_all(driver_state *d) {
  while (d->apps) {
    app_entry *a = d->apps;
    d->apps = a->next;
    /* open at the driver's stop: its event log ends here */
    if (a->app) ui_postf(d->ui, "{\"Event\":\"ApplicationEnd\",\"App\":%llu}", (unsigned long long)a->id);
    app_free(a->app);
    common_free(a);
  }
}
