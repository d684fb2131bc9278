/*
 * test_gpu_reader: the rank's reader (gpu/data/data.h) with and without prefetch. The two
 * must hand out the same batches bit for bit (blocks and transformed image records, shuffled,
 * over epochs), report a transform's failure at the same batch with its message, and let an
 * epoch restart, prefetch be turned off, or the reader be destroyed while its thread is in the
 * middle of a batch. No test looks at time: whether prefetch hides anything is the
 * benchmark's question (bench_input's train rows).
 */
#include <math.h>
#include <stdbool.h>

#include "test_util.h"

#include "flint/image.h"
#include "gpu/data/data.h"

#define CLASSES 5

/* A block of `count` images of c x h x w starting at image `first`, with values that differ
 * for every image and pixel. */
static void add_blocks(data_reader *r, uint32_t images, uint32_t per_block, uint32_t c, uint32_t h, uint32_t w) {
  size_t per = (size_t)c * h * w;
  float *px = malloc(per_block * per * sizeof *px);
  int32_t *labels = malloc(per_block * sizeof *labels);
  assert_non_null(px);
  assert_non_null(labels);
  fl_buf rec = FL_BUF_INIT;
  for (uint32_t first = 0; first < images; first += per_block) {
    uint32_t count = images - first < per_block ? images - first : per_block;
    for (uint32_t i = 0; i < count; i++) {
      labels[i] = (int32_t)((first + i) % CLASSES);
      for (size_t k = 0; k < per; k++) px[i * per + k] = (float)(first + i) + (float)k / (float)per;
    }
    assert_ok(data_block_encode(count, c, h, w, CLASSES, DATA_SPLIT_TRAIN, first, 1, labels, px, &rec));
    assert_ok(data_reader_add_block(r, fl_buf_bytes(&rec)));
  }
  fl_buf_free(&rec);
  free(labels);
  free(px);
}

/* Image record i: a cached image of its own size and pixels. */
static void image_record(uint64_t i, fl_buf *rec) {
  uint32_t h = 20 + (uint32_t)(i % 7), w = 24 + (uint32_t)(i % 5);
  uint8_t *px = malloc((size_t)h * w * 3);
  assert_non_null(px);
  uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
  for (size_t k = 0; k < (size_t)h * w * 3; k++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    px[k] = (uint8_t)(x >> 56);
  }
  assert_ok(fl_image_record_encode((int32_t)(i % CLASSES), i, h, w, px, rec));
  free(px);
}

static fl_image_transform train_transform(uint32_t size) {
  fl_image_transform t = FL_IMAGE_TRAIN_INIT;
  t.size = size;
  t.seed = 42;
  return t;
}

/* A reader of `images` image records (added in reverse order with `reverse`). */
static data_reader *image_reader(uint32_t batch, uint32_t images, uint32_t size, bool reverse, bool prefetch) {
  data_reader *r = NULL;
  assert_ok(data_reader_create(batch, &r));
  data_reader_set_prefetch(r, prefetch);
  fl_image_transform t = train_transform(size);
  assert_ok(data_reader_set_transform(r, &t, CLASSES));
  fl_buf rec = FL_BUF_INIT;
  for (uint32_t k = 0; k < images; k++) {
    image_record(reverse ? images - 1 - k : k, &rec);
    assert_ok(data_reader_add_image(r, fl_buf_bytes(&rec)));
  }
  fl_buf_free(&rec);
  return r;
}

/* Every batch of an epoch of both readers, compared bit for bit; returns the batches. */
static uint32_t same_epoch(data_reader *a, data_reader *b, uint64_t seed, uint32_t epoch, bool shuffle,
                           uint64_t max_batches, bool partial) {
  size_t per = data_reader_image_floats(a), batch = 64;
  assert_int_equal(per, data_reader_image_floats(b));
  float *xa = malloc(batch * per * sizeof *xa), *xb = malloc(batch * per * sizeof *xb);
  int32_t ya[64], yb[64];
  assert_non_null(xa);
  assert_non_null(xb);
  data_reader_start_epoch(a, seed, epoch, shuffle, max_batches, partial);
  data_reader_start_epoch(b, seed, epoch, shuffle, max_batches, partial);
  uint32_t batches = 0, na, nb;
  do {
    na = data_reader_next(a, xa, ya);
    nb = data_reader_next(b, xb, yb);
    assert_int_equal(na, nb);
    assert_true(na <= batch);
    if (na) {
      assert_memory_equal(ya, yb, na * sizeof *ya);
      assert_memory_equal(xa, xb, na * per * sizeof *xa);
      batches++;
    }
  } while (na);
  assert_int_equal(data_reader_status(a), FL_OK);
  assert_int_equal(data_reader_status(b), FL_OK);
  free(xa);
  free(xb);
  return batches;
}

static void test_prefetch_same_blocks(void **state) {
  (void)state;
  data_reader *on = NULL, *off = NULL;
  assert_ok(data_reader_create(7, &on));
  assert_ok(data_reader_create(7, &off));
  data_reader_set_prefetch(off, false);
  add_blocks(on, 50, 16, 2, 3, 5);
  add_blocks(off, 50, 16, 2, 3, 5);
  assert_false(data_reader_prefetching(on)); /* started by the first epoch */
  for (uint32_t epoch = 0; epoch < 2; epoch++) {
    assert_int_equal(same_epoch(on, off, 9, epoch, true, 0, false), 7); /* 50 / 7: the short one dropped */
    assert_true(data_reader_prefetching(on));
    assert_false(data_reader_prefetching(off));
    assert_int_equal(same_epoch(on, off, 9, epoch, true, 0, true), 8);   /* and handed out */
    assert_int_equal(same_epoch(on, off, 9, epoch, false, 3, false), 3); /* capped */
  }
  data_reader_destroy(on);
  data_reader_destroy(off);
}

static void test_prefetch_same_augmented_images(void **state) {
  (void)state;
  enum { N = 37, B = 8, S = 12 };
  data_reader *on = image_reader(B, N, S, false, true), *off = image_reader(B, N, S, false, false);
  size_t per = data_reader_image_floats(on);
  assert_int_equal(per, 3 * S * S);
  for (uint32_t epoch = 0; epoch < 2; epoch++) {
    assert_int_equal(same_epoch(on, off, 3, epoch, true, 0, false), N / B);
    assert_int_equal(same_epoch(on, off, 3, epoch, true, 0, true), (N + B - 1) / B);
  }
  /* The draws are the image's: unshuffled, batch slot j of a reader holding the images in
   * reverse order is image N-1-j transformed as fl_image_transform_apply does it alone, and
   * each epoch crops anew. */
  data_reader *rev = image_reader(N, N, S, true, true);
  float *x = malloc(N * per * sizeof *x), *one = malloc(per * sizeof *one), *first = malloc(per * sizeof *first);
  int32_t y[N], label;
  assert_non_null(x);
  assert_non_null(one);
  assert_non_null(first);
  fl_image_transform t = train_transform(S);
  fl_buf rec = FL_BUF_INIT;
  for (uint32_t epoch = 0; epoch < 2; epoch++) {
    data_reader_start_epoch(rev, 3, epoch, false, 0, false);
    assert_int_equal(data_reader_next(rev, x, y), N);
    for (uint32_t j = 0; j < N; j++) {
      image_record(N - 1 - j, &rec);
      assert_ok(fl_image_transform_apply(&t, epoch, fl_buf_bytes(&rec), one, &label));
      assert_int_equal(y[j], label);
      assert_memory_equal(x + j * per, one, per * sizeof *one);
    }
    if (epoch == 0) memcpy(first, x, per * sizeof *first);
    else assert_true(memcmp(first, x, per * sizeof *first) != 0);
  }
  fl_buf_free(&rec);
  free(first);
  free(one);
  free(x);
  data_reader_destroy(rev);
  data_reader_destroy(on);
  data_reader_destroy(off);
}

/* The batches a reader hands out in epoch 1 with the allocation after `fail_after` more
 * failing (the reader's thread, or this one, makes every allocation meanwhile), until the
 * failure: returns their number, and the message in why. Epoch 0 runs first, so that the
 * prefetch thread and its buffer exist before the count starts. Then, with allocations
 * back, the same epoch goes on from the failed batch: *after gets that batch. */
static uint32_t batches_before_failure(data_reader *r, long fail_after, char *why, size_t len, float *after) {
  size_t per = data_reader_image_floats(r);
  float *x = malloc(8 * per * sizeof *x);
  int32_t y[8];
  assert_non_null(x);
  data_reader_start_epoch(r, 5, 0, true, 0, false);
  while (data_reader_next(r, x, y) > 0) {
  }
  assert_int_equal(data_reader_status(r), FL_OK);
  flint_test_fail_alloc_after(fail_after);
  data_reader_start_epoch(r, 5, 1, true, 0, false);
  uint32_t batches = 0;
  while (data_reader_next(r, x, y) == 8) batches++;
  flint_test_fail_alloc_after(-1);
  assert_int_equal(data_reader_status(r), FL_ENOMEM);
  snprintf(why, len, "%s", fl_last_error());
  assert_int_equal(data_reader_next(r, after, y), 8); /* the failed batch, made again */
  assert_int_equal(data_reader_status(r), FL_ENOMEM); /* kept on the reader */
  free(x);
  return batches;
}

static void test_prefetch_failure_same_batch(void **state) {
  (void)state;
  enum { N = 40, B = 8, S = 10 };
  data_reader *on = image_reader(B, N, S, false, true), *off = image_reader(B, N, S, false, false);
  size_t per = data_reader_image_floats(on);
  float *after_on = malloc(B * per * sizeof(float)), *after_off = malloc(B * per * sizeof(float));
  assert_non_null(after_on);
  assert_non_null(after_off);
  char why_on[512], why_off[512];
  /* Far enough in that some batches come out first: a transform allocates 3 to 9 times an
   * image (its output, the resampling's taps and rows). */
  long fail_after = 10 * B + 3;
  uint32_t b_off = batches_before_failure(off, fail_after, why_off, sizeof why_off, after_off);
  uint32_t b_on = batches_before_failure(on, fail_after, why_on, sizeof why_on, after_on);
  assert_true(b_off >= 1 && b_off < N / B);
  assert_int_equal(b_on, b_off);
  /* The prefetch thread's message reaches the caller's thread. */
  assert_non_null(strstr(why_off, "out of memory"));
  assert_string_equal(why_on, why_off);
  assert_memory_equal(after_on, after_off, B * per * sizeof(float));
  free(after_on);
  free(after_off);
  data_reader_destroy(on);
  data_reader_destroy(off);
}

/* An epoch restarted, or prefetch turned off, while the thread makes a batch; a reader
 * destroyed then (ASan and the time bound catch a leak or a hang). */
static void test_prefetch_stop_mid_epoch(void **state) {
  (void)state;
  enum { N = 48, B = 16, S = 40 }; /* batches that take the thread a while */
  data_reader *on = image_reader(B, N, S, false, true), *off = image_reader(B, N, S, false, false);
  size_t per = data_reader_image_floats(on);
  float *x = malloc(B * per * sizeof *x), *ref = malloc(B * per * sizeof *ref);
  int32_t y[B], yref[B];
  assert_non_null(x);
  assert_non_null(ref);
  for (int round = 0; round < 3; round++) {
    /* One batch, then the epoch again from its start: the same batches as a fresh one. */
    data_reader_start_epoch(on, 1, 0, true, 0, false);
    assert_int_equal(data_reader_next(on, x, y), B);
    data_reader_start_epoch(on, 1, 2, true, 0, false); /* another epoch, even */
    data_reader_start_epoch(on, 1, 0, true, 0, false);
    assert_int_equal(same_epoch(on, off, 1, 0, true, 0, false), N / B);
  }
  /* Prefetch off after one batch: the epoch goes on from the second, made on demand. */
  data_reader_start_epoch(on, 1, 1, true, 0, false);
  data_reader_start_epoch(off, 1, 1, true, 0, false);
  assert_int_equal(data_reader_next(on, x, y), B);
  assert_int_equal(data_reader_next(off, ref, yref), B);
  data_reader_set_prefetch(on, false);
  assert_false(data_reader_prefetching(on));
  for (int k = 1; k < N / B; k++) {
    assert_int_equal(data_reader_next(on, x, y), B);
    assert_int_equal(data_reader_next(off, ref, yref), B);
    assert_memory_equal(x, ref, B * per * sizeof *x);
    assert_memory_equal(y, yref, sizeof y);
  }
  assert_int_equal(data_reader_next(on, x, y), 0);
  /* On again: a thread anew with the next epoch. */
  data_reader_set_prefetch(on, true);
  assert_int_equal(same_epoch(on, off, 1, 2, true, 0, false), N / B);
  assert_true(data_reader_prefetching(on));
  /* Destroyed while the thread makes the second batch, and right after an epoch's start. */
  data_reader_start_epoch(on, 1, 3, true, 0, false);
  assert_int_equal(data_reader_next(on, x, y), B);
  data_reader_destroy(on);
  on = image_reader(B, N, S, false, true);
  data_reader_start_epoch(on, 1, 3, true, 0, false);
  data_reader_destroy(on);
  /* Blocks added after an epoch (the arrays move): the thread is stopped first. */
  data_reader *blocks = NULL;
  assert_ok(data_reader_create(4, &blocks));
  add_blocks(blocks, 20, 8, 1, 2, 2);
  data_reader_start_epoch(blocks, 0, 0, false, 0, false);
  add_blocks(blocks, 20, 8, 1, 2, 2);
  assert_int_equal(data_reader_images(blocks), 40);
  data_reader_start_epoch(blocks, 0, 0, false, 0, true);
  uint32_t batches = 0;
  float bx[16];
  int32_t by[4];
  while (data_reader_next(blocks, bx, by)) batches++;
  assert_int_equal(batches, 10);
  data_reader_destroy(blocks);
  data_reader_destroy(NULL);
  free(x);
  free(ref);
  data_reader_destroy(off);
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_prefetch_same_blocks),
      T(test_prefetch_same_augmented_images),
      T(test_prefetch_failure_same_batch),
      T(test_prefetch_stop_mid_epoch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
