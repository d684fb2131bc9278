/*
 * service.c: the executor process (`flint executor`). executor_serve reads its settings, makes
 * its work folder, block manager, claim table, task pool, fetch client, block server and
 * control-plane server, registers with the driver, starts the status and heartbeat threads,
 * and serves until a stop request or a fatal error; service_destroy then stops it in order.
 * The rest of the process lives in the files that internal.h lists.
 *
 * Threading: executor_serve's thread waits on the stop flag; while the first registration
 * waits for the driver, a watcher thread gives it up on a stop. Settings are read once, before
 * any thread starts.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/config.h"
#include "executor/internal.h"

/* How long a stopping executor lets its last statuses take before it gives them up. */
#define STATUS_STOP_GRACE_MS 1000

/* Settings from the environment: FLINT_FETCH_TIMEOUT_MS (exec_service.fetch_timeout_ms),
 * FLINT_DRIVER_TIMEOUT_MS, and test-only switches:
 *   FLINT_FAULT_EXIT_AFTER_TASKS=K  the executor dies (_exit 86, no goodbye, as kill -9 would
 *                                   leave things) as its K-th task ends, before reporting it;
 *   FLINT_FAULT_SLOWDOWN=F          each task runs F times as long (it sleeps (F - 1) times
 *                                   its run time afterwards, waking for kills): a slow machine. */
static void settings_read(exec_service *svc) {
  svc->fetch_timeout_ms = (int64_t)config_ms(CONFIG_FETCH_TIMEOUT_MS);
  svc->driver_timeout_ns = config_ms(CONFIG_DRIVER_TIMEOUT_MS) * 1000000ull;
  svc->fault_exit_after = config_count(CONFIG_FAULT_EXIT_AFTER_TASKS);
  svc->fault_slowdown = config_real(CONFIG_FAULT_SLOWDOWN);
  if (svc->fault_exit_after || svc->fault_slowdown > 1)
    common_log(LOG_WARN, "fault injection: exit after %llu tasks, slowdown %.1fx",
               (unsigned long long)svc->fault_exit_after, svc->fault_slowdown > 1 ? svc->fault_slowdown : 1.0);
}

/* ---- the process ----------------------------------------------------------------------- */

static void service_destroy(exec_service *svc) {
  atomic_store(&svc->abandon, true);
  if (svc->status_thread || svc->heartbeat_thread) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    svc->stopping = true;
    pthread_cond_broadcast(&svc->wake);
    pthread_cond_broadcast(&svc->stop_wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  rpc_server_stop(svc->server); /* no new launches */
  if (svc->pool) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    for (exec_task *t = svc->running; t; t = t->next) atomic_store(&t->cancelled, true);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    task_pool_destroy(svc->pool);
  }
  if (svc->status_thread) {
    /* The ended tasks' statuses (results the driver need not compute again) get a grace. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)STATUS_STOP_GRACE_MS * 1000000u;
    until.tv_sec += (time_t)(ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    if (pthread_timedjoin_np(svc->status_thread, NULL, &until) != 0) {
      atomic_store(&svc->abandon_statuses, true);
      pthread_join(svc->status_thread, NULL);
    }
  }
  if (svc->heartbeat_thread) pthread_join(svc->heartbeat_thread, NULL);
  while (svc->done_head) { /* ended after the last status update went out */
    exec_task *t = svc->done_head;
    svc->done_head = t->next;
    exec_task_free(t);
  }
  svc->done_tail = NULL;
  dp_server_stop(svc->blocks_server);
  ps_server_stop(svc->ps);
  while (svc->apps) {
    exec_app *next = svc->apps->next;
    exec_app_destroy(svc->apps);
    svc->apps = next;
  }
  block_manager_destroy(svc->blocks);
  exec_block_reports_destroy(svc->block_reports);
  claim_table_free(svc->claims);
  for (size_t i = 0; i < svc->num_peers; i++) claim_table_free(svc->peers[i].table);
  while (svc->results) {
    result_block *next = svc->results->next;
    fl_buf_free(&svc->results->bytes);
    common_free(svc->results);
    svc->results = next;
  }
  dp_client_destroy(svc->fetcher);
  rpc_channel_destroy(svc->driver);
  while (svc->libraries) {
    exec_library *next = svc->libraries->next;
    common_free(svc->libraries); /* the handles stay loaded until the process ends */
    svc->libraries = next;
  }
  if (svc->own_work_dir) common_remove_tree(svc->work_dir);
  pthread_cond_destroy(&svc->wake);
  pthread_cond_destroy(&svc->stop_wake);
  pthread_mutex_destroy(&svc->lock);
}

/* While the first registration waits for the driver: a stop request gives it up. */
typedef struct stop_watch {
  exec_service *svc;
  volatile sig_atomic_t *stop;
  atomic_bool done; /* the registration returned */
} stop_watch;

static void *stop_watch_main(void *arg) {
  stop_watch *w = arg;
  while (!atomic_load(&w->done) && !*w->stop) usleep(20000);
  if (*w->stop) atomic_store(&w->svc->abandon, true);
  return NULL;
}

fl_status executor_serve(const executor_config *cfg, volatile sig_atomic_t *stop) {
  if (!cfg->driver || !*cfg->driver) return FL_ERR(FL_EINVAL, "executor: no driver address");
  if (cfg->cores == 0 || cfg->cores > 1024) return FL_ERR(FL_EINVAL, "executor: --cores must be 1 to 1024");
  if (cfg->memory < (1u << 20)) return FL_ERR(FL_EINVAL, "executor: --memory must be at least 1m");
  exec_service svc;
  memset(&svc, 0, sizeof svc);
  svc.cfg = *cfg;
  if (!svc.cfg.host || !*svc.cfg.host) svc.cfg.host = "127.0.0.1";
  if (!svc.cfg.shuffle_memory) svc.cfg.shuffle_memory = 64u << 20;
  FL_PCHECK(pthread_mutex_init(&svc.lock, NULL));
  FL_PCHECK(pthread_cond_init(&svc.wake, NULL));
  FL_PCHECK(pthread_cond_init(&svc.stop_wake, NULL));
  common_log_set_role("executor");
  common_spin_default_for_server();
  settings_read(&svc);
  fl_status status = FL_OK;

  const char *base = cfg->work_dir && *cfg->work_dir ? cfg->work_dir : getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  FL_CHECK(common_mkdirs(base));
  snprintf(svc.work_dir, sizeof svc.work_dir, "%s/flint-executor-XXXXXX", base);
  if (!mkdtemp(svc.work_dir)) {
    status = FL_ERR(FL_EIO, "cannot create a work folder in %s: %s", base, strerror(errno));
    goto cleanup;
  }
  svc.own_work_dir = true;
  char sub[PATH_MAX + 16];
  snprintf(sub, sizeof sub, "%s/lib", svc.work_dir);
  FL_CHECK(common_mkdirs(sub));
  snprintf(sub, sizeof sub, "%s/blocks", svc.work_dir);
  FL_CHECK(common_mkdirs(sub));
  const char *report_fd = config_string(CONFIG_EXECUTOR_REPORT_FD);
  if (report_fd) {
    FL_CHECK(executor_report_open(report_fd, config_string(CONFIG_EXECUTOR_RUNNING_FD), svc.work_dir));
    svc.supervised = true;
  }
  /* Every shared block keeps a descriptor: allow as many as the hard limit does. */
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  FL_CHECK(block_manager_create(cfg->memory, sub, true, &svc.blocks));
  FL_CHECK(exec_block_reports_create(&svc.block_reports));
  block_manager_set_listener(svc.blocks, exec_block_reports_changed, svc.block_reports);
  shared_block_node(svc.node);
  svc.pid = (uint32_t)getpid();
  if (claim_table_create(&svc.claims) != FL_OK) /* then its tasks are its own: none is offered */
    common_log(LOG_WARN, "no claim table, so node peers cannot take this executor's tasks: %s", fl_last_error());
  FL_CHECK(task_pool_create(cfg->cores, "fl-task", &svc.pool));
  FL_CHECK(dp_client_create(cfg->secret, &svc.fetcher));
  FL_CHECK(dp_server_start(svc.cfg.host, 0, cfg->secret, exec_handle_block, &svc, &svc.blocks_server));
  ps_server_options pso = PS_SERVER_OPTIONS_INIT;
  pso.secret = cfg->secret;
  pso.timeout_ms = (uint32_t)config_ms(CONFIG_PS_TIMEOUT_MS);
  FL_CHECK(ps_server_start(svc.cfg.host, 0, &pso, &svc.ps));
  char listen[96];
  snprintf(listen, sizeof listen, "%s:0", svc.cfg.host);
  rpc_server_config rc = {.listen = listen, .secret = cfg->secret, .handler = exec_handle_rpc,
                          .quick = exec_handle_quick, .quick_methods = exec_handle_quick_methods,
                          .handler_arg = &svc};
  FL_CHECK(rpc_server_start(&rc, &svc.server));
  /* Large enough for a barrier checkpoint (512 MiB) and its envelope. */
  FL_CHECK(rpc_channel_create(cfg->driver, cfg->secret, RDD_BARRIER_CHECKPOINT_MAX + ((size_t)1 << 20), &svc.driver));
  stop_watch watch = {&svc, stop, false};
  pthread_t watcher;
  bool watching = pthread_create(&watcher, NULL, stop_watch_main, &watch) == 0;
  status = exec_driver_register(&svc, RPC_TIMEOUT_MS);
  atomic_store(&watch.done, true);
  if (watching) pthread_join(watcher, NULL);
  if (status != FL_OK && *stop) { /* stopped while the driver did not answer: not an error */
    common_log(LOG_INFO, "stopped before the driver at %s answered the registration", cfg->driver);
    status = FL_OK;
    goto cleanup;
  }
  if (status != FL_OK) {
    common_error_wrap(status, "cannot register with the driver at %s: ", cfg->driver);
    goto cleanup;
  }
  common_log(LOG_INFO, "registered with the driver at %s: %u cores, %llu MiB, blocks on port %d, parameter server on %s:%d",
             cfg->driver, cfg->cores, (unsigned long long)(cfg->memory >> 20),
             dp_server_port(svc.blocks_server), svc.cfg.host, ps_server_port(svc.ps));
  if (pthread_create(&svc.status_thread, NULL, exec_task_status_main, &svc) != 0 ||
      pthread_create(&svc.heartbeat_thread, NULL, exec_driver_heartbeat_main, &svc) != 0) {
    status = FL_ERR(FL_ENOMEM, "cannot start the executor's threads");
    goto cleanup;
  }
  while (!*stop && !atomic_load(&svc.fatal)) usleep(20000);
  if (atomic_load(&svc.fatal)) {
    /* Tasks that ignore kills hold pool threads, which a clean stop would join for ever: the
     * process ends here (its supervisor starts a clean one), leaving only its folder behind. */
    fprintf(stderr, "flint executor: %s\n", svc.fatal_error);
    if (svc.own_work_dir) common_remove_tree(svc.work_dir);
    _exit(1);
  }
  common_log(LOG_INFO, "stopping");
cleanup:
  service_destroy(&svc);
  return status;
}
