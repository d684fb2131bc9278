/*
 * gpu/comm/allreduce_tree.c: binary-tree allreduce. Rank r's children are 2r+1 and 2r+2: the
 * sum flows up to rank 0, then rank 0 broadcasts it back down the same tree. Both halves
 * are pipelined in chunks (COMM_TREE_CHUNK bytes), so a rank forwards chunk k while its
 * neighbours already move chunk k+1 through the socket buffers. A leaf sends n elements and
 * receives n; an inner rank receives 2n and sends n going up, then the reverse going down.
 * Latency is 2 ceil(log2(p+1)) - 2 hops of one chunk each, the fewest of the three
 * algorithms for small messages; for large ones the inner ranks' links carry up to 3n each
 * way, which is why AUTO moves to the ring.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

#define COMM_TREE_CHUNK (256u << 10)

fl_status allreduce_tree(comm_host *h, int rank, int size, float *data, size_t n) {
  if (size == 1 || n == 0) return FL_OK;
  size_t chunk = COMM_TREE_CHUNK / sizeof(float);
  int kids[2] = {2 * rank + 1, 2 * rank + 2};
  int parent = rank ? (rank - 1) / 2 : -1;
  void *scratch = NULL;
  fl_status st = comm_host_scratch(h, 1, (n < chunk ? n : chunk) * sizeof(float), &scratch);
  if (st != FL_OK) return st;
  float *tmp = scratch;
  for (size_t at = 0; at < n; at += chunk) {
    size_t cnt = n - at < chunk ? n - at : chunk;
    for (int k = 0; k < 2; k++) {
      if (kids[k] >= size) continue;
      st = comm_host_exchange_reduce(h, kids[k], NULL, 0, kids[k], data + at, cnt, tmp, cnt);
      if (st != FL_OK) return st;
    }
    if (parent >= 0) {
      st = comm_host_send(h, parent, data + at, cnt * sizeof(float));
      if (st != FL_OK) return st;
    }
  }
  return tree_broadcast_bytes(h, rank, size, 0, (uint8_t *)data, n * sizeof(float));
}
