/*
 * linreg: least squares on synthetic data, solved twice with libflint_ml: by the normal
 * equations (one pass: X'X by dsyrk per block, then Cholesky on the driver) and by L-BFGS
 * (one stage per evaluation). Both minimize the same objective, so the run prints how far
 * apart their coefficients are, and each one's RMSE and R^2.
 *
 *   flint submit --master local[*] build/bin/linreg.so [ROWS] [FEATURES] [NOISE]
 *
 * Defaults: 200000 rows, 50 features, label noise sd 0.1 (so an RMSE near 0.1).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flint/ml.h"

fl_status linreg_progress(void *arg, const fl_ml_iteration *it) {
  (void)arg;
  printf("iter %3u  loss %.10f  |grad| %.3e  step %.2e  evals %u  %.2f s\n", it->iteration, it->loss, it->grad_norm,
         it->step, it->evaluations, it->seconds);
  fflush(stdout);
  return FL_OK;
}

static bool parse_number(const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno || !isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

/* Trains one model and prints its fit; returns FL_OK or the failure. */
static fl_status fit(const fl_ml_data *data, fl_ml_solver solver, const char *name, fl_ml_model **out) {
  fl_ml_train_options o = {.solver = solver, .max_iterations = 200, .tol = 1e-9, .progress = linreg_progress};
  printf("-- %s\n", name);
  fl_status s = fl_ml_linreg(data, &o, out);
  fl_ml_metrics m;
  if (s == FL_OK) s = fl_ml_evaluate(*out, data, &m);
  if (s == FL_OK)
    printf("%s: %u iterations, %s, %.2f s, RMSE %.6f, R^2 %.6f\n", name, (*out)->num_history,
           (*out)->converged ? "converged" : "not converged", (*out)->train_seconds, m.rmse, m.r2);
  return s;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  double rows = 200000, cols = 50, noise = 0.1;
  if ((argc > 1 && (!parse_number(argv[1], &rows) || rows < 1 || rows > 1e10 || rows != floor(rows))) ||
      (argc > 2 && (!parse_number(argv[2], &cols) || cols < 1 || cols > 4096 || cols != floor(cols))) ||
      (argc > 3 && !parse_number(argv[3], &noise)) || argc > 4) {
    fprintf(stderr, "usage: linreg [ROWS >= 1] [FEATURES 1..4096] [NOISE >= 0]\n");
    return 2;
  }
  fl_ml_synth_options so = {.kind = FL_ML_SYNTH_LINEAR, .rows = (uint64_t)rows, .cols = (uint32_t)cols,
                            .noise = noise, .seed = 42};
  fl_ml_data *data = NULL;
  fl_ml_model *normal = NULL, *lbfgs = NULL;
  int rc = 1;
  if (fl_ml_synthetic(ctx, &so, &data) != FL_OK) goto done;
  printf("least squares on %llu synthetic rows, %u features, noise %g, %u partitions, %u task threads\n",
         (unsigned long long)data->rows, data->cols, noise, fl_dataset_partitions(data->blocks), fl_context_cores(ctx));
  if (fit(data, FL_ML_SOLVER_NORMAL, "normal equations", &normal) != FL_OK ||
      fit(data, FL_ML_SOLVER_LBFGS, "L-BFGS", &lbfgs) != FL_OK)
    goto done;
  double diff = 0, norm = 0, worst = 0;
  for (uint32_t j = 0; j < normal->cols; j++) {
    double d = lbfgs->coef[j] - normal->coef[j];
    diff += d * d;
    norm += normal->coef[j] * normal->coef[j];
    worst = fmax(worst, fabs(d));
  }
  printf("coefficients, L-BFGS vs normal equations: |diff| %.3e (relative %.3e), largest %.3e; intercepts %.6f vs "
         "%.6f\n",
         sqrt(diff), sqrt(diff / fmax(norm, 1e-300)), worst, lbfgs->intercepts[0], normal->intercepts[0]);
  rc = 0;
done:
  if (rc) fprintf(stderr, "linreg: %s\n", fl_last_error());
  fl_ml_model_free(lbfgs);
  fl_ml_model_free(normal);
  fl_ml_data_free(data);
  return rc;
}
