/*
 * gpu/comm/collectives.c: the host backend's collectives other than allreduce, on host
 * buffers. Allgather and reduce-scatter are the two halves of the ring
 * (gpu/comm/allreduce_ring.c) and the broadcast is a pipelined tree (gpu/comm/tree.c); what
 * is here is the barrier and the all-to-all.
 *
 * Barrier: dissemination (Hensgen, Finkel and Manber): in round k = 1, 2, 4, ... < p every
 * member sends one byte to member+k and receives one from member-k; after ceil(log2 p)
 * rounds every member has heard, transitively, from every other one.
 *
 * All-to-all: p-1 rounds of pairwise exchanges; in round k member r sends its block for
 * r+k to r+k while it receives r-k's block for it from r-k (each a full-duplex exchange, so
 * every member sends and receives in every round). (p-1)/p x the buffer each way, p-1
 * latencies: the pattern the expert-parallel layer's dispatch and combine need.
 */
#include <string.h>

#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

fl_status host_barrier(const comm_group *g) {
  for (int k = 1; k < g->size; k <<= 1) {
    uint8_t out = 0xb7, in = 0;
    int from = comm_group_peer(g, g->rank - k);
    fl_status st = comm_host_exchange(g->h, comm_group_peer(g, g->rank + k), &out, 1, from, &in, 1);
    if (st != FL_OK) return st;
    if (in != 0xb7)
      return fl_set_error(FL_EPROTO, "rank %d: barrier got byte 0x%02x from rank %d: the ranks "
                          "are not calling the same collectives in the same order", g->h->rank, in, from);
  }
  return FL_OK;
}

fl_status host_alltoall_bytes(const comm_group *g, const uint8_t *in, uint8_t *out, size_t bytes) {
  int r = g->rank, p = g->size;
  if (bytes) memmove(out + (size_t)r * bytes, in + (size_t)r * bytes, bytes);
  for (int k = 1; k < p; k++) {
    int to = (r + k) % p, from = (r - k + p) % p;
    fl_status st = comm_host_exchange(g->h, comm_group_peer(g, to), in + (size_t)to * bytes, bytes,
                                      comm_group_peer(g, from), out + (size_t)from * bytes, bytes);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}
