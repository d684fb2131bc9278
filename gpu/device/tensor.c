/*
 * gpu/device/tensor.c: dense fp32 tensors on a device. The public calls (fl_tensor_*) validate
 * their arguments here, in one place, and move memory through the device's vtable; views
 * and tensors embedded by value (layers' outputs, scratch) are for gpu/ internals.
 */
#include <inttypes.h>
#include <stdio.h>

#include "common/common.h"
#include "gpu/device/device.h"

/* Checks ndim and shape and computes the element count; `who` names the caller. */
static fl_status shape_numel(const char *who, int ndim, const int64_t *shape, size_t *out) {
  if (ndim < 1 || ndim > FL_TENSOR_MAX_DIMS)
    return fl_set_error(FL_EINVAL, "%s: ndim %d is outside [1, %d]", who, ndim,
                        FL_TENSOR_MAX_DIMS);
  if (!shape) return fl_set_error(FL_EINVAL, "%s: shape is NULL", who);
  size_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return fl_set_error(FL_EINVAL, "%s: dimension %d is negative (%" PRId64 ")", who, i,
                          shape[i]);
    /* The byte count must fit a size_t, and every dimension an int (the ops take ints). */
    if (shape[i] > INT32_MAX ||
        (shape[i] != 0 && n > SIZE_MAX / sizeof(float) / (size_t)shape[i]))
      return fl_set_error(FL_EINVAL, "%s: dimension %d (%" PRId64 ") makes the tensor too large",
                          who, i, shape[i]);
    n *= (size_t)shape[i];
  }
  *out = n;
  return FL_OK;
}

static void set_shape(fl_tensor *t, int ndim, const int64_t *shape, size_t numel) {
  t->ndim = ndim;
  for (int i = 0; i < FL_TENSOR_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 0;
  t->numel = numel;
}

FL_API fl_status fl_tensor_create(fl_device *dev, int ndim, const int64_t *shape,
                                  fl_tensor **out) {
  if (!dev) return fl_set_error(FL_EINVAL, "fl_tensor_create: dev is NULL");
  if (!out) return fl_set_error(FL_EINVAL, "fl_tensor_create: out is NULL");
  size_t numel;
  fl_status st = shape_numel("fl_tensor_create", ndim, shape, &numel);
  if (st != FL_OK) return st;
  fl_tensor *t = common_calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "fl_tensor_create: out of memory");
  st = tensor_ensure(t, dev, ndim, shape);
  if (st == FL_OK && numel) st = dev->ops->memset0(dev, t->data, numel * sizeof(float));
  if (st != FL_OK) {
    tensor_release(t);
    common_free(t);
    return st;
  }
  *out = t;
  return FL_OK;
}

FL_API void fl_tensor_destroy(fl_tensor *t) {
  if (!t) return;
  tensor_release(t);
  common_free(t);
}

FL_API int fl_tensor_ndim(const fl_tensor *t) { return t ? t->ndim : 0; }

FL_API int64_t fl_tensor_dim(const fl_tensor *t, int axis) {
  if (!t || axis < 0 || axis >= t->ndim) return 0;
  return t->shape[axis];
}

FL_API size_t fl_tensor_numel(const fl_tensor *t) { return t ? t->numel : 0; }

FL_API fl_device *fl_tensor_device(const fl_tensor *t) { return t ? t->dev : NULL; }

static fl_status check_copy(const char *who, const fl_tensor *t, const float *host,
                            size_t count) {
  if (!t) return fl_set_error(FL_EINVAL, "%s: tensor is NULL", who);
  if (!host && count) return fl_set_error(FL_EINVAL, "%s: host buffer is NULL", who);
  if (count != t->numel)
    return fl_set_error(FL_EINVAL, "%s: count %zu does not match the tensor's %zu elements",
                        who, count, t->numel);
  return FL_OK;
}

FL_API fl_status fl_tensor_write(fl_tensor *t, const float *src, size_t count) {
  fl_status st = check_copy("fl_tensor_write", t, src, count);
  if (st != FL_OK || count == 0) return st;
  return t->dev->ops->from_host(t->dev, t->data, src, count * sizeof(float));
}

FL_API fl_status fl_tensor_read(const fl_tensor *t, float *dst, size_t count) {
  fl_status st = check_copy("fl_tensor_read", t, dst, count);
  if (st != FL_OK || count == 0) return st;
  return t->dev->ops->to_host(t->dev, dst, t->data, count * sizeof(float));
}

fl_status tensor_view(fl_tensor *base, size_t offset, int ndim, const int64_t *shape,
                      fl_tensor *out) {
  if (!base || !out) return fl_set_error(FL_EINVAL, "tensor_view: NULL argument");
  size_t numel;
  fl_status st = shape_numel("tensor_view", ndim, shape, &numel);
  if (st != FL_OK) return st;
  if (offset > base->numel || numel > base->numel - offset)
    return fl_set_error(FL_EINVAL, "tensor_view: %zu elements at offset %zu do not fit in a "
                        "tensor of %zu", numel, offset, base->numel);
  fl_tensor v = {0};
  v.dev = base->dev;
  set_shape(&v, ndim, shape, numel);
  v.data = base->data ? base->data + offset : NULL;
  v.owns = false;
  *out = v;
  return FL_OK;
}

fl_status tensor_ensure(fl_tensor *t, fl_device *dev, int ndim, const int64_t *shape) {
  if (!t || !dev) return fl_set_error(FL_EINVAL, "tensor_ensure: NULL argument");
  size_t numel;
  fl_status st = shape_numel("tensor_ensure", ndim, shape, &numel);
  if (st != FL_OK) return st;
  /* A view has no memory of its own to grow; turning it into an owner would hide a bug. */
  FL_ASSERT(t->owns || !t->data);
  FL_ASSERT(!t->dev || t->dev == dev);
  if (numel > t->capacity) {
    void *p = NULL;
    st = dev->ops->alloc(dev, numel * sizeof(float), &p);
    if (st != FL_OK) return st;
    if (t->data) dev->ops->free(dev, t->data);
    t->data = p;
    t->capacity = numel;
    t->owns = true;
  }
  t->dev = dev;
  set_shape(t, ndim, shape, numel);
  return FL_OK;
}

void tensor_release(fl_tensor *t) {
  if (!t) return;
  if (t->owns && t->data) t->dev->ops->free(t->dev, t->data);
  *t = (fl_tensor){0};
}
