/*
 * gpu/comm/host.c: the host backend: collectives between ranks (threads or processes) over
 * TCP, on any device. fl_comm_host_create joins the ranks into a mesh (gpu/comm/host_mesh.c);
 * each slot then runs one algorithm on host float buffers (gpu/comm/host_algorithms.h, one
 * file per algorithm) over the transport (gpu/comm/host_transport.h). Collectives on cuda
 * tensors copy the tensor into pinned host memory (dev->ops->host_alloc), run there and copy
 * back, so several ranks may share one GPU.
 *
 * Threading: one thread at a time per communicator (its rank's thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/host_algorithms.h"

static const comm_backend_ops host_ops;

/* One file each (gpu/comm/host_algorithms.h); AUTO is resolved before the lookup. */
static fl_status (*const allreduce_algorithms[FL_ALLREDUCE_ALGO_COUNT])(const comm_group *, float *, size_t) = {
    [FL_ALLREDUCE_RING] = allreduce_ring,
    [FL_ALLREDUCE_HALVING_DOUBLING] = allreduce_halving_doubling,
    [FL_ALLREDUCE_TREE] = allreduce_tree,
    [FL_ALLREDUCE_NAIVE] = allreduce_naive,
    [FL_ALLREDUCE_PARAMETER_SERVER] = allreduce_parameter_server,
    [FL_ALLREDUCE_DOUBLE_TREE] = allreduce_double_tree,
    [FL_ALLREDUCE_BUTTERFLY] = allreduce_butterfly,
    [FL_ALLREDUCE_HIERARCHICAL] = allreduce_hierarchical,
};

FL_API fl_status fl_comm_host_create(fl_comm_endpoint *ep, int rank, int size,
                                     const char *const *addresses, uint32_t timeout_ms,
                                     fl_comm **out) {
  static const char fn[] = "fl_comm_host_create";
  fl_status status = FL_OK;
  comm_host *h = NULL;
  if (!ep || !out || (size > 1 && !addresses)) {
    status = fl_set_error(FL_EINVAL, "%s: NULL argument", fn);
    goto cleanup;
  }
  if (size < 1 || rank < 0 || rank >= size) {
    status = fl_set_error(FL_EINVAL, "%s: rank %d is outside 0..%d", fn, rank, size - 1);
    goto cleanup;
  }
  for (int i = 0; i < size && addresses; i++)
    if (!addresses[i]) {
      status = fl_set_error(FL_EINVAL, "%s: the address of rank %d is NULL", fn, i);
      goto cleanup;
    }
  FL_CHECK(comm_host_connect(ep, rank, size, addresses, timeout_ms, &h));
  comm_cost_model cost;
  FL_CHECK(comm_host_calibrate(h, &cost));
  fl_comm *c;
  FL_CHECK(comm_alloc(&host_ops, rank, size, h, &c));
  comm_set_cost_model(c, &cost);
  h = NULL;
  *out = c;
cleanup:
  comm_host_free(h);
  fl_comm_endpoint_destroy(ep);
  return status;
}

int comm_host_single_copy_peers(const fl_comm *c) {
  if (!c || c->ops != &host_ops) return 0;
  const comm_host *h = c->impl;
  int n = 0;
  for (int i = 0; i < h->size; i++) n += h->single_copy_min && h->single_copy_min[i] > 0;
  return n;
}

int comm_host_shm_peers(const fl_comm *c) {
  if (!c || c->ops != &host_ops) return 0;
  const comm_host *h = c->impl;
  return h->shm_peers;
}

/* ---- staging: a host view of a tensor ---------------------------------------------------- */

/* Host memory holding t's elements: t's own for the cpu device, else a pinned buffer of the
 * tensor's device (slot 0 or 1), filled from the tensor when `fill`. */
static fl_status stage_in(comm_host *h, int slot, const fl_tensor *t, bool fill, float **out) {
  if (t->dev->kind == FL_DEVICE_CPU) {
    *out = t->data;
    return FL_OK;
  }
  size_t bytes = t->numel * sizeof(float);
  if (h->stage_dev[slot] != t->dev || h->stage_cap[slot] < bytes) {
    if (h->stage[slot]) h->stage_dev[slot]->ops->host_free(h->stage_dev[slot], h->stage[slot]);
    h->stage[slot] = NULL;
    h->stage_cap[slot] = 0;
    size_t want = bytes ? bytes : sizeof(float);
    fl_status st = t->dev->ops->host_alloc(t->dev, want, &h->stage[slot]);
    if (st != FL_OK) return st;
    h->stage_dev[slot] = t->dev;
    h->stage_cap[slot] = want;
  }
  if (fill && bytes) {
    fl_status st = t->dev->ops->to_host(t->dev, h->stage[slot], t->data, bytes);
    if (st != FL_OK) return st;
  }
  *out = h->stage[slot];
  return FL_OK;
}

static fl_status stage_out(fl_tensor *t, const float *host) {
  if (t->dev->kind == FL_DEVICE_CPU || t->numel == 0) return FL_OK;
  return t->dev->ops->from_host(t->dev, t->data, host, t->numel * sizeof(float));
}

/* ---- the backend's slots ----------------------------------------------------------------- */

static fl_status host_allreduce(fl_comm *c, fl_tensor *t, fl_reduce_op op) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, true, &data);
  if (st != FL_OK) return st;
  size_t n = t->numel;
  if (c->size > 1 && n > 0) {
    comm_group g = comm_group_all(h);
    st = allreduce_algorithms[comm_pick_algo(c, n * sizeof(float))](&g, data, n);
    if (st != FL_OK) return st;
  }
  if (op == FL_REDUCE_AVG) comm_reduce_scale(data, 1.0f / (float)c->size, n);
  return stage_out(t, data);
}

static fl_status host_allreduce_half(fl_comm *c, uint16_t *data, size_t n, comm_dtype type) {
  if (c->size == 1 || n == 0) return FL_OK;
  comm_group g = comm_group_all(c->impl);
  return allreduce_ring_dtype(&g, data, n, type);
}

static fl_status host_broadcast(fl_comm *c, fl_tensor *t, int root) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, c->rank == root, &data);
  if (st != FL_OK) return st;
  comm_group g = comm_group_all(h);
  st = tree_broadcast_bytes(&g, root, (uint8_t *)data, t->numel * sizeof(float));
  if (st != FL_OK || c->rank == root) return st;
  return stage_out(t, data);
}

static fl_status host_allgather(fl_comm *c, const fl_tensor *in, fl_tensor *out) {
  comm_host *h = c->impl;
  float *src, *dst;
  fl_status st = stage_in(h, 0, in, true, &src);
  if (st == FL_OK) st = stage_in(h, 1, out, false, &dst);
  if (st != FL_OK) return st;
  size_t n = in->numel, bytes = n * sizeof(float);
  size_t *off = common_malloc(2 * sizeof(size_t) * (size_t)c->size);
  if (!off) return FL_ERR(FL_ENOMEM, "out of memory");
  size_t *len = off + c->size;
  for (int r = 0; r < c->size; r++) off[r] = (size_t)r * bytes, len[r] = bytes;
  if (bytes) memmove((uint8_t *)dst + off[c->rank], src, bytes);
  comm_group g = comm_group_all(h);
  st = ring_allgather_bytes(&g, (uint8_t *)dst, off, len);
  common_free(off);
  if (st != FL_OK) return st;
  return stage_out(out, dst);
}

static fl_status host_reduce_scatter(fl_comm *c, const fl_tensor *in, fl_tensor *out,
                                     fl_reduce_op op) {
  comm_host *h = c->impl;
  size_t n = in->numel;
  float *src, *work, *dst;
  fl_status st = stage_in(h, 0, in, true, &src);
  if (st != FL_OK) return st;
  /* The ring reduces in place, and `in` is the caller's: work on a copy. */
  void *w = NULL;
  st = comm_host_scratch(h, 0, n * sizeof(float) + 1, &w);
  if (st != FL_OK) return st;
  work = w;
  if (n) memcpy(work, src, n * sizeof(float));
  comm_group g = comm_group_all(h);
  st = ring_reduce_scatter(&g, work, n, COMM_F32);
  if (st != FL_OK) return st;
  st = stage_in(h, 1, out, false, &dst);
  if (st != FL_OK) return st;
  size_t cnt = comm_block_count(n, c->size, c->rank);
  if (cnt) memcpy(dst, work + comm_block_offset(n, c->size, c->rank), cnt * sizeof(float));
  if (op == FL_REDUCE_AVG) comm_reduce_scale(dst, 1.0f / (float)c->size, cnt);
  return stage_out(out, dst);
}

static fl_status host_alltoall(fl_comm *c, const fl_tensor *in, fl_tensor *out) {
  comm_host *h = c->impl;
  float *src, *dst;
  fl_status st = stage_in(h, 0, in, true, &src);
  if (st == FL_OK) st = stage_in(h, 1, out, false, &dst);
  if (st != FL_OK) return st;
  comm_group g = comm_group_all(h);
  st = host_alltoall_bytes(&g, (const uint8_t *)src, (uint8_t *)dst, in->numel / (size_t)c->size * sizeof(float));
  if (st != FL_OK) return st;
  return stage_out(out, dst);
}

static fl_status host_send(fl_comm *c, const fl_tensor *t, int peer) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, true, &data);
  if (st != FL_OK) return st;
  return comm_host_send(h, peer, data, t->numel * sizeof(float));
}

static fl_status host_recv(fl_comm *c, fl_tensor *t, int peer) {
  comm_host *h = c->impl;
  float *data;
  fl_status st = stage_in(h, 0, t, false, &data);
  if (st != FL_OK) return st;
  st = comm_host_recv(h, peer, data, t->numel * sizeof(float));
  if (st != FL_OK) return st;
  return stage_out(t, data);
}

static fl_status host_barrier_slot(fl_comm *c) {
  comm_group g = comm_group_all(c->impl);
  return host_barrier(&g);
}

/* Split: every member listens on a fresh endpoint; (color, key, rank, address) records go
 * around the parent by allgather; members of one color form their mesh as any group does. */
typedef struct split_record {
  int32_t color, key, rank, pad;
  char address[96];
} split_record;

static int split_cmp(const void *a, const void *b) {
  const split_record *x = a, *y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static fl_status host_split(fl_comm *c, int color, int key, fl_comm **out) {
  comm_host *h = c->impl;
  fl_status status = FL_OK;
  fl_comm_endpoint *ep = NULL;
  split_record *all = NULL;
  size_t *off = NULL;
  const char **addrs = NULL;
  *out = NULL;
  if (color >= 0) FL_CHECK(fl_comm_listen(h->host, &ep));
  all = common_calloc((size_t)c->size, sizeof *all);
  off = common_malloc(2 * sizeof(size_t) * (size_t)c->size);
  addrs = common_calloc((size_t)c->size, sizeof *addrs);
  if (!all || !off || !addrs) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a split");
    goto cleanup;
  }
  split_record *mine = &all[c->rank];
  mine->color = color, mine->key = key, mine->rank = c->rank;
  if (ep) snprintf(mine->address, sizeof mine->address, "%s", fl_comm_endpoint_address(ep));
  size_t *len = off + c->size;
  for (int r = 0; r < c->size; r++) off[r] = (size_t)r * sizeof *all, len[r] = sizeof *all;
  comm_group g = comm_group_all(h);
  FL_CHECK(ring_allgather_bytes(&g, (uint8_t *)all, off, len));
  if (color < 0) goto cleanup;
  int n = 0;
  for (int r = 0; r < c->size; r++)
    if (all[r].color == color) all[n++] = all[r];
  qsort(all, (size_t)n, sizeof *all, split_cmp);
  int sub_rank = -1;
  for (int i = 0; i < n; i++) {
    all[i].address[sizeof all[i].address - 1] = '\0';
    addrs[i] = all[i].address;
    if (all[i].rank == c->rank) sub_rank = i;
  }
  FL_ASSERT(sub_rank >= 0);
  fl_comm *sub;
  status = fl_comm_host_create(ep, sub_rank, n, addrs, h->connect_timeout_ms, &sub);
  ep = NULL; /* taken */
  if (status != FL_OK) goto cleanup;
  sub->algo = c->algo;
  *out = sub;
cleanup:
  fl_comm_endpoint_destroy(ep);
  common_free(addrs);
  common_free(off);
  common_free(all);
  return status;
}

static void host_abort(fl_comm *c) {
  comm_host *h = c->impl;
  comm_host_shm_close(h); /* peers sleeping on a ring wake at once */
  for (int i = 0; i < h->size; i++)
    if (h->fds[i] >= 0) shutdown(h->fds[i], SHUT_RDWR);
}

static void host_destroy(fl_comm *c) { comm_host_free(c->impl); }

static const comm_backend_ops host_ops = {
    .name = "host",
    .allreduce = host_allreduce,
    .allreduce_half = host_allreduce_half,
    .broadcast = host_broadcast,
    .allgather = host_allgather,
    .reduce_scatter = host_reduce_scatter,
    .alltoall = host_alltoall,
    .send = host_send,
    .recv = host_recv,
    .barrier = host_barrier_slot,
    .split = host_split,
    .abort = host_abort,
    .destroy = host_destroy,
};
