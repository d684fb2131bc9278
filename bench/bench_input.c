/*
 * bench_input: the image input pipeline (include/flint/image.h) in images per second per
 * core, on JPEGs of ImageNet's typical size (500 x 375, quality 90) generated here. Rows, each
 * on one thread unless said:
 *
 *   decode          JPEG to RGB at full size (libjpeg-turbo)
 *   decode+cache    decode, then the shorter side resized to 256 (what fl_image_folder's
 *                   tasks do once, before the dataset is cached)
 *   augment         the training transform on a cached image: RandomResizedCrop 224, flip,
 *                   normalise to float CHW (what every epoch pays with cached data)
 *   eval            the evaluation transform on a cached image (resize 256, centre crop 224)
 *   decode+augment  decode, then the training transform on the full-size image (torchvision's
 *                   ImageNet pipeline without a cache: every epoch pays this)
 *   folder[2]       fl_image_folder over the files in local[2], counted: decode+cache through
 *                   the engine on 2 task threads
 *
 * Training rows (wall-clock, not CPU time): a model trained by the internal trainer
 * (gpu_train_run_in, 1 rank on the cpu, local[2]) on an image folder of such JPEGs of its own
 * (DIR/train: the row's images, DIR/val: 64; 2 classes), cached at 37 pixels and given the training augmentation
 * (RandomResizedCrop 32, flip, normalise) each epoch, as `flint train --data imagefolder:DIR
 * --image-size 32` does; with the reader's prefetch off (FLINT_TRAIN_PREFETCH=0), then on,
 * back to back. Each prints the input wait (the time rank 0's thread blocked in its reader)
 * and the upload as shares of the steps' time, and the images per second, over the epochs
 * after the first (which starts the threads and warms the caches up):
 *
 *   train mlp       the MLP (3072-256-256-10) at 32x32, 1024 images (32 steps an epoch), 9 epochs
 *   train cnn       the 3x3 CNN at 32x32, 1024 images, 3 epochs
 *   train resnet18  ResNet-18 at 32x32, 256 images (8 steps an epoch), 2 epochs
 * (batch 32 each).
 *
 * Baselines in the same run: decode alone against decode+augment (the share augmentation
 * adds), and PIL (Debian's python3-pil, with python3-numpy for the float conversion) doing
 * the same work on the same files, as torchvision's PIL path does it: Image.open().convert(
 * "RGB"), resize(BILINEAR) (with box= for the crop), transpose for the flip, numpy for the
 * normalisation. Without them the PIL column says so. Each figure is the best of 3 timed
 * passes over the files after one warm-up pass (a pass lasts at least --seconds / 3 of CPU).
 *
 * Time is the process's CPU time (Python's process_time for PIL), so a figure is images per
 * CPU-second, i.e. per core, and holds on a machine that other work shares (wall-clock
 * rates there move with the load). folder[2] counts every thread of the process: the task
 * threads' decoding and the engine's own work.
 *
 *   bench_input [--json] [--images N] [--seconds S] [--rows pipeline|train|all]
 *
 * Output: a table, or with --json one JSON object per row. Exit 1 on an error, 2 on a bad
 * option.
 */
#define BENCH_NAME "bench_input"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jpeglib.h> /* after stdio.h */

#include "bench_util.h"
#include "flint/image.h"
#include "gpu/parallel/train.h"

#define W 500
#define H 375
#define QUALITY 90

typedef struct options {
  bool json;
  uint64_t images, seconds;
  bool pipeline, train; /* --rows */
} options;

static char dir[256]; /* short: every path is built from it */

/* An image with photograph-like statistics: smooth shading, edges and some noise, so that
 * q90 files come out near ImageNet's (about 100-150 KiB at this size). */
static void make_image(uint32_t seed, uint8_t *px) {
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  double fx = 0.01 + 0.002 * (seed % 7), fy = 0.013 + 0.003 * (seed % 5);
  for (uint32_t i = 0; i < H; i++)
    for (uint32_t j = 0; j < W; j++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      double noise = (double)(x >> 58) - 32;
      bool edge = ((i / 40) + (j / 55) + seed) % 3 == 0;
      for (int c = 0; c < 3; c++) {
        double v = 128 + 70 * sin(fx * j * (c + 1) + seed) * cos(fy * i + c) + (edge ? 40 : -20) + noise;
        px[((size_t)i * W + j) * 3 + c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
}

static int write_jpeg(const char *path, const uint8_t *px) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = W;
  c.image_height = H;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, QUALITY, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < H) {
    JSAMPROW row = (JSAMPROW)(px + (size_t)c.next_scanline * W * 3);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return fclose(f);
}

static void file_path(char *buf, size_t len, uint64_t i) { snprintf(buf, len, "%s/c/%05llu.jpg", dir, (unsigned long long)i); }

/* ---- the rows ------------------------------------------------------------------------------ */

/* The process's CPU seconds (every thread). */
static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

typedef enum row_kind { ROW_DECODE, ROW_DECODE_CACHE, ROW_AUGMENT, ROW_EVAL, ROW_DECODE_AUGMENT, ROWS_LOCAL } row_kind;
static const char *const row_names[] = {"decode", "decode+cache", "augment", "eval", "decode+augment"};

typedef struct workload {
  uint64_t n;
  fl_buf *cached; /* n records at 256 */
  float *out;     /* 3 x 224 x 224 */
  fl_image_transform train, eval;
} workload;

/* One image of a row; false on an error (reported). */
static bool one(const workload *w, row_kind k, uint64_t i, uint32_t epoch) {
  char path[PATH_MAX];
  uint8_t *rgb;
  uint32_t h, wd;
  fl_status s = FL_OK;
  switch (k) {
  case ROW_AUGMENT: s = fl_image_transform_apply(&w->train, epoch, fl_buf_bytes(&w->cached[i]), w->out, NULL); break;
  case ROW_EVAL: s = fl_image_transform_apply(&w->eval, epoch, fl_buf_bytes(&w->cached[i]), w->out, NULL); break;
  default:
    file_path(path, sizeof path, i);
    s = fl_image_decode_file(path, 0, &rgb, &h, &wd);
    if (s != FL_OK) break;
    if (k == ROW_DECODE_CACHE) {
      uint32_t ow = wd <= h ? 256 : (uint32_t)(256ull * wd / h), oh = wd <= h ? (uint32_t)(256ull * h / wd) : 256;
      uint8_t *small = fl_malloc((size_t)ow * oh * 3);
      s = small ? fl_image_resize(rgb, wd, h, 0, 0, wd, h, ow, oh, small) : FL_ENOMEM;
      fl_free(small);
    } else if (k == ROW_DECODE_AUGMENT) {
      fl_buf rec = FL_BUF_INIT;
      s = fl_image_record_encode(0, i, h, wd, rgb, &rec);
      if (s == FL_OK) s = fl_image_transform_apply(&w->train, epoch, fl_buf_bytes(&rec), w->out, NULL);
      fl_buf_free(&rec);
    }
    fl_free(rgb);
  }
  if (s != FL_OK) fail_flint(row_names[k]);
  return s == FL_OK;
}

/* Best of 3 timed passes (each at least min_s of CPU) after a warm-up: images per CPU-second. */
static double time_row(const workload *w, row_kind k, double min_s) {
  double best = 0;
  uint32_t epoch = 0;
  for (int pass = -1; pass < 3; pass++) {
    double t0 = cpu_s(), t;
    uint64_t done = 0;
    do {
      for (uint64_t i = 0; i < w->n; i++, done++)
        if (!one(w, k, i, epoch)) return -1;
      epoch++;
      t = cpu_s() - t0;
    } while (pass >= 0 && t < min_s);
    if (pass >= 0 && done / t > best) best = done / t;
  }
  return best;
}

/* fl_image_folder over the files on local[2], counted: images per CPU-second of the process. */
static double time_folder(uint64_t n, double min_s) {
  fl_context *ctx;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    return -1;
  }
  double best = 0;
  for (int pass = -1; pass < 3; pass++) {
    double t0 = cpu_s(), t;
    uint64_t done = 0;
    do {
      fl_dataset *ds;
      uint64_t got = 0;
      fl_image_folder_options fo = FL_IMAGE_FOLDER_OPTIONS_INIT;
      fo.partitions = 8;
      if (fl_image_folder(ctx, dir, &fo, &ds, NULL) != FL_OK || fl_count(ds, &got) != FL_OK || got != n) {
        fail_flint("fl_image_folder");
        fl_context_close(ctx);
        return -1;
      }
      fl_dataset_free(ds);
      done += n;
      t = cpu_s() - t0;
    } while (pass >= 0 && t < min_s);
    if (pass >= 0 && done / t > best) best = done / t;
  }
  fl_context_close(ctx);
  return best;
}

/* ---- PIL ----------------------------------------------------------------------------------- */

/* The same rows in PIL, printed as "row value" lines; the interpreter is Debian's python3
 * (first) or the one on PATH, whichever imports PIL and numpy. */
static const char pil_script[] =
    "import sys, time, glob, math, random\n"
    "from PIL import Image\n"
    "import numpy as np\n"
    "files = sorted(glob.glob(sys.argv[1] + '/c/*.jpg')); min_s = float(sys.argv[2])\n"
    "mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)\n"
    "std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)\n"
    "def decode(f):\n"
    "    with open(f, 'rb') as fh:\n"
    "        im = Image.open(fh); return im.convert('RGB')\n"
    "def short256(im):\n"
    "    w, h = im.size\n"
    "    size = (256, 256 * h // w) if w <= h else (256 * w // h, 256)\n"
    "    return im.resize(size, Image.BILINEAR)\n"
    "def rrc(im):\n"  /* torchvision's RandomResizedCrop.get_params, scale (0.08, 1), ratio (3/4, 4/3) */
    "    w, h = im.size; area = w * h; lr = (math.log(3 / 4), math.log(4 / 3))\n"
    "    for _ in range(10):\n"
    "        ta = area * random.uniform(0.08, 1.0); ar = math.exp(random.uniform(*lr))\n"
    "        cw = int(round(math.sqrt(ta * ar))); ch = int(round(math.sqrt(ta / ar)))\n"
    "        if 0 < cw <= w and 0 < ch <= h:\n"
    "            i = random.randint(0, h - ch); j = random.randint(0, w - cw); break\n"
    "    else:\n"
    "        cw, ch, i, j = w, h, 0, 0\n"
    "    out = im.resize((224, 224), Image.BILINEAR, box=(j, i, j + cw, i + ch))\n"
    "    if random.random() < 0.5: out = out.transpose(Image.FLIP_LEFT_RIGHT)\n"
    "    a = np.asarray(out, dtype=np.float32).transpose(2, 0, 1) / 255.0\n"
    "    return (a - mean) / std\n"
    "def evalt(im):\n"
    "    w, h = im.size; l = int(round((w - 224) / 2.0)); t = int(round((h - 224) / 2.0))\n"
    "    a = np.asarray(im.crop((l, t, l + 224, t + 224)), dtype=np.float32).transpose(2, 0, 1) / 255.0\n"
    "    return (a - mean) / std\n"
    "cached = [short256(decode(f)) for f in files]\n"
    "rows = {'decode': lambda k: decode(files[k]), 'decode+cache': lambda k: short256(decode(files[k])),\n"
    "        'augment': lambda k: rrc(cached[k]), 'eval': lambda k: evalt(cached[k]),\n"
    "        'decode+augment': lambda k: rrc(decode(files[k]))}\n"
    "for name, fn in rows.items():\n"
    "    best = 0\n"
    "    for p in range(-1, 3):\n"
    "        t0 = time.process_time(); done = 0\n"
    "        while True:\n"
    "            for k in range(len(files)): fn(k); done += 1\n"
    "            t = time.process_time() - t0\n"
    "            if p < 0 or t >= min_s: break\n"
    "        if p >= 0: best = max(best, done / t)\n"
    "    print(name, best, flush=True)\n";

/* Fills pil[] (images/s) from the script; false when PIL cannot be run (why in *note). */
static bool run_pil(double min_s, double *pil, const char **note) {
  char script[PATH_MAX], cmd[3 * PATH_MAX];
  snprintf(script, sizeof script, "%s/pil_rows.py", dir);
  FILE *f = fopen(script, "w");
  if (!f || fputs(pil_script, f) < 0 || fclose(f) != 0) {
    *note = "PIL: could not write its script";
    return false;
  }
  snprintf(cmd, sizeof cmd,
           "for p in /usr/bin/python3 python3; do if $p -c 'import PIL, numpy' 2>/dev/null; then "
           "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 exec $p '%s' '%s' %g; fi; done; exit 3",
           script, dir, min_s);
  FILE *p = popen(cmd, "r");
  if (!p) {
    *note = "PIL: could not start python3";
    return false;
  }
  char line[256], name[64];
  double v;
  int got = 0;
  while (fgets(line, sizeof line, p))
    if (sscanf(line, "%63s %lf", name, &v) == 2)
      for (int k = 0; k < ROWS_LOCAL; k++)
        if (strcmp(name, row_names[k]) == 0) pil[k] = v, got++;
  int rc = pclose(p);
  if (got != ROWS_LOCAL) {
    *note = rc == 3 << 8 ? "PIL: python3 with PIL and numpy not found (apt install python3-pil python3-numpy)"
                         : "PIL: its script failed";
    return false;
  }
  return true;
}

/* ---- training: the input wait with prefetch off and on -------------------------------------- */

#define TRAIN_SIZE 32
#define TRAIN_BATCH 32

typedef struct train_row {
  const char *name;
  nn_model_kind model;
  uint32_t images; /* training images: images / batch steps an epoch */
  uint32_t epochs; /* the first is not counted */
} train_row;
static const train_row train_rows[] = {
    {"train mlp", NN_MLP, 1024, 9}, /* the fastest step: the most input wait to hide */
    {"train cnn", NN_CNN, 1024, 3},
    {"train resnet18", NN_RESNET18, 256, 2},
};

/* Sums over the epochs after the first (which pays for starting up). */
typedef struct train_figures {
  double wait_s, upload_s, train_s, images;
} train_figures;

static void on_train_epoch(const gpu_train_epoch *e, void *user) {
  train_figures *f = user;
  if (e->epoch < 2) return;
  f->wait_s += e->input_wait_s;
  f->upload_s += e->upload_s;
  f->train_s += e->train_seconds;
  f->images += e->images_per_s * e->train_seconds;
}

/* DIR/NAME/{train,val}/c{0,1}/NNNNN.jpg: `train` and `val` images, classes alternating. */
static bool write_tree(const char *name, uint64_t train, uint64_t val, uint8_t *px, char *tree, size_t len) {
  snprintf(tree, len, "%s/%s", dir, name);
  char path[PATH_MAX];
  const char *splits[2] = {"train", "val"};
  if (mkdir(tree, 0755) != 0) return false;
  for (int s = 0; s < 2; s++) {
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, splits[s]);
    if (mkdir(path, 0755) != 0) return false;
    for (int c = 0; c < 2; c++) {
      snprintf(path, sizeof path, "%s/%s/%s/c%d", dir, name, splits[s], c);
      if (mkdir(path, 0755) != 0) return false;
    }
    for (uint64_t i = 0; i < (s ? val : train); i++) {
      make_image((uint32_t)(i + (s ? train : 0)), px);
      snprintf(path, sizeof path, "%s/%s/%s/c%d/%05llu.jpg", dir, name, splits[s], (int)(i % 2),
               (unsigned long long)i);
      if (write_jpeg(path, px) != 0) {
        fprintf(stderr, BENCH_NAME ": cannot write %s\n", path);
        return false;
      }
    }
  }
  return true;
}

/* One row's two runs, prefetch off then on: fig[0], fig[1]. */
static bool time_train(fl_context *ctx, const char *tree, const train_row *row, train_figures fig[2]) {
  for (int on = 0; on < 2; on++) {
    gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
    o.model = row->model;
    o.data = GPU_TRAIN_IMAGE_FOLDER;
    o.data_path = tree;
    o.image_size = TRAIN_SIZE;
    o.ranks = 1;
    o.batch = TRAIN_BATCH;
    o.epochs = row->epochs;
    o.lr = 0.05;
    o.warmup_epochs = 0;
    o.on_epoch = on_train_epoch;
    o.user = &fig[on];
    fig[on] = (train_figures){0, 0, 0, 0};
    setenv("FLINT_TRAIN_PREFETCH", on ? "1" : "0", 1); /* read by the rank, in this process */
    gpu_train_result res;
    fl_status s = gpu_train_run_in(ctx, &o, &res);
    unsetenv("FLINT_TRAIN_PREFETCH");
    if (s != FL_OK || fig[on].train_s <= 0) {
      fail_flint(row->name);
      return false;
    }
  }
  return true;
}

/* The training rows: written, timed and printed. */
static bool train_rows_run(const options *o, uint8_t *px) {
  fl_context *ctx;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open");
    return false;
  }
  if (!o->json)
    printf("training on image folders of JPEGs of %u x %u (cached at 37, augmented to %d x %d), 1 rank on the cpu, "
           "batch %d; epochs after the first, wall-clock; input wait and upload as shares of the steps' time\n"
           "%-16s %7s %9s %11s %11s %12s\n",
           W, H, TRAIN_SIZE, TRAIN_SIZE, TRAIN_BATCH, "row", "images", "prefetch", "input wait", "upload", "images/s");
  bool ok = true;
  for (size_t k = 0; k < sizeof train_rows / sizeof *train_rows && ok; k++) {
    const train_row *row = &train_rows[k];
    char tree[PATH_MAX], name[32];
    snprintf(name, sizeof name, "tree%zu", k);
    if (!(ok = write_tree(name, row->images, 64, px, tree, sizeof tree))) {
      fprintf(stderr, BENCH_NAME ": cannot write the image folder %s\n", tree);
      break;
    }
    train_figures fig[2];
    if (!(ok = time_train(ctx, tree, row, fig))) break;
    for (int on = 0; on < 2; on++) {
      const train_figures *f = &fig[on];
      double wait = f->wait_s / f->train_s, upload = f->upload_s / f->train_s, rate = f->images / f->train_s;
      if (o->json)
        printf("{\"bench\":\"input\",\"row\":\"%s\",\"images\":%u,\"prefetch\":%s,\"input_wait_share\":%.4f,"
               "\"upload_share\":%.4f,\"images_per_s\":%.1f}\n",
               row->name, row->images, on ? "true" : "false", wait, upload, rate);
      else
        printf("%-16s %7u %9s %10.1f%% %10.1f%% %12.1f\n", row->name, row->images, on ? "on" : "off", 100 * wait,
               100 * upload, rate);
    }
  }
  fl_context_close(ctx);
  return ok;
}

/* ---- main ---------------------------------------------------------------------------------- */

static int usage(void) {
  fprintf(stderr, "usage: " BENCH_NAME " [--json] [--images N] [--seconds S] [--rows pipeline|train|all]\n");
  return 2;
}

/* The pipeline's rows (decode ... folder[2]) and PIL's, on o->images JPEGs in DIR/c. */
static bool pipeline_rows(const options *o, uint8_t *px) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/c", dir);
  bool ok = false;
  workload w = {.n = o->images, .train = FL_IMAGE_TRAIN_INIT, .eval = FL_IMAGE_EVAL_INIT};
  w.cached = calloc(o->images, sizeof *w.cached);
  w.out = malloc(3 * 224 * 224 * sizeof *w.out);
  if (!w.cached || !w.out || mkdir(path, 0755) != 0) goto done;
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < o->images; i++) {
    make_image((uint32_t)i, px);
    file_path(path, sizeof path, i);
    struct stat st;
    if (write_jpeg(path, px) != 0 || stat(path, &st) != 0) {
      fprintf(stderr, BENCH_NAME ": cannot write %s\n", path);
      goto done;
    }
    bytes += (uint64_t)st.st_size;
    /* The cached record, as fl_image_folder's tasks make it. */
    uint8_t *rgb, *small = malloc((size_t)341 * 256 * 3);
    uint32_t h, wd;
    if (!small || fl_image_decode_file(path, 0, &rgb, &h, &wd) != FL_OK ||
        fl_image_resize(rgb, wd, h, 0, 0, wd, h, 341, 256, small) != FL_OK ||
        fl_image_record_encode(0, i, 256, 341, small, &w.cached[i]) != FL_OK) {
      fail_flint("caching");
      free(small);
      goto done;
    }
    fl_free(rgb);
    free(small);
  }
  double min_s = (double)o->seconds / 3, flint[ROWS_LOCAL + 1], pil[ROWS_LOCAL] = {0};
  for (int k = 0; k < ROWS_LOCAL; k++)
    if ((flint[k] = time_row(&w, (row_kind)k, min_s)) < 0) goto done;
  if ((flint[ROWS_LOCAL] = time_folder(o->images, min_s)) < 0) goto done;
  const char *note = NULL;
  bool have_pil = run_pil(min_s, pil, &note);
  if (!o->json) {
    printf("bench_input: %llu JPEGs of %u x %u, quality %d, %.0f KiB on average; one thread per row; images per "
           "CPU-second (per core), best of 3\n",
           (unsigned long long)o->images, W, H, QUALITY, bytes / 1024.0 / o->images);
    printf("%-16s %12s %12s %10s\n", "row", "flint", "PIL", "flint/PIL");
  }
  for (int k = 0; k <= ROWS_LOCAL; k++) {
    const char *name = k < ROWS_LOCAL ? row_names[k] : "folder[2]";
    bool peer = have_pil && k < ROWS_LOCAL;
    if (o->json) {
      printf("{\"bench\":\"input\",\"row\":\"%s\",\"images_per_s_per_core\":%.1f", name, flint[k]);
      if (peer) printf(",\"pil_images_per_s\":%.1f,\"ratio\":%.3f", pil[k], flint[k] / pil[k]);
      printf("}\n");
    } else if (peer) {
      printf("%-16s %12.1f %12.1f %9.2fx\n", name, flint[k], pil[k], flint[k] / pil[k]);
    } else {
      printf("%-16s %12.1f %12s %10s\n", name, flint[k], "-", "-");
    }
  }
  double share = 1 - flint[ROW_DECODE_AUGMENT] / flint[ROW_DECODE];
  if (o->json) {
    printf("{\"bench\":\"input\",\"row\":\"augment-share\",\"decode_augment_over_decode\":%.3f}\n",
           flint[ROW_DECODE_AUGMENT] / flint[ROW_DECODE]);
  } else {
    printf("baseline: decode+augment runs at %.0f%% of decode alone (augmentation takes %.0f%% of that time); "
           "cached, augment runs %.1fx faster than decode+augment\n",
           100 * flint[ROW_DECODE_AUGMENT] / flint[ROW_DECODE], 100 * share, flint[ROW_AUGMENT] / flint[ROW_DECODE_AUGMENT]);
    if (!have_pil) printf("(%s)\n", note);
  }
  ok = true;
done:
  if (w.cached)
    for (uint64_t i = 0; i < o->images; i++) fl_buf_free(&w.cached[i]);
  free(w.cached);
  free(w.out);
  return ok;
}

int main(int argc, char **argv) {
  options o = {false, 64, 6, true, true};
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) o.json = true;
    else if (strcmp(argv[i], "--images") == 0 && i + 1 < argc) {
      if (!parse_count(argv[++i], 100000, &o.images)) return usage();
    } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      if (!parse_count(argv[++i], 3600, &o.seconds)) return usage();
    } else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      const char *r = argv[++i];
      if (strcmp(r, "pipeline") != 0 && strcmp(r, "train") != 0 && strcmp(r, "all") != 0) return usage();
      o.pipeline = strcmp(r, "train") != 0;
      o.train = strcmp(r, "pipeline") != 0;
    } else
      return usage();
  }
  const char *base = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/flint-bench-input-XXXXXX", base && *base ? base : "/tmp");
  if (!mkdtemp(dir)) {
    perror(BENCH_NAME ": mkdtemp");
    return 1;
  }
  int rc = 1;
  uint8_t *px = malloc((size_t)W * H * 3);
  if (px && (!o.pipeline || pipeline_rows(&o, px)) && (!o.train || train_rows_run(&o, px))) rc = 0;
  free(px);
  char cmd[PATH_MAX];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) rc = 1;
  return rc;
}
