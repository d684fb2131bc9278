/*
 * flint.h: the public C API of flint, a dataflow engine for machine learning.
 *
 * A program opens a context, builds partitioned datasets from memory or files, transforms
 * them with plain C functions, caches them, and runs actions that return results at once:
 *
 *     fl_context *ctx;
 *     fl_dataset *nums, *squares;
 *     uint64_t n;
 *     fl_context_open("local[4]", NULL, &ctx);
 *     fl_range(ctx, 0, 1000, 1, 8, &nums);
 *     fl_map(nums, square, NULL, 0, &squares);
 *     fl_count(squares, &n);
 *
 * Conventions (every function keeps them):
 * - A call that can fail returns fl_status: FL_OK (0) is success; anything else leaves the
 *   out-parameters untouched, and fl_last_error() gives a message naming the cause.
 * - Out-parameters come last. Handles are opaque and come in pairs (open/close,
 *   create/destroy, ..._free); passing NULL to a destroy function does nothing.
 * - A context is thread-safe: several threads may build datasets and run actions on it at
 *   once. Each action blocks its calling thread until the job ends.
 * - User functions run on task threads, any number at once: they must not keep state in
 *   globals without locking. Their `arg` is a copy of the blob given when the dataset was
 *   made (the C stand-in for a closure); it stays valid for the dataset's life.
 */
#ifndef FLINT_FLINT_H
#define FLINT_FLINT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLINT_BUILDING)
#define FL_API __attribute__((visibility("default")))
#else
#define FL_API
#endif

#define FL_VERSION_MAJOR 0
#define FL_VERSION_MINOR 1
#define FL_VERSION_PATCH 0
#define FL_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------------------
 * Errors. One table: each entry is (NAME, value, description).
 * ------------------------------------------------------------------------------------- */
#define FL_STATUS_TABLE(X)                                                                   \
  X(OK, 0, "success")                                                                        \
  X(EINVAL, 1, "invalid argument")                                                           \
  X(ENOMEM, 2, "out of memory")                                                              \
  X(EIO, 3, "input/output error")                                                            \
  X(ENOENT, 4, "no such file or object")                                                     \
  X(EFORMAT, 5, "malformed input")                                                           \
  X(EEMPTY, 6, "empty dataset")                                                              \
  X(EUSER, 7, "user function failed")                                                        \
  X(EJOB, 8, "job failed")                                                                   \
  X(ECORRUPT, 9, "corrupt data (checksum or frame)")                                         \
  X(ECANCELLED, 10, "cancelled")                                                             \
  X(ESTATE, 11, "operation not valid in this state")                                         \
  X(EEXIST, 12, "already exists")                                                            \
  X(ELIMIT, 13, "size or count limit exceeded")                                              \
  X(EINTERNAL, 14, "internal error")                                                        \
  X(EFETCH, 15, "shuffle output could not be fetched (missing or corrupt)")                  \
  X(ENET, 16, "network error (peer unreachable or connection lost)")                        \
  X(EAUTH, 17, "authentication failed (missing or wrong shared secret)")                    \
  X(ETIMEDOUT, 18, "timed out")                                                             \
  X(EPROTO, 19, "malformed or oversized message")                                           \
  X(EDEVICE, 20, "device error (CUDA, cuBLAS or NCCL)")                                     \
  X(EPEER, 21, "a peer rank failed or left the group")                                      \
  X(ESLOTS, 22, "not enough free slots for a barrier stage")                                 \
  X(ENODEVICE, 23, "no usable device (no GPU or no CUDA in this process)")

typedef enum fl_status {
#define FL_STATUS_ENUM_(name, value, text) FL_##name = value,
  FL_STATUS_TABLE(FL_STATUS_ENUM_)
#undef FL_STATUS_ENUM_
} fl_status;

/* The description of a code ("invalid argument"); never NULL. */
FL_API const char *fl_strerror(fl_status status);
/* The name of a code ("FL_EINVAL"); never NULL. */
FL_API const char *fl_status_name(fl_status status);
/* The calling thread's message for its last failed call. Valid until the thread's next
 * flint call; never NULL ("" when there is none). */
FL_API const char *fl_last_error(void);
/* Sets the calling thread's message and returns `status`, so that a user function can
 * write `return fl_set_error(FL_EFORMAT, "bad number '%s'", s);`. */
FL_API fl_status fl_set_error(fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------------------------------
 * Bytes and buffers. A record is a byte string; a pair is two (see fl_pair_*).
 * ------------------------------------------------------------------------------------- */

/* A view of bytes owned by someone else; valid as long as the owner says. */
typedef struct fl_bytes {
  const uint8_t *data;
  size_t len;
} fl_bytes;

/* A growable byte buffer. Zero-initialise it (FL_BUF_INIT); free it with fl_buf_free. The
 * engine hands user functions a cleared buffer to write their output into. */
typedef struct fl_buf {
  uint8_t *data;
  size_t len;
  size_t cap;
} fl_buf;
#define FL_BUF_INIT {NULL, 0, 0}

/* flint's allocator. An fl_buf's memory and everything else flint allocates comes from it,
 * and flint's add-on libraries (libflint_gpu) allocate through it too, so that one allocator
 * serves the process (as sqlite3_malloc serves SQLite's extensions). A size of 0 gives a
 * unique pointer. NULL when out of memory (the thread's message is left as it is). Any
 * thread; never blocks beyond the system allocator. */
FL_API void *fl_malloc(size_t size);
FL_API void *fl_calloc(size_t count, size_t size);
/* As realloc: on failure p stays valid and unchanged. */
FL_API void *fl_realloc(void *p, size_t size);
/* Frees memory from the three above; NULL does nothing. */
FL_API void fl_free(void *p);

/* Makes room for `extra` more bytes. Returns FL_ENOMEM (buffer unchanged) on failure. */
FL_API fl_status fl_buf_reserve(fl_buf *buf, size_t extra);
/* Frees the buffer's memory and resets it to empty. */
FL_API void fl_buf_free(fl_buf *buf);

static inline fl_status fl_buf_append(fl_buf *buf, const void *data, size_t len) {
  if (buf->cap - buf->len < len) {
    fl_status s = fl_buf_reserve(buf, len);
    if (s != FL_OK) return s;
  }
  if (len) memcpy(buf->data + buf->len, data, len);
  buf->len += len;
  return FL_OK;
}

static inline fl_bytes fl_bytes_of(const void *data, size_t len) {
  fl_bytes b = {(const uint8_t *)data, len};
  return b;
}
static inline fl_bytes fl_bytes_str(const char *s) { return fl_bytes_of(s, strlen(s)); }
static inline fl_bytes fl_buf_bytes(const fl_buf *buf) { return fl_bytes_of(buf->data, buf->len); }

/* Typed records: int64 and double are 8 bytes, little-endian (the host order on every
 * platform flint supports). The getters read the first 8 bytes; a shorter record reads 0. */
static inline int64_t fl_i64(fl_bytes rec) {
  int64_t v = 0;
  if (rec.len >= 8) memcpy(&v, rec.data, 8);
  return v;
}
static inline double fl_f64(fl_bytes rec) {
  double v = 0;
  if (rec.len >= 8) memcpy(&v, rec.data, 8);
  return v;
}
static inline fl_status fl_buf_put_i64(fl_buf *buf, int64_t v) { return fl_buf_append(buf, &v, 8); }
static inline fl_status fl_buf_put_f64(fl_buf *buf, double v) { return fl_buf_append(buf, &v, 8); }

/* Parses a size: digits with an optional k, m, g or t suffix (powers of 1024) and an
 * optional b ("512m", "2GB", "1048576"). FL_EINVAL, naming the text, for anything else. */
FL_API fl_status fl_parse_size(const char *text, uint64_t *out);

/* Pairs: a record holding a key and a value (a varint key length, the key, the value). */
FL_API fl_status fl_buf_put_pair(fl_buf *buf, fl_bytes key, fl_bytes value);
/* Splits a pair record into views of its key and value. FL_EFORMAT if `rec` is no pair. */
FL_API fl_status fl_pair(fl_bytes rec, fl_bytes *key, fl_bytes *value);

/* ---------------------------------------------------------------------------------------
 * Context.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_context fl_context;

typedef enum fl_storage_level {
  FL_STORAGE_NONE = 0,
  FL_MEMORY_ONLY,     /* record batches in memory; evicted partitions are recomputed */
  FL_MEMORY_SER,      /* LZ4-compressed batches in memory; evicted ones are recomputed */
  FL_MEMORY_AND_DISK, /* in memory; evicted partitions are written to local disk */
  FL_DISK_ONLY,       /* LZ4-compressed batches on local disk only */
} fl_storage_level;

typedef struct fl_options {
  /* Bytes of cached blocks kept in memory before the least recently used are evicted.
   * 0: FLINT_MEMORY from the environment (a bare number there is MiB), else 60% of the machine's physical memory (of the
   * cgroup's memory limit where lower), as Spark's spark.memory.fraction. Local mode only:
   * cluster executors cache within their --memory. */
  uint64_t memory_limit;
  /* Partitions used when a call is given 0. 0: the number of task threads. */
  uint32_t default_parallelism;
  /* Attempts of a task before its job fails. 0: 4 (as Spark's spark.task.maxFailures). */
  uint32_t max_task_attempts;
  /* Bytes that one task may hold while it sorts or aggregates shuffle data before it spills
   * sorted runs to disk. 0: FLINT_SHUFFLE_MEMORY from the environment (a bare number there is
   * MiB), else 64 MiB. */
  uint64_t shuffle_memory;
  /* Folder for disk blocks; a fresh folder under it is made and removed on close.
   * NULL: FLINT_WORK_DIR from the environment, else $TMPDIR or /tmp. */
  const char *work_dir;
  /* The application's name on a cluster's driver (what `flint status` lists; copied at
   * open). NULL: FLINT_APP_NAME from the environment, else the program's name. Local
   * contexts ignore it. */
  const char *app_name;
  /* Local mode only (cluster executors have their supervisor): a SIGSEGV, SIGBUS, SIGFPE or
   * SIGILL raised by a task's code on its task thread fails that task ("task crashed: signal
   * 11 (Segmentation fault) in function FN of LIB, running partition P of dataset D") and its
   * job at once (no retry: the code would crash again), instead of ending the process; the
   * context stays usable. Caveat: what the task held when it crashed (memory, locks, half-
   * written state of its own) stays as it was, so a later job touching that may misbehave.
   * The guard's signal handler is installed once per process at the first such open and
   * stays; those signals raised elsewhere (another thread, outside a task) go on to the handler
   * installed before it, else get the default action; a handler installed after it replaces
   * it. Functions are named when exported (dladdr). A stack overflow still ends the process.
   * false: a crash ends the process, as in C. `flint shell` turns it on. */
  bool contain_task_crashes;
  /* A local context serves the web UI (as FLINT_UI=1; fl_context_ui_url says where). A
   * cluster's driver serves one anyway. */
  bool web_ui;
  /* true: no console progress bar while actions run, for a program that draws progress of
   * its own on the terminal (flint train, flint ml). false: Spark's bar of the running
   * stages, "[Stage 3:=====>   (12 + 4) / 40]", on stderr when it is a terminal and
   * FLINT_PROGRESS is on. */
  bool no_console_progress;
} fl_options;
#define FL_OPTIONS_INIT {0, 0, 0, 0, NULL, NULL, false, false, false}

/* Opens a context. `master`: "local" (one task thread), "local[N]" (N threads) or
 * "local[*]" (one per core). `options` may be NULL (all defaults). */
FL_API fl_status fl_context_open(const char *master, const fl_options *options,
                                 fl_context **out);
/* Waits for running jobs, drops every cached block and frees the context. Datasets,
 * broadcasts and accumulators of the context must be freed before; NULL does nothing. */
FL_API void fl_context_close(fl_context *ctx);
/* Number of task threads (the slots tasks run in). */
FL_API uint32_t fl_context_cores(const fl_context *ctx);
/* Whether the context's tasks run in this process (local mode; Spark's isLocal): functions of
 * the program itself can run there, where a cluster needs them in a shared library. */
FL_API bool fl_context_is_local(const fl_context *ctx);
/* Cancels every job of ctx that is running now (as Spark's cancelAllJobs; Spark Connect's
 * interrupt): their actions return FL_ECANCELLED soon after, their running tasks are
 * stopped, and nothing the jobs finished is lost (cached blocks and shuffle output stay for
 * the next job). Jobs started afterwards run normally. Any thread; does not wait. Returns
 * FL_OK, or FL_ENET when a cluster's driver cannot be told. */
FL_API fl_status fl_cancel_jobs(fl_context *ctx);

typedef struct fl_context_stats {
  uint64_t jobs_run, jobs_failed;
  /* Every attempt counts in tasks_run. Through a driver (flint://, local-cluster) these and
   * task_seconds count the attempts of the jobs that succeeded. */
  uint64_t tasks_run, tasks_failed;
  /* The attempts' time in their functions (reading input, computing, writing output), summed
   * over attempts: Spark's executor run time. What a job took beyond it, over the cores, is
   * the engine's: scheduling, messages, results. */
  double task_seconds;
  /* Cached partitions dropped or spilled for memory, and bytes of cached blocks in memory
   * now. Through a driver (flint://, local-cluster) these are the context's own blocks on
   * its live executors, asked of them by this call (which then fails with the driver's
   * error when the driver cannot be reached): evictions of its blocks, whichever
   * application's block needed the room, counted until the context closes; an executor
   * that was lost takes its figures with it. */
  uint64_t blocks_evicted;
  uint64_t memory_used;
  /* Through a driver: cached partitions that tasks read from another executor, mapped in
   * place from one on the same node (a node-local read, no copy) or fetched over the network
   * (Spark's remote block reads). 0 in local mode, where every read is in-process. */
  uint64_t blocks_read_mapped, blocks_read_fetched;
  /* Bytes that the successful tasks of the jobs read and wrote (Spark's task metrics,
   * summed): input_bytes from their source files (compressed size for .gz) or cached blocks
   * (each block's size where it was found); shuffle_read_bytes of shuffle blocks, local or
   * fetched; shuffle_write_bytes of map output. A job whose shuffle is read whole reads what
   * its maps wrote. */
  uint64_t input_bytes, shuffle_read_bytes, shuffle_write_bytes;
} fl_context_stats;
FL_API fl_status fl_context_stats_get(fl_context *ctx, fl_context_stats *out);
/* The address of the web UI that shows this context's jobs (docs/ui.md), as Spark's
 * uiWebUrl: a cluster's driver's ("http://HOST:4040"; its REST API is under /api/v1), or a
 * local context's own when FLINT_UI=1. NULL when there is none. Valid until the context closes. */
FL_API const char *fl_context_ui_url(fl_context *ctx);
/* Adds an event of the program's to its application in the web UI and the event log
 * (docs/ui.md): a JSON object of at most 64 KiB whose "Event" is one of TrainStart, TrainStep,
 * TrainPipeline and TrainEnd (libflint_gpu's trainer posts them; the UI draws the curves).
 * "App" and "Time" are filled in. FL_EINVAL naming what is wrong with `json`; FL_OK and
 * nothing done when the context has no UI or event log. */
FL_API fl_status fl_context_post_event(fl_context *ctx, const char *json);

/* How long flint's threads spin before they sleep when they hand work to each other or wait
 * for a peer, in nanoseconds: FLINT_SPIN_US, else 200 us, or 0 in driver and executor
 * processes on machines of at most 4 cores (there a spinning thread takes the core that the
 * one it waits for needs). Code that waits on flint's threads or on other ranks (libflint_gpu's
 * collectives) spins as long. Any thread; read once per process. */
FL_API uint64_t fl_spin_ns(void);

/* ---------------------------------------------------------------------------------------
 * User functions. Each returns FL_OK, or an error code (ideally through fl_set_error, so
 * that the job's message says why). A failed task is retried; see fl_options.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_iter fl_iter;       /* a partition's records, in order */
typedef struct fl_emitter fl_emitter; /* where a function puts its output records */

/* Next record into *rec (valid until the next call); false at the end or after an error
 * upstream (the engine then reports that error). */
FL_API bool fl_iter_next(fl_iter *it, fl_bytes *rec);
/* Emits one record (copied). Returns non-FL_OK when the function should stop and return it. */
FL_API fl_status fl_emit(fl_emitter *out, const void *data, size_t len);
/* A hint from a function that knows its output's size: about `records` more records of
 * `bytes` in all will follow. The output then lives in one allocation written once, which
 * a cached map_partitions dataset keeps as its block without a copy. */
FL_API fl_status fl_emit_reserve(fl_emitter *out, uint64_t records, size_t bytes);

/* map, key_by, map_values: writes one output record into `out` (given cleared). */
typedef fl_status (*fl_map_fn)(fl_bytes rec, fl_buf *out, const void *arg);
/* flat_map: emits zero or more records per input record. */
typedef fl_status (*fl_flat_map_fn)(fl_bytes rec, fl_emitter *out, const void *arg);
/* filter: sets *keep. */
typedef fl_status (*fl_filter_fn)(fl_bytes rec, bool *keep, const void *arg);
/* map_partitions: reads the whole partition and emits its output. */
typedef fl_status (*fl_map_partitions_fn)(uint32_t partition, fl_iter *in, fl_emitter *out,
                                          const void *arg);
/* reduce, fold, aggregate: combines `a` and `b` into `out` (given cleared; never aliases
 * a or b). Reduce and fold need an associative and commutative function. */
typedef fl_status (*fl_reduce_fn)(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
/* foreach. */
typedef fl_status (*fl_foreach_fn)(fl_bytes rec, const void *arg);

/* ---------------------------------------------------------------------------------------
 * Datasets: immutable, partitioned, lazily computed from their lineage. A dataset holds
 * references to its parents, so freeing a parent handle never breaks a child.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_dataset fl_dataset;
typedef struct fl_records fl_records; /* records returned by collect and take */

/* Releases the caller's reference; the dataset (and its cached blocks) goes when the last
 * child that uses it goes. NULL does nothing. */
FL_API void fl_dataset_free(fl_dataset *ds);
FL_API uint32_t fl_dataset_partitions(const fl_dataset *ds);
/* The context the dataset belongs to (Spark's rdd.context). */
FL_API fl_context *fl_dataset_context(const fl_dataset *ds);
/* A short description of the lineage, one line per dataset ("map <- range"). The caller
 * frees it with free(). */
FL_API char *fl_dataset_lineage(const fl_dataset *ds);

/* Sources. num_partitions (or min_partitions) 0 means the default parallelism. */
FL_API fl_status fl_parallelize(fl_context *ctx, const fl_bytes *records, size_t count,
                                uint32_t num_partitions, fl_dataset **out);
/* int64 records start, start+step, ... below end (above end for a negative step). */
FL_API fl_status fl_range(fl_context *ctx, int64_t start, int64_t end, int64_t step,
                          uint32_t num_partitions, fl_dataset **out);
/* Lines of text (without their '\n' or "\r\n") from a file, the files of a folder (names
 * starting with '.' or '_' skipped) or a glob. Files ending in .gz are read through zlib,
 * one partition each; other files are split into about min_partitions parts. Files that
 * are missing or unreadable are reported now. A .gz file must be whole gzip data: one that
 * is cut short, corrupt, or not gzip at all (zlib would read it as plain text) fails its
 * task with FL_ECORRUPT naming the file and the byte offset, and so the action, once the task
 * has used its attempts, with FL_ECORRUPT and that message; no lines of it are returned. */
FL_API fl_status fl_text_file(fl_context *ctx, const char *path, uint32_t min_partitions,
                              fl_dataset **out);
/* Fixed-size binary records of record_len bytes, from a file, folder or glob. A file whose
 * size is not a multiple of record_len is an error. */
FL_API fl_status fl_binary_records(fl_context *ctx, const char *path, size_t record_len,
                                   fl_dataset **out);

/* Narrow transformations (no data moves between partitions). `arg` (arg_len bytes, may be
 * NULL/0) is copied and passed to every call of `fn`. */
FL_API fl_status fl_map(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                        fl_dataset **out);
FL_API fl_status fl_flat_map(fl_dataset *in, fl_flat_map_fn fn, const void *arg,
                             size_t arg_len, fl_dataset **out);
FL_API fl_status fl_filter(fl_dataset *in, fl_filter_fn fn, const void *arg, size_t arg_len,
                           fl_dataset **out);
/* The output of `fn` for one partition is buffered before the next step reads it. */
FL_API fl_status fl_map_partitions(fl_dataset *in, fl_map_partitions_fn fn, const void *arg,
                                   size_t arg_len, fl_dataset **out);
/* A seeded sample: each record kept with probability `fraction` (without replacement), or
 * repeated a Poisson(fraction) number of times (with replacement). The same seed gives the
 * same sample. */
FL_API fl_status fl_sample(fl_dataset *in, bool with_replacement, double fraction,
                           uint64_t seed, fl_dataset **out);
/* The partitions of `a`, then those of `b`. Both must come from the same context. */
FL_API fl_status fl_union(fl_dataset *a, fl_dataset *b, fl_dataset **out);
/* At most num_partitions partitions, each a run of neighbouring parent partitions. */
FL_API fl_status fl_coalesce(fl_dataset *in, uint32_t num_partitions, fl_dataset **out);
/* Pairs (record, index as int64) with indexes 0.. in partition order. Runs a job now to
 * count the partitions, as Spark's zipWithIndex does. */
FL_API fl_status fl_zip_with_index(fl_dataset *in, fl_dataset **out);
/* Pairs (fn(record), record). */
FL_API fl_status fl_key_by(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                           fl_dataset **out);
/* For pair records: (key, fn(value)). A record that is no pair fails the task. */
FL_API fl_status fl_map_values(fl_dataset *in, fl_map_fn fn, const void *arg, size_t arg_len,
                               fl_dataset **out);

/* ---------------------------------------------------------------------------------------
 * Pairs across partitions: partitioners and wide transformations (a shuffle). Records are
 * pairs (fl_buf_put_pair); keys are equal when their bytes are. Each function that takes
 * `partitioner` may be given NULL: a hash partitioner over num_partitions partitions (0:
 * the parent's count). A dataset already partitioned by an equal partitioner is combined
 * without a new shuffle.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_partitioner fl_partitioner;
/* A user partition function: which of num_partitions partitions a key goes to. */
typedef uint32_t (*fl_partition_fn)(fl_bytes key, uint32_t num_partitions, const void *arg);
/* Orders keys: < 0, 0 or > 0, as memcmp. NULL everywhere means bytewise order. */
typedef int (*fl_compare_fn)(fl_bytes a, fl_bytes b, const void *arg);

/* Hash of the key's bytes modulo num_partitions. */
FL_API fl_status fl_partitioner_hash(uint32_t num_partitions, fl_partitioner **out);
/* Ranges of keys in (ascending or descending) order, with boundaries sampled from `pairs`
 * now (a job runs), so that partitions hold about equal numbers of records. */
FL_API fl_status fl_partitioner_range(fl_dataset *pairs, uint32_t num_partitions,
                                      bool ascending, fl_compare_fn compare, const void *arg,
                                      size_t arg_len, fl_partitioner **out);
FL_API fl_status fl_partitioner_custom(uint32_t num_partitions, fl_partition_fn fn,
                                       const void *arg, size_t arg_len, fl_partitioner **out);
FL_API uint32_t fl_partitioner_partitions(const fl_partitioner *p);
/* Datasets keep what they need of a partitioner: free it whenever. NULL does nothing. */
FL_API void fl_partitioner_free(fl_partitioner *p);

/* Values per key: combine_by_key turns each key's first value into a combiner with
 * `create`, folds further values in with `merge_value`, and merges combiners with
 * `merge_combiners` (map-side first when map_side_combine, then after the shuffle). */
FL_API fl_status fl_combine_by_key(fl_dataset *pairs, fl_map_fn create, fl_reduce_fn merge_value,
                                   fl_reduce_fn merge_combiners, const void *arg,
                                   size_t arg_len, const fl_partitioner *partitioner,
                                   uint32_t num_partitions, bool map_side_combine,
                                   fl_dataset **out);
FL_API fl_status fl_reduce_by_key(fl_dataset *pairs, fl_reduce_fn fn, const void *arg,
                                  size_t arg_len, const fl_partitioner *partitioner,
                                  uint32_t num_partitions, fl_dataset **out);
/* As reduce_by_key, each key's fold starting from `zero`. As in Spark, the zero may be
 * used more than once per key (per map partition, and again when a partition spills), so
 * it should be the function's neutral element. aggregate_by_key likewise. */
FL_API fl_status fl_fold_by_key(fl_dataset *pairs, fl_bytes zero, fl_reduce_fn fn,
                                const void *arg, size_t arg_len,
                                const fl_partitioner *partitioner, uint32_t num_partitions,
                                fl_dataset **out);
FL_API fl_status fl_aggregate_by_key(fl_dataset *pairs, fl_bytes zero, fl_reduce_fn seq,
                                     fl_reduce_fn comb, const void *arg, size_t arg_len,
                                     const fl_partitioner *partitioner, uint32_t num_partitions,
                                     fl_dataset **out);
/* (key, group): the group holds the key's values; read them with fl_group_next. */
FL_API fl_status fl_group_by_key(fl_dataset *pairs, const fl_partitioner *partitioner,
                                 uint32_t num_partitions, fl_dataset **out);
/* Walks a group: *pos starts at 0; false after the last value. */
FL_API bool fl_group_next(fl_bytes group, size_t *pos, fl_bytes *value);
/* Action: (key, int64 count) for every key, in key order. */
FL_API fl_status fl_count_by_key(fl_dataset *pairs, fl_records **out);
/* Each distinct record once (records need not be pairs). */
FL_API fl_status fl_distinct(fl_dataset *ds, uint32_t num_partitions, fl_dataset **out);
/* Pairs in key order across partitions (a range partitioner sampled from the data). */
FL_API fl_status fl_sort_by_key(fl_dataset *pairs, bool ascending, fl_compare_fn compare,
                                const void *arg, size_t arg_len, uint32_t num_partitions,
                                fl_dataset **out);
/* (key, cogroup) with the key's values from a and from b; read with fl_cogroup_get. */
FL_API fl_status fl_cogroup(fl_dataset *a, fl_dataset *b, const fl_partitioner *partitioner,
                            uint32_t num_partitions, fl_dataset **out);
FL_API fl_status fl_cogroup_get(fl_bytes cogroup, fl_bytes *group_a, fl_bytes *group_b);

typedef enum fl_join_kind { FL_JOIN_INNER, FL_JOIN_LEFT, FL_JOIN_RIGHT, FL_JOIN_FULL } fl_join_kind;
/* (key, joined) for every pair of values of a key (outer joins: with a missing side);
 * read the two sides with fl_joined_get. */
FL_API fl_status fl_join(fl_dataset *a, fl_dataset *b, fl_join_kind kind,
                         const fl_partitioner *partitioner, uint32_t num_partitions,
                         fl_dataset **out);
FL_API fl_status fl_joined_get(fl_bytes joined, bool *has_a, fl_bytes *a, bool *has_b,
                               fl_bytes *b);
/* Pairs of a whose key is not in b. */
FL_API fl_status fl_subtract_by_key(fl_dataset *a, fl_dataset *b,
                                    const fl_partitioner *partitioner, uint32_t num_partitions,
                                    fl_dataset **out);
/* The same pairs, placed by `partitioner` (a no-op when already so partitioned). */
FL_API fl_status fl_partition_by(fl_dataset *pairs, const fl_partitioner *partitioner,
                                 fl_dataset **out);
/* Any records, spread evenly over num_partitions partitions by a shuffle. */
FL_API fl_status fl_repartition(fl_dataset *ds, uint32_t num_partitions, fl_dataset **out);

/* Persistence: the first action that computes a partition keeps it at `level`; later
 * actions read it. Blocks stay until unpersisted, the dataset is freed or the context
 * closes; memory pressure evicts the least recently used (see fl_storage_level). Changing
 * the level of a persisted dataset is FL_ESTATE (unpersist first, as in Spark). */
FL_API fl_status fl_persist(fl_dataset *ds, fl_storage_level level);
FL_API fl_status fl_cache(fl_dataset *ds); /* fl_persist(ds, FL_MEMORY_ONLY) */
FL_API fl_status fl_unpersist(fl_dataset *ds);

typedef struct fl_storage_info {
  fl_storage_level level;
  uint32_t partitions, cached_partitions;
  uint64_t memory_bytes, disk_bytes;
} fl_storage_info;
FL_API fl_status fl_storage_info_get(fl_dataset *ds, fl_storage_info *out);

/* Checkpoints ds eagerly, as Spark's Dataset.checkpoint(eager = true) (and rdd.checkpoint()
 * followed by an action): runs one job that computes every partition of ds (from its cached
 * blocks when it is persisted) and writes each to a file under `dir`, then truncates ds's
 * lineage in place: ds keeps its handle, partition count, partitioner and storage level,
 * but from now on its partitions (and so those of its children) are read from the files,
 * and its parents are released. A checkpoint of a checkpointed dataset does nothing.
 *
 * Files: `dir`/<context>/rdd-<id>/part-NNNNN, where <context> is unique to the context
 * (process id and random bits, so that contexts and applications never collide) and <id> is
 * the dataset's id at checkpoint time. Each holds a header (magic, version, partition,
 * record count, payload length, CRC32C of the payload) and the records as LZ4 chunks; it is
 * written under a temporary name, fsync'd and renamed. In cluster mode executors write and
 * read them, so `dir` must be a folder that the client and every executor see (a shared
 * file system; any local folder for local-cluster). As in Spark, the files stay when the
 * context closes: removing them is the caller's business.
 *
 * Returns FL_EINVAL for a NULL dataset or a NULL or empty `dir`, FL_EIO naming the folder
 * when it cannot be created or written, and the job's error when a partition fails (then no
 * file of this checkpoint is left and ds is unchanged). Reading a missing, truncated or
 * corrupt checkpoint file later fails the action with FL_EIO or FL_ECORRUPT naming the file:
 * the data is never recomputed from the old lineage, which is gone.
 *
 * Blocks until the job ends. Do not run actions on ds or its children from other threads
 * while it runs: the truncation changes ds under them. */
FL_API fl_status fl_checkpoint(fl_dataset *ds, const char *dir);

/* ---------------------------------------------------------------------------------------
 * Actions: each runs a job now and blocks until it ends.
 * ------------------------------------------------------------------------------------- */
FL_API size_t fl_records_count(const fl_records *r);
/* The i-th record, valid until fl_records_free. i must be below fl_records_count. */
FL_API fl_bytes fl_records_get(const fl_records *r, size_t i);
FL_API void fl_records_free(fl_records *r);

FL_API fl_status fl_count(fl_dataset *ds, uint64_t *out);
FL_API fl_status fl_collect(fl_dataset *ds, fl_records **out);
/* The first n records in partition order, computing as few partitions as it can. */
FL_API fl_status fl_take(fl_dataset *ds, size_t n, fl_records **out);
/* The first record into *out (replacing its contents); FL_EEMPTY when there is none. */
FL_API fl_status fl_first(fl_dataset *ds, fl_buf *out);
/* Combines all records with fn; FL_EEMPTY for an empty dataset. */
FL_API fl_status fl_reduce(fl_dataset *ds, fl_reduce_fn fn, const void *arg, size_t arg_len,
                           fl_buf *out);
/* As reduce, starting each partition and the final merge from `zero`. */
FL_API fl_status fl_fold(fl_dataset *ds, fl_bytes zero, fl_reduce_fn fn, const void *arg,
                         size_t arg_len, fl_buf *out);
/* seq(acc, record) within partitions, comb(acc, acc) across them, both from `zero`. */
FL_API fl_status fl_aggregate(fl_dataset *ds, fl_bytes zero, fl_reduce_fn seq,
                              fl_reduce_fn comb, const void *arg, size_t arg_len, fl_buf *out);
/* As aggregate, but partition results are combined in a tree of `depth` levels (>= 1),
 * so that no single combine step reads more than about partitions^(1/depth) inputs. */
FL_API fl_status fl_tree_aggregate(fl_dataset *ds, fl_bytes zero, fl_reduce_fn seq,
                                   fl_reduce_fn comb, const void *arg, size_t arg_len,
                                   uint32_t depth, fl_buf *out);
FL_API fl_status fl_foreach(fl_dataset *ds, fl_foreach_fn fn, const void *arg, size_t arg_len);
/* Writes a folder `path` with one file per partition (part-00000 ...), each record a line,
 * and an empty _SUCCESS file. FL_EEXIST if `path` exists. */
FL_API fl_status fl_save_as_text_file(fl_dataset *ds, const char *path);

/* ---------------------------------------------------------------------------------------
 * Barrier stages (as Spark's barrier mode), for training with collectives. All tasks of a
 * barrier stage start together or none does; each knows its rank (its partition) and the
 * world size (the number of partitions), and the tasks can exchange small messages through
 * the driver to bootstrap a communicator (peer addresses, the NCCL unique id). If one task
 * fails, the others are stopped and the whole stage is retried (up to max_task_attempts);
 * when there are fewer free slots than tasks, the action fails at once with FL_ESLOTS.
 * A task that returns FL_ENODEVICE (fl_device_open found no usable GPU) is not retried
 * where it ran: a cluster stops giving that executor GPU tasks and the action fails at
 * once, with that executor's cause, when too few GPU executors are left; local mode fails
 * after that attempt.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_barrier fl_barrier; /* a running task's view of its stage */

typedef struct fl_barrier_options {
  /* Place the tasks only on executors started with --gpu (one task per GPU executor); in
   * local mode, the context's task threads stand in for GPU slots (and fl_barrier_gpu is
   * -1). A local-cluster[E,C,MB] master gives its first G executors --gpu 0 .. G-1 when
   * FLINT_LOCAL_CLUSTER_GPUS=G is set (no GPU is needed: executors only record the id). */
  bool gpu;
  /* Called on the client's thread (inside the action) for each message a task sends with
   * fl_barrier_report, in the order the driver got them. May be NULL. */
  void (*on_report)(uint32_t rank, fl_bytes message, void *user);
  void *user;
} fl_barrier_options;
#define FL_BARRIER_OPTIONS_INIT {false, NULL, NULL}

/* The body of a barrier task: reads its partition, emits its output; `b` is valid until it
 * returns. */
typedef fl_status (*fl_barrier_fn)(fl_barrier *b, fl_iter *in, fl_emitter *out,
                                   const void *arg);

/* A dataset whose partitions are computed by one barrier stage running fn on the partitions
 * of `in` (Spark's rdd.barrier().mapPartitions). `options` may be NULL. FL_EINVAL for a NULL
 * dataset, fn or out. An action must compute every partition of it (fl_take is refused);
 * datasets made from it by one-to-one transformations (map, filter ...) run in the same
 * barrier stage. The task slots counted for FL_ESLOTS are executors x cores (GPU executors
 * with options.gpu), or local threads. See docs/barrier.md. */
FL_API fl_status fl_barrier_map_partitions(fl_dataset *in, fl_barrier_fn fn, const void *arg,
                                           size_t arg_len, const fl_barrier_options *options,
                                           fl_dataset **out);
FL_API uint32_t fl_barrier_rank(const fl_barrier *b);
FL_API uint32_t fl_barrier_world(const fl_barrier *b);
/* 0 for the stage's first attempt, 1 for its first retry, ... */
FL_API uint32_t fl_barrier_attempt(const fl_barrier *b);
/* The GPU of the executor the task runs on (its --gpu ID), or -1. */
FL_API int fl_barrier_gpu(const fl_barrier *b);
/* Waits until every task of the stage has called it with its message, then returns all
 * messages in rank order in *all (world records; free with fl_records_free). A global
 * barrier when the messages are empty. FL_ECANCELLED when another task of the stage failed;
 * FL_ETIMEDOUT after timeout_ms (0: 60 s). */
FL_API fl_status fl_barrier_all_gather(fl_barrier *b, fl_bytes mine, uint32_t timeout_ms,
                                       fl_records **all);
/* Sends a small message (at most 64 KiB, else FL_ELIMIT) to the client's on_report,
 * without waiting for it to be delivered. all_gather messages: at most 1 MiB (FL_ELIMIT). */
FL_API fl_status fl_barrier_report(fl_barrier *b, fl_bytes message);
/* State that outlives a failed attempt: the driver keeps the last blob put under the stage
 * (a checkpoint of weights and optimizer state, at most 512 MiB), and a retried attempt
 * gets it back; it is freed when the job ends. checkpoint_put from an abandoned attempt is
 * FL_ECANCELLED. checkpoint_get gives FL_ENOENT when nothing was put. */
FL_API fl_status fl_barrier_checkpoint_put(fl_barrier *b, fl_bytes state);
FL_API fl_status fl_barrier_checkpoint_get(fl_barrier *b, fl_buf *out);

/* ---------------------------------------------------------------------------------------
 * Shared variables. Functions refer to them by id (put the id in the arg blob).
 * ------------------------------------------------------------------------------------- */
typedef struct fl_broadcast fl_broadcast;
/* Copies `data` once; tasks read it with fl_broadcast_value. */
FL_API fl_status fl_broadcast_create(fl_context *ctx, const void *data, size_t len,
                                     fl_broadcast **out);
FL_API uint64_t fl_broadcast_id(const fl_broadcast *b);
/* In a task: a view of the broadcast's bytes, valid until the task's function returns.
 * FL_ENOENT for an unknown or destroyed id; FL_ESTATE outside a task. */
FL_API fl_status fl_broadcast_value(uint64_t id, fl_bytes *out);
FL_API void fl_broadcast_destroy(fl_broadcast *b);

typedef struct fl_accumulator fl_accumulator;
/* Sums of int64 or double, or values merged by a user function from `zero`. A task's
 * additions count once, when the task succeeds; failed attempts add nothing. */
FL_API fl_status fl_accumulator_create_i64(fl_context *ctx, fl_accumulator **out);
FL_API fl_status fl_accumulator_create_f64(fl_context *ctx, fl_accumulator **out);
FL_API fl_status fl_accumulator_create(fl_context *ctx, fl_bytes zero, fl_reduce_fn merge,
                                       const void *arg, size_t arg_len, fl_accumulator **out);
FL_API uint64_t fl_accumulator_id(const fl_accumulator *acc);
/* In a task. FL_EINVAL when the id's kind does not match; FL_ESTATE outside a task. */
FL_API fl_status fl_accumulator_add_i64(uint64_t id, int64_t v);
FL_API fl_status fl_accumulator_add_f64(uint64_t id, double v);
FL_API fl_status fl_accumulator_add(uint64_t id, fl_bytes value);
/* On the caller's side: the value merged from every successful task so far. */
FL_API fl_status fl_accumulator_value_i64(fl_accumulator *acc, int64_t *out);
FL_API fl_status fl_accumulator_value_f64(fl_accumulator *acc, double *out);
FL_API fl_status fl_accumulator_value(fl_accumulator *acc, fl_buf *out);
FL_API void fl_accumulator_destroy(fl_accumulator *acc);

/* ---------------------------------------------------------------------------------------
 * Services: code that drives a job from where the scheduler lives. A service runs actions on
 * the dataset it is given as often as it needs (an iterative solver's evaluations), so that a
 * whole computation is one call from the client: in local mode it runs in this process, in
 * cluster mode in the driver, which then runs each of its jobs without a round trip to the
 * client. A service may run actions on `job` only (it makes no datasets of its own), and must
 * be registered in the process that runs it: flint's own libraries register theirs when they
 * load (libflint-dataflow-ml: "ml.sandblaster"; the flint command's driver has them).
 * ------------------------------------------------------------------------------------- */
typedef fl_status (*fl_service_fn)(fl_dataset *job, fl_bytes request, fl_buf *reply);
/* Registers fn under name (at most 63 bytes; a second registration of a name replaces the
 * first). FL_EINVAL for a bad name, FL_ELIMIT past 32 services. Any thread. */
FL_API fl_status fl_service_register(const char *name, fl_service_fn fn);
/* Runs service `name` on `job` where the context's scheduler is and appends its reply to
 * *reply. Blocks until the service returns; its status and message are the call's. FL_ENOENT
 * when no service of that name is registered there (in cluster mode: in the driver). */
FL_API fl_status fl_service_call(fl_dataset *job, const char *name, fl_bytes request, fl_buf *reply);

/* ---------------------------------------------------------------------------------------
 * Job binaries: a shared library exporting this symbol, run by `flint submit`.
 * ------------------------------------------------------------------------------------- */
typedef int (*fl_main_fn)(fl_context *ctx, int argc, char **argv);
#define FL_MAIN_SYMBOL "flint_main"

#ifdef __cplusplus
}
#endif
#endif /* FLINT_FLINT_H */
