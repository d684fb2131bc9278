/*
 * gpu/data/data.h: image datasets for training, as flint datasets of image blocks, and the
 * rank's reader that turns its partition into shuffled mini-batches.
 *
 * A dataset is a cached fl_dataset whose records are image blocks. Block record layout (all
 * little-endian, the host order):
 *   off  size
 *     0     4  magic "FLIB" (DATA_BLOCK_MAGIC)
 *     4     4  count: images in the block (1 .. block_images)
 *     8     2  channels      10  2  height      12  2  width
 *    14     2  split: DATA_SPLIT_TRAIN (0) or DATA_SPLIT_TEST (1)
 *    16     4  classes
 *    20     4  stride: image i of the block is image first + i * stride of the data set
 *                (0 reads as 1: consecutive images)
 *    24     8  first: the dataset-wide index of the block's first image
 *    32  4*count  labels, int32 in [0, classes)
 *    ..     pad to a multiple of 8 bytes (4 zero bytes when count is odd)
 *    ..  4*count*channels*height*width  images, float32, NCHW, normalized (see data_norm)
 * A partition holds, in order, either a contiguous range of images (the default) or, with
 * data_options.interleave, every parts-th image: partition p of P holds images p, p + P,
 * p + 2P, ... (as PyTorch's DistributedSampler assigns them to ranks), or with a run r > 1,
 * runs of r consecutive images: r images of every P r, the p-th run of each. A training run's
 * input (data_pair) holds, in partition r, rank r's share of the training set and then its
 * share of the test set, told apart by `split`.
 *
 * Sources:
 * - Fashion-MNIST (or any IDX pair): idx3-ubyte images and idx1-ubyte labels, gzip'd or not.
 *   The calling process checks both headers, the counts and every label; each partition's
 *   task then reads its range of images from the files (so in cluster mode the path must be
 *   readable where the executors run, as for fl_text_file).
 * - synthetic-imagenet: 3 x 224 x 224 images of 1000 classes made by the tasks from (seed,
 *   index) alone: the same seed and index give the same image and label on any machine and
 *   for any partitioning. An image is its class's per-channel mean plus a class-dependent
 *   separable wave (a row pattern plus a column pattern) plus uniform noise, so a network
 *   can learn it; it is for throughput, not accuracy.
 *
 * - An image folder (include/flint/image.h): DIR/CLASS/NAME.jpg|jpeg|png, listed by the calling
 *   process; each partition's task decodes its files (libjpeg-turbo, libpng), resizes them
 *   to the folder options' cache size, applies a transform (as in epoch 0) and emits blocks
 *   of 3 x size x size floats, already normalised (data_options.norm is not used).
 *
 * Errors name the file: FL_ENOENT for a missing file, FL_EFORMAT for a bad magic, a
 * truncated file, a count mismatch between images and labels, or a label out of range.
 */
#ifndef FLINT_GPU_DATA_H
#define FLINT_GPU_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/flint.h"
#include "flint/image.h"

#define DATA_BLOCK_MAGIC 0x42494c46u /* "FLIB" */
#define DATA_BLOCK_HEADER 32u
#define DATA_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define DATA_IMAGENET_CHANNELS 3
#define DATA_IMAGENET_SIZE 224
#define DATA_IMAGENET_CLASSES 1000

typedef enum data_split { DATA_SPLIT_TRAIN = 0, DATA_SPLIT_TEST = 1 } data_split;

typedef enum data_norm {
  DATA_NORM_UNIT = 0, /* pixel / 255, in [0, 1] */
  DATA_NORM_STANDARD, /* (pixel / 255 - mean) / std with the data set's mean and std */
} data_norm;

/* Fashion-MNIST's pixel mean and standard deviation (of pixel / 255, training set). */
#define DATA_FASHION_MNIST_MEAN 0.2860
#define DATA_FASHION_MNIST_STD 0.3530

typedef struct data_options {
  uint32_t partitions;   /* 0: the context's default parallelism; at most one per image */
  uint32_t block_images; /* images per block record (0: 256) */
  data_norm norm;        /* IDX only; synthetic images are already centred */
  bool interleave;       /* partition p of P holds images p, p + P, ... (else a range) */
  uint64_t max_images;   /* IDX only: the first max_images images of the file (0: all) */
  /* With interleave: runs of `run` consecutive images instead of single ones (0 or 1:
   * single): partition p holds images (k P + p) run + i for i < run, k = 0, 1, ... */
  uint32_t run;
} data_options;
#define DATA_OPTIONS_INIT {0, 0, DATA_NORM_UNIT, false, 0, 0}

/* A dataset of image blocks and its shape. */
typedef struct data_set {
  fl_dataset *blocks; /* owned; persisted in memory (FL_MEMORY_ONLY), computed lazily */
  uint64_t images;
  uint32_t channels, height, width, classes;
  uint32_t partitions;
  fl_buf source; /* how a task makes a partition (for data_pair); private */
  fl_broadcast *shared; /* what every task reads (an image folder's listing), owned; NULL: none.
                         * It must outlive every job over blocks or over a pair made of them. */
} data_set;
/* Frees the dataset handle and its broadcast and resets *d; a zeroed data_set is fine. */
void data_set_free(data_set *d);

/* One dataset of train.partitions partitions (test must have as many), partition r holding
 * train's partition r (split DATA_SPLIT_TRAIN) and then test's (DATA_SPLIT_TEST): the input
 * of a barrier stage whose rank r trains on the first and evaluates on the second. *out is
 * persisted in memory; free it with fl_dataset_free. FL_EINVAL for unequal partitions. */
fl_status data_pair(fl_context *ctx, const data_set *train, const data_set *test, fl_dataset **out);

/* An IDX pair into image blocks. classes: labels must be below it (0: 10). */
fl_status data_load_idx(fl_context *ctx, const char *images_path, const char *labels_path,
                        uint32_t classes, const data_options *opts, data_set *out);
/* Fashion-MNIST from `dir` (NULL: DATA_FASHION_MNIST_DIR): train-images-idx3-ubyte(.gz) and
 * train-labels-idx1-ubyte(.gz), or the t10k-* pair when !train; the plain file is used when
 * it exists, else the .gz. */
fl_status data_fashion_mnist(fl_context *ctx, const char *dir, bool train, const data_options *opts,
                             data_set *out);
/* `count` synthetic-imagenet images with indices first .. first + count - 1 (a test set is
 * another range of the same seed: same classes, new noise). */
fl_status data_synthetic_imagenet(fl_context *ctx, uint64_t seed, uint64_t first, uint64_t count,
                                  const data_options *opts, data_set *out);
/* An image folder (a train/ or val/ tree) as image blocks of 3 x t->size x t->size images,
 * transformed by `t` in epoch 0 (the eval transform gives the same images every run; the
 * training transform, one seeded crop per image). With `records`, its training split is
 * the cached image records themselves instead (flint/image.h's layout), for a reader that
 * transforms them each epoch (data_reader_set_transform); its test split stays blocks.
 * fo->skip_bad is refused (a block's count is fixed before its files are read): a bad file
 * fails its task, naming the file. *classes (NULL: not wanted) gets the listing's classes;
 * free it with fl_image_classes_free. */
fl_status data_image_folder(fl_context *ctx, const char *dir, const fl_image_folder_options *fo,
                            const fl_image_transform *t, bool records, const data_options *opts, data_set *out,
                            fl_image_classes **classes);
/* Rows of features (fl_ml_load's row blocks: LIBSVM, CSV) as the input of a training run of
 * `ranks` ranks: samples of 1 x 1 x *cols floats (sparse rows made dense; *cols the wider
 * set's features) and *classes classes (the largest label + 1; -1/+1 read as 0/1), partition
 * r holding rank r's share of both sets (gpu/data/rows.c), persisted in memory: use it as
 * data_pair's result. FL_EINVAL names labels that are not classes. */
typedef struct fl_ml_data fl_ml_data;
fl_status data_rows_pair(const fl_ml_data *train, const fl_ml_data *test, uint32_t ranks, uint32_t *classes,
                         uint32_t *cols, fl_dataset **out);
/* Datasets of example records (fl_example_put: a label in [0, classes), then c*h*w floats) as
 * the same kind of input; a record of another size or a label out of range fails its task
 * with FL_EINVAL naming it. */
fl_status data_examples_pair(fl_dataset *train, fl_dataset *test, uint32_t ranks, uint32_t c, uint32_t h, uint32_t w,
                             uint32_t classes, fl_dataset **out);

/* Byte-level text (gpu/data/text.c): split `split` of the file at `path` as windows of
 * seq + 1 bytes (1 x 1 x (seq + 1) samples of DATA_TEXT_VOCAB classes, label 0), window i
 * starting at byte i x seq of the split; the test split is the file's last tenth. FL_ENOENT
 * for a missing file, FL_EEMPTY for an empty one, FL_EINVAL for one too short to give each
 * split a window (or a bad seq); each names the file. */
#define DATA_TEXT_VOCAB 256u
#define DATA_TEXT_TEST_SHARE 10u /* the test split is 1 / this of the file */
#define DATA_TEXT_MAX_SEQ 65536u
fl_status data_load_text(fl_context *ctx, const char *path, uint32_t seq, data_split split, const data_options *opts,
                         data_set *out);
/* Where split `split` of a file of `bytes` bytes starts and how many windows it holds. */
fl_status data_text_split(uint64_t bytes, uint32_t seq, data_split split, uint64_t *first, uint64_t *windows);

/* One synthetic-imagenet image (3*224*224 floats into `image`) and its label, as the
 * generator makes them; for tests and for generating on the fly. */
void data_synthetic_image(uint64_t seed, uint64_t index, float *image, int32_t *label);

/* ---- blocks --------------------------------------------------------------------------- */

/* A validated view of a block record. The arrays may be unaligned: read them with memcpy
 * (data_block_label / data_block_image do). */
typedef struct data_block {
  uint32_t count, channels, height, width, classes;
  uint32_t stride; /* >= 1: image i is image first + i * stride of the data set */
  data_split split;
  uint64_t first;
  const uint8_t *labels; /* count int32 */
  const uint8_t *images; /* count * channels * height * width float32 */
} data_block;
/* FL_ECORRUPT when rec is not a well-formed block (magic, sizes, a label out of range). */
fl_status data_block_view(fl_bytes rec, data_block *out);
/* Encodes a block (replacing out's contents): labels[count], images[count * c*h*w], image i
 * being image first + i * stride of the data set (stride >= 1). */
fl_status data_block_encode(uint32_t count, uint32_t channels, uint32_t height, uint32_t width,
                            uint32_t classes, data_split split, uint64_t first, uint32_t stride,
                            const int32_t *labels, const float *images, fl_buf *out);

/* ---- the rank's reader ---------------------------------------------------------------- */

/* Holds the images of one partition in host memory (the blocks are copied: a barrier task
 * reads its partition once but trains many epochs) and hands out mini-batches. Not
 * thread-safe: one rank's thread calls it. With prefetch (the default) the reader has a
 * thread of its own, started by the first epoch and joined by data_reader_destroy, that
 * makes the next batch while the caller works on the last one (gpu/data/reader.c). */
typedef struct data_reader data_reader;

/* An empty reader for batches of `batch` images (>= 1), prefetching. */
fl_status data_reader_create(uint32_t batch, data_reader **out);
/* Stops and joins the prefetch thread (a batch half made is dropped), then frees r. NULL: nothing. */
void data_reader_destroy(data_reader *r);
/* Prefetch on (the default) or off. With it, data_reader_start_epoch starts making the
 * epoch's first batch on the reader's thread and each data_reader_next, having handed out a
 * batch, starts the next one; the batches are the same as without (FLINT_TRAIN_PREFETCH
 * turns it off in the trainer, to compare). Turning it off joins the thread; a batch made
 * ahead is dropped and the epoch goes on from the batch after the last one handed out. When
 * the thread or its buffer cannot be had, the reader stays synchronous (with a warning). */
void data_reader_set_prefetch(data_reader *r, bool on);
/* True while the prefetch thread runs (tests). */
bool data_reader_prefetching(const data_reader *r);
/* Makes r a reader of image records (flint/image.h) instead of blocks: each is kept as it
 * is (uint8 at the cache's resolution) and transformed by `t` with the epoch of
 * data_reader_start_epoch as data_reader_next hands it out (images of 3 x t->size x t->size,
 * labels below `classes`). Before any image is added; FL_EINVAL for a bad transform. */
fl_status data_reader_set_transform(data_reader *r, const fl_image_transform *t, uint32_t classes);
/* Copies an image record into a reader with a transform (FL_ECORRUPT otherwise, or for a
 * label out of range). */
fl_status data_reader_add_image(data_reader *r, fl_bytes rec);
/* FL_OK, or the failure (out of memory) that made data_reader_next hand out nothing (kept:
 * later epochs do not clear it). */
fl_status data_reader_status(const data_reader *r);
/* Copies a block into the reader (every block must have the first one's shape). */
fl_status data_reader_add_block(data_reader *r, fl_bytes rec);
/* Adds every record of `in` (a partition of image blocks): DATA_SPLIT_TRAIN blocks to
 * `train`, DATA_SPLIT_TEST blocks to `test` (NULL: an error if there are any), and image
 * records (flint/image.h) to `train`, which must have a transform. */
fl_status data_reader_add_all(fl_iter *in, data_reader *train, data_reader *test);

uint64_t data_reader_images(const data_reader *r);
/* The shape of the images (0 before the first block). */
uint32_t data_reader_channels(const data_reader *r);
uint32_t data_reader_height(const data_reader *r);
uint32_t data_reader_width(const data_reader *r);
uint32_t data_reader_classes(const data_reader *r);
/* Floats per image: channels * height * width. */
size_t data_reader_image_floats(const data_reader *r);
/* Full batches per epoch (images / batch); with partial, the last short one counts too. */
uint64_t data_reader_batches(const data_reader *r, bool partial);

/* Starts an epoch. shuffle: the order is a permutation drawn from (seed, epoch), the same on
 * every run (Fisher-Yates over the reader's images, by their position in the reader: readers
 * of as many images draw the same permutation of positions); else the stored order. max_batches
 * caps the batches handed out (0: no cap): data-parallel ranks must all take the same number
 * of steps, so the trainer passes the smallest count over the ranks. partial: hand out the
 * last short batch (evaluation) instead of dropping it (training: the global batch stays
 * constant, as the linear scaling rule assumes). */
void data_reader_start_epoch(data_reader *r, uint64_t seed, uint32_t epoch, bool shuffle,
                             uint64_t max_batches, bool partial);
/* The next batch into host memory: images (batch * image_floats floats) and labels (batch
 * int32). Returns the images written, 0 at the end of the epoch (or after a transform's
 * failure: see data_reader_status; the thread's message is set as well). With prefetch it
 * blocks until the reader's thread has made the batch, then copies it. */
uint32_t data_reader_next(data_reader *r, float *images, int32_t *labels);

/* Task functions (exported: they reach executors by symbol). */
FL_API fl_status gpu_data_idx_partition(uint32_t partition, fl_iter *in, fl_emitter *out,
                                        const void *arg);
FL_API fl_status gpu_data_synthetic_partition(uint32_t partition, fl_iter *in, fl_emitter *out,
                                              const void *arg);
FL_API fl_status gpu_data_image_partition(uint32_t partition, fl_iter *in, fl_emitter *out,
                                          const void *arg);
FL_API fl_status gpu_data_pair_partition(uint32_t partition, fl_iter *in, fl_emitter *out,
                                         const void *arg);
FL_API fl_status gpu_data_deal_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
FL_API uint32_t gpu_data_rank_partition(fl_bytes key, uint32_t num_partitions, const void *arg);
FL_API fl_status gpu_data_pair_value(fl_bytes rec, fl_buf *out, const void *arg);

#endif /* FLINT_GPU_DATA_H */
