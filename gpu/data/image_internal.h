/*
 * gpu/data/image_internal.h: what the image files of gpu/data/ share, private to them: float
 * resampling (image_resize.c), the decode-and-cache step of one listed file
 * (image_folder.c), and the transform into a float buffer (image_transform.c), which the
 * trainer's image-folder source (image_blocks.c, data_image_folder of data.h) strings together.
 */
#ifndef FLINT_GPU_DATA_IMAGE_INTERNAL_H
#define FLINT_GPU_DATA_IMAGE_INTERNAL_H

#include "flint/image.h"
#include "gpu/data/data.h"

/* fl_image_resize without the rounding: dw x dh x 3 floats in [0, 255], HWC. */
fl_status image_resample(const uint8_t *src, uint32_t sw, uint32_t sh, double x0, double y0, double x1, double y1,
                         uint32_t dw, uint32_t dh, float *dst);

/* How images are cached: shorter side to `size`, or exactly width x height when both are
 * non-zero. */
typedef struct image_cache_size {
  uint32_t size, width, height;
} image_cache_size;

/* The cache size an image folder's options ask for; FL_EINVAL names a bad one. */
fl_status image_cache_of(const fl_image_folder_options *o, image_cache_size *out);

/* Decodes `path` and resizes it as `cs` says into *out as an image record (label, index).
 * The decode's errors name the file. */
fl_status image_load_record(const char *path, int32_t label, uint64_t index, const image_cache_size *cs,
                            fl_buf *out);

/* The size an image of w x h gets when its shorter side is resized to `side` (torchvision's
 * Resize(int): the longer side is side * long / short, rounded down). */
void image_shorter_side(uint32_t w, uint32_t h, uint32_t side, uint32_t *ow, uint32_t *oh);

/* *dst = *src field by field over zeroed bytes: a transform travels inside task arguments, whose
 * bytes (padding included) are sent as they are. */
void image_transform_copy(fl_image_transform *dst, const fl_image_transform *src);

/* Applies t to a view: 3 * size * size floats (CHW) into out. */
fl_status image_transform_view(const fl_image_transform *t, uint32_t epoch, const fl_image_view *v, float *out);

/* ---- the trainer's source: an image folder as image blocks (image_blocks.c) --------------- */

/* Emits partition `partition` of that source (for data_pair). */
fl_status data_image_emit(uint32_t partition, fl_emitter *out, const void *arg, data_split split);

/* The listing of a folder (image_folder.c): paths relative to the root, "CLASS/FILE". */
typedef struct image_listing {
  char *root;         /* absolute */
  uint32_t classes;
  char **class_names; /* classes entries */
  uint64_t images;
  char **paths;       /* images entries, "CLASS/FILE", in listing order */
  int32_t *labels;    /* images entries */
} image_listing;
fl_status image_list(const char *dir, bool allow_empty, image_listing *out);
void image_listing_free(image_listing *l);
/* Moves the class names of l into a new fl_image_classes (l keeps the rest). */
fl_status image_classes_take(image_listing *l, fl_image_classes **out);

#endif /* FLINT_GPU_DATA_IMAGE_INTERNAL_H */
