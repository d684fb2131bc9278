/*
 * gpu/parallel/curves.h: what `flint train` shows and leaves behind: a progress line per epoch
 * on the terminal, and the training curves (one row per epoch) as a CSV file and an SVG plot.
 *
 * Plain data, no device: usable from any thread that owns the curves.
 */
#ifndef FLINT_GPU_CURVES_H
#define FLINT_GPU_CURVES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "flint/flint.h"

/* One epoch. A metric that was not measured (no test set) is NaN: an empty CSV field and
 * no point in the plot. */
typedef struct curves_row {
  uint32_t epoch; /* 1-based */
  double train_loss, train_acc;
  double test_loss, test_acc;
  double lr;           /* the rate at the end of the epoch */
  double images_per_s; /* training images per second over all ranks */
  double seconds;      /* wall time of the epoch (training and evaluation) */
  double reduced_mb;   /* MiB of gradients or weights a rank has allreduced so far (0: one rank) */
  /* Not in the CSV: rank 0's seconds waiting for its training batches, copying them to the
   * device, and training (the steps, without evaluation); 0 where not measured. */
  double input_wait_s, upload_s, train_s;
} curves_row;

typedef struct curves {
  curves_row *rows;
  size_t count, cap;
} curves;
#define CURVES_INIT {NULL, 0, 0}

/* Copies `row` to the end. FL_ENOMEM. */
fl_status curves_append(curves *c, const curves_row *row);
/* Frees the rows and resets to empty. */
void curves_free(curves *c);

/* The CSV header line, then one line per row (%.6g numbers): elapsed_s is the epochs'
 * seconds so far and reduced_mb the row's, so that loss can be plotted against time and
 * against bytes sent (local SGD against synchronous SGD):
 *   epoch,train_loss,train_acc,test_loss,test_acc,lr,images_per_s,seconds,elapsed_s,reduced_mb */
#define CURVES_CSV_HEADER \
  "epoch,train_loss,train_acc,test_loss,test_acc,lr,images_per_s,seconds,elapsed_s,reduced_mb"
/* Replace out's contents. */
fl_status curves_csv(const curves *c, fl_buf *out);
/* An SVG document of two panels side by side: loss (train, test) and accuracy (train, test,
 * on 0..1) against the epoch, each with axes, ticks, labels and a legend; `title` (may be
 * NULL) above them. Each series is one <polyline>. */
fl_status curves_svg(const curves *c, const char *title, fl_buf *out);
/* Write them to a file; FL_EIO names the file. */
fl_status curves_write_csv(const curves *c, const char *path);
fl_status curves_write_svg(const curves *c, const char *title, const char *path);

/* ---- comparing runs (`flint train compare`): training loss against time and against bytes
 * sent, one series per run (issue 35's comparison of consistency and sync modes). ---- */
#define CURVES_COMPARE_MAX 20
typedef struct curves_run {
  char label[64];
  double *elapsed, *mb, *loss; /* n of each; NaN where not measured */
  size_t n;
} curves_run;
/* Reads a curves CSV by its header's names: train_loss (or loss), elapsed_s, and sent_mb (or
 * reduced_mb); other columns are ignored. label NULL: the file's name. FL_ENOENT or FL_EIO
 * naming the file; FL_EFORMAT naming file:line for a missing column, a ragged row or a field
 * that is not a number, or no rows. */
FL_API fl_status curves_run_read(const char *path, const char *label, curves_run *out);
FL_API void curves_run_free(curves_run *r);
/* An SVG of two panels: training loss against elapsed seconds and against MiB sent, a series
 * (and legend entry) per run. 1 to CURVES_COMPARE_MAX runs, else FL_EINVAL. */
fl_status curves_compare_svg(const curves_run *runs, size_t n, const char *title, fl_buf *out);
FL_API fl_status curves_write_compare_svg(const curves_run *runs, size_t n, const char *title, const char *path);

/* The progress line of an epoch, without a line end:
 *   "epoch 3/10 [##########..........] 52% loss 0.512 acc 0.830 1234 img/s"
 * Returns what snprintf returns. */
int curves_progress_format(char *buf, size_t cap, uint32_t epoch, uint32_t epochs, double fraction,
                           double loss, double acc, double images_per_s);
/* Writes "\r" + the line to f (a terminal: each call overwrites the last) and flushes;
 * `done` ends the line with "\n". */
void curves_progress_print(FILE *f, uint32_t epoch, uint32_t epochs, double fraction, double loss,
                           double acc, double images_per_s, bool done);

#endif /* FLINT_GPU_CURVES_H */
