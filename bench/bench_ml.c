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
 *             iterations, time, and the engine's share of an iteration: (time - evaluations x
 *             compute) / iterations, where compute is the engine's gradient step (dgemv,
 *             row losses, dgemv per 64 KiB chunk) written out plainly and run on 2 threads
 *             over in-process blocks of the same distribution, at the same model. Target: at
 *             most 2 ms in local-cluster mode (reported for local mode too).
 *   memory    the cached dataset's bytes (in cluster mode as the executors count them)
 *             against its raw bytes n x (d + 1) x 8. Target: at most 1.05x.
 *   fmnist    Fashion-MNIST (if installed) multinomial logistic regression by L-BFGS, local[2]:
 *             time to converge (or 100 iterations) and test accuracy. No target.
 *
 * Every time, floors and engine alike, is the median of 5 runs: a floor's best run against
 * the engine's median run would charge the machine's noise to the engine.
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
  bool json;
  bool skip_cluster, skip_fmnist;
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
static double fused_chunk(const double *x, const double *y, size_t n, const double *w, double *z, double *g) {
  double s = 0;
  cblas_dgemv(CblasRowMajor, CblasNoTrans, (int)n, COLS, 1.0, x, COLS, w, 1, 0.0, z, 1);
  for (size_t i = 0; i < n; i++) {
    double m = z[i] + w[COLS], e = exp(-fabs(m));
    s += (m > 0 ? m : 0.0) + log(1.0 + e) - y[i] * m;
    z[i] = (m >= 0 ? 1.0 : e) / (1.0 + e) - y[i];
    g[COLS] += z[i];
  }
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

/* Seconds for `kind` over rows x COLS on THREADS threads (best of 3). The rows are drawn as
 * the engine's synthetic logistic data is (standard normal features, labels drawn from the
 * model w when given), so that the gradient's exp and log1p see the same margins. */
#define RUNS 5 /* every figure, floors and engine alike, is the median of this many runs */

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

static double floor_time(uint64_t rows, int kind, const double *w) {
  size_t rpb = (1u << 20) / (8 * COLS), blocks = (rows + rpb - 1) / rpb, per = rpb * (COLS + 1);
  double *data = malloc(blocks * per * sizeof *data);
  if (!data) return NAN;
  uint64_t st = 99;
  for (size_t b = 0; b < blocks; b++) {
    double *x = data + b * per, *y = x + rpb * COLS;
    for (size_t i = 0; i < rpb * COLS; i++) x[i] = normal_draw(&st);
    for (size_t i = 0; i < rpb; i++) {
      double m = w ? w[COLS] + cblas_ddot(COLS, x + i * COLS, 1, w, 1) : 0;
      y[i] = uniform_draw(&st) < 1 / (1 + exp(-m)) ? 1.0 : 0.0;
    }
  }
  double runs[RUNS];
  for (int rep = 0; rep < RUNS; rep++) {
    floor_job jobs[THREADS];
    pthread_t th[THREADS];
    double t0 = now_s();
    for (int t = 0; t < THREADS; t++) {
      size_t lo = blocks * t / THREADS, hi = blocks * (t + 1) / THREADS;
      jobs[t] = (floor_job){.data = data + lo * per, .blocks = hi - lo, .rows_per_block = rpb, .kind = kind, .w = w};
      pthread_create(&th[t], NULL, floor_thread, &jobs[t]);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    runs[rep] = now_s() - t0;
  }
  free(data);
  return median(runs, RUNS);
}

/* ---- engine -------------------------------------------------------------------------------- */

typedef struct mode_result {
  double grad_s, lstsq_s, lbfgs_s, memory_ratio;
  double w[COLS + 1]; /* the L-BFGS model: coefficients, then the intercept */
  uint32_t iterations, evaluations;
  bool converged;
} mode_result;


/* Median seconds of RUNS fits of data (the machine is shared); *model is the last fit's. */
static int time_fit(fl_status (*fit)(const fl_ml_data *, const fl_ml_train_options *, fl_ml_model **),
                    const fl_ml_data *data, const fl_ml_train_options *o, fl_ml_model **model, double *out) {
  double runs[RUNS];
  for (int i = 0; i < RUNS; i++) {
    fl_ml_model_free(*model);
    *model = NULL;
    double t0 = now_s();
    if (fit(data, o, model) != FL_OK) {
      fail_flint(fit == fl_ml_linreg ? "least squares" : "L-BFGS");
      return 1;
    }
    runs[i] = now_s() - t0;
  }
  *out = median(runs, RUNS);
  return 0;
}

/* Median of RUNS loss-and-gradient evaluations of m over data (after one to warm up). */
static int time_gradient(const fl_ml_model *m, const fl_ml_data *data, double *out) {
  double loss, grad[COLS + 1], times[RUNS];
  for (int i = -1; i < RUNS; i++) {
    double t0 = now_s();
    if (fl_ml_loss_gradient(m, data, 0, &loss, grad) != FL_OK) {
      fail_flint("a gradient");
      return 1;
    }
    if (i >= 0) times[i] = now_s() - t0;
  }
  *out = median(times, RUNS);
  return 0;
}

static int run_mode(const char *master, const options *o, mode_result *r) {
  fl_context *ctx;
  fl_options fo = {.memory_limit = 4ull << 30}; /* local mode: 2n x d cached rows must fit, or they are recomputed */
  if (fl_context_open(master, &fo, &ctx) != FL_OK) {
    fail_flint("opening the context");
    return 1;
  }
  int rc = 1;
  fl_ml_data *data = NULL, *lin = NULL;
  fl_ml_model *model = NULL;
  fl_ml_synth_options so = {.kind = FL_ML_SYNTH_LOGISTIC, .rows = o->rows, .cols = COLS, .classes = 2, .seed = 7};
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
  fl_ml_train_options lo = {.l2 = 1e-4, .tol = 1e-6, .max_iterations = 100};
  if (time_fit(fl_ml_logreg, data, &lo, &model, &r->lbfgs_s) != 0) goto done;
  r->iterations = model->num_history;
  r->evaluations = model->num_history ? model->history[model->num_history - 1].evaluations : 0;
  r->converged = model->converged;
  memcpy(r->w, model->coef, COLS * sizeof *r->w);
  r->w[COLS] = model->intercepts[0];
  /* the gradient where the solver spends its time: at (near) the optimum, not at zero */
  if (time_gradient(model, data, &r->grad_s) != 0) goto done;
  fl_ml_model_free(model);
  model = NULL;
  fl_ml_data_free(data);
  data = NULL;
  fl_ml_synth_options ls = {.kind = FL_ML_SYNTH_LINEAR, .rows = 2 * o->rows, .cols = COLS, .noise = 0.1, .seed = 8};
  if (fl_ml_synthetic(ctx, &ls, &lin) != FL_OK) {
    fail_flint("synthetic linear data");
    goto done;
  }
  fl_ml_train_options no = {.solver = FL_ML_SOLVER_NORMAL};
  if (time_fit(fl_ml_linreg, lin, &no, &model, &r->lstsq_s) != 0) goto done;
  rc = 0;
done:
  fl_ml_model_free(model);
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
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) o.json = true;
    else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc && parse_count(argv[i + 1], 100000000, &o.rows)) i++;
    else if (strcmp(argv[i], "--skip-cluster") == 0) o.skip_cluster = true;
    else if (strcmp(argv[i], "--skip-fmnist") == 0) o.skip_fmnist = true;
    else {
      fprintf(stderr, BENCH_NAME ": bad option '%s'\nusage: bench_ml [--json] [--rows N] [--skip-cluster] [--skip-fmnist]\n",
              argv[i]);
      return 2;
    }
  }
  double read_s = floor_time(o.rows, 0, NULL), dsyrk_s = floor_time(2 * o.rows, 1, NULL);
  const char *masters[2] = {"local[2]", "local-cluster[2,1,3072]"};
  mode_result res[2] = {{0}};
  for (int k = 0; k < (o.skip_cluster ? 1 : 2); k++)
    if (run_mode(masters[k], &o, &res[k]) != 0) return 1;
  /* compute: the engine's gradient step without the engine, at the model L-BFGS found */
  double compute_s = floor_time(o.rows, 2, res[0].w);
  double fm_s = NAN, fm_acc = NAN;
  uint32_t fm_it = 0;
  bool fm = !o.skip_fmnist && access(FMNIST "/train-images-idx3-ubyte.gz", R_OK) == 0;
  if (fm && run_fmnist(&fm_s, &fm_acc, &fm_it) != 0) return 1;

  bench_columns c = {10, 40, 14, 12};
  if (!o.json) {
    printf("flint bench_ml: %llu x %d rows (least squares %llu), floors on %d threads: read %.4f s, dsyrk %.4f s, "
           "fused gradient %.4f s\n\n",
           (unsigned long long)o.rows, COLS, 2 * (unsigned long long)o.rows, THREADS, read_s, dsyrk_s, compute_s);
    bench_print_row(&c, "bench", "metric", "value", "target", "met");
    puts("---------- ---------------------------------------- --------------  ------------ ---");
  }
  for (int k = 0; k < (o.skip_cluster ? 1 : 2); k++) {
    const mode_result *r = &res[k];
    double gr = r->grad_s / read_s, lr = r->lstsq_s / dsyrk_s;
    double share_ms = r->iterations ? 1e3 * (r->lbfgs_s - r->evaluations * compute_s) / r->iterations : NAN;
    char name[48];
    snprintf(name, sizeof name, "%s", masters[k]);
    if (o.json) {
      printf("{\"bench\": \"gradient\", \"master\": \"%s\", \"rows\": %llu, \"cols\": %d, \"gradient_s\": %.5f, "
             "\"floor_s\": %.5f, \"ratio\": %.3f, \"target\": \"ratio <= 2\", \"met\": %s}\n",
             name, (unsigned long long)o.rows, COLS, r->grad_s, read_s, gr, gr <= 2 ? "true" : "false");
      printf("{\"bench\": \"lstsq\", \"master\": \"%s\", \"rows\": %llu, \"cols\": %d, \"lstsq_s\": %.5f, "
             "\"floor_s\": %.5f, \"ratio\": %.3f, \"target\": \"ratio <= 1.2\", \"met\": %s}\n",
             name, 2 * (unsigned long long)o.rows, COLS, r->lstsq_s, dsyrk_s, lr, lr <= 1.2 ? "true" : "false");
      printf("{\"bench\": \"lbfgs\", \"master\": \"%s\", \"iterations\": %u, \"evaluations\": %u, \"converged\": %s, "
             "\"total_s\": %.4f, \"compute_per_eval_s\": %.5f, \"engine_ms_per_iteration\": %.3f, "
             "\"target\": \"engine_ms_per_iteration <= 2 (local-cluster)\", \"met\": %s}\n",
             name, r->iterations, r->evaluations, r->converged ? "true" : "false", r->lbfgs_s, compute_s, share_ms,
             share_ms <= 2 ? "true" : "false");
      printf("{\"bench\": \"memory\", \"master\": \"%s\", \"ratio\": %.4f, \"target\": \"ratio <= 1.05\", \"met\": %s}\n",
               name, r->memory_ratio, r->memory_ratio <= 1.05 ? "true" : "false");
      continue;
    }
    row(&o, &c, "gradient", name, gr, "%.3f", "<= 2", gr <= 2 ? "yes" : "NO");
    row(&o, &c, "", "gradient_s", r->grad_s, "%.4f", "", "");
    row(&o, &c, "lstsq", name, lr, "%.3f", "<= 1.2", lr <= 1.2 ? "yes" : "NO");
    row(&o, &c, "", "lstsq_s", r->lstsq_s, "%.4f", "", "");
    row(&o, &c, "lbfgs", "engine ms per iteration", share_ms, "%.3f", k ? "<= 2" : "(ref)",
        k ? (share_ms <= 2 ? "yes" : "NO") : "-");
    row(&o, &c, "", "iterations", r->iterations, "%.0f", "", "");
    row(&o, &c, "", "evaluations", r->evaluations, "%.0f", "", "");
    row(&o, &c, "", "total_s", r->lbfgs_s, "%.3f", "", "");
    row(&o, &c, "", "converged (|g| <= 1e-6)", r->converged, "%.0f", "", "");
    row(&o, &c, "memory", "cached / raw bytes", r->memory_ratio, "%.4f", "<= 1.05", r->memory_ratio <= 1.05 ? "yes" : "NO");
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
