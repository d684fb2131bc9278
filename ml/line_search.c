/*
 * ml/line_search.c: the strong Wolfe line search of Nocedal and Wright (Algorithms 3.5 and
 * 3.6) that both L-BFGS solvers use: the client-driven one (ml/optimize.c), whose trial points
 * are arrays here, and Sandblaster (ml/sandblaster.c), whose trial points are columns on the
 * parameter servers. Each gives the search its phi(step) and phi'(step) through a callback.
 */
#include <float.h>
#include <math.h>

#include "ml/ml.h"

#define C1 1e-4 /* sufficient decrease */
#define C2 0.9  /* curvature (strong Wolfe) */

/* The minimizer of the cubic that matches phi and phi' at a and b (N&W (3.59)); NaN when
 * the cubic has none. */
static double cubic_min(ml_ls_point a, ml_ls_point b) {
  double d1 = a.dphi + b.dphi - 3 * (a.phi - b.phi) / (a.step - b.step);
  double disc = d1 * d1 - a.dphi * b.dphi;
  if (!(disc >= 0)) return NAN;
  double d2 = copysign(sqrt(disc), b.step - a.step);
  double denom = b.dphi - a.dphi + 2 * d2;
  if (denom == 0) return NAN;
  return b.step - (b.step - a.step) * (b.dphi + d2 - d1) / denom;
}

static bool sufficient_decrease(ml_ls_point p0, ml_ls_point p) { return p.phi <= p0.phi + C1 * p.step * p0.dphi; }

static bool curvature(ml_ls_point p0, ml_ls_point p) { return fabs(p.dphi) <= -C2 * p0.dphi; }

/* Algorithm 3.6. lo has sufficient decrease and the lowest phi so far, and phi'(lo) points
 * towards hi, so an acceptable step lies between them. Trials come from the cubic through
 * both ends, kept 10% of the interval away from either end (else the midpoint); when hi
 * was not finite, from a tenth of the way to it, to get back into the domain quickly. */
static fl_status zoom(void *ctx, ml_ls_eval_fn eval, ml_ls_point p0, ml_ls_point lo, ml_ls_point hi, int *evals,
                      ml_ls_point *found) {
  while (*evals < ML_LS_MAX_EVALS) {
    double left = fmin(lo.step, hi.step), right = fmax(lo.step, hi.step), width = right - left;
    if (width <= DBL_EPSILON * right) break;
    double t;
    if (!isfinite(hi.phi)) {
      t = lo.step + 0.1 * (hi.step - lo.step);
    } else {
      t = cubic_min(lo, hi);
      if (!(t >= left + 0.1 * width && t <= right - 0.1 * width)) t = left + 0.5 * width;
    }
    ml_ls_point p;
    fl_status s = eval(ctx, t, &p);
    if (s != FL_OK) return s;
    ++*evals;
    if (!sufficient_decrease(p0, p) || p.phi >= lo.phi) {
      hi = p;
      continue;
    }
    if (curvature(p0, p)) {
      *found = p;
      return FL_OK;
    }
    if (p.dphi * (hi.step - lo.step) >= 0) hi = lo;
    lo = p;
  }
  found->step = 0;
  return FL_OK;
}

/* Algorithm 3.5: steps grow from `step` until one is acceptable or brackets acceptable
 * ones. */
fl_status ml_line_search_wolfe(void *ctx, ml_ls_eval_fn eval, double phi0, double dphi0, double step,
                               ml_ls_point *found) {
  ml_ls_point p0 = {0, phi0, dphi0}, prev = p0;
  int evals = 0;
  while (evals < ML_LS_MAX_EVALS) {
    ml_ls_point p;
    fl_status s = eval(ctx, step, &p);
    if (s != FL_OK) return s;
    evals++;
    if (!sufficient_decrease(p0, p) || (evals > 1 && p.phi >= prev.phi)) return zoom(ctx, eval, p0, prev, p, &evals, found);
    if (curvature(p0, p)) {
      *found = p;
      return FL_OK;
    }
    if (p.dphi >= 0) return zoom(ctx, eval, p0, p, prev, &evals, found);
    /* Still going down: extrapolate by the cubic, by 1.1 to 4 times the step. */
    double t = cubic_min(prev, p);
    if (!(t > step)) t = 4 * step;
    prev = p;
    step = fmin(fmax(t, 1.1 * step), 4 * step);
  }
  found->step = 0;
  return FL_OK;
}
