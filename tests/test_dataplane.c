/* test_dataplane.c: unit tests of net/dataplane*.c: round trips, ranges, errors, concurrency and
 * connection reuse, authentication, hostile and dying peers, timeouts and shutdown, all on
 * 127.0.0.1 with servers on free ports; then TLS: the same fetches with FLINT_TLS on, and
 * the handshakes that must fail. */
#include "test_util.h"
#include "tls_certs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <time.h>

#include "net/net.h"

/* ---- a test block store ----------------------------------------------------------------- */
/* DP_BLOCK objects are synthetic: key[0] bytes, byte i = pattern(key[1], i). key[0] ==
 * UINT64_MAX is a missing block. DP_SHUFFLE fails with FL_EFETCH. DP_RESULT sleeps key[0] ms
 * and then serves 16 bytes. */
static atomic_int serve_calls;

static inline uint8_t pattern(uint64_t seed, uint64_t i) { return (uint8_t)(i * 131 + seed * 7 + (i >> 11)); }

static fl_status test_serve(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                             uint64_t *total) {
  atomic_fetch_add(&serve_calls, 1);
  if (req->kind == DP_SHUFFLE)
    return fl_set_error(FL_EFETCH, "shuffle %llu map %llu: output file lost",
                        (unsigned long long)req->key[1], (unsigned long long)req->key[2]);
  uint64_t size = req->key[0];
  if (req->kind == DP_RESULT) {
    struct timespec ts = {(time_t)(size / 1000), (long)(size % 1000) * 1000000};
    nanosleep(&ts, NULL);
    size = 16;
  } else if (size == UINT64_MAX) {
    return fl_set_error(FL_ENOENT, "block %llu not found", (unsigned long long)req->key[1]);
  }
  if (req->offset > size)
    return fl_set_error(FL_EINVAL, "offset %llu beyond the object's %llu bytes",
                        (unsigned long long)req->offset, (unsigned long long)size);
  uint64_t len = req->len ? req->len : size - req->offset;
  if (len > size - req->offset) len = size - req->offset;
  fl_status s = fl_buf_reserve(out, len);
  if (s != FL_OK) return s;
  for (uint64_t i = 0; i < len; i++) out->data[out->len + i] = pattern(req->key[1], req->offset + i);
  out->len += len;
  *total = size;
  return FL_OK;
}

static void check_pattern(const uint8_t *p, uint64_t seed, uint64_t offset, uint64_t len) {
  for (uint64_t i = 0; i < len; i++) {
    if (p[i] != pattern(seed, offset + i)) {
      fprintf(stderr, "byte %llu differs\n", (unsigned long long)i);
      fail();
    }
  }
}

static void peer_of(const dp_server *s, char *buf, size_t len) {
  snprintf(buf, len, "127.0.0.1:%d", dp_server_port(s));
}

static dp_request block_req(uint64_t size, uint64_t seed, uint64_t offset, uint64_t len) {
  dp_request r = {.kind = DP_BLOCK, .key = {size, seed, 0, 0}, .offset = offset, .len = len};
  return r;
}

/* A port that nobody listens on: bound, then closed. */
static int dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t len = sizeof a;
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Waits (at most 5 s) for the peer to close: true if it did. Reads and discards any reply. */
static bool closed_by_peer(int fd, uint8_t *reply, size_t *reply_len) {
  size_t got = 0;
  for (int i = 0; i < 500; i++) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    uint8_t buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (reply_len) *reply_len = got;
      return true;
    }
    if (reply && got + (size_t)n <= 4096) memcpy(reply + got, buf, (size_t)n);
    got += (size_t)n;
  }
  return false;
}

static void frame_header(uint8_t h[DP_FRAME_HEADER_SIZE], uint8_t type, uint64_t len,
                         uint32_t crc) {
  memset(h, 0, DP_FRAME_HEADER_SIZE);
  uint32_t magic = DP_FRAME_MAGIC;
  memcpy(h, &magic, 4);
  h[4] = DP_FRAME_VERSION;
  h[5] = type;
  memcpy(h + 8, &len, 8);
  memcpy(h + 24, &crc, 4);
  uint32_t hcrc = dp_crc32c(0, h, 28);
  memcpy(h + 28, &hcrc, 4);
}

/* ---- tests ------------------------------------------------------------------------------ */

static uint32_t crc32c_bitwise(const uint8_t *p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; i++) {
    c ^= p[i];
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

static void test_crc32c(void **state) {
  assert_int_equal(dp_crc32c(0, "123456789", 9), 0xe3069283u);
  assert_int_equal(dp_crc32c(0, NULL, 0), 0);
  size_t n = 3 * 8192 * 3 + 77;
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  for (size_t i = 0; i < n; i++) buf[i] = pattern(3, i);
  size_t lens[] = {1, 7, 8, 63, 4095, 24575, 24576, 24577, 3 * 8192 * 2 + 5, n};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    /* Unaligned starts too. */
    assert_int_equal(dp_crc32c(0, buf + 1, lens[i] - 1), crc32c_bitwise(buf + 1, lens[i] - 1));
    assert_int_equal(dp_crc32c(0, buf, lens[i]), crc32c_bitwise(buf, lens[i]));
  }
  uint32_t chained = dp_crc32c(dp_crc32c(0, buf, 1000), buf + 1000, n - 1000);
  assert_int_equal(chained, crc32c_bitwise(buf, n));
  free(buf);
}

static void test_round_trip_sizes(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_true(dp_server_port(s) > 0);
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  uint64_t sizes[] = {0, 1, 4095, 8 << 20};
  for (size_t i = 0; i < 4; i++) {
    fl_buf out = FL_BUF_INIT;
    assert_ok(fl_buf_append(&out, "xyz", 3)); /* the payload is appended */
    uint64_t total = 12345;
    dp_request r = block_req(sizes[i], i, 0, 0);
    assert_ok(dp_fetch(c, peer, &r, 10000, &out, &total));
    assert_int_equal(total, sizes[i]);
    assert_int_equal(out.len, 3 + sizes[i]);
    assert_memory_equal(out.data, "xyz", 3);
    check_pattern(out.data + 3, i, 0, sizes[i]);
    fl_buf_free(&out);
  }
  /* One connection carried them all. */
  assert_int_equal(dp_client_stats_get(c).connects, 1);
  assert_int_equal(dp_server_stats_get(s).accepted, 1);
  dp_client_destroy(c);
  dp_server_stop(s);
}

/* A serve callback that lends ranges of one object, counting loans and their returns; a
 * key[1] of 1 lends and then fails, as a callback that finds an error late would. */
typedef struct lender {
  uint8_t *data;
  size_t len;
  atomic_int lent, returned;
} lender;

static void lender_return(void *arg) { atomic_fetch_add(&((lender *)arg)->returned, 1); }

static fl_status lend_serve(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                            uint64_t *total) {
  lender *l = arg;
  uint64_t off = req->offset < l->len ? req->offset : l->len;
  uint64_t len = req->len && req->len < l->len - off ? req->len : l->len - off;
  *loan = (dp_loan){l->data + off, len, lender_return, l};
  *total = l->len;
  atomic_fetch_add(&l->lent, 1);
  if (req->key[1] == 1) return fl_set_error(FL_EIO, "lent, then failed");
  return FL_OK;
}

static void test_lent_payloads(void **state) {
  lender l = {.len = (size_t)9 << 20};
  l.data = malloc(l.len);
  assert_non_null(l.data);
  for (size_t i = 0; i < l.len; i++) l.data[i] = pattern(0, i);
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, lend_serve, &l, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  /* Small (checksummed first) and large (streamed) payloads, whole and in ranges. */
  uint64_t ranges[][2] = {{0, 0}, {0, 100}, {l.len - 7, 0}, {4 << 20, 3 << 20}, {l.len, 0}};
  for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
    fl_buf out = FL_BUF_INIT;
    uint64_t total = 0;
    dp_request r = {.kind = DP_BROADCAST, .offset = ranges[i][0], .len = ranges[i][1]};
    assert_ok(dp_fetch(c, peer, &r, 10000, &out, &total));
    assert_int_equal(total, l.len);
    uint64_t want = ranges[i][1] ? ranges[i][1] : l.len - ranges[i][0];
    assert_int_equal(out.len, want);
    check_pattern(out.data, 0, ranges[i][0], want);
    fl_buf_free(&out);
  }
  /* A failure after a loan: the client gets the error, the loan is returned. */
  fl_buf out = FL_BUF_INIT;
  dp_request bad = {.kind = DP_BROADCAST, .key = {0, 1}};
  assert_fails_with(dp_fetch(c, peer, &bad, 10000, &out, NULL), FL_EIO, "lent, then failed");
  dp_client_destroy(c);
  dp_server_stop(s);
  /* Every loan came back exactly once, by the time the server stopped. */
  assert_int_equal(atomic_load(&l.lent), 6);
  assert_int_equal(atomic_load(&l.returned), 6);
  free(l.data);
}

static void test_ranged_reads(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  const uint64_t size = 1000003;
  struct { uint64_t off, len, want; } cases[] = {
      {0, 10, 10}, {999999, 0, 4}, {500000, 4096, 4096}, {size, 0, 0}, {123, 1, 1}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    fl_buf out = FL_BUF_INIT;
    uint64_t total = 0;
    dp_request r = block_req(size, 9, cases[i].off, cases[i].len);
    assert_ok(dp_fetch(c, peer, &r, 0, &out, &total));
    assert_int_equal(total, size);
    assert_int_equal(out.len, cases[i].want);
    check_pattern(out.data, 9, cases[i].off, cases[i].want);
    fl_buf_free(&out);
  }
  /* Chunks of a larger object, as a reader streams it. */
  fl_buf all = FL_BUF_INIT;
  for (uint64_t off = 0; off < size; off += 65536) {
    dp_request r = block_req(size, 5, off, 65536);
    assert_ok(dp_fetch(c, peer, &r, 0, &all, NULL));
  }
  assert_int_equal(all.len, size);
  check_pattern(all.data, 5, 0, size);
  fl_buf_free(&all);
  /* A range past the end is the server's error. */
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(size, 9, size + 1, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 0, &out, NULL), FL_EINVAL, "beyond");
  assert_int_equal(out.len, 0);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_server_errors_propagate(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  assert_ok(fl_buf_append(&out, "keep", 4));
  dp_request r = block_req(UINT64_MAX, 77, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 0, &out, NULL), FL_ENOENT, "block 77 not found");
  assert_int_equal(out.len, 4);
  dp_request sh = {.kind = DP_SHUFFLE, .key = {1, 2, 3, 4}};
  assert_fails_with(dp_fetch(c, peer, &sh, 0, &out, NULL), FL_EFETCH,
                    "shuffle 2 map 3: output file lost");
  assert_int_equal(out.len, 4);
  /* Errors leave the connection usable. */
  r = block_req(100, 1, 0, 0);
  assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
  assert_int_equal(out.len, 104);
  assert_int_equal(dp_client_stats_get(c).connects, 1);
  /* Bad arguments. */
  dp_request bad = {.kind = 0};
  assert_fails_with(dp_fetch(c, peer, &bad, 0, &out, NULL), FL_EINVAL, "kind");
  assert_fails_with(dp_fetch(c, "no-port", &r, 0, &out, NULL), FL_EINVAL, "HOST:PORT");
  assert_fails_with(dp_fetch(c, "127.0.0.1:99999", &r, 0, &out, NULL), FL_EINVAL, "port");
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

typedef struct fetch_thread {
  pthread_t th;
  dp_client *c;
  const char *peer;
  int id;
  int failures;
} fetch_thread;

#define THREAD_FETCHES 25

static void *fetch_thread_main(void *arg) {
  fetch_thread *t = arg;
  for (int i = 0; i < THREAD_FETCHES; i++) {
    uint64_t size = (uint64_t)((t->id * 7919 + i * 104729) % 300000);
    uint64_t seed = (uint64_t)(t->id * 100 + i);
    fl_buf out = FL_BUF_INIT;
    uint64_t total;
    dp_request r = block_req(size, seed, 0, 0);
    if (dp_fetch(t->c, t->peer, &r, 20000, &out, &total) != FL_OK || out.len != size ||
        total != size) {
      fprintf(stderr, "thread %d fetch %d: %s\n", t->id, i, fl_last_error());
      t->failures++;
    } else {
      for (uint64_t j = 0; j < size; j++)
        if (out.data[j] != pattern(seed, j)) {
          t->failures++;
          break;
        }
    }
    fl_buf_free(&out);
  }
  return NULL;
}

static void test_concurrent_fetches_reuse_connections(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fetch_thread t[8];
  for (int i = 0; i < 8; i++) {
    t[i] = (fetch_thread){.c = c, .peer = peer, .id = i};
    assert_int_equal(pthread_create(&t[i].th, NULL, fetch_thread_main, &t[i]), 0);
  }
  for (int i = 0; i < 8; i++) {
    assert_int_equal(pthread_join(t[i].th, NULL), 0);
    assert_int_equal(t[i].failures, 0);
  }
  dp_client_stats cs = dp_client_stats_get(c);
  dp_server_stats ss = dp_server_stats_get(s);
  assert_int_equal(cs.fetches, 8 * THREAD_FETCHES);
  assert_int_equal(ss.requests, 8 * THREAD_FETCHES);
  assert_true(cs.connects >= 1 && cs.connects <= DP_CONNECTIONS_PER_PEER);
  assert_int_equal(ss.accepted, cs.connects);
  /* Later fetches reuse the pool. */
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(10, 1, 0, 0);
  for (int i = 0; i < 20; i++) assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
  assert_int_equal(dp_client_stats_get(c).connects, cs.connects);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_auth(void **state) {
  dp_server *s;
  dp_client *good, *none, *wrong;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, "s3cret-token", test_serve, NULL, &s));
  assert_ok(dp_client_create("s3cret-token", &good));
  assert_ok(dp_client_create(NULL, &none));
  assert_ok(dp_client_create("s3cret-tokex", &wrong));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(5000, 2, 0, 0);
  int calls = atomic_load(&serve_calls);
  assert_fails_with(dp_fetch(none, peer, &r, 0, &out, NULL), FL_EAUTH, "authentication failed");
  assert_fails_with(dp_fetch(wrong, peer, &r, 0, &out, NULL), FL_EAUTH,
                    "authentication failed: wrong shared secret");
  assert_int_equal(atomic_load(&serve_calls), calls); /* nothing was served */
  assert_int_equal(out.len, 0);
  assert_ok(dp_fetch(good, peer, &r, 0, &out, NULL));
  assert_int_equal(out.len, 5000);
  assert_ok(dp_fetch(good, peer, &r, 0, &out, NULL));
  assert_int_equal(dp_client_stats_get(good).connects, 1);
  /* Refused again on a fresh connection each time. */
  assert_fails_with(dp_fetch(wrong, peer, &r, 0, &out, NULL), FL_EAUTH, "authentication");
  assert_true(dp_server_stats_get(s).dropped >= 3);
  fl_buf_free(&out);
  dp_client_destroy(good);
  dp_client_destroy(none);
  dp_client_destroy(wrong);
  dp_server_stop(s);
}

static void test_garbage_clients_are_dropped(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  int port = dp_server_port(s);

  /* Junk bytes. */
  int fd = raw_connect(port);
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  assert_int_equal(send(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  assert_true(closed_by_peer(fd, NULL, NULL));
  close(fd);

  /* A well-formed header announcing an oversized request. */
  fd = raw_connect(port);
  uint8_t h[DP_FRAME_HEADER_SIZE];
  frame_header(h, DP_FRAME_REQUEST, (uint64_t)1 << 40, 0);
  assert_int_equal(send(fd, h, sizeof h, 0), (ssize_t)sizeof h);
  assert_true(closed_by_peer(fd, NULL, NULL));
  close(fd);

  /* An oversized hello. */
  fd = raw_connect(port);
  frame_header(h, DP_FRAME_HELLO, DP_SECRET_MAX + 1, 0);
  assert_int_equal(send(fd, h, sizeof h, 0), (ssize_t)sizeof h);
  assert_true(closed_by_peer(fd, NULL, NULL));
  close(fd);

  /* A valid frame with an unknown kind gets an FL_EPROTO reply, then the close. */
  fd = raw_connect(port);
  uint8_t req[DP_REQUEST_WIRE_SIZE] = {99};
  frame_header(h, DP_FRAME_REQUEST, sizeof req, dp_crc32c(0, req, sizeof req));
  assert_int_equal(send(fd, h, sizeof h, 0), (ssize_t)sizeof h);
  assert_int_equal(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
  uint8_t reply[4096];
  size_t reply_len = 0;
  assert_true(closed_by_peer(fd, reply, &reply_len));
  assert_true(reply_len > DP_FRAME_HEADER_SIZE);
  uint16_t status;
  memcpy(&status, reply + 6, 2);
  assert_int_equal(status, FL_EPROTO);
  close(fd);

  /* A payload checksum mismatch. */
  fd = raw_connect(port);
  req[0] = DP_BLOCK;
  frame_header(h, DP_FRAME_REQUEST, sizeof req, dp_crc32c(0, req, sizeof req) ^ 1);
  assert_int_equal(send(fd, h, sizeof h, 0), (ssize_t)sizeof h);
  assert_int_equal(send(fd, req, sizeof req, 0), (ssize_t)sizeof req);
  assert_true(closed_by_peer(fd, NULL, NULL));
  close(fd);

  assert_true(dp_server_stats_get(s).dropped >= 5);
  /* Everyone else is still served. */
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(70000, 4, 0, 0);
  assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
  check_pattern(out.data, 4, 0, 70000);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_unreachable_peer(void **state) {
  dp_client *c;
  assert_ok(dp_client_create(NULL, &c));
  char peer[64];
  snprintf(peer, sizeof peer, "127.0.0.1:%d", dead_port());
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(10, 1, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 5000, &out, NULL), FL_ENET, peer);
  assert_fails_with(dp_fetch(c, peer, &r, 5000, &out, NULL), FL_ENET, "cannot connect");
  assert_fails_with(dp_fetch(c, "no-such-host.invalid:80", &r, 5000, &out, NULL), FL_ENET,
                    "no-such-host.invalid");
  assert_int_equal(out.len, 0);
  fl_buf_free(&out);
  dp_client_destroy(c);
}

/* ---- a proxy that breaks the response stream ---------------------------------------------- */
typedef struct proxy {
  int listen_fd, port, target_port;
  uint64_t cut_after; /* close both sides after this many response bytes (0: never) */
  int64_t flip_at;    /* flip one bit of this response byte (-1: none) */
  pthread_t th;
} proxy;

static void *proxy_main(void *arg) {
  proxy *p = arg;
  int cfd = accept(p->listen_fd, NULL, NULL);
  if (cfd < 0) return NULL;
  int sfd = raw_connect(p->target_port);
  uint64_t forwarded = 0;
  uint8_t buf[65536];
  for (;;) {
    struct pollfd fds[2] = {{cfd, POLLIN, 0}, {sfd, POLLIN, 0}};
    if (poll(fds, 2, 5000) <= 0) break;
    if (fds[0].revents) {
      ssize_t n = recv(cfd, buf, sizeof buf, 0);
      if (n <= 0 || send(sfd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
    }
    if (fds[1].revents) {
      ssize_t n = recv(sfd, buf, sizeof buf, 0);
      if (n <= 0) break;
      if (p->cut_after && forwarded + (uint64_t)n > p->cut_after) n = (ssize_t)(p->cut_after - forwarded);
      if (p->flip_at >= 0 && (uint64_t)p->flip_at >= forwarded && (uint64_t)p->flip_at < forwarded + (uint64_t)n)
        buf[p->flip_at - (int64_t)forwarded] ^= 0x10;
      if (n > 0 && send(cfd, buf, (size_t)n, MSG_NOSIGNAL) != n) break;
      forwarded += (uint64_t)n;
      if (p->cut_after && forwarded >= p->cut_after) break;
    }
  }
  close(cfd);
  close(sfd);
  return NULL;
}

static void proxy_start(proxy *p, int target_port, uint64_t cut_after, int64_t flip_at) {
  p->target_port = target_port;
  p->cut_after = cut_after;
  p->flip_at = flip_at;
  p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  assert_int_equal(bind(p->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(p->listen_fd, 4), 0);
  socklen_t len = sizeof a;
  assert_int_equal(getsockname(p->listen_fd, (struct sockaddr *)&a, &len), 0);
  p->port = ntohs(a.sin_port);
  assert_int_equal(pthread_create(&p->th, NULL, proxy_main, p), 0);
}

static void proxy_stop(proxy *p) {
  assert_int_equal(pthread_join(p->th, NULL), 0);
  close(p->listen_fd);
}

static void test_peer_dies_mid_transfer(void **state) {
  dp_server *s;
  dp_client *c;
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  proxy p;
  proxy_start(&p, dp_server_port(s), 100000, -1);
  char peer[64];
  snprintf(peer, sizeof peer, "127.0.0.1:%d", p.port);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(8 << 20, 3, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 10000, &out, NULL), FL_ENET, peer);
  assert_non_null(strstr(fl_last_error(), "mid-response"));
  assert_int_equal(out.len, 0);
  proxy_stop(&p);
  /* The server itself is fine. */
  char direct[64];
  peer_of(s, direct, sizeof direct);
  assert_ok(dp_fetch(c, direct, &r, 10000, &out, NULL));
  assert_int_equal(out.len, 8 << 20);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_corrupt_payload(void **state) {
  dp_server *s;
  dp_client *c;
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  proxy p;
  proxy_start(&p, dp_server_port(s), 0, DP_FRAME_HEADER_SIZE + 5000);
  char peer[64];
  snprintf(peer, sizeof peer, "127.0.0.1:%d", p.port);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(20000, 3, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 10000, &out, NULL), FL_ECORRUPT, "checksum");
  assert_int_equal(out.len, 0);
  fl_buf_free(&out);
  dp_client_destroy(c); /* closes the connection, so the proxy ends */
  proxy_stop(&p);
  dp_server_stop(s);
}

static void test_timeout_and_limit(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request slow = {.kind = DP_RESULT, .key = {600}};
  /* The status shows the 100 ms timeout fired before the 600 ms reply came (a late one would
   * have let the reply through); the 30 s bound only catches a hang, not a busy host. */
  uint64_t t0 = common_now_ns();
  assert_fails_with(dp_fetch(c, peer, &slow, 100, &out, NULL), FL_ETIMEDOUT, "timed out");
  assert_true(common_now_ns() - t0 < 30000000000ull);
  dp_request quick = {.kind = DP_RESULT, .key = {0}};
  assert_ok(dp_fetch(c, peer, &quick, 0, &out, NULL));
  assert_int_equal(out.len, 16);
  /* The server refuses what exceeds the client's limit. */
  dp_client_set_max_payload(c, 1 << 20);
  dp_request big = block_req((1 << 20) + 1, 1, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &big, 0, &out, NULL), FL_ELIMIT, "limit");
  assert_int_equal(out.len, 16);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_server_stop_with_connections_open(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(1000, 1, 0, 0);
  assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL)); /* leaves an idle pooled connection */
  int raw = raw_connect(dp_server_port(s));       /* and one that never says anything */
  uint8_t h[DP_FRAME_HEADER_SIZE];
  frame_header(h, DP_FRAME_REQUEST, DP_REQUEST_WIRE_SIZE, 0);
  assert_int_equal(send(raw, h, 10, 0), 10); /* half a header */
  dp_server_stop(s);
  assert_true(closed_by_peer(raw, NULL, NULL));
  close(raw);
  assert_fails_with(dp_fetch(c, peer, &r, 5000, &out, NULL), FL_ENET, peer);
  assert_int_equal(out.len, 1000);
  fl_buf_free(&out);
  dp_client_destroy(c);
}

typedef struct pending_fetch {
  dp_client *c;
  const char *peer;
  fl_status status;
} pending_fetch;

static void *pending_fetch_main(void *arg) {
  pending_fetch *p = arg;
  fl_buf out = FL_BUF_INIT;
  dp_request slow = {.kind = DP_RESULT, .key = {400}};
  p->status = dp_fetch(p->c, p->peer, &slow, 10000, &out, NULL);
  fl_buf_free(&out);
  return NULL;
}

static void test_client_destroy_cancels(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  pending_fetch p = {c, peer, FL_OK};
  uint64_t before = dp_server_stats_get(s).requests;
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, pending_fetch_main, &p), 0);
  for (int i = 0; i < 500 && dp_server_stats_get(s).requests == before; i++) usleep(2000);
  assert_true(dp_server_stats_get(s).requests > before);
  dp_client_destroy(c);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(p.status, FL_ECANCELLED);
  dp_server_stop(s);
  dp_client_destroy(NULL);
  dp_server_stop(NULL);
}

/* ---- limits: idle and request timeouts, the connection cap ------------------------------- */
/* Every bound below is one only a hang exceeds; the timeouts are a few hundred ms. */
#define HANG_BOUND_NS 30000000000ull

/* Waits (at most HANG_BOUND_NS) until the peer closes fd, reading and discarding what comes. */
static bool closed_within_bound(int fd) {
  uint64_t t0 = common_now_ns();
  while (common_now_ns() - t0 < HANG_BOUND_NS) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    uint8_t buf[65536];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
  return false;
}

/* Waits (at most HANG_BOUND_NS) until the server's stats satisfy `cond`. */
#define WAIT_FOR_STATS(s, st, cond)                                                          \
  do {                                                                                       \
    uint64_t t0_ = common_now_ns();                                                          \
    dp_server_stats st;                                                                      \
    while (st = dp_server_stats_get(s), !(cond) && common_now_ns() - t0_ < HANG_BOUND_NS)    \
      usleep(5000);                                                                          \
    assert_true(cond);                                                                       \
  } while (0)

/* A whole request frame for req, as a client sends it. */
static size_t raw_request(uint8_t out[DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE], dp_request req) {
  uint8_t *p = out + DP_FRAME_HEADER_SIZE;
  memset(p, 0, DP_REQUEST_WIRE_SIZE);
  p[0] = req.kind;
  uint64_t max_len = (uint64_t)1 << 40;
  memcpy(p + 8, req.key, 32);
  memcpy(p + 40, &req.offset, 8);
  memcpy(p + 48, &req.len, 8);
  memcpy(p + 56, &max_len, 8);
  frame_header(out, DP_FRAME_REQUEST, DP_REQUEST_WIRE_SIZE, dp_crc32c(0, p, DP_REQUEST_WIRE_SIZE));
  return DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE;
}

/* Sends a request for a small block on a raw connection and checks the whole response. */
static void raw_fetch_ok(int fd, uint64_t seed) {
  uint8_t frame[DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE];
  size_t n = raw_request(frame, block_req(100, seed, 0, 0));
  assert_int_equal(send(fd, frame, n, MSG_NOSIGNAL), (ssize_t)n);
  uint8_t reply[DP_FRAME_HEADER_SIZE + 100 + 4];
  size_t got = 0;
  while (got < sizeof reply) {
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 30000), 1);
    ssize_t r = recv(fd, reply + got, sizeof reply - got, 0);
    assert_true(r > 0);
    got += (size_t)r;
  }
  uint16_t status;
  memcpy(&status, reply + 6, 2);
  assert_int_equal(status, 0);
  check_pattern(reply + DP_FRAME_HEADER_SIZE, seed, 0, 100);
}

static void test_stalled_connections_are_closed(void **state) {
  dp_server *s;
  dp_server_limits lim = {.idle_timeout_ms = 300, .request_timeout_ms = 300,
                          .max_connections = DP_UNLIMITED};
  assert_ok(dp_server_start_with_limits("127.0.0.1", 0, NULL, test_serve, NULL, &lim, &s));
  int port = dp_server_port(s);

  /* A client that connects and sends nothing. */
  int silent = raw_connect(port);
  assert_true(closed_within_bound(silent));
  close(silent);

  /* Half a header, then nothing. */
  int half = raw_connect(port);
  uint8_t h[DP_FRAME_HEADER_SIZE];
  frame_header(h, DP_FRAME_HELLO, DP_SECRET_MAX, 0);
  assert_int_equal(send(half, h, DP_FRAME_HEADER_SIZE / 2, 0), DP_FRAME_HEADER_SIZE / 2);
  assert_true(closed_within_bound(half));
  close(half);

  /* Slowloris: a frame that trickles in, a byte every 100 ms (each well inside the timeout),
   * is closed before it is whole: its deadline runs from its first byte. */
  int slow = raw_connect(port);
  uint8_t frame[DP_FRAME_HEADER_SIZE + DP_SECRET_MAX];
  memset(frame + DP_FRAME_HEADER_SIZE, 'x', DP_SECRET_MAX);
  frame_header(frame, DP_FRAME_HELLO, DP_SECRET_MAX, dp_crc32c(0, frame + DP_FRAME_HEADER_SIZE, DP_SECRET_MAX));
  size_t sent = 0;
  bool closed = false;
  while (sent < sizeof frame && !closed) {
    if (send(slow, frame + sent, 1, MSG_NOSIGNAL) != 1) break;
    sent++;
    struct pollfd p = {slow, POLLIN, 0};
    if (poll(&p, 1, 100) == 1) closed = recv(slow, h, 1, 0) <= 0;
  }
  assert_true(sent < sizeof frame); /* ~30 s to send it whole: the server closed it first */
  close(slow);

  /* A client that asks for a large block and never reads it: the response stalls. */
  int reader = raw_connect(port);
  int small = 4096;
  setsockopt(reader, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  uint8_t req[DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE];
  size_t n = raw_request(req, block_req(64 << 20, 3, 0, 0));
  uint64_t before = dp_server_stats_get(s).timed_out;
  assert_int_equal(send(reader, req, n, MSG_NOSIGNAL), (ssize_t)n);
  WAIT_FOR_STATS(s, st, st.timed_out > before);
  close(reader);
  assert_true(dp_server_stats_get(s).timed_out >= 4);

  /* A request served for longer than both timeouts is not cut: no timer runs meanwhile. */
  dp_client *c;
  char peer[64];
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request slow_req = {.kind = DP_RESULT, .key = {1000, 0, 0, 0}};
  assert_ok(dp_fetch(c, peer, &slow_req, 0, &out, NULL));
  assert_int_equal(out.len, 16);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

/* A pooled connection that the server closes for idleness is opened again by the next fetch,
 * which succeeds. */
static void test_idle_pooled_connection_reopens(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  dp_server_limits lim = {.idle_timeout_ms = 200, .request_timeout_ms = DP_UNLIMITED,
                          .max_connections = DP_UNLIMITED};
  assert_ok(dp_server_start_with_limits("127.0.0.1", 0, NULL, test_serve, NULL, &lim, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(5000, 6, 0, 0);
  assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
  assert_int_equal(dp_client_stats_get(c).connects, 1);
  for (int round = 0; round < 3; round++) {
    WAIT_FOR_STATS(s, st, st.timed_out == (uint64_t)round + 1);
    out.len = 0;
    assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
    check_pattern(out.data, 6, 0, 5000);
    assert_int_equal(dp_client_stats_get(c).connects, (uint64_t)round + 2);
  }
  /* And a close that races the fetch (the server closes as the request leaves): the client
   * retries once on a fresh connection. Fetches paced at about the timeout hit it now and
   * then; none may fail. */
  for (int i = 0; i < 10; i++) {
    usleep(190000 + 2000 * (useconds_t)i);
    out.len = 0;
    assert_ok(dp_fetch(c, peer, &r, 0, &out, NULL));
  }
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

static void test_connection_cap(void **state) {
  dp_server *s;
  dp_client *c;
  char peer[64];
  dp_server_limits lim = {.idle_timeout_ms = DP_UNLIMITED, .request_timeout_ms = DP_UNLIMITED,
                          .max_connections = 3};
  assert_ok(dp_server_start_with_limits("127.0.0.1", 0, NULL, test_serve, NULL, &lim, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  int port = dp_server_port(s);
  int held[3];
  for (int i = 0; i < 3; i++) held[i] = raw_connect(port);
  WAIT_FOR_STATS(s, st, st.accepted == 3);

  /* Over the cap: closed at once, raw or through a client, and again and again. */
  for (int i = 0; i < 5; i++) {
    int extra = raw_connect(port);
    assert_true(closed_within_bound(extra));
    close(extra);
  }
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(1000, 8, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 0, &out, NULL), FL_ENET, peer); /* reset or closed */
  assert_int_equal(dp_server_stats_get(s).refused, 6);

  /* The connections within the cap still work. */
  for (int i = 0; i < 3; i++) raw_fetch_ok(held[i], (uint64_t)i + 20);

  /* Once one closes, a new one is served. */
  close(held[0]);
  fl_status st = FL_ENET;
  for (uint64_t t0 = common_now_ns(); st != FL_OK && common_now_ns() - t0 < HANG_BOUND_NS;
       usleep(10000))
    st = dp_fetch(c, peer, &r, 0, &out, NULL);
  assert_ok(st);
  check_pattern(out.data, 8, 0, 1000);
  raw_fetch_ok(held[1], 30);
  fl_buf_free(&out);
  close(held[1]);
  close(held[2]);
  dp_client_destroy(c);
  dp_server_stop(s);
}


/* ---- TLS -------------------------------------------------------------------------------- */
/* certs: a CA and a certificate for 127.0.0.1 and localhost; other: another CA (and its own
 * certificate); named: a certificate for flint.example only. Made once for the program. */
static char certs[256], other[256], named[256];

static int tls_certs_make(void **state) {
  (void)state;
  return tls_make_certs(certs, sizeof certs, NULL) && tls_make_certs(other, sizeof other, NULL) &&
                 tls_make_certs(named, sizeof named, "flint.example")
             ? 0
             : -1;
}

static int tls_certs_remove(void **state) {
  (void)state;
  tls_env_off();
  if (certs[0]) tls_remove_certs(certs);
  if (other[0]) tls_remove_certs(other);
  if (named[0]) tls_remove_certs(named);
  return 0;
}

/* Runs after every TLS test, also a failed one, so that the next test starts in plaintext. */
static int tls_off(void **state) {
  (void)state;
  tls_env_off();
  return 0;
}

static void set_ca(const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/ca.pem", dir);
  setenv("FLINT_TLS_CA", path, 1);
}

/* The tests above, with every server and client of theirs on TLS: the behaviour they check
 * (reuse, ranges, loans, errors, secrets, cut connections, timeouts, cancelling, the idle
 * check and its retry) must not change. test_tls_one_end_only shows the setting is in force. */
#define TLS_TOO(name)                                                                        \
  static void tls_##name(void **state) {                                                     \
    tls_env_on(certs);                                                                       \
    test_##name(state);                                                                      \
  }
TLS_TOO(round_trip_sizes)
TLS_TOO(ranged_reads)
TLS_TOO(lent_payloads)
TLS_TOO(server_errors_propagate)
TLS_TOO(concurrent_fetches_reuse_connections)
TLS_TOO(auth)
TLS_TOO(unreachable_peer)
TLS_TOO(peer_dies_mid_transfer)
TLS_TOO(timeout_and_limit)
TLS_TOO(client_destroy_cancels)
TLS_TOO(idle_pooled_connection_reopens)

/* Large blocks are streamed (sent before their checksum); over TLS they arrive whole and
 * right, one after another on one connection. */
static void test_tls_large_blocks(void **state) {
  tls_env_on(certs);
  dp_server *s;
  dp_client *c;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, "tls-secret", test_serve, NULL, &s));
  assert_ok(dp_client_create("tls-secret", &c));
  peer_of(s, peer, sizeof peer);
  uint64_t sizes[] = {48u << 20, (20u << 20) + 12345};
  for (size_t i = 0; i < 2; i++) {
    fl_buf out = FL_BUF_INIT;
    uint64_t total = 0;
    dp_request r = block_req(sizes[i], 40 + i, 0, 0);
    assert_ok(dp_fetch(c, peer, &r, 60000, &out, &total));
    assert_int_equal(total, sizes[i]);
    assert_int_equal(out.len, sizes[i]);
    check_pattern(out.data, 40 + i, 0, sizes[i]);
    fl_buf_free(&out);
  }
  assert_int_equal(dp_client_stats_get(c).connects, 1);
  assert_int_equal(dp_server_stats_get(s).dropped, 0);
  dp_client_destroy(c);
  dp_server_stop(s);
}

/* Runs fn with stderr going to a file, whose text (at most cap - 1 bytes) ends in buf. */
static void capture_stderr(void (*fn)(void *), void *arg, char *buf, size_t cap) {
  char path[] = "/tmp/flint-test-stderr-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  int saved = dup(2);
  assert_true(saved >= 0);
  assert_int_equal(dup2(fd, 2), 2);
  fn(arg);
  assert_int_equal(dup2(saved, 2), 2);
  close(saved);
  ssize_t n = pread(fd, buf, cap - 1, 0);
  buf[n > 0 ? n : 0] = '\0';
  close(fd);
  unlink(path);
  fputs(buf, stderr); /* still shown */
}

typedef struct bad_handshake {
  dp_server *s;
  const char *peer;
} bad_handshake;

/* A client that trusts another CA: its fetch fails, and the server counts one drop. */
static void wrong_ca_fetch(void *arg) {
  bad_handshake *b = arg;
  set_ca(other);
  dp_client *c;
  assert_ok(dp_client_create(NULL, &c));
  set_ca(certs);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(100, 1, 0, 0);
  uint64_t before = dp_server_stats_get(b->s).dropped;
  char want[256];
  snprintf(want, sizeof want, "data plane: TLS handshake with %s failed: certificate verify failed", b->peer);
  assert_fails_with(dp_fetch(c, b->peer, &r, 10000, &out, NULL), FL_EAUTH, want);
  assert_int_equal(out.len, 0);
  WAIT_FOR_STATS(b->s, st, st.dropped == before + 1);
  fl_buf_free(&out);
  dp_client_destroy(c);
}

/* Certificates the CA does not vouch for, or for another name: FL_EAUTH, a message naming
 * the peer and OpenSSL's reason, one warning on the server, and it keeps serving. */
static void test_tls_bad_certificates(void **state) {
  tls_env_on(certs);
  dp_server *s;
  dp_client *good;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &good));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(3000, 2, 0, 0);
  assert_ok(dp_fetch(good, peer, &r, 10000, &out, NULL)); /* a pooled connection from before */

  bad_handshake b = {s, peer};
  char log[8192];
  capture_stderr(wrong_ca_fetch, &b, log, sizeof log);
  const char *warning = strstr(log, "TLS handshake failed");
  assert_non_null(warning);
  assert_null(strstr(warning + 1, "TLS handshake failed")); /* one warning */
  assert_non_null(strstr(log, "closing connection from 127.0.0.1:"));
  assert_non_null(strstr(log, "unknown ca")); /* OpenSSL's reason: the client's alert */

  /* The certificate names 127.0.0.1 and localhost, not what FLINT_TLS_SERVER_NAME asks. */
  setenv("FLINT_TLS_SERVER_NAME", "flint.example", 1);
  dp_client *misnamed;
  assert_ok(dp_client_create(NULL, &misnamed));
  unsetenv("FLINT_TLS_SERVER_NAME");
  assert_fails_with(dp_fetch(misnamed, peer, &r, 10000, &out, NULL), FL_EAUTH, "certificate verify failed");
  assert_non_null(strstr(fl_last_error(), "mismatch"));
  assert_non_null(strstr(fl_last_error(), peer));
  dp_client_destroy(misnamed);

  /* Good clients are still served, on the old connection and on new ones. */
  out.len = 0;
  assert_ok(dp_fetch(good, peer, &r, 10000, &out, NULL));
  check_pattern(out.data, 2, 0, 3000);
  dp_client *fresh;
  assert_ok(dp_client_create(NULL, &fresh));
  out.len = 0;
  assert_ok(dp_fetch(fresh, peer, &r, 10000, &out, NULL));
  check_pattern(out.data, 2, 0, 3000);
  WAIT_FOR_STATS(s, st, st.dropped == 2);
  fl_buf_free(&out);
  dp_client_destroy(fresh);
  dp_client_destroy(good);
  dp_server_stop(s);
}

/* FLINT_TLS_SERVER_NAME lets one certificate (for flint.example) serve an address it does
 * not name; without it the address dialled is checked, and fails. */
static void test_tls_server_name(void **state) {
  tls_env_on(named);
  dp_server *s;
  char peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  peer_of(s, peer, sizeof peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(500, 3, 0, 0);
  dp_client *plain_name;
  assert_ok(dp_client_create(NULL, &plain_name));
  assert_fails_with(dp_fetch(plain_name, peer, &r, 10000, &out, NULL), FL_EAUTH, "certificate verify failed");
  dp_client_destroy(plain_name);
  setenv("FLINT_TLS_SERVER_NAME", "flint.example", 1);
  dp_client *c;
  assert_ok(dp_client_create(NULL, &c));
  assert_ok(dp_fetch(c, peer, &r, 10000, &out, NULL));
  check_pattern(out.data, 3, 0, 500);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

/* TLS at one end only fails both ways round with a message that says so, and neither server
 * stops serving the clients that match it. */
static void test_tls_one_end_only(void **state) {
  dp_server *plain, *tls;
  dp_client *plain_client, *tls_client;
  char plain_peer[64], tls_peer[64];
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &plain));
  assert_ok(dp_client_create(NULL, &plain_client));
  tls_env_on(certs);
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &tls));
  assert_ok(dp_client_create(NULL, &tls_client));
  tls_env_off();
  peer_of(plain, plain_peer, sizeof plain_peer);
  peer_of(tls, tls_peer, sizeof tls_peer);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(800, 4, 0, 0);
  for (int i = 0; i < 2; i++) { /* and again, on fresh connections */
    assert_fails_with(dp_fetch(tls_client, plain_peer, &r, 10000, &out, NULL), FL_ENET,
                      "TLS may be on at one end only");
    assert_non_null(strstr(fl_last_error(), "TLS handshake with"));
    assert_non_null(strstr(fl_last_error(), plain_peer));
    /* The server answers in plaintext, naming itself by its port. */
    char port_text[32];
    snprintf(port_text, sizeof port_text, "port %d has TLS on", dp_server_port(tls));
    assert_fails_with(dp_fetch(plain_client, tls_peer, &r, 10000, &out, NULL), FL_EPROTO,
                      "TLS may be on at one end only");
    assert_non_null(strstr(fl_last_error(), port_text));
  }
  assert_int_equal(out.len, 0);
  /* A server may count a drop just after the client has read its end of it. */
  WAIT_FOR_STATS(tls, st, st.dropped == 2);
  WAIT_FOR_STATS(plain, st, st.dropped == 2);
  assert_ok(dp_fetch(plain_client, plain_peer, &r, 10000, &out, NULL));
  assert_ok(dp_fetch(tls_client, tls_peer, &r, 10000, &out, NULL));
  assert_int_equal(out.len, 1600);
  check_pattern(out.data + 800, 4, 0, 800);
  fl_buf_free(&out);
  dp_client_destroy(plain_client);
  dp_client_destroy(tls_client);
  dp_server_stop(plain);
  dp_server_stop(tls);
}

/* Raw sockets against a TLS server: junk, a handshake that never finishes (the request
 * timeout closes it) and a plaintext request; each is closed and the server keeps serving. */
static void test_tls_hostile_clients(void **state) {
  tls_env_on(certs);
  dp_server *s;
  dp_client *c;
  char peer[64];
  dp_server_limits lim = {.idle_timeout_ms = DP_UNLIMITED, .request_timeout_ms = 300,
                          .max_connections = DP_UNLIMITED};
  assert_ok(dp_server_start_with_limits("127.0.0.1", 0, NULL, test_serve, NULL, &lim, &s));
  assert_ok(dp_client_create(NULL, &c));
  peer_of(s, peer, sizeof peer);
  int port = dp_server_port(s);
  int fd = raw_connect(port);
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
  assert_int_equal(send(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
  assert_true(closed_within_bound(fd));
  close(fd);
  fd = raw_connect(port); /* the start of a TLS record, then nothing */
  uint8_t record[3] = {0x16, 0x03, 0x01};
  assert_int_equal(send(fd, record, sizeof record, 0), (ssize_t)sizeof record);
  assert_true(closed_within_bound(fd));
  close(fd);
  fd = raw_connect(port); /* a plaintext request gets a plaintext refusal */
  uint8_t frame[DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE];
  size_t n = raw_request(frame, block_req(100, 1, 0, 0));
  assert_int_equal(send(fd, frame, n, MSG_NOSIGNAL), (ssize_t)n);
  uint8_t reply[4096];
  size_t reply_len = 0;
  assert_true(closed_by_peer(fd, reply, &reply_len));
  assert_true(reply_len > DP_FRAME_HEADER_SIZE);
  uint16_t status;
  memcpy(&status, reply + 6, 2);
  assert_int_equal(status, FL_EPROTO);
  close(fd);
  WAIT_FOR_STATS(s, st, st.dropped == 2 && st.timed_out == 1);
  assert_int_equal(dp_server_stats_get(s).requests, 0);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(70000, 4, 0, 0);
  assert_ok(dp_fetch(c, peer, &r, 10000, &out, NULL));
  check_pattern(out.data, 4, 0, 70000);
  fl_buf_free(&out);
  dp_client_destroy(c);
  dp_server_stop(s);
}

/* A bit flipped on the wire is TLS's to catch: the fetch fails, naming the peer and OpenSSL's
 * reason, and delivers nothing. */
static void test_tls_tampered_stream(void **state) {
  tls_env_on(certs);
  dp_server *s;
  dp_client *c;
  assert_ok(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s));
  assert_ok(dp_client_create(NULL, &c));
  proxy p;
  proxy_start(&p, dp_server_port(s), 0, 20000); /* past the handshake, inside the payload */
  char peer[64];
  snprintf(peer, sizeof peer, "127.0.0.1:%d", p.port);
  fl_buf out = FL_BUF_INIT;
  dp_request r = block_req(60000, 3, 0, 0);
  assert_fails_with(dp_fetch(c, peer, &r, 10000, &out, NULL), FL_ENET, peer);
  assert_non_null(strstr(fl_last_error(), "bad record mac"));
  assert_int_equal(out.len, 0);
  fl_buf_free(&out);
  dp_client_destroy(c);
  proxy_stop(&p);
  dp_server_stop(s);
}

/* Settings that cannot serve fail the start or the create, with the settings' message. */
static void test_tls_bad_settings(void **state) {
  tls_env_on(certs);
  unsetenv("FLINT_TLS_CERT");
  dp_server *s = (dp_server *)&s;
  assert_fails_with(dp_server_start("127.0.0.1", 0, NULL, test_serve, NULL, &s), FL_EINVAL,
                    "FLINT_TLS is on but FLINT_TLS_CERT is not set");
  assert_null(s);
  tls_env_on(certs);
  setenv("FLINT_TLS_CA", "/nonexistent/ca.pem", 1);
  dp_client *c = (dp_client *)&c;
  assert_fails_with(dp_client_create(NULL, &c), FL_EINVAL, "FLINT_TLS_CA=/nonexistent/ca.pem");
  assert_null(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crc32c),
      cmocka_unit_test(test_round_trip_sizes),
      cmocka_unit_test(test_ranged_reads),
      cmocka_unit_test(test_lent_payloads),
      cmocka_unit_test(test_server_errors_propagate),
      cmocka_unit_test(test_concurrent_fetches_reuse_connections),
      cmocka_unit_test(test_auth),
      cmocka_unit_test(test_garbage_clients_are_dropped),
      cmocka_unit_test(test_unreachable_peer),
      cmocka_unit_test(test_peer_dies_mid_transfer),
      cmocka_unit_test(test_corrupt_payload),
      cmocka_unit_test(test_timeout_and_limit),
      cmocka_unit_test(test_server_stop_with_connections_open),
      cmocka_unit_test(test_client_destroy_cancels),
      cmocka_unit_test(test_stalled_connections_are_closed),
      cmocka_unit_test(test_idle_pooled_connection_reopens),
      cmocka_unit_test(test_connection_cap),
      cmocka_unit_test_teardown(tls_round_trip_sizes, tls_off),
      cmocka_unit_test_teardown(tls_ranged_reads, tls_off),
      cmocka_unit_test_teardown(tls_lent_payloads, tls_off),
      cmocka_unit_test_teardown(tls_server_errors_propagate, tls_off),
      cmocka_unit_test_teardown(tls_concurrent_fetches_reuse_connections, tls_off),
      cmocka_unit_test_teardown(tls_auth, tls_off),
      cmocka_unit_test_teardown(tls_unreachable_peer, tls_off),
      cmocka_unit_test_teardown(tls_peer_dies_mid_transfer, tls_off),
      cmocka_unit_test_teardown(tls_timeout_and_limit, tls_off),
      cmocka_unit_test_teardown(tls_client_destroy_cancels, tls_off),
      cmocka_unit_test_teardown(tls_idle_pooled_connection_reopens, tls_off),
      cmocka_unit_test_teardown(test_tls_large_blocks, tls_off),
      cmocka_unit_test_teardown(test_tls_bad_certificates, tls_off),
      cmocka_unit_test_teardown(test_tls_server_name, tls_off),
      cmocka_unit_test_teardown(test_tls_one_end_only, tls_off),
      cmocka_unit_test_teardown(test_tls_hostile_clients, tls_off),
      cmocka_unit_test_teardown(test_tls_tampered_stream, tls_off),
      cmocka_unit_test_teardown(test_tls_bad_settings, tls_off),
  };
  return cmocka_run_group_tests(tests, tls_certs_make, tls_certs_remove);
}
