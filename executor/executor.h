/*
 * executor.h: what an executor is made of, for the layers above: the block manager that
 * keeps cached partitions, and the pool of task threads.
 */
#ifndef FLINT_EXECUTOR_H
#define FLINT_EXECUTOR_H

#include <signal.h>

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
} block_manager_stats;

/* `dir` is the folder for disk blocks (must exist; owned by the caller). */
FL_INTERNAL fl_status block_manager_create(uint64_t memory_limit, const char *dir,
                                           block_manager **out);
/* Frees every block and deletes its disk files. No reader may hold a block. */
FL_INTERNAL void block_manager_destroy(block_manager *bm);
FL_INTERNAL void block_manager_stats_get(block_manager *bm, block_manager_stats *out);
/* Drops every block, and deletes the shuffle files, whose dataset or shuffle id is in
 * [lo, hi): all of one application in an executor. */
FL_INTERNAL void block_manager_remove_range(block_manager *bm, uint64_t lo, uint64_t hi);
/* The rdd_cache_ops over a block manager (impl is the block_manager). */
FL_INTERNAL extern const rdd_cache_ops block_manager_cache_ops;

/* ---- task pool ------------------------------------------------------------------------- */
typedef struct task_pool task_pool;

typedef struct task_pool_work {
  common_qnode node;
  void (*run)(struct task_pool_work *work); /* runs on a pool thread */
} task_pool_work;

FL_INTERNAL fl_status task_pool_create(uint32_t threads, task_pool **out);
/* Queues work; never blocks. The work item stays the caller's; run() gets it back. */
FL_INTERNAL void task_pool_submit(task_pool *pool, task_pool_work *work);
/* Runs what is queued, then joins the threads and frees the pool. NULL does nothing. */
/* Tasks submitted and not yet taken by a thread (a snapshot). */
FL_INTERNAL size_t task_pool_queued(task_pool *pool);
FL_INTERNAL void task_pool_destroy(task_pool *pool);

/* ---- the executor process (service.c) ------------------------------------------------- */
typedef struct executor_config {
  const char *driver;      /* HOST:PORT of the driver's control plane */
  const char *host;        /* the address peers reach this executor at; NULL: 127.0.0.1 */
  uint32_t cores;          /* task threads */
  uint64_t memory;         /* bytes for cached blocks */
  uint64_t shuffle_memory; /* bytes a task sorts or aggregates before spilling; 0: 64 MiB */
  const char *work_dir;    /* where its folder goes; NULL: $TMPDIR or /tmp */
  const char *secret;      /* shared secret; NULL: none */
  int32_t gpu;             /* --gpu: the GPU it owns, or -1 */
} executor_config;

/* Registers with the driver and serves until *stop becomes nonzero (a signal handler sets
 * it), then stops its threads and deletes its work folder. Blocks. Fails when the driver
 * cannot be reached or refuses it. */
FL_INTERNAL fl_status executor_serve(const executor_config *cfg, volatile sig_atomic_t *stop);

#endif /* FLINT_EXECUTOR_H */
