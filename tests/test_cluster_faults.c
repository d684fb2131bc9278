/*
 * test_cluster_faults: a cluster under the faults users meet, with real processes on
 * 127.0.0.1 (tests/proc_harness.c): a driver that dies and is started again on its address,
 * and `flint ml` given paths relative to its own folder, which is not its executors'.
 *
 * Binaries: $FLINT_BIN (ctest sets it to <build>/bin) holds flint and job_cache_sum.so.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proc_harness.h"

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flint/cluster.h"
#include "flint/flint.h"

static int setup(void **state) { return harness_setup(state); }
static int teardown(void **state) { return harness_teardown(state); }

/* `flint status` of the running driver, NUL-terminated; the caller frees it. */
static char *status_text(void) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  fl_status st = fl_print_status(fx.master, f);
  fclose(f);
  if (st != FL_OK) {
    free(text);
    return NULL;
  }
  return text;
}

/* How many executors `flint status` lists as alive. */
static size_t count_alive(const char *text) {
  size_t n = 0;
  for (const char *s = text; s && (s = strstr(s, " alive\n")); s++) n++;
  return n;
}

/* Waits until the driver lists n live executors. */
static void wait_executors(size_t n) {
  double deadline = now_s() + START_LIMIT_S;
  for (;;) {
    char *text = status_text();
    size_t listed = count_alive(text);
    free(text);
    if (listed == n) return;
    for (int i = 0; i < fx.num_procs; i++)
      if (fx.procs[i].pid) expect_running(&fx.procs[i]);
    if (now_s() > deadline) fail_msg("%zu of %zu executors alive after %d s", listed, n, START_LIMIT_S);
    sleep_ms(50);
  }
}

/* The running applications and the live executors' cached KiB that `flint status` lists. */
static void status_load(size_t *running, unsigned long long *cached_ki) {
  char *text = status_text();
  assert_non_null(text);
  *running = 0;
  for (const char *s = text; (s = strstr(s, " (running), ")); s++) (*running)++;
  *cached_ki = 0;
  for (const char *line = strchr(text, '\n'); line; line = strchr(line + 1, '\n')) {
    unsigned long long id, mem, cached;
    unsigned cores;
    char address[64];
    if (sscanf(line + 1, " %llu %63s %u %lluMi %lluKi", &id, address, &cores, &mem, &cached) == 5) *cached_ki += cached;
  }
  free(text);
}

/* How many times `needle` is in the log of `p`. */
static int count_in_log(proc *p, const char *needle) {
  char *log = slurp(p->log);
  int n = 0;
  for (const char *s = log; s && (s = strstr(s, needle)); s += strlen(needle)) n++;
  free(log);
  return n;
}

/* ---- 1. a driver restarted on its address ---------------------------------------------- */

/* A client caches range(0, 1000) and keeps its application open; the driver is killed and a
 * new one starts on the same port. A new client's cached data and shuffles must be its own
 * (before, the executor served the old application 1's blocks and map outputs to the new
 * application 1: sum 499500 for 999000), the old client's calls are refused with a message
 * that says why, and the executor says once what happened. */
static void test_driver_restart_serves_no_stale_data(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  proc *exec = start_executor("exec1", NULL);
  wait_executors(1);
  const char *go = test_file("go");
  proc *old_client = start_proc("old-client", NULL,
                                (const char *const[]){"submit", "--in-process", "--master", fx.master,
                                                      bin_file("job_cache_sum.so"), "1", "4", go, NULL});
  wait_log(old_client, "shuffled sum 499500");

  assert_int_equal(kill(driver->pid, SIGKILL), 0);
  assert_true(wait_exit(driver->pid, STOP_LIMIT_S) >= 0);
  driver->pid = 0;
  restart_driver("driver2", NULL);
  wait_executors(1);

  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_cache_sum.so"), "2", "4");
  expect_status(r, 0);
  EXPECT_OUT(r, "count 1000\n");
  EXPECT_OUT(r, "sum 999000\n");
  EXPECT_OUT(r, "shuffled sum 999000\n");
  free(r);
  /* Other partition counts looped for ever on a map output that the old shuffle left. */
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_cache_sum.so"), "3", "5");
  expect_status(r, 0);
  EXPECT_OUT(r, "count 1000\n");
  EXPECT_OUT(r, "shuffled sum 1498500\n");
  free(r);

  /* The old client's application belonged to the dead driver. */
  FILE *f = fopen(go, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(wait_exit(old_client->pid, CMD_LIMIT_S), 2); /* its second run failed */
  old_client->pid = 0;
  char *log = slurp(old_client->log);
  assert_non_null(strstr(log, "earlier driver process"));
  assert_null(strstr(log, "again: sum"));
  free(log);

  /* The executor dropped the old driver's state once, said so once, and registered afresh. */
  assert_int_equal(count_in_log(exec, "does not know this executor"), 1);
  assert_int_equal(count_in_log(exec, "registered afresh"), 1);
  assert_true(count_in_log(exec, "heartbeat to the driver") <= 1);
  char *text = status_text();
  assert_non_null(text);
  assert_non_null(strstr(text, "executors: 1\n"));
  free(text);
  stop_all();
  fx.passed = true;
}

/* An executor whose driver is gone and does not come back says so once, not every second,
 * drops its state after FLINT_DRIVER_TIMEOUT_MS, and keeps trying quietly; a driver started
 * later on the address gets it back. */
static void test_executor_outlives_its_driver(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  proc *exec = start_executor("exec1", (const char *const[]){"FLINT_DRIVER_TIMEOUT_MS=1500", NULL});
  wait_executors(1);
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_cache_sum.so"), "1", "2");
  expect_status(r, 0);
  free(r);
  assert_int_equal(kill(driver->pid, SIGKILL), 0);
  assert_true(wait_exit(driver->pid, STOP_LIMIT_S) >= 0);
  driver->pid = 0;
  wait_log(exec, "no answer from the driver");
  sleep_ms(3000); /* quiet retries: nothing more in the log */
  assert_int_equal(count_in_log(exec, "heartbeat to the driver"), 1);
  assert_int_equal(count_in_log(exec, "no answer from the driver"), 1);
  expect_running(exec);

  restart_driver("driver2", NULL);
  wait_executors(1);
  wait_log(exec, "registered afresh");
  r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_cache_sum.so"), "2", "2");
  expect_status(r, 0);
  EXPECT_OUT(r, "shuffled sum 999000\n");
  free(r);
  stop_all();
  fx.passed = true;
}

/* ---- 2. a task that kills its executor ---------------------------------------------------- */

/* A map function that crashes its executor (SIGSEGV, abort(), exit()) costs its job, which
 * fails after the task's attempts with a message naming the dataset, the partition, the
 * function and how the process died; the executors come back (`flint executor` supervises
 * them) with new ids, and another application on the same driver, whose cached blocks went
 * with them, still gets its answers. Before, the task ran on every executor in turn until
 * none was left, and the job failed with "every executor was lost ... none registered". */
static void test_poison_task_costs_its_job_not_the_cluster(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(2);
  const char *go = test_file("go");
  proc *other = start_proc("other-app", NULL,
                           (const char *const[]){"submit", "--in-process", "--master", fx.master,
                                                 bin_file("job_cache_sum.so"), "1", "4", go, NULL});
  wait_log(other, "shuffled sum 499500");

  static const struct {
    const char *mode, *death;
  } kinds[] = {{"segv", "died by signal 11"}, {"abort", "died by signal 6"}, {"exit", "exited with status 7"}};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_poison.so"), kinds[k].mode, "2");
    expect_status(r, 1);
    EXPECT_ERR(r, "partition 2 of dataset");
    EXPECT_ERR(r, "failed 4 times");
    EXPECT_ERR(r, kinds[k].death);
    EXPECT_ERR(r, "in function jp_poison of job_poison.so");
    EXPECT_NO_ERR(r, "every executor was lost");
    free(r);
    wait_executors(2); /* fresh ones, as many as before */
  }
  char *text = status_text();
  assert_non_null(text);
  /* The first two died, and their ids are not reused: the live ones are later ones. */
  for (const char *line = strchr(text, '\n'); line; line = strchr(line + 1, '\n')) {
    const char *end = strchr(line + 1, '\n');
    unsigned long long id;
    if (end && end - line > 7 && strncmp(end - 6, " alive", 6) == 0 && sscanf(line + 1, " %llu", &id) == 1)
      assert_true(id > 2);
  }
  free(text);

  /* The cluster still works: the other application's next job, and a new one. */
  FILE *f = fopen(go, "w");
  assert_non_null(f);
  fclose(f);
  assert_int_equal(wait_exit(other->pid, CMD_LIMIT_S), 0);
  other->pid = 0;
  char *log = slurp(other->log);
  assert_non_null(strstr(log, "again: shuffled sum 499500"));
  free(log);
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_poison.so"), "segv", "9");
  expect_status(r, 0);
  EXPECT_OUT(r, "count 400\n");
  free(r);
  expect_running(driver);
  stop_all();
  fx.passed = true;
}

/* ---- 3. clients that go away ------------------------------------------------------------- */

/* Clients killed mid-application: the driver closes their applications once their lease runs
 * out (FLINT_CLIENT_TIMEOUT_MS), and the executors drop their cached blocks. Before, the
 * applications stayed "running" and their blocks cached for ever. */
static void test_dead_clients_applications_close(void **state) {
  (void)state;
  start_driver((const char *const[]){"FLINT_CLIENT_TIMEOUT_MS=1500", NULL});
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(2);
  const char *never = test_file("never");
  proc *clients[3];
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "client%d", i);
    clients[i] = start_proc(name, NULL,
                            (const char *const[]){"submit", "--in-process", "--master", fx.master,
                                                  bin_file("job_cache_sum.so"), "1", "4", never, NULL});
  }
  for (int i = 0; i < 3; i++) wait_log(clients[i], "shuffled sum 499500");
  size_t running;
  unsigned long long cached;
  status_load(&running, &cached);
  assert_int_equal(running, 3);
  /* A live client keeps its application past the lease: it says it is alive. */
  sleep_ms(2500);
  status_load(&running, &cached);
  assert_int_equal(running, 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(kill(clients[i]->pid, SIGKILL), 0);
    assert_true(wait_exit(clients[i]->pid, STOP_LIMIT_S) >= 0);
    clients[i]->pid = 0;
  }
  double deadline = now_s() + 30; /* the lease is 1.5 s: only a hang takes this long */
  do {
    sleep_ms(100);
    status_load(&running, &cached);
    if (now_s() > deadline) fail_msg("30 s after its clients died: %zu applications running, %llu KiB cached", running, cached);
  } while (running || cached);
  stop_all();
  fx.passed = true;
}

/* `flint submit` interrupted (SIGINT, SIGTERM) stops its job on the driver, which closes the
 * job's application; before, the job ran on to its end. */
static void test_interrupted_submit_stops_its_job(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(1);
  const char *never = test_file("never");
  proc *submitter = start_proc("submitter", NULL,
                               (const char *const[]){"submit", "--master", fx.master, bin_file("job_cache_sum.so"),
                                                     "1", "2", never, NULL});
  wait_log(submitter, "shuffled sum 499500");
  assert_int_equal(kill(submitter->pid, SIGTERM), 0);
  int status = wait_exit(submitter->pid, CMD_LIMIT_S);
  submitter->pid = 0;
  assert_int_equal(status, 128 + SIGTERM); /* the job's status: killed by SIGTERM */
  wait_log(submitter, "is being stopped");
  wait_log(driver, "job binary 1 was killed by signal 15");
  size_t running;
  unsigned long long cached;
  status_load(&running, &cached);
  assert_int_equal(running, 0);
  stop_all();
  fx.passed = true;
}

/* ---- flint ml with relative paths ------------------------------------------------------ */

/* `flint ml --data REL/PATH --test REL/PATH` against a driver whose executor runs in another
 * folder: the paths are the client's, so the executor must get them made absolute (before,
 * its tasks opened REL/PATH in their own folder and the job failed: "cannot open"). */
static void test_ml_relative_paths(void **state) {
  (void)state;
  start_driver(NULL);
  start_executor("exec1", NULL); /* in this program's folder, not fx.dir */
  wait_executors(1);
  char data_dir[PATH_MAX + 64];
  snprintf(data_dir, sizeof data_dir, "%s", test_file("ml"));
  make_dir(data_dir);
  char csv[PATH_MAX + 80];
  snprintf(csv, sizeof csv, "%s/tiny.csv", data_dir);
  FILE *f = fopen(csv, "w");
  assert_non_null(f);
  for (int i = 0; i < 200; i++) { /* y = 1 + 2 x1 - 3 x2, the label first */
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1;
    fprintf(f, "%.6f,%.6f,%.6f\n", 1 + 2 * x1 - 3 * x2, x1, x2);
  }
  assert_int_equal(fclose(f), 0);
  char here[PATH_MAX];
  assert_non_null(getcwd(here, sizeof here));
  assert_int_equal(chdir(fx.dir), 0); /* flint ml's folder: fx.dir, where ml/tiny.csv is */
  run_result *r = FLINT(NULL, "ml", "linreg", "--master", fx.master, "--data", "ml/tiny.csv", "--test", "ml/tiny.csv",
                        "--format", "csv", "--partitions", "2");
  assert_int_equal(chdir(here), 0);
  expect_status(r, 0);
  EXPECT_OUT(r, "rows         200\n");
  EXPECT_OUT(r, "features     2\n");
  EXPECT_OUT(r, "\ntest ");
  free(r);
  stop_all();
  fx.passed = true;
}

int main(void) {
  find_binaries((const char *const[]){"job_cache_sum.so", "job_poison.so", NULL});
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_driver_restart_serves_no_stale_data, setup, teardown),
      cmocka_unit_test_setup_teardown(test_executor_outlives_its_driver, setup, teardown),
      cmocka_unit_test_setup_teardown(test_poison_task_costs_its_job_not_the_cluster, setup, teardown),
      cmocka_unit_test_setup_teardown(test_dead_clients_applications_close, setup, teardown),
      cmocka_unit_test_setup_teardown(test_interrupted_submit_stops_its_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ml_relative_paths, setup, teardown),
  };
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
