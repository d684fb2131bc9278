/*
 * gpu/parallel/compress_topk.c: top-k sparsification with error feedback (Deep Gradient
 * Compression, Lin et al. 2018), a hook of gpu/parallel/compress.h.
 *
 * Per bucket of n elements and k = ceil(ratio x n) (1 to n), every step:
 *   1. v = g + e (the residual of the steps before);
 *   2. the k largest |v| (a quickselect for the k-th magnitude, then one pass in index order,
 *      so that ties go to the lower indices) become k (index, value) pairs;
 *   3. an allgather gives every rank every rank's pairs (each sends the same k: 8k bytes);
 *   4. the bucket becomes the sum of the pairs over the ranks, in rank order (so that every
 *      rank adds in the same order and gets the same floats), divided by the ranks;
 *   5. e = v with the sent elements zeroed: what this rank did not send waits for later steps.
 *
 * Momentum correction (DGC's, with momentum factor masking), when the trainer's optimizer is
 * SGD with momentum m (spec->momentum): sparsifying gradients delays each coordinate's
 * updates until it is sent, and momentum then acts on bursts, which costs accuracy. DGC
 * instead keeps the momentum locally and accumulates velocities: u = m u + g, v = v + u
 * (step 1's v), sends the top k of v, and zeroes both u and v where it sent. The step is then
 * lr x the averaged sparse velocity s_t, with no further momentum; but the optimizer applies
 * its own (velocity = m velocity + g). So the hook hands it g = s_t - m s_{t-1}, under which
 * the optimizer's velocity is s_t (plus its weight decay's share): the same step, without
 * reaching into the optimizer. Local clipping and warm-up of the ratio are left out.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/compress.h"

typedef struct topk_state {
  size_t n, k;
  int world;
  float momentum;
  float *residual; /* n: v */
  float *velocity; /* n, with momentum correction: u */
  float *last;     /* n, with momentum correction: s_{t-1}, the previous step's average */
  float *mag;      /* n: quickselect's scratch */
  float *send;     /* 2k: (index bits, value) pairs */
  float *recv;     /* world x 2k */
} topk_state;

static void topk_destroy(void *p) {
  topk_state *s = p;
  if (!s) return;
  common_free(s->residual);
  common_free(s->velocity);
  common_free(s->last);
  common_free(s->mag);
  common_free(s->send);
  common_free(s->recv);
  common_free(s);
}

static fl_status topk_create(const compress_spec *spec, const compress_bucket *b, int world, void **out) {
  topk_state *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory for top-k's state");
  double k = ceil(spec->ratio * (double)b->n);
  s->n = b->n;
  s->k = k < 1 ? 1 : k > (double)b->n ? b->n : (size_t)k;
  s->world = world;
  s->momentum = (float)spec->momentum;
  s->residual = common_calloc(s->n, sizeof(float));
  if (s->momentum > 0) {
    s->velocity = common_calloc(s->n, sizeof(float));
    s->last = common_calloc(s->n, sizeof(float));
  }
  s->mag = common_malloc(s->n * sizeof(float));
  s->send = common_malloc(2 * s->k * sizeof(float));
  s->recv = common_malloc(2 * s->k * (size_t)world * sizeof(float));
  if (!s->residual || !s->mag || !s->send || !s->recv || (s->momentum > 0 && (!s->velocity || !s->last))) {
    topk_destroy(s);
    return FL_ERR(FL_ENOMEM, "out of memory for top-k's state (%zu elements)", b->n);
  }
  *out = s;
  return FL_OK;
}

/* NaN sorts as the largest magnitude: a diverging gradient is sent, and shows in the loss. */
static inline float magnitude(float v) { return isnan(v) ? INFINITY : fabsf(v); }

/* The k-th largest of a[0, n) (1 <= k <= n), reordering a: Hoare's quickselect, descending. */
static float kth_largest(float *a, size_t n, size_t k) {
  long lo = 0, hi = (long)n - 1, want = (long)k - 1;
  while (lo < hi) {
    long mid = lo + (hi - lo) / 2;
    /* The median of three as the pivot: sorted input does not make it quadratic. */
    float x = a[lo], y = a[mid], z = a[hi];
    float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
    long i = lo, j = hi;
    while (i <= j) {
      while (a[i] > pivot) i++;
      while (a[j] < pivot) j--;
      if (i <= j) {
        float t = a[i];
        a[i++] = a[j];
        a[j--] = t;
      }
    }
    /* [lo, j] >= pivot >= [i, hi], and (j, i) equals the pivot. */
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else return a[want];
  }
  return a[want];
}

static fl_status topk_run(void *p, compress_io *io, compress_bucket *b) {
  topk_state *s = p;
  float *v = b->data, m = s->momentum;
  if (m > 0)
    for (size_t i = 0; i < s->n; i++) v[i] = s->velocity[i] = m * s->velocity[i] + v[i];
  for (size_t i = 0; i < s->n; i++) {
    v[i] += s->residual[i];
    s->mag[i] = magnitude(v[i]);
  }
  float t = kth_largest(s->mag, s->n, s->k);
  /* Every element above the threshold, then ties up to k, in index order. */
  size_t taken = 0;
  for (size_t i = 0; i < s->n && taken < s->k; i++)
    if (magnitude(v[i]) > t) taken++;
  size_t ties = s->k - taken, sent = 0;
  memcpy(s->residual, v, s->n * sizeof(float));
  for (size_t i = 0; i < s->n && sent < s->k; i++) {
    float mag = magnitude(v[i]);
    if (!(mag > t) && !(mag == t && ties > 0)) continue;
    if (!(mag > t)) ties--;
    uint32_t index = (uint32_t)i;
    memcpy(&s->send[2 * sent], &index, sizeof index);
    s->send[2 * sent + 1] = v[i];
    s->residual[i] = 0;
    if (m > 0) s->velocity[i] = 0;
    sent++;
  }
  FL_ASSERT(sent == s->k);
  fl_status st = compress_allgather(io, s->send, 2 * s->k, s->recv);
  if (st != FL_OK) return st;
  memset(v, 0, s->n * sizeof(float));
  for (int r = 0; r < s->world; r++) {
    const float *pairs = s->recv + (size_t)r * 2 * s->k;
    for (size_t j = 0; j < s->k; j++) {
      uint32_t index;
      memcpy(&index, &pairs[2 * j], sizeof index);
      if (index >= s->n)
        return fl_set_error(FL_EPROTO, "top-k compression: rank %d sent element %u of a bucket of %zu", r, index,
                            s->n);
      v[index] += pairs[2 * j + 1];
    }
  }
  float scale = 1.0f / (float)s->world;
  for (size_t i = 0; i < s->n; i++) v[i] *= scale;
  if (m > 0)
    for (size_t i = 0; i < s->n; i++) {
      float avg = v[i];
      v[i] = avg - m * s->last[i];
      s->last[i] = avg;
    }
  return FL_OK;
}

static const float *topk_residual(const void *p) { return ((const topk_state *)p)->residual; }

const compress_hook compress_hook_topk = {
    .name = "topk", .create = topk_create, .destroy = topk_destroy, .run = topk_run, .residual = topk_residual};
