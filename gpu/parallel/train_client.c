/*
 * gpu/parallel/train_client.c: gpu_train_run, the client's side of a training run (see
 * gpu/parallel/train.h). It loads the training and test sets as one cached dataset with a
 * partition per rank (data_pair), runs ONE barrier stage over it: the data-parallel ranks
 * (gpu/parallel/train_dp.c) or, for the transformer, the grid's ranks
 * (gpu/parallel/train_hybrid.c); the ranks' reports draw the progress line and fill the
 * curves (client_on_report), and at the end it writes the curves, the timelines and the
 * final checkpoint that the options ask for. --sync asp and ssp:S run instead through the
 * parameter servers (train_ps_run, gpu/parallel/train_ps.c: ordinary tasks, whose epoch rows
 * come to client_on_report at the job's end).
 *
 * Threading: client_on_report runs on the client's thread inside the action; everything else
 * on the caller's.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "gpu/data/data.h"
#include "flint/ml.h"
#include "flint/train.h"
#include "gpu/parallel/curves.h"
#include "gpu/parallel/train_rank.h"

/* ---- the client ----------------------------------------------------------------------------- */

typedef struct client_state {
  const gpu_train_options *opts;
  curves curves;
  fl_status error; /* the first failure to keep a row (ENOMEM) */
  uint32_t attempts;
  bool line_open; /* a progress line without its newline yet */
  bool in_place;  /* opts->progress is a terminal: the line is redrawn with "\r" */
  /* The ETA: the share of the run done at its first report, and when. */
  double first_s, first_done;
  bool first_seen;
  train_events events; /* the run in the web UI */
} client_state;

/* The ETA at (epoch, fraction of it): the run's share done since its first report (a
 * resumed run starts late; the first report comes after the data was cached) and the time
 * that took. */
static void run_eta(client_state *c, const train_report *rep, double fraction, char *eta, size_t cap) {
  double done = rep->epochs ? ((double)rep->epoch - 1 + fraction) / (double)rep->epochs : 0;
  double now = common_now_s();
  if (!c->first_seen) {
    c->first_seen = true;
    c->first_s = now;
    c->first_done = done;
  }
  double share = c->first_done < 1 ? (done - c->first_done) / (1 - c->first_done) : 0;
  common_progress_eta(eta, cap, now - c->first_s, share);
}

static void client_on_report(uint32_t rank, fl_bytes message, void *user) {
  client_state *c = user;
  train_report rep;
  (void)rank;
  if (message.len != sizeof rep) return; /* not ours: ignore */
  memcpy(&rep, message.data, sizeof rep);
  /* The trainers that do not count it sent what they reduced. */
  if (!rep.sent_bytes) rep.sent_bytes = rep.reduced_bytes;
  if (rep.attempt + 1 > c->attempts) c->attempts = rep.attempt + 1;
  train_events_report(&c->events, c->opts, &rep);
  if (rep.kind == REPORT_PROGRESS) {
    if (c->opts->progress && rep.steps_per_epoch) {
      double fraction = (double)rep.done / (double)rep.steps_per_epoch;
      char eta[32];
      run_eta(c, &rep, fraction, eta, sizeof eta);
      curves_progress_print(c->opts->progress, c->in_place, rep.epoch, rep.epochs, fraction, rep.loss, rep.acc,
                            rep.images_per_s, eta, false);
      c->line_open = c->in_place;
    }
    return;
  }
  if (rep.kind != REPORT_EPOCH) return;
  /* A retried attempt goes on from its checkpoint: it may repeat epochs already shown. */
  while (c->curves.count && c->curves.rows[c->curves.count - 1].epoch >= rep.epoch) c->curves.count--;
  curves_row row = {.epoch = rep.epoch, .train_loss = rep.loss, .train_acc = rep.acc, .test_loss = rep.test_loss,
                    .test_acc = rep.test_acc, .lr = rep.lr, .images_per_s = rep.images_per_s,
                    .seconds = rep.seconds, .reduced_mb = (double)rep.reduced_bytes / (1 << 20),
                    .input_wait_s = rep.input_wait_s, .upload_s = rep.upload_s, .train_s = rep.train_s};
  if (curves_append(&c->curves, &row) != FL_OK && c->error == FL_OK) c->error = FL_ENOMEM;
  if (c->opts->on_epoch) {
    gpu_train_epoch e = {.epoch = rep.epoch, .epochs = rep.epochs, .attempt = rep.attempt,
                         .resumed_epoch = rep.resumed_epoch, .step = rep.step, .train_loss = rep.loss,
                         .train_acc = rep.acc, .test_loss = rep.test_loss, .test_acc = rep.test_acc, .lr = rep.lr,
                         .images_per_s = rep.images_per_s, .seconds = rep.seconds, .pid = rep.pid,
                         .loss_scale = rep.loss_scale, .skipped_steps = rep.skipped_steps, .tau = rep.tau,
                         .reduced_bytes = rep.reduced_bytes,
                         .input_wait_s = rep.input_wait_s, .upload_s = rep.upload_s, .train_seconds = rep.train_s,
                         .max_staleness = rep.max_staleness, .sent_bytes = rep.sent_bytes};
    c->opts->on_epoch(&e, c->opts->user);
  }
  if (c->opts->progress) {
    char eta[32];
    run_eta(c, &rep, 1.0, eta, sizeof eta);
    curves_progress_print(c->opts->progress, c->in_place, rep.epoch, rep.epochs, 1.0, rep.loss, rep.acc,
                          rep.images_per_s, rep.epoch < rep.epochs ? eta : NULL, true);
    c->line_open = false;
    fprintf(c->opts->progress, "  test loss %.4f acc %.4f  lr %.4g  %.1f s", rep.test_loss, rep.test_acc, rep.lr,
            rep.seconds);
    if (rep.tau) fprintf(c->opts->progress, "  tau %u", rep.tau);
    if (c->opts->experts)
      fprintf(c->opts->progress, "  aux %.4g dropped %.1f%%", rep.aux_loss, 100 * rep.dropped_fraction);
    if (c->opts->compress && rep.step)
      fprintf(c->opts->progress, "  %s: %.1f KiB sent a step (of %.1f)", c->opts->compress,
              (double)rep.sent_bytes / rep.step / 1024, (double)rep.reduced_bytes / rep.step / 1024);
    if (GPU_TRAIN_SYNC_IS_PS(c->opts->sync))
      fprintf(c->opts->progress, "  %.1f MiB pushed+pulled a worker, staleness <= %llu",
              (double)rep.reduced_bytes / (1 << 20), (unsigned long long)rep.max_staleness);
    if (rep.loss_scale > 0)
      fprintf(c->opts->progress, "  loss scale %g (%llu steps skipped)", rep.loss_scale,
              (unsigned long long)rep.skipped_steps);
    /* The share of the steps' time rank 0 waited for its batches (not measured by the transformer's ranks). */
    if (c->opts->model != NN_TRANSFORMER && rep.train_s > 0)
      fprintf(c->opts->progress, "  input wait %.1f%%", 100 * rep.input_wait_s / rep.train_s);
    fputc('\n', c->opts->progress);
    fflush(c->opts->progress);
  }
}

/* FL_EINVAL naming a REPORT_DIVERGED's step, loss and rate, with the hint (a lower --lr, or
 * --warmup). */
static fl_status train_diverged_error(const gpu_train_options *o, const train_report *rep) {
  char loss[32];
  if (isnan(rep->loss)) snprintf(loss, sizeof loss, "nan"); /* not "-nan" */
  else snprintf(loss, sizeof loss, "%g", rep->loss);
  optim_schedule sched;
  gpu_train_schedule(o, &sched);
  return fl_set_error(FL_EINVAL,
                      "training diverged at step %llu (epoch %u of %u): loss %s at learning rate %g (the peak is "
                      "--lr %g x --batch %u / 256 = %g); lower --lr, or reach the rate gradually with --warmup",
                      (unsigned long long)rep->step, rep->epoch, rep->epochs, loss, rep->lr, o->lr, o->batch,
                      optim_schedule_peak_lr(&sched));
}

/* The dimensions of the samples a user's model is built for: {F} for rows of features. */
static uint32_t sample_ndim(const gpu_train_options *o) {
  if (o->data == GPU_TRAIN_EXAMPLES) return o->sample_ndim;
  return o->data == GPU_TRAIN_LIBSVM || o->data == GPU_TRAIN_CSV ? 1 : 3;
}

static const char *model_symbol(const gpu_train_options *o) {
  return o->model_symbol && *o->model_symbol ? o->model_symbol : FL_MODEL_BUILDER_SYMBOL;
}

/* --model FILE.so: checks the library against the data (train_model_library_read) and
 * broadcasts its bytes to the ranks. */
static fl_status ship_model_library(fl_context *ctx, const gpu_train_options *o, const data_set *train, train_arg *a,
                                    fl_broadcast **out) {
  const char *symbol = model_symbol(o);
  if (strlen(symbol) >= sizeof a->model_symbol)
    return fl_set_error(FL_EINVAL, "--model %s: the symbol %s is longer than %zu bytes", o->model_library, symbol,
                        sizeof a->model_symbol - 1);
  fl_buf bytes = FL_BUF_INIT;
  fl_status s = train_model_library_read(o->model_library, symbol, sample_ndim(o), train->channels, train->height,
                                         train->width,
                                         train->classes, o->seed, &bytes, NULL, NULL);
  if (s == FL_OK) s = fl_broadcast_create(ctx, bytes.data, bytes.len, out);
  fl_buf_free(&bytes);
  if (s != FL_OK) return s;
  a->model_library_id = fl_broadcast_id(*out);
  snprintf(a->model_symbol, sizeof a->model_symbol, "%s", symbol);
  const char *base = strrchr(o->model_library, '/');
  snprintf(a->model_library_name, sizeof a->model_library_name, "%s", base ? base + 1 : o->model_library);
  return FL_OK;
}

/* Barrier tasks: one per data-parallel rank, or per grid rank for the transformer. */
static uint32_t train_world(const gpu_train_options *o) { return gpu_train_world(o); }

/* --data imagefolder:DIR: DIR/train and DIR/val (ImageNet's layout), or DIR and --test-data
 * imagefolder:TEST, the same classes in both, each image cached with its shorter side at
 * size * 256 / 224; test images (and training images with --no-augment) resized and
 * centre-cropped to size x size once, training images augmented by the ranks each epoch
 * (train_arg.aug, set by the caller). */
static fl_status load_image_folder(fl_context *ctx, const gpu_train_options *o, const data_options *dopts,
                                   data_set *train, data_set *test) {
  fl_image_transform t = FL_IMAGE_EVAL_INIT;
  t.size = o->image_size ? o->image_size : 224;
  t.resize = (t.size * 256 + 112) / 224;
  fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
  fo.cache_size = t.resize;
  char train_dir[4096], test_dir[4096];
  snprintf(train_dir, sizeof train_dir, o->test_path ? "%s" : "%s/train", o->data_path);
  snprintf(test_dir, sizeof test_dir, o->test_path ? "%s" : "%s/val", o->test_path ? o->test_path : o->data_path);
  fl_image_classes *train_classes = NULL, *test_classes = NULL;
  fl_status s = data_image_folder(ctx, train_dir, &fo, &t, !o->no_augment, dopts, train, &train_classes);
  if (s == FL_OK) s = data_image_folder(ctx, test_dir, &fo, &t, false, dopts, test, &test_classes);
  uint32_t k = fl_image_classes_count(train_classes);
  if (s == FL_OK && fl_image_classes_count(test_classes) != k)
    s = fl_set_error(FL_EINVAL, "--data imagefolder: %u classes in %s but %u in %s", k, train_dir,
                     fl_image_classes_count(test_classes), test_dir);
  for (uint32_t c = 0; s == FL_OK && c < k; c++)
    if (strcmp(fl_image_classes_name(train_classes, c), fl_image_classes_name(test_classes, c)) != 0)
      s = fl_set_error(FL_EINVAL, "--data imagefolder: class %u is %s in %s but %s in %s", c,
                       fl_image_classes_name(train_classes, c), train_dir, fl_image_classes_name(test_classes, c),
                       test_dir);
  fl_image_classes_free(train_classes);
  fl_image_classes_free(test_classes);
  return s;
}

/* "IMAGES,LABELS" of --data idx: (10 classes). */
static fl_status load_idx_pair(fl_context *ctx, const char *spec, const data_options *dopts, data_set *out) {
  char images[4096];
  const char *comma = strchr(spec, ',');
  snprintf(images, sizeof images, "%.*s", comma ? (int)(comma - spec) : 0, spec);
  if (!comma || !images[0] || !comma[1])
    return fl_set_error(FL_EINVAL, "--data idx:%s: give the images and the labels file, IMAGES,LABELS", spec);
  return data_load_idx(ctx, images, comma + 1, 10, dopts, out);
}

/* --data libsvm: and csv:, through fl_ml_load, as one dataset with a partition per rank
 * (data_rows_pair); train and test get the samples' shape and the classes. */
static fl_status load_rows_pair(fl_context *ctx, const gpu_train_options *o, data_set *train, data_set *test,
                                fl_dataset **pair) {
  fl_ml_format format = o->data == GPU_TRAIN_LIBSVM ? FL_ML_LIBSVM : FL_ML_CSV;
  fl_ml_load_options lo = {0}; /* CSV: the label in column 0, no header, ',' */
  fl_ml_data *tr = NULL, *te = NULL;
  uint32_t classes = 0, cols = 0;
  fl_status s = fl_ml_load(ctx, o->data_path, format, &lo, &tr);
  /* The test set must have as many features as the training set (LIBSVM: its largest index). */
  if (s == FL_OK && format == FL_ML_LIBSVM) lo.num_features = tr->cols;
  if (s == FL_OK) s = fl_ml_load(ctx, o->test_path, format, &lo, &te);
  if (s == FL_OK && te->cols != tr->cols)
    s = fl_set_error(FL_EINVAL, "--test-data %s has %u features, --data %s has %u", o->test_path, te->cols,
                     o->data_path, tr->cols);
  if (s == FL_OK) s = data_rows_pair(tr, te, train_world(o), &classes, &cols, pair);
  if (s == FL_OK) {
    *train = (data_set){.images = tr->rows, .channels = 1, .height = 1, .width = cols, .classes = classes,
                        .partitions = train_world(o)};
    *test = (data_set){.images = te->rows, .channels = 1, .height = 1, .width = cols, .classes = classes,
                       .partitions = train_world(o)};
  }
  fl_ml_data_free(te);
  fl_ml_data_free(tr);
  return s;
}

/* The run's input: the training and test sets, one dataset with rank r's shares in partition r. */
static fl_status load_pair(fl_context *ctx, const gpu_train_options *o, data_set *train, data_set *test,
                           fl_dataset **pair);

static fl_status load_data(fl_context *ctx, const gpu_train_options *o, data_set *train, data_set *test) {
  data_options dopts = DATA_OPTIONS_INIT;
  dopts.partitions = train_world(o);
  dopts.norm = DATA_NORM_STANDARD; /* zero-mean inputs: see docs/gpu.md, the large-batch check */
  dopts.interleave = true; /* rank r: images r, r + R, ... (see gpu/parallel/train.h) */
  /* The transformer's ranks read runs of batch / world images, so that a replica's ranks
   * together hold its rows of each global batch in order (gpu/parallel/train_hybrid.c). */
  if (o->model == NN_TRANSFORMER) dopts.run = o->batch / train_world(o);
  fl_status s;
  if (o->data == GPU_TRAIN_IDX) {
    s = load_idx_pair(ctx, o->data_path, &dopts, train);
    if (s == FL_OK) s = load_idx_pair(ctx, o->test_path, &dopts, test);
  } else if (o->data == GPU_TRAIN_FASHION_MNIST) {
    dopts.max_images = o->max_train_images;
    s = data_fashion_mnist(ctx, o->data_dir, true, &dopts, train);
    dopts.max_images = o->max_test_images;
    if (s == FL_OK) s = data_fashion_mnist(ctx, o->data_dir, false, &dopts, test);
  } else if (o->data == GPU_TRAIN_IMAGE_FOLDER) {
    s = load_image_folder(ctx, o, &dopts, train, test);
  } else if (o->data == GPU_TRAIN_TEXT) {
    uint32_t seq = o->seq ? o->seq : GPU_TRAIN_DEFAULT_SEQ;
    s = data_load_text(ctx, o->data_path, seq, DATA_SPLIT_TRAIN, &dopts, train);
    if (s == FL_OK) s = data_load_text(ctx, o->data_path, seq, DATA_SPLIT_TEST, &dopts, test);
    /* Each rank reads runs of batch / ranks windows: fewer than a batch would leave a rank's
     * test share empty (and the test loss undefined). */
    if (s == FL_OK && (train->images < o->batch || test->images < o->batch))
      s = fl_set_error(FL_EINVAL, "text %s: %llu training and %llu test windows of %u bytes (the test ones from "
                       "the file's last tenth); each needs at least --batch %u: use a smaller --batch or --seq, or "
                       "a longer file", o->data_path, (unsigned long long)train->images,
                       (unsigned long long)test->images, seq + 1, o->batch);
  } else {
    uint64_t n_train = o->synthetic_train_images ? o->synthetic_train_images : 4ull * o->batch;
    uint64_t n_test = o->synthetic_test_images ? o->synthetic_test_images : o->batch;
    s = data_synthetic_imagenet(ctx, o->seed, 0, n_train, &dopts, train);
    if (s == FL_OK) s = data_synthetic_imagenet(ctx, o->seed, n_train, n_test, &dopts, test);
  }
  uint32_t world = train_world(o);
  if (s == FL_OK && (train->partitions != world || test->partitions != world))
    s = fl_set_error(FL_EINVAL, "%u ranks need at least %u training and test images (have %llu and %llu)", world,
                     world, (unsigned long long)train->images, (unsigned long long)test->images);
  return s;
}

/* The run's model on the client's cpu `dev`, for checks: a library's is built from its file. */
static fl_status client_model(const gpu_train_options *o, const data_set *train, fl_device *dev, nn_model **out) {
  if (o->model == NN_LIBRARY && !o->model_library)
    return train_model_build_with(o->builder, "the model builder", dev, sample_ndim(o), train->channels, train->height,
                                  train->width, train->classes, o->seed, out);
  if (o->model == NN_LIBRARY) {
    fl_buf bytes = FL_BUF_INIT;
    fl_status s = train_model_library_read(o->model_library, model_symbol(o), sample_ndim(o), train->channels,
                                           train->height,
                                           train->width, train->classes, o->seed, &bytes, dev, out);
    fl_buf_free(&bytes);
    return s;
  }
  nn_model_spec spec = {.kind = o->model, .channels = (int)train->channels, .height = (int)train->height,
                        .width = (int)train->width, .classes = (int)train->classes, .seed = o->seed};
  return nn_model_create(dev, &spec, out);
}

static fl_status load_pair(fl_context *ctx, const gpu_train_options *o, data_set *train, data_set *test,
                           fl_dataset **pair) {
  if (o->data == GPU_TRAIN_EXAMPLES) {
    const uint32_t *sh = o->sample_shape;
    *train = (data_set){.channels = sh[0], .height = sh[1], .width = sh[2], .classes = o->classes,
                        .partitions = train_world(o)};
    *test = *train;
    return data_examples_pair(o->train_examples, o->test_examples, train_world(o), sh[0], sh[1], sh[2], o->classes,
                              pair);
  }
  if (o->data == GPU_TRAIN_LIBSVM || o->data == GPU_TRAIN_CSV) return load_rows_pair(ctx, o, train, test, pair);
  fl_status s = load_data(ctx, o, train, test);
  return s == FL_OK ? data_pair(ctx, train, test, pair) : s;
}

/* --resume: reads the checkpoint file and checks it against this run's model on a cpu device
 * (the magic, the checksum, every size) before any rank starts; *epoch: the epochs it holds.
 * Errors name the file. (The options' check refused the transformer.) */
static fl_status resume_load(const gpu_train_options *o, const data_set *train, fl_buf *blob, uint32_t *epoch) {
  fl_status status = FL_OK;
  fl_device *dev = NULL;
  nn_model *model = NULL;
  optim *opt = NULL;
  checkpoint_state cs = {0};
  status = checkpoint_load_file(o->resume_path, blob);
  if (status == FL_OK) status = fl_device_open(FL_DEVICE_CPU, 0, &dev);
  if (status == FL_OK) status = client_model(o, train, dev, &model);
  if (status == FL_OK) status = optim_create_for_model(dev, &o->optim, model, &opt);
  if (status == FL_OK)
    status = checkpoint_decode(fl_buf_bytes(blob), nn_model_values(model), nn_model_buffers(model), opt, &cs);
  if (status != FL_OK) {
    char why[512]; /* fl_set_error must not read the buffer it writes */
    snprintf(why, sizeof why, "%s", fl_last_error());
    status = fl_set_error(status, "--resume %s: %s", o->resume_path, why);
    goto cleanup;
  }
  if (cs.epoch >= o->epochs) {
    status = fl_set_error(FL_EINVAL, "--resume %s: the checkpoint is after epoch %u already; --epochs %u leaves "
                          "nothing to train (give more)", o->resume_path, cs.epoch, o->epochs);
    goto cleanup;
  }
  *epoch = cs.epoch;
cleanup:
  optim_destroy(opt);
  nn_model_destroy(model);
  fl_device_close(dev);
  return status;
}

fl_status gpu_train_run_in(fl_context *ctx, const gpu_train_options *o, gpu_train_result *result) {
  if (!ctx) return fl_set_error(FL_EINVAL, "gpu_train_run_in: ctx is NULL");
  fl_status status = gpu_train_options_validate(o);
  if (status != FL_OK) return status;
  /* --plan auto: the data is laid out for the world (any grid of it reads the same), the
   * plan is chosen once its shape is known, below; until then the world is data parallel. */
  gpu_train_options planned;
  gpu_train_result plan_res = {0};
  if (o->plan_auto) {
    planned = *o;
    planned.ranks = o->plan_world;
    o = &planned;
  }
  data_set train = {0}, test = {0};
  fl_dataset *pair = NULL, *trained = NULL;
  fl_records *out = NULL;
  fl_broadcast *resume = NULL, *library = NULL;
  fl_buf resume_blob = FL_BUF_INIT;
  client_state c = {.opts = o, .curves = CURVES_INIT,
                    .in_place = o->progress && common_progress_on_terminal(fileno(o->progress))};
  fl_device *ps_dev = NULL; /* asp, ssp: the client's copy of the model */
  nn_model *ps_model = NULL;
  fl_buf ps_checkpoint = FL_BUF_INIT;
  train_ps_summary ps_sum = {0};
  fl_buf pipeline = FL_BUF_INIT;
  train_events_start(&c.events, ctx, o);
  FL_CHECK(load_pair(ctx, o, &train, &test, &pair));
  FL_CHECK(gpu_train_options_validate_shape(o, train.channels, train.height, train.width));

  bool hybrid = o->model == NN_TRANSFORMER;
  train_arg a = {.model = o->model, .device = o->device, .ranks = train_world(o), .batch = o->batch,
                 .epochs = o->epochs, .channels = train.channels, .height = train.height, .width = train.width,
                 .classes = train.classes, .seed = o->seed, .optim = o->optim, .clip_grad_norm = o->clip_grad_norm,
                 .label_smoothing = (float)o->label_smoothing, .precision = o->precision, .allreduce = o->allreduce,
                 .bucket_bytes = o->bucket_bytes, .emit_checkpoint = o->checkpoint_path != NULL,
                 .shuffle = o->shuffle, .overlap = o->overlap, .sync = o->sync, .tau = o->tau,
                 .accumulate = o->accumulate ? o->accumulate : 1, .dp = o->ranks, .tp = o->tp, .pp = o->pp,
                 .microbatches = o->microbatches, .chunks = o->chunks, .pipeline = o->schedule,
                 .recompute = o->recompute, .hidden = o->hidden, .heads = o->heads, .ffn = o->ffn,
                 .blocks = o->blocks, .dropout = (float)o->dropout, .trick = o->trick, .gpt = o->gpt,
                 .seq = o->gpt ? (o->seq ? o->seq : GPU_TRAIN_DEFAULT_SEQ) : 0,
                 .sequence_parallel = o->sequence_parallel, .recompute_selective = o->recompute_selective};
  if (o->plan_auto) {
    FL_CHECK(train_plan_choose(&planned, train.channels, train.height, train.width, train.classes, &a, &plan_res));
    /* The plan's grid passes the checks a given one would. */
    gpu_train_options check = planned;
    check.plan_auto = false;
    check.plan_world = 0;
    check.plan_memory_mb = 0;
    check.plan_max_microbatches = 0;
    FL_CHECK(gpu_train_options_validate(&check));
  }
  gpu_train_schedule(o, &a.schedule);
  a.experts = o->experts;
  gpu_train_experts(o, &a.top_k, &a.moe_every, &a.capacity_factor, &a.moe_alpha);
  a.window = o->window ? o->window : 8;
  a.vertical_sync = o->vertical_sync;
  memcpy(a.replicas, o->replicas, sizeof a.replicas);
  a.replicas_auto = o->replicas_auto;
  FL_CHECK(compress_spec_parse(o->compress, &a.compress)); /* checked by validate */
  if (o->data == GPU_TRAIN_IMAGE_FOLDER && !o->no_augment) {
    a.augment = true;
    a.aug = (fl_image_transform)FL_IMAGE_TRAIN_INIT;
    a.aug.size = train.height;
    a.aug.seed = o->seed;
  }
  a.sample_ndim = sample_ndim(o);
  if (o->builder) {
    nn_model *check = NULL;
    fl_device *cpu = NULL;
    a.builder_fn = (uint64_t)(uintptr_t)o->builder;
    a.client_pid = (int64_t)getpid();
    snprintf(a.model_library_name, sizeof a.model_library_name, "%s", "(the program's builder)");
    /* Built once here, so that a builder that fails or makes the wrong output is refused before any rank starts. */
    status = fl_device_open(FL_DEVICE_CPU, 0, &cpu);
    if (status == FL_OK)
      status = train_model_build_with(o->builder, "the model builder", cpu, a.sample_ndim, train.channels, train.height,
                                      train.width, train.classes, o->seed, &check);
    nn_model_destroy(check);
    fl_device_close(cpu);
    FL_CHECK(status);
  }
  if (o->model_library) FL_CHECK(ship_model_library(ctx, o, &train, &a, &library));
  if (o->resume_path) {
    uint32_t epoch = 0;
    FL_CHECK(resume_load(o, &train, &resume_blob, &epoch));
    FL_CHECK(fl_broadcast_create(ctx, resume_blob.data, resume_blob.len, &resume));
    fl_buf_free(&resume_blob);
    a.resume = true;
    a.resume_id = fl_broadcast_id(resume);
  }
  double t0 = common_now_s();
  train_report last;
  if (GPU_TRAIN_SYNC_IS_PS(o->sync)) {
    /* asp, ssp: the workers are ordinary tasks on the parameter servers' table, which starts
     * as the client's copy of the seeded model. */
    FL_CHECK(fl_device_open(FL_DEVICE_CPU, 0, &ps_dev));
    FL_CHECK(client_model(o, &train, ps_dev, &ps_model));
    FL_CHECK(train_ps_run(ctx, o, &a, pair, ps_model, client_on_report, &c, &last, &ps_checkpoint, &ps_sum));
  } else {
    fl_barrier_options bopts = FL_BARRIER_OPTIONS_INIT;
    bopts.gpu = o->device == FL_DEVICE_CUDA;
    bopts.on_report = client_on_report;
    bopts.user = &c;
    fl_barrier_fn rank_fn = hybrid ? gpu_train_hybrid_rank : o->trick ? gpu_train_trick_rank : gpu_train_rank;
    FL_CHECK(fl_barrier_map_partitions(pair, rank_fn, &a, sizeof a, &bopts, &trained));
    FL_CHECK(fl_collect(trained, &out));
    if (fl_records_count(out) < 1 || fl_records_get(out, 0).len != sizeof(train_report)) {
      status = fl_set_error(FL_EINTERNAL, "gpu_train: rank 0 returned no result");
      goto cleanup;
    }
    memcpy(&last, fl_records_get(out, 0).data, sizeof last);
  }
  double seconds = common_now_s() - t0;
  if (c.error != FL_OK) {
    status = fl_set_error(c.error, "gpu_train: out of memory for the curves");
    goto cleanup;
  }
  if (last.kind == REPORT_DIVERGED) {
    status = train_diverged_error(o, &last);
    goto cleanup;
  }
  if (o->csv_path) FL_CHECK(curves_write_csv(&c.curves, o->csv_path));
  if (o->svg_path) {
    char title[200], ranks[80];
    if (hybrid)
      snprintf(ranks, sizeof ranks, "dp %u x tp %u x pp %u, %s, m %u", o->ranks, o->tp, o->pp,
               pp_schedule_name(o->schedule), o->microbatches);
    else
      snprintf(ranks, sizeof ranks, "%u rank%s", o->ranks, o->ranks == 1 ? "" : "s");
    snprintf(title, sizeof title, "%s on %s, %s, batch %u, lr %g, warmup %g", nn_model_kind_name(o->model),
             gpu_train_dataset_name(o->data), ranks, o->batch, o->lr, o->warmup_epochs);
    FL_CHECK(curves_write_svg(&c.curves, title, o->svg_path));
  }
  /* Rank 0's records: its last report, [the ranks' peaks and timelines,] [the checkpoint]. */
  size_t next = 1;
  gpu_train_result res = {0};
  if (hybrid) {
    if (fl_records_count(out) < 2) {
      status = fl_set_error(FL_EINTERNAL, "gpu_train: rank 0 returned no timelines");
      goto cleanup;
    }
    train_hybrid_pipeline_json(o, fl_records_get(out, next), &pipeline);
    train_events_pipeline(&c.events, &pipeline);
    FL_CHECK(train_hybrid_finish(o, fl_records_get(out, next++), &res));
  }
  if (o->checkpoint_path && GPU_TRAIN_SYNC_IS_PS(o->sync)) {
    FL_CHECK(checkpoint_save_file(o->checkpoint_path, fl_buf_bytes(&ps_checkpoint)));
  } else if (o->checkpoint_path) {
    if (fl_records_count(out) <= next) {
      status = fl_set_error(FL_EINTERNAL, "gpu_train: rank 0 returned no checkpoint");
      goto cleanup;
    }
    FL_CHECK(checkpoint_save_file(o->checkpoint_path, fl_records_get(out, next)));
  }
  if (result) {
    double images = 0, train_secs = 0, wait = 0, upload = 0, stepping = 0;
    for (size_t i = 0; i < c.curves.count; i++) {
      const curves_row *row = &c.curves.rows[i];
      wait += row->input_wait_s;
      upload += row->upload_s;
      stepping += row->train_s;
      if (row->images_per_s > 0) {
        images += (double)last.steps_per_epoch * o->batch;
        train_secs += (double)last.steps_per_epoch * o->batch / row->images_per_s;
      }
    }
    *result = (gpu_train_result){.epochs = last.epoch, .steps = last.step, .attempts = c.attempts ? c.attempts : 1,
                                 .resumed_epoch = last.resumed_epoch,
                                 .train_loss = last.loss, .train_acc = last.acc, .test_loss = last.test_loss,
                                 .test_acc = last.test_acc, .images_per_s = train_secs > 0 ? images / train_secs : 0,
                                 .seconds = seconds, .final_lr = last.lr, .buckets = last.buckets,
                                 .tau = last.tau, .reduced_bytes = last.reduced_bytes,
                                 .bubble = last.bubble, .bubble_theory = last.bubble_theory,
                                 .stages = res.stages, .input_wait_s = wait, .upload_s = upload,
                                 .input_wait_share = stepping > 0 ? wait / stepping : 0,
                                 .max_staleness = ps_sum.max_staleness, .resumed_workers = ps_sum.resumed_workers,
                                 .worker_steps_min = ps_sum.worker_steps_min, .sent_bytes = last.sent_bytes ? last.sent_bytes : last.reduced_bytes,
                                 .link_bytes_per_s = last.link_bytes_per_s, .aux_loss = last.aux_loss,
                                 .dropped_fraction = last.dropped_fraction};
    memcpy(result->stage_peak_bytes, res.stage_peak_bytes, sizeof res.stage_peak_bytes);
    result->plan_dp = plan_res.plan_dp;
    result->plan_tp = plan_res.plan_tp;
    result->plan_pp = plan_res.plan_pp;
    result->plan_microbatches = plan_res.plan_microbatches;
    result->plan_step_s = plan_res.plan_step_s;
    memcpy(result->stage_replicas, res.stage_replicas, sizeof res.stage_replicas);
  }
cleanup:
  train_events_end(&c.events, status);
  fl_buf_free(&pipeline);
  if (c.line_open && o->progress) { /* a run that stopped mid-epoch: its error goes on a line of its own */
    fputc('\n', o->progress);
    fflush(o->progress);
  }
  fl_records_free(out);
  fl_dataset_free(trained);
  fl_buf_free(&ps_checkpoint);
  nn_model_destroy(ps_model);
  fl_device_close(ps_dev);
  fl_broadcast_destroy(resume);
  fl_broadcast_destroy(library);
  fl_buf_free(&resume_blob);
  fl_dataset_free(pair);
  data_set_free(&test);
  data_set_free(&train);
  curves_free(&c.curves);
  return status;
}

fl_status gpu_train_run(const gpu_train_options *o, gpu_train_result *result) {
  fl_status s = gpu_train_options_validate(o);
  if (s != FL_OK) return s;
  fl_context *ctx = NULL;
  /* The epoch line redrawn on a terminal stands for the stage bar, which would fight it. */
  fl_options fo = FL_OPTIONS_INIT;
  fo.no_console_progress = o->progress && common_progress_on_terminal(fileno(o->progress));
  if ((s = fl_context_open(o->master ? o->master : "local[*]", &fo, &ctx)) != FL_OK) return s;
  s = gpu_train_run_in(ctx, o, result);
  fl_context_close(ctx);
  return s;
}
