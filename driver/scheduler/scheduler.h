/*
 * scheduler.h: the scheduler's interface (driver/scheduler/): jobs, the backends that run
 * their tasks, the executors that tasks are placed on, and the barrier coordinator. The
 * driver process (driver/) and local contexts use it; it uses nothing of theirs.
 *
 * Design (as Spark's): an action becomes a job. The DAG scheduler cuts the job's lineage
 * into stages at shuffle dependencies and makes one task per partition of a stage; the task
 * scheduler places tasks on free slots (where their input is cached, waiting a little for
 * it: delay scheduling), retries failed ones, backs up slow ones (speculation),
 * gang-schedules barrier stages and ends the job. A backend runs the attempts where the task
 * scheduler placed them: on threads of this process (local), or on executor processes that it
 * adds to the scheduler (the driver's cluster backend).
 *
 * Threading: the scheduler is one event loop on its own thread, fed by typed events (job
 * submitted, task ended, call, stop) through a spin-then-block queue. Only that thread
 * touches jobs, stages, tasks and executors while they run; callers block on their job's
 * done event, and backends post task ends from their threads.
 */
#ifndef FLINT_DRIVER_SCHEDULER_H
#define FLINT_DRIVER_SCHEDULER_H

#include "rdd/rdd.h"

typedef struct scheduler scheduler;
typedef struct sched_job sched_job;
typedef struct sched_stage sched_stage;

typedef enum sched_event_type { EV_JOB_SUBMITTED, EV_TASK_ENDED, EV_CALL, EV_STOP } sched_event_type;

typedef struct sched_event {
  common_qnode node;
  sched_event_type type;
} sched_event;

/* How an attempt was placed: where its input is cached, on another executor of that one's
 * node, or anywhere (Spark's locality levels). */
typedef enum sched_locality { SCHED_PROCESS_LOCAL, SCHED_NODE_LOCAL, SCHED_ANY } sched_locality;

/* One task of a stage: a partition of the stage's dataset. Reused across attempts. Backends
 * read what an attempt runs through the sched_task_* functions below, and fill rt (status,
 * error, figures, accumulator updates) and result when it ends. */
typedef struct sched_task {
  sched_event ended; /* posted by the backend when an attempt ends */
  sched_job *job;
  sched_stage *stage;
  uint32_t index; /* in the stage's tasks (for the result stage: in the job's partitions) */
  uint32_t failures;
  rdd_task rt; /* the attempt: partition, attempt number, status, accumulator updates */
  fl_buf result;
  struct sched_task *pending_next;
  uint64_t pending_since_ns; /* when it became pending (locality wait) */
  /* Where the attempt runs: the executor the task scheduler placed it on (0: the backend's
   * own threads), and the backend's record of the attempt (the backend's: NULL when none). */
  uint64_t executor;
  void *attempt;
  bool executor_lost; /* the attempt ended because its executor was lost: a retry that does
                         not count as a failure */
  /* Speculation: a task may have a second attempt, its backup, a sched_task of its own
   * whose `original` is the task; the first success counts, the other attempt is killed. */
  bool running, done;                /* an attempt is out; the task succeeded */
  uint64_t launched_ns, duration_ns; /* the attempt's launch; the successful one's run time */
  struct sched_task *original, *backup;
  struct sched_task *next_copy; /* the job's backups, freed with it */
  uint64_t task_id;             /* the current attempt's number within the scheduler (notes) */
  uint8_t locality;             /* how the current attempt was placed (sched_locality) */
} sched_task;

/* What an attempt of `task` runs: the dataset whose partition it computes, the shuffle it
 * writes (NULL for a task of the job's result stage), the action, and its stage's number
 * within the job (task->rt.job_id is the job's). */
FL_INTERNAL rdd *sched_task_rdd(const sched_task *task);
FL_INTERNAL const rdd_shuffle_dep *sched_task_shuffle_dep(const sched_task *task);
FL_INTERNAL const rdd_action *sched_task_action(const sched_task *task);
FL_INTERNAL uint32_t sched_task_stage(const sched_task *task);

/* ---- backends -------------------------------------------------------------------------- */
typedef struct backend backend;

/* An attempt out, as its executors hold it (backend_ops.attempts). The executors of a node
 * may run each other's queued attempts (node-shared tasks), so the one that runs an attempt
 * is not always the one it was placed on, whose slot it keeps until it ends. */
typedef struct sched_attempt {
  sched_task *task;
  uint64_t runner; /* the executor that said it runs the attempt (a node peer of
                      task->executor); 0: none said so */
  bool claimed;    /* a node peer runs it (runner, or one not known yet): it takes no core of
                      task->executor */
  bool offered;    /* queued at every executor of task->executor's node, any of which may
                      run it */
} sched_attempt;

/* The attempts a backend has out (backend_ops.attempts), and the executors it has found lost
 * whose removal is on its way to the scheduler (they have no free core). Both arrays are
 * allocated with common_calloc and freed by the caller. */
typedef struct sched_attempts {
  sched_attempt *items; /* in launch order */
  size_t count;
  uint64_t *lost;
  size_t num_lost;
} sched_attempts;

/* A backend runs task attempts. Every slot runs on the scheduler thread and never blocks,
 * but destroy. */
typedef struct backend_ops {
  const char *name;
  /* Starts an attempt of `task` where the task scheduler placed it (task->executor), and
   * posts its end with scheduler_post_task_end exactly once. */
  void (*launch)(backend *b, sched_task *task);
  /* Optional: sends what launch batched, after each round of launches. more_pending: tasks
   * (or a barrier stage) still wait for slots after this round. */
  void (*flush)(backend *b, bool more_pending);
  /* Optional: an attempt's end is about to be handled; the backend forgets the attempt.
   * counts: it succeeded and its job still runs (where it ran now holds its output).
   * Returns the executor that ran it (0: task->executor). */
  uint64_t (*ended)(backend *b, sched_task *task, bool counts);
  /* Optional: `job` failed or was cancelled; stops its running attempts early (each still
   * ends through scheduler_post_task_end). Without it they run to their end. */
  void (*kill_job)(backend *b, sched_job *job);
  /* Optional: stops one attempt (a backup's loser, or a task of an abandoned barrier
   * attempt): ends it with FL_ECANCELLED through scheduler_post_task_end unless its end is
   * already on the way. A loser ends now; a barrier task may end later, once its executor
   * has stopped it or is found lost (within a bounded time), so that the stage's next attempt
   * is not placed where it ran before that is known. Required for speculation. */
  void (*kill_attempt)(backend *b, sched_task *task);
  /* Optional: `task` could not read map output (task->rt.fetch_shuffle_id, fetch_map); the
   * scheduler has marked it lost. The backend checks that the executor that wrote it is
   * still alive. */
  void (*fetch_failed)(backend *b, sched_task *task);
  /* Optional (executors that queue attempts beyond their cores and run their node's queued
   * attempts): the attempts out as the executors hold them, into *out; for speculation,
   * which backs up attempts still waiting in a busy executor's queue. */
  fl_status (*attempts)(backend *b, sched_attempts *out);
  /* Ends the backend's threads after their current tasks; blocks. Frees the backend. */
  void (*destroy)(backend *b);
} backend_ops;

struct backend {
  const backend_ops *ops;
  scheduler *sched;
  /* threads > 0: the backend runs tasks on this many threads of its own (local), taking
   * `slots` at once, and nothing is placed. threads 0: tasks run on the executors that the
   * backend adds (scheduler_executor_added), placed by the task scheduler. */
  uint32_t threads;
  uint32_t slots;
};

/* The in-process backend: a pool of `threads` task threads. contain_crashes: a crash of an
 * attempt (SIGSEGV, SIGBUS, SIGFPE, SIGILL on its thread) fails it instead of ending the
 * process (fl_options.contain_task_crashes; installs common_crash_guard's handler). */
FL_INTERNAL fl_status local_backend_create(scheduler *sched, uint32_t threads, bool contain_crashes,
                                           backend **out);

/* ---- executors ------------------------------------------------------------------------- */

/* An executor that tasks can be placed on, as its backend registered it. */
typedef struct sched_executor_info {
  uint64_t id;      /* > 0, in the order executors joined */
  const char *node; /* the node's id ("" for none): the executors of a node map each other's
                       cached blocks in place */
  uint32_t cores;   /* tasks it runs at the same moment */
  uint32_t slots;   /* tasks it takes at once, running or queued */
  int32_t gpu;      /* its GPU, or -1 */
} sched_executor_info;

/* Scheduler thread (scheduler_post_call): an executor joined; its slots become usable. */
FL_INTERNAL void scheduler_executor_added(scheduler *s, const sched_executor_info *info);
/* Scheduler thread: executor `id` is lost, before its attempts' ends come: its slots go and
 * nothing more is placed on it. Unknown ids are ignored. */
FL_INTERNAL void scheduler_executor_removed(scheduler *s, uint64_t id);
/* Scheduler thread: whether the task scheduler leaves executor `id` out for now (tasks
 * failed on it in a row; sched_placement). */
FL_INTERNAL bool scheduler_executor_excluded(scheduler *s, uint64_t id, uint64_t now_ns);

/* How tasks are placed on executors (Spark's spark.locality.wait and excludeOnFailure). A
 * task over a cached partition waits up to locality_wait_ns for the executor that caches it
 * (or another of its node) to have a free slot; exclude_failures attempts failing on an
 * executor in a row leave it out for exclude_ns. */
typedef struct sched_placement {
  uint64_t locality_wait_ns;
  uint32_t exclude_failures; /* 0: never */
  uint64_t exclude_ns;
  /* Scheduler thread: the live executor that caches the partition task reads first, or 0
   * (the driver's block locations). NULL: none is ever known. */
  uint64_t (*input_at)(void *arg, const sched_task *task);
  void *arg;
} sched_placement;

/* ---- scheduler ------------------------------------------------------------------------- */
typedef struct scheduler_stats {
  uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, tasks_speculated;
  uint64_t task_ns; /* every attempt's run time, summed */
  /* rdd_task's bytes, summed over the attempts that counted (as sched_job_stats) */
  uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes;
} scheduler_stats;

/* Speculation (Spark's settings): once `quantile` of a stage's tasks succeeded, a task
 * running longer than max(multiplier x their median run time, min_ns) gets a backup copy on
 * another executor; the first to succeed counts, the other is killed. Needs a backend whose
 * tasks are placed on executors, with kill_attempt (the cluster backend). */
typedef struct sched_speculation {
  bool enabled;
  double quantile, multiplier;
  uint64_t min_ns;
} sched_speculation;

/* ---- listener: what the scheduler does, as Spark's SparkListener ---------------------- */
/* The web UI, the event log and progress bars are built from these notes (driver/ui/). */
typedef enum sched_note_kind {
  SCHED_JOB_STARTED,
  SCHED_JOB_ENDED,
  SCHED_STAGE_SUBMITTED,
  SCHED_STAGE_COMPLETED,
  SCHED_TASK_STARTED,
  SCHED_TASK_ENDED,
} sched_note_kind;

/* A stage as a job's start describes it: its dataset's narrow lineage, newest first (rdds[0]
 * is the stage's dataset), and the stages it reads the shuffles of. */
typedef struct sched_stage_desc {
  uint32_t id, num_tasks;
  const char *name; /* the action for the result stage ("collect"), else "shuffle map" */
  const rdd *const *rdds;
  uint32_t num_rdds;
  const uint32_t *parents;
  uint32_t num_parents;
} sched_stage_desc;

typedef struct sched_note {
  sched_note_kind kind;
  uint64_t job, group; /* group: sched_job_opts.group (the driver's application) */
  /* JOB_STARTED: every stage of the job, the result stage first */
  const sched_stage_desc *stages;
  uint32_t num_stages;
  /* stages' and tasks' notes */
  uint32_t stage, stage_attempt, num_tasks;
  /* tasks' notes: the task's index in its stage, its attempt (backups count on), the
   * attempt's number within the scheduler (Spark's task id), where it runs and how it was
   * placed */
  uint32_t index, attempt;
  uint64_t task_id;
  uint64_t executor;
  sched_locality locality;
  bool speculative;
  /* TASK_ENDED: how it ended and its figures (rdd_task's) */
  uint64_t duration_ns, run_ns, input_bytes, shuffle_read_bytes, shuffle_write_bytes;
  /* JOB_ENDED, STAGE_COMPLETED, TASK_ENDED */
  fl_status status; /* FL_ECANCELLED for a killed task */
  const char *error;
} sched_note;

/* Before any job: fn(arg, note) is called on the scheduler thread for every note; it must
 * copy what it keeps and never block. */
FL_INTERNAL void scheduler_set_listener(scheduler *s, void (*fn)(void *arg, const sched_note *note), void *arg);

/* Starts the event loop. max_attempts: tries of a task before its job fails. */
FL_INTERNAL fl_status scheduler_create(uint32_t max_attempts, scheduler **out);
/* Before any job: turns speculation on (see sched_speculation). */
FL_INTERNAL void scheduler_set_speculation(scheduler *s, const sched_speculation *spec);
/* Before any job: how tasks are placed on executors (see sched_placement). */
FL_INTERNAL void scheduler_set_placement(scheduler *s, const sched_placement *placement);
/* Gives the scheduler its backend (owned from now on). */
FL_INTERNAL void scheduler_set_backend(scheduler *s, backend *b);
/* Stops the loop, destroys the backend and frees the scheduler. No job may be running. */
FL_INTERNAL void scheduler_destroy(scheduler *s);

/* What a job's attempts did, counted as they end (every attempt, backups included). */
typedef struct sched_job_stats {
  uint64_t attempts, attempts_failed;
  uint64_t task_ns; /* the attempts' run time, summed (rdd_task.run_ns) */
  uint64_t blocks_mapped, blocks_fetched; /* rdd_task's, summed */
  /* rdd_task's bytes, summed over the successful attempts whose outcome counted (the first
   * of a task and its backup to succeed), so that each partition's are counted once. */
  uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes;
} sched_job_stats;

/* How a job may be cancelled. group: jobs that scheduler_cancel ends together (the driver's
 * application); tag: one job, or a few, within the group (a client's operation id).
 * abandoned: when it becomes true while the job runs, the job is cancelled (its caller went
 * away); may be NULL. */
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
/* From any thread: runs fn(s, arg) on the scheduler thread (executors joining and leaving,
 * checks of waiting jobs). Never blocks. */
FL_INTERNAL fl_status scheduler_post_call(scheduler *s, void (*fn)(scheduler *, void *), void *arg);

/* A submitted, unfinished stage of a running job, as a progress bar shows it (progress.c). */
typedef struct sched_stage_progress {
  uint32_t stage;                    /* sched_stage.uid: the stage's number in notes and the UI */
  /* running: tasks not yet succeeded with an attempt out, handed to the backend (the local
   * backend and executors queue a few beyond their cores, so it may exceed the cores) */
  uint32_t tasks, completed, running;
} sched_stage_progress;
/* From any thread but the scheduler's: the submitted, unfinished stages of the running jobs
 * of `group` (a local context's: 0), oldest stage first, at most cap of them into out[], and
 * their number (all of them, which may exceed cap) into *count. Blocks until the scheduler
 * thread answers, at most 1 s: FL_ETIMEDOUT then, with *count 0. */
FL_INTERNAL fl_status scheduler_progress(scheduler *s, uint64_t group, sched_stage_progress *out, uint32_t cap,
                                         uint32_t *count);

/* Scheduler thread: calls fn(arg, job, submitted_ns) for every running job that has not
 * failed, `job` being its number; fn may fail it (scheduler_fail_job). */
FL_INTERNAL void scheduler_each_job(scheduler *s, void (*fn)(void *arg, uint64_t job, uint64_t submitted_ns),
                                    void *arg);
/* Scheduler thread: fails running job `job` with status and a message (the first cause is
 * the one reported); nothing when it is not running. */
FL_INTERNAL void scheduler_fail_job(scheduler *s, uint64_t job, fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Scheduler thread: charges task `index` of stage `stage` of running job `job` with a failed
 * attempt that ended without counting as one (its executor's loss was explained later: its
 * process died of the task's code; `why` says how). The job fails once the task has failed
 * max_attempts times. Nothing happens when the job or the task is over. */
FL_INTERNAL void scheduler_charge_task(scheduler *s, uint64_t job, uint32_t stage, uint32_t index, const char *why);

/* ---- barrier coordinator (barrier.c) ------------------------------------------------- */
/* The rendezvous of barrier stages' tasks (docs/barrier.md): one table per scheduler, used
 * by the scheduler (attempts start and end), by local tasks (barrier_local_ops) and by the
 * driver's RPC handlers for executors' tasks (scheduler_barriers). */
typedef struct barrier_table barrier_table;
FL_INTERNAL fl_status barrier_table_create(barrier_table **out);
FL_INTERNAL void barrier_table_destroy(barrier_table *t);
/* The scheduler's table. */
FL_INTERNAL barrier_table *scheduler_barriers(scheduler *s);
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

#endif /* FLINT_DRIVER_SCHEDULER_H */
