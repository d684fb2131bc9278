/*
 * bench_moe: expert parallelism (issue 38) of the mixture-of-experts model
 * (gpu/parallel/moe_model.h), on the cpu device and, when a GPU is usable, on the cuda
 * device, every rank a thread of this program, joined by host communicators over loopback
 * (the host backend, not NCCL; on cuda every rank opens GPU 0 as a device of its own).
 *
 * Rows: the same model (features 32, hidden 128, E = 8 experts of ffn 256, 10 classes,
 * capacity factor 1.25, alpha 0.01) and the same global batch of 2048 tokens, trained with
 * the experts on ep = 1, 2 and 4 ranks (each rank feeding 2048 / ep tokens as one routing
 * group), for top-1 and top-2 gating; beside them the dense baseline of the same active
 * size: the model with one expert of ffn k * 256 (what one token runs through), which routes
 * trivially and drops nothing. Per row, after one warm-up, --steps measured training steps
 * (forward, backward, the replicated gradients' allreduce, SGD):
 *   - tokens/s: the global batch over the step time (the slowest rank's, median over steps);
 *   - a2a MB/step: the all-to-all bytes one rank sends to others per step (four exchanges
 *     of its [E, capacity, hidden] buffer, minus the 1/ep it keeps), moe_alltoall_bytes;
 *   - dropped: the fraction of expert choices over capacity, last step.
 * Ranks beyond the host's cores share them: such rows say as much about the host as about
 * the method (printed as oversubscribed).
 *
 *   bench_moe [--json] [--device cpu|cuda|all] [--steps N] [--quick]
 *
 * --quick: a batch of 512 tokens. With --json, one JSON object per row. Exit status 2 on a
 * bad option, 1 when the engine fails (its message on stderr).
 */
#define BENCH_NAME "bench_moe"
#include "bench_util.h"

#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "flint/gpu.h"
#include "gpu/device/device.h"
#include "gpu/parallel/moe_model.h"
#include "bench_ranks.h"

#define MAX_RANKS 4
#define MAX_STEPS 50
#define FEATURES 32
#define CLASSES 10

/* ---- one row ------------------------------------------------------------------------------ */

static fl_device *rank_dev[MAX_RANKS];
static const char *dev_name;

typedef struct run {
  moe_model_spec spec;
  int ep, tokens, steps; /* tokens: the global batch */
  const float *x;
  const int32_t *y;
  double step_s[MAX_RANKS][MAX_STEPS];
  int dropped[MAX_RANKS];
} run;

static fl_status train_rank(void *arg, int rank, fl_comm *comm) {
  run *ru = arg;
  fl_device *d = rank_dev[rank];
  moe_model *m = NULL;
  fl_tensor x = {0};
  int32_t *labels = NULL;
  const int rows = ru->tokens / ru->ep;
  fl_status status = FL_OK;
  FL_CHECK(moe_model_create(d, &ru->spec, ru->ep > 1 ? comm : NULL, &m));
  int64_t shape[2] = {rows, FEATURES};
  FL_CHECK(tensor_ensure(&x, d, 2, shape));
  FL_CHECK(d->ops->from_host(d, x.data, ru->x + (size_t)rank * rows * FEATURES,
                             x.numel * sizeof(float)));
  FL_CHECK(d->ops->alloc(d, (size_t)rows * sizeof *labels, (void **)&labels));
  FL_CHECK(d->ops->from_host(d, labels, ru->y + (size_t)rank * rows, (size_t)rows * sizeof *labels));
  for (int i = 0; i <= ru->steps; i++) {
    moe_model_stats s;
    if (ru->ep > 1) FL_CHECK(fl_comm_barrier(comm));
    double t0 = now_s();
    FL_CHECK(moe_model_train_step(m, &x, labels, 1, 1.0f / ru->tokens, 1.0f / ru->ep, 0.01f, &s));
    FL_CHECK(fl_device_synchronize(d));
    if (i > 0) ru->step_s[rank][i - 1] = now_s() - t0; /* step 0 warms up */
    ru->dropped[rank] = s.dropped;
  }
cleanup:
  if (labels) d->ops->free(d, labels);
  tensor_release(&x);
  moe_model_destroy(m);
  return status;
}

/* One row; k: the top_k column (the dense baseline's is the k whose active size it has). */
static fl_status row(world *worlds, const char *kind, const moe_config *moe, int k, int ep,
                     int tokens, int steps, int cores, const float *x, const int32_t *y,
                     bool json) {
  run *ru = calloc(1, sizeof *ru);
  if (!ru) return fl_set_error(FL_ENOMEM, "a run's results");
  ru->spec = (moe_model_spec){.features = FEATURES, .classes = CLASSES, .moe = *moe, .seed = 7};
  ru->ep = ep, ru->tokens = tokens, ru->steps = steps, ru->x = x, ru->y = y;
  fl_status st = run_ranks(ep, worlds[ep].comms, train_rank, ru);
  if (st == FL_OK) {
    double slowest[MAX_STEPS];
    for (int i = 0; i < steps; i++) {
      slowest[i] = 0;
      for (int r = 0; r < ep; r++) slowest[i] = fmax(slowest[i], ru->step_s[r][i]);
    }
    double step_s = bench_median(slowest, (size_t)steps);
    int dropped = 0;
    for (int r = 0; r < ep; r++) dropped += ru->dropped[r];
    double drop_frac = (double)dropped / ((double)tokens * moe->top_k);
    double a2a_mb = (double)moe_alltoall_bytes(moe, ep, tokens / ep, 1) / 1e6;
    int cap = moe_capacity(moe, tokens / ep);
    if (json)
      printf("{\"table\":\"moe\",\"device\":\"%s\",\"kind\":\"%s\",\"top_k\":%d,\"experts\":%d,"
             "\"ffn\":%d,\"hidden\":%d,\"ep\":%d,\"tokens\":%d,\"capacity\":%d,\"step_ms\":%.3f,"
             "\"tokens_per_s\":%.1f,\"alltoall_bytes_per_step\":%zu,\"dropped\":%.4f,"
             "\"oversubscribed\":%s}\n",
             dev_name, kind, k, moe->experts, moe->ffn, moe->hidden, ep, tokens, cap,
             step_s * 1e3, tokens / step_s, moe_alltoall_bytes(moe, ep, tokens / ep, 1), drop_frac,
             ep > cores ? "true" : "false");
    else
      printf("%-4s %-5s %5d %7d %4d %5d %8d %9.2f %10.0f %11.2f %7.3f%s\n", dev_name, kind,
             k, moe->experts, moe->ffn, ep, cap, step_s * 1e3, tokens / step_s, a2a_mb,
             drop_frac, ep > cores ? "  (oversubscribed)" : "");
    fflush(stdout);
  }
  free(ru);
  return st;
}

static fl_status make_batch(int tokens, float **x, int32_t **y) {
  size_t n = (size_t)tokens * FEATURES;
  *x = malloc(n * sizeof **x);
  *y = malloc((size_t)tokens * sizeof **y);
  if (!*x || !*y) return fl_set_error(FL_ENOMEM, "a batch of %zu floats", n);
  uint64_t z = 5;
  for (size_t i = 0; i < n; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    (*x)[i] = (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  for (int i = 0; i < tokens; i++) (*y)[i] = (int32_t)((i * 7 + 3) % CLASSES);
  return FL_OK;
}

static int run_device(fl_device_kind kind, bool json, bool quick, int steps, int cores) {
  dev_name = kind == FL_DEVICE_CUDA ? "cuda" : "cpu";
  const char *what = "fl_device_open";
  world worlds[MAX_RANKS + 1] = {0};
  float *x = NULL;
  int32_t *y = NULL;
  const int tokens = quick ? 512 : 2048, eps[] = {1, 2, 4};
  fl_status st = FL_OK;
  for (int r = 0; st == FL_OK && r < MAX_RANKS; r++) st = fl_device_open(kind, 0, &rank_dev[r]);
  if (st == FL_OK) what = "fl_comm_host_create";
  for (int size = 2; st == FL_OK && size <= MAX_RANKS; size *= 2) st = world_create(size, &worlds[size]);
  if (st == FL_OK) what = "the batch";
  if (st == FL_OK) st = make_batch(tokens, &x, &y);
  if (st == FL_OK) what = "a row";
  if (st == FL_OK && !json) {
    printf("moe: %s, ranks as threads over loopback host comms; features %d, hidden 128, %d "
           "classes, %d tokens a step in all (each rank 1 routing group of tokens / ep), capacity "
           "factor 1.25; %d measured steps after a warm-up (median of the slowest rank)\n",
           dev_name, FEATURES, CLASSES, tokens, steps);
    printf("dense: one expert of ffn k * 256, the active size of a token under top-k; a2a MB: "
           "all-to-all bytes a rank sends to others per step\n");
    printf("%-4s %-5s %5s %7s %4s %5s %8s %9s %10s %11s %7s\n", "dev", "kind", "top_k", "experts",
           "ffn", "ep", "capacity", "step ms", "tokens/s", "a2a MB/step", "dropped");
  }
  for (int k = 1; st == FL_OK && k <= 2; k++) {
    moe_config dense = {.hidden = 128, .ffn = 256 * k, .experts = 1, .top_k = 1,
                        .capacity_factor = 1.0f, .balance_alpha = 0.0f};
    moe_config moe = {.hidden = 128, .ffn = 256, .experts = 8, .top_k = k,
                      .capacity_factor = 1.25f, .balance_alpha = 0.01f};
    st = row(worlds, "dense", &dense, k, 1, tokens, steps, cores, x, y, json);
    for (size_t i = 0; st == FL_OK && i < sizeof eps / sizeof *eps; i++)
      st = row(worlds, "moe", &moe, k, eps[i], tokens, steps, cores, x, y, json);
  }
  for (int size = 2; size <= MAX_RANKS; size *= 2) world_destroy(&worlds[size]);
  for (int r = 0; r < MAX_RANKS; r++) {
    fl_device_close(rank_dev[r]);
    rank_dev[r] = NULL;
  }
  free(x);
  free(y);
  if (st != FL_OK) {
    fail_flint(what);
    return 1;
  }
  if (!json) printf("\n");
  return 0;
}

int main(int argc, char **argv) {
  bench_device_args args = {.which = "all", .steps = 3};
  if (!bench_device_args_parse(argc, argv, MAX_STEPS, &args)) return 2;
  const char *which = args.which;
  bool cuda = strcmp(which, "cpu") != 0 && fl_cuda_device_count() > 0;
  if (strcmp(which, "cuda") == 0 && !cuda) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no usable GPU (none found, or flint built without CUDA)\n");
    return 1;
  }
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  int rc = 0;
  if (strcmp(which, "cuda") != 0) rc = run_device(FL_DEVICE_CPU, args.json, args.quick, (int)args.steps, cores);
  if (rc == 0 && cuda) rc = run_device(FL_DEVICE_CUDA, args.json, args.quick, (int)args.steps, cores);
  if (rc == 0 && !cuda && !args.json && strcmp(which, "all") == 0) printf("(cuda: no GPU here; rows skipped)\n");
  return rc;
}
