/*
 * ps_logreg.c: binary logistic regression by asynchronous minibatch SGD through parameter
 * servers (flint/ps.h), the sparse logistic regression of Li et al. (OSDI'14) and
 * DistBelief's Downpour.
 *
 * Design. The weights live in a sparse table (key j: feature j, key cols: the intercept;
 * width 1; the servers apply Adagrad, SGD or Adam to pushed gradients). Training is one job:
 * one task per partition of the cached blocks (coalesced to the task slots, since every
 * worker must run at once), each a worker that runs every epoch over its rows. Each step a
 * worker pulls the keys of its next fetch_every minibatches (every fetch_every steps; the
 * pull waits on the servers as the staleness bound says), computes the mean logistic
 * gradient of its minibatch, pushes the gradients summed over push_every steps, and ends its
 * clock. Every worker takes the same number of steps an epoch (its rows split into that many
 * minibatches), so BSP's clocks line up with epochs.
 *
 * The calling thread watches while the job runs: workers add their steps and bytes to a
 * second, dense table (update add), and each time the steps reach another epoch's worth the
 * caller pulls the weights of the evaluation rows' keys (rows it collected before training:
 * the whole data up to eval_rows) and measures their loss and accuracy. It reads the servers
 * as a worker of its own (the last one, retired at once, so that it holds nobody back), and
 * at the end it pulls every key into the model.
 *
 * A retried task opens its worker again at the clock the servers have for it and goes on at
 * that step; gradients it had summed but not pushed are lost, as asynchronous SGD allows.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "flint/ps.h"
#include "ml/ml.h"

#define DEFAULT_EPOCHS 10
#define DEFAULT_BATCH 100
#define DEFAULT_LR 0.1
#define DEFAULT_EVAL_ROWS 20000
#define MAX_HANDLE 4096
#define PULL_CHUNK 65536     /* keys a final-model pull asks for at once */
#define WATCH_INTERVAL_NS 5000000L /* how often the caller reads the progress counters */

fl_status fl_ml_sync_parse(const char *text, fl_ml_sync *sync, uint32_t *staleness) {
  if (!text || !sync || !staleness) return fl_set_error(FL_EINVAL, "fl_ml_sync_parse: NULL argument");
  if (strcmp(text, "bsp") == 0) {
    *sync = FL_ML_SYNC_BSP;
    *staleness = 0;
    return FL_OK;
  }
  if (strcmp(text, "asp") == 0) {
    *sync = FL_ML_SYNC_ASP;
    *staleness = 0;
    return FL_OK;
  }
  if (strncmp(text, "ssp:", 4) == 0) {
    const char *p = text + 4;
    uint64_t v = 0;
    bool digits = *p != 0;
    for (; *p; p++) {
      if (*p < '0' || *p > '9' || v > 1000000) {
        digits = false;
        break;
      }
      v = v * 10 + (uint64_t)(*p - '0');
    }
    if (digits && v <= 1000000) {
      *sync = FL_ML_SYNC_SSP;
      *staleness = (uint32_t)v;
      return FL_OK;
    }
    return fl_set_error(FL_EINVAL, "sync '%s': the staleness after ssp: must be a whole number from 0 to 1000000",
                        text);
  }
  return fl_set_error(FL_EINVAL, "unknown sync '%s' (bsp, asp or ssp:S)", text);
}

fl_status fl_ml_ps_update_parse(const char *name, fl_ml_ps_update *out) {
  static const char *const names[] = {"adagrad", "sgd", "adam"};
  for (int i = 0; name && out && i < 3; i++)
    if (strcmp(name, names[i]) == 0) {
      *out = (fl_ml_ps_update)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown update '%s' (adagrad, sgd or adam)", name ? name : "(null)");
}

/* ---- rows in CSR, as a worker and the evaluation keep them ------------------------------ */

/* Rows with their columns turned into indices of `keys` (sorted, distinct features), so that
 * a worker keeps its weights in an array. */
typedef struct csr {
  uint64_t rows, nnz, cap_rows, cap_nnz;
  double *labels, *weights, *x;
  uint64_t *row_ptr;
  uint32_t *col;
  uint32_t *keys; /* after csr_index: the distinct columns, ascending */
  uint32_t nkeys;
} csr;

static void csr_free(csr *c) {
  free(c->labels);
  free(c->weights);
  free(c->x);
  free(c->row_ptr);
  free(c->col);
  free(c->keys);
  memset(c, 0, sizeof *c);
}

static bool grow(void **p, uint64_t *cap, uint64_t need, size_t size) {
  if (need <= *cap) return true;
  uint64_t n = *cap ? *cap : 1024;
  while (n < need) n *= 2;
  void *q = realloc(*p, n * size);
  if (!q) return false;
  *p = q;
  *cap = n;
  return true;
}

/* Appends up to `limit` rows of block b (dense rows keep their zeros out). */
static fl_status csr_append(csr *c, const fl_ml_block *b, uint64_t limit) {
  uint32_t rows = b->rows < limit ? b->rows : (uint32_t)limit;
  uint64_t add = b->sparse ? b->row_ptr[rows] - b->row_ptr[0] : (uint64_t)rows * b->cols;
  uint64_t cr = c->cap_rows, cn = c->cap_nnz;
  bool ok = grow((void **)&c->labels, &cr, c->rows + rows, sizeof *c->labels);
  cr = c->cap_rows;
  ok = ok && grow((void **)&c->weights, &cr, c->rows + rows, sizeof *c->weights);
  cr = c->cap_rows;
  ok = ok && grow((void **)&c->row_ptr, &cr, c->rows + rows + 1, sizeof *c->row_ptr);
  c->cap_rows = cr;
  ok = ok && grow((void **)&c->x, &cn, c->nnz + add, sizeof *c->x);
  cn = c->cap_nnz;
  ok = ok && grow((void **)&c->col, &cn, c->nnz + add, sizeof *c->col);
  c->cap_nnz = cn;
  if (!ok) return fl_set_error(FL_ENOMEM, "ps solver: out of memory for a partition's rows");
  if (c->rows == 0) c->row_ptr[0] = 0;
  for (uint32_t i = 0; i < rows; i++) {
    c->labels[c->rows] = b->labels[i];
    c->weights[c->rows] = b->weights ? b->weights[i] : 1.0;
    if (b->sparse) {
      for (uint64_t k = b->row_ptr[i]; k < b->row_ptr[i + 1]; k++) {
        c->x[c->nnz] = b->x[k];
        c->col[c->nnz++] = b->col[k];
      }
    } else {
      for (uint32_t j = 0; j < b->cols; j++)
        if (b->x[(size_t)i * b->cols + j] != 0) {
          c->x[c->nnz] = b->x[(size_t)i * b->cols + j];
          c->col[c->nnz++] = j;
        }
    }
    c->row_ptr[++c->rows] = c->nnz;
  }
  return FL_OK;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Finds the distinct columns and rewrites every column as its index among them. */
static fl_status csr_index(csr *c) {
  uint32_t *k = malloc((c->nnz ? c->nnz : 1) * sizeof *k);
  if (!k) return fl_set_error(FL_ENOMEM, "ps solver: out of memory for the keys");
  memcpy(k, c->col, c->nnz * sizeof *k);
  qsort(k, c->nnz, sizeof *k, cmp_u32);
  uint64_t u = 0;
  for (uint64_t i = 0; i < c->nnz; i++)
    if (u == 0 || k[u - 1] != k[i]) k[u++] = k[i];
  c->keys = k;
  c->nkeys = (uint32_t)u;
  for (uint64_t i = 0; i < c->nnz; i++) {
    uint32_t lo = 0, hi = c->nkeys; /* the column is there: binary search */
    while (lo < hi) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (k[mid] < c->col[i]) lo = mid + 1;
      else hi = mid;
    }
    c->col[i] = lo;
  }
  return FL_OK;
}

/* Reads a partition's blocks into c (at most limit rows), checking their width. */
static fl_status csr_read(fl_iter *in, uint32_t cols, uint64_t limit, csr *c) {
  fl_buf scratch = FL_BUF_INIT;
  fl_bytes rec;
  fl_status s = FL_OK;
  while (s == FL_OK && c->rows < limit && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > cols) s = fl_set_error(FL_EINVAL, "a row block has %u features, the model %u", b.cols, cols);
    else s = csr_append(c, &b, limit - c->rows);
  }
  fl_buf_free(&scratch);
  return s;
}

/* The label as 0/1 (-1 reads as 0), or -1 for a label logistic regression does not take. */
static inline double label01(double y) { return y == 1.0 ? 1.0 : (y == 0.0 || y == -1.0) ? 0.0 : -1.0; }

/* log(1 + e^m) - y m and its derivative in m, without overflow. */
static inline double logloss(double m, double y, double *dm) {
  double e = exp(-fabs(m));
  *dm = (m >= 0 ? 1.0 : e) / (1.0 + e) - y;
  return (m > 0 ? m : 0.0) + log1p(e) - y * m;
}

/* ---- the worker task ------------------------------------------------------------------- */

typedef struct task_arg {
  uint32_t cols, intercept, steps_per_epoch, epochs, staleness, fetch_every, push_every;
  uint32_t fail_worker, fail_step;
  uint32_t weights_len, progress_len; /* the tables' handles, after the struct */
  double l2;
} task_arg;

typedef struct worker_state {
  csr c;
  float *w;              /* nkeys + 1: the intercept last */
  double *g;             /* summed gradients since the last push */
  uint64_t *fetch_mark, *push_mark, *step_mark; /* the step (+ 1) that last listed a key */
  uint32_t *pushed;      /* the keys with a gradient since the last push */
  uint32_t npushed;
  uint64_t *keys;        /* a pull's or push's keys */
  float *vals;
  uint32_t *list;        /* a pull's local indices */
} worker_state;

static void worker_state_free(worker_state *st) {
  csr_free(&st->c);
  free(st->w);
  free(st->g);
  free(st->fetch_mark);
  free(st->push_mark);
  free(st->step_mark);
  free(st->pushed);
  free(st->keys);
  free(st->vals);
  free(st->list);
}

static uint64_t mb_lo(uint64_t rows, uint32_t steps, uint64_t j) { return j * rows / steps; }

/* Pulls the keys of minibatches first .. last - 1 (global step numbers) into st->w. */
static fl_status fetch(fl_ps_worker *w, worker_state *st, const task_arg *a, uint64_t first, uint64_t last) {
  const csr *c = &st->c;
  uint32_t n = 0, bias = c->nkeys;
  for (uint64_t t = first; t < last; t++) {
    uint64_t j = t % a->steps_per_epoch;
    uint64_t r0 = mb_lo(c->rows, a->steps_per_epoch, j), r1 = mb_lo(c->rows, a->steps_per_epoch, j + 1);
    for (uint64_t k = c->row_ptr[r0]; k < c->row_ptr[r1]; k++) {
      uint32_t l = c->col[k];
      if (st->fetch_mark[l] != first + 1) {
        st->fetch_mark[l] = first + 1;
        st->list[n] = l;
        st->keys[n++] = c->keys[l];
      }
    }
  }
  if (a->intercept) {
    st->list[n] = bias;
    st->keys[n++] = a->cols;
  }
  if (n == 0) return FL_OK;
  uint64_t tk;
  fl_status s = fl_ps_pull(w, st->keys, n, st->vals, &tk);
  if (s == FL_OK) s = fl_ps_wait(w, tk, NULL);
  if (s != FL_OK) return s;
  for (uint32_t i = 0; i < n; i++) st->w[st->list[i]] = st->vals[i];
  return FL_OK;
}

/* One minibatch: adds its mean gradient (and the L2 term of its keys) to st->g. */
static fl_status step(worker_state *st, const task_arg *a, uint64_t t) {
  const csr *c = &st->c;
  uint64_t j = t % a->steps_per_epoch;
  uint64_t r0 = mb_lo(c->rows, a->steps_per_epoch, j), r1 = mb_lo(c->rows, a->steps_per_epoch, j + 1);
  double W = 0;
  for (uint64_t r = r0; r < r1; r++) W += c->weights[r];
  if (!(W > 0)) return FL_OK;
  const uint32_t bias = c->nkeys;
  const double b = a->intercept ? st->w[bias] : 0.0;
  for (uint64_t r = r0; r < r1; r++) {
    double y = label01(c->labels[r]), m = b, dm;
    if (y < 0)
      return fl_set_error(FL_EINVAL, "binary logistic regression needs labels 0/1 or -1/+1, not %g", c->labels[r]);
    for (uint64_t k = c->row_ptr[r]; k < c->row_ptr[r + 1]; k++) m += st->w[c->col[k]] * c->x[k];
    logloss(m, y, &dm);
    double d = c->weights[r] * dm / W;
    for (uint64_t k = c->row_ptr[r]; k < c->row_ptr[r + 1]; k++) {
      uint32_t l = c->col[k];
      st->g[l] += d * c->x[k];
      if (st->step_mark[l] != t + 1) {
        st->step_mark[l] = t + 1;
        st->g[l] += a->l2 * st->w[l]; /* the L2 term, once a step for each key the step reads */
        if (st->push_mark[l] == 0) {
          st->push_mark[l] = 1;
          st->pushed[st->npushed++] = l;
        }
      }
    }
    if (a->intercept) {
      st->g[bias] += d;
      if (st->push_mark[bias] == 0) {
        st->push_mark[bias] = 1;
        st->pushed[st->npushed++] = bias;
      }
    }
  }
  return FL_OK;
}

/* Pushes the summed gradients and clears them. */
static fl_status push(fl_ps_worker *w, worker_state *st, const task_arg *a) {
  uint32_t n = st->npushed;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t l = st->pushed[i];
    st->keys[i] = l == st->c.nkeys ? a->cols : st->c.keys[l];
    st->vals[i] = (float)st->g[l];
    st->g[l] = 0;
    st->push_mark[l] = 0;
  }
  st->npushed = 0;
  if (n == 0) return FL_OK;
  uint64_t tk;
  fl_status s = fl_ps_push(w, st->keys, n, st->vals, &tk);
  return s == FL_OK ? fl_ps_wait(w, tk, NULL) : s;
}

/* Adds steps and bytes since the last report to the progress table (KiB as floats: exact
 * enough for curves up to terabytes). */
static fl_status report(fl_ps_worker *pw, fl_ps_worker *w, uint64_t steps, fl_ps_worker_stats *last) {
  fl_ps_worker_stats now = fl_ps_worker_stats_get(w);
  float v[3] = {(float)steps, (float)((double)(now.bytes_sent - last->bytes_sent) / 1024.0),
                (float)((double)(now.bytes_received - last->bytes_received) / 1024.0)};
  *last = now;
  uint64_t key = 0, tk;
  fl_status s = fl_ps_push(pw, &key, 1, v, &tk);
  return s == FL_OK ? fl_ps_wait(pw, tk, NULL) : s;
}

FL_ML_KERNEL fl_status ml_ps_worker_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *varg) {
  task_arg a;
  memcpy(&a, varg, sizeof a);
  const uint8_t *handles = (const uint8_t *)varg + sizeof a;
  worker_state st = {0};
  fl_ps_worker *w = NULL, *pw = NULL;
  fl_status s = csr_read(in, a.cols, UINT64_MAX, &st.c);
  if (s == FL_OK) s = csr_index(&st.c);
  const uint64_t n = (uint64_t)st.c.nkeys + 1;
  if (s == FL_OK) {
    st.w = calloc(n, sizeof *st.w);
    st.g = calloc(n, sizeof *st.g);
    st.fetch_mark = calloc(n, sizeof *st.fetch_mark);
    st.push_mark = calloc(n, sizeof *st.push_mark);
    st.step_mark = calloc(n, sizeof *st.step_mark);
    st.pushed = malloc(n * sizeof *st.pushed);
    st.keys = malloc(n * sizeof *st.keys);
    st.vals = malloc(n * sizeof *st.vals);
    st.list = malloc(n * sizeof *st.list);
    if (!st.w || !st.g || !st.fetch_mark || !st.push_mark || !st.step_mark || !st.pushed || !st.keys || !st.vals ||
        !st.list)
      s = fl_set_error(FL_ENOMEM, "ps solver: out of memory for a worker's %llu keys", (unsigned long long)n);
  }
  if (s == FL_OK) s = fl_ps_worker_open(fl_bytes_of(handles, a.weights_len), partition, &w);
  if (s == FL_OK) s = fl_ps_worker_open(fl_bytes_of(handles + a.weights_len, a.progress_len), partition, &pw);
  if (s == FL_OK) {
    fl_ps_worker_set_staleness(w, a.staleness);
    fl_ps_worker_set_staleness(pw, FL_PS_ASYNC);
  }
  const uint64_t total = (uint64_t)a.epochs * a.steps_per_epoch;
  /* A retried task goes on at the step its lost attempt reached. */
  const uint64_t start = s == FL_OK ? fl_ps_worker_stats_get(w).clock : 0;
  fl_ps_worker_stats last = s == FL_OK ? fl_ps_worker_stats_get(w) : (fl_ps_worker_stats){0};
  uint64_t unreported = 0;
  for (uint64_t t = start; s == FL_OK && t < total; t++) {
    if (a.fail_worker == partition + 1 && t == a.fail_step && start < a.fail_step) {
      s = fl_set_error(FL_EIO, "ps solver: worker %u fails at step %llu (fail_worker, a test's fault)", partition,
                       (unsigned long long)t);
      break;
    }
    if ((t - start) % a.fetch_every == 0) {
      uint64_t last_step = t + a.fetch_every < total ? t + a.fetch_every : total;
      if ((s = fetch(w, &st, &a, t, last_step)) != FL_OK) break;
    }
    if ((s = step(&st, &a, t)) != FL_OK) break;
    unreported++;
    if ((t - start + 1) % a.push_every == 0 || t + 1 == total) {
      if ((s = push(w, &st, &a)) != FL_OK) break;
      if ((s = report(pw, w, unreported, &last)) != FL_OK) break;
      unreported = 0;
    }
    uint64_t tk;
    s = fl_ps_clock(w, &tk);
    if (s == FL_OK) s = fl_ps_wait(w, tk, NULL);
  }
  (void)out; /* what a worker did is on the servers: it emits nothing */
  fl_ps_worker_close(pw);
  fl_ps_worker_close(w);
  worker_state_free(&st);
  return s;
}

/* ---- the evaluation rows --------------------------------------------------------------- */

/* Emits the first `limit` rows of the partition as one record: u64 rows, u64 nnz, then
 * labels, weights (f64 each), row_ptr (u64, rows + 1), x (f64) and col (u32). */
FL_ML_KERNEL fl_status ml_ps_sample_partition(uint32_t partition, fl_iter *in, fl_emitter *out, const void *varg) {
  (void)partition;
  uint64_t hdr[2];
  memcpy(hdr, varg, sizeof hdr); /* cols, limit */
  csr c = {0};
  fl_status s = csr_read(in, (uint32_t)hdr[0], hdr[1], &c);
  fl_buf rec = FL_BUF_INIT;
  if (s == FL_OK) {
    uint64_t head[2] = {c.rows, c.nnz};
    size_t len = sizeof head + 16 * c.rows + 8 * (c.rows + 1) + 12 * c.nnz;
    s = fl_buf_reserve(&rec, len);
    if (s == FL_OK) {
      uint8_t *p = rec.data;
#define PUT(src, bytes) (memcpy(p, (src), (bytes)), p += (bytes))
      uint64_t zero = 0;
      PUT(head, sizeof head);
      if (c.rows) {
        PUT(c.labels, 8 * c.rows);
        PUT(c.weights, 8 * c.rows);
        PUT(c.row_ptr, 8 * (c.rows + 1));
      } else {
        PUT(&zero, 8);
      }
      if (c.nnz) {
        PUT(c.x, 8 * c.nnz);
        PUT(c.col, 4 * c.nnz);
      }
#undef PUT
      rec.len = (size_t)(p - rec.data);
      s = fl_emit(out, rec.data, rec.len);
    }
  }
  fl_buf_free(&rec);
  csr_free(&c);
  return s;
}

/* Collects the evaluation rows (up to `limit` from each partition) into c, indexed. */
static fl_status collect_eval_rows(fl_dataset *blocks, uint32_t cols, uint64_t limit, csr *c) {
  uint64_t arg[2] = {cols, limit};
  fl_dataset *ds = NULL;
  fl_records *recs = NULL;
  fl_status s = fl_map_partitions(blocks, ml_ps_sample_partition, arg, sizeof arg, &ds);
  if (s == FL_OK) s = fl_collect(ds, &recs);
  for (size_t i = 0; s == FL_OK && i < fl_records_count(recs); i++) {
    fl_bytes r = fl_records_get(recs, i);
    uint64_t head[2];
    if (r.len < sizeof head) {
      s = fl_set_error(FL_EINTERNAL, "ps solver: an evaluation record of %zu bytes", r.len);
      break;
    }
    memcpy(head, r.data, sizeof head);
    uint64_t rows = head[0], nnz = head[1];
    if (r.len != sizeof head + 16 * rows + 8 * (rows + 1) + 12 * nnz) {
      s = fl_set_error(FL_EINTERNAL, "ps solver: an evaluation record of %zu bytes", r.len);
      break;
    }
    /* A block view of the record, appended as any block. */
    const uint8_t *p = r.data + sizeof head;
    double *labels = malloc(8 * rows + 8), *weights = malloc(8 * rows + 8), *x = malloc(8 * nnz + 8);
    uint64_t *rp = malloc(8 * (rows + 1));
    uint32_t *col = malloc(4 * nnz + 4);
    if (labels && weights && x && rp && col) {
      memcpy(labels, p, 8 * rows), p += 8 * rows;
      memcpy(weights, p, 8 * rows), p += 8 * rows;
      memcpy(rp, p, 8 * (rows + 1)), p += 8 * (rows + 1);
      memcpy(x, p, 8 * nnz), p += 8 * nnz;
      memcpy(col, p, 4 * nnz);
      fl_ml_block b = {.rows = (uint32_t)rows, .cols = cols, .sparse = true, .labels = labels, .weights = weights,
                       .x = x, .row_ptr = rp, .col = col, .nnz = nnz};
      s = csr_append(c, &b, rows);
    } else {
      s = fl_set_error(FL_ENOMEM, "ps solver: out of memory for the evaluation rows");
    }
    free(labels);
    free(weights);
    free(x);
    free(rp);
    free(col);
  }
  if (s == FL_OK) s = csr_index(c);
  fl_records_free(recs);
  fl_dataset_free(ds);
  return s;
}

/* ---- the caller's side ----------------------------------------------------------------- */

typedef struct trainer {
  fl_dataset *work;
  const void *arg;
  size_t arg_len;
  fl_status status;
  char error[512];
  atomic_bool done;
} trainer;

static void *train_thread(void *p) {
  trainer *t = p;
  fl_dataset *ds = NULL;
  uint64_t n = 0;
  fl_status s = fl_map_partitions(t->work, ml_ps_worker_partition, t->arg, t->arg_len, &ds);
  if (s == FL_OK) s = fl_count(ds, &n);
  if (s != FL_OK) snprintf(t->error, sizeof t->error, "%s", fl_last_error());
  t->status = s;
  fl_dataset_free(ds);
  atomic_store(&t->done, true);
  return NULL;
}

typedef struct watcher {
  fl_ps_worker *w, *pw;  /* the caller's worker of the weights and of the progress table */
  csr eval;
  uint64_t *keys;        /* the evaluation rows' keys, then the intercept's */
  float *vals;
  const fl_ml_train_options *o;
  uint32_t cols;
  bool intercept;
  double t0;
  fl_ml_ps_epoch *rows;
  uint32_t nrows, cap;
} watcher;

static fl_status pull_wait(fl_ps_worker *w, const uint64_t *keys, size_t n, float *out) {
  uint64_t tk;
  fl_status s = fl_ps_pull(w, keys, n, out, &tk);
  return s == FL_OK ? fl_ps_wait(w, tk, NULL) : s;
}

/* A curve row: the evaluation rows' loss and accuracy at the servers' weights now. */
static fl_status take_row(watcher *wa, uint32_t epoch, uint64_t steps, double kib_sent, double kib_received) {
  const csr *c = &wa->eval;
  uint32_t n = c->nkeys + (wa->intercept ? 1 : 0);
  fl_status s = n ? pull_wait(wa->w, wa->keys, n, wa->vals) : FL_OK;
  if (s != FL_OK) return s;
  double b = wa->intercept ? wa->vals[c->nkeys] : 0.0, L = 0, W = 0, right = 0, sq = 0;
  for (uint64_t r = 0; r < c->rows; r++) {
    double y = label01(c->labels[r]), m = b, dm, wt = c->weights[r];
    for (uint64_t k = c->row_ptr[r]; k < c->row_ptr[r + 1]; k++) m += wa->vals[c->col[k]] * c->x[k];
    L += wt * logloss(m, y < 0 ? 0 : y, &dm);
    W += wt;
    right += (m >= 0) == (y == 1.0) ? wt : 0;
  }
  for (uint32_t k = 0; k < c->nkeys; k++) sq += (double)wa->vals[k] * wa->vals[k];
  fl_ml_ps_epoch e = {.epoch = epoch, .loss = W > 0 ? L / W + 0.5 * wa->o->l2 * sq : NAN,
                      .accuracy = W > 0 ? right / W : NAN, .seconds = ml_now_s() - wa->t0, .steps = steps,
                      .bytes_sent = (uint64_t)(kib_sent * 1024.0), .bytes_received = (uint64_t)(kib_received * 1024.0)};
  if (wa->nrows == wa->cap) {
    uint32_t cap = wa->cap ? 2 * wa->cap : 16;
    fl_ml_ps_epoch *p = realloc(wa->rows, cap * sizeof *p);
    if (!p) return fl_set_error(FL_ENOMEM, "out of memory");
    wa->rows = p;
    wa->cap = cap;
  }
  wa->rows[wa->nrows++] = e;
  if (wa->o->ps.on_epoch) s = wa->o->ps.on_epoch(wa->o->ps.on_epoch_arg, &e);
  if (s == FL_OK && wa->o->progress) {
    fl_ml_iteration it = {.iteration = epoch, .loss = e.loss, .grad_norm = NAN, .step = wa->o->ps.lr,
                          .seconds = e.seconds};
    s = wa->o->progress(wa->o->progress_arg, &it);
  }
  return s;
}

/* Every key [0, cols] into the model's coefficients and intercept. */
static fl_status pull_model(fl_ps_worker *w, fl_ml_model *m) {
  uint64_t *keys = malloc(PULL_CHUNK * sizeof *keys);
  float *vals = malloc(PULL_CHUNK * sizeof *vals);
  fl_status s = keys && vals ? FL_OK : fl_set_error(FL_ENOMEM, "out of memory");
  uint64_t end = (uint64_t)m->cols + (m->intercept ? 1 : 0);
  for (uint64_t lo = 0; s == FL_OK && lo < end; lo += PULL_CHUNK) {
    size_t n = end - lo < PULL_CHUNK ? (size_t)(end - lo) : PULL_CHUNK;
    for (size_t i = 0; i < n; i++) keys[i] = lo + i;
    if ((s = pull_wait(w, keys, n, vals)) != FL_OK) break;
    for (size_t i = 0; i < n; i++) {
      if (lo + i < m->cols) m->coef[lo + i] = vals[i];
      else m->intercepts[0] = vals[i];
    }
  }
  free(keys);
  free(vals);
  return s;
}

static fl_ps_update table_update(fl_ml_ps_update u) {
  return u == FL_ML_PS_SGD ? FL_PS_SGD : u == FL_ML_PS_ADAM ? FL_PS_ADAM : FL_PS_ADAGRAD;
}

fl_status ml_ps_check_options(const fl_ml_train_options *o) {
  const char *bad = o->l1 > 0 ? "l1" : o->fraction > 0 ? "fraction" : o->step > 0 ? "step"
                    : o->history ? "history" : o->max_iterations ? "max_iterations" : o->tol > 0 ? "tol" : NULL;
  if (bad)
    return fl_set_error(FL_EINVAL, "the ps solver takes epochs, batch and lr (fl_ml_ps_options); %s is for the batch "
                        "solvers (lbfgs, gd)", bad);
  const fl_ml_ps_options *p = &o->ps;
  if ((unsigned)p->sync > FL_ML_SYNC_ASP) return fl_set_error(FL_EINVAL, "ps solver: unknown sync %d", (int)p->sync);
  if ((unsigned)p->update > FL_ML_PS_ADAM)
    return fl_set_error(FL_EINVAL, "ps solver: unknown update %d", (int)p->update);
  if (p->sync == FL_ML_SYNC_SSP && p->staleness > 1000000)
    return fl_set_error(FL_EINVAL, "ps solver: staleness %u is over 1000000", p->staleness);
  if (!(p->lr >= 0) || !isfinite(p->lr)) return fl_set_error(FL_EINVAL, "ps solver: lr must be a number >= 0");
  return FL_OK;
}

fl_status ml_ps_logreg(const fl_ml_data *data, const fl_ml_train_options *opt, fl_ml_model *m) {
  fl_ml_train_options o = *opt;
  fl_ml_ps_options *p = &o.ps;
  if (!p->epochs) p->epochs = DEFAULT_EPOCHS;
  if (!p->batch) p->batch = DEFAULT_BATCH;
  if (!p->fetch_every) p->fetch_every = 1;
  if (!p->push_every) p->push_every = 1;
  if (!(p->lr > 0)) p->lr = DEFAULT_LR;
  if (!p->eval_rows) p->eval_rows = DEFAULT_EVAL_ROWS;
  fl_context *ctx = fl_dataset_context(data->blocks);
  fl_dataset *work = NULL;
  fl_ps_table *weights = NULL, *progress = NULL;
  uint8_t *arg = NULL;
  watcher wa = {.o = &o, .cols = data->cols, .intercept = m->intercept};
  trainer tr = {0};
  bool started = false;
  pthread_t thread;

  /* Every worker runs at once (BSP and SSP wait for each other): one partition a slot. */
  uint32_t slots = fl_context_cores(ctx), parts = fl_dataset_partitions(data->blocks);
  fl_status s = FL_OK;
  if (slots == 0) slots = 1;
  if (parts > slots) s = fl_coalesce(data->blocks, slots, &work);
  else work = data->blocks;
  const uint32_t workers = parts > slots ? slots : parts;
  if (s == FL_OK && workers == 0) s = fl_set_error(FL_EEMPTY, "ps solver: the data has no partitions");
  /* The evaluation rows: everything up to eval_rows, else a share of each partition. */
  if (s == FL_OK) {
    uint64_t limit = data->rows <= p->eval_rows ? UINT64_MAX : (p->eval_rows + workers - 1) / workers;
    s = collect_eval_rows(work, data->cols, limit, &wa.eval);
  }
  if (s == FL_OK && wa.eval.rows == 0) s = fl_set_error(FL_EEMPTY, "logistic regression: the data has no rows");
  if (s == FL_OK) {
    uint32_t n = wa.eval.nkeys + 1;
    wa.keys = malloc(n * sizeof *wa.keys);
    wa.vals = malloc(n * sizeof *wa.vals);
    if (!wa.keys || !wa.vals) s = fl_set_error(FL_ENOMEM, "out of memory");
    for (uint32_t k = 0; s == FL_OK && k < wa.eval.nkeys; k++) wa.keys[k] = wa.eval.keys[k];
    if (s == FL_OK) wa.keys[wa.eval.nkeys] = data->cols;
  }
  /* The tables: the caller is their last worker. */
  if (s == FL_OK) {
    fl_ps_options to = FL_PS_OPTIONS_INIT;
    to.sparse = true;
    to.width = 1;
    to.update = table_update(p->update);
    to.lr = (float)p->lr;
    to.workers = workers + 1;
    s = fl_ps_table_create(ctx, &to, &weights);
  }
  if (s == FL_OK) {
    fl_ps_options to = FL_PS_OPTIONS_INIT;
    to.keys = 1;
    to.width = 3;
    to.shards = 1;
    to.update = FL_PS_ADD;
    to.workers = workers + 1;
    s = fl_ps_table_create(ctx, &to, &progress);
  }
  if (s == FL_OK) s = fl_ps_worker_open(fl_ps_table_handle(weights), workers, &wa.w);
  if (s == FL_OK) s = fl_ps_worker_open(fl_ps_table_handle(progress), workers, &wa.pw);
  if (s == FL_OK) {
    uint64_t tk;
    fl_ps_worker_set_staleness(wa.w, FL_PS_ASYNC);
    fl_ps_worker_set_staleness(wa.pw, FL_PS_ASYNC);
    s = fl_ps_retire(wa.w, &tk); /* the caller only reads: it holds no worker back */
    if (s == FL_OK) s = fl_ps_wait(wa.w, tk, NULL);
  }
  const uint64_t per_worker = (data->rows + (uint64_t)workers * p->batch - 1) / ((uint64_t)workers * p->batch);
  const uint32_t steps_per_epoch = per_worker < 1 ? 1 : per_worker > UINT32_MAX ? UINT32_MAX : (uint32_t)per_worker;
  size_t arg_len = 0;
  if (s == FL_OK) {
    fl_bytes hw = fl_ps_table_handle(weights), hp = fl_ps_table_handle(progress);
    if (hw.len > MAX_HANDLE || hp.len > MAX_HANDLE)
      s = fl_set_error(FL_EINTERNAL, "ps solver: table handles of %zu and %zu bytes", hw.len, hp.len);
    task_arg a = {.cols = data->cols, .intercept = m->intercept, .steps_per_epoch = steps_per_epoch,
                  .epochs = p->epochs, .staleness = p->sync == FL_ML_SYNC_ASP ? FL_PS_ASYNC
                                                   : p->sync == FL_ML_SYNC_SSP ? p->staleness : 0,
                  .fetch_every = p->fetch_every, .push_every = p->push_every, .fail_worker = p->fail_worker,
                  .fail_step = p->fail_step, .weights_len = (uint32_t)hw.len, .progress_len = (uint32_t)hp.len,
                  .l2 = o.l2};
    arg_len = sizeof a + hw.len + hp.len;
    if (s == FL_OK && !(arg = malloc(arg_len))) s = fl_set_error(FL_ENOMEM, "out of memory");
    if (s == FL_OK) {
      memcpy(arg, &a, sizeof a);
      memcpy(arg + sizeof a, hw.data, hw.len);
      memcpy(arg + sizeof a + hw.len, hp.data, hp.len);
    }
  }
  /* Train on another thread; watch the progress counters on this one. */
  if (s == FL_OK) {
    tr.work = work;
    tr.arg = arg;
    tr.arg_len = arg_len;
    atomic_init(&tr.done, false);
    wa.t0 = ml_now_s();
    if (pthread_create(&thread, NULL, train_thread, &tr) != 0) s = fl_set_error(FL_EINTERNAL, "ps solver: no thread");
    else started = true;
  }
  const uint64_t epoch_steps = (uint64_t)workers * steps_per_epoch;
  uint32_t epoch = 0;
  float counters[3] = {0, 0, 0};
  while (s == FL_OK && started && !atomic_load(&tr.done)) {
    struct timespec ts = {0, WATCH_INTERVAL_NS};
    nanosleep(&ts, NULL);
    uint64_t key = 0;
    if ((s = pull_wait(wa.pw, &key, 1, counters)) != FL_OK) break;
    uint64_t steps = (uint64_t)counters[0];
    if (steps >= (epoch + 1) * epoch_steps && epoch < p->epochs) {
      epoch = (uint32_t)(steps / epoch_steps < p->epochs ? steps / epoch_steps : p->epochs);
      s = take_row(&wa, epoch, steps, counters[1], counters[2]);
    }
  }
  char why[512] = "";
  if (s != FL_OK && started) { /* the caller stopped: so do the workers */
    snprintf(why, sizeof why, "%s", fl_last_error());
    fl_cancel_jobs(ctx);
  }
  if (started) pthread_join(thread, NULL);
  if (s == FL_OK && started && tr.status != FL_OK) s = fl_set_error(tr.status, "%s", tr.error);
  if (s == FL_OK && epoch < p->epochs) { /* the last epoch's row, when the watch had not seen it yet */
    uint64_t key = 0;
    s = pull_wait(wa.pw, &key, 1, counters);
    if (s == FL_OK) s = take_row(&wa, p->epochs, (uint64_t)counters[0], counters[1], counters[2]);
  }
  if (s == FL_OK) s = pull_model(wa.w, m);
  if (s == FL_OK && wa.nrows) {
    m->history = calloc(wa.nrows, sizeof *m->history);
    if (!m->history) s = fl_set_error(FL_ENOMEM, "out of memory");
    for (uint32_t i = 0; s == FL_OK && i < wa.nrows; i++)
      m->history[i] = (fl_ml_iteration){.iteration = wa.rows[i].epoch, .loss = wa.rows[i].loss, .grad_norm = NAN,
                                        .step = p->lr, .seconds = wa.rows[i].seconds};
    if (s == FL_OK) m->num_history = wa.nrows;
    m->converged = false; /* a fixed number of epochs: no convergence test */
  }
  if (s != FL_OK && !why[0]) snprintf(why, sizeof why, "%s", fl_last_error());
  free(wa.rows);
  free(wa.keys);
  free(wa.vals);
  csr_free(&wa.eval);
  fl_ps_worker_close(wa.pw);
  fl_ps_worker_close(wa.w);
  fl_ps_table_destroy(progress);
  fl_ps_table_destroy(weights);
  free(arg);
  if (work != data->blocks) fl_dataset_free(work);
  if (s != FL_OK) fl_set_error(s, "%s", why); /* the cleanup's calls cleared the message */
  return s;
}
