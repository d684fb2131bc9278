/*
 * gpu/data/rows.c: datasets of samples as a training run's input. Two kinds: rows of features
 * (what fl_ml_load reads from LIBSVM and CSV files, row blocks of include/flint/ml.h), samples
 * of 1 x 1 x F floats; and example records (include/flint/train.h's fl_example_put: a label
 * and a sample of any shape), such as a user's map produces.
 *
 * The other sources make a partition from a description (a file range, a seed), but these come
 * as datasets partitioned as their makers chose. So the pair is made by the dataflow instead:
 * a dealer turns each partition's samples into image blocks, one stream per rank, the k-th
 * sample of partition p going to rank (k + p) mod R (spread evenly, as PyTorch's
 * DistributedSampler deals indices), each block emitted as the pair (rank, block); the
 * training and test sets' blocks are united and partitioned by rank in one shuffle, and the
 * result is cached. A lost partition is recomputed from that lineage.
 *
 * Labels are classes in [0, classes). Rows: classes = the largest label + 1, and LIBSVM's
 * binary labels -1 and +1 read as classes 0 and 1.
 */
#include <math.h>
#include <string.h>

#include "flint/ml.h"
#include "flint/train.h"
#include "gpu/data/data.h"

#define DEALER_BLOCK_SAMPLES 256u

enum { DEAL_ROWS = 1, DEAL_EXAMPLES = 2 };

typedef struct deal_arg {
  uint32_t kind; /* DEAL_ROWS or DEAL_EXAMPLES */
  uint32_t ranks, c, h, w, classes;
  uint32_t split;  /* data_split */
  uint32_t binary; /* rows: labels -1/+1 as classes (y + 1) / 2 */
} deal_arg;

/* Per rank, the samples of the block being filled. */
typedef struct dealer {
  const deal_arg *a;
  size_t per; /* floats a sample */
  int32_t *labels;  /* ranks x DEALER_BLOCK_SAMPLES */
  float *images;    /* ranks x DEALER_BLOCK_SAMPLES x per */
  uint32_t *count;  /* ranks */
  uint64_t dealt;   /* samples of this partition so far */
  fl_buf block, pair;
  fl_emitter *out;
} dealer;

static fl_status dealer_init(dealer *d, const deal_arg *a, fl_emitter *out) {
  *d = (dealer){.a = a, .per = (size_t)a->c * a->h * a->w, .out = out};
  size_t n = (size_t)a->ranks * DEALER_BLOCK_SAMPLES;
  d->labels = fl_malloc(n * sizeof *d->labels);
  d->images = fl_malloc(n * d->per * sizeof *d->images);
  d->count = fl_calloc(a->ranks, sizeof *d->count);
  if (!d->labels || !d->images || !d->count)
    return fl_set_error(FL_ENOMEM, "training input: out of memory for %u ranks' blocks of %zu floats", a->ranks,
                        DEALER_BLOCK_SAMPLES * d->per);
  return FL_OK;
}

static fl_status dealer_flush(dealer *d, uint32_t r) {
  const deal_arg *a = d->a;
  if (!d->count[r]) return FL_OK;
  int64_t key = r;
  fl_status s = data_block_encode(d->count[r], a->c, a->h, a->w, a->classes, (data_split)a->split, 0, 1,
                                  d->labels + (size_t)r * DEALER_BLOCK_SAMPLES,
                                  d->images + (size_t)r * DEALER_BLOCK_SAMPLES * d->per, &d->block);
  d->pair.len = 0;
  if (s == FL_OK) s = fl_buf_put_pair(&d->pair, fl_bytes_of(&key, sizeof key), fl_buf_bytes(&d->block));
  if (s == FL_OK) s = fl_emit(d->out, d->pair.data, d->pair.len);
  d->count[r] = 0;
  return s;
}

/* The next sample's slot: its rank's block (flushed first when full). */
static fl_status dealer_next(dealer *d, uint32_t partition, int32_t label, float **x) {
  const deal_arg *a = d->a;
  if (label < 0 || (uint32_t)label >= a->classes)
    return fl_set_error(FL_EINVAL, "training input: label %d is not a class in [0, %u)", label, a->classes);
  uint32_t r = (uint32_t)((d->dealt++ + partition) % a->ranks);
  if (d->count[r] == DEALER_BLOCK_SAMPLES) {
    fl_status s = dealer_flush(d, r);
    if (s != FL_OK) return s;
  }
  size_t at = (size_t)r * DEALER_BLOCK_SAMPLES + d->count[r]++;
  d->labels[at] = label;
  *x = d->images + at * d->per;
  return FL_OK;
}

static fl_status dealer_finish(dealer *d) {
  fl_status s = FL_OK;
  for (uint32_t r = 0; s == FL_OK && r < d->a->ranks; r++) s = dealer_flush(d, r);
  return s;
}

static void dealer_free(dealer *d) {
  fl_free(d->labels);
  fl_free(d->images);
  fl_free(d->count);
  fl_buf_free(&d->block);
  fl_buf_free(&d->pair);
}

/* One row block record's rows, dense. */
static fl_status deal_rows(dealer *d, uint32_t partition, fl_bytes rec, fl_buf *scratch) {
  const deal_arg *a = d->a;
  fl_ml_block b;
  fl_status s = fl_ml_block_view(rec, scratch, &b);
  if (s != FL_OK) return s;
  if (b.cols > a->w)
    return fl_set_error(FL_ECORRUPT, "training input: a block of %u features, the run's are %u", b.cols, a->w);
  for (uint32_t i = 0; s == FL_OK && i < b.rows; i++) {
    double y = a->binary ? (b.labels[i] + 1.0) / 2.0 : b.labels[i];
    if (!(y >= 0 && y < a->classes) || y != floor(y))
      return fl_set_error(FL_EINVAL, "training input: label %g is not a class in [0, %u)", b.labels[i], a->classes);
    float *x;
    if ((s = dealer_next(d, partition, (int32_t)y, &x)) != FL_OK) break;
    memset(x, 0, d->per * sizeof *x);
    if (b.sparse) {
      for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) x[b.col[k]] = (float)b.x[k];
    } else {
      for (uint32_t j = 0; j < b.cols; j++) x[j] = (float)b.x[(size_t)i * b.cols + j];
    }
  }
  return s;
}

/* One example record. */
static fl_status deal_example(dealer *d, uint32_t partition, fl_bytes rec) {
  if (rec.len != 4 + d->per * sizeof(float))
    return fl_set_error(FL_EINVAL, "training input: an example of %zu bytes, but a label and %zu floats take %zu "
                        "(fl_example_put)", rec.len, d->per, 4 + d->per * sizeof(float));
  int32_t label;
  memcpy(&label, rec.data, sizeof label);
  float *x;
  fl_status s = dealer_next(d, partition, label, &x);
  if (s == FL_OK) memcpy(x, rec.data + 4, d->per * sizeof *x);
  return s;
}

FL_API fl_status gpu_data_deal_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  deal_arg a;
  memcpy(&a, arg, sizeof a);
  dealer d;
  fl_buf scratch = FL_BUF_INIT;
  fl_status s = dealer_init(&d, &a, out);
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec))
    s = a.kind == DEAL_ROWS ? deal_rows(&d, partition, rec, &scratch) : deal_example(&d, partition, rec);
  if (s == FL_OK) s = dealer_finish(&d);
  dealer_free(&d);
  fl_buf_free(&scratch);
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

/* Deals both sets to the ranks and partitions the blocks by rank, cached. */
static fl_status deal_pair(fl_dataset *train, fl_dataset *test, deal_arg a, fl_dataset **out) {
  fl_dataset *tr = NULL, *te = NULL, *both = NULL, *parted = NULL, *blocks = NULL;
  fl_partitioner *by_rank = NULL;
  a.split = DATA_SPLIT_TRAIN;
  fl_status s = fl_map_partitions(train, gpu_data_deal_partition, &a, sizeof a, &tr);
  a.split = DATA_SPLIT_TEST;
  if (s == FL_OK) s = fl_map_partitions(test, gpu_data_deal_partition, &a, sizeof a, &te);
  if (s == FL_OK) s = fl_union(tr, te, &both);
  if (s == FL_OK) s = fl_partitioner_custom(a.ranks, gpu_data_rank_partition, NULL, 0, &by_rank);
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
  *out = blocks;
  return FL_OK;
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

fl_status data_rows_pair(const fl_ml_data *train, const fl_ml_data *test, uint32_t ranks, uint32_t *classes,
                         uint32_t *cols, fl_dataset **out) {
  if (!train || !test || !out || ranks < 1) return fl_set_error(FL_EINVAL, "data_rows_pair: bad argument");
  deal_arg a = {.kind = DEAL_ROWS, .ranks = ranks, .c = 1, .h = 1, .w = train->cols > test->cols ? train->cols : test->cols};
  bool binary = false;
  fl_status s = rows_classes(train, test, &a.classes, &binary);
  if (s != FL_OK) return s;
  a.binary = binary;
  if ((s = deal_pair(train->blocks, test->blocks, a, out)) != FL_OK) return s;
  *classes = a.classes;
  *cols = a.w;
  return FL_OK;
}

fl_status data_examples_pair(fl_dataset *train, fl_dataset *test, uint32_t ranks, uint32_t c, uint32_t h, uint32_t w,
                             uint32_t classes, fl_dataset **out) {
  if (!train || !test || !out || ranks < 1 || !c || !h || !w || classes < 1)
    return fl_set_error(FL_EINVAL, "data_examples_pair: bad argument");
  deal_arg a = {.kind = DEAL_EXAMPLES, .ranks = ranks, .c = c, .h = h, .w = w, .classes = classes};
  return deal_pair(train, test, a, out);
}

fl_status fl_example_put(fl_buf *out, int32_t label, const float *x, size_t count) {
  if (!out || (!x && count)) return fl_set_error(FL_EINVAL, "fl_example_put: NULL argument");
  out->len = 0;
  fl_status s = fl_buf_reserve(out, 4 + count * sizeof *x);
  if (s == FL_OK) s = fl_buf_append(out, &label, sizeof label);
  if (s == FL_OK && count) s = fl_buf_append(out, x, count * sizeof *x);
  return s;
}
