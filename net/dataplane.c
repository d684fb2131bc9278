/*
 * dataplane.c: flint's block transfer over libevent: a block server in every process that
 * holds blocks, and a client that task threads fetch through (API and wire format: net.h).
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
 * - Client: one event-loop thread owns every socket, raw non-blocking fds with libevent
 *   events rather than bufferevents, so that a payload goes from the kernel straight into the
 *   caller's fl_buf (one copy, checksummed while it is hot in cache). dp_fetch puts an
 *   operation on the submit list, activates `wake` and waits on the operation's
 *   common_event; the loop assigns it to an idle connection of its peer, opens a new one
 *   (up to DP_CONNECTIONS_PER_PEER), or queues it. A connection carries one request at a
 *   time. An operation lives on its caller's stack: the loop touches it only until it sets
 *   its event.
 * - Failures: a malformed frame closes that connection only (the server logs a warning
 *   naming the peer and keeps serving others); a broken client connection fails only its
 *   request, except that a request sent on a reused connection that dies before any byte of
 *   the response arrived is retried once on a fresh connection (the server may have closed an
 *   idle connection just as we wrote to it; requests are reads, so a retry is harmless).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <event2/thread.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "common/config.h"
#include "net/net.h"

/* Server worker threads: serve callbacks mostly wait on disk or copy memory. */
#define DP_SERVER_WORKERS_MIN 2
#define DP_SERVER_WORKERS_MAX 4
/* The most one bufferevent write may hand the kernel in one go: a whole typical chunk, so a
 * response leaves in few system calls; the kernel's socket buffer bounds it anyway. */
#define DP_MAX_SINGLE_WRITE ((size_t)8 << 20)
#define DP_PEER_NAME_MAX 300
/* Unread input at which a server connection stops reading (a hello and a request take 384). */
#define DP_INPUT_MAX ((size_t)4096)
/* How long accepting pauses after accept failed (out of file descriptors). */
#define DP_RELISTEN_MS 100
/* Responses from this size up are streamed: sent before their checksum is known. */
#define DP_STREAM_MIN ((size_t)256 << 10)
/* How long a fetching thread or an idle worker spins before it sleeps. A fetch takes at
 * least a loopback round trip (60-85 us) and these threads share the cores with the loops
 * that move the bytes, so they spin far less than common_spin_ns()'s hand-off budget: on a
 * 2-core machine a 200 us spin per fetch cost a quarter of the throughput of 4 MiB fetches. */
static uint64_t dp_spin_ns(void) {
  uint64_t cap = 20000, v = common_spin_ns();
  return v < cap ? v : cap;
}

/* ---- CRC32C ---------------------------------------------------------------------------- */
/*
 * zlib's crc32 runs at a few GB/s, about the speed of loopback TCP, and both ends checksum
 * every payload, so it would halve a fetch's throughput. CRC32C has an instruction (SSE4.2);
 * one stream of it is bound by its 3-cycle latency, so large inputs run as three interleaved
 * streams joined with the GF(2) shift below (as zlib's crc32_combine does). CPUs without it
 * use a slicing-by-8 table.
 */
#define CRC32C_POLY 0x82f63b78u /* reflected */
#define CRC32C_BLOCK 8192       /* bytes per stream per round of the three-stream loop */

static uint32_t crc32c_table[8][256];
static uint32_t crc32c_shift_1block, crc32c_shift_2blocks; /* x^(8*BLOCK), x^(16*BLOCK) */
static bool crc32c_have_hw;
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

/* a * b modulo the polynomial, in the reflected representation (bit 31 is x^0). */
static uint32_t crc32c_multmodp(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
  }
  return p;
}

/* x^(8 * nbytes) modulo the polynomial. */
static uint32_t crc32c_x8n(uint64_t nbytes) {
  uint32_t result = 1u << 31, power = 1u << 30; /* x^0, x^1 */
  uint64_t n = nbytes * 8;
  while (n) {
    if (n & 1) result = crc32c_multmodp(power, result);
    power = crc32c_multmodp(power, power);
    n >>= 1;
  }
  return result;
}

static void crc32c_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    crc32c_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++)
      crc32c_table[t][i] =
          (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
  crc32c_shift_1block = crc32c_x8n(CRC32C_BLOCK);
  crc32c_shift_2blocks = crc32c_x8n(2 * CRC32C_BLOCK);
#if defined(__x86_64__)
  __builtin_cpu_init();
  crc32c_have_hw = __builtin_cpu_supports("sse4.2") && !getenv("FLINT_NO_CRC32C_HW");
#endif
}

/* The register-level loops take and return the inverted CRC. */
static uint32_t crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
  while (n && ((uintptr_t)p & 7)) {
    crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = crc32c_table[7][w & 0xff] ^ crc32c_table[6][(w >> 8) & 0xff] ^
          crc32c_table[5][(w >> 16) & 0xff] ^ crc32c_table[4][(w >> 24) & 0xff] ^
          crc32c_table[3][(w >> 32) & 0xff] ^ crc32c_table[2][(w >> 40) & 0xff] ^
          crc32c_table[1][(w >> 48) & 0xff] ^ crc32c_table[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc32, const uint8_t *p,
                                                            size_t n) {
  uint64_t crc = crc32;
  while (n && ((uintptr_t)p & 7)) {
    crc = _mm_crc32_u8((uint32_t)crc, *p++);
    n--;
  }
  while (n >= 3 * CRC32C_BLOCK) {
    uint64_t c1 = 0, c2 = 0, w0, w1, w2;
    for (size_t i = 0; i < CRC32C_BLOCK; i += 8) {
      memcpy(&w0, p + i, 8);
      memcpy(&w1, p + CRC32C_BLOCK + i, 8);
      memcpy(&w2, p + 2 * CRC32C_BLOCK + i, 8);
      crc = _mm_crc32_u64(crc, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    /* The CRC register is linear: the first stream's value moves past the two later
     * blocks, the second's past one, and the three are xored. */
    crc = crc32c_multmodp(crc32c_shift_2blocks, (uint32_t)crc) ^
          crc32c_multmodp(crc32c_shift_1block, (uint32_t)c1) ^ (uint32_t)c2;
    p += 3 * CRC32C_BLOCK;
    n -= 3 * CRC32C_BLOCK;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    crc = _mm_crc32_u64(crc, w);
    p += 8;
    n -= 8;
  }
  while (n--) crc = _mm_crc32_u8((uint32_t)crc, *p++);
  return (uint32_t)crc;
}
#endif

uint32_t dp_crc32c(uint32_t crc, const void *data, size_t len) {
  FL_PCHECK(pthread_once(&crc32c_once, crc32c_init));
  const uint8_t *p = data;
  if (len == 0) return crc;
#if defined(__x86_64__)
  if (crc32c_have_hw) return ~crc32c_hw(~crc, p, len);
#endif
  return ~crc32c_sw(~crc, p, len);
}

/* ---- frames ---------------------------------------------------------------------------- */

typedef struct dp_header {
  uint8_t type;
  uint16_t status;
  uint64_t len, total;
  uint32_t crc;
} dp_header;

static inline void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t get_u16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline uint32_t get_u32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t get_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void header_encode(uint8_t out[DP_FRAME_HEADER_SIZE], const dp_header *h) {
  put_u32(out, DP_FRAME_MAGIC);
  out[4] = DP_FRAME_VERSION;
  out[5] = h->type;
  put_u16(out + 6, h->status);
  put_u64(out + 8, h->len);
  put_u64(out + 16, h->total);
  put_u32(out + 24, h->crc);
  put_u32(out + 28, dp_crc32c(0, out, 28));
}

/* Checks what every frame must satisfy; the caller checks type-specific limits. Returns
 * NULL, or what is wrong. */
static const char *header_decode(const uint8_t in[DP_FRAME_HEADER_SIZE], dp_header *h) {
  if (get_u32(in) != DP_FRAME_MAGIC) return "bad magic (not a flint data-plane peer?)";
  if (in[4] != DP_FRAME_VERSION) return "unsupported protocol version";
  if (get_u32(in + 28) != dp_crc32c(0, in, 28)) return "header checksum mismatch";
  h->type = in[5];
  h->status = get_u16(in + 6);
  h->len = get_u64(in + 8);
  h->total = get_u64(in + 16);
  h->crc = get_u32(in + 24);
  if (h->type < DP_FRAME_HELLO || h->type > DP_FRAME_RESPONSE) return "unknown frame type";
  return NULL;
}

static void request_encode(uint8_t out[DP_REQUEST_WIRE_SIZE], const dp_request *r,
                           uint64_t max_len) {
  memset(out, 0, DP_REQUEST_WIRE_SIZE);
  out[0] = r->kind;
  for (int i = 0; i < 4; i++) put_u64(out + 8 + 8 * i, r->key[i]);
  put_u64(out + 40, r->offset);
  put_u64(out + 48, r->len);
  put_u64(out + 56, max_len);
}

static const char *request_decode(const uint8_t in[DP_REQUEST_WIRE_SIZE], dp_request *r,
                                  uint64_t *max_len) {
  memset(r, 0, sizeof *r);
  r->kind = in[0];
  if (r->kind < DP_SHUFFLE || r->kind > DP_KIND_LAST) return "unknown request kind";
  for (int i = 1; i < 8; i++)
    if (in[i]) return "nonzero padding in request";
  for (int i = 0; i < 4; i++) r->key[i] = get_u64(in + 8 + 8 * i);
  r->offset = get_u64(in + 40);
  r->len = get_u64(in + 48);
  *max_len = get_u64(in + 56);
  return NULL;
}

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

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static void evthread_setup(void) { FL_ASSERT(evthread_use_pthreads() == 0); }

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
  header_encode(head, &h);
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
    header_encode(head, &h);
    bool ok = evbuffer_add(output, head, sizeof head) == 0 &&
              evbuffer_add(output, job->message, mlen) == 0;
    job_unref(job);
    if (!ok) goto fail;
    return true;
  }
  fl_bytes payload = job_payload(job);
  h.len = payload.len;
  h.total = job->total;
  header_encode(head, &h);
  uint8_t trailer[4];
  put_u32(trailer, job->crc);
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
      put_u32(trailer, job->crc);
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
    const char *bad = header_decode(raw, &h);
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
    bad = request_decode(payload, &req, &max_len);
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

static void sconn_event_cb(struct bufferevent *bev, short what, void *arg) {
  dp_sconn *c = arg;
  if (what & BEV_EVENT_TIMEOUT) {
    /* Only the write timeout is set: the peer took no byte of a response for that long. */
    atomic_fetch_add(&c->server->timed_out, 1);
    common_log(LOG_WARN, "data plane: closing connection from %s: it read nothing of a response in %lld ms",
               c->peer, (long long)c->server->limits.request_timeout_ms);
    sconn_close(c);
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
  c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
  c->timer = evtimer_new(s->base, sconn_timer_cb, c);
  if (!c->bev || !c->timer) {
    if (c->bev) bufferevent_free(c->bev);
    else evutil_closesocket(fd);
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

static fl_status resolve(const char *host, int port, bool passive, struct sockaddr_storage *addr,
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
  FL_PCHECK(pthread_once(&evthread_once, evthread_setup));
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
  struct sockaddr_storage addr;
  socklen_t addrlen;
  FL_CHECK(resolve(host, port, true, &addr, &addrlen));
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
  if (s->base) event_base_free(s->base);
  common_queue_destroy(&s->jobs);
  pthread_mutex_destroy(&s->done_lock);
  common_free(s->secret);
  common_free(s);
}

/* ---- client ---------------------------------------------------------------------------- */

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

typedef enum cconn_state { CC_CONNECTING, CC_IDLE, CC_SENDING, CC_RECEIVING } cconn_state;

struct dp_cconn {
  dp_cconn *next; /* the peer's list */
  dp_peer *peer;
  int fd;
  struct event *rev, *wev;
  cconn_state state;
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
  bool connecting = k->state == CC_CONNECTING;
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
    } else if (status == FL_ENET) {
      op_finish(op, status, "data plane: connection to %s lost: %s", p->name, why);
    } else {
      op_finish(op, status, "data plane: peer %s: %s", p->name, why);
    }
  }
  peer_dispatch(c, p);
}

static void cconn_try_send(dp_client *c, dp_cconn *k) {
  while (k->sent < k->send_len) {
    ssize_t n = send(k->fd, k->send + k->sent, k->send_len - k->sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        event_add(k->wev, NULL);
        return;
      }
      cconn_fail(c, k, FL_ENET, strerror(errno));
      return;
    }
    k->sent += (size_t)n;
  }
  event_del(k->wev);
  k->state = CC_RECEIVING;
}

static void cconn_start(dp_client *c, dp_cconn *k, dp_op *op) {
  k->op = op;
  op->conn = k;
  k->send_len = k->sent = 0;
  if (!k->hello_sent && c->secret) {
    dp_header hello = {.type = DP_FRAME_HELLO, .len = c->secret_len,
                       .crc = dp_crc32c(0, c->secret, c->secret_len)};
    header_encode(k->send, &hello);
    memcpy(k->send + DP_FRAME_HEADER_SIZE, c->secret, c->secret_len);
    k->send_len = DP_FRAME_HEADER_SIZE + c->secret_len;
  }
  k->hello_sent = true;
  uint8_t *req = k->send + k->send_len + DP_FRAME_HEADER_SIZE;
  request_encode(req, &op->req, op->max_len);
  dp_header h = {.type = DP_FRAME_REQUEST, .len = DP_REQUEST_WIRE_SIZE,
                 .crc = dp_crc32c(0, req, DP_REQUEST_WIRE_SIZE)};
  header_encode(k->send + k->send_len, &h);
  k->send_len += DP_FRAME_HEADER_SIZE + DP_REQUEST_WIRE_SIZE;
  k->head_got = 0;
  k->have_header = false;
  k->got = 0;
  k->trailer_got = 0;
  k->crc = 0;
  k->state = CC_SENDING;
  cconn_try_send(c, k);
}

/* A whole response has arrived. */
static void cconn_complete(dp_client *c, dp_cconn *k) {
  dp_op *op = k->op;
  dp_peer *p = k->peer;
  uint32_t want = k->h.status == FL_OK ? get_u32(k->trailer) : k->h.crc;
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
  const char *bad = header_decode(k->head, &k->h);
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

static void cconn_read_cb(evutil_socket_t fd, short what, void *arg) {
  dp_cconn *k = arg;
  dp_client *c = k->peer->client;
  if (k->state != CC_SENDING && k->state != CC_RECEIVING) {
    /* An idle connection: the server closed it, or sent what nobody asked for. */
    char byte;
    ssize_t n = recv(k->fd, &byte, 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n > 0)
      common_log(LOG_WARN, "data plane: %s sent bytes on an idle connection; closing it",
                 k->peer->name);
    cconn_fail(c, k, FL_ENET, "closed while idle");
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
    ssize_t n = recv(k->fd, dst, want, 0);
    if (n == 0) {
      cconn_fail(c, k, FL_ENET, k->have_header ? "the peer closed the connection mid-response"
                                               : "the peer closed the connection");
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      cconn_fail(c, k, FL_ENET, strerror(errno));
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
    dp_op *op = k->op;
    cconn_start(c, k, op);
    return;
  }
  if (k->state == CC_SENDING) cconn_try_send(c, k);
  else event_del(k->wev);
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
  if (connect(fd, (struct sockaddr *)&op->addr, op->addrlen) == 0) {
    event_add(k->rev, NULL);
    cconn_start(c, k, op);
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

fl_status dp_client_create(const char *secret, dp_client **out) {
  fl_status status = FL_OK;
  if (!out) return FL_ERR(FL_EINVAL, "dp_client_create: out is NULL");
  *out = NULL;
  if (secret && strlen(secret) > DP_SECRET_MAX)
    return FL_ERR(FL_EINVAL, "dp_client_create: the secret is longer than %d bytes",
                  DP_SECRET_MAX);
  FL_PCHECK(pthread_once(&evthread_once, evthread_setup));
  dp_client *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a data-plane client");
  FL_PCHECK(pthread_mutex_init(&c->submit_lock, NULL));
  atomic_init(&c->max_payload, DP_MAX_PAYLOAD_DEFAULT);
  if (secret && *secret) {
    c->secret = common_strdup(secret);
    if (!c->secret) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the secret"));
    c->secret_len = strlen(secret);
  }
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
  common_free(c->secret);
  common_free(c);
}

/* Splits "HOST:PORT" ("[V6]:PORT" for IPv6) and resolves it. Caller's thread: a name lookup
 * may block, and must not block the loop. */
static fl_status peer_resolve(const char *peer, struct sockaddr_storage *addr,
                              socklen_t *addrlen) {
  const char *colon = strrchr(peer, ':');
  if (!colon || colon == peer || !colon[1])
    return FL_ERR(FL_EINVAL, "data plane: peer \"%s\" is not HOST:PORT", peer);
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (*end || errno || port <= 0 || port > 65535)
    return FL_ERR(FL_EINVAL, "data plane: peer \"%s\" has a bad port", peer);
  char host[DP_PEER_NAME_MAX];
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
  fl_status st = resolve(host, (int)port, false, addr, addrlen);
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
