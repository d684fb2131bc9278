/*
 * gpu/data/sources.h: what the files of gpu/data/ share, private to them: seeded numbers, how
 * a partition's images are laid out and emitted as blocks (gpu/data/blocks.c), and each
 * source's partition emitter, which the train-and-test pair calls (gpu/data/pair.c).
 */
#ifndef FLINT_GPU_DATA_SOURCES_H
#define FLINT_GPU_DATA_SOURCES_H

#include "gpu/data/data.h"

/* ---- seeded numbers (splitmix64: each value a pure function of its input) --------------- */

static inline uint64_t data_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* Uniform in [0, 1) from 53 bits. */
static inline double data_unit_of(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

/* ---- a partition's layout and its blocks (gpu/data/blocks.c) ------------------------------ */

/* Fills labels[count] and images with images index, index + stride, ... of the data set. */
typedef fl_status (*data_fill_fn)(const void *ctx, uint64_t index, uint32_t stride, uint32_t count,
                                  int32_t *labels, float *images);

/* A piece of a partition: n images, first, first + stride, ... */
typedef struct data_part_range {
  uint64_t first, n;
  uint32_t stride;
} data_part_range;

/* The k-th piece of partition p of `parts` over `images` images (false after the last).
 * run 0: one contiguous range (the default); run 1: every parts-th image from p (interleave);
 * run r > 1: runs of r consecutive images, the (k parts + p)-th run for k = 0, 1, ... */
bool data_partition_piece(uint64_t images, uint32_t parts, uint32_t p, uint32_t run, uint64_t k,
                          data_part_range *out);

/* Emits partition p's images in blocks (none crossing a piece), filling each with fill();
 * base is added to every image index (a data set that starts further on). */
fl_status data_emit_blocks(fl_emitter *out, uint64_t images_total, uint32_t parts, uint32_t p, uint32_t run,
                           uint64_t base, uint32_t block_images, uint32_t c, uint32_t h, uint32_t w,
                           uint32_t classes, data_split split, data_fill_fn fill, const void *ctx);

/* The run length the tasks' arguments carry: 0 ranges, 1 interleave, r > 1 runs of r. */
uint32_t data_layout_run(const data_options *o);
/* The partitions a data set of `images` gets: the options' count, else the context's cores;
 * at most one per image. */
uint32_t data_partitions_for(fl_context *ctx, const data_options *o, uint64_t images);

/* A data set's source, for data_pair: u32 kind, u32 arg bytes, the partition task's arg. */
enum { SOURCE_IDX = 1, SOURCE_SYNTHETIC = 2, SOURCE_IMAGES = 3, SOURCE_TEXT = 4 };
fl_status data_source_encode(uint32_t kind, const void *arg, size_t len, fl_buf *out);
/* A source's cached blocks: `parts` partitions, one task each running fn(partition, the
 * partition's seed, arg), persisted in memory; *source is (kind, arg), encoded for data_pair.
 * On failure nothing is kept and the outputs are untouched. */
fl_status data_source_load(fl_context *ctx, uint32_t kind, uint32_t parts, fl_map_partitions_fn fn, const void *arg,
                           size_t len, fl_dataset **blocks, fl_buf *source);

/* ---- the sources' partitions, for the pair ------------------------------------------------ */

/* Emits partition `partition` of the IDX source whose task argument is `arg`, as `split`
 * (gpu/data/idx.c). */
fl_status data_idx_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split);
/* The same for synthetic-imagenet (gpu/data/synthetic.c). */
fl_status data_synthetic_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split);
/* The same for byte-level text (gpu/data/text.c). */
fl_status data_text_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split);

#endif /* FLINT_GPU_DATA_SOURCES_H */
