/*
 * bench_allreduce: the host backend's allreduce algorithms against plain TCP in the same run
 * (issue 7). Ranks are processes on this machine, joined over loopback: the parent listens
 * on one endpoint per rank, forks the ranks, each builds its communicator on the cpu device
 * and times every algorithm (ring, halving-doubling, tree, and what auto picks) at every
 * size from 8 B to 64 MB (steps of 4x, and 64 MB), with 2 and 4 ranks. One sample is
 * barrier, allreduce (sum) on each rank; the sample's time is the slowest rank's, and a row
 * reports the median sample:
 *
 *   latency   median time of one allreduce, in microseconds
 *   algbw     bytes / latency
 *   busbw     2(p-1)/p x bytes / latency: what each rank's link carried per second (the
 *             figure NCCL's tests report; comparable across rank counts)
 *
 * The baseline, p2p, is one TCP connection over loopback between two processes with the
 * same socket options as the communicator's (TCP_NODELAY, FLINT_COMM_SOCKBUF buffers): one
 * process sends the bytes, the other receives them all and answers one byte; its bandwidth
 * is bytes / time. Target: ring busbw at 64 MB at least 0.8x the p2p bandwidth at 64 MB.
 * A second baseline, duplex, sends the bytes both ways at once (what each step of a
 * two-rank ring does); it is printed for reference: on a machine with fewer cores than
 * ranks x 2 the kernel's copies, not the algorithm, bound every rank count above one pair.
 * Both baselines run before and after the groups and keep the faster median.
 *
 * --bind pins rank r to CPU r mod the CPUs, as mpirun binds its ranks to cores by default
 * (without it, on a busy machine, two ranks often share one CPU and small messages then
 * cost a context switch each way).
 *
 * Output: a table, or with --json one JSON object per row. Exit 1 on an engine error, 2 on a
 * bad option; a missed target is reported, not an error.
 */
#define BENCH_NAME "bench_allreduce"
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "flint/gpu.h"
#include "gpu/comm/comm.h"
#include "gpu/device/device.h"

#define MAX_SIZES 16
#define MAX_SAMPLES 64
#define NALGOS 4

static const fl_allreduce_algo algos[NALGOS] = {FL_ALLREDUCE_RING, FL_ALLREDUCE_HALVING_DOUBLING,
                                                FL_ALLREDUCE_TREE, FL_ALLREDUCE_AUTO};

typedef struct options {
  bool json;
  uint64_t min_bytes, max_bytes;
  double scale; /* sample counts x scale (--quick: fewer) */
  bool bind;    /* --bind: rank r on CPU r mod ncpu */
} options;

static size_t sizes[MAX_SIZES];
static int nsizes;

/* Fewer samples for larger sizes keeps a full run near a minute on two cores. */
static int samples_for(size_t bytes, double scale) {
  int s = bytes <= (32u << 10) ? 41 : bytes <= (512u << 10) ? 21 : bytes <= (8u << 20) ? 11 : 7;
  s = (int)(s * scale);
  return s < 3 ? 3 : s > MAX_SAMPLES ? MAX_SAMPLES : s;
}

/* What a rank reports: its time for every sample of every (algo, size). */
typedef struct rank_times {
  double t[NALGOS][MAX_SIZES][MAX_SAMPLES];
  int picked[MAX_SIZES]; /* the algorithm auto chose */
} rank_times;

/* ---- one rank (a child process) ---------------------------------------------------------- */

static int run_rank(const options *o, fl_comm_endpoint *ep, int rank, int p, const char **addrs,
                    int out_fd) {
  fl_comm *comm = NULL;
  fl_device *dev = NULL;
  fl_tensor *t = NULL;
  rank_times *rt = calloc(1, sizeof *rt);
  int rc = 1;
  if (!rt) return 1;
  if (fl_comm_host_create(ep, rank, p, addrs, 30000, &comm) != FL_OK) {
    fail_flint("fl_comm_host_create");
    goto done;
  }
  if (fl_device_open(FL_DEVICE_CPU, 0, &dev) != FL_OK) {
    fail_flint("fl_device_open");
    goto done;
  }
  int64_t maxn = (int64_t)(sizes[nsizes - 1] / sizeof(float));
  if (fl_tensor_create(dev, 1, &maxn, &t) != FL_OK) {
    fail_flint("fl_tensor_create");
    goto done;
  }
  /* Algorithms interleaved per size, so that a slow spell of this shared machine hits them
   * alike; one untimed pass over every size first warms the connections and the memory. */
  for (int pass = 0; pass < 2; pass++)
    for (int s = 0; s < nsizes; s++)
      for (int a = 0; a < NALGOS; a++) {
        if (fl_comm_set_allreduce_algo(comm, algos[a]) != FL_OK) goto done;
        /* A view of the first n elements: the same memory at every size. */
        fl_tensor view;
        int64_t n = (int64_t)(sizes[s] / sizeof(float));
        if (tensor_view(t, 0, 1, &n, &view) != FL_OK) {
          fail_flint("tensor_view");
          goto done;
        }
        int ns = pass == 0 ? 1 : samples_for(sizes[s], o->scale);
        if (algos[a] == FL_ALLREDUCE_AUTO)
          rt->picked[s] = comm_pick_algo(comm, sizes[s]);
        for (int i = 0; i < ns; i++) {
          if (fl_comm_barrier(comm) != FL_OK) {
            fail_flint("fl_comm_barrier");
            goto done;
          }
          double t0 = now_s();
          if (fl_comm_allreduce(comm, &view, FL_REDUCE_SUM) != FL_OK) {
            fail_flint("fl_comm_allreduce");
            goto done;
          }
          if (pass == 1) rt->t[a][s][i] = now_s() - t0;
        }
      }
  rc = bench_write_all(out_fd, rt, sizeof *rt) == 0 ? 0 : 1;
done:
  fl_tensor_destroy(t);
  fl_comm_destroy(comm);
  fl_device_close(dev);
  free(rt);
  return rc;
}

/* Forks p ranks; fills med[a][s] with the median over samples of the slowest rank. */
static int run_group(const options *o, int p, double med[NALGOS][MAX_SIZES], int *picked) {
  if (p < 1 || p > 8) return 1;
  fl_comm_endpoint *eps[8];
  char addr[8][96];
  const char *addrs[8];
  for (int r = 0; r < p; r++) {
    if (fl_comm_listen("127.0.0.1", &eps[r]) != FL_OK) {
      fail_flint("fl_comm_listen");
      return 1;
    }
    snprintf(addr[r], sizeof addr[r], "%s", fl_comm_endpoint_address(eps[r]));
    addrs[r] = addr[r];
  }
  int fds[8];
  pid_t pids[8];
  fflush(stdout);
  for (int r = 0; r < p; r++) {
    int pp[2];
    if (pipe(pp) != 0) return 1;
    pids[r] = fork();
    if (pids[r] < 0) return 1;
    if (pids[r] == 0) {
      close(pp[0]);
      if (o->bind) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(r % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
        (void)sched_setaffinity(0, sizeof set, &set);
      }
      for (int q = 0; q < p; q++)
        if (q != r) fl_comm_endpoint_destroy(eps[q]);
      _exit(run_rank(o, eps[r], r, p, addrs, pp[1]));
    }
    close(pp[1]);
    fds[r] = pp[0];
  }
  for (int r = 0; r < p; r++) fl_comm_endpoint_destroy(eps[r]);
  rank_times *all = calloc((size_t)p, sizeof *all);
  int rc = 0;
  for (int r = 0; r < p; r++)
    if (!all || bench_read_all(fds[r], &all[r], sizeof *all) != 0) rc = 1;
  for (int r = 0; r < p; r++) {
    int status;
    close(fds[r]);
    if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  if (rc) {
    fprintf(stderr, BENCH_NAME ": a rank of %d failed\n", p);
    free(all);
    return 1;
  }
  for (int a = 0; a < NALGOS; a++)
    for (int s = 0; s < nsizes; s++) {
      int ns = samples_for(sizes[s], o->scale);
      double v[MAX_SAMPLES];
      for (int i = 0; i < ns; i++) {
        v[i] = 0;
        for (int r = 0; r < p; r++)
          if (all[r].t[a][s][i] > v[i]) v[i] = all[r].t[a][s][i];
      }
      med[a][s] = bench_median(v, ns);
    }
  for (int s = 0; s < nsizes; s++) picked[s] = all[0].picked[s];
  free(all);
  return 0;
}

/* ---- the baseline: one TCP stream between two processes ---------------------------------- */

typedef struct sender_arg {
  int fd;
  const char *buf;
  size_t len;
  int rc;
} sender_arg;

static void *sender_main(void *p) {
  sender_arg *a = p;
  a->rc = bench_write_all(a->fd, a->buf, a->len);
  return NULL;
}

/* One end of the baseline. One-way: the sender writes the bytes, the receiver reads them and
 * answers one byte. Duplex (the traffic of a two-rank ring step): both ends write the bytes
 * (on a second thread) while they read the other's. */
static int p2p_child(int lfd, bool first, bool duplex, const options *o, int out_fd) {
  int fd;
  if (first) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) return 1;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    comm_host_socket_options(fd);
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0) return 1;
  } else {
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) return 1;
    comm_host_socket_options(fd);
  }
  close(lfd);
  size_t maxb = sizes[nsizes - 1];
  char *buf = malloc(maxb), *rbuf = malloc(maxb);
  if (!buf || !rbuf) return 1;
  memset(buf, 1, maxb);
  memset(rbuf, 0, maxb);
  static double t[MAX_SIZES][MAX_SAMPLES];
  for (int s = 0; s < nsizes; s++) {
    int ns = samples_for(sizes[s], o->scale);
    for (int i = -1; i < ns; i++) {
      char ack = 0;
      double t0 = now_s();
      if (duplex) {
        sender_arg a = {fd, buf, sizes[s], 0};
        pthread_t th;
        if (pthread_create(&th, NULL, sender_main, &a) != 0) return 1;
        int r = bench_read_all(fd, rbuf, sizes[s]);
        pthread_join(th, NULL);
        if (r != 0 || a.rc != 0) return 1;
        /* a one-byte handshake so that both ends start the next sample together */
        if (first ? (bench_write_all(fd, &ack, 1) || bench_read_all(fd, &ack, 1)) : (bench_read_all(fd, &ack, 1) || bench_write_all(fd, &ack, 1)))
          return 1;
      } else if (first) {
        if (bench_write_all(fd, buf, sizes[s]) != 0 || bench_read_all(fd, &ack, 1) != 0) return 1;
      } else {
        if (bench_read_all(fd, rbuf, sizes[s]) != 0 || bench_write_all(fd, &ack, 1) != 0) return 1;
      }
      if (i >= 0) t[s][i] = now_s() - t0;
    }
  }
  close(fd);
  free(buf);
  free(rbuf);
  if (first && bench_write_all(out_fd, t, sizeof t) != 0) return 1;
  return 0;
}

static int run_p2p(const options *o, bool duplex, double *med) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  comm_host_socket_options(lfd);
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 4) != 0) {
    perror(BENCH_NAME ": p2p listen");
    return 1;
  }
  int pp[2];
  if (pipe(pp) != 0) return 1;
  fflush(stdout);
  pid_t pids[2];
  for (int k = 0; k < 2; k++) {
    pids[k] = fork();
    if (pids[k] == 0) {
      close(pp[0]);
      _exit(p2p_child(lfd, k == 0, duplex, o, pp[1]));
    }
  }
  close(pp[1]);
  close(lfd);
  static double t[MAX_SIZES][MAX_SAMPLES];
  int rc = bench_read_all(pp[0], t, sizeof t) == 0 ? 0 : 1;
  close(pp[0]);
  for (int k = 0; k < 2; k++) {
    int status;
    if (waitpid(pids[k], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  if (rc) {
    fprintf(stderr, BENCH_NAME ": the p2p baseline failed\n");
    return 1;
  }
  for (int s = 0; s < nsizes; s++) med[s] = bench_median(t[s], samples_for(sizes[s], o->scale));
  return 0;
}

/* ---- output -------------------------------------------------------------------------------- */

static void human_bytes(size_t b, char *out, size_t len) {
  if (b >= (1u << 20)) snprintf(out, len, "%zu MB", b >> 20);
  else if (b >= (1u << 10)) snprintf(out, len, "%zu KB", b >> 10);
  else snprintf(out, len, "%zu B", b);
}

int main(int argc, char **argv) {
  options o = {.min_bytes = 8, .max_bytes = 64u << 20, .scale = 1.0};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) o.json = true;
    else if (strcmp(argv[i], "--quick") == 0) o.scale = 0.3;
    else if (strcmp(argv[i], "--bind") == 0) o.bind = true;
    else if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc &&
             parse_count(argv[i + 1], 1u << 30, &o.max_bytes) && o.max_bytes >= 8)
      i++;
    else if (strcmp(argv[i], "--min-bytes") == 0 && i + 1 < argc &&
             parse_count(argv[i + 1], 1u << 30, &o.min_bytes) && o.min_bytes >= 8)
      i++;
    else {
      fprintf(stderr, BENCH_NAME ": bad option '%s'\nusage: bench_allreduce [--json] [--quick] "
              "[--min-bytes N] [--max-bytes N] [--bind]\n", argv[i]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  if (o.min_bytes > o.max_bytes) o.min_bytes = o.max_bytes;
  for (size_t b = (size_t)o.min_bytes; b <= o.max_bytes && nsizes < MAX_SIZES - 1; b *= 4) sizes[nsizes++] = b;
  if (sizes[nsizes - 1] != o.max_bytes) sizes[nsizes++] = (size_t)o.max_bytes;

  /* The baselines run before and after the groups; each keeps its faster median per size,
   * so a slow spell of this shared machine cannot flatter the ratio. */
  double p2p[MAX_SIZES], p2p2[MAX_SIZES], dup[MAX_SIZES], dup2[MAX_SIZES];
  if (run_p2p(&o, false, p2p) != 0 || run_p2p(&o, true, dup) != 0) return 1;
  static const int ranks[2] = {2, 4};
  static double med[2][NALGOS][MAX_SIZES];
  int picked[2][MAX_SIZES];
  for (int k = 0; k < 2; k++)
    if (run_group(&o, ranks[k], med[k], picked[k]) != 0) return 1;
  if (run_p2p(&o, false, p2p2) != 0 || run_p2p(&o, true, dup2) != 0) return 1;
  for (int s = 0; s < nsizes; s++) {
    if (p2p2[s] < p2p[s]) p2p[s] = p2p2[s];
    if (dup2[s] < dup[s]) dup[s] = dup2[s];
  }

  int last = nsizes - 1;
  double p2p_bw = (double)sizes[last] / p2p[last];
  if (!o.json) {
    printf("flint bench_allreduce: host backend, ranks as processes over loopback, %d cores; "
           "median of 7-41 samples (slowest rank each)\n\n", (int)sysconf(_SC_NPROCESSORS_ONLN));
    printf("%-5s %-16s %8s %12s %10s %10s\n", "ranks", "algorithm", "bytes", "latency_us",
           "algbw_GB/s", "busbw_GB/s");
    puts("----- ---------------- -------- ------------ ---------- ----------");
    for (int s = 0; s < nsizes; s++) {
      char hb[32];
      human_bytes(sizes[s], hb, sizeof hb);
      printf("%-5s %-16s %8s %12.1f %10.3f %10s\n", "p2p", "tcp one-way", hb, p2p[s] * 1e6,
             (double)sizes[s] / p2p[s] / 1e9, "-");
    }
    for (int s = 0; s < nsizes; s++) {
      char hb[32];
      human_bytes(sizes[s], hb, sizeof hb);
      printf("%-5s %-16s %8s %12.1f %10.3f %10s\n", "p2p", "tcp duplex", hb, dup[s] * 1e6,
             (double)sizes[s] / dup[s] / 1e9, "-");
    }
  }
  for (int s = 0; s < nsizes && o.json; s++) {
    printf("{\"bench\": \"p2p\", \"algorithm\": \"tcp one-way\", \"ranks\": 2, \"bytes\": %zu, "
           "\"latency_us\": %.2f, \"algbw_gbps\": %.4f}\n",
           sizes[s], p2p[s] * 1e6, (double)sizes[s] / p2p[s] / 1e9);
    printf("{\"bench\": \"p2p\", \"algorithm\": \"tcp duplex\", \"ranks\": 2, \"bytes\": %zu, "
           "\"latency_us\": %.2f, \"algbw_gbps\": %.4f}\n",
           sizes[s], dup[s] * 1e6, (double)sizes[s] / dup[s] / 1e9);
  }
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    for (int a = 0; a < NALGOS; a++)
      for (int s = 0; s < nsizes; s++) {
        double lat = med[k][a][s], alg = (double)sizes[s] / lat;
        double bus = alg * 2.0 * (p - 1) / p;
        char name[40];
        if (algos[a] == FL_ALLREDUCE_AUTO)
          snprintf(name, sizeof name, "auto(%s)", fl_allreduce_algo_name(picked[k][s]) );
        else
          snprintf(name, sizeof name, "%s", fl_allreduce_algo_name(algos[a]));
        if (o.json) {
          printf("{\"bench\": \"allreduce\", \"algorithm\": \"%s\", \"picked\": \"%s\", \"ranks\": %d, "
                 "\"bytes\": %zu, \"latency_us\": %.2f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}\n",
                 fl_allreduce_algo_name(algos[a]), fl_allreduce_algo_name(algos[a] == FL_ALLREDUCE_AUTO ? (fl_allreduce_algo)picked[k][s] : algos[a]),
                 p, sizes[s], lat * 1e6, alg / 1e9, bus / 1e9);
        } else {
          char hb[32];
          human_bytes(sizes[s], hb, sizeof hb);
          printf("%-5d %-16s %8s %12.1f %10.3f %10.3f\n", p, name, hb, lat * 1e6, alg / 1e9, bus / 1e9);
        }
      }
  }
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    double bus = (double)sizes[last] / med[k][0][last] * 2.0 * (p - 1) / p;
    double ratio = bus / p2p_bw, dratio = bus / ((double)sizes[last] / dup[last]);
    char hb[32];
    human_bytes(sizes[last], hb, sizeof hb);
    if (o.json) {
      printf("{\"bench\": \"ring_vs_p2p\", \"ranks\": %d, \"bytes\": %zu, \"ring_busbw_gbps\": %.4f, "
             "\"p2p_gbps\": %.4f, \"ratio\": %.3f, \"duplex_gbps\": %.4f, \"duplex_ratio\": %.3f, "
             "\"target\": \"ratio >= 0.8\", \"met\": %s}\n",
             p, sizes[last], bus / 1e9, p2p_bw / 1e9, ratio, (double)sizes[last] / dup[last] / 1e9, dratio,
             ratio >= 0.8 ? "true" : "false");
    } else {
      if (k == 0) {
        puts("");
        bench_columns c = {12, 34, 8, 8};
        bench_print_row(&c, "bench", "metric", "value", "target", "met");
        puts("------------ ---------------------------------- --------  -------- ---");
      }
      bench_columns c = {12, 34, 8, 8};
      char metric[64], v[32];
      snprintf(metric, sizeof metric, "ring busbw / p2p, %d ranks, %s", p, hb);
      snprintf(v, sizeof v, "%.3f", ratio);
      bench_print_row(&c, "ring_vs_p2p", metric, v, ">= 0.8", ratio >= 0.8 ? "yes" : "NO");
      snprintf(metric, sizeof metric, "ring busbw / duplex, %d ranks, %s", p, hb);
      snprintf(v, sizeof v, "%.3f", dratio);
      bench_print_row(&c, "", metric, v, "(ref)", "-");
    }
  }
  return 0;
}
