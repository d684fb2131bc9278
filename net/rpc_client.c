/*
 * rpc_client.c: the client side of unary calls over gRPC's C core (the contract is in
 * net.h; the server is in rpc.c).
 *
 * Design. Each call is one batch of all six client ops on a pluck queue of its own, so
 * threads calling on one channel share nothing but gRPC's connection. A failed call returns
 * the handler's fl_status when the server sent one (trailing metadata "flint-status"), else
 * a status made from gRPC's. With FLINT_TLS on, the channel uses gRPC's SSL credentials
 * (FLINT_TLS_CA as the only roots, FLINT_TLS_SERVER_NAME as the target name override);
 * gRPC's text for a failed TLS handshake is turned into a message that says what to fix
 * (rpc_tls_failure).
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

struct rpc_channel {
  grpc_channel *channel;
  char *target;
  char *secret; /* NULL: none */
  size_t secret_len;
  size_t max_message;
  bool tls;
  bool tls_name_set; /* tls_name is FLINT_TLS_SERVER_NAME, not the host dialled */
  char *tls_name;    /* the name the server's certificate must hold, for messages */
  char *tls_ca;      /* FLINT_TLS_CA's path, for messages */
};

/* How long a plaintext channel whose connection was closed may take to learn whether the
 * server speaks TLS instead (rpc_tls_failure). */
#define RPC_TLS_PROBE_MS 2000

fl_status rpc_channel_create(const char *target, const char *secret, size_t max_message,
                             rpc_channel **out) {
  fl_status status = FL_OK;
  rpc_channel *c = NULL;
  grpc_channel_credentials *creds = NULL;
  net_tls tls = {0};
  if (!target || !*target || !out)
    return FL_ERR(FL_EINVAL, "rpc_channel_create: target (HOST:PORT) and out must be given");
  if (max_message > INT32_MAX)
    return FL_ERR(FL_EINVAL, "rpc_channel_create: max_message %zu is over gRPC's limit of 2 GiB",
                  max_message);
  if (secret && (status = rpc_check_secret(secret)) != FL_OK) return status;
  if ((status = net_tls_read(NET_TLS_CLIENT, &tls)) != FL_OK) {
    net_tls_free(&tls);
    return status;
  }

  grpc_init(); /* balanced in rpc_channel_destroy */
  c = common_calloc(1, sizeof *c);
  if (!c) {
    grpc_shutdown();
    net_tls_free(&tls);
    return FL_ERR(FL_ENOMEM, "cannot allocate an rpc channel");
  }
  c->max_message = max_message ? max_message : RPC_DEFAULT_MAX_MESSAGE;
  c->target = common_strdup(target);
  if (!c->target) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the target"));
  if (secret && *secret) {
    c->secret = common_strdup(secret);
    if (!c->secret) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the secret"));
    c->secret_len = strlen(secret);
  }
  grpc_arg args[] = {
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = (int)c->max_message}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = (int)c->max_message}},
      /* Callers decide about retrying; gRPC's retries would also buffer every request. */
      {GRPC_ARG_INTEGER, GRPC_ARG_ENABLE_RETRIES, {.integer = 0}},
      /* A window that takes a job's launch or results (hundreds of KiB) in one flight:
       * gRPC's default of 64 KiB made such a message wait out several window updates. */
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, {.integer = RPC_STREAM_WINDOW}},
      /* A restarted peer is found again within seconds, not gRPC's default of minutes. gRPC
       * also takes the minimum backoff as how long one connection attempt may wait for the
       * peer's handshake: at 200 ms a driver busy starting (a loaded machine, a sanitizer
       * build) failed its first callers ("timed out before receiving SETTINGS frame"). */
      {GRPC_ARG_INTEGER, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, {.integer = 200}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, {.integer = 10000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = 5000}},
      /* A call may wait hours for a job; pings find a peer that vanished without a FIN. */
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 30000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 10000}},
      {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
      /* Last, counted only when set: the name the server's certificate must hold instead
       * of the host dialled. */
      {GRPC_ARG_STRING, GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, {.string = tls.server_name}},
  };
  grpc_channel_args channel_args = {sizeof args / sizeof args[0] - (tls.server_name ? 0 : 1), args};
  if (tls.on) {
    c->tls = true;
    c->tls_name_set = tls.server_name != NULL;
    c->tls_name = common_strdup(tls.server_name ? tls.server_name : target);
    c->tls_ca = common_strdup(config_string(CONFIG_TLS_CA));
    if (!c->tls_name || !c->tls_ca) FL_CHECK(FL_ERR(FL_ENOMEM, "cannot copy the TLS settings"));
    if (!tls.server_name) { /* the host of HOST:PORT ("[::1]:7077" too) */
      char *colon = strrchr(c->tls_name, ':');
      if (colon) *colon = '\0';
      size_t n = strlen(c->tls_name);
      if (n >= 2 && c->tls_name[0] == '[' && c->tls_name[n - 1] == ']') {
        memmove(c->tls_name, c->tls_name + 1, n - 2);
        c->tls_name[n - 2] = '\0';
      }
    }
    /* gRPC checks the chain against the CA and the name (IP addresses included); a client
     * certificate is sent only when one is given. gRPC copies the PEM text. */
    grpc_ssl_pem_key_cert_pair pair = {tls.key_pem, tls.cert_pem};
    creds = grpc_ssl_credentials_create(tls.ca_pem, tls.cert_pem ? &pair : NULL, NULL, NULL);
  } else {
    creds = grpc_insecure_credentials_create();
  }
  if (!creds) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot create gRPC credentials for %s", target));
  c->channel = grpc_channel_create(target, creds, &channel_args);
  if (!c->channel) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot create a gRPC channel to %s", target));
  *out = c;
  c = NULL;

cleanup:
  if (creds) grpc_channel_credentials_release(creds);
  net_tls_free(&tls);
  rpc_channel_destroy(c); /* NULL on success */
  return status;
}

void rpc_channel_destroy(rpc_channel *c) {
  if (!c) return;
  if (c->channel) grpc_channel_destroy(c->channel);
  common_free(c->target);
  common_free(c->secret);
  common_free(c->tls_name);
  common_free(c->tls_ca);
  common_free(c);
  grpc_shutdown();
}

/* A connection that failed for TLS on one side and not the other, or for a certificate,
 * as its status and a message that says what to do; FL_OK when it was not that. gRPC tells
 * these apart only in its text (1.51): "Ssl handshake failed: ... certificate verify
 * failed", "Peer name NAME is not in peer certificate", "... wrong version number" (a TLS
 * client answered in plain HTTP/2), and "Socket closed" for a plaintext client whose
 * server wanted TLS, which a probe confirms, since a server can close for other reasons. */
static fl_status rpc_tls_failure(const rpc_channel *c, const char *method, int64_t timeout_ms,
                                 const char *text) {
  if (c->tls) {
    if (strstr(text, "certificate verify failed"))
      return FL_ERR(FL_EAUTH, "%s on %s: TLS handshake failed: the server's certificate was not "
                    "trusted: it is not signed by FLINT_TLS_CA=%s, or not valid now (gRPC: %s)",
                    method, c->target, c->tls_ca, text);
    if (strstr(text, "is not in peer certificate"))
      return FL_ERR(FL_EAUTH, "%s on %s: TLS handshake failed: the server's certificate is not for "
                    "%s (%s) (gRPC: %s)", method, c->target, c->tls_name,
                    c->tls_name_set ? "FLINT_TLS_SERVER_NAME"
                                    : "the host dialled; FLINT_TLS_SERVER_NAME may name one it is for",
                    text);
    if (strstr(text, "wrong version number"))
      return FL_ERR(FL_ENET, "cannot reach %s (calling %s): TLS handshake failed: the server's "
                    "answer is not TLS: the server may not use TLS (FLINT_TLS) and this client "
                    "does (gRPC: %s)", c->target, method, text);
    if (strstr(text, "Handshake failed") || strstr(text, "handshake failed"))
      return FL_ERR(FL_ENET, "cannot reach %s (calling %s): TLS handshake failed (gRPC: %s)",
                    c->target, method, text);
    return FL_OK;
  }
  if (!strstr(text, "Socket closed")) return FL_OK;
  int probe_ms = timeout_ms > 0 && timeout_ms < RPC_TLS_PROBE_MS ? (int)timeout_ms : RPC_TLS_PROBE_MS;
  if (!net_tls_probe(c->target, probe_ms)) return FL_OK;
  return FL_ERR(FL_ENET, "cannot reach %s (calling %s): the server closed the connection during "
                "the handshake: it speaks TLS (FLINT_TLS=1) and this client does not; set FLINT_TLS=1 "
                "and FLINT_TLS_CA here too (gRPC: %s)", c->target, method, text);
}

/* The status of a finished call that did not succeed, with its message. */
static fl_status rpc_call_failure(const rpc_channel *c, const char *method, int64_t timeout_ms,
                                  grpc_status_code code, grpc_slice details,
                                  const grpc_metadata_array *trailing) {
  int details_len = (int)(GRPC_SLICE_LENGTH(details) > 900 ? 900 : GRPC_SLICE_LENGTH(details));
  const char *text = (const char *)GRPC_SLICE_START_PTR(details);
  for (size_t i = 0; i < trailing->count; i++) {
    if (grpc_slice_str_cmp(trailing->metadata[i].key, RPC_STATUS_KEY) != 0) continue;
    char number[16];
    grpc_slice v = trailing->metadata[i].value;
    size_t len = GRPC_SLICE_LENGTH(v);
    if (len == 0 || len >= sizeof number) break;
    memcpy(number, GRPC_SLICE_START_PTR(v), len);
    number[len] = '\0';
    char *end;
    long s = strtol(number, &end, 10);
    if (*end || s == FL_OK || !rpc_status_known((int)s)) break;
    /* fl_set_error, not FL_ERR: the handler's message comes back as it was, with no
     * position of ours in front even for FL_ENOMEM and FL_EINTERNAL. */
    return fl_set_error((fl_status)s, "%s on %s: %.*s", method, c->target, details_len, text);
  }
  if (code == GRPC_STATUS_UNAVAILABLE) {
    char copy[901];
    snprintf(copy, sizeof copy, "%.*s", details_len, text);
    fl_status tls = rpc_tls_failure(c, method, timeout_ms, copy);
    if (tls != FL_OK) return tls;
  }
  switch (code) {
  case GRPC_STATUS_UNAVAILABLE:
  case GRPC_STATUS_CANCELLED: /* the server stopped during the call */
    return FL_ERR(FL_ENET, "cannot reach %s (calling %s): %.*s", c->target, method, details_len,
                  text);
  case GRPC_STATUS_DEADLINE_EXCEEDED:
    if (timeout_ms <= 0) /* a deadline that a proxy or the server set */
      return FL_ERR(FL_ETIMEDOUT, "%s on %s: deadline exceeded: %.*s", method, c->target,
                    details_len, text);
    return FL_ERR(FL_ETIMEDOUT, "%s on %s: no reply within %lld ms", method, c->target,
                  (long long)timeout_ms);
  case GRPC_STATUS_UNAUTHENTICATED:
    return FL_ERR(FL_EAUTH, "%s on %s: %.*s", method, c->target, details_len, text);
  case GRPC_STATUS_RESOURCE_EXHAUSTED:
    /* gRPC's own refusal of a message over a limit, on either side. */
    return FL_ERR(FL_EPROTO, "%s on %s: the request or reply is over a size limit (gRPC: %.*s)",
                  method, c->target, details_len, text);
  default:
    return FL_ERR(FL_EPROTO, "%s on %s: the peer failed the call with gRPC status %d: %.*s",
                  method, c->target, (int)code, details_len, text);
  }
}

/* A call on its way: begun by rpc_call_begin, waited for by rpc_call_end. */
struct rpc_pending {
  rpc_channel *channel;
  const char *method; /* the caller's, alive until rpc_call_end */
  int64_t timeout_ms;
  grpc_completion_queue *cq;
  grpc_call *call;
  grpc_byte_buffer *send_bb, *recv_bb;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code code;
  grpc_slice details;
  grpc_metadata secret_md;
};

static void rpc_pending_free(rpc_pending *p) {
  if (p->call) grpc_call_unref(p->call);
  if (p->cq) {
    grpc_completion_queue_shutdown(p->cq); /* nothing is pending: the one batch has completed */
    grpc_completion_queue_destroy(p->cq);
  }
  if (p->send_bb) grpc_byte_buffer_destroy(p->send_bb);
  if (p->recv_bb) grpc_byte_buffer_destroy(p->recv_bb);
  grpc_slice_unref(p->details);
  grpc_metadata_array_destroy(&p->initial_md);
  grpc_metadata_array_destroy(&p->trailing_md);
  common_free(p);
}

fl_status rpc_call_begin(rpc_channel *c, const char *method, fl_bytes request, int64_t timeout_ms,
                         rpc_pending **out) {
  fl_status status = FL_OK;
  *out = NULL;
  if (!c || !method || method[0] != '/' || (request.len && !request.data))
    return FL_ERR(FL_EINVAL, "rpc_call_begin: needs a channel, a method \"/service/Name\" and request bytes");
  if (request.len > c->max_message)
    return FL_ERR(FL_EPROTO, "%s on %s: the request of %zu bytes is over the limit of %zu bytes", method,
                  c->target, request.len, c->max_message);
  rpc_pending *p = common_calloc(1, sizeof *p);
  if (!p) return FL_ERR(FL_ENOMEM, "out of memory for a call of %s", method);
  p->channel = c;
  p->method = method;
  p->timeout_ms = timeout_ms;
  p->code = GRPC_STATUS_UNKNOWN;
  p->details = grpc_empty_slice();
  grpc_metadata_array_init(&p->initial_md);
  grpc_metadata_array_init(&p->trailing_md);

  gpr_timespec deadline =
      timeout_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                    gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
                     : gpr_inf_future(GPR_CLOCK_MONOTONIC);
  p->cq = grpc_completion_queue_create_for_pluck(NULL);
  if (!p->cq) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot create a completion queue"));
  /* A copy, not a static slice: the connection's HPACK compressor keeps the path of earlier
   * calls to compare with later ones, after a caller's (non-literal) method string is gone.
   * The call takes its own reference. */
  grpc_slice path = grpc_slice_from_copied_string(method);
  p->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq, path, NULL,
                                     deadline, NULL);
  grpc_slice_unref(path);
  if (!p->call) FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot create a call of %s on %s", method, c->target));
  /* A copy: gRPC may still hold the request's slices when the call has failed early (a
   * refused secret), after the caller's bytes are gone. */
  grpc_slice body = grpc_slice_from_copied_buffer((const char *)request.data, request.len);
  p->send_bb = grpc_raw_byte_buffer_create(&body, 1);
  grpc_slice_unref(body);

  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (c->secret) {
    p->secret_md.key = grpc_slice_from_static_string(RPC_SECRET_KEY);
    p->secret_md.value = grpc_slice_from_static_buffer(c->secret, c->secret_len);
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = &p->secret_md;
  }
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = p->send_bb;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &p->initial_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &p->recv_bb;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &p->trailing_md;
  ops[5].data.recv_status_on_client.status = &p->code;
  ops[5].data.recv_status_on_client.status_details = &p->details;
  COMMON_TRACE("rpc.call", method);
  grpc_call_error err = grpc_call_start_batch(p->call, ops, 6, p->call, NULL);
  if (err != GRPC_CALL_OK)
    FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start a call of %s on %s: %s", method, c->target,
                    grpc_call_error_to_string(err)));
  *out = p;
  p = NULL;

cleanup:
  if (p) {
    if (p->call) { /* created but never started: nothing to wait for */
      grpc_call_unref(p->call);
      p->call = NULL;
    }
    rpc_pending_free(p);
  }
  return status;
}

fl_status rpc_call_end(rpc_pending *p, fl_buf *response) { return rpc_call_end_unless(p, NULL, response); }

fl_status rpc_call_end_unless(rpc_pending *p, const atomic_bool *abandon, fl_buf *response) {
  fl_status status = FL_OK;
  rpc_channel *c = p->channel;
  const char *method = p->method;
  /* The call's own deadline ends the wait; without one it lasts as long as the handler.
   * With `abandon`, the wait wakes every RPC_ABANDON_POLL_MS to look at it. */
  bool abandoned = false;
  grpc_event ev;
  for (;;) {
    gpr_timespec until = abandon ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                gpr_time_from_millis(RPC_ABANDON_POLL_MS, GPR_TIMESPAN))
                                 : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    ev = grpc_completion_queue_pluck(p->cq, p->call, until, NULL);
    if (ev.type != GRPC_QUEUE_TIMEOUT) break;
    if (abandon && !abandoned && atomic_load_explicit(abandon, memory_order_acquire)) {
      abandoned = true;
      grpc_call_cancel(p->call, NULL); /* the batch completes soon, failed */
    }
  }
  FL_ASSERT(ev.type == GRPC_OP_COMPLETE);
  COMMON_TRACE("rpc.returned", method);

  if (abandoned && p->code != GRPC_STATUS_OK)
    FL_CHECK(FL_ERR(FL_ECANCELLED, "%s on %s: given up without a reply", method, c->target));
  if (p->code != GRPC_STATUS_OK)
    FL_CHECK(rpc_call_failure(c, method, p->timeout_ms, p->code, p->details, &p->trailing_md));
  if (!p->recv_bb)
    FL_CHECK(FL_ERR(FL_EPROTO, "%s on %s: the server replied OK without a message", method,
                    c->target));
  if (!response) goto cleanup; /* the caller wants only the outcome */
  grpc_byte_buffer_reader reader;
  if (!grpc_byte_buffer_reader_init(&reader, p->recv_bb))
    FL_CHECK(FL_ERR(FL_EPROTO, "%s on %s: the reply cannot be decoded", method, c->target));
  size_t len = grpc_byte_buffer_length(p->recv_bb);
  size_t old_len = response->len;
  response->len = 0;
  status = fl_buf_reserve(response, len);
  if (status != FL_OK) response->len = old_len; /* untouched on failure, as promised */
  grpc_slice slice;
  while (status == FL_OK && grpc_byte_buffer_reader_next(&reader, &slice)) {
    fl_buf_append(response, GRPC_SLICE_START_PTR(slice), GRPC_SLICE_LENGTH(slice));
    grpc_slice_unref(slice);
  }
  grpc_byte_buffer_reader_destroy(&reader);
  if (status != FL_OK)
    common_error_wrap(status, "%s on %s: reply of %zu bytes: ", method, c->target, len);

cleanup:
  rpc_pending_free(p);
  return status;
}

fl_status rpc_call(rpc_channel *c, const char *method, fl_bytes request, int64_t timeout_ms,
                   fl_buf *response) {
  if (!response)
    return FL_ERR(FL_EINVAL, "rpc_call: needs a channel, a method \"/service/Name\", request "
                             "bytes and a response buffer");
  rpc_pending *p;
  fl_status status = rpc_call_begin(c, method, request, timeout_ms, &p);
  return status == FL_OK ? rpc_call_end(p, response) : status;
}
