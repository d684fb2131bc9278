/*
 * gpu/comm/backend.h: what a comm backend implements, private to gpu/comm/: the communicator
 * (struct fl_comm) and its operation table. gpu/comm/comm.c checks every argument and then
 * calls the slots; the backends are gpu/comm/host.c and gpu/comm/nccl.c.
 *
 * Threading: every slot of comm_backend_ops blocks until this rank's part of the collective
 * is done, except abort and destroy (below).
 */
#ifndef FLINT_GPU_COMM_BACKEND_H
#define FLINT_GPU_COMM_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "flint/gpu.h"
#include "gpu/comm/comm.h"
#include "gpu/comm/cost_model.h"

#define COMM_AUTO_PICKS 8

typedef struct comm_backend_ops {
  const char *name; /* "host", "nccl" */
  /* Each slot gets arguments already checked by gpu/comm/comm.c (sizes match, ranks in range,
   * peer != self, every tensor on the communicator's kind of device). All block. */
  /* The host backend runs comm_pick_algo(comm, bytes); NCCL picks its own. */
  fl_status (*allreduce)(fl_comm *comm, fl_tensor *t, fl_reduce_op op);
  /* comm_allreduce_half: 16-bit floats in host memory; NULL where unsupported. */
  fl_status (*allreduce_half)(fl_comm *comm, uint16_t *data, size_t n, comm_dtype type);
  fl_status (*broadcast)(fl_comm *comm, fl_tensor *t, int root);
  fl_status (*allgather)(fl_comm *comm, const fl_tensor *in, fl_tensor *out);
  fl_status (*reduce_scatter)(fl_comm *comm, const fl_tensor *in, fl_tensor *out,
                              fl_reduce_op op);
  fl_status (*alltoall)(fl_comm *comm, const fl_tensor *in, fl_tensor *out);
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
  /* AUTO's cost model: the defaults from comm_alloc, the measured figures for host groups
   * (gpu/comm/calibrate.c); the same on every rank. */
  comm_cost_model cost;
  /* AUTO's recent picks by size (comm_pick_algo): the model's argmin costs 60-110 ns, a third
   * of an 8-byte allreduce of 2 ranks, and trainers ask for the same few bucket sizes every
   * step. An entry is one word, (bytes + 1) << 8 | algorithm, so that a thread reading it
   * while another writes sees a whole entry, old or new; 0 is empty. Cleared whenever `cost`
   * changes (comm_set_cost_model). */
  _Atomic uint64_t auto_picks[COMM_AUTO_PICKS];
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

#endif /* FLINT_GPU_COMM_BACKEND_H */
