/* test_rpc.c: unit tests of net/rpc.c and net/rpc_client.c: unary calls between a server and
 * channels in one process, all on 127.0.0.1 with a port picked by the system. Every wait is
 * bounded. */
#include "test_util.h"
#include "tls_certs.h"

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "net/net.h"

/* ---- a test server: one handler with a few methods -------------------------------------- */

typedef struct test_server {
  rpc_server *server;
  char target[64];
  atomic_int calls;           /* handler runs, every method */
  atomic_int blocked;         /* /test/Block handlers that have started */
  atomic_int saw_cancelled;   /* /test/Block handlers that saw *cancelled */
  atomic_int quick_offered;   /* calls offered to the quick handler */
  atomic_int quick_answered;  /* ... and answered there */
} test_server;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_ms(void) { return (double)common_now_ns() / 1e6; }

/* Methods:
 *   /test/Echo   replies with the request.
 *   /test/Fail   the request is a 4-byte status and a message; fails with them.
 *   /test/Grow   the request is a 4-byte length; replies with that many bytes.
 *   /test/Block  waits (at most 10 s) until the call is cancelled, then fails.
 *   /test/Sleep  the request is a 4-byte count of ms; replies "slept" after that long, or
 *                fails when cancelled first. */
static fl_status test_handler(void *arg, const rpc_request *req, fl_buf *response) {
  test_server *t = arg;
  atomic_fetch_add(&t->calls, 1);
  if (strcmp(req->method, "/test/Echo") == 0) {
    if (strncmp(req->peer, "ipv4:127.0.0.1:", 15) != 0)
      return fl_set_error(FL_EINTERNAL, "unexpected peer %s", req->peer);
    return fl_buf_append(response, req->body.data, req->body.len);
  }
  if (strcmp(req->method, "/test/Fail") == 0) {
    int32_t code;
    if (req->body.len < 4) return fl_set_error(FL_EINVAL, "short Fail request");
    memcpy(&code, req->body.data, 4);
    if (req->body.len == 4) return (fl_status)code; /* with no message */
    return fl_set_error((fl_status)code, "%.*s", (int)(req->body.len - 4),
                        (const char *)req->body.data + 4);
  }
  if (strcmp(req->method, "/test/Grow") == 0) {
    uint32_t len;
    if (req->body.len != 4) return fl_set_error(FL_EINVAL, "bad Grow request");
    memcpy(&len, req->body.data, 4);
    fl_status s = fl_buf_reserve(response, len);
    if (s != FL_OK) return s;
    memset(response->data, 'g', len);
    response->len = len;
    return FL_OK;
  }
  if (strcmp(req->method, "/test/Block") == 0) {
    atomic_fetch_add(&t->blocked, 1);
    for (int i = 0; i < 10000 && !atomic_load(req->cancelled); i++) sleep_ms(1);
    if (!atomic_load(req->cancelled)) return fl_set_error(FL_EINTERNAL, "never cancelled");
    atomic_fetch_add(&t->saw_cancelled, 1);
    return fl_set_error(FL_ECANCELLED, "blocked call cancelled");
  }
  if (strcmp(req->method, "/test/Sleep") == 0) {
    uint32_t ms;
    if (req->body.len != 4) return fl_set_error(FL_EINVAL, "bad Sleep request");
    memcpy(&ms, req->body.data, 4);
    for (uint32_t i = 0; i < ms; i++) {
      if (atomic_load(req->cancelled)) return fl_set_error(FL_ECANCELLED, "sleep cancelled");
      sleep_ms(1);
    }
    return fl_buf_append(response, "slept", 5);
  }
  return fl_set_error(FL_ENOENT, "no method %s", req->method);
}

/* Starts a server of cfg (its listen address set here) on a free port of 127.0.0.1; its
 * "127.0.0.1:PORT" into target. */
static rpc_server *loopback_server_start(rpc_server_config cfg, char target[64]) {
  cfg.listen = "127.0.0.1:0";
  rpc_server *server;
  assert_ok(rpc_server_start(&cfg, &server));
  assert_true(rpc_server_port(server) > 0);
  snprintf(target, 64, "127.0.0.1:%d", rpc_server_port(server));
  return server;
}

static void server_start(test_server *t, const char *secret, size_t max_message,
                         uint32_t threads) {
  memset(t, 0, sizeof *t);
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.secret = secret;
  cfg.max_message = max_message;
  cfg.handler_threads = threads;
  cfg.handler = test_handler;
  cfg.handler_arg = t;
  t->server = loopback_server_start(cfg, t->target);
}

static void server_stop(test_server *t) {
  rpc_server_stop(t->server);
  t->server = NULL;
}

/* Waits (at most 5 s) until *counter reaches `want`. */
static void wait_for(atomic_int *counter, int want) {
  for (int i = 0; i < 5000 && atomic_load(counter) < want; i++) sleep_ms(1);
  assert_int_equal(atomic_load(counter), want);
}

static void fill_pattern(uint8_t *p, size_t len, uint32_t seed) {
  for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 8));
}

static fl_status call_fail(rpc_channel *ch, fl_status code, const char *message) {
  uint8_t req[256];
  int32_t c = (int32_t)code;
  memcpy(req, &c, 4);
  size_t len = message ? strlen(message) : 0;
  memcpy(req + 4, message ? message : "", len);
  fl_buf out = FL_BUF_INIT;
  fl_status s = rpc_call(ch, "/test/Fail", fl_bytes_of(req, 4 + len), 5000, &out);
  assert_int_equal(out.len, 0); /* untouched on failure */
  fl_buf_free(&out);
  return s;
}

/* The quick handler answers /test/Echo and /test/Fail as the handler would and declines
 * /test/Decline, which the handler then echoes; /test/Grow is not offered to it at all. */
static const char *const quick_methods[] = {"/test/Echo", "/test/Fail", "/test/Decline", NULL};

static bool test_quick(void *arg, const rpc_request *req, fl_buf *response, fl_status *status) {
  test_server *t = arg;
  atomic_fetch_add(&t->quick_offered, 1);
  if (strcmp(req->method, "/test/Decline") == 0) return false;
  atomic_fetch_add(&t->quick_answered, 1);
  *status = test_handler(arg, req, response);
  atomic_fetch_sub(&t->calls, 1); /* counted as quick, not as a handler run */
  return true;
}

static fl_status quick_or_echo_handler(void *arg, const rpc_request *req, fl_buf *response) {
  if (strcmp(req->method, "/test/Decline") == 0) {
    atomic_fetch_add(&((test_server *)arg)->calls, 1);
    return fl_buf_append(response, req->body.data, req->body.len);
  }
  return test_handler(arg, req, response);
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_echo_round_trip_sizes(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 0);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  size_t sizes[] = {0, 1, 7, 4097, 1 << 20, (1 << 20) + 13};
  uint8_t *data = malloc((1 << 20) + 13);
  assert_non_null(data);
  fl_buf out = FL_BUF_INIT;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    fill_pattern(data, sizes[i], (uint32_t)i);
    assert_ok(fl_buf_append(&out, "stale", 5)); /* replaced by the reply */
    assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(data, sizes[i]), 10000, &out));
    assert_int_equal(out.len, sizes[i]);
    if (sizes[i]) assert_memory_equal(out.data, data, sizes[i]);
  }
  assert_int_equal(atomic_load(&t.calls), (int)(sizeof sizes / sizeof sizes[0]));
  fl_buf_free(&out);
  free(data);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

static void test_handler_error_propagates_exactly(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  char want[256];
  /* Every failure code, including those that also name network failures: the handler's
   * own status wins over the gRPC code it travels as. */
  fl_status codes[] = {FL_EINVAL, FL_ENOMEM, FL_EIO,     FL_ENOENT,    FL_EFORMAT,
                       FL_EEMPTY, FL_EUSER,  FL_EJOB,    FL_ECORRUPT,  FL_ECANCELLED,
                       FL_ESTATE, FL_EEXIST, FL_ELIMIT,  FL_EINTERNAL, FL_EFETCH,
                       FL_ENET,   FL_EAUTH,  FL_ETIMEDOUT, FL_EPROTO};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    char message[64];
    snprintf(message, sizeof message, "stage %zu failed: boom \"%%\" ü", i);
    assert_int_equal(call_fail(ch, codes[i], message), codes[i]);
    snprintf(want, sizeof want, "/test/Fail on %s: %s", t.target, message);
    assert_string_equal(fl_last_error(), want);
  }
  /* No message: the code's description. */
  assert_int_equal(call_fail(ch, FL_EJOB, NULL), FL_EJOB);
  snprintf(want, sizeof want, "/test/Fail on %s: %s", t.target, fl_strerror(FL_EJOB));
  assert_string_equal(fl_last_error(), want);
  /* A status outside the table is the handler's bug. */
  assert_fails_with(call_fail(ch, (fl_status)999, "x"), FL_EINTERNAL, "unknown status 999");
  /* An unknown method reaches the handler, which says so. */
  fl_buf out = FL_BUF_INIT;
  assert_fails_with(rpc_call(ch, "/test/Nope", fl_bytes_str("x"), 5000, &out), FL_ENOENT,
                    "no method /test/Nope");
  rpc_channel_destroy(ch);
  server_stop(&t);
}

static void test_auth_refuses_missing_and_wrong_secret(void **state) {
  (void)state;
  test_server t;
  server_start(&t, "s3cret-token", 0, 2);
  rpc_channel *none, *wrong, *prefix, *longer, *right;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &none));
  assert_ok(rpc_channel_create(t.target, "wrong-token!", 0, &wrong));
  assert_ok(rpc_channel_create(t.target, "s3cret", 0, &prefix));
  assert_ok(rpc_channel_create(t.target, "s3cret-token2", 0, &longer));
  assert_ok(rpc_channel_create(t.target, "s3cret-token", 0, &right));
  fl_buf out = FL_BUF_INIT;
  for (int i = 0; i < 2; i++) { /* refused again on the same connection */
    assert_fails_with(rpc_call(none, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                      "authentication failed: missing shared secret");
    assert_fails_with(rpc_call(wrong, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                      "authentication failed: wrong shared secret");
    assert_fails_with(rpc_call(prefix, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                      "wrong shared secret");
    assert_fails_with(rpc_call(longer, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                      "wrong shared secret");
  }
  /* A large request that is refused without being read. */
  size_t big_len = 3 << 20;
  uint8_t *big = calloc(1, big_len);
  assert_non_null(big);
  assert_fails_with(rpc_call(wrong, "/test/Echo", fl_bytes_of(big, big_len), 5000, &out),
                    FL_EAUTH, "wrong shared secret");
  free(big);
  assert_int_equal(out.len, 0);
  assert_int_equal(atomic_load(&t.calls), 0); /* the handler never ran */
  assert_ok(rpc_call(right, "/test/Echo", fl_bytes_str("hi"), 5000, &out));
  assert_int_equal(out.len, 2);
  assert_int_equal(atomic_load(&t.calls), 1);
  fl_buf_free(&out);
  rpc_channel_destroy(none);
  rpc_channel_destroy(wrong);
  rpc_channel_destroy(prefix);
  rpc_channel_destroy(longer);
  rpc_channel_destroy(right);
  server_stop(&t);

  /* A server without a secret ignores one sent. */
  server_start(&t, "", 0, 1);
  assert_ok(rpc_channel_create(t.target, "anything", 0, &right));
  assert_ok(rpc_call(right, "/test/Echo", fl_bytes_str("hi"), 5000, &out));
  fl_buf_free(&out);
  rpc_channel_destroy(right);
  server_stop(&t);
}

static void test_oversized_messages_refused_and_server_keeps_serving(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 1 << 20, 2);
  rpc_channel *ch, *small;
  assert_ok(rpc_channel_create(t.target, NULL, 8 << 20, &ch));
  assert_ok(rpc_channel_create(t.target, NULL, 64 << 10, &small));
  size_t big_len = 2 << 20;
  uint8_t *big = malloc(big_len);
  assert_non_null(big);
  fill_pattern(big, big_len, 3);
  fl_buf out = FL_BUF_INIT;
  /* Over the server's limit: gRPC refuses it there. */
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_of(big, big_len), 5000, &out), FL_EPROTO,
                    "size limit");
  assert_int_equal(atomic_load(&t.calls), 0);
  /* Over the channel's own limit: refused before it is sent. */
  assert_fails_with(rpc_call(small, "/test/Echo", fl_bytes_of(big, 100 << 10), 5000, &out),
                    FL_EPROTO, "over the limit of 65536 bytes");
  /* A reply over the server's limit. */
  uint32_t grow = (1 << 20) + 1;
  assert_fails_with(rpc_call(ch, "/test/Grow", fl_bytes_of(&grow, 4), 5000, &out), FL_EPROTO,
                    "reply of 1048577 bytes is over the limit of 1048576 bytes");
  /* A reply over the channel's limit. */
  grow = 100 << 10;
  assert_fails_with(rpc_call(small, "/test/Grow", fl_bytes_of(&grow, 4), 5000, &out), FL_EPROTO,
                    "size limit");
  /* Exactly at the limit passes, and the server still serves everyone. */
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(big, 1 << 20), 5000, &out));
  assert_int_equal(out.len, 1 << 20);
  assert_memory_equal(out.data, big, 1 << 20);
  assert_ok(rpc_call(small, "/test/Echo", fl_bytes_str("still here"), 5000, &out));
  assert_int_equal(out.len, 10);
  fl_buf_free(&out);
  free(big);
  rpc_channel_destroy(ch);
  rpc_channel_destroy(small);
  server_stop(&t);
}

static void test_timeout_cancels_blocked_handler(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("warm"), 5000, &out)); /* connect first */
  /* FL_ETIMEDOUT shows that the deadline, not the handler, ended the call: a handler that is
   * never cancelled fails with "never cancelled" after 10 s instead. The call cannot end
   * before its deadline (a lower bound no load can break), so it is not timed here. */
  double t0 = now_ms();
  assert_fails_with(rpc_call(ch, "/test/Block", fl_bytes_str(""), 150, &out), FL_ETIMEDOUT,
                    "no reply within 150 ms");
  assert_true(now_ms() - t0 >= 140);
  wait_for(&t.blocked, 1);
  wait_for(&t.saw_cancelled, 1);
  /* The handler thread is free again. */
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("after"), 5000, &out));
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

static void test_unreachable_port_fails_fast(void **state) {
  (void)state;
  /* A port that was just free: start a server to learn one, then stop it. */
  test_server t;
  server_start(&t, NULL, 0, 1);
  char target[64];
  snprintf(target, sizeof target, "%s", t.target);
  server_stop(&t);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  /* FL_ENET, not FL_ETIMEDOUT: the refused connection, not the 30 s deadline, ends each
   * call (the second during the reconnect backoff). */
  for (int i = 0; i < 2; i++)
    assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("x"), 30000, &out), FL_ENET,
                      "cannot reach 127.0.0.1:");
  rpc_channel_destroy(ch);
}

/* Bytes that are not HTTP/2, and an HTTP/2 preface followed by garbage frames, then a
 * close: the server drops those connections and keeps serving. */
static void test_garbage_on_the_port_is_harmless(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 1);
  const char *junk[] = {
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\x01\x00\x00\x00\x00\x01garbage",
      "\x00\x01\x02\x03\x04\x05\x06\x07",
  };
  for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)rpc_server_port(t.server))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
    size_t len = i == 1 ? 24 + 9 + 7 : strlen(junk[i]);
    if (i == 2) len = 8;
    assert_int_equal(send(fd, junk[i], len, MSG_NOSIGNAL), (ssize_t)len);
    char buf[256];
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)!recv(fd, buf, sizeof buf, 0); /* whatever the server answers, if anything */
    close(fd);
  }
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("fine"), 5000, &out));
  assert_int_equal(out.len, 4);
  assert_int_equal(atomic_load(&t.calls), 1);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* A server restarted on the same port is found again by the same channel: a call during the
 * stop fails with FL_ENET, and calls succeed again within seconds. */
static void test_channel_finds_a_restarted_server(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  int port = rpc_server_port(t.server);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("one"), 5000, &out));
  server_stop(&t);
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("gone"), 5000, &out), FL_ENET, "cannot reach");

  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.listen = listen;
  cfg.handler = test_handler;
  cfg.handler_arg = &t;
  assert_ok(rpc_server_start(&cfg, &t.server));
  fl_status status = FL_ENET;
  for (double deadline = now_ms() + 8000; status != FL_OK && now_ms() < deadline; sleep_ms(50))
    status = rpc_call(ch, "/test/Echo", fl_bytes_str("two"), 5000, &out);
  assert_ok(status);
  assert_int_equal(out.len, 3);
  assert_memory_equal(out.data, "two", 3);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

typedef struct hammer_arg {
  rpc_channel *ch;
  uint32_t id;
  int failures;
} hammer_arg;

static void *hammer_main(void *p) {
  hammer_arg *a = p;
  fl_buf out = FL_BUF_INIT;
  uint8_t req[300];
  for (uint32_t i = 0; i < 200; i++) {
    size_t len = (a->id * 37 + i * 11) % sizeof req;
    fill_pattern(req, len, a->id * 1000 + i);
    if (rpc_call(a->ch, "/test/Echo", fl_bytes_of(req, len), 10000, &out) != FL_OK ||
        out.len != len || (len && memcmp(out.data, req, len) != 0))
      a->failures++;
  }
  fl_buf_free(&out);
  return NULL;
}

static void test_concurrent_calls_on_one_channel(void **state) {
  (void)state;
  test_server t;
  server_start(&t, "k", 0, 4);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, "k", 0, &ch));
  pthread_t threads[8];
  hammer_arg args[8];
  for (uint32_t i = 0; i < 8; i++) {
    args[i] = (hammer_arg){ch, i, 0};
    assert_int_equal(pthread_create(&threads[i], NULL, hammer_main, &args[i]), 0);
  }
  for (int i = 0; i < 8; i++) {
    assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(args[i].failures, 0);
  }
  assert_int_equal(atomic_load(&t.calls), 8 * 200);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* A call sent by one thread (rpc_call_begin returns at once) and waited for by another, as
 * the driver's scheduler and sender threads do: several begun before any is ended, each
 * reply its own; a failure travels through the end; an end without a buffer gives only the
 * outcome; bad arguments begin nothing. */
typedef struct ended_call {
  rpc_pending *pending;
  fl_buf reply;
  fl_status status;
  char message[256];
} ended_call;

static void *end_call_main(void *p) {
  ended_call *e = p;
  e->status = rpc_call_end(e->pending, &e->reply);
  snprintf(e->message, sizeof e->message, "%s", e->status == FL_OK ? "" : fl_last_error());
  return NULL;
}

static void test_call_begun_here_ended_elsewhere(void **state) {
  (void)state;
  test_server t;
  server_start(&t, "k", 0, 4);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, "k", 0, &ch));
  ended_call calls[3];
  const char *bodies[3] = {"first", "second", "third"};
  for (int i = 0; i < 3; i++) {
    calls[i] = (ended_call){.reply = FL_BUF_INIT};
    assert_ok(rpc_call_begin(ch, "/test/Echo", fl_bytes_str(bodies[i]), 5000, &calls[i].pending));
    assert_non_null(calls[i].pending);
  }
  pthread_t threads[3];
  for (int i = 2; i >= 0; i--) assert_int_equal(pthread_create(&threads[i], NULL, end_call_main, &calls[i]), 0);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(pthread_join(threads[i], NULL), 0);
    assert_int_equal(calls[i].status, FL_OK);
    assert_int_equal(calls[i].reply.len, strlen(bodies[i]));
    assert_memory_equal(calls[i].reply.data, bodies[i], strlen(bodies[i]));
    fl_buf_free(&calls[i].reply);
  }

  uint8_t fail[4 + 4];
  int32_t code = FL_EJOB;
  memcpy(fail, &code, 4);
  memcpy(fail + 4, "boom", 4);
  rpc_pending *p;
  assert_ok(rpc_call_begin(ch, "/test/Fail", fl_bytes_of(fail, sizeof fail), 5000, &p));
  fl_buf out = FL_BUF_INIT;
  assert_fails_with(rpc_call_end(p, &out), FL_EJOB, "/test/Fail on 127.0.0.1:");
  assert_non_null(strstr(fl_last_error(), ": boom"));
  assert_int_equal(out.len, 0);
  assert_ok(rpc_call_begin(ch, "/test/Echo", fl_bytes_str("x"), 5000, &p));
  assert_ok(rpc_call_end(p, NULL)); /* the outcome only */

  assert_int_equal(rpc_call_begin(ch, "no-slash", fl_bytes_str("x"), 1000, &p), FL_EINVAL);
  assert_null(p);
  assert_int_equal(rpc_call_begin(NULL, "/test/Echo", fl_bytes_str("x"), 1000, &p), FL_EINVAL);
  assert_null(p);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

typedef struct abandoner {
  atomic_bool *flag;
  int after_ms;
} abandoner;

static void *abandon_later(void *p) {
  abandoner *a = p;
  sleep_ms(a->after_ms);
  atomic_store(a->flag, true);
  return NULL;
}

/* A waiter told to give up (rpc_call_end_unless) cancels the call at the server and returns
 * FL_ECANCELLED within about RPC_ABANDON_POLL_MS; a reply that came first still counts; a
 * flag that stays false changes nothing. */
static void test_call_end_gives_up_when_told(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));

  atomic_bool abandon = false;
  rpc_pending *p;
  /* A deadline of 10 min, far beyond the give-up: FL_ECANCELLED "given up" is then what
   * shows that the flag ended the wait. A broken give-up does not hang either: the handler
   * fails "never cancelled" after 10 s. */
  assert_ok(rpc_call_begin(ch, "/test/Block", fl_bytes_str(""), 600000, &p));
  wait_for(&t.blocked, 1);
  abandoner a = {&abandon, 100};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, abandon_later, &a), 0);
  fl_buf out = FL_BUF_INIT;
  assert_fails_with(rpc_call_end_unless(p, &abandon, &out), FL_ECANCELLED, "/test/Block on 127.0.0.1:");
  assert_true(atomic_load(&abandon)); /* it gave up only once told to */
  assert_non_null(strstr(fl_last_error(), "given up without a reply"));
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(out.len, 0);
  wait_for(&t.saw_cancelled, 1); /* the server's handler saw the cancel */

  /* Already true, but the reply is there first: the call succeeds. A busy host may not have
   * the reply in yet after the wait, and then giving up is right; so it is tried again with
   * longer waits (0.5 s to 8 s), and only a give-up that ignores a reply fails every try. */
  fl_status kept = FL_ECANCELLED;
  for (int wait = 500; wait <= 8000 && kept == FL_ECANCELLED; wait *= 2) {
    assert_ok(rpc_call_begin(ch, "/test/Echo", fl_bytes_str("kept"), 600000, &p));
    sleep_ms(wait);
    kept = rpc_call_end_unless(p, &abandon, &out);
  }
  assert_ok(kept);
  assert_int_equal(out.len, 4);
  assert_memory_equal(out.data, "kept", 4);

  /* A flag that stays false: as rpc_call_end, failures included. */
  atomic_store(&abandon, false);
  uint8_t fail[4];
  int32_t code = FL_EJOB;
  memcpy(fail, &code, 4);
  assert_ok(rpc_call_begin(ch, "/test/Fail", fl_bytes_of(fail, sizeof fail), 5000, &p));
  assert_int_equal(rpc_call_end_unless(p, &abandon, NULL), FL_EJOB);
  assert_ok(rpc_call_begin(ch, "/test/Echo", fl_bytes_str("x"), 5000, &p));
  assert_ok(rpc_call_end_unless(p, NULL, NULL));
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

typedef struct blocked_call {
  rpc_channel *ch;
  fl_status status;
  char message[512];
} blocked_call;

static void *blocked_call_main(void *p) {
  blocked_call *b = p;
  fl_buf out = FL_BUF_INIT;
  b->status = rpc_call(b->ch, "/test/Block", fl_bytes_str(""), 0, &out); /* no deadline */
  snprintf(b->message, sizeof b->message, "%s", fl_last_error());
  fl_buf_free(&out);
  return NULL;
}

static void test_stop_cancels_blocked_handlers(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  /* Three calls on two handler threads: one waits its turn in the queue. */
  blocked_call calls[3];
  pthread_t threads[3];
  for (int i = 0; i < 3; i++) {
    calls[i] = (blocked_call){ch, FL_OK, ""};
    assert_int_equal(pthread_create(&threads[i], NULL, blocked_call_main, &calls[i]), 0);
  }
  wait_for(&t.blocked, 2);
  sleep_ms(50); /* the third reaches the server */
  server_stop(&t);
  /* Both handlers saw the cancel, so the stop ended them; without it each would have waited
   * 10 s and failed "never cancelled". */
  assert_int_equal(atomic_load(&t.saw_cancelled), 2);
  assert_int_equal(atomic_load(&t.blocked), 2); /* the queued call never ran */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(pthread_join(threads[i], NULL), 0);
    if (calls[i].status != FL_ENET) fprintf(stderr, "call %d: %s\n", i, calls[i].message);
    assert_int_equal(calls[i].status, FL_ENET);
  }
  rpc_channel_destroy(ch);
}

static void test_bad_arguments(void **state) {
  (void)state;
  rpc_server *s = NULL;
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  assert_int_equal(rpc_server_start(&cfg, &s), FL_EINVAL); /* no address */
  cfg.listen = "127.0.0.1:0";
  assert_int_equal(rpc_server_start(&cfg, &s), FL_EINVAL); /* no handler */
  cfg.handler = test_handler;
  cfg.secret = "tab\there";
  assert_fails_with(rpc_server_start(&cfg, &s), FL_EINVAL, "printable ASCII");
  cfg.secret = NULL;
  cfg.listen = "not an address";
  assert_fails_with(rpc_server_start(&cfg, &s), FL_ENET, "cannot listen on not an address");
  assert_null(s);

  /* A port in use is refused, not shared. */
  test_server t;
  server_start(&t, NULL, 0, 1);
  cfg.listen = t.target;
  cfg.handler_arg = &t;
  assert_fails_with(rpc_server_start(&cfg, &s), FL_ENET, "cannot listen on 127.0.0.1:");
  assert_null(s);

  rpc_channel *ch = NULL;
  assert_int_equal(rpc_channel_create(NULL, NULL, 0, &ch), FL_EINVAL);
  assert_fails_with(rpc_channel_create(t.target, "bad\nsecret", 0, &ch), FL_EINVAL,
                    "printable ASCII");
  assert_null(ch);
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  assert_int_equal(rpc_call(ch, "no-slash", fl_bytes_str("x"), 1000, &out), FL_EINVAL);
  assert_int_equal(rpc_call(ch, "/test/Echo", fl_bytes_str("x"), 1000, NULL), FL_EINVAL);
  assert_int_equal(rpc_call(NULL, "/test/Echo", fl_bytes_str("x"), 1000, &out), FL_EINVAL);
  rpc_channel_destroy(ch);
  server_stop(&t);
  rpc_channel_destroy(NULL);
  rpc_server_stop(NULL);
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void test_latency_p50(void **state) {
  (void)state;
  test_server t;
  server_start(&t, "secret", 0, 0);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, "secret", 0, &ch));
  fl_buf out = FL_BUF_INIT;
  uint8_t req[64];
  fill_pattern(req, sizeof req, 1);
  for (int i = 0; i < 200; i++) /* connect and warm up */
    assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(req, sizeof req), 5000, &out));
  enum { N = 2000 };
  static double us[N];
  for (int i = 0; i < N; i++) {
    uint64_t t0 = common_now_ns();
    assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(req, sizeof req), 5000, &out));
    us[i] = (double)(common_now_ns() - t0) / 1e3;
  }
  qsort(us, N, sizeof us[0], compare_double);
  printf("rpc: %d unary calls of 64 bytes over loopback: p50 %.0f us, p90 %.0f us, p99 %.0f us\n",
         N, us[N / 2], us[N * 9 / 10], us[N * 99 / 100]);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* A loopback server with a quick handler for `methods`. */
static rpc_server *quick_server_start(rpc_handler_fn handler, rpc_quick_fn quick, const char *const *methods,
                                      void *arg, char target[64]) {
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.handler = handler;
  cfg.handler_arg = arg;
  cfg.quick = quick;
  cfg.quick_methods = methods;
  return loopback_server_start(cfg, target);
}

static void test_quick_handler_answers_listed_methods_on_the_queue_thread(void **state) {
  (void)state;
  test_server t;
  memset(&t, 0, sizeof t);
  t.server = quick_server_start(quick_or_echo_handler, test_quick, quick_methods, &t, t.target);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  size_t len = RPC_QUICK_MAX_REQUEST; /* big enough to arrive in several slices */
  uint8_t *data = malloc(len + 1);
  assert_non_null(data);
  fill_pattern(data, len + 1, 3);
  fl_buf out = FL_BUF_INIT;

  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(data, len), 5000, &out));
  assert_int_equal(out.len, len);
  assert_memory_equal(out.data, data, len);
  assert_int_equal(atomic_load(&t.quick_answered), 1);
  assert_int_equal(atomic_load(&t.calls), 0);

  /* One byte over the limit: a handler thread decodes it, the quick handler never sees it. */
  out.len = 0;
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(data, len + 1), 5000, &out));
  assert_int_equal(out.len, len + 1);
  assert_memory_equal(out.data, data, len + 1);
  assert_int_equal(atomic_load(&t.quick_offered), 1);
  assert_int_equal(atomic_load(&t.calls), 1);
  atomic_store(&t.calls, 0);

  assert_int_equal(call_fail(ch, FL_ENOENT, "no such block"), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), ": no such block"));
  assert_int_equal(atomic_load(&t.quick_answered), 2);

  out.len = 0;
  assert_ok(rpc_call(ch, "/test/Decline", fl_bytes_of(data, 100), 5000, &out));
  assert_int_equal(out.len, 100);
  assert_memory_equal(out.data, data, 100);
  assert_int_equal(atomic_load(&t.quick_offered), 3);
  assert_int_equal(atomic_load(&t.quick_answered), 2);
  assert_int_equal(atomic_load(&t.calls), 1);

  out.len = 0;
  uint32_t want = 5000;
  assert_ok(rpc_call(ch, "/test/Grow", fl_bytes_of(&want, 4), 5000, &out));
  assert_int_equal(out.len, want);
  assert_int_equal(atomic_load(&t.quick_offered), 3); /* not listed: never offered */
  assert_int_equal(atomic_load(&t.calls), 2);

  fl_buf_free(&out);
  free(data);
  rpc_channel_destroy(ch);
  rpc_server_stop(t.server);
}

/* ---- deferred replies: a replier thread answers calls that handlers left open ------------ */

typedef struct later_server {
  rpc_server *server;
  pthread_mutex_t lock;
  rpc_deferred *waiting[8];
  fl_bytes bodies[8];
  int num_waiting;
  atomic_int deferred_on_queue_thread, deferred_on_handler;
} later_server;

/* /test/Later (quick) and /test/LaterSlow (handler threads) defer; the replier echoes the
 * body, or fails with FL_ENOENT when it starts with "fail". /test/Hold defers and waits for
 * the call's cancellation (the server stopping). */
static void later_take(later_server *l, const rpc_request *req) {
  rpc_deferred *d = rpc_defer(req);
  FL_PCHECK(pthread_mutex_lock(&l->lock));
  FL_ASSERT(l->num_waiting < 8);
  l->bodies[l->num_waiting] = req->body; /* valid until the reply */
  l->waiting[l->num_waiting++] = d;
  FL_PCHECK(pthread_mutex_unlock(&l->lock));
}

static bool later_quick(void *arg, const rpc_request *req, fl_buf *response, fl_status *status) {
  (void)response;
  (void)status;
  later_server *l = arg;
  if (strcmp(req->method, "/test/Later") != 0) return false;
  atomic_fetch_add(&l->deferred_on_queue_thread, 1);
  later_take(l, req);
  return true;
}

static fl_status later_handler(void *arg, const rpc_request *req, fl_buf *response) {
  later_server *l = arg;
  atomic_fetch_add(&l->deferred_on_handler, 1);
  later_take(l, req);
  return fl_buf_append(response, "dropped", 7); /* a deferred call's response is dropped */
}

/* Replies to every waiting call whose condition holds: all of them, or only the cancelled. */
static int later_reply(later_server *l, bool only_cancelled) {
  int replied = 0;
  FL_PCHECK(pthread_mutex_lock(&l->lock));
  for (int i = 0; i < l->num_waiting;) {
    if (only_cancelled && !atomic_load(rpc_deferred_cancelled(l->waiting[i]))) {
      i++;
      continue;
    }
    fl_buf out = FL_BUF_INIT;
    fl_bytes b = l->bodies[i];
    if (b.len >= 4 && memcmp(b.data, "fail", 4) == 0) {
      rpc_deferred_reply(l->waiting[i], FL_ENOENT, "nothing later", &out);
    } else {
      assert_ok(fl_buf_append(&out, b.data, b.len));
      rpc_deferred_reply(l->waiting[i], FL_OK, NULL, &out);
    }
    l->waiting[i] = l->waiting[l->num_waiting - 1];
    l->bodies[i] = l->bodies[--l->num_waiting];
    replied++;
  }
  FL_PCHECK(pthread_mutex_unlock(&l->lock));
  return replied;
}

typedef struct later_call {
  rpc_channel *ch;
  const char *method, *body;
  fl_status status;
  fl_buf out;
  char error[256];
} later_call;

static void *later_call_main(void *arg) {
  later_call *c = arg;
  c->status = rpc_call(c->ch, c->method, fl_bytes_of(c->body, strlen(c->body)), 10000, &c->out);
  snprintf(c->error, sizeof c->error, "%s", c->status == FL_OK ? "" : fl_last_error());
  return NULL;
}

static void *stop_main(void *arg) {
  rpc_server_stop(arg);
  return NULL;
}

static void test_deferred_replies_come_from_another_thread(void **state) {
  (void)state;
  later_server l;
  memset(&l, 0, sizeof l);
  FL_PCHECK(pthread_mutex_init(&l.lock, NULL));
  static const char *const later_methods[] = {"/test/Later", NULL};
  char target[64];
  l.server = quick_server_start(later_handler, later_quick, later_methods, &l, target);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(target, NULL, 0, &ch));

  later_call calls[3] = {{ch, "/test/Later", "on the queue thread", 0, FL_BUF_INIT, ""},
                         {ch, "/test/LaterSlow", "on a handler thread", 0, FL_BUF_INIT, ""},
                         {ch, "/test/Later", "fail, later", 0, FL_BUF_INIT, ""}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) FL_PCHECK(pthread_create(&th[i], NULL, later_call_main, &calls[i]));
  double deadline = now_ms() + 5000;
  while (now_ms() < deadline) { /* all three wait, none answered yet */
    FL_PCHECK(pthread_mutex_lock(&l.lock));
    int n = l.num_waiting;
    FL_PCHECK(pthread_mutex_unlock(&l.lock));
    if (n == 3) break;
    sleep_ms(2);
  }
  assert_int_equal(atomic_load(&l.deferred_on_queue_thread), 2);
  assert_int_equal(atomic_load(&l.deferred_on_handler), 1);
  sleep_ms(20);
  for (int i = 0; i < 3; i++) assert_int_equal(calls[i].out.len, 0); /* still open */
  assert_int_equal(later_reply(&l, false), 3);
  for (int i = 0; i < 3; i++) FL_PCHECK(pthread_join(th[i], NULL));
  for (int i = 0; i < 2; i++) {
    assert_ok(calls[i].status);
    assert_int_equal(calls[i].out.len, strlen(calls[i].body));
    assert_memory_equal(calls[i].out.data, calls[i].body, calls[i].out.len);
  }
  assert_int_equal(calls[2].status, FL_ENOENT);
  assert_non_null(strstr(calls[2].error, "nothing later"));

  /* A call left open when the server stops: stop cancels it and waits for its reply. */
  later_call held = {ch, "/test/Later", "held over the stop", 0, FL_BUF_INIT, ""};
  pthread_t held_th, stop_th;
  FL_PCHECK(pthread_create(&held_th, NULL, later_call_main, &held));
  deadline = now_ms() + 5000;
  while (atomic_load(&l.deferred_on_queue_thread) < 3 && now_ms() < deadline) sleep_ms(2);
  assert_int_equal(atomic_load(&l.deferred_on_queue_thread), 3);
  FL_PCHECK(pthread_create(&stop_th, NULL, stop_main, l.server));
  int replied = 0;
  deadline = now_ms() + 5000;
  while (!replied && now_ms() < deadline) {
    replied = later_reply(&l, true); /* only once cancelled */
    sleep_ms(2);
  }
  assert_int_equal(replied, 1);
  FL_PCHECK(pthread_join(stop_th, NULL));
  FL_PCHECK(pthread_join(held_th, NULL));
  assert_true(held.status != FL_OK); /* the client saw the stop, not a reply */
  for (int i = 0; i < 3; i++) fl_buf_free(&calls[i].out);
  fl_buf_free(&held.out);
  rpc_channel_destroy(ch);
  FL_PCHECK(pthread_mutex_destroy(&l.lock));
}

/* ---- connection limits ------------------------------------------------------------------ */
/* Bounds only a hang exceeds; the timeouts under test are 300 ms. */
#define HANG_BOUND_MS 30000

static void limited_server_start(test_server *t, int64_t idle_ms, int64_t handshake_ms) {
  memset(t, 0, sizeof *t);
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.handler = test_handler;
  cfg.handler_arg = t;
  cfg.idle_timeout_ms = idle_ms;
  cfg.handshake_timeout_ms = handshake_ms;
  t->server = loopback_server_start(cfg, t->target);
}

static int raw_connect(const test_server *t) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)rpc_server_port(t->server))};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&addr, sizeof addr), 0);
  return fd;
}

/* Reads what the server sends on a raw connection until it closes it (true) or HANG_BOUND_MS
 * pass (false). As an HTTP/2 client that made no call would, it acknowledges the server's
 * SETTINGS and PINGs; *goaways counts the GOAWAY frames (may be NULL: the bytes are not
 * parsed as frames). */
static bool served_until_closed(int fd, int *goaways) {
  uint8_t buf[1 << 16];
  size_t have = 0;
  for (double deadline = now_ms() + HANG_BOUND_MS; now_ms() < deadline;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
    if (n <= 0) return true;
    if (!goaways) continue;
    have += (size_t)n;
    for (;;) { /* whole frames: 3 bytes length, type, flags, 4 bytes stream, payload */
      if (have < 9) break;
      size_t len = (size_t)buf[0] << 16 | (size_t)buf[1] << 8 | buf[2];
      if (have < 9 + len) break;
      uint8_t type = buf[3], flags = buf[4];
      if (type == 4 && !(flags & 1)) {
        static const uint8_t ack[9] = {0, 0, 0, 4, 1, 0, 0, 0, 0};
        (void)!send(fd, ack, sizeof ack, MSG_NOSIGNAL);
      } else if (type == 6 && !(flags & 1) && len == 8) {
        uint8_t pong[17] = {0, 0, 8, 6, 1, 0, 0, 0, 0};
        memcpy(pong + 9, buf + 9, 8);
        (void)!send(fd, pong, sizeof pong, MSG_NOSIGNAL);
      } else if (type == 7) {
        (*goaways)++;
      }
      memmove(buf, buf + 9 + len, have - 9 - len);
      have -= 9 + len;
    }
    if (have == sizeof buf) have = 0; /* a frame larger than the buffer: never from gRPC here */
  }
  return false;
}

/* A client that connects and never starts HTTP/2, or stalls in the middle of its preface, is
 * closed after the handshake timeout; everyone else is still served. */
static void test_silent_connection_closed_after_handshake_timeout(void **state) {
  (void)state;
  test_server t;
  limited_server_start(&t, RPC_UNLIMITED, 300);
  int silent = raw_connect(&t);
  int half = raw_connect(&t);
  const char *preface = "PRI * HTTP/2.0\r\n";
  assert_int_equal(send(half, preface, strlen(preface), MSG_NOSIGNAL), (ssize_t)strlen(preface));
  assert_true(served_until_closed(silent, NULL));
  assert_true(served_until_closed(half, NULL));
  close(silent);
  close(half);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("fine"), 5000, &out));
  assert_int_equal(out.len, 4);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* A connection without calls is closed after the idle timeout (a GOAWAY, then the close); a
 * channel whose connection was closed so reconnects for its next call without an error; and
 * a call much longer than the idle timeout is not cut. */
static void test_idle_connection_closed_and_long_calls_kept(void **state) {
  (void)state;
  test_server t;
  limited_server_start(&t, 300, RPC_UNLIMITED);

  /* An HTTP/2 client that makes no call. */
  int fd = raw_connect(&t);
  static const uint8_t hello[24 + 9] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  assert_int_equal(send(fd, hello, sizeof hello, MSG_NOSIGNAL), (ssize_t)sizeof hello);
  int goaways = 0;
  assert_true(served_until_closed(fd, &goaways));
  assert_true(goaways >= 1);
  close(fd);

  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  uint32_t ms = 1500;
  assert_ok(rpc_call(ch, "/test/Sleep", fl_bytes_of(&ms, 4), 0, &out));
  assert_int_equal(out.len, 5);
  /* Idle past the timeout, then calls paced about the timeout, so that some meet the close. */
  sleep_ms(1000);
  for (int i = 0; i < 12; i++) {
    out.len = 0;
    assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("again"), 10000, &out));
    assert_int_equal(out.len, 5);
    sleep_ms(270 + 5 * i);
  }
  /* A long call on a channel that was idle: its connection is new, and not cut either. */
  out.len = 0;
  assert_ok(rpc_call(ch, "/test/Sleep", fl_bytes_of(&ms, 4), 0, &out));
  assert_int_equal(out.len, 5);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* ---- TLS -------------------------------------------------------------------------------- */
/* Certificates for 127.0.0.1 and localhost (certs), the same from another CA (other), and
 * one for flint.example only (named); made once for the program. */
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
  if (certs[0]) tls_remove_certs(certs);
  if (other[0]) tls_remove_certs(other);
  if (named[0]) tls_remove_certs(named);
  return 0;
}

/* After every test, passed or not: the next one starts without TLS. */
static int tls_reset(void **state) {
  (void)state;
  tls_env_off();
  return 0;
}

/* Starts t's server with the certificate of `dir` (the settings are read at the start only)
 * and leaves TLS off in the environment. */
static void tls_server_start(test_server *t, const char *dir, const char *secret) {
  tls_env_on(dir);
  server_start(t, secret, 0, 2);
  tls_env_off();
}

/* A channel to target that trusts the CA of `dir` (and presents its certificate too when
 * with_pair), made with TLS on, which is then left off again. */
static rpc_channel *tls_channel(const char *target, const char *dir, const char *server_name, const char *secret,
                                bool with_pair) {
  tls_env_on(dir);
  if (!with_pair) {
    unsetenv("FLINT_TLS_CERT");
    unsetenv("FLINT_TLS_KEY");
  }
  if (server_name) setenv("FLINT_TLS_SERVER_NAME", server_name, 1);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(target, secret, 0, &ch));
  tls_env_off();
  return ch;
}

/* With the right CA, calls of every size and reply work over TLS, and the secret is still
 * checked inside it. */
static void test_tls_calls_with_the_right_ca(void **state) {
  (void)state;
  test_server t;
  tls_server_start(&t, certs, "s3cret-token");
  rpc_channel *ch = tls_channel(t.target, certs, NULL, "s3cret-token", false);
  size_t sizes[] = {0, 1, 4097, (5 << 20) + 13};
  size_t most = (5 << 20) + 13;
  uint8_t *data = malloc(most);
  assert_non_null(data);
  fl_buf out = FL_BUF_INIT;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    fill_pattern(data, sizes[i], (uint32_t)i);
    assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_of(data, sizes[i]), 10000, &out));
    assert_int_equal(out.len, sizes[i]);
    if (sizes[i]) assert_memory_equal(out.data, data, sizes[i]);
  }
  uint32_t grow = 6 << 20;
  assert_ok(rpc_call(ch, "/test/Grow", fl_bytes_of(&grow, 4), 10000, &out));
  assert_int_equal(out.len, grow);
  assert_int_equal(((uint8_t *)out.data)[grow - 1], 'g');
  int handled = atomic_load(&t.calls);
  assert_int_equal(handled, (int)(sizeof sizes / sizeof sizes[0]) + 1);

  /* The secret, now encrypted, is still what admits a client. */
  rpc_channel *wrong = tls_channel(t.target, certs, NULL, "wrong-token!", false);
  rpc_channel *none = tls_channel(t.target, certs, NULL, NULL, false);
  assert_fails_with(rpc_call(wrong, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                    "authentication failed: wrong shared secret");
  assert_fails_with(rpc_call(none, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                    "authentication failed: missing shared secret");
  assert_int_equal(atomic_load(&t.calls), handled);

  /* A client that presents a certificate of its own, which the server does not ask for.
   * (Not dialled by a DNS name here: gRPC's resolver for names, c-ares, leaks a few bytes
   * that the sanitizer build reports; test_tls_server_certificate_checked checks names.) */
  rpc_channel *pair = tls_channel(t.target, certs, NULL, "s3cret-token", true);
  assert_ok(rpc_call(pair, "/test/Echo", fl_bytes_str("pair"), 5000, &out));
  assert_int_equal(out.len, 4);
  fl_buf_free(&out);
  free(data);
  rpc_channel_destroy(ch);
  rpc_channel_destroy(wrong);
  rpc_channel_destroy(none);
  rpc_channel_destroy(pair);
  server_stop(&t);
}

/* A listener that accepts connections and closes them at once, as a server that does not
 * speak the client's protocol might, until told to stop. */
typedef struct closing_listener {
  int fd;
  int port;
  atomic_bool stop;
  atomic_int closed;
  pthread_t thread;
} closing_listener;

static void *closing_listener_main(void *arg) {
  closing_listener *l = arg;
  while (!atomic_load(&l->stop)) {
    struct pollfd p = {l->fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    int fd = accept(l->fd, NULL, NULL);
    if (fd < 0) continue;
    close(fd);
    atomic_fetch_add(&l->closed, 1);
  }
  return NULL;
}

static void closing_listener_start(closing_listener *l) {
  memset(l, 0, sizeof *l);
  l->fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(l->fd >= 0);
  struct sockaddr_in addr = {.sin_family = AF_INET};
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(l->fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(l->fd, 16), 0);
  socklen_t len = sizeof addr;
  assert_int_equal(getsockname(l->fd, (struct sockaddr *)&addr, &len), 0);
  l->port = ntohs(addr.sin_port);
  FL_PCHECK(pthread_create(&l->thread, NULL, closing_listener_main, l));
}

static void closing_listener_stop(closing_listener *l) {
  atomic_store(&l->stop, true);
  FL_PCHECK(pthread_join(l->thread, NULL));
  assert_int_equal(close(l->fd), 0);
}

/* A client without TLS learns that the server speaks TLS; one whose server closes the
 * connection for another reason is not told so. */
static void test_tls_plaintext_client_told_the_server_speaks_tls(void **state) {
  (void)state;
  test_server t;
  tls_server_start(&t, certs, NULL);
  rpc_channel *ch;
  assert_ok(rpc_channel_create(t.target, NULL, 0, &ch));
  fl_buf out = FL_BUF_INIT;
  char want[128];
  snprintf(want, sizeof want, "cannot reach %s (calling /test/Echo): ", t.target);
  for (int i = 0; i < 2; i++) { /* and again while the channel backs off */
    assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_ENET, want);
    assert_non_null(strstr(fl_last_error(), "closed the connection during the handshake: it speaks TLS "
                                            "(FLINT_TLS=1) and this client does not"));
  }
  assert_int_equal(atomic_load(&t.calls), 0);
  rpc_channel_destroy(ch);
  server_stop(&t);

  closing_listener l;
  closing_listener_start(&l);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", l.port);
  assert_ok(rpc_channel_create(target, NULL, 0, &ch));
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_ENET, "cannot reach");
  assert_null(strstr(fl_last_error(), "TLS"));
  assert_true(atomic_load(&l.closed) >= 1);
  rpc_channel_destroy(ch);
  closing_listener_stop(&l);
  fl_buf_free(&out);
}

/* A TLS client learns that the server's answer was not TLS. */
static void test_tls_client_told_the_server_does_not_speak_tls(void **state) {
  (void)state;
  test_server t;
  server_start(&t, NULL, 0, 2);
  rpc_channel *ch = tls_channel(t.target, certs, NULL, NULL, false);
  fl_buf out = FL_BUF_INIT;
  char want[128];
  snprintf(want, sizeof want, "cannot reach %s (calling /test/Echo): TLS handshake failed", t.target);
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_ENET, want);
  assert_non_null(strstr(fl_last_error(), "the server may not use TLS (FLINT_TLS) and this client does"));
  assert_int_equal(atomic_load(&t.calls), 0);
  fl_buf_free(&out);
  rpc_channel_destroy(ch);
  server_stop(&t);
}

/* The channel checks the server's certificate against FLINT_TLS_CA and for the host dialled
 * or FLINT_TLS_SERVER_NAME; a failed check is FL_EAUTH naming the target and the cause. */
static void test_tls_server_certificate_checked(void **state) {
  (void)state;
  test_server t;
  tls_server_start(&t, certs, NULL);
  fl_buf out = FL_BUF_INIT;
  char want[512];

  rpc_channel *ch = tls_channel(t.target, other, NULL, NULL, false);
  snprintf(want, sizeof want,
           "/test/Echo on %s: TLS handshake failed: the server's certificate was not trusted", t.target);
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH, want);
  snprintf(want, sizeof want, "not signed by FLINT_TLS_CA=%s/ca.pem", other);
  assert_non_null(strstr(fl_last_error(), want));
  rpc_channel_destroy(ch);

  ch = tls_channel(t.target, certs, "nothere.example", NULL, false);
  snprintf(want, sizeof want, "/test/Echo on %s: TLS handshake failed: the server's certificate is not for "
           "nothere.example (FLINT_TLS_SERVER_NAME)", t.target);
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH, want);
  rpc_channel_destroy(ch);
  assert_int_equal(atomic_load(&t.calls), 0);
  server_stop(&t);

  /* A certificate for flint.example only: not for the address dialled, unless named. */
  tls_server_start(&t, named, NULL);
  ch = tls_channel(t.target, named, NULL, NULL, false);
  assert_fails_with(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out), FL_EAUTH,
                    "the server's certificate is not for 127.0.0.1 (the host dialled");
  rpc_channel_destroy(ch);
  ch = tls_channel(t.target, named, "flint.example", NULL, false);
  assert_ok(rpc_call(ch, "/test/Echo", fl_bytes_str("hi"), 5000, &out));
  assert_int_equal(out.len, 2);
  assert_int_equal(atomic_load(&t.calls), 1);
  rpc_channel_destroy(ch);
  server_stop(&t);
  fl_buf_free(&out);
}

/* Settings that cannot serve fail the server's start and the channel's creation with the
 * message of net/tls.c; the process goes on. */
static void test_tls_bad_settings_fail_start_and_create(void **state) {
  (void)state;
  rpc_server_config cfg = RPC_SERVER_CONFIG_INIT;
  cfg.listen = "127.0.0.1:0";
  cfg.handler = test_handler;
  rpc_server *server = NULL;
  rpc_channel *ch = NULL;
  tls_env_on(certs);
  unsetenv("FLINT_TLS_CERT");
  assert_fails_with(rpc_server_start(&cfg, &server), FL_EINVAL,
                    "FLINT_TLS is on but FLINT_TLS_CERT is not set");
  char path[512];
  tls_env_on(certs);
  snprintf(path, sizeof path, "%s/key.pem", other);
  setenv("FLINT_TLS_KEY", path, 1);
  assert_fails_with(rpc_server_start(&cfg, &server), FL_EINVAL, "is not the key of FLINT_TLS_CERT");
  assert_null(server);
  tls_env_on(certs);
  unsetenv("FLINT_TLS_CA");
  assert_fails_with(rpc_channel_create("127.0.0.1:1", NULL, 0, &ch), FL_EINVAL,
                    "FLINT_TLS is on but FLINT_TLS_CA is not set");
  setenv("FLINT_TLS_CA", "/nonexistent/ca.pem", 1);
  assert_fails_with(rpc_channel_create("127.0.0.1:1", NULL, 0, &ch), FL_EINVAL,
                    "FLINT_TLS_CA=/nonexistent/ca.pem cannot be used");
  snprintf(path, sizeof path, "%s/key.pem", certs);
  setenv("FLINT_TLS_CA", path, 1);
  assert_fails_with(rpc_channel_create("127.0.0.1:1", NULL, 0, &ch), FL_EINVAL, "holds no PEM certificate");
  assert_null(ch);
  /* And with good settings both work. */
  tls_env_on(certs);
  assert_ok(rpc_server_start(&cfg, &server));
  assert_ok(rpc_channel_create("127.0.0.1:1", NULL, 0, &ch));
  rpc_channel_destroy(ch);
  rpc_server_stop(server);
}

int main(void) {
  /* A hung call must not hang ctest's whole run: every test here ends within seconds. */
  alarm(100);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_echo_round_trip_sizes),
      cmocka_unit_test(test_quick_handler_answers_listed_methods_on_the_queue_thread),
      cmocka_unit_test(test_deferred_replies_come_from_another_thread),
      cmocka_unit_test(test_handler_error_propagates_exactly),
      cmocka_unit_test(test_auth_refuses_missing_and_wrong_secret),
      cmocka_unit_test(test_oversized_messages_refused_and_server_keeps_serving),
      cmocka_unit_test(test_timeout_cancels_blocked_handler),
      cmocka_unit_test(test_unreachable_port_fails_fast),
      cmocka_unit_test(test_garbage_on_the_port_is_harmless),
      cmocka_unit_test(test_concurrent_calls_on_one_channel),
      cmocka_unit_test(test_call_begun_here_ended_elsewhere),
      cmocka_unit_test(test_call_end_gives_up_when_told),
      cmocka_unit_test(test_stop_cancels_blocked_handlers),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_channel_finds_a_restarted_server),
      cmocka_unit_test(test_latency_p50),
      cmocka_unit_test(test_silent_connection_closed_after_handshake_timeout),
      cmocka_unit_test(test_idle_connection_closed_and_long_calls_kept),
      cmocka_unit_test_teardown(test_tls_calls_with_the_right_ca, tls_reset),
      cmocka_unit_test_teardown(test_tls_plaintext_client_told_the_server_speaks_tls, tls_reset),
      cmocka_unit_test_teardown(test_tls_client_told_the_server_does_not_speak_tls, tls_reset),
      cmocka_unit_test_teardown(test_tls_server_certificate_checked, tls_reset),
      cmocka_unit_test_teardown(test_tls_bad_settings_fail_start_and_create, tls_reset),
  };
  return cmocka_run_group_tests(tests, tls_certs_make, tls_certs_remove);
}
