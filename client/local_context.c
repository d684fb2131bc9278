/*
 * local_context.c: a local context (masters local, local[N], local[*]) is one process: the
 * scheduler, the local backend's task threads, a block manager and the shared-variable
 * registry.
 *
 * Settings (declared with every other in common/config.h): FLINT_MEMORY, FLINT_SHUFFLE_MEMORY
 * and FLINT_WORK_DIR, where the options give none.
 *
 * Threading: the scheduler's (driver/scheduler/scheduler.h); open and close run on the
 * caller's thread.
 */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "ps/ps.h"
#include "driver/driver.h"
#include "driver/ui/ui.h"
#include "shuffle/shuffle.h"

/* A local context caches in at most this share of the machine's memory when neither the
 * options nor FLINT_MEMORY say (as Spark's spark.memory.fraction, 0.6 of the heap): the rest
 * is for the tasks' working memory, the shuffle and everything else on the machine. */
#define DEFAULT_MEMORY_FRACTION 0.6
/* Where the machine's memory cannot be read. */
#define FALLBACK_MEMORY (1ull << 30)
#define DEFAULT_MAX_ATTEMPTS 4
/* More task threads than this is a typo, not a machine. */
#define MAX_LOCAL_THREADS 4096

typedef struct context_impl {
  fl_context pub; /* first, so the rdd layer's fl_context * is this struct */
  scheduler *sched;
  block_manager *blocks;
  char *work_dir;
  client_ps_local ps; /* parameter servers of its tables (ps_tables.c) */
  ui *ui;             /* FLINT_UI=1 or FLINT_EVENT_LOG_DIR: the web UI and event log; else NULL */
  client_progress *progress; /* the console bar, when stderr is a terminal (progress.c) */
} context_impl;

client_ps_local *client_local_context_ps(fl_context *ctx) { return &((context_impl *)ctx)->ps; }
ui *client_local_context_ui(fl_context *ctx) { return ((context_impl *)ctx)->ui; }

/* The parameter servers' lock and ids; the servers start with the first table (ps_tables.c) and
 * stop with the context. */
static void ps_local_init(client_ps_local *p) {
  memset(p, 0, sizeof *p);
  FL_PCHECK(pthread_mutex_init(&p->lock, NULL));
  p->next_table = 1;
}

static void ps_local_stop(client_ps_local *p) {
  for (int i = 0; i < CLIENT_PS_LOCAL_SERVERS; i++) ps_server_stop(p->servers[i]);
  pthread_mutex_destroy(&p->lock);
}

/* Barrier reports reach the on_report of their dataset on the action's thread. */
static void deliver_report(void *arg, uint64_t rdd_id, uint32_t rank, fl_bytes message) {
  rdd_barrier_deliver(arg, rdd_id, rank, message);
}

static fl_status context_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                                 const rdd_action *action, fl_buf *results) {
  context_impl *c = impl;
  sched_job_opts opts = {.on_report = deliver_report, .report_arg = r};
  client_progress_begin(c->progress);
  fl_status st = scheduler_run_job(c->sched, r, parts, num_parts, action,
                                   rdd_barrier_reports_wanted(r) ? &opts : NULL, results);
  client_progress_end(c->progress);
  return st;
}

/* The bar's source: the stages of this context's jobs (group 0). */
static fl_status progress_source(void *arg, sched_stage_progress *out, uint32_t cap, uint32_t *count) {
  return scheduler_progress(((context_impl *)arg)->sched, 0, out, cap, count);
}

static void local_close(fl_context *ctx);
static fl_status local_stats(fl_context *ctx, fl_context_stats *out);
static fl_status local_cancel(fl_context *ctx) { return scheduler_cancel(((context_impl *)ctx)->sched, 0, 0); }

static fl_status local_post_event(void *impl, const char *json) {
  context_impl *c = impl;
  return c->ui ? ui_post_program_event(c->ui, 0, json) : FL_OK;
}

static const rdd_runtime_ops local_runtime = {.run_job = context_run_job, .post_event = local_post_event};

/* "local" -> 1, "local[N]" -> N, "local[*]" -> cores. */
static fl_status parse_master(const char *master, uint32_t *threads) {
  if (strcmp(master, "local") == 0) {
    *threads = 1;
    return FL_OK;
  }
  if (strcmp(master, "local[*]") == 0) {
    *threads = common_cores();
    return FL_OK;
  }
  unsigned long n;
  char close_bracket, extra;
  if (sscanf(master, "local[%lu%c%c", &n, &close_bracket, &extra) == 2 && close_bracket == ']' &&
      strchr(master, '-') == NULL) {
    if (n < 1 || n > MAX_LOCAL_THREADS)
      return FL_ERR(FL_EINVAL, "master '%s': the thread count must be 1 to %d", master,
                    MAX_LOCAL_THREADS);
    *threads = (uint32_t)n;
    return FL_OK;
  }
  return FL_ERR(FL_EINVAL,
                "unknown master '%s': expected local, local[N], local[*], "
                "local-cluster[EXECUTORS,CORES,MEGABYTES] or flint://HOST:PORT",
                master);
}

/* The default memory for cached blocks: DEFAULT_MEMORY_FRACTION of physical memory, or of
 * the cgroup (v2) memory limit where that is lower (a container sees the host's pages). */
static uint64_t default_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
  if (f) {
    unsigned long long limit;
    if (fscanf(f, "%llu", &limit) == 1 && limit > 0 && (total == 0 || limit < total)) total = limit; /* "max": none */
    fclose(f);
  }
  return total ? (uint64_t)((double)total * DEFAULT_MEMORY_FRACTION) : FALLBACK_MEMORY;
}

/* An option's value, else the setting's, else `computed` (for a setting whose default the
 * reader works out) or the setting's default. An invalid setting is an error. */
static fl_status resolve_memory(uint64_t option, config_id id, uint64_t computed, uint64_t *out) {
  if (option) {
    *out = option;
    return FL_OK;
  }
  fl_status st = config_check(id);
  if (st != FL_OK) return st;
  bool reader_default = config_setting_of(id)->flags & CONFIG_COMPUTED;
  *out = reader_default && !config_given(id) ? computed : config_memory(id);
  return FL_OK;
}

static fl_status make_work_dir(const fl_options *opts, char **out) {
  const char *base = client_work_base(opts ? opts->work_dir : NULL);
  fl_status s = common_mkdirs(base);
  if (s != FL_OK) return s;
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/flint-XXXXXX", base) >= (int)sizeof path)
    return FL_ERR(FL_EINVAL, "work dir path too long: %s", base);
  if (!mkdtemp(path)) return FL_ERR(FL_EIO, "cannot create a work folder in %s: %s", base, strerror(errno));
  if (!(*out = common_strdup(path))) {
    rmdir(path);
    return FL_ERR(FL_ENOMEM, "out of memory");
  }
  return FL_OK;
}

/* The block manager's listener (arg: the context): its blocks' changes for the storage page
 * (their datasets' names come with the jobs' JobStart). Under the block manager's lock;
 * ui_post never blocks. */
static void block_changed(void *arg, rdd_block_key key, fl_storage_level level, uint64_t memory, uint64_t disk) {
  driver_ui_block(((context_impl *)arg)->ui, 0, 0, key.rdd_id, key.partition, level, memory, disk, NULL, 0);
}

/* The UI's live figures: the tables' clocks (the UI stops before the servers do). */
static char *local_ui_live(void *arg, const char *what, uint64_t app) {
  (void)app;
  client_ps_local *p = &((context_impl *)arg)->ps;
  if (strcmp(what, "ps") != 0) return NULL;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  char *(*live_json)(client_ps_local *) = p->live_json;
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  return live_json ? live_json(p) : NULL;
}

/* The web UI and the event log, when asked for (docs/ui.md): one application (number 0)
 * whose tasks run on the "driver" executor, this process. */
static fl_status start_ui(context_impl *c, const char *master, const fl_options *options, uint32_t threads,
                          uint64_t memory) {
  const char *log_dir = config_string(CONFIG_EVENT_LOG_DIR);
  bool serve = (options && options->web_ui) || config_bool(CONFIG_UI);
  if (!serve && !(log_dir && *log_dir)) return FL_OK;
  ui_config uc = {.host = "127.0.0.1",
                  .port = serve ? (int)config_count(CONFIG_UI_PORT) : -1,
                  .port_retries = !config_given(CONFIG_UI_PORT),
                  .log_dir = log_dir,
                  .title = "local",
                  .live = local_ui_live,
                  .live_arg = c};
  fl_status st = ui_create(&uc, &c->ui);
  if (st != FL_OK) return st;
  scheduler_set_listener(c->sched, ui_scheduler_note, c->ui);
  block_manager_set_listener(c->blocks, block_changed, c);
  const char *name = options && options->app_name && *options->app_name ? options->app_name
                                                                         : config_string(CONFIG_APP_NAME);
  ui_post_application(c->ui, 0, name && *name ? name : program_invocation_short_name, master);
  ui_postf(c->ui, "{\"Event\":\"ExecutorAdded\",\"App\":0,\"Executor\":0,\"Host\":\"localhost\",\"Cores\":%u,"
                  "\"Memory\":%llu,\"GPU\":-1}",
           threads, (unsigned long long)memory);
  if (serve) {
    snprintf(c->pub.ui_url, sizeof c->pub.ui_url, "http://127.0.0.1:%d", ui_port(c->ui));
    common_log(LOG_INFO, "web UI available at %s", c->pub.ui_url);
  }
  return FL_OK;
}

fl_status client_local_context_open(const char *master, const fl_options *options, fl_context **out) {
  uint32_t threads = 0;
  uint64_t memory = 0, shuffle_memory = 0;
  fl_status status = parse_master(master, &threads);
  if (status != FL_OK) return status;
  if ((status = resolve_memory(options ? options->memory_limit : 0, CONFIG_MEMORY, default_memory(), &memory)) !=
          FL_OK ||
      (status = resolve_memory(options ? options->shuffle_memory : 0, CONFIG_SHUFFLE_MEMORY, 0, &shuffle_memory)) !=
          FL_OK)
    return status;

  context_impl *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a context");
  ps_local_init(&c->ps);
  backend *b = NULL;
  FL_CHECK(make_work_dir(options, &c->work_dir));
  FL_CHECK(block_manager_create(memory, c->work_dir, false, &c->blocks));
  FL_CHECK(rdd_shared_create(&c->pub.shared));
  FL_CHECK(map_output_table_create(&c->pub.map_outputs));
  FL_CHECK(scheduler_create(options && options->max_task_attempts ? options->max_task_attempts
                                                                  : DEFAULT_MAX_ATTEMPTS,
                            &c->sched));
  FL_CHECK(local_backend_create(c->sched, threads, options && options->contain_task_crashes, &b));
  scheduler_set_backend(c->sched, b);
  FL_CHECK(start_ui(c, master, options, threads, memory));
  if (!(options && options->no_console_progress) && common_progress_on_terminal(STDERR_FILENO))
    FL_CHECK(client_progress_create(STDERR_FILENO, 0, progress_source, c, &c->progress));
  c->pub.barrier = &barrier_local_ops;
  c->pub.barrier_impl = scheduler_barriers(c->sched);
  c->pub.runtime = &local_runtime;
  c->pub.runtime_impl = c;
  c->pub.cache = &block_manager_cache_ops;
  c->pub.cache_impl = c->blocks;
  c->pub.cores = threads;
  c->pub.shuffle_memory = shuffle_memory;
  c->pub.work_dir = c->work_dir;
  c->pub.default_parallelism =
      options && options->default_parallelism ? options->default_parallelism : threads;
  atomic_init(&c->pub.next_rdd_id, 1);
  c->pub.close = local_close;
  c->pub.stats = local_stats;
  c->pub.cancel = local_cancel;
  *out = &c->pub;
  return FL_OK;
cleanup:
  local_close(&c->pub);
  return status;
}

static void local_close(fl_context *ctx) {
  context_impl *c = (context_impl *)ctx;
  client_progress_destroy(c->progress); /* before the scheduler it asks */
  scheduler_destroy(c->sched);
  if (c->ui) { /* its blocks go with it, as a cluster's executors drop an application's */
    block_manager_remove_range(c->blocks, 0, UINT64_MAX);
    block_manager_set_listener(c->blocks, NULL, NULL);
  }
  ui_postf(c->ui, "{\"Event\":\"ApplicationEnd\",\"App\":0}");
  ui_destroy(c->ui); /* after the scheduler's last note */
  ps_local_stop(&c->ps); /* after the tasks, which may be its workers */
  block_manager_destroy(c->blocks);
  rdd_shared_destroy(c->pub.shared);
  map_output_table_destroy(c->pub.map_outputs);
  if (c->work_dir) common_remove_tree(c->work_dir);
  common_free(c->work_dir);
  common_free(c);
}

static fl_status local_stats(fl_context *ctx, fl_context_stats *out) {
  context_impl *c = (context_impl *)ctx;
  scheduler_stats ss;
  block_manager_stats bs;
  scheduler_stats_get(c->sched, &ss);
  block_manager_stats_get(c->blocks, &bs);
  out->jobs_run = ss.jobs_run;
  out->jobs_failed = ss.jobs_failed;
  out->tasks_run = ss.tasks_run;
  out->tasks_failed = ss.tasks_failed;
  out->task_seconds = (double)ss.task_ns * 1e-9;
  out->blocks_evicted = bs.evictions;
  out->memory_used = bs.memory_used;
  out->blocks_read_mapped = out->blocks_read_fetched = 0; /* one process: every read is its own */
  out->input_bytes = ss.input_bytes;
  out->shuffle_read_bytes = ss.shuffle_read_bytes;
  out->shuffle_write_bytes = ss.shuffle_write_bytes;
  return FL_OK;
}
