/*
 * dataplane_frame.h: what the data plane's server (dataplane.c) and client
 * (dataplane_client.c) share, private to net/: the frames of the wire format (net.h) and the
 * setup both ends need (dataplane_frame.c unless said).
 */
#ifndef FLINT_NET_DATAPLANE_FRAME_H
#define FLINT_NET_DATAPLANE_FRAME_H

#include <string.h>
#include <sys/socket.h>

#include "net/net.h"

/* A frame header, decoded. */
typedef struct dp_header {
  uint8_t type;
  uint16_t status;
  uint64_t len, total;
  uint32_t crc;
} dp_header;

FL_INTERNAL void dp_header_encode(uint8_t out[DP_FRAME_HEADER_SIZE], const dp_header *h);
/* Checks what every frame must satisfy; the caller checks type-specific limits. Returns
 * NULL, or what is wrong. */
FL_INTERNAL const char *dp_header_decode(const uint8_t in[DP_FRAME_HEADER_SIZE], dp_header *h);
FL_INTERNAL void dp_request_encode(uint8_t out[DP_REQUEST_WIRE_SIZE], const dp_request *r,
                                   uint64_t max_len);
/* NULL, or what is wrong with the request. */
FL_INTERNAL const char *dp_request_decode(const uint8_t in[DP_REQUEST_WIRE_SIZE], dp_request *r,
                                          uint64_t *max_len);

/* The address of host:port (host NULL with passive: any), FL_ENET naming the host when it
 * cannot be resolved. Blocks on name resolution. (dataplane.c) */
FL_INTERNAL fl_status dp_resolve(const char *host, int port, bool passive, struct sockaddr_storage *addr,
                                 socklen_t *addrlen);
/* How long a fetching thread or an idle server worker spins before it sleeps. */
FL_INTERNAL uint64_t dp_spin_ns(void);
/* libevent's pthread locking, once per process, before the first event base. */
FL_INTERNAL void dp_evthread_setup(void);

#endif /* FLINT_NET_DATAPLANE_FRAME_H */
