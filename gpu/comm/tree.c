/*
 * gpu/comm/tree.c: binary trees, the pieces that the tree, double-tree and hierarchical
 * allreduces and the broadcast are made of. A tree is each member's parent and children;
 * one chunk moves per call, so callers pipeline by calling chunk after chunk: a member
 * forwards chunk k while its neighbours already move chunk k+1 through the transport's
 * buffers.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

comm_tree comm_tree_heap(const comm_group *g, int root) {
  int p = g->size, v = (g->rank - root + p) % p;
  comm_tree t = {.parent = v ? ((v - 1) / 2 + root) % p : -1, .kids = {-1, -1}};
  for (int k = 0; k < 2; k++)
    if (2 * v + k + 1 < p) t.kids[k] = (2 * v + k + 1 + root) % p;
  return t;
}

fl_status tree_reduce_chunk(const comm_group *g, const comm_tree *t, float *data, size_t cnt,
                            float *tmp) {
  for (int k = 0; k < 2; k++) {
    if (t->kids[k] < 0) continue;
    int kid = comm_group_peer(g, t->kids[k]);
    fl_status st = comm_host_exchange_reduce(g->h, kid, NULL, 0, kid, data, cnt, tmp, cnt);
    if (st != FL_OK) return st;
  }
  if (t->parent < 0) return FL_OK;
  return comm_host_send(g->h, comm_group_peer(g, t->parent), data, cnt * sizeof(float));
}

fl_status tree_broadcast_chunk(const comm_group *g, const comm_tree *t, uint8_t *data,
                               size_t bytes) {
  fl_status st;
  if (t->parent >= 0 && (st = comm_host_recv(g->h, comm_group_peer(g, t->parent), data, bytes)) != FL_OK)
    return st;
  for (int k = 0; k < 2; k++)
    if (t->kids[k] >= 0 && (st = comm_host_send(g->h, comm_group_peer(g, t->kids[k]), data, bytes)) != FL_OK)
      return st;
  return FL_OK;
}

fl_status tree_broadcast_bytes(const comm_group *g, int root, uint8_t *data, size_t bytes) {
  if (g->size == 1 || bytes == 0) return FL_OK;
  comm_tree t = comm_tree_heap(g, root);
  for (size_t at = 0; at < bytes; at += COMM_CHUNK_BYTES) {
    size_t cnt = bytes - at < COMM_CHUNK_BYTES ? bytes - at : COMM_CHUNK_BYTES;
    fl_status st = tree_broadcast_chunk(g, &t, data + at, cnt);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}
