/* test_sources.c: parallelize, range, text files (splits, folders, globs, gzip) and binary
 * records, each checked against a naive reference computed here. */
#include <zlib.h>

#include "test_util.h"

static fl_context *ctx;

static int setup(void **state) {
  (void)state;
  return fl_context_open("local[2]", NULL, &ctx) == FL_OK ? 0 : -1;
}
static int teardown(void **state) {
  (void)state;
  fl_context_close(ctx);
  return 0;
}

static fl_records *collect(fl_dataset *ds) {
  fl_records *r = NULL;
  assert_ok(fl_collect(ds, &r));
  return r;
}

static void test_parallelize_keeps_records_and_order(void **state) {
  (void)state;
  const char raw[][8] = {"a", "", "bc", "zero", "x", "yy", "zzz"};
  fl_bytes recs[7];
  for (int i = 0; i < 7; i++) recs[i] = fl_bytes_of(raw[i], strlen(raw[i]));
  recs[3] = fl_bytes_of("z\0ro", 4); /* zero bytes inside records survive */
  for (uint32_t parts = 1; parts <= 10; parts++) {
    fl_dataset *ds;
    assert_ok(fl_parallelize(ctx, recs, 7, parts, &ds));
    assert_int_equal(fl_dataset_partitions(ds), parts);
    fl_records *r = collect(ds);
    assert_int_equal(fl_records_count(r), 7);
    for (int i = 0; i < 7; i++) {
      fl_bytes b = fl_records_get(r, (size_t)i);
      assert_int_equal(b.len, recs[i].len);
      assert_memory_equal(b.data, recs[i].data, b.len);
    }
    fl_records_free(r);
    fl_dataset_free(ds);
  }
}

static void test_parallelize_empty_and_errors(void **state) {
  (void)state;
  fl_dataset *ds;
  assert_ok(fl_parallelize(ctx, NULL, 0, 3, &ds));
  uint64_t n = 99;
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 0);
  fl_dataset_free(ds);
  assert_int_equal(fl_parallelize(NULL, NULL, 0, 1, &ds), FL_EINVAL);
  assert_int_equal(fl_parallelize(ctx, NULL, 2, 1, &ds), FL_EINVAL);
  fl_bytes bad = {NULL, 3};
  assert_fails_with(fl_parallelize(ctx, &bad, 1, 1, &ds), FL_EINVAL, "record 0");
}

static void check_range(int64_t start, int64_t end, int64_t step, uint32_t parts) {
  fl_dataset *ds;
  assert_ok(fl_range(ctx, start, end, step, parts, &ds));
  fl_records *r = collect(ds);
  size_t i = 0;
  for (__int128 v = start; step > 0 ? v < end : v > end; v += step, i++) {
    assert_true(i < fl_records_count(r));
    assert_int_equal(fl_i64(fl_records_get(r, i)), (int64_t)v);
  }
  assert_int_equal(fl_records_count(r), i);
  fl_records_free(r);
  fl_dataset_free(ds);
}

static void test_range(void **state) {
  (void)state;
  check_range(0, 100, 1, 7);
  check_range(-5, 17, 3, 4);
  check_range(10, 0, -3, 3);
  check_range(0, 0, 1, 2);
  check_range(5, 0, 1, 2);
  check_range(INT64_MAX - 5, INT64_MAX, 2, 3);
  check_range(INT64_MIN, INT64_MIN + 10, 4, 16);
  fl_dataset *ds;
  assert_fails_with(fl_range(ctx, 0, 10, 0, 1, &ds), FL_EINVAL, "step");
}

/* The lines of `text` as the reference splits them. */
static size_t ref_lines(const char *text, size_t len, char lines[][300], size_t max) {
  size_t n = 0, start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i == len && start == len) break;
    if (i == len || text[i] == '\n') {
      size_t l = i - start;
      if (l > 0 && text[start + l - 1] == '\r') l--;
      assert_true(n < max && l < 300);
      memcpy(lines[n], text + start, l);
      lines[n++][l] = '\0';
      start = i + 1;
    }
  }
  return n;
}

static void check_text(fl_dataset *ds, const char *text, size_t len) {
  static char lines[2000][300];
  size_t n = ref_lines(text, len, lines, 2000);
  fl_records *r = collect(ds);
  assert_int_equal(fl_records_count(r), n);
  for (size_t i = 0; i < n; i++) {
    fl_bytes b = fl_records_get(r, i);
    assert_int_equal(b.len, strlen(lines[i]));
    assert_memory_equal(b.data, lines[i], b.len);
  }
  fl_records_free(r);
}

static void test_text_file_splits_at_every_size(void **state) {
  (void)state;
  char dir[256], path[300];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/lines.txt", dir);
  /* Lines of varied length, empty lines, CRLF, and no newline at the end. */
  char text[8000];
  size_t len = 0;
  for (int i = 0; i < 300; i++)
    len += (size_t)sprintf(text + len, i % 17 == 0 ? "\n" : i % 5 == 0 ? "line %d with crlf\r\n" : "l%d %.*s\n", i,
                           i % 23, "abcdefghijklmnopqrstuvwxyz");
  len += (size_t)sprintf(text + len, "last line without newline");
  test_write_file(path, text, len);
  for (uint32_t parts = 1; parts <= 1000; parts = parts < 10 ? parts + 1 : parts * 3) {
    fl_dataset *ds;
    assert_ok(fl_text_file(ctx, path, parts, &ds));
    assert_true(fl_dataset_partitions(ds) >= (parts < len ? parts : 1));
    check_text(ds, text, len);
    fl_dataset_free(ds);
  }
  test_rmtree(dir);
}

static void test_text_folder_glob_and_gzip(void **state) {
  (void)state;
  char dir[256], path[400];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/a.txt", dir);
  test_write_file(path, "a1\na2\n", 6);
  snprintf(path, sizeof path, "%s/b.txt.gz", dir);
  gzFile gz = gzopen(path, "wb");
  assert_non_null(gz);
  assert_int_equal(gzputs(gz, "b1\nb2\r\nb3"), 9);
  assert_int_equal(gzclose(gz), Z_OK);
  snprintf(path, sizeof path, "%s/.hidden", dir);
  test_write_file(path, "no\n", 3);
  snprintf(path, sizeof path, "%s/_SUCCESS", dir);
  test_write_file(path, "no\n", 3);
  snprintf(path, sizeof path, "%s/c.dat", dir);
  test_write_file(path, "c1\n", 3);

  fl_dataset *ds;
  assert_ok(fl_text_file(ctx, dir, 4, &ds)); /* a folder: a.txt, b.txt.gz, c.dat in order */
  check_text(ds, "a1\na2\nb1\nb2\nb3\nc1\n", 18);
  fl_dataset_free(ds);

  snprintf(path, sizeof path, "%s/*.txt*", dir);
  assert_ok(fl_text_file(ctx, path, 1, &ds)); /* a glob */
  check_text(ds, "a1\na2\nb1\nb2\nb3", 14);
  fl_dataset_free(ds);

  snprintf(path, sizeof path, "%s/b.txt.gz", dir);
  assert_ok(fl_text_file(ctx, path, 8, &ds)); /* gzip: one partition, not split */
  assert_int_equal(fl_dataset_partitions(ds), 1);
  check_text(ds, "b1\nb2\nb3", 8);
  fl_dataset_free(ds);
  test_rmtree(dir);
}

static void test_text_missing_and_corrupt(void **state) {
  (void)state;
  char dir[256], path[400];
  test_tmpdir(dir, sizeof dir);
  fl_dataset *ds;
  snprintf(path, sizeof path, "%s/missing.txt", dir);
  assert_fails_with(fl_text_file(ctx, path, 1, &ds), FL_ENOENT, "missing.txt");
  snprintf(path, sizeof path, "%s/*.nothing", dir);
  assert_fails_with(fl_text_file(ctx, path, 1, &ds), FL_ENOENT, "no files match");
  assert_int_equal(fl_text_file(ctx, NULL, 1, &ds), FL_EINVAL);

  /* A .gz file that is not gzip data fails the job, naming the file; the context lives on. */
  snprintf(path, sizeof path, "%s/bad.gz", dir);
  unsigned char junk[64];
  junk[0] = 0x1f, junk[1] = 0x8b; /* gzip magic, then garbage */
  for (int i = 2; i < 64; i++) junk[i] = (unsigned char)(i * 37);
  test_write_file(path, junk, sizeof junk);
  assert_ok(fl_text_file(ctx, path, 1, &ds));
  uint64_t n;
  assert_fails_with(fl_count(ds, &n), FL_ECORRUPT, "bad.gz");
  fl_dataset_free(ds);

  /* A file removed after the dataset was made fails the task with its name. */
  snprintf(path, sizeof path, "%s/gone.txt", dir);
  test_write_file(path, "x\n", 2);
  assert_ok(fl_text_file(ctx, path, 1, &ds));
  unlink(path);
  assert_fails_with(fl_count(ds, &n), FL_EJOB, "gone.txt");
  fl_dataset_free(ds);

  snprintf(path, sizeof path, "%s/empty.txt", dir);
  test_write_file(path, "", 0);
  assert_ok(fl_text_file(ctx, path, 3, &ds));
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 0);
  fl_dataset_free(ds);
  test_rmtree(dir);
}

/* Writes `text` gzip'd to `path` and returns the compressed bytes in buf (at most cap). */
static size_t write_gzip(const char *path, const char *text, unsigned char *buf, size_t cap) {
  gzFile gz = gzopen(path, "wb");
  assert_non_null(gz);
  assert_int_equal(gzwrite(gz, text, (unsigned)strlen(text)), (int)strlen(text));
  assert_int_equal(gzclose(gz), Z_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t len = fread(buf, 1, cap, f);
  assert_true(len > 0 && len < cap);
  fclose(f);
  return len;
}

/* A .gz file cut short fails the job with FL_ECORRUPT naming the file and the byte where it
 * ends, whether the cut falls in the deflate stream or only in the 8-byte trailer (where
 * every line has been read already); nothing is returned; a whole .gz still reads. */
static void test_text_gzip_truncated(void **state) {
  (void)state;
  char dir[256], path[400], text[20000], needle[64];
  test_tmpdir(dir, sizeof dir);
  size_t len = 0;
  uint64_t seed = 7;
  for (int i = 0; i < 600; i++) { /* varied lines, so that deflate keeps most of them */
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    len += (size_t)sprintf(text + len, "%d 1:%llu 2:%llu\n", i % 2, (unsigned long long)(seed % 100003),
                           (unsigned long long)(seed >> 40));
  }
  static unsigned char gz[40000];
  snprintf(path, sizeof path, "%s/whole.svm.gz", dir);
  size_t gz_len = write_gzip(path, text, gz, sizeof gz);
  fl_dataset *ds;
  assert_ok(fl_text_file(ctx, path, 1, &ds));
  check_text(ds, text, len);
  fl_dataset_free(ds);

  size_t cuts[] = {gz_len / 2, gz_len - 4, gz_len - 1};
  for (size_t k = 0; k < sizeof cuts / sizeof *cuts; k++) {
    snprintf(path, sizeof path, "%s/cut%zu.svm.gz", dir, k);
    test_write_file(path, gz, cuts[k]);
    assert_ok(fl_text_file(ctx, path, 1, &ds));
    uint64_t n = 0;
    fl_records *r = NULL;
    snprintf(needle, sizeof needle, "cut%zu.svm.gz", k);
    assert_fails_with(fl_count(ds, &n), FL_ECORRUPT, needle);
    assert_non_null(strstr(fl_last_error(), "truncated"));
    snprintf(needle, sizeof needle, "byte %zu", cuts[k]);
    assert_non_null(strstr(fl_last_error(), needle));
    assert_fails_with(fl_collect(ds, &r), FL_ECORRUPT, "truncated");
    assert_null(r);
    fl_dataset_free(ds);
  }
  test_rmtree(dir);
}

/* zlib reads a file that is not gzip as it is ("transparent" mode): a file named .gz must be
 * gzip, so plain text, an empty file or one byte under that name fail the job instead of
 * being read as lines. */
static void test_text_gzip_name_without_gzip(void **state) {
  (void)state;
  char dir[256], path[400];
  test_tmpdir(dir, sizeof dir);
  static const struct {
    const char *name, *data;
    size_t len;
  } cases[] = {{"plain.txt.gz", "plain\ntext\n", 11}, {"empty.gz", "", 0}, {"one.gz", "\x1f", 1}};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, cases[k].name);
    test_write_file(path, cases[k].data, cases[k].len);
    fl_dataset *ds;
    assert_ok(fl_text_file(ctx, path, 1, &ds));
    uint64_t n = 0;
    assert_fails_with(fl_count(ds, &n), FL_ECORRUPT, cases[k].name);
    assert_non_null(strstr(fl_last_error(), "not gzip"));
    fl_dataset_free(ds);
  }
  /* The same bytes under a plain name are text. */
  snprintf(path, sizeof path, "%s/plain.txt", dir);
  test_write_file(path, "plain\ntext\n", 11);
  fl_dataset *ds;
  assert_ok(fl_text_file(ctx, path, 1, &ds));
  check_text(ds, "plain\ntext\n", 11);
  fl_dataset_free(ds);
  test_rmtree(dir);
}

static void test_binary_records(void **state) {
  (void)state;
  char dir[256], path[400];
  test_tmpdir(dir, sizeof dir);
  unsigned char data[12 * 100];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i % 251);
  snprintf(path, sizeof path, "%s/recs.bin", dir);
  test_write_file(path, data, sizeof data);
  fl_dataset *ds;
  assert_ok(fl_binary_records(ctx, path, 12, &ds));
  fl_records *r = collect(ds);
  assert_int_equal(fl_records_count(r), 100);
  for (size_t i = 0; i < 100; i++) {
    fl_bytes b = fl_records_get(r, i);
    assert_int_equal(b.len, 12);
    assert_memory_equal(b.data, data + 12 * i, 12);
  }
  fl_records_free(r);
  fl_dataset_free(ds);

  assert_fails_with(fl_binary_records(ctx, path, 7, &ds), FL_EFORMAT, "not a multiple");
  assert_fails_with(fl_binary_records(ctx, path, 0, &ds), FL_EINVAL, "record_len");
  snprintf(path, sizeof path, "%s/nope.bin", dir);
  assert_fails_with(fl_binary_records(ctx, path, 4, &ds), FL_ENOENT, "nope.bin");
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parallelize_keeps_records_and_order),
      cmocka_unit_test(test_parallelize_empty_and_errors),
      cmocka_unit_test(test_range),
      cmocka_unit_test(test_text_file_splits_at_every_size),
      cmocka_unit_test(test_text_folder_glob_and_gzip),
      cmocka_unit_test(test_text_missing_and_corrupt),
      cmocka_unit_test(test_text_gzip_truncated),
      cmocka_unit_test(test_text_gzip_name_without_gzip),
      cmocka_unit_test(test_binary_records),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
