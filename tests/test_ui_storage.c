/* test_ui_storage.c: the web UI's storage figures (docs/ui.md: BlockUpdated, /storage/rdd)
 * against the block managers' own (fl_storage_info_get), in a local context and on a local
 * cluster, whose executors report their blocks' changes with their status updates and
 * heartbeats: cached datasets, their partitions' memory, blocks that went to disk or were
 * evicted for room, and nothing left once unpersisted. The API is read over HTTP (libcurl);
 * the UI applies events on its own thread, so each check polls up to a generous bound. The
 * user functions live in the cluster_pipelines library, as cluster mode requires. */
#include "test_util.h"
#include "ui_client.h"

#include <glob.h>
#include <jansson.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

/* From tests/jobs/cluster_pipelines.c. */
fl_status cp_times(fl_bytes rec, fl_buf *out, const void *arg);

#define TEST_BOUND_S 170 /* each test's bound: a hang fails the program instead of ctest's timeout */
#define POLL_S 60.0      /* how long a check waits for the UI to show what the block managers hold */

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_ui_storage: a test ran past its time bound (a hang?)\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1)) {
  }
  _exit(3);
}

static char log_dir[512];

static int setup(void **state) {
  (void)state;
  signal(SIGALRM, on_alarm);
  alarm(TEST_BOUND_S);
  test_tmpdir(log_dir, sizeof log_dir);
  setenv("FLINT_UI", "1", 1);
  setenv("FLINT_UI_PORT", "0", 1);
  setenv("FLINT_EVENT_LOG_DIR", log_dir, 1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unsetenv("FLINT_UI");
  unsetenv("FLINT_UI_PORT");
  unsetenv("FLINT_EVENT_LOG_DIR");
  test_rmtree(log_dir);
  alarm(0);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- the REST API ------------------------------------------------------------------------- */

/* GET ctx's UI + path (tests/ui_client.h); the reply's body is NUL-terminated. */
static reply get_page(fl_context *ctx, const char *path) {
  const char *base = fl_context_ui_url(ctx);
  assert_non_null(base);
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  return http(NULL, url, NULL);
}

/* GET the current application's API path as JSON; NULL when the request or the parse fails. */
static json_t *api_get(fl_context *ctx, const char *path) {
  char full[256];
  snprintf(full, sizeof full, "/api/v1/applications/current/%s", path);
  reply r = get_page(ctx, full);
  json_t *v = r.code == 200 ? json_loads((const char *)r.body.data, 0, NULL) : NULL;
  fl_buf_free(&r.body);
  return v;
}

/* The storage page (HTML) holds `needle`. */
static bool page_holds(fl_context *ctx, const char *needle) {
  reply r = get_page(ctx, "/storage/?app=current");
  bool found = r.code == 200 && strstr((const char *)r.body.data, needle);
  fl_buf_free(&r.body);
  return found;
}

static json_int_t int_of(const json_t *o, const char *key) { return json_integer_value(json_object_get(o, key)); }

/* The storage list's entry with numPartitions `partitions` (the tests' datasets differ in it). */
static json_t *rdd_with(json_t *list, uint32_t partitions) {
  size_t i;
  json_t *r;
  json_array_foreach(list, i, r) if (int_of(r, "numPartitions") == partitions) return r;
  return NULL;
}

typedef struct cached {
  fl_dataset *ds;
  uint32_t partitions;
  const char *level; /* storageLevel as the API says it */
} cached;

/* Whether /storage/rdd shows exactly what the block managers hold for datasets[0, n): each
 * one with blocks, with their number, memory and disk, and its partitions adding up; none
 * without. `why` says what differs. */
static bool storage_matches(fl_context *ctx, const cached *datasets, size_t n, char *why, size_t cap) {
  json_t *list = api_get(ctx, "storage/rdd");
  if (!json_is_array(list)) {
    snprintf(why, cap, "no storage list");
    json_decref(list);
    return false;
  }
  bool ok = true;
  size_t listed = 0;
  for (size_t i = 0; i < n && ok; i++) {
    fl_storage_info info;
    assert_int_equal(fl_storage_info_get(datasets[i].ds, &info), FL_OK);
    json_t *r = rdd_with(list, datasets[i].partitions);
    if (!info.cached_partitions) {
      if (r) snprintf(why, cap, "dataset of %u partitions listed, none cached", datasets[i].partitions);
      ok = !r;
      continue;
    }
    listed++;
    if (!r) {
      snprintf(why, cap, "dataset of %u partitions not listed (%llu cached)", datasets[i].partitions,
               (unsigned long long)info.cached_partitions);
      ok = false;
      break;
    }
    json_int_t sum_mem = 0, sum_disk = 0;
    size_t k;
    json_t *p;
    json_array_foreach(json_object_get(r, "partitions"), k, p) {
      sum_mem += int_of(p, "memoryUsed");
      sum_disk += int_of(p, "diskUsed");
    }
    const char *name = json_string_value(json_object_get(r, "name"));
    const char *level = json_string_value(json_object_get(r, "storageLevel"));
    if ((uint64_t)int_of(r, "numCachedPartitions") != info.cached_partitions ||
        (uint64_t)int_of(r, "memoryUsed") != info.memory_bytes || (uint64_t)int_of(r, "diskUsed") != info.disk_bytes ||
        sum_mem != int_of(r, "memoryUsed") || sum_disk != int_of(r, "diskUsed") || !name || !*name || !level ||
        strcmp(level, datasets[i].level) != 0) {
      snprintf(why, cap,
               "dataset of %u partitions: the UI says %lld cached, %lld B in memory (partitions: %lld), %lld B on "
               "disk (%lld), name '%s', level %s; its block managers %llu, %llu B, %llu B, level %s",
               datasets[i].partitions, (long long)int_of(r, "numCachedPartitions"), (long long)int_of(r, "memoryUsed"),
               (long long)sum_mem, (long long)int_of(r, "diskUsed"), (long long)sum_disk, name ? name : "",
               level ? level : "-", (unsigned long long)info.cached_partitions,
               (unsigned long long)info.memory_bytes, (unsigned long long)info.disk_bytes, datasets[i].level);
      ok = false;
    }
  }
  if (ok && json_array_size(list) != listed) {
    snprintf(why, cap, "%zu datasets listed, %zu cached", json_array_size(list), listed);
    ok = false;
  }
  json_decref(list);
  return ok;
}

/* Polls until the UI shows what the block managers hold; fails the test past POLL_S. */
static void wait_storage(fl_context *ctx, const cached *datasets, size_t n) {
  char why[512] = "";
  double deadline = now_s() + POLL_S;
  while (!storage_matches(ctx, datasets, n, why, sizeof why)) {
    if (now_s() > deadline) fail_msg("the storage page never matched the block managers: %s", why);
    usleep(100000);
  }
}

/* The API's figures of the dataset with `partitions` partitions into *cached_parts, *memory,
 * *disk (all 0 when it is not listed). */
static void api_figures(fl_context *ctx, uint32_t partitions, json_int_t *cached_parts, json_int_t *memory,
                        json_int_t *disk) {
  json_t *list = api_get(ctx, "storage/rdd");
  assert_non_null(list);
  json_t *r = rdd_with(list, partitions);
  *cached_parts = r ? int_of(r, "numCachedPartitions") : 0;
  *memory = r ? int_of(r, "memoryUsed") : 0;
  *disk = r ? int_of(r, "diskUsed") : 0;
  json_decref(list);
}

/* Every executor of the application holds no block any more (the executors page). */
static void wait_executors_empty(fl_context *ctx) {
  double deadline = now_s() + POLL_S;
  for (;;) {
    json_t *xs = api_get(ctx, "executors");
    bool empty = json_is_array(xs) && json_array_size(xs) > 0;
    size_t i;
    json_t *x;
    json_array_foreach(xs, i, x) empty &= int_of(x, "rddBlocks") == 0 && int_of(x, "memoryUsed") == 0 &&
                                          int_of(x, "diskUsed") == 0;
    json_decref(xs);
    if (empty) return;
    if (now_s() > deadline) fail_msg("executors still hold blocks after every dataset was unpersisted");
    usleep(100000);
  }
}

/* ---- the event log ------------------------------------------------------------------------ */

/* What the event log's BlockUpdated lines say so far. */
typedef struct logged {
  bool stored;  /* a block with bytes in memory */
  bool spilled; /* a block with none in memory and some on disk: evicted to disk */
  bool gone;    /* a block with none at all: evicted or removed */
} logged;

static logged read_log(void) {
  logged l = {false, false, false};
  char pattern[600];
  snprintf(pattern, sizeof pattern, "%s/*.jsonl", log_dir);
  glob_t g;
  if (glob(pattern, 0, NULL, &g) != 0) return l;
  for (size_t f = 0; f < g.gl_pathc; f++) {
    FILE *in = fopen(g.gl_pathv[f], "r");
    if (!in) continue;
    char line[4096];
    while (fgets(line, sizeof line, in)) {
      json_t *ev = json_loads(line, 0, NULL);
      const char *kind = json_string_value(json_object_get(ev, "Event"));
      if (kind && strcmp(kind, "BlockUpdated") == 0) {
        json_int_t memory = int_of(ev, "Memory"), disk = int_of(ev, "Disk");
        l.stored |= memory > 0;
        l.spilled |= memory == 0 && disk > 0;
        l.gone |= memory == 0 && disk == 0;
      }
      json_decref(ev);
    }
    fclose(in);
  }
  globfree(&g);
  return l;
}

/* Polls until the event log has a block that went (on a cluster, the executors' reports of an
 * unpersist come with their next heartbeat, after the driver's RDDUnpersisted). */
static void wait_log_gone(void) {
  double deadline = now_s() + POLL_S;
  while (!read_log().gone) {
    if (now_s() > deadline) fail_msg("the event log never said that a block went");
    usleep(100000);
  }
}

/* ---- the scenarios ------------------------------------------------------------------------ */

/* A dataset of `records` int64s in `parts` partitions (a map over a range, so that cluster
 * mode runs a function of the cluster_pipelines library), persisted at `level`. */
static fl_dataset *persisted(fl_context *ctx, int64_t records, uint32_t parts, fl_storage_level level,
                             fl_dataset **range) {
  static const int64_t two = 2;
  fl_dataset *ds;
  assert_int_equal(fl_range(ctx, 0, records, 1, parts, range), FL_OK);
  assert_int_equal(fl_map(*range, cp_times, &two, sizeof two, &ds), FL_OK);
  assert_int_equal(fl_persist(ds, level), FL_OK);
  return ds;
}

static void count(fl_dataset *ds, uint64_t want) {
  uint64_t n = 0;
  assert_int_equal(fl_count(ds, &n), FL_OK);
  assert_int_equal(n, want);
}

/* A dataset that fits: every partition cached in memory, the partitions' bytes adding up to
 * the dataset's; unpersisted, it leaves the list and its executors' figures. */
static void cached_then_unpersisted(const char *master, const fl_options *opts) {
  fl_context *ctx;
  assert_int_equal(fl_context_open(master, opts, &ctx), FL_OK);
  assert_non_null(fl_context_ui_url(ctx));
  fl_dataset *range, *ds = persisted(ctx, 40000, 8, FL_MEMORY_ONLY, &range);
  count(ds, 40000);
  cached c = {ds, 8, "MEMORY_ONLY"};
  wait_storage(ctx, &c, 1);
  json_int_t parts, memory, disk;
  api_figures(ctx, 8, &parts, &memory, &disk);
  assert_int_equal(parts, 8);
  assert_true(memory >= 40000 * 9); /* 8 bytes and a length byte a record, at least */
  assert_int_equal(disk, 0);
  assert_true(page_holds(ctx, "<td class=\"n\">8 of 8</td>")); /* the page reads the same */
  count(ds, 40000); /* read from the cache: nothing changes */
  wait_storage(ctx, &c, 1);
  assert_int_equal(fl_unpersist(ds), FL_OK);
  wait_storage(ctx, &c, 1);
  api_figures(ctx, 8, &parts, &memory, &disk);
  assert_int_equal(parts, 0);
  wait_executors_empty(ctx);
  assert_true(page_holds(ctx, "No cached datasets."));
  wait_log_gone();
  assert_true(read_log().stored);
  fl_dataset_free(ds);
  fl_dataset_free(range);
  fl_context_close(ctx);
}

/* Under a memory limit: a memory-and-disk dataset whose partitions a memory-only one evicts to
 * disk (or that went there for want of room), and a memory-only one of which some partitions
 * are not cached at all. `scale` records make a partition of the first; the limit holds
 * about 11 of them. */
static void evictions(const char *master, const fl_options *opts, int64_t scale) {
  fl_context *ctx;
  assert_int_equal(fl_context_open(master, opts, &ctx), FL_OK);
  fl_dataset *range_a, *a = persisted(ctx, 8 * scale, 8, FL_MEMORY_AND_DISK, &range_a);
  count(a, (uint64_t)(8 * scale));
  cached both[2] = {{a, 8, "MEMORY_AND_DISK"}, {NULL, 6, "MEMORY_ONLY"}};
  wait_storage(ctx, both, 1);
  /* partitions twice as large: the limit holds 5 of them, and taking their room evicts a's */
  fl_dataset *range_b, *b = persisted(ctx, 6 * 2 * scale, 6, FL_MEMORY_ONLY, &range_b);
  both[1].ds = b;
  count(b, (uint64_t)(12 * scale));
  wait_storage(ctx, both, 2);
  json_int_t parts, memory, disk;
  api_figures(ctx, 6, &parts, &memory, &disk);
  assert_true(parts >= 1 && parts < 6); /* some did not fit */
  assert_int_equal(disk, 0);
  api_figures(ctx, 8, &parts, &memory, &disk);
  assert_int_equal(parts, 8); /* memory and disk: every partition kept */
  assert_true(disk > 0);      /* evicted (or never let in) to disk */
  count(a, (uint64_t)(8 * scale)); /* read back from disk and memory */
  assert_int_equal(fl_unpersist(a), FL_OK);
  assert_int_equal(fl_unpersist(b), FL_OK);
  wait_storage(ctx, both, 2);
  wait_executors_empty(ctx);
  wait_log_gone();
  logged l = read_log();
  assert_true(l.stored);
  assert_true(l.spilled);
  fl_dataset_free(b);
  fl_dataset_free(range_b);
  fl_dataset_free(a);
  fl_dataset_free(range_a);
  fl_context_close(ctx);
}

static void test_local_cached(void **state) {
  (void)state;
  cached_then_unpersisted("local[2]", NULL);
}

static void test_local_evictions(void **state) {
  (void)state;
  fl_options opts = FL_OPTIONS_INIT;
  opts.memory_limit = 1 << 20; /* 10000 records of 9 bytes a partition: 11 fit */
  evictions("local[2]", &opts, 10000);
}

static void test_cluster_cached(void **state) {
  (void)state;
  cached_then_unpersisted("local-cluster[2,1,512]", NULL);
}

static void test_cluster_evictions(void **state) {
  (void)state;
  /* 16 MiB an executor, two of them: a's 8 partitions of 5.4 MB cannot all stay in memory */
  evictions("local-cluster[2,1,16]", NULL, 600000);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_local_cached, setup, teardown),
      cmocka_unit_test_setup_teardown(test_local_evictions, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cluster_cached, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cluster_evictions, setup, teardown),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return failed;
}
