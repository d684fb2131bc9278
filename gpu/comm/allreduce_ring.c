/*
 * gpu/comm/allreduce_ring.c: ring allreduce (Patarasuk and Yuan; Baidu's, Horovod's), as a
 * reduce-scatter followed by an allgather around the ring member -> member+1. The message is
 * cut into p blocks by the uneven rule of comm_block_*.
 *
 * Steps: 2(p-1), each one full-duplex exchange of one block with the two neighbours, so
 * every link carries data in every step. Bytes: each member sends and receives
 * 2(p-1)/p x n, the least any allreduce can (bandwidth-optimal); reduces (p-1)/p x n. The
 * price is 2(p-1) latencies, which is why small messages go elsewhere.
 *
 * Each reduce-scatter step sums the block it receives a piece at a time as it arrives
 * (COMM_PIECE_BYTES), while its own send goes on and while the piece is in cache. Ring steps
 * are the one place the transport may move a half by a single copy (comm_host_ring_step).
 * The reduce-scatter half is shared with fl_comm_reduce_scatter, the allgather half with
 * fl_comm_allgather, and the ring over 16-bit elements with comm_allreduce_half.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

static int mod(int a, int p) { return ((a % p) + p) % p; }

fl_status ring_reduce_scatter(const comm_group *g, void *data_, size_t n, comm_dtype type) {
  int p = g->size, rank = g->rank;
  if (p == 1 || n == 0) return FL_OK;
  int next = comm_group_peer(g, rank + 1), prev = comm_group_peer(g, rank - 1);
  size_t es = comm_dtype_size(type), piece = COMM_PIECE_BYTES / es;
  uint8_t *data = data_;
  void *tmp = NULL;
  fl_status st = comm_host_scratch(g->h, 1, COMM_PIECE_BYTES, &tmp);
  if (st != FL_OK) return st;
  /* Step s sends block rank-s-1 (the partial sum built so far) and receives block rank-s-2,
   * to which it adds its own share; the last step receives block `rank`, now complete. */
  for (int s = 0; s < p - 1; s++) {
    int sb = mod(rank - s - 1, p), rb = mod(rank - s - 2, p);
    size_t scount = comm_block_count(n, p, sb), rcount = comm_block_count(n, p, rb);
    const uint8_t *sp = data + comm_block_offset(n, p, sb) * es;
    uint8_t *rp = data + comm_block_offset(n, p, rb) * es;
    st = comm_host_ring_step_reduce(g->h, next, sp, scount * es, prev, rp, type, rcount, tmp, piece);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status ring_allgather_bytes(const comm_group *g, uint8_t *data, const size_t *off,
                               const size_t *len) {
  int p = g->size, rank = g->rank;
  int next = comm_group_peer(g, rank + 1), prev = comm_group_peer(g, rank - 1);
  /* Step s forwards block rank-s (own block first) and receives block rank-s-1. */
  for (int s = 0; s < p - 1; s++) {
    int sb = mod(rank - s, p), rb = mod(rank - s - 1, p);
    fl_status st = comm_host_ring_step(g->h, next, data + off[sb], len[sb], prev, data + off[rb], len[rb]);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status allreduce_ring_dtype(const comm_group *g, void *data, size_t n, comm_dtype type) {
  int p = g->size;
  if (p == 1 || n == 0) return FL_OK;
  size_t es = comm_dtype_size(type);
  size_t stack[2 * 16];
  size_t *off = p <= 16 ? stack : common_malloc(2 * sizeof(size_t) * (size_t)p);
  if (!off) return FL_ERR(FL_ENOMEM, "out of memory");
  size_t *len = off + p;
  for (int r = 0; r < p; r++) {
    off[r] = comm_block_offset(n, p, r) * es;
    len[r] = comm_block_count(n, p, r) * es;
  }
  fl_status st = ring_reduce_scatter(g, data, n, type);
  if (st == FL_OK) st = ring_allgather_bytes(g, (uint8_t *)data, off, len);
  if (off != stack) common_free(off);
  return st;
}

fl_status allreduce_ring(const comm_group *g, float *data, size_t n) {
  return allreduce_ring_dtype(g, data, n, COMM_F32);
}
