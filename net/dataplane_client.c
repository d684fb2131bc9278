/*
 * dataplane_client.c: the data plane's client, through which task threads fetch blocks from
 * the block servers of other processes (API and wire format: net.h; the server is
 * dataplane.c).
 *
 * Design and threads. One event-loop thread owns every socket, raw non-blocking fds with
 * libevent events rather than bufferevents, so that a payload goes from the kernel straight
 * into the caller's fl_buf (one copy, checksummed while it is hot in cache). dp_fetch puts an
 * operation on the submit list, activates `wake` and waits on the operation's common_event;
 * the loop assigns it to an idle connection of its peer, opens a new one (up to
 * DP_CONNECTIONS_PER_PEER), or queues it. A connection carries one request at a time. An
 * operation lives on its caller's stack: the loop touches it only until it sets its event.
 *
 * Failures: a broken connection fails only its request, except that a request sent on a
 * reused connection that dies before any byte of the response arrived is retried once on a
 * fresh connection (the server may have closed an idle connection just as we wrote to it;
 * requests are reads, so a retry is harmless). The check that an idle connection is still
 * open (its socket turned readable) peeks, so that it consumes nothing.
 *
 * TLS (FLINT_TLS, net/tls.h): one SSL_CTX per client, and an SSL per connection on the same
 * non-blocking fd, still without bufferevents so that SSL_read decrypts straight into the
 * caller's buffer. Once TCP connects, SSL_connect runs from the fd's events (checking the
 * certificate for the host as dialled, or FLINT_TLS_SERVER_NAME) before the hello and the
 * request go out; then every read and write goes through SSL_read / SSL_write, and their
 * WANT_READ / WANT_WRITE pick the event to wait for (read_wants_write, write_wants_read).
 * Bytes OpenSSL has already decrypted do not make the fd readable, so a read that stops with
 * SSL_has_pending() true activates the read event itself. The idle check is SSL_peek. A
 * failed handshake fails its fetch, with FL_EAUTH when the certificate did not verify and
 * FL_ENET otherwise; either way the message names the peer and OpenSSL's reason. TLS at one
 * end only is named as such: a TLS client whose handshake is cut off says so, and a TLS server
 * tells a plaintext client in a plaintext error response (FL_EPROTO, dataplane.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "net/dataplane_frame.h"
#include "net/tls.h"

#define DP_PEER_NAME_MAX 300

typedef struct dp_peer dp_peer;
typedef struct dp_cconn dp_cconn;

typedef struct dp_op {
  struct dp_op *next; /* on the submit list or its peer's wait queue */
  const char *peer_name;
  struct sockaddr_storage addr;
  socklen_t addrlen;
  dp_request req;
  uint64_t max_len;
  int64_t timeout_ms;
  fl_buf *out;
  size_t base; /* out->len when the fetch started */
  uint64_t total;
  struct event *timer;
  dp_peer *peer;
  dp_cconn *conn;
  bool retried;
  fl_status status;
  char message[DP_MESSAGE_MAX + 200];
  common_event done;
} dp_op;

typedef enum cconn_state { CC_CONNECTING, CC_HANDSHAKING, CC_IDLE, CC_SENDING, CC_RECEIVING } cconn_state;

struct dp_cconn {
  dp_cconn *next; /* the peer's list */
  dp_peer *peer;
  int fd;
  SSL *ssl; /* NULL: plaintext */
  struct event *rev, *wev;
  cconn_state state;
  bool read_wants_write; /* TLS: a read waits for the fd to be writable */
  bool write_wants_read; /* TLS: a write waits for the fd to be readable */
  bool used;       /* completed a request before: a failure may be a stale connection */
  bool hello_sent; /* the hello goes out in front of the first request */
  dp_op *op;
  uint8_t send[2 * DP_FRAME_HEADER_SIZE + DP_SECRET_MAX + DP_REQUEST_WIRE_SIZE];
  size_t send_len, sent;
  uint8_t head[DP_FRAME_HEADER_SIZE];
  size_t head_got;
  bool have_header;
  dp_header h;
  uint64_t got;  /* payload bytes received */
  uint8_t trailer[4];
  size_t trailer_got;
  uint32_t crc;  /* of the payload received so far */
  uint8_t *dst;  /* where the payload goes: the op's buffer or message */
  char message[DP_MESSAGE_MAX + 1];
};

struct dp_peer {
  dp_peer *next;
  dp_client *client;
  char name[DP_PEER_NAME_MAX];
  char host[DP_PEER_NAME_MAX]; /* as dialled, without port or brackets: TLS checks it */
  dp_cconn *conns;
  int n_conns;
  dp_op *wait_head, *wait_tail;
  bool dispatching;
};

struct dp_client {
  struct event_base *base;
  struct event *wake;
  pthread_t loop_thread;
  bool loop_started;
  pthread_mutex_t submit_lock;
  dp_op *submit_head, *submit_tail;
  bool stopping; /* under submit_lock */
  dp_peer *peers; /* loop thread only */
  net_tls tls_settings;
  SSL_CTX *tls; /* NULL: plaintext */
  char *secret;
  size_t secret_len;
  _Atomic uint64_t max_payload;
  atomic_uint_fast64_t connects, fetches;
};

/* Completes an operation; the caller's thread owns it (and its buffer) again. Loop thread. */
static void op_finish(dp_op *op, fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void op_finish(dp_op *op, fl_status status, const char *fmt, ...) {
  if (op->timer) {
    event_free(op->timer);
    op->timer = NULL;
  }
  op->status = status;
  op->message[0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->message, sizeof op->message, fmt, ap);
    va_end(ap);
  }
  if (status != FL_OK) op->out->len = op->base;
  common_event_set(&op->done);
}

static void peer_dispatch(dp_client *c, dp_peer *p);

static void cconn_free(dp_cconn *k) {
  dp_peer *p = k->peer;
  for (dp_cconn **pp = &p->conns; *pp; pp = &(*pp)->next) {
    if (*pp == k) {
      *pp = k->next;
      break;
    }
  }
  p->n_conns--;
  if (k->rev) event_free(k->rev);
  if (k->wev) event_free(k->wev);
  SSL_free(k->ssl); /* its socket BIO leaves the fd open */
  if (k->fd >= 0) close(k->fd);
  common_free(k);
}

/* The connection is broken: its request fails with `status` (or is retried once on a fresh
 * connection, see the file comment), and it is closed. Loop thread. */
static void cconn_fail(dp_client *c, dp_cconn *k, fl_status status, const char *why) {
  dp_op *op = k->op;
  dp_peer *p = k->peer;
  bool retry = op && status == FL_ENET && k->used && !k->have_header && k->head_got == 0 &&
               !op->retried;
  bool connecting = k->state == CC_CONNECTING, handshaking = k->state == CC_HANDSHAKING;
  k->op = NULL;
  cconn_free(k);
  if (op) {
    op->conn = NULL;
    if (retry) {
      op->retried = true;
      op->next = p->wait_head;
      p->wait_head = op;
      if (!p->wait_tail) p->wait_tail = op;
    } else if (status == FL_ENET && connecting) {
      op_finish(op, status, "data plane: cannot connect to %s: %s", p->name, why);
    } else if (handshaking) {
      op_finish(op, status, "data plane: TLS handshake with %s failed: %s", p->name, why);
    } else if (status == FL_ENET) {
      op_finish(op, status, "data plane: connection to %s lost: %s", p->name, why);
    } else {
      op_finish(op, status, "data plane: peer %s: %s", p->name, why);
    }
  }
  peer_dispatch(c, p);
}

/* What cconn_recv and cconn_send return besides a byte count (and 0: the peer closed). */
#define CIO_WAIT ((ssize_t)-1)   /* nothing now; the event to wait for is armed */
#define CIO_FAILED ((ssize_t)-2) /* the reason is in `why` */

/* Why an SSL call on k failed with `err` (SSL_get_error), as one line in why. */
static void cconn_tls_why(int err, char *why, size_t cap) {
  if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    snprintf(why, cap, "%s", errno ? strerror(errno) : "the peer closed the connection");
    return;
  }
  net_tls_errors(why, cap);
}

/* Reads up to len bytes from the connection (through TLS when on): the count, 0 when the
 * peer closed it, CIO_WAIT or CIO_FAILED. */
static ssize_t cconn_recv(dp_cconn *k, void *dst, size_t len, char *why, size_t cap) {
  for (;;) {
    if (!k->ssl) {
      ssize_t n = recv(k->fd, dst, len, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return CIO_WAIT; /* rev is always armed */
      snprintf(why, cap, "%s", strerror(errno));
      return CIO_FAILED;
    }
    ERR_clear_error();
    errno = 0;
    int n = SSL_read(k->ssl, dst, len > INT_MAX ? INT_MAX : (int)len);
    if (n > 0) return n;
    int err = SSL_get_error(k->ssl, n);
    if (err == SSL_ERROR_WANT_READ) return CIO_WAIT;
    if (err == SSL_ERROR_WANT_WRITE) {
      k->read_wants_write = true;
      event_add(k->wev, NULL);
      return CIO_WAIT;
    }
    if (err == SSL_ERROR_ZERO_RETURN) return 0; /* close_notify, or EOF (IGNORE_UNEXPECTED_EOF) */
    if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == EINTR) continue;
    if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0) return 0;
    cconn_tls_why(err, why, cap);
    return CIO_FAILED;
  }
}

/* Writes up to len bytes to the connection (through TLS when on): the count, CIO_WAIT or
 * CIO_FAILED. After CIO_WAIT the next call must pass the same bytes (OpenSSL's rule). */
static ssize_t cconn_send(dp_cconn *k, const void *src, size_t len, char *why, size_t cap) {
  for (;;) {
    if (!k->ssl) {
      ssize_t n = send(k->fd, src, len, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        event_add(k->wev, NULL);
        return CIO_WAIT;
      }
      snprintf(why, cap, "%s", strerror(errno));
      return CIO_FAILED;
    }
    ERR_clear_error();
    errno = 0;
    int n = SSL_write(k->ssl, src, len > INT_MAX ? INT_MAX : (int)len);
    if (n > 0) return n;
    int err = SSL_get_error(k->ssl, n);
    if (err == SSL_ERROR_WANT_WRITE) {
      event_add(k->wev, NULL);
      return CIO_WAIT;
    }
    if (err == SSL_ERROR_WANT_READ) { /* rev is always armed */
      k->write_wants_read = true;
      return CIO_WAIT;
    }
    if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == EINTR) continue;
    if (err == SSL_ERROR_ZERO_RETURN) snprintf(why, cap, "the peer closed the connection");
    else cconn_tls_why(err, why, cap);
    return CIO_FAILED;
  }
}

/* Sends what is left of the request. Returns false when it failed the connection (which is
 * then freed). */
static bool cconn_try_send(dp_client *c, dp_cconn *k) {
  char why[256];
  while (k->sent < k->send_len) {
    ssize_t n = cconn_send(k, k->send + k->sent, k->send_len - k->sent, why, sizeof why);
    if (n == CIO_WAIT) return true;
    if (n < 0) {
      cconn_fail(c, k, FL_ENET, why);
      return false;
    }
    k->sent += (size_t)n;
  }
  if (!k->read_wants_write) event_del(k->wev);
  k->state = CC_RECEIVING;
  return true;
}

static void cconn_start(dp_client *c, dp_cconn *k, dp_op *op) {
  k->op = op;
  op->conn = k;
  k->send_len = k->sent = 0;
  if (!k->hello_sent && c->secret) {
    dp_header hello = {.type = DP_FRAME_HELLO, .len = c->secret_len,
                       .crc = dp_crc32c(0, c->secret, c->secret_len)};
    dp_header_encode(k->send, &hello);
    memcpy(k->send + DP_FRAME_HEADER_SIZE, c->secret, c->secret_len);
    k->send_len = DP_FRAME_HEADER_SIZE + c->secret_len;
  }
  k->hello_sent = true;
  uint8_t *req = k->send + k->send_len + DP_FRAME_HEADER_SIZE;
  dp_request_encode(req, &op->req, op->max_len);
  dp_header h = {.type = DP_FRAME_REQUEST, .len = DP_REQUEST_WIRE_SIZE,
                 .crc = dp_crc32c(0, req, DP_REQUEST_WIRE_SIZE)};
  dp_header_encode(k->send + k->send_len, &h);
  k->send_len += DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE;
  k->head_got = 0;
  k->have_header = false;
  k->got = 0;
  k->trailer_got = 0;
  k->crc = 0;
  k->state = CC_SENDING;
  (void)cconn_try_send(c, k);
}

/* A whole response has arrived. */
static void cconn_complete(dp_client *c, dp_cconn *k) {
  dp_op *op = k->op;
  dp_peer *p = k->peer;
  uint32_t want = k->h.status == FL_OK ? common_get_u32(k->trailer) : k->h.crc;
  if (k->crc != want) {
    cconn_fail(c, k, FL_ECORRUPT, "payload checksum mismatch");
    return;
  }
  if (k->state == CC_SENDING) {
    cconn_fail(c, k, FL_EPROTO, "response arrived before the request was sent");
    return;
  }
  k->op = NULL;
  op->conn = NULL;
  k->state = CC_IDLE;
  k->used = true;
  /* Bytes after the response that OpenSSL holds already: the idle check must see them. */
  if (k->ssl && SSL_has_pending(k->ssl)) event_active(k->rev, EV_READ, 1);
  fl_status status = (fl_status)k->h.status;
  if (status == FL_OK) {
    op->out->len += k->h.len;
    op->total = k->h.total;
    op_finish(op, FL_OK, NULL);
  } else {
    k->message[k->h.len] = '\0';
    op_finish(op, status, "%s", k->message);
    /* A refused secret: the server closes the connection after its reply. */
    if (status == FL_EAUTH) cconn_free(k);
  }
  peer_dispatch(c, p);
}

/* The header is complete: checks it and makes room for the payload. Returns false when the
 * connection has been failed. */
static bool cconn_header(dp_client *c, dp_cconn *k) {
  dp_op *op = k->op;
  const char *bad = dp_header_decode(k->head, &k->h);
  char why[160];
  if (!bad && k->h.type != DP_FRAME_RESPONSE) bad = "frame is not a response";
  if (!bad && k->h.status == FL_OK) {
    if (k->h.len > op->max_len) {
      snprintf(why, sizeof why, "response of %llu bytes exceeds the limit of %llu bytes",
               (unsigned long long)k->h.len, (unsigned long long)op->max_len);
      bad = why;
    } else if (op->req.len && k->h.len > op->req.len) {
      bad = "response longer than the range asked for";
    } else if (k->h.total < k->h.len) {
      bad = "response longer than its object";
    } else if (k->h.crc != 0) {
      bad = "checksum field set in a response that has a trailer";
    }
  } else if (!bad) {
    if (k->h.len > DP_MESSAGE_MAX) bad = "oversized error message";
    else if (k->h.status > 255) bad = "unknown status";
  }
  if (bad) {
    common_log(LOG_WARN, "data plane: malformed response from %s: %s", k->peer->name, bad);
    cconn_fail(c, k, FL_EPROTO, bad);
    return false;
  }
  k->have_header = true;
  if (k->h.status == FL_OK) {
    if (fl_buf_reserve(op->out, k->h.len) != FL_OK) {
      char msg[DP_MESSAGE_MAX];
      snprintf(msg, sizeof msg, "%s", fl_last_error());
      cconn_fail(c, k, FL_ENOMEM, msg);
      return false;
    }
    k->dst = op->out->data + op->out->len;
  } else {
    k->dst = (uint8_t *)k->message;
  }
  return true;
}


/* Bytes one read callback takes from one connection before it lets the loop run others. */
#define DP_READ_BUDGET ((size_t)1 << 20)

/* Whether the bytes an idle connection turned readable for mean it is closed (or the server
 * sent what nobody asked for: true too, and logged). False: nothing to read after all. */
static bool cconn_idle_closed(dp_cconn *k) {
  char byte;
  if (!k->ssl) {
    ssize_t n = recv(k->fd, &byte, 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (n > 0)
      common_log(LOG_WARN, "data plane: %s sent bytes on an idle connection; closing it",
                 k->peer->name);
    return true;
  }
  /* The fd's readiness may be a record that carries no data (a key update): SSL_peek takes
   * it and reports what is left. */
  ERR_clear_error();
  int n = SSL_peek(k->ssl, &byte, 1);
  if (n > 0) {
    common_log(LOG_WARN, "data plane: %s sent bytes on an idle connection; closing it",
               k->peer->name);
    return true;
  }
  int err = SSL_get_error(k->ssl, n);
  if (err == SSL_ERROR_WANT_READ) return false;
  if (err == SSL_ERROR_WANT_WRITE) {
    k->read_wants_write = true;
    event_add(k->wev, NULL);
    return false;
  }
  ERR_clear_error();
  return true;
}

/* Bytes one read callback takes from one connection before it lets the loop run others. */
#define DP_READ_BUDGET ((size_t)1 << 20)

static void cconn_handshake(dp_client *c, dp_cconn *k);
static fl_status peer_split(const char *peer, char *host, long *port_out);
static void cconn_connected(dp_client *c, dp_cconn *k);

static void cconn_read_cb(evutil_socket_t fd, short what, void *arg) {
  dp_cconn *k = arg;
  dp_client *c = k->peer->client;
  if (k->state == CC_HANDSHAKING) {
    cconn_handshake(c, k);
    return;
  }
  if (k->write_wants_read) {
    k->write_wants_read = false;
    if (k->state == CC_SENDING && !cconn_try_send(c, k)) return;
  }
  if (k->state != CC_SENDING && k->state != CC_RECEIVING) {
    /* An idle connection: the server closed it, or sent what nobody asked for. */
    if (cconn_idle_closed(k)) cconn_fail(c, k, FL_ENET, "closed while idle");
    return;
  }
  size_t budget = DP_READ_BUDGET;
  while (budget > 0) {
    /* Three parts: header, payload, and (after a successful response's payload) the
     * 4-byte checksum trailer. */
    bool trailer = k->have_header && k->got == k->h.len;
    uint8_t *dst;
    size_t want;
    if (!k->have_header) {
      dst = k->head + k->head_got;
      want = DP_FRAME_HEADER_SIZE - k->head_got;
    } else if (!trailer) {
      dst = k->dst + k->got;
      want = k->h.len - k->got;
      if (want > budget) want = budget;
    } else {
      dst = k->trailer + k->trailer_got;
      want = k->h.status == FL_OK ? sizeof k->trailer - k->trailer_got : 0;
    }
    if (want == 0) {
      cconn_complete(c, k);
      return;
    }
    char why[256];
    ssize_t n = cconn_recv(k, dst, want, why, sizeof why);
    if (n == CIO_WAIT) return;
    if (n == 0) {
      cconn_fail(c, k, FL_ENET, k->have_header ? "the peer closed the connection mid-response"
                                               : "the peer closed the connection");
      return;
    }
    if (n < 0) {
      cconn_fail(c, k, FL_ENET, why);
      return;
    }
    budget -= (size_t)n;
    if (!k->have_header) {
      k->head_got += (size_t)n;
      if (k->head_got == DP_FRAME_HEADER_SIZE && !cconn_header(c, k)) return;
    } else if (!trailer) {
      /* Checksummed now, while the bytes are still in cache. */
      k->crc = dp_crc32c(k->crc, dst, (size_t)n);
      k->got += (size_t)n;
    } else {
      k->trailer_got += (size_t)n;
    }
  }
  /* Out of budget: what OpenSSL has decrypted already will not make the fd readable. */
  if (k->ssl && SSL_has_pending(k->ssl)) event_active(k->rev, EV_READ, 1);
}

/* Why a handshake failed, and its status: FL_EAUTH when the server's certificate did not
 * verify (an unknown CA, another name), else FL_ENET. */
static fl_status cconn_handshake_why(dp_cconn *k, int err, char *why, size_t cap) {
  long verify = SSL_get_verify_result(k->ssl);
  unsigned long first = ERR_peek_error();
  bool cut_off = err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && first == 0);
  if (err == SSL_ERROR_ZERO_RETURN) snprintf(why, cap, "the peer closed the connection");
  else cconn_tls_why(err, why, cap);
  size_t used = strlen(why);
  if (verify != X509_V_OK) {
    snprintf(why + used, cap - used, " (%s)", X509_verify_cert_error_string(verify));
    return FL_EAUTH;
  }
  /* A plaintext server reads the client's hello as a bad frame and closes the connection;
   * record-layer reasons mean the peer sent something that is not TLS at all. */
  int reason = ERR_GET_REASON(first);
  if (cut_off || reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_UNKNOWN_PROTOCOL ||
      reason == SSL_R_PACKET_LENGTH_TOO_LONG || reason == SSL_R_RECORD_LENGTH_MISMATCH)
    snprintf(why + used, cap - used, "; TLS may be on at one end only (FLINT_TLS is on here)");
  return FL_ENET;
}

/* Runs SSL_connect as far as the fd allows; once done, sends the operation's request. */
static void cconn_handshake(dp_client *c, dp_cconn *k) {
  ERR_clear_error();
  errno = 0;
  int r = SSL_connect(k->ssl);
  if (r == 1) {
    event_del(k->wev);
    cconn_start(c, k, k->op);
    return;
  }
  int err = SSL_get_error(k->ssl, r);
  if (err == SSL_ERROR_WANT_READ) {
    event_del(k->wev);
    return;
  }
  if (err == SSL_ERROR_WANT_WRITE) {
    event_add(k->wev, NULL);
    return;
  }
  char why[DP_MESSAGE_MAX];
  fl_status status = cconn_handshake_why(k, err, why, sizeof why);
  cconn_fail(c, k, status, why);
}

static void cconn_write_cb(evutil_socket_t fd, short what, void *arg) {
  dp_cconn *k = arg;
  dp_client *c = k->peer->client;
  if (k->state == CC_CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err) {
      cconn_fail(c, k, FL_ENET, strerror(err));
      return;
    }
    event_del(k->wev);
    event_add(k->rev, NULL);
    cconn_connected(c, k);
    return;
  }
  if (k->state == CC_HANDSHAKING) {
    cconn_handshake(c, k);
    return;
  }
  bool reading = k->read_wants_write;
  k->read_wants_write = false;
  if (k->state == CC_SENDING) {
    if (!cconn_try_send(c, k)) return;
  } else {
    event_del(k->wev);
  }
  if (reading) cconn_read_cb(k->fd, EV_READ, k);
}

/* TCP is up: the request goes out, after the TLS handshake when TLS is on. rev is armed. */
static void cconn_connected(dp_client *c, dp_cconn *k) {
  if (k->ssl) {
    k->state = CC_HANDSHAKING;
    cconn_handshake(c, k);
  } else {
    cconn_start(c, k, k->op);
  }
}

static void peer_connect(dp_client *c, dp_peer *p, dp_op *op) {
  atomic_fetch_add(&c->connects, 1);
  int fd = socket(op->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    op_finish(op, FL_ENET, "data plane: cannot connect to %s: socket: %s", p->name,
              strerror(errno));
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  dp_cconn *k = common_calloc(1, sizeof *k);
  if (!k) {
    close(fd);
    op_finish(op, FL_ENOMEM, "data plane: cannot allocate a connection to %s", p->name);
    return;
  }
  k->fd = fd;
  k->peer = p;
  k->state = CC_CONNECTING;
  k->op = op;
  op->conn = k;
  k->next = p->conns;
  p->conns = k;
  p->n_conns++;
  k->rev = event_new(c->base, fd, EV_READ | EV_PERSIST, cconn_read_cb, k);
  k->wev = event_new(c->base, fd, EV_WRITE | EV_PERSIST, cconn_write_cb, k);
  if (!k->rev || !k->wev) {
    cconn_fail(c, k, FL_ENOMEM, "cannot allocate events");
    return;
  }
  if (c->tls) {
    k->ssl = SSL_new(c->tls);
    if (!k->ssl || SSL_set_fd(k->ssl, fd) != 1) {
      char why[256];
      cconn_fail(c, k, FL_ENOMEM, net_tls_errors(why, sizeof why));
      return;
    }
    if (net_tls_expect_host(&c->tls_settings, k->ssl, p->host) != FL_OK) {
      char why[DP_MESSAGE_MAX];
      snprintf(why, sizeof why, "%s", fl_last_error());
      cconn_fail(c, k, FL_EINVAL, why);
      return;
    }
  }
  if (connect(fd, (struct sockaddr *)&op->addr, op->addrlen) == 0) {
    event_add(k->rev, NULL);
    cconn_connected(c, k);
  } else if (errno == EINPROGRESS || errno == EINTR) {
    event_add(k->wev, NULL);
  } else {
    cconn_fail(c, k, FL_ENET, strerror(errno));
  }
}

/* Gives waiting operations to idle connections, or to new ones while the peer has fewer than
 * DP_CONNECTIONS_PER_PEER. Re-entered from the failures it causes, hence the flag. */
static void peer_dispatch(dp_client *c, dp_peer *p) {
  if (p->dispatching) return;
  p->dispatching = true;
  while (p->wait_head) {
    dp_cconn *idle = NULL;
    for (dp_cconn *k = p->conns; k; k = k->next) {
      if (k->state == CC_IDLE) {
        idle = k;
        break;
      }
    }
    if (!idle && p->n_conns >= DP_CONNECTIONS_PER_PEER) break;
    dp_op *op = p->wait_head;
    p->wait_head = op->next;
    if (!p->wait_head) p->wait_tail = NULL;
    op->next = NULL;
    if (idle) cconn_start(c, idle, op);
    else peer_connect(c, p, op);
  }
  p->dispatching = false;
}

static void op_timeout_cb(evutil_socket_t fd, short what, void *arg) {
  dp_op *op = arg;
  dp_peer *p = op->peer;
  if (op->conn) {
    /* The response may still come: the connection cannot be reused. */
    dp_cconn *k = op->conn;
    k->op = NULL;
    op->conn = NULL;
    cconn_free(k);
  } else {
    dp_op **pp = &p->wait_head;
    while (*pp && *pp != op) pp = &(*pp)->next;
    if (*pp) *pp = op->next;
    p->wait_tail = NULL;
    for (dp_op *w = p->wait_head; w; w = w->next) p->wait_tail = w;
  }
  op_finish(op, FL_ETIMEDOUT, "data plane: fetch from %s timed out after %lld ms", p->name,
            (long long)op->timeout_ms);
  peer_dispatch(p->client, p);
}

static dp_peer *peer_get(dp_client *c, const char *name) {
  for (dp_peer *p = c->peers; p; p = p->next)
    if (strcmp(p->name, name) == 0) return p;
  dp_peer *p = common_calloc(1, sizeof *p);
  if (!p) return NULL;
  snprintf(p->name, sizeof p->name, "%s", name);
  long port;
  FL_ASSERT(peer_split(name, p->host, &port) == FL_OK); /* dp_fetch resolved it */
  p->client = c;
  p->next = c->peers;
  c->peers = p;
  return p;
}

/* Fails every operation and frees every connection and peer. Loop thread, when stopping. */
static void client_shutdown(dp_client *c) {
  while (c->peers) {
    dp_peer *p = c->peers;
    p->dispatching = true; /* nothing new starts */
    while (p->conns) {
      dp_cconn *k = p->conns;
      dp_op *op = k->op;
      k->op = NULL;
      cconn_free(k);
      if (op) op_finish(op, FL_ECANCELLED, "data plane: the client was destroyed");
    }
    while (p->wait_head) {
      dp_op *op = p->wait_head;
      p->wait_head = op->next;
      op_finish(op, FL_ECANCELLED, "data plane: the client was destroyed");
    }
    c->peers = p->next;
    common_free(p);
  }
}

static void client_wake_cb(evutil_socket_t fd, short what, void *arg) {
  dp_client *c = arg;
  FL_PCHECK(pthread_mutex_lock(&c->submit_lock));
  dp_op *op = c->submit_head;
  c->submit_head = c->submit_tail = NULL;
  bool stopping = c->stopping;
  FL_PCHECK(pthread_mutex_unlock(&c->submit_lock));
  while (op) {
    dp_op *next = op->next;
    op->next = NULL;
    dp_peer *p = stopping ? NULL : peer_get(c, op->peer_name);
    if (stopping) {
      op_finish(op, FL_ECANCELLED, "data plane: the client was destroyed");
    } else if (!p || !(op->timer = evtimer_new(c->base, op_timeout_cb, op))) {
      op_finish(op, FL_ENOMEM, "data plane: out of memory starting a fetch from %s",
                op->peer_name);
    } else {
      struct timeval tv = {.tv_sec = op->timeout_ms / 1000,
                           .tv_usec = (op->timeout_ms % 1000) * 1000};
      evtimer_add(op->timer, &tv);
      op->peer = p;
      if (p->wait_tail) p->wait_tail->next = op;
      else p->wait_head = op;
      p->wait_tail = op;
      peer_dispatch(c, p);
    }
    op = next;
  }
  if (stopping) {
    client_shutdown(c);
    event_base_loopbreak(c->base);
  }
}

static void *client_loop_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-dp-client");
  dp_client *c = arg;
  event_base_loop(c->base, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

/* The client's SSL_CTX when FLINT_TLS is on (c->tls stays NULL when off); the settings' own
 * error (naming the setting and the file) otherwise. */
static fl_status client_tls_setup(dp_client *c) {
  fl_status st = net_tls_read(NET_TLS_CLIENT, &c->tls_settings);
  if (st == FL_OK && c->tls_settings.on) st = net_tls_context(&c->tls_settings, NET_TLS_CLIENT, &c->tls);
  if (st != FL_OK) return common_error_wrap(st, "data plane: ");
  if (!c->tls) return FL_OK;
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
  /* Servers close idle connections without close_notify: an end of stream, which
   * OpenSSL 3 would report as an error (and a truncated response fails its checks anyway). */
  SSL_CTX_set_options(c->tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
  /* OpenSSL writes to the socket with write(2): a peer that has gone must not kill the
   * process (the plaintext path sends with MSG_NOSIGNAL instead). */
  struct sigaction old_pipe;
  if (sigaction(SIGPIPE, NULL, &old_pipe) == 0 && old_pipe.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  return FL_OK;
}

fl_status dp_client_create(const char *secret, dp_client **out) {
  fl_status status = FL_OK;
  if (!out) return FL_ERR(FL_EINVAL, "dp_client_create: out is NULL");
  *out = NULL;
  if (secret && strlen(secret) > DP_SECRET_MAX)
    return FL_ERR(FL_EINVAL, "dp_client_create: the secret is longer than %d bytes",
                  DP_SECRET_MAX);
  dp_evthread_setup();
  dp_client *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a data-plane client");
  FL_PCHECK(pthread_mutex_init(&c->submit_lock, NULL));
  atomic_init(&c->max_payload, DP_MAX_PAYLOAD_DEFAULT);
  if (secret && *secret) {
    c->secret = common_strdup(secret);
    if (!c->secret) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the secret"));
    c->secret_len = strlen(secret);
  }
  FL_CHECK(client_tls_setup(c));
  c->base = event_base_new();
  if (!c->base) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot create an event base"));
  c->wake = event_new(c->base, -1, EV_PERSIST, client_wake_cb, c);
  if (!c->wake) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot create an event"));
  if (pthread_create(&c->loop_thread, NULL, client_loop_main, c) != 0)
    FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the data-plane client thread"));
  c->loop_started = true;
  *out = c;
  return FL_OK;
cleanup:
  dp_client_destroy(c);
  return status;
}

void dp_client_set_max_payload(dp_client *c, uint64_t bytes) {
  if (c) atomic_store(&c->max_payload, bytes);
}

dp_client_stats dp_client_stats_get(const dp_client *c) {
  dp_client_stats st = {atomic_load(&c->connects), atomic_load(&c->fetches)};
  return st;
}

void dp_client_destroy(dp_client *c) {
  if (!c) return;
  if (c->loop_started) {
    FL_PCHECK(pthread_mutex_lock(&c->submit_lock));
    c->stopping = true;
    FL_PCHECK(pthread_mutex_unlock(&c->submit_lock));
    event_active(c->wake, EV_READ, 0);
    FL_PCHECK(pthread_join(c->loop_thread, NULL));
  }
  if (c->wake) event_free(c->wake);
  if (c->base) event_base_free(c->base);
  pthread_mutex_destroy(&c->submit_lock);
  SSL_CTX_free(c->tls);
  net_tls_free(&c->tls_settings);
  common_free(c->secret);
  common_free(c);
}

/* Splits "HOST:PORT" ("[V6]:PORT" for IPv6) into host (at least DP_PEER_NAME_MAX bytes)
 * and port. */
static fl_status peer_split(const char *peer, char *host, long *port_out) {
  const char *colon = strrchr(peer, ':');
  if (!colon || colon == peer || !colon[1])
    return FL_ERR(FL_EINVAL, "data plane: peer \"%s\" is not HOST:PORT", peer);
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (*end || errno || port <= 0 || port > 65535)
    return FL_ERR(FL_EINVAL, "data plane: peer \"%s\" has a bad port", peer);
  size_t hlen = (size_t)(colon - peer);
  const char *h = peer;
  if (peer[0] == '[') {
    if (hlen < 2 || colon[-1] != ']')
      return FL_ERR(FL_EINVAL, "data plane: peer \"%s\" is not [ADDRESS]:PORT", peer);
    h++;
    hlen -= 2;
  }
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  *port_out = port;
  return FL_OK;
}

/* Splits "HOST:PORT" and resolves it. Caller's thread: a name lookup may block, and must not
 * block the loop. */
static fl_status peer_resolve(const char *peer, struct sockaddr_storage *addr,
                              socklen_t *addrlen) {
  char host[DP_PEER_NAME_MAX];
  long port;
  fl_status st = peer_split(peer, host, &port);
  if (st != FL_OK) return st;
  memset(addr, 0, sizeof *addr);
  struct sockaddr_in *in = (struct sockaddr_in *)addr;
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)addr;
  if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    *addrlen = sizeof *in;
    return FL_OK;
  }
  if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    *addrlen = sizeof *in6;
    return FL_OK;
  }
  st = dp_resolve(host, (int)port, false, addr, addrlen);
  if (st != FL_OK) return common_error_wrap(st, "data plane: peer %s: ", peer);
  return FL_OK;
}

fl_status dp_fetch(dp_client *c, const char *peer, const dp_request *req, int64_t timeout_ms,
                   fl_buf *out, uint64_t *total) {
  if (!c || !peer || !req || !out)
    return FL_ERR(FL_EINVAL, "dp_fetch: client, peer, request and buffer are required");
  if (req->kind < DP_SHUFFLE || req->kind > DP_KIND_LAST)
    return FL_ERR(FL_EINVAL, "dp_fetch: unknown request kind %u", req->kind);
  if (strlen(peer) >= DP_PEER_NAME_MAX)
    return FL_ERR(FL_EINVAL, "dp_fetch: peer name of %zu bytes is too long", strlen(peer));
  dp_op op;
  memset(&op, 0, offsetof(dp_op, message));
  op.message[0] = '\0';
  fl_status status = peer_resolve(peer, &op.addr, &op.addrlen);
  if (status != FL_OK) return status;
  op.peer_name = peer;
  op.req = *req;
  op.max_len = atomic_load(&c->max_payload);
  op.timeout_ms = timeout_ms > 0 ? timeout_ms : DP_TIMEOUT_DEFAULT_MS;
  op.out = out;
  op.base = out->len;
  common_event_init(&op.done);
  FL_PCHECK(pthread_mutex_lock(&c->submit_lock));
  bool stopping = c->stopping;
  if (!stopping) {
    if (c->submit_tail) c->submit_tail->next = &op;
    else c->submit_head = &op;
    c->submit_tail = &op;
  }
  FL_PCHECK(pthread_mutex_unlock(&c->submit_lock));
  if (stopping) {
    common_event_destroy(&op.done);
    return FL_ERR(FL_ECANCELLED, "data plane: the client is being destroyed");
  }
  atomic_fetch_add(&c->fetches, 1);
  event_active(c->wake, EV_READ, 0);
  common_event_wait(&op.done, dp_spin_ns());
  common_event_destroy(&op.done);
  if (op.status != FL_OK) return FL_ERR(op.status, "%s", op.message);
  if (total) *total = op.total;
  return FL_OK;
}
