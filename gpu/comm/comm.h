/*
 * gpu/comm/comm.h: collectives inside gpu/. The public entry points (gpu/comm/comm.c) validate their
 * arguments in one place, keep a failure on the handle and dispatch to a backend, which is a
 * small vtable with a name: "host" (TCP between ranks, gpu/comm/host.c) and "nccl"
 * (gpu/comm/nccl.c, only when CUDA is built).
 *
 * The host backend's algorithms are written once against a tiny transport (comm_host_*):
 * blocking send and receive of bytes to one peer, and a full-duplex exchange that sends to
 * one peer while it receives from another (what a ring step needs). The algorithms work on
 * host float buffers; comm_host.c stages cuda tensors through pinned host memory around them.
 *
 * Threading: a communicator is used by one thread at a time (its rank's thread, or the rank's
 * communication thread while that holds it: gpu/comm/worker.h). Every slot of
 * comm_backend_ops blocks until this rank's part of the collective is done.
 */
#ifndef FLINT_GPU_COMM_H
#define FLINT_GPU_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"
#include "gpu/device/device.h"

typedef struct comm_backend_ops {
  const char *name; /* "host", "nccl" */
  /* Each slot gets arguments already checked by gpu/comm/comm.c (sizes match, ranks in range,
   * peer != self, every tensor on the communicator's kind of device). All block. */
  fl_status (*allreduce)(fl_comm *comm, fl_tensor *t, fl_reduce_op op, fl_allreduce_algo algo);
  fl_status (*broadcast)(fl_comm *comm, fl_tensor *t, int root);
  fl_status (*allgather)(fl_comm *comm, const fl_tensor *in, fl_tensor *out);
  fl_status (*reduce_scatter)(fl_comm *comm, const fl_tensor *in, fl_tensor *out,
                              fl_reduce_op op);
  fl_status (*send)(fl_comm *comm, const fl_tensor *t, int peer);
  fl_status (*recv)(fl_comm *comm, fl_tensor *t, int peer);
  fl_status (*barrier)(fl_comm *comm);
  /* Collective over comm; *out NULL for a negative color. */
  fl_status (*split)(fl_comm *comm, int color, int key, fl_comm **out);
  /* Called once when a collective failed on this rank: breaks the connections so that the
   * peers fail at once (FL_EPEER) instead of waiting for a rank that has left. Never blocks. */
  void (*abort)(fl_comm *comm);
  /* Frees impl. Never blocks on peers (sockets are closed, not drained). */
  void (*destroy)(fl_comm *comm);
} comm_backend_ops;

struct fl_comm {
  const comm_backend_ops *ops;
  int rank, size;
  fl_allreduce_algo algo;
  fl_device *dev; /* nccl: the rank's GPU, every tensor must be on it; host: NULL (any) */
  /* Sticky failure: once a collective fails for a reason other than bad arguments, every
   * later call returns `error` with `error_msg`. */
  fl_status error;
  char error_msg[384];
  void *impl;
};

/* Makes a communicator shell for a backend (impl set by the caller). */
fl_status comm_alloc(const comm_backend_ops *ops, int rank, int size, void *impl,
                     fl_comm **out);

/* The AUTO rule (gpu/comm/comm.c): which host algorithm serves `bytes` over `size` ranks. */
fl_allreduce_algo comm_auto_algo(size_t bytes, int size, bool single_copy);

/* ---- the host transport (gpu/comm/host.c) --------------------------------------------- */
typedef struct comm_host comm_host;

/* TCP_NODELAY and FLINT_COMM_SOCKBUF-sized buffers: what every comm socket gets (the
 * benchmark's point-to-point baseline uses it too). */
void comm_host_socket_options(int fd);

/* Blocking transfers of exactly `bytes` to/from `peer`. FL_EPEER when the peer closed,
 * FL_ENET on a socket error, FL_ETIMEDOUT when no byte moved for the operation timeout;
 * each message names the peer rank. */
fl_status comm_host_send(comm_host *h, int peer, const void *buf, size_t bytes);
fl_status comm_host_recv(comm_host *h, int peer, void *buf, size_t bytes);
/* Sends sbytes to send_peer while receiving rbytes from recv_peer, without deadlock even
 * when both peers do the same to us (the two peers may be the same rank). */
fl_status comm_host_exchange(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                             int recv_peer, void *rbuf, size_t rbytes);
/* As exchange, but the rcount floats received are added into `sum`, a piece of
 * piece_floats at a time through `tmp` (piece_floats long) as soon as the piece is in, while
 * the send goes on: the reduction overlaps the transfer and reads the data while in cache. */
fl_status comm_host_exchange_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                    int recv_peer, float *sum, size_t rcount, float *tmp,
                                    size_t piece_floats);
/* A ring step: exchange (or exchange_reduce) where every rank of the step calls the same
 * function, sending to the rank that receives from it by this function too. Only then may
 * a half move by a single copy (the receiver reads the sender's buffer, see comm_host.c):
 * the receiving end must expect the sender's descriptor instead of the data. */
fl_status comm_host_ring_step(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                              int recv_peer, void *rbuf, size_t rbytes);
fl_status comm_host_ring_step_reduce(comm_host *h, int send_peer, const void *sbuf, size_t sbytes,
                                     int recv_peer, float *sum, size_t rcount, float *tmp,
                                     size_t piece_floats);
/* How many peers this rank's ring steps reach by a single copy (0 on other backends). */
int comm_host_single_copy_peers(const fl_comm *c);
/* A scratch buffer of at least `bytes` owned by the transport (grown on demand, kept for
 * the communicator's life). Slot 0 and 1 are separate buffers. */
fl_status comm_host_scratch(comm_host *h, int slot, size_t bytes, void **out);

/* ---- reduction kernels (gpu/comm/host.c), vectorized ---------------------------------- */
void comm_reduce_add(float *restrict dst, const float *restrict src, size_t n);
void comm_reduce_scale(float *dst, float a, size_t n);

/* ---- the algorithms, on host float buffers, sum only (avg scales afterwards) ----------- */
/* The uneven block rule of reduce_scatter: block r of n over p is n/p elements, plus one
 * when r < n % p. */
static inline size_t comm_block_count(size_t n, int p, int r) {
  return n / (size_t)p + ((size_t)r < n % (size_t)p ? 1 : 0);
}
static inline size_t comm_block_offset(size_t n, int p, int r) {
  size_t q = n / (size_t)p, m = n % (size_t)p;
  return q * (size_t)r + ((size_t)r < m ? (size_t)r : m);
}

/* gpu/comm/allreduce_ring.c */
fl_status allreduce_ring(comm_host *h, int rank, int size, float *data, size_t n);
/* The halves of the ring: after ring_reduce_scatter rank r holds block r of the sum (blocks
 * by comm_block_*); ring_allgather_bytes passes every rank's block [off[r], off[r]+len[r])
 * of `data` around the ring. */
fl_status ring_reduce_scatter(comm_host *h, int rank, int size, float *data, size_t n);
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

#endif /* FLINT_GPU_COMM_H */
