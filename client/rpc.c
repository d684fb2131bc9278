/*
 * rpc.c: how the client calls a driver: the shared secret it presents, a channel to a
 * flint:// master, and one call with a protobuf-c message.
 *
 * Stateless: every function may be called from any thread.
 */
#include <errno.h>
#include <string.h>

#include "client/client_internal.h"
#include "common/config.h"
#include "proto/pack.h"

fl_status client_rpc_secret(char **out) {
  *out = NULL;
  const char *env = config_string(CONFIG_SECRET);
  if (env) {
    if (!(*out = common_strdup(env))) return FL_ERR(FL_ENOMEM, "out of memory");
    return FL_OK;
  }
  const char *file = config_string(CONFIG_SECRET_FILE);
  if (!file) return FL_OK;
  FILE *f = fopen(file, "r");
  if (!f) return FL_ERR(FL_EAUTH, "cannot read the secret file %s: %s", file, strerror(errno));
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
  buf[n] = 0;
  if (n == 0) return FL_ERR(FL_EAUTH, "the secret file %s is empty", file);
  if (!(*out = common_strdup(buf))) return FL_ERR(FL_ENOMEM, "out of memory");
  return FL_OK;
}

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
  fl_status st = client_rpc_secret(&secret);
  if (st == FL_OK) st = rpc_channel_create(master + 8, secret, DRIVER_MAX_MESSAGE, ch);
  common_free(secret);
  return st;
}
