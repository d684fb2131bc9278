/*
 * gpu/comm/allreduce_hierarchical.c: hierarchical allreduce (Horovod's and NCCL's two-level
 * scheme): the ranks of each host (comm_host.host_of: same kernel and network namespace)
 * first reduce to their host's leader (its lowest rank) by the pipelined binary tree, over
 * the host's own transport (shared memory or loopback); the leaders then allreduce across
 * hosts (the ring from 256 KiB and with two hosts, else the tree: latency decides small
 * messages); last, each leader broadcasts the result to its host by the tree.
 *
 * Steps, with q ranks on a host and h hosts: 2 log2 q chunk hops within the host, plus the
 * ring's 2(h-1) (or the tree's 2 log2 h) across. Bytes across hosts: only the leaders send,
 * 2(h-1)/h x n each with the ring, so the slow links carry h x that in all instead of p x;
 * within a host an inner rank moves 3n, as in the tree. Every rank ends with its leader's
 * bits, and the leaders' are equal (the ring and the tree compute each sum once).
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

#define COMM_HIER_RING_MIN_BYTES (256u << 10)

fl_status allreduce_hierarchical(const comm_group *g, float *data, size_t n) {
  comm_host *h = g->h;
  FL_ASSERT(g->peer == NULL); /* the whole communicator: the mesh's topology */
  int p = g->size;
  if (p == 1 || n == 0) return FL_OK;
  int *local = common_malloc(2 * sizeof(int) * (size_t)p);
  if (!local) return FL_ERR(FL_ENOMEM, "out of memory");
  int *leaders = local + p;
  int nlocal = 0, me = 0, nleaders = 0, my_leader_at = 0;
  for (int r = 0; r < p; r++) {
    if (h->host_of[r] == h->host_of[g->rank]) {
      if (r == g->rank) me = nlocal;
      local[nlocal++] = r;
    }
    if (h->host_of[r] == nleaders) leaders[nleaders++] = r; /* hosts are numbered by lowest rank */
  }
  for (int i = 0; i < nleaders; i++)
    if (leaders[i] == g->rank) my_leader_at = i;
  comm_group host = {.h = h, .rank = me, .size = nlocal, .peer = local};
  comm_group across = {.h = h, .rank = my_leader_at, .size = nleaders, .peer = leaders};
  size_t chunk = COMM_CHUNK_BYTES / sizeof(float);
  void *tmp = NULL;
  fl_status st = comm_host_scratch(h, 1, chunk * sizeof(float), &tmp);
  if (st == FL_OK && nlocal > 1) {
    comm_tree t = comm_tree_heap(&host, 0);
    for (size_t at = 0; at < n && st == FL_OK; at += chunk)
      st = tree_reduce_chunk(&host, &t, data + at, n - at < chunk ? n - at : chunk, tmp);
  }
  if (st == FL_OK && me == 0 && nleaders > 1) {
    bool ring = nleaders == 2 || n * sizeof(float) >= COMM_HIER_RING_MIN_BYTES;
    st = ring ? allreduce_ring(&across, data, n) : allreduce_tree(&across, data, n);
  }
  if (st == FL_OK && nlocal > 1) st = tree_broadcast_bytes(&host, 0, (uint8_t *)data, n * sizeof(float));
  common_free(local);
  return st;
}
