/*
 * shuffle.h: wide dependencies. Map tasks place each pair of their partition into a reduce
 * partition (shuffle/writer.c), write one data file per map task through the block store,
 * and report its sizes to the map-output table (shuffle/map_output.c); reduce tasks fetch
 * their block from every map task and combine, group, sort or just read the pairs
 * (shuffle/reader.c). Both sides sort and aggregate with the external sorter
 * (shuffle/sorter.c), which spills sorted runs to disk past its memory budget, so a shuffle
 * of any size runs in bounded memory.
 */
#ifndef FLINT_SHUFFLE_H
#define FLINT_SHUFFLE_H

#include "rdd/rdd.h"

/* ---- external sorter ------------------------------------------------------------------- */
typedef struct shuffle_sorter shuffle_sorter;

typedef struct shuffle_sorter_config {
  uint64_t memory;      /* bytes of entries held before a sorted run is spilled */
  const char *dir;      /* where runs go */
  bool order_keys;      /* output in key order within a partition (else partition order only;
                           the values of a key are combined either way when aggregating) */
  fl_compare_fn key_order; /* NULL: bytewise */
  const void *key_order_arg;
  bool descending;
  const rdd_aggregator *agg; /* combine the values of equal keys, or NULL */
  bool values_are_combiners; /* inserted values are combiners (after a map-side combine) */
  rdd_task *task;            /* user-function failures are reported on it */
  const rdd *fn_owner;       /* named in those failures */
} shuffle_sorter_config;

FL_INTERNAL fl_status shuffle_sorter_create(const shuffle_sorter_config *cfg, shuffle_sorter **out);
FL_INTERNAL fl_status shuffle_sorter_insert(shuffle_sorter *s, uint32_t part, fl_bytes key,
                                            fl_bytes value);
/* As n inserts; faster when aggregating (the table slots of the keys are prefetched).
 * key_hashes: each key's common_hash_bytes when the caller has them, else NULL. */
FL_INTERNAL fl_status shuffle_sorter_insert_batch(shuffle_sorter *s, uint32_t n,
                                                  const uint32_t *parts, const fl_bytes *keys,
                                                  const fl_bytes *values,
                                                  const uint64_t *key_hashes);
/* Ends the input. Afterwards next() yields every entry in (partition, key) order, the
 * values of equal keys combined when aggregating. */
FL_INTERNAL fl_status shuffle_sorter_finish(shuffle_sorter *s);
/* The next entry (views valid until the next call); false at the end or on failure (then
 * the status is on the task). */
FL_INTERNAL bool shuffle_sorter_next(shuffle_sorter *s, uint32_t *part, fl_bytes *key,
                                     fl_bytes *value);
/* How many times the entries in memory were spilled to disk as a run. */
FL_INTERNAL uint32_t shuffle_sorter_spills(const shuffle_sorter *s);
/* Frees memory and deletes the spill files. NULL does nothing. */
FL_INTERNAL void shuffle_sorter_destroy(shuffle_sorter *s);

/* ---- blocks ---------------------------------------------------------------------------- */
/* The block of one reduce partition in a map task's data file is a run of chunks: a uint32
 * length, then an encoded batch of at most SHUFFLE_CHUNK raw bytes of pairs, so that both
 * sides hold one chunk at a time whatever the size of the block. */
#define SHUFFLE_CHUNK (1u << 20)

/* ---- map side -------------------------------------------------------------------------- */
/* The write hook of every shuffle dependency (rdd_shuffle_dep.write). */
FL_INTERNAL fl_status shuffle_write(rdd_task *task, fl_iter *in, const rdd_shuffle_dep *dep,
                                    fl_buf *status);

/* ---- shuffled datasets (reader.c, made by pair_ops.c) ----------------------------------- */
typedef enum shuffled_mode {
  SHUFFLED_PLAIN,     /* the pairs as they come */
  SHUFFLED_AGGREGATE, /* (key, combiner) */
  SHUFFLED_GROUP,     /* (key, group of values) */
  SHUFFLED_SORT,      /* pairs in key order */
  SHUFFLED_COGROUP,   /* (key, groups from both inputs) */
} shuffled_mode;

/* One input: a shuffle (dep) or, when already partitioned alike, the parent itself. */
typedef struct shuffle_input {
  rdd_shuffle_dep *dep;
  rdd *parent;
} shuffle_input;

typedef struct shuffled_state {
  shuffled_mode mode;
  shuffle_input inputs[2];
  uint32_t num_inputs;
  rdd_shuffle_dep deps[2]; /* storage for the inputs' deps */
  rdd_aggregator agg;      /* aggregate: its arg is the dataset's arg blob */
  bool values_are_combiners;
  fl_buf zero;             /* fold and aggregate: storage of agg.zero */
  fl_compare_fn key_order; /* sort; its arg is the dataset's arg blob */
  bool descending;
} shuffled_state;

FL_INTERNAL extern const rdd_ops shuffled_ops;
/* Makes input i of shuffled dataset r (its state st; r->partitioner set) read a shuffle of
 * `parent`: fills st->deps[i], taking references on parent and the partitioner, which
 * shuffled_ops.destroy drops. map_combine: combine values map-side with st->agg; key_order:
 * sort keys map-side (its arg is r's), or NULL. Cannot fail. */
FL_INTERNAL void shuffle_add_dep(rdd *r, shuffled_state *st, uint32_t i, uint64_t shuffle_id, rdd *parent,
                                  bool map_combine, fl_compare_fn key_order);

/* flint's own functions used by the compositions of pair_ops.c (see rdd_builtin), ended by
 * an entry whose name is NULL. */
FL_INTERNAL extern const rdd_builtin shuffle_builtins[];
/* The plan codec of shuffled datasets (plan_codec.c), registered at load time. */
FL_INTERNAL extern const rdd_op_codec shuffle_plan_codecs[];

/* ---- map-output table ------------------------------------------------------------------ */
/* Which map tasks of each shuffle have written their output, and its size per reduce
 * partition, so that a later job reuses a shuffle instead of running its map stage again.
 * Thread-safe. */
typedef struct map_output_table map_output_table;
FL_INTERNAL fl_status map_output_table_create(map_output_table **out);
FL_INTERNAL void map_output_table_destroy(map_output_table *t);
/* Records map task `map`'s status (one uint64 per reduce partition). */
FL_INTERNAL fl_status map_output_register(map_output_table *t, uint64_t shuffle_id,
                                          uint32_t num_maps, uint32_t map, fl_bytes status);
/* Whether every map task of the shuffle has output. */
FL_INTERNAL bool map_output_complete(map_output_table *t, uint64_t shuffle_id);
/* Whether map task `map` has output. */
FL_INTERNAL bool map_output_has(map_output_table *t, uint64_t shuffle_id, uint32_t map);
/* Bytes of the shuffle in all (the sum of every map's sizes). */
FL_INTERNAL uint64_t map_output_bytes(map_output_table *t, uint64_t shuffle_id);
FL_INTERNAL void map_output_forget(map_output_table *t, uint64_t shuffle_id);
/* Marks map task `map`'s output lost (its executor is gone, or a fetch of it failed). */
FL_INTERNAL void map_output_unregister(map_output_table *t, uint64_t shuffle_id, uint32_t map);

#endif /* FLINT_SHUFFLE_H */
