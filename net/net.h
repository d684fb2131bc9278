/*
 * net.h: the network layer. rpc (net/rpc.c): unary calls over gRPC C core for the control
 * plane. dataplane (net/dataplane.c): block transfer over libevent.
 */
#ifndef FLINT_NET_H
#define FLINT_NET_H

#include "common/common.h"

#endif /* FLINT_NET_H */
