/*
 * ps/shard.c: one shard of a parameter-server table (ps/ps.h): its rows, the update functions
 * applied to pushed gradients, and its state as a checked blob.
 *
 * Layout: row r holds `width` values, then the update's state for them (Adagrad: one
 * accumulator a value; Adam: m and v), and for Adam a step count. A dense shard's rows are
 * its key range, made at once; a sparse shard's rows are made by the first push or set of a
 * key and found through an open-addressing index (linear probing over a power-of-two table
 * of row + 1, 0 meaning empty), kept at most half full.
 *
 * The blob (little-endian, the host order on every platform flint supports):
 *   off size
 *     0    8  magic "FLNTPSHD"
 *     8    4  version (1)
 *    12    4  header bytes (72)
 *    16    4  flags: bit 0 sparse
 *    20    4  width
 *    24    8  keys (dense) or 0
 *    32    4  update kind, then lr, beta1, beta2, eps as f32 (36, 40, 44, 48)
 *    52    4  shards
 *    56    4  this shard's index
 *    60    4  reserved, 0
 *    64    8  rows
 *    72       per row: its key (u64, sparse only), the values, the state (f32), the step
 *             (u32, Adam only)
 *   end-4  4  CRC-32C of every byte before it
 */
#include <math.h>
#include <string.h>

#include "ps/ps.h"

#define MAGIC "FLNTPSHD"
#define VERSION 1u
#define HEADER_BYTES 72u

struct ps_shard {
  ps_table_spec spec;
  uint32_t shards, index;
  uint64_t lo, hi;       /* dense: the key range */
  uint32_t slots;        /* state floats a value: adagrad 1, adam 2 */
  uint64_t rows, cap;    /* rows in use and allocated (dense: both hi - lo) */
  float *values;         /* cap x width */
  float *state;          /* cap x width x slots, or NULL */
  uint32_t *steps;       /* adam: a step count a row, or NULL */
  uint64_t *row_keys;    /* sparse: each row's key */
  uint64_t *slot_of;     /* sparse: the index, row + 1 (0: empty) */
  uint64_t index_cap;    /* a power of two */
};

static uint32_t slots_of(ps_update_kind k) { return k == PS_UPDATE_ADAGRAD ? 1 : k == PS_UPDATE_ADAM ? 2 : 0; }

const ps_table_spec *ps_shard_spec(const ps_shard *s) { return &s->spec; }
uint64_t ps_shard_size(const ps_shard *s) { return s->rows; }

void ps_shard_destroy(ps_shard *s) {
  if (!s) return;
  common_free(s->values);
  common_free(s->state);
  common_free(s->steps);
  common_free(s->row_keys);
  common_free(s->slot_of);
  common_free(s);
}

/* Makes room for `cap` rows (sparse growth; dense at creation). Nothing changes on failure. */
static fl_status rows_reserve(ps_shard *s, uint64_t cap) {
  if (cap <= s->cap) return FL_OK;
  size_t w = s->spec.width;
  if (cap > (SIZE_MAX / sizeof(float)) / (w * (s->slots + 1)))
    return fl_set_error(FL_ENOMEM, "parameter server shard: %llu rows of %zu floats do not fit in memory",
                        (unsigned long long)cap, w);
  float *values = common_realloc(s->values, cap * w * sizeof(float));
  if (!values) return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory for %llu rows", (unsigned long long)cap);
  s->values = values;
  if (s->slots) {
    float *state = common_realloc(s->state, cap * w * s->slots * sizeof(float));
    if (!state) return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory for %llu rows", (unsigned long long)cap);
    s->state = state;
  }
  if (s->spec.update.kind == PS_UPDATE_ADAM) {
    uint32_t *steps = common_realloc(s->steps, cap * sizeof(uint32_t));
    if (!steps) return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory for %llu rows", (unsigned long long)cap);
    s->steps = steps;
  }
  if (s->spec.sparse) {
    uint64_t *keys = common_realloc(s->row_keys, cap * sizeof(uint64_t));
    if (!keys) return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory for %llu rows", (unsigned long long)cap);
    s->row_keys = keys;
  }
  /* New rows start at zero: values, state and steps alike. */
  memset(s->values + s->cap * w, 0, (cap - s->cap) * w * sizeof(float));
  if (s->slots) memset(s->state + s->cap * w * s->slots, 0, (cap - s->cap) * w * s->slots * sizeof(float));
  if (s->steps) memset(s->steps + s->cap, 0, (cap - s->cap) * sizeof(uint32_t));
  s->cap = cap;
  return FL_OK;
}

/* Sparse: the index slot of key, or of the empty slot where it would go. */
static uint64_t probe(const ps_shard *s, uint64_t key) {
  uint64_t mask = s->index_cap - 1, i = common_hash64(key ^ 0x9e3779b97f4a7c15ull) & mask;
  while (s->slot_of[i] && s->row_keys[s->slot_of[i] - 1] != key) i = (i + 1) & mask;
  return i;
}

/* Sparse: an index of at least twice `rows` slots. */
static fl_status index_reserve(ps_shard *s, uint64_t rows) {
  uint64_t want = 16;
  while (want < 2 * rows) want *= 2;
  if (want <= s->index_cap) return FL_OK;
  uint64_t *old = s->slot_of, old_cap = s->index_cap;
  s->slot_of = common_calloc(want, sizeof(uint64_t));
  if (!s->slot_of) {
    s->slot_of = old;
    return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory for an index of %llu keys",
                        (unsigned long long)rows);
  }
  s->index_cap = want;
  for (uint64_t i = 0; i < old_cap; i++)
    if (old[i]) s->slot_of[probe(s, s->row_keys[old[i] - 1])] = old[i];
  common_free(old);
  return FL_OK;
}

fl_status ps_shard_create(const ps_table_spec *spec, uint32_t shards, uint32_t index, ps_shard **out) {
  fl_status st = ps_table_spec_check(spec);
  if (st != FL_OK) return st;
  if (shards < 1 || index >= shards)
    return fl_set_error(FL_EINVAL, "parameter server shard: shard %u of %u", index, shards);
  if (!spec->sparse && spec->keys < shards)
    return fl_set_error(FL_EINVAL, "parameter server table: %llu keys over %u shards (a shard would be empty)",
                        (unsigned long long)spec->keys, shards);
  ps_shard *s = common_calloc(1, sizeof *s);
  if (!s) return fl_set_error(FL_ENOMEM, "parameter server shard: out of memory");
  s->spec = *spec;
  s->shards = shards;
  s->index = index;
  s->slots = slots_of(spec->update.kind);
  if (!spec->sparse) {
    s->lo = ps_range_lo(spec, shards, index);
    s->hi = ps_range_lo(spec, shards, index + 1);
    st = rows_reserve(s, s->hi - s->lo);
    s->rows = s->hi - s->lo;
  } else {
    st = index_reserve(s, 8);
  }
  if (st != FL_OK) {
    ps_shard_destroy(s);
    return st;
  }
  *out = s;
  return FL_OK;
}

/* FL_EINVAL naming the first key that is not this shard's. */
static fl_status check_keys(const ps_shard *s, const uint64_t *keys, size_t n, const char *op) {
  for (size_t i = 0; i < n; i++) {
    uint64_t k = keys[i];
    if (!s->spec.sparse && (k < s->lo || k >= s->hi))
      return fl_set_error(FL_EINVAL, "parameter server %s: key %llu (item %zu) is %s", op, (unsigned long long)k, i,
                          k >= s->spec.keys ? "outside the table" : "another shard's");
    if (s->spec.sparse && ps_shard_of(&s->spec, s->shards, k) != s->index)
      return fl_set_error(FL_EINVAL, "parameter server %s: key %llu (item %zu) is shard %u's, not %u's", op,
                          (unsigned long long)k, i, ps_shard_of(&s->spec, s->shards, k), s->index);
  }
  return FL_OK;
}

/* The row of key, made when `make` (room reserved by the caller); UINT64_MAX when absent. */
static uint64_t row_of(ps_shard *s, uint64_t key, bool make) {
  if (!s->spec.sparse) return key - s->lo;
  uint64_t i = probe(s, key);
  if (s->slot_of[i]) return s->slot_of[i] - 1;
  if (!make) return UINT64_MAX;
  uint64_t r = s->rows++;
  s->row_keys[r] = key;
  s->slot_of[i] = r + 1;
  return r;
}

/* Room for the keys that are new (a new key repeated in the batch counts each time: at most
 * n), so that nothing fails once a push or set starts changing rows. */
static fl_status reserve_for(ps_shard *s, const uint64_t *keys, size_t n) {
  if (!s->spec.sparse || n == 0) return FL_OK;
  uint64_t fresh = 0;
  for (size_t i = 0; i < n; i++) fresh += row_of(s, keys[i], false) == UINT64_MAX;
  if (fresh == 0) return FL_OK;
  uint64_t need = s->rows + fresh, cap = s->cap ? s->cap : 16;
  while (cap < need) cap *= 2;
  fl_status st = rows_reserve(s, cap);
  if (st == FL_OK) st = index_reserve(s, need);
  return st;
}

/* Room for `rows` more sparse rows, whatever their keys (a blob being decoded). */
static fl_status reserve_rows(ps_shard *s, uint64_t rows) {
  if (!s->spec.sparse || rows == 0) return FL_OK;
  uint64_t cap = s->cap ? s->cap : 16;
  while (cap < s->rows + rows) cap *= 2;
  fl_status st = rows_reserve(s, cap);
  if (st == FL_OK) st = index_reserve(s, s->rows + rows);
  return st;
}

static void update_row(const ps_update *u, size_t w, float *x, float *st, uint32_t *step, const float *g) {
  switch (u->kind) {
  case PS_UPDATE_ADD:
    for (size_t j = 0; j < w; j++) x[j] += g[j];
    break;
  case PS_UPDATE_SGD:
    for (size_t j = 0; j < w; j++) x[j] -= u->lr * g[j];
    break;
  case PS_UPDATE_ADAGRAD:
    for (size_t j = 0; j < w; j++) {
      st[j] += g[j] * g[j];
      x[j] -= u->lr * g[j] / (sqrtf(st[j]) + u->eps);
    }
    break;
  case PS_UPDATE_ADAM: {
    uint32_t t = *step < UINT32_MAX ? ++*step : *step; /* by then beta^t is 0 anyway */
    float bias1 = (float)(1.0 - pow(u->beta1, t)), bias2 = (float)(1.0 - pow(u->beta2, t));
    float *m = st, *v = st + w;
    for (size_t j = 0; j < w; j++) {
      m[j] = u->beta1 * m[j] + (1 - u->beta1) * g[j];
      v[j] = u->beta2 * v[j] + (1 - u->beta2) * g[j] * g[j];
      x[j] -= u->lr * (m[j] / bias1) / (sqrtf(v[j] / bias2) + u->eps);
    }
    break;
  }
  }
}

fl_status ps_shard_push(ps_shard *s, const uint64_t *keys, size_t n, const float *grads) {
  if (!s || (n && (!keys || !grads))) return fl_set_error(FL_EINVAL, "parameter server push: NULL argument");
  fl_status st = check_keys(s, keys, n, "push");
  if (st == FL_OK) st = reserve_for(s, keys, n);
  if (st != FL_OK) return st;
  size_t w = s->spec.width;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = row_of(s, keys[i], true);
    update_row(&s->spec.update, w, s->values + r * w, s->slots ? s->state + r * w * s->slots : NULL,
               s->steps ? s->steps + r : NULL, grads + i * w);
  }
  return FL_OK;
}

fl_status ps_shard_pull(const ps_shard *s, const uint64_t *keys, size_t n, float *out) {
  if (!s || (n && (!keys || !out))) return fl_set_error(FL_EINVAL, "parameter server pull: NULL argument");
  fl_status st = check_keys(s, keys, n, "pull");
  if (st != FL_OK) return st;
  size_t w = s->spec.width;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = row_of((ps_shard *)s, keys[i], false); /* make false: nothing is written */
    if (r == UINT64_MAX) memset(out + i * w, 0, w * sizeof(float));
    else memcpy(out + i * w, s->values + r * w, w * sizeof(float));
  }
  return FL_OK;
}

fl_status ps_shard_set(ps_shard *s, const uint64_t *keys, size_t n, const float *values) {
  if (!s || (n && (!keys || !values))) return fl_set_error(FL_EINVAL, "parameter server set: NULL argument");
  fl_status st = check_keys(s, keys, n, "set");
  if (st == FL_OK) st = reserve_for(s, keys, n);
  if (st != FL_OK) return st;
  size_t w = s->spec.width;
  for (size_t i = 0; i < n; i++) memcpy(s->values + row_of(s, keys[i], true) * w, values + i * w, w * sizeof(float));
  return FL_OK;
}

/* ---- dense ranges: the same arithmetic in one pass, with no key array ---- */

static fl_status check_range(const ps_shard *s, uint64_t lo, uint64_t count, const char *op) {
  if (s->spec.sparse) return fl_set_error(FL_EINVAL, "parameter server %s: a key range of a sparse table", op);
  if (count > s->hi - s->lo || lo < s->lo || lo - s->lo > s->hi - s->lo - count)
    return fl_set_error(FL_EINVAL, "parameter server %s: keys [%llu, %llu) are not within this shard's [%llu, %llu)",
                        op, (unsigned long long)lo, (unsigned long long)(lo + count), (unsigned long long)s->lo,
                        (unsigned long long)s->hi);
  return FL_OK;
}

fl_status ps_shard_push_range(ps_shard *s, uint64_t lo, uint64_t count, const float *grads) {
  if (!s || (count && !grads)) return fl_set_error(FL_EINVAL, "parameter server push: NULL argument");
  fl_status st = check_range(s, lo, count, "push");
  if (st != FL_OK || count == 0) return st;
  size_t w = s->spec.width, r0 = lo - s->lo;
  float *state = s->slots ? s->state + r0 * w * s->slots : NULL;
  if (s->spec.update.kind != PS_UPDATE_ADAM) { /* elementwise: the range is one long row */
    update_row(&s->spec.update, count * w, s->values + r0 * w, state, NULL, grads);
    return FL_OK;
  }
  for (uint64_t i = 0; i < count; i++) /* Adam counts its steps per key */
    update_row(&s->spec.update, w, s->values + (r0 + i) * w, state + i * w * s->slots, s->steps + r0 + i, grads + i * w);
  return FL_OK;
}

fl_status ps_shard_pull_range(const ps_shard *s, uint64_t lo, uint64_t count, float *out) {
  if (!s || (count && !out)) return fl_set_error(FL_EINVAL, "parameter server pull: NULL argument");
  fl_status st = check_range(s, lo, count, "pull");
  if (st == FL_OK && count) memcpy(out, s->values + (lo - s->lo) * s->spec.width, count * s->spec.width * sizeof(float));
  return st;
}

fl_status ps_shard_set_range(ps_shard *s, uint64_t lo, uint64_t count, const float *values) {
  if (!s || (count && !values)) return fl_set_error(FL_EINVAL, "parameter server set: NULL argument");
  fl_status st = check_range(s, lo, count, "set");
  if (st == FL_OK && count) memcpy(s->values + (lo - s->lo) * s->spec.width, values, count * s->spec.width * sizeof(float));
  return st;
}

/* ---- columns ------------------------------------------------------------------------------ */

static const char *const column_names[] = {"?", "push", "set", "pull", "dot", "axpy", "scale", "copy", "fill"};

const char *ps_column_name(ps_column_kind kind) {
  return kind >= 1 && kind <= PS_COLUMN_LAST ? column_names[kind] : "?";
}

bool ps_column_mutates(ps_column_kind kind) { return kind != PS_COLUMN_PULL && kind != PS_COLUMN_DOT; }

fl_status ps_column_check(const ps_table_spec *spec, const ps_column_op *op) {
  if (op->kind < 1 || op->kind > PS_COLUMN_LAST)
    return fl_set_error(FL_EINVAL, "parameter server: unknown column operation %d", (int)op->kind);
  const char *name = ps_column_name(op->kind);
  if (spec->sparse) return fl_set_error(FL_EINVAL, "parameter server column %s: the table is sparse; columns are for dense tables", name);
  bool reads = op->kind == PS_COLUMN_PULL || op->kind == PS_COLUMN_DOT || op->kind == PS_COLUMN_AXPY ||
               op->kind == PS_COLUMN_COPY;
  bool writes = op->kind != PS_COLUMN_PULL;
  if (reads && op->x >= spec->width)
    return fl_set_error(FL_EINVAL, "parameter server column %s: column %u of a table of %u columns", name, op->x,
                        spec->width);
  if (writes && op->y >= spec->width)
    return fl_set_error(FL_EINVAL, "parameter server column %s: column %u of a table of %u columns", name, op->y,
                        spec->width);
  if (op->kind == PS_COLUMN_PUSH && spec->update.kind != PS_UPDATE_ADD)
    return fl_set_error(FL_EINVAL, "parameter server column push: the table's update is %s; a column push adds, "
                        "so it needs an add table", ps_update_name(spec->update.kind));
  if (!isfinite(op->alpha))
    return fl_set_error(FL_EINVAL, "parameter server column %s: alpha is not finite", name);
  return FL_OK;
}

fl_status ps_shard_column(ps_shard *s, const ps_column_op *op, const float *in, float *out, double *dot) {
  fl_status st = ps_column_check(&s->spec, op);
  if (st != FL_OK) return st;
  if (op->count > s->hi - s->lo || op->lo < s->lo || op->lo - s->lo > s->hi - s->lo - op->count)
    return fl_set_error(FL_EINVAL, "parameter server column %s: keys [%llu, %llu) are not inside shard %u's [%llu, %llu)",
                        ps_column_name(op->kind), (unsigned long long)op->lo,
                        (unsigned long long)(op->lo + op->count), s->index, (unsigned long long)s->lo,
                        (unsigned long long)s->hi);
  if (op->count && (((op->kind == PS_COLUMN_PUSH || op->kind == PS_COLUMN_SET) && !in) ||
                    (op->kind == PS_COLUMN_PULL && !out) || (op->kind == PS_COLUMN_DOT && !dot)))
    return fl_set_error(FL_EINVAL, "parameter server column %s: NULL argument", ps_column_name(op->kind));
  const size_t w = s->spec.width;
  /* the columns the kind does not use may hold anything: point them at one that it does */
  bool reads = op->kind == PS_COLUMN_PULL || op->kind == PS_COLUMN_DOT || op->kind == PS_COLUMN_AXPY ||
               op->kind == PS_COLUMN_COPY;
  uint32_t xc = reads ? op->x : op->y, yc = op->kind == PS_COLUMN_PULL ? op->x : op->y;
  float *xv = s->values + (op->lo - s->lo) * w + xc, *yv = s->values + (op->lo - s->lo) * w + yc;
  const double a = op->alpha;
  double sum = 0;
  for (uint64_t i = 0; i < op->count; i++) {
    float *x = xv + i * w, *y = yv + i * w;
    switch (op->kind) {
    case PS_COLUMN_PUSH: *y = (float)((double)*y + in[i]); break;
    case PS_COLUMN_SET: *y = in[i]; break;
    case PS_COLUMN_PULL: out[i] = *x; break;
    case PS_COLUMN_DOT: sum += (double)*x * *y; break;
    case PS_COLUMN_AXPY: *y = (float)((double)*y + a * *x); break;
    case PS_COLUMN_SCALE: *y = (float)(a * *y); break;
    case PS_COLUMN_COPY: *y = *x; break;
    case PS_COLUMN_FILL: *y = (float)a; break;
    }
  }
  if (op->kind == PS_COLUMN_DOT) *dot = sum;
  return FL_OK;
}

/* ---- the blob ----------------------------------------------------------------------------- */

static size_t row_bytes(const ps_shard *s) {
  size_t w = s->spec.width;
  return (s->spec.sparse ? 8 : 0) + w * (1 + s->slots) * sizeof(float) + (s->spec.update.kind == PS_UPDATE_ADAM ? 4 : 0);
}

fl_status ps_shard_encode(const ps_shard *s, fl_buf *out) {
  size_t rb = row_bytes(s), w = s->spec.width;
  size_t total = HEADER_BYTES + s->rows * rb + 4;
  out->len = 0;
  fl_status st = fl_buf_reserve(out, total);
  if (st != FL_OK) return st;
  uint8_t *p = out->data;
  memset(p, 0, HEADER_BYTES);
  memcpy(p, MAGIC, 8);
  common_put_u32(p + 8, VERSION);
  common_put_u32(p + 12, HEADER_BYTES);
  common_put_u32(p + 16, s->spec.sparse ? 1u : 0u);
  common_put_u32(p + 20, s->spec.width);
  common_put_u64(p + 24, s->spec.keys);
  ps_update_put(p + 32, &s->spec.update);
  common_put_u32(p + 52, s->shards);
  common_put_u32(p + 56, s->index);
  common_put_u64(p + 64, s->rows);
  uint8_t *q = p + HEADER_BYTES;
  for (uint64_t r = 0; r < s->rows; r++) {
    if (s->spec.sparse) common_put_u64(q, s->row_keys[r]), q += 8;
    memcpy(q, s->values + r * w, w * sizeof(float)), q += w * sizeof(float);
    if (s->slots) memcpy(q, s->state + r * w * s->slots, w * s->slots * sizeof(float)), q += w * s->slots * sizeof(float);
    if (s->steps) common_put_u32(q, s->steps[r]), q += 4;
  }
  common_put_u32(q, common_crc32c(0, p, (size_t)(q - p)));
  out->len = total;
  return FL_OK;
}

fl_status ps_shard_decode(ps_shard *s, fl_bytes blob) {
  if (!s) return fl_set_error(FL_EINVAL, "parameter server shard: NULL");
  const uint8_t *p = blob.data;
  if (blob.len < 8 || memcmp(p, MAGIC, 8) != 0)
    return fl_set_error(FL_EFORMAT, "parameter server shard blob: no \"%s\" magic in %zu bytes", MAGIC, blob.len);
  if (blob.len < HEADER_BYTES + 4)
    return fl_set_error(FL_EFORMAT, "parameter server shard blob: truncated: %zu bytes", blob.len);
  if (common_get_u32(p + 8) != VERSION || common_get_u32(p + 12) != HEADER_BYTES)
    return fl_set_error(FL_EFORMAT, "parameter server shard blob: version %u with a %u-byte header (this flint: %u, %u)",
                        common_get_u32(p + 8), common_get_u32(p + 12), VERSION, HEADER_BYTES);
  ps_table_spec spec = {.sparse = common_get_u32(p + 16) & 1, .width = common_get_u32(p + 20), .keys = common_get_u64(p + 24)};
  ps_update_get(p + 32, &spec.update);
  uint32_t shards = common_get_u32(p + 52), index = common_get_u32(p + 56);
  if (spec.sparse != s->spec.sparse || spec.width != s->spec.width || spec.keys != s->spec.keys ||
      spec.update.kind != s->spec.update.kind || memcmp(&spec.update.lr, &s->spec.update.lr, 4) ||
      memcmp(&spec.update.beta1, &s->spec.update.beta1, 4) || memcmp(&spec.update.beta2, &s->spec.update.beta2, 4) ||
      memcmp(&spec.update.eps, &s->spec.update.eps, 4) || shards != s->shards || index != s->index)
    return fl_set_error(FL_EINVAL, "parameter server shard blob: of shard %u of %u of a %s table of width %u (%s), "
                        "not this shard %u of %u of a %s table of width %u (%s)", index, shards,
                        spec.sparse ? "sparse" : "dense", spec.width, ps_update_name(spec.update.kind), s->index,
                        s->shards, s->spec.sparse ? "sparse" : "dense", s->spec.width,
                        ps_update_name(s->spec.update.kind));
  uint64_t rows = common_get_u64(p + 64);
  size_t rb = row_bytes(s);
  if (rows > (blob.len - HEADER_BYTES - 4) / rb || blob.len != HEADER_BYTES + rows * rb + 4)
    return fl_set_error(FL_EFORMAT, "parameter server shard blob: %zu bytes do not hold its %llu rows of %zu bytes",
                        blob.len, (unsigned long long)rows, rb);
  uint32_t stored = common_get_u32(p + blob.len - 4), actual = common_crc32c(0, p, blob.len - 4);
  if (stored != actual)
    return fl_set_error(FL_ECORRUPT, "parameter server shard blob: checksum mismatch (stored %08x, computed %08x)",
                        stored, actual);
  if (!spec.sparse && rows != s->hi - s->lo)
    return fl_set_error(FL_EFORMAT, "parameter server shard blob: %llu rows for a range of %llu keys",
                        (unsigned long long)rows, (unsigned long long)(s->hi - s->lo));
  /* Into a fresh shard, swapped in only once every row is in. */
  ps_shard *fresh = NULL;
  fl_status st = ps_shard_create(&s->spec, s->shards, s->index, &fresh);
  if (st == FL_OK) st = reserve_rows(fresh, rows);
  size_t w = s->spec.width;
  const uint8_t *q = p + HEADER_BYTES;
  for (uint64_t i = 0; st == FL_OK && i < rows; i++) {
    uint64_t r = i;
    if (spec.sparse) {
      uint64_t key = common_get_u64(q);
      q += 8;
      st = check_keys(fresh, &key, 1, "shard blob");
      if (st == FL_OK && row_of(fresh, key, false) != UINT64_MAX)
        st = fl_set_error(FL_EFORMAT, "parameter server shard blob: key %llu twice", (unsigned long long)key);
      if (st != FL_OK) break;
      r = row_of(fresh, key, true);
    }
    memcpy(fresh->values + r * w, q, w * sizeof(float)), q += w * sizeof(float);
    if (fresh->slots)
      memcpy(fresh->state + r * w * fresh->slots, q, w * fresh->slots * sizeof(float)), q += w * fresh->slots * sizeof(float);
    if (fresh->steps) fresh->steps[r] = common_get_u32(q), q += 4;
  }
  if (st != FL_OK) {
    ps_shard_destroy(fresh);
    return st;
  }
  ps_shard old = *s;
  *s = *fresh;
  *fresh = old;
  ps_shard_destroy(fresh);
  return FL_OK;
}
