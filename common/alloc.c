/*
 * alloc.c: flint's allocator (fl_malloc, fl_calloc, fl_realloc, fl_free in flint.h; the
 * common_* names of common.h are the same functions). One per process, in libflint: flint's
 * add-on libraries allocate through the public names, so that the test hook below sees
 * their allocations too.
 *
 * Threads: any. The hook is one atomic counter.
 */
#include "common/common.h"

/* -1: never fail. Otherwise the number of allocations that still succeed. */
static atomic_long fail_after = -1;

void flint_test_fail_alloc_after(long n) { atomic_store(&fail_after, n); }

static bool alloc_should_fail(void) {
  long n = atomic_load_explicit(&fail_after, memory_order_relaxed);
  if (n < 0) return false;
  while (n >= 0) {
    if (n == 0) return true;
    if (atomic_compare_exchange_weak(&fail_after, &n, n - 1)) return false;
  }
  return false;
}

void *fl_malloc(size_t size) { return alloc_should_fail() ? NULL : malloc(size ? size : 1); }
void *fl_calloc(size_t count, size_t size) {
  return alloc_should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}
void *fl_realloc(void *p, size_t size) {
  return alloc_should_fail() ? NULL : realloc(p, size ? size : 1);
}
void fl_free(void *p) { free(p); }
