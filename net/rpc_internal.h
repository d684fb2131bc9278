/*
 * rpc_internal.h: what the rpc server (rpc.c) and client (rpc_client.c) share, private to
 * net/: metadata keys, flow control, and the checks both ends make.
 */
#ifndef FLINT_NET_RPC_INTERNAL_H
#define FLINT_NET_RPC_INTERNAL_H

#include "net/net.h"

#define RPC_SECRET_KEY "flint-secret"
#define RPC_STATUS_KEY "flint-status"
#define RPC_STREAM_WINDOW (8 << 20) /* bytes a stream may have in flight (HTTP/2 flow control) */

/* Whether `status` is a code of flint's table (a status that crossed the wire may not be). */
FL_INTERNAL bool rpc_status_known(int status);
/* A secret becomes a metadata value, which must be printable ASCII: FL_EINVAL otherwise. */
FL_INTERNAL fl_status rpc_check_secret(const char *secret);

#endif /* FLINT_NET_RPC_INTERNAL_H */
