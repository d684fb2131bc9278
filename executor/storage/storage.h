/*
 * storage.h: an executor's storage, for the executor process and the layers above: the block
 * manager that keeps cached partitions and shuffle output in memory and on disk, the shared
 * blocks through which executors of one node read each other's partitions in place, and the
 * claim tables through which they share a node's tasks. Nothing else of executor/storage/ is
 * for other files. Each section says its threading rules.
 */
#ifndef FLINT_EXECUTOR_STORAGE_H
#define FLINT_EXECUTOR_STORAGE_H

#include "rdd/rdd.h"

/* ---- block manager --------------------------------------------------------------------- */
/*
 * Cached partitions under a memory limit. Memory blocks sit on an LRU list; when a new block
 * needs room, the least recently used unpinned blocks of other datasets are evicted: dropped
 * (memory levels, recomputed from lineage later) or written to disk (memory-and-disk).
 * Serialized and disk blocks are record batches in an LZ4 frame with a content checksum; a
 * block that fails its checks is dropped and recomputed, never returned.
 * Threading: every entry point may be called from any thread; a mutex guards the tables.
 * Disk I/O of eviction happens under it (simple, and only on the memory-and-disk path).
 */
typedef struct block_manager block_manager;

typedef struct block_manager_stats {
  uint64_t memory_used, memory_limit, disk_used;
  uint64_t blocks_in_memory, blocks_on_disk, evictions;
  uint64_t blocks_shared; /* memory blocks that peers on the host can map */
  uint64_t peer_blocks, peer_bytes; /* other executors' blocks mapped here now (not in memory_used) */
} block_manager_stats;

/* `dir` is the folder for disk blocks (must exist; owned by the caller). With `share`, memory
 * blocks of at least SHARED_BLOCK_MIN bytes are kept as shared blocks (below), which other
 * executors on the host read in place. */
FL_INTERNAL fl_status block_manager_create(uint64_t memory_limit, const char *dir, bool share,
                                           block_manager **out);
/* Frees every block and deletes its disk files. No reader may hold a block. */
FL_INTERNAL void block_manager_destroy(block_manager *bm);
FL_INTERNAL void block_manager_stats_get(block_manager *bm, block_manager_stats *out);
/* The figures of the blocks whose dataset id is in [lo, hi) (one application in an
 * executor): memory_used, disk_used, blocks_in_memory, blocks_on_disk, and evictions of
 * such blocks (counted until block_manager_remove_range drops the range); the rest 0. */
FL_INTERNAL void block_manager_range_stats(block_manager *bm, uint64_t lo, uint64_t hi, block_manager_stats *out);
/* Drops every block, and deletes the shuffle files, whose dataset or shuffle id is in
 * [lo, hi): all of one application in an executor. */
FL_INTERNAL void block_manager_remove_range(block_manager *bm, uint64_t lo, uint64_t hi);
/* Block `key` cached by executor process `pid` on this host, mapped in place (kept mapped for
 * later reads, within as many bytes as the memory limit, least recently used unmapped first).
 * On a hit sets *batch and *handle (release with the cache ops' release) and returns FL_OK;
 * FL_ENOENT when that process has no such shared block (evicted, not shared, gone), or the
 * error of a block that fails its checks. */
FL_INTERNAL fl_status block_manager_get_peer(block_manager *bm, rdd_block_key key, uint32_t pid,
                                             const rdd_batch **batch, void **handle);
/* Told of every change of a block of this block manager: stored (in memory, serialized, or
 * on disk), moved to disk, or gone (evicted, damaged, removed; memory and disk both 0), with
 * the bytes it holds now. Peer blocks are not its own and are not told. Called with the
 * block manager's lock held, in the order of the changes: it must not block nor call the
 * block manager. block_manager_destroy tells nothing. */
typedef void (*block_manager_listener)(void *arg, rdd_block_key key, fl_storage_level level, uint64_t memory,
                                       uint64_t disk);
/* Sets the listener (NULL: none), before or between uses: it is read under the lock. */
FL_INTERNAL void block_manager_set_listener(block_manager *bm, block_manager_listener fn, void *arg);
/* The rdd_cache_ops over a block manager (impl is the block_manager). */
FL_INTERNAL extern const rdd_cache_ops block_manager_cache_ops;

/* ---- shared blocks (shared_block.c) ----------------------------------------------------- */
/*
 * A cached partition in a sealed memfd that other processes on the host map read-only, as
 * Spark's node-local reads but without a copy: a reader finds the owner's descriptor under
 * /proc/PID/fd by the block's name, so no message carries more than the owner's pid. The
 * bytes are immutable (sealed) and stay valid in a reader's mapping after the owner drops
 * the block or dies.
 */
typedef struct shared_block shared_block;
#define SHARED_BLOCK_MIN ((uint64_t)256 << 10) /* smaller blocks are not worth a descriptor */

/* Copies `batch` into a new shared block named after `key`. FL_ELIMIT when the process is
 * out of descriptors. */
FL_INTERNAL fl_status shared_block_create(rdd_block_key key, const rdd_batch *batch, shared_block **out);
/* Maps block `key` of process `pid`. FL_ENOENT when it has none; FL_ECORRUPT (naming the
 * block and the cause) when what it has is unsealed, of the wrong block or malformed. */
FL_INTERNAL fl_status shared_block_open(uint32_t pid, rdd_block_key key, shared_block **out);
/* This node's identity (the kernel's boot id and the pid namespace), "" when unknown:
 * processes with equal ones may map each other's shared blocks. */
#define SHARED_NODE_MAX 64
FL_INTERNAL void shared_block_node(char out[SHARED_NODE_MAX]);
FL_INTERNAL const rdd_batch *shared_block_batch(const shared_block *sb);
FL_INTERNAL uint64_t shared_block_bytes(const shared_block *sb); /* mapped bytes */
FL_INTERNAL void shared_block_free(shared_block *sb);
/* Opens (open flags, O_CLOEXEC added) process `pid`'s memfd called `name` through
 * /proc/PID/fd. FL_ENOENT, naming `what`, when it has none or it cannot be opened. */
FL_INTERNAL fl_status shared_fd_open(uint32_t pid, const char *name, int flags, const char *what, int *fd);

/* ---- claim tables (claim_table.c) -------------------------------------------------------- */
/*
 * Node-shared tasks: the driver launches a task over a cached partition on its executor (the
 * owner) and offers it to the other executors of the node, which map the partition in place
 * at no extra cost. Whoever starts it first runs it: each executor has a claim table (a memfd
 * of 2^20 slots) that its node peers map read-write, and a task is claimed by a
 * compare-and-swap of its attempt key into slot key mod 2^20 of its owner's table. An owner
 * that finds its task claimed reports that a peer has it; the peer reports its end. So an
 * executor that runs ahead of its peer (a faster core, a shorter queue) takes the peer's last
 * tasks within the stage, with no message beyond the launch, as a shared queue would.
 */
typedef struct claim_table claim_table;

/* This executor's table. */
FL_INTERNAL fl_status claim_table_create(claim_table **out);
/* Forgets every claim (this executor's own table, on registering with a driver, whose keys
 * may repeat an earlier driver's). */
FL_INTERNAL void claim_table_clear(claim_table *t);
/* Executor `owner`'s table on this node (process `pid`), mapped once and kept. FL_ENOENT
 * when that process has none (gone, or not an executor). */
FL_INTERNAL fl_status claim_table_open(uint32_t pid, claim_table **out);
/* Claims attempt `key`. An owner claims its own attempt unless a peer has (false: a peer
 * runs it); a peer claims only an attempt nobody has, and never one that a later attempt's
 * claim has overwritten (its slot holds a larger key: the attempt is long over). */
FL_INTERNAL bool claim_table_take(claim_table *t, uint64_t key, bool owner);
/* This executor's table (no-op in a peer's): the newest key launched here is `newest`, the
 * oldest of its attempts still queued or running `oldest` (0: none); the pages of slots far
 * behind both are given back. */
FL_INTERNAL void claim_table_trim(claim_table *t, uint64_t newest, uint64_t oldest);
FL_INTERNAL void claim_table_free(claim_table *t);

#endif /* FLINT_EXECUTOR_STORAGE_H */
