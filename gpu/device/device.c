/*
 * gpu/device/device.c: the public device calls, dispatching to the cpu and cuda backends.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/device/device.h"

#ifndef FLINT_HAVE_CUDA
/* Built without nvcc: the cuda device exists in the API and says why it cannot be used. */
fl_status cuda_device_init(fl_device *dev, int ordinal) {
  (void)dev;
  return fl_set_error(FL_ENODEVICE, "device cuda:%d: flint was built without CUDA (nvcc was not "
                      "found when it was configured)", ordinal);
}
int cuda_device_count(void) { return 0; }
#endif

FL_API fl_status fl_device_open(fl_device_kind kind, int ordinal, fl_device **out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_device_open: out is NULL");
  if (kind != FL_DEVICE_CPU && kind != FL_DEVICE_CUDA)
    return fl_set_error(FL_EINVAL, "fl_device_open: unknown device kind %d", (int)kind);
  if (kind == FL_DEVICE_CUDA && ordinal < 0)
    return fl_set_error(FL_EINVAL, "fl_device_open: negative GPU ordinal %d", ordinal);
  fl_device *dev = common_calloc(1, sizeof *dev);
  if (!dev) return fl_set_error(FL_ENOMEM, "fl_device_open: out of memory");
  dev->kind = kind;
  dev->ordinal = kind == FL_DEVICE_CPU ? 0 : ordinal;
  fl_status st = kind == FL_DEVICE_CPU ? cpu_device_init(dev) : cuda_device_init(dev, ordinal);
  if (st != FL_OK) {
    common_free(dev);
    return st;
  }
  *out = dev;
  return FL_OK;
}

FL_API void fl_device_close(fl_device *dev) {
  if (!dev) return;
  if (dev->ops) {
    (void)dev->ops->synchronize(dev);
    dev->ops->destroy(dev);
  }
  common_free(dev);
}

FL_API fl_status fl_device_parse(const char *text, fl_device_kind *kind, int *ordinal) {
  if (!text || !kind || !ordinal) return fl_set_error(FL_EINVAL, "fl_device_parse: NULL argument");
  if (strcmp(text, "cpu") == 0) {
    *kind = FL_DEVICE_CPU;
    *ordinal = 0;
    return FL_OK;
  }
  if (strcmp(text, "cuda") == 0) {
    *kind = FL_DEVICE_CUDA;
    *ordinal = 0;
    return FL_OK;
  }
  if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
    char *end;
    long v = strtol(text + 5, &end, 10);
    if (*end == '\0' && v >= 0 && v < 1024) {
      *kind = FL_DEVICE_CUDA;
      *ordinal = (int)v;
      return FL_OK;
    }
  }
  return fl_set_error(FL_EINVAL, "unknown device '%s' (expected cpu, cuda or cuda:N)", text);
}

FL_API int fl_cuda_device_count(void) { return cuda_device_count(); }

FL_API fl_device_kind fl_device_kind_of(const fl_device *dev) { return dev->kind; }

FL_API const char *fl_device_name(const fl_device *dev) { return dev ? dev->name : "(null)"; }

FL_API fl_status fl_device_synchronize(fl_device *dev) {
  if (!dev) return fl_set_error(FL_EINVAL, "fl_device_synchronize: dev is NULL");
  return dev->ops->synchronize(dev);
}

static const char *const precision_names[] = {"fp32", "tf32", "bf16", "fp16"};
#define PRECISIONS (sizeof precision_names / sizeof precision_names[0])

FL_API const char *fl_precision_name(fl_precision precision) {
  return (unsigned)precision < PRECISIONS ? precision_names[precision] : "?";
}

FL_API fl_status fl_precision_parse(const char *text, fl_precision *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "fl_precision_parse: NULL argument");
  for (unsigned i = 0; i < PRECISIONS; i++)
    if (strcmp(text, precision_names[i]) == 0) {
      *out = (fl_precision)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown precision '%s' (expected fp32, tf32, bf16 or fp16)", text);
}

FL_API fl_status fl_device_set_precision(fl_device *dev, fl_precision precision) {
  if (!dev) return fl_set_error(FL_EINVAL, "fl_device_set_precision: dev is NULL");
  if ((unsigned)precision >= PRECISIONS)
    return fl_set_error(FL_EINVAL, "fl_device_set_precision: unknown precision %d", (int)precision);
  if (precision != FL_PRECISION_FP32) {
    if (!dev->ops->check_precision)
      return fl_set_error(FL_EINVAL, "device %s computes in fp32 only: precision %s needs a cuda device", dev->name,
                          fl_precision_name(precision));
    fl_status st = dev->ops->check_precision(dev, precision);
    if (st != FL_OK) return st;
  }
  dev->precision = precision;
  return FL_OK;
}

FL_API fl_precision fl_device_precision(const fl_device *dev) { return dev ? dev->precision : FL_PRECISION_FP32; }
