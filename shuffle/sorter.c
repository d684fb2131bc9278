/*
 * sorter.c: an external sorter of (partition, key, value) entries with optional
 * aggregation, the one engine behind both sides of a shuffle (as Spark's ExternalSorter).
 *
 * Entries live in one arena: a 16-byte header (partition, key length, value length, index
 * of the entry), the key, the value. When aggregating, a hash table on (partition, key)
 * whose slots hold the entry's arena offset finds the entry of a key in two dependent
 * memory reads (slots for a batch of keys are prefetched first), and its combiner is
 * replaced in place when the new one has the same length (numbers, vectors: no garbage) or
 * appended otherwise. Past the memory budget the entries are sorted and written to disk as
 * a run of LZ4-framed chunks; at the end the runs (and what is still in memory) are merged
 * through a heap, combining equal keys across runs. With no runs, output needs only
 * partition order unless key order was asked for: a counting sort, not a comparison sort.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shuffle/shuffle.h"

#define ENTRY_HEADER 16
/* A slot: the tag (high bits of the hash) above the entry's arena offset + 1 (0: empty). */
#define SLOT_OFFSET_BITS 40
#define SLOT_OFFSET_MASK ((1ull << SLOT_OFFSET_BITS) - 1)
#define RUN_CHUNK (1u << 20) /* raw bytes of entries per encoded chunk of a run */
#define MAX_RUNS 64           /* runs merged into one past this (each is an open file) */
#define MIN_MEMORY (16u << 10) /* below this the sorter's own tables would spill every entry */

typedef struct run_reader {
  int fd;
  const char *path;
  rdd_batch chunk;
  rdd_cursor cursor;
  fl_bytes head; /* the current entry's bytes, valid until the next advance */
} run_reader;

struct shuffle_sorter {
  shuffle_sorter_config cfg;
  fl_buf arena;
  uint64_t *offsets;
  size_t count, cap;
  uint64_t *table; /* agg: see SLOT_OFFSET_BITS */
  size_t table_cap;
  bool runs_by_key; /* runs are sorted by key too (key order asked for, or aggregating) */
  uint32_t max_part;
  /* Compact aggregation (see compact_insert): keys of <= 8 bytes and combiners of exactly
   * 8 bytes kept in the slots themselves, so that a lookup misses the cache once. */
  bool compact;
  struct compact_slot *cslots;
  size_t ccap, ccount;
  fl_buf scratch;
  char **runs;
  uint32_t num_runs, cap_runs;
  uint32_t spills; /* runs written from memory in all (compaction merges some of them) */
  /* iteration */
  enum { PHASE_INPUT, PHASE_MEMORY, PHASE_MERGE } phase;
  size_t pos;
  run_reader *readers; /* one per run being merged */
  uint32_t num_readers;
  uint32_t *heap, heap_len;
  fl_buf cur_key, cur_val;
};

static atomic_uint_fast64_t run_counter;

/* ---- entries and order ----------------------------------------------------------------- */

static inline void entry_read(const uint8_t *p, uint32_t *part, fl_bytes *key, fl_bytes *value) {
  uint32_t h[3];
  memcpy(h, p, sizeof h);
  *part = h[0];
  key->data = p + ENTRY_HEADER;
  key->len = h[1];
  value->data = p + ENTRY_HEADER + h[1];
  value->len = h[2];
}

static int compare_entries(const shuffle_sorter *s, const uint8_t *a, const uint8_t *b) {
  uint32_t pa, pb;
  fl_bytes ka, kb, va, vb;
  entry_read(a, &pa, &ka, &va);
  entry_read(b, &pb, &kb, &vb);
  if (pa != pb) return pa < pb ? -1 : 1;
  if (!s->runs_by_key) return 0;
  int c = rdd_compare_keys(s->cfg.key_order, s->cfg.key_order_arg, ka, kb);
  return s->cfg.descending ? -c : c;
}

static int compare_offsets(const void *a, const void *b, void *ctx) {
  const shuffle_sorter *s = ctx;
  return compare_entries(s, s->arena.data + *(const uint64_t *)a, s->arena.data + *(const uint64_t *)b);
}

/* The arena is reserved at the budget's size up front (see reserve_arena), so its used
 * bytes, not its capacity, are what counts. */
typedef struct compact_slot {
  uint64_t key;   /* the key's bytes, zero-padded */
  uint64_t value; /* the combiner */
  uint32_t part;
  uint8_t klen;   /* 0 to 8 */
  uint8_t used;
  uint16_t tag;   /* 16 bits of the hash: most mismatches end here */
} compact_slot;

static uint64_t memory_used(const shuffle_sorter *s) {
  return s->arena.len + s->cap * sizeof *s->offsets + s->table_cap * sizeof *s->table +
         s->ccap * sizeof(compact_slot);
}

static bool has_entries(const shuffle_sorter *s) { return s->count > 0 || s->ccount > 0; }

/* Advises huge pages for a large block that will be touched all over (a hint only). */
static void advise_huge(void *p, size_t bytes) {
  if (bytes < (4u << 20)) return;
  uintptr_t lo = ((uintptr_t)p + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)p + bytes) & ~(uintptr_t)4095;
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

/* Reserves the arena once at the budget's size: growing it by doubling would copy it again
 * and again, and untouched pages cost nothing. */
static fl_status reserve_arena(shuffle_sorter *s, size_t need) {
  if (s->arena.cap == 0) {
    uint64_t want = s->cfg.memory < (1ull << 30) ? s->cfg.memory : (1ull << 30);
    if (want > need) need = (size_t)want;
    fl_status st = fl_buf_reserve(&s->arena, need);
    if (st == FL_OK) advise_huge(s->arena.data, s->arena.cap);
    return st;
  }
  return fl_buf_reserve(&s->arena, need);
}

static fl_status user_failed(shuffle_sorter *s, const void *fn, const char *what, fl_status st) {
  char name[256];
  common_symbol_name(fn, name, sizeof name);
  common_error_wrap(st, "%s function '%s' failed%s%s: ", what, name,
                    s->cfg.fn_owner ? " in " : "", s->cfg.fn_owner ? s->cfg.fn_owner->fn_kind : "");
  return st;
}

/* ---- input ----------------------------------------------------------------------------- */

static fl_status append_entry(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value,
                              uint64_t *offset) {
  if (key.len > UINT32_MAX || value.len > UINT32_MAX)
    return FL_ERR(FL_ELIMIT, "shuffle: a key or value of over 4 GiB");
  if (s->count == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 256;
    uint64_t *grown = common_realloc(s->offsets, cap * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "shuffle: cannot grow the entry index");
    s->offsets = grown;
    s->cap = cap;
  }
  fl_status st = reserve_arena(s, ENTRY_HEADER + key.len + value.len);
  if (st != FL_OK) return st;
  if (s->arena.len + ENTRY_HEADER + key.len + value.len > SLOT_OFFSET_MASK)
    return FL_ERR(FL_ELIMIT, "shuffle: more than 1 TiB of entries in memory");
  uint32_t h[4] = {part, (uint32_t)key.len, (uint32_t)value.len, (uint32_t)s->count};
  *offset = s->arena.len;
  fl_buf_append(&s->arena, h, ENTRY_HEADER);
  fl_buf_append(&s->arena, key.data, key.len);
  fl_buf_append(&s->arena, value.data, value.len);
  s->offsets[s->count++] = *offset;
  if (part > s->max_part) s->max_part = part;
  return FL_OK;
}

/* Key equality without a library call for the short keys that aggregation mostly sees. */
static inline bool keys_equal(const uint8_t *a, const uint8_t *b, size_t len) {
  if (len == 8) {
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return x == y;
  }
  return len == 0 || memcmp(a, b, len) == 0;
}

static inline uint64_t entry_hash_of(uint32_t part, uint64_t key_hash) {
  return key_hash ^ common_hash64(part);
}

static uint64_t entry_hash(uint32_t part, fl_bytes key) {
  return entry_hash_of(part, common_hash_bytes(key.data, key.len));
}

static inline uint64_t slot_tag(uint64_t hash) { return hash >> SLOT_OFFSET_BITS; }

static fl_status table_grow(shuffle_sorter *s) {
  size_t cap = s->table_cap ? s->table_cap * 2 : 256;
  uint64_t *t = common_calloc(cap, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "shuffle: cannot grow the aggregation table");
  /* A large table is touched at random: huge pages spare a fault and a TLB miss per 4 KiB. */
  advise_huge(t, cap * sizeof *t);
  for (size_t i = 0; i < s->table_cap; i++) {
    uint64_t slot = s->table[i];
    if (!slot) continue;
    uint32_t part;
    fl_bytes k, v;
    entry_read(s->arena.data + (slot & SLOT_OFFSET_MASK) - 1, &part, &k, &v);
    size_t j = entry_hash(part, k) & (cap - 1);
    while (t[j]) j = (j + 1) & (cap - 1);
    t[j] = slot;
  }
  common_free(s->table);
  s->table = t;
  s->table_cap = cap;
  return FL_OK;
}

/* The first combiner of a key, into *out (which may then view `value` itself). */
static fl_status make_combiner(shuffle_sorter *s, fl_bytes value, fl_bytes *out) {
  const rdd_aggregator *a = s->cfg.agg;
  if (s->cfg.values_are_combiners || (!a->create && !a->has_zero)) {
    *out = value;
    return FL_OK;
  }
  s->scratch.len = 0;
  fl_status st = a->create ? a->create(value, &s->scratch, a->arg)
                           : a->merge_value(a->zero, value, &s->scratch, a->arg);
  if (st != FL_OK)
    return user_failed(s, a->create ? (const void *)a->create : (const void *)a->merge_value,
                       a->create ? "create" : "merge", st);
  *out = fl_buf_bytes(&s->scratch);
  return FL_OK;
}

static fl_status spill(shuffle_sorter *s);

/* Combines `value` into the entry of (part, key), or adds the entry. With is_combiner,
 * `value` is the key's combiner already: it replaces the entry's, or starts a new one. */
static fl_status insert_hashed(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value,
                               uint64_t h, bool is_combiner) {
  const rdd_aggregator *a = s->cfg.agg;
  fl_status st;
  uint64_t offset;
  if (s->count * 2 >= s->table_cap && (st = table_grow(s)) != FL_OK) return st;
  uint64_t tag = slot_tag(h);
  size_t i = h & (s->table_cap - 1);
  for (;;) {
    uint64_t slot = s->table[i];
    if (!slot) break;
    if ((slot >> SLOT_OFFSET_BITS) == tag) {
      uint8_t *e = s->arena.data + (slot & SLOT_OFFSET_MASK) - 1;
      uint32_t p;
      fl_bytes k, v;
      entry_read(e, &p, &k, &v);
      if (p == part && k.len == key.len && keys_equal(k.data, key.data, key.len)) {
        fl_reduce_fn merge = s->cfg.values_are_combiners ? a->merge_combiners : a->merge_value;
        s->scratch.len = 0;
        if (is_combiner) st = fl_buf_append(&s->scratch, value.data, value.len);
        else if ((st = merge(v, value, &s->scratch, a->arg)) != FL_OK)
          return user_failed(s, (const void *)merge, "merge", st);
        if (st != FL_OK) return st;
        if (s->scratch.len == v.len) {
          if (v.len) memcpy((uint8_t *)v.data, s->scratch.data, v.len);
          return FL_OK;
        }
        /* A combiner of another length: a new copy of the entry, under the same index. */
        uint32_t index;
        memcpy(&index, e + 12, 4);
        fl_buf keycopy = FL_BUF_INIT; /* the arena may move while it grows */
        if ((st = fl_buf_append(&keycopy, key.data, key.len)) != FL_OK) return st;
        st = append_entry(s, part, fl_buf_bytes(&keycopy), fl_buf_bytes(&s->scratch), &offset);
        fl_buf_free(&keycopy);
        if (st != FL_OK) return st;
        s->count--;
        s->offsets[index] = offset;
        memcpy(s->arena.data + offset + 12, &index, 4);
        s->table[i] = (tag << SLOT_OFFSET_BITS) | (offset + 1);
        return FL_OK;
      }
    }
    i = (i + 1) & (s->table_cap - 1);
  }
  fl_bytes combiner = value;
  if (!is_combiner && (st = make_combiner(s, value, &combiner)) != FL_OK) return st;
  if ((st = append_entry(s, part, key, combiner, &offset)) != FL_OK) return st;
  s->table[i] = (tag << SLOT_OFFSET_BITS) | (offset + 1);
  return FL_OK;
}

/* ---- compact aggregation ---------------------------------------------------------------- */
/*
 * Sums, counts and most numeric aggregations have keys of at most 8 bytes and combiners of
 * exactly 8: kept in the slots of an open-addressing table, such a lookup costs one cache
 * miss (prefetched) where the arena costs two dependent ones. The first key or combiner
 * that does not fit moves every slot into the arena (compact_leave) and the sorter goes on
 * in the general way; spill and finish move the slots into arena entries first
 * (compact_flush), so runs and output do not know the difference.
 */

static fl_status compact_grow(shuffle_sorter *s) {
  size_t cap = s->ccap ? s->ccap * 2 : 128;
  compact_slot *t = common_calloc(cap, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "shuffle: cannot grow the aggregation table");
  advise_huge(t, cap * sizeof *t);
  for (size_t i = 0; i < s->ccap; i++) {
    compact_slot *c = &s->cslots[i];
    if (!c->used) continue;
    uint64_t h = entry_hash(c->part, fl_bytes_of(&c->key, c->klen));
    size_t j = h & (cap - 1);
    while (t[j].used) j = (j + 1) & (cap - 1);
    t[j] = *c;
  }
  common_free(s->cslots);
  s->cslots = t;
  s->ccap = cap;
  return FL_OK;
}

/* Moves the slots into arena entries (no table) and empties them. */
static fl_status compact_flush(shuffle_sorter *s) {
  fl_status st = FL_OK;
  uint64_t offset;
  for (size_t i = 0; i < s->ccap && st == FL_OK; i++) {
    compact_slot *c = &s->cslots[i];
    if (c->used) st = append_entry(s, c->part, fl_bytes_of(&c->key, c->klen), fl_bytes_of(&c->value, 8), &offset);
  }
  if (st != FL_OK) return st;
  common_free(s->cslots);
  s->cslots = NULL;
  s->ccap = s->ccount = 0;
  return FL_OK;
}

/* Leaves compact mode: the slots become entries of the general table. */
static fl_status compact_leave(shuffle_sorter *s) {
  fl_status st = FL_OK;
  compact_slot *slots = s->cslots;
  size_t cap = s->ccap;
  s->cslots = NULL;
  s->ccap = s->ccount = 0;
  s->compact = false;
  for (size_t i = 0; i < cap && st == FL_OK; i++) {
    compact_slot *c = &slots[i];
    if (!c->used) continue;
    fl_bytes key = fl_bytes_of(&c->key, c->klen);
    st = insert_hashed(s, c->part, key, fl_bytes_of(&c->value, 8), entry_hash(c->part, key), true);
  }
  common_free(slots);
  return st;
}

/* Leaves compact mode, then sets the key's combiner (copied: it may be in scratch). */
static fl_status compact_leave_with(shuffle_sorter *s, uint32_t part, fl_bytes key,
                                    fl_bytes combiner, uint64_t h) {
  fl_buf copy = FL_BUF_INIT;
  fl_status st = fl_buf_append(&copy, combiner.data, combiner.len);
  if (st == FL_OK) st = compact_leave(s);
  if (st == FL_OK) st = insert_hashed(s, part, key, fl_buf_bytes(&copy), h, true);
  fl_buf_free(&copy);
  return st;
}

static fl_status compact_insert(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value,
                                uint64_t h) {
  fl_status st;
  if (key.len > 8) {
    if ((st = compact_leave(s)) != FL_OK) return st;
    return insert_hashed(s, part, key, value, h, false);
  }
  if (s->ccount * 2 >= s->ccap && (st = compact_grow(s)) != FL_OK) return st;
  const rdd_aggregator *a = s->cfg.agg;
  uint64_t kv = 0;
  if (key.len) memcpy(&kv, key.data, key.len);
  uint16_t tag = (uint16_t)(h >> 48);
  size_t mask = s->ccap - 1, i = h & mask;
  for (;; i = (i + 1) & mask) {
    compact_slot *c = &s->cslots[i];
    if (!c->used) break;
    if (c->tag != tag || c->key != kv || c->klen != key.len || c->part != part) continue;
    fl_reduce_fn merge = s->cfg.values_are_combiners ? a->merge_combiners : a->merge_value;
    s->scratch.len = 0;
    if ((st = merge(fl_bytes_of(&c->value, 8), value, &s->scratch, a->arg)) != FL_OK)
      return user_failed(s, (const void *)merge, "merge", st);
    if (s->scratch.len == 8) {
      memcpy(&c->value, s->scratch.data, 8);
      return FL_OK;
    }
    return compact_leave_with(s, part, key, fl_buf_bytes(&s->scratch), h);
  }
  fl_bytes combiner;
  if ((st = make_combiner(s, value, &combiner)) != FL_OK) return st;
  if (combiner.len != 8) return compact_leave_with(s, part, key, combiner, h);
  compact_slot *c = &s->cslots[i];
  c->key = kv;
  memcpy(&c->value, combiner.data, 8);
  c->part = part;
  c->klen = (uint8_t)key.len;
  c->used = 1;
  c->tag = tag;
  s->ccount++;
  if (part > s->max_part) s->max_part = part;
  return FL_OK;
}

static fl_status aggregate_one(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value,
                               uint64_t h) {
  return s->compact ? compact_insert(s, part, key, value, h) : insert_hashed(s, part, key, value, h, false);
}

fl_status shuffle_sorter_insert(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value) {
  fl_status st;
  if (s->cfg.agg) {
    st = aggregate_one(s, part, key, value, entry_hash(part, key));
  } else {
    uint64_t offset;
    st = append_entry(s, part, key, value, &offset);
  }
  if (st == FL_OK && memory_used(s) > s->cfg.memory && has_entries(s)) st = spill(s);
  return st;
}

/* Keys hashed ahead of the one being inserted: its slot is prefetched SLOT_AHEAD keys
 * before, and the entry that slot points at ENTRY_AHEAD keys before, so the two dependent
 * misses of a lookup overlap the work on other keys. */
#define SLOT_AHEAD 12
#define ENTRY_AHEAD 6
#define COMPACT_AHEAD 6 /* compact mode: one miss per key, prefetched this many keys ahead */

fl_status shuffle_sorter_insert_batch(shuffle_sorter *s, uint32_t n, const uint32_t *parts,
                                      const fl_bytes *keys, const fl_bytes *values,
                                      const uint64_t *key_hashes) {
  fl_status st = FL_OK;
  if (!s->cfg.agg) {
    for (uint32_t i = 0; i < n && st == FL_OK; i++) st = shuffle_sorter_insert(s, parts[i], keys[i], values[i]);
    return st;
  }
  uint64_t hashes[RDD_ITER_BATCH];
  if (n > RDD_ITER_BATCH) return FL_ERR(FL_EINTERNAL, "shuffle: batch of %u keys", n);
  for (uint32_t i = 0; i < n + SLOT_AHEAD && st == FL_OK; i++) {
    if (i < n) {
      hashes[i] = key_hashes ? entry_hash_of(parts[i], key_hashes[i]) : entry_hash(parts[i], keys[i]);
      if (!s->compact && s->table) __builtin_prefetch(&s->table[hashes[i] & (s->table_cap - 1)]);
    }
    if (s->compact && s->cslots && i >= SLOT_AHEAD - COMPACT_AHEAD && i - (SLOT_AHEAD - COMPACT_AHEAD) < n)
      __builtin_prefetch(&s->cslots[hashes[i - (SLOT_AHEAD - COMPACT_AHEAD)] & (s->ccap - 1)]);
    if (!s->compact && i >= SLOT_AHEAD - ENTRY_AHEAD && i - (SLOT_AHEAD - ENTRY_AHEAD) < n && s->table) {
      uint64_t slot = s->table[hashes[i - (SLOT_AHEAD - ENTRY_AHEAD)] & (s->table_cap - 1)];
      if (slot) __builtin_prefetch(s->arena.data + (slot & SLOT_OFFSET_MASK) - 1);
    }
    if (i >= SLOT_AHEAD) {
      uint32_t k = i - SLOT_AHEAD;
      st = aggregate_one(s, parts[k], keys[k], values[k], hashes[k]);
      if (st == FL_OK && memory_used(s) > s->cfg.memory && has_entries(s)) st = spill(s);
    }
  }
  return st;
}

/* ---- runs ------------------------------------------------------------------------------ */

static fl_status write_chunk(int fd, rdd_batch *chunk, fl_buf *enc, const char *path) {
  fl_status st = rdd_batch_encode(chunk, enc);
  if (st != FL_OK) return st;
  uint64_t len = enc->len;
  char what[4200];
  snprintf(what, sizeof what, "spill file %s", path);
  if ((st = common_write_all(fd, &len, 8, what)) != FL_OK) return st;
  if ((st = common_write_all(fd, enc->data, enc->len, what)) != FL_OK) return st;
  chunk->buf.len = 0;
  chunk->count = 0;
  return FL_OK;
}

/* Creates a new run file and records it (destroy deletes it from then on). */
static fl_status new_run(shuffle_sorter *s, int *fd, const char **path_out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/spill-%d-%llu.run", s->cfg.dir, (int)getpid(),
           (unsigned long long)atomic_fetch_add(&run_counter, 1));
  if (s->num_runs == s->cap_runs) {
    uint32_t cap = s->cap_runs ? s->cap_runs * 2 : 8;
    char **grown = common_realloc(s->runs, cap * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "shuffle: cannot record a spill");
    s->runs = grown;
    s->cap_runs = cap;
  }
  char *copy = common_strdup(path);
  if (!copy) return FL_ERR(FL_ENOMEM, "shuffle: cannot record a spill");
  *fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (*fd < 0) {
    common_free(copy);
    return FL_ERR(FL_EIO, "cannot create spill file %s: %s", path, strerror(errno));
  }
  s->runs[s->num_runs++] = copy;
  *path_out = copy;
  return FL_OK;
}

/* Appends one entry to a run's pending chunk, writing the chunk when it is full. */
static fl_status run_append(int fd, const char *path, rdd_batch *chunk, fl_buf *enc,
                            const uint8_t *entry, size_t len) {
  fl_status st = rdd_batch_append(chunk, entry, len);
  if (st == FL_OK && chunk->buf.len >= RUN_CHUNK) st = write_chunk(fd, chunk, enc, path);
  return st;
}

static fl_status compact(shuffle_sorter *s);

/* Sorts the entries in memory and writes them as a new run, then forgets them. Past
 * MAX_RUNS runs, the runs are merged into one, so that open files stay bounded. */
static fl_status spill(shuffle_sorter *s) {
  fl_status st;
  if (s->ccount > 0 && (st = compact_flush(s)) != FL_OK) return st;
  if (s->count > 1) qsort_r(s->offsets, s->count, sizeof *s->offsets, compare_offsets, s);
  int fd;
  const char *path;
  if ((st = new_run(s, &fd, &path)) != FL_OK) return st;
  rdd_batch chunk = {FL_BUF_INIT, 0};
  fl_buf enc = FL_BUF_INIT;
  for (size_t i = 0; i < s->count && st == FL_OK; i++) {
    const uint8_t *e = s->arena.data + s->offsets[i];
    uint32_t h[4];
    memcpy(h, e, ENTRY_HEADER);
    st = run_append(fd, path, &chunk, &enc, e, ENTRY_HEADER + (size_t)h[1] + h[2]);
  }
  if (st == FL_OK && chunk.count > 0) st = write_chunk(fd, &chunk, &enc, path);
  if (close(fd) != 0 && st == FL_OK) st = FL_ERR(FL_EIO, "cannot write spill file %s: %s", path, strerror(errno));
  rdd_batch_free(&chunk);
  fl_buf_free(&enc);
  s->arena.len = 0;
  s->count = 0;
  s->max_part = 0;
  if (memory_used(s) > s->cfg.memory / 4) {
    /* Tables grown past the budget would make every later insert spill: start them small. */
    common_free(s->table);
    common_free(s->offsets);
    s->table = NULL;
    s->offsets = NULL;
    s->table_cap = s->cap = 0;
  } else if (s->table) {
    memset(s->table, 0, s->table_cap * sizeof *s->table);
  }
  s->spills++;
  if (st == FL_OK && s->num_runs >= MAX_RUNS) st = compact(s);
  return st;
}

/* Moves a run reader to its next entry; false at the end of the run or on failure (*st). */
static bool run_advance(run_reader *r, fl_status *st) {
  for (;;) {
    if (rdd_cursor_next(&r->cursor, &r->head)) return true;
    uint64_t len;
    ssize_t n = read(r->fd, &len, 8);
    if (n == 0) return false;
    fl_buf enc = FL_BUF_INIT;
    if (n != 8 || len > (1ull << 34) || (*st = fl_buf_reserve(&enc, (size_t)len)) != FL_OK) {
      if (*st == FL_OK) *st = FL_ERR(FL_ECORRUPT, "spill file %s is truncated", r->path);
      return false;
    }
    size_t got = 0;
    while (got < len) {
      ssize_t m = read(r->fd, enc.data + got, (size_t)len - got);
      if (m < 0 && errno == EINTR) continue;
      if (m <= 0) break;
      got += (size_t)m;
    }
    enc.len = got;
    rdd_batch_free(&r->chunk);
    *st = got == len ? rdd_batch_decode(fl_buf_bytes(&enc), r->path, &r->chunk)
                     : FL_ERR(FL_ECORRUPT, "spill file %s is truncated", r->path);
    fl_buf_free(&enc);
    if (*st != FL_OK) return false;
    r->cursor.p = r->chunk.buf.data;
    r->cursor.end = r->chunk.buf.data + r->chunk.buf.len;
  }
}

/* ---- the heap of run readers, ordered by their current entries -------------------------- */

static bool heap_less(const shuffle_sorter *s, uint32_t a, uint32_t b) {
  int c = compare_entries(s, s->readers[a].head.data, s->readers[b].head.data);
  return c < 0 || (c == 0 && a < b); /* ties by run: earlier runs first, a stable merge */
}

static void heap_down(shuffle_sorter *s, uint32_t i) {
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < s->heap_len && heap_less(s, s->heap[l], s->heap[m])) m = l;
    if (r < s->heap_len && heap_less(s, s->heap[r], s->heap[m])) m = r;
    if (m == i) return;
    uint32_t t = s->heap[i];
    s->heap[i] = s->heap[m];
    s->heap[m] = t;
    i = m;
  }
}

/* Advances the reader at the top of the heap and restores the heap. */
static fl_status heap_pop_advance(shuffle_sorter *s) {
  fl_status st = FL_OK;
  if (!run_advance(&s->readers[s->heap[0]], &st)) {
    if (st != FL_OK) return st;
    s->heap[0] = s->heap[--s->heap_len];
  }
  if (s->heap_len > 0) heap_down(s, 0);
  return FL_OK;
}

/* Orders the entries by partition alone, keeping their order within a partition. */
static fl_status sort_by_partition(shuffle_sorter *s) {
  if (s->max_part == 0) return FL_OK;
  size_t parts = (size_t)s->max_part + 1;
  uint64_t *starts = common_calloc(parts + 1, sizeof *starts);
  uint64_t *sorted = common_malloc((s->count ? s->count : 1) * sizeof *sorted);
  if (!starts || !sorted) {
    common_free(starts);
    common_free(sorted);
    return FL_ERR(FL_ENOMEM, "shuffle: cannot order %zu entries", s->count);
  }
  for (size_t i = 0; i < s->count; i++) {
    uint32_t part;
    memcpy(&part, s->arena.data + s->offsets[i], 4);
    starts[part + 1]++;
  }
  for (size_t p = 1; p <= parts; p++) starts[p] += starts[p - 1];
  for (size_t i = 0; i < s->count; i++) {
    uint32_t part;
    memcpy(&part, s->arena.data + s->offsets[i], 4);
    sorted[starts[part]++] = s->offsets[i];
  }
  common_free(starts);
  common_free(s->offsets);
  s->offsets = sorted;
  s->cap = s->count ? s->count : 1;
  return FL_OK;
}

/* Opens every run and puts its first entry on the heap. */
static fl_status merge_open(shuffle_sorter *s) {
  s->readers = common_calloc(s->num_runs, sizeof *s->readers);
  s->heap = common_calloc(s->num_runs, sizeof *s->heap);
  if (!s->readers || !s->heap) return FL_ERR(FL_ENOMEM, "shuffle: cannot merge %u runs", s->num_runs);
  s->heap_len = 0;
  s->num_readers = s->num_runs;
  for (uint32_t i = 0; i < s->num_runs; i++) s->readers[i].fd = -1;
  for (uint32_t i = 0; i < s->num_runs; i++) {
    run_reader *r = &s->readers[i];
    r->path = s->runs[i];
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) return FL_ERR(FL_EIO, "cannot open spill file %s: %s", r->path, strerror(errno));
    fl_status st = FL_OK;
    if (run_advance(r, &st)) s->heap[s->heap_len++] = i;
    else if (st != FL_OK) return st;
  }
  for (uint32_t i = s->heap_len; i-- > 0;) heap_down(s, i);
  return FL_OK;
}

/* Closes the runs' readers (the run files stay). */
static void merge_close(shuffle_sorter *s) {
  for (uint32_t i = 0; s->readers && i < s->num_readers; i++) {
    if (s->readers[i].fd >= 0) close(s->readers[i].fd);
    rdd_batch_free(&s->readers[i].chunk);
  }
  common_free(s->readers);
  common_free(s->heap);
  s->readers = NULL;
  s->heap = NULL;
  s->heap_len = s->num_readers = 0;
}

/* The next merged entry into cur_key/cur_val, equal keys combined when aggregating; false
 * at the end, or on failure with *st set. */
static bool merge_next(shuffle_sorter *s, uint32_t *part, fl_status *st) {
  if (s->heap_len == 0) return false;
  fl_bytes k, v;
  entry_read(s->readers[s->heap[0]].head.data, part, &k, &v);
  s->cur_key.len = s->cur_val.len = 0;
  if ((*st = fl_buf_append(&s->cur_key, k.data, k.len)) != FL_OK ||
      (*st = fl_buf_append(&s->cur_val, v.data, v.len)) != FL_OK || (*st = heap_pop_advance(s)) != FL_OK)
    return false;
  /* Equal keys from other runs: combine their combiners (they are adjacent in the merge). */
  const rdd_aggregator *a = s->cfg.agg;
  while (a && s->heap_len > 0) {
    uint32_t p2;
    entry_read(s->readers[s->heap[0]].head.data, &p2, &k, &v);
    if (p2 != *part || k.len != s->cur_key.len || (k.len && memcmp(k.data, s->cur_key.data, k.len) != 0)) break;
    s->scratch.len = 0;
    if ((*st = a->merge_combiners(fl_buf_bytes(&s->cur_val), v, &s->scratch, a->arg)) != FL_OK) {
      user_failed(s, (const void *)a->merge_combiners, "merge", *st);
      return false;
    }
    fl_buf t = s->cur_val;
    s->cur_val = s->scratch;
    s->scratch = t;
    if ((*st = heap_pop_advance(s)) != FL_OK) return false;
  }
  return true;
}

/* Merges every run into one new run (combining equal keys when aggregating). */
static fl_status compact(shuffle_sorter *s) {
  uint32_t old_runs = s->num_runs;
  fl_status st = merge_open(s);
  int fd = -1;
  const char *path;
  rdd_batch chunk = {FL_BUF_INIT, 0};
  fl_buf enc = FL_BUF_INIT, entry = FL_BUF_INIT;
  if (st == FL_OK) st = new_run(s, &fd, &path);
  uint32_t part;
  while (st == FL_OK && merge_next(s, &part, &st)) {
    uint32_t h[4] = {part, (uint32_t)s->cur_key.len, (uint32_t)s->cur_val.len, 0};
    entry.len = 0;
    if ((st = fl_buf_append(&entry, h, ENTRY_HEADER)) == FL_OK &&
        (st = fl_buf_append(&entry, s->cur_key.data, s->cur_key.len)) == FL_OK &&
        (st = fl_buf_append(&entry, s->cur_val.data, s->cur_val.len)) == FL_OK)
      st = run_append(fd, path, &chunk, &enc, entry.data, entry.len);
  }
  if (st == FL_OK && chunk.count > 0) st = write_chunk(fd, &chunk, &enc, path);
  if (fd >= 0 && close(fd) != 0 && st == FL_OK)
    st = FL_ERR(FL_EIO, "cannot write spill file %s: %s", path, strerror(errno));
  merge_close(s);
  rdd_batch_free(&chunk);
  fl_buf_free(&enc);
  fl_buf_free(&entry);
  if (st != FL_OK) return st;
  /* The merged run replaces the old ones. */
  for (uint32_t i = 0; i < old_runs; i++) {
    unlink(s->runs[i]);
    common_free(s->runs[i]);
  }
  s->runs[0] = s->runs[old_runs];
  s->num_runs = 1;
  return FL_OK;
}

fl_status shuffle_sorter_finish(shuffle_sorter *s) {
  fl_status st;
  if (s->compact) {
    if ((st = compact_flush(s)) != FL_OK) return st;
    s->compact = false;
  }
  if (s->num_runs == 0) {
    if (s->cfg.order_keys) {
      if (s->count > 1) qsort_r(s->offsets, s->count, sizeof *s->offsets, compare_offsets, s);
    } else if ((st = sort_by_partition(s)) != FL_OK) {
      return st;
    }
    s->phase = PHASE_MEMORY;
    s->pos = 0;
    return FL_OK;
  }
  if (s->count > 0 && (st = spill(s)) != FL_OK) return st;
  /* The entries are all on disk now: give their memory back before the merge. */
  fl_buf_free(&s->arena);
  common_free(s->table);
  s->table = NULL;
  s->table_cap = 0;
  if ((st = merge_open(s)) != FL_OK) return st;
  s->phase = PHASE_MERGE;
  return FL_OK;
}

bool shuffle_sorter_next(shuffle_sorter *s, uint32_t *part, fl_bytes *key, fl_bytes *value) {
  if (s->phase == PHASE_MEMORY) {
    if (s->pos >= s->count) return false;
    entry_read(s->arena.data + s->offsets[s->pos++], part, key, value);
    return true;
  }
  if (s->phase != PHASE_MERGE) return false;
  fl_status st = FL_OK;
  if (!merge_next(s, part, &st)) {
    if (st != FL_OK) {
      rdd_task_fail(s->cfg.task, st);
      s->heap_len = 0;
    }
    return false;
  }
  *key = fl_buf_bytes(&s->cur_key);
  *value = fl_buf_bytes(&s->cur_val);
  return true;
}

/* ---- lifetime -------------------------------------------------------------------------- */

fl_status shuffle_sorter_create(const shuffle_sorter_config *cfg, shuffle_sorter **out) {
  shuffle_sorter *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "cannot allocate a shuffle sorter");
  s->cfg = *cfg;
  if (s->cfg.memory < MIN_MEMORY) s->cfg.memory = MIN_MEMORY;
  /* Merging runs combines equal keys, which must then be adjacent. */
  s->runs_by_key = cfg->order_keys || cfg->agg;
  s->compact = cfg->agg != NULL;
  *out = s;
  return FL_OK;
}

uint32_t shuffle_sorter_spills(const shuffle_sorter *s) { return s->spills; }

void shuffle_sorter_destroy(shuffle_sorter *s) {
  if (!s) return;
  merge_close(s);
  for (uint32_t i = 0; i < s->num_runs; i++) {
    unlink(s->runs[i]);
    common_free(s->runs[i]);
  }
  common_free(s->runs);
  fl_buf_free(&s->arena);
  common_free(s->offsets);
  common_free(s->table);
  common_free(s->cslots);
  fl_buf_free(&s->scratch);
  fl_buf_free(&s->cur_key);
  fl_buf_free(&s->cur_val);
  common_free(s);
}
