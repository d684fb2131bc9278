/*
 * gpu/comm/calibrate.c: the cost model's parameters (gpu/comm/cost_model.h), measured when a
 * host communicator forms (fl_comm_host_create, and so every sub-communicator of a split).
 *
 * Design. Four steps, all over the transport's own calls, so that each link is measured on
 * whatever carries its bytes (TCP, shared memory, single copy):
 *   1. Hello: an allgather of a record per rank: whether it calibrates
 *      (FLINT_COMM_CALIBRATE) and the single-copy threshold of its step in its host's ring.
 *      One rank at 0 and every rank keeps comm_cost_defaults, so a rank configured apart
 *      from the others cannot leave them waiting on an exchange it never starts.
 *   2. The same-host ring: the ranks of each host, in rank order, time steps of a ring
 *      among them (send to the next, receive from the previous, all at once, as the
 *      algorithms' steps run; with 2 ranks a pair's exchange): small ones (alpha: the mean
 *      of CAL_SMALL_REPS but the slowest sixteenth, the lower of two rounds), then exchanges of 32 KiB, 1 MiB and 4 MiB
 *      (beta at each: (mean - alpha) / bytes) and, when every step of the host's ring moves
 *      by a single copy (from the hellos, so that every member decides alike), ring steps of
 *      1 and 4 MiB (beta_ring). A ring rather than pairs, because with more ranks than cores
 *      a step waits on a chain of ranks to be scheduled, which pairs would not see.
 *   3. The other-host ring: the lowest rank of every host, the same way (no single copy).
 *   4. gamma: every rank times comm_reduce_add over 4 MiB, and once per process over
 *      32 MiB (past the caches), before the rings, so that no rank sums while another
 *      times an exchange.
 * Then an allgather of every rank's figures, and each rank combines them alike (the median
 * over the ranks that measured; single copy only when every host has it): identical inputs
 * and code give identical parameters on every rank, which AUTO needs, since ranks that
 * picked different algorithms would deadlock.
 *
 * Cost: two allgathers of a few bytes, then per link class one untimed step of 1 MiB (it
 * faults in a shared-memory ring's pages), 65 small steps, 9 of 32 KiB, 3 of 1 MiB and 4 of
 * 4 MiB (and 4 + 4 ring steps with single copy), and the sums: about 10 ms for 2 ranks on the
 * idle 2-core machine, 25-40 ms for 4 (bench_allreduce prints it), mostly the 4 MiB
 * exchanges, which a model of large messages needs (the cost per byte rises past the
 * caches); the first communicator of a process adds the 32 MiB sums. Each rank waits
 * on its ring neighbours only (the first, untimed, step absorbs the skew of arrival; the
 * sizes after it run on warm connections), so no barrier is needed between the steps.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/comm/cost_model.h"
#include "gpu/comm/host_algorithms.h"

#define CAL_SMALL_BYTES 8
/* Many small steps, back to back, so that alpha is what a chain of steps costs in the steady
 * state: with more ranks than cores, a step often waits for its peer to be scheduled, and
 * that wait belongs in alpha (at 4 ranks on 2 cores every other step takes a 5 us context
 * switch and the rest 0.05 us; 25 steps without their slowest fifth gave 0.5-0.75 us where
 * the steady state costs 2.6). Two rounds, the first and the last (measure_ring), and the
 * lower of their means. */
#define CAL_SMALL_REPS 32
#define CAL_MAX_REPS CAL_SMALL_REPS
#define CAL_WARM_BYTES (1u << 20)
#define CAL_BIG_REPS 3
/* Timed exchanges at each of comm_cost_sizes (32 KiB, 1 MiB, 4 MiB): fewer where they cost. */
static const int cal_reps[COMM_COST_SIZES] = {9, 3, 4};
/* A ring whose single-copy threshold is above this keeps beta for its ring steps (its
 * steps of the measured sizes would not move by single copy). */
#define CAL_RING_MAX_BYTES (4u << 20)

/* What every rank says first: whether it calibrates, and the single-copy range of the step
 * to the next rank of its host's ring (min 0: none, or none of the measured sizes in it). */
typedef struct cal_hello {
  uint32_t enabled;
  uint32_t next_copy_min;
  uint64_t next_copy_max;
} cal_hello;

/* One rank's measurements; a negative figure: not measured. A link's figures: alpha, beta at
 * each of comm_cost_sizes, beta_ring at each. */
#define CAL_FIGS (1 + 2 * COMM_COST_SIZES)
typedef struct cal_record {
  double intra[CAL_FIGS], inter[CAL_FIGS];
  double gamma[COMM_GAMMA_SIZES];
  double copy_min, copy_max; /* the same-host ring's single-copy range, min 0: none */
} cal_record;

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1], v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times `reps` exchanges (ring steps when `ring`) of `bytes`, sending to `next` while
 * receiving from `prev`, after one untimed when `warm`; in *out the mean without the slowest
 * (a sixteenth of CAL_SMALL_REPS small steps, else a fifth; at least one). Not the median: an allreduce is a chain of steps, so its time is their sum,
 * which slow steps (a rank descheduled when ranks outnumber cores) enter in proportion;
 * without the slowest, so that a stall of this machine does not set the figure for the
 * communicator's life. */
static fl_status time_exchange(comm_host *h, int next, int prev, uint8_t *sbuf, uint8_t *rbuf, size_t bytes,
                               int reps, bool ring, bool warm, double *out) {
  double t[CAL_MAX_REPS];
  for (int i = warm ? -1 : 0; i < reps; i++) {
    double t0 = common_now_s();
    fl_status st = ring ? comm_host_ring_step(h, next, sbuf, bytes, prev, rbuf, bytes)
                        : comm_host_exchange(h, next, sbuf, bytes, prev, rbuf, bytes);
    if (st != FL_OK) return st;
    if (i >= 0) t[i] = common_now_s() - t0;
  }
  median(t, reps); /* sorts */
  /* Without the slowest fifth of a few large steps, the slowest sixteenth of many small
   * ones: a stall, not the scheduling waits of the steady state. */
  int drop = reps >= CAL_SMALL_REPS ? reps / 16 : reps / 5;
  int keep = reps - (drop > 1 ? drop : 1);
  double sum = 0;
  for (int i = 0; i < keep; i++) sum += t[i];
  *out = sum / keep;
  return FL_OK;
}

/* The figures of a link (alpha, beta at each size, beta_ring at each) from the steps of a
 * ring through `count` ranks (this one at `idx` of members[]); when `copy_min` is not NULL and
 * every step of the ring moves by a single copy from ring_copy_min bytes (0: not every one),
 * ring steps for beta_ring, and the threshold in *copy_min. sbuf and rbuf hold the largest
 * size. */
static fl_status measure_ring(comm_host *h, const int *members, int count, int idx, uint8_t *sbuf,
                              uint8_t *rbuf, size_t ring_copy_min, double fig[CAL_FIGS], double *copy_min) {
  int next = members[(idx + 1) % count], prev = members[(idx + count - 1) % count];
  double alpha, *beta = fig + 1, *beta_ring = fig + 1 + COMM_COST_SIZES;
  /* First one untimed exchange of 1 MiB: it touches every page of the pair's channel (a
   * shared-memory ring faults its pages in on first use, which 32 KiB steps would time). */
  fl_status st = comm_host_exchange(h, next, sbuf, CAL_WARM_BYTES, prev, rbuf, CAL_WARM_BYTES);
  /* The small steps in two rounds, one first and one last, and alpha the lower: ranks that
   * share a CPU for a while (the scheduler often puts a rank woken from its futex beside the
   * rank that woke it) make every step a context switch (1.5-2.2 us a step at 2 ranks, 15-20x
   * the steady state), and one round may see it where the other does not, while
   * oversubscription slows both rounds alike. */
  double again = 0, t_exch[COMM_COST_SIZES], t_ring[COMM_COST_SIZES];
  size_t ring_bytes[COMM_COST_SIZES];
  if (st == FL_OK)
    st = time_exchange(h, next, prev, sbuf, rbuf, CAL_SMALL_BYTES, CAL_SMALL_REPS, false, true, &alpha);
  for (int i = 0; i < COMM_COST_SIZES && st == FL_OK; i++)
    st = time_exchange(h, next, prev, sbuf, rbuf, (size_t)comm_cost_sizes[i], cal_reps[i], false, false, &t_exch[i]);
  /* ring_copy_min: the same on every member (from the hellos), or a step would wait on a
   * descriptor that never comes. Ring steps below the threshold are the exchanges above;
   * the smallest size stays below every threshold, and takes the next size's figure. */
  bool ring = ring_copy_min && copy_min;
  for (int i = 1; i < COMM_COST_SIZES && ring && st == FL_OK; i++) {
    size_t bytes = (size_t)comm_cost_sizes[i];
    if (bytes < ring_copy_min) bytes = ring_copy_min;
    ring_bytes[i] = bytes;
    st = time_exchange(h, next, prev, sbuf, rbuf, bytes, cal_reps[i], true, i == 1, &t_ring[i]);
  }
  if (st == FL_OK)
    st = time_exchange(h, next, prev, sbuf, rbuf, CAL_SMALL_BYTES, CAL_SMALL_REPS, false, false, &again);
  if (st != FL_OK) return st;
  alpha = fmin(alpha, again);
  /* A slow spell during the small steps must not make beta negative. */
  for (int i = 0; i < COMM_COST_SIZES; i++) {
    double t = t_exch[i];
    beta[i] = beta_ring[i] = fmax(t - alpha, 0.5 * t) / comm_cost_sizes[i];
  }
  for (int i = 1; i < COMM_COST_SIZES && ring; i++) {
    double t = t_ring[i];
    beta_ring[i] = fmax(t - alpha, 0.5 * t) / (double)ring_bytes[i];
    if (i == 1) beta_ring[0] = beta_ring[1];
  }
  fig[0] = alpha;
  if (copy_min) *copy_min = (double)ring_copy_min;
  return FL_OK;
}

/* Every rank's `bytes`-long record at all + rank * bytes (its own already there). */
static fl_status allgather(comm_host *h, uint8_t *all, size_t bytes) {
  size_t *off = common_malloc(2 * sizeof(size_t) * (size_t)h->size);
  if (!off) return FL_ERR(FL_ENOMEM, "out of memory for calibrating %d ranks", h->size);
  size_t *len = off + h->size;
  for (int r = 0; r < h->size; r++) off[r] = (size_t)r * bytes, len[r] = bytes;
  comm_group g = comm_group_all(h);
  fl_status st = ring_allgather_bytes(&g, all, off, len);
  common_free(off);
  return st;
}

/* The median of field `at` (a byte offset into cal_record) over the ranks that measured it;
 * `fallback` when none did. */
static double combine(const cal_record *all, int n, size_t at, double fallback) {
  double v[64];
  int k = 0;
  for (int r = 0; r < n; r++) {
    double x;
    memcpy(&x, (const uint8_t *)&all[r] + at, sizeof x);
    if (x >= 0 && k < (int)(sizeof v / sizeof *v)) v[k++] = x;
  }
  return k ? median(v, k) : fallback;
}

static void shape_of(const comm_host *h, comm_cost_shape *s) {
  s->size = h->size, s->nhosts = h->nhosts, s->max_local = 0;
  for (int host = 0; host < h->nhosts; host++) {
    int k = 0;
    for (int r = 0; r < h->size; r++) k += h->host_of[r] == host;
    if (k > s->max_local) s->max_local = k;
  }
}

/* The ranks of this rank's host in rank order (the same-host ring), or the lowest rank of
 * every host in host order (the other-host ring); this rank's place in it, -1 when absent. */
static int ring_members(const comm_host *h, bool hosts, int *members, int *count) {
  int me = h->host_of[h->rank], idx = -1, n = 0;
  for (int r = 0; r < h->size; r++) {
    bool in = hosts ? n == h->host_of[r] : h->host_of[r] == me;
    if (!in) continue;
    if (r == h->rank) idx = n;
    members[n++] = r;
  }
  *count = n;
  return idx;
}

/* Seconds per byte of comm_reduce_add over `bytes` of buf (2 x bytes, written already, so
 * that no timed sum pays page faults): the median of CAL_BIG_REPS after one untimed. */
static double time_sum(uint8_t *buf, size_t bytes) {
  double t[CAL_BIG_REPS];
  size_t n = bytes / sizeof(float);
  for (int i = -1; i < CAL_BIG_REPS; i++) {
    double t0 = common_now_s();
    comm_reduce_add((float *)(buf + bytes), (const float *)buf, n);
    if (i >= 0) t[i] = common_now_s() - t0;
  }
  return median(t, CAL_BIG_REPS) / (double)bytes;
}

/* gamma past the caches, measured once per process (the memory's speed does not change
 * between communicators, and 2 x 32 MiB of fresh pages cost tens of milliseconds): the
 * first calibration measures it, later ones and the other threads' ranks reuse it; -1 when
 * out of memory. */
static pthread_once_t memory_gamma_once = PTHREAD_ONCE_INIT;
static double memory_gamma = -1;

static void measure_memory_gamma(void) {
  size_t bytes = (size_t)comm_gamma_sizes[COMM_GAMMA_SIZES - 1];
  uint8_t *buf = common_malloc(2 * bytes);
  if (!buf) return;
  memset(buf, 0, 2 * bytes);
  memory_gamma = time_sum(buf, bytes);
  common_free(buf);
}

static fl_status measure(comm_host *h, cal_record *mine, int *members, const cal_hello *hello) {
  int count, idx = ring_members(h, false, members, &count);
  /* Single copy on the host's ring when every step has it; the largest threshold. */
  size_t thr = 0;
  uint64_t most = UINT64_MAX;
  for (int i = 0; i < count; i++) {
    uint32_t t = hello[members[i]].next_copy_min;
    if (t == 0) {
      thr = 0;
      break;
    }
    if (t > thr) thr = t;
    if (hello[members[i]].next_copy_max < most) most = hello[members[i]].next_copy_max;
  }
  /* Buffers of the largest size, freed after: the communicator keeps no memory for this.
   * Written first, so that no timed step pays the page faults of fresh memory. */
  size_t cap = (size_t)comm_cost_sizes[COMM_COST_SIZES - 1];
  uint8_t *s = common_malloc(2 * cap), *r = s + cap;
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory for calibrating: %zu bytes", 2 * cap);
  memset(s, 0, 2 * cap);
  for (int i = 0; i < CAL_FIGS; i++) mine->intra[i] = mine->inter[i] = -1;
  mine->copy_min = mine->copy_max = -1;
  fl_status st = FL_OK;
  mine->copy_max = (double)most;
  /* gamma first, in the caches over the same buffers (cap is comm_gamma_sizes[0]) and past
   * them: the sums run while no other rank of the host is timing an exchange (the rings'
   * untimed first step absorbs the ranks' skew). */
  mine->gamma[0] = time_sum(s, cap);
  pthread_once(&memory_gamma_once, measure_memory_gamma);
  mine->gamma[1] = memory_gamma;
  if (count > 1) st = measure_ring(h, members, count, idx, s, r, thr, mine->intra, &mine->copy_min);
  idx = ring_members(h, true, members, &count);
  if (st == FL_OK && idx >= 0 && count > 1) st = measure_ring(h, members, count, idx, s, r, 0, mine->inter, NULL);
  common_free(s);
  return st;
}

fl_status comm_host_calibrate(comm_host *h, comm_cost_model *out) {
  fl_status status = FL_OK;
  cal_hello *hello = NULL;
  cal_record *all = NULL;
  int *members = NULL;
  comm_cost_model m;
  comm_cost_model_init(&m, h->size);
  shape_of(h, &m.shape);
  if (h->size == 1) goto done;
  hello = common_calloc((size_t)h->size, sizeof *hello);
  all = common_calloc((size_t)h->size, sizeof *all);
  members = common_calloc((size_t)h->size, sizeof *members);
  if (!hello || !all || !members) {
    status = FL_ERR(FL_ENOMEM, "out of memory for calibrating %d ranks", h->size);
    goto cleanup;
  }
  int count, idx = ring_members(h, false, members, &count);
  int next = members[(idx + 1) % count];
  size_t thr = next != h->rank && h->single_copy_min ? h->single_copy_min[next] : 0;
  size_t most = next != h->rank && h->single_copy_max ? h->single_copy_max[next] : SIZE_MAX;
  hello[h->rank].enabled = config_bool(CONFIG_COMM_CALIBRATE) ? 1 : 0;
  /* Ring steps are timed at 1 and 4 MiB: a range that holds neither is no single copy. */
  bool in_range = thr && thr <= CAL_RING_MAX_BYTES && most >= (1u << 20);
  hello[h->rank].next_copy_min = in_range ? (uint32_t)thr : 0;
  hello[h->rank].next_copy_max = in_range ? (uint64_t)most : 0;
  FL_CHECK(allgather(h, (uint8_t *)hello, sizeof *hello));
  for (int r = 0; r < h->size; r++)
    if (!hello[r].enabled) goto done;
  FL_CHECK(measure(h, &all[h->rank], members, hello));
  FL_CHECK(allgather(h, (uint8_t *)all, sizeof *all));

  comm_cost_params *q = &m.params;
  double intra[CAL_FIGS], inter[CAL_FIGS], fallback[CAL_FIGS];
  fallback[0] = q->inter.alpha;
  for (int i = 0; i < COMM_COST_SIZES; i++)
    fallback[1 + i] = q->inter.beta[i], fallback[1 + COMM_COST_SIZES + i] = q->inter.beta_ring[i];
  for (int i = 0; i < CAL_FIGS; i++) {
    inter[i] = combine(all, h->size, offsetof(cal_record, inter) + (size_t)i * sizeof(double), fallback[i]);
    /* No host with two ranks: the same-host link is never used alone; let it be the other. */
    intra[i] = combine(all, h->size, offsetof(cal_record, intra) + (size_t)i * sizeof(double), inter[i]);
  }
  q->intra.alpha = intra[0], q->inter.alpha = inter[0];
  for (int i = 0; i < COMM_COST_SIZES; i++) {
    q->intra.beta[i] = intra[1 + i], q->intra.beta_ring[i] = intra[1 + COMM_COST_SIZES + i];
    q->inter.beta[i] = inter[1 + i], q->inter.beta_ring[i] = inter[1 + COMM_COST_SIZES + i];
  }
  q->gamma[0] = combine(all, h->size, offsetof(cal_record, gamma), q->gamma[0]);
  /* No rank could measure past the caches: no penalty there rather than a guessed one. */
  q->gamma[1] = combine(all, h->size, offsetof(cal_record, gamma) + sizeof(double), q->gamma[0]);
  q->copy_min = 0, q->copy_max = UINT64_MAX;
  for (int r = 0; r < h->size; r++) {
    if (all[r].copy_min < 0) continue; /* no same-host partner */
    if (all[r].copy_min == 0) {
      q->copy_min = 0, q->copy_max = UINT64_MAX;
      break;
    }
    if ((uint64_t)all[r].copy_min > q->copy_min) q->copy_min = (uint64_t)all[r].copy_min;
    /* A double holds UINT64_MAX only rounded up, past the range of uint64_t. */
    uint64_t most = all[r].copy_max >= 1.8e19 ? UINT64_MAX : (uint64_t)all[r].copy_max;
    if (most < q->copy_max) q->copy_max = most;
  }
  if (!q->copy_min) memcpy(q->intra.beta_ring, q->intra.beta, sizeof q->intra.beta);
  q->calibrated = true;
done:
  *out = m;
cleanup:
  common_free(members);
  common_free(all);
  common_free(hello);
  if (status != FL_OK)
    return common_error_wrap(status, "rank %d: calibrating the links of %d ranks: ", h->rank, h->size);
  return status;
}
