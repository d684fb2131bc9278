/*
 * dataplane.c: flint's block transfer over libevent, the server side: a block server in every
 * process that holds blocks (API and wire format: net.h). The client that task threads fetch
 * through is in dataplane_client.c, the frames both ends speak in dataplane_frame.c.
 *
 * Design and threads.
 * - Server: one event-loop thread owns the listener and every connection (a bufferevent
 *   each). A complete request frame becomes a job on a common_queue; a few worker threads run
 *   the serve callback (which may block on disk) and checksum the payload, then put the job
 *   on a done list and activate the `wake` event; the loop thread writes the header and adds
 *   the payload to the bufferevent by reference (no copy), freeing it once written. A
 *   connection has at most one request in service and reads the next one only once the
 *   previous response has left its output buffer, so a client that does not read cannot
 *   make the server buffer more than one response per connection.
 * - Server limits (dp_server_limits): a timer per connection closes it when it sits between
 *   requests for the idle timeout, or when a frame it has begun (a fresh connection's first
 *   frame: from the accept) is not whole within the request timeout, counted from the frame's
 *   first byte so that trickling bytes does not extend it; a bufferevent write timeout closes
 *   it when a response makes no progress for as long. No timer runs while a request is with
 *   the workers. Connections over the cap are closed as they are accepted.
 * - Failures: a malformed frame closes that connection only (the server logs a warning
 *   naming the peer and keeps serving others).
 * - TLS (FLINT_TLS, net/tls.h): one SSL_CTX per server, and each accepted connection is an
 *   OpenSSL bufferevent instead of a socket one, so everything above runs unchanged on the
 *   decrypted bytes; payloads still go in by reference (OpenSSL encrypts from them, which is
 *   the one copy TLS costs). The handshake is the first thing a fresh connection owes, so it
 *   runs under the request timeout; one that fails closes that connection only, counts as
 *   dropped and logs one warning with OpenSSL's reason. The server sends no session tickets:
 *   clients do not resume sessions, and an idle client connection then receives nothing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "common/config.h"
#include "net/dataplane_frame.h"
#include "net/tls.h"

/* Server worker threads: serve callbacks mostly wait on disk or copy memory. */
#define DP_SERVER_WORKERS_MIN 2
#define DP_SERVER_WORKERS_MAX 4
/* The most one bufferevent write may hand the kernel in one go: a whole typical chunk, so a
 * response leaves in few system calls; the kernel's socket buffer bounds it anyway. */
#define DP_MAX_SINGLE_WRITE ((size_t)8 << 20)
/* Unread input at which a server connection stops reading (a hello and a request take 384). */
#define DP_INPUT_MAX ((size_t)4096)
/* How long accepting pauses after accept failed (out of file descriptors). */
#define DP_RELISTEN_MS 100
/* Responses from this size up are streamed: sent before their checksum is known. */
#define DP_STREAM_MIN ((size_t)256 << 10)

/* Compares a secret in time that depends only on the lengths, not on where they differ. */
static bool secret_equal(const uint8_t *given, size_t given_len, const char *want,
                         size_t want_len) {
  volatile uint8_t diff = given_len != want_len;
  for (size_t i = 0; i < want_len; i++)
    diff |= (uint8_t)want[i] ^ (i < given_len ? given[i] : (uint8_t)~want[i]);
  return diff == 0;
}

static void sockaddr_name(const struct sockaddr *sa, char *buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    snprintf(buf, len, "%s:%d", host, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
    snprintf(buf, len, "[%s]:%d", host, port);
  } else {
    snprintf(buf, len, "(unknown address)");
  }
}

/* ---- server ---------------------------------------------------------------------------- */

typedef struct dp_sconn dp_sconn;

/* A job goes back to the loop once or twice: with its response, and for a streamed payload
 * (see server_worker_main) again with the payload's checksum. */
typedef struct dp_done {
  struct dp_done *next;
  struct dp_job *job;
  bool trailer;
} dp_done;

typedef struct dp_job {
  common_qnode node; /* on the workers' queue */
  dp_done response, trailer;
  int refs;      /* payload reference in an output buffer + trailer still to come */
  bool streamed; /* the payload goes out before its checksum is known */
  dp_server *server;
  dp_sconn *conn;
  dp_request req;
  uint64_t max_len;
  fl_buf out;    /* the payload the serve callback copied, or */
  dp_loan loan;  /* the one it lent (loan.release set) */
  uint64_t total;
  fl_status status;
  uint32_t crc;
  char message[DP_MESSAGE_MAX + 1];
} dp_job;

/* What a connection's timer is counting down. */
typedef enum sconn_wait { SW_NONE, SW_IDLE, SW_FRAME } sconn_wait;

struct dp_sconn {
  dp_sconn *prev, *next; /* the server's list, loop thread only */
  dp_server *server;
  struct bufferevent *bev; /* NULL once closed */
  struct event *timer;     /* the idle and request timeouts; NULL once closed */
  sconn_wait wait;
  bool requested; /* has sent a request: no longer a fresh connection */
  bool handshaken; /* TLS: the handshake is done (always true without TLS) */
  bool authed;
  bool busy;    /* a job is with the workers or on the done list */
  bool closing; /* closes once the output buffer is written (after an error reply) */
  char peer[64];
};

struct dp_server {
  struct event_base *base;
  struct evconnlistener *listener;
  struct event *wake;
  pthread_t loop_thread;
  bool loop_started;
  pthread_t workers[DP_SERVER_WORKERS_MAX];
  int n_workers;
  common_queue jobs;
  pthread_mutex_t done_lock;
  dp_done *done_head, *done_tail;
  atomic_bool stopping;
  dp_sconn *conns; /* loop thread only (and dp_server_stop once the loop has ended) */
  dp_serve_fn serve;
  void *serve_arg;
  SSL_CTX *tls; /* NULL: plaintext */
  char *secret;
  size_t secret_len;
  int port;
  dp_server_limits limits; /* resolved: > 0 or DP_UNLIMITED */
  int64_t open_conns;      /* sockets open, loop thread only */
  uint64_t refused_logged_ns, refused_unlogged; /* rate-limited warnings, loop thread only */
  uint64_t accept_error_logged_ns;
  struct event *relisten;  /* re-enables the listener after accept failed (out of fds) */
  atomic_uint_fast64_t accepted, requests, dropped, timed_out, refused;
};

static void sconn_process(dp_sconn *c);

/* Frees the connection, or only closes its socket while a job still points at it (the job
 * frees it when it comes back). Loop thread. */
static void sconn_close(dp_sconn *c) {
  if (c->bev) {
    bufferevent_free(c->bev);
    c->bev = NULL;
    c->server->open_conns--;
  }
  if (c->timer) {
    event_free(c->timer);
    c->timer = NULL;
  }
  if (c->busy) return;
  dp_server *s = c->server;
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  common_free(c);
}

static struct timeval ms_timeval(int64_t ms) {
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* Arms the connection's timer for what it waits for now: nothing while a request is in
 * service or a response is being written (the write timeout watches that), the next frame
 * while some of it has come (or nothing yet on a fresh connection), else the idle timeout.
 * A deadline already running for the same wait is kept, so that a frame's runs from its
 * first byte. Loop thread, on an open connection. */
static void sconn_timer_update(dp_sconn *c) {
  dp_server *s = c->server;
  sconn_wait want;
  if (c->busy || c->closing || evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
    want = SW_NONE;
  else if (!c->requested || evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
    want = SW_FRAME;
  else
    want = SW_IDLE;
  if (want == c->wait) return;
  c->wait = want;
  int64_t ms = want == SW_IDLE    ? s->limits.idle_timeout_ms
               : want == SW_FRAME ? s->limits.request_timeout_ms
                                  : DP_UNLIMITED;
  if (ms == DP_UNLIMITED) {
    evtimer_del(c->timer);
    return;
  }
  struct timeval tv = ms_timeval(ms);
  evtimer_add(c->timer, &tv);
}

static void sconn_timer_cb(evutil_socket_t fd, short what, void *arg) {
  dp_sconn *c = arg;
  dp_server *s = c->server;
  atomic_fetch_add(&s->timed_out, 1);
  if (c->wait == SW_IDLE)
    common_log(LOG_DEBUG, "data plane: closing connection from %s: idle for %lld ms", c->peer,
               (long long)s->limits.idle_timeout_ms);
  else
    common_log(LOG_WARN, "data plane: closing connection from %s: no whole request within %lld ms",
               c->peer, (long long)s->limits.request_timeout_ms);
  sconn_close(c);
}

static void sconn_drop(dp_sconn *c, const char *why) {
  common_log(LOG_WARN, "data plane: closing connection from %s: %s", c->peer, why);
  atomic_fetch_add(&c->server->dropped, 1);
  sconn_close(c);
}

/* Queues an error response and closes the connection once it is written. Returns false when
 * it had to close it at once (and may have freed it). */
static bool sconn_reply_error_and_close(dp_sconn *c, fl_status status, const char *message) {
  size_t mlen = strnlen(message, DP_MESSAGE_MAX);
  dp_header h = {.type = DP_FRAME_RESPONSE, .status = (uint16_t)status, .len = mlen,
                 .crc = dp_crc32c(0, message, mlen)};
  uint8_t head[DP_FRAME_HEADER_SIZE];
  dp_header_encode(head, &h);
  struct evbuffer *output = bufferevent_get_output(c->bev);
  atomic_fetch_add(&c->server->dropped, 1);
  if (evbuffer_add(output, head, sizeof head) != 0 || evbuffer_add(output, message, mlen) != 0) {
    sconn_close(c);
    return false;
  }
  c->closing = true;
  bufferevent_disable(c->bev, EV_READ);
  return true;
}

static void job_free(dp_job *job) {
  fl_buf_free(&job->out);
  if (job->loan.release) job->loan.release(job->loan.arg);
  common_free(job);
}

/* The response's payload: the lent bytes or the job's own buffer. */
static fl_bytes job_payload(const dp_job *job) {
  return job->loan.release ? fl_bytes_of(job->loan.data, job->loan.len) : fl_buf_bytes(&job->out);
}

/* Loop thread (or dp_server_stop once the loop has ended). */
static void job_unref(dp_job *job) {
  if (--job->refs == 0) job_free(job);
}

static void job_payload_written(const void *data, size_t len, void *arg) { job_unref(arg); }

/* Writes a finished job's response: header and payload, and the checksum trailer unless the
 * payload is streamed (then server_trailer writes it). Loop thread. Returns false when the
 * connection had to be closed. */
static bool sconn_respond(dp_sconn *c, dp_job *job) {
  struct evbuffer *output = bufferevent_get_output(c->bev);
  uint8_t head[DP_FRAME_HEADER_SIZE];
  dp_header h = {.type = DP_FRAME_RESPONSE, .status = (uint16_t)job->status};
  if (job->status != FL_OK) {
    size_t mlen = strlen(job->message);
    h.len = mlen;
    h.crc = job->crc;
    dp_header_encode(head, &h);
    bool ok = evbuffer_add(output, head, sizeof head) == 0 &&
              evbuffer_add(output, job->message, mlen) == 0;
    job_unref(job);
    if (!ok) goto fail;
    return true;
  }
  fl_bytes payload = job_payload(job);
  h.len = payload.len;
  h.total = job->total;
  dp_header_encode(head, &h);
  uint8_t trailer[4];
  common_put_u32(trailer, job->crc);
  bool streamed = job->streamed; /* the job may be gone below */
  if (evbuffer_add(output, head, sizeof head) != 0) {
    job_unref(job);
    goto fail;
  }
  /* The payload leaves from the job's buffer or the loan, freed or released once written. */
  if (payload.len == 0) {
    job_unref(job);
  } else if (evbuffer_add_reference(output, payload.data, payload.len, job_payload_written,
                                    job) != 0) {
    job_unref(job);
    goto fail;
  }
  if (!streamed && evbuffer_add(output, trailer, sizeof trailer) != 0) goto fail;
  return true;
fail:
  common_log(LOG_WARN, "data plane: out of memory writing a response to %s", c->peer);
  sconn_close(c);
  return false;
}

static void server_wake_cb(evutil_socket_t fd, short what, void *arg) {
  dp_server *s = arg;
  FL_PCHECK(pthread_mutex_lock(&s->done_lock));
  dp_done *d = s->done_head;
  s->done_head = s->done_tail = NULL;
  FL_PCHECK(pthread_mutex_unlock(&s->done_lock));
  while (d) {
    dp_done *next = d->next;
    dp_job *job = d->job;
    dp_sconn *c = job->conn;
    /* A streamed job keeps its connection busy until the trailer is out. */
    bool finished = d->trailer || !job->streamed;
    if (finished) c->busy = false;
    if (!c->bev) {
      job_unref(job);
      if (finished) sconn_close(c); /* closed while the job was out: free it now */
    } else if (d->trailer) {
      uint8_t trailer[4];
      common_put_u32(trailer, job->crc);
      job_unref(job);
      if (evbuffer_add(bufferevent_get_output(c->bev), trailer, sizeof trailer) != 0)
        sconn_close(c);
      else
        sconn_process(c);
    } else if (sconn_respond(c, job) && finished) {
      sconn_process(c);
    }
    d = next;
  }
}

/* Parses and starts what the input buffer holds: at most one request at a time. Returns
 * false when it closed the connection (which may be freed). */
static bool sconn_take_frames(dp_sconn *c) {
  dp_server *s = c->server;
  while (c->bev && !c->busy && !c->closing) {
    struct evbuffer *input = bufferevent_get_input(c->bev);
    /* The next request waits until the last response has been written, so a peer that does
     * not read cannot make us hold more than one response. */
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) return true;
    size_t have = evbuffer_get_length(input);
    if (have < DP_FRAME_HEADER_SIZE) return true;
    uint8_t raw[DP_FRAME_HEADER_SIZE];
    FL_ASSERT(evbuffer_copyout(input, raw, sizeof raw) == (ssize_t)sizeof raw);
    dp_header h;
    const char *bad = dp_header_decode(raw, &h);
    if (!bad && h.type == DP_FRAME_RESPONSE) bad = "unexpected response frame";
    if (!bad && h.type == DP_FRAME_HELLO && h.len > DP_SECRET_MAX) bad = "oversized hello";
    if (!bad && h.type == DP_FRAME_REQUEST && h.len != DP_REQUEST_WIRE_SIZE)
      bad = "request frame of the wrong length";
    if (!bad && h.status != 0) bad = "nonzero status in a request";
    if (bad) {
      sconn_drop(c, bad);
      return false;
    }
    if (have < DP_FRAME_HEADER_SIZE + h.len) return true;
    uint8_t payload[DP_SECRET_MAX > DP_REQUEST_WIRE_SIZE ? DP_SECRET_MAX : DP_REQUEST_WIRE_SIZE];
    evbuffer_drain(input, DP_FRAME_HEADER_SIZE);
    FL_ASSERT(evbuffer_remove(input, payload, h.len) == (int)h.len);
    if (dp_crc32c(0, payload, h.len) != h.crc) {
      sconn_drop(c, "payload checksum mismatch");
      return false;
    }
    if (h.type == DP_FRAME_HELLO) {
      if (s->secret && !secret_equal(payload, h.len, s->secret, s->secret_len)) {
        common_log(LOG_WARN, "data plane: %s sent a wrong shared secret; closing", c->peer);
        return sconn_reply_error_and_close(c, FL_EAUTH, "authentication failed: wrong shared secret");
      }
      c->authed = true;
      continue;
    }
    if (s->secret && !c->authed) {
      common_log(LOG_WARN, "data plane: %s sent no shared secret; closing", c->peer);
      return sconn_reply_error_and_close(c, FL_EAUTH,
                                         "authentication failed: no shared secret was sent");
    }
    dp_request req;
    uint64_t max_len;
    bad = dp_request_decode(payload, &req, &max_len);
    if (bad) {
      common_log(LOG_WARN, "data plane: malformed request from %s: %s", c->peer, bad);
      return sconn_reply_error_and_close(c, FL_EPROTO, bad);
    }
    dp_job *job = common_calloc(1, sizeof *job);
    if (job) {
      job->response.job = job->trailer.job = job;
      job->trailer.trailer = true;
    }
    if (!job) {
      common_log(LOG_WARN, "data plane: out of memory for a request from %s", c->peer);
      sconn_close(c);
      return false;
    }
    job->server = s;
    job->conn = c;
    job->req = req;
    job->max_len = max_len;
    c->busy = true;
    c->requested = true;
    atomic_fetch_add(&s->requests, 1);
    common_queue_push(&s->jobs, &job->node);
  }
  return c->bev != NULL;
}

static void sconn_process(dp_sconn *c) {
  if (sconn_take_frames(c)) sconn_timer_update(c);
}

static void sconn_read_cb(struct bufferevent *bev, void *arg) { sconn_process(arg); }

static void sconn_write_cb(struct bufferevent *bev, void *arg) {
  dp_sconn *c = arg;
  if (c->closing) {
    sconn_close(c);
    return;
  }
  sconn_process(c);
}

/* Why an OpenSSL bufferevent failed, as one line: OpenSSL's reasons (libevent queues them
 * per bufferevent, mixed with SSL_get_error codes that have no reason), else the socket's.
 * *not_tls: the peer's first bytes were no TLS record. */
static const char *bev_tls_errors(struct bufferevent *bev, short what, char *buf, size_t cap,
                                  bool *not_tls) {
  size_t used = 0;
  buf[0] = '\0';
  *not_tls = false;
  unsigned long e;
  while ((e = bufferevent_get_openssl_error(bev)) != 0) {
    const char *reason = ERR_reason_error_string(e);
    if (reason && ERR_GET_REASON(e) == SSL_R_WRONG_VERSION_NUMBER) *not_tls = true;
    if (reason && used + 1 < cap && !strstr(buf, reason))
      used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? "; " : "", reason);
    if (used >= cap) used = cap - 1;
  }
  int err = EVUTIL_SOCKET_ERROR();
  if (!buf[0] && (what & BEV_EVENT_EOF)) snprintf(buf, cap, "the peer closed the connection");
  else if (!buf[0]) snprintf(buf, cap, "%s", err ? strerror(err) : "no reason given");
  return buf;
}

/* Tells a client that sent no TLS (a flint client with TLS off, most likely) why it is being
 * closed, in a plaintext error response it can read: OpenSSL sends no alert to a peer whose
 * bytes are not TLS, so nothing else is on the stream. Best effort, on the raw socket; its
 * unread input is drained first so that the close is a FIN and not a reset that could
 * overtake the reply. */
static void sconn_tell_plaintext_peer(dp_sconn *c) {
  int fd = (int)bufferevent_getfd(c->bev);
  uint8_t frame[DP_FRAME_HEADER_SIZE + DP_MESSAGE_MAX];
  for (int i = 0; i < 16 && recv(fd, frame, sizeof frame, MSG_DONTWAIT) > 0; i++) {
  }
  char message[DP_MESSAGE_MAX];
  snprintf(message, sizeof message, "data plane: the block server on port %d has TLS on (FLINT_TLS) "
           "and this client has not: TLS may be on at one end only", c->server->port);
  size_t mlen = strlen(message);
  dp_header h = {.type = DP_FRAME_RESPONSE, .status = FL_EPROTO, .len = mlen,
                 .crc = dp_crc32c(0, message, mlen)};
  dp_header_encode(frame, &h);
  memcpy(frame + DP_FRAME_HEADER_SIZE, message, mlen);
  (void)send(fd, frame, DP_FRAME_HEADER_SIZE + mlen, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void sconn_event_cb(struct bufferevent *bev, short what, void *arg) {
  dp_sconn *c = arg;
  if (what & BEV_EVENT_CONNECTED) { /* TLS: the handshake is done */
    c->handshaken = true;
    return;
  }
  if (what & BEV_EVENT_TIMEOUT) {
    /* Only the write timeout is set: the peer took no byte of a response for that long. */
    atomic_fetch_add(&c->server->timed_out, 1);
    common_log(LOG_WARN, "data plane: closing connection from %s: it read nothing of a response in %lld ms",
               c->peer, (long long)c->server->limits.request_timeout_ms);
    sconn_close(c);
    return;
  }
  if (!c->handshaken && (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) {
    char why[256], line[400];
    bool not_tls;
    bev_tls_errors(bev, what, why, sizeof why, &not_tls);
    snprintf(line, sizeof line, "TLS handshake failed: %s%s", why,
             not_tls ? " (a client without TLS? TLS may be on at one end only)" : "");
    if (not_tls) sconn_tell_plaintext_peer(c);
    sconn_drop(c, line);
    return;
  }
  if (what & BEV_EVENT_ERROR)
    common_log(LOG_DEBUG, "data plane: connection from %s failed: %s", c->peer,
               strerror(EVUTIL_SOCKET_ERROR()));
  if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) sconn_close(c);
}

/* Whether a rate-limited warning is due (at most one every DP_REFUSED_LOG_MS); updates *last. */
static bool log_due(uint64_t *last_ns) {
  uint64_t now = common_now_ns();
  if (*last_ns && now - *last_ns < (uint64_t)DP_REFUSED_LOG_MS * 1000000ull) return false;
  *last_ns = now;
  return true;
}

static void server_accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                             int salen, void *arg) {
  dp_server *s = arg;
  atomic_fetch_add(&s->accepted, 1);
  if (s->limits.max_connections != DP_UNLIMITED && s->open_conns >= s->limits.max_connections) {
    evutil_closesocket(fd);
    atomic_fetch_add(&s->refused, 1);
    s->refused_unlogged++;
    if (log_due(&s->refused_logged_ns)) {
      char peer[64];
      sockaddr_name(sa, peer, sizeof peer);
      common_log(LOG_WARN, "data plane: refused %llu connection(s) (the latest from %s): %lld are open, "
                 "the limit (FLINT_DP_MAX_CONNECTIONS)", (unsigned long long)s->refused_unlogged, peer,
                 (long long)s->open_conns);
      s->refused_unlogged = 0;
    }
    return;
  }
  dp_sconn *c = common_calloc(1, sizeof *c);
  if (!c) {
    evutil_closesocket(fd);
    return;
  }
  c->server = s;
  sockaddr_name(sa, c->peer, sizeof c->peer);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SSL *ssl = NULL;
  if (s->tls) {
    /* The bufferevent owns the SSL and the socket from here (BEV_OPT_CLOSE_ON_FREE). */
    ssl = SSL_new(s->tls);
    c->bev = ssl ? bufferevent_openssl_socket_new(s->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                  BEV_OPT_CLOSE_ON_FREE)
                 : NULL;
    /* Clients close without close_notify: that is an end of stream, not an attack (a
     * truncated response fails the client's length and checksum checks anyway). */
    if (c->bev) bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
  } else {
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->handshaken = true;
  }
  c->timer = evtimer_new(s->base, sconn_timer_cb, c);
  if (!c->bev || !c->timer) {
    if (c->bev) bufferevent_free(c->bev);
    else {
      SSL_free(ssl);
      evutil_closesocket(fd);
    }
    if (c->timer) event_free(c->timer);
    common_free(c);
    return;
  }
  s->open_conns++;
  bufferevent_set_max_single_write(c->bev, DP_MAX_SINGLE_WRITE);
  /* A client sends one request at a time, so more unread input than a few frames is a peer
   * flooding us: reading pauses there instead of buffering without bound. */
  bufferevent_setwatermark(c->bev, EV_READ, 0, DP_INPUT_MAX);
  if (s->limits.request_timeout_ms != DP_UNLIMITED) {
    struct timeval tv = ms_timeval(s->limits.request_timeout_ms);
    bufferevent_set_timeouts(c->bev, NULL, &tv);
  }
  bufferevent_setcb(c->bev, sconn_read_cb, sconn_write_cb, sconn_event_cb, c);
  bufferevent_enable(c->bev, EV_READ | EV_WRITE);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  sconn_timer_update(c);
}

/* accept failed for want of something (file descriptors, memory): libevent would call again
 * at once and spin, so accepting pauses for DP_RELISTEN_MS. */
static void server_accept_error_cb(struct evconnlistener *l, void *arg) {
  dp_server *s = arg;
  int err = EVUTIL_SOCKET_ERROR();
  if (log_due(&s->accept_error_logged_ns))
    common_log(LOG_WARN, "data plane: cannot accept a connection: %s; pausing accepts for %d ms",
               evutil_socket_error_to_string(err), DP_RELISTEN_MS);
  evconnlistener_disable(l);
  struct timeval tv = ms_timeval(DP_RELISTEN_MS);
  evtimer_add(s->relisten, &tv);
}

static void server_relisten_cb(evutil_socket_t fd, short what, void *arg) {
  dp_server *s = arg;
  evconnlistener_enable(s->listener);
}

/* Hands a job (back) to the loop thread. Worker threads. */
static void server_done(dp_server *s, dp_done *d) {
  FL_PCHECK(pthread_mutex_lock(&s->done_lock));
  d->next = NULL;
  if (s->done_tail) s->done_tail->next = d;
  else s->done_head = d;
  s->done_tail = d;
  FL_PCHECK(pthread_mutex_unlock(&s->done_lock));
  event_active(s->wake, EV_READ, 0);
}

static void *server_worker_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-dp-worker");
  dp_server *s = arg;
  common_qnode *node;
  while ((node = common_queue_pop(&s->jobs, dp_spin_ns()))) {
    dp_job *job = (dp_job *)node;
    if (atomic_load(&s->stopping)) {
      job->status = FL_ECANCELLED;
      snprintf(job->message, sizeof job->message, "the block server is stopping");
    } else {
      common_error_clear();
      job->status = s->serve(s->serve_arg, &job->req, &job->out, &job->loan, &job->total);
      FL_ASSERT(!job->loan.release || job->out.len == 0); /* one payload or the other */
      size_t len = job_payload(job).len;
      if (job->status == FL_OK && len > job->max_len) {
        job->status = FL_ELIMIT;
        snprintf(job->message, sizeof job->message,
                 "object range of %zu bytes exceeds the client's limit of %llu bytes", len,
                 (unsigned long long)job->max_len);
      } else if (job->status == FL_OK && job->total < len) {
        job->total = len; /* a callback that forgot to set it */
      } else if (job->status != FL_OK) {
        snprintf(job->message, sizeof job->message, "%s",
                 fl_last_error()[0] ? fl_last_error() : fl_strerror(job->status));
      }
    }
    fl_bytes payload = job_payload(job);
    if (job->status != FL_OK) {
      fl_buf_free(&job->out);
      if (job->loan.release) job->loan.release(job->loan.arg);
      job->loan.release = NULL;
      job->crc = dp_crc32c(0, job->message, strlen(job->message));
      job->refs = 1;
      server_done(s, &job->response);
    } else if (payload.len < DP_STREAM_MIN) {
      job->crc = dp_crc32c(0, payload.data, payload.len);
      job->refs = 1;
      server_done(s, &job->response);
    } else {
      /* Large payloads start on their way at once and the checksum follows in the trailer:
       * computing it first would put a pass over the whole payload between the serve
       * callback and the first byte on the wire. Both passes only read the buffer. */
      job->streamed = true;
      job->refs = 2;
      server_done(s, &job->response);
      job->crc = dp_crc32c(0, payload.data, payload.len);
      server_done(s, &job->trailer);
    }
  }
  return NULL;
}

static void *server_loop_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-dp-server");
  dp_server *s = arg;
  event_base_loop(s->base, EVLOOP_NO_EXIT_ON_EMPTY);
  return NULL;
}

fl_status dp_resolve(const char *host, int port, bool passive, struct sockaddr_storage *addr,
                     socklen_t *addrlen) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc != 0 || !res)
    return FL_ERR(FL_ENET, "cannot resolve %s: %s", host ? host : "(any)", gai_strerror(rc));
  memcpy(addr, res->ai_addr, res->ai_addrlen);
  *addrlen = res->ai_addrlen;
  freeaddrinfo(res);
  return FL_OK;
}

static dp_server_limits env_limits;
static pthread_once_t env_limits_once = PTHREAD_ONCE_INIT;
static void env_limits_read(void) {
  env_limits.idle_timeout_ms = config_limit(CONFIG_DP_IDLE_TIMEOUT_MS);
  env_limits.request_timeout_ms = config_limit(CONFIG_DP_REQUEST_TIMEOUT_MS);
  env_limits.max_connections = config_limit(CONFIG_DP_MAX_CONNECTIONS);
}

static int64_t limit_resolve(int64_t given, int64_t from_env) {
  return given == 0 ? from_env : given < 0 ? DP_UNLIMITED : given;
}

/* The server's SSL_CTX when FLINT_TLS is on (s->tls stays NULL when off); the settings' own
 * error (naming the setting and the file) otherwise. */
static fl_status server_tls_setup(dp_server *s) {
  net_tls t;
  fl_status st = net_tls_read(NET_TLS_SERVER, &t);
  if (st == FL_OK && t.on) st = net_tls_context(&t, NET_TLS_SERVER, &s->tls);
  net_tls_free(&t);
  if (st != FL_OK) return common_error_wrap(st, "data plane: ");
  if (!s->tls) return FL_OK;
  /* libevent goes on to the next chunk of the output buffer after a partial SSL_write, so a
   * partial write would lose the rest of its chunk: whole writes only (libevent retries a
   * blocked one with the same bytes). */
  SSL_CTX_clear_mode(s->tls, SSL_MODE_ENABLE_PARTIAL_WRITE);
  SSL_CTX_set_num_tickets(s->tls, 0);
#ifdef SSL_OP_IGNORE_UNEXPECTED_EOF
  /* OpenSSL 3 reports a close without close_notify as an error; libevent then reports an
   * error instead of the end of stream its dirty-shutdown setting asks for. */
  SSL_CTX_set_options(s->tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
#endif
  return FL_OK;
}

fl_status dp_server_start(const char *host, int port, const char *secret, dp_serve_fn serve,
                          void *arg, dp_server **out) {
  return dp_server_start_with_limits(host, port, secret, serve, arg, NULL, out);
}

fl_status dp_server_start_with_limits(const char *host, int port, const char *secret,
                                      dp_serve_fn serve, void *arg, const dp_server_limits *limits,
                                      dp_server **out) {
  fl_status status = FL_OK;
  dp_server *s = NULL;
  /* libevent writes with write(2): a peer that has gone must not kill the process. */
  struct sigaction old_pipe;
  if (sigaction(SIGPIPE, NULL, &old_pipe) == 0 && old_pipe.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  if (!serve || !out || port < 0 || port > 65535)
    return FL_ERR(FL_EINVAL, "dp_server_start: serve and out are required, port in 0..65535");
  *out = NULL;
  if (secret && strlen(secret) > DP_SECRET_MAX)
    return FL_ERR(FL_EINVAL, "dp_server_start: the secret is longer than %d bytes",
                  DP_SECRET_MAX);
  dp_evthread_setup();
  s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "cannot allocate a block server");
  common_queue_init(&s->jobs);
  FL_PCHECK(pthread_mutex_init(&s->done_lock, NULL));
  s->serve = serve;
  s->serve_arg = arg;
  FL_PCHECK(pthread_once(&env_limits_once, env_limits_read));
  dp_server_limits given = DP_SERVER_LIMITS_INIT;
  if (limits) given = *limits;
  s->limits.idle_timeout_ms = limit_resolve(given.idle_timeout_ms, env_limits.idle_timeout_ms);
  s->limits.request_timeout_ms = limit_resolve(given.request_timeout_ms, env_limits.request_timeout_ms);
  s->limits.max_connections = limit_resolve(given.max_connections, env_limits.max_connections);
  if (secret && *secret) {
    s->secret = common_strdup(secret);
    if (!s->secret) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the secret"));
    s->secret_len = strlen(secret);
  }
  FL_CHECK(server_tls_setup(s));
  struct sockaddr_storage addr;
  socklen_t addrlen;
  FL_CHECK(dp_resolve(host, port, true, &addr, &addrlen));
  s->base = event_base_new();
  if (!s->base) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot create an event base"));
  s->wake = event_new(s->base, -1, EV_PERSIST, server_wake_cb, s);
  s->relisten = evtimer_new(s->base, server_relisten_cb, s);
  if (!s->wake || !s->relisten) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot create an event"));
  s->listener = evconnlistener_new_bind(s->base, server_accept_cb, s,
                                        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128,
                                        (struct sockaddr *)&addr, (int)addrlen);
  if (!s->listener)
    FL_CHECK(FL_ERR(FL_ENET, "data plane cannot listen on %s:%d: %s", host ? host : "*", port,
                    strerror(errno)));
  evconnlistener_set_error_cb(s->listener, server_accept_error_cb);
  struct sockaddr_storage bound;
  socklen_t boundlen = sizeof bound;
  if (getsockname(evconnlistener_get_fd(s->listener), (struct sockaddr *)&bound, &boundlen) != 0)
    FL_CHECK(FL_ERR(FL_ENET, "getsockname: %s", strerror(errno)));
  s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
  uint32_t cores = common_cores();
  s->n_workers = cores < DP_SERVER_WORKERS_MIN   ? DP_SERVER_WORKERS_MIN
                 : cores > DP_SERVER_WORKERS_MAX ? DP_SERVER_WORKERS_MAX
                                                 : (int)cores;
  for (int i = 0; i < s->n_workers; i++) {
    if (pthread_create(&s->workers[i], NULL, server_worker_main, s) != 0) {
      s->n_workers = i;
      FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start a data-plane worker thread"));
    }
  }
  if (pthread_create(&s->loop_thread, NULL, server_loop_main, s) != 0)
    FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the data-plane server thread"));
  s->loop_started = true;
  *out = s;
  return FL_OK;
cleanup:
  dp_server_stop(s);
  return status;
}

int dp_server_port(const dp_server *s) { return s ? s->port : -1; }

dp_server_stats dp_server_stats_get(const dp_server *s) {
  dp_server_stats st = {atomic_load(&s->accepted), atomic_load(&s->requests),
                        atomic_load(&s->dropped), atomic_load(&s->timed_out),
                        atomic_load(&s->refused)};
  return st;
}

void dp_server_stop(dp_server *s) {
  if (!s) return;
  /* Workers first: queued jobs come back cancelled and every job ends on the done list. */
  atomic_store(&s->stopping, true);
  common_queue_close(&s->jobs);
  for (int i = 0; i < s->n_workers; i++) FL_PCHECK(pthread_join(s->workers[i], NULL));
  if (s->loop_started) {
    event_base_loopbreak(s->base);
    FL_PCHECK(pthread_join(s->loop_thread, NULL));
  }
  /* The loop has ended: this thread owns everything now. */
  for (dp_done *d = s->done_head, *next; d; d = next) {
    next = d->next;
    d->job->conn->busy = false;
    job_unref(d->job);
  }
  while (s->conns) {
    s->conns->busy = false;
    sconn_close(s->conns); /* frees pending payload references too */
  }
  if (s->listener) evconnlistener_free(s->listener);
  if (s->relisten) event_free(s->relisten);
  if (s->wake) event_free(s->wake);
  /* bufferevent_free only schedules a bufferevent's release (a finalizer run by the loop),
   * and the loop ended with some scheduled (a TLS connection dropped as the server stopped
   * leaked its SSL and buffers now and then): one more pass, with no listener or event of
   * ours left to call, runs them. */
  if (s->base) (void)event_base_loop(s->base, EVLOOP_NONBLOCK);
  if (s->base) event_base_free(s->base);
  common_queue_destroy(&s->jobs);
  pthread_mutex_destroy(&s->done_lock);
  SSL_CTX_free(s->tls);
  common_free(s->secret);
  common_free(s);
}
