/*
 * plan.c: lineage and actions as bytes (proto/plan.proto), so that a client can send the
 * datasets it built to a driver, and the driver the parts it schedules to executors.
 *
 * Design. A plan is a protobuf Plan: a repeated bytes field of encoded PlanNode messages,
 * parents first. Each node travels as its own bytes so that a receiver keeps them with the
 * dataset it decoded (rdd->plan_node) and can send them on unchanged without resolving their
 * functions (the driver never loads user libraries). Since a Plan is one repeated field,
 * two encodings appended are one plan with the nodes of both.
 *
 * Functions travel as (library id, symbol), found with dladdr() and named by the caller's
 * codec, or as the stable name of one of flint's own functions (rdd_builtin tables of each
 * module), which are hidden and need no shipping.
 *
 * Decoding trusts nothing: every count, id, partition number, length and name is checked
 * before a dataset is made, and a bad plan is FL_EPROTO naming the node and what is wrong.
 * A call that fails removes the datasets it had made, so the plan is as it was.
 *
 * The plan holds one reference to each dataset it decoded. A released dataset stays while a
 * held one depends on it (rdd_plan_release sweeps the rest), so that rdd_plan_find and
 * rdd_plan_find_shuffle answer for every dataset a held one may still run.
 *
 * Layering: the shuffled operation and flint's pair helpers live in shuffle/, one layer
 * up; this file includes shuffle/shuffle.h for their state and builtin table.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "proto/plan.pb-c.h"
#include "rdd/op_state.h"
#include "shuffle/shuffle.h"

#define MAX_NAME 1024 /* longest library id or symbol */

/* ---- protobuf-c through flint's allocator ------------------------------------------------ */

/* protobuf-c answers NULL both for bad input and for no memory: this tells them apart. */
static _Thread_local bool pb_out_of_memory;

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  void *p = common_malloc(size ? size : 1);
  if (!p) pb_out_of_memory = true;
  return p;
}
static void pb_free(void *data, void *p) {
  (void)data;
  common_free(p);
}
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

/* The status of an unpack that returned NULL, with its message. */
static fl_status unpack_failed(const char *what, size_t len) {
  if (pb_out_of_memory) return FL_ERR(FL_ENOMEM, "out of memory decoding %s (%zu bytes)", what, len);
  return fl_set_error(FL_EPROTO, "bad plan: %s (%zu bytes) is not well-formed", what, len);
}

/* ---- an id -> index map (open addressing; rebuilt rather than deleted from) --------------- */

typedef struct id_map {
  uint64_t *keys; /* 0: empty (ids start at 1) */
  uint32_t *values;
  size_t cap, count;
} id_map;

static void id_map_free(id_map *m) {
  common_free(m->keys);
  common_free(m->values);
  memset(m, 0, sizeof *m);
}

static void id_map_clear(id_map *m) {
  if (m->keys) memset(m->keys, 0, m->cap * sizeof *m->keys);
  m->count = 0;
}

static bool id_map_get(const id_map *m, uint64_t key, uint32_t *value) {
  if (!m->cap || key == 0) return false;
  for (size_t i = common_hash64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (m->keys[i] == 0) return false;
    if (m->keys[i] == key) {
      if (value) *value = m->values[i];
      return true;
    }
  }
}

static fl_status id_map_put(id_map *m, uint64_t key, uint32_t value) {
  FL_ASSERT(key != 0);
  if ((m->count + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    id_map grown = {common_calloc(cap, sizeof(uint64_t)), common_malloc(cap * sizeof(uint32_t)), cap, 0};
    if (!grown.keys || !grown.values) {
      id_map_free(&grown);
      return FL_ERR(FL_ENOMEM, "cannot grow a plan index to %zu slots", cap);
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) id_map_put(&grown, m->keys[i], m->values[i]);
    id_map_free(m);
    *m = grown;
  }
  size_t i = common_hash64(key) & (m->cap - 1);
  while (m->keys[i] != 0 && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
  if (m->keys[i] == 0) m->count++;
  m->keys[i] = key;
  m->values[i] = value;
  return FL_OK;
}

/* ---- builtins ------------------------------------------------------------------------------ */

typedef struct builtin_table {
  const rdd_builtin *entries;
  const size_t *count;
} builtin_table;

/* Every module's table. A module with new functions of its own adds its table here. */
static const builtin_table builtin_tables[] = {
    {rdd_partitioner_builtins, &rdd_partitioner_num_builtins},
    {shuffle_builtins, &shuffle_num_builtins},
};

static const rdd_builtin *builtin_by_fn(void (*fn)(void)) {
  for (size_t t = 0; t < sizeof builtin_tables / sizeof *builtin_tables; t++)
    for (size_t i = 0; i < *builtin_tables[t].count; i++)
      if (builtin_tables[t].entries[i].fn == fn) return &builtin_tables[t].entries[i];
  return NULL;
}

static const rdd_builtin *builtin_by_name(const char *name) {
  for (size_t t = 0; t < sizeof builtin_tables / sizeof *builtin_tables; t++)
    for (size_t i = 0; i < *builtin_tables[t].count; i++)
      if (strcmp(builtin_tables[t].entries[i].name, name) == 0) return &builtin_tables[t].entries[i];
  return NULL;
}

/* What unresolved functions point to on the driver, which never runs user code. */
static void plan_unresolved_fn(void) {
  common_assert_failed(__FILE__, __LINE__, "a function of a plan decoded without a resolver was called");
}

/* ---- the main program's address range ------------------------------------------------------- */

static uintptr_t main_lo, main_hi;
static pthread_once_t main_once = PTHREAD_ONCE_INIT;

/* The first object dl_iterate_phdr reports is the main program. */
static int main_range_cb(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size, (void)data;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
    if (a < lo) lo = a;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (lo < hi) {
    main_lo = lo;
    main_hi = hi;
  }
  return 1;
}

static void main_range_init(void) { dl_iterate_phdr(main_range_cb, NULL); }

static bool in_main_program(const void *addr) {
  pthread_once(&main_once, main_range_init);
  return (uintptr_t)addr >= main_lo && (uintptr_t)addr < main_hi;
}

/* ---- encoding ----------------------------------------------------------------------------- */

/* What one node's encoding allocated (its message parts and strings), freed after packing. */
typedef struct enc {
  const rdd_fn_codec *codec;
  uint64_t id; /* the dataset, for messages; 0 for an action */
  void **allocs;
  size_t num_allocs, cap_allocs;
} enc;

static void *enc_alloc(enc *e, size_t size) {
  if (e->num_allocs == e->cap_allocs) {
    size_t cap = e->cap_allocs ? e->cap_allocs * 2 : 16;
    void **grown = common_realloc(e->allocs, cap * sizeof *grown);
    if (!grown) return NULL;
    e->allocs = grown;
    e->cap_allocs = cap;
  }
  void *p = common_calloc(1, size ? size : 1);
  if (p) e->allocs[e->num_allocs++] = p;
  return p;
}

static void enc_reset(enc *e) {
  for (size_t i = 0; i < e->num_allocs; i++) common_free(e->allocs[i]);
  e->num_allocs = 0;
}

static void enc_free(enc *e) {
  enc_reset(e);
  common_free(e->allocs);
  e->allocs = NULL;
  e->cap_allocs = 0;
}

static char *enc_strdup(enc *e, const char *s) {
  size_t n = strlen(s) + 1;
  char *c = enc_alloc(e, n);
  if (c) memcpy(c, s, n);
  return c;
}

static fl_status enc_nomem(void) { return FL_ERR(FL_ENOMEM, "out of memory encoding a plan"); }

static const char *of_what(const enc *e, char *buf, size_t len) {
  if (e->id) snprintf(buf, len, "of dataset %llu", (unsigned long long)e->id);
  else snprintf(buf, len, "of the action");
  return buf;
}

/* Names fn (what: "map", "compare" ...) as a builtin or as (library id, symbol). */
static fl_status encode_fn(enc *e, void (*fn)(void), const char *what, Flint__PlanFn **out) {
  *out = NULL;
  if (!fn) return FL_OK;
  Flint__PlanFn *m = enc_alloc(e, sizeof *m);
  if (!m) return enc_nomem();
  flint__plan_fn__init(m);
  char whose[64];
  const rdd_builtin *b = builtin_by_fn(fn);
  if (b) {
    m->builtin = (char *)b->name;
    *out = m;
    return FL_OK;
  }
  void *addr = (void *)(uintptr_t)fn;
  Dl_info info;
  if (!dladdr(addr, &info) || !info.dli_fname || !info.dli_fbase)
    return FL_ERR(FL_EINVAL, "%s function at %p %s is in no loaded program or library", what, addr,
                  of_what(e, whose, sizeof whose));
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  if (!info.dli_sname || info.dli_saddr != addr)
    return FL_ERR(FL_EINVAL,
                  "%s function at %s+0x%lx %s is not exported: make it non-static with default "
                  "visibility",
                  what, base, (unsigned long)((uintptr_t)addr - (uintptr_t)info.dli_fbase),
                  of_what(e, whose, sizeof whose));
  if (strlen(info.dli_sname) >= MAX_NAME)
    return FL_ERR(FL_ELIMIT, "%s function '%.64s...' %s: its name is longer than %d bytes", what,
                  info.dli_sname, of_what(e, whose, sizeof whose), MAX_NAME - 1);
  if (!e->codec || !e->codec->library_id)
    return FL_ERR(FL_EINVAL, "%s function '%s' %s: no codec to name its library %s", what,
                  info.dli_sname, of_what(e, whose, sizeof whose), base);
  char id[MAX_NAME];
  id[0] = '\0';
  fl_status s = e->codec->library_id(e->codec->arg, info.dli_fname, in_main_program(addr), id,
                                     sizeof id);
  if (s != FL_OK)
    return common_error_wrap(s, "%s function '%s' %s: ", what, info.dli_sname,
                             of_what(e, whose, sizeof whose));
  if (!id[0] || !memchr(id, '\0', sizeof id))
    return FL_ERR(FL_EINTERNAL, "%s function '%s' %s: the codec gave an empty or unterminated library id",
                  what, info.dli_sname, of_what(e, whose, sizeof whose));
  if (!(m->library = enc_strdup(e, id)) || !(m->symbol = enc_strdup(e, info.dli_sname)))
    return enc_nomem();
  *out = m;
  return FL_OK;
}

static fl_status encode_partitioner(enc *e, const fl_partitioner *p, Flint__PlanPartitioner **out) {
  *out = NULL;
  if (!p) return FL_OK;
  Flint__PlanPartitioner *m = enc_alloc(e, sizeof *m);
  if (!m) return enc_nomem();
  flint__plan_partitioner__init(m);
  m->num_partitions = p->num_partitions;
  m->arg = (ProtobufCBinaryData){p->arg_len, p->arg};
  fl_status s = FL_OK;
  switch (p->kind) {
  case PARTITIONER_HASH: m->kind = 0; break;
  case PARTITIONER_RANGE:
    m->kind = 1;
    m->ascending = p->ascending;
    s = encode_fn(e, (void (*)(void))p->compare, "range partitioner compare", &m->fn);
    if (s == FL_OK && p->bounds.count) {
      m->n_bounds = (size_t)p->bounds.count;
      if (!(m->bounds = enc_alloc(e, m->n_bounds * sizeof *m->bounds))) return enc_nomem();
      for (size_t i = 0; i < m->n_bounds; i++)
        m->bounds[i] = (ProtobufCBinaryData){p->bound_views[i].len, (uint8_t *)p->bound_views[i].data};
    }
    break;
  case PARTITIONER_CUSTOM:
    m->kind = 2;
    s = encode_fn(e, (void (*)(void))p->fn, "partition", &m->fn);
    break;
  }
  *out = m;
  return s;
}

static fl_status encode_shuffled(enc *e, rdd *r, Flint__PlanShuffled **out) {
  const shuffled_state *st = r->state;
  Flint__PlanShuffled *m = enc_alloc(e, sizeof *m);
  if (!m) return enc_nomem();
  flint__plan_shuffled__init(m);
  m->mode = (uint32_t)st->mode;
  m->descending = st->descending;
  fl_status s = encode_fn(e, (void (*)(void))st->key_order, "sort compare", &m->key_order);
  if (s != FL_OK) return s;
  if (st->mode == SHUFFLED_AGGREGATE) {
    Flint__PlanAggregator *a = enc_alloc(e, sizeof *a);
    if (!a) return enc_nomem();
    flint__plan_aggregator__init(a);
    if ((s = encode_fn(e, (void (*)(void))st->agg.create, "create", &a->create)) != FL_OK ||
        (s = encode_fn(e, (void (*)(void))st->agg.merge_value, "merge_value", &a->merge_value)) != FL_OK ||
        (s = encode_fn(e, (void (*)(void))st->agg.merge_combiners, "merge_combiners",
                       &a->merge_combiners)) != FL_OK)
      return s;
    a->has_zero = st->agg.has_zero;
    a->zero = (ProtobufCBinaryData){st->agg.zero.len, (uint8_t *)st->agg.zero.data};
    m->agg = a;
  }
  m->n_inputs = st->num_inputs;
  if (!(m->inputs = enc_alloc(e, st->num_inputs * sizeof *m->inputs))) return enc_nomem();
  for (uint32_t i = 0; i < st->num_inputs; i++) {
    Flint__PlanShuffleInput *in = enc_alloc(e, sizeof *in);
    if (!in) return enc_nomem();
    flint__plan_shuffle_input__init(in);
    const rdd_shuffle_dep *dep = st->inputs[i].dep;
    if (dep) {
      if (!rdd_partitioner_equal(dep->partitioner, r->partitioner) ||
          (dep->key_order_arg && dep->key_order_arg != r->arg))
        return FL_ERR(FL_EINTERNAL, "dataset %llu: shuffle %llu is placed or ordered unlike its dataset",
                      (unsigned long long)r->id, (unsigned long long)dep->shuffle_id);
      in->shuffle_id = dep->shuffle_id;
      in->parent = dep->parent->id;
      in->map_combine = dep->map_combine != NULL;
      if ((s = encode_fn(e, (void (*)(void))dep->key_order, "map-side sort compare", &in->key_order)) != FL_OK)
        return s;
    } else {
      in->parent = st->inputs[i].parent->id;
    }
    m->inputs[i] = in;
  }
  *out = m;
  return FL_OK;
}

/* Appends one Plan.nodes entry: its tag, length and bytes. */
static fl_status append_node_bytes(fl_buf *out, const uint8_t *data, size_t len) {
  uint8_t head[1 + COMMON_VARINT_MAX];
  head[0] = (1 << 3) | 2; /* field 1, length-delimited */
  size_t n = 1 + common_varint_put(head + 1, len);
  fl_status s = fl_buf_reserve(out, n + len);
  if (s != FL_OK) return s;
  fl_buf_append(out, head, n);
  fl_buf_append(out, data, len);
  return FL_OK;
}

static fl_status encode_node(enc *e, rdd *r, fl_buf *out) {
  Flint__PlanNode m = FLINT__PLAN_NODE__INIT;
  fl_status s;
  e->id = r->id;
  m.id = r->id;
  m.op = (char *)r->ops->name;
  m.kind = (char *)(r->fn_kind ? r->fn_kind : "");
  m.num_partitions = r->num_partitions;
  uint64_t parents[2];
  for (uint32_t i = 0; i < r->num_parents; i++) parents[i] = r->parents[i]->id;
  m.n_parents = r->num_parents;
  m.parents = parents;
  if ((s = encode_fn(e, r->fn, r->fn_kind ? r->fn_kind : r->ops->name, &m.fn)) != FL_OK) return s;
  m.arg = (ProtobufCBinaryData){r->arg_len, r->arg};
  m.level = (uint32_t)atomic_load(&r->level);
  if ((s = encode_partitioner(e, r->partitioner, &m.partitioner)) != FL_OK) return s;

  if (r->ops == &rdd_parallelize_ops) {
    const memory_state *st = r->state;
    m.n_partitions = st->count;
    if (!(m.partitions = enc_alloc(e, st->count * sizeof *m.partitions))) return enc_nomem();
    for (uint32_t i = 0; i < st->count; i++)
      m.partitions[i] = (ProtobufCBinaryData){st->batches[i].buf.len, st->batches[i].buf.data};
  } else if (r->ops == &rdd_range_ops) {
    const range_state *st = r->state;
    Flint__PlanRange *range = enc_alloc(e, sizeof *range);
    if (!range) return enc_nomem();
    flint__plan_range__init(range);
    range->start = st->start;
    range->step = st->step;
    range->total = st->total;
    m.range = range;
  } else if (r->ops == &rdd_text_file_ops || r->ops == &rdd_binary_records_ops) {
    const file_state *st = r->state;
    Flint__PlanFiles *f = enc_alloc(e, sizeof *f);
    if (!f) return enc_nomem();
    flint__plan_files__init(f);
    f->n_paths = f->n_sizes = st->files.count;
    f->paths = st->files.paths;
    f->sizes = st->files.sizes;
    f->record_len = st->record_len;
    f->n_splits = r->num_partitions;
    if (!(f->splits = enc_alloc(e, r->num_partitions * sizeof *f->splits))) return enc_nomem();
    for (uint32_t i = 0; i < r->num_partitions; i++) {
      Flint__PlanSplit *sp = enc_alloc(e, sizeof *sp);
      if (!sp) return enc_nomem();
      flint__plan_split__init(sp);
      sp->file = st->splits[i].file;
      sp->start = st->splits[i].start;
      sp->end = st->splits[i].end;
      f->splits[i] = sp;
    }
    m.files = f;
  } else if (r->ops == &rdd_zip_with_index_ops) {
    m.n_starts = r->num_partitions;
    m.starts = r->state;
  } else if (r->ops == &shuffled_ops) {
    if ((s = encode_shuffled(e, r, &m.shuffled)) != FL_OK) return s;
  } else if (r->ops == &rdd_checkpoint_ops) {
    m.checkpoint = ((const checkpoint_state *)r->state)->dir;
  } else if (r->ops == &rdd_barrier_ops_table) {
    m.barrier = true;
    m.barrier_gpu = r->state && ((const rdd_barrier_state *)r->state)->gpu;
  } else if (r->ops != &rdd_map_ops && r->ops != &rdd_key_by_ops && r->ops != &rdd_map_values_ops &&
             r->ops != &rdd_filter_ops && r->ops != &rdd_flat_map_ops &&
             r->ops != &rdd_map_partitions_ops && r->ops != &rdd_sample_ops &&
             r->ops != &rdd_union_ops && r->ops != &rdd_coalesce_ops && r->ops != &rdd_barrier_ops_table) {
    return FL_ERR(FL_EINVAL, "dataset %llu: operation '%s' cannot be sent in a plan",
                  (unsigned long long)r->id, r->ops->name);
  }
  size_t len = flint__plan_node__get_packed_size(&m);
  uint8_t *bytes = enc_alloc(e, len);
  if (!bytes) return enc_nomem();
  flint__plan_node__pack(&m, bytes);
  return append_node_bytes(out, bytes, len);
}

/* ---- walking the lineage, parents first ------------------------------------------------------ */

static uint32_t num_inputs(const rdd *r) { return r->num_parents + r->num_shuffle_deps; }
static rdd *input(const rdd *r, uint32_t i) {
  return i < r->num_parents ? r->parents[i] : r->shuffle_deps[i - r->num_parents]->parent;
}

typedef struct walk_frame {
  rdd *r;
  uint32_t next; /* the next input to visit */
} walk_frame;

/* Calls visit(r) for r and its ancestors, parents first, each once, skipping what known()
 * says the receiver has (with its ancestors). Iterative: lineages can be long. */
static fl_status walk_lineage(rdd *root, bool (*known)(void *, uint64_t), void *known_arg,
                              fl_status (*visit)(void *ctx, rdd *r), void *visit_ctx) {
  id_map seen = {0};
  walk_frame *stack = NULL;
  size_t top = 0, cap = 0;
  fl_status status = FL_OK;
#define WALK_PUSH(x)                                                                          \
  do {                                                                                        \
    rdd *x_ = (x);                                                                            \
    if (id_map_get(&seen, x_->id, NULL)) break;                                               \
    FL_CHECK(id_map_put(&seen, x_->id, 0));                                                   \
    if (known && known(known_arg, x_->id)) break;                                             \
    if (top == cap) {                                                                         \
      size_t c_ = cap ? cap * 2 : 32;                                                         \
      walk_frame *g_ = common_realloc(stack, c_ * sizeof *g_);                                \
      if (!g_) {                                                                              \
        status = FL_ERR(FL_ENOMEM, "out of memory walking a lineage");                        \
        goto cleanup;                                                                         \
      }                                                                                       \
      stack = g_;                                                                             \
      cap = c_;                                                                               \
    }                                                                                         \
    stack[top++] = (walk_frame){x_, 0};                                                       \
  } while (0)
  WALK_PUSH(root);
  while (top > 0) {
    walk_frame *f = &stack[top - 1];
    if (f->next < num_inputs(f->r)) {
      rdd *in = input(f->r, f->next++);
      WALK_PUSH(in);
      continue;
    }
    rdd *done = f->r;
    top--;
    FL_CHECK(visit(visit_ctx, done));
  }
#undef WALK_PUSH
cleanup:
  common_free(stack);
  id_map_free(&seen);
  return status;
}

typedef struct encode_walk {
  enc e;
  fl_buf *out;
} encode_walk;

static fl_status encode_visit(void *ctx, rdd *r) {
  encode_walk *w = ctx;
  fl_status s = encode_node(&w->e, r, w->out);
  enc_reset(&w->e);
  return s;
}

fl_status rdd_plan_encode(rdd *r, bool (*known)(void *arg, uint64_t id), void *known_arg,
                          const rdd_fn_codec *codec, fl_buf *out) {
  if (!r || !out) return FL_ERR(FL_EINVAL, "rdd_plan_encode: NULL argument");
  encode_walk w = {{codec, 0, NULL, 0, 0}, out};
  fl_status s = walk_lineage(r, known, known_arg, encode_visit, &w);
  enc_free(&w.e);
  return s;
}

/* ---- the plan ---------------------------------------------------------------------------------- */

typedef struct plan_entry {
  rdd *r; /* one reference, the plan's */
  bool released;
} plan_entry;

struct rdd_plan {
  fl_context *ctx;
  rdd_fn_codec codec;
  bool has_codec;
  plan_entry *entries;
  size_t count, cap;
  id_map by_id;      /* dataset id -> entry */
  id_map by_shuffle; /* shuffle id -> entry of the shuffled dataset */
};

fl_status rdd_plan_create(fl_context *ctx, const rdd_fn_codec *codec, rdd_plan **out) {
  if (!ctx || !out) return FL_ERR(FL_EINVAL, "rdd_plan_create: NULL argument");
  rdd_plan *p = common_calloc(1, sizeof *p);
  if (!p) return FL_ERR(FL_ENOMEM, "cannot allocate a plan");
  p->ctx = ctx;
  if (codec) {
    p->codec = *codec;
    p->has_codec = true;
  }
  *out = p;
  return FL_OK;
}

void rdd_plan_destroy(rdd_plan *p) {
  if (!p) return;
  /* Children first, so that each release frees what it can at once. */
  for (size_t i = p->count; i-- > 0;) rdd_release(p->entries[i].r);
  common_free(p->entries);
  id_map_free(&p->by_id);
  id_map_free(&p->by_shuffle);
  common_free(p);
}

static fl_status index_entry(rdd_plan *p, uint32_t i) {
  rdd *r = p->entries[i].r;
  fl_status s = id_map_put(&p->by_id, r->id, i);
  for (uint32_t k = 0; s == FL_OK && k < r->num_shuffle_deps; k++)
    s = id_map_put(&p->by_shuffle, r->shuffle_deps[k]->shuffle_id, i);
  return s;
}

/* Rebuilds both indexes after entries moved. Cannot fail: the maps already have room for
 * at least as many keys. */
static void reindex(rdd_plan *p) {
  id_map_clear(&p->by_id);
  id_map_clear(&p->by_shuffle);
  for (size_t i = 0; i < p->count; i++) FL_ASSERT(index_entry(p, (uint32_t)i) == FL_OK);
}

rdd *rdd_plan_find(rdd_plan *p, uint64_t id) {
  uint32_t i;
  return p && id_map_get(&p->by_id, id, &i) ? p->entries[i].r : NULL;
}

const rdd_shuffle_dep *rdd_plan_find_shuffle(rdd_plan *p, uint64_t shuffle_id) {
  uint32_t i;
  if (!p || !id_map_get(&p->by_shuffle, shuffle_id, &i)) return NULL;
  rdd *r = p->entries[i].r;
  for (uint32_t k = 0; k < r->num_shuffle_deps; k++)
    if (r->shuffle_deps[k]->shuffle_id == shuffle_id) return r->shuffle_deps[k];
  return NULL;
}

rdd *rdd_plan_shuffle_owner(rdd_plan *p, uint64_t shuffle_id) {
  uint32_t i;
  if (!p || !id_map_get(&p->by_shuffle, shuffle_id, &i)) return NULL;
  return p->entries[i].r;
}

void rdd_plan_release(rdd_plan *p, uint64_t id) {
  uint32_t i;
  if (!p || !id_map_get(&p->by_id, id, &i)) return;
  p->entries[i].released = true;
  /* Mark what held datasets reach, through the indexes (ancestors of decoded datasets were
   * decoded too, so they are entries), then drop the rest. */
  bool *keep = common_calloc(p->count ? p->count : 1, sizeof *keep);
  uint32_t *stack = common_malloc((p->count ? p->count : 1) * sizeof *stack);
  if (!keep || !stack) {
    /* Out of memory: keep everything; a later release sweeps. */
    common_free(keep);
    common_free(stack);
    return;
  }
  size_t top = 0;
  for (size_t k = 0; k < p->count; k++)
    if (!p->entries[k].released) {
      keep[k] = true;
      stack[top++] = (uint32_t)k;
    }
  while (top > 0) {
    rdd *r = p->entries[stack[--top]].r;
    for (uint32_t k = 0; k < num_inputs(r); k++) {
      uint32_t j;
      if (id_map_get(&p->by_id, input(r, k)->id, &j) && !keep[j]) {
        keep[j] = true;
        stack[top++] = j;
      }
    }
  }
  size_t n = 0;
  for (size_t k = p->count; k-- > 0;)
    if (!keep[k]) rdd_release(p->entries[k].r);
  for (size_t k = 0; k < p->count; k++)
    if (keep[k]) p->entries[n++] = p->entries[k];
  p->count = n;
  reindex(p);
  common_free(keep);
  common_free(stack);
}

/* ---- decoding ------------------------------------------------------------------------------ */

/* Kinds (fn_kind) a node may name: the operations' own names and the shuffled ones'. */
static const char *const known_kinds[] = {
    "parallelize", "range", "text_file", "binary_records", "map", "key_by", "map_values",
    "filter", "flat_map", "map_partitions", "sample", "union", "coalesce", "zip_with_index",
    "shuffled", "combine_by_key", "reduce_by_key", "fold_by_key", "aggregate_by_key",
    "group_by_key", "cogroup", "sort_by_key", "partition_by", "checkpoint", "barrier_map_partitions",
};

typedef enum op_shape {
  SHAPE_SOURCE,   /* no parents, no function */
  SHAPE_FN,       /* one parent, a function, the parent's partitions */
  SHAPE_UNARY,    /* one parent, no function, the parent's partitions */
  SHAPE_UNION,
  SHAPE_COALESCE,
  SHAPE_SHUFFLED,
} op_shape;

typedef struct op_info {
  const rdd_ops *ops;
  op_shape shape;
} op_info;

static const op_info *op_by_name(const char *name) {
  static const op_info ops[] = {
      {&rdd_parallelize_ops, SHAPE_SOURCE}, {&rdd_range_ops, SHAPE_SOURCE},
      {&rdd_text_file_ops, SHAPE_SOURCE},   {&rdd_binary_records_ops, SHAPE_SOURCE},
      {&rdd_map_ops, SHAPE_FN},             {&rdd_key_by_ops, SHAPE_FN},
      {&rdd_map_values_ops, SHAPE_FN},      {&rdd_filter_ops, SHAPE_FN},
      {&rdd_flat_map_ops, SHAPE_FN},        {&rdd_map_partitions_ops, SHAPE_FN},
      {&rdd_sample_ops, SHAPE_UNARY},       {&rdd_zip_with_index_ops, SHAPE_UNARY},
      {&rdd_union_ops, SHAPE_UNION},        {&rdd_coalesce_ops, SHAPE_COALESCE},
      {&shuffled_ops, SHAPE_SHUFFLED},      {&rdd_checkpoint_ops, SHAPE_SOURCE},
      {&rdd_barrier_ops_table, SHAPE_FN},
  };
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
    if (strcmp(ops[i].ops->name, name) == 0) return &ops[i];
  return NULL;
}

typedef struct dec {
  rdd_plan *p;
  uint64_t id;      /* the node, for messages */
  const char *what; /* "node 7" or "action" */
  char what_buf[96];
} dec;

#define BAD(d, ...) plan_bad((d), __VA_ARGS__)
static fl_status plan_bad(const dec *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fl_status plan_bad(const dec *d, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fl_set_error(FL_EPROTO, "bad plan: %s: %s", d->what, msg);
}

/* Resolves a function; *builtin is set when it is one of flint's own. */
static fl_status decode_fn(dec *d, const Flint__PlanFn *m, const char *what, void (**out)(void),
                           const rdd_builtin **builtin) {
  *out = NULL;
  if (builtin) *builtin = NULL;
  if (!m) return FL_OK;
  bool has_builtin = m->builtin && m->builtin[0];
  bool has_lib = m->library && m->library[0], has_sym = m->symbol && m->symbol[0];
  if (has_builtin) {
    if (has_lib || has_sym) return BAD(d, "%s function names both a builtin and a library", what);
    const rdd_builtin *b = builtin_by_name(m->builtin);
    if (!b) return BAD(d, "%s function: unknown builtin '%.100s'", what, m->builtin);
    if (builtin) *builtin = b;
    *out = b->fn;
    return FL_OK;
  }
  if (!has_lib || !has_sym) return BAD(d, "%s function lacks its library or symbol", what);
  if (strlen(m->library) >= MAX_NAME || strlen(m->symbol) >= MAX_NAME)
    return BAD(d, "%s function: library id or symbol longer than %d bytes", what, MAX_NAME - 1);
  rdd_plan *p = d->p;
  if (!p->has_codec || !p->codec.resolve) {
    *out = plan_unresolved_fn;
    return FL_OK;
  }
  void (*fn)(void) = NULL;
  fl_status s = p->codec.resolve(p->codec.arg, m->library, m->symbol, &fn);
  if (s != FL_OK)
    return common_error_wrap(s, "%s: cannot resolve %s function '%s' of library %s: ", d->what,
                             what, m->symbol, m->library);
  if (!fn)
    return fl_set_error(FL_ENOENT, "%s: %s function '%s' of library %s resolved to nothing",
                        d->what, what, m->symbol, m->library);
  *out = fn;
  return FL_OK;
}

static fl_status decode_partitioner(dec *d, const Flint__PlanPartitioner *m, fl_partitioner **out) {
  *out = NULL;
  if (!m) return FL_OK;
  if (m->kind > 2) return BAD(d, "unknown partitioner kind %u", m->kind);
  if (m->num_partitions == 0 || m->num_partitions > RDD_PLAN_MAX_PARTITIONS)
    return BAD(d, "partitioner of %u partitions", m->num_partitions);
  void (*fn)(void) = NULL;
  const rdd_builtin *b = NULL;
  fl_status s = decode_fn(d, m->fn, m->kind == 2 ? "partition" : "range partitioner compare", &fn, &b);
  if (s != FL_OK) return s;
  if (m->kind == 0 && (fn || m->n_bounds || m->arg.len))
    return BAD(d, "hash partitioner with a function, bounds or argument");
  if (m->kind == 2 && !fn) return BAD(d, "custom partitioner without a function");
  if (m->kind != 1 && m->n_bounds) return BAD(d, "bounds for a partitioner that is not a range");
  if (m->kind == 1 && m->n_bounds > m->num_partitions - 1)
    return BAD(d, "range partitioner of %u partitions with %zu bounds (at most %u)",
               m->num_partitions, m->n_bounds, m->num_partitions - 1);
  if (b && b->arg_ok && !b->arg_ok(m->arg.data, m->arg.len))
    return BAD(d, "argument of %zu bytes unfit for builtin '%s'", m->arg.len, b->name);
  fl_partitioner *p = common_calloc(1, sizeof *p);
  if (!p) return FL_ERR(FL_ENOMEM, "cannot allocate a partitioner");
  atomic_init(&p->refs, 1);
  p->kind = m->kind == 0 ? PARTITIONER_HASH : m->kind == 1 ? PARTITIONER_RANGE : PARTITIONER_CUSTOM;
  p->num_partitions = m->num_partitions;
  p->ascending = m->ascending;
  if (m->kind == 1) p->compare = (fl_compare_fn)fn;
  if (m->kind == 2) p->fn = (fl_partition_fn)fn;
  if (m->arg.len) {
    if (!(p->arg = common_memdup(m->arg.data, m->arg.len))) goto nomem;
    p->arg_len = m->arg.len;
  }
  if (m->kind == 1) {
    for (size_t i = 0; i < m->n_bounds; i++)
      if (rdd_batch_append(&p->bounds, m->bounds[i].data, m->bounds[i].len) != FL_OK) goto nomem;
    if (!(p->bound_views = common_malloc((m->n_bounds ? m->n_bounds : 1) * sizeof *p->bound_views)))
      goto nomem;
    rdd_cursor c = {p->bounds.buf.data, p->bounds.buf.data + p->bounds.buf.len};
    for (size_t i = 0; i < m->n_bounds; i++) rdd_cursor_next(&c, &p->bound_views[i]);
    /* Bytewise bounds can be checked here; a user order only where it runs. */
    if (!p->compare)
      for (size_t i = 1; i < m->n_bounds; i++)
        if (rdd_compare_keys(NULL, NULL, p->bound_views[i - 1], p->bound_views[i]) > 0) {
          rdd_partitioner_release(p);
          return BAD(d, "range bounds out of order at bound %zu", i);
        }
  }
  *out = p;
  return FL_OK;
nomem:
  rdd_partitioner_release(p);
  return FL_ERR(FL_ENOMEM, "cannot decode a partitioner");
}

/* A batch's record count, or false when the bytes are not well-formed records. */
static bool count_records(const uint8_t *data, size_t len, uint64_t *count) {
  rdd_cursor c = {data, data + len};
  fl_bytes rec;
  uint64_t n = 0;
  while (c.p < c.end) {
    if (!rdd_cursor_next(&c, &rec)) return false;
    n++;
  }
  *count = n;
  return true;
}

static void memory_state_free(memory_state *st) {
  if (!st) return;
  for (uint32_t i = 0; i < st->count; i++) rdd_batch_free(&st->batches[i]);
  common_free(st->batches);
  common_free(st);
}

static void file_state_free(file_state *st) {
  if (!st) return;
  for (size_t i = 0; i < st->files.count; i++) common_free(st->files.paths[i]);
  common_free(st->files.paths);
  common_free(st->files.sizes);
  common_free(st->splits);
  common_free(st);
}

static fl_status decode_files(dec *d, const Flint__PlanNode *m, bool binary, file_state **out) {
  const Flint__PlanFiles *f = m->files;
  if (!f) return BAD(d, "%s without files", m->op);
  if (f->n_paths != f->n_sizes) return BAD(d, "%zu paths but %zu sizes", f->n_paths, f->n_sizes);
  if (f->n_splits != m->num_partitions)
    return BAD(d, "%zu splits for %u partitions", f->n_splits, m->num_partitions);
  if (f->n_paths > UINT32_MAX) return BAD(d, "too many files");
  if (binary ? f->record_len == 0 || f->record_len > (1u << 30) : f->record_len != 0)
    return BAD(d, "record length %llu for %s", (unsigned long long)f->record_len, m->op);
  for (size_t i = 0; i < f->n_paths; i++)
    if (!f->paths[i][0] || strlen(f->paths[i]) >= 4096) return BAD(d, "file %zu has an empty or overlong path", i);
  for (size_t i = 0; i < f->n_splits; i++) {
    const Flint__PlanSplit *sp = f->splits[i];
    if (sp->file >= f->n_paths || sp->start > sp->end || sp->end > f->sizes[sp->file])
      return BAD(d, "split %zu (file %u, bytes %llu-%llu) is not within its file", i, sp->file,
                 (unsigned long long)sp->start, (unsigned long long)sp->end);
    if (binary && (sp->start % f->record_len || (sp->end - sp->start) % f->record_len))
      return BAD(d, "split %zu is not whole records of %llu bytes", i, (unsigned long long)f->record_len);
  }
  file_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a file source");
  st->record_len = (size_t)f->record_len;
  size_t n = f->n_paths;
  st->files.paths = common_calloc(n ? n : 1, sizeof *st->files.paths);
  st->files.sizes = common_malloc((n ? n : 1) * sizeof *st->files.sizes);
  st->splits = common_malloc((f->n_splits ? f->n_splits : 1) * sizeof *st->splits);
  if (!st->files.paths || !st->files.sizes || !st->splits) goto nomem;
  st->files.cap = n;
  for (size_t i = 0; i < n; i++) {
    if (!(st->files.paths[i] = common_strdup(f->paths[i]))) goto nomem;
    st->files.count = i + 1;
    st->files.sizes[i] = f->sizes[i];
  }
  for (size_t i = 0; i < f->n_splits; i++)
    st->splits[i] = (file_split){f->splits[i]->file, f->splits[i]->start, f->splits[i]->end};
  *out = st;
  return FL_OK;
nomem:
  file_state_free(st);
  return FL_ERR(FL_ENOMEM, "cannot decode a file source");
}

/* Checks the shuffled node against its inputs; builds nothing. */
static fl_status check_shuffled(dec *d, const Flint__PlanNode *m, const fl_partitioner *part) {
  const Flint__PlanShuffled *sh = m->shuffled;
  if (!sh) return BAD(d, "shuffled node without its shuffle");
  if (sh->mode > SHUFFLED_COGROUP) return BAD(d, "unknown shuffled mode %u", sh->mode);
  size_t want = sh->mode == SHUFFLED_COGROUP ? 2 : 1;
  if (sh->n_inputs != want) return BAD(d, "%zu inputs for mode %u (needs %zu)", sh->n_inputs, sh->mode, want);
  if (!part) return BAD(d, "shuffled node without a partitioner");
  if ((sh->mode == SHUFFLED_AGGREGATE) != (sh->agg != NULL))
    return BAD(d, "aggregator given for mode %u", sh->mode);
  if (sh->key_order && sh->mode != SHUFFLED_SORT) return BAD(d, "key order given for mode %u", sh->mode);
  if (sh->descending && sh->mode != SHUFFLED_SORT) return BAD(d, "descending given for mode %u", sh->mode);
  size_t narrow = 0;
  for (size_t i = 0; i < sh->n_inputs; i++) {
    const Flint__PlanShuffleInput *in = sh->inputs[i];
    rdd *parent = rdd_plan_find(d->p, in->parent);
    if (!parent) return BAD(d, "input %zu: parent %llu is not in the plan", i, (unsigned long long)in->parent);
    if (in->shuffle_id == 0) {
      if (narrow >= m->n_parents || m->parents[narrow] != in->parent)
        return BAD(d, "input %zu: narrow parent %llu is not the node's parent %zu", i,
                   (unsigned long long)in->parent, narrow);
      if (parent->num_partitions != m->num_partitions)
        return BAD(d, "input %zu: narrow parent has %u partitions, the node %u", i,
                   parent->num_partitions, m->num_partitions);
      if (in->map_combine || in->key_order) return BAD(d, "input %zu: map-side work on a narrow input", i);
      narrow++;
    } else {
      if (rdd_plan_find(d->p, in->shuffle_id) || id_map_get(&d->p->by_shuffle, in->shuffle_id, NULL) ||
          in->shuffle_id == m->id || (i == 1 && sh->inputs[0]->shuffle_id == in->shuffle_id))
        return BAD(d, "input %zu: shuffle id %llu is already in use", i, (unsigned long long)in->shuffle_id);
      if (in->map_combine && sh->mode != SHUFFLED_AGGREGATE)
        return BAD(d, "input %zu: map-side combine without an aggregator", i);
    }
  }
  if (narrow != m->n_parents) return BAD(d, "%zu parents but %zu narrow inputs", m->n_parents, narrow);
  return FL_OK;
}

/* Builds the shuffled state of r (made with its narrow parents) from a checked node. */
static fl_status build_shuffled(dec *d, rdd *r, const Flint__PlanNode *m) {
  const Flint__PlanShuffled *sh = m->shuffled;
  fl_status s;
  shuffled_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a shuffled dataset");
  st->mode = (shuffled_mode)sh->mode;
  st->descending = sh->descending;
  void (*fn)(void);
  if ((s = decode_fn(d, sh->key_order, "sort compare", &fn, NULL)) != FL_OK) goto failed;
  st->key_order = (fl_compare_fn)fn;
  if (sh->agg) {
    const Flint__PlanAggregator *a = sh->agg;
    if ((s = decode_fn(d, a->create, "create", &fn, NULL)) != FL_OK) goto failed;
    st->agg.create = (fl_map_fn)fn;
    if ((s = decode_fn(d, a->merge_value, "merge_value", &fn, NULL)) != FL_OK) goto failed;
    st->agg.merge_value = (fl_reduce_fn)fn;
    if ((s = decode_fn(d, a->merge_combiners, "merge_combiners", &fn, NULL)) != FL_OK) goto failed;
    st->agg.merge_combiners = (fl_reduce_fn)fn;
    if (!st->agg.merge_value || !st->agg.merge_combiners) {
      s = BAD(d, "aggregator without merge_value or merge_combiners");
      goto failed;
    }
    if (!a->has_zero && a->zero.len) {
      s = BAD(d, "aggregator zero given without has_zero");
      goto failed;
    }
    st->agg.arg = r->arg;
    if (a->has_zero) {
      if ((s = fl_buf_append(&st->zero, a->zero.data, a->zero.len)) != FL_OK) goto failed;
      st->agg.zero = fl_buf_bytes(&st->zero);
      st->agg.has_zero = true;
    }
  }
  /* From here on nothing fails: st takes references as make_shuffled's does. */
  fl_compare_fn key_orders[2] = {NULL, NULL};
  for (size_t i = 0; i < sh->n_inputs; i++) {
    if (sh->inputs[i]->shuffle_id == 0) continue;
    if ((s = decode_fn(d, sh->inputs[i]->key_order, "map-side sort compare", &fn, NULL)) != FL_OK) goto failed;
    key_orders[i] = (fl_compare_fn)fn;
  }
  st->num_inputs = (uint32_t)sh->n_inputs;
  for (size_t i = 0; i < sh->n_inputs; i++) {
    const Flint__PlanShuffleInput *in = sh->inputs[i];
    rdd *parent = rdd_plan_find(d->p, in->parent);
    if (in->shuffle_id == 0) {
      st->inputs[i].parent = parent;
      continue;
    }
    rdd_shuffle_dep *dep = &st->deps[i];
    dep->shuffle_id = in->shuffle_id;
    dep->parent = parent;
    rdd_retain(parent);
    dep->partitioner = r->partitioner;
    rdd_partitioner_retain(r->partitioner);
    dep->map_combine = in->map_combine ? &st->agg : NULL;
    dep->key_order = key_orders[i];
    dep->key_order_arg = key_orders[i] ? r->arg : NULL;
    dep->write = shuffle_write;
    st->inputs[i].dep = dep;
    r->shuffle_deps[r->num_shuffle_deps++] = dep;
    if (dep->map_combine) st->values_are_combiners = true;
  }
  r->state = st;
  return FL_OK;
failed:
  fl_buf_free(&st->zero);
  common_free(st);
  return s;
}

/* Decodes one node into a new dataset (*out, one reference). */
static fl_status decode_node(dec *d, const Flint__PlanNode *m, rdd **out) {
  rdd_plan *p = d->p;
  fl_status s;
  if (m->id == 0) return BAD(d, "dataset id 0");
  if (id_map_get(&p->by_shuffle, m->id, NULL)) return BAD(d, "id %llu is already a shuffle's", (unsigned long long)m->id);
  const op_info *op = op_by_name(m->op);
  if (!op) return BAD(d, "unknown operation '%.64s'", m->op);
  const char *kind = NULL;
  const char *want_kind = m->kind[0] ? m->kind : m->op;
  for (size_t i = 0; i < sizeof known_kinds / sizeof *known_kinds; i++)
    if (strcmp(known_kinds[i], want_kind) == 0) kind = known_kinds[i];
  if (!kind) return BAD(d, "unknown kind '%.64s'", m->kind);
  if (m->num_partitions > RDD_PLAN_MAX_PARTITIONS) return BAD(d, "%u partitions", m->num_partitions);
  if (m->level > FL_DISK_ONLY) return BAD(d, "unknown storage level %u", m->level);
  if (m->n_parents > 2) return BAD(d, "%zu parents", m->n_parents);
  rdd *parents[2] = {NULL, NULL};
  for (size_t i = 0; i < m->n_parents; i++)
    if (!(parents[i] = rdd_plan_find(p, m->parents[i])))
      return BAD(d, "parent %llu is not in the plan", (unsigned long long)m->parents[i]);
  /* Fields of other operations must be absent. */
  bool is_memory = op->ops == &rdd_parallelize_ops, is_range = op->ops == &rdd_range_ops;
  bool is_files = op->ops == &rdd_text_file_ops || op->ops == &rdd_binary_records_ops;
  bool is_zip = op->ops == &rdd_zip_with_index_ops, is_shuffled = op->shape == SHAPE_SHUFFLED;
  bool is_ckpt = op->ops == &rdd_checkpoint_ops, is_barrier = op->ops == &rdd_barrier_ops_table;
  if (is_barrier != m->barrier || (!is_barrier && m->barrier_gpu))
    return BAD(d, "barrier fields %s a %s node", is_barrier ? "missing on" : "on", m->op);
  if ((!is_memory && m->n_partitions) || (!is_range && m->range) || (!is_files && m->files) ||
      (!is_zip && m->n_starts) || (!is_shuffled && m->shuffled) || (!is_ckpt && m->checkpoint[0]))
    return BAD(d, "fields of another operation on a %s node", m->op);

  size_t want_parents = op->shape == SHAPE_SOURCE ? 0 : op->shape == SHAPE_UNION ? 2 : 1;
  if (op->shape != SHAPE_SHUFFLED && m->n_parents != want_parents)
    return BAD(d, "%s with %zu parents", m->op, m->n_parents);
  void (*fn)(void) = NULL;
  const rdd_builtin *b = NULL;
  if ((s = decode_fn(d, m->fn, kind, &fn, &b)) != FL_OK) return s;
  if (op->shape == SHAPE_FN ? !fn : op->shape != SHAPE_SHUFFLED && fn)
    return BAD(d, "%s %s a function", m->op, fn ? "with" : "without");
  if (b && b->arg_ok && !b->arg_ok(m->arg.data, m->arg.len))
    return BAD(d, "argument of %zu bytes unfit for builtin '%s'", m->arg.len, b->name);
  switch (op->shape) {
  case SHAPE_FN:
  case SHAPE_UNARY:
    if (m->num_partitions != parents[0]->num_partitions)
      return BAD(d, "%u partitions over a parent of %u", m->num_partitions, parents[0]->num_partitions);
    break;
  case SHAPE_UNION:
    if ((uint64_t)parents[0]->num_partitions + parents[1]->num_partitions != m->num_partitions)
      return BAD(d, "union of %u partitions over parents of %u and %u", m->num_partitions,
                 parents[0]->num_partitions, parents[1]->num_partitions);
    break;
  case SHAPE_COALESCE:
    if (m->num_partitions > parents[0]->num_partitions || (m->num_partitions == 0 && parents[0]->num_partitions))
      return BAD(d, "coalesce to %u partitions from %u", m->num_partitions, parents[0]->num_partitions);
    break;
  case SHAPE_SOURCE:
  case SHAPE_SHUFFLED:
    break;
  }
  if (op->ops == &rdd_sample_ops) {
    sample_args a;
    if (m->arg.len != sizeof a) return BAD(d, "sample arguments of %zu bytes", m->arg.len);
    memcpy(&a, m->arg.data, sizeof a);
    uint8_t flag;
    memcpy(&flag, m->arg.data + offsetof(sample_args, with_replacement), 1);
    if (flag > 1 || !(a.fraction >= 0) || (!a.with_replacement && a.fraction > 1) || a.fraction > 1e9)
      return BAD(d, "sample fraction %g", a.fraction);
  } else if (op->shape != SHAPE_FN && op->shape != SHAPE_SHUFFLED && m->arg.len) {
    return BAD(d, "%s with an argument", m->op);
  }
  if (is_zip && m->n_starts != m->num_partitions)
    return BAD(d, "%zu starts for %u partitions", m->n_starts, m->num_partitions);
  if (is_memory && m->n_partitions != m->num_partitions)
    return BAD(d, "%zu partitions of data for %u partitions", m->n_partitions, m->num_partitions);
  if (is_range && (!m->range || m->range->step == 0)) return BAD(d, "range without a step");
  if (is_ckpt && (m->checkpoint[0] != '/' || strlen(m->checkpoint) >= 4096))
    return BAD(d, "checkpoint folder '%.64s' is not an absolute path of at most 4095 bytes", m->checkpoint);

  fl_partitioner *part = NULL;
  memory_state *mem = NULL;
  file_state *files = NULL;
  int64_t *starts = NULL;
  range_state *range = NULL;
  checkpoint_state *ckpt = NULL;
  rdd *r = NULL;
  fl_status status = FL_OK;
  FL_CHECK(decode_partitioner(d, m->partitioner, &part));
  if (part && part->num_partitions != m->num_partitions) {
    status = BAD(d, "partitioner of %u partitions on a node of %u", part->num_partitions, m->num_partitions);
    goto cleanup;
  }
  if (is_shuffled) FL_CHECK(check_shuffled(d, m, part));
  if (is_memory) {
    if (!(mem = common_calloc(1, sizeof *mem)) ||
        !(mem->batches = common_calloc(m->num_partitions ? m->num_partitions : 1, sizeof *mem->batches))) {
      status = FL_ERR(FL_ENOMEM, "cannot decode parallelized data");
      goto cleanup;
    }
    mem->count = m->num_partitions;
    for (uint32_t i = 0; i < m->num_partitions; i++) {
      uint64_t count;
      if (!count_records(m->partitions[i].data, m->partitions[i].len, &count)) {
        status = BAD(d, "partition %u of its data is malformed", i);
        goto cleanup;
      }
      FL_CHECK(fl_buf_append(&mem->batches[i].buf, m->partitions[i].data, m->partitions[i].len));
      mem->batches[i].count = count;
    }
  } else if (is_range) {
    if (!(range = common_malloc(sizeof *range))) {
      status = FL_ERR(FL_ENOMEM, "cannot decode a range");
      goto cleanup;
    }
    *range = (range_state){m->range->start, m->range->step, m->range->total};
  } else if (is_files) {
    FL_CHECK(decode_files(d, m, op->ops == &rdd_binary_records_ops, &files));
  } else if (is_zip) {
    if (!(starts = common_memdup(m->starts, (m->n_starts ? m->n_starts : 1) * sizeof *starts))) {
      status = FL_ERR(FL_ENOMEM, "cannot decode zip_with_index");
      goto cleanup;
    }
  } else if (is_ckpt) {
    if (!(ckpt = common_calloc(1, sizeof *ckpt)) || !(ckpt->dir = common_strdup(m->checkpoint))) {
      status = FL_ERR(FL_ENOMEM, "cannot decode a checkpoint");
      goto cleanup;
    }
  }
  FL_CHECK(rdd_create_id(p->ctx, m->id, op->ops, m->num_partitions, parents, (uint32_t)m->n_parents,
                         fn, kind, m->arg.data, m->arg.len, &r));
  r->partitioner = part;
  part = NULL;
  if (is_shuffled) {
    FL_CHECK(build_shuffled(d, r, m));
  } else if (is_memory) {
    r->state = mem;
    mem = NULL;
  } else if (is_range) {
    r->state = range;
    range = NULL;
  } else if (is_files) {
    r->state = files;
    files = NULL;
  } else if (is_zip) {
    r->state = starts;
    starts = NULL;
  } else if (is_ckpt) {
    r->state = ckpt;
    ckpt = NULL;
  } else if (is_barrier) {
    rdd_barrier_state *bs = common_calloc(1, sizeof *bs);
    if (!bs) {
      status = FL_ERR(FL_ENOMEM, "cannot decode a barrier dataset");
      goto cleanup;
    }
    bs->gpu = m->barrier_gpu;
    r->state = bs;
  }
  atomic_store(&r->level, (fl_storage_level)m->level);
  *out = r;
  r = NULL;
cleanup:
  if (r) rdd_release(r);
  if (part) rdd_partitioner_release(part);
  memory_state_free(mem);
  file_state_free(files);
  common_free(starts);
  common_free(range);
  if (ckpt) common_free(ckpt->dir);
  common_free(ckpt);
  return status;
}

/* Removes entries [from, count) (the datasets one failed call added). */
static void plan_truncate(rdd_plan *p, size_t from) {
  for (size_t i = p->count; i-- > from;) rdd_release(p->entries[i].r);
  p->count = from;
  reindex(p);
}

fl_status rdd_plan_add(rdd_plan *p, fl_bytes encoded) {
  if (!p || (encoded.len && !encoded.data)) return FL_ERR(FL_EINVAL, "rdd_plan_add: NULL argument");
  fl_status status = FL_OK;
  size_t first = p->count;
  Flint__PlanNode *node = NULL;
  pb_out_of_memory = false;
  Flint__Plan *plan = flint__plan__unpack(&pb_allocator, encoded.len, encoded.data);
  uint64_t max_id = 0;
  if (!plan) {
    status = unpack_failed("the Plan message", encoded.len);
    goto cleanup;
  }
  for (size_t i = 0; i < plan->n_nodes; i++) {
    dec d = {p, 0, NULL, {0}};
    snprintf(d.what_buf, sizeof d.what_buf, "node %zu", i);
    d.what = d.what_buf;
    node = flint__plan_node__unpack(&pb_allocator, plan->nodes[i].len, plan->nodes[i].data);
    if (!node) {
      snprintf(d.what_buf, sizeof d.what_buf, "PlanNode %zu", i);
      status = unpack_failed(d.what_buf, plan->nodes[i].len);
      goto cleanup;
    }
    if (rdd_plan_find(p, node->id)) {
      flint__plan_node__free_unpacked(node, &pb_allocator);
      node = NULL;
      continue;
    }
    snprintf(d.what_buf, sizeof d.what_buf, "node %zu (dataset %llu, %.16s)", i,
             (unsigned long long)node->id, node->op);
    d.id = node->id;
    rdd *r = NULL;
    FL_CHECK(decode_node(&d, node, &r));
    if (p->count == p->cap) {
      size_t cap = p->cap ? p->cap * 2 : 16;
      plan_entry *grown = common_realloc(p->entries, cap * sizeof *grown);
      if (!grown) {
        rdd_release(r);
        status = FL_ERR(FL_ENOMEM, "cannot grow a plan");
        goto cleanup;
      }
      p->entries = grown;
      p->cap = cap;
    }
    p->entries[p->count++] = (plan_entry){r, false};
    if ((status = index_entry(p, (uint32_t)(p->count - 1))) != FL_OK) goto cleanup;
    if ((status = fl_buf_append(&r->plan_node, plan->nodes[i].data, plan->nodes[i].len)) != FL_OK)
      goto cleanup;
    if (r->id > max_id) max_id = r->id;
    for (uint32_t k = 0; k < r->num_shuffle_deps; k++)
      if (r->shuffle_deps[k]->shuffle_id > max_id) max_id = r->shuffle_deps[k]->shuffle_id;
    flint__plan_node__free_unpacked(node, &pb_allocator);
    node = NULL;
  }
  /* Ids made in this context from now on stay clear of the decoded ones. */
  uint_fast64_t next = atomic_load(&p->ctx->next_rdd_id);
  while (max_id != UINT64_MAX && next <= max_id &&
         !atomic_compare_exchange_weak(&p->ctx->next_rdd_id, &next, max_id + 1)) {}
cleanup:
  if (node) flint__plan_node__free_unpacked(node, &pb_allocator);
  if (plan) flint__plan__free_unpacked(plan, &pb_allocator);
  if (status != FL_OK) plan_truncate(p, first);
  return status;
}

typedef struct stored_walk {
  fl_buf *out;
} stored_walk;

static fl_status stored_visit(void *ctx, rdd *r) {
  stored_walk *w = ctx;
  if (!r->plan_node.len)
    return FL_ERR(FL_EINTERNAL, "dataset %llu was not decoded from a plan", (unsigned long long)r->id);
  return append_node_bytes(w->out, r->plan_node.data, r->plan_node.len);
}

fl_status rdd_plan_encode_stored(rdd_plan *p, uint64_t id, bool (*known)(void *, uint64_t),
                                 void *known_arg, fl_buf *out) {
  if (!p || !out) return FL_ERR(FL_EINVAL, "rdd_plan_encode_stored: NULL argument");
  rdd *r = rdd_plan_find(p, id);
  if (!r) return FL_ERR(FL_ENOENT, "dataset %llu is not in the plan", (unsigned long long)id);
  stored_walk w = {out};
  return walk_lineage(r, known, known_arg, stored_visit, &w);
}

/* ---- actions --------------------------------------------------------------------------------- */

/* Actions that write into a folder. */
static bool action_has_path(rdd_action_kind kind) {
  return kind == RDD_ACTION_SAVE_TEXT || kind == RDD_ACTION_CHECKPOINT;
}

fl_status rdd_action_encode(const rdd_action *a, const rdd_fn_codec *codec, fl_buf *out) {
  if (!a || !out) return FL_ERR(FL_EINVAL, "rdd_action_encode: NULL argument");
  if (a->kind > RDD_ACTION_CHECKPOINT)
    return FL_ERR(FL_EINVAL, "rdd_action_encode: action kind %d cannot be sent", (int)a->kind);
  if (a->arg_len && !a->arg) return FL_ERR(FL_EINVAL, "rdd_action_encode: arg_len without arg");
  enc e = {codec, 0, NULL, 0, 0};
  Flint__PlanAction m = FLINT__PLAN_ACTION__INIT;
  fl_status s;
  m.kind = (uint32_t)a->kind;
  m.limit = a->limit;
  m.has_zero = a->has_zero;
  if (a->has_zero) m.zero = (ProtobufCBinaryData){a->zero.len, (uint8_t *)a->zero.data};
  m.arg = (ProtobufCBinaryData){a->arg_len, (uint8_t *)a->arg};
  if (action_has_path(a->kind)) m.path = (char *)(a->path ? a->path : "");
  const char *seq_kind = a->has_zero ? "aggregate" : "reduce";
  if ((s = encode_fn(&e, (void (*)(void))a->seq, seq_kind, &m.seq)) == FL_OK &&
      (s = encode_fn(&e, (void (*)(void))a->foreach_fn, "foreach", &m.foreach_fn)) == FL_OK) {
    size_t len = flint__plan_action__get_packed_size(&m);
    if ((s = fl_buf_reserve(out, len)) == FL_OK) {
      flint__plan_action__pack(&m, out->data + out->len);
      out->len += len;
    }
  }
  enc_free(&e);
  return s;
}

fl_status rdd_action_decode(rdd_plan *p, fl_bytes in, rdd_action *out) {
  if (!p || !out || (in.len && !in.data)) return FL_ERR(FL_EINVAL, "rdd_action_decode: NULL argument");
  dec d = {p, 0, "action", {0}};
  pb_out_of_memory = false;
  Flint__PlanAction *m = flint__plan_action__unpack(&pb_allocator, in.len, in.data);
  if (!m) return unpack_failed("the PlanAction", in.len);
  rdd_action a = {0};
  fl_status status = FL_OK;
  void (*seq)(void) = NULL, (*foreach_fn)(void) = NULL;
  if (m->kind > RDD_ACTION_CHECKPOINT) {
    status = BAD(&d, "unknown action kind %u", m->kind);
    goto cleanup;
  }
  a.kind = (rdd_action_kind)m->kind;
  FL_CHECK(decode_fn(&d, m->seq, m->has_zero ? "aggregate" : "reduce", &seq, NULL));
  FL_CHECK(decode_fn(&d, m->foreach_fn, "foreach", &foreach_fn, NULL));
  if ((a.kind == RDD_ACTION_AGGREGATE) != (seq != NULL) || (a.kind == RDD_ACTION_FOREACH) != (foreach_fn != NULL)) {
    status = BAD(&d, "functions do not fit action kind %u", m->kind);
    goto cleanup;
  }
  if (action_has_path(a.kind) != (m->path[0] != '\0') || strlen(m->path) >= 4096) {
    status = BAD(&d, "output path does not fit action kind %u", m->kind);
    goto cleanup;
  }
  if ((m->limit && a.kind != RDD_ACTION_COLLECT) || (m->has_zero && a.kind != RDD_ACTION_AGGREGATE) ||
      (!m->has_zero && m->zero.len) || (m->arg.len && !seq && !foreach_fn)) {
    status = BAD(&d, "fields of another kind on action kind %u", m->kind);
    goto cleanup;
  }
  a.limit = m->limit;
  a.seq = (fl_reduce_fn)seq;
  a.foreach_fn = (fl_foreach_fn)foreach_fn;
  a.has_zero = m->has_zero;
  if (m->has_zero) {
    uint8_t *zero = common_memdup(m->zero.data, m->zero.len ? m->zero.len : 1);
    if (!zero) goto nomem;
    a.zero = fl_bytes_of(zero, m->zero.len);
  }
  if (m->arg.len) {
    if (!(a.arg = common_memdup(m->arg.data, m->arg.len))) goto nomem;
    a.arg_len = m->arg.len;
  }
  if (action_has_path(a.kind) && !(a.path = common_strdup(m->path))) goto nomem;
  *out = a;
  memset(&a, 0, sizeof a);
  goto cleanup;
nomem:
  status = FL_ERR(FL_ENOMEM, "cannot decode an action");
cleanup:
  rdd_action_clear(&a);
  flint__plan_action__free_unpacked(m, &pb_allocator);
  return status;
}

void rdd_action_clear(rdd_action *a) {
  if (!a) return;
  common_free((void *)a->zero.data);
  common_free((void *)a->arg);
  common_free((void *)a->path);
  memset(a, 0, sizeof *a);
}
