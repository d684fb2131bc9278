/* test_ml_blocks.c: the ml layer below the solvers. Row block records and their builder
 * (round trips, the self-aligning layout, corrupt records), summary statistics and
 * standardization against plain-loop references, seeded synthetic data, and models:
 * prediction, evaluation (RMSE, R^2, accuracy, log-loss, AUC against exact references) and
 * model files. The summary and evaluation checks run once more on a local cluster, where
 * executor processes load libflint_ml and find its kernels by symbol. */
#include "test_util.h"

#include <float.h>
#include <limits.h>
#include <math.h>

#include <lapacke.h>

#include "flint/ml.h"

#define CLUSTER "local-cluster[2,1,512]"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [lo, hi). */
static double rng_uniform(uint64_t *s, double lo, double hi) {
  return lo + (hi - lo) * ((double)(rng_next(s) >> 11) * 0x1p-53);
}

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) n++;
  return n;
}
static size_t varint_put(uint8_t *p, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) p[n++] = (uint8_t)(v | 0x80);
  p[n++] = (uint8_t)v;
  return n;
}

/* |got - want| <= rel * scale, with scale max(|want|, floor). */
static void assert_close_scaled(double got, double want, double rel, double floor_, const char *what, uint32_t j) {
  double scale = fmax(fabs(want), floor_);
  if (!(fabs(got - want) <= rel * scale)) {
    fprintf(stderr, "%s[%u]: got %.17g, want %.17g (rel %g)\n", what, j, got, want, rel);
    fail();
  }
}
static void assert_close(double got, double want, double rel, const char *what) {
  assert_close_scaled(got, want, rel, 1e-300, what, 0);
}

static bool points_into(const void *p, const void *base, size_t len) {
  return (const uint8_t *)p >= (const uint8_t *)base && (const uint8_t *)p < (const uint8_t *)base + len;
}

/* Rows held by the test: x is dense (rows x cols); a sparse table stores the nonzeros of
 * each row (a stored value is never 0, so that the dense copy says exactly what is stored). */
typedef struct table {
  uint32_t n, cols;
  bool sparse, weighted;
  double *labels, *weights, *x;
} table;

static table table_new(uint32_t n, uint32_t cols, bool sparse, bool weighted) {
  table t = {.n = n, .cols = cols, .sparse = sparse, .weighted = weighted};
  t.labels = calloc(n ? n : 1, sizeof *t.labels);
  t.weights = calloc(n ? n : 1, sizeof *t.weights);
  t.x = calloc((size_t)(n ? n : 1) * cols, sizeof *t.x);
  assert_true(t.labels && t.weights && t.x);
  for (uint32_t i = 0; i < n; i++) t.weights[i] = 1.0;
  return t;
}
static void table_free(table *t) {
  free(t->labels);
  free(t->weights);
  free(t->x);
  memset(t, 0, sizeof *t);
}
static double weight_of(const table *t, uint32_t i) { return t->weighted ? t->weights[i] : 1.0; }

/* Mixed columns: 0 a huge mean (1e9 + noise), 1 constant 0.1, 2 in [1, 4), the others of
 * assorted scale and sign. Sparse: about a third of the values stored, every empty_every-th
 * row empty (0: none), column 2 stored in every other row, the last column never stored.
 * Weighted: weights in [0.2, 3) and every 11th weight 0. */
static table table_mixed(uint32_t n, uint32_t cols, bool sparse, bool weighted, uint32_t empty_every, uint64_t seed) {
  table t = table_new(n, cols, sparse, weighted);
  uint64_t st = seed;
  for (uint32_t i = 0; i < n; i++) {
    t.labels[i] = rng_uniform(&st, -5, 20);
    if (weighted) t.weights[i] = i % 11 == 3 ? 0.0 : rng_uniform(&st, 0.2, 3.0);
    double *x = t.x + (size_t)i * cols;
    for (uint32_t j = 0; j < cols; j++) {
      double v = j == 0   ? 1e9 + rng_uniform(&st, -1, 1)
                 : j == 1 ? 0.1
                 : j == 2 ? rng_uniform(&st, 1, 4)
                          : rng_uniform(&st, -1, 1) * (double)(j * j) + (double)j * 0.5;
      if (v == 0) v = 0.25;
      if (sparse) {
        bool keep = !(empty_every && i % empty_every == 0) && j + 1 < cols && (j == 2 || rng_next(&st) % 3 == 0);
        if (j == 0 || j == 1) keep = keep && rng_next(&st) % 2 == 0;
        if (!keep) v = 0;
      }
      x[j] = v;
    }
  }
  return t;
}

/* Block records of the table's rows, up to rows_per_block rows each (0: the default). */
static void table_records(const table *t, uint32_t rows_per_block, fl_buf **out, size_t *count) {
  fl_ml_block_builder *b;
  assert_ok(fl_ml_block_builder_create(t->sparse ? 0 : t->cols, t->sparse, t->weighted, rows_per_block, &b));
  fl_buf *recs = NULL;
  size_t n = 0;
  uint32_t *idx = malloc((t->cols + 1) * sizeof *idx);
  double *vals = malloc((t->cols + 1) * sizeof *vals);
  assert_true(idx && vals);
  for (uint32_t i = 0; i <= t->n; i++) {
    bool last = i == t->n;
    if (last || fl_ml_block_builder_full(b)) {
      fl_buf rec = FL_BUF_INIT;
      assert_ok(fl_ml_block_builder_take(b, &rec));
      if (rec.len) {
        recs = realloc(recs, (n + 1) * sizeof *recs);
        assert_non_null(recs);
        recs[n++] = rec;
      } else {
        fl_buf_free(&rec);
      }
    }
    if (last) break;
    const double *x = t->x + (size_t)i * t->cols;
    if (!t->sparse) {
      assert_ok(fl_ml_block_builder_add_dense(b, t->labels[i], t->weights[i], x));
    } else {
      uint32_t k = 0;
      for (uint32_t j = 0; j < t->cols; j++)
        if (x[j] != 0) idx[k] = j, vals[k++] = x[j];
      assert_ok(fl_ml_block_builder_add_sparse(b, t->labels[i], t->weights[i], idx, vals, k));
    }
  }
  free(idx);
  free(vals);
  fl_ml_block_builder_free(b);
  *out = recs;
  *count = n;
}

static void records_free(fl_buf *recs, size_t count) {
  for (size_t i = 0; i < count; i++) fl_buf_free(&recs[i]);
  free(recs);
}

/* The table as an fl_ml_data over `partitions` partitions of fl_parallelize. */
static fl_ml_data *table_data(fl_context *ctx, const table *t, uint32_t rows_per_block, uint32_t partitions,
                              bool persist) {
  fl_buf *recs;
  size_t count;
  table_records(t, rows_per_block, &recs, &count);
  fl_bytes *views = calloc(count ? count : 1, sizeof *views);
  assert_non_null(views);
  for (size_t i = 0; i < count; i++) views[i] = fl_buf_bytes(&recs[i]);
  fl_ml_data *d = calloc(1, sizeof *d);
  assert_non_null(d);
  assert_ok(fl_parallelize(ctx, views, count, partitions, &d->blocks));
  if (persist) assert_ok(fl_persist(d->blocks, FL_MEMORY_ONLY));
  d->rows = t->n;
  d->cols = t->cols;
  d->sparse = t->sparse;
  d->weighted = t->weighted;
  free(views);
  records_free(recs, count);
  return d;
}

/* Every row of a block dataset, in order, into a dense table of `cols` columns. */
static table data_rows(const fl_ml_data *d) {
  fl_records *r;
  assert_ok(fl_collect(d->blocks, &r));
  fl_buf scratch = FL_BUF_INIT;
  uint64_t n = 0;
  for (size_t i = 0; i < fl_records_count(r); i++) {
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_records_get(r, i), &scratch, &b));
    n += b.rows;
  }
  table t = table_new((uint32_t)n, d->cols, d->sparse, d->weighted);
  uint32_t at = 0;
  for (size_t i = 0; i < fl_records_count(r); i++) {
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_records_get(r, i), &scratch, &b));
    assert_int_equal(b.sparse, d->sparse);
    assert_int_equal(b.weights != NULL, d->weighted);
    assert_true(b.cols <= d->cols);
    for (uint32_t k = 0; k < b.rows; k++, at++) {
      t.labels[at] = b.labels[k];
      t.weights[at] = b.weights ? b.weights[k] : 1.0;
      double *x = t.x + (size_t)at * d->cols;
      if (!b.sparse) {
        assert_int_equal(b.cols, d->cols);
        memcpy(x, b.x + (size_t)k * b.cols, (size_t)b.cols * sizeof *x);
      } else {
        for (uint64_t e = b.row_ptr[k]; e < b.row_ptr[k + 1]; e++) x[b.col[e]] = b.x[e];
      }
    }
  }
  fl_buf_free(&scratch);
  fl_records_free(r);
  return t;
}

/* ---- 1. block records: builder and view ---------------------------------------------------- */

/* The one record of a builder holding what was added. */
static fl_buf take_one(fl_ml_block_builder *b) {
  fl_buf rec = FL_BUF_INIT;
  assert_ok(fl_ml_block_builder_take(b, &rec));
  assert_true(rec.len > 0);
  return rec;
}

/* Views `rec` at every offset 0..7 of an 8-aligned buffer: the arrays point into the record
 * exactly where the layout makes them aligned (into the scratch copy elsewhere), and the
 * values read the same at every offset. */
static void view_everywhere(fl_bytes rec, void (*check)(const fl_ml_block *b, void *arg), void *arg) {
  uint8_t *buf = aligned_alloc(8, ((rec.len + 8 + 7) / 8) * 8);
  assert_non_null(buf);
  fl_buf scratch = FL_BUF_INIT;
  size_t q = rec.data[0];
  for (size_t off = 0; off < 8; off++) {
    memcpy(buf + off, rec.data, rec.len);
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_bytes_of(buf + off, rec.len), &scratch, &b));
    bool in_place = (off + 1 + q) % 8 == 0;
    const void *arrays[] = {b.labels, b.weights, b.x, b.row_ptr, b.col};
    for (size_t k = 0; k < 5; k++) {
      if (!arrays[k] || ((k == 2 || k == 4) && b.sparse && b.nnz == 0)) continue;
      assert_true((uintptr_t)arrays[k] % 8 == 0 || k == 4);
      if (in_place) assert_true(points_into(arrays[k], buf + off, rec.len));
      else assert_true(points_into(arrays[k], scratch.data, scratch.cap));
    }
    check(&b, arg);
  }
  fl_buf_free(&scratch);
  free(buf);
}

typedef struct dense_case {
  uint32_t rows, cols;
  bool weighted;
  const double *labels, *weights, *x;
} dense_case;

static void check_dense(const fl_ml_block *b, void *arg) {
  const dense_case *c = arg;
  assert_int_equal(b->rows, c->rows);
  assert_int_equal(b->cols, c->cols);
  assert_false(b->sparse);
  assert_int_equal(b->nnz, 0);
  assert_null(b->row_ptr);
  assert_null(b->col);
  assert_memory_equal(b->labels, c->labels, c->rows * sizeof(double));
  assert_memory_equal(b->x, c->x, (size_t)c->rows * c->cols * sizeof(double));
  if (c->weighted) {
    assert_non_null(b->weights);
    assert_memory_equal(b->weights, c->weights, c->rows * sizeof(double));
  } else {
    assert_null(b->weights);
  }
}

typedef struct sparse_case {
  uint32_t rows, cols;
  uint64_t nnz;
  const double *labels, *x;
  const uint64_t *row_ptr;
  const uint32_t *col;
} sparse_case;

static void check_sparse(const fl_ml_block *b, void *arg) {
  const sparse_case *c = arg;
  assert_int_equal(b->rows, c->rows);
  assert_int_equal(b->cols, c->cols);
  assert_true(b->sparse);
  assert_int_equal(b->nnz, c->nnz);
  assert_null(b->weights);
  assert_memory_equal(b->labels, c->labels, c->rows * sizeof(double));
  assert_memory_equal(b->row_ptr, c->row_ptr, (c->rows + 1) * sizeof(uint64_t));
  if (c->nnz) {
    assert_memory_equal(b->x, c->x, c->nnz * sizeof(double));
    assert_memory_equal(b->col, c->col, c->nnz * sizeof(uint32_t));
  }
}

static void test_block_round_trip(void **state) {
  (void)state;
  /* dense, unweighted and weighted; -0.0, a subnormal and infinities travel bit for bit */
  const double labels[3] = {1.5, -0.0, 7};
  const double weights[3] = {0.5, 2, 0};
  const double x[3 * 4] = {1, 2, 3, 4, -0.0, 5e-324, DBL_MAX, -1e-300, INFINITY, 0.1, 1.0 / 3, -7};
  for (int weighted = 0; weighted < 2; weighted++) {
    fl_ml_block_builder *b;
    assert_ok(fl_ml_block_builder_create(4, false, weighted, 0, &b));
    for (uint32_t i = 0; i < 3; i++) assert_ok(fl_ml_block_builder_add_dense(b, labels[i], weights[i], x + 4 * i));
    assert_int_equal(fl_ml_block_builder_rows(b), 3);
    assert_false(fl_ml_block_builder_full(b));
    fl_buf rec = take_one(b);
    assert_int_equal(fl_ml_block_builder_rows(b), 0);
    dense_case c = {3, 4, weighted, labels, weights, x};
    view_everywhere(fl_buf_bytes(&rec), check_dense, &c);
    fl_buf_free(&rec);
    fl_ml_block_builder_free(b);
  }

  /* sparse: rows with values, empty rows (first and last too), width from the widest row */
  {
    fl_ml_block_builder *b;
    assert_ok(fl_ml_block_builder_create(2, true, false, 0, &b));
    const uint32_t i1[2] = {1, 4}, i3[1] = {0};
    const double v1[2] = {1.5, -2}, v3[1] = {3};
    assert_ok(fl_ml_block_builder_add_sparse(b, 10, 1, NULL, NULL, 0)); /* no values at all */
    assert_ok(fl_ml_block_builder_add_sparse(b, 11, 1, i1, v1, 2));
    assert_ok(fl_ml_block_builder_add_sparse(b, 12, 1, i3, v3, 0)); /* nnz 0 with arrays */
    assert_ok(fl_ml_block_builder_add_sparse(b, 13, 1, i3, v3, 1));
    assert_ok(fl_ml_block_builder_add_sparse(b, 14, 1, NULL, NULL, 0));
    fl_buf rec = take_one(b);
    const double lab[5] = {10, 11, 12, 13, 14}, xs[3] = {1.5, -2, 3};
    const uint64_t rp[6] = {0, 0, 2, 2, 3, 3};
    const uint32_t cs[3] = {1, 4, 0};
    sparse_case c = {5, 5, 3, lab, xs, rp, cs};
    view_everywhere(fl_buf_bytes(&rec), check_sparse, &c);

    /* the next block starts afresh: cols back to the lower bound (2), a row of nothing */
    assert_ok(fl_ml_block_builder_add_sparse(b, 20, 1, NULL, NULL, 0));
    fl_buf_free(&rec);
    rec = take_one(b);
    const double lab2[1] = {20};
    const uint64_t rp2[2] = {0, 0};
    sparse_case c2 = {1, 2, 0, lab2, NULL, rp2, NULL};
    view_everywhere(fl_buf_bytes(&rec), check_sparse, &c2);
    fl_buf_free(&rec);
    fl_ml_block_builder_free(b);
  }

  /* a declared width above every index is kept */
  {
    fl_ml_block_builder *b;
    assert_ok(fl_ml_block_builder_create(10, true, false, 0, &b));
    const uint32_t i[2] = {0, 3};
    const double v[2] = {1, 2};
    assert_ok(fl_ml_block_builder_add_sparse(b, 1, 1, i, v, 2));
    fl_buf rec = take_one(b);
    const double lab[1] = {1};
    const uint64_t rp[2] = {0, 2};
    sparse_case c = {1, 10, 2, lab, v, rp, i};
    view_everywhere(fl_buf_bytes(&rec), check_sparse, &c);
    fl_buf_free(&rec);
    fl_ml_block_builder_free(b);
  }

  /* sparse weighted */
  {
    fl_ml_block_builder *b;
    assert_ok(fl_ml_block_builder_create(0, true, true, 0, &b));
    const uint32_t i[1] = {2};
    const double v[1] = {9};
    assert_ok(fl_ml_block_builder_add_sparse(b, 1, 0.25, i, v, 1));
    assert_ok(fl_ml_block_builder_add_sparse(b, 2, 4.0, NULL, NULL, 0));
    fl_buf rec = take_one(b);
    fl_buf scratch = FL_BUF_INIT;
    fl_ml_block blk;
    assert_ok(fl_ml_block_view(fl_buf_bytes(&rec), &scratch, &blk));
    assert_non_null(blk.weights);
    assert_true(blk.weights[0] == 0.25 && blk.weights[1] == 4.0);
    assert_int_equal(blk.cols, 3);
    assert_int_equal(blk.nnz, 1);
    fl_buf_free(&scratch);
    fl_buf_free(&rec);
    fl_ml_block_builder_free(b);
  }
}

static void test_block_splits_and_alignment(void **state) {
  (void)state;
  /* rows_per_block: full() after exactly that many rows; take() of nothing is empty */
  fl_ml_block_builder *b;
  assert_ok(fl_ml_block_builder_create(2, false, false, 4, &b));
  fl_buf rec = FL_BUF_INIT;
  assert_ok(fl_ml_block_builder_take(b, &rec));
  assert_int_equal(rec.len, 0);
  uint32_t sizes[8], blocks = 0;
  double next = 0;
  for (uint32_t i = 0; i < 10; i++) {
    double x[2] = {i, -(double)i};
    assert_false(fl_ml_block_builder_full(b));
    assert_ok(fl_ml_block_builder_add_dense(b, i, 1, x));
    if (fl_ml_block_builder_full(b)) {
      assert_int_equal(fl_ml_block_builder_rows(b), 4);
      assert_ok(fl_ml_block_builder_take(b, &rec));
      fl_buf scratch = FL_BUF_INIT;
      fl_ml_block blk;
      assert_ok(fl_ml_block_view(fl_buf_bytes(&rec), &scratch, &blk));
      for (uint32_t k = 0; k < blk.rows; k++) assert_true(blk.labels[k] == next++);
      sizes[blocks++] = blk.rows;
      fl_buf_free(&scratch);
    }
  }
  assert_int_equal(fl_ml_block_builder_rows(b), 2);
  assert_ok(fl_ml_block_builder_take(b, &rec));
  sizes[blocks++] = 2;
  assert_int_equal(blocks, 3);
  assert_int_equal(sizes[0], 4);
  assert_int_equal(sizes[1], 4);
  assert_ok(fl_ml_block_builder_take(b, &rec)); /* nothing since the last take */
  assert_int_equal(rec.len, 0);
  fl_buf_free(&rec);
  fl_ml_block_builder_free(b);

  /* The layout: behind its varint length, every record (of sizes across the 1- and 2-byte
   * varint boundary, dense and sparse, weighted or not) ends 8-aligned and is read in place
   * at buffer + prefix, and through the scratch copy one byte further on. */
  uint8_t *buf = aligned_alloc(8, 1 << 16);
  assert_non_null(buf);
  fl_buf scratch = FL_BUF_INIT;
  for (int kind = 0; kind < 4; kind++) {
    bool sparse = kind & 1, weighted = kind & 2;
    for (uint32_t rows = 1; rows <= 40; rows++) {
      assert_ok(fl_ml_block_builder_create(sparse ? 0 : 3, sparse, weighted, 0, &b));
      for (uint32_t i = 0; i < rows; i++) {
        double x[3] = {i, i + 0.5, -(double)i};
        uint32_t idx[3] = {0, 2, 5};
        if (sparse) assert_ok(fl_ml_block_builder_add_sparse(b, i, i + 1, idx, x, i % 4 == 0 ? 0 : i % 3 + 1));
        else assert_ok(fl_ml_block_builder_add_dense(b, i, i + 1, x));
      }
      assert_ok(fl_ml_block_builder_take(b, &rec));
      fl_ml_block_builder_free(b);
      size_t p = varint_len(rec.len);
      assert_int_equal((p + rec.len) % 8, 0);
      assert_true(rec.len + p + 1 <= 1 << 16);
      assert_int_equal(varint_put(buf, rec.len), p);
      memcpy(buf + p, rec.data, rec.len);
      fl_ml_block blk;
      assert_ok(fl_ml_block_view(fl_bytes_of(buf + p, rec.len), &scratch, &blk));
      assert_int_equal(blk.rows, rows);
      assert_true(points_into(blk.labels, buf + p, rec.len));
      assert_true(points_into(blk.x, buf + p, rec.len) || (sparse && blk.nnz == 0));
      if (weighted) assert_true(points_into(blk.weights, buf + p, rec.len));
      if (sparse) assert_true(points_into(blk.row_ptr, buf + p, rec.len));
      for (uint32_t i = 0; i < rows; i++) {
        assert_true(blk.labels[i] == i);
        if (weighted) assert_true(blk.weights[i] == i + 1);
      }
      /* one byte off: the copy, with the same values */
      memmove(buf + p + 1, buf + p, rec.len);
      fl_ml_block off;
      assert_ok(fl_ml_block_view(fl_bytes_of(buf + p + 1, rec.len), &scratch, &off));
      assert_true(points_into(off.labels, scratch.data, scratch.cap));
      assert_false(points_into(off.labels, buf, 1 << 16));
      assert_int_equal(off.rows, rows);
      uint64_t nnz = blk.nnz;
      assert_int_equal(off.nnz, nnz);
      for (uint32_t i = 0; i < rows; i++) assert_true(off.labels[i] == i);
      if (sparse) {
        uint64_t end = 0; /* blk's arrays were in the bytes moved: compare with the rows added */
        for (uint32_t i = 0; i < rows; i++) {
          assert_int_equal(off.row_ptr[i], end);
          end += i % 4 == 0 ? 0 : i % 3 + 1;
        }
        assert_int_equal(off.row_ptr[rows], end);
      } else {
        for (uint32_t i = 0; i < rows; i++) assert_true(off.x[3 * i + 1] == i + 0.5);
      }
    }
  }
  fl_buf_free(&scratch);
  fl_buf_free(&rec);
  free(buf);
}

/* ---- 2. corrupt records and builder errors ------------------------------------------------- */

/* A copy of `rec` changed by `edit` (at the body: the header's first byte), viewed. */
static fl_status view_edited(const fl_buf *rec, size_t len, void (*edit)(uint8_t *body, void *arg), void *arg) {
  uint8_t *copy = calloc(1, len + 16);
  assert_non_null(copy);
  memcpy(copy, rec->data, len < rec->len ? len : rec->len);
  if (edit) edit(copy + 1 + copy[0], arg);
  fl_buf scratch = FL_BUF_INIT;
  fl_ml_block b;
  fl_status s = fl_ml_block_view(fl_bytes_of(copy, len), &scratch, &b);
  fl_buf_free(&scratch);
  free(copy);
  return s;
}

static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* The sparse record below: 3 rows, unweighted, {0:1, 2:2}, {}, {1:3}: row_ptr at body + 24 +
 * 3 * 8, col after the 3 values. */
#define SP_ROWPTR (24 + 3 * 8)
#define SP_COL (SP_ROWPTR + 4 * 8 + 3 * 8)
static void edit_magic(uint8_t *body, void *arg) { (void)arg, body[0] ^= 1; }
static void edit_version(uint8_t *body, void *arg) { (void)arg, body[4] = 2; }
static void edit_flags(uint8_t *body, void *arg) { (void)arg, body[5] |= 4; }
static void edit_u64(uint8_t *body, void *arg) {
  const uint64_t *a = arg; /* offset, value */
  put_u64(body + a[0], a[1]);
}
static void edit_u32(uint8_t *body, void *arg) {
  const uint64_t *a = arg;
  put_u32(body + a[0], (uint32_t)a[1]);
}
static void edit_decreasing(uint8_t *body, void *arg) {
  (void)arg;
  put_u64(body + SP_ROWPTR + 16, 1); /* row_ptr {0, 2, 2, 3} -> {0, 2, 1, 3}: row 1 goes back */
}
static void edit_swap_cols(uint8_t *body, void *arg) {
  (void)arg;
  put_u32(body + SP_COL, 2);
  put_u32(body + SP_COL + 4, 0);
}

static void test_block_corrupt(void **state) {
  (void)state;
  fl_ml_block_builder *b;
  assert_ok(fl_ml_block_builder_create(3, false, false, 0, &b));
  double x[3] = {1, 2, 3};
  assert_ok(fl_ml_block_builder_add_dense(b, 1, 1, x));
  assert_ok(fl_ml_block_builder_add_dense(b, 2, 1, x));
  fl_buf dense = take_one(b);
  fl_ml_block_builder_free(b);

  assert_ok(fl_ml_block_builder_create(0, true, false, 0, &b));
  const uint32_t i0[2] = {0, 2}, i2[1] = {1};
  const double v0[2] = {1, 2}, v2[1] = {3};
  assert_ok(fl_ml_block_builder_add_sparse(b, 1, 1, i0, v0, 2));
  assert_ok(fl_ml_block_builder_add_sparse(b, 2, 1, NULL, NULL, 0));
  assert_ok(fl_ml_block_builder_add_sparse(b, 3, 1, i2, v2, 1));
  fl_buf sparse = take_one(b);
  fl_ml_block_builder_free(b);

  /* the untouched copies read */
  assert_ok(view_edited(&dense, dense.len, NULL, NULL));
  assert_ok(view_edited(&sparse, sparse.len, NULL, NULL));

  fl_buf scratch = FL_BUF_INIT;
  fl_ml_block blk;
  assert_fails_with(fl_ml_block_view(fl_bytes_of(dense.data, 10), &scratch, &blk), FL_ECORRUPT, "too short");
  assert_fails_with(fl_ml_block_view(fl_bytes_of(NULL, 0), &scratch, &blk), FL_ECORRUPT, "too short");
  assert_fails_with(view_edited(&dense, dense.len, edit_magic, NULL), FL_ECORRUPT, "not a row block");
  assert_fails_with(view_edited(&dense, dense.len, edit_version, NULL), FL_ECORRUPT, "not a row block");
  assert_fails_with(view_edited(&dense, dense.len, edit_flags, NULL), FL_ECORRUPT, "not a row block");
  {
    uint8_t *copy = malloc(dense.len);
    assert_non_null(copy);
    memcpy(copy, dense.data, dense.len);
    copy[0] = 8;
    assert_fails_with(fl_ml_block_view(fl_bytes_of(copy, dense.len), &scratch, &blk), FL_ECORRUPT, "padding");
    free(copy);
  }
  /* truncated arrays; more than 7 bytes after them */
  assert_fails_with(view_edited(&dense, dense.len - 8, NULL, NULL), FL_ECORRUPT, "does not match");
  assert_fails_with(view_edited(&dense, dense.len + 8, NULL, NULL), FL_ECORRUPT, "does not match");
  assert_fails_with(view_edited(&sparse, sparse.len - 8, NULL, NULL), FL_ECORRUPT, "does not match");
  assert_fails_with(view_edited(&sparse, sparse.len + 8, NULL, NULL), FL_ECORRUPT, "does not match");
  /* a header whose sizes would wrap around */
  uint64_t huge_rows[2] = {8, 0xffffffffu};
  assert_fails_with(view_edited(&dense, dense.len, edit_u32, huge_rows), FL_ECORRUPT, "does not match");
  uint64_t huge_nnz[2] = {16, UINT64_MAX / 4};
  assert_fails_with(view_edited(&sparse, sparse.len, edit_u64, huge_nnz), FL_ECORRUPT, "does not match");
  uint64_t dense_nnz[2] = {16, 1};
  assert_fails_with(view_edited(&dense, dense.len, edit_u64, dense_nnz), FL_ECORRUPT, "nnz");

  /* sparse offsets and columns */
  uint64_t first[2] = {SP_ROWPTR, 1};
  assert_fails_with(view_edited(&sparse, sparse.len, edit_u64, first), FL_ECORRUPT, "row offsets");
  uint64_t last[2] = {SP_ROWPTR + 3 * 8, 2};
  assert_fails_with(view_edited(&sparse, sparse.len, edit_u64, last), FL_ECORRUPT, "row offsets");
  assert_fails_with(view_edited(&sparse, sparse.len, edit_decreasing, NULL), FL_ECORRUPT, "offsets of row 1");
  assert_fails_with(view_edited(&sparse, sparse.len, edit_swap_cols, NULL), FL_ECORRUPT, "out of order");
  uint64_t repeat[2] = {SP_COL + 4, 0}; /* row 0: {0, 0} */
  assert_fails_with(view_edited(&sparse, sparse.len, edit_u32, repeat), FL_ECORRUPT, "out of order");
  uint64_t wide[2] = {SP_COL + 8, 3}; /* cols is 3 */
  assert_fails_with(view_edited(&sparse, sparse.len, edit_u32, wide), FL_ECORRUPT, "beyond 3");
  fl_buf_free(&scratch);
  fl_buf_free(&dense);
  fl_buf_free(&sparse);

  /* builder errors, which leave the builder as it was */
  assert_fails_with(fl_ml_block_builder_create(0, false, false, 0, &b), FL_EINVAL, "column");
  assert_ok(fl_ml_block_builder_create(0, true, false, 0, &b));
  const uint32_t down[2] = {3, 1}, same[2] = {2, 2};
  assert_fails_with(fl_ml_block_builder_add_sparse(b, 1, 1, down, v0, 2), FL_EINVAL, "ascend");
  assert_fails_with(fl_ml_block_builder_add_sparse(b, 1, 1, same, v0, 2), FL_EINVAL, "ascend");
  assert_fails_with(fl_ml_block_builder_add_dense(b, 1, 1, x), FL_EINVAL, "dense row");
  assert_int_equal(fl_ml_block_builder_rows(b), 0);
  assert_ok(fl_ml_block_builder_add_sparse(b, 1, 1, i0, v0, 2));
  assert_fails_with(fl_ml_block_builder_add_sparse(b, 1, 1, same, v0, 2), FL_EINVAL, "ascend");
  assert_int_equal(fl_ml_block_builder_rows(b), 1);
  fl_buf rec = take_one(b);
  assert_ok(view_edited(&rec, rec.len, NULL, NULL));
  fl_buf_free(&rec);
  fl_ml_block_builder_free(b);
  assert_ok(fl_ml_block_builder_create(3, false, false, 0, &b));
  assert_fails_with(fl_ml_block_builder_add_sparse(b, 1, 1, i0, v0, 2), FL_EINVAL, "sparse row");
  assert_int_equal(fl_ml_block_builder_rows(b), 0);
  fl_ml_block_builder_free(b);
  fl_ml_block_builder_free(NULL);
}

/* ---- 3. summary statistics ----------------------------------------------------------------- */

/* The table's summary by plain two-pass loops in long double. */
static void reference_summary(const table *t, fl_ml_summary *r, double *abs_mean) {
  uint32_t d = t->cols;
  r->cols = d;
  r->count = t->n;
  r->mean = calloc(4 * (size_t)d, sizeof(double));
  assert_non_null(r->mean);
  r->variance = r->mean + d, r->min = r->variance + d, r->max = r->min + d;
  long double Wt = 0, W2 = 0;
  r->label_min = INFINITY, r->label_max = -INFINITY;
  for (uint32_t i = 0; i < t->n; i++) {
    Wt += weight_of(t, i), W2 += (long double)weight_of(t, i) * weight_of(t, i);
    r->label_min = fmin(r->label_min, t->labels[i]);
    r->label_max = fmax(r->label_max, t->labels[i]);
  }
  r->weight_sum = (double)Wt;
  for (uint32_t j = 0; j < d; j++) {
    long double s = 0, sa = 0, m2 = 0;
    double mn = INFINITY, mx = -INFINITY;
    for (uint32_t i = 0; i < t->n; i++) {
      double v = t->x[(size_t)i * d + j];
      s += (long double)weight_of(t, i) * v;
      sa += (long double)weight_of(t, i) * fabs(v);
      mn = fmin(mn, v), mx = fmax(mx, v);
    }
    long double mean = s / Wt;
    for (uint32_t i = 0; i < t->n; i++) {
      long double dev = t->x[(size_t)i * d + j] - mean;
      m2 += weight_of(t, i) * dev * dev;
    }
    r->mean[j] = mn == mx ? mn : (double)mean; /* exactly, where rounding would not say it */
    r->variance[j] = mn == mx ? 0.0 : (double)(m2 / (Wt - W2 / Wt));
    r->min[j] = mn, r->max[j] = mx;
    abs_mean[j] = (double)(sa / Wt);
  }
}

static void check_summary(const fl_ml_data *data, const table *t) {
  fl_ml_summary got, want;
  assert_ok(fl_ml_summarize(data, &got));
  double *abs_mean = malloc(t->cols * sizeof *abs_mean);
  assert_non_null(abs_mean);
  reference_summary(t, &want, abs_mean);
  assert_int_equal(got.count, want.count);
  assert_int_equal(got.cols, t->cols);
  assert_close(got.weight_sum, want.weight_sum, 1e-12, "weight_sum");
  assert_true(got.label_min == want.label_min && got.label_max == want.label_max);
  for (uint32_t j = 0; j < t->cols; j++) {
    assert_close_scaled(got.mean[j], want.mean[j], 1e-12, abs_mean[j], "mean", j);
    /* column 0: mean 1e9, spread 1: no digits lost to sums of squares */
    assert_close_scaled(got.variance[j], want.variance[j], j == 0 ? 1e-6 : 1e-12, 1e-300, "variance", j);
    assert_true(got.min[j] == want.min[j]);
    assert_true(got.max[j] == want.max[j]);
  }
  /* constant columns (dense: column 1; sparse: the last): exactly their value, and no
   * variance at all */
  uint32_t constant = 0;
  for (uint32_t j = 0; j < t->cols; j++) {
    if (want.min[j] != want.max[j]) continue;
    constant++;
    assert_true(got.mean[j] == want.min[j]);
    assert_true(got.variance[j] == 0.0);
  }
  assert_true(constant > 0);
  free(abs_mean);
  fl_ml_summary_free(&want);
  fl_ml_summary_free(&got);
  assert_null(got.mean);
}

static void run_summary_checks(fl_context *ctx) {
  for (int kind = 0; kind < 6; kind++) {
    bool sparse = kind & 1, weighted = kind & 2;
    /* kinds 4 and 5: sparse without empty rows, where column 2 is stored in every row and
     * its minimum is no implicit zero */
    table t = table_mixed(1000, 7, sparse || kind == 4, weighted, kind == 4 ? 0 : 7, 100 + kind);
    fl_ml_data *data = table_data(ctx, &t, 37, 5, kind == 1);
    check_summary(data, &t);
    if (kind == 4) assert_true(t.x[2] != 0);
    fl_ml_data_free(data);
    table_free(&t);
  }
  /* few rows over many partitions: empty partitions and one-row blocks */
  table t = table_mixed(3, 4, false, true, 7, 7);
  t.weights[0] = 1; /* no zero weight in so few rows */
  fl_ml_data *data = table_data(ctx, &t, 1, 8, false);
  check_summary(data, &t);
  fl_ml_data_free(data);
  table_free(&t);
}

static void test_summarize(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  run_summary_checks(ctx);

  /* a block wider than the data is an error, not a read past the summary */
  table t = table_mixed(20, 5, false, false, 7, 3);
  fl_ml_data *data = table_data(ctx, &t, 0, 3, false);
  data->cols = 4;
  fl_ml_summary s;
  assert_fails_with(fl_ml_summarize(data, &s), FL_EJOB, "features"); /* a task's error fails the job */
  fl_ml_data_free(data);
  table_free(&t);
  assert_int_equal(fl_ml_summarize(NULL, &s), FL_EINVAL);
  fl_ml_summary_free(NULL);
  fl_context_close(ctx);
}

/* ---- 4. standardization -------------------------------------------------------------------- */

static void test_standardize(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  for (int kind = 0; kind < 4; kind++) {
    bool sparse = kind & 1, weighted = kind & 2;
    table t = table_mixed(600, 6, sparse, weighted, 7, 40 + kind);
    fl_ml_data *data = table_data(ctx, &t, 50, 3, true);
    fl_ml_summary sm;
    assert_ok(fl_ml_summarize(data, &sm));
    fl_ml_data *z = NULL;
    if (sparse) {
      assert_fails_with(fl_ml_standardize(data, &sm, true, &z), FL_EINVAL, "sparse");
      assert_null(z);
    }
    for (int with_mean = 0; with_mean < 2; with_mean++) {
      if (sparse && with_mean) continue;
      assert_ok(fl_ml_standardize(data, &sm, with_mean, &z));
      assert_int_equal(z->rows, t.n);
      assert_int_equal(z->cols, t.cols);
      assert_int_equal(z->sparse, sparse);
      assert_int_equal(z->weighted, weighted);
      /* row by row: labels and weights kept, x_j -> (x_j - shift_j) * (1 / sd_j) */
      table r = data_rows(z);
      assert_int_equal(r.n, t.n);
      for (uint32_t i = 0; i < t.n; i++) {
        assert_true(r.labels[i] == t.labels[i]);
        assert_true(r.weights[i] == weight_of(&t, i));
        for (uint32_t j = 0; j < t.cols; j++) {
          double sd = sqrt(sm.variance[j]), scale = sd > 0 ? 1.0 / sd : 1.0, v = t.x[(size_t)i * t.cols + j];
          double want = (v - (with_mean ? sm.mean[j] : 0.0)) * scale;
          if (sparse && v == 0) want = 0; /* implicit zeros stay implicit */
          assert_close_scaled(r.x[(size_t)i * t.cols + j], want, 1e-15, 1e-300, "standardized", j);
        }
        /* constant columns are left as they were (centred: exactly 0) */
        for (uint32_t j = 0; j < t.cols; j++)
          if (sm.min[j] == sm.max[j])
            assert_true(r.x[(size_t)i * t.cols + j] == (with_mean ? 0.0 : t.x[(size_t)i * t.cols + j]));
      }
      table_free(&r);
      /* and by its summary: variance 1 (0 for the constant column), mean 0 when centred */
      fl_ml_summary zs;
      assert_ok(fl_ml_summarize(z, &zs));
      for (uint32_t j = 0; j < t.cols; j++) {
        bool constant = sm.variance[j] == 0;
        /* column 0's variance, about a mean of 1e9, is good to about 1e-7 (test_summarize) */
        assert_close_scaled(zs.variance[j], constant ? 0.0 : 1.0, j == 0 ? 1e-6 : 1e-9, 1.0, "variance", j);
        if (with_mean) assert_close_scaled(zs.mean[j], 0.0, j == 0 ? 1e-6 : 1e-9, 1.0, "mean", j);
        else if (!constant) assert_close_scaled(zs.mean[j], sm.mean[j] / sqrt(sm.variance[j]), 1e-9, 1.0, "mean", j);
      }
      assert_true(sm.variance[sparse ? t.cols - 1 : 1] == 0);
      fl_ml_summary_free(&zs);
      fl_ml_data_free(z);
      z = NULL;
    }
    /* a summary of other data */
    fl_ml_summary other = sm;
    other.cols = sm.cols - 1;
    assert_fails_with(fl_ml_standardize(data, &other, false, &z), FL_EINVAL, "columns");
    assert_null(z);
    fl_ml_summary_free(&sm);
    fl_ml_data_free(data);
    table_free(&t);
  }

  /* blocks wider than the data (and its summary) are refused by the task, dense and sparse,
   * rather than read past the summary's arrays */
  for (int sparse = 0; sparse < 2; sparse++) {
    table t = table_mixed(40, 8, sparse, false, 7, 9);
    for (uint32_t i = 0; i < t.n; i++) t.x[(size_t)i * t.cols + 6] = 5.0 + i; /* stored everywhere */
    fl_ml_data *data = table_data(ctx, &t, 10, 2, false);
    data->cols = 3;
    fl_ml_summary sm = {.cols = 3};
    double arrays[12] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0};
    sm.mean = arrays, sm.variance = arrays + 3, sm.min = arrays + 6, sm.max = arrays + 9;
    fl_ml_data *z = NULL;
    fl_status s = fl_ml_standardize(data, &sm, false, &z);
    if (s == FL_OK) {
      uint64_t n;
      assert_fails_with(fl_count(z->blocks, &n), FL_EJOB, "features");
      fl_ml_data_free(z);
    } else {
      assert_int_equal(s, FL_EINVAL);
    }
    fl_ml_data_free(data);
    table_free(&t);
  }
  fl_context_close(ctx);
}

/* ---- 5. synthetic data --------------------------------------------------------------------- */

static table synth_rows(fl_context *ctx, fl_ml_synth_options o) {
  fl_ml_data *d;
  assert_ok(fl_ml_synthetic(ctx, &o, &d));
  assert_int_equal(d->rows, o.rows);
  assert_int_equal(d->cols, o.cols);
  assert_false(d->sparse);
  assert_false(d->weighted);
  if (o.partitions) assert_int_equal(fl_dataset_partitions(d->blocks), o.partitions);
  table t = data_rows(d);
  assert_int_equal(t.n, o.rows);
  fl_ml_data_free(d);
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Least squares of labels on [x, 1] by LAPACKE_dgels: the residual sum of squares; the
 * coefficients (cols + 1, the intercept last) into coef. */
static double least_squares(const table *t, double *coef) {
  uint32_t n = t->n, p = t->cols + 1;
  double *A = malloc((size_t)n * p * sizeof *A), *y = malloc(n * sizeof *y);
  assert_true(A && y);
  for (uint32_t i = 0; i < n; i++) {
    memcpy(A + (size_t)i * p, t->x + (size_t)i * t->cols, t->cols * sizeof *A);
    A[(size_t)i * p + t->cols] = 1.0;
    y[i] = t->labels[i];
  }
  assert_int_equal(LAPACKE_dgels(LAPACK_ROW_MAJOR, 'N', (lapack_int)n, (lapack_int)p, 1, A, (lapack_int)p, y, 1), 0);
  memcpy(coef, y, p * sizeof *coef);
  double rss = 0;
  for (uint32_t i = 0; i < n; i++) {
    double r = t->labels[i] - coef[t->cols];
    for (uint32_t j = 0; j < t->cols; j++) r -= coef[j] * t->x[(size_t)i * t->cols + j];
    rss += r * r;
  }
  free(A);
  free(y);
  return rss;
}

static void test_synthetic(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ml_synth_options o = {.kind = FL_ML_SYNTH_LINEAR, .rows = 2000, .cols = 5, .noise = 0.3, .seed = 42,
                           .rows_per_block = 64};

  /* the same rows in the same order whatever the partition count (and block size) */
  o.partitions = 1;
  table one = synth_rows(ctx, o);
  uint32_t parts[2] = {3, 8};
  for (int k = 0; k < 2; k++) {
    o.partitions = parts[k];
    o.rows_per_block = k ? 0 : 17;
    table t = synth_rows(ctx, o);
    assert_memory_equal(t.labels, one.labels, one.n * sizeof(double));
    assert_memory_equal(t.x, one.x, (size_t)one.n * one.cols * sizeof(double));
    table_free(&t);
  }
  o.rows_per_block = 64;
  o.partitions = 0; /* the default */
  {
    table t = synth_rows(ctx, o);
    assert_memory_equal(t.x, one.x, (size_t)one.n * one.cols * sizeof(double));
    table_free(&t);
  }
  /* another seed, other data */
  o.seed = 43;
  {
    table t = synth_rows(ctx, o);
    assert_memory_not_equal(t.x, one.x, (size_t)one.n * one.cols * sizeof(double));
    table_free(&t);
  }
  o.seed = 42;

  /* features: standard normal, and every value its own draw (no row repeats another's
   * values, as rows of overlapping random streams would) */
  {
    size_t nv = (size_t)one.n * one.cols;
    double *v = malloc(nv * sizeof *v);
    assert_non_null(v);
    memcpy(v, one.x, nv * sizeof *v);
    qsort(v, nv, sizeof *v, cmp_double);
    size_t repeats = 0;
    for (size_t i = 1; i < nv; i++) repeats += v[i] == v[i - 1];
    if (repeats) fprintf(stderr, "%zu of %zu synthetic feature values repeat\n", repeats, nv);
    assert_int_equal(repeats, 0);
    free(v);
    for (uint32_t j = 0; j < one.cols; j++) {
      double s = 0, s2 = 0;
      for (uint32_t i = 0; i < one.n; i++) s += one.x[(size_t)i * one.cols + j];
      double mean = s / one.n;
      for (uint32_t i = 0; i < one.n; i++) s2 += pow(one.x[(size_t)i * one.cols + j] - mean, 2);
      assert_true(fabs(mean) < 5 / sqrt(one.n));
      assert_true(fabs(s2 / (one.n - 1) - 1) < 0.1);
    }
    /* neighbouring rows are not correlated: x[i][j] against x[i + 2][j - 1] and x[i + 1][j] */
    for (int lag = 1; lag <= 2; lag++) {
      double sxy = 0, sxx = 0, syy = 0;
      for (uint32_t i = 0; i + lag < one.n; i++)
        for (uint32_t j = 1; j < one.cols; j++) {
          double a = one.x[(size_t)i * one.cols + j], b = one.x[(size_t)(i + lag) * one.cols + j - (lag == 2)];
          sxy += a * b, sxx += a * a, syy += b * b;
        }
      double corr = sxy / sqrt(sxx * syy);
      if (!(fabs(corr) < 0.1)) fprintf(stderr, "lag %d correlation %g\n", lag, corr);
      assert_true(fabs(corr) < 0.1);
    }
  }

  /* linear labels: noise 0.3 leaves a residual variance of about 0.09 around x.w + 0.5 */
  double coef[6];
  double rss = least_squares(&one, coef);
  double resid_var = rss / (one.n - one.cols - 1);
  if (!(fabs(resid_var - 0.09) < 0.015)) fprintf(stderr, "residual variance %g, want about 0.09\n", resid_var);
  assert_true(fabs(resid_var - 0.09) < 0.015);
  assert_true(fabs(coef[5] - 0.5) < 0.05);
  table_free(&one);
  /* noise 0: the labels are exactly affine in x, with intercept 0.5 */
  o.noise = 0;
  o.partitions = 3;
  {
    table t = synth_rows(ctx, o);
    rss = least_squares(&t, coef);
    assert_true(rss < 1e-20 * t.n);
    assert_close(coef[5], 0.5, 1e-12, "intercept");
    table_free(&t);
  }

  /* logistic: classes 2 gives 0/1, classes 5 gives each of 0..4 */
  uint32_t classes[2] = {2, 5};
  for (int k = 0; k < 2; k++) {
    fl_ml_synth_options lo = {.kind = FL_ML_SYNTH_LOGISTIC, .rows = 3000, .cols = 4, .classes = classes[k],
                              .seed = 5, .partitions = 4};
    table t = synth_rows(ctx, lo);
    uint32_t seen[5] = {0};
    for (uint32_t i = 0; i < t.n; i++) {
      double y = t.labels[i];
      assert_true(y >= 0 && y < classes[k] && y == floor(y));
      seen[(uint32_t)y]++;
    }
    for (uint32_t c = 0; c < classes[k]; c++) assert_true(seen[c] > 0);
    table_free(&t);
  }

  /* more partitions than rows */
  {
    fl_ml_synth_options so = {.kind = FL_ML_SYNTH_LINEAR, .rows = 5, .cols = 2, .seed = 1, .partitions = 8};
    table t = synth_rows(ctx, so);
    table_free(&t);
  }

  /* bad options */
  fl_ml_data *d = NULL;
  fl_ml_synth_options bad = {.kind = FL_ML_SYNTH_LINEAR, .rows = 0, .cols = 3};
  assert_fails_with(fl_ml_synthetic(ctx, &bad, &d), FL_EINVAL, "rows and cols");
  bad.rows = 10, bad.cols = 0;
  assert_fails_with(fl_ml_synthetic(ctx, &bad, &d), FL_EINVAL, "rows and cols");
  bad.cols = 3, bad.kind = FL_ML_SYNTH_LOGISTIC, bad.classes = 1;
  assert_fails_with(fl_ml_synthetic(ctx, &bad, &d), FL_EINVAL, "classes");
  bad.classes = 0;
  assert_fails_with(fl_ml_synthetic(ctx, &bad, &d), FL_EINVAL, "classes");
  bad.kind = (fl_ml_synth_kind)7, bad.classes = 2;
  assert_fails_with(fl_ml_synthetic(ctx, &bad, &d), FL_EINVAL, "unknown kind");
  assert_int_equal(fl_ml_synthetic(ctx, NULL, &d), FL_EINVAL);
  assert_null(d);
  fl_context_close(ctx);
}

/* ---- 6. models: prediction and evaluation -------------------------------------------------- */

/* A model made by hand, laid out as the library's: intercepts follow coef in one allocation. */
static fl_ml_model *model_new(fl_ml_model_kind kind, uint32_t cols, uint32_t classes, uint64_t seed) {
  fl_ml_model *m = calloc(1, sizeof *m);
  assert_non_null(m);
  m->kind = kind;
  m->cols = cols;
  m->classes = kind == FL_ML_LINEAR ? 1 : kind == FL_ML_LOGISTIC_BINARY ? 2 : classes;
  m->outputs = kind == FL_ML_LOGISTIC_MULTINOMIAL ? classes : 1;
  m->intercept = true;
  m->coef = malloc((size_t)m->outputs * (cols + 1) * sizeof *m->coef);
  assert_non_null(m->coef);
  m->intercepts = m->coef + (size_t)m->outputs * cols;
  uint64_t st = seed;
  for (size_t i = 0; i < (size_t)m->outputs * (cols + 1); i++) m->coef[i] = rng_uniform(&st, -1.5, 1.5);
  return m;
}

static double margin(const fl_ml_model *m, uint32_t k, const double *x) {
  double s = m->intercepts[k];
  for (uint32_t j = 0; j < m->cols; j++) s += m->coef[(size_t)k * m->cols + j] * x[j];
  return s;
}

/* Class probabilities by the textbook formulas: probs (classes values). */
static void reference_probs(const fl_ml_model *m, const double *x, double *probs) {
  if (m->kind == FL_ML_LOGISTIC_BINARY) {
    probs[1] = 1 / (1 + exp(-margin(m, 0, x)));
    probs[0] = 1 - probs[1];
    return;
  }
  double z[16], top = -INFINITY, sum = 0;
  for (uint32_t k = 0; k < m->outputs; k++) top = fmax(top, z[k] = margin(m, k, x));
  for (uint32_t k = 0; k < m->outputs; k++) sum += exp(z[k] - top);
  for (uint32_t k = 0; k < m->outputs; k++) probs[k] = exp(z[k] - top) / sum;
}

static void test_predict(void **state) {
  (void)state;
  uint64_t st = 11;
  double x[6], probs[4];
  fl_ml_model *lin = model_new(FL_ML_LINEAR, 6, 1, 1);
  for (int r = 0; r < 50; r++) {
    for (int j = 0; j < 6; j++) x[j] = rng_uniform(&st, -3, 3);
    assert_close_scaled(fl_ml_predict(lin, x, NULL), margin(lin, 0, x), 1e-14, 1.0, "linear", 0);
  }
  fl_ml_model_free(lin);

  fl_ml_model *bin = model_new(FL_ML_LOGISTIC_BINARY, 6, 2, 2);
  for (int r = 0; r < 200; r++) {
    for (int j = 0; j < 6; j++) x[j] = rng_uniform(&st, -3, 3);
    double want[2];
    reference_probs(bin, x, want);
    double cls = fl_ml_predict(bin, x, probs);
    assert_close_scaled(probs[1], want[1], 1e-14, 1e-3, "p1", 0);
    assert_close(probs[0] + probs[1], 1.0, 1e-15, "sum");
    assert_true(cls == (probs[1] >= 0.5 ? 1.0 : 0.0));
    assert_true(fl_ml_predict(bin, x, NULL) == cls);
  }
  /* a margin of exactly 0 is class 1 */
  memset(x, 0, sizeof x);
  bin->intercepts[0] = 0;
  assert_true(fl_ml_predict(bin, x, probs) == 1.0);
  assert_true(probs[0] == 0.5 && probs[1] == 0.5);
  fl_ml_model_free(bin);

  fl_ml_model *multi = model_new(FL_ML_LOGISTIC_MULTINOMIAL, 6, 4, 3);
  for (int r = 0; r < 200; r++) {
    for (int j = 0; j < 6; j++) x[j] = rng_uniform(&st, -3, 3);
    double want[4], sum = 0;
    reference_probs(multi, x, want);
    double cls = fl_ml_predict(multi, x, probs);
    uint32_t best = 0;
    for (uint32_t k = 0; k < 4; k++) {
      assert_close_scaled(probs[k], want[k], 1e-13, 1e-3, "pk", k);
      sum += probs[k];
      if (margin(multi, k, x) > margin(multi, best, x)) best = k;
    }
    assert_close(sum, 1.0, 1e-14, "sum");
    assert_true(cls == best);
    assert_true(fl_ml_predict(multi, x, NULL) == cls);
  }
  fl_ml_model_free(multi);
  fl_ml_model_free(NULL);
}

/* Rows for model m: x uniform, labels from the model itself (drawn from its probabilities,
 * or its prediction plus noise), weights when asked. */
static table model_table(const fl_ml_model *m, uint32_t n, bool weighted, bool sparse, uint64_t seed) {
  table t = table_new(n, m->cols, sparse, weighted);
  uint64_t st = seed;
  double probs[16];
  for (uint32_t i = 0; i < n; i++) {
    double *x = t.x + (size_t)i * m->cols;
    for (uint32_t j = 0; j < m->cols; j++) x[j] = sparse && rng_next(&st) % 2 ? 0.0 : rng_uniform(&st, -2, 2);
    if (sparse && i % 9 == 0) memset(x, 0, m->cols * sizeof *x);
    if (weighted) t.weights[i] = rng_uniform(&st, 0.1, 2.0);
    if (m->kind == FL_ML_LINEAR) {
      t.labels[i] = margin(m, 0, x) + rng_uniform(&st, -1, 1);
      continue;
    }
    reference_probs(m, x, probs);
    double u = rng_uniform(&st, 0, 1);
    uint32_t k = 0;
    while (k + 1 < m->classes && u >= probs[k]) u -= probs[k++];
    t.labels[i] = k;
  }
  return t;
}

typedef struct reference_metrics {
  double W, rmse, r2, accuracy, log_loss, auc;
} reference_metrics;

static reference_metrics reference_evaluate(const fl_ml_model *m, const table *t) {
  reference_metrics r = {0};
  long double Wt = 0, sse = 0, wy = 0, sst = 0, correct = 0, ll = 0;
  double *score = malloc(t->n * sizeof *score);
  assert_non_null(score);
  for (uint32_t i = 0; i < t->n; i++) Wt += weight_of(t, i), wy += weight_of(t, i) * t->labels[i];
  double ybar = (double)(wy / Wt);
  for (uint32_t i = 0; i < t->n; i++) {
    const double *x = t->x + (size_t)i * t->cols;
    double w = weight_of(t, i), y = t->labels[i];
    if (m->kind == FL_ML_LINEAR) {
      double e = margin(m, 0, x) - y;
      sse += w * e * e;
      sst += w * (y - ybar) * (y - ybar);
      continue;
    }
    double probs[16];
    reference_probs(m, x, probs);
    uint32_t cls = m->kind == FL_ML_LOGISTIC_BINARY ? y > 0 : (uint32_t)y, best = 0;
    for (uint32_t k = 1; k < m->classes; k++)
      if (probs[k] > probs[best]) best = k;
    if (m->kind == FL_ML_LOGISTIC_BINARY) best = probs[1] >= 0.5;
    correct += w * (best == cls);
    ll -= w * log(probs[cls]);
    score[i] = probs[1];
  }
  r.W = (double)Wt;
  r.rmse = sqrt((double)(sse / Wt));
  r.r2 = (double)(1 - sse / sst);
  r.accuracy = (double)(correct / Wt);
  r.log_loss = (double)(ll / Wt);
  if (m->kind == FL_ML_LOGISTIC_BINARY) { /* every positive against every negative */
    long double area = 0, P = 0, N = 0;
    for (uint32_t i = 0; i < t->n; i++) {
      if (t->labels[i] > 0) P += weight_of(t, i);
      else N += weight_of(t, i);
    }
    for (uint32_t i = 0; i < t->n; i++) {
      if (!(t->labels[i] > 0)) continue;
      for (uint32_t k = 0; k < t->n; k++) {
        if (t->labels[k] > 0) continue;
        double pair = score[i] > score[k] ? 1.0 : score[i] == score[k] ? 0.5 : 0.0;
        area += (long double)weight_of(t, i) * weight_of(t, k) * pair;
      }
    }
    r.auc = (double)(area / (P * N));
  }
  free(score);
  return r;
}

static void check_metrics(const fl_ml_model *m, const fl_ml_data *d, const table *t) {
  fl_ml_metrics got;
  assert_ok(fl_ml_evaluate(m, d, &got));
  reference_metrics want = reference_evaluate(m, t);
  assert_int_equal(got.rows, t->n);
  assert_close(got.weight_sum, want.W, 1e-12, "weight_sum");
  if (m->kind == FL_ML_LINEAR) {
    assert_close(got.rmse, want.rmse, 1e-10, "rmse");
    /* 1e-8: about labels near 1e8 a mean is good to 1.5e-8 (without care, not to 1e-4) */
    assert_close(got.r2, want.r2, 1e-8, "r2");
    assert_true(isnan(got.accuracy) && isnan(got.log_loss) && isnan(got.auc));
    return;
  }
  assert_true(isnan(got.rmse) && isnan(got.r2));
  assert_close(got.accuracy, want.accuracy, 1e-12, "accuracy");
  assert_close(got.log_loss, want.log_loss, 1e-10, "log_loss");
  if (m->kind == FL_ML_LOGISTIC_BINARY) {
    if (!(fabs(got.auc - want.auc) <= 1e-3)) fprintf(stderr, "auc %.6f, exact %.6f\n", got.auc, want.auc);
    assert_true(fabs(got.auc - want.auc) <= 1e-3);
    assert_true(want.auc > 0.6); /* the labels follow the model: a real test of the ranking */
  } else {
    assert_true(isnan(got.auc));
  }
}

static void run_model_checks(fl_context *ctx) {
  const fl_ml_model_kind kinds[3] = {FL_ML_LINEAR, FL_ML_LOGISTIC_BINARY, FL_ML_LOGISTIC_MULTINOMIAL};
  for (int k = 0; k < 3; k++) {
    fl_ml_model *m = model_new(kinds[k], 5, 3, 20 + k);
    for (int variant = 0; variant < 3; variant++) { /* dense, dense weighted, sparse weighted */
      bool weighted = variant > 0, sparse = variant == 2;
      table t = model_table(m, 700, weighted, sparse, 300 + 10 * k + variant);
      fl_ml_data *d = table_data(ctx, &t, 64, 4, variant == 1);
      check_metrics(m, d, &t);
      fl_ml_data_free(d);
      if (kinds[k] == FL_ML_LOGISTIC_BINARY) { /* the same with -1/+1 labels */
        for (uint32_t i = 0; i < t.n; i++) t.labels[i] = t.labels[i] > 0 ? 1.0 : -1.0;
        d = table_data(ctx, &t, 64, 4, false);
        check_metrics(m, d, &t);
        fl_ml_data_free(d);
      }
      table_free(&t);
    }
    fl_ml_model_free(m);
  }
  /* a linear model whose labels sit near 1e8 (the spread about 2): R^2 keeps its digits */
  fl_ml_model *m = model_new(FL_ML_LINEAR, 3, 1, 99);
  m->intercepts[0] = 1e8;
  table t = model_table(m, 900, true, false, 123);
  fl_ml_data *d = table_data(ctx, &t, 50, 4, false);
  check_metrics(m, d, &t);
  fl_ml_data_free(d);
  table_free(&t);
  fl_ml_model_free(m);
}

static void test_evaluate(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  run_model_checks(ctx);

  /* sparse data narrower than the model is evaluated as its zero-padded rows */
  fl_ml_model *bin = model_new(FL_ML_LOGISTIC_BINARY, 6, 2, 5);
  {
    table t = model_table(bin, 300, false, true, 77);
    for (uint32_t i = 0; i < t.n; i++) t.x[(size_t)i * 6 + 5] = 0; /* no block reaches column 5 */
    fl_ml_data *d = table_data(ctx, &t, 30, 3, false);
    d->cols = 5;
    check_metrics(bin, d, &t);
    fl_ml_data_free(d);
    table_free(&t);
  }

  /* labels that are not classes of the model */
  struct {
    fl_ml_model_kind kind;
    double label;
  } bad[] = {{FL_ML_LOGISTIC_BINARY, 2},          {FL_ML_LOGISTIC_BINARY, 0.5},
             {FL_ML_LOGISTIC_BINARY, -0.5},       {FL_ML_LOGISTIC_BINARY, -2},
             {FL_ML_LOGISTIC_MULTINOMIAL, 3},     {FL_ML_LOGISTIC_MULTINOMIAL, -1},
             {FL_ML_LOGISTIC_MULTINOMIAL, 1.5},   {FL_ML_LOGISTIC_BINARY, NAN}};
  for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
    fl_ml_model *m = model_new(bad[c].kind, 4, 3, 9);
    table t = model_table(m, 40, false, false, 5);
    t.labels[17] = bad[c].label;
    fl_ml_data *d = table_data(ctx, &t, 8, 2, false);
    fl_ml_metrics mt;
    fl_status s = fl_ml_evaluate(m, d, &mt);
    if (s != FL_EJOB) fprintf(stderr, "label %g on a %d model: %s\n", bad[c].label, (int)bad[c].kind, fl_status_name(s));
    assert_fails_with(s, FL_EJOB, "not a class");
    fl_ml_data_free(d);
    table_free(&t);
    fl_ml_model_free(m);
  }

  /* data wider than the model; nothing to evaluate */
  {
    table t = model_table(bin, 10, false, false, 1);
    fl_ml_data *d = table_data(ctx, &t, 0, 2, false);
    d->cols = 7;
    fl_ml_metrics mt;
    assert_fails_with(fl_ml_evaluate(bin, d, &mt), FL_EINVAL, "features");
    fl_ml_data_free(d);
    t.n = 0;
    d = table_data(ctx, &t, 0, 2, false);
    assert_int_equal(fl_ml_evaluate(bin, d, &mt), FL_EEMPTY);
    fl_ml_data_free(d);
    table_free(&t);
  }
  fl_ml_model_free(bin);
  fl_context_close(ctx);
}

/* ---- 7. model files ------------------------------------------------------------------------ */

static void test_model_files(void **state) {
  (void)state;
  char dir[256], path[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/model.txt", dir);

  /* round trips are exact, awkward values included */
  const double awkward[] = {-0.0, 5e-324, 1e-310, -2.2250738585072014e-308, DBL_MAX, -DBL_MAX, 1.0 / 3,
                            M_PI, 0.1, 1e300, -123456789.0, 0};
  const size_t na = sizeof awkward / sizeof awkward[0];
  const fl_ml_model_kind kinds[3] = {FL_ML_LINEAR, FL_ML_LOGISTIC_BINARY, FL_ML_LOGISTIC_MULTINOMIAL};
  for (int k = 0; k < 3; k++) {
    for (int intercept = 0; intercept < 2; intercept++) {
      fl_ml_model *m = model_new(kinds[k], 7, 4, 50 + k);
      m->intercept = intercept;
      size_t n = (size_t)m->outputs * (m->cols + 1);
      for (size_t i = 0; i < n; i += 2) m->coef[i] = awkward[(i / 2) % na];
      if (!intercept) memset(m->intercepts, 0, m->outputs * sizeof(double));
      assert_ok(fl_ml_model_save(m, path));
      fl_ml_model *r = NULL;
      assert_ok(fl_ml_model_load(path, &r));
      assert_int_equal(r->kind, m->kind);
      assert_int_equal(r->cols, m->cols);
      assert_int_equal(r->classes, m->classes);
      assert_int_equal(r->outputs, m->outputs);
      assert_int_equal(r->intercept, m->intercept);
      assert_memory_equal(r->coef, m->coef, (size_t)m->outputs * m->cols * sizeof(double));
      assert_memory_equal(r->intercepts, m->intercepts, m->outputs * sizeof(double));
      assert_null(r->history);
      fl_ml_model_free(r);
      fl_ml_model_free(m);
    }
  }

  /* bad files: FL_EFORMAT naming the file and, where one line is wrong, its number */
  static const char good[] = "flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\n"
                             "intercepts 0.5\ncoef 1 2\nend\n";
  test_write_file(path, good, sizeof good - 1);
  fl_ml_model *m = NULL;
  assert_ok(fl_ml_model_load(path, &m));
  assert_true(m->coef[0] == 1 && m->coef[1] == 2 && m->intercepts[0] == 0.5);
  fl_ml_model_free(m);
  m = NULL;

  static const struct {
    const char *text, *where, *what;
  } cases[] = {
      {"hello\n", ":1:", "not a flint model"},
      {"", ":1:", "ends"},
      {"flint-model 2\nkind linear\n", ":1:", "not a flint model"},
      {"flint-model 1\nkind forest\ncols 2\n", ":2:", "unknown model kind"},
      {"flint-model 1\nkind linear\ncols two\n", ":3:", "cols"},
      {"flint-model 1\nkind logistic-binary\ncols 2\nclasses 2\noutputs 2\nintercept 1\nintercepts 0 0\ncoef 1 2\n"
       "coef 1 2\nend\n",
       "", "inconsistent shape"},
      {"flint-model 1\nkind logistic-multinomial\ncols 2\nclasses 3\noutputs 2\nintercept 1\n", "", "inconsistent shape"},
      {"flint-model 1\nkind linear\ncols 0\nclasses 1\noutputs 1\nintercept 1\n", "", "inconsistent shape"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1\nend\n", ":8:",
       "missing"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts\ncoef 1 2\nend\n", ":7:",
       "missing"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 nan\nend\n",
       ":8:", "finite"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef inf 1\nend\n",
       ":8:", "finite"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 2 3\nend\n",
       ":8:", "more than 2"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 2x\nend\n",
       ":8:", "more than 2"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 2\n", ":9:",
       "'end'"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 2\nfin\n",
       ":9:", "'end'"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\ncoef 1 2\nend\nmore\n",
       ":10:", "after 'end'"},
      {"flint-model 1\nkind linear\ncols 2\nclasses 1\noutputs 1\nintercept 1\nintercepts 0.5\nwhat 1 2\nend\n",
       ":8:", "'coef'"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    test_write_file(path, cases[c].text, strlen(cases[c].text));
    fl_status s = fl_ml_model_load(path, &m);
    if (s != FL_EFORMAT || !strstr(fl_last_error(), path) || !strstr(fl_last_error(), cases[c].where) ||
        !strstr(fl_last_error(), cases[c].what))
      fprintf(stderr, "case %zu: %s: %s\n", c, fl_status_name(s), fl_last_error());
    assert_int_equal(s, FL_EFORMAT);
    assert_non_null(strstr(fl_last_error(), path));
    assert_non_null(strstr(fl_last_error(), cases[c].where));
    assert_non_null(strstr(fl_last_error(), cases[c].what));
    assert_null(m);
  }
  /* a saved multinomial file cut anywhere is refused */
  {
    fl_ml_model *mm = model_new(FL_ML_LOGISTIC_MULTINOMIAL, 3, 3, 8);
    assert_ok(fl_ml_model_save(mm, path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char whole[4096];
    size_t len = fread(whole, 1, sizeof whole, f);
    fclose(f);
    assert_true(len > 0 && len < sizeof whole);
    for (size_t cut = 0; cut < len - 1; cut += 7) { /* every cut short of the final newline */
      test_write_file(path, whole, cut);
      fl_status s = fl_ml_model_load(path, &m);
      if (s != FL_EFORMAT) fprintf(stderr, "cut at %zu of %zu: %s\n", cut, len, fl_status_name(s));
      assert_int_equal(s, FL_EFORMAT);
      assert_non_null(strstr(fl_last_error(), path));
      assert_null(m);
    }
    fl_ml_model_free(mm);
  }
  char missing[600];
  snprintf(missing, sizeof missing, "%s/no-such-model.txt", dir);
  assert_fails_with(fl_ml_model_load(missing, &m), FL_ENOENT, missing);
  assert_null(m);
  char unwritable[600];
  snprintf(unwritable, sizeof unwritable, "%s/no-such-dir/model.txt", dir);
  fl_ml_model *w = model_new(FL_ML_LINEAR, 2, 1, 1);
  assert_fails_with(fl_ml_model_save(w, unwritable), FL_EIO, "no-such-dir");
  /* what could not be read back is not written: a non-finite value, a bad kind or shape */
  char refused[600];
  snprintf(refused, sizeof refused, "%s/refused.txt", dir);
  w->coef[1] = NAN;
  assert_fails_with(fl_ml_model_save(w, refused), FL_EINVAL, "finite");
  w->coef[1] = 1;
  w->intercepts[0] = -INFINITY;
  assert_fails_with(fl_ml_model_save(w, refused), FL_EINVAL, "finite");
  w->intercepts[0] = 0;
  w->kind = (fl_ml_model_kind)7;
  assert_fails_with(fl_ml_model_save(w, refused), FL_EINVAL, "kind");
  w->kind = FL_ML_LINEAR;
  w->outputs = 0;
  assert_fails_with(fl_ml_model_save(w, refused), FL_EINVAL, "shape");
  w->outputs = 1;
  assert_int_equal(access(refused, F_OK), -1);
  assert_ok(fl_ml_model_save(w, refused));
  fl_ml_model_free(w);
  test_rmtree(dir);
}

/* ---- 8. the same on a local cluster -------------------------------------------------------- */

static void test_cluster(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open(CLUSTER, NULL, &ctx));
  /* Executors dlopen libflint_ml with RTLD_NOW: while ml/optimize.c is not in the tree, the
   * library's references to fl_ml_minimize and fl_ml_optim_result_free cannot be bound
   * there ("undefined symbol" in the executors' log), and no ml task can run. */
  {
    table t = table_mixed(10, 3, false, false, 7, 1);
    fl_ml_data *d = table_data(ctx, &t, 0, 2, false);
    fl_ml_summary s;
    fl_status st = fl_ml_summarize(d, &s);
    fl_ml_data_free(d);
    table_free(&t);
    assert_ok(st);
    fl_ml_summary_free(&s);
  }
  run_summary_checks(ctx);
  run_model_checks(ctx);
  fl_context_close(ctx);
}

int main(void) {
  /* Local clusters start the flint command: next to this program unless FLINT_BIN says. */
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    setenv("FLINT_BIN", self, 0);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_block_round_trip),
      cmocka_unit_test(test_block_splits_and_alignment),
      cmocka_unit_test(test_block_corrupt),
      cmocka_unit_test(test_summarize),
      cmocka_unit_test(test_standardize),
      cmocka_unit_test(test_synthetic),
      cmocka_unit_test(test_predict),
      cmocka_unit_test(test_evaluate),
      cmocka_unit_test(test_model_files),
      cmocka_unit_test(test_cluster),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
