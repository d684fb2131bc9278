/*
 * test_processes: integration tests with real processes on 127.0.0.1. A `flint driver` and
 * `flint executor`s run as a user runs them; `flint submit` and `flint status` talk to them;
 * and raw control-plane calls (net/rpc_client.c) send the driver hand-made bytes: garbage,
 * oversized and ill-formed messages, and calls without the shared secret.
 *
 * Binaries: $FLINT_BIN (ctest sets it to <build>/bin) holds flint, pi.so, job_echo.so,
 * job_crash.so and job_lines.so; else this test's own folder. Processes start, stop and are cleaned up
 * through proc_harness (each test bounded by its watchdog); tests check that processes that
 * end leave nothing behind.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proc_harness.h"
#include "tls_certs.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "driver/driver.h" /* DRIVER_MAX_MESSAGE */
#include "net/net.h"
#include "proto/flint.pb-c.h"

#define RPC_TIMEOUT_MS 20000
#define MAX_CHANNELS 8
#define SECRET "s3cret"

/* Raw channels of the running test, closed by its teardown. */
static rpc_channel *channels[MAX_CHANNELS];
static int num_channels;

static const char *const with_secret[] = {"FLINT_SECRET=" SECRET, NULL};
static const char *const wrong_secret[] = {"FLINT_SECRET=not-" SECRET, NULL};

static int setup(void **state) { return harness_setup(state); }

static int teardown(void **state) {
  for (int i = 0; i < num_channels; i++) rpc_channel_destroy(channels[i]);
  num_channels = 0;
  tls_env_off(); /* a failed test_encryption may leave it on */
  return harness_teardown(state);
}

/* ---- raw calls ------------------------------------------------------------------------- */

/* A channel to the driver, closed by the teardown. */
static rpc_channel *channel(const char *secret, size_t max_message) {
  assert_true(num_channels < MAX_CHANNELS);
  rpc_channel *c;
  assert_ok(rpc_channel_create(fx.target, secret, max_message, &c));
  channels[num_channels++] = c;
  return c;
}

static void pack(const ProtobufCMessage *msg, fl_buf *out) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  assert_ok(fl_buf_reserve(out, n ? n : 1));
  out->len = protobuf_c_message_pack(msg, out->data);
}

/* Calls a driver method with raw bytes; the reply (on success) replaces *reply. */
static fl_status call_bytes(rpc_channel *c, const char *method, const void *data, size_t len, fl_buf *reply) {
  return rpc_call(c, method, (fl_bytes){(const uint8_t *)data, len}, RPC_TIMEOUT_MS, reply);
}

/* Calls a driver method with a message. */
static fl_status call_msg(rpc_channel *c, const char *method, const ProtobufCMessage *msg, fl_buf *reply) {
  fl_buf body = FL_BUF_INIT;
  pack(msg, &body);
  fl_status st = call_bytes(c, method, body.data, body.len, reply);
  fl_buf_free(&body);
  return st;
}

/* Asserts that a call failed with `code` and a message containing `needle`. */
static void expect_failure(fl_status st, fl_status code, const char *needle, const char *what) {
  const char *msg = fl_last_error();
  if (st != code || !strstr(msg, needle))
    fprintf(stderr, "%s: expected %s with '%s', got %s: '%s'\n", what, fl_status_name(code), needle,
            fl_status_name(st), st == FL_OK ? "" : msg);
  assert_int_equal(st, code);
  assert_non_null(strstr(msg, needle));
}

/* The driver's Status, with the number of executors it lists; the caller frees it. */
static Flint__StatusReply *driver_status(rpc_channel *c) {
  Flint__Empty e = FLINT__EMPTY__INIT;
  fl_buf reply = FL_BUF_INIT;
  assert_ok(call_msg(c, "/flint.Driver/Status", &e.base, &reply));
  Flint__StatusReply *r = flint__status_reply__unpack(NULL, reply.len, reply.data);
  fl_buf_free(&reply);
  assert_non_null(r);
  return r;
}

/* Waits until the driver lists `n` live executors (they register by themselves). */
static void wait_executors(const char *secret, size_t n) {
  rpc_channel *c = channel(secret, 0);
  double deadline = now_s() + START_LIMIT_S;
  for (;;) {
    Flint__StatusReply *r = driver_status(c);
    size_t alive = 0;
    for (size_t i = 0; i < r->n_executors; i++) alive += r->executors[i]->alive;
    flint__status_reply__free_unpacked(r, NULL);
    if (alive == n) return;
    assert_true(alive < n);
    for (int i = 0; i < fx.num_procs; i++) expect_running(&fx.procs[i]);
    if (now_s() > deadline) fail_msg("%zu of %zu executors registered within %d s", alive, n, START_LIMIT_S);
    sleep_ms(50);
  }
}

/* Reads a job binary's output through the driver's Output call until it exits; returns its
 * exit status (128 + N for signal N) and appends its streams to out and err. */
static int wait_submission(rpc_channel *c, uint64_t id, fl_buf *out, fl_buf *err) {
  double deadline = now_s() + 30;
  for (;;) {
    Flint__OutputRequest req = FLINT__OUTPUT_REQUEST__INIT;
    req.submission_id = id;
    req.stdout_offset = out->len;
    req.stderr_offset = err->len;
    req.wait_ms = 1000;
    fl_buf reply = FL_BUF_INIT;
    assert_ok(call_msg(c, "/flint.Driver/Output", &req.base, &reply));
    Flint__OutputReply *o = flint__output_reply__unpack(NULL, reply.len, reply.data);
    fl_buf_free(&reply);
    assert_non_null(o);
    assert_ok(fl_buf_append(out, o->stdout_data.data, o->stdout_data.len));
    assert_ok(fl_buf_append(err, o->stderr_data.data, o->stderr_data.len));
    bool done = o->exited && !o->stdout_data.len && !o->stderr_data.len;
    int code = o->signal ? 128 + o->signal : o->exit_code;
    flint__output_reply__free_unpacked(o, NULL);
    if (done) return code;
    if (now_s() > deadline) fail_msg("job binary %llu did not end within 30 s", (unsigned long long)id);
  }
}

static bool buf_has(const fl_buf *b, const char *needle) {
  return memmem(b->data, b->len, needle, strlen(needle)) != NULL;
}

/* ---- 1. job binaries round trip -------------------------------------------------------- */

static void test_job_binary_round_trip(void **state) {
  (void)state;
  start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(NULL, 2);

  /* The job's stdout streams back and its status is flint's. */
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "100000", "4");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  EXPECT_OUT(r, "(100000 samples, 4 partitions)");
  free(r);

  /* Both streams, apart, and the job's own exit status. */
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_echo.so"), "hello", "world");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_echo args: hello world\n");
  EXPECT_OUT(r, "job_echo count: 10\n");
  EXPECT_ERR(r, "job_echo: this line goes to stderr\n");
  EXPECT_NO_OUT(r, "stderr");
  EXPECT_NO_ERR(r, "job_echo args");
  EXPECT_NO_ERR(r, "killed");
  free(r);

  /* Detached: an id at once, while the job (waiting for a file the test makes) still runs. */
  char release[PATH_MAX + 64];
  snprintf(release, sizeof release, "%s", test_file("release-detached"));
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"), "--until-file", release,
            "detached");
  expect_status(r, 0);
  unsigned long long id = 0;
  char tail = 0;
  if (sscanf(r->out, "submitted job binary %llu%c", &id, &tail) != 2 || tail != '\n') dump(r);
  assert_int_equal(tail, '\n');
  assert_int_equal(id, 3); /* the third job binary of this driver */
  assert_int_equal(r->err_len, 0);
  free(r);

  rpc_channel *c = channel(NULL, 0);
  Flint__OutputRequest req = FLINT__OUTPUT_REQUEST__INIT;
  req.submission_id = id;
  fl_buf reply = FL_BUF_INIT;
  assert_ok(call_msg(c, "/flint.Driver/Output", &req.base, &reply));
  Flint__OutputReply *o = flint__output_reply__unpack(NULL, reply.len, reply.data);
  assert_non_null(o);
  bool exited = o->exited;
  flint__output_reply__free_unpacked(o, NULL);
  fl_buf_free(&reply);
  assert_false(exited); /* submit did not wait for it: it waits for the file still */
  test_write_file(release, "", 0);

  /* It runs to its end without its submitter. */
  fl_buf out = FL_BUF_INIT, err = FL_BUF_INIT;
  assert_int_equal(wait_submission(c, id, &out, &err), 3);
  assert_true(buf_has(&out, "job_echo args: detached\n"));
  assert_true(buf_has(&out, "job_echo count: 10\n"));
  assert_true(buf_has(&err, "job_echo: this line goes to stderr\n"));
  fl_buf_free(&out);
  fl_buf_free(&err);

  stop_all();
  fx.passed = true;
}

/* ---- 1b. detached submissions: --status, --logs, --kill ------------------------------- */

/* Runs `flint submit --master M --status ID` until its "state: " line is not `state`; returns
 * the last result (the caller frees it). */
static run_result *status_until_not(unsigned id, const char *state) {
  char id_text[16], line[64];
  snprintf(id_text, sizeof id_text, "%u", id);
  snprintf(line, sizeof line, "state: %s\n", state);
  double deadline = now_s() + 30;
  for (;;) {
    run_result *r = FLINT(NULL, "submit", "--master", fx.master, "--status", id_text);
    expect_status(r, 0);
    if (!strstr(r->out, line)) return r;
    if (now_s() > deadline) fail_msg("submission %u was still %s after 30 s", id, state);
    free(r);
    sleep_ms(50);
  }
}

static void test_detached_status_logs_kill(void **state) {
  (void)state;
  start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(NULL, 1);

  /* 1: waits for a file that never comes, until killed. */
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, "--detach", "--name=watched", bin_file("job_echo.so"),
                        "--until-file", test_file("never"), "one");
  expect_status(r, 0);
  EXPECT_OUT(r, "submitted job binary 1\n");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--status", "1");
  expect_status(r, 0);
  EXPECT_OUT(r, "submission: 1\nname: job_echo.so\napplication: watched\nstate: running\n");
  EXPECT_NO_OUT(r, "exit status");
  assert_int_equal(r->err_len, 0);
  free(r);

  /* Its output so far, each stream to its own; the same again while nothing more comes. */
  double deadline = now_s() + 30;
  for (;;) {
    r = FLINT(NULL, "submit", "--master", fx.master, "--logs=1");
    expect_status(r, 0);
    if (strstr(r->out, "job_echo args: one\n") && strstr(r->err, "job_echo: this line goes to stderr\n")) break;
    if (now_s() > deadline) dump(r);
    assert_true(now_s() < deadline);
    free(r);
    sleep_ms(50);
  }
  assert_string_equal(r->out, "job_echo args: one\n");
  assert_string_equal(r->err, "job_echo: this line goes to stderr\n");
  free(r);

  /* Killed: at once, its state says so, and its output stays readable. */
  r = FLINT(NULL, "submit", "--master", fx.master, "--kill", "1");
  expect_status(r, 0);
  EXPECT_OUT(r, "killed submission 1\n");
  assert_true(r->seconds < 60); /* only a hang exceeds it */
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--status", "1");
  expect_status(r, 0);
  EXPECT_OUT(r, "state: killed\nsignal: 15 (");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "1");
  expect_status(r, 0);
  assert_string_equal(r->out, "job_echo args: one\n");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--kill", "1");
  expect_status(r, 1);
  EXPECT_ERR(r, "flint submit: submission 1 had already ended (killed, signal 15)\n");
  free(r);

  /* 2: ignores SIGTERM, so that the kill's SIGKILL ends it, 5 s later. */
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"), "--ignore-term",
            "--until-file", test_file("never"), "stubborn");
  expect_status(r, 0);
  EXPECT_OUT(r, "submitted job binary 2\n");
  free(r);
  deadline = now_s() + 30;
  for (;;) { /* SIGTERM ignored once its output shows */
    r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "2");
    expect_status(r, 0);
    if (strstr(r->out, "job_echo args: stubborn\n")) break;
    assert_true(now_s() < deadline);
    free(r);
    sleep_ms(50);
  }
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--kill", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "killed submission 2\n");
  assert_true(r->seconds < 60); /* only a hang exceeds it; SIGKILL's use shows in the status */
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--status", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "state: killed\nsignal: 9 (");
  free(r);

  /* 3: runs to its end, with status 3: failed. 4: pi, status 0: finished. */
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"), "two");
  expect_status(r, 0);
  EXPECT_OUT(r, "submitted job binary 3\n");
  free(r);
  r = status_until_not(3, "running");
  EXPECT_OUT(r, "application: job_echo.so\nstate: failed\nexit status: 3\n");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  free(r);
  r = status_until_not(4, "running");
  EXPECT_OUT(r, "name: pi.so\napplication: pi.so\nstate: finished\nexit status: 0\n");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "4");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--kill", "4");
  expect_status(r, 1);
  EXPECT_ERR(r, "flint submit: submission 4 had already ended (finished, exit status 0)\n");
  free(r);

  /* 5: an attached submitter interrupted (Ctrl-C) stops its job, which then reads killed. */
  proc *submitter = start_proc("submitter", NULL,
                               (const char *const[]){"submit", "--master", fx.master, bin_file("job_echo.so"),
                                                     "--until-file", test_file("never"), "five", NULL});
  wait_log(submitter, "job_echo args: five\n");
  assert_int_equal(stop_proc(submitter, SIGINT), 128 + SIGTERM);
  r = status_until_not(5, "running");
  EXPECT_OUT(r, "state: killed\nsignal: 15 (");
  free(r);

  /* Unknown ids: a failure, named. */
  const char *verbs[] = {"--status", "--logs", "--kill"};
  for (int i = 0; i < 3; i++) {
    r = FLINT(NULL, "submit", "--master", fx.master, verbs[i], "99");
    expect_status(r, 1);
    EXPECT_ERR(r, "flint submit: ");
    EXPECT_ERR(r, "no job binary 99 on this driver");
    assert_int_equal(r->out_len, 0);
    free(r);
  }

  /* 6: --logs ID --follow prints the output as it comes and exits with the submission's
   * status once it ends; a follower interrupted stops following, not the submission. */
  const char *go = test_file("go6");
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"), "--until-file", go, "six");
  expect_status(r, 0);
  EXPECT_OUT(r, "submitted job binary 6\n");
  free(r);
  proc *follower = start_proc("follower", NULL,
                              (const char *const[]){"submit", "--master", fx.master, "--logs", "6", "--follow", NULL});
  proc *quitter = start_proc("quitter", NULL,
                             (const char *const[]){"submit", "--master", fx.master, "--logs=6", "-f", NULL});
  wait_log(follower, "job_echo args: six\n");
  wait_log(quitter, "job_echo args: six\n");
  assert_int_equal(kill(quitter->pid, SIGINT), 0);
  assert_int_equal(wait_exit(quitter->pid, STOP_LIMIT_S), 130);
  quitter->pid = 0;
  wait_log(quitter, "stopped following job binary 6, which goes on (--kill 6 ends it)\n");
  r = FLINT(NULL, "submit", "--master", fx.master, "--status", "6");
  EXPECT_OUT(r, "state: running\n");
  free(r);
  FILE *f = fopen(go, "w"); /* the job goes on to its end */
  assert_non_null(f);
  fclose(f);
  assert_int_equal(wait_exit(follower->pid, CMD_LIMIT_S), 3);
  follower->pid = 0;
  wait_log(follower, "job_echo count: 10\n");
  char *log = slurp(follower->log);
  assert_non_null(strstr(log, "job_echo: this line goes to stderr\n"));
  const char *first = strstr(log, "job_echo args: six\n");
  assert_null(strstr(first + 1, "job_echo args: six\n")); /* each line once */
  free(log);
  /* Ended already: its whole output at once, and its status. */
  r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "3", "-f");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_echo args: two\njob_echo count: 10\n");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "2", "--follow");
  expect_status(r, 128 + SIGKILL);
  EXPECT_ERR(r, "killed by signal 9");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--logs", "99", "--follow");
  expect_status(r, 1);
  EXPECT_ERR(r, "no job binary 99 on this driver");
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--status", "1", "--follow");
  expect_status(r, 2);
  EXPECT_ERR(r, "--follow (-f) goes with --logs ID");
  free(r);

  stop_all();
  fx.passed = true;
}

/* ---- 2. a crashing job ----------------------------------------------------------------- */

static void test_crashing_job(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(NULL, 2);

  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_crash.so"));
  expect_status(r, 128 + SIGSEGV);
  EXPECT_OUT(r, "job_crash: about to crash\n");
  EXPECT_ERR(r, "killed by signal 11");
  free(r);

  /* The driver outlives its job and still serves. */
  expect_running(driver);
  r = FLINT(NULL, "status", "--master", fx.master);
  expect_status(r, 0);
  EXPECT_OUT(r, "executors: 2\n");
  EXPECT_OUT(r, "applications: 1\n"); /* the crashed job's */
  free(r);
  char *log = slurp(driver->log);
  bool logged = strstr(log, "job binary 1 was killed by signal 11") != NULL;
  if (!logged) fprintf(stderr, "the driver's log does not tell of the crash:\n%s", log);
  free(log);
  assert_true(logged);

  /* And runs the next job. */
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  free(r);

  stop_all();
  fx.passed = true;
}

/* The application of the newest running job on the driver (0: none), and that job's state
 * and error of the application `app` when it is given. */
static uint64_t running_app(rpc_channel *c) {
  uint64_t app_id = 0;
  Flint__StatusReply *st = driver_status(c);
  for (size_t i = 0; i < st->n_applications; i++) {
    Flint__AppInfo *a = st->applications[i];
    if (a->n_jobs && strcmp(a->jobs[a->n_jobs - 1]->state, "running") == 0) app_id = a->id;
  }
  flint__status_reply__free_unpacked(st, NULL);
  return app_id;
}

static uint64_t wait_running_app(rpc_channel *c) {
  double deadline = now_s() + 20;
  uint64_t app_id;
  while (!(app_id = running_app(c))) {
    if (now_s() > deadline) fail_msg("no job ran within 20 s");
    sleep_ms(20);
  }
  return app_id;
}

/* Another client closes an application while the driver runs its job (application ids are
 * sequential, so any client can name one): the close cancels the job, whose task waits for a
 * file that the test makes only afterwards, and returns without waiting for the task; the
 * job binary sees its action cancelled; the driver lives on and runs the next job. */
static void test_close_while_a_job_runs(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(NULL, 2);
  char release[PATH_MAX + 64];
  snprintf(release, sizeof release, "%s", test_file("release-closed"));
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"),
                        "--slow-until-file", release, "closed");
  expect_status(r, 0);
  EXPECT_OUT(r, "submitted job binary 1\n");
  free(r);

  rpc_channel *c = channel(NULL, 0);
  uint64_t app_id = wait_running_app(c);
  double t0 = now_s();
  Flint__StatusReply *listed = driver_status(c);
  Flint__AppRequest close_req = FLINT__APP_REQUEST__INIT;
  close_req.app_id = app_id;
  close_req.incarnation = listed->incarnation;
  flint__status_reply__free_unpacked(listed, NULL);
  fl_buf reply = FL_BUF_INIT;
  assert_ok(call_msg(c, "/flint.Driver/CloseApplication", &close_req.base, &reply));
  /* It returned while the task still waits for the file: it did not wait for the task. */
  fprintf(stderr, "the close returned after %.1f s\n", now_s() - t0);
  fl_buf_free(&reply);

  fl_buf out = FL_BUF_INIT, err = FL_BUF_INIT;
  assert_int_equal(wait_submission(c, 1, &out, &err), 1);
  test_write_file(release, "", 0); /* the executor's task ends (its result unused) */
  if (!buf_has(&err, "cancelled"))
    fprintf(stderr, "stdout:\n%.*s\nstderr:\n%.*s\n", (int)out.len, (char *)out.data, (int)err.len,
            (char *)err.data);
  assert_true(buf_has(&err, "cancelled"));
  assert_false(buf_has(&out, "job_echo count"));
  fl_buf_free(&out);
  fl_buf_free(&err);

  expect_running(driver);
  Flint__StatusReply *st = driver_status(c);
  assert_int_equal(st->n_applications, 1);
  assert_string_equal(st->applications[0]->state, "finished");
  flint__status_reply__free_unpacked(st, NULL);
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  free(r);
  stop_all();
  fx.passed = true;
}

/* A client killed (SIGKILL) while the driver runs its job: the dropped connection cancels
 * the job, whose task waits for a file that the test makes only afterwards, so the job cannot
 * end by itself; the driver records it as cancelled and lives on. (The executor's thread
 * waits on: user code is not interrupted, only stopped at its next batch.) */
static void test_client_going_away_cancels_its_job(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(NULL, 2);
  char release[PATH_MAX + 64];
  snprintf(release, sizeof release, "%s", test_file("release-gone"));
  /* An ordinary client process (not one the driver supervises). */
  proc *client = start_proc("client", NULL,
                            (const char *const[]){"submit", "--in-process", "--master", fx.master,
                                                  bin_file("job_echo.so"), "--slow-until-file", release,
                                                  "gone", NULL});
  rpc_channel *c = channel(NULL, 0);
  uint64_t app_id = wait_running_app(c);
  assert_int_equal(kill(client->pid, SIGKILL), 0);
  assert_true(wait_exit(client->pid, STOP_LIMIT_S) >= 0);
  client->pid = 0;

  /* 30 s: only a hang takes that long, as nothing else ends the job. */
  double t0 = now_s(), deadline = t0 + 30;
  bool cancelled = false;
  while (!cancelled) {
    Flint__StatusReply *st = driver_status(c);
    for (size_t i = 0; i < st->n_applications; i++) {
      Flint__AppInfo *a = st->applications[i];
      if (a->id != app_id || !a->n_jobs) continue;
      Flint__JobInfo *j = a->jobs[a->n_jobs - 1];
      cancelled = strcmp(j->state, "failed") == 0 && strstr(j->error, "cancelled");
    }
    flint__status_reply__free_unpacked(st, NULL);
    if (!cancelled && now_s() > deadline) fail_msg("the job of a killed client still runs after 30 s");
    if (!cancelled) sleep_ms(50);
  }
  fprintf(stderr, "the job was cancelled %.1f s after its client died\n", now_s() - t0);
  test_write_file(release, "", 0); /* the executor's task ends */
  expect_running(driver);
  stop_all();
  fx.passed = true;
}

/* ---- 3. flint status ------------------------------------------------------------------- */

/* The executors' lines of `flint status`: their number, and the sum of their tasks. */
static size_t parse_executors(const char *text, unsigned long long *tasks, unsigned long long *failed) {
  *tasks = *failed = 0;
  size_t n = 0;
  const char *p = strstr(text, "executors: ");
  if (!p) return 0;
  p = strchr(p, '\n');                /* the count */
  p = p ? strchr(p + 1, '\n') : NULL; /* the header */
  while (p && strncmp(p + 1, "  ", 2) == 0) {
    unsigned long long id, mem, cached, t, f;
    unsigned cores;
    char addr[64];
    if (sscanf(p + 1, " %llu %63s %u %lluMi %lluKi %llu %llu", &id, addr, &cores, &mem, &cached, &t, &f) != 7)
      break;
    assert_int_equal(strncmp(addr, "127.0.0.1:", 10), 0);
    assert_int_equal(cores, 1);
    assert_int_equal(mem, 256);
    *tasks += t;
    *failed += f;
    n++;
    p = strchr(p + 1, '\n');
  }
  return n;
}

static void test_status_output(void **state) {
  (void)state;
  start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(NULL, 2);

  run_result *r = FLINT(NULL, "status", "--master", fx.master);
  expect_status(r, 0);
  EXPECT_OUT(r, "web UI: http://127.0.0.1:"); /* the driver's, on the host dialled */
  EXPECT_OUT(r, "executors: 2\n");
  EXPECT_OUT(r, "applications: 0\n");
  free(r);

  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "100000", "4");
  expect_status(r, 0);
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--name", "echo job", bin_file("job_echo.so"), "x");
  expect_status(r, 3);
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_lines.so"), "3");
  expect_status(r, 0);
  free(r);

  /* Executors report their task counts with their heartbeats (every second). */
  double deadline = now_s() + 20;
  unsigned long long tasks = 0, failed = 0;
  for (;;) {
    r = FLINT(NULL, "status", "--master", fx.master);
    expect_status(r, 0);
    size_t n = parse_executors(r->out, &tasks, &failed);
    if (n != 2) dump(r);
    assert_int_equal(n, 2);
    if (tasks >= 12 || now_s() > deadline) break;
    free(r);
    sleep_ms(200);
  }
  if (tasks != 12 || failed != 0) dump(r);
  assert_int_equal(tasks, 12); /* pi's 4, job_echo's 2 and job_lines' 3 times 2 */
  assert_int_equal(failed, 0);
  EXPECT_OUT(r, "cores");
  EXPECT_OUT(r, "memory");
  EXPECT_OUT(r, "tasks");
  EXPECT_OUT(r, "applications: 3\n");
  /* Each application is named after its job (or --name) and lists each of its jobs: every
   * job's record had id 0 and took the last one's place, and every name was "flint". */
  EXPECT_OUT(r, "  1 pi.so (finished), 1 recent jobs\n    job 1: succeeded, 4 tasks\n");
  EXPECT_OUT(r, "  2 echo job (finished), 1 recent jobs\n    job 1: succeeded, 2 tasks\n");
  EXPECT_OUT(r, "  3 job_lines.so (finished), 3 recent jobs\n    job 1: succeeded, 2 tasks\n"
                "    job 2: succeeded, 2 tasks\n    job 3: succeeded, 2 tasks\n");
  /* The job binaries, by their ids (flint submit --status ID), oldest first. */
  EXPECT_OUT(r, "submissions: 3\n  1 pi.so (application pi.so): finished, exit status 0, ");
  EXPECT_OUT(r, "\n  2 job_echo.so (application echo job): failed, exit status 3, ");
  EXPECT_OUT(r, "\n  3 job_lines.so (application job_lines.so): finished, exit status 0, ");
  free(r);

  stop_all();
  fx.passed = true;
}

/* A job binary's stdout reaches its submitter line by line, as it is written, not at the
 * job's end (C buffers a pipe in blocks); and when the driver dies (kill -9), the submitter
 * keeps what came, says that the driver was lost and ends, and the job binary ends too. */
static void test_job_output_streams_and_driver_loss(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(NULL, 1);
  /* The file is never made: the job waits (60 s) until its driver's end ends it. */
  proc *submitter = start_proc("submitter", NULL,
                               (const char *const[]){"submit", "--master", fx.master, bin_file("job_lines.so"), "2",
                                                     test_file("never"), NULL});
  wait_log(submitter, "job_lines action 1: 10\njob_lines action 2: 10\njob_lines waiting\n");
  expect_running(submitter);
  int job_pid = 0;
  char *log = slurp(driver->log);
  const char *at = strstr(log, "job binary 1 (job_lines.so) started as pid ");
  if (at) job_pid = atoi(at + strlen("job binary 1 (job_lines.so) started as pid "));
  free(log);
  assert_true(job_pid > 0);

  assert_int_equal(kill(driver->pid, SIGKILL), 0);
  assert_true(wait_exit(driver->pid, STOP_LIMIT_S) >= 0);
  driver->pid = 0;
  int status = wait_exit(submitter->pid, STOP_LIMIT_S);
  char *text = slurp(submitter->log);
  if (status != 1) fprintf(stderr, "flint submit ended with %d; its output:\n%s\n", status, text);
  assert_int_equal(status, 1);
  submitter->pid = 0;
  assert_non_null(strstr(text, "job_lines waiting\n"));
  assert_non_null(strstr(text, "flint submit: lost the driver at "));
  assert_non_null(strstr(text, "while job binary 1 ran"));
  free(text);
  /* The job binary ends with its driver, whose stop could not end it. */
  double deadline = now_s() + STOP_LIMIT_S;
  while (kill(job_pid, 0) == 0 && now_s() < deadline) sleep_ms(20);
  errno = 0;
  assert_int_equal(kill(job_pid, 0), -1);
  assert_int_equal(errno, ESRCH);
  /* The executor stays for another driver; its stop is checked as usual. */
  stop_all();
  fx.passed = true;
}

/* A program on local-cluster[...] killed by SIGTERM (it has no handler; nor would SIGKILL)
 * leaves nothing behind: its driver and executor end with it (PDEATHSIG), and the last of
 * them removes the cluster's folder, which the program's close would have removed. */
static void test_local_cluster_killed_leaves_no_folder(void **state) {
  (void)state;
  proc *program = start_proc("program", NULL,
                             (const char *const[]){"submit", "--master", "local-cluster[1,1,256]",
                                                   bin_file("job_echo.so"), "--until-file", test_file("never"),
                                                   "waiting", NULL});
  wait_log(program, "job_echo args: waiting\n"); /* the cluster runs: the job waits */
  assert_int_equal(count_prefixed(fx.dir, "flint-cluster-"), 1);
  assert_int_equal(kill(program->pid, SIGTERM), 0);
  assert_int_equal(wait_exit(program->pid, STOP_LIMIT_S), 128 + SIGTERM);
  program->pid = 0;
  /* 30 s: only a hang takes so long (before, the folder stayed for good). */
  double deadline = now_s() + 30;
  while (count_prefixed(fx.dir, "flint-cluster-") != 0 && now_s() < deadline) sleep_ms(50);
  assert_int_equal(count_prefixed(fx.dir, "flint-cluster-"), 0);
  fx.passed = true;
}

/* The pids of pid's descendants (from /proc), at most `max`; how many. */
static int descendants(pid_t pid, pid_t *out, int max) {
  int n = 0;
  out[n++] = pid;
  for (int i = 0; i < n; i++) { /* breadth first: out[i]'s children */
    DIR *d = opendir("/proc");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
      pid_t p = (pid_t)atoi(e->d_name);
      if (p <= 0) continue;
      char path[64], stat[512];
      snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      size_t len = fread(stat, 1, sizeof stat - 1, f);
      fclose(f);
      stat[len] = '\0';
      const char *rp = strrchr(stat, ')'); /* the name may hold spaces */
      int ppid = 0;
      if (rp && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == out[i]) out[n++] = p;
    }
    closedir(d);
  }
  memmove(out, out + 1, (size_t)(n - 1) * sizeof *out);
  return n - 1;
}

/* Whether pid runs (a zombie has ended). */
static bool running(pid_t pid) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t len = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[len] = '\0';
  const char *rp = strrchr(stat, ')');
  return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* Ctrl-C at a terminal sends SIGINT to the whole foreground process group: a program on
 * local-cluster[...] that handles it (as the shell does) keeps its cluster, whose processes
 * lead groups of their own; they still end when the program does. */
static void test_local_cluster_outlives_ctrl_c(void **state) {
  (void)state;
  fx.new_group = true; /* the program leads its group, as a shell's foreground job */
  const char *go = test_file("go");
  proc *program = start_proc("program", NULL,
                             (const char *const[]){"submit", "--master", "local-cluster[1,1,64]",
                                                   bin_file("job_echo.so"), "--handle-int", "--until-file", go,
                                                   "waiting", NULL});
  wait_log(program, "job_echo args: waiting\n"); /* the cluster runs: the job waits */
  pid_t cluster[16];
  int n = descendants(program->pid, cluster, 16);
  assert_true(n >= 2); /* the driver and an executor (and its supervised child) */
  assert_int_equal(kill(-program->pid, SIGINT), 0); /* the terminal's Ctrl-C */
  wait_log(program, "job_echo: SIGINT handled\n");
  for (int i = 0; i < n; i++) assert_true(running(cluster[i]));
  /* The job's action runs on the cluster after the Ctrl-C: it would fail without it. */
  FILE *f = fopen(go, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(wait_exit(program->pid, STOP_LIMIT_S + 30), 3);
  program->pid = 0;
  char *log = slurp(program->log);
  if (!strstr(log, "job_echo count: 10\n")) fprintf(stderr, "%s", log);
  assert_non_null(strstr(log, "job_echo count: 10\n"));
  free(log);
  /* 30 s: only a hang takes so long. */
  double deadline = now_s() + 30;
  for (int i = 0; i < n; i++)
    while (running(cluster[i]) && now_s() < deadline) sleep_ms(20);
  for (int i = 0; i < n; i++) assert_false(running(cluster[i]));
  fx.passed = true;
}

/* ---- 4. authentication ----------------------------------------------------------------- */

/* Whether the log has a WARN line that contains `needle`. */
static bool log_warns(const char *log, const char *needle) {
  for (const char *line = log; *line;) {
    const char *end = strchr(line, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char buf[1024];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
    if (strstr(buf, " WARN ") && strstr(buf, needle)) return true;
    line += len + (end ? 1 : 0);
  }
  return false;
}

/* FLINT_TLS: a cluster whose control plane and data plane speak TLS runs jobs whose shuffle
 * crosses executors; a client or executor without TLS, or that trusts another CA, is refused
 * with an error that says so. */
static void test_encryption(void **state) {
  (void)state;
  char certs[256], other[256];
  assert_true(tls_make_certs(certs, sizeof certs, NULL));
  assert_true(tls_make_certs(other, sizeof other, NULL));
  char ca[320], cert[320], key[320], wrong_ca[320];
  snprintf(ca, sizeof ca, "FLINT_TLS_CA=%s/ca.pem", certs);
  snprintf(cert, sizeof cert, "FLINT_TLS_CERT=%s/cert.pem", certs);
  snprintf(key, sizeof key, "FLINT_TLS_KEY=%s/key.pem", certs);
  snprintf(wrong_ca, sizeof wrong_ca, "FLINT_TLS_CA=%s/ca.pem", other);
  const char *const tls[] = {"FLINT_SECRET=" SECRET, "FLINT_TLS=1", ca, cert, key, NULL};
  const char *const untrusting[] = {"FLINT_SECRET=" SECRET, "FLINT_TLS=1", wrong_ca, cert, key, NULL};

  start_driver(tls);
  start_executor("exec1", tls);
  start_executor("exec2", tls);
  tls_env_on(certs); /* this process's raw channel to the driver */
  wait_executors(SECRET, 2);

  /* Cached data and a shuffle across both executors, all of it over TLS. */
  run_result *r = FLINT(tls, "submit", "--master", fx.master, bin_file("job_cache_sum.so"), "3", "4");
  expect_status(r, 0);
  EXPECT_OUT(r, "sum 1498500");
  EXPECT_OUT(r, "shuffled sum 1498500");
  free(r);
  r = FLINT(tls, "status", "--master", fx.master);
  expect_status(r, 0);
  free(r);

  /* A plaintext client, and one that trusts another CA: refused, saying why. */
  r = FLINT(with_secret, "status", "--master", fx.master);
  expect_status(r, 1);
  EXPECT_ERR(r, "TLS");
  free(r);
  r = FLINT(untrusting, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 1);
  EXPECT_ERR(r, "certificate");
  EXPECT_NO_OUT(r, "pi is roughly");
  free(r);

  /* An executor without TLS cannot register, and says why. */
  char work[PATH_MAX + 64];
  snprintf(work, sizeof work, "%s", test_file("plain-work"));
  make_dir(work);
  r = FLINT(with_secret, "executor", "--driver", fx.target, "--cores", "1", "--memory", "64m", "--work-dir", work);
  if (r->status == 0) dump(r);
  assert_int_not_equal(r->status, 0);
  EXPECT_ERR(r, "TLS");
  free(r);

  Flint__StatusReply *st = driver_status(channel(SECRET, 0));
  assert_int_equal(st->n_executors, 2);
  flint__status_reply__free_unpacked(st, NULL);
  tls_env_off();
  stop_all();
  tls_remove_certs(certs);
  tls_remove_certs(other);
  fx.passed = true;
}

static void test_authentication(void **state) {
  (void)state;
  proc *driver = start_driver(with_secret);
  start_executor("exec1", with_secret);
  wait_executors(SECRET, 1);

  /* With the secret, from the environment or a file. */
  run_result *r = FLINT(with_secret, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  free(r);
  char secret_file[PATH_MAX + 32], file_env[PATH_MAX + 64];
  snprintf(secret_file, sizeof secret_file, "%s", test_file("secret"));
  test_write_file(secret_file, SECRET "\n", strlen(SECRET) + 1);
  snprintf(file_env, sizeof file_env, "FLINT_SECRET_FILE=%s", secret_file);
  r = FLINT(((const char *const[]){file_env, NULL}), "submit", "--master", fx.master, bin_file("job_echo.so"),
            "f");
  expect_status(r, 3);
  EXPECT_OUT(r, "job_echo args: f\n");
  free(r);

  /* Without it, or with another one: refused, and the job never runs. */
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 1);
  EXPECT_ERR(r, "authentication");
  EXPECT_NO_OUT(r, "pi is roughly");
  free(r);
  r = FLINT(wrong_secret, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 1);
  EXPECT_ERR(r, "authentication");
  EXPECT_NO_ERR(r, SECRET); /* neither secret is echoed */
  free(r);
  r = FLINT(NULL, "status", "--master", fx.master);
  expect_status(r, 1);
  EXPECT_ERR(r, "authentication");
  free(r);

  /* An executor without the secret cannot register, says why, ends and cleans up. */
  char work[PATH_MAX + 64];
  snprintf(work, sizeof work, "%s", test_file("stranger-work"));
  make_dir(work);
  r = FLINT(NULL, "executor", "--driver", fx.target, "--cores", "1", "--memory", "64m", "--work-dir", work);
  if (r->status == 0) dump(r);
  assert_int_not_equal(r->status, 0);
  EXPECT_ERR(r, "register");
  EXPECT_ERR(r, "authentication");
  assert_true(r->seconds < 30);
  assert_int_equal(count_entries(work), 0);
  free(r);

  /* Raw calls: the same refusal, as FL_EAUTH. */
  fl_buf reply = FL_BUF_INIT;
  Flint__Empty empty = FLINT__EMPTY__INIT;
  expect_failure(call_msg(channel(NULL, 0), "/flint.Driver/Status", &empty.base, &reply), FL_EAUTH,
                 "missing shared secret", "Status without a secret");
  expect_failure(call_msg(channel("not-" SECRET, 0), "/flint.Driver/Status", &empty.base, &reply), FL_EAUTH,
                 "wrong shared secret", "Status with a wrong secret");
  assert_int_equal(reply.len, 0);
  Flint__StatusReply *st = driver_status(channel(SECRET, 0));
  assert_int_equal(st->n_executors, 1); /* the stranger is not among them */
  flint__status_reply__free_unpacked(st, NULL);

  /* The driver logs each refusal as a warning, without the secret. */
  stop_all();
  char *log = slurp(driver->log);
  bool ok = log_warns(log, "refused /flint.Driver/Submit") &&
            log_warns(log, "refused /flint.Driver/RegisterExecutor") &&
            log_warns(log, "refused /flint.Driver/Status") && log_warns(log, "authentication") &&
            !strstr(log, SECRET);
  if (!ok) fprintf(stderr, "the driver's log lacks a warning per refusal, or shows the secret:\n%s", log);
  free(log);
  assert_true(ok);
  fx.passed = true;
}

/* ---- 5. malformed and oversized messages ----------------------------------------------- */

static void test_malformed_messages(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(NULL, 1);
  rpc_channel *c = channel(NULL, 0);
  fl_buf reply = FL_BUF_INIT;

  /* Bytes that no protobuf message decodes from: a field of wire type 7, a varint of 11
   * bytes, a length past the end. */
  static const uint8_t bad_wire_type[] = {0x0f, 0x0f, 0x0f};
  static const uint8_t long_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  static const uint8_t truncated[] = {0x12, 0x7f, 'a', 'b', 'c'};
  static const struct {
    const uint8_t *data;
    size_t len;
  } garbage[] = {{bad_wire_type, sizeof bad_wire_type},
                 {long_varint, sizeof long_varint},
                 {truncated, sizeof truncated}};
  static const char *const methods[] = {
      "RunJob",          "RegisterExecutor", "StatusUpdate", "Submit",        "Heartbeat",
      "OpenApplication", "CloseApplication", "HasLibrary",   "UploadLibrary", "BroadcastPut",
      "BroadcastRemove", "StorageInfo",      "Unpersist",    "Output",        "SubmissionStatus",
      "KillSubmission"};
  for (size_t m = 0; m < sizeof methods / sizeof *methods; m++)
    for (size_t g = 0; g < sizeof garbage / sizeof *garbage; g++) {
      char method[64], what[96];
      snprintf(method, sizeof method, "/flint.Driver/%s", methods[m]);
      snprintf(what, sizeof what, "%s with garbage %zu", methods[m], g);
      expect_failure(call_bytes(c, method, garbage[g].data, garbage[g].len, &reply), FL_EPROTO, "malformed",
                     what);
      assert_non_null(strstr(fl_last_error(), methods[m])); /* the message names the call */
    }
  assert_int_equal(reply.len, 0);

  /* Empty requests decode as messages with every field unset, which each handler refuses. */
  expect_failure(call_bytes(c, "/flint.Driver/RunJob", NULL, 0, &reply), FL_EPROTO, "operation id 0",
                 "empty RunJob");
  expect_failure(call_bytes(c, "/flint.Driver/FetchResult", NULL, 0, &reply), FL_ENOENT,
                 "no running application", "empty FetchResult");
  expect_failure(call_bytes(c, "/flint.Driver/CancelJobs", NULL, 0, &reply), FL_ENOENT,
                 "no running application", "empty CancelJobs");
  expect_failure(call_bytes(c, "/flint.Driver/CancelJobs", long_varint, sizeof long_varint, &reply),
                 FL_EPROTO, "CancelJobs: malformed", "CancelJobs of garbage");
  expect_failure(call_bytes(c, "/flint.Driver/Submit", NULL, 0, &reply), FL_EINVAL, "empty", "empty Submit");
  expect_failure(call_bytes(c, "/flint.Driver/RegisterExecutor", NULL, 0, &reply), FL_EPROTO, "invalid",
                 "empty RegisterExecutor");

  /* Methods the driver does not have. */
  expect_failure(call_bytes(c, "/flint.Driver/NoSuchMethod", "x", 1, &reply), FL_EINVAL, "unknown method",
                 "unknown method");
  expect_failure(call_bytes(c, "/flint.Executor/LaunchTasks", "x", 1, &reply), FL_EINVAL, "unknown method",
                 "executor method");
  expect_failure(call_bytes(c, "/", NULL, 0, &reply), FL_EINVAL, "unknown method", "method /");

  /* Well-formed but wrong. */
  Flint__RunJobRequest run = FLINT__RUN_JOB_REQUEST__INIT;
  uint32_t part0 = 0;
  run.app_id = 999999;
  run.operation_id = 1;
  run.rdd_id = 1;
  run.n_partitions = 1;
  run.partitions = &part0;
  expect_failure(call_msg(c, "/flint.Driver/RunJob", &run.base, &reply), FL_ENOENT, "999999",
                 "RunJob of no application");
  Flint__OutputRequest output = FLINT__OUTPUT_REQUEST__INIT;
  output.submission_id = 424242;
  expect_failure(call_msg(c, "/flint.Driver/Output", &output.base, &reply), FL_ENOENT, "424242",
                 "Output of no job");

  Flint__RegisterExecutorRequest reg = FLINT__REGISTER_EXECUTOR_REQUEST__INIT;
  reg.host = "127.0.0.1";
  reg.rpc_port = 1;
  reg.data_port = 2;
  reg.memory = 256u << 20;
  reg.cores = 0;
  expect_failure(call_msg(c, "/flint.Driver/RegisterExecutor", &reg.base, &reply), FL_EPROTO, "cores",
                 "cores=0");
  reg.cores = 5000;
  expect_failure(call_msg(c, "/flint.Driver/RegisterExecutor", &reg.base, &reply), FL_EPROTO, "cores",
                 "cores=5000");
  reg.cores = 1;
  reg.rpc_port = 70000;
  expect_failure(call_msg(c, "/flint.Driver/RegisterExecutor", &reg.base, &reply), FL_EPROTO, "ports",
                 "port 70000");

  /* An application of our own: a plan of garbage and a dataset it never sent. */
  Flint__OpenApplicationRequest open = FLINT__OPEN_APPLICATION_REQUEST__INIT;
  open.name = "raw";
  assert_ok(call_msg(c, "/flint.Driver/OpenApplication", &open.base, &reply));
  Flint__OpenApplicationReply *opened = flint__open_application_reply__unpack(NULL, reply.len, reply.data);
  assert_non_null(opened);
  uint64_t app_id = opened->app_id, incarnation = opened->incarnation;
  flint__open_application_reply__free_unpacked(opened, NULL);
  assert_true(app_id > 0);
  assert_true(incarnation != 0);
  run.app_id = app_id;
  /* An application id of another driver process (a client of one that died) is refused. */
  run.incarnation = incarnation + 1;
  expect_failure(call_msg(c, "/flint.Driver/RunJob", &run.base, &reply), FL_ENOENT, "earlier driver process",
                 "RunJob of another driver incarnation");
  run.incarnation = incarnation;
  run.plan = (ProtobufCBinaryData){sizeof long_varint, (uint8_t *)long_varint};
  fl_status st = call_msg(c, "/flint.Driver/RunJob", &run.base, &reply);
  if (st == FL_OK) fprintf(stderr, "RunJob with a plan of garbage succeeded\n");
  assert_int_not_equal(st, FL_OK);
  assert_true(fl_last_error()[0] != '\0');
  run.plan = (ProtobufCBinaryData){0, NULL};
  run.rdd_id = 424242;
  expect_failure(call_msg(c, "/flint.Driver/RunJob", &run.base, &reply), FL_EPROTO, "unknown dataset",
                 "RunJob of an unknown dataset");
  /* Small broadcasts come with RunJob: a bad id or one over the size that travels with a job
   * is refused with a message that says which. */
  static uint8_t bcast_bytes[(64 << 10) + 1];
  Flint__InlineBroadcast ib = FLINT__INLINE_BROADCAST__INIT, *ibs[1] = {&ib};
  run.n_broadcasts = 1;
  run.broadcasts = ibs;
  ib.value = (ProtobufCBinaryData){16, bcast_bytes};
  expect_failure(call_msg(c, "/flint.Driver/RunJob", &run.base, &reply), FL_EPROTO, "broadcast id 0 out of range",
                 "an inline broadcast of id 0");
  ib.id = 3;
  ib.value = (ProtobufCBinaryData){sizeof bcast_bytes, bcast_bytes};
  expect_failure(call_msg(c, "/flint.Driver/RunJob", &run.base, &reply), FL_EPROTO, "broadcast 3 has 65537 bytes",
                 "an inline broadcast over 64 KiB");
  run.n_broadcasts = 0;
  run.broadcasts = NULL;
  Flint__FetchResultRequest fetch = FLINT__FETCH_RESULT_REQUEST__INIT;
  fetch.app_id = app_id;
  fetch.incarnation = incarnation;
  fetch.operation_id = 77;
  expect_failure(call_msg(c, "/flint.Driver/FetchResult", &fetch.base, &reply), FL_ENOENT,
                 "no result 0 of operation 77", "FetchResult of nothing");
  Flint__CancelJobsRequest cancel = FLINT__CANCEL_JOBS_REQUEST__INIT;
  cancel.app_id = app_id;
  cancel.incarnation = incarnation;
  assert_ok(call_msg(c, "/flint.Driver/CancelJobs", &cancel.base, &reply)); /* nothing runs: a no-op */
  /* BroadcastPut carries only where the client serves the value: a missing or invalid
   * address or id is refused with a message that says so. */
  Flint__BroadcastPutRequest put = FLINT__BROADCAST_PUT_REQUEST__INIT;
  put.app_id = app_id;
  put.incarnation = incarnation;
  put.broadcast_id = 1;
  put.total = 1000;
  static char *const bad_addresses[] = {"", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":80",
                                        "host name:80", "127.0.0.1:80x",
                                        "a-host-name-far-too-long-to-fit-anywhere-flint-keeps-addresses.example:1"};
  for (size_t i = 0; i < sizeof bad_addresses / sizeof *bad_addresses; i++) {
    put.address = bad_addresses[i];
    expect_failure(call_msg(c, "/flint.Driver/BroadcastPut", &put.base, &reply), FL_EPROTO, "invalid address",
                   bad_addresses[i]);
  }
  put.address = "127.0.0.1:4000";
  put.broadcast_id = 0;
  expect_failure(call_msg(c, "/flint.Driver/BroadcastPut", &put.base, &reply), FL_EPROTO, "out of range",
                 "broadcast id 0");
  put.broadcast_id = 1;
  assert_ok(call_msg(c, "/flint.Driver/BroadcastPut", &put.base, &reply));
  put.app_id = 999999;
  expect_failure(call_msg(c, "/flint.Driver/BroadcastPut", &put.base, &reply), FL_ENOENT, "999999",
                 "BroadcastPut of no application");
  Flint__AppRequest close_req = FLINT__APP_REQUEST__INIT;
  close_req.app_id = app_id;
  close_req.incarnation = incarnation;
  assert_ok(call_msg(c, "/flint.Driver/CloseApplication", &close_req.base, &reply));
  expect_failure(call_msg(c, "/flint.Driver/CloseApplication", &close_req.base, &reply), FL_ENOENT,
                 "no running application", "closing twice");

  /* 100 MiB, under the driver's limit (DRIVER_MAX_MESSAGE): decoded and refused, like any
   * garbage; over a channel's own limit (64 MiB by default): refused before it is sent. */
  size_t big_len = (size_t)100 << 20;
  uint8_t *big = malloc(big_len);
  assert_non_null(big);
  memset(big, 0x0f, big_len);
  rpc_channel *wide = channel(NULL, (size_t)INT32_MAX);
  double t0 = now_s();
  expect_failure(call_bytes(wide, "/flint.Driver/Submit", big, big_len, &reply), FL_EPROTO, "malformed",
                 "100 MiB of garbage");
  expect_failure(call_bytes(c, "/flint.Driver/Submit", big, big_len, &reply), FL_EPROTO, "over the limit",
                 "100 MiB on a channel of 64 MiB");
  free(big);
  fprintf(stderr, "100 MiB refused twice in %.1f s\n", now_s() - t0);

  /* The executor refuses a launch whose result task names an action the batch lacks, and
   * starts nothing of it. */
  Flint__StatusReply *listed = driver_status(c);
  assert_int_equal(listed->n_executors, 1);
  rpc_channel *exec;
  assert_true(num_channels < MAX_CHANNELS);
  assert_ok(rpc_channel_create(listed->executors[0]->address, NULL, 0, &exec));
  channels[num_channels++] = exec;
  uint64_t driver_incarnation = listed->incarnation;
  flint__status_reply__free_unpacked(listed, NULL);
  Flint__TaskDescription task = FLINT__TASK_DESCRIPTION__INIT, *tasks[1] = {&task};
  task.task_key = 9;
  task.rdd_id = 1;
  task.action_index = 2;
  static uint8_t empty_action[1];
  ProtobufCBinaryData actions[1] = {{0, empty_action}};
  Flint__LaunchTasksRequest launch = FLINT__LAUNCH_TASKS_REQUEST__INIT;
  launch.app_id = 777;
  launch.n_tasks = 1;
  launch.tasks = tasks;
  launch.n_actions = 1;
  launch.actions = actions;
  /* A launch of another driver process (one that died, or one this executor never joined). */
  expect_failure(call_msg(exec, "/flint.Executor/LaunchTasks", &launch.base, &reply), FL_ESTATE,
                 "of driver incarnation 0000000000000000 refused", "a launch of no driver incarnation");
  launch.incarnation = driver_incarnation;
  expect_failure(call_msg(exec, "/flint.Executor/LaunchTasks", &launch.base, &reply), FL_EPROTO,
                 "task 9: action 2 of a batch of 1", "a task naming a missing action");
  task.action_index = 0;
  expect_failure(call_msg(exec, "/flint.Executor/LaunchTasks", &launch.base, &reply), FL_EPROTO,
                 "task 9: action 0 of a batch of 1", "a result task without an action");

  /* After all of that the driver is alive, answers, and runs a job. */
  expect_running(driver);
  Flint__StatusReply *status = driver_status(c);
  assert_int_equal(status->n_executors, 1); /* nothing registered by the bad calls */
  assert_int_equal(status->n_applications, 1);
  assert_string_equal(status->applications[0]->state, "finished");
  flint__status_reply__free_unpacked(status, NULL);
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  free(r);
  fl_buf_free(&reply);

  stop_all();
  fx.passed = true;
}

/* A request over the driver's limit: gRPC refuses it (FL_EPROTO) before any handler runs,
 * and the driver goes on serving. gRPC reads the whole request before it refuses it, so this
 * moves a little over DRIVER_MAX_MESSAGE through the loopback, and gets a test of its own. */
static void test_oversized_request(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(NULL, 1);
  size_t len = DRIVER_MAX_MESSAGE + 1;
  uint8_t *big = calloc(1, len); /* zero pages: nothing resident until gRPC copies it */
  assert_non_null(big);
  rpc_channel *wide = channel(NULL, (size_t)INT32_MAX);
  fl_buf reply = FL_BUF_INIT;
  double t0 = now_s();
  expect_failure(call_bytes(wide, "/flint.Driver/Submit", big, len, &reply), FL_EPROTO, "size limit",
                 "a request over DRIVER_MAX_MESSAGE");
  fprintf(stderr, "%zu bytes refused in %.1f s\n", len, now_s() - t0);
  free(big);
  assert_int_equal(reply.len, 0);

  expect_running(driver);
  Flint__StatusReply *status = driver_status(wide);
  assert_int_equal(status->n_executors, 1);
  assert_int_equal(status->n_applications, 0);
  flint__status_reply__free_unpacked(status, NULL);
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "10000", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "pi is roughly 3.1");
  free(r);
  stop_all();
  fx.passed = true;
}

/* ---- 6. bad command lines -------------------------------------------------------------- */

/* A TCP port on 127.0.0.1 where nothing listens: bound, not listening, so that nobody else
 * takes it while the test runs. Returns the socket (close it after). */
static int dead_port(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* Runs a command line that must fail with `status` and a message on stderr containing each
 * of the needles (NULL-terminated), and leave no work folder in the children's TMPDIR. */
static void expect_refused(const char *const *args, int status, const char *const *needles) {
  run_result *r = run_flint(NULL, args);
  if (r->status != status) fprintf(stderr, "flint %s ...: ", args[0]);
  expect_status(r, status);
  for (; *needles; needles++) EXPECT_ERR(r, *needles);
  assert_true(r->seconds < 30);
  assert_int_equal(count_prefixed(fx.dir, "flint-"), 0);
  free(r);
}
#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_bad_command_lines(void **state) {
  (void)state;
  int port;
  int sock = dead_port(&port);
  char nobody[64], nobody_master[80];
  snprintf(nobody, sizeof nobody, "127.0.0.1:%d", port);
  snprintf(nobody_master, sizeof nobody_master, "flint://%s", nobody);
  const char *pi = bin_file("pi.so");

  expect_refused(ARGS("driver"), 2, ARGS("--listen HOST:PORT is required"));
  expect_refused(ARGS("driver", "--listen"), 2, ARGS("--listen needs a value"));
  expect_refused(ARGS("driver", "--listen", "127.0.0.1:0", "--frobnicate"), 2, ARGS("'--frobnicate'"));
  expect_refused(ARGS("driver", "--listen", "nohost"), 1, ARGS("'nohost'", "HOST:PORT"));
  expect_refused(ARGS("executor", "--driver", nobody, "--memory", "64m"), 2, ARGS("--cores N is required"));
  expect_refused(ARGS("executor", "--driver", nobody, "--cores", "0", "--memory", "64m"), 2,
                 ARGS("--cores '0'", "1 to 1024"));
  expect_refused(ARGS("executor", "--driver", nobody, "--cores", "2x", "--memory", "64m"), 2,
                 ARGS("--cores '2x'"));
  expect_refused(ARGS("executor", "--driver", nobody, "--cores", "1", "--memory", "abc"), 2,
                 ARGS("--memory 'abc'", "not a size"));
  expect_refused(ARGS("executor", "--driver", nobody, "--cores", "1"), 2, ARGS("--memory SIZE is required"));
  expect_refused(ARGS("executor", "--cores", "1", "--memory", "64m"), 2,
                 ARGS("--driver HOST:PORT is required"));
  expect_refused(ARGS("status"), 2, ARGS("--master flint://HOST:PORT is required"));
  expect_refused(ARGS("status", "--master", "flint://nohost"), 1, ARGS("'flint://nohost'", "HOST:PORT"));
  expect_refused(ARGS("status", "--master", "local[2]"), 1, ARGS("'local[2]'", "flint://HOST:PORT"));
  expect_refused(ARGS("submit", "--master", "flint://nohost", pi), 1, ARGS("'flint://nohost'", "HOST:PORT"));
  expect_refused(ARGS("submit", "--master", "flint://", pi), 1, ARGS("HOST:PORT"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--status", "abc"), 2,
                 ARGS("flint submit: --status 'abc' is not a submission id"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--kill=0"), 2, ARGS("--kill '0' is not a submission id"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--logs"), 2, ARGS("--logs needs a value"));
  expect_refused(ARGS("submit", "--status", "1"), 2, ARGS("--status needs a flint://HOST:PORT master"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--status", "1", "--kill", "1"), 2,
                 ARGS("--status and --kill: one at a time"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--status", "1", pi), 2,
                 ARGS("--status ID takes no job library"));
  expect_refused(ARGS("submit", "--master", nobody_master, "--detach", "--kill", "1"), 2,
                 ARGS("--kill ID takes only --master"));

  /* Nothing listens there: each fails soon, naming the address. */
  expect_refused(ARGS("executor", "--driver", nobody, "--cores", "1", "--memory", "64m"), 1,
                 ARGS("cannot register", nobody));
  expect_refused(ARGS("status", "--master", nobody_master), 1, ARGS("cannot reach", nobody));
  expect_refused(ARGS("submit", "--master", nobody_master, pi), 1, ARGS("cannot reach", nobody));
  expect_refused(ARGS("submit", "--master", nobody_master, "--status", "1"), 1, ARGS("cannot reach", nobody));
  close(sock);
  fx.passed = true;
}

/* ---- 7. stopping by signal ------------------------------------------------------------- */

static void test_signals_stop_cleanly(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  proc *e1 = start_executor("exec1", NULL);
  proc *e2 = start_executor("exec2", NULL);
  wait_executors(NULL, 2);
  /* Each keeps its own folder in its work folder while it runs. */
  assert_int_equal(count_entries(driver->work), 1);
  assert_int_equal(count_entries(e1->work), 1);
  assert_int_equal(count_entries(e2->work), 1);

  /* Some state to clean up: a finished job, and a job binary still running. */
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("pi.so"), "100000", "4");
  expect_status(r, 0);
  free(r);
  r = FLINT(NULL, "submit", "--master", fx.master, "--detach", bin_file("job_echo.so"), "--sleep-ms",
            "30000");
  expect_status(r, 0);
  free(r);
  /* The job binary's pid, from the driver's log. */
  int job_pid = 0;
  double deadline = now_s() + 10;
  while (!job_pid && now_s() < deadline) {
    char *log = slurp(driver->log);
    const char *at = strstr(log, "job binary 2 (job_echo.so) started as pid ");
    if (at) job_pid = atoi(at + strlen("job binary 2 (job_echo.so) started as pid "));
    free(log);
    if (!job_pid) sleep_ms(20);
  }
  assert_true(job_pid > 0);
  assert_int_equal(kill(job_pid, 0), 0);

  /* SIGINT stops an executor as SIGTERM does. */
  assert_int_equal(stop_proc(e2, SIGINT), 0);
  assert_int_equal(count_entries(e2->work), 0);

  /* The driver goes first: it stops its job binary and removes its folder, library and job
   * files included. */
  double t0 = now_s();
  assert_int_equal(stop_proc(driver, SIGTERM), 0);
  fprintf(stderr, "the driver stopped in %.1f s\n", now_s() - t0);
  assert_int_equal(count_entries(driver->work), 0);
  errno = 0;
  assert_int_equal(kill(job_pid, 0), -1); /* reaped by the driver, so gone */
  assert_int_equal(errno, ESRCH);

  /* An executor whose driver has gone still stops cleanly. */
  assert_int_equal(stop_proc(e1, SIGTERM), 0);
  assert_int_equal(count_entries(e1->work), 0);
  assert_int_equal(count_prefixed(fx.dir, "flint-"), 0);
  fx.passed = true;
}


int main(void) {
  find_binaries((const char *const[]){"pi.so", "job_echo.so", "job_crash.so", "job_lines.so", NULL});
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_job_binary_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_detached_status_logs_kill, setup, teardown),
      cmocka_unit_test_setup_teardown(test_crashing_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_close_while_a_job_runs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_client_going_away_cancels_its_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_status_output, setup, teardown),
      cmocka_unit_test_setup_teardown(test_job_output_streams_and_driver_loss, setup, teardown),
      cmocka_unit_test_setup_teardown(test_local_cluster_killed_leaves_no_folder, setup, teardown),
      cmocka_unit_test_setup_teardown(test_local_cluster_outlives_ctrl_c, setup, teardown),
      cmocka_unit_test_setup_teardown(test_authentication, setup, teardown),
      cmocka_unit_test_setup_teardown(test_encryption, setup, teardown),
      cmocka_unit_test_setup_teardown(test_malformed_messages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized_request, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_command_lines, setup, teardown),
      cmocka_unit_test_setup_teardown(test_signals_stop_cleanly, setup, teardown),
  };
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
