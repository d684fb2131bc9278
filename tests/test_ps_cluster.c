/*
 * test_ps_cluster: parameter-server tables in a real cluster (a driver and three executor
 * processes, proc_harness): the driver places a replicated table on the executors' servers,
 * a worker (this process) pushes, and the executor holding a primary is killed with
 * SIGKILL mid-run (with a chain of three replicas, then the new primary's too). Every
 * acknowledged push must survive (checked bit for bit against one local shard doing the
 * same arithmetic), training must go on without a call failing, and the driver must promote
 * the backup and back the shard up again on another executor; its web UI (/ps) then shows the
 * shard's new replicas and the clocks of the new primary, and its event log has the table's
 * PsTable again with them.
 */
#include "proc_harness.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "flint/cluster.h"
#include "flint/ps.h"
#include "ps/ps.h"

static int setup(void **state) { return harness_setup(state); }
static int teardown(void **state) { return harness_teardown(state); }

/* The executor whose parameter server listens on `address` (its log says where). */
static proc *executor_serving(proc **execs, int n, const char *address) {
  char needle[160];
  snprintf(needle, sizeof needle, "parameter server on %s", address);
  for (int i = 0; i < n; i++) {
    char *log = slurp(execs[i]->log);
    bool found = log && strstr(log, needle);
    free(log);
    if (found) return execs[i];
  }
  return NULL;
}

static void push_round(fl_ps_worker *w, ps_shard *ref, int round) {
  enum { KEYS = 300 };
  static float g[KEYS];
  static uint64_t all[KEYS];
  for (int k = 0; k < KEYS; k++) {
    all[k] = (uint64_t)k;
    g[k] = (float)((round * 7 + k * 3) % 13) * 0.1f - 0.6f;
  }
  uint64_t t;
  assert_int_equal(fl_ps_push_range(w, 0, KEYS, g, &t), FL_OK);
  fl_status st = fl_ps_wait(w, t, NULL);
  if (st != FL_OK) fail_msg("round %d: %s", round, fl_last_error());
  assert_int_equal(ps_shard_push(ref, all, KEYS, g), FL_OK);
}

static void expect_table_equals(fl_ps_worker *w, ps_shard *ref) {
  float got[300], want[300];
  uint64_t all[300], t;
  for (int k = 0; k < 300; k++) all[k] = (uint64_t)k;
  assert_int_equal(fl_ps_pull_range(w, 0, 300, got, &t), FL_OK);
  assert_int_equal(fl_ps_wait(w, t, NULL), FL_OK);
  assert_int_equal(ps_shard_pull(ref, all, 300, want), FL_OK);
  assert_memory_equal(got, want, sizeof got);
}

static size_t on_body(char *data, size_t size, size_t n, void *user) {
  return fl_buf_append(user, data, size * n) == FL_OK ? size * n : 0;
}

/* Shard `shard` of the application's only table in the driver's web UI (/ps), or NULL while
 * the UI has none. */
static json_t *ui_shard(fl_context *ctx, uint32_t shard) {
  const char *base = fl_context_ui_url(ctx);
  assert_non_null(base);
  char url[512];
  snprintf(url, sizeof url, "%s/api/v1/applications/current/ps", base);
  CURL *curl = curl_easy_init();
  assert_non_null(curl);
  fl_buf body = FL_BUF_INIT;
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  json_t *all = rc == CURLE_OK ? json_loadb((const char *)body.data, body.len, 0, NULL) : NULL;
  fl_buf_free(&body);
  json_t *s = json_array_size(all) == 1
                  ? json_array_get(json_object_get(json_array_get(all, 0), "shards"), shard)
                  : NULL;
  json_incref(s);
  json_decref(all);
  return s;
}

/* Waits (20 s at most) until the UI shows shard `shard` with `replicas` replicas, none of them
 * executor `not` (0: any); returns it. */
static json_t *ui_shard_wait(fl_context *ctx, uint32_t shard, size_t replicas, json_int_t not) {
  for (int i = 0; i < 400; i++) {
    json_t *s = ui_shard(ctx, shard);
    json_t *backups = json_object_get(s, "backups");
    bool ok = s && json_array_size(backups) + 1 == replicas &&
              json_integer_value(json_object_get(s, "primary")) != not;
    for (size_t b = 0; ok && b < json_array_size(backups); b++)
      ok = json_integer_value(json_array_get(backups, b)) != not;
    if (ok) return s;
    json_decref(s);
    nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
  }
  fail_msg("the web UI did not show shard %u with %zu replicas, none executor %lld, within 20 s", shard, replicas,
           (long long)not);
  return NULL;
}

/* The PsTable events in the event logs of `dir`: how many, and the last one's shard 0
 * replicas (primary first) into replicas[0 .. *n). */
static int ps_table_events(const char *dir, json_int_t *replicas, size_t *n) {
  int count = 0;
  *n = 0;
  DIR *d = opendir(dir);
  assert_non_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!strstr(e->d_name, ".jsonl")) continue;
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    char *text = slurp(path);
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
      json_t *ev = json_loads(line, 0, NULL);
      const char *kind = json_string_value(json_object_get(ev, "Event"));
      if (kind && strcmp(kind, "PsTable") == 0) {
        count++;
        json_t *r = json_object_get(json_array_get(json_object_get(ev, "Shards"), 0), "Replicas");
        *n = json_array_size(r) < 4 ? json_array_size(r) : 4;
        for (size_t i = 0; i < *n; i++) replicas[i] = json_integer_value(json_array_get(r, i));
      }
      json_decref(ev);
    }
    free(text);
  }
  closedir(d);
  return count;
}

/* Kills the executor whose server is `address`, as a crash would (SIGKILL). */
static proc *kill_serving(proc **execs, int n, const char *address) {
  proc *victim = executor_serving(execs, n, address);
  assert_non_null(victim);
  assert_int_equal(kill(victim->pid, SIGKILL), 0);
  assert_true(wait_exit(victim->pid, STOP_LIMIT_S) >= 0);
  victim->pid = 0;
  return victim;
}

/* `executors` executors, a table of 3 shards with `backups` backups each; the executor of
 * shard 0's primary is killed mid-run, and with two backups, once the driver has backed the
 * shard up again, the executor of its new primary too. */
static void run_losses(int executors, uint32_t backups, fl_ps_replication mode) {
  char log_dir[PATH_MAX + 16], log_env[PATH_MAX + 48];
  snprintf(log_dir, sizeof log_dir, "%s/events", fx.dir);
  assert_int_equal(mkdir(log_dir, 0700), 0);
  snprintf(log_env, sizeof log_env, "FLINT_EVENT_LOG_DIR=%s", log_dir);
  start_driver((const char *const[]){log_env, "FLINT_UI_PORT=0", NULL});
  proc *execs[4];
  for (int i = 0; i < executors; i++) {
    char name[16];
    snprintf(name, sizeof name, "exec%d", i + 1);
    execs[i] = start_executor(name, NULL);
  }
  for (int i = 0; i < executors; i++) wait_log(execs[i], "registered with the driver");
  fl_context *ctx;
  assert_int_equal(fl_context_open(fx.master, NULL, &ctx), FL_OK);
  fl_ps_options o = FL_PS_OPTIONS_INIT;
  o.keys = 300;
  o.update = FL_PS_ADAGRAD;
  o.lr = 0.05f;
  o.shards = 3;
  o.backups = backups;
  o.replication = mode;
  fl_ps_table *t;
  if (fl_ps_table_create(ctx, &o, &t) != FL_OK) fail_msg("create: %s", fl_last_error());
  ps_map map;
  assert_int_equal(ps_map_decode(fl_ps_table_handle(t), &map), FL_OK);
  /* Every shard's replicas are on executors of their own. */
  for (uint32_t s = 0; s < map.shards; s++) {
    assert_int_equal(ps_place_backups(&map.places[s]), backups);
    for (uint32_t b = 0; b < backups; b++) assert_string_not_equal(map.places[s].primary, map.places[s].backups[b]);
  }
  ps_table_spec spec = {.keys = 300, .width = 1, .update = PS_UPDATE_INIT};
  spec.update.kind = PS_UPDATE_ADAGRAD;
  spec.update.lr = 0.05f;
  ps_shard *ref;
  assert_int_equal(ps_shard_create(&spec, 1, 0, &ref), FL_OK);
  fl_ps_worker *w;
  assert_int_equal(fl_ps_worker_open(fl_ps_table_handle(t), 0, &w), FL_OK);
  for (int round = 0; round < 10; round++) push_round(w, ref, round);
  json_t *shown = ui_shard_wait(ctx, 0, 1 + backups, 0);
  json_int_t lost = json_integer_value(json_object_get(shown, "primary"));
  json_decref(shown);

  proc *heir = executor_serving(execs, executors, map.places[0].backups[0]);
  assert_non_null(heir);
  kill_serving(execs, executors, map.places[0].primary);
  for (int round = 10; round < 20; round++) push_round(w, ref, round);
  expect_table_equals(w, ref);
  assert_true(fl_ps_worker_stats_get(w).failovers >= 1);
  /* The driver saw the loss: the backup is the primary, and the shard is backed up again. */
  wait_log(&fx.procs[0], "its backup on executor");
  char again[160];
  snprintf(again, sizeof again, "table %u shard 0 is backed up on", map.table);
  wait_log(executor_serving(execs, executors,
                            mode == FL_PS_CHAIN ? map.places[0].backups[backups - 1] : map.places[0].backups[0]),
           again);
  for (int round = 20; round < 25; round++) push_round(w, ref, round);
  expect_table_equals(w, ref);
  /* The UI shows the replicas the recovery made, and the new primary's clock of worker 0. */
  shown = ui_shard_wait(ctx, 0, 1 + backups, lost);
  json_t *clock0 = json_object_get(json_object_get(shown, "clocks"), "0");
  assert_non_null(clock0);
  assert_int_equal(json_integer_value(clock0), 0);
  json_decref(shown);
  /* The recovery posted the table again: its last PsTable has shard 0 without the lost one. */
  json_int_t replicas[4];
  size_t nr = 0;
  bool reposted = false;
  for (int i = 0; i < 400 && !reposted; i++) {
    reposted = ps_table_events(log_dir, replicas, &nr) >= 2 && nr == 1 + backups;
    for (size_t r = 0; reposted && r < nr; r++) reposted = replicas[r] != lost;
    if (!reposted) nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
  }
  assert_true(reposted);
  if (backups >= 2) { /* a second loss: the promoted primary's executor */
    kill_serving(execs, executors, map.places[0].backups[0]);
    for (int round = 25; round < 35; round++) push_round(w, ref, round);
    expect_table_equals(w, ref);
    assert_true(fl_ps_worker_stats_get(w).failovers >= 2);
  }
  (void)heir;
  fl_ps_worker_close(w);
  fl_ps_table_destroy(t);
  fl_context_close(ctx);
  ps_map_free(&map);
  ps_shard_destroy(ref);
  stop_all();
  fx.passed = true;
}

static void test_executor_killed_no_update_lost(void **state) {
  (void)state;
  run_losses(3, 1, FL_PS_PRIMARY_BACKUP);
}

static void test_chain_survives_two_losses(void **state) {
  (void)state;
  run_losses(4, 2, FL_PS_CHAIN);
}

/* Asked for a replicated table, a cluster of one executor says what is missing. */
static void test_replication_needs_two_executors(void **state) {
  (void)state;
  start_driver(NULL);
  proc *e = start_executor("exec1", NULL);
  wait_log(e, "registered with the driver");
  fl_context *ctx;
  assert_int_equal(fl_context_open(fx.master, NULL, &ctx), FL_OK);
  fl_ps_options o = FL_PS_OPTIONS_INIT;
  o.keys = 10;
  fl_ps_table *t;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_ESTATE);
  assert_non_null(strstr(fl_last_error(), "needs 2 executors"));
  o.replicate = false;
  assert_int_equal(fl_ps_table_create(ctx, &o, &t), FL_OK);
  fl_ps_table_destroy(t);
  fl_context_close(ctx);
  stop_all();
  fx.passed = true;
}

int main(void) {
  find_binaries((const char *const[]){NULL});
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_executor_killed_no_update_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chain_survives_two_losses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replication_needs_two_executors, setup, teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
