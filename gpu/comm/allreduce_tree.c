/*
 * gpu/comm/allreduce_tree.c: binary-tree allreduce. Member r's children are 2r+1 and 2r+2:
 * the sum flows up to member 0, then member 0 broadcasts it back down the same tree. Both
 * halves are pipelined in chunks (COMM_CHUNK_BYTES; gpu/comm/tree.c).
 *
 * Steps: 2d + 2(n/chunk - 1) chunk hops, d = floor(log2 p) the depth. Bytes: a leaf sends n
 * and receives n; an inner member receives 2n and sends n going up, then the reverse going
 * down (3n each way); the root receives 2n and sends 2n. The fewest sequential waits of the
 * algorithms for small messages; for large ones the inner members' links carry 3n, which
 * the double tree halves.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

fl_status allreduce_tree(const comm_group *g, float *data, size_t n) {
  if (g->size == 1 || n == 0) return FL_OK;
  size_t chunk = COMM_CHUNK_BYTES / sizeof(float);
  void *tmp = NULL;
  fl_status st = comm_host_scratch(g->h, 1, (n < chunk ? n : chunk) * sizeof(float), &tmp);
  if (st != FL_OK) return st;
  comm_tree t = comm_tree_heap(g, 0);
  for (size_t at = 0; at < n && st == FL_OK; at += chunk)
    st = tree_reduce_chunk(g, &t, data + at, n - at < chunk ? n - at : chunk, tmp);
  if (st != FL_OK) return st;
  return tree_broadcast_bytes(g, 0, (uint8_t *)data, n * sizeof(float));
}
