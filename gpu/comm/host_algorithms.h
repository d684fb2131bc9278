/*
 * gpu/comm/host_algorithms.h: the host backend's algorithms, private to gpu/comm/: one file
 * each, written on host float buffers over the transport (gpu/comm/host_transport.h) and
 * dispatched to by gpu/comm/host.c. docs/collectives.md lists each one's steps and bytes.
 * Allreduces sum only (avg scales afterwards); every rank of the group calls the same one.
 */
#ifndef FLINT_GPU_COMM_HOST_ALGORITHMS_H
#define FLINT_GPU_COMM_HOST_ALGORITHMS_H

#include "gpu/comm/host_transport.h"

/* gpu/comm/allreduce_ring.c */
fl_status allreduce_ring(comm_host *h, int rank, int size, float *data, size_t n);
/* The halves of the ring: after ring_reduce_scatter rank r holds block r of the sum (blocks
 * by comm_block_*); ring_allgather_bytes passes every rank's block [off[r], off[r]+len[r])
 * of `data` around the ring. */
fl_status ring_reduce_scatter(comm_host *h, int rank, int size, void *data, size_t n, comm_dtype type);
/* The ring over elements of any comm_dtype (comm_allreduce_half). */
fl_status allreduce_ring_dtype(comm_host *h, int rank, int size, void *data, size_t n, comm_dtype type);
fl_status ring_allgather_bytes(comm_host *h, int rank, int size, uint8_t *data,
                               const size_t *off, const size_t *len);
/* gpu/comm/allreduce_halving_doubling.c */
fl_status allreduce_halving_doubling(comm_host *h, int rank, int size, float *data, size_t n);
/* gpu/comm/allreduce_tree.c */
fl_status allreduce_tree(comm_host *h, int rank, int size, float *data, size_t n);
/* Pipelined binary-tree broadcast of bytes from root (used by broadcast and the tree). */
fl_status tree_broadcast_bytes(comm_host *h, int rank, int size, int root, uint8_t *data,
                               size_t bytes);

/* gpu/comm/collectives.c: the host backend's other collectives on host buffers. */
fl_status host_barrier(comm_host *h, int rank, int size);

#endif /* FLINT_GPU_COMM_HOST_ALGORITHMS_H */
