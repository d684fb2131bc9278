/*
 * scheduler.h: the scheduler's interface (driver/scheduler/): its backends, jobs and the
 * barrier coordinator.
 *
 * Design (as Spark's): an action becomes a job. The DAG scheduler cuts the job's lineage
 * into stages at shuffle dependencies and makes one task per partition of a stage; the task
 * scheduler places tasks on the free slots that the backend offers, retries failed ones and
 * ends the job. A backend runs tasks somewhere: on threads of this process (local), or on
 * executor processes (the driver's cluster backend).
 *
 * Threading: the scheduler is one event loop on its own thread, fed by typed events (job
 * submitted, task ended, stop) through a spin-then-block queue. Only that thread touches
 * jobs, stages and tasks while they run; callers block on their job's done event, and
 * backends post task ends from their threads.
 */
#ifndef FLINT_DRIVER_SCHEDULER_H
#define FLINT_DRIVER_SCHEDULER_H

#include "executor/executor.h"

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
/* The scheduler's barrier coordinator (the RPC handlers of barrier tasks use it). */
FL_INTERNAL barrier_table *scheduler_barriers(scheduler *s);

#endif /* FLINT_DRIVER_SCHEDULER_H */
