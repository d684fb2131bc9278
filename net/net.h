/*
 * net.h: the network layer. rpc (net/rpc.c: server, net/rpc_client.c: client): unary calls
 * over gRPC C core for the control plane. dataplane (net/dataplane.c: block server,
 * net/dataplane_client.c: fetch client, net/dataplane_frame.c: frames): block transfer over
 * libevent.
 */
#ifndef FLINT_NET_H
#define FLINT_NET_H

#include "common/common.h"

/* ---- rpc ---- */
/*
 * Unary calls (one request, one reply, both opaque bytes) between the driver and executor
 * processes, over gRPC's HTTP/2 on TCP, inside TLS when FLINT_TLS is on. A server runs one
 * handler function for every method; the handler dispatches on the method's name. The bytes
 * are protobuf-c messages to the callers and nothing to this layer.
 *
 * Errors cross the wire exactly: the status a handler returns and its thread's message
 * come back from rpc_call as the same status and "METHOD on TARGET: message". Failures of
 * the network itself are FL_ENET (peer unreachable, connection lost), FL_ETIMEDOUT (the
 * call's deadline passed), FL_EAUTH (the server refused the shared secret, or the client
 * the server's certificate) and FL_EPROTO (a message over the size limit, or a peer that
 * does not speak flint).
 *
 * Authentication is a shared secret that every call carries as metadata. It keeps stray
 * and misconfigured clients out; it is not encryption. With FLINT_TLS on (net/tls.h), every
 * server and channel of the process uses TLS: the server presents FLINT_TLS_CERT, the
 * channel checks it against FLINT_TLS_CA and for the host dialled (or FLINT_TLS_SERVER_NAME),
 * and the secret, now encrypted, authenticates the client (no client certificate is asked
 * for). Without TLS the secret crosses the wire in clear text, so the network itself must
 * be trusted. Both ends must agree: a client and a server of which only one uses TLS cannot
 * talk, and the client's error says which side does.
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
  struct rpc_server_call *call_; /* the server's, for rpc_defer */
} rpc_request;

/* Handles one call: writes the reply into *response (given empty) and returns FL_OK, or
 * returns a failure status with the thread's message set (FL_ERR, fl_set_error), which the
 * client receives as the same status and message; the response is then dropped. Runs on one
 * of the server's handler threads, several calls at once, and may block for a long time
 * (while a job runs), but should return soon after *req->cancelled becomes true: nobody
 * waits for the reply any more, and rpc_server_stop waits for the handler. */
typedef fl_status (*rpc_handler_fn)(void *arg, const rpc_request *req, fl_buf *response);

/* Optional: offered the calls of the methods in quick_methods first, on the server's one
 * completion-queue thread, before a handler thread takes them. Returns true when it answered
 * the call (*status and *response as a handler's), false to leave it to the handler threads
 * (having changed nothing that a handler's replay would not make right). It must never block
 * (no calls, no waits beyond short locks): while it runs, the server takes no other call. For
 * the calls on every job's path that only decode and enqueue. */
typedef bool (*rpc_quick_fn)(void *arg, const rpc_request *req, fl_buf *response, fl_status *status);

/* A call answered later, by whichever thread has the answer (a job's end on the scheduler
 * thread), so that no thread waits for it. A handler or quick handler calls rpc_defer(req)
 * and returns (its status and response are then dropped; a quick handler returns true);
 * the call stays open until rpc_deferred_reply, which must come exactly once, also after
 * *rpc_deferred_cancelled() turns true (then nobody reads it, but rpc_server_stop waits for
 * it). req->body and req->method stay valid until the reply. */
typedef struct rpc_deferred rpc_deferred;
FL_INTERNAL rpc_deferred *rpc_defer(const rpc_request *req);
FL_INTERNAL const atomic_bool *rpc_deferred_cancelled(const rpc_deferred *d);
/* Replies as a handler returning `status` (with `message` for a failure) and *response
 * would; frees the response. Any thread; never blocks on the client. */
FL_INTERNAL void rpc_deferred_reply(rpc_deferred *d, fl_status status, const char *message, fl_buf *response);

typedef struct rpc_server_config {
  const char *listen;       /* "HOST:PORT" to listen on ("0.0.0.0:7077"); port 0 picks one */
  const char *secret;       /* shared secret every call must carry; NULL or "": none.
                               Printable ASCII. */
  size_t max_message;       /* largest request or reply in bytes; 0: 64 MiB */
  uint32_t handler_threads; /* calls handled at once; 0: 8. Further calls wait their turn. */
  rpc_handler_fn handler;   /* runs every call, whatever its method */
  void *handler_arg;        /* passed to handler */
  rpc_quick_fn quick;       /* optional, see rpc_quick_fn; gets handler_arg too */
  const char *const *quick_methods; /* the methods offered to quick ("/flint.Executor/LaunchTasks"),
                                       NULL-terminated; the array must outlive the server */
  size_t quick_max_request; /* requests of more bytes go to the handler threads unoffered
                               (decoding them would hold up every call); 0: RPC_QUICK_MAX_REQUEST */
  /* Limits on connections, so that stalled or hostile clients cannot hold them for ever. In
   * each, 0 means the setting named below (common/config.h, with its default; read once per
   * process; 0 there turns the limit off); RPC_UNLIMITED means none. */
  int64_t idle_timeout_ms;      /* a connection with no call in progress for this long is
                                   closed (HTTP/2 GOAWAY; a channel reconnects on its next call).
                                   Calls of any length, waiting ones included, keep it open.
                                   FLINT_RPC_IDLE_TIMEOUT_MS */
  int64_t handshake_timeout_ms; /* a connection must have begun HTTP/2 (the client's preface
                                   and settings) within this long of the accept.
                                   FLINT_RPC_HANDSHAKE_TIMEOUT_MS */
  int64_t max_connections;      /* connections at once, further ones refused at accept: only
                                   where gRPC supports it (GRPC_ARG_MAX_ALLOWED_INCOMING_CONNECTIONS,
                                   which gRPC 1.51 lacks; there it is ignored with a warning
                                   when asked for). FLINT_RPC_MAX_CONNECTIONS */
} rpc_server_config;
#define RPC_SERVER_CONFIG_INIT {NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0, 0, 0}
#define RPC_UNLIMITED ((int64_t)-1)
#define RPC_QUICK_MAX_REQUEST ((size_t)256 << 10)
#define RPC_DEFAULT_MAX_MESSAGE ((size_t)64 << 20)

/* Binds cfg->listen, starts the server's threads (one that owns gRPC's completion queue and
 * cfg->handler_threads that run the handler) and serves until rpc_server_stop. The config
 * is copied (strings included). Reads the TLS settings (net/tls.h) and, when on, serves
 * only TLS (logged once at info). Returns FL_OK and the server in *out; FL_EINVAL for a bad
 * config or TLS settings that cannot serve (the message names the setting and file),
 * FL_ENET when the address cannot be bound (in use, not local), FL_ENOMEM.
 * Blocks only while it binds and reads the certificate files. */
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
 * largest request or reply in bytes, 0: 64 MiB. Strings are copied. Reads the TLS settings
 * (net/tls.h): when on, the channel speaks only TLS and accepts only a server certificate
 * that chains to FLINT_TLS_CA and holds the host of `target` (or FLINT_TLS_SERVER_NAME).
 * Returns FL_OK and the channel in *out, FL_EINVAL (bad arguments, or TLS settings that
 * cannot serve, named with their file) or FL_ENOMEM. Does not block on the network (nothing
 * is connected yet), only while it reads the CA file. */
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
 *   or the server stops during the call, or only one side uses TLS (the message says which;
 *   a channel without TLS whose connection was closed in its handshake then spends up to
 *   2 s asking the server whether it speaks TLS);
 * - FL_ETIMEDOUT when the deadline passes;
 * - FL_EAUTH when the server refuses the secret (missing or wrong), or the channel refuses
 *   the server's certificate ("TLS handshake failed: the server's certificate was not
 *   trusted ..." or "... is not for NAME ...");
 * - FL_EPROTO when the request or the reply is over a size limit (either side's), or the
 *   peer answers in a way no flint server does;
 * - FL_EINVAL for a method that does not start with '/', FL_ENOMEM. */
FL_INTERNAL fl_status rpc_call(rpc_channel *c, const char *method, fl_bytes request,
                               int64_t timeout_ms, fl_buf *response);
/* rpc_call in two halves, for a thread that must not wait for the reply but may send the
 * request (the scheduler thread starting a launch, which its executor's sender thread then
 * waits for): begin sends it and returns at once; end waits for the reply and returns as
 * rpc_call would (response NULL: only the outcome), and frees the call. Every begun call
 * must be ended exactly once; method must stay alive until then. */
typedef struct rpc_pending rpc_pending;
FL_INTERNAL fl_status rpc_call_begin(rpc_channel *c, const char *method, fl_bytes request, int64_t timeout_ms,
                                     rpc_pending **out);
FL_INTERNAL fl_status rpc_call_end(rpc_pending *p, fl_buf *response);
/* rpc_call_end for a waiter that may have to give up (its process stopping while the peer
 * does not answer): once *abandon is true (looked at every RPC_ABANDON_POLL_MS, so at most
 * that long after it is set, even when set before the call), the call is cancelled and,
 * unless its reply came first, ends with FL_ECANCELLED "METHOD on TARGET: given up without a
 * reply". abandon NULL: rpc_call_end. */
#define RPC_ABANDON_POLL_MS 50
FL_INTERNAL fl_status rpc_call_end_unless(rpc_pending *p, const atomic_bool *abandon, fl_buf *response);
/* ---- rpc ---- */

/* ---- dataplane ---- */
/*
 * The data plane moves bytes between processes: every executor (and the driver, and a client
 * once it broadcasts) runs a block server, and task threads fetch shuffle blocks, cached blocks, broadcast values, libraries
 * and results from peers through a client. Both sides run one libevent loop thread that owns
 * every socket; the server runs serve callbacks on a few worker threads, and dp_fetch blocks
 * its calling thread while the client's loop does the I/O. See net/dataplane.c (server) and
 * net/dataplane_client.c (client) for the design and threading notes.
 *
 * Wire format (all integers little-endian). Every frame is a 32-byte header and a payload:
 *   0 u32 magic DP_FRAME_MAGIC    4 u8 version DP_FRAME_VERSION   5 u8 type (dp_frame_type)
 *   6 u16 status (responses: an fl_status, 0 = success; 0 otherwise)
 *   8 u64 payload length         16 u64 total (responses: the object's whole length)
 *  24 u32 CRC32C of the payload  28 u32 CRC32C of header bytes 0..27
 * A hello's payload is the shared secret (at most DP_SECRET_MAX bytes). A request's payload is
 * DP_REQUEST_WIRE_SIZE bytes: u8 kind, 7 zero bytes, u64 key[4], u64 offset, u64 len,
 * u64 max_len (the largest payload the client accepts). A response's payload is the bytes
 * asked for (status 0) or the error message (status != 0, at most DP_MESSAGE_MAX bytes). A
 * successful response has CRC field 0 and a 4-byte trailer after its payload: the payload's
 * CRC32C, so that the server can send a large payload while it is still checksumming it.
 *
 * TLS (FLINT_TLS and its files, net/tls.h): read when a server starts or a client is made;
 * when on, every connection is TLS (1.2 or later) from its first byte and the frames above
 * travel inside it unchanged, the hello's secret included (TLS authenticates the server, the
 * secret the client). A client checks the server's certificate against FLINT_TLS_CA for the
 * host it dialled, or FLINT_TLS_SERVER_NAME. Both ends must agree: a TLS client fails its
 * fetch against a plaintext server, and a TLS server answers a plaintext client with an
 * FL_EPROTO response; both messages say that TLS may be on at one end only.
 */
#define DP_FRAME_MAGIC 0x50444c46u /* "FLDP" in memory */
#define DP_FRAME_VERSION 1
#define DP_FRAME_HEADER_SIZE 32
#define DP_REQUEST_WIRE_SIZE 64
#define DP_SECRET_MAX 256
#define DP_MESSAGE_MAX 1000
/* The largest response payload a client accepts unless told otherwise (dp_client_set_max_payload). */
#define DP_MAX_PAYLOAD_DEFAULT ((uint64_t)256 << 20)
/* Connections a client keeps open to one peer at most; more fetches wait for a free one. */
#define DP_CONNECTIONS_PER_PEER 8
/* Room for a block server's "HOST:PORT" as flint passes it around, terminating zero included. */
#define DP_ADDRESS_MAX 64
/* dp_fetch's timeout when it is given one <= 0. */
#define DP_TIMEOUT_DEFAULT_MS 30000

typedef enum dp_frame_type { DP_FRAME_HELLO = 1, DP_FRAME_REQUEST = 2, DP_FRAME_RESPONSE = 3 } dp_frame_type;

/* What a request asks for. The data plane only checks the range; the server's serve callback
 * gives each kind (and its key) a meaning. */
typedef enum dp_kind {
  DP_SHUFFLE = 1, /* key: app, shuffle, map, reduce */
  DP_BLOCK,       /* a cached block: key: app, rdd, partition */
  DP_BROADCAST,   /* key: app, broadcast id */
  DP_LIBRARY,     /* a job library by content: key: the first 32 bytes of its digest */
  DP_RESULT,      /* a task's result kept on its executor: key: app, job, task */
} dp_kind;
#define DP_KIND_LAST DP_RESULT

typedef struct dp_request {
  uint8_t kind;         /* a dp_kind */
  uint64_t key[4];      /* kind-specific */
  uint64_t offset, len; /* the byte range wanted; len 0: to the end of the object */
} dp_request;

/* Bytes a serve callback lends the server instead of copying them into its buffer: they
 * must stay valid and unchanged until the server calls release(arg) (exactly once, on any
 * thread, when the response has been written, dropped or the server stops). */
typedef struct dp_loan {
  const void *data;
  size_t len;
  void (*release)(void *arg);
  void *arg;
} dp_loan;

/* Serves one request: appends the bytes asked for to *out (empty on entry), or lends them
 * through *loan (zeroed on entry; for large in-memory objects, which then go to the socket
 * without a copy), and sets *total to the object's whole length, returning FL_OK; or returns
 * a status and sets its message (FL_ERR / fl_set_error: FL_ENOENT, FL_EFETCH ...), which the
 * client receives as the same status and message (a loan made anyway is released). Runs on
 * one of the server's worker threads, never on the event-loop thread, and may block on disk;
 * several run at once, so it must be thread-safe. */
typedef fl_status (*dp_serve_fn)(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                                 uint64_t *total);

typedef struct dp_server dp_server;

/* Starts a block server listening on host:port (host NULL: every interface; port 0: a free
 * port, see dp_server_port). With a secret (NULL or "": none; at most DP_SECRET_MAX bytes),
 * each connection must open with a hello carrying it. With FLINT_TLS on, every connection is
 * TLS, presenting FLINT_TLS_CERT. Starts the event-loop thread and the worker threads.
 * Returns FL_OK and the server in *out; FL_EINVAL (bad arguments, or TLS settings that cannot
 * serve: the message names the setting and the file), FL_ENET (cannot resolve or bind; the
 * message names host and port), FL_ENOMEM. Does not block beyond starting the threads (and
 * reading the TLS files). */
FL_INTERNAL fl_status dp_server_start(const char *host, int port, const char *secret,
                                      dp_serve_fn serve, void *arg, dp_server **out);

/* What keeps slow, stalled or hostile peers from holding a block server's connections for
 * ever. In each field 0 means the setting named below (common/config.h, with its default;
 * read once per process; 0 there turns the limit off); DP_UNLIMITED means no limit. */
typedef struct dp_server_limits {
  /* A connection between requests (nothing unread, no request in service) is closed after
   * this long. Clients pool connections and open a new one when the server has closed theirs,
   * so this costs a fetch one connect at most. FLINT_DP_IDLE_TIMEOUT_MS. */
  int64_t idle_timeout_ms;
  /* A frame must arrive whole within this long of its first byte (a new connection's first
   * frame within this long of the accept), and a response being written must not stall
   * (no byte taken by the peer) for this long; otherwise the connection is closed. Keeps a
   * client that trickles a header, or never reads, from holding a connection.
   * FLINT_DP_REQUEST_TIMEOUT_MS. */
  int64_t request_timeout_ms;
  /* Connections open at once; further ones are closed as they are accepted (a warning is
   * logged at most every DP_REFUSED_LOG_MS) and the open ones are unaffected.
   * FLINT_DP_MAX_CONNECTIONS. */
  int64_t max_connections;
} dp_server_limits;
#define DP_SERVER_LIMITS_INIT {0, 0, 0}
#define DP_UNLIMITED ((int64_t)-1)
#define DP_REFUSED_LOG_MS 10000

/* dp_server_start with explicit limits (NULL: as dp_server_start, every limit from the
 * environment or its default). The limits are copied. */
FL_INTERNAL fl_status dp_server_start_with_limits(const char *host, int port, const char *secret,
                                                  dp_serve_fn serve, void *arg,
                                                  const dp_server_limits *limits, dp_server **out);
/* The port the server listens on. Any thread. */
FL_INTERNAL int dp_server_port(const dp_server *s);

typedef struct dp_server_stats {
  uint64_t accepted;  /* connections accepted */
  uint64_t requests;  /* requests handed to the serve callback */
  uint64_t dropped;   /* connections closed for a malformed frame, failed authentication or a
                       * failed TLS handshake */
  uint64_t timed_out; /* connections closed by the idle or request timeout */
  uint64_t refused;   /* connections closed at accept, over max_connections */
} dp_server_stats;
/* A snapshot of the counters. Any thread. */
FL_INTERNAL dp_server_stats dp_server_stats_get(const dp_server *s);

/* Closes the listener and every connection (responses not yet written are dropped), waits
 * for running serve callbacks to return (callbacks still queued are not run), joins the
 * threads and frees the server. Blocks. Must not be called from a serve callback. NULL: no-op. */
FL_INTERNAL void dp_server_stop(dp_server *s);

typedef struct dp_client dp_client;

/* Creates a client with its event-loop thread. secret: sent in a hello on every new
 * connection (NULL or "": none; at most DP_SECRET_MAX bytes). With FLINT_TLS on, every
 * connection is TLS and checks the server against FLINT_TLS_CA (and ignores SIGPIPE when it
 * is at its default, as OpenSSL writes with write(2)). Returns FL_OK and the client in *out;
 * FL_EINVAL (bad arguments, or TLS settings that cannot serve, naming the setting and the
 * file), FL_ENOMEM. */
FL_INTERNAL fl_status dp_client_create(const char *secret, dp_client **out);
/* The largest response payload accepted from a server (default DP_MAX_PAYLOAD_DEFAULT); a
 * larger one fails its fetch with FL_EPROTO (the server refuses with FL_ELIMIT when it knows
 * beforehand). Any thread; applies to fetches that start afterwards. */
FL_INTERNAL void dp_client_set_max_payload(dp_client *c, uint64_t bytes);

typedef struct dp_client_stats {
  uint64_t connects; /* connections opened (successful or not) */
  uint64_t fetches;  /* fetches handed to the loop */
} dp_client_stats;
FL_INTERNAL dp_client_stats dp_client_stats_get(const dp_client *c);

/* Closes every connection, fails fetches still in progress with FL_ECANCELLED, joins the
 * loop thread and frees the client. Blocks until the loop thread has stopped. No dp_fetch may
 * start once this is called. NULL: no-op. */
FL_INTERNAL void dp_client_destroy(dp_client *c);

/* Fetches req from the peer "HOST:PORT" (a name, an IPv4 address or a bracketed IPv6
 * address). Blocks the calling thread, which may be any thread except the client's loop; the
 * sockets are the loop's, and connections to a peer are reused (up to
 * DP_CONNECTIONS_PER_PEER at once). On success appends the payload to *out (which the loop
 * thread fills while the caller waits, so the caller must not touch it meanwhile), sets
 * *total (may be NULL) to the object's whole length and returns FL_OK. On failure *out keeps
 * its old length (its capacity may have grown) and the status is: the server's status and
 * message; FL_ENET naming the peer when it cannot be resolved or reached, the connection
 * drops or a TLS handshake fails ("TLS handshake with PEER failed: REASON"); FL_EAUTH when
 * the server's certificate does not verify (an unknown CA, another name) or the server
 * refused the secret; FL_ECORRUPT on a checksum mismatch;
 * FL_EPROTO on a malformed or oversized frame; FL_ETIMEDOUT after timeout_ms (<= 0:
 * DP_TIMEOUT_DEFAULT_MS); FL_ECANCELLED when the client is destroyed meanwhile; FL_EINVAL
 * for bad arguments; FL_ENOMEM. */
FL_INTERNAL fl_status dp_fetch(dp_client *c, const char *peer, const dp_request *req,
                               int64_t timeout_ms, fl_buf *out, uint64_t *total);

/* The checksum of frames and payloads on the wire: CRC32C (common_crc32c). */
static inline uint32_t dp_crc32c(uint32_t crc, const void *data, size_t len) {
  return common_crc32c(crc, data, len);
}

/* ---- http (http.c) ---- */
/*
 * A small read-only HTTP server for the web UI (driver/ui/): GET and HEAD (others: 405),
 * requests larger than max_request refused with 413, and with a shared secret every request
 * must carry it (a bearer token, basic auth's password, or ?token=, which sets a cookie):
 * else 401. With FLINT_TLS on it speaks HTTPS with FLINT_TLS_CERT. One thread of its own.
 */
typedef struct http_server http_server;
/* The answer to GET `path` (decoded) with `query` (raw, or NULL): returns the status and fills
 * *body and *content_type (a static string). Runs on the server's thread. */
typedef int (*http_get_fn)(void *arg, const char *path, const char *query, fl_buf *body, const char **content_type);
#define HTTP_MAX_REQUEST ((size_t)64 << 10)
typedef struct http_server_config {
  const char *host; /* NULL: 127.0.0.1 */
  int port;         /* 0: a free one */
  const char *secret;
  size_t max_request; /* 0: HTTP_MAX_REQUEST */
  http_get_fn get;
  void *arg;
} http_server_config;
FL_INTERNAL fl_status http_server_start(const http_server_config *cfg, http_server **out);
FL_INTERNAL int http_server_port(const http_server *s);
/* Stops serving (connections in progress are dropped) and frees the server. NULL: nothing. */
FL_INTERNAL void http_server_stop(http_server *s);

#endif /* FLINT_NET_H */
