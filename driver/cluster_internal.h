/*
 * cluster_internal.h: inside the cluster backend (cluster_*.c), the executor backend of the
 * driver process: tasks run on executor processes that registered over the control plane.
 *
 * Design. The task scheduler places each task on an executor; the backend launches it into
 * that executor's batch, and after each round flushes every batch as one LaunchTasks call
 * per (executor, application), carrying what the executor lacks to run it
 * (cluster_launch.c). Calls to an executor go one at a time, in order, through its sender
 * thread, which waits for each reply, so the scheduler thread never blocks on the network
 * (cluster_liveness.c). Executors report task ends in batches (cluster_task_ends.c): each end
 * is matched to its attempt by the task key, and the batch is posted to the scheduler. An
 * executor is lost when a call to it fails, when it is silent too long, or when its
 * supervisor says its process died (cluster_liveness.c, cluster_registry.c); its attempts
 * then run again elsewhere.
 *
 * The files, top to bottom (each calls only those below it): cluster_backend.c (the
 * backend_ops, its life), cluster_launch.c (batches and LaunchTasks), cluster_task_ends.c
 * (StatusUpdate), cluster_registry.c (registration, heartbeats, executor-wide calls),
 * cluster_liveness.c (senders, losses, the monitor), cluster_attempts.c (the attempts in
 * flight).
 *
 * Threading: executors, in-flight attempts and stats are under cb->lock; batches, known sets
 * and the attempts' counts per executor are the scheduler thread's.
 */
#ifndef FLINT_DRIVER_CLUSTER_INTERNAL_H
#define FLINT_DRIVER_CLUSTER_INTERNAL_H

#include "driver/driver_internal.h"

#define LAUNCH_TIMEOUT_MS 30000 /* every call to an executor (a launch, a kill, a ping) */

typedef struct outgoing {
  fl_buf body;
  const char *method;
  uint64_t *keys; /* by key (an attempt ended meanwhile may be freed): a launch's attempts,
                     failed if the call fails; a kill's (kill_on_reply), ended by its reply */
  size_t num_keys;
  bool kill_on_reply; /* a KillTasks whose attempts stay in flight until it is answered */
  rpc_pending *pending; /* sent already (by whoever queued it), for the sender to wait for */
  struct outgoing *next;
} outgoing;

typedef struct executor_ref {
  uint64_t id;
  char node[64]; /* RegisterExecutorRequest.node ("" for none) */
  uint32_t pid;
  bool supervised; /* run by `flint executor`'s supervisor, which reports its process's death */
  char rpc_address[96], data_address[96];
  char ps_address[96]; /* its parameter server, "" when it has none */
  uint32_t cores, slots;
  int32_t gpu; /* --gpu, or -1 */
  uint64_t memory;
  rpc_channel *channel;
  /* stats from heartbeats (cb->lock) */
  uint64_t cached_bytes, tasks_run, tasks_failed, last_heartbeat_ns;
  /* scheduler thread */
  uint32_t attempts; /* records of attempts placed on it, not ended (it is not freed before) */
  sched_task **batch;
  size_t batch_len, batch_cap;
  sched_task **offers; /* node peers' tasks launched this round, offered to it */
  size_t num_offers, cap_offers;
  uint64_t *known; /* (app << 40 | dataset id) whose plan nodes it has */
  size_t num_known, cap_known;
  /* the sender */
  pthread_t sender;
  pthread_cond_t sender_wake; /* with cb->lock: a call to send, or stop (one per sender, so
                                 that a launch wakes only its own) */
  outgoing *out_head, *out_tail;
  bool calling; /* the sender is in a call: what is queued now waits for it */
  bool stopping;
  /* Set once e is lost or the driver stops: the call in flight is cancelled (its reply may
   * never come from an executor that hangs) and what is queued is not sent. */
  atomic_bool abandon;
  /* loss (cb->lock) */
  bool lost;
  uint64_t peer_lost_ns; /* when an executor of its node was last lost (claim_reported) */
  bool sender_done; /* its sender thread returned */
  /* A supervised executor lost before its supervisor said why (a call to it failed first):
   * the attempts its loss ended, so that the report, when it comes, can still charge the one
   * that killed it (cluster_executor_exited). */
  struct swept_attempt {
    uint64_t key, job;
    uint32_t stage, index;
  } *swept;
  size_t num_swept;
  uint32_t queries; /* storage-info calls using its channel: it is not freed meanwhile */
  uint64_t ping_sent_ns;
  bool removed; /* the scheduler thread's: lost, and its slots gone */
  struct cluster_backend *cb;
  struct executor_ref *next;
} executor_ref;

/* The backend's record of an attempt out (sched_task.attempt), from its launch to the
 * scheduler's handling of its end (cluster_ended). Executors of a node may run each other's
 * queued attempts (executor/storage/claim_table.c): the executor that claimed an attempt (runner,
 * NULL until it tells or unknown), whether a claim was reported (by the placement or by the
 * claimer: the claimer reports the end), and whether it was offered to any. Claims arrive on
 * the status thread, under cb->lock. */
typedef struct cluster_attempt {
  uint64_t key; /* driver-wide: how executors name the attempt */
  executor_ref *placement, *runner;
  bool claimed;
  bool offered; /* offered to placement's node peers (kills go to them too) */
} cluster_attempt;

struct cluster_backend {
  backend base;
  cluster_config cfg;
  pthread_mutex_t lock;
  executor_ref *executors;
  uint64_t next_executor_id;
  sched_task **inflight; /* launched attempts whose end has not come */
  size_t num_inflight, cap_inflight;
  uint64_t next_key; /* scheduler thread */
  dp_client *fetcher; /* large task results */
  /* the monitor thread: heartbeats, liveness pings, a cluster with no live executor */
  pthread_t monitor;
  pthread_cond_t monitor_wake;
  bool stopping;
  uint64_t no_executor_since_ns; /* no live executor since then (the start, or the last
                                    loss); 0: some live */
  bool ever_registered;
  bool wait_check_posted; /* check_waiting_jobs is queued on the scheduler */
  char last_loss[256];
  /* the scheduler thread's (check_waiting_jobs) */
  uint64_t last_wait_warning_ns;
};

static inline cluster_backend *cluster_of(backend *b) { return (cluster_backend *)b; }
static inline driver_app *cluster_app_of(const sched_task *t) { return (driver_app *)sched_task_rdd(t)->ctx; }
static inline cluster_attempt *cluster_att(const sched_task *t) { return t->attempt; }

/* ---- the attempts in flight (cluster_attempts.c; cb->lock held where said) --------------- */
/* Adds attempt t to the in-flight list (takes cb->lock). */
FL_INTERNAL void cluster_inflight_add(cluster_backend *cb, sched_task *t);
/* Takes attempt `key` out of the in-flight list; NULL when it is not there (it ended).
 * cb->lock held. */
FL_INTERNAL sched_task *cluster_inflight_take(cluster_backend *cb, uint64_t key);
/* Whether attempt `key` is in flight (cb->lock held). */
FL_INTERNAL bool cluster_inflight_has(const cluster_backend *cb, uint64_t key);
/* Ends attempt `key` if it is still in flight (it never reached its executor, or its job
 * was killed). lost: its executor is gone (a retry that does not count as a failure). Takes
 * cb->lock. */
FL_INTERNAL void cluster_fail_attempt(cluster_backend *cb, uint64_t key, fl_status status, const char *msg,
                                      bool lost);
/* Whether attempt t (in flight) runs or may run on e, whose loss then ends it (cb->lock). */
FL_INTERNAL bool cluster_ran_on(const sched_task *t, const executor_ref *e);
FL_INTERNAL bool cluster_key_in(uint64_t key, const uint64_t *keys, size_t n);

/* ---- executors' calls and liveness (cluster_liveness.c) ---------------------------------- */
/* Queues a call for e's sender (cb->lock held); false when e is lost (nothing is queued). */
FL_INTERNAL bool cluster_sender_push_locked(cluster_backend *cb, executor_ref *e, outgoing *o);
/* The same, taking cb->lock. */
FL_INTERNAL bool cluster_sender_push(cluster_backend *cb, executor_ref *e, outgoing *o);
/* Queues a call that may be dropped when e is lost (a ping, a kill, a removal). */
FL_INTERNAL void cluster_sender_push_or_drop_locked(cluster_backend *cb, executor_ref *e, outgoing *o);
FL_INTERNAL void cluster_outgoing_free(outgoing *o);
/* An executor's sender thread (arg: a cluster_sender_args, which it frees). */
typedef struct cluster_sender_args {
  cluster_backend *cb;
  executor_ref *e;
} cluster_sender_args;
FL_INTERNAL void *cluster_sender_main(void *arg);
/* Sends e a call that does nothing: if e is gone, the sender's failure declares it lost.
 * cb->lock held. */
FL_INTERNAL void cluster_ping_locked(cluster_backend *cb, executor_ref *e);
/* Declares e lost (once; any thread; false when it was already). */
FL_INTERNAL bool cluster_executor_lose(cluster_backend *cb, executor_ref *e, const char *why,
                                       const uint64_t *charged, size_t num_charged);
/* The monitor thread (arg: the backend): heartbeats, pings, jobs waiting for executors. */
FL_INTERNAL void *cluster_monitor_main(void *arg);
/* Joins e's sender and frees e (its sender told to stop). */
FL_INTERNAL void cluster_executor_free(executor_ref *e);

/* ---- the registry (cluster_registry.c) ---------------------------------------------------- */
/* A live executor by id (cb->lock, or the scheduler thread); NULL when none. */
FL_INTERNAL executor_ref *cluster_find_executor(cluster_backend *cb, uint64_t id);
/* An executor by id, lost or not (kept until pruned). */
FL_INTERNAL executor_ref *cluster_find_any_executor(cluster_backend *cb, uint64_t id);

/* ---- launches (cluster_launch.c) ---------------------------------------------------------- */
FL_INTERNAL void cluster_list_push(sched_task ***list, size_t *len, size_t *cap, sched_task *t);
/* backend_ops.flush: every executor's batch goes as LaunchTasks calls. */
FL_INTERNAL void cluster_flush(backend *b, bool more_pending);

#endif /* FLINT_DRIVER_CLUSTER_INTERNAL_H */
