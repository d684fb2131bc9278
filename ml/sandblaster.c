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
 * A gradient evaluation at column X into column Gc: the coordinator zeroes Gc, then runs one
 * job over the cached row blocks, a task per partition (ml_sandblaster_partition). Task p
 * opens the table as worker p, pulls column X, computes its partial loss and gradient sums
 * (objective.c's fused kernel) and adds the gradient sums into Gc with
 * fl_ps_push_range_once(worker p, seq = the evaluation's number): a task run twice (a
 * speculative backup, a retry) pushes the same (worker, seq), which every shard applies
 * once. The task emits its loss and weight sums (16 bytes), which the job adds up; the
 * coordinator then scales Gc by 1 / W and adds the L2 term on the shards.
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

typedef struct sb_task_arg {
  uint32_t loss, cols, outputs, intercept;
  uint32_t x, g;      /* the columns read and added to */
  uint64_t seq;       /* the evaluation's number, from 1 */
  uint32_t handle_len;
  uint32_t pad;
  /* then handle_len bytes of the table's handle */
} sb_task_arg;

typedef struct sb {
  ml_glm *p;
  const fl_ml_train_options *o;
  fl_context *ctx;
  fl_ps_table *table;
  fl_ps_worker *w; /* the coordinator: worker `partitions` */
  uint32_t partitions;
  uint64_t n, ncoef;
  uint32_t m, max_iterations;
  double tol;
  uint8_t *task_arg; /* sb_task_arg and the handle */
  size_t task_arg_len;
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

static fl_status worker_take(fl_bytes h, uint32_t partition, fl_ps_worker **out) {
  fl_ps_worker *stale[WORKER_CACHE];
  int nstale = 0;
  *out = NULL;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < WORKER_CACHE; i++) {
    cached_worker *c = &cache[i];
    if (!c->handle || c->busy) continue;
    if (!same_handle(c, h)) {
      stale[nstale++] = c->w; /* closed outside the lock: closing joins threads */
      c->w = NULL;
      cache_drop(c);
    } else if (c->partition == partition && !*out) {
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
  const uint8_t *handle = (const uint8_t *)varg + sizeof a;
  ml_glm p = {.loss = (ml_loss)a.loss, .cols = a.cols, .outputs = a.outputs, .intercept = a.intercept != 0};
  size_t n = (size_t)a.outputs * (a.cols + 1);
  fl_ps_worker *w = NULL;
  float *f = malloc(n * sizeof *f);
  double *x = malloc((2 * n + 2) * sizeof *x), *acc = x ? x + n : NULL;
  fl_status s = f && x ? FL_OK : fl_set_error(FL_ENOMEM, "out of memory");
  uint64_t t;
  fl_bytes h = fl_bytes_of(handle, a.handle_len);
  if (s == FL_OK) s = worker_take(h, partition, &w);
  if (s == FL_OK) s = fl_ps_pull_column(w, a.x, 0, n, f, &t);
  if (s == FL_OK) s = fl_ps_wait(w, t, NULL);
  for (size_t i = 0; s == FL_OK && i < n; i++) x[i] = f[i];
  if (s == FL_OK) s = ml_glm_partition_sums(&p, partition, in, x, acc);
  for (size_t i = 0; s == FL_OK && i < n; i++) f[i] = (float)acc[2 + i];
  if (s == FL_OK) s = fl_ps_push_range_once(w, a.g, 0, n, f, a.seq, &t);
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
  sb_task_arg *a = (sb_task_arg *)b->task_arg;
  a->x = x;
  a->g = g;
  a->seq = ++b->evaluations;
  fl_dataset *parts = NULL;
  double sums[2];
  s = fl_map_partitions(p->data->blocks, ml_sandblaster_partition, b->task_arg, b->task_arg_len, &parts);
  if (s == FL_OK) s = ml_sum_partitions(parts, 2, p->tree_depth, sums);
  fl_dataset_free(parts);
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
  return b->o->progress ? b->o->progress(b->o->progress_arg, &it) : FL_OK;
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

/* ---- set-up ---- */

fl_status ml_sandblaster_fit(ml_glm *p, const fl_ml_train_options *o, fl_ml_model *m) {
  sb b = {.p = p, .o = o, .ctx = fl_dataset_context(p->data->blocks)};
  b.n = (uint64_t)p->outputs * (p->cols + 1);
  b.ncoef = (uint64_t)p->outputs * p->cols;
  b.m = o->history ? o->history : 10;
  b.tol = o->tol ? o->tol : 1e-6;
  b.max_iterations = o->max_iterations ? o->max_iterations : 100;
  b.partitions = fl_dataset_partitions(p->data->blocks);
  if (b.m > 1000) return fl_set_error(FL_EINVAL, "sandblaster: a history of %u pairs (at most 1000)", b.m);
  if (b.partitions == 0) return fl_set_error(FL_EEMPTY, "sandblaster: the data has no partitions");
  uint32_t width = ROLES + 2 * (b.m + 1);
  fl_ps_options po = FL_PS_OPTIONS_INIT;
  po.keys = b.n;
  po.width = width;
  po.update = FL_PS_ADD;
  po.workers = b.partitions + 1;
  po.shards = b.n < 64 ? 1 : 0; /* small models on one shard: each call is one round trip */
  fl_status s = fl_ps_table_create(b.ctx, &po, &b.table);
  if (s != FL_OK) return s;
  fl_bytes h = fl_ps_table_handle(b.table);
  b.task_arg_len = sizeof(sb_task_arg) + h.len;
  b.task_arg = calloc(1, b.task_arg_len);
  b.s_col = calloc(b.m + 1, sizeof *b.s_col);
  b.y_col = calloc(b.m + 1, sizeof *b.y_col);
  b.ring = calloc(b.m, sizeof *b.ring);
  b.rho = calloc(3 * (size_t)(b.m + 1), sizeof *b.rho);
  if (!b.task_arg || !b.s_col || !b.y_col || !b.ring || !b.rho) s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) {
    b.a = b.rho + b.m + 1;
    b.yy = b.a + b.m + 1;
    sb_task_arg a = {.loss = p->loss, .cols = p->cols, .outputs = p->outputs, .intercept = p->intercept,
                     .handle_len = (uint32_t)h.len};
    memcpy(b.task_arg, &a, sizeof a);
    memcpy(b.task_arg + sizeof a, h.data, h.len);
    for (uint32_t r = 0; r < ROLES; r++) b.col[r] = r;
    for (uint32_t k = 0; k <= b.m; k++) b.s_col[k] = ROLES + 2 * k, b.y_col[k] = ROLES + 2 * k + 1;
    b.spare = 0;
    s = fl_ps_worker_open(h, b.partitions, &b.w);
  }
  b.start = ml_now_s();
  if (s == FL_OK) s = run(&b);
  if (s == FL_OK) { /* the weights leave the servers once, at the end */
    float *f = malloc(b.n * sizeof *f);
    uint64_t t;
    if (!f) s = fl_set_error(FL_ENOMEM, "out of memory");
    if (s == FL_OK) s = fl_ps_pull_column(b.w, b.col[W], 0, b.n, f, &t);
    if (s == FL_OK) s = fl_ps_wait(b.w, t, NULL);
    for (uint64_t i = 0; s == FL_OK && i < b.n; i++) m->coef[i] = f[i];
    free(f);
  }
  flush(&b);
  if (s == FL_OK) {
    m->history = b.history;
    m->num_history = b.num_history;
    m->converged = b.converged;
    b.history = NULL;
  }
  fl_ps_worker_close(b.w);
  fl_ps_table_destroy(b.table);
  free(b.history);
  free(b.task_arg);
  free(b.s_col);
  free(b.y_col);
  free(b.ring);
  free(b.rho);
  return s;
}
