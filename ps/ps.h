/*
 * ps/ps.h: the parameter server's own layer (issue 35): what a server holds and how it changes,
 * as DistBelief's (Downpour) and Li et al.'s (OSDI'14) parameter servers define it.
 *
 * A table is a key-value store of float vectors: `width` floats a key, keys either dense (the
 * range [0, keys): a model's flat weights) or sparse (any 64-bit key: hashed features, rows
 * that exist once pushed). A table is split into shards: dense keys by contiguous ranges, as
 * ps-lite's range partition; sparse keys by a hash of the key. A push carries gradients for a
 * batch of keys and the shard applies the table's update function to each (add, SGD, Adagrad
 * as Downpour's, Adam with a step count per key); a pull reads values. Clocks (ps_clocks)
 * give the consistency models: a worker at clock c reads only once every worker has reached
 * c - s (SSP with staleness s; s 0 is BSP, s PS_STALENESS_ASYNC never waits: ASP).
 *
 * This layer holds state and arithmetic only: who hosts a shard, and how pushes and pulls
 * reach it, sit above it. Everything that arrives from elsewhere (keys, blobs) is checked.
 *
 * Threading: a shard is used by one thread at a time (its host serializes the requests); a
 * clock table locks itself, since workers wait on it from their own threads.
 */
#ifndef FLINT_PS_PS_H
#define FLINT_PS_PS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* ---- tables ---------------------------------------------------------------------------- */

typedef enum ps_update_kind {
  PS_UPDATE_ADD = 0, /* w += g: a plain sum (accumulators, Sandblaster's gradient sums) */
  PS_UPDATE_SGD,     /* w -= lr g */
  PS_UPDATE_ADAGRAD, /* a += g^2; w -= lr g / (sqrt(a) + eps)  (Downpour's, PyTorch's rule) */
  PS_UPDATE_ADAM,    /* per key: t += 1; m, v as Adam; w -= lr m^ / (sqrt(v^) + eps) */
} ps_update_kind;

typedef struct ps_update {
  ps_update_kind kind;
  float lr;           /* sgd, adagrad, adam: > 0 */
  float beta1, beta2; /* adam: [0, 1) */
  float eps;          /* adagrad, adam: > 0 */
} ps_update;
#define PS_UPDATE_INIT {PS_UPDATE_ADD, 0.01f, 0.9f, 0.999f, 1e-8f}

typedef struct ps_table_spec {
  bool sparse;     /* 64-bit keys (rows made on first push) instead of [0, keys) */
  uint64_t keys;   /* dense: the number of keys, >= 1; sparse: 0 */
  uint32_t width;  /* floats a key, 1 to 65536 */
  ps_update update;
} ps_table_spec;

/* FL_EINVAL naming the first bad field. */
fl_status ps_table_spec_check(const ps_table_spec *spec);
/* "add", "sgd", "adagrad", "adam"; FL_EINVAL otherwise. */
fl_status ps_update_parse(const char *text, ps_update_kind *out);
const char *ps_update_name(ps_update_kind kind);

/* ---- partitioning ------------------------------------------------------------------------
 * Dense: shard s of S holds [ps_range_lo(s), ps_range_lo(s + 1)), ranges as equal as can be
 * (the first keys % S ranges one key longer). Sparse: the shard of common_hash64(key) % S.
 * A dense key >= keys has no shard: the answer is then >= S (the shard calls refuse it). */
uint32_t ps_shard_of(const ps_table_spec *spec, uint32_t shards, uint64_t key);
uint64_t ps_range_lo(const ps_table_spec *spec, uint32_t shards, uint32_t shard);

/* ---- shards ---------------------------------------------------------------------------- */

typedef struct ps_shard ps_shard;

/* Shard `index` of `shards` of a table; dense values start at 0. FL_EINVAL for a bad spec or
 * index, FL_ENOMEM. */
fl_status ps_shard_create(const ps_table_spec *spec, uint32_t shards, uint32_t index, ps_shard **out);
void ps_shard_destroy(ps_shard *s);
const ps_table_spec *ps_shard_spec(const ps_shard *s);
/* Keys held: the range's size (dense), the keys pushed or set so far (sparse). */
uint64_t ps_shard_size(const ps_shard *s);

/* Applies the update to each key with its gradient (grads: n x width floats), in order (a
 * key twice is updated twice). Every key is checked first: one that is not this shard's (out
 * of the table, or another shard's) is FL_EINVAL naming it, and nothing changes. */
fl_status ps_shard_push(ps_shard *s, const uint64_t *keys, size_t n, const float *grads);
/* Reads n keys' values into out (n x width floats); a sparse key never pushed reads 0 (and
 * is not made). Keys are checked as push's. */
fl_status ps_shard_pull(const ps_shard *s, const uint64_t *keys, size_t n, float *out);
/* Overwrites n keys' values (initial weights, a restore); the update state is left alone. */
fl_status ps_shard_set(ps_shard *s, const uint64_t *keys, size_t n, const float *values);

/* The whole state (values, the update's slots, per-key steps) as one blob with a CRC-32C,
 * and back: decode checks the blob completely (magic, version, the table, the counts, every
 * key) and replaces the shard's contents only when all of it is valid (FL_EFORMAT,
 * FL_ECORRUPT or FL_EINVAL naming what is wrong). Replication and checkpoints use it. */
fl_status ps_shard_encode(const ps_shard *s, fl_buf *out);
fl_status ps_shard_decode(ps_shard *s, fl_bytes blob);

/* ---- clocks and consistency ---------------------------------------------------------------
 * Each worker's clock counts the iterations it finished. A worker about to read at clock c
 * under staleness s waits until every live worker's clock is >= c - s (Ho et al.'s SSP): it
 * then sees every update of iterations before c - s. BSP is s = 0, ASP never waits. A worker
 * that left (its task lost for good) is retired and no longer holds the others back. */
#define PS_STALENESS_ASYNC UINT32_MAX

typedef struct ps_clocks ps_clocks;

fl_status ps_clocks_create(uint32_t workers, ps_clocks **out);
void ps_clocks_destroy(ps_clocks *c);
/* The worker finished an iteration: its clock becomes *clock (may be NULL). Wakes waiters.
 * FL_EINVAL for an unknown or retired worker. */
fl_status ps_clocks_advance(ps_clocks *c, uint32_t worker, uint64_t *clock);
fl_status ps_clocks_retire(ps_clocks *c, uint32_t worker);
uint64_t ps_clocks_of(ps_clocks *c, uint32_t worker);
/* The smallest clock of the live workers (UINT64_MAX when none is live). */
uint64_t ps_clocks_min(ps_clocks *c);
/* Blocks until ps_clocks_min >= clock - staleness (at once for ASP), then gives that minimum
 * in *fresh (may be NULL): the reader sees every update of iterations before it. After
 * timeout_ms (0: never): FL_ETIMEDOUT naming the slowest worker and its clock. */
fl_status ps_clocks_wait(ps_clocks *c, uint64_t clock, uint32_t staleness, uint32_t timeout_ms,
                         uint64_t *fresh);

#endif /* FLINT_PS_PS_H */
