/*
 * net.h: the network layer. rpc (net/rpc.c): unary calls over gRPC C core for the control
 * plane. dataplane (net/dataplane.c): block transfer over libevent.
 */
#ifndef FLINT_NET_H
#define FLINT_NET_H

#include "common/common.h"

/* ---- rpc ---- */
/*
 * Unary calls (one request, one reply, both opaque bytes) between the driver and executor
 * processes, over gRPC's HTTP/2 on plain TCP. A server runs one handler function for every
 * method; the handler dispatches on the method's name. The bytes are protobuf-c messages to
 * the callers and nothing to this layer.
 *
 * Errors cross the wire exactly: the status a handler returns and its thread's message
 * come back from rpc_call as the same status and "METHOD on TARGET: message". Failures of
 * the network itself are FL_ENET (peer unreachable, connection lost), FL_ETIMEDOUT (the
 * call's deadline passed), FL_EAUTH (the server refused the shared secret) and FL_EPROTO
 * (a message over the size limit, or a peer that does not speak flint).
 *
 * Authentication is a shared secret that every call carries as metadata. It keeps stray
 * and misconfigured clients out; it is not encryption (the secret crosses the wire in clear
 * text, so the network itself must be trusted).
 */

typedef struct rpc_server rpc_server;
typedef struct rpc_channel rpc_channel;

/* One call as the handler sees it. Every pointer is valid until the handler returns. */
typedef struct rpc_request {
  const char *method;           /* "/flint.Driver/RegisterExecutor" */
  fl_bytes body;                /* the request's bytes */
  const char *peer;             /* gRPC's name of the client ("ipv4:10.0.0.5:41234"), for logs */
  const atomic_bool *cancelled; /* becomes true when the client cancels, its deadline passes,
                                   the connection drops or the server stops */
} rpc_request;

/* Handles one call: writes the reply into *response (given empty) and returns FL_OK, or
 * returns a failure status with the thread's message set (FL_ERR, fl_set_error), which the
 * client receives as the same status and message; the response is then dropped. Runs on one
 * of the server's handler threads, several calls at once, and may block for a long time
 * (while a job runs), but should return soon after *req->cancelled becomes true: nobody
 * waits for the reply any more, and rpc_server_stop waits for the handler. */
typedef fl_status (*rpc_handler_fn)(void *arg, const rpc_request *req, fl_buf *response);

typedef struct rpc_server_config {
  const char *listen;       /* "HOST:PORT" to listen on ("0.0.0.0:7077"); port 0 picks one */
  const char *secret;       /* shared secret every call must carry; NULL or "": none.
                               Printable ASCII. */
  size_t max_message;       /* largest request or reply in bytes; 0: 64 MiB */
  uint32_t handler_threads; /* calls handled at once; 0: 8. Further calls wait their turn. */
  rpc_handler_fn handler;   /* runs every call, whatever its method */
  void *handler_arg;        /* passed to handler */
} rpc_server_config;
#define RPC_SERVER_CONFIG_INIT {NULL, NULL, 0, 0, NULL, NULL}
#define RPC_DEFAULT_MAX_MESSAGE ((size_t)64 << 20)

/* Binds cfg->listen, starts the server's threads (one that owns gRPC's completion queue and
 * cfg->handler_threads that run the handler) and serves until rpc_server_stop. The config
 * is copied (strings included). Returns FL_OK and the server in *out; FL_EINVAL for a bad
 * config, FL_ENET when the address cannot be bound (in use, not local), FL_ENOMEM.
 * Blocks only while it binds. */
FL_INTERNAL fl_status rpc_server_start(const rpc_server_config *cfg, rpc_server **out);

/* The TCP port the server listens on (the one picked when cfg->listen asked for port 0). */
FL_INTERNAL int rpc_server_port(const rpc_server *s);

/* Stops accepting calls, cancels those in flight (their clients get FL_ENET, their running
 * handlers see *cancelled, and calls still waiting for a handler thread never run), waits
 * for every handler to return, then frees the server.
 * Blocks until all of that is done, so a handler that ignores *cancelled blocks it too.
 * Must not be called from a handler. NULL does nothing. */
FL_INTERNAL void rpc_server_stop(rpc_server *s);

/* A channel to the server at `target` ("HOST:PORT"), over which any number of threads may
 * make calls at once. The connection is made on the first call and made again after it
 * drops (with a backoff of 0.2 s growing to 5 s; calls during the backoff fail with
 * FL_ENET at once). `secret`: sent with every call; NULL or "": none. `max_message`:
 * largest request or reply in bytes, 0: 64 MiB. Strings are copied. Returns FL_OK and the
 * channel in *out, FL_EINVAL or FL_ENOMEM. Does not block (nothing is connected yet). */
FL_INTERNAL fl_status rpc_channel_create(const char *target, const char *secret,
                                         size_t max_message, rpc_channel **out);

/* Closes the connection and frees the channel. No call may be in flight on it. NULL does
 * nothing. */
FL_INTERNAL void rpc_channel_destroy(rpc_channel *c);

/* Calls `method` ("/flint.Driver/RegisterExecutor") with `request` and waits for the reply.
 * timeout_ms > 0: the call's deadline (the server's handler sees *cancelled when it passes);
 * <= 0: none, the call waits as long as the handler runs. Thread-safe; blocks the calling
 * thread only. Returns FL_OK with the reply's bytes replacing the contents of *response
 * (the caller frees it with fl_buf_free), or, leaving *response untouched:
 * - the handler's status, message "METHOD on TARGET: <handler's message>";
 * - FL_ENET "cannot reach TARGET ..." when the server is unreachable, the connection drops
 *   or the server stops during the call;
 * - FL_ETIMEDOUT when the deadline passes;
 * - FL_EAUTH when the server refuses the secret (missing or wrong);
 * - FL_EPROTO when the request or the reply is over a size limit (either side's), or the
 *   peer answers in a way no flint server does;
 * - FL_EINVAL for a method that does not start with '/', FL_ENOMEM. */
FL_INTERNAL fl_status rpc_call(rpc_channel *c, const char *method, fl_bytes request,
                               int64_t timeout_ms, fl_buf *response);
/* ---- rpc ---- */

#endif /* FLINT_NET_H */
