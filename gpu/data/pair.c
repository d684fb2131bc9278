/*
 * gpu/data/pair.c: a training set and a test set as one data set, partition r holding both
 * sets' partition r (the input of a barrier stage whose rank r trains and evaluates).
 */
#include <string.h>

#include "gpu/data/image_internal.h"
#include "gpu/data/sources.h"


/* Emits partition `partition` of the source at *p (advancing *p past it). */
static fl_status source_emit(uint32_t partition, fl_emitter *out, const uint8_t **p, data_split split) {
  uint32_t head[2];
  memcpy(head, *p, 8);
  const uint8_t *arg = *p + 8;
  *p = arg + head[1];
  switch (head[0]) {
  case SOURCE_IDX: return data_idx_emit(partition, out, arg, split);
  case SOURCE_SYNTHETIC: return data_synthetic_emit(partition, out, arg, split);
  case SOURCE_IMAGES: return data_image_emit(partition, out, arg, split);
  case SOURCE_TEXT: return data_text_emit(partition, out, arg, split);
  default: return fl_set_error(FL_EINTERNAL, "image blocks: unknown source %u", head[0]);
  }
}

FL_API fl_status gpu_data_pair_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  const uint8_t *p = arg;
  fl_status s = source_emit(partition, out, &p, DATA_SPLIT_TRAIN);
  return s == FL_OK ? source_emit(partition, out, &p, DATA_SPLIT_TEST) : s;
}

fl_status data_pair(fl_context *ctx, const data_set *train, const data_set *test, fl_dataset **out) {
  if (!ctx || !train || !test || !out) return fl_set_error(FL_EINVAL, "data_pair: NULL argument");
  if (!train->source.len || !test->source.len) return fl_set_error(FL_EINVAL, "data_pair: a data set without a source");
  if (train->partitions != test->partitions)
    return fl_set_error(FL_EINVAL, "data_pair: %u training partitions but %u test partitions", train->partitions,
                        test->partitions);
  fl_buf arg = FL_BUF_INIT;
  fl_dataset *seeds = NULL, *pair = NULL;
  fl_status s = fl_buf_append(&arg, train->source.data, train->source.len);
  if (s == FL_OK) s = fl_buf_append(&arg, test->source.data, test->source.len);
  if (s == FL_OK) s = fl_range(ctx, 0, train->partitions, 1, train->partitions, &seeds);
  if (s == FL_OK) s = fl_map_partitions(seeds, gpu_data_pair_partition, arg.data, arg.len, &pair);
  if (s == FL_OK) s = fl_persist(pair, FL_MEMORY_ONLY);
  fl_dataset_free(seeds);
  fl_buf_free(&arg);
  if (s != FL_OK) {
    fl_dataset_free(pair);
    return s;
  }
  *out = pair;
  return FL_OK;
}
