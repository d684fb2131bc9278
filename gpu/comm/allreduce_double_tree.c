/*
 * gpu/comm/allreduce_double_tree.c: double binary tree allreduce (NCCL 2.4's): two binary
 * trees over the same members, each reducing and broadcasting half of the message. Tree A
 * is the in-order tree of the member numbers: 0 is the root with one child (the largest
 * power of two below p), and member i > 0 with lowest set bit b has children i - b/2 and
 * i + b/2 (that one halved further while it is past p), so every odd member is a leaf.
 * Tree B is tree A over the members shifted by one (member m takes the place of m+1 mod p),
 * so the even members are B's leaves: nearly every member is a leaf in one tree and inner
 * in the other, and the two trees' inner links carry what one tree's inner links would.
 *
 * Both trees are pipelined together in chunks (COMM_CHUNK_BYTES): reduce A's chunk k, then
 * B's, then chunk k+1; then the broadcasts in the same order. Every member runs the steps in
 * that one order, and a step waits only on steps before it, so the interleaving cannot
 * deadlock even when a send waits for its receiver.
 *
 * Steps: 2 ceil(log2 p) + 2(n/chunk - 1) chunk hops (each tree is about log2 p deep). Bytes:
 * a member inner in one tree and a leaf in the other sends and receives about
 * 3n/2 + n/2 = 2n, where the single tree's inner members move 3n: the tree's latency with
 * the load spread over every member.
 */
#include "common/common.h"
#include "gpu/comm/host_algorithms.h"

/* The children of index i in the in-order tree over 0..p-1 (-1 when absent). */
static void inorder_kids(int i, int p, int kids[2]) {
  kids[0] = kids[1] = -1;
  if (i == 0) {
    int top = 1;
    while (top * 2 < p) top *= 2;
    if (p > 1) kids[1] = top;
    return;
  }
  int b = i & -i;
  if (b == 1) return;
  kids[0] = i - b / 2;
  int h = b / 2;
  while (h >= 1 && i + h >= p) h /= 2;
  if (h >= 1) kids[1] = i + h;
}

/* Member m's place in tree A (shift 0) or B (shift 1), as group members. */
static comm_tree double_tree_of(const comm_group *g, int shift) {
  int p = g->size, me = (g->rank + shift) % p;
  comm_tree t = {.parent = -1, .kids = {-1, -1}};
  int kids[2];
  inorder_kids(me, p, kids);
  for (int k = 0; k < 2; k++)
    if (kids[k] >= 0) t.kids[k] = (kids[k] - shift + p) % p;
  /* The parent is the index whose children include this one (p is small beside n). */
  for (int j = 0; j < p && me != 0; j++) {
    inorder_kids(j, p, kids);
    if (kids[0] == me || kids[1] == me) t.parent = (j - shift + p) % p;
  }
  FL_ASSERT(me == 0 || t.parent >= 0);
  return t;
}

fl_status allreduce_double_tree(const comm_group *g, float *data, size_t n) {
  if (g->size == 1 || n == 0) return FL_OK;
  comm_tree tree[2] = {double_tree_of(g, 0), double_tree_of(g, 1)};
  size_t half[2] = {n / 2, n - n / 2};
  float *part[2] = {data, data + n / 2};
  size_t chunk = COMM_CHUNK_BYTES / sizeof(float);
  void *tmp = NULL;
  fl_status st = comm_host_scratch(g->h, 1, chunk * sizeof(float), &tmp);
  for (size_t at = 0; st == FL_OK && at < half[1]; at += chunk)
    for (int k = 0; k < 2 && st == FL_OK; k++)
      if (at < half[k]) st = tree_reduce_chunk(g, &tree[k], part[k] + at, half[k] - at < chunk ? half[k] - at : chunk, tmp);
  for (size_t at = 0; st == FL_OK && at < half[1]; at += chunk)
    for (int k = 0; k < 2 && st == FL_OK; k++)
      if (at < half[k])
        st = tree_broadcast_chunk(g, &tree[k], (uint8_t *)(part[k] + at),
                                  (half[k] - at < chunk ? half[k] - at : chunk) * sizeof(float));
  return st;
}
