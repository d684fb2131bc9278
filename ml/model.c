/*
 * model.c: trained models: prediction, evaluation over a dataset (one pass), and the model
 * file (text, every number with 17 significant digits so that a model reads back exactly;
 * the format is in docs/ml.md).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ml/ml.h"

#define AUC_BINS 4096

static const char *const kind_names[] = {"linear", "logistic-binary", "logistic-multinomial"};

fl_ml_model *ml_model_new(fl_ml_model_kind kind, uint32_t cols, uint32_t classes, bool intercept) {
  fl_ml_model *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->kind = kind;
  m->cols = cols;
  m->classes = kind == FL_ML_LINEAR ? 1 : classes;
  m->outputs = kind == FL_ML_LOGISTIC_MULTINOMIAL ? classes : 1;
  m->intercept = intercept;
  m->coef = calloc((size_t)m->outputs * (cols + 1), sizeof *m->coef);
  if (!m->coef) {
    free(m);
    return NULL;
  }
  m->intercepts = m->coef + (size_t)m->outputs * cols;
  return m;
}

void fl_ml_model_free(fl_ml_model *m) {
  if (!m) return;
  free(m->coef); /* intercepts share the allocation */
  free(m->history);
  free(m);
}

/* Margins of one dense row: outputs values. */
static void margins(const fl_ml_model *m, const double *x, double *z) {
  for (uint32_t k = 0; k < m->outputs; k++) {
    double s = m->intercepts[k];
    const double *w = m->coef + (size_t)k * m->cols;
    for (uint32_t j = 0; j < m->cols; j++) s += w[j] * x[j];
    z[k] = s;
  }
}

/* From margins to the prediction and, for logistic models, class probabilities. */
static double from_margins(const fl_ml_model *m, double *z, double *probs) {
  if (m->kind == FL_ML_LINEAR) return z[0];
  if (m->kind == FL_ML_LOGISTIC_BINARY) {
    double p = 1.0 / (1.0 + exp(-z[0]));
    if (probs) {
      probs[0] = 1 - p;
      probs[1] = p;
    }
    return p >= 0.5 ? 1.0 : 0.0;
  }
  uint32_t best = 0;
  double top = z[0], sum = 0;
  for (uint32_t k = 1; k < m->outputs; k++)
    if (z[k] > top) top = z[best = k];
  for (uint32_t k = 0; k < m->outputs; k++) sum += exp(z[k] - top);
  if (probs)
    for (uint32_t k = 0; k < m->outputs; k++) probs[k] = exp(z[k] - top) / sum;
  return best;
}

double fl_ml_predict(const fl_ml_model *m, const double *x, double *probs) {
  double stack[64], *z = m->outputs <= 64 ? stack : malloc(m->outputs * sizeof *z);
  if (!z) return NAN;
  margins(m, x, z);
  double r = from_margins(m, z, probs);
  if (z != stack) free(z);
  return r;
}

/* ---- evaluation ------------------------------------------------------------------------ */

typedef struct metrics_arg {
  uint32_t kind, cols, outputs, intercept;
  uint64_t params_id; /* broadcast: coef then intercepts */
} metrics_arg;

/* acc: [rows, W, sse, label mean, label M2 (weighted squared deviations from that mean),
 *       correct, logloss, pos[AUC_BINS], neg[AUC_BINS]]. The labels' spread is kept as a
 * mean and M2, updated per row (West) and merged by Chan et al.'s formula, rather than as
 * sums of y and y^2, whose difference left labels near 1e8 an R^2 of 0.960 for 0.926. */
#define M_HEAD 7
static size_t metrics_len(void) { return M_HEAD + 2 * AUC_BINS; }

/* A task's copy of the model that `a` names (its coefficients broadcast), in *buf with
 * `scratch` more doubles after them for the task's own use; the caller frees *buf. */
static fl_status task_model(const metrics_arg *a, size_t scratch, fl_ml_model *m, double **buf) {
  fl_bytes pv;
  fl_status s = fl_broadcast_value(a->params_id, &pv);
  if (s != FL_OK) return s;
  size_t n = (size_t)a->outputs * (a->cols + 1);
  if (pv.len != n * 8) return fl_set_error(FL_EINTERNAL, "model of %zu bytes", pv.len);
  if (!(*buf = malloc((n + scratch) * sizeof **buf))) return fl_set_error(FL_ENOMEM, "out of memory");
  memcpy(*buf, pv.data, n * 8);
  *m = (fl_ml_model){.kind = a->kind, .cols = a->cols, .outputs = a->outputs, .intercept = a->intercept,
                     .coef = *buf, .intercepts = *buf + (size_t)a->outputs * a->cols};
  return FL_OK;
}

FL_ML_KERNEL fl_status ml_metrics_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  metrics_arg a;
  memcpy(&a, arg, sizeof a);
  /* probs: one per class, which for a binary model (one output) is two */
  size_t classes = a.kind == FL_ML_LOGISTIC_BINARY ? 2 : a.outputs;
  fl_ml_model m;
  double *buf;
  fl_status s = task_model(&a, a.outputs + classes + a.cols + metrics_len(), &m, &buf);
  if (s != FL_OK) return s;
  size_t n = (size_t)a.outputs * (a.cols + 1);
  double *z = buf + n, *probs = z + a.outputs, *x = probs + classes, *acc = x + a.cols;
  memset(acc, 0, metrics_len() * sizeof *acc);
  fl_buf scratch = FL_BUF_INIT;
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > a.cols || (!b.sparse && b.cols != a.cols)) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the model %u", b.cols, a.cols);
      break;
    }
    for (uint32_t i = 0; i < b.rows; i++) {
      const double *row = b.x + (size_t)i * b.cols;
      if (b.sparse) {
        memset(x, 0, a.cols * sizeof *x);
        for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) x[b.col[k]] = b.x[k];
        row = x;
      }
      margins(&m, row, z);
      double pred = from_margins(&m, z, probs), y = b.labels[i], w = b.weights ? b.weights[i] : 1.0;
      double w_before = acc[1];
      acc[0] += 1;
      acc[1] += w;
      if (a.kind == FL_ML_LINEAR) {
        acc[2] += w * (pred - y) * (pred - y);
        if (acc[1] > 0) { /* M2 += W_before * delta * r: exactly 0 at the first row, whose
                             delta is the label itself */
          double delta = y - acc[3], r = delta * w / acc[1];
          acc[3] += r;
          acc[4] += w_before * delta * r;
        }
        continue;
      }
      if (a.kind == FL_ML_LOGISTIC_BINARY && y == -1) y = 0.0; /* -1/+1 labels too */
      if (!(y >= 0 && y < (a.kind == FL_ML_LOGISTIC_BINARY ? 2 : a.outputs) && y == floor(y))) {
        s = fl_set_error(FL_EINVAL, "label %g is not a class of this model", b.labels[i]);
        break;
      }
      uint32_t cls = (uint32_t)y;
      acc[5] += w * (pred == y);
      acc[6] -= w * log(fmax(probs[cls], 1e-300));
      if (a.kind == FL_ML_LOGISTIC_BINARY) {
        uint32_t bin = (uint32_t)(probs[1] * AUC_BINS);
        if (bin >= AUC_BINS) bin = AUC_BINS - 1;
        acc[M_HEAD + (cls ? 0 : AUC_BINS) + bin] += w;
      }
    }
  }
  if (s == FL_OK) s = fl_emit(out, acc, metrics_len() * sizeof *acc);
  fl_buf_free(&scratch);
  free(buf);
  return s;
}

/* Adds two partitions' metrics; the label mean and M2 by Chan et al.'s merge. */
FL_ML_KERNEL fl_status ml_metrics_merge(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  size_t n = metrics_len();
  if (a.len != n * 8 || b.len != n * 8) return fl_set_error(FL_EINTERNAL, "metrics of %zu and %zu bytes", a.len, b.len);
  fl_status s = fl_buf_reserve(out, n * 8);
  if (s != FL_OK) return s;
  double x[M_HEAD], y[M_HEAD], *acc = (double *)out->data;
  memcpy(x, a.data, sizeof x);
  memcpy(y, b.data, sizeof y);
  for (size_t i = M_HEAD; i < n; i++) { /* the histograms: aligned or not, read by memcpy */
    double u, v;
    memcpy(&u, a.data + 8 * i, 8);
    memcpy(&v, b.data + 8 * i, 8);
    acc[i] = u + v;
  }
  double W = x[1] + y[1], delta = y[3] - x[3];
  for (int i = 0; i < M_HEAD; i++) acc[i] = x[i] + y[i];
  acc[3] = W > 0 ? x[3] + delta * y[1] / W : 0.0;
  acc[4] = x[4] + y[4] + (W > 0 ? delta * delta * x[1] * y[1] / W : 0.0);
  out->len = n * 8;
  return FL_OK;
}

fl_status fl_ml_evaluate(const fl_ml_model *m, const fl_ml_data *data, fl_ml_metrics *out) {
  if (!m || !data || !data->blocks || !out) return fl_set_error(FL_EINVAL, "fl_ml_evaluate: model, data and out are required");
  if (data->cols > m->cols) return fl_set_error(FL_EINVAL, "the data has %u features, the model %u", data->cols, m->cols);
  size_t n = (size_t)m->outputs * (m->cols + 1), len = metrics_len();
  double *acc = malloc(len * sizeof *acc);
  if (!acc) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_broadcast *bc = NULL;
  fl_dataset *parts = NULL;
  /* coef and intercepts are one allocation in that order (ml_model_new) */
  fl_status s = fl_broadcast_create(fl_dataset_context(data->blocks), m->coef, n * 8, &bc);
  if (s == FL_OK) {
    metrics_arg a = {.kind = m->kind, .cols = m->cols, .outputs = m->outputs, .intercept = m->intercept,
                     .params_id = fl_broadcast_id(bc)};
    s = fl_map_partitions(data->blocks, ml_metrics_partition, &a, sizeof a, &parts);
  }
  if (s == FL_OK) {
    fl_buf sum = FL_BUF_INIT;
    memset(acc, 0, len * sizeof *acc);
    s = fl_tree_aggregate(parts, fl_bytes_of(acc, len * 8), ml_metrics_merge, ml_metrics_merge, NULL, 0,
                          ml_tree_depth(parts, 0), &sum);
    if (s == FL_OK && sum.len != len * 8) s = fl_set_error(FL_EINTERNAL, "metrics of %zu bytes", sum.len);
    if (s == FL_OK) memcpy(acc, sum.data, len * 8);
    fl_buf_free(&sum);
  }
  fl_dataset_free(parts);
  fl_broadcast_destroy(bc);
  if (s == FL_OK && acc[1] <= 0) s = fl_set_error(FL_EEMPTY, "no rows (or only rows of weight 0) to evaluate");
  if (s == FL_OK) {
    double W = acc[1];
    *out = (fl_ml_metrics){.rows = (uint64_t)acc[0], .weight_sum = W, .rmse = NAN, .r2 = NAN, .accuracy = NAN,
                           .log_loss = NAN, .auc = NAN};
    if (m->kind == FL_ML_LINEAR) {
      double sst = acc[4];
      out->rmse = sqrt(acc[2] / W);
      out->r2 = sst > 0 ? 1 - acc[2] / sst : NAN;
    } else {
      out->accuracy = acc[5] / W;
      out->log_loss = acc[6] / W;
    }
    if (m->kind == FL_ML_LOGISTIC_BINARY) { /* P(score of a positive > score of a negative) */
      const double *pos = acc + M_HEAD, *neg = pos + AUC_BINS;
      double P = 0, N = 0, below = 0, area = 0;
      for (int b = 0; b < AUC_BINS; b++) P += pos[b], N += neg[b];
      for (int b = 0; b < AUC_BINS; b++) {
        area += pos[b] * (below + 0.5 * neg[b]);
        below += neg[b];
      }
      out->auc = P > 0 && N > 0 ? area / (P * N) : NAN;
    }
  }
  free(acc);
  return s;
}

/* ---- prediction over a dataset ---------------------------------------------------------- */

/* One record per block: its rows' predictions, 8-byte doubles in row order. */
FL_ML_KERNEL fl_status ml_predict_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  metrics_arg a;
  memcpy(&a, arg, sizeof a);
  fl_ml_model m;
  double *buf;
  fl_status s = task_model(&a, a.outputs + a.cols, &m, &buf);
  if (s != FL_OK) return s;
  size_t n = (size_t)a.outputs * (a.cols + 1);
  double *z = buf + n, *x = z + a.outputs;
  fl_buf scratch = FL_BUF_INIT, preds = FL_BUF_INIT;
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > a.cols || (!b.sparse && b.cols != a.cols)) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the model %u", b.cols, a.cols);
      break;
    }
    preds.len = 0;
    if ((s = fl_buf_reserve(&preds, (size_t)b.rows * 8 + 1)) != FL_OK) break;
    for (uint32_t i = 0; i < b.rows; i++) {
      const double *row = b.x + (size_t)i * b.cols;
      if (b.sparse) {
        memset(x, 0, a.cols * sizeof *x);
        for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) x[b.col[k]] = b.x[k];
        row = x;
      }
      margins(&m, row, z);
      double pred = from_margins(&m, z, NULL);
      memcpy(preds.data + (size_t)i * 8, &pred, 8);
    }
    preds.len = (size_t)b.rows * 8;
    s = fl_emit(out, preds.data, preds.len);
  }
  fl_buf_free(&preds);
  fl_buf_free(&scratch);
  free(buf);
  return s;
}

fl_status fl_ml_predict_data(const fl_ml_model *m, const fl_ml_data *data, fl_buf *out) {
  if (!m || !m->coef || !data || !data->blocks || !out)
    return fl_set_error(FL_EINVAL, "fl_ml_predict_data: model, data and out are required");
  if (data->cols > m->cols) return fl_set_error(FL_EINVAL, "the data has %u features, the model %u", data->cols, m->cols);
  size_t n = (size_t)m->outputs * (m->cols + 1);
  fl_broadcast *bc = NULL;
  fl_dataset *preds = NULL;
  fl_records *recs = NULL;
  out->len = 0;
  /* coef and intercepts are one allocation in that order (ml_model_new, fl_ml_model_load) */
  fl_status s = fl_broadcast_create(fl_dataset_context(data->blocks), m->coef, n * 8, &bc);
  if (s == FL_OK) {
    metrics_arg a = {.kind = m->kind, .cols = m->cols, .outputs = m->outputs, .intercept = m->intercept,
                     .params_id = fl_broadcast_id(bc)};
    s = fl_map_partitions(data->blocks, ml_predict_partition, &a, sizeof a, &preds);
  }
  if (s == FL_OK) s = fl_collect(preds, &recs);
  for (size_t i = 0; s == FL_OK && i < fl_records_count(recs); i++) {
    fl_bytes r = fl_records_get(recs, i);
    s = fl_buf_append(out, r.data, r.len);
  }
  fl_records_free(recs);
  fl_dataset_free(preds);
  fl_broadcast_destroy(bc);
  if (s != FL_OK) out->len = 0;
  return s;
}

/* ---- model files ----------------------------------------------------------------------- */

/* Whether a model of this kind (known to be in range) can have this shape; the same rule
 * for writing and reading, so that every file written reads back. */
static bool shape_ok(int kind, uint32_t cols, uint32_t classes, uint32_t outputs, uint32_t intercept) {
  uint32_t want_classes = kind == FL_ML_LINEAR ? 1 : kind == FL_ML_LOGISTIC_BINARY ? 2 : classes;
  uint32_t want_outputs = kind == FL_ML_LOGISTIC_MULTINOMIAL ? classes : 1;
  return cols > 0 && cols <= (1u << 26) && classes == want_classes && outputs == want_outputs && intercept <= 1 &&
         !(kind == FL_ML_LOGISTIC_MULTINOMIAL && (classes < 2 || classes > 65536)) &&
         (uint64_t)outputs * cols <= (1ull << 28);
}

fl_status fl_ml_model_save(const fl_ml_model *m, const char *path) {
  if (!m || !path || !m->coef || !m->intercepts)
    return fl_set_error(FL_EINVAL, "fl_ml_model_save: model (with coefficients) and path are required");
  /* Refuse what fl_ml_model_load would refuse, before a file replaces a good one. */
  if ((unsigned)m->kind > FL_ML_LOGISTIC_MULTINOMIAL)
    return fl_set_error(FL_EINVAL, "cannot save %s: unknown model kind %d", path, (int)m->kind);
  if (!shape_ok(m->kind, m->cols, m->classes, m->outputs, m->intercept))
    return fl_set_error(FL_EINVAL, "cannot save %s: inconsistent shape: kind %s, cols %u, classes %u, outputs %u", path,
                        kind_names[m->kind], m->cols, m->classes, m->outputs);
  for (size_t i = 0; i < (size_t)m->outputs * m->cols; i++)
    if (!isfinite(m->coef[i]))
      return fl_set_error(FL_EINVAL, "cannot save %s: coefficient %zu is not finite (%g)", path, i, m->coef[i]);
  for (uint32_t k = 0; k < m->outputs; k++)
    if (!isfinite(m->intercepts[k]))
      return fl_set_error(FL_EINVAL, "cannot save %s: intercept %u is not finite (%g)", path, k, m->intercepts[k]);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return fl_set_error(FL_EINVAL, "path too long: %s", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return fl_set_error(FL_EIO, "cannot write %s: %s", tmp, strerror(errno));
  fprintf(f, "flint-model 1\nkind %s\ncols %u\nclasses %u\noutputs %u\nintercept %d\n", kind_names[m->kind], m->cols,
          m->classes, m->outputs, m->intercept ? 1 : 0);
  fprintf(f, "intercepts");
  for (uint32_t k = 0; k < m->outputs; k++) fprintf(f, " %.17g", m->intercepts[k]);
  fprintf(f, "\n");
  for (uint32_t k = 0; k < m->outputs; k++) {
    fprintf(f, "coef");
    for (uint32_t j = 0; j < m->cols; j++) fprintf(f, " %.17g", m->coef[(size_t)k * m->cols + j]);
    fprintf(f, "\n");
  }
  fprintf(f, "end\n");
  bool ok = !ferror(f) && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return fl_set_error(FL_EIO, "cannot write %s: %s", path, strerror(e));
  }
  return FL_OK;
}

/* The reader: one line at a time, with its number for messages. */
typedef struct reader {
  FILE *f;
  const char *path;
  char *line;
  size_t cap;
  unsigned number;
} reader;

static fl_status next_line(reader *r, const char *want) {
  r->number++;
  if (getline(&r->line, &r->cap, r->f) < 0)
    return fl_set_error(FL_EFORMAT, "%s:%u: the file ends where '%s' should be", r->path, r->number, want);
  r->line[strcspn(r->line, "\n")] = 0;
  return FL_OK;
}

static fl_status read_u32(reader *r, const char *key, uint32_t *out) {
  fl_status s = next_line(r, key);
  if (s != FL_OK) return s;
  size_t k = strlen(key);
  char *end;
  errno = 0;
  unsigned long v = strncmp(r->line, key, k) == 0 && r->line[k] == ' ' ? strtoul(r->line + k + 1, &end, 10) : 0;
  if (strncmp(r->line, key, k) != 0 || r->line[k] != ' ' || errno || *end || v > UINT32_MAX || end == r->line + k + 1)
    return fl_set_error(FL_EFORMAT, "%s:%u: expected '%s N', found '%.60s'", r->path, r->number, key, r->line);
  *out = (uint32_t)v;
  return FL_OK;
}

static fl_status read_values(reader *r, const char *key, double *out, size_t n) {
  fl_status s = next_line(r, key);
  if (s != FL_OK) return s;
  size_t k = strlen(key);
  if (strncmp(r->line, key, k) != 0 || (r->line[k] != ' ' && r->line[k] != 0))
    return fl_set_error(FL_EFORMAT, "%s:%u: expected '%s' values, found '%.60s'", r->path, r->number, key, r->line);
  char *p = r->line + k;
  for (size_t i = 0; i < n; i++) {
    char *end;
    errno = 0;
    out[i] = strtod(p, &end);
    /* ERANGE also flags subnormal results, which are exact and which the writer writes:
     * only an overflow (an infinity) is no number here. */
    if (end == p || (errno && errno != ERANGE) || !isfinite(out[i]))
      return fl_set_error(FL_EFORMAT, "%s:%u: value %zu of %zu is missing or not a finite number", r->path, r->number,
                          i + 1, n);
    p = end;
  }
  while (*p == ' ') p++;
  if (*p) return fl_set_error(FL_EFORMAT, "%s:%u: more than %zu values", r->path, r->number, n);
  return FL_OK;
}

fl_status fl_ml_model_load(const char *path, fl_ml_model **out) {
  if (!path || !out) return fl_set_error(FL_EINVAL, "fl_ml_model_load: path and out are required");
  reader r = {.f = fopen(path, "r"), .path = path};
  if (!r.f) return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot read %s: %s", path, strerror(errno));
  fl_ml_model *m = NULL;
  uint32_t cols = 0, classes = 0, outputs = 0, intercept = 0;
  int kind = -1;
  fl_status s = next_line(&r, "flint-model 1");
  if (s == FL_OK && strcmp(r.line, "flint-model 1") != 0)
    s = fl_set_error(FL_EFORMAT, "%s:1: not a flint model file (version 1)", path);
  if (s == FL_OK && (s = next_line(&r, "kind")) == FL_OK) {
    for (int k = 0; k < 3; k++)
      if (strncmp(r.line, "kind ", 5) == 0 && strcmp(r.line + 5, kind_names[k]) == 0) kind = k;
    if (kind < 0) s = fl_set_error(FL_EFORMAT, "%s:%u: unknown model kind '%.60s'", path, r.number, r.line);
  }
  if (s == FL_OK) s = read_u32(&r, "cols", &cols);
  if (s == FL_OK) s = read_u32(&r, "classes", &classes);
  if (s == FL_OK) s = read_u32(&r, "outputs", &outputs);
  if (s == FL_OK) s = read_u32(&r, "intercept", &intercept);
  if (s == FL_OK) {
    if (!shape_ok(kind, cols, classes, outputs, intercept))
      s = fl_set_error(FL_EFORMAT, "%s: inconsistent shape: kind %s, cols %u, classes %u, outputs %u, intercept %u",
                       path, kind_names[kind], cols, classes, outputs, intercept);
  }
  if (s == FL_OK && !(m = ml_model_new((fl_ml_model_kind)kind, cols, classes, intercept)))
    s = fl_set_error(FL_ENOMEM, "out of memory");
  if (s == FL_OK) s = read_values(&r, "intercepts", m->intercepts, outputs);
  for (uint32_t k = 0; s == FL_OK && k < outputs; k++) s = read_values(&r, "coef", m->coef + (size_t)k * cols, cols);
  if (s == FL_OK && (s = next_line(&r, "end")) == FL_OK && strcmp(r.line, "end") != 0)
    s = fl_set_error(FL_EFORMAT, "%s:%u: expected 'end'", path, r.number);
  if (s == FL_OK && getline(&r.line, &r.cap, r.f) >= 0)
    s = fl_set_error(FL_EFORMAT, "%s:%u: text after 'end'", path, r.number + 1);
  free(r.line);
  fclose(r.f);
  if (s != FL_OK) {
    fl_ml_model_free(m);
    return s;
  }
  *out = m;
  return FL_OK;
}
