/*
 * flint/ps.h: parameter-server tables, as DistBelief's (Downpour SGD) and Li et al.'s
 * (OSDI'14, ps-lite) parameter servers offer them, inside a flint cluster.
 *
 * A table holds `width` floats a key: dense (keys [0, keys): a model's flat weights) or
 * sparse (any 64-bit key: hashed features). It is split into shards, dense keys by ranges
 * and sparse keys by a hash, and the shards live on servers: in a cluster every executor
 * runs one and the driver places the shards (primary on one executor, backup on the next);
 * in local mode the context runs four in its own process. A push carries gradients and the
 * shard applies the table's update function to them (add, SGD, Adagrad as Downpour's, Adam);
 * a pull reads values. Workers (tasks, or the client itself) open the table's handle.
 *
 * Consistency: each worker ends iterations with fl_ps_clock; its pulls carry its clock and
 * wait on the servers until the slowest worker is within `staleness` clocks (0: BSP;
 * FL_PS_ASYNC, the default: ASP, Downpour's never-waiting workers; s: SSP).
 *
 * Faults: with replication (the default) every push and clock reaches each of a shard's
 * backups before it is acknowledged: the primary forwards it to all of them (primary-backup,
 * the default) or to the first, which forwards it to the next (chain). When an executor is lost the driver
 * promotes the backups of its primaries and backs them up again elsewhere, and a worker that
 * lost a primary goes on with the backup: no acknowledged update is lost. A worker whose task
 * is lost for good should be retired (fl_ps_retire) by whoever runs it again, or it holds
 * BSP and SSP pulls back until their timeout (FL_ETIMEDOUT, naming it).
 *
 * Threading: a table handle may be used from any thread; a worker by one thread at a time.
 */
#ifndef FLINT_PS_API_H
#define FLINT_PS_API_H

#include "flint/flint.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_ps_update {
  FL_PS_ADD = 0, /* w += g */
  FL_PS_SGD,     /* w -= lr g */
  FL_PS_ADAGRAD, /* a += g^2; w -= lr g / (sqrt(a) + eps) */
  FL_PS_ADAM,    /* Adam with a step count per key */
} fl_ps_update;

#define FL_PS_ASYNC UINT32_MAX

typedef enum fl_ps_replication {
  FL_PS_PRIMARY_BACKUP = 0, /* the primary forwards each change to every backup */
  FL_PS_CHAIN = 1,          /* each replica forwards to the next; the last answers first */
} fl_ps_replication;

typedef struct fl_ps_options {
  bool sparse;
  uint64_t keys;  /* dense: the number of keys, >= 1; sparse: 0 */
  uint32_t width; /* floats a key, 1 to 65536 */
  fl_ps_update update;
  float lr, beta1, beta2, eps;
  uint32_t shards;  /* 0: one per executor (local mode: 2) */
  uint32_t workers; /* the workers that will open it, >= 1 (their clocks) */
  bool replicate;   /* backups for every shard, each on another server */
  uint32_t backups; /* with replicate: how many a shard (0: 1), at most 3 */
  fl_ps_replication replication;
} fl_ps_options;
#define FL_PS_OPTIONS_INIT {false, 0, 1, FL_PS_ADD, 0.01f, 0.9f, 0.999f, 1e-8f, 0, 1, true, 1, FL_PS_PRIMARY_BACKUP}

typedef struct fl_ps_table fl_ps_table;

/* Makes a table on the context's servers (a cluster's: asked of the driver, which places
 * it). FL_EINVAL naming a bad option; FL_ESTATE when a cluster has too few executors for a
 * shard's primary and backups (each on its own); FL_ENET when a server cannot be reached. The
 * table lives until fl_ps_table_destroy or the context's close. Blocks. */
FL_API fl_status fl_ps_table_create(fl_context *ctx, const fl_ps_options *options, fl_ps_table **out);
/* Frees the table on its servers. NULL: no-op. Before the context closes. */
FL_API void fl_ps_table_destroy(fl_ps_table *t);
/* The bytes a worker opens the table with (a few hundred): pass them to tasks as a
 * function's argument. Valid while the table lives. */
FL_API fl_bytes fl_ps_table_handle(const fl_ps_table *t);
/* A handle's length, read from its first bytes (a task's argument comes without its length):
 * fl_ps_worker_open(fl_bytes_of(arg, fl_ps_handle_size(arg)), k, &w). 0 for bytes that do
 * not start as a handle (the open then fails with FL_EFORMAT). */
FL_API size_t fl_ps_handle_size(const void *handle);
/* Every shard's state to one file, and back (a file of another table's shape is refused
 * with FL_EINVAL, a damaged one with FL_ECORRUPT or FL_EFORMAT naming it; the table is then
 * unchanged). Blocks. */
FL_API fl_status fl_ps_table_save(fl_ps_table *t, const char *path);
FL_API fl_status fl_ps_table_load(fl_ps_table *t, const char *path);

typedef struct fl_ps_worker fl_ps_worker;

/* Opens worker `worker` (0 .. workers - 1) of the table whose handle this is, in a task or
 * in the client. The worker's clock starts where the servers have it: a retried task goes on
 * at the clock its lost attempt reached (fl_ps_worker_stats_get's clock). Blocks on the
 * servers. FL_EFORMAT or FL_ECORRUPT for bytes that are no handle, FL_ENOENT for a table
 * that is gone, FL_ENET when its servers cannot be reached. */
FL_API fl_status fl_ps_worker_open(fl_bytes handle, uint32_t worker, fl_ps_worker **out);
/* Waits for what is in flight and closes. NULL: no-op. */
FL_API void fl_ps_worker_close(fl_ps_worker *w);
FL_API void fl_ps_worker_set_staleness(fl_ps_worker *w, uint32_t staleness);

/* Asynchronous, as ps-lite's: each returns at once with a ticket that fl_ps_wait waits for;
 * the buffers are the caller's and must stay unchanged (and `out` unread) until then. Keys
 * are checked first (FL_EINVAL naming the first bad one). */
FL_API fl_status fl_ps_push(fl_ps_worker *w, const uint64_t *keys, size_t n, const float *grads, uint64_t *ticket);
FL_API fl_status fl_ps_pull(fl_ps_worker *w, const uint64_t *keys, size_t n, float *out, uint64_t *ticket);
/* Dense tables: the keys [lo, lo + count), count x width floats. set overwrites without the
 * update function (initial weights). */
FL_API fl_status fl_ps_push_range(fl_ps_worker *w, uint64_t lo, uint64_t count, const float *grads, uint64_t *ticket);
FL_API fl_status fl_ps_pull_range(fl_ps_worker *w, uint64_t lo, uint64_t count, float *out, uint64_t *ticket);
FL_API fl_status fl_ps_set_range(fl_ps_worker *w, uint64_t lo, uint64_t count, const float *values, uint64_t *ticket);
/* Ends this worker's iteration on every shard; its later pulls carry the next clock. */
FL_API fl_status fl_ps_clock(fl_ps_worker *w, uint64_t *ticket);
/* This worker (or the lost task it stands for) leaves: it holds no pull back any more. */
FL_API fl_status fl_ps_retire(fl_ps_worker *w, uint64_t *ticket);
/* Blocks until the ticket's call is answered by every shard; its status (the first
 * failure, with its message). For a pull, *fresh (may be NULL) is the smallest clock the
 * shards had: the pull saw every update of iterations before it. */
FL_API fl_status fl_ps_wait(fl_ps_worker *w, uint64_t ticket, uint64_t *fresh);

/* ---- vectors on the servers (Sandblaster) --------------------------------------------------
 * A dense table of width K holds K vectors ("columns") over its keys: column c of key k is
 * value k * K + c. These calls act on the keys [lo, lo + count) of a column (count
 * FL_PS_TO_END: from lo to the last key), split by shard, so that an algorithm keeps its
 * vectors on the servers and moves scalars only (docs/ps.md, "Columns": each call's bytes).
 * They are asynchronous like the calls above: each returns a ticket for fl_ps_wait, and a
 * worker's calls reach each shard in the order made, so a dot issued after an axpy sees it
 * without waiting for the axpy first. Arithmetic is in double on the servers, stored as
 * float. Errors before anything is sent (FL_EINVAL): a sparse table, a column >= the width,
 * a range outside the table, a non-finite alpha, a push on a table whose update is not
 * FL_PS_ADD. Changes are forwarded to the backup and numbered like pushes. */
#define FL_PS_TO_END UINT64_MAX
/* Column y of [lo, lo + count) += grads (count floats). */
FL_API fl_status fl_ps_push_column(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *grads,
                                   uint64_t *ticket);
/* The same push numbered by the caller (seq >= 1) instead of the worker: each shard applies
 * it only when seq is above the last number it applied for this worker, so a task retried
 * or run twice by speculation, opened as the same worker and pushing the same (worker, seq),
 * adds once; a later seq adds again. A worker that pushes this way should make no other
 * change to the table (the worker's own numbering would mix with the caller's). */
FL_API fl_status fl_ps_push_range_once(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *grads,
                                       uint64_t seq, uint64_t *ticket);
/* Column y of [lo, lo + count) = values; out = column x (count floats). */
FL_API fl_status fl_ps_set_column(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *values,
                                  uint64_t *ticket);
FL_API fl_status fl_ps_pull_column(fl_ps_worker *w, uint32_t x, uint64_t lo, uint64_t count, float *out,
                                   uint64_t *ticket);
/* *out = sum of x_k y_k over the range: each shard answers its part as a double and the
 * wait adds them in shard order (the same state gives the same bits); *out is written when
 * fl_ps_wait returns FL_OK and must not be read before. */
FL_API fl_status fl_ps_dot(fl_ps_worker *w, uint32_t x, uint32_t y, uint64_t lo, uint64_t count, double *out,
                           uint64_t *ticket);
/* y += alpha x; y *= alpha; y = x; y = alpha. */
FL_API fl_status fl_ps_axpy(fl_ps_worker *w, double alpha, uint32_t x, uint32_t y, uint64_t lo, uint64_t count,
                            uint64_t *ticket);
FL_API fl_status fl_ps_scale(fl_ps_worker *w, double alpha, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket);
FL_API fl_status fl_ps_copy(fl_ps_worker *w, uint32_t x, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket);
FL_API fl_status fl_ps_fill(fl_ps_worker *w, double alpha, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket);

typedef struct fl_ps_worker_stats {
  uint64_t bytes_sent, bytes_received; /* frames, headers included */
  uint64_t clock;                      /* fl_ps_clock calls */
  uint64_t failovers;                  /* primaries replaced by their backups */
} fl_ps_worker_stats;
FL_API fl_ps_worker_stats fl_ps_worker_stats_get(fl_ps_worker *w);

#ifdef __cplusplus
}
#endif

#endif /* FLINT_PS_API_H */
