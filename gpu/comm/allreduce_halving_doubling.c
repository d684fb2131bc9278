/*
 * gpu/comm/allreduce_halving_doubling.c: recursive halving-doubling allreduce (Rabenseifner;
 * gloo's allreduce_halving_doubling). Over p' = the largest power of two <= p ranks:
 * log2(p') halving steps, each exchanging half of the rank's current range with the partner
 * rank ^ mask and summing the half it keeps (a reduce-scatter), then log2(p') doubling steps
 * in reverse order that trade the finished halves back (an allgather). Each rank sends
 * 2(p'-1)/p' x n elements in 2 log2(p') steps: the ring's bytes in far fewer steps.
 *
 * Other rank counts: the first 2r ranks (r = p - p') pair up before the halving; each even
 * one sends its whole vector to its odd neighbour and sits out, and gets the result back
 * from it at the end (2n more bytes for those pairs, two more latencies).
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

/* The group member numbered `v` among the p' that take part. */
static int member(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }

fl_status allreduce_halving_doubling(const comm_group *g, float *data, size_t n) {
  comm_host *h = g->h;
  int rank = g->rank, size = g->size;
  if (size == 1 || n == 0) return FL_OK;
  int pof2 = 1, steps = 0;
  while (pof2 * 2 <= size) pof2 *= 2, steps++;
  int rem = size - pof2;
  void *scratch = NULL;
  size_t piece = COMM_PIECE_BYTES / sizeof(float);
  fl_status st = comm_host_scratch(h, 1, piece * sizeof(float), &scratch);
  if (st != FL_OK) return st;
  float *tmp = scratch;

  /* Setup: this rank's number among the participants (-1: folded into rank+1). */
  int v;
  if (rank < 2 * rem) v = rank % 2 ? rank / 2 : -1;
  else v = rank - rem;

  if (rank < 2 * rem) {
    if (v < 0) {
      st = comm_host_send(h, comm_group_peer(g, rank + 1), data, n * sizeof(float));
    } else {
      st = comm_host_exchange_reduce(h, comm_group_peer(g, rank - 1), NULL, 0, comm_group_peer(g, rank - 1), data, n, tmp, piece);
    }
    if (st != FL_OK) return st;
  }

  if (v >= 0) {
    size_t lo_at[32], hi_at[32];
    size_t lo = 0, hi = n;
    int step = 0;
    for (int mask = pof2 / 2; mask >= 1; mask >>= 1, step++) {
      int partner = comm_group_peer(g, member(v ^ mask, rem));
      size_t mid = lo + (hi - lo) / 2;
      size_t klo = v & mask ? mid : lo, khi = v & mask ? hi : mid; /* the half kept */
      size_t slo = v & mask ? lo : mid, shi = v & mask ? mid : hi; /* the half given */
      lo_at[step] = lo, hi_at[step] = hi;
      st = comm_host_exchange_reduce(h, partner, data + slo, (shi - slo) * sizeof(float), partner,
                                     data + klo, khi - klo, tmp, piece);
      if (st != FL_OK) return st;
      lo = klo, hi = khi;
    }
    /* Doubling: undo the steps in reverse, trading the finished range for the partner's. */
    for (int mask = 1; mask < pof2; mask <<= 1) {
      step--;
      int partner = comm_group_peer(g, member(v ^ mask, rem));
      size_t plo = lo == lo_at[step] ? hi : lo_at[step];
      size_t phi = lo == lo_at[step] ? hi_at[step] : lo;
      st = comm_host_exchange(h, partner, data + lo, (hi - lo) * sizeof(float), partner,
                              data + plo, (phi - plo) * sizeof(float));
      if (st != FL_OK) return st;
      lo = lo_at[step], hi = hi_at[step];
    }
    FL_ASSERT(step == 0 && steps >= 0);
  }

  if (rank < 2 * rem) {
    if (v < 0) st = comm_host_recv(h, comm_group_peer(g, rank + 1), data, n * sizeof(float));
    else st = comm_host_send(h, comm_group_peer(g, rank - 1), data, n * sizeof(float));
  }
  return st;
}
