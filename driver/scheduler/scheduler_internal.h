/*
 * scheduler_internal.h: inside the scheduler (driver/scheduler/): jobs, stages, the
 * executors tasks are placed on, the event loop's state, and how the files of the scheduler
 * call each other. Everything here belongs to the scheduler thread, but for the counters of
 * struct scheduler (atomics) and the barrier table (its own lock).
 *
 * The files, top to bottom; each calls only those below it:
 *   event_loop.c      the event loop and the entry points; hands each task end's outcome
 *                     from the task scheduler to the DAG scheduler
 *   dag_scheduler.c   jobs into stages, stages into tasks; lost map output run again
 *   task_scheduler.c  pending tasks onto free slots; the ends of attempts, retries
 *   gang.c            barrier stages: gangs placed and launched together, retried whole
 *   locality.c        where a task runs (delay scheduling)
 *   speculation.c     backup attempts: slow ones, queued ones, and where backups go
 *   job_end.c         a job fails or finishes
 *   task_queue.c      the pending FIFO; launching an attempt
 *   executors.c       the executors, their slots and exclusion
 *   notes.c           the listener's notes of jobs, stages and attempts
 *   barrier.c         barrier stages' rendezvous (the coordinator)
 * The local backend (local_backend.c) is a backend like any other: it uses scheduler.h only.
 */
#ifndef FLINT_DRIVER_SCHEDULER_INTERNAL_H
#define FLINT_DRIVER_SCHEDULER_INTERNAL_H

#include "driver/scheduler/scheduler.h"

/* A stage: tasks that each compute one partition of `rdd` through its narrow lineage. A map
 * stage writes the output of shuffle `dep`; the result stage runs the job's action. */
struct sched_stage {
  uint32_t id;  /* within its job (barrier tables, tasks' stage numbers) */
  uint32_t uid; /* within the scheduler: the stage's number in notes (the UI, progress bars) */
  sched_job *job;
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

/* An executor as the task scheduler sees it (executors.c): its slots, the attempts placed
 * on it, and whether tasks leave it out. */
typedef struct sched_executor {
  uint64_t id;
  char node[64];
  uint32_t cores, slots;
  int32_t gpu;
  uint32_t running;           /* attempts placed on it and not ended (their slots) */
  bool removed;               /* lost: its slots are gone; freed once `running` is 0 */
  uint32_t failures_in_row;   /* task failures since its last success */
  uint64_t excluded_until_ns; /* left out until then */
  char *no_device;            /* a task of it found no usable GPU (FL_ENODEVICE): why; it gets
                                 no more GPU barrier tasks */
  /* speculation.c's, for one decision: its own attempts taking a core (claimed ones off),
   * the node peers' it runs, its free cores, its node's, and the launch index below which
   * its queued attempts may still be backed up */
  uint32_t own_now, claimed_in, free_cores, node_free;
  size_t steal_below;
  struct sched_executor *next;
} sched_executor;

struct scheduler {
  common_queue events;
  pthread_t thread;
  backend *backend;
  uint32_t max_attempts;
  int64_t free_slots;
  uint64_t retry_at_ns;    /* the earliest locality wait to end; 0: none */
  uint64_t resubmit_at_ns; /* when to rerun the map tasks of lost outputs; 0: none */
  sched_speculation speculation;
  sched_placement placement;
  uint64_t speculate_at_ns; /* the next look for slow tasks; 0: none due */
  sched_executor *executors; /* newest first (the order ties are broken in) */
  sched_task *pending_head, *pending_tail; /* FIFO of tasks waiting for a slot */
  sched_job *active;                       /* jobs submitted and not finished */
  sched_job *ended;                        /* jobs ended during this event, to hand back */
  uint64_t abandon_check_at_ns;            /* the next look at asynchronous jobs' callers; 0: none */
  sched_stage *gangs_head;                 /* barrier stages waiting for slots, in order */
  struct barrier_table *barriers;          /* barrier stages' rendezvous (any thread) */
  atomic_uint_fast64_t next_job_id;
  uint32_t next_stage_uid;
  uint64_t next_task_id; /* attempts' numbers in notes */
  /* scheduler_set_listener's */
  void (*listener)(void *arg, const sched_note *note);
  void *listener_arg;
  _Atomic uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, tasks_speculated, task_ns;
  _Atomic uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes; /* scheduler_stats */
};

/* What an attempt's end means for the DAG scheduler: task_scheduler_task_ended's answer,
 * which the event loop hands on (dag_scheduler_task_ended). */
typedef struct task_outcome {
  enum { TASK_NOTHING, TASK_SUCCEEDED, TASK_FETCH_FAILED } kind;
  sched_task *tasks; /* SUCCEEDED: tasks[0, count) succeeded (one task, or a barrier stage's
                        whole gang); FETCH_FAILED: tasks[0] could not read map output */
  uint32_t count;
} task_outcome;
#define TASK_OUTCOME_NONE ((task_outcome){TASK_NOTHING, NULL, 0})

/* ---- DAG scheduler (dag_scheduler.c) ----------------------------------------------------- */
/* Cuts a submitted job into stages and submits those that can run. */
FL_INTERNAL void dag_scheduler_job_submitted(scheduler *s, sched_job *job);
/* Takes an attempt's outcome: succeeded tasks (a map task's output is registered; a stage
 * that finished lets the stages waiting for it go; a result goes to the job), or a task that
 * could not read map output (marked lost; the task waits until its map task ran again, which
 * waits DAG_RESUBMIT_DELAY_NS, so that one lost executor's fetch failures are handled
 * together). */
FL_INTERNAL void dag_scheduler_task_ended(scheduler *s, task_outcome outcome);
/* Reruns the map tasks of lost outputs that unfinished stages need (resubmit_at_ns). */
FL_INTERNAL void dag_scheduler_resubmit(scheduler *s);
/* Frees a finished job's stages (the caller's thread, after the job is handed back). */
FL_INTERNAL void dag_scheduler_free_stages(sched_job *job);

/* ---- task scheduler (task_scheduler.c) --------------------------------------------------- */
/* Launches pending tasks (and waiting gangs) while slots are free. */
FL_INTERNAL void task_scheduler_offer(scheduler *s);
/* An attempt ended: its slot is free; a failure is retried (or fails the job), and what the
 * DAG scheduler must do is returned. */
FL_INTERNAL task_outcome task_scheduler_task_ended(scheduler *s, sched_task *task);

/* ---- barrier stages: gangs (gang.c) ------------------------------------------------------ */
/* Queues the gang of a barrier stage for slots (fails the job with FL_ESLOTS when the
 * cluster can never run it). */
FL_INTERNAL void gang_submit(scheduler *s, sched_stage *st);
/* Launches every waiting gang that fits now, in order; true when one was launched. */
FL_INTERNAL bool gang_offer(scheduler *s);
/* An attempt of a barrier stage's task ended (its job still runs). */
FL_INTERNAL task_outcome gang_task_ended(scheduler *s, sched_task *t);

/* ---- locality (locality.c) --------------------------------------------------------------- */
/* Where task t runs (delay scheduling): true with t->executor set; false to keep it pending,
 * with *retry_at set when it waits for its preferred executor. */
FL_INTERNAL bool locality_place(scheduler *s, sched_task *t, uint64_t now, uint64_t *retry_at);

/* ---- speculation (speculation.c) --------------------------------------------------------- */
/* Gives slow running tasks of running stages a backup copy. */
FL_INTERNAL void speculation_check_slow(scheduler *s);
/* With nothing pending, backs up attempts that wait in a busy executor's queue while
 * another executor has an idle core. */
FL_INTERNAL void speculation_back_up_queued(scheduler *s);
/* Where backup t goes when the backend moved its original (an attempt offered to its
 * node's executors): true with *to set; *avoid becomes the executor running the original
 * when one said so. */
FL_INTERNAL bool speculation_place_backup(scheduler *s, const sched_task *t, uint64_t now, uint64_t *to,
                                          uint64_t *avoid);

/* ---- the end of jobs (job_end.c) --------------------------------------------------------- */
/* Fails the job (the first cause is the one reported): its pending tasks go, its running
 * attempts are killed, and it ends once none runs. */
FL_INTERNAL void job_end_fail(scheduler *s, sched_job *job, fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ends the job when no attempt of it runs and it failed or has all its results: it goes
 * back to its caller once the current event is through. */
FL_INTERNAL void job_end_maybe_finish(scheduler *s, sched_job *job);

/* ---- the queue of tasks (task_queue.c) --------------------------------------------------- */
/* Queues a task for a slot (its locality wait counts from now). */
FL_INTERNAL void task_queue_push(scheduler *s, sched_task *task);
FL_INTERNAL void task_queue_submit(scheduler *s, sched_task *tasks, uint32_t count);
/* Launches an attempt of t where it was placed. */
FL_INTERNAL void task_queue_launch(scheduler *s, sched_task *t);
/* Forgets the pending tasks and waiting gangs of a job. */
FL_INTERNAL void task_queue_drop_job(scheduler *s, sched_job *job);

/* ---- executors (executors.c) ------------------------------------------------------------- */
/* Executor `id`, removed or not; NULL when unknown (or freed). */
FL_INTERNAL sched_executor *executors_find(scheduler *s, uint64_t id);
FL_INTERNAL bool executors_excluded(const sched_executor *x, uint64_t now);
/* An attempt placed on t->executor and run by `ran` ended, before the scheduler handles it:
 * its slot is free, and the executor that ran it is charged (exclusion, no usable GPU). */
FL_INTERNAL void executors_attempt_ended(scheduler *s, const sched_task *t, uint64_t ran);

/* ---- the listener's notes (notes.c); nothing without a listener ------------------------ */
FL_INTERNAL void notes_job_started(scheduler *s, const sched_job *job);
/* Also ends the job's stages that were submitted and did not finish. */
FL_INTERNAL void notes_job_ended(scheduler *s, const sched_job *job);
FL_INTERNAL void notes_stage_submitted(scheduler *s, const sched_stage *st);
FL_INTERNAL void notes_stage_completed(scheduler *s, const sched_stage *st, fl_status status, const char *error);
FL_INTERNAL void notes_task_started(scheduler *s, const sched_task *t);
/* ran: the executor that ran the attempt (0: where it was placed). */
FL_INTERNAL void notes_task_ended(scheduler *s, const sched_task *t, uint64_t ran);

/* The level of job and stage start/end lines (tasks': always debug): info on a cluster's
 * driver; debug in a local context, whose stderr is the job's own (the lines of an iterative
 * job would bury its output). */
static inline common_log_level sched_event_level(const scheduler *s) {
  return s->backend->threads ? LOG_DEBUG : LOG_INFO;
}

#endif /* FLINT_DRIVER_SCHEDULER_INTERNAL_H */
