/*
 * bench_ml: the batch-convex solvers against what the machine can do at best, in the same
 * run (issue 6). Rows, each in local[2] and in local-cluster[2,1,MB]:
 *
 *   gradient  one logistic loss-and-gradient evaluation over n x d cached rows (seeded
 *             synthetic, n = --rows, d = 100) at the model L-BFGS found (where a solver spends
 *             its evaluations; at zero exp and log1p are cheaper), against the
 *             memory floor: a plain C pass summing the same number of bytes (features and
 *             labels) on 2 threads. Target: at most 2x.
 *   lstsq     least squares by the normal equations end to end over 2n x d cached rows,
 *             against the floor of one single-threaded dsyrk per block (blocks of the engine's
 *             size) on each of 2 threads. Target: at most 1.2x.
 *   lbfgs     binary logistic regression by L-BFGS to gradient norm 1e-6 (l2 1e-4):
 *             iterations, time, and the engine's share of an iteration: (fit time - compute)
 *             / iterations, where compute is the time the fit's tasks ran (fl_context_stats
 *             task_seconds, Spark's executor run time) over the 2 cores, measured in the same
 *             fit. Target: at most 2 ms in local-cluster mode (reported for local mode too).
 *             Beside it, the same share against a floor of the engine's gradient step (dgemv,
 *             row losses, dgemv per 64 KiB chunk) written out plainly and run on 2 threads
 *             over in-process rows right before the fit: a cross-check that also charges a
 *             slower kernel to the engine, but at the mercy of the machine's bandwidth drift
 *             (5% of an evaluation is 2 ms an iteration). The floor takes exp and log a row at
 *             a time; the engine four rows at a time (libmvec), so this figure runs low.
 *   sandblaster  binary logistic regression by Sandblaster L-BFGS (vectors on parameter-server
 *             shards, docs/ml.md) on the same data and options as lbfgs: seconds per iteration,
 *             against today's client-driven lbfgs per iteration in the same run (fits
 *             alternate, RUNS pairs, medians), and its per-iteration time in local-cluster
 *             divided by local[2]'s. Target: at most 1.05.
 *   memory    the cached dataset's bytes (in cluster mode as the executors count them)
 *             against its raw bytes n x (d + 1) x 8. Target: at most 1.05x.
 *   fmnist    Fashion-MNIST (if installed) multinomial logistic regression by L-BFGS, local[2]:
 *             time to converge (or 100 iterations) and test accuracy. No target.
 *
 * Floors and engine runs alternate, RUNS (5) pairs per figure, and each figure is the median
 * over the pairs of the pair's ratio (or share): the machine's memory bandwidth drifts by
 * 10-20% over seconds, so a floor timed at another moment than the engine would charge (or
 * credit) that drift to the engine. The L-BFGS share also prints its least and greatest fit,
 * the spread that the machine's drift gives one build.
 *
 * --sandblaster-only runs only the sandblaster rows (and their lbfgs fits): the rest takes
 * most of the run on 2 cores.
 *
 * --partitions P splits each synthetic dataset into P partitions instead of the engine's
 * default (4 per core), to see how the figures move with the size of a task.
 *
 * Output: a table, or with --json one JSON object per row. Exit 1 on an engine error, 2 on a
 * bad option; a missed target is reported, not an error.
 */
#define BENCH_NAME "bench_ml"
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "bench_util.h"
#include "flint/ml.h"

#define COLS 100
#define THREADS 2
#define FMNIST "/usr/share/datasets/fashion-mnist"

typedef struct options {
  uint64_t rows;
  uint32_t partitions; /* of each synthetic dataset (0: the engine's default, 4 per core) */
  bool json;
  bool skip_cluster, skip_fmnist, sandblaster_only;
} options;

/* ---- floors: the same bytes without the engine -------------------------------------------- */

#define CHUNK_ROWS ((64u << 10) / (8 * COLS)) /* the engine's rows per fused step */

typedef struct floor_job {
  double *data; /* blocks of rows x (COLS) features, then labels */
  size_t blocks, rows_per_block;
  const double *w; /* kind 2: COLS coefficients, then the intercept */
  double result;
  int kind; /* 0: read pass, 1: dsyrk per block, 2: fused logistic gradient */
} floor_job;

/* The engine's gradient step over one chunk, written out plainly: margins by dgemv, the
 * rows' losses, then the gradient update by dgemv while the chunk is in cache. */
static double fused_chunk(const double *x, const double *restrict y, size_t n, const double *w, double *restrict z,
                          double *g) {
  double s = 0, dsum = 0, bias = w[COLS];
  cblas_dgemv(CblasRowMajor, CblasNoTrans, (int)n, COLS, 1.0, x, COLS, w, 1, 0.0, z, 1);
  for (size_t i = 0; i < n; i++) {
    double m = z[i] + bias, e = exp(-fabs(m));
    s += (m > 0 ? m : 0.0) + log(1.0 + e) - y[i] * m;
    z[i] = (m >= 0 ? 1.0 : e) / (1.0 + e) - y[i];
    dsum += z[i];
  }
  g[COLS] += dsum;
  cblas_dgemv(CblasRowMajor, CblasTrans, (int)n, COLS, 1.0, x, COLS, z, 1, 1.0, g, 1);
  return s;
}

static void *floor_thread(void *p) {
  floor_job *j = p;
  size_t per = j->rows_per_block * (COLS + 1);
  double s = 0, C[COLS * COLS], g[COLS + 1], z[CHUNK_ROWS];
  memset(g, 0, sizeof g);
  for (size_t b = 0; b < j->blocks; b++) {
    const double *x = j->data + b * per, *y = x + j->rows_per_block * COLS;
    if (j->kind == 0) {
#pragma omp simd reduction(+ : s)
      for (size_t i = 0; i < per; i++) s += x[i];
    } else if (j->kind == 1) {
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, COLS, (int)j->rows_per_block, 1.0, x, COLS, 1.0, C, COLS);
      s += C[0];
    } else {
      for (size_t lo = 0; lo < j->rows_per_block; lo += CHUNK_ROWS) {
        size_t n = j->rows_per_block - lo < CHUNK_ROWS ? j->rows_per_block - lo : CHUNK_ROWS;
        s += fused_chunk(x + lo * COLS, y + lo, n, j->w, z, g);
      }
    }
  }
  j->result = s + g[0];
  return NULL;
}

/* Uniform in (0, 1) by splitmix64, and a standard normal draw from two (Box-Muller), as the
 * synthetic features are. */
static double uniform_draw(uint64_t *st) {
  uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return ((double)((z ^ (z >> 31)) >> 11) + 0.5) * 0x1p-53;
}
static double normal_draw(uint64_t *st) {
  double u = uniform_draw(st);
  return sqrt(-2 * log(u)) * cos(2 * M_PI * uniform_draw(st));
}

#define RUNS 5 /* floor and engine pairs per figure */

/* The median of n (odd) values, sorted in place. */
static double median(double *v, int n) {
  for (int i = 0; i < n; i++)
    for (int k = i + 1; k < n; k++)
      if (v[k] < v[i]) {
        double t = v[i];
        v[i] = v[k];
        v[k] = t;
      }
  return v[n / 2];
}

/* In-process blocks of rows x COLS (plus labels) for the floors, drawn as the engine's
 * synthetic logistic data is (standard normal features, labels drawn from the model w when
 * given), so that the fused gradient's exp and log see the same margins. */
typedef struct floor_data {
  double *data;
  size_t rows_per_block, blocks;
} floor_data;

static bool floor_data_make(uint64_t rows, const double *w, floor_data *f) {
  f->rows_per_block = (1u << 20) / (8 * COLS);
  f->blocks = (rows + f->rows_per_block - 1) / f->rows_per_block;
  size_t per = f->rows_per_block * (COLS + 1);
  if (!(f->data = malloc(f->blocks * per * sizeof *f->data))) return false;
  uint64_t st = 99;
  for (size_t b = 0; b < f->blocks; b++) {
    double *x = f->data + b * per, *y = x + f->rows_per_block * COLS;
    for (size_t i = 0; i < f->rows_per_block * COLS; i++) x[i] = normal_draw(&st);
    for (size_t i = 0; i < f->rows_per_block; i++) {
      double m = w ? w[COLS] + cblas_ddot(COLS, x + i * COLS, 1, w, 1) : 0;
      y[i] = uniform_draw(&st) < 1 / (1 + exp(-m)) ? 1.0 : 0.0;
    }
  }
  return true;
}

/* Seconds of one pass of `kind` over f on THREADS threads. */
static double floor_run(const floor_data *f, int kind, const double *w) {
  size_t per = f->rows_per_block * (COLS + 1);
  floor_job jobs[THREADS];
  pthread_t th[THREADS];
  double t0 = now_s();
  for (int t = 0; t < THREADS; t++) {
    size_t lo = f->blocks * t / THREADS, hi = f->blocks * (t + 1) / THREADS;
    jobs[t] = (floor_job){.data = f->data + lo * per, .blocks = hi - lo, .rows_per_block = f->rows_per_block,
                          .kind = kind, .w = w};
    pthread_create(&th[t], NULL, floor_thread, &jobs[t]);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  return now_s() - t0;
}

/* ---- engine -------------------------------------------------------------------------------- */

/* The floors' in-process data, shared by both modes. */
typedef struct floors {
  floor_data logistic; /* rows: the read pass and the fused gradient */
  floor_data linear;   /* 2 x rows: dsyrk per block */
  double w[COLS + 1];  /* the model the logistic labels are drawn from: local mode's L-BFGS fit */
} floors;

/* Per figure, medians over the RUNS pairs: the engine's seconds, the floor's seconds, and the
 * pair's ratio (or for L-BFGS the engine's ms per iteration). */
typedef struct paired {
  double engine_s, floor_s, figure;
} paired;

typedef struct mode_result {
  paired gradient, lstsq, lbfgs;
  double lbfgs_task_s, share_ms; /* medians: the fit's task time (all tasks), and the share by it */
  double share_min_ms, share_max_ms; /* the share's spread over the fits: the machine's drift */
  double memory_ratio;
  uint32_t iterations, evaluations;
  bool converged;
  /* sandblaster: medians of seconds per iteration, its fits' and lbfgs's in the same pairs */
  double sb_iter_s, sb_lbfgs_iter_s, sb_total_s;
  uint32_t sb_iterations, sb_lbfgs_iterations;
  bool sb_converged;
  double sb_loss, sb_lbfgs_loss;
} mode_result;

static paired pair_medians(double *engine, double *floor, double *figure) {
  return (paired){median(engine, RUNS), median(floor, RUNS), median(figure, RUNS)};
}

typedef fl_status (*fit_fn)(const fl_ml_data *, const fl_ml_train_options *, fl_ml_model **);

/* Seconds of one fit of data; *model is the fit's. */
static int fit_timed(fit_fn fit, const fl_ml_data *data, const fl_ml_train_options *o, fl_ml_model **model,
                     double *secs) {
  fl_ml_model_free(*model);
  *model = NULL;
  double t0 = now_s();
  if (fit(data, o, model) != FL_OK) {
    fail_flint(fit == fl_ml_linreg ? "least squares" : "L-BFGS");
    return 1;
  }
  *secs = now_s() - t0;
  return 0;
}

/* L-BFGS: a fit to warm up (whose model, in local mode, the logistic floor's labels are
 * drawn from), then RUNS pairs of (fused gradient floor, fit). */
static int bench_lbfgs(const options *o, floors *fl, const fl_ml_data *data, mode_result *r) {
  fl_ml_train_options lo = {.l2 = 1e-4, .tol = 1e-6, .max_iterations = 100};
  fl_ml_model *model = NULL;
  double e[RUNS], f[RUNS], q[RUNS], ts[RUNS], sh[RUNS], secs;
  fl_context *ctx = fl_dataset_context(data->blocks);
  int rc = 1;
  if (fit_timed(fl_ml_logreg, data, &lo, &model, &secs) != 0) goto done;
  if (!fl->logistic.data) {
    memcpy(fl->w, model->coef, COLS * sizeof *fl->w);
    fl->w[COLS] = model->intercepts[0];
    if (!floor_data_make(o->rows, fl->w, &fl->logistic)) {
      fprintf(stderr, BENCH_NAME ": out of memory for the floors' rows\n");
      goto done;
    }
  }
  for (int i = 0; i < RUNS; i++) {
    f[i] = floor_run(&fl->logistic, 2, fl->w);
    fl_context_stats before, after;
    if (fl_context_stats_get(ctx, &before) != FL_OK || fit_timed(fl_ml_logreg, data, &lo, &model, &e[i]) != 0 ||
        fl_context_stats_get(ctx, &after) != FL_OK)
      goto done;
    ts[i] = after.task_seconds - before.task_seconds;
    r->iterations = model->num_history;
    r->evaluations = model->num_history ? model->history[model->num_history - 1].evaluations : 0;
    r->converged = model->converged;
    q[i] = r->iterations ? 1e3 * (e[i] - r->evaluations * f[i]) / r->iterations : NAN;
    sh[i] = r->iterations ? 1e3 * (e[i] - ts[i] / THREADS) / r->iterations : NAN;
  }
  r->lbfgs = pair_medians(e, f, q);
  r->lbfgs_task_s = median(ts, RUNS);
  r->share_ms = median(sh, RUNS); /* sorts sh */
  r->share_min_ms = sh[0];
  r->share_max_ms = sh[RUNS - 1];
  rc = 0;
done:
  fl_ml_model_free(model);
  return rc;
}

/* Sandblaster against lbfgs: a warm-up fit of each, then RUNS pairs (lbfgs, sandblaster),
 * each figure seconds per iteration. */
static int bench_sandblaster(const fl_ml_data *data, mode_result *r) {
  fl_ml_train_options lo = {.l2 = 1e-4, .tol = 1e-6, .max_iterations = 100};
  fl_ml_train_options so = lo;
  so.solver = FL_ML_SOLVER_SANDBLASTER;
  fl_ml_model *model = NULL;
  double sb[RUNS], lb[RUNS], tot[RUNS], secs;
  int rc = 1;
  if (fit_timed(fl_ml_logreg, data, &lo, &model, &secs) != 0 || fit_timed(fl_ml_logreg, data, &so, &model, &secs) != 0)
    goto done;
  for (int i = 0; i < RUNS; i++) {
    if (fit_timed(fl_ml_logreg, data, &lo, &model, &secs) != 0) goto done;
    r->sb_lbfgs_iterations = model->num_history;
    r->sb_lbfgs_loss = model->num_history ? model->history[model->num_history - 1].loss : NAN;
    lb[i] = model->num_history ? secs / model->num_history : NAN;
    if (fit_timed(fl_ml_logreg, data, &so, &model, &secs) != 0) goto done;
    r->sb_iterations = model->num_history;
    r->sb_converged = model->converged;
    r->sb_loss = model->num_history ? model->history[model->num_history - 1].loss : NAN;
    sb[i] = model->num_history ? secs / model->num_history : NAN;
    tot[i] = secs;
  }
  r->sb_iter_s = median(sb, RUNS);
  r->sb_lbfgs_iter_s = median(lb, RUNS);
  r->sb_total_s = median(tot, RUNS);
  rc = 0;
done:
  fl_ml_model_free(model);
  return rc;
}

/* One loss-and-gradient evaluation where the solver spends its time (at the model, not at
 * zero): a warm-up, then RUNS pairs of (read floor, evaluation). */
static int bench_gradient(const floors *fl, const fl_ml_data *data, mode_result *r) {
  fl_ml_model m = {.kind = FL_ML_LOGISTIC_BINARY, .cols = COLS, .classes = 2, .outputs = 1, .intercept = true};
  double coef[COLS], intercept = fl->w[COLS], loss, grad[COLS + 1], e[RUNS], f[RUNS], q[RUNS];
  memcpy(coef, fl->w, sizeof coef);
  m.coef = coef;
  m.intercepts = &intercept;
  for (int i = -1; i < RUNS; i++) {
    if (i >= 0) f[i] = floor_run(&fl->logistic, 0, NULL);
    double t0 = now_s();
    if (fl_ml_loss_gradient(&m, data, 0, &loss, grad) != FL_OK) {
      fail_flint("a gradient");
      return 1;
    }
    if (i >= 0) {
      e[i] = now_s() - t0;
      q[i] = e[i] / f[i];
    }
  }
  r->gradient = pair_medians(e, f, q);
  return 0;
}

/* Least squares end to end: RUNS pairs of (dsyrk floor, fit), after one fit to warm up. */
static int bench_lstsq(const floors *fl, const fl_ml_data *data, mode_result *r) {
  fl_ml_train_options no = {.solver = FL_ML_SOLVER_NORMAL};
  fl_ml_model *model = NULL;
  double e[RUNS], f[RUNS], q[RUNS], secs;
  int rc = 1;
  if (fit_timed(fl_ml_linreg, data, &no, &model, &secs) != 0) goto done;
  for (int i = 0; i < RUNS; i++) {
    f[i] = floor_run(&fl->linear, 1, NULL);
    if (fit_timed(fl_ml_linreg, data, &no, &model, &e[i]) != 0) goto done;
    q[i] = e[i] / f[i];
  }
  r->lstsq = pair_medians(e, f, q);
  rc = 0;
done:
  fl_ml_model_free(model);
  return rc;
}

static int run_mode(const char *master, const options *o, floors *fl, mode_result *r) {
  fl_context *ctx;
  fl_options fo = {.memory_limit = 4ull << 30}; /* local mode: 2n x d cached rows must fit, or they are recomputed */
  if (fl_context_open(master, &fo, &ctx) != FL_OK) {
    fail_flint("opening the context");
    return 1;
  }
  int rc = 1;
  fl_ml_data *data = NULL, *lin = NULL;
  fl_ml_synth_options so = {.kind = FL_ML_SYNTH_LOGISTIC, .rows = o->rows, .cols = COLS, .classes = 2, .seed = 7,
                            .partitions = o->partitions};
  if (fl_ml_synthetic(ctx, &so, &data) != FL_OK) {
    fail_flint("synthetic data");
    goto done;
  }
  fl_storage_info si;
  if (fl_storage_info_get(data->blocks, &si) != FL_OK) {
    fail_flint("storage info");
    goto done;
  }
  r->memory_ratio = (double)si.memory_bytes / ((double)o->rows * (COLS + 1) * 8);
  if (bench_sandblaster(data, r) != 0) goto done;
  if (o->sandblaster_only) {
    rc = 0;
    goto done;
  }
  if (bench_lbfgs(o, fl, data, r) != 0 || bench_gradient(fl, data, r) != 0) goto done;
  fl_ml_data_free(data);
  data = NULL;
  fl_ml_synth_options ls = {.kind = FL_ML_SYNTH_LINEAR, .rows = 2 * o->rows, .cols = COLS, .noise = 0.1, .seed = 8,
                            .partitions = o->partitions};
  if (fl_ml_synthetic(ctx, &ls, &lin) != FL_OK) {
    fail_flint("synthetic linear data");
    goto done;
  }
  if (bench_lstsq(fl, lin, r) != 0) goto done;
  rc = 0;
done:
  fl_ml_data_free(data);
  fl_ml_data_free(lin);
  fl_context_close(ctx);
  return rc;
}

static int run_fmnist(double *secs, double *accuracy, uint32_t *iterations) {
  fl_context *ctx;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) return 1;
  fl_ml_data *train = NULL, *test = NULL;
  fl_ml_model *m = NULL;
  int rc = 1;
  fl_ml_load_options lo = {.labels_path = FMNIST "/train-labels-idx1-ubyte.gz"};
  fl_ml_load_options to = {.labels_path = FMNIST "/t10k-labels-idx1-ubyte.gz"};
  fl_ml_train_options o = {.l2 = 1e-4, .tol = 1e-6, .max_iterations = 100};
  fl_ml_metrics mt;
  if (fl_ml_load(ctx, FMNIST "/train-images-idx3-ubyte.gz", FL_ML_IDX, &lo, &train) != FL_OK ||
      fl_ml_load(ctx, FMNIST "/t10k-images-idx3-ubyte.gz", FL_ML_IDX, &to, &test) != FL_OK) {
    fail_flint("loading Fashion-MNIST");
    goto done;
  }
  double t0 = now_s();
  if (fl_ml_logreg(train, &o, &m) != FL_OK) {
    fail_flint("Fashion-MNIST L-BFGS");
    goto done;
  }
  *secs = now_s() - t0;
  *iterations = m->num_history;
  if (fl_ml_evaluate(m, test, &mt) != FL_OK) {
    fail_flint("Fashion-MNIST evaluation");
    goto done;
  }
  *accuracy = mt.accuracy;
  rc = 0;
done:
  fl_ml_model_free(m);
  fl_ml_data_free(train);
  fl_ml_data_free(test);
  fl_context_close(ctx);
  return rc;
}

static void row(const options *o, const bench_columns *c, const char *bench, const char *metric, double value,
                const char *fmt, const char *target, const char *met) {
  char v[64];
  snprintf(v, sizeof v, fmt, value);
  if (!o->json) bench_print_row(c, bench, metric, v, target, met);
}

int main(int argc, char **argv) {
  options o = {.rows = 1000000};
  uint64_t n;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) o.json = true;
    else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc && parse_count(argv[i + 1], 100000000, &o.rows)) i++;
    else if (strcmp(argv[i], "--partitions") == 0 && i + 1 < argc && parse_count(argv[i + 1], 4096, &n) && n > 0) {
      o.partitions = (uint32_t)n;
      i++;
    } else if (strcmp(argv[i], "--skip-cluster") == 0) o.skip_cluster = true;
    else if (strcmp(argv[i], "--skip-fmnist") == 0) o.skip_fmnist = true;
    else if (strcmp(argv[i], "--sandblaster-only") == 0) o.sandblaster_only = o.skip_fmnist = true;
    else {
      fprintf(stderr, BENCH_NAME ": bad option '%s'\nusage: bench_ml [--json] [--rows N] [--partitions P] [--skip-cluster] [--skip-fmnist] "
                      "[--sandblaster-only]\n",
              argv[i]);
      return 2;
    }
  }
  floors fl;
  memset(&fl, 0, sizeof fl);
  if (!o.sandblaster_only && !floor_data_make(2 * o.rows, NULL, &fl.linear)) {
    fprintf(stderr, BENCH_NAME ": out of memory for the floors' rows\n");
    return 1;
  }
  const char *masters[2] = {"local[2]", "local-cluster[2,1,3072]"};
  mode_result res[2];
  memset(res, 0, sizeof res);
  for (int k = 0; k < (o.skip_cluster ? 1 : 2); k++)
    if (run_mode(masters[k], &o, &fl, &res[k]) != 0) return 1;
  free(fl.logistic.data);
  free(fl.linear.data);
  double fm_s = NAN, fm_acc = NAN;
  uint32_t fm_it = 0;
  bool fm = !o.skip_fmnist && access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) == 0;
  if (fm && run_fmnist(&fm_s, &fm_acc, &fm_it) != 0) return 1;

  bench_columns c = {10, 40, 14, 12};
  if (!o.json) {
    printf("flint bench_ml: %llu x %d rows (least squares %llu); floors on %d threads, each run next to the "
           "engine's; medians of %d pairs\n\n",
           (unsigned long long)o.rows, COLS, 2 * (unsigned long long)o.rows, THREADS, RUNS);
    bench_print_row(&c, "bench", "metric", "value", "target", "met");
    puts("---------- ---------------------------------------- --------------  ------------ ---");
  }
  for (int k = 0; k < (o.skip_cluster ? 1 : 2); k++) {
    const mode_result *r = &res[k];
    const paired *g = &r->gradient, *l = &r->lstsq, *b = &r->lbfgs;
    const char *name = masters[k];
    double vs = r->sb_iter_s / r->sb_lbfgs_iter_s;
    if (o.json)
      printf("{\"bench\": \"sandblaster\", \"master\": \"%s\", \"rows\": %llu, \"cols\": %d, \"iterations\": %u, "
             "\"converged\": %s, \"loss\": %.10f, \"total_s\": %.4f, \"s_per_iteration\": %.5f, "
             "\"lbfgs_iterations\": %u, \"lbfgs_loss\": %.10f, \"lbfgs_s_per_iteration\": %.5f, \"vs_lbfgs\": %.3f}\n",
             name, (unsigned long long)o.rows, COLS, r->sb_iterations, r->sb_converged ? "true" : "false", r->sb_loss,
             r->sb_total_s, r->sb_iter_s, r->sb_lbfgs_iterations, r->sb_lbfgs_loss, r->sb_lbfgs_iter_s, vs);
    else {
      row(&o, &c, "sandblaster", name, r->sb_iter_s, "%.4f", "", "");
      row(&o, &c, "", "s per iteration, lbfgs (same run)", r->sb_lbfgs_iter_s, "%.4f", "", "");
      row(&o, &c, "", "sandblaster / lbfgs per iteration", vs, "%.3f", "", "");
      char its[64];
      snprintf(its, sizeof its, "%u / %u", r->sb_iterations, r->sb_lbfgs_iterations);
      bench_print_row(&c, "", "iterations, sandblaster / lbfgs", its, "", "");
      row(&o, &c, "", "final loss", r->sb_loss, "%.8f", "", "");
      row(&o, &c, "", "final loss, lbfgs", r->sb_lbfgs_loss, "%.8f", "", "");
      row(&o, &c, "", "total_s", r->sb_total_s, "%.3f", "", "");
    }
    if (o.sandblaster_only) continue;
    if (o.json) {
      printf("{\"bench\": \"gradient\", \"master\": \"%s\", \"rows\": %llu, \"cols\": %d, \"gradient_s\": %.5f, "
             "\"floor_s\": %.5f, \"ratio\": %.3f, \"target\": \"ratio <= 2\", \"met\": %s}\n",
             name, (unsigned long long)o.rows, COLS, g->engine_s, g->floor_s, g->figure,
             g->figure <= 2 ? "true" : "false");
      printf("{\"bench\": \"lstsq\", \"master\": \"%s\", \"rows\": %llu, \"cols\": %d, \"lstsq_s\": %.5f, "
             "\"floor_s\": %.5f, \"ratio\": %.3f, \"target\": \"ratio <= 1.2\", \"met\": %s}\n",
             name, 2 * (unsigned long long)o.rows, COLS, l->engine_s, l->floor_s, l->figure,
             l->figure <= 1.2 ? "true" : "false");
      printf("{\"bench\": \"lbfgs\", \"master\": \"%s\", \"iterations\": %u, \"evaluations\": %u, \"converged\": %s, "
             "\"total_s\": %.4f, \"task_s\": %.4f, \"engine_ms_per_iteration\": %.3f, "
             "\"engine_ms_per_iteration_min\": %.3f, \"engine_ms_per_iteration_max\": %.3f, "
             "\"floor_per_eval_s\": %.5f, \"engine_ms_per_iteration_vs_floor\": %.3f, "
             "\"target\": \"engine_ms_per_iteration <= 2 (local-cluster)\", \"met\": %s}\n",
             name, r->iterations, r->evaluations, r->converged ? "true" : "false", b->engine_s, r->lbfgs_task_s,
             r->share_ms, r->share_min_ms, r->share_max_ms, b->floor_s, b->figure, r->share_ms <= 2 ? "true" : "false");
      printf("{\"bench\": \"memory\", \"master\": \"%s\", \"ratio\": %.4f, \"target\": \"ratio <= 1.05\", \"met\": %s}\n",
             name, r->memory_ratio, r->memory_ratio <= 1.05 ? "true" : "false");
      continue;
    }
    row(&o, &c, "gradient", name, g->figure, "%.3f", "<= 2", g->figure <= 2 ? "yes" : "NO");
    row(&o, &c, "", "gradient_s", g->engine_s, "%.4f", "", "");
    row(&o, &c, "", "floor_s (read pass)", g->floor_s, "%.4f", "", "");
    row(&o, &c, "lstsq", name, l->figure, "%.3f", "<= 1.2", l->figure <= 1.2 ? "yes" : "NO");
    row(&o, &c, "", "lstsq_s", l->engine_s, "%.4f", "", "");
    row(&o, &c, "", "floor_s (dsyrk per block)", l->floor_s, "%.4f", "", "");
    row(&o, &c, "lbfgs", "engine ms per iteration", r->share_ms, "%.3f", k ? "<= 2" : "(ref)",
        k ? (r->share_ms <= 2 ? "yes" : "NO") : "-");
    char spread[64];
    snprintf(spread, sizeof spread, "%.3f / %.3f", r->share_min_ms, r->share_max_ms);
    bench_print_row(&c, "", "engine ms per iteration, min / max", spread, "", "");
    row(&o, &c, "", "engine ms per iteration (vs fused floor)", b->figure, "%.3f", "", "");
    row(&o, &c, "", "iterations", r->iterations, "%.0f", "", "");
    row(&o, &c, "", "evaluations", r->evaluations, "%.0f", "", "");
    row(&o, &c, "", "total_s", b->engine_s, "%.3f", "", "");
    row(&o, &c, "", "task seconds per fit (all cores)", r->lbfgs_task_s, "%.4f", "", "");
    row(&o, &c, "", "fused floor s per evaluation", b->floor_s, "%.4f", "", "");
    row(&o, &c, "", "converged (|g| <= 1e-6)", r->converged, "%.0f", "", "");
    row(&o, &c, "memory", "cached / raw bytes", r->memory_ratio, "%.4f", "<= 1.05", r->memory_ratio <= 1.05 ? "yes" : "NO");
  }
  if (!o.skip_cluster) { /* the target: Sandblaster per iteration, local-cluster over local[2] */
    double ratio = res[1].sb_iter_s / res[0].sb_iter_s;
    if (o.json)
      printf("{\"bench\": \"sandblaster_modes\", \"cluster_s_per_iteration\": %.5f, \"local_s_per_iteration\": %.5f, "
             "\"ratio\": %.3f, \"target\": \"ratio <= 1.05\", \"met\": %s}\n",
             res[1].sb_iter_s, res[0].sb_iter_s, ratio, ratio <= 1.05 ? "true" : "false");
    else
      row(&o, &c, "sandblaster", "local-cluster / local[2] per iteration", ratio, "%.3f", "<= 1.05",
          ratio <= 1.05 ? "yes" : "NO");
  }
  if (fm) {
    if (o.json)
      printf("{\"bench\": \"fmnist\", \"master\": \"local[2]\", \"seconds\": %.3f, \"iterations\": %u, "
             "\"test_accuracy\": %.4f}\n",
             fm_s, fm_it, fm_acc);
    else {
      row(&o, &c, "fmnist", "train seconds (L-BFGS)", fm_s, "%.2f", "", "");
      row(&o, &c, "", "iterations", fm_it, "%.0f", "", "");
      row(&o, &c, "", "test accuracy", fm_acc, "%.4f", "", "");
    }
  }
  return 0;
}
