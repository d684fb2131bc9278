/*
 * gpu/comm/allreduce_naive.c: the naive allreduce: every member sends its whole vector to
 * every other one and sums all p vectors itself. p-1 rounds of pairwise exchanges (round k:
 * send to member+k, receive from member-k, full duplex), then a local sum in member order
 * 0, 1, ..., p-1, so every member computes the same bits.
 *
 * Steps: p-1. Bytes: each member sends and receives (p-1) x n, and reduces (p-1) x n; it
 * holds all p vectors at once (p x n of scratch). The seeds' baseline: one latency per peer
 * and p/2 times the ring's bytes, so it only competes for tiny messages on few ranks.
 */
#include <string.h>

#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

fl_status allreduce_naive(const comm_group *g, float *data, size_t n) {
  int p = g->size, r = g->rank;
  if (p == 1 || n == 0) return FL_OK;
  size_t bytes = n * sizeof(float);
  void *buf = NULL;
  fl_status st = comm_host_scratch(g->h, 0, bytes * (size_t)p, &buf);
  if (st != FL_OK) return st;
  float *all = buf; /* member j's vector at all + j*n */
  memcpy(all + (size_t)r * n, data, bytes);
  for (int k = 1; k < p; k++) {
    int from = (r - k + p) % p;
    st = comm_host_exchange(g->h, comm_group_peer(g, r + k), data, bytes, comm_group_peer(g, from),
                            all + (size_t)from * n, bytes);
    if (st != FL_OK) return st;
  }
  memcpy(data, all, bytes);
  for (int j = 1; j < p; j++) comm_reduce_add(data, all + (size_t)j * n, n);
  return FL_OK;
}
