/*
 * gpu/comm/calibrate.c: the cost model's parameters (gpu/comm/cost_model.h), measured when a
 * host communicator forms (fl_comm_host_create, and so every sub-communicator of a split).
 *
 * Design. Four steps, all over the transport's own calls, so that each pair is measured on
 * whatever carries its bytes (TCP, shared memory, single copy):
 *   1. Agree to calibrate: an allgather of one flag per rank (FLINT_COMM_CALIBRATE). One rank
 *      at 0 and every rank keeps comm_cost_defaults, so a rank configured apart from the
 *      others cannot leave them waiting on an exchange it never starts.
 *   2. Same-host pairs: the ranks of each host, in rank order, pair up (1st with 2nd, 3rd
 *      with 4th, ...; an odd one out sits out) and time, at once on every pair: small
 *      exchanges (alpha: the median of CAL_SMALL_REPS), exchanges of CAL_BETA_BYTES (beta:
 *      (median - alpha) / bytes) and, where the pair moves ring steps by a single copy, ring
 *      steps of max(CAL_BETA_BYTES, the pair's threshold) (beta_ring).
 *   3. Other-host pairs: the lowest rank of host 2k with that of host 2k+1, the same way.
 *   4. gamma: every rank times comm_reduce_add over CAL_BETA_BYTES.
 * Then an allgather of every rank's figures, and each rank combines them alike (the median
 * over the ranks that measured; single copy only when every measured same-host pair has
 * it): identical inputs and code give identical parameters on every rank, which AUTO needs,
 * since ranks that picked different algorithms would deadlock.
 *
 * Cost: about 30 small exchanges and 8 of 256 KiB-1 MiB per pair and link class, a few ms
 * on one host. Each pair waits on itself only (its first exchange absorbs the skew of
 * arrival), so no barrier is needed between the steps.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/comm/cost_model.h"
#include "gpu/comm/host_algorithms.h"

#define CAL_SMALL_BYTES 8
#define CAL_SMALL_REPS 9
#define CAL_BETA_BYTES (256u << 10)
#define CAL_BIG_REPS 3
/* A pair whose single-copy threshold is above this keeps beta for its ring steps (timing
 * larger steps would cost more than the model gains). */
#define CAL_RING_MAX_BYTES (1u << 20)

/* One rank's measurements; a negative figure: not measured. */
typedef struct cal_record {
  double intra[3], inter[3]; /* alpha, beta, beta_ring */
  double gamma;
  double copy_min; /* the same-host pair's single-copy threshold, 0: none */
} cal_record;

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      double t = v[j];
      v[j] = v[j - 1], v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times `reps` exchanges (ring steps when `ring`) of `bytes` each way with `peer` after one
 * untimed; the median in *out. */
static fl_status time_exchange(comm_host *h, int peer, uint8_t *sbuf, uint8_t *rbuf, size_t bytes,
                               int reps, bool ring, double *out) {
  double t[CAL_SMALL_REPS];
  for (int i = -1; i < reps; i++) {
    double t0 = common_now_s();
    fl_status st = ring ? comm_host_ring_step(h, peer, sbuf, bytes, peer, rbuf, bytes)
                        : comm_host_exchange(h, peer, sbuf, bytes, peer, rbuf, bytes);
    if (st != FL_OK) return st;
    if (i >= 0) t[i] = common_now_s() - t0;
  }
  *out = median(t, reps);
  return FL_OK;
}

/* alpha, beta, beta_ring of the link to `peer` (fig[0..2]), and the pair's single-copy
 * threshold (0: none) when `copy_min` is not NULL. */
static fl_status measure_link(comm_host *h, int peer, uint8_t *sbuf, uint8_t *rbuf, double fig[3],
                              double *copy_min) {
  double alpha, big;
  fl_status st = time_exchange(h, peer, sbuf, rbuf, CAL_SMALL_BYTES, CAL_SMALL_REPS, false, &alpha);
  if (st == FL_OK) st = time_exchange(h, peer, sbuf, rbuf, CAL_BETA_BYTES, CAL_BIG_REPS, false, &big);
  if (st != FL_OK) return st;
  /* A slow spell during the small exchanges must not make beta negative. */
  double beta = fmax(big - alpha, 0.5 * big) / CAL_BETA_BYTES, beta_ring = beta;
  size_t thr = h->single_copy_min ? h->single_copy_min[peer] : 0;
  if (thr > 0 && thr <= CAL_RING_MAX_BYTES) {
    size_t bytes = thr > CAL_BETA_BYTES ? thr : CAL_BETA_BYTES;
    double ring;
    st = time_exchange(h, peer, sbuf, rbuf, bytes, CAL_BIG_REPS, true, &ring);
    if (st != FL_OK) return st;
    beta_ring = fmax(ring - alpha, 0.5 * ring) / (double)bytes;
  } else {
    thr = 0;
  }
  fig[0] = alpha, fig[1] = beta, fig[2] = beta_ring;
  if (copy_min) *copy_min = (double)thr;
  return FL_OK;
}

/* This rank's same-host partner (the ranks of its host in rank order, paired 1st-2nd,
 * 3rd-4th, ...) and other-host partner (the lowest ranks of hosts 2k and 2k+1); -1: none. */
static int intra_partner(const comm_host *h) {
  int idx = 0, count = 0, me = h->host_of[h->rank];
  for (int r = 0; r < h->size; r++)
    if (h->host_of[r] == me) {
      if (r < h->rank) idx++;
      count++;
    }
  int want = idx ^ 1;
  if (want >= count) return -1;
  for (int r = 0, i = 0; r < h->size; r++)
    if (h->host_of[r] == me && i++ == want) return r;
  return -1;
}

static int host_leader(const comm_host *h, int host) {
  for (int r = 0; r < h->size; r++)
    if (h->host_of[r] == host) return r;
  return -1;
}

static int inter_partner(const comm_host *h) {
  int me = h->host_of[h->rank];
  if (host_leader(h, me) != h->rank || (me ^ 1) >= h->nhosts) return -1;
  return host_leader(h, me ^ 1);
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

static fl_status measure(comm_host *h, cal_record *mine) {
  int peer = intra_partner(h);
  /* Buffers for the largest exchange: a ring step of the pair's threshold, at most 1 MiB. */
  size_t thr = peer >= 0 && h->single_copy_min ? h->single_copy_min[peer] : 0;
  size_t cap = thr > CAL_BETA_BYTES && thr <= CAL_RING_MAX_BYTES ? thr : CAL_BETA_BYTES;
  void *s = NULL, *r = NULL;
  fl_status st = comm_host_scratch(h, 0, cap, &s);
  if (st == FL_OK) st = comm_host_scratch(h, 1, cap, &r);
  if (st != FL_OK) return st;
  memset(s, 0, cap);
  memset(r, 0, cap);
  for (int i = 0; i < 3; i++) mine->intra[i] = mine->inter[i] = -1;
  mine->copy_min = -1;
  if (peer >= 0 && (st = measure_link(h, peer, s, r, mine->intra, &mine->copy_min)) != FL_OK) return st;
  peer = inter_partner(h);
  if (peer >= 0 && (st = measure_link(h, peer, s, r, mine->inter, NULL)) != FL_OK) return st;
  double t[CAL_BIG_REPS];
  size_t n = CAL_BETA_BYTES / sizeof(float);
  for (int i = -1; i < CAL_BIG_REPS; i++) {
    double t0 = common_now_s();
    comm_reduce_add(r, s, n);
    if (i >= 0) t[i] = common_now_s() - t0;
  }
  mine->gamma = median(t, CAL_BIG_REPS) / CAL_BETA_BYTES;
  return FL_OK;
}

fl_status comm_host_calibrate(comm_host *h, comm_cost_model *out) {
  fl_status status = FL_OK;
  uint8_t *flags = NULL;
  cal_record *all = NULL;
  comm_cost_model m;
  comm_cost_model_init(&m, h->size);
  shape_of(h, &m.shape);
  if (h->size == 1) goto done;
  flags = common_calloc((size_t)h->size, 1);
  all = common_calloc((size_t)h->size, sizeof *all);
  if (!flags || !all) {
    status = FL_ERR(FL_ENOMEM, "out of memory for calibrating %d ranks", h->size);
    goto cleanup;
  }
  flags[h->rank] = config_bool(CONFIG_COMM_CALIBRATE) ? 1 : 0;
  FL_CHECK(allgather(h, flags, 1));
  for (int r = 0; r < h->size; r++)
    if (!flags[r]) goto done;
  FL_CHECK(measure(h, &all[h->rank]));
  FL_CHECK(allgather(h, (uint8_t *)all, sizeof *all));

  comm_cost_params *q = &m.params;
  double intra[3], inter[3], fallback[3] = {q->inter.alpha, q->inter.beta, q->inter.beta_ring};
  for (int i = 0; i < 3; i++) {
    inter[i] = combine(all, h->size, offsetof(cal_record, inter) + (size_t)i * sizeof(double), fallback[i]);
    /* No host with two ranks: the same-host link is never used alone; let it be the other. */
    intra[i] = combine(all, h->size, offsetof(cal_record, intra) + (size_t)i * sizeof(double), inter[i]);
  }
  q->intra = (comm_link){intra[0], intra[1], intra[2]};
  q->inter = (comm_link){inter[0], inter[1], inter[2]};
  q->gamma = combine(all, h->size, offsetof(cal_record, gamma), q->gamma);
  q->copy_min = 0;
  for (int r = 0; r < h->size; r++) {
    if (all[r].copy_min < 0) continue; /* no same-host partner */
    if (all[r].copy_min == 0) {
      q->copy_min = 0;
      break;
    }
    if ((uint64_t)all[r].copy_min > q->copy_min) q->copy_min = (uint64_t)all[r].copy_min;
  }
  if (!q->copy_min) q->intra.beta_ring = q->intra.beta;
  q->calibrated = true;
done:
  *out = m;
cleanup:
  common_free(all);
  common_free(flags);
  if (status != FL_OK)
    return common_error_wrap(status, "rank %d: calibrating the links of %d ranks: ", h->rank, h->size);
  return status;
}
