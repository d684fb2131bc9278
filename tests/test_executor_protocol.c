/*
 * test_executor_protocol: the control plane between driver and executor, each side run for
 * real (proc_harness) against a scripted peer: this program serving an rpc server that records
 * every call it gets and holds one method's calls unanswered until the test lets them go.
 *
 * A real `flint driver` against a scripted executor (which registers as `flint executor`
 * does); the test decides what a real executor leaves to timing:
 *   - a kill sent while the launch before it is still unanswered reaches the executor after
 *     that launch (the driver sends an executor's calls one at a time, in order, and a launch
 *     may leave from the scheduler thread before its sender thread runs);
 *   - an executor that vanishes with a launch in flight is lost, its job fails once no
 *     executor is left, and the driver goes on serving;
 *   - an executor that stops heartbeating while it holds a launch is lost, and the driver
 *     gives up on that launch at once rather than after its deadline;
 *   - a driver told to stop while an executor does not answer its launch stops at once rather
 *     than after the launch's deadline.
 * The client is this program too (fl_context_open on flint://).
 *
 * A real `flint executor` against a scripted driver that registers it and then answers no
 * heartbeat, or never answers its registration: told to stop, the executor exits at once
 * rather than after the call's deadline.
 *
 * Every wait is bounded.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "count_thread.h"
#include "proc_harness.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include "net/net.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"

#define WAIT_LIMIT_S 20.0 /* for a call to reach the scripted peer, or a job to return */
#define MAX_CALLS 64
#define MAX_KEYS 16

/* One call the scripted peer got. */
typedef struct call_record {
  char method[48]; /* "LaunchTasks", "KillTasks", ... */
  uint64_t keys[MAX_KEYS];
  size_t num_keys;
  double received_at, replied_at; /* now_s(); replied_at 0 until answered */
  bool cancelled;                 /* the caller gave up on it before it was answered */
} call_record;

typedef struct scripted_peer {
  rpc_server *server;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  call_record calls[MAX_CALLS];
  size_t num_calls;
  const char *held; /* its calls are answered once `released` (or cancelled); NULL: none */
  bool released;
} scripted_peer;

static scripted_peer peer;
static atomic_bool undecodable; /* a call whose request did not decode (checked by the tests) */

static void record_keys(call_record *r, const uint64_t *keys, size_t n) {
  for (size_t i = 0; i < n && r->num_keys < MAX_KEYS; i++) r->keys[r->num_keys++] = keys[i];
}

static fl_status scripted_handle(void *arg, const rpc_request *req, fl_buf *response) {
  (void)arg;
  /* Answers are empty messages (the driver reads only a launch's outcome), but a
   * registration's. */
  const char *method = strrchr(req->method, '/') + 1;
  pthread_mutex_lock(&peer.lock);
  if (peer.num_calls == MAX_CALLS) { /* more than any test makes: answer, record nothing */
    pthread_mutex_unlock(&peer.lock);
    return FL_OK;
  }
  size_t index = peer.num_calls++;
  call_record *r = &peer.calls[index];
  snprintf(r->method, sizeof r->method, "%s", method);
  r->received_at = now_s();
  if (strcmp(method, "LaunchTasks") == 0) {
    Flint__LaunchTasksRequest *m = flint__launch_tasks_request__unpack(NULL, req->body.len, req->body.data);
    if (m) {
      for (size_t i = 0; i < m->n_tasks; i++) record_keys(r, &m->tasks[i]->task_key, 1);
      flint__launch_tasks_request__free_unpacked(m, NULL);
    } else {
      atomic_store(&undecodable, true);
    }
  } else if (strcmp(method, "KillTasks") == 0) {
    Flint__KillTasksRequest *m = flint__kill_tasks_request__unpack(NULL, req->body.len, req->body.data);
    if (m) {
      record_keys(r, m->task_keys, m->n_task_keys);
      flint__kill_tasks_request__free_unpacked(m, NULL);
    } else {
      atomic_store(&undecodable, true);
    }
  }
  pthread_cond_broadcast(&peer.changed);
  if (strcmp(method, "RegisterExecutor") == 0) { /* as a driver: registered, beat every 100 ms */
    Flint__RegisterExecutorReply m = FLINT__REGISTER_EXECUTOR_REPLY__INIT;
    m.executor_id = 7;
    m.heartbeat_ms = 100;
    m.incarnation = 0x5eed; /* a driver process's, as a real one draws */
    m.driver_data_port = (uint32_t)rpc_server_port(peer.server); /* nothing is fetched from it */
    if (proto_pack(&m.base, response) != FL_OK) atomic_store(&undecodable, true);
  }
  if (peer.held && strcmp(method, peer.held) == 0) {
    double deadline = now_s() + 40;
    while (!peer.released && !atomic_load(req->cancelled) && now_s() < deadline) {
      pthread_mutex_unlock(&peer.lock);
      sleep_ms(5);
      pthread_mutex_lock(&peer.lock);
    }
    peer.calls[index].cancelled = atomic_load(req->cancelled);
  }
  peer.calls[index].replied_at = now_s();
  pthread_cond_broadcast(&peer.changed);
  pthread_mutex_unlock(&peer.lock);
  return FL_OK;
}

/* Serves on a free port with several handler threads (so that a call sent out of order would
 * be taken while another is held); calls to `held` wait for scripted_release. */
static void scripted_start(const char *held) {
  memset(&peer, 0, sizeof peer);
  atomic_store(&undecodable, false);
  pthread_mutex_init(&peer.lock, NULL);
  pthread_cond_init(&peer.changed, NULL);
  peer.held = held;
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.listen = "127.0.0.1:0";
  cfg.handler = scripted_handle;
  cfg.handler_threads = 4;
  assert_ok(rpc_server_start(&cfg, &peer.server));
}

/* As an executor: registers with the driver at fx.target, with 1 core. */
static void scripted_register_as(uint64_t *id, uint64_t *incarnation);
static void scripted_register(void) {
  uint64_t id, incarnation;
  scripted_register_as(&id, &incarnation);
}

/* The same, saying the id and the driver's incarnation that the driver answered. */
static void scripted_register_as(uint64_t *id, uint64_t *incarnation) {
  Flint__RegisterExecutorRequest rq = FLINT__REGISTER_EXECUTOR_REQUEST__INIT;
  rq.host = "127.0.0.1";
  rq.rpc_port = (uint32_t)rpc_server_port(peer.server);
  rq.data_port = rq.rpc_port; /* nothing is fetched from it here */
  rq.cores = 1;
  rq.memory = 256u << 20;
  rq.pid = (uint32_t)getpid();
  rq.node = "";
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  assert_ok(proto_pack(&rq.base, &body));
  rpc_channel *driver;
  assert_ok(rpc_channel_create(fx.target, NULL, 0, &driver));
  assert_ok(rpc_call(driver, "/flint.Driver/RegisterExecutor", fl_buf_bytes(&body), 10000, &reply));
  Flint__RegisterExecutorReply *m = flint__register_executor_reply__unpack(NULL, reply.len, reply.data);
  assert_non_null(m);
  assert_true(m->executor_id > 0);
  *id = m->executor_id;
  *incarnation = m->incarnation;
  flint__register_executor_reply__free_unpacked(m, NULL);
  rpc_channel_destroy(driver);
  fl_buf_free(&body);
  fl_buf_free(&reply);
}

/* As the executor registered with the driver (id, incarnation): sends `method` (Heartbeat or
 * StatusUpdate) carrying block changes blocks[0, n) and `dropped`; FL_OK when the driver took it. */
static fl_status send_block_reports(uint64_t id, uint64_t incarnation, const char *method, Flint__BlockUpdate *blocks,
                                    size_t n, uint64_t dropped) {
  Flint__BlockUpdate *ptrs[8];
  assert_true(n <= 8);
  for (size_t i = 0; i < n; i++) ptrs[i] = &blocks[i];
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  if (strcmp(method, "Heartbeat") == 0) {
    Flint__HeartbeatRequest rq = FLINT__HEARTBEAT_REQUEST__INIT;
    rq.executor_id = id;
    rq.incarnation = incarnation;
    rq.blocks = ptrs;
    rq.n_blocks = n;
    rq.blocks_dropped = dropped;
    assert_ok(proto_pack(&rq.base, &body));
  } else {
    Flint__StatusUpdateRequest rq = FLINT__STATUS_UPDATE_REQUEST__INIT;
    rq.executor_id = id;
    rq.incarnation = incarnation;
    rq.blocks = ptrs;
    rq.n_blocks = n;
    rq.blocks_dropped = dropped;
    assert_ok(proto_pack(&rq.base, &body));
  }
  char full[64];
  snprintf(full, sizeof full, "/flint.Driver/%s", method);
  rpc_channel *driver;
  assert_ok(rpc_channel_create(fx.target, NULL, 0, &driver));
  fl_status st = rpc_call(driver, full, fl_buf_bytes(&body), 10000, &reply);
  rpc_channel_destroy(driver);
  fl_buf_free(&body);
  fl_buf_free(&reply);
  return st;
}

static void scripted_release(void) {
  pthread_mutex_lock(&peer.lock);
  peer.released = true;
  pthread_cond_broadcast(&peer.changed);
  pthread_mutex_unlock(&peer.lock);
}

/* Stops serving: calls in flight are cancelled, so the driver's end of them fails. */
static void scripted_stop(void) {
  rpc_server_stop(peer.server);
  peer.server = NULL;
  pthread_cond_destroy(&peer.changed);
  pthread_mutex_destroy(&peer.lock);
  assert_false(atomic_load(&undecodable));
}

/* The harness's teardown, after stopping a peer that a failed test left serving (its held
 * calls would otherwise run on into the next test's). */
static int peer_teardown(void **state) {
  if (peer.server) {
    scripted_release();
    rpc_server_stop(peer.server);
    peer.server = NULL;
  }
  return harness_teardown(state);
}

/* The index of the first call to `method` (a KillTasks with at least one key: not one of the
 * driver's empty liveness pings), waiting at most limit_s; -1 when none came. */
static int wait_call(const char *method, double limit_s) {
  double deadline = now_s() + limit_s;
  int found = -1;
  pthread_mutex_lock(&peer.lock);
  while (found < 0) {
    for (size_t i = 0; i < peer.num_calls && found < 0; i++)
      if (strcmp(peer.calls[i].method, method) == 0 && (strcmp(method, "KillTasks") || peer.calls[i].num_keys))
        found = (int)i;
    if (found >= 0 || now_s() > deadline) break;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&peer.changed, &peer.lock, &ts);
  }
  pthread_mutex_unlock(&peer.lock);
  return found;
}

/* ---- the client's job ---------------------------------------------------------------------- */

/* A count over 2 partitions: one launch of 2 tasks to the 1-core scripted executor. */
typedef struct job_run {
  fl_context *ctx;
  fl_dataset *ds;
  count_thread count;
} job_run;

static void job_start(job_run *j) {
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = fx.dir;
  assert_ok(fl_context_open(fx.master, &opts, &j->ctx));
  assert_ok(fl_range(j->ctx, 0, 1000, 1, 2, &j->ds));
  count_start(&j->count, j->ds);
}

static void job_close(job_run *j) {
  fl_dataset_free(j->ds);
  fl_context_close(j->ctx);
}

/* A real driver (with driver_env), the scripted executor registered with it holding launches,
 * and a client's count whose launch has reached it; returns the driver, the launch's index in
 * *launch. */
static proc *driver_with_held_launch(const char *const *driver_env, job_run *j, int *launch) {
  proc *driver = start_driver(driver_env);
  scripted_start("LaunchTasks");
  scripted_register();
  job_start(j);
  *launch = wait_call("LaunchTasks", WAIT_LIMIT_S);
  assert_true(*launch >= 0);
  return driver;
}

/* A real executor registering with the scripted driver, which holds calls to `held`; returns
 * once the first of them has come and the executor is waiting in it. */
static proc *executor_with_held_call(const char *held) {
  scripted_start(held);
  snprintf(fx.target, sizeof fx.target, "127.0.0.1:%d", rpc_server_port(peer.server));
  proc *e = start_executor("exec", NULL);
  assert_true(wait_call(held, WAIT_LIMIT_S) >= 0);
  sleep_ms(200); /* the process is in its call now */
  return e;
}

/* The deadline of a launch (the driver's) and of a call to the driver (the executor's). */
#define CALL_DEADLINE_S 30
/* stop_proc kills a process that has not exited STOP_LIMIT_S after the signal, which then
 * does not exit with status 0: a process that waits for a call's deadline fails that way
 * whatever the load, and a prompt one passes unless it hangs for 20 s. */
_Static_assert(STOP_LIMIT_S < CALL_DEADLINE_S, "a stop that waits for a deadline must fail");

/* SIGTERM to p (named `what`): it exits with status 0, without waiting for the deadline of
 * the call it is in. */
static void expect_prompt_stop(proc *p, const char *what) {
  double t0 = now_s();
  int status = stop_proc(p, SIGTERM);
  fprintf(stderr, "the %s stopped in %.2f s with exit status %d\n", what, now_s() - t0, status);
  assert_int_equal(status, 0);
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* The client cancels its job while the driver's launch of it is still unanswered: the kill
 * waits for that launch's reply, then names the launched tasks. The cancelled job returns at
 * once, without waiting for the executor. */
static void test_kill_follows_the_unanswered_launch(void **state) {
  (void)state;
  job_run j = {0};
  int launch;
  driver_with_held_launch((const char *const[]){"FLINT_EXECUTOR_TIMEOUT_MS=60000", NULL}, &j, &launch);
  assert_int_equal(peer.calls[launch].num_keys, 2);

  assert_ok(fl_cancel_jobs(j.ctx));
  count_join(&j.count, WAIT_LIMIT_S);
  assert_int_equal(j.count.status, FL_ECANCELLED);
  /* The kill is queued behind the held launch: none may arrive while the launch is held. */
  sleep_ms(300);
  assert_int_equal(wait_call("KillTasks", 0), -1);
  scripted_release();

  int kill = wait_call("KillTasks", WAIT_LIMIT_S);
  assert_true(kill > launch);
  pthread_mutex_lock(&peer.lock);
  call_record l = peer.calls[launch], k = peer.calls[kill];
  pthread_mutex_unlock(&peer.lock);
  fprintf(stderr, "launch held %.0f ms; kill arrived %.1f ms after its reply\n",
          (l.replied_at - l.received_at) * 1e3, (k.received_at - l.replied_at) * 1e3);
  assert_true(l.replied_at > 0 && k.received_at >= l.replied_at);
  for (size_t i = 0; i < k.num_keys; i++) {
    bool launched = false;
    for (size_t m = 0; m < l.num_keys; m++) launched |= k.keys[i] == l.keys[m];
    assert_true(launched);
  }

  job_close(&j);
  scripted_stop();
  stop_all();
  fx.passed = true;
}

/* The executor goes away while the driver waits for its answer to a launch: the driver loses
 * it, the job fails once no executor has come within FLINT_NO_EXECUTOR_TIMEOUT_MS, and the
 * driver keeps serving its client. */
static void test_executor_gone_during_a_launch(void **state) {
  (void)state;
  job_run j = {0};
  int launch;
  proc *driver = driver_with_held_launch(
      (const char *const[]){"FLINT_EXECUTOR_TIMEOUT_MS=60000", "FLINT_NO_EXECUTOR_TIMEOUT_MS=1000", NULL}, &j, &launch);

  scripted_stop(); /* cancels the held launch: the driver's call to it fails */
  count_join(&j.count, WAIT_LIMIT_S);
  fprintf(stderr, "the job failed: %s\n", j.count.error);
  assert_int_equal(j.count.status, FL_ENET);
  assert_non_null(strstr(j.count.error, "every executor was lost"));
  expect_running(driver);
  fl_context_stats stats;
  assert_ok(fl_context_stats_get(j.ctx, &stats)); /* the driver still answers */

  job_close(&j);
  stop_all();
  fx.passed = true;
}

/* The executor still serves but holds a launch and sends no heartbeat: the driver loses it
 * after FLINT_EXECUTOR_TIMEOUT_MS and cancels the launch it was waiting for (then, not after
 * the launch's 30 s deadline); the job fails as every executor is lost. */
static void test_silent_executor_loses_its_launch(void **state) {
  (void)state;
  job_run j = {0};
  int launch;
  proc *driver = driver_with_held_launch(
      (const char *const[]){"FLINT_EXECUTOR_TIMEOUT_MS=3000", "FLINT_NO_EXECUTOR_TIMEOUT_MS=500", NULL}, &j, &launch);
  count_join(&j.count, WAIT_LIMIT_S);
  fprintf(stderr, "the job failed: %s\n", j.count.error);
  assert_int_equal(j.count.status, FL_ENET);
  assert_non_null(strstr(j.count.error, "no heartbeat"));

  /* Until the launch is answered: at once when given up, or by the peer itself after 40 s. */
  double deadline = now_s() + 60;
  pthread_mutex_lock(&peer.lock);
  while (!peer.calls[launch].replied_at && now_s() < deadline) {
    pthread_mutex_unlock(&peer.lock);
    sleep_ms(10);
    pthread_mutex_lock(&peer.lock);
  }
  call_record l = peer.calls[launch];
  pthread_mutex_unlock(&peer.lock);
  fprintf(stderr, "the held launch was given up after %.2f s\n", l.replied_at ? l.replied_at - l.received_at : -1);
  assert_true(l.replied_at > 0 && l.cancelled);
  /* The deadline also cancels it, but not before CALL_DEADLINE_S; given up with the executor
   * it is cancelled after about FLINT_EXECUTOR_TIMEOUT_MS (3 s): 20 s is a hang. */
  assert_true(l.replied_at - l.received_at < CALL_DEADLINE_S - 10);
  expect_running(driver);

  job_close(&j);
  scripted_release();
  scripted_stop();
  stop_all();
  fx.passed = true;
}

/* The driver is told to stop while an executor does not answer its launch, and a kill waits
 * behind that launch: it stops within a few seconds, not after the launch's 30 s deadline,
 * exits cleanly, and sends the executor nothing more (the kill is dropped, not begun and then
 * cancelled). */
static void test_driver_stops_with_a_launch_unanswered(void **state) {
  (void)state;
  job_run j = {0};
  int launch;
  proc *driver = driver_with_held_launch((const char *const[]){"FLINT_EXECUTOR_TIMEOUT_MS=60000", NULL}, &j, &launch);
  assert_ok(fl_cancel_jobs(j.ctx)); /* a KillTasks now waits behind the held launch */
  count_join(&j.count, WAIT_LIMIT_S);
  assert_int_equal(j.count.status, FL_ECANCELLED);

  expect_prompt_stop(driver, "driver");
  sleep_ms(200);
  assert_int_equal(wait_call("KillTasks", 0), -1);

  job_close(&j);
  scripted_release();
  scripted_stop();
  fx.passed = true;
}

/* A real executor whose driver (scripted) registered it and then answers no heartbeat: told
 * to stop, the executor gives the held heartbeat up and exits within a few seconds, not after
 * the call's 30 s deadline. */
static void test_executor_stops_with_a_heartbeat_unanswered(void **state) {
  (void)state;
  expect_prompt_stop(executor_with_held_call("Heartbeat"), "executor");
  assert_int_equal(wait_call("RegisterExecutor", 0), 0);

  scripted_release();
  scripted_stop();
  fx.passed = true;
}

/* A real executor whose driver (scripted) never answers its registration: told to stop, it
 * gives the registration up and exits cleanly within a few seconds. */
static void test_executor_stops_while_registering(void **state) {
  (void)state;
  proc *e = executor_with_held_call("RegisterExecutor");
  assert_int_equal(wait_call("RegisterExecutor", 0), 0);
  expect_prompt_stop(e, "executor");
  char *log = slurp(e->log);
  assert_non_null(strstr(log, "stopped before the driver"));
  free(log);

  scripted_release();
  scripted_stop();
  fx.passed = true;
}

/* Whether a line of the event logs in `dir` holds `needle`. */
static bool logs_hold(const char *dir, const char *needle) {
  char cmd[PATH_MAX + 200];
  snprintf(cmd, sizeof cmd, "cat %s/*.jsonl 2>/dev/null", dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[4096];
  bool found = false;
  while (fgets(line, sizeof line, p)) found |= strstr(line, needle) != NULL;
  pclose(p);
  return found;
}

/* An executor's reports of cached blocks that the driver cannot place do no harm: blocks of an
 * application it does not know are ignored (in heartbeats and status updates alike), a level
 * out of range reads as none, and a count of dropped reports is only logged; the driver goes on
 * serving. */
static void test_block_reports_the_driver_cannot_place(void **state) {
  (void)state;
  char events[PATH_MAX + 16], env[PATH_MAX + 48];
  snprintf(events, sizeof events, "%s/events", fx.dir);
  make_dir(events);
  snprintf(env, sizeof env, "FLINT_EVENT_LOG_DIR=%s", events);
  proc *driver = start_driver((const char *const[]){env, "FLINT_EXECUTOR_TIMEOUT_MS=60000", NULL});
  scripted_start(NULL);
  uint64_t id, incarnation;
  scripted_register_as(&id, &incarnation);
  fl_context *ctx;
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = fx.dir;
  assert_ok(fl_context_open(fx.master, &opts, &ctx)); /* application 1 */

  Flint__BlockUpdate unknown = FLINT__BLOCK_UPDATE__INIT, odd = FLINT__BLOCK_UPDATE__INIT;
  unknown.app_id = 999;
  unknown.rdd_id = 4242;
  unknown.memory = 100;
  unknown.level = FL_MEMORY_ONLY;
  odd.app_id = 1;
  odd.rdd_id = 4243;
  odd.memory = 100;
  odd.level = 77;
  assert_ok(send_block_reports(id, incarnation, "StatusUpdate", &unknown, 1, 0));
  assert_ok(send_block_reports(id, incarnation, "Heartbeat", (Flint__BlockUpdate[]){unknown, odd}, 2, 3));
  /* of another driver process: refused, and nothing posted */
  odd.rdd_id = 4244;
  assert_int_equal(send_block_reports(id, incarnation ^ 1, "StatusUpdate", &odd, 1, 0), FL_ESTATE);
  double deadline = now_s() + WAIT_LIMIT_S;
  while (!logs_hold(events, "\"RDD\":4243") && now_s() < deadline) sleep_ms(20);
  assert_true(logs_hold(events, "\"RDD\":4243,\"Partition\":0,\"Executor\":"));
  assert_true(logs_hold(events, "\"Level\":\"NONE\""));
  assert_false(logs_hold(events, "\"RDD\":4242"));
  assert_false(logs_hold(events, "\"RDD\":4244"));
  expect_running(driver);
  char *log = slurp(driver->log);
  assert_non_null(strstr(log, "could not keep 3 changes of its cached blocks"));
  free(log);

  fl_context_close(ctx);
  scripted_stop();
  stop_all();
  fx.passed = true;
}

int main(void) {
  find_binaries((const char *const[]){NULL});
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_kill_follows_the_unanswered_launch, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_executor_gone_during_a_launch, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_silent_executor_loses_its_launch, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_driver_stops_with_a_launch_unanswered, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_executor_stops_with_a_heartbeat_unanswered, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_executor_stops_while_registering, harness_setup, peer_teardown),
      cmocka_unit_test_setup_teardown(test_block_reports_the_driver_cannot_place, harness_setup, peer_teardown),
  };
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
