/*
 * server.c: the driver process (`flint driver`). One scheduler with the cluster backend
 * serves every application: clients (programs using the C API with a flint:// master, and
 * job binaries that the driver runs in supervised child processes) open an application,
 * upload their libraries, register their broadcasts (whose values the clients serve
 * themselves) and send plans and actions; executors register, heartbeat and report task
 * ends. A block server hands out libraries.
 *
 * Threads: gRPC's (the queue's thread starts jobs and takes task statuses; handlers may block
 * on anything else), the scheduler's event loop (which also answers RunJob when its job
 * ends), the block server's, and one supervisor per job binary that reads its output.
 * Applications and submissions are under d->lock; each application's datasets under its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver/driver.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"
#include "shuffle/shuffle.h"

#define HEARTBEAT_MS 1000
#define MAX_APPS_KEPT 64          /* finished applications kept for status */
#define MAX_SUBMISSIONS_KEPT 64   /* finished job binaries kept (their output, for Output) */
#define MAX_JOB_OUTPUT (64u << 20) /* bytes of a job binary's stdout or stderr kept */
#define MAX_WAIT_MS 10000
/* Tasks launched per executor core at once: those beyond the cores wait in the executor's
 * queue, so a core that finishes a task starts the next without a round trip to the driver
 * (one launch and one status update cost about a millisecond here). Binding many ahead no
 * longer unbalances a stage over cached data within a host, where the other executors take
 * a slower one's queued tasks (node-shared tasks); 16 let a stage of Sandblaster's small
 * tasks (32 on 2 cores) go out in one launch per executor, where 8 left each executor idle
 * for about 2 ms a job waiting for the rest. */
#define DRIVER_SLOTS_PER_CORE 16

#define JOBS_KEPT 16 /* an application's last jobs that status lists */

typedef struct job_record {
  uint64_t id;
  fl_status status;
  uint32_t tasks;
  bool running;
  char error[256];
} job_record;

typedef struct app_entry {
  driver_app *app; /* NULL once finished */
  uint64_t id;
  char name[128];
  job_record jobs[JOBS_KEPT]; /* the last ones, a ring: job N at (N - 1) % JOBS_KEPT */
  uint64_t num_jobs;           /* jobs started, so the id of the last one */
  uint32_t users; /* calls using app now (app_lookup); a close waits for them */
  uint32_t pid;   /* the client's process (job binaries' applications end with it) */
  uint64_t last_seen_ns; /* the client's last call (its lease: client_timeout_ns) */
  struct app_entry *next;
} app_entry;

/* A job result that did not fit in its RunJob reply (driver_app.parked, app->lock). */
typedef struct parked_result {
  uint64_t operation_id;
  uint32_t index;
  fl_buf data;
  struct parked_result *next;
} parked_result;

typedef struct submission {
  uint64_t id;
  pid_t pid;
  int out_fd, err_fd;
  fl_buf out, err;
  bool exited;
  int exit_code, signal;
  pthread_t supervisor;
  struct submission *next;
} submission;

/* A library's file name as its client gave it, by content id: for messages. */
typedef struct library_name {
  char id[40];
  char name[128];
  struct library_name *next;
} library_name;

typedef struct driver_state {
  driver_config cfg;
  char address[96];   /* HOST:PORT of the control plane, as clients reach it */
  char work_dir[PATH_MAX];
  /* Drawn at random at the start: executors and clients send it back with every call, so
   * that nothing of an earlier driver process on this address (its executor ids, its
   * applications, its tasks) is taken for this one's. */
  uint64_t incarnation;
  /* FLINT_CLIENT_TIMEOUT_MS: an application whose client has not called for this long (it
   * keeps alive every third of it) is closed, as its client is gone. */
  uint64_t client_timeout_ns;
  pthread_t lease_thread; /* lease_main */
  bool lease_started;
  atomic_bool leases_stop;
  uint64_t next_lease_check_ns; /* lease_main's */
  scheduler *sched;
  cluster_backend *cluster;
  rpc_server *server;
  dp_server *blocks;
  task_pool *replies; /* packs large RunJob replies off the scheduler thread (REPLY_THREADS) */
  pthread_mutex_t lock;
  pthread_cond_t changed; /* submissions' output */
  app_entry *apps;
  library_name *library_names;
  uint64_t next_app_id, next_submission_id;
  submission *submissions;
} driver_state;

static fl_status empty_reply(fl_buf *out) {
  Flint__Empty e = FLINT__EMPTY__INIT;
  return proto_pack(&e.base, out);
}

/* Unpacks a request or fails the call with FL_EPROTO naming the message. */
#define UNPACK(type, var, body, what)                                                        \
  type *var = (type *)protobuf_c_message_unpack(&type##_descriptor_, NULL, (body).len,      \
                                                  (body).data);                              \
  if (!var) return FL_ERR(FL_EPROTO, "%s: malformed message", what)

/* protobuf-c names descriptors flint__x__descriptor; map the type names onto them. */
#define Flint__RegisterExecutorRequest_descriptor_ flint__register_executor_request__descriptor
#define Flint__HeartbeatRequest_descriptor_ flint__heartbeat_request__descriptor
#define Flint__ExecutorExitedRequest_descriptor_ flint__executor_exited_request__descriptor
#define Flint__OpenApplicationRequest_descriptor_ flint__open_application_request__descriptor
#define Flint__AppRequest_descriptor_ flint__app_request__descriptor
#define Flint__HasLibraryRequest_descriptor_ flint__has_library_request__descriptor
#define Flint__UploadLibraryRequest_descriptor_ flint__upload_library_request__descriptor
#define Flint__BroadcastPutRequest_descriptor_ flint__broadcast_put_request__descriptor
#define Flint__BroadcastRemoveRequest_descriptor_ flint__broadcast_remove_request__descriptor
#define Flint__RunJobRequest_descriptor_ flint__run_job_request__descriptor
#define Flint__StorageInfoRequest_descriptor_ flint__storage_info_request__descriptor
#define Flint__UnpersistRequest_descriptor_ flint__unpersist_request__descriptor
#define Flint__SubmitRequest_descriptor_ flint__submit_request__descriptor
#define Flint__OutputRequest_descriptor_ flint__output_request__descriptor
#define Flint__CancelSubmissionRequest_descriptor_ flint__cancel_submission_request__descriptor
#define Flint__FetchResultRequest_descriptor_ flint__fetch_result_request__descriptor
#define Flint__CancelJobsRequest_descriptor_ flint__cancel_jobs_request__descriptor
#define Flint__BarrierGatherRequest_descriptor_ flint__barrier_gather_request__descriptor
#define Flint__BarrierReportRequest_descriptor_ flint__barrier_report_request__descriptor
#define Flint__BarrierCheckpointRequest_descriptor_ flint__barrier_checkpoint_request__descriptor
#define Flint__BarrierReportsRequest_descriptor_ flint__barrier_reports_request__descriptor

/* ---- an application's context in the driver -------------------------------------------- */

static fl_status app_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t n,
                             const rdd_action *action, fl_buf *results) {
  return FL_ERR(FL_ESTATE, "the driver runs jobs only for clients");
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
  location_forget_id(app->blocks, rdd_id);
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
  location_each(app->blocks, rdd_id, count_block, &c);
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
  location_forget_id(app->maps, shuffle_id);
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
  location_table_destroy(app->maps);
  location_table_destroy(app->blocks);
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
  fl_status status = FL_OK;
  FL_CHECK(location_table_create(&app->maps));
  FL_CHECK(location_table_create(&app->blocks));
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
static app_entry *app_find(driver_state *d, uint64_t id) {
  for (app_entry *a = d->apps; a; a = a->next)
    if (a->id == id) return a;
  return NULL;
}

/* The running application `id` of this driver incarnation, which a close does not free until
 * app_unpin. */
static fl_status app_lookup(driver_state *d, uint64_t id, uint64_t incarnation, driver_app **out) {
  *out = NULL;
  if (incarnation != d->incarnation)
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to an earlier "
                  "driver process on %s, which has ended; open a new context", (unsigned long long)id, d->address);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *a = app_find(d, id);
  *out = a ? a->app : NULL;
  if (*out) a->users++;
  if (*out) a->last_seen_ns = common_now_ns();
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!*out)
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver", (unsigned long long)id);
  return FL_OK;
}

static void app_unpin(driver_state *d, driver_app *app) {
  if (!app) return;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *a = app_find(d, app->id);
  FL_ASSERT(a && a->users > 0);
  a->users--;
  pthread_cond_broadcast(&d->changed);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* ---- client calls ---------------------------------------------------------------------- */

static fl_status handle_open(driver_state *d, fl_bytes body, fl_buf *response) {
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
    Flint__OpenApplicationReply reply = FLINT__OPEN_APPLICATION_REPLY__INIT;
    reply.app_id = id;
    reply.incarnation = d->incarnation;
    reply.keepalive_ms = (uint32_t)(d->client_timeout_ns / 3000000u);
    reply.cores = cluster_cores(d->cluster);
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
  app_entry *e = app_find(d, id);
  driver_app *app = e ? e->app : NULL;
  if (e) e->app = NULL; /* no call finds it any more */
  if (app) scheduler_cancel(d->sched, id, 0); /* its running jobs end now */
  while (app && e->users > 0) FL_PCHECK(pthread_cond_wait(&d->changed, &d->lock));
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!app) return FL_ERR(FL_ENOENT, "no running application %llu", (unsigned long long)id);
  cluster_remove(d->cluster, id, NULL, 0, NULL, 0, true);
  app_free(app);
  common_log(LOG_INFO, "application %llu closed", (unsigned long long)id);
  return FL_OK;
}

static fl_status handle_close(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__AppRequest, req, body, "CloseApplication");
  uint64_t id = req->app_id, incarnation = req->incarnation;
  flint__app_request__free_unpacked(req, NULL);
  fl_status st = incarnation == d->incarnation
                     ? app_close(d, id)
                     : FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to "
                              "an earlier driver process", (unsigned long long)id);
  return st == FL_OK ? empty_reply(response) : st;
}

/* A client says it is alive (its lease). */
static fl_status handle_keepalive(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__AppRequest, req, body, "KeepAlive");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app); /* which renews the lease */
  app_unpin(d, app);
  flint__app_request__free_unpacked(req, NULL);
  return st == FL_OK ? empty_reply(response) : st;
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
static void *lease_main(void *arg) {
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
static void close_apps_of(driver_state *d, pid_t pid) {
  for (;;) {
    uint64_t id = 0;
    FL_PCHECK(pthread_mutex_lock(&d->lock));
    for (app_entry *a = d->apps; a && !id; a = a->next)
      if (a->app && a->pid == (uint32_t)pid) id = a->id;
    FL_PCHECK(pthread_mutex_unlock(&d->lock));
    if (!id || app_close(d, id) != FL_OK) return;
  }
}

/* Library ids are 32 lowercase hex digits (rdd/plan.c's content ids). */
static bool library_id_valid(const char *id) {
  if (!id || strlen(id) != 32) return false;
  for (const char *p = id; *p; p++)
    if (!strchr("0123456789abcdef", *p)) return false;
  return true;
}

static void library_path(driver_state *d, const char *id, char *path, size_t len) {
  snprintf(path, len, "%s/lib/%s.so", d->work_dir, id);
}

static fl_status app_add_library(driver_app *app, const char *id) {
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  bool have = false;
  for (size_t i = 0; i < app->num_libraries; i++) have |= strcmp(app->libraries[i], id) == 0;
  if (!have) {
    char **grown = common_realloc(app->libraries, (app->num_libraries + 1) * sizeof *grown);
    char *copy = common_strdup(id);
    if (grown) app->libraries = grown;
    if (!grown || !copy) {
      common_free(copy);
      st = FL_ERR(FL_ENOMEM, "out of memory");
    } else {
      app->libraries[app->num_libraries++] = copy;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return st;
}

/* Records the file name that a client gives library `id` (its last path element). */
static void library_name_note(driver_state *d, const char *id, const char *name) {
  if (!name || !*name) return;
  const char *slash = strrchr(name, '/');
  if (slash) name = slash + 1;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  library_name *n = d->library_names;
  while (n && strcmp(n->id, id) != 0) n = n->next;
  if (!n && (n = common_calloc(1, sizeof *n))) {
    snprintf(n->id, sizeof n->id, "%s", id);
    n->next = d->library_names;
    d->library_names = n;
  }
  if (n) snprintf(n->name, sizeof n->name, "%s", name);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* The name of the library an executor stores as `file` (content id + ".so"), into buf; the
 * file itself when the driver knows no name. */
static void library_name_of(driver_state *d, const char *file, char *buf, size_t len) {
  snprintf(buf, len, "%s", file);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (library_name *n = d->library_names; n; n = n->next)
    if (strncmp(file, n->id, strlen(n->id)) == 0 && strcmp(file + strlen(n->id), ".so") == 0)
      snprintf(buf, len, "%s", n->name);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

static fl_status handle_has_library(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__HasLibraryRequest, req, body, "HasLibrary");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK && !library_id_valid(req->id)) st = FL_ERR(FL_EPROTO, "HasLibrary: malformed library id");
  if (st == FL_OK) library_name_note(d, req->id, req->name);
  if (st == FL_OK) {
    char path[PATH_MAX + 64];
    library_path(d, req->id, path, sizeof path);
    Flint__HasLibraryReply reply = FLINT__HAS_LIBRARY_REPLY__INIT;
    reply.present = access(path, R_OK) == 0;
    if (reply.present) st = app_add_library(app, req->id);
    if (st == FL_OK) st = proto_pack(&reply.base, response);
  }
  app_unpin(d, app);
  flint__has_library_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_upload_library(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__UploadLibraryRequest, req, body, "UploadLibrary");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK && !library_id_valid(req->id)) st = FL_ERR(FL_EPROTO, "UploadLibrary: malformed library id");
  if (st == FL_OK) {
    char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
    library_path(d, req->id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)gettid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    bool ok = fd >= 0 && write(fd, req->content.data, req->content.len) == (ssize_t)req->content.len;
    if (fd >= 0) close(fd);
    if (!ok || rename(tmp, path) != 0) {
      unlink(tmp);
      st = FL_ERR(FL_EIO, "cannot store library %s: %s", req->name, strerror(errno));
    } else {
      st = app_add_library(app, req->id);
      library_name_note(d, req->id, req->name);
    }
  }
  app_unpin(d, app);
  if (st == FL_OK) st = empty_reply(response);
  flint__upload_library_request__free_unpacked(req, NULL);
  return st;
}

/* Whether a client's block-server address is HOST:PORT (or [V6]:PORT) that fits where
 * executors keep it, with printable characters only. */
static bool broadcast_address_valid(const char *a) {
  size_t n = strlen(a);
  const char *colon = strrchr(a, ':');
  if (n == 0 || n >= DP_ADDRESS_MAX || !colon || colon == a) return false;
  for (size_t i = 0; i < n; i++)
    if (a[i] <= ' ' || a[i] > '~') return false;
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  return colon[1] && !*end && !errno && port > 0 && port <= 65535;
}

/* Records where the client serves its broadcasts: executors fetch them from there. */
static fl_status handle_broadcast_put(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BroadcastPutRequest, req, body, "BroadcastPut");
  driver_app *app = NULL;
  fl_status st = FL_OK;
  if (!broadcast_address_valid(req->address))
    st = FL_ERR(FL_EPROTO, "BroadcastPut: broadcast %llu has an invalid address \"%.64s\" (want HOST:PORT)",
                (unsigned long long)req->broadcast_id, req->address);
  else if (req->broadcast_id == 0 || req->broadcast_id > UINT32_MAX)
    st = FL_ERR(FL_EPROTO, "BroadcastPut: broadcast id %llu out of range", (unsigned long long)req->broadcast_id);
  if (st == FL_OK) st = app_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) {
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    snprintf(app->broadcast_address, sizeof app->broadcast_address, "%s", req->address);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    common_log(LOG_DEBUG, "application %llu: broadcast %llu of %llu bytes served by %s",
               (unsigned long long)req->app_id, (unsigned long long)req->broadcast_id,
               (unsigned long long)req->total, req->address);
    st = empty_reply(response);
  }
  app_unpin(d, app);
  flint__broadcast_put_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_broadcast_remove(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BroadcastRemoveRequest, req, body, "BroadcastRemove");
  uint64_t incarnation = req->incarnation, app_id = req->app_id, id = req->broadcast_id;
  flint__broadcast_remove_request__free_unpacked(req, NULL);
  if (incarnation != d->incarnation) /* another application of that id is this driver's */
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to an earlier "
                  "driver process", (unsigned long long)app_id);
  cluster_remove_broadcast(d->cluster, app_id, id);
  return empty_reply(response);
}

/* Records a job of the application that starts now; returns its id (1, 2, ... within the
 * application; 0 when the application is gone). */
static uint64_t job_note_start(driver_state *d, uint64_t app_id, uint32_t tasks) {
  uint64_t id = 0;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = app_find(d, app_id);
  if (e) {
    id = ++e->num_jobs;
    job_record *j = &e->jobs[(id - 1) % JOBS_KEPT];
    *j = (job_record){.id = id, .tasks = tasks, .running = true, .status = FL_OK};
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return id;
}

/* Records how job `job_id` ended, unless newer jobs pushed its record out of the ring. */
static void job_note_end(driver_state *d, uint64_t app_id, uint64_t job_id, fl_status status, const char *error) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = app_find(d, app_id);
  job_record *j = e && job_id ? &e->jobs[(job_id - 1) % JOBS_KEPT] : NULL;
  if (j && j->id == job_id) {
    j->running = false;
    j->status = status;
    snprintf(j->error, sizeof j->error, "%s", error ? error : "");
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* Moves results[i] to the application's parked results; false when out of memory. */
static bool park_result(driver_app *app, uint64_t operation_id, uint32_t index, fl_buf *result) {
  parked_result *p = common_calloc(1, sizeof *p);
  if (!p) return false;
  p->operation_id = operation_id;
  p->index = index;
  p->data = *result;
  *result = (fl_buf)FL_BUF_INIT;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  p->next = app->parked;
  app->parked = p;
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return true;
}

/* Drops what a failed reply parked: the client will not ask for it. */
static void unpark_operation(driver_app *app, uint64_t operation_id) {
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  for (parked_result **p = &app->parked; *p;) {
    if ((*p)->operation_id == operation_id) {
      parked_result *gone = *p;
      *p = gone->next;
      fl_buf_free(&gone->data);
      common_free(gone);
    } else {
      p = &(*p)->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
}

/* The small broadcasts that a RunJob carries, and the ones its client destroyed (app->lock
 * held). Both are idempotent: a client sends again what a failed call carried. */
static fl_status app_take_broadcasts(driver_app *app, const Flint__RunJobRequest *req) {
  for (size_t k = 0; k < req->n_removed_broadcasts; k++)
    for (size_t i = 0; i < app->num_broadcasts; i++)
      if (app->broadcasts[i].id == req->removed_broadcasts[k]) {
        app->broadcast_bytes -= app->broadcasts[i].value.len;
        fl_buf_free(&app->broadcasts[i].value);
        app->broadcasts[i] = app->broadcasts[--app->num_broadcasts];
        break;
      }
  for (size_t k = 0; k < req->n_broadcasts; k++) {
    const Flint__InlineBroadcast *b = req->broadcasts[k];
    if (b->id == 0 || b->id > UINT32_MAX)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast id %llu out of range", (unsigned long long)b->id);
    if (b->value.len > BROADCAST_INLINE_MAX)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast %llu has %zu bytes, over the %zu that go with a job",
                    (unsigned long long)b->id, b->value.len, BROADCAST_INLINE_MAX);
    bool have = false;
    for (size_t i = 0; i < app->num_broadcasts && !have; i++) have = app->broadcasts[i].id == b->id;
    if (have) continue;
    if (app->broadcast_bytes + b->value.len > BROADCAST_INLINE_TOTAL)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast %llu would take the application's small broadcasts over %zu bytes",
                    (unsigned long long)b->id, BROADCAST_INLINE_TOTAL);
    if (app->num_broadcasts == app->cap_broadcasts) {
      size_t cap = app->cap_broadcasts ? app->cap_broadcasts * 2 : 8;
      inline_broadcast *grown = common_realloc(app->broadcasts, cap * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      app->broadcasts = grown;
      app->cap_broadcasts = cap;
    }
    inline_broadcast *nb = &app->broadcasts[app->num_broadcasts];
    nb->id = b->id;
    nb->value = (fl_buf)FL_BUF_INIT;
    if (fl_buf_append(&nb->value, b->value.data, b->value.len) != FL_OK) return FL_ERR(FL_ENOMEM, "out of memory");
    app->num_broadcasts++;
    app->broadcast_bytes += b->value.len;
  }
  return FL_OK;
}

/* A RunJob call while its job runs: started on the rpc queue's thread (run_job_start), it
 * is answered from the scheduler thread when the job ends (run_job_ended), so no thread
 * waits on a job and the call costs no hand-off to a handler thread and back. */
typedef struct run_job {
  task_pool_work work; /* first: a large reply is packed on d->replies */
  driver_state *d;
  driver_app *app;
  Flint__RunJobRequest *req;
  rpc_deferred *call;
  driver_action action;
  bool have_action;
  rdd *r;
  fl_buf *results;
  rdd_batch reports_left;
  sched_job_stats stats;
  uint64_t job_id; /* the application's job number, for status (job_note_start) */
} run_job;

static void run_job_free(run_job *j) {
  rdd_batch_free(&j->reports_left);
  if (j->results)
    for (size_t i = 0; i < j->req->n_partitions; i++) fl_buf_free(&j->results[i]);
  common_free(j->results);
  if (j->have_action) rdd_action_clear(&j->action.action);
  if (j->r) rdd_release(j->r);
  app_unpin(j->d, j->app);
  flint__run_job_request__free_unpacked(j->req, NULL);
  common_free(j);
}

/* The reply of a job that succeeded: results inline while they fit (the rest parked for
 * FetchResult), accumulator updates, the job's figures and barrier reports left. */
static fl_status run_job_reply(run_job *j, fl_buf *response) {
  driver_app *app = j->app;
  const Flint__RunJobRequest *req = j->req;
  fl_buf *results = j->results;
  fl_status status = FL_OK;
  ProtobufCBinaryData *report_bins = NULL;
  Flint__RunJobReply reply = FLINT__RUN_JOB_REPLY__INIT;
  ProtobufCBinaryData *bins = common_calloc(req->n_partitions + 1, sizeof *bins);
  uint64_t *sizes = common_calloc(req->n_partitions + 1, sizeof *sizes);
  /* Accumulator updates: taken from the application now, sent as one list. */
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  fl_buf accs = app->accumulators;
  app->accumulators = (fl_buf)FL_BUF_INIT;
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  size_t n_accs = 0;
  rdd_cursor c = {accs.data, accs.data + accs.len};
  while (c.p < c.end) {
    uint64_t id, len;
    size_t a = common_varint_get(c.p, c.end, &id);
    size_t b = a ? common_varint_get(c.p + a, c.end, &len) : 0;
    if (!b) break;
    c.p += a + b + len;
    n_accs++;
  }
  Flint__AccUpdate *acc_items = common_calloc(n_accs + 1, sizeof *acc_items);
  Flint__AccUpdate **acc_ptrs = common_calloc(n_accs + 1, sizeof *acc_ptrs);
  bool parked = false;
  if (!bins || !sizes || !acc_items || !acc_ptrs) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    /* Results inline, in order, while they fit; the rest wait for FetchResult. */
    size_t inline_bytes = 0;
    for (size_t i = 0; i < req->n_partitions && status == FL_OK; i++) {
      sizes[i] = results[i].len;
      if (results[i].len == 0) continue;
      if (inline_bytes + results[i].len <= DRIVER_RESULT_INLINE) {
        inline_bytes += results[i].len;
        bins[i] = (ProtobufCBinaryData){results[i].len, results[i].data};
      } else if (park_result(app, req->operation_id, (uint32_t)i, &results[i])) {
        parked = true;
      } else {
        status = FL_ERR(FL_ENOMEM, "out of memory");
      }
    }
    reply.n_results = req->n_partitions;
    reply.results = bins;
    reply.n_sizes = req->n_partitions;
    reply.sizes = sizes;
    c = (rdd_cursor){accs.data, accs.data + accs.len};
    for (size_t i = 0; i < n_accs; i++) {
      uint64_t id = 0, len = 0;
      c.p += common_varint_get(c.p, c.end, &id);
      c.p += common_varint_get(c.p, c.end, &len);
      flint__acc_update__init(&acc_items[i]);
      acc_items[i].id = id;
      acc_items[i].value = (ProtobufCBinaryData){len, (uint8_t *)c.p};
      acc_ptrs[i] = &acc_items[i];
      c.p += len;
    }
    reply.n_acc_updates = n_accs;
    reply.acc_updates = acc_ptrs;
    reply.attempts = j->stats.attempts;
    reply.attempts_failed = j->stats.attempts_failed;
    reply.task_ns = j->stats.task_ns;
    reply.blocks_mapped = j->stats.blocks_mapped;
    reply.blocks_fetched = j->stats.blocks_fetched;
    if (j->reports_left.count && (report_bins = common_calloc(j->reports_left.count, sizeof *report_bins))) {
      rdd_cursor rc = {j->reports_left.buf.data, j->reports_left.buf.data + j->reports_left.buf.len};
      fl_bytes rec;
      while (reply.n_barrier_reports < j->reports_left.count && rdd_cursor_next(&rc, &rec))
        report_bins[reply.n_barrier_reports++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
      reply.barrier_reports = report_bins;
    }
    if (status == FL_OK) status = proto_pack(&reply.base, response);
  }
  if (status != FL_OK && parked) unpark_operation(app, req->operation_id);
  common_free(report_bins);
  common_free(sizes);
  common_free(bins);
  common_free(acc_items);
  common_free(acc_ptrs);
  fl_buf_free(&accs);
  return status;
}

/* Answers the call with the job's outcome and frees j (any thread). j goes first: once the
 * reply is out, a stopping driver may free what j points to. */
static void run_job_answer(run_job *j, fl_status status, const char *error) {
  job_note_end(j->d, j->app->id, j->job_id, status, error);
  fl_buf response = FL_BUF_INIT;
  char message[1024] = "";
  if (status == FL_OK) status = run_job_reply(j, &response);
  else snprintf(message, sizeof message, "%s", error ? error : fl_strerror(status));
  if (status != FL_OK && !*message) snprintf(message, sizeof message, "%s", fl_last_error());
  rpc_deferred *call = j->call;
  run_job_free(j);
  rpc_deferred_reply(call, status, message, &response);
}

/* Results of more bytes than this are packed (copied twice: protobuf, gRPC) on a pool
 * thread, so that the scheduler thread does not stop every other job for milliseconds. The
 * pool is fixed (REPLY_THREADS): under load, replies wait in its queue, in the order their
 * jobs ended, instead of each taking a thread of its own. The queue holds at most one entry
 * per RunJob call in flight, whose results the driver holds already. */
#define RUN_JOB_REPLY_OFFLOAD ((size_t)1 << 20)
#define REPLY_THREADS 4

static void run_job_answer_work(task_pool_work *w) { run_job_answer((run_job *)w, FL_OK, NULL); }

/* The job ended (the scheduler thread): the call gets its reply. */
static void run_job_ended(void *arg, fl_status status, const char *error) {
  run_job *j = arg;
  size_t bytes = 0;
  for (size_t i = 0; status == FL_OK && i < j->req->n_partitions; i++) bytes += j->results[i].len;
  if (bytes > RUN_JOB_REPLY_OFFLOAD) {
    j->work.run = run_job_answer_work;
    task_pool_submit(j->d->replies, &j->work); /* never blocks */
    return;
  }
  run_job_answer(j, status, error);
}

/* Checks and records the request (plan, broadcasts, storage levels, released datasets) and
 * submits its job; FL_OK when the call was taken for a reply at the job's end, else the
 * failure to answer at once. Never blocks. */
static fl_status run_job_start(driver_state *d, const rpc_request *call) {
  UNPACK(Flint__RunJobRequest, req, call->body, "RunJob");
  if (req->operation_id == 0) {
    flint__run_job_request__free_unpacked(req, NULL);
    return FL_ERR(FL_EPROTO, "RunJob: operation id 0");
  }
  run_job *j = common_calloc(1, sizeof *j);
  if (!j) {
    flint__run_job_request__free_unpacked(req, NULL);
    return FL_ERR(FL_ENOMEM, "out of memory");
  }
  j->d = d;
  j->req = req;
  fl_status status = app_lookup(d, req->app_id, req->incarnation, &j->app);
  if (status != FL_OK) goto fail;
  driver_app *app = j->app;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  if (req->plan.len) status = rdd_plan_add(app->plan, (fl_bytes){req->plan.data, req->plan.len});
  if (status == FL_OK) status = app_take_broadcasts(app, req);
  for (size_t i = 0; status == FL_OK && i < req->n_levels; i++) {
    rdd *x = rdd_plan_find(app->plan, req->levels[i]->rdd_id);
    if (x && req->levels[i]->level <= FL_DISK_ONLY) atomic_store(&x->level, req->levels[i]->level);
  }
  if (status == FL_OK && !(j->r = rdd_plan_find(app->plan, req->rdd_id)))
    status = FL_ERR(FL_EPROTO, "RunJob: unknown dataset %llu", (unsigned long long)req->rdd_id);
  if (status == FL_OK) {
    rdd_retain(j->r);
    status = rdd_action_decode(app->plan, (fl_bytes){req->action.data, req->action.len}, &j->action.action);
    j->have_action = status == FL_OK;
    j->action.encoded = (fl_bytes){req->action.data, req->action.len};
  }
  for (size_t i = 0; status == FL_OK && i < req->n_partitions; i++)
    if (req->partitions[i] >= j->r->num_partitions)
      status = FL_ERR(FL_EPROTO, "RunJob: partition %u of a dataset with %u", req->partitions[i],
                      j->r->num_partitions);
  /* Datasets the client freed (their cached blocks and shuffles go with them). */
  for (size_t i = 0; status == FL_OK && i < req->n_released; i++) rdd_plan_release(app->plan, req->released[i]);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status != FL_OK) goto fail;

  j->results = common_calloc(req->n_partitions ? req->n_partitions : 1, sizeof *j->results);
  if (!j->results) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto fail;
  }
  j->job_id = job_note_start(d, app->id, (uint32_t)req->n_partitions);
  j->call = rpc_defer(call);
  /* The client's going away (its connection drops) cancels the job, as does CancelJobs. */
  sched_job_opts opts = {.group = app->id, .tag = req->operation_id, .abandoned = rpc_deferred_cancelled(j->call),
                         .reports_left = &j->reports_left, .stats = &j->stats};
  status = scheduler_submit_job(d->sched, j->r, req->partitions, (uint32_t)req->n_partitions, &j->action.action,
                                &opts, j->results, run_job_ended, j);
  if (status != FL_OK) run_job_answer(j, status, fl_last_error()); /* not submitted: answered here */
  return FL_OK;
fail:
  run_job_free(j);
  return status;
}

/* A chunk of a parked result; the result goes once its last byte is read. */
static fl_status handle_fetch_result(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__FetchResultRequest, req, body, "FetchResult");
  driver_app *app;
  fl_status status = app_lookup(d, req->app_id, req->incarnation, &app);
  if (status != FL_OK) {
    flint__fetch_result_request__free_unpacked(req, NULL);
    return status;
  }
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  parked_result **p = &app->parked;
  while (*p && ((*p)->operation_id != req->operation_id || (*p)->index != req->index)) p = &(*p)->next;
  if (!*p) {
    status = FL_ERR(FL_ENOENT, "FetchResult: no result %u of operation %llu waits on the driver",
                    req->index, (unsigned long long)req->operation_id);
  } else if (req->offset >= (*p)->data.len) {
    status = FL_ERR(FL_EPROTO, "FetchResult: offset %llu of a result of %zu bytes",
                    (unsigned long long)req->offset, (*p)->data.len);
  } else {
    size_t n = (*p)->data.len - req->offset;
    if (n > DRIVER_RESULT_CHUNK) n = DRIVER_RESULT_CHUNK;
    Flint__FetchResultReply reply = FLINT__FETCH_RESULT_REPLY__INIT;
    reply.chunk = (ProtobufCBinaryData){n, (*p)->data.data + req->offset};
    status = proto_pack(&reply.base, response);
    if (status == FL_OK && req->offset + n == (*p)->data.len) {
      parked_result *done = *p;
      *p = done->next;
      fl_buf_free(&done->data);
      common_free(done);
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  app_unpin(d, app);
  flint__fetch_result_request__free_unpacked(req, NULL);
  return status;
}

static fl_status handle_cancel_jobs(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__CancelJobsRequest, req, body, "CancelJobs");
  driver_app *app;
  fl_status status = app_lookup(d, req->app_id, req->incarnation, &app);
  if (status == FL_OK) {
    status = scheduler_cancel(d->sched, app->id, req->operation_id);
    app_unpin(d, app);
  }
  flint__cancel_jobs_request__free_unpacked(req, NULL);
  return status == FL_OK ? empty_reply(response) : status;
}

static fl_status handle_storage_info(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__StorageInfoRequest, req, body, "StorageInfo");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app);
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
  app_unpin(d, app);
  flint__storage_info_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_unpersist(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__UnpersistRequest, req, body, "Unpersist");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) {
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    rdd *r = rdd_plan_find(app->plan, req->rdd_id);
    if (r) atomic_store(&r->level, FL_STORAGE_NONE);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    app_cache_remove_rdd(app, req->rdd_id);
    st = empty_reply(response);
  }
  app_unpin(d, app);
  flint__unpersist_request__free_unpacked(req, NULL);
  return st;
}

/* ---- job binaries ---------------------------------------------------------------------- */

static void *supervise(void *arg) {
  pthread_setname_np(pthread_self(), "fl-supervise");
  void **args = arg;
  driver_state *d = args[0];
  submission *s = args[1];
  common_free(args);
  struct pollfd fds[2] = {{s->out_fd, POLLIN, 0}, {s->err_fd, POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      FL_PCHECK(pthread_mutex_lock(&d->lock));
      if (n > 0) {
        fl_buf *b = i == 0 ? &s->out : &s->err;
        if (b->len + (size_t)n <= MAX_JOB_OUTPUT) fl_buf_append(b, buf, (size_t)n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
      pthread_cond_broadcast(&d->changed);
      FL_PCHECK(pthread_mutex_unlock(&d->lock));
    }
  }
  /* Marked exited before it is reaped, so that a cancel (handle_cancel_submission) never
   * signals a pid that another process has taken since. */
  siginfo_t info;
  memset(&info, 0, sizeof info);
  while (waitid(P_PID, (id_t)s->pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  close_apps_of(d, s->pid); /* before `exited`: its submitter sees it gone with its job */
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->exited = true;
  if (info.si_code == CLD_EXITED) s->exit_code = info.si_status;
  else s->signal = info.si_status;
  pthread_cond_broadcast(&d->changed);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR) {
  }
  if (s->signal)
    common_log(LOG_WARN, "job binary %llu was killed by signal %d (%s)", (unsigned long long)s->id,
               s->signal, strsignal(s->signal));
  else
    common_log(LOG_INFO, "job binary %llu exited with status %d", (unsigned long long)s->id, s->exit_code);
  return NULL;
}

/* A long-running driver keeps the newest MAX_SUBMISSIONS_KEPT finished job binaries (output
 * and library); older ones go. */
static void prune_submissions(driver_state *d) {
  submission *gone = NULL;
  uint32_t finished = 0;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (submission **p = &d->submissions; *p;) {
    if ((*p)->exited && ++finished > MAX_SUBMISSIONS_KEPT) {
      submission *old = *p;
      *p = old->next;
      old->next = gone;
      gone = old;
    } else {
      p = &(*p)->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  while (gone) {
    submission *old = gone;
    gone = old->next;
    pthread_join(old->supervisor, NULL); /* it ended with the job; only its return is left */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/jobs/job-%llu", d->work_dir, (unsigned long long)old->id);
    common_remove_tree(path);
    fl_buf_free(&old->out);
    fl_buf_free(&old->err);
    common_free(old);
  }
}

static fl_status handle_submit(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__SubmitRequest, req, body, "Submit");
  fl_status status = FL_OK;
  submission *s = NULL;
  char path[PATH_MAX + 64];
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  char **argv = NULL;
  if (req->library.len == 0) {
    status = FL_ERR(FL_EINVAL, "Submit: the job library is empty");
    goto cleanup;
  }
  if (req->n_args > 1024) {
    status = FL_ERR(FL_EPROTO, "Submit: %zu arguments is too many", req->n_args);
    goto cleanup;
  }
  s = common_calloc(1, sizeof *s);
  argv = common_calloc(req->n_args + 9, sizeof *argv);
  if (!s || !argv) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->id = ++d->next_submission_id;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  /* jobs/job-N/NAME: the library keeps its file name, which messages about its functions
   * and the application's name show. */
  const char *name = req->name ? strrchr(req->name, '/') : NULL;
  name = name ? name + 1 : req->name;
  if (!name || !*name || strlen(name) > 128 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) name = "job.so";
  snprintf(path, sizeof path, "%s/jobs/job-%llu", d->work_dir, (unsigned long long)s->id);
  if ((status = common_mkdirs(path)) != FL_OK) goto cleanup;
  size_t dir_len = strlen(path);
  snprintf(path + dir_len, sizeof path - dir_len, "/%s", name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
  bool ok = fd >= 0 && write(fd, req->library.data, req->library.len) == (ssize_t)req->library.len;
  if (fd >= 0) close(fd);
  if (!ok) {
    status = FL_ERR(FL_EIO, "cannot store the job library %s: %s", path, strerror(errno));
    goto cleanup;
  }
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    status = FL_ERR(FL_EIO, "cannot make pipes: %s", strerror(errno));
    goto cleanup;
  }
  /* The child is the flint command itself, as a client of this driver. */
  char master[128];
  snprintf(master, sizeof master, "flint://%s", d->address);
  argv[0] = "flint";
  argv[1] = "submit";
  argv[2] = "--in-process";
  argv[3] = "--master";
  argv[4] = master;
  /* The application's name: the submitter's, else the library's file name (never "flint",
   * this program's, which every job binary would share). */
  argv[5] = "--name";
  argv[6] = req->app_name && *req->app_name ? req->app_name : (char *)name;
  argv[7] = path;
  for (size_t i = 0; i < req->n_args; i++) argv[8 + i] = req->args[i];
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    status = FL_ERR(FL_EIO, "cannot start the job: %s", strerror(errno));
    goto cleanup;
  }
  if (pid == 0) {
    /* Job binaries end with their driver, also one killed outright (kill -9), whose stop
     * could not end them: their output would go nowhere. The signal comes when the forking
     * thread ends; it is an rpc handler, of a pool that lives until the driver stops. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  s->pid = pid;
  s->out_fd = out_pipe[0];
  s->err_fd = err_pipe[0];
  out_pipe[0] = out_pipe[1] = err_pipe[0] = err_pipe[1] = -1;
  void **args = common_malloc(2 * sizeof *args);
  if (args) {
    args[0] = d;
    args[1] = s;
  }
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->next = d->submissions;
  d->submissions = s;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  prune_submissions(d);
  if (!args || pthread_create(&s->supervisor, NULL, supervise, args) != 0) {
    common_free(args);
    kill(pid, SIGKILL);
    status = FL_ERR(FL_ENOMEM, "cannot supervise the job");
    s = NULL; /* listed: freed with the driver */
    goto cleanup;
  }
  common_log(LOG_INFO, "job binary %llu (%s) started as pid %d", (unsigned long long)s->id, req->name, (int)pid);
  Flint__SubmitReply reply = FLINT__SUBMIT_REPLY__INIT;
  reply.submission_id = s->id;
  s = NULL;
  status = proto_pack(&reply.base, response);
cleanup:
  for (int i = 0; i < 2; i++) {
    if (out_pipe[i] >= 0) close(out_pipe[i]);
    if (err_pipe[i] >= 0) close(err_pipe[i]);
  }
  common_free(s);
  common_free(argv);
  flint__submit_request__free_unpacked(req, NULL);
  return status;
}

/* `flint submit` was interrupted: its job binary ends (SIGTERM, which `flint submit
 * --in-process` takes as a kill), and its application with it. */
static fl_status handle_cancel_submission(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__CancelSubmissionRequest, req, body, "CancelSubmission");
  uint64_t id = req->submission_id;
  flint__cancel_submission_request__free_unpacked(req, NULL);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = d->submissions;
  while (s && s->id != id) s = s->next;
  bool running = s && !s->exited;
  if (running) kill(s->pid, SIGTERM); /* reaped by its supervisor thread, under this lock */
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!s) return FL_ERR(FL_ENOENT, "no job binary %llu on this driver", (unsigned long long)id);
  if (running) common_log(LOG_INFO, "job binary %llu cancelled by its submitter", (unsigned long long)id);
  return empty_reply(response);
}

static fl_status handle_output(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__OutputRequest, req, body, "Output");
  uint32_t wait_ms = req->wait_ms < MAX_WAIT_MS ? req->wait_ms : MAX_WAIT_MS;
  uint64_t deadline = common_now_ns() + (uint64_t)wait_ms * 1000000u;
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = d->submissions;
  while (s && s->id != req->submission_id) s = s->next;
  if (!s) {
    st = FL_ERR(FL_ENOENT, "no job binary %llu on this driver", (unsigned long long)req->submission_id);
  } else {
    while (!s->exited && s->out.len <= req->stdout_offset && s->err.len <= req->stderr_offset &&
           common_now_ns() < deadline && !atomic_load(call->cancelled)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 50000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&d->changed, &d->lock, &ts);
    }
    Flint__OutputReply reply = FLINT__OUTPUT_REPLY__INIT;
    if (req->stdout_offset < s->out.len)
      reply.stdout_data = (ProtobufCBinaryData){s->out.len - req->stdout_offset, s->out.data + req->stdout_offset};
    if (req->stderr_offset < s->err.len)
      reply.stderr_data = (ProtobufCBinaryData){s->err.len - req->stderr_offset, s->err.data + req->stderr_offset};
    /* Exited only once all of the output has been read. */
    reply.exited = s->exited;
    reply.exit_code = s->exit_code;
    reply.signal = s->signal;
    st = proto_pack(&reply.base, response);
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  flint__output_request__free_unpacked(req, NULL);
  return st;
}

/* ---- status ---------------------------------------------------------------------------- */

static fl_status handle_status(driver_state *d, fl_buf *response) {
  Flint__StatusReply reply = FLINT__STATUS_REPLY__INIT;
  void **execs = NULL;
  size_t num_execs = 0;
  fl_status st = cluster_describe(d->cluster, &execs, &num_execs);
  if (st != FL_OK) return st;
  reply.incarnation = d->incarnation;
  reply.n_executors = num_execs;
  reply.executors = (Flint__ExecutorInfo **)execs;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  size_t n = 0;
  for (app_entry *a = d->apps; a; a = a->next) n++;
  Flint__AppInfo *apps = common_calloc(n + 1, sizeof *apps);
  Flint__AppInfo **app_ptrs = common_calloc(n + 1, sizeof *app_ptrs);
  Flint__JobInfo *jobs = common_calloc(JOBS_KEPT * n + 1, sizeof *jobs);
  Flint__JobInfo **job_ptrs = common_calloc(JOBS_KEPT * n + 1, sizeof *job_ptrs);
  if (!apps || !app_ptrs || !jobs || !job_ptrs) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    size_t i = 0, k = 0;
    for (app_entry *a = d->apps; a; a = a->next, i++) {
      flint__app_info__init(&apps[i]);
      apps[i].id = a->id;
      apps[i].name = a->name;
      apps[i].state = a->app ? "running" : "finished";
      apps[i].jobs = &job_ptrs[k];
      uint64_t count = a->num_jobs < JOBS_KEPT ? a->num_jobs : JOBS_KEPT;
      for (uint64_t j = 0; j < count; j++, k++) {
        job_record *r = &a->jobs[(a->num_jobs - count + j) % JOBS_KEPT];
        flint__job_info__init(&jobs[k]);
        jobs[k].id = r->id;
        jobs[k].state = r->running ? "running" : r->status == FL_OK ? "succeeded" : "failed";
        jobs[k].tasks = r->tasks;
        jobs[k].error = r->error;
        job_ptrs[k] = &jobs[k];
        apps[i].n_jobs++;
      }
      app_ptrs[i] = &apps[i];
    }
    reply.n_applications = n;
    reply.applications = app_ptrs;
    st = proto_pack(&reply.base, response);
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  for (size_t i = 0; i < num_execs; i++) {
    Flint__ExecutorInfo *x = execs[i];
    common_free(x->address);
    common_free(x);
  }
  common_free(execs);
  common_free(apps);
  common_free(app_ptrs);
  common_free(jobs);
  common_free(job_ptrs);
  return st;
}

/* ---- barrier stages (docs/barrier.md) ----------------------------------------------------- */

/* An executor's barrier task waits here (an RPC handler thread) for the other ranks. */
static fl_status handle_barrier_gather(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__BarrierGatherRequest, req, body, "BarrierGather");
  fl_status st = FL_OK;
  rdd_batch all = {FL_BUF_INIT, 0};
  ProtobufCBinaryData *bins = NULL;
  if (req->message.len > RDD_BARRIER_GATHER_MAX) {
    st = FL_ERR(FL_ELIMIT, "BarrierGather: a message of %zu bytes", req->message.len);
    goto done;
  }
  uint32_t timeout = req->timeout_ms ? req->timeout_ms : RDD_BARRIER_TIMEOUT_MS;
  st = barrier_gather(scheduler_barriers(d->sched), req->job_id, req->stage, req->attempt, req->rank, req->round,
                      (fl_bytes){req->message.data, req->message.len},
                      common_now_ns() + (uint64_t)timeout * 1000000u, call->cancelled, NULL, &all);
  if (st != FL_OK) goto done;
  Flint__BarrierGatherReply reply = FLINT__BARRIER_GATHER_REPLY__INIT;
  if (!(bins = common_calloc(all.count + 1, sizeof *bins))) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
    goto done;
  }
  rdd_cursor c = {all.buf.data, all.buf.data + all.buf.len};
  fl_bytes rec;
  while (reply.n_messages < all.count && rdd_cursor_next(&c, &rec))
    bins[reply.n_messages++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
  reply.messages = bins;
  st = proto_pack(&reply.base, response);
done:
  common_free(bins);
  rdd_batch_free(&all);
  flint__barrier_gather_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_barrier_report(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BarrierReportRequest, req, body, "BarrierReport");
  fl_status st = req->message.len > RDD_BARRIER_REPORT_MAX
                     ? FL_ERR(FL_ELIMIT, "BarrierReport: a message of %zu bytes", req->message.len)
                     : barrier_report(scheduler_barriers(d->sched), req->job_id, req->rdd_id, req->rank,
                                      (fl_bytes){req->message.data, req->message.len});
  flint__barrier_report_request__free_unpacked(req, NULL);
  return st == FL_OK ? empty_reply(response) : st;
}

static fl_status handle_barrier_checkpoint(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BarrierCheckpointRequest, req, body, "BarrierCheckpoint");
  fl_status st;
  if (req->get) {
    fl_buf state = FL_BUF_INIT;
    st = barrier_checkpoint_get(scheduler_barriers(d->sched), req->job_id, req->rdd_id, &state);
    if (st == FL_OK) {
      Flint__BarrierCheckpointReply reply = FLINT__BARRIER_CHECKPOINT_REPLY__INIT;
      reply.state = (ProtobufCBinaryData){state.len, state.data};
      st = proto_pack(&reply.base, response);
    }
    fl_buf_free(&state);
  } else {
    st = req->state.len > RDD_BARRIER_CHECKPOINT_MAX
             ? FL_ERR(FL_ELIMIT, "BarrierCheckpoint: a state of %zu bytes", req->state.len)
             : barrier_checkpoint_put(scheduler_barriers(d->sched), req->job_id, req->stage, req->attempt, req->rdd_id,
                                      (fl_bytes){req->state.data, req->state.len});
    if (st == FL_OK) st = empty_reply(response);
  }
  flint__barrier_checkpoint_request__free_unpacked(req, NULL);
  return st;
}

/* A client reads the reports of its running job (long poll). */
static fl_status handle_barrier_reports(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__BarrierReportsRequest, req, body, "BarrierReports");
  driver_app *app;
  fl_status st = app_lookup(d, req->app_id, req->incarnation, &app);
  if (st != FL_OK) {
    flint__barrier_reports_request__free_unpacked(req, NULL);
    return st;
  }
  uint32_t wait = req->wait_ms > MAX_WAIT_MS ? MAX_WAIT_MS : req->wait_ms;
  rdd_batch got = {FL_BUF_INIT, 0};
  barrier_wait_reports(scheduler_barriers(d->sched), app->id, req->operation_id,
                       common_now_ns() + (uint64_t)wait * 1000000u, call->cancelled, &got);
  Flint__BarrierReportsReply reply = FLINT__BARRIER_REPORTS_REPLY__INIT;
  ProtobufCBinaryData *bins = common_calloc(got.count + 1, sizeof *bins);
  if (!bins) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    rdd_cursor c = {got.buf.data, got.buf.data + got.buf.len};
    fl_bytes rec;
    while (reply.n_reports < got.count && rdd_cursor_next(&c, &rec))
      bins[reply.n_reports++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
    reply.reports = bins;
    st = proto_pack(&reply.base, response);
  }
  common_free(bins);
  rdd_batch_free(&got);
  app_unpin(d, app);
  flint__barrier_reports_request__free_unpacked(req, NULL);
  return st;
}

/* ---- dispatch -------------------------------------------------------------------------- */

static fl_status handle_register(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__RegisterExecutorRequest, req, body, "RegisterExecutor");
  uint64_t id = 0;
  fl_status st = req->has_gpu && req->gpu > 1023
                     ? FL_ERR(FL_EPROTO, "RegisterExecutor: GPU %u", req->gpu)
                     : cluster_register(d->cluster, req->host, req->rpc_port, req->data_port, req->cores,
                                        req->memory, req->has_gpu ? (int32_t)req->gpu : -1, req->node, req->pid,
                                        req->supervised, &id);
  flint__register_executor_request__free_unpacked(req, NULL);
  if (st != FL_OK) return st;
  Flint__RegisterExecutorReply reply = FLINT__REGISTER_EXECUTOR_REPLY__INIT;
  reply.executor_id = id;
  reply.heartbeat_ms = HEARTBEAT_MS;
  reply.driver_data_port = (uint32_t)dp_server_port(d->blocks);
  reply.incarnation = d->incarnation;
  return proto_pack(&reply.base, response);
}

static fl_status handle_heartbeat(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__HeartbeatRequest, req, body, "Heartbeat");
  Flint__HeartbeatReply reply = FLINT__HEARTBEAT_REPLY__INIT;
  reply.unknown = !cluster_heartbeat(d->cluster, req->executor_id, req->incarnation, req->cached_bytes,
                                     req->tasks_run, req->tasks_failed);
  flint__heartbeat_request__free_unpacked(req, NULL);
  return proto_pack(&reply.base, response);
}

/* An executor's supervisor says its process died: the executor is lost now (its running
 * tasks fail, and count as failures: Spark's ExecutorLostFailure caused by the app), with the
 * cause in words: the signal or exit status and, from its last words, the function and the
 * partition that ran it. */
static fl_status handle_executor_exited(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__ExecutorExitedRequest, req, body, "ExecutorExited");
  char why[640], function[400] = "";
  int n = req->signal ? snprintf(why, sizeof why, "its process died by signal %d (%s)", req->signal,
                                 req->signal > 0 && req->signal < 65 ? strsignal(req->signal) : "unknown")
                      : snprintf(why, sizeof why, "its process exited with status %d", req->exit_code);
  if (req->task_key) {
    char library[160] = "";
    if (req->library[0]) library_name_of(d, req->library, library, sizeof library);
    if (req->symbol[0] || library[0])
      snprintf(function, sizeof function, " in function %s%s%s", req->symbol[0] ? req->symbol : "?",
               library[0] ? " of " : "", library);
    snprintf(why + n, sizeof why - (size_t)n, "%s, running partition %u of dataset %llu", function, req->partition,
             (unsigned long long)req->rdd_id);
  }
  /* The attempt that ran the fatal code, or, unnamed (an _exit, a kill), those that ran. */
  const uint64_t *charged = req->task_key ? &req->task_key : req->running;
  size_t num_charged = req->task_key ? 1 : req->n_running;
  bool known = cluster_executor_exited(d->cluster, req->executor_id, req->incarnation, charged, num_charged, why);
  flint__executor_exited_request__free_unpacked(req, NULL);
  if (!known) common_log(LOG_INFO, "an executor this driver no longer knows: %s", why);
  return empty_reply(response);
}

/* A number from the environment, or def when unset or not a number (with a warning). */
static uint64_t env_number(const char *name, uint64_t def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end = NULL;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end || end == v || *v == '-') {
    common_log(LOG_WARN, "%s=%s is not a number: using %llu", name, v, (unsigned long long)def);
    return def;
  }
  return n;
}

/* A count of milliseconds from the environment, in nanoseconds. */
static uint64_t env_ms(const char *name, uint64_t def) { return env_number(name, def) * 1000000ull; }

static void unregister_output(void *table, uint64_t shuffle_id, uint32_t map) {
  map_output_unregister(table, shuffle_id, map);
}

/* An executor is lost: its map outputs and cached blocks are gone for every application
 * (the scheduler runs those map tasks again; cached partitions are recomputed when next
 * read). On the scheduler thread. */
static void forget_executor(void *arg, uint64_t executor) {
  driver_state *d = arg;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (app_entry *e = d->apps; e; e = e->next) {
    driver_app *app = e->app;
    if (!app) continue;
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    location_forget_executor(app->maps, executor, unregister_output, app->ctx.map_outputs);
    location_forget_executor(app->blocks, executor, NULL, NULL);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* Task statuses, heartbeats and jobs come all the time and only decode and post to the
 * scheduler, so the rpc queue's thread takes them itself, except a status update with a large
 * result to fetch from its executor. A job's call is answered when the job ends. */
static const char *const quick_methods[] = {"/flint.Driver/StatusUpdate", "/flint.Driver/Heartbeat",
                                            "/flint.Driver/RunJob", NULL};

static bool driver_quick(void *arg, const rpc_request *call, fl_buf *response, fl_status *status) {
  driver_state *d = arg;
  if (strcmp(call->method, quick_methods[1]) == 0) {
    *status = handle_heartbeat(d, call->body, response);
    return true;
  }
  if (strcmp(call->method, quick_methods[2]) == 0) {
    *status = run_job_start(d, call);
    return true;
  }
  bool declined;
  *status = cluster_status_update(d->cluster, call->body, false, &declined);
  if (declined) return false;
  if (*status == FL_OK) *status = empty_reply(response);
  return true;
}

static fl_status driver_handle(void *arg, const rpc_request *call, fl_buf *response) {
  driver_state *d = arg;
  const char *m = call->method;
  const char *prefix = "/flint.Driver/";
  if (strncmp(m, prefix, strlen(prefix)) != 0) return FL_ERR(FL_EINVAL, "unknown method %s", m);
  m += strlen(prefix);
  fl_bytes b = call->body;
  if (strcmp(m, "RegisterExecutor") == 0) return handle_register(d, b, response);
  if (strcmp(m, "Heartbeat") == 0) return handle_heartbeat(d, b, response);
  if (strcmp(m, "ExecutorExited") == 0) return handle_executor_exited(d, b, response);
  if (strcmp(m, "StatusUpdate") == 0) {
    bool declined;
    fl_status st = cluster_status_update(d->cluster, b, true, &declined);
    return st == FL_OK ? empty_reply(response) : st;
  }
  if (strcmp(m, "OpenApplication") == 0) return handle_open(d, b, response);
  if (strcmp(m, "CloseApplication") == 0) return handle_close(d, b, response);
  if (strcmp(m, "KeepAlive") == 0) return handle_keepalive(d, b, response);
  if (strcmp(m, "CancelSubmission") == 0) return handle_cancel_submission(d, b, response);
  if (strcmp(m, "HasLibrary") == 0) return handle_has_library(d, b, response);
  if (strcmp(m, "UploadLibrary") == 0) return handle_upload_library(d, b, response);
  if (strcmp(m, "BroadcastPut") == 0) return handle_broadcast_put(d, b, response);
  if (strcmp(m, "BroadcastRemove") == 0) return handle_broadcast_remove(d, b, response);
  if (strcmp(m, "RunJob") == 0) return run_job_start(d, call); /* answered at the job's end */
  if (strcmp(m, "FetchResult") == 0) return handle_fetch_result(d, b, response);
  if (strcmp(m, "CancelJobs") == 0) return handle_cancel_jobs(d, b, response);
  if (strcmp(m, "StorageInfo") == 0) return handle_storage_info(d, b, response);
  if (strcmp(m, "Unpersist") == 0) return handle_unpersist(d, b, response);
  if (strcmp(m, "Submit") == 0) return handle_submit(d, b, response);
  if (strcmp(m, "Output") == 0) return handle_output(d, b, response, call);
  if (strcmp(m, "Status") == 0) return handle_status(d, response);
  if (strcmp(m, "BarrierGather") == 0) return handle_barrier_gather(d, b, response, call);
  if (strcmp(m, "BarrierReport") == 0) return handle_barrier_report(d, b, response);
  if (strcmp(m, "BarrierCheckpoint") == 0) return handle_barrier_checkpoint(d, b, response);
  if (strcmp(m, "BarrierReports") == 0) return handle_barrier_reports(d, b, response, call);
  return FL_ERR(FL_EINVAL, "unknown method %s", call->method);
}

/* The block server: libraries, by content id. */
static fl_status serve(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                       uint64_t *total) {
  driver_state *d = arg;
  if (req->kind == DP_LIBRARY) {
    char id[40], path[PATH_MAX + 64];
    snprintf(id, sizeof id, "%016llx%016llx", (unsigned long long)req->key[0], (unsigned long long)req->key[1]);
    library_path(d, id, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return FL_ERR(FL_ENOENT, "no library %s on the driver", id);
    struct stat stbuf;
    fstat(fd, &stbuf);
    *total = (uint64_t)stbuf.st_size;
    uint64_t want = req->offset >= *total ? 0 : *total - req->offset;
    if (req->len && req->len < want) want = req->len;
    fl_status st = fl_buf_reserve(out, want);
    if (st == FL_OK && want && pread(fd, out->data + out->len, want, (off_t)req->offset) != (ssize_t)want)
      st = FL_ERR(FL_EIO, "cannot read library %s", id);
    if (st == FL_OK) out->len += want;
    close(fd);
    return st;
  }
  return FL_ERR(FL_ENOENT, "the driver serves libraries only");
}

fl_status driver_serve(const driver_config *cfg, volatile sig_atomic_t *stop) {
  driver_state d;
  memset(&d, 0, sizeof d);
  d.cfg = *cfg;
  FL_PCHECK(pthread_mutex_init(&d.lock, NULL));
  FL_PCHECK(pthread_cond_init(&d.changed, NULL));
  common_log_set_role("driver");
  common_spin_default_for_server();
  fl_status status = FL_OK;
  char host[64];
  const char *colon = cfg->listen ? strrchr(cfg->listen, ':') : NULL;
  if (!colon || colon == cfg->listen || (size_t)(colon - cfg->listen) >= sizeof host) {
    status = FL_ERR(FL_EINVAL, "--listen '%s' is not HOST:PORT", cfg->listen ? cfg->listen : "");
    goto cleanup;
  }
  memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
  host[colon - cfg->listen] = 0;

  const char *base = cfg->work_dir && *cfg->work_dir ? cfg->work_dir : getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  FL_CHECK(common_mkdirs(base));
  snprintf(d.work_dir, sizeof d.work_dir, "%s/flint-driver-XXXXXX", base);
  if (!mkdtemp(d.work_dir)) {
    d.work_dir[0] = 0;
    status = FL_ERR(FL_EIO, "cannot create a work folder in %s: %s", base, strerror(errno));
    goto cleanup;
  }
  char sub[PATH_MAX + 16];
  snprintf(sub, sizeof sub, "%s/lib", d.work_dir);
  FL_CHECK(common_mkdirs(sub));
  snprintf(sub, sizeof sub, "%s/jobs", d.work_dir);
  FL_CHECK(common_mkdirs(sub));

  FL_CHECK(task_pool_create(REPLY_THREADS, "fl-reply", &d.replies));
  FL_CHECK(scheduler_create(4, &d.sched));
  const char *quantile = getenv("FLINT_SPECULATION_QUANTILE"), *multiplier = getenv("FLINT_SPECULATION_MULTIPLIER");
  sched_speculation spec = {.enabled = env_number("FLINT_SPECULATION", 0) != 0,
                            .quantile = quantile && *quantile ? strtod(quantile, NULL) : 0.75,
                            .multiplier = multiplier && *multiplier ? strtod(multiplier, NULL) : 1.5,
                            .min_ns = env_ms("FLINT_SPECULATION_MIN_MS", 100)};
  if (!(spec.quantile > 0 && spec.quantile <= 1) || !(spec.multiplier >= 1)) {
    common_log(LOG_WARN, "FLINT_SPECULATION_QUANTILE must be in (0, 1] and FLINT_SPECULATION_MULTIPLIER "
               "at least 1: using 0.75 and 1.5");
    spec.quantile = 0.75;
    spec.multiplier = 1.5;
  }
  scheduler_set_speculation(d.sched, &spec);
  if (spec.enabled)
    common_log(LOG_INFO, "speculation on: quantile %.2f, multiplier %.2f, minimum %.0f ms", spec.quantile,
               spec.multiplier, (double)spec.min_ns / 1e6);
  /* 63 bits, never 0: executors keep 0 and all ones for none (executor/service.c) */
  d.incarnation = common_random_u64() >> 1 | 1;
  d.client_timeout_ns = env_ms("FLINT_CLIENT_TIMEOUT_MS", 30000);
  if (d.client_timeout_ns < 300000000ull) {
    common_log(LOG_WARN, "FLINT_CLIENT_TIMEOUT_MS below 300: using 300");
    d.client_timeout_ns = 300000000ull;
  }
  cluster_config cc = {.secret = cfg->secret,
                       .incarnation = d.incarnation,
                       .slots_per_core = DRIVER_SLOTS_PER_CORE,
                       .offer_node_tasks = env_number("FLINT_NODE_OFFERS", 1) != 0,
                       .executor_timeout_ns = env_ms("FLINT_EXECUTOR_TIMEOUT_MS", 10000),
                       .no_executor_timeout_ns = env_ms("FLINT_NO_EXECUTOR_TIMEOUT_MS", 30000),
                       .no_executor_warn_ns = env_ms("FLINT_NO_EXECUTOR_WARN_MS", 15000),
                       .executor_lost = forget_executor,
                       .executor_lost_arg = &d};
  FL_CHECK(cluster_backend_create(d.sched, &cc, &d.cluster));
  sched_placement placement = {.locality_wait_ns = env_ms("FLINT_LOCALITY_WAIT_MS", 3),
                               .exclude_failures = (uint32_t)env_number("FLINT_EXCLUDE_FAILURES", 3),
                               .exclude_ns = env_ms("FLINT_EXCLUDE_MS", 60000),
                               .input_at = cluster_input_at,
                               .arg = d.cluster};
  scheduler_set_placement(d.sched, &placement);
  scheduler_set_backend(d.sched, cluster_backend_base(d.cluster));
  FL_CHECK(dp_server_start(host, 0, cfg->secret, serve, &d, &d.blocks));
  /* Results of a job come back to the client in one reply (collect), hence the size limit. */
  rpc_server_config rc = {.listen = cfg->listen, .secret = cfg->secret, .handler = driver_handle,
                          .quick = driver_quick, .quick_methods = quick_methods,
                          .handler_arg = &d, .handler_threads = 128, /* barrier gathers block one each */
                          .max_message = DRIVER_MAX_MESSAGE};
  FL_CHECK(rpc_server_start(&rc, &d.server));
  snprintf(d.address, sizeof d.address, "%s:%d", host, rpc_server_port(d.server));
  common_log(LOG_INFO, "listening on %s (blocks on port %d)%s", d.address, dp_server_port(d.blocks),
             cfg->secret && *cfg->secret ? ", shared secret required" : "");
  if (cfg->port_file) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", rpc_server_port(d.server)) < 0 || fclose(f) != 0 ||
        rename(tmp, cfg->port_file) != 0) {
      status = FL_ERR(FL_EIO, "cannot write the port file %s: %s", cfg->port_file, strerror(errno));
      goto cleanup;
    }
  }
  d.lease_started = pthread_create(&d.lease_thread, NULL, lease_main, &d) == 0;
  if (!d.lease_started) common_log(LOG_ERROR, "cannot start the lease thread: silent clients' applications stay open");
  while (!*stop) usleep(20000);
  common_log(LOG_INFO, "stopping");
cleanup:
  atomic_store(&d.leases_stop, true);
  rpc_server_stop(d.server); /* every RunJob call answered: the reply pool is idle */
  if (d.lease_started) pthread_join(d.lease_thread, NULL); /* no call holds an application now */
  task_pool_destroy(d.replies);
  /* Job binaries end with their driver. */
  for (submission *s = d.submissions; s; s = s->next)
    if (!s->exited) kill(s->pid, SIGTERM);
  for (submission *s = d.submissions; s; s = s->next)
    if (s->supervisor) pthread_join(s->supervisor, NULL);
  while (d.submissions) {
    submission *s = d.submissions;
    d.submissions = s->next;
    fl_buf_free(&s->out);
    fl_buf_free(&s->err);
    common_free(s);
  }
  dp_server_stop(d.blocks);
  while (d.library_names) {
    library_name *next = d.library_names->next;
    common_free(d.library_names);
    d.library_names = next;
  }
  while (d.apps) {
    app_entry *a = d.apps;
    d.apps = a->next;
    app_free(a->app);
    common_free(a);
  }
  scheduler_destroy(d.sched); /* and the cluster backend */
  if (d.work_dir[0]) common_remove_tree(d.work_dir);
  pthread_cond_destroy(&d.changed);
  pthread_mutex_destroy(&d.lock);
  return status;
}
