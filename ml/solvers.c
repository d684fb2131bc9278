/*
 * solvers.c: least squares and logistic regression.
 *
 * Least squares by the normal equations: one stage computes, per partition, the augmented
 * sufficient statistics [X 1]' W [X 1] (X'X by one dsyrk per block), [X 1]' W y and y' W y,
 * fl_tree_aggregate adds them, and the driver solves (X'X + l2 I) w = X'y by Cholesky
 * (LAPACKE). Everything else (least squares above the feature limit, logistic regression)
 * minimizes the objective of objective.c with fl_ml_minimize, one stage per evaluation.
 */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ml/ml.h"

#define DEFAULT_NORMAL_MAX_FEATURES 4096

fl_status fl_ml_solver_parse(const char *name, fl_ml_solver *out) {
  static const char *const names[] = {"auto", "normal", "lbfgs", "gd", "sandblaster", "ps"};
  for (int i = 0; name && i < 6; i++)
    if (strcmp(name, names[i]) == 0) {
      *out = (fl_ml_solver)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown solver '%s' (auto, normal, lbfgs, gd, sandblaster or ps)",
                      name ? name : "(null)");
}

static fl_status check_options(const fl_ml_data *data, const fl_ml_train_options *o, const char *who) {
  if (!data || !data->blocks) return fl_set_error(FL_EINVAL, "%s: no data", who);
  if (data->cols == 0) return fl_set_error(FL_EINVAL, "%s: the data has no features", who);
  if (!(o->l2 >= 0) || !(o->l1 >= 0) || !(o->tol >= 0) || !(o->fraction >= 0 && o->fraction <= 1) || !(o->step >= 0))
    return fl_set_error(FL_EINVAL, "%s: l2, l1, tol and step must be >= 0 and fraction in [0, 1]", who);
  if ((unsigned)o->solver > FL_ML_SOLVER_PS)
    return fl_set_error(FL_EINVAL, "%s: unknown solver %d", who, (int)o->solver);
  if (o->solver == FL_ML_SOLVER_SANDBLASTER && o->l1 > 0)
    return fl_set_error(FL_EINVAL, "%s: the sandblaster solver is L-BFGS for smooth objectives: no L1 penalty (use "
                        "lbfgs, which runs OWL-QN)", who);
  return FL_OK;
}

/* ---- normal equations ------------------------------------------------------------------ */

/* acc: [W, y'Wy, A ((d+1) x (d+1), upper triangle), b (d+1)] */
static size_t normal_len(uint32_t d) { return 2 + (size_t)(d + 1) * (d + 1) + d + 1; }

/* Per partition, one Gram matrix S = Z' Z of the augmented rows z = sqrt(w) [x, 1, y]
 * ((d+2) x (d+2), upper triangle): X'WX, X'W1, X'Wy, W, 1'Wy and y'Wy. A dense block
 * without weights gets X'X by dsyrk on the block in place, then X'1 and X'y by two dgemvs
 * while it is in cache (1.09x a bare dsyrk, where copying into the augmented layout is
 * 1.2x); a weighted block is copied into the augmented layout for one dsyrk. The partition's record is [W, y'Wy, A, b]
 * (normal_len). */
FL_ML_KERNEL fl_status ml_normal_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  uint32_t d;
  memcpy(&d, arg, sizeof d);
  const size_t n1 = (size_t)d + 1, n2 = (size_t)d + 2, len = normal_len(d);
  double *S = calloc(n2 * n2, sizeof *S), *Z = NULL;
  if (!S) return fl_set_error(FL_ENOMEM, "out of memory");
  size_t z_cap = 0, ones_len = 0;
  double *ones = NULL;
  fl_buf scratch = FL_BUF_INIT;
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > d || (!b.sparse && b.cols != d)) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the data %u", b.cols, d);
      break;
    }
    if (b.rows == 0) continue;
    if (b.sparse) {
      for (uint32_t i = 0; i < b.rows; i++) {
        double w = b.weights ? b.weights[i] : 1.0, y = b.labels[i];
        for (uint64_t p = b.row_ptr[i]; p < b.row_ptr[i + 1]; p++) {
          uint32_t cp = b.col[p];
          double wx = w * b.x[p];
          for (uint64_t q = p; q < b.row_ptr[i + 1]; q++) S[cp * n2 + b.col[q]] += wx * b.x[q];
          S[cp * n2 + d] += wx;
          S[cp * n2 + d + 1] += wx * y;
        }
        S[d * n2 + d] += w;
        S[d * n2 + d + 1] += w * y;
        S[(d + 1) * n2 + d + 1] += w * y * y;
      }
      continue;
    }
    if (!b.weights) { /* X'X in place by dsyrk, then X'1 and X'y by dgemv while X is in cache */
      if (b.rows > ones_len) {
        free(ones);
        if (!(ones = malloc(b.rows * sizeof *ones))) {
          s = fl_set_error(FL_ENOMEM, "out of memory");
          break;
        }
        for (ones_len = 0; ones_len < b.rows; ones_len++) ones[ones_len] = 1.0;
      }
      double yy = 0, ysum = 0;
      for (uint32_t i = 0; i < b.rows; i++) {
        ysum += b.labels[i];
        yy += b.labels[i] * b.labels[i];
      }
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)d, (int)b.rows, 1.0, b.x, (int)d, 1.0, S, (int)n2);
      /* columns d and d + 1 of S (stride n2) */
      cblas_dgemv(CblasRowMajor, CblasTrans, (int)b.rows, (int)d, 1.0, b.x, (int)d, ones, 1, 1.0, S + d, (int)n2);
      cblas_dgemv(CblasRowMajor, CblasTrans, (int)b.rows, (int)d, 1.0, b.x, (int)d, b.labels, 1, 1.0, S + d + 1,
                  (int)n2);
      S[d * n2 + d] += b.rows;
      S[d * n2 + d + 1] += ysum;
      S[(d + 1) * n2 + d + 1] += yy;
      continue;
    }
    if ((size_t)b.rows * n2 > z_cap) {
      free(Z);
      z_cap = (size_t)b.rows * n2;
      if (!(Z = malloc(z_cap * sizeof *Z))) {
        s = fl_set_error(FL_ENOMEM, "out of memory");
        break;
      }
    }
    for (uint32_t i = 0; i < b.rows; i++) {
      double r = b.weights ? sqrt(b.weights[i]) : 1.0, *z = Z + (size_t)i * n2;
      const double *x = b.x + (size_t)i * d;
      if (r == 1.0) memcpy(z, x, d * sizeof *z);
      else
        for (uint32_t j = 0; j < d; j++) z[j] = r * x[j];
      z[d] = r;
      z[d + 1] = r * b.labels[i];
    }
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)n2, (int)b.rows, 1.0, Z, (int)n2, 1.0, S, (int)n2);
  }
  double *acc = s == FL_OK ? malloc(len * sizeof *acc) : NULL;
  if (s == FL_OK && !acc) s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    double *A = acc + 2, *bv = A + n1 * n1;
    acc[0] = S[d * n2 + d];
    acc[1] = S[(d + 1) * n2 + d + 1];
    for (size_t i = 0; i < n1; i++) {
      for (size_t j = 0; j < n1; j++) A[i * n1 + j] = j >= i ? S[i * n2 + j] : 0.0;
      bv[i] = S[i * n2 + d + 1];
    }
    s = fl_emit(out, acc, len * sizeof *acc);
  }
  fl_buf_free(&scratch);
  free(acc);
  free(ones);
  free(Z);
  free(S);
  return s;
}

static fl_status linreg_normal(const fl_ml_data *data, const fl_ml_train_options *o, fl_ml_model *m) {
  const uint32_t d = data->cols;
  const size_t n1 = (size_t)d + 1, len = normal_len(d);
  double *acc = malloc(len * sizeof *acc);
  if (!acc) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_dataset *parts = NULL;
  fl_status s = fl_map_partitions(data->blocks, ml_normal_partition, &d, sizeof d, &parts);
  if (s == FL_OK) s = ml_sum_partitions(parts, len, o->tree_depth, acc);
  fl_dataset_free(parts);
  if (s == FL_OK && !(acc[0] > 0)) s = fl_set_error(FL_EEMPTY, "no rows (or only rows of weight 0) to fit");
  if (s != FL_OK) {
    free(acc);
    return s;
  }
  double W = acc[0], yy = acc[1], *A = acc + 2, *bv = A + n1 * n1;
  const bool icpt = m->intercept;
  const size_t n = icpt ? n1 : d; /* without an intercept: the top-left d x d system */
  double *M = malloc(n * n * sizeof *M), *x = malloc(n * sizeof *x);
  if (!M || !x) s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    for (size_t i = 0; i < n; i++) {
      for (size_t j = 0; j < n; j++) M[i * n + j] = j >= i ? A[i * n1 + j] : 0.0;
      x[i] = bv[i];
    }
    for (size_t j = 0; j < d; j++) M[j * n + j] += o->l2;
    lapack_int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', (lapack_int)n, M, (lapack_int)n);
    if (info > 0)
      s = fl_set_error(FL_EINVAL,
                       "least squares: X'X%s is singular (not positive definite at column %d of %zu): some "
                       "features are constant or linearly dependent%s; add a ridge penalty (lambda > 0)",
                       icpt ? " with the intercept" : "", (int)info, n, o->l2 > 0 ? " even with lambda" : "");
    else if (info < 0)
      s = fl_set_error(FL_EINTERNAL, "LAPACKE_dpotrf: argument %d", (int)-info);
    else if ((info = LAPACKE_dpotrs(LAPACK_ROW_MAJOR, 'U', (lapack_int)n, 1, M, (lapack_int)n, x, 1)) != 0)
      s = fl_set_error(FL_EINTERNAL, "LAPACKE_dpotrs: %d", (int)info);
  }
  if (s == FL_OK) {
    memcpy(m->coef, x, d * sizeof *x);
    m->intercepts[0] = icpt ? x[d] : 0.0;
    /* SSE = y'y - 2 t'b + t'A t over the augmented t = (w, b) */
    double tb = 0, tAt = 0;
    for (size_t i = 0; i < n; i++) {
      tb += x[i] * bv[i];
      double row = A[i * n1 + i] * x[i];
      for (size_t j = i + 1; j < n; j++) row += 2 * A[i * n1 + j] * x[j];
      tAt += x[i] * row;
    }
    double sse = fmax(yy - 2 * tb + tAt, 0);
    m->history = calloc(1, sizeof *m->history);
    if (m->history) {
      m->num_history = 1;
      m->history[0] = (fl_ml_iteration){.iteration = 1, .loss = sse / (2 * W), .evaluations = 1};
    }
    m->converged = true;
    if (o->progress && m->history) s = o->progress(o->progress_arg, &m->history[0]);
  }
  free(M);
  free(x);
  free(acc);
  return s;
}

/* ---- iterative solvers ----------------------------------------------------------------- */

static fl_status glm_objective(void *arg, const double *w, double fraction, uint64_t seed, double *loss, double *grad) {
  return ml_glm_eval(arg, w, fraction, seed, loss, grad);
}

/* Minimizes p's objective; the parameters land in m (whose layout is p's). */
static fl_status fit_glm(ml_glm *p, const fl_ml_train_options *o, fl_ml_model *m) {
  if (o->solver == FL_ML_SOLVER_SANDBLASTER) return ml_sandblaster_fit(p, o, m);
  const size_t n = (size_t)p->outputs * (p->cols + 1), ncoef = (size_t)p->outputs * p->cols;
  bool *skip = calloc(n, sizeof *skip);
  if (!skip) return fl_set_error(FL_ENOMEM, "out of memory");
  for (size_t i = ncoef; i < n; i++) skip[i] = true; /* intercepts carry no L1 term */
  fl_ml_optim_options oo = {.method = o->solver == FL_ML_SOLVER_GD ? FL_ML_GD : FL_ML_LBFGS,
                            .max_iterations = o->max_iterations, .tol = o->tol, .history = o->history,
                            .l1 = o->l1, .l1_skip = skip, .step = o->step, .fraction = o->fraction, .seed = o->seed,
                            .progress = o->progress, .progress_arg = o->progress_arg};
  fl_ml_optim_result r = {0};
  memset(m->coef, 0, n * sizeof *m->coef);
  fl_status s = fl_ml_minimize((uint32_t)n, m->coef, glm_objective, p, &oo, &r);
  free(skip);
  if (s == FL_OK) {
    m->history = r.history;
    m->num_history = r.num_history;
    m->converged = r.converged;
    r.history = NULL;
  }
  fl_ml_optim_result_free(&r);
  return s;
}

static fl_ml_train_options defaults(const fl_ml_train_options *opt) {
  fl_ml_train_options o = opt ? *opt : (fl_ml_train_options){0};
  if (!o.normal_max_features) o.normal_max_features = DEFAULT_NORMAL_MAX_FEATURES;
  return o;
}

fl_status fl_ml_linreg(const fl_ml_data *data, const fl_ml_train_options *opt, fl_ml_model **out) {
  fl_ml_train_options o = defaults(opt);
  fl_status s = check_options(data, &o, "fl_ml_linreg");
  if (s != FL_OK) return s;
  if (!out) return fl_set_error(FL_EINVAL, "fl_ml_linreg: out is NULL");
  if (o.solver == FL_ML_SOLVER_NORMAL && o.l1 > 0)
    return fl_set_error(FL_EINVAL, "least squares with an L1 penalty has no normal equations: use lbfgs or gd");
  if (o.solver == FL_ML_SOLVER_PS)
    return fl_set_error(FL_EINVAL, "the ps solver trains logistic regression only: use normal, lbfgs or gd");
  fl_ml_model *m = ml_model_new(FL_ML_LINEAR, data->cols, 1, !o.no_intercept);
  if (!m) return fl_set_error(FL_ENOMEM, "out of memory");
  double t0 = ml_now_s();
  bool normal = o.solver == FL_ML_SOLVER_NORMAL ||
                (o.solver == FL_ML_SOLVER_AUTO && o.l1 == 0 && data->cols <= o.normal_max_features);
  if (normal) {
    s = linreg_normal(data, &o, m);
  } else {
    ml_glm p = {.data = data, .loss = ML_LOSS_SQUARED, .cols = data->cols, .outputs = 1, .intercept = !o.no_intercept,
                .l2 = o.l2, .l2_in_sum_units = true, .tree_depth = o.tree_depth};
    s = fit_glm(&p, &o, m);
  }
  m->train_seconds = ml_now_s() - t0;
  if (s != FL_OK) {
    fl_ml_model_free(m);
    return s;
  }
  *out = m;
  return FL_OK;
}

/* The classes inferred from the labels' range are lo..hi (-1..1 for -1/+1, where 0 is no
 * class). A class with no rows there is nearly always a mistake (labels 1..K, a stray 255
 * among ten digits) that would silently add untrainable outputs: refuse it, naming the
 * empty labels and the classes found. Data not described by flint (label_seen NULL) is not
 * checked. */
static fl_status check_classes_have_rows(const fl_ml_data *data, int64_t lo, int64_t hi) {
  if (!data->label_seen) return FL_OK;
  const uint64_t *seen = data->label_seen;
  char empty[160], found[160];
  size_t missing = 0;
  if (lo == -1) {
    for (int64_t y = -1; y <= 1; y += 2) missing += !ml_label_seen(seen, y);
    if (!missing) return FL_OK;
    return fl_set_error(FL_EINVAL, "logistic regression: labels -1/+1 but one of them has no rows");
  }
  missing = ml_format_labels(seen, lo, hi, false, empty, sizeof empty);
  if (!missing) return FL_OK;
  size_t have = ml_format_labels(seen, -1, 65535, true, found, sizeof found);
  return fl_set_error(FL_EINVAL,
                      "logistic regression: labels %lld..%lld span %lld classes but %zu of them %s no rows "
                      "(label%s %s); %zu class%s %s rows (labels %s). Give the class count "
                      "(fl_ml_train_options.classes, flint ml --classes K) to train with empty classes",
                      (long long)lo, (long long)hi, (long long)(hi - lo + 1), missing, missing == 1 ? "has" : "have",
                      missing == 1 ? "" : "s", empty, have, have == 1 ? "" : "es", have == 1 ? "has" : "have", found);
}

fl_status fl_ml_logreg(const fl_ml_data *data, const fl_ml_train_options *opt, fl_ml_model **out) {
  fl_ml_train_options o = defaults(opt);
  fl_status s = check_options(data, &o, "fl_ml_logreg");
  if (s != FL_OK) return s;
  if (!out) return fl_set_error(FL_EINVAL, "fl_ml_logreg: out is NULL");
  if (o.solver == FL_ML_SOLVER_NORMAL)
    return fl_set_error(FL_EINVAL, "logistic regression has no normal equations: use lbfgs or gd");
  if (o.solver == FL_ML_SOLVER_PS && (s = ml_ps_check_options(&o)) != FL_OK) return s;
  double t0 = ml_now_s();
  uint32_t classes = o.classes;
  if (!classes) {
    double lo = data->label_min, hi = data->label_max;
    bool integers = data->labels_integer;
    if (!isfinite(lo) || !isfinite(hi)) return fl_set_error(FL_EEMPTY, "logistic regression: the data has no rows");
    if (!integers || lo < -1 || (lo == -1 && hi != 1) || hi > 65535)
      return fl_set_error(FL_EINVAL,
                          "logistic regression needs class labels 0..K-1 (or -1/+1 for two classes); the labels "
                          "run from %g to %g%s",
                          lo, hi, integers ? "" : " and are not all integers");
    classes = hi < 1 ? 2 : (uint32_t)hi + 1;
    s = check_classes_have_rows(data, lo == -1 ? -1 : 0, lo == -1 ? 1 : (int64_t)classes - 1);
    if (s != FL_OK) return s;
  }
  if (classes < 2) return fl_set_error(FL_EINVAL, "logistic regression needs at least 2 classes (got %u)", classes);
  if (o.classes && data->rows > 0) { /* stated: the labels must fit it (checked here, before any job) */
    double lo = data->label_min, hi = data->label_max;
    bool fits = data->labels_integer && ((lo >= 0 && hi <= classes - 1) || (classes == 2 && lo >= -1 && hi <= 1));
    if (!fits)
      return fl_set_error(FL_EINVAL,
                          "logistic regression with %u classes needs labels 0..%u%s; the labels run from %g to %g%s",
                          classes, classes - 1, classes == 2 ? " (or -1/+1)" : "", lo, hi,
                          data->labels_integer ? "" : " and are not all integers");
  }
  bool binary = classes == 2;
  if (o.solver == FL_ML_SOLVER_PS && !binary)
    return fl_set_error(FL_EINVAL, "the ps solver trains binary logistic regression; the data has %u classes", classes);
  fl_ml_model *m = ml_model_new(binary ? FL_ML_LOGISTIC_BINARY : FL_ML_LOGISTIC_MULTINOMIAL, data->cols, classes,
                                !o.no_intercept);
  if (!m) return fl_set_error(FL_ENOMEM, "out of memory");
  ml_glm p = {.data = data, .loss = binary ? ML_LOSS_LOGISTIC : ML_LOSS_SOFTMAX, .cols = data->cols,
              .outputs = m->outputs, .intercept = !o.no_intercept, .l2 = o.l2, .tree_depth = o.tree_depth};
  s = o.solver == FL_ML_SOLVER_PS ? ml_ps_logreg(data, &o, m) : fit_glm(&p, &o, m);
  m->train_seconds = ml_now_s() - t0;
  if (s != FL_OK) {
    fl_ml_model_free(m);
    return s;
  }
  *out = m;
  return FL_OK;
}

fl_status fl_ml_loss_gradient(const fl_ml_model *m, const fl_ml_data *data, double l2, double *loss, double *grad) {
  if (!m || !data || !data->blocks || !loss || !grad)
    return fl_set_error(FL_EINVAL, "fl_ml_loss_gradient: model, data, loss and grad are required");
  if (data->cols > m->cols) return fl_set_error(FL_EINVAL, "the data has %u features, the model %u", data->cols, m->cols);
  ml_glm p = {.data = data, .cols = m->cols, .outputs = m->outputs, .intercept = m->intercept, .l2 = l2,
              .loss = m->kind == FL_ML_LINEAR ? ML_LOSS_SQUARED
                      : m->kind == FL_ML_LOGISTIC_BINARY ? ML_LOSS_LOGISTIC : ML_LOSS_SOFTMAX,
              .l2_in_sum_units = m->kind == FL_ML_LINEAR};
  return ml_glm_eval(&p, m->coef, 1.0, 0, loss, grad);
}
