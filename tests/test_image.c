/*
 * test_image: the image-folder source and the ImageNet transforms (include/flint/image.h),
 * and `flint train --data imagefolder:DIR`. Every image is written here with libjpeg and
 * libpng themselves into a temporary folder (no download).
 *
 * Listing rules checked (image.h says them): classes are the subfolders not starting with
 * '.', sorted bytewise; in a class folder only .jpg/.jpeg/.png files (any case, not hidden)
 * count, files elsewhere are ignored; an empty class folder is FL_EEMPTY unless allow_empty.
 *
 * It links the shared libflint and libflint_gpu (the local-cluster test's executors load the
 * decode task from libflint_gpu.so by symbol); $FLINT_BIN/flint is the command.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#include <jpeglib.h> /* after stdio.h: it uses FILE and size_t */
#include <png.h>

#define TEST_TIME_BOUND_S 240
#include "test_util.h"
#include "run_child.h"

#include "flint/image.h"
#include "gpu/parallel/train.h"

static char tmp_dir[PATH_MAX];

/* ---- writing images -------------------------------------------------------------------- */

/* A known pattern: every pixel's bytes differ with x, y and the channel. */
static uint8_t pattern(uint32_t x, uint32_t y, int c) { return (uint8_t)((x * (3 + c) + y * (7 - 2 * c) + 40 * c) & 255); }

static uint8_t *make_pattern(uint32_t w, uint32_t h) {
  uint8_t *p = malloc((size_t)w * h * 3);
  assert_non_null(p);
  for (uint32_t y = 0; y < h; y++)
    for (uint32_t x = 0; x < w; x++)
      for (int c = 0; c < 3; c++) p[((size_t)y * w + x) * 3 + c] = pattern(x, y, c);
  return p;
}

/* A smooth image (JPEG keeps it within a few levels), tinted by `tint`. */
static uint8_t *make_smooth(uint32_t w, uint32_t h, int tint) {
  uint8_t *p = malloc((size_t)w * h * 3);
  assert_non_null(p);
  for (uint32_t y = 0; y < h; y++)
    for (uint32_t x = 0; x < w; x++) {
      p[((size_t)y * w + x) * 3 + 0] = (uint8_t)(40 + 150 * x / w + (tint ? 40 : 0));
      p[((size_t)y * w + x) * 3 + 1] = (uint8_t)(60 + 120 * y / h);
      p[((size_t)y * w + x) * 3 + 2] = (uint8_t)(tint ? 30 : 200);
    }
  return p;
}

/* fmt: PNG_FORMAT_RGB, _GRAY or _RGBA, with data of 3, 1 or 4 bytes a pixel. */
static void write_png(const char *path, uint32_t w, uint32_t h, uint32_t fmt, const uint8_t *data) {
  png_image img;
  memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = w;
  img.height = h;
  img.format = fmt;
  assert_true(png_image_write_to_file(&img, path, 0, data, 0, NULL));
}

/* The JPEG colour models the tests write: data has 1, 3 or 4 bytes a pixel. CMYK and YCCK
 * get libjpeg's Adobe marker, as Photoshop's files have. */
typedef enum jpeg_model { JPEG_GRAY, JPEG_RGB, JPEG_CMYK, JPEG_YCCK } jpeg_model;

static void write_jpeg_as(const char *path, uint32_t w, uint32_t h, const uint8_t *data, int quality,
                          jpeg_model model) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = w;
  c.image_height = h;
  int bpp = model == JPEG_GRAY ? 1 : model == JPEG_RGB ? 3 : 4;
  c.input_components = bpp;
  c.in_color_space = model == JPEG_GRAY ? JCS_GRAYSCALE : model == JPEG_RGB ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  if (model == JPEG_YCCK) jpeg_set_colorspace(&c, JCS_YCCK);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < h) {
    JSAMPROW row = (JSAMPROW)(data + (size_t)c.next_scanline * w * bpp);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  assert_int_equal(fclose(f), 0);
}

static void write_jpeg(const char *path, uint32_t w, uint32_t h, const uint8_t *data, int quality, bool gray) {
  write_jpeg_as(path, w, h, data, quality, gray ? JPEG_GRAY : JPEG_RGB);
}

static void path_of(char *buf, size_t len, const char *rel) {
  int n = snprintf(buf, len, "%s/%s", tmp_dir, rel);
  assert_true(n > 0 && (size_t)n < len);
}

static void mkdir_rel(const char *rel) {
  char p[PATH_MAX];
  path_of(p, sizeof p, rel);
  assert_int_equal(mkdir(p, 0755), 0);
}

static void jpeg_rel(const char *rel, uint32_t w, uint32_t h, int tint) {
  char p[PATH_MAX];
  path_of(p, sizeof p, rel);
  uint8_t *px = make_smooth(w, h, tint);
  write_jpeg(p, w, h, px, 95, false);
  free(px);
}

static void png_rel(const char *rel, uint32_t w, uint32_t h) {
  char p[PATH_MAX];
  path_of(p, sizeof p, rel);
  uint8_t *px = make_pattern(w, h);
  write_png(p, w, h, PNG_FORMAT_RGB, px);
  free(px);
}

static void text_rel(const char *rel, const char *text) {
  char p[PATH_MAX];
  path_of(p, sizeof p, rel);
  test_write_file(p, text, strlen(text));
}

/* The listing tree: classes a_cls (one JPEG) and b_cls (a JPEG and a PNG), with files that do
 * not count: a text file, a hidden image, a file in the root, a hidden folder, a folder
 * inside a class. */
static void make_tree(const char *root) {
  char rel[256];
  mkdir_rel(root);
  snprintf(rel, sizeof rel, "%s/b_cls", root), mkdir_rel(rel);
  snprintf(rel, sizeof rel, "%s/a_cls", root), mkdir_rel(rel);
  snprintf(rel, sizeof rel, "%s/.hidden", root), mkdir_rel(rel);
  snprintf(rel, sizeof rel, "%s/.hidden/x.jpg", root), jpeg_rel(rel, 20, 10, 0);
  snprintf(rel, sizeof rel, "%s/a_cls/img.JPEG", root), jpeg_rel(rel, 40, 30, 0);
  snprintf(rel, sizeof rel, "%s/b_cls/x.PNG", root), png_rel(rel, 30, 40);
  snprintf(rel, sizeof rel, "%s/b_cls/a.jpg", root), jpeg_rel(rel, 50, 20, 1);
  snprintf(rel, sizeof rel, "%s/b_cls/notes.txt", root), text_rel(rel, "not an image");
  snprintf(rel, sizeof rel, "%s/b_cls/.skip.jpg", root), text_rel(rel, "hidden");
  snprintf(rel, sizeof rel, "%s/b_cls/sub", root), mkdir_rel(rel);
  snprintf(rel, sizeof rel, "%s/b_cls/sub/deep.jpg", root), jpeg_rel(rel, 20, 10, 0);
  snprintf(rel, sizeof rel, "%s/readme.txt", root), text_rel(rel, "top");
}

static fl_context *open_local(void) {
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  return ctx;
}

/* ---- listing and decoding ------------------------------------------------------------- */

static void test_listing_and_labels(void **state) {
  (void)state;
  make_tree("list");
  char root[PATH_MAX];
  path_of(root, sizeof root, "list");
  fl_context *ctx = open_local();
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.cache_size = 16;
  fo.partitions = 2;
  fl_dataset *ds;
  fl_image_classes *cls;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, &cls));
  assert_int_equal(fl_image_classes_count(cls), 2);
  assert_string_equal(fl_image_classes_name(cls, 0), "a_cls");
  assert_string_equal(fl_image_classes_name(cls, 1), "b_cls");
  assert_null(fl_image_classes_name(cls, 2));
  assert_int_equal(fl_image_classes_images(cls), 3);
  assert_int_equal(fl_dataset_partitions(ds), 2);
  uint64_t n;
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 3);
  fl_records *recs;
  assert_ok(fl_collect(ds, &recs));
  assert_int_equal(fl_records_count(recs), 3);
  /* Listing order: a_cls/img.JPEG, b_cls/a.jpg, b_cls/x.PNG; shorter side to 16. */
  static const struct { int32_t label; uint32_t w, h; } want[] = {{0, 21, 16}, {1, 40, 16}, {1, 16, 21}};
  for (size_t i = 0; i < 3; i++) {
    fl_image_view v;
    assert_ok(fl_image_record_view(fl_records_get(recs, i), &v));
    assert_int_equal(v.index, i);
    assert_int_equal(v.label, want[i].label);
    assert_int_equal(v.width, want[i].w);
    assert_int_equal(v.height, want[i].h);
    assert_int_equal(v.channels, 3);
  }
  fl_records_free(recs);
  fl_image_classes_free(cls);
  fl_dataset_free(ds);
  fl_context_close(ctx);
}

static void test_decode_png_exact(void **state) {
  (void)state;
  const uint32_t w = 37, h = 23;
  char p[PATH_MAX];
  uint8_t *rgb = make_pattern(w, h), *out;
  uint32_t oh, ow;
  /* RGB: exact. */
  path_of(p, sizeof p, "rgb.png");
  write_png(p, w, h, PNG_FORMAT_RGB, rgb);
  assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
  assert_int_equal(ow, w);
  assert_int_equal(oh, h);
  assert_memory_equal(out, rgb, (size_t)w * h * 3);
  fl_free(out);
  /* Grayscale: replicated into the three channels. */
  uint8_t gray[37 * 23];
  for (size_t i = 0; i < sizeof gray; i++) gray[i] = (uint8_t)(i * 7);
  path_of(p, sizeof p, "gray.png");
  write_png(p, w, h, PNG_FORMAT_GRAY, gray);
  assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
  for (size_t i = 0; i < sizeof gray; i++)
    for (int c = 0; c < 3; c++) assert_int_equal(out[3 * i + c], gray[i]);
  fl_free(out);
  /* RGBA: the alpha dropped, the colours kept as they are (not composited). */
  uint8_t *rgba = malloc((size_t)w * h * 4);
  assert_non_null(rgba);
  for (size_t i = 0; i < (size_t)w * h; i++) {
    memcpy(rgba + 4 * i, rgb + 3 * i, 3);
    rgba[4 * i + 3] = (uint8_t)(i % 3 == 0 ? 0 : 255 - i % 200);
  }
  path_of(p, sizeof p, "rgba.png");
  write_png(p, w, h, PNG_FORMAT_RGBA, rgba);
  assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
  assert_memory_equal(out, rgb, (size_t)w * h * 3);
  fl_free(out);
  free(rgba);
  free(rgb);
}

static void test_decode_jpeg_close(void **state) {
  (void)state;
  const uint32_t w = 64, h = 48;
  char p[PATH_MAX];
  uint8_t *rgb = make_smooth(w, h, 0), *out;
  uint32_t oh, ow;
  path_of(p, sizeof p, "smooth.jpg");
  write_jpeg(p, w, h, rgb, 95, false);
  assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
  assert_int_equal(ow, w);
  assert_int_equal(oh, h);
  double sum = 0;
  int worst = 0;
  for (size_t i = 0; i < (size_t)w * h * 3; i++) {
    int d = abs((int)out[i] - rgb[i]);
    sum += d;
    if (d > worst) worst = d;
  }
  assert_true(sum / (w * h * 3) < 2.0); /* q95 of a smooth image: about a level on average */
  assert_true(worst <= 12);
  fl_free(out);
  /* Grayscale JPEG: three equal channels. */
  uint8_t gray[64 * 48];
  for (size_t i = 0; i < sizeof gray; i++) gray[i] = (uint8_t)(50 + (i % 64) * 2);
  path_of(p, sizeof p, "gray.jpg");
  write_jpeg(p, w, h, gray, 95, true);
  assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
  for (size_t i = 0; i < sizeof gray; i++) {
    assert_int_equal(out[3 * i], out[3 * i + 1]);
    assert_int_equal(out[3 * i], out[3 * i + 2]);
    assert_true(abs((int)out[3 * i] - gray[i]) <= 8);
  }
  fl_free(out);
  /* CMYK and YCCK JPEGs as Photoshop writes them (inverted inks): (r, g, b, 255) is no black
   * ink and reads back as (r, g, b). */
  uint8_t *cmyk = malloc((size_t)w * h * 4);
  assert_non_null(cmyk);
  for (size_t i = 0; i < (size_t)w * h; i++) {
    memcpy(cmyk + 4 * i, rgb + 3 * i, 3);
    cmyk[4 * i + 3] = 255;
  }
  for (int ycck = 0; ycck < 2; ycck++) {
    path_of(p, sizeof p, ycck ? "ycck.jpg" : "cmyk.jpg");
    write_jpeg_as(p, w, h, cmyk, 95, ycck ? JPEG_YCCK : JPEG_CMYK);
    assert_ok(fl_image_decode_file(p, 0, &out, &oh, &ow));
    assert_int_equal(ow, w);
    assert_int_equal(oh, h);
    double csum = 0;
    for (size_t i = 0; i < (size_t)w * h * 3; i++) csum += abs((int)out[i] - rgb[i]);
    if (!(csum / (w * h * 3) < 3.0)) fprintf(stderr, "%s: mean error %.2f\n", p, csum / (w * h * 3));
    assert_true(csum / (w * h * 3) < 3.0);
    fl_free(out);
  }
  free(cmyk);
  /* DCT scaling: a shorter side of 48 decoded at 1/2 keeps it >= 20. */
  assert_ok(fl_image_decode_file(p, 20, &out, &oh, &ow));
  assert_int_equal(ow, 32);
  assert_int_equal(oh, 24);
  fl_free(out);
  free(rgb);
}

static void test_decode_errors_name_the_file(void **state) {
  (void)state;
  char p[PATH_MAX];
  uint8_t *out;
  uint32_t oh, ow;
  path_of(p, sizeof p, "missing.jpg");
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_ENOENT, "missing.jpg");
  path_of(p, sizeof p, "text.png");
  test_write_file(p, "hello", 5);
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_EFORMAT, "text.png");
  path_of(p, sizeof p, "empty.jpg");
  test_write_file(p, "", 0);
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_EFORMAT, "empty.jpg");
  /* A JPEG cut in half, and one with garbage after its magic. */
  uint8_t *rgb = make_smooth(64, 48, 0);
  path_of(p, sizeof p, "whole.jpg");
  write_jpeg(p, 64, 48, rgb, 90, false);
  free(rgb);
  FILE *f = fopen(p, "rb");
  assert_non_null(f);
  uint8_t buf[65536];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  path_of(p, sizeof p, "cut.jpg");
  test_write_file(p, buf, len / 2);
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_EFORMAT, "cut.jpg");
  memset(buf + 3, 0x5a, 200);
  path_of(p, sizeof p, "garbage.jpg");
  test_write_file(p, buf, len);
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_EFORMAT, "garbage.jpg");
  /* A PNG cut short. */
  uint8_t *pat = make_pattern(40, 40);
  path_of(p, sizeof p, "whole.png");
  write_png(p, 40, 40, PNG_FORMAT_RGB, pat);
  free(pat);
  f = fopen(p, "rb");
  assert_non_null(f);
  len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  path_of(p, sizeof p, "cut.png");
  test_write_file(p, buf, len - 30);
  assert_fails_with(fl_image_decode_file(p, 0, &out, &oh, &ow), FL_EFORMAT, "cut.png");
}

static void test_resize(void **state) {
  (void)state;
  /* The identity is exact. */
  uint8_t *src = make_pattern(30, 20), dst[30 * 20 * 3];
  assert_ok(fl_image_resize(src, 30, 20, 0, 0, 30, 20, 30, 20, dst));
  assert_memory_equal(dst, src, sizeof dst);
  free(src);
  /* A constant image stays constant, shrunk or grown. */
  uint8_t flat[17 * 13 * 3], big[40 * 31 * 3], small[5 * 4 * 3];
  for (size_t i = 0; i < sizeof flat; i++) flat[i] = (uint8_t)(i % 3 == 0 ? 10 : i % 3 == 1 ? 128 : 250);
  assert_ok(fl_image_resize(flat, 17, 13, 0, 0, 17, 13, 40, 31, big));
  for (size_t i = 0; i < sizeof big; i++) assert_int_equal(big[i], flat[i % 3]);
  assert_ok(fl_image_resize(flat, 17, 13, 0, 0, 17, 13, 5, 4, small));
  for (size_t i = 0; i < sizeof small; i++) assert_int_equal(small[i], flat[i % 3]);
  /* A ramp v(x) = 2x halved: the (antialiased, symmetric) filter keeps a linear function
   * at the output pixels' centres, 2 (2o + 0.5) = 4o + 1, away from the edges. */
  uint8_t ramp[128 * 2 * 3], half[64 * 1 * 3];
  for (uint32_t y = 0; y < 2; y++)
    for (uint32_t x = 0; x < 128; x++)
      for (int c = 0; c < 3; c++) ramp[(y * 128 + x) * 3 + c] = (uint8_t)(2 * x);
  assert_ok(fl_image_resize(ramp, 128, 2, 0, 0, 128, 2, 64, 1, half));
  for (uint32_t o = 1; o < 63; o++) assert_int_equal(half[o * 3], 4 * o + 1);
  /* A box outside the image is refused. */
  assert_fails_with(fl_image_resize(flat, 17, 13, 0, 0, 18, 13, 5, 4, small), FL_EINVAL, "outside");
}

/* ---- transforms ------------------------------------------------------------------------ */

static void record_of_pattern(uint32_t w, uint32_t h, uint64_t index, fl_buf *rec) {
  uint8_t *px = make_pattern(w, h);
  assert_ok(fl_image_record_encode(3, index, h, w, px, rec));
  free(px);
}

static void test_eval_center_crop_known_pixels(void **state) {
  (void)state;
  /* 300 x 256: the shorter side is already 256, so eval's resize is the identity and the
   * 224 centre crop starts at (38, 16). */
  fl_buf rec = FL_BUF_INIT;
  record_of_pattern(300, 256, 5, &rec);
  fl_image_transform t = FL_IMAGE_EVAL_INIT;
  float *out = malloc(3 * 224 * 224 * sizeof *out);
  assert_non_null(out);
  int32_t label = -1;
  assert_ok(fl_image_transform_apply(&t, 7, fl_buf_bytes(&rec), out, &label));
  assert_int_equal(label, 3);
  for (int c = 0; c < 3; c++)
    for (uint32_t y = 0; y < 224; y += 17)
      for (uint32_t x = 0; x < 224; x += 13) {
        float want = (pattern(38 + x, 16 + y, c) / 255.0f - t.mean[c]) / t.std[c];
        assert_float_equal(out[(size_t)c * 224 * 224 + y * 224 + x], want, 1e-5);
      }
  fl_image_crop crop;
  assert_ok(fl_image_transform_crop(&t, 0, 5, 300, 256, &crop));
  assert_float_equal(crop.x, 38, 1e-9);
  assert_float_equal(crop.y, 16, 1e-9);
  assert_false(crop.flip);
  /* A 600 x 512 image is halved first: the same box, doubled. */
  assert_ok(fl_image_transform_crop(&t, 0, 5, 600, 512, &crop));
  assert_float_equal(crop.x, 76, 1e-9);
  assert_float_equal(crop.w, 448, 1e-9);
  free(out);
  fl_buf_free(&rec);
}

static bool crops_equal(const fl_image_crop *a, const fl_image_crop *b) {
  return a->x == b->x && a->y == b->y && a->w == b->w && a->h == b->h && a->flip == b->flip;
}

static void test_train_crops_seeded(void **state) {
  (void)state;
  fl_image_transform t = FL_IMAGE_TRAIN_INIT;
  int differ_epoch = 0, differ_seed = 0, flips = 0;
  for (uint64_t index = 0; index < 64; index++) {
    fl_image_crop a, b, e, s;
    assert_ok(fl_image_transform_crop(&t, 3, index, 500, 375, &a));
    assert_ok(fl_image_transform_crop(&t, 3, index, 500, 375, &b));
    assert_true(crops_equal(&a, &b)); /* a function of (seed, epoch, index) */
    assert_ok(fl_image_transform_crop(&t, 4, index, 500, 375, &e));
    differ_epoch += !crops_equal(&a, &e);
    fl_image_transform t2 = t;
    t2.seed = 99;
    assert_ok(fl_image_transform_crop(&t2, 3, index, 500, 375, &s));
    differ_seed += !crops_equal(&a, &s);
    flips += a.flip;
    /* Inside the image, with torchvision's scale and ratio bounds (the rounding of w and h
     * moves them a little). */
    assert_true(a.x >= 0 && a.y >= 0 && a.x + a.w <= 500 && a.y + a.h <= 375);
    double share = a.w * a.h / (500.0 * 375), ratio = a.w / a.h;
    assert_true(share > 0.075 && share <= 1.0);
    assert_true(ratio > 0.70 && ratio < 1.40);
  }
  assert_true(differ_epoch > 56);
  assert_true(differ_seed > 56);
  assert_true(flips > 16 && flips < 48); /* p = 0.5 over 64 images */
  /* The fallback: no crop of ratio 3/4 .. 4/3 and area >= 90% fits in 1000 x 10, so the
   * centre crop of ratio 4/3 at full height: 13 x 10 at (493, 0). */
  t.scale_min = 0.9;
  fl_image_crop f;
  assert_ok(fl_image_transform_crop(&t, 0, 1, 1000, 10, &f));
  assert_float_equal(f.w, 13, 1e-9);
  assert_float_equal(f.h, 10, 1e-9);
  assert_float_equal(f.x, 493, 1e-9);
  assert_float_equal(f.y, 0, 1e-9);
  /* Bad transforms. */
  t = (fl_image_transform)FL_IMAGE_TRAIN_INIT;
  t.scale_min = 0;
  assert_fails_with(fl_image_transform_check(&t), FL_EINVAL, "scale");
  t = (fl_image_transform)FL_IMAGE_TRAIN_INIT;
  t.ratio_max = 0.5;
  assert_fails_with(fl_image_transform_check(&t), FL_EINVAL, "ratio");
  t = (fl_image_transform)FL_IMAGE_EVAL_INIT;
  t.resize = 100;
  assert_fails_with(fl_image_transform_check(&t), FL_EINVAL, "resize 100");
  t = (fl_image_transform)FL_IMAGE_EVAL_INIT;
  t.std[1] = 0;
  assert_fails_with(fl_image_transform_check(&t), FL_EINVAL, "channel 1");
}

static void test_flip(void **state) {
  (void)state;
  /* The whole of a square image (scale 1, ratio 1): flip 0 and flip 1 differ only by the
   * mirror, and each is the image itself resized. */
  fl_buf rec = FL_BUF_INIT;
  record_of_pattern(32, 32, 0, &rec);
  fl_image_transform t = FL_IMAGE_TRAIN_INIT;
  t.size = 32;
  t.scale_min = t.scale_max = 1;
  t.ratio_min = t.ratio_max = 1;
  t.flip = 0;
  float plain[3 * 32 * 32], mirrored[3 * 32 * 32];
  assert_ok(fl_image_transform_apply(&t, 0, fl_buf_bytes(&rec), plain, NULL));
  t.flip = 1;
  assert_ok(fl_image_transform_apply(&t, 0, fl_buf_bytes(&rec), mirrored, NULL));
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < 32; y++)
      for (int x = 0; x < 32; x++) {
        float want = (pattern((uint32_t)x, (uint32_t)y, c) / 255.0f - t.mean[c]) / t.std[c];
        assert_float_equal(plain[c * 1024 + y * 32 + x], want, 1e-5);
        assert_float_equal(mirrored[c * 1024 + y * 32 + (31 - x)], want, 1e-5);
      }
  fl_buf_free(&rec);
}

/* The transformed dataset is the same records whatever the partitioning. */
static void test_transform_dataset_any_partitions(void **state) {
  (void)state;
  char root[PATH_MAX];
  mkdir_rel("parts");
  mkdir_rel("parts/c0");
  mkdir_rel("parts/c1");
  for (int i = 0; i < 7; i++) {
    char rel[64];
    snprintf(rel, sizeof rel, "parts/c%d/%02d.jpg", i % 2, i);
    jpeg_rel(rel, 60 + 3 * i, 45, i % 2);
  }
  path_of(root, sizeof root, "parts");
  fl_context *ctx = open_local();
  fl_image_transform t = FL_IMAGE_TRAIN_INIT;
  t.size = 24;
  fl_records *got[2];
  for (int k = 0; k < 2; k++) {
    fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
    fo.cache_size = 32;
    fo.partitions = k == 0 ? 1 : 3;
    fl_dataset *images, *tensors;
    assert_ok(fl_image_folder(ctx, root, &fo, &images, NULL));
    assert_ok(fl_persist(images, FL_MEMORY_ONLY));
    assert_ok(fl_image_transform_dataset(images, &t, 2, &tensors));
    assert_ok(fl_collect(tensors, &got[k]));
    fl_dataset_free(tensors);
    fl_dataset_free(images);
  }
  assert_int_equal(fl_records_count(got[0]), 7);
  assert_int_equal(fl_records_count(got[1]), 7);
  for (size_t i = 0; i < 7; i++) {
    fl_bytes a = fl_records_get(got[0], i), b = fl_records_get(got[1], i);
    assert_int_equal(a.len, FL_IMAGE_TENSOR_HEADER + 3 * 24 * 24 * sizeof(float));
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
  }
  fl_records_free(got[0]);
  fl_records_free(got[1]);
  fl_context_close(ctx);
}

/* ---- bad input ---------------------------------------------------------------------- */

static void test_corrupt_file_fails_or_is_skipped(void **state) {
  (void)state;
  mkdir_rel("bad");
  mkdir_rel("bad/k");
  jpeg_rel("bad/k/a.jpg", 40, 30, 0);
  text_rel("bad/k/b.jpg", "\xff\xd8\xff this is no JPEG");
  jpeg_rel("bad/k/c.jpg", 40, 30, 1);
  char root[PATH_MAX];
  path_of(root, sizeof root, "bad");
  fl_context *ctx = open_local();
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.cache_size = 16;
  fl_dataset *ds;
  uint64_t n = 0;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, NULL));
  /* The task fails with FL_EFORMAT naming the file; the action, after its retries, with
   * FL_EJOB and that message. */
  assert_fails_with(fl_count(ds, &n), FL_EJOB, "bad/k/b.jpg: corrupt JPEG");
  fl_dataset_free(ds);
  fo.skip_bad = true;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, NULL));
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 2);
  fl_dataset_free(ds);
  /* A file gone between the listing and the decode (unreadable): its task fails naming it,
   * or it is skipped. */
  char gone[PATH_MAX];
  path_of(gone, sizeof gone, "bad/k/c.jpg");
  jpeg_rel("bad/k/b.jpg", 40, 30, 0); /* b is an image now */
  fo.skip_bad = false;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, NULL));
  assert_int_equal(unlink(gone), 0);
  assert_fails_with(fl_count(ds, &n), FL_EJOB, "bad/k/c.jpg");
  fl_dataset_free(ds);
  jpeg_rel("bad/k/c.jpg", 40, 30, 1);
  fo.skip_bad = true;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, NULL));
  assert_int_equal(unlink(gone), 0);
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 2); /* a.jpg and b.jpg */
  fl_dataset_free(ds);
  fl_context_close(ctx);
}

static void test_folder_errors(void **state) {
  (void)state;
  fl_context *ctx = open_local();
  fl_dataset *ds = NULL;
  fl_image_classes *cls = NULL;
  char root[PATH_MAX];
  path_of(root, sizeof root, "nowhere");
  assert_fails_with(fl_image_folder(ctx, root, NULL, &ds, NULL), FL_ENOENT, "nowhere");
  /* No class folders (only files). */
  mkdir_rel("flat");
  jpeg_rel("flat/a.jpg", 20, 20, 0);
  path_of(root, sizeof root, "flat");
  assert_fails_with(fl_image_folder(ctx, root, NULL, &ds, NULL), FL_EEMPTY, "no class folders");
  /* An empty class folder: an error naming it, or kept (its label) with allow_empty. */
  mkdir_rel("holes");
  mkdir_rel("holes/a");
  mkdir_rel("holes/b");
  mkdir_rel("holes/c");
  jpeg_rel("holes/a/1.jpg", 20, 20, 0);
  text_rel("holes/b/readme.md", "no images here");
  jpeg_rel("holes/c/1.jpg", 20, 20, 1);
  path_of(root, sizeof root, "holes");
  assert_fails_with(fl_image_folder(ctx, root, NULL, &ds, NULL), FL_EEMPTY, "class folder b");
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.allow_empty = true;
  fo.cache_size = 8;
  assert_ok(fl_image_folder(ctx, root, &fo, &ds, &cls));
  assert_int_equal(fl_image_classes_count(cls), 3);
  fl_records *recs;
  assert_ok(fl_collect(ds, &recs));
  assert_int_equal(fl_records_count(recs), 2);
  fl_image_view v;
  assert_ok(fl_image_record_view(fl_records_get(recs, 1), &v));
  assert_int_equal(v.label, 2); /* c keeps label 2 */
  fl_records_free(recs);
  fl_image_classes_free(cls);
  fl_dataset_free(ds);
  /* Bad options and records. */
  fo = (fl_image_folder_options)FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.cache_width = 10;
  assert_fails_with(fl_image_folder(ctx, root, &fo, &ds, NULL), FL_EINVAL, "cache_width");
  assert_fails_with(fl_image_record_view(fl_bytes_str("short"), &v), FL_EFORMAT, "image record");
  fl_context_close(ctx);
}

/* An exact cache size, and the local-cluster master gives the same records as local mode. */
static void test_local_cluster_matches_local(void **state) {
  (void)state;
  make_tree("cluster");
  char root[PATH_MAX];
  path_of(root, sizeof root, "cluster");
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.cache_width = 12;
  fo.cache_height = 10;
  fo.partitions = 2;
  fl_records *got[2];
  const char *masters[2] = {"local[2]", "local-cluster[2,1,256]"};
  for (int k = 0; k < 2; k++) {
    fl_context *ctx;
    assert_ok(fl_context_open(masters[k], NULL, &ctx));
    fl_dataset *ds;
    assert_ok(fl_image_folder(ctx, root, &fo, &ds, NULL));
    assert_ok(fl_persist(ds, FL_MEMORY_ONLY));
    uint64_t n;
    assert_ok(fl_count(ds, &n));
    assert_int_equal(n, 3);
    assert_ok(fl_collect(ds, &got[k]));
    fl_dataset_free(ds);
    fl_context_close(ctx);
  }
  assert_int_equal(fl_records_count(got[1]), 3);
  for (size_t i = 0; i < 3; i++) {
    fl_bytes a = fl_records_get(got[0], i), b = fl_records_get(got[1], i);
    fl_image_view v;
    assert_ok(fl_image_record_view(a, &v));
    assert_int_equal(v.width, 12);
    assert_int_equal(v.height, 10);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
  }
  fl_records_free(got[0]);
  fl_records_free(got[1]);
}

/* ---- training ----------------------------------------------------------------------- */

/* DIR/train and DIR/val of two classes told apart by colour. */
static void make_train_tree(const char *dir, int per_class_train, int per_class_val) {
  char rel[256];
  mkdir_rel(dir);
  const char *splits[2] = {"train", "val"};
  for (int s = 0; s < 2; s++) {
    snprintf(rel, sizeof rel, "%s/%s", dir, splits[s]), mkdir_rel(rel);
    for (int c = 0; c < 2; c++) {
      snprintf(rel, sizeof rel, "%s/%s/%s", dir, splits[s], c ? "dog" : "cat"), mkdir_rel(rel);
      for (int i = 0; i < (s ? per_class_val : per_class_train); i++) {
        snprintf(rel, sizeof rel, "%s/%s/%s/%03d.%s", dir, splits[s], c ? "dog" : "cat", i, i % 3 ? "jpg" : "png");
        if (i % 3) {
          jpeg_rel(rel, 40 + i, 30, c);
        } else {
          char p[PATH_MAX];
          path_of(p, sizeof p, rel);
          uint8_t *px = make_smooth(30, 36, c);
          write_png(p, 30, 36, PNG_FORMAT_RGB, px);
          free(px);
        }
      }
    }
  }
}

static void test_train_on_image_folder(void **state) {
  (void)state;
  make_train_tree("tiny", 8, 4);
  char root[PATH_MAX];
  path_of(root, sizeof root, "tiny");
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.master = "local[2]";
  o.model = NN_CNN;
  o.data = GPU_TRAIN_IMAGE_FOLDER;
  o.data_path = root; /* root/train and root/val */
  o.image_size = 16;
  o.ranks = 2;
  o.batch = 8;
  o.epochs = 3;
  o.lr = 0.1;
  gpu_train_result r;
  assert_ok(gpu_train_run(&o, &r));
  assert_int_equal(r.epochs, 3);
  assert_int_equal(r.steps, 3 * 2); /* 16 images, global batch 8 */
  assert_true(isfinite(r.train_loss) && isfinite(r.test_loss));
  assert_true(r.test_acc >= 0 && r.test_acc <= 1);
  /* Without shuffling, local-cluster (the ranks decode on executors) trains as local mode. */
  o.shuffle = false;
  gpu_train_result local, cluster;
  assert_ok(gpu_train_run(&o, &local));
  o.master = "local-cluster[2,1,512]";
  assert_ok(gpu_train_run(&o, &cluster));
  assert_int_equal(cluster.steps, local.steps);
  assert_float_equal(cluster.train_loss, local.train_loss, 1e-4 * fmax(1, fabs(local.train_loss)));
  assert_float_equal(cluster.test_loss, local.test_loss, 1e-4 * fmax(1, fabs(local.test_loss)));
  o.master = "local[2]";
  /* Training images get a new random crop each epoch by default: centre crops (no_augment)
   * train otherwise. */
  gpu_train_result plain;
  o.no_augment = true;
  assert_ok(gpu_train_run(&o, &plain));
  assert_int_equal(plain.steps, local.steps);
  assert_true(fabs(plain.train_loss - local.train_loss) > 1e-6);
  o.no_augment = false;
  o.model = NN_TRANSFORMER;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--no-augment");
  o.model = NN_CNN;
  /* The options' checks. */
  o.data_path = NULL;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "imagefolder:DIR");
  o.data = GPU_TRAIN_FASHION_MNIST;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--image-size is for");
  o.image_size = 0;
  o.no_augment = true;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--no-augment is for");
  o.no_augment = false;
  o.image_size = 16;
  /* A folder without val/. */
  mkdir_rel("noval");
  mkdir_rel("noval/train");
  mkdir_rel("noval/train/a");
  jpeg_rel("noval/train/a/1.jpg", 20, 20, 0);
  path_of(root, sizeof root, "noval");
  o.data = GPU_TRAIN_IMAGE_FOLDER;
  o.data_path = root;
  o.ranks = 1;
  assert_fails_with(gpu_train_run(&o, &r), FL_ENOENT, "noval/val");
  /* --test-data imagefolder:TEST: the training folder is DIR itself. */
  char train_dir[PATH_MAX], val_dir[PATH_MAX];
  path_of(train_dir, sizeof train_dir, "tiny/train");
  path_of(val_dir, sizeof val_dir, "tiny/val");
  o.data_path = train_dir;
  o.test_path = val_dir;
  o.ranks = 2;
  o.epochs = 1;
  assert_ok(gpu_train_run(&o, &r));
  assert_int_equal(r.steps, 2);
}

/* README's example as written (in the temporary folder): image_folder make and show, then
 * flint train on the tree. */
static void test_flint_train_imagefolder(void **state) {
  (void)state;
  char flint[PATH_MAX], tool[PATH_MAX], root[PATH_MAX], train[PATH_MAX], arg[PATH_MAX + 16], csv[PATH_MAX];
  const char *bin = getenv("FLINT_BIN");
  assert_non_null(bin);
  snprintf(flint, sizeof flint, "%s/flint", bin);
  snprintf(tool, sizeof tool, "%s/image_folder", bin);
  path_of(root, sizeof root, "readme");
  path_of(train, sizeof train, "readme/train");
  snprintf(arg, sizeof arg, "imagefolder:%s", root);
  run_result *r = run_child(tool, tmp_dir, (const char *const[]){"make", root, NULL}, 60, 120);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  free(r);
  r = run_child(tool, tmp_dir, (const char *const[]){"show", train, NULL}, 60, 120);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "32 images in 2 classes: 0=blue 1=red"));
  free(r);
  r = run_child(flint, tmp_dir,
                (const char *const[]){"train", "--model", "cnn", "--data", arg, "--image-size", "32", "--batch", "16",
                                      "--epochs", "3", "--ranks", "2", "--master", "local[2]", NULL},
                120, 180);
  if (r->status != 0) run_dump(r);
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "training cnn on imagefolder"));
  assert_non_null(strstr(r->out, "epochs       3 (6 steps"));
  free(r);
  struct stat st;
  path_of(csv, sizeof csv, "flint-train.csv");
  assert_int_equal(stat(csv, &st), 0);
  /* Usage errors exit 2 naming the cause. */
  r = run_child(flint, NULL, (const char *const[]){"train", "--model", "mlp", "--data", "imagefolder:", NULL}, 30, 60);
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "needs its folder: imagefolder:DIR"));
  free(r);
  r = run_child(flint, NULL,
                (const char *const[]){"train", "--model", "mlp", "--data", "fashion-mnist", "--image-size", "32", NULL},
                30, 60);
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "--image-size is for"));
  free(r);
  r = run_child(flint, NULL, (const char *const[]){"train", "--model", "mlp", "--data", arg, "--image-size", "0", NULL},
                30, 60);
  assert_int_equal(r->status, 2);
  assert_non_null(strstr(r->err, "--image-size '0'"));
  free(r);
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  test_tmpdir(tmp_dir, sizeof tmp_dir);
  const struct CMUnitTest tests[] = {
      T(test_listing_and_labels),
      T(test_decode_png_exact),
      T(test_decode_jpeg_close),
      T(test_decode_errors_name_the_file),
      T(test_resize),
      T(test_eval_center_crop_known_pixels),
      T(test_train_crops_seeded),
      T(test_flip),
      T(test_transform_dataset_any_partitions),
      T(test_corrupt_file_fails_or_is_skipped),
      T(test_folder_errors),
      T(test_local_cluster_matches_local),
      T(test_train_on_image_folder),
      T(test_flint_train_imagefolder),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  int failed = cmocka_run_group_tests_name("image", tests, NULL, NULL);
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) failed++;
  return failed;
}
