/*
 * gpu/parallel/train_dp.c: synchronous data-parallel training, the ranks of the barrier stage that
 * gpu/parallel/train.h describes (gpu_train_rank; the client is gpu/parallel/train_client.c).
 *
 * Design. The client loads the training and test sets as one cached dataset with a
 * partition per rank (data_pair) and runs a barrier stage over it; everything else happens in
 * the ranks (gpu_train_rank):
 *   1. read the partition into two host readers (train, test);
 *   2. open the device, build the model from the shared seed (identical weights everywhere),
 *      make the optimizer, bootstrap the communicator through fl_barrier_all_gather
 *      (host: every rank's listen address; NCCL: rank 0's unique id; cuda ranks take NCCL
 *      unless two of them share a GPU, which NCCL refuses, or FLINT_TRAIN_COMM=host);
 *   3. agree on the steps per epoch (the smallest rank's full batches), so that every rank
 *      calls the same collectives in the same order;
 *   4. on a retried attempt, restore the last checkpoint the stage put; else, with --resume,
 *      the checkpoint file's blob (a broadcast the client made);
 *   5. per epoch: steps of forward, loss, backward with buckets allreduced (averaged) as
 *      backward reports their gradients final, clipping when asked, one optimizer step; then evaluation on every rank's
 *      test share with the sums allreduced; rank 0 puts a checkpoint and reports the row.
 *      With accumulation (train_arg.accumulate K > 1) a step's batch goes through forward
 *      and backward as K micro-batches adding into the gradients, and only the last
 *      backward hands out buckets: one allreduce per step, as without it;
 *   6. a non-finite loss stops every rank at the same step (1 rank: that step; several: the
 *      next progress report, where the loss sums are allreduced) and the run fails with the
 *      first such step, its loss and its rate (REPORT_DIVERGED), without a retry.
 * Local SGD (train_arg.sync local or adacomm): no gradient is reduced; each rank steps on its
 * own gradients, and every tau steps (and at the end of each epoch, before evaluation and the
 * checkpoint) the ranks average their weights and batch-norm statistics. AdaComm sets tau
 * after each epoch from the training loss and the rate (adacomm_tau). The checkpoint holds
 * rank 0's optimizer state and not AdaComm's reference: a retried attempt or --resume gives
 * every rank rank 0's momenta and starts AdaComm again at tau0.
 * Precision: each rank's device multiplies in train_arg.precision (flint/gpu.h); with fp16
 * (synchronous only: the options refuse it with local SGD), a loss scaler (gpu/nn/nn.h)
 * scales the loss gradient and, after the allreduce, unscales the averaged gradients or skips
 * the step when they overflowed, alike on every rank; its scale is in the checkpoint.
 * Overlap (the default, as PyTorch DDP): buckets go to the rank's communication thread
 * (the comm worker, gpu/comm/comm.h), which allreduces them in order while backward goes on;
 * the rank waits for them all before the SGD step. Without it (train_arg.overlap false) each
 * bucket is allreduced in backward's callback, which holds backward up until it is done.
 * Compression (train_arg.compress, --compress): each bucket goes through the rank's compressor
 * (gpu/parallel/compress.h: a hook that compresses, communicates and leaves the averaged
 * estimate) instead of the allreduce, on the thread that would have allreduced it (the comm
 * worker runs it as a posted function); its residuals and PowerSGD's Q live in the compressor,
 * per bucket, for the attempt (not in the checkpoint).
 * Ranks report progress (a few times an epoch) and each epoch's row to the client, with the
 * time rank 0's thread waited for its batches (data_reader_next: the reader prefetches the
 * next batch on a thread of its own unless FLINT_TRAIN_PREFETCH=0) and copied them to the
 * device.
 *
 * Threading: a rank is one task thread; its device, model, optimizer and communicator are its
 * own, plus (with overlap and more than one rank) its communication thread, which alone uses
 * the communicator from a step's first bucket to the wait after backward; evaluation and the
 * other collectives run on the rank's thread after that wait.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/comm/comm.h"
#include "gpu/data/data.h"
#include "gpu/parallel/compress.h"
#include "gpu/parallel/train_rank.h"

#define DEFAULT_BUCKET_BYTES (4u << 20)

/* ---- the rank ----------------------------------------------------------------------------- */

/* Buckets: backward reports parameters final from the last to the first, so the ready part of
 * the flat gradient buffer grows downwards from its end: [lo, hi) is ready and not yet
 * reduced. A bucket goes out as soon as it holds bucket_elems, and the rest after backward.
 * "Goes out": posted to the communication thread with overlap, else allreduced here. */
typedef struct bucketing {
  nn_model *model;
  fl_comm *comm;         /* NULL with one rank: nothing to reduce */
  comm_worker *worker;   /* NULL without overlap */
  size_t bucket_elems;
  size_t lo, hi;
  uint32_t buckets; /* allreduces issued this step */
  uint64_t reduced; /* floats this rank allreduced so far: gradients, or local SGD's weights */
  fl_allreduce_algo algo;
  uint32_t algos;   /* the algorithms that ran (train_allreduce_bit), for the client's UI */
  compressor *comp; /* --compress: the hook that reduces each bucket instead (NULL: none) */
} bucketing;

/* comm_worker_fn: a bucket through the compression hook, on the communication thread. */
static fl_status bucket_compress(fl_comm *comm, fl_tensor *t, void *user) {
  bucketing *bk = user;
  return compressor_run(bk->comp, comm, nn_model_grads(bk->model), t);
}

/* Bytes this rank handed to collectives: the hook's payload, or the floats reduced. Read
 * after the worker's wait (or without a worker). */
static uint64_t bucket_sent_bytes(const bucketing *bk) {
  return bk->comp ? compressor_sent(bk->comp) : bk->reduced * sizeof(float);
}

static fl_status bucket_flush(bucketing *bk) {
  if (!bk->comm || bk->hi <= bk->lo) {
    bk->hi = bk->lo;
    return FL_OK;
  }
  fl_tensor view;
  int64_t shape[1] = {(int64_t)(bk->hi - bk->lo)};
  fl_status s = tensor_view(nn_model_grads(bk->model), bk->lo, 1, shape, &view);
  if (s == FL_OK && bk->comp)
    s = bk->worker ? comm_worker_post_fn(bk->worker, &view, bucket_compress, bk)
                   : compressor_run(bk->comp, bk->comm, nn_model_grads(bk->model), &view);
  else if (s == FL_OK)
    s = bk->worker ? comm_worker_post(bk->worker, &view, FL_REDUCE_AVG)
                   : fl_comm_allreduce(bk->comm, &view, FL_REDUCE_AVG);
  bk->reduced += bk->hi - bk->lo;
  bk->algos |= train_allreduce_bit(bk->comm, bk->algo, (bk->hi - bk->lo) * sizeof(float));
  bk->hi = bk->lo;
  bk->buckets++;
  return s;
}

/* nn_grads_ready_fn: parameters [first, first + count) are final. */
static fl_status bucket_ready(size_t first, size_t count, void *user) {
  bucketing *bk = user;
  if (count == 0) return FL_OK;
  nn_param *p0 = nn_model_param(bk->model, first), *p1 = nn_model_param(bk->model, first + count - 1);
  size_t lo = p0->offset, hi = p1->offset + p1->value.numel;
  if (hi != bk->lo) { /* not adjacent to the pending range: send that first */
    fl_status s = bucket_flush(bk);
    if (s != FL_OK) return s;
    bk->hi = hi;
  }
  bk->lo = lo;
  return bk->hi - bk->lo >= bk->bucket_elems ? bucket_flush(bk) : FL_OK;
}

typedef struct rank_state {
  fl_barrier *b;
  const train_arg *a;
  uint32_t rank, world, attempt;
  fl_device *dev;
  nn_model *model;
  optim *opt;
  fl_comm *comm;
  comm_worker *worker; /* with overlap and world > 1: the communication thread */
  data_reader *train, *test;
  fl_tensor *x;       /* [per-rank batch, c, h, w] */
  fl_tensor *sums;    /* [3]: loss sum, correct, images: reduced over ranks */
  int32_t *labels_d;  /* device, batch */
  float *stats_d;     /* device, 2: loss sum and correct (softmax_xent's) */
  float *images_h;    /* host (pinned on cuda), batch * image floats; on cpu x's own memory */
  int32_t *labels_h;
  uint32_t local_batch;
  uint32_t micro_batch; /* local_batch / accumulate: what the device holds at once */
} rank_state;

/* sums[0..2] += over ranks (host in, host out). */
static fl_status rank_sum(rank_state *r, double in[3], double out[3]) {
  float v[3] = {(float)in[0], (float)in[1], (float)in[2]};
  fl_status s = fl_tensor_write(r->sums, v, 3);
  if (s == FL_OK && r->comm) s = fl_comm_allreduce(r->comm, r->sums, FL_REDUCE_SUM);
  if (s == FL_OK) s = fl_tensor_read(r->sums, v, 3);
  for (int i = 0; i < 3; i++) out[i] = v[i];
  return s;
}

/* The dimensions of a sample as the model takes it: a user's model its own ({F}, {H, W} or
 * {C, H, W}), the built-in ones {C, H, W}. */
static int sample_ndim(const train_arg *a) {
  return a->model == NN_LIBRARY && a->sample_ndim >= 1 && a->sample_ndim <= 3 ? (int)a->sample_ndim : 3;
}

/* Copies images [first, first + n) of the host batch to the device and reshapes x to
 * [n, sample shape]; n is at most the micro-batch. */
static fl_status rank_upload(rank_state *r, uint32_t first, uint32_t n) {
  const train_arg *a = r->a;
  int ndim = sample_ndim(a);
  int64_t shape[4] = {n, a->channels, a->height, a->width};
  shape[3 - ndim] = n;
  size_t per = (size_t)a->channels * a->height * a->width;
  fl_status s = tensor_ensure(r->x, r->dev, ndim + 1, shape + 3 - ndim);
  /* On cpu the reader may have gathered the batch into x itself: nothing to copy. */
  const float *from = r->images_h + (size_t)first * per;
  if (s == FL_OK && from != r->x->data) s = fl_tensor_write(r->x, from, fl_tensor_numel(r->x));
  if (s == FL_OK)
    s = r->dev->ops->from_host(r->dev, r->labels_d, r->labels_h + first, (size_t)n * sizeof(int32_t));
  return s;
}

static fl_status read_stats(rank_state *r, float stats[2]) {
  return r->dev->ops->to_host(r->dev, stats, r->stats_d, 2 * sizeof(float));
}

/* One epoch's evaluation on the test shares: loss and accuracy over all ranks. */
static fl_status rank_evaluate(rank_state *r, uint32_t epoch, double *loss, double *acc) {
  fl_status status = FL_OK;
  /* No collective per batch: each rank reads all its share, then the sums are reduced. */
  data_reader_start_epoch(r->test, r->a->seed, epoch, false, 0, true);
  FL_CHECK(r->dev->ops->memset0(r->dev, r->stats_d, 2 * sizeof(float)));
  uint64_t images = 0;
  uint32_t n;
  while ((n = data_reader_next(r->test, r->images_h, r->labels_h)) > 0) {
    const fl_tensor *logits;
    FL_CHECK(rank_upload(r, 0, n));
    FL_CHECK(nn_model_forward(r->model, r->x, false, &logits));
    FL_CHECK(nn_model_loss(r->model, r->labels_d, 0.0f, r->stats_d));
    images += n;
  }
  float st[2];
  FL_CHECK(read_stats(r, st));
  double in[3] = {st[0], st[1], (double)images}, out[3];
  FL_CHECK(rank_sum(r, in, out));
  *loss = out[2] > 0 ? out[0] / out[2] : NAN;
  *acc = out[2] > 0 ? out[1] / out[2] : NAN;
cleanup:
  return status;
}

/* Local SGD: every rank's weights and batch-norm statistics become their average (the
 * optimizers' state stays each rank's own, as in Lin et al.'s local SGD). */
static fl_status rank_average(rank_state *r, bucketing *bk) {
  if (!r->comm) return FL_OK;
  fl_tensor *values = nn_model_values(r->model), *buffers = nn_model_buffers(r->model);
  fl_status s = fl_comm_allreduce(r->comm, values, FL_REDUCE_AVG);
  bk->reduced += fl_tensor_numel(values);
  bk->algos |= train_allreduce_bit(r->comm, bk->algo, fl_tensor_numel(values) * sizeof(float));
  if (s == FL_OK && buffers && fl_tensor_numel(buffers)) {
    s = fl_comm_allreduce(r->comm, buffers, FL_REDUCE_AVG);
    bk->reduced += fl_tensor_numel(buffers);
    bk->algos |= train_allreduce_bit(r->comm, bk->algo, fl_tensor_numel(buffers) * sizeof(float));
  }
  return s;
}

/* AdaComm's period after an epoch (Wang and Joshi): the error-runtime bound's best period
 * goes as sqrt(F / lr^3), so tau = tau0 x sqrt((lr0 / lr)^3 x F / F0), rounded up, where F0
 * is the first epoch's mean training loss, lr0 the schedule's peak rate, and F and lr the
 * epoch just ended: averaging grows more frequent as the loss falls, and rarer again as the
 * rate decays. Kept to [1, ADACOMM_MAX_TAU]; a rate of 0 keeps the period. Every rank has
 * the same reduced loss and rate, so every rank picks the same period. */
#define ADACOMM_MAX_TAU 100000u
static uint32_t adacomm_tau(uint32_t tau0, uint32_t tau, double f0, double lr0, double f, double lr) {
  if (!(f0 > 0) || !(lr0 > 0) || !(lr > 0) || !isfinite(f) || !(f >= 0)) return tau;
  double r = lr0 / lr, t = ceil(sqrt(r * r * r * (f / f0)) * tau0);
  return !(t >= 1) ? 1 : t > ADACOMM_MAX_TAU ? ADACOMM_MAX_TAU : (uint32_t)t;
}

static fl_status rank_report(rank_state *r, const train_report *rep) {
  return fl_barrier_report(r->b, fl_bytes_of(rep, sizeof *rep));
}

static fl_status rank_checkpoint(rank_state *r, const checkpoint_state *cs, fl_buf *blob) {
  fl_status s = checkpoint_encode(nn_model_values(r->model), nn_model_buffers(r->model), r->opt, cs, blob);
  if (s == FL_OK) s = fl_barrier_checkpoint_put(r->b, fl_buf_bytes(blob));
  return s;
}

/* Called by every rank once the summed loss is non-finite: some rank saw a non-finite loss,
 * and each one's `bad` holds the first step it saw one at (step 0: none). Every rank gets the
 * earliest in *bad; when none saw one (the sum itself overflowed) the caller's fallback
 * stands. The failure path only: through the driver, not the communicator. */
static fl_status rank_agree_divergence(rank_state *r, train_report *bad, const train_report *fallback) {
  fl_records *all = NULL;
  fl_status s = fl_barrier_all_gather(r->b, fl_bytes_of(bad, sizeof *bad), 0, &all);
  if (s != FL_OK) return s;
  for (uint32_t i = 0; i < r->world && s == FL_OK; i++) {
    fl_bytes rec = fl_records_get(all, i);
    train_report t;
    if (rec.len != sizeof t) {
      s = fl_set_error(FL_EPROTO, "rank %u sent a divergence report of %zu bytes", i, rec.len);
      break;
    }
    memcpy(&t, rec.data, sizeof t);
    if (t.step && (!bad->step || t.step < bad->step)) *bad = t;
  }
  fl_records_free(all);
  if (s == FL_OK && !bad->step) *bad = *fallback;
  return s;
}

static void rank_free(rank_state *r) {
  /* First: the worker may still be reading the gradients, and it uses the communicator. */
  comm_worker_stop(r->worker);
  fl_device *dev = r->dev;
  if (dev) {
    if (r->images_h && r->images_h != r->x->data) dev->ops->host_free(dev, r->images_h);
    if (r->labels_h) dev->ops->host_free(dev, r->labels_h);
    if (r->labels_d) dev->ops->free(dev, r->labels_d);
    if (r->stats_d) dev->ops->free(dev, r->stats_d);
  }
  fl_tensor_destroy(r->sums);
  fl_tensor_destroy(r->x);
  fl_comm_destroy(r->comm);
  optim_destroy(r->opt);
  nn_model_destroy(r->model);
  fl_device_close(dev);
  data_reader_destroy(r->train);
  data_reader_destroy(r->test);
}

/* --compress: the rank's compressor over the model's flat gradients, each parameter a rows x
 * cols matrix (its first dimension by the rest; a vector is n x 1). */
static fl_status rank_compressor(rank_state *r, const compress_spec *spec, compressor **out) {
  size_t n = nn_model_param_count(r->model);
  compress_param *params = common_malloc((n ? n : 1) * sizeof *params);
  if (!params) return FL_ERR(FL_ENOMEM, "out of memory for the compressor's parameters");
  for (size_t i = 0; i < n; i++) {
    const nn_param *p = nn_model_param(r->model, i);
    size_t numel = p->value.numel, rows = p->value.ndim >= 2 ? (size_t)p->value.shape[0] : numel;
    params[i] = (compress_param){.offset = p->offset, .rows = rows, .cols = rows ? numel / rows : 0};
  }
  /* Top-k's momentum correction takes over SGD's momentum (gpu/parallel/compress_topk.c). */
  compress_spec with = *spec;
  const optim_options *o = &r->a->optim;
  with.momentum = o->kind == OPTIM_SGD && !o->nesterov ? o->momentum : 0;
  fl_status s = compressor_create(&with, params, n, fl_tensor_numel(nn_model_grads(r->model)), (int)r->world, out);
  common_free(params);
  return s;
}

static fl_status rank_setup(rank_state *r, fl_iter *in) {
  const train_arg *a = r->a;
  fl_status status = FL_OK;
  r->local_batch = a->batch / r->world;
  r->micro_batch = r->local_batch / (a->accumulate ? a->accumulate : 1);
  FL_CHECK(data_reader_create(r->local_batch, &r->train));
  /* Evaluation's batches are micro-batches too: the device never holds more than one. */
  FL_CHECK(data_reader_create(r->micro_batch, &r->test));
  bool prefetch = config_bool(CONFIG_TRAIN_PREFETCH);
  data_reader_set_prefetch(r->train, prefetch);
  data_reader_set_prefetch(r->test, prefetch);
  if (a->augment) FL_CHECK(data_reader_set_transform(r->train, &a->aug, a->classes));
  FL_CHECK(data_reader_add_all(in, r->train, r->test));
  if (data_reader_images(r->train) &&
      (data_reader_channels(r->train) != a->channels || data_reader_height(r->train) != a->height ||
       data_reader_width(r->train) != a->width || data_reader_classes(r->train) != a->classes)) {
    status = fl_set_error(FL_ECORRUPT, "rank %u: its images are %ux%ux%u of %u classes, the run's %ux%ux%u of %u",
                          r->rank, data_reader_channels(r->train), data_reader_height(r->train),
                          data_reader_width(r->train), data_reader_classes(r->train), a->channels, a->height,
                          a->width, a->classes);
    goto cleanup;
  }
  FL_CHECK(train_device_open(r->b, a->device, a->precision, &r->dev));
  FL_CHECK(train_model_build(a, r->dev, &r->model));
  FL_CHECK(optim_create_for_model(r->dev, &a->optim, r->model, &r->opt));
  int ndim = sample_ndim(a);
  int64_t xshape[4] = {r->micro_batch, a->channels, a->height, a->width}, three[1] = {3};
  xshape[3 - ndim] = r->micro_batch;
  FL_CHECK(fl_tensor_create(r->dev, ndim + 1, xshape + 3 - ndim, &r->x));
  FL_CHECK(fl_tensor_create(r->dev, 1, three, &r->sums));
  size_t per = data_reader_image_floats(r->train) ? data_reader_image_floats(r->train)
                                                  : (size_t)a->channels * a->height * a->width;
  FL_CHECK(r->dev->ops->alloc(r->dev, r->micro_batch * sizeof(int32_t), (void **)&r->labels_d));
  FL_CHECK(r->dev->ops->alloc(r->dev, 2 * sizeof(float), (void **)&r->stats_d));
  /* On cpu "device" memory is host memory: the reader gathers each batch straight into x
   * (which never grows past the local batch), rather than into a buffer copied into it. */
  if (fl_device_kind_of(r->dev) == FL_DEVICE_CPU && (size_t)r->local_batch * per <= fl_tensor_numel(r->x))
    r->images_h = r->x->data;
  else
    FL_CHECK(r->dev->ops->host_alloc(r->dev, (size_t)r->local_batch * per * sizeof(float), (void **)&r->images_h));
  FL_CHECK(r->dev->ops->host_alloc(r->dev, r->local_batch * sizeof(int32_t), (void **)&r->labels_h));
  /* The compression hooks work on host memory over the host backend's collectives: cuda ranks
   * that compress join over it rather than NCCL (it stages their buckets in host memory, as
   * the hooks would anyway). */
  bool host = a->compress.kind != COMPRESS_NONE;
  if (r->world > 1) FL_CHECK(train_connect(r->b, r->dev, a->device, a->allreduce, host, -1, &r->comm));
  /* Local SGD reduces no gradients: nothing for a communication thread to overlap. */
  if (r->comm && a->overlap && a->sync == GPU_TRAIN_SYNC_BSP) FL_CHECK(comm_worker_start(r->comm, &r->worker));
cleanup:
  return status;
}

/* The barrier task: one rank of the run. Rank 0 emits the final train_report (and, when asked,
 * the final checkpoint blob after it). */
FL_API fl_status gpu_train_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg) {
  train_arg a;
  memcpy(&a, arg, sizeof a);
  if (a.accumulate == 0) a.accumulate = 1;
  rank_state r = {.b = b, .a = &a, .rank = fl_barrier_rank(b), .world = fl_barrier_world(b),
                  .attempt = fl_barrier_attempt(b)};
  fl_status status = FL_OK;
  fl_buf blob = FL_BUF_INIT;
  compressor *comp = NULL; /* --compress: the bucketing's hook */
  FL_CHECK(rank_setup(&r, in));

  uint64_t steps = 0;
  FL_CHECK(train_agree_min(b, data_reader_batches(r.train, false), &steps));
  if (steps == 0) {
    status = fl_set_error(FL_EINVAL, "a rank has fewer than %u training images (batch %u over %u ranks): make "
                          "--batch smaller or the data larger", r.local_batch, a.batch, r.world);
    goto cleanup;
  }

  checkpoint_state cs = {0};
  fl_status got = FL_ENOENT;
  if (r.attempt > 0) {
    got = fl_barrier_checkpoint_get(b, &blob);
    if (got == FL_OK) {
      FL_CHECK(checkpoint_decode(fl_buf_bytes(&blob), nn_model_values(r.model), nn_model_buffers(r.model), r.opt,
                                 &cs));
    } else if (got != FL_ENOENT) {
      status = got;
      goto cleanup;
    }
  }
  if (got == FL_ENOENT && a.resume) { /* --resume, and no epoch of this run put yet */
    fl_bytes file;
    FL_CHECK(fl_broadcast_value(a.resume_id, &file));
    FL_CHECK(checkpoint_decode(file, nn_model_values(r.model), nn_model_buffers(r.model), r.opt, &cs));
  }

  const uint32_t resumed = cs.epoch;
  /* fp16 products: dynamic loss scaling. Every rank unscales the same averaged gradients, so
   * every rank skips the same steps and keeps the same scale. */
  const bool scaling = a.precision == FL_PRECISION_FP16;
  loss_scaler scaler = LOSS_SCALER_INIT;
  if (scaling && cs.loss_scale > 0) {
    scaler.scale = cs.loss_scale;
    scaler.good_steps = cs.loss_scale_good;
  }
  if (scaling) nn_model_set_loss_scale(r.model, scaler.scale);
  /* Local SGD and AdaComm: no gradient allreduce; the weights are averaged every tau steps. */
  const bool local = a.sync != GPU_TRAIN_SYNC_BSP;
  uint32_t tau = a.tau ? a.tau : 1, since_average = 0;
  double f0 = 0; /* AdaComm's reference: the first epoch's loss */
  bucketing bk = {.model = r.model, .comm = local ? NULL : r.comm, .worker = r.worker, .algo = a.allreduce,
                  .bucket_elems = (a.bucket_bytes ? a.bucket_bytes : DEFAULT_BUCKET_BYTES) / sizeof(float)};
  if (bk.bucket_elems == 0) bk.bucket_elems = 1;
  size_t total = fl_tensor_numel(nn_model_grads(r.model));
  if (bk.comm && a.compress.kind != COMPRESS_NONE) FL_CHECK(rank_compressor(&r, &a.compress, &comp));
  bk.comp = comp;
  uint64_t report_every = steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH ? steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH : 1;
  train_report last = {0};
  train_report bad = {0}; /* the first step whose loss this rank saw non-finite */
  double lr = cs.lr;
  /* FLINT_PS_SLOW_WORKER's straggler (benchmarks): this rank's steps take F times as long. */
  const double slowdown = train_slowdown_of(r.rank);
  for (uint32_t epoch = cs.epoch; epoch < a.epochs; epoch++) {
    double t0 = common_now_s();
    data_reader_start_epoch(r.train, a.seed, epoch, a.shuffle, steps, false);
    FL_CHECK(r.dev->ops->memset0(r.dev, r.stats_d, 2 * sizeof(float)));
    uint64_t images = 0;
    float loss_before = 0; /* the epoch's loss sum before this step */
    double wait_s = 0, upload_s = 0; /* the rank thread's, in data_reader_next and rank_upload */
    for (uint64_t i = 0; i < steps; i++) {
      double w0 = common_now_s();
      uint32_t n = data_reader_next(r.train, r.images_h, r.labels_h);
      double w1 = common_now_s();
      wait_s += w1 - w0;
      if (n != r.local_batch) {
        FL_CHECK(data_reader_status(r.train)); /* a transform that failed */
        status = fl_set_error(FL_EINTERNAL, "rank %u: step %llu of epoch %u got %u images, not %u", r.rank,
                              (unsigned long long)i, epoch + 1, n, r.local_batch);
        goto cleanup;
      }
      FL_CHECK(nn_model_zero_grad(r.model));
      bk.lo = bk.hi = total;
      bk.buckets = 0;
      for (uint32_t j = 0; j < a.accumulate; j++) {
        const fl_tensor *logits;
        bool last_micro = j + 1 == a.accumulate;
        /* Dropout's masks are keyed by this: a fresh one for every step, rank and micro-batch. */
        fl_model_set_step(r.model, (cs.step * r.world + r.rank) * a.accumulate + j);
        double u0 = common_now_s();
        FL_CHECK(rank_upload(&r, j * r.micro_batch, r.micro_batch));
        upload_s += common_now_s() - u0; /* on cuda, a copy the stream may still be doing */
        FL_CHECK(nn_model_forward(r.model, r.x, true, &logits));
        /* Each micro-batch's loss is scaled by 1 / n, n the rank's whole batch, so that the
         * gradients add up to those of the mean over it; the allreduce's average over ranks
         * makes that the mean over the global batch. */
        FL_CHECK(nn_model_loss_smoothed(r.model, r.labels_d, a.label_smoothing, 1.0f / (float)n, r.stats_d));
        /* Only the last backward makes gradients final: buckets go out during it alone. */
        FL_CHECK(nn_model_backward(r.model, last_micro ? bucket_ready : NULL, &bk));
      }
      /* Whatever backward did not report ready is final now: [0, hi) goes out last. */
      bk.lo = 0;
      FL_CHECK(bucket_flush(&bk));
      /* The communicator is the rank thread's again, and the gradients are averaged. */
      if (bk.worker) FL_CHECK(comm_worker_wait(bk.worker));
      lr = optim_lr_at(&a.schedule, epoch + (double)i / (double)steps);
      /* Divergence: the epoch's loss sum turns non-finite at the first step whose loss does.
       * On cuda the copy waits for backward, as the next step's upload would anyway. */
      float st[2];
      FL_CHECK(read_stats(&r, st));
      if (!bad.step && !isfinite(st[0]))
        bad = (train_report){.kind = REPORT_DIVERGED, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                             .step = cs.step + 1, .steps_per_epoch = steps, .done = i + 1,
                             .loss = ((double)st[0] - loss_before) / n, .lr = lr, .pid = (int64_t)getpid()};
      loss_before = st[0];
      bool at_report = (i + 1) % report_every == 0 || i + 1 == steps;
      /* One rank must not stop alone: the others would wait for it in the next allreduce. With
       * several, all of them check the summed loss at each progress report (a NaN anywhere
       * makes it non-finite everywhere) and stop there together, naming the first bad step. */
      bool diverged = r.world == 1 && bad.step;
      if (r.world > 1 && at_report) {
        double in3[3] = {st[0], st[1], (double)(images + n)}, sum3[3];
        FL_CHECK(rank_sum(&r, in3, sum3));
        if (!isfinite(sum3[0])) {
          train_report here = {.kind = REPORT_DIVERGED, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                               .step = cs.step + 1, .steps_per_epoch = steps, .done = i + 1,
                               .loss = sum3[0] / sum3[2], .lr = lr, .pid = (int64_t)getpid()};
          FL_CHECK(rank_agree_divergence(&r, &bad, &here));
          diverged = true;
        }
      }
      if (diverged) {
        /* Not a failure of the task: every rank returns FL_OK (a retry would only diverge
         * again) and the client fails the run with rank 0's report. */
        if (r.rank == 0) FL_CHECK(fl_emit(out, &bad, sizeof bad));
        goto cleanup;
      }
      bool take = true; /* false: fp16 gradients overflowed, the step is skipped */
      if (scaling) {
        FL_CHECK(loss_scaler_unscale(&scaler, nn_model_grads(r.model), &take));
        nn_model_set_loss_scale(r.model, scaler.scale);
      }
      /* Every rank clips the same averaged gradients: the weights stay the same everywhere. */
      if (take && a.clip_grad_norm > 0) FL_CHECK(optim_clip_grad_norm(nn_model_grads(r.model), a.clip_grad_norm, NULL));
      if (take) FL_CHECK(optim_step(r.opt, (float)lr, nn_model_grads(r.model), nn_model_values(r.model)));
      if (local && ++since_average >= tau) {
        FL_CHECK(rank_average(&r, &bk));
        since_average = 0;
      }
      images += n;
      cs.step++;
      train_straggle(slowdown, w0);
      if (r.rank == 0 && at_report) {
        double secs = common_now_s() - t0;
        train_report rep = {.kind = REPORT_PROGRESS, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                            .step = cs.step, .steps_per_epoch = steps, .done = i + 1, .loss = st[0] / images,
                            .acc = st[1] / images, .lr = lr,
                            .images_per_s = secs > 0 ? images * (double)r.world / secs : 0, .seconds = secs,
                            .resumed_epoch = resumed, .buckets = bk.buckets, .pid = (int64_t)getpid(),
                            .input_wait_s = wait_s, .upload_s = upload_s, .train_s = secs,
                            .reduced_bytes = bk.reduced * sizeof(float), .allreduce_algos = bk.algos,
                            .sent_bytes = bucket_sent_bytes(&bk)};
        FL_CHECK(rank_report(&r, &rep));
      }
    }
    /* The replicas agree before they are evaluated and checkpointed. */
    if (local && since_average) {
      FL_CHECK(rank_average(&r, &bk));
      since_average = 0;
    }
    double train_secs = common_now_s() - t0;
    float st[2];
    FL_CHECK(read_stats(&r, st));
    double in3[3] = {st[0], st[1], (double)images}, sum3[3];
    FL_CHECK(rank_sum(&r, in3, sum3));
    if (a.sync == GPU_TRAIN_SYNC_ADACOMM && sum3[2] > 0) {
      if (f0 == 0) f0 = sum3[0] / sum3[2];
      else tau = adacomm_tau(a.tau ? a.tau : 1, tau, f0, optim_schedule_peak_lr(&a.schedule), sum3[0] / sum3[2], lr);
    }
    double test_loss = NAN, test_acc = NAN;
    FL_CHECK(rank_evaluate(&r, epoch, &test_loss, &test_acc));
    cs.epoch = epoch + 1;
    cs.position = epoch + 1;
    cs.lr = lr;
    cs.loss_scale = scaling ? scaler.scale : 0;
    cs.loss_scale_good = scaler.good_steps;
    last = (train_report){.kind = REPORT_EPOCH, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                          .step = cs.step, .steps_per_epoch = steps, .done = steps, .loss = sum3[0] / sum3[2],
                          .acc = sum3[1] / sum3[2], .test_loss = test_loss, .test_acc = test_acc, .lr = lr,
                          .images_per_s = train_secs > 0 ? sum3[2] / train_secs : 0, .seconds = common_now_s() - t0,
                          .resumed_epoch = resumed, .buckets = bk.buckets, .pid = (int64_t)getpid(),
                          .loss_scale = scaling ? scaler.scale : 0, .skipped_steps = scaler.skipped,
                          .tau = local ? tau : 0, .reduced_bytes = bk.reduced * sizeof(float),
                          .input_wait_s = wait_s, .upload_s = upload_s, .train_s = train_secs,
                          .allreduce_algos = bk.algos, .sent_bytes = bucket_sent_bytes(&bk)};
    if (r.rank == 0) {
      /* Every rank holds the same weights: rank 0's checkpoint stands for all. It goes first,
       * so that an epoch the client has seen is never trained again. */
      FL_CHECK(rank_checkpoint(&r, &cs, &blob));
      FL_CHECK(rank_report(&r, &last));
    }
  }
  if (r.rank == 0) {
    FL_CHECK(fl_emit(out, &last, sizeof last));
    if (a.emit_checkpoint) {
      FL_CHECK(checkpoint_encode(nn_model_values(r.model), nn_model_buffers(r.model), r.opt, &cs, &blob));
      FL_CHECK(fl_emit(out, blob.data, blob.len));
    }
  }
cleanup:
  fl_buf_free(&blob);
  rank_free(&r); /* first: its worker may be running the compressor */
  compressor_destroy(comp);
  return status;
}
