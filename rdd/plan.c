/*
 * plan.c: lineage as bytes (proto/plan.proto), so that a client can send the datasets it
 * built to a driver, and the driver the parts it schedules to executors.
 *
 * Design. A plan is a protobuf Plan: a repeated bytes field of encoded PlanNode messages,
 * parents first. Each node travels as its own bytes so that a receiver keeps them with the
 * dataset it decoded (rdd->plan_node) and can send them on unchanged without resolving their
 * functions (the driver never loads user libraries). Since a Plan is one repeated field,
 * two encodings appended are one plan with the nodes of both.
 *
 * This file encodes and checks what every node has (id, operation, kind, partitions,
 * parents, function, argument, level, partitioner) and hands the rest of the node to the
 * operation's codec (rdd_op_codec), registered by the module that owns the operation
 * (plan_registry.c), so that no operation's state is known here. Functions are named and
 * resolved by plan_fn.c; actions travel through plan_action.c.
 *
 * Decoding trusts nothing: every count, id, partition number, length and name is checked
 * before a dataset is made, and a bad plan is FL_EPROTO naming the node and what is wrong.
 * A call that fails removes the datasets it had made, so the plan is as it was.
 *
 * The plan holds one reference to each dataset it decoded. A released dataset stays while a
 * held one depends on it (rdd_plan_release sweeps the rest), so that rdd_plan_find and
 * rdd_plan_find_shuffle answer for every dataset a held one may still run.
 */
#include <string.h>

#include "rdd/plan_internal.h"

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

/* ---- encoding ----------------------------------------------------------------------------- */

static fl_status encode_partitioner(rdd_plan_enc *e, const fl_partitioner *p, Flint__PlanPartitioner **out) {
  *out = NULL;
  if (!p) return FL_OK;
  Flint__PlanPartitioner *m = rdd_plan_enc_alloc(e, sizeof *m);
  if (!m) return rdd_plan_enc_nomem();
  flint__plan_partitioner__init(m);
  m->num_partitions = p->num_partitions;
  m->arg = (ProtobufCBinaryData){p->arg_len, p->arg};
  fl_status s = FL_OK;
  switch (p->kind) {
  case PARTITIONER_HASH: m->kind = 0; break;
  case PARTITIONER_RANGE:
    m->kind = 1;
    m->ascending = p->ascending;
    s = rdd_plan_encode_fn(e, (void (*)(void))p->compare, "range partitioner compare", &m->fn);
    if (s == FL_OK && p->bounds.count) {
      m->n_bounds = (size_t)p->bounds.count;
      if (!(m->bounds = rdd_plan_enc_alloc(e, m->n_bounds * sizeof *m->bounds))) return rdd_plan_enc_nomem();
      for (size_t i = 0; i < m->n_bounds; i++)
        m->bounds[i] = (ProtobufCBinaryData){p->bound_views[i].len, (uint8_t *)p->bound_views[i].data};
    }
    break;
  case PARTITIONER_CUSTOM:
    m->kind = 2;
    s = rdd_plan_encode_fn(e, (void (*)(void))p->fn, "partition", &m->fn);
    break;
  }
  *out = m;
  return s;
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

static fl_status encode_node(rdd_plan_enc *e, rdd *r, fl_buf *out) {
  const rdd_op_codec *codec = rdd_plan_codec_by_ops(r->ops);
  if (!codec)
    return FL_ERR(FL_EINVAL, "dataset %llu: operation '%s' cannot be sent in a plan",
                  (unsigned long long)r->id, r->ops->name);
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
  if ((s = rdd_plan_encode_fn(e, r->fn, r->fn_kind ? r->fn_kind : r->ops->name, &m.fn)) != FL_OK) return s;
  m.arg = (ProtobufCBinaryData){r->arg_len, r->arg};
  m.level = (uint32_t)atomic_load(&r->level);
  if ((s = encode_partitioner(e, r->partitioner, &m.partitioner)) != FL_OK) return s;
  if (codec->encode && (s = codec->encode(e, r, &m)) != FL_OK) return s;
  size_t len = flint__plan_node__get_packed_size(&m);
  uint8_t *bytes = rdd_plan_enc_alloc(e, len);
  if (!bytes) return rdd_plan_enc_nomem();
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
  rdd_plan_enc e;
  fl_buf *out;
} encode_walk;

static fl_status encode_visit(void *ctx, rdd *r) {
  encode_walk *w = ctx;
  fl_status s = encode_node(&w->e, r, w->out);
  rdd_plan_enc_reset(&w->e);
  return s;
}

fl_status rdd_plan_encode(rdd *r, bool (*known)(void *arg, uint64_t id), void *known_arg,
                          const rdd_fn_codec *codec, fl_buf *out) {
  if (!r || !out) return FL_ERR(FL_EINVAL, "rdd_plan_encode: NULL argument");
  encode_walk w = {{codec, 0, NULL, 0, 0}, out};
  fl_status s = walk_lineage(r, known, known_arg, encode_visit, &w);
  rdd_plan_enc_free(&w.e);
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

const rdd_fn_codec *rdd_plan_fn_codec(const rdd_plan *p) { return p->has_codec ? &p->codec : NULL; }

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

static fl_status decode_partitioner(rdd_plan_dec *d, const Flint__PlanPartitioner *m, fl_partitioner **out) {
  *out = NULL;
  if (!m) return FL_OK;
  if (m->kind > 2) return rdd_plan_bad(d, "unknown partitioner kind %u", m->kind);
  if (m->num_partitions == 0 || m->num_partitions > RDD_PLAN_MAX_PARTITIONS)
    return rdd_plan_bad(d, "partitioner of %u partitions", m->num_partitions);
  void (*fn)(void) = NULL;
  const rdd_builtin *b = NULL;
  fl_status s = rdd_plan_decode_fn_builtin(d, m->fn, m->kind == 2 ? "partition" : "range partitioner compare", &fn, &b);
  if (s != FL_OK) return s;
  if (m->kind == 0 && (fn || m->n_bounds || m->arg.len))
    return rdd_plan_bad(d, "hash partitioner with a function, bounds or argument");
  if (m->kind == 2 && !fn) return rdd_plan_bad(d, "custom partitioner without a function");
  if (m->kind != 1 && m->n_bounds) return rdd_plan_bad(d, "bounds for a partitioner that is not a range");
  if (m->kind == 1 && m->n_bounds > m->num_partitions - 1)
    return rdd_plan_bad(d, "range partitioner of %u partitions with %zu bounds (at most %u)",
               m->num_partitions, m->n_bounds, m->num_partitions - 1);
  if (b && b->arg_ok && !b->arg_ok(m->arg.data, m->arg.len))
    return rdd_plan_bad(d, "argument of %zu bytes unfit for builtin '%s'", m->arg.len, b->name);
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
          return rdd_plan_bad(d, "range bounds out of order at bound %zu", i);
        }
  }
  *out = p;
  return FL_OK;
nomem:
  rdd_partitioner_release(p);
  return FL_ERR(FL_ENOMEM, "cannot decode a partitioner");
}

/* A batch's record count, or false when the bytes are not well-formed records. */
/* Decodes one node into a new dataset (*out, one reference). */
static fl_status decode_node(rdd_plan_dec *d, const Flint__PlanNode *m, rdd **out) {
  rdd_plan *p = d->p;
  fl_status s;
  if (m->id == 0) return rdd_plan_bad(d, "dataset id 0");
  if (id_map_get(&p->by_shuffle, m->id, NULL))
    return rdd_plan_bad(d, "id %llu is already a shuffle's", (unsigned long long)m->id);
  const rdd_op_codec *op = rdd_plan_codec_by_name(m->op);
  if (!op) return rdd_plan_bad(d, "unknown operation '%.64s'", m->op);
  const char *kind = rdd_plan_known_kind(m->kind[0] ? m->kind : m->op);
  if (!kind) return rdd_plan_bad(d, "unknown kind '%.64s'", m->kind);
  if (m->num_partitions > RDD_PLAN_MAX_PARTITIONS) return rdd_plan_bad(d, "%u partitions", m->num_partitions);
  if (m->level > FL_DISK_ONLY) return rdd_plan_bad(d, "unknown storage level %u", m->level);
  if (m->n_parents > 2) return rdd_plan_bad(d, "%zu parents", m->n_parents);
  rdd *parents[2] = {NULL, NULL};
  for (size_t i = 0; i < m->n_parents; i++)
    if (!(parents[i] = rdd_plan_find(p, m->parents[i])))
      return rdd_plan_bad(d, "parent %llu is not in the plan", (unsigned long long)m->parents[i]);
  /* Fields of other operations must be absent. */
  unsigned owns = op->fields;
  bool is_barrier = owns & RDD_PLAN_BARRIER;
  if (is_barrier != m->barrier || (!is_barrier && m->barrier_gpu))
    return rdd_plan_bad(d, "barrier fields %s a %s node", is_barrier ? "missing on" : "on", m->op);
  if ((!(owns & RDD_PLAN_PARTITIONS) && m->n_partitions) || (!(owns & RDD_PLAN_RANGE) && m->range) ||
      (!(owns & RDD_PLAN_FILES) && m->files) || (!(owns & RDD_PLAN_STARTS) && m->n_starts) ||
      (!(owns & RDD_PLAN_SHUFFLED) && m->shuffled) || (!(owns & RDD_PLAN_CHECKPOINT) && m->checkpoint[0]))
    return rdd_plan_bad(d, "fields of another operation on a %s node", m->op);

  size_t want_parents = op->shape == RDD_SHAPE_SOURCE ? 0 : op->shape == RDD_SHAPE_UNION ? 2 : 1;
  if (op->shape != RDD_SHAPE_WIDE && m->n_parents != want_parents)
    return rdd_plan_bad(d, "%s with %zu parents", m->op, m->n_parents);
  void (*fn)(void) = NULL;
  const rdd_builtin *b = NULL;
  if ((s = rdd_plan_decode_fn_builtin(d, m->fn, kind, &fn, &b)) != FL_OK) return s;
  if (op->shape == RDD_SHAPE_FN ? !fn : op->shape != RDD_SHAPE_WIDE && fn)
    return rdd_plan_bad(d, "%s %s a function", m->op, fn ? "with" : "without");
  if (b && b->arg_ok && !b->arg_ok(m->arg.data, m->arg.len))
    return rdd_plan_bad(d, "argument of %zu bytes unfit for builtin '%s'", m->arg.len, b->name);
  switch (op->shape) {
  case RDD_SHAPE_FN:
  case RDD_SHAPE_UNARY:
    if (m->num_partitions != parents[0]->num_partitions)
      return rdd_plan_bad(d, "%u partitions over a parent of %u", m->num_partitions, parents[0]->num_partitions);
    break;
  case RDD_SHAPE_UNION:
    if ((uint64_t)parents[0]->num_partitions + parents[1]->num_partitions != m->num_partitions)
      return rdd_plan_bad(d, "union of %u partitions over parents of %u and %u", m->num_partitions,
                          parents[0]->num_partitions, parents[1]->num_partitions);
    break;
  case RDD_SHAPE_COALESCE:
    if (m->num_partitions > parents[0]->num_partitions || (m->num_partitions == 0 && parents[0]->num_partitions))
      return rdd_plan_bad(d, "coalesce to %u partitions from %u", m->num_partitions, parents[0]->num_partitions);
    break;
  case RDD_SHAPE_SOURCE:
  case RDD_SHAPE_WIDE:
    break;
  }
  if (!(owns & RDD_PLAN_ARG) && m->arg.len) return rdd_plan_bad(d, "%s with an argument", m->op);

  fl_partitioner *part = NULL;
  void *state = NULL;
  rdd *r = NULL;
  fl_status status = FL_OK;
  FL_CHECK(decode_partitioner(d, m->partitioner, &part));
  if (part && part->num_partitions != m->num_partitions) {
    status = rdd_plan_bad(d, "partitioner of %u partitions on a node of %u", part->num_partitions,
                          m->num_partitions);
    goto cleanup;
  }
  if (op->decode) FL_CHECK(op->decode(d, m, part, &state));
  FL_CHECK(rdd_create_id(p->ctx, m->id, op->ops, m->num_partitions, parents, (uint32_t)m->n_parents,
                         fn, kind, m->arg.data, m->arg.len, &r));
  r->partitioner = part;
  part = NULL;
  if (op->attach) {
    void *taken = state;
    state = NULL;
    FL_CHECK(op->attach(d, m, r, taken));
  } else {
    r->state = state;
    state = NULL;
  }
  atomic_store(&r->level, (fl_storage_level)m->level);
  *out = r;
  r = NULL;
cleanup:
  if (r) rdd_release(r);
  if (part) rdd_partitioner_release(part);
  if (state && op->free_state) op->free_state(state);
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
  rdd_plan_unpack_start();
  Flint__Plan *plan = flint__plan__unpack(&rdd_plan_pb_allocator, encoded.len, encoded.data);
  uint64_t max_id = 0;
  if (!plan) {
    status = rdd_plan_unpack_failed("the Plan message", encoded.len);
    goto cleanup;
  }
  for (size_t i = 0; i < plan->n_nodes; i++) {
    rdd_plan_dec d = {p, 0, NULL, {0}};
    snprintf(d.what_buf, sizeof d.what_buf, "node %zu", i);
    d.what = d.what_buf;
    node = flint__plan_node__unpack(&rdd_plan_pb_allocator, plan->nodes[i].len, plan->nodes[i].data);
    if (!node) {
      snprintf(d.what_buf, sizeof d.what_buf, "PlanNode %zu", i);
      status = rdd_plan_unpack_failed(d.what_buf, plan->nodes[i].len);
      goto cleanup;
    }
    if (rdd_plan_find(p, node->id)) {
      flint__plan_node__free_unpacked(node, &rdd_plan_pb_allocator);
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
    flint__plan_node__free_unpacked(node, &rdd_plan_pb_allocator);
    node = NULL;
  }
  /* Ids made in this context from now on stay clear of the decoded ones. */
  uint_fast64_t next = atomic_load(&p->ctx->next_rdd_id);
  while (max_id != UINT64_MAX && next <= max_id &&
         !atomic_compare_exchange_weak(&p->ctx->next_rdd_id, &next, max_id + 1)) {}
cleanup:
  if (node) flint__plan_node__free_unpacked(node, &rdd_plan_pb_allocator);
  if (plan) flint__plan__free_unpacked(plan, &rdd_plan_pb_allocator);
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

