/*
 * bench_allreduce: the host backend's allreduce algorithms beside their cost model, plain TCP,
 * Open MPI and gloo, in the same run (issues 7 and 37). Ranks are processes on this machine,
 * joined over loopback: the parent listens on one endpoint per rank, forks the ranks, each
 * builds its communicator on the cpu device (which calibrates its links) and times every
 * algorithm (ring, halving-doubling, tree, naive, parameter-server, double-tree, butterfly,
 * hierarchical where it applies, and what auto picks) at every size (8 B, 64 B, 512 B, 4 KB,
 * 32 KB, 256 KB, 1 MB, 4 MB, 16 MB, 64 MB), with 2 and 4 ranks. One sample is barrier,
 * allreduce (sum) on each rank; the sample's time is the slowest rank's, and a row reports
 * the median sample:
 *
 *   latency   median time of one allreduce, in microseconds
 *   model     the cost model's prediction for this communicator (gpu/comm/cost_model.h,
 *             with the parameters it measured when it formed), and measured / model
 *   algbw     bytes / latency
 *   busbw     2(p-1)/p x bytes / latency: what each rank's link carried per second (the
 *             figure NCCL's tests report; comparable across rank counts)
 *
 * Peers, the same sizes and samples, barrier + allreduce, slowest rank, median: Open MPI
 * (bench/peers/mpi_allreduce.c, built when CMake finds MPI, run by mpirun with the shared-
 * memory transport, vader, and with TCP over loopback) and gloo (bench/peers/gloo_allreduce.py
 * through torch.distributed); each is skipped with a note when it is not installed
 * (scripts/setup-peers installs both). With more ranks than cores, rows say
 * "oversubscribed".
 *
 * Targets (issue 37), printed after the tables: at 2 ranks, auto's 8 B latency <= 2x Open MPI
 * shm, 4 KB <= 1.5x, every size from 256 KB at most Open MPI shm's time; at 4 ranks auto
 * <= 1.1x the best algorithm at every size; every algorithm's time within 25% of the model.
 *
 * The baseline, p2p, is one TCP connection over loopback between two processes with the
 * same socket options as the communicator's (TCP_NODELAY, FLINT_COMM_SOCKBUF buffers): one
 * process sends the bytes, the other receives them all and answers one byte; its bandwidth
 * is bytes / time. Target (issue 7): ring busbw at 64 MB at least 0.8x the p2p bandwidth at
 * 64 MB. A second baseline, duplex, sends the bytes both ways at once (what each step of a
 * two-rank ring does); it is printed for reference. Both baselines run before and after the
 * groups and keep the faster median.
 *
 * --device cuda adds, after the cpu groups, the same sizes on cuda tensors at 2 and 4 ranks:
 * the host backend (every rank on GPU 0, tensors staged through pinned host memory; AUTO's
 * pick) beside NCCL (GPU r for rank r), as latency and busbw. NCCL needs a GPU per rank, so
 * on a machine of one GPU its rows say so and only the host backend runs.
 *
 * --bind pins rank r to CPU r mod the CPUs, as mpirun binds its ranks to cores by default
 * (without it, on a busy machine, two ranks often share one CPU and small messages then
 * cost a context switch each way).
 *
 * Output: a table, or with --json one JSON object per row. Exit 1 on an engine error, 2 on a
 * bad option; a missed target or a missing peer is reported, not an error.
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
#include "splitmix.h"
#include "flint/gpu.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/comm.h"
#include "gpu/comm/cost_model.h"
#include "gpu/device/device.h"

#define MAX_SIZES 16
#define MAX_SAMPLES 64
#define NALGOS 9

static const fl_allreduce_algo algos[NALGOS] = {
    FL_ALLREDUCE_RING,        FL_ALLREDUCE_HALVING_DOUBLING, FL_ALLREDUCE_TREE,
    FL_ALLREDUCE_NAIVE,       FL_ALLREDUCE_PARAMETER_SERVER, FL_ALLREDUCE_DOUBLE_TREE,
    FL_ALLREDUCE_BUTTERFLY,   FL_ALLREDUCE_HIERARCHICAL,     FL_ALLREDUCE_AUTO};
#define AUTO_ROW (NALGOS - 1)

/* The sizes of a full run; --min-bytes and --max-bytes keep those in range (and add
 * --max-bytes itself when it is not one of them). */
static const size_t default_sizes[] = {8,         64,        512,       4u << 10,  32u << 10,
                                       256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};

typedef struct options {
  bool json;
  uint64_t min_bytes, max_bytes;
  double scale; /* sample counts x scale (--quick: fewer) */
  bool bind;    /* --bind: rank r on CPU r mod ncpu */
  bool cuda;    /* --device cuda: cuda tensors too (host backend staged, and NCCL) */
} options;

/* What a group's ranks run on: the host backend over cpu tensors (every algorithm), the host
 * backend over cuda tensors (every rank on GPU 0, staged through pinned memory; AUTO only),
 * or NCCL (GPU r for rank r; it picks its own algorithm). */
typedef enum backend { BACKEND_HOST_CPU, BACKEND_HOST_CUDA, BACKEND_NCCL } backend;

static size_t sizes[MAX_SIZES];
static int nsizes;

/* Fewer samples for larger sizes keeps a full run near a minute on two cores. */
static int samples_for(size_t bytes, double scale) {
  int s = bytes <= (32u << 10) ? 41 : bytes <= (512u << 10) ? 21 : bytes <= (8u << 20) ? 11 : 7;
  s = (int)(s * scale);
  return s < 3 ? 3 : s > MAX_SAMPLES ? MAX_SAMPLES : s;
}

/* 0..NALGOS-1 in an order drawn from `seed` (Fisher-Yates). */
static void shuffled_order(int order[NALGOS], uint64_t seed) {
  for (int a = 0; a < NALGOS; a++) order[a] = a;
  for (int a = NALGOS - 1; a > 0; a--) {
    int j = (int)(splitmix(seed * NALGOS + (uint64_t)a) % (uint64_t)(a + 1));
    int t = order[a];
    order[a] = order[j], order[j] = t;
  }
}

/* What a rank reports: its time for every sample of every (algo, size), the model's
 * predictions, and its communicator's parameters. */
typedef struct rank_times {
  double t[NALGOS][MAX_SIZES][MAX_SAMPLES];
  double pred[NALGOS][MAX_SIZES]; /* seconds; negative: the algorithm does not apply */
  int picked[MAX_SIZES];          /* the algorithm auto chose */
  comm_cost_model model;
  double form_s;      /* fl_comm_host_create: the mesh, and the process's first calibration */
  double calibrate_s; /* one more calibration, timed */
} rank_times;

/* What a group reports: the medians (negative: not run) and rank 0's predictions. */
typedef struct group_result {
  double med[NALGOS][MAX_SIZES];
  double pred[NALGOS][MAX_SIZES];
  int picked[MAX_SIZES];
  comm_cost_model model;
  double form_s, calibrate_s; /* the slowest rank's */
} group_result;

/* ---- one rank (a child process) ---------------------------------------------------------- */

/* The rank's communicator: over the host mesh, or NCCL with the unique id that rank 0 made
 * and wrote to id_fd once for every other rank. */
static fl_status rank_comm(backend b, fl_comm_endpoint *ep, int rank, int p, const char **addrs, int id_fd,
                           fl_device *dev, fl_comm **comm) {
  if (b != BACKEND_NCCL) return fl_comm_host_create(ep, rank, p, addrs, 30000, comm);
  fl_comm_endpoint_destroy(ep);
  uint8_t id[FL_NCCL_ID_BYTES];
  if (rank == 0) {
    fl_status st = fl_comm_nccl_unique_id(id);
    if (st != FL_OK) return st;
    for (int r = 1; r < p; r++)
      if (bench_write_all(id_fd, id, sizeof id) != 0) return fl_set_error(FL_EINTERNAL, "writing the NCCL id");
  } else if (bench_read_all(id_fd, id, sizeof id) != 0) {
    return fl_set_error(FL_EINTERNAL, "reading the NCCL id");
  }
  return fl_comm_nccl_create(dev, rank, p, id, comm);
}

/* NCCL waits without a timeout for a rank that failed: a rank of an NCCL group that has not
 * finished in this many seconds is ended (its group then fails instead of hanging). */
#define NCCL_RANK_LIMIT_S 300

static int run_rank(const options *o, backend b, fl_comm_endpoint *ep, int rank, int p, const char **addrs,
                    int id_fd, int out_fd) {
  if (b == BACKEND_NCCL) alarm(NCCL_RANK_LIMIT_S);
  fl_comm *comm = NULL;
  fl_device *dev = NULL;
  fl_tensor *t = NULL;
  rank_times *rt = calloc(1, sizeof *rt);
  int rc = 1;
  if (!rt) return 1;
  if (fl_device_open(b == BACKEND_HOST_CPU ? FL_DEVICE_CPU : FL_DEVICE_CUDA, b == BACKEND_NCCL ? rank : 0, &dev) !=
      FL_OK) {
    fail_flint("fl_device_open");
    fl_comm_endpoint_destroy(ep);
    goto done;
  }
  double f0 = now_s();
  fl_status formed = rank_comm(b, ep, rank, p, addrs, id_fd, dev, &comm);
  rt->form_s = now_s() - f0;
  if (formed != FL_OK) {
    fail_flint(b == BACKEND_NCCL ? "fl_comm_nccl_create" : "fl_comm_host_create");
    goto done;
  }
  rt->model = *comm_cost_of(comm);
  /* What calibration costs: once more, timed between barriers (the communicator keeps the
   * figures it formed with). */
  if (b == BACKEND_HOST_CPU) {
    comm_cost_model again;
    if (fl_comm_barrier(comm) != FL_OK) {
      fail_flint("fl_comm_barrier");
      goto done;
    }
    double c0 = now_s();
    if (comm_host_calibrate(comm->impl, &again) != FL_OK) {
      fail_flint("comm_host_calibrate");
      goto done;
    }
    rt->calibrate_s = now_s() - c0;
  }
  int64_t maxn = (int64_t)(sizes[nsizes - 1] / sizeof(float));
  if (fl_tensor_create(dev, 1, &maxn, &t) != FL_OK) {
    fail_flint("fl_tensor_create");
    goto done;
  }
  /* Cuda tensors time AUTO alone, and NCCL has no model. */
  for (int a = 0; a < NALGOS; a++)
    for (int s = 0; s < nsizes; s++)
      rt->pred[a][s] = b == BACKEND_NCCL || (b == BACKEND_HOST_CUDA && algos[a] != FL_ALLREDUCE_AUTO)
                           ? -1
                           : comm_predict_seconds(comm, algos[a], sizes[s]);
  /* Algorithms interleaved sample by sample, in a fresh order each round (the same on every
   * rank: a shuffle seeded by the size and the sample), so that a slow spell of this shared
   * machine, and whatever one algorithm leaves behind for the next (caches, ranks still
   * waking up), fall on every row alike; one untimed pass over every size first warms the
   * connections and the memory. */
  for (int s = 0; s < nsizes; s++) rt->picked[s] = comm_pick_algo(comm, sizes[s]);
  for (int pass = 0; pass < 2; pass++)
    for (int s = 0; s < nsizes; s++) {
      /* A view of the first n elements: the same memory at every size. */
      fl_tensor view;
      int64_t n = (int64_t)(sizes[s] / sizeof(float));
      if (tensor_view(t, 0, 1, &n, &view) != FL_OK) {
        fail_flint("tensor_view");
        goto done;
      }
      int ns = pass == 0 ? 1 : samples_for(sizes[s], o->scale);
      for (int i = 0; i < ns; i++) {
        int order[NALGOS];
        shuffled_order(order, (uint64_t)s * MAX_SAMPLES + (uint64_t)i);
        for (int k = 0; k < NALGOS; k++) {
          int a = order[k];
          if (algos[a] != FL_ALLREDUCE_AUTO &&
              (b != BACKEND_HOST_CPU || !comm_cost_applies(comm_cost_of(comm), algos[a])))
            continue;
          if (fl_comm_set_allreduce_algo(comm, algos[a]) != FL_OK) goto done;
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
    }
  rc = bench_write_all(out_fd, rt, sizeof *rt) == 0 ? 0 : 1;
done:
  fl_tensor_destroy(t);
  fl_comm_destroy(comm);
  fl_device_close(dev);
  free(rt);
  return rc;
}

/* Forks p ranks on backend b; fills g with the median over samples of the slowest rank. */
static int run_group(const options *o, backend b, int p, group_result *g) {
  if (p < 1 || p > 8) return 1;
  int id_pipe[2];
  if (pipe(id_pipe) != 0) return 1;
  fl_comm_endpoint *eps[8];
  char addr[8][96];
  const char *addrs[8];
  for (int r = 0; r < p; r++) {
    if (fl_comm_listen("127.0.0.1", &eps[r]) != FL_OK) {
      fail_flint("fl_comm_listen");
      for (int q = 0; q < r; q++) fl_comm_endpoint_destroy(eps[q]);
      close(id_pipe[0]);
      close(id_pipe[1]);
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
      close(r == 0 ? id_pipe[0] : id_pipe[1]);
      _exit(run_rank(o, b, eps[r], r, p, addrs, r == 0 ? id_pipe[1] : id_pipe[0], pp[1]));
    }
    close(pp[1]);
    fds[r] = pp[0];
  }
  close(id_pipe[0]);
  close(id_pipe[1]);
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
      g->pred[a][s] = all[0].pred[a][s];
      if (algos[a] != FL_ALLREDUCE_AUTO && (b != BACKEND_HOST_CPU || all[0].pred[a][s] < 0)) {
        g->med[a][s] = -1; /* not run: does not apply */
        continue;
      }
      int ns = samples_for(sizes[s], o->scale);
      double v[MAX_SAMPLES];
      for (int i = 0; i < ns; i++) {
        v[i] = 0;
        for (int r = 0; r < p; r++)
          if (all[r].t[a][s][i] > v[i]) v[i] = all[r].t[a][s][i];
      }
      g->med[a][s] = bench_median(v, ns);
    }
  for (int s = 0; s < nsizes; s++) g->picked[s] = all[0].picked[s];
  g->model = all[0].model;
  g->form_s = g->calibrate_s = 0;
  for (int r = 0; r < p; r++) {
    if (all[r].calibrate_s > g->calibrate_s) g->calibrate_s = all[r].calibrate_s;
    if (all[r].form_s > g->form_s) g->form_s = all[r].form_s;
  }
  free(all);
  return 0;
}

/* ---- cuda tensors: the host backend beside NCCL ------------------------------------------ */

typedef struct cuda_result {
  group_result host, nccl;
  bool have_host, have_nccl; /* false: failed (host) or failed or skipped (nccl) */
  char note[160];            /* why NCCL did not run */
} cuda_result;

/* The GPUs this machine has, counted in a child: a parent that touched CUDA could not fork
 * ranks that use it. */
static int count_gpus(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int n = fl_cuda_device_count();
    _exit(n < 0 ? 0 : n > 100 ? 100 : n);
  }
  int status;
  if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

/* For each rank count: the host backend over cuda tensors (every rank on GPU 0), and NCCL
 * when there is a GPU per rank (NCCL refuses two ranks on one GPU). */
/* A group that fails is noted in its result and the others still run: the cpu groups and
 * the peers before it took minutes. */
static void run_cuda(const options *o, int gpus, const int ranks[2], cuda_result res[2]) {
  for (int k = 0; k < 2; k++) {
    res[k].have_host = run_group(o, BACKEND_HOST_CUDA, ranks[k], &res[k].host) == 0;
    res[k].have_nccl = false;
    if (gpus < ranks[k])
      snprintf(res[k].note, sizeof res[k].note, "skipped: NCCL needs a GPU per rank, %d visible", gpus);
    else if (run_group(o, BACKEND_NCCL, ranks[k], &res[k].nccl) != 0)
      snprintf(res[k].note, sizeof res[k].note, "failed (see stderr)");
    else
      res[k].have_nccl = true;
  }
}

/* ---- the peers: Open MPI and gloo, the same sizes and samples ---------------------------- */

#define NPEERS 3
static const char *const peer_names[NPEERS] = {"openmpi shm", "openmpi tcp", "gloo"};

/* The peers' "BYTES:SAMPLES" arguments for every size. */
static void peer_size_args(const options *o, char *out, size_t cap) {
  size_t at = 0;
  out[0] = '\0';
  for (int s = 0; s < nsizes && at < cap; s++)
    at += (size_t)snprintf(out + at, cap - at, " %zu:%d", sizes[s], samples_for(sizes[s], o->scale));
}

/* Runs one peer's command; each JSON line it prints fills med[s] for its size (negative:
 * none). False, with the reason in why, when it cannot run or fails. */
static bool run_peer(const char *cmd, double *med, char *why, size_t cap) {
  for (int s = 0; s < nsizes; s++) med[s] = -1;
  fflush(stdout);
  FILE *f = popen(cmd, "r");
  if (!f) {
    snprintf(why, cap, "could not start: %s", strerror(errno));
    return false;
  }
  char line[512];
  int got = 0;
  while (fgets(line, sizeof line, f)) {
    if (!strstr(line, "\"peer\"")) continue;
    size_t b = (size_t)bench_json_number(line, "bytes");
    for (int s = 0; s < nsizes; s++)
      if (sizes[s] == b) {
        med[s] = bench_json_number(line, "latency_us") * 1e-6;
        got++;
      }
  }
  int rc = pclose(f);
  if (rc != 0 || got < nsizes) {
    snprintf(why, cap, "failed (exit status %d, %d of %d sizes): %s", rc, got, nsizes, cmd);
    return got > 0;
  }
  return true;
}

/* med[k][s] for peer k at p ranks; a note per peer that is missing or failed. */
static void run_peers(const options *o, int p, double med[NPEERS][MAX_SIZES], char notes[NPEERS][600]) {
  static char args[MAX_SIZES * 24];
  peer_size_args(o, args, sizeof args);
  char cmd[2048];
  for (int k = 0; k < NPEERS; k++) {
    notes[k][0] = '\0';
    for (int s = 0; s < nsizes; s++) med[k][s] = -1;
  }
#ifdef FLINT_MPI_PEER
  static const char *const btl[2] = {"--mca btl self,vader", "--mca btl self,tcp --mca btl_tcp_if_include lo"};
  for (int k = 0; k < 2; k++) {
    snprintf(cmd, sizeof cmd, "mpirun -np %d --oversubscribe --allow-run-as-root --bind-to none --mca pml ob1 "
             "%s '%s' %s%s", p, btl[k], FLINT_MPI_PEER, k == 0 ? "shm" : "tcp", args);
    run_peer(cmd, med[k], notes[k], sizeof notes[k]);
  }
#else
  snprintf(notes[0], sizeof notes[0], "skipped: CMake found no MPI (scripts/setup-peers installs Open MPI)");
  snprintf(notes[1], sizeof notes[1], "%s", notes[0]);
#endif
  const char *python = bench_torch_python();
  if (!python) {
    snprintf(notes[2], sizeof notes[2], "skipped: python3 cannot import torch (scripts/setup-peers installs it)");
    return;
  }
  snprintf(cmd, sizeof cmd, "%s '%s/bench/peers/gloo_allreduce.py' --ranks %d%s", python, FLINT_SOURCE_DIR, p, args);
  run_peer(cmd, med[2], notes[2], sizeof notes[2]);
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

static const char *size_name(size_t b) {
  static char buf[4][32];
  static int k;
  char *out = buf[k++ % 4];
  human_bytes(b, out, sizeof buf[0]);
  return out;
}

static const char *copy_max_text(uint64_t b) {
  static char buf[32];
  if (b == UINT64_MAX) return "any";
  snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  return buf;
}

static int size_index(size_t b) {
  for (int s = 0; s < nsizes; s++)
    if (sizes[s] == b) return s;
  return -1;
}

/* A latency (seconds) as JSON: null when it was not measured. */
static const char *json_us(double seconds, char *buf, size_t cap) {
  if (seconds > 0) snprintf(buf, cap, "%.2f", seconds * 1e6);
  else snprintf(buf, cap, "null");
  return buf;
}

static void print_cuda(const options *o, const int ranks[2], const cuda_result res[2]) {
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    const cuda_result *c = &res[k];
    if (!o->json)
      printf("\n%d ranks, cuda tensors, latency in us: %-8s %28s %10s %12s %12s\n", p, "size", "host (staged) auto",
             "nccl", "host busbw", "nccl busbw");
    for (int s = 0; s < nsizes; s++) {
      double host = c->have_host ? c->host.med[AUTO_ROW][s] : -1, nccl = c->have_nccl ? c->nccl.med[AUTO_ROW][s] : -1;
      double f = 2.0 * (p - 1) / p * (double)sizes[s] / 1e9; /* busbw's GB, over seconds */
      const char *algo = fl_allreduce_algo_name((fl_allreduce_algo)c->host.picked[s]);
      if (o->json) {
        char h[32], n[32];
        printf("{\"bench\": \"allreduce_cuda\", \"ranks\": %d, \"bytes\": %zu, \"host_algorithm\": \"%s\", "
               "\"host_us\": %s, \"host_busbw_gbps\": %.4f, \"nccl_us\": %s, \"nccl_busbw_gbps\": %.4f%s%s%s}\n",
               p, sizes[s], c->have_host ? algo : "", json_us(host, h, sizeof h), host > 0 ? f / host : 0,
               json_us(nccl, n, sizeof n), nccl > 0 ? f / nccl : 0, c->have_nccl ? "" : ", \"nccl_note\": \"",
               c->have_nccl ? "" : c->note, c->have_nccl ? "" : "\"");
        continue;
      }
      char h_lat[48] = "failed", h_bus[24] = "-", n_lat[24] = "-", n_bus[24] = "-";
      if (host > 0) {
        snprintf(h_lat, sizeof h_lat, "%.1f %s", host * 1e6, algo);
        snprintf(h_bus, sizeof h_bus, "%.3f", f / host);
      }
      if (nccl > 0) {
        snprintf(n_lat, sizeof n_lat, "%.1f", nccl * 1e6);
        snprintf(n_bus, sizeof n_bus, "%.3f", f / nccl);
      }
      printf("%36s %-8s %28s %10s %12s %12s\n", "", size_name(sizes[s]), h_lat, n_lat, h_bus, n_bus);
    }
    if (!o->json && !c->have_nccl) printf("  nccl: %s\n", c->note);
  }
}

/* One target row, in the table or as JSON. */
static void target_row(const options *o, const char *metric, double value, const char *target, bool met) {
  if (o->json) {
    printf("{\"bench\": \"target\", \"metric\": \"%s\", \"value\": %.3f, \"target\": \"%s\", \"met\": %s}\n",
           metric, value, target, met ? "true" : "false");
    return;
  }
  bench_columns c = {8, 66, 8, 8};
  char v[32];
  snprintf(v, sizeof v, "%.3f", value);
  bench_print_row(&c, "target", metric, v, target, met ? "yes" : "NO");
}

int main(int argc, char **argv) {
  options o = {.min_bytes = 8, .max_bytes = 64u << 20, .scale = 1.0};
  bool peers = true;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) o.json = true;
    else if (strcmp(argv[i], "--quick") == 0) o.scale = 0.3;
    else if (strcmp(argv[i], "--bind") == 0) o.bind = true;
    else if (strcmp(argv[i], "--no-peers") == 0) peers = false;
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
             (strcmp(argv[i + 1], "cpu") == 0 || strcmp(argv[i + 1], "cuda") == 0))
      o.cuda = strcmp(argv[++i], "cuda") == 0;
    else if (strcmp(argv[i], "--max-bytes") == 0 && i + 1 < argc &&
             parse_count(argv[i + 1], 1u << 30, &o.max_bytes) && o.max_bytes >= 8)
      i++;
    else if (strcmp(argv[i], "--min-bytes") == 0 && i + 1 < argc &&
             parse_count(argv[i + 1], 1u << 30, &o.min_bytes) && o.min_bytes >= 8)
      i++;
    else {
      fprintf(stderr, BENCH_NAME ": bad option '%s'\nusage: bench_allreduce [--json] [--quick] "
              "[--no-peers] [--min-bytes N] [--max-bytes N] [--bind] [--device cpu|cuda]\n", argv[i]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  if (o.min_bytes > o.max_bytes) o.min_bytes = o.max_bytes;
  for (size_t i = 0; i < sizeof default_sizes / sizeof *default_sizes; i++)
    if (default_sizes[i] >= o.min_bytes && default_sizes[i] <= o.max_bytes) sizes[nsizes++] = default_sizes[i];
  if (nsizes == 0 || sizes[nsizes - 1] != o.max_bytes) sizes[nsizes++] = (size_t)o.max_bytes;
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int gpus = o.cuda ? count_gpus() : 0;
  if (o.cuda && gpus == 0) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no GPU is visible (or flint was built without CUDA)\n");
    return 1;
  }

  /* The baselines run before and after the groups; each keeps its faster median per size,
   * so a slow spell of this shared machine cannot flatter the ratio. */
  double p2p[MAX_SIZES], p2p2[MAX_SIZES], dup[MAX_SIZES], dup2[MAX_SIZES];
  if (run_p2p(&o, false, p2p) != 0 || run_p2p(&o, true, dup) != 0) return 1;
  static const int ranks[2] = {2, 4};
  static group_result res[2];
  static double peer_med[2][NPEERS][MAX_SIZES];
  static char notes[2][NPEERS][600];
  for (int k = 0; k < 2; k++) {
    if (run_group(&o, BACKEND_HOST_CPU, ranks[k], &res[k]) != 0) return 1;
    if (peers) {
      run_peers(&o, ranks[k], peer_med[k], notes[k]);
    } else {
      for (int j = 0; j < NPEERS; j++) {
        snprintf(notes[k][j], sizeof notes[k][j], "skipped: --no-peers");
        for (int s = 0; s < nsizes; s++) peer_med[k][j][s] = -1;
      }
    }
  }
  static cuda_result cuda_res[2];
  if (o.cuda) run_cuda(&o, gpus, ranks, cuda_res);
  if (run_p2p(&o, false, p2p2) != 0 || run_p2p(&o, true, dup2) != 0) return 1;
  for (int s = 0; s < nsizes; s++) {
    if (p2p2[s] < p2p[s]) p2p[s] = p2p2[s];
    if (dup2[s] < dup[s]) dup[s] = dup2[s];
  }

  int last = nsizes - 1;
  double p2p_bw = (double)sizes[last] / p2p[last];
  if (!o.json) {
    printf("flint bench_allreduce: host backend, ranks as processes over loopback, %d cores; "
           "median of 7-41 samples (slowest rank each)%s\n\n", cores, o.scale < 1 ? ", --quick" : "");
    for (int k = 0; k < 2; k++) {
      const comm_cost_params *q = &res[k].model.params;
      printf("cost model, %d ranks (%s, %.2f ms to measure; formed in %.2f ms, the first communicator of its processes): same host alpha %.2f us; beta at 32 KB, 1 MB, "
             "4 MB: %.2f, %.2f, %.2f GB/s; single-copy ring steps (%llu B..%s): %.2f, %.2f GB/s; gamma at 4 MB, 32 MB: "
             "%.2f, %.2f GB/s\n", ranks[k],
             q->calibrated ? "calibrated" : "defaults", res[k].calibrate_s * 1e3, res[k].form_s * 1e3, q->intra.alpha * 1e6,
             1e-9 / q->intra.beta[0], 1e-9 / q->intra.beta[1], 1e-9 / q->intra.beta[2],
             (unsigned long long)q->copy_min, copy_max_text(q->copy_max), 1e-9 / q->intra.beta_ring[1],
             1e-9 / q->intra.beta_ring[2], 1e-9 / q->gamma[0], 1e-9 / q->gamma[1]);
    }
    puts("");
    printf("%-5s %-26s %8s %12s %10s %8s %10s %10s\n", "ranks", "algorithm", "bytes", "latency_us",
           "model_us", "meas/mdl", "algbw_GB/s", "busbw_GB/s");
    puts("----- -------------------------- -------- ------------ ---------- -------- ---------- ----------");
    for (int s = 0; s < nsizes; s++)
      printf("%-5s %-26s %8s %12.1f %10s %8s %10.3f %10s\n", "p2p", "tcp one-way", size_name(sizes[s]),
             p2p[s] * 1e6, "-", "-", (double)sizes[s] / p2p[s] / 1e9, "-");
    for (int s = 0; s < nsizes; s++)
      printf("%-5s %-26s %8s %12.1f %10s %8s %10.3f %10s\n", "p2p", "tcp duplex", size_name(sizes[s]),
             dup[s] * 1e6, "-", "-", (double)sizes[s] / dup[s] / 1e9, "-");
  } else {
    for (int s = 0; s < nsizes; s++) {
      printf("{\"bench\": \"p2p\", \"algorithm\": \"tcp one-way\", \"ranks\": 2, \"bytes\": %zu, "
             "\"latency_us\": %.2f, \"algbw_gbps\": %.4f}\n",
             sizes[s], p2p[s] * 1e6, (double)sizes[s] / p2p[s] / 1e9);
      printf("{\"bench\": \"p2p\", \"algorithm\": \"tcp duplex\", \"ranks\": 2, \"bytes\": %zu, "
             "\"latency_us\": %.2f, \"algbw_gbps\": %.4f}\n",
             sizes[s], dup[s] * 1e6, (double)sizes[s] / dup[s] / 1e9);
    }
    for (int k = 0; k < 2; k++) {
      const comm_cost_params *q = &res[k].model.params;
      printf("{\"bench\": \"calibration\", \"ranks\": %d, \"calibrated\": %s, \"ms\": %.3f, \"form_ms\": %.3f, "
             "\"intra_alpha_us\": %.3f, \"intra_beta_gbps\": [%.4f, %.4f, %.4f], "
             "\"intra_beta_ring_gbps\": [%.4f, %.4f, %.4f], \"beta_sizes\": [%.0f, %.0f, %.0f], "
             "\"copy_min\": %llu, \"copy_max\": %.0f, \"inter_alpha_us\": %.3f, \"gamma_gbps\": [%.4f, %.4f]}\n",
             ranks[k], q->calibrated ? "true" : "false", res[k].calibrate_s * 1e3, res[k].form_s * 1e3, q->intra.alpha * 1e6,
             1e-9 / q->intra.beta[0], 1e-9 / q->intra.beta[1], 1e-9 / q->intra.beta[2],
             1e-9 / q->intra.beta_ring[0], 1e-9 / q->intra.beta_ring[1], 1e-9 / q->intra.beta_ring[2],
             comm_cost_sizes[0], comm_cost_sizes[1], comm_cost_sizes[2], (unsigned long long)q->copy_min,
             q->copy_max == UINT64_MAX ? -1.0 : (double)q->copy_max,
             q->inter.alpha * 1e6, 1e-9 / q->gamma[0], 1e-9 / q->gamma[1]);
    }
  }
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    bool over = p > cores;
    for (int a = 0; a < NALGOS; a++)
      for (int s = 0; s < nsizes; s++) {
        double lat = res[k].med[a][s], pred = res[k].pred[a][s];
        if (lat < 0) continue;
        double alg = (double)sizes[s] / lat, bus = alg * 2.0 * (p - 1) / p;
        fl_allreduce_algo ran = algos[a] == FL_ALLREDUCE_AUTO ? (fl_allreduce_algo)res[k].picked[s] : algos[a];
        if (o.json) {
          printf("{\"bench\": \"allreduce\", \"algorithm\": \"%s\", \"picked\": \"%s\", \"ranks\": %d, "
                 "\"oversubscribed\": %s, \"bytes\": %zu, \"latency_us\": %.2f, \"predicted_us\": %.2f, "
                 "\"ratio\": %.3f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f}\n",
                 fl_allreduce_algo_name(algos[a]), fl_allreduce_algo_name(ran), p, over ? "true" : "false",
                 sizes[s], lat * 1e6, pred * 1e6, pred > 0 ? lat / pred : 0, alg / 1e9, bus / 1e9);
        } else {
          char name[64], ranks_s[16], ratio[16];
          if (algos[a] == FL_ALLREDUCE_AUTO) snprintf(name, sizeof name, "auto(%s)", fl_allreduce_algo_name(ran));
          else snprintf(name, sizeof name, "%s", fl_allreduce_algo_name(algos[a]));
          snprintf(ranks_s, sizeof ranks_s, "%d%s", p, over ? "*" : "");
          snprintf(ratio, sizeof ratio, pred > 0 ? "%.2f" : "-", pred > 0 ? lat / pred : 0);
          printf("%-5s %-26s %8s %12.1f %10.1f %8s %10.3f %10.3f\n", ranks_s, name, size_name(sizes[s]),
                 lat * 1e6, pred * 1e6, ratio, alg / 1e9, bus / 1e9);
        }
      }
  }
  if (!o.json && cores < 4) printf("* oversubscribed: 4 ranks on %d cores\n", cores);
  if (o.cuda) print_cuda(&o, ranks, cuda_res);

  /* Beside the peers: auto and each peer per size. */
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    for (int j = 0; j < NPEERS; j++) {
      for (int s = 0; s < nsizes; s++) {
        if (peer_med[k][j][s] < 0 || !o.json) continue;
        printf("{\"bench\": \"peer\", \"peer\": \"%s\", \"ranks\": %d, \"oversubscribed\": %s, \"bytes\": %zu, "
               "\"latency_us\": %.2f, \"flint_auto_us\": %.2f}\n", peer_names[j], p, p > cores ? "true" : "false",
               sizes[s], peer_med[k][j][s] * 1e6, res[k].med[AUTO_ROW][s] * 1e6);
      }
      if (notes[k][j][0]) {
        if (o.json)
          printf("{\"bench\": \"peer\", \"peer\": \"%s\", \"ranks\": %d, \"note\": \"%s\"}\n", peer_names[j], p,
                 strchr(notes[k][j], '"') ? "failed (see stderr)" : notes[k][j]);
        else
          fprintf(stderr, BENCH_NAME ": %d ranks, %s: %s\n", p, peer_names[j], notes[k][j]);
      }
    }
    if (o.json) continue;
    printf("\n%d ranks%s, latency in us    %12s %14s %14s %14s %10s\n", p, p > cores ? " (oversubscribed)" : "",
           "flint auto", peer_names[0], peer_names[1], peer_names[2], "auto/shm");
    for (int s = 0; s < nsizes; s++) {
      char cells[NPEERS][24], ratio[16] = "-";
      for (int j = 0; j < NPEERS; j++) {
        if (peer_med[k][j][s] < 0) snprintf(cells[j], sizeof cells[j], "-");
        else snprintf(cells[j], sizeof cells[j], "%.1f", peer_med[k][j][s] * 1e6);
      }
      if (peer_med[k][0][s] > 0) snprintf(ratio, sizeof ratio, "%.2f", res[k].med[AUTO_ROW][s] / peer_med[k][0][s]);
      char autoc[48];
      snprintf(autoc, sizeof autoc, "%.1f %s", res[k].med[AUTO_ROW][s] * 1e6,
               fl_allreduce_algo_name((fl_allreduce_algo)res[k].picked[s]));
      printf("  %-8s %41s %14s %14s %14s %10s\n", size_name(sizes[s]), autoc, cells[0], cells[1], cells[2], ratio);
    }
  }

  /* The targets. */
  if (!o.json) {
    puts("");
    bench_columns c = {8, 66, 8, 8};
    bench_print_row(&c, "bench", "metric", "value", "target", "met");
    puts("-------- ------------------------------------------------------------------ --------  -------- ---");
  }
  char metric[160];
  static const struct {
    size_t bytes;
    double limit;
    const char *target;
  } vs_mpi[] = {{8, 2.0, "<= 2"}, {4u << 10, 1.5, "<= 1.5"}};
  for (size_t i = 0; i < sizeof vs_mpi / sizeof *vs_mpi; i++) {
    int s = size_index(vs_mpi[i].bytes);
    if (s < 0 || peer_med[0][0][s] <= 0) continue;
    double r = res[0].med[AUTO_ROW][s] / peer_med[0][0][s];
    snprintf(metric, sizeof metric, "2 ranks, %s: flint auto / Open MPI shm", size_name(sizes[s]));
    target_row(&o, metric, r, vs_mpi[i].target, r <= vs_mpi[i].limit);
  }
  for (int s = 0; s < nsizes; s++) {
    if (sizes[s] < (256u << 10) || peer_med[0][0][s] <= 0) continue;
    double r = res[0].med[AUTO_ROW][s] / peer_med[0][0][s];
    snprintf(metric, sizeof metric, "2 ranks, %s: flint auto / Open MPI shm", size_name(sizes[s]));
    target_row(&o, metric, r, "<= 1", r <= 1.0);
  }
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    for (int s = 0; s < nsizes; s++) {
      double best = -1;
      int besta = 0;
      for (int a = 0; a < AUTO_ROW; a++)
        if (res[k].med[a][s] > 0 && (best < 0 || res[k].med[a][s] < best)) best = res[k].med[a][s], besta = a;
      if (best <= 0 || p != 4) continue;
      double r = res[k].med[AUTO_ROW][s] / best;
      snprintf(metric, sizeof metric, "%d ranks%s, %s: auto (%s) / best (%s)", p, p > cores ? " (oversub.)" : "",
               size_name(sizes[s]), fl_allreduce_algo_name((fl_allreduce_algo)res[k].picked[s]),
               fl_allreduce_algo_name(algos[besta]));
      target_row(&o, metric, r, "<= 1.1", r <= 1.1);
    }
  }
  for (int k = 0; k < 2; k++) {
    int within = 0, rows = 0;
    double worst = 0;
    for (int a = 0; a < AUTO_ROW; a++)
      for (int s = 0; s < nsizes; s++) {
        double lat = res[k].med[a][s], pred = res[k].pred[a][s];
        if (lat <= 0 || pred <= 0) continue;
        double r = lat / pred;
        rows++;
        within += r >= 0.75 && r <= 1.25;
        double off = r > 1 ? r : 1 / r;
        if (off > worst) worst = off;
      }
    snprintf(metric, sizeof metric, "%d ranks: share of algorithm x size within 25%% of the model (worst %.1fx)",
             ranks[k], worst);
    target_row(&o, metric, rows ? (double)within / rows : 0, "1.000", rows && within == rows);
  }
  for (int k = 0; k < 2; k++) {
    int p = ranks[k];
    double bus = (double)sizes[last] / res[k].med[0][last] * 2.0 * (p - 1) / p;
    double ratio = bus / p2p_bw, dratio = bus / ((double)sizes[last] / dup[last]);
    if (o.json) {
      printf("{\"bench\": \"ring_vs_p2p\", \"ranks\": %d, \"bytes\": %zu, \"ring_busbw_gbps\": %.4f, "
             "\"p2p_gbps\": %.4f, \"ratio\": %.3f, \"duplex_gbps\": %.4f, \"duplex_ratio\": %.3f, "
             "\"target\": \"ratio >= 0.8\", \"met\": %s}\n",
             p, sizes[last], bus / 1e9, p2p_bw / 1e9, ratio, (double)sizes[last] / dup[last] / 1e9, dratio,
             ratio >= 0.8 ? "true" : "false");
    } else {
      snprintf(metric, sizeof metric, "ring busbw / p2p one-way, %d ranks, %s", p, size_name(sizes[last]));
      target_row(&o, metric, ratio, ">= 0.8", ratio >= 0.8);
    }
  }
  return 0;
}
