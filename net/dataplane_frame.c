/*
 * dataplane_frame.c: what both ends of the data plane share: its frames (the wire format is
 * in net.h), encoded and checked here, libevent's thread setup and how long their threads
 * spin. Stateless but for a once-only setup; any thread.
 */
#include <string.h>

#include <event2/thread.h>

#include "net/dataplane_frame.h"

/* A fetch takes at least a loopback round trip (60-85 us) and these threads share the cores
 * with the loops that move the bytes, so they spin far less than fl_spin_ns()'s hand-off
 * budget: on a 2-core machine a 200 us spin per fetch cost a quarter of the throughput of
 * 4 MiB fetches. */
uint64_t dp_spin_ns(void) {
  uint64_t cap = 20000, v = fl_spin_ns();
  return v < cap ? v : cap;
}

void dp_header_encode(uint8_t out[DP_FRAME_HEADER_SIZE], const dp_header *h) {
  common_put_u32(out, DP_FRAME_MAGIC);
  out[4] = DP_FRAME_VERSION;
  out[5] = h->type;
  common_put_u16(out + 6, h->status);
  common_put_u64(out + 8, h->len);
  common_put_u64(out + 16, h->total);
  common_put_u32(out + 24, h->crc);
  common_put_u32(out + 28, dp_crc32c(0, out, 28));
}

const char *dp_header_decode(const uint8_t in[DP_FRAME_HEADER_SIZE], dp_header *h) {
  if (common_get_u32(in) != DP_FRAME_MAGIC) return "bad magic (not a flint data-plane peer?)";
  if (in[4] != DP_FRAME_VERSION) return "unsupported protocol version";
  if (common_get_u32(in + 28) != dp_crc32c(0, in, 28)) return "header checksum mismatch";
  h->type = in[5];
  h->status = common_get_u16(in + 6);
  h->len = common_get_u64(in + 8);
  h->total = common_get_u64(in + 16);
  h->crc = common_get_u32(in + 24);
  if (h->type < DP_FRAME_HELLO || h->type > DP_FRAME_RESPONSE) return "unknown frame type";
  return NULL;
}

void dp_request_encode(uint8_t out[DP_REQUEST_WIRE_SIZE], const dp_request *r, uint64_t max_len) {
  memset(out, 0, DP_REQUEST_WIRE_SIZE);
  out[0] = r->kind;
  for (int i = 0; i < 4; i++) common_put_u64(out + 8 + 8 * i, r->key[i]);
  common_put_u64(out + 40, r->offset);
  common_put_u64(out + 48, r->len);
  common_put_u64(out + 56, max_len);
}

const char *dp_request_decode(const uint8_t in[DP_REQUEST_WIRE_SIZE], dp_request *r,
                              uint64_t *max_len) {
  memset(r, 0, sizeof *r);
  r->kind = in[0];
  if (r->kind < DP_SHUFFLE || r->kind > DP_KIND_LAST) return "unknown request kind";
  for (int i = 1; i < 8; i++)
    if (in[i]) return "nonzero padding in request";
  for (int i = 0; i < 4; i++) r->key[i] = common_get_u64(in + 8 + 8 * i);
  r->offset = common_get_u64(in + 40);
  r->len = common_get_u64(in + 48);
  *max_len = common_get_u64(in + 56);
  return NULL;
}

static pthread_once_t evthread_once = PTHREAD_ONCE_INIT;
static void evthread_setup(void) { FL_ASSERT(evthread_use_pthreads() == 0); }

void dp_evthread_setup(void) { FL_PCHECK(pthread_once(&evthread_once, evthread_setup)); }
