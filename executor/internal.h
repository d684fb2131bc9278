/*
 * internal.h: what the files of the executor process (`flint executor`) share; no other
 * folder includes it (they use executor.h). The process registers with the driver, runs the
 * tasks the driver launches on a pool of task threads, keeps cached blocks and shuffle output
 * in one block manager (executor/storage/), serves them to peers from a block server, and
 * reports task ends in batches.
 *
 * Design. Each application has its own context here (struct exec_app): the datasets decoded
 * from the plan parts the driver sends (rdd/plan.c), a shared-variable registry that fetches
 * broadcasts on first use from the client that made them (its address comes with launches),
 * and a cache view onto the executor's one block manager in which the application's dataset
 * and shuffle ids are prefixed by its id, so that applications never see each other's blocks.
 * Libraries are content-addressed and kept for the executor's life: fetched from the driver
 * once, stored in the work dir, dlopen()ed once.
 *
 * Threads: gRPC's (the control-plane server and its handlers, which decode launches), the
 * block server's and the fetch client's event loops, the task threads, one thread sending
 * status updates (every ended task waiting at that moment goes in one call) and one sending
 * heartbeats. Task threads never touch sockets: fetches are handed to the fetch client's loop.
 * svc->lock guards the applications, libraries, running tasks, status queue and results; an
 * application's lock its plan and location tables.
 *
 * Files, from the top (a file calls only the files below it):
 *   service.c      the process: start, serve, stop (executor_serve)
 *   handlers.c     the control plane's calls and the block server's requests (exec_handle_*)
 *   driver_link.c  registration, heartbeats, a lost driver forgotten (exec_driver_*)
 *   tasks.c        task attempts on the pool, status updates (exec_task_*)
 *   applications.c per-application contexts, their cache view, libraries (exec_app_*)
 *   barrier.c      barrier tasks' calls to the driver's coordinator (exec_barrier_ops)
 *   block_reports.c the changes of cached blocks told to the driver (exec_block_reports_*)
 */
#ifndef FLINT_EXECUTOR_INTERNAL_H
#define FLINT_EXECUTOR_INTERNAL_H

#include <limits.h>

#include "executor/executor.h"
#include "net/net.h"
#include "ps/ps.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"

#define RPC_TIMEOUT_MS 30000
/* Whole objects (libraries, broadcasts) come in a small first request that tells their
 * length, then in large ranges. */
#define FETCH_FIRST (1u << 20)
#define FETCH_CHUNK (64u << 20)
#define FETCH_MAX (8ull << 30)
/* Applications' ids are put above the ids of their datasets and shuffles in the shared block
 * manager: 2^40 datasets per application, 2^24 applications per executor life. */
#define APP_SHIFT 40
/* exec_service.incarnation between one driver and the next (drivers draw 63-bit ones). */
#define INCARNATION_NONE UINT64_MAX

typedef struct exec_service exec_service;
typedef struct exec_block_reports exec_block_reports;

/* A library this executor has loaded. */
typedef struct exec_library {
  char id[64];
  void *handle;
  struct exec_library *next;
} exec_library;

/* Where another executor keeps a shuffle's map output or a dataset's cached partition, as
 * launches tell: (id, index) is (shuffle, map) or (dataset, partition). */
typedef struct peer_location {
  uint64_t id;
  uint32_t index;
  uint32_t pid; /* a cached partition's holder's process, when it is on this node; else 0 */
  char address[64];
} peer_location;

typedef struct location_table {
  peer_location *items;
  size_t n, cap;
} location_table;

/* A large task result waiting for the driver to fetch it. */
typedef struct result_block {
  uint64_t task_key;
  fl_buf bytes;
  struct result_block *next;
} result_block;

typedef struct exec_app {
  fl_context ctx; /* first: the datasets' ctx is this struct */
  exec_service *svc;
  uint64_t id;
  rdd_plan *plan;
  pthread_mutex_t lock; /* plan, locations */
  location_table maps; /* (shuffle, map) */
  char broadcast_address[DP_ADDRESS_MAX]; /* the client's block server; "" until known */
  location_table blocks; /* (dataset, partition) */
  char work_dir[PATH_MAX + 32];
  atomic_int tasks_running; /* holds, changed under svc->lock: queued and running tasks, and a
                               Remove handler using it */
  bool removed;             /* the driver removed it while tasks were queued: it goes with the last */
  uint64_t incarnation;     /* of the driver that launched it: its tasks' ends go to that one only */
  struct exec_app *next;
} exec_app;

/* One task attempt. */
typedef struct exec_task {
  task_pool_work work;
  exec_app *app;
  rdd *rdd; /* retained */
  rdd_action action;
  bool owns_action;
  uint64_t key;
  claim_table *claims; /* where it is claimed: this executor's table, or an offer's owner's */
  struct peer_claims *peer; /* an offer's: the owner's table entry, referenced until freed */
  bool offer;          /* another executor's task on this node (TaskDescription.offer) */
  bool claimed;        /* its owner found it claimed by a peer: TaskStatus.claimed */
  uint64_t claimed_ns; /* an offer: when this executor claimed it (0: not yet) */
  bool claim_told;     /* an offer: the driver was told that this executor runs it */
  rdd_task rt;
  atomic_bool cancelled;
  fl_buf result;
  struct exec_task *next; /* running list, then the status queue */
} exec_task;

struct exec_service {
  executor_config cfg;
  uint64_t id;
  /* The driver's incarnation (RegisterExecutorReply), which every call between the two
   * carries; 0 while registering, when the first call from a driver (a launch may come before
   * the registration's reply) sets it. Applications of one incarnation are all gone before
   * another is taken (driver_forget), so their ids never meet here. */
  _Atomic uint64_t incarnation; /* INCARNATION_NONE between drivers: every call is refused */
  uint64_t driver_timeout_ns; /* FLINT_DRIVER_TIMEOUT_MS: silence after which the driver is lost */
  /* A data-plane request's deadline (FLINT_FETCH_TIMEOUT_MS, default 60 s): how long a task
   * waits on a peer that stopped answering (a cut link) before it reports a fetch failure. */
  int64_t fetch_timeout_ms;
  atomic_bool fatal;          /* the process must end (executor_serve returns fatal_error) */
  bool supervised;            /* a supervised child (report.c): its supervisor reports its death */
  char fatal_error[256];
  uint32_t heartbeat_ms;
  char driver_data[96]; /* the driver's block server, once driver_known */
  /* Set once a registration's reply is in: a launch may come before it (the driver launches
   * as soon as it has registered the executor), and its library fetch then waits for it. */
  atomic_bool driver_known;
  char node[SHARED_NODE_MAX]; /* shared_block_node */
  uint32_t pid;               /* this process's, read once: a syscall costs microseconds in a VM */
  claim_table *claims;        /* this executor's: its tasks are claimed there */
  struct peer_claims {        /* node peers' tables, mapped on first use (under lock) */
    uint32_t pid;
    uint64_t executor;        /* the owner's id: a reused pid is another executor */
    claim_table *table;
    uint32_t refs;            /* queued or running offers of it; unmapped at 0 when room is needed */
  } peers[16];
  size_t num_peers;
  rpc_channel *driver;
  rpc_server *server;
  dp_server *blocks_server;
  ps_server *ps;      /* hosts the parameter-server shards the driver places here (ps/ps.h) */
  dp_client *fetcher;
  block_manager *blocks;
  exec_block_reports *block_reports; /* its blocks' changes, for the driver (block_reports.c) */
  task_pool *pool;
  char work_dir[PATH_MAX];
  bool own_work_dir;

  pthread_mutex_t lock; /* apps, libraries, running, the status queue */
  pthread_cond_t wake;      /* the status thread's: something to send, or stop */
  pthread_cond_t stop_wake; /* the heartbeat thread's: stop (task ends must not wake it) */
  exec_app *apps;
  exec_library *libraries;
  exec_task *running;
  exec_task *done_head, *done_tail;
  result_block *results;
  bool stopping;
  /* Set on stop, so that calls to the driver give up (it may never answer): heartbeats and
   * barrier calls at once; the last statuses after STATUS_STOP_GRACE_MS. */
  atomic_bool abandon, abandon_statuses;
  atomic_uint_fast64_t tasks_run, tasks_failed;
  atomic_bool none_pending; /* the last launch's none_pending */
  /* Own tasks queued and not started: what holds statuses back. Offers do not count: they
   * may never run here, and the driver must hear of the own tasks' ends to send more. */
  atomic_size_t own_queued;
  pthread_t status_thread, heartbeat_thread;
  /* Fault injection (tests and benchmarks only; see settings_read). */
  uint64_t fault_exit_after; /* tasks after which the process dies; 0: never */
  double fault_slowdown;     /* every task takes this many times as long; <= 1: as it is */
};

/* A call to the driver that gives up once *abandon is set (the executor stopping), so that a
 * driver that does not answer (stopped, cut off) cannot hold the stop for the call's deadline. */
static inline fl_status exec_driver_call(exec_service *svc, const char *method, fl_bytes body,
                                         int64_t timeout_ms, const atomic_bool *abandon, fl_buf *reply) {
  rpc_pending *p;
  fl_status st = rpc_call_begin(svc->driver, method, body, timeout_ms, &p);
  return st == FL_OK ? rpc_call_end_unless(p, abandon, reply) : st;
}

/* ---- applications.c -------------------------------------------------------------------- */

/* Application `app_id`'s context, made on its first launch (its work folder, plan, shared
 * variables, cache view). Caller holds svc->lock. */
FL_INTERNAL fl_status exec_app_get_or_create(exec_service *svc, uint64_t app_id, exec_app **out);
/* Drops one hold on `a`; svc->lock held. Returns the application to destroy
 * (exec_app_remove_all, without the lock), unlinked, or NULL. */
FL_INTERNAL exec_app *exec_app_release_locked(exec_service *svc, exec_app *a);
/* Drops an application's blocks and shuffle files from the block manager, and frees it. */
FL_INTERNAL void exec_app_remove_all(exec_service *svc, exec_app *a);
/* Frees an application's context and deletes its work folder (its blocks stay). NULL does
 * nothing. */
FL_INTERNAL void exec_app_destroy(exec_app *a);
/* Takes in what a launch says of application `app` (plan parts, released datasets, broadcasts,
 * storage levels, where map outputs and cached blocks are); app->lock held. */
FL_INTERNAL fl_status exec_app_launch_update(exec_app *app, const Flint__LaunchTasksRequest *req);
/* Forgets where the blocks of datasets rdd_ids[0, n) and the outputs of shuffles
 * shuffle_ids[0, m) are (a->lock held). */
FL_INTERNAL void exec_app_forget_locations(exec_app *app, const uint64_t *rdd_ids, size_t n,
                                           const uint64_t *shuffle_ids, size_t m);
/* The application's cache view (its rdd_cache_ops) for the handlers: drop a dataset's blocks,
 * describe them, drop a shuffle's output. */
FL_INTERNAL void exec_app_remove_rdd(void *impl, uint64_t rdd_id);
FL_INTERNAL void exec_app_info(void *impl, uint64_t rdd_id, fl_storage_info *out);
FL_INTERNAL void exec_app_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps);
/* Around a launch decoded on the rpc queue's thread: until exec_app_quick_end, a library not
 * loaded yet is not fetched (its load fails), and exec_app_quick_end says whether one was
 * wanted (the launch then goes to a handler thread). Per thread. */
FL_INTERNAL void exec_app_quick_begin(void);
FL_INTERNAL bool exec_app_quick_end(void);

/* ---- barrier.c ------------------------------------------------------------------------- */

/* The rdd_barrier_ops of every application's context (impl: the exec_service). */
FL_INTERNAL extern const rdd_barrier_ops exec_barrier_ops;

/* ---- tasks.c --------------------------------------------------------------------------- */

/* Frees a task that is on no list (never queued, or ended and reported). */
FL_INTERNAL void exec_task_free(exec_task *t);
/* Fills task `t` (zeroed) from description `d` of launch `req` of application `app`; app->lock
 * held. On an error, `t` is left for exec_task_free. */
FL_INTERNAL fl_status exec_task_decode(exec_app *app, const Flint__LaunchTasksRequest *req,
                                       const Flint__TaskDescription *d, exec_task *t);
/* Queues the decoded tasks[0, n) of launch `req` (room for 2n) and takes them over: each runs on
 * a pool thread, which claims it, runs it and queues its end for the status thread. */
FL_INTERNAL void exec_task_queue(exec_app *app, const Flint__LaunchTasksRequest *req, exec_task **tasks);
/* The status thread: reports ended tasks until the executor stops. */
FL_INTERNAL void *exec_task_status_main(void *arg);

/* ---- driver_link.c --------------------------------------------------------------------- */

/* FL_OK when a call of driver incarnation `incarnation` is from this executor's driver;
 * `what` names the call in the error. Any thread. */
FL_INTERNAL fl_status exec_driver_check_incarnation(exec_service *svc, uint64_t incarnation, const char *what);
/* Registers with the driver, waiting up to timeout_ms for its answer. */
FL_INTERNAL fl_status exec_driver_register(exec_service *svc, int64_t timeout_ms);
/* The heartbeat thread: heartbeats, and a lost driver forgotten, until the executor stops. */
FL_INTERNAL void *exec_driver_heartbeat_main(void *arg);

/* ---- block_reports.c ------------------------------------------------------------------- */

/* Changes of cached blocks held for telling the driver (beyond, the oldest are dropped and
 * counted), and at most this many in one message. */
#define EXEC_BLOCK_UPDATES_MAX 4096
#define EXEC_BLOCK_UPDATES_PER_CALL 512

FL_INTERNAL fl_status exec_block_reports_create(exec_block_reports **out);
FL_INTERNAL void exec_block_reports_destroy(exec_block_reports *r); /* NULL: nothing */
/* The block manager's listener (arg: the exec_block_reports): queues one change. Never blocks
 * beyond a short lock. */
FL_INTERNAL void exec_block_reports_changed(void *arg, rdd_block_key key, fl_storage_level level, uint64_t memory,
                                            uint64_t disk);
/* Forgets every queued change (registering with a driver: they were the earlier one's). */
FL_INTERNAL void exec_block_reports_clear(exec_block_reports *r);
/* For a message about to be sent (status update or heartbeat): true when it carries changes,
 * pointed to by *blocks (*n of them, owned by `r`) with the count of dropped ones; the caller
 * then calls exec_block_reports_end once the call is answered (told: the driver took it), and
 * no other message carries changes until then. False: none to tell, or the other thread's
 * message is carrying them. */
FL_INTERNAL bool exec_block_reports_begin(exec_block_reports *r, Flint__BlockUpdate ***blocks, size_t *n,
                                          uint64_t *dropped);
FL_INTERNAL void exec_block_reports_end(exec_block_reports *r, bool told);

/* ---- handlers.c ------------------------------------------------------------------------ */

/* The control-plane server's handler and quick handler (rpc_server_config), and the methods
 * the quick one answers. */
FL_INTERNAL fl_status exec_handle_rpc(void *arg, const rpc_request *req, fl_buf *response);
FL_INTERNAL bool exec_handle_quick(void *arg, const rpc_request *req, fl_buf *response, fl_status *status);
FL_INTERNAL extern const char *const exec_handle_quick_methods[];
/* The block server's handler (dp_server_start): cached blocks, shuffle output, large task
 * results. */
FL_INTERNAL fl_status exec_handle_block(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan, uint64_t *total);

#endif /* FLINT_EXECUTOR_INTERNAL_H */
