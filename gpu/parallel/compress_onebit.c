/*
 * gpu/parallel/compress_onebit.c: 1-bit sign compression with error feedback (Seide et al.
 * 2014's 1-bit SGD; signSGD with error feedback, Karimireddy et al. 2019), a hook of
 * gpu/parallel/compress.h.
 *
 * Per bucket of n elements over its parameters, every step:
 *   1. v = g + e;
 *   2. per row of each parameter (a weight's first dimension: an output unit or channel, as
 *      Seide et al. quantize per column; a vector is one row), scale = mean |v| over the row
 *      (the l1 norm over its length, as signSGD-EF scales); the signs as bits (v >= 0: 1), 32
 *      to a word. One scale per tensor trained the MLP at lr 0.1 into a dead network within
 *      an epoch: an output unit with small gradients got its layer's step size;
 *   3. an allgather of [the rows' scales, the bit words]: 4 x (rows + ceil(n / 32)) bytes a
 *      rank, about n / 8;
 *   4. the bucket becomes the mean over the ranks (added in rank order, so alike everywhere)
 *      of scale x (+1 or -1);
 *   5. e = v - scale x sign.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/compress.h"

typedef struct onebit_state {
  size_t n, nscales, words, msg; /* msg = nscales + words floats a rank */
  int world;
  float *residual; /* n */
  float *send;     /* msg */
  float *recv;     /* world x msg */
} onebit_state;

static void onebit_destroy(void *p) {
  onebit_state *s = p;
  if (!s) return;
  common_free(s->residual);
  common_free(s->send);
  common_free(s->recv);
  common_free(s);
}

/* The rows a parameter is scaled by: a vector (cols 1) is one. */
static size_t rows_of(const compress_param *p) { return p->cols > 1 ? p->rows : 1; }

static fl_status onebit_create(const compress_spec *spec, const compress_bucket *b, int world, void **out) {
  (void)spec;
  onebit_state *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory for 1-bit compression's state");
  s->n = b->n;
  for (size_t j = 0; j < b->nparams; j++) s->nscales += rows_of(&b->params[j]);
  s->words = (b->n + 31) / 32;
  s->msg = s->nscales + s->words;
  s->world = world;
  s->residual = common_calloc(s->n, sizeof(float));
  s->send = common_malloc(s->msg * sizeof(float));
  s->recv = common_malloc(s->msg * (size_t)world * sizeof(float));
  if (!s->residual || !s->send || !s->recv) {
    onebit_destroy(s);
    return FL_ERR(FL_ENOMEM, "out of memory for 1-bit compression's state (%zu elements)", b->n);
  }
  *out = s;
  return FL_OK;
}

static fl_status onebit_run(void *p, compress_io *io, compress_bucket *b) {
  onebit_state *s = p;
  float *v = b->data, *scales = s->send;
  uint32_t *bits = (uint32_t *)(void *)(s->send + s->nscales);
  memset(bits, 0, s->words * sizeof(uint32_t));
  size_t k = 0; /* the row's scale */
  for (size_t j = 0; j < b->nparams; j++) {
    size_t rows = rows_of(&b->params[j]), len = b->params[j].rows * b->params[j].cols / rows;
    for (size_t row = 0, lo = b->params[j].offset - b->offset; row < rows; row++, lo += len, k++) {
      double l1 = 0;
      for (size_t i = lo; i < lo + len; i++) {
        v[i] += s->residual[i];
        l1 += fabsf(v[i]);
        if (v[i] >= 0) bits[i / 32] |= 1u << (i % 32);
      }
      float scale = len ? (float)(l1 / (double)len) : 0;
      scales[k] = scale;
      for (size_t i = lo; i < lo + len; i++)
        s->residual[i] = v[i] - (bits[i / 32] >> (i % 32) & 1u ? scale : -scale);
    }
  }
  fl_status st = compress_allgather(io, s->send, s->msg, s->recv);
  if (st != FL_OK) return st;
  memset(v, 0, s->n * sizeof(float));
  for (int r = 0; r < s->world; r++) {
    const float *rs = s->recv + (size_t)r * s->msg;
    const uint32_t *rb = (const uint32_t *)(const void *)(rs + s->nscales);
    k = 0;
    for (size_t j = 0; j < b->nparams; j++) {
      size_t rows = rows_of(&b->params[j]), len = b->params[j].rows * b->params[j].cols / rows;
      for (size_t row = 0, lo = b->params[j].offset - b->offset; row < rows; row++, lo += len, k++)
        for (size_t i = lo; i < lo + len; i++) v[i] += rb[i / 32] >> (i % 32) & 1u ? rs[k] : -rs[k];
    }
  }
  float mean = 1.0f / (float)s->world;
  for (size_t i = 0; i < s->n; i++) v[i] *= mean;
  return FL_OK;
}

static const float *onebit_residual(const void *p) { return ((const onebit_state *)p)->residual; }

const compress_hook compress_hook_onebit = {.name = "onebit", .create = onebit_create, .destroy = onebit_destroy,
                                            .run = onebit_run, .residual = onebit_residual};
