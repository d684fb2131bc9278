/*
 * plan_codec.c: shuffled datasets in plans (the PlanShuffled field of a node, see
 * proto/plan.proto), and the shuffle layer's registration with rdd's plan codec.
 *
 * The codec and the builtins of pair_ops.c are registered from a constructor, which runs
 * when libflint (or a program linked with the static objects) is loaded: before main and
 * any thread, so before any plan is encoded or decoded in every process (client, driver,
 * executor, local). A static link keeps this object although nothing calls into it:
 * CMakeLists.txt names shuffle_plan_codecs as undefined for every program that links
 * flint_internal.
 */
#include "proto/plan.pb-c.h"
#include "shuffle/shuffle.h"

static fl_status shuffled_encode(rdd_plan_enc *e, const rdd *r, Flint__PlanNode *node) {
  const shuffled_state *st = r->state;
  Flint__PlanShuffled *m = rdd_plan_enc_alloc(e, sizeof *m);
  if (!m) return rdd_plan_enc_nomem();
  flint__plan_shuffled__init(m);
  m->mode = (uint32_t)st->mode;
  m->descending = st->descending;
  fl_status s = rdd_plan_encode_fn(e, (void (*)(void))st->key_order, "sort compare", &m->key_order);
  if (s != FL_OK) return s;
  if (st->mode == SHUFFLED_AGGREGATE) {
    Flint__PlanAggregator *a = rdd_plan_enc_alloc(e, sizeof *a);
    if (!a) return rdd_plan_enc_nomem();
    flint__plan_aggregator__init(a);
    if ((s = rdd_plan_encode_fn(e, (void (*)(void))st->agg.create, "create", &a->create)) != FL_OK ||
        (s = rdd_plan_encode_fn(e, (void (*)(void))st->agg.merge_value, "merge_value", &a->merge_value)) != FL_OK ||
        (s = rdd_plan_encode_fn(e, (void (*)(void))st->agg.merge_combiners, "merge_combiners",
                                &a->merge_combiners)) != FL_OK)
      return s;
    a->has_zero = st->agg.has_zero;
    a->zero = (ProtobufCBinaryData){st->agg.zero.len, (uint8_t *)st->agg.zero.data};
    m->agg = a;
  }
  m->n_inputs = st->num_inputs;
  if (!(m->inputs = rdd_plan_enc_alloc(e, st->num_inputs * sizeof *m->inputs))) return rdd_plan_enc_nomem();
  for (uint32_t i = 0; i < st->num_inputs; i++) {
    Flint__PlanShuffleInput *in = rdd_plan_enc_alloc(e, sizeof *in);
    if (!in) return rdd_plan_enc_nomem();
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
      if ((s = rdd_plan_encode_fn(e, (void (*)(void))dep->key_order, "map-side sort compare",
                                  &in->key_order)) != FL_OK)
        return s;
    } else {
      in->parent = st->inputs[i].parent->id;
    }
    m->inputs[i] = in;
  }
  node->shuffled = m;
  return FL_OK;
}

/* Checks the shuffled node against its inputs before the dataset is made; builds nothing. */
static fl_status shuffled_decode(rdd_plan_dec *d, const Flint__PlanNode *m, const fl_partitioner *part,
                                 void **state) {
  rdd_plan *p = rdd_plan_dec_plan(d);
  const Flint__PlanShuffled *sh = m->shuffled;
  if (!sh) return rdd_plan_bad(d, "shuffled node without its shuffle");
  if (sh->mode > SHUFFLED_COGROUP) return rdd_plan_bad(d, "unknown shuffled mode %u", sh->mode);
  size_t want = sh->mode == SHUFFLED_COGROUP ? 2 : 1;
  if (sh->n_inputs != want)
    return rdd_plan_bad(d, "%zu inputs for mode %u (needs %zu)", sh->n_inputs, sh->mode, want);
  if (!part) return rdd_plan_bad(d, "shuffled node without a partitioner");
  if ((sh->mode == SHUFFLED_AGGREGATE) != (sh->agg != NULL))
    return rdd_plan_bad(d, "aggregator given for mode %u", sh->mode);
  if (sh->key_order && sh->mode != SHUFFLED_SORT) return rdd_plan_bad(d, "key order given for mode %u", sh->mode);
  if (sh->descending && sh->mode != SHUFFLED_SORT)
    return rdd_plan_bad(d, "descending given for mode %u", sh->mode);
  size_t narrow = 0;
  for (size_t i = 0; i < sh->n_inputs; i++) {
    const Flint__PlanShuffleInput *in = sh->inputs[i];
    rdd *parent = rdd_plan_find(p, in->parent);
    if (!parent)
      return rdd_plan_bad(d, "input %zu: parent %llu is not in the plan", i, (unsigned long long)in->parent);
    if (in->shuffle_id == 0) {
      if (narrow >= m->n_parents || m->parents[narrow] != in->parent)
        return rdd_plan_bad(d, "input %zu: narrow parent %llu is not the node's parent %zu", i,
                            (unsigned long long)in->parent, narrow);
      if (parent->num_partitions != m->num_partitions)
        return rdd_plan_bad(d, "input %zu: narrow parent has %u partitions, the node %u", i,
                            parent->num_partitions, m->num_partitions);
      if (in->map_combine || in->key_order) return rdd_plan_bad(d, "input %zu: map-side work on a narrow input", i);
      narrow++;
    } else {
      if (rdd_plan_find(p, in->shuffle_id) || rdd_plan_shuffle_owner(p, in->shuffle_id) ||
          in->shuffle_id == m->id || (i == 1 && sh->inputs[0]->shuffle_id == in->shuffle_id))
        return rdd_plan_bad(d, "input %zu: shuffle id %llu is already in use", i,
                            (unsigned long long)in->shuffle_id);
      if (in->map_combine && sh->mode != SHUFFLED_AGGREGATE)
        return rdd_plan_bad(d, "input %zu: map-side combine without an aggregator", i);
    }
  }
  if (narrow != m->n_parents) return rdd_plan_bad(d, "%zu parents but %zu narrow inputs", m->n_parents, narrow);
  return FL_OK;
}

/* Builds the shuffled state of r (made with its narrow parents) from a checked node. */
static fl_status shuffled_attach(rdd_plan_dec *d, const Flint__PlanNode *m, rdd *r, void *state) {
  rdd_plan *p = rdd_plan_dec_plan(d);
  const Flint__PlanShuffled *sh = m->shuffled;
  fl_status s;
  shuffled_state *st = common_calloc(1, sizeof *st);
  if (!st) return FL_ERR(FL_ENOMEM, "cannot decode a shuffled dataset");
  st->mode = (shuffled_mode)sh->mode;
  st->descending = sh->descending;
  void (*fn)(void);
  if ((s = rdd_plan_decode_fn(d, sh->key_order, "sort compare", &fn)) != FL_OK) goto failed;
  st->key_order = (fl_compare_fn)fn;
  if (sh->agg) {
    const Flint__PlanAggregator *a = sh->agg;
    if ((s = rdd_plan_decode_fn(d, a->create, "create", &fn)) != FL_OK) goto failed;
    st->agg.create = (fl_map_fn)fn;
    if ((s = rdd_plan_decode_fn(d, a->merge_value, "merge_value", &fn)) != FL_OK) goto failed;
    st->agg.merge_value = (fl_reduce_fn)fn;
    if ((s = rdd_plan_decode_fn(d, a->merge_combiners, "merge_combiners", &fn)) != FL_OK) goto failed;
    st->agg.merge_combiners = (fl_reduce_fn)fn;
    if (!st->agg.merge_value || !st->agg.merge_combiners) {
      s = rdd_plan_bad(d, "aggregator without merge_value or merge_combiners");
      goto failed;
    }
    if (!a->has_zero && a->zero.len) {
      s = rdd_plan_bad(d, "aggregator zero given without has_zero");
      goto failed;
    }
    st->agg.arg = r->arg;
    if (a->has_zero) {
      if ((s = fl_buf_append(&st->zero, a->zero.data, a->zero.len)) != FL_OK) goto failed;
      st->agg.zero = fl_buf_bytes(&st->zero);
      st->agg.has_zero = true;
    }
  }
  fl_compare_fn key_orders[2] = {NULL, NULL};
  for (size_t i = 0; i < sh->n_inputs; i++) {
    if (sh->inputs[i]->shuffle_id == 0) continue;
    if ((s = rdd_plan_decode_fn(d, sh->inputs[i]->key_order, "map-side sort compare", &fn)) != FL_OK)
      goto failed;
    key_orders[i] = (fl_compare_fn)fn;
  }
  /* From here on nothing fails: st takes references as make_shuffled's does. */
  st->num_inputs = (uint32_t)sh->n_inputs;
  for (size_t i = 0; i < sh->n_inputs; i++) {
    const Flint__PlanShuffleInput *in = sh->inputs[i];
    rdd *parent = rdd_plan_find(p, in->parent);
    if (in->shuffle_id == 0) st->inputs[i].parent = parent;
    else shuffle_add_dep(r, st, (uint32_t)i, in->shuffle_id, parent, in->map_combine, key_orders[i]);
  }
  r->state = st;
  return FL_OK;
failed:
  fl_buf_free(&st->zero);
  common_free(st);
  return s;
}

/* The kinds of the public wide transformations (pair_ops.c), for messages. */
static const char *const shuffled_kinds[] = {
    "combine_by_key", "reduce_by_key", "fold_by_key", "aggregate_by_key", "group_by_key",
    "cogroup",        "sort_by_key",   "partition_by", NULL,
};

const rdd_op_codec shuffle_plan_codecs[] = {
    {&shuffled_ops, RDD_SHAPE_WIDE, RDD_PLAN_ARG | RDD_PLAN_SHUFFLED, shuffled_kinds, shuffled_encode,
     shuffled_decode, NULL, shuffled_attach},
    {NULL},
};

__attribute__((constructor)) static void shuffle_plan_codecs_register(void) {
  rdd_plan_register(shuffle_plan_codecs, shuffle_builtins);
}
