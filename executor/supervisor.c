/*
 * supervisor.c: `flint executor` as Spark's worker runs it: the executor is a child process
 * (this program again, with the same arguments and FLINT_EXECUTOR_REPORT_FD set), so that user
 * code that kills it (a crash, exit(), abort()) costs one executor process, not the cluster.
 *
 * When a child that had registered dies, the supervisor reads its last words from the report
 * pipe (report.c), tells the driver it registered with (ExecutorExited: the executor, the
 * task and function that were running, the signal or exit status), removes the folder the
 * child left, and starts a fresh child, which registers under a new id with a clean state.
 * A child that dies within YOUNG_S of its start after one that did too is restarted after a
 * pause that doubles from 1 s to 30 s, so that an executor that cannot work does not spin.
 *
 * A stop (SIGINT, SIGTERM: *stop) goes on to the child, which stops as an unsupervised
 * executor does; the supervisor returns once it has. The child dies with its supervisor
 * (PR_SET_PDEATHSIG), so that kill -9 of `flint executor` still ends the executor as a lost
 * machine would. The supervisor has no threads of its own and never runs user code.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "executor/executor.h"
#include "net/net.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"

#define YOUNG_S 30          /* a child that dies sooner than this after its start died young */
#define BACKOFF_MAX_S 30    /* the longest pause before a restart */
#define STOP_GRACE_S 60     /* how long a stopping child may take before it is killed */
#define REPORT_TIMEOUT_MS 10000
#define POLL_MS 50

typedef struct child {
  pid_t pid;
  int report; /* the pipe's read end */
  _Atomic uint64_t *running; /* the table of its task threads' attempts (report.c), or NULL */
  uint64_t started_ns;
  char pending[4096]; /* a line not yet whole */
  size_t pending_len;
  /* From its last "registered" line. */
  bool registered;
  uint64_t executor, incarnation;
  char driver[256], work_dir[PATH_MAX];
  /* From its "died" line, when it said one. */
  bool died_said;
  uint64_t task, app, rdd;
  uint32_t partition;
  int signal_number, exit_code;
  char library[128], symbol[256];
} child;

#define RUNNING_BYTES (EXECUTOR_RUNNING_SLOTS * sizeof(uint64_t))

/* Starts this program again (/proc/self/exe) with argv, the report pipe's write end and the
 * running table's descriptor (3 upward) named in the environment. */
static fl_status child_start(char *const *argv, child *c) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return FL_ERR(FL_EIO, "cannot make a pipe: %s", strerror(errno));
  /* Without the table a death that says nothing charges no attempt: not fatal. */
  int table = memfd_create("flint-running", MFD_CLOEXEC);
  void *map = MAP_FAILED;
  if (table >= 0 && ftruncate(table, (off_t)RUNNING_BYTES) == 0)
    map = mmap(NULL, RUNNING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, table, 0);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    if (map != MAP_FAILED) munmap(map, RUNNING_BYTES);
    if (table >= 0) close(table);
    return FL_ERR(FL_EIO, "cannot start the executor process: %s", strerror(errno));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127); /* the supervisor died before the line above */
    int fd = fcntl(fds[1], F_DUPFD, 3); /* without O_CLOEXEC: it survives the exec */
    char value[16];
    snprintf(value, sizeof value, "%d", fd);
    if (fd < 0 || setenv(config_setting_of(CONFIG_EXECUTOR_REPORT_FD)->name, value, 1) != 0) _exit(127);
    int table_fd = map != MAP_FAILED ? fcntl(table, F_DUPFD, 3) : -1;
    snprintf(value, sizeof value, "%d", table_fd);
    if (table_fd >= 0) setenv(config_setting_of(CONFIG_EXECUTOR_RUNNING_FD)->name, value, 1);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fds[1]);
  if (table >= 0) close(table); /* the mapping keeps it */
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  *c = (child){.pid = pid, .report = fds[0], .started_ns = common_now_ns(),
               .running = map != MAP_FAILED ? map : NULL};
  return FL_OK;
}

static void child_close(child *c) {
  close(c->report);
  if (c->running) munmap((void *)c->running, RUNNING_BYTES);
  c->running = NULL;
}

static void child_line(child *c, char *text) {
  char *words[12];
  int n = 0;
  for (char *save = NULL, *w = strtok_r(text, " ", &save); w && n < 12; w = strtok_r(NULL, " ", &save))
    words[n++] = strcmp(w, "-") == 0 ? "" : w;
  if (n == 5 && strcmp(words[0], "registered") == 0) {
    c->registered = true;
    c->executor = strtoull(words[1], NULL, 10);
    c->incarnation = strtoull(words[2], NULL, 10);
    snprintf(c->driver, sizeof c->driver, "%s", words[3]);
    snprintf(c->work_dir, sizeof c->work_dir, "%s", words[4]);
  } else if (n == 9 && strcmp(words[0], "died") == 0) {
    c->died_said = true;
    c->task = strtoull(words[1], NULL, 10);
    c->app = strtoull(words[2], NULL, 10);
    c->rdd = strtoull(words[3], NULL, 10);
    c->partition = (uint32_t)strtoul(words[4], NULL, 10);
    c->signal_number = atoi(words[5]);
    c->exit_code = atoi(words[6]);
    snprintf(c->library, sizeof c->library, "%s", words[7]);
    snprintf(c->symbol, sizeof c->symbol, "%s", words[8]);
  }
}

/* Reads what the child has written so far. */
static void child_read(child *c) {
  for (;;) {
    ssize_t n = read(c->report, c->pending + c->pending_len, sizeof c->pending - 1 - c->pending_len);
    if (n <= 0) return;
    c->pending_len += (size_t)n;
    c->pending[c->pending_len] = 0;
    char *start = c->pending, *nl;
    while ((nl = strchr(start, '\n'))) {
      *nl = 0;
      child_line(c, start);
      start = nl + 1;
    }
    c->pending_len -= (size_t)(start - c->pending);
    memmove(c->pending, start, c->pending_len);
    if (c->pending_len == sizeof c->pending - 1) c->pending_len = 0; /* no line is this long */
  }
}

/* Tells the driver the child registered with how it died. */
static void report_death(const child *c, int signal_number, int exit_code, const char *secret) {
  Flint__ExecutorExitedRequest req = FLINT__EXECUTOR_EXITED_REQUEST__INIT;
  req.executor_id = c->executor;
  req.incarnation = c->incarnation;
  req.signal = signal_number;
  req.exit_code = exit_code;
  uint64_t running[EXECUTOR_RUNNING_SLOTS];
  for (size_t i = 0; c->running && i < EXECUTOR_RUNNING_SLOTS; i++)
    if ((running[req.n_running] = atomic_load(&c->running[i]))) req.n_running++;
  req.running = running;
  if (c->died_said) {
    req.task_key = c->task;
    req.app_id = c->app;
    req.rdd_id = c->rdd;
    req.partition = c->partition;
    req.library = (char *)c->library;
    req.symbol = (char *)c->symbol;
  }
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  rpc_channel *driver = NULL;
  fl_status st = proto_pack(&req.base, &body);
  if (st == FL_OK) st = rpc_channel_create(c->driver, secret, 0, &driver);
  if (st == FL_OK)
    st = rpc_call(driver, "/flint.Driver/ExecutorExited", fl_buf_bytes(&body), REPORT_TIMEOUT_MS, &reply);
  if (st != FL_OK) common_log(LOG_WARN, "cannot tell the driver at %s: %s", c->driver, fl_last_error());
  rpc_channel_destroy(driver);
  fl_buf_free(&body);
  fl_buf_free(&reply);
}

/* How the child ended, in words, into buf. */
static void describe_end(const child *c, int signal_number, int exit_code, char *buf, size_t len) {
  int n = signal_number ? snprintf(buf, len, "died by signal %d (%s)", signal_number, strsignal(signal_number))
                        : snprintf(buf, len, "exited with status %d", exit_code);
  if (n > 0 && (size_t)n < len && c->died_said && c->task)
    snprintf(buf + n, len - (size_t)n, " in %s%s%s, running partition %u of dataset %llu",
             c->symbol[0] ? c->symbol : "a function", c->library[0] ? " of library " : "", c->library,
             c->partition, (unsigned long long)c->rdd);
}

/* Waits up to ms for the child to end (true), reading its reports meanwhile. */
static bool child_wait(child *c, int ms, int *wstatus) {
  uint64_t deadline = common_now_ns() + (uint64_t)ms * 1000000u;
  for (;;) {
    child_read(c);
    pid_t r = waitpid(c->pid, wstatus, WNOHANG);
    if (r == c->pid) {
      child_read(c);
      return true;
    }
    if (common_now_ns() >= deadline) return false;
    struct pollfd p = {.fd = c->report, .events = POLLIN};
    poll(&p, 1, POLL_MS);
  }
}

/* Sleeps up to s seconds; false once a stop is asked. */
static bool pause_unless_stopped(int s, volatile sig_atomic_t *stop) {
  for (int i = 0; i < s * 1000 / POLL_MS && !*stop; i++) usleep(POLL_MS * 1000);
  return !*stop;
}

int executor_supervise(char *const *argv, const char *secret, volatile sig_atomic_t *stop) {
  common_log_set_role("executor supervisor");
  int young_deaths = 0;        /* in a row */
  bool ever_registered = false; /* since then a child that cannot register is restarted too */
  for (;;) {
    child c;
    if (child_start(argv, &c) != FL_OK) {
      common_log(LOG_ERROR, "%s", fl_last_error());
      return 1;
    }
    int wstatus = 0;
    bool ended = false;
    while (!*stop && !(ended = child_wait(&c, 200, &wstatus))) {
    }
    if (!ended) { /* a stop: the child stops too (it may have had the signal already) */
      kill(c.pid, SIGTERM);
      if (!child_wait(&c, STOP_GRACE_S * 1000, &wstatus)) {
        common_log(LOG_WARN, "the executor process %d did not stop within %d s: killed", (int)c.pid, STOP_GRACE_S);
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &wstatus, 0);
      }
      child_close(&c);
      return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    }
    int signal_number = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
    int exit_code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 0;
    /* A clean exit is a stop (a Ctrl-C reaches the child as well as this process). */
    if (*stop || (!signal_number && exit_code == 0 && !c.died_said)) {
      child_close(&c);
      return exit_code;
    }
    ever_registered |= c.registered;
    if (!c.registered && !ever_registered) { /* it never worked: bad arguments, no driver; it said why */
      child_close(&c);
      if (!signal_number) return exit_code ? exit_code : 1;
      common_log(LOG_ERROR, "the executor process died by signal %d (%s) before it registered", signal_number,
                 strsignal(signal_number));
      return 128 + signal_number;
    }
    if (c.died_said && c.signal_number && !signal_number) signal_number = c.signal_number;
    char how[512];
    describe_end(&c, signal_number, exit_code, how, sizeof how);
    bool young = common_now_ns() - c.started_ns < (uint64_t)YOUNG_S * 1000000000u;
    young_deaths = young ? young_deaths + 1 : 0;
    int backoff_s = young_deaths < 2 ? 0 : young_deaths > 6 ? BACKOFF_MAX_S : 1 << (young_deaths - 2);
    common_log(LOG_WARN, "executor %llu (process %d) %s; a fresh executor starts%s", (unsigned long long)c.executor,
               (int)c.pid, how, backoff_s ? " after a pause" : "");
    if (c.registered) report_death(&c, signal_number, exit_code, secret);
    child_close(&c);
    if (c.work_dir[0]) common_remove_tree(c.work_dir); /* it could not remove its own */
    if (backoff_s && !pause_unless_stopped(backoff_s, stop)) return 0;
    if (*stop) return 0;
  }
}
