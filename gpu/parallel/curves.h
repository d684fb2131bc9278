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

/* The progress line of an epoch, without a line end:
 *   "epoch 3/10 [##########..........] 52% loss 0.512 acc 0.830 1234 img/s"
 * Returns what snprintf returns. */
int curves_progress_format(char *buf, size_t cap, uint32_t epoch, uint32_t epochs, double fraction,
                           double loss, double acc, double images_per_s);
/* Writes the line and `eta` (may be NULL) to f and flushes. in_place (f is a terminal):
 * "\r" first, so that each call overwrites the last, and `done` ends the line with "\n".
 * Else (a file, a pipe) only `done` calls write, a whole line each. */
void curves_progress_print(FILE *f, bool in_place, uint32_t epoch, uint32_t epochs, double fraction, double loss,
                           double acc, double images_per_s, const char *eta, bool done);

#endif /* FLINT_GPU_CURVES_H */
