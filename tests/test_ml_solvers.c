/*
 * test_ml_solvers.c: least squares and logistic regression against references computed
 * here on the collected data (LAPACKE QR for least squares, Newton's method for binary
 * logistic regression, plain loops for losses and gradients), the same model from any
 * partitioning and from local and local-cluster mode, and an executor killed mid-fit.
 */
#include <dirent.h>
#include <lapacke.h>
#include <math.h>
#include <signal.h>

#include "flint/ml.h"
#include "test_util.h"

#define CLUSTER "local-cluster[2,1,512]"

typedef struct dense {
  double *x, *y;
  size_t n;
  uint32_t d;
} dense;

/* Every row of the data, in order. */
static void collect(const fl_ml_data *data, dense *out) {
  fl_records *recs;
  assert_ok(fl_collect(data->blocks, &recs));
  out->d = data->cols;
  out->n = data->rows;
  out->x = calloc(out->n * out->d + 1, sizeof(double));
  out->y = calloc(out->n + 1, sizeof(double));
  fl_buf scratch = FL_BUF_INIT;
  size_t r = 0;
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_records_get(recs, i), &scratch, &b));
    assert_false(b.sparse);
    for (uint32_t k = 0; k < b.rows; k++, r++) {
      memcpy(out->x + r * out->d, b.x + (size_t)k * b.cols, out->d * sizeof(double));
      out->y[r] = b.labels[k];
    }
  }
  assert_int_equal(r, out->n);
  fl_buf_free(&scratch);
  fl_records_free(recs);
}

static void dense_free(dense *m) {
  free(m->x);
  free(m->y);
}

static fl_ml_data *synth(fl_context *ctx, fl_ml_synth_kind kind, uint64_t rows, uint32_t cols, uint32_t classes,
                         uint32_t partitions) {
  fl_ml_synth_options o = {.kind = kind, .rows = rows, .cols = cols, .classes = classes, .noise = 0.3, .seed = 42,
                           .partitions = partitions, .rows_per_block = 97};
  fl_ml_data *data;
  assert_ok(fl_ml_synthetic(ctx, &o, &data));
  assert_int_equal(data->rows, rows);
  assert_int_equal(data->cols, cols);
  return data;
}

static double rel_diff(const double *a, const double *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num = fmax(num, fabs(a[i] - b[i]));
    den = fmax(den, fabs(b[i]));
  }
  return num / (den > 0 ? den : 1);
}

/* Least squares by QR (dgels) on [X 1] (and sqrt(l2) I rows under X for ridge, which leaves
 * the intercept unpenalized): a different method from the engine's normal equations. */
static void reference_lstsq(const dense *m, double l2, bool intercept, double *out) {
  size_t cols = m->d + (intercept ? 1 : 0), rows = m->n + (l2 > 0 ? m->d : 0);
  double *A = calloc(rows * cols, sizeof *A), *b = calloc(rows, sizeof *b);
  for (size_t i = 0; i < m->n; i++) {
    memcpy(A + i * cols, m->x + i * m->d, m->d * sizeof *A);
    if (intercept) A[i * cols + m->d] = 1;
    b[i] = m->y[i];
  }
  for (size_t j = 0; l2 > 0 && j < m->d; j++) A[(m->n + j) * cols + j] = sqrt(l2);
  assert_int_equal(LAPACKE_dgels(LAPACK_ROW_MAJOR, 'N', (lapack_int)rows, (lapack_int)cols, 1, A, (lapack_int)cols, b, 1), 0);
  memcpy(out, b, cols * sizeof *out);
  free(A);
  free(b);
}

static void check_linreg(fl_ml_data *data, double l2, bool intercept) {
  dense m;
  collect(data, &m);
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_NORMAL, .l2 = l2, .no_intercept = !intercept};
  fl_ml_model *model;
  assert_ok(fl_ml_linreg(data, &o, &model));
  double want[64], got[64];
  reference_lstsq(&m, l2, intercept, want);
  memcpy(got, model->coef, m.d * sizeof *got);
  if (intercept) got[m.d] = model->intercepts[0];
  else assert_true(model->intercepts[0] == 0);
  double diff = rel_diff(got, want, m.d + intercept);
  fprintf(stderr, "least squares (l2 %g, intercept %d): relative difference to QR %.2e\n", l2, intercept, diff);
  assert_true(diff < 1e-8);
  fl_ml_model_free(model);
  dense_free(&m);
}

static void test_least_squares_matches_qr(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *data = synth(ctx, FL_ML_SYNTH_LINEAR, 3000, 7, 0, 5);
  check_linreg(data, 0, true);
  check_linreg(data, 5.0, true);
  check_linreg(data, 0, false);
  fl_ml_data_free(data);
  fl_context_close(ctx);
}

/* L-BFGS and GD minimize (1/2W)|y - Xw - b|^2 + (l2/2W)|w|^2, whose optimum is the normal
 * equations'. */
static void test_least_squares_iterative_solvers_agree(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *data = synth(ctx, FL_ML_SYNTH_LINEAR, 2000, 5, 0, 4);
  fl_ml_model *normal, *lbfgs, *gd;
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_NORMAL, .l2 = 2.0};
  assert_ok(fl_ml_linreg(data, &o, &normal));
  o.solver = FL_ML_SOLVER_LBFGS;
  o.tol = 1e-8;
  assert_ok(fl_ml_linreg(data, &o, &lbfgs));
  assert_true(lbfgs->converged);
  o.solver = FL_ML_SOLVER_GD;
  o.tol = 1e-7;
  o.max_iterations = 2000;
  assert_ok(fl_ml_linreg(data, &o, &gd));
  double dl = rel_diff(lbfgs->coef, normal->coef, 6), dg = rel_diff(gd->coef, normal->coef, 6);
  fprintf(stderr, "least squares: L-BFGS %.2e and GD %.2e from the normal equations (%u and %u iterations)\n", dl, dg,
          lbfgs->num_history, gd->num_history);
  assert_true(dl < 1e-6);
  assert_true(dg < 1e-4);
  /* above the feature limit, auto switches to L-BFGS: it then has more than one iteration */
  fl_ml_model *autom;
  fl_ml_train_options a = {.l2 = 2.0, .normal_max_features = 3, .tol = 1e-8};
  assert_ok(fl_ml_linreg(data, &a, &autom));
  assert_true(autom->num_history > 1);
  assert_true(rel_diff(autom->coef, normal->coef, 6) < 1e-6);
  fl_ml_model_free(autom);
  fl_ml_model_free(normal);
  fl_ml_model_free(lbfgs);
  fl_ml_model_free(gd);
  fl_ml_data_free(data);
  fl_context_close(ctx);
}

/* Two equal columns: X'X is singular without a penalty; with one it is not. */
static void test_singular_system(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_block_builder *b;
  assert_ok(fl_ml_block_builder_create(3, false, false, 0, &b));
  for (int i = 0; i < 50; i++) {
    double x[3] = {i * 0.1, i * 0.1, sin(i)};
    assert_ok(fl_ml_block_builder_add_dense(b, 2 * x[0] + x[2], 1, x));
  }
  fl_buf rec = FL_BUF_INIT;
  assert_ok(fl_ml_block_builder_take(b, &rec));
  fl_ml_block_builder_free(b);
  fl_bytes one = fl_buf_bytes(&rec);
  fl_ml_data data = {.rows = 50, .cols = 3};
  assert_ok(fl_parallelize(ctx, &one, 1, 1, &data.blocks));
  fl_ml_model *m = NULL;
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_NORMAL};
  fl_status s = fl_ml_linreg(&data, &o, &m);
  fprintf(stderr, "singular: %s\n", fl_last_error());
  assert_int_equal(s, FL_EINVAL);
  assert_null(m);
  assert_non_null(strstr(fl_last_error(), "singular"));
  assert_non_null(strstr(fl_last_error(), "lambda"));
  o.l2 = 1e-3;
  assert_ok(fl_ml_linreg(&data, &o, &m));
  fl_ml_model_free(m);
  fl_dataset_free(data.blocks);
  fl_buf_free(&rec);
  fl_context_close(ctx);
}

/* Rows with integer sample weights (some 0) against the same rows repeated that many times:
 * the same least-squares and logistic models, from dense and from sparse blocks. */
static fl_ml_data *weighted_rows(fl_context *ctx, bool sparse, bool repeat, bool logistic) {
  enum { N = 300, D = 6 };
  fl_ml_block_builder *b;
  assert_ok(fl_ml_block_builder_create(D, sparse, !repeat, 37, &b));
  fl_buf rec = FL_BUF_INIT;
  fl_bytes recs[64];
  fl_buf bufs[64];
  size_t nrec = 0;
  for (int i = 0; i < N; i++) {
    double x[D];
    uint32_t idx[D], nnz = 0;
    double vals[D];
    for (int j = 0; j < D; j++) {
      x[j] = (i * 7 + j * 3) % 5 == 0 ? 0.0 : sin(i * 1.3 + j * 0.7);
      if (x[j] != 0) idx[nnz] = (uint32_t)j, vals[nnz++] = x[j];
    }
    double z = 0.5 + x[0] - 2 * x[1] + 0.5 * x[3], y = logistic ? (sin(i * 12.9898) > -z * 0.5 ? 1.0 : 0.0) : z + 0.1 * cos(i);
    int w = i % 4; /* 0, 1, 2, 3 */
    for (int k = 0; k < (repeat ? w : 1); k++) {
      if (fl_ml_block_builder_full(b)) {
        assert_ok(fl_ml_block_builder_take(b, &rec));
        bufs[nrec] = rec;
        recs[nrec] = fl_buf_bytes(&bufs[nrec]);
        nrec++;
        rec = (fl_buf)FL_BUF_INIT;
      }
      if (sparse) assert_ok(fl_ml_block_builder_add_sparse(b, y, repeat ? 1.0 : w, idx, vals, nnz));
      else assert_ok(fl_ml_block_builder_add_dense(b, y, repeat ? 1.0 : w, x));
    }
  }
  assert_ok(fl_ml_block_builder_take(b, &rec));
  bufs[nrec] = rec;
  recs[nrec] = fl_buf_bytes(&bufs[nrec]);
  nrec++;
  assert_true(nrec <= 64);
  fl_ml_block_builder_free(b);
  fl_dataset *blocks;
  fl_ml_data *data;
  assert_ok(fl_parallelize(ctx, recs, nrec, 3, &blocks));
  assert_ok(fl_ml_data_from_blocks(blocks, D, &data));
  for (size_t i = 0; i < nrec; i++) fl_buf_free(&bufs[i]);
  assert_int_equal(data->cols, D);
  assert_int_equal(data->weighted, !repeat);
  assert_int_equal(data->sparse, sparse);
  assert_int_equal(data->rows, repeat ? 450 : N); /* (0 + 1 + 2 + 3) x 75 */
  return data;
}

static void test_sample_weights_equal_repeated_rows(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  for (int sparse = 0; sparse < 2; sparse++)
    for (int logistic = 0; logistic < 2; logistic++) {
      fl_ml_data *w = weighted_rows(ctx, sparse, false, logistic), *r = weighted_rows(ctx, sparse, true, logistic);
      fl_ml_train_options o = {.l2 = 1e-3, .tol = 1e-10, .max_iterations = 500};
      fl_ml_model *a, *b;
      if (logistic) {
        assert_ok(fl_ml_logreg(w, &o, &a));
        assert_ok(fl_ml_logreg(r, &o, &b));
      } else {
        o.solver = FL_ML_SOLVER_NORMAL;
        assert_ok(fl_ml_linreg(w, &o, &a));
        assert_ok(fl_ml_linreg(r, &o, &b));
      }
      double pa[7], pb[7];
      memcpy(pa, a->coef, 6 * sizeof *pa);
      memcpy(pb, b->coef, 6 * sizeof *pb);
      pa[6] = a->intercepts[0];
      pb[6] = b->intercepts[0];
      double diff = rel_diff(pa, pb, 7);
      fprintf(stderr, "weights vs repeats (%s, %s): relative difference %.2e\n", sparse ? "sparse" : "dense",
              logistic ? "logistic" : "least squares", diff);
      assert_true(diff < (logistic ? 1e-7 : 1e-10));
      assert_true(fabs(pa[1]) > 0.1); /* a real fit, not zeros */
      fl_ml_model_free(a);
      fl_ml_model_free(b);
      fl_ml_data_free(w);
      fl_ml_data_free(r);
    }
  /* a record that is not a block */
  fl_bytes junk = {(const uint8_t *)"not a block", 11};
  fl_dataset *bad;
  fl_ml_data *d = NULL;
  assert_ok(fl_parallelize(ctx, &junk, 1, 1, &bad));
  assert_int_not_equal(fl_ml_data_from_blocks(bad, 0, &d), FL_OK);
  assert_null(d);
  fl_dataset_free(bad);
  assert_int_equal(fl_ml_data_from_blocks(NULL, 0, &d), FL_EINVAL);
  fl_context_close(ctx);
}

/* ---- logistic regression --------------------------------------------------------------- */

/* The objective computed here: mean log-loss + (l2/2)|coef|^2, and its gradient. */
static double reference_logistic(const dense *m, uint32_t K, const double *params, double l2, double *grad) {
  uint32_t d = m->d, out = K == 2 ? 1 : K;
  const double *bias = params + (size_t)out * d;
  size_t n = (size_t)out * (d + 1);
  memset(grad, 0, n * sizeof *grad);
  double loss = 0, z[16];
  for (size_t i = 0; i < m->n; i++) {
    const double *x = m->x + i * d;
    for (uint32_t k = 0; k < out; k++) {
      z[k] = bias[k];
      for (uint32_t j = 0; j < d; j++) z[k] += params[k * d + j] * x[j];
    }
    double dz[16];
    if (out == 1) {
      double p = 1 / (1 + exp(-z[0])), y = m->y[i];
      loss += -(y * log(p) + (1 - y) * log(1 - p));
      dz[0] = p - y;
    } else {
      double top = z[0], sum = 0;
      for (uint32_t k = 1; k < out; k++) top = fmax(top, z[k]);
      for (uint32_t k = 0; k < out; k++) sum += exp(z[k] - top);
      loss += top + log(sum) - z[(int)m->y[i]];
      for (uint32_t k = 0; k < out; k++) dz[k] = exp(z[k] - top) / sum - (k == (uint32_t)m->y[i]);
    }
    for (uint32_t k = 0; k < out; k++) {
      for (uint32_t j = 0; j < d; j++) grad[k * d + j] += dz[k] * x[j];
      grad[(size_t)out * d + k] += dz[k];
    }
  }
  double sq = 0;
  for (size_t i = 0; i < n; i++) grad[i] /= (double)m->n;
  for (size_t i = 0; i < (size_t)out * d; i++) {
    grad[i] += l2 * params[i];
    sq += params[i] * params[i];
  }
  return loss / (double)m->n + 0.5 * l2 * sq;
}

static fl_ml_model *model_with(fl_ml_data *data, uint32_t K, const double *params) {
  fl_ml_model *m;
  fl_ml_train_options o = {.max_iterations = 1, .classes = K};
  assert_ok(fl_ml_logreg(data, &o, &m)); /* a model of the right shape; parameters replaced */
  size_t n = (size_t)m->outputs * (m->cols + 1);
  memcpy(m->coef, params, n * sizeof *params); /* coef and intercepts are one array */
  return m;
}

static void check_loss_and_gradient(fl_ml_data *data, uint32_t K) {
  dense m;
  collect(data, &m);
  uint32_t out = K == 2 ? 1 : K;
  size_t n = (size_t)out * (m.d + 1);
  double params[64], want[64], got[64], fd_grad[64], loss;
  for (size_t i = 0; i < n; i++) params[i] = 0.3 * sin(1.0 + i);
  fl_ml_model *model = model_with(data, K, params);
  const double l2 = 0.05;
  double ref = reference_logistic(&m, K, params, l2, want);
  assert_ok(fl_ml_loss_gradient(model, data, l2, &loss, got));
  assert_true(fabs(loss - ref) < 1e-12 * fabs(ref));
  assert_true(rel_diff(got, want, n) < 1e-10);
  /* the gradient by central differences of the engine's loss */
  for (size_t i = 0; i < n; i++) {
    double h = 1e-5, lp, lm, g[64];
    model->coef[i] = params[i] + h;
    assert_ok(fl_ml_loss_gradient(model, data, l2, &lp, g));
    model->coef[i] = params[i] - h;
    assert_ok(fl_ml_loss_gradient(model, data, l2, &lm, g));
    model->coef[i] = params[i];
    fd_grad[i] = (lp - lm) / (2 * h);
  }
  double diff = rel_diff(fd_grad, got, n);
  fprintf(stderr, "logistic (K %u): loss %.6f, gradient vs finite differences %.2e\n", K, loss, diff);
  assert_true(diff < 1e-6);
  fl_ml_model_free(model);
  dense_free(&m);
}

static void test_logistic_loss_and_gradient(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 1500, 5, 2, 3);
  check_loss_and_gradient(bin, 2);
  fl_ml_data *multi = synth(ctx, FL_ML_SYNTH_LOGISTIC, 1500, 4, 3, 3);
  check_loss_and_gradient(multi, 3);
  fl_ml_data_free(bin);
  fl_ml_data_free(multi);
  fl_context_close(ctx);
}

/* Newton's method on the binary objective, computed here. */
static void reference_newton(const dense *m, double l2, double *w) {
  uint32_t d = m->d, n = d + 1;
  memset(w, 0, n * sizeof *w);
  for (int it = 0; it < 50; it++) {
    double g[64], H[64 * 64] = {0};
    reference_logistic(m, 2, w, l2, g);
    for (size_t i = 0; i < m->n; i++) {
      double xa[64], z = w[d];
      memcpy(xa, m->x + i * d, d * sizeof *xa);
      xa[d] = 1;
      for (uint32_t j = 0; j < d; j++) z += w[j] * xa[j];
      double p = 1 / (1 + exp(-z)), s = p * (1 - p) / (double)m->n;
      for (uint32_t a = 0; a < n; a++)
        for (uint32_t b = 0; b < n; b++) H[a * n + b] += s * xa[a] * xa[b];
    }
    for (uint32_t j = 0; j < d; j++) H[j * n + j] += l2;
    assert_int_equal(LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', (lapack_int)n, 1, H, (lapack_int)n, g, 1), 0);
    for (uint32_t j = 0; j < n; j++) w[j] -= g[j];
  }
}

static void test_logistic_optimum(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 2000, 5, 2, 4);
  dense m;
  collect(bin, &m);
  double want[8], got[8], g[64];
  reference_newton(&m, 0.01, want);
  fl_ml_model *model;
  fl_ml_train_options o = {.l2 = 0.01, .tol = 1e-8};
  assert_ok(fl_ml_logreg(bin, &o, &model));
  assert_int_equal(model->kind, FL_ML_LOGISTIC_BINARY);
  assert_true(model->converged);
  memcpy(got, model->coef, 5 * sizeof *got);
  got[5] = model->intercepts[0];
  double diff = rel_diff(got, want, 6);
  fprintf(stderr, "binary logistic: %u iterations, relative difference to Newton %.2e\n", model->num_history, diff);
  assert_true(diff < 1e-6);
  /* the history: iterations in order, the loss going down */
  for (uint32_t i = 1; i < model->num_history; i++) {
    assert_int_equal(model->history[i].iteration, i + 1);
    assert_true(model->history[i].loss <= model->history[i - 1].loss + 1e-12);
  }
  fl_ml_model_free(model);
  dense_free(&m);

  /* multinomial: the reference gradient at the engine's optimum is zero */
  fl_ml_data *multi = synth(ctx, FL_ML_SYNTH_LOGISTIC, 2000, 4, 3, 4);
  collect(multi, &m);
  assert_ok(fl_ml_logreg(multi, &o, &model));
  assert_int_equal(model->kind, FL_ML_LOGISTIC_MULTINOMIAL);
  assert_int_equal(model->outputs, 3);
  reference_logistic(&m, 3, model->coef, 0.01, g);
  double norm = 0;
  for (int i = 0; i < 15; i++) norm += g[i] * g[i];
  fprintf(stderr, "multinomial: %u iterations, reference gradient norm at the optimum %.2e\n", model->num_history,
          sqrt(norm));
  assert_true(sqrt(norm) < 1e-7);
  fl_ml_metrics mt;
  assert_ok(fl_ml_evaluate(model, multi, &mt));
  assert_true(mt.accuracy > 0.5);
  fl_ml_model_free(model);
  dense_free(&m);
  fl_ml_data_free(bin);
  fl_ml_data_free(multi);
  fl_context_close(ctx);
}

/* L1 through OWL-QN: the optimality conditions of the L1 problem hold, and some
 * coefficients are exactly zero. */
static void test_l1_owlqn(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 2000, 12, 2, 4);
  dense m;
  collect(bin, &m);
  const double l1 = 0.03;
  fl_ml_model *model;
  fl_ml_train_options o = {.l1 = l1, .tol = 1e-8, .max_iterations = 500};
  assert_ok(fl_ml_logreg(bin, &o, &model));
  double params[16], g[16];
  memcpy(params, model->coef, 13 * sizeof *params);
  reference_logistic(&m, 2, params, 0, g);
  int zeros = 0;
  for (int j = 0; j < 12; j++) {
    if (params[j] == 0) {
      zeros++;
      assert_true(fabs(g[j]) <= l1 + 1e-6);
    } else {
      assert_true(fabs(g[j] + l1 * (params[j] > 0 ? 1 : -1)) < 1e-6);
    }
  }
  assert_true(fabs(g[12]) < 1e-6); /* the intercept is not penalized */
  fprintf(stderr, "L1: %d of 12 coefficients are zero after %u iterations\n", zeros, model->num_history);
  assert_true(zeros >= 1 && zeros < 12);
  fl_ml_model_free(model);
  dense_free(&m);
  fl_ml_data_free(bin);
  fl_context_close(ctx);
}

/* ---- the same model whatever the partitioning or mode ------------------------------------ */

typedef struct fit {
  double lin[8], log[8];
} fit;

static void fit_both(const char *master, uint32_t partitions, fit *f) {
  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_ml_data *lin = synth(ctx, FL_ML_SYNTH_LINEAR, 3000, 6, 0, partitions);
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 3000, 6, 2, partitions);
  fl_ml_model *a, *b;
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_NORMAL, .l2 = 0.5};
  assert_ok(fl_ml_linreg(lin, &o, &a));
  fl_ml_train_options lo = {.l2 = 0.1, .tol = 1e-12, .max_iterations = 200};
  assert_ok(fl_ml_logreg(bin, &lo, &b));
  memcpy(f->lin, a->coef, 7 * sizeof(double)); /* coef then the intercept */
  memcpy(f->log, b->coef, 7 * sizeof(double));
  fl_ml_model_free(a);
  fl_ml_model_free(b);
  fl_ml_data_free(lin);
  fl_ml_data_free(bin);
  fl_context_close(ctx);
}

static void test_same_model_any_partitioning_and_mode(void **state) {
  (void)state;
  fit one, three, sixteen, cluster;
  fit_both("local[2]", 1, &one);
  fit_both("local[2]", 3, &three);
  fit_both("local[2]", 16, &sixteen);
  fit_both(CLUSTER, 3, &cluster);
  const fit *others[] = {&three, &sixteen, &cluster};
  for (int i = 0; i < 3; i++) {
    double dl = rel_diff(others[i]->lin, one.lin, 7), dg = rel_diff(others[i]->log, one.log, 7);
    fprintf(stderr, "run %d: least squares %.2e, logistic %.2e from 1 partition in local mode\n", i, dl, dg);
    assert_true(dl < 1e-10);
    assert_true(dg < 1e-10);
  }
}

/* ---- an executor killed mid-optimization ------------------------------------------------ */

/* The pid of one executor process that this process started (local-cluster's children). */
static pid_t an_executor(void) {
  DIR *dir = opendir("/proc");
  assert_non_null(dir);
  struct dirent *e;
  pid_t found = 0, me = getpid();
  while (!found && (e = readdir(dir))) {
    char path[300], buf[4096];
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 0) continue;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    int ppid = 0;
    if (fscanf(f, "%*d %*s %*c %d", &ppid) != 1) ppid = 0;
    fclose(f);
    if (ppid != me) continue;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
      if (!buf[i]) buf[i] = ' ';
    buf[n] = 0;
    if (strstr(buf, " executor ")) found = pid;
  }
  closedir(dir);
  return found;
}

static fl_status kill_at_third(void *arg, const fl_ml_iteration *it) {
  int *killed = arg;
  if (it->iteration == 3 && !*killed) {
    pid_t pid = an_executor();
    if (pid > 0 && kill(pid, SIGKILL) == 0) *killed = 1;
  }
  return FL_OK;
}

static void test_executor_killed_mid_optimization(void **state) {
  (void)state;
  double want[8], got[8];
  for (int run = 0; run < 2; run++) {
    fl_context *ctx;
    assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
    fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 4000, 6, 2, 8);
    int killed = 0;
    fl_ml_train_options o = {.l2 = 0.1, .tol = 1e-12, .max_iterations = 200};
    if (run == 1) {
      o.progress = kill_at_third;
      o.progress_arg = &killed;
    }
    fl_ml_model *m;
    assert_ok(fl_ml_logreg(bin, &o, &m));
    memcpy(run ? got : want, m->coef, 7 * sizeof(double));
    if (run == 1) assert_int_equal(killed, 1);
    fl_ml_model_free(m);
    fl_ml_data_free(bin);
    fl_context_close(ctx);
  }
  double diff = rel_diff(got, want, 7);
  fprintf(stderr, "executor killed at iteration 3: model differs by %.2e\n", diff);
  assert_true(diff < 1e-10);
}

/* ---- Sandblaster L-BFGS on parameter-server shards ---------------------------------------- */

/* The vectors are float32 on the servers: the optimum agrees with lbfgs's to this much,
 * relatively (docs/ml.md). */
#define SANDBLASTER_TOL 1e-6

static double sandblaster_vs_lbfgs(fl_ml_data *data, bool logistic, uint32_t params, fl_ml_model **out) {
  fl_ml_train_options lb = {.solver = FL_ML_SOLVER_LBFGS, .l2 = 0.01, .tol = 1e-7, .max_iterations = 200};
  fl_ml_train_options sb = lb;
  sb.solver = FL_ML_SOLVER_SANDBLASTER;
  fl_ml_model *a, *b;
  assert_ok(logistic ? fl_ml_logreg(data, &lb, &a) : fl_ml_linreg(data, &lb, &a));
  fl_status s = logistic ? fl_ml_logreg(data, &sb, &b) : fl_ml_linreg(data, &sb, &b);
  if (s != FL_OK) fail_msg("sandblaster: %s", fl_last_error());
  double diff = rel_diff(b->coef, a->coef, params);
  fprintf(stderr, "sandblaster %s: %u iterations (lbfgs %u), loss %.10f (lbfgs %.10f), relative difference %.2e\n",
          logistic ? "logistic" : "least squares", b->num_history, a->num_history,
          b->history[b->num_history - 1].loss, a->history[a->num_history - 1].loss, diff);
  for (uint32_t i = 1; i < b->num_history; i++) assert_true(b->history[i].loss <= b->history[i - 1].loss + 1e-12);
  fl_ml_model_free(a);
  *out = b;
  return diff;
}

static void check_sandblaster(const char *master) {
  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 2000, 5, 2, 4);
  fl_ml_data *multi = synth(ctx, FL_ML_SYNTH_LOGISTIC, 2000, 4, 3, 5);
  fl_ml_data *lin = synth(ctx, FL_ML_SYNTH_LINEAR, 1000, 6, 0, 3);
  fl_ml_model *m;
  assert_true(sandblaster_vs_lbfgs(bin, true, 6, &m) < SANDBLASTER_TOL);
  assert_int_equal(m->kind, FL_ML_LOGISTIC_BINARY);
  fl_ml_model_free(m);
  assert_true(sandblaster_vs_lbfgs(multi, true, 15, &m) < SANDBLASTER_TOL);
  assert_int_equal(m->outputs, 3);
  fl_ml_model_free(m);
  assert_true(sandblaster_vs_lbfgs(lin, false, 7, &m) < SANDBLASTER_TOL);
  fl_ml_model_free(m);
  fl_ml_data_free(bin);
  fl_ml_data_free(multi);
  fl_ml_data_free(lin);
  fl_context_close(ctx);
}

static void test_sandblaster_matches_lbfgs(void **state) {
  (void)state;
  check_sandblaster("local[2]");
  check_sandblaster(CLUSTER);
}

/* A speculative duplicate: partition 0's first attempt stalls before its push
 * (FLINT_PS_STALL_PUSH), speculation runs it again on the other executor, and the fit goes
 * on; at iteration 2 the test lets the stalled attempt push its first-evaluation gradient,
 * late, into a column that by then holds another vector. Its (worker, seq) was applied
 * already, so the shards skip it: the run's history equals an undisturbed run's. */
typedef struct stall_gate {
  char dir[64];
  int released, pushed;
} stall_gate;

static fl_status release_at_second(void *arg, const fl_ml_iteration *it) {
  stall_gate *g = arg;
  if (it->iteration != 2 || g->released) return FL_OK;
  char path[128];
  snprintf(path, sizeof path, "%s/release", g->dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  g->released = 1;
  snprintf(path, sizeof path, "%s/pushed", g->dir);
  for (int i = 0; i < 6000 && access(path, F_OK) != 0; i++) usleep(10000); /* at most 60 s */
  g->pushed = access(path, F_OK) == 0;
  return FL_OK;
}

static void test_sandblaster_speculative_duplicate(void **state) {
  (void)state;
  stall_gate gate = {0};
  snprintf(gate.dir, sizeof gate.dir, "/tmp/flint-sb-XXXXXX");
  assert_non_null(mkdtemp(gate.dir));
  char stall[96];
  snprintf(stall, sizeof stall, "0:%s", gate.dir);
  setenv("FLINT_PS_STALL_PUSH", stall, 1);
  setenv("FLINT_SPECULATION", "1", 1);
  setenv("FLINT_SPECULATION_QUANTILE", "0.5", 1);
  fl_context *ctx;
  fl_status opened = fl_context_open(CLUSTER, NULL, &ctx);
  unsetenv("FLINT_PS_STALL_PUSH");
  unsetenv("FLINT_SPECULATION");
  unsetenv("FLINT_SPECULATION_QUANTILE");
  assert_ok(opened);
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 4000, 6, 2, 6);
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_SANDBLASTER, .l2 = 0.01, .tol = 1e-7, .max_iterations = 100,
                           .progress = release_at_second, .progress_arg = &gate};
  fl_ml_model *disturbed, *plain;
  fl_status s = fl_ml_logreg(bin, &o, &disturbed);
  if (s != FL_OK) fail_msg("sandblaster: %s", fl_last_error());
  assert_int_equal(gate.released, 1);
  assert_int_equal(gate.pushed, 1); /* the duplicate really was pushed, mid-fit */
  o.progress = NULL;
  assert_ok(fl_ml_logreg(bin, &o, &plain)); /* the stall happens once: this run has none */
  uint32_t n = disturbed->num_history < plain->num_history ? disturbed->num_history : plain->num_history;
  assert_true(n >= 4);
  double worst = 0;
  for (uint32_t i = 0; i < n; i++)
    worst = fmax(worst, fabs(disturbed->history[i].loss - plain->history[i].loss) / plain->history[i].loss);
  double diff = rel_diff(disturbed->coef, plain->coef, 7);
  fprintf(stderr, "speculative duplicate: %u and %u iterations, losses within %.2e, models within %.2e\n",
          disturbed->num_history, plain->num_history, worst, diff);
  assert_true(worst < 1e-6);
  assert_true(diff < 1e-6);
  fl_ml_model_free(disturbed);
  fl_ml_model_free(plain);
  fl_ml_data_free(bin);
  fl_context_close(ctx);
  const char *names[] = {"stalled", "release", "pushed"};
  for (int i = 0; i < 3; i++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", gate.dir, names[i]);
    unlink(path);
  }
  assert_int_equal(rmdir(gate.dir), 0);
}

static void test_sandblaster_bad_options(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *bin = synth(ctx, FL_ML_SYNTH_LOGISTIC, 200, 3, 2, 2);
  fl_ml_model *m = NULL;
  fl_ml_train_options l1 = {.solver = FL_ML_SOLVER_SANDBLASTER, .l1 = 0.1};
  assert_int_equal(fl_ml_logreg(bin, &l1, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "no L1 penalty"));
  assert_int_equal(fl_ml_linreg(bin, &l1, &m), FL_EINVAL);
  fl_ml_train_options deep = {.solver = FL_ML_SOLVER_SANDBLASTER, .history = 5000};
  assert_int_equal(fl_ml_logreg(bin, &deep, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "5000 pairs"));
  fl_ml_train_options unknown = {.solver = (fl_ml_solver)(FL_ML_SOLVER_PS + 1)};
  assert_int_equal(fl_ml_logreg(bin, &unknown, &m), FL_EINVAL);
  assert_null(m);
  fl_ml_solver solver;
  assert_ok(fl_ml_solver_parse("sandblaster", &solver));
  assert_int_equal(solver, FL_ML_SOLVER_SANDBLASTER);
  assert_int_equal(fl_ml_solver_parse("sandblast", &solver), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "sandblaster"));
  /* and after the refusals the solver runs */
  fl_ml_train_options ok = {.solver = FL_ML_SOLVER_SANDBLASTER, .history = 3};
  assert_ok(fl_ml_logreg(bin, &ok, &m));
  assert_true(m->num_history >= 1);
  fl_ml_model_free(m);
  fl_ml_data_free(bin);
  fl_context_close(ctx);
}

/* ---- bad input ---------------------------------------------------------------------------- */

static void test_bad_labels_and_options(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_data *lin = synth(ctx, FL_ML_SYNTH_LINEAR, 200, 3, 0, 2);
  fl_ml_model *m = NULL;
  /* real-valued labels are not classes */
  assert_int_equal(fl_ml_logreg(lin, NULL, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "labels"));
  assert_null(m);
  /* a label beyond the classes asked for fails the job with the kernel's message */
  fl_ml_data *multi = synth(ctx, FL_ML_SYNTH_LOGISTIC, 300, 3, 4, 2);
  fl_ml_train_options two = {.classes = 3};
  fl_status s = fl_ml_logreg(multi, &two, &m);
  assert_int_not_equal(s, FL_OK);
  assert_non_null(strstr(fl_last_error(), "labels 0..2"));
  fl_ml_train_options normal = {.solver = FL_ML_SOLVER_NORMAL};
  assert_int_equal(fl_ml_logreg(multi, &normal, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "normal equations"));
  fl_ml_train_options l1normal = {.solver = FL_ML_SOLVER_NORMAL, .l1 = 0.1};
  assert_int_equal(fl_ml_linreg(lin, &l1normal, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "L1"));
  fl_ml_train_options negative = {.l2 = -1};
  assert_int_equal(fl_ml_linreg(lin, &negative, &m), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), ">= 0"));
  fl_ml_solver solver;
  assert_int_equal(fl_ml_solver_parse("newton", &solver), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "newton"));
  assert_ok(fl_ml_solver_parse("lbfgs", &solver));
  assert_int_equal(solver, FL_ML_SOLVER_LBFGS);
  assert_int_equal(fl_ml_linreg(NULL, NULL, &m), FL_EINVAL);
  assert_null(m);
  fl_ml_data_free(lin);
  fl_ml_data_free(multi);
  fl_context_close(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_least_squares_matches_qr),
      cmocka_unit_test(test_least_squares_iterative_solvers_agree),
      cmocka_unit_test(test_singular_system),
      cmocka_unit_test(test_sample_weights_equal_repeated_rows),
      cmocka_unit_test(test_logistic_loss_and_gradient),
      cmocka_unit_test(test_logistic_optimum),
      cmocka_unit_test(test_l1_owlqn),
      cmocka_unit_test(test_same_model_any_partitioning_and_mode),
      cmocka_unit_test(test_executor_killed_mid_optimization),
      cmocka_unit_test(test_bad_labels_and_options),
      cmocka_unit_test(test_sandblaster_matches_lbfgs),
      cmocka_unit_test(test_sandblaster_speculative_duplicate),
      cmocka_unit_test(test_sandblaster_bad_options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
