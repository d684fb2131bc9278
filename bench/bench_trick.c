/*
 * bench_trick: Krizhevsky's "one weird trick" (gpu/parallel/hybrid_cnn.h) against pure data
 * parallelism of the same CNN, with every rank a thread of this program and the ranks joined
 * by host communicators over loopback (on cuda, every rank opens the same GPU as a device of
 * its own, so the host backend stages through pinned memory).
 *
 * The model is `flint train --model cnn --trick`'s on Fashion-MNIST's shape (1 x 28 x 28):
 * conv3x3 32 - relu - pool - conv3x3 64 - relu - pool (3136 features), FC 512 - 512 - 10, with
 * random images; b = 32 examples per rank, so the global batch grows with K (weak scaling,
 * as the paper's workers each take 128).
 *
 * Table "measured": mode (trick, dp) x K = 1, 2, 4; one warm-up step, then --steps steps of
 * compute_gradients + apply:
 *   - step ms: the slowest rank's step, median over the steps;
 *   - img/s: the global batch K b over it;
 *   - KiB sent: what one rank's collectives sent in a step, counted by the trainer (ring
 *     counts: all-gather (K-1) n, reduce-scatter and allreduce (K-1)/K and 2 (K-1)/K of the
 *     vector, 4 bytes a float), split into activations (the switch, the FC layers, the
 *     logits, the labels) and gradients (allreduced replicated weights).
 * Table "paper scale" (counted from the sizes, nothing run): AlexNet-like features (256 x 6 x
 * 6 = 9216), FC 4096 - 4096 - 1000, b = 128 per worker, K = 2, 4, 8: the bytes the trick and
 * data parallelism send per step and rank.
 *
 * On a host with fewer cores than ranks, the ranks share the cores: step times then say as
 * much about the host as about the method; the bytes do not depend on it.
 *
 *   bench_trick [--json] [--device cpu|cuda|all] [--steps N] [--quick]
 *
 * --quick: K = 1 and 2 only. With --json, one JSON object per row. Exit status 2 on a bad
 * option, 1 when the engine fails (its message on stderr).
 */
#define BENCH_NAME "bench_trick"
#include "bench_util.h"

#include <math.h>
#include <pthread.h>

#include "flint/gpu.h"
#include "gpu/parallel/hybrid_cnn.h"

#define MAX_RANKS 4
#define MAX_STEPS 50
#define PER_RANK 32

static const hcnn_spec fashion_spec = {.channels = 1, .height = 28, .width = 28, .conv = {32, 64}, .nconv = 2,
                                       .fc = {512, 512}, .nfc = 2, .classes = 10, .seed = 7};

typedef struct run {
  hcnn_mode mode;
  int ranks, steps;
  fl_device_kind kind;
  const float *x; /* ranks x PER_RANK images */
  const int32_t *y;
  fl_comm *comms[MAX_RANKS];
  double step_s[MAX_RANKS][MAX_STEPS];
  hcnn_bytes bytes;
  fl_status status[MAX_RANKS];
  char msg[MAX_RANKS][256];
} run;

typedef struct rank_arg {
  run *ru;
  int rank;
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *ra = p;
  run *ru = ra->ru;
  int r = ra->rank;
  fl_device *dev = NULL;
  hcnn *h = NULL;
  fl_status status = FL_OK;
  size_t img = (size_t)fashion_spec.channels * fashion_spec.height * fashion_spec.width;
  FL_CHECK(fl_device_open(ru->kind, 0, &dev));
  FL_CHECK(hcnn_create(dev, ru->ranks > 1 ? ru->comms[r] : NULL, &fashion_spec, ru->mode, NULL, &h));
  for (int s = -1; s < ru->steps; s++) {
    if (ru->ranks > 1) FL_CHECK(fl_comm_barrier(ru->comms[r]));
    double t0 = now_s();
    hcnn_stats st;
    FL_CHECK(hcnn_compute_gradients(h, ru->x + (size_t)r * PER_RANK * img, ru->y + (size_t)r * PER_RANK, PER_RANK,
                                    &st));
    FL_CHECK(hcnn_apply(h, 0.01f));
    FL_CHECK(fl_device_synchronize(dev));
    if (s >= 0) ru->step_s[r][s] = now_s() - t0;
    if (r == 0) ru->bytes = st.bytes;
  }
cleanup:
  ru->status[r] = status;
  snprintf(ru->msg[r], sizeof ru->msg[r], "%s", status != FL_OK ? fl_last_error() : "");
  hcnn_destroy(h);
  fl_device_close(dev);
  return NULL;
}

typedef struct connect_arg {
  run *ru;
  int rank;
  fl_comm_endpoint *ep;
  const char **addrs;
  fl_status status;
} connect_arg;

static void *connect_main(void *p) {
  connect_arg *c = p;
  c->status = fl_comm_host_create(c->ep, c->rank, c->ru->ranks, c->addrs, 20000, &c->ru->comms[c->rank]);
  return NULL;
}

/* Joins the run's ranks over loopback. */
static fl_status connect_ranks(run *ru) {
  if (ru->ranks == 1) return FL_OK;
  char addr_buf[MAX_RANKS][96];
  const char *addrs[MAX_RANKS];
  connect_arg ca[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  fl_status st = FL_OK;
  for (int r = 0; r < ru->ranks; r++) {
    ca[r] = (connect_arg){.ru = ru, .rank = r, .addrs = addrs};
    if (st == FL_OK) st = fl_comm_listen("127.0.0.1", &ca[r].ep);
    if (st == FL_OK) snprintf(addr_buf[r], sizeof addr_buf[r], "%s", fl_comm_endpoint_address(ca[r].ep));
    addrs[r] = addr_buf[r];
  }
  if (st != FL_OK) {
    for (int r = 0; r < ru->ranks; r++) fl_comm_endpoint_destroy(ca[r].ep);
    return st;
  }
  for (int r = 0; r < ru->ranks; r++) pthread_create(&th[r], NULL, connect_main, &ca[r]);
  for (int r = 0; r < ru->ranks; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < ru->ranks; r++)
    if (ca[r].status != FL_OK) st = ca[r].status;
  return st;
}

static fl_status measure(run *ru, double *step_s) {
  fl_status st = connect_ranks(ru);
  pthread_t th[MAX_RANKS];
  rank_arg args[MAX_RANKS];
  if (st == FL_OK) {
    for (int r = 0; r < ru->ranks; r++) {
      args[r] = (rank_arg){ru, r};
      pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < ru->ranks; r++) pthread_join(th[r], NULL);
    for (int r = 0; st == FL_OK && r < ru->ranks; r++)
      if (ru->status[r] != FL_OK) st = fl_set_error(ru->status[r], "rank %d of %d: %s", r, ru->ranks, ru->msg[r]);
  }
  for (int r = 0; r < ru->ranks; r++) {
    fl_comm_destroy(ru->comms[r]);
    ru->comms[r] = NULL;
  }
  if (st != FL_OK) return st;
  double slowest[MAX_STEPS];
  for (int s = 0; s < ru->steps; s++) {
    slowest[s] = 0;
    for (int r = 0; r < ru->ranks; r++) slowest[s] = fmax(slowest[s], ru->step_s[r][s]);
  }
  *step_s = bench_median(slowest, (size_t)ru->steps);
  return FL_OK;
}

static int run_device(fl_device_kind kind, bool json, bool quick, int steps, int cores) {
  const char *dev_name = kind == FL_DEVICE_CPU ? "cpu" : "cuda";
  size_t img = (size_t)fashion_spec.channels * fashion_spec.height * fashion_spec.width;
  size_t n = (size_t)MAX_RANKS * PER_RANK;
  float *x = malloc(n * img * sizeof *x);
  int32_t *y = malloc(n * sizeof *y);
  run *ru = calloc(1, sizeof *ru);
  if (!x || !y || !ru) {
    fprintf(stderr, BENCH_NAME ": out of memory\n");
    return 1;
  }
  uint64_t seed = 42;
  for (size_t i = 0; i < n * img; i++) { /* xorshift, uniform in [0, 1) */
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    x[i] = (float)((double)(seed >> 11) / 9007199254740992.0);
  }
  for (size_t i = 0; i < n; i++) y[i] = (int32_t)(i % (size_t)fashion_spec.classes);
  if (!json) {
    printf("%s: measured, b = %d images a rank, features %lld, %lld weights, --steps %d\n", dev_name, PER_RANK,
           (long long)hcnn_features(&fashion_spec), (long long)hcnn_weights(&fashion_spec), steps);
    printf("%-4s %-5s %2s %10s %9s %12s %12s %12s\n", "dev", "mode", "K", "step ms", "img/s", "KiB act", "KiB grad",
           "KiB sent");
  }
  int ks[] = {1, 2, 4};
  int nk = quick ? 2 : 3;
  int rc = 0;
  for (int m = 0; m < 2 && rc == 0; m++) {
    hcnn_mode mode = m == 0 ? HCNN_TRICK : HCNN_DATA_PARALLEL;
    for (int i = 0; i < nk && rc == 0; i++) {
      memset(ru, 0, sizeof *ru);
      *ru = (run){.mode = mode, .ranks = ks[i], .steps = steps, .kind = kind, .x = x, .y = y};
      double step_s;
      if (measure(ru, &step_s) != FL_OK) {
        fprintf(stderr, BENCH_NAME ": %s\n", fl_last_error());
        rc = 1;
        break;
      }
      double act = (double)ru->bytes.activations / 1024, grad = (double)ru->bytes.gradients / 1024;
      int global = ks[i] * PER_RANK;
      if (json)
        printf("{\"table\":\"measured\",\"device\":\"%s\",\"mode\":\"%s\",\"ranks\":%d,\"per_rank\":%d,"
               "\"step_ms\":%.3f,\"images_per_s\":%.1f,\"activation_bytes\":%llu,\"gradient_bytes\":%llu,"
               "\"sent_bytes\":%llu,\"oversubscribed\":%s}\n",
               dev_name, hcnn_mode_name(mode), ks[i], PER_RANK, step_s * 1e3, global / step_s,
               (unsigned long long)ru->bytes.activations, (unsigned long long)ru->bytes.gradients,
               (unsigned long long)(ru->bytes.activations + ru->bytes.gradients), ks[i] > cores ? "true" : "false");
      else
        printf("%-4s %-5s %2d %10.2f %9.0f %12.1f %12.1f %12.1f%s\n", dev_name, hcnn_mode_name(mode), ks[i],
               step_s * 1e3, global / step_s, act, grad, act + grad,
               ks[i] > cores ? "  (more ranks than cores)" : "");
      fflush(stdout);
    }
  }
  free(ru);
  free(x);
  free(y);
  if (!json) printf("\n");
  return rc;
}

/* The paper's scale, from the sizes alone. */
static void paper_rows(bool json) {
  const hcnn_spec alex = {.channels = 3, .height = 24, .width = 24, .conv = {64, 256}, .nconv = 2,
                          .fc = {4096, 4096}, .nfc = 2, .classes = 1000, .seed = 1};
  const int b = 128;
  if (!json) {
    printf("paper scale (counted from the sizes): features %lld, %lld weights, b = %d a worker\n",
           (long long)hcnn_features(&alex), (long long)hcnn_weights(&alex), b);
    printf("%2s %14s %14s %14s %8s\n", "K", "trick MiB", "  of it grads", "dp MiB", "dp/trick");
  }
  for (int k = 2; k <= 8; k *= 2) {
    hcnn_bytes t = hcnn_predict_bytes(&alex, HCNN_TRICK, k, b), d = hcnn_predict_bytes(&alex, HCNN_DATA_PARALLEL, k, b);
    double tm = (double)(t.activations + t.gradients) / (1 << 20), dm = (double)(d.activations + d.gradients) / (1 << 20);
    if (json)
      printf("{\"table\":\"paper_scale\",\"ranks\":%d,\"per_rank\":%d,\"trick_bytes\":%llu,\"trick_gradient_bytes\":%llu,"
             "\"dp_bytes\":%llu}\n",
             k, b, (unsigned long long)(t.activations + t.gradients), (unsigned long long)t.gradients,
             (unsigned long long)(d.activations + d.gradients));
    else
      printf("%2d %14.1f %14.1f %14.1f %8.1f\n", k, tm, (double)t.gradients / (1 << 20), dm, dm / tm);
  }
  if (!json) printf("\n");
}

int main(int argc, char **argv) {
  bench_device_args args = {.which = "all", .steps = 5};
  if (!bench_device_args_parse(argc, argv, MAX_STEPS, &args)) return 2;
  bool cuda = strcmp(args.which, "cpu") != 0 && fl_cuda_device_count() > 0;
  if (strcmp(args.which, "cuda") == 0 && !cuda) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no usable GPU (none found, or flint built without CUDA)\n");
    return 1;
  }
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1); /* a lost peer fails instead of hanging */
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  paper_rows(args.json);
  int rc = 0;
  if (strcmp(args.which, "cuda") != 0) rc = run_device(FL_DEVICE_CPU, args.json, args.quick, (int)args.steps, cores);
  if (rc == 0 && cuda) rc = run_device(FL_DEVICE_CUDA, args.json, args.quick, (int)args.steps, cores);
  if (rc == 0 && !cuda && !args.json && strcmp(args.which, "all") == 0) printf("(cuda: no GPU here; rows skipped)\n");
  return rc;
}
