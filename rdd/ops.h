/*
 * ops.h: what the files of rdd/ share about its operations, private to rdd/. Each file keeps
 * its operations' state to itself and exports only their plan codecs, which
 * rdd/plan_registry.c registers as rdd's own. The other layers see datasets only through
 * rdd.h.
 */
#ifndef FLINT_RDD_OPS_H
#define FLINT_RDD_OPS_H

#include "rdd/rdd.h"

/* Plan codecs, each table ended by an entry whose ops is NULL: parallelize and range
 * (source.c), text_file and binary_records (files.c), the narrow transformations
 * (narrow.c), checkpointed datasets (checkpoint.c). */
FL_INTERNAL extern const rdd_op_codec rdd_source_codecs[], rdd_file_codecs[], rdd_narrow_codecs[],
    rdd_checkpoint_codecs[];

/* rdd/barrier.c: runs a barrier dataset's function over one partition of a barrier task. */
FL_INTERNAL fl_status rdd_barrier_call(rdd *r, rdd_task *task, fl_iter *in, fl_emitter *out);

#endif /* FLINT_RDD_OPS_H */
