/*
 * driver_internal.h: inside the driver process (`flint driver`, driver/): one scheduler with
 * the cluster backend serves every application. Clients (programs using the C API with a
 * flint:// master, and job binaries that the driver runs in supervised child processes) open
 * an application, upload their libraries, register their broadcasts and send plans and
 * actions; executors register, heartbeat and report task ends.
 *
 * The files, top to bottom (each calls only those below it):
 *   server.c        starts and stops the driver: settings, scheduler, servers, threads
 *   handlers.c      the RPC methods' dispatch; executors' calls; barrier tasks' calls
 *   apps.c          applications: registry, leases, their contexts, storage calls
 *   jobs.c          RunJob (answered when its job ends), results, cancels, job records
 *   submissions.c   job binaries: started, supervised, their output, cancels
 *   libraries.c     applications' libraries: uploads, names, the block server
 *   broadcasts.c    applications' broadcasts: where the client serves them, small ones
 *   status.c        the driver's status (`flint status`)
 *   cluster_*.c     the cluster backend (cluster_internal.h): executors, launches, task ends
 *   locations.c     where map outputs and cached blocks are: the one location table
 *
 * Threads: gRPC's (the queue's thread starts jobs and takes task statuses; handlers may block
 * on anything else), the scheduler's event loop (which also answers RunJob when its job
 * ends), the block server's, the leases' and one supervisor per job binary that reads its
 * output. Applications and submissions are under driver_state.lock; each application's
 * datasets, locations and broadcasts under its own lock.
 */
#ifndef FLINT_DRIVER_INTERNAL_H
#define FLINT_DRIVER_INTERNAL_H

#include <limits.h>

#include "driver/driver.h"
#include "driver/ui/ui.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"

typedef struct cluster_backend cluster_backend;
typedef struct location_table location_table;

/* Long polls (Output, BarrierReports) wait at most this long a call. */
#define MAX_WAIT_MS 10000
/* Threads that pack large RunJob replies off the scheduler thread (jobs.c). */
#define DRIVER_REPLY_THREADS 4

/* ---- the driver's state ------------------------------------------------------------------ */

#define JOBS_KEPT 16 /* an application's last jobs that status lists */

typedef struct job_record {
  uint64_t id;
  fl_status status;
  uint32_t tasks;
  bool running;
  char error[256];
} job_record;

/* An application as the driver lists it (apps.c), running or finished. */
typedef struct app_entry {
  struct driver_app *app; /* NULL once finished */
  uint64_t id;
  char name[128];
  job_record jobs[JOBS_KEPT]; /* the last ones, a ring: job N at (N - 1) % JOBS_KEPT */
  uint64_t num_jobs;           /* jobs started, so the id of the last one */
  uint32_t users; /* calls using app now (apps_lookup); a close waits for them */
  uint32_t pid;   /* the client's process (job binaries' applications end with it) */
  uint64_t last_seen_ns; /* the client's last call (its lease: client_timeout_ns) */
  struct app_entry *next;
} app_entry;

typedef struct driver_state {
  driver_config cfg;
  ui *ui; /* the web UI and event log (ui.c); NULL when off */
  char address[96]; /* HOST:PORT of the control plane, as clients reach it */
  char work_dir[PATH_MAX];
  /* Drawn at random at the start: executors and clients send it back with every call, so
   * that nothing of an earlier driver process on this address (its executor ids, its
   * applications, its tasks) is taken for this one's. */
  uint64_t incarnation;
  /* FLINT_CLIENT_TIMEOUT_MS: an application whose client has not called for this long (it
   * keeps alive every third of it) is closed, as its client is gone. */
  uint64_t client_timeout_ns;
  pthread_t lease_thread; /* apps_lease_main */
  bool lease_started;
  atomic_bool leases_stop;
  uint64_t next_lease_check_ns; /* apps_lease_main's */
  scheduler *sched;
  cluster_backend *cluster;
  rpc_server *server;
  dp_server *blocks;
  task_pool *replies; /* packs large RunJob replies off the scheduler thread */
  pthread_mutex_t lock;
  pthread_cond_t changed; /* submissions' output, applications' users */
  app_entry *apps;
  struct library_name *library_names;
  uint64_t next_app_id, next_submission_id;
  struct submission *submissions;
  struct driver_placement *placement; /* parameter-server tables (ps_placement.c) */
  uint32_t services_running;          /* service calls on threads of their own (jobs.c), d->lock */
  bool services_stopped;              /* jobs_services_stop ran: no service starts (d->lock) */
} driver_state;

/* In the driver, a job's action is the first member of this, so that the cluster backend
 * can send the bytes the client encoded (the driver never resolves user functions). */
typedef struct driver_action {
  rdd_action action;
  fl_bytes encoded;
} driver_action;

/* An application: a client's datasets, decoded from its plans, in a context of their own. */
typedef struct driver_app {
  fl_context ctx; /* first: the datasets' ctx is this struct */
  uint64_t id;
  char name[128];
  cluster_backend *cluster;
  scheduler *sched;    /* runs the jobs of the services it calls (jobs.c) */
  atomic_bool closing; /* set as it closes: its services start no more jobs */
  pthread_mutex_t lock; /* everything below */
  rdd_plan *plan;
  char **libraries; /* content ids of its libraries */
  size_t num_libraries;
  char broadcast_address[DP_ADDRESS_MAX]; /* the client's block server; "" until known */
  location_table *maps;   /* (shuffle, map) -> executor */
  location_table *blocks; /* (dataset, partition) -> executor, for cached datasets */
  fl_buf accumulators;    /* updates of successful tasks not yet sent to the client */
  struct parked_result *parked; /* job results too large to go inline, until read */
  struct inline_broadcast *broadcasts; /* the live small broadcasts, sent with launches */
  size_t num_broadcasts, cap_broadcasts, broadcast_bytes;
} driver_app;

/* One small broadcast the driver holds for an application (BROADCAST_INLINE_MAX). */
typedef struct inline_broadcast {
  uint64_t id;
  fl_buf value;
} inline_broadcast;

/* A job result that did not fit in its RunJob reply (driver_app.parked, app->lock). */
typedef struct parked_result {
  uint64_t operation_id;
  uint32_t index;
  fl_buf data;
  struct parked_result *next;
} parked_result;

/* ---- RPC handlers' helpers ----------------------------------------------------------------- */

static inline fl_status driver_empty_reply(fl_buf *out) {
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
#define Flint__PostEventRequest_descriptor_ flint__post_event_request__descriptor
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
#define Flint__SubmissionRequest_descriptor_ flint__submission_request__descriptor
#define Flint__FetchResultRequest_descriptor_ flint__fetch_result_request__descriptor
#define Flint__CancelJobsRequest_descriptor_ flint__cancel_jobs_request__descriptor
#define Flint__BarrierGatherRequest_descriptor_ flint__barrier_gather_request__descriptor
#define Flint__BarrierReportRequest_descriptor_ flint__barrier_report_request__descriptor
#define Flint__BarrierCheckpointRequest_descriptor_ flint__barrier_checkpoint_request__descriptor
#define Flint__BarrierReportsRequest_descriptor_ flint__barrier_reports_request__descriptor
#define Flint__CreatePsTableRequest_descriptor_ flint__create_ps_table_request__descriptor
#define Flint__DropPsTableRequest_descriptor_ flint__drop_ps_table_request__descriptor
#define Flint__StageProgressRequest_descriptor_ flint__stage_progress_request__descriptor

/* ---- the RPC methods (handlers.c) -------------------------------------------------------- */
/* The methods the rpc queue's thread takes itself (rpc_server_config.quick_methods). */
FL_INTERNAL extern const char *const handlers_quick_methods[];
/* rpc_server_config.quick and .handler (arg: the driver_state). */
FL_INTERNAL bool handlers_quick(void *arg, const rpc_request *call, fl_buf *response, fl_status *status);
FL_INTERNAL fl_status handlers_dispatch(void *arg, const rpc_request *call, fl_buf *response);

/* ---- applications (apps.c) --------------------------------------------------------------- */
/* The entry of application `id`, running or finished (d->lock held), or NULL. */
FL_INTERNAL app_entry *apps_find(driver_state *d, uint64_t id);
/* The running application `id` of this driver incarnation, which a close does not free until
 * apps_unpin; renews its client's lease. */
FL_INTERNAL fl_status apps_lookup(driver_state *d, uint64_t id, uint64_t incarnation, driver_app **out);
/* Ends a call's use of app (NULL does nothing). */
FL_INTERNAL void apps_unpin(driver_state *d, driver_app *app);
FL_INTERNAL fl_status apps_handle_open(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status apps_handle_close(driver_state *d, fl_bytes body, fl_buf *response);
/* PostEvent: a client program's event (fl_context_post_event) for its application's UI. */
FL_INTERNAL fl_status apps_handle_post_event(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status apps_handle_keepalive(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status apps_handle_storage_info(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status apps_handle_unpersist(driver_state *d, fl_bytes body, fl_buf *response);
/* The leases' thread (arg: the driver_state): closes the applications of silent clients
 * until d->leases_stop. */
FL_INTERNAL void *apps_lease_main(void *arg);
/* Closes the applications of client process `pid` (a job binary that ended). */
FL_INTERNAL void apps_close_of_pid(driver_state *d, pid_t pid);
/* cluster_config.executor_lost (arg: the driver_state): every application forgets what the
 * lost executor held. Scheduler thread. */
FL_INTERNAL void apps_forget_executor(void *arg, uint64_t executor);
/* At the driver's end: frees every application. */
FL_INTERNAL void apps_free_all(driver_state *d);

/* ---- cached blocks in the web UI (ui_blocks.c) ------------------------------------------- */
/* cluster_config.blocks_reported and the Heartbeat handler's (arg: the driver_state): live
 * executor `executor` reports changes of its cached blocks (proto BlockUpdate, oldest first;
 * `dropped`: changes it could not keep for telling), posted as BlockUpdated events with their
 * datasets' names and partition counts from the applications' plans. Blocks of applications
 * this driver does not know are ignored. Rpc threads; takes d->lock and an application's
 * lock briefly. */
FL_INTERNAL void apps_blocks_reported(void *arg, uint64_t executor, Flint__BlockUpdate *const *blocks, size_t n,
                                      uint64_t dropped);

/* ---- parameter-server tables (ps_placement.c) ---------------------------------------------- */
typedef struct driver_placement driver_placement;
/* At the driver's start and end: stop after the rpc server (which calls the handlers) and
 * before the scheduler (whose backend the recovery thread asks); free after the scheduler
 * (whose thread reports losses until then). */
FL_INTERNAL fl_status placement_start(driver_state *d);
FL_INTERNAL void placement_stop(driver_state *d);
FL_INTERNAL void placement_free(driver_state *d);
/* CreatePsTable and DropPsTable for application `app` (handlers.c looked it up): rpc handler
 * threads; block on the executors' servers. create packs its reply into *response. */
FL_INTERNAL fl_status placement_create(driver_state *d, uint64_t app, const Flint__CreatePsTableRequest *req,
                                       fl_buf *response);
FL_INTERNAL fl_status placement_drop(driver_state *d, uint64_t app, uint32_t table);
/* An application closed: its tables go. Blocks on the servers. */
FL_INTERNAL void placement_app_closed(driver_state *d, uint64_t app);
/* An executor was lost (the scheduler thread): queued for the recovery thread. Never blocks. */
FL_INTERNAL void placement_executor_lost(driver_state *d, uint64_t executor);
/* The web UI's live view of application `app`'s tables (ui_config.live's "ps"): {"<table>":
 * {"shards": [{"shard", "primary", "backups", "clocks": {"<worker>": clock}}]}}, each shard's
 * clocks asked of its primary with a short timeout (none where it does not answer in time).
 * NULL when the tables are busy (a recovery holds them) or memory is short. Malloc'd. */
FL_INTERNAL char *placement_live_json(driver_state *d, uint64_t app);

/* ---- jobs (jobs.c) ----------------------------------------------------------------------- */
/* Starts a RunJob call (the rpc queue's thread): FL_OK when the call was taken for a reply at
 * its job's end, else the failure to answer at once. Never blocks. */
FL_INTERNAL fl_status jobs_run_start(driver_state *d, const rpc_request *call);
FL_INTERNAL fl_status jobs_handle_fetch_result(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status jobs_handle_cancel(driver_state *d, fl_bytes body, fl_buf *response);
/* At the driver's end, before the applications go: every application closes to its services
 * (their jobs are cancelled) and this waits for the service calls to end. */
FL_INTERNAL void jobs_services_stop(driver_state *d);

/* ---- job binaries (submissions.c) -------------------------------------------------------- */
FL_INTERNAL fl_status submissions_handle_submit(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status submissions_handle_cancel(driver_state *d, fl_bytes body, fl_buf *response);
/* SubmissionStatus: a job binary's state; KillSubmission: ends it (blocks up to ~10 s). */
FL_INTERNAL fl_status submissions_handle_status(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status submissions_handle_kill(driver_state *d, fl_bytes body, fl_buf *response,
                                              const rpc_request *call);
FL_INTERNAL fl_status submissions_handle_output(driver_state *d, fl_bytes body, fl_buf *response,
                                                const rpc_request *call);
/* The job binaries kept (d->lock held), and each one's state into infos[i] (pointed to by
 * ptrs[i]; both hold submissions_count), oldest first; infos point into the driver's records
 * until d->lock is released. */
FL_INTERNAL size_t submissions_count(driver_state *d);
FL_INTERNAL void submissions_describe(driver_state *d, Flint__SubmissionInfo *infos, Flint__SubmissionInfo **ptrs);
/* The process of running job binary `id` (d->lock held); 0 when unknown or ended. */
FL_INTERNAL pid_t submissions_pid(driver_state *d, uint64_t id);
/* At the driver's end: job binaries end with it (SIGTERM), and their records go. */
FL_INTERNAL void submissions_stop(driver_state *d);

/* ---- libraries (libraries.c) ------------------------------------------------------------- */
FL_INTERNAL fl_status libraries_handle_has(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status libraries_handle_upload(driver_state *d, fl_bytes body, fl_buf *response);
/* The name of the library an executor stores as `file` (content id + ".so"), into buf; the
 * file itself when the driver knows no name. */
FL_INTERNAL void libraries_name_of(driver_state *d, const char *file, char *buf, size_t len);
/* The block server's handler (arg: the driver_state): libraries, by content id. */
FL_INTERNAL fl_status libraries_serve(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                                      uint64_t *total);
/* At the driver's end: forgets the libraries' names. */
FL_INTERNAL void libraries_free_names(driver_state *d);

/* ---- broadcasts (broadcasts.c) ----------------------------------------------------------- */
FL_INTERNAL fl_status broadcasts_handle_put(driver_state *d, fl_bytes body, fl_buf *response);
FL_INTERNAL fl_status broadcasts_handle_remove(driver_state *d, fl_bytes body, fl_buf *response);
/* The small broadcasts that a RunJob carries, and the ones its client destroyed (app->lock
 * held). Both are idempotent: a client sends again what a failed call carried. */
FL_INTERNAL fl_status broadcasts_take(driver_app *app, const Flint__RunJobRequest *req);

/* ---- status (status.c) ------------------------------------------------------------------- */
/* The StatusReply: executors, applications and their last jobs. */
FL_INTERNAL fl_status status_reply(driver_state *d, fl_buf *response);

/* ---- the cluster backend (cluster_*.c) --------------------------------------------------- */
typedef struct cluster_config {
  const char *secret;
  uint64_t incarnation;    /* the driver process's (driver_state.incarnation): in every message */
  uint32_t slots_per_core; /* tasks launched per core at once (queued at the executor) */
  bool offer_node_tasks;   /* offer tasks over cached data to their node's other executors
                              (executor/storage/claim_table.c); FLINT_NODE_OFFERS=0 turns it off */
  uint64_t executor_timeout_ns; /* an executor silent this long is lost */
  /* A job that has no live executor to run on (none registered yet, or every one lost)
   * fails once it has waited this long (0: never), and the driver warns every
   * no_executor_warn_ns while one waits (0: 15 s). */
  uint64_t no_executor_timeout_ns;
  uint64_t no_executor_warn_ns;
  /* On the scheduler thread, when an executor is lost: the driver forgets what it held. */
  void (*executor_lost)(void *arg, uint64_t executor);
  void *executor_lost_arg;
  /* On an rpc thread, with the status update of a live executor: the changes of its cached
   * blocks it reports (apps_blocks_reported; arg: executor_lost_arg). May be NULL. */
  void (*blocks_reported)(void *arg, uint64_t executor, Flint__BlockUpdate *const *blocks, size_t n,
                          uint64_t dropped);
  ui *ui; /* executors added and lost are posted to it (may be NULL) */
} cluster_config;

FL_INTERNAL fl_status cluster_backend_create(scheduler *sched, const cluster_config *cfg,
                                             cluster_backend **out);
/* The backend_ops view (handed to scheduler_set_backend). */
FL_INTERNAL backend *cluster_backend_base(cluster_backend *cb);
/* sched_placement.input_at (arg: the cluster backend): the live executor that caches the
 * partition the task reads first, as the application's block locations say. */
FL_INTERNAL uint64_t cluster_input_at(void *arg, const sched_task *task);
/* RPC handlers' entry points; any thread, may block briefly. */
/* `node` and `pid` (either may be empty or 0) let executors of one node share cached blocks. */
FL_INTERNAL fl_status cluster_register(cluster_backend *cb, const char *host, uint32_t rpc_port,
                                       uint32_t data_port, uint32_t ps_port, uint32_t cores, uint64_t memory,
                                       int32_t gpu, const char *node, uint32_t pid, bool supervised,
                                       uint64_t *id);
/* The parameter servers of the live executors, oldest executor first: fills out[0, max) and
 * returns how many there are. Any thread. */
typedef struct cluster_ps_server {
  uint64_t executor;
  char address[96];
} cluster_ps_server;
FL_INTERNAL size_t cluster_ps_servers(cluster_backend *cb, cluster_ps_server *out, size_t max);
/* The supervisor of executor `executor` says its process died (`why`, in words): the
 * executor is lost, and the tasks of the attempts charged[0, num_charged) (the one that ran
 * the code that killed it, or those that were running) are charged with a failure. False
 * when the executor is not one of this driver's. */
FL_INTERNAL bool cluster_executor_exited(cluster_backend *cb, uint64_t executor, uint64_t incarnation,
                                         const uint64_t *charged, size_t num_charged, const char *why);
/* False when the executor is unknown, or registered with another incarnation of the driver
 * (it should drop its state and register again). */
FL_INTERNAL bool cluster_heartbeat(cluster_backend *cb, uint64_t executor, uint64_t incarnation,
                                   uint64_t cached_bytes, uint64_t tasks_run, uint64_t tasks_failed);
/* A StatusUpdateRequest's body: the ends of task attempts. With may_block false (the rpc
 * queue's thread) an update with a result to fetch from its executor (over 1 MiB) is left
 * alone and *declined set. */
FL_INTERNAL fl_status cluster_status_update(cluster_backend *cb, fl_bytes body, bool may_block, bool *declined);
/* Tells every executor to drop blocks of an application (asynchronously). */
FL_INTERNAL void cluster_remove(cluster_backend *cb, uint64_t app, const uint64_t *rdd_ids,
                                size_t num_rdds, const uint64_t *shuffle_ids, size_t num_shuffles,
                                bool whole_application);
/* Tells every executor to drop its copy of a broadcast (asynchronously). */
FL_INTERNAL void cluster_remove_broadcast(cluster_backend *cb, uint64_t app, uint64_t broadcast_id);
/* Adds up what the live executors hold of dataset rdd_id (blocks, memory and disk bytes),
 * asking each; rdd_id 0: of the whole application, and *evictions (when not NULL) gets its
 * blocks they evicted. False when none answered. */
FL_INTERNAL bool cluster_storage_info(cluster_backend *cb, uint64_t app, uint64_t rdd_id, fl_storage_info *out,
                                      uint64_t *evictions);
/* Fills a StatusReply's executors (Flint__ExecutorInfo, allocated with common_calloc). */
FL_INTERNAL fl_status cluster_describe(cluster_backend *cb, void ***infos, size_t *count);

/* ---- the web UI's live figures (ui_live.c): ui_config.live, arg the driver_state --------- */
FL_INTERNAL char *driver_ui_live(void *arg, const char *what, uint64_t app);
/* The cores of the live executors. */
FL_INTERNAL uint32_t cluster_cores(cluster_backend *cb);

/* ---- block locations (locations.c) ------------------------------------------------------- */
/* Where map outputs and cached blocks are: a small table of (id, index) -> executor, one for
 * each kind per application (driver_app.maps, .blocks). Not thread-safe: callers hold
 * app->lock, but for the functions that take a driver_app and say they lock. */
FL_INTERNAL fl_status locations_create(location_table **out);
FL_INTERNAL void locations_destroy(location_table *t);
FL_INTERNAL fl_status locations_set(location_table *t, uint64_t id, uint32_t index, uint64_t executor);
/* 0 when unknown. */
FL_INTERNAL uint64_t locations_get(const location_table *t, uint64_t id, uint32_t index);
FL_INTERNAL void locations_forget_id(location_table *t, uint64_t id);
/* Calls fn for every (index, executor) of id. */
FL_INTERNAL void locations_each(const location_table *t, uint64_t id,
                                void (*fn)(void *arg, uint32_t index, uint64_t executor), void *arg);
/* The executor that caches the partition a task of `r` over `partition` reads first (a
 * persisted dataset on r's one-to-one narrow lineage), or 0. Locks app->lock. */
FL_INTERNAL uint64_t locations_input(driver_app *app, const rdd *r, uint32_t partition);
/* The executor that wrote map output `map` of shuffle `shuffle_id`, or 0. Locks app->lock. */
FL_INTERNAL uint64_t locations_map_output(driver_app *app, uint64_t shuffle_id, uint32_t map);
/* A task of `r` (writing shuffle `dep`, or none) succeeded on `executor` over `partition`:
 * the map output and the partitions of the persisted datasets on its way are there now.
 * app->lock held. */
FL_INTERNAL void locations_task_succeeded(driver_app *app, const rdd_shuffle_dep *dep, const rdd *r,
                                          uint32_t partition, uint64_t executor);
/* Executor `executor` is lost: its map outputs are unregistered (the scheduler runs those
 * map tasks again) and its cached blocks forgotten (recomputed when next read). Locks
 * app->lock. */
FL_INTERNAL void locations_forget_executor(driver_app *app, uint64_t executor);

#endif /* FLINT_DRIVER_INTERNAL_H */
