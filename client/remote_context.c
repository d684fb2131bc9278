/*
 * remote_context.c: contexts whose scheduler is a driver process (masters flint://HOST:PORT
 * and local-cluster[E,C,MB]). Opening one opens an application on the driver (for
 * local-cluster, after starting the driver and its executors: local_cluster.c); closing it
 * closes the application. Between, the context's runtime runs jobs there (job.c), keeps the
 * driver's copy of the lineage (plan_send.c) and the broadcasts (broadcast.c); its cache is
 * the executors', so it asks the driver about it, and stores nothing.
 *
 * The lease: a thread says the client is alive every keepalive_ms (OpenApplicationReply),
 * so that the driver closes the application of a client that died.
 *
 * Threading: open and close run on the caller's thread; everything else may be called from
 * any thread at once (client_internal.h says what the context's lock guards). The keep-alive
 * thread waits on keepalive_wake under the lock and calls the driver without it.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/config.h"
#include "shuffle/shuffle.h"

/* ---- the lease ------------------------------------------------------------------------- */

/* The lease's thread: a KeepAlive every keepalive_ms until the context closes. A failed one
 * is not fatal (the next may pass); the driver's lease is three periods long. */
static void *keepalive_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-keepalive");
  remote_context *c = arg;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (;;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->keepalive_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    while (!c->keepalive_stop && pthread_cond_timedwait(&c->keepalive_wake, &c->lock, &ts) != ETIMEDOUT) {
    }
    if (c->keepalive_stop) break;
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
    Flint__AppRequest req = FLINT__APP_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    fl_buf reply = FL_BUF_INIT;
    client_rpc_call(c->driver, "/flint.Driver/KeepAlive", &req.base, c->keepalive_ms, &reply);
    fl_buf_free(&reply);
    FL_PCHECK(pthread_mutex_lock(&c->lock));
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return NULL;
}

/* ---- the cache, as a client sees it: the driver knows ---------------------------------- */

static bool rc_get(void *impl, rdd_block_key key, const rdd_batch **b, void **h) { return false; }
static fl_status rc_put(void *impl, rdd_block_key key, fl_storage_level level, rdd_batch *batch,
                        const rdd_batch **stored, void **handle) {
  return FL_ERR(FL_ESTATE, "a client stores no blocks");
}
static void rc_release(void *impl, void *handle) {}
static void rc_remove_rdd(void *impl, uint64_t rdd_id) {
  remote_context *c = impl;
  if (!client_plan_send_shipped(c, rdd_id)) return;
  Flint__UnpersistRequest req = FLINT__UNPERSIST_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.rdd_id = rdd_id;
  fl_buf reply = FL_BUF_INIT;
  if (client_rpc_call(c->driver, "/flint.Driver/Unpersist", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply) != FL_OK)
    fprintf(stderr, "flint: unpersist of dataset %llu on the driver failed: %s\n",
            (unsigned long long)rdd_id, fl_last_error());
  fl_buf_free(&reply);
}
/* The driver's StorageInfo of dataset rdd_id (0: the whole application) into *out (NULL:
 * none wanted). */
static fl_status storage_info(remote_context *c, uint64_t rdd_id, Flint__StorageInfoReply **out) {
  Flint__StorageInfoRequest req = FLINT__STORAGE_INFO_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.rdd_id = rdd_id;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_call(c->driver, "/flint.Driver/StorageInfo", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  *out = st == FL_OK ? flint__storage_info_reply__unpack(NULL, reply.len, reply.data) : NULL;
  fl_buf_free(&reply);
  return st;
}
static void rc_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
  Flint__StorageInfoReply *r;
  storage_info(impl, rdd_id, &r);
  if (r) {
    out->cached_partitions = r->cached_partitions;
    out->memory_bytes = r->memory_bytes;
    out->disk_bytes = r->disk_bytes;
    flint__storage_info_reply__free_unpacked(r, NULL);
  }
}
static void rc_shuffle_path(void *impl, uint64_t s, uint32_t m, char *path, size_t len) {
  snprintf(path, len, "/nonexistent");
}
static fl_status rc_shuffle_fetch(void *impl, uint64_t s, uint32_t m, uint32_t r, uint64_t off,
                                  uint64_t len, fl_buf *out, uint64_t *block_len) {
  return FL_ERR(FL_ESTATE, "a client holds no shuffle output");
}
/* The driver removes a shuffle's output when it frees the dataset. */
static void rc_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {}

static const rdd_cache_ops remote_cache = {rc_get,        rc_put,          rc_release,
                                           rc_remove_rdd, rc_info,         rc_shuffle_path,
                                           rc_shuffle_fetch, rc_shuffle_remove};

/* Jobs and service calls draw the console bar while they run. */
static fl_status remote_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                                const rdd_action *action, fl_buf *results) {
  remote_context *c = impl;
  client_progress_begin(c->progress);
  fl_status st = client_job_run(impl, r, parts, num_parts, action, results);
  client_progress_end(c->progress);
  return st;
}

static fl_status remote_call_service(void *impl, rdd *job, const char *name, fl_bytes request, fl_buf *reply) {
  remote_context *c = impl;
  client_progress_begin(c->progress);
  fl_status st = client_call_service(impl, job, name, request, reply);
  client_progress_end(c->progress);
  return st;
}

/* fl_context_post_event: the driver checks the event and adds it to the application's UI. */
static fl_status remote_post_event(void *impl, const char *json) {
  remote_context *c = impl;
  Flint__PostEventRequest req = FLINT__POST_EVENT_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.json = (char *)json;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_call(c->driver, "/flint.Driver/PostEvent", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

static const rdd_runtime_ops remote_runtime = {.run_job = remote_run_job,
                                               .post_event = remote_post_event,
                                               .call_service = remote_call_service,
                                               .broadcast_created = client_broadcast_created,
                                               .broadcast_destroyed = client_broadcast_destroyed,
                                               .rdd_destroyed = client_plan_send_forget};

/* ---- the context ----------------------------------------------------------------------- */

static void remote_close(fl_context *ctx) {
  remote_context *c = (remote_context *)ctx;
  client_progress_destroy(c->progress); /* before the channel it calls */
  if (c->keepalive_started) {
    FL_PCHECK(pthread_mutex_lock(&c->lock));
    c->keepalive_stop = true;
    pthread_cond_signal(&c->keepalive_wake);
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
    pthread_join(c->keepalive, NULL);
  }
  pthread_cond_destroy(&c->keepalive_wake);
  if (c->app_id) {
    Flint__AppRequest req = FLINT__APP_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    fl_buf reply = FL_BUF_INIT;
    client_rpc_call(c->driver, "/flint.Driver/CloseApplication", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
    fl_buf_free(&reply);
  }
  rpc_channel_destroy(c->driver);
  client_broadcast_server_stop(c); /* before the registry: it returns every loan */
  client_local_cluster_stop(&c->cluster);
  rdd_shared_destroy(c->pub.shared);
  map_output_table_destroy(c->pub.map_outputs);
  client_plan_send_free(c);
  client_broadcast_free(c);
  common_free(c->secret);
  pthread_mutex_destroy(&c->lock);
  common_free(c);
}

static fl_status remote_cancel(fl_context *ctx) {
  remote_context *c = (remote_context *)ctx;
  Flint__CancelJobsRequest req = FLINT__CANCEL_JOBS_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_call(c->driver, "/flint.Driver/CancelJobs", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

static fl_status remote_stats(fl_context *ctx, fl_context_stats *out) {
  remote_context *c = (remote_context *)ctx;
  memset(out, 0, sizeof *out);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  out->jobs_run = c->jobs_run;
  out->jobs_failed = c->jobs_failed;
  out->tasks_run = c->tasks_run;
  out->tasks_failed = c->tasks_failed;
  out->task_seconds = (double)c->task_ns * 1e-9;
  out->blocks_read_mapped = c->blocks_mapped;
  out->blocks_read_fetched = c->blocks_fetched;
  out->input_bytes = c->input_bytes;
  out->shuffle_read_bytes = c->shuffle_read_bytes;
  out->shuffle_write_bytes = c->shuffle_write_bytes;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  /* The cached blocks are the executors': the driver asks the live ones (dataset 0: the
   * whole application). */
  Flint__StorageInfoReply *r;
  fl_status st = storage_info(c, 0, &r);
  if (st == FL_OK) {
    if (r) {
      out->memory_used = r->memory_bytes;
      out->blocks_evicted = r->evictions;
      flint__storage_info_reply__free_unpacked(r, NULL);
    } else {
      st = FL_ERR(FL_EPROTO, "StorageInfo: malformed reply from the driver");
    }
  }
  return st;
}

fl_status client_remote_context_open(const char *master, const fl_options *options, fl_context **out) {
  remote_context *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a context");
  FL_PCHECK(pthread_mutex_init(&c->lock, NULL));
  FL_PCHECK(pthread_cond_init(&c->keepalive_wake, NULL));
  fl_status status = FL_OK;
  char addr[256];
  uint32_t executors = 0;
  FL_CHECK(rdd_shared_create(&c->pub.shared));
  FL_CHECK(map_output_table_create(&c->pub.map_outputs));
  FL_CHECK(config_secret(&c->secret));
  if (strncmp(master, "flint://", 8) == 0) {
    const char *hostport = master + 8;
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1] || strlen(hostport) >= sizeof addr) {
      status = FL_ERR(FL_EINVAL, "master '%s': expected flint://HOST:PORT", master);
      goto cleanup;
    }
    snprintf(addr, sizeof addr, "%s", hostport);
  } else {
    FL_CHECK(client_local_cluster_start(&c->cluster, master, addr, sizeof addr, &executors));
  }
  snprintf(c->driver_address, sizeof c->driver_address, "%s", addr);
  FL_CHECK(rpc_channel_create(addr, c->secret, DRIVER_MAX_MESSAGE, &c->driver));
  if (executors) FL_CHECK(client_local_cluster_wait(&c->cluster, c->driver, executors));

  Flint__OpenApplicationRequest req = FLINT__OPEN_APPLICATION_REQUEST__INIT;
  const char *name = options && options->app_name && *options->app_name ? options->app_name : config_string(CONFIG_APP_NAME);
  req.name = (char *)(name && *name ? name : program_invocation_short_name);
  req.pid = (uint32_t)getpid();
  fl_buf reply = FL_BUF_INIT;
  status = client_rpc_call(c->driver, "/flint.Driver/OpenApplication", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  if (status != FL_OK) {
    fl_buf_free(&reply);
    common_error_wrap(status, "cannot open an application on the driver at %s: ", addr);
    goto cleanup;
  }
  Flint__OpenApplicationReply *r = flint__open_application_reply__unpack(NULL, reply.len, reply.data);
  fl_buf_free(&reply);
  if (!r || r->app_id == 0) {
    if (r) flint__open_application_reply__free_unpacked(r, NULL);
    status = FL_ERR(FL_EPROTO, "OpenApplication: malformed reply from %s", addr);
    goto cleanup;
  }
  c->app_id = r->app_id;
  c->incarnation = r->incarnation;
  c->keepalive_ms = r->keepalive_ms;
  uint32_t cores = r->cores ? r->cores : 1;
  if (r->ui_port) { /* the driver's web UI, on the host dialled */
    const char *colon = strrchr(addr, ':');
    int host_len = colon ? (int)(colon - addr) : (int)strlen(addr);
    snprintf(c->pub.ui_url, sizeof c->pub.ui_url, "%s://%.*s:%u", r->ui_https ? "https" : "http", host_len, addr,
             r->ui_port);
  }
  flint__open_application_reply__free_unpacked(r, NULL);

  c->pub.runtime = &remote_runtime;
  c->pub.runtime_impl = c;
  c->pub.cache = &remote_cache;
  c->pub.cache_impl = c;
  c->pub.cores = cores;
  c->pub.default_parallelism =
      options && options->default_parallelism ? options->default_parallelism : cores;
  c->pub.shuffle_memory = options && options->shuffle_memory ? options->shuffle_memory : 64u << 20;
  c->pub.work_dir = "/nonexistent"; /* no task runs here */
  c->pub.close = remote_close;
  c->pub.stats = remote_stats;
  c->pub.cancel = remote_cancel;
  atomic_init(&c->pub.next_rdd_id, 1);
  atomic_init(&c->next_operation, 1);
  c->progress_source = (client_progress_driver){c->driver, c->app_id, 0};
  if (!(options && options->no_console_progress) && common_progress_on_terminal(STDERR_FILENO))
    FL_CHECK(client_progress_create(STDERR_FILENO, 0, client_progress_ask_driver, &c->progress_source, &c->progress));
  if (c->keepalive_ms) {
    if (pthread_create(&c->keepalive, NULL, keepalive_main, c) != 0) {
      status = FL_ERR(FL_ENOMEM, "cannot start the client's keep-alive thread");
      goto cleanup;
    }
    c->keepalive_started = true;
  }
  *out = &c->pub;
  return FL_OK;
cleanup:
  remote_close(&c->pub);
  return status;
}
