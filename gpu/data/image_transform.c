/*
 * gpu/data/image_transform.c: the ImageNet transforms of include/flint/image.h on an image
 * record: RandomResizedCrop + horizontal flip (training) and Resize + CenterCrop
 * (evaluation), then normalisation into float CHW.
 *
 * Randomness: every draw for an image is splitmix64 of a counter started from (seed, epoch,
 * the image's index in its folder), so it does not depend on which task, rank or partition
 * transforms the image, nor on the order. Crop then resize is one resampling of the crop's
 * box (PIL's resize(box=...), which is what crop-then-resize computes).
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"
#include "gpu/data/sources.h"

#define TRANSFORM_MAX_SIZE 4096u

fl_status fl_image_transform_check(const fl_image_transform *t) {
  if (!t) return fl_set_error(FL_EINVAL, "image transform: NULL");
  if (t->kind != FL_IMAGE_TRAIN && t->kind != FL_IMAGE_EVAL)
    return fl_set_error(FL_EINVAL, "image transform: unknown kind %d", (int)t->kind);
  if (t->size == 0 || t->size > TRANSFORM_MAX_SIZE)
    return fl_set_error(FL_EINVAL, "image transform: size %u (1 to %u)", t->size, TRANSFORM_MAX_SIZE);
  if (t->kind == FL_IMAGE_EVAL && t->resize && (t->resize < t->size || t->resize > 65535))
    return fl_set_error(FL_EINVAL, "image transform: resize %u is below the crop size %u (or above 65535)", t->resize,
                        t->size);
  if (t->kind == FL_IMAGE_TRAIN) {
    if (!(t->scale_min > 0 && t->scale_min <= t->scale_max && t->scale_max <= 1))
      return fl_set_error(FL_EINVAL, "image transform: scale (%g, %g) is not 0 < min <= max <= 1", t->scale_min,
                          t->scale_max);
    if (!(t->ratio_min > 0 && t->ratio_min <= t->ratio_max && isfinite(t->ratio_max)))
      return fl_set_error(FL_EINVAL, "image transform: ratio (%g, %g) is not 0 < min <= max", t->ratio_min,
                          t->ratio_max);
    if (!(t->flip >= 0 && t->flip <= 1))
      return fl_set_error(FL_EINVAL, "image transform: flip probability %g is not in [0, 1]", t->flip);
  }
  for (int c = 0; c < 3; c++)
    if (!(t->std[c] != 0 && isfinite(t->std[c]) && isfinite(t->mean[c])))
      return fl_set_error(FL_EINVAL, "image transform: channel %d has mean %g and std %g", c, t->mean[c], t->std[c]);
  return FL_OK;
}

void image_transform_copy(fl_image_transform *dst, const fl_image_transform *src) {
  memset(dst, 0, sizeof *dst);
  dst->kind = src->kind;
  dst->size = src->size;
  dst->resize = src->resize;
  dst->scale_min = src->scale_min, dst->scale_max = src->scale_max;
  dst->ratio_min = src->ratio_min, dst->ratio_max = src->ratio_max;
  dst->flip = src->flip;
  memcpy(dst->mean, src->mean, sizeof dst->mean);
  memcpy(dst->std, src->std, sizeof dst->std);
  dst->seed = src->seed;
}

/* The image's draws: counter-based, from (seed, epoch, index). */
typedef struct draws {
  uint64_t base, k;
} draws;
static double draw_unit(draws *d) { return data_unit_of(data_mix64(d->base + d->k++)); }
static double draw_uniform(draws *d, double lo, double hi) { return lo + (hi - lo) * draw_unit(d); }
/* An integer in [0, n]. */
static uint32_t draw_upto(draws *d, uint32_t n) {
  return (uint32_t)(((unsigned __int128)data_mix64(d->base + d->k++) * ((uint64_t)n + 1)) >> 64);
}

fl_status fl_image_transform_crop(const fl_image_transform *t, uint32_t epoch, uint64_t index, uint32_t width,
                                  uint32_t height, fl_image_crop *out) {
  fl_status s = fl_image_transform_check(t);
  if (s != FL_OK) return s;
  if (!out || !width || !height) return fl_set_error(FL_EINVAL, "fl_image_transform_crop: an empty image or NULL");
  if (t->kind == FL_IMAGE_EVAL) {
    uint32_t rw, rh;
    image_shorter_side(width, height, t->resize ? t->resize : 256, &rw, &rh);
    /* CenterCrop's corner, rounded half to even as Python's round(). */
    double left = nearbyint((rw - (double)t->size) / 2), top = nearbyint((rh - (double)t->size) / 2);
    double sx = (double)width / rw, sy = (double)height / rh;
    *out = (fl_image_crop){left * sx, top * sy, t->size * sx, t->size * sy, false};
    return FL_OK;
  }
  draws d = {data_mix64(t->seed ^ data_mix64(0x1a6e5eedull + epoch)) ^ data_mix64(index * 0x9e3779b97f4a7c15ull + 7),
             0};
  double area = (double)width * height, lr0 = log(t->ratio_min), lr1 = log(t->ratio_max);
  bool found = false;
  double x = 0, y = 0, w = width, h = height;
  for (int attempt = 0; attempt < 10 && !found; attempt++) {
    double target = area * draw_uniform(&d, t->scale_min, t->scale_max);
    double aspect = exp(draw_uniform(&d, lr0, lr1));
    double cw = nearbyint(sqrt(target * aspect)), ch = nearbyint(sqrt(target / aspect));
    if (cw > 0 && cw <= width && ch > 0 && ch <= height) {
      y = draw_upto(&d, height - (uint32_t)ch);
      x = draw_upto(&d, width - (uint32_t)cw);
      w = cw, h = ch;
      found = true;
    }
  }
  if (!found) { /* torchvision's fallback: a centre crop of the nearest allowed ratio */
    double in_ratio = (double)width / height;
    if (in_ratio < t->ratio_min) {
      w = width;
      h = nearbyint(w / t->ratio_min);
    } else if (in_ratio > t->ratio_max) {
      h = height;
      w = nearbyint(h * t->ratio_max);
    } else {
      w = width;
      h = height;
    }
    if (h > height) h = height;
    if (w > width) w = width;
    if (h < 1) h = 1;
    if (w < 1) w = 1;
    y = floor((height - h) / 2);
    x = floor((width - w) / 2);
  }
  d.k = 64; /* the flip's draw does not move with the number of attempts */
  *out = (fl_image_crop){x, y, w, h, draw_unit(&d) < t->flip};
  return FL_OK;
}

fl_status image_transform_view(const fl_image_transform *t, uint32_t epoch, const fl_image_view *v, float *out) {
  fl_image_crop c;
  fl_status s = fl_image_transform_crop(t, epoch, v->index, v->width, v->height, &c);
  if (s != FL_OK) return s;
  uint32_t n = t->size;
  size_t plane = (size_t)n * n;
  float *hwc = common_malloc(plane * 3 * sizeof *hwc);
  if (!hwc) return fl_set_error(FL_ENOMEM, "image transform: out of memory");
  s = image_resample(v->pixels, v->width, v->height, c.x, c.y, c.x + c.w, c.y + c.h, n, n, hwc);
  if (s == FL_OK) {
    float scale[3], shift[3];
    for (int ch = 0; ch < 3; ch++) {
      scale[ch] = 1.0f / (255.0f * t->std[ch]);
      shift[ch] = -t->mean[ch] / t->std[ch];
    }
    for (uint32_t y = 0; y < n; y++)
      for (uint32_t x = 0; x < n; x++) {
        const float *p = hwc + ((size_t)y * n + (c.flip ? n - 1 - x : x)) * 3;
        size_t at = (size_t)y * n + x;
        for (int ch = 0; ch < 3; ch++) out[ch * plane + at] = p[ch] * scale[ch] + shift[ch];
      }
  }
  common_free(hwc);
  return s;
}

fl_status fl_image_transform_apply(const fl_image_transform *t, uint32_t epoch, fl_bytes rec, float *out,
                                   int32_t *label) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_image_transform_apply: out is NULL");
  fl_image_view v;
  fl_status s = fl_image_record_view(rec, &v);
  if (s == FL_OK) s = image_transform_view(t, epoch, &v, out);
  if (s == FL_OK && label) *label = v.label;
  return s;
}

/* fl_image_transform_dataset's argument. */
typedef struct transform_arg {
  fl_image_transform t;
  uint32_t epoch, pad;
} transform_arg;

FL_API fl_status fl_image_transform_record(fl_bytes rec, fl_buf *out, const void *arg) {
  transform_arg a;
  memcpy(&a, arg, sizeof a);
  fl_image_view v;
  fl_status s = fl_image_record_view(rec, &v);
  if (s != FL_OK) return s;
  size_t floats = (size_t)3 * a.t.size * a.t.size;
  if ((s = fl_buf_reserve(out, FL_IMAGE_TENSOR_HEADER + floats * sizeof(float))) != FL_OK) return s;
  int32_t head[2] = {v.label, 0};
  memcpy(out->data, head, 8);
  memcpy(out->data + 8, &v.index, 8);
  /* The buffer's memory comes from flint's allocator, aligned for floats. */
  if ((s = image_transform_view(&a.t, a.epoch, &v, (float *)(void *)(out->data + FL_IMAGE_TENSOR_HEADER))) != FL_OK)
    return s;
  out->len = FL_IMAGE_TENSOR_HEADER + floats * sizeof(float);
  return FL_OK;
}

fl_status fl_image_transform_dataset(fl_dataset *images, const fl_image_transform *t, uint32_t epoch,
                                     fl_dataset **out) {
  if (!images || !out) return fl_set_error(FL_EINVAL, "fl_image_transform_dataset: NULL argument");
  fl_status s = fl_image_transform_check(t);
  if (s != FL_OK) return s;
  transform_arg a;
  memset(&a, 0, sizeof a);
  image_transform_copy(&a.t, t);
  a.epoch = epoch;
  return fl_map(images, fl_image_transform_record, &a, sizeof a, out);
}
