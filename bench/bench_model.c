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
 *   bench_model [--json] [--full]     (--full: the accuracy rows at 5 epochs of all 60000)
 */
#define BENCH_NAME "bench_model"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench_util.h"
#include "flint/train.h"
#include "gpu/parallel/train.h"

#define DATA_DIR "/usr/share/datasets/fashion-mnist"

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
  gpu_train_result res;
  result out = {0};
  double t0 = now_s();
  if (gpu_train_run(&o, &res) != FL_OK) {
    fprintf(stderr, BENCH_NAME ": flint %s: %s\n", r->name, fl_last_error());
    return out;
  }
  return (result){res.images_per_s, res.test_acc, now_s() - t0, true};
}

static result run_torch(const char *python, const row *r) {
  result out = {0};
  if (!python) return out;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s/bench/peers/torch_fashion.py %s %u %u %llu %llu 256 0.05 1 %s", python,
           FLINT_SOURCE_DIR, r->model, r->threads, r->epochs, (unsigned long long)r->train_images,
           (unsigned long long)r->test_images, DATA_DIR);
  char line[1024];
  if (!bench_peer_line(cmd, "images_per_s", line, sizeof line)) return out;
  out.images_per_s = bench_json_number(line, "images_per_s");
  out.test_acc = bench_json_number(line, "test_acc");
  out.seconds = bench_json_number(line, "seconds");
  out.ok = true;
  return out;
}

int main(int argc, char **argv) {
  bool json = false, full = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = true;
    else if (strcmp(argv[i], "--full") == 0) full = true;
    else {
      fprintf(stderr, "usage: " BENCH_NAME " [--json] [--full]\n");
      return strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  struct stat st;
  if (stat(DATA_DIR "/train-images-idx3-ubyte.gz", &st) != 0 && stat(DATA_DIR "/train-images-idx3-ubyte", &st) != 0) {
    fprintf(stderr, BENCH_NAME ": no Fashion-MNIST in " DATA_DIR " (Debian's dataset-fashion-mnist)\n");
    return 1;
  }
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
    const row *r = &rows[i];
    result f = run_flint(r), t = run_torch(python, r);
    if (!f.ok) rc = 1;
    double ratio = f.ok && t.ok && t.images_per_s > 0 ? f.images_per_s / t.images_per_s : 0;
    if (json) {
      printf("{\"bench\": \"" BENCH_NAME "\", \"row\": \"%s\", \"threads\": %u, \"epochs\": %u, \"train_images\": %llu, "
             "\"flint_images_per_s\": %.1f, \"flint_test_acc\": %.4f, \"torch_images_per_s\": %.1f, "
             "\"torch_test_acc\": %.4f, \"ratio\": %.3f}\n",
             r->name, r->threads, r->epochs, (unsigned long long)r->train_images, f.images_per_s, f.test_acc,
             t.images_per_s, t.test_acc, ratio);
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
