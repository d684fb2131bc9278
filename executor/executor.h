/*
 * executor.h: the executor process, for the layers above: the pool of task threads, the
 * supervisor and its reports, and executor_serve. Its storage (the block manager, shared
 * blocks, claim tables) has its own header, executor/storage/storage.h, included here so that
 * the driver's code that reaches the block manager through this header still compiles.
 */
#ifndef FLINT_EXECUTOR_H
#define FLINT_EXECUTOR_H

#include <signal.h>

#include "executor/storage/storage.h"

/* ---- task pool ------------------------------------------------------------------------- */
typedef struct task_pool task_pool;

typedef struct task_pool_work {
  common_qnode node;
  void (*run)(struct task_pool_work *work); /* runs on a pool thread */
} task_pool_work;

/* `name` names the threads (fl-task, fl-reply: top -H, gdb); a static string. */
FL_INTERNAL fl_status task_pool_create(uint32_t threads, const char *name, task_pool **out);
/* Queues work; never blocks. The work item stays the caller's; run() gets it back. */
FL_INTERNAL void task_pool_submit(task_pool *pool, task_pool_work *work);
/* Runs what is queued, then joins the threads and frees the pool. NULL does nothing. */
FL_INTERNAL void task_pool_destroy(task_pool *pool);

/* ---- reports to the supervisor (report.c, supervisor.c) ----------------------------------- */
/*
 * `flint executor` runs the executor in a child process that it supervises: when user code
 * kills the child (a crash, exit()), the supervisor tells the driver which task and function
 * did it, so that the driver fails that task rather than the cluster, and starts a fresh
 * executor (new id, clean state). The child reports over a pipe (report.c has the lines).
 */
/* A supervised child gets its end of the pipe and the table of what its task threads run (a
 * memfd of EXECUTOR_RUNNING_SLOTS keys, 0 for none) in FLINT_EXECUTOR_REPORT_FD and
 * FLINT_EXECUTOR_RUNNING_FD (common/config.h). */
#define EXECUTOR_RUNNING_SLOTS 1024

/* A task, as the last words name it. */
typedef struct executor_report_task {
  uint64_t key, app, rdd;
  uint32_t partition;
} executor_report_task;

/* In the child: reports go to descriptor `fd_text` (FLINT_EXECUTOR_REPORT_FD's value), the
 * running attempts to the table of descriptor running_fd_text (NULL: none); installs the
 * handlers of fatal signals and exit(). work_dir is the executor's folder, whose lib/ holds
 * the applications' libraries. */
FL_INTERNAL fl_status executor_report_open(const char *fd_text, const char *running_fd_text, const char *work_dir);
/* After each registration with a driver. No-op when not supervised. */
FL_INTERNAL void executor_report_registered(uint64_t executor, uint64_t incarnation, const char *driver,
                                            const char *work_dir);
/* The task the calling thread runs now (NULL: none). `t` must live until cleared. */
FL_INTERNAL void executor_report_running(const executor_report_task *t);

/* Runs `argv` (a `flint executor` command line; this program is run again) as a supervised
 * child and starts it again after it dies, until *stop becomes nonzero; each death is
 * reported to the driver the child had registered with (calls carry `secret`, NULL: none).
 * Restarts back off (1 s doubling to 30 s) while children die young. Returns the exit status
 * for the supervising process: the child's after a stop (0 when it stopped cleanly); the
 * child's own when it ended before it ever registered (bad arguments, no driver: it said why
 * on stderr). Call it before any thread starts: it forks. */
FL_INTERNAL int executor_supervise(char *const *argv, const char *secret, volatile sig_atomic_t *stop);

/* ---- the executor process (service.c; its other files are listed in internal.h) ------ */
typedef struct executor_config {
  const char *driver;      /* HOST:PORT of the driver's control plane */
  const char *host;        /* the address peers reach this executor at; NULL: 127.0.0.1 */
  uint32_t cores;          /* task threads */
  uint64_t memory;         /* bytes for cached blocks */
  uint64_t shuffle_memory; /* bytes a task sorts or aggregates before spilling; 0: 64 MiB */
  const char *work_dir;    /* where its folder goes; NULL: $TMPDIR or /tmp */
  const char *secret;      /* shared secret; NULL: none */
  int32_t gpu;             /* --gpu: the GPU it owns, or -1 */
} executor_config;

/* Registers with the driver and serves until *stop becomes nonzero (a signal handler sets
 * it), then stops its threads and deletes its work folder. Blocks. Fails when the driver
 * cannot be reached or refuses it. */
FL_INTERNAL fl_status executor_serve(const executor_config *cfg, volatile sig_atomic_t *stop);

#endif /* FLINT_EXECUTOR_H */
