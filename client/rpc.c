/*
 * rpc.c: how the client calls a driver: a channel to a flint:// master (with the shared
 * secret, config_secret), and one call with a protobuf-c message.
 *
 * Stateless: every function may be called from any thread.
 */
#include <errno.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/config.h"
#include "proto/pack.h"

fl_status client_rpc_call(rpc_channel *ch, const char *method, const ProtobufCMessage *msg,
                          int64_t timeout_ms, fl_buf *reply) {
  fl_buf body = FL_BUF_INIT;
  fl_status st = proto_pack(msg, &body);
  if (st == FL_OK) {
    reply->len = 0;
    st = rpc_call(ch, method, fl_buf_bytes(&body), timeout_ms, reply);
  }
  fl_buf_free(&body);
  return st;
}

fl_status client_rpc_connect(const char *master, rpc_channel **ch) {
  if (!master || strncmp(master, "flint://", 8) != 0 || !strchr(master + 8, ':'))
    return FL_ERR(FL_EINVAL, "master '%s': expected flint://HOST:PORT", master ? master : "");
  char *secret = NULL;
  fl_status st = config_secret(&secret);
  if (st == FL_OK) st = rpc_channel_create(master + 8, secret, DRIVER_MAX_MESSAGE, ch);
  common_free(secret);
  return st;
}
