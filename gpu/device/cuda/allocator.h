/*
 * gpu/device/cuda/allocator.h: the cuda device's caching allocator (as PyTorch's).
 *
 * cudaMalloc and cudaFree are slow (cudaFree synchronizes the whole device), and a training
 * step allocates the same sizes every step. So sizes are rounded up (to 512 B, and blocks of
 * 1 MiB or more to 2 MiB), a freed block goes to a free list for its rounded size and the
 * next request of that size takes it back without a CUDA call. The cache is returned to
 * CUDA when cudaMalloc fails (then the allocation is tried once more) and when the
 * allocator is destroyed.
 *
 * Blocks are reused in stream order: the device queues all its work on one stream, so a
 * block freed by the host while kernels that use it are still queued can be handed out at
 * once; the new owner's work runs after theirs. Work on another stream that uses a block
 * must be synchronized before the block is freed.
 *
 * Thread-safe (a mutex), although a device is used by one thread at a time.
 */
#ifndef FLINT_GPU_CUDA_ALLOCATOR_H
#define FLINT_GPU_CUDA_ALLOCATOR_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/device/backend.h"

typedef struct cuda_allocator cuda_allocator;
struct cuda_errstate;

typedef struct cuda_allocator_stats {
  size_t allocated;      /* bytes (rounded) handed out and not yet freed */
  size_t cached;         /* bytes held in free lists */
  size_t peak_allocated; /* the most `allocated` has been */
  uint64_t cuda_mallocs; /* cudaMalloc calls that succeeded */
  uint64_t cache_hits;   /* allocations served from the cache */
  uint64_t cache_flushes; /* times the cache was returned to CUDA */
} cuda_allocator_stats;

/* The size a request of `bytes` takes (0 stays 0). */
size_t cuda_allocator_round(size_t bytes);

/* An allocator for the current CUDA device; failures are reported through `es` (the
 * device's error state, which must outlive the allocator). */
fl_status cuda_allocator_create(struct cuda_errstate *es, cuda_allocator **out);
/* Frees every block, cached or not (tensors should be gone by then). NULL does nothing. */
void cuda_allocator_destroy(cuda_allocator *a);
/* Device memory for `bytes` (NULL for 0 bytes). FL_ENOMEM names the size and the device
 * when the GPU has no room even after the cache was returned. May block (cudaMalloc). */
fl_status cuda_allocator_alloc(cuda_allocator *a, size_t bytes, void **out);
/* Puts a block back into the cache. NULL does nothing; a pointer that did not come from
 * this allocator is a bug (abort). */
void cuda_allocator_free(cuda_allocator *a, void *p);
/* Returns the cached blocks to CUDA (synchronizes the device first). */
fl_status cuda_allocator_flush(cuda_allocator *a);
void cuda_allocator_get_stats(cuda_allocator *a, cuda_allocator_stats *out);

/* The allocator stats of a cuda device (tests and benchmarks). FL_EINVAL for another kind. */
fl_status cuda_device_allocator_stats(fl_device *dev, cuda_allocator_stats *out);
/* Returns a cuda device's cached blocks to CUDA. FL_EINVAL for another kind. */
fl_status cuda_device_flush_cache(fl_device *dev);

#endif /* FLINT_GPU_CUDA_ALLOCATOR_H */
