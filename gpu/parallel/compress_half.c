/*
 * gpu/parallel/compress_half.c: fp16 and bf16 casting, a hook of gpu/parallel/compress.h (as
 * PyTorch's fp16_compress_hook and bf16_compress_hook).
 *
 * The bucket is rounded to 16-bit floats (IEEE half or bfloat16, to nearest even), allreduced
 * in 16 bits by comm_allreduce_half (each step of the host ring sums in fp32 and rounds back:
 * half the bytes of an fp32 allreduce), then widened and divided by the ranks. No error
 * feedback: the rounding error is the format's, as in PyTorch. fp16's range ends at 65504: a
 * larger sum becomes inf, as an fp16 loss scaler's overflow (which skips the step); bf16 keeps
 * fp32's range with an 8-bit mantissa.
 */
#include "common/common.h"
#include "gpu/comm/comm.h"
#include "gpu/parallel/compress.h"

typedef struct half_state {
  comm_half_kind kind;
  size_t n;
  uint16_t *wire; /* n */
} half_state;

static void half_destroy(void *p) {
  half_state *s = p;
  if (!s) return;
  common_free(s->wire);
  common_free(s);
}

static fl_status half_create(const compress_spec *spec, const compress_bucket *b, int world, void **out) {
  (void)world;
  half_state *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "out of memory for 16-bit compression's state");
  s->kind = spec->kind == COMPRESS_BF16 ? COMM_HALF_BF16 : COMM_HALF_FP16;
  s->n = b->n;
  s->wire = common_malloc((b->n + 1) * sizeof(uint16_t));
  if (!s->wire) {
    half_destroy(s);
    return FL_ERR(FL_ENOMEM, "out of memory for 16-bit compression's state (%zu elements)", b->n);
  }
  *out = s;
  return FL_OK;
}

static fl_status half_run(void *p, compress_io *io, compress_bucket *b) {
  half_state *s = p;
  float *v = b->data;
  comm_half_from_f32(s->kind, s->wire, v, s->n);
  io->sent += s->n * sizeof(uint16_t);
  fl_status st = comm_allreduce_half(io->comm, s->wire, s->n, s->kind);
  if (st != FL_OK) return st;
  float mean = 1.0f / (float)fl_comm_size(io->comm);
  comm_half_to_f32(s->kind, v, s->wire, s->n);
  for (size_t i = 0; i < s->n; i++) v[i] *= mean;
  return FL_OK;
}

const compress_hook compress_hook_half = {
    .name = "half", .create = half_create, .destroy = half_destroy, .run = half_run, .residual = NULL};
