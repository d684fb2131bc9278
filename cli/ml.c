/*
 * ml.c: `flint ml linreg|logreg`: loads a data set into cached row blocks, trains a least
 * squares or logistic regression model with libflint_ml, prints one line per iteration and
 * a summary with metrics on the training data (and on --test data), and saves the model.
 * `flint ml predict|evaluate` read a saved model back and apply it to a data set: one
 * prediction per row, or the metrics of fl_ml_evaluate.
 *
 * Exit status: 0 on success; 2 for a usage error (every argument is checked before the
 * context opens, numbers strictly: the whole text must be the number); 1 when opening the
 * context, loading, training, evaluating or saving fails (the message is fl_last_error()).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/common.h"
#include "flint/ml.h"

/* fl_ml_train_options.normal_max_features when 0 (ml/solvers.c): the CLI states it so that
 * it can name the solver that "auto" picks. */
#define NORMAL_MAX_FEATURES 4096

static const char ml_usage_text[] =
    "usage: flint ml linreg|logreg --data PATH --format libsvm|csv|idx|text [options]\n"
    "       flint ml predict --model MODEL --data PATH --format F [--out PATH] [options]\n"
    "       flint ml evaluate --model MODEL --data PATH --format F [options]\n"
    "\n"
    "Trains a least-squares (linreg) or logistic regression (logreg; two classes or more,\n"
    "labels 0..K-1, or -1/+1 for two) model with libflint_ml. Prints one line per iteration\n"
    "(on a terminal, one line redrawn in place, with an ETA; FLINT_PROGRESS=0: lines), then\n"
    "rows, features, classes, solver, iterations, convergence, training time and the\n"
    "metrics on the training data (and on --test data): RMSE and R^2 for linreg; accuracy,\n"
    "log-loss and, for two classes, AUC for logreg.\n"
    "\n"
    "options:\n"
    "  --master M          local[*] (default), local[N], local-cluster[E,C,MB] or\n"
    "                      flint://HOST:PORT\n"
    "  --data PATH         the training data: a file, a folder or a glob (required)\n"
    "  --format F          libsvm (label idx:value ..., 1-based indices), csv (numbers only,\n"
    "                      the label first), idx (idx3-ubyte images, .gz too; with --labels)\n"
    "                      or text (label token token ...: with --hash-bits)\n"
    "  --hash-bits B       libsvm and text: hash the features into 2^B columns, B 1 to 31\n"
    "                      (signed; the hashing trick, as scikit-learn's FeatureHasher); text\n"
    "                      needs it, and predict and evaluate need the model's B again\n"
    "  --labels PATH       idx: the labels file (idx1-ubyte) of --data\n"
    "  --test PATH         data to evaluate the model on, in the same format\n"
    "  --test-labels PATH  idx: the labels file of --test\n"
    "  --lambda L          L2 penalty, L >= 0 (default 0; intercepts are not penalized):\n"
    "                      linreg solves (X'X + L I) w = X'y whatever the solver, logreg\n"
    "                      adds (L/2)|w|^2 to the mean log-loss\n"
    "  --l1 L              L1 penalty L |w|_1 on the mean loss, L >= 0 (default 0;\n"
    "                      OWL-QN with lbfgs, proximal steps with gd)\n"
    "  --solver S          auto (default: linreg normal equations up to 4096 features,\n"
    "                      else lbfgs), normal (linreg only), lbfgs, gd, sandblaster\n"
    "                      (L-BFGS with its vectors on parameter-server shards; no --l1)\n"
    "                      or ps (logreg with two classes: minibatch SGD through\n"
    "                      parameter servers; see below)\n"
    "  --iterations N      at most N iterations, N >= 1 (default 100)\n"
    "  --tol T             stop when the gradient norm is <= T, T > 0 (default 1e-6)\n"
    "  --partitions P      partitions of the data, P >= 1 (default 4 per core)\n"
    "  --classes K         logreg: K classes, labels 0..K-1, classes may have no rows\n"
    "                      (default: max label + 1, and every class must have rows;\n"
    "                      labels that leave a class empty are an error naming them)\n"
    "  --standardize       scale each feature to unit variance (and centre dense data)\n"
    "                      before training: the model's coefficients are then in\n"
    "                      standardized units, and --test data is scaled the same way\n"
    "  --out MODEL         write the model to the file MODEL (text; docs/ml.md)\n"
    "\n"
    "--solver ps (sparse logistic regression as the OSDI'14 parameter server trains it:\n"
    "the weights live on parameter servers, one worker task per partition pulls its\n"
    "minibatches' weights and pushes their gradients; --l1, --tol and --iterations are\n"
    "the batch solvers' and are refused):\n"
    "  --sync bsp|asp|ssp:S  bsp (default): every worker waits for the others each step;\n"
    "                      ssp:S: a worker more than S steps ahead of the slowest waits;\n"
    "                      asp: nobody waits (Downpour)\n"
    "  --epochs E          passes over the data, E >= 1 (default 10)\n"
    "  --batch B           rows a worker's step takes, B >= 1 (default 100)\n"
    "  --lr X              the servers' learning rate, X > 0 (default 0.1)\n"
    "  --update U          the servers' rule: adagrad (default), sgd or adam\n"
    "  --ps-fetch N        pull the weights every N steps, N >= 1 (default 1)\n"
    "  --ps-push N         push the gradients summed over N steps, N >= 1 (default 1)\n"
    "  --curves FILE       write a CSV row per epoch: epoch, seconds, loss, accuracy,\n"
    "                      steps, bytes sent and received by the workers\n"
    "  --conf KEY=VALUE    a setting ('flint config' lists them), e.g. log=debug\n"
    "  -h, --help          this text\n"
    "  --version           the version\n"
    "\n"
    "predict and evaluate apply a model that --out wrote to data in one of the formats\n"
    "above (whose labels predict ignores). predict writes one prediction per row, in the\n"
    "data's order (linreg: the value; logreg: the class, 0..K-1), to stdout or --out PATH;\n"
    "evaluate prints the metrics above. A model trained with --standardize expects\n"
    "standardized data. Their options:\n"
    "  --model MODEL       the model file (required)\n"
    "  --data PATH, --format F, --labels PATH, --partitions P, --master M: as above\n"
    "  --out PATH          predict: write the predictions to PATH (default: stdout)\n"
    "  --version           the version\n"
    "\n"
    "Options take their value as --opt VALUE or --opt=VALUE.\n"
    "\n"
    "memory:\n"
    "  The data is loaded once and cached as row blocks of float64 values (8 bytes a value\n"
    "  when dense; 12 a non-zero when sparse: LIBSVM data that is mostly non-zero is stored\n"
    "  dense). Blocks are kept in memory up to FLINT_MEMORY (local mode; default 60% of the\n"
    "  machine's memory) or an executor's --memory (clusters); the rest go to local disk\n"
    "  (LZ4) and every pass reads them from there, never parsing the text again. A warning\n"
    "  on stderr says how much of a data set did not fit in memory.\n"
    "\n"
    "examples:\n"
    "  flint ml logreg --data train.svm --format libsvm --test test.svm --lambda 1e-4 \\\n"
    "      --out model.txt\n"
    "  flint ml predict --model model.txt --data test.svm --format libsvm --out predictions.txt\n"
    "  flint ml evaluate --model model.txt --data test.svm --format libsvm\n";

typedef enum ml_command { ML_TRAIN, ML_PREDICT, ML_EVALUATE } ml_command;

typedef struct ml_args {
  ml_command command;
  bool logistic;
  const char *model;      /* predict, evaluate: the model file */
  const char *train_only; /* the first training option given, which predict and evaluate refuse */
  const char *master, *data, *labels, *test, *test_labels, *out;
  fl_ml_format format;
  bool have_format, standardize;
  uint32_t partitions;
  uint32_t hash_bits; /* 0: none */
  const char *ps_only; /* the first option only --solver ps takes */
  const char *batch_only; /* the first option the ps solver refuses */
  const char *curves;
  fl_ml_train_options train;
} ml_args;

#define ml_usage_error(...) cli_usage_error("ml", __VA_ARGS__)

static int ml_failure(void) { return cli_failure("ml", "%s", fl_last_error()); }

static int parse_penalty(const char *name, const char *text, double *out) {
  if (!cli_parse_double(text, out)) return ml_usage_error("%s '%s' is not a number", name, text);
  if (*out < 0) return ml_usage_error("%s '%s' must be >= 0", name, text);
  return 0;
}

/* Fills `a` from argv (after "ml"): options and the model, in any order (getopt_long
 * permutes). Returns 0, 2 for a usage error, -1 after --help or -2 after --version. */
static int parse_args(int argc, char **argv, ml_args *a) {
  enum {
    OPT_MASTER = 256, OPT_DATA, OPT_FORMAT, OPT_LABELS, OPT_TEST, OPT_TEST_LABELS, OPT_LAMBDA, OPT_L1,
    OPT_SOLVER, OPT_ITERATIONS, OPT_TOL, OPT_PARTITIONS, OPT_OUT, OPT_CLASSES, OPT_STANDARDIZE, OPT_MODEL,
    OPT_HASH_BITS, OPT_SYNC, OPT_EPOCHS, OPT_BATCH, OPT_LR, OPT_UPDATE, OPT_PS_FETCH, OPT_PS_PUSH, OPT_CURVES
  };
  static const struct option longopts[] = {
      {"master", required_argument, NULL, OPT_MASTER},
      {"data", required_argument, NULL, OPT_DATA},
      {"format", required_argument, NULL, OPT_FORMAT},
      {"hash-bits", required_argument, NULL, OPT_HASH_BITS},
      {"labels", required_argument, NULL, OPT_LABELS},
      {"test", required_argument, NULL, OPT_TEST},
      {"test-labels", required_argument, NULL, OPT_TEST_LABELS},
      {"lambda", required_argument, NULL, OPT_LAMBDA},
      {"l1", required_argument, NULL, OPT_L1},
      {"solver", required_argument, NULL, OPT_SOLVER},
      {"iterations", required_argument, NULL, OPT_ITERATIONS},
      {"tol", required_argument, NULL, OPT_TOL},
      {"partitions", required_argument, NULL, OPT_PARTITIONS},
      {"out", required_argument, NULL, OPT_OUT},
      {"classes", required_argument, NULL, OPT_CLASSES},
      {"standardize", no_argument, NULL, OPT_STANDARDIZE},
      {"model", required_argument, NULL, OPT_MODEL},
      {"sync", required_argument, NULL, OPT_SYNC},
      {"epochs", required_argument, NULL, OPT_EPOCHS},
      {"batch", required_argument, NULL, OPT_BATCH},
      {"lr", required_argument, NULL, OPT_LR},
      {"update", required_argument, NULL, OPT_UPDATE},
      {"ps-fetch", required_argument, NULL, OPT_PS_FETCH},
      {"ps-push", required_argument, NULL, OPT_PS_PUSH},
      {"curves", required_argument, NULL, OPT_CURVES},
      CLI_COMMON_LONG_OPTIONS,
      {0}};
  *a = (ml_args){.master = "local[*]"};
  int c;
  optind = 0; /* afresh; argv - 1 is the command's name, getopt's argv[0] */
  while ((c = getopt_long(argc + 1, argv - 1, ":hV", longopts, NULL)) != -1) {
    const char *v = optarg;
    int rc = 0;
    /* The options that only training takes, in the table's order from --test on. */
    const char *name = NULL;
    for (const struct option *o = longopts; o->name; o++)
      if (o->val == c) name = o->name;
    bool ps_option = c >= OPT_SYNC && c <= OPT_CURVES;
    if (!a->train_only && ((c >= OPT_TEST && c <= OPT_TOL) || c == OPT_CLASSES || c == OPT_STANDARDIZE || ps_option))
      a->train_only = name;
    if (!a->ps_only && ps_option) a->ps_only = name;
    if (!a->batch_only && (c == OPT_L1 || c == OPT_TOL || c == OPT_ITERATIONS)) a->batch_only = name;
    switch (c) {
    case CLI_OPT_HELP: return -1;
    case CLI_OPT_VERSION: return -2;
    case OPT_STANDARDIZE: a->standardize = true; break;
    case OPT_MASTER: a->master = v; break;
    case OPT_DATA: a->data = v; break;
    case OPT_LABELS: a->labels = v; break;
    case OPT_TEST: a->test = v; break;
    case OPT_TEST_LABELS: a->test_labels = v; break;
    case OPT_OUT: a->out = v; break;
    case OPT_MODEL: a->model = v; break;
    case OPT_FORMAT:
      if (fl_ml_format_parse(v, &a->format) != FL_OK)
        return ml_usage_error("unknown format '%s' (libsvm, csv, idx or text)", v);
      a->have_format = true;
      break;
    case OPT_HASH_BITS: {
      uint64_t bits;
      if (!cli_parse_u64(v, 31, &bits) || bits < 1)
        return ml_usage_error("--hash-bits '%s' is not a whole number from 1 to 31", v);
      a->hash_bits = (uint32_t)bits;
      break;
    }
    case OPT_SOLVER:
      if (fl_ml_solver_parse(v, &a->train.solver) != FL_OK)
        return ml_usage_error("unknown solver '%s' (auto, normal, lbfgs, gd, sandblaster or ps)", v);
      break;
    case OPT_SYNC:
      if (fl_ml_sync_parse(v, &a->train.ps.sync, &a->train.ps.staleness) != FL_OK)
        return ml_usage_error("--sync: %s", fl_last_error());
      break;
    case OPT_UPDATE:
      if (fl_ml_ps_update_parse(v, &a->train.ps.update) != FL_OK) return ml_usage_error("--update: %s", fl_last_error());
      break;
    case OPT_EPOCHS:
    case OPT_BATCH:
    case OPT_PS_FETCH:
    case OPT_PS_PUSH: {
      uint32_t n;
      if (!cli_parse_u32(v, &n) || n < 1 || n > 100000000)
        return ml_usage_error("--%s '%s' is not a whole number from 1 to 100000000", name, v);
      *(c == OPT_EPOCHS ? &a->train.ps.epochs : c == OPT_BATCH ? &a->train.ps.batch
        : c == OPT_PS_FETCH ? &a->train.ps.fetch_every : &a->train.ps.push_every) = n;
      break;
    }
    case OPT_LR:
      if (!cli_parse_double(v, &a->train.ps.lr) || !(a->train.ps.lr > 0) || !isfinite(a->train.ps.lr))
        return ml_usage_error("--lr '%s' is not a number > 0", v);
      break;
    case OPT_CURVES: a->curves = v; break;
    case OPT_LAMBDA: rc = parse_penalty("--lambda", v, &a->train.l2); break;
    case OPT_L1: rc = parse_penalty("--l1", v, &a->train.l1); break;
    case OPT_TOL:
      if (!cli_parse_double(v, &a->train.tol)) return ml_usage_error("--tol '%s' is not a number", v);
      if (a->train.tol <= 0) return ml_usage_error("--tol '%s' must be > 0", v); /* 0 means the default */
      break;
    case OPT_ITERATIONS:
      if (!cli_parse_u32(v, &a->train.max_iterations) || a->train.max_iterations < 1)
        return ml_usage_error("--iterations '%s' is not a whole number >= 1", v);
      break;
    case OPT_CLASSES:
      if (!cli_parse_u32(v, &a->train.classes) || a->train.classes < 2 || a->train.classes > 65536)
        return ml_usage_error("--classes '%s' is not a whole number from 2 to 65536", v);
      break;
    case OPT_PARTITIONS:
      if (!cli_parse_u32(v, &a->partitions) || a->partitions < 1 || a->partitions > 1000000)
        return ml_usage_error("--partitions '%s' is not a whole number from 1 to 1000000", v);
      break;
    default: return cli_option_error("ml", c, argv - 1, longopts);
    }
    if (rc) return rc;
  }
  int first = optind - 1; /* getopt counted the command's name */
  if (first >= argc) return ml_usage_error("no model given (linreg or logreg; or predict, evaluate)");
  if (strcmp(argv[first], "logreg") == 0) a->logistic = true;
  else if (strcmp(argv[first], "predict") == 0) a->command = ML_PREDICT;
  else if (strcmp(argv[first], "evaluate") == 0) a->command = ML_EVALUATE;
  else if (strcmp(argv[first], "linreg") != 0)
    return ml_usage_error("unknown model '%s' (linreg or logreg; or predict, evaluate)", argv[first]);
  if (first + 1 < argc) return ml_usage_error("unexpected argument '%s'", argv[first + 1]);
  const char *verb = argv[first];
  if (a->command != ML_TRAIN) {
    if (a->train_only) return ml_usage_error("--%s is for training (linreg, logreg), not %s", a->train_only, verb);
    if (!a->model) return ml_usage_error("%s needs --model MODEL (a file that 'flint ml ... --out' wrote)", verb);
    if (a->command == ML_EVALUATE && a->out)
      return ml_usage_error("evaluate prints its metrics; --out is for predict and training");
  } else if (a->model) {
    return ml_usage_error("--model is for predict and evaluate; training writes its model with --out");
  }
  if (!a->data) return ml_usage_error("--data PATH is required");
  if (!a->have_format) return ml_usage_error("--format is required (libsvm, csv, idx or text)");
  if (a->format == FL_ML_TEXT && !a->hash_bits)
    return ml_usage_error("--format text needs --hash-bits B (its tokens become columns by hashing)");
  if (a->hash_bits && a->format != FL_ML_LIBSVM && a->format != FL_ML_TEXT)
    return ml_usage_error("--hash-bits is for --format libsvm and text");
  bool idx = a->format == FL_ML_IDX;
  if (idx && !a->labels) return ml_usage_error("--format idx needs --labels PATH (the idx1-ubyte labels of --data)");
  if (idx && a->test && !a->test_labels)
    return ml_usage_error("--format idx needs --test-labels PATH with --test (the labels of --test)");
  if (!idx && (a->labels || a->test_labels))
    return ml_usage_error("--labels and --test-labels are for --format idx only (libsvm and csv hold the labels)");
  if (a->test_labels && !a->test) return ml_usage_error("--test-labels needs --test PATH");
  if (!a->logistic && a->train.classes) return ml_usage_error("--classes is for logreg only");
  if (a->train.solver == FL_ML_SOLVER_PS) {
    if (!a->logistic) return ml_usage_error("--solver ps is for logreg only");
    if (a->batch_only)
      return ml_usage_error("--%s is for the batch solvers (lbfgs, gd), not --solver ps (which takes --epochs, "
                            "--batch and --lr)", a->batch_only);
    if (a->train.classes > 2) return ml_usage_error("--solver ps trains two classes, not --classes %u", a->train.classes);
  } else if (a->ps_only && a->command == ML_TRAIN) {
    return ml_usage_error("--%s is for --solver ps", a->ps_only);
  }
  if (a->logistic && a->train.solver == FL_ML_SOLVER_NORMAL)
    return ml_usage_error("--solver normal is for linreg only (logreg: lbfgs or gd)");
  if (!a->logistic && a->train.solver == FL_ML_SOLVER_NORMAL && a->train.l1 > 0)
    return ml_usage_error("--l1 has no normal equations: use --solver lbfgs or gd");
  if (a->train.solver == FL_ML_SOLVER_SANDBLASTER && a->train.l1 > 0)
    return ml_usage_error("--solver sandblaster takes no --l1 (smooth objectives only: use --solver lbfgs)");
  a->train.normal_max_features = NORMAL_MAX_FEATURES;
  return 0;
}

/* The iterations' (the ps solver: epochs') progress: on a terminal one line redrawn in
 * place, with an ETA (from max_iterations: training that converges ends sooner); elsewhere a
 * whole line each. */
typedef struct iteration_line {
  bool in_place, open;     /* open: a line without its newline yet */
  uint32_t max_iterations; /* the ps solver: its epochs */
  FILE *csv;               /* the ps solver's --curves */
} iteration_line;

/* One line per iteration, flushed so that it shows at once through a pipe. */
static fl_status print_iteration(void *arg, const fl_ml_iteration *it) {
  iteration_line *l = arg;
  if (!l->in_place) {
    printf("iter %3u  loss %.10f  |grad| %.3e  step %.2e  evals %u  %.2f s\n", it->iteration, it->loss,
           it->grad_norm, it->step, it->evaluations, it->seconds);
  } else {
    char eta[32];
    common_progress_eta(eta, sizeof eta, it->seconds, (double)it->iteration / l->max_iterations);
    /* Trailing blanks clear what a longer last line left. */
    printf("\riter %3u/%u  loss %.10f  |grad| %.3e  step %.2e  evals %u  %.2f s  %s   ", it->iteration,
           l->max_iterations, it->loss, it->grad_norm, it->step, it->evaluations, it->seconds, eta);
    l->open = true;
  }
  fflush(stdout);
  return FL_OK;
}

static void end_iteration_line(iteration_line *l) {
  if (l->open) putchar('\n');
  l->open = false;
}

/* The ps solver's curve row: a line on stdout and, with --curves, a CSV row (flushed, so
 * that the file can be watched while training runs). */
static fl_status print_epoch(void *arg, const fl_ml_ps_epoch *e) {
  iteration_line *l = arg;
  FILE *csv = l->csv;
  if (!l->in_place) {
    printf("epoch %3u  loss %.10f  accuracy %.4f  %.2f s  %.2f MiB sent  %.2f MiB received\n", e->epoch, e->loss,
           e->accuracy, e->seconds, (double)e->bytes_sent / 1048576.0, (double)e->bytes_received / 1048576.0);
  } else {
    char eta[32];
    common_progress_eta(eta, sizeof eta, e->seconds, (double)e->epoch / l->max_iterations);
    printf("\repoch %3u/%u  loss %.10f  accuracy %.4f  %.2f s  %.2f MiB sent  %.2f MiB received  %s   ", e->epoch,
           l->max_iterations, e->loss, e->accuracy, e->seconds, (double)e->bytes_sent / 1048576.0,
           (double)e->bytes_received / 1048576.0, eta);
    l->open = true;
  }
  fflush(stdout);
  if (csv) {
    fprintf(csv, "%u,%.6f,%.10f,%.6f,%llu,%llu,%llu\n", e->epoch, e->seconds, e->loss, e->accuracy,
            (unsigned long long)e->steps, (unsigned long long)e->bytes_sent, (unsigned long long)e->bytes_received);
    if (fflush(csv) != 0) return fl_set_error(FL_EIO, "cannot write the curves: %s", strerror(errno));
  }
  return FL_OK;
}

/* The solver that fl_ml_linreg / fl_ml_logreg run for these options (their AUTO rule). */
static const char *solver_name(const ml_args *a, const fl_ml_data *d) {
  fl_ml_solver s = a->train.solver;
  if (s == FL_ML_SOLVER_AUTO)
    s = !a->logistic && a->train.l1 == 0 && d->cols <= a->train.normal_max_features ? FL_ML_SOLVER_NORMAL
                                                                                     : FL_ML_SOLVER_LBFGS;
  switch (s) {
  case FL_ML_SOLVER_PS: return "ps (minibatch SGD through parameter servers)";
  case FL_ML_SOLVER_NORMAL: return "normal equations (Cholesky)";
  case FL_ML_SOLVER_GD: return a->train.l1 > 0 ? "gd (proximal, L1)" : "gd";
  case FL_ML_SOLVER_SANDBLASTER: return "sandblaster (L-BFGS on parameter-server shards)";
  default: return a->train.l1 > 0 ? "lbfgs (OWL-QN, L1)" : "lbfgs";
  }
}

/* Loads one data set; test data is read with the training data's width. */
static fl_status load(fl_context *ctx, const ml_args *a, const char *path, const char *labels, uint32_t cols,
                      fl_ml_data **out) {
  fl_ml_load_options o = {.partitions = a->partitions, .labels_path = labels,
                          .num_features = a->hash_bits ? 0 : cols, .hash_bits = a->hash_bits};
  double t0 = common_now_s();
  fl_status s = fl_ml_load(ctx, path, a->format, &o, out);
  if (s != FL_OK) return s;
  const fl_ml_data *d = *out;
  printf("loaded %s: %llu rows, %u features, %s%s, %u partitions, %.2f s\n", path, (unsigned long long)d->rows,
         d->cols, d->sparse ? "sparse" : "dense", d->weighted ? ", weighted" : "", fl_dataset_partitions(d->blocks),
         common_now_s() - t0);
  if (d->skipped) printf("skipped %llu bad lines of %s\n", (unsigned long long)d->skipped, path);
  if (a->logistic) { /* the classes found, before training decides whether they fit */
    char labels[256];
    fl_ml_data_describe_labels(d, labels, sizeof labels);
    printf("labels of %s: %s\n", path, labels);
  }
  return FL_OK;
}

static void print_metrics(const char *what, const fl_ml_model *m, const fl_ml_metrics *mt) {
  if (m->kind == FL_ML_LINEAR) {
    printf("%-12s RMSE %.6g  R^2 %.6f  (%llu rows)\n", what, mt->rmse, mt->r2, (unsigned long long)mt->rows);
  } else if (m->kind == FL_ML_LOGISTIC_BINARY) {
    printf("%-12s accuracy %.4f  log-loss %.6f  AUC %.4f  (%llu rows)\n", what, mt->accuracy, mt->log_loss, mt->auc,
           (unsigned long long)mt->rows);
  } else {
    printf("%-12s accuracy %.4f  log-loss %.6f  (%llu rows)\n", what, mt->accuracy, mt->log_loss,
           (unsigned long long)mt->rows);
  }
}

/* flint ml predict|evaluate: the model first (a bad file fails before a context opens),
 * then the data at the model's width, then one job. Predictions go to a file only once
 * they are all there: a failure leaves no partial file. */
static int apply_model(const ml_args *a) {
  fl_context *ctx = NULL;
  fl_ml_model *model = NULL;
  fl_ml_data *data = NULL;
  fl_buf preds = FL_BUF_INIT;
  FILE *f = NULL;
  int rc = 1;
  if (fl_ml_model_load(a->model, &model) != FL_OK) goto fail;
  if (fl_context_open(a->master, NULL, &ctx) != FL_OK) goto fail;
  if (a->hash_bits && model->cols != 1u << a->hash_bits) {
    fl_set_error(FL_EINVAL, "--hash-bits %u makes %u columns, but the model %s has %u features (train and apply "
                 "with the same --hash-bits)", a->hash_bits, 1u << a->hash_bits, a->model, model->cols);
    goto fail;
  }
  fl_ml_load_options o = {.partitions = a->partitions,
                          .labels_path = a->labels,
                          .num_features = a->format == FL_ML_LIBSVM && !a->hash_bits ? model->cols : 0,
                          .hash_bits = a->hash_bits};
  if (fl_ml_load(ctx, a->data, a->format, &o, &data) != FL_OK) goto fail;
  if (data->cols != model->cols && !data->sparse) {
    fl_set_error(FL_EINVAL, "%s has %u features, the model %s %u", a->data, data->cols, a->model, model->cols);
    goto fail;
  }
  if (a->command == ML_EVALUATE) {
    fl_ml_metrics metrics;
    if (fl_ml_evaluate(model, data, &metrics) != FL_OK) goto fail;
    print_metrics("data", model, &metrics);
  } else {
    if (fl_ml_predict_data(model, data, &preds) != FL_OK) goto fail;
    if (a->out && !(f = fopen(a->out, "w"))) {
      fl_set_error(FL_EIO, "cannot write %s: %s", a->out, strerror(errno));
      goto fail;
    }
    FILE *to = f ? f : stdout;
    for (size_t i = 0; i + 8 <= preds.len; i += 8) {
      double p;
      memcpy(&p, preds.data + i, 8);
      fprintf(to, model->kind == FL_ML_LINEAR ? "%.17g\n" : "%.0f\n", p);
    }
    bool written = fflush(to) == 0 && !ferror(to);
    if (f) written = fclose(f) == 0 && written;
    f = NULL;
    if (!written) {
      fl_set_error(FL_EIO, "cannot write %s: %s", a->out ? a->out : "the predictions", strerror(errno));
      goto fail;
    }
  }
  rc = 0;
fail:
  if (f) fclose(f);
  if (rc) {
    if (a->out && a->command == ML_PREDICT) unlink(a->out);
    ml_failure();
  }
  fl_buf_free(&preds);
  fl_ml_data_free(data);
  fl_ml_model_free(model);
  fl_context_close(ctx);
  return rc;
}

int cmd_ml(int argc, char **argv) {
  ml_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc == -2) return cli_print_version();
  if (rc < 0) {
    fputs(ml_usage_text, stdout);
    return 0;
  }
  if (rc) return rc;
  if (a.command != ML_TRAIN) return apply_model(&a);
  iteration_line line = {.in_place = common_progress_on_terminal(STDOUT_FILENO),
                         .max_iterations = a.train.max_iterations ? a.train.max_iterations : 100};
  a.train.progress = print_iteration;
  a.train.progress_arg = &line;
  FILE *curves = NULL;
  if (a.train.solver == FL_ML_SOLVER_PS) { /* one line per epoch instead of per iteration */
    a.train.progress = NULL;
    a.train.ps.on_epoch = print_epoch;
    a.train.ps.on_epoch_arg = &line;
    line.max_iterations = a.train.ps.epochs ? a.train.ps.epochs : 10;
  }

  fl_context *ctx = NULL;
  fl_ml_data *data = NULL, *scaled = NULL, *test = NULL, *test_scaled = NULL;
  fl_ml_summary summary = {0};
  fl_ml_model *model = NULL;
  fl_ml_metrics metrics;
  rc = 1;
  /* The iteration line redrawn on a terminal stands for the stage bar, which would fight it. */
  fl_options fo = FL_OPTIONS_INIT;
  fo.no_console_progress = line.in_place;
  if (fl_context_open(a.master, &fo, &ctx) != FL_OK) goto fail;
  if (load(ctx, &a, a.data, a.labels, 0, &data) != FL_OK) goto fail;
  /* Test data is loaded before training, so that a bad file fails before the long part.
   * libsvm test data gets the training width, so that it fits the model and the summary. */
  if (a.test && load(ctx, &a, a.test, a.test_labels, a.format == FL_ML_LIBSVM ? data->cols : 0, &test) != FL_OK)
    goto fail;
  const fl_ml_data *train = data;
  if (a.standardize) {
    double t0 = common_now_s();
    if (fl_ml_summarize(data, &summary) != FL_OK ||
        fl_ml_standardize(data, &summary, !data->sparse, &scaled) != FL_OK ||
        (test && fl_ml_standardize(test, &summary, !data->sparse, &test_scaled) != FL_OK))
      goto fail;
    train = scaled;
    printf("standardized %u features (%s), %.2f s; the model is in standardized units\n", data->cols,
           data->sparse ? "unit variance; sparse data is not centred" : "zero mean, unit variance", common_now_s() - t0);
  }
  if (a.curves) { /* opened before training, so that a bad path fails before the long part */
    if (!(curves = fopen(a.curves, "w"))) {
      fl_set_error(FL_EIO, "cannot write the curves to %s: %s", a.curves, strerror(errno));
      goto fail;
    }
    fputs("epoch,seconds,loss,accuracy,steps,bytes_sent,bytes_received\n", curves);
    line.csv = curves;
  }
  printf("training %s: %s\n", a.logistic ? "logistic regression" : "least squares", solver_name(&a, train));
  fflush(stdout);
  if (strstr(solver_name(&a, train), "normal")) line.max_iterations = 1; /* one solve */
  fl_status trained = (a.logistic ? fl_ml_logreg : fl_ml_linreg)(train, &a.train, &model);
  end_iteration_line(&line);
  if (trained != FL_OK) goto fail;

  printf("rows         %llu\n", (unsigned long long)train->rows);
  printf("features     %u\n", model->cols);
  if (model->kind == FL_ML_LINEAR) printf("classes      - (regression)\n");
  else printf("classes      %u%s\n", model->classes, model->classes == 2 ? " (binary)" : " (multinomial)");
  printf("solver       %s\n", solver_name(&a, train));
  if (a.train.solver == FL_ML_SOLVER_PS) { /* a fixed number of epochs, no convergence test */
    printf("epochs       %u\n", model->num_history ? model->history[model->num_history - 1].iteration : 0);
  } else {
    printf("iterations   %u\n", model->num_history);
    printf("converged    %s\n", model->converged ? "yes" : "no");
  }
  printf("train time   %.2f s\n", model->train_seconds);
  if (fl_ml_evaluate(model, train, &metrics) != FL_OK) goto fail;
  print_metrics("train", model, &metrics);
  if (test) {
    if (fl_ml_evaluate(model, test_scaled ? test_scaled : test, &metrics) != FL_OK) goto fail;
    print_metrics("test", model, &metrics);
  }
  if (curves) {
    bool ok = fclose(curves) == 0;
    curves = NULL;
    if (!ok) {
      fl_set_error(FL_EIO, "cannot write the curves to %s: %s", a.curves, strerror(errno));
      goto fail;
    }
    printf("curves       written to %s\n", a.curves);
  }
  if (a.out) {
    if (fl_ml_model_save(model, a.out) != FL_OK) goto fail;
    printf("model        written to %s%s\n", a.out, a.standardize ? " (standardized units)" : "");
  }
  fflush(stdout);
  rc = 0;
fail:
  if (rc) ml_failure();
  if (curves) fclose(curves);
  fl_ml_model_free(model);
  fl_ml_data_free(test_scaled);
  fl_ml_data_free(test);
  fl_ml_data_free(scaled);
  fl_ml_summary_free(&summary);
  fl_ml_data_free(data);
  fl_context_close(ctx);
  return rc;
}
