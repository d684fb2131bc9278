/*
 * test_gpu_optim.c: the training stack around the model, on the cpu device: SGD steps against
 * hand-computed values (momentum, Nesterov, weight decay), the schedules at chosen points,
 * checkpoint round trips and every corrupt blob, the curves' CSV, SVG and progress line, the
 * image datasets (a tiny IDX pair written here, plain and gzip'd, and every bad input),
 * the rank's reader and synthetic-imagenet's determinism.
 */
#include <math.h>
#include <zlib.h>

#include "test_util.h"

#include "gpu/data/data.h"
#include "gpu/device/device.h"
#include "gpu/nn/nn.h"
#include "gpu/parallel/curves.h"
#include "gpu/parallel/train.h"

static fl_device *open_cpu(void) {
  fl_device *dev = NULL;
  assert_ok(fl_device_open(FL_DEVICE_CPU, 0, &dev));
  return dev;
}

static fl_tensor *tensor_of(fl_device *dev, const float *v, size_t n) {
  fl_tensor *t = NULL;
  int64_t shape[1] = {(int64_t)n};
  assert_ok(fl_tensor_create(dev, 1, shape, &t));
  assert_ok(fl_tensor_write(t, v, n));
  return t;
}

static void expect_values(const fl_tensor *t, const float *want, size_t n, float tol) {
  float got[64];
  assert_true(n <= 64);
  assert_ok(fl_tensor_read(t, got, n));
  for (size_t i = 0; i < n; i++) {
    if (fabsf(got[i] - want[i]) > tol) fprintf(stderr, "[%zu] got %.7f want %.7f\n", i, got[i], want[i]);
    assert_true(fabsf(got[i] - want[i]) <= tol);
  }
}

/* ---- SGD ------------------------------------------------------------------------------- */

/* w = 1, grad 0.5 twice, lr 0.1, momentum 0.9, weight decay 0.1, worked by hand:
 *   step 1: g = 0.5 + 0.1 * 1 = 0.6; v = 0.6; w = 1 - 0.06 = 0.94
 *   step 2: g = 0.5 + 0.094 = 0.594; v = 0.54 + 0.594 = 1.134; w = 0.94 - 0.1134 = 0.8266
 * Nesterov: step 1: w = 1 - 0.1 * (0.6 + 0.54) = 0.886
 *   step 2: g = 0.5 + 0.0886 = 0.5886; v = 0.54 + 0.5886 = 1.1286;
 *           w = 0.886 - 0.1 * (0.5886 + 1.01574) = 0.725566 */
static void run_two_steps(bool nesterov, float w1, float w2, float v2) {
  fl_device *dev = open_cpu();
  optim_sgd_options o = {.momentum = 0.9f, .nesterov = nesterov, .weight_decay = 0.1f};
  float w[3] = {1, 1, 1}, g[3] = {0.5f, 0.5f, 0.5f};
  fl_tensor *values = tensor_of(dev, w, 3), *grads = tensor_of(dev, g, 3);
  optim_sgd *opt = NULL;
  assert_ok(optim_sgd_create(dev, 3, &o, &opt));
  assert_ok(optim_sgd_step(opt, 0.1f, grads, values));
  float want1[3] = {w1, w1, w1};
  expect_values(values, want1, 3, 1e-6f);
  assert_ok(optim_sgd_step(opt, 0.1f, grads, values));
  float want2[3] = {w2, w2, w2}, vel[3];
  expect_values(values, want2, 3, 1e-6f);
  assert_ok(dev->ops->to_host(dev, vel, optim_sgd_velocity(opt), sizeof vel));
  for (int i = 0; i < 3; i++) assert_true(fabsf(vel[i] - v2) < 1e-6f);
  /* reset: a fresh start behaves as step 1 again from the current weights. */
  assert_ok(optim_sgd_reset(opt));
  assert_ok(dev->ops->to_host(dev, vel, optim_sgd_velocity(opt), sizeof vel));
  for (int i = 0; i < 3; i++) assert_true(vel[i] == 0);
  optim_sgd_destroy(opt);
  fl_tensor_destroy(values);
  fl_tensor_destroy(grads);
  fl_device_close(dev);
}

static void test_sgd_momentum_weight_decay(void **state) {
  (void)state;
  run_two_steps(false, 0.94f, 0.8266f, 1.134f);
}

static void test_sgd_nesterov(void **state) {
  (void)state;
  run_two_steps(true, 0.886f, 0.725566f, 1.1286f);
}

/* Momentum 0, no decay: plain w -= lr * g, element by element. */
static void test_sgd_plain(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  optim_sgd_options o = {0};
  float w[4] = {1, -2, 3, 0}, g[4] = {1, 1, -2, 0.25f};
  fl_tensor *values = tensor_of(dev, w, 4), *grads = tensor_of(dev, g, 4);
  optim_sgd *opt = NULL;
  assert_ok(optim_sgd_create(dev, 4, &o, &opt));
  assert_ok(optim_sgd_step(opt, 0.5f, grads, values));
  float want[4] = {0.5f, -2.5f, 4, -0.125f};
  expect_values(values, want, 4, 1e-7f);
  optim_sgd_destroy(opt);
  fl_tensor_destroy(values);
  fl_tensor_destroy(grads);
  fl_device_close(dev);
}

static void test_sgd_bad_arguments(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  optim_sgd *opt = NULL;
  optim_sgd_options o = {.momentum = 1.0f};
  assert_fails_with(optim_sgd_create(dev, 3, &o, &opt), FL_EINVAL, "momentum");
  o = (optim_sgd_options){.momentum = 0, .nesterov = true};
  assert_fails_with(optim_sgd_create(dev, 3, &o, &opt), FL_EINVAL, "Nesterov");
  o = (optim_sgd_options){.momentum = 0.9f, .weight_decay = -1};
  assert_fails_with(optim_sgd_create(dev, 3, &o, &opt), FL_EINVAL, "weight decay");
  o = (optim_sgd_options)OPTIM_SGD_OPTIONS_INIT;
  assert_fails_with(optim_sgd_create(dev, 0, &o, &opt), FL_EINVAL, "no parameters");
  assert_ok(optim_sgd_create(dev, 3, &o, &opt));
  float v[4] = {0};
  fl_tensor *three = tensor_of(dev, v, 3), *four = tensor_of(dev, v, 4);
  assert_fails_with(optim_sgd_step(opt, 0.1f, four, three), FL_EINVAL, "4 gradients");
  assert_fails_with(optim_sgd_step(opt, -0.1f, three, three), FL_EINVAL, "learning rate");
  assert_fails_with(optim_sgd_step(opt, NAN, three, three), FL_EINVAL, "learning rate");
  optim_sgd_destroy(opt);
  optim_sgd_destroy(NULL);
  fl_tensor_destroy(three);
  fl_tensor_destroy(four);
  fl_device_close(dev);
}

/* ---- schedules ----------------------------------------------------------------------- */

#define assert_near(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-9 * (1 + fabs((double)(b))))

static void test_schedule_linear_scaling_and_warmup(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 8192, .warmup_epochs = 5, .epochs = 90};
  assert_ok(optim_schedule_validate(&s));
  assert_near(optim_schedule_peak_lr(&s), 3.2); /* 0.1 x 8192 / 256 */
  assert_near(optim_lr_at(&s, 0), 0.1);          /* warmup starts at the small-batch rate */
  assert_near(optim_lr_at(&s, 2.5), 0.1 + 3.1 * 0.5);
  assert_near(optim_lr_at(&s, 1.0 / 7), 0.1 + 3.1 * (1.0 / 7) / 5); /* per step, not per epoch */
  assert_near(optim_lr_at(&s, 5), 3.2);
  assert_near(optim_lr_at(&s, 40), 3.2);
  assert_near(optim_lr_at(&s, -1), 0.1);
  /* batch 256: peak = base, warmup is flat. */
  s.global_batch = 256;
  assert_near(optim_lr_at(&s, 1), 0.1);
  /* batch 128: peak 0.05, warmup starts at the smaller rate (min(base, peak)). */
  s.global_batch = 128;
  assert_near(optim_lr_at(&s, 0), 0.05);
  s.reference_batch = 128;
  assert_near(optim_schedule_peak_lr(&s), 0.1);
}

static void test_schedule_step_and_cosine(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 512, .warmup_epochs = 0, .epochs = 90,
                      .decay = OPTIM_DECAY_STEP, .milestones = {30, 60, 80}, .num_milestones = 3};
  assert_ok(optim_schedule_validate(&s));
  assert_near(optim_lr_at(&s, 29.99), 0.2);
  assert_near(optim_lr_at(&s, 30), 0.02);
  assert_near(optim_lr_at(&s, 60), 0.002);
  assert_near(optim_lr_at(&s, 85), 0.0002);
  s.step_factor = 0.5;
  assert_near(optim_lr_at(&s, 61), 0.05);

  optim_schedule c = {.base_lr = 0.1, .global_batch = 1024, .warmup_epochs = 10, .epochs = 50,
                      .decay = OPTIM_DECAY_COSINE};
  assert_ok(optim_schedule_validate(&c));
  assert_near(optim_lr_at(&c, 10), 0.4);  /* the peak at the end of warmup */
  assert_near(optim_lr_at(&c, 30), 0.2);  /* half way down */
  assert_near(optim_lr_at(&c, 20), 0.2 * (1 + cos(M_PI / 4)));
  assert_near(optim_lr_at(&c, 50), 0.0);
  assert_near(optim_lr_at(&c, 70), 0.0);  /* past the end: the end */
  assert_near(optim_lr_at(&c, 5), 0.1 + 0.3 * 0.5);
}

static void test_schedule_validation(void **state) {
  (void)state;
  optim_schedule s = {.base_lr = 0.1, .global_batch = 256, .epochs = 10};
  assert_ok(optim_schedule_validate(&s));
  s.base_lr = 0;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "base learning rate");
  s.base_lr = 0.1;
  s.global_batch = 0;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "global batch");
  s.global_batch = 256;
  s.warmup_epochs = 10;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "warmup");
  s.warmup_epochs = 1;
  s.decay = OPTIM_DECAY_STEP;
  s.num_milestones = 2;
  s.milestones[0] = 5;
  s.milestones[1] = 3;
  assert_fails_with(optim_schedule_validate(&s), FL_EINVAL, "milestone 3");
  optim_decay d;
  assert_ok(optim_decay_parse("cosine", &d));
  assert_int_equal(d, OPTIM_DECAY_COSINE);
  assert_fails_with(optim_decay_parse("linear", &d), FL_EINVAL, "'linear'");
  assert_string_equal(optim_decay_name(OPTIM_DECAY_STEP), "step");
}

/* ---- checkpoints --------------------------------------------------------------------- */

typedef struct ckpt_fixture {
  fl_device *dev;
  fl_tensor *values, *buffers;
  optim_sgd *opt;
  fl_buf blob;
} ckpt_fixture;

static const float ck_values[5] = {0.5f, -1.25f, 3, 7.5f, -0.125f};
static const float ck_buffers[2] = {0.25f, 4};

static void ckpt_make(ckpt_fixture *f) {
  f->dev = open_cpu();
  f->values = tensor_of(f->dev, ck_values, 5);
  f->buffers = tensor_of(f->dev, ck_buffers, 2);
  optim_sgd_options o = OPTIM_SGD_OPTIONS_INIT;
  assert_ok(optim_sgd_create(f->dev, 5, &o, &f->opt));
  float vel[5] = {1, 2, 3, 4, 5};
  assert_ok(f->dev->ops->from_host(f->dev, optim_sgd_velocity(f->opt), vel, sizeof vel));
  checkpoint_state st = {.epoch = 3, .step = 1234, .position = 3.0, .lr = 0.4};
  f->blob = (fl_buf)FL_BUF_INIT;
  assert_ok(checkpoint_encode(f->values, f->buffers, f->opt, &st, &f->blob));
  assert_int_equal(f->blob.len, 72 + 4 * (5 + 2 + 5) + 4);
  assert_memory_equal(f->blob.data, CHECKPOINT_MAGIC, 8);
}

static void ckpt_free(ckpt_fixture *f) {
  fl_buf_free(&f->blob);
  optim_sgd_destroy(f->opt);
  fl_tensor_destroy(f->values);
  fl_tensor_destroy(f->buffers);
  fl_device_close(f->dev);
}

static void test_checkpoint_round_trip(void **state) {
  (void)state;
  ckpt_fixture f;
  ckpt_make(&f);
  /* Into a second "model" of the same shape. */
  float zeros[5] = {0};
  fl_tensor *v2 = tensor_of(f.dev, zeros, 5), *b2 = tensor_of(f.dev, zeros, 2);
  optim_sgd_options o = OPTIM_SGD_OPTIONS_INIT;
  optim_sgd *opt2 = NULL;
  assert_ok(optim_sgd_create(f.dev, 5, &o, &opt2));
  checkpoint_state st = {0};
  assert_ok(checkpoint_decode(fl_buf_bytes(&f.blob), v2, b2, opt2, &st));
  expect_values(v2, ck_values, 5, 0);
  expect_values(b2, ck_buffers, 2, 0);
  float vel[5];
  assert_ok(f.dev->ops->to_host(f.dev, vel, optim_sgd_velocity(opt2), sizeof vel));
  for (int i = 0; i < 5; i++) assert_true(vel[i] == (float)(i + 1));
  assert_int_equal(st.epoch, 3);
  assert_int_equal(st.step, 1234);
  assert_true(st.position == 3.0 && st.lr == 0.4);
  /* Without an optimizer (evaluation) the velocity is skipped. */
  assert_ok(checkpoint_decode(fl_buf_bytes(&f.blob), v2, b2, NULL, &st));
  /* And through a file. */
  char dir[256], path[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/run.ckpt", dir);
  assert_ok(checkpoint_save_file(path, fl_buf_bytes(&f.blob)));
  fl_buf back = FL_BUF_INIT;
  assert_ok(checkpoint_load_file(path, &back));
  assert_int_equal(back.len, f.blob.len);
  assert_memory_equal(back.data, f.blob.data, back.len);
  fl_buf_free(&back);
  snprintf(path, sizeof path, "%s/missing.ckpt", dir);
  assert_fails_with(checkpoint_load_file(path, &back), FL_ENOENT, "missing.ckpt");
  snprintf(path, sizeof path, "%s/no/such/dir/x.ckpt", dir);
  assert_fails_with(checkpoint_save_file(path, fl_buf_bytes(&f.blob)), FL_EIO, "x.ckpt");
  test_rmtree(dir);
  optim_sgd_destroy(opt2);
  fl_tensor_destroy(v2);
  fl_tensor_destroy(b2);
  ckpt_free(&f);
}

/* Decodes a damaged copy; the model must be left as it was. */
static void expect_bad_blob(ckpt_fixture *f, const uint8_t *data, size_t len, fl_status code, const char *needle) {
  float sentinel[5] = {9, 9, 9, 9, 9};
  assert_ok(fl_tensor_write(f->values, sentinel, 5));
  checkpoint_state st = {.epoch = 77};
  assert_fails_with(checkpoint_decode(fl_bytes_of(data, len), f->values, f->buffers, f->opt, &st), code, needle);
  expect_values(f->values, sentinel, 5, 0);
  assert_int_equal(st.epoch, 77);
}

static void test_checkpoint_corrupt_blobs(void **state) {
  (void)state;
  ckpt_fixture f;
  ckpt_make(&f);
  size_t n = f.blob.len;
  uint8_t *copy = malloc(n + 8);
  assert_non_null(copy);
  /* wrong magic */
  memcpy(copy, f.blob.data, n);
  copy[0] = 'X';
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "not a flint checkpoint");
  expect_bad_blob(&f, copy, 0, FL_EFORMAT, "not a flint checkpoint");
  /* truncated: inside the header, and by one byte */
  memcpy(copy, f.blob.data, n);
  expect_bad_blob(&f, copy, 40, FL_EFORMAT, "truncated");
  expect_bad_blob(&f, copy, n - 1, FL_EFORMAT, "truncated");
  /* trailing bytes */
  memcpy(copy + n, "abcd", 4);
  expect_bad_blob(&f, copy, n + 4, FL_EFORMAT, "trailing");
  /* an unknown version */
  copy[8] = 9;
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "version 9");
  copy[8] = 1;
  /* a count that would overflow */
  memset(copy + 16, 0xff, 8);
  expect_bad_blob(&f, copy, n, FL_EFORMAT, "truncated");
  memcpy(copy, f.blob.data, n);
  /* checksum: a flipped bit in the payload, and in the header's step */
  copy[80] ^= 0x10;
  expect_bad_blob(&f, copy, n, FL_ECORRUPT, "checksum");
  copy[80] ^= 0x10;
  copy[48] ^= 1;
  expect_bad_blob(&f, copy, n, FL_ECORRUPT, "checksum");
  /* a model of another shape */
  float zeros[6] = {0};
  fl_tensor *six = tensor_of(f.dev, zeros, 6);
  checkpoint_state st;
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), six, f.buffers, f.opt, &st), FL_EINVAL,
                    "weights of 5 floats does not match this model's 6");
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), f.values, NULL, f.opt, &st), FL_EINVAL,
                    "batch-norm buffers of 2");
  optim_sgd *opt6 = NULL;
  optim_sgd_options o = OPTIM_SGD_OPTIONS_INIT;
  assert_ok(optim_sgd_create(f.dev, 6, &o, &opt6));
  assert_fails_with(checkpoint_decode(fl_buf_bytes(&f.blob), f.values, f.buffers, opt6, &st), FL_EINVAL,
                    "optimizer velocity");
  optim_sgd_destroy(opt6);
  fl_tensor_destroy(six);
  free(copy);
  ckpt_free(&f);
}

/* ---- curves -------------------------------------------------------------------------- */

static size_t count_of(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static void test_curves_csv_svg_progress(void **state) {
  (void)state;
  curves c = CURVES_INIT;
  curves_row r1 = {1, 0.9, 0.7, 0.8, 0.75, 0.1, 1234.5, 2.5};
  curves_row r2 = {2, 0.5, 0.85, NAN, NAN, 0.05, 2000, 2.25};
  assert_ok(curves_append(&c, &r1));
  assert_ok(curves_append(&c, &r2));
  fl_buf b = FL_BUF_INIT;
  assert_ok(curves_csv(&c, &b));
  assert_ok(fl_buf_append(&b, "", 1));
  assert_string_equal((char *)b.data, CURVES_CSV_HEADER "\n"
                                      "1,0.9,0.7,0.8,0.75,0.1,1234.5,2.5\n"
                                      "2,0.5,0.85,,,0.05,2000,2.25\n");
  assert_ok(curves_svg(&c, "mlp <fashion-mnist> & more", &b));
  assert_ok(fl_buf_append(&b, "", 1));
  const char *svg = (const char *)b.data;
  assert_true(strncmp(svg, "<svg ", 5) == 0);
  assert_non_null(strstr(svg, "</svg>\n"));
  assert_int_equal(count_of(svg, "<polyline"), 4);
  assert_int_equal(count_of(svg, "<g "), count_of(svg, "</g>"));
  assert_int_equal(count_of(svg, "<text"), count_of(svg, "</text>"));
  assert_non_null(strstr(svg, "mlp &lt;fashion-mnist&gt; &amp; more"));
  assert_non_null(strstr(svg, ">epoch</text>"));
  assert_non_null(strstr(svg, ">accuracy</text>"));
  /* The test series has one point (epoch 2's is NaN). */
  const char *test_acc = strstr(svg, "class=\"test accuracy\"");
  assert_non_null(test_acc);
  const char *pts = strstr(test_acc, "points=\"");
  assert_non_null(pts);
  assert_true(strchr(pts + 8, '"') - (pts + 8) < 16 && !memchr(pts + 8, ' ', (size_t)(strchr(pts + 8, '"') - (pts + 8))));

  char dir[256], csv[300], svgp[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(csv, sizeof csv, "%s/c.csv", dir);
  snprintf(svgp, sizeof svgp, "%s/c.svg", dir);
  assert_ok(curves_write_csv(&c, csv));
  assert_ok(curves_write_svg(&c, NULL, svgp));
  fl_buf file = FL_BUF_INIT;
  assert_ok(checkpoint_load_file(csv, &file));
  assert_true(file.len > strlen(CURVES_CSV_HEADER));
  fl_buf_free(&file);
  snprintf(csv, sizeof csv, "%s/nope/c.csv", dir);
  assert_fails_with(curves_write_csv(&c, csv), FL_EIO, "nope/c.csv");
  test_rmtree(dir);

  char line[160];
  curves_progress_format(line, sizeof line, 3, 10, 0.52, 0.512, 0.83, 1234);
  assert_string_equal(line, "epoch 3/10 [##########..........]  52% loss 0.512 acc 0.830 1234 img/s");
  curves_progress_format(line, sizeof line, 10, 10, 1.5, 0.1, 0.9, 0);
  assert_non_null(strstr(line, "[####################] 100%"));
  fl_buf_free(&b);
  curves_free(&c);
  assert_int_equal(c.count, 0);
}

/* ---- data ------------------------------------------------------------------------------ */

static char data_dir[256];

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* n images of 2 x 3 pixels (pixel k of image i = 10 i + k) and n_labels labels (i % 4). */
static void write_idx(const char *name, uint32_t n, uint32_t n_labels, uint32_t magic, bool gz, char *images,
                      char *labels) {
  uint8_t buf[16 + 64 * 6];
  put_be32(buf, magic);
  put_be32(buf + 4, n);
  put_be32(buf + 8, 2);
  put_be32(buf + 12, 3);
  for (uint32_t i = 0; i < n; i++)
    for (int k = 0; k < 6; k++) buf[16 + i * 6 + k] = (uint8_t)(10 * i + k);
  uint8_t lab[8 + 64];
  put_be32(lab, 0x801);
  put_be32(lab + 4, n_labels);
  for (uint32_t i = 0; i < n_labels; i++) lab[8 + i] = (uint8_t)(i % 4);
  snprintf(images, 300, "%s/%s-images%s", data_dir, name, gz ? ".gz" : "");
  snprintf(labels, 300, "%s/%s-labels%s", data_dir, name, gz ? ".gz" : "");
  if (!gz) {
    test_write_file(images, buf, 16 + n * 6);
    test_write_file(labels, lab, 8 + n_labels);
    return;
  }
  gzFile f = gzopen(images, "wb");
  assert_non_null(f);
  assert_int_equal(gzwrite(f, buf, 16 + n * 6), (int)(16 + n * 6));
  assert_int_equal(gzclose(f), Z_OK);
  f = gzopen(labels, "wb");
  assert_non_null(f);
  assert_int_equal(gzwrite(f, lab, 8 + n_labels), (int)(8 + n_labels));
  assert_int_equal(gzclose(f), Z_OK);
}

static int data_setup(void **state) {
  test_tmpdir(data_dir, sizeof data_dir);
  fl_context *ctx = NULL;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) return -1;
  *state = ctx;
  return 0;
}

static int data_teardown(void **state) {
  fl_context_close(*state);
  test_rmtree(data_dir);
  return 0;
}

/* Collects a dataset of blocks into a reader (in partition order). */
static data_reader *read_all(fl_dataset *ds, uint32_t batch, data_reader *test) {
  fl_records *recs = NULL;
  assert_ok(fl_collect(ds, &recs));
  data_reader *r = NULL;
  assert_ok(data_reader_create(batch, &r));
  for (size_t i = 0; i < fl_records_count(recs); i++) {
    data_block b;
    assert_ok(data_block_view(fl_records_get(recs, i), &b));
    assert_ok(data_reader_add_block(b.split == DATA_SPLIT_TEST && test ? test : r, fl_records_get(recs, i)));
  }
  fl_records_free(recs);
  return r;
}

static void check_idx(fl_context *ctx, bool gz) {
  char images[300], labels[300];
  write_idx(gz ? "gz" : "plain", 5, 5, 0x803, gz, images, labels);
  data_options o = {.partitions = 2, .block_images = 2};
  data_set d = {0};
  assert_ok(data_load_idx(ctx, images, labels, 4, &o, &d));
  assert_int_equal(d.images, 5);
  assert_int_equal(d.channels, 1);
  assert_int_equal(d.height, 2);
  assert_int_equal(d.width, 3);
  assert_int_equal(d.partitions, 2);
  assert_int_equal(fl_dataset_partitions(d.blocks), 2);
  uint64_t blocks = 0;
  assert_ok(fl_count(d.blocks, &blocks));
  assert_int_equal(blocks, 3); /* images 0-1 | 2-3, 4 */
  data_reader *r = read_all(d.blocks, 5, NULL);
  assert_int_equal(data_reader_images(r), 5);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  float x[5 * 6];
  int32_t y[5];
  assert_int_equal(data_reader_next(r, x, y), 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(y[i], i % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * i + k) / 255) < 1e-7f);
  }
  data_reader_destroy(r);
  data_set_free(&d);
  /* Interleaved over 2 partitions, the first 4 images: partition 0 holds 0, 2 and partition
   * 1 holds 1, 3 (blocks of stride 2). */
  data_options oi = {.partitions = 2, .block_images = 2, .interleave = true, .max_images = 4};
  assert_ok(data_load_idx(ctx, images, labels, 4, &oi, &d));
  assert_int_equal(d.images, 4);
  r = read_all(d.blocks, 4, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 4);
  static const int order[4] = {0, 2, 1, 3};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(y[i], order[i] % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * order[i] + k) / 255) < 1e-7f);
  }
  fl_records *recs = NULL;
  assert_ok(fl_collect(d.blocks, &recs));
  data_block blk;
  assert_ok(data_block_view(fl_records_get(recs, 1), &blk));
  assert_int_equal(blk.first, 1);
  assert_int_equal(blk.stride, 2);
  fl_records_free(recs);
  data_reader_destroy(r);
  data_set_free(&d);
  /* Runs of 2 over 2 partitions, all 5 images: partition 0 holds runs 0 and 2 (images 0, 1,
   * 4), partition 1 run 1 (images 2, 3); no block crosses a run. */
  data_options orun = {.partitions = 2, .block_images = 4, .interleave = true, .run = 2};
  assert_ok(data_load_idx(ctx, images, labels, 4, &orun, &d));
  assert_int_equal(d.images, 5);
  r = read_all(d.blocks, 5, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 5);
  static const int runs[5] = {0, 1, 4, 2, 3};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(y[i], runs[i] % 4);
    for (int k = 0; k < 6; k++) assert_true(fabsf(x[i * 6 + k] - (float)(10 * runs[i] + k) / 255) < 1e-7f);
  }
  assert_ok(fl_collect(d.blocks, &recs));
  assert_int_equal(fl_records_count(recs), 3); /* 0-1 | 4 | 2-3 */
  assert_ok(data_block_view(fl_records_get(recs, 1), &blk));
  assert_int_equal(blk.first, 4);
  assert_int_equal(blk.count, 1);
  fl_records_free(recs);
  data_reader_destroy(r);
  data_set_free(&d);
  /* Standardized pixels. */
  o.norm = DATA_NORM_STANDARD;
  assert_ok(data_load_idx(ctx, images, labels, 4, &o, &d));
  r = read_all(d.blocks, 1, NULL);
  data_reader_start_epoch(r, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r, x, y), 1);
  assert_true(fabsf(x[1] - (float)((1 / 255.0 - DATA_FASHION_MNIST_MEAN) / DATA_FASHION_MNIST_STD)) < 1e-5f);
  data_reader_destroy(r);
  data_set_free(&d);
}

static void test_data_idx_plain_and_gz(void **state) {
  check_idx(*state, false);
  check_idx(*state, true);
}

static void test_data_idx_bad_input(void **state) {
  fl_context *ctx = *state;
  char images[300], labels[300], other[300], other_labels[300];
  data_set d = {0};
  /* count mismatch between images and labels */
  write_idx("mismatch", 5, 4, 0x803, false, images, labels);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "has 5 images but");
  assert_non_null(strstr(fl_last_error(), "mismatch-labels"));
  /* bad magic (a labels file given as the images) */
  write_idx("magic", 5, 5, 0x801, false, images, labels);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "bad magic");
  assert_non_null(strstr(fl_last_error(), "magic-images"));
  /* the labels file given for images, the other way round */
  write_idx("good", 5, 5, 0x803, false, images, labels);
  assert_fails_with(data_load_idx(ctx, labels, images, 4, NULL, &d), FL_EFORMAT, "bad magic");
  /* labels out of range for 3 classes (label 3) */
  assert_fails_with(data_load_idx(ctx, images, labels, 3, NULL, &d), FL_EFORMAT, "label 4 is 3");
  /* missing file, named */
  snprintf(other, sizeof other, "%s/no-such-images", data_dir);
  assert_fails_with(data_load_idx(ctx, other, labels, 4, NULL, &d), FL_ENOENT, "no-such-images");
  snprintf(other_labels, sizeof other_labels, "%s/no-such-labels", data_dir);
  assert_fails_with(data_load_idx(ctx, images, other_labels, 4, NULL, &d), FL_ENOENT, "no-such-labels");
  /* a truncated images file (plain: checked by size) */
  FILE *f = fopen(images, "r+b");
  assert_non_null(f);
  assert_int_equal(ftruncate(fileno(f), 16 + 4 * 6 + 3), 0);
  fclose(f);
  assert_fails_with(data_load_idx(ctx, images, labels, 4, NULL, &d), FL_EFORMAT, "truncated");
  /* Fashion-MNIST from a folder without it */
  assert_fails_with(data_fashion_mnist(ctx, data_dir, true, NULL, &d), FL_ENOENT, "train-images-idx3-ubyte.gz");
  assert_null(d.blocks);
}

static void test_data_fashion_mnist_if_installed(void **state) {
  fl_context *ctx = *state;
  struct stat st;
  if (stat(DATA_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", &st) != 0) skip();
  data_options o = {.partitions = 3};
  data_set d = {0};
  assert_ok(data_fashion_mnist(ctx, NULL, false, &o, &d));
  assert_int_equal(d.images, 10000);
  assert_int_equal(d.height, 28);
  assert_int_equal(d.classes, 10);
  data_reader *r = read_all(d.blocks, 100, NULL);
  assert_int_equal(data_reader_images(r), 10000);
  assert_int_equal(data_reader_batches(r, false), 100);
  data_reader_destroy(r);
  data_set_free(&d);
}

static void test_reader_shuffle_and_batches(void **state) {
  (void)state;
  data_reader *r = NULL;
  assert_fails_with(data_reader_create(0, &r), FL_EINVAL, "batch 0");
  assert_ok(data_reader_create(4, &r));
  /* 10 images of 1x1x1 whose pixel is their index, in blocks of 3, 3, 4. */
  fl_buf rec = FL_BUF_INIT;
  for (int blk = 0, at = 0; blk < 3; blk++) {
    int n = blk < 2 ? 3 : 4;
    float px[4];
    int32_t lab[4];
    for (int i = 0; i < n; i++) {
      px[i] = (float)(at + i);
      lab[i] = (at + i) % 2;
    }
    assert_ok(data_block_encode((uint32_t)n, 1, 1, 1, 2, DATA_SPLIT_TRAIN, (uint64_t)at, 1, lab, px, &rec));
    assert_ok(data_reader_add_block(r, fl_buf_bytes(&rec)));
    at += n;
  }
  /* A block of another shape is refused. */
  float big[4] = {0};
  int32_t l0 = 0;
  assert_ok(data_block_encode(1, 1, 2, 2, 2, DATA_SPLIT_TRAIN, 0, 1, &l0, big, &rec));
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "after blocks");
  /* And a corrupt one. */
  assert_ok(data_block_encode(1, 1, 1, 1, 2, DATA_SPLIT_TRAIN, 0, 1, &l0, big, &rec));
  rec.data[0] ^= 1;
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "not an image block");
  int32_t l5 = 5;
  assert_ok(data_block_encode(1, 1, 1, 1, 2, DATA_SPLIT_TRAIN, 0, 1, &l5, big, &rec));
  assert_fails_with(data_reader_add_block(r, fl_buf_bytes(&rec)), FL_ECORRUPT, "label 5");
  fl_buf_free(&rec);
  assert_int_equal(data_reader_images(r), 10);
  assert_int_equal(data_reader_batches(r, false), 2);
  assert_int_equal(data_reader_batches(r, true), 3);

  float x[4];
  int32_t y[4];
  int order1[8], order2[8], order3[8];
  for (int pass = 0; pass < 3; pass++) {
    int *order = pass == 0 ? order1 : pass == 1 ? order2 : order3;
    data_reader_start_epoch(r, 42, pass == 2 ? 1 : 0, true, 0, false);
    int k = 0;
    uint32_t n;
    while ((n = data_reader_next(r, x, y)) > 0) {
      assert_int_equal(n, 4); /* the short last batch is dropped */
      for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(y[i], (int)x[i] % 2); /* labels travel with their images */
        order[k++] = (int)x[i];
      }
    }
    assert_int_equal(k, 8);
  }
  assert_memory_equal(order1, order2, sizeof order1); /* same seed and epoch: same order */
  assert_memory_not_equal(order1, order3, sizeof order1); /* another epoch: another order */
  /* No shuffle, partial batches: the stored order, 4 + 4 + 2. */
  data_reader_start_epoch(r, 42, 0, false, 0, true);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_true(x[0] == 0 && x[3] == 3);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_int_equal(data_reader_next(r, x, y), 2);
  assert_true(x[1] == 9);
  assert_int_equal(data_reader_next(r, x, y), 0);
  /* A cap on the batches (the ranks' common step count). */
  data_reader_start_epoch(r, 42, 0, true, 1, false);
  assert_int_equal(data_reader_next(r, x, y), 4);
  assert_int_equal(data_reader_next(r, x, y), 0);
  data_reader_destroy(r);
}

static void test_synthetic_imagenet_is_deterministic(void **state) {
  fl_context *ctx = *state;
  size_t per = 3 * 224 * 224;
  float *a = malloc(per * sizeof *a), *b = malloc(per * sizeof *b);
  assert_non_null(a);
  assert_non_null(b);
  int32_t la, lb;
  data_synthetic_image(7, 3, a, &la);
  data_synthetic_image(7, 3, b, &lb);
  assert_int_equal(la, lb);
  assert_true(la >= 0 && la < 1000);
  assert_memory_equal(a, b, per * sizeof *a);
  data_synthetic_image(8, 3, b, &lb);
  assert_memory_not_equal(a, b, per * sizeof *a);
  /* Centred values of a small spread. */
  double sum = 0;
  for (size_t i = 0; i < per; i++) {
    assert_true(fabsf(a[i]) < 1.6f);
    sum += a[i];
  }
  assert_true(fabs(sum / (double)per) < 0.6);

  /* As datasets: 1 and 3 partitions give the same images, and they are the generator's. */
  data_options o1 = {.partitions = 1, .block_images = 2}, o3 = {.partitions = 3, .block_images = 2};
  data_set d1 = {0}, d3 = {0};
  assert_ok(data_synthetic_imagenet(ctx, 7, 100, 5, &o1, &d1));
  assert_ok(data_synthetic_imagenet(ctx, 7, 100, 5, &o3, &d3));
  assert_int_equal(d3.partitions, 3);
  data_reader *r1 = read_all(d1.blocks, 5, NULL), *r3 = read_all(d3.blocks, 5, NULL);
  float *x1 = malloc(5 * per * sizeof *x1), *x3 = malloc(5 * per * sizeof *x3);
  int32_t y1[5], y3[5];
  data_reader_start_epoch(r1, 0, 0, false, 0, false);
  data_reader_start_epoch(r3, 0, 0, false, 0, false);
  assert_int_equal(data_reader_next(r1, x1, y1), 5);
  assert_int_equal(data_reader_next(r3, x3, y3), 5);
  assert_memory_equal(x1, x3, 5 * per * sizeof *x1);
  assert_memory_equal(y1, y3, sizeof y1);
  data_synthetic_image(7, 102, a, &la);
  assert_int_equal(y1[2], la);
  assert_memory_equal(x1 + 2 * per, a, per * sizeof *a);
  /* A pair: training and test shares in each partition, told apart by split. */
  data_set tr = {0}, te = {0};
  data_options o2 = {.partitions = 2, .block_images = 4};
  assert_ok(data_synthetic_imagenet(ctx, 7, 0, 6, &o2, &tr));
  assert_ok(data_synthetic_imagenet(ctx, 7, 6, 2, &o2, &te));
  fl_dataset *pair = NULL;
  assert_fails_with(data_pair(ctx, &tr, &d3, &pair), FL_EINVAL, "2 training partitions but 3");
  assert_ok(data_pair(ctx, &tr, &te, &pair));
  assert_int_equal(fl_dataset_partitions(pair), 2);
  data_reader *test_r = NULL;
  assert_ok(data_reader_create(1, &test_r));
  data_reader *train_r = read_all(pair, 3, test_r);
  assert_int_equal(data_reader_images(train_r), 6);
  assert_int_equal(data_reader_images(test_r), 2);
  data_reader_start_epoch(test_r, 0, 0, false, 0, true);
  assert_int_equal(data_reader_next(test_r, x1, y1), 1);
  data_synthetic_image(7, 6, a, &la);
  assert_memory_equal(x1, a, per * sizeof *a);
  data_reader_destroy(test_r);
  data_reader_destroy(train_r);
  fl_dataset_free(pair);
  data_set_free(&tr);
  data_set_free(&te);
  data_reader_destroy(r1);
  data_reader_destroy(r3);
  data_set_free(&d1);
  data_set_free(&d3);
  free(x1);
  free(x3);
  free(a);
  free(b);
}


/* The pieces together on a real model: the reader's batches, the loss, one sgd_step per step
 * (the loss falls), then a checkpoint restores the weights into a model of another seed,
 * which then gives the same logits. */
static void test_model_steps_and_checkpoint(void **state) {
  (void)state;
  fl_device *dev = open_cpu();
  data_reader *r = NULL;
  assert_ok(data_reader_create(8, &r));
  /* 32 images of 1x4x4 whose class (0..3) sets which quarter is bright. */
  float px[32 * 16];
  int32_t lab[32];
  for (int i = 0; i < 32; i++) {
    lab[i] = i % 4;
    for (int k = 0; k < 16; k++) px[i * 16 + k] = (k / 4 == lab[i] ? 1.0f : 0.0f) + 0.01f * (float)((i * 7 + k) % 5);
  }
  fl_buf rec = FL_BUF_INIT;
  assert_ok(data_block_encode(32, 1, 4, 4, 4, DATA_SPLIT_TRAIN, 0, 1, lab, px, &rec));
  assert_ok(data_reader_add_block(r, fl_buf_bytes(&rec)));
  fl_buf_free(&rec);
  nn_model_spec spec = {.kind = NN_MLP, .channels = 1, .height = 4, .width = 4, .classes = 4, .hidden = 16, .seed = 3};
  nn_model *m = NULL;
  assert_ok(nn_model_create(dev, &spec, &m));
  optim_sgd_options o = {.momentum = 0.9f, .weight_decay = 1e-4f};
  optim_sgd *opt = NULL;
  assert_ok(optim_sgd_create(dev, fl_tensor_numel(nn_model_values(m)), &o, &opt));
  int64_t xs[4] = {8, 1, 4, 4};
  fl_tensor *x = NULL;
  assert_ok(fl_tensor_create(dev, 4, xs, &x));
  int32_t *labels_d = NULL;
  float *stats_d = NULL;
  assert_ok(dev->ops->alloc(dev, 8 * sizeof(int32_t), (void **)&labels_d));
  assert_ok(dev->ops->alloc(dev, 2 * sizeof(float), (void **)&stats_d));
  float xb[8 * 16], first = 0, last = 0;
  int32_t yb[8];
  for (uint32_t epoch = 0; epoch < 15; epoch++) {
    data_reader_start_epoch(r, 5, epoch, true, 0, false);
    assert_ok(dev->ops->memset0(dev, stats_d, 2 * sizeof(float)));
    while (data_reader_next(r, xb, yb) == 8) {
      const fl_tensor *logits;
      assert_ok(fl_tensor_write(x, xb, 8 * 16));
      assert_ok(dev->ops->from_host(dev, labels_d, yb, sizeof yb));
      assert_ok(nn_model_zero_grad(m));
      assert_ok(nn_model_forward(m, x, true, &logits));
      assert_ok(nn_model_loss(m, labels_d, 1.0f / 8, stats_d));
      assert_ok(nn_model_backward(m, NULL, NULL));
      assert_ok(optim_sgd_step(opt, 0.1f, nn_model_grads(m), nn_model_values(m)));
    }
    float st[2];
    assert_ok(dev->ops->to_host(dev, st, stats_d, sizeof st));
    if (epoch == 0) first = st[0] / 32;
    last = st[0] / 32;
  }
  assert_true(last < 0.5f * first);

  fl_buf blob = FL_BUF_INIT;
  checkpoint_state cs = {.epoch = 15, .step = 60, .position = 15, .lr = 0.1};
  assert_ok(checkpoint_encode(nn_model_values(m), nn_model_buffers(m), opt, &cs, &blob));
  spec.seed = 99;
  nn_model *m2 = NULL;
  optim_sgd *opt2 = NULL;
  assert_ok(nn_model_create(dev, &spec, &m2));
  assert_ok(optim_sgd_create(dev, fl_tensor_numel(nn_model_values(m2)), &o, &opt2));
  checkpoint_state back;
  assert_ok(checkpoint_decode(fl_buf_bytes(&blob), nn_model_values(m2), nn_model_buffers(m2), opt2, &back));
  assert_int_equal(back.step, 60);
  const fl_tensor *l1, *l2;
  float a[32], b[32];
  assert_ok(nn_model_forward(m, x, false, &l1));
  assert_ok(fl_tensor_read(l1, a, 32));
  assert_ok(nn_model_forward(m2, x, false, &l2));
  assert_ok(fl_tensor_read(l2, b, 32));
  assert_memory_equal(a, b, sizeof a);
  fl_buf_free(&blob);
  dev->ops->free(dev, labels_d);
  dev->ops->free(dev, stats_d);
  fl_tensor_destroy(x);
  optim_sgd_destroy(opt2);
  optim_sgd_destroy(opt);
  nn_model_destroy(m2);
  nn_model_destroy(m);
  data_reader_destroy(r);
  fl_device_close(dev);
}

/* ---- training options ------------------------------------------------------------------ */

static void test_train_options(void **state) {
  (void)state;
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  assert_ok(gpu_train_options_validate(&o));
  nn_model_kind k;
  assert_ok(gpu_train_model_parse("resnet18", &k));
  assert_int_equal(k, NN_RESNET18);
  assert_fails_with(gpu_train_model_parse("vgg", &k), FL_EINVAL, "'vgg'");
  gpu_train_dataset d;
  assert_ok(gpu_train_dataset_parse("synthetic-imagenet", &d));
  assert_fails_with(gpu_train_dataset_parse("mnist", &d), FL_EINVAL, "'mnist'");
  o.ranks = 3;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--batch 256 is not a multiple of --ranks 3");
  o.ranks = 4;
  o.warmup_epochs = 10;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--warmup");
  o.warmup_epochs = 2;
  o.num_milestones = 1;
  o.milestones[0] = 5;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--milestones is for --decay step");
  o.decay = OPTIM_DECAY_STEP;
  assert_ok(gpu_train_options_validate(&o));
  optim_schedule s;
  gpu_train_schedule(&o, &s);
  assert_int_equal(s.num_milestones, 1);
  assert_near(optim_lr_at(&s, 6), 0.01);
  o.num_milestones = 0;
  gpu_train_schedule(&o, &s); /* default milestones: 50% and 75% of the epochs */
  assert_int_equal(s.num_milestones, 2);
  assert_near(s.milestones[0], 5);
  assert_near(s.milestones[1], 7.5);
  o.sgd.nesterov = true;
  o.sgd.momentum = 0;
  assert_fails_with(gpu_train_options_validate(&o), FL_EINVAL, "--nesterov");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sgd_momentum_weight_decay),
      cmocka_unit_test(test_sgd_nesterov),
      cmocka_unit_test(test_sgd_plain),
      cmocka_unit_test(test_sgd_bad_arguments),
      cmocka_unit_test(test_schedule_linear_scaling_and_warmup),
      cmocka_unit_test(test_schedule_step_and_cosine),
      cmocka_unit_test(test_schedule_validation),
      cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_checkpoint_corrupt_blobs),
      cmocka_unit_test(test_curves_csv_svg_progress),
      cmocka_unit_test(test_reader_shuffle_and_batches),
      cmocka_unit_test(test_train_options),
      cmocka_unit_test(test_model_steps_and_checkpoint),
  };
  const struct CMUnitTest data_tests[] = {
      cmocka_unit_test(test_data_idx_plain_and_gz),
      cmocka_unit_test(test_data_idx_bad_input),
      cmocka_unit_test(test_data_fashion_mnist_if_installed),
      cmocka_unit_test(test_synthetic_imagenet_is_deterministic),
  };
  int failed = cmocka_run_group_tests_name("gpu_optim", tests, NULL, NULL);
  failed += cmocka_run_group_tests_name("gpu_data", data_tests, data_setup, data_teardown);
  return failed;
}
