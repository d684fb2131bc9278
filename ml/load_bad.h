/*
 * load_bad.h: how fl_ml_load's tasks report bad input (load_bad.c), private to the loaders
 * (load.c: text, load_idx.c: IDX): each bad line or image is counted in one accumulator and
 * the first (by file, then line) kept in another, so that the load can name it whichever task
 * found it.
 */
#ifndef FLINT_ML_LOAD_BAD_H
#define FLINT_ML_LOAD_BAD_H

#include "ml/ml.h"

/* The longest cause of a bad line or image. */
#define ML_LOAD_CAUSE_MAX 256

/* The first-bad-line accumulator's value: where, then the message (not NUL-terminated). */
typedef struct ml_bad_line {
  uint32_t file, zero;
  uint64_t line;
} ml_bad_line;
/* The value before any bad line: after every real one. */
#define ML_BAD_LINE_NONE {UINT32_MAX, 0, UINT64_MAX}

/* The first-bad-line accumulator's merge: keeps the bad line that comes first (file, then
 * line). Values are ml_bad_line + message. */
FL_ML_KERNEL fl_status ml_load_first_bad_line(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
/* Counts a bad line in accumulator bad_acc and offers "message" at (file, line) as the first
 * to first_acc. Counting is best effort: when a cached partition is recomputed after fl_ml_load
 * has returned, its accumulators are gone, and that must not fail the task. */
fl_status ml_load_note_bad_line(uint64_t bad_acc, uint64_t first_acc, uint32_t file, uint64_t line,
                                const char *message);

#endif
