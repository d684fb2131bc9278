/*
 * submissions.c: job binaries (`flint submit`). The driver stores the library, runs it as
 * `flint submit --in-process` in a child process (a client of this driver, which ends with
 * the driver), and keeps its stdout and stderr for the submitter, who reads them with long
 * polls (Output) until the job exits. An interrupted submitter cancels it
 * (CancelSubmission). Detached ones are watched by id: their state (SubmissionStatus), their
 * output so far (Output) and a kill (KillSubmission). The newest MAX_SUBMISSIONS_KEPT
 * finished ones are kept.
 *
 * Threading: one supervisor thread per job binary reads its output and reaps it; submissions
 * and their output are under d->lock, and d->changed wakes the long polls.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver/driver_internal.h"

#define MAX_SUBMISSIONS_KEPT 64    /* finished job binaries kept (their output, for Output) */
#define MAX_JOB_OUTPUT (64u << 20) /* bytes of a job binary's stdout or stderr kept */
#define KILL_GRACE_MS 5000         /* from KillSubmission's SIGTERM to its SIGKILL */

typedef struct submission {
  uint64_t id;
  pid_t pid;
  int out_fd, err_fd;
  fl_buf out, err;
  char name[160], app_name[160];
  uint64_t started_ns, ended_ns;
  bool exited;
  bool killed; /* by KillSubmission: its state is "killed", not "failed" */
  int exit_code, signal;
  pthread_t supervisor;
  struct submission *next;
} submission;

static void *supervise(void *arg) {
  pthread_setname_np(pthread_self(), "fl-supervise");
  void **args = arg;
  driver_state *d = args[0];
  submission *s = args[1];
  common_free(args);
  struct pollfd fds[2] = {{s->out_fd, POLLIN, 0}, {s->err_fd, POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; i++) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      FL_PCHECK(pthread_mutex_lock(&d->lock));
      if (n > 0) {
        fl_buf *b = i == 0 ? &s->out : &s->err;
        if (b->len + (size_t)n <= MAX_JOB_OUTPUT) fl_buf_append(b, buf, (size_t)n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        open_fds--;
      }
      pthread_cond_broadcast(&d->changed);
      FL_PCHECK(pthread_mutex_unlock(&d->lock));
    }
  }
  /* Marked exited before it is reaped, so that a cancel (submissions_handle_cancel) never
   * signals a pid that another process has taken since. */
  siginfo_t info;
  memset(&info, 0, sizeof info);
  while (waitid(P_PID, (id_t)s->pid, &info, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
  }
  apps_close_of_pid(d, s->pid); /* before `exited`: its submitter sees it gone with its job */
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->exited = true;
  s->ended_ns = common_now_ns();
  if (info.si_code == CLD_EXITED) s->exit_code = info.si_status;
  else s->signal = info.si_status;
  pthread_cond_broadcast(&d->changed);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR) {
  }
  if (s->signal)
    common_log(LOG_WARN, "job binary %llu was killed by signal %d (%s)", (unsigned long long)s->id,
               s->signal, strsignal(s->signal));
  else
    common_log(LOG_INFO, "job binary %llu exited with status %d", (unsigned long long)s->id, s->exit_code);
  return NULL;
}

/* A long-running driver keeps the newest MAX_SUBMISSIONS_KEPT finished job binaries (output
 * and library); older ones go. */
static void prune_submissions(driver_state *d) {
  submission *gone = NULL;
  uint32_t finished = 0;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  for (submission **p = &d->submissions; *p;) {
    if ((*p)->exited && ++finished > MAX_SUBMISSIONS_KEPT) {
      submission *old = *p;
      *p = old->next;
      old->next = gone;
      gone = old;
    } else {
      p = &(*p)->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  while (gone) {
    submission *old = gone;
    gone = old->next;
    pthread_join(old->supervisor, NULL); /* it ended with the job; only its return is left */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/jobs/job-%llu", d->work_dir, (unsigned long long)old->id);
    common_remove_tree(path);
    fl_buf_free(&old->out);
    fl_buf_free(&old->err);
    common_free(old);
  }
}

fl_status submissions_handle_submit(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__SubmitRequest, req, body, "Submit");
  fl_status status = FL_OK;
  submission *s = NULL;
  char path[PATH_MAX + 64];
  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  char **argv = NULL;
  if (req->library.len == 0) {
    status = FL_ERR(FL_EINVAL, "Submit: the job library is empty");
    goto cleanup;
  }
  if (req->n_args > 1024) {
    status = FL_ERR(FL_EPROTO, "Submit: %zu arguments is too many", req->n_args);
    goto cleanup;
  }
  s = common_calloc(1, sizeof *s);
  argv = common_calloc(req->n_args + 9, sizeof *argv);
  if (!s || !argv) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->id = ++d->next_submission_id;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  /* jobs/job-N/NAME: the library keeps its file name, which messages about its functions
   * and the application's name show. */
  const char *name = req->name ? strrchr(req->name, '/') : NULL;
  name = name ? name + 1 : req->name;
  if (!name || !*name || strlen(name) > 128 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) name = "job.so";
  snprintf(path, sizeof path, "%s/jobs/job-%llu", d->work_dir, (unsigned long long)s->id);
  if ((status = common_mkdirs(path)) != FL_OK) goto cleanup;
  size_t dir_len = strlen(path);
  snprintf(path + dir_len, sizeof path - dir_len, "/%s", name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
  bool ok = fd >= 0 && write(fd, req->library.data, req->library.len) == (ssize_t)req->library.len;
  if (fd >= 0) close(fd);
  if (!ok) {
    status = FL_ERR(FL_EIO, "cannot store the job library %s: %s", path, strerror(errno));
    goto cleanup;
  }
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    status = FL_ERR(FL_EIO, "cannot make pipes: %s", strerror(errno));
    goto cleanup;
  }
  /* The child is the flint command itself, as a client of this driver. */
  char master[128];
  snprintf(master, sizeof master, "flint://%s", d->address);
  argv[0] = "flint";
  argv[1] = "submit";
  argv[2] = "--in-process";
  argv[3] = "--master";
  argv[4] = master;
  /* The application's name: the submitter's, else the library's file name (never "flint",
   * this program's, which every job binary would share). */
  argv[5] = "--name";
  argv[6] = req->app_name && *req->app_name ? req->app_name : (char *)name;
  argv[7] = path;
  snprintf(s->name, sizeof s->name, "%s", name);
  snprintf(s->app_name, sizeof s->app_name, "%s", argv[6]);
  s->started_ns = common_now_ns();
  for (size_t i = 0; i < req->n_args; i++) argv[8 + i] = req->args[i];
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    status = FL_ERR(FL_EIO, "cannot start the job: %s", strerror(errno));
    goto cleanup;
  }
  if (pid == 0) {
    /* Job binaries end with their driver, also one killed outright (kill -9), whose stop
     * could not end them: their output would go nowhere. The signal comes when the forking
     * thread ends; it is an rpc handler, of a pool that lives until the driver stops. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  s->pid = pid;
  s->out_fd = out_pipe[0];
  s->err_fd = err_pipe[0];
  out_pipe[0] = out_pipe[1] = err_pipe[0] = err_pipe[1] = -1;
  void **args = common_malloc(2 * sizeof *args);
  if (args) {
    args[0] = d;
    args[1] = s;
  }
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  s->next = d->submissions;
  d->submissions = s;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  prune_submissions(d);
  if (!args || pthread_create(&s->supervisor, NULL, supervise, args) != 0) {
    common_free(args);
    kill(pid, SIGKILL);
    status = FL_ERR(FL_ENOMEM, "cannot supervise the job");
    s = NULL; /* listed: freed with the driver */
    goto cleanup;
  }
  common_log(LOG_INFO, "job binary %llu (%s) started as pid %d", (unsigned long long)s->id, req->name, (int)pid);
  Flint__SubmitReply reply = FLINT__SUBMIT_REPLY__INIT;
  reply.submission_id = s->id;
  s = NULL;
  status = proto_pack(&reply.base, response);
cleanup:
  for (int i = 0; i < 2; i++) {
    if (out_pipe[i] >= 0) close(out_pipe[i]);
    if (err_pipe[i] >= 0) close(err_pipe[i]);
  }
  common_free(s);
  common_free(argv);
  flint__submit_request__free_unpacked(req, NULL);
  return status;
}

/* `flint submit` was interrupted: its job binary ends (SIGTERM, which `flint submit
 * --in-process` takes as a kill), and its application with it. */
fl_status submissions_handle_cancel(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__CancelSubmissionRequest, req, body, "CancelSubmission");
  uint64_t id = req->submission_id;
  flint__cancel_submission_request__free_unpacked(req, NULL);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = d->submissions;
  while (s && s->id != id) s = s->next;
  bool running = s && !s->exited;
  if (running) {
    s->killed = true; /* --status says "killed", as after --kill */
    kill(s->pid, SIGTERM); /* reaped by its supervisor thread, under this lock */
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (!s) return FL_ERR(FL_ENOENT, "no job binary %llu on this driver", (unsigned long long)id);
  if (running) common_log(LOG_INFO, "job binary %llu cancelled by its submitter", (unsigned long long)id);
  return driver_empty_reply(response);
}

/* The submission `id` (d->lock held), or NULL. */
static submission *find_submission(driver_state *d, uint64_t id) {
  submission *s = d->submissions;
  while (s && s->id != id) s = s->next;
  return s;
}

pid_t submissions_pid(driver_state *d, uint64_t id) {
  submission *s = find_submission(d, id);
  return s && !s->exited ? s->pid : 0;
}

/* Fills info from s (d->lock held); info points into s. */
static void describe(const submission *s, Flint__SubmissionInfo *info) {
  info->submission_id = s->id;
  info->name = (char *)s->name;
  info->app_name = (char *)s->app_name;
  info->state = !s->exited ? "running"
                : s->killed ? "killed"
                : s->signal || s->exit_code ? "failed"
                            : "finished";
  info->exit_code = s->exit_code;
  info->signal = s->signal;
  info->seconds = (double)((s->exited ? s->ended_ns : common_now_ns()) - s->started_ns) / 1e9;
  info->stdout_bytes = s->out.len;
  info->stderr_bytes = s->err.len;
}

static fl_status unknown_submission(uint64_t id) {
  return FL_ERR(FL_ENOENT, "no job binary %llu on this driver (`flint status` lists its applications)",
                (unsigned long long)id);
}

size_t submissions_count(driver_state *d) {
  size_t n = 0;
  for (submission *s = d->submissions; s; s = s->next) n++;
  return n;
}

void submissions_describe(driver_state *d, Flint__SubmissionInfo *infos, Flint__SubmissionInfo **ptrs) {
  size_t n = submissions_count(d);
  for (submission *s = d->submissions; s; s = s->next) { /* newest first: fill from the end */
    n--;
    flint__submission_info__init(&infos[n]);
    describe(s, &infos[n]);
    ptrs[n] = &infos[n];
  }
}

fl_status submissions_handle_status(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__SubmissionRequest, req, body, "SubmissionStatus");
  uint64_t id = req->submission_id;
  flint__submission_request__free_unpacked(req, NULL);
  fl_status st;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = find_submission(d, id);
  if (!s) {
    st = unknown_submission(id);
  } else {
    Flint__SubmissionInfo info = FLINT__SUBMISSION_INFO__INIT;
    describe(s, &info);
    st = proto_pack(&info.base, response);
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return st;
}

/* Waits (d->lock held) until s has exited, the call is cancelled or `deadline` passes. */
static void wait_exited(driver_state *d, submission *s, uint64_t deadline, const rpc_request *call) {
  while (!s->exited && common_now_ns() < deadline && !atomic_load(call->cancelled)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&d->changed, &d->lock, &ts);
  }
}

/* `flint submit --kill ID`: SIGTERM, and SIGKILL for a job binary that outlives
 * KILL_GRACE_MS (one that handles SIGTERM itself). Signalled under the lock while it has not
 * exited, so never a pid that another process has taken since (see supervise). Answers once it
 * has ended, so that the submitter's next --status says "killed". */
fl_status submissions_handle_kill(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__SubmissionRequest, req, body, "KillSubmission");
  uint64_t id = req->submission_id;
  flint__submission_request__free_unpacked(req, NULL);
  fl_status st;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = find_submission(d, id);
  if (!s) {
    st = unknown_submission(id);
    goto done;
  }
  Flint__KillSubmissionReply reply = FLINT__KILL_SUBMISSION_REPLY__INIT;
  reply.was_running = !s->exited;
  if (reply.was_running) {
    s->killed = true;
    kill(s->pid, SIGTERM);
    common_log(LOG_INFO, "job binary %llu is being killed (flint submit --kill)", (unsigned long long)id);
    wait_exited(d, s, common_now_ns() + KILL_GRACE_MS * 1000000ull, call);
    if (!s->exited && !atomic_load(call->cancelled)) {
      common_log(LOG_WARN, "job binary %llu outlived SIGTERM by %d ms: SIGKILL", (unsigned long long)id,
                 KILL_GRACE_MS);
      kill(s->pid, SIGKILL);
      wait_exited(d, s, common_now_ns() + KILL_GRACE_MS * 1000000ull, call);
    }
  }
  Flint__SubmissionInfo info = FLINT__SUBMISSION_INFO__INIT;
  describe(s, &info);
  reply.info = &info;
  st = proto_pack(&reply.base, response);
done:
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return st;
}

fl_status submissions_handle_output(driver_state *d, fl_bytes body, fl_buf *response,
                                    const rpc_request *call) {
  UNPACK(Flint__OutputRequest, req, body, "Output");
  uint32_t wait_ms = req->wait_ms < MAX_WAIT_MS ? req->wait_ms : MAX_WAIT_MS;
  uint64_t deadline = common_now_ns() + (uint64_t)wait_ms * 1000000u;
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  submission *s = find_submission(d, req->submission_id);
  if (!s) {
    st = unknown_submission(req->submission_id);
  } else {
    while (!s->exited && s->out.len <= req->stdout_offset && s->err.len <= req->stderr_offset &&
           common_now_ns() < deadline && !atomic_load(call->cancelled)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 50000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&d->changed, &d->lock, &ts);
    }
    Flint__OutputReply reply = FLINT__OUTPUT_REPLY__INIT;
    if (req->stdout_offset < s->out.len)
      reply.stdout_data = (ProtobufCBinaryData){s->out.len - req->stdout_offset, s->out.data + req->stdout_offset};
    if (req->stderr_offset < s->err.len)
      reply.stderr_data = (ProtobufCBinaryData){s->err.len - req->stderr_offset, s->err.data + req->stderr_offset};
    /* Exited only once all of the output has been read. */
    reply.exited = s->exited;
    reply.exit_code = s->exit_code;
    reply.signal = s->signal;
    st = proto_pack(&reply.base, response);
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  flint__output_request__free_unpacked(req, NULL);
  return st;
}

void submissions_stop(driver_state *d) {
  for (submission *s = d->submissions; s; s = s->next)
    if (!s->exited) kill(s->pid, SIGTERM);
  for (submission *s = d->submissions; s; s = s->next)
    if (s->supervisor) pthread_join(s->supervisor, NULL);
  while (d->submissions) {
    submission *s = d->submissions;
    d->submissions = s->next;
    fl_buf_free(&s->out);
    fl_buf_free(&s->err);
    common_free(s);
  }
}
