/*
 * driver.h: the driver process (`flint driver`): applications, jobs, submissions, the RPC
 * handlers, and the cluster backend that runs the scheduler's tasks on executor processes.
 * The scheduler itself is driver/scheduler/ (scheduler.h), below the rest of driver/.
 */
#ifndef FLINT_DRIVER_H
#define FLINT_DRIVER_H

#include "driver/scheduler/scheduler.h"
#include "executor/executor.h"
#include "net/net.h"

/* ---- the driver process (server.c) and its cluster backend (cluster_backend.c) --------- */
typedef struct cluster_backend cluster_backend;
typedef struct location_table location_table;

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

/* Where map outputs and cached blocks are (a small table of (id, index) -> executor). */
FL_INTERNAL fl_status location_table_create(location_table **out);
FL_INTERNAL void location_table_destroy(location_table *t);
FL_INTERNAL fl_status location_set(location_table *t, uint64_t id, uint32_t index, uint64_t executor);
/* 0 when unknown. */
FL_INTERNAL uint64_t location_get(const location_table *t, uint64_t id, uint32_t index);
FL_INTERNAL void location_forget_id(location_table *t, uint64_t id);
/* Forgets every entry on `executor`, calling gone (may be NULL) for each. */
FL_INTERNAL void location_forget_executor(location_table *t, uint64_t executor,
                                          void (*gone)(void *arg, uint64_t id, uint32_t index), void *arg);
/* Calls fn for every (index, executor) of id. */
FL_INTERNAL void location_each(const location_table *t, uint64_t id,
                               void (*fn)(void *arg, uint32_t index, uint64_t executor), void *arg);

typedef struct cluster_config {
  const char *secret;
  uint64_t incarnation;      /* the driver process's (driver_incarnation): in every message */
  uint32_t slots_per_core;   /* tasks launched per core at once (queued at the executor) */
  bool offer_node_tasks;     /* offer tasks over cached data to their node's other executors
                                (executor/claim_table.c); FLINT_NODE_OFFERS=0 turns it off */
  uint64_t executor_timeout_ns;    /* an executor silent this long is lost */
  /* A job that has no live executor to run on (none registered yet, or every one lost)
   * fails once it has waited this long (0: never), and the driver warns every
   * no_executor_warn_ns while one waits (0: 15 s). */
  uint64_t no_executor_timeout_ns;
  uint64_t no_executor_warn_ns;
  /* On the scheduler thread, when an executor is lost: the driver forgets what it held. */
  void (*executor_lost)(void *arg, uint64_t executor);
  void *executor_lost_arg;
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
                                       uint32_t data_port, uint32_t cores, uint64_t memory,
                                       int32_t gpu, const char *node, uint32_t pid, bool supervised,
                                       uint64_t *id);
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
/* The block-server address of an executor into buf; false when unknown. */
FL_INTERNAL bool cluster_executor_address(cluster_backend *cb, uint64_t executor, char *buf, size_t len);
/* Fills a StatusReply's executors (Flint__ExecutorInfo, allocated with common_calloc). */
FL_INTERNAL fl_status cluster_describe(cluster_backend *cb, void ***infos, size_t *count);
FL_INTERNAL uint32_t cluster_cores(cluster_backend *cb);

/* The largest call to or from the driver: a barrier stage's checkpoint (the largest thing a
 * call carries) and 1 MiB for the rest of its message. Libraries and plans are smaller; job
 * results come in chunks of at most DRIVER_RESULT_CHUNK. */
#define DRIVER_MAX_MESSAGE (RDD_BARRIER_CHECKPOINT_MAX + ((size_t)1 << 20))
/* A RunJob reply carries results inline up to this many bytes in all; the rest wait on the
 * driver and are read with FetchResult, this many bytes a call. */
#define DRIVER_RESULT_INLINE ((size_t)16 << 20)
#define DRIVER_RESULT_CHUNK ((size_t)32 << 20)
/* Broadcasts up to BROADCAST_INLINE_MAX bytes travel with the jobs (InlineBroadcast in
 * flint.proto), while an application's live ones total at most BROADCAST_INLINE_TOTAL; the
 * others are fetched by the executors from the client. Small parameter vectors (an L-BFGS
 * iteration's weights) so cost no call of their own. */
#define BROADCAST_INLINE_MAX ((size_t)64 << 10)
#define BROADCAST_INLINE_TOTAL ((size_t)4 << 20)

typedef struct driver_config {
  const char *listen;    /* HOST:PORT; port 0 picks one */
  const char *secret;    /* NULL: none */
  const char *work_dir;  /* NULL: $TMPDIR or /tmp */
  const char *port_file; /* when set, the chosen port is written there once listening */
} driver_config;

/* ---- clients (client.c) ---------------------------------------------------------------- */
/* A context for flint://HOST:PORT or local-cluster[E,C,MB] (which starts the processes). */
FL_INTERNAL fl_status client_context_open(const char *master, const fl_options *options,
                                          fl_context **out);
/* The shared secret from FLINT_SECRET or FLINT_SECRET_FILE into *out (NULL when none). */
FL_INTERNAL fl_status client_secret(char **out);

/* Serves as the driver until *stop becomes nonzero. Blocks. */
FL_INTERNAL fl_status driver_serve(const driver_config *cfg, volatile sig_atomic_t *stop);

#endif /* FLINT_DRIVER_H */
