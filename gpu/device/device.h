/*
 * gpu/device/device.h: devices and tensors, what the rest of gpu/ uses of gpu/device/. A
 * device is a small vtable of memory and math operations (gpu/device/backend.h has it, with
 * the rules every operation keeps): layers, optimizers and collectives are written once
 * against these operations, so every algorithm runs, and is tested, on the cpu device. A
 * tensor is fp32 memory of one device with a shape (gpu/device/tensor.c).
 */
#ifndef FLINT_GPU_DEVICE_H
#define FLINT_GPU_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"
#include "gpu/device/backend.h"

struct fl_tensor {
  fl_device *dev;
  int ndim;
  int64_t shape[FL_TENSOR_MAX_DIMS];
  size_t numel;
  float *data; /* device memory */
  bool owns;   /* false for a view into another tensor's memory */
  size_t capacity; /* elements allocated at data (owned tensors; tensor_ensure grows it) */
};

/* Tensors inside gpu/: a view shares memory with its base (owns = false); shape must fit. */
fl_status tensor_view(fl_tensor *base, size_t offset, int ndim, const int64_t *shape,
                      fl_tensor *out);
/* (Re)shapes t to `shape`, reallocating only when it needs more memory than it has. t is a
 * tensor embedded by value: zero-initialised before its first use, owned (not a view). The
 * contents are undefined after a reallocation. */
fl_status tensor_ensure(fl_tensor *t, fl_device *dev, int ndim, const int64_t *shape);
/* Frees the memory of a tensor embedded by value (nothing for a view or a zeroed tensor) and
 * zeroes it. */
void tensor_release(fl_tensor *t);

#endif /* FLINT_GPU_DEVICE_H */
