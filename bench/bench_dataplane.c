/*
 * bench_dataplane: throughput of net/dataplane*.c against a plain TCP copy over loopback.
 *
 *   bench_dataplane [--json] [--mb N] [--chunk-mb N] [--runs N] [--no-tls]
 *
 * 1. dataplane_fetch_100MB: a block server on 127.0.0.1 (port 0) serves one object of --mb
 *    MB (default 100, MB = 10^6 bytes; pseudo-random bytes) from memory: its serve callback
 *    copies the range asked for into the response buffer, as a block store reading a cached
 *    block would. One thread fetches the whole object in --chunk-mb MiB requests (default
 *    4), sequentially, each appended to one destination buffer that is reserved once before
 *    the runs (so page faults are not timed). Timed: from the first request to the last
 *    byte of the last response. The client checks each payload's CRC32C and the server
 *    computes it, so both checksums are inside the time. The first fetch of the whole object
 *    is an untimed warm-up (it opens the connection, which the timed runs then reuse).
 * 2. dataplane_tls_fetch_100MB: the same with FLINT_TLS on at both ends (a second server
 *    and client; certificates made by scripts/make-tls-certs in a temporary folder, so the
 *    openssl command is needed), so that the cost of encryption shows beside row 1: TLS 1.3
 *    with OpenSSL's default cipher (AES-GCM where the CPU has AES instructions), both
 *    checksums still on. Reported with its ratio to tcp and to row 1. --no-tls leaves it out.
 * 3. tcp_copy_100MB: the baseline, in the same process and run: the same bytes sent by one
 *    thread with blocking send() on a connected loopback socket and received by another with
 *    blocking recv() into a pre-faulted buffer; no framing, no checksum, no copy on the
 *    sending side beyond the kernel's. Timed from the moment both threads are ready (the
 *    connection is set up before) to the last byte received.
 * Each side runs --runs times (default 10), alternating, and the best time of each is
 * reported, with MB/s (10^6 bytes per second) and the ratio dataplane / tcp (target >= 0.7;
 * the TLS row has none: it measures).
 * After every run the received bytes are compared with the object; a difference is exit 1.
 *
 * Output: a table on stdout, or with --json one JSON object per row (the same figures) and
 * nothing else on stdout. Exit status: 0 when the runs completed with the right bytes (a
 * missed target is reported, not an error); 1 on an error or wrong bytes; 2 on a bad option.
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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "tests/tls_certs.h" /* the certificates the TLS tests use */

#define BENCH_NAME "bench_dataplane"
#include "bench_util.h"

#define TARGET_RATIO 0.7
#define BENCH_COLUMN 26

typedef struct options {
  bool json, tls;
  uint64_t mb, chunk_mb, runs;
} options;

typedef struct object {
  uint8_t *data;
  size_t len;
} object;

static fl_status serve_object(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                              uint64_t *total) {
  const object *o = arg;
  if (req->offset > o->len) return fl_set_error(FL_EINVAL, "offset beyond the object");
  uint64_t len = req->len ? req->len : o->len - req->offset;
  if (len > o->len - req->offset) len = o->len - req->offset;
  *total = o->len;
  return fl_buf_append(out, o->data + req->offset, len);
}

/* ---- tcp_copy -------------------------------------------------------------------------- */

typedef struct sender {
  int fd;
  const object *obj;
  pthread_barrier_t *start;
  int err;
} sender;

static void *sender_main(void *arg) {
  sender *s = arg;
  pthread_barrier_wait(s->start);
  size_t off = 0;
  while (off < s->obj->len) {
    ssize_t n = send(s->fd, s->obj->data + off, s->obj->len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      s->err = errno ? errno : EPIPE;
      return NULL;
    }
    off += (size_t)n;
  }
  return NULL;
}

/* One timed copy; returns seconds, or a negative value on failure. */
static double tcp_copy(const object *obj, uint8_t *dst) {
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
  sender s = {afd, obj, &start, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, sender_main, &s) != 0) {
    pthread_barrier_destroy(&start);
    goto done;
  }
  pthread_barrier_wait(&start);
  double t0 = now_s();
  size_t got = 0;
  while (got < obj->len) {
    ssize_t n = recv(cfd, dst + got, obj->len - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  double t1 = now_s();
  pthread_join(th, NULL);
  pthread_barrier_destroy(&start);
  if (got == obj->len && s.err == 0) secs = t1 - t0;
done:
  if (afd >= 0) close(afd);
  if (cfd >= 0) close(cfd);
  if (lfd >= 0) close(lfd);
  return secs;
}

/* ---- dataplane_fetch ------------------------------------------------------------------- */

static double dataplane_fetch(dp_client *c, const char *peer, const object *obj, size_t chunk,
                              fl_buf *dst) {
  dst->len = 0;
  double t0 = now_s();
  for (size_t off = 0; off < obj->len; off += chunk) {
    dp_request r = {.kind = DP_BLOCK, .key = {1}, .offset = off, .len = chunk};
    if (dp_fetch(c, peer, &r, 0, dst, NULL) != FL_OK) {
      fail_flint("dp_fetch");
      return -1;
    }
  }
  return now_s() - t0;
}

/* ---- output ---------------------------------------------------------------------------- */

static const bench_columns columns = {BENCH_COLUMN, 20, 16, 10};

static void print_row(const char *bench, const char *metric, const char *value, const char *target,
                      const char *met) {
  bench_print_row(&columns, bench, metric, value, target, met);
}

static const char usage_text[] =
    "usage: bench_dataplane [--json] [--mb N] [--chunk-mb N] [--runs N] [--no-tls]\n"
    "  --json        one JSON object per row instead of a table\n"
    "  --mb N        object size in MB (10^6 bytes; default 100)\n"
    "  --chunk-mb N  bytes per request in MiB (default 4)\n"
    "  --runs N      timed runs of each side (default 10)\n"
    "  --no-tls      leave out the TLS row (it needs the openssl command)\n"
    "  --help        this text\n";

/* A server and a client, with FLINT_TLS on (certificates in `certs`) or off whatever the
 * environment says, and the peer name of the server. */
static bool start_pair(object *obj, const char *certs, dp_server **server, dp_client **client,
                       char *peer, size_t cap) {
  if (certs) tls_env_on(certs);
  else setenv("FLINT_TLS", "0", 1);
  bool ok = true;
  if (dp_server_start("127.0.0.1", 0, NULL, serve_object, obj, server) != FL_OK) {
    fail_flint("dp_server_start");
    ok = false;
  } else if (dp_client_create(NULL, client) != FL_OK) {
    fail_flint("dp_client_create");
    ok = false;
  }
  tls_env_off();
  if (ok) snprintf(peer, cap, "127.0.0.1:%d", dp_server_port(*server));
  return ok;
}

/* One timed fetch of the whole object, checked; the time, or < 0 on failure. */
static double checked_fetch(dp_client *c, const char *peer, object *obj, size_t chunk, fl_buf *dst) {
  double t = dataplane_fetch(c, peer, obj, chunk, dst);
  if (t >= 0 && (dst->len != obj->len || memcmp(dst->data, obj->data, obj->len) != 0)) {
    fprintf(stderr, "bench_dataplane: fetched bytes differ from the object\n");
    return -1;
  }
  return t;
}

int main(int argc, char **argv) {
  options o = {false, true, 100, 4, 10};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_text, stdout);
      return 0;
    }
    if (strcmp(argv[i], "--json") == 0) {
      o.json = true;
      continue;
    }
    if (strcmp(argv[i], "--no-tls") == 0) {
      o.tls = false;
      continue;
    }
    uint64_t *dst = strcmp(argv[i], "--mb") == 0         ? &o.mb
                    : strcmp(argv[i], "--chunk-mb") == 0 ? &o.chunk_mb
                    : strcmp(argv[i], "--runs") == 0     ? &o.runs
                                                         : NULL;
    if (!dst) {
      fprintf(stderr, "bench_dataplane: unknown option '%s'\n%s", argv[i], usage_text);
      return 2;
    }
    if (i + 1 >= argc || !parse_count(argv[i + 1], 4096, dst)) {
      fprintf(stderr, "bench_dataplane: %s needs a whole number in 1..4096\n%s", argv[i],
              usage_text);
      return 2;
    }
    i++;
  }

  int rc = 1;
  object obj = {NULL, (size_t)o.mb * 1000000};
  size_t chunk = (size_t)o.chunk_mb << 20;
  uint8_t *tcp_dst = NULL;
  fl_buf dp_dst = FL_BUF_INIT;
  dp_server *server = NULL, *tls_server = NULL;
  dp_client *client = NULL, *tls_client = NULL;
  char certs[256] = "";
  obj.data = malloc(obj.len);
  tcp_dst = malloc(obj.len);
  if (!obj.data || !tcp_dst || fl_buf_reserve(&dp_dst, obj.len) != FL_OK) {
    fprintf(stderr, "bench_dataplane: out of memory\n");
    goto done;
  }
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= obj.len; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(obj.data + i, &x, 8);
  }
  memset(tcp_dst, 0, obj.len);
  memset(dp_dst.data, 0, obj.len);

  char peer[64], tls_peer[64];
  if (!start_pair(&obj, NULL, &server, &client, peer, sizeof peer)) goto done;
  if (dataplane_fetch(client, peer, &obj, chunk, &dp_dst) < 0) goto done; /* warm-up */
  if (o.tls) {
    if (!tls_make_certs(certs, sizeof certs, NULL)) {
      fprintf(stderr, "bench_dataplane: cannot make TLS certificates (--no-tls runs without)\n");
      certs[0] = '\0';
      goto done;
    }
    if (!start_pair(&obj, certs, &tls_server, &tls_client, tls_peer, sizeof tls_peer)) goto done;
    if (dataplane_fetch(tls_client, tls_peer, &obj, chunk, &dp_dst) < 0) goto done; /* warm-up */
  }

  double dp_best = 1e30, tls_best = 1e30, tcp_best = 1e30;
  for (uint64_t run = 0; run < o.runs; run++) {
    double t = checked_fetch(client, peer, &obj, chunk, &dp_dst);
    if (t < 0) goto done;
    if (t < dp_best) dp_best = t;
    if (o.tls) {
      t = checked_fetch(tls_client, tls_peer, &obj, chunk, &dp_dst);
      if (t < 0) goto done;
      if (t < tls_best) tls_best = t;
    }
    memset(tcp_dst, 0, 4096);
    t = tcp_copy(&obj, tcp_dst);
    if (t < 0) {
      fprintf(stderr, "bench_dataplane: tcp copy failed: %s\n", strerror(errno));
      goto done;
    }
    if (memcmp(tcp_dst, obj.data, obj.len) != 0) {
      fprintf(stderr, "bench_dataplane: copied bytes differ from the object\n");
      goto done;
    }
    if (t < tcp_best) tcp_best = t;
  }
  double dp_mbps = (double)obj.len / dp_best / 1e6, tcp_mbps = (double)obj.len / tcp_best / 1e6;
  double tls_mbps = (double)obj.len / tls_best / 1e6;
  double ratio = dp_mbps / tcp_mbps;
  bool met = ratio >= TARGET_RATIO;
  dp_server_stats ss = dp_server_stats_get(server);
  uint64_t tls_conns = tls_server ? dp_server_stats_get(tls_server).accepted : 0;
  char row_dp[64], row_tls[64], row_tcp[64];
  snprintf(row_dp, sizeof row_dp, "dataplane_fetch_%" PRIu64 "MB", o.mb);
  snprintf(row_tls, sizeof row_tls, "dataplane_tls_fetch_%" PRIu64 "MB", o.mb);
  snprintf(row_tcp, sizeof row_tcp, "tcp_copy_%" PRIu64 "MB", o.mb);
  if (o.json) {
    printf("{\"bench\": \"%s\", \"bytes\": %zu, \"chunk_bytes\": %zu, \"runs\": %" PRIu64
           ", \"best_s\": %.4f, \"mb_per_s\": %.1f, \"ratio_to_tcp\": %.3f, "
           "\"connections\": %" PRIu64 ", \"target\": \"ratio_to_tcp >= %.1f\", \"met\": %s}\n",
           row_dp, obj.len, chunk, o.runs, dp_best, dp_mbps, ratio, ss.accepted, TARGET_RATIO,
           met ? "true" : "false");
    if (o.tls)
      printf("{\"bench\": \"%s\", \"bytes\": %zu, \"chunk_bytes\": %zu, \"runs\": %" PRIu64
             ", \"best_s\": %.4f, \"mb_per_s\": %.1f, \"ratio_to_tcp\": %.3f, "
             "\"ratio_to_plaintext\": %.3f, \"connections\": %" PRIu64 ", \"target\": null, "
             "\"met\": null}\n",
             row_tls, obj.len, chunk, o.runs, tls_best, tls_mbps, tls_mbps / tcp_mbps,
             tls_mbps / dp_mbps, tls_conns);
    printf("{\"bench\": \"%s\", \"bytes\": %zu, \"runs\": %" PRIu64
           ", \"best_s\": %.4f, \"mb_per_s\": %.1f, \"ratio_to_tcp\": 1.000, \"target\": null, "
           "\"met\": null}\n",
           row_tcp, obj.len, o.runs, tcp_best, tcp_mbps);
  } else {
    printf("flint bench_dataplane (flint %s): %zu bytes over 127.0.0.1, best of %" PRIu64
           " runs each\n",
           FL_VERSION_STRING, obj.len, o.runs);
    printf("  %s: sequential dp_fetch of %zu-byte chunks, CRC32C both ends, %" PRIu64
           " connection(s)\n",
           row_dp, chunk, ss.accepted);
    if (o.tls)
      printf("  %s: the same over TLS (FLINT_TLS on at both ends), %" PRIu64 " connection(s)\n",
             row_tls, tls_conns);
    printf("  %s: blocking send/recv of the same bytes, one thread each side\n\n", row_tcp);
    printf("%-*s %-20s %16s  %-10s %s\n", BENCH_COLUMN, "bench", "metric", "value", "target",
           "met");
    printf("%-*s %-20s %16s  %-10s %s\n", BENCH_COLUMN, "--------------------------",
           "--------------------", "----------------", "----------", "---");
    char v[64], target[32];
    snprintf(target, sizeof target, ">= %.1f", TARGET_RATIO);
    snprintf(v, sizeof v, "%.1f", dp_mbps);
    print_row(row_dp, "mb_per_s", v, "", "");
    snprintf(v, sizeof v, "%.4f", dp_best);
    print_row("", "best_s", v, "", "");
    snprintf(v, sizeof v, "%.3f", ratio);
    print_row("", "ratio_to_tcp", v, target, met ? "yes" : "NO");
    if (o.tls) {
      snprintf(v, sizeof v, "%.1f", tls_mbps);
      print_row(row_tls, "mb_per_s", v, "", "");
      snprintf(v, sizeof v, "%.4f", tls_best);
      print_row("", "best_s", v, "", "");
      snprintf(v, sizeof v, "%.3f", tls_mbps / tcp_mbps);
      print_row("", "ratio_to_tcp", v, "", "");
      snprintf(v, sizeof v, "%.3f", tls_mbps / dp_mbps);
      print_row("", "ratio_to_plaintext", v, "", "");
    }
    snprintf(v, sizeof v, "%.1f", tcp_mbps);
    print_row(row_tcp, "mb_per_s", v, "", "");
    snprintf(v, sizeof v, "%.4f", tcp_best);
    print_row("", "best_s", v, "", "");
    print_row("", "ratio_to_tcp", "1.000", "", "");
  }
  fflush(stdout);
  rc = 0;
done:
  dp_client_destroy(tls_client);
  dp_server_stop(tls_server);
  if (certs[0]) tls_remove_certs(certs);
  dp_client_destroy(client);
  dp_server_stop(server);
  fl_buf_free(&dp_dst);
  free(tcp_dst);
  free(obj.data);
  return rc;
}
