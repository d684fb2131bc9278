/* proc_harness.h: starting and stopping flint processes in integration tests (see
 * proc_harness.c for bounds and cleanup). One test runs at a time; its state is `fx`. */
#ifndef FLINT_PROC_HARNESS_H
#define FLINT_PROC_HARNESS_H

#include "test_util.h"

#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

#define TEST_BOUND_S 55  /* each test's bound: a hang fails the program, not ctest's timeout */
#define CMD_LIMIT_S 40   /* one flint command (submit, status, a failing executor) */
#define START_LIMIT_S 30 /* the driver's port file; executors registered */
#define STOP_LIMIT_S 20  /* a process's exit after SIGTERM or SIGINT */
#define MAX_PROCS 8
#define MAX_ARGS 32
#define OUT_CAP (256 * 1024)

/* A long-running process of a test: a driver or an executor. */
typedef struct proc {
  pid_t pid; /* 0 once reaped */
  char name[32];
  char log[PATH_MAX + 64];  /* its stdout and stderr */
  char work[PATH_MAX + 64]; /* its --work-dir */
} proc;

/* What the running test has started; the watchdog and the teardown clean it up. */
typedef struct fixture {
  char dir[PATH_MAX]; /* logs, port file, work folders; the children's TMPDIR */
  proc procs[MAX_PROCS];
  int num_procs;
  volatile pid_t command; /* a flint command running now, or 0 */
  int port;
  char host[64];   /* the address the driver listens on; empty: 127.0.0.1 */
  char target[80]; /* HOST:PORT */
  char master[96]; /* flint://HOST:PORT */
  /* The network namespace that processes started from now on run in; empty: this one. */
  char netns[32];
  char exec_host[64]; /* the address executors started from now on listen on; empty: theirs */
  /* Processes started from now on lead a process group of their own, as a shell's foreground
   * job does (a test signals the whole group: kill(-pid, ...)). */
  bool new_group;
  /* Run by the watchdog after it killed the processes (async-signal-safe calls only). */
  void (*on_alarm)(void);
  bool passed; /* set by the test's last line: the teardown prints logs when unset */
} fixture;

extern fixture fx;

typedef struct run_result {
  int status;     /* exit status; 128 + signal when killed by one */
  double seconds; /* how long it ran */
  char out[OUT_CAP];
  size_t out_len;
  char err[OUT_CAP];
  size_t err_len;
} run_result;

/* Finds the binaries ($FLINT_BIN, else the program's folder) and checks that each of
 * `needed` (NULL-terminated, "flint" implied) is there; exits the program when one is not. */
void find_binaries(const char *const *needed);
/* iproute2's ip (found by find_binaries), or NULL when there is none. */
const char *ip_binary(void);

/* CMocka setup and teardown of a test: a fresh fx with its folder and watchdog; killing what
 * is left (printing logs unless fx.passed) and removing the folder. */
int harness_setup(void **state);
int harness_teardown(void **state);

double now_s(void);
void sleep_ms(int ms);
/* Paths in the binary folder and in the test's folder, in small rotating static buffers. */
const char *bin_file(const char *name);
const char *test_file(const char *name);
/* The whole of a small file (a log), NUL-terminated; the caller frees it. */
char *slurp(const char *path);
int count_entries(const char *path);                    /* -1: cannot be read */
int count_prefixed(const char *path, const char *prefix); /* entries named prefix... */
void remove_tree(const char *path);
void make_dir(const char *path);

/* Waits at most limit_s for `pid` to end; returns its exit status (128 + N for signal N), or
 * -1 when it is still running. */
int wait_exit(pid_t pid, double limit_s);
/* Starts a long-running `flint ARGS...` named `name` (its log: <dir>/<name>.log). */
proc *start_proc(const char *name, const char *const *extra_env, const char *const *args);
/* Waits until the log of `p` holds `needle` (at most CMD_LIMIT_S: only a hang takes so long). */
void wait_log(proc *p, const char *needle);
/* A process that should be running still is; else its log explains. */
void expect_running(proc *p);
/* Starts a driver on fx.host with a port picked by the system and waits for its port file. */
proc *start_driver(const char *const *extra_env);
/* Starts a new driver named `name` on the address of the last one (which must have ended),
 * as a user restarts a driver that died: executors and clients find it where they were. */
proc *restart_driver(const char *name, const char *const *extra_env);
/* Starts an executor of 1 core and 256 MiB for the driver (it registers by itself), with
 * --host fx.exec_host when set. */
proc *start_executor(const char *name, const char *const *extra_env);
/* Sends `sig` and waits for the process to end; returns its exit status (-1: it did not end
 * in time, and was killed). */
int stop_proc(proc *p, int sig);
/* Stops every process still running with SIGTERM, executors first, and expects each to exit
 * with status 0 and to have removed its work folder. */
void stop_all(void);

/* Runs `flint ARGS...` to its end (at most CMD_LIMIT_S) with stdout and stderr captured
 * apart; the caller frees the result. */
run_result *run_flint(const char *const *extra_env, const char *const *args);
#define FLINT(env, ...) run_flint((env), (const char *const[]){__VA_ARGS__, NULL})

void dump(const run_result *r);
void expect_status(const run_result *r, int status);
void expect_contains(const run_result *r, const char *text, const char *which, const char *needle);
void expect_lacks(const run_result *r, const char *text, const char *which, const char *needle);
#define EXPECT_OUT(r, needle) expect_contains((r), (r)->out, "stdout", (needle))
#define EXPECT_ERR(r, needle) expect_contains((r), (r)->err, "stderr", (needle))
#define EXPECT_NO_OUT(r, needle) expect_lacks((r), (r)->out, "stdout", (needle))
#define EXPECT_NO_ERR(r, needle) expect_lacks((r), (r)->err, "stderr", (needle))

#endif
