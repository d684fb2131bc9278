/*
 * rdd.h: the dataset engine's internal header: lineage graph, record batches, iterators,
 * tasks and actions. The layers above (executor, driver) use only what is here.
 *
 * Design. A dataset (struct fl_dataset, called an rdd here) is a node of the lineage graph:
 * an operation, its parents, its function and argument blob, and its persistence level. A
 * task computes one partition of one rdd by opening a chain of pull iterators, one per rdd
 * down to a source or a cached block; records flow through the chain one at a time, so a
 * map -> filter -> reduce chain holds no intermediate data. Only two things materialize a
 * partition: caching it (the block is the record batch) and map_partitions (its output).
 *
 * rdd knows nothing of threads or schedulers: it reaches the job runner (the driver) and the
 * block store (the executor) through the two small vtables in struct fl_context.
 */
#ifndef FLINT_RDD_H
#define FLINT_RDD_H

#include "common/common.h"
#include "net/net.h"

typedef struct fl_dataset rdd;
typedef struct rdd_task rdd_task;

/* ---- record batches: varint-length-prefixed records in one contiguous buffer ----------- */
typedef struct rdd_batch {
  fl_buf buf;
  uint64_t count;
} rdd_batch;

static inline fl_status rdd_batch_append(rdd_batch *b, const void *data, size_t len) {
  uint8_t head[COMMON_VARINT_MAX];
  size_t n = common_varint_put(head, len);
  if (b->buf.cap - b->buf.len < n + len) {
    fl_status s = fl_buf_reserve(&b->buf, n + len);
    if (s != FL_OK) return s;
  }
  memcpy(b->buf.data + b->buf.len, head, n);
  if (len) memcpy(b->buf.data + b->buf.len + n, data, len);
  b->buf.len += n + len;
  b->count++;
  return FL_OK;
}
FL_INTERNAL void rdd_batch_free(rdd_batch *b);
/* Checks that `data` holds exactly `count` well-formed records. */
FL_INTERNAL bool rdd_batch_valid(const uint8_t *data, size_t len, uint64_t count);
/* The number of records in `data` into *count, or false when they are not well-formed. */
FL_INTERNAL bool rdd_batch_count(const uint8_t *data, size_t len, uint64_t *count);

/* Serialized form of a batch (rdd/batch_codec.c): a header (magic, count, raw length) and
 * an LZ4 frame with a content checksum, for cached blocks, shuffle blocks and spilled runs.
 * decode checks everything and fails with FL_ECORRUPT naming `what`. */
FL_INTERNAL fl_status rdd_batch_encode(const rdd_batch *batch, fl_buf *out);
FL_INTERNAL fl_status rdd_batch_decode(fl_bytes in, const char *what, rdd_batch *out);
/* Appends a non-empty batch to the file `fd` (named `path` in messages) as one chunk: a
 * uint32 length, then the batch encoded (enc is scratch). Adds the bytes written to
 * *offset, folds them into *crc (CRC32C) when crc is not NULL, and empties the batch. An
 * empty batch writes nothing. Blocks on disk. */
FL_INTERNAL fl_status rdd_batch_write_chunk(int fd, const char *path, rdd_batch *batch,
                                            fl_buf *enc, uint64_t *offset, uint32_t *crc);

/* A cursor over a batch's bytes. */
typedef struct rdd_cursor {
  const uint8_t *p, *end;
} rdd_cursor;
static inline bool rdd_cursor_next(rdd_cursor *c, fl_bytes *out) {
  uint64_t len;
  size_t n = common_varint_get(c->p, c->end, &len);
  if (n == 0 || len > (uint64_t)(c->end - c->p) - n) return false;
  out->data = c->p + n;
  out->len = len;
  c->p += n + len;
  return true;
}

/* ---- iterators ------------------------------------------------------------------------- */
/*
 * Iterators hand over records in batches of views, so that a chain of them costs one
 * indirect call per batch rather than per record and only the user's functions are called
 * per record. next() fills out[0..n) with 1 <= n <= max records and returns n; it returns 0
 * at the end of the partition or when the task failed (task->status says which). The views
 * stay valid until the next call of next() on the same iterator. Iterators are allocated
 * through rdd_iter_new and closed by the task when it ends, in reverse order of opening.
 */
#define RDD_ITER_BATCH 256u

struct fl_iter {
  uint32_t (*next)(fl_iter *it, fl_bytes *out, uint32_t max);
  /* Optional: the number of records left, when known without reading them; else NULL. */
  bool (*count)(fl_iter *it, uint64_t *left);
  /* Optional: moves every record into *out when they are already in one batch and none
   * was handed out (map_partitions), so that the cache keeps that batch; false otherwise.
   * After an error it returns true with the task's status set. */
  bool (*take)(fl_iter *it, rdd_batch *out);
  void (*close)(fl_iter *it); /* may be NULL */
  rdd_task *task;
  fl_iter *opened_before;
  /* fl_iter_next (one record at a time, for user functions) reads ahead into this. */
  fl_bytes *ahead;
  uint32_t ahead_pos, ahead_len;
};
/* Allocates a zeroed iterator of `size` bytes (a struct whose first member is fl_iter). */
FL_INTERNAL void *rdd_iter_new(rdd_task *task, size_t size,
                               uint32_t (*next)(fl_iter *, fl_bytes *, uint32_t),
                               void (*close)(fl_iter *));
/* An iterator over a batch that stays valid for the task's life. `release` (may be NULL)
 * is called with `handle` when the iterator closes. */
FL_INTERNAL fl_status rdd_iter_batch(rdd_task *task, const rdd_batch *batch,
                                     void (*release)(void *handle), void *handle,
                                     fl_iter **out);

/* ---- partitioners (rdd/partitioner.c) --------------------------------------------------- */
typedef enum rdd_partitioner_kind { PARTITIONER_HASH, PARTITIONER_RANGE, PARTITIONER_CUSTOM } rdd_partitioner_kind;

struct fl_partitioner {
  atomic_int refs;
  rdd_partitioner_kind kind;
  uint32_t num_partitions;
  fl_partition_fn fn;    /* custom */
  fl_compare_fn compare; /* range; NULL: bytewise */
  bool ascending;        /* range */
  void *arg;             /* custom or range: copy of the argument blob */
  size_t arg_len;
  rdd_batch bounds;      /* range: num_partitions - 1 upper bounds, in order */
  fl_bytes *bound_views;
};

/* A partitioner of one reference (arg copied); NULL when out of memory. */
FL_INTERNAL fl_partitioner *rdd_partitioner_new(rdd_partitioner_kind kind, uint32_t n, const void *arg,
                                                size_t arg_len);
FL_INTERNAL void rdd_partitioner_retain(const fl_partitioner *p);
FL_INTERNAL void rdd_partitioner_release(const fl_partitioner *p);
/* Equal partitioners place every key in the same partition. */
FL_INTERNAL bool rdd_partitioner_equal(const fl_partitioner *a, const fl_partitioner *b);
/* The partition of a key. */
FL_INTERNAL uint32_t rdd_partitioner_place(const fl_partitioner *p, fl_bytes key);
/* The same, given the key's common_hash_bytes (which a hash partitioner would compute). */
FL_INTERNAL uint32_t rdd_partitioner_place_hashed(const fl_partitioner *p, fl_bytes key,
                                                  uint64_t key_hash);
/* Key order: the compare function (with its arg), or bytewise when it is NULL. */
static inline int rdd_compare_keys(fl_compare_fn cmp, const void *arg, fl_bytes a, fl_bytes b) {
  if (cmp) return cmp(a, b, arg);
  size_t n = a.len < b.len ? a.len : b.len;
  int c = n ? memcmp(a.data, b.data, n) : 0;
  return c ? c : (a.len > b.len) - (a.len < b.len);
}

/* ---- builtins: flint's own functions that datasets carry ---------------------------------- */
/* Functions of flint itself that a dataset may hold as its function (the helpers of
 * distinct, join, repartition ...). They are hidden, so dladdr cannot name them: a plan
 * names them by a stable name instead, and they need no shipping. Each module lists its own
 * in a table ended by an entry whose name is NULL, and registers it with its plan codecs
 * (rdd_plan_register). */
typedef struct rdd_builtin {
  const char *name;   /* stable across versions: "shuffle.join_emit" */
  void (*fn)(void);
  /* Whether a decoded argument blob is one the function can read safely; NULL: any. */
  bool (*arg_ok)(const void *arg, size_t len);
} rdd_builtin;
FL_INTERNAL extern const rdd_builtin rdd_partitioner_builtins[];

/* ---- shuffle dependencies -------------------------------------------------------------- */
typedef struct rdd_shuffle_dep rdd_shuffle_dep;

/* How values of a key are combined (combine_by_key and its family). */
typedef struct rdd_aggregator {
  fl_map_fn create;            /* NULL: the combiner starts as merge_value(zero, v) or v */
  fl_reduce_fn merge_value;    /* combiner, value -> combiner */
  fl_reduce_fn merge_combiners;
  fl_bytes zero;               /* fold/aggregate: the start of every combiner */
  bool has_zero;
  const void *arg;             /* the user's argument blob */
} rdd_aggregator;

/* The parent's records are pairs, placed by a partitioner into the output of map tasks
 * (one per parent partition) and read by the reduce side. Owned by the shuffled rdd. */
struct rdd_shuffle_dep {
  uint64_t shuffle_id;
  rdd *parent;
  const fl_partitioner *partitioner;
  const rdd_aggregator *map_combine; /* combine values map-side, or NULL */
  fl_compare_fn key_order;           /* sort keys map-side (sort_by_key), or NULL */
  const void *key_order_arg;
  /* The body of a map task: writes the partition's records as this shuffle's output and
   * puts the map status (one uint64 byte count per reduce partition) into *status. */
  fl_status (*write)(rdd_task *task, fl_iter *in, const rdd_shuffle_dep *dep, fl_buf *status);
};

/* ---- the lineage graph ----------------------------------------------------------------- */
typedef struct rdd_ops {
  const char *name;
  /* Opens an iterator over partition p. Runs on a task thread; may block on files. */
  fl_status (*open)(rdd *r, uint32_t p, rdd_task *task, fl_iter **out);
  /* Frees r->state. */
  void (*destroy)(rdd *r);
} rdd_ops;

struct fl_dataset {
  atomic_int refs;
  uint64_t id;
  fl_context *ctx;
  const rdd_ops *ops;
  uint32_t num_partitions;
  rdd *parents[2]; /* narrow dependencies; union has two */
  uint32_t num_parents;
  void (*fn)(void);    /* the user function, cast back by the operation */
  const char *fn_kind; /* "map", "filter", ... for error messages */
  void *arg;           /* copy of the argument blob */
  size_t arg_len;
  void *state; /* operation-specific */
  _Atomic fl_storage_level level;
  const fl_partitioner *partitioner; /* how its pairs are placed, when known (retained) */
  rdd_shuffle_dep *shuffle_deps[2];  /* wide dependencies (owned by the shuffle layer) */
  uint32_t num_shuffle_deps;
  fl_buf plan_node; /* decoded datasets: the plan node they came from (rdd_plan_add), which
                       rdd_plan_encode_stored sends on as it came; else empty */
};

/* Makes an rdd with one reference, taking a reference on each parent. `arg` is copied. */
FL_INTERNAL fl_status rdd_create(fl_context *ctx, const rdd_ops *ops, uint32_t num_partitions,
                                 rdd *const *parents, uint32_t num_parents, void (*fn)(void),
                                 const char *fn_kind, const void *arg, size_t arg_len,
                                 rdd **out);
/* The same, with a given id (a dataset decoded from a plan keeps the id it was made with). */
FL_INTERNAL fl_status rdd_create_id(fl_context *ctx, uint64_t id, const rdd_ops *ops,
                                    uint32_t num_partitions, rdd *const *parents,
                                    uint32_t num_parents, void (*fn)(void), const char *fn_kind,
                                    const void *arg, size_t arg_len, rdd **out);
FL_INTERNAL void rdd_retain(rdd *r);
FL_INTERNAL void rdd_release(rdd *r);
/* Opens partition p of r for a task: from the cache when r is persisted and the block is
 * there, else computed (and then stored when r is persisted). */
FL_INTERNAL fl_status rdd_iterate(rdd *r, uint32_t p, rdd_task *task, fl_iter **out);

/* ---- tasks ----------------------------------------------------------------------------- */
typedef enum rdd_action_kind {
  RDD_ACTION_COUNT,     /* result: uint64 */
  RDD_ACTION_COLLECT,   /* result: varint count, then the records as a batch */
  RDD_ACTION_AGGREGATE, /* result: one byte (1: has a value), then the value */
  RDD_ACTION_FOREACH,   /* result: empty */
  RDD_ACTION_SAVE_TEXT, /* result: empty */
  RDD_ACTION_CHECKPOINT, /* writes the partition's checkpoint file; result: uint64 records */
  RDD_ACTION_SHUFFLE_WRITE, /* a map task; result: the map status (dep->write) */
} rdd_action_kind;

typedef struct rdd_action {
  rdd_action_kind kind;
  uint64_t limit;    /* collect: at most this many records per partition; 0: all */
  fl_reduce_fn seq;  /* aggregate: acc = seq(acc, record) */
  fl_bytes zero;     /* aggregate: the start value, when has_zero */
  bool has_zero;     /* false: reduce (start from the first record) */
  fl_foreach_fn foreach_fn;
  const void *arg;   /* for seq or foreach_fn */
  size_t arg_len;    /* its length (plans carry the blob) */
  const char *path;  /* save, checkpoint: the output folder */
  const rdd_shuffle_dep *dep; /* shuffle write */
} rdd_action;

typedef struct rdd_acc_update {
  uint64_t id;
  fl_buf value; /* i64 or f64 sums as 8 bytes; custom values merged in the task */
} rdd_acc_update;

/* What a task of a barrier stage knows of its stage (driver/scheduler/barrier.c has the protocol):
 * rank is the task's partition. `stage` names the stage within its job; `attempt` counts
 * the stage's attempts (not the task's); gpu: the executor's --gpu id, or -1. */
typedef struct rdd_barrier_info {
  bool on;
  uint32_t stage, attempt, world;
  int32_t gpu;
} rdd_barrier_info;

struct rdd_task {
  fl_context *ctx;
  uint64_t job_id;
  uint32_t partition, attempt;
  const atomic_bool *cancelled; /* set when the job is abandoned; may be NULL */
  fl_status status;             /* first failure */
  char *error;                  /* its message (owned) */
  fl_iter *opened;              /* iterators to close, newest first */
  rdd_acc_update *acc_updates;
  uint32_t num_acc_updates, cap_acc_updates;
  /* Set with an FL_EFETCH failure: the map output that could not be read, which the
   * scheduler then marks lost and computes again (a fetch failure, not a task failure). */
  bool fetch_failed;
  /* A failure that another attempt would repeat (a crash that contain_task_crashes caught:
   * user code is deterministic): the job fails without retrying the task. */
  bool no_retry;
  uint64_t fetch_shuffle_id;
  uint32_t fetch_map;
  rdd_barrier_info barrier; /* set for the tasks of a barrier stage (not by rdd_task_clear) */
  uint64_t run_ns;          /* how long rdd_task_run ran (Spark's executor run time) */
  /* Cached partitions it read from another executor: mapped in place on its node, or
   * fetched over the network (set by the executor's cache). */
  uint32_t blocks_mapped, blocks_fetched;
  /* Bytes the task read and wrote (Spark's task metrics), added where the bytes move, by the
   * task's own thread (no task reads on another): input_bytes, read from its source files
   * (compressed size for .gz) or from cached blocks (the block's size where it was found);
   * shuffle_read_bytes, of the shuffle blocks it read, local or fetched; shuffle_write_bytes,
   * of the map output it committed (the data file). */
  uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes;
};

/* Whether the task's job was abandoned (checked once per batch by the terminal loops). */
static inline bool rdd_task_cancelled(const rdd_task *task) {
  return task->cancelled && atomic_load_explicit(task->cancelled, memory_order_relaxed);
}

/* Computes `action` over partition `partition` of r into *result. On failure returns the
 * status and leaves the message in task->error. Runs on a task thread. */
FL_INTERNAL fl_status rdd_task_run(rdd_task *task, rdd *r, const rdd_action *action,
                                   fl_buf *result);
/* After rdd_task_run ended by a crash (common_crash_guard_run, local mode): the task fails
 * with `message` (copied), without a retry; its iterators are dropped unclosed (their state is
 * what the crash left) and the thread's current task is `outer` again (rdd_task_current as
 * it was before the run). */
FL_INTERNAL void rdd_task_crashed(rdd_task *task, rdd_task *outer, const char *message);
/* Frees what the task holds (error, accumulator updates); the task struct is the caller's. */
FL_INTERNAL void rdd_task_clear(rdd_task *task);
/* Records a failure of the task (the first one wins) with the thread's current message. */
FL_INTERNAL fl_status rdd_task_fail(rdd_task *task, fl_status status);
/* As rdd_task_fail, naming the user function that returned `status`. */
FL_INTERNAL fl_status rdd_task_fn_failed(rdd_task *task, const rdd *r, fl_status status);
/* The task running on this thread, or NULL. */
FL_INTERNAL rdd_task *rdd_task_current(void);
/* Records an update as it came from another process (no merging), and forgets them all. */
FL_INTERNAL fl_status rdd_task_add_accumulator(rdd_task *task, uint64_t id, fl_bytes value);
FL_INTERNAL void rdd_task_clear_accumulators(rdd_task *task);
/* Merges a successful task's accumulator updates into the context (driver side). */
FL_INTERNAL void rdd_task_commit_accumulators(rdd_task *task);

/* ---- the context as rdd sees it -------------------------------------------------------- */

/* The job runner, implemented above rdd/: client/local_context.c (the scheduler in this
 * process), client/remote_context.c (jobs on a driver), and the contexts of applications in
 * driver/apps.c and executor/applications.c. */
typedef struct rdd_runtime_ops {
  /* Runs `action` over the listed partitions of r; results[i] receives the result for
   * parts[i]. Blocks the caller until the job ends. On failure the message says what
   * failed, where and how often. */
  fl_status (*run_job)(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                       const rdd_action *action, fl_buf *results);
  /* Optional hooks of a context whose tasks run in other processes (cluster mode): a
   * broadcast of `len` bytes to serve (its value is in the registry, see rdd_shared_lend),
   * a broadcast and a dataset that are gone. May block on the network; called on the thread
   * that made the change. */
  fl_status (*broadcast_created)(void *impl, uint64_t id, uint64_t len);
  void (*broadcast_destroyed)(void *impl, uint64_t id);
  void (*rdd_destroyed)(void *impl, uint64_t id);
  /* Optional: runs service `name` (fl_service_call) where the scheduler lives; NULL: here,
   * in this process (rdd/service.c). Blocks until the service returns. */
  fl_status (*call_service)(void *impl, rdd *job, const char *name, fl_bytes request, fl_buf *reply);
  /* fl_context_post_event: adds an event to the application's web UI and event log. */
  fl_status (*post_event)(void *impl, const char *json);
} rdd_runtime_ops;

/* The service registered under name (rdd/service.c), or NULL. Any thread. */
FL_INTERNAL fl_service_fn rdd_service_find(const char *name);

typedef struct rdd_block_key {
  uint64_t rdd_id;
  uint32_t partition;
} rdd_block_key;

/* The block store for cached partitions: executor/storage/block_manager.c implements it (and
 * the contexts of client/remote_context.c, driver/apps.c and executor/applications.c). */
typedef struct rdd_cache_ops {
  /* Finds a cached block. On a hit sets *batch (readable until release(handle)) and
   * returns true. May read from disk (blocks the task thread). */
  bool (*get)(void *impl, rdd_block_key key, const rdd_batch **batch, void **handle);
  /* Stores a computed partition, taking *batch (emptied). Sets *stored and *handle to a batch
   * the caller may read until release, which is the stored one or, when it could not be
   * kept in memory, a private one. */
  fl_status (*put)(void *impl, rdd_block_key key, fl_storage_level level, rdd_batch *batch,
                   const rdd_batch **stored, void **handle);
  void (*release)(void *impl, void *handle);
  /* Drops every block of an rdd (unpersist). Never blocks on a reader. */
  void (*remove_rdd)(void *impl, uint64_t rdd_id);
  /* Fills the cached-partition counts and bytes of an rdd. */
  void (*info)(void *impl, uint64_t rdd_id, fl_storage_info *out);
  /* Shuffle output: the path of a map task's data file (its index is path + ".index"). */
  void (*shuffle_path)(void *impl, uint64_t shuffle_id, uint32_t map, char *path, size_t len);
  /* Bytes [offset, offset + len) of the block of one reduce partition of one map task into
   * *out (fewer at the block's end), and the block's whole length into *block_len. FL_EFETCH,
   * naming shuffle, map and reduce, when it is missing or unreadable. May block on disk. */
  fl_status (*shuffle_fetch)(void *impl, uint64_t shuffle_id, uint32_t map, uint32_t reduce,
                             uint64_t offset, uint64_t len, fl_buf *out, uint64_t *block_len);
  /* Deletes the output of every map task of a shuffle. */
  void (*shuffle_remove)(void *impl, uint64_t shuffle_id, uint32_t num_maps);
} rdd_cache_ops;

typedef struct rdd_shared rdd_shared; /* broadcasts and accumulators, rdd/shared.c */

/* How a barrier task reaches its stage's coordinator (driver/scheduler/barrier.c): in-process calls
 * in local mode, RPCs to the driver in an executor. Every slot runs on the task's thread and
 * may block (all_gather until every rank arrived); `round` counts the task's all_gather
 * calls from 0. Each returns a status with its message set. */
typedef struct rdd_barrier_ops {
  fl_status (*all_gather)(void *impl, const rdd_task *task, uint32_t round, fl_bytes mine,
                          uint32_t timeout_ms, rdd_batch *all);
  fl_status (*report)(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes message);
  fl_status (*checkpoint_put)(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes state);
  fl_status (*checkpoint_get)(void *impl, const rdd_task *task, uint64_t rdd_id, fl_buf *out);
} rdd_barrier_ops;

/* Limits of the barrier calls (flint.h promises them). */
#define RDD_BARRIER_GATHER_MAX ((size_t)1 << 20)
#define RDD_BARRIER_REPORT_MAX ((size_t)64 << 10)
#define RDD_BARRIER_CHECKPOINT_MAX ((size_t)512 << 20)
#define RDD_BARRIER_TIMEOUT_MS 60000u

/* The state of a barrier_map_partitions dataset (rdd/narrow.c). on_report and user live
 * only where the dataset was made (the client): plans carry gpu alone. */
typedef struct rdd_barrier_state {
  bool gpu;
  void (*on_report)(uint32_t rank, fl_bytes message, void *user);
  void *user;
} rdd_barrier_state;
FL_INTERNAL extern const rdd_ops rdd_barrier_ops_table;
/* The barrier dataset that the tasks of a stage computing r run (r itself or one below it
 * through narrow parents, not below a fully cached one), or NULL. */
FL_INTERNAL rdd *rdd_barrier_find(rdd *r);
/* Calls the on_report of barrier dataset rdd_id, found in root's lineage (across shuffles);
 * false when it has none. */
FL_INTERNAL bool rdd_barrier_deliver(rdd *root, uint64_t rdd_id, uint32_t rank, fl_bytes message);
/* Whether root's lineage holds a barrier dataset with an on_report. */
FL_INTERNAL bool rdd_barrier_reports_wanted(rdd *root);
/* Makes an fl_records from a batch (taken). */
FL_INTERNAL fl_status rdd_records_from_batch(rdd_batch *batch, fl_records **out);

struct fl_context {
  const rdd_runtime_ops *runtime;
  void *runtime_impl;
  const rdd_cache_ops *cache;
  void *cache_impl;
  rdd_shared *shared;
  struct map_output_table *map_outputs; /* shuffle/map_output.c */
  uint32_t cores, default_parallelism;
  uint64_t shuffle_memory; /* bytes a task may sort or aggregate before it spills */
  const char *work_dir;    /* where tasks put their spill files */
  atomic_uint_fast64_t next_rdd_id;
  /* How the context ends and reports (client/local_context.c: local, client/remote_context.c:
   * remote). */
  void (*close)(fl_context *ctx);
  fl_status (*stats)(fl_context *ctx, fl_context_stats *out);
  fl_status (*cancel)(fl_context *ctx); /* fl_cancel_jobs */
  const rdd_barrier_ops *barrier;       /* NULL where no task runs (a remote client) */
  void *barrier_impl;
  /* The context's folder name under checkpoint folders ("ctx-<pid>-<random>"), made by the
   * first fl_checkpoint (rdd/checkpoint.c); empty until then. */
  char checkpoint_name[48];
  /* fl_context_ui_url: the web UI's address ("http://127.0.0.1:4040"), empty when none. */
  char ui_url[128];
};

FL_INTERNAL fl_status rdd_shared_create(rdd_shared **out);
FL_INTERNAL void rdd_shared_destroy(rdd_shared *s);
/* Makes the registry of a context in an executor process, where broadcasts and accumulators
 * were made by a client elsewhere: a broadcast missing here is fetched once with `fetch`
 * (which may block on the network) and kept; adds to an accumulator unknown here are kept
 * as the task's update, custom values as a list of length-prefixed values (their merge
 * function lives with the client), for rdd_shared_merge_update to fold in there. */
FL_INTERNAL void rdd_shared_set_remote(rdd_shared *s,
                                       fl_status (*fetch)(void *arg, uint64_t id, fl_buf *out),
                                       void *arg);
/* An executor's registry: keeps a broadcast that came with a task launch, so that no task
 * fetches it. An id it has already keeps its value. */
FL_INTERNAL fl_status rdd_shared_put_broadcast(rdd_shared *s, uint64_t id, fl_bytes value);
/* An executor's registry: drops a fetched broadcast (the client destroyed it). */
FL_INTERNAL void rdd_shared_forget(rdd_shared *s, uint64_t id);
/* A client's registry, for its block server: lends bytes [offset, offset + len) of broadcast
 * `id` (len 0: to the end; fewer at the end) without copying them, and sets *total to its
 * length. The bytes stay valid, even if the broadcast is destroyed meanwhile, until
 * loan->release(loan->arg) (rdd_shared_return). FL_ENOENT when there is no such broadcast.
 * Any thread; never blocks beyond the registry's lock. */
FL_INTERNAL fl_status rdd_shared_lend(rdd_shared *s, uint64_t id, uint64_t offset, uint64_t len,
                                      dp_loan *loan, uint64_t *total);
FL_INTERNAL void rdd_shared_return(void *entry);
/* Client side: merges an accumulator update that a task in an executor process produced. */
FL_INTERNAL fl_status rdd_shared_merge_update(rdd_shared *s, uint64_t id, fl_bytes update);

/* The body of a checkpoint task (rdd/checkpoint.c): writes the partition read from `in` to
 * its file in folder `dir` (temporary name, fsync, rename) and puts its record count (a
 * uint64) into *result. */
FL_INTERNAL fl_status rdd_checkpoint_write(rdd_task *task, fl_iter *in, const char *dir,
                                           fl_buf *result);

/* Runs `action` over every partition (or the listed ones) and returns the results. */
FL_INTERNAL fl_status rdd_run_job(rdd *r, const uint32_t *parts, uint32_t num_parts,
                                  const rdd_action *action, fl_buf *results);

/* ---- plans (rdd/plan*.c, proto/plan.proto) ----------------------------------------------- */
/*
 * Lineage and actions as bytes, for a client that builds datasets in one process and a
 * driver and executors that schedule and run them in others (as Spark Connect). A plan is a
 * list of nodes, parents first, one per dataset, each with the dataset's original id (and
 * its shuffles' ids); functions travel as a builtin's name (rdd_builtin) or as (library id,
 * symbol), found with dladdr() when encoding and resolved through the codec when decoding.
 * Decoding treats its input as untrusted: every field is checked, and a bad plan is
 * FL_EPROTO with a message naming the node and the field.
 *
 * Threads: encoding only reads the lineage (safe while jobs run on it). An rdd_plan is not
 * thread-safe: its owner calls it from one thread at a time; the datasets it hands out are
 * ordinary datasets of its context, usable by any thread while the plan holds them.
 */
typedef struct rdd_fn_codec {
  /* Encoding: writes into id (a NUL-terminated string of at most id_len - 1 bytes) the id
   * under which the library at `path` travels (the client uploads it once, content-
   * addressed). in_main_program: the function lives in the main executable rather than a
   * shared library; a codec may refuse it (cluster mode does) with a message. NULL slot:
   * only builtins can be encoded. */
  fl_status (*library_id)(void *arg, const char *path, bool in_main_program, char *id,
                          size_t id_len);
  /* Decoding: the function `symbol` of library `id` into *fn. NULL slot (or NULL codec):
   * functions stay unresolved, as on the driver, which schedules but never runs user code;
   * they get a placeholder that aborts if it is ever called. */
  fl_status (*resolve)(void *arg, const char *id, const char *symbol, void (**fn)(void));
  void *arg;
} rdd_fn_codec;

/* The datasets decoded so far into one context, by id. */
typedef struct rdd_plan rdd_plan;

/* Most partitions (of a dataset or a partitioner) a decoded plan may ask for. */
#define RDD_PLAN_MAX_PARTITIONS (1u << 24)

/* Makes an empty plan whose datasets will belong to ctx; the codec (copied; may be NULL) is
 * used by rdd_plan_add and rdd_action_decode. */
FL_INTERNAL fl_status rdd_plan_create(fl_context *ctx, const rdd_fn_codec *codec, rdd_plan **out);
/* Releases the plan's references to its datasets (datasets still referenced elsewhere stay);
 * NULL does nothing. */
FL_INTERNAL void rdd_plan_destroy(rdd_plan *p);

/* Appends to *out the nodes of r and of its ancestors (through narrow parents and through
 * shuffle dependencies' parents), parents first, each once. A dataset for which
 * known(known_arg, id) is true is skipped together with its ancestors (the receiver has
 * them); known may be NULL. Fails with FL_EINVAL naming the function, its kind and the
 * dataset when a function cannot be named (not exported, or refused by the codec), and
 * then *out may hold part of a plan (truncate it). Appending two encodings gives one plan
 * with the nodes of both. */
FL_INTERNAL fl_status rdd_plan_encode(rdd *r, bool (*known)(void *arg, uint64_t id),
                                      void *known_arg, const rdd_fn_codec *codec, fl_buf *out);
/* Decodes the nodes of `encoded` into the plan, skipping ids it already holds (they keep
 * their state). A node's parents must be in the plan or earlier in `encoded`. On failure
 * (FL_EPROTO for a malformed plan; the codec's status, wrapped, for a function it cannot
 * resolve; FL_ENOMEM) the plan is as it was before the call. Raises the context's next id
 * above every decoded id, so that datasets made there later do not collide with them. */
FL_INTERNAL fl_status rdd_plan_add(rdd_plan *p, fl_bytes encoded);
/* The dataset `id`, or NULL. Borrowed: valid while the plan holds it (until it is released
 * and no held dataset depends on it); retain it to keep it longer. */
FL_INTERNAL rdd *rdd_plan_find(rdd_plan *p, uint64_t id);
/* The shuffle dependency `shuffle_id` of a held dataset (for map tasks), or NULL. Borrowed,
 * as rdd_plan_find. */
FL_INTERNAL const rdd_shuffle_dep *rdd_plan_find_shuffle(rdd_plan *p, uint64_t shuffle_id);
/* As rdd_plan_encode for dataset `id` of the plan, but appends the node bytes as they were
 * decoded, without looking at functions: the driver forwards plan parts to executors so.
 * FL_ENOENT when the plan does not hold `id`. */
FL_INTERNAL fl_status rdd_plan_encode_stored(rdd_plan *p, uint64_t id,
                                             bool (*known)(void *arg, uint64_t id),
                                             void *known_arg, fl_buf *out);
/* Marks dataset `id` released (the client freed it) and drops from the plan every released
 * dataset that no unreleased one depends on: `id` itself stays while an unreleased dataset
 * of the plan depends on it. Unknown ids are ignored. */
FL_INTERNAL void rdd_plan_release(rdd_plan *p, uint64_t id);
/* The dataset that reads shuffle `shuffle_id` (whose node carries the dependency), or NULL. */
FL_INTERNAL rdd *rdd_plan_shuffle_owner(rdd_plan *p, uint64_t shuffle_id);

/* Appends the encoding of an action (not RDD_ACTION_SHUFFLE_WRITE: a map task's dependency
 * is found with rdd_plan_find_shuffle) to *out. Errors as rdd_plan_encode. */
FL_INTERNAL fl_status rdd_action_encode(const rdd_action *a, const rdd_fn_codec *codec,
                                        fl_buf *out);
/* Decodes an action, resolving its functions through the plan's codec. The zero, arg and
 * path of *out are owned copies: free them with rdd_action_clear. On failure *out is
 * untouched. */
FL_INTERNAL fl_status rdd_action_decode(rdd_plan *p, fl_bytes in, rdd_action *out);
/* Frees what rdd_action_decode allocated and zeroes *a. Only for decoded actions. */
FL_INTERNAL void rdd_action_clear(rdd_action *a);

/* ---- plan codecs: each operation encodes and decodes its own node fields ------------------ */
/*
 * rdd/plan.c encodes and checks what every node has (id, operation, kind, partitions,
 * parents, function, argument, storage level, partitioner) and leaves the rest of the
 * PlanNode message to the operation's codec, so that an operation's state stays private to
 * the module that defines it. rdd/ registers the codecs of its own operations; a module
 * above it registers its own once per process, before any plan is encoded or decoded
 * (shuffle/plan_codec.c does so from a constructor). The codecs work on the messages of
 * proto/plan.proto (include "proto/plan.pb-c.h"); nothing here changes the bytes on the wire.
 */
struct Flint__PlanNode;
struct Flint__PlanFn;
typedef struct rdd_plan_enc rdd_plan_enc; /* the node being encoded (rdd/plan.c) */
typedef struct rdd_plan_dec rdd_plan_dec; /* the node being decoded */

/* What plan.c checks of an operation's nodes before its codec sees them. */
typedef enum rdd_op_shape {
  RDD_SHAPE_SOURCE,   /* no parents, no function */
  RDD_SHAPE_FN,       /* one parent, a function, the parent's partitions */
  RDD_SHAPE_UNARY,    /* one parent, no function, the parent's partitions */
  RDD_SHAPE_UNION,    /* two parents, the sum of their partitions */
  RDD_SHAPE_COALESCE, /* one parent, at most its partitions */
  RDD_SHAPE_WIDE,     /* narrow parents and a function as the codec checks them */
} rdd_op_shape;

/* The PlanNode fields an operation owns besides the common ones: a node that sets a field its
 * operation does not own is refused. RDD_PLAN_ARG: the node may carry an argument blob. */
enum {
  RDD_PLAN_ARG = 1u << 0,
  RDD_PLAN_PARTITIONS = 1u << 1, /* partitions */
  RDD_PLAN_RANGE = 1u << 2,      /* range */
  RDD_PLAN_FILES = 1u << 3,      /* files */
  RDD_PLAN_STARTS = 1u << 4,     /* starts */
  RDD_PLAN_SHUFFLED = 1u << 5,   /* shuffled */
  RDD_PLAN_CHECKPOINT = 1u << 6, /* checkpoint */
  RDD_PLAN_BARRIER = 1u << 7,    /* barrier, barrier_gpu (barrier is set exactly on these) */
};

/* One operation's codec. Every slot may be NULL; none blocks. Decoding slots report a bad
 * node with rdd_plan_bad. */
typedef struct rdd_op_codec {
  const rdd_ops *ops; /* NULL ends a module's table */
  rdd_op_shape shape;
  unsigned fields; /* RDD_PLAN_* */
  /* The kinds (rdd.fn_kind) its nodes may carry besides ops->name, ended by NULL. */
  const char *const *kinds;
  /* Sets the fields it owns in *m from r. Parts of the message come from rdd_plan_enc_alloc;
   * the message may point into r's state, which outlives the packing. */
  fl_status (*encode)(rdd_plan_enc *e, const rdd *r, struct Flint__PlanNode *m);
  /* Checks the fields it owns and builds the dataset's state into *state, before the
   * dataset is made. part: the node's decoded partitioner, or NULL. */
  fl_status (*decode)(rdd_plan_dec *d, const struct Flint__PlanNode *m, const fl_partitioner *part,
                      void **state);
  /* Frees a state that decode built when the dataset could not be made. */
  void (*free_state)(void *state);
  /* Once the dataset is made (parents, function, argument, partitioner set): gives r its
   * state, taking `state` in every case. NULL: r->state = state. On failure plan.c releases
   * r, so ops->destroy must accept what attach left. */
  fl_status (*attach)(rdd_plan_dec *d, const struct Flint__PlanNode *m, rdd *r, void *state);
} rdd_op_codec;

/* Registers a module's operation codecs (a table ended by an entry whose ops is NULL) and
 * its builtins (ended by an entry whose name is NULL; may be NULL) for every plan of the
 * process. Call once per module, before any plan is encoded or decoded and never from two
 * threads at once (a constructor does both); at most 8 modules. */
FL_INTERNAL void rdd_plan_register(const rdd_op_codec *codecs, const rdd_builtin *builtins);

/* Encoding helpers for codecs. A zeroed block that lives until the node is packed (NULL
 * when out of memory: then return rdd_plan_enc_nomem()). */
FL_INTERNAL void *rdd_plan_enc_alloc(rdd_plan_enc *e, size_t size);
FL_INTERNAL fl_status rdd_plan_enc_nomem(void);
/* Names fn (what: "sort compare" ... for messages) as a builtin or as (library id, symbol)
 * into *out (NULL when fn is NULL). FL_EINVAL naming the function when it cannot be named. */
FL_INTERNAL fl_status rdd_plan_encode_fn(rdd_plan_enc *e, void (*fn)(void), const char *what,
                                         struct Flint__PlanFn **out);

/* Decoding helpers for codecs. FL_EPROTO with "bad plan: <the node>: <message>". */
FL_INTERNAL fl_status rdd_plan_bad(const rdd_plan_dec *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Resolves a function through the plan's codec (NULL message: *out = NULL). */
FL_INTERNAL fl_status rdd_plan_decode_fn(rdd_plan_dec *d, const struct Flint__PlanFn *m,
                                         const char *what, void (**out)(void));
/* The plan being added to, for finding the node's inputs. */
FL_INTERNAL rdd_plan *rdd_plan_dec_plan(const rdd_plan_dec *d);

#endif /* FLINT_RDD_H */
