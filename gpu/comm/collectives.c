/*
 * gpu/comm/collectives.c: the host backend's collectives other than allreduce, on host
 * buffers. Allgather and reduce-scatter are the two halves of the ring
 * (gpu/comm/allreduce_ring.c); what is here is the broadcast and the barrier.
 *
 * Broadcast: a binary tree over ranks renumbered so that the root is 0 (v = rank - root mod
 * p), pipelined in chunks: a rank receives chunk k from its parent and forwards it to its
 * two children, so a message of n bytes costs about n/bandwidth x 2 plus log2(p) chunk
 * latencies. Each inner rank sends 2n, each leaf nothing.
 *
 * Barrier: dissemination (Hensgen, Finkel and Manber): in round k = 1, 2, 4, ... < p every
 * rank sends one byte to rank+k and receives one from rank-k; after ceil(log2 p) rounds
 * every rank has heard, transitively, from every other one.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

#define COMM_BCAST_CHUNK (256u << 10)

fl_status tree_broadcast_bytes(comm_host *h, int rank, int size, int root, uint8_t *data,
                               size_t bytes) {
  if (size == 1 || bytes == 0) return FL_OK;
  int v = (rank - root + size) % size;
  int parent = v ? ((v - 1) / 2 + root) % size : -1;
  int kids[2], nkids = 0;
  for (int k = 1; k <= 2; k++)
    if (2 * v + k < size) kids[nkids++] = (2 * v + k + root) % size;
  for (size_t at = 0; at < bytes; at += COMM_BCAST_CHUNK) {
    size_t cnt = bytes - at < COMM_BCAST_CHUNK ? bytes - at : COMM_BCAST_CHUNK;
    fl_status st;
    if (parent >= 0 && (st = comm_host_recv(h, parent, data + at, cnt)) != FL_OK) return st;
    for (int k = 0; k < nkids; k++)
      if ((st = comm_host_send(h, kids[k], data + at, cnt)) != FL_OK) return st;
  }
  return FL_OK;
}

fl_status host_barrier(comm_host *h, int rank, int size) {
  for (int k = 1; k < size; k <<= 1) {
    uint8_t out = 0xb7, in = 0;
    fl_status st = comm_host_exchange(h, (rank + k) % size, &out, 1, (rank - k + size) % size, &in, 1);
    if (st != FL_OK) return st;
    if (in != 0xb7)
      return fl_set_error(FL_EPROTO, "rank %d: barrier got byte 0x%02x from rank %d: the ranks "
                          "are not calling the same collectives in the same order", rank, in,
                          (rank - k + size) % size);
  }
  return FL_OK;
}
