/*
 * gpu/comm/cost_model.c: the alpha-beta-gamma model of every allreduce algorithm, one function
 * each, from its rounds and bytes (docs/collectives.md, "The cost model", has the table), and
 * AUTO as the argmin over the algorithms that apply. The parameters come from the
 * calibration at formation (gpu/comm/calibrate.c) or comm_cost_defaults.
 *
 * Notation: p ranks, n bytes, p' the largest power of two <= p, L the link the algorithm's
 * steps cross: the same-host link when the group is on one host, else the slower of the two
 * (a flat algorithm's steps wait on its slowest pair). Bytes count in a rank's busier
 * direction, in units of beta (an exchange: both directions at once), taken for the
 * message's size n: what decides it is mostly where n bytes live (caches or memory), which
 * every algorithm shares, more than the size of each step.
 */
#include <math.h>
#include <stdatomic.h>

#include "common/common.h"
#include "gpu/comm/backend.h"
#include "gpu/comm/comm.h"
#include "gpu/comm/cost_model.h"

/* The tree's and the broadcast's pipeline chunk (gpu/comm/allreduce_tree.c). */
#define COST_TREE_CHUNK (256.0 * 1024.0)

const double comm_cost_sizes[COMM_COST_SIZES] = {32.0 * 1024, 1024.0 * 1024, 4096.0 * 1024};
const double comm_gamma_sizes[COMM_GAMMA_SIZES] = {4096.0 * 1024, 32768.0 * 1024};

static comm_link flat_link(double alpha, double bytes_per_s) {
  comm_link l = {.alpha = alpha};
  for (int i = 0; i < COMM_COST_SIZES; i++) l.beta[i] = l.beta_ring[i] = 1.0 / bytes_per_s;
  return l;
}

void comm_cost_defaults(comm_cost_params *out) {
  /* Loopback TCP on a small VM (bench_allreduce: 2-rank 8 B exchanges take a few us, large
   * ones move about 2 GB/s each way); 10 GbE between hosts; an fp32 sum at 8 GB/s. */
  *out = (comm_cost_params){
      .intra = flat_link(5e-6, 2e9),
      .inter = flat_link(30e-6, 1.1e9),
      .gamma = {1.0 / 8e9, 1.0 / 4e9},
      .copy_min = 0,
      .copy_max = UINT64_MAX,
      .calibrated = false,
  };
}

/* v measured at sizes[0..k-1], interpolated on log2 of `bytes`; the end values outside. */
static double interpolate(const double *sizes, const double *v, int k, double bytes) {
  if (bytes <= sizes[0]) return v[0];
  for (int i = 1; i < k; i++)
    if (bytes <= sizes[i]) {
      double f = log2(bytes / sizes[i - 1]) / log2(sizes[i] / sizes[i - 1]);
      return v[i - 1] + f * (v[i] - v[i - 1]);
    }
  return v[k - 1];
}

double comm_link_beta(const double beta[COMM_COST_SIZES], double bytes) {
  return interpolate(comm_cost_sizes, beta, COMM_COST_SIZES, bytes);
}

double comm_cost_gamma(const comm_cost_params *q, double bytes) {
  return interpolate(comm_gamma_sizes, q->gamma, COMM_GAMMA_SIZES, bytes);
}

void comm_cost_model_init(comm_cost_model *m, int size) {
  comm_cost_defaults(&m->params);
  m->shape = (comm_cost_shape){.size = size, .nhosts = 1, .max_local = size};
}

static int pow2_floor(int p) {
  int q = 1;
  while (q * 2 <= p) q *= 2;
  return q;
}

static double log2i(int p) {
  int k = 0;
  while ((1 << (k + 1)) <= p) k++;
  return k;
}

static comm_link link_max(comm_link a, comm_link b) {
  comm_link m = {.alpha = fmax(a.alpha, b.alpha)};
  for (int i = 0; i < COMM_COST_SIZES; i++) {
    m.beta[i] = fmax(a.beta[i], b.beta[i]);
    m.beta_ring[i] = fmax(a.beta_ring[i], b.beta_ring[i]);
  }
  return m;
}

/* What every algorithm's function gets: the ranks, the link its steps cross with beta for
 * this message's size, gamma for it, and the single-copy threshold of ring steps. */
typedef struct cost_in {
  int p;
  double alpha, beta, beta_ring;
  double gamma;
  uint64_t copy_min, copy_max; /* copy_min 0: no single copy */
} cost_in;

static cost_in cost_for(int p, const comm_link *l, const comm_cost_params *q, uint64_t copy_min, uint64_t copy_max,
                        double n) {
  return (cost_in){p, l->alpha, comm_link_beta(l->beta, n), comm_link_beta(l->beta_ring, n), comm_cost_gamma(q, n),
                   copy_min, copy_max};
}

/* ring: 2(p-1) steps of a block n/p; each rank sends and receives 2(p-1)/p n and sums
 * (p-1)/p n. A block of copy_min..copy_max bytes moves by a single copy (beta_ring). */
static double cost_ring(const cost_in *c, double n) {
  double p = c->p, block = n / p;
  bool copy = c->copy_min && block >= (double)c->copy_min && block <= (double)c->copy_max;
  double beta = copy ? c->beta_ring : c->beta;
  return 2 * (p - 1) * c->alpha + 2 * (p - 1) * block * beta + (p - 1) * block * c->gamma;
}

/* halving-doubling: 2 log2 p' steps moving 2(p'-1)/p' n; when p != p' the folded pairs add
 * a whole vector each way and its sum. */
static double cost_halving_doubling(const cost_in *c, double n) {
  int q = pow2_floor(c->p);
  double t = 2 * log2i(q) * c->alpha + 2.0 * (q - 1) / q * n * c->beta + (double)(q - 1) / q * n * c->gamma;
  if (q != c->p) t += 2 * (c->alpha + n * c->beta) + n * c->gamma;
  return t;
}

/* binary tree (children 2r+1, 2r+2), reduce up then broadcast down, pipelined in 256 KB
 * chunks: 2d hops of latency (d = floor(log2 p)); the busiest rank moves (children + parent)
 * x n in each direction (3n for an inner rank with two children) and sums children x n; the
 * pipeline's fill adds 2d-1 chunks. */
static double cost_tree(const cost_in *c, double n) {
  int p = c->p, v = 0, g = 0;
  for (int r = 0; r < p; r++) {
    int kids = (2 * r + 1 < p) + (2 * r + 2 < p);
    if (kids + (r > 0) > v) v = kids + (r > 0);
    if (kids > g) g = kids;
  }
  double d = log2i(p), chunk = fmin(n, COST_TREE_CHUNK);
  return 2 * d * c->alpha + (v * n + (2 * d - 1) * chunk) * c->beta + g * n * c->gamma;
}

/* naive: every rank exchanges its whole vector with each of the p-1 others, then sums p-1
 * vectors; it also copies its own vector into the scratch that holds all p and the first
 * back (two more passes over n, counted as sums). */
static double cost_naive(const cost_in *c, double n) {
  return (c->p - 1) * (c->alpha + n * c->beta) + (c->p + 1) * n * c->gamma;
}

/* parameter server: a reduce-scatter to the block owners by direct sends, then each owner
 * sends its block to everyone: 2(p-1) messages and 2(p-1)/p n bytes a rank, as the ring.
 * Each step is an all-to-all, so an owner's p-1 incoming blocks arrive at once (fan-in) and
 * share its link: the bytes cost the same, and the messages do not overlap (one alpha each),
 * the ring's figure without its single copy. */
static double cost_parameter_server(const cost_in *c, double n) {
  double p = c->p, block = n / p;
  return 2 * (p - 1) * c->alpha + 2 * (p - 1) * block * c->beta + (p - 1) * block * c->gamma;
}

/* double binary tree (NCCL 2.4; gpu/comm/allreduce_double_tree.c): two complementary trees,
 * each carrying n/2, so a rank is inner (two children) in at most one and a leaf in the
 * other. Every member runs tree A's step of a chunk and then tree B's, so a chunk's hops do
 * not overlap: 4d of them (d = ceil(log2 p), up and down in each tree). A direction carries
 * 1.5n in the inner tree and n/2 in the leaf's, 2n in all (about the ring's 2(p-1)/p n: the
 * point of the two trees), and n is summed; with 2 ranks each tree moves n/2 up and down,
 * n a direction. */
static double cost_double_tree(const cost_in *c, double n) {
  int p = c->p;
  double d = log2i(p) + (pow2_floor(p) != p ? 1 : 0);
  double v = p <= 2 ? 1.0 : 2.0, g = p <= 2 ? 0.5 : 1.0;
  double chunk = fmin(n / 2, COST_TREE_CHUNK);
  return 4 * d * c->alpha + (v * n + (2 * d - 1) * chunk) * c->beta + g * n * c->gamma;
}

/* butterfly (recursive doubling of whole vectors): log2 p' exchanges of n, each summed; the
 * fold and unfold of halving-doubling when p != p'. */
static double cost_butterfly(const cost_in *c, double n) {
  int q = pow2_floor(c->p);
  double k = log2i(q);
  double t = k * (c->alpha + n * c->beta + n * c->gamma);
  if (q != c->p) t += 2 * (c->alpha + n * c->beta) + n * c->gamma;
  return t;
}

typedef double (*cost_fn)(const cost_in *c, double n);

/* The table AUTO scans, in order of preference on ties. Hierarchical is not here: it is two
 * of these (below). */
static const struct {
  fl_allreduce_algo algo;
  cost_fn cost;
} cost_table[] = {
    {FL_ALLREDUCE_RING, cost_ring},
    {FL_ALLREDUCE_HALVING_DOUBLING, cost_halving_doubling},
    {FL_ALLREDUCE_TREE, cost_tree},
    {FL_ALLREDUCE_BUTTERFLY, cost_butterfly},
    {FL_ALLREDUCE_DOUBLE_TREE, cost_double_tree},
    {FL_ALLREDUCE_PARAMETER_SERVER, cost_parameter_server},
    {FL_ALLREDUCE_NAIVE, cost_naive},
};
#define COST_TABLE_LEN ((int)(sizeof cost_table / sizeof *cost_table))

/* hierarchical (gpu/comm/allreduce_hierarchical.c): a tree's reduce and broadcast within
 * each host over the same-host link (the largest host decides), and between them an
 * allreduce across the hosts' leaders over the other-host link: the ring with two hosts or
 * from 256 KiB, else the tree. */
#define COST_HIER_RING_MIN_BYTES (256.0 * 1024.0)
static double cost_hierarchical(const comm_cost_model *m, double n) {
  const comm_cost_params *q = &m->params;
  cost_in local = cost_for(m->shape.max_local, &q->intra, q, q->copy_min, q->copy_max, n);
  cost_in across = cost_for(m->shape.nhosts, &q->inter, q, 0, 0, n);
  bool ring = across.p == 2 || n >= COST_HIER_RING_MIN_BYTES;
  return (local.p > 1 ? cost_tree(&local, n) : 0) + (ring ? cost_ring(&across, n) : cost_tree(&across, n));
}

bool comm_cost_applies(const comm_cost_model *m, fl_allreduce_algo algo) {
  if (algo == FL_ALLREDUCE_HIERARCHICAL) return m->shape.nhosts > 1 && m->shape.max_local > 1;
  return algo > FL_ALLREDUCE_AUTO && algo < FL_ALLREDUCE_ALGO_COUNT;
}

double comm_cost_predict(const comm_cost_model *m, fl_allreduce_algo algo, size_t bytes) {
  if (!comm_cost_applies(m, algo)) return -1;
  if (m->shape.size <= 1 || bytes == 0) return 0;
  if (algo == FL_ALLREDUCE_HIERARCHICAL) return cost_hierarchical(m, (double)bytes);
  const comm_cost_params *q = &m->params;
  comm_link l = m->shape.nhosts > 1 ? link_max(q->intra, q->inter) : q->intra;
  cost_in c = cost_for(m->shape.size, &l, q, m->shape.nhosts > 1 ? 0 : q->copy_min, q->copy_max, (double)bytes);
  for (int i = 0; i < COST_TABLE_LEN; i++)
    if (cost_table[i].algo == algo) return cost_table[i].cost(&c, (double)bytes);
  FL_ASSERT(!"every algorithm has a cost");
  return -1;
}

fl_allreduce_algo comm_cost_best(const comm_cost_model *m, size_t bytes) {
  fl_allreduce_algo best = cost_table[0].algo;
  double best_t = comm_cost_predict(m, best, bytes);
  for (int i = 1; i <= COST_TABLE_LEN; i++) {
    fl_allreduce_algo a = i < COST_TABLE_LEN ? cost_table[i].algo : FL_ALLREDUCE_HIERARCHICAL;
    if (!comm_cost_applies(m, a)) continue;
    double t = comm_cost_predict(m, a, bytes);
    if (t < best_t) best = a, best_t = t;
  }
  return best;
}

/* ---- AUTO -------------------------------------------------------------------------------
 * The argmin of the cost model (above) over the algorithms that apply, with
 * the parameters that the communicator measured when it formed (gpu/comm/calibrate.c). Every
 * rank of a group holds the same parameters and shape, so every rank picks the same one. */
fl_allreduce_algo comm_pick_algo(const fl_comm *c, size_t bytes) {
  if (c->algo != FL_ALLREDUCE_AUTO) return c->algo;
  uint64_t key = (uint64_t)bytes + 1;
  if (key >= (UINT64_C(1) << 56)) return comm_cost_best(&c->cost, bytes);
  /* The cache is not the communicator's state: a pick is the same with or without it. */
  _Atomic uint64_t *slot = (_Atomic uint64_t *)&c->auto_picks[(key * UINT64_C(0x9e3779b97f4a7c15)) >> 61];
  uint64_t entry = atomic_load_explicit(slot, memory_order_relaxed);
  if (entry >> 8 == key) return (fl_allreduce_algo)(entry & 0xff);
  fl_allreduce_algo algo = comm_cost_best(&c->cost, bytes);
  atomic_store_explicit(slot, key << 8 | (uint64_t)algo, memory_order_relaxed);
  return algo;
}

void comm_set_cost_model(fl_comm *c, const comm_cost_model *m) {
  c->cost = *m;
  for (int i = 0; i < COMM_AUTO_PICKS; i++) atomic_store_explicit(&c->auto_picks[i], 0, memory_order_relaxed);
}

const comm_cost_model *comm_cost_of(const fl_comm *c) { return c ? &c->cost : NULL; }

double comm_predict_seconds(const fl_comm *c, fl_allreduce_algo algo, size_t bytes) {
  if (!c) return -1;
  if (algo == FL_ALLREDUCE_AUTO) algo = comm_pick_algo(c, bytes);
  return comm_cost_predict(&c->cost, algo, bytes);
}

/* ---- for planners (gpu/comm/comm.h) ------------------------------------------------------ */

comm_cost_params *comm_cost_params_of(const fl_comm *c) {
  comm_cost_params *p = common_malloc(sizeof *p);
  if (!p) return NULL;
  const comm_cost_model *m = c ? comm_cost_of(c) : NULL;
  if (m)
    *p = m->params;
  else
    comm_cost_defaults(p);
  return p;
}

double comm_cost_predict_allreduce(const comm_cost_params *p, int ranks, size_t bytes) {
  if (!p || ranks < 2 || bytes == 0) return 0;
  comm_cost_model m;
  comm_cost_model_init(&m, ranks);
  m.params = *p;
  double s = comm_cost_predict(&m, comm_cost_best(&m, bytes), bytes);
  return s > 0 ? s : 0;
}

double comm_cost_predict_message(const comm_cost_params *p, size_t bytes) {
  if (!p || bytes == 0) return 0;
  return p->intra.alpha + comm_link_beta(p->intra.beta, (double)bytes) * (double)bytes;
}
