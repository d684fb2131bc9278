/*
 * flint/cluster.h: the processes of a flint cluster, for the flint command and for programs
 * that embed a driver or an executor.
 *
 * Security: when the environment has FLINT_SECRET (the secret itself) or FLINT_SECRET_FILE (a
 * file holding it), every control-plane call and data-plane connection of these processes,
 * and of contexts opened with a flint:// or local-cluster master, presents it, and servers
 * refuse whoever does not.
 */
#ifndef FLINT_CLUSTER_H
#define FLINT_CLUSTER_H

#include <signal.h>
#include <stdio.h>

#include "flint/flint.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_driver_options {
  const char *listen;    /* HOST:PORT to listen on; port 0 picks a free one */
  const char *work_dir;  /* where its folder goes; NULL: $TMPDIR or /tmp */
  const char *port_file; /* NULL, or a file to write the chosen port to once listening */
} fl_driver_options;

/* Runs a driver until *stop becomes nonzero (set it from a SIGINT/SIGTERM handler), then
 * stops its job binaries and threads and deletes its folder. Blocks. */
FL_API fl_status fl_driver_serve(const fl_driver_options *options, volatile sig_atomic_t *stop);

typedef struct fl_history_options {
  const char *dir;       /* the event logs' folder (FLINT_EVENT_LOG_DIR of the drivers) */
  const char *listen;    /* HOST:PORT; NULL: 127.0.0.1 and FLINT_UI_PORT's port; port 0 picks one */
  const char *port_file; /* NULL, or a file to write the chosen port to once listening */
} fl_history_options;

/* The history server (`flint history`, Spark's): reads every application's event log in
 * options->dir and serves the same web UI and REST API for them as the live driver did, until
 * *stop becomes nonzero. FL_EIO naming the folder when it cannot be read. Blocks. */
FL_API fl_status fl_history_serve(const fl_history_options *options, volatile sig_atomic_t *stop);

typedef struct fl_executor_options {
  const char *driver;   /* HOST:PORT of the driver */
  const char *host;     /* the address peers reach it at; NULL: 127.0.0.1 */
  uint32_t cores;       /* task threads, 1 to 1024 */
  uint64_t memory;      /* bytes for cached blocks, at least 1 MiB */
  const char *work_dir; /* where its folder goes; NULL: $TMPDIR or /tmp */
  /* --gpu ID: the executor owns GPU `gpu` (when has_gpu), and GPU barrier stages place their
   * tasks on it (one at a time). Only recorded: the device is opened by the tasks. */
  bool has_gpu;
  uint32_t gpu;
} fl_executor_options;

/* Registers with the driver and runs tasks until *stop becomes nonzero. Blocks. */
FL_API fl_status fl_executor_serve(const fl_executor_options *options, volatile sig_atomic_t *stop);

/* `flint executor`: runs the executor of `argv` (this program's whole command line, which
 * is run again) in a child process and starts a fresh one, with a new id and a clean state,
 * whenever user code kills it (a crash, exit()), after telling the driver which task and
 * function did (the job then fails that task, not the cluster). Restarts back off while
 * children die young. Returns until *stop becomes nonzero; its result is the process's exit
 * status (nonzero when the executor could not start: its message is on stderr already). Call
 * it before starting threads. */
FL_API int fl_executor_supervise(char *const *argv, volatile sig_atomic_t *stop);

/* Sends job binary `path` with its arguments to the driver of `master` (flint://HOST:PORT),
 * which runs it in a child process as an application named `app_name` (NULL: the library's
 * file name, as `flint status` lists it). Detached: prints nothing, sets *submission and returns
 * at once. Else streams the job's stdout and stderr to this process's and sets *exit_code to
 * the job's exit status (128 + N when signal N killed it; the message says which). When
 * *stop becomes nonzero meanwhile (a signal handler sets it; stop may be NULL), the driver
 * ends the job (SIGTERM), and its remaining output and status come back as usual. */
FL_API fl_status fl_submit(const char *master, const char *path, const char *app_name, int argc,
                           char **argv, bool detach, volatile sig_atomic_t *stop, uint64_t *submission,
                           int *exit_code);

/* A job binary on a driver, as fl_submission_status and fl_submission_kill describe it. */
typedef struct fl_submission_info {
  uint64_t id;
  char name[160];     /* the library's file name */
  char app_name[160]; /* its application's name */
  /* "running", "finished" (exit status 0), "failed" (another status, or a signal) or
   * "killed" (fl_submission_kill) */
  char state[16];
  int exit_code;       /* once it has exited */
  int signal;          /* nonzero when a signal ended it */
  double seconds;      /* how long it has run, or ran */
  uint64_t stdout_bytes, stderr_bytes; /* of its output the driver keeps (at most 64 MiB each) */
} fl_submission_info;

/* Asks the driver of `master` (flint://HOST:PORT) about job binary `id` (fl_submit's
 * *submission; the driver keeps its 64 newest finished ones). FL_ENOENT: the driver has no
 * such job binary. Blocks on one call. */
FL_API fl_status fl_submission_status(const char *master, uint64_t id, fl_submission_info *out);

/* Writes what job binary `id` has written so far, its stdout to `out` and its stderr to `err`,
 * whether it still runs or not. FL_ENOENT as fl_submission_status. Blocks on one call. */
FL_API fl_status fl_submission_logs(const char *master, uint64_t id, FILE *out, FILE *err);

/* As fl_submission_logs, then what job binary `id` writes as it writes it, until it ends:
 * returns FL_OK with its exit status in *exit_code (128 + N when signal N ended it; one that
 * ended before the call returns at once). `stop` (may be NULL), set by a signal handler,
 * ends the following early with FL_ECANCELLED: the job binary goes on. FL_ENOENT as
 * fl_submission_status; a driver lost meanwhile, its error. Blocks until then, one call at a
 * time, each waiting at most 5 s for output (250 ms with a stop). */
FL_API fl_status fl_submission_follow(const char *master, uint64_t id, FILE *out, FILE *err,
                                      volatile sig_atomic_t *stop, int *exit_code);

/* Ends job binary `id` (SIGTERM, then SIGKILL after 5 s) and its application, and returns
 * once it has ended, with its state ("killed") in *info. *was_running is false when it had
 * ended before (then nothing was done). FL_ENOENT as fl_submission_status. Blocks for up to
 * about 10 s. */
FL_API fl_status fl_submission_kill(const char *master, uint64_t id, bool *was_running, fl_submission_info *info);

/* Prints the driver's executors, applications and jobs, and the job binaries it keeps, to
 * `out`. */
FL_API fl_status fl_print_status(const char *master, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* FLINT_CLUSTER_H */
