/*
 * gpu/parallel/train_trick.c: `flint train --model cnn --trick`: Krizhevsky's "one weird
 * trick" (gpu/parallel/hybrid_cnn.h) as ONE barrier stage of --ranks tasks, with the
 * data-parallel trainer's client, data, schedule and reports (gpu/parallel/train_client.c).
 *
 * The network is the cnn's without batch norm (whose per-rank statistics would make the
 * split differ from one rank): conv3x3 32 - relu - maxpool2 - conv3x3 64 - relu - maxpool2 -
 * fc TRICK_FC - relu - fc TRICK_FC - relu - classifier. Each task reads b = batch / ranks
 * images a step from its partition (as a data-parallel rank does), runs the convolutions on
 * them, and the FC layers on the whole global batch, each rank its 1 / ranks of their units.
 *
 * The test set: every rank evaluates as many images as the smallest share of any rank, in
 * steps of b (the forward is collective).
 *
 * Not here (refused by the options' checks): checkpoints and --resume (each rank's FC
 * weights are a shard of its own), gradient clipping, label smoothing, LARS and LAMB over
 * several ranks (their trust ratio needs whole weights), accumulation, compression and the
 * other --sync modes. A retried attempt starts again from the seed.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/data/data.h"
#include "gpu/parallel/hybrid_cnn.h"
#include "gpu/parallel/train_rank.h"

hcnn_spec train_trick_spec(uint32_t channels, uint32_t height, uint32_t width, uint32_t classes, uint64_t seed) {
  return (hcnn_spec){.channels = (int)channels, .height = (int)height, .width = (int)width, .conv = {32, 64},
                     .nconv = 2, .fc = {TRICK_FC, TRICK_FC}, .nfc = 2, .classes = (int)classes, .seed = seed};
}

typedef struct trick_rank {
  fl_barrier *b;
  const train_arg *a;
  uint32_t rank, world, attempt;
  fl_device *dev;
  fl_comm *comm;
  hcnn *model;
  data_reader *train, *test;
  uint32_t local; /* images a step: batch / world */
  float *images_h;
  int32_t *labels_h;
} trick_rank;

static void trick_free(trick_rank *r) {
  hcnn_destroy(r->model);
  fl_comm_destroy(r->comm);
  fl_device_close(r->dev);
  data_reader_destroy(r->train);
  data_reader_destroy(r->test);
  common_free(r->images_h);
  common_free(r->labels_h);
}

static fl_status trick_setup(trick_rank *r, fl_iter *in) {
  const train_arg *a = r->a;
  fl_status status = FL_OK;
  r->local = a->batch / r->world;
  FL_CHECK(data_reader_create(r->local, &r->train));
  FL_CHECK(data_reader_create(r->local, &r->test));
  data_reader_set_prefetch(r->train, config_bool(CONFIG_TRAIN_PREFETCH));
  data_reader_set_prefetch(r->test, config_bool(CONFIG_TRAIN_PREFETCH));
  FL_CHECK(data_reader_add_all(in, r->train, r->test));
  size_t image_floats = (size_t)a->channels * a->height * a->width;
  r->images_h = common_malloc((size_t)r->local * image_floats * sizeof(float));
  r->labels_h = common_malloc((size_t)r->local * sizeof(int32_t));
  if (!r->images_h || !r->labels_h)
    FL_CHECK(fl_set_error(FL_ENOMEM, "rank %u: out of memory for batches of %u images", r->rank, r->local));
  FL_CHECK(train_device_open(r->b, a->device, a->precision, &r->dev));
  FL_CHECK(train_connect(r->b, r->dev, a->device, a->allreduce, false, -1, &r->comm));
  hcnn_spec spec = train_trick_spec(a->channels, a->height, a->width, a->classes, a->seed);
  FL_CHECK(hcnn_create(r->dev, r->comm, &spec, HCNN_TRICK, &a->optim, &r->model));
cleanup:
  return status;
}

/* One test batch (train_evaluate_share's). */
static fl_status trick_eval_batch(void *user, uint32_t n, double *loss_sum, double *correct) {
  trick_rank *r = user;
  return hcnn_evaluate(r->model, r->images_h, r->labels_h, (int)n, loss_sum, correct);
}

FL_API fl_status gpu_train_trick_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg) {
  train_arg a;
  memcpy(&a, arg, sizeof a);
  trick_rank r = {.b = b, .a = &a, .rank = fl_barrier_rank(b), .world = fl_barrier_world(b),
                  .attempt = fl_barrier_attempt(b)};
  fl_status status = FL_OK;
  FL_CHECK(trick_setup(&r, in));
  uint64_t steps = 0;
  FL_CHECK(train_agree_min(b, data_reader_batches(r.train, false), &steps));
  if (steps == 0)
    FL_CHECK(fl_set_error(FL_EINVAL, "a rank has fewer than %u training images (batch %u over %u ranks): make "
                          "--batch smaller or the data larger", r.local, a.batch, r.world));
  uint64_t report_every = steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH ? steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH : 1;
  uint64_t step = 0, sent = 0, reduced = 0;
  train_report last = {0};
  double lr = 0;
  for (uint32_t epoch = 0; epoch < a.epochs; epoch++) {
    double t0 = common_now_s(), loss = 0, acc = 0;
    data_reader_start_epoch(r.train, a.seed, epoch, a.shuffle, steps, false);
    for (uint64_t i = 0; i < steps; i++) {
      uint32_t n = data_reader_next(r.train, r.images_h, r.labels_h);
      if (n != r.local)
        FL_CHECK(fl_set_error(FL_EINTERNAL, "rank %u: step %llu of epoch %u got %u images, not %u", r.rank,
                              (unsigned long long)i, epoch + 1, n, r.local));
      hcnn_stats st;
      FL_CHECK(hcnn_compute_gradients(r.model, r.images_h, r.labels_h, (int)n, &st));
      lr = optim_lr_at(&a.schedule, epoch + (double)i / (double)steps);
      /* The loss is the global batch's on every rank: all stop at the same step. */
      if (!isfinite(st.loss)) {
        train_report bad = {.kind = REPORT_DIVERGED, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                            .step = step + 1, .steps_per_epoch = steps, .done = i + 1, .loss = st.loss, .lr = lr,
                            .pid = (int64_t)getpid()};
        if (r.rank == 0) FL_CHECK(fl_emit(out, &bad, sizeof bad));
        goto cleanup;
      }
      FL_CHECK(hcnn_apply(r.model, (float)lr));
      loss += st.loss;
      acc += st.accuracy;
      sent += st.bytes.activations + st.bytes.gradients;
      reduced += st.bytes.gradients;
      step++;
      if (r.rank == 0 && ((i + 1) % report_every == 0 || i + 1 == steps)) {
        double secs = common_now_s() - t0;
        train_report rep = {.kind = REPORT_PROGRESS, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                            .step = step, .steps_per_epoch = steps, .done = i + 1, .loss = loss / (double)(i + 1),
                            .acc = acc / (double)(i + 1), .lr = lr,
                            .images_per_s = secs > 0 ? (double)(i + 1) * a.batch / secs : 0, .seconds = secs,
                            .pid = (int64_t)getpid(), .reduced_bytes = reduced, .sent_bytes = sent};
        FL_CHECK(fl_barrier_report(b, fl_bytes_of(&rep, sizeof rep)));
      }
    }
    double train_secs = common_now_s() - t0;
    double test_loss = NAN, test_acc = NAN;
    FL_CHECK(train_evaluate_share(b, r.test, a.seed, epoch, r.images_h, r.labels_h, 1, trick_eval_batch, &r,
                                  &test_loss, &test_acc));
    last = (train_report){.kind = REPORT_EPOCH, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                          .step = step, .steps_per_epoch = steps, .done = steps, .loss = loss / (double)steps,
                          .acc = acc / (double)steps, .test_loss = test_loss, .test_acc = test_acc, .lr = lr,
                          .images_per_s = train_secs > 0 ? (double)steps * a.batch / train_secs : 0,
                          .seconds = common_now_s() - t0, .pid = (int64_t)getpid(), .reduced_bytes = reduced,
                          .sent_bytes = sent};
    if (r.rank == 0) FL_CHECK(fl_barrier_report(b, fl_bytes_of(&last, sizeof last)));
  }
  if (r.rank == 0) FL_CHECK(fl_emit(out, &last, sizeof last));
cleanup:
  trick_free(&r);
  return status;
}
