/*
 * test_ml_optimize.c: fl_ml_minimize on objectives with known answers: Rosenbrock, SPD
 * quadratics checked against LAPACKE_dposv, lasso problems checked by their optimality
 * (KKT) conditions; the strong Wolfe conditions re-checked from the outside at every
 * accepted L-BFGS step; history, progress, cancellation and every error path.
 */
#include <math.h>

#include <lapacke.h>

#include "flint/ml.h"
#include "test_util.h"

#define C1 1e-4
#define C2 0.9

/* ---- a seeded generator ------------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *state) { return ((double)(splitmix(state) >> 11) + 0.5) / 9007199254740992.0; }

static double normal(uint64_t *state) { return sqrt(-2 * log(uniform(state))) * cos(2 * M_PI * uniform(state)); }

/* ---- objectives ---------------------------------------------------------------------------- */

/* Extended Rosenbrock: sum over pairs of 100 (x2 - x1^2)^2 + (1 - x1)^2; minimum 0 at 1. */
static fl_status rosenbrock(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  uint32_t n = *(const uint32_t *)arg;
  *loss = 0;
  for (uint32_t i = 0; i + 1 < n; i += 2) {
    double t = x[i + 1] - x[i] * x[i], u = 1 - x[i];
    *loss += 100 * t * t + u * u;
    grad[i] = -400 * x[i] * t - 2 * u;
    grad[i + 1] = 200 * t;
  }
  return FL_OK;
}

/* 0.5 x'Ax - b'x + offset, the offset 0.5 b'A^-1 b making the minimum 0. Near the optimum
 * the value changes by less than a double's rounding of -0.5 b'A^-1 b, and a line search
 * could not see it decrease; so the minimum is shifted to 0 (the gradient does not change)
 * and the sum is taken in long double. */
typedef struct quadratic {
  uint32_t n;
  double *a, *b; /* n x n SPD, n */
  double offset;
  uint32_t calls;
} quadratic;

static fl_status quadratic_fn(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  quadratic *q = arg;
  long double sum = q->offset;
  for (uint32_t i = 0; i < q->n; i++) {
    long double ax = 0;
    for (uint32_t j = 0; j < q->n; j++) ax += (long double)q->a[(size_t)i * q->n + j] * x[j];
    sum += 0.5L * x[i] * ax - (long double)q->b[i] * x[i];
    grad[i] = (double)(ax - q->b[i]);
  }
  *loss = (double)sum;
  q->calls++;
  return FL_OK;
}

static double *quadratic_solution(const quadratic *q);

/* A = M M' / n + I (eigenvalues in about [1, 5]), b standard normal. */
static quadratic quadratic_make(uint32_t n, uint64_t seed) {
  quadratic q = {.n = n, .a = calloc((size_t)n * n, sizeof(double)), .b = calloc(n, sizeof(double))};
  double *m = calloc((size_t)n * n, sizeof(double));
  assert_true(q.a && q.b && m);
  for (size_t i = 0; i < (size_t)n * n; i++) m[i] = normal(&seed);
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t j = 0; j < n; j++) {
      double sum = 0;
      for (uint32_t k = 0; k < n; k++) sum += m[(size_t)i * n + k] * m[(size_t)j * n + k];
      q.a[(size_t)i * n + j] = sum / n + (i == j);
    }
    q.b[i] = normal(&seed);
  }
  free(m);
  double *x = quadratic_solution(&q);
  for (uint32_t i = 0; i < n; i++) q.offset += 0.5 * q.b[i] * x[i];
  free(x);
  return q;
}

/* The solution of Ax = b by Cholesky. */
static double *quadratic_solution(const quadratic *q) {
  double *a = malloc((size_t)q->n * q->n * sizeof(double)), *x = malloc(q->n * sizeof(double));
  assert_true(a && x);
  memcpy(a, q->a, (size_t)q->n * q->n * sizeof(double));
  memcpy(x, q->b, q->n * sizeof(double));
  assert_int_equal(LAPACKE_dposv(LAPACK_ROW_MAJOR, 'U', (lapack_int)q->n, 1, a, (lapack_int)q->n, x, 1), 0);
  free(a);
  return x;
}

static void quadratic_free(quadratic *q) {
  free(q->a);
  free(q->b);
}

static double relative_error(const double *x, const double *want, uint32_t n) {
  double num = 0, den = 0;
  for (uint32_t i = 0; i < n; i++) {
    num += (x[i] - want[i]) * (x[i] - want[i]);
    den += want[i] * want[i];
  }
  return sqrt(num / den);
}

/* 0.5 |Ax - b|^2 (A rows x cols), b = A x_true + noise with a sparse x_true. */
typedef struct lasso {
  uint32_t rows, cols;
  double *a, *b, *truth;
} lasso;

static fl_status lasso_fn(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  const lasso *p = arg;
  long double sum = 0;
  memset(grad, 0, p->cols * sizeof(double));
  for (uint32_t r = 0; r < p->rows; r++) {
    const double *row = p->a + (size_t)r * p->cols;
    long double res = -(long double)p->b[r];
    for (uint32_t c = 0; c < p->cols; c++) res += (long double)row[c] * x[c];
    sum += 0.5L * res * res;
    for (uint32_t c = 0; c < p->cols; c++) grad[c] += (double)res * row[c];
  }
  *loss = (double)sum;
  return FL_OK;
}

static lasso lasso_make(uint32_t rows, uint32_t cols, uint64_t seed) {
  lasso p = {rows, cols, malloc((size_t)rows * cols * sizeof(double)), malloc(rows * sizeof(double)),
             calloc(cols, sizeof(double))};
  assert_true(p.a && p.b && p.truth);
  for (uint32_t c = 0; c < cols; c += 4) p.truth[c] = (c % 8 ? 1 : -1) * (2 + uniform(&seed));
  for (size_t i = 0; i < (size_t)rows * cols; i++) p.a[i] = normal(&seed);
  for (uint32_t r = 0; r < rows; r++) {
    double y = 0.1 * normal(&seed);
    for (uint32_t c = 0; c < cols; c++) y += p.a[(size_t)r * cols + c] * p.truth[c];
    p.b[r] = y;
  }
  return p;
}

static void lasso_free(lasso *p) {
  free(p->a);
  free(p->b);
  free(p->truth);
}

/* Optimality of x for f + l1 |x|_1 (skip: unpenalized coordinates): returns the largest
 * violation and counts the zeros. */
static double lasso_kkt(const lasso *p, const double *x, double l1, const bool *skip, uint32_t *zeros) {
  double *g = malloc(p->cols * sizeof(double)), loss, worst = 0;
  assert_non_null(g);
  assert_ok(lasso_fn((void *)p, x, 1, 0, &loss, g));
  *zeros = 0;
  for (uint32_t c = 0; c < p->cols; c++) {
    double v;
    if (skip && skip[c]) v = fabs(g[c]);
    else if (x[c] != 0) v = fabs(g[c] + copysign(l1, x[c]));
    else {
      v = fmax(0, fabs(g[c]) - l1);
      ++*zeros;
    }
    worst = fmax(worst, v);
  }
  free(g);
  return worst;
}

/* |x|^2 / 2: gradient x, optimum 0. */
static fl_status half_square(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  uint32_t n = *(const uint32_t *)arg;
  *loss = 0;
  for (uint32_t i = 0; i < n; i++) {
    *loss += 0.5 * x[i] * x[i];
    grad[i] = x[i];
  }
  return FL_OK;
}

/* ---- 1. Rosenbrock ----------------------------------------------------------------------- */

static void lbfgs_rosenbrock_2d(void **state) {
  uint32_t n = 2;
  double w[2] = {-1.2, 1};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .tol = 1e-9};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(n, w, rosenbrock, &n, &opt, &r));
  assert_true(r.converged);
  assert_true(r.iterations > 0 && r.iterations < 100);
  assert_true(fabs(w[0] - 1) < 1e-6 && fabs(w[1] - 1) < 1e-6);
  assert_true(r.grad_norm <= 1e-9 && r.loss < 1e-12);
  fl_ml_optim_result_free(&r);
}

static void lbfgs_rosenbrock_100d(void **state) {
  uint32_t n = 100;
  double w[100];
  for (uint32_t i = 0; i < n; i++) w[i] = i % 2 ? 1 : -1.2;
  for (uint32_t m = 3; m <= 10; m += 7) { /* a short memory and the default */
    double x[100];
    memcpy(x, w, sizeof x);
    fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .tol = 1e-9, .max_iterations = 1000, .history = m == 10 ? 0 : m};
    fl_ml_optim_result r;
    assert_ok(fl_ml_minimize(n, x, rosenbrock, &n, &opt, &r));
    assert_true(r.converged);
    for (uint32_t i = 0; i < n; i++) assert_true(fabs(x[i] - 1) < 1e-6);
    fl_ml_optim_result_free(&r);
  }
}

/* ---- 2. a quadratic against dposv ------------------------------------------------------------ */

static void lbfgs_quadratic_matches_dposv(void **state) {
  quadratic q = quadratic_make(50, 42);
  double *want = quadratic_solution(&q), w[50] = {0};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .tol = 1e-8, .max_iterations = 500};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(q.n, w, quadratic_fn, &q, &opt, &r));
  assert_true(r.converged);
  assert_true(relative_error(w, want, q.n) < 1e-8);
  assert_int_equal(r.evaluations, q.calls);
  fl_ml_optim_result_free(&r);
  free(want);
  quadratic_free(&q);
}

/* ---- 3. strong Wolfe, checked from the outside --------------------------------------------- */

/* Copies w (the current point, by the header's promise) and the step at every iteration. */
typedef struct recorder {
  uint32_t n, count, cap;
  const double *w;
  double *points; /* cap x n; row 0 is the start */
  double *steps;  /* steps[k]: the step from point k to k + 1 */
} recorder;

static fl_status record_point(void *arg, const fl_ml_iteration *it) {
  recorder *rec = arg;
  assert_true(rec->count + 1 < rec->cap);
  assert_int_equal(it->iteration, rec->count + 1);
  rec->steps[rec->count++] = it->step;
  memcpy(rec->points + (size_t)rec->count * rec->n, rec->w, rec->n * sizeof(double));
  return FL_OK;
}

/* Runs L-BFGS from w and re-checks both strong Wolfe conditions at each accepted step.
 * Rounding slack: the direction is rebuilt as (w_{k+1} - w_k) / step. */
static void check_wolfe_run(uint32_t n, double *w, fl_ml_objective_fn f, void *arg, double tol) {
  recorder rec = {.n = n, .cap = 1000, .w = w};
  rec.points = malloc((size_t)rec.cap * n * sizeof(double));
  rec.steps = malloc(rec.cap * sizeof(double));
  double *g0 = malloc(n * sizeof(double)), *g1 = malloc(n * sizeof(double)), *p = malloc(n * sizeof(double));
  assert_true(rec.points && rec.steps && g0 && g1 && p);
  memcpy(rec.points, w, n * sizeof(double));
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .tol = tol, .max_iterations = 500, .progress = record_point,
                             .progress_arg = &rec};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(n, w, f, arg, &opt, &r));
  assert_true(r.converged); /* no failed search: every step was accepted by the search */
  assert_int_equal(rec.count, r.iterations);
  assert_true(r.iterations >= 2);
  for (uint32_t k = 0; k < rec.count; k++) {
    const double *x0 = rec.points + (size_t)k * n, *x1 = x0 + n;
    double f0, f1, step = rec.steps[k];
    assert_ok(f(arg, x0, 1, 0, &f0, g0));
    assert_ok(f(arg, x1, 1, 0, &f1, g1));
    assert_true(step > 0);
    for (uint32_t i = 0; i < n; i++) p[i] = (x1[i] - x0[i]) / step;
    double gp0 = 0, gp1 = 0;
    for (uint32_t i = 0; i < n; i++) gp0 += g0[i] * p[i], gp1 += g1[i] * p[i];
    assert_true(gp0 < 0);
    if (!(f1 <= f0 + C1 * step * gp0 + 1e-6 * fabs(step * gp0) + 1e-15 * fabs(f0)))
      fail_msg("step %u: no sufficient decrease: %.17g > %.17g + %g", k + 1, f1, f0, C1 * step * gp0);
    if (!(fabs(gp1) <= C2 * fabs(gp0) * (1 + 1e-6)))
      fail_msg("step %u: curvature: |%g| > %g |%g|", k + 1, gp1, C2, gp0);
  }
  fl_ml_optim_result_free(&r);
  free(rec.points);
  free(rec.steps);
  free(g0);
  free(g1);
  free(p);
}

static void lbfgs_steps_satisfy_strong_wolfe(void **state) {
  uint32_t two = 2, eight = 8;
  double w2[2] = {-1.2, 1};
  check_wolfe_run(two, w2, rosenbrock, &two, 1e-8);
  double w8[8] = {-1.2, 1, 0, 0, 2, 2, -1, 3};
  check_wolfe_run(eight, w8, rosenbrock, &eight, 1e-8);
  /* Far from the optimum the first trial (a unit move) is too short: the search must
   * extrapolate before the curvature condition holds. */
  uint32_t one = 1;
  double w1[1] = {1000};
  check_wolfe_run(one, w1, half_square, &one, 1e-8);
  assert_true(fabs(w1[0]) < 1e-8);
  quadratic q = quadratic_make(20, 7);
  double wq[20] = {0};
  check_wolfe_run(q.n, wq, quadratic_fn, &q, 1e-8);
  quadratic_free(&q);
}

/* |x|^2 / 2 that is NaN beyond |x_i| > 0.5: the first trial lands there. */
static fl_status half_square_bounded(void *arg, const double *x, double fraction, uint64_t seed, double *loss,
                                     double *grad) {
  uint32_t *nan_calls = arg;
  assert_ok(half_square(&(uint32_t){1}, x, fraction, seed, loss, grad));
  *loss *= 100, grad[0] *= 100;
  if (fabs(x[0]) > 0.5) *loss = NAN, grad[0] = NAN, ++*nan_calls;
  return FL_OK;
}

static void lbfgs_nonfinite_trial_shrinks(void **state) {
  uint32_t nan_calls = 0;
  double w[1] = {0.05}; /* gradient 5: the first trial moves to -0.95 */
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .tol = 1e-10};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(1, w, half_square_bounded, &nan_calls, &opt, &r));
  assert_true(nan_calls > 0);
  assert_true(r.converged);
  assert_true(fabs(w[0]) < 1e-11);
  fl_ml_optim_result_free(&r);
}

/* Returns the gradient with the wrong sign: no step along "descent" decreases the value. */
static fl_status wrong_gradient(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  assert_ok(half_square(arg, x, fraction, seed, loss, grad));
  for (uint32_t i = 0; i < *(const uint32_t *)arg; i++) grad[i] = -grad[i];
  return FL_OK;
}

static void lbfgs_failed_search_keeps_best_point(void **state) {
  uint32_t n = 2;
  double w[2] = {1, -2};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(n, w, wrong_gradient, &n, &opt, &r));
  assert_false(r.converged);
  assert_int_equal(r.iterations, 0); /* every trial was worse: w stays */
  assert_true(w[0] == 1 && w[1] == -2);
  assert_true(r.evaluations > 1 && r.evaluations <= 21);
  assert_true(r.loss == 2.5);
  fl_ml_optim_result_free(&r);
}

/* ---- 4. OWL-QN ------------------------------------------------------------------------------- */

static void owlqn_lasso_kkt(void **state) {
  lasso p = lasso_make(60, 20, 3);
  double w[20] = {0}, l1 = 5;
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .l1 = l1, .tol = 1e-7, .max_iterations = 500};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(p.cols, w, lasso_fn, &p, &opt, &r));
  assert_true(r.converged);
  uint32_t zeros;
  double worst = lasso_kkt(&p, w, l1, NULL, &zeros);
  if (worst > 1e-5) fail_msg("KKT violated by %g", worst);
  assert_true(zeros >= 10); /* 15 of the truth's 20 are 0 */
  for (uint32_t c = 0; c < p.cols; c++)
    if (p.truth[c] != 0) assert_true(w[c] != 0 && copysign(1, w[c]) == copysign(1, p.truth[c]));
  /* the reported loss includes the L1 term */
  double g[20], smooth, norm1 = 0;
  assert_ok(lasso_fn(&p, w, 1, 0, &smooth, g));
  for (uint32_t c = 0; c < p.cols; c++) norm1 += fabs(w[c]);
  assert_true(fabs(r.loss - (smooth + l1 * norm1)) <= 1e-12 * fabs(r.loss));
  fl_ml_optim_result_free(&r);
  lasso_free(&p);
}

static void owlqn_l1_skip_leaves_coordinate_free(void **state) {
  lasso p = lasso_make(60, 20, 3);
  double l1 = 5, penalized[20] = {0}, skipped[20] = {0};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .l1 = l1, .tol = 1e-7, .max_iterations = 500};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(p.cols, penalized, lasso_fn, &p, &opt, &r));
  fl_ml_optim_result_free(&r);
  uint32_t j = 0; /* a coordinate the penalty zeroes */
  while (j < p.cols && !(p.truth[j] == 0 && penalized[j] == 0)) j++;
  assert_true(j < p.cols);
  bool skip[20] = {false};
  skip[j] = true;
  opt.l1_skip = skip;
  assert_ok(fl_ml_minimize(p.cols, skipped, lasso_fn, &p, &opt, &r));
  assert_true(r.converged);
  assert_true(skipped[j] != 0);
  uint32_t zeros;
  double worst = lasso_kkt(&p, skipped, l1, skip, &zeros);
  if (worst > 1e-5) fail_msg("KKT violated by %g", worst);
  fl_ml_optim_result_free(&r);
  lasso_free(&p);
}

/* ---- 5. gradient descent ---------------------------------------------------------------- */

static void gd_quadratic(void **state) {
  quadratic q = quadratic_make(50, 11);
  double *want = quadratic_solution(&q), w[50] = {0};
  fl_ml_optim_options opt = {.method = FL_ML_GD, .tol = 1e-7, .max_iterations = 5000, .step = 10};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(q.n, w, quadratic_fn, &q, &opt, &r));
  assert_true(r.converged);
  assert_true(relative_error(w, want, q.n) < 1e-5);
  /* step 10 on curvatures of 1 to 5 increases the value: backtracking halves it */
  assert_true(r.history[0].step > 0 && r.history[0].step <= 1.25);
  for (uint32_t i = 1; i < r.num_history; i++) assert_true(r.history[i].loss <= r.history[i - 1].loss);
  fl_ml_optim_result_free(&r);
  free(want);
  quadratic_free(&q);
}

static void gd_proximal_lasso(void **state) {
  lasso p = lasso_make(60, 20, 5);
  double w[20] = {0}, l1 = 5;
  fl_ml_optim_options opt = {.method = FL_ML_GD, .l1 = l1, .tol = 1e-6, .max_iterations = 20000};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(p.cols, w, lasso_fn, &p, &opt, &r));
  assert_true(r.converged);
  uint32_t zeros;
  double worst = lasso_kkt(&p, w, l1, NULL, &zeros);
  if (worst > 1e-4) fail_msg("KKT violated by %g", worst);
  assert_true(zeros >= 10);
  fl_ml_optim_result_free(&r);
  lasso_free(&p);
}

/* |x - c|^2 / 2 with a noisy gradient when fraction < 1: noise from the seed. Records the
 * fraction and seed of every call. */
typedef struct noisy {
  uint32_t n, calls;
  double fraction[256];
  uint64_t seed[256];
} noisy;

static fl_status noisy_fn(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  noisy *q = arg;
  if (q->calls < 256) q->fraction[q->calls] = fraction, q->seed[q->calls] = seed;
  q->calls++;
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  *loss = 0;
  for (uint32_t i = 0; i < q->n; i++) {
    double c = 1 + i, e = fraction < 1 ? 0.3 * normal(&state) : 0;
    *loss += 0.5 * (x[i] - c) * (x[i] - c) + e * x[i];
    grad[i] = x[i] - c + e;
  }
  return FL_OK;
}

static void gd_minibatch_decreases(void **state) {
  noisy q = {.n = 5};
  double w[5] = {0}, g[5], before, after;
  assert_ok(noisy_fn(&q, w, 1, 0, &before, g));
  q.calls = 0;
  fl_ml_optim_options opt = {.method = FL_ML_GD, .fraction = 0.25, .seed = 1000, .step = 0.5, .max_iterations = 200};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(q.n, w, noisy_fn, &q, &opt, &r));
  assert_int_equal(r.iterations, 200); /* a noisy gradient never gets below 1e-6 */
  assert_false(r.converged);
  assert_int_equal(q.calls, 201); /* no line search: one evaluation per iteration */
  for (uint32_t i = 0; i < 201; i++) {
    assert_true(q.fraction[i] == 0.25);
    assert_int_equal(q.seed[i], 1000 + i);
  }
  for (uint32_t i = 0; i < r.num_history; i++)
    assert_true(fabs(r.history[i].step - 0.5 / sqrt(i + 1.0)) < 1e-15);
  assert_ok(noisy_fn(&q, w, 1, 0, &after, g));
  assert_true(after < 0.05 * before); /* from 27.5 to near the optimum's 0 */
  fl_ml_optim_result_free(&r);
}

/* ---- 6. history and progress -------------------------------------------------------------- */

typedef struct progress_log {
  uint32_t calls, cancel_at;
  fl_ml_iteration seen[200];
} progress_log;

static fl_status log_progress(void *arg, const fl_ml_iteration *it) {
  progress_log *log = arg;
  if (log->calls < 200) log->seen[log->calls] = *it;
  log->calls++;
  return log->cancel_at && it->iteration == log->cancel_at ? fl_set_error(FL_ECANCELLED, "stopped by the test") : FL_OK;
}

static void check_history(const fl_ml_optim_result *r, const progress_log *log) {
  assert_int_equal(r->num_history, r->iterations);
  assert_int_equal(log->calls, r->iterations);
  for (uint32_t i = 0; i < r->num_history; i++) {
    const fl_ml_iteration *it = &r->history[i];
    assert_int_equal(it->iteration, i + 1);
    const fl_ml_iteration *seen = &log->seen[i];
    assert_true(seen->iteration == it->iteration && seen->loss == it->loss && seen->grad_norm == it->grad_norm &&
                seen->step == it->step && seen->evaluations == it->evaluations && seen->seconds == it->seconds);
    assert_true(it->evaluations <= r->evaluations && it->seconds >= 0);
    if (i > 0) {
      assert_true(it->evaluations > r->history[i - 1].evaluations);
      assert_true(it->seconds >= r->history[i - 1].seconds);
    }
  }
}

static void history_and_progress(void **state) {
  fl_ml_method methods[] = {FL_ML_LBFGS, FL_ML_GD};
  for (int m = 0; m < 2; m++) {
    uint32_t n = 2;
    double w[2] = {-1.2, 1};
    progress_log log = {0};
    fl_ml_optim_options opt = {.method = methods[m], .step = 0.001, .max_iterations = 150, .progress = log_progress,
                               .progress_arg = &log};
    fl_ml_optim_result r;
    assert_ok(fl_ml_minimize(n, w, rosenbrock, &n, &opt, &r));
    assert_true(r.iterations > 2);
    check_history(&r, &log);
    const fl_ml_iteration *last = &r.history[r.num_history - 1];
    assert_true(last->loss == r.loss && last->grad_norm == r.grad_norm && last->evaluations == r.evaluations);
    assert_true(r.converged == (r.grad_norm <= 1e-6));
    if (methods[m] == FL_ML_LBFGS) assert_true(r.converged);
    else assert_int_equal(r.iterations, 150); /* GD crawls along the valley */
    fl_ml_optim_result_free(&r);
    assert_null(r.history);
    assert_int_equal(r.num_history, 0);
  }
}

static void progress_cancels(void **state) {
  uint32_t n = 2;
  double w[2] = {-1.2, 1};
  progress_log log = {.cancel_at = 3};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .progress = log_progress, .progress_arg = &log};
  fl_ml_optim_result r;
  assert_fails_with(fl_ml_minimize(n, w, rosenbrock, &n, &opt, &r), FL_ECANCELLED, "stopped by the test");
  assert_int_equal(r.iterations, 3);
  assert_int_equal(log.calls, 3);
  assert_false(r.converged);
  check_history(&r, &log);
  assert_true(r.loss == r.history[2].loss);
  fl_ml_optim_result_free(&r);
}

/* L-BFGS asks for the full batch whatever the mini-batch options say. */
static void lbfgs_uses_full_batch(void **state) {
  noisy q = {.n = 5};
  double w[5] = {0};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .fraction = 0.5, .seed = 9};
  fl_ml_optim_result r;
  assert_ok(fl_ml_minimize(q.n, w, noisy_fn, &q, &opt, &r));
  assert_true(r.converged);
  for (uint32_t i = 0; i < q.calls && i < 256; i++) {
    assert_true(q.fraction[i] == 1.0);
    assert_int_equal(q.seed[i], 0);
  }
  fl_ml_optim_result_free(&r);
}

/* ---- 7. errors --------------------------------------------------------------------------- */

static void bad_arguments(void **state) {
  uint32_t n = 2;
  double w[2] = {1, 1};
  fl_ml_optim_result r;
  assert_fails_with(fl_ml_minimize(n, w, half_square, &n, NULL, NULL), FL_EINVAL, "out is NULL");
  assert_fails_with(fl_ml_minimize(0, w, half_square, &n, NULL, &r), FL_EINVAL, "n is 0");
  fl_ml_optim_result_free(&r);
  assert_fails_with(fl_ml_minimize(n, NULL, half_square, &n, NULL, &r), FL_EINVAL, "w is NULL");
  assert_fails_with(fl_ml_minimize(n, w, NULL, &n, NULL, &r), FL_EINVAL, "f is NULL");
  struct {
    fl_ml_optim_options opt;
    const char *needle;
  } cases[] = {
      {{.method = (fl_ml_method)7}, "method 7"},
      {{.l1 = -1}, "l1 is -1"},
      {{.l1 = NAN}, "l1 is nan"},
      {{.tol = -1e-3}, "tol is -0.001"},
      {{.fraction = 1.5}, "fraction is 1.5"},
      {{.fraction = -0.1}, "fraction is -0.1"},
      {{.method = FL_ML_GD, .step = -1}, "step is -1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    assert_fails_with(fl_ml_minimize(n, w, half_square, &n, &cases[i].opt, &r), FL_EINVAL, cases[i].needle);
    assert_int_equal(r.evaluations, 0);
    fl_ml_optim_result_free(&r);
  }
  assert_true(w[0] == 1 && w[1] == 1);
  /* NULL options are the defaults */
  assert_ok(fl_ml_minimize(n, w, half_square, &n, NULL, &r));
  assert_true(r.converged && fabs(w[0]) < 1e-6);
  fl_ml_optim_result_free(&r);
}

static fl_status fails_third_call(void *arg, const double *x, double fraction, uint64_t seed, double *loss,
                                  double *grad) {
  uint32_t *calls = arg;
  if (++*calls == 3) return fl_set_error(FL_EUSER, "objective failed on call %u", *calls);
  uint32_t n = 2;
  return rosenbrock(&n, x, fraction, seed, loss, grad);
}

static void objective_error_is_returned(void **state) {
  fl_ml_method methods[] = {FL_ML_LBFGS, FL_ML_GD};
  for (int m = 0; m < 2; m++) {
    for (int l1 = 0; l1 < 2; l1++) {
      uint32_t calls = 0;
      double w[2] = {-1.2, 1};
      fl_ml_optim_options opt = {.method = methods[m], .l1 = l1 ? 0.1 : 0};
      fl_ml_optim_result r;
      assert_fails_with(fl_ml_minimize(2, w, fails_third_call, &calls, &opt, &r), FL_EUSER, "objective failed on call 3");
      assert_int_equal(calls, 3);
      assert_int_equal(r.evaluations, 3);
      assert_false(r.converged);
      assert_int_equal(r.num_history, r.iterations);
      fl_ml_optim_result_free(&r);
    }
  }
}

static fl_status nan_at(void *arg, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  const int *which = arg;
  uint32_t n = 2;
  assert_ok(half_square(&n, x, fraction, seed, loss, grad));
  if (*which == 0) *loss = NAN;
  else if (*which == 1) *loss = INFINITY;
  else grad[1] = NAN;
  return FL_OK;
}

static void nonfinite_start(void **state) {
  for (int which = 0; which < 3; which++) {
    double w[2] = {1, 1};
    fl_ml_optim_result r;
    assert_fails_with(fl_ml_minimize(2, w, nan_at, &which, NULL, &r), FL_EINVAL,
                      "objective is not finite at the start point");
    assert_int_equal(r.evaluations, 1);
    fl_ml_optim_result_free(&r);
  }
}

static void out_of_memory(void **state) {
  /* 2 * history + 7 vectors of n values do not fit in size_t: refused before any use of w */
  uint32_t n = 1;
  double w[1] = {1};
  fl_ml_optim_options opt = {.method = FL_ML_LBFGS, .history = UINT32_MAX};
  fl_ml_optim_result r;
  assert_fails_with(fl_ml_minimize(UINT32_MAX, w, half_square, &n, &opt, &r), FL_ENOMEM, "no memory");
  assert_int_equal(r.evaluations, 0);
  fl_ml_optim_result_free(&r);
}

/* ---- 8. converged at the start ------------------------------------------------------------ */

static void converged_at_start(void **state) {
  fl_ml_optim_options opts[] = {{.method = FL_ML_LBFGS}, {.method = FL_ML_LBFGS, .l1 = 1}, {.method = FL_ML_GD},
                                {.method = FL_ML_GD, .fraction = 0.5}};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    uint32_t n = 3;
    double w[3] = {0};
    progress_log log = {0};
    opts[i].progress = log_progress;
    opts[i].progress_arg = &log;
    fl_ml_optim_result r;
    assert_ok(fl_ml_minimize(n, w, half_square, &n, &opts[i], &r));
    assert_true(r.converged);
    assert_int_equal(r.iterations, 0);
    assert_int_equal(r.evaluations, 1);
    assert_int_equal(r.num_history, 0);
    assert_null(r.history);
    assert_int_equal(log.calls, 0);
    assert_true(r.loss == 0 && r.grad_norm == 0);
    fl_ml_optim_result_free(&r);
  }
  fl_ml_optim_result zero = {0};
  fl_ml_optim_result_free(&zero);
  fl_ml_optim_result_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(lbfgs_rosenbrock_2d),
      cmocka_unit_test(lbfgs_rosenbrock_100d),
      cmocka_unit_test(lbfgs_quadratic_matches_dposv),
      cmocka_unit_test(lbfgs_steps_satisfy_strong_wolfe),
      cmocka_unit_test(lbfgs_nonfinite_trial_shrinks),
      cmocka_unit_test(lbfgs_failed_search_keeps_best_point),
      cmocka_unit_test(lbfgs_uses_full_batch),
      cmocka_unit_test(owlqn_lasso_kkt),
      cmocka_unit_test(owlqn_l1_skip_leaves_coordinate_free),
      cmocka_unit_test(gd_quadratic),
      cmocka_unit_test(gd_proximal_lasso),
      cmocka_unit_test(gd_minibatch_decreases),
      cmocka_unit_test(history_and_progress),
      cmocka_unit_test(progress_cancels),
      cmocka_unit_test(bad_arguments),
      cmocka_unit_test(objective_error_is_returned),
      cmocka_unit_test(nonfinite_start),
      cmocka_unit_test(out_of_memory),
      cmocka_unit_test(converged_at_start),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
