/*
 * ui_jobs.c: the functions of test_ui's jobs, in a shared library so that a local-cluster's
 * executors can load them: a key by residue, a sum, and a map that waits for a file (so that
 * a job is seen running).
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flint/flint.h"

fl_status ui_key_mod10(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t v;
  memcpy(&v, rec.data, sizeof v);
  int64_t k = v % 10;
  return fl_buf_append(out, &k, sizeof k);
}

fl_status ui_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  int64_t x, y;
  memcpy(&x, a.data, sizeof x);
  memcpy(&y, b.data, sizeof y);
  x += y;
  return fl_buf_append(out, &x, sizeof x);
}

/* Waits (at most 60 s) for the file named by arg to exist, then passes the record on. */
fl_status ui_wait_file(fl_bytes rec, fl_buf *out, const void *arg) {
  for (int i = 0; i < 6000 && access((const char *)arg, F_OK) != 0; i++) usleep(10000);
  return fl_buf_append(out, rec.data, rec.len);
}
