/*
 * op_state.h: the operations of the rdd layer and the state their datasets keep, shared
 * between the files that make those datasets (source.c, narrow.c) and the plan codec
 * (plan.c), which writes the state out and builds it back. Private to rdd/: the other
 * layers see datasets only through rdd.h.
 */
#ifndef FLINT_RDD_OP_STATE_H
#define FLINT_RDD_OP_STATE_H

#include "rdd/rdd.h"

/* parallelize: the records, one batch per partition (count == num_partitions). */
typedef struct memory_state {
  rdd_batch *batches;
  uint32_t count;
} memory_state;

/* range: `total` values start, start + step, ... split evenly over the partitions. */
typedef struct range_state {
  int64_t start, step;
  uint64_t total;
} range_state;

/* text_file and binary_records: the files, listed when the dataset was made, and one split
 * (bytes [start, end) of one file) per partition. */
typedef struct file_list {
  char **paths;
  uint64_t *sizes;
  size_t count, cap;
} file_list;

typedef struct file_split {
  uint32_t file;
  uint64_t start, end;
} file_split;

typedef struct file_state {
  file_list files;
  file_split *splits;
  size_t record_len; /* binary records; 0 for text */
} file_state;

/* sample: the dataset's argument blob. */
typedef struct sample_args {
  bool with_replacement;
  double fraction;
  uint64_t seed;
} sample_args;

/* checkpoint: the folder of its part files (an absolute path); the dataset has no parents. */
typedef struct checkpoint_state {
  char *dir;
} checkpoint_state;

/* zip_with_index: the state is an int64_t[num_partitions] of each partition's first index. */

FL_INTERNAL extern const rdd_ops rdd_parallelize_ops, rdd_range_ops, rdd_text_file_ops,
    rdd_binary_records_ops;
FL_INTERNAL extern const rdd_ops rdd_map_ops, rdd_key_by_ops, rdd_map_values_ops, rdd_filter_ops,
    rdd_flat_map_ops, rdd_map_partitions_ops, rdd_sample_ops, rdd_union_ops, rdd_coalesce_ops,
    rdd_zip_with_index_ops;
FL_INTERNAL extern const rdd_ops rdd_checkpoint_ops;

/* rdd/barrier.c: runs a barrier dataset's function over one partition of a barrier task. */
FL_INTERNAL fl_status rdd_barrier_call(rdd *r, rdd_task *task, fl_iter *in, fl_emitter *out);

#endif /* FLINT_RDD_OP_STATE_H */
