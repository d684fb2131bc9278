/*
 * test_recovery: fault tolerance with real processes (issue 5). A `flint driver` and `flint
 * executor`s run as a user runs them (proc_harness); the client is this program
 * (fl_context_open on flint://), with its user functions in the cluster_pipelines library.
 * Executors die by kill -9 or by fault injection (FLINT_FAULT_EXIT_AFTER_TASKS) during a map
 * stage, between a shuffle and the reads of its output, and between iterations over a cached
 * dataset; one executor is 5 times slower (FLINT_FAULT_SLOWDOWN) and speculation backs its
 * tasks up; every executor dies during a job; every executor that held a checkpoint dies.
 * Multi-host: the driver and two executors run in network namespaces of their own, joined by
 * veth pairs to a bridge in a fourth (test_host_cut_off, run as root; skipped with a message
 * otherwise); the client is `flint submit` of job_slow_sums on the driver's host, and one
 * executor's link goes down mid-job. Each faulty run's results must equal the same
 * computation without faults (on local[2], or known in closed form).
 *
 * Time: the driver's heartbeat timeout is FAST_TIMEOUT_MS here, so that a loss is noticed
 * within seconds; tasks sleep a known time (cp_slow_partition) so that a fault lands while a
 * stage runs. Every wait is bounded, and each test by the harness's watchdog.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "count_thread.h"
#include "proc_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

/* From tests/jobs/cluster_pipelines.c. */
fl_status cp_slow_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
fl_status cp_key_mod7(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status cp_times(fl_bytes rec, fl_buf *out, const void *arg);
fl_status cp_counted_copy(fl_bytes rec, fl_buf *out, const void *arg);

#define FAST_TIMEOUT "FLINT_EXECUTOR_TIMEOUT_MS=3000"
#define NUM_RECORDS 4000
#define MAP_PARTS 16
#define REDUCE_PARTS 4
#define LOSS_LIMIT_S 15 /* a lost executor shows in the driver's log */

static fl_context *open_client(const char *master) {
  fl_options opts = FL_OPTIONS_INIT;
  opts.work_dir = fx.dir;
  fl_context *ctx;
  assert_ok(fl_context_open(master, &opts, &ctx));
  return ctx;
}

/* Count of `needle` in a process's log. */
static int log_count(const proc *p, const char *needle) {
  char *log = slurp(p->log);
  int n = 0;
  for (const char *at = log; (at = strstr(at, needle)); at += strlen(needle)) n++;
  free(log);
  return n;
}

/* Waits at most limit_s until `needle` shows `n` times in the log of p. */
static void wait_log_count(const proc *p, const char *needle, int n, double limit_s) {
  double deadline = now_s() + limit_s;
  while (log_count(p, needle) < n) {
    if (now_s() > deadline) fail_msg("%s's log lacks %d of '%s' after %.0f s", p->name, n, needle, limit_s);
    sleep_ms(20);
  }
}

/* Waits until `n` executors have registered with the driver since it started. */
static void wait_registered(const proc *driver, int n) { wait_log_count(driver, " registered: ", n, START_LIMIT_S); }

static void kill9(proc *p) {
  assert_int_equal(kill(p->pid, SIGKILL), 0);
  assert_int_equal(wait_exit(p->pid, STOP_LIMIT_S), 128 + SIGKILL);
  p->pid = 0;
}

/* ---- results as text ------------------------------------------------------------------- */

static int cmp_lines(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The records of ds, collected, one per line, sorted: "K V" for pairs of int64s, "V" for
 * int64s. NULL when the action fails (fl_last_error says why). The caller frees it. */
static char *collect_text(fl_dataset *ds, bool pairs) {
  fl_records *recs;
  if (fl_collect(ds, &recs) != FL_OK) return NULL;
  size_t n = fl_records_count(recs);
  char **lines = calloc(n ? n : 1, sizeof *lines);
  assert_non_null(lines);
  size_t total = 1;
  for (size_t i = 0; i < n; i++) {
    fl_bytes r = fl_records_get(recs, i), k, v;
    char buf[64];
    if (pairs) {
      assert_ok(fl_pair(r, &k, &v));
      snprintf(buf, sizeof buf, "%lld %lld", (long long)fl_i64(k), (long long)fl_i64(v));
    } else {
      snprintf(buf, sizeof buf, "%lld", (long long)fl_i64(r));
    }
    lines[i] = strdup(buf);
    total += strlen(buf) + 1;
  }
  fl_records_free(recs);
  qsort(lines, n, sizeof *lines, cmp_lines);
  char *text = malloc(total), *at = text;
  assert_non_null(text);
  for (size_t i = 0; i < n; i++) {
    at += sprintf(at, "%s\n", lines[i]);
    free(lines[i]);
  }
  *at = '\0';
  free(lines);
  return text;
}

static void expect_same(const char *what, const char *want, const char *got) {
  if (!got) fprintf(stderr, "%s: the action failed: %s\n", what, fl_last_error());
  assert_non_null(got);
  if (strcmp(want, got) != 0)
    fprintf(stderr, "%s: results differ from the run without faults\n--- want ---\n%s--- got ---\n%s", what,
            want, got);
  assert_string_equal(want, got);
}

/* The shuffled pipeline: range -> slow copy (nap_ms per map task) -> key by x % 7 ->
 * reduce_by_key(sum) into REDUCE_PARTS. The caller frees *out. */
static void keyed_sums(fl_context *ctx, int64_t nap_ms, fl_dataset **out) {
  fl_dataset *src, *slow, *pairs;
  assert_ok(fl_range(ctx, 0, NUM_RECORDS, 1, MAP_PARTS, &src));
  assert_ok(fl_map_partitions(src, cp_slow_partition, &nap_ms, sizeof nap_ms, &slow));
  assert_ok(fl_key_by(slow, cp_key_mod7, NULL, 0, &pairs));
  assert_ok(fl_reduce_by_key(pairs, cp_sum, NULL, 0, NULL, REDUCE_PARTS, out));
  fl_dataset_free(pairs);
  fl_dataset_free(slow);
  fl_dataset_free(src);
}

/* keyed_sums on local[2]: the results without faults. */
static char *reference_sums(void) {
  fl_context *ctx = open_client("local[2]");
  fl_dataset *sums;
  keyed_sums(ctx, 0, &sums);
  char *text = collect_text(sums, true);
  assert_non_null(text);
  fl_dataset_free(sums);
  fl_context_close(ctx);
  return text;
}

/* ---- (a) an executor dies during a map stage ------------------------------------------- */

static void test_exit_during_map_stage(void **state) {
  (void)state;
  char *want = reference_sums();
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, NULL});
  /* Unsupervised: the process that dies stays dead, as a machine that fails does. */
  proc *e1 = start_executor("exec1", (const char *const[]){"FLINT_FAULT_EXIT_AFTER_TASKS=3", "FLINT_EXECUTOR_SUPERVISE=0", NULL});
  start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_dataset *sums;
  keyed_sums(ctx, 100, &sums); /* 16 map tasks of 100 ms on 2 slots: exec1 dies in the stage */
  double t0 = now_s();
  char *got = collect_text(sums, true);
  fprintf(stderr, "a map stage that lost an executor: %.1f s\n", now_s() - t0);
  expect_same("exit during a map stage", want, got);
  /* exec1 died as its third task ended (fault injection), and the driver saw it. */
  assert_int_equal(wait_exit(e1->pid, STOP_LIMIT_S), 86);
  e1->pid = 0;
  wait_log_count(driver, " lost: ", 1, LOSS_LIMIT_S);
  free(got);
  fl_dataset_free(sums);
  fl_context_close(ctx);
  free(want);
  stop_all();
  fx.passed = true;
}

/* ---- (b) an executor dies after the map stage, before the reduce side reads it ---------- */

static void test_kill_before_reduce_fetches(void **state) {
  (void)state;
  char *want = reference_sums();
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, NULL});
  proc *e1 = start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_dataset *sums;
  keyed_sums(ctx, 50, &sums); /* map outputs on both executors */
  char *got = collect_text(sums, true);
  expect_same("the first action", want, got);
  free(got);
  /* Another action on the same shuffled dataset reuses the map outputs, half of them on a
   * dead executor: its reduce tasks fail to fetch, the driver reruns only the lost maps. */
  kill9(e1);
  double t0 = now_s();
  got = collect_text(sums, true);
  fprintf(stderr, "reduce tasks reading from a dead executor: %.1f s\n", now_s() - t0);
  expect_same("the action after kill -9", want, got);
  wait_log_count(driver, " lost: ", 1, LOSS_LIMIT_S);
  free(got);
  fl_dataset_free(sums);
  fl_context_close(ctx);
  free(want);
  stop_all();
  fx.passed = true;
}

/* ---- (c) an executor dies between iterations over a cached dataset ---------------------- */

static void test_kill_between_iterations(void **state) {
  (void)state;
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, NULL});
  proc *e1 = start_executor("exec1", NULL);
  start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_dataset *src, *points;
  int64_t nap_ms = 50;
  assert_ok(fl_range(ctx, 0, NUM_RECORDS, 1, 8, &src));
  assert_ok(fl_map_partitions(src, cp_slow_partition, &nap_ms, sizeof nap_ms, &points));
  assert_ok(fl_cache(points));
  const int64_t base = (int64_t)NUM_RECORDS * (NUM_RECORDS - 1) / 2; /* sum of 0..N-1 */
  for (int64_t it = 1; it <= 5; it++) {
    if (it == 3) kill9(e1); /* its cached partitions go with it: recomputed from the lineage */
    fl_dataset *scaled;
    assert_ok(fl_map(points, cp_times, &it, sizeof it, &scaled));
    fl_buf sum = FL_BUF_INIT;
    double t0 = now_s();
    fl_status st = fl_reduce(scaled, cp_sum, NULL, 0, &sum);
    if (st != FL_OK) fprintf(stderr, "iteration %lld: %s\n", (long long)it, fl_last_error());
    assert_ok(st);
    fprintf(stderr, "iteration %lld: %.2f s\n", (long long)it, now_s() - t0);
    assert_int_equal(sum.len, 8);
    assert_int_equal(fl_i64((fl_bytes){sum.data, sum.len}), base * it);
    fl_buf_free(&sum);
    fl_dataset_free(scaled);
  }
  wait_log_count(driver, " lost: ", 1, LOSS_LIMIT_S);
  fl_dataset_free(points);
  fl_dataset_free(src);
  fl_context_close(ctx);
  stop_all();
  fx.passed = true;
}

/* ---- a slow executor: speculation ------------------------------------------------------ */

static void test_speculation_on_a_slow_executor(void **state) {
  (void)state;
  char *want = reference_sums();
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, "FLINT_SPECULATION=1", NULL});
  start_executor("exec1", (const char *const[]){"FLINT_FAULT_SLOWDOWN=5", NULL});
  start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_dataset *sums;
  keyed_sums(ctx, 100, &sums); /* map tasks of 100 ms on exec2 and 500 ms on exec1 */
  double t0 = now_s();
  char *got = collect_text(sums, true);
  fprintf(stderr, "with a 5x slower executor: %.1f s, %d backup copies\n", now_s() - t0,
          log_count(driver, "backup copy"));
  expect_same("speculation", want, got);
  assert_true(log_count(driver, "backup copy") >= 1);
  assert_int_equal(log_count(driver, " lost: "), 0);
  free(got);
  fl_dataset_free(sums);
  fl_context_close(ctx);
  free(want);
  stop_all();
  fx.passed = true;
}

/* ---- every executor lost; then a new one ----------------------------------------------- */

static void test_all_executors_lost(void **state) {
  (void)state;
  char *want = reference_sums();
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, "FLINT_NO_EXECUTOR_TIMEOUT_MS=3000", NULL});
  proc *e1 = start_executor("exec1", NULL);
  proc *e2 = start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_dataset *slow;
  keyed_sums(ctx, 2000, &slow); /* 16 map tasks of 2 s on 2 slots: about 16 s */
  count_thread a;
  count_start(&a, slow);
  sleep_ms(1000);
  kill9(e1);
  kill9(e2);
  double killed = now_s();
  /* Loss takes at most the heartbeat timeout (3 s), then 3 s without executors. With no
   * executor the job cannot end but by failing, and the message names the cause, so the
   * join is bounded only against a hang (30 s, within the test's 55 s watchdog). */
  count_join(&a, 30);
  fprintf(stderr, "every executor lost: the job failed %.1f s later: %s\n", a.ended - killed, a.error);
  assert_int_not_equal(a.status, FL_OK);
  assert_non_null(strstr(a.error, "every executor was lost"));
  assert_non_null(strstr(a.error, "none registered within 3 s"));
  fl_dataset_free(slow);

  /* A new executor joins: the next job runs on it. */
  start_executor("exec3", NULL);
  wait_registered(driver, 3);
  fl_dataset *sums;
  keyed_sums(ctx, 0, &sums);
  char *got = collect_text(sums, true);
  expect_same("the job after a new executor joined", want, got);
  free(got);
  fl_dataset_free(sums);
  fl_context_close(ctx);
  free(want);
  stop_all();
  fx.passed = true;
}

/* ---- a checkpoint outlives every executor that wrote it -------------------------------- */

static void test_checkpoint_outlives_executors(void **state) {
  (void)state;
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, NULL});
  proc *e1 = start_executor("exec1", NULL);
  proc *e2 = start_executor("exec2", NULL);
  wait_registered(driver, 2);

  fl_context *ctx = open_client(fx.master);
  fl_accumulator *calls;
  assert_ok(fl_accumulator_create_i64(ctx, &calls));
  uint64_t id = fl_accumulator_id(calls);
  fl_dataset *src, *copied;
  assert_ok(fl_range(ctx, 0, NUM_RECORDS, 1, 8, &src));
  assert_ok(fl_map(src, cp_counted_copy, &id, sizeof id, &copied));
  char *want = collect_text(src, false);
  assert_non_null(want);
  char dir[PATH_MAX + 64];
  snprintf(dir, sizeof dir, "%s", test_file("checkpoints"));
  assert_ok(fl_checkpoint(copied, dir));
  int64_t n;
  assert_ok(fl_accumulator_value_i64(calls, &n));
  assert_int_equal(n, NUM_RECORDS); /* the checkpoint job ran the function once per record */

  kill9(e1);
  kill9(e2);
  /* The new executor joins while the driver may still believe the dead ones alive: tasks
   * placed on them fail to launch and run on the new one. */
  start_executor("exec3", NULL);
  wait_registered(driver, 3);
  char *got = collect_text(copied, false);
  expect_same("the checkpoint read back by a new executor", want, got);
  assert_ok(fl_accumulator_value_i64(calls, &n));
  assert_int_equal(n, NUM_RECORDS); /* read from the files: the function did not run again */
  free(got);
  free(want);
  fl_dataset_free(copied);
  fl_dataset_free(src);
  fl_accumulator_destroy(calls);
  fl_context_close(ctx);
  remove_tree(dir);
  stop_all();
  fx.passed = true;
}

/* ---- a host cut off: driver and executors in network namespaces ------------------------ */

/* The namespaces of the test (names include the pid): a bridge's, the driver's and two
 * executors' on 10.77.0.0/24, each joined to the bridge by a veth pair. Deleting them
 * deletes the links. The argvs are built before anything can fail, so that the watchdog can
 * delete the namespaces with fork and execve alone. */
#define NS_BRIDGE 0
#define NS_DRIVER 1
#define NS_EXEC1 2
#define NS_EXEC2 3
#define NUM_NS 4
static const char *const ns_tag[NUM_NS] = {"br", "drv", "ex1", "ex2"};
static const char *const ns_addr[NUM_NS] = {NULL, "10.77.0.1", "10.77.0.2", "10.77.0.3"};
static char ns_name[NUM_NS][32];
static bool ns_made[NUM_NS];
static char *ns_del_argv[NUM_NS][5];

/* Runs `ip ARGS...` (at most 10 s) with its output appended to <dir>/ip.log (/dev/null once
 * the teardown removed the folder); returns its exit status (-1: it did not end). No cmocka
 * assertion: the cut runs in a thread. */
static int ip_run(const char *const *args) {
  const char *argv[24];
  int argc = 0;
  argv[argc++] = ip_binary();
  for (const char *const *a = args; *a && argc < 23; a++) argv[argc++] = *a;
  argv[argc] = NULL;
  int fd = open(test_file("ip.log"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  for (int i = 0; i < argc; i++) dprintf(fd, "%s%s", i ? " " : "$ ", argv[i]);
  dprintf(fd, "\n");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    char *envp[] = {NULL};
    execve(argv[0], (char *const *)argv, envp);
    _exit(127);
  }
  close(fd);
  if (pid < 0) return -1;
  double deadline = now_s() + 10;
  for (;;) {
    int wstatus;
    pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid) return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
    if (r < 0 && errno != EINTR) return -1;
    if (now_s() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      return -1;
    }
    sleep_ms(10);
  }
}
#define IP(...) ip_run((const char *const[]){__VA_ARGS__, NULL})

static void expect_ip(int status, const char *what) {
  if (status != 0) {
    char *log = slurp(test_file("ip.log"));
    fprintf(stderr, "%s: ip failed with status %d\n--- ip.log ---\n%s--------------\n", what, status, log);
    free(log);
  }
  assert_int_equal(status, 0);
}

/* The watchdog's cleanup: async-signal-safe (fork, execve, waitpid). */
static void delete_namespaces_on_alarm(void) {
  for (int i = NUM_NS - 1; i >= 0; i--) {
    if (!ns_made[i]) continue;
    pid_t pid = fork();
    if (pid == 0) {
      char *envp[] = {NULL};
      execve(ns_del_argv[i][0], ns_del_argv[i], envp);
      _exit(127);
    }
    if (pid > 0) waitpid(pid, NULL, 0);
  }
}

static int netns_setup(void **state) {
  harness_setup(state);
  for (int i = 0; i < NUM_NS; i++) {
    snprintf(ns_name[i], sizeof ns_name[i], "flint%d%s", (int)getpid(), ns_tag[i]);
    ns_made[i] = false;
    ns_del_argv[i][0] = (char *)(ip_binary() ? ip_binary() : "/bin/false");
    ns_del_argv[i][1] = "netns";
    ns_del_argv[i][2] = "del";
    ns_del_argv[i][3] = ns_name[i];
    ns_del_argv[i][4] = NULL;
  }
  fx.on_alarm = delete_namespaces_on_alarm;
  return 0;
}

static int netns_teardown(void **state) {
  harness_teardown(state); /* the processes first: nothing runs in the namespaces then */
  for (int i = NUM_NS - 1; i >= 0; i--)
    if (ns_made[i] && ip_run((const char *const[]){"netns", "del", ns_name[i], NULL}) == 0) ns_made[i] = false;
  for (int i = 0; i < NUM_NS; i++)
    if (ns_made[i]) fprintf(stderr, "could not delete network namespace %s\n", ns_name[i]);
  return 0;
}

/* Creates the namespaces and links; false (with a message) when namespaces cannot be made. */
static bool make_network(void) {
  if (geteuid() != 0) {
    fprintf(stderr, "skipped: network namespaces need root\n");
    return false;
  }
  if (!ip_binary()) {
    fprintf(stderr, "skipped: no ip (iproute2) in /usr/sbin, /sbin, /usr/bin or /bin\n");
    return false;
  }
  const char *br = ns_name[NS_BRIDGE];
  if (IP("netns", "add", br) != 0) {
    char *log = slurp(test_file("ip.log"));
    fprintf(stderr, "skipped: cannot create a network namespace:\n%s", log);
    free(log);
    return false;
  }
  ns_made[NS_BRIDGE] = true;
  expect_ip(IP("-n", br, "link", "add", "br0", "type", "bridge"), "the bridge");
  expect_ip(IP("-n", br, "link", "set", "br0", "up"), "the bridge up");
  for (int i = NS_DRIVER; i < NUM_NS; i++) {
    const char *ns = ns_name[i], *veth = ns_tag[i]; /* the bridge's end: drv, ex1, ex2 */
    char cidr[32];
    snprintf(cidr, sizeof cidr, "%s/24", ns_addr[i]);
    expect_ip(IP("netns", "add", ns), "a host's namespace");
    ns_made[i] = true;
    expect_ip(IP("-n", br, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns), "a veth pair");
    expect_ip(IP("-n", br, "link", "set", veth, "master", "br0", "up"), "the bridge's end");
    expect_ip(IP("-n", ns, "addr", "add", cidr, "dev", "eth0"), "an address");
    expect_ip(IP("-n", ns, "link", "set", "eth0", "up"), "the host's end");
    expect_ip(IP("-n", ns, "link", "set", "lo", "up"), "loopback");
  }
  return true;
}

/* A line of the log of p that holds both a and b, or false. */
static bool log_has_line(const proc *p, const char *a, const char *b) {
  char *log = slurp(p->log);
  bool found = false;
  for (char *line = strtok(log, "\n"); line && !found; line = strtok(NULL, "\n"))
    found = strstr(line, a) && strstr(line, b);
  free(log);
  return found;
}

/* The cut, in a thread while the main one waits for `flint submit`: once the job's
 * application is open and its first tasks run, exec1's link goes down on the bridge's side. */
typedef struct cut_thread {
  const proc *driver;
  int delay_ms;
  int status; /* ip's; -2: the job never started */
  double at;
} cut_thread;

static void *cut_link(void *arg) {
  cut_thread *c = arg;
  c->status = -2;
  double deadline = now_s() + 20;
  while (log_count(c->driver, ") opened") < 1) {
    if (now_s() > deadline) return NULL;
    sleep_ms(20);
  }
  sleep_ms(c->delay_ms);
  c->status = IP("-n", ns_name[NS_BRIDGE], "link", "set", ns_tag[NS_EXEC1], "down");
  c->at = now_s();
  return NULL;
}

#define CUT_NAP_MS "800" /* per map task: 16 tasks on 2 slots, about 7 s without faults */

static void test_host_cut_off(void **state) {
  (void)state;
  if (!make_network()) skip();
  run_result *ref = FLINT(NULL, "submit", "--master", "local[2]", bin_file("job_slow_sums.so"), "0");
  expect_status(ref, 0);

  snprintf(fx.host, sizeof fx.host, "%s", ns_addr[NS_DRIVER]);
  snprintf(fx.netns, sizeof fx.netns, "%s", ns_name[NS_DRIVER]);
  proc *driver = start_driver((const char *const[]){FAST_TIMEOUT, NULL});
  const char *fetch_timeout[] = {"FLINT_FETCH_TIMEOUT_MS=3000", NULL};
  snprintf(fx.netns, sizeof fx.netns, "%s", ns_name[NS_EXEC1]);
  snprintf(fx.exec_host, sizeof fx.exec_host, "%s", ns_addr[NS_EXEC1]);
  proc *e1 = start_executor("exec1", fetch_timeout);
  wait_registered(driver, 1); /* exec1 is executor 1 */
  snprintf(fx.netns, sizeof fx.netns, "%s", ns_name[NS_EXEC2]);
  snprintf(fx.exec_host, sizeof fx.exec_host, "%s", ns_addr[NS_EXEC2]);
  start_executor("exec2", fetch_timeout);
  wait_registered(driver, 2);

  /* The client runs on the driver's host. */
  snprintf(fx.netns, sizeof fx.netns, "%s", ns_name[NS_DRIVER]);
  cut_thread cut = {.driver = driver, .delay_ms = 1200};
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, cut_link, &cut), 0);
  run_result *r = FLINT(NULL, "submit", "--master", fx.master, bin_file("job_slow_sums.so"), CUT_NAP_MS);
  assert_int_equal(pthread_join(thread, NULL), 0);
  if (cut.status != 0) fprintf(stderr, "the cut: status %d (-2: the job never opened)\n", cut.status);
  assert_int_equal(cut.status, 0);
  fprintf(stderr, "a host cut off: the job took %.1f s, %.1f s after the cut\n", r->seconds,
          now_s() - cut.at);
  expect_status(r, 0);
  if (strcmp(ref->out, r->out) != 0) {
    fprintf(stderr, "results differ from local[2]\n--- want ---\n%s", ref->out);
    dump(r);
  }
  assert_string_equal(ref->out, r->out);
  /* The driver saw exec1's loss, by its address in exec1's namespace, and no other. */
  char at[48];
  snprintf(at, sizeof at, "executor 1 at %s:", ns_addr[NS_EXEC1]);
  wait_log_count(driver, " lost: ", 1, LOSS_LIMIT_S);
  assert_true(log_has_line(driver, at, " lost: "));
  assert_int_equal(log_count(driver, " lost: "), 1);

  kill9(e1); /* cut off from the driver, it cannot stop cleanly */
  stop_all();
  free(r);
  free(ref);
  fx.passed = true;
}

int main(void) {
  find_binaries((const char *const[]){"iterative.so", "job_slow_sums.so", NULL});
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_exit_during_map_stage, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_kill_before_reduce_fetches, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_kill_between_iterations, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_speculation_on_a_slow_executor, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_all_executors_lost, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_outlives_executors, harness_setup, harness_teardown),
      cmocka_unit_test_setup_teardown(test_host_cut_off, netns_setup, netns_teardown),
  };
  /* TEST_FILTER=test_name (a glob) runs only the matching tests. */
  const char *filter = getenv("TEST_FILTER");
  if (filter && *filter) cmocka_set_test_filter(filter);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
