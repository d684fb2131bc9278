/*
 * gpu/device/cuda/allocator.c: the caching allocator (design in allocator.h).
 *
 * Two tables: live blocks, an open-addressing hash from pointer to rounded size (free needs
 * the size), and free lists, one stack of pointers per rounded size, kept in an array sorted
 * by size. A training step uses a few dozen distinct sizes, so both stay small.
 */
#include <pthread.h>
#include <string.h>

#include "gpu/device/cuda/allocator.h"
#include "gpu/device/cuda/check.h"

#define SMALL_ROUND ((size_t)512)
#define LARGE_ROUND ((size_t)2 << 20)
#define LARGE_FROM ((size_t)1 << 20)

typedef struct live_slot {
  void *ptr; /* NULL: empty */
  size_t size;
} live_slot;

typedef struct free_bin {
  size_t size;
  void **ptrs;
  size_t count, cap;
} free_bin;

struct cuda_allocator {
  cuda_errstate *es;
  pthread_mutex_t mu;
  live_slot *live; /* capacity is a power of two, at most half full */
  size_t live_cap, live_count;
  free_bin *bins; /* sorted by size */
  size_t bin_count, bin_cap;
  cuda_allocator_stats stats;
};

size_t cuda_allocator_round(size_t bytes) {
  if (bytes == 0) return 0;
  size_t unit = bytes >= LARGE_FROM ? LARGE_ROUND : SMALL_ROUND;
  if (bytes > SIZE_MAX - unit) return SIZE_MAX; /* cudaMalloc will refuse it */
  return (bytes + unit - 1) / unit * unit;
}

static size_t ptr_hash(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

static fl_status live_grow(cuda_allocator *a) {
  size_t cap = a->live_cap ? a->live_cap * 2 : 256;
  live_slot *slots = common_calloc(cap, sizeof *slots);
  if (!slots) return FL_ERR(FL_ENOMEM, "cuda allocator: out of host memory for its table");
  for (size_t i = 0; i < a->live_cap; i++) {
    if (!a->live[i].ptr) continue;
    size_t j = ptr_hash(a->live[i].ptr, cap);
    while (slots[j].ptr) j = (j + 1) & (cap - 1);
    slots[j] = a->live[i];
  }
  common_free(a->live);
  a->live = slots;
  a->live_cap = cap;
  return FL_OK;
}

static fl_status live_insert(cuda_allocator *a, void *p, size_t size) {
  if ((a->live_count + 1) * 2 > a->live_cap) {
    fl_status st = live_grow(a);
    if (st != FL_OK) return st;
  }
  size_t j = ptr_hash(p, a->live_cap);
  while (a->live[j].ptr) j = (j + 1) & (a->live_cap - 1);
  a->live[j] = (live_slot){p, size};
  a->live_count++;
  return FL_OK;
}

/* Removes p; returns its size, or 0 when p is not live. Backward-shift deletion keeps every
 * probe chain unbroken without tombstones. */
static size_t live_remove(cuda_allocator *a, void *p) {
  if (a->live_cap == 0) return 0;
  size_t mask = a->live_cap - 1, j = ptr_hash(p, a->live_cap);
  while (a->live[j].ptr && a->live[j].ptr != p) j = (j + 1) & mask;
  if (!a->live[j].ptr) return 0;
  size_t size = a->live[j].size;
  size_t hole = j;
  for (size_t k = (j + 1) & mask; a->live[k].ptr; k = (k + 1) & mask) {
    size_t home = ptr_hash(a->live[k].ptr, a->live_cap);
    /* Move k into the hole unless its home lies cyclically in (hole, k]. */
    bool stays = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
    if (!stays) {
      a->live[hole] = a->live[k];
      hole = k;
    }
  }
  a->live[hole] = (live_slot){NULL, 0};
  a->live_count--;
  return size;
}

/* The bin for `size`, created when `create`; NULL when absent (or out of host memory). */
static free_bin *bin_find(cuda_allocator *a, size_t size, bool create) {
  size_t lo = 0, hi = a->bin_count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (a->bins[mid].size < size)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < a->bin_count && a->bins[lo].size == size) return &a->bins[lo];
  if (!create) return NULL;
  if (a->bin_count == a->bin_cap) {
    size_t cap = a->bin_cap ? a->bin_cap * 2 : 32;
    free_bin *bins = common_realloc(a->bins, cap * sizeof *bins);
    if (!bins) return NULL;
    a->bins = bins;
    a->bin_cap = cap;
  }
  memmove(&a->bins[lo + 1], &a->bins[lo], (a->bin_count - lo) * sizeof *a->bins);
  a->bins[lo] = (free_bin){.size = size};
  a->bin_count++;
  return &a->bins[lo];
}

fl_status cuda_allocator_create(cuda_errstate *es, cuda_allocator **out) {
  cuda_allocator *a = common_calloc(1, sizeof *a);
  if (!a) return FL_ERR(FL_ENOMEM, "cuda allocator: out of host memory");
  a->es = es;
  FL_PCHECK(pthread_mutex_init(&a->mu, NULL));
  *out = a;
  return FL_OK;
}

/* Returns every cached block to CUDA. Called with the mutex held. */
static fl_status flush_locked(cuda_allocator *a) {
  fl_status status = FL_OK;
  if (a->stats.cached == 0) return FL_OK;
  /* A cached block may still be used by queued work (blocks are reused in stream order);
   * cudaFree must not pull it from under that work. */
  CUDA_CHECK(a->es, cudaDeviceSynchronize());
  for (size_t i = 0; i < a->bin_count; i++) {
    free_bin *b = &a->bins[i];
    while (b->count > 0) {
      CUDA_CHECK(a->es, cudaFree(b->ptrs[b->count - 1]));
      b->count--;
      a->stats.cached -= b->size;
    }
  }
  a->stats.cache_flushes++;
cleanup:
  return status;
}

void cuda_allocator_destroy(cuda_allocator *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  /* Errors here can only be reported through the device's sticky state, which the device
   * is about to drop: a device that failed cannot free its memory anyway. */
  (void)flush_locked(a);
  for (size_t i = 0; i < a->live_cap; i++)
    if (a->live[i].ptr) (void)cudaFree(a->live[i].ptr);
  for (size_t i = 0; i < a->bin_count; i++) common_free(a->bins[i].ptrs);
  common_free(a->bins);
  common_free(a->live);
  pthread_mutex_unlock(&a->mu);
  pthread_mutex_destroy(&a->mu);
  common_free(a);
}

fl_status cuda_allocator_alloc(cuda_allocator *a, size_t bytes, void **out) {
  fl_status status = FL_OK;
  void *p = NULL;
  *out = NULL;
  if (bytes == 0) return FL_OK;
  size_t size = cuda_allocator_round(bytes);
  pthread_mutex_lock(&a->mu);
  free_bin *bin = bin_find(a, size, false);
  if (bin && bin->count > 0) {
    p = bin->ptrs[--bin->count];
    a->stats.cached -= size;
    a->stats.cache_hits++;
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation && a->stats.cached > 0) {
      /* The cache may hold enough memory in blocks of other sizes: give it back, try once
       * more. */
      (void)cudaGetLastError();
      FL_CHECK(flush_locked(a));
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      p = NULL;
      status = cuda_error_cuda(a->es, err, "cudaMalloc(&p, size)", __FILE__, __LINE__);
      if (status == FL_ENOMEM)
        status = fl_set_error(FL_ENOMEM,
                              "cuda:%d: out of GPU memory allocating %zu bytes (%zu in use "
                              "by flint, cache returned): %s",
                              a->es->ordinal, size, a->stats.allocated,
                              cudaGetErrorString(err));
      goto cleanup;
    }
    a->stats.cuda_mallocs++;
  }
  if (live_insert(a, p, size) != FL_OK) {
    /* Keep the block in the cache's accounting rather than lose it. */
    status = FL_ENOMEM;
    bin = bin_find(a, size, true);
    if (bin && bin->count < bin->cap) {
      bin->ptrs[bin->count++] = p;
      a->stats.cached += size;
    } else {
      (void)cudaFree(p);
    }
    p = NULL;
    goto cleanup;
  }
  a->stats.allocated += size;
  if (a->stats.allocated > a->stats.peak_allocated) a->stats.peak_allocated = a->stats.allocated;
  *out = p;
cleanup:
  pthread_mutex_unlock(&a->mu);
  return status;
}

void cuda_allocator_free(cuda_allocator *a, void *p) {
  if (!p) return;
  pthread_mutex_lock(&a->mu);
  size_t size = live_remove(a, p);
  if (size == 0) common_assert_failed(__FILE__, __LINE__, "cuda_allocator_free: unknown block");
  a->stats.allocated -= size;
  free_bin *bin = bin_find(a, size, true);
  if (bin && bin->count == bin->cap) {
    size_t cap = bin->cap ? bin->cap * 2 : 8;
    void **ptrs = common_realloc(bin->ptrs, cap * sizeof *ptrs);
    if (ptrs) {
      bin->ptrs = ptrs;
      bin->cap = cap;
    }
  }
  if (bin && bin->count < bin->cap) {
    bin->ptrs[bin->count++] = p;
    a->stats.cached += size;
  } else {
    /* No host memory for the free list: give the block straight back. cudaFree may fail
     * only for an earlier asynchronous error, which the next checked call reports. */
    (void)cudaFree(p);
  }
  pthread_mutex_unlock(&a->mu);
}

fl_status cuda_allocator_flush(cuda_allocator *a) {
  pthread_mutex_lock(&a->mu);
  fl_status status = flush_locked(a);
  pthread_mutex_unlock(&a->mu);
  return status;
}

void cuda_allocator_get_stats(cuda_allocator *a, cuda_allocator_stats *out) {
  pthread_mutex_lock(&a->mu);
  *out = a->stats;
  pthread_mutex_unlock(&a->mu);
}
