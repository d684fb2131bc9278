/* test_cluster.c: cluster mode against local mode. The pipelines of the cluster_pipelines
 * library (linked in, not dlopened: in cluster mode user functions must live in a shared
 * library) give byte-identical reports on local[2] and local-cluster[2,1,512]; a function
 * of this program is refused by name; bad masters fail at once, an unreachable driver
 * within the connect timeout; and closing a local cluster leaves no child process. */
#include "test_util.h"

#include <errno.h>
#include <glob.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

/* From tests/jobs/cluster_pipelines.c. */
int cluster_pipelines_run(fl_context *ctx, fl_buf *report);
fl_status cp_times(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status cp_counted_copy(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_nap(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_slow_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
typedef struct cp_big_arg {
  uint64_t accumulator;
  uint32_t bytes;
} cp_big_arg;
fl_status cp_big_record(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_emit_pid(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_slow_in_process(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_exit_if_peer(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_slow_marked(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_slow_claimed(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_crawl_if_peer(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_tag_pid(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_first_tag(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_big_record_pid(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_head_i64(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_slow_once(fl_bytes rec, fl_buf *out, const void *arg);
typedef struct cp_slow_once_arg {
  uint64_t accumulator;
  uint32_t sleep_ms;
  char marker[200];
  char gate[200];
  uint32_t gate_bytes;
  char tally[200];
} cp_slow_once_arg;
fl_status cp_broadcast_lookup(fl_bytes rec, fl_buf *out, const void *arg);

#define CLUSTER "local-cluster[2,1,512]"
#define TEST_BOUND_S 170 /* each test's bound (sanitizer build on a loaded 2-core machine included): a
                           hang fails the program instead of ctest's timeout */

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_cluster: a test ran past its time bound (a hang?)\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1)) {
  }
  _exit(3);
}

static int arm_watchdog(void **state) {
  (void)state;
  signal(SIGALRM, on_alarm);
  alarm(TEST_BOUND_S);
  return 0;
}
static int disarm_watchdog(void **state) {
  (void)state;
  alarm(0);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Every child process (a local cluster's driver and executors) has been reaped. */
static void assert_no_children(void) {
  errno = 0;
  pid_t r = waitpid(-1, NULL, WNOHANG);
  if (r != -1) fprintf(stderr, "a child process remains (waitpid gave %d)\n", (int)r);
  assert_int_equal(r, -1);
  assert_int_equal(errno, ECHILD);
}

/* Runs the pipelines on a fresh context of `master`; the report goes into *report. */
static void run_pipelines(const char *master, fl_buf *report) {
  fl_context *ctx;
  double t0 = now_s();
  assert_ok(fl_context_open(master, NULL, &ctx));
  int rc = cluster_pipelines_run(ctx, report);
  fl_context_close(ctx);
  fprintf(stderr, "pipelines on %s: %.1f s\n", master, now_s() - t0);
  if (rc != 0)
    fprintf(stderr, "cluster_pipelines_run failed on %s; its report:\n%.*s\n", master, (int)report->len,
            (const char *)report->data);
  assert_int_equal(rc, 0);
}

/* The line of `text` that starts at byte `at`, without its '\n'. */
static int line_len(const fl_buf *text, size_t at) {
  size_t end = at;
  while (end < text->len && text->data[end] != '\n') end++;
  return (int)(end - at);
}

static void test_cluster_matches_local(void **state) {
  (void)state;
  fl_buf local = FL_BUF_INIT, cluster = FL_BUF_INIT;
  run_pipelines("local[2]", &local);
  run_pipelines(CLUSTER, &cluster);
  assert_no_children();
  assert_true(local.len > 0);
  bool same = local.len == cluster.len && memcmp(local.data, cluster.data, local.len) == 0;
  if (!same) {
    /* Both reports, then the first line where they part, as a unified diff shows it. */
    fprintf(stderr, "=== local[2] ===\n%.*s=== %s ===\n%.*s", (int)local.len, (const char *)local.data,
            CLUSTER, (int)cluster.len, (const char *)cluster.data);
    size_t i = 0, line_start = 0, line = 1;
    while (i < local.len && i < cluster.len && local.data[i] == cluster.data[i]) {
      if (local.data[i] == '\n') {
        line_start = i + 1;
        line++;
      }
      i++;
    }
    fprintf(stderr, "--- local[2]\n+++ %s\n@@ line %zu @@\n", CLUSTER, line);
    if (line_start < local.len)
      fprintf(stderr, "-%.*s\n", line_len(&local, line_start), (const char *)local.data + line_start);
    if (line_start < cluster.len)
      fprintf(stderr, "+%.*s\n", line_len(&cluster, line_start), (const char *)cluster.data + line_start);
  }
  fl_buf_free(&cluster);
  fl_buf_free(&local);
  assert_true(same);
}

/* A user function of the main program (exported: the program is linked with -rdynamic),
 * which a cluster cannot load: executors load functions from shared libraries only. */
fl_status tc_main_program_map(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(rec) + 1);
}

static void test_main_program_function_is_refused(void **state) {
  (void)state;
  fl_context *ctx;
  fl_dataset *src, *m = NULL;
  uint64_t n = 0;

  /* Local mode runs it: nothing ships. */
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  assert_ok(fl_range(ctx, 0, 10, 1, 2, &src));
  assert_ok(fl_map(src, tc_main_program_map, NULL, 0, &m));
  assert_ok(fl_count(m, &n));
  assert_int_equal(n, 10);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);

  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  assert_ok(fl_range(ctx, 0, 10, 1, 2, &src));
  /* The refusal comes with the action that ships the function (or, were a client to check
   * early, with fl_map itself): either way a clear message, never a crash on an executor. */
  m = NULL;
  fl_status s = fl_map(src, tc_main_program_map, NULL, 0, &m);
  if (s == FL_OK) s = fl_count(m, &n);
  char *msg = strdup(fl_last_error());
  assert_non_null(msg);
  if (s == FL_OK || !strstr(msg, "tc_main_program_map") || !strstr(msg, "main program"))
    fprintf(stderr, "status %s, message '%s'\n", fl_status_name(s), msg);
  assert_int_not_equal(s, FL_OK);
  assert_non_null(strstr(msg, "tc_main_program_map"));
  assert_non_null(strstr(msg, "main program"));
  free(msg);
  /* The context is still usable for functions it can ship (range has none of ours). */
  assert_ok(fl_count(src, &n));
  assert_int_equal(n, 10);
  fl_dataset_free(m);
  fl_dataset_free(src);
  fl_context_close(ctx);
  assert_no_children();
}

/* Executors fetch a large broadcast from the client that made it: when they cannot reach it
 * (here its advertised host does not resolve, as if the client had gone), the task fails with
 * a message that names the broadcast and the address, and the context stays usable. */
static void test_unreachable_broadcast_owner(void **state) {
  (void)state;
  setenv("FLINT_CLIENT_HOST", "client-gone.invalid", 1);
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  static int64_t table[16384]; /* 128 KiB: over what travels with a job */
  for (size_t i = 0; i < 16384; i++) table[i] = (int64_t)i + 1;
  fl_broadcast *b;
  fl_status created = fl_broadcast_create(ctx, table, sizeof table, &b); /* reads the variable */
  unsetenv("FLINT_CLIENT_HOST");
  assert_ok(created);
  struct {
    uint64_t id, len;
  } args = {fl_broadcast_id(b), sizeof table};
  fl_dataset *range, *mapped;
  assert_ok(fl_range(ctx, 0, 4, 1, 2, &range));
  assert_ok(fl_map(range, cp_broadcast_lookup, &args, sizeof args, &mapped));
  fl_records *records = NULL;
  fl_status st = fl_collect(mapped, &records);
  fprintf(stderr, "collect with an unreachable broadcast owner: %s\n", fl_last_error());
  assert_int_equal(st, FL_EJOB);
  char want[64];
  snprintf(want, sizeof want, "broadcast %llu", (unsigned long long)args.id);
  assert_non_null(strstr(fl_last_error(), want));
  assert_non_null(strstr(fl_last_error(), "client-gone.invalid:"));
  /* Jobs without the broadcast still run. */
  uint64_t n = 0;
  assert_ok(fl_count(range, &n));
  assert_int_equal(n, 4);
  fl_dataset_free(mapped);
  fl_dataset_free(range);
  fl_broadcast_destroy(b);
  fl_context_close(ctx);
  assert_no_children();
}

/* Sums x * table[(x * 7919) % n] over 0..99, as cp_broadcast_lookup maps each x. */
static int64_t lookup_sum(const int64_t *table, size_t n) {
  int64_t sum = 0;
  for (int64_t x = 0; x < 100; x++) sum += x * table[(size_t)(x * 7919) % n];
  return sum;
}

static int64_t job_lookup_sum(fl_dataset *range, fl_broadcast *b, size_t len) {
  struct {
    uint64_t id, len;
  } args = {fl_broadcast_id(b), len};
  fl_dataset *mapped;
  assert_ok(fl_map(range, cp_broadcast_lookup, &args, sizeof args, &mapped));
  fl_records *records = NULL;
  assert_ok(fl_collect(mapped, &records));
  int64_t sum = 0;
  for (size_t i = 0; i < fl_records_count(records); i++) sum += fl_i64(fl_records_get(records, i));
  fl_records_free(records);
  fl_dataset_free(mapped);
  return sum;
}

/* Small broadcasts travel with the jobs (client to driver with RunJob, driver to executors
 * with LaunchTasks) until an application's live ones pass 4 MiB; the rest are fetched from
 * the client. Both kinds give their values to tasks, also after others were destroyed (the
 * executors forget those) and new ones made. */
static void test_broadcasts_small_and_large(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  fl_dataset *range;
  assert_ok(fl_range(ctx, 0, 100, 1, 4, &range));
  enum { N = 70, LEN = 8192 }; /* 70 x 64 KiB: the last few go over 4 MiB */
  static int64_t tables[N + 2][LEN];
  fl_broadcast *b[N + 2];
  for (int k = 0; k < N; k++) {
    for (size_t i = 0; i < LEN; i++) tables[k][i] = k * 100000 + (int64_t)i;
    assert_ok(fl_broadcast_create(ctx, tables[k], sizeof tables[k], &b[k]));
  }
  static const int probe[] = {0, 1, 33, 63, 64, 68, 69};
  for (size_t p = 0; p < sizeof probe / sizeof *probe; p++) {
    int k = probe[p];
    assert_int_equal(job_lookup_sum(range, b[k], sizeof tables[k]), lookup_sum(tables[k], LEN));
  }
  /* Destroyed ones are dropped everywhere; new ones, small and one of 16 bytes, still arrive. */
  for (int k = 0; k < N - 1; k++) fl_broadcast_destroy(b[k]);
  for (size_t i = 0; i < LEN; i++) tables[N][i] = -(int64_t)i;
  int64_t tiny[2] = {5, 7};
  assert_ok(fl_broadcast_create(ctx, tables[N], sizeof tables[N], &b[N]));
  assert_ok(fl_broadcast_create(ctx, tiny, sizeof tiny, &b[N + 1]));
  assert_int_equal(job_lookup_sum(range, b[N], sizeof tables[N]), lookup_sum(tables[N], LEN));
  assert_int_equal(job_lookup_sum(range, b[N + 1], sizeof tiny), lookup_sum(tiny, 2));
  assert_int_equal(job_lookup_sum(range, b[N - 1], sizeof tables[N - 1]), lookup_sum(tables[N - 1], LEN));
  for (int k = N - 1; k < N + 2; k++) fl_broadcast_destroy(b[k]);
  fl_dataset_free(range);
  fl_context_close(ctx);
  assert_no_children();
}

static void test_bad_masters_fail_fast(void **state) {
  (void)state;
  fl_context *ctx = NULL;
  assert_fails_with(fl_context_open("local-cluster[0,1,512]", NULL, &ctx), FL_EINVAL, "local-cluster[0,1,512]");
  assert_null(ctx);
  assert_fails_with(fl_context_open("local-cluster[2,x]", NULL, &ctx), FL_EINVAL, "local-cluster[2,x]");
  assert_fails_with(fl_context_open("local-cluster[2,1,512", NULL, &ctx), FL_EINVAL, "local-cluster");
  assert_fails_with(fl_context_open("local-cluster[2,1,512]x", NULL, &ctx), FL_EINVAL, "local-cluster");
  assert_null(ctx);
  assert_no_children();

  /* Nothing listens on port 1: the open fails (the watchdog catches a hang). */
  double t0 = now_s();
  fl_status s = fl_context_open("flint://127.0.0.1:1", NULL, &ctx);
  fprintf(stderr, "flint://127.0.0.1:1: %s after %.1f s: %s\n", fl_status_name(s), now_s() - t0, fl_last_error());
  assert_int_not_equal(s, FL_OK);
  assert_true(fl_last_error()[0] != '\0');
  assert_null(ctx);
}

/* One small job with functions of the shared library: the cluster really runs tasks. */
static void run_small_job(fl_context *ctx) {
  fl_dataset *ds, *doubled;
  fl_buf sum = FL_BUF_INIT;
  int64_t two = 2;
  assert_ok(fl_range(ctx, 0, 1000, 1, 4, &ds));
  assert_ok(fl_map(ds, cp_times, &two, sizeof two, &doubled));
  assert_ok(fl_reduce(doubled, cp_sum, NULL, 0, &sum));
  assert_int_equal(fl_i64(fl_buf_bytes(&sum)), 999 * 1000);
  fl_buf_free(&sum);
  fl_dataset_free(doubled);
  fl_dataset_free(ds);
}

static void test_clusters_one_after_another(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    fl_context *ctx;
    assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
    run_small_job(ctx);
    fl_context_close(ctx);
    assert_no_children(); /* the driver and both executors are gone and reaped */
  }
}

/* A cached dataset is computed once, whichever executor its later tasks land on: with no
 * locality wait, tasks often run away from their partition and read it from the executor
 * that caches it (the data plane) instead of computing it again. The accumulator counts
 * computations; counts and sums must not move after the first action. */
static void test_cached_partitions_read_remotely(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "0", 1); /* read by the driver the context starts */
  fl_context *ctx;
  fl_status opened = fl_context_open(CLUSTER, NULL, &ctx);
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  assert_ok(opened);
  fl_accumulator *computed;
  assert_ok(fl_accumulator_create_i64(ctx, &computed));
  uint64_t id = fl_accumulator_id(computed);
  fl_dataset *ds, *copied;
  assert_ok(fl_range(ctx, 0, 16000, 1, 16, &ds));
  assert_ok(fl_map(ds, cp_counted_copy, &id, sizeof id, &copied));
  assert_ok(fl_cache(copied));
  for (int round = 0; round < 6; round++) {
    uint64_t n = 0;
    assert_ok(fl_count(copied, &n));
    assert_int_equal(n, 16000);
  }
  int64_t computations = 0;
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, 16000);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(copied, &info));
  assert_int_equal(info.cached_partitions, 16);
  /* the executors' own figures: 16000 records of 8 bytes and a length byte each */
  assert_true(info.memory_bytes >= 16000 * 9 && info.memory_bytes <= 16000 * 9 + 16 * 64);
  assert_int_equal(info.disk_bytes, 0);
  assert_ok(fl_unpersist(copied));
  assert_ok(fl_storage_info_get(copied, &info));
  assert_int_equal(info.cached_partitions, 0);
  assert_int_equal(info.memory_bytes, 0);
  fl_dataset_free(copied);
  fl_dataset_free(ds);
  fl_accumulator_destroy(computed);
  fl_context_close(ctx);
  assert_no_children();
}

/* A job's lineage with more persisted datasets than the client once sent storage levels
 * for (256, in a fixed array, the rest silently dropped): every one of them is cached, the
 * first as the last, and is not computed again. The datasets reach the driver before they
 * are persisted, so that only the job's list of levels can tell it. */
static void test_many_persisted_datasets(void **state) {
  (void)state;
  enum { DATASETS = 300, RECORDS = 40 };
  fl_context *ctx;
  assert_ok(fl_context_open("local-cluster[1,1,256]", NULL, &ctx));
  fl_accumulator *computed;
  assert_ok(fl_accumulator_create_i64(ctx, &computed));
  uint64_t id = fl_accumulator_id(computed);
  fl_dataset *ds[DATASETS + 1];
  assert_ok(fl_range(ctx, 0, RECORDS, 1, 2, &ds[0]));
  for (int i = 1; i <= DATASETS; i++) assert_ok(fl_map(ds[i - 1], cp_counted_copy, &id, sizeof id, &ds[i]));
  uint64_t n = 0;
  assert_ok(fl_count(ds[DATASETS], &n)); /* ships the plan */
  assert_int_equal(n, RECORDS);
  for (int i = 1; i <= DATASETS; i++) assert_ok(fl_cache(ds[i]));
  assert_ok(fl_count(ds[DATASETS], &n)); /* computes and caches every one */
  assert_int_equal(n, RECORDS);
  int64_t computations = 0;
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, 2 * DATASETS * RECORDS);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(ds[1], &info));
  assert_int_equal(info.cached_partitions, 2); /* was 0: its level never reached the driver */
  assert_ok(fl_count(ds[1], &n));
  assert_int_equal(n, RECORDS);
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, 2 * DATASETS * RECORDS);
  for (int i = DATASETS; i >= 0; i--) fl_dataset_free(ds[i]);
  fl_accumulator_destroy(computed);
  fl_context_close(ctx);
  assert_no_children();
}

/* Node-local reads: executors on one host read each other's cached partitions in place. One
 * executor is slow (its tasks sleep); the other, once its own partitions are done, takes the
 * tasks of partitions cached by the slow one that still wait for a slot, and maps those blocks
 * from the slow one's memory: the job's results are right, nothing is computed again or
 * fetched over the network, and the reads are counted as mapped. */
static void test_node_local_reads(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "60000", 1); /* only node-local placement may move a task */
  fl_context *ctx;
  fl_status opened = fl_context_open(CLUSTER, NULL, &ctx);
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  assert_ok(opened);
  enum { PARTS = 48, BYTES = 300000 };
  fl_accumulator *computed;
  assert_ok(fl_accumulator_create_i64(ctx, &computed));
  cp_big_arg big = {fl_accumulator_id(computed), BYTES};
  fl_dataset *ds, *blocks, *pids, *slow;
  assert_ok(fl_range(ctx, 0, PARTS, 1, PARTS, &ds));
  assert_ok(fl_map(ds, cp_big_record, &big, sizeof big, &blocks));
  assert_ok(fl_cache(blocks));
  uint64_t n = 0;
  assert_ok(fl_count(blocks, &n));
  assert_int_equal(n, PARTS);
  /* Which process caches partition 0: that one is the slow executor. */
  assert_ok(fl_map_partitions(blocks, cp_emit_pid, NULL, 0, &pids));
  fl_records *got;
  assert_ok(fl_collect(pids, &got));
  fl_bytes first = fl_records_get(got, 0);
  assert_int_equal(first.len, sizeof(int64_t));
  int64_t arg[2] = {0, 40};
  memcpy(&arg[0], first.data, sizeof arg[0]);
  fl_records_free(got);
  assert_ok(fl_map_partitions(blocks, cp_slow_in_process, arg, sizeof arg, &slow));
  fl_context_stats before, after;
  assert_ok(fl_context_stats_get(ctx, &before));
  assert_ok(fl_count(slow, &n));
  assert_ok(fl_context_stats_get(ctx, &after));
  assert_int_equal(n, PARTS);
  int64_t computations = 0;
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, PARTS);
  uint64_t mapped = after.blocks_read_mapped - before.blocks_read_mapped;
  fprintf(stderr, "node-local: %llu of %d partitions read in place from the slow executor\n",
          (unsigned long long)mapped, PARTS);
  assert_true(mapped > 0);
  assert_int_equal(after.blocks_read_fetched, before.blocks_read_fetched);
  fl_dataset_free(slow);
  fl_dataset_free(pids);
  fl_dataset_free(blocks);
  fl_dataset_free(ds);
  fl_accumulator_destroy(computed);
  fl_context_close(ctx);
  assert_no_children();
}

/* Opens `master` with the NAME=VALUE settings of env (NULL-terminated) in the environment of
 * the processes it starts, and only theirs. */
static fl_context *open_with_env(const char *master, const char *const *env) {
  for (const char *const *e = env; *e; e++) putenv((char *)*e);
  fl_context *ctx = NULL;
  fl_status opened = fl_context_open(master, NULL, &ctx);
  for (const char *const *e = env; *e; e++) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
    unsetenv(name);
  }
  assert_ok(opened);
  return ctx;
}

/* A cluster whose executors cache `parts` partitions of one large record each (shared
 * blocks: above SHARED_BLOCK_MIN), for the node-shared tests. pids[p] is the process that
 * caches partition p (written into the record by the process that computed it: a task that
 * reads it may run on a node peer); the executor of pids[0] is the owner of owned. */
typedef struct node_cluster {
  fl_context *ctx;
  fl_accumulator *computed; /* how many times a partition was computed */
  fl_dataset *ds, *blocks;
  uint32_t parts;
  int64_t pids[64];
  uint64_t owned; /* a bit per partition that pids[0] caches */
} node_cluster;

static void node_cluster_open(node_cluster *c, const char *master, const char *const *env, uint32_t parts) {
  assert_true(parts <= 64);
  c->ctx = open_with_env(master, env);
  c->parts = parts;
  assert_ok(fl_accumulator_create_i64(c->ctx, &c->computed));
  cp_big_arg big = {fl_accumulator_id(c->computed), 300000};
  assert_ok(fl_range(c->ctx, 0, parts, 1, parts, &c->ds));
  assert_ok(fl_map(c->ds, cp_big_record_pid, &big, sizeof big, &c->blocks));
  assert_ok(fl_cache(c->blocks));
  uint64_t n = 0;
  assert_ok(fl_count(c->blocks, &n));
  assert_int_equal(n, parts);
  fl_dataset *where;
  fl_records *got;
  assert_ok(fl_map(c->blocks, cp_head_i64, NULL, 0, &where));
  assert_ok(fl_collect(where, &got));
  assert_int_equal(fl_records_count(got), parts);
  c->owned = 0;
  for (uint32_t p = 0; p < parts; p++) {
    memcpy(&c->pids[p], fl_records_get(got, p).data, sizeof *c->pids);
    if (c->pids[p] == c->pids[0]) c->owned |= (uint64_t)1 << p;
  }
  fl_records_free(got);
  fl_dataset_free(where);
}

/* Frees the stage run over the cluster's blocks, then the cluster; no process is left. */
static void node_cluster_close(node_cluster *c, fl_dataset *stage) {
  fl_dataset_free(stage);
  fl_dataset_free(c->blocks);
  fl_dataset_free(c->ds);
  fl_accumulator_destroy(c->computed);
  fl_context_close(c->ctx);
  assert_no_children();
}

typedef struct cp_node_arg {
  int64_t pid, ms;
  uint64_t mask;
  int64_t peer_ms;
  char dir[200];
  int64_t gated;
} cp_node_arg;

/* Node-shared tasks (executor/storage/claim_table.c): each task over a cached partition is launched
 * on the executor that caches it and offered to the other executor of the node, which runs
 * it if it starts it first. One executor is slow in this stage (owner_ms a task, against
 * peer_ms on the other) and holds about half of 16 partitions, all within its slots, so the
 * driver places every task on its holder:
 * the fast executor finishes its own and then takes most of the slow one's, reading them in
 * place. The result is right, nothing is computed again, and no task runs twice (each run
 * appends a byte to its partition's marker file; the files are read once a duplicate would
 * have ended too). With FLINT_NODE_OFFERS=0 the driver offers nothing and every task runs on
 * its holder (no block is mapped). env: the cluster's settings; label: for the log. */
static void node_shared_stage(const char *const *env, const char *label, int64_t owner_ms, int64_t peer_ms,
                              uint64_t *mapped_out) {
  enum { PARTS = 16 };
  node_cluster c;
  node_cluster_open(&c, CLUSTER, env, PARTS);
  uint32_t held_by_slow = (uint32_t)__builtin_popcountll(c.owned);
  /* The caching job is spread by the slots, half each, give or take a task that late binding
   * (when it is on) copied to the other executor while it waited. */
  assert_true(held_by_slow >= PARTS / 2 - 2 && held_by_slow <= PARTS / 2 + 2);
  cp_node_arg arg = {.pid = c.pids[0], .ms = owner_ms, .peer_ms = peer_ms};
  test_tmpdir(arg.dir, sizeof arg.dir);
  fl_dataset *slow;
  assert_ok(fl_map_partitions(c.blocks, cp_slow_marked, &arg, sizeof arg, &slow));
  fl_context_stats before, after;
  assert_ok(fl_context_stats_get(c.ctx, &before));
  uint64_t n = 0;
  assert_ok(fl_count(slow, &n));
  assert_ok(fl_context_stats_get(c.ctx, &after));
  assert_int_equal(n, PARTS);
  int64_t computations = 0;
  assert_ok(fl_accumulator_value_i64(c.computed, &computations));
  assert_int_equal(computations, PARTS);
  *mapped_out = after.blocks_read_mapped - before.blocks_read_mapped;
  fprintf(stderr, "node offers %s: %llu of the slow executor's %u tasks ran on the other\n", label,
          (unsigned long long)*mapped_out, held_by_slow);
  assert_int_equal(after.blocks_read_fetched, before.blocks_read_fetched);
  usleep(500 * 1000); /* a second run of a task would have appended by now */
  for (uint32_t p = 0; p < PARTS; p++) {
    char path[300];
    snprintf(path, sizeof path, "%s/part-%u", arg.dir, p);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    if (st.st_size != 1) fail_msg("partition %u ran %lld times", p, (long long)st.st_size);
  }
  test_rmtree(arg.dir);
  node_cluster_close(&c, slow);
}

/* With late binding on (FLINT_SPECULATION; quantile 1, so no backups of slow running tasks),
 * the driver sends the peer no copy of a task queued at the slow executor (1 s a task): the
 * peer has it as an offer and takes it itself (100 ms a task, so that it is still running
 * what it claimed while the driver looks for queued tasks), and each partition runs once. */
static void test_node_shared_tasks(void **state) {
  (void)state;
  /* no placement away from the holder */
  static const char *const on[] = {"FLINT_LOCALITY_WAIT_MS=60000", NULL},
                           *const off[] = {"FLINT_LOCALITY_WAIT_MS=60000", "FLINT_NODE_OFFERS=0", NULL},
                           *const late[] = {"FLINT_LOCALITY_WAIT_MS=60000", "FLINT_SPECULATION=1",
                                            "FLINT_SPECULATION_QUANTILE=1", NULL};
  uint64_t mapped = 0;
  node_shared_stage(on, "on", 200, 0, &mapped);
  assert_true(mapped >= 3); /* the slow one starts at most its first one or two meanwhile */
  node_shared_stage(late, "on, with late binding", 1000, 100, &mapped);
  assert_true(mapped >= 3);
  node_shared_stage(off, "off", 200, 0, &mapped);
  assert_int_equal(mapped, 0);
}

/* An executor that claims a node peer's task and dies running it (the first to take one
 * leaves a marker and exits, after claimer_ms): the driver runs the task again, and the
 * action returns the right count instead of waiting for a report that never comes. With 2
 * executors the owner's "claimed" report comes first (the owner sleeps 300 ms a task) and the
 * loss ends the attempt; with 3, the owner sleeps 6 s, so the driver has found the claimer
 * lost before the owner reports the task claimed, while the third executor, which may be the
 * claimer as far as the driver knows, is alive. A claimer that runs 300 ms before it dies has
 * told the driver it runs the task (after 20 ms), so its loss alone ends the attempt. */
static void claimer_lost(const char *master, int64_t owner_ms, int64_t claimer_ms) {
  static const char *const env[] = {"FLINT_LOCALITY_WAIT_MS=60000", "FLINT_EXECUTOR_TIMEOUT_MS=3000", NULL};
  enum { PARTS = 8 };
  node_cluster c;
  node_cluster_open(&c, master, env, PARTS);
  cp_node_arg arg = {.pid = c.pids[0], .ms = owner_ms, .mask = c.owned, .peer_ms = claimer_ms};
  assert_true(arg.mask != (1u << PARTS) - 1); /* the others hold some */
  assert_true((arg.mask & (arg.mask - 1)) != 0); /* the owner holds at least 2: one to take */
  test_tmpdir(arg.dir, sizeof arg.dir);
  fl_dataset *crashing;
  assert_ok(fl_map_partitions(c.blocks, cp_exit_if_peer, &arg, sizeof arg, &crashing));
  uint64_t n = 0;
  assert_ok(fl_count(crashing, &n));
  assert_int_equal(n, PARTS);
  char marker[300];
  snprintf(marker, sizeof marker, "%s/crashed", arg.dir);
  assert_int_equal(access(marker, F_OK), 0); /* an executor did take the owner's task, and died */
  test_rmtree(arg.dir);
  node_cluster_close(&c, crashing);
}

static void test_node_shared_claimer_lost(void **state) {
  (void)state;
  claimer_lost(CLUSTER, 300, 0);
  claimer_lost("local-cluster[3,1,512]", 6000, 0);
  claimer_lost("local-cluster[3,1,512]", 6000, 300);
}

/* A backup of a task that a node peer claimed and is slow on runs on the task's owner, not
 * behind the slow task on the peer. The owner runs its 8 partitions at 300 ms each; the
 * peer runs its own at once, then claims the owner's last and waits in it for a file that
 * the test makes only once the job has returned (at most 60 s). The owner reports the claim
 * when it reaches that task, after its others; with 15 of 16 tasks done (quantile 0.9) the
 * task is slow, and its backup ends on the owner 300 ms later. So the job can only return
 * through the backup; had the claimer's copy given up waiting, it leaves a mark. */
static void test_node_shared_backup_of_claimed(void **state) {
  (void)state;
  static const char *const env[] = {"FLINT_LOCALITY_WAIT_MS=60000", "FLINT_SPECULATION=1",
                                    "FLINT_SPECULATION_QUANTILE=0.9", NULL};
  enum { PARTS = 16 };
  node_cluster c;
  node_cluster_open(&c, CLUSTER, env, PARTS);
  cp_node_arg arg = {.pid = c.pids[0], .ms = 300, .mask = c.owned, .peer_ms = 60000, .gated = 1};
  test_tmpdir(arg.dir, sizeof arg.dir);
  char release[300], unreleased[320];
  snprintf(release, sizeof release, "%s/release", arg.dir);
  snprintf(unreleased, sizeof unreleased, "%s.unreleased", release);
  fl_dataset *slow;
  assert_ok(fl_map_partitions(c.blocks, cp_slow_claimed, &arg, sizeof arg, &slow));
  double t0 = now_s();
  uint64_t n = 0;
  assert_ok(fl_count(slow, &n));
  fprintf(stderr, "a backup of a claimed task: the job took %.2f s\n", now_s() - t0);
  assert_int_equal(n, PARTS);
  assert_int_equal(access(unreleased, F_OK), -1); /* the claimer's copy is still waiting */
  test_write_file(release, "", 0); /* it may end now */
  node_cluster_close(&c, slow);
  test_rmtree(arg.dir);
}

typedef struct count_job {
  fl_dataset *ds;
  fl_status status;
} count_job;

static void *count_main(void *p) {
  count_job *j = p;
  uint64_t n = 0;
  j->status = fl_count(j->ds, &n);
  return NULL;
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Cancelling a job stops a task that a node peer claimed, not only the owner's: the owner is
 * stuck in its first task (2 ms a record), the other executor has taken the owner's second
 * and works through it (100 us a record, a byte each into a file); once the job is cancelled
 * the file stops growing within a batch of records, long before the task would end. */
static void test_node_shared_kill(void **state) {
  (void)state;
  static const char *const env[] = {"FLINT_LOCALITY_WAIT_MS=60000", NULL};
  fl_context *ctx = open_with_env(CLUSTER, env);
  enum { PARTS = 4, PER = 40000 }; /* 680 KB a partition cached: shared blocks */
  fl_dataset *ds, *cached, *where, *crawl;
  assert_ok(fl_range(ctx, 0, PARTS * PER, 1, PARTS, &ds));
  assert_ok(fl_map(ds, cp_tag_pid, NULL, 0, &cached));
  assert_ok(fl_cache(cached));
  uint64_t n = 0;
  assert_ok(fl_count(cached, &n));
  assert_int_equal(n, PARTS * PER);
  fl_records *got;
  assert_ok(fl_map_partitions(cached, cp_first_tag, NULL, 0, &where));
  assert_ok(fl_collect(where, &got));
  assert_int_equal(fl_records_count(got), PARTS);
  int64_t pids[PARTS];
  for (uint32_t p = 0; p < PARTS; p++) memcpy(&pids[p], fl_records_get(got, p).data, sizeof *pids);
  fl_records_free(got);
  cp_node_arg arg = {.pid = pids[0], .ms = PER};
  for (uint32_t p = 0; p < PARTS; p++)
    if (pids[p] == pids[0]) arg.mask |= (uint64_t)1 << p;
  assert_int_equal(__builtin_popcountll(arg.mask), PARTS / 2);
  test_tmpdir(arg.dir, sizeof arg.dir);
  char stolen[300];
  snprintf(stolen, sizeof stolen, "%s/stolen", arg.dir);
  assert_ok(fl_map(cached, cp_crawl_if_peer, &arg, sizeof arg, &crawl));
  count_job job = {crawl, FL_OK};
  pthread_t runner;
  assert_int_equal(pthread_create(&runner, NULL, count_main, &job), 0);
  double deadline = now_s() + 30;
  while (file_size(stolen) < 1000 && now_s() < deadline) usleep(10000);
  assert_true(file_size(stolen) >= 1000); /* the peer took the owner's second task */
  assert_ok(fl_cancel_jobs(ctx));
  pthread_join(runner, NULL);
  assert_int_equal(job.status, FL_ECANCELLED);
  usleep(300 * 1000); /* the kill's way to the peer, and the batch it is in */
  off_t stopped = file_size(stolen);
  usleep(1000 * 1000);
  off_t later = file_size(stolen);
  fprintf(stderr, "node-shared kill: the claimer ran %lld records, %lld more in the second after\n",
          (long long)stopped, (long long)(later - stopped));
  assert_true(later == stopped);
  assert_true(stopped < PER);
  test_rmtree(arg.dir);
  fl_dataset_free(crawl);
  fl_dataset_free(where);
  fl_dataset_free(cached);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  assert_no_children();
}

/* In cluster mode executors write and read the checkpoint files: after the checkpoint the
 * counted map upstream never runs again (the dataset is not cached), children read the
 * files, and a missing part file fails the action naming it instead of being recomputed. */
static void test_checkpoint(void **state) {
  (void)state;
  char dir[256], pattern[512];
  test_tmpdir(dir, sizeof dir);
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  fl_accumulator *computed;
  assert_ok(fl_accumulator_create_i64(ctx, &computed));
  uint64_t id = fl_accumulator_id(computed);
  fl_dataset *ds, *copied, *tripled;
  assert_ok(fl_range(ctx, 0, 16000, 1, 16, &ds));
  assert_ok(fl_map(ds, cp_counted_copy, &id, sizeof id, &copied));
  assert_ok(fl_checkpoint(copied, dir));
  int64_t computations = 0;
  uint64_t n = 0;
  for (int round = 0; round < 3; round++) {
    assert_ok(fl_count(copied, &n));
    assert_int_equal(n, 16000);
  }
  int64_t three = 3;
  fl_buf sum = FL_BUF_INIT;
  assert_ok(fl_map(copied, cp_times, &three, sizeof three, &tripled));
  assert_ok(fl_reduce(tripled, cp_sum, NULL, 0, &sum));
  assert_int_equal(fl_i64(fl_buf_bytes(&sum)), 3 * (16000LL * 15999 / 2));
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, 16000);

  snprintf(pattern, sizeof pattern, "%s/ctx-*/rdd-*/part-00003", dir);
  glob_t g;
  assert_int_equal(glob(pattern, 0, NULL, &g), 0);
  assert_int_equal(g.gl_pathc, 1);
  assert_int_equal(unlink(g.gl_pathv[0]), 0);
  assert_int_equal(fl_count(tripled, &n), FL_EJOB);
  if (!strstr(fl_last_error(), g.gl_pathv[0])) fprintf(stderr, "message: %s\n", fl_last_error());
  assert_non_null(strstr(fl_last_error(), g.gl_pathv[0]));
  globfree(&g);
  assert_ok(fl_accumulator_value_i64(computed, &computations));
  assert_int_equal(computations, 16000);

  fl_buf_free(&sum);
  fl_dataset_free(tripled);
  fl_dataset_free(copied);
  fl_dataset_free(ds);
  fl_accumulator_destroy(computed);
  fl_context_close(ctx);
  assert_no_children();
  test_rmtree(dir);
}

/* Results over the inline limit (1 MiB) stay on their executor as blocks that the driver
 * fetches; the client gets every record. */
static void test_large_results(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 1000000, 1, 2, &ds)); /* about 4.5 MB per partition */
  fl_records *recs;
  assert_ok(fl_collect(ds, &recs));
  assert_int_equal(fl_records_count(recs), 1000000);
  int64_t sum = 0;
  for (size_t i = 0; i < fl_records_count(recs); i++) sum += fl_i64(fl_records_get(recs, i));
  assert_int_equal(sum, 999999LL * 1000000 / 2);
  fl_records_free(recs);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  assert_no_children();
}

/* Results beyond what a RunJob reply carries inline (16 MiB) wait on the driver and come in
 * chunks of at most 32 MiB: two partitions of about 36 MB each. */
static void test_results_beyond_one_reply(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  const int64_t n = 8000000;
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, n, 1, 2, &ds));
  fl_records *recs;
  assert_ok(fl_collect(ds, &recs));
  assert_int_equal(fl_records_count(recs), n);
  int64_t sum = 0;
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    int64_t v = fl_i64(fl_records_get(recs, i));
    if (v != (int64_t)i) fail_msg("record %zu is %lld", i, (long long)v);
    sum += v;
  }
  assert_int_equal(sum, (n - 1) * n / 2);
  fl_records_free(recs);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  assert_no_children();
}

typedef struct canceller {
  fl_context *ctx;
  int delay_ms;
  fl_status status;
} canceller;

static void *cancel_later(void *p) {
  canceller *c = p;
  usleep((useconds_t)c->delay_ms * 1000);
  c->status = fl_cancel_jobs(c->ctx);
  return NULL;
}

/* fl_cancel_jobs from another thread ends a running job with FL_ECANCELLED long before it
 * would finish (100 tasks of 100 records of 20 ms: 100 s on the 2 slots; the tasks running
 * may finish first, 2 s), so within 60 s, a bound that only a hang reaches; and the context
 * runs the next job normally. */
#define CANCEL_BOUND_S 60.0
static void cancel_on(const char *master) {
  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_dataset *ds, *slow;
  int64_t nap_ms = 20;
  assert_ok(fl_range(ctx, 0, 10000, 1, 100, &ds));
  assert_ok(fl_map(ds, cp_nap, &nap_ms, sizeof nap_ms, &slow));
  canceller c = {ctx, 500, FL_EINTERNAL};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, cancel_later, &c), 0);
  double t0 = now_s();
  uint64_t count = 0;
  fl_status st = fl_count(slow, &count);
  double took = now_s() - t0;
  pthread_join(th, NULL);
  fprintf(stderr, "%s: the cancelled job returned after %.2f s: %s\n", master, took, fl_last_error());
  assert_ok(c.status);
  assert_int_equal(st, FL_ECANCELLED);
  assert_non_null(strstr(fl_last_error(), "cancelled"));
  assert_true(took < CANCEL_BOUND_S);
  /* Cancelling with nothing running does nothing; the next job runs. */
  assert_ok(fl_cancel_jobs(ctx));
  fl_dataset *small;
  assert_ok(fl_range(ctx, 0, 10, 1, 2, &small));
  assert_ok(fl_count(small, &count));
  assert_int_equal(count, 10);
  fl_dataset_free(small);
  fl_dataset_free(slow);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  assert_no_children();
}

/* Late binding: the 16 tasks go out 8 per executor at once. The first to run waits until
 * 15 other tasks have run (each leaves a byte in a file) and holds up the 7 queued behind
 * it, so that only the other executor, idle after its own 8, running copies of those 7 can
 * release it. Quantile 1 keeps ordinary backups out. Without the copies the slow task gives
 * up after 60 s and leaves a mark that fails the test. Counts are exact. */
static void test_idle_executor_backs_up_queued_tasks(void **state) {
  (void)state;
  char dir[] = "/tmp/flint-steal-XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("FLINT_SPECULATION", "1", 1);
  setenv("FLINT_SPECULATION_QUANTILE", "1", 1);
  fl_context *ctx;
  fl_status opened = fl_context_open(CLUSTER, NULL, &ctx);
  unsetenv("FLINT_SPECULATION");
  unsetenv("FLINT_SPECULATION_QUANTILE");
  assert_ok(opened);
  fl_accumulator *seen;
  assert_ok(fl_accumulator_create_i64(ctx, &seen));
  cp_slow_once_arg arg = {.accumulator = fl_accumulator_id(seen), .sleep_ms = 60000, .gate_bytes = 15};
  snprintf(arg.marker, sizeof arg.marker, "%s/slow", dir);
  snprintf(arg.gate, sizeof arg.gate, "%s/done", dir);
  snprintf(arg.tally, sizeof arg.tally, "%s/done", dir);
  char unreleased[300];
  snprintf(unreleased, sizeof unreleased, "%s.unreleased", arg.gate);
  int64_t nap_ms = 300;
  fl_dataset *ds, *slow, *napped;
  assert_ok(fl_range(ctx, 0, 16, 1, 16, &ds));
  assert_ok(fl_map(ds, cp_slow_once, &arg, sizeof arg, &slow));
  assert_ok(fl_map(slow, cp_nap, &nap_ms, sizeof nap_ms, &napped));
  double t0 = now_s();
  uint64_t n = 0;
  assert_ok(fl_count(napped, &n));
  fprintf(stderr, "late binding: the job took %.2f s\n", now_s() - t0);
  assert_int_equal(n, 16);
  int64_t counted = 0;
  assert_ok(fl_accumulator_value_i64(seen, &counted));
  assert_int_equal(counted, 16);
  assert_int_equal(access(unreleased, F_OK), -1); /* released by the copies, not by its cap */
  fl_dataset_free(napped);
  fl_dataset_free(slow);
  fl_dataset_free(ds);
  fl_accumulator_destroy(seen);
  fl_context_close(ctx);
  assert_no_children();
  unlink(arg.marker);
  unlink(arg.gate);
  rmdir(dir);
}

/* fl_context_stats counts a job's attempts and the time they ran, in local mode and through
 * the driver alike: 6 tasks of at least 50 ms each run at least 0.3 s between them, and the
 * engine's time around them is not counted. */
static void test_task_time_stats(void **state) {
  (void)state;
  const char *masters[] = {"local[2]", CLUSTER};
  for (int m = 0; m < 2; m++) {
    fl_context *ctx;
    assert_ok(fl_context_open(masters[m], NULL, &ctx));
    fl_dataset *ds, *slow;
    int64_t ms = 50;
    assert_ok(fl_range(ctx, 0, 60, 1, 6, &ds));
    assert_ok(fl_map_partitions(ds, cp_slow_partition, &ms, sizeof ms, &slow));
    fl_context_stats before, after;
    assert_ok(fl_context_stats_get(ctx, &before));
    double t0 = now_s();
    uint64_t n = 0;
    assert_ok(fl_count(slow, &n));
    double took = now_s() - t0;
    assert_ok(fl_context_stats_get(ctx, &after));
    double ran = after.task_seconds - before.task_seconds;
    fprintf(stderr, "%s: 6 tasks of 50 ms ran %.3f s in a job of %.3f s\n", masters[m], ran, took);
    assert_int_equal(n, 60);
    assert_int_equal(after.jobs_run - before.jobs_run, 1);
    assert_int_equal(after.tasks_run - before.tasks_run, 6);
    assert_int_equal(after.tasks_failed, before.tasks_failed);
    assert_true(ran >= 0.3);
    assert_true(ran <= 2 * took); /* two task threads at most */
    fl_dataset_free(slow);
    fl_dataset_free(ds);
    fl_context_close(ctx);
  }
  assert_no_children();
}

/* FLINT_TRACE: the driver and executors a context starts inherit it and append the job
 * path's events to the file, one whole line each, in time order per thread. A file that
 * cannot be opened leaves the trace off and the job runs. */
static void count_one_job(uint64_t *n) {
  fl_context *ctx;
  fl_dataset *ds;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  assert_ok(fl_range(ctx, 0, 400, 1, 4, &ds));
  assert_ok(fl_count(ds, n));
  fl_dataset_free(ds);
  fl_context_close(ctx);
}

static void test_trace_follows_a_job(void **state) {
  (void)state;
  uint64_t n = 0;
  assert_int_equal(setenv("FLINT_TRACE", "/nonexistent-flint-dir/trace", 1), 0);
  count_one_job(&n);
  assert_int_equal(n, 400);

  char path[] = "/tmp/flint-trace-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(setenv("FLINT_TRACE", path, 1), 0);
  count_one_job(&n);
  unsetenv("FLINT_TRACE");
  assert_int_equal(n, 400);
  assert_no_children();

  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[512];
  int starts = 0, ends = 0, jobs = 0, launches = 0, statuses = 0, lines = 0;
  long driver = 0, executor = 0;
  unsigned long long last_task_start[4] = {0};
  while (fgets(line, sizeof line, f)) {
    unsigned long long us;
    long pid;
    char role[64], thread[32], event[64], detail[128];
    int fields = sscanf(line, "%llu %ld %63s %31s %63s %127s", &us, &pid, role, thread, event, detail);
    if (fields != 6) fprintf(stderr, "malformed trace line: %s", line);
    assert_int_equal(fields, 6);
    lines++;
    if (strcmp(role, "driver") == 0) driver = pid;
    if (strncmp(role, "executor", 8) == 0) executor = pid;
    unsigned part = 0;
    if (strcmp(event, "task.start") == 0 && sscanf(detail, "%u", &part) == 1 && part < 4) {
      last_task_start[part] = us;
      starts++;
    }
    if (strcmp(event, "task.end") == 0 && sscanf(detail, "%u", &part) == 1 && part < 4) {
      assert_true(last_task_start[part] != 0 && last_task_start[part] <= us);
      ends++;
    }
    jobs += strcmp(event, "job.end") == 0 && strcmp(role, "driver") == 0;
    launches += strcmp(event, "launch.queued") == 0;
    statuses += strcmp(event, "rpc.recv") == 0 && strcmp(detail, "/flint.Driver/StatusUpdate") == 0;
  }
  fclose(f);
  unlink(path);
  fprintf(stderr, "trace: %d lines, %d task starts, %d ends, %d jobs, %d launches, %d status updates\n", lines,
          starts, ends, jobs, launches, statuses);
  assert_true(driver != 0 && executor != 0 && driver != executor);
  assert_true(starts >= 4 && ends == starts); /* a backup copy would add a pair */
  assert_true(jobs >= 1 && launches >= 1 && statuses >= 1);
}

/* Speculation: one task waits for a file that the test makes only once the job has
 * returned (at most 60 s, then it leaves a mark); once half the tasks are done, slow ones
 * get a backup on the other executor, the first success counts, and so the job can only
 * end through the backup. The accumulator counts every record exactly once. */
static void test_speculation(void **state) {
  (void)state;
  char dir[] = "/tmp/flint-spec-XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("FLINT_SPECULATION", "1", 1);
  setenv("FLINT_SPECULATION_QUANTILE", "0.5", 1);
  fl_context *ctx;
  fl_status opened = fl_context_open(CLUSTER, NULL, &ctx);
  unsetenv("FLINT_SPECULATION");
  unsetenv("FLINT_SPECULATION_QUANTILE");
  assert_ok(opened);
  fl_accumulator *seen;
  assert_ok(fl_accumulator_create_i64(ctx, &seen));
  cp_slow_once_arg arg = {.accumulator = fl_accumulator_id(seen), .sleep_ms = 60000};
  snprintf(arg.marker, sizeof arg.marker, "%s/slow", dir);
  snprintf(arg.gate, sizeof arg.gate, "%s/release", dir);
  char unreleased[300];
  snprintf(unreleased, sizeof unreleased, "%s.unreleased", arg.gate);
  fl_dataset *ds, *mapped;
  assert_ok(fl_range(ctx, 0, 16000, 1, 16, &ds));
  assert_ok(fl_map(ds, cp_slow_once, &arg, sizeof arg, &mapped));
  double t0 = now_s();
  uint64_t n = 0;
  assert_ok(fl_count(mapped, &n));
  fprintf(stderr, "speculation: the job with one blocked task took %.2f s\n", now_s() - t0);
  assert_int_equal(n, 16000);
  int64_t counted = 0;
  assert_ok(fl_accumulator_value_i64(seen, &counted));
  assert_int_equal(counted, 16000);
  assert_int_equal(access(unreleased, F_OK), -1); /* the slow copy is still waiting */
  test_write_file(arg.gate, "", 0); /* it may end now */
  fl_dataset_free(mapped);
  fl_dataset_free(ds);
  fl_accumulator_destroy(seen);
  fl_context_close(ctx);
  assert_no_children();
  char marker[256];
  snprintf(marker, sizeof marker, "%s/slow", dir);
  unlink(marker);
  unlink(arg.gate);
  rmdir(dir);
}

static void test_cancel_jobs(void **state) {
  (void)state;
  cancel_on("local[2]");
  cancel_on(CLUSTER);
  assert_int_equal(fl_cancel_jobs(NULL), FL_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cluster_matches_local, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_main_program_function_is_refused, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_bad_masters_fail_fast, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_unreachable_broadcast_owner, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_broadcasts_small_and_large, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_clusters_one_after_another, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_cached_partitions_read_remotely, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_many_persisted_datasets, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_node_local_reads, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_node_shared_tasks, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_node_shared_claimer_lost, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_node_shared_kill, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_node_shared_backup_of_claimed, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_checkpoint, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_large_results, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_results_beyond_one_reply, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_cancel_jobs, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_task_time_stats, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_trace_follows_a_job, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_speculation, arm_watchdog, disarm_watchdog),
      cmocka_unit_test_setup_teardown(test_idle_executor_backs_up_queued_tasks, arm_watchdog, disarm_watchdog),
  };
  /* TEST_FILTER=test_name (a glob) runs only the matching tests. */
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
