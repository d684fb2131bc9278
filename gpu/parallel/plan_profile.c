/*
 * gpu/parallel/plan_profile.c: the automatic plan's profile (see gpu/parallel/plan_profile.h
 * for what is measured and how the times are made one rank's compute).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/device/device.h"
#include "gpu/parallel/plan_profile.h"

#define PROFILE_REPEATS 3
#define CORES_TEST_REPEATS 10 /* long enough (tens of ms) that a moment's load does not decide it */
#define PROFILE_TIMEOUT_MS 30000
#define PROFILE_MAX_RANKS 1024

/* The cores test's start: threads wait until all have arrived, or until the gate is opened
 * (a thread that could not be started never arrives). */
typedef struct start_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived, needed;
  bool open;
} start_gate;

static void gate_wait(start_gate *g) {
  pthread_mutex_lock(&g->mu);
  if (++g->arrived >= g->needed) {
    g->open = true;
    pthread_cond_broadcast(&g->cv);
  }
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(start_gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* What the threads of one tensor-parallel degree share. */
typedef struct prof_group {
  fl_device_kind kind;
  const tfm_spec *spec;
  const optim_options *optim;
  int size, k;   /* t ranks; index k of the degree in the profile */
  int nrows;
  const int *rows; /* increasing */
  const char **addrs;
  fl_comm_endpoint **eps;
  plan_profile *out; /* rank 0 writes its measurements here */
  double wall[PLAN_MAX_ROWS][2]; /* scratch of rank 0: [rows][fwd, bwd] per unit */
  comm_cost_params *calibrated; /* rank 0's communicator's (owned by the group's caller) */
  bool calibrate_only;
  /* The cores test: every thread times one block at the largest size at once, no
   * communicator; per_op[r] is thread r's mean time of a forward and backward. */
  bool cores_test;
  start_gate start;
  double per_op[PROFILE_MAX_RANKS];
} prof_group;

typedef struct prof_rank {
  prof_group *g;
  int rank;
  fl_status status;
  char msg[384];
} prof_rank;

static double median3(const double *v) {
  return fmax(fmin(v[0], v[1]), fmin(fmax(v[0], v[1]), v[2]));
}

/* Seconds of the allreduces a unit's forward (or backward) makes at t ranks and `rows`. */
static double unit_comm(const plan_profile *pr, const plan_unit *u, int t, double rows) {
  if (t < 2 || !u->tp_allreduces) return 0;
  return u->tp_allreduces * comm_cost_predict_allreduce(pr->comm, t, (size_t)(rows * u->out_row_bytes));
}

/* The compute in a measured wall time that includes allreduces predicted at `comm`: the
 * rest, but never less than a tenth of the wall. A prediction that leaves nothing is too
 * high (a loaded machine's calibration, small messages), and a unit's math is never free:
 * with nothing left, the fit lost the unit's whole cost and the plan took it for free. */
static double compute_of(double wall, double comm) {
  return fmax(0.1 * wall, wall - comm);
}

/* Line through (lo, a) and (hi, b), kept >= 0 in both terms. */
static plan_cost fit(double lo, double a, double hi, double b) {
  if (hi <= lo) return (plan_cost){0, a / lo};
  double row = fmax(0, (b - a) / (hi - lo));
  return (plan_cost){fmax(0, a - lo * row), row};
}

/* The cores test on this thread (dev NULL: it could not open one): one block's forward and
 * backward at the largest size, the threads starting together. Every thread arrives at the
 * start, even one that failed to get ready, so that the others never wait for it forever. */
static fl_status time_together(prof_rank *me, fl_device *dev) {
  prof_group *g = me->g;
  const tfm_spec *sp = g->spec;
  fl_status status = FL_OK;
  fl_tensor x = {0}, dy = {0};
  tfm_chunk *c = NULL;
  const fl_tensor *y, *dx;
  tfm_batch b = {0};
  int rows = g->rows[g->nrows - 1];
  int64_t shape[3] = {rows, sp->seq, sp->hidden};
  if (!dev) status = fl_set_error(FL_EDEVICE, "the cores test has no device");
  if (status == FL_OK) status = tfm_chunk_create(dev, sp, 1, 2, NULL, 0, 1, &c);
  if (status == FL_OK) status = tensor_ensure(&x, dev, 3, shape);
  if (status == FL_OK) status = dev->ops->fill(dev, x.numel, 0.5f, x.data);
  if (status == FL_OK) status = tensor_ensure(&dy, dev, 3, shape);
  if (status == FL_OK) status = dev->ops->fill(dev, dy.numel, 1e-3f, dy.data);
  if (status == FL_OK) status = tfm_chunk_forward(c, 0, &x, &b, true, &y); /* warm-up */
  if (status == FL_OK) status = tfm_chunk_backward(c, 0, &dy, &dx);
  gate_wait(&g->start);
  FL_CHECK(status);
  uint64_t t0 = common_now_ns();
  for (int r = 0; r < CORES_TEST_REPEATS; r++) {
    FL_CHECK(tfm_chunk_forward(c, 0, &x, &b, true, &y));
    FL_CHECK(tfm_chunk_backward(c, 0, &dy, &dx));
  }
  FL_CHECK(dev->ops->synchronize(dev));
  g->per_op[me->rank] = (double)(common_now_ns() - t0) * 1e-9 / CORES_TEST_REPEATS;
cleanup:
  tfm_chunk_destroy(c);
  tensor_release(&x);
  tensor_release(&dy);
  return status;
}

/* One unit on this rank: forward and backward at every size, rank 0 keeping the medians. */
static fl_status time_unit(prof_rank *me, fl_device *dev, fl_comm *comm, int u) {
  prof_group *g = me->g;
  const tfm_spec *sp = g->spec;
  fl_status status = FL_OK;
  fl_tensor x = {0}, dy = {0};
  tfm_chunk *c = NULL;
  optim *opt = NULL;
  plan_unit *pu = &g->out->unit[u];
  FL_CHECK(tfm_chunk_create(dev, sp, u, u + 1, comm, me->rank, g->size, &c));
  for (int ri = 0; ri < g->nrows; ri++) {
    int rows = g->rows[ri];
    int64_t shape[3] = {rows, sp->seq, u == 0 ? sp->features : sp->hidden};
    FL_CHECK(tensor_ensure(&x, dev, 3, shape));
    FL_CHECK(dev->ops->fill(dev, x.numel, 0.5f, x.data));
    double fwd[PROFILE_REPEATS], bwd[PROFILE_REPEATS];
    size_t act = 0, out_numel = 0;
    /* One untimed round first: slots, workspaces and caches are made on first use. */
    for (int r = -1; r < PROFILE_REPEATS; r++) {
      tfm_batch b = {.row0 = 0, .step = (uint64_t)(r + 1)};
      const fl_tensor *y, *dx;
      uint64_t t0 = common_now_ns();
      FL_CHECK(tfm_chunk_forward(c, 0, &x, &b, true, &y));
      FL_CHECK(dev->ops->synchronize(dev));
      uint64_t t1 = common_now_ns();
      act = tfm_chunk_activation_bytes(c);
      out_numel = y->numel;
      FL_CHECK(tensor_ensure(&dy, dev, y->ndim, y->shape));
      FL_CHECK(dev->ops->fill(dev, dy.numel, 1e-3f, dy.data));
      FL_CHECK(tfm_chunk_backward(c, 0, &dy, u == 0 ? NULL : &dx));
      FL_CHECK(dev->ops->synchronize(dev));
      uint64_t t2 = common_now_ns();
      if (r >= 0) {
        fwd[r] = (double)(t1 - t0) * 1e-9;
        bwd[r] = (double)(t2 - t1) * 1e-9;
      }
    }
    if (me->rank == 0) {
      g->wall[ri][0] = median3(fwd);
      g->wall[ri][1] = median3(bwd);
      if (ri == g->nrows - 1) {
        pu->act_row_bytes[g->k] = (double)act / rows;
        pu->param_bytes[g->k] = (double)tfm_chunk_values(c)->numel * sizeof(float);
        if (g->k == 0) pu->out_row_bytes = (double)out_numel * sizeof(float) / rows;
      }
    }
  }
  if (me->rank == 0) {
    pu->tp_allreduces = u >= 1 && u <= sp->blocks ? 2 : 0; /* attention's out and fc2 (g; f backward) */
    /* Take the allreduces off and the sharing of cores by the group's threads. */
    double cores = g->out->cores_measured > 0 ? g->out->cores_measured : g->out->cores;
    double share = cores > 0 && g->size > cores ? cores / g->size : 1;
    for (int ri = 0; ri < g->nrows; ri++) {
      double comm = unit_comm(g->out, pu, g->size, g->rows[ri]);
      pu->fwd_at[g->k][ri] = compute_of(g->wall[ri][0], comm) * share;
      pu->bwd_at[g->k][ri] = compute_of(g->wall[ri][1], comm) * share;
    }
    int last = g->nrows - 1;
    pu->fwd[g->k] = fit(g->rows[0], pu->fwd_at[g->k][0], g->rows[last], pu->fwd_at[g->k][last]);
    pu->bwd[g->k] = fit(g->rows[0], pu->bwd_at[g->k][0], g->rows[last], pu->bwd_at[g->k][last]);
    if (g->k == 0) {
      /* The optimizer's step over this unit's parameters, per byte (added up over units). */
      optim_param one = {0, tfm_chunk_values(c)->numel, false};
      FL_CHECK(optim_create(dev, g->optim, tfm_chunk_values(c)->numel, &one, 1, &opt));
      double t[PROFILE_REPEATS];
      for (int r = 0; r < PROFILE_REPEATS; r++) {
        uint64_t t0 = common_now_ns();
        FL_CHECK(optim_step(opt, 1e-6f, tfm_chunk_grads(c), tfm_chunk_values(c)));
        FL_CHECK(dev->ops->synchronize(dev));
        t[r] = (double)(common_now_ns() - t0) * 1e-9;
      }
      g->out->optimizer_s_per_byte += median3(t); /* divided by the bytes at the end */
    }
  }
cleanup:
  optim_destroy(opt);
  tfm_chunk_destroy(c);
  tensor_release(&x);
  tensor_release(&dy);
  return status;
}

static void *prof_main(void *arg) {
  prof_rank *me = arg;
  prof_group *g = me->g;
  fl_status status = FL_OK;
  fl_comm *comm = NULL;
  fl_device *dev = NULL;
  if (g->size > 1 && !g->cores_test) {
    fl_comm_endpoint *ep = g->eps[me->rank];
    g->eps[me->rank] = NULL; /* taken by create, even on failure */
    FL_CHECK(fl_comm_host_create(ep, me->rank, g->size, g->addrs, PROFILE_TIMEOUT_MS, &comm));
    if (me->rank == 0 && g->calibrate_only && !(g->calibrated = comm_cost_params_of(comm)))
      FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for the cost model"));
  }
  if (g->calibrate_only) goto cleanup;
  if (g->cores_test) {
    fl_status opened = fl_device_open(g->kind, 0, &dev);
    status = time_together(me, opened == FL_OK ? dev : NULL);
    if (opened != FL_OK) status = opened;
    goto cleanup;
  }
  FL_CHECK(fl_device_open(g->kind, 0, &dev));
  for (int u = 0; u < tfm_units(g->spec); u++) FL_CHECK(time_unit(me, dev, comm, u));
cleanup:
  me->status = status;
  snprintf(me->msg, sizeof me->msg, "%s", status ? fl_last_error() : "");
  fl_device_close(dev);
  fl_comm_destroy(comm);
  return NULL;
}

/* Runs a group of `size` threads (calibrate_only: form the communicator and stop). */
static fl_status run_group(prof_group *g) {
  int n = g->size;
  fl_status status = FL_OK;
  char (*addr)[96] = common_calloc((size_t)n, sizeof *addr);
  const char **addrs = common_calloc((size_t)n, sizeof *addrs);
  fl_comm_endpoint **eps = common_calloc((size_t)n, sizeof *eps);
  prof_rank *ranks = common_calloc((size_t)n, sizeof *ranks);
  pthread_t *th = common_calloc((size_t)n, sizeof *th);
  int started = 0;
  if (!addr || !addrs || !eps || !ranks || !th) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for %d profiling ranks", n));
  for (int r = 0; n > 1 && !g->cores_test && r < n; r++) {
    FL_CHECK(fl_comm_listen("127.0.0.1", &eps[r]));
    snprintf(addr[r], sizeof addr[r], "%s", fl_comm_endpoint_address(eps[r]));
    addrs[r] = addr[r];
  }
  g->addrs = addrs;
  g->eps = eps;
  for (; started < n; started++) {
    ranks[started] = (prof_rank){.g = g, .rank = started};
    if (pthread_create(&th[started], NULL, prof_main, &ranks[started]) != 0) {
      status = FL_ERR(FL_EINTERNAL, "cannot start profiling thread %d of %d", started, n);
      /* The started ones time out waiting for the rest and end with an error; the cores
       * test's wait for them at its start. */
      gate_open(&g->start);
      break;
    }
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < started && status == FL_OK; r++)
    if (ranks[r].status != FL_OK)
      status = fl_set_error(ranks[r].status, "profiling rank %d of %d: %s", r, n, ranks[r].msg);
cleanup:
  for (int r = 0; eps && r < n; r++) fl_comm_endpoint_destroy(eps[r]);
  common_free(th);
  common_free(ranks);
  common_free(eps);
  common_free(addrs);
  common_free(addr);
  return status;
}

/* One rank's forward and backward of every unit at tp 1 and `rows` samples, by the profile. */
static double model_compute(const plan_profile *pr, int rows) {
  double s = 0;
  for (int u = 0; u < pr->units; u++) {
    const plan_unit *un = &pr->unit[u];
    int i = 0;
    while (i < pr->nrows && pr->rows[i] != rows) i++;
    s += i < pr->nrows ? un->fwd_at[0][i] + un->bwd_at[0][i]
                       : un->fwd[0].fixed_s + un->bwd[0].fixed_s + rows * (un->fwd[0].row_s + un->bwd[0].row_s);
  }
  return s;
}

/* The median step (compute_gradients + apply) of a one-rank trainer of the whole model with
 * m micro-batches of `rows` samples, after a warm-up step. */
static fl_status time_trainer(fl_device *dev, fl_comm *one, const tfm_spec *spec, const optim_options *o, int m,
                              int rows, const float *x, const int32_t *y, double *out) {
  int bounds[2] = {0, tfm_units(spec)};
  pp_options po = {.spec = *spec, .grid = {1, 1, 1}, .schedule = PP_1F1B, .microbatches = m, .chunks = 1,
                   .bounds = bounds, .optim = *o};
  pp_trainer *t = NULL;
  fl_status status = FL_OK;
  double secs[PROFILE_REPEATS];
  FL_CHECK(pp_trainer_create(dev, one, &po, &t));
  for (int r = -1; r < PROFILE_REPEATS; r++) {
    pp_step_stats st;
    uint64_t t0 = common_now_ns();
    FL_CHECK(pp_trainer_compute_gradients(t, x, y, m * rows, (uint64_t)(r + 1), &st));
    FL_CHECK(pp_trainer_apply(t, 1e-6f, &st));
    if (r >= 0) secs[r] = (double)(common_now_ns() - t0) * 1e-9;
  }
  *out = median3(secs);
cleanup:
  pp_trainer_destroy(t);
  return status;
}

/* The runtime's own cost of a micro-batch (its slots, input copies, the loss), beyond the
 * units' compute: a one-rank trainer's step with one micro-batch of the largest size and with
 * many of the smallest, less the profile's compute of each, per extra micro-batch. */
static fl_status measure_microbatch(plan_profile *pr, fl_device_kind kind, const tfm_spec *spec,
                                    const optim_options *o) {
  int big = pr->rows[pr->nrows - 1], m = big / pr->rows[0];
  while (m > 1 && big % m) m--;
  if (m < 2) return FL_OK;
  fl_status status = FL_OK;
  fl_device *dev = NULL;
  fl_comm_endpoint *ep = NULL;
  fl_comm *one = NULL;
  size_t n = (size_t)big * spec->seq * spec->features;
  float *x = common_malloc(n * sizeof *x);
  int32_t *y = common_malloc((size_t)big * sizeof *y);
  if (!x || !y) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for the profile's batch"));
  for (size_t i = 0; i < n; i++) x[i] = (float)(i % 13) / 13.0f - 0.5f;
  for (int i = 0; i < big; i++) y[i] = i % spec->classes;
  FL_CHECK(fl_device_open(kind, 0, &dev));
  FL_CHECK(fl_comm_listen("127.0.0.1", &ep));
  {
    const char *addr[1] = {fl_comm_endpoint_address(ep)};
    char copy[96];
    snprintf(copy, sizeof copy, "%s", addr[0]);
    addr[0] = copy;
    fl_comm_endpoint *taken = ep;
    ep = NULL; /* taken by create, even on failure */
    FL_CHECK(fl_comm_host_create(taken, 0, 1, addr, PROFILE_TIMEOUT_MS, &one));
  }
  double whole, split;
  FL_CHECK(time_trainer(dev, one, spec, o, 1, big, x, y, &whole));
  FL_CHECK(time_trainer(dev, one, spec, o, m, big / m, x, y, &split));
  double extra = (split - m * model_compute(pr, big / m)) - (whole - model_compute(pr, big));
  pr->microbatch_s = fmax(0, extra / (m - 1));
cleanup:
  fl_comm_destroy(one);
  fl_comm_endpoint_destroy(ep);
  fl_device_close(dev);
  common_free(x);
  common_free(y);
  return status;
}

void plan_profile_free(plan_profile *pr) {
  if (!pr) return;
  common_free(pr->unit);
  common_free(pr->comm);
  pr->unit = NULL;
  pr->comm = NULL;
}

fl_status plan_profile_measure(fl_device_kind kind, const tfm_spec *spec, const optim_options *o, int world,
                               const int *rows, int nrows, plan_profile *out) {
  if (!spec || !o || !out) return fl_set_error(FL_EINVAL, "plan_profile_measure: NULL argument");
  if (world < 1 || world > PROFILE_MAX_RANKS)
    return fl_set_error(FL_EINVAL, "plan profile: world of %d ranks (1 to %d)", world, PROFILE_MAX_RANKS);
  if (!rows || nrows < 1 || nrows > PLAN_MAX_ROWS)
    return fl_set_error(FL_EINVAL, "plan profile: %d micro-batch sizes (1 to %d)", nrows, PLAN_MAX_ROWS);
  for (int i = 0; i < nrows; i++)
    if (rows[i] < 1 || (i > 0 && rows[i] <= rows[i - 1]))
      return fl_set_error(FL_EINVAL, "plan profile: micro-batch sizes must be >= 1 and increasing (%d at %d)",
                          rows[i], i);
  fl_status status = tfm_spec_check(spec, 1);
  if (status != FL_OK) return status;
  plan_profile pr = {.world = world, .nrows = nrows, .units = tfm_units(spec), .state_copies = 1.0 + (double)optim_state_slots(o->kind)};
  if (kind == FL_DEVICE_CPU) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    pr.cores = n > 0 ? (int)n : 1;
  }
  if (!(pr.comm = comm_cost_params_of(NULL))) return FL_ERR(FL_ENOMEM, "out of memory for the cost model");
  memcpy(pr.rows, rows, (size_t)nrows * sizeof *rows);
  pr.unit = common_calloc((size_t)pr.units, sizeof *pr.unit);
  if (!pr.unit) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for a profile of %d units", pr.units));
  for (int t = 1; t <= world && pr.ntp < PLAN_MAX_TPS; t++)
    if (world % t == 0 && tfm_spec_check(spec, t) == FL_OK) pr.tp[pr.ntp++] = t;
  /* The calibration first: the tensor-parallel groups' times lose their allreduces by it. */
  if (world > 1) {
    prof_group cal = {.kind = kind, .spec = spec, .optim = o, .size = world, .out = &pr, .calibrate_only = true};
    status = run_group(&cal);
    if (cal.calibrated) {
      common_free(pr.comm);
      pr.comm = cal.calibrated;
    }
    FL_CHECK(status);
  }
  /* The cores the ranks really get (the host's, less what else runs on it): the same block
   * timed by one thread and by `world` threads at once. */
  if (pr.cores > 0 && world > 1) {
    double alone = 0, together = 0;
    for (int pass = 0; pass < 2; pass++) {
      int size = pass == 0 ? 1 : world;
      prof_group g = {.kind = kind, .spec = spec, .optim = o, .size = size, .nrows = nrows, .rows = rows, .out = &pr,
                      .cores_test = true,
                      .start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, size, false}};
      FL_CHECK(run_group(&g));
      double mean = 0;
      for (int r = 0; r < size; r++) mean += g.per_op[r] / size;
      *(pass == 0 ? &alone : &together) = mean;
    }
    double effective = together > 0 ? world * alone / together : pr.cores;
    pr.cores_measured = fmax(1.0, fmin(effective, (double)pr.cores));
  }
  for (int k = 0; k < pr.ntp; k++) {
    prof_group g = {.kind = kind, .spec = spec, .optim = o, .size = pr.tp[k], .k = k, .nrows = nrows, .rows = rows,
                    .out = &pr};
    FL_CHECK(run_group(&g));
  }
  FL_CHECK(measure_microbatch(&pr, kind, spec, o));
  double bytes = 0;
  for (int u = 0; u < pr.units; u++) bytes += pr.unit[u].param_bytes[0];
  pr.optimizer_s_per_byte = bytes > 0 ? pr.optimizer_s_per_byte / bytes : 0;
  *out = pr;
  return FL_OK;
cleanup:
  plan_profile_free(&pr);
  return status;
}

static double allreduce_model(void *user, int ranks, double bytes) {
  const plan_profile *pr = user;
  return bytes > 0 ? comm_cost_predict_allreduce(pr->comm, ranks, (size_t)bytes) : 0;
}

/* A stage's message: one message's latency and its bytes at the same-host link's rate. */
static double send_model(void *user, double bytes) {
  const plan_profile *pr = user;
  return bytes > 0 ? comm_cost_predict_message(pr->comm, (size_t)bytes) : 0;
}

void plan_profile_problem(const plan_profile *pr, plan_problem *p) {
  p->units = pr->units;
  p->unit = pr->unit;
  p->ntp = pr->ntp;
  p->nrows = pr->nrows;
  memcpy(p->rows, pr->rows, sizeof p->rows);
  memcpy(p->tp, pr->tp, sizeof p->tp);
  p->state_copies = pr->state_copies;
  p->optimizer_s_per_byte = pr->optimizer_s_per_byte;
  p->cores = pr->cores_measured > 0 ? pr->cores_measured : pr->cores;
  p->allreduce_s = allreduce_model;
  p->send_s = send_model;
  p->user = (void *)pr;
  p->step_fixed_s = 3 * allreduce_model((void *)pr, pr->world, 2 * sizeof(float));
  p->microbatch_s = pr->microbatch_s;
}
