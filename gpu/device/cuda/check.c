/*
 * gpu/device/cuda/check.c: messages for failed CUDA and cuBLAS calls, and the sticky error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gpu/device/cuda/check.h"

/* "gpu/device/cuda/device_cuda.c", not the build machine's absolute path. */
static const char *short_path(const char *file) {
  const char *p = strstr(file, "gpu/device/cuda/");
  return p ? p : file;
}

static fl_status record(cuda_errstate *es, fl_status status, bool sticky, const char *msg) {
  if (sticky && es && es->sticky == FL_OK) {
    es->sticky = status;
    snprintf(es->message, sizeof es->message, "%s", msg);
  }
  return fl_set_error(status, "%s", msg);
}

fl_status cuda_error_cuda(cuda_errstate *es, cudaError_t err, const char *call,
                          const char *file, int line) {
  char msg[CUDA_ERROR_MESSAGE_MAX];
  snprintf(msg, sizeof msg, "%s on cuda:%d (%s:%d): %s (%s)", call, es ? es->ordinal : -1,
           short_path(file), line, cudaGetErrorString(err), cudaGetErrorName(err));
  /* Out of memory leaves the context usable, and the runtime keeps no sticky state for it:
   * clear the last-error slot so that the next launch check does not report it again. */
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return record(es, FL_ENOMEM, false, msg);
  }
  return record(es, FL_EDEVICE, true, msg);
}

fl_status cuda_error_cublas(cuda_errstate *es, cublasStatus_t err, const char *call,
                            const char *file, int line) {
  char msg[CUDA_ERROR_MESSAGE_MAX];
  snprintf(msg, sizeof msg, "%s on cuda:%d (%s:%d): %s", call, es ? es->ordinal : -1,
           short_path(file), line, cublasGetStatusString(err));
  return record(es, FL_EDEVICE, true, msg);
}

fl_status cuda_error_sticky(cuda_errstate *es, fl_status status, const char *fmt, ...) {
  char msg[CUDA_ERROR_MESSAGE_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return record(es, status, true, msg);
}

fl_status cuda_error_check(const cuda_errstate *es) {
  if (es->sticky == FL_OK) return FL_OK;
  return fl_set_error(es->sticky, "cuda:%d failed earlier and cannot be used: %s", es->ordinal,
                      es->message);
}
