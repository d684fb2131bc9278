/*
 * gpu/device/cuda/check.h: checked CUDA and cuBLAS calls, and the cuda device's sticky error.
 *
 * Every failed call becomes an fl_status with a message that names the call, the device, the
 * source position and CUDA's own reason:
 *     cudaMalloc(&p, rounded) on cuda:0 (gpu/device/cuda/allocator.c:141): out of memory
 * Work on a stream is asynchronous, so a kernel's fault surfaces at some later call, and it
 * leaves the CUDA context unusable. Such an error is therefore kept (sticky) in the device's
 * cuda_errstate and returned by every later operation on the device, as STYLE.md asks of
 * errors found later on a handle. Out of memory is the exception: it is the caller's to
 * handle (free something, use a smaller batch) and leaves the device usable.
 *
 * Only C files include this header (kernels.cu reports through cudaError_t returns).
 */
#ifndef FLINT_GPU_CUDA_CHECK_H
#define FLINT_GPU_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/common.h"

#define CUDA_ERROR_MESSAGE_MAX 512

/* The device's error state. Owned by the device; the allocator reports into it too. */
typedef struct cuda_errstate {
  int ordinal;                          /* the GPU, for messages ("cuda:0") */
  fl_status sticky;                     /* FL_OK until a call fails for good */
  char message[CUDA_ERROR_MESSAGE_MAX]; /* the sticky failure's message */
} cuda_errstate;

/* Reports a failed CUDA runtime call: sets the thread's error and returns its status
 * (FL_ENOMEM for cudaErrorMemoryAllocation, else FL_EDEVICE, which becomes sticky). */
FL_INTERNAL fl_status cuda_error_cuda(cuda_errstate *es, cudaError_t err, const char *call,
                                      const char *file, int line);
/* The same for a cuBLAS call (always FL_EDEVICE, sticky). */
FL_INTERNAL fl_status cuda_error_cublas(cuda_errstate *es, cublasStatus_t err,
                                        const char *call, const char *file, int line);
/* Records a failure found by flint itself (a kernel's flag) as sticky with `status`. */
FL_INTERNAL fl_status cuda_error_sticky(cuda_errstate *es, fl_status status, const char *fmt,
                                        ...) __attribute__((format(printf, 3, 4)));
/* FL_OK, or the sticky error again (with its message) once the device has failed. */
FL_INTERNAL fl_status cuda_error_check(const cuda_errstate *es);

/* Runs a CUDA runtime call; on failure stores the status in `status` and jumps to cleanup. */
#define CUDA_CHECK(es, call)                                                                 \
  do {                                                                                       \
    cudaError_t cuda_check_err_ = (call);                                                    \
    if (cuda_check_err_ != cudaSuccess) {                                                    \
      status = cuda_error_cuda((es), cuda_check_err_, #call, __FILE__, __LINE__);            \
      goto cleanup;                                                                          \
    }                                                                                        \
  } while (0)

#define CUBLAS_CHECK(es, call)                                                               \
  do {                                                                                       \
    cublasStatus_t cublas_check_err_ = (call);                                               \
    if (cublas_check_err_ != CUBLAS_STATUS_SUCCESS) {                                        \
      status = cuda_error_cublas((es), cublas_check_err_, #call, __FILE__, __LINE__);        \
      goto cleanup;                                                                          \
    }                                                                                        \
  } while (0)

/* For an operation that is one call (a kernel launcher returning cudaError_t): returns its
 * result as an fl_status. */
#define CUDA_RETURN(es, call)                                                                \
  do {                                                                                       \
    cudaError_t cuda_check_err_ = (call);                                                    \
    return cuda_check_err_ == cudaSuccess                                                    \
               ? FL_OK                                                                       \
               : cuda_error_cuda((es), cuda_check_err_, #call, __FILE__, __LINE__);          \
  } while (0)

#endif /* FLINT_GPU_CUDA_CHECK_H */
