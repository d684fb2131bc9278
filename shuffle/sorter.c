/*
 * sorter.c: an external sorter of (partition, key, value) entries with optional
 * aggregation, the one engine behind both sides of a shuffle (as Spark's ExternalSorter).
 *
 * Entries live in one arena: a 12-byte header (partition, key length, value length), the
 * key, the value. When aggregating, a hash table on (partition, key) finds the entry of a
 * key, and its combiner is replaced in place when the new one has the same length (numbers,
 * vectors: no garbage) or appended otherwise. Past the memory budget the entries are
 * sorted and written to disk as a run of LZ4-framed chunks; at the end the runs (and what
 * is still in memory) are merged through a heap, combining equal keys across runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "shuffle/shuffle.h"

#define ENTRY_HEADER 12
#define RUN_CHUNK (1u << 20) /* raw bytes of entries per encoded chunk of a run */

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
  uint64_t *table; /* agg: (hash tag << 32) | (entry index + 1); 0 is empty */
  size_t table_cap;
  fl_buf scratch;
  char **runs;
  uint32_t num_runs, cap_runs;
  /* iteration */
  enum { PHASE_INPUT, PHASE_MEMORY, PHASE_MERGE } phase;
  size_t pos;
  run_reader *readers;
  uint32_t *heap, heap_len;
  fl_buf cur_key, cur_val;
};

static atomic_uint_fast64_t run_counter;

/* ---- entries and order ----------------------------------------------------------------- */

static inline void entry_read(const uint8_t *p, uint32_t *part, fl_bytes *key, fl_bytes *value) {
  uint32_t h[3];
  memcpy(h, p, ENTRY_HEADER);
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
  if (!s->cfg.order_keys) return 0;
  int c = rdd_compare_keys(s->cfg.key_order, s->cfg.key_order_arg, ka, kb);
  return s->cfg.descending ? -c : c;
}

static int compare_offsets(const void *a, const void *b, void *ctx) {
  const shuffle_sorter *s = ctx;
  return compare_entries(s, s->arena.data + *(const uint64_t *)a, s->arena.data + *(const uint64_t *)b);
}

static uint64_t memory_used(const shuffle_sorter *s) {
  return s->arena.cap + s->cap * sizeof *s->offsets + s->table_cap * sizeof *s->table;
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
    size_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *grown = common_realloc(s->offsets, cap * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "shuffle: cannot grow the entry index");
    s->offsets = grown;
    s->cap = cap;
  }
  fl_status st = fl_buf_reserve(&s->arena, ENTRY_HEADER + key.len + value.len);
  if (st != FL_OK) return st;
  uint32_t h[3] = {part, (uint32_t)key.len, (uint32_t)value.len};
  *offset = s->arena.len;
  fl_buf_append(&s->arena, h, ENTRY_HEADER);
  fl_buf_append(&s->arena, key.data, key.len);
  fl_buf_append(&s->arena, value.data, value.len);
  s->offsets[s->count++] = *offset;
  return FL_OK;
}

static uint64_t entry_hash(uint32_t part, fl_bytes key) {
  return common_hash_bytes(key.data, key.len) ^ common_hash64(part);
}

static fl_status table_grow(shuffle_sorter *s) {
  size_t cap = s->table_cap ? s->table_cap * 2 : 4096;
  uint64_t *t = common_calloc(cap, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "shuffle: cannot grow the aggregation table");
  for (size_t i = 0; i < s->table_cap; i++) {
    uint64_t slot = s->table[i];
    if (!slot) continue;
    uint32_t part;
    fl_bytes k, v;
    entry_read(s->arena.data + s->offsets[(uint32_t)slot - 1], &part, &k, &v);
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

fl_status shuffle_sorter_insert(shuffle_sorter *s, uint32_t part, fl_bytes key, fl_bytes value) {
  fl_status st;
  uint64_t offset;
  const rdd_aggregator *a = s->cfg.agg;
  if (!a) {
    if ((st = append_entry(s, part, key, value, &offset)) != FL_OK) return st;
  } else {
    if (s->count * 2 >= s->table_cap && (st = table_grow(s)) != FL_OK) return st;
    uint64_t h = entry_hash(part, key);
    uint64_t tag = h >> 32;
    size_t i = h & (s->table_cap - 1);
    for (;;) {
      uint64_t slot = s->table[i];
      if (!slot) break;
      if ((slot >> 32) == tag) {
        uint64_t off = s->offsets[(uint32_t)slot - 1];
        uint32_t p;
        fl_bytes k, v;
        entry_read(s->arena.data + off, &p, &k, &v);
        if (p == part && k.len == key.len && memcmp(k.data, key.data, key.len) == 0) {
          fl_reduce_fn merge = s->cfg.values_are_combiners ? a->merge_combiners : a->merge_value;
          s->scratch.len = 0;
          if ((st = merge(v, value, &s->scratch, a->arg)) != FL_OK)
            return user_failed(s, (const void *)merge, "merge", st);
          if (s->scratch.len == v.len) {
            memcpy((uint8_t *)v.data, s->scratch.data, v.len);
          } else {
            /* Append a new entry; the key is copied first since the arena may move. */
            fl_buf keycopy = FL_BUF_INIT;
            if ((st = fl_buf_append(&keycopy, key.data, key.len)) != FL_OK) return st;
            st = append_entry(s, part, fl_buf_bytes(&keycopy), fl_buf_bytes(&s->scratch), &offset);
            fl_buf_free(&keycopy);
            if (st != FL_OK) return st;
            s->count--; /* the old entry's index is reused for the new bytes */
            s->offsets[(uint32_t)slot - 1] = offset;
          }
          goto maybe_spill;
        }
      }
      i = (i + 1) & (s->table_cap - 1);
    }
    fl_bytes combiner;
    if ((st = make_combiner(s, value, &combiner)) != FL_OK) return st;
    if ((st = append_entry(s, part, key, combiner, &offset)) != FL_OK) return st;
    s->table[i] = (tag << 32) | (uint64_t)s->count;
  }
maybe_spill:
  if (memory_used(s) > s->cfg.memory && s->count > 0) return spill(s);
  return FL_OK;
}

/* ---- runs ------------------------------------------------------------------------------ */

static fl_status write_all(int fd, const void *data, size_t len, const char *path) {
  const uint8_t *p = data;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return FL_ERR(FL_EIO, "cannot write spill file %s: %s", path, strerror(errno));
    p += n;
    len -= (size_t)n;
  }
  return FL_OK;
}

static fl_status write_chunk(int fd, rdd_batch *chunk, fl_buf *enc, const char *path) {
  fl_status st = rdd_batch_encode(chunk, enc);
  if (st != FL_OK) return st;
  uint64_t len = enc->len;
  if ((st = write_all(fd, &len, 8, path)) != FL_OK) return st;
  if ((st = write_all(fd, enc->data, enc->len, path)) != FL_OK) return st;
  chunk->buf.len = 0;
  chunk->count = 0;
  return FL_OK;
}

/* Sorts the entries in memory and writes them as a new run, then forgets them. */
static fl_status spill(shuffle_sorter *s) {
  qsort_r(s->offsets, s->count, sizeof *s->offsets, compare_offsets, s);
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
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    common_free(copy);
    return FL_ERR(FL_EIO, "cannot create spill file %s: %s", path, strerror(errno));
  }
  s->runs[s->num_runs++] = copy; /* from now on destroy deletes it */
  rdd_batch chunk = {FL_BUF_INIT, 0};
  fl_buf enc = FL_BUF_INIT;
  fl_status st = FL_OK;
  for (size_t i = 0; i < s->count && st == FL_OK; i++) {
    const uint8_t *e = s->arena.data + s->offsets[i];
    uint32_t h[3];
    memcpy(h, e, ENTRY_HEADER);
    st = rdd_batch_append(&chunk, e, ENTRY_HEADER + (size_t)h[1] + h[2]);
    if (st == FL_OK && chunk.buf.len >= RUN_CHUNK) st = write_chunk(fd, &chunk, &enc, path);
  }
  if (st == FL_OK && chunk.count > 0) st = write_chunk(fd, &chunk, &enc, path);
  if (close(fd) != 0 && st == FL_OK) st = FL_ERR(FL_EIO, "cannot write spill file %s: %s", path, strerror(errno));
  rdd_batch_free(&chunk);
  fl_buf_free(&enc);
  s->arena.len = 0;
  s->count = 0;
  if (s->table) memset(s->table, 0, s->table_cap * sizeof *s->table);
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

fl_status shuffle_sorter_finish(shuffle_sorter *s) {
  fl_status st;
  if (s->num_runs == 0) {
    qsort_r(s->offsets, s->count, sizeof *s->offsets, compare_offsets, s);
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
  s->readers = common_calloc(s->num_runs, sizeof *s->readers);
  s->heap = common_calloc(s->num_runs, sizeof *s->heap);
  if (!s->readers || !s->heap) return FL_ERR(FL_ENOMEM, "shuffle: cannot merge %u runs", s->num_runs);
  for (uint32_t i = 0; i < s->num_runs; i++) s->readers[i].fd = -1;
  for (uint32_t i = 0; i < s->num_runs; i++) {
    run_reader *r = &s->readers[i];
    r->path = s->runs[i];
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) return FL_ERR(FL_EIO, "cannot open spill file %s: %s", r->path, strerror(errno));
    st = FL_OK;
    if (run_advance(r, &st)) s->heap[s->heap_len++] = i;
    else if (st != FL_OK) return st;
  }
  for (uint32_t i = s->heap_len; i-- > 0;) heap_down(s, i);
  s->phase = PHASE_MERGE;
  return FL_OK;
}

bool shuffle_sorter_next(shuffle_sorter *s, uint32_t *part, fl_bytes *key, fl_bytes *value) {
  if (s->phase == PHASE_MEMORY) {
    if (s->pos >= s->count) return false;
    entry_read(s->arena.data + s->offsets[s->pos++], part, key, value);
    return true;
  }
  if (s->phase != PHASE_MERGE || s->heap_len == 0) return false;
  fl_status st;
  fl_bytes k, v;
  entry_read(s->readers[s->heap[0]].head.data, part, &k, &v);
  s->cur_key.len = s->cur_val.len = 0;
  if ((st = fl_buf_append(&s->cur_key, k.data, k.len)) != FL_OK ||
      (st = fl_buf_append(&s->cur_val, v.data, v.len)) != FL_OK || (st = heap_pop_advance(s)) != FL_OK)
    goto failed;
  /* Equal keys from other runs: combine their combiners (they are adjacent in the merge). */
  const rdd_aggregator *a = s->cfg.agg;
  while (a && s->heap_len > 0) {
    uint32_t p2;
    entry_read(s->readers[s->heap[0]].head.data, &p2, &k, &v);
    if (p2 != *part || k.len != s->cur_key.len || memcmp(k.data, s->cur_key.data, k.len) != 0) break;
    s->scratch.len = 0;
    if ((st = a->merge_combiners(fl_buf_bytes(&s->cur_val), v, &s->scratch, a->arg)) != FL_OK) {
      user_failed(s, (const void *)a->merge_combiners, "merge", st);
      goto failed;
    }
    fl_buf t = s->cur_val;
    s->cur_val = s->scratch;
    s->scratch = t;
    if ((st = heap_pop_advance(s)) != FL_OK) goto failed;
  }
  *key = fl_buf_bytes(&s->cur_key);
  *value = fl_buf_bytes(&s->cur_val);
  return true;
failed:
  rdd_task_fail(s->cfg.task, st);
  s->heap_len = 0;
  return false;
}

/* ---- lifetime -------------------------------------------------------------------------- */

fl_status shuffle_sorter_create(const shuffle_sorter_config *cfg, shuffle_sorter **out) {
  shuffle_sorter *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "cannot allocate a shuffle sorter");
  s->cfg = *cfg;
  if (s->cfg.agg) s->cfg.order_keys = true; /* merging runs combines adjacent equal keys */
  *out = s;
  return FL_OK;
}

uint32_t shuffle_sorter_spills(const shuffle_sorter *s) { return s->num_runs; }

void shuffle_sorter_destroy(shuffle_sorter *s) {
  if (!s) return;
  for (uint32_t i = 0; i < s->num_runs; i++) {
    if (s->readers) {
      if (s->readers[i].fd >= 0) close(s->readers[i].fd);
      rdd_batch_free(&s->readers[i].chunk);
    }
    unlink(s->runs[i]);
    common_free(s->runs[i]);
  }
  common_free(s->runs);
  common_free(s->readers);
  common_free(s->heap);
  fl_buf_free(&s->arena);
  common_free(s->offsets);
  common_free(s->table);
  fl_buf_free(&s->scratch);
  fl_buf_free(&s->cur_key);
  fl_buf_free(&s->cur_val);
  common_free(s);
}
