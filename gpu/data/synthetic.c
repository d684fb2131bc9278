/*
 * gpu/data/synthetic.c: synthetic-imagenet, images made by the tasks from (seed, index) alone
 * (gpu/data/data.h says what they look like).
 */
#include <math.h>
#include <string.h>

#include "gpu/data/sources.h"


#define IMNET_C DATA_IMAGENET_CHANNELS
#define IMNET_S DATA_IMAGENET_SIZE

void data_synthetic_image(uint64_t seed, uint64_t index, float *image, int32_t *label) {
  uint64_t base = data_mix64(seed ^ 0x5157a1d3u);
  uint32_t cls = (uint32_t)(data_mix64(base ^ data_mix64(index)) % DATA_IMAGENET_CLASSES);
  *label = (int32_t)cls;
  /* Noise: xorshift64* seeded from (seed, index). */
  uint64_t x = data_mix64(base + 0x632be59bd9b4e019ull * (index + 1)) | 1;
  for (int c = 0; c < IMNET_C; c++) {
    uint64_t k = data_mix64(base ^ ((uint64_t)cls << 8 | (uint64_t)c));
    double mean = data_unit_of(data_mix64(k + 1)) - 0.5;
    double fy = 0.02 + 0.2 * data_unit_of(data_mix64(k + 2)), py = 6.283185307179586 * data_unit_of(data_mix64(k + 3));
    double fx = 0.02 + 0.2 * data_unit_of(data_mix64(k + 4)), pxh = 6.283185307179586 * data_unit_of(data_mix64(k + 5));
    float row[IMNET_S], col[IMNET_S];
    for (int i = 0; i < IMNET_S; i++) {
      row[i] = (float)(mean + 0.25 * sin(fy * i + py));
      col[i] = (float)(0.25 * sin(fx * i + pxh));
    }
    float *plane = image + (size_t)c * IMNET_S * IMNET_S;
    for (int i = 0; i < IMNET_S; i++)
      for (int j = 0; j < IMNET_S; j++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        float noise = (float)((x * 0x2545f4914f6cdd1dull) >> 40) * 0x1.0p-24f - 0.5f;
        plane[i * IMNET_S + j] = row[i] + col[j] + noise;
      }
  }
}

typedef struct synth_arg {
  uint64_t seed, first, count;
  uint32_t parts, block_images;
  uint32_t interleave, pad; /* interleave: data_layout_run (0 ranges, 1 single images, r > 1 runs) */
} synth_arg;

static fl_status synth_fill(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                            float *images) {
  const synth_arg *a = ctx;
  size_t per = (size_t)IMNET_C * IMNET_S * IMNET_S;
  for (uint32_t i = 0; i < count; i++)
    data_synthetic_image(a->seed, index + (uint64_t)i * stride, images + i * per, &labels[i]);
  return FL_OK;
}

fl_status data_synthetic_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
  synth_arg a;
  memcpy(&a, arg, sizeof a);
  return data_emit_blocks(out, a.count, a.parts, partition, a.interleave, a.first, a.block_images, IMNET_C, IMNET_S,
                     IMNET_S, DATA_IMAGENET_CLASSES, split, synth_fill, &a);
}

FL_API fl_status gpu_data_synthetic_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return data_synthetic_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

fl_status data_synthetic_imagenet(fl_context *ctx, uint64_t seed, uint64_t first, uint64_t count,
                                  const data_options *opts, data_set *out) {
  if (!ctx || !out) return fl_set_error(FL_EINVAL, "data_synthetic_imagenet: NULL argument");
  if (count == 0) return fl_set_error(FL_EINVAL, "synthetic-imagenet: 0 images");
  if (count > (1ull << 40) || first > (1ull << 62))
    return fl_set_error(FL_EINVAL, "synthetic-imagenet: %llu images from %llu", (unsigned long long)count,
                        (unsigned long long)first);
  data_options o = opts ? *opts : (data_options)DATA_OPTIONS_INIT;
  uint32_t parts = data_partitions_for(ctx, &o, count);
  /* An image is 588 KiB: blocks of 16 keep a record near 10 MiB. */
  synth_arg a = {.seed = seed, .first = first, .count = count, .parts = parts,
                 .block_images = o.block_images ? o.block_images : 16, .interleave = data_layout_run(&o)};
  fl_dataset *blocks = NULL;
  fl_buf source = FL_BUF_INIT;
  fl_status s = data_source_load(ctx, SOURCE_SYNTHETIC, parts, gpu_data_synthetic_partition, &a, sizeof a, &blocks, &source);
  if (s != FL_OK) return s;
  *out = (data_set){.blocks = blocks, .images = count, .channels = IMNET_C, .height = IMNET_S, .width = IMNET_S,
                    .classes = DATA_IMAGENET_CLASSES, .partitions = parts, .source = source};
  return FL_OK;
}
