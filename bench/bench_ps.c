/*
 * bench_ps: the parameter server's push+pull bandwidth (issue 35) against the same model's
 * bytes through flint's ring allreduce and through plain loopback TCP, all in one run.
 *
 *   bench_ps [--json] [--quick] [--floats N]
 *
 * Every party is a process on this machine, joined over 127.0.0.1. The model is --floats
 * floats (default 10M: 40 MB); each row takes 15 samples (--quick: 3) after an untimed one
 * that warms connections and buffers, and one sample moves every worker's share once:
 *
 *   ps              4 server processes (ps_server_start), a dense table of N keys x width 1
 *                   with update `add`, one shard on each; 4 worker processes, each with its
 *                   own ps_client. A sample: every worker pushes its whole gradient
 *                   (ps_client_push_range) and pulls the whole model (ps_client_pull_range),
 *                   both queued at once (a shard's channel keeps them in order, so the pull
 *                   sees the worker's push) and both waited. The parent starts the workers
 *                   together through pipes; the sample's time is the slowest worker's.
 *   ps replicated   the same table with every shard backed up on the next server: each push
 *                   is forwarded to the backup before it is acknowledged. Its samples
 *                   alternate with the ps row's, so a slow spell of this shared machine hits
 *                   both alike.
 *   ring allreduce  the host backend's ring allreduce (sum) of N floats over 4 rank
 *                   processes on the cpu device (as bench_allreduce makes its ranks); a
 *                   sample is barrier, allreduce, timed on each rank, the slowest rank's.
 *                   single_copy_peers says how many of a rank's peers the backend reached
 *                   by a single copy (process_vm_readv, FLINT_COMM_SINGLE_COPY) instead of
 *                   its sockets: on one host, all of them by default.
 *   ring (sockets)  for reference, the same with single copy off in the ranks, so that every
 *                   ring step crosses loopback TCP as the parameter server's bytes do.
 *   loopback tcp    one TCP connection between two processes with the communicator's socket
 *                   options (bench_allreduce's p2p baseline): for each of the 4 workers in
 *                   turn, N x 4 bytes out and the same back (read whole, then answered), so a
 *                   sample carries the bytes of a ps sample, all of them on one connection.
 *                   It runs before and after the other rows and keeps the faster median.
 *
 * Columns: round_ms, the median sample; MB_worker, the bytes one worker (rank) sent plus
 * received in a sample (ps: its client's counters, headers included; ring: 2 x 2(p-1)/p x
 * N x 4; tcp: 2 x N x 4 per worker's turn); GBps_worker, MB_worker / round_ms; GBps_all, every
 * worker's bytes / round_ms. The ratios ps / ring and ps / tcp (and, for reference, ps / ring
 * over sockets and replicated / plain) compare round times. Issue 35
 * sets no target for this row: the figures are measured, not judged. After the samples,
 * worker 0 pulls both tables and checks every value against the pushes' exact sum.
 *
 * Output: a table, or with --json one JSON object per row. Exit 1 on an engine error (every
 * child is then killed and reaped), 2 on a bad option.
 */
#define BENCH_NAME "bench_ps"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "flint/gpu.h"
#include "gpu/comm/comm.h"
#include "ps/ps.h"

#define SHARDS 4
#define WORKERS 4
#define MAX_SAMPLES 32
#define MAX_FLOATS ((uint64_t)1 << 26) /* 256 MB a model: two per worker, four workers */
#define CHILD_TIMEOUT_MS 300000        /* any one answer from a child; a round takes seconds */
#define PS_TIMEOUT_MS 120000
#define TABLE_PLAIN 1
#define TABLE_REPLICATED 2

typedef struct options {
  bool json;
  uint64_t floats;
  int samples;
} options;

/* ---- children: every process the parent forks is listed, so that any exit kills and reaps
 * them all, and a child closes the parent's pipe ends it inherited (so that closing one in
 * the parent is an end of file to the one child meant) ---- */

#define MAX_CHILDREN 16
#define MAX_PARENT_FDS 32
static pid_t children[MAX_CHILDREN];
static int nchildren;
static int parent_fds[MAX_PARENT_FDS];
static int nparent_fds;

static void keep_fd(int fd) {
  if (nparent_fds < MAX_PARENT_FDS) parent_fds[nparent_fds++] = fd;
}

static void close_fd(int fd) {
  for (int i = 0; i < nparent_fds; i++)
    if (parent_fds[i] == fd) parent_fds[i] = parent_fds[--nparent_fds];
  close(fd);
}

/* A failed system call, named; 1 for the caller to return. */
static int sys_fail(const char *what) {
  fprintf(stderr, BENCH_NAME ": %s: %s\n", what, strerror(errno));
  return 1;
}

/* fork(); in the child, it dies with the parent and holds none of the parent's pipe ends. */
static pid_t spawn(void) {
  if (nchildren == MAX_CHILDREN) return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid(), pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    for (int i = 0; i < nparent_fds; i++) close(parent_fds[i]);
    nparent_fds = 0;
    nchildren = 0;
  } else if (pid > 0) {
    children[nchildren++] = pid;
  }
  return pid;
}

/* Waits up to timeout_ms for the child to exit (then kills it); 0 when it exited with 0. */
static int reap(pid_t pid, int timeout_ms) {
  int status = 0;
  pid_t r = 0;
  for (int waited = 0; (r = waitpid(pid, &status, WNOHANG)) == 0 && waited < timeout_ms; waited += 10) usleep(10000);
  if (r == 0) {
    kill(pid, SIGKILL);
    r = waitpid(pid, &status, 0);
    fprintf(stderr, BENCH_NAME ": child %d did not exit within %d ms; killed\n", (int)pid, timeout_ms);
    status = 1;
  }
  for (int i = 0; i < nchildren; i++)
    if (children[i] == pid) children[i] = children[--nchildren];
  return r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static void kill_children(void) {
  for (int i = 0; i < nchildren; i++) kill(children[i], SIGKILL);
  for (int i = 0; i < nchildren; i++) waitpid(children[i], NULL, 0);
  nchildren = 0;
}

/* read_all with a bound: a child that hangs fails the run instead of holding it forever. */
static int read_child(int fd, void *p, size_t n) {
  char *c = p;
  while (n) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    int r = poll(&pf, 1, CHILD_TIMEOUT_MS);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) fprintf(stderr, BENCH_NAME ": no answer from a child within %d ms\n", CHILD_TIMEOUT_MS);
    if (r <= 0) return -1;
    ssize_t got = read(fd, c, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    c += got, n -= (size_t)got;
  }
  return 0;
}

/* ---- servers ------------------------------------------------------------------------------ */

/* Serves until the parent closes (or writes to) ctl_fd. */
static int server_main(int port_fd, int ctl_fd) {
  ps_server *s;
  if (ps_server_start("127.0.0.1", 0, NULL, &s) != FL_OK) {
    fail_flint("ps_server_start");
    return 1;
  }
  int port = ps_server_port(s);
  int rc = bench_write_all(port_fd, &port, sizeof port) == 0 ? 0 : 1;
  close(port_fd);
  char c;
  while (rc == 0 && read(ctl_fd, &c, 1) < 0 && errno == EINTR) {
  }
  ps_server_stop(s);
  return rc;
}

/* ---- workers ------------------------------------------------------------------------------ */

enum { CMD_ROUND = 1, CMD_VERIFY, CMD_QUIT };

typedef struct worker_cmd {
  int32_t op, table; /* table: TABLE_PLAIN or TABLE_REPLICATED */
  float expect;      /* verify: every value of the model */
} worker_cmd;

typedef struct worker_reply {
  int32_t rc;
  double seconds;
  uint64_t bytes; /* sent + received by this worker's client in the round */
} worker_reply;

static int worker_main(const options *o, ps_map maps[2], uint32_t w, int cmd_fd, int reply_fd) {
  ps_client *c[2] = {NULL, NULL};
  size_t n = (size_t)o->floats;
  float *grads = malloc(n * sizeof *grads), *model = malloc(n * sizeof *model);
  int rc = 1;
  if (!grads || !model) {
    fprintf(stderr, BENCH_NAME ": worker %u: out of memory\n", w);
    goto done;
  }
  /* Small integers: their sums are exact in any order, so the check at the end is exact. */
  for (size_t i = 0; i < n; i++) grads[i] = (float)(w + 1), model[i] = 0;
  for (int t = 0; t < 2; t++)
    if (ps_client_create(&maps[t], w, NULL, PS_TIMEOUT_MS, &c[t]) != FL_OK) {
      fail_flint("ps_client_create");
      goto done;
    }
  for (;;) {
    worker_cmd cmd;
    if (bench_read_all(cmd_fd, &cmd, sizeof cmd) != 0) goto done; /* the parent went away */
    if (cmd.op == CMD_QUIT) break;
    ps_client *pc = c[cmd.table == TABLE_REPLICATED];
    worker_reply r = {.rc = 1};
    uint64_t push, pull;
    if (cmd.op == CMD_ROUND) {
      ps_client_stats s0 = ps_client_stats_get(pc);
      double t0 = now_s();
      if (ps_client_push_range(pc, 0, o->floats, grads, &push) != FL_OK) {
        fail_flint("ps_client_push_range");
      } else if (ps_client_pull_range(pc, 0, o->floats, model, &pull) != FL_OK) {
        fail_flint("ps_client_pull_range");
        ps_client_wait(pc, push, NULL);
      } else {
        fl_status st = ps_client_wait(pc, push, NULL);
        if (st != FL_OK) fail_flint("ps_client_wait (push)");
        fl_status st2 = ps_client_wait(pc, pull, NULL);
        if (st == FL_OK && st2 != FL_OK) fail_flint("ps_client_wait (pull)");
        r.seconds = now_s() - t0;
        ps_client_stats s1 = ps_client_stats_get(pc);
        r.bytes = s1.bytes_sent - s0.bytes_sent + s1.bytes_received - s0.bytes_received;
        r.rc = st == FL_OK && st2 == FL_OK ? 0 : 1;
      }
    } else if (cmd.op == CMD_VERIFY) {
      if (ps_client_pull_range(pc, 0, o->floats, model, &pull) != FL_OK || ps_client_wait(pc, pull, NULL) != FL_OK) {
        fail_flint("ps_client_pull_range (check)");
      } else {
        size_t bad = 0;
        while (bad < n && model[bad] == cmd.expect) bad++;
        if (bad < n)
          fprintf(stderr, BENCH_NAME ": table %d key %zu holds %g, not the pushes' sum %g\n", cmd.table, bad,
                  (double)model[bad], (double)cmd.expect);
        r.rc = bad < n;
      }
    }
    if (bench_write_all(reply_fd, &r, sizeof r) != 0 || r.rc != 0) goto done;
  }
  rc = 0;
done:
  for (int t = 0; t < 2; t++) ps_client_destroy(c[t]);
  free(grads);
  free(model);
  return rc;
}

typedef struct ps_group {
  pid_t servers[SHARDS], workers[WORKERS];
  int server_ctl[SHARDS]; /* the parent's write ends: closing one stops that server */
  int cmd[WORKERS], reply[WORKERS];
  ps_place places[2][SHARDS];
  ps_map maps[2];
} ps_group;

/* Forks the servers (each reports its port through a pipe), makes both tables, forks the
 * workers. The parent has no threads: the servers' and clients' live in the children. */
static int ps_group_start(const options *o, ps_group *g) {
  int ports[SHARDS];
  for (int s = 0; s < SHARDS; s++) {
    int pp[2], ctl[2];
    if (pipe(pp) != 0 || pipe(ctl) != 0) return sys_fail("pipe");
    pid_t pid = spawn();
    if (pid < 0) return sys_fail("fork");
    if (pid == 0) {
      close(pp[0]);
      close(ctl[1]);
      _exit(server_main(pp[1], ctl[0]));
    }
    g->servers[s] = pid;
    close(pp[1]);
    close(ctl[0]);
    g->server_ctl[s] = ctl[1];
    keep_fd(ctl[1]);
    int rc = read_child(pp[0], &ports[s], sizeof ports[s]);
    close(pp[0]);
    if (rc != 0) {
      fprintf(stderr, BENCH_NAME ": server %d did not report its port\n", s);
      return 1;
    }
  }
  for (int t = 0; t < 2; t++) {
    memset(g->places[t], 0, sizeof g->places[t]);
    for (int s = 0; s < SHARDS; s++) {
      snprintf(g->places[t][s].primary, PS_ADDRESS_MAX, "127.0.0.1:%d", ports[s]);
      if (t == 1) snprintf(g->places[t][s].backups[0], PS_ADDRESS_MAX, "127.0.0.1:%d", ports[(s + 1) % SHARDS]);
    }
    ps_table_spec spec = {.sparse = false, .keys = o->floats, .width = 1, .update = PS_UPDATE_INIT};
    spec.update.kind = PS_UPDATE_ADD;
    g->maps[t] = (ps_map){.table = t == 0 ? TABLE_PLAIN : TABLE_REPLICATED, .spec = spec, .shards = SHARDS,
                          .workers = WORKERS, .replication = PS_REPLICATION_PRIMARY_BACKUP, .places = g->places[t]};
    if (ps_table_create(&g->maps[t], NULL, PS_TIMEOUT_MS) != FL_OK) {
      fail_flint("ps_table_create");
      return 1;
    }
  }
  for (int w = 0; w < WORKERS; w++) {
    int cmd[2], reply[2];
    if (pipe(cmd) != 0 || pipe(reply) != 0) return sys_fail("pipe");
    pid_t pid = spawn();
    if (pid < 0) return sys_fail("fork");
    if (pid == 0) {
      close(cmd[1]);
      close(reply[0]);
      _exit(worker_main(o, g->maps, (uint32_t)w, cmd[0], reply[1]));
    }
    g->workers[w] = pid;
    close(cmd[0]);
    close(reply[1]);
    g->cmd[w] = cmd[1];
    g->reply[w] = reply[0];
    keep_fd(cmd[1]);
    keep_fd(reply[0]);
  }
  return 0;
}

/* Sends cmd to the given workers (all: -1) and collects their answers. */
static int ps_command(ps_group *g, int only, worker_cmd cmd, worker_reply out[WORKERS]) {
  for (int w = 0; w < WORKERS; w++)
    if ((only < 0 || w == only) && bench_write_all(g->cmd[w], &cmd, sizeof cmd) != 0) {
      fprintf(stderr, BENCH_NAME ": worker %d is gone: %s\n", w, strerror(errno));
      return 1;
    }
  int rc = 0;
  for (int w = 0; w < WORKERS; w++) {
    if (only >= 0 && w != only) continue;
    if (read_child(g->reply[w], &out[w], sizeof out[w]) != 0 || out[w].rc != 0) {
      fprintf(stderr, BENCH_NAME ": worker %d failed\n", w);
      rc = 1;
    }
  }
  return rc;
}

/* The workers quit, then the servers stop; 0 when every one exited cleanly. */
static int ps_group_stop(ps_group *g) {
  int rc = 0;
  worker_cmd quit = {.op = CMD_QUIT};
  for (int w = 0; w < WORKERS; w++) {
    if (bench_write_all(g->cmd[w], &quit, sizeof quit) != 0) rc = 1;
    close_fd(g->cmd[w]);
    close_fd(g->reply[w]);
  }
  for (int w = 0; w < WORKERS; w++) rc |= reap(g->workers[w], 60000);
  for (int s = 0; s < SHARDS; s++) close_fd(g->server_ctl[s]);
  for (int s = 0; s < SHARDS; s++) rc |= reap(g->servers[s], 60000);
  if (rc) fprintf(stderr, BENCH_NAME ": a parameter-server process did not exit cleanly\n");
  return rc;
}

typedef struct row {
  double round_s;    /* median sample */
  double bytes;      /* one worker's (rank's) bytes sent + received in a sample */
  int parties;       /* workers (ranks) whose bytes a sample carries */
  int single_copy;   /* ring: the peers a rank reaches by a single copy */
} row;

/* Both ps rows, their samples alternating; then the exact check of both tables. */
static int run_ps(const options *o, row *plain, row *replicated) {
  ps_group g;
  memset(&g, 0, sizeof g);
  if (ps_group_start(o, &g) != 0) return 1;
  double t[2][MAX_SAMPLES];
  double bytes[2] = {0, 0};
  worker_reply r[WORKERS];
  for (int i = -1; i < o->samples; i++) /* sample -1 warms the connections and buffers */
    for (int k = 0; k < 2; k++) {
      worker_cmd cmd = {.op = CMD_ROUND, .table = k == 0 ? TABLE_PLAIN : TABLE_REPLICATED};
      if (ps_command(&g, -1, cmd, r) != 0) return 1;
      double slowest = 0;
      for (int w = 0; w < WORKERS; w++) {
        if (r[w].seconds > slowest) slowest = r[w].seconds;
        if ((double)r[w].bytes > bytes[k]) bytes[k] = (double)r[w].bytes;
      }
      if (i >= 0) t[k][i] = slowest;
    }
  /* Every worker pushed w + 1 to every key in each of samples + 1 rounds. */
  float expect = 0;
  for (int w = 0; w < WORKERS; w++) expect += (float)(w + 1) * (float)(o->samples + 1);
  for (int k = 0; k < 2; k++) {
    worker_cmd cmd = {.op = CMD_VERIFY, .table = k == 0 ? TABLE_PLAIN : TABLE_REPLICATED, .expect = expect};
    if (ps_command(&g, 0, cmd, r) != 0) return 1;
  }
  if (ps_group_stop(&g) != 0) return 1;
  *plain = (row){bench_median(t[0], o->samples), bytes[0], WORKERS, 0};
  *replicated = (row){bench_median(t[1], o->samples), bytes[1], WORKERS, 0};
  return 0;
}

/* ---- ring allreduce ------------------------------------------------------------------------- */

typedef struct rank_times {
  double t[MAX_SAMPLES];
  int single_copy;
} rank_times;

static int rank_main(const options *o, fl_comm_endpoint *ep, int rank, const char **addrs, int out_fd) {
  fl_comm *comm = NULL;
  fl_device *dev = NULL;
  fl_tensor *t = NULL;
  rank_times rt;
  memset(&rt, 0, sizeof rt);
  int rc = 1;
  int64_t n = (int64_t)o->floats;
  if (fl_comm_host_create(ep, rank, WORKERS, addrs, 30000, &comm) != FL_OK) {
    fail_flint("fl_comm_host_create");
    goto done;
  }
  if (fl_comm_set_allreduce_algo(comm, FL_ALLREDUCE_RING) != FL_OK) {
    fail_flint("fl_comm_set_allreduce_algo");
    goto done;
  }
  if (fl_device_open(FL_DEVICE_CPU, 0, &dev) != FL_OK) {
    fail_flint("fl_device_open");
    goto done;
  }
  if (fl_tensor_create(dev, 1, &n, &t) != FL_OK) {
    fail_flint("fl_tensor_create");
    goto done;
  }
  rt.single_copy = comm_host_single_copy_peers(comm);
  for (int i = -1; i < o->samples; i++) { /* sample -1 warms the connections and buffers */
    if (fl_comm_barrier(comm) != FL_OK) {
      fail_flint("fl_comm_barrier");
      goto done;
    }
    double t0 = now_s();
    if (fl_comm_allreduce(comm, t, FL_REDUCE_SUM) != FL_OK) {
      fail_flint("fl_comm_allreduce");
      goto done;
    }
    if (i >= 0) rt.t[i] = now_s() - t0;
  }
  rc = bench_write_all(out_fd, &rt, sizeof rt) == 0 ? 0 : 1;
done:
  fl_tensor_destroy(t);
  fl_comm_destroy(comm);
  fl_device_close(dev);
  return rc;
}

/* sockets: the ranks move every ring step over their TCP connections (FLINT_COMM_SINGLE_COPY
 * off), as the parameter server's bytes travel. */
static int run_ring(const options *o, bool sockets, row *out) {
  fl_comm_endpoint *eps[WORKERS] = {NULL};
  char addr[WORKERS][96];
  const char *addrs[WORKERS];
  for (int r = 0; r < WORKERS; r++) {
    if (fl_comm_listen("127.0.0.1", &eps[r]) != FL_OK) {
      fail_flint("fl_comm_listen");
      for (int q = 0; q < r; q++) fl_comm_endpoint_destroy(eps[q]);
      return 1;
    }
    snprintf(addr[r], sizeof addr[r], "%s", fl_comm_endpoint_address(eps[r]));
    addrs[r] = addr[r];
  }
  int fds[WORKERS];
  pid_t pids[WORKERS];
  int started = 0, rc = 0;
  for (; started < WORKERS; started++) {
    int r = started, pp[2];
    if (pipe(pp) != 0 || (pids[r] = spawn()) < 0) {
      rc = sys_fail("pipe or fork");
      break;
    }
    if (pids[r] == 0) {
      close(pp[0]);
      for (int q = 0; q < WORKERS; q++)
        if (q != r) fl_comm_endpoint_destroy(eps[q]);
      if (sockets && setenv("FLINT_COMM_SINGLE_COPY", "0", 1) != 0) _exit(1);
      _exit(rank_main(o, eps[r], r, addrs, pp[1]));
    }
    close(pp[1]);
    fds[r] = pp[0];
    keep_fd(pp[0]);
  }
  for (int r = 0; r < WORKERS; r++) fl_comm_endpoint_destroy(eps[r]);
  if (rc) return 1;
  rank_times all[WORKERS];
  for (int r = 0; r < WORKERS; r++)
    if (read_child(fds[r], &all[r], sizeof all[r]) != 0) rc = 1;
  for (int r = 0; r < WORKERS; r++) {
    close_fd(fds[r]);
    rc |= reap(pids[r], 60000);
  }
  if (rc) {
    fprintf(stderr, BENCH_NAME ": a ring allreduce rank failed\n");
    return 1;
  }
  double v[MAX_SAMPLES];
  for (int i = 0; i < o->samples; i++) {
    v[i] = 0;
    for (int r = 0; r < WORKERS; r++)
      if (all[r].t[i] > v[i]) v[i] = all[r].t[i];
  }
  double model = (double)o->floats * sizeof(float);
  *out = (row){bench_median(v, o->samples), 2.0 * 2.0 * (WORKERS - 1) / WORKERS * model, WORKERS, all[0].single_copy};
  return 0;
}

/* ---- loopback tcp --------------------------------------------------------------------------- */

/* One end: the worker side sends each worker's bytes and reads them back, the other end
 * reads them whole and sends them back. The worker side reports its sample times. */
static int tcp_child(const options *o, int lfd, bool worker_side, int out_fd) {
  int fd;
  if (worker_side) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) return 1;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 1;
    comm_host_socket_options(fd);
    if (connect(fd, (struct sockaddr *)&sa, sl) != 0) return 1;
  } else {
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) return 1;
    comm_host_socket_options(fd);
  }
  close(lfd);
  size_t bytes = (size_t)o->floats * sizeof(float);
  char *buf = malloc(bytes);
  if (!buf) return 1;
  memset(buf, 1, bytes);
  double t[MAX_SAMPLES];
  int rc = 0;
  for (int i = -1; i < o->samples && rc == 0; i++) {
    double t0 = now_s();
    for (int w = 0; w < WORKERS && rc == 0; w++) {
      if (worker_side)
        rc = bench_write_all(fd, buf, bytes) || bench_read_all(fd, buf, bytes);
      else
        rc = bench_read_all(fd, buf, bytes) || bench_write_all(fd, buf, bytes);
    }
    if (i >= 0) t[i] = now_s() - t0;
  }
  close(fd);
  free(buf);
  if (rc == 0 && worker_side) rc = bench_write_all(out_fd, t, sizeof t);
  return rc ? 1 : 0;
}

static int run_tcp(const options *o, row *out) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (lfd < 0 || (comm_host_socket_options(lfd), bind(lfd, (struct sockaddr *)&sa, sizeof sa)) != 0 ||
      listen(lfd, 4) != 0) {
    perror(BENCH_NAME ": tcp listen");
    if (lfd >= 0) close(lfd);
    return 1;
  }
  int pp[2];
  if (pipe(pp) != 0) {
    close(lfd);
    return sys_fail("pipe");
  }
  pid_t pids[2];
  int rc = 0, started = 0;
  for (; started < 2; started++) {
    if ((pids[started] = spawn()) < 0) {
      rc = sys_fail("fork");
      break;
    }
    if (pids[started] == 0) {
      close(pp[0]);
      if (started != 0) close(pp[1]); /* only the worker side reports */
      _exit(tcp_child(o, lfd, started == 0, pp[1]));
    }
  }
  close(pp[1]);
  close(lfd);
  double t[MAX_SAMPLES];
  keep_fd(pp[0]);
  if (rc == 0 && read_child(pp[0], t, sizeof t) != 0) rc = 1;
  close_fd(pp[0]);
  for (int k = 0; k < started; k++) rc |= reap(pids[k], 60000);
  if (rc) {
    fprintf(stderr, BENCH_NAME ": the loopback tcp baseline failed\n");
    return 1;
  }
  *out = (row){bench_median(t, o->samples), 2.0 * (double)o->floats * sizeof(float), WORKERS, 0};
  return 0;
}

/* ---- output ----------------------------------------------------------------------------------- */

static void print_row(const options *o, const char *name, const row *r) {
  double mb = r->bytes / 1e6, per = r->bytes / r->round_s / 1e9, all = per * r->parties;
  if (o->json) {
    printf("{\"bench\": \"ps_bandwidth\", \"row\": \"%s\", \"floats\": %llu, \"shards\": %d, \"workers\": %d, "
           "\"samples\": %d, \"round_ms\": %.3f, \"bytes_per_worker\": %.0f, \"gbps_per_worker\": %.4f, "
           "\"gbps_all\": %.4f",
           name, (unsigned long long)o->floats, SHARDS, r->parties, o->samples, r->round_s * 1e3, r->bytes, per, all);
    if (strncmp(name, "ring", 4) == 0) printf(", \"single_copy_peers\": %d", r->single_copy);
    puts("}");
  } else {
    printf("%-16s %10.1f %10.1f %12.3f %9.3f\n", name, r->round_s * 1e3, mb, per, all);
  }
}

int main(int argc, char **argv) {
  options o = {.floats = 10000000, .samples = 15};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      o.json = true;
    } else if (strcmp(argv[i], "--quick") == 0) {
      o.samples = 3;
    } else if (strcmp(argv[i], "--floats") == 0 && i + 1 < argc) {
      if (!parse_count(argv[++i], MAX_FLOATS, &o.floats) || o.floats < SHARDS) {
        fprintf(stderr, BENCH_NAME ": --floats takes a count from %d (a key a shard) to %llu, not '%s'\n", SHARDS,
                (unsigned long long)MAX_FLOATS, argv[i]);
        return 2;
      }
    } else {
      fprintf(stderr, BENCH_NAME ": bad option '%s'\nusage: " BENCH_NAME " [--json] [--quick] [--floats N]\n",
              argv[i]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  atexit(kill_children); /* any exit of the parent; the children leave by _exit */

  row tcp, tcp2, ps, psr, ring, ring_tcp;
  if (run_tcp(&o, &tcp) != 0 || run_ps(&o, &ps, &psr) != 0 || run_ring(&o, false, &ring) != 0 ||
      run_ring(&o, true, &ring_tcp) != 0 || run_tcp(&o, &tcp2) != 0)
    return 1;
  if (tcp2.round_s < tcp.round_s) tcp = tcp2;

  double r_ring = ps.round_s / ring.round_s, r_tcp = ps.round_s / tcp.round_s;
  double rr_ring = psr.round_s / ring.round_s, r_repl = psr.round_s / ps.round_s;
  double r_ring_tcp = ps.round_s / ring_tcp.round_s;
  if (o.json) {
    print_row(&o, "ps", &ps);
    print_row(&o, "ps replicated", &psr);
    print_row(&o, "ring allreduce", &ring);
    print_row(&o, "ring (sockets)", &ring_tcp);
    print_row(&o, "loopback tcp", &tcp);
    printf("{\"bench\": \"ps_ratio\", \"floats\": %llu, \"ps_over_allreduce\": %.3f, \"ps_over_tcp\": %.3f, "
           "\"replicated_over_allreduce\": %.3f, \"replicated_over_ps\": %.3f, "
           "\"ps_over_allreduce_sockets\": %.3f, \"target\": \"none\"}\n",
           (unsigned long long)o.floats, r_ring, r_tcp, rr_ring, r_repl, r_ring_tcp);
    return 0;
  }
  printf("flint bench_ps: %llu floats (%.1f MB) over %d shards and %d workers on one host, %d cores; "
         "median of %d samples (slowest worker each)\n\n",
         (unsigned long long)o.floats, (double)o.floats * 4 / 1e6, SHARDS, WORKERS,
         (int)sysconf(_SC_NPROCESSORS_ONLN), o.samples);
  printf("%-16s %10s %10s %12s %9s\n", "row", "round_ms", "MB_worker", "GBps_worker", "GBps_all");
  puts("---------------- ---------- ---------- ------------ ---------");
  print_row(&o, "ps", &ps);
  print_row(&o, "ps replicated", &psr);
  print_row(&o, "ring allreduce", &ring);
  print_row(&o, "ring (sockets)", &ring_tcp);
  print_row(&o, "loopback tcp", &tcp);
  printf("(ring allreduce: %d of a rank's %d peers reached by a single copy; ring (sockets): %d)\n",
         ring.single_copy, WORKERS - 1, ring_tcp.single_copy);
  puts("");
  bench_columns c = {8, 34, 8, 8};
  bench_print_row(&c, "bench", "metric", "value", "target", "met");
  puts("-------- ---------------------------------- --------  -------- ---");
  char v[32];
  snprintf(v, sizeof v, "%.3f", r_ring);
  bench_print_row(&c, "ps_ratio", "ps / ring allreduce (time)", v, "(none)", "-");
  snprintf(v, sizeof v, "%.3f", r_tcp);
  bench_print_row(&c, "", "ps / loopback tcp (time)", v, "(none)", "-");
  snprintf(v, sizeof v, "%.3f", r_ring_tcp);
  bench_print_row(&c, "", "ps / ring (sockets)", v, "(ref)", "-");
  snprintf(v, sizeof v, "%.3f", rr_ring);
  bench_print_row(&c, "", "ps replicated / ring allreduce", v, "(none)", "-");
  snprintf(v, sizeof v, "%.3f", r_repl);
  bench_print_row(&c, "", "ps replicated / ps", v, "(none)", "-");
  return 0;
}
