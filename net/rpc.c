/*
 * rpc.c: unary calls over gRPC's C core, the control plane of driver and executors (the
 * contract is in net.h): the server, its settings, and what both ends share.
 *
 * Server design. gRPC hands out calls of any method (grpc_server_request_call) on one
 * completion queue, and one thread owns that queue: it accepts calls, checks the secret,
 * starts the receive batches and learns of cancellations, and never runs the handler. A call
 * whose request has arrived goes through a queue to a pool of handler threads; the handler
 * thread starts the reply batch itself, and its completion comes back to the queue's thread,
 * which frees the call once all of its batches are done. A server may also have a quick
 * handler, to which the queue's thread offers the calls of the methods it names first: it
 * answers those that cannot block (a task launch, a status report) on the spot, sparing two
 * thread hand-offs a call, and declines the rest. A handler of either kind may also defer a
 * call (rpc_defer): its reply then comes from whichever thread has it, later (the driver's
 * scheduler thread when a job ends), and the call holds a reference until then. gRPC wants
 * the batches of one call started by one thread at a time, except that send-only and
 * receive-only batches may race: the queue's thread starts the receive batches before the
 * call goes to a handler, and a call's send batch is started once, by whichever thread holds
 * the call then (for a deferred call, the one that replies).
 *
 * Each call is one allocation whose completion tags are its address plus a small op number,
 * so events allocate nothing. The server keeps a fixed number of call slots (requests posted
 * to gRPC plus calls accepted and not yet finished), which bounds its memory at that many
 * requests of max_message bytes; further calls wait inside gRPC for a slot.
 *
 * Errors cross the wire as a gRPC status for other tools plus trailing metadata
 * "flint-status" with the numeric fl_status, so that the client returns exactly the
 * handler's code. The secret travels as metadata "flint-secret": in clear text on plain
 * TCP, encrypted when FLINT_TLS is on. Then the server speaks only TLS (gRPC's SSL
 * credentials with FLINT_TLS_CERT and FLINT_TLS_KEY, read by net/tls.c at the start) and asks
 * no client certificate: TLS authenticates the server and hides the secret, and the secret
 * still authenticates the client. The client is in rpc_client.c.
 */
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "common/config.h"
#include "net/rpc_internal.h"
#include "net/tls.h"

#define RPC_DEFAULT_HANDLER_THREADS 8
#define RPC_MAX_HANDLER_THREADS 1024
/* While stopping, how often the queue's thread looks whether the last call is gone (a call
 * freed on a handler thread posts no event). */
#define RPC_STOP_POLL_MS 20
/* The server pings a client after this long without a byte from it, and drops the connection
 * (cancelling its calls) when the ping is not answered in RPC_SERVER_KEEPALIVE_TIMEOUT_MS: a
 * client that vanished without a FIN (a cut link, a dead machine) would otherwise hold its
 * connection and a call it left waiting for ever, since a call in progress keeps a
 * connection from being idle. */
#define RPC_SERVER_KEEPALIVE_MS 60000
#define RPC_SERVER_KEEPALIVE_TIMEOUT_MS 20000

/* ---- settings -------------------------------------------------------------------------- */

static struct {
  int64_t idle_timeout_ms, handshake_timeout_ms, max_connections;
  bool max_connections_set;
} rpc_env;
static pthread_once_t rpc_env_once = PTHREAD_ONCE_INIT;
static void rpc_env_read(void) {
  rpc_env.idle_timeout_ms = config_limit(CONFIG_RPC_IDLE_TIMEOUT_MS);
  rpc_env.handshake_timeout_ms = config_limit(CONFIG_RPC_HANDSHAKE_TIMEOUT_MS);
  rpc_env.max_connections = config_limit(CONFIG_RPC_MAX_CONNECTIONS);
  rpc_env.max_connections_set = config_text(CONFIG_RPC_MAX_CONNECTIONS) != NULL; /* even if invalid */
}

/* A limit as a gRPC integer argument: RPC_UNLIMITED is INT_MAX, gRPC's "unlimited". */
static int rpc_limit_arg(int64_t given, int64_t from_env) {
  int64_t v = given == 0 ? from_env : given;
  return v < 0 || v > INT32_MAX ? INT32_MAX : (int)v;
}

/* ---- status mapping -------------------------------------------------------------------- */

bool rpc_status_known(int status) {
  switch (status) {
#define RPC_KNOWN_(name, value, text) case value:
    FL_STATUS_TABLE(RPC_KNOWN_)
#undef RPC_KNOWN_
    return true;
  }
  return false;
}

/* The gRPC code that tells other gRPC tools what kind of failure a status is. */
static grpc_status_code rpc_grpc_code(fl_status status) {
  switch (status) {
  case FL_OK: return GRPC_STATUS_OK;
  case FL_EINVAL: case FL_EFORMAT: case FL_EPROTO: return GRPC_STATUS_INVALID_ARGUMENT;
  case FL_ENOMEM: case FL_ELIMIT: case FL_ESLOTS: return GRPC_STATUS_RESOURCE_EXHAUSTED;
  case FL_ENOENT: return GRPC_STATUS_NOT_FOUND;
  case FL_EEXIST: return GRPC_STATUS_ALREADY_EXISTS;
  case FL_EEMPTY: case FL_ESTATE: case FL_ENODEVICE: return GRPC_STATUS_FAILED_PRECONDITION;
  case FL_EUSER: case FL_EJOB: case FL_EFETCH: return GRPC_STATUS_ABORTED;
  case FL_ECORRUPT: return GRPC_STATUS_DATA_LOSS;
  case FL_ECANCELLED: return GRPC_STATUS_CANCELLED;
  case FL_ENET: case FL_EPEER: return GRPC_STATUS_UNAVAILABLE;
  case FL_EAUTH: return GRPC_STATUS_UNAUTHENTICATED;
  case FL_ETIMEDOUT: return GRPC_STATUS_DEADLINE_EXCEEDED;
  case FL_EIO: case FL_EINTERNAL: case FL_EDEVICE: return GRPC_STATUS_INTERNAL;
  }
  return GRPC_STATUS_UNKNOWN;
}

/* Constant time in the length of `want` (the configured secret), so that the time a refusal
 * takes says nothing about how much of a guess was right. */
static bool rpc_secret_equal(const char *want, size_t want_len, grpc_slice got) {
  const uint8_t *g = GRPC_SLICE_START_PTR(got);
  size_t got_len = GRPC_SLICE_LENGTH(got);
  uint8_t diff = (uint8_t)(want_len != got_len);
  for (size_t i = 0; i < want_len; i++) diff |= (uint8_t)want[i] ^ (i < got_len ? g[i] : 0);
  return diff == 0;
}

fl_status rpc_check_secret(const char *secret) {
  for (const char *p = secret; *p; p++)
    if (*p < 0x20 || *p > 0x7e)
      return FL_ERR(FL_EINVAL, "the shared secret must be printable ASCII (byte %d at %zu)",
                    (unsigned char)*p, (size_t)(p - secret));
  return FL_OK;
}

/* ---- server ---------------------------------------------------------------------------- */

enum rpc_op { RPC_OP_NEW = 1, RPC_OP_RECV, RPC_OP_CLOSE, RPC_OP_SEND };

typedef struct rpc_server_call {
  common_qnode node; /* in the handler queue */
  rpc_server *server;
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array request_md;
  grpc_byte_buffer *request_bb; /* out of RECV_MESSAGE */
  grpc_slice body;              /* request_bb flattened (rpc_server_read_body) */
  int close_cancelled;          /* out of RECV_CLOSE_ON_SERVER */
  atomic_bool cancelled;
  bool deferred;                /* rpc_defer: the reply comes from rpc_deferred_reply */
  atomic_int refs;              /* batches in flight, plus one while a handler (or the owner
                                   of a deferred call) has it */
  char *method, *peer;          /* method: common_malloc; peer: gpr_malloc */
  /* The reply, kept until its batch completes. */
  grpc_byte_buffer *reply_bb;
  grpc_slice status_details;
  grpc_metadata status_md;
  char status_text[16];
} rpc_server_call;

struct rpc_server {
  grpc_server *server;
  grpc_completion_queue *cq;
  rpc_handler_fn handler;
  rpc_quick_fn quick;
  const char *const *quick_methods;
  size_t quick_max_request;
  void *handler_arg;
  char *secret; /* NULL: none */
  size_t secret_len;
  size_t max_message;
  uint32_t slots;
  int port;
  bool grpc_started;
  common_queue queue;
  bool queue_ready;
  pthread_t cq_thread;
  bool cq_thread_started;
  pthread_t *handlers;
  uint32_t handlers_started;
  atomic_bool stopping;
  atomic_int live; /* rpc_server_call structs that exist */
  char shutdown_tag; /* its address is the tag of grpc_server_shutdown_and_notify */
};

static inline void *rpc_tag(rpc_server_call *c, enum rpc_op op) { return (char *)c + op; }

static fl_status rpc_server_post(rpc_server *s);

static void rpc_server_call_free(rpc_server_call *c) {
  rpc_server *s = c->server;
  if (c->call) grpc_call_unref(c->call);
  grpc_call_details_destroy(&c->details);
  grpc_metadata_array_destroy(&c->request_md);
  if (c->request_bb) grpc_byte_buffer_destroy(c->request_bb);
  grpc_slice_unref(c->body);
  if (c->reply_bb) grpc_byte_buffer_destroy(c->reply_bb);
  grpc_slice_unref(c->status_details);
  common_free(c->method);
  gpr_free(c->peer);
  common_free(c);
  /* The replacement is counted before this one goes, so that `live` reaches 0 only when
   * the last call is gone for good. */
  if (!atomic_load(&s->stopping) && rpc_server_post(s) != FL_OK)
    common_log(LOG_ERROR, "rpc: server on port %d lost a call slot: %s", s->port, fl_last_error());
  atomic_fetch_sub(&s->live, 1);
}

static void rpc_server_call_unref(rpc_server_call *c) {
  if (atomic_fetch_sub(&c->refs, 1) == 1) rpc_server_call_free(c);
}

/* Asks gRPC for the next call into a fresh slot. Any thread. */
static fl_status rpc_server_post(rpc_server *s) {
  rpc_server_call *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a call slot");
  c->server = s;
  grpc_call_details_init(&c->details);
  grpc_metadata_array_init(&c->request_md);
  c->status_details = grpc_empty_slice();
  c->body = grpc_empty_slice();
  atomic_init(&c->cancelled, false);
  atomic_init(&c->refs, 1); /* the NEW event */
  atomic_fetch_add(&s->live, 1);
  grpc_call_error err = grpc_server_request_call(s->server, &c->call, &c->details, &c->request_md,
                                                 s->cq, s->cq, rpc_tag(c, RPC_OP_NEW));
  if (err != GRPC_CALL_OK) {
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->request_md);
    common_free(c);
    atomic_fetch_sub(&s->live, 1);
    return FL_ERR(FL_EINTERNAL, "grpc_server_request_call: %s", grpc_call_error_to_string(err));
  }
  return FL_OK;
}

/* Starts the call's one send batch: the reply, or the status alone when status != FL_OK.
 * Called by the thread that holds the call (see the design note). */
static void rpc_server_reply(rpc_server_call *c, fl_status status, const char *message,
                             const fl_buf *reply) {
  grpc_op ops[3];
  memset(ops, 0, sizeof ops);
  size_t n = 0;
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (status == FL_OK) {
    grpc_slice slice = reply->len ? grpc_slice_from_copied_buffer((const char *)reply->data, reply->len)
                                  : grpc_empty_slice();
    c->reply_bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->reply_bb;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = rpc_grpc_code(status);
  if (status != FL_OK) {
    c->status_details = grpc_slice_from_copied_string(message && *message ? message : fl_strerror(status));
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    snprintf(c->status_text, sizeof c->status_text, "%d", (int)status);
    c->status_md.key = grpc_slice_from_static_string(RPC_STATUS_KEY);
    c->status_md.value = grpc_slice_from_static_string(c->status_text);
    ops[n].data.send_status_from_server.trailing_metadata_count = 1;
    ops[n].data.send_status_from_server.trailing_metadata = &c->status_md;
  }
  n++;
  atomic_fetch_add(&c->refs, 1);
  grpc_call_error err = grpc_call_start_batch(c->call, ops, n, rpc_tag(c, RPC_OP_SEND), NULL);
  if (err != GRPC_CALL_OK) {
    /* Only a bug of ours gets here; the client then sees its deadline or the cancel. */
    common_log(LOG_ERROR, "rpc: %s: cannot start the reply: %s", c->method,
               grpc_call_error_to_string(err));
    grpc_call_cancel(c->call, NULL);
    atomic_fetch_sub(&c->refs, 1);
  }
}

/* Starts a receive-only batch of one op. Returns false (and takes no reference) on failure. */
static bool rpc_server_start_recv(rpc_server_call *c, grpc_op *op, enum rpc_op kind) {
  atomic_fetch_add(&c->refs, 1);
  grpc_call_error err = grpc_call_start_batch(c->call, op, 1, rpc_tag(c, kind), NULL);
  if (err == GRPC_CALL_OK) return true;
  atomic_fetch_sub(&c->refs, 1);
  common_log(LOG_ERROR, "rpc: %s: cannot start a receive: %s", c->method,
             grpc_call_error_to_string(err));
  return false;
}

/* A copy of text from the network that is safe to log: printable ASCII, at most len - 1
 * bytes, so that a peer cannot forge or break log lines. */
static const char *rpc_printable(const char *text, char *buf, size_t len) {
  size_t n = 0;
  for (; text && text[n] && n + 1 < len; n++)
    buf[n] = text[n] >= 0x20 && text[n] <= 0x7e ? text[n] : '?';
  buf[n] = '\0';
  return buf;
}

/* Why the call's metadata does not carry the server's secret, or NULL when it does. */
static const char *rpc_server_auth_failure(const rpc_server *s, const grpc_metadata_array *md) {
  if (!s->secret) return NULL;
  for (size_t i = 0; i < md->count; i++)
    if (grpc_slice_str_cmp(md->metadata[i].key, RPC_SECRET_KEY) == 0)
      return rpc_secret_equal(s->secret, s->secret_len, md->metadata[i].value)
                 ? NULL
                 : "wrong shared secret";
  return "missing shared secret";
}

/* A new call (the queue's thread). */
static void rpc_server_on_new(rpc_server_call *c, bool ok) {
  rpc_server *s = c->server;
  if (!ok) {
    /* The server is shutting down: the slot was never filled. */
    rpc_server_call_unref(c);
    return;
  }
  size_t method_len = GRPC_SLICE_LENGTH(c->details.method);
  c->method = common_malloc(method_len + 1);
  if (c->method) {
    memcpy(c->method, GRPC_SLICE_START_PTR(c->details.method), method_len);
    c->method[method_len] = '\0';
  }
  c->peer = grpc_call_get_peer(c->call);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (!c->method || !rpc_server_start_recv(c, &op, RPC_OP_CLOSE)) {
    grpc_call_cancel_with_status(c->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "server cannot take the call", NULL);
    rpc_server_call_unref(c);
    return;
  }
  const char *auth = rpc_server_auth_failure(s, &c->request_md);
  if (auth) {
    char method[128], peer[128];
    common_log(LOG_WARN, "rpc: refused %s from %s: authentication failed: %s",
               rpc_printable(c->method, method, sizeof method),
               rpc_printable(c->peer ? c->peer : "unknown peer", peer, sizeof peer), auth);
    char message[64];
    snprintf(message, sizeof message, "authentication failed: %s", auth);
    rpc_server_reply(c, FL_EAUTH, message, NULL);
  } else {
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->request_bb;
    if (!rpc_server_start_recv(c, &op, RPC_OP_RECV))
      rpc_server_reply(c, FL_EINTERNAL, "server cannot read the request", NULL);
  }
  rpc_server_call_unref(c); /* the NEW event's reference */
}

/* Flattens the request into c->body (which copies when gRPC received it in pieces). */
static bool rpc_server_read_body(rpc_server_call *c) {
  grpc_byte_buffer_reader reader;
  if (!c->request_bb || !grpc_byte_buffer_reader_init(&reader, c->request_bb)) return false;
  c->body = grpc_byte_buffer_reader_readall(&reader);
  grpc_byte_buffer_reader_destroy(&reader);
  grpc_byte_buffer_destroy(c->request_bb);
  c->request_bb = NULL;
  return true;
}

static rpc_request rpc_server_request(rpc_server_call *c) {
  return (rpc_request){
      .method = c->method,
      .body = fl_bytes_of(GRPC_SLICE_START_PTR(c->body), GRPC_SLICE_LENGTH(c->body)),
      .peer = c->peer ? c->peer : "unknown peer",
      .cancelled = &c->cancelled,
      .call_ = c,
  };
}

/* Replies with a handler's outcome, checked: a status the client knows, a reply within the
 * limit. Frees the response. */
static void rpc_server_finish(rpc_server *s, rpc_server_call *c, fl_status status, fl_buf *response) {
  if (!rpc_status_known((int)status))
    status = FL_ERR(FL_EINTERNAL, "the handler of %s returned unknown status %d", c->method, (int)status);
  else if (status == FL_OK && response->len > s->max_message)
    status = FL_ERR(FL_EPROTO, "the reply of %zu bytes is over the limit of %zu bytes", response->len,
                    s->max_message);
  rpc_server_reply(c, status, status == FL_OK ? NULL : fl_last_error(), response);
  fl_buf_free(response);
}

/* The quick handler's go at a call (the queue's thread): true when it was answered. */
static bool rpc_server_try_quick(rpc_server *s, rpc_server_call *c) {
  if (!s->quick || atomic_load(&s->stopping)) return false;
  bool listed = false;
  for (const char *const *m = s->quick_methods; m && *m && !listed; m++) listed = strcmp(*m, c->method) == 0;
  if (!listed || grpc_byte_buffer_length(c->request_bb) > s->quick_max_request || !rpc_server_read_body(c))
    return false;
  rpc_request req = rpc_server_request(c);
  fl_buf response = FL_BUF_INIT;
  fl_status status = FL_OK;
  common_error_clear();
  if (!s->quick(s->handler_arg, &req, &response, &status)) {
    FL_ASSERT(!c->deferred); /* a declined call is the handler's */
    fl_buf_free(&response);
    return false;
  }
  if (c->deferred) {
    fl_buf_free(&response);
    return true;
  }
  rpc_server_finish(s, c, status, &response);
  COMMON_TRACE("rpc.replied", c->method);
  return true;
}

/* The request has arrived, or the call failed before it did (the queue's thread). */
static void rpc_server_on_recv(rpc_server_call *c, bool ok) {
  COMMON_TRACE("rpc.recv", c->method);
  if (ok && c->request_bb) {
    if (!rpc_server_try_quick(c->server, c)) {
      atomic_fetch_add(&c->refs, 1); /* the handler's */
      common_queue_push(&c->server->queue, &c->node);
    }
  } else if (!atomic_load(&c->cancelled)) {
    /* A client that closed without a message (gRPC itself cancels oversized requests). */
    rpc_server_reply(c, FL_EPROTO, "the call carried no request message", NULL);
  }
  rpc_server_call_unref(c);
}

static void rpc_server_event(void *tag, bool ok) {
  uintptr_t op = (uintptr_t)tag & 7;
  rpc_server_call *c = (rpc_server_call *)((char *)tag - op);
  switch ((enum rpc_op)op) {
  case RPC_OP_NEW:
    rpc_server_on_new(c, ok);
    break;
  case RPC_OP_RECV:
    rpc_server_on_recv(c, ok);
    break;
  case RPC_OP_CLOSE:
    if (!ok || c->close_cancelled) atomic_store(&c->cancelled, true);
    rpc_server_call_unref(c);
    break;
  case RPC_OP_SEND:
    rpc_server_call_unref(c);
    break;
  default:
    FL_ASSERT(!"unknown rpc completion tag");
  }
}

/* Runs until the queue is shut down, which happens once the server's shutdown has been
 * notified and the last call is gone. */
static void rpc_server_cq_loop(rpc_server *s) {
  bool shutdown_seen = false, cq_shut = false;
  for (;;) {
    gpr_timespec deadline =
        shutdown_seen ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                     gpr_time_from_millis(RPC_STOP_POLL_MS, GPR_TIMESPAN))
                      : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    if (ev.type == GRPC_OP_COMPLETE) {
      if (ev.tag == &s->shutdown_tag)
        shutdown_seen = true;
      else
        rpc_server_event(ev.tag, ev.success != 0);
    }
    if (shutdown_seen && !cq_shut && atomic_load(&s->live) == 0) {
      grpc_completion_queue_shutdown(s->cq);
      cq_shut = true;
    }
  }
}

static void *rpc_server_cq_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-rpc-cq");
  rpc_server_cq_loop(arg);
  return NULL;
}

/* One call on a handler thread. */
static void rpc_server_handle(rpc_server *s, rpc_server_call *c) {
  fl_buf response = FL_BUF_INIT;
  fl_status status = FL_OK;
  /* A stopping server runs no new handler, even for a call whose cancellation (which
   * rpc_server_stop has started) the queue's thread has not seen yet. The body is flattened
   * here, off the queue's thread, unless the quick handler had it first. */
  if (atomic_load(&c->cancelled) || atomic_load(&s->stopping)) {
    status = FL_ERR(FL_ECANCELLED, "cancelled before a handler was free");
  } else if (c->request_bb && !rpc_server_read_body(c)) {
    status = FL_ERR(FL_EPROTO, "the request cannot be decoded");
  } else {
    rpc_request req = rpc_server_request(c);
    common_error_clear();
    COMMON_TRACE("rpc.handle", c->method);
    status = s->handler(s->handler_arg, &req, &response);
  }
  if (c->deferred) {
    fl_buf_free(&response);
  } else {
    rpc_server_finish(s, c, status, &response);
    COMMON_TRACE("rpc.replied", c->method);
  }
  rpc_server_call_unref(c); /* the handler's reference */
}

rpc_deferred *rpc_defer(const rpc_request *req) {
  rpc_server_call *c = req->call_;
  FL_ASSERT(c && !c->deferred);
  c->deferred = true;
  atomic_fetch_add(&c->refs, 1); /* the owner's, until the reply */
  return (rpc_deferred *)c;
}

const atomic_bool *rpc_deferred_cancelled(const rpc_deferred *d) { return &((const rpc_server_call *)d)->cancelled; }

void rpc_deferred_reply(rpc_deferred *d, fl_status status, const char *message, fl_buf *response) {
  rpc_server_call *c = (rpc_server_call *)d;
  fl_buf none = FL_BUF_INIT;
  if (!response) response = &none;
  if (status != FL_OK) fl_set_error(status, "%s", message && *message ? message : fl_strerror(status));
  rpc_server_finish(c->server, c, status, response);
  COMMON_TRACE("rpc.replied", c->method);
  rpc_server_call_unref(c);
}

static void *rpc_server_handler_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-rpc-handler");
  rpc_server *s = arg;
  uint64_t spin = fl_spin_ns();
  common_qnode *node;
  while ((node = common_queue_pop(&s->queue, spin)))
    rpc_server_handle(s, (rpc_server_call *)node);
  return NULL;
}

int rpc_server_port(const rpc_server *s) { return s ? s->port : 0; }

void rpc_server_stop(rpc_server *s) {
  if (!s) return;
  atomic_store(&s->stopping, true);
  if (s->grpc_started) {
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
    grpc_server_cancel_all_calls(s->server);
    /* The handlers keep running meanwhile: the calls they hold must finish for the loop to end. */
    if (s->cq_thread_started)
      FL_PCHECK(pthread_join(s->cq_thread, NULL));
    else
      rpc_server_cq_loop(s);
  } else if (s->cq) {
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
  }
  if (s->queue_ready) common_queue_close(&s->queue);
  for (uint32_t i = 0; i < s->handlers_started; i++) FL_PCHECK(pthread_join(s->handlers[i], NULL));
  if (s->server) grpc_server_destroy(s->server);
  if (s->cq) grpc_completion_queue_destroy(s->cq);
  if (s->queue_ready) common_queue_destroy(&s->queue);
  common_free(s->handlers);
  common_free(s->secret);
  common_free(s);
  grpc_shutdown();
}

fl_status rpc_server_start(const rpc_server_config *cfg, rpc_server **out) {
  fl_status status = FL_OK;
  rpc_server *s = NULL;
  grpc_server_credentials *creds = NULL;
  if (!cfg || !out) return FL_ERR(FL_EINVAL, "rpc_server_start: cfg and out must not be NULL");
  if (!cfg->listen || !*cfg->listen)
    return FL_ERR(FL_EINVAL, "rpc_server_start: no address to listen on (HOST:PORT)");
  if (!cfg->handler) return FL_ERR(FL_EINVAL, "rpc_server_start: no handler");
  if (cfg->handler_threads > RPC_MAX_HANDLER_THREADS)
    return FL_ERR(FL_EINVAL, "rpc_server_start: %u handler threads (at most %d)",
                  cfg->handler_threads, RPC_MAX_HANDLER_THREADS);
  if (cfg->max_message > INT32_MAX)
    return FL_ERR(FL_EINVAL, "rpc_server_start: max_message %zu is over gRPC's limit of 2 GiB",
                  cfg->max_message);
  if (cfg->secret && (status = rpc_check_secret(cfg->secret)) != FL_OK) return status;
  /* Read before anything is made, so that a bad setting fails here and not at a handshake. */
  net_tls tls;
  if ((status = net_tls_read(NET_TLS_SERVER, &tls)) != FL_OK) {
    net_tls_free(&tls);
    return status;
  }

  grpc_init(); /* balanced by the grpc_shutdown in rpc_server_stop, which cleanup calls */
  s = common_calloc(1, sizeof *s);
  if (!s) {
    grpc_shutdown();
    net_tls_free(&tls);
    return FL_ERR(FL_ENOMEM, "cannot allocate an rpc server");
  }
  s->handler = cfg->handler;
  s->quick = cfg->quick;
  s->quick_methods = cfg->quick_methods;
  s->quick_max_request = cfg->quick_max_request ? cfg->quick_max_request : RPC_QUICK_MAX_REQUEST;
  s->handler_arg = cfg->handler_arg;
  s->max_message = cfg->max_message ? cfg->max_message : RPC_DEFAULT_MAX_MESSAGE;
  uint32_t threads = cfg->handler_threads ? cfg->handler_threads : RPC_DEFAULT_HANDLER_THREADS;
  /* Twice the handlers: a call can be read while the one before it is handled. */
  s->slots = 2 * threads;
  atomic_init(&s->stopping, false);
  atomic_init(&s->live, 0);
  if (cfg->secret && *cfg->secret) {
    s->secret = common_strdup(cfg->secret);
    if (!s->secret) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the secret"));
    s->secret_len = strlen(s->secret);
  }
  s->handlers = common_calloc(threads, sizeof *s->handlers);
  if (!s->handlers) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot allocate %u handler threads", threads));

  FL_PCHECK(pthread_once(&rpc_env_once, rpc_env_read));
  int idle_ms = rpc_limit_arg(cfg->idle_timeout_ms, rpc_env.idle_timeout_ms);
  int handshake_ms = rpc_limit_arg(cfg->handshake_timeout_ms, rpc_env.handshake_timeout_ms);
  int max_connections = rpc_limit_arg(cfg->max_connections, rpc_env.max_connections);
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = (int)s->max_message}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = (int)s->max_message}},
      /* Two servers on one port would split the calls between them. */
      {GRPC_ARG_INTEGER, GRPC_ARG_ALLOW_REUSEPORT, {.integer = 0}},
      /* Accept the clients' keepalive pings (every 30 s during a call, see the channel). */
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, {.integer = 10000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
      /* A window that takes a job's launch or results (hundreds of KiB) in one flight:
       * gRPC's default of 64 KiB made such a message wait out several window updates. */
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, {.integer = RPC_STREAM_WINDOW}},
      /* Connection limits (rpc_server_config). gRPC counts a connection idle only while no
       * call is in progress on it, so no call, however long it runs or waits, is cut. */
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_CONNECTION_IDLE_MS, {.integer = idle_ms}},
      {GRPC_ARG_INTEGER, GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, {.integer = handshake_ms}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = RPC_SERVER_KEEPALIVE_MS}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = RPC_SERVER_KEEPALIVE_TIMEOUT_MS}},
      /* gRPC stops its pings after 2 that no data followed; a call waiting for a job sends
       * no data for minutes, and its client must still be watched. */
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
#ifdef GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS, {.integer = max_connections}},
#endif
  };
#ifndef GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS
  /* This gRPC cannot cap connections (its C core accepts every one; the cap came with
   * GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS in later versions). Idle and handshake
   * timeouts and keepalive bound how long each is held. */
  if (cfg->max_connections > 0 || (cfg->max_connections == 0 && rpc_env.max_connections_set &&
                                   rpc_env.max_connections != RPC_UNLIMITED))
    common_log(LOG_WARN, "rpc: a cap of %d connections was asked for (FLINT_RPC_MAX_CONNECTIONS), "
               "but gRPC %s cannot enforce one: ignored", max_connections, grpc_version_string());
#endif
  grpc_channel_args channel_args = {sizeof args / sizeof args[0], args};
  s->server = grpc_server_create(&channel_args, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  if (!s->server || !s->cq) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot create a gRPC server"));
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  if (tls.on) {
    /* No client certificate: the shared secret, inside TLS now, authenticates clients. gRPC
     * copies the PEM text. */
    grpc_ssl_pem_key_cert_pair pair = {tls.key_pem, tls.cert_pem};
    creds = grpc_ssl_server_credentials_create_ex(NULL, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
                                                  NULL);
    if (!creds)
      FL_CHECK(FL_ERR(FL_EINVAL, "gRPC cannot use FLINT_TLS_CERT=%s with FLINT_TLS_KEY=%s",
                      config_string(CONFIG_TLS_CERT), config_string(CONFIG_TLS_KEY)));
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  s->port = grpc_server_add_http2_port(s->server, cfg->listen, creds);
  if (s->port <= 0)
    FL_CHECK(FL_ERR(FL_ENET, "cannot listen on %s (address in use, not local, or malformed)",
                    cfg->listen));
  if (tls.on)
    common_log(LOG_INFO, "rpc: the server on %s (port %d) speaks TLS with FLINT_TLS_CERT=%s", cfg->listen,
               s->port, config_string(CONFIG_TLS_CERT));
  grpc_server_start(s->server);
  s->grpc_started = true;

  common_queue_init(&s->queue);
  s->queue_ready = true;
  for (; s->handlers_started < threads; s->handlers_started++)
    if (pthread_create(&s->handlers[s->handlers_started], NULL, rpc_server_handler_main, s) != 0)
      FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start rpc handler thread %u", s->handlers_started));
  if (pthread_create(&s->cq_thread, NULL, rpc_server_cq_main, s) != 0)
    FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the rpc server's thread"));
  s->cq_thread_started = true;
  for (uint32_t i = 0; i < s->slots; i++) FL_CHECK(rpc_server_post(s));
  *out = s;
  s = NULL;

cleanup:
  if (creds) grpc_server_credentials_release(creds);
  net_tls_free(&tls);
  rpc_server_stop(s); /* NULL on success */
  return status;
}
