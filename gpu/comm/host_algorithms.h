/*
 * gpu/comm/host_algorithms.h: the host backend's algorithms, private to gpu/comm/: one file
 * each, written on host buffers over the transport (gpu/comm/host_transport.h) and
 * dispatched to by gpu/comm/host.c. docs/collectives.md lists each one's steps and bytes.
 *
 * Every algorithm runs over a comm_group: the members of the mesh that take part, numbered
 * 0..size-1 (the whole communicator, or, inside the hierarchical allreduce, the ranks of one
 * host or the hosts' leaders). Allreduces sum only (avg scales afterwards); every member of
 * the group calls the same one with the same n. Every rank ends with the same bits: each
 * element's sum is computed once and copied, or computed in the same order everywhere, or
 * as pairwise sums a + b = b + a (IEEE addition commutes).
 */
#ifndef FLINT_GPU_COMM_HOST_ALGORITHMS_H
#define FLINT_GPU_COMM_HOST_ALGORITHMS_H

#include "gpu/comm/host_transport.h"

typedef struct comm_group {
  comm_host *h;
  int rank, size;  /* this rank's number in the group, and the group's size */
  const int *peer; /* peer[i]: the mesh rank of member i; NULL: member i is mesh rank i */
} comm_group;

/* The whole communicator as a group. */
static inline comm_group comm_group_all(comm_host *h) {
  return (comm_group){.h = h, .rank = h->rank, .size = h->size, .peer = NULL};
}
/* The mesh rank of member i (i taken modulo the group's size, so i may be negative). */
static inline int comm_group_peer(const comm_group *g, int i) {
  i = ((i % g->size) + g->size) % g->size;
  return g->peer ? g->peer[i] : i;
}

/* Received data is summed in pieces of this many bytes as it arrives, small enough to stay
 * in L2 (a whole block received first and summed after would go through memory twice). */
#define COMM_PIECE_BYTES (256u << 10)
/* Trees pipeline in chunks of this many bytes. */
#define COMM_CHUNK_BYTES (256u << 10)

/* ---- allreduce, one file each: allreduce_<name>.c ---------------------------------------- */
fl_status allreduce_ring(const comm_group *g, float *data, size_t n);
fl_status allreduce_halving_doubling(const comm_group *g, float *data, size_t n);
fl_status allreduce_tree(const comm_group *g, float *data, size_t n);
fl_status allreduce_naive(const comm_group *g, float *data, size_t n);
fl_status allreduce_parameter_server(const comm_group *g, float *data, size_t n);
fl_status allreduce_double_tree(const comm_group *g, float *data, size_t n);
fl_status allreduce_butterfly(const comm_group *g, float *data, size_t n);
fl_status allreduce_hierarchical(const comm_group *g, float *data, size_t n);

/* The ring over elements of any comm_dtype (comm_allreduce_half). */
fl_status allreduce_ring_dtype(const comm_group *g, void *data, size_t n, comm_dtype type);
/* The halves of the ring: after ring_reduce_scatter member r holds block r of the sum
 * (blocks by comm_block_*); ring_allgather_bytes passes every member's block
 * [off[r], off[r]+len[r]) of `data` around the ring. */
fl_status ring_reduce_scatter(const comm_group *g, void *data, size_t n, comm_dtype type);
fl_status ring_allgather_bytes(const comm_group *g, uint8_t *data, const size_t *off,
                               const size_t *len);

/* ---- trees (gpu/comm/tree.c): binary trees given by each member's parent and children ---- */
typedef struct comm_tree {
  int parent;  /* group member, -1 at the root */
  int kids[2]; /* group members, -1 when absent */
} comm_tree;
/* The heap-ordered binary tree rooted at `root`: member v = (rank - root) mod p has children
 * 2v+1 and 2v+2. */
comm_tree comm_tree_heap(const comm_group *g, int root);
/* Sums the chunk [at, at+cnt) of every member's data into the root's, up the tree (tmp:
 * cnt floats of scratch). Members other than the root end with partial sums. */
fl_status tree_reduce_chunk(const comm_group *g, const comm_tree *t, float *data, size_t cnt,
                            float *tmp);
/* Passes `bytes` at data from the root down the tree (recv from the parent, send to the
 * children). */
fl_status tree_broadcast_chunk(const comm_group *g, const comm_tree *t, uint8_t *data,
                               size_t bytes);
/* A whole broadcast from `root`, pipelined in chunks (fl_comm_broadcast, the tree's
 * second half, and the hierarchical allreduce's last step). */
fl_status tree_broadcast_bytes(const comm_group *g, int root, uint8_t *data, size_t bytes);

/* ---- the other collectives (gpu/comm/collectives.c) ----------------------------------------- */
fl_status host_barrier(const comm_group *g);
/* All-to-all: block j of `in` (bytes each) goes to member j; block j of `out` comes from
 * member j. */
fl_status host_alltoall_bytes(const comm_group *g, const uint8_t *in, uint8_t *out, size_t bytes);

#endif /* FLINT_GPU_COMM_HOST_ALGORITHMS_H */
