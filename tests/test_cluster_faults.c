/*
 * test_cluster_faults: a cluster under the faults users meet, with real processes on
 * 127.0.0.1 (tests/proc_harness.c): a driver that dies and is started again on its address,
 * tasks that crash their executor, clients that go away, many clients at once, no executors,
 * no usable GPU, and `flint ml` given paths relative to its own folder, which is not its
 * executors'. TEST_FILTER=NAME runs the tests whose names match.
 *
 * Binaries: $FLINT_BIN (ctest sets it to <build>/bin) holds flint, job_cache_sum.so and
 * job_poison.so.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "proc_harness.h"
#include "count_thread.h"

#include <dirent.h>
#include <pthread.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
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

/* ---- 4. many clients at once --------------------------------------------------------------- */

/* A process's thread count (/proc/PID/status), -1 when it cannot be read. */
static int thread_count(pid_t pid) {
  char path[64], line[128];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

#define MAX_REPLY_TIDS 256
typedef struct thread_watch {
  pid_t pid;
  atomic_bool stop;
  int max_threads;
  int reply_tids[MAX_REPLY_TIDS]; /* distinct threads named fl-reply seen */
  int num_reply_tids;
  pthread_t thread;
} thread_watch;

/* Samples the driver's threads until told to stop: the most at once, and every fl-reply
 * thread by id (a pool keeps the same few; a thread per reply shows new ids). */
static void *watch_main(void *arg) {
  thread_watch *w = arg;
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/task", (int)w->pid);
  while (!atomic_load(&w->stop)) {
    int n = thread_count(w->pid);
    if (n > w->max_threads) w->max_threads = n;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
      int tid = atoi(e->d_name);
      if (tid <= 0) continue;
      char path[128], comm[32] = "";
      snprintf(path, sizeof path, "%s/%d/comm", dir, tid);
      FILE *f = fopen(path, "r");
      if (!f) continue;
      bool reply = fgets(comm, sizeof comm, f) && strncmp(comm, "fl-reply", 8) == 0;
      fclose(f);
      bool seen = false;
      for (int i = 0; i < w->num_reply_tids && !seen; i++) seen = w->reply_tids[i] == tid;
      if (reply && !seen && w->num_reply_tids < MAX_REPLY_TIDS) w->reply_tids[w->num_reply_tids++] = tid;
    }
    if (d) closedir(d);
    usleep(500);
  }
  return NULL;
}

#define CLIENTS 12
typedef struct client_run {
  fl_context *ctx;
  int64_t records; /* collected by each job */
  int jobs;
  fl_status status;
  char error[256];
} client_run;

static void *client_main(void *arg) {
  client_run *c = arg;
  for (int j = 0; j < c->jobs && c->status == FL_OK; j++) {
    fl_dataset *ds = NULL;
    fl_records *recs = NULL;
    c->status = fl_range(c->ctx, 0, c->records, 1, 2, &ds);
    if (c->status == FL_OK) c->status = fl_collect(ds, &recs);
    if (c->status == FL_OK) {
      int64_t sum = 0;
      for (size_t i = 0; i < fl_records_count(recs); i++) sum += fl_i64(fl_records_get(recs, i));
      if ((int64_t)fl_records_count(recs) != c->records || sum != (c->records - 1) * c->records / 2)
        c->status = FL_EINTERNAL;
    }
    if (c->status != FL_OK) snprintf(c->error, sizeof c->error, "%s", fl_last_error());
    fl_records_free(recs);
    fl_dataset_free(ds);
  }
  return NULL;
}

/* Many clients collect results over the driver's 1 MiB reply offload at once (two of them
 * beyond the 16 MiB a reply carries inline): every result comes back whole, and the driver
 * packs them on its few fl-reply threads. Before, each such reply started a detached thread
 * of its own, so the driver's threads grew with its load. */
static void test_many_large_replies_few_threads(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_executors(2);
  static client_run clients[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) {
    clients[i] = (client_run){.records = i < 2 ? 4000000 : 400000, .jobs = i < 2 ? 1 : 3};
    assert_ok(fl_context_open(fx.master, NULL, &clients[i].ctx));
  }
  static thread_watch w;
  w = (thread_watch){.pid = driver->pid};
  int baseline = thread_count(driver->pid);
  assert_true(baseline > 0);
  assert_int_equal(pthread_create(&w.thread, NULL, watch_main, &w), 0);
  pthread_t threads[CLIENTS];
  for (int i = 0; i < CLIENTS; i++) assert_int_equal(pthread_create(&threads[i], NULL, client_main, &clients[i]), 0);
  for (int i = 0; i < CLIENTS; i++) pthread_join(threads[i], NULL);
  atomic_store(&w.stop, true);
  pthread_join(w.thread, NULL);
  fprintf(stderr, "driver threads: %d before, at most %d during; %d fl-reply threads seen\n", baseline,
          w.max_threads, w.num_reply_tids);
  for (int i = 0; i < CLIENTS; i++) {
    if (clients[i].status != FL_OK) fail_msg("client %d: %s: %s", i, fl_status_name(clients[i].status), clients[i].error);
    fl_context_close(clients[i].ctx);
  }
  /* The pool's 4 threads, no more; the bound on the total only catches a thread per reply
   * (36 replies), not a timing. */
  assert_true(w.num_reply_tids > 0 && w.num_reply_tids <= 4);
  assert_true(w.max_threads <= baseline + 8);
  expect_running(driver);
  stop_all();
  fx.passed = true;
}

/* ---- 5. a driver without executors ---------------------------------------------------------- */

/* Jobs on a driver that no executor ever registered with: the driver warns every
 * FLINT_NO_EXECUTOR_WARN_MS while they wait, and each fails after waiting
 * FLINT_NO_EXECUTOR_TIMEOUT_MS (counted from its own submission, so a job submitted late
 * still gets its whole wait), with a message naming the setting; an executor that comes
 * later runs the next job. Before, the job waited silently for ever. */
static void test_job_without_executors_warns_then_fails(void **state) {
  (void)state;
  proc *driver = start_driver((const char *const[]){"FLINT_NO_EXECUTOR_TIMEOUT_MS=2500",
                                                    "FLINT_NO_EXECUTOR_WARN_MS=500", NULL});
  fl_context *ctx;
  assert_ok(fl_context_open(fx.master, NULL, &ctx));
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 100, 1, 2, &ds));
  for (int round = 0; round < 2; round++) { /* the second long after the driver started */
    count_thread c;
    double started = now_s();
    count_start(&c, ds);
    count_join(&c, 30); /* 2.5 s, or a hang */
    double waited = c.ended - started;
    fprintf(stderr, "job %d failed after %.1f s: %s\n", round, waited, c.error);
    assert_int_equal(c.status, FL_ETIMEDOUT);
    assert_non_null(strstr(c.error, "no executor has registered"));
    assert_non_null(strstr(c.error, "FLINT_NO_EXECUTOR_TIMEOUT_MS"));
    assert_true(waited >= 2.4);
  }
  assert_true(count_in_log(driver, "no executor has registered; the job is waiting") >= 2);

  start_executor("exec1", NULL);
  wait_executors(1);
  uint64_t n = 0;
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 100);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  expect_running(driver);
  stop_all();
  fx.passed = true;
}

/* ---- 6. an executor whose GPU cannot be used ------------------------------------------------ */

/* A GPU training job on a cluster whose only GPU executor has no usable device (--gpu 1023:
 * no machine has that GPU, and a build without CUDA has none at all) fails after one
 * attempt, not max_task_attempts, and its message names the executor and the device's
 * cause. Before, the stage ran 4 times and the message said only "the cluster has 0 (...)". */
static void test_executor_without_usable_gpu_fails_once(void **state) {
  (void)state;
  proc *driver = start_driver(NULL);
  char work[PATH_MAX + 64];
  snprintf(work, sizeof work, "%s/gpu-work", fx.dir);
  make_dir(work);
  proc *exec = start_proc("gpu-exec", NULL,
                          (const char *const[]){"executor", "--driver", fx.target, "--cores", "1", "--memory", "256m",
                                                "--work-dir", work, "--gpu", "1023", NULL});
  snprintf(exec->work, sizeof exec->work, "%s", work);
  wait_executors(1);
  run_result *r = FLINT(NULL, "train", "--model", "mlp", "--data", "synthetic-imagenet", "--device", "cuda",
                        "--batch", "8", "--synthetic-images", "8", "--epochs", "1", "--quiet", "--master", fx.master);
  expect_status(r, 1);
  EXPECT_ERR(r, "executor 1: --gpu 1023 but no usable device: ");
  EXPECT_ERR(r, "device cuda:1023: ");
  free(r);
  assert_int_equal(count_in_log(driver, "runs again (attempt"), 0);
  assert_int_equal(count_in_log(driver, "has no usable device"), 1);
  expect_running(exec);
  stop_all();
  fx.passed = true;
}

/* ---- 7. the figures of a cluster context ---------------------------------------------------- */

/* fl_context_stats through a driver gives the application's cached bytes and evictions on
 * its executors: a cached dataset's bytes (what fl_storage_info_get says of it), then, once
 * a second cached dataset needs the room of the 256 MiB executor, evictions. A second
 * application's figures are its own. Before, both were always 0 in cluster mode. */
static void test_cluster_context_stats(void **state) {
  (void)state;
  start_driver(NULL);
  start_executor("exec1", NULL);
  wait_executors(1);
  fl_context *ctx, *other;
  assert_ok(fl_context_open(fx.master, NULL, &ctx));
  assert_ok(fl_context_open(fx.master, NULL, &other));
  fl_dataset *a, *b;
  uint64_t n;
  assert_ok(fl_range(ctx, 0, 4000000, 1, 4, &a));
  assert_ok(fl_cache(a));
  assert_ok(fl_count(a, &n));
  fl_storage_info info;
  assert_ok(fl_storage_info_get(a, &info));
  fl_context_stats st;
  assert_ok(fl_context_stats_get(ctx, &st));
  fprintf(stderr, "cached %llu bytes (dataset: %llu), %llu evicted\n", (unsigned long long)st.memory_used,
          (unsigned long long)info.memory_bytes, (unsigned long long)st.blocks_evicted);
  assert_true(info.memory_bytes > 0);
  assert_int_equal(st.memory_used, info.memory_bytes);
  assert_int_equal(st.blocks_evicted, 0);
  fl_context_stats none;
  assert_ok(fl_context_stats_get(other, &none));
  assert_int_equal(none.memory_used, 0);

  /* Enough partitions of a's size to fill the executor's 256 MiB: a's must go. */
  uint32_t parts = (uint32_t)((256ull << 20) / (info.memory_bytes / 4)) + 2;
  assert_ok(fl_range(ctx, 0, 1000000LL * parts, 1, parts, &b));
  assert_ok(fl_cache(b));
  assert_ok(fl_count(b, &n));
  assert_ok(fl_context_stats_get(ctx, &st));
  fprintf(stderr, "then %llu bytes cached, %llu evicted\n", (unsigned long long)st.memory_used,
          (unsigned long long)st.blocks_evicted);
  assert_true(st.blocks_evicted > 0);
  assert_true(st.memory_used > 0 && st.memory_used <= (256ull << 20));
  assert_ok(fl_context_stats_get(other, &none));
  assert_int_equal(none.blocks_evicted, 0);
  fl_dataset_free(b);
  fl_dataset_free(a);
  fl_context_close(other);
  fl_context_close(ctx);
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
      cmocka_unit_test_setup_teardown(test_many_large_replies_few_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_job_without_executors_warns_then_fails, setup, teardown),
      cmocka_unit_test_setup_teardown(test_executor_without_usable_gpu_fails_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cluster_context_stats, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ml_relative_paths, setup, teardown),
  };
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
