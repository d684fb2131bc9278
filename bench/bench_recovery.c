/*
 * bench_recovery: what losing an executor and having a slow one cost a job in cluster mode,
 * each against a baseline measured in the same run (issue 5).
 *
 *   bench_recovery [--json] [--runs N] [--skip ROW]...
 *
 * Every cluster here is started by the benchmark itself: `flint driver` on 127.0.0.1 (a port
 * picked by the system) and `flint executor` processes of 1 core and 512 MB each, found next
 * to this program (or at FLINT_EXECUTABLE), each with its own environment and its log in a
 * temporary folder; the program connects with fl_context_open("flint://..."). That is how one
 * executor can be slow (fault injection is read per process) and how the program knows the
 * pid to kill and when the driver noticed. The children inherit the environment without
 * FLINT_FAULT_*, FLINT_SPECULATION*, FLINT_LOCALITY_WAIT_MS, FLINT_NODE_OFFERS and FLINT_LOG, which the
 * benchmark sets itself where it needs them. Starting and stopping clusters is outside every
 * timing. The user functions live in the shared library bench_recovery_fns.
 *
 * The work. A dataset of P partitions is fl_range(0, P) in P partitions (partition p holds
 * the record p) flat-mapped by brf_generate into RECORDS (65,536) uint64 records per
 * partition, record j of partition p being ROUNDS (384) dependent splitmix64 rounds of
 * p * RECORDS + j: a fixed cost per record (about 100 ms per partition here), the same for
 * every partition. An iteration is one fl_aggregate over the records with the iteration
 * number i as argument, giving (count, sum of splitmix64(x ^ i * C)): cheap next to making
 * the records, and a different answer for every iteration.
 *
 * 1. recovery: an iterative job on a cached dataset; one executor killed (SIGKILL) between
 *    two iterations. P = 16, two executors, the driver started with FLINT_LOCALITY_WAIT_MS
 *    = 1000 and FLINT_NODE_OFFERS=0 so that every task over the cached data runs where its
 *    partition is cached (the probe below relies on that). One run is two clusters, started one after the other:
 *      fault-free: the dataset is cached (fl_cache) and materialised by an untimed iteration
 *        0; a probe job (fl_map_partitions over the cached dataset, each task returning its
 *        partition, its record count and getpid()) tells which executor caches which
 *        partition; then ITERATIONS (10) iterations 1..10 are timed together: T0.
 *      faulty: the same, but right after iteration KILL_AFTER (4) ends the second executor
 *        is killed with SIGKILL (and reaped) inside the timed span: T1. Its cached
 *        partitions (the probe's, L of them, about P/2) are lost; the driver finds the loss
 *        when it next calls the dead executor (the launch of iteration 5) or by its liveness
 *        pings, forgets the blocks, and iteration 5 recomputes the L partitions from their
 *        lineage on the surviving executor while it reads the others from its cache;
 *        iterations 6..10 then run on the one executor left.
 *      R, in the same faulty cluster after iteration 10: the time of a job that computes
 *        exactly the lost partitions from their lineage and nothing else: fl_parallelize of
 *        the L lost partition numbers in L partitions, flat-mapped by the same brf_generate,
 *        counted, on the surviving executor (the only one left, as during the recovery).
 *    Reported: extra = T1 - T0, R, and ratio = extra / R (target <= 1.5). extra contains
 *    the detection of the loss, the recomputation (about R), caching the recomputed blocks,
 *    and iterations 5..10 on one executor instead of two (each a few ms here). Also
 *    reported, to read the ratio: detect_ms, from the kill (CLOCK_REALTIME) to the time
 *    stamp of the driver's "executor ... lost" log line (millisecond stamps); the time of
 *    iteration 5 in the faulty run (recovery_iteration_s) against the mean fault-free
 *    iteration (iteration_s); L. The iterations' answers (count and sum of each of the 11
 *    iterations) must be the same in both clusters and in every run, every count P x
 *    RECORDS, and R's count L x RECORDS; if not, exit 1. Each of --runs runs (default 3)
 *    gives a ratio; the figures printed are those of the run with the median ratio (the
 *    lower median for an even count), with the smallest and largest ratio.
 *
 * 2. speculation: one executor 5x slower. A job of P = 12 partitions (not cached: each job
 *    makes its records again) with one iteration's aggregate as its action, run JOBS (3)
 *    times with iterations 1..3, timed together. One run is three clusters, one after the
 *    other:
 *      baseline:       2 executors, the driver with FLINT_SPECULATION=1: B;
 *      speculation:    the same 2 plus a third with FLINT_FAULT_SLOWDOWN=5 (every task of it
 *                      takes 5x as long; it sleeps 4x its run time after each task), the
 *                      driver with FLINT_SPECULATION=1: S;
 *      no_speculation: as speculation, with FLINT_SPECULATION=0: N (a reference: what a
 *                      slow executor costs without backup copies).
 *    Before the timed jobs each cluster runs one untimed small job (the library ships to the
 *    executors). The other speculation settings are the driver's defaults. Reported: B, S,
 *    N, ratio = S / B (target <= 1.3) and N / B for reference. The three executors share
 *    this 2-core machine, but the slow one sleeps 4/5 of its time, so it takes about a fifth
 *    of a core from the others. The answers of the 3 jobs must be the same in the three
 *    clusters and every run, each count P x RECORDS; if not, exit 1. Figures: the run with
 *    the median ratio, as in row 1. A driver that does not know FLINT_SPECULATION ignores
 *    it, and the row then measures a slow executor without speculation in both columns.
 *
 * 3. offers: node-shared tasks (executor/storage/claim_table.c) against one slow executor. P = 16
 *    partitions of records, cached on 2 executors (8 each: the driver's slots place the
 *    caching job evenly), then OFFER_ITERATIONS (10) timed iterations of an aggregate that
 *    puts each record through OFFER_ROUNDS (32) more splitmix rounds (about 4 ms a partition
 *    here), with the locality wait at 1 s so that the driver places every task on the
 *    executor caching its partition. One run is three clusters:
 *      baseline: both executors alike: B;
 *      offers:   the second with FLINT_FAULT_SLOWDOWN=3, node-shared offers on (the default):
 *                the fast executor takes the slow one's queued tasks: O;
 *      no_offers: the same with FLINT_NODE_OFFERS=0: every task runs on its holder: N.
 *    Reported: B, O, N, O / B and N / B. There is no target (issue 6 names none); for
 *    reading: the two executors then do 1 + 1/3 of the baseline's work a unit of time, so a
 *    perfect split takes 1.5 B, and tasks bound to their holders 3 B.
 *
 * Output: a table on stdout, or with --json one JSON object per row (the same figures) and
 * nothing else on stdout. --skip ROW (recovery, speculation or offers; may be repeated) leaves a row
 * out. Exit status: 0 when the rows ran and their results are right (a missed target is
 * reported, not an error); 1 on an engine error, a cluster that would not start, or a wrong
 * result (the cluster's folder with its logs is then kept and named on stderr); 2 on a bad
 * option.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flint/cluster.h"
#include "flint/flint.h"

#define BENCH_NAME "bench_recovery"
#include "bench_util.h"

#define RECORDS 65536 /* per partition */
#define ROUNDS 384    /* splitmix64 rounds per record */
#define EXECUTOR_MEMORY "512m"
#define MAX_EXECUTORS 3
#define START_LIMIT_S 20.0
#define STOP_LIMIT_S 10.0

#define REC_PARTITIONS 16
#define ITERATIONS 10
#define KILL_AFTER 4
#define REC_TARGET 1.5

#define SPEC_PARTITIONS 12
#define JOBS 3
#define SLOWDOWN "5"
#define SPEC_TARGET 1.3

#define OFFER_PARTITIONS 16
#define OFFER_ITERATIONS 10
#define OFFER_ROUNDS 32
#define OFFER_SLOWDOWN "3"
_Static_assert(JOBS <= ITERATIONS + 1 && OFFER_ITERATIONS <= ITERATIONS + 1, "runs_summary.ref holds a row's answers");

/* ---- the functions of libbench_recovery_fns (bench_recovery_fns.c) -------------------- */

typedef struct brf_gen_args {
  uint64_t records, rounds;
} brf_gen_args;
typedef struct brf_figures {
  uint64_t count, sum;
} brf_figures;
typedef struct brf_probe {
  uint64_t partition, pid, records;
} brf_probe;
fl_status brf_generate(fl_bytes rec, fl_emitter *out, const void *arg);
fl_status brf_step(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg);
fl_status brf_heavy_step(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg);
fl_status brf_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status brf_probe_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);

/* ---- options ---------------------------------------------------------------------------- */

enum { ROW_RECOVERY, ROW_SPECULATION, ROW_OFFERS, NUM_ROWS };
static const char *const row_names[NUM_ROWS] = {"recovery", "speculation", "offers"};

typedef struct options {
  bool json;
  uint64_t runs;
  bool skip[NUM_ROWS];
} options;

/* ---- clusters of processes ---------------------------------------------------------------- */

typedef struct proc {
  pid_t pid; /* 0: not running */
  char log[PATH_MAX];
} proc;

typedef struct cluster {
  char dir[PATH_MAX - 64]; /* its folder: work folders, port file, logs */
  char target[64];    /* 127.0.0.1:PORT */
  char master[80];    /* flint://127.0.0.1:PORT */
  proc driver;
  proc executors[MAX_EXECUTORS];
  int num_executors;
  fl_context *ctx;
} cluster;

static char flint_path[PATH_MAX];
static char base_dir[PATH_MAX]; /* every cluster's folder is made in it */

/* The flint command: FLINT_EXECUTABLE, or `flint` next to this program. */
static int find_flint(void) {
  const char *env = getenv("FLINT_EXECUTABLE");
  if (env && *env) snprintf(flint_path, sizeof flint_path, "%s", env);
  else {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    snprintf(flint_path, sizeof flint_path, "%.*s/flint", (int)(sizeof flint_path - 8), self);
  }
  if (access(flint_path, X_OK) != 0) {
    fprintf(stderr, BENCH_NAME ": cannot run %s (set FLINT_EXECUTABLE)\n", flint_path);
    return -1;
  }
  return 0;
}

/* Variables of this process's environment that the children do not inherit: the benchmark
 * sets them itself where a row needs them. */
static bool inherited(const char *var) {
  static const char *const own[] = {"FLINT_FAULT_", "FLINT_SPECULATION", "FLINT_LOCALITY_WAIT_MS=", "FLINT_NODE_OFFERS=",
                                    "FLINT_LOG="};
  for (size_t i = 0; i < sizeof own / sizeof *own; i++)
    if (strncmp(var, own[i], strlen(own[i])) == 0) return false;
  return true;
}

/* Starts `flint ARGS...` (NULL-terminated) with this environment less the benchmark's own
 * variables plus `extra` ("NAME=VALUE"s, NULL-terminated, may be NULL), stdout and stderr
 * into `log`. The child dies with this program. Returns its pid, or -1. Everything the
 * child needs is built before fork: after fork a threaded process (gRPC's) may only make
 * async-signal-safe calls. */
static pid_t spawn(const char *const *args, const char *const *extra, const char *log) {
  extern char **environ;
  size_t n_env = 0, n_extra = 0, n_args = 0;
  while (environ[n_env]) n_env++;
  while (extra && extra[n_extra]) n_extra++;
  while (args[n_args]) n_args++;
  char **envp = calloc(n_env + n_extra + 1, sizeof *envp);
  char **argv = calloc(n_args + 2, sizeof *argv);
  pid_t pid = -1;
  int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (!envp || !argv || fd < 0) goto done;
  size_t k = 0;
  for (size_t i = 0; i < n_env; i++)
    if (inherited(environ[i])) envp[k++] = environ[i];
  for (size_t i = 0; i < n_extra; i++) envp[k++] = (char *)extra[i];
  argv[0] = flint_path;
  for (size_t i = 0; i < n_args; i++) argv[i + 1] = (char *)args[i];
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    execve(flint_path, argv, envp);
    _exit(127);
  }
done:
  if (fd >= 0) close(fd);
  free(argv);
  free(envp);
  return pid;
}

/* Waits at most limit_s for p to end; true when it did (or was not running). */
static bool proc_wait(proc *p, double limit_s) {
  double deadline = now_s() + limit_s;
  while (p->pid > 0) {
    pid_t r = waitpid(p->pid, NULL, WNOHANG);
    if (r == p->pid || (r < 0 && errno != EINTR)) p->pid = 0;
    else if (now_s() > deadline) return false;
    else usleep(5000);
  }
  return true;
}

/* Ends p: `sig`, then SIGKILL if it has not ended within STOP_LIMIT_S. */
static void proc_stop(proc *p, int sig) {
  if (p->pid <= 0) return;
  kill(p->pid, sig);
  if (!proc_wait(p, STOP_LIMIT_S)) {
    fprintf(stderr, BENCH_NAME ": pid %d did not end within %.0f s of signal %d; killed\n", (int)p->pid,
            STOP_LIMIT_S, sig);
    kill(p->pid, SIGKILL);
    proc_wait(p, STOP_LIMIT_S);
  }
}

/* The number of executors the driver lists, or -1. */
static int listed_executors(const char *master) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return -1;
  fl_status st = fl_print_status(master, f);
  fclose(f);
  int n = -1;
  if (st != FL_OK || sscanf(text, "executors: %d", &n) != 1) n = -1;
  free(text);
  return n;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Starts a driver (with `driver_env`) and `n` executors (executor i with the one variable
 * exec_env[i], or none when exec_env or exec_env[i] is NULL) in a fresh folder named after
 * `name`, waits until the driver lists them all and opens a context on it. */
static int cluster_start(cluster *c, const char *name, const char *const *driver_env, int n,
                         const char *const *exec_env) {
  memset(c, 0, sizeof *c);
  char work[PATH_MAX + 32];
  snprintf(c->dir, sizeof c->dir, "%.*s/%s-XXXXXX", (int)(sizeof c->dir - 64), base_dir, name);
  if (!mkdtemp(c->dir)) {
    fprintf(stderr, BENCH_NAME ": cannot create a folder in %s: %s\n", base_dir, strerror(errno));
    return 1;
  }
  char port_file[PATH_MAX + 32];
  snprintf(port_file, sizeof port_file, "%s/driver.port", c->dir);
  snprintf(work, sizeof work, "%s/driver-work", c->dir);
  snprintf(c->driver.log, sizeof c->driver.log, "%s/driver.log", c->dir);
  if (mkdir(work, 0700) != 0 ||
      (c->driver.pid = spawn((const char *const[]){"driver", "--listen", "127.0.0.1:0", "--port-file", port_file,
                                                    "--work-dir", work, NULL},
                             driver_env, c->driver.log)) < 0) {
    fprintf(stderr, BENCH_NAME ": cannot start the driver: %s\n", strerror(errno));
    return 1;
  }
  double deadline = now_s() + START_LIMIT_S;
  int port = 0;
  while (!port) {
    FILE *f = fopen(port_file, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (port) break;
    if (proc_wait(&c->driver, 0) || now_s() > deadline) {
      fprintf(stderr, BENCH_NAME ": the driver did not start (its log: %s)\n", c->driver.log);
      return 1;
    }
    usleep(5000);
  }
  snprintf(c->target, sizeof c->target, "127.0.0.1:%d", port);
  snprintf(c->master, sizeof c->master, "flint://%s", c->target);
  for (int i = 0; i < n; i++) {
    proc *e = &c->executors[i];
    const char *const env[] = {exec_env ? exec_env[i] : NULL, NULL};
    snprintf(work, sizeof work, "%s/executor%d-work", c->dir, i + 1);
    snprintf(e->log, sizeof e->log, "%s/executor%d.log", c->dir, i + 1);
    if (mkdir(work, 0700) != 0 ||
        (e->pid = spawn((const char *const[]){"executor", "--driver", c->target, "--cores", "1", "--memory",
                                               EXECUTOR_MEMORY, "--work-dir", work, NULL},
                        env, e->log)) < 0) {
      fprintf(stderr, BENCH_NAME ": cannot start an executor: %s\n", strerror(errno));
      return 1;
    }
    c->num_executors++;
  }
  while (listed_executors(c->master) < n) {
    for (int i = 0; i < n; i++)
      if (proc_wait(&c->executors[i], 0)) {
        fprintf(stderr, BENCH_NAME ": an executor exited at start (its log: %s)\n", c->executors[i].log);
        return 1;
      }
    if (now_s() > deadline) {
      fprintf(stderr, BENCH_NAME ": %d executors did not register within %.0f s (logs in %s)\n", n,
              START_LIMIT_S, c->dir);
      return 1;
    }
    usleep(10000);
  }
  if (fl_context_open(c->master, NULL, &c->ctx) != FL_OK) {
    fail_flint("fl_context_open");
    return 1;
  }
  return 0;
}

/* Closes the context and stops the processes, executors first. `keep`: leave the folder
 * (with the logs) and say where it is. */
static void cluster_stop(cluster *c, bool keep) {
  fl_context_close(c->ctx);
  c->ctx = NULL;
  for (int i = 0; i < c->num_executors; i++)
    if (c->executors[i].pid > 0) kill(c->executors[i].pid, SIGTERM);
  for (int i = 0; i < c->num_executors; i++) proc_stop(&c->executors[i], SIGTERM);
  proc_stop(&c->driver, SIGTERM);
  if (!c->dir[0]) return;
  if (keep) fprintf(stderr, BENCH_NAME ": the cluster's logs are in %s\n", c->dir);
  else remove_tree(c->dir);
}

/* Milliseconds since local midnight of a CLOCK_REALTIME instant (the driver's log stamps). */
static double ms_of_day(const struct timespec *ts) {
  struct tm tm;
  localtime_r(&ts->tv_sec, &tm);
  return ((tm.tm_hour * 60.0 + tm.tm_min) * 60.0 + tm.tm_sec) * 1e3 + (double)ts->tv_nsec / 1e6;
}

/* The stamp (ms of the day) of the first line of `log` that contains `needle`; -1: none. */
static double log_stamp_ms(const char *log, const char *needle) {
  FILE *f = fopen(log, "r");
  if (!f) return -1;
  char line[2048];
  double ms = -1;
  while (ms < 0 && fgets(line, sizeof line, f)) {
    int h, m, s, milli;
    if (strstr(line, needle) && sscanf(line, "%d:%d:%d.%d", &h, &m, &s, &milli) == 4)
      ms = ((h * 60.0 + m) * 60.0 + s) * 1e3 + milli;
  }
  fclose(f);
  return ms;
}

/* ---- the work ---------------------------------------------------------------------------- */

static const brf_gen_args gen_args = {RECORDS, ROUNDS};

/* fl_range(0, partitions) in `partitions` partitions, flat-mapped by brf_generate. */
static int make_records(fl_context *ctx, uint32_t partitions, fl_dataset **src, fl_dataset **records) {
  if (fl_range(ctx, 0, partitions, 1, partitions, src) != FL_OK ||
      fl_flat_map(*src, brf_generate, &gen_args, sizeof gen_args, records) != FL_OK) {
    fail_flint("fl_range/fl_flat_map");
    return 1;
  }
  return 0;
}

/* One iteration: the aggregate with argument `iter`; its count must be `expect`. */
static int iterate(fl_dataset *ds, uint64_t iter, uint64_t expect, brf_figures *out) {
  brf_figures zero = {0, 0};
  fl_buf res = FL_BUF_INIT;
  int rc = 1;
  if (fl_aggregate(ds, fl_bytes_of(&zero, sizeof zero), brf_step, brf_merge, &iter, sizeof iter, &res) != FL_OK)
    fail_flint("fl_aggregate (an iteration)");
  else if (res.len != sizeof *out)
    fprintf(stderr, BENCH_NAME ": an iteration returned %zu bytes, expected %zu\n", res.len, sizeof *out);
  else {
    memcpy(out, res.data, sizeof *out);
    if (out->count == expect) rc = 0;
    else fprintf(stderr, BENCH_NAME ": iteration %" PRIu64 " counted %" PRIu64 " records, expected %" PRIu64 "\n",
                 iter, out->count, expect);
  }
  fl_buf_free(&res);
  return rc;
}

/* The run with the median ratio among n (the lower median for an even n, the earlier run
 * among equals), and the smallest and largest ratio. */
static size_t median_run(const double *ratio, size_t n, double *min, double *max) {
  size_t median = 0;
  *min = *max = ratio[0];
  for (size_t i = 0; i < n; i++) {
    size_t rank = 0;
    for (size_t j = 0; j < n; j++) rank += ratio[j] < ratio[i] || (ratio[j] == ratio[i] && j < i);
    if (rank == (n - 1) / 2) median = i;
    if (ratio[i] < *min) *min = ratio[i];
    if (ratio[i] > *max) *max = ratio[i];
  }
  return median;
}

/* What a row keeps over its runs: the answers of its first cluster (every later one must
 * give the same), and which run has the median ratio. */
typedef struct runs_summary {
  int runs;
  size_t median;
  double ratio_min, ratio_max;
  bool equal, met;
  bool have;
  brf_figures ref[ITERATIONS + 1];
} runs_summary;

/* A cluster's answers: the first set them, the others must equal them. */
static void summary_check(runs_summary *s, const brf_figures *got, size_t n) {
  if (!s->have) memcpy(s->ref, got, n * sizeof *got);
  else if (memcmp(s->ref, got, n * sizeof *got) != 0) s->equal = false;
  s->have = true;
}

/* One run of a row: fills `run` (the row's own run record), checks its clusters' answers
 * through s and sets *ratio. */
typedef int (*row_run_fn)(runs_summary *s, void *run, double *ratio);

/* --runs runs of a row into runs[] (records of run_size bytes); the summary says which run
 * has the median ratio and whether it meets `target` (ratio <= target). */
static int row_runs(const options *o, row_run_fn fn, void *runs, size_t run_size, double target, runs_summary *s) {
  memset(s, 0, sizeof *s);
  s->runs = (int)o->runs;
  s->equal = true;
  double *ratios = calloc(o->runs, sizeof *ratios);
  int rc = 1;
  if (!ratios) goto done;
  for (uint64_t r = 0; r < o->runs; r++)
    if (fn(s, (char *)runs + r * run_size, &ratios[r]) != 0) goto done;
  s->median = median_run(ratios, o->runs, &s->ratio_min, &s->ratio_max);
  s->met = ratios[s->median] <= target;
  rc = 0;
done:
  free(ratios);
  return rc;
}

/* ---- recovery ---------------------------------------------------------------------------- */

typedef struct recovery_run {
  double t0_s, t1_s, extra_s, recompute_s, ratio;
  double detect_ms;           /* -1: the driver's log has no loss line */
  double iteration_s;         /* fault-free: mean of iterations 1..ITERATIONS */
  double recovery_iteration_s; /* faulty: iteration KILL_AFTER + 1 */
  uint32_t lost;
} recovery_run;

typedef struct recovery_result {
  runs_summary s;
  recovery_run median;
} recovery_result;

/* Which executor (index into c->executors) read each partition of the cached dataset; the
 * caller's `victim` partitions go into lost[], their number into *num_lost. */
static int probe_partitions(cluster *c, fl_dataset *cached, int victim, int64_t *lost, uint32_t *num_lost) {
  fl_dataset *probes = NULL;
  fl_records *got = NULL;
  int rc = 1;
  bool seen[REC_PARTITIONS] = {false};
  *num_lost = 0;
  if (fl_map_partitions(cached, brf_probe_partition, NULL, 0, &probes) != FL_OK || fl_collect(probes, &got) != FL_OK) {
    fail_flint("the probe job (fl_map_partitions/fl_collect)");
    goto done;
  }
  if (fl_records_count(got) != REC_PARTITIONS) {
    fprintf(stderr, BENCH_NAME ": the probe returned %zu records, expected %d\n", fl_records_count(got), REC_PARTITIONS);
    goto done;
  }
  for (size_t i = 0; i < REC_PARTITIONS; i++) {
    brf_probe p;
    fl_bytes r = fl_records_get(got, i);
    if (r.len != sizeof p) goto done;
    memcpy(&p, r.data, sizeof p);
    int holder = -1;
    for (int e = 0; e < c->num_executors; e++)
      if ((uint64_t)c->executors[e].pid == p.pid) holder = e;
    if (p.partition >= REC_PARTITIONS || seen[p.partition] || p.records != RECORDS || holder < 0) {
      fprintf(stderr, BENCH_NAME ": probe of partition %" PRIu64 ": %" PRIu64 " records in process %" PRIu64
              ", not one of the executors or seen twice\n", p.partition, p.records, p.pid);
      goto done;
    }
    seen[p.partition] = true;
    if (holder == victim) lost[(*num_lost)++] = (int64_t)p.partition;
  }
  if (*num_lost == 0 || *num_lost == REC_PARTITIONS) {
    fprintf(stderr, BENCH_NAME ": executor %d caches %u of %d partitions: nothing to compare\n", victim + 1,
            *num_lost, REC_PARTITIONS);
    goto done;
  }
  rc = 0;
done:
  fl_records_free(got);
  fl_dataset_free(probes);
  return rc;
}

/* The time of a job that computes exactly the `n` partitions lost[] of the records, from their
 * lineage, on whatever executors c has left. */
static int recompute_alone(cluster *c, const int64_t *lost, uint32_t n, double *secs) {
  fl_bytes recs[REC_PARTITIONS];
  fl_dataset *src = NULL, *records = NULL;
  uint64_t count = 0;
  int rc = 1;
  for (uint32_t i = 0; i < n; i++) recs[i] = fl_bytes_of(&lost[i], sizeof lost[i]);
  double t0 = now_s();
  if (fl_parallelize(c->ctx, recs, n, n, &src) != FL_OK ||
      fl_flat_map(src, brf_generate, &gen_args, sizeof gen_args, &records) != FL_OK ||
      fl_count(records, &count) != FL_OK) {
    fail_flint("the recompute job (fl_parallelize/fl_flat_map/fl_count)");
    goto done;
  }
  *secs = now_s() - t0;
  if (count != (uint64_t)n * RECORDS) {
    fprintf(stderr, BENCH_NAME ": the recompute job counted %" PRIu64 " records, expected %" PRIu64 "\n", count,
            (uint64_t)n * RECORDS);
    goto done;
  }
  rc = 0;
done:
  fl_dataset_free(records);
  fl_dataset_free(src);
  return rc;
}

/* One cluster of row 1: iterations 0..ITERATIONS over the cached records, the second
 * executor killed after iteration KILL_AFTER when `faulty`. Sets the run's figures for its
 * side and answers[0..ITERATIONS]. */
static int recovery_side(bool faulty, recovery_run *run, brf_figures answers[ITERATIONS + 1]) {
  /* Tasks over the cached data stay where it is cached: no waiting for another executor, and
   * no node-shared offers (the other executor on this host could take them). */
  static const char *const driver_env[] = {"FLINT_LOCALITY_WAIT_MS=1000", "FLINT_NODE_OFFERS=0", NULL};
  cluster c;
  fl_dataset *src = NULL, *records = NULL;
  int64_t lost[REC_PARTITIONS];
  uint32_t num_lost = 0;
  const int victim = 1;
  const uint64_t expect = (uint64_t)REC_PARTITIONS * RECORDS;
  int rc = 1;
  if (cluster_start(&c, faulty ? "faulty" : "fault-free", driver_env, 2, NULL) != 0) goto done;
  if (make_records(c.ctx, REC_PARTITIONS, &src, &records) != 0) goto done;
  if (fl_cache(records) != FL_OK) {
    fail_flint("fl_cache");
    goto done;
  }
  if (iterate(records, 0, expect, &answers[0]) != 0) goto done; /* materialises the cache */
  if (probe_partitions(&c, records, victim, lost, &num_lost) != 0) goto done;
  struct timespec killed_at = {0, 0};
  double iter_s[ITERATIONS + 1];
  double start = now_s();
  for (uint64_t i = 1; i <= ITERATIONS; i++) {
    double t = now_s();
    if (iterate(records, i, expect, &answers[i]) != 0) goto done;
    iter_s[i] = now_s() - t;
    if (faulty && i == KILL_AFTER) {
      clock_gettime(CLOCK_REALTIME, &killed_at);
      kill(c.executors[victim].pid, SIGKILL);
      proc_wait(&c.executors[victim], STOP_LIMIT_S);
    }
  }
  double total = now_s() - start;
  if (!faulty) {
    run->t0_s = total;
    run->iteration_s = total / ITERATIONS;
  } else {
    run->t1_s = total;
    run->lost = num_lost;
    run->recovery_iteration_s = iter_s[KILL_AFTER + 1];
    if (recompute_alone(&c, lost, num_lost, &run->recompute_s) != 0) goto done;
    double seen = log_stamp_ms(c.driver.log, " lost: ");
    run->detect_ms = seen < 0 ? -1 : seen - ms_of_day(&killed_at);
    if (run->detect_ms < -12 * 3600e3) run->detect_ms += 24 * 3600e3; /* midnight passed */
  }
  rc = 0;
done:
  fl_dataset_free(records);
  fl_dataset_free(src);
  cluster_stop(&c, rc != 0);
  return rc;
}

/* One run of row 1: the fault-free cluster, then the faulty one. */
static int recovery_one(runs_summary *s, void *p, double *ratio) {
  recovery_run *run = p;
  brf_figures got[ITERATIONS + 1];
  for (int faulty = 0; faulty < 2; faulty++) {
    if (recovery_side(faulty, run, got) != 0) return 1;
    summary_check(s, got, ITERATIONS + 1);
  }
  run->extra_s = run->t1_s - run->t0_s;
  *ratio = run->ratio = run->extra_s / run->recompute_s;
  return 0;
}

static int bench_recovery(const options *o, recovery_result *res) {
  recovery_run *runs = calloc(o->runs, sizeof *runs);
  int rc = runs ? row_runs(o, recovery_one, runs, sizeof *runs, REC_TARGET, &res->s) : 1;
  if (rc == 0) res->median = runs[res->s.median];
  free(runs);
  return rc;
}

/* ---- speculation --------------------------------------------------------------------------- */

/* Rows 2 and 3 each run three clusters: a baseline, the feature on, the feature off. */
enum { TRIO_BASELINE, TRIO_ON, TRIO_OFF, TRIO_CONFIGS };

typedef struct trio_run {
  double secs[TRIO_CONFIGS];
  double ratio, ratio_off; /* on / baseline, off / baseline */
} trio_run;

typedef struct trio_result {
  runs_summary s;
  trio_run median;
} trio_result;

/* One cluster of a row: times its work into *secs and its answers into answers[]. */
typedef int (*trio_side_fn)(int config, double *secs, brf_figures *answers);

/* One run of a row: its three clusters, each giving `answers` answers. */
static int trio_one(runs_summary *s, trio_run *run, trio_side_fn side, size_t answers, double *ratio) {
  brf_figures got[ITERATIONS + 1];
  for (int k = 0; k < TRIO_CONFIGS; k++) {
    if (side(k, &run->secs[k], got) != 0) return 1;
    summary_check(s, got, answers);
  }
  *ratio = run->ratio = run->secs[TRIO_ON] / run->secs[TRIO_BASELINE];
  run->ratio_off = run->secs[TRIO_OFF] / run->secs[TRIO_BASELINE];
  return 0;
}

static int trio_runs(const options *o, row_run_fn one, double target, trio_result *res) {
  trio_run *runs = calloc(o->runs, sizeof *runs);
  int rc = runs ? row_runs(o, one, runs, sizeof *runs, target, &res->s) : 1;
  if (rc == 0) res->median = runs[res->s.median];
  free(runs);
  return rc;
}

/* One cluster of row 2: an untimed small job, then JOBS timed jobs of SPEC_PARTITIONS tasks. */
static int spec_side(int config, double *secs, brf_figures answers[JOBS]) {
  static const char *const on[] = {"FLINT_SPECULATION=1", NULL}, *const off[] = {"FLINT_SPECULATION=0", NULL};
  static const char *const slow[] = {"FLINT_FAULT_SLOWDOWN=" SLOWDOWN, NULL, NULL};
  static const char *const names[TRIO_CONFIGS] = {"baseline", "speculation", "no-speculation"};
  cluster c;
  fl_dataset *src = NULL, *records = NULL;
  int rc = 1;
  bool with_slow = config != TRIO_BASELINE;
  if (cluster_start(&c, names[config], config == TRIO_OFF ? off : on, with_slow ? 3 : 2, with_slow ? slow : NULL) != 0)
    goto done;
  uint64_t n = 0;
  if (fl_range(c.ctx, 0, 3, 1, 3, &src) != FL_OK || fl_count(src, &n) != FL_OK || n != 3) {
    fail_flint("the warm-up job");
    goto done;
  }
  fl_dataset_free(src);
  src = NULL;
  double t0 = now_s();
  for (uint64_t j = 0; j < JOBS; j++) {
    if (make_records(c.ctx, SPEC_PARTITIONS, &src, &records) != 0 ||
        iterate(records, j + 1, (uint64_t)SPEC_PARTITIONS * RECORDS, &answers[j]) != 0)
      goto done;
    fl_dataset_free(records);
    fl_dataset_free(src);
    records = src = NULL;
  }
  *secs = now_s() - t0;
  rc = 0;
done:
  fl_dataset_free(records);
  fl_dataset_free(src);
  cluster_stop(&c, rc != 0);
  return rc;
}

static int spec_one(runs_summary *s, void *run, double *ratio) { return trio_one(s, run, spec_side, JOBS, ratio); }

/* ---- node-shared offers ------------------------------------------------------------------ */

/* One heavy iteration (brf_heavy_step) over the cached records. */
static int heavy_iterate(fl_dataset *ds, uint64_t iter, brf_figures *out) {
  brf_figures zero = {0, 0};
  uint64_t arg[2] = {iter, OFFER_ROUNDS};
  fl_buf res = FL_BUF_INIT;
  int rc = 1;
  if (fl_aggregate(ds, fl_bytes_of(&zero, sizeof zero), brf_heavy_step, brf_merge, arg, sizeof arg, &res) != FL_OK)
    fail_flint("fl_aggregate (a heavy iteration)");
  else if (res.len != sizeof *out)
    fprintf(stderr, BENCH_NAME ": an iteration returned %zu bytes, expected %zu\n", res.len, sizeof *out);
  else {
    memcpy(out, res.data, sizeof *out);
    if (out->count == (uint64_t)OFFER_PARTITIONS * RECORDS) rc = 0;
    else fprintf(stderr, BENCH_NAME ": iteration %" PRIu64 " counted %" PRIu64 " records\n", iter, out->count);
  }
  fl_buf_free(&res);
  return rc;
}

/* One cluster of row 3: the records cached on 2 executors (half each, by the driver's slots),
 * the second FLINT_FAULT_SLOWDOWN times slower except in the baseline; then
 * OFFER_ITERATIONS timed iterations over the cache. */
static int offer_side(int config, double *secs, brf_figures answers[OFFER_ITERATIONS]) {
  static const char *const on[] = {"FLINT_LOCALITY_WAIT_MS=1000", NULL},
                           *const off[] = {"FLINT_LOCALITY_WAIT_MS=1000", "FLINT_NODE_OFFERS=0", NULL};
  static const char *const slow[] = {NULL, "FLINT_FAULT_SLOWDOWN=" OFFER_SLOWDOWN};
  static const char *const names[TRIO_CONFIGS] = {"offers-baseline", "offers-on", "offers-off"};
  cluster c;
  fl_dataset *src = NULL, *records = NULL;
  brf_figures warm;
  int rc = 1;
  if (cluster_start(&c, names[config], config == TRIO_OFF ? off : on, 2, config == TRIO_BASELINE ? NULL : slow) != 0)
    goto done;
  if (make_records(c.ctx, OFFER_PARTITIONS, &src, &records) != 0) goto done;
  if (fl_cache(records) != FL_OK) {
    fail_flint("fl_cache");
    goto done;
  }
  if (heavy_iterate(records, 0, &warm) != 0) goto done; /* caches the records */
  double t0 = now_s();
  for (uint64_t i = 0; i < OFFER_ITERATIONS; i++)
    if (heavy_iterate(records, i + 1, &answers[i]) != 0) goto done;
  *secs = now_s() - t0;
  rc = 0;
done:
  fl_dataset_free(records);
  fl_dataset_free(src);
  cluster_stop(&c, rc != 0);
  return rc;
}

static int offer_one(runs_summary *s, void *run, double *ratio) {
  return trio_one(s, run, offer_side, OFFER_ITERATIONS, ratio);
}

/* ---- output ------------------------------------------------------------------------------ */

static const bench_columns columns = {13, 30, 14, 10};

static void print_header(const options *o) {
  printf("flint bench_recovery (flint %s): clusters of 1-core executors started by the benchmark, "
         "%d records x %d splitmix rounds per partition; median run of %" PRIu64 " by ratio\n",
         FL_VERSION_STRING, RECORDS, ROUNDS, o->runs);
  if (!o->skip[ROW_RECOVERY])
    printf("  recovery: %d cached partitions on 2 executors, iterations 1..%d timed, executor 2 killed (SIGKILL) "
           "after iteration %d;\n    extra = faulty - fault-free; recompute = a job of the lost partitions alone "
           "on the survivor\n",
           REC_PARTITIONS, ITERATIONS, KILL_AFTER);
  if (!o->skip[ROW_SPECULATION])
    printf("  speculation: %d jobs of %d uncached partitions; baseline 2 executors; then + a 3rd with "
           "FLINT_FAULT_SLOWDOWN=%s, FLINT_SPECULATION=1 (and =0 for reference)\n",
           JOBS, SPEC_PARTITIONS, SLOWDOWN);
  if (!o->skip[ROW_OFFERS])
    printf("  offers: %d iterations over %d cached partitions on 2 executors; baseline both alike; then the 2nd "
           "with FLINT_FAULT_SLOWDOWN=%s,\n    node-shared offers on (and FLINT_NODE_OFFERS=0 for reference); "
           "a perfect split would take 1.5x the baseline\n",
           OFFER_ITERATIONS, OFFER_PARTITIONS, OFFER_SLOWDOWN);
  printf("\n");
  bench_print_row(&columns, "bench", "metric", "value", "target", "met");
  bench_print_row(&columns, "-------------", "------------------------------", "--------------", "----------",
                  "---");
}

static void print_recovery(const options *o, const recovery_result *r) {
  const recovery_run *m = &r->median;
  if (o->json) {
    printf("{\"bench\": \"recovery\", \"executors\": 2, \"partitions\": %d, \"records_per_partition\": %d"
           ", \"rounds\": %d, \"iterations\": %d, \"kill_after_iteration\": %d, \"runs\": %d, \"lost_partitions\": %u"
           ", \"fault_free_s\": %.4f, \"faulty_s\": %.4f, \"extra_s\": %.4f, \"recompute_s\": %.4f"
           ", \"ratio_extra_recompute\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f, \"detect_ms\": %.0f"
           ", \"iteration_s\": %.4f, \"recovery_iteration_s\": %.4f, \"results_equal\": %s"
           ", \"target\": \"ratio_extra_recompute <= %.1f\", \"met\": %s}\n",
           REC_PARTITIONS, RECORDS, ROUNDS, ITERATIONS, KILL_AFTER, r->s.runs, m->lost, m->t0_s, m->t1_s, m->extra_s,
           m->recompute_s, m->ratio, r->s.ratio_min, r->s.ratio_max, m->detect_ms, m->iteration_s,
           m->recovery_iteration_s, r->s.equal ? "true" : "false", REC_TARGET, r->s.met ? "true" : "false");
    return;
  }
  char v[64], t[32];
  snprintf(v, sizeof v, "%.3f", m->ratio);
  snprintf(t, sizeof t, "<= %.1f", REC_TARGET);
  bench_print_row(&columns, "recovery", "ratio extra/recompute", v, t, r->s.met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.3f / %.3f", r->s.ratio_min, r->s.ratio_max);
  bench_print_row(&columns, "", "ratio min / max", v, "", "");
  snprintf(v, sizeof v, "%.3f", m->extra_s);
  bench_print_row(&columns, "", "extra_s (faulty - fault-free)", v, "", "");
  snprintf(v, sizeof v, "%.3f", m->recompute_s);
  bench_print_row(&columns, "", "recompute_s (lost alone)", v, "", "");
  snprintf(v, sizeof v, "%.0f", m->detect_ms);
  bench_print_row(&columns, "", "detect_ms (kill -> driver log)", v, "", "");
  snprintf(v, sizeof v, "%.3f", m->t0_s);
  bench_print_row(&columns, "", "fault_free_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", m->t1_s);
  bench_print_row(&columns, "", "faulty_s", v, "", "");
  snprintf(v, sizeof v, "%.4f", m->iteration_s);
  bench_print_row(&columns, "", "iteration_s (fault-free mean)", v, "", "");
  snprintf(v, sizeof v, "%.3f", m->recovery_iteration_s);
  bench_print_row(&columns, "", "recovery_iteration_s", v, "", "");
  snprintf(v, sizeof v, "%u of %d", m->lost, REC_PARTITIONS);
  bench_print_row(&columns, "", "lost_partitions", v, "", "");
  bench_print_row(&columns, "", "answers (faulty = fault-free)", r->s.equal ? "equal" : "DIFFER", "", r->s.equal ? "" : "MISMATCH");
}

/* A three-cluster row as a table: its ratio (labels[0], with target and met), the spread of
 * the runs, the three times (labels[1..3]), the ratio without the feature (labels[4]) and
 * whether the answers agreed. */
static void print_trio_table(const trio_result *r, const char *bench, const char *const labels[5], const char *target,
                             const char *met) {
  const trio_run *m = &r->median;
  char v[64];
  snprintf(v, sizeof v, "%.3f", m->ratio);
  bench_print_row(&columns, bench, labels[0], v, target, met);
  snprintf(v, sizeof v, "%.3f / %.3f", r->s.ratio_min, r->s.ratio_max);
  bench_print_row(&columns, "", "ratio min / max", v, "", "");
  for (int k = 0; k < 3; k++) {
    snprintf(v, sizeof v, "%.3f", m->secs[k == 0 ? TRIO_BASELINE : k == 1 ? TRIO_ON : TRIO_OFF]);
    bench_print_row(&columns, "", labels[1 + k], v, "", "");
  }
  snprintf(v, sizeof v, "%.3f", m->ratio_off);
  bench_print_row(&columns, "", labels[4], v, "(ref)", "-");
  bench_print_row(&columns, "", "answers (3 clusters)", r->s.equal ? "equal" : "DIFFER", "", r->s.equal ? "" : "MISMATCH");
}

static void print_speculation(const options *o, const trio_result *r) {
  const trio_run *m = &r->median;
  if (o->json) {
    printf("{\"bench\": \"speculation\", \"partitions\": %d, \"records_per_partition\": %d, \"rounds\": %d"
           ", \"jobs\": %d, \"slowdown\": %s, \"runs\": %d, \"baseline_s\": %.4f, \"speculation_s\": %.4f"
           ", \"no_speculation_s\": %.4f, \"ratio_speculation_baseline\": %.3f, \"ratio_min\": %.3f"
           ", \"ratio_max\": %.3f, \"ratio_no_speculation_baseline\": %.3f, \"results_equal\": %s"
           ", \"target\": \"ratio_speculation_baseline <= %.1f\", \"met\": %s}\n",
           SPEC_PARTITIONS, RECORDS, ROUNDS, JOBS, SLOWDOWN, r->s.runs, m->secs[TRIO_BASELINE], m->secs[TRIO_ON],
           m->secs[TRIO_OFF], m->ratio, r->s.ratio_min, r->s.ratio_max, m->ratio_off, r->s.equal ? "true" : "false",
           SPEC_TARGET, r->s.met ? "true" : "false");
    return;
  }
  char t[32];
  snprintf(t, sizeof t, "<= %.1f", SPEC_TARGET);
  static const char *const labels[] = {"ratio speculation/baseline", "baseline_s (2 executors)",
                                       "speculation_s (+1 slow)", "no_speculation_s (+1 slow)",
                                       "ratio no_speculation/baseline"};
  print_trio_table(r, "speculation", labels, t, r->s.met ? "yes" : "NO");
}

static void print_offers(const options *o, const trio_result *r) {
  const trio_run *m = &r->median;
  if (o->json) {
    printf("{\"bench\": \"offers\", \"partitions\": %d, \"records_per_partition\": %d, \"rounds\": %d"
           ", \"iterations\": %d, \"slowdown\": %s, \"runs\": %d, \"baseline_s\": %.4f, \"offers_s\": %.4f"
           ", \"no_offers_s\": %.4f, \"ratio_offers_baseline\": %.3f, \"ratio_min\": %.3f, \"ratio_max\": %.3f"
           ", \"ratio_no_offers_baseline\": %.3f, \"results_equal\": %s, \"target\": \"none (reference)\"}\n",
           OFFER_PARTITIONS, RECORDS, OFFER_ROUNDS, OFFER_ITERATIONS, OFFER_SLOWDOWN, r->s.runs,
           m->secs[TRIO_BASELINE], m->secs[TRIO_ON], m->secs[TRIO_OFF], m->ratio, r->s.ratio_min, r->s.ratio_max,
           m->ratio_off, r->s.equal ? "true" : "false");
    return;
  }
  static const char *const labels[] = {"ratio offers/baseline", "baseline_s (2 alike)", "offers_s (one slow)",
                                       "no_offers_s (one slow)", "ratio no_offers/baseline"};
  print_trio_table(r, "offers", labels, "(ref)", "-");
}

static const char usage_text[] =
    "usage: bench_recovery [--json] [--runs N] [--skip ROW]...\n"
    "  --json        one JSON object per row instead of a table\n"
    "  --runs N      runs of each row (default 3); the run with the median ratio is printed\n"
    "  --skip ROW    leave out a row: recovery, speculation or offers\n"
    "  --help        this text\n";

int main(int argc, char **argv) {
  options o = {false, 3, {false, false, false}};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      o.json = true;
      continue;
    }
    if (strcmp(argv[i], "--skip") == 0) {
      int row = i + 1 < argc ? bench_row_index(row_names, NUM_ROWS, argv[i + 1]) : -1;
      if (row < 0) {
        fprintf(stderr, BENCH_NAME ": --skip needs a row name: recovery, speculation or offers\n%s", usage_text);
        return 2;
      }
      o.skip[row] = true;
      i++;
      continue;
    }
    if (strcmp(argv[i], "--runs") == 0) {
      if (i + 1 >= argc || !parse_count(argv[i + 1], 100, &o.runs)) {
        fprintf(stderr, BENCH_NAME ": --runs needs a whole number in 1..100\n%s", usage_text);
        return 2;
      }
      i++;
      continue;
    }
    fprintf(stderr, BENCH_NAME ": unknown option '%s'\n%s", argv[i], usage_text);
    return 2;
  }
  if (find_flint() != 0) return 1;
  const char *tmp = getenv("TMPDIR");
  snprintf(base_dir, sizeof base_dir, "%s/bench_recovery-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(base_dir)) {
    fprintf(stderr, BENCH_NAME ": cannot create a folder: %s\n", strerror(errno));
    return 1;
  }

  recovery_result rr;
  trio_result sr;
  trio_result orr;
  int rc = 0;
  if (!o.skip[ROW_RECOVERY] && bench_recovery(&o, &rr) != 0) rc = 1;
  if (rc == 0 && !o.skip[ROW_SPECULATION] && trio_runs(&o, spec_one, SPEC_TARGET, &sr) != 0) rc = 1;
  if (rc == 0 && !o.skip[ROW_OFFERS] && trio_runs(&o, offer_one, INFINITY, &orr) != 0) rc = 1;
  if (rc == 0) {
    if (!o.json) print_header(&o);
    if (!o.skip[ROW_RECOVERY]) print_recovery(&o, &rr);
    if (!o.skip[ROW_SPECULATION]) print_speculation(&o, &sr);
    if (!o.skip[ROW_OFFERS]) print_offers(&o, &orr);
    fflush(stdout);
    if ((!o.skip[ROW_RECOVERY] && !rr.s.equal) || (!o.skip[ROW_SPECULATION] && !sr.s.equal) ||
        (!o.skip[ROW_OFFERS] && !orr.s.equal)) {
      fprintf(stderr, BENCH_NAME ": the answers differ between clusters or runs\n");
      rc = 1;
    }
  }
  if (rc == 0) remove_tree(base_dir);
  else rmdir(base_dir); /* kept when a cluster's logs are in it */
  return rc;
}
