/* block_manager.c: cached partitions in memory and on local disk (see storage.h). */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor/storage/storage.h"

typedef enum block_where { IN_MEMORY, IN_MEMORY_SER, ON_DISK } block_where;

typedef struct block {
  rdd_block_key key;
  fl_storage_level level;
  block_where where;
  rdd_batch batch;     /* IN_MEMORY: its own buffer, or a view of `shared` */
  shared_block *shared;
  fl_buf ser;          /* IN_MEMORY_SER: the encoded block */
  uint64_t mem_bytes;  /* counted against the limit */
  uint64_t disk_bytes; /* ON_DISK: size of the file */
  int pins;            /* readers of `batch` right now */
  bool removed;        /* unlinked from the tables while pinned: freed by the last reader */
  struct block *lru_prev, *lru_next; /* memory blocks only; head is most recent */
  struct block *hash_next;
} block;

/* Another executor's shared block, mapped here. */
typedef struct peer_block {
  rdd_block_key key;
  uint32_t pid;
  shared_block *sb;
  int pins;
  bool removed; /* out of the list while pinned: unmapped by the last reader */
  struct peer_block *prev, *next; /* most recently used first */
} peer_block;

struct block_manager {
  pthread_mutex_t lock;
  char *dir;
  bool share;
  uint64_t memory_limit, memory_used, disk_used, evictions;
  uint64_t blocks_in_memory, blocks_on_disk, blocks_shared;
  block **buckets;
  size_t num_buckets, count;
  block *lru_head, *lru_tail;
  peer_block *peers;
  uint64_t peer_blocks, peer_bytes;
  /* Datasets already warned about (not enough memory to cache a block of theirs): one line
   * per dataset, not one per block (a large data set would print thousands). */
  block_manager_listener listener; /* block_manager_set_listener */
  void *listener_arg;
  uint64_t *warned;
  size_t num_warned, cap_warned;
  /* Evictions by dataset (block_manager_range_stats), dropped with their range. */
  struct evicted_count {
    uint64_t rdd_id, count;
  } *evicted;
  size_t num_evicted, cap_evicted;
};

/* What a reader holds: a pinned memory block, a pinned peer block, or a private decoded copy. */
typedef struct read_handle {
  block *pinned;
  peer_block *peer;
  rdd_batch priv;
} read_handle;

/* ---- tables ---------------------------------------------------------------------------- */

static size_t bucket_of(const block_manager *bm, rdd_block_key key) {
  return common_hash64(key.rdd_id * 0x100000001b3ull ^ key.partition) & (bm->num_buckets - 1);
}

static block *find(block_manager *bm, rdd_block_key key) {
  for (block *b = bm->buckets[bucket_of(bm, key)]; b; b = b->hash_next)
    if (b->key.rdd_id == key.rdd_id && b->key.partition == key.partition) return b;
  return NULL;
}

static void hash_insert(block_manager *bm, block *b) {
  if (bm->count >= bm->num_buckets) {
    size_t n = bm->num_buckets * 2;
    block **grown = common_calloc(n, sizeof *grown);
    if (grown) { /* without room the chains just get longer */
      for (size_t i = 0; i < bm->num_buckets; i++) {
        block *c = bm->buckets[i];
        while (c) {
          block *next = c->hash_next;
          size_t j = common_hash64(c->key.rdd_id * 0x100000001b3ull ^ c->key.partition) & (n - 1);
          c->hash_next = grown[j];
          grown[j] = c;
          c = next;
        }
      }
      common_free(bm->buckets);
      bm->buckets = grown;
      bm->num_buckets = n;
    }
  }
  size_t i = bucket_of(bm, b->key);
  b->hash_next = bm->buckets[i];
  bm->buckets[i] = b;
  bm->count++;
}

static void hash_remove(block_manager *bm, block *b) {
  block **p = &bm->buckets[bucket_of(bm, b->key)];
  while (*p != b) p = &(*p)->hash_next;
  *p = b->hash_next;
  bm->count--;
}

static void lru_unlink(block_manager *bm, block *b) {
  if (b->lru_prev) b->lru_prev->lru_next = b->lru_next; else bm->lru_head = b->lru_next;
  if (b->lru_next) b->lru_next->lru_prev = b->lru_prev; else bm->lru_tail = b->lru_prev;
  b->lru_prev = b->lru_next = NULL;
}

static void lru_push_front(block_manager *bm, block *b) {
  b->lru_prev = NULL;
  b->lru_next = bm->lru_head;
  if (bm->lru_head) bm->lru_head->lru_prev = b; else bm->lru_tail = b;
  bm->lru_head = b;
}

static void disk_path(const block_manager *bm, rdd_block_key key, char *buf, size_t len) {
  snprintf(buf, len, "%s/rdd_%llu_%u.blk", bm->dir, (unsigned long long)key.rdd_id, key.partition);
}

/* Tells the listener what block `b` holds now (lock held). */
static void tell(block_manager *bm, const block *b) {
  if (bm->listener)
    bm->listener(bm->listener_arg, b->key, b->level, b->mem_bytes, b->where == ON_DISK ? b->disk_bytes : 0);
}

/* Tells the listener that block `key` is gone (lock held). */
static void tell_gone(block_manager *bm, rdd_block_key key, fl_storage_level level) {
  if (bm->listener) bm->listener(bm->listener_arg, key, level, 0, 0);
}

/* Gives up a block's memory (it stays in the tables if it went to disk). */
static void release_memory(block_manager *bm, block *b) {
  if (b->where == IN_MEMORY || b->where == IN_MEMORY_SER) {
    lru_unlink(bm, b);
    bm->memory_used -= b->mem_bytes;
    bm->blocks_in_memory--;
    bm->blocks_shared -= b->shared != NULL;
    b->mem_bytes = 0;
  }
}

/* Frees a memory block's records (its buffer, or its shared block). */
static void free_records(block *b) {
  if (b->shared) {
    shared_block_free(b->shared);
    b->shared = NULL;
    b->batch = (rdd_batch){FL_BUF_INIT, 0};
  }
  rdd_batch_free(&b->batch);
}

static void block_free(block *b) {
  if (!b) return;
  free_records(b);
  fl_buf_free(&b->ser);
  common_free(b);
}

/* Takes a block out of the tables; frees it unless readers hold it. */
static void drop_block(block_manager *bm, block *b) {
  release_memory(bm, b);
  if (b->where == ON_DISK) {
    char path[4096];
    disk_path(bm, b->key, path, sizeof path);
    unlink(path);
    bm->disk_used -= b->disk_bytes;
    bm->blocks_on_disk--;
  }
  hash_remove(bm, b);
  tell_gone(bm, b->key, b->level);
  if (b->pins > 0)
    b->removed = true;
  else
    block_free(b);
}

/* ---- disk ------------------------------------------------------------------------------ */

static fl_status write_file(const char *path, const fl_buf *data) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return FL_ERR(FL_EIO, "cannot create %s: %s", path, strerror(errno));
  fl_status s = common_write_all(fd, data->data, data->len, path);
  if (s != FL_OK) {
    close(fd);
    unlink(path);
    return s;
  }
  if (close(fd) != 0) {
    unlink(path);
    return FL_ERR(FL_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  return FL_OK;
}

/* Writes a batch to the block's file and marks it ON_DISK. */
static fl_status spill(block_manager *bm, block *b, const rdd_batch *batch) {
  fl_buf ser = FL_BUF_INIT;
  char path[4096];
  disk_path(bm, b->key, path, sizeof path);
  fl_status s = rdd_batch_encode(batch, &ser);
  if (s == FL_OK) s = write_file(path, &ser);
  if (s == FL_OK) {
    b->where = ON_DISK;
    b->disk_bytes = ser.len;
    bm->disk_used += ser.len;
    bm->blocks_on_disk++;
  }
  fl_buf_free(&ser);
  return s;
}

/* ---- eviction -------------------------------------------------------------------------- */

/* Counts an eviction of a block of rdd_id (lock held); without memory the count is lost. */
static void count_eviction(block_manager *bm, uint64_t rdd_id) {
  for (size_t i = 0; i < bm->num_evicted; i++)
    if (bm->evicted[i].rdd_id == rdd_id) {
      bm->evicted[i].count++;
      return;
    }
  if (bm->num_evicted == bm->cap_evicted) {
    size_t cap = bm->cap_evicted ? bm->cap_evicted * 2 : 8;
    struct evicted_count *grown = common_realloc(bm->evicted, cap * sizeof *grown);
    if (!grown) return;
    bm->evicted = grown;
    bm->cap_evicted = cap;
  }
  bm->evicted[bm->num_evicted++] = (struct evicted_count){rdd_id, 1};
}

/* Makes room for `need` bytes by evicting least recently used, unpinned memory blocks of
 * other rdds (evicting a dataset's own blocks to cache its next one would only thrash, as
 * Spark's MemoryStore also refuses). Returns whether the room is there now. */
static bool make_room(block_manager *bm, uint64_t need, uint64_t for_rdd) {
  if (need > bm->memory_limit) return false;
  uint64_t freeable = 0;
  for (block *b = bm->lru_tail; b && bm->memory_used - freeable + need > bm->memory_limit; b = b->lru_prev)
    if (b->pins == 0 && b->key.rdd_id != for_rdd) freeable += b->mem_bytes;
  if (bm->memory_used - freeable + need > bm->memory_limit) return false;
  block *b = bm->lru_tail;
  while (b && bm->memory_used + need > bm->memory_limit) {
    block *prev = b->lru_prev;
    if (b->pins == 0 && b->key.rdd_id != for_rdd) {
      bm->evictions++;
      count_eviction(bm, b->key.rdd_id);
      if (b->level == FL_MEMORY_AND_DISK && b->where == IN_MEMORY) {
        release_memory(bm, b);
        fl_status s = spill(bm, b, &b->batch);
        free_records(b);
        if (s != FL_OK) {
          /* Its memory is already given back and it has no file: only unlink it. */
          fprintf(stderr, "flint: dropping cached block instead of spilling it: %s\n", fl_last_error());
          hash_remove(bm, b);
          tell_gone(bm, b->key, b->level);
          block_free(b); /* unpinned: eviction only takes unpinned blocks */
        } else {
          tell(bm, b);
        }
      } else {
        drop_block(bm, b);
      }
    }
    b = prev;
  }
  return true;
}

/* ---- warnings --------------------------------------------------------------------------- */

static void format_bytes(uint64_t n, char *buf, size_t len) {
  if (n < 1024) snprintf(buf, len, "%llu B", (unsigned long long)n);
  else if (n < (1ull << 20)) snprintf(buf, len, "%.1f KiB", (double)n / 1024);
  else if (n < (1ull << 30)) snprintf(buf, len, "%.1f MiB", (double)n / (1 << 20));
  else snprintf(buf, len, "%.2f GiB", (double)n / (1ull << 30));
}

/* Says once per dataset, as Spark's MemoryStore does per block ("Not enough space to cache
 * rdd_12_3 in memory!"), that a block of it did not fit in memory and where such blocks go.
 * fl_storage_info_get gives the totals (in memory, on disk, not cached). Called locked. */
static void warn_no_room(block_manager *bm, rdd_block_key key, fl_storage_level level, uint64_t need) {
  for (size_t i = 0; i < bm->num_warned; i++)
    if (bm->warned[i] == key.rdd_id) return;
  if (bm->num_warned == bm->cap_warned) {
    size_t cap = bm->cap_warned ? 2 * bm->cap_warned : 8;
    uint64_t *grown = common_realloc(bm->warned, cap * sizeof *grown);
    if (!grown) return; /* then this one is not remembered and may be said again */
    bm->warned = grown;
    bm->cap_warned = cap;
  }
  bm->warned[bm->num_warned++] = key.rdd_id;
  char limit[32], used[32], size[32];
  format_bytes(bm->memory_limit, limit, sizeof limit);
  format_bytes(bm->memory_used, used, sizeof used);
  format_bytes(need, size, sizeof size);
  fprintf(stderr,
          "flint: not enough space to cache rdd_%llu_%u in memory (%s limit, %s in use, the block %s): "
          "partitions of rdd %llu that do not fit %s (FLINT_MEMORY or --memory sets the limit)\n",
          (unsigned long long)key.rdd_id, key.partition, limit, used, size, (unsigned long long)key.rdd_id,
          level == FL_MEMORY_AND_DISK ? "go to local disk" : "are not cached and are recomputed when read");
}

static void forget_warned(block_manager *bm, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i < bm->num_warned;)
    if (bm->warned[i] >= lo && bm->warned[i] < hi) bm->warned[i] = bm->warned[--bm->num_warned];
    else i++;
}

/* ---- the cache interface --------------------------------------------------------------- */

/* A cached block read by a task is its input (Spark's bytes read from the block manager):
 * the block's bytes as they were kept, records in memory or encoded in memory or on disk. */
static void count_block_read(uint64_t bytes) {
  rdd_task *task = rdd_task_current();
  if (task) task->input_bytes += bytes;
}

static bool bm_get(void *impl, rdd_block_key key, const rdd_batch **batch, void **handle) {
  block_manager *bm = impl;
  read_handle *h = common_calloc(1, sizeof *h);
  if (!h) return false; /* a miss: the partition is recomputed */
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  block *b = find(bm, key);
  if (!b) goto miss;
  if (b->where == IN_MEMORY) {
    b->pins++;
    lru_unlink(bm, b);
    lru_push_front(bm, b);
    h->pinned = b;
    *batch = &b->batch;
    *handle = h;
    uint64_t bytes = b->batch.buf.len;
    FL_PCHECK(pthread_mutex_unlock(&bm->lock));
    count_block_read(bytes);
    return true;
  }
  fl_buf file = FL_BUF_INIT;
  fl_bytes encoded;
  uint64_t bytes;
  char what[4096];
  disk_path(bm, key, what, sizeof what);
  fl_status s;
  if (b->where == IN_MEMORY_SER) {
    lru_unlink(bm, b);
    lru_push_front(bm, b);
    encoded = fl_buf_bytes(&b->ser);
    snprintf(what, sizeof what, "cached block rdd_%llu_%u", (unsigned long long)key.rdd_id, key.partition);
    bytes = encoded.len;
    s = rdd_batch_decode(encoded, what, &h->priv);
  } else {
    s = common_read_file(what, &file);
    bytes = file.len;
    if (s == FL_OK) s = rdd_batch_decode(fl_buf_bytes(&file), what, &h->priv);
    fl_buf_free(&file);
  }
  if (s != FL_OK) {
    /* A damaged block is never returned: drop it, and lineage recomputes the partition. */
    fprintf(stderr, "flint: dropping a damaged cached block: %s\n", fl_last_error());
    drop_block(bm, b);
    goto miss;
  }
  *batch = &h->priv;
  *handle = h;
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  count_block_read(bytes);
  return true;
miss:
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  common_free(h);
  return false;
}

static void bm_release(void *impl, void *handle) {
  block_manager *bm = impl;
  read_handle *h = handle;
  if (h->pinned) {
    FL_PCHECK(pthread_mutex_lock(&bm->lock));
    block *b = h->pinned;
    if (--b->pins == 0 && b->removed) block_free(b);
    FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  }
  if (h->peer) {
    FL_PCHECK(pthread_mutex_lock(&bm->lock));
    peer_block *p = h->peer;
    bool last = --p->pins == 0 && p->removed;
    FL_PCHECK(pthread_mutex_unlock(&bm->lock));
    if (last) {
      shared_block_free(p->sb);
      common_free(p);
    }
  }
  rdd_batch_free(&h->priv);
  common_free(h);
}

static fl_status bm_put(void *impl, rdd_block_key key, fl_storage_level level,
                        rdd_batch *batch, const rdd_batch **stored, void **handle) {
  block_manager *bm = impl;
  read_handle *h = common_calloc(1, sizeof *h);
  block *b = common_calloc(1, sizeof *b);
  if (!h || !b) {
    common_free(h);
    common_free(b);
    return FL_ERR(FL_ENOMEM, "cannot allocate a block");
  }
  b->key = key;
  b->level = level;
  bool in_memory = level == FL_MEMORY_ONLY || level == FL_MEMORY_AND_DISK;
  if (bm->share && in_memory && batch->buf.len >= SHARED_BLOCK_MIN &&
      shared_block_create(key, batch, &b->shared) != FL_OK) /* then a private buffer serves */
    common_log(LOG_DEBUG, "block rdd_%llu_%u is not shared: %s", (unsigned long long)key.rdd_id, key.partition,
               fl_last_error());
  /* Hold exactly the bytes of the records, not the growth slack of the buffer. */
  if (!b->shared && batch->buf.cap > batch->buf.len && batch->buf.len > 0) {
    uint8_t *shrunk = common_realloc(batch->buf.data, batch->buf.len);
    if (shrunk) {
      batch->buf.data = shrunk;
      batch->buf.cap = batch->buf.len;
    }
  }
  fl_status s = FL_OK;
  if (level == FL_MEMORY_SER && (s = rdd_batch_encode(batch, &b->ser)) != FL_OK) {
    common_free(h);
    block_free(b);
    return s;
  }

  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  bool keep_private = true; /* the reader gets the caller's batch */
  bool drop_callers = false; /* the caller's batch is copied into a kept shared block */
  if (find(bm, key)) {
    /* Another task cached it first; this copy is only read. */
    block_free(b);
    b = NULL;
  } else if (level == FL_MEMORY_ONLY || level == FL_MEMORY_AND_DISK || level == FL_MEMORY_SER) {
    uint64_t need = level == FL_MEMORY_SER ? b->ser.cap : b->shared ? shared_block_bytes(b->shared) : batch->buf.cap;
    if (make_room(bm, need, key.rdd_id)) {
      b->mem_bytes = need;
      if (level == FL_MEMORY_SER) {
        b->where = IN_MEMORY_SER;
      } else {
        b->where = IN_MEMORY;
        if (b->shared) { /* the shared copy stays; the caller's goes, below */
          b->batch = *shared_block_batch(b->shared);
          bm->blocks_shared++;
          drop_callers = true;
        } else {
          b->batch = *batch;
          *batch = (rdd_batch){FL_BUF_INIT, 0};
        }
        b->pins = 1;
        h->pinned = b;
        keep_private = false;
      }
      bm->memory_used += need;
      bm->blocks_in_memory++;
      lru_push_front(bm, b);
      hash_insert(bm, b);
      tell(bm, b);
    } else if (level == FL_MEMORY_AND_DISK) {
      warn_no_room(bm, key, level, need);
      free_records(b);
      s = spill(bm, b, batch);
      if (s == FL_OK) hash_insert(bm, b);
      if (s == FL_OK) tell(bm, b);
    } else {
      warn_no_room(bm, key, level, need);
      block_free(b); /* does not fit: not cached, recomputed next time (as Spark) */
    }
  } else { /* FL_DISK_ONLY */
    s = spill(bm, b, batch);
    if (s == FL_OK) hash_insert(bm, b);
    if (s == FL_OK) tell(bm, b);
  }
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  if (s != FL_OK) {
    block_free(b);
    common_free(h);
    return s;
  }
  if (drop_callers) rdd_batch_free(batch);
  if (keep_private) {
    h->priv = *batch;
    *batch = (rdd_batch){FL_BUF_INIT, 0};
    *stored = &h->priv;
  } else {
    *stored = &h->pinned->batch;
  }
  *handle = h;
  return FL_OK;
}

/* ---- other executors' blocks ------------------------------------------------------------ */

static void peer_unlink(block_manager *bm, peer_block *p) {
  if (p->prev) p->prev->next = p->next; else bm->peers = p->next;
  if (p->next) p->next->prev = p->prev;
  p->prev = p->next = NULL;
  bm->peer_blocks--;
  bm->peer_bytes -= shared_block_bytes(p->sb);
}

/* Unmaps a peer block, or leaves that to its last reader. */
static void peer_drop(block_manager *bm, peer_block *p) {
  peer_unlink(bm, p);
  if (p->pins > 0) {
    p->removed = true;
    return;
  }
  shared_block_free(p->sb);
  common_free(p);
}

static void peers_drop_range(block_manager *bm, uint64_t lo, uint64_t hi) {
  for (peer_block *p = bm->peers, *next; p; p = next) {
    next = p->next;
    if (p->key.rdd_id >= lo && p->key.rdd_id < hi) peer_drop(bm, p);
  }
}

fl_status block_manager_get_peer(block_manager *bm, rdd_block_key key, uint32_t pid, const rdd_batch **batch,
                                 void **handle) {
  read_handle *h = common_calloc(1, sizeof *h);
  if (!h) return FL_ERR(FL_ENOMEM, "out of memory");
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  peer_block *p = bm->peers;
  while (p && !(p->key.rdd_id == key.rdd_id && p->key.partition == key.partition)) p = p->next;
  if (p && p->pid != pid) { /* the block moved (its owner was lost or evicted it) */
    peer_drop(bm, p);
    p = NULL;
  }
  if (p) {
    peer_unlink(bm, p);
  } else {
    FL_PCHECK(pthread_mutex_unlock(&bm->lock)); /* mapping and checking take a while */
    shared_block *sb;
    fl_status s = shared_block_open(pid, key, &sb);
    if (s == FL_OK && !(p = common_calloc(1, sizeof *p))) {
      shared_block_free(sb);
      s = FL_ERR(FL_ENOMEM, "out of memory");
    }
    if (s != FL_OK) {
      common_free(h);
      return s;
    }
    *p = (peer_block){.key = key, .pid = pid, .sb = sb};
    FL_PCHECK(pthread_mutex_lock(&bm->lock));
    /* Room within the memory limit, least recently used first; over it, this one is read
     * once and unmapped. */
    uint64_t size = shared_block_bytes(sb);
    peer_block *last = bm->peers;
    while (last && last->next) last = last->next;
    while (last && bm->peer_bytes + size > bm->memory_limit) {
      peer_block *prev = last->prev;
      peer_drop(bm, last);
      last = prev;
    }
  }
  if (bm->peer_bytes + shared_block_bytes(p->sb) <= bm->memory_limit) { /* most recently used first */
    p->next = bm->peers;
    if (bm->peers) bm->peers->prev = p;
    bm->peers = p;
    bm->peer_blocks++;
    bm->peer_bytes += shared_block_bytes(p->sb);
  } else {
    p->removed = true;
  }
  p->pins++;
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  h->peer = p;
  *batch = shared_block_batch(p->sb);
  *handle = h;
  count_block_read((*batch)->buf.len);
  return FL_OK;
}

static void bm_remove_rdd(void *impl, uint64_t rdd_id) {
  block_manager *bm = impl;
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  peers_drop_range(bm, rdd_id, rdd_id + 1);
  forget_warned(bm, rdd_id, rdd_id + 1);
  for (size_t i = 0; i < bm->num_buckets; i++) {
    block *b = bm->buckets[i];
    while (b) {
      block *next = b->hash_next;
      if (b->key.rdd_id == rdd_id) drop_block(bm, b);
      b = next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
}

void block_manager_remove_range(block_manager *bm, uint64_t lo, uint64_t hi) {
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  peers_drop_range(bm, lo, hi);
  forget_warned(bm, lo, hi);
  for (size_t i = 0; i < bm->num_evicted;) {
    if (bm->evicted[i].rdd_id >= lo && bm->evicted[i].rdd_id < hi) bm->evicted[i] = bm->evicted[--bm->num_evicted];
    else i++;
  }
  for (size_t i = 0; i < bm->num_buckets; i++) {
    block *b = bm->buckets[i];
    while (b) {
      block *next = b->hash_next;
      if (b->key.rdd_id >= lo && b->key.rdd_id < hi) drop_block(bm, b);
      b = next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
  /* Shuffle files are named by id (bm_shuffle_path). */
  DIR *d = opendir(bm->dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    unsigned long long id;
    if (sscanf(e->d_name, "shuffle_%llu_", &id) == 1 && id >= lo && id < hi) unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

void block_manager_range_stats(block_manager *bm, uint64_t lo, uint64_t hi, block_manager_stats *out) {
  memset(out, 0, sizeof *out);
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  out->memory_limit = bm->memory_limit;
  for (size_t i = 0; i < bm->num_buckets; i++)
    for (block *b = bm->buckets[i]; b; b = b->hash_next) {
      if (b->key.rdd_id < lo || b->key.rdd_id >= hi) continue;
      out->memory_used += b->mem_bytes;
      out->blocks_in_memory += b->where == IN_MEMORY || b->where == IN_MEMORY_SER;
      out->blocks_on_disk += b->where == ON_DISK;
      out->disk_used += b->where == ON_DISK ? b->disk_bytes : 0;
    }
  for (size_t i = 0; i < bm->num_evicted; i++)
    if (bm->evicted[i].rdd_id >= lo && bm->evicted[i].rdd_id < hi) out->evictions += bm->evicted[i].count;
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
}

static void bm_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
  block_manager *bm = impl;
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  for (size_t i = 0; i < bm->num_buckets; i++)
    for (block *b = bm->buckets[i]; b; b = b->hash_next) {
      if (b->key.rdd_id != rdd_id) continue;
      out->cached_partitions++;
      out->memory_bytes += b->mem_bytes;
      out->disk_bytes += b->where == ON_DISK ? b->disk_bytes : 0;
    }
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
}

/* ---- shuffle files: one data file per map task, with an index of R + 1 offsets --------- */

static void bm_shuffle_path(void *impl, uint64_t shuffle_id, uint32_t map, char *path, size_t len) {
  block_manager *bm = impl;
  snprintf(path, len, "%s/shuffle_%llu_%u.data", bm->dir, (unsigned long long)shuffle_id, map);
}

static fl_status bm_shuffle_fetch(void *impl, uint64_t shuffle_id, uint32_t map, uint32_t reduce,
                                  uint64_t offset, uint64_t want, fl_buf *out, uint64_t *block_len) {
  char data[4096], index[4200];
  bm_shuffle_path(impl, shuffle_id, map, data, sizeof data);
  snprintf(index, sizeof index, "%s.index", data);
  const char *what = "shuffle %llu, map %u, reduce %u: %s";
  fl_status st = FL_OK;
  int ifd = open(index, O_RDONLY | O_CLOEXEC), dfd = -1;
  uint64_t range[2];
  if (ifd < 0 || pread(ifd, range, sizeof range, (off_t)reduce * 8) != (ssize_t)sizeof range) {
    st = FL_ERR(FL_EFETCH, what, (unsigned long long)shuffle_id, map, reduce,
                ifd < 0 ? "map output is missing" : "index file is truncated");
    goto done;
  }
  if (range[1] < range[0]) {
    st = FL_ERR(FL_EFETCH, what, (unsigned long long)shuffle_id, map, reduce, "index file is corrupt");
    goto done;
  }
  *block_len = range[1] - range[0];
  out->len = 0;
  if (offset >= *block_len || want == 0) goto done;
  size_t len = (size_t)(want < *block_len - offset ? want : *block_len - offset);
  if ((st = fl_buf_reserve(out, len)) != FL_OK) goto done;
  if ((dfd = open(data, O_RDONLY | O_CLOEXEC)) < 0) {
    st = FL_ERR(FL_EFETCH, what, (unsigned long long)shuffle_id, map, reduce, "data file is missing");
    goto done;
  }
  while (out->len < len) {
    ssize_t n = pread(dfd, out->data + out->len, len - out->len, (off_t)(range[0] + offset + out->len));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      st = FL_ERR(FL_EFETCH, what, (unsigned long long)shuffle_id, map, reduce,
                  n < 0 ? strerror(errno) : "data file is truncated");
      goto done;
    }
    out->len += (size_t)n;
  }
done:
  if (ifd >= 0) close(ifd);
  if (dfd >= 0) close(dfd);
  return st;
}

static void bm_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {
  char data[4096], index[4200];
  for (uint32_t m = 0; m < num_maps; m++) {
    bm_shuffle_path(impl, shuffle_id, m, data, sizeof data);
    snprintf(index, sizeof index, "%s.index", data);
    unlink(data);
    unlink(index);
  }
}

const rdd_cache_ops block_manager_cache_ops = {bm_get,  bm_put,          bm_release,
                                               bm_remove_rdd, bm_info, bm_shuffle_path,
                                               bm_shuffle_fetch, bm_shuffle_remove};

/* ---- lifetime -------------------------------------------------------------------------- */

fl_status block_manager_create(uint64_t memory_limit, const char *dir, bool share, block_manager **out) {
  block_manager *bm = common_calloc(1, sizeof *bm);
  if (!bm) return FL_ERR(FL_ENOMEM, "cannot allocate a block manager");
  bm->num_buckets = 64;
  bm->buckets = common_calloc(bm->num_buckets, sizeof *bm->buckets);
  bm->dir = common_strdup(dir);
  if (!bm->buckets || !bm->dir) {
    common_free(bm->buckets);
    common_free(bm->dir);
    common_free(bm);
    return FL_ERR(FL_ENOMEM, "cannot allocate a block manager");
  }
  FL_PCHECK(pthread_mutex_init(&bm->lock, NULL));
  bm->memory_limit = memory_limit;
  bm->share = share;
  *out = bm;
  return FL_OK;
}

void block_manager_set_listener(block_manager *bm, block_manager_listener fn, void *arg) {
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  bm->listener = fn;
  bm->listener_arg = arg;
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
}

void block_manager_destroy(block_manager *bm) {
  if (!bm) return;
  bm->listener = NULL; /* the blocks go with the process or context, not one by one */
  for (size_t i = 0; i < bm->num_buckets; i++) {
    block *b = bm->buckets[i];
    while (b) {
      block *next = b->hash_next;
      FL_ASSERT(b->pins == 0);
      drop_block(bm, b);
      b = next;
    }
  }
  while (bm->peers) {
    FL_ASSERT(bm->peers->pins == 0);
    peer_drop(bm, bm->peers);
  }
  pthread_mutex_destroy(&bm->lock);
  common_free(bm->warned);
  common_free(bm->evicted);
  common_free(bm->buckets);
  common_free(bm->dir);
  common_free(bm);
}

void block_manager_stats_get(block_manager *bm, block_manager_stats *out) {
  FL_PCHECK(pthread_mutex_lock(&bm->lock));
  out->memory_used = bm->memory_used;
  out->memory_limit = bm->memory_limit;
  out->disk_used = bm->disk_used;
  out->blocks_in_memory = bm->blocks_in_memory;
  out->blocks_on_disk = bm->blocks_on_disk;
  out->evictions = bm->evictions;
  out->blocks_shared = bm->blocks_shared;
  out->peer_blocks = bm->peer_blocks;
  out->peer_bytes = bm->peer_bytes;
  FL_PCHECK(pthread_mutex_unlock(&bm->lock));
}
