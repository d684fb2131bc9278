/* test_gpu_train_hybrid.c: `flint train --model transformer` (gpu/parallel/train_hybrid.c) end
 * to end, as barrier stages of dp x tp x pp ranks:
 *   - equivalence: without shuffling and dropout, every grid (2x2x2 1F1B, 1x2x2 GPipe with
 *     recomputation, 1x1x4, 2x1x2 interleaved) trains to the same losses and accuracies, epoch
 *     by epoch, as one rank; a shuffled run shows the comparison can fail;
 *   - dropout: masks are keyed by a row's place in the global batch, and every grid holds the
 *     global batch in order, so grids agree with one rank with dropout on too;
 *   - instrumentation: the timeline files hold every rank's forwards and backwards of the last
 *     step, the result has the theory's bubble, and GPipe's peak activations on the first
 *     stage exceed 1F1B's at the same m;
 *   - the sharded checkpoint: --checkpoint writes a blob with one shard per rank, and a killed
 *     rank's stage resumes from the epoch-1 checkpoint on a local cluster;
 *   - options: the grid's and the transformer's errors name the option;
 *   - divergence: a non-finite loss stops every rank of the grid at the same step (FL_EINVAL).
 * Links the shared libraries: the barrier function ships to executors by (library, symbol).
 * Needs Fashion-MNIST in /usr/share/datasets/fashion-mnist (the tests skip without it). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/parallel/train.h"

#define TEST_TIME_BOUND_S 240 /* per test; the ASan build is a few times slower */
#include "test_util.h"
#include "divergence_check.h"
#include "fashion_data.h"

/* Relative tolerance on losses and accuracies between grids. The runs differ only in the
 * order of float additions (GEMMs over micro-batches and shards, allreduces); GELU and
 * softmax are smooth, so that stays at a few ulps per step: measured below 1e-6 after 32
 * steps. 1e-4 leaves a margin; a shuffled run, or dropout 0.2 against none, differs by more
 * than 1e-3. */
#define EQ_TOL 1e-4

static char tmp_dir[128];


/* Every epoch's row, as on_epoch reports it. */
typedef struct rows {
  gpu_train_epoch seen[8];
  uint32_t count;
  pid_t killed; /* the killed-rank test: the executor it killed */
  bool kill_failed;
} rows;

static void keep_row(const gpu_train_epoch *e, void *user) {
  rows *r = user;
  if (r->count < 8) r->seen[r->count++] = *e;
}

static gpu_train_options small_options(uint32_t dp, uint32_t tp, uint32_t pp, pp_schedule sched, uint32_t m,
                                       rows *r) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.master = "local[8]";
  o.model = NN_TRANSFORMER;
  o.ranks = dp;
  o.tp = tp;
  o.pp = pp;
  o.schedule = sched;
  o.microbatches = m;
  o.hidden = 32;
  o.heads = 4;
  o.blocks = 2;
  o.dropout = 0;
  o.batch = 32;
  o.epochs = 2;
  o.lr = 0.5;
  o.seed = 5;
  o.shuffle = false;
  o.max_train_images = 16 * 32; /* 16 steps an epoch */
  o.max_test_images = 128;
  o.csv_path = NULL;
  o.svg_path = NULL;
  o.on_epoch = keep_row;
  o.user = r;
  return o;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(1e-6, fabs(a)); }

/* Two runs' rows: the largest relative difference of their losses, and the largest absolute
 * difference of their accuracies (which move in steps of one image: a prediction whose two
 * best logits are within rounding of each other may flip). */
typedef struct diff {
  double loss, acc;
} diff;
#define ACC_TOL (2.0 / 128) /* two of the 128 test images */

static diff rows_diff(const rows *a, const rows *b) {
  assert_int_equal(a->count, b->count);
  diff m = {0, 0};
  for (uint32_t i = 0; i < a->count; i++) {
    const gpu_train_epoch *x = &a->seen[i], *y = &b->seen[i];
    double l = fmax(rel(x->train_loss, y->train_loss), rel(x->test_loss, y->test_loss));
    double c = fmax(fabs(x->train_acc - y->train_acc), fabs(x->test_acc - y->test_acc));
    if (!(l <= m.loss)) m.loss = l; /* NaN propagates */
    if (!(c <= m.acc)) m.acc = c;
  }
  return m;
}

static bool rows_agree(const rows *a, const rows *b, const char *what) {
  diff d = rows_diff(a, b);
  fprintf(stderr, "    %s: losses differ by %.2e (relative), accuracies by %.4f\n", what, d.loss, d.acc);
  return d.loss < EQ_TOL && d.acc <= ACC_TOL;
}

static void run_ok(gpu_train_options *o, const char *what, gpu_train_result *res) {
  time_t t0 = time(NULL);
  fl_status s = gpu_train_run(o, res);
  fprintf(stderr, "  %-34s %s in %lds", what, fl_status_name(s), (long)(time(NULL) - t0));
  if (s != FL_OK) fprintf(stderr, ": %s", fl_last_error());
  else fprintf(stderr, ": loss %.6f test %.6f bubble %.3f (theory %.3f)", res->train_loss, res->test_loss,
               res->bubble, res->bubble_theory);
  fprintf(stderr, "\n");
  assert_int_equal(s, FL_OK);
}

static void test_grids_equal_one_rank(void **state) {
  (void)state;
  NEED_DATA();
  rows one = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 1, 1, PP_1F1B, 1, &one);
  run_ok(&o, "1x1x1", &res);
  assert_int_equal(one.count, 2);
  assert_true(one.seen[1].train_loss < one.seen[0].train_loss); /* it learns */
  assert_true(res.bubble_theory == 0); /* (the measured one counts gaps between operations) */
  const struct {
    uint32_t dp, tp, pp, m, chunks;
    pp_schedule sched;
    bool recompute;
    const char *name;
  } grids[] = {
      {2, 2, 2, 4, 1, PP_1F1B, false, "2x2x2 1f1b m4"},
      {1, 2, 2, 2, 1, PP_GPIPE, true, "1x2x2 gpipe m2 recompute"},
      {1, 1, 4, 4, 1, PP_1F1B, false, "1x1x4 1f1b m4"},
      {2, 1, 2, 2, 2, PP_INTERLEAVED, false, "2x1x2 interleaved v2 m2"},
  };
  for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) {
    rows r = {0};
    o = small_options(grids[g].dp, grids[g].tp, grids[g].pp, grids[g].sched, grids[g].m, &r);
    o.chunks = grids[g].chunks;
    o.recompute = grids[g].recompute;
    run_ok(&o, grids[g].name, &res);
    assert_true(rows_agree(&one, &r, "against 1 rank"));
    assert_int_equal(res.steps, 2 * 16);
    assert_int_equal(res.stages, grids[g].pp);
  }
  /* The comparison can fail: a shuffled run takes other batches. */
  rows shuffled = {0};
  o = small_options(1, 1, 1, PP_1F1B, 1, &shuffled);
  o.shuffle = true;
  run_ok(&o, "1x1x1 shuffled", &res);
  assert_false(rows_agree(&one, &shuffled, "shuffled against not"));
  assert_true(rows_diff(&one, &shuffled).loss > 10 * EQ_TOL);
}

/* --schedule pipedream with --vertical-sync and --window 1 (a flush every mini-batch) trains
 * exactly as one rank; without flushes (a window of 8) the weights are stale inside the window
 * and the run differs, as 2bw's does, while both learn; the link between stages is measured. */
static void test_pipedream_schedules(void **state) {
  (void)state;
  NEED_DATA();
  rows one = {0}, flushed = {0}, dream = {0}, twobw = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 1, 1, PP_1F1B, 1, &one);
  run_ok(&o, "1x1x1", &res);
  o = small_options(1, 1, 2, PP_PIPEDREAM, 4, &flushed);
  o.vertical_sync = true;
  o.window = 1;
  run_ok(&o, "1x1x2 pipedream vsync window 1", &res);
  assert_true(rows_agree(&one, &flushed, "against 1 rank"));
  assert_true(res.link_bytes_per_s > 0);
  o = small_options(1, 1, 2, PP_PIPEDREAM, 4, &dream);
  o.window = 8;
  run_ok(&o, "1x1x2 pipedream window 8", &res);
  assert_true(fabs(res.bubble_theory - 1.0 / 33) < 1e-9);
  assert_true(dream.seen[1].train_loss < dream.seen[0].train_loss);
  assert_true(rows_diff(&one, &dream).loss > 10 * EQ_TOL);
  o = small_options(1, 1, 2, PP_2BW, 2, &twobw);
  o.lr = 0.1; /* every gradient a whole update stale: with momentum 0.9, --lr 0.5 diverges */
  run_ok(&o, "1x1x2 2bw m2 window 8 (default), lr 0.1", &res);
  assert_true(twobw.seen[1].train_loss < twobw.seen[0].train_loss);
  assert_true(rows_diff(&one, &twobw).loss > 10 * EQ_TOL);
}

static void timeline_counts(const char *path, int rank, int *forwards, int *backwards);

/* --replicas (1F1B-RR through gpu_train_run): a replicated stage trains as one rank, with dp 1
 * and 2, and under pipedream flushed every step with vertical sync; the timeline has every rank's row, each replica of stage 1 running its micro-batches
 * (i mod r), and the sharded checkpoint (version 2) names the replicas and holds a shard per
 * task. */
static void test_replicated_stages_equal_one_rank(void **state) {
  (void)state;
  NEED_DATA();
  char csv[256], ckpt[256];
  snprintf(csv, sizeof csv, "%s/replicated.csv", tmp_dir);
  snprintf(ckpt, sizeof ckpt, "%s/replicated.ckpt", tmp_dir);
  rows one = {0}, a = {0}, b = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 1, 1, PP_1F1B, 1, &one);
  run_ok(&o, "1x1x1", &res);
  o = small_options(1, 1, 2, PP_1F1B, 4, &a);
  o.replicas[0] = 1;
  o.replicas[1] = 3;
  o.timeline_csv_path = csv;
  o.checkpoint_path = ckpt;
  assert_int_equal(gpu_train_world(&o), 4);
  run_ok(&o, "pp 2, replicas 1,3, 1f1b m4", &res);
  assert_true(rows_agree(&one, &a, "against 1 rank"));
  assert_int_equal(res.stages, 2);
  assert_int_equal(res.steps, 2 * 16);
  /* ranks 1, 2, 3 are stage 1's replicas: micro-batches {0, 3}, {1}, {2} of the last step */
  int fwd[4], bwd[4];
  const int want[4] = {4, 2, 1, 1};
  for (int rank = 0; rank < 4; rank++) {
    timeline_counts(csv, rank, &fwd[rank], &bwd[rank]);
    assert_int_equal(fwd[rank], want[rank]);
    assert_int_equal(bwd[rank], want[rank]);
  }
  FILE *f = fopen(ckpt, "rb");
  assert_non_null(f);
  static uint8_t blob[4 << 20];
  size_t len = fread(blob, 1, sizeof blob, f);
  fclose(f);
  assert_true(len > 64);
  uint32_t head[6], tail[5];
  memcpy(head, blob + 8, sizeof head);
  assert_int_equal(head[0], 2); /* version 2: replicated stages */
  assert_int_equal(head[3], 2);
  assert_int_equal(head[5], 3);
  memcpy(tail, blob + 32, sizeof tail); /* the cut, then the replicas */
  assert_int_equal(tail[3], 1);
  assert_int_equal(tail[4], 3);
  size_t off = 52;
  for (int rank = 0; rank < 4; rank++) {
    uint64_t shard;
    assert_true(off + 8 <= len);
    memcpy(&shard, blob + off, 8);
    off += 8 + shard;
    assert_true(off <= len);
  }
  assert_int_equal(off, len);
  unlink(csv);
  unlink(ckpt);
  /* two data-parallel pipelines of a replicated first stage: 8 tasks */
  o = small_options(2, 1, 2, PP_GPIPE, 4, &b);
  o.replicas[0] = 3;
  o.replicas[1] = 1;
  run_ok(&o, "dp 2, pp 2, replicas 3,1, gpipe m4", &res);
  assert_true(rows_agree(&one, &b, "against 1 rank"));
  /* pipedream's replicas (updates summed over them): flushed every step with vertical sync,
   * one rank's training too */
  rows c = {0};
  o = small_options(1, 1, 2, PP_PIPEDREAM, 4, &c);
  o.vertical_sync = true;
  o.window = 1;
  o.replicas[0] = 1;
  o.replicas[1] = 3;
  run_ok(&o, "replicas 1,3, pipedream vsync window 1", &res);
  assert_true(rows_agree(&one, &c, "against 1 rank"));
  /* --replicas auto:4 (at most 2 stages): whatever the partitioner chose, 1f1b trains as one
   * rank; the result says the choice */
  rows d = {0};
  o = small_options(1, 1, 2, PP_1F1B, 4, &d);
  o.replicas_auto = 4;
  assert_int_equal(gpu_train_world(&o), 4);
  run_ok(&o, "replicas auto:4, at most 2 stages", &res);
  assert_true(rows_agree(&one, &d, "against 1 rank"));
  assert_true(res.stages >= 1 && res.stages <= 2);
  uint32_t sum = 0;
  for (uint32_t s = 0; s < res.stages; s++) sum += res.stage_replicas[s];
  fprintf(stderr, "    the partitioner's plan: %u stage%s, replicas %u%s\n", res.stages, res.stages == 1 ? "" : "s",
          res.stage_replicas[0], res.stages > 1 ? ",..." : "");
  assert_int_equal(sum, 4);
  assert_true(res.link_bytes_per_s > 0);
}

static void test_dropout_does_not_depend_on_the_grid(void **state) {
  (void)state;
  NEED_DATA();
  rows one = {0}, none = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 1, 1, PP_1F1B, 1, &one);
  o.dropout = 0.2;
  run_ok(&o, "1x1x1 dropout 0.2", &res);
  assert_true(one.seen[1].train_loss < 0.6 * log(10.0)); /* it learns */
  const struct {
    uint32_t dp, tp, pp, m;
    pp_schedule sched;
    const char *name;
  } grids[] = {
      {2, 2, 1, 2, PP_1F1B, "2x2x1 m2 dropout 0.2"},
      {2, 1, 2, 4, PP_GPIPE, "2x1x2 gpipe m4 dropout 0.2"},
      {1, 2, 2, 2, PP_1F1B, "1x2x2 m2 dropout 0.2"},
  };
  for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) {
    rows r = {0};
    o = small_options(grids[g].dp, grids[g].tp, grids[g].pp, grids[g].sched, grids[g].m, &r);
    o.dropout = 0.2;
    run_ok(&o, grids[g].name, &res);
    assert_true(rows_agree(&one, &r, "against 1 rank"));
  }
  /* ... and dropout is on: without it the run is another one. */
  o = small_options(1, 1, 1, PP_1F1B, 1, &none);
  run_ok(&o, "1x1x1 no dropout", &res);
  assert_true(rows_diff(&one, &none).loss > 10 * EQ_TOL);
}

/* Counts the CSV timeline's forward and backward rows of `rank`. */
static void timeline_counts(const char *path, int rank, int *forwards, int *backwards) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[256], kind[32];
  *forwards = *backwards = 0;
  assert_non_null(fgets(line, sizeof line, f));
  assert_string_equal(line, "rank,kind,microbatch,chunk,t0,t1\n");
  while (fgets(line, sizeof line, f)) {
    int r, mb, chunk;
    double t0, t1;
    assert_int_equal(sscanf(line, "%d,%31[a-z],%d,%d,%lf,%lf", &r, kind, &mb, &chunk, &t0, &t1), 6);
    assert_true(t1 >= t0);
    if (r != rank) continue;
    if (strcmp(kind, "forward") == 0) (*forwards)++;
    if (strcmp(kind, "backward") == 0) (*backwards)++;
  }
  fclose(f);
}

static void test_timeline_bubble_and_memory(void **state) {
  (void)state;
  NEED_DATA();
  char csv[256], svg[256];
  snprintf(csv, sizeof csv, "%s/timeline.csv", tmp_dir);
  snprintf(svg, sizeof svg, "%s/timeline.svg", tmp_dir);
  uint64_t peak[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    rows r = {0};
    gpu_train_result res;
    gpu_train_options o = small_options(1, 1, 2, k == 0 ? PP_GPIPE : PP_1F1B, 8, &r);
    o.epochs = 1;
    o.timeline_csv_path = csv;
    o.timeline_svg_path = svg;
    run_ok(&o, k == 0 ? "1x1x2 gpipe m8" : "1x1x2 1f1b m8", &res);
    assert_true(fabs(res.bubble_theory - 1.0 / 9.0) < 1e-9); /* (p-1)/(m+p-1) */
    assert_true(res.bubble >= 0 && res.bubble < 1);
    assert_int_equal(res.stages, 2);
    assert_true(res.stage_peak_bytes[0] > 0 && res.stage_peak_bytes[1] > 0);
    peak[k] = res.stage_peak_bytes[0];
    for (int rank = 0; rank < 2; rank++) {
      int fw, bw;
      timeline_counts(csv, rank, &fw, &bw);
      assert_int_equal(fw, 8);
      assert_int_equal(bw, 8);
    }
    FILE *f = fopen(svg, "r");
    assert_non_null(f);
    char head[8] = {0};
    assert_int_equal(fread(head, 1, 4, f), 4);
    fclose(f);
    assert_memory_equal(head, "<svg", 4);
    unlink(csv);
    unlink(svg);
  }
  fprintf(stderr, "    stage 0's peak activations: gpipe %llu B, 1f1b %llu B\n", (unsigned long long)peak[0],
          (unsigned long long)peak[1]);
  /* GPipe holds all 8 micro-batches on stage 0, 1F1B at most p = 2. */
  assert_true(peak[0] >= 3 * peak[1]);
}

/* Reads a sharded checkpoint by its documented layout (gpu/parallel/train_hybrid.c). */
static void test_checkpoint_file_has_a_shard_per_rank(void **state) {
  (void)state;
  NEED_DATA();
  char path[256];
  snprintf(path, sizeof path, "%s/sharded.ckpt", tmp_dir);
  rows r = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 2, 2, PP_1F1B, 2, &r);
  o.epochs = 1;
  o.checkpoint_path = path;
  run_ok(&o, "1x2x2 with --checkpoint", &res);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static uint8_t blob[4 << 20];
  size_t len = fread(blob, 1, sizeof blob, f);
  fclose(f);
  assert_true(len > 28 && len < sizeof blob);
  assert_memory_equal(blob, "FLNTSHRD", 8);
  uint32_t head[6];
  memcpy(head, blob + 8, sizeof head);
  assert_int_equal(head[0], 1); /* version */
  assert_int_equal(head[1], 1);
  assert_int_equal(head[2], 2);
  assert_int_equal(head[3], 2);
  assert_int_equal(head[4], 1);
  assert_int_equal(head[5], 3); /* the stage cut: 0 < b < 4 units */
  uint32_t cut[3];
  memcpy(cut, blob + 32, sizeof cut);
  assert_int_equal(cut[0], 0);
  assert_true(cut[1] > 0 && cut[1] < 4);
  assert_int_equal(cut[2], 4);
  size_t off = 44;
  for (int rank = 0; rank < 4; rank++) {
    uint64_t shard, chunk;
    assert_true(off + 8 <= len);
    memcpy(&shard, blob + off, 8);
    off += 8;
    assert_true(shard <= len - off);
    memcpy(&chunk, blob + off, 8);
    assert_int_equal(chunk + 8, shard); /* one chunk per rank */
    assert_memory_equal(blob + off + 8, "FLNTCKPT", 8);
    uint64_t step;
    memcpy(&step, blob + off + 8 + 48, 8);
    assert_int_equal(step, 16);
    off += shard;
  }
  assert_int_equal(off, len);
  unlink(path);
}

/* on_epoch: at the first attempt's epoch 1 (its checkpoint was put before the report), kill
 * the executor running rank 0; it is training epoch 2 by now. */
static void kill_at_epoch_1(const gpu_train_epoch *e, void *user) {
  rows *r = user;
  keep_row(e, user);
  if (e->epoch == 1 && e->attempt == 0 && r->killed == 0) {
    pid_t pid = (pid_t)e->pid;
    if (pid <= 1 || pid == getpid() || kill(pid, SIGKILL) != 0) r->kill_failed = true;
    else r->killed = pid;
  }
}

/* With replicated stages (replicated: --replicas 1,2, or with automatic: auto:3; 3 tasks)
 * the retry checks (or, auto, takes) the checkpoint's replicas and cut, and every replica
 * restores its own shard. */
static void killed_rank_resumes(bool replicated, bool automatic) {
  NEED_DATA();
  rows r = {0};
  gpu_train_result res;
  gpu_train_options o = small_options(1, 1, 2, PP_1F1B, 4, &r);
  o.master = replicated ? "local-cluster[4,1,512]" : "local-cluster[3,1,512]";
  if (replicated) { /* 3 tasks: a batch they divide */
    o.replicas[0] = automatic ? 0 : 1;
    o.replicas[1] = automatic ? 0 : 2;
    o.replicas_auto = automatic ? 3 : 0;
    o.batch = 36;
  }
  o.epochs = 3;
  o.max_train_images = 48 * o.batch; /* long enough that epoch 2 is running when the kill lands */
  o.on_epoch = kill_at_epoch_1;
  time_t t0 = time(NULL);
  fl_status s = gpu_train_run(&o, &res);
  fprintf(stderr, "  killed rank%s: %s in %ld s %s\n", automatic ? " (replicas auto:3)" : replicated ? " (replicas 1,2)" : "", fl_status_name(s),
          (long)(time(NULL) - t0), s ? fl_last_error() : "");
  if (r.killed > 0) waitpid(r.killed, NULL, WNOHANG);
  assert_false(r.kill_failed);
  assert_true(r.killed > 0);
  assert_int_equal(s, FL_OK);
  fprintf(stderr, "  attempts %u, resumed after epoch %u, losses:", res.attempts, res.resumed_epoch);
  for (uint32_t i = 0; i < r.count; i++)
    fprintf(stderr, " [epoch %u attempt %u: %.3f]", r.seen[i].epoch, r.seen[i].attempt, r.seen[i].train_loss);
  fprintf(stderr, "\n");
  assert_int_equal(res.attempts, 2); /* the retry skips the dead executor (docs/barrier.md) */
  assert_int_equal(res.resumed_epoch, 1);
  assert_int_equal(res.epochs, 3);
  assert_int_equal(res.steps, 3 * 48); /* the step count came back with the shards */
  assert_int_equal(r.count, 3);
  for (uint32_t i = 0; i < 3; i++) {
    assert_int_equal(r.seen[i].epoch, i + 1);
    assert_int_equal(r.seen[i].resumed_epoch, i == 0 ? 0 : 1);
  }
  /* Resumed, not restarted: epoch 2 goes on from epoch 1's weights. */
  assert_true(r.seen[1].train_loss < r.seen[0].train_loss);
}

static void test_killed_rank_resumes_from_sharded_checkpoint(void **state) {
  (void)state;
  killed_rank_resumes(false, false);
  killed_rank_resumes(true, false);
  killed_rank_resumes(true, true);
}

/* A rate far too high: the loss of the world (every rank holds the same value) turns
 * non-finite within a few steps, and every rank of the grid stops at that step; the run fails
 * with FL_EINVAL naming the step, the loss and the rate, and is not retried. */
static void check_diverges(uint32_t dp, uint32_t tp, uint32_t pp) {
  rows r = {0};
  gpu_train_options o = small_options(dp, tp, pp, PP_1F1B, 2, &r);
  o.lr = 1e9;
  gpu_train_result res;
  fl_status s = gpu_train_run(&o, &res);
  const char *e = fl_last_error();
  fprintf(stderr, "  %ux%ux%u at lr 1e9: %s: %s\n", dp, tp, pp, fl_status_name(s), s == FL_OK ? "" : e);
  if (s == FL_OK) fprintf(stderr, "  (finished: train loss %g, accuracy %g)\n", res.train_loss, res.train_acc);
  expect_divergence(s, e, 2ull * 16);
}

static void test_divergence_stops_the_run(void **state) {
  (void)state;
  NEED_DATA();
  check_diverges(1, 1, 1);
  check_diverges(2, 2, 2);
}

static void expect_invalid(gpu_train_options *o, const char *needle) {
  fl_status s = gpu_train_options_validate(o);
  if (s != FL_EINVAL || !strstr(fl_last_error(), needle))
    fprintf(stderr, "expected '%s', got %s: %s\n", needle, fl_status_name(s), fl_last_error());
  assert_int_equal(s, FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), needle));
}

static void test_options(void **state) {
  (void)state;
  rows r = {0};
  gpu_train_options o = small_options(2, 2, 2, PP_1F1B, 4, &r);
  assert_ok(gpu_train_options_validate(&o));
  o.batch = 36;
  expect_invalid(&o, "--batch 36 is not a multiple of --dp x --tp x --pp = 8");
  o = small_options(2, 2, 2, PP_1F1B, 3, &r);
  expect_invalid(&o, "--microbatches 3 must divide the replica's batch");
  o = small_options(1, 3, 1, PP_1F1B, 1, &r);
  o.batch = 33;
  o.max_train_images = 99;
  expect_invalid(&o, "--heads 4 must be a multiple of --tp 3");
  o = small_options(1, 1, 2, PP_1F1B, 1, &r);
  o.chunks = 2;
  expect_invalid(&o, "--chunks 2 needs --schedule interleaved");
  o = small_options(1, 1, 4, PP_INTERLEAVED, 4, &r);
  o.chunks = 2;
  expect_invalid(&o, "8 stages, but the model has only 4 units");
  o = small_options(1, 1, 1, PP_1F1B, 1, &r);
  o.heads = 5;
  expect_invalid(&o, "--heads 5 must divide --hidden 32");
  o = small_options(1, 1, 1, PP_1F1B, 1, &r);
  o.dropout = 1;
  expect_invalid(&o, "--dropout 1 must be in [0, 1)");
  o = small_options(1, 1, 1, PP_1F1B, 1, &r);
  o.bucket_bytes = 1 << 20;
  expect_invalid(&o, "--bucket-mb is for the data-parallel models");
  o = small_options(2, 2, 2, PP_1F1B, 1, &r);
  o.max_test_images = 4;
  expect_invalid(&o, "--test-images 4 is less than the 8 ranks");
  o = small_options(1, 1, 1, PP_1F1B, 1, &r);
  o.model = NN_MLP;
  o.pp = 2;
  expect_invalid(&o, "are for --model transformer");
  o = small_options(1, 1, 2, PP_1F1B, 2, &r);
  o.vertical_sync = true;
  expect_invalid(&o, "--vertical-sync is for --schedule pipedream, not 1f1b");
  o = small_options(1, 1, 2, PP_GPIPE, 2, &r);
  o.window = 4;
  expect_invalid(&o, "--window is for --schedule pipedream or 2bw, not gpipe");
  o = small_options(1, 1, 4, PP_2BW, 2, &r);
  expect_invalid(&o, "--schedule 2bw needs --microbatches >= --pp (2 < 4)");
  /* --sequence-parallel splits the encoder's sequence, an image's rows (Fashion-MNIST's 28),
   * over --tp; data from files is checked once read, with the same function. */
  o = small_options(1, 8, 1, PP_1F1B, 1, &r);
  o.heads = 8;
  o.sequence_parallel = true;
  expect_invalid(&o, "--sequence-parallel needs the sequence to be a multiple of --tp 8, but the encoder's is 28 "
                     "tokens (an image's rows: channels x height = 1 x 28)");
  o.tp = 4;
  assert_ok(gpu_train_options_validate(&o));
  o.data = GPU_TRAIN_IDX;
  o.data_path = o.test_path = "images,labels";
  o.max_train_images = o.max_test_images = 0;
  assert_ok(gpu_train_options_validate(&o)); /* the shape is in the files */
  assert_fails_with(gpu_train_options_validate_shape(&o, 1, 30, 30), FL_EINVAL,
                    "a multiple of --tp 4, but the encoder's is 30 tokens (an image's rows: channels x height = "
                    "1 x 30)");
  assert_ok(gpu_train_options_validate_shape(&o, 3, 4, 30));
  o.sequence_parallel = false;
  assert_ok(gpu_train_options_validate_shape(&o, 1, 30, 30));
  /* --replicas: what the replicated runtime supports */
  o = small_options(1, 1, 2, PP_1F1B, 2, &r);
  o.replicas[0] = 1;
  o.replicas[1] = 3;
  assert_ok(gpu_train_options_validate(&o));
  o.pp = 3;
  expect_invalid(&o, "--replicas names 2 stages but --pp is 3");
  o.pp = 2;
  o.replicas[1] = 2; /* 3 ranks */
  expect_invalid(&o, "--batch 32 is not a multiple of --dp x the sum of --replicas = 3");
  o.replicas[1] = 3;
  o.schedule = PP_INTERLEAVED;
  expect_invalid(&o, "--replicas runs --schedule gpipe, 1f1b, pipedream or 2bw, not interleaved");
  o = small_options(1, 2, 2, PP_1F1B, 2, &r);
  o.replicas[0] = o.replicas[1] = 1;
  expect_invalid(&o, "--replicas needs --tp 1 and --chunks 1");
  o = small_options(1, 1, 2, PP_1F1B, 2, &r);
  o.replicas[0] = 1;
  o.replicas[2] = 1;
  expect_invalid(&o, "--replicas: stage 1 has 0 replicas");
  o = small_options(1, 1, 1, PP_1F1B, 1, &r);
  o.model = NN_MLP;
  o.replicas[0] = 2;
  expect_invalid(&o, "are for --model transformer");
  o = small_options(1, 1, 2, PP_1F1B, 2, &r);
  o.replicas_auto = 4;
  assert_ok(gpu_train_options_validate(&o));
  o.replicas[0] = 2;
  expect_invalid(&o, "--replicas is either counts or auto:W");
  o.replicas[0] = 0;
  o.replicas_auto = 3;
  expect_invalid(&o, "--batch 32 is not a multiple of --dp x W of --replicas auto:W = 3");
  uint32_t reps[GPU_TRAIN_MAX_STAGES], n = 0, w = 0;
  assert_ok(gpu_train_replicas_parse("auto:6", reps, &n, &w));
  assert_int_equal(w, 6);
  assert_int_equal(n, 0);
  assert_fails_with(gpu_train_replicas_parse("auto:0", reps, &n, &w), FL_EINVAL, "auto:W takes W");
  assert_fails_with(gpu_train_replicas_parse("auto:", reps, &n, &w), FL_EINVAL, "auto:W takes W");
  assert_ok(gpu_train_replicas_parse("1,2,1", reps, &n, &w));
  assert_int_equal(w, 0);
  assert_int_equal(n, 3);
  assert_int_equal(reps[1], 2);
  assert_int_equal(reps[3], 0);
  const char *bad[] = {"", "1,", "0,2", "1,,2", "2,x", "-1", " 1", "65", "1,2 "};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    fl_status st = gpu_train_replicas_parse(bad[i], reps, &n, &w);
    assert_int_equal(st, FL_EINVAL);
    assert_non_null(strstr(fl_last_error(), "is not a list of replica counts"));
  }
}

/* ---- --model gpt on --data text:PATH ---------------------------------------------------- */

/* A text file of `bytes` bytes in tmp_dir: sentences from a small vocabulary, seeded, so that
 * a byte-level model can learn something in a few steps. */
static void write_text(const char *path, size_t bytes) {
  static const char *const words[] = {"the ", "pipeline ", "sends ", "a ", "tensor ", "to ", "each ", "rank ",
                                      "and ", "waits. ", "layer ", "norm "};
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint64_t z = 17;
  size_t n = 0;
  while (n < bytes) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    const char *w = words[(z >> 33) % (sizeof words / sizeof words[0])];
    for (const char *p = w; *p && n < bytes; p++, n++) fputc(*p, f);
  }
  assert_int_equal(fclose(f), 0);
}

static gpu_train_options gpt_options(const char *path, uint32_t tp, uint32_t pp, rows *r) {
  gpu_train_options o = small_options(1, tp, pp, PP_1F1B, pp > 1 ? 2 : 1, r);
  o.gpt = true;
  o.data = GPU_TRAIN_TEXT;
  o.data_path = path;
  o.seq = 16;
  o.hidden = 32;
  o.heads = 4;
  o.blocks = 2;
  o.batch = 16;
  o.dropout = 0.1;
  o.optim.kind = OPTIM_ADAM;
  o.optim.weight_decay = 0;
  o.lr = 0.2; /* x 16 / 256: a peak of 0.0125 */
  o.max_train_images = 0;
  o.max_test_images = 0;
  return o;
}

/* The GPT form trains on a text file: the per-byte loss falls clearly below ln 256 (a
 * uniform guess), and a tp 2 x pp 2 grid trains as one rank does, dropout on. */
static void test_gpt_on_text(void **state) {
  (void)state;
  char path[256];
  snprintf(path, sizeof path, "%s/text.txt", tmp_dir);
  write_text(path, 5200); /* a test part of 520 bytes: 32 windows, two batches, as every grid evaluates */
  rows one = {0}, grid = {0};
  gpu_train_result res_one, res_grid;
  gpu_train_options o = gpt_options(path, 1, 1, &one);
  run_ok(&o, "gpt 1x1x1", &res_one);
  o = gpt_options(path, 2, 2, &grid);
  run_ok(&o, "gpt 1x2x2 1f1b", &res_grid);
  assert_int_equal(one.count, 2);
  assert_true(one.seen[0].train_loss < log(256.0));
  assert_true(res_one.train_loss < one.seen[0].train_loss);
  assert_true(res_one.test_loss < 0.75 * log(256.0));
  assert_true(res_one.test_acc > 0.2 && res_one.test_acc <= 1.0);
  assert_true(rows_agree(&one, &grid, "gpt tp 2 x pp 2 vs one rank"));
  /* The same grid with sequence parallelism and selective recomputation. */
  rows sp = {0};
  gpu_train_result res_sp;
  o = gpt_options(path, 2, 2, &sp);
  o.sequence_parallel = true;
  o.recompute_selective = true;
  run_ok(&o, "gpt 1x2x2 sequence parallel", &res_sp);
  assert_true(rows_agree(&one, &sp, "gpt tp 2 x pp 2 sequence parallel, selective, vs one rank"));
  /* PipeDream's windows hold a GPT batch as seq tokens and seq targets a row: one stage (no
   * stale micro-batch) over windows of 4, and 2 stages flushed every step with vertical sync,
   * train as one rank does. */
  rows pd1 = {0}, pd2 = {0};
  gpu_train_result res_pd;
  o = gpt_options(path, 1, 1, &pd1);
  o.schedule = PP_PIPEDREAM;
  o.window = 4;
  run_ok(&o, "gpt 1x1x1 pipedream window 4", &res_pd);
  assert_true(rows_agree(&one, &pd1, "gpt pipedream on one stage, windows of 4, vs one rank"));
  o = gpt_options(path, 1, 2, &pd2);
  o.schedule = PP_PIPEDREAM;
  o.vertical_sync = true;
  o.window = 1;
  run_ok(&o, "gpt 1x1x2 pipedream vsync window 1", &res_pd);
  assert_true(rows_agree(&one, &pd2, "gpt pipedream flushed every step, vs one rank"));
  unlink(path);
}

/* A missing, empty or short file, and text without gpt (or gpt without text), are errors
 * that name the cause. */
static void test_gpt_bad_text(void **state) {
  (void)state;
  char path[256];
  rows r = {0};
  gpu_train_result res;
  snprintf(path, sizeof path, "%s/missing.txt", tmp_dir);
  gpu_train_options o = gpt_options(path, 1, 1, &r);
  assert_int_equal(gpu_train_run(&o, &res), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "missing.txt"));
  snprintf(path, sizeof path, "%s/empty.txt", tmp_dir);
  write_text(path, 0);
  assert_int_equal(gpu_train_run(&o, &res), FL_EEMPTY);
  assert_non_null(strstr(fl_last_error(), "empty.txt: the file is empty"));
  unlink(path);
  snprintf(path, sizeof path, "%s/short.txt", tmp_dir);
  write_text(path, 20); /* not a window of 17 bytes in each part */
  assert_int_equal(gpu_train_run(&o, &res), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "too few for --seq 16"));
  write_text(path, 400); /* windows in both parts, but fewer than a batch in the test part */
  assert_int_equal(gpu_train_run(&o, &res), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "each needs at least --batch 16"));
  unlink(path);
  o = gpt_options(path, 1, 1, &r);
  o.gpt = false;
  expect_invalid(&o, "--data text:PATH is for --model gpt");
  o = gpt_options(path, 1, 1, &r);
  o.data = GPU_TRAIN_FASHION_MNIST;
  o.data_path = NULL;
  expect_invalid(&o, "--model gpt trains on --data text:PATH");
  o = gpt_options(path, 1, 1, &r);
  o.test_path = path;
  expect_invalid(&o, "--test-data is not for --data text:");
  /* Sequence parallelism needs a tensor-parallel group that divides the sequence. */
  o = gpt_options(path, 1, 1, &r);
  o.sequence_parallel = true;
  expect_invalid(&o, "--sequence-parallel splits the sequence over the tensor-parallel ranks: it needs --tp 2");
  o = gpt_options(path, 2, 1, &r);
  o.sequence_parallel = true;
  o.seq = 15;
  expect_invalid(&o, "--sequence-parallel needs --seq 15 to be a multiple of --tp 2");
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/flint-test-train-hybrid-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  const struct CMUnitTest tests[] = {
      T(test_options),
      T(test_gpt_bad_text),
      T(test_gpt_on_text),
      T(test_grids_equal_one_rank),
      T(test_pipedream_schedules),
      T(test_replicated_stages_equal_one_rank),
      T(test_dropout_does_not_depend_on_the_grid),
      T(test_timeline_bubble_and_memory),
      T(test_checkpoint_file_has_a_shard_per_rank),
      T(test_killed_rank_resumes_from_sharded_checkpoint),
      T(test_divergence_stops_the_run),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  int failed = cmocka_run_group_tests_name("gpu_train_hybrid", tests, NULL, NULL);
  rmdir(tmp_dir);
  return failed;
}
