/*
 * gpu/comm/allreduce_parameter_server.c: the parameter-server pattern as an allreduce (the
 * seeds' sharded server, where every member is the server of one block): member j owns
 * block j (the uneven rule of comm_block_*).
 *   1. push: p-1 rounds; in round k each member sends its block for owner r+k straight to
 *      it while it receives its own block from member r-k, summing as it arrives;
 *   2. pull: p-1 rounds; in round k each owner sends its finished block to r+k while it
 *      receives block r-k from its owner.
 * Steps: 2(p-1). Bytes: the ring's, 2(p-1)/p x n sent and received per member; but every
 * block travels straight between its owner and each worker, so each owner receives from
 * (and serves) all p-1 others: the fan-in that the ring avoids by passing partial sums
 * along. Each block is summed once, by its owner (the same bits everywhere).
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

fl_status allreduce_parameter_server(const comm_group *g, float *data, size_t n) {
  int p = g->size, r = g->rank;
  if (p == 1 || n == 0) return FL_OK;
  size_t piece = COMM_PIECE_BYTES / sizeof(float);
  void *tmp = NULL;
  fl_status st = comm_host_scratch(g->h, 1, COMM_PIECE_BYTES, &tmp);
  if (st != FL_OK) return st;
  float *mine = data + comm_block_offset(n, p, r);
  size_t mine_n = comm_block_count(n, p, r);
  /* Push: rounds receive into the owned block in a fixed order (r-1, r-2, ...). */
  for (int k = 1; k < p && st == FL_OK; k++) {
    int to = (r + k) % p, from = (r - k + p) % p;
    st = comm_host_exchange_reduce(g->h, comm_group_peer(g, to), data + comm_block_offset(n, p, to),
                                   comm_block_count(n, p, to) * sizeof(float), comm_group_peer(g, from),
                                   mine, mine_n, tmp, piece);
  }
  /* Pull: the finished block goes to every member, each owner's block comes back. */
  for (int k = 1; k < p && st == FL_OK; k++) {
    int to = (r + k) % p, from = (r - k + p) % p;
    st = comm_host_exchange(g->h, comm_group_peer(g, to), mine, mine_n * sizeof(float),
                            comm_group_peer(g, from), data + comm_block_offset(n, p, from),
                            comm_block_count(n, p, from) * sizeof(float));
  }
  return st;
}
