/*
 * image_folder: the image-folder API (flint/image.h) from a C program.
 *
 *   image_folder make DIR   writes a tiny ImageNet-style tree: DIR/train and DIR/val, each
 *                           with classes red/ and blue/ of JPEGs and PNGs (16 and 4 a class)
 *   image_folder show DIR   lists DIR (DIR/CLASS/NAME.jpg|png) in local[2], decodes it once into
 *                           a cached dataset at 256 on the shorter side, and prints the classes
 *                           and a training-transformed image's first values for two epochs
 *
 * The `make` part writes the files with libjpeg and libpng; the `show` part is what a
 * program of yours does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jpeglib.h> /* after stdio.h */
#include <png.h>

#include <flint/image.h>

static int write_one(const char *path, int w, int h, int blue, int png) {
  unsigned char *px = malloc((size_t)w * h * 3);
  if (!px) return 1;
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      unsigned char *p = px + ((size_t)y * w + x) * 3;
      p[0] = (unsigned char)(blue ? 30 + x % 40 : 200 - y % 50);
      p[1] = (unsigned char)(60 + (x + y) % 80);
      p[2] = (unsigned char)(blue ? 210 - y % 40 : 40 + x % 30);
    }
  int rc = 0;
  if (png) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w;
    img.height = (png_uint_32)h;
    img.format = PNG_FORMAT_RGB;
    rc = !png_image_write_to_file(&img, path, 0, px, 0, NULL);
  } else {
    FILE *f = fopen(path, "wb");
    if (!f) {
      free(px);
      return 1;
    }
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 90, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
      JSAMPROW row = px + (size_t)c.next_scanline * w * 3;
      jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    rc = fclose(f) != 0;
  }
  free(px);
  return rc;
}

static int make(const char *dir) {
  static const char *const splits[] = {"train", "val"}, *const classes[] = {"blue", "red"};
  char path[4096];
  if (mkdir(dir, 0755) != 0) {
    perror(dir);
    return 1;
  }
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/%s", dir, splits[s]);
    if (mkdir(path, 0755) != 0) return perror(path), 1;
    for (int c = 0; c < 2; c++) {
      snprintf(path, sizeof path, "%s/%s/%s", dir, splits[s], classes[c]);
      if (mkdir(path, 0755) != 0) return perror(path), 1;
      for (int i = 0; i < (s == 0 ? 16 : 4); i++) {
        int png = i % 4 == 3;
        snprintf(path, sizeof path, "%s/%s/%s/%03d.%s", dir, splits[s], classes[c], i, png ? "png" : "jpg");
        if (write_one(path, 80 + 4 * i, 60 + 2 * i, c == 0, png) != 0) return perror(path), 1;
      }
    }
  }
  printf("wrote %s/train (2 classes x 16 images) and %s/val (2 x 4)\n", dir, dir);
  return 0;
}

static int fail(const char *what) {
  fprintf(stderr, "image_folder: %s: %s\n", what, fl_last_error());
  return 1;
}

static int show(const char *dir) {
  fl_context *ctx;
  fl_dataset *images;
  fl_image_classes *classes;
  fl_records *first;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) return fail("fl_context_open");
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT; /* shorter side cached at 256 */
  if (fl_image_folder(ctx, dir, &fo, &images, &classes) != FL_OK) return fail("fl_image_folder");
  fl_persist(images, FL_MEMORY_ONLY); /* the decode runs once, on the first action */
  uint64_t n = 0;
  if (fl_count(images, &n) != FL_OK || fl_take(images, 1, &first) != FL_OK) return fail("decoding");
  printf("%llu images in %u classes:", (unsigned long long)n, fl_image_classes_count(classes));
  for (uint32_t c = 0; c < fl_image_classes_count(classes); c++) printf(" %u=%s", c, fl_image_classes_name(classes, c));
  fl_image_view v;
  fl_image_record_view(fl_records_get(first, 0), &v);
  printf("\nimage 0: label %d, cached at %u x %u\n", v.label, v.width, v.height);
  fl_image_transform t = FL_IMAGE_TRAIN_INIT; /* RandomResizedCrop 224, flip, ImageNet's mean/std */
  float *x = malloc(3 * 224 * 224 * sizeof *x);
  for (uint32_t epoch = 0; x && epoch < 2; epoch++) {
    fl_image_crop crop;
    fl_image_transform_crop(&t, epoch, v.index, v.width, v.height, &crop);
    if (fl_image_transform_apply(&t, epoch, fl_records_get(first, 0), x, NULL) != FL_OK) return fail("transform");
    printf("epoch %u: crop %.0f x %.0f at (%.0f, %.0f)%s, x[0] = %.4f\n", epoch, crop.w, crop.h, crop.x, crop.y,
           crop.flip ? " flipped" : "", x[0]);
  }
  free(x);
  fl_records_free(first);
  fl_image_classes_free(classes);
  fl_dataset_free(images);
  fl_context_close(ctx);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "make") == 0) return make(argv[2]);
  if (argc == 3 && strcmp(argv[1], "show") == 0) return show(argv[2]);
  fprintf(stderr, "usage: image_folder make DIR | show DIR\n");
  return 2;
}
