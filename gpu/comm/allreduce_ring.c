/*
 * gpu/comm/allreduce_ring.c: ring allreduce, as a reduce-scatter followed by an allgather
 * around the ring rank -> rank+1. The message is cut into p blocks by the uneven rule of
 * comm_block_*; each of the 2(p-1) steps is one full-duplex exchange of one block with the
 * two neighbours, so every link carries data in every step and each rank sends
 * 2(p-1)/p x n elements in all, the least any allreduce can (bandwidth-optimal). The price
 * is 2(p-1) latencies, which is why small messages go to the tree.
 *
 * Each reduce-scatter step sums the block it receives in 256 KB pieces as they arrive, while
 * its own send goes on and while the piece is in cache (a whole block received first and
 * summed after would go through memory twice and stop the link meanwhile).
 * Setup (the block table) is computed once per call before any byte moves; the reduce-scatter
 * half is shared with fl_comm_reduce_scatter and the allgather half with fl_comm_allgather.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

/* Received data is summed in pieces of this many bytes, small enough to stay in L2. */
#define COMM_RING_PIECE (256u << 10)

static int mod(int a, int p) { return ((a % p) + p) % p; }

fl_status ring_reduce_scatter(comm_host *h, int rank, int size, void *data_, size_t n, comm_dtype type) {
  if (size == 1 || n == 0) return FL_OK;
  int next = mod(rank + 1, size), prev = mod(rank - 1, size);
  size_t es = comm_dtype_size(type), piece = COMM_RING_PIECE / es;
  uint8_t *data = data_;
  void *tmp = NULL;
  fl_status st = comm_host_scratch(h, 1, COMM_RING_PIECE, &tmp);
  if (st != FL_OK) return st;
  /* Step s sends block rank-s-1 (the partial sum built so far) and receives block rank-s-2,
   * to which it adds its own share; the last step receives block `rank`, now complete. The
   * received block is summed a piece at a time as it arrives, while the send goes on. */
  for (int s = 0; s < size - 1; s++) {
    int sb = mod(rank - s - 1, size), rb = mod(rank - s - 2, size);
    size_t scount = comm_block_count(n, size, sb), rcount = comm_block_count(n, size, rb);
    const uint8_t *sp = data + comm_block_offset(n, size, sb) * es;
    uint8_t *rp = data + comm_block_offset(n, size, rb) * es;
    st = comm_host_ring_step_reduce(h, next, sp, scount * es, prev, rp, type, rcount, tmp, piece);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status ring_allgather_bytes(comm_host *h, int rank, int size, uint8_t *data,
                               const size_t *off, const size_t *len) {
  int next = mod(rank + 1, size), prev = mod(rank - 1, size);
  /* Step s forwards block rank-s (own block first) and receives block rank-s-1. */
  for (int s = 0; s < size - 1; s++) {
    int sb = mod(rank - s, size), rb = mod(rank - s - 1, size);
    fl_status st = comm_host_ring_step(h, next, data + off[sb], len[sb], prev, data + off[rb], len[rb]);
    if (st != FL_OK) return st;
  }
  return FL_OK;
}

fl_status allreduce_ring(comm_host *h, int rank, int size, float *data, size_t n) {
  return allreduce_ring_dtype(h, rank, size, data, n, COMM_F32);
}

fl_status allreduce_ring_dtype(comm_host *h, int rank, int size, void *data, size_t n, comm_dtype type) {
  size_t es = comm_dtype_size(type);
  size_t stack[2 * 16];
  size_t *off = size <= 16 ? stack : common_malloc(2 * sizeof(size_t) * (size_t)size);
  if (!off) return FL_ERR(FL_ENOMEM, "out of memory");
  size_t *len = off + size;
  for (int r = 0; r < size; r++) {
    off[r] = comm_block_offset(n, size, r) * es;
    len[r] = comm_block_count(n, size, r) * es;
  }
  fl_status st = ring_reduce_scatter(h, rank, size, data, n, type);
  if (st == FL_OK) st = ring_allgather_bytes(h, rank, size, (uint8_t *)data, off, len);
  if (off != stack) common_free(off);
  return st;
}
