/*
 * image.h: image-folder input for training (as torchvision's ImageFolder), decoded on the
 * executors with libjpeg-turbo and libpng, and the standard ImageNet transforms.
 *
 *     fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;  (shorter side cached at 256)
 *     fl_dataset *images;
 *     fl_image_classes *classes;
 *     fl_image_folder(ctx, "/data/imagenet/train", &fo, &images, &classes);
 *     fl_persist(images, FL_MEMORY_ONLY);        (decode once, transform every epoch)
 *     fl_image_transform t = FL_IMAGE_TRAIN_INIT; (RandomResizedCrop 224, flip, normalise)
 *     ... fl_image_transform_apply(&t, epoch, record, pixels, &label) in a task ...
 *
 * Layout of a folder: DIR/CLASS/FILE. Every subfolder of DIR whose name does not start with
 * '.' is a class; classes sorted by name (bytewise, as Python's sorted) get labels 0 .. K-1.
 * In a class folder, the regular files (symbolic links followed) whose names end in .jpg,
 * .jpeg or .png (any case) and do not start with '.' are its images, sorted by name; other
 * files, files directly in DIR, and folders inside a class folder are ignored. A class
 * folder without images is FL_EEMPTY naming it unless allow_empty (then its label stays
 * and it has no images). The format is told by the file's first bytes, not its name.
 *
 * Records (one per image, little-endian, the host order):
 *   off  size
 *     0     4  magic "FLIM" (FL_IMAGE_MAGIC)
 *     4     4  label, int32 in [0, classes)
 *     8     4  height      12  4  width      16  4  channels (3)      20  4  zero
 *    24     8  index: the image's position in the folder's sorted listing (over all classes)
 *    32   h*w*3  pixels, uint8 RGB, row-major HWC
 * The index is what seeds the random transforms: the same run gives the same crops whatever
 * the partitioning or the number of ranks.
 *
 * Conventions are flint.h's. Every function here is thread-safe (no shared state); the task
 * functions run on executors, which find them by symbol in libflint_gpu.
 */
#ifndef FLINT_IMAGE_H
#define FLINT_IMAGE_H

#include "flint.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_IMAGE_MAGIC 0x4d494c46u /* "FLIM" */
#define FL_IMAGE_HEADER 32u

/* ---------------------------------------------------------------------------------------
 * The folder source.
 * ------------------------------------------------------------------------------------- */
typedef struct fl_image_folder_options {
  /* Partitions (0: the context's default parallelism; else at most one per image). Partition
   * p holds a contiguous run of the sorted listing. */
  uint32_t partitions;
  /* Cached resolution: the shorter side resized to cache_size (0: 256, as ImageNet's
   * pipelines resize before cropping 224), keeping the aspect ratio (the longer side is
   * cache_size * long / short, rounded down as torchvision's Resize does). */
  uint32_t cache_size;
  /* Both non-zero: every image resized to exactly cache_width x cache_height instead. */
  uint32_t cache_width, cache_height;
  /* A corrupt or unreadable image is skipped with a warning in the executor's log instead
   * of failing its task (FL_EFORMAT / FL_EIO naming the file). */
  bool skip_bad;
  /* A class folder without images keeps its label instead of being FL_EEMPTY. */
  bool allow_empty;
} fl_image_folder_options;
#define FL_IMAGE_FOLDER_OPTIONS_INIT {0, 256, 0, 0, false, false}

/* The classes of a folder, in label order. */
typedef struct fl_image_classes fl_image_classes;
FL_API uint32_t fl_image_classes_count(const fl_image_classes *c);
/* Class `label`'s name (its folder's name), owned by c; NULL when label >= count. */
FL_API const char *fl_image_classes_name(const fl_image_classes *c, uint32_t label);
/* Images listed over all classes. */
FL_API uint64_t fl_image_classes_images(const fl_image_classes *c);
FL_API void fl_image_classes_free(fl_image_classes *c);

/* Lists `dir` now, on the calling thread (see the layout above), and makes *out, a dataset
 * of one record per image, decoded and resized by its tasks when an action computes it.
 * It is not persisted: persist it so that the decode runs once. In cluster mode `dir` must
 * be readable at the same path where the executors run (as for fl_text_file).
 * *classes (NULL: not wanted) gets the classes; free it with fl_image_classes_free.
 * Errors: FL_EINVAL (arguments, a cache size above 65535), FL_ENOENT (no such folder),
 * FL_EIO (unreadable folder), FL_EEMPTY (no class folder, no image, an empty class folder).
 * A task fails with FL_EFORMAT naming the file for a file that is not a decodable JPEG or
 * PNG, FL_EIO for an unreadable one (unless opts->skip_bad). Blocks while listing. */
FL_API fl_status fl_image_folder(fl_context *ctx, const char *dir, const fl_image_folder_options *opts,
                                 fl_dataset **out, fl_image_classes **classes);

/* A view of an image record. */
typedef struct fl_image_view {
  int32_t label;
  uint32_t height, width, channels;
  uint64_t index;
  const uint8_t *pixels; /* height * width * channels bytes, HWC; points into the record */
} fl_image_view;
/* FL_EFORMAT when `rec` is not a well-formed image record. */
FL_API fl_status fl_image_record_view(fl_bytes rec, fl_image_view *out);
/* Encodes an image record into *out (replacing its contents). */
FL_API fl_status fl_image_record_encode(int32_t label, uint64_t index, uint32_t height, uint32_t width,
                                        const uint8_t *rgb, fl_buf *out);

/* Decodes one JPEG or PNG file (told by its first bytes) into RGB: *rgb (height * width * 3
 * bytes, HWC; free with fl_free). Grayscale is replicated, an alpha channel dropped (as
 * PIL's convert("RGB")), palettes expanded, 16-bit samples reduced, CMYK and YCCK JPEGs
 * converted without a colour profile (Adobe's inverted inks recognised by their marker).
 * min_side > 0 lets the JPEG decoder scale by 1/2, 1/4 or 1/8 while the shorter side stays
 * >= min_side (0: full size). FL_ENOENT / FL_EIO (missing, unreadable) and FL_EFORMAT
 * (neither format, corrupt) name the file. */
FL_API fl_status fl_image_decode_file(const char *path, uint32_t min_side, uint8_t **rgb, uint32_t *height,
                                      uint32_t *width);

/* Bilinear resampling (a triangle filter widened by the scale when shrinking, as PIL's
 * BILINEAR and torchvision's antialiased resize) of the box [x0, x1) x [y0, y1) of an RGB
 * image (sw x sh) to dw x dh RGB bytes (rounded, clamped). The box must lie in the image. */
FL_API fl_status fl_image_resize(const uint8_t *src, uint32_t sw, uint32_t sh, double x0, double y0, double x1,
                                 double y1, uint32_t dw, uint32_t dh, uint8_t *dst);

/* ---------------------------------------------------------------------------------------
 * Transforms: an image record to float CHW of size x size, normalised per channel.
 * ------------------------------------------------------------------------------------- */
typedef enum fl_image_transform_kind {
  /* RandomResizedCrop(size, scale, ratio) as torchvision draws it (10 attempts, then a
   * centre crop of the widest allowed ratio), then a horizontal flip with probability
   * flip, then (x / 255 - mean) / std. */
  FL_IMAGE_TRAIN = 0,
  /* Resize the shorter side to `resize`, then CenterCrop(size), then normalise. */
  FL_IMAGE_EVAL = 1,
} fl_image_transform_kind;

typedef struct fl_image_transform {
  fl_image_transform_kind kind;
  uint32_t size;              /* output height and width (224) */
  uint32_t resize;            /* eval: the shorter side before the crop (0: 256) */
  double scale_min, scale_max; /* train: the crop's share of the area (0.08, 1) */
  double ratio_min, ratio_max; /* train: the crop's width / height (3/4, 4/3) */
  double flip;                /* train: the probability of a horizontal flip (0.5) */
  float mean[3], std[3];      /* per channel, of x / 255 (ImageNet's) */
  uint64_t seed;              /* the random draws are a function of (seed, epoch, index) */
} fl_image_transform;
#define FL_IMAGE_MEAN_INIT {0.485f, 0.456f, 0.406f}
#define FL_IMAGE_STD_INIT {0.229f, 0.224f, 0.225f}
#define FL_IMAGE_TRAIN_INIT \
  {FL_IMAGE_TRAIN, 224, 256, 0.08, 1.0, 3.0 / 4, 4.0 / 3, 0.5, FL_IMAGE_MEAN_INIT, FL_IMAGE_STD_INIT, 1}
#define FL_IMAGE_EVAL_INIT \
  {FL_IMAGE_EVAL, 224, 256, 0.08, 1.0, 3.0 / 4, 4.0 / 3, 0.5, FL_IMAGE_MEAN_INIT, FL_IMAGE_STD_INIT, 1}

/* FL_EINVAL naming the field for a transform that cannot be applied (size 0 or above 4096,
 * scale or ratio out of order or not positive, flip outside [0, 1], a std of 0). */
FL_API fl_status fl_image_transform_check(const fl_image_transform *t);

/* The crop a transform takes of the image `index` (of width x height) in `epoch`: the box
 * [x, x + w) x [y, y + h) of the record's image that is resampled to size x size (for eval,
 * the centre crop of the resized image mapped back), and whether it is then flipped. For
 * tests and for checking reproducibility. */
typedef struct fl_image_crop {
  double x, y, w, h;
  bool flip;
} fl_image_crop;
FL_API fl_status fl_image_transform_crop(const fl_image_transform *t, uint32_t epoch, uint64_t index,
                                         uint32_t width, uint32_t height, fl_image_crop *out);

/* Applies t to the image record `rec` in `epoch`: out gets 3 * size * size floats (CHW),
 * *label (may be NULL) the record's label. Errors: FL_EINVAL (t), FL_EFORMAT (rec). */
FL_API fl_status fl_image_transform_apply(const fl_image_transform *t, uint32_t epoch, fl_bytes rec, float *out,
                                          int32_t *label);

/* A dataset of transformed images: one record per image record of `images`, int32 label,
 * int32 zero, uint64 index, then 3 * size * size float32 (CHW) (FL_IMAGE_TENSOR_HEADER
 * bytes before the floats). Lazy, as fl_map. */
#define FL_IMAGE_TENSOR_HEADER 16u
FL_API fl_status fl_image_transform_dataset(fl_dataset *images, const fl_image_transform *t, uint32_t epoch,
                                            fl_dataset **out);

/* Task functions (exported: they reach executors by symbol). */
FL_API fl_status fl_image_decode_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);
FL_API fl_status fl_image_transform_record(fl_bytes rec, fl_buf *out, const void *arg);

#ifdef __cplusplus
}
#endif
#endif /* FLINT_IMAGE_H */
