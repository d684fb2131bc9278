/*
 * test_gpu_hybrid_cnn.c: Krizhevsky's "one weird trick" CNN (gpu/parallel/hybrid_cnn.h) on
 * the cpu device, ranks as threads with host communicators.
 *
 * - One rank equals the same network built as a plain model (gpu/nn), loss and gradients.
 * - Trick (data-parallel convolutions, model-parallel FC layers) and pure data parallelism on
 *   K = 2 and 4 ranks with b examples each equal one rank with the K b batch: the loss, every
 *   gradient (each rank's slice against the slice of the one-rank gradient) after the first
 *   step and every weight after a few SGD steps with momentum, to 1e-5 relative.
 * - Bytes per step: what the collectives counted equals the prediction from the sizes, and
 *   the trick sends fewer than data parallelism when the FC weights dominate.
 * - Bad specs, batches and labels are clear errors.
 *
 * Float comparisons use the error relative to the largest element of the reference tensor
 * (sums in another order move every element by the tensor's scale, not its own).
 */
#include "test_util.h"

#include <math.h>

#include "common/common.h"
#include "gpu/device/device.h"
#include "gpu/parallel/hybrid_cnn.h"

#define MAX_RANKS 4
#include "rank_threads.h"

#define STEPS 3
#define PER_RANK 2 /* b */
#define MAX_PARAMS 16
#define TOL 1e-5

static hcnn_spec small_spec(void) {
  /* 12x12 images, two conv blocks -> 8 x 3 x 3 = 72 features; FC 72 -> 16 -> 8 -> 5 (5
   * classes: the row-parallel classifier does not need K to divide them). */
  return (hcnn_spec){.channels = 3, .height = 12, .width = 12, .conv = {4, 8}, .nconv = 2,
                     .fc = {16, 8}, .nfc = 2, .classes = 5, .seed = 77};
}

typedef struct rank_out {
  double loss[STEPS];
  double eval_loss, eval_correct; /* hcnn_evaluate of the first step's batch, after training */
  hcnn_bytes bytes;
  size_t np;
  char name[MAX_PARAMS][32];
  hcnn_param_place place[MAX_PARAMS];
  int64_t lrows[MAX_PARAMS], numel[MAX_PARAMS];
  float *grad[MAX_PARAMS];  /* after the first step */
  float *value[MAX_PARAMS]; /* after STEPS steps */
} rank_out;

typedef struct run_cfg {
  hcnn_spec spec;
  hcnn_mode mode;
  int b;            /* examples per rank */
  const float *x;   /* STEPS x (ranks x b) examples */
  const int32_t *labels;
  rank_out out[MAX_RANKS];
} run_cfg;

static size_t image_floats(const hcnn_spec *sp) { return (size_t)sp->channels * sp->height * sp->width; }

static fl_status copy_out(fl_device *d, const fl_tensor *t, float **out) {
  *out = malloc(t->numel * sizeof **out);
  if (!*out) return FL_ENOMEM;
  return d->ops->to_host(d, *out, t->data, t->numel * sizeof **out);
}

/* One rank's run: STEPS steps of SGD with momentum; its slices recorded. */
static fl_status train_rank(rank_job *job) {
  run_cfg *cfg = job->arg;
  rank_out *o = &cfg->out[job->rank];
  fl_device *d = NULL;
  hcnn *h = NULL;
  optim_options opt = OPTIM_OPTIONS_INIT; /* SGD, momentum 0.9, weight decay 1e-4 */
  fl_status status = FL_OK;
  FL_CHECK(fl_device_open(FL_DEVICE_CPU, 0, &d));
  FL_CHECK(hcnn_create(d, job->comm, &cfg->spec, cfg->mode, &opt, &h));
  o->np = hcnn_param_count(h);
  if (o->np > MAX_PARAMS) FL_CHECK(fl_set_error(FL_EINVAL, "too many parameters"));
  size_t img = image_floats(&cfg->spec), global = (size_t)job->size * (size_t)cfg->b;
  for (int s = 0; s < STEPS; s++) {
    size_t first = (size_t)s * global + (size_t)job->rank * (size_t)cfg->b;
    hcnn_stats st;
    FL_CHECK(hcnn_compute_gradients(h, cfg->x + first * img, cfg->labels + first, cfg->b, &st));
    o->loss[s] = st.loss;
    if (s == 0) {
      o->bytes = st.bytes;
      for (size_t i = 0; i < o->np; i++) {
        const nn_param *p = hcnn_param(h, i);
        snprintf(o->name[i], sizeof o->name[i], "%s", p->name);
        o->place[i] = hcnn_param_place_of(h, i);
        o->numel[i] = (int64_t)p->value.numel;
        o->lrows[i] = p->value.ndim == 1 ? 1 : p->value.shape[0];
        FL_CHECK(copy_out(d, &p->grad, &o->grad[i]));
      }
    }
    FL_CHECK(hcnn_apply(h, 0.05f));
  }
  for (size_t i = 0; i < o->np; i++) FL_CHECK(copy_out(d, &hcnn_param(h, i)->value, &o->value[i]));
  size_t mine = (size_t)job->rank * (size_t)cfg->b;
  FL_CHECK(hcnn_evaluate(h, cfg->x + mine * img, cfg->labels + mine, cfg->b, &o->eval_loss, &o->eval_correct));
cleanup:
  hcnn_destroy(h);
  fl_device_close(d);
  return status;
}

static void free_out(rank_out *o) {
  for (size_t i = 0; i < o->np; i++) {
    free(o->grad[i]);
    free(o->value[i]);
  }
  memset(o, 0, sizeof *o);
}

static void run_on(run_cfg *cfg, int ranks) {
  rank_job jobs[MAX_RANKS];
  if (ranks == 1) {
    run_ranks(1, NULL, train_rank, cfg, jobs);
    expect_all_ok(1, jobs);
    return;
  }
  group g;
  group_create(&g, ranks);
  run_ranks(ranks, g.comms, train_rank, cfg, jobs);
  expect_all_ok(ranks, jobs);
  group_destroy(&g);
}

/* Rank slice `got` of parameter i against the same slice of the one-rank (whole) `want`;
 * the error relative to want's largest element. */
static double slice_err(const rank_out *o, size_t i, const float *got, const float *want, int64_t want_n) {
  double top = 0, err = 0;
  for (int64_t e = 0; e < want_n; e++) top = fmax(top, fabs(want[e]));
  hcnn_param_place pl = o->place[i];
  int64_t lcols = o->numel[i] / o->lrows[i];
  for (int64_t r = 0; r < o->lrows[i]; r++)
    for (int64_t j = 0; j < lcols; j++) {
      float w = want[(pl.row0 + r) * pl.cols + pl.col0 + j];
      err = fmax(err, fabs((double)got[r * lcols + j] - w));
    }
  return top > 0 ? err / top : err;
}

static float *make_images(size_t n, size_t img, uint64_t seed) {
  float *x = malloc(n * img * sizeof *x);
  assert_non_null(x);
  for (size_t i = 0; i < n * img; i++) x[i] = test_urand_signed(&seed);
  return x;
}

static void test_one_rank_equals_plain_model(void **state) {
  (void)state;
  hcnn_spec sp = small_spec();
  int n = 8;
  float *x = make_images((size_t)n, image_floats(&sp), 5);
  int32_t labels[8];
  for (int i = 0; i < n; i++) labels[i] = (i * 3) % sp.classes;
  fl_device *d;
  assert_ok(fl_device_open(FL_DEVICE_CPU, 0, &d));
  hcnn *h;
  assert_ok(hcnn_create(d, NULL, &sp, HCNN_TRICK, NULL, &h));
  hcnn_stats st;
  assert_ok(hcnn_compute_gradients(h, x, labels, n, &st));
  assert_int_equal(st.bytes.activations + st.bytes.gradients, 0);

  /* The same network through the public model API, with the trainer's weights. */
  int64_t shape[3] = {sp.channels, sp.height, sp.width};
  fl_model *m;
  assert_ok(fl_model_create(d, 3, shape, &m));
  for (int i = 0; i < sp.nconv; i++) {
    char name[16];
    snprintf(name, sizeof name, "conv%d", i + 1);
    const fl_conv2d_options o = {.out_channels = sp.conv[i], .kernel = 3, .padding = 1, .bias = true};
    assert_ok(fl_model_conv2d(m, name, &o));
    assert_ok(fl_model_relu(m));
    assert_ok(fl_model_maxpool(m, 2, 2, 0));
  }
  assert_ok(fl_model_flatten(m));
  for (int i = 0; i < sp.nfc; i++) {
    char name[16];
    snprintf(name, sizeof name, "fc%d", i + 1);
    assert_ok(fl_model_linear(m, name, sp.fc[i], true));
    assert_ok(fl_model_relu(m));
  }
  assert_ok(fl_model_linear(m, "classifier", sp.classes, true));
  assert_ok(fl_model_finish(m, 1));
  /* The backward from a given output gradient wants a forward and the output's shape. */
  int64_t dshape[2] = {n, sp.classes + 1};
  fl_tensor *bad_dy;
  assert_ok(fl_tensor_create(d, 2, dshape, &bad_dy));
  assert_fails_with(nn_model_backward_from(m, bad_dy, NULL, NULL), FL_ESTATE, "no forward");
  assert_int_equal(nn_model_param_count(m), hcnn_param_count(h));
  assert_int_equal((int64_t)fl_model_num_weights(m), hcnn_weights(&sp));
  for (size_t i = 0; i < hcnn_param_count(h); i++) {
    nn_param *a = hcnn_param(h, i), *b = nn_model_param(m, i);
    assert_string_equal(a->name, b->name);
    assert_int_equal(a->value.numel, b->value.numel);
    hcnn_param_place pl = hcnn_param_place_of(h, i);
    assert_true(pl.replicated);
    assert_int_equal(pl.rows * pl.cols, (int64_t)a->value.numel);
    assert_ok(d->ops->copy(d, b->value.data, a->value.data, a->value.numel * sizeof(float)));
  }
  int64_t xshape[4] = {n, sp.channels, sp.height, sp.width};
  fl_tensor *xt;
  assert_ok(fl_tensor_create(d, 4, xshape, &xt));
  assert_ok(fl_tensor_write(xt, x, fl_tensor_numel(xt)));
  const fl_tensor *y;
  double loss;
  assert_ok(fl_model_forward(m, xt, true, &y));
  assert_fails_with(nn_model_backward_from(m, bad_dy, NULL, NULL), FL_EINVAL, "gradient [8, 6], the output is [8, 5]");
  fl_tensor_destroy(bad_dy);
  assert_ok(fl_model_cross_entropy(m, labels, (size_t)n, 0.0, &loss, NULL));
  assert_ok(fl_model_backward(m));
  assert_true(fabs(st.loss - loss) <= TOL * fabs(loss));
  for (size_t i = 0; i < hcnn_param_count(h); i++) {
    nn_param *a = hcnn_param(h, i), *b = nn_model_param(m, i);
    size_t k = a->grad.numel;
    float *ga = malloc(k * sizeof *ga), *gb = malloc(k * sizeof *gb);
    assert_non_null(ga);
    assert_non_null(gb);
    assert_ok(d->ops->to_host(d, ga, a->grad.data, k * sizeof *ga));
    assert_ok(d->ops->to_host(d, gb, b->grad.data, k * sizeof *gb));
    double top = 0, err = 0;
    for (size_t e = 0; e < k; e++) {
      top = fmax(top, fabs(gb[e]));
      err = fmax(err, fabs((double)ga[e] - gb[e]));
    }
    if (err > TOL * top) fprintf(stderr, "%s: gradient error %.3g of %.3g\n", a->name, err, top);
    assert_true(top > 0);
    assert_true(err <= TOL * top);
    free(ga);
    free(gb);
  }
  fl_tensor_destroy(xt);
  free(x);
  fl_model_destroy(m);
  hcnn_destroy(h);
  fl_device_close(d);
}

/* K ranks in `mode` against one rank with the K b batch: loss per step, first gradients and
 * final weights of every slice; and the bytes the step counted against the prediction. */
static void expect_matches_one_rank(hcnn_mode mode, int ranks, hcnn_bytes *bytes) {
  static run_cfg one, many; /* large: off the stack */
  hcnn_spec sp = small_spec();
  int global = ranks * PER_RANK;
  size_t n = (size_t)STEPS * (size_t)global;
  float *x = make_images(n, image_floats(&sp), 11);
  int32_t *labels = malloc(n * sizeof *labels);
  assert_non_null(labels);
  for (size_t i = 0; i < n; i++) labels[i] = (int32_t)((i * 7 + 3) % (size_t)sp.classes);
  one = (run_cfg){.spec = sp, .mode = HCNN_TRICK, .b = global, .x = x, .labels = labels};
  many = (run_cfg){.spec = sp, .mode = mode, .b = PER_RANK, .x = x, .labels = labels};
  run_on(&one, 1);
  run_on(&many, ranks);
  const rank_out *ref = &one.out[0];
  for (int r = 0; r < ranks; r++) {
    const rank_out *o = &many.out[r];
    assert_int_equal(o->np, ref->np);
    for (int s = 0; s < STEPS; s++) {
      double e = fabs(o->loss[s] - ref->loss[s]) / fabs(ref->loss[s]);
      if (e > TOL) fprintf(stderr, "%s K=%d rank %d step %d: loss %.9g, one rank %.9g\n", hcnn_mode_name(mode),
                           ranks, r, s, o->loss[s], ref->loss[s]);
      assert_true(e <= TOL);
    }
    assert_true(fabs(o->eval_loss - ref->eval_loss) <= TOL * fabs(ref->eval_loss));
    assert_true(o->eval_correct == ref->eval_correct);
    for (size_t i = 0; i < o->np; i++) {
      assert_string_equal(o->name[i], ref->name[i]);
      assert_int_equal(o->place[i].rows * o->place[i].cols, ref->numel[i]);
      /* Trick: the FC layers are split (the classifier's bias is replicated); dp: nothing is. */
      bool fc = strncmp(o->name[i], "conv", 4) != 0;
      bool split = mode == HCNN_TRICK && fc && strcmp(o->name[i], "classifier.bias") != 0;
      assert_int_equal(o->place[i].replicated, !split);
      assert_int_equal(o->numel[i] * (split ? ranks : 1), ref->numel[i]);
      double eg = slice_err(o, i, o->grad[i], ref->grad[i], ref->numel[i]);
      double ew = slice_err(o, i, o->value[i], ref->value[i], ref->numel[i]);
      if (eg > TOL || ew > TOL)
        fprintf(stderr, "%s K=%d rank %d %s: gradient error %.3g, weight error %.3g\n", hcnn_mode_name(mode),
                ranks, r, o->name[i], eg, ew);
      assert_true(eg <= TOL);
      assert_true(ew <= TOL);
    }
    hcnn_bytes want = hcnn_predict_bytes(&sp, mode, ranks, PER_RANK);
    assert_int_equal(o->bytes.activations, want.activations);
    assert_int_equal(o->bytes.gradients, want.gradients);
  }
  *bytes = many.out[0].bytes;
  for (int r = 0; r < ranks; r++) free_out(&many.out[r]);
  free_out(&one.out[0]);
  free(x);
  free(labels);
}

static void test_trick_and_dp_equal_one_rank(void **state) {
  (void)state;
  hcnn_spec sp = small_spec();
  for (int ranks = 2; ranks <= 4; ranks += 2) {
    hcnn_bytes trick, dp;
    expect_matches_one_rank(HCNN_TRICK, ranks, &trick);
    expect_matches_one_rank(HCNN_DATA_PARALLEL, ranks, &dp);
    /* Data parallelism allreduces every weight's gradient; the trick only the conv ones,
     * plus the activations: fewer bytes while the FC weights dominate. */
    uint64_t k = (uint64_t)ranks;
    assert_int_equal(dp.gradients, 2 * (k - 1) * (uint64_t)hcnn_weights(&sp) / k * 4);
    assert_true(trick.gradients < dp.gradients / 3);
    assert_true(trick.activations > 0);
    assert_true(trick.activations + trick.gradients < dp.activations + dp.gradients);
  }
}

/* The paper's argument at its scale: AlexNet-like features (256 x 6 x 6), two FC layers of
 * 4096 and 1000 classes, 128 examples per worker: the FC weights are ~95% of the model, and
 * the trick sends several times fewer bytes than data parallelism. */
static void test_bytes_at_alexnet_scale(void **state) {
  (void)state;
  hcnn_spec sp = {.channels = 3, .height = 24, .width = 24, .conv = {64, 256}, .nconv = 2,
                  .fc = {4096, 4096}, .nfc = 2, .classes = 1000, .seed = 1};
  assert_int_equal(hcnn_features(&sp), 256 * 6 * 6);
  assert_ok(hcnn_spec_check(&sp, HCNN_TRICK, 8));
  for (int k = 2; k <= 8; k *= 2) {
    hcnn_bytes t = hcnn_predict_bytes(&sp, HCNN_TRICK, k, 128);
    hcnn_bytes d = hcnn_predict_bytes(&sp, HCNN_DATA_PARALLEL, k, 128);
    assert_true(3 * (t.activations + t.gradients) < d.activations + d.gradients);
  }
  hcnn_bytes one = hcnn_predict_bytes(&sp, HCNN_TRICK, 1, 128);
  assert_int_equal(one.activations + one.gradients, 0);
}

typedef struct bad_cfg {
  hcnn_spec spec;
  hcnn_mode mode;
  int b;
  int bad_rank; /* the rank whose second label is bad_label */
  int32_t bad_label;
  fl_status got[MAX_RANKS];
  char msg[MAX_RANKS][256];
} bad_cfg;

/* Every rank gets a batch with one label out of range on bad_rank only: all of them fail
 * alike, naming it, and none waits for the others (the ranks agree on the check). */
static fl_status bad_label_rank(rank_job *job) {
  bad_cfg *cfg = job->arg;
  fl_device *d = NULL;
  hcnn *h = NULL;
  fl_status status = FL_OK;
  size_t img = image_floats(&cfg->spec);
  float *x = calloc((size_t)cfg->b * img, sizeof *x);
  int32_t labels[4] = {0, 1, 2, 3};
  if (job->rank == cfg->bad_rank) labels[1] = cfg->bad_label;
  FL_CHECK(x ? fl_device_open(FL_DEVICE_CPU, 0, &d) : FL_ENOMEM);
  FL_CHECK(hcnn_create(d, job->comm, &cfg->spec, cfg->mode, NULL, &h));
  cfg->got[job->rank] = hcnn_compute_gradients(h, x, labels, cfg->b, NULL);
  snprintf(cfg->msg[job->rank], sizeof cfg->msg[job->rank], "%s", fl_last_error());
  /* The trainer is still usable. */
  labels[1] = 1;
  FL_CHECK(hcnn_compute_gradients(h, x, labels, cfg->b, NULL));
cleanup:
  hcnn_destroy(h);
  fl_device_close(d);
  free(x);
  return status;
}

static void test_bad_arguments(void **state) {
  (void)state;
  hcnn_spec sp = small_spec();
  fl_device *d;
  hcnn *h = NULL;
  assert_ok(fl_device_open(FL_DEVICE_CPU, 0, &d));
  /* K must divide every hidden FC width (the classes need not). */
  assert_ok(hcnn_spec_check(&sp, HCNN_TRICK, 4));
  assert_fails_with(hcnn_spec_check(&sp, HCNN_TRICK, 3), FL_EINVAL, "fc[0] has 16 units, which 3 ranks do not divide");
  sp.fc[1] = 6;
  assert_fails_with(hcnn_spec_check(&sp, HCNN_TRICK, 4), FL_EINVAL, "fc[1] has 6 units");
  assert_ok(hcnn_spec_check(&sp, HCNN_DATA_PARALLEL, 4)); /* nothing is split there */
  sp = small_spec();
  sp.nfc = 0;
  assert_fails_with(hcnn_spec_check(&sp, HCNN_TRICK, 1), FL_EINVAL, "nfc is 0");
  sp = small_spec();
  sp.nconv = 4;
  sp.conv[2] = sp.conv[3] = 8;
  assert_fails_with(hcnn_spec_check(&sp, HCNN_TRICK, 1), FL_EINVAL, "too small for 4 2x2 poolings");
  sp = small_spec();
  sp.classes = 0;
  assert_fails_with(hcnn_create(d, NULL, &sp, HCNN_TRICK, NULL, &h), FL_EINVAL, "classes is 0");
  assert_null(h);
  sp = small_spec();
  sp.conv[1] = -2;
  assert_fails_with(hcnn_create(d, NULL, &sp, HCNN_TRICK, NULL, &h), FL_EINVAL, "conv[1] is -2");
  sp = small_spec();
  optim_options bad = OPTIM_OPTIONS_INIT;
  bad.momentum = 1.5f;
  assert_int_equal(hcnn_create(d, NULL, &sp, HCNN_TRICK, &bad, &h), FL_EINVAL);
  hcnn_mode mode;
  assert_ok(hcnn_mode_parse("dp", &mode));
  assert_int_equal(mode, HCNN_DATA_PARALLEL);
  assert_fails_with(hcnn_mode_parse("mp", &mode), FL_EINVAL, "unknown hybrid CNN mode 'mp'");

  /* Bad batches and labels on one rank. */
  assert_ok(hcnn_create(d, NULL, &sp, HCNN_TRICK, NULL, &h));
  float x[4 * 3 * 12 * 12] = {0};
  int32_t labels[4] = {0, 1, 2, 3};
  assert_fails_with(hcnn_compute_gradients(h, x, labels, 0, NULL), FL_EINVAL, "a batch of 0 examples");
  assert_fails_with(hcnn_compute_gradients(h, x, labels, -3, NULL), FL_EINVAL, "a batch of -3 examples");
  assert_fails_with(hcnn_compute_gradients(h, NULL, labels, 4, NULL), FL_EINVAL, "NULL");
  labels[2] = 5;
  assert_fails_with(hcnn_compute_gradients(h, x, labels, 4, NULL), FL_EINVAL, "label 5 of example 2");
  labels[2] = 2;
  hcnn_stats st;
  assert_ok(hcnn_compute_gradients(h, x, labels, 4, &st));
  assert_true(isfinite(st.loss));
  assert_ok(hcnn_apply(h, 0.1f));
  hcnn_destroy(h);
  hcnn_destroy(NULL);
  fl_device_close(d);

  /* A bad label on one rank of two: both fail, and both go on. */
  static bad_cfg cfg;
  cfg = (bad_cfg){.spec = small_spec(), .b = 4, .bad_label = -1};
  group g;
  rank_job jobs[MAX_RANKS];
  group_create(&g, 2);
  run_ranks(2, g.comms, bad_label_rank, &cfg, jobs);
  expect_all_ok(2, jobs);
  group_destroy(&g);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(cfg.got[r], FL_EINVAL);
    assert_non_null(strstr(cfg.msg[r], "label -1 of example 1 (rank 0's 1)"));
  }
  /* In data parallelism no rank sees the others' labels: rank 1's bad one still fails
   * every rank at once (a short collective timeout: a rank left waiting in the next
   * collective would fail with it instead, or, once the others move on, mismatch steps). */
  setenv("FLINT_COMM_TIMEOUT_MS", "3000", 1);
  static const int32_t bad_labels[] = {7, INT32_MIN, 16777217};
  for (size_t i = 0; i < sizeof bad_labels / sizeof *bad_labels; i++) {
    for (int mode = HCNN_TRICK; mode <= HCNN_DATA_PARALLEL; mode++) {
      cfg = (bad_cfg){.spec = small_spec(), .mode = (hcnn_mode)mode, .b = 4, .bad_rank = 1,
                      .bad_label = bad_labels[i]};
      group_listen(&g, 2);
      group_connect(&g, jobs);
      expect_all_ok(2, jobs);
      run_ranks(2, g.comms, bad_label_rank, &cfg, jobs);
      expect_all_ok(2, jobs);
      group_destroy(&g);
      char want[96];
      snprintf(want, sizeof want, "label %d of example 5 (rank 1's 1) is outside [0, 5)", (int)bad_labels[i]);
      for (int r = 0; r < 2; r++) {
        if (cfg.got[r] != FL_EINVAL || !strstr(cfg.msg[r], want))
          fprintf(stderr, "%s, rank %d: %s: %s\n", hcnn_mode_name((hcnn_mode)mode), r,
                  fl_status_name(cfg.got[r]), cfg.msg[r]);
        assert_int_equal(cfg.got[r], FL_EINVAL);
        assert_non_null(strstr(cfg.msg[r], want));
      }
    }
  }
  unsetenv("FLINT_COMM_TIMEOUT_MS");
  /* K must divide the FC widths when the trainer is made on a group. */
  cfg = (bad_cfg){.spec = small_spec(), .b = 4, .bad_label = 0};
  cfg.spec.fc[0] = 15;
  group_create(&g, 2);
  run_ranks(2, g.comms, bad_label_rank, &cfg, jobs);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(jobs[r].status, FL_EINVAL);
    assert_non_null(strstr(jobs[r].msg, "fc[0] has 15 units, which 2 ranks do not divide"));
  }
  group_destroy(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_one_rank_equals_plain_model, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_trick_and_dp_equal_one_rank, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bytes_at_alexnet_scale, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_bad_arguments, test_bound_arm, test_bound_disarm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
