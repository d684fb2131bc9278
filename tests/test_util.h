/* test_util.h: helpers shared by the CMocka tests: temporary folders and files. */
#ifndef FLINT_TEST_UTIL_H
#define FLINT_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "flint/flint.h"

/* For helpers that run on rank threads: cmocka's asserts may only fail on the main thread
 * (they longjmp), so a failure here prints flint's message and aborts the program. */
#define must_ok(call)                                                                        \
  do {                                                                                       \
    fl_status m_ = (call);                                                                   \
    if (m_ != FL_OK) {                                                                       \
      fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,              \
              fl_status_name(m_), fl_last_error());                                          \
      abort();                                                                               \
    }                                                                                        \
  } while (0)

/* A xorshift draw, uniform in +-[0.05, 1): never zero, so that a kernel that writes zeros (or
 * drops an element) is told from one that keeps it. */
static inline float test_urand_signed(uint64_t *state) {
  *state ^= *state << 13;
  *state ^= *state >> 7;
  *state ^= *state << 17;
  double u = (double)(*state >> 11) / (double)(1ull << 53);
  double mag = 0.05 + 0.95 * ((u * 2.0) - (double)(int)(u * 2.0));
  return (float)(u < 0.5 ? -mag : mag);
}

/* Test hook of libflint (common/alloc.c): the allocation after n more fails; -1: never. */
void flint_test_fail_alloc_after(long n);

/* A fresh folder under $TMPDIR (or /tmp), written into buf. */
static inline void test_tmpdir(char *buf, size_t len) {
  const char *base = getenv("TMPDIR");
  snprintf(buf, len, "%s/flint-test-XXXXXX", base && *base ? base : "/tmp");
  assert_non_null(mkdtemp(buf));
}

static inline void test_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static inline void test_rmtree(const char *path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  assert_int_equal(system(cmd), 0);
}

/* A time bound per test, as setup and teardown of cmocka_unit_test_setup_teardown: a test
 * that runs past TEST_TIME_BOUND_S seconds (define it before including this; default 120) ends
 * the program with status 3 and a message, so that ctest reports it instead of hanging. */
#ifndef TEST_TIME_BOUND_S
#define TEST_TIME_BOUND_S 120
#endif
static inline void test_bound_expired(int sig) {
  (void)sig;
  static const char msg[] = "a test ran past its time bound (TEST_TIME_BOUND_S)\n";
  if (write(2, msg, sizeof msg - 1)) {
  }
  _exit(3);
}
static inline int test_bound_arm(void **state) {
  (void)state;
  signal(SIGALRM, test_bound_expired);
  alarm(TEST_TIME_BOUND_S);
  return 0;
}
static inline int test_bound_disarm(void **state) {
  (void)state;
  alarm(0);
  return 0;
}

/* Asserts that a call succeeded, printing flint's message when it did not. */
#define assert_ok(call)                                                                      \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    if (s_ != FL_OK) fprintf(stderr, "%s failed: %s: %s\n", #call, fl_status_name(s_), fl_last_error()); \
    assert_int_equal(s_, FL_OK);                                                             \
  } while (0)

/* Asserts a failure with the given code whose message contains `needle`. */
#define assert_fails_with(call, code, needle)                                                \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    assert_int_equal(s_, (code));                                                            \
    if (!strstr(fl_last_error(), (needle)))                                                  \
      fprintf(stderr, "message '%s' lacks '%s'\n", fl_last_error(), (needle));              \
    assert_non_null(strstr(fl_last_error(), (needle)));                                      \
  } while (0)

#endif
