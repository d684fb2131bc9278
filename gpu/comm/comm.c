/*
 * gpu/comm/comm.c: the public collectives. Every entry point checks its arguments here, in one
 * place, returns the communicator's sticky failure if it has one, and dispatches to the
 * backend's vtable (host: gpu/comm/host.c, nccl: gpu/comm/nccl.c). A backend failure is
 * kept on the handle, and the backend is asked to abort its connections so that the other
 * ranks fail at once instead of waiting for this one.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/comm.h"
#include "gpu/comm/cost_model.h"

#ifndef FLINT_HAVE_CUDA
/* Built without nvcc: the NCCL backend exists in the API and says why it cannot be used. */
FL_API fl_status fl_comm_nccl_unique_id(uint8_t id[FL_NCCL_ID_BYTES]) {
  (void)id;
  return fl_set_error(FL_EDEVICE, "fl_comm_nccl_unique_id: flint was built without CUDA, so "
                      "the NCCL backend is not available (use the host backend: "
                      "fl_comm_listen and fl_comm_host_create)");
}
FL_API fl_status fl_comm_nccl_create(fl_device *dev, int rank, int size,
                                     const uint8_t id[FL_NCCL_ID_BYTES], fl_comm **out) {
  (void)dev, (void)rank, (void)size, (void)id, (void)out;
  return fl_set_error(FL_EDEVICE, "fl_comm_nccl_create: flint was built without CUDA, so "
                      "the NCCL backend is not available (use the host backend: "
                      "fl_comm_listen and fl_comm_host_create)");
}
#endif

static const char *const algo_names[FL_ALLREDUCE_ALGO_COUNT] = {
    "auto", "ring", "halving-doubling", "tree", "naive", "parameter-server", "double-tree",
    "butterfly", "hierarchical"};

FL_API fl_status fl_allreduce_algo_parse(const char *text, fl_allreduce_algo *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "fl_allreduce_algo_parse: NULL argument");
  for (int i = 0; i < (int)(sizeof algo_names / sizeof *algo_names); i++)
    if (strcmp(text, algo_names[i]) == 0) {
      *out = (fl_allreduce_algo)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown allreduce algorithm '%s' (expected auto, ring, "
                      "halving-doubling, tree, naive, parameter-server, double-tree, butterfly "
                      "or hierarchical)", text);
}

FL_API const char *fl_allreduce_algo_name(fl_allreduce_algo algo) {
  if ((int)algo < 0 || (int)algo >= (int)(sizeof algo_names / sizeof *algo_names)) return "unknown";
  return algo_names[algo];
}

/* ---- handles ---------------------------------------------------------------------------- */
fl_status comm_alloc(const comm_backend_ops *ops, int rank, int size, void *impl,
                     fl_comm **out) {
  fl_comm *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "out of memory for a communicator");
  c->ops = ops;
  c->rank = rank;
  c->size = size;
  c->algo = FL_ALLREDUCE_AUTO;
  comm_cost_model_init(&c->cost, size);
  c->impl = impl;
  *out = c;
  return FL_OK;
}

FL_API void fl_comm_destroy(fl_comm *comm) {
  if (!comm) return;
  comm->ops->destroy(comm);
  common_free(comm);
}

FL_API int fl_comm_rank(const fl_comm *comm) { return comm ? comm->rank : -1; }
FL_API int fl_comm_size(const fl_comm *comm) { return comm ? comm->size : 0; }
FL_API const char *fl_comm_backend(const fl_comm *comm) { return comm ? comm->ops->name : "(null)"; }

FL_API fl_status fl_comm_set_allreduce_algo(fl_comm *comm, fl_allreduce_algo algo) {
  if (!comm) return fl_set_error(FL_EINVAL, "fl_comm_set_allreduce_algo: comm is NULL");
  if ((int)algo < FL_ALLREDUCE_AUTO || (int)algo >= FL_ALLREDUCE_ALGO_COUNT)
    return fl_set_error(FL_EINVAL, "fl_comm_set_allreduce_algo: unknown algorithm %d", (int)algo);
  comm->algo = algo;
  return FL_OK;
}

/* ---- checks: every public call's arguments are checked here ----------------------------- */

/* The communicator is usable: not NULL and not broken by an earlier failure. */
static fl_status check_comm(fl_comm *comm, const char *fn) {
  if (!comm) return fl_set_error(FL_EINVAL, "%s: comm is NULL", fn);
  if (comm->error != FL_OK)
    return fl_set_error(comm->error, "%s: the communicator failed earlier (rank %d of %d): %s", fn,
                        comm->rank, comm->size, comm->error_msg);
  return FL_OK;
}

static fl_status check_tensor(const fl_comm *comm, const fl_tensor *t, const char *fn,
                              const char *what) {
  if (!t) return fl_set_error(FL_EINVAL, "%s: %s is NULL", fn, what);
  if (!t->dev || !t->dev->ops) return fl_set_error(FL_EINVAL, "%s: %s has no device", fn, what);
  if (t->numel > 0 && !t->data) return fl_set_error(FL_EINVAL, "%s: %s has no memory", fn, what);
  if (comm->dev && t->dev != comm->dev)
    return fl_set_error(FL_EINVAL, "%s: %s is on %s but the %s communicator of rank %d uses %s",
                        fn, what, t->dev->name, comm->ops->name, comm->rank, comm->dev->name);
  return FL_OK;
}

static fl_status check_op(fl_reduce_op op, const char *fn) {
  if (op != FL_REDUCE_SUM && op != FL_REDUCE_AVG)
    return fl_set_error(FL_EINVAL, "%s: unknown reduce op %d (expected sum or avg)", fn, (int)op);
  return FL_OK;
}

/* Keeps a backend failure on the handle and breaks the group's connections. */
static fl_status finish(fl_comm *comm, fl_status st, const char *fn) {
  if (st == FL_OK) return FL_OK;
  if (comm->error == FL_OK) {
    comm->error = st;
    snprintf(comm->error_msg, sizeof comm->error_msg, "%s", fl_last_error());
    if (comm->ops->abort) comm->ops->abort(comm);
  }
  return fl_set_error(st, "%s (rank %d of %d): %s", fn, comm->rank, comm->size, comm->error_msg);
}

#define CHECK_RET(call)                                                                      \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    if (s_ != FL_OK) return s_;                                                              \
  } while (0)

FL_API fl_status fl_comm_allreduce(fl_comm *comm, fl_tensor *t, fl_reduce_op op) {
  static const char fn[] = "fl_comm_allreduce";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, t, fn, "tensor"));
  CHECK_RET(check_op(op, fn));
  return finish(comm, comm->ops->allreduce(comm, t, op), fn);
}

fl_status comm_allreduce_half(fl_comm *comm, uint16_t *data, size_t n, comm_half_kind kind) {
  static const char fn[] = "comm_allreduce_half";
  CHECK_RET(check_comm(comm, fn));
  if (n && !data) return fl_set_error(FL_EINVAL, "%s: data is NULL", fn);
  if (kind != COMM_HALF_FP16 && kind != COMM_HALF_BF16)
    return fl_set_error(FL_EINVAL, "%s: unknown 16-bit format %d", fn, (int)kind);
  if (!comm->ops->allreduce_half)
    return fl_set_error(FL_EINVAL, "%s: the %s backend does not allreduce 16-bit host buffers "
                        "(use the host backend)", fn, comm->ops->name);
  return finish(comm, comm->ops->allreduce_half(comm, data, n, (comm_dtype)kind), fn);
}

FL_API fl_status fl_comm_broadcast(fl_comm *comm, fl_tensor *t, int root) {
  static const char fn[] = "fl_comm_broadcast";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, t, fn, "tensor"));
  if (root < 0 || root >= comm->size)
    return fl_set_error(FL_EINVAL, "%s: root %d is outside 0..%d", fn, root, comm->size - 1);
  return finish(comm, comm->ops->broadcast(comm, t, root), fn);
}

FL_API fl_status fl_comm_allgather(fl_comm *comm, const fl_tensor *in, fl_tensor *out) {
  static const char fn[] = "fl_comm_allgather";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, in, fn, "in"));
  CHECK_RET(check_tensor(comm, out, fn, "out"));
  if (in->dev != out->dev)
    return fl_set_error(FL_EINVAL, "%s: in is on %s but out on %s", fn, in->dev->name, out->dev->name);
  if (out->numel != in->numel * (size_t)comm->size)
    return fl_set_error(FL_EINVAL, "%s: out has %zu elements, expected %d ranks x %zu = %zu", fn,
                        out->numel, comm->size, in->numel, in->numel * (size_t)comm->size);
  return finish(comm, comm->ops->allgather(comm, in, out), fn);
}

FL_API fl_status fl_comm_reduce_scatter(fl_comm *comm, const fl_tensor *in, fl_tensor *out,
                                        fl_reduce_op op) {
  static const char fn[] = "fl_comm_reduce_scatter";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, in, fn, "in"));
  CHECK_RET(check_tensor(comm, out, fn, "out"));
  CHECK_RET(check_op(op, fn));
  if (in->dev != out->dev)
    return fl_set_error(FL_EINVAL, "%s: in is on %s but out on %s", fn, in->dev->name, out->dev->name);
  size_t want = comm_block_count(in->numel, comm->size, comm->rank);
  if (out->numel != want)
    return fl_set_error(FL_EINVAL, "%s: out has %zu elements, but rank %d's block of %zu over %d "
                        "ranks has %zu", fn, out->numel, comm->rank, in->numel, comm->size, want);
  return finish(comm, comm->ops->reduce_scatter(comm, in, out, op), fn);
}

FL_API fl_status fl_comm_alltoall(fl_comm *comm, const fl_tensor *in, fl_tensor *out) {
  static const char fn[] = "fl_comm_alltoall";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, in, fn, "in"));
  CHECK_RET(check_tensor(comm, out, fn, "out"));
  if (in->dev != out->dev)
    return fl_set_error(FL_EINVAL, "%s: in is on %s but out on %s", fn, in->dev->name, out->dev->name);
  if (in == out || (in->numel && in->data == out->data))
    return fl_set_error(FL_EINVAL, "%s: in and out are the same memory (use two tensors)", fn);
  if (in->numel % (size_t)comm->size)
    return fl_set_error(FL_EINVAL, "%s: in has %zu elements, not a multiple of the %d ranks", fn,
                        in->numel, comm->size);
  if (out->numel != in->numel)
    return fl_set_error(FL_EINVAL, "%s: out has %zu elements but in has %zu", fn, out->numel, in->numel);
  return finish(comm, comm->ops->alltoall(comm, in, out), fn);
}

static fl_status check_peer(const fl_comm *comm, int peer, const char *fn) {
  if (peer < 0 || peer >= comm->size)
    return fl_set_error(FL_EINVAL, "%s: peer %d is outside 0..%d", fn, peer, comm->size - 1);
  if (peer == comm->rank)
    return fl_set_error(FL_EINVAL, "%s: peer %d is this rank itself", fn, peer);
  return FL_OK;
}

FL_API fl_status fl_comm_send(fl_comm *comm, const fl_tensor *t, int peer) {
  static const char fn[] = "fl_comm_send";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, t, fn, "tensor"));
  CHECK_RET(check_peer(comm, peer, fn));
  return finish(comm, comm->ops->send(comm, t, peer), fn);
}

FL_API fl_status fl_comm_recv(fl_comm *comm, fl_tensor *t, int peer) {
  static const char fn[] = "fl_comm_recv";
  CHECK_RET(check_comm(comm, fn));
  CHECK_RET(check_tensor(comm, t, fn, "tensor"));
  CHECK_RET(check_peer(comm, peer, fn));
  return finish(comm, comm->ops->recv(comm, t, peer), fn);
}

FL_API fl_status fl_comm_barrier(fl_comm *comm) {
  static const char fn[] = "fl_comm_barrier";
  CHECK_RET(check_comm(comm, fn));
  return finish(comm, comm->ops->barrier(comm), fn);
}

FL_API fl_status fl_comm_split(fl_comm *comm, int color, int key, fl_comm **out) {
  static const char fn[] = "fl_comm_split";
  CHECK_RET(check_comm(comm, fn));
  if (!out) return fl_set_error(FL_EINVAL, "%s: out is NULL", fn);
  fl_comm *sub = NULL;
  fl_status st = finish(comm, comm->ops->split(comm, color < 0 ? -1 : color, key, &sub), fn);
  if (st == FL_OK) *out = sub;
  return st;
}
