/*
 * driver_link.c: the executor's tie to its driver: registration, heartbeats, and the driver's
 * liveness. Every call between the two carries the driver's incarnation, and a call of another
 * incarnation is refused (exec_driver_check_incarnation). A driver that has not answered for
 * FLINT_DRIVER_TIMEOUT_MS, or no longer knows this executor, is taken for lost: everything of
 * it goes (its applications, tasks and results: driver_forget), and the executor registers
 * afresh with whichever driver answers at the configured address.
 *
 * Threading: the first registration runs on executor_serve's thread; the heartbeat thread
 * sends heartbeats, forgets a lost driver and registers again, sleeping on svc->stop_wake
 * (task ends never wake it). exec_driver_check_incarnation runs on handler threads: the
 * incarnation is an atomic.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "executor/internal.h"

/* FL_OK when a call of driver incarnation `incarnation` is from this executor's driver: an
 * executor registering takes the first that comes (a launch may overtake the registration's
 * reply). Anything else is an earlier driver process's, or a later one's that this executor
 * has not registered with, and is refused. */
fl_status exec_driver_check_incarnation(exec_service *svc, uint64_t incarnation, const char *what) {
  uint64_t mine = 0;
  if (incarnation && incarnation != INCARNATION_NONE &&
      (atomic_compare_exchange_strong(&svc->incarnation, &mine, incarnation) || mine == incarnation))
    return FL_OK;
  return FL_ERR(FL_ESTATE, "%s of driver incarnation %016llx refused: this executor serves %016llx", what,
                (unsigned long long)incarnation, (unsigned long long)mine);
}

/* ---- registration and heartbeats ------------------------------------------------------- */

/* Registers with the driver (a first time, or afresh after driver_forget), waiting up to
 * timeout_ms for its answer. */
fl_status exec_driver_register(exec_service *svc, int64_t timeout_ms) {
  Flint__RegisterExecutorRequest req = FLINT__REGISTER_EXECUTOR_REQUEST__INIT;
  req.host = (char *)svc->cfg.host;
  req.rpc_port = (uint32_t)rpc_server_port(svc->server);
  req.data_port = (uint32_t)dp_server_port(svc->blocks_server);
  req.ps_port = (uint32_t)ps_server_port(svc->ps);
  req.cores = svc->cfg.cores;
  req.memory = svc->cfg.memory;
  req.pid = svc->pid;
  req.node = svc->node;
  req.supervised = svc->supervised;
  req.has_gpu = svc->cfg.gpu >= 0;
  req.gpu = svc->cfg.gpu >= 0 ? (uint32_t)svc->cfg.gpu : 0;
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  fl_status status = proto_pack(&req.base, &body);
  /* A new driver's keys may repeat an earlier one's: no claim of those may stand. */
  if (svc->claims) claim_table_clear(svc->claims);
  exec_block_reports_clear(svc->block_reports); /* the earlier driver's applications' */
  atomic_store(&svc->incarnation, 0); /* the first call of a driver says which */
  atomic_store(&svc->driver_known, false);
  if (status == FL_OK)
    status = exec_driver_call(svc, "/flint.Driver/RegisterExecutor", fl_buf_bytes(&body), timeout_ms,
                              &svc->abandon, &reply);
  if (status == FL_OK) {
    Flint__RegisterExecutorReply *r = flint__register_executor_reply__unpack(NULL, reply.len, reply.data);
    uint64_t first = 0;
    if (!r || r->executor_id == 0 || r->driver_data_port == 0 || r->driver_data_port > 65535 ||
        r->incarnation == 0 || r->incarnation == INCARNATION_NONE) {
      status = FL_ERR(FL_EPROTO, "RegisterExecutor: malformed reply from the driver");
    } else if (!atomic_compare_exchange_strong(&svc->incarnation, &first, r->incarnation) &&
               first != r->incarnation) {
      status = FL_ERR(FL_ESTATE, "RegisterExecutor: driver incarnation %016llx answered, after a call of %016llx",
                      (unsigned long long)r->incarnation, (unsigned long long)first);
    } else {
      svc->id = r->executor_id;
      executor_report_registered(svc->id, r->incarnation, svc->cfg.driver, svc->work_dir);
      svc->heartbeat_ms = r->heartbeat_ms ? r->heartbeat_ms : 1000;
      /* The driver's block server is on the driver's host. */
      char host[64];
      snprintf(host, sizeof host, "%s", svc->cfg.driver);
      char *colon = strrchr(host, ':');
      if (colon) *colon = 0;
      snprintf(svc->driver_data, sizeof svc->driver_data, "%s:%u", host, r->driver_data_port);
      atomic_store(&svc->driver_known, true);
      char role[48];
      snprintf(role, sizeof role, "executor %llu", (unsigned long long)svc->id);
      common_log_set_role(role);
    }
    if (r) flint__register_executor_reply__free_unpacked(r, NULL);
  }
  if (status != FL_OK) atomic_store(&svc->incarnation, INCARNATION_NONE);
  fl_buf_free(&body);
  fl_buf_free(&reply);
  return status;
}

/* How long driver_forget waits for the killed tasks of the lost driver to end; a task in
 * user code that never returns to flint keeps its application's blocks, so the process ends. */
#define FORGET_DRAIN_MS 20000

/* Drops everything of the driver this executor served: its applications (datasets, cached
 * blocks, shuffle outputs, broadcasts, work folders), their tasks (killed; their ends are not
 * reported) and the large results waiting to be fetched. Called by the heartbeat thread when
 * the driver no longer knows this executor or has not answered for the driver timeout, before
 * it registers again. False when killed tasks did not end within FORGET_DRAIN_MS. */
static bool driver_forget(exec_service *svc) {
  atomic_store(&svc->incarnation, INCARNATION_NONE); /* nothing more of the old driver */
  /* A status update in flight to a driver that does not answer holds its tasks' applications
   * for its deadline: give it up (its ends are the old driver's). */
  atomic_store(&svc->abandon_statuses, true);
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  size_t num_apps = 0;
  for (exec_app *a = svc->apps; a; a = a->next) num_apps++;
  exec_app **apps = common_calloc(num_apps ? num_apps : 1, sizeof *apps);
  size_t held = 0;
  for (exec_app *a = svc->apps; a && apps; a = a->next)
    if (!a->removed) { /* a removed one goes with its last task already */
      a->removed = true;
      atomic_fetch_add(&a->tasks_running, 1);
      apps[held++] = a;
    }
  for (exec_task *t = svc->running; t; t = t->next) atomic_store(&t->cancelled, true);
  result_block *results = svc->results;
  svc->results = NULL;
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  while (results) {
    result_block *next = results->next;
    fl_buf_free(&results->bytes);
    common_free(results);
    results = next;
  }
  for (size_t i = 0; i < held; i++) { /* drop the hold taken above: idle ones go now */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = exec_app_release_locked(svc, apps[i]);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) exec_app_remove_all(svc, gone);
  }
  common_free(apps);
  if (!apps && num_apps) return false; /* out of memory: they cannot be dropped */
  /* The killed tasks end at their next batch; the status thread drops their ends, and the
   * last of each application removes it. */
  uint64_t deadline = common_now_ns() + (uint64_t)FORGET_DRAIN_MS * 1000000u;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool drained = svc->apps == NULL;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (drained && !atomic_load(&svc->abandon)) atomic_store(&svc->abandon_statuses, false);
    if (drained) return true;
    if (common_now_ns() >= deadline || atomic_load(&svc->abandon)) return false;
    usleep(10000);
  }
}

/* Waits up to ms on the stop (svc->lock held); false once the executor stops. */
static bool heartbeat_sleep(exec_service *svc, uint64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000u;
  ts.tv_sec += (time_t)(ns / 1000000000u);
  ts.tv_nsec = (long)(ns % 1000000000u);
  while (!svc->stopping && pthread_cond_timedwait(&svc->stop_wake, &svc->lock, &ts) != ETIMEDOUT) {
  }
  return !svc->stopping;
}

/* The executor must end: executor_serve returns `why`. */
static void service_fail(exec_service *svc, const char *why) {
  common_log(LOG_ERROR, "%s", why);
  snprintf(svc->fatal_error, sizeof svc->fatal_error, "%s", why);
  atomic_store(&svc->fatal, true);
}

/* After driver_forget: registers with whichever driver answers at the configured address,
 * once a heartbeat period, quietly; false once the executor stops. */
static bool register_again(exec_service *svc) {
  for (;;) {
    /* A launch that overtook a registration that then failed left an application behind. */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool leftovers = svc->apps != NULL;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (leftovers && !driver_forget(svc)) {
      if (!atomic_load(&svc->abandon))
        service_fail(svc, "tasks of an earlier registration did not stop within 20 s of being killed");
      return false;
    }
    if (exec_driver_register(svc, (int64_t)svc->heartbeat_ms * 5) == FL_OK) {
      common_log(LOG_INFO, "registered afresh with the driver at %s as executor %llu", svc->cfg.driver,
                 (unsigned long long)svc->id);
      return true;
    }
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool go_on = heartbeat_sleep(svc, svc->heartbeat_ms);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (!go_on) return false;
  }
}

/* The driver this executor served is gone (`why`): its state goes, and the executor registers
 * afresh, or ends when the state cannot go. False once the executor stops or must end. */
static bool driver_lost(exec_service *svc, const char *why) {
  common_log(LOG_WARN, "%s: dropping every application's blocks, shuffle outputs and tasks, and registering "
             "afresh when a driver answers at %s", why, svc->cfg.driver);
  if (!driver_forget(svc)) {
    if (!atomic_load(&svc->abandon))
      service_fail(svc, "tasks of the lost driver did not stop within 20 s of being killed: the executor ends "
                   "so that none of their state outlives it");
    return false;
  }
  return register_again(svc);
}

/* Heartbeats, and the driver's liveness: one line when a heartbeat first fails, one when the
 * driver is taken for lost (silent for the driver timeout, or it does not know this executor),
 * and none for each retry. */
void *exec_driver_heartbeat_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-heartbeat");
  exec_service *svc = arg;
  uint64_t last_answer = common_now_ns();
  bool failing = false;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool go_on = heartbeat_sleep(svc, svc->heartbeat_ms);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (!go_on) return NULL;
    block_manager_stats bs;
    block_manager_stats_get(svc->blocks, &bs);
    Flint__HeartbeatRequest req = FLINT__HEARTBEAT_REQUEST__INIT;
    req.executor_id = svc->id;
    req.incarnation = atomic_load(&svc->incarnation);
    req.cached_bytes = bs.memory_used + bs.disk_used;
    req.tasks_run = atomic_load(&svc->tasks_run);
    req.tasks_failed = atomic_load(&svc->tasks_failed);
    /* block changes outside tasks (an unpersist, an application's end) */
    bool blocks = exec_block_reports_begin(svc->block_reports, &req.blocks, &req.n_blocks, &req.blocks_dropped);
    fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
    uint64_t wait_ms = svc->driver_timeout_ns / 1000000u;
    bool unknown = false, answered = proto_pack(&req.base, &body) == FL_OK &&
        exec_driver_call(svc, "/flint.Driver/Heartbeat", fl_buf_bytes(&body),
                         (int64_t)(wait_ms < RPC_TIMEOUT_MS ? wait_ms : RPC_TIMEOUT_MS), &svc->abandon,
                         &reply) == FL_OK;
    if (answered) {
      Flint__HeartbeatReply *r = flint__heartbeat_reply__unpack(NULL, reply.len, reply.data);
      unknown = r && r->unknown;
      if (r) flint__heartbeat_reply__free_unpacked(r, NULL);
    }
    if (blocks) exec_block_reports_end(svc->block_reports, answered && !unknown);
    char error[200];
    snprintf(error, sizeof error, "%s", answered ? "" : fl_last_error());
    fl_buf_free(&body);
    fl_buf_free(&reply);
    if (atomic_load(&svc->abandon)) return NULL;
    uint64_t now = common_now_ns();
    if (answered && !unknown) {
      if (failing) common_log(LOG_INFO, "the driver at %s answers again", svc->cfg.driver);
      failing = false;
      last_answer = now;
      continue;
    }
    char why[320];
    if (unknown) {
      snprintf(why, sizeof why, "the driver at %s does not know this executor (it restarted, or took this "
               "executor for lost)", svc->cfg.driver);
    } else if (now - last_answer >= svc->driver_timeout_ns) {
      snprintf(why, sizeof why, "no answer from the driver at %s for %.0f s (FLINT_DRIVER_TIMEOUT_MS)",
               svc->cfg.driver, (double)(now - last_answer) / 1e9);
    } else {
      if (!failing)
        common_log(LOG_WARN, "heartbeat to the driver at %s failed: %s; retrying for up to %.0f s", svc->cfg.driver,
                   error, (double)svc->driver_timeout_ns / 1e9);
      failing = true;
      continue;
    }
    if (!driver_lost(svc, why)) return NULL;
    failing = false;
    last_answer = common_now_ns();
  }
}

