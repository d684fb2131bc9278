/*
 * run_child.h: runs a program the way a user runs it, as a child process with stdout and
 * stderr captured apart, bounded in time: the child has alarm(alarm_s) (kept across exec),
 * and the parent kills it if its pipes stay open past limit_s. For the CLI tests; include
 * after test_util.h (with _GNU_SOURCE defined first, for pipe2).
 */
#ifndef FLINT_TESTS_RUN_CHILD_H
#define FLINT_TESTS_RUN_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RUN_CHILD_MAX_ARGS 40
#define RUN_CHILD_OUT_CAP (256 * 1024)

typedef struct run_result {
  int status; /* exit status; 128 + signal when killed by one */
  char out[RUN_CHILD_OUT_CAP];
  size_t out_len;
  char err[RUN_CHILD_OUT_CAP];
  size_t err_len;
} run_result;

static void run_child_drain(int *fd, char *buf, size_t *len) {
  char tmp[4096];
  ssize_t n = read(*fd, tmp, sizeof tmp);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(*fd);
    *fd = -1;
    return;
  }
  size_t room = RUN_CHILD_OUT_CAP - 1 - *len, take = (size_t)n < room ? (size_t)n : room;
  memcpy(buf + *len, tmp, take);
  *len += take;
  buf[*len] = '\0';
}

/* Runs `path ARGS...` (args NULL-terminated, without the program name) in folder `cwd`
 * (NULL: this process's folder); the caller frees the result. */
static run_result *run_child(const char *path, const char *cwd, const char *const *args, unsigned alarm_s,
                             unsigned limit_s) {
  run_result *r = calloc(1, sizeof *r);
  assert_non_null(r);
  const char *argv[RUN_CHILD_MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = path;
  for (; args[argc - 1]; argc++) {
    assert_true(argc <= RUN_CHILD_MAX_ARGS);
    argv[argc] = args[argc - 1];
  }
  argv[argc] = NULL;
  int out_pipe[2], err_pipe[2];
  assert_int_equal(pipe2(out_pipe, O_CLOEXEC), 0);
  assert_int_equal(pipe2(err_pipe, O_CLOEXEC), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    if (cwd && chdir(cwd) != 0) _exit(126);
    alarm(alarm_s);
    execv(path, (char *const *)argv);
    fprintf(stderr, "cannot run %s: %s\n", path, strerror(errno));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  int fds[2] = {out_pipe[0], err_pipe[0]};
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  bool killed = false;
  while (fds[0] >= 0 || fds[1] >= 0) {
    struct pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    int n = poll(p, 2, 1000);
    if (n < 0 && errno != EINTR) fail_msg("poll: %s", strerror(errno));
    if (n > 0) {
      if (fds[0] >= 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) run_child_drain(&fds[0], r->out, &r->out_len);
      if (fds[1] >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) run_child_drain(&fds[1], r->err, &r->err_len);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!killed && now.tv_sec - start.tv_sec > (time_t)limit_s) {
      kill(pid, SIGKILL);
      killed = true;
    }
  }
  /* The pipes are closed: the child has exited or is about to (SIGKILL at worst). */
  int wstatus;
  while (waitpid(pid, &wstatus, 0) < 0) assert_int_equal(errno, EINTR);
  if (WIFEXITED(wstatus)) {
    r->status = WEXITSTATUS(wstatus);
  } else {
    r->status = 128 + WTERMSIG(wstatus);
    fprintf(stderr, "%s %s ... was killed by signal %d%s\n", path, argc > 1 ? argv[1] : "", WTERMSIG(wstatus),
            killed || WTERMSIG(wstatus) == SIGALRM ? " (time limit)" : "");
  }
  return r;
}

static void run_dump(const run_result *r) {
  fprintf(stderr, "exit status %d\n--- stdout ---\n%s--- stderr ---\n%s--------------\n", r->status, r->out, r->err);
}

#endif
