/* test_ml_load.c: fl_ml_load on LIBSVM, CSV and IDX files written here (and Fashion-MNIST
 * where installed): exact contents, the same rows whatever the partition count, every error
 * naming file, line and cause, skipped bad lines, and the kernels run by real executors. */
#include <math.h>
#include <zlib.h>

#include "flint/ml.h"
#include "test_util.h"

#define FASHION "/usr/share/datasets/fashion-mnist"

static fl_context *ctx;
static char dir[256];

static int setup(void **state) {
  (void)state;
  if (fl_context_open("local[2]", NULL, &ctx) != FL_OK) return -1;
  test_tmpdir(dir, sizeof dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  fl_context_close(ctx);
  test_rmtree(dir);
  return 0;
}

/* A file under the test's folder; returns its path (static storage, one of four). */
static const char *write_file(const char *name, const char *text) {
  static char paths[4][512];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, 512, "%s/%s", dir, name);
  test_write_file(p, text, strlen(text));
  return p;
}

/* ---- the rows of a loaded dataset, flattened --------------------------------------------- */

typedef struct table {
  size_t rows, nnz;
  uint32_t width;
  double labels[256];
  size_t start[257];
  uint32_t col[4096];
  double val[4096];
  size_t blocks;
} table;

/* Collects every block in order; dense rows keep all their columns. */
static void read_table(const fl_ml_data *data, table *t) {
  memset(t, 0, sizeof *t);
  fl_records *r;
  assert_ok(fl_collect(data->blocks, &r));
  fl_buf scratch = FL_BUF_INIT;
  t->blocks = fl_records_count(r);
  for (size_t i = 0; i < fl_records_count(r); i++) {
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_records_get(r, i), &scratch, &b));
    assert_int_equal(b.sparse, data->sparse);
    assert_null(b.weights);
    if (b.cols > t->width) t->width = b.cols;
    for (uint32_t k = 0; k < b.rows; k++) {
      assert_true(t->rows < 256);
      t->labels[t->rows] = b.labels[k];
      t->start[t->rows] = t->nnz;
      if (b.sparse) {
        for (uint64_t j = b.row_ptr[k]; j < b.row_ptr[k + 1]; j++) {
          t->col[t->nnz] = b.col[j];
          t->val[t->nnz++] = b.x[j];
        }
      } else {
        for (uint32_t j = 0; j < b.cols; j++) {
          t->col[t->nnz] = j;
          t->val[t->nnz++] = b.x[(size_t)k * b.cols + j];
        }
      }
      t->rows++;
    }
  }
  t->start[t->rows] = t->nnz;
  fl_buf_free(&scratch);
  fl_records_free(r);
}

static void assert_tables_equal(const table *a, const table *b) {
  assert_int_equal(a->rows, b->rows);
  assert_int_equal(a->nnz, b->nnz);
  assert_memory_equal(a->labels, b->labels, a->rows * sizeof(double));
  assert_memory_equal(a->start, b->start, (a->rows + 1) * sizeof(size_t));
  assert_memory_equal(a->col, b->col, a->nnz * sizeof(uint32_t));
  assert_memory_equal(a->val, b->val, a->nnz * sizeof(double));
}

/* Row i holds exactly the given (column, value) pairs. */
static void assert_row(const table *t, size_t i, double label, const uint32_t *cols, const double *vals, size_t n) {
  assert_true(i < t->rows);
  assert_true(t->labels[i] == label);
  assert_int_equal(t->start[i + 1] - t->start[i], n);
  for (size_t k = 0; k < n; k++) {
    assert_int_equal(t->col[t->start[i] + k], cols[k]);
    assert_true(t->val[t->start[i] + k] == vals[k]);
  }
}

static fl_ml_data *load(const char *path, fl_ml_format format, const fl_ml_load_options *opt) {
  fl_ml_data *data = NULL;
  assert_ok(fl_ml_load(ctx, path, format, opt, &data));
  assert_non_null(data);
  assert_non_null(data->blocks);
  return data;
}

/* ---- LIBSVM ------------------------------------------------------------------------------ */

static const char small_libsvm[] =
    "1 1:0.5 3:2.5 # a comment\n"
    "-1 2:1e-3\n"
    "\n"
    "0 1:1 2:2 3:3 10:4\n"
    "   +1.5\t4:7   \n"
    "# only a comment\n"
    "2\n";

static void check_small_libsvm(const table *t) {
  assert_int_equal(t->rows, 5);
  assert_row(t, 0, 1, (uint32_t[]){0, 2}, (double[]){0.5, 2.5}, 2);
  assert_row(t, 1, -1, (uint32_t[]){1}, (double[]){1e-3}, 1);
  assert_row(t, 2, 0, (uint32_t[]){0, 1, 2, 9}, (double[]){1, 2, 3, 4}, 4);
  assert_row(t, 3, 1.5, (uint32_t[]){3}, (double[]){7}, 1);
  assert_row(t, 4, 2, NULL, NULL, 0);
}

static void libsvm_small(fl_context *c, const char *path) {
  table *first = malloc(sizeof *first), *t = malloc(sizeof *t);
  assert_non_null(first);
  assert_non_null(t);
  uint32_t parts[] = {1, 3, 7};
  for (size_t i = 0; i < 3; i++) {
    fl_ml_load_options opt = {.partitions = parts[i]};
    fl_ml_data *data = NULL;
    assert_ok(fl_ml_load(c, path, FL_ML_LIBSVM, &opt, &data));
    assert_int_equal(fl_dataset_partitions(data->blocks), parts[i]);
    assert_int_equal(data->rows, 5);
    assert_int_equal(data->cols, 10);
    assert_true(data->sparse);
    assert_false(data->weighted);
    assert_int_equal(data->skipped, 0);
    fl_storage_info info;
    assert_ok(fl_storage_info_get(data->blocks, &info));
    assert_int_equal(info.level, FL_MEMORY_AND_DISK);
    read_table(data, i == 0 ? first : t);
    check_small_libsvm(i == 0 ? first : t);
    if (i > 0) assert_tables_equal(first, t);
    fl_ml_data_free(data);
  }
  free(first);
  free(t);
}

static void test_libsvm_small(void **state) {
  (void)state;
  libsvm_small(ctx, write_file("small.libsvm", small_libsvm));
}

static void test_libsvm_options(void **state) {
  (void)state;
  const char *path = write_file("small.libsvm", small_libsvm);
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  /* Two rows per block: several blocks, same rows. */
  fl_ml_load_options opt = {.partitions = 2, .rows_per_block = 2, .num_features = 20};
  fl_ml_data *data = load(path, FL_ML_LIBSVM, &opt);
  assert_int_equal(data->rows, 5);
  assert_int_equal(data->cols, 20);
  read_table(data, t);
  check_small_libsvm(t);
  assert_true(t->blocks >= 3);
  fl_ml_data_free(data);

  /* zero_based: indices as written, 0 allowed. */
  path = write_file("zero.libsvm", "3 0:1.25 2:-2\n4 5:1\n");
  fl_ml_load_options zero = {.zero_based = true, .partitions = 3};
  data = load(path, FL_ML_LIBSVM, &zero);
  assert_int_equal(data->rows, 2);
  assert_int_equal(data->cols, 6);
  read_table(data, t);
  assert_row(t, 0, 3, (uint32_t[]){0, 2}, (double[]){1.25, -2}, 2);
  assert_row(t, 1, 4, (uint32_t[]){5}, (double[]){1}, 1);
  fl_ml_data_free(data);
  free(t);
}

/* A folder of files: rows in file order, and an error names the file and its own line. */
static void test_libsvm_folder(void **state) {
  (void)state;
  char sub[512], path[600];
  snprintf(sub, sizeof sub, "%s/parts", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  snprintf(path, sizeof path, "%s/part-0", sub);
  test_write_file(path, "1 1:1\n2 1:2\n", 12);
  snprintf(path, sizeof path, "%s/part-1", sub);
  test_write_file(path, "3 1:3\n4 0:4\n", 12);
  snprintf(path, sizeof path, "%s/_SUCCESS", sub);
  test_write_file(path, "", 0);
  fl_ml_data *data = NULL;
  fl_ml_load_options opt = {.partitions = 3};
  fl_status s = fl_ml_load(ctx, sub, FL_ML_LIBSVM, &opt, &data);
  assert_int_not_equal(s, FL_OK);
  assert_non_null(strstr(fl_last_error(), "part-1:2: index 0 in a 1-based file"));
  snprintf(path, sizeof path, "%s/part-1", sub);
  test_write_file(path, "3 1:3\n4 1:4\n", 12);
  data = load(sub, FL_ML_LIBSVM, &opt);
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  read_table(data, t);
  assert_int_equal(t->rows, 4);
  for (size_t i = 0; i < 4; i++) assert_row(t, i, (double)(i + 1), (uint32_t[]){0}, (double[]){(double)(i + 1)}, 1);
  fl_ml_data_free(data);
  free(t);
}

/* ---- CSV --------------------------------------------------------------------------------- */

static void test_csv(void **state) {
  (void)state;
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  /* No header, label last (the default), blanks around fields and blank lines. */
  const char *path = write_file("plain.csv", "1,2,3\n\n 4 , 5,6.5\n-1e2,0,7\n");
  fl_ml_load_options opt = {.label_column = -1, .partitions = 3};
  fl_ml_data *data = load(path, FL_ML_CSV, &opt);
  assert_int_equal(data->rows, 3);
  assert_int_equal(data->cols, 2);
  assert_false(data->sparse);
  read_table(data, t);
  assert_row(t, 0, 3, (uint32_t[]){0, 1}, (double[]){1, 2}, 2);
  assert_row(t, 1, 6.5, (uint32_t[]){0, 1}, (double[]){4, 5}, 2);
  assert_row(t, 2, 7, (uint32_t[]){0, 1}, (double[]){-1e2, 0}, 2);
  fl_ml_data_free(data);

  /* Header, label first: only the file's first line is skipped, whatever the partitions. */
  char text[4096] = "label,a,b\n";
  for (int i = 0; i < 40; i++) snprintf(text + strlen(text), sizeof text - strlen(text), "%d,%d,%d\n", i, 10 * i, -i);
  path = write_file("header.csv", text);
  for (uint32_t parts = 1; parts <= 7; parts += 3) {
    fl_ml_load_options h = {.header = true, .label_column = 0, .partitions = parts};
    data = load(path, FL_ML_CSV, &h);
    assert_int_equal(data->rows, 40);
    assert_int_equal(data->cols, 2);
    assert_int_equal(fl_dataset_partitions(data->blocks), parts);
    read_table(data, t);
    for (int i = 0; i < 40; i++) assert_row(t, (size_t)i, i, (uint32_t[]){0, 1}, (double[]){10.0 * i, -i}, 2);
    fl_ml_data_free(data);
  }

  /* ';' and a label in the middle. */
  path = write_file("semi.csv", "1;2;3;4\n5;6;7;8\n");
  fl_ml_load_options semi = {.delimiter = ';', .label_column = 1};
  data = load(path, FL_ML_CSV, &semi);
  assert_int_equal(data->rows, 2);
  assert_int_equal(data->cols, 3);
  read_table(data, t);
  assert_row(t, 0, 2, (uint32_t[]){0, 1, 2}, (double[]){1, 3, 4}, 3);
  assert_row(t, 1, 6, (uint32_t[]){0, 1, 2}, (double[]){5, 7, 8}, 3);
  fl_ml_data_free(data);

  /* Without the header option the header is a bad line. */
  fl_ml_load_options no_header = {.label_column = -1};
  assert_int_not_equal(fl_ml_load(ctx, write_file("h.csv", "y,x\n1,2\n"), FL_ML_CSV, &no_header, &data), FL_OK);
  assert_non_null(strstr(fl_last_error(), "h.csv:1: field 1 'y' is not a number"));
  free(t);
}

/* ---- IDX --------------------------------------------------------------------------------- */

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

/* An idx file: magic, dims, then `len` bytes of data; gzip'd when gz. */
static const char *write_idx(const char *name, uint32_t magic, const uint32_t *dims, int ndims, const uint8_t *data,
                             size_t len, bool gz) {
  static char paths[4][512];
  static int next;
  char *p = paths[next++ % 4];
  snprintf(p, 512, "%s/%s", dir, name);
  uint8_t buf[4096];
  assert_true(4 + 4 * (size_t)ndims + len <= sizeof buf);
  put_be32(buf, magic);
  for (int i = 0; i < ndims; i++) put_be32(buf + 4 + 4 * i, dims[i]);
  if (len) memcpy(buf + 4 + 4 * ndims, data, len);
  size_t total = 4 + 4 * (size_t)ndims + len;
  if (!gz) {
    test_write_file(p, buf, total);
  } else {
    gzFile f = gzopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, buf, (unsigned)total), (int)total);
    assert_int_equal(gzclose(f), Z_OK);
  }
  return p;
}

static const uint8_t pixels[3 * 6] = {0, 1, 2, 3, 4, 255, 10, 20, 30, 40, 50, 60, 255, 254, 0, 0, 7, 9};
static const uint8_t classes[3] = {7, 0, 9};

static void test_idx_small(void **state) {
  (void)state;
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  for (int gz = 0; gz < 2; gz++) {
    const char *images = write_idx(gz ? "img.idx3-ubyte.gz" : "img.idx3-ubyte", 0x803, (uint32_t[]){3, 2, 3}, 3,
                                   pixels, sizeof pixels, gz);
    const char *labels = write_idx(gz ? "lab.idx1-ubyte.gz" : "lab.idx1-ubyte", 0x801, (uint32_t[]){3}, 1, classes,
                                   sizeof classes, gz);
    for (int scaled = 0; scaled < 2; scaled++) {
      double scale = scaled ? 0.5 : 1.0 / 255;
      fl_ml_load_options opt = {.labels_path = labels, .pixel_scale = scaled ? 0.5 : 0, .partitions = 2};
      fl_ml_data *data = load(images, FL_ML_IDX, &opt);
      assert_int_equal(data->rows, 3);
      assert_int_equal(data->cols, 6);
      assert_false(data->sparse);
      assert_int_equal(fl_dataset_partitions(data->blocks), 2);
      read_table(data, t);
      assert_true(t->blocks >= 2);
      for (size_t i = 0; i < 3; i++) {
        double want[6];
        for (int k = 0; k < 6; k++) want[k] = pixels[i * 6 + (size_t)k] * scale;
        assert_row(t, i, classes[i], (uint32_t[]){0, 1, 2, 3, 4, 5}, want, 6);
      }
      fl_ml_data_free(data);
    }
  }
  free(t);
}

static void test_idx_fashion_mnist(void **state) {
  (void)state;
  const char *images = FASHION "/train-images-idx3-ubyte.gz", *labels = FASHION "/train-labels-idx1-ubyte.gz";
  if (access(images, R_OK) != 0 || access(labels, R_OK) != 0) {
    print_message("Fashion-MNIST is not installed under " FASHION ": skipped\n");
    skip();
  }
  fl_ml_load_options opt = {.labels_path = labels};
  fl_ml_data *data = load(images, FL_ML_IDX, &opt);
  assert_int_equal(data->rows, 60000);
  assert_int_equal(data->cols, 784);
  assert_false(data->sparse);
  fl_records *r;
  assert_ok(fl_collect(data->blocks, &r));
  assert_true(fl_records_count(r) >= fl_dataset_partitions(data->blocks));
  fl_buf scratch = FL_BUF_INIT;
  uint64_t rows = 0, seen[10] = {0};
  double max_pixel = 0;
  for (size_t i = 0; i < fl_records_count(r); i++) {
    fl_ml_block b;
    assert_ok(fl_ml_block_view(fl_records_get(r, i), &scratch, &b));
    for (uint32_t k = 0; k < b.rows; k++) {
      double label = b.labels[k];
      assert_true(label >= 0 && label <= 9 && label == floor(label));
      seen[(int)label]++;
    }
    for (size_t k = 0; k < (size_t)b.rows * b.cols; k++) {
      assert_true(b.x[k] >= 0 && b.x[k] <= 1);
      if (b.x[k] > max_pixel) max_pixel = b.x[k];
    }
    rows += b.rows;
  }
  assert_int_equal(rows, 60000);
  for (int c = 0; c < 10; c++) assert_int_equal(seen[c], 6000); /* Fashion-MNIST is balanced */
  assert_true(max_pixel == 1.0);
  fl_buf_free(&scratch);
  fl_records_free(r);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(data->blocks, &info));
  assert_int_equal(info.cached_partitions, info.partitions);
  double raw = 60000.0 * (784 + 1) * 8;
  print_message("Fashion-MNIST cached: %llu bytes, %.4fx the raw %.0f\n", (unsigned long long)info.memory_bytes,
                info.memory_bytes / raw, raw);
  assert_true(info.memory_bytes >= raw);
  assert_true(info.memory_bytes <= 1.05 * raw);
  fl_ml_data_free(data);
}

/* ---- errors ------------------------------------------------------------------------------ */

/* Loads `text` as file `name` and expects a failure whose message names the file, the line
 * ("name:line:") and the cause. Bad lines fail a job (FL_EFORMAT); checks on the client fail
 * with their own code. */
static void expect_error(const char *name, const char *text, fl_ml_format format, const fl_ml_load_options *opt,
                         fl_status status, unsigned line, const char *cause) {
  const char *path = write_file(name, text);
  fl_ml_data *data = (fl_ml_data *)1;
  fl_status s = fl_ml_load(ctx, path, format, opt, &data);
  char where[128];
  snprintf(where, sizeof where, "%s:%u: ", name, line);
  const char *msg = fl_last_error();
  if (s != status || !strstr(msg, where) || !strstr(msg, cause))
    fprintf(stderr, "%s: got %s '%s', expected %s '%s%s'\n", name, fl_status_name(s), msg, fl_status_name(status),
            where, cause);
  assert_int_equal(s, status);
  assert_non_null(strstr(msg, where));
  assert_non_null(strstr(msg, cause));
  assert_ptr_equal(data, (fl_ml_data *)1);
}

/* 16 good lines, `bad` as line 17, then 3 good lines: the bad line in a later partition. */
static void expect_libsvm_error(const char *bad, const fl_ml_load_options *opt, const char *cause) {
  char text[2048] = "";
  for (int i = 0; i < 16; i++) strcat(text, "1 1:0.5 3:1\n");
  strcat(text, bad);
  strcat(text, "\n");
  for (int i = 0; i < 3; i++) strcat(text, "0 2:1\n");
  fl_ml_load_options o = opt ? *opt : (fl_ml_load_options){0};
  o.partitions = 4;
  expect_error("data.libsvm", text, FL_ML_LIBSVM, &o, FL_EFORMAT, 17, cause);
}

static void test_libsvm_errors(void **state) {
  (void)state;
  expect_libsvm_error("1 0:1 2:1", NULL, "index 0 in a 1-based file (pass zero_based)");
  expect_libsvm_error("1 3:1 2:1", NULL, "indices not ascending (2 after 3)");
  expect_libsvm_error("1 2:1 2:3", NULL, "indices not ascending (2 after 2)");
  fl_ml_load_options zero = {.zero_based = true};
  expect_libsvm_error("1 0:1 0:2", &zero, "indices not ascending (0 after 0)");
  expect_libsvm_error("one 1:1", NULL, "bad label 'one'");
  expect_libsvm_error("1x 1:1", NULL, "bad label '1x'");
  expect_libsvm_error("inf 1:1", NULL, "label 'inf' is not finite");
  expect_libsvm_error("1 3:abc", NULL, "bad value 'abc' of index 3");
  expect_libsvm_error("1 3:", NULL, "bad value '' of index 3");
  expect_libsvm_error("1 3", NULL, "missing ':' in '3'");
  expect_libsvm_error("1 x:3", NULL, "bad index 'x'");
  expect_libsvm_error("1 -2:3", NULL, "bad index '-2'");
  fl_ml_load_options four = {.num_features = 4};
  expect_libsvm_error("1 5:1", &four, "index 5 beyond num_features 4");
  expect_libsvm_error("1 2:nan", NULL, "value 'nan' of index 2 is not finite");
  expect_libsvm_error("1 2:1e999", NULL, "value '1e999' of index 2 is not finite");
}

static void test_csv_errors(void **state) {
  (void)state;
  fl_ml_load_options last = {.label_column = -1, .partitions = 2};
  expect_error("fields.csv", "1,2,3\n4,5,6\n7,8\n", FL_ML_CSV, &last, FL_EFORMAT, 3, "expected 3 fields, found 2");
  expect_error("more.csv", "1,2,3\n4,5,6,7\n", FL_ML_CSV, &last, FL_EFORMAT, 2, "expected 3 fields, found 4");
  expect_error("empty.csv", "1,2,3\n1,,3\n", FL_ML_CSV, &last, FL_EFORMAT, 2, "field 2 is empty");
  expect_error("word.csv", "1,2,3\n1,2,3\n1,abc,3\n", FL_ML_CSV, &last, FL_EFORMAT, 3, "field 2 'abc' is not a number");
  expect_error("nan.csv", "1,2,nan\n", FL_ML_CSV, &last, FL_EFORMAT, 1, "field 3 'nan' is not finite");
  fl_ml_load_options header = {.header = true, .label_column = 5};
  expect_error("label.csv", "a,b,c\n\n1,2,3\n", FL_ML_CSV, &header, FL_EINVAL, 3,
               "label_column 5 out of range (the line has 3 fields)");
  expect_error("one.csv", "1\n2\n", FL_ML_CSV, &last, FL_EFORMAT, 1, "a CSV line needs a label and a feature");
  fl_ml_data *data = NULL;
  fl_ml_load_options bad_label = {.label_column = -2};
  assert_fails_with(fl_ml_load(ctx, write_file("x.csv", "1,2\n"), FL_ML_CSV, &bad_label, &data), FL_EINVAL,
                    "label_column -2");
  fl_ml_load_options bad_delim = {.delimiter = '.'};
  assert_fails_with(fl_ml_load(ctx, write_file("x.csv", "1,2\n"), FL_ML_CSV, &bad_delim, &data), FL_EINVAL,
                    "delimiter '.'");
  assert_fails_with(fl_ml_load(ctx, write_file("blank.csv", "\n\n"), FL_ML_CSV, &last, &data), FL_EEMPTY,
                    "blank.csv: no data lines");
  assert_fails_with(fl_ml_load(ctx, write_file("blank.libsvm", "# nothing\n"), FL_ML_LIBSVM, NULL, &data), FL_EEMPTY,
                    "blank.libsvm: no rows");
}

static void expect_idx_error(const char *images, const char *labels, fl_status status, const char *name,
                             const char *cause) {
  fl_ml_load_options opt = {.labels_path = labels};
  fl_ml_data *data = (fl_ml_data *)1;
  fl_status s = fl_ml_load(ctx, images, FL_ML_IDX, &opt, &data);
  const char *msg = fl_last_error();
  if (s != status || !strstr(msg, name) || !strstr(msg, cause))
    fprintf(stderr, "got %s '%s', expected %s '%s' '%s'\n", fl_status_name(s), msg, fl_status_name(status), name,
            cause);
  assert_int_equal(s, status);
  assert_non_null(strstr(msg, name));
  assert_non_null(strstr(msg, cause));
  assert_ptr_equal(data, (fl_ml_data *)1);
}

static void test_idx_errors(void **state) {
  (void)state;
  uint32_t dims[3] = {3, 2, 3};
  char labels[512], images[512]; /* write_idx's names are reused after four calls */
  snprintf(labels, sizeof labels, "%s", write_idx("l.idx1", 0x801, (uint32_t[]){3}, 1, classes, 3, false));
  snprintf(images, sizeof images, "%s", write_idx("i.idx3", 0x803, dims, 3, pixels, sizeof pixels, false));
  char missing[600];
  snprintf(missing, sizeof missing, "%s/none.idx3-ubyte.gz", dir);
  expect_idx_error(missing, labels, FL_ENOENT, "none.idx3-ubyte.gz", "cannot open");
  expect_idx_error(images, missing, FL_ENOENT, "none.idx3-ubyte.gz", "cannot open");
  expect_idx_error(images, NULL, FL_EINVAL, "i.idx3", "labels_path");
  /* Images and labels swapped: each has the other's magic. */
  expect_idx_error(labels, labels, FL_EFORMAT, "l.idx1", "bad magic 0x00000801");
  expect_idx_error(images, images, FL_EFORMAT, "i.idx3", "bad magic 0x00000803");
  expect_idx_error(write_idx("short.idx3", 0x803, dims, 3, pixels, sizeof pixels - 1, true), labels, FL_EFORMAT,
                   "short.idx3", "image 3: truncated (the header says 3 images of 2 x 3)");
  expect_idx_error(write_idx("head.idx3", 0x803, dims, 1, NULL, 0, false), labels, FL_EFORMAT, "head.idx3",
                   "truncated: 8 bytes");
  expect_idx_error(images, write_idx("short.idx1", 0x801, (uint32_t[]){3}, 1, classes, 2, false), FL_EFORMAT,
                   "short.idx1", "label 3 of 3 is missing");
  uint8_t more[sizeof pixels + 1] = {0};
  expect_idx_error(write_idx("long.idx3", 0x803, dims, 3, more, sizeof more, false), labels, FL_EFORMAT, "long.idx3",
                   "trailing bytes after 3 images");
  expect_idx_error(images, write_idx("long.idx1", 0x801, (uint32_t[]){2}, 1, classes, 3, true), FL_EFORMAT,
                   "long.idx1", "trailing bytes after 2 labels");
  const char *two = write_idx("two.idx1", 0x801, (uint32_t[]){2}, 1, classes, 2, false);
  expect_idx_error(images, two, FL_EFORMAT, "i.idx3 has 3 images but", "two.idx1 has 2 labels");
}

/* Cuts the last `drop` bytes off a file; returns its new size. */
static long cut_file(const char *path, long drop) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(st.st_size > drop && drop >= 0);
  assert_int_equal(truncate(path, st.st_size - drop), 0);
  return (long)st.st_size - drop;
}

/* A .gz IDX file cut short, even only in its gzip trailer (every byte of the payload there),
 * is an error naming the file and the byte where it ends; one named .gz that is not gzip is
 * not read as a plain IDX file (zlib's transparent mode would). */
static void test_idx_gzip_errors(void **state) {
  (void)state;
  uint32_t dims[3] = {3, 2, 3};
  char labels[512], images[512], name[64], at[64];
  snprintf(labels, sizeof labels, "%s", write_idx("gl.idx1.gz", 0x801, (uint32_t[]){3}, 1, classes, 3, true));
  snprintf(images, sizeof images, "%s", write_idx("gi.idx3.gz", 0x803, dims, 3, pixels, sizeof pixels, true));
  fl_ml_load_options opt = {.labels_path = labels};
  fl_ml_data *data = load(images, FL_ML_IDX, &opt); /* whole files load */
  assert_int_equal(data->rows, 3);
  fl_ml_data_free(data);

  for (int k = 0; k < 2; k++) { /* the trailer cut, then the stream */
    snprintf(name, sizeof name, "cl%d.idx1.gz", k);
    const char *cut = write_idx(name, 0x801, (uint32_t[]){3}, 1, classes, 3, true);
    snprintf(at, sizeof at, "ends at byte %ld", cut_file(cut, k ? 12 : 4));
    expect_idx_error(images, cut, FL_ECORRUPT, name, at);
    snprintf(name, sizeof name, "ci%d.idx3.gz", k);
    cut = write_idx(name, 0x803, dims, 3, pixels, sizeof pixels, true);
    snprintf(at, sizeof at, "ends at byte %ld", cut_file(cut, k ? 12 : 4));
    expect_idx_error(cut, labels, FL_EFORMAT, name, at);
  }
  expect_idx_error(images, write_idx("pl.idx1.gz", 0x801, (uint32_t[]){3}, 1, classes, 3, false), FL_ECORRUPT,
                   "pl.idx1.gz", "named .gz but not gzip data");
  expect_idx_error(write_idx("pi.idx3.gz", 0x803, dims, 3, pixels, sizeof pixels, false), labels, FL_ECORRUPT,
                   "pi.idx3.gz", "named .gz but not gzip data");
}

/* The case: a cut .svm.gz loaded no error and trained on the rows before the cut. */
static void test_libsvm_gzip_truncated(void **state) {
  (void)state;
  char path[600], text[8000] = "", line[64];
  for (int i = 0; i < 200; i++) {
    snprintf(line, sizeof line, "%d 1:%d 2:%d.%d\n", i % 2, i * 7919 % 1013, i, i * 31 % 97);
    strcat(text, line);
  }
  snprintf(path, sizeof path, "%s/cut.svm.gz", dir);
  gzFile f = gzopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(gzputs(f, text), (int)strlen(text));
  assert_int_equal(gzclose(f), Z_OK);
  fl_ml_data *data = load(path, FL_ML_LIBSVM, NULL);
  assert_int_equal(data->rows, 200);
  fl_ml_data_free(data);
  long size = cut_file(path, 0) / 2;
  assert_int_equal(truncate(path, size), 0);
  char at[64];
  snprintf(at, sizeof at, "ends at byte %ld", size);
  data = (fl_ml_data *)1;
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_LIBSVM, NULL, &data), FL_ECORRUPT, "cut.svm.gz: truncated gzip data");
  assert_non_null(strstr(fl_last_error(), at));
  assert_ptr_equal(data, (fl_ml_data *)1);
}

/* ---- labels and classes ------------------------------------------------------------------ */

/* Trains logistic regression on data loaded from `path` (a few iterations). */
static fl_status logreg(const fl_ml_data *data, uint32_t classes) {
  fl_ml_train_options o = {.max_iterations = 3, .classes = classes};
  fl_ml_model *m = NULL;
  fl_status s = fl_ml_logreg(data, &o, &m);
  if (s == FL_OK) assert_int_equal(m->classes, classes ? classes : m->classes);
  fl_ml_model_free(m);
  return s;
}

/* The loader records which labels occur; logistic regression that would infer classes with
 * no rows (max label + 1) refuses, naming the empty labels and those found, unless the class
 * count is given. Binary labels 0/1 and -1/+1 still train. */
static void test_labels_and_empty_classes(void **state) {
  (void)state;
  char desc[256];
  /* CSV labels {1, 2, 5}: 6 classes, 0, 3 and 4 empty. */
  fl_ml_load_options first = {.partitions = 2};
  fl_ml_data *data = load(write_file("l125.csv", "1,0.5\n2,1.5\n5,2\n1,3\n2,0\n"), FL_ML_CSV, &first);
  assert_int_equal(data->label_count, 3);
  fl_ml_data_describe_labels(data, desc, sizeof desc);
  assert_string_equal(desc, "3 label values: 1..2, 5");
  assert_fails_with(logreg(data, 0), FL_EINVAL,
                    "labels 0..5 span 6 classes but 3 of them have no rows (labels 0, 3..4)");
  assert_non_null(strstr(fl_last_error(), "3 classes have rows (labels 1..2, 5)"));
  assert_non_null(strstr(fl_last_error(), "classes"));
  assert_ok(logreg(data, 6)); /* explicit: empty classes are the user's choice */
  assert_fails_with(logreg(data, 4), FL_EINVAL, "labels 0..3");
  fl_ml_data_free(data);

  /* IDX: a label 255 among classes 0..9 would make a 256-class model. */
  uint8_t pix[12 * 4], lab[12];
  for (int i = 0; i < 12; i++) {
    lab[i] = (uint8_t)(i % 10);
    for (int k = 0; k < 4; k++) pix[i * 4 + k] = (uint8_t)(i * 13 + k * 7);
  }
  lab[11] = 255;
  char labels[512];
  snprintf(labels, sizeof labels, "%s", write_idx("l255.idx1", 0x801, (uint32_t[]){12}, 1, lab, 12, false));
  const char *images = write_idx("i255.idx3", 0x803, (uint32_t[]){12, 2, 2}, 3, pix, sizeof pix, false);
  fl_ml_load_options opt = {.labels_path = labels, .partitions = 3};
  data = load(images, FL_ML_IDX, &opt);
  assert_int_equal(data->label_count, 11);
  assert_fails_with(logreg(data, 0), FL_EINVAL,
                    "labels 0..255 span 256 classes but 245 of them have no rows (labels 10..254)");
  assert_non_null(strstr(fl_last_error(), "11 classes have rows (labels 0..9, 255)"));
  fl_ml_data_free(data);

  /* Binary conventions train; so does a dense set 0..2. */
  static const char *const good[] = {"0 1:1\n1 2:1\n0 1:2\n", "-1 1:1\n+1 2:1\n-1 1:2\n", "0 1:1\n2 2:1\n1 1:2\n"};
  for (int k = 0; k < 3; k++) {
    data = load(write_file("good.svm", good[k]), FL_ML_LIBSVM, NULL);
    assert_ok(logreg(data, 0));
    fl_ml_data_free(data);
  }
  /* One class only: the other binary class has no rows. */
  data = load(write_file("ones.svm", "1 1:1\n1 2:1\n"), FL_ML_LIBSVM, NULL);
  fl_ml_data_describe_labels(data, desc, sizeof desc);
  assert_string_equal(desc, "1 label value: 1");
  assert_fails_with(logreg(data, 0), FL_EINVAL, "1 of them has no rows (label 0)");
  fl_ml_data_free(data);
  /* Labels that are not classes are described by their range. */
  data = load(write_file("real.svm", "0.5 1:1\n2.25 2:1\n"), FL_ML_LIBSVM, NULL);
  assert_int_equal(data->label_count, 0);
  fl_ml_data_describe_labels(data, desc, sizeof desc);
  assert_string_equal(desc, "labels from 0.5 to 2.25, not all integers");
  fl_ml_data_free(data);
}

static void test_argument_errors(void **state) {
  (void)state;
  fl_ml_format f = FL_ML_CSV;
  assert_ok(fl_ml_format_parse("libsvm", &f));
  assert_int_equal(f, FL_ML_LIBSVM);
  assert_ok(fl_ml_format_parse("csv", &f));
  assert_int_equal(f, FL_ML_CSV);
  assert_ok(fl_ml_format_parse("idx", &f));
  assert_int_equal(f, FL_ML_IDX);
  assert_ok(fl_ml_format_parse("text", &f));
  assert_int_equal(f, FL_ML_TEXT);
  assert_ok(fl_ml_format_parse("idx", &f));
  assert_fails_with(fl_ml_format_parse("svmlight", &f), FL_EINVAL, "'svmlight' (choose libsvm, csv, idx or text)");
  assert_fails_with(fl_ml_format_parse(NULL, &f), FL_EINVAL, "libsvm, csv, idx or text");
  assert_int_equal(f, FL_ML_IDX);

  fl_ml_data *data = NULL;
  const char *path = write_file("ok.libsvm", "1 1:1\n");
  assert_fails_with(fl_ml_load(NULL, path, FL_ML_LIBSVM, NULL, &data), FL_EINVAL, "NULL ctx");
  assert_fails_with(fl_ml_load(ctx, NULL, FL_ML_LIBSVM, NULL, &data), FL_EINVAL, "NULL path");
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_LIBSVM, NULL, NULL), FL_EINVAL, "NULL out");
  assert_fails_with(fl_ml_load(ctx, path, (fl_ml_format)7, NULL, &data), FL_EINVAL, "unknown format 7");
  assert_null(data);

  char missing[600];
  snprintf(missing, sizeof missing, "%s/missing.libsvm", dir);
  assert_fails_with(fl_ml_load(ctx, missing, FL_ML_LIBSVM, NULL, &data), FL_ENOENT, "missing.libsvm");
  assert_fails_with(fl_ml_load(ctx, missing, FL_ML_LIBSVM, NULL, &data), FL_ENOENT, "No such file");
  snprintf(missing, sizeof missing, "%s/missing.csv", dir);
  assert_fails_with(fl_ml_load(ctx, missing, FL_ML_CSV, NULL, &data), FL_ENOENT, "missing.csv");
  snprintf(missing, sizeof missing, "%s/nothing-*.csv", dir);
  assert_fails_with(fl_ml_load(ctx, missing, FL_ML_CSV, NULL, &data), FL_ENOENT, "no files match");
  assert_null(data);
}

/* ---- the hashing trick ------------------------------------------------------------------- */

/* Row i's (column, value) pairs as a multiset key: sorted columns and |values|. */
static void row_columns(const table *t, size_t i, uint32_t *cols, size_t *n) {
  *n = t->start[i + 1] - t->start[i];
  for (size_t k = 0; k < *n; k++) cols[k] = t->col[t->start[i] + k];
}

/* LIBSVM hashed: 2^bits sparse columns; without collisions every feature keeps its value up
 * to a sign that depends on the feature alone (so the same feature lands alike in every row,
 * partition and load); with 1 bit, features meet and add up. */
static void test_hashed_libsvm(void **state) {
  (void)state;
  const char *path = write_file("hash.libsvm", "1 1:0.5 7:2 1000000:3\n0 7:2 9:1\n1 1:0.5\n");
  fl_ml_load_options o = {.hash_bits = 20, .partitions = 2};
  fl_ml_data *data = load(path, FL_ML_LIBSVM, &o);
  assert_int_equal(data->cols, 1u << 20);
  assert_true(data->sparse);
  table t;
  read_table(data, &t);
  assert_int_equal(t.rows, 3);
  assert_int_equal(t.start[1] - t.start[0], 3);
  assert_int_equal(t.start[2] - t.start[1], 2);
  double abs_sum = 0;
  for (size_t k = t.start[0]; k < t.start[1]; k++) abs_sum += fabs(t.val[k]);
  assert_true(abs_sum == 5.5);
  /* Feature 7 (value 2) is in rows 0 and 1, feature 1 (0.5) in rows 0 and 2: the same column
   * and the same signed value each time. */
  uint32_t c0[8], c1[8], c2[8];
  size_t n0, n1, n2;
  row_columns(&t, 0, c0, &n0);
  row_columns(&t, 1, c1, &n1);
  row_columns(&t, 2, c2, &n2);
  assert_int_equal(n2, 1);
  bool one_found = false;
  for (size_t k = 0; k < n0; k++)
    if (c0[k] == c2[0]) one_found = t.val[t.start[0] + k] == t.val[t.start[2]];
  assert_true(one_found);
  int shared = 0;
  for (size_t a = 0; a < n0; a++)
    for (size_t b = 0; b < n1; b++)
      if (c0[a] == c1[b] && t.val[t.start[0] + a] == t.val[t.start[1] + b] && fabs(t.val[t.start[1] + b]) == 2) shared++;
  assert_int_equal(shared, 1);
  /* The same file at 1 partition hashes identically. */
  fl_ml_load_options one = {.hash_bits = 20, .partitions = 1};
  fl_ml_data *again = load(path, FL_ML_LIBSVM, &one);
  table t2;
  read_table(again, &t2);
  assert_tables_equal(&t, &t2);
  fl_ml_data_free(again);
  fl_ml_data_free(data);
  /* 1 bit: 2 columns, the three features of row 0 share them; the magnitudes add up. */
  fl_ml_load_options tiny = {.hash_bits = 1};
  data = load(path, FL_ML_LIBSVM, &tiny);
  assert_int_equal(data->cols, 2);
  read_table(data, &t);
  assert_true(t.start[1] - t.start[0] <= 2);
  for (size_t k = t.start[0]; k < t.start[1]; k++) assert_true(t.col[k] < 2);
  fl_ml_data_free(data);
}

/* TEXT: tokens are features of value 1, repeats add up; errors name file and line; a
 * classifier learns from the hashed words. */
static void test_text_hashed(void **state) {
  (void)state;
  const char *path = write_file("words.txt", "1 the cat the\n0 a dog\n\n1 cat\n");
  fl_ml_load_options o = {.hash_bits = 18};
  fl_ml_data *data = load(path, FL_ML_TEXT, &o);
  assert_int_equal(data->cols, 1u << 18);
  assert_int_equal(data->rows, 3);
  table t;
  read_table(data, &t);
  assert_int_equal(t.start[1] - t.start[0], 2); /* "the" twice, "cat" once */
  double a = fabs(t.val[t.start[0]]), b = fabs(t.val[t.start[0] + 1]);
  assert_true((a == 2 && b == 1) || (a == 1 && b == 2));
  assert_int_equal(t.start[3] - t.start[2], 1); /* "cat" */
  fl_ml_data_free(data);

  expect_error("bad.txt", "1 a b\nx c d\n", FL_ML_TEXT, &o, FL_EFORMAT, 2, "bad label 'x'");
  fl_ml_data *none = NULL;
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_TEXT, NULL, &none), FL_EINVAL, "text data needs hash_bits");
  fl_ml_load_options wide = {.hash_bits = 32};
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_TEXT, &wide, &none), FL_EINVAL, "hash_bits 32");
  fl_ml_load_options csv = {.hash_bits = 8};
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_CSV, &csv, &none), FL_EINVAL, "hash_bits is for libsvm and text");
  fl_ml_load_options both = {.hash_bits = 8, .num_features = 10};
  assert_fails_with(fl_ml_load(ctx, path, FL_ML_LIBSVM, &both, &none), FL_EINVAL, "num_features 10 with hash_bits 8");
  assert_null(none);

  /* Positive lines say "good", negative ones "bad", among shared noise words. */
  char text[8192] = "";
  static const char *noise[] = {"movie", "plot", "actor", "scene", "ending", "music"};
  for (int i = 0; i < 120; i++) {
    char line[128];
    snprintf(line, sizeof line, "%d %s %s %s\n", i % 2, noise[i % 6], i % 2 ? "good" : "bad", noise[(i / 2) % 6]);
    strcat(text, line);
  }
  fl_ml_load_options h = {.hash_bits = 16, .partitions = 3};
  data = load(write_file("reviews.txt", text), FL_ML_TEXT, &h);
  fl_ml_train_options to = {.max_iterations = 50};
  fl_ml_model *m = NULL;
  assert_ok(fl_ml_logreg(data, &to, &m));
  fl_ml_metrics mt;
  assert_ok(fl_ml_evaluate(m, data, &mt));
  assert_true(mt.accuracy == 1.0);
  fl_ml_model_free(m);
  fl_ml_data_free(data);
}

/* ---- skip_bad_lines ---------------------------------------------------------------------- */

static void test_skip_bad_lines(void **state) {
  (void)state;
  const char *path = write_file("some-bad.libsvm",
                                "0 1:1\n1 1:1\n2 0:1\n3 1:1\n4 2:x\n5 1:1\n6 1:1\n7 1:1 1:2\n8 1:1\n9 1:1\n");
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  for (uint32_t parts = 1; parts <= 4; parts += 3) {
    fl_ml_load_options opt = {.skip_bad_lines = true, .partitions = parts};
    fl_ml_data *data = load(path, FL_ML_LIBSVM, &opt);
    assert_int_equal(data->rows, 7);
    assert_int_equal(data->skipped, 3);
    read_table(data, t);
    double want[7] = {0, 1, 3, 5, 6, 8, 9};
    assert_int_equal(t->rows, 7);
    assert_memory_equal(t->labels, want, sizeof want);
    fl_ml_data_free(data);
  }
  /* CSV too; a file of only bad lines has no rows. */
  path = write_file("some-bad.csv", "1,2\n1,x\n3,4\n,5\n6,7\n");
  fl_ml_load_options opt = {.skip_bad_lines = true, .label_column = 0, .partitions = 2};
  fl_ml_data *data = load(path, FL_ML_CSV, &opt);
  assert_int_equal(data->rows, 3);
  assert_int_equal(data->skipped, 2);
  fl_ml_data_free(data);
  data = NULL;
  assert_fails_with(fl_ml_load(ctx, write_file("all-bad.csv", "a,2\n1,x\n"), FL_ML_CSV,
                               &(fl_ml_load_options){.skip_bad_lines = true, .label_column = 1}, &data),
                    FL_EEMPTY, "all-bad.csv: no rows (2 bad lines skipped)");
  free(t);
}

/* ---- storage ----------------------------------------------------------------------------- */

/* Loaded data larger than the memory for cached blocks is kept on local disk, not dropped:
 * every pass reads the cache, so training works even with the file gone (before, blocks
 * that did not fit were dropped and each pass parsed the text again). */
static void test_spills_to_disk(void **state) {
  (void)state;
  fl_options o = FL_OPTIONS_INIT;
  o.memory_limit = 64 << 10;
  fl_context *small;
  assert_ok(fl_context_open("local[2]", &o, &small));
  char path[512];
  snprintf(path, sizeof path, "%s/big.csv", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 6000; i++) { /* y = 1 + x1 - 2 x2 + 0.5 x3, exactly */
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1, x3 = (i % 7) / 3.0 - 1, x4 = (i % 5) / 2.0 - 1;
    fprintf(f, "%.17g,%.17g,%.17g,%.17g,%.17g\n", 1 + x1 - 2 * x2 + 0.5 * x3, x1, x2, x3, x4);
  }
  assert_int_equal(fclose(f), 0);
  fl_ml_load_options lo = {.partitions = 6, .rows_per_block = 256};
  fl_ml_data *data = NULL;
  assert_ok(fl_ml_load(small, path, FL_ML_CSV, &lo, &data));
  assert_int_equal(data->rows, 6000);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(data->blocks, &info));
  assert_int_equal(info.level, FL_MEMORY_AND_DISK);
  assert_int_equal(info.cached_partitions, info.partitions); /* none dropped */
  assert_true(info.disk_bytes > 0);
  assert_true(info.memory_bytes <= o.memory_limit);
  assert_int_equal(unlink(path), 0);
  fl_ml_train_options t = {.solver = FL_ML_SOLVER_NORMAL};
  for (int pass = 0; pass < 2; pass++) {
    fl_ml_model *m = NULL;
    if (pass == 1) t.solver = FL_ML_SOLVER_LBFGS, t.max_iterations = 5;
    assert_ok(fl_ml_linreg(data, &t, &m));
    if (pass == 0) {
      assert_true(fabs(m->coef[0] - 1) < 1e-9 && fabs(m->coef[1] + 2) < 1e-9 && fabs(m->coef[2] - 0.5) < 1e-9);
      assert_true(fabs(m->coef[3]) < 1e-9 && fabs(m->intercepts[0] - 1) < 1e-9);
    }
    fl_ml_model_free(m);
  }
  assert_ok(fl_storage_info_get(data->blocks, &info));
  assert_int_equal(info.cached_partitions, info.partitions);
  fl_ml_data_free(data);
  fl_context_close(small);
}

/* LIBSVM rows that are mostly non-zero are stored dense (8 bytes a value against 12 a
 * non-zero in CSR); sparse rows stay sparse (test_libsvm_small). */
static void test_libsvm_mostly_dense(void **state) {
  (void)state;
  char text[8192];
  size_t n = 0;
  for (int i = 0; i < 60; i++) { /* four features; every fifth row lacks the third */
    if (i % 5 == 0) n += (size_t)snprintf(text + n, sizeof text - n, "%d 1:%d 2:0.5 4:%d\n", i % 2, i, -i);
    else n += (size_t)snprintf(text + n, sizeof text - n, "%d 1:%d 2:0.5 3:%d 4:%d\n", i % 2, i, i % 3, -i);
  }
  const char *path = write_file("dense.libsvm", text);
  fl_ml_load_options opt = {.partitions = 3, .rows_per_block = 7};
  fl_ml_data *data = load(path, FL_ML_LIBSVM, &opt);
  assert_int_equal(data->rows, 60);
  assert_int_equal(data->cols, 4);
  assert_false(data->sparse);
  table *t = malloc(sizeof *t);
  assert_non_null(t);
  read_table(data, t); /* every block dense, 4 values a row */
  assert_int_equal(t->rows, 60);
  for (int i = 0; i < 60; i++)
    assert_row(t, (size_t)i, i % 2, (uint32_t[]){0, 1, 2, 3},
               (double[]){i, 0.5, i % 5 == 0 ? 0 : i % 3, -i}, 4);
  fl_storage_info info;
  assert_ok(fl_storage_info_get(data->blocks, &info));
  assert_int_equal(info.level, FL_MEMORY_AND_DISK);
  fl_ml_data_free(data);
  free(t);
}

/* ---- cluster ----------------------------------------------------------------------------- */

/* The kernels (parse, count, the bad-line accumulator) run in executor processes. */
static void test_cluster(void **state) {
  (void)state;
  fl_context *cluster;
  assert_ok(fl_context_open("local-cluster[2,1,512]", NULL, &cluster));
  libsvm_small(cluster, write_file("small.libsvm", small_libsvm));
  fl_ml_data *data = NULL;
  fl_ml_load_options opt = {.partitions = 3};
  const char *bad = write_file("bad.libsvm", "1 1:1\n2 2:1\n3 1:1 1:1\n");
  assert_fails_with(fl_ml_load(cluster, bad, FL_ML_LIBSVM, &opt, &data), FL_EFORMAT, "bad.libsvm:3: indices not ascending");
  opt.skip_bad_lines = true;
  assert_ok(fl_ml_load(cluster, bad, FL_ML_LIBSVM, &opt, &data));
  assert_int_equal(data->rows, 2);
  assert_int_equal(data->skipped, 1);
  fl_ml_data_free(data);
  /* IDX is read by the executors: a truncated image is reported as in local mode, and
   * Fashion-MNIST (376 MB of blocks, more than a plan may carry) loads */
  const char *images = write_idx("c.idx3", 0x803, (uint32_t[]){3, 2, 3}, 3, pixels, sizeof pixels, false);
  const char *labels = write_idx("c.idx1", 0x801, (uint32_t[]){3}, 1, classes, sizeof classes, false);
  fl_ml_load_options io = {.labels_path = labels, .partitions = 3};
  assert_ok(fl_ml_load(cluster, images, FL_ML_IDX, &io, &data));
  assert_int_equal(data->rows, 3);
  assert_int_equal(data->cols, 6);
  fl_ml_data_free(data);
  data = NULL;
  const char *cut = write_idx("cut.idx3", 0x803, (uint32_t[]){3, 2, 3}, 3, pixels, sizeof pixels - 2, true);
  assert_fails_with(fl_ml_load(cluster, cut, FL_ML_IDX, &io, &data), FL_EFORMAT,
                    "image 3: truncated (the header says 3 images of 2 x 3)");
  const char *fm = FASHION "/train-images-idx3-ubyte.gz";
  fl_ml_load_options fo = {.labels_path = FASHION "/train-labels-idx1-ubyte.gz"};
  if (access(fm, R_OK) == 0 && access(fo.labels_path, R_OK) == 0) {
    assert_ok(fl_ml_load(cluster, fm, FL_ML_IDX, &fo, &data));
    assert_int_equal(data->rows, 60000);
    assert_int_equal(data->cols, 784);
    fl_ml_data_free(data);
  } else {
    print_message("Fashion-MNIST is not installed: its cluster load is not run\n");
  }
  fl_context_close(cluster);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_libsvm_small),     cmocka_unit_test(test_libsvm_options),
      cmocka_unit_test(test_libsvm_folder),    cmocka_unit_test(test_csv),
      cmocka_unit_test(test_idx_small),        cmocka_unit_test(test_idx_fashion_mnist),
      cmocka_unit_test(test_libsvm_errors),    cmocka_unit_test(test_csv_errors),
      cmocka_unit_test(test_idx_errors),       cmocka_unit_test(test_argument_errors),
      cmocka_unit_test(test_idx_gzip_errors),  cmocka_unit_test(test_libsvm_gzip_truncated),
      cmocka_unit_test(test_labels_and_empty_classes),
      cmocka_unit_test(test_skip_bad_lines),   cmocka_unit_test(test_spills_to_disk),
      cmocka_unit_test(test_libsvm_mostly_dense), cmocka_unit_test(test_cluster),
      cmocka_unit_test(test_hashed_libsvm),    cmocka_unit_test(test_text_hashed),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
