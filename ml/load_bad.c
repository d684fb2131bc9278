/*
 * load_bad.c: bad input found by fl_ml_load's tasks, counted and the first case kept (the
 * scheme is in load_bad.h).
 */
#include "ml/load_bad.h"

FL_ML_KERNEL fl_status ml_load_first_bad_line(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  ml_bad_line x = ML_BAD_LINE_NONE, y = x;
  if (a.len >= sizeof x) memcpy(&x, a.data, sizeof x);
  if (b.len >= sizeof y) memcpy(&y, b.data, sizeof y);
  bool first_a = x.file < y.file || (x.file == y.file && x.line <= y.line);
  fl_bytes keep = first_a ? a : b;
  return fl_buf_append(out, keep.data, keep.len);
}

fl_status ml_load_note_bad_line(uint64_t bad_acc, uint64_t first_acc, uint32_t file, uint64_t line,
                                const char *message) {
  (void)fl_accumulator_add_i64(bad_acc, 1);
  ml_bad_line where = {file, 0, line};
  fl_buf v = FL_BUF_INIT;
  fl_status s = fl_buf_append(&v, &where, sizeof where);
  if (s == FL_OK) s = fl_buf_append(&v, message, strlen(message));
  if (s == FL_OK) (void)fl_accumulator_add(first_acc, fl_buf_bytes(&v));
  fl_buf_free(&v);
  return s;
}
