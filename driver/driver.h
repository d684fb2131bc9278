/*
 * driver.h: the scheduler and its executor backends.
 *
 * Design (as Spark's): an action becomes a job. The DAG scheduler cuts the job's lineage
 * into stages at shuffle dependencies and makes one task per partition of a stage; the task
 * scheduler places tasks on the free slots that the backend offers, retries failed ones and
 * ends the job. A backend runs tasks somewhere: on threads of this process (local), or on
 * executor processes (the cluster backend, later).
 *
 * Threading: the scheduler is one event loop on its own thread, fed by typed events (job
 * submitted, task ended, stop) through a spin-then-block queue. Only that thread touches
 * jobs, stages and tasks while they run; callers block on their job's done event, and
 * backends post task ends from their threads.
 */
#ifndef FLINT_DRIVER_H
#define FLINT_DRIVER_H

#include "executor/executor.h"
#include "net/net.h"

typedef struct scheduler scheduler;
typedef struct sched_job sched_job;

typedef enum sched_event_type { EV_JOB_SUBMITTED, EV_TASK_ENDED, EV_CALL, EV_STOP } sched_event_type;

typedef struct sched_event {
  common_qnode node;
  sched_event_type type;
} sched_event;

typedef struct sched_stage sched_stage;

/* One task of a stage: a partition of the stage's rdd. Reused across attempts. */
typedef struct sched_task {
  sched_event ended;   /* posted by the backend when an attempt ends */
  task_pool_work work; /* the local backend's queue entry */
  sched_job *job;
  sched_stage *stage;
  uint32_t index; /* in the stage's tasks (for the result stage: in the job's partitions) */
  uint32_t failures;
  rdd_task rt; /* the attempt: partition, attempt number, status, accumulator updates */
  fl_buf result;
  struct sched_task *pending_next;
  /* Cluster backend: the attempt's driver-wide key and the executor it was placed on. */
  uint64_t key;
  void *placement;
  /* Cluster backend, node-shared tasks: the executor of placement's node that claimed the
   * attempt (NULL: placement, or not known yet; known once the claimer tells, after it has
   * run it a while, or reports its end), whether a claim was reported (by placement or by
   * the claimer: the claimer reports the end), and whether it was offered to any. Claims
   * arrive on the status thread, under the backend's lock. */
  void *runner;
  bool claimed;
  bool offered; /* offered to placement's node peers (kills go to them too) */
  uint64_t pending_since_ns; /* when it became pending (locality wait) */
  bool executor_lost;        /* the attempt ended because its executor was lost: a retry
                                that does not count as a failure */
  /* Speculation: a task may have a second attempt, its backup, a sched_task of its own
   * whose `original` is the task; the first success counts, the other attempt is killed. */
  bool running, done;        /* an attempt is out; the task succeeded */
  uint64_t launched_ns, duration_ns; /* the attempt's launch; the successful one's run time */
  struct sched_task *original, *backup;
  struct sched_task *next_copy; /* the job's backups, freed with it */
  bool barrier_ok;              /* barrier stages: this attempt succeeded (held until all did) */
} sched_task;

/* ---- backends -------------------------------------------------------------------------- */
typedef struct backend backend;

/* Every slot but destroy runs on the scheduler thread and never blocks. */
typedef struct backend_ops {
  const char *name;
  /* Optional (NULL: any task runs at once on a free slot). Decides where `task` runs and
   * returns true, or returns false to keep it pending (waiting for the executor that caches
   * its partition) and sets *retry_at_ns to when it should be asked again. */
  bool (*place)(backend *b, sched_task *task, uint64_t now_ns, uint64_t *retry_at_ns);
  /* Starts a task attempt. The backend posts the attempt's end with scheduler_post_task_end
   * exactly once. */
  void (*launch)(backend *b, sched_task *task);
  /* Optional: sends what launch batched, after each round of launches. more_pending: tasks
   * (or a barrier stage) still wait for slots after this round. */
  void (*flush)(backend *b, bool more_pending);
  /* Optional: an attempt ended; called before the scheduler handles the end. */
  void (*ended)(backend *b, sched_task *task);
  /* Optional: `job` failed or was cancelled; stops its running attempts early (each still
   * ends through scheduler_post_task_end). Without it they run to their end. */
  void (*kill)(backend *b, sched_job *job);
  /* Optional: stops one attempt (a backup's loser, or a task of an abandoned barrier
   * attempt): ends it with FL_ECANCELLED through scheduler_post_task_end unless its end is
   * already on the way. A loser ends now; a barrier task may end later, once its executor
   * has stopped it or is found lost (within a bounded time), so that the stage's next attempt
   * is not placed where it ran before that is known. Required for speculation. */
  void (*kill_attempt)(backend *b, sched_task *task);
  /* Optional, for speculation: up to `max` attempts, launched before `launched_before_ns`,
   * that wait in an executor's queue (by its core count not yet started) while another
   * executor has an idle core. Neither a backup nor a task that has one is returned. */
  size_t (*queued_behind)(backend *b, uint64_t launched_before_ns, sched_task **out, size_t max);
  /* Optional: `task` could not read map output (task->rt.fetch_shuffle_id, fetch_map); the
   * scheduler has marked it lost. The backend forgets where it was and checks that its
   * executor is still alive. */
  void (*fetch_failed)(backend *b, sched_task *task);
  /* Optional, for barrier stages: how many tasks can run at the same moment in the whole
   * cluster (gpu: on executors with a GPU, one each). NULL: the backend's slots. */
  uint32_t (*gang_capacity)(backend *b, bool gpu);
  /* Optional, for barrier stages: places all n tasks at once, each where it starts at once
   * (a free core; gpu: an idle GPU executor), setting their placement, or none and returns
   * false. NULL: any free slots will do. */
  bool (*gang_place)(backend *b, sched_task *tasks, uint32_t n, bool gpu);
  /* Optional, for barrier stages: why executors that were meant to take such tasks do not
   * count in gang_capacity (a GPU executor whose task found no usable device), in words
   * into buf ("" when none). */
  void (*gang_shortfall)(backend *b, bool gpu, char *buf, size_t len);
  /* Ends the backend's threads after their current tasks; blocks. Frees the backend. */
  void (*destroy)(backend *b);
} backend_ops;

struct backend {
  const backend_ops *ops;
  scheduler *sched;
  uint32_t slots; /* tasks it takes at once (running or queued at the executor) */
};

/* The in-process backend: a pool of `threads` task threads. */
FL_INTERNAL fl_status local_backend_create(scheduler *sched, uint32_t threads, backend **out);

/* ---- scheduler ------------------------------------------------------------------------- */
typedef struct scheduler_stats {
  uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, tasks_speculated;
  uint64_t task_ns; /* every attempt's run time, summed */
} scheduler_stats;

/* Speculation (Spark's settings): once `quantile` of a stage's tasks succeeded, a task
 * running longer than max(multiplier x their median run time, min_ns) gets a backup copy on
 * another executor; the first to succeed counts, the other is killed. Needs a backend with
 * place and kill_attempt (the cluster backend). */
typedef struct sched_speculation {
  bool enabled;
  double quantile, multiplier;
  uint64_t min_ns;
} sched_speculation;

/* Starts the event loop. max_attempts: tries of a task before its job fails. */
FL_INTERNAL fl_status scheduler_create(uint32_t max_attempts, scheduler **out);
/* Before any job: turns speculation on (see sched_speculation). */
FL_INTERNAL void scheduler_set_speculation(scheduler *s, const sched_speculation *spec);
/* Gives the scheduler its backend (owned from now on). */
FL_INTERNAL void scheduler_set_backend(scheduler *s, backend *b);
/* Stops the loop, destroys the backend and frees the scheduler. No job may be running. */
FL_INTERNAL void scheduler_destroy(scheduler *s);
/* How a job may be cancelled. group: jobs that scheduler_cancel ends together (the driver's
 * application); tag: one job, or a few, within the group (a client's operation id).
 * abandoned: when it becomes true while the job runs, the job is cancelled (its caller went
 * away); may be NULL. */
/* What a job's attempts did, counted as they end (every attempt, backups included). */
typedef struct sched_job_stats {
  uint64_t attempts, attempts_failed;
  uint64_t task_ns; /* the attempts' run time, summed (rdd_task.run_ns) */
  uint64_t blocks_mapped, blocks_fetched; /* rdd_task's, summed */
} sched_job_stats;

typedef struct sched_job_opts {
  uint64_t group, tag;
  sched_job_stats *stats; /* when not NULL: receives the job's when it ends */
  const atomic_bool *abandoned;
  /* Reports of barrier tasks (fl_barrier_report): on_report, when set, is called on the
   * caller's thread while the job runs and before scheduler_run_job returns, in the order
   * they came; else they wait for barrier_wait_reports and what is left at the end goes to
   * *reports_left (when not NULL; records as barrier_report_split reads them). */
  void (*on_report)(void *arg, uint64_t rdd_id, uint32_t rank, fl_bytes message);
  void *report_arg;
  rdd_batch *reports_left;
} sched_job_opts;

/* Runs a job and blocks until it ends; results[i] receives the result of parts[i]. opts may
 * be NULL (group 0, tag 0). A cancelled job fails with FL_ECANCELLED. */
FL_INTERNAL fl_status scheduler_run_job(scheduler *s, rdd *r, const uint32_t *parts,
                                        uint32_t num_parts, const rdd_action *action,
                                        const sched_job_opts *opts, fl_buf *results);
/* How an asynchronous job ends: on the scheduler thread, with the job's status and, when it
 * failed, its message. The job's stats and reports are in place by then, and the scheduler
 * holds nothing of what scheduler_submit_job was given. Must not block (it delays every job). */
typedef void (*sched_job_done_fn)(void *arg, fl_status status, const char *error);
/* As scheduler_run_job, but returns at once and calls done(done_arg, ...) when the job ends,
 * so that no thread waits on it (a RunJob call, answered from the scheduler thread). parts,
 * action and results must stay valid until then; of opts, group, tag, stats, abandoned and
 * reports_left are used (on_report must be NULL), and opts itself may go. The scheduler looks
 * at *abandoned every 20 ms. With no partitions, done runs at once on this thread. Fails
 * without calling done on a partition out of range or no memory. */
FL_INTERNAL fl_status scheduler_submit_job(scheduler *s, rdd *r, const uint32_t *parts, uint32_t num_parts,
                                           const rdd_action *action, const sched_job_opts *opts, fl_buf *results,
                                           sched_job_done_fn done, void *done_arg);
/* From any thread: cancels the running jobs of `group` (tag 0: all of them; else those with
 * that tag). Their running attempts are killed; their callers get FL_ECANCELLED. Jobs
 * submitted afterwards are not affected. Never blocks. */
FL_INTERNAL fl_status scheduler_cancel(scheduler *s, uint64_t group, uint64_t tag);
/* From backend threads: the attempt in task->rt has ended (its status says how). */
FL_INTERNAL void scheduler_post_task_end(scheduler *s, sched_task *task);
/* The ends of several attempts at once (one status update's), with one wake-up. */
FL_INTERNAL void scheduler_post_task_ends(scheduler *s, sched_task **tasks, size_t n);
FL_INTERNAL void scheduler_stats_get(scheduler *s, scheduler_stats *out);
/* From any thread: runs fn(s, arg) on the scheduler thread (backends changing their slots,
 * executors joining). Never blocks. */
FL_INTERNAL fl_status scheduler_post_call(scheduler *s, void (*fn)(scheduler *, void *), void *arg);
/* On the scheduler thread: the backend gained (delta > 0) or lost slots. */
FL_INTERNAL void scheduler_add_slots(scheduler *s, int64_t delta);

/* ---- inside the scheduler (scheduler.c, dag_scheduler.c, task_scheduler.c) ------------- */

/* A stage: tasks that each compute one partition of `rdd` through its narrow lineage. A map
 * stage writes the output of shuffle `dep`; the result stage runs the job's action. */
struct sched_stage {
  uint32_t id;
  rdd *rdd;
  const rdd_shuffle_dep *dep; /* NULL for the result stage */
  const rdd_action *action;
  rdd_action write;           /* map stages: the SHUFFLE_WRITE action */
  sched_task *tasks;          /* map stages own theirs; the result stage uses the job's */
  uint32_t num_tasks, remaining;
  uint32_t attempts;          /* map stages: times its lost output was computed again */
  sched_task *parked;         /* tasks that failed to fetch, waiting for parents to rerun */
  struct retired_tasks *retired; /* earlier attempts' task arrays (freed with the job) */
  sched_stage **parents;
  uint32_t num_parents;
  bool submitted, finished;
  /* Delay scheduling, as Spark's: the last time one of its tasks launched where its input
   * is cached. A task gives up waiting for that executor only when none has for the
   * locality wait (a busy stage keeps its locality; a stuck executor loses it). */
  uint64_t local_launch_ns;
  sched_stage *next; /* in the job's list */
  /* Barrier stages (gang-scheduled; a failed task retries the whole stage). */
  rdd *barrier;              /* the barrier dataset its tasks run, or NULL */
  uint32_t barrier_attempt;  /* the current attempt */
  uint32_t barrier_failures; /* attempts failed by a task (a lost executor does not count) */
  uint32_t barrier_running;  /* attempts of the current gang launched and not ended */
  uint32_t barrier_succeeded;
  bool barrier_aborted;      /* the current attempt failed: it reruns once every task ended */
  char *barrier_cause;       /* the failure's message (owned) */
  fl_status barrier_cause_status;
  uint32_t barrier_cause_partition;
  sched_stage *barrier_next; /* the scheduler's gangs waiting for slots */
};

struct sched_job {
  sched_event submitted;
  scheduler *sched;
  uint64_t id;
  rdd *rdd;
  const rdd_action *action;
  const uint32_t *parts;
  uint32_t num_parts;
  fl_buf *results;
  sched_task *tasks;  /* of the result stage */
  sched_stage *stages; /* every stage of the job, the result stage first */
  uint32_t next_stage_id;
  uint32_t remaining; /* result tasks not yet succeeded */
  uint32_t running;   /* attempts launched and not ended */
  sched_task *copies; /* backups made for its tasks */
  uint64_t group, tag; /* sched_job_opts */
  sched_job_stats stats;
  sched_job *active_prev, *active_next; /* the scheduler's running jobs */
  uint64_t submitted_ns; /* when the scheduler took it (how long it waits for executors) */
  atomic_bool cancelled;
  fl_status status;
  char *error;
  /* Where its end goes (sched_job_opts): the caller's, or done_fn's for an asynchronous job,
   * which the scheduler completes itself. ended_next: the scheduler's list of jobs ended
   * during the current event, handed back once the event is through. */
  sched_job_stats *stats_out;
  rdd_batch *reports_left;
  void (*on_report)(void *arg, uint64_t rdd_id, uint32_t rank, fl_bytes message);
  void *report_arg;
  const atomic_bool *abandoned;
  bool cancel_sent;
  sched_job_done_fn done_fn;
  void *done_arg;
  sched_job *ended_next;
  common_event done;
};

struct scheduler {
  common_queue events;
  pthread_t thread;
  backend *backend;
  uint32_t max_attempts;
  int64_t free_slots;
  uint64_t retry_at_ns; /* the earliest locality wait to end; 0: none */
  uint64_t resubmit_at_ns; /* when to rerun the map tasks of lost outputs; 0: none */
  sched_speculation speculation;
  uint64_t speculate_at_ns; /* the next look for slow tasks; 0: none due */
  sched_task *pending_head, *pending_tail; /* FIFO of tasks waiting for a slot */
  sched_job *active;                       /* jobs submitted and not finished */
  sched_job *ended;                        /* jobs ended during this event, to hand back */
  uint64_t abandon_check_at_ns;            /* the next look at asynchronous jobs' callers; 0: none */
  sched_stage *gangs_head;                 /* barrier stages waiting for slots, in order */
  struct barrier_table *barriers;          /* barrier stages' rendezvous (any thread) */
  atomic_uint_fast64_t next_job_id;
  _Atomic uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, tasks_speculated, task_ns;
};

/* Task scheduler: charges task `index` of stage `stage` of running job `job` with a failed
 * attempt that ended without counting as one (its executor's loss was explained later: its
 * process died of the task's code; `why` says how). The job fails once the task has failed
 * max_attempts times. Nothing happens when the job or the task is over. */
FL_INTERNAL void task_scheduler_charge(scheduler *s, uint64_t job, uint32_t stage, uint32_t index, const char *why);

/* DAG scheduler: cuts a submitted job into stages and submits those that can run. */
FL_INTERNAL void dag_scheduler_job_submitted(scheduler *s, sched_job *job);
/* A task failed to read map output: marks it lost, parks the task until its map task ran
 * again (the rerun waits DAG_RESUBMIT_DELAY_MS, so that one lost executor's fetch failures
 * are handled together). */
FL_INTERNAL void dag_scheduler_fetch_failed(scheduler *s, sched_task *task);
/* Reruns the map tasks of lost outputs that unfinished stages need (resubmit_at_ns). */
FL_INTERNAL void dag_scheduler_resubmit(scheduler *s);
/* Frees a finished job's stages (the caller's thread, after the job is handed back). */
FL_INTERNAL void dag_scheduler_free_stages(sched_job *job);
/* DAG scheduler: a task of `job` succeeded, or the job failed; finishes the job when no
 * attempt of it is still running. */
FL_INTERNAL void dag_scheduler_task_succeeded(scheduler *s, sched_task *task);
FL_INTERNAL void dag_scheduler_job_failed(scheduler *s, sched_job *job, fl_status status,
                                          const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
FL_INTERNAL void dag_scheduler_maybe_finish(scheduler *s, sched_job *job);

/* Barrier stages (task_scheduler.c): submits the gang of a barrier stage (fails the job
 * with FL_ESLOTS when the cluster can never run it), and handles the end of one of its
 * attempts. */
FL_INTERNAL void task_scheduler_submit_gang(scheduler *s, sched_stage *st);

/* ---- barrier coordinator (barrier.c) ------------------------------------------------- */
typedef struct barrier_table barrier_table;
FL_INTERNAL fl_status barrier_table_create(barrier_table **out);
FL_INTERNAL void barrier_table_destroy(barrier_table *t);
/* Scheduler thread: attempt `attempt` of stage `stage` of a job, with `world` tasks, begins
 * (the job's entry is made on first use; group and tag find its reports). */
FL_INTERNAL fl_status barrier_stage_start(barrier_table *t, uint64_t job_id, uint64_t group, uint64_t tag,
                                          uint32_t stage, uint32_t attempt, uint32_t world);
/* Scheduler thread: the current attempt failed; its gathers end with FL_ECANCELLED. */
FL_INTERNAL void barrier_stage_abort(barrier_table *t, uint64_t job_id, uint32_t stage);
/* The job failed: every gather of it ends with FL_ECANCELLED. */
FL_INTERNAL void barrier_job_abort(barrier_table *t, uint64_t job_id);
/* The job ended: frees its entry; its reports not taken go to *reports_left (may be NULL). */
FL_INTERNAL void barrier_job_close(barrier_table *t, uint64_t job_id, rdd_batch *reports_left);
/* Any thread; blocks until every rank deposited its message of `round`, deadline_ns passes
 * (FL_ETIMEDOUT), the attempt is abandoned or either cancel flag is set (FL_ECANCELLED).
 * Appends the messages in rank order to *all. */
FL_INTERNAL fl_status barrier_gather(barrier_table *t, uint64_t job_id, uint32_t stage, uint32_t attempt,
                                     uint32_t rank, uint32_t round, fl_bytes mine, uint64_t deadline_ns,
                                     const atomic_bool *cancel_a, const atomic_bool *cancel_b, rdd_batch *all);
FL_INTERNAL fl_status barrier_report(barrier_table *t, uint64_t job_id, uint64_t rdd_id, uint32_t rank,
                                     fl_bytes message);
/* A report record: (u64 dataset id, u32 rank, message). */
FL_INTERNAL bool barrier_report_split(fl_bytes rec, uint64_t *rdd_id, uint32_t *rank, fl_bytes *message);
FL_INTERNAL void barrier_take_reports(barrier_table *t, uint64_t job_id, rdd_batch *out);
/* Waits until reports of the jobs of (group, tag) are there (then moves them into *out),
 * deadline_ns passes or *cancel is set. */
FL_INTERNAL void barrier_wait_reports(barrier_table *t, uint64_t group, uint64_t tag, uint64_t deadline_ns,
                                      const atomic_bool *cancel, rdd_batch *out);
FL_INTERNAL fl_status barrier_checkpoint_put(barrier_table *t, uint64_t job_id, uint32_t stage,
                                             uint32_t attempt, uint64_t rdd_id, fl_bytes state);
FL_INTERNAL fl_status barrier_checkpoint_get(barrier_table *t, uint64_t job_id, uint64_t rdd_id, fl_buf *out);
/* The rdd_barrier_ops of a local context (impl: the scheduler's barrier_table). */
FL_INTERNAL extern const rdd_barrier_ops barrier_local_ops;

/* Task scheduler. */
FL_INTERNAL void task_scheduler_submit(scheduler *s, sched_task *tasks, uint32_t count);
FL_INTERNAL void task_scheduler_task_ended(scheduler *s, sched_task *task);
/* Launches pending tasks while slots are free. */
FL_INTERNAL void task_scheduler_offer(scheduler *s);
/* Gives slow running tasks of running stages a backup copy (speculation). */
FL_INTERNAL void task_scheduler_speculate(scheduler *s);
/* Forgets the pending tasks of a job. */
FL_INTERNAL void task_scheduler_drop_job(scheduler *s, sched_job *job);

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
  uint64_t locality_wait_ns; /* how long a task waits for the executor caching its input */
  uint32_t slots_per_core;   /* tasks launched per core at once (queued at the executor) */
  bool offer_node_tasks;     /* offer tasks over cached data to their node's other executors
                                (executor/claim_table.c); FLINT_NODE_OFFERS=0 turns it off */
  uint64_t executor_timeout_ns;    /* an executor silent this long is lost */
  /* A job that has no live executor to run on (none registered yet, or every one lost)
   * fails once it has waited this long (0: never), and the driver warns every
   * no_executor_warn_ns while one waits (0: 15 s). */
  uint64_t no_executor_timeout_ns;
  uint64_t no_executor_warn_ns;
  uint32_t exclude_failures;       /* task failures on an executor in a row that exclude it */
  uint64_t exclude_ns;             /* for how long */
  /* On the scheduler thread, when an executor is lost: the driver forgets what it held. */
  void (*executor_lost)(void *arg, uint64_t executor);
  void *executor_lost_arg;
} cluster_config;

FL_INTERNAL fl_status cluster_backend_create(scheduler *sched, const cluster_config *cfg,
                                             cluster_backend **out);
/* The backend_ops view (handed to scheduler_set_backend). */
FL_INTERNAL backend *cluster_backend_base(cluster_backend *cb);
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
