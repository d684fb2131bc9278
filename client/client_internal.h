/*
 * client_internal.h: what the files of client/ share. No other folder includes it: the flint
 * command and programs reach client/ through the public API (flint/flint.h: contexts;
 * flint/cluster.h: submit, status and the processes' entry points).
 *
 * client/ is what runs in the user's process. context.c opens a context by its master:
 * local[N] runs the scheduler in this process (local_context.c); flint://HOST:PORT and
 * local-cluster[E,C,MB] open a remote context (remote_context.c), whose scheduler is a
 * driver process, for local-cluster one that local_cluster.c starts with its executors.
 *
 * As in Spark Connect, a remote context builds lineage and sends plans: an action (job.c)
 * sends the datasets the driver has not seen yet and the libraries of their functions
 * (plan_send.c), the small broadcasts (broadcast.c), and waits for the results. Large
 * broadcasts stay here and the executors fetch them from the client's block server
 * (broadcast_server.c). Every call to a driver goes through rpc.c, which submit.c and
 * status.c (flint submit, flint status) use too.
 *
 * Threading: a remote context's calls may come from any of the user's threads at once, and
 * from the block server's and the keep-alive thread. Its `lock` guards every mutable field
 * below it in remote_context, the sub-structs included; it is never held across a call to
 * the driver (broadcast_server.c holds it while the block server starts).
 */
#ifndef FLINT_CLIENT_INTERNAL_H
#define FLINT_CLIENT_INTERNAL_H

#include <stdlib.h>
#include <sys/types.h>

#include "common/config.h"
#include "driver/driver.h"
#include "proto/flint.pb-c.h"

/* Every call to a driver but RunJob, which waits as long as its job runs. */
#define CLIENT_RPC_TIMEOUT_MS 30000

/* A library uploaded to the application: its path here and its content id there. */
typedef struct client_library {
  char *path;
  char id[33];
} client_library;

/* What the driver has of this client's lineage (plan_send.c). */
typedef struct client_plans {
  uint8_t *shipped; /* bitmap by dataset id: the driver has its plan node */
  size_t shipped_bytes;
  uint64_t *released; /* freed datasets the driver has: told with the next job */
  size_t num_released, cap_released;
  client_library *libraries;
  size_t num_libraries;
} client_plans;

/* This client's broadcasts (broadcast.c, broadcast_server.c). */
typedef struct client_broadcasts {
  /* Small broadcasts (BROADCAST_INLINE_MAX), which go with each RunJob until one succeeds
   * (`sent`); once offered, the driver may have one, so its destruction is told too. */
  struct {
    uint64_t id, len;
    bool offered, sent;
  } *inline_live;
  size_t num_inline, cap_inline, inline_bytes;
  uint64_t *inline_removed;
  size_t num_inline_removed, cap_inline_removed;
  dp_server *server; /* serves the large broadcasts; started with the first one */
  char server_address[DP_ADDRESS_MAX];
} client_broadcasts;

/* The processes of local-cluster[E,C,MB] (local_cluster.c). Touched only while the context
 * opens and closes. */
typedef struct client_local_cluster {
  pid_t *children; /* [0] the driver, then the executors; 0 once reaped */
  uint32_t num_children;
  char *dir; /* the cluster's folder, holding the children's */
} client_local_cluster;

/* A drawer's source on a driver (StageProgress): an application's stages, or those of job
 * binary submission_id when not 0. */
typedef struct client_progress_driver {
  rpc_channel *driver;
  uint64_t app_id, submission_id;
} client_progress_driver;
struct client_progress;

typedef struct remote_context {
  fl_context pub; /* first, so the rdd layer's fl_context * is this struct */
  rpc_channel *driver;
  char driver_address[256]; /* HOST:PORT */
  char *secret;
  uint64_t app_id;
  uint64_t incarnation; /* the driver process's (OpenApplicationReply): sent with app_id */
  pthread_mutex_t lock; /* everything below */
  client_plans plans;
  client_broadcasts broadcasts;
  uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, task_ns; /* fl_context_stats */
  uint64_t blocks_mapped, blocks_fetched;
  uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes;
  atomic_uint_fast64_t next_operation; /* RunJob's operation ids, from 1 */
  /* The lease: a thread says the client is alive every keepalive_ms (OpenApplicationReply),
   * so that the driver closes the application of a client that died. */
  uint32_t keepalive_ms;
  pthread_t keepalive;
  bool keepalive_started, keepalive_stop; /* under lock */
  pthread_cond_t keepalive_wake;
  client_local_cluster cluster;
  client_progress_driver progress_source;
  struct client_progress *progress; /* the console bar, when stderr is a terminal (progress.c) */
} remote_context;

/* Appends x to a growing list of ids; false when out of memory. */
static inline bool client_ids_push(uint64_t **ids, size_t *n, size_t *cap, uint64_t x) {
  uint64_t *grown = common_grow(*ids, sizeof *grown, *n, cap, 16);
  if (!grown) return false;
  *ids = grown;
  (*ids)[(*n)++] = x;
  return true;
}

/* The folder in which a context or a local cluster makes its own: `chosen` (an option) when
 * given, else FLINT_WORK_DIR, $TMPDIR or /tmp. */
static inline const char *client_work_base(const char *chosen) {
  const char *base = chosen ? chosen : config_string(CONFIG_WORK_DIR);
  if (!base || !*base) base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  return base;
}

/* ---- parameter-server tables (ps_tables.c) --------------------------------------------- */
/* The servers a local context runs in its own process for its tables: started with the first
 * table (ps_tables.c), stopped when the context closes (local_context.c). Four, so that a
 * shard's primary and each of its backups (three at most) are on servers of their own. */
#define CLIENT_PS_LOCAL_SERVERS 4
typedef struct client_ps_local {
  pthread_mutex_t lock;
  struct ps_server *servers[CLIENT_PS_LOCAL_SERVERS];
  uint32_t next_table;
  struct fl_ps_table *tables; /* the live ones, for the web UI's clocks */
  /* The web UI's live view of them (ui_config.live's "ps", as the driver's
   * placement_live_json): {"<table>": {"shards": [{"shard", "primary", "backups", "clocks":
   * {"<worker>": clock}}]}}, the clocks asked of each primary with a short timeout; malloc'd,
   * NULL when out of memory; any thread. Set by ps_tables.c with its first table, so that the
   * context asks through it without knowing ps_tables.c. */
  char *(*live_json)(struct client_ps_local *p);
} client_ps_local;
/* The local context's (local_context.c). */
FL_INTERNAL client_ps_local *client_local_context_ps(fl_context *ctx);
/* Its web UI (NULL when off), for the events of its tables. */
FL_INTERNAL struct ui *client_local_context_ui(fl_context *ctx);

/* ---- contexts (local_context.c, remote_context.c) -------------------------------------- */
/* A context for local, local[N] or local[*]: the scheduler runs in this process. */
FL_INTERNAL fl_status client_local_context_open(const char *master, const fl_options *options,
                                                fl_context **out);
/* A context for flint://HOST:PORT or local-cluster[E,C,MB] (which starts the processes). */
FL_INTERNAL fl_status client_remote_context_open(const char *master, const fl_options *options,
                                                 fl_context **out);

/* ---- calls to a driver (rpc.c) --------------------------------------------------------- */
/* Packs msg and calls `method` (reply->len is reset first). Blocks up to timeout_ms (0: no
 * limit). */
FL_INTERNAL fl_status client_rpc_call(rpc_channel *ch, const char *method, const ProtobufCMessage *msg,
                                      int64_t timeout_ms, fl_buf *reply);
/* A channel to the driver of `master` (flint://HOST:PORT), with the shared secret. */
FL_INTERNAL fl_status client_rpc_connect(const char *master, rpc_channel **ch);

/* ---- what a job sends (plan_send.c) ---------------------------------------------------- */
typedef struct client_level_list {
  Flint__Level *items;
  Flint__Level **ptrs; /* into items, made once items stops growing */
  size_t count, cap;
  const rdd **seen; /* datasets visited (a lineage is a graph: shared parents) */
  size_t num_seen, cap_seen;
} client_level_list;

/* One job's request, as far as its lineage goes. */
typedef struct client_plan {
  fl_buf plan;              /* the plan nodes the driver lacks (rdd/plan.c) */
  fl_buf action;            /* the encoded action */
  client_level_list levels; /* the storage level of each persisted dataset of the lineage */
  uint64_t *released;       /* datasets freed since the last job, taken from the context */
  size_t num_released;
  uint64_t *sent; /* the datasets whose nodes `plan` carries */
  size_t num_sent, cap_sent;
} client_plan;

/* Encodes r's lineage and the action into *out (zeroed first), uploading the libraries of
 * their functions the application lacks, and takes the context's released datasets. Call
 * client_plan_send_settle after, also on failure. Blocks on the driver's calls. */
FL_INTERNAL fl_status client_plan_send_encode(remote_context *c, rdd *r, const rdd_action *action,
                                              client_plan *out);
/* After the RunJob: when delivered, the driver has p's nodes and released datasets; else
 * the released ones go with the next job. Frees p. */
FL_INTERNAL void client_plan_send_settle(remote_context *c, client_plan *p, bool delivered);
/* Whether the driver has dataset `id`. */
FL_INTERNAL bool client_plan_send_shipped(remote_context *c, uint64_t id);
/* rdd_runtime_ops.rdd_destroyed: the driver frees a dataset it has with the next job. */
FL_INTERNAL void client_plan_send_forget(void *impl, uint64_t id);
/* Frees the context's plan state (at close). */
FL_INTERNAL void client_plan_send_free(remote_context *c);

/* ---- running a job (job.c) ------------------------------------------------------------- */
/* rdd_runtime_ops.run_job: a RunJob on the driver. Blocks until the job ends. */
FL_INTERNAL fl_status client_job_run(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                                     const rdd_action *action, fl_buf *results);
/* rdd_runtime_ops.call_service: one RunJob that the driver answers with the service's reply. */
FL_INTERNAL fl_status client_call_service(void *impl, rdd *job, const char *name, fl_bytes request, fl_buf *reply);

/* ---- broadcasts (broadcast.c, broadcast_server.c) -------------------------------------- */
/* What a RunJob tells of the small broadcasts: the ones the driver does not have yet (their
 * bytes lent by the registry for the call) and the ones destroyed since the last job. */
typedef struct client_inline_out {
  Flint__InlineBroadcast *items, **ptrs;
  dp_loan *loans;
  size_t n;
  uint64_t *removed;
  size_t num_removed;
} client_inline_out;

/* rdd_runtime_ops.broadcast_created and broadcast_destroyed. */
FL_INTERNAL fl_status client_broadcast_created(void *impl, uint64_t id, uint64_t len);
FL_INTERNAL void client_broadcast_destroyed(void *impl, uint64_t id);
/* Fills *o for a RunJob; client_broadcast_settle_inline after it, which frees *o. */
FL_INTERNAL void client_broadcast_take_inline(remote_context *c, client_inline_out *o);
FL_INTERNAL void client_broadcast_settle_inline(remote_context *c, client_inline_out *o, bool delivered);
/* Frees the context's broadcast lists (at close, after client_broadcast_server_stop). */
FL_INTERNAL void client_broadcast_free(remote_context *c);
/* Starts the block server that serves this client's broadcasts, once; copies its address
 * ("HOST:PORT") into address. */
FL_INTERNAL fl_status client_broadcast_server_address(remote_context *c, char address[DP_ADDRESS_MAX]);
/* Stops it, if it started; every loan is returned when this returns. */
FL_INTERNAL void client_broadcast_server_stop(remote_context *c);

/* ---- local-cluster (local_cluster.c) --------------------------------------------------- */
/* Starts the driver and executors of `master` (local-cluster[E,C,MB]); sets addr to the
 * driver's HOST:PORT and *executors to E. What started is in lc also on failure. */
FL_INTERNAL fl_status client_local_cluster_start(client_local_cluster *lc, const char *master, char *addr,
                                                 size_t len, uint32_t *executors);
/* Waits until the driver lists `want` executors. */
FL_INTERNAL fl_status client_local_cluster_wait(client_local_cluster *lc, rpc_channel *driver, uint32_t want);
/* Stops the processes, removes the folder and frees lc's fields. */
FL_INTERNAL void client_local_cluster_stop(client_local_cluster *lc);

/* ---- console progress bars (progress.c) ------------------------------------------------ */
/* Spark's console bar of stages[0..n), side by side, each in width / n columns:
 * "[Stage 3:=====>      (12 + 4) / 40]" ('=' for the share of tasks completed, '>' at its head;
 * no bar where the text alone fills the columns). Writes a NUL-terminated line into buf (the
 * stages that fit in cap) and returns its length. */
FL_INTERNAL size_t client_progress_render(const sched_stage_progress *stages, uint32_t n, uint32_t width, char *buf,
                                          size_t cap);
/* Where a drawer reads the active stages (scheduler_progress's contract: at most cap into
 * out, their number into *count). Called on the drawer's thread; may block a second or so. */
typedef fl_status (*client_progress_source)(void *arg, sched_stage_progress *out, uint32_t cap, uint32_t *count);
typedef struct client_progress client_progress;
/* A drawer of the bar on fd, width columns wide (0: the terminal's, TIOCGWINSZ, else
 * $COLUMNS, else 80). Its caller decides that fd is a terminal (common_progress_on_terminal).
 * The thread starts with the first action. */
FL_INTERNAL fl_status client_progress_create(int fd, uint32_t width, client_progress_source source, void *arg,
                                             client_progress **out);
/* An action starts and ends (any thread; several may run at once): the bar is drawn while
 * any runs; each end erases it. NULL p: nothing. */
FL_INTERNAL void client_progress_begin(client_progress *p);
FL_INTERNAL void client_progress_end(client_progress *p);
/* Erases the bar now, before other output to its terminal (it comes back with the next
 * poll). NULL p: nothing. */
FL_INTERNAL void client_progress_clear(client_progress *p);
/* One poll and redraw at now_ns, as the thread does every 200 ms: shows the stages first
 * seen at least 500 ms before, redrawn at most every 200 ms and only when changed (or after a
 * minute); erases the line when none is left. For tests, with a clock of their own. */
FL_INTERNAL void client_progress_tick(client_progress *p, uint64_t now_ns);
/* client_progress_source for a driver: arg is a client_progress_driver. Waits at most 2 s. */
FL_INTERNAL fl_status client_progress_ask_driver(void *arg, sched_stage_progress *out, uint32_t cap,
                                                 uint32_t *count);
/* Stops the thread, erases the bar and frees p (NULL: nothing). No action may be running. */
FL_INTERNAL void client_progress_destroy(client_progress *p);

#endif /* FLINT_CLIENT_INTERNAL_H */
