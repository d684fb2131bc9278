/*
 * gpu/data/text.c: byte-level text from any file as a data set of fixed-size records, for the
 * GPT form of the transformer (gpu/parallel/transformer.h): sample i of a split is the window
 * of seq + 1 bytes starting at byte i x seq of that split's part of the file, each byte a
 * float in [0, 256), as a 1 x 1 x (seq + 1) "image" with label 0. The model reads the first
 * seq bytes and predicts the last seq (each the byte after its input byte): consecutive
 * windows share one byte, so that every byte but the first of a split is a target once.
 *
 * The splits: the training set is the file's first bytes, the test set its last tenth
 * (DATA_TEXT_TEST_SHARE; at least one window's worth), so that no test byte was trained on.
 * As for IDX files, the calling process checks the file (that it exists and is long enough
 * for a window in each split) and each partition's task reads its windows from it, so in
 * cluster mode the path must be readable where the executors run.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "gpu/data/sources.h"

#define DEFAULT_BLOCK_WINDOWS 256u

/* The task's argument, followed by the file's absolute path, NUL-terminated. */
typedef struct text_arg {
  uint64_t first;   /* the split's first byte in the file */
  uint64_t windows; /* samples in the split */
  uint32_t seq, parts, block_images;
  uint32_t interleave; /* data_layout_run (0 ranges, 1 single windows, r > 1 runs) */
} text_arg;

typedef struct text_reading {
  const text_arg *a;
  const char *path;
  FILE *f;
  uint8_t *bytes; /* seq + 1 */
} text_reading;

static fl_status text_fill(const void *ctx, uint64_t index, uint32_t stride, uint32_t count, int32_t *labels,
                           float *images) {
  const text_reading *r = ctx;
  size_t per = (size_t)r->a->seq + 1;
  for (uint32_t i = 0; i < count; i++) {
    uint64_t w = index + (uint64_t)i * stride, at = r->a->first + w * r->a->seq;
    if (fseeko(r->f, (off_t)at, SEEK_SET) != 0)
      return fl_set_error(FL_EIO, "%s: cannot seek to byte %llu: %s", r->path, (unsigned long long)at, strerror(errno));
    if (fread(r->bytes, 1, per, r->f) != per)
      return fl_set_error(FL_EFORMAT, "%s: truncated at window %llu (bytes %llu to %llu): the file shrank after "
                          "it was checked", r->path, (unsigned long long)w, (unsigned long long)at,
                          (unsigned long long)(at + per));
    labels[i] = 0;
    for (size_t k = 0; k < per; k++) images[(size_t)i * per + k] = (float)r->bytes[k];
  }
  return FL_OK;
}

fl_status data_text_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split) {
  text_arg a;
  memcpy(&a, arg, sizeof a);
  text_reading r = {.a = &a, .path = (const char *)arg + sizeof a};
  fl_status s = FL_OK;
  if (!(r.f = fopen(r.path, "rb"))) return fl_set_error(FL_EIO, "%s: %s", r.path, strerror(errno));
  if (!(r.bytes = common_malloc((size_t)a.seq + 1))) s = fl_set_error(FL_ENOMEM, "%s: out of memory", r.path);
  if (s == FL_OK)
    s = data_emit_blocks(out, a.windows, a.parts, partition, a.interleave, 0, a.block_images, 1, 1, a.seq + 1,
                         DATA_TEXT_VOCAB, split, text_fill, &r);
  common_free(r.bytes);
  fclose(r.f);
  return s;
}

FL_API fl_status gpu_data_text_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)in;
  return data_text_emit(partition, out, arg, DATA_SPLIT_TRAIN);
}

fl_status data_text_split(uint64_t bytes, uint32_t seq, data_split split, uint64_t *first, uint64_t *windows) {
  uint64_t test = bytes / DATA_TEXT_TEST_SHARE, need = (uint64_t)seq + 1;
  if (test < need) test = need; /* a short file still gets one test window */
  uint64_t train = bytes > test ? bytes - test : 0;
  uint64_t len = split == DATA_SPLIT_TRAIN ? train : test;
  *first = split == DATA_SPLIT_TRAIN ? 0 : train;
  *windows = len >= need ? (len - 1) / seq : 0;
  return FL_OK;
}

fl_status data_load_text(fl_context *ctx, const char *path, uint32_t seq, data_split split, const data_options *opts,
                         data_set *out) {
  if (!ctx || !path || !out) return fl_set_error(FL_EINVAL, "data_load_text: NULL argument");
  if (seq < 1 || seq > DATA_TEXT_MAX_SEQ)
    return fl_set_error(FL_EINVAL, "text %s: windows of %u bytes, must be 1 to %u", path, seq, DATA_TEXT_MAX_SEQ);
  struct stat st;
  if (stat(path, &st) != 0)
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "text %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) return fl_set_error(FL_EINVAL, "text %s: not a regular file", path);
  if (st.st_size == 0) return fl_set_error(FL_EEMPTY, "text %s: the file is empty", path);
  uint64_t first, windows, train_first, train_windows;
  data_text_split((uint64_t)st.st_size, seq, DATA_SPLIT_TRAIN, &train_first, &train_windows);
  data_text_split((uint64_t)st.st_size, seq, split, &first, &windows);
  /* Both splits must hold a window whichever is asked for: a run trains and tests. */
  if (train_windows == 0)
    return fl_set_error(FL_EINVAL, "text %s: %llu bytes are too few for --seq %u: the training part (the first "
                        "nine tenths, after at least %u bytes for the test part) needs at least %u bytes", path,
                        (unsigned long long)st.st_size, seq, seq + 1, seq + 1);
  char abs[PATH_MAX];
  if (!realpath(path, abs)) return fl_set_error(FL_EIO, "text %s: %s", path, strerror(errno));
  data_options o = opts ? *opts : (data_options)DATA_OPTIONS_INIT;
  uint32_t parts = data_partitions_for(ctx, &o, windows);
  text_arg a = {.first = first, .windows = windows, .seq = seq, .parts = parts,
                .block_images = o.block_images ? o.block_images : DEFAULT_BLOCK_WINDOWS,
                .interleave = data_layout_run(&o)};
  fl_buf arg = FL_BUF_INIT, source = FL_BUF_INIT;
  fl_dataset *blocks = NULL;
  fl_status s = fl_buf_append(&arg, &a, sizeof a);
  if (s == FL_OK) s = fl_buf_append(&arg, abs, strlen(abs) + 1);
  if (s == FL_OK) s = data_source_load(ctx, SOURCE_TEXT, parts, gpu_data_text_partition, arg.data, arg.len, &blocks, &source);
  fl_buf_free(&arg);
  if (s != FL_OK) return s;
  *out = (data_set){.blocks = blocks, .images = windows, .channels = 1, .height = 1, .width = seq + 1,
                    .classes = DATA_TEXT_VOCAB, .partitions = parts, .source = source};
  return FL_OK;
}
