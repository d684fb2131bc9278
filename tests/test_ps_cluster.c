/*
 * test_ps_cluster: parameter-server tables in a real cluster (a driver and three executor
 * processes, proc_harness): the driver places a replicated table on the executors' servers,
 * a worker (this process) pushes, and the executor holding a primary is killed with
 * SIGKILL mid-run (with a chain of three replicas, then the new primary's too). Every
 * acknowledged push must survive (checked bit for bit against one local shard doing the
 * same arithmetic), training must go on without a call failing, and the driver must promote
 * the backup and back the shard up again on another executor.
 */
#include "proc_harness.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

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
  start_driver(NULL);
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
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_executor_killed_no_update_lost, setup, teardown),
      cmocka_unit_test_setup_teardown(test_chain_survives_two_losses, setup, teardown),
      cmocka_unit_test_setup_teardown(test_replication_needs_two_executors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
