/*
 * bench_cluster: cluster mode (a driver and executor processes on this machine) against local
 * mode and plain TCP, through the public API only.
 *
 *   bench_cluster [--json] [--pairs N] [--runs N] [--skip ROW]...
 *
 * The cluster is local-cluster[2,1,1024]: fl_context_open starts a driver and 2 executor
 * processes (1 task thread and 1024 MB of cache each) on 127.0.0.1, and every action goes
 * client -> driver (gRPC) -> executors (batched task launches) and back. The user functions
 * live in the shared library bench_cluster_fns (cluster mode ships functions as (library,
 * symbol)); local[2] runs the same functions. Opening a context (process start-up) is
 * outside every timing.
 *
 * 1. count_cached_16: the fixed cost of one job. A 16-partition fl_range of 16,000 int64
 *    records is cached and materialised by a first count; after WARMUP_COUNTS more untimed
 *    counts, COUNTS (300) counts are timed one by one (CLOCK_MONOTONIC) and their p50 and p99
 *    (nearest rank), mean, min and max reported. Each count is one RunJob call to the
 *    driver, which launches the 16 tasks onto the executors caching their partitions (each
 *    executor has one slot, so 8 rounds of launch and status report per executor) and
 *    replies with the 16 counts. Target for the cluster: p50 <= 2 ms. The same row on
 *    local[2] is printed as a reference (no target).
 *
 * 2. reduce_by_key: bench_shuffle's aggregation through a shuffle, cluster against local.
 *    --pairs N pairs (default 10,000,000) are made from fl_range(0, N) in 2 partitions (as
 *    many as task threads in both modes) by a map giving record i the key splitmix64(i) %
 *    (N / 50) (a uint64, as 8 bytes) and the value i (int64); fl_reduce_by_key sums them per
 *    key (map-side combine, 2 reduce partitions) and one fl_aggregate computes the number of
 *    keys, the sum of the sums and a checksum. Timed: from building the datasets to the three
 *    figures. Each mode runs --runs times (default 3), alternating, each run with fresh
 *    datasets, and the best time of each is reported with records/s and the ratio cluster /
 *    local throughput (no target). The figures must be equal in every run of both modes and
 *    the sum must be N(N-1)/2 (wrapping); if not, exit 1.
 *
 * 3. broadcast_100MB: the cost of shipping a 100 MB (10^8 bytes, pseudo-random) broadcast to
 *    2 executors. One run: fl_broadcast_create of a tiny (8-byte) value, then a probe job
 *    (fl_range(0, 2) in 2 partitions mapped by a function that reads the broadcast with
 *    fl_broadcast_value and returns its length, its process id and a digest of samples of
 *    its bytes, collected); then the same with the 100 MB value; then the TCP baseline. The
 *    tiny run is the same job with no bytes to move, so big - tiny is the transfer:
 *      upload = create(100 MB) - create(tiny): the client copies the value into its own
 *               registry (it serves it from there) and registers it with the driver
 *               (BroadcastPut: its id, length and the client's block-server address; no
 *               bytes);
 *      fetch  = job(100 MB) - job(tiny): each executor's task fetches the value from the
 *               client's block server (data plane: one small request that tells the length,
 *               then 64 MiB ranges, sent from the client's memory by reference), both at once;
 *      transfer = upload + fetch, from fl_broadcast_create until both executors have read it.
 *    Each of the four timings is the best of --runs runs (default 3), so that transfer is
 *    best(create big) + best(job big) - best(create tiny) - best(job tiny); the median of
 *    the per-run transfers is printed too. Each probe job must return the right length and
 *    digest from two different executor processes (one task each), or the run fails.
 *    Baseline, in the same run: tcp_copy_2x100MB, the same bytes sent twice (one per
 *    executor) by one thread with blocking send() on a connected loopback socket and
 *    received by another with blocking recv() into pre-faulted buffers (as bench_dataplane
 *    does), timed from both threads ready to the last byte; best of --runs. Reported: MB/s
 *    (10^6 bytes/s) of bytes delivered, 2 x 100 MB, for the broadcast's transfer (the ratio's
 *    numerator) and for TCP (its denominator), ratio broadcast / tcp (target >= 0.7), and
 *    the breakdown: upload MB/s (100 MB / upload) and fetch MB/s (200 MB / fetch), each with
 *    its own ratio to TCP for reference. Also printed, for reading those: first_touch MB/s,
 *    a memset of a freshly allocated 100 MB buffer (best of --runs): the page-fault cost that
 *    every copy of the value into new memory pays (the TCP baseline's buffers are
 *    pre-faulted, as in bench_dataplane). Executors never drop a fetched broadcast before
 *    their application ends, so the executors' resident memory after the row is printed.
 *
 * 4. ui_overhead: what the web UI costs the scheduler (issue 36). Row 1's cluster count p50
 *    with the driver's UI off (FLINT_UI=0) and on (FLINT_UI=1) while a client thread polls
 *    its REST API every 100 ms (the application's jobs, stages and executors, one HTTP/1.0
 *    GET each), back to back, --runs pairs alternating; the median p50 of each and their
 *    ratio, on / off (target <= 1.05). The UI is on by default, so row 1 runs with it too.
 *
 * Output: a table on stdout, or with --json one JSON object per row (the same figures) and
 * nothing else on stdout. --skip ROW (count_cached_16, reduce_by_key, broadcast_100MB or
 * ui_overhead; may be repeated) leaves a row out. Exit status: 0 when the rows ran and their results are
 * right (a missed target is reported, not an error); 1 on an engine error or a wrong
 * result; 2 on a bad option.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "flint/flint.h"

#define BENCH_NAME "bench_cluster"
#include "bench_util.h"

#define CLUSTER "local-cluster[2,1,1024]"
#define LOCAL "local[2]"
#define EXECUTORS 2

#define COUNT_RECORDS 16000
#define COUNT_PARTITIONS 16
#define WARMUP_COUNTS 30
#define COUNTS 300
#define COUNT_TARGET_P50_MS 2.0

#define RBK_PARTITIONS 2
#define RBK_KEYS_DIVISOR 50

#define BCAST_BYTES 100000000ull /* 100 MB */
#define BCAST_TINY_BYTES 8
#define BCAST_TARGET_RATIO 0.7

#define MIB (1024.0 * 1024.0)

/* ---- the functions of libbench_cluster_fns (bench_cluster_fns.c) ---------------------- */

typedef struct bcf_figures {
  uint64_t keys, sum, checksum;
} bcf_figures;
typedef struct bcf_probe {
  uint64_t len, pid, digest;
} bcf_probe;
fl_status bcf_make_pair(fl_bytes rec, fl_buf *out, const void *arg);
fl_status bcf_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status bcf_fold(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg);
fl_status bcf_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status bcf_broadcast_probe(fl_bytes rec, fl_buf *out, const void *arg);
uint64_t bcf_sample_digest(const uint8_t *data, size_t len);

/* ---- options ---------------------------------------------------------------------------- */

enum { ROW_COUNT, ROW_RBK, ROW_BCAST, ROW_UI, NUM_ROWS };
static const char *const row_names[NUM_ROWS] = {"count_cached_16", "reduce_by_key", "broadcast_100MB", "ui_overhead"};

typedef struct options {
  bool json;
  uint64_t pairs, runs;
  bool skip[NUM_ROWS];
} options;

/* The value at quantile q (0..1) of sorted samples, nearest rank. */
static double quantile(const double *sorted, size_t n, double q) {
  size_t rank = (size_t)(q * (double)n + 0.999999999);
  if (rank < 1) rank = 1;
  if (rank > n) rank = n;
  return sorted[rank - 1];
}

/* ---- count_cached_16 -------------------------------------------------------------------- */

typedef struct count_result {
  const char *master;
  double p50_ms, p99_ms, mean_ms, min_ms, max_ms, open_s;
  bool met;
} count_result;

/* ---- ui_overhead: a client polling the driver's REST API ----------------------------------- */
#define UI_POLL_MS 100
#define UI_TARGET_RATIO 1.05

typedef struct ui_poller {
  char host[64];
  int port;
  atomic_bool stop;
  uint64_t polls, bytes, failures;
  pthread_t thread;
} ui_poller;

/* One GET over HTTP/1.0 (the server closes the connection after the answer): bytes read, or -1. */
static long http_get(const char *host, int port, const char *path) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  long got = -1;
  char req[256], buf[65536];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && bench_write_all(fd, req, (size_t)n) == 0) {
    got = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) got += r;
    if (r < 0) got = -1;
  }
  close(fd);
  return got;
}

/* Every UI_POLL_MS: the application's jobs, its stages and its executors, as a dashboard would. */
static void *poller_main(void *arg) {
  ui_poller *p = arg;
  static const char *const paths[] = {"/api/v1/applications/current/jobs", "/api/v1/applications/current/stages",
                                      "/api/v1/applications/current/executors"};
  while (!atomic_load(&p->stop)) {
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
      long got = http_get(p->host, p->port, paths[i]);
      if (got > 0) p->bytes += (uint64_t)got;
      else p->failures++;
    }
    p->polls++;
    usleep(UI_POLL_MS * 1000);
  }
  return NULL;
}

static int count_latency_polled(const char *master, ui_poller *poller, count_result *res);

static int count_latency(const char *master, count_result *res) { return count_latency_polled(master, NULL, res); }

/* poller: when not NULL, polls the context's web UI while the counts run. */
static int count_latency_polled(const char *master, ui_poller *poller, count_result *res) {
  fl_context *ctx = NULL;
  fl_dataset *ds = NULL;
  double samples[COUNTS], sum = 0;
  uint64_t n = 0;
  int rc = 1;
  memset(res, 0, sizeof *res);
  res->master = master;
  double t0 = now_s();
  if (fl_context_open(master, NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    return 1;
  }
  res->open_s = now_s() - t0;
  if (poller) {
    const char *url = fl_context_ui_url(ctx);
    if (!url || sscanf(url, "http://%63[^:]:%d", poller->host, &poller->port) != 2) {
      fprintf(stderr, BENCH_NAME ": %s serves no web UI (%s)\n", master, url ? url : "none");
      fl_context_close(ctx);
      return 1;
    }
    atomic_init(&poller->stop, false);
    if (pthread_create(&poller->thread, NULL, poller_main, poller) != 0) {
      fl_context_close(ctx);
      return 1;
    }
  }
  if (fl_range(ctx, 0, COUNT_RECORDS, 1, COUNT_PARTITIONS, &ds) != FL_OK || fl_cache(ds) != FL_OK) {
    fail_flint("fl_range/fl_cache");
    goto done;
  }
  for (int i = 0; i < 1 + WARMUP_COUNTS + COUNTS; i++) {
    double a = now_s();
    fl_status s = fl_count(ds, &n);
    double b = now_s();
    if (s != FL_OK) {
      fail_flint("fl_count");
      goto done;
    }
    if (n != COUNT_RECORDS) {
      fprintf(stderr, BENCH_NAME ": count on %s is %" PRIu64 ", expected %d\n", master, n, COUNT_RECORDS);
      goto done;
    }
    if (i == 0) { /* the first count computed and cached the partitions: all of them? */
      fl_storage_info info;
      if (fl_storage_info_get(ds, &info) == FL_OK && info.cached_partitions != COUNT_PARTITIONS)
        fprintf(stderr, BENCH_NAME ": note: %u of %u partitions cached on %s after the first count\n",
                info.cached_partitions, COUNT_PARTITIONS, master);
    }
    if (i >= 1 + WARMUP_COUNTS) {
      samples[i - 1 - WARMUP_COUNTS] = (b - a) * 1e3;
      sum += (b - a) * 1e3;
    }
  }
  qsort(samples, COUNTS, sizeof *samples, bench_cmp_double);
  res->p50_ms = quantile(samples, COUNTS, 0.50);
  res->p99_ms = quantile(samples, COUNTS, 0.99);
  res->mean_ms = sum / COUNTS;
  res->min_ms = samples[0];
  res->max_ms = samples[COUNTS - 1];
  res->met = res->p50_ms <= COUNT_TARGET_P50_MS;
  rc = 0;
done:
  if (poller) {
    atomic_store(&poller->stop, true);
    pthread_join(poller->thread, NULL);
  }
  fl_dataset_free(ds);
  fl_context_close(ctx);
  return rc;
}

typedef struct ui_result {
  int runs;
  double off_p50_ms, on_p50_ms, ratio; /* medians over the runs */
  uint64_t polls, bytes, failures;
} ui_result;

/* The cluster's count p50 with the UI off (FLINT_UI=0) and on with a client polling it,
 * back to back, --runs pairs alternating; the medians and their ratio. */
static int bench_ui(const options *o, ui_result *res) {
  memset(res, 0, sizeof *res);
  int runs = (int)(o->runs < 1 ? 1 : o->runs > 15 ? 15 : o->runs);
  double off[15], on[15];
  for (int i = 0; i < runs; i++) {
    count_result r;
    setenv("FLINT_UI", "0", 1);
    if (count_latency(CLUSTER, &r) != 0) return 1;
    off[i] = r.p50_ms;
    setenv("FLINT_UI", "1", 1);
    setenv("FLINT_UI_PORT", "0", 1);
    ui_poller p = {0};
    int rc = count_latency_polled(CLUSTER, &p, &r);
    unsetenv("FLINT_UI");
    unsetenv("FLINT_UI_PORT");
    if (rc != 0) return 1;
    on[i] = r.p50_ms;
    res->polls += p.polls;
    res->bytes += p.bytes;
    res->failures += p.failures;
  }
  qsort(off, (size_t)runs, sizeof *off, bench_cmp_double);
  qsort(on, (size_t)runs, sizeof *on, bench_cmp_double);
  res->runs = runs;
  res->off_p50_ms = off[runs / 2];
  res->on_p50_ms = on[runs / 2];
  res->ratio = res->on_p50_ms / res->off_p50_ms;
  return 0;
}

static void print_ui(const options *o, const ui_result *r);

/* ---- reduce_by_key ---------------------------------------------------------------------- */

typedef struct rbk_result {
  uint64_t pairs, keys;
  int runs;
  double local_s, cluster_s, local_rps, cluster_rps, ratio;
  bcf_figures figures;
  uint64_t expected_sum;
  bool equal;
} rbk_result;

static bool figures_equal(const bcf_figures *a, const bcf_figures *b) {
  return a->keys == b->keys && a->sum == b->sum && a->checksum == b->checksum;
}

/* One run on ctx: fresh datasets (no shuffle output of an earlier run is reused). */
static int rbk_run(fl_context *ctx, uint64_t n, uint64_t keys, bcf_figures *out, double *secs) {
  fl_dataset *range = NULL, *pairs = NULL, *sums = NULL;
  fl_buf figures = FL_BUF_INIT;
  bcf_figures zero = {0, 0, 0};
  int rc = 1;
  double t0 = now_s();
  if (fl_range(ctx, 0, (int64_t)n, 1, RBK_PARTITIONS, &range) != FL_OK ||
      fl_map(range, bcf_make_pair, &keys, sizeof keys, &pairs) != FL_OK ||
      fl_reduce_by_key(pairs, bcf_add, NULL, 0, NULL, 0, &sums) != FL_OK ||
      fl_aggregate(sums, fl_bytes_of(&zero, sizeof zero), bcf_fold, bcf_merge, NULL, 0, &figures) != FL_OK) {
    fail_flint("reduce_by_key (fl_range/fl_map/fl_reduce_by_key/fl_aggregate)");
    goto done;
  }
  *secs = now_s() - t0;
  if (figures.len != sizeof *out) {
    fprintf(stderr, BENCH_NAME ": aggregate returned %zu bytes, expected %zu\n", figures.len, sizeof *out);
    goto done;
  }
  memcpy(out, figures.data, sizeof *out);
  rc = 0;
done:
  fl_buf_free(&figures);
  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_dataset_free(range);
  return rc;
}

static int bench_rbk(const options *o, rbk_result *res) {
  fl_context *local = NULL, *cluster = NULL;
  int rc = 1;
  memset(res, 0, sizeof *res);
  uint64_t n = o->pairs;
  res->pairs = n;
  res->keys = n / RBK_KEYS_DIVISOR ? n / RBK_KEYS_DIVISOR : 1;
  res->runs = (int)o->runs;
  res->local_s = res->cluster_s = 1e30;
  res->equal = true;
  res->expected_sum = n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2); /* wrapping */
  if (fl_context_open(LOCAL, NULL, &local) != FL_OK || fl_context_open(CLUSTER, NULL, &cluster) != FL_OK) {
    fail_flint("fl_context_open");
    goto done;
  }
  bool have = false;
  for (uint64_t run = 0; run < o->runs; run++) {
    bcf_figures f[2];
    double s[2];
    if (rbk_run(local, n, res->keys, &f[0], &s[0]) != 0 || rbk_run(cluster, n, res->keys, &f[1], &s[1]) != 0)
      goto done;
    if (s[0] < res->local_s) res->local_s = s[0];
    if (s[1] < res->cluster_s) res->cluster_s = s[1];
    for (int m = 0; m < 2; m++) {
      if (have && !figures_equal(&f[m], &res->figures)) res->equal = false;
      if (f[m].sum != res->expected_sum) res->equal = false;
      res->figures = f[m];
      have = true;
    }
  }
  res->local_rps = (double)n / res->local_s;
  res->cluster_rps = (double)n / res->cluster_s;
  res->ratio = res->cluster_rps / res->local_rps;
  rc = 0;
done:
  fl_context_close(cluster);
  fl_context_close(local);
  return rc;
}

/* ---- broadcast_100MB: the TCP baseline ------------------------------------------------- */

typedef struct sender {
  int fd;
  const uint8_t *data;
  size_t len;
  int copies;
  pthread_barrier_t *start;
  int err;
} sender;

static void *sender_main(void *arg) {
  sender *s = arg;
  pthread_barrier_wait(s->start);
  for (int c = 0; c < s->copies; c++) {
    size_t off = 0;
    while (off < s->len) {
      ssize_t n = send(s->fd, s->data + off, s->len - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        s->err = errno ? errno : EPIPE;
        return NULL;
      }
      off += (size_t)n;
    }
  }
  return NULL;
}

/* Copies `len` bytes `copies` times over loopback into dst[0..copies-1]; returns seconds from
 * both threads ready to the last byte, or a negative value on failure. */
static double tcp_copy(const uint8_t *data, size_t len, int copies, uint8_t **dst) {
  double secs = -1;
  int lfd = socket(AF_INET, SOCK_STREAM, 0), cfd = -1, afd = -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
    goto done;
  cfd = socket(AF_INET, SOCK_STREAM, 0);
  if (cfd < 0 || connect(cfd, (struct sockaddr *)&a, sizeof a) != 0) goto done;
  afd = accept(lfd, NULL, NULL);
  if (afd < 0) goto done;
  int one = 1; /* as the data plane's sockets */
  setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(afd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, 2);
  sender s = {afd, data, len, copies, &start, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, sender_main, &s) != 0) {
    pthread_barrier_destroy(&start);
    goto done;
  }
  pthread_barrier_wait(&start);
  double t0 = now_s();
  size_t got_all = 0;
  for (int c = 0; c < copies; c++) {
    size_t got = 0;
    while (got < len) {
      ssize_t n = recv(cfd, dst[c] + got, len - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += (size_t)n;
    }
    got_all += got;
    if (got < len) break;
  }
  double t1 = now_s();
  pthread_join(th, NULL);
  pthread_barrier_destroy(&start);
  if (got_all == len * (size_t)copies && s.err == 0) secs = t1 - t0;
done:
  if (afd >= 0) close(afd);
  if (cfd >= 0) close(cfd);
  if (lfd >= 0) close(lfd);
  return secs;
}

/* ---- broadcast_100MB ------------------------------------------------------------------- */

typedef struct bcast_result {
  int runs;
  uint64_t bytes;
  double create_big_s, create_tiny_s, job_big_s, job_tiny_s; /* best of runs */
  double upload_s, fetch_s, transfer_s, transfer_median_s;
  double transfer_mbps, upload_mbps, fetch_mbps, tcp_mbps;
  double ratio, upload_ratio, fetch_ratio;
  double tcp_s;
  double fresh_s, fresh_mbps; /* first touch of a fresh 100 MB buffer (memset), best of runs */
  uint64_t executor_pids[EXECUTORS];
  double executor_rss_mib[EXECUTORS];
  bool met;
} bcast_result;

/* Resident memory of process `pid` in MiB, or -1. */
static double rss_mib(uint64_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%" PRIu64 "/status", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  double mib = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) {
      mib = strtod(line + 6, NULL) / 1024.0;
      break;
    }
  fclose(f);
  return mib;
}

/* One broadcast and its probe job: times of fl_broadcast_create and of the job, checked. */
static int bcast_once(fl_context *ctx, const uint8_t *data, size_t len, double *create_s, double *job_s,
                      uint64_t pids[EXECUTORS]) {
  fl_broadcast *b = NULL;
  fl_dataset *range = NULL, *probes = NULL;
  fl_records *got = NULL;
  int rc = 1;
  double t0 = now_s();
  if (fl_broadcast_create(ctx, data, len, &b) != FL_OK) {
    fail_flint("fl_broadcast_create");
    goto done;
  }
  double t1 = now_s();
  uint64_t id = fl_broadcast_id(b);
  if (fl_range(ctx, 0, EXECUTORS, 1, EXECUTORS, &range) != FL_OK ||
      fl_map(range, bcf_broadcast_probe, &id, sizeof id, &probes) != FL_OK ||
      fl_collect(probes, &got) != FL_OK) {
    fail_flint("the probe job (fl_range/fl_map/fl_collect)");
    goto done;
  }
  double t2 = now_s();
  *create_s = t1 - t0;
  *job_s = t2 - t1;
  uint64_t digest = bcf_sample_digest(data, len), total = 0;
  size_t n = fl_records_count(got);
  if (n != EXECUTORS) {
    fprintf(stderr, BENCH_NAME ": the probe job returned %zu records, expected %d\n", n, EXECUTORS);
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    bcf_probe p;
    fl_bytes r = fl_records_get(got, i);
    if (r.len != sizeof p) {
      fprintf(stderr, BENCH_NAME ": a probe record of %zu bytes\n", r.len);
      goto done;
    }
    memcpy(&p, r.data, sizeof p);
    if (p.digest != digest || p.len != len) {
      fprintf(stderr, BENCH_NAME ": executor %" PRIu64 " read %" PRIu64 " bytes with digest %016" PRIx64
              ", expected %zu bytes with digest %016" PRIx64 "\n", p.pid, p.len, p.digest, len, digest);
      goto done;
    }
    total += p.len;
    pids[i] = p.pid;
  }
  if (total != (uint64_t)len * EXECUTORS || pids[0] == pids[1] || pids[0] == (uint64_t)getpid() ||
      pids[1] == (uint64_t)getpid()) {
    fprintf(stderr, BENCH_NAME ": the probe tasks ran in processes %" PRIu64 " and %" PRIu64
            " (this is %d) and read %" PRIu64 " bytes in all: not one task per executor\n",
            pids[0], pids[1], (int)getpid(), total);
    goto done;
  }
  rc = 0;
done:
  fl_records_free(got);
  fl_dataset_free(probes);
  fl_dataset_free(range);
  fl_broadcast_destroy(b);
  return rc;
}

static int bench_bcast(const options *o, bcast_result *res) {
  memset(res, 0, sizeof *res);
  res->runs = (int)o->runs;
  res->bytes = BCAST_BYTES;
  res->create_big_s = res->create_tiny_s = res->job_big_s = res->job_tiny_s = res->tcp_s = res->fresh_s = 1e30;
  int rc = 1;
  fl_context *ctx = NULL;
  size_t len = BCAST_BYTES;
  uint8_t *data = malloc(len), *dst[EXECUTORS] = {NULL, NULL};
  double *transfers = calloc(o->runs, sizeof *transfers);
  uint8_t tiny[BCAST_TINY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (int i = 0; i < EXECUTORS; i++) dst[i] = malloc(len);
  if (!data || !dst[0] || !dst[1] || !transfers) {
    fprintf(stderr, BENCH_NAME ": out of memory\n");
    goto done;
  }
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= len; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(data + i, &x, 8);
  }
  for (int i = 0; i < EXECUTORS; i++) memset(dst[i], 0, len);

  if (fl_context_open(CLUSTER, NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    goto done;
  }
  double c, j;
  uint64_t pids[EXECUTORS];
  /* Warm-up: ships the library, makes the application on both executors. */
  if (bcast_once(ctx, tiny, sizeof tiny, &c, &j, pids) != 0) goto done;
  for (uint64_t run = 0; run < o->runs; run++) {
    double ct, jt, cb, jb;
    if (bcast_once(ctx, tiny, sizeof tiny, &ct, &jt, pids) != 0) goto done;
    if (bcast_once(ctx, data, len, &cb, &jb, pids) != 0) goto done;
    memset(dst[0], 0, 4096);
    memset(dst[1], 0, 4096);
    double t = tcp_copy(data, len, EXECUTORS, dst);
    if (t < 0) {
      fprintf(stderr, BENCH_NAME ": tcp copy failed: %s\n", strerror(errno));
      goto done;
    }
    for (int i = 0; i < EXECUTORS; i++)
      if (memcmp(dst[i], data, len) != 0) {
        fprintf(stderr, BENCH_NAME ": copied bytes differ from the value\n");
        goto done;
      }
    if (ct < res->create_tiny_s) res->create_tiny_s = ct;
    if (jt < res->job_tiny_s) res->job_tiny_s = jt;
    if (cb < res->create_big_s) res->create_big_s = cb;
    if (jb < res->job_big_s) res->job_big_s = jb;
    if (t < res->tcp_s) res->tcp_s = t;
    /* What landing 100 MB in memory no one has touched yet costs on this machine (page
     * faults): every copy of the value the engine makes in a fresh buffer pays it. */
    volatile uint8_t *fresh = malloc(len);
    if (!fresh) {
      fprintf(stderr, BENCH_NAME ": out of memory\n");
      goto done;
    }
    double f0 = now_s();
    memset((void *)fresh, (int)run + 1, len);
    double f1 = now_s();
    if (fresh[len - 1] != (uint8_t)(run + 1)) goto done;
    free((void *)fresh);
    if (f1 - f0 < res->fresh_s) res->fresh_s = f1 - f0;
    transfers[run] = (cb + jb) - (ct + jt);
  }
  for (int i = 0; i < EXECUTORS; i++) {
    res->executor_pids[i] = pids[i];
    res->executor_rss_mib[i] = rss_mib(pids[i]);
  }
  res->upload_s = res->create_big_s - res->create_tiny_s;
  res->fetch_s = res->job_big_s - res->job_tiny_s;
  res->transfer_s = res->upload_s + res->fetch_s;
  res->transfer_median_s = bench_median(transfers, o->runs);
  double delivered = (double)len * EXECUTORS;
  res->transfer_mbps = delivered / res->transfer_s / 1e6;
  res->upload_mbps = (double)len / res->upload_s / 1e6;
  res->fetch_mbps = delivered / res->fetch_s / 1e6;
  res->tcp_mbps = delivered / res->tcp_s / 1e6;
  res->fresh_mbps = (double)len / res->fresh_s / 1e6;
  res->ratio = res->transfer_mbps / res->tcp_mbps;
  res->upload_ratio = res->upload_mbps / res->tcp_mbps;
  res->fetch_ratio = res->fetch_mbps / res->tcp_mbps;
  res->met = res->ratio >= BCAST_TARGET_RATIO;
  rc = 0;
done:
  fl_context_close(ctx);
  free(transfers);
  for (int i = 0; i < EXECUTORS; i++) free(dst[i]);
  free(data);
  return rc;
}

/* ---- output ------------------------------------------------------------------------------ */

#define BENCH_COLUMN 17

static const bench_columns columns = {BENCH_COLUMN, 28, 16, 12};

static void print_row(const char *bench, const char *metric, const char *value, const char *target,
                      const char *met) {
  bench_print_row(&columns, bench, metric, value, target, met);
}

static void print_header(const options *o) {
  printf("flint bench_cluster (flint %s): cluster %s against %s and loopback TCP\n", FL_VERSION_STRING,
         CLUSTER, LOCAL);
  if (!o->skip[ROW_COUNT])
    printf("  count_cached_16: fl_count of a cached %d-partition range of %d int64, %d timed after %d "
           "warm-up; p50/p99 nearest rank\n",
           COUNT_PARTITIONS, COUNT_RECORDS, COUNTS, WARMUP_COUNTS);
  if (!o->skip[ROW_RBK])
    printf("  reduce_by_key: %" PRIu64 " (8-byte key, 8-byte value) pairs, %" PRIu64
           " keys, %d map x %d reduce partitions; best of %" PRIu64 " runs each, alternating\n",
           o->pairs, o->pairs / RBK_KEYS_DIVISOR ? o->pairs / RBK_KEYS_DIVISOR : 1, RBK_PARTITIONS,
           RBK_PARTITIONS, o->runs);
  if (!o->skip[ROW_BCAST])
    printf("  broadcast_100MB: create + probe job (1 task per executor), 100 MB minus 8 B value; each "
           "timing best of %" PRIu64 " runs;\n"
           "    MB/s are of 2 x 100 MB delivered; ratio = transfer (upload + fetch) MB/s / tcp_copy MB/s\n",
           o->runs);
  printf("\n%-*s %-28s %16s  %-12s %s\n", BENCH_COLUMN, "bench", "metric", "value", "target", "met");
  printf("%-*s %-28s %16s  %-12s %s\n", BENCH_COLUMN, "-----------------", "----------------------------",
         "----------------", "------------", "---");
}

static void print_count(const options *o, const count_result *r, bool reference) {
  if (o->json) {
    printf("{\"bench\": \"count_cached_16\", \"master\": \"%s\", \"records\": %d, \"partitions\": %d"
           ", \"counts\": %d, \"warmup_counts\": %d, \"p50_ms\": %.4f, \"p99_ms\": %.4f, \"mean_ms\": %.4f"
           ", \"min_ms\": %.4f, \"max_ms\": %.4f, \"context_open_s\": %.3f",
           r->master, COUNT_RECORDS, COUNT_PARTITIONS, COUNTS, WARMUP_COUNTS, r->p50_ms, r->p99_ms,
           r->mean_ms, r->min_ms, r->max_ms, r->open_s);
    if (reference)
      printf(", \"target\": null, \"met\": null, \"purpose\": \"reference for the cluster row\"}\n");
    else
      printf(", \"target\": \"p50_ms <= %.1f\", \"met\": %s}\n", COUNT_TARGET_P50_MS, r->met ? "true" : "false");
    return;
  }
  char v[64], t[32], m[64];
  const char *p = reference ? "local" : "cluster";
  snprintf(v, sizeof v, "%.3f", r->p50_ms);
  snprintf(t, sizeof t, "<= %.1f", COUNT_TARGET_P50_MS);
  snprintf(m, sizeof m, "%s_p50_ms", p);
  print_row(reference ? "" : "count_cached_16", m, v, reference ? "(ref)" : t,
            reference ? "-" : r->met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.3f", r->p99_ms);
  snprintf(m, sizeof m, "%s_p99_ms", p);
  print_row("", m, v, "", "");
  snprintf(v, sizeof v, "%.3f", r->mean_ms);
  snprintf(m, sizeof m, "%s_mean_ms", p);
  print_row("", m, v, "", "");
  snprintf(v, sizeof v, "%.3f / %.3f", r->min_ms, r->max_ms);
  snprintf(m, sizeof m, "%s_min/max_ms", p);
  print_row("", m, v, "", "");
}

static void print_ui(const options *o, const ui_result *r) {
  bool met = r->ratio <= UI_TARGET_RATIO && r->failures == 0;
  if (o->json) {
    printf("{\"bench\": \"ui_overhead\", \"master\": \"%s\", \"runs\": %d, \"poll_ms\": %d, \"ui_off_p50_ms\": %.4f"
           ", \"ui_on_polled_p50_ms\": %.4f, \"ratio\": %.4f, \"polls\": %" PRIu64 ", \"bytes\": %" PRIu64
           ", \"failed_requests\": %" PRIu64 ", \"target\": \"ratio <= %.2f\", \"met\": %s}\n",
           CLUSTER, r->runs, UI_POLL_MS, r->off_p50_ms, r->on_p50_ms, r->ratio, r->polls, r->bytes, r->failures,
           UI_TARGET_RATIO, met ? "true" : "false");
    return;
  }
  char v[64], t[32];
  snprintf(v, sizeof v, "%.4f", r->ratio);
  snprintf(t, sizeof t, "<= %.2f", UI_TARGET_RATIO);
  print_row("ui_overhead", "p50_on_polled/p50_off", v, t, met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.3f", r->off_p50_ms);
  print_row("", "ui_off_p50_ms (median)", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->on_p50_ms);
  print_row("", "ui_on_polled_p50_ms", v, "", "");
  snprintf(v, sizeof v, "%" PRIu64 " / %" PRIu64, r->polls, r->failures);
  print_row("", "polls / failed requests", v, "", "");
}

static void print_rbk(const options *o, const rbk_result *r) {
  if (o->json) {
    printf("{\"bench\": \"reduce_by_key\", \"master\": \"%s\", \"baseline_master\": \"%s\", \"records\": %" PRIu64
           ", \"keys\": %" PRIu64 ", \"map_partitions\": %d, \"reduce_partitions\": %d, \"runs\": %d"
           ", \"cluster_best_s\": %.3f, \"local_best_s\": %.3f, \"cluster_records_per_s\": %.0f"
           ", \"local_records_per_s\": %.0f, \"ratio_cluster_local\": %.3f, \"result_keys\": %" PRIu64
           ", \"result_sum\": %" PRIu64 ", \"expected_sum\": %" PRIu64 ", \"checksum\": %" PRIu64
           ", \"results_equal\": %s, \"target\": null, \"met\": null}\n",
           CLUSTER, LOCAL, r->pairs, r->keys, RBK_PARTITIONS, RBK_PARTITIONS, r->runs, r->cluster_s, r->local_s,
           r->cluster_rps, r->local_rps, r->ratio, r->figures.keys, r->figures.sum, r->expected_sum,
           r->figures.checksum, r->equal ? "true" : "false");
    return;
  }
  char v[64];
  snprintf(v, sizeof v, "%.3f", r->cluster_s);
  print_row("reduce_by_key", "cluster_best_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->local_s);
  print_row("", "local_best_s", v, "", "");
  snprintf(v, sizeof v, "%.0f", r->cluster_rps);
  print_row("", "cluster_records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.0f", r->local_rps);
  print_row("", "local_records_per_s", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->ratio);
  print_row("", "ratio cluster/local", v, "(none)", "-");
  snprintf(v, sizeof v, "%" PRIu64, r->figures.keys);
  print_row("", "keys (cluster = local)", v, "", r->equal ? "" : "MISMATCH");
  snprintf(v, sizeof v, "%016" PRIx64, r->figures.checksum);
  print_row("", "checksum", v, "", "");
}

static void print_bcast(const options *o, const bcast_result *r) {
  if (o->json) {
    printf("{\"bench\": \"broadcast_100MB\", \"master\": \"%s\", \"bytes\": %" PRIu64 ", \"executors\": %d"
           ", \"runs\": %d, \"create_big_best_s\": %.4f, \"create_tiny_best_s\": %.4f, \"job_big_best_s\": %.4f"
           ", \"job_tiny_best_s\": %.4f, \"upload_s\": %.4f, \"fetch_s\": %.4f, \"transfer_s\": %.4f"
           ", \"transfer_median_s\": %.4f, \"transfer_mb_per_s\": %.1f, \"upload_mb_per_s\": %.1f"
           ", \"fetch_mb_per_s\": %.1f, \"ratio_to_tcp\": %.3f, \"upload_ratio_to_tcp\": %.3f"
           ", \"fetch_ratio_to_tcp\": %.3f, \"first_touch_mb_per_s\": %.1f, \"executor_rss_after_mib\": [%.1f, %.1f]"
           ", \"target\": \"ratio_to_tcp >= %.1f\", \"met\": %s}\n",
           CLUSTER, r->bytes, EXECUTORS, r->runs, r->create_big_s, r->create_tiny_s, r->job_big_s,
           r->job_tiny_s, r->upload_s, r->fetch_s, r->transfer_s, r->transfer_median_s, r->transfer_mbps,
           r->upload_mbps, r->fetch_mbps, r->ratio, r->upload_ratio, r->fetch_ratio, r->fresh_mbps, r->executor_rss_mib[0],
           r->executor_rss_mib[1], BCAST_TARGET_RATIO, r->met ? "true" : "false");
    printf("{\"bench\": \"tcp_copy_2x100MB\", \"bytes\": %" PRIu64 ", \"runs\": %d, \"best_s\": %.4f"
           ", \"mb_per_s\": %.1f, \"target\": null, \"met\": null}\n",
           r->bytes * EXECUTORS, r->runs, r->tcp_s, r->tcp_mbps);
    return;
  }
  char v[64], t[32];
  const char *b = "broadcast_100MB";
  snprintf(v, sizeof v, "%.1f", r->transfer_mbps);
  print_row(b, "transfer_mb_per_s", v, "", "");
  snprintf(t, sizeof t, ">= %.1f", BCAST_TARGET_RATIO);
  snprintf(v, sizeof v, "%.3f", r->ratio);
  print_row("", "ratio_to_tcp", v, t, r->met ? "yes" : "NO");
  snprintf(v, sizeof v, "%.4f", r->transfer_s);
  print_row("", "transfer_s (upload+fetch)", v, "", "");
  snprintf(v, sizeof v, "%.4f", r->transfer_median_s);
  print_row("", "transfer_median_s", v, "", "");
  snprintf(v, sizeof v, "%.4f", r->upload_s);
  print_row("", "upload_s (create big-tiny)", v, "", "");
  snprintf(v, sizeof v, "%.1f", r->upload_mbps);
  print_row("", "upload_mb_per_s (100 MB)", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->upload_ratio);
  print_row("", "upload_ratio_to_tcp", v, "(info)", "-");
  snprintf(v, sizeof v, "%.4f", r->fetch_s);
  print_row("", "fetch_s (job big-tiny)", v, "", "");
  snprintf(v, sizeof v, "%.1f", r->fetch_mbps);
  print_row("", "fetch_mb_per_s (2x100 MB)", v, "", "");
  snprintf(v, sizeof v, "%.3f", r->fetch_ratio);
  print_row("", "fetch_ratio_to_tcp", v, "(info)", "-");
  snprintf(v, sizeof v, "%.4f / %.4f", r->create_big_s, r->create_tiny_s);
  print_row("", "create_s big / tiny", v, "", "");
  snprintf(v, sizeof v, "%.4f / %.4f", r->job_big_s, r->job_tiny_s);
  print_row("", "job_s big / tiny", v, "", "");
  snprintf(v, sizeof v, "%.1f", r->fresh_mbps);
  print_row("", "first_touch_mb_per_s (info)", v, "", "");
  snprintf(v, sizeof v, "%.0f / %.0f MiB", r->executor_rss_mib[0], r->executor_rss_mib[1]);
  print_row("", "executor_rss_after", v, "", "");
  snprintf(v, sizeof v, "%.1f", r->tcp_mbps);
  print_row("tcp_copy_2x100MB", "mb_per_s", v, "", "");
  snprintf(v, sizeof v, "%.4f", r->tcp_s);
  print_row("", "best_s", v, "", "");
}

static const char usage_text[] =
    "usage: bench_cluster [--json] [--pairs N] [--runs N] [--skip ROW]...\n"
    "  --json        one JSON object per row instead of a table\n"
    "  --pairs N     pairs for reduce_by_key (default 10000000; N/50 keys)\n"
    "  --runs N      timed runs of each side of reduce_by_key and broadcast_100MB (default 3)\n"
    "  --skip ROW    leave out a row: count_cached_16, reduce_by_key, broadcast_100MB or ui_overhead\n"
    "  --help        this text\n";

int main(int argc, char **argv) {
  options o = {false, 10000000ull, 3, {false, false, false}};
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
      if (i + 1 >= argc) {
        fprintf(stderr, BENCH_NAME ": --skip needs a row name\n%s", usage_text);
        return 2;
      }
      int row = bench_row_index(row_names, NUM_ROWS, argv[i + 1]);
      if (row < 0) {
        fprintf(stderr, BENCH_NAME ": --skip: no row named '%s'\n%s", argv[i + 1], usage_text);
        return 2;
      }
      o.skip[row] = true;
      i++;
      continue;
    }
    bool pairs = strcmp(argv[i], "--pairs") == 0;
    if (pairs || strcmp(argv[i], "--runs") == 0) {
      uint64_t max = pairs ? (uint64_t)INT64_MAX : 1000;
      if (i + 1 >= argc || !parse_count(argv[i + 1], max, pairs ? &o.pairs : &o.runs)) {
        fprintf(stderr, BENCH_NAME ": %s needs a whole number in 1..%" PRIu64 "\n%s", argv[i], max, usage_text);
        return 2;
      }
      i++;
      continue;
    }
    fprintf(stderr, BENCH_NAME ": unknown option '%s'\n%s", argv[i], usage_text);
    return 2;
  }

  count_result cc, cl;
  rbk_result rr;
  bcast_result br;
  if (!o.skip[ROW_COUNT] && (count_latency(CLUSTER, &cc) != 0 || count_latency(LOCAL, &cl) != 0)) return 1;
  if (!o.skip[ROW_RBK] && bench_rbk(&o, &rr) != 0) return 1;
  if (!o.skip[ROW_BCAST] && bench_bcast(&o, &br) != 0) return 1;
  ui_result ur;
  if (!o.skip[ROW_UI] && bench_ui(&o, &ur) != 0) return 1;

  if (!o.json) print_header(&o);
  if (!o.skip[ROW_COUNT]) {
    print_count(&o, &cc, false);
    print_count(&o, &cl, true);
  }
  if (!o.skip[ROW_RBK]) print_rbk(&o, &rr);
  if (!o.skip[ROW_BCAST]) print_bcast(&o, &br);
  if (!o.skip[ROW_UI]) print_ui(&o, &ur);
  fflush(stdout);
  if (!o.skip[ROW_RBK] && !rr.equal) {
    fprintf(stderr, BENCH_NAME ": reduce_by_key: results differ between runs or modes, or the sum is not %" PRIu64
            " (last: keys %" PRIu64 ", sum %" PRIu64 ")\n",
            rr.expected_sum, rr.figures.keys, rr.figures.sum);
    return 1;
  }
  return 0;
}
