/* test_checkpoint.c: fl_checkpoint in local mode: results before and after, a lineage that
 * is cut (functions upstream never run again, cached or not), children, persisted datasets,
 * the files on disk, and every bad-input path: bad folders, and missing, truncated or
 * corrupt part files, which fail the action naming the file instead of being recomputed.
 * Cluster mode is in test_cluster.c. */
#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>

#include "rdd/rdd.h"
#include "test_util.h"

#define N 10000
#define PARTS 6

/* map: x -> (x % 97, x), adding 1 per call to the accumulator in arg. */
fl_status ck_counted_pair(fl_bytes rec, fl_buf *out, const void *arg) {
  fl_status s = fl_accumulator_add_i64(*(const uint64_t *)arg, 1);
  if (s != FL_OK) return s;
  int64_t x = fl_i64(rec), k = x % 97;
  return fl_buf_put_pair(out, fl_bytes_of(&k, 8), fl_bytes_of(&x, 8));
}

fl_status ck_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, fl_i64(a) + fl_i64(b));
}

/* (k, v) -> k * 1000003 + v: one number per pair, to sum and compare. */
fl_status ck_flatten(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes k, v;
  fl_status s = fl_pair(rec, &k, &v);
  if (s != FL_OK) return s;
  return fl_buf_put_i64(out, fl_i64(k) * 1000003 + fl_i64(v));
}

fl_status ck_always_fail(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)out, (void)arg;
  return fl_set_error(FL_EUSER, "no checkpoint for %lld", (long long)fl_i64(rec));
}

typedef struct fixture {
  fl_context *ctx;
  fl_accumulator *calls;
  uint64_t calls_id;
  char dir[256];
  fl_dataset *src, *pairs, *sums; /* range -> counted map -> reduce_by_key */
} fixture;

static void fixture_open(fixture *f, int num_reduce) {
  memset(f, 0, sizeof *f);
  assert_ok(fl_context_open("local[2]", NULL, &f->ctx));
  assert_ok(fl_accumulator_create_i64(f->ctx, &f->calls));
  f->calls_id = fl_accumulator_id(f->calls);
  test_tmpdir(f->dir, sizeof f->dir);
  assert_ok(fl_range(f->ctx, 0, N, 1, PARTS, &f->src));
  assert_ok(fl_map(f->src, ck_counted_pair, &f->calls_id, sizeof f->calls_id, &f->pairs));
  if (num_reduce) assert_ok(fl_reduce_by_key(f->pairs, ck_add, NULL, 0, NULL, (uint32_t)num_reduce, &f->sums));
}

static void fixture_close(fixture *f) {
  fl_dataset_free(f->sums);
  fl_dataset_free(f->pairs);
  fl_dataset_free(f->src);
  fl_accumulator_destroy(f->calls);
  fl_context_close(f->ctx);
  test_rmtree(f->dir);
}

static int64_t calls(const fixture *f) {
  int64_t v = -1;
  assert_ok(fl_accumulator_value_i64(f->calls, &v));
  return v;
}

/* Sum of ck_flatten over ds, and its count. */
static int64_t digest(fl_dataset *ds, uint64_t *count) {
  fl_dataset *flat;
  fl_buf sum = FL_BUF_INIT;
  assert_ok(fl_map(ds, ck_flatten, NULL, 0, &flat));
  assert_ok(fl_count(flat, count));
  assert_ok(fl_reduce(flat, ck_add, NULL, 0, &sum));
  int64_t v = fl_i64(fl_buf_bytes(&sum));
  fl_buf_free(&sum);
  fl_dataset_free(flat);
  return v;
}

/* The folder of ds's part files: the only dir/ctx-* /rdd-* folder. */
static void part_folder(const char *dir, char *out, size_t len) {
  char ctx_dir[512] = "";
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, "ctx-", 4) == 0) {
      snprintf(ctx_dir, sizeof ctx_dir, "%s/%s", dir, e->d_name);
      found++;
    }
  closedir(d);
  assert_int_equal(found, 1);
  d = opendir(ctx_dir);
  assert_non_null(d);
  found = 0;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, "rdd-", 4) == 0) {
      snprintf(out, len, "%s/%s", ctx_dir, e->d_name);
      found++;
    }
  closedir(d);
  assert_int_equal(found, 1);
}

static void test_shuffled_dataset_is_cut(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 5);
  uint64_t n0, n1;
  int64_t before = digest(f.sums, &n0);
  assert_int_equal(n0, 97);
  assert_int_equal(calls(&f), N);
  const fl_partitioner *part = f.sums->partitioner;
  assert_non_null(part);

  assert_ok(fl_checkpoint(f.sums, f.dir));
  assert_int_equal(calls(&f), N); /* the checkpoint job reads the shuffle's output */
  assert_int_equal(fl_dataset_partitions(f.sums), 5);
  assert_int_equal(f.sums->num_parents, 0);
  assert_int_equal(f.sums->num_shuffle_deps, 0);
  assert_ptr_equal(f.sums->partitioner, part); /* kept for later joins and reduces */
  char *lineage = fl_dataset_lineage(f.sums);
  assert_non_null(strstr(lineage, "checkpoint"));
  assert_null(strstr(lineage, "map"));
  free(lineage);

  /* The same results, read from the files, and the counted map never runs again. */
  assert_int_equal(digest(f.sums, &n1), before);
  assert_int_equal(n1, 97);
  assert_int_equal(digest(f.sums, &n1), before);
  assert_int_equal(calls(&f), N);

  /* Five files, no temporary ones; checkpointing again does nothing. */
  char folder[1024];
  part_folder(f.dir, folder, sizeof folder);
  DIR *d = opendir(folder);
  assert_non_null(d);
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') {
      assert_int_equal(strncmp(e->d_name, "part-0000", 9), 0);
      files++;
    } else {
      assert_true(strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0);
    }
  closedir(d);
  assert_int_equal(files, 5);
  assert_ok(fl_checkpoint(f.sums, f.dir));
  assert_int_equal(calls(&f), N);
  fixture_close(&f);
}

/* A narrow dataset, not cached: the map runs once for the checkpoint and never again, and
 * children made before and after the checkpoint read the files. */
static void test_children_read_the_files(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 0);
  fl_dataset *before_child, *after_child, *grouped;
  assert_ok(fl_map(f.pairs, ck_flatten, NULL, 0, &before_child));
  assert_ok(fl_checkpoint(f.pairs, f.dir));
  assert_int_equal(calls(&f), N);
  assert_ok(fl_map(f.pairs, ck_flatten, NULL, 0, &after_child));
  fl_buf a = FL_BUF_INIT, b = FL_BUF_INIT;
  assert_ok(fl_reduce(before_child, ck_add, NULL, 0, &a));
  assert_ok(fl_reduce(after_child, ck_add, NULL, 0, &b));
  int64_t want = 0;
  for (int64_t x = 0; x < N; x++) want += (x % 97) * 1000003 + x;
  assert_int_equal(fl_i64(fl_buf_bytes(&a)), want);
  assert_int_equal(fl_i64(fl_buf_bytes(&b)), want);
  /* A wide child too. */
  assert_ok(fl_reduce_by_key(f.pairs, ck_add, NULL, 0, NULL, 3, &grouped));
  uint64_t n;
  assert_ok(fl_count(grouped, &n));
  assert_int_equal(n, 97);
  assert_int_equal(calls(&f), N);
  /* The source no longer matters: freeing it changes nothing. */
  fl_dataset_free(f.src);
  f.src = NULL;
  assert_ok(fl_count(f.pairs, &n));
  assert_int_equal(n, N);
  fl_buf_free(&a);
  fl_buf_free(&b);
  fl_dataset_free(grouped);
  fl_dataset_free(after_child);
  fl_dataset_free(before_child);
  assert_int_equal(calls(&f), N);
  fixture_close(&f);
}

/* A persisted dataset is checkpointed from its cached blocks and stays persisted. */
static void test_persisted_dataset(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 0);
  assert_ok(fl_persist(f.pairs, FL_MEMORY_AND_DISK));
  uint64_t n;
  assert_ok(fl_count(f.pairs, &n));
  assert_int_equal(calls(&f), N);
  assert_ok(fl_checkpoint(f.pairs, f.dir));
  assert_int_equal(calls(&f), N); /* read from the cache */
  fl_storage_info info;
  assert_ok(fl_storage_info_get(f.pairs, &info));
  assert_int_equal(info.level, FL_MEMORY_AND_DISK);
  assert_int_equal(info.cached_partitions, PARTS);
  uint64_t count;
  int64_t d1 = digest(f.pairs, &count);
  assert_int_equal(count, N);
  assert_ok(fl_unpersist(f.pairs));
  assert_int_equal(digest(f.pairs, &count), d1); /* now from the files */
  assert_int_equal(calls(&f), N);
  fixture_close(&f);
}

/* A checkpoint whose job fails returns the job's error, leaves no files and no change. */
static void test_failed_job_leaves_nothing(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 0);
  fl_dataset *bad;
  assert_ok(fl_map(f.src, ck_always_fail, NULL, 0, &bad));
  assert_fails_with(fl_checkpoint(bad, f.dir), FL_EJOB, "no checkpoint for");
  char *lineage = fl_dataset_lineage(bad);
  assert_null(strstr(lineage, "checkpoint"));
  free(lineage);
  char ctx_dir[512] = "";
  DIR *d = opendir(f.dir);
  struct dirent *e;
  while ((e = readdir(d)))
    if (strncmp(e->d_name, "ctx-", 4) == 0) snprintf(ctx_dir, sizeof ctx_dir, "%s/%s", f.dir, e->d_name);
  closedir(d);
  d = opendir(ctx_dir);
  assert_non_null(d);
  while ((e = readdir(d))) assert_int_equal(e->d_name[0], '.');
  closedir(d);
  fl_dataset_free(bad);
  fixture_close(&f);
}

static void test_bad_folders(void **state) {
  (void)state;
  fixture f;
  fixture_open(&f, 0);
  assert_fails_with(fl_checkpoint(NULL, f.dir), FL_EINVAL, "dataset is NULL");
  assert_fails_with(fl_checkpoint(f.pairs, NULL), FL_EINVAL, "NULL or empty");
  assert_fails_with(fl_checkpoint(f.pairs, ""), FL_EINVAL, "NULL or empty");
  /* Not creatable: a folder inside a plain file. */
  char file[512], under[600];
  snprintf(file, sizeof file, "%s/plain", f.dir);
  test_write_file(file, "x", 1);
  snprintf(under, sizeof under, "%s/sub", file);
  assert_fails_with(fl_checkpoint(f.pairs, under), FL_EIO, under);
  /* Not writable: a read-only folder (root writes anywhere, but not into /sys). */
  char ro[512];
  if (geteuid() == 0) {
    snprintf(ro, sizeof ro, "/sys");
  } else {
    snprintf(ro, sizeof ro, "%s/ro", f.dir);
    assert_int_equal(mkdir(ro, 0555), 0);
  }
  assert_fails_with(fl_checkpoint(f.pairs, ro), FL_EIO, ro);
  assert_int_equal(calls(&f), 0); /* nothing ran */
  uint64_t n;
  assert_ok(fl_count(f.pairs, &n)); /* and the dataset is as it was */
  assert_int_equal(calls(&f), N);
  fixture_close(&f);
}

/* Damages part-00001 with `damage`, then expects every action to fail naming the file. */
typedef void (*damage_fn)(const char *path);

static void damage_remove(const char *path) { assert_int_equal(unlink(path), 0); }
static void damage_truncate_header(const char *path) { assert_int_equal(truncate(path, 20), 0); }
static void damage_truncate_payload(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size - 7), 0);
}
static void flip_byte(const char *path, off_t at_from_end, off_t at) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  off_t off = at_from_end ? st.st_size - at_from_end : at;
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, off), 1);
  b ^= 0x5a;
  assert_int_equal(pwrite(fd, &b, 1, off), 1);
  close(fd);
}
static void damage_payload(const char *path) { flip_byte(path, 3, 0); }
static void damage_magic(const char *path) { flip_byte(path, 0, 1); }
static void damage_crc(const char *path) { flip_byte(path, 0, 13); }
static void damage_count(const char *path) { flip_byte(path, 0, 16); }

/* want: the action's status (FL_ECORRUPT for damaged contents, FL_EJOB for a missing file). */
static void damaged_file_fails(damage_fn damage, const char *needle, fl_status want) {
  fixture f;
  fixture_open(&f, 0);
  assert_ok(fl_checkpoint(f.pairs, f.dir));
  char folder[1024], path[1100];
  part_folder(f.dir, folder, sizeof folder);
  snprintf(path, sizeof path, "%s/part-00001", folder);
  damage(path);
  uint64_t n;
  fl_status s = fl_count(f.pairs, &n);
  if (s != want || !strstr(fl_last_error(), path) || !strstr(fl_last_error(), needle))
    fprintf(stderr, "got %s: %s\n", fl_status_name(s), fl_last_error());
  assert_int_equal(s, want);
  assert_non_null(strstr(fl_last_error(), path));
  assert_non_null(strstr(fl_last_error(), needle));
  /* A child fails the same way, and nothing was recomputed from the old lineage. */
  fl_dataset *child;
  assert_ok(fl_map(f.pairs, ck_flatten, NULL, 0, &child));
  assert_int_equal(fl_count(child, &n), want);
  assert_non_null(strstr(fl_last_error(), path));
  fl_dataset_free(child);
  assert_int_equal(calls(&f), N);
  fixture_close(&f);
}

/* Every kind of damage, each on a fresh checkpoint. */
static void test_damaged_files(void **state) {
  (void)state;
  static const struct {
    damage_fn damage;
    const char *needle;
    fl_status want;
  } cases[] = {
      {damage_remove, "No such file", FL_EJOB},
      {damage_truncate_header, "truncated header", FL_ECORRUPT},
      {damage_truncate_payload, "corrupt", FL_ECORRUPT},
      {damage_payload, "corrupt", FL_ECORRUPT},
      {damage_magic, "bad magic", FL_ECORRUPT},
      {damage_crc, "CRC32C mismatch", FL_ECORRUPT},
      {damage_count, "records than its header says", FL_ECORRUPT},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    damaged_file_fails(cases[i].damage, cases[i].needle, cases[i].want);
}

/* An empty dataset and empty partitions make valid (header-only) files. */
static void test_empty_partitions(void **state) {
  (void)state;
  fl_context *ctx;
  char dir[256];
  test_tmpdir(dir, sizeof dir);
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_dataset *ds;
  assert_ok(fl_range(ctx, 0, 3, 1, 7, &ds));
  assert_ok(fl_checkpoint(ds, dir));
  uint64_t n;
  assert_ok(fl_count(ds, &n));
  assert_int_equal(n, 3);
  fl_records *recs;
  assert_ok(fl_collect(ds, &recs));
  assert_int_equal(fl_records_count(recs), 3);
  for (size_t i = 0; i < 3; i++) assert_int_equal(fl_i64(fl_records_get(recs, i)), (int64_t)i);
  fl_records_free(recs);
  fl_dataset_free(ds);
  fl_context_close(ctx);
  test_rmtree(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shuffled_dataset_is_cut),
      cmocka_unit_test(test_children_read_the_files),
      cmocka_unit_test(test_persisted_dataset),
      cmocka_unit_test(test_failed_job_leaves_nothing),
      cmocka_unit_test(test_bad_folders),
      cmocka_unit_test(test_damaged_files),
      cmocka_unit_test(test_empty_partitions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
