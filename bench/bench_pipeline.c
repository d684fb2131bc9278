/*
 * bench_pipeline: pipeline and tensor parallelism (issue 8) of the hybrid trainer
 * (gpu/parallel/pipeline.h), on the cpu device and, when a GPU is usable, on the cuda device, with
 * every rank a thread of this program and the ranks joined by host communicators over
 * loopback (the host backend, not NCCL). On cuda every rank opens the same GPU as a device of
 * its own (its own stream and cuBLAS handle): ranks sharing one GPU must use the host
 * backend, which stages tensors through pinned host memory, since NCCL wants one GPU a rank.
 *
 * Rows of the first table, "schedule x p x m": for each schedule (gpipe, 1f1b, interleaved
 * with v = 2 chunks per rank), p = 2 and 4 pipeline ranks and m = 1, 4, 8, 16 micro-batches
 * of 2 samples each, one warm-up step and then --steps steps of compute_gradients + apply:
 *   - bubble: the trainer's measured bubble (the pipeline group's idle fraction until its
 *     last backward), median over the steps;
 *   - theory: pp_bubble_theory, the baseline: (p-1)/(m+p-1), divided by v when
 *     interleaved (Megatron's rule of thumb);
 *   - sim: the schedule's own idle fraction, pp_schedule_simulate with t_fwd 1, t_bwd 2. It
 *     equals the theory for gpipe and 1f1b. For interleaved it is (p-1)/(vm+p-1) (m % p == 0),
 *     higher than theory/v: Megatron's (p-1)/(vm) is the bubble as a ratio to the ideal
 *     time, while the measured and simulated figures are a fraction of the whole step. With
 *     m % p != 0 the interleaved order leaves padding micro-batches out, so it idles more.
 *     The measured bubble should be read against sim; theory is printed as the issue asks;
 *   - samples/s: the global batch (2m samples) over the step time, where a step's time is
 *     the slowest rank's compute_gradients + apply, median over the steps;
 *   - peak act r0 / last: pp_step_stats.peak_activation_bytes on pipeline rank 0 and on the
 *     last one, the most at once over the measured steps (gpipe holds m micro-batches on
 *     every rank; 1f1b at most p - r on rank r).
 * Two cost models, labelled in the "cost" column:
 *   - synthetic: a tiny model (seq 4, hidden 8) whose compute is negligible, cut evenly into
 *     p x v stages of two units each (blocks = 2pv - 2), every forward sleeping 8 ms / v and
 *     every backward twice that (pp_options.synthetic_forward_s). Sleeps cost no core, so 4
 *     ranks on 2 cores still see stages of equal cost and the bubble is the schedule's;
 *   - compute: a small real model (seq 32, hidden 128, ffn 512) with no sleeps, cut the same
 *     way, m = 8 only. Stages are then as long as their compute, the first and last
 *     (embedding, head) shorter than the others, micro-batches are short enough that
 *     transfer latency counts, and with more ranks than cores the ranks share the cores: its
 *     bubble mixes the schedule's with imbalance, latency and the host's contention, and is
 *     labelled apart for that reason.
 *
 * Rows of the second table, "tensor parallel": a block stack (seq 64, features 32, hidden
 * 256, 8 heads, ffn 1024, 2 blocks, 10 classes, batch 16) trained with tp = 1, 2, 4 and
 * pp = dp = 1 (one micro-batch): step time (the slowest rank's compute_gradients + apply,
 * median over the steps) and its ratio to tp 1, the single rank taking the same global
 * batch. Tensor parallelism allreduces activations inside every block over the host
 * backend on loopback, and on a host with 2 cores tp 4 runs 4 compute-bound ranks on 2
 * cores, so ratios above 1/tp (and above 1 at tp 4) say as much about this host as about
 * the method.
 *
 * Rows of the third table, "pipedream" (cpu only, skipped with --quick or without the data in
 * /usr/share/datasets/fashion-mnist): the image transformer (hidden 64, 4 heads, 2 blocks;
 * an image is 28 tokens of 28) trained by gpu_train_run as `flint train --model transformer
 * --data fashion-mnist` does, on the first PD_TRAIN_IMAGES training images for PD_EPOCHS
 * epochs, batch 64, m 4, --lr 0.1, no shuffle, with 1f1b (a flush every mini-batch),
 * pipedream (no flush for a window of 8 mini-batches, weight stashing), pipedream with
 * vertical sync and 2bw, on p = 2 and 4 stages: images/s over the training, the measured and
 * theoretical bubble, and the test accuracy on the first PD_TEST_IMAGES test images beside
 * 1f1b's. 2bw runs without momentum at --lr 0.4: every gradient of 2bw is a whole update
 * stale, and heavy-ball momentum with a delay of one step is stable only for lr x curvature
 * below 1 - momentum (0.1), against 2 (1 + momentum) without delay, so the others' rate and
 * momentum 0.9 diverge (they did, at --lr 0.2 and 0.1); without momentum the bound is 1
 * against 2. A row that diverges says so and the table goes on.
 *
 * Rows of the fourth table, "activation memory" (Korthikanti et al. 2022): the bytes one rank
 * holds for one micro-batch between forward and backward in a chunk of L = 2 GPT blocks
 * (tfm_chunk_peak_activation_bytes; s = 64 tokens, b = 4 samples, h = 64, a = 8 heads,
 * ffn 4h), for t = 1, 2, 4 tensor-parallel ranks: tensor parallel alone, with sequence
 * parallelism, and with selective recomputation too; beside the formula for our storage
 * (fp32 values; dropout masks are recomputed from their keys, never kept):
 *   per block, tp only:       sbh (16 + 16/h + 48/t + 4as/(ht)) bytes
 *             tp + sp:        sbh/t (64 + 16/h + 4as/h)
 *             + selective:    sbh/t (64 + 16/h)
 * The block keeps qkv (3sbh/t floats), the probabilities (as^2 b/t), the context (sbh/t), the
 * MLP's input and output of GELU (4sbh/t each) and, outside the tensor-parallel regions, x1,
 * y and the two layer norms' outputs (sbh each, /t with sequence parallelism) and their mean
 * and 1/std (4sb, /t). (Megatron's mixed-precision count is sbh (10 + 24/t + 5as/(ht)), and
 * sbh/t (34 + 5as/h) and 34 sbh/t: half the bytes a value, masks of a byte kept.) The chunk
 * adds its copy of the whole input (4sbh) and, sequence parallel, the input's slice and the
 * last block's gathered output (4sbh (1/t + 1)); the formula column includes them.
 *
 *   bench_pipeline [--json] [--device cpu|cuda|all] [--steps N] [--quick] [--pipedream]
 *                  [--pipedream-seeds N [--pd-m M] [--pd-momentum X]]
 *
 * --pipedream: only the third table. --pipedream-seeds N: only the accuracy part of the third
 * table (1f1b, pipedream, pipedream with vertical sync) repeated over seeds 1..N on all 10000
 * test images, with each schedule's mean and its spread against 1f1b (pipedream_seed_rows);
 * with it, --pd-m M sets every row's micro-batches and --pd-momentum X the pipedream rows'
 * momentum (at a rate that keeps lr / (1 - momentum)).
 *
 * --device: the tables for the cpu device, the cuda device, or both (default all: cuda rows
 * only when a GPU is usable, else a line saying they were skipped; naming cuda without one
 * is an error).
 * --steps: measured steps per row after one warm-up (default 3). --quick: m in {1, 8} and no
 * compute rows. With --json, one JSON object per row with the table's figures. Exit status 2
 * on a bad option, 1 when the engine fails (its message on stderr).
 */
#define BENCH_NAME "bench_pipeline"
#include "bench_util.h"

#include <math.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flint/gpu.h"
#include "gpu/parallel/pipeline.h"
#include "gpu/parallel/train.h"
#include "bench_ranks.h"

#define MAX_RANKS 4
#define MAX_STEPS 50
#define MICROBATCH 2          /* samples per micro-batch in the schedule rows */
#define SYNTHETIC_FWD_S 0.008 /* per forward of a whole stage's units, before dividing by v */

/* ---- one configuration on every rank --------------------------------------------------- */

typedef struct run {
  pp_options o;
  int batch; /* the global batch (dp is 1) */
  const float *x;
  const int32_t *y;
  int steps; /* measured, after one warm-up */
  /* per rank and measured step */
  double step_s[MAX_RANKS][MAX_STEPS], bubble[MAX_RANKS][MAX_STEPS];
  double theory;
  size_t peak[MAX_RANKS];
} run;

/* One device per rank, all of the kind being measured: a device is one stream of work. */
static fl_device *rank_dev[MAX_RANKS];
static const char *dev_name; /* "cpu" or "cuda", the rows' device column */

static fl_status train_rank(void *arg, int rank, fl_comm *comm) {
  run *ru = arg;
  pp_trainer *t = NULL;
  fl_status st = pp_trainer_create(rank_dev[rank], comm, &ru->o, &t);
  ru->peak[rank] = 0;
  for (int i = 0; st == FL_OK && i <= ru->steps; i++) {
    pp_step_stats s;
    double t0 = now_s();
    st = pp_trainer_compute_gradients(t, ru->x, ru->y, ru->batch, (uint64_t)i, &s);
    double bubble = s.bubble, theory = s.bubble_theory;
    size_t peak = s.peak_activation_bytes;
    if (st == FL_OK) st = pp_trainer_apply(t, 0.01f, &s);
    double dt = now_s() - t0;
    if (st == FL_OK && i > 0) { /* step 0 warms up */
      ru->step_s[rank][i - 1] = dt;
      ru->bubble[rank][i - 1] = bubble;
      ru->theory = theory;
      if (peak > ru->peak[rank]) ru->peak[rank] = peak;
    }
  }
  pp_trainer_destroy(t);
  return st;
}

/* The step time (slowest rank per step, median over steps) and rank 0's median bubble. */
static void summarize(run *ru, int ranks, double *step_s, double *bubble) {
  double slowest[MAX_STEPS], b[MAX_STEPS];
  for (int i = 0; i < ru->steps; i++) {
    slowest[i] = 0;
    for (int r = 0; r < ranks; r++) slowest[i] = fmax(slowest[i], ru->step_s[r][i]);
    b[i] = ru->bubble[0][i];
  }
  *step_s = bench_median(slowest, ru->steps);
  *bubble = bench_median(b, ru->steps);
}

/* Seeded inputs in [-1, 1) and labels for a batch of the spec. */
static fl_status make_batch(const tfm_spec *spec, int batch, float **x, int32_t **y) {
  size_t n = (size_t)batch * (size_t)spec->seq * (size_t)spec->features;
  *x = malloc(n * sizeof **x);
  *y = malloc((size_t)batch * sizeof **y);
  if (!*x || !*y) {
    free(*x), free(*y);
    *x = NULL, *y = NULL;
    return fl_set_error(FL_ENOMEM, "a batch of %zu floats", n);
  }
  uint64_t z = 5;
  for (size_t i = 0; i < n; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    (*x)[i] = (float)((double)(z >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
  }
  for (int i = 0; i < batch; i++) (*y)[i] = (int32_t)((i * 7 + 3) % spec->classes);
  return FL_OK;
}

/* ---- schedule x p x m ------------------------------------------------------------------ */

static tfm_spec schedule_spec(bool compute, int blocks) {
  if (compute)
    return (tfm_spec){.seq = 32, .features = 16, .hidden = 128, .heads = 4, .ffn = 512,
                      .blocks = blocks, .classes = 10, .dropout = 0.1f, .seed = 7};
  return (tfm_spec){.seq = 4, .features = 3, .hidden = 8, .heads = 2, .ffn = 16, .blocks = blocks,
                    .classes = 3, .dropout = 0.1f, .seed = 7};
}

static fl_status schedule_row(world *w, bool compute, pp_schedule s, int p, int m, int steps, bool json) {
  int v = s == PP_INTERLEAVED ? 2 : 1, stages = p * v;
  /* Two units per stage: the embedding and the head each count as one. */
  int bounds[2 * MAX_RANKS + 1];
  for (int i = 0; i <= stages; i++) bounds[i] = 2 * i;
  run *ru = calloc(1, sizeof *ru);
  if (!ru) return fl_set_error(FL_ENOMEM, "a run's results");
  ru->o = (pp_options){.spec = schedule_spec(compute, 2 * stages - 2), .grid = {1, 1, p}, .schedule = s,
                       .microbatches = m, .chunks = v, .bounds = bounds,
                       .optim = (optim_options)OPTIM_OPTIONS_INIT,
                       .synthetic_forward_s = compute ? 0 : SYNTHETIC_FWD_S / v};
  ru->batch = m * MICROBATCH;
  ru->steps = steps;
  float *x = NULL;
  int32_t *y = NULL;
  fl_status st = make_batch(&ru->o.spec, ru->batch, &x, &y);
  ru->x = x, ru->y = y;
  if (st == FL_OK) st = run_ranks(p, w->comms, train_rank, ru);
  double makespan, sim = NAN;
  if (st == FL_OK) st = pp_schedule_simulate(s, p, m, v, 1, 2, &makespan, &sim);
  if (st == FL_OK) {
    double step_s, bubble;
    summarize(ru, p, &step_s, &bubble);
    const char *cost = compute ? "compute" : "synthetic";
    if (json)
      printf("{\"table\":\"schedule\",\"device\":\"%s\",\"cost\":\"%s\",\"schedule\":\"%s\",\"p\":%d,\"m\":%d,\"v\":%d,"
             "\"batch\":%d,\"bubble\":%.4f,\"bubble_theory\":%.4f,\"bubble_simulated\":%.4f,"
             "\"samples_per_s\":%.1f,\"step_ms\":%.3f,\"peak_activation_bytes_first\":%zu,"
             "\"peak_activation_bytes_last\":%zu}\n",
             dev_name, cost, pp_schedule_name(s), p, m, v, ru->batch, bubble, ru->theory, sim,
             ru->batch / step_s, step_s * 1e3, ru->peak[0], ru->peak[p - 1]);
    else
      printf("%-4s %-9s %-11s %2d %3d %2d %5d %7.3f %7.3f %7.3f %10.1f %9.2f %12zu %12zu\n", dev_name, cost,
             pp_schedule_name(s), p, m, v, ru->batch, bubble, ru->theory, sim, ru->batch / step_s,
             step_s * 1e3, ru->peak[0], ru->peak[p - 1]);
    fflush(stdout);
  }
  free(x);
  free(y);
  free(ru);
  return st;
}

/* ---- tensor parallel ------------------------------------------------------------------- */

static fl_status tensor_rows(world *worlds, int steps, int cores, bool json) {
  const tfm_spec spec = {.seq = 64, .features = 32, .hidden = 256, .heads = 8, .ffn = 1024,
                         .blocks = 2, .classes = 10, .dropout = 0.1f, .seed = 7};
  const int batch = 16, tps[] = {1, 2, 4};
  float *x = NULL;
  int32_t *y = NULL;
  fl_status st = make_batch(&spec, batch, &x, &y);
  run *ru = st == FL_OK ? calloc(1, sizeof *ru) : NULL;
  if (st == FL_OK && !ru) st = fl_set_error(FL_ENOMEM, "a run's results");
  double base_s = 0;
  for (size_t i = 0; st == FL_OK && i < sizeof tps / sizeof *tps; i++) {
    int tp = tps[i];
    memset(ru, 0, sizeof *ru);
    ru->o = (pp_options){.spec = spec, .grid = {1, tp, 1}, .schedule = PP_GPIPE, .microbatches = 1,
                         .optim = (optim_options)OPTIM_OPTIONS_INIT};
    ru->batch = batch, ru->x = x, ru->y = y, ru->steps = steps;
    st = run_ranks(tp, worlds[tp].comms, train_rank, ru);
    if (st != FL_OK) break;
    double step_s, bubble;
    summarize(ru, tp, &step_s, &bubble);
    if (tp == 1) base_s = step_s;
    if (json)
      printf("{\"table\":\"tensor_parallel\",\"device\":\"%s\",\"tp\":%d,\"batch\":%d,\"seq\":%d,\"hidden\":%d,"
             "\"heads\":%d,\"ffn\":%d,\"blocks\":%d,\"step_ms\":%.3f,\"samples_per_s\":%.1f,"
             "\"ratio_to_tp1\":%.3f,\"oversubscribed\":%s}\n",
             dev_name, tp, batch, spec.seq, spec.hidden, spec.heads, spec.ffn, spec.blocks, step_s * 1e3,
             batch / step_s, step_s / base_s, tp > cores ? "true" : "false");
    else
      printf("%-4s %2d %5d %10.2f %10.1f %8.3f%s\n", dev_name, tp, batch, step_s * 1e3, batch / step_s, step_s / base_s,
             tp > cores ? "  (more ranks than cores: oversubscribed)" : "");
    fflush(stdout);
  }
  free(ru);
  free(x);
  free(y);
  return st;
}

/* ---- activation memory ------------------------------------------------------------------ */

#define ACT_SEQ 64
#define ACT_BATCH 4
#define ACT_HIDDEN 64
#define ACT_HEADS 8
#define ACT_BLOCKS 2

typedef struct act_run {
  tfm_spec spec;
  int tp;
  size_t peak[MAX_RANKS];
} act_run;

/* One forward and backward of chunk [1, 1 + ACT_BLOCKS) on this rank; its peak bytes. */
static fl_status act_rank(void *arg, int rank, fl_comm *comm) {
  act_run *ar = arg;
  fl_device *dev = rank_dev[rank];
  tfm_chunk *c = NULL;
  fl_tensor *x = NULL, *dy = NULL;
  int64_t shape[3] = {ACT_BATCH, ACT_SEQ, ACT_HIDDEN};
  size_t n = (size_t)ACT_BATCH * ACT_SEQ * ACT_HIDDEN;
  float *host = malloc(n * sizeof *host);
  fl_status st = host ? FL_OK : fl_set_error(FL_ENOMEM, "an input of %zu floats", n);
  for (size_t i = 0; host && i < n; i++) host[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
  if (st == FL_OK)
    st = tfm_chunk_create(dev, &ar->spec, 1, 1 + ACT_BLOCKS, ar->tp > 1 ? comm : NULL, rank, ar->tp, &c);
  if (st == FL_OK) st = fl_tensor_create(dev, 3, shape, &x);
  if (st == FL_OK) st = fl_tensor_create(dev, 3, shape, &dy);
  if (st == FL_OK) st = fl_tensor_write(x, host, n);
  if (st == FL_OK) st = fl_tensor_write(dy, host, n);
  const fl_tensor *y, *dx;
  tfm_batch b = {0};
  if (st == FL_OK) st = tfm_chunk_forward(c, 0, x, &b, true, &y);
  if (st == FL_OK) st = tfm_chunk_backward(c, 0, dy, &dx);
  if (st == FL_OK) ar->peak[rank] = tfm_chunk_peak_activation_bytes(c);
  fl_tensor_destroy(x);
  fl_tensor_destroy(dy);
  tfm_chunk_destroy(c);
  free(host);
  return st;
}

/* The formula of the table's comment, in bytes per rank for the chunk. */
static double act_formula(int t, bool sp, bool selective) {
  double s = ACT_SEQ, b = ACT_BATCH, h = ACT_HIDDEN, a = ACT_HEADS, sbh = s * b * h;
  double probs = selective ? 0 : 4 * a * s / h;
  double block = sp ? sbh / t * (64 + 16 / h + probs) : sbh * (16 + 16 / h + (48 + probs) / t);
  double ends = 4 * sbh + (sp ? 4 * sbh * (1.0 / t + 1) : 0);
  return ACT_BLOCKS * block + ends;
}

static fl_status activation_rows(world *worlds, bool json) {
  static const int tps[] = {1, 2, 4};
  static const char *const modes[] = {"tp", "tp+sp", "tp+sp+selective"};
  act_run ar;
  fl_status st = FL_OK;
  for (size_t i = 0; st == FL_OK && i < sizeof tps / sizeof *tps; i++)
    for (int m = 0; st == FL_OK && m < 3; m++) {
      int t = tps[i];
      bool sp = m >= 1, sel = m == 2;
      if (sp && t == 1) continue; /* sequence parallelism splits over t > 1 ranks */
      memset(&ar, 0, sizeof ar);
      ar.spec = (tfm_spec){.seq = ACT_SEQ, .hidden = ACT_HIDDEN, .heads = ACT_HEADS, .blocks = ACT_BLOCKS,
                           .dropout = 0.1f, .seed = 7, .kind = TFM_GPT, .vocab = 256, .sequence_parallel = sp,
                           .selective_recompute = sel};
      ar.tp = t;
      st = run_ranks(t, worlds[t].comms, act_rank, &ar);
      if (st != FL_OK) break;
      double formula = act_formula(t, sp, sel), measured = (double)ar.peak[0];
      for (int r = 1; r < t; r++)
        if (ar.peak[r] != ar.peak[0]) st = fl_set_error(FL_EINTERNAL, "tp ranks hold different activation bytes");
      if (json)
        printf("{\"table\":\"activation_memory\",\"device\":\"%s\",\"t\":%d,\"mode\":\"%s\",\"s\":%d,\"b\":%d,"
               "\"h\":%d,\"a\":%d,\"blocks\":%d,\"measured_bytes\":%.0f,\"formula_bytes\":%.0f,\"ratio\":%.4f}\n",
               dev_name, t, modes[m], ACT_SEQ, ACT_BATCH, ACT_HIDDEN, ACT_HEADS, ACT_BLOCKS, measured, formula,
               measured / formula);
      else
        printf("%-4s %2d %-16s %12.1f %12.1f %7.4f\n", dev_name, t, modes[m], measured / 1024, formula / 1024,
               measured / formula);
      fflush(stdout);
    }
  return st;
}

/* ---- one device kind: both tables ------------------------------------------------------ */

static void close_rank_devices(void) {
  for (int r = 0; r < MAX_RANKS; r++) {
    fl_device_close(rank_dev[r]);
    rank_dev[r] = NULL;
  }
}

/* Every row of both tables with the ranks on devices of `kind`. The communicators are made
 * and destroyed within: on cuda they keep pinned staging memory of the ranks' devices, so
 * they must go before the devices do. */
static int run_device(fl_device_kind kind, bool json, bool quick, int steps, int cores) {
  dev_name = kind == FL_DEVICE_CUDA ? "cuda" : "cpu";
  const char *what = "fl_device_open";
  world worlds[MAX_RANKS + 1] = {0};
  fl_status st = FL_OK;
  for (int r = 0; st == FL_OK && r < MAX_RANKS; r++) st = fl_device_open(kind, 0, &rank_dev[r]);
  if (st == FL_OK) what = "fl_comm_host_create";
  for (int size = 1; st == FL_OK && size <= MAX_RANKS; size *= 2) st = world_create(size, &worlds[size]);
  if (st == FL_OK) what = "a schedule row";

  const pp_schedule schedules[] = {PP_GPIPE, PP_1F1B, PP_INTERLEAVED};
  const int ps[] = {2, 4}, ms_full[] = {1, 4, 8, 16}, ms_quick[] = {1, 8};
  const int *ms = quick ? ms_quick : ms_full;
  int nm = quick ? 2 : 4;
  if (st == FL_OK && !json) {
    printf("schedule x p x m: %s, ranks as threads over loopback host comms; %d samples per "
           "micro-batch, %d measured steps after a warm-up (medians)\n",
           kind == FL_DEVICE_CUDA ? "cuda (every rank on GPU 0, its own stream)" : "cpu", MICROBATCH, steps);
    printf("synthetic: tiny model, even cut, forward sleeps %.0f ms / v, backward twice that; "
           "compute: small real model, no sleeps\n",
           SYNTHETIC_FWD_S * 1e3);
    printf("theory = (p-1)/(m+p-1) [/v interleaved]; sim = the schedule simulated with t_bwd = 2 t_fwd "
           "(interleaved: (p-1)/(vm+p-1), the fraction of the step the bubble is)\n");
    printf("samples/s: global batch over the slowest rank's step; peak act: activation bytes held at "
           "once on pipeline rank 0 and the last\n");
    printf("%-4s %-9s %-11s %2s %3s %2s %5s %7s %7s %7s %10s %9s %12s %12s\n", "dev", "cost", "schedule", "p",
           "m", "v", "batch", "bubble", "theory", "sim", "samples/s", "step ms", "peak act r0", "peak act last");
  }
  for (size_t s = 0; st == FL_OK && s < 3; s++)
    for (int pi = 0; st == FL_OK && pi < 2; pi++)
      for (int mi = 0; st == FL_OK && mi < nm; mi++)
        st = schedule_row(&worlds[ps[pi]], false, schedules[s], ps[pi], ms[mi], steps, json);
  for (size_t s = 0; !quick && st == FL_OK && s < 3; s++)
    for (int pi = 0; st == FL_OK && pi < 2; pi++)
      st = schedule_row(&worlds[ps[pi]], true, schedules[s], ps[pi], 8, steps, json);

  if (st == FL_OK && !json) {
    printf("\ntensor parallel: %s; seq 64, features 32, hidden 256, 8 heads, ffn 1024, 2 blocks, batch 16, "
           "pp 1; step = compute_gradients + apply (median); ratio to the single rank (tp 1)\n",
           dev_name);
    printf("host backend over loopback (not NCCL), %d cores here: tp > %d oversubscribes them\n", cores, cores);
    printf("%-4s %2s %5s %10s %10s %8s\n", "dev", "tp", "batch", "step ms", "samples/s", "vs tp1");
  }
  if (st == FL_OK) what = "a tensor-parallel row";
  if (st == FL_OK) st = tensor_rows(worlds, steps, cores, json);
  if (st == FL_OK && !json) {
    printf("\nactivation memory: %s; a chunk of %d GPT blocks, s %d, b %d, h %d, a %d, ffn 4h; bytes one rank "
           "holds for a micro-batch (tfm_chunk_peak_activation_bytes) beside the formula (bench_pipeline.c's "
           "comment)\n", dev_name, ACT_BLOCKS, ACT_SEQ, ACT_BATCH, ACT_HIDDEN, ACT_HEADS);
    printf("%-4s %2s %-16s %12s %12s %7s\n", "dev", "t", "mode", "KiB/rank", "formula KiB", "ratio");
  }
  if (st == FL_OK) what = "an activation-memory row";
  if (st == FL_OK) st = activation_rows(worlds, json);
  for (int size = 1; size <= MAX_RANKS; size *= 2) world_destroy(&worlds[size]);
  close_rank_devices();
  if (st != FL_OK) {
    fail_flint(what);
    return 1;
  }
  if (!json) printf("\n");
  return 0;
}

/* ---- pipedream against 1f1b with flushes ----------------------------------------------- */

#define PD_TRAIN_IMAGES 8192
#define PD_TEST_IMAGES 2000
#define PD_EPOCHS 3
#define PD_WINDOW 8

static int pipedream_rows(bool json) {
  struct stat sb;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &sb) != 0 &&
      stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte", &sb) != 0) {
    if (!json) printf("pipedream: Fashion-MNIST is not in /usr/share/datasets/fashion-mnist; rows skipped\n");
    return 0;
  }
  if (!json) {
    printf("pipedream against 1f1b with flushes: cpu, Fashion-MNIST (first %d training, %d test images), "
           "transformer hidden 64, 4 heads, 2 blocks, batch 64, m 4, sgd lr 0.1 momentum 0.9 (2bw: lr 0.4, no momentum), %d epochs, no shuffle, local[p]\n",
           PD_TRAIN_IMAGES, PD_TEST_IMAGES, PD_EPOCHS);
    printf("window: mini-batches between flushes; bubble measured (mean of the last epoch's steps) and in theory, "
           "(p-1)/(window m + p-1)\n");
    printf("%-4s %-14s %2s %2s %6s %10s %7s %7s %9s %9s\n", "dev", "schedule", "p", "m", "window", "images/s",
           "bubble", "theory", "test acc", "vs 1f1b");
  }
  const pp_schedule kinds[] = {PP_1F1B, PP_PIPEDREAM, PP_PIPEDREAM, PP_2BW};
  const bool vsync[] = {false, false, true, false};
  const uint32_t ps[] = {2, 4};
  for (int pi = 0; pi < 2; pi++) {
    double ref_acc = NAN;
    for (int k = 0; k < 4; k++) {
      gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
      char master[32];
      snprintf(master, sizeof master, "local[%u]", ps[pi]);
      o.master = master;
      o.model = NN_TRANSFORMER;
      o.ranks = 1;
      o.pp = ps[pi];
      o.schedule = kinds[k];
      o.vertical_sync = vsync[k];
      o.window = kinds[k] == PP_1F1B ? 0 : PD_WINDOW;
      o.microbatches = 4;
      o.batch = 64;
      o.lr = 0.1;
      if (kinds[k] == PP_2BW) { /* the header says why */
        o.lr = 0.4;
        o.optim.momentum = 0;
      }
      o.epochs = PD_EPOCHS;
      o.shuffle = false;
      o.seed = 1;
      o.max_train_images = PD_TRAIN_IMAGES;
      o.max_test_images = PD_TEST_IMAGES;
      o.csv_path = o.svg_path = NULL;
      o.progress = NULL;
      gpu_train_result res;
      char name[32];
      snprintf(name, sizeof name, "%s%s", pp_schedule_name(kinds[k]), vsync[k] ? "+vsync" : "");
      fl_status st = gpu_train_run(&o, &res);
      if (st != FL_OK && !strstr(fl_last_error(), "diverged")) {
        fail_flint(name);
        return 1;
      }
      if (st != FL_OK) {
        if (json)
          printf("{\"table\":\"pipedream\",\"device\":\"cpu\",\"schedule\":\"%s\",\"p\":%u,\"diverged\":true}\n",
                 name, ps[pi]);
        else
          printf("%-4s %-14s %2u %2d %6d  diverged: %s\n", "cpu", name, ps[pi], 4, PD_WINDOW, fl_last_error());
        continue;
      }
      if (k == 0) ref_acc = res.test_acc;
      if (json)
        printf("{\"table\":\"pipedream\",\"device\":\"cpu\",\"schedule\":\"%s\",\"vertical_sync\":%s,"
               "\"p\":%u,\"m\":4,\"window\":%d,\"epochs\":%d,\"train_images\":%d,\"images_per_s\":%.1f,"
               "\"bubble\":%.4f,\"bubble_theory\":%.4f,\"test_acc\":%.4f,\"test_acc_1f1b\":%.4f,"
               "\"link_bytes_per_s\":%.4g}\n",
               pp_schedule_name(kinds[k]), vsync[k] ? "true" : "false", ps[pi], k ? PD_WINDOW : 1, PD_EPOCHS,
               PD_TRAIN_IMAGES, res.images_per_s, res.bubble, res.bubble_theory, res.test_acc, ref_acc,
               res.link_bytes_per_s);
      else
        printf("%-4s %-14s %2u %2d %6d %10.1f %7.3f %7.3f %9.4f %+9.4f\n", "cpu", name, ps[pi], 4, k ? PD_WINDOW : 1,
               res.images_per_s, res.bubble, res.bubble_theory, res.test_acc, res.test_acc - ref_acc);
      fflush(stdout);
    }
  }
  if (!json) printf("\n");
  return 0;
}

/* ---- pipedream's accuracy over seeds ------------------------------------------------------ */

/* --pd-m and --pd-momentum: the seeds study's micro-batches (every row) and the pipedream
 * rows' momentum; 1f1b keeps momentum 0.9. A pipedream row at momentum mu runs at
 * --lr 0.1 x (1 - mu) / 0.1, so that the step a constant gradient settles to,
 * lr / (1 - mu), stays 1f1b's. */
static uint32_t pd_m = 4;
static double pd_momentum = 0.9;

/* One run of the pipedream table's setup (1f1b, pipedream with or without vertical sync) at
 * `seed` on p stages, evaluated on `test_images`. */
static fl_status pipedream_run(pp_schedule kind, bool vsync, uint32_t p, uint64_t seed, uint64_t test_images,
                               gpu_train_result *res) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  char master[32];
  snprintf(master, sizeof master, "local[%u]", p);
  o.master = master;
  o.model = NN_TRANSFORMER;
  o.ranks = 1;
  o.pp = p;
  o.schedule = kind;
  o.vertical_sync = vsync;
  o.window = kind == PP_1F1B ? 0 : PD_WINDOW;
  o.microbatches = pd_m;
  o.batch = 64;
  o.lr = 0.1;
  if (kind != PP_1F1B) {
    o.optim.momentum = (float)pd_momentum;
    o.lr = 0.1 * (1 - pd_momentum) / 0.1;
  }
  o.epochs = PD_EPOCHS;
  o.shuffle = false;
  o.seed = seed;
  o.max_train_images = PD_TRAIN_IMAGES;
  o.max_test_images = test_images;
  o.csv_path = o.svg_path = NULL;
  o.progress = NULL;
  return gpu_train_run(&o, res);
}

/* --pipedream-seeds N: the pipedream table's accuracy comparison repeated over seeds 1..N (the
 * initial weights and dropout masks; no shuffle, so the batches are the same), on all 10000
 * test images. One training run is one sample of a noisy process: a gap of half a point
 * between two schedules on one seed says little unless the seed-to-seed spread of one schedule
 * is well below it. 1f1b runs at p 2 only: it trains as one rank does whatever p is. */
static int pipedream_seed_rows(bool json, int seeds) {
  struct stat sb;
  if (stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", &sb) != 0 &&
      stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte", &sb) != 0) {
    if (!json) printf("pipedream seeds: Fashion-MNIST is not in /usr/share/datasets/fashion-mnist; rows skipped\n");
    return 0;
  }
  enum { KINDS = 5 };
  const pp_schedule kinds[KINDS] = {PP_1F1B, PP_PIPEDREAM, PP_PIPEDREAM, PP_PIPEDREAM, PP_PIPEDREAM};
  const bool vsync[KINDS] = {false, false, true, false, true};
  const uint32_t ps[KINDS] = {2, 2, 2, 4, 4};
  const uint64_t test_images = 10000;
  double acc[KINDS][16];
  if (!json)
    printf("pipedream against 1f1b over seeds 1..%d: the pipedream table's setup (%d epochs, %d training "
           "images, batch 64, m %u, window %d, sgd lr 0.1 momentum 0.9; pipedream: momentum %g at lr %g), all "
           "%llu test images\n%-4s %-16s %2s %4s %10s %9s %9s\n", seeds, PD_EPOCHS, PD_TRAIN_IMAGES, pd_m, PD_WINDOW,
           pd_momentum, 0.1 * (1 - pd_momentum) / 0.1, (unsigned long long)test_images, "dev", "schedule", "p", "seed", "images/s", "test acc", "vs 1f1b");
  for (int s = 0; s < seeds; s++)
    for (int k = 0; k < KINDS; k++) {
      gpu_train_result res;
      char name[32];
      snprintf(name, sizeof name, "%s%s", pp_schedule_name(kinds[k]), vsync[k] ? "+vsync" : "");
      fl_status st = pipedream_run(kinds[k], vsync[k], ps[k], (uint64_t)s + 1, test_images, &res);
      if (st != FL_OK && !strstr(fl_last_error(), "diverged")) {
        fail_flint(name);
        return 1;
      }
      if (st != FL_OK) { /* a diverged row says so; its accuracy counts as NaN in the means */
        acc[k][s] = NAN;
        if (json)
          printf("{\"table\":\"pipedream_seeds\",\"device\":\"cpu\",\"schedule\":\"%s\",\"vertical_sync\":%s,"
                 "\"p\":%u,\"seed\":%d,\"diverged\":true}\n", pp_schedule_name(kinds[k]), vsync[k] ? "true" : "false",
                 ps[k], s + 1);
        else
          printf("%-4s %-16s %2u %4d  diverged: %s\n", "cpu", name, ps[k], s + 1, fl_last_error());
        fflush(stdout);
        continue;
      }
      acc[k][s] = res.test_acc;
      if (json)
        printf("{\"table\":\"pipedream_seeds\",\"device\":\"cpu\",\"schedule\":\"%s\",\"vertical_sync\":%s,"
               "\"p\":%u,\"m\":%u,\"momentum\":%g,\"seed\":%d,\"epochs\":%d,\"train_images\":%d,\"test_images\":%llu,"
               "\"images_per_s\":%.1f,\"test_acc\":%.4f,\"test_acc_1f1b\":%.4f}\n",
               pp_schedule_name(kinds[k]), vsync[k] ? "true" : "false", ps[k], pd_m, k ? pd_momentum : 0.9, s + 1,
               PD_EPOCHS, PD_TRAIN_IMAGES,
               (unsigned long long)test_images, res.images_per_s, res.test_acc, acc[0][s]);
      else
        printf("%-4s %-16s %2u %4d %10.1f %9.4f %+9.4f\n", "cpu", name, ps[k], s + 1, res.images_per_s, res.test_acc,
               res.test_acc - acc[0][s]);
      fflush(stdout);
    }
  if (!json) {
    printf("over the %d seeds: mean test acc, and the difference from 1f1b on the same seed (mean, min, max)\n",
           seeds);
    for (int k = 0; k < KINDS; k++) {
      double mean = 0, dmean = 0, dmin = INFINITY, dmax = -INFINITY;
      for (int s = 0; s < seeds; s++) {
        double d = acc[k][s] - acc[0][s];
        mean += acc[k][s] / seeds;
        dmean += d / seeds;
        dmin = fmin(dmin, d);
        dmax = fmax(dmax, d);
      }
      printf("%-16s p %u  mean %.4f  vs 1f1b %+.4f (%+.4f .. %+.4f)\n",
             k == 0 ? "1f1b" : vsync[k] ? "pipedream+vsync" : "pipedream", ps[k], mean, dmean, dmin, dmax);
    }
    printf("\n");
  }
  return 0;
}

/* ---- main -------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  /* --pipedream (ours, not bench_util's): only the third table. */
  bool only_pipedream = false;
  int kept = 1, seeds = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--pipedream") == 0) {
      only_pipedream = true;
    } else if (strcmp(argv[i], "--pd-m") == 0 || strcmp(argv[i], "--pd-momentum") == 0) {
      char *end = NULL;
      double v = i + 1 < argc ? strtod(argv[i + 1], &end) : NAN;
      bool m = strcmp(argv[i], "--pd-m") == 0;
      i++;
      if (!end || *end || (m ? !(v >= 1 && v <= 64 && v == floor(v) && 64 / (int)v * (int)v == 64) : !(v >= 0 && v < 1))) {
        fprintf(stderr, BENCH_NAME ": --pd-m takes a divisor of 64, --pd-momentum a number in [0, 1)\n");
        return 2;
      }
      if (m) pd_m = (uint32_t)v;
      else pd_momentum = v;
    } else if (strcmp(argv[i], "--pipedream-seeds") == 0) {
      char *end = NULL;
      seeds = i + 1 < argc ? (int)strtol(argv[++i], &end, 10) : 0;
      if (!end || *end || seeds < 1 || seeds > 16) {
        fprintf(stderr, BENCH_NAME ": --pipedream-seeds takes a count of seeds, 1 to 16\n");
        return 2;
      }
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  bench_device_args args = {.which = "all", .steps = 3};
  if (!bench_device_args_parse(argc, argv, MAX_STEPS, &args)) return 2;
  bool json = args.json, quick = args.quick;
  const char *which = args.which;
  uint64_t steps = args.steps;
  bool cuda = strcmp(which, "cpu") != 0 && fl_cuda_device_count() > 0;
  if (strcmp(which, "cuda") == 0 && !cuda) {
    fprintf(stderr, BENCH_NAME ": --device cuda: no usable GPU (none found, or flint built without CUDA)\n");
    return 1;
  }
  /* A lost peer fails within 20 s instead of hanging the benchmark. */
  setenv("FLINT_COMM_TIMEOUT_MS", "20000", 1);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int cores = online > 0 ? (int)online : 1;
  int rc = 0;
  if (seeds) return pipedream_seed_rows(json, seeds);
  if (only_pipedream) return pipedream_rows(json);
  if (strcmp(which, "cuda") != 0) rc = run_device(FL_DEVICE_CPU, json, quick, (int)steps, cores);
  if (rc == 0 && !quick && strcmp(which, "cuda") != 0) rc = pipedream_rows(json);
  if (rc == 0 && cuda) rc = run_device(FL_DEVICE_CUDA, json, quick, (int)steps, cores);
  if (rc == 0 && !cuda && !json && strcmp(which, "all") == 0) printf("(cuda: no GPU here; rows skipped)\n");
  return rc;
}
