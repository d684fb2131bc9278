/*
 * gpu/data/image_resize.c: bilinear resampling of RGB images, the way PIL's resize (and so
 * torchvision's Resize and RandomResizedCrop on PIL images) does it: separable, a triangle
 * filter whose support widens with the scale when shrinking (antialiasing), each output
 * pixel's centre mapped into a box of the source. Horizontal pass first, over only the rows
 * the vertical pass reads; floats in between (PIL rounds to bytes there: we differ by at most
 * a unit).
 */
#include <math.h>
#include <string.h>

#include "common/common.h"
#include "gpu/data/image_internal.h"

/* One output coordinate's taps: source positions [first, first + n) with weights. */
typedef struct taps {
  int *first, *n;
  float *w; /* out * stride weights */
  int stride;
} taps;

static void taps_free(taps *t) {
  common_free(t->first);
  common_free(t->n);
  common_free(t->w);
}

/* The taps of `out` outputs over [lo, hi) of a source of `in` pixels. */
static fl_status taps_make(double lo, double hi, uint32_t in, uint32_t out, taps *t) {
  double scale = (hi - lo) / out, filterscale = scale > 1 ? scale : 1, support = filterscale;
  t->stride = (int)ceil(support) * 2 + 1;
  t->first = common_malloc(out * sizeof *t->first);
  t->n = common_malloc(out * sizeof *t->n);
  t->w = common_malloc((size_t)out * t->stride * sizeof *t->w);
  if (!t->first || !t->n || !t->w) {
    taps_free(t);
    return fl_set_error(FL_ENOMEM, "image resize: out of memory");
  }
  for (uint32_t o = 0; o < out; o++) {
    double center = lo + (o + 0.5) * scale;
    int a = (int)(center - support + 0.5), b = (int)(center + support + 0.5);
    if (a < 0) a = 0;
    if (b > (int)in) b = (int)in;
    if (b - a > t->stride) b = a + t->stride;
    double sum = 0;
    float *w = t->w + (size_t)o * t->stride;
    for (int x = a; x < b; x++) {
      double d = fabs((x - center + 0.5) / filterscale);
      double v = d < 1 ? 1 - d : 0;
      w[x - a] = (float)v;
      sum += v;
    }
    if (sum > 0)
      for (int x = a; x < b; x++) w[x - a] = (float)(w[x - a] / sum);
    else if (b > a) /* a box thinner than a pixel on its edge: the nearest pixel */
      w[0] = 1, b = a + 1;
    t->first[o] = a;
    t->n[o] = b - a;
  }
  return FL_OK;
}

fl_status image_resample(const uint8_t *src, uint32_t sw, uint32_t sh, double x0, double y0, double x1, double y1,
                         uint32_t dw, uint32_t dh, float *dst) {
  if (!src || !dst || !sw || !sh || !dw || !dh)
    return fl_set_error(FL_EINVAL, "image resize: an empty image (%u x %u to %u x %u)", sw, sh, dw, dh);
  if (!(x0 >= 0 && y0 >= 0 && x1 <= sw && y1 <= sh && x1 > x0 && y1 > y0))
    return fl_set_error(FL_EINVAL, "image resize: box [%g, %g) x [%g, %g) outside a %u x %u image", x0, x1, y0, y1,
                        sw, sh);
  taps h = {0}, v = {0};
  fl_status s = taps_make(x0, x1, sw, dw, &h);
  if (s != FL_OK) return s;
  if ((s = taps_make(y0, y1, sh, dh, &v)) != FL_OK) {
    taps_free(&h);
    return s;
  }
  int ylo = v.first[0], yhi = v.first[dh - 1] + v.n[dh - 1];
  for (uint32_t o = 0; o < dh; o++) {
    if (v.first[o] < ylo) ylo = v.first[o];
    if (v.first[o] + v.n[o] > yhi) yhi = v.first[o] + v.n[o];
  }
  float *rows = common_malloc((size_t)(yhi - ylo) * dw * 3 * sizeof *rows);
  if (!rows) {
    taps_free(&h);
    taps_free(&v);
    return fl_set_error(FL_ENOMEM, "image resize: out of memory");
  }
  /* A source row as floats first: each source pixel feeds several outputs, and the loops
   * below then vectorize. */
  float *line = common_malloc((size_t)sw * 3 * sizeof *line);
  if (!line) {
    common_free(rows);
    taps_free(&h);
    taps_free(&v);
    return fl_set_error(FL_ENOMEM, "image resize: out of memory");
  }
  for (int y = ylo; y < yhi; y++) {
    const uint8_t *restrict in = src + (size_t)y * sw * 3;
    float *restrict out = rows + (size_t)(y - ylo) * dw * 3;
    for (size_t i = 0; i < (size_t)sw * 3; i++) line[i] = in[i];
    for (uint32_t o = 0; o < dw; o++) {
      const float *w = h.w + (size_t)o * h.stride;
      const float *p = line + (size_t)h.first[o] * 3;
      float r = 0, g = 0, b = 0;
      for (int k = 0; k < h.n[o]; k++, p += 3) {
        r += w[k] * p[0];
        g += w[k] * p[1];
        b += w[k] * p[2];
      }
      out[3 * o] = r, out[3 * o + 1] = g, out[3 * o + 2] = b;
    }
  }
  common_free(line);
  size_t row = (size_t)dw * 3;
  for (uint32_t o = 0; o < dh; o++) {
    const float *w = v.w + (size_t)o * v.stride;
    float *restrict out = dst + o * row;
    const float *restrict in = rows + (size_t)(v.first[o] - ylo) * row;
    float w0 = w[0];
    for (size_t i = 0; i < row; i++) out[i] = w0 * in[i];
    for (int k = 1; k < v.n[o]; k++) {
      const float *restrict next = in + (size_t)k * row;
      float wk = w[k];
      for (size_t i = 0; i < row; i++) out[i] += wk * next[i];
    }
  }
  common_free(rows);
  taps_free(&h);
  taps_free(&v);
  return FL_OK;
}

fl_status fl_image_resize(const uint8_t *src, uint32_t sw, uint32_t sh, double x0, double y0, double x1, double y1,
                          uint32_t dw, uint32_t dh, uint8_t *dst) {
  size_t n = (size_t)dw * dh * 3;
  float *f = common_malloc((n ? n : 1) * sizeof *f);
  if (!f) return fl_set_error(FL_ENOMEM, "image resize: out of memory");
  fl_status s = image_resample(src, sw, sh, x0, y0, x1, y1, dw, dh, f);
  if (s == FL_OK)
    for (size_t i = 0; i < n; i++) { /* round and clamp, branch-free so that it vectorizes */
      float v = f[i] + 0.5f;
      v = v < 0 ? 0 : v;
      v = v > 255 ? 255 : v;
      dst[i] = (uint8_t)v;
    }
  common_free(f);
  return s;
}

void image_shorter_side(uint32_t w, uint32_t h, uint32_t side, uint32_t *ow, uint32_t *oh) {
  if (w <= h) {
    *ow = side;
    *oh = (uint32_t)((uint64_t)side * h / w);
  } else {
    *oh = side;
    *ow = (uint32_t)((uint64_t)side * w / h);
  }
  if (*ow == 0) *ow = 1;
  if (*oh == 0) *oh = 1;
}
