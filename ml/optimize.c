/*
 * optimize.c: the driver-side optimizers behind fl_ml_minimize.
 *
 * L-BFGS (Nocedal & Wright, Numerical Optimization, 2nd ed., 7.2): the direction comes from
 * the two-loop recursion over the last m pairs s = x+ - x, y = g+ - g, started from the
 * scaled identity gamma = s'y / y'y. A pair with s'y <= 1e-10 |s||y| is skipped, so the
 * implied inverse Hessian stays positive definite. The step satisfies the strong Wolfe
 * conditions (c1 1e-4, c2 0.9), found by bracketing and zoom (Algorithms 3.5 and 3.6) with
 * safeguarded cubic interpolation, in at most ML_LS_MAX_EVALS evaluations (ml/line_search.c,
 * shared with Sandblaster). The first trial
 * step is 1/|d| while the memory is empty (the first iteration: a unit move along -g), 1
 * afterwards.
 *
 * OWL-QN (Andrew & Gao, "Scalable training of L1-regularized log-linear models", 2007),
 * when l1 > 0: the pseudo-gradient pg of f + l1 |w|_1 replaces the gradient; the direction
 * is the two-loop recursion applied to pg, with each penalized coordinate that does not
 * point against pg zeroed; each trial point is projected onto the orthant of the current
 * point (sign(w_i), or sign(-pg_i) where w_i is 0); the step is found by halving until
 * F(x+) <= F(x) + c1 pg'(x+ - x). The pairs use the smooth gradients, since the L1 term
 * has no curvature.
 *
 * GD: x+ = x - a g, or x+ = prox(x - a g) (soft-thresholding, ISTA) with l1 > 0. Full
 * batch: a halves from the previous accepted step times 2 (from opt->step at first) until
 * Armijo's condition f(x+) <= f(x) - c1 a |g|^2 holds, or with l1 the proximal one
 * f(x+) <= f(x) + g'(x+ - x) + |x+ - x|^2 / 2a. Doubling lets the step grow back after a
 * cautious iteration at the price of about one extra evaluation per iteration; it grows at
 * most GD_MAX_GROWTH times past opt->step. Mini-batch (0 < fraction < 1): no line search,
 * a = opt->step / sqrt(t) at iteration t, and iteration t's loss and gradient are the
 * mini-batch estimates at its new point (seed opt->seed + t; the start uses opt->seed), so
 * the stopping test is on a mini-batch gradient.
 *
 * Stopping: grad_norm is the L2 norm of the gradient, or of the pseudo-gradient whenever
 * l1 > 0 (GD included, for one measure across methods; it is 0 exactly at the optimum).
 *
 * The objective is the expensive part (a flint job per evaluation), so the vector work
 * here is plain loops over n doubles. w is the caller's array and always holds the current
 * point; trials go to scratch vectors and are copied in when accepted.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "ml/ml.h"

enum {
  LS_MAX_EVALS = 20,    /* objective evaluations per L-BFGS or OWL-QN line search */
  GD_MAX_HALVINGS = 50, /* GD backtracking gives up at 2^-50 of the first trial step */
  HISTORY_FIRST = 16,   /* initial room in out->history */
};
#define C1 1e-4             /* sufficient decrease */
#define CURVATURE_EPS 1e-10 /* pairs with s'y below this times |s||y| are skipped */
#define GD_MAX_GROWTH 1e6   /* GD: the step never exceeds this times opt->step */

typedef struct optim {
  uint32_t n;
  double *w; /* the caller's: the current point */
  fl_ml_objective_fn f;
  void *arg;
  fl_ml_optim_options opt; /* defaults resolved */
  fl_ml_optim_result *out;
  double start; /* ml_now_s() at the start */
  uint32_t history_cap;

  double smooth; /* f(w) */
  double loss;   /* f(w) + the L1 term */
  double grad_norm;
  double *g;  /* gradient of f at w */
  double *pg; /* pseudo-gradient at w (l1 > 0) */
  /* a trial point and its gradient, a search direction, the best trial of a line search */
  double *xt, *gt, *d, *xbest, *gbest;
  double best, best_smooth, best_step; /* the best trial's objective, f and step (0: none beat w) */

  /* L-BFGS memory: `count` pairs in a ring of m slots, the oldest at `first`. */
  uint32_t m, first, count;
  double *s, *y, *rho, *a;
} optim;

/* ---- vectors ------------------------------------------------------------------------------ */

static double dot(const double *a, const double *b, uint32_t n) {
  double sum = 0;
  for (uint32_t i = 0; i < n; i++) sum += a[i] * b[i];
  return sum;
}

static double norm2(const double *a, uint32_t n) { return sqrt(dot(a, a, n)); }

static void copy(double *dst, const double *src, uint32_t n) { memcpy(dst, src, (size_t)n * sizeof *dst); }

static void swap(double **a, double **b) {
  double *t = *a;
  *a = *b;
  *b = t;
}

/* ---- the objective ------------------------------------------------------------------------ */

static bool penalized(const optim *o, uint32_t i) { return o->opt.l1 > 0 && !(o->opt.l1_skip && o->opt.l1_skip[i]); }

static double l1_term(const optim *o, const double *x) {
  if (o->opt.l1 == 0) return 0;
  double sum = 0;
  for (uint32_t i = 0; i < o->n; i++)
    if (penalized(o, i)) sum += fabs(x[i]);
  return o->opt.l1 * sum;
}

/* The minimum-norm subgradient of f + l1 |x|_1 at x, given f's gradient g. */
static void pseudo_gradient(const optim *o, const double *x, const double *g, double *pg) {
  double l1 = o->opt.l1;
  for (uint32_t i = 0; i < o->n; i++) {
    if (!penalized(o, i)) pg[i] = g[i];
    else if (x[i] > 0) pg[i] = g[i] + l1;
    else if (x[i] < 0) pg[i] = g[i] - l1;
    else if (g[i] + l1 < 0) pg[i] = g[i] + l1;
    else if (g[i] - l1 > 0) pg[i] = g[i] - l1;
    else pg[i] = 0;
  }
}

static fl_status evaluate(optim *o, const double *x, double fraction, uint64_t seed, double *loss, double *grad) {
  o->out->evaluations++;
  return o->f(o->arg, x, fraction, seed, loss, grad);
}

static bool finite_point(double loss, const double *grad, uint32_t n) { return isfinite(loss) && isfinite(dot(grad, grad, n)); }

/* Makes the accepted trial (xt, gt, smooth value f) the current point. */
static void take_trial(optim *o, double f) {
  copy(o->w, o->xt, o->n);
  swap(&o->g, &o->gt);
  o->smooth = f;
  o->loss = f + l1_term(o, o->w);
  if (o->opt.l1 > 0) {
    pseudo_gradient(o, o->w, o->g, o->pg);
    o->grad_norm = norm2(o->pg, o->n);
  } else {
    o->grad_norm = norm2(o->g, o->n);
  }
}

/* A trial that improves on the best one so far (by the full objective) is kept, so that a
 * failed line search can still end at the best point it saw. */
static void keep_if_best(optim *o, double loss, double smooth, double step) {
  if (!(loss < o->best)) return;
  o->best = loss;
  o->best_smooth = smooth;
  o->best_step = step;
  copy(o->xbest, o->xt, o->n);
  copy(o->gbest, o->gt, o->n);
}

/* Appends an iteration to out->history and reports it. */
static fl_status record(optim *o, double step) {
  fl_ml_optim_result *out = o->out;
  if (out->num_history == o->history_cap) {
    size_t cap = o->history_cap ? 2 * (size_t)o->history_cap : HISTORY_FIRST;
    fl_ml_iteration *h = cap <= UINT32_MAX ? realloc(out->history, cap * sizeof *h) : NULL;
    if (!h) return fl_set_error(FL_ENOMEM, "fl_ml_minimize: no memory for %zu history entries", cap);
    out->history = h;
    o->history_cap = (uint32_t)cap;
  }
  fl_ml_iteration it = {
      .iteration = ++out->iterations,
      .loss = o->loss,
      .grad_norm = o->grad_norm,
      .step = step,
      .evaluations = out->evaluations,
      .seconds = ml_now_s() - o->start,
  };
  out->history[out->num_history++] = it;
  out->loss = o->loss;
  out->grad_norm = o->grad_norm;
  out->converged = o->grad_norm <= o->opt.tol;
  return o->opt.progress ? o->opt.progress(o->opt.progress_arg, &it) : FL_OK;
}

/* A line search found no acceptable step. The run ends at the best point the search saw,
 * which counts as an iteration when it is not the current one (and converged stays false
 * unless that point happens to meet tol). */
static fl_status give_up(optim *o) {
  if (o->best_step == 0) return FL_OK;
  copy(o->xt, o->xbest, o->n);
  copy(o->gt, o->gbest, o->n);
  take_trial(o, o->best_smooth);
  return record(o, o->best_step);
}

/* ---- L-BFGS memory ------------------------------------------------------------------------ */

/* d = -H v, H the inverse Hessian approximation of the pairs in memory (I without any). */
static void two_loop(optim *o, const double *v, double *d) {
  uint32_t n = o->n;
  copy(d, v, n);
  for (uint32_t j = o->count; j-- > 0;) { /* newest first */
    uint32_t k = (o->first + j) % o->m;
    const double *s = o->s + (size_t)k * n, *y = o->y + (size_t)k * n;
    o->a[k] = o->rho[k] * dot(s, d, n);
    for (uint32_t i = 0; i < n; i++) d[i] -= o->a[k] * y[i];
  }
  if (o->count > 0) {
    uint32_t k = (o->first + o->count - 1) % o->m;
    const double *y = o->y + (size_t)k * n;
    double gamma = 1 / (o->rho[k] * dot(y, y, n)); /* s'y / y'y */
    for (uint32_t i = 0; i < n; i++) d[i] *= gamma;
  }
  for (uint32_t j = 0; j < o->count; j++) { /* oldest first */
    uint32_t k = (o->first + j) % o->m;
    const double *s = o->s + (size_t)k * n, *y = o->y + (size_t)k * n;
    double b = o->rho[k] * dot(y, d, n);
    for (uint32_t i = 0; i < n; i++) d[i] += (o->a[k] - b) * s[i];
  }
  for (uint32_t i = 0; i < n; i++) d[i] = -d[i];
}

/* Remembers the pair (xt - w, gt - g) unless its curvature is too small to trust. The
 * check comes first: with a full memory the slot written is the oldest pair's. */
static void remember_pair(optim *o) {
  uint32_t n = o->n;
  double sy = 0, ss = 0, yy = 0;
  for (uint32_t i = 0; i < n; i++) {
    double s = o->xt[i] - o->w[i], y = o->gt[i] - o->g[i];
    sy += s * y;
    ss += s * s;
    yy += y * y;
  }
  if (!(sy > CURVATURE_EPS * sqrt(ss) * sqrt(yy))) return;
  uint32_t k = (o->first + o->count) % o->m;
  double *s = o->s + (size_t)k * n, *y = o->y + (size_t)k * n;
  for (uint32_t i = 0; i < n; i++) {
    s[i] = o->xt[i] - o->w[i];
    y[i] = o->gt[i] - o->g[i];
  }
  o->rho[k] = 1 / sy;
  if (o->count < o->m) o->count++;
  else o->first = (o->first + 1) % o->m;
}

/* ---- strong Wolfe line search (smooth L-BFGS) ----------------------------------------------- */

/* phi(step) = f(w + step d) and phi'(step) = g(w + step d)'d, the point left in xt, gt. A
 * non-finite value is +inf, which the search reads as "too far". */
static fl_status ls_eval(void *ctx, double step, ml_ls_point *p) {
  optim *o = ctx;
  for (uint32_t i = 0; i < o->n; i++) o->xt[i] = o->w[i] + step * o->d[i];
  double loss;
  fl_status s = evaluate(o, o->xt, 1.0, 0, &loss, o->gt);
  if (s != FL_OK) return s;
  *p = (ml_ls_point){step, loss, dot(o->gt, o->d, o->n)};
  if (!isfinite(p->phi) || !isfinite(p->dphi)) p->phi = INFINITY;
  else keep_if_best(o, loss, loss, step);
  return FL_OK;
}

static fl_status run_lbfgs(optim *o) {
  uint32_t n = o->n;
  for (uint32_t k = 1; k <= o->opt.max_iterations; k++) {
    two_loop(o, o->g, o->d);
    double dphi0 = dot(o->g, o->d, n);
    if (!(dphi0 < 0)) { /* rounding broke H's definiteness: restart from steepest descent */
      o->count = 0;
      for (uint32_t i = 0; i < n; i++) o->d[i] = -o->g[i];
      dphi0 = -dot(o->g, o->g, n);
    }
    double step = o->count == 0 ? 1 / norm2(o->d, n) : 1;
    o->best = o->smooth;
    o->best_step = 0;
    ml_ls_point found;
    fl_status s = ml_line_search_wolfe(o, ls_eval, o->smooth, dphi0, step, &found);
    if (s != FL_OK) return s;
    if (found.step == 0) return give_up(o);
    remember_pair(o);
    take_trial(o, found.phi);
    s = record(o, found.step);
    if (s != FL_OK || o->out->converged) return s;
  }
  return FL_OK;
}

/* ---- OWL-QN -------------------------------------------------------------------------------- */

static fl_status run_owlqn(optim *o) {
  uint32_t n = o->n;
  for (uint32_t k = 1; k <= o->opt.max_iterations; k++) {
    two_loop(o, o->pg, o->d);
    for (uint32_t i = 0; i < n; i++)
      if (penalized(o, i) && o->d[i] * o->pg[i] >= 0) o->d[i] = 0;
    if (!(dot(o->d, o->pg, n) < 0)) { /* as in L-BFGS; -pg keeps to its own orthant */
      o->count = 0;
      for (uint32_t i = 0; i < n; i++) o->d[i] = -o->pg[i];
    }
    double step = o->count == 0 ? 1 / norm2(o->d, n) : 1;
    o->best = o->loss;
    o->best_step = 0;
    double smooth = 0;
    int e = 0;
    for (; e < LS_MAX_EVALS; e++, step *= 0.5) {
      for (uint32_t i = 0; i < n; i++) {
        o->xt[i] = o->w[i] + step * o->d[i];
        /* the orthant: w's sign, or -pg's where w_i is 0; leaving it means landing on 0 */
        double side = o->w[i] != 0 ? o->w[i] : -o->pg[i];
        if (penalized(o, i) && o->xt[i] * side <= 0) o->xt[i] = 0;
      }
      fl_status s = evaluate(o, o->xt, 1.0, 0, &smooth, o->gt);
      if (s != FL_OK) return s;
      if (!finite_point(smooth, o->gt, n)) continue;
      double loss = smooth + l1_term(o, o->xt);
      keep_if_best(o, loss, smooth, step);
      double decrease = 0; /* pg'(xt - w) */
      for (uint32_t i = 0; i < n; i++) decrease += o->pg[i] * (o->xt[i] - o->w[i]);
      if (loss <= o->loss + C1 * decrease) break;
    }
    if (e == LS_MAX_EVALS) return give_up(o);
    remember_pair(o);
    take_trial(o, smooth);
    fl_status s = record(o, step);
    if (s != FL_OK || o->out->converged) return s;
  }
  return FL_OK;
}

/* ---- gradient descent ---------------------------------------------------------------------- */

/* xt = w - step g, then soft-thresholded by step * l1 on the penalized coordinates. */
static void gradient_step(optim *o, double step) {
  double shrink = step * o->opt.l1;
  for (uint32_t i = 0; i < o->n; i++) {
    double x = o->w[i] - step * o->g[i];
    if (penalized(o, i)) x = x > shrink ? x - shrink : x < -shrink ? x + shrink : 0;
    o->xt[i] = x;
  }
}

static fl_status run_gd(optim *o) {
  uint32_t n = o->n;
  double step = o->opt.step;
  for (uint32_t k = 1; k <= o->opt.max_iterations; k++) {
    double gg = dot(o->g, o->g, n), smooth = 0;
    int h = 0;
    for (; h < GD_MAX_HALVINGS; h++, step *= 0.5) {
      gradient_step(o, step);
      fl_status s = evaluate(o, o->xt, 1.0, 0, &smooth, o->gt);
      if (s != FL_OK) return s;
      if (!finite_point(smooth, o->gt, n)) continue;
      if (o->opt.l1 == 0) {
        if (smooth <= o->smooth - C1 * step * gg) break;
      } else {
        double lin = 0, sq = 0;
        for (uint32_t i = 0; i < n; i++) {
          double dx = o->xt[i] - o->w[i];
          lin += o->g[i] * dx;
          sq += dx * dx;
        }
        if (smooth <= o->smooth + lin + sq / (2 * step)) break;
      }
    }
    if (h == GD_MAX_HALVINGS) return FL_OK; /* no step decreases f: w is the last accepted point */
    take_trial(o, smooth);
    fl_status s = record(o, step);
    if (s != FL_OK || o->out->converged) return s;
    step = fmin(2 * step, GD_MAX_GROWTH * o->opt.step);
  }
  return FL_OK;
}

static fl_status run_minibatch(optim *o) {
  for (uint32_t k = 1; k <= o->opt.max_iterations; k++) {
    double step = o->opt.step / sqrt((double)k), smooth;
    gradient_step(o, step);
    fl_status s = evaluate(o, o->xt, o->opt.fraction, o->opt.seed + k, &smooth, o->gt);
    if (s != FL_OK) return s;
    if (!finite_point(smooth, o->gt, o->n)) return FL_OK; /* diverged: keep the last finite point */
    take_trial(o, smooth);
    s = record(o, step);
    if (s != FL_OK || o->out->converged) return s;
  }
  return FL_OK;
}

/* ---- entry points -------------------------------------------------------------------------- */

static fl_status check_options(const fl_ml_optim_options *opt) {
  if (opt->method != FL_ML_LBFGS && opt->method != FL_ML_GD)
    return fl_set_error(FL_EINVAL, "fl_ml_minimize: method %d is neither FL_ML_LBFGS nor FL_ML_GD", (int)opt->method);
  if (!(opt->l1 >= 0 && isfinite(opt->l1)))
    return fl_set_error(FL_EINVAL, "fl_ml_minimize: l1 is %g; it must be finite and >= 0", opt->l1);
  if (!(opt->tol >= 0 && isfinite(opt->tol)))
    return fl_set_error(FL_EINVAL, "fl_ml_minimize: tol is %g; it must be finite and >= 0", opt->tol);
  if (!(opt->fraction >= 0 && opt->fraction <= 1))
    return fl_set_error(FL_EINVAL, "fl_ml_minimize: fraction is %g; it must be in [0, 1]", opt->fraction);
  if (!(opt->step >= 0 && isfinite(opt->step)))
    return fl_set_error(FL_EINVAL, "fl_ml_minimize: step is %g; it must be finite and >= 0", opt->step);
  return FL_OK;
}

/* Room for the vectors: 7 of n, plus m pairs and 2m scalars for L-BFGS. */
static double *alloc_vectors(uint32_t n, uint32_t m) {
  size_t vectors, count, bytes;
  if (__builtin_add_overflow((size_t)7, 2 * (size_t)m, &vectors) || __builtin_mul_overflow(vectors, (size_t)n, &count) ||
      __builtin_add_overflow(count, 2 * (size_t)m, &count) || __builtin_mul_overflow(count, sizeof(double), &bytes))
    return NULL;
  return malloc(bytes);
}

fl_status fl_ml_minimize(uint32_t n, double *w, fl_ml_objective_fn f, void *arg, const fl_ml_optim_options *opt,
                         fl_ml_optim_result *out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_ml_minimize: out is NULL");
  *out = (fl_ml_optim_result){0};
  if (n == 0) return fl_set_error(FL_EINVAL, "fl_ml_minimize: n is 0 (nothing to minimize)");
  if (!w) return fl_set_error(FL_EINVAL, "fl_ml_minimize: w is NULL");
  if (!f) return fl_set_error(FL_EINVAL, "fl_ml_minimize: the objective f is NULL");
  optim o = {.n = n, .w = w, .f = f, .arg = arg, .out = out};
  if (opt) o.opt = *opt;
  fl_status s = check_options(&o.opt);
  if (s != FL_OK) return s;
  if (o.opt.max_iterations == 0) o.opt.max_iterations = 100;
  if (o.opt.tol == 0) o.opt.tol = 1e-6;
  if (o.opt.step == 0) o.opt.step = 1;
  if (o.opt.fraction == 0) o.opt.fraction = 1;
  bool minibatch = o.opt.method == FL_ML_GD && o.opt.fraction < 1;
  if (o.opt.method == FL_ML_LBFGS) o.m = o.opt.history ? o.opt.history : 10;

  double *mem = alloc_vectors(n, o.m);
  if (!mem)
    return fl_set_error(FL_ENOMEM, "fl_ml_minimize: no memory for %llu vectors of %u values (history %u)",
                        7 + 2ull * o.m, n, o.m);
  double *next = mem;
  double **vectors[] = {&o.g, &o.pg, &o.xt, &o.gt, &o.d, &o.xbest, &o.gbest};
  for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++, next += n) *vectors[i] = next;
  o.s = next;
  o.y = o.s + (size_t)o.m * n;
  o.rho = o.y + (size_t)o.m * n;
  o.a = o.rho + o.m;
  o.start = ml_now_s();

  double smooth;
  s = evaluate(&o, w, minibatch ? o.opt.fraction : 1.0, minibatch ? o.opt.seed : 0, &smooth, o.gt);
  if (s != FL_OK) goto done;
  if (!finite_point(smooth, o.gt, n)) {
    s = fl_set_error(FL_EINVAL, "fl_ml_minimize: objective is not finite at the start point (loss %g)", smooth);
    goto done;
  }
  copy(o.xt, w, n);
  take_trial(&o, smooth);
  out->loss = o.loss;
  out->grad_norm = o.grad_norm;
  out->converged = o.grad_norm <= o.opt.tol;
  if (out->converged) goto done;

  if (minibatch) s = run_minibatch(&o);
  else if (o.opt.method == FL_ML_GD) s = run_gd(&o);
  else if (o.opt.l1 > 0) s = run_owlqn(&o);
  else s = run_lbfgs(&o);
done:
  free(mem);
  return s;
}

void fl_ml_optim_result_free(fl_ml_optim_result *r) {
  if (!r) return;
  free(r->history);
  *r = (fl_ml_optim_result){0};
}
