/*
 * bench_train: images per second of one synchronous training step (zero grads, forward,
 * softmax cross-entropy, backward, SGD with momentum) for each model and batch size, on the
 * cpu device and on GPU 0 when there is one.
 *
 * Beside each cpu ResNet row, the same network in PyTorch on one thread (bench/peers/
 * torch_resnet.py, when scripts/setup-peers installed it), back to back; "-" without it.
 *
 * Besides throughput, a second pass measures where the step's time goes: every GEMM is
 * bracketed by a device synchronize and timed on the host, and the row reports the GEMM
 * (cuBLAS on cuda, OpenBLAS sgemm on cpu) share of that pass's step time. The
 * synchronizes slow that pass a little, so the share is a slight overestimate; the
 * throughput figures come from the first pass, which has none.
 *
 * On cuda each row runs twice, with fp32 products and with bf16 ones (fl_device_set_precision:
 * 16-bit inputs on the tensor cores, fp32 accumulation; the "prec" column), back to back.
 *
 *   bench_train [--json] [--device cpu|cuda|all] [--steps N] [--quick]
 */
#define BENCH_NAME "bench_train"
#include "bench_util.h"

#include <math.h>

#include "gpu/device/device.h"
#include "gpu/nn/nn.h"

typedef struct config {
  nn_model_kind model;
  int channels, size, classes;
  int batch;
  const char *input; /* what the images stand for */
} config;

/* Fashion-MNIST-sized inputs for the small models; ImageNet-sized for ResNet-18 on a GPU,
 * CIFAR-sized on the cpu, where 224 x 224 would take minutes a step on two cores. */
static const config cpu_configs[] = {
    {NN_MLP, 1, 28, 10, 64, "28x28"},      {NN_MLP, 1, 28, 10, 256, "28x28"},
    {NN_CNN, 1, 28, 10, 32, "28x28"},      {NN_CNN, 1, 28, 10, 128, "28x28"},
    {NN_RESNET18, 3, 32, 10, 16, "32x32"}, {NN_RESNET18, 3, 32, 10, 64, "32x32"},
    {NN_RESNET50, 3, 32, 10, 16, "32x32"}, {NN_RESNET18, 3, 224, 1000, 8, "224x224"},
    {NN_RESNET50, 3, 224, 1000, 4, "224x224"},
};
static const config quick_configs[] = {
    {NN_MLP, 1, 28, 10, 64, "28x28"},
    {NN_CNN, 1, 28, 10, 32, "28x28"},
    {NN_RESNET18, 3, 32, 10, 8, "32x32"},
};
static const config cuda_configs[] = {
    {NN_MLP, 1, 28, 10, 256, "28x28"},        {NN_MLP, 1, 28, 10, 8192, "28x28"},
    {NN_CNN, 1, 28, 10, 256, "28x28"},        {NN_CNN, 1, 28, 10, 8192, "28x28"},
    {NN_RESNET18, 3, 224, 1000, 32, "224x224"}, {NN_RESNET18, 3, 224, 1000, 128, "224x224"},
};

/* ---- the GEMM timer: the device's ops with gemm wrapped -------------------------------- */
static const device_ops *timed_inner;
static double timed_gemm_s;

static fl_status timed_gemm(fl_device *dev, bool ta, bool tb, int m, int n, int k, float alpha,
                            const float *a, int lda, const float *b, int ldb, float beta, float *c,
                            int ldc) {
  fl_status st = timed_inner->synchronize(dev);
  if (st != FL_OK) return st;
  double t0 = now_s();
  st = timed_inner->gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st == FL_OK) st = timed_inner->synchronize(dev);
  timed_gemm_s += now_s() - t0;
  return st;
}

typedef struct result {
  double images_per_s, step_ms, gemm_share;
  size_t params;
  double torch_images_per_s; /* the PyTorch peer's, on cpu ResNet rows; 0: none */
} result;

/* The same ResNet step in PyTorch on one thread (bench/peers/torch_resnet.py); 0 without it. */
static double torch_resnet_images_per_s(const config *c, int steps) {
  static const char *python;
  static bool looked;
  if (!looked) {
    python = bench_torch_python();
    looked = true;
  }
  if (!python || (c->model != NN_RESNET18 && c->model != NN_RESNET50)) return 0;
  char cmd[1024], line[1024];
  snprintf(cmd, sizeof cmd, "%s %s/bench/peers/torch_resnet.py %s %d %d %d %d %d 1", python, FLINT_SOURCE_DIR,
           nn_model_kind_name(c->model), c->size, c->channels, c->classes, c->batch, steps);
  return bench_peer_line(cmd, "images_per_s", line, sizeof line) ? bench_json_number(line, "images_per_s") : 0;
}

typedef struct step_state {
  fl_device *dev;
  nn_model *model;
  fl_tensor *images;
  int32_t *labels; /* device */
  float *stats;    /* device, 2 floats */
  fl_tensor *velocity;
} step_state;

static fl_status train_step(step_state *s, int batch) {
  fl_device *dev = s->dev;
  const fl_tensor *logits;
  fl_tensor *values = nn_model_values(s->model), *grads = nn_model_grads(s->model);
  fl_status st = nn_model_zero_grad(s->model);
  if (st == FL_OK) st = nn_model_forward(s->model, s->images, true, &logits);
  if (st == FL_OK) st = nn_model_loss(s->model, s->labels, 1.0f / (float)batch, s->stats);
  if (st == FL_OK) st = nn_model_backward(s->model, NULL, NULL);
  if (st == FL_OK)
    st = dev->ops->sgd_step(dev, values->numel, 0.01f, 0.9f, 1e-4f, false, grads->data,
                            s->velocity->data, values->data);
  return st;
}

/* Builds the model and a random batch, then times `steps` steps after two warm-ups. */
static fl_status run_config(fl_device *dev, const config *c, int steps, result *out) {
  step_state s = {.dev = dev};
  nn_model_spec spec = {.kind = c->model, .channels = c->channels, .height = c->size,
                        .width = c->size, .classes = c->classes, .seed = 42};
  int64_t shape[4] = {c->batch, c->channels, c->size, c->size};
  size_t pixels = (size_t)c->batch * (size_t)c->channels * (size_t)c->size * (size_t)c->size;
  float *host = malloc(pixels * sizeof *host);
  int32_t *host_labels = malloc((size_t)c->batch * sizeof *host_labels);
  fl_status st = host && host_labels ? FL_OK : fl_set_error(FL_ENOMEM, "batch of %zu pixels", pixels);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; st == FL_OK && i < pixels; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    host[i] = (float)((double)(x >> 11) * 0x1.0p-53) - 0.5f;
  }
  for (int i = 0; host_labels && i < c->batch; i++) host_labels[i] = i % c->classes;

  if (st == FL_OK) st = nn_model_create(dev, &spec, &s.model);
  if (st == FL_OK) st = fl_tensor_create(dev, 4, shape, &s.images);
  if (st == FL_OK) st = fl_tensor_write(s.images, host, pixels);
  if (st == FL_OK) st = dev->ops->alloc(dev, (size_t)c->batch * sizeof(int32_t), (void **)&s.labels);
  if (st == FL_OK)
    st = dev->ops->from_host(dev, s.labels, host_labels, (size_t)c->batch * sizeof(int32_t));
  if (st == FL_OK) st = dev->ops->alloc(dev, 2 * sizeof(float), (void **)&s.stats);
  if (st == FL_OK) {
    int64_t n = (int64_t)nn_model_values(s.model)->numel;
    st = fl_tensor_create(dev, 1, &n, &s.velocity);
  }
  for (int i = 0; st == FL_OK && i < 2; i++) st = train_step(&s, c->batch);
  if (st == FL_OK) st = dev->ops->synchronize(dev);

  double t0 = now_s();
  for (int i = 0; st == FL_OK && i < steps; i++) st = train_step(&s, c->batch);
  if (st == FL_OK) st = dev->ops->synchronize(dev);
  double plain_s = (now_s() - t0) / steps;

  /* The profiling pass: the same steps with every GEMM synchronized and timed. */
  device_ops timed = *dev->ops;
  timed.gemm = timed_gemm;
  timed_inner = dev->ops;
  timed_gemm_s = 0;
  dev->ops = &timed;
  t0 = now_s();
  for (int i = 0; st == FL_OK && i < steps; i++) st = train_step(&s, c->batch);
  if (st == FL_OK) st = timed.synchronize(dev);
  double profiled_s = now_s() - t0;
  dev->ops = timed_inner;

  if (st == FL_OK) {
    out->images_per_s = c->batch / plain_s;
    out->step_ms = plain_s * 1e3;
    out->gemm_share = timed_gemm_s / profiled_s;
    out->params = nn_model_values(s.model)->numel;
  }
  if (s.stats) dev->ops->free(dev, s.stats);
  if (s.labels) dev->ops->free(dev, s.labels);
  fl_tensor_destroy(s.velocity);
  fl_tensor_destroy(s.images);
  nn_model_destroy(s.model);
  free(host_labels);
  free(host);
  return st;
}

static int run_device(fl_device_kind kind, bool json, int steps, bool quick) {
  fl_device *dev;
  if (fl_device_open(kind, 0, &dev) != FL_OK) {
    fail_flint("fl_device_open");
    return 1;
  }
  const config *configs = kind == FL_DEVICE_CUDA ? cuda_configs : quick ? quick_configs : cpu_configs;
  size_t n = kind == FL_DEVICE_CUDA ? sizeof cuda_configs / sizeof *cuda_configs
             : quick               ? sizeof quick_configs / sizeof *quick_configs
                                   : sizeof cpu_configs / sizeof *cpu_configs;
  /* cuda: fp32, then bf16 on GPUs whose tensor cores take it. */
  fl_precision precisions[2] = {FL_PRECISION_FP32, FL_PRECISION_BF16};
  int nprec = kind == FL_DEVICE_CUDA && fl_device_set_precision(dev, FL_PRECISION_BF16) == FL_OK ? 2 : 1;
  int rc = 0;
  for (size_t i = 0; i < n * (size_t)nprec; i++) {
    const config *c = &configs[i / (size_t)nprec];
    fl_precision prec = precisions[i % (size_t)nprec];
    if (fl_device_set_precision(dev, prec) != FL_OK) {
      fail_flint("fl_device_set_precision");
      return 1;
    }
    result r = {0};
    /* Large models on the cpu take a step or more a second: fewer steps keep it short. */
    bool resnet = c->model == NN_RESNET18 || c->model == NN_RESNET50;
    int k = kind == FL_DEVICE_CPU && resnet ? (steps + 3) / 4 : steps;
    if (run_config(dev, c, k, &r) != FL_OK) {
      fprintf(stderr, BENCH_NAME ": %s %s batch %d on %s (%s): %s\n", nn_model_kind_name(c->model),
              c->input, c->batch, fl_device_name(dev), fl_precision_name(prec), fl_last_error());
      rc = 1;
      continue;
    }
    r.torch_images_per_s = kind == FL_DEVICE_CPU ? torch_resnet_images_per_s(c, k) : 0;
    char torch[16] = "-", ratio[16] = "-";
    if (r.torch_images_per_s > 0) {
      snprintf(torch, sizeof torch, "%.1f", r.torch_images_per_s);
      snprintf(ratio, sizeof ratio, "%.2f", r.images_per_s / r.torch_images_per_s);
    }
    if (json)
      printf("{\"device\":\"%s\",\"model\":\"%s\",\"input\":\"%s\",\"batch\":%d,\"precision\":\"%s\","
             "\"params\":%zu,\"images_per_s\":%.1f,\"step_ms\":%.3f,\"gemm_share\":%.3f,"
             "\"torch_images_per_s\":%.1f}\n",
             kind == FL_DEVICE_CUDA ? "cuda" : "cpu", nn_model_kind_name(c->model), c->input, c->batch,
             fl_precision_name(prec), r.params, r.images_per_s, r.step_ms, r.gemm_share, r.torch_images_per_s);
    else
      printf("%-5s %-9s %-8s %6d %-4s %10zu %12.1f %10.2f %9.1f%% %11s %6s\n",
             kind == FL_DEVICE_CUDA ? "cuda" : "cpu", nn_model_kind_name(c->model), c->input, c->batch,
             fl_precision_name(prec), r.params, r.images_per_s, r.step_ms, 100.0 * r.gemm_share, torch, ratio);
    fflush(stdout);
  }
  if (!json) printf("(%s)\n", fl_device_name(dev));
  fl_device_close(dev);
  return rc;
}

int main(int argc, char **argv) {
  bench_device_args args = {.which = "all", .steps = 10};
  if (!bench_device_args_parse(argc, argv, 100000, &args)) return 2;
  bool json = args.json, quick = args.quick;
  const char *which = args.which;
  uint64_t steps = args.steps;
  if (!json)
    printf("%-5s %-9s %-8s %6s %-4s %10s %12s %10s %10s %11s %6s\n", "dev", "model", "input", "batch", "prec",
           "params", "images/s", "step ms", "gemm", "torch img/s", "ratio");
  int rc = 0;
  if (strcmp(which, "cuda") != 0) rc |= run_device(FL_DEVICE_CPU, json, (int)steps, quick);
  if (strcmp(which, "cpu") != 0) {
    if (fl_cuda_device_count() > 0)
      rc |= run_device(FL_DEVICE_CUDA, json, (int)steps, quick);
    else if (strcmp(which, "cuda") == 0) {
      fprintf(stderr, BENCH_NAME ": no usable GPU (%s)\n",
              fl_cuda_device_count() == 0 ? "none found, or flint built without CUDA" : "");
      rc = 1;
    } else if (!json)
      printf("(cuda: no GPU here; rows skipped)\n");
  }
  return rc;
}
