/*
 * server.c: the driver process's life (driver_serve): its settings (FLINT_* variables), the
 * scheduler with the cluster backend, the control plane's server (handlers.c) and the block
 * server (libraries), the leases' thread; and its end, in the order that lets every part
 * finish what the others still need.
 *
 * Threading: driver_serve's thread only waits for *stop; everything else runs on the
 * threads of the parts it starts (driver_internal.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "driver/driver_internal.h"

/* Tasks launched per executor core at once: those beyond the cores wait in the executor's
 * queue, so a core that finishes a task starts the next without a round trip to the driver
 * (one launch and one status update cost about a millisecond here). Binding many ahead no
 * longer unbalances a stage over cached data within a host, where the other executors take
 * a slower one's queued tasks (node-shared tasks); 16 let a stage of Sandblaster's small
 * tasks (32 on 2 cores) go out in one launch per executor, where 8 left each executor idle
 * for about 2 ms a job waiting for the rest. */
#define DRIVER_SLOTS_PER_CORE 16

/* A setting of milliseconds (common/config.h), in nanoseconds. */
static uint64_t setting_ns(config_id id) { return config_ms(id) * 1000000ull; }

/* The web UI and the event log (docs/ui.md): on unless FLINT_UI=0, on the RPC's host. It
 * takes the scheduler's notes from before the first job. */
static fl_status start_ui(driver_state *d, const char *host) {
  const char *log_dir = config_string(CONFIG_EVENT_LOG_DIR);
  bool serve = !config_given(CONFIG_UI) || config_bool(CONFIG_UI);
  if (!serve && !(log_dir && *log_dir)) return FL_OK;
  ui_config uc = {.host = host,
                  .port = serve ? (int)config_count(CONFIG_UI_PORT) : -1,
                  .port_retries = !config_given(CONFIG_UI_PORT),
                  .secret = d->cfg.secret,
                  .log_dir = log_dir,
                  .title = "driver",
                  .live = driver_ui_live,
                  .live_arg = d};
  fl_status st = ui_create(&uc, &d->ui);
  if (st != FL_OK) return st;
  scheduler_set_listener(d->sched, ui_scheduler_note, d->ui);
  if (serve) common_log(LOG_INFO, "web UI available at %s://%s:%d", config_bool(CONFIG_TLS) ? "https" : "http", host,
                        ui_port(d->ui));
  return FL_OK;
}

fl_status driver_serve(const driver_config *cfg, volatile sig_atomic_t *stop) {
  driver_state d;
  memset(&d, 0, sizeof d);
  d.cfg = *cfg;
  FL_PCHECK(pthread_mutex_init(&d.lock, NULL));
  FL_PCHECK(pthread_cond_init(&d.changed, NULL));
  common_log_set_role("driver");
  common_spin_default_for_server();
  fl_status status = FL_OK;
  char host[64];
  const char *colon = cfg->listen ? strrchr(cfg->listen, ':') : NULL;
  if (!colon || colon == cfg->listen || (size_t)(colon - cfg->listen) >= sizeof host) {
    status = FL_ERR(FL_EINVAL, "--listen '%s' is not HOST:PORT", cfg->listen ? cfg->listen : "");
    goto cleanup;
  }
  memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
  host[colon - cfg->listen] = 0;

  const char *base = cfg->work_dir && *cfg->work_dir ? cfg->work_dir : getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  FL_CHECK(common_mkdirs(base));
  snprintf(d.work_dir, sizeof d.work_dir, "%s/flint-driver-XXXXXX", base);
  if (!mkdtemp(d.work_dir)) {
    d.work_dir[0] = 0;
    status = FL_ERR(FL_EIO, "cannot create a work folder in %s: %s", base, strerror(errno));
    goto cleanup;
  }
  char sub[PATH_MAX + 16];
  snprintf(sub, sizeof sub, "%s/lib", d.work_dir);
  FL_CHECK(common_mkdirs(sub));
  snprintf(sub, sizeof sub, "%s/jobs", d.work_dir);
  FL_CHECK(common_mkdirs(sub));

  FL_CHECK(task_pool_create(DRIVER_REPLY_THREADS, "fl-reply", &d.replies));
  FL_CHECK(scheduler_create(4, &d.sched));
  sched_speculation spec = {.enabled = config_bool(CONFIG_SPECULATION),
                            .quantile = config_real(CONFIG_SPECULATION_QUANTILE),
                            .multiplier = config_real(CONFIG_SPECULATION_MULTIPLIER),
                            .min_ns = setting_ns(CONFIG_SPECULATION_MIN_MS)};
  if (!(spec.quantile > 0 && spec.quantile <= 1) || !(spec.multiplier >= 1)) {
    common_log(LOG_WARN, "FLINT_SPECULATION_QUANTILE must be in (0, 1] and FLINT_SPECULATION_MULTIPLIER "
               "at least 1: using 0.75 and 1.5");
    spec.quantile = 0.75;
    spec.multiplier = 1.5;
  }
  scheduler_set_speculation(d.sched, &spec);
  if (spec.enabled)
    common_log(LOG_INFO, "speculation on: quantile %.2f, multiplier %.2f, minimum %.0f ms", spec.quantile,
               spec.multiplier, (double)spec.min_ns / 1e6);
  /* 63 bits, never 0: executors keep 0 and all ones for none (executor/driver_link.c) */
  d.incarnation = common_random_u64() >> 1 | 1;
  d.client_timeout_ns = setting_ns(CONFIG_CLIENT_TIMEOUT_MS);
  if (d.client_timeout_ns < 300000000ull) {
    common_log(LOG_WARN, "FLINT_CLIENT_TIMEOUT_MS below 300: using 300");
    d.client_timeout_ns = 300000000ull;
  }
  cluster_config cc = {.secret = cfg->secret,
                       .incarnation = d.incarnation,
                       .slots_per_core = DRIVER_SLOTS_PER_CORE,
                       .offer_node_tasks = config_bool(CONFIG_NODE_OFFERS),
                       .executor_timeout_ns = setting_ns(CONFIG_EXECUTOR_TIMEOUT_MS),
                       .no_executor_timeout_ns = setting_ns(CONFIG_NO_EXECUTOR_TIMEOUT_MS),
                       .no_executor_warn_ns = setting_ns(CONFIG_NO_EXECUTOR_WARN_MS),
                       .executor_lost = apps_forget_executor,
                       .executor_lost_arg = &d,
                       .blocks_reported = apps_blocks_reported};
  FL_CHECK(start_ui(&d, host));
  cc.ui = d.ui;
  FL_CHECK(cluster_backend_create(d.sched, &cc, &d.cluster));
  sched_placement placement = {.locality_wait_ns = setting_ns(CONFIG_LOCALITY_WAIT_MS),
                               .exclude_failures = (uint32_t)config_count(CONFIG_EXCLUDE_FAILURES),
                               .exclude_ns = setting_ns(CONFIG_EXCLUDE_MS),
                               .input_at = cluster_input_at,
                               .arg = d.cluster};
  scheduler_set_placement(d.sched, &placement);
  scheduler_set_backend(d.sched, cluster_backend_base(d.cluster));
  FL_CHECK(dp_server_start(host, 0, cfg->secret, libraries_serve, &d, &d.blocks));
  FL_CHECK(placement_start(&d));
  /* Results of a job come back to the client in one reply (collect), hence the size limit. */
  rpc_server_config rc = {.listen = cfg->listen, .secret = cfg->secret, .handler = handlers_dispatch,
                          .quick = handlers_quick, .quick_methods = handlers_quick_methods,
                          .handler_arg = &d, .handler_threads = 128, /* barrier gathers block one each */
                          .max_message = DRIVER_MAX_MESSAGE};
  FL_CHECK(rpc_server_start(&rc, &d.server));
  snprintf(d.address, sizeof d.address, "%s:%d", host, rpc_server_port(d.server));
  common_log(LOG_INFO, "listening on %s (blocks on port %d)%s", d.address, dp_server_port(d.blocks),
             cfg->secret && *cfg->secret ? ", shared secret required" : "");
  if (cfg->port_file) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", cfg->port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", rpc_server_port(d.server)) < 0 || fclose(f) != 0 ||
        rename(tmp, cfg->port_file) != 0) {
      status = FL_ERR(FL_EIO, "cannot write the port file %s: %s", cfg->port_file, strerror(errno));
      goto cleanup;
    }
  }
  d.lease_started = pthread_create(&d.lease_thread, NULL, apps_lease_main, &d) == 0;
  if (!d.lease_started) common_log(LOG_ERROR, "cannot start the lease thread: silent clients' applications stay open");
  while (!*stop) usleep(20000);
  common_log(LOG_INFO, "stopping");
cleanup:
  atomic_store(&d.leases_stop, true);
  jobs_services_stop(&d); /* their calls answered while the rpc server can still send */
  rpc_server_stop(d.server); /* every RunJob call answered: the reply pool is idle */
  if (d.lease_started) pthread_join(d.lease_thread, NULL); /* no call holds an application now */
  task_pool_destroy(d.replies);
  submissions_stop(&d); /* job binaries end with their driver */
  dp_server_stop(d.blocks);
  libraries_free_names(&d);
  apps_free_all(&d);
  placement_stop(&d);
  scheduler_destroy(d.sched); /* and the cluster backend */
  ui_destroy(d.ui);            /* after the scheduler's last note */
  placement_free(&d);
  if (d.work_dir[0]) common_remove_tree(d.work_dir);
  pthread_cond_destroy(&d.changed);
  pthread_mutex_destroy(&d.lock);
  return status;
}
