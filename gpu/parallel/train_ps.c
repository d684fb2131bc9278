/*
 * gpu/parallel/train_ps.c: --sync asp and ssp:S, data-parallel training through the
 * parameter servers of flint/ps.h, as Downpour SGD (Dean et al., NIPS 2012) trains, with Ho
 * et al.'s stale synchronous parallel between its workers.
 *
 * Design. The client (train_ps_run) makes ONE dense table of the model's flat weights
 * (TABLE_WIDTH floats a key; replicated in a cluster) and sets it to the seeded model's
 * weights. The
 * workers are ordinary tasks, one per partition of the cached training/test pair (a
 * map_partitions, not a barrier stage): a lost worker's task is retried alone while the
 * others go on. Each worker reads its partition and, every step:
 *   1. pulls the weights every ps_fetch steps (Downpour's n_fetch) into its model;
 *   2. runs forward, loss and backward on its batch (batch / workers images);
 *   3. adds the step's gradient into what it will push: sgd pushes -lr(step) x g / workers
 *      (the table's update is add, so the rate schedule applies and the servers sum the
 *      workers' steps), adagrad and adam push g (the servers' own updates, at a fixed rate);
 *      weight decay is L2 in g (not on the no-decay group), as the optimizers' rule;
 *   4. pushes every ps_push steps (Downpour's n_push), then ends its clock.
 * Pulls wait on the servers' clocks: never (asp), or until the slowest worker is within S
 * steps (ssp:S). ssp:0 is synchronous SGD exactly: a worker's step is two clocks, one after
 * its pull and one after its push, and it pushes only once every worker has pulled (a pull of
 * one key at the odd clock waits for that), so every pull of step c sees all the pushes of
 * the steps before c and none of step c's; with sgd and momentum 0 that is --sync bsp's step,
 * up to the order of float additions.
 * After each of its epochs a worker pulls the servers' weights, evaluates its share of the
 * test set on them and emits a record (its training sums, the test sums, its bytes pushed and
 * pulled, the most steps a pull was behind); the client sums the records of each epoch into
 * the row the other modes report (test loss and accuracy over every share: under asp and
 * ssp each share is evaluated on the weights as its worker ended the epoch) and, at the end,
 * pulls the table once more for the final checkpoint.
 * Retries: a worker opened again resumes at the clock the servers have for it: it goes on
 * from that step (skipping the epoch's batches before it). Its lost attempt's unpushed
 * gradients (at most ps_push - 1 steps) are not redone, a step whose push was acknowledged
 * but whose clock was not is trained again (its gradient applied twice), and the epochs its
 * lost attempt ended miss that worker's share in their rows (the attempt's records went with
 * it). Under ssp the others wait in their pulls (up to FLINT_PS_TIMEOUT_MS) until it catches
 * up; every worker must run at once, so the client asks for as many task slots as workers.
 * A worker done with its steps retires, so that workers with more batches are not held back.
 * Models with batch norm are refused: its running statistics are each worker's own, and
 * the servers hold the weights only.
 *
 * Threading: a worker is one task thread with its own device, model and ps worker.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "flint/ps.h"
#include "gpu/data/data.h"
#include "gpu/parallel/train_rank.h"

#define PS_RECORD_MAGIC 0x52545350u /* "PSTR" */
/* Floats a key of the weights' table: the servers handle a key at a time, and keys of one
 * float cost a call and a lookup per weight (3x the bytes' time on the MLP). The last key is
 * padded with zeros, which no gradient moves. */
#define TABLE_WIDTH 256u

static uint64_t table_keys(size_t n) { return (n + TABLE_WIDTH - 1) / TABLE_WIDTH; }

/* A worker's record, one per epoch it ended (REPORT_EPOCH), or one REPORT_DIVERGED. */
typedef struct ps_record {
  uint32_t magic, kind;
  uint32_t worker, epoch; /* epoch: 1-based */
  uint32_t resumed;       /* this attempt opened at a clock past 0 (a retried task) */
  uint32_t pad;
  uint64_t step;          /* the worker's steps so far */
  uint64_t bytes;         /* sent + received by this attempt so far */
  uint64_t max_staleness; /* this epoch's, in steps */
  double loss_sum, correct, images, test_loss_sum, test_correct, test_images, lr, seconds;
  double loss;            /* REPORT_DIVERGED: the step's loss */
} ps_record;

static double wall_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the worker ------------------------------------------------------------------------------ */

typedef struct worker_state {
  const train_arg *a;
  uint32_t id;
  fl_device *dev;
  nn_model *model;
  data_reader *train, *test;
  fl_tensor *x;
  int32_t *labels_d;
  float *stats_d;  /* device, 2: loss sum and correct */
  float *images_h; /* host, batch images */
  int32_t *labels_h;
  uint32_t batch;
  fl_ps_worker *ps;
  size_t n;            /* weights */
  uint64_t keys;       /* the table's: n padded to TABLE_WIDTH */
  float *weights;      /* the last pull (keys x TABLE_WIDTH) */
  float *grads;        /* one step's gradient */
  float *acc;          /* what the next push carries */
  float *decay;        /* each weight's decay coefficient (NULL: no weight decay) */
  uint32_t per_step;   /* clocks a step: 2 under ssp:0 (see the top), else 1 */
  uint64_t max_staleness;
} worker_state;

static int sample_ndim(const train_arg *a) {
  return a->model == NN_LIBRARY && a->sample_ndim >= 1 && a->sample_ndim <= 3 ? (int)a->sample_ndim : 3;
}

/* The host batch to the device: x becomes [n, sample shape]. */
static fl_status worker_upload(worker_state *w, uint32_t n) {
  const train_arg *a = w->a;
  int ndim = sample_ndim(a);
  int64_t shape[4] = {n, a->channels, a->height, a->width};
  shape[3 - ndim] = n;
  fl_status s = tensor_ensure(w->x, w->dev, ndim + 1, shape + 3 - ndim);
  if (s == FL_OK) s = fl_tensor_write(w->x, w->images_h, fl_tensor_numel(w->x));
  if (s == FL_OK) s = w->dev->ops->from_host(w->dev, w->labels_d, w->labels_h, (size_t)n * sizeof(int32_t));
  return s;
}

/* Waits for the call that returned `s` with *ticket (read after the call: a pointer, as C
 * evaluates arguments in no set order). */
static fl_status worker_wait(worker_state *w, fl_status s, const uint64_t *ticket, uint64_t *fresh) {
  return s == FL_OK ? fl_ps_wait(w->ps, *ticket, fresh) : s;
}

/* The servers' weights into the model, noting how many steps behind the pulling worker's
 * clock they may be. */
static fl_status worker_pull(worker_state *w) {
  uint64_t t = 0, fresh = 0, clock = fl_ps_worker_stats_get(w->ps).clock;
  fl_status s = worker_wait(w, fl_ps_pull_range(w->ps, 0, w->keys, w->weights, &t), &t, &fresh);
  if (s != FL_OK) return s;
  uint64_t behind = clock > fresh ? (clock - fresh) / w->per_step : 0;
  if (behind > w->max_staleness) w->max_staleness = behind;
  return fl_tensor_write(nn_model_values(w->model), w->weights, w->n);
}

static fl_status worker_clock(worker_state *w) {
  uint64_t t = 0;
  return worker_wait(w, fl_ps_clock(w->ps, &t), &t, NULL);
}

/* ssp:0's second half of a step: a pull of one key at the odd clock returns once every
 * worker has pulled this step's weights, so that no push reaches a pull of the same step. */
static fl_status worker_gate(worker_state *w) {
  uint64_t t = 0;
  float one[TABLE_WIDTH];
  return worker_wait(w, fl_ps_pull_range(w->ps, 0, 1, one, &t), &t, NULL);
}

/* Pushes what was accumulated (when `push`) and ends the step's clock. The two go out
 * together: each shard's channel sends its parts in order, so a shard applies the push
 * before it counts the clock. */
static fl_status worker_push_clock(worker_state *w, bool push) {
  uint64_t tp = 0, tc = 0;
  fl_status s = push ? fl_ps_push_range(w->ps, 0, w->keys, w->acc, &tp) : FL_OK;
  fl_status sc = s == FL_OK ? fl_ps_clock(w->ps, &tc) : s;
  if (push && s == FL_OK) s = fl_ps_wait(w->ps, tp, NULL);
  if (sc == FL_OK) {
    fl_status s2 = fl_ps_wait(w->ps, tc, NULL);
    if (s == FL_OK) s = s2;
  } else if (s == FL_OK) {
    s = sc;
  }
  if (push) memset(w->acc, 0, w->n * sizeof(float));
  return s;
}

/* The worker's test share on the weights it last pulled: sums of loss and correct, images. */
static fl_status worker_evaluate(worker_state *w, uint32_t epoch, double sums[3]) {
  fl_status status = FL_OK;
  data_reader_start_epoch(w->test, w->a->seed, epoch, false, 0, true);
  FL_CHECK(w->dev->ops->memset0(w->dev, w->stats_d, 2 * sizeof(float)));
  uint64_t images = 0;
  uint32_t n;
  while ((n = data_reader_next(w->test, w->images_h, w->labels_h)) > 0) {
    const fl_tensor *logits;
    FL_CHECK(worker_upload(w, n));
    FL_CHECK(nn_model_forward(w->model, w->x, false, &logits));
    FL_CHECK(nn_model_loss(w->model, w->labels_d, 0.0f, w->stats_d));
    images += n;
  }
  float st[2];
  FL_CHECK(w->dev->ops->to_host(w->dev, st, w->stats_d, sizeof st));
  sums[0] = st[0];
  sums[1] = st[1];
  sums[2] = (double)images;
cleanup:
  return status;
}

/* Weight decay as the optimizers apply it: L2 on the decay group's weights. */
static fl_status worker_decay_table(worker_state *w) {
  const optim_options *o = &w->a->optim;
  if (o->weight_decay == 0) return FL_OK;
  w->decay = common_calloc(w->n, sizeof(float));
  if (!w->decay) return fl_set_error(FL_ENOMEM, "worker %u: out of memory", w->id);
  for (size_t i = 0; i < nn_model_param_count(w->model); i++) {
    optim_param p = optim_param_of(nn_model_param(w->model, i), o);
    for (size_t j = 0; !p.no_decay && j < p.count && p.offset + j < w->n; j++) w->decay[p.offset + j] = o->weight_decay;
  }
  return FL_OK;
}

static fl_status worker_setup(worker_state *w, fl_iter *in) {
  const train_arg *a = w->a;
  fl_status status = FL_OK;
  w->batch = a->batch / a->ranks;
  FL_CHECK(data_reader_create(w->batch, &w->train));
  FL_CHECK(data_reader_create(w->batch, &w->test));
  bool prefetch = config_bool(CONFIG_TRAIN_PREFETCH);
  data_reader_set_prefetch(w->train, prefetch);
  data_reader_set_prefetch(w->test, prefetch);
  if (a->augment) FL_CHECK(data_reader_set_transform(w->train, &a->aug, a->classes));
  FL_CHECK(data_reader_add_all(in, w->train, w->test));
  if (data_reader_images(w->train) &&
      (data_reader_channels(w->train) != a->channels || data_reader_height(w->train) != a->height ||
       data_reader_width(w->train) != a->width || data_reader_classes(w->train) != a->classes)) {
    status = fl_set_error(FL_ECORRUPT, "worker %u: its images are %ux%ux%u of %u classes, the run's %ux%ux%u of %u",
                          w->id, data_reader_channels(w->train), data_reader_height(w->train),
                          data_reader_width(w->train), data_reader_classes(w->train), a->channels, a->height,
                          a->width, a->classes);
    goto cleanup;
  }
  int ordinal = 0;
  if (a->device == FL_DEVICE_CUDA) {
    int gpus = fl_cuda_device_count();
    ordinal = gpus > 0 ? (int)(w->id % (uint32_t)gpus) : 0;
  }
  FL_CHECK(fl_device_open(a->device, ordinal, &w->dev));
  FL_CHECK(fl_device_set_precision(w->dev, a->precision));
  FL_CHECK(train_model_build(a, w->dev, &w->model));
  w->n = fl_tensor_numel(nn_model_values(w->model));
  w->keys = table_keys(w->n);
  int ndim = sample_ndim(a);
  int64_t xshape[4] = {w->batch, a->channels, a->height, a->width};
  xshape[3 - ndim] = w->batch;
  FL_CHECK(fl_tensor_create(w->dev, ndim + 1, xshape + 3 - ndim, &w->x));
  size_t per = data_reader_image_floats(w->train) ? data_reader_image_floats(w->train)
                                                  : (size_t)a->channels * a->height * a->width;
  FL_CHECK(w->dev->ops->alloc(w->dev, w->batch * sizeof(int32_t), (void **)&w->labels_d));
  FL_CHECK(w->dev->ops->alloc(w->dev, 2 * sizeof(float), (void **)&w->stats_d));
  FL_CHECK(w->dev->ops->host_alloc(w->dev, (size_t)w->batch * per * sizeof(float), (void **)&w->images_h));
  FL_CHECK(w->dev->ops->host_alloc(w->dev, w->batch * sizeof(int32_t), (void **)&w->labels_h));
  w->weights = common_calloc(w->keys * TABLE_WIDTH, sizeof(float));
  w->grads = common_calloc(w->n, sizeof(float));
  w->acc = common_calloc(w->keys * TABLE_WIDTH, sizeof(float));
  if (!w->weights || !w->grads || !w->acc) {
    status = fl_set_error(FL_ENOMEM, "worker %u: out of memory for %zu weights", w->id, w->n);
    goto cleanup;
  }
  FL_CHECK(worker_decay_table(w));
  FL_CHECK(fl_ps_worker_open(fl_bytes_of(a->ps_handle, a->ps_handle_len), w->id, &w->ps));
  fl_ps_worker_set_staleness(w->ps, a->sync == GPU_TRAIN_SYNC_ASP ? FL_PS_ASYNC : a->staleness);
  w->per_step = a->sync == GPU_TRAIN_SYNC_SSP && a->staleness == 0 ? 2 : 1;
cleanup:
  return status;
}

static void worker_free(worker_state *w) {
  fl_ps_worker_close(w->ps);
  fl_device *dev = w->dev;
  if (dev) {
    if (w->images_h) dev->ops->host_free(dev, w->images_h);
    if (w->labels_h) dev->ops->host_free(dev, w->labels_h);
    if (w->labels_d) dev->ops->free(dev, w->labels_d);
    if (w->stats_d) dev->ops->free(dev, w->stats_d);
  }
  common_free(w->weights);
  common_free(w->grads);
  common_free(w->acc);
  common_free(w->decay);
  fl_tensor_destroy(w->x);
  nn_model_destroy(w->model);
  fl_device_close(dev);
  data_reader_destroy(w->train);
  data_reader_destroy(w->test);
}

/* FLINT_TRAIN_PS_FAIL=K:S (test only): the step at which worker `id`'s first attempt fails,
 * or UINT64_MAX. */
static uint64_t fail_step_of(uint32_t id) {
  const char *v = config_string(CONFIG_TRAIN_PS_FAIL);
  unsigned k;
  unsigned long long step;
  char extra;
  if (!v || !*v || strcmp(v, "none") == 0) return UINT64_MAX;
  if (sscanf(v, "%u:%llu%c", &k, &step, &extra) != 2) {
    common_log(LOG_WARN, "FLINT_TRAIN_PS_FAIL=%s is not K:S: ignored", v);
    return UINT64_MAX;
  }
  return k == id ? (uint64_t)step : UINT64_MAX;
}

FL_API fl_status gpu_train_ps_worker(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  train_arg a;
  memcpy(&a, arg, sizeof a);
  worker_state w = {.a = &a, .id = partition};
  fl_status status = FL_OK;
  FL_CHECK(worker_setup(&w, in));
  const uint64_t steps = data_reader_batches(w.train, false);
  if (steps == 0) {
    status = fl_set_error(FL_EINVAL, "worker %u has fewer than %u training images (batch %u over %u workers): make "
                          "--batch smaller or the data larger", w.id, w.batch, a.batch, a.ranks);
    goto cleanup;
  }
  const uint32_t fetch = a.ps_fetch ? a.ps_fetch : 1, push = a.ps_push ? a.ps_push : 1;
  const bool sgd = a.optim.kind == OPTIM_SGD;
  const uint64_t total = steps * a.epochs;
  /* A retried task goes on at the servers' clock for this worker (see the top). */
  const uint64_t clock0 = fl_ps_worker_stats_get(w.ps).clock;
  const uint64_t first = clock0 / w.per_step;
  bool half_done = clock0 % w.per_step != 0; /* ssp:0: the lost attempt pulled step `first` and clocked */
  const uint64_t fail_at = clock0 == 0 ? fail_step_of(w.id) : UINT64_MAX;
  uint32_t pending = 0;
  double sums[2] = {0, 0}, lr = 0;
  uint64_t images = 0;
  for (uint64_t g = first; g < total; g++) {
    const uint32_t epoch = (uint32_t)(g / steps);
    const uint64_t i = g % steps;
    if (g == first || i == 0) {
      data_reader_start_epoch(w.train, a.seed, epoch, a.shuffle, steps, false);
      FL_CHECK(w.dev->ops->memset0(w.dev, w.stats_d, 2 * sizeof(float)));
      for (uint64_t skip = 0; skip < i; skip++) data_reader_next(w.train, w.images_h, w.labels_h);
      images = 0;
      sums[0] = sums[1] = 0;
      w.max_staleness = 0;
    }
    if (g == fail_at) {
      status = fl_set_error(FL_EPEER, "worker %u: stopped at step %llu by FLINT_TRAIN_PS_FAIL (test only)", w.id,
                            (unsigned long long)g);
      goto cleanup;
    }
    uint32_t n = data_reader_next(w.train, w.images_h, w.labels_h);
    if (n != w.batch) {
      FL_CHECK(data_reader_status(w.train));
      status = fl_set_error(FL_EINTERNAL, "worker %u: step %llu got %u images, not %u", w.id, (unsigned long long)g,
                            n, w.batch);
      goto cleanup;
    }
    if ((g - first) % fetch == 0 || half_done) FL_CHECK(worker_pull(&w));
    if (w.per_step == 2 && !half_done) FL_CHECK(worker_clock(&w));
    half_done = false;
    const fl_tensor *logits;
    FL_CHECK(worker_upload(&w, n));
    FL_CHECK(nn_model_zero_grad(w.model));
    fl_model_set_step(w.model, g * a.ranks + w.id);
    FL_CHECK(nn_model_forward(w.model, w.x, true, &logits));
    FL_CHECK(nn_model_loss_smoothed(w.model, w.labels_d, a.label_smoothing, 1.0f / (float)n, w.stats_d));
    FL_CHECK(nn_model_backward(w.model, NULL, NULL));
    float st[2];
    FL_CHECK(w.dev->ops->to_host(w.dev, st, w.stats_d, sizeof st));
    lr = optim_lr_at(&a.schedule, epoch + (double)i / (double)steps);
    if (!isfinite(st[0])) {
      /* Its gradient is not pushed: the servers' weights stay finite, and the client fails the
       * run naming the earliest such step of any worker. */
      ps_record rec = {.magic = PS_RECORD_MAGIC, .kind = REPORT_DIVERGED, .worker = w.id, .epoch = epoch + 1,
                       .step = g + 1, .loss = ((double)st[0] - sums[0]) / n, .lr = lr};
      FL_CHECK(fl_emit(out, &rec, sizeof rec));
      uint64_t t = 0;
      FL_CHECK(worker_wait(&w, fl_ps_retire(w.ps, &t), &t, NULL));
      goto cleanup;
    }
    sums[0] = st[0];
    sums[1] = st[1];
    if (a.clip_grad_norm > 0) FL_CHECK(optim_clip_grad_norm(nn_model_grads(w.model), a.clip_grad_norm, NULL));
    FL_CHECK(fl_tensor_read(nn_model_grads(w.model), w.grads, w.n));
    /* sgd: the servers add each worker's share of the step; adagrad, adam: they step on g. */
    const float scale = sgd ? -(float)lr / (float)a.ranks : 1.0f;
    if (w.decay)
      for (size_t j = 0; j < w.n; j++) w.acc[j] += scale * (w.grads[j] + w.decay[j] * w.weights[j]);
    else
      for (size_t j = 0; j < w.n; j++) w.acc[j] += scale * w.grads[j];
    bool pushing = ++pending >= push || g + 1 == total;
    if (pushing) {
      if (w.per_step == 2) FL_CHECK(worker_gate(&w));
      pending = 0;
    }
    FL_CHECK(worker_push_clock(&w, pushing));
    images += n;
    if (i + 1 == steps) {
      double test[3];
      FL_CHECK(worker_pull(&w));
      FL_CHECK(worker_evaluate(&w, epoch, test));
      fl_ps_worker_stats ps = fl_ps_worker_stats_get(w.ps);
      ps_record rec = {.magic = PS_RECORD_MAGIC, .kind = REPORT_EPOCH, .worker = w.id, .epoch = epoch + 1,
                       .resumed = clock0 > 0, .step = g + 1, .bytes = ps.bytes_sent + ps.bytes_received,
                       .max_staleness = w.max_staleness, .loss_sum = sums[0], .correct = sums[1],
                       .images = (double)images, .test_loss_sum = test[0], .test_correct = test[1],
                       .test_images = test[2], .lr = lr, .seconds = wall_now_s() - a.wall_t0};
      FL_CHECK(fl_emit(out, &rec, sizeof rec));
    }
  }
  /* Done: the others' pulls no longer wait for this worker. */
  uint64_t t = 0;
  FL_CHECK(worker_wait(&w, fl_ps_retire(w.ps, &t), &t, NULL));
cleanup:
  worker_free(&w);
  return status;
}

/* ---- the client ------------------------------------------------------------------------------ */

/* The servers' update for the run's optimizer (the options' check allowed only these). */
static void table_options(const gpu_train_options *o, const train_arg *a, size_t n, fl_ps_options *po) {
  *po = (fl_ps_options)FL_PS_OPTIONS_INIT;
  po->keys = table_keys(n);
  po->width = TABLE_WIDTH;
  po->workers = a->ranks;
  po->lr = (float)optim_schedule_peak_lr(&a->schedule);
  po->beta1 = o->optim.beta1;
  po->beta2 = o->optim.beta2;
  po->eps = o->optim.eps;
  po->update = o->optim.kind == OPTIM_ADAGRAD ? FL_PS_ADAGRAD : o->optim.kind == OPTIM_ADAM ? FL_PS_ADAM : FL_PS_ADD;
}

/* Reads or writes the whole table through a worker of the client's own (worker 0's id: the
 * tasks are not running then; its clock is not advanced, and its pulls never wait). */
static fl_status table_access(fl_ps_table *t, float *values, uint64_t keys, bool set) {
  fl_ps_worker *w = NULL;
  uint64_t ticket = 0;
  fl_status s = fl_ps_worker_open(fl_ps_table_handle(t), 0, &w);
  if (s == FL_OK) fl_ps_worker_set_staleness(w, FL_PS_ASYNC);
  if (s == FL_OK)
    s = set ? fl_ps_set_range(w, 0, keys, values, &ticket) : fl_ps_pull_range(w, 0, keys, values, &ticket);
  if (s == FL_OK) s = fl_ps_wait(w, ticket, NULL);
  fl_ps_worker_close(w);
  return s;
}

/* An epoch's sums over the workers' records of it. */
typedef struct epoch_sums {
  double loss, correct, images, test_loss, test_correct, test_images, lr, seconds;
  uint64_t bytes, step, max_staleness;
  uint32_t records;
} epoch_sums;

/* The workers' records as the rows of each epoch, handed to on_row in order, and the run's
 * summary; *last: the last row, or the earliest divergence. */
static fl_status collect_rows(const train_arg *a, fl_records *recs, void (*on_row)(uint32_t, fl_bytes, void *),
                              void *user, train_report *last, train_ps_summary *sum) {
  epoch_sums *es = common_calloc(a->epochs, sizeof *es);
  uint8_t *resumed = common_calloc(a->ranks, 1);
  fl_status status = FL_OK;
  if (!es || !resumed) {
    status = fl_set_error(FL_ENOMEM, "gpu_train: out of memory for the workers' rows");
    goto cleanup;
  }
  ps_record bad = {0};
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    fl_bytes b = fl_records_get(recs, i);
    ps_record r;
    if (b.len != sizeof r) {
      status = fl_set_error(FL_EPROTO, "gpu_train: a worker's record of %zu bytes, not %zu", b.len, sizeof r);
      goto cleanup;
    }
    memcpy(&r, b.data, sizeof r);
    if (r.magic != PS_RECORD_MAGIC || r.epoch < 1 || r.epoch > a->epochs || r.worker >= a->ranks) {
      status = fl_set_error(FL_EPROTO, "gpu_train: a malformed worker record (worker %u, epoch %u)", r.worker, r.epoch);
      goto cleanup;
    }
    if (r.kind == REPORT_DIVERGED) {
      if (!bad.step || r.step < bad.step) bad = r;
      continue;
    }
    if (r.resumed) resumed[r.worker] = 1;
    epoch_sums *e = &es[r.epoch - 1];
    e->loss += r.loss_sum;
    e->correct += r.correct;
    e->images += r.images;
    e->test_loss += r.test_loss_sum;
    e->test_correct += r.test_correct;
    e->test_images += r.test_images;
    e->bytes += r.bytes;
    e->records++;
    e->lr = r.lr;
    if (r.seconds > e->seconds) e->seconds = r.seconds;
    if (r.step > e->step) e->step = r.step;
    if (r.max_staleness > e->max_staleness) e->max_staleness = r.max_staleness;
  }
  for (uint32_t w = 0; w < a->ranks; w++) sum->resumed_workers += resumed[w];
  if (bad.step) {
    *last = (train_report){.kind = REPORT_DIVERGED, .epoch = bad.epoch, .epochs = a->epochs, .step = bad.step,
                           .loss = bad.loss, .lr = bad.lr, .pid = (int64_t)getpid()};
    goto cleanup;
  }
  double before = 0;
  for (uint32_t i = 0; i < a->epochs; i++) {
    const epoch_sums *e = &es[i];
    if (e->records == 0) continue; /* no worker's record of it survived (see the top) */
    train_report row = {.kind = REPORT_EPOCH, .epoch = i + 1, .epochs = a->epochs, .step = e->step,
                        .steps_per_epoch = e->step / (i + 1), .done = e->step / (i + 1),
                        .loss = e->images > 0 ? e->loss / e->images : NAN,
                        .acc = e->images > 0 ? e->correct / e->images : NAN,
                        .test_loss = e->test_images > 0 ? e->test_loss / e->test_images : NAN,
                        .test_acc = e->test_images > 0 ? e->test_correct / e->test_images : NAN, .lr = e->lr,
                        .images_per_s = e->seconds > before ? e->images / (e->seconds - before) : 0,
                        .seconds = e->seconds - before, .pid = (int64_t)getpid(),
                        .reduced_bytes = e->bytes / e->records,
                        .max_staleness = e->max_staleness};
    before = e->seconds;
    if (e->max_staleness > sum->max_staleness) sum->max_staleness = e->max_staleness;
    on_row(0, fl_bytes_of(&row, sizeof row), user);
    *last = row;
  }
cleanup:
  common_free(resumed);
  common_free(es);
  return status;
}

/* The fewest steps the servers' clocks hold for a worker: every step of every worker's data
 * was trained when it is the run's steps (a retried worker's too). */
static fl_status steps_of_workers(fl_ps_table *t, const train_arg *a, train_ps_summary *sum) {
  uint32_t per_step = a->sync == GPU_TRAIN_SYNC_SSP && a->staleness == 0 ? 2 : 1;
  sum->worker_steps_min = UINT64_MAX;
  for (uint32_t i = 0; i < a->ranks; i++) {
    fl_ps_worker *w = NULL;
    fl_status s = fl_ps_worker_open(fl_ps_table_handle(t), i, &w);
    if (s != FL_OK) return s;
    uint64_t steps = fl_ps_worker_stats_get(w).clock / per_step;
    if (steps < sum->worker_steps_min) sum->worker_steps_min = steps;
    fl_ps_worker_close(w);
  }
  return FL_OK;
}

fl_status train_ps_run(fl_context *ctx, const gpu_train_options *o, train_arg *a, fl_dataset *pair, nn_model *model,
                       void (*on_row)(uint32_t rank, fl_bytes row, void *user), void *user, train_report *last,
                       fl_buf *checkpoint, train_ps_summary *sum) {
  const char *mode = o->sync == GPU_TRAIN_SYNC_ASP ? "asp" : "ssp";
  fl_status status = FL_OK;
  fl_ps_table *table = NULL;
  fl_dataset *trained = NULL;
  fl_records *recs = NULL;
  float *weights = NULL;
  *last = (train_report){0};
  *sum = (train_ps_summary){0};
  size_t buffers = nn_model_buffers(model) ? fl_tensor_numel(nn_model_buffers(model)) : 0;
  if (buffers)
    return fl_set_error(FL_EINVAL, "--sync %s: the model has %zu batch-norm statistics, which each worker would keep "
                        "for itself while the servers hold only the weights: use a model without batch norm (mlp, or "
                        "your own), or --sync bsp, local or adacomm", mode, buffers);
  /* ssp's workers wait for each other: they must all run at once (asp's too, to compare). */
  if (fl_context_cores(ctx) < a->ranks)
    return fl_set_error(FL_ESLOTS, "--sync %s: %u workers need %u task slots at once, and the context has %u: give "
                        "fewer --ranks or a larger --master", mode, a->ranks, a->ranks, fl_context_cores(ctx));
  size_t n = fl_tensor_numel(nn_model_values(model));
  weights = common_calloc(table_keys(n) * TABLE_WIDTH, sizeof(float));
  if (!weights) return fl_set_error(FL_ENOMEM, "gpu_train: out of memory for %zu weights", n);
  FL_CHECK(fl_tensor_read(nn_model_values(model), weights, n));
  fl_ps_options po;
  table_options(o, a, n, &po);
  po.replicate = !fl_context_is_local(ctx);
  FL_CHECK(fl_ps_table_create(ctx, &po, &table));
  fl_bytes handle = fl_ps_table_handle(table);
  if (handle.len > sizeof a->ps_handle) {
    status = fl_set_error(FL_EINTERNAL, "gpu_train: a table handle of %zu bytes (at most %zu)", handle.len,
                          sizeof a->ps_handle);
    goto cleanup;
  }
  memcpy(a->ps_handle, handle.data, handle.len);
  a->ps_handle_len = (uint32_t)handle.len;
  a->staleness = o->staleness;
  a->ps_fetch = o->ps_fetch ? o->ps_fetch : 1;
  a->ps_push = o->ps_push ? o->ps_push : 1;
  FL_CHECK(table_access(table, weights, table_keys(n), true));
  a->wall_t0 = wall_now_s();
  FL_CHECK(fl_map_partitions(pair, gpu_train_ps_worker, a, sizeof *a, &trained));
  FL_CHECK(fl_collect(trained, &recs));
  FL_CHECK(collect_rows(a, recs, on_row, user, last, sum));
  FL_CHECK(steps_of_workers(table, a, sum));
  if (last->kind == REPORT_EPOCH && a->emit_checkpoint) {
    FL_CHECK(table_access(table, weights, table_keys(n), false));
    FL_CHECK(fl_tensor_write(nn_model_values(model), weights, n));
    checkpoint_state cs = {.epoch = last->epoch, .step = last->step, .position = last->epoch, .lr = last->lr};
    FL_CHECK(checkpoint_encode(nn_model_values(model), NULL, NULL, &cs, checkpoint));
  }
cleanup:
  fl_records_free(recs);
  fl_dataset_free(trained);
  fl_ps_table_destroy(table);
  common_free(weights);
  return status;
}
