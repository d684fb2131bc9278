/*
 * sandblaster.c: Sandblaster L-BFGS (Dean et al., "Large Scale Distributed Deep Networks",
 * 2012): the optimizer's vectors live on parameter-server shards and its vector operations
 * run there; the coordinator holds scalars only.
 *
 * One dense table of n keys (the model's parameters, ml_glm's layout) and K = 7 + 2 (m + 1)
 * columns holds every vector: the current point W and its gradient G, a trial point XT and
 * its gradient GT, the direction D, the best trial of a line search (XB, GB), and m + 1
 * (s, y) pairs, m in memory and one free for the next candidate. Roles are column numbers
 * held here, so accepting a trial swaps numbers instead of copying vectors.
 *
 * The iteration is optimize.c's L-BFGS (the same two-loop recursion, strong Wolfe line
 * search, curvature check and restarts), with each vector operation a flint/ps.h column call
 * (dot, axpy, scale, copy, fill) issued by the coordinator, a worker of the table. Calls that
 * change columns are not waited for: a worker's calls reach each shard in order, so the next
 * dot, whose value the coordinator needs, sees them; pending tickets are waited together.
 *
 * Where the coordinator runs: the fit is one call, fl_service_call of the service
 * "ml.sandblaster" (registered when libflint_ml loads) on the evaluation job. In local mode it
 * runs in the caller's process; in cluster mode in the driver, which then runs every
 * evaluation's job itself, with no round trip to the client (DESIGN: "the fit is one call
 * from the client, driven by the driver"). The client makes the tables and the job, sends the
 * coordinator's settings and the tables' handles as the request, gets the history and the
 * column that holds the weights as the reply, and pulls the weights.
 *
 * A gradient evaluation at column X into column Gc: the coordinator zeroes Gc, writes (the
 * evaluation's number, X, Gc) into a small control table, then runs the one evaluation job
 * (fl_collect of it) over the cached row blocks, a task per partition
 * (ml_sandblaster_partition): the job never changes, so that the driver can run it again and
 * again. Task p reads the control table, pulls column X, computes its partial loss and
 * gradient sums (objective.c's fused kernel) and adds the gradient sums into Gc with
 * fl_ps_push_range_once(worker p, seq = the evaluation's number): a task run twice (a
 * speculative backup, a retry) pushes the same (worker, seq), which every shard applies
 * once. The task emits its loss and weight sums (16 bytes), which the coordinator adds up in
 * partition order; it then scales Gc by 1 / W and adds the L2 term on the shards.
 *
 * What crosses the network per evaluation: the column X to each task (4n bytes), each task's
 * gradient (4n bytes), 16 bytes per task back through the job, and per vector operation a
 * 104-byte request and a 64- or 72-byte answer per shard (docs/ps.md). The parameters leave
 * the servers only as the final weights, pulled once at the end.
 *
 * The vectors are float32 on the servers (sums in double): the fit ends a little less
 * exactly than optimize.c's double L-BFGS, by a line search that can no longer improve on
 * float steps when tol is tighter than that allows.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "flint/ps.h"
#include "ml/ml.h"

enum {
  PENDING_MAX = 64,  /* column calls in flight before the coordinator waits for them */
  HISTORY_FIRST = 16,
};
#define CURVATURE_EPS 1e-10

/* The roles; pairs start at column ROLES. */
enum { W, G, XT, GT, D, XB, GB, ROLES };

/* The control table: the evaluation's number (from 1), the column read and the one added to,
 * as floats (exact far beyond any fit's evaluations and columns). */
enum { CONTROL_SEQ, CONTROL_X, CONTROL_G, CONTROL_KEYS };

typedef struct sb_task_arg {
  uint32_t loss, cols, outputs, intercept;
  uint32_t handle_len, control_len;
  /* then handle_len bytes of the table's handle, control_len of the control table's */
} sb_task_arg;

/* The service's request: the coordinator's settings and the two handles after it. */
typedef struct sb_request {
  uint32_t version; /* SB_VERSION */
  uint32_t loss, cols, outputs, intercept, l2_in_sum_units;
  double l2, tol;
  uint32_t m, max_iterations, partitions, handle_len, control_len, pad;
} sb_request;
/* The reply: these, then num_history fl_ml_iteration rows. */
typedef struct sb_reply {
  uint32_t version, converged, w_col, num_history;
  uint64_t evaluations;
  double weight_sum;
} sb_reply;
#define SB_VERSION 1u

typedef struct sb {
  ml_glm *p;
  fl_dataset *job;  /* the evaluation job */
  fl_ps_worker *w;  /* the coordinator: worker `partitions` of the table */
  fl_ps_worker *cw; /* and of the control table */
  uint32_t partitions;
  uint64_t n, ncoef;
  uint32_t m, max_iterations;
  double tol;
  uint64_t evaluations;
  uint64_t pending[PENDING_MAX];
  uint32_t npending;

  uint32_t col[ROLES];
  /* pairs: ring[first .. first + count) are in memory, oldest first; spare is free */
  uint32_t *s_col, *y_col, *ring, spare, first, count;
  double *rho, *a, *yy;

  double smooth, grad_norm;
  double best, best_smooth, best_step;

  fl_ml_iteration *history;
  uint32_t num_history, history_cap;
  bool converged;
  double start;
} sb;

/* ---- column calls ---- */

static fl_status flush(sb *b) {
  fl_status first = FL_OK;
  for (uint32_t i = 0; i < b->npending; i++) {
    fl_status s = fl_ps_wait(b->w, b->pending[i], NULL);
    if (s != FL_OK && first == FL_OK) first = s;
  }
  b->npending = 0;
  return first;
}

/* Queues a changing call's ticket; waits for them all when the queue is full. */
static fl_status later(sb *b, fl_status issued, const uint64_t *ticket) {
  if (issued != FL_OK) {
    flush(b);
    return issued;
  }
  b->pending[b->npending++] = *ticket;
  return b->npending == PENDING_MAX ? flush(b) : FL_OK;
}

static fl_status axpy(sb *b, double alpha, uint32_t x, uint32_t y) {
  uint64_t t;
  return later(b, fl_ps_axpy(b->w, alpha, x, y, 0, FL_PS_TO_END, &t), &t);
}
static fl_status scale(sb *b, double alpha, uint32_t y) {
  uint64_t t;
  return later(b, fl_ps_scale(b->w, alpha, y, 0, FL_PS_TO_END, &t), &t);
}
static fl_status copy(sb *b, uint32_t x, uint32_t y) {
  uint64_t t;
  return later(b, fl_ps_copy(b->w, x, y, 0, FL_PS_TO_END, &t), &t);
}

/* Up to three dots over [lo, lo + count), waited together (with what is pending before). */
typedef struct dot_req {
  uint32_t x, y;
  double *out;
} dot_req;

static fl_status dots_range(sb *b, const dot_req *r, int k, uint64_t lo, uint64_t count) {
  uint64_t t[3];
  fl_status s = FL_OK;
  int issued = 0;
  for (; issued < k && s == FL_OK; issued++) {
    s = fl_ps_dot(b->w, r[issued].x, r[issued].y, lo, count, r[issued].out, &t[issued]);
    if (s != FL_OK) break;
  }
  fl_status f = flush(b);
  if (s == FL_OK) s = f;
  for (int i = 0; i < issued; i++) {
    fl_status e = fl_ps_wait(b->w, t[i], NULL);
    if (s == FL_OK) s = e;
  }
  return s;
}

static fl_status dots(sb *b, const dot_req *r, int k) { return dots_range(b, r, k, 0, FL_PS_TO_END); }

static fl_status dot1(sb *b, uint32_t x, uint32_t y, double *out) {
  dot_req r = {x, y, out};
  return dots(b, &r, 1);
}

static void swap_roles(sb *b, int r1, int r2) {
  uint32_t t = b->col[r1];
  b->col[r1] = b->col[r2];
  b->col[r2] = t;
}

/* ---- the gradient job ---- */

/* Workers kept open between a fit's evaluations, per process: opening one costs a thread and
 * a connection per shard and a round trip, several times a task's own work on small data.
 * A task takes the idle worker of its partition for its table's handle, or opens one, and
 * gives it back when it succeeds (a failed one is closed: its connections may be broken).
 * Workers of other handles (a table whose fit has ended) are closed when a task of another
 * table comes, so at most a fit's partitions stay open, idle, once it is done. */
enum { WORKER_CACHE = 64 };
typedef struct cached_worker {
  uint8_t *handle;
  size_t handle_len;
  uint32_t partition;
  bool busy;
  fl_ps_worker *w;
} cached_worker;
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cached_worker cache[WORKER_CACHE];

static bool same_handle(const cached_worker *c, fl_bytes h) {
  return c->handle && c->handle_len == h.len && memcmp(c->handle, h.data, h.len) == 0;
}

static void cache_drop(cached_worker *c) {
  fl_ps_worker_close(c->w);
  free(c->handle);
  *c = (cached_worker){0};
}

/* A fit's tasks use two tables (the vectors and the control): a worker of either is this
 * fit's (`sibling` is the other handle), and only other fits' idle workers are closed. */
static fl_status worker_take(fl_bytes h, fl_bytes sibling, uint32_t partition, fl_ps_worker **out) {
  fl_ps_worker *stale[WORKER_CACHE];
  int nstale = 0;
  *out = NULL;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < WORKER_CACHE; i++) {
    cached_worker *c = &cache[i];
    if (!c->handle || c->busy) continue;
    if (!same_handle(c, h) && !same_handle(c, sibling)) {
      stale[nstale++] = c->w; /* closed outside the lock: closing joins threads */
      c->w = NULL;
      cache_drop(c);
    } else if (same_handle(c, h) && c->partition == partition && !*out) {
      c->busy = true;
      *out = c->w;
    }
  }
  pthread_mutex_unlock(&cache_mu);
  for (int i = 0; i < nstale; i++) fl_ps_worker_close(stale[i]);
  return *out ? FL_OK : fl_ps_worker_open(h, partition, out);
}

/* Gives a worker back after a task: kept when ok (and there is room), else closed. */
static void worker_give(fl_bytes h, uint32_t partition, fl_ps_worker *w, bool ok) {
  if (!w) return;
  pthread_mutex_lock(&cache_mu);
  cached_worker *slot = NULL, *free_slot = NULL;
  for (int i = 0; i < WORKER_CACHE && !slot; i++) {
    if (cache[i].w == w) slot = &cache[i];
    else if (!cache[i].handle && !free_slot) free_slot = &cache[i];
  }
  if (slot && ok) {
    slot->busy = false;
    w = NULL;
  } else if (slot) {
    free(slot->handle);
    *slot = (cached_worker){0};
  } else if (ok && free_slot && (free_slot->handle = malloc(h.len ? h.len : 1))) {
    memcpy(free_slot->handle, h.data, h.len);
    free_slot->handle_len = h.len;
    free_slot->partition = partition;
    free_slot->w = w;
    w = NULL;
  }
  pthread_mutex_unlock(&cache_mu);
  fl_ps_worker_close(w);
}

FL_ML_KERNEL fl_status ml_sandblaster_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *varg) {
  sb_task_arg a;
  memcpy(&a, varg, sizeof a);
  const uint8_t *handle = (const uint8_t *)varg + sizeof a, *control = handle + a.handle_len;
  ml_glm p = {.loss = (ml_loss)a.loss, .cols = a.cols, .outputs = a.outputs, .intercept = a.intercept != 0};
  size_t n = (size_t)a.outputs * (a.cols + 1);
  fl_ps_worker *w = NULL;
  float *f = malloc(n * sizeof *f);
  double *x = malloc((2 * n + 2) * sizeof *x), *acc = x ? x + n : NULL;
  fl_status s = f && x ? FL_OK : fl_set_error(FL_ENOMEM, "out of memory");
  uint64_t t;
  fl_bytes h = fl_bytes_of(handle, a.handle_len), ch = fl_bytes_of(control, a.control_len);
  fl_ps_worker *cw = NULL;
  float ctl[CONTROL_KEYS];
  if (s == FL_OK) s = worker_take(ch, h, partition, &cw); /* which evaluation this is */
  if (s == FL_OK) s = fl_ps_pull_range(cw, 0, CONTROL_KEYS, ctl, &t);
  if (s == FL_OK) s = fl_ps_wait(cw, t, NULL);
  worker_give(ch, partition, cw, s == FL_OK);
  uint32_t ax = (uint32_t)ctl[CONTROL_X], ag = (uint32_t)ctl[CONTROL_G];
  uint64_t seq = (uint64_t)ctl[CONTROL_SEQ];
  if (s == FL_OK && seq == 0) s = fl_set_error(FL_ESTATE, "sandblaster: a task ran before its evaluation was set");
  if (s == FL_OK) s = worker_take(h, ch, partition, &w);
  if (s == FL_OK) s = fl_ps_pull_column(w, ax, 0, n, f, &t);
  if (s == FL_OK) s = fl_ps_wait(w, t, NULL);
  for (size_t i = 0; s == FL_OK && i < n; i++) x[i] = f[i];
  if (s == FL_OK) s = ml_glm_partition_sums(&p, partition, in, x, acc);
  for (size_t i = 0; s == FL_OK && i < n; i++) f[i] = (float)acc[2 + i];
  if (s == FL_OK) s = fl_ps_push_range_once(w, ag, 0, n, f, seq, &t);
  if (s == FL_OK) s = fl_ps_wait(w, t, NULL);
  worker_give(h, partition, w, s == FL_OK);
  if (s == FL_OK) s = fl_emit(out, acc, 2 * sizeof *acc);
  free(f);
  free(x);
  return s;
}

/* Loss and gradient at column x, the gradient into column g; *loss includes the L2 term. */
static fl_status evaluate(sb *b, uint32_t x, uint32_t g, double *loss) {
  ml_glm *p = b->p;
  uint64_t t;
  fl_status s = later(b, fl_ps_fill(b->w, 0, g, 0, FL_PS_TO_END, &t), &t);
  fl_status f = flush(b); /* the zeros are in before any task adds to them */
  if (s == FL_OK) s = f;
  if (s != FL_OK) return s;
  float ctl[CONTROL_KEYS] = {(float)++b->evaluations, (float)x, (float)g};
  s = fl_ps_set_range(b->cw, 0, CONTROL_KEYS, ctl, &t);
  if (s == FL_OK) s = fl_ps_wait(b->cw, t, NULL); /* set before any task reads it */
  fl_records *recs = NULL;
  double sums[2] = {0, 0};
  if (s == FL_OK) s = fl_collect(b->job, &recs);
  for (size_t i = 0; s == FL_OK && i < fl_records_count(recs); i++) { /* partition order: the same sums each time */
    fl_bytes r = fl_records_get(recs, i);
    double v[2];
    if (r.len != sizeof v) {
      s = fl_set_error(FL_EINTERNAL, "sandblaster: a task's sums of %zu bytes", r.len);
      break;
    }
    memcpy(v, r.data, sizeof v);
    sums[0] += v[0];
    sums[1] += v[1];
  }
  fl_records_free(recs);
  if (s == FL_OK && !(sums[1] > 0)) s = fl_set_error(FL_EEMPTY, "no rows (or only rows of weight 0) to fit");
  if (s != FL_OK) return s;
  double W = sums[1], reg = p->l2_in_sum_units ? p->l2 / W : p->l2, sq = 0;
  if ((s = scale(b, 1 / W, g)) != FL_OK) return s;
  if (reg > 0) {
    if ((s = later(b, fl_ps_axpy(b->w, reg, x, g, 0, b->ncoef, &t), &t)) != FL_OK) return s;
    if ((s = dots_range(b, &(dot_req){x, x, &sq}, 1, 0, b->ncoef)) != FL_OK) return s;
  }
  if (!p->intercept && (s = later(b, fl_ps_fill(b->w, 0, g, b->ncoef, b->n - b->ncoef, &t), &t)) != FL_OK) return s;
  *loss = sums[0] / W + 0.5 * reg * sq;
  p->evaluations++;
  p->weight_sum = W;
  return FL_OK;
}

/* ---- the iteration, as optimize.c's ---- */

static fl_status record(sb *b, double step, uint32_t evaluations) {
  if (b->num_history == b->history_cap) {
    uint32_t cap = b->history_cap ? 2 * b->history_cap : HISTORY_FIRST;
    fl_ml_iteration *h = realloc(b->history, cap * sizeof *h);
    if (!h) return fl_set_error(FL_ENOMEM, "sandblaster: no memory for %u history entries", cap);
    b->history = h;
    b->history_cap = cap;
  }
  fl_ml_iteration it = {.iteration = b->num_history + 1, .loss = b->smooth, .grad_norm = b->grad_norm,
                        .step = step, .evaluations = evaluations, .seconds = ml_now_s() - b->start};
  b->history[b->num_history++] = it;
  b->converged = b->grad_norm <= b->tol;
  return FL_OK; /* the caller reports the rows when the fit returns (the coordinator may be in the driver) */
}

/* Makes the trial (XT, GT) the current point. */
static fl_status take_trial(sb *b, double f) {
  swap_roles(b, W, XT);
  swap_roles(b, G, GT);
  b->smooth = f;
  double gg;
  fl_status s = dot1(b, b->col[G], b->col[G], &gg);
  b->grad_norm = sqrt(gg);
  return s;
}

static fl_status keep_if_best(sb *b, double loss, double step) {
  if (!(loss < b->best)) return FL_OK;
  b->best = loss;
  b->best_smooth = loss;
  b->best_step = step;
  fl_status s = copy(b, b->col[XT], b->col[XB]);
  if (s == FL_OK) s = copy(b, b->col[GT], b->col[GB]);
  return s;
}

/* D = -H G by the two-loop recursion over the pairs in memory. */
static fl_status two_loop(sb *b) {
  uint32_t d = b->col[D];
  fl_status s = copy(b, b->col[G], d);
  for (uint32_t j = b->count; s == FL_OK && j-- > 0;) { /* newest first */
    uint32_t k = b->ring[(b->first + j) % b->m];
    double sd;
    if ((s = dot1(b, b->s_col[k], d, &sd)) != FL_OK) break;
    b->a[k] = b->rho[k] * sd;
    s = axpy(b, -b->a[k], b->y_col[k], d);
  }
  if (s == FL_OK && b->count > 0) {
    uint32_t k = b->ring[(b->first + b->count - 1) % b->m];
    s = scale(b, 1 / (b->rho[k] * b->yy[k]), d); /* gamma = s'y / y'y */
  }
  for (uint32_t j = 0; s == FL_OK && j < b->count; j++) { /* oldest first */
    uint32_t k = b->ring[(b->first + j) % b->m];
    double yd;
    if ((s = dot1(b, b->y_col[k], d, &yd)) != FL_OK) break;
    s = axpy(b, b->a[k] - b->rho[k] * yd, b->s_col[k], d);
  }
  if (s == FL_OK) s = scale(b, -1, d);
  return s;
}

/* The pair (XT - W, GT - G) goes into the spare slot and, when its curvature can be
 * trusted, into memory (the oldest pair's slot becoming the spare when memory is full). */
static fl_status remember_pair(sb *b) {
  uint32_t k = b->spare, sc = b->s_col[k], yc = b->y_col[k];
  fl_status s = copy(b, b->col[XT], sc);
  if (s == FL_OK) s = axpy(b, -1, b->col[W], sc);
  if (s == FL_OK) s = copy(b, b->col[GT], yc);
  if (s == FL_OK) s = axpy(b, -1, b->col[G], yc);
  double sy, ss, yy;
  dot_req r[3] = {{sc, yc, &sy}, {sc, sc, &ss}, {yc, yc, &yy}};
  if (s == FL_OK) s = dots(b, r, 3);
  if (s != FL_OK || !(sy > CURVATURE_EPS * sqrt(ss) * sqrt(yy))) return s;
  b->rho[k] = 1 / sy;
  b->yy[k] = yy;
  if (b->count < b->m) {
    b->ring[(b->first + b->count) % b->m] = k;
    b->count++;
    b->spare = b->count < b->m ? b->count : b->m; /* slots fill in order; the last is spare */
  } else {
    b->spare = b->ring[b->first];
    b->ring[b->first] = k;
    b->first = (b->first + 1) % b->m;
  }
  return FL_OK;
}

/* XT = W + step D and its loss and gradient (ml_line_search_wolfe's callback). */
static fl_status ls_eval(void *ctx, double step, ml_ls_point *p) {
  sb *b = ctx;
  fl_status s = copy(b, b->col[W], b->col[XT]);
  if (s == FL_OK) s = axpy(b, step, b->col[D], b->col[XT]);
  double loss = 0, dphi = 0;
  if (s == FL_OK) s = evaluate(b, b->col[XT], b->col[GT], &loss);
  if (s == FL_OK) s = dot1(b, b->col[GT], b->col[D], &dphi);
  if (s != FL_OK) return s;
  *p = (ml_ls_point){step, loss, dphi};
  if (!isfinite(p->phi) || !isfinite(p->dphi)) p->phi = INFINITY;
  else s = keep_if_best(b, loss, step);
  return s;
}

static fl_status run(sb *b) {
  double loss;
  fl_status s = evaluate(b, b->col[XT], b->col[GT], &loss); /* XT holds the start (zeros) */
  if (s != FL_OK) return s;
  double gg;
  if ((s = dot1(b, b->col[GT], b->col[GT], &gg)) != FL_OK) return s;
  if (!isfinite(loss) || !isfinite(gg))
    return fl_set_error(FL_EINVAL, "sandblaster: objective is not finite at the start point (loss %g)", loss);
  if ((s = take_trial(b, loss)) != FL_OK) return s;
  b->converged = b->grad_norm <= b->tol;
  for (uint32_t k = 1; !b->converged && k <= b->max_iterations; k++) {
    if ((s = two_loop(b)) != FL_OK) return s;
    double dphi0, dd;
    dot_req r[2] = {{b->col[G], b->col[D], &dphi0}, {b->col[D], b->col[D], &dd}};
    if ((s = dots(b, r, 2)) != FL_OK) return s;
    if (!(dphi0 < 0)) { /* rounding broke H's definiteness: restart from steepest descent */
      b->count = 0;
      b->first = 0;
      b->spare = 0;
      if ((s = copy(b, b->col[G], b->col[D])) != FL_OK || (s = scale(b, -1, b->col[D])) != FL_OK) return s;
      dphi0 = -b->grad_norm * b->grad_norm;
      dd = -dphi0;
    }
    double step = b->count == 0 ? 1 / sqrt(dd) : 1;
    b->best = b->smooth;
    b->best_step = 0;
    ml_ls_point found;
    if ((s = ml_line_search_wolfe(b, ls_eval, b->smooth, dphi0, step, &found)) != FL_OK) return s;
    if (found.step == 0) { /* none acceptable: end at the best trial, which is in XB and GB */
      if (b->best_step == 0) return FL_OK;
      swap_roles(b, XT, XB);
      swap_roles(b, GT, GB);
      if ((s = take_trial(b, b->best_smooth)) != FL_OK) return s;
      return record(b, b->best_step, (uint32_t)b->evaluations);
    }
    /* an accepted step is always the search's last trial: in XT and GT */
    if ((s = remember_pair(b)) != FL_OK) return s;
    if ((s = take_trial(b, found.phi)) != FL_OK) return s;
    if ((s = record(b, found.step, (uint32_t)b->evaluations)) != FL_OK) return s;
  }
  return FL_OK;
}

/* ---- the service: the coordinator, where the scheduler is ---- */

static fl_status reply_put(sb *b, fl_buf *reply) {
  sb_reply r = {.version = SB_VERSION, .converged = b->converged, .w_col = b->col[W], .num_history = b->num_history,
                .evaluations = b->p->evaluations, .weight_sum = b->p->weight_sum};
  if (fl_buf_append(reply, &r, sizeof r) != FL_OK ||
      fl_buf_append(reply, b->history, (size_t)b->num_history * sizeof *b->history) != FL_OK)
    return fl_set_error(FL_ENOMEM, "out of memory");
  return FL_OK;
}

static fl_status sandblaster_service(fl_dataset *job, fl_bytes request, fl_buf *reply) {
  sb_request q;
  if (request.len < sizeof q) return fl_set_error(FL_EINVAL, "ml.sandblaster: a request of %zu bytes", request.len);
  memcpy(&q, request.data, sizeof q);
  if (q.version != SB_VERSION || request.len != sizeof q + (size_t)q.handle_len + q.control_len || q.m < 1 ||
      q.m > 1000 || q.partitions == 0 || q.partitions != fl_dataset_partitions(job))
    return fl_set_error(FL_EINVAL, "ml.sandblaster: a malformed request (another version, or another job)");
  ml_glm p = {.loss = (ml_loss)q.loss, .cols = q.cols, .outputs = q.outputs, .intercept = q.intercept != 0,
              .l2 = q.l2, .l2_in_sum_units = q.l2_in_sum_units != 0};
  sb b = {.p = &p, .job = job, .partitions = q.partitions, .m = q.m, .tol = q.tol, .max_iterations = q.max_iterations};
  b.n = (uint64_t)p.outputs * (p.cols + 1);
  b.ncoef = (uint64_t)p.outputs * p.cols;
  b.s_col = calloc(b.m + 1, sizeof *b.s_col);
  b.y_col = calloc(b.m + 1, sizeof *b.y_col);
  b.ring = calloc(b.m, sizeof *b.ring);
  b.rho = calloc(3 * (size_t)(b.m + 1), sizeof *b.rho);
  fl_status s = b.s_col && b.y_col && b.ring && b.rho ? FL_OK : fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    b.a = b.rho + b.m + 1;
    b.yy = b.a + b.m + 1;
    for (uint32_t r = 0; r < ROLES; r++) b.col[r] = r;
    for (uint32_t k = 0; k <= b.m; k++) b.s_col[k] = ROLES + 2 * k, b.y_col[k] = ROLES + 2 * k + 1;
    const uint8_t *h = request.data + sizeof q;
    s = fl_ps_worker_open(fl_bytes_of(h, q.handle_len), b.partitions, &b.w);
    if (s == FL_OK) s = fl_ps_worker_open(fl_bytes_of(h + q.handle_len, q.control_len), b.partitions, &b.cw);
  }
  b.start = ml_now_s();
  if (s == FL_OK) s = run(&b);
  fl_status f = flush(&b);
  if (s == FL_OK) s = f;
  if (s == FL_OK) s = reply_put(&b, reply);
  fl_ps_worker_close(b.w);
  fl_ps_worker_close(b.cw);
  free(b.history);
  free(b.s_col);
  free(b.y_col);
  free(b.ring);
  free(b.rho);
  return s;
}

__attribute__((constructor)) static void sandblaster_register(void) {
  fl_service_register("ml.sandblaster", sandblaster_service);
}

/* ---- the client's side: tables, the job, one call ---- */

fl_status ml_sandblaster_fit(ml_glm *p, const fl_ml_train_options *o, fl_ml_model *m) {
  fl_context *ctx = fl_dataset_context(p->data->blocks);
  uint64_t n = (uint64_t)p->outputs * (p->cols + 1);
  uint32_t hist = o->history ? o->history : 10, partitions = fl_dataset_partitions(p->data->blocks);
  if (hist > 1000) return fl_set_error(FL_EINVAL, "sandblaster: a history of %u pairs (at most 1000)", hist);
  if (partitions == 0) return fl_set_error(FL_EEMPTY, "sandblaster: the data has no partitions");
  fl_ps_options po = FL_PS_OPTIONS_INIT;
  po.keys = n;
  po.width = ROLES + 2 * (hist + 1);
  po.update = FL_PS_ADD;
  po.workers = partitions + 1;
  po.shards = n < 64 ? 1 : 0; /* small models on one shard: each call is one round trip */
  fl_ps_options co = FL_PS_OPTIONS_INIT;
  co.keys = CONTROL_KEYS;
  co.workers = partitions + 1;
  co.shards = 1;
  fl_ps_table *table = NULL, *control = NULL;
  fl_dataset *job = NULL;
  uint8_t *arg = NULL, *req = NULL;
  fl_buf reply = FL_BUF_INIT;
  fl_status s = fl_ps_table_create(ctx, &po, &table);
  if (s == FL_OK) s = fl_ps_table_create(ctx, &co, &control);
  fl_bytes h = fl_ps_table_handle(table), ch = fl_ps_table_handle(control);
  size_t arg_len = sizeof(sb_task_arg) + h.len + ch.len, req_len = sizeof(sb_request) + h.len + ch.len;
  if (s == FL_OK && (!(arg = calloc(1, arg_len)) || !(req = calloc(1, req_len))))
    s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    sb_task_arg a = {.loss = p->loss, .cols = p->cols, .outputs = p->outputs, .intercept = p->intercept,
                     .handle_len = (uint32_t)h.len, .control_len = (uint32_t)ch.len};
    memcpy(arg, &a, sizeof a);
    memcpy(arg + sizeof a, h.data, h.len);
    memcpy(arg + sizeof a + h.len, ch.data, ch.len);
    sb_request q = {.version = SB_VERSION, .loss = p->loss, .cols = p->cols, .outputs = p->outputs,
                    .intercept = p->intercept, .l2_in_sum_units = p->l2_in_sum_units, .l2 = p->l2,
                    .tol = o->tol ? o->tol : 1e-6, .m = hist, .max_iterations = o->max_iterations ? o->max_iterations : 100,
                    .partitions = partitions, .handle_len = (uint32_t)h.len, .control_len = (uint32_t)ch.len};
    memcpy(req, &q, sizeof q);
    memcpy(req + sizeof q, h.data, h.len);
    memcpy(req + sizeof q + h.len, ch.data, ch.len);
    s = fl_map_partitions(p->data->blocks, ml_sandblaster_partition, arg, arg_len, &job);
  }
  if (s == FL_OK) s = fl_service_call(job, "ml.sandblaster", fl_bytes_of(req, req_len), &reply);
  sb_reply r = {0};
  if (s == FL_OK) {
    if (reply.len >= sizeof r) memcpy(&r, reply.data, sizeof r);
    if (reply.len < sizeof r || r.version != SB_VERSION ||
        reply.len != sizeof r + (size_t)r.num_history * sizeof(fl_ml_iteration) || r.w_col >= po.width)
      s = fl_set_error(FL_EPROTO, "sandblaster: a malformed reply from the coordinator");
  }
  if (s == FL_OK) { /* the weights leave the servers once, at the end */
    fl_ps_worker *w = NULL;
    float *f = malloc(n * sizeof *f);
    uint64_t t;
    if (!f) s = fl_set_error(FL_ENOMEM, "out of memory");
    if (s == FL_OK) s = fl_ps_worker_open(h, partitions, &w);
    if (s == FL_OK) s = fl_ps_pull_column(w, r.w_col, 0, n, f, &t);
    if (s == FL_OK) s = fl_ps_wait(w, t, NULL);
    for (uint64_t i = 0; s == FL_OK && i < n; i++) m->coef[i] = f[i];
    fl_ps_worker_close(w);
    free(f);
  }
  if (s == FL_OK && r.num_history && !(m->history = malloc((size_t)r.num_history * sizeof *m->history)))
    s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    memcpy(m->history, reply.data + sizeof r, (size_t)r.num_history * sizeof *m->history);
    m->num_history = r.num_history;
    m->converged = r.converged != 0;
    p->evaluations = r.evaluations;
    p->weight_sum = r.weight_sum;
    /* Progress comes after the fit: the coordinator may have run in the driver. */
    for (uint32_t i = 0; o->progress && i < r.num_history; i++) {
      fl_status ps = o->progress(o->progress_arg, &m->history[i]);
      if (ps != FL_OK) break;
    }
  }
  fl_buf_free(&reply);
  fl_dataset_free(job);
  fl_ps_table_destroy(control);
  fl_ps_table_destroy(table);
  free(arg);
  free(req);
  return s;
}
