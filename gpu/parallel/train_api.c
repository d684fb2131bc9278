/*
 * gpu/parallel/train_api.c: fl_train (include/flint/train.h), the trainer of gpu/parallel/train.h
 * over datasets of example records with a builder of the caller's.
 */
#include <dlfcn.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/train.h"

fl_status fl_train(fl_context *ctx, fl_dataset *train, fl_dataset *test, int ndim, const int64_t *sample_shape,
                   uint32_t classes, fl_model_builder build, const fl_train_options *opts, fl_train_result *result) {
  common_error_clear();
  if (!ctx || !train || !test || !sample_shape || !build) return fl_set_error(FL_EINVAL, "fl_train: NULL argument");
  fl_train_options def = FL_TRAIN_OPTIONS_INIT, o = opts ? *opts : def;
  if (ndim < 1 || ndim > 3) return fl_set_error(FL_EINVAL, "fl_train: samples of %d dimensions (1 to 3)", ndim);
  gpu_train_options g = GPU_TRAIN_OPTIONS_INIT;
  g.model = NN_LIBRARY;
  g.builder = build;
  g.data = GPU_TRAIN_EXAMPLES;
  g.train_examples = train;
  g.test_examples = test;
  g.sample_ndim = (uint32_t)ndim;
  for (int i = 0; i < 3; i++) g.sample_shape[i] = 1;
  for (int i = 0; i < ndim; i++) {
    if (sample_shape[i] < 1 || sample_shape[i] > 65535)
      return fl_set_error(FL_EINVAL, "fl_train: sample dimension %d is %lld (1 to 65535)", i, (long long)sample_shape[i]);
    g.sample_shape[3 - ndim + i] = (uint32_t)sample_shape[i];
  }
  g.classes = classes;
  g.ranks = o.ranks ? o.ranks : 1;
  g.device = o.device;
  g.batch = o.batch ? o.batch : 256;
  g.epochs = o.epochs ? o.epochs : 1;
  fl_lr_schedule sched = o.schedule;
  if ((sched.batch && sched.batch != g.batch) || (sched.epochs != 0 && sched.epochs != g.epochs))
    return fl_set_error(FL_EINVAL, "fl_train: schedule.batch %u and schedule.epochs %g must be 0 or the options' "
                        "batch %u and epochs %u", sched.batch, sched.epochs, g.batch, g.epochs);
  sched.batch = g.batch;
  sched.epochs = g.epochs;
  if (sched.lr == 0) sched.lr = 0.1; /* as ranks, batch and epochs: 0 is the default */
  optim_schedule checked;
  fl_status s = optim_schedule_of(&sched, &checked);
  if (s != FL_OK) return s;
  g.lr = sched.lr;
  g.warmup_epochs = sched.warmup_epochs;
  g.decay = checked.decay;
  g.num_milestones = sched.num_milestones;
  memcpy(g.milestones, sched.milestones, sizeof(double) * (size_t)sched.num_milestones);
  g.decay_power = sched.power;
  s = optim_options_of(&o.optimizer, &g.optim);
  if (s != FL_OK) return s;
  g.accumulate = o.accumulate ? o.accumulate : 1;
  g.clip_grad_norm = o.clip_grad_norm;
  g.label_smoothing = o.label_smoothing;
  g.precision = o.precision;
  if (o.sync) {
    s = gpu_train_sync_parse(o.sync, &g.sync, &g.tau, &g.staleness);
    if (s != FL_OK) return s;
  }
  g.compress = o.compress;
  g.ps_fetch = o.ps_fetch;
  g.ps_push = o.ps_push;
  g.seed = o.seed;
  g.checkpoint_path = o.checkpoint_path;
  g.resume_path = o.resume_path;
  g.progress = o.progress;
  g.csv_path = g.svg_path = NULL;
  /* A builder in a shared library can travel to executors; one in the program serves local mode. */
  Dl_info info = {0};
  if (dladdr((void *)(uintptr_t)build, &info) && info.dli_fname && info.dli_sname && strstr(info.dli_fname, ".so")) {
    g.model_library = info.dli_fname;
    g.model_symbol = info.dli_sname;
  }
  if (!g.model_library && !fl_context_is_local(ctx))
    return fl_set_error(FL_EINVAL, "fl_train: the model builder%s%s is in the program itself: in cluster mode put it "
                        "in a shared library (as a job's functions), which is shipped to the executors",
                        info.dli_sname ? " " : "", info.dli_sname ? info.dli_sname : "");
  gpu_train_result r;
  s = gpu_train_run_in(ctx, &g, &r);
  if (s != FL_OK) return s;
  if (result)
    *result = (fl_train_result){.epochs = r.epochs, .steps = r.steps, .train_loss = r.train_loss,
                                .train_acc = r.train_acc, .test_loss = r.test_loss, .test_acc = r.test_acc,
                                .images_per_s = r.images_per_s, .seconds = r.seconds,
                                .resumed_epoch = r.resumed_epoch, .reduced_bytes = r.reduced_bytes,
                                .sent_bytes = r.sent_bytes};
  return FL_OK;
}
