/* test_gpu_train_moe.c: `flint train --experts` (gpu/parallel/train_hybrid.c with the
 * transformer's mixture-of-experts blocks) end to end, as barrier stages:
 *   - the GPT form on a text file with 4 experts, top-2, dropout on: experts over dp 2, over
 *     dp 2 x pp 2, and replicated over tp 2 train to the same losses, accuracies, balancing
 *     loss and dropped fraction, epoch by epoch, as one rank holding every expert; the
 *     encoder on Fashion-MNIST likewise with experts in every other block (skipped without
 *     the data);
 *   - the sharded checkpoint holds each rank's own experts: the two data-parallel shards differ
 *     with experts (and are the same bytes without);
 *   - bad combinations of the options are errors naming the option.
 * Links the shared libraries, as test_gpu_train_hybrid.c does. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/parallel/train.h"

#define TEST_TIME_BOUND_S 240
#include "test_util.h"
#include "fashion_data.h"

/* As test_gpu_train_hybrid.c: the grids differ only in the order of float additions. */
#define EQ_TOL 1e-4

static char tmp_dir[128];

typedef struct rows {
  gpu_train_epoch seen[8];
  uint32_t count;
} rows;

static void keep_row(const gpu_train_epoch *e, void *user) {
  rows *r = user;
  if (r->count < 8) r->seen[r->count++] = *e;
}

static double rel(double a, double b) { return fabs(a - b) / fmax(1e-6, fabs(a)); }

static bool rows_agree(const rows *a, const rows *b, double acc_tol, const char *what) {
  assert_int_equal(a->count, b->count);
  double loss = 0, acc = 0;
  for (uint32_t i = 0; i < a->count; i++) {
    const gpu_train_epoch *x = &a->seen[i], *y = &b->seen[i];
    double l = fmax(rel(x->train_loss, y->train_loss), rel(x->test_loss, y->test_loss));
    double c = fmax(fabs(x->train_acc - y->train_acc), fabs(x->test_acc - y->test_acc));
    if (!(l <= loss)) loss = l;
    if (!(c <= acc)) acc = c;
  }
  fprintf(stderr, "    %s: losses differ by %.2e (relative), accuracies by %.4f\n", what, loss, acc);
  return loss < EQ_TOL && acc <= acc_tol;
}

static void run_ok(gpu_train_options *o, const char *what, gpu_train_result *res) {
  time_t t0 = time(NULL);
  fl_status s = gpu_train_run(o, res);
  fprintf(stderr, "  %-30s %s in %lds", what, fl_status_name(s), (long)(time(NULL) - t0));
  if (s != FL_OK) fprintf(stderr, ": %s", fl_last_error());
  else fprintf(stderr, ": loss %.6f test %.6f aux %.6f dropped %.4f", res->train_loss, res->test_loss, res->aux_loss,
               res->dropped_fraction);
  fprintf(stderr, "\n");
  assert_int_equal(s, FL_OK);
}

/* The balancing loss and the dropped fraction of two runs agree too. */
static void moe_agree(const gpu_train_result *a, const gpu_train_result *b, const char *what) {
  if (rel(a->aux_loss, b->aux_loss) > EQ_TOL || fabs(a->dropped_fraction - b->dropped_fraction) > 1e-3)
    fail_msg("%s: aux %.9g dropped %.6f, one rank aux %.9g dropped %.6f", what, b->aux_loss, b->dropped_fraction,
             a->aux_loss, a->dropped_fraction);
}

/* A text file of `bytes` bytes: sentences from a small vocabulary, seeded (test_gpu_train_hybrid.c's). */
static void write_text(const char *path, size_t bytes) {
  static const char *const words[] = {"the ", "pipeline ", "sends ", "a ", "tensor ", "to ", "each ", "rank ",
                                      "and ", "waits. ", "expert ", "routes "};
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

static gpu_train_options gpt_options(const char *path, uint32_t dp, uint32_t tp, uint32_t pp, rows *r) {
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.master = "local[8]";
  o.model = NN_TRANSFORMER;
  o.gpt = true;
  o.data = GPU_TRAIN_TEXT;
  o.data_path = path;
  o.ranks = dp;
  o.tp = tp;
  o.pp = pp;
  o.schedule = PP_1F1B;
  o.microbatches = pp > 1 ? 2 : 1;
  o.seq = 16;
  o.hidden = 32;
  o.heads = 4;
  o.blocks = 2;
  o.batch = 16;
  o.epochs = 2;
  o.dropout = 0.1;
  o.lr = 0.5;
  o.seed = 5;
  o.shuffle = false;
  o.experts = 4;
  o.top_k = 2;
  o.capacity_factor = 1.0; /* low enough that some choices are dropped */
  o.moe_alpha = 0.05;
  o.csv_path = NULL;
  o.svg_path = NULL;
  o.on_epoch = keep_row;
  o.user = r;
  return o;
}

static void test_gpt_experts_equal_one_rank(void **state) {
  (void)state;
  char path[256];
  snprintf(path, sizeof path, "%s/text.txt", tmp_dir);
  write_text(path, 5200);
  rows one = {0};
  gpu_train_result res_one, res;
  gpu_train_options o = gpt_options(path, 1, 1, 1, &one);
  run_ok(&o, "gpt 1x1x1, 4 experts", &res_one);
  assert_int_equal(one.count, 2);
  assert_true(one.seen[1].train_loss < one.seen[0].train_loss); /* it learns */
  assert_true(res_one.aux_loss > 0);
  assert_true(res_one.dropped_fraction > 0 && res_one.dropped_fraction < 0.5);
  const struct {
    uint32_t dp, tp, pp;
    const char *name;
  } grids[] = {{2, 1, 1, "gpt 2x1x1 (2 experts a rank)"},
               {2, 1, 2, "gpt 2x1x2 1f1b m2"},
               {1, 2, 1, "gpt 1x2x1 (experts replicated)"}};
  for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++) {
    rows r = {0};
    o = gpt_options(path, grids[g].dp, grids[g].tp, grids[g].pp, &r);
    run_ok(&o, grids[g].name, &res);
    assert_true(rows_agree(&one, &r, 2.0 / 512, grids[g].name));
    moe_agree(&res_one, &res, grids[g].name);
  }
  /* The comparison can fail: without the balancing loss's gradient the run differs. */
  rows other = {0};
  o = gpt_options(path, 2, 1, 1, &other);
  o.moe_alpha = 0;
  run_ok(&o, "gpt 2x1x1 alpha 0", &res);
  assert_false(rows_agree(&one, &other, 2.0 / 512, "alpha 0 against 0.05"));
  assert_true(res.aux_loss == 0);
  unlink(path);
}

static void test_encoder_experts_equal_one_rank(void **state) {
  (void)state;
  NEED_DATA();
  rows one = {0}, grid = {0};
  gpu_train_result res_one, res;
  gpu_train_options o = gpt_options(NULL, 1, 1, 1, &one);
  o.gpt = false;
  o.data = GPU_TRAIN_FASHION_MNIST;
  o.data_path = NULL;
  o.seq = 0;
  o.batch = 32;
  o.max_train_images = 8 * 32;
  o.max_test_images = 128;
  o.moe_every = 2; /* block 1 only */
  run_ok(&o, "encoder 1x1x1, every other block", &res_one);
  gpu_train_options g = o;
  g.ranks = 2;
  g.pp = 2;
  g.microbatches = 2;
  g.user = &grid;
  run_ok(&g, "encoder 2x1x2", &res);
  assert_true(rows_agree(&one, &grid, 2.0 / 128, "encoder 2x1x2"));
  moe_agree(&res_one, &res, "encoder 2x1x2");
}

/* The sharded checkpoint (train_hybrid.c's layout: a header, the cut, then per rank its
 * shard): dp 2 with experts, each rank's shard holds its own experts, so the two differ;
 * without experts both replicas hold the same weights. */
static void shards_of(gpu_train_options *o, const char *path, uint8_t **blob, size_t *len, size_t off[2],
                      size_t size[2]) {
  gpu_train_result res;
  o->epochs = 1;
  o->checkpoint_path = path;
  run_ok(o, o->experts ? "gpt 2x1x1 --checkpoint" : "gpt 2x1x1 dense --checkpoint", &res);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static uint8_t buf[2][8 << 20];
  uint8_t *b = buf[o->experts ? 0 : 1];
  *len = fread(b, 1, sizeof buf[0], f);
  fclose(f);
  assert_true(*len > 44 && *len < sizeof buf[0]);
  assert_memory_equal(b, "FLNTSHRD", 8);
  uint32_t head[6]; /* version, the grid, chunks, then the boundaries of the cut that follows */
  memcpy(head, b + 8, sizeof head);
  assert_int_equal(head[1], 2);
  size_t at = 8 + sizeof head + (size_t)head[5] * 4;
  for (int r = 0; r < 2; r++) {
    uint64_t shard;
    memcpy(&shard, b + at, 8);
    at += 8;
    assert_true(shard <= *len - at);
    off[r] = at;
    size[r] = (size_t)shard;
    at += shard;
  }
  assert_int_equal(at, *len);
  *blob = b;
  unlink(path);
}

static void test_checkpoint_holds_each_ranks_experts(void **state) {
  (void)state;
  char text[256], path[256];
  snprintf(text, sizeof text, "%s/ckpt.txt", tmp_dir);
  snprintf(path, sizeof path, "%s/moe.ckpt", tmp_dir);
  write_text(text, 5200);
  rows r = {0};
  uint8_t *blob;
  size_t len, off[2], size[2];
  gpu_train_options o = gpt_options(text, 2, 1, 1, &r);
  shards_of(&o, path, &blob, &len, off, size);
  assert_int_equal(size[0], size[1]); /* E / dp experts each */
  assert_true(memcmp(blob + off[0], blob + off[1], size[0]) != 0);
  o = gpt_options(text, 2, 1, 1, &r);
  o.experts = 0;
  o.top_k = 0;
  o.capacity_factor = 0;
  o.moe_alpha = -1;
  shards_of(&o, path, &blob, &len, off, size);
  assert_int_equal(size[0], size[1]);
  assert_memory_equal(blob + off[0], blob + off[1], size[0]);
  unlink(text);
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
  gpu_train_options o = gpt_options("unused.txt", 2, 1, 1, &r);
  assert_int_equal(gpu_train_options_validate(&o), FL_OK);
  o.experts = 3;
  expect_invalid(&o, "--experts 3 must be a multiple of --dp 2");
  o = gpt_options("unused.txt", 1, 1, 1, &r);
  o.top_k = 5;
  expect_invalid(&o, "--top-k 5 is more than --experts 4");
  o = gpt_options("unused.txt", 1, 1, 1, &r);
  o.moe_every = 3;
  expect_invalid(&o, "--moe-every 3 is more than --blocks 2");
  o = gpt_options("unused.txt", 1, 2, 1, &r);
  o.sequence_parallel = true;
  expect_invalid(&o, "--experts does not run with --sequence-parallel");
  o = gpt_options("unused.txt", 1, 1, 2, &r);
  o.schedule = PP_PIPEDREAM;
  o.microbatches = 2;
  expect_invalid(&o, "--experts runs with the gpipe, 1f1b and interleaved schedules, not pipedream");
  o = gpt_options("unused.txt", 1, 1, 1, &r);
  o.gpt = false; /* --plan auto plans the encoder only */
  o.data = GPU_TRAIN_FASHION_MNIST;
  o.data_path = NULL;
  o.seq = 0;
  o.plan_auto = true;
  o.plan_world = 2;
  expect_invalid(&o, "--experts does not run with --plan auto");
  o = gpt_options("unused.txt", 1, 1, 2, &r);
  o.replicas[0] = 1;
  o.replicas[1] = 3; /* 4 ranks: the batch of 16 splits */
  expect_invalid(&o, "--experts does not run with --replicas");
  o = gpt_options("unused.txt", 1, 1, 1, &r);
  o.experts = 0;
  expect_invalid(&o, "need --experts");
  o = (gpu_train_options)GPU_TRAIN_OPTIONS_INIT;
  o.experts = 4;
  expect_invalid(&o, "--experts is for --model transformer or gpt");
  /* the defaults: top-2, every block, capacity 1.25, alpha 0.01 */
  uint32_t top_k, every;
  float cf, alpha;
  gpu_train_experts(&o, &top_k, &every, &cf, &alpha);
  assert_int_equal(top_k, 2);
  assert_int_equal(every, 1);
  assert_true(cf == 1.25f && alpha == 0.01f);
}

#define T(f) cmocka_unit_test_setup_teardown(f, test_bound_arm, test_bound_disarm)

int main(void) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/flint-test-train-moe-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  const struct CMUnitTest tests[] = {
      T(test_options),
      T(test_gpt_experts_equal_one_rank),
      T(test_encoder_experts_equal_one_rank),
      T(test_checkpoint_holds_each_ranks_experts),
  };
  if (getenv("TEST_FILTER")) cmocka_set_test_filter(getenv("TEST_FILTER"));
  int failed = cmocka_run_group_tests_name("gpu_train_moe", tests, NULL, NULL);
  rmdir(tmp_dir);
  return failed;
}
