/*
 * gpu/comm/allreduce_butterfly.c: butterfly allreduce (recursive doubling): in step
 * mask = 1, 2, 4, ... < p' each member exchanges its whole vector with member v ^ mask and
 * adds the partner's into its own; after log2 p' steps every member holds the sum. Each
 * addition is mine + theirs on one side and theirs + mine on the other, the same bits.
 * Other rank counts fold as halving-doubling does: the first 2r members (r = p - p') pair
 * up, each even one sends its vector to its odd neighbour first and gets the sum back last.
 *
 * Steps: log2 p' (+2 when p is not a power of two). Bytes: log2 p' x n sent and received per
 * member (+n each way for the folded pairs), reduces log2 p' x n. The fewest rounds of any
 * algorithm with every member busy, at log2(p') x n bytes: a latency algorithm.
 */
#include <string.h>

#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

fl_status allreduce_butterfly(const comm_group *g, float *data, size_t n) {
  comm_host *h = g->h;
  int p = g->size, r = g->rank;
  if (p == 1 || n == 0) return FL_OK;
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  int rem = p - pof2;
  size_t bytes = n * sizeof(float), piece = COMM_PIECE_BYTES / sizeof(float);
  void *copy = NULL, *tmp = NULL;
  fl_status st = comm_host_scratch(h, 0, bytes, &copy);
  if (st == FL_OK) st = comm_host_scratch(h, 1, COMM_PIECE_BYTES, &tmp);
  if (st != FL_OK) return st;
  /* v: this member's number among the p' that exchange; -1 when folded into r+1. */
  int v = r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem;
  if (r < 2 * rem) {
    if (v < 0) st = comm_host_send(h, comm_group_peer(g, r + 1), data, bytes);
    else st = comm_host_exchange_reduce(h, comm_group_peer(g, r - 1), NULL, 0, comm_group_peer(g, r - 1),
                                        data, n, tmp, piece);
    if (st != FL_OK) return st;
  }
  if (v >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int w = v ^ mask, partner = comm_group_peer(g, w < rem ? 2 * w + 1 : w + rem);
      /* The vector goes out while the partner's is added into it: send a copy. */
      memcpy(copy, data, bytes);
      st = comm_host_exchange_reduce(h, partner, copy, bytes, partner, data, n, tmp, piece);
      if (st != FL_OK) return st;
    }
  }
  if (r < 2 * rem) {
    if (v < 0) st = comm_host_recv(h, comm_group_peer(g, r + 1), data, bytes);
    else st = comm_host_send(h, comm_group_peer(g, r - 1), data, bytes);
  }
  return st;
}
