/* test_task_metrics.c: the bytes that tasks read and write (Spark's task metrics), as
 * fl_context_stats sums them, on local[2] and on local-cluster[2,1,512] (where they travel in
 * the executors' task ends and the driver's RunJob replies): a count over text, gzip and
 * binary files and over a checkpoint reads each file's size; a reduce_by_key reads back
 * exactly what its maps wrote; a second action over a cached dataset reads the cached
 * blocks. */
#include "test_util.h"

#include <errno.h>
#include <glob.h>
#include <sys/wait.h>
#include <zlib.h>

#define TEST_BOUND_S 170 /* local-cluster start included, on a loaded 2-core machine */

/* From tests/jobs/cluster_pipelines.c (cluster mode needs functions of a shared library). */
fl_status cp_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);

#define CLUSTER "local-cluster[2,1,512]"
#define LINES 6000

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_task_metrics: a test ran past its time bound (a hang?)\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1)) {
  }
  _exit(3);
}
static int arm(void **state) {
  (void)state;
  signal(SIGALRM, on_alarm);
  alarm(TEST_BOUND_S);
  return 0;
}
static int disarm(void **state) {
  (void)state;
  alarm(0);
  return 0;
}

static uint64_t file_size(const char *path) {
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  return (uint64_t)sb.st_size;
}

/* LINES lines of varying length ending in "\r\n" (so that the records, without it, are not
 * as long as the file), into `path`; returns the text's length. */
static size_t write_lines(const char *path, fl_buf *text) {
  char line[128];
  for (int i = 0; i < LINES; i++) {
    int n = snprintf(line, sizeof line, "line %d %.*s\r\n", i, i % 60, "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefgh");
    assert_ok(fl_buf_append(text, line, (size_t)n));
  }
  test_write_file(path, text->data, text->len);
  return text->len;
}

static void stats(fl_context *ctx, fl_context_stats *out) { assert_ok(fl_context_stats_get(ctx, out)); }

/* A count over a plain text file in several splits, over its gzip copy and over fixed-size
 * records: each reads exactly the file's bytes (the compressed ones for .gz). */
static void files_read_their_size(const char *master) {
  char dir[256], txt[512], gz[512], bin[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(txt, sizeof txt, "%s/lines.txt", dir);
  snprintf(gz, sizeof gz, "%s/lines.txt.gz", dir);
  snprintf(bin, sizeof bin, "%s/records.bin", dir);
  fl_buf text = FL_BUF_INIT;
  size_t len = write_lines(txt, &text);
  gzFile zf = gzopen(gz, "wb");
  assert_non_null(zf);
  assert_int_equal(gzwrite(zf, text.data, (unsigned)text.len), (int)text.len);
  assert_int_equal(gzclose(zf), Z_OK);
  test_write_file(bin, text.data, text.len - text.len % 16);
  fl_buf_free(&text);

  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_context_stats before, after;
  fl_dataset *ds;
  uint64_t n = 0;

  assert_ok(fl_text_file(ctx, txt, 5, &ds));
  assert_true(fl_dataset_partitions(ds) >= 5); /* splits that read past their ends */
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, LINES);
  assert_int_equal(after.input_bytes - before.input_bytes, len);
  assert_int_equal(after.shuffle_read_bytes - before.shuffle_read_bytes, 0);
  assert_int_equal(after.shuffle_write_bytes - before.shuffle_write_bytes, 0);
  fl_dataset_free(ds);

  assert_ok(fl_text_file(ctx, gz, 5, &ds));
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, LINES);
  assert_int_equal(after.input_bytes - before.input_bytes, file_size(gz));
  fl_dataset_free(ds);

  assert_ok(fl_binary_records(ctx, bin, 16, &ds));
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, file_size(bin) / 16);
  assert_int_equal(after.input_bytes - before.input_bytes, file_size(bin));
  fl_dataset_free(ds);

  /* A checkpoint: its job reads the file; a count afterwards reads the checkpoint's files. */
  char ckpt[512];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  assert_ok(fl_text_file(ctx, txt, 3, &ds));
  stats(ctx, &before);
  assert_ok(fl_checkpoint(ds, ckpt));
  stats(ctx, &after);
  assert_int_equal(after.input_bytes - before.input_bytes, len);
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, LINES);
  char pattern[600];
  snprintf(pattern, sizeof pattern, "%s/*/rdd-*/part-*", ckpt);
  glob_t g;
  assert_int_equal(glob(pattern, 0, NULL, &g), 0);
  assert_int_equal(g.gl_pathc, fl_dataset_partitions(ds));
  uint64_t files = 0;
  for (size_t i = 0; i < g.gl_pathc; i++) files += file_size(g.gl_pathv[i]);
  globfree(&g);
  assert_int_equal(after.input_bytes - before.input_bytes, files);
  fl_dataset_free(ds);

  /* Records made in memory are no input. */
  assert_ok(fl_range(ctx, 0, 1000, 1, 4, &ds));
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(after.input_bytes, before.input_bytes);
  fl_dataset_free(ds);

  fl_context_close(ctx);
  test_rmtree(dir);
}

/* A reduce_by_key over 5 map partitions into 3: the maps write, the reducers read it all. */
static void shuffle_reads_what_maps_wrote(const char *master) {
  enum { PAIRS = 4000 };
  fl_buf *recs = calloc(PAIRS, sizeof *recs);
  fl_bytes *views = calloc(PAIRS, sizeof *views);
  assert_non_null(recs);
  assert_non_null(views);
  for (int64_t i = 0; i < PAIRS; i++) {
    char key[16];
    snprintf(key, sizeof key, "key%03d", (int)(i % 250));
    assert_ok(fl_buf_put_pair(&recs[i], fl_bytes_str(key), fl_bytes_of(&i, 8)));
    views[i] = fl_buf_bytes(&recs[i]);
  }
  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_dataset *pairs, *sums;
  assert_ok(fl_parallelize(ctx, views, PAIRS, 5, &pairs));
  assert_ok(fl_reduce_by_key(pairs, cp_sum, NULL, 0, NULL, 3, &sums));
  fl_context_stats before, after;
  stats(ctx, &before);
  uint64_t n = 0;
  assert_ok(fl_count(sums, &n));
  stats(ctx, &after);
  assert_int_equal(n, 250);
  uint64_t wrote = after.shuffle_write_bytes - before.shuffle_write_bytes;
  uint64_t read = after.shuffle_read_bytes - before.shuffle_read_bytes;
  fprintf(stderr, "%s: reduce_by_key wrote %llu shuffle bytes, read %llu\n", master,
          (unsigned long long)wrote, (unsigned long long)read);
  assert_true(wrote > 0);
  assert_int_equal(read, wrote);
  assert_int_equal(after.input_bytes, before.input_bytes); /* parallelize: no input */

  /* Counted again: the map output is reused, so only the reducers read, the same bytes. */
  stats(ctx, &before);
  assert_ok(fl_count(sums, &n));
  stats(ctx, &after);
  assert_int_equal(after.shuffle_write_bytes - before.shuffle_write_bytes, 0);
  assert_int_equal(after.shuffle_read_bytes - before.shuffle_read_bytes, wrote);

  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_context_close(ctx);
  for (int i = 0; i < PAIRS; i++) fl_buf_free(&recs[i]);
  free(recs);
  free(views);
}

/* A cached text file: the first count reads the file, the second the cached blocks. */
static void cached_blocks_are_input(const char *master, bool exact) {
  char dir[256], txt[512];
  test_tmpdir(dir, sizeof dir);
  snprintf(txt, sizeof txt, "%s/lines.txt", dir);
  fl_buf text = FL_BUF_INIT;
  size_t len = write_lines(txt, &text);
  fl_buf_free(&text);
  fl_context *ctx;
  assert_ok(fl_context_open(master, NULL, &ctx));
  fl_dataset *ds;
  assert_ok(fl_text_file(ctx, txt, 4, &ds));
  assert_ok(fl_cache(ds));
  fl_context_stats before, after;
  uint64_t n = 0;
  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, LINES);
  assert_int_equal(after.input_bytes - before.input_bytes, len); /* computed: the file */
  assert_true(after.memory_used > 0);

  stats(ctx, &before);
  assert_ok(fl_count(ds, &n));
  stats(ctx, &after);
  assert_int_equal(n, LINES);
  uint64_t read = after.input_bytes - before.input_bytes;
  fprintf(stderr, "%s: the cached count read %llu bytes (%llu cached, file %zu; blocks mapped %llu, fetched %llu)\n",
          master, (unsigned long long)read, (unsigned long long)after.memory_used, len,
          (unsigned long long)(after.blocks_read_mapped - before.blocks_read_mapped),
          (unsigned long long)(after.blocks_read_fetched - before.blocks_read_fetched));
  assert_true(read > 0);
  /* Blocks read where they are kept hold the records without their "\r\n" but with a
   * one-byte length each: LINES bytes less than the file. A block fetched from another
   * executor counts its encoded size instead (the empty fifth split's: a header and an
   * empty LZ4 frame), so then only "not the file" is known. */
  if (after.blocks_read_fetched == before.blocks_read_fetched) assert_int_equal(read, len - LINES);
  else assert_true(read != len);
  if (exact) assert_int_equal(read, after.memory_used); /* one process: the blocks as kept */
  fl_dataset_free(ds);

  if (exact) { /* serialized in memory: the encoded blocks are what a later read reads */
    assert_ok(fl_text_file(ctx, txt, 4, &ds));
    assert_ok(fl_persist(ds, FL_MEMORY_SER));
    stats(ctx, &before);
    assert_ok(fl_count(ds, &n));
    stats(ctx, &after);
    uint64_t encoded = after.memory_used - before.memory_used;
    assert_true(encoded > 0 && encoded < len - LINES);
    stats(ctx, &before);
    assert_ok(fl_count(ds, &n));
    stats(ctx, &after);
    assert_int_equal(after.input_bytes - before.input_bytes, encoded);
    fl_dataset_free(ds);
  }

  fl_context_close(ctx);
  test_rmtree(dir);
}

static void assert_no_children(void) {
  errno = 0;
  assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
  assert_int_equal(errno, ECHILD);
}

static void test_files_local(void **state) {
  (void)state;
  files_read_their_size("local[2]");
}
static void test_shuffle_local(void **state) {
  (void)state;
  shuffle_reads_what_maps_wrote("local[2]");
}
static void test_cache_local(void **state) {
  (void)state;
  cached_blocks_are_input("local[2]", true);
}
static void test_files_cluster(void **state) {
  (void)state;
  files_read_their_size(CLUSTER);
  assert_no_children();
}
static void test_shuffle_cluster(void **state) {
  (void)state;
  shuffle_reads_what_maps_wrote(CLUSTER);
  assert_no_children();
}
static void test_cache_cluster(void **state) {
  (void)state;
  cached_blocks_are_input(CLUSTER, false);
  assert_no_children();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_files_local, arm, disarm),
      cmocka_unit_test_setup_teardown(test_shuffle_local, arm, disarm),
      cmocka_unit_test_setup_teardown(test_cache_local, arm, disarm),
      cmocka_unit_test_setup_teardown(test_files_cluster, arm, disarm),
      cmocka_unit_test_setup_teardown(test_shuffle_cluster, arm, disarm),
      cmocka_unit_test_setup_teardown(test_cache_cluster, arm, disarm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
