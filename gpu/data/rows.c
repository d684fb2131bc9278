/*
 * gpu/data/rows.c: rows of features (what fl_ml_load reads from LIBSVM and CSV files, as row
 * blocks of include/flint/ml.h) as a training run's input: samples of 1 x 1 x F floats.
 *
 * The other sources make a partition from a description (a file range, a seed), but rows come
 * as a cached dataset of row blocks partitioned as the loader chose. So the pair is made by the
 * dataflow instead: each row block becomes one image block per rank, keyed by the rank, the
 * row i of a partition going to rank (i + partition) mod R (spread evenly, as PyTorch's
 * DistributedSampler deals indices); the training and test sets' blocks are united and
 * partitioned by rank in one shuffle, and the result is cached. A lost partition is
 * recomputed from that lineage, from the row blocks' own.
 *
 * Labels are classes: integers in [0, classes), classes = the largest label + 1; LIBSVM's
 * binary labels -1 and +1 read as classes 0 and 1.
 */
#include <math.h>
#include <string.h>

#include "flint/ml.h"
#include "gpu/data/data.h"

typedef struct rows_arg {
  uint32_t ranks, cols, classes;
  uint32_t split;    /* data_split */
  uint32_t binary;   /* labels -1/+1: class (y + 1) / 2 */
} rows_arg;

/* One row block record into one image block per rank, each emitted as the pair (rank, block). */
static fl_status rows_emit(uint32_t partition, fl_bytes rec, const rows_arg *a, fl_buf *scratch, int32_t *labels,
                           float *images, fl_buf *block, fl_buf *pair, fl_emitter *out) {
  fl_ml_block b;
  fl_status s = fl_ml_block_view(rec, scratch, &b);
  if (s != FL_OK) return s;
  if (b.cols > a->cols)
    return fl_set_error(FL_ECORRUPT, "rows to images: a block of %u features, the run's are %u", b.cols, a->cols);
  for (uint32_t r = 0; r < a->ranks; r++) {
    uint32_t n = 0;
    for (uint32_t i = (r + a->ranks - partition % a->ranks) % a->ranks; i < b.rows; i += a->ranks, n++) {
      double y = a->binary ? (b.labels[i] + 1.0) / 2.0 : b.labels[i];
      if (!(y >= 0 && y < a->classes) || y != floor(y))
        return fl_set_error(FL_EINVAL, "rows to images: label %g is not a class in [0, %u)", b.labels[i], a->classes);
      labels[n] = (int32_t)y;
      float *x = images + (size_t)n * a->cols;
      memset(x, 0, a->cols * sizeof *x);
      if (b.sparse) {
        for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) x[b.col[k]] = (float)b.x[k];
      } else {
        for (uint32_t j = 0; j < b.cols; j++) x[j] = (float)b.x[(size_t)i * b.cols + j];
      }
    }
    if (n == 0) continue;
    int64_t key = r;
    if ((s = data_block_encode(n, 1, 1, a->cols, a->classes, (data_split)a->split, 0, 1, labels, images, block)) !=
            FL_OK ||
        (s = (pair->len = 0, fl_buf_put_pair(pair, fl_bytes_of(&key, sizeof key), fl_buf_bytes(block)))) != FL_OK ||
        (s = fl_emit(out, pair->data, pair->len)) != FL_OK)
      return s;
  }
  return FL_OK;
}

FL_API fl_status gpu_data_rows_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  rows_arg a;
  memcpy(&a, arg, sizeof a);
  fl_buf scratch = FL_BUF_INIT, block = FL_BUF_INIT, pair = FL_BUF_INIT;
  int32_t *labels = NULL;
  float *images = NULL;
  size_t cap = 0;
  fl_status s = FL_OK;
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    size_t per_rank = b.rows / a.ranks + 1;
    if (per_rank > cap) {
      fl_free(labels);
      fl_free(images);
      labels = fl_malloc(per_rank * sizeof *labels);
      images = fl_malloc(per_rank * a.cols * sizeof *images);
      cap = per_rank;
      if (!labels || !images) {
        s = fl_set_error(FL_ENOMEM, "rows to images: out of memory for %zu rows of %u features", per_rank, a.cols);
        break;
      }
    }
    s = rows_emit(partition, rec, &a, &scratch, labels, images, &block, &pair, out);
  }
  fl_free(labels);
  fl_free(images);
  fl_buf_free(&scratch);
  fl_buf_free(&block);
  fl_buf_free(&pair);
  return s;
}

/* The pair's key is the rank: rank r's partition is r. */
FL_API uint32_t gpu_data_rank_partition(fl_bytes key, uint32_t num_partitions, const void *arg) {
  (void)arg;
  return (uint32_t)((uint64_t)fl_i64(key) % num_partitions);
}

/* (rank, block) -> block. */
FL_API fl_status gpu_data_pair_value(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes key, value;
  fl_status s = fl_pair(rec, &key, &value);
  return s == FL_OK ? fl_buf_append(out, value.data, value.len) : s;
}

/* The classes of a classification over both sets' labels; binary when they are -1 and +1. */
static fl_status rows_classes(const fl_ml_data *train, const fl_ml_data *test, uint32_t *classes, bool *binary) {
  double lo = fmin(train->label_min, test->label_min), hi = fmax(train->label_max, test->label_max);
  if (!train->labels_integer || !test->labels_integer)
    return fl_set_error(FL_EINVAL, "training on rows needs class labels (integers); these run from %g to %g, not all "
                        "integers", lo, hi);
  *binary = lo == -1 && hi == 1;
  if (*binary) {
    char what[200];
    fl_ml_data_describe_labels(train, what, sizeof what);
    if (train->label_seen && (train->label_seen[0] >> 1 & 1)) /* bit y + 1 for y = 0 */
      return fl_set_error(FL_EINVAL, "training on rows: labels -1, 0 and 1 (%s): give classes 0..K-1, or -1 and +1 "
                          "for two", what);
    *classes = 2;
    return FL_OK;
  }
  if (lo < 0) return fl_set_error(FL_EINVAL, "training on rows: label %g is negative (classes are 0..K-1)", lo);
  if (hi >= 65536) return fl_set_error(FL_EINVAL, "training on rows: label %g is over 65535", hi);
  *classes = (uint32_t)hi + 1;
  if (*classes < 2) return fl_set_error(FL_EINVAL, "training on rows: one class only (label %g)", hi);
  return FL_OK;
}

static fl_status rows_blocks(const fl_ml_data *d, const rows_arg *a, fl_dataset **out) {
  return fl_map_partitions(d->blocks, gpu_data_rows_partition, a, sizeof *a, out);
}

fl_status data_rows_pair(const fl_ml_data *train, const fl_ml_data *test, uint32_t ranks, uint32_t *classes,
                         uint32_t *cols, fl_dataset **out) {
  if (!train || !test || !out || ranks < 1) return fl_set_error(FL_EINVAL, "data_rows_pair: bad argument");
  rows_arg a = {.ranks = ranks, .cols = train->cols > test->cols ? train->cols : test->cols};
  bool binary = false;
  fl_status s = rows_classes(train, test, &a.classes, &binary);
  if (s != FL_OK) return s;
  a.binary = binary;
  fl_dataset *tr = NULL, *te = NULL, *both = NULL, *parted = NULL, *blocks = NULL;
  fl_partitioner *by_rank = NULL;
  a.split = DATA_SPLIT_TRAIN;
  s = rows_blocks(train, &a, &tr);
  a.split = DATA_SPLIT_TEST;
  if (s == FL_OK) s = rows_blocks(test, &a, &te);
  if (s == FL_OK) s = fl_union(tr, te, &both);
  if (s == FL_OK) s = fl_partitioner_custom(ranks, gpu_data_rank_partition, NULL, 0, &by_rank);
  if (s == FL_OK) s = fl_partition_by(both, by_rank, &parted);
  if (s == FL_OK) s = fl_map(parted, gpu_data_pair_value, NULL, 0, &blocks);
  if (s == FL_OK) s = fl_persist(blocks, FL_MEMORY_ONLY);
  fl_partitioner_free(by_rank);
  fl_dataset_free(parted);
  fl_dataset_free(both);
  fl_dataset_free(te);
  fl_dataset_free(tr);
  if (s != FL_OK) {
    fl_dataset_free(blocks);
    return s;
  }
  *classes = a.classes;
  *cols = a.cols;
  *out = blocks;
  return FL_OK;
}
