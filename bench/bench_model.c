/*
 * bench_model: flint beside PyTorch on the same models, data, recipe and threads (issue 34).
 *
 * The models are defined through the public API (include/flint/train.h) and trained by
 * flint's data-parallel trainer on Fashion-MNIST, then the same model in PyTorch
 * (bench/peers/torch_fashion.py, run by the python3 that has torch) on the same images, back
 * to back: MLP 784-512-256-10 and CNN conv5x5(32)-pool-conv5x5(64)-pool-fc1024-fc10; SGD with
 * momentum 0.9, lr 0.05, batch 256, no weight decay, a constant rate, a shuffle each epoch.
 * Throughput rows train one epoch of a subset on 1 and 2 threads (flint: ranks, each one
 * thread; PyTorch: intra-op threads) and report training images/s; accuracy rows train
 * longer and report test accuracy. Without PyTorch the peer columns read "-".
 *
 *   bench_model [--json] [--full] [--device cpu|cuda] [--precision P]
 *     (--full: the accuracy rows at 5 epochs of all 60000)
 *
 * --device cuda (a lent GPU): the same rows on GPU 0, one rank (the 2-rank rows are left
 * out: one GPU), beside PyTorch eager on the same GPU; --precision bf16 (or tf32, fp16) runs
 * flint's products in it (flint/gpu.h) while PyTorch stays fp32, so that running the bench at
 * fp32 and at bf16 gives the speed-up and the accuracy of bf16 against fp32.
 *
 * --large-batch: the large-batch rows instead, flint alone: the CNN above on
 * Fashion-MNIST, 2 ranks in local[2], test accuracy after the same epochs at global batch 256
 * (the reference: SGD momentum 0.9, lr 0.05, constant), 8192 (SGD momentum 0.9 with a gradual
 * warmup over 2 epochs, then constant as the reference, Goyal et al.'s recipe) and 16384 and
 * 32768 (LARS as You et al.: trust coefficient 0.001, momentum 0.9, warmup over 2 epochs,
 * then polynomial decay of power 2 to 0; the trust ratio on every parameter, biases too, as
 * their paper has it), with the difference of each to the batch-256 row (target: within 1
 * point). No weight decay in any row, as in the rows above. Every row runs its rank's share of
 * a step as micro-batches of 128 (--accumulate: batch / 256 of them), the 256 row's own
 * per-rank batch, so that the device holds the same activations in every row (a batch of
 * 16384 per rank does not fit a 24 GiB machine: the CNN keeps about 0.5 MB per image).
 * LB_EPOCHS (10) epochs of the first LB_TRAIN_IMAGES (32768) training images, a multiple of
 * 32768 so that every row takes whole steps over the same images each epoch (1280, 40, 20 and
 * 10 steps), and all 10000 test images: the batch-256 row trained at about 700 images/s on the
 * 2-core machine while other work ran, which made a row about 9 minutes and the rows about 40;
 * alone on it (2026-11-28) the rows ran at 1,100 to 1,450 images/s and took 19 minutes.
 *
 * The rates were tuned briefly (2026-11-28) on scaled-down runs of the same step counts (batch
 * 2048 or 4096 on 4096 or 8192 images, 10 epochs): SGD at the linear scaling rule's peak
 * lr 0.05 x 8192 / 256 = 1.6 diverged during warmup (NaN at step 11), and peaks of 0.8, 0.4 and
 * 0.2 left the CNN (no batch norm) at chance; 0.1 trained (51% after 40 steps), so the 8192
 * row's peak is 0.1 (base 0.003125), and the rule's own rate is the last row, to show it. LARS
 * peaks of 3.2, 6.4, 12.8, 25.6 and 102 after 10 steps reached 52%, 69%, 70%, 66% (unstable)
 * and 20%, and 3.2 and 6.4 after 20 steps 69% and 72%: both LARS rows peak at 6.4 (bases 0.1
 * and 0.05, 6.4 being the linear rule's rate at 32768 from 0.05).
 *
 *   bench_model --large-batch [--json] [--epochs N] [--train-images N] [--rows R,R..]
 */
#define BENCH_NAME "bench_model"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "flint/train.h"
#include "gpu/parallel/train.h"

#define DATA_DIR "/usr/share/datasets/fashion-mnist"

/* --device and --precision: every row's. */
static fl_device_kind bench_device = FL_DEVICE_CPU;
static fl_precision bench_precision = FL_PRECISION_FP32;

static fl_status mlp(fl_model *m, uint32_t classes) {
  fl_status s = fl_model_flatten(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc1", 512, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc2", 256, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc3", (int)classes, true);
  return s;
}

static fl_status cnn(fl_model *m, uint32_t classes) {
  const fl_conv2d_options c1 = {.out_channels = 32, .kernel = 5, .padding = 2, .bias = true};
  const fl_conv2d_options c2 = {.out_channels = 64, .kernel = 5, .padding = 2, .bias = true};
  fl_status s = fl_model_conv2d(m, "conv1", &c1);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_maxpool(m, 2, 2, 0);
  if (s == FL_OK) s = fl_model_conv2d(m, "conv2", &c2);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_maxpool(m, 2, 2, 0);
  if (s == FL_OK) s = fl_model_flatten(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc1", 1024, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc2", (int)classes, true);
  return s;
}

typedef struct row {
  const char *name, *model, *what;
  uint32_t threads, epochs;
  uint64_t train_images, test_images;
} row;

typedef struct result {
  double images_per_s, test_acc, seconds;
  bool ok;
} result;

static result run_flint(const row *r) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  char master[32];
  snprintf(master, sizeof master, "local[%u]", r->threads);
  o.master = master;
  o.model = NN_LIBRARY;
  o.builder = strcmp(r->model, "mlp") == 0 ? mlp : cnn;
  o.data = GPU_TRAIN_FASHION_MNIST;
  o.ranks = r->threads;
  o.batch = 256;
  o.lr = 0.05; /* x 256 / 256 */
  o.epochs = r->epochs;
  o.decay = OPTIM_DECAY_NONE;
  o.optim.kind = OPTIM_SGD;
  o.optim.momentum = 0.9f;
  o.optim.weight_decay = 0;
  o.max_train_images = r->train_images;
  o.max_test_images = r->test_images;
  o.seed = 1;
  o.csv_path = o.svg_path = NULL;
  o.progress = NULL;
  o.device = bench_device;
  o.precision = bench_precision;
  gpu_train_result res;
  result out = {0};
  double t0 = now_s();
  if (gpu_train_run(&o, &res) != FL_OK) {
    fprintf(stderr, BENCH_NAME ": flint %s: %s\n", r->name, fl_last_error());
    return out;
  }
  return (result){res.images_per_s, res.test_acc, now_s() - t0, true};
}

/* ---- large batch ------------------------------------------------------------------------- */

/* LB_EPOCHS x LB_TRAIN_IMAGES training images a row (the header says why these). */
#define LB_EPOCHS 10 /* see the header */
#define LB_TRAIN_IMAGES 32768
#define LB_RANKS 2
#define LB_MICRO 128 /* images per rank per micro-batch */
#ifndef LB_TEST_IMAGES
#define LB_TEST_IMAGES 10000
#endif

typedef struct lb_row {
  const char *name;
  uint32_t batch;
  optim_kind optimizer;
  double lr;     /* the base rate for 256 images (the peak is lr x batch / 256) */
  double warmup; /* epochs */
  optim_decay decay;
} lb_row;

typedef struct lb_result {
  bool ok;
  double test_acc, train_loss, seconds, final_lr, peak_lr;
  uint64_t steps;
  char error[256];
} lb_result;

/* One line a row's epoch, on stderr: the run is long, and the table waits for its end. */
static void lb_on_epoch(const gpu_train_epoch *e, void *user) {
  const lb_row *r = user;
  fprintf(stderr, BENCH_NAME ": %s epoch %u/%u: train loss %.4f acc %.4f, test acc %.4f, lr %.4g, %.0f images/s, "
          "%.0f s\n", r->name, e->epoch, e->epochs, e->train_loss, e->train_acc, e->test_acc, e->lr, e->images_per_s,
          e->seconds);
}

/* A row's warmup, within a shorter run's epochs (--epochs) too. */
static double lb_warmup(const lb_row *r, uint32_t epochs) { return r->warmup < epochs ? r->warmup : 0.2 * epochs; }

static lb_result lb_run(const lb_row *r, uint32_t epochs, uint64_t train_images) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  char master[32];
  snprintf(master, sizeof master, "local[%u]", LB_RANKS);
  o.master = master;
  o.model = NN_LIBRARY;
  o.builder = cnn;
  o.data = GPU_TRAIN_FASHION_MNIST;
  o.ranks = LB_RANKS;
  o.batch = r->batch;
  o.accumulate = r->batch / (LB_RANKS * LB_MICRO);
  o.lr = r->lr;
  o.warmup_epochs = lb_warmup(r, epochs);
  o.epochs = epochs;
  o.decay = r->decay;
  o.optim.kind = r->optimizer;
  o.optim.momentum = 0.9f;
  o.optim.weight_decay = 0;
  o.optim.trust_coef = 0.001f;
  o.optim.decay_all = r->optimizer == OPTIM_LARS; /* You et al.: every layer's own rate */
  o.max_train_images = train_images;
  o.max_test_images = LB_TEST_IMAGES;
  o.seed = 1;
  o.csv_path = o.svg_path = NULL;
  o.progress = NULL;
  o.on_epoch = lb_on_epoch;
  o.user = (void *)r;
  optim_schedule sched;
  gpu_train_schedule(&o, &sched);
  lb_result out = {.peak_lr = optim_schedule_peak_lr(&sched)};
  gpu_train_result res;
  double t0 = now_s();
  if (gpu_train_run(&o, &res) != FL_OK) {
    snprintf(out.error, sizeof out.error, "%s", fl_last_error());
    fprintf(stderr, BENCH_NAME ": %s: %s\n", r->name, out.error);
    out.seconds = now_s() - t0;
    return out;
  }
  out.ok = true;
  out.test_acc = res.test_acc;
  out.train_loss = res.train_loss;
  out.steps = res.steps;
  out.final_lr = res.final_lr;
  out.seconds = now_s() - t0;
  return out;
}

static int lb_main(bool json, uint32_t epochs, uint64_t train_images, const char *only) {
  /* The rates are the tuned ones of the header; the rule's own rate for 8192 goes last. */
  const lb_row rows[] = {
      {"batch_256", 256, OPTIM_SGD, 0.05, 0, OPTIM_DECAY_NONE},
      {"batch_8192_sgd", 8192, OPTIM_SGD, 0.003125, 2, OPTIM_DECAY_NONE},
      {"batch_16384_lars", 16384, OPTIM_LARS, 0.1, 2, OPTIM_DECAY_POLY},
      {"batch_32768_lars", 32768, OPTIM_LARS, 0.05, 2, OPTIM_DECAY_POLY},
      {"batch_8192_rule", 8192, OPTIM_SGD, 0.05, 2, OPTIM_DECAY_NONE},
  };
  const size_t n = sizeof rows / sizeof *rows;
  if (!json)
    printf("large batch: cnn on Fashion-MNIST, %u ranks (local[%u]), %u epochs of %llu training images, 10000 test "
           "images, micro-batches of %u per rank\n%-18s %6s %9s %16s %6s %6s %6s %9s %9s %8s\n", LB_RANKS, LB_RANKS,
           epochs, (unsigned long long)train_images, LB_MICRO, "row", "batch", "optimizer", "lr (peak)", "warmup",
           "accum", "steps", "test acc", "diff", "minutes");
  int rc = 0;
  double ref = NAN;
  for (size_t i = 0; i < n; i++) {
    const lb_row *r = &rows[i];
    if (only && !strstr(only, r->name)) continue;
    if (train_images < r->batch) {
      fprintf(stderr, BENCH_NAME ": %s: --train-images %llu is less than its batch %u: skipped\n", r->name,
              (unsigned long long)train_images, r->batch);
      continue;
    }
    lb_result f = lb_run(r, epochs, train_images);
    /* A row that diverges is a result (the recipe's rate is too high), not a failure. */
    bool diverged = !f.ok && strstr(f.error, "training diverged");
    if (!f.ok && !diverged) rc = 1;
    if (i == 0 && f.ok) ref = f.test_acc;
    double diff = f.ok && !isnan(ref) ? f.test_acc - ref : NAN;
    uint32_t accum = r->batch / (LB_RANKS * LB_MICRO);
    if (json) {
      printf("{\"bench\": \"" BENCH_NAME "\", \"row\": \"%s\", \"batch\": %u, \"optimizer\": \"%s\", \"lr\": %g, "
             "\"peak_lr\": %g, \"warmup_epochs\": %g, \"decay\": \"%s\", \"accumulate\": %u, \"epochs\": %u, "
             "\"train_images\": %llu, \"steps\": %llu, \"ok\": %s, \"diverged\": %s, \"test_acc\": %.4f, \"diff_to_256\": %.4f, "
             "\"seconds\": %.1f}\n",
             r->name, r->batch, optim_kind_name(r->optimizer), r->lr, f.peak_lr, lb_warmup(r, epochs), optim_decay_name(r->decay),
             accum, epochs, (unsigned long long)train_images, (unsigned long long)f.steps, f.ok ? "true" : "false",
             diverged ? "true" : "false",
             f.ok ? f.test_acc : 0, isnan(diff) ? 0 : diff, f.seconds);
    } else {
      char lr[32], acc[16], d[16] = "-";
      snprintf(acc, sizeof acc, "%s", diverged ? "diverged" : "failed");
      snprintf(lr, sizeof lr, "%g (%g)", r->lr, f.peak_lr);
      if (f.ok) snprintf(acc, sizeof acc, "%.4f", f.test_acc);
      if (!isnan(diff)) snprintf(d, sizeof d, "%+.2f pt", 100 * diff);
      printf("%-18s %6u %9s %16s %6g %6u %6llu %9s %9s %8.1f\n", r->name, r->batch, optim_kind_name(r->optimizer), lr,
             lb_warmup(r, epochs), accum, (unsigned long long)f.steps, acc, d, f.seconds / 60);
      if (!f.ok) printf("  (%s)\n", f.error);
    }
    fflush(stdout);
  }
  return rc;
}

static result run_torch(const char *python, const row *r) {
  result out = {0};
  if (!python) return out;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s/bench/peers/torch_fashion.py %s %u %u %llu %llu 256 0.05 1 %s %s", python,
           FLINT_SOURCE_DIR, r->model, r->threads, r->epochs, (unsigned long long)r->train_images,
           (unsigned long long)r->test_images, DATA_DIR, bench_device == FL_DEVICE_CUDA ? "cuda" : "cpu");
  char line[1024];
  if (!bench_peer_line(cmd, "images_per_s", line, sizeof line)) return out;
  out.images_per_s = bench_json_number(line, "images_per_s");
  out.test_acc = bench_json_number(line, "test_acc");
  out.seconds = bench_json_number(line, "seconds");
  out.ok = true;
  return out;
}

static const char usage_text[] =
    "usage: " BENCH_NAME " [--json] [--full] [--device cpu|cuda] [--precision fp32|tf32|bf16|fp16]\n"
    "       " BENCH_NAME " --large-batch [--json] [--epochs N] [--train-images N] [--rows NAME,..]\n"
    "  --large-batch     the cnn at global batch 256, 8192 (SGD, warmup), 16384 and 32768 (LARS) on\n"
    "                    2 ranks, gradient accumulation in micro-batches of 128 per rank, and 8192 at\n"
    "                    the linear scaling rule's rate: test accuracy and its difference to batch\n"
    "                    256 after the same epochs (default 10 epochs of 32768 training images, all\n"
    "                    10000 test images: 20 to 40 minutes on 2 cores)\n"
    "  --epochs N, --train-images N, --rows batch_256,...  a smaller run (with --large-batch)\n";

int main(int argc, char **argv) {
  bool json = false, full = false, large = false;
  uint64_t epochs = LB_EPOCHS, train_images = LB_TRAIN_IMAGES;
  const char *only = NULL;
  bool sized = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = true;
    else if (strcmp(argv[i], "--full") == 0) full = true;
    else if (strcmp(argv[i], "--large-batch") == 0) large = true;
    else if (strcmp(argv[i], "--epochs") == 0 && i + 1 < argc && parse_count(argv[i + 1], 1000, &epochs)) i++, sized = true;
    else if (strcmp(argv[i], "--train-images") == 0 && i + 1 < argc && parse_count(argv[i + 1], 60000, &train_images))
      i++, sized = true;
    else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) only = argv[++i], sized = true;
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc && (strcmp(argv[i + 1], "cpu") == 0 ||
                                                                  strcmp(argv[i + 1], "cuda") == 0))
      bench_device = strcmp(argv[++i], "cuda") == 0 ? FL_DEVICE_CUDA : FL_DEVICE_CPU;
    else if (strcmp(argv[i], "--precision") == 0 && i + 1 < argc && fl_precision_parse(argv[i + 1], &bench_precision) == FL_OK)
      i++;
    else {
      fputs(usage_text, stderr);
      return strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  if (bench_precision != FL_PRECISION_FP32 && bench_device != FL_DEVICE_CUDA) {
    fprintf(stderr, BENCH_NAME ": --precision %s needs --device cuda (the cpu multiplies in fp32)\n",
            fl_precision_name(bench_precision));
    return 2;
  }
  if (bench_device == FL_DEVICE_CUDA && fl_cuda_device_count() == 0) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no usable GPU here\n");
    return 1;
  }
  if (large && bench_device != FL_DEVICE_CPU) {
    fprintf(stderr, BENCH_NAME ": --large-batch runs on the cpu (scripts/gpu-check has the GPU's large-batch runs)\n");
    return 2;
  }
  if (sized && !large) {
    fprintf(stderr, BENCH_NAME ": --epochs, --train-images and --rows are for --large-batch\n%s", usage_text);
    return 2;
  }
  struct stat st;
  if (stat(DATA_DIR "/train-images-idx3-ubyte.gz", &st) != 0 && stat(DATA_DIR "/train-images-idx3-ubyte", &st) != 0) {
    fprintf(stderr, BENCH_NAME ": no Fashion-MNIST in " DATA_DIR " (Debian's dataset-fashion-mnist)\n");
    return 1;
  }
  if (large) return lb_main(json, (uint32_t)epochs, train_images, only);
  const row rows[] = {
      {"mlp_throughput_1", "mlp", "throughput", 1, 1, 15360, 1000},
      {"mlp_throughput_2", "mlp", "throughput", 2, 1, 15360, 1000},
      {"cnn_throughput_1", "cnn", "throughput", 1, 1, 3072, 1000},
      {"cnn_throughput_2", "cnn", "throughput", 2, 1, 3072, 1000},
      {"mlp_accuracy", "mlp", "accuracy", 2, 5, full ? 60000 : 20480, 10000},
      {"cnn_accuracy", "cnn", "accuracy", 2, full ? 5 : 1, full ? 60000 : 10240, 10000},
  };
  const char *python = bench_torch_python();
  if (!json) {
    printf("%-18s %7s %6s %8s | %11s %11s %6s | %8s %8s %7s\n", "row", "threads", "epochs", "images", "flint img/s",
           "torch img/s", "ratio", "flint acc", "torch acc", "diff");
    if (!python) printf("(PyTorch not found: install it with scripts/setup-peers; peer columns read -)\n");
  }
  int rc = 0;
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    row one = rows[i];
    const row *r = &one;
    if (bench_device == FL_DEVICE_CUDA) { /* one GPU: one rank */
      if (one.threads > 1 && strcmp(one.what, "throughput") == 0) continue;
      one.threads = 1;
    }
    result f = run_flint(r), t = run_torch(python, r);
    if (!f.ok) rc = 1;
    double ratio = f.ok && t.ok && t.images_per_s > 0 ? f.images_per_s / t.images_per_s : 0;
    if (json) {
      printf("{\"bench\": \"" BENCH_NAME "\", \"row\": \"%s\", \"device\": \"%s\", \"precision\": \"%s\", "
             "\"threads\": %u, \"epochs\": %u, \"train_images\": %llu, "
             "\"flint_images_per_s\": %.1f, \"flint_test_acc\": %.4f, \"torch_images_per_s\": %.1f, "
             "\"torch_test_acc\": %.4f, \"ratio\": %.3f}\n",
             r->name, bench_device == FL_DEVICE_CUDA ? "cuda" : "cpu", fl_precision_name(bench_precision), r->threads,
             r->epochs, (unsigned long long)r->train_images, f.images_per_s, f.test_acc, t.images_per_s, t.test_acc,
             ratio);
    } else {
      char tips[16] = "-", rat[16] = "-", tacc[16] = "-", diff[16] = "-";
      if (t.ok) {
        snprintf(tips, sizeof tips, "%.0f", t.images_per_s);
        snprintf(rat, sizeof rat, "%.2f", ratio);
        snprintf(tacc, sizeof tacc, "%.4f", t.test_acc);
        snprintf(diff, sizeof diff, "%+.4f", f.test_acc - t.test_acc);
      }
      printf("%-18s %7u %6u %8llu | %11.0f %11s %6s | %8.4f %8s %7s\n", r->name, r->threads, r->epochs,
             (unsigned long long)r->train_images, f.images_per_s, tips, rat, f.test_acc, tacc, diff);
    }
    fflush(stdout);
  }
  return rc;
}
