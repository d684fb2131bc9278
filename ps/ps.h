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
/* An update function as the shard blob and the HOST frame carry it: u32 kind, then lr, beta1,
 * beta2 and eps as f32 (PS_UPDATE_BYTES, little-endian). get returns the kind as read: the
 * caller checks it. */
#define PS_UPDATE_BYTES 20
void ps_update_put(uint8_t out[PS_UPDATE_BYTES], const ps_update *u);
uint32_t ps_update_get(const uint8_t in[PS_UPDATE_BYTES], ps_update *u);

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
/* Dense shards: the keys [lo, lo + count), all this shard's (else FL_EINVAL naming the range),
 * bit for bit as push, pull and set of those keys, in one pass without a key array (a model's
 * weights go to the servers as ranges). */
fl_status ps_shard_push_range(ps_shard *s, uint64_t lo, uint64_t count, const float *grads);
fl_status ps_shard_pull_range(const ps_shard *s, uint64_t lo, uint64_t count, float *out);
fl_status ps_shard_set_range(ps_shard *s, uint64_t lo, uint64_t count, const float *values);

/* ---- columns: a dense table of width K holds K vectors over its keys ------------------------
 * Column c of key k is the table's value k * K + c. These operations serve an algorithm whose
 * vectors live on the servers (Sandblaster L-BFGS): each acts on the keys [lo, lo + count) of
 * one or two columns, y the one written and x the one read:
 *   PUSH  y += in      SET   y = in       PULL  out = x      DOT  sum of x y (in double)
 *   AXPY  y += alpha x SCALE y *= alpha   COPY  y = x        FILL y = alpha
 * Arithmetic is in double, stored as float. PUSH adds whatever the table's update function:
 * it is refused on tables whose update is not `add` (their state is per value of a row, and
 * a column push is no row's gradient). */
typedef enum ps_column_kind {
  PS_COLUMN_PUSH = 1,
  PS_COLUMN_SET,
  PS_COLUMN_PULL,
  PS_COLUMN_DOT,
  PS_COLUMN_AXPY,
  PS_COLUMN_SCALE,
  PS_COLUMN_COPY,
  PS_COLUMN_FILL,
} ps_column_kind;
#define PS_COLUMN_LAST PS_COLUMN_FILL

typedef struct ps_column_op {
  ps_column_kind kind;
  uint32_t x, y; /* columns: x read, y written (those the kind uses) */
  double alpha;
  uint64_t lo, count;
} ps_column_op;

/* Whether the kind changes the table (and so is numbered, forwarded and applied once). */
bool ps_column_mutates(ps_column_kind kind);
const char *ps_column_name(ps_column_kind kind);
/* Checks the kind, the columns against the spec's width, and (for a non-add table) a push:
 * FL_EINVAL naming the fault. The range is the caller's to check. */
fl_status ps_column_check(const ps_table_spec *spec, const ps_column_op *op);
/* Applies op to this shard: [lo, lo + count) must be inside the shard's range (FL_EINVAL
 * naming it otherwise, and nothing changes). in: count floats (PUSH, SET); out: count floats
 * (PULL); *dot: the partial sum (DOT). */
fl_status ps_shard_column(ps_shard *s, const ps_column_op *op, const float *in, float *out, double *dot);

/* The whole state (values, the update's slots, per-key steps) as one blob with a CRC-32C
 * (encode replaces *out's contents),
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
/* A worker's clock and whether it retired; and the same set wholesale (a backup adopting a
 * primary's state). */
uint64_t ps_clocks_state(ps_clocks *c, uint32_t worker, bool *retired);
void ps_clocks_restore(ps_clocks *c, uint32_t worker, uint64_t clock, bool retired);
/* Ends every wait, now and later, with FL_ECANCELLED (the host stops). Any thread. */
void ps_clocks_close(ps_clocks *c);

/* ---- the service: servers (ps/server.c) and clients (ps/client.c) ------------------------
 * A server hosts shards of any number of tables and answers workers over TCP (the frames of
 * ps/wire.h). A shard has a primary and, when the table asks, up to PS_MAX_BACKUPS backups on
 * other servers. Each replica applies a change and forwards it to its targets before it
 * answers: primary-backup, the primary's targets are every backup; chain, each replica's
 * target is the next one, and the last answers first. Either way a change is acknowledged
 * only once every replica has applied it. Every mutating request carries its worker's
 * sequence number for that shard, and a shard applies a worker's requests once (the last
 * number is part of the replicated state), so a client that lost the primary resends to the
 * promoted backup without doubling an update; a resend is forwarded even when it is skipped,
 * so that a replica the dead primary had not reached yet gets it. */

/* Room for "HOST:PORT", the terminating zero included. */
#define PS_ADDRESS_MAX 96
/* The largest request or response a server accepts unless told otherwise (ps_server_options). */
#define PS_MESSAGE_MAX_DEFAULT ((uint64_t)1 << 30)

#define PS_MAX_BACKUPS 3

typedef enum ps_replication {
  PS_REPLICATION_PRIMARY_BACKUP = 0, /* the primary forwards to every backup */
  PS_REPLICATION_CHAIN = 1,          /* each replica forwards to the next */
} ps_replication;

typedef struct ps_place {
  char primary[PS_ADDRESS_MAX];
  char backups[PS_MAX_BACKUPS][PS_ADDRESS_MAX]; /* in order; "" after the last */
} ps_place;
static inline uint32_t ps_place_backups(const ps_place *p) {
  uint32_t n = 0;
  while (n < PS_MAX_BACKUPS && p->backups[n][0]) n++;
  return n;
}

/* Where a table lives: its id (unique among the tables of the servers it uses), its spec,
 * how many shards and workers, how its shards replicate, and each shard's place. The caller
 * owns places[shards]. */
typedef struct ps_map {
  uint32_t table;
  ps_table_spec spec;
  uint32_t shards, workers;
  ps_replication replication;
  ps_place *places;
} ps_map;

/* A map as bytes (the handle of flint/ps.h that tasks open workers with), and back: decode
 * checks it all and allocates out->places (ps_map_free). (ps/map.c) */
fl_status ps_map_encode(const ps_map *map, fl_buf *out);
/* The length of the encoded map at p, from its header; 0 when p does not start as one. */
size_t ps_map_size(const void *p);
fl_status ps_map_decode(fl_bytes in, ps_map *out);
void ps_map_free(ps_map *map);

/* Requests of the driver's placement and recovery to one server. PROMOTE: the replica becomes
 * the shard's primary (it takes workers' requests); TARGETS: the replicas it forwards to are
 * now targets[0, n) (NULL, 0: none); REPLICATE: a replica copies its whole state to `backup`
 * (made there first) and forwards to it from then on (appended to its targets); DROP: the
 * server forgets the shard. Blocking. */
fl_status ps_shard_promote(const char *server, const char *secret, uint32_t table, uint32_t shard, uint32_t timeout_ms);
fl_status ps_shard_targets(const char *server, const char *secret, uint32_t table, uint32_t shard,
                           const char (*targets)[PS_ADDRESS_MAX], uint32_t n, uint32_t timeout_ms);
/* The targets of each replica of a place: members [primary, backups...] in that order; *n
 * receives how many targets member i forwards to (primary-backup: the primary all backups;
 * chain: the next member). */
void ps_place_targets(const ps_place *p, ps_replication mode, uint32_t member, char (*out)[PS_ADDRESS_MAX],
                      uint32_t *n);
fl_status ps_shard_replicate(const char *primary, const char *secret, uint32_t table, uint32_t shard,
                             const char *backup, uint32_t timeout_ms);
fl_status ps_shard_drop(const char *server, const char *secret, uint32_t table, uint32_t shard, uint32_t timeout_ms);
/* CLOCKS: the clocks of the shard's workers on `server` (its primary), for the web UI: *n
 * (at most PS_WIRE_CLOCKS_MAX, 4096) into *clocks (malloc'd, common_free), UINT64_MAX for a
 * retired worker. FL_ENOENT when the shard is not there, FL_EPROTO for a malformed answer. */
fl_status ps_shard_clocks(const char *server, const char *secret, uint32_t table, uint32_t shard,
                          uint32_t timeout_ms, uint64_t **clocks, uint32_t *n);

/* A shard as the web UI shows it live (live.c): its replicas' executors, primary first, and
 * its primary's address. */
typedef struct ps_live_shard {
  uint32_t table, shard, members;
  uint64_t member[1 + PS_MAX_BACKUPS];
  char primary[PS_ADDRESS_MAX];
} ps_live_shard;
/* /ps's live figures for the shards (sorted by table): {"<table>": {"shards": [{"shard",
 * "primary", "backups", "clocks": {"<worker>": clock}}]}}, the clocks asked of each primary
 * (500 ms at most each, 2 s in all; a shard not asked in time shows none). Malloc'd; NULL
 * when out of memory. Blocks on the servers. */
char *ps_live_json(const ps_live_shard *shards, size_t n, const char *secret);
/* The table's PsTable event (docs/ui.md) of application `app`, appended to *b (a string):
 * its name ("dense, 1000 keys x 4 floats"), and each shard's replicas' executors, primary
 * first, from members (0 after the last); members NULL: every replica on executor 0 (a local
 * context's). */
fl_status ps_table_event(fl_buf *b, uint64_t app, const ps_map *m, const uint64_t (*members)[1 + PS_MAX_BACKUPS]);

typedef struct ps_server_options {
  const char *secret;   /* every connection opens with it (NULL or "": none) */
  uint64_t max_message; /* 0: PS_MESSAGE_MAX_DEFAULT */
  uint32_t timeout_ms;  /* a frame's bytes, a forward to a backup; 0: 30 s */
} ps_server_options;
#define PS_SERVER_OPTIONS_INIT {NULL, 0, 0}

typedef struct ps_server ps_server;

/* Listens on host:port (port 0: a free one) and serves on a thread per connection: a
 * connection is one worker's (or one primary's) ordered stream of requests, and a pull
 * under SSP may wait there for slower workers without holding anyone else up. options may
 * be NULL. FL_ENET naming the address when it cannot listen, FL_ENOMEM. */
fl_status ps_server_start(const char *host, int port, const ps_server_options *options, ps_server **out);
int ps_server_port(const ps_server *s);
/* Closes the listener and every connection, cancels waiting pulls, joins the threads and
 * frees the server and its shards. Blocks. NULL: no-op. */
void ps_server_stop(ps_server *s);

typedef struct ps_server_stats {
  uint64_t requests, pushes, pulls, forwards, duplicates; /* duplicates: resent pushes skipped */
  uint64_t bytes_in, bytes_out;
} ps_server_stats;
ps_server_stats ps_server_stats_get(ps_server *s);

/* Makes every shard of the map on its primary and backup servers (the HOST request; a shard
 * already hosted there with the same spec is kept, so a retry is harmless). FL_ENET naming
 * a server that cannot be reached, FL_EEXIST when the id is taken by another spec. */
fl_status ps_table_create(const ps_map *map, const char *secret, uint32_t timeout_ms);

typedef struct ps_client ps_client;

/* A worker's client of one table: a connection and a sender thread per shard, so that a
 * batch to several shards travels in parallel. worker: 0 .. map->workers - 1 (each live
 * client of a table has its own). The map is copied. Asks every shard for the worker's
 * clock and starts from it (a retried task's worker goes on where the lost one was), so it
 * blocks on the servers and fails as a pull would (unknown table, unreachable server). */
fl_status ps_client_create(const ps_map *map, uint32_t worker, const char *secret, uint32_t timeout_ms,
                           ps_client **out);
/* Waits for every operation in flight, closes the connections and frees the client. NULL: no-op. */
void ps_client_destroy(ps_client *c);

/* The consistency of this worker's pulls: each pull carries the worker's clock (the number
 * of ps_client_clock calls) and waits on every shard until the slowest worker is within
 * `staleness` of it (0: BSP, PS_STALENESS_ASYNC: ASP, the default). */
void ps_client_set_staleness(ps_client *c, uint32_t staleness);
uint32_t ps_client_worker(const ps_client *c);
uint64_t ps_client_clock_now(const ps_client *c);

/* The asynchronous calls of ps-lite's KVWorker: each splits its batch by shard, queues the
 * parts and returns a ticket at once; ps_client_wait(ticket) blocks until every part is
 * answered and returns the first failure. Buffers (keys, values, out) stay the caller's and
 * must not change or be read until the wait returns. A call that fails returns the error
 * and no ticket. Keys are checked before anything is sent (FL_EINVAL naming the first bad
 * one); a batch larger than the servers accept is FL_ELIMIT. */
fl_status ps_client_push(ps_client *c, const uint64_t *keys, size_t n, const float *grads, uint64_t *ticket);
fl_status ps_client_pull(ps_client *c, const uint64_t *keys, size_t n, float *out, uint64_t *ticket);
/* Dense tables: keys [lo, lo + count) with count x width floats. set overwrites (initial
 * weights) without the update function. */
fl_status ps_client_push_range(ps_client *c, uint64_t lo, uint64_t count, const float *grads, uint64_t *ticket);
fl_status ps_client_pull_range(ps_client *c, uint64_t lo, uint64_t count, float *out, uint64_t *ticket);
fl_status ps_client_set_range(ps_client *c, uint64_t lo, uint64_t count, const float *values, uint64_t *ticket);
/* A column operation (ps_column_op) over [lo, lo + count) of a dense table, split by shard
 * (count PS_COLUMN_TO_END: from lo to the last key). in: PUSH's and SET's count floats;
 * out: PULL's; dot: DOT's result, written when the wait returns FL_OK (the shards' partial
 * sums added in shard order, so the same state gives the same bits). The columns, the
 * range and a push on a table that is not `add` are checked first (FL_EINVAL). Mutating
 * kinds are numbered per shard as pushes are, forwarded to the backup and applied once. */
#define PS_COLUMN_TO_END UINT64_MAX
fl_status ps_client_column(ps_client *c, const ps_column_op *op, const float *in, float *out, double *dot,
                           uint64_t *ticket);
/* A column push numbered by the caller: the shards apply it only when seq (>= 1) is above
 * the last number they applied for this worker, so that the same (worker, seq) pushed again,
 * by a retried or speculative copy of a task opened as the same worker, counts once. A
 * worker that pushes this way should change the table in no other way (its own numbers
 * would mix with the caller's). */
fl_status ps_client_push_column_once(ps_client *c, uint32_t column, uint64_t lo, uint64_t count, const float *grads,
                                     uint64_t seq, uint64_t *ticket);
/* Ends this worker's iteration on every shard (after the pushes queued before it). */
fl_status ps_client_clock(ps_client *c, uint64_t *ticket);
/* This worker leaves: it no longer holds others' pulls back. */
fl_status ps_client_retire(ps_client *c, uint64_t *ticket);
/* Blocks until the ticket's operation is done; FL_EINVAL for an unknown ticket (each is
 * waited once). For a pull, *fresh (may be NULL) is the smallest clock the shards had when
 * they answered: the pull saw every update of iterations before it. */
fl_status ps_client_wait(ps_client *c, uint64_t ticket, uint64_t *fresh);

/* Every shard's state as one file (a header and each shard's blob, read back by
 * ps_table_load through the same checks as a replica's); blocks. */
fl_status ps_table_save(ps_client *c, const char *path);
fl_status ps_table_load(ps_client *c, const char *path);

typedef struct ps_client_stats {
  uint64_t bytes_sent, bytes_received, failovers;
} ps_client_stats;
ps_client_stats ps_client_stats_get(ps_client *c);

#endif /* FLINT_PS_PS_H */
