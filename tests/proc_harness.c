/*
 * proc_harness: the process harness of the integration tests with real processes
 * (test_processes, test_recovery). It starts a `flint driver` and `flint executor`s as a user
 * starts them, runs flint commands with their output captured, and cleans up after each test.
 *
 * Binaries: $FLINT_BIN (ctest sets it to <build>/bin) holds flint and the job binaries; else
 * the test program's own folder.
 *
 * Bounds and cleanup: each test has an alarm() watchdog (TEST_BOUND_S) that kills every
 * process the test started, runs the test's own emergency cleanup (fx.on_alarm: deleting
 * network namespaces, for instance), removes the test's folder and ends the program. Every
 * wait (the port file, a command, an exit after a signal) has its own deadline, and a command
 * also has alarm(CMD_LIMIT_S) of its own (kept across exec). Long-running processes get
 * PR_SET_PDEATHSIG, so that they die with the test program. A failed test's teardown kills
 * what is left, prints the processes' logs and removes the folder. The children's TMPDIR is
 * the test's folder, so that nothing they leave behind escapes it.
 *
 * Processes may start in a network namespace (fx.netns): they run under `ip netns exec`,
 * which execs flint in the same process, so pids, signals and PDEATHSIG work as without.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proc_harness.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

fixture fx;
static char bin_dir[PATH_MAX];
static char flint_path[PATH_MAX + 16];
static char ip_path[32]; /* iproute2's ip, for fx.netns; found before any fork */

/* ---- time, files and folders ----------------------------------------------------------- */

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Path of a file in the binary folder, in a small rotating set of static buffers so that a
 * test can hold a few at once. */
const char *bin_file(const char *name) {
  static char bufs[4][PATH_MAX + 64];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", bin_dir, name);
  return b;
}

/* Path of a file in the test's folder, in rotating static buffers as bin_file. */
const char *test_file(const char *name) {
  static char bufs[4][PATH_MAX + 64];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, sizeof bufs[0], "%s/%s", fx.dir, name);
  return b;
}

/* The whole of a small file (a log), NUL-terminated; the caller frees it. */
char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return strdup("");
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (cap - len < 4096) {
      char *grown = realloc(buf, cap = cap ? cap * 2 : 8192);
      if (!grown) break;
      buf = grown;
    }
    size_t n = fread(buf + len, 1, cap - len - 1, f);
    if (n == 0) break;
    len += n;
  }
  fclose(f);
  if (!buf) return strdup("");
  buf[len] = '\0';
  return buf;
}

/* Entries of a folder other than . and ..; -1 when it cannot be read. */
int count_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
  closedir(d);
  return n;
}

/* Entries of the test's folder whose names start with `prefix` (leftover work folders). */
int count_prefixed(const char *path, const char *prefix) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

void make_dir(const char *path) { assert_int_equal(mkdir(path, 0700), 0); }

/* ---- the watchdog ---------------------------------------------------------------------- */

/* Runs on SIGALRM: async-signal-safe calls only (kill, fork, execve, waitpid, write). */
static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = ": a test ran past its time bound (a hang?)\n";
  if (write(STDERR_FILENO, program_invocation_short_name, strlen(program_invocation_short_name)) < 0 ||
      write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
  }
  if (fx.command > 0) kill(fx.command, SIGKILL);
  for (int i = 0; i < fx.num_procs; i++)
    if (fx.procs[i].pid > 0) kill(fx.procs[i].pid, SIGKILL);
  if (fx.on_alarm) fx.on_alarm();
  if (fx.dir[0]) {
    pid_t rm = fork();
    if (rm == 0) {
      char *argv[] = {"rm", "-rf", fx.dir, NULL};
      char *envp[] = {NULL};
      execve("/bin/rm", argv, envp);
      _exit(127);
    }
    if (rm > 0) waitpid(rm, NULL, 0);
  }
  _exit(3);
}

int harness_setup(void **state) {
  (void)state;
  memset(&fx, 0, sizeof fx);
  test_tmpdir(fx.dir, sizeof fx.dir);
  signal(SIGALRM, on_alarm);
  alarm(TEST_BOUND_S);
  return 0;
}

static void print_log(const proc *p) {
  char *text = slurp(p->log);
  size_t len = strlen(text);
  const char *tail = len > 16384 ? text + len - 16384 : text;
  fprintf(stderr, "--- log of %s (pid %d) ---\n%s-----------------\n", p->name, (int)p->pid, tail);
  free(text);
}

/* Kills and reaps what a test left running (the test failed) and removes its folder. */
int harness_teardown(void **state) {
  (void)state;
  if (fx.command > 0) { /* a command that an assertion left running */
    kill(fx.command, SIGKILL);
    while (waitpid(fx.command, NULL, 0) < 0 && errno == EINTR) {
    }
    fx.command = 0;
  }
  for (int i = 0; i < fx.num_procs; i++) {
    proc *p = &fx.procs[i];
    if (!fx.passed) print_log(p);
    if (p->pid > 0) {
      kill(p->pid, SIGKILL);
      while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
      }
      p->pid = 0;
    }
  }
  remove_tree(fx.dir);
  alarm(0);
  return 0;
}

/* ---- starting processes ---------------------------------------------------------------- */

/* The environment of a child: this process's without TMPDIR and flint's own variables
 * (FLINT_SECRET, FLINT_LOG, FLINT_APP_NAME ... would change what the tests see), then
 * TMPDIR=<the test's folder> and `extra` ("NAME=VALUE"s, NULL-terminated; may be NULL).
 * Built before fork: the child of a threaded process (gRPC's) may only call
 * async-signal-safe functions before it execs. Static storage, rebuilt by every call. */
static char **child_env(const char *const *extra) {
  static char *env[1024];
  static char tmpdir[PATH_MAX + 16];
  size_t n = 0;
  for (char **e = environ; *e && n < 1000; e++)
    if (strncmp(*e, "FLINT_", 6) != 0 && strncmp(*e, "TMPDIR=", 7) != 0) env[n++] = *e;
  snprintf(tmpdir, sizeof tmpdir, "TMPDIR=%s", fx.dir);
  env[n++] = tmpdir;
  for (; extra && *extra && n < 1023; extra++) env[n++] = (char *)*extra;
  env[n] = NULL;
  return env;
}

/* Starts `flint ARGS...` (in fx.netns when set) with stdout on out_fd and stderr on err_fd.
 * alarm_s > 0: the child's own time limit. Returns its pid. */
static pid_t spawn(const char *const *args, const char *const *extra_env, int out_fd, int err_fd,
                   int alarm_s) {
  const char *argv[MAX_ARGS + 6];
  int argc = 0;
  if (fx.netns[0]) {
    assert_true(ip_path[0] != '\0');
    argv[argc++] = ip_path;
    argv[argc++] = "netns";
    argv[argc++] = "exec";
    argv[argc++] = fx.netns;
  }
  const char *exe = argc ? ip_path : flint_path;
  argv[argc++] = flint_path;
  for (const char *const *a = args; *a; a++) {
    assert_true(argc < MAX_ARGS + 5);
    argv[argc++] = *a;
  }
  argv[argc] = NULL;
  char **envp = child_env(extra_env);
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    /* Dies with this program, even when it dies by the watchdog or a crash. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (fx.new_group) setpgid(0, 0);
    if (alarm_s > 0) alarm((unsigned)alarm_s);
    execve(exe, (char *const *)argv, envp);
    _exit(127);
  }
  return pid;
}

/* Waits at most limit_s for `pid` to end; returns its exit status (128 + N for signal N), or
 * -1 when it is still running. */
int wait_exit(pid_t pid, double limit_s) {
  double deadline = now_s() + limit_s;
  for (;;) {
    int wstatus;
    pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    assert_true(r == 0 || errno == EINTR);
    if (now_s() > deadline) return -1;
    sleep_ms(10);
  }
}

/* Starts a long-running `flint ARGS...` named `name` (its log: <dir>/<name>.log). */
proc *start_proc(const char *name, const char *const *extra_env, const char *const *args) {
  assert_true(fx.num_procs < MAX_PROCS);
  proc *p = &fx.procs[fx.num_procs];
  snprintf(p->name, sizeof p->name, "%s", name);
  char log[PATH_MAX + 64];
  snprintf(log, sizeof log, "%s/%s.log", fx.dir, name);
  memcpy(p->log, log, sizeof log);
  int fd = open(p->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  p->pid = spawn(args, extra_env, fd, fd, 0);
  close(fd);
  fx.num_procs++;
  return p;
}

void wait_log(proc *p, const char *needle) {
  double deadline = now_s() + CMD_LIMIT_S;
  for (;;) {
    char *log = slurp(p->log);
    bool found = log && strstr(log, needle);
    free(log);
    if (found) return;
    if (now_s() > deadline) {
      char *text = slurp(p->log);
      fail_msg("%s's log lacks \"%s\" after %d s:\n%s", p->name, needle, CMD_LIMIT_S, text ? text : "");
    }
    sleep_ms(50);
  }
}

/* A process that should be running still is; else its log explains. */
void expect_running(proc *p) {
  int st = wait_exit(p->pid, 0);
  if (st >= 0) {
    fprintf(stderr, "%s (pid %d) ended with status %d\n", p->name, (int)p->pid, st);
    p->pid = 0;
  }
  assert_int_equal(st, -1);
}

/* A driver named `name` listening on fx.host's `port` (0: one the system picks). */
static proc *start_driver_on(const char *name, int port, const char *const *extra_env) {
  char work[PATH_MAX + 64], port_file[PATH_MAX + 64], listen[80];
  const char *host = fx.host[0] ? fx.host : "127.0.0.1";
  snprintf(listen, sizeof listen, "%s:%d", host, port);
  snprintf(work, sizeof work, "%s/%.24s-work", fx.dir, name);
  snprintf(port_file, sizeof port_file, "%s/%.24s-port", fx.dir, name);
  make_dir(work);
  proc *p = start_proc(name, extra_env,
                       (const char *const[]){"driver", "--listen", listen, "--work-dir", work,
                                             "--port-file", port_file, NULL});
  snprintf(p->work, sizeof p->work, "%s", work);
  double deadline = now_s() + START_LIMIT_S;
  for (;;) {
    FILE *f = fopen(port_file, "r");
    int got = 0;
    if (f) {
      if (fscanf(f, "%d", &got) != 1) got = 0;
      fclose(f);
    }
    if (got > 0 && got < 65536) {
      fx.port = got;
      break;
    }
    expect_running(p);
    if (now_s() > deadline) fail_msg("%s wrote no port file within %d s", name, START_LIMIT_S);
    sleep_ms(20);
  }
  snprintf(fx.target, sizeof fx.target, "%s:%d", host, fx.port);
  snprintf(fx.master, sizeof fx.master, "flint://%s", fx.target);
  return p;
}

proc *start_driver(const char *const *extra_env) { return start_driver_on("driver", 0, extra_env); }

proc *restart_driver(const char *name, const char *const *extra_env) {
  return start_driver_on(name, fx.port, extra_env);
}

/* Starts an executor of 1 core and 256 MiB for the driver (it registers by itself), with
 * --host fx.exec_host when set. */
proc *start_executor(const char *name, const char *const *extra_env) {
  char work[PATH_MAX + 64];
  snprintf(work, sizeof work, "%s/%s-work", fx.dir, name);
  make_dir(work);
  const char *args[] = {"executor", "--driver",  fx.target, "--cores", "1",          "--memory",
                        "256m",     "--work-dir", work,     "--host",  fx.exec_host, NULL};
  if (!fx.exec_host[0]) args[9] = NULL; /* no --host */
  proc *p = start_proc(name, extra_env, args);
  snprintf(p->work, sizeof p->work, "%s", work);
  return p;
}

/* Sends `sig` and waits for the process to end; returns its exit status (-1: it did not end
 * in time, and was killed). */
int stop_proc(proc *p, int sig) {
  assert_true(p->pid > 0);
  assert_int_equal(kill(p->pid, sig), 0);
  int st = wait_exit(p->pid, STOP_LIMIT_S);
  if (st < 0) {
    fprintf(stderr, "%s (pid %d) did not end within %d s of signal %d\n", p->name, (int)p->pid, STOP_LIMIT_S,
            sig);
    kill(p->pid, SIGKILL);
    while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  p->pid = 0;
  return st;
}

/* Stops every process still running with SIGTERM, executors first, and expects each to exit
 * with status 0 and to have removed its work folder. */
void stop_all(void) {
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < fx.num_procs; i++) {
      proc *p = &fx.procs[i];
      bool is_driver = strcmp(p->name, "driver") == 0;
      if (p->pid <= 0 || is_driver != (pass == 1)) continue;
      int st = stop_proc(p, SIGTERM);
      if (st != 0) fprintf(stderr, "%s exited with status %d after SIGTERM\n", p->name, st);
      assert_int_equal(st, 0);
      if (p->work[0]) assert_int_equal(count_entries(p->work), 0);
    }
}

/* ---- commands -------------------------------------------------------------------------- */

static void drain(int *fd, char *buf, size_t *len) {
  char tmp[4096];
  ssize_t n = read(*fd, tmp, sizeof tmp);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(*fd);
    *fd = -1;
    return;
  }
  size_t room = OUT_CAP - 1 - *len;
  size_t take = (size_t)n < room ? (size_t)n : room;
  memcpy(buf + *len, tmp, take);
  *len += take;
  buf[*len] = '\0';
}

/* Runs `flint ARGS...` to its end (at most CMD_LIMIT_S) with stdout and stderr captured apart;
 * the caller frees the result. */
run_result *run_flint(const char *const *extra_env, const char *const *args) {
  run_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  int out_pipe[2], err_pipe[2];
  assert_int_equal(pipe2(out_pipe, O_CLOEXEC), 0);
  assert_int_equal(pipe2(err_pipe, O_CLOEXEC), 0);
  double start = now_s();
  pid_t pid = spawn(args, extra_env, out_pipe[1], err_pipe[1], CMD_LIMIT_S);
  fx.command = pid;
  close(out_pipe[1]);
  close(err_pipe[1]);
  int fds[2] = {out_pipe[0], err_pipe[0]};
  bool killed = false;
  while (fds[0] >= 0 || fds[1] >= 0) {
    struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    int n = poll(p, 2, 500);
    if (n < 0 && errno != EINTR) fail_msg("poll: %s", strerror(errno));
    if (n > 0) {
      if (fds[0] >= 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) drain(&fds[0], r->out, &r->out_len);
      if (fds[1] >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) drain(&fds[1], r->err, &r->err_len);
    }
    /* The pipes stay open as long as any process holds them: the child's alarm is the
     * usual bound, this one is for a child that forked. */
    if (!killed && now_s() - start > CMD_LIMIT_S + 10) {
      kill(pid, SIGKILL);
      killed = true;
    }
  }
  int wstatus;
  while (waitpid(pid, &wstatus, 0) < 0) assert_int_equal(errno, EINTR);
  fx.command = 0;
  r->seconds = now_s() - start;
  r->status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  if (WIFSIGNALED(wstatus) && (killed || WTERMSIG(wstatus) == SIGALRM))
    fprintf(stderr, "flint %s ... ran past its time limit\n", args[0]);
  return r;
}

void dump(const run_result *r) {
  fprintf(stderr, "exit status %d after %.1f s\n--- stdout ---\n%s--- stderr ---\n%s--------------\n",
          r->status, r->seconds, r->out, r->err);
}

void expect_status(const run_result *r, int status) {
  if (r->status != status) {
    fprintf(stderr, "expected exit status %d\n", status);
    dump(r);
  }
  assert_int_equal(r->status, status);
}

void expect_contains(const run_result *r, const char *text, const char *which, const char *needle) {
  if (!strstr(text, needle)) {
    fprintf(stderr, "%s lacks '%s'\n", which, needle);
    dump(r);
  }
  assert_non_null(strstr(text, needle));
}
void expect_lacks(const run_result *r, const char *text, const char *which, const char *needle) {
  if (strstr(text, needle)) {
    fprintf(stderr, "%s has '%s'\n", which, needle);
    dump(r);
  }
  assert_null(strstr(text, needle));
}
#define EXPECT_NO_ERR(r, needle) expect_lacks((r), (r)->err, "stderr", (needle))
void find_binaries(const char *const *needed) {
  const char *me = program_invocation_short_name;
  const char *env = getenv("FLINT_BIN");
  if (env && *env) {
    snprintf(bin_dir, sizeof bin_dir, "%s", env);
  } else { /* this test's own folder: the build puts the binaries there too */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
      fprintf(stderr, "%s: set FLINT_BIN to the folder of the flint binary\n", me);
      exit(1);
    }
    self[n] = '\0';
    snprintf(bin_dir, sizeof bin_dir, "%s", dirname(self));
  }
  snprintf(flint_path, sizeof flint_path, "%s/flint", bin_dir);
  for (const char *const *n = needed; *n; n++)
    if (access(bin_file(*n), R_OK) != 0) {
      fprintf(stderr, "%s: no %s in %s (set FLINT_BIN)\n", me, *n, bin_dir);
      exit(1);
    }
  if (access(flint_path, X_OK) != 0) {
    fprintf(stderr, "%s: no flint in %s (set FLINT_BIN)\n", me, bin_dir);
    exit(1);
  }
  static const char *const ips[] = {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"};
  for (size_t i = 0; i < sizeof ips / sizeof *ips && !ip_path[0]; i++)
    if (access(ips[i], X_OK) == 0) snprintf(ip_path, sizeof ip_path, "%s", ips[i]);
}

const char *ip_binary(void) { return ip_path[0] ? ip_path : NULL; }
