/*
 * plan_internal.h: what the files of the plan codec share, private to rdd/plan*.c: the
 * state of one node's encoding and decoding, the registry of operation codecs and builtins
 * (plan_registry.c), and protobuf-c through flint's allocator (plan_fn.c). Operation codecs
 * see only what rdd.h declares.
 */
#ifndef FLINT_RDD_PLAN_INTERNAL_H
#define FLINT_RDD_PLAN_INTERNAL_H

#include "proto/plan.pb-c.h"
#include "rdd/rdd.h"

#define RDD_PLAN_MAX_NAME 1024 /* longest library id or symbol */

/* What one node's encoding allocated (its message parts and strings), freed after packing. */
struct rdd_plan_enc {
  const rdd_fn_codec *codec;
  uint64_t id; /* the dataset, for messages; 0 for an action */
  void **allocs;
  size_t num_allocs, cap_allocs;
};
/* Frees what the node's encoding allocated and keeps the list for the next node. */
FL_INTERNAL void rdd_plan_enc_reset(rdd_plan_enc *e);
FL_INTERNAL void rdd_plan_enc_free(rdd_plan_enc *e);

struct rdd_plan_dec {
  rdd_plan *p;
  uint64_t id;      /* the node, for messages */
  const char *what; /* "node 7" or "action" */
  char what_buf[96];
};

/* The codec the plan was made with (plan.c), or NULL. */
FL_INTERNAL const rdd_fn_codec *rdd_plan_fn_codec(const rdd_plan *p);

/* As rdd_plan_decode_fn; *builtin is set (may be NULL) when the function is one of flint's. */
FL_INTERNAL fl_status rdd_plan_decode_fn_builtin(rdd_plan_dec *d, const Flint__PlanFn *m,
                                                 const char *what, void (**out)(void),
                                                 const rdd_builtin **builtin);

/* ---- the registry (plan_registry.c) ---------------------------------------------------- */
FL_INTERNAL const rdd_op_codec *rdd_plan_codec_by_ops(const rdd_ops *ops);
FL_INTERNAL const rdd_op_codec *rdd_plan_codec_by_name(const char *op);
/* The registered kind (static storage) equal to `kind`, or NULL. */
FL_INTERNAL const char *rdd_plan_known_kind(const char *kind);
FL_INTERNAL const rdd_builtin *rdd_plan_builtin_by_fn(void (*fn)(void));
FL_INTERNAL const rdd_builtin *rdd_plan_builtin_by_name(const char *name);

/* ---- protobuf-c through flint's allocator (plan_fn.c) ------------------------------------ */
FL_INTERNAL extern ProtobufCAllocator rdd_plan_pb_allocator;
/* Call before an unpack; after one that returned NULL, the status of that failure (out of
 * memory, or a malformed `what` of len bytes) with its message. */
FL_INTERNAL void rdd_plan_unpack_start(void);
FL_INTERNAL fl_status rdd_plan_unpack_failed(const char *what, size_t len);

#endif /* FLINT_RDD_PLAN_INTERNAL_H */
