/*
 * ml/ml.h: what the files of ml/ share. ml uses flint's public API only (flint/flint.h,
 * flint/ml.h) plus OpenBLAS and LAPACKE.
 *
 * Task functions (FL_ML_KERNEL) are exported so that cluster mode can name them by symbol:
 * executors load libflint_ml as they load any user library.
 */
#ifndef FLINT_ML_INTERNAL_H
#define FLINT_ML_INTERNAL_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "flint/ml.h"

#define FL_ML_KERNEL __attribute__((visibility("default")))

/* The monotonic clock in seconds, for the solvers' timings. ml sees only the public API,
 * which has no clock (common_now_s is flint's own), so ml keeps this one. */
static inline double ml_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Default partitions per core: Sandblaster's many small tasks. */
#define ML_PARTITIONS_PER_CORE 4
/* Default block size: about this many bytes of feature values. */
#define ML_BLOCK_BYTES (1u << 20)

/* Whether a file name ends in .gz (idx.c). */
bool ml_is_gzip_name(const char *path);

/* fl_ml_load_options.partitions / synthetic partitions when 0. */
uint32_t ml_default_partitions(fl_context *ctx, uint32_t requested);

/* Emits block record `rec` of a partition of `rows` rows in blocks of this one's size; on
 * the first call (*reserved false; `done` rows emitted with this block) it first reserves
 * the whole output, so that it lives in one allocation (fl_emit_reserve). */
fl_status ml_emit_block(fl_emitter *out, const fl_buf *rec, uint64_t done, uint64_t rows, bool *reserved);

/* Counts rows of a block dataset and its width: one job. nnz (may be NULL): the stored
 * values, non-zeros of sparse blocks and rows x cols of dense ones. */
fl_status ml_data_describe(fl_ml_data *data, uint64_t *nnz);
/* fl_ml_load's storage level: nothing is parsed again when the data outgrows memory. */
#define ML_STORAGE FL_MEMORY_AND_DISK
/* Sets data->label_seen (a copy of `seen`, FL_ML_LABEL_WORDS words; NULL: unknown) and
 * label_count. */
fl_status ml_data_set_labels(fl_ml_data *data, const uint64_t *seen);
/* Whether label y is in the set (bit y + 1). */
bool ml_label_seen(const uint64_t *seen, int64_t y);
/* Writes the labels in lo..hi that are in the set (want) or not, as "0, 3..4", into buf
 * (cut with "..." when longer); returns how many there are. */
size_t ml_format_labels(const uint64_t *seen, int64_t lo, int64_t hi, bool want, char *buf, size_t len);

/* A zeroed model (coef and intercepts in one allocation, in that order: the layout of
 * ml_glm parameters). NULL when out of memory. */
fl_ml_model *ml_model_new(fl_ml_model_kind kind, uint32_t cols, uint32_t classes, bool intercept);

/* ---- generalized linear objectives (objective.c) ---------------------------------------- */
typedef enum ml_loss { ML_LOSS_SQUARED, ML_LOSS_LOGISTIC, ML_LOSS_SOFTMAX } ml_loss;

/* One model's objective over a block dataset. Parameters: outputs x cols coefficients
 * (row-major), then `outputs` intercepts (kept at 0 without an intercept). */
typedef struct ml_glm {
  const fl_ml_data *data;
  ml_loss loss;
  uint32_t cols, outputs;
  bool intercept;
  double l2;
  bool l2_in_sum_units; /* least squares: (l2 / 2W)|w|^2, so that the optimum solves
                           (X'X + l2 I) w = X'y; else the mean loss + (l2 / 2)|w|^2 */
  uint32_t tree_depth;  /* 0: ml_tree_depth's choice */
  /* filled in */
  uint64_t evaluations;
  double weight_sum;
} ml_glm;

/* Loss (mean over the sample weight, plus the L2 term) and gradient at w: one job.
 * fraction < 1: over a mini-batch chosen by seed. */
fl_status ml_glm_eval(ml_glm *p, const double *w, double fraction, uint64_t seed, double *loss, double *grad);

/* One partition's sums at w (p's layout, n values): acc (n + 2 values, overwritten) gets
 * [loss sum, weight sum, gradient sums], unscaled and without the L2 term: what a task of
 * ml_glm_eval emits, for solvers that move the sums another way (sandblaster.c). Only p's
 * loss, cols, outputs and intercept are read. */
fl_status ml_glm_partition_sums(const ml_glm *p, uint32_t partition, fl_iter *in, const double *w, double *acc);

/* Sandblaster L-BFGS (sandblaster.c): minimizes p's objective with the vectors on
 * parameter-server shards; the parameters land in m. l1 must be 0. */
fl_status ml_sandblaster_fit(ml_glm *p, const fl_ml_train_options *o, fl_ml_model *m);

/* The partitions' vectors of n doubles, added up with fl_tree_aggregate. */
fl_status ml_sum_partitions(fl_dataset *parts, size_t n, uint32_t depth, double *out);
uint32_t ml_tree_depth(const fl_dataset *ds, uint32_t requested);

/* ---- the parameter-server solver (ps_logreg.c) ------------------------------------------ */
/* FL_EINVAL naming an option the ps solver does not take or a bad value of its own. */
fl_status ml_ps_check_options(const fl_ml_train_options *o);
/* Binary logistic regression through parameter servers into m (a zeroed binary model of
 * data->cols features): fills its weights, history and converged. */
fl_status ml_ps_logreg(const fl_ml_data *data, const fl_ml_train_options *o, fl_ml_model *m);

/* ---- the strong Wolfe line search (ml/line_search.c) ---- */
typedef struct ml_ls_point {
  double step, phi, dphi; /* phi(step) = f(w + step d), phi'(step) = g(w + step d)'d */
} ml_ls_point;
/* Evaluates phi and phi' at `step` into *out; a non-finite value must come back as phi = +inf,
 * which the search reads as "too far". */
typedef fl_status (*ml_ls_eval_fn)(void *ctx, double step, ml_ls_point *out);
#define ML_LS_MAX_EVALS 20 /* evaluations a search makes at most */
/* From phi(0) = phi0 and phi'(0) = dphi0 < 0 and a first trial `step`: on success
 * found->step > 0 is a step meeting the strong Wolfe conditions (c1 1e-4, c2 0.9), the last
 * point eval was asked for or, after a zoom, an earlier one (see the callers); found->step 0
 * when none was found within ML_LS_MAX_EVALS evaluations. eval's failure is returned. */
fl_status ml_line_search_wolfe(void *ctx, ml_ls_eval_fn eval, double phi0, double dphi0, double step,
                               ml_ls_point *found);

#endif
