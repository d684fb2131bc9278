/*
 * gpu/parallel/compress.h: gradient compression as communication hooks of the data-parallel
 * trainer (PyTorch DDP's comm hooks). Without a hook, a gradient bucket is allreduced and
 * averaged; a hook instead compresses it, communicates the compressed form, decompresses and
 * leaves the averaged estimate in the bucket. One hook per file:
 *   - fp16, bf16 (compress_half.c): the bucket cast to 16 bits, allreduced in 16 bits (summed
 *     in fp32 at each step of the ring), averaged and cast back: half the bytes;
 *   - topk:RATIO (compress_topk.c): Deep Gradient Compression's sparsification (Lin et al.
 *     2018) with error feedback: the k = ceil(RATIO x n) largest magnitudes of gradient plus
 *     residual go to every rank as (index, value) pairs (an allgather), are added up and
 *     averaged; the residual keeps what was not sent; under SGD with momentum, DGC's momentum
 *     correction (the velocity is accumulated and sparsified, not the gradient);
 *   - powersgd:R (compress_powersgd.c): Vogels et al. 2019, as PyTorch's powerSGD_hook: each
 *     weight of a bucket as a rows x cols matrix M (plus residual), P = M Q allreduced,
 *     orthonormalised, Q = M^T P allreduced, the estimate P Q^T averaged; Q persists across
 *     steps (warm start); vectors, and matrices too small to gain, go in one plain allreduce;
 *   - onebit (compress_onebit.c): 1-bit sign compression with error feedback (Seide et al.
 *     2014; signSGD with error feedback, Karimireddy et al. 2019): per parameter, scale =
 *     mean |g + e| and the signs as bits, gathered from every rank; the estimate is the mean
 *     of the ranks' scale x sign.
 * Error feedback keeps, for each rank, the sum over steps of what it sent (decompressed) plus
 * its residual equal to the sum of its gradients (tests/test_gpu_compress.c checks it).
 *
 * Design. A compressor belongs to a rank and covers the model's flat gradient buffer; a bucket
 * is a range of it made of whole parameters (gpu/parallel/train_dp.c's bucketing). The
 * compressor keeps one state per bucket (the hook's create/destroy), found by the bucket's
 * offset: the trainer cuts the same buckets every step. Hooks run on host memory: a bucket of
 * a cuda model is copied to a host buffer and back. Hooks talk through the communicator's
 * public collectives on cpu tensors, so they need the host backend (the trainer refuses NCCL).
 *
 * Bytes: `sent` counts the payload a rank hands to collectives (what reduced_bytes counts for
 * a plain allreduce, n x 4 for n floats), not the wire's traffic, which each algorithm
 * multiplies in its own way (docs/collectives.md).
 *
 * Threading: a compressor is used by one thread at a time, the rank's thread or its comm
 * worker while that holds the communicator (gpu/comm/comm.h).
 */
#ifndef FLINT_GPU_PARALLEL_COMPRESS_H
#define FLINT_GPU_PARALLEL_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"

typedef enum compress_kind {
  COMPRESS_NONE = 0,
  COMPRESS_FP16,
  COMPRESS_BF16,
  COMPRESS_TOPK,
  COMPRESS_POWERSGD,
  COMPRESS_ONEBIT,
} compress_kind;

/* A parsed --compress: plain values (it travels in the trainer's stage argument). */
typedef struct compress_spec {
  compress_kind kind;
  double ratio;  /* topk: the share of a bucket's elements sent, in (0, 1] */
  uint32_t rank; /* powersgd: the approximation's rank, >= 1 */
  /* powersgd: compress a rows x cols matrix only when rows x cols >= min_rate x rank x (rows
   * + cols), as PyTorch's min_compression_rate (parsing sets 1: when it saves bytes); 0
   * compresses every matrix (tests: full rank must give the exact average). */
  double min_rate;
  /* topk: the optimizer's SGD momentum, for DGC's momentum correction (0: error feedback on
   * the gradients alone). Not parsed: the trainer sets it from its optimizer. */
  double momentum;
} compress_spec;

/* "none" (or NULL), "fp16", "bf16", "topk:RATIO" (RATIO in (0, 1]; "topk" alone: 0.01),
 * "powersgd:R" (R 1 to 1024; "powersgd" alone: 1), "onebit". FL_EINVAL names the text and
 * what was expected. */
fl_status compress_spec_parse(const char *text, compress_spec *out);
/* The spec as parse reads it back ("topk:0.01"), into out (cap bytes). */
void compress_spec_format(const compress_spec *spec, char *out, size_t cap);

/* One parameter of the flat buffer as a hook sees it: rows x cols = its elements (cols 1 for
 * a vector; a weight of shape [d0, d1, ...] is d0 x (d1 x ...)). Sorted by offset. */
typedef struct compress_param {
  size_t offset, rows, cols;
} compress_param;

/* What a hook's run gets: the bucket's floats in host memory (in: this rank's gradients;
 * out: the averaged estimate) and its parameters. */
typedef struct compress_bucket {
  float *data;
  size_t n, offset; /* elements, and where the bucket starts in the flat buffer */
  const compress_param *params;
  size_t nparams;
} compress_bucket;

/* Collectives on host memory for hooks: the communicator and a cpu device to wrap host
 * memory in tensors. Each adds the payload to *sent. */
typedef struct compress_io {
  fl_comm *comm;
  fl_device *cpu;
  uint64_t sent; /* bytes handed to collectives so far */
} compress_io;
fl_status compress_allreduce(compress_io *io, float *data, size_t n, fl_reduce_op op);
/* in: n floats; out: size x n floats, rank r's at r x n. Floats carry any 32-bit pattern
 * (the hooks send indices and sign bits in them): the host backend copies bytes. */
fl_status compress_allgather(compress_io *io, const float *in, size_t n, float *out);

/* The vtable of a hook. create and destroy do not block; run blocks in collectives. */
typedef struct compress_hook {
  const char *name;
  /* State for one bucket (its residual, PowerSGD's Q), made the first time the bucket runs.
   * FL_ENOMEM. */
  fl_status (*create)(const compress_spec *spec, const compress_bucket *b, int world, void **state);
  void (*destroy)(void *state);
  /* Replaces b->data with the average over ranks of their decompressed contributions. Every
   * rank calls it for the same buckets in the same order. */
  fl_status (*run)(void *state, compress_io *io, compress_bucket *b);
  /* The error-feedback residual of the bucket (n floats), NULL for hooks without one. */
  const float *(*residual)(const void *state);
} compress_hook;

extern const compress_hook compress_hook_half;
extern const compress_hook compress_hook_topk;
extern const compress_hook compress_hook_powersgd;
extern const compress_hook compress_hook_onebit;

/* ---- the compressor of a rank (gpu/parallel/compress.c) ---- */
typedef struct compressor compressor;
/* For a flat gradient buffer of `total` elements made of `params` (copied). spec->kind must
 * not be COMPRESS_NONE. FL_ENOMEM, or FL_EDEVICE from opening the cpu device. */
fl_status compressor_create(const compress_spec *spec, const compress_param *params, size_t nparams, size_t total,
                            int world, compressor **out);
void compressor_destroy(compressor *c);
/* Runs the hook on one bucket: a view of `grads` (the flat buffer, on any device) starting at
 * a parameter's offset and made of whole parameters. Copies it to host memory and back when
 * the device is not the cpu. FL_EINVAL for a range that is not whole parameters; the
 * collectives' errors. */
fl_status compressor_run(compressor *c, fl_comm *comm, const fl_tensor *grads, fl_tensor *bucket);
/* Bytes handed to collectives so far (compress_io's sent, over every bucket). */
uint64_t compressor_sent(const compressor *c);
/* The residual of the bucket starting at `offset` (NULL when it has not run, or the hook keeps
 * none): for tests. */
const float *compressor_residual(const compressor *c, size_t offset);

#endif /* FLINT_GPU_PARALLEL_COMPRESS_H */
