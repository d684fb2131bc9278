/*
 * test_config: the settings registry (common/config.h), README.md's table of environment
 * variables against it, and `flint config`.
 *
 * The getters are tested in this process (setenv, then a read); `flint config` runs as a
 * child (tests/run_child.h) from $FLINT_BIN (ctest sets it), else from this test's folder.
 * README.md is found through FLINT_SOURCE_DIR, a compile definition (tests/CMakeLists.txt).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>

#include "test_util.h"
#include "run_child.h"

#include "common/config.h"

#define CHILD_ALARM_S 60
#define PARENT_LIMIT_S 90

static char flint_path[PATH_MAX + 16];

/* ---- helpers --------------------------------------------------------------------------- */

/* What this process writes to stderr between stderr_capture_start and _end. */
static int saved_stderr = -1;
static char capture_path[] = "/tmp/flint-test-config-XXXXXX";

static void stderr_capture_start(void) {
  fflush(stderr);
  int fd = mkstemp(capture_path);
  assert_true(fd >= 0);
  saved_stderr = dup(2);
  assert_true(saved_stderr >= 0);
  assert_int_equal(dup2(fd, 2), 2);
  close(fd);
}

/* Returns the captured text (the caller frees it) and puts stderr back. */
static char *stderr_capture_end(void) {
  fflush(stderr);
  assert_int_equal(dup2(saved_stderr, 2), 2);
  close(saved_stderr);
  saved_stderr = -1;
  FILE *f = fopen(capture_path, "r");
  assert_non_null(f);
  char *text = calloc(1, 1 << 16);
  assert_non_null(text);
  size_t n = fread(text, 1, (1 << 16) - 1, f);
  text[n] = '\0';
  fclose(f);
  unlink(capture_path);
  strcpy(capture_path, "/tmp/flint-test-config-XXXXXX");
  return text;
}

/* How many times `needle` occurs in `text`. */
static int occurrences(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* ---- the table ------------------------------------------------------------------------- */

static void test_table_is_well_formed(void **state) {
  (void)state;
  assert_true(CONFIG_SETTINGS > 40);
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    const config_setting *s = config_setting_of((config_id)i);
    assert_int_equal(strncmp(s->name, "FLINT_", 6), 0);
    assert_true(strlen(s->name) > 6);
    assert_true(*s->default_text);
    assert_true(*s->description);
    assert_string_not_equal(config_readers_text(s->readers), "?");
    assert_string_not_equal(config_type_name(s->type), "?");
    config_id found;
    assert_true(config_find(s->name, &found));
    assert_int_equal(found, i); /* no name twice */
    if (s->flags & CONFIG_NO_LIMIT) assert_true(s->type == CONFIG_TYPE_COUNT || s->type == CONFIG_TYPE_MS);
    if (s->type == CONFIG_TYPE_COUNT || s->type == CONFIG_TYPE_MS || s->type == CONFIG_TYPE_US ||
        s->type == CONFIG_TYPE_SIZE || s->type == CONFIG_TYPE_MEMORY || s->type == CONFIG_TYPE_BOOL)
      assert_true(s->min <= s->max && s->max > 0);
  }
  config_id id;
  assert_false(config_find("FLINT_NO_SUCH_SETTING", &id));
  assert_false(config_find(NULL, &id));
}

/* Every row's default is read by its getter (a default the rules reject would abort), and with
 * the variable unset the value comes from the default. */
static void test_every_default_reads(void **state) {
  (void)state;
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    config_id id = (config_id)i;
    const config_setting *s = config_setting_of(id);
    assert_int_equal(unsetenv(s->name), 0);
    assert_int_equal(config_source_of(id), CONFIG_FROM_DEFAULT);
    assert_null(config_text(id));
    assert_int_equal(config_check(id), FL_OK);
    assert_false(config_given(id));
    bool computed = (s->flags & CONFIG_COMPUTED) != 0;
    switch (s->type) {
    case CONFIG_TYPE_BOOL: (void)config_bool(id); break;
    case CONFIG_TYPE_COUNT: if (computed) assert_int_equal(config_count(id), 0); else (void)config_count(id); break;
    case CONFIG_TYPE_MS: if (computed) assert_int_equal(config_ms(id), 0); else (void)config_ms(id); break;
    case CONFIG_TYPE_US: if (computed) assert_int_equal(config_us(id), 0); else (void)config_us(id); break;
    case CONFIG_TYPE_SIZE: if (computed) assert_int_equal(config_size(id), 0); else (void)config_size(id); break;
    case CONFIG_TYPE_MEMORY: if (computed) assert_int_equal(config_memory(id), 0); else (void)config_memory(id); break;
    case CONFIG_TYPE_REAL: (void)config_real(id); break;
    case CONFIG_TYPE_STRING:
    case CONFIG_TYPE_PATH:
      if (computed) assert_null(config_string(id));
      else assert_string_equal(config_string(id), s->default_text);
      break;
    }
  }
  /* A few defaults as their readers had them before the registry. */
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 3);
  assert_int_equal(config_ms(CONFIG_EXECUTOR_TIMEOUT_MS), 10000);
  assert_int_equal(config_ms(CONFIG_DRIVER_TIMEOUT_MS), 30000);
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 64ull << 20);
  assert_int_equal(config_size(CONFIG_COMM_SOCKBUF), 4ull << 20);
  assert_int_equal(config_size(CONFIG_COMM_SINGLE_COPY_MIN), 128ull << 10);
  assert_int_equal(config_ms(CONFIG_COMM_TIMEOUT_MS), 300000);
  assert_int_equal(config_limit(CONFIG_DP_MAX_CONNECTIONS), 1024);
  assert_int_equal(config_limit(CONFIG_RPC_IDLE_TIMEOUT_MS), 300000);
  assert_true(config_bool(CONFIG_NODE_OFFERS));
  assert_false(config_bool(CONFIG_SPECULATION));
  assert_true(config_real(CONFIG_SPECULATION_QUANTILE) == 0.75);
  assert_true(config_real(CONFIG_SPECULATION_MULTIPLIER) == 1.5);
  assert_string_equal(config_string(CONFIG_LOG), "info");
  assert_string_equal(config_string(CONFIG_COMM_HOST), "127.0.0.1");
}

/* ---- parsing --------------------------------------------------------------------------- */

static void test_valid_values(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "250", 1);
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 250);
  assert_int_equal(config_source_of(CONFIG_LOCALITY_WAIT_MS), CONFIG_FROM_ENVIRONMENT);
  assert_string_equal(config_text(CONFIG_LOCALITY_WAIT_MS), "250");
  assert_true(config_given(CONFIG_LOCALITY_WAIT_MS));
  assert_int_equal(config_check(CONFIG_LOCALITY_WAIT_MS), FL_OK);
  /* read afresh at every call: a test that changes a variable sees the change */
  setenv("FLINT_LOCALITY_WAIT_MS", "0", 1);
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 0);
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 3);

  setenv("FLINT_EXCLUDE_FAILURES", "4294967295", 1);
  assert_int_equal(config_count(CONFIG_EXCLUDE_FAILURES), 4294967295ull);
  unsetenv("FLINT_EXCLUDE_FAILURES");

  setenv("FLINT_SHUFFLE_MEMORY", "2g", 1);
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 2ull << 30);
  setenv("FLINT_SHUFFLE_MEMORY", "1048576b", 1);
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 1048576);
  unsetenv("FLINT_SHUFFLE_MEMORY");

  setenv("FLINT_SPECULATION_QUANTILE", "0.5", 1);
  assert_true(config_real(CONFIG_SPECULATION_QUANTILE) == 0.5);
  setenv("FLINT_SPECULATION_QUANTILE", "1e-1", 1);
  assert_true(config_real(CONFIG_SPECULATION_QUANTILE) == 0.1);
  unsetenv("FLINT_SPECULATION_QUANTILE");

  setenv("FLINT_COMM_HOST", "10.0.0.7", 1);
  assert_string_equal(config_string(CONFIG_COMM_HOST), "10.0.0.7");
  unsetenv("FLINT_COMM_HOST");
  setenv("FLINT_WORK_DIR", "/var/tmp/x", 1);
  assert_string_equal(config_string(CONFIG_WORK_DIR), "/var/tmp/x");
  unsetenv("FLINT_WORK_DIR");

  setenv("FLINT_SPIN_US", "0", 1); /* a computed default: 0 from the environment is given */
  assert_true(config_given(CONFIG_SPIN_US));
  assert_int_equal(config_us(CONFIG_SPIN_US), 0);
  setenv("FLINT_SPIN_US", "9999999", 1);
  assert_int_equal(config_us(CONFIG_SPIN_US), 9999999);
  unsetenv("FLINT_SPIN_US");
}

static void test_booleans(void **state) {
  (void)state;
  const struct {
    const char *text;
    bool on;
    config_source source;
  } cases[] = {{"0", false, CONFIG_FROM_ENVIRONMENT}, {"1", true, CONFIG_FROM_ENVIRONMENT},
               {"2", true, CONFIG_FROM_ENVIRONMENT},  {"", true, CONFIG_FROM_DEFAULT},
               {"yes", true, CONFIG_FROM_INVALID},     {"-1", true, CONFIG_FROM_INVALID}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    setenv("FLINT_NODE_OFFERS", cases[i].text, 1); /* default 1 */
    stderr_capture_start();
    bool on = config_bool(CONFIG_NODE_OFFERS);
    free(stderr_capture_end());
    assert_int_equal(on, cases[i].on);
    assert_int_equal(config_source_of(CONFIG_NODE_OFFERS), cases[i].source);
  }
  unsetenv("FLINT_NODE_OFFERS");
}

/* Empty is unset; 0 means "no limit" where the row says so. */
static void test_empty_and_zero(void **state) {
  (void)state;
  setenv("FLINT_DP_MAX_CONNECTIONS", "", 1);
  assert_int_equal(config_limit(CONFIG_DP_MAX_CONNECTIONS), 1024);
  assert_int_equal(config_source_of(CONFIG_DP_MAX_CONNECTIONS), CONFIG_FROM_DEFAULT);
  assert_null(config_text(CONFIG_DP_MAX_CONNECTIONS));
  setenv("FLINT_DP_MAX_CONNECTIONS", "0", 1);
  assert_int_equal(config_limit(CONFIG_DP_MAX_CONNECTIONS), -1);
  assert_int_equal(config_count(CONFIG_DP_MAX_CONNECTIONS), 0);
  setenv("FLINT_DP_MAX_CONNECTIONS", "7", 1);
  assert_int_equal(config_limit(CONFIG_DP_MAX_CONNECTIONS), 7);
  unsetenv("FLINT_DP_MAX_CONNECTIONS");
  setenv("FLINT_RPC_HANDSHAKE_TIMEOUT_MS", "0", 1);
  assert_int_equal(config_limit(CONFIG_RPC_HANDSHAKE_TIMEOUT_MS), -1);
  unsetenv("FLINT_RPC_HANDSHAKE_TIMEOUT_MS");
  /* A setting without CONFIG_NO_LIMIT keeps its 0 */
  setenv("FLINT_NO_EXECUTOR_WARN_MS", "0", 1);
  assert_int_equal(config_ms(CONFIG_NO_EXECUTOR_WARN_MS), 0);
  unsetenv("FLINT_NO_EXECUTOR_WARN_MS");
  /* Empty text is unset for strings too */
  setenv("FLINT_COMM_HOST", "", 1);
  assert_string_equal(config_string(CONFIG_COMM_HOST), "127.0.0.1");
  setenv("FLINT_TRACE", "", 1);
  assert_null(config_string(CONFIG_TRACE));
  unsetenv("FLINT_COMM_HOST");
  unsetenv("FLINT_TRACE");
}

/* Anything but the whole number in range is invalid: the default, a warning naming the
 * variable and the default, and config_check's error. */
static void test_invalid_values(void **state) {
  (void)state;
  const struct {
    const char *name, *text;
    config_id id;
  } cases[] = {
      {"FLINT_EXCLUDE_MS", "abc", CONFIG_EXCLUDE_MS},
      {"FLINT_EXCLUDE_MS", "-1", CONFIG_EXCLUDE_MS},
      {"FLINT_EXCLUDE_MS", " 5", CONFIG_EXCLUDE_MS},
      {"FLINT_EXCLUDE_MS", "+5", CONFIG_EXCLUDE_MS},
      {"FLINT_EXCLUDE_MS", "5ms", CONFIG_EXCLUDE_MS},
      {"FLINT_EXCLUDE_MS", "18446744073709551616", CONFIG_EXCLUDE_MS}, /* 2^64 */
      {"FLINT_EXCLUDE_MS", "9223372036854775808", CONFIG_EXCLUDE_MS},  /* over the range */
      {"FLINT_DRIVER_TIMEOUT_MS", "0", CONFIG_DRIVER_TIMEOUT_MS},      /* min 1 */
      {"FLINT_COMM_TIMEOUT_MS", "4294967296", CONFIG_COMM_TIMEOUT_MS}, /* over 32 bits */
      {"FLINT_SPIN_US", "10000000", CONFIG_SPIN_US},                   /* 10 s and more */
      {"FLINT_SHUFFLE_MEMORY", "lots", CONFIG_SHUFFLE_MEMORY},
      {"FLINT_SHUFFLE_MEMORY", "-64m", CONFIG_SHUFFLE_MEMORY},
      {"FLINT_SHUFFLE_MEMORY", "1e3", CONFIG_SHUFFLE_MEMORY},
      {"FLINT_SHUFFLE_MEMORY", "0.1b", CONFIG_SHUFFLE_MEMORY},
      {"FLINT_SPECULATION_MULTIPLIER", "1.5x", CONFIG_SPECULATION_MULTIPLIER},
      {"FLINT_SPECULATION_MULTIPLIER", "inf", CONFIG_SPECULATION_MULTIPLIER},
      {"FLINT_SPECULATION_MULTIPLIER", "nan", CONFIG_SPECULATION_MULTIPLIER},
      {"FLINT_SPECULATION_MULTIPLIER", " 2", CONFIG_SPECULATION_MULTIPLIER},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    config_id id = cases[i].id;
    const config_setting *s = config_setting_of(id);
    setenv(cases[i].name, cases[i].text, 1);
    assert_int_equal(config_source_of(id), CONFIG_FROM_INVALID);
    assert_fails_with(config_check(id), FL_EINVAL, cases[i].name);
    assert_non_null(strstr(fl_last_error(), cases[i].text));
    stderr_capture_start();
    bool given = config_given(id);
    switch (s->type) {
    case CONFIG_TYPE_MS: assert_int_equal(config_ms(id), strtoull(s->default_text, NULL, 10)); break;
    case CONFIG_TYPE_MEMORY: assert_int_equal(config_memory(id), 64ull << 20); break;
    case CONFIG_TYPE_REAL: assert_true(config_real(id) == 1.5); break;
    case CONFIG_TYPE_US: assert_int_equal(config_us(id), 0); break; /* computed: the reader's */
    default: fail();
    }
    char *log = stderr_capture_end();
    assert_false(given);
    char expect[256];
    snprintf(expect, sizeof expect, "%s=%s is not", cases[i].name, cases[i].text);
    if (!strstr(log, expect) || !strstr(log, s->default_text))
      fprintf(stderr, "case %zu: the warning '%s' lacks '%s' or '%s'\n", i, log, expect, s->default_text);
    assert_non_null(strstr(log, expect));
    assert_non_null(strstr(log, s->default_text));
    assert_int_equal(occurrences(log, expect), 1); /* once per value, not at every read */
    free(log);
    unsetenv(cases[i].name);
  }
}

/* FLINT_MEMORY's error as fl_context_open reported it before the registry. */
static void test_check_names_the_variable(void **state) {
  (void)state;
  setenv("FLINT_MEMORY", "lots", 1);
  assert_fails_with(config_check(CONFIG_MEMORY), FL_EINVAL, "FLINT_MEMORY: 'lots' is not a size");
  setenv("FLINT_MEMORY", "64m", 1);
  assert_int_equal(config_check(CONFIG_MEMORY), FL_OK);
  assert_true(config_given(CONFIG_MEMORY));
  assert_int_equal(config_memory(CONFIG_MEMORY), 64ull << 20);
  unsetenv("FLINT_MEMORY");
  assert_false(config_given(CONFIG_MEMORY));
  assert_int_equal(config_memory(CONFIG_MEMORY), 0); /* computed: the reader's default */
}

/* The memory settings read sizes as `flint submit --memory` does (one parser,
 * common_parse_memory): a bare number is MiB, wherever the value comes from; byte-sized
 * settings keep bare numbers as bytes. */
static void test_memory_bare_number_is_mib(void **state) {
  (void)state;
  setenv("FLINT_MEMORY", "2048", 1);
  assert_int_equal(config_memory(CONFIG_MEMORY), 2048ull << 20);
  setenv("FLINT_MEMORY", "1.5g", 1);
  assert_int_equal(config_memory(CONFIG_MEMORY), 3ull << 29);
  setenv("FLINT_MEMORY", "512MiB", 1);
  assert_int_equal(config_memory(CONFIG_MEMORY), 512ull << 20);
  unsetenv("FLINT_MEMORY");
  setenv("FLINT_SHUFFLE_MEMORY", "16", 1);
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 16ull << 20);
  setenv("FLINT_SHUFFLE_MEMORY", "0", 1); /* within the range: zero bytes */
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 0);
  unsetenv("FLINT_SHUFFLE_MEMORY");
  /* --conf takes the same rule */
  assert_int_equal(config_set_command_line("shuffle_memory=32"), FL_OK);
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 32ull << 20);
  assert_int_equal(config_set_command_line("FLINT_SHUFFLE_MEMORY="), FL_OK); /* undone */
  unsetenv("FLINT_SHUFFLE_MEMORY");
  assert_int_equal(config_memory(CONFIG_SHUFFLE_MEMORY), 64ull << 20);
  /* and flint-defaults.conf */
  char path[] = "/tmp/flint-test-memory-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  static const char line[] = "memory 3072\n";
  assert_int_equal(write(fd, line, sizeof line - 1), (ssize_t)(sizeof line - 1));
  close(fd);
  assert_int_equal(config_file_use(path), FL_OK);
  assert_int_equal(config_source_of(CONFIG_MEMORY), CONFIG_FROM_FILE);
  assert_int_equal(config_memory(CONFIG_MEMORY), 3ull << 30);
  assert_int_equal(config_file_use(NULL), FL_OK);
  unlink(path);
  /* a size setting in bytes is not a memory setting */
  setenv("FLINT_COMM_SOCKBUF", "2048", 1);
  assert_int_equal(config_size(CONFIG_COMM_SOCKBUF), 2048);
  unsetenv("FLINT_COMM_SOCKBUF");
  /* the parser itself */
  uint64_t v = 42;
  assert_true(common_parse_memory("0", &v));
  assert_int_equal(v, 0);
  assert_true(common_parse_memory("2048", &v));
  assert_int_equal(v, 2048ull << 20);
  assert_true(common_parse_memory("100b", &v));
  assert_int_equal(v, 100);
  v = 42;
  assert_false(common_parse_memory(NULL, &v));
  assert_false(common_parse_memory("0.1b", &v));
  assert_false(common_parse_memory(" 1g", &v));
  assert_int_equal(v, 42);
}

/* One warning per bad value: reading it again is quiet, a new bad value warns again. */
static void test_warns_once_per_value(void **state) {
  (void)state;
  stderr_capture_start();
  setenv("FLINT_EXCLUDE_FAILURES", "many", 1);
  for (int i = 0; i < 5; i++) assert_int_equal(config_count(CONFIG_EXCLUDE_FAILURES), 3);
  setenv("FLINT_EXCLUDE_FAILURES", "lots", 1);
  for (int i = 0; i < 5; i++) assert_int_equal(config_count(CONFIG_EXCLUDE_FAILURES), 3);
  char *log = stderr_capture_end();
  assert_int_equal(occurrences(log, "FLINT_EXCLUDE_FAILURES=many"), 1);
  assert_int_equal(occurrences(log, "FLINT_EXCLUDE_FAILURES=lots"), 1);
  free(log);
  /* config_source_of and config_check log nothing */
  stderr_capture_start();
  setenv("FLINT_EXCLUDE_FAILURES", "plenty", 1);
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_FAILURES), CONFIG_FROM_INVALID);
  assert_int_equal(config_check(CONFIG_EXCLUDE_FAILURES), FL_EINVAL);
  log = stderr_capture_end();
  assert_null(strstr(log, "plenty"));
  free(log);
  unsetenv("FLINT_EXCLUDE_FAILURES");
}

/* Getters from several threads at once (the environment unchanged meanwhile). */
static void *read_many(void *arg) {
  (void)arg;
  uint64_t sum = 0;
  for (int i = 0; i < 20000; i++)
    sum += config_ms(CONFIG_LOCALITY_WAIT_MS) + config_count(CONFIG_EXCLUDE_FAILURES) +
           (uint64_t)strlen(config_string(CONFIG_LOG));
  return (void *)(uintptr_t)sum;
}

static void test_threads(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "5", 1);
  setenv("FLINT_EXCLUDE_FAILURES", "bad", 1); /* the warning races to be the one */
  pthread_t t[4];
  stderr_capture_start();
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, read_many, NULL), 0);
  for (int i = 0; i < 4; i++) {
    void *sum;
    assert_int_equal(pthread_join(t[i], &sum), 0);
    assert_int_equal((uintptr_t)sum, 20000ull * (5 + 3 + 4));
  }
  char *log = stderr_capture_end();
  assert_int_equal(occurrences(log, "FLINT_EXCLUDE_FAILURES=bad"), 1);
  free(log);
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  unsetenv("FLINT_EXCLUDE_FAILURES");
}

/* ---- README.md's table ----------------------------------------------------------------- */

/* `cell` without backticks and surrounding spaces, into out. */
static void plain_cell(const char *cell, size_t len, char *out, size_t cap) {
  while (len && *cell == ' ') cell++, len--;
  while (len && cell[len - 1] == ' ') len--;
  size_t k = 0;
  for (size_t i = 0; i < len && k + 1 < cap; i++)
    if (cell[i] != '`') out[k++] = cell[i];
  out[k] = '\0';
}

/* The table under "| variable | default | read by | what |": each row's variable, default and
 * readers must be the registry's, and each setting must have its row. */
static void test_readme_table_matches_registry(void **state) {
  (void)state;
  const char *path = FLINT_SOURCE_DIR "/README.md";
  FILE *f = fopen(path, "r");
  if (!f) fprintf(stderr, "cannot open %s\n", path);
  assert_non_null(f);
  bool in_table = false, seen[CONFIG_SETTINGS] = {false};
  int rows = 0, mismatches = 0;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "| variable | default | read by | what |", 38) == 0) {
      assert_false(in_table); /* one such table */
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (strncmp(line, "| ---", 5) == 0) continue;
    if (line[0] != '|') {
      if (rows) break; /* the table's end */
      continue;
    }
    /* | `FLINT_X` | default | read by | what | */
    const char *cells[4];
    size_t lens[4];
    const char *p = line + 1;
    int n = 0;
    for (; n < 4; n++) {
      const char *bar = strchr(p, '|');
      if (!bar) break;
      cells[n] = p;
      lens[n] = (size_t)(bar - p);
      p = bar + 1;
    }
    if (n < 4) fprintf(stderr, "README.md: a row with fewer than 4 cells: %s", line);
    assert_int_equal(n, 4);
    char name[128], def[256], readers[64];
    plain_cell(cells[0], lens[0], name, sizeof name);
    plain_cell(cells[1], lens[1], def, sizeof def);
    plain_cell(cells[2], lens[2], readers, sizeof readers);
    rows++;
    config_id id;
    if (!config_find(name, &id)) {
      fprintf(stderr, "README.md lists %s, which common/config.h does not declare\n", name);
      mismatches++;
      continue;
    }
    const config_setting *s = config_setting_of(id);
    if (seen[id]) {
      fprintf(stderr, "README.md lists %s twice\n", name);
      mismatches++;
    }
    seen[id] = true;
    if (strcmp(def, s->default_text) != 0) {
      fprintf(stderr, "%s: README.md's default is '%s', common/config.h's '%s'\n", name, def, s->default_text);
      mismatches++;
    }
    if (strcmp(readers, config_readers_text(s->readers)) != 0) {
      fprintf(stderr, "%s: README.md says it is read by '%s', common/config.h by '%s'\n", name, readers,
              config_readers_text(s->readers));
      mismatches++;
    }
  }
  fclose(f);
  if (!in_table) fprintf(stderr, "README.md has no '| variable | default | read by | what |' table\n");
  assert_true(in_table);
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++)
    if (!seen[i]) {
      fprintf(stderr, "README.md's table lacks %s (common/config.h declares it)\n", config_setting_of(i)->name);
      mismatches++;
    }
  assert_int_equal(mismatches, 0);
  assert_int_equal(rows, CONFIG_SETTINGS);
}

/* ---- flint config ---------------------------------------------------------------------- */

static run_result *run_flint(const char *const *args) {
  return run_child(flint_path, NULL, args, CHILD_ALARM_S, PARENT_LIMIT_S);
}
#define RUN_FLINT(...) run_flint((const char *const[]){__VA_ARGS__, NULL})

static void expect_status(const run_result *r, int status) {
  if (r->status != status) {
    fprintf(stderr, "expected exit status %d\n", status);
    run_dump(r);
  }
  assert_int_equal(r->status, status);
}

/* The line of `text` that starts with `start`, copied into out; false when there is none. */
static bool line_starting(const char *text, const char *start, char *out, size_t cap) {
  size_t n = strlen(start);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, start, n) != 0) continue;
    const char *end = strchr(p, '\n');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len >= cap) len = cap - 1;
    memcpy(out, p, len);
    out[len] = '\0';
    return true;
  }
  return false;
}

static void test_flint_config_table(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "250", 1);
  setenv("FLINT_SECRET", "do-not-print-me", 1);
  setenv("FLINT_EXCLUDE_MS", "soon", 1);
  run_result *r = RUN_FLINT("config");
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  unsetenv("FLINT_SECRET");
  unsetenv("FLINT_EXCLUDE_MS");
  expect_status(r, 0);
  assert_int_equal(strncmp(r->out, "NAME ", 5), 0);
  assert_non_null(strstr(r->out, "VALUE"));
  assert_non_null(strstr(r->out, "SOURCE"));
  assert_non_null(strstr(r->out, "DESCRIPTION"));
  char row[1024], start[96];
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    const config_setting *s = config_setting_of((config_id)i);
    snprintf(start, sizeof start, "%s ", s->name);
    if (!line_starting(r->out, start, row, sizeof row)) run_dump(r);
    assert_true(line_starting(r->out, start, row, sizeof row));
    assert_non_null(strstr(row, s->description));
    assert_non_null(strstr(row, config_readers_text(s->readers)));
  }
  assert_true(line_starting(r->out, "FLINT_LOCALITY_WAIT_MS ", row, sizeof row));
  assert_non_null(strstr(row, " 250 "));
  assert_non_null(strstr(row, " environment "));
  assert_non_null(strstr(row, " ms "));
  assert_true(line_starting(r->out, "FLINT_SHUFFLE_MEMORY ", row, sizeof row));
  assert_non_null(strstr(row, " 64m "));
  assert_non_null(strstr(row, " default "));
  assert_non_null(strstr(row, " MiB ")); /* a bare number's unit */
  assert_true(line_starting(r->out, "FLINT_COMM_SOCKBUF ", row, sizeof row));
  assert_non_null(strstr(row, " bytes "));
  /* a secret is never printed */
  assert_null(strstr(r->out, "do-not-print-me"));
  assert_true(line_starting(r->out, "FLINT_SECRET ", row, sizeof row));
  assert_non_null(strstr(row, "(hidden)"));
  /* an invalid value: the default it falls back to, and why */
  assert_true(line_starting(r->out, "FLINT_EXCLUDE_MS ", row, sizeof row));
  assert_non_null(strstr(row, " 60000 "));
  assert_non_null(strstr(row, " invalid "));
  assert_non_null(strstr(r->out, "invalid: FLINT_EXCLUDE_MS: 'soon' is not a whole number of milliseconds"));
  free(r);
}

static void test_flint_config_json(void **state) {
  (void)state;
  setenv("FLINT_LOCALITY_WAIT_MS", "250", 1);
  setenv("FLINT_SECRET", "do-not-print-me", 1);
  setenv("FLINT_APP_NAME", "say \"hi\"\\", 1);
  run_result *r = RUN_FLINT("config", "--json");
  unsetenv("FLINT_LOCALITY_WAIT_MS");
  unsetenv("FLINT_SECRET");
  unsetenv("FLINT_APP_NAME");
  expect_status(r, 0);
  /* one object a line, one line a setting */
  int lines = 0;
  for (const char *p = r->out; *p;) {
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    assert_int_equal(*p, '{');
    assert_int_equal(end[-1], '}');
    lines++;
    p = end + 1;
  }
  assert_int_equal(lines, CONFIG_SETTINGS);
  char row[2048];
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_LOCALITY_WAIT_MS\"", row, sizeof row));
  assert_non_null(strstr(row, "\"value\": \"250\""));
  assert_non_null(strstr(row, "\"source\": \"environment\""));
  assert_non_null(strstr(row, "\"given\": \"250\", \"given_by\": \"environment\""));
  assert_non_null(strstr(row, "\"unit\": \"ms\""));
  assert_non_null(strstr(row, "\"default\": \"3\""));
  assert_non_null(strstr(row, "\"read_by\": \"driver\""));
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_SHUFFLE_MEMORY\"", row, sizeof row));
  assert_non_null(strstr(row, "\"value\": \"64m\", \"source\": \"default\", \"given\": null"));
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_APP_NAME\"", row, sizeof row));
  assert_non_null(strstr(row, "\"value\": \"say \\\"hi\\\"\\\\\""));
  assert_null(strstr(r->out, "do-not-print-me"));
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_FAULT_SLOWDOWN\"", row, sizeof row));
  assert_non_null(strstr(row, "\"test_only\": true"));
  free(r);
}

static void test_flint_config_usage(void **state) {
  (void)state;
  run_result *r = RUN_FLINT("config", "--tabular");
  expect_status(r, 2);
  assert_non_null(strstr(r->err, "unknown option '--tabular'"));
  assert_int_equal(r->out_len, 0);
  free(r);
  r = RUN_FLINT("--help");
  expect_status(r, 0);
  assert_non_null(strstr(r->out, "  config [--json]"));
  free(r);
  r = RUN_FLINT("config", "--help");
  expect_status(r, 0);
  assert_non_null(strstr(r->out, "usage: flint"));
  free(r);
}


/* ---- flint-defaults.conf and --conf ------------------------------------------------------ */

/* A folder holding a flint-defaults.conf of `text`; its path in dir (the caller removes it
 * with remove_conf_dir). */
static void make_conf_dir(char dir[64], const char *text) {
  strcpy(dir, "/tmp/flint-test-conf-XXXXXX");
  assert_non_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/flint-defaults.conf", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void remove_conf_dir(const char *dir) {
  char path[128];
  snprintf(path, sizeof path, "%s/flint-defaults.conf", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/log.txt", dir);
  unlink(path);
  assert_int_equal(rmdir(dir), 0);
}

static fl_status use_conf(const char *dir) {
  char path[128];
  snprintf(path, sizeof path, "%s/flint-defaults.conf", dir);
  return config_file_use(path);
}

static void test_file_parsing(void **state) {
  (void)state;
  char dir[64];
  make_conf_dir(dir, "# a comment\n"
                     "\n"
                     "   # an indented comment\n"
                     "FLINT_LOCALITY_WAIT_MS 250\n"
                     "exclude_ms=1500\n"
                     "  Speculation_Quantile =  0.5  \n"
                     "FLINT_APP_NAME\tmy app # not a comment\n"
                     "flint_exclude_failures 4\n"
                     "exclude_failures 5\n");
  assert_int_equal(use_conf(dir), FL_OK);
  assert_non_null(config_file_path());
  assert_non_null(strstr(config_file_path(), dir));
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 250);
  assert_int_equal(config_source_of(CONFIG_LOCALITY_WAIT_MS), CONFIG_FROM_FILE);
  assert_int_equal(config_file_line(CONFIG_LOCALITY_WAIT_MS), 4);
  assert_int_equal(config_ms(CONFIG_EXCLUDE_MS), 1500);
  assert_true(config_real(CONFIG_SPECULATION_QUANTILE) == 0.5);
  assert_string_equal(config_string(CONFIG_APP_NAME), "my app # not a comment");
  assert_int_equal(config_count(CONFIG_EXCLUDE_FAILURES), 5); /* a later line wins */
  assert_int_equal(config_file_line(CONFIG_EXCLUDE_FAILURES), 9);
  assert_int_equal(config_source_of(CONFIG_SHUFFLE_MEMORY), CONFIG_FROM_DEFAULT);
  assert_true(config_given(CONFIG_APP_NAME));
  /* a bad value follows the registry's rules, and its message says where it is */
  remove_conf_dir(dir);
  make_conf_dir(dir, "FLINT_EXCLUDE_MS soon\n");
  assert_int_equal(use_conf(dir), FL_OK);
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_MS), CONFIG_FROM_INVALID);
  assert_fails_with(config_check(CONFIG_EXCLUDE_MS), FL_EINVAL, "flint-defaults.conf:1) is not a whole number");
  assert_int_equal(config_file_use(NULL), FL_OK);
  assert_null(config_file_path());
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 3);
  remove_conf_dir(dir);
}

static void test_file_errors(void **state) {
  (void)state;
  static const struct {
    const char *text, *error;
  } cases[] = {
      {"# fine\nFLINT_NO_SUCH 3\n", "flint-defaults.conf:2: unknown setting 'FLINT_NO_SUCH'"},
      {"locality_wait_ms 3\nbogus=1\n", "flint-defaults.conf:2: unknown setting 'bogus'"},
      {"\n\nFLINT_MEMORY\n", "flint-defaults.conf:3: FLINT_MEMORY has no value"},
      {"exclude_ms =\n", "flint-defaults.conf:1: FLINT_EXCLUDE_MS has no value"},
      {"=5\n", "flint-defaults.conf:1: a line must be KEY VALUE or KEY=VALUE"},
      {"FLINT_EXECUTOR_REPORT_FD 3\n", "flint-defaults.conf:1: 'FLINT_EXECUTOR_REPORT_FD' is internal"},
      {"conf_dir /etc\n", "flint-defaults.conf:1: FLINT_CONF_DIR cannot be set in the file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char dir[64];
    make_conf_dir(dir, cases[i].text);
    assert_fails_with(use_conf(dir), FL_EINVAL, cases[i].error);
    assert_fails_with(config_file_status(), FL_EINVAL, cases[i].error);
    assert_non_null(strstr(fl_last_error(), dir)); /* the file's path, whole */
    /* none of an invalid file is used */
    assert_null(config_file_path());
    assert_int_equal(config_source_of(CONFIG_LOCALITY_WAIT_MS), CONFIG_FROM_DEFAULT);
    remove_conf_dir(dir);
  }
  /* a file that is there but cannot be read (a folder here: root reads any file) */
  char dir[64];
  make_conf_dir(dir, "");
  assert_fails_with(config_file_use(dir), FL_EINVAL, "cannot be read");
  remove_conf_dir(dir);
  assert_int_equal(config_file_use(NULL), FL_OK);
}

static void test_precedence(void **state) {
  (void)state;
  char dir[64];
  make_conf_dir(dir, "FLINT_EXCLUDE_MS 100\nFLINT_LOCALITY_WAIT_MS 7\n");
  assert_int_equal(use_conf(dir), FL_OK);
  /* file over default */
  assert_int_equal(config_ms(CONFIG_EXCLUDE_MS), 100);
  /* environment over file; an empty variable is unset */
  setenv("FLINT_EXCLUDE_MS", "200", 1);
  assert_int_equal(config_ms(CONFIG_EXCLUDE_MS), 200);
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_MS), CONFIG_FROM_ENVIRONMENT);
  setenv("FLINT_EXCLUDE_MS", "", 1);
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_MS), CONFIG_FROM_FILE);
  /* --conf over the environment, which it sets for the processes started after it */
  setenv("FLINT_EXCLUDE_MS", "200", 1);
  assert_int_equal(config_set_command_line("exclude_ms=300"), FL_OK);
  assert_int_equal(config_ms(CONFIG_EXCLUDE_MS), 300);
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_MS), CONFIG_FROM_COMMAND_LINE);
  assert_string_equal(getenv("FLINT_EXCLUDE_MS"), "300");
  assert_int_equal(config_set_command_line("FLINT_EXCLUDE_MS="), FL_OK); /* undone */
  assert_int_equal(config_source_of(CONFIG_EXCLUDE_MS), CONFIG_FROM_FILE);
  assert_int_equal(config_ms(CONFIG_LOCALITY_WAIT_MS), 7);
  /* --conf's errors */
  assert_fails_with(config_set_command_line("no_such=1"), FL_EINVAL, "unknown setting 'no_such'");
  assert_fails_with(config_set_command_line("FLINT_LOG"), FL_EINVAL, "'FLINT_LOG' is not KEY=VALUE");
  assert_fails_with(config_set_command_line("local_cluster_dir=/x"), FL_EINVAL, "internal");
  unsetenv("FLINT_EXCLUDE_MS");
  assert_int_equal(config_file_use(NULL), FL_OK);
  remove_conf_dir(dir);
}

static void test_flint_config_file_source(void **state) {
  (void)state;
  char dir[64];
  make_conf_dir(dir, "# cluster-wide\nFLINT_LOCALITY_WAIT_MS 250\nexclude_ms=1500\nspin_us 5\n");
  setenv("FLINT_CONF_DIR", dir, 1);
  setenv("FLINT_EXCLUDE_MS", "900", 1);
  run_result *r = RUN_FLINT("config", "--conf", "spin_us=7");
  unsetenv("FLINT_EXCLUDE_MS");
  expect_status(r, 0);
  char row[1024];
  assert_true(line_starting(r->out, "FLINT_LOCALITY_WAIT_MS ", row, sizeof row));
  assert_non_null(strstr(row, " 250 "));
  assert_non_null(strstr(row, " file "));
  assert_true(line_starting(r->out, "FLINT_EXCLUDE_MS ", row, sizeof row));
  assert_non_null(strstr(row, " 900 "));
  assert_non_null(strstr(row, " environment "));
  assert_true(line_starting(r->out, "FLINT_SPIN_US ", row, sizeof row));
  assert_non_null(strstr(row, " 7 "));
  assert_non_null(strstr(row, " --conf "));
  assert_true(line_starting(r->out, "file: ", row, sizeof row));
  assert_non_null(strstr(row, dir));
  free(r);
  r = RUN_FLINT("config", "--json", "--conf=FLINT_SPIN_US=8");
  expect_status(r, 0);
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_LOCALITY_WAIT_MS\"", row, sizeof row));
  assert_non_null(strstr(row, "\"source\": \"file\""));
  assert_non_null(strstr(row, "flint-defaults.conf:2\""));
  assert_true(line_starting(r->out, "{\"name\": \"FLINT_SPIN_US\"", row, sizeof row));
  assert_non_null(strstr(row, "\"value\": \"8\", \"source\": \"--conf\""));
  free(r);
  /* --conf's usage errors */
  r = RUN_FLINT("config", "--conf", "nope=1");
  expect_status(r, 2);
  assert_non_null(strstr(r->err, "flint config: --conf: unknown setting 'nope'"));
  free(r);
  r = RUN_FLINT("status", "--conf", "exclude_ms=soon", "--master", "flint://127.0.0.1:1");
  expect_status(r, 2);
  assert_non_null(strstr(r->err, "flint status: --conf: FLINT_EXCLUDE_MS: 'soon' is not"));
  free(r);
  /* an invalid file: every command refuses to start, naming the file and line */
  remove_conf_dir(dir);
  make_conf_dir(dir, "FLINT_LOCALITY_WAIT_MS 250\nmemroy 2g\n");
  setenv("FLINT_CONF_DIR", dir, 1);
  r = RUN_FLINT("status", "--master", "flint://127.0.0.1:1");
  expect_status(r, 1);
  assert_non_null(strstr(r->err, "flint status: "));
  assert_non_null(strstr(r->err, "flint-defaults.conf:2: unknown setting 'memroy'"));
  free(r);
  r = RUN_FLINT("config");
  expect_status(r, 1);
  assert_non_null(strstr(r->out, "file: invalid"));
  assert_non_null(strstr(r->err, "flint-defaults.conf:2: unknown setting 'memroy'"));
  free(r);
  /* --conf picks the folder too */
  unsetenv("FLINT_CONF_DIR");
  remove_conf_dir(dir);
  make_conf_dir(dir, "FLINT_LOCALITY_WAIT_MS 251\n");
  char conf[128];
  snprintf(conf, sizeof conf, "conf_dir=%s", dir);
  r = RUN_FLINT("config", "--conf", conf);
  expect_status(r, 0);
  assert_true(line_starting(r->out, "FLINT_LOCALITY_WAIT_MS ", row, sizeof row));
  assert_non_null(strstr(row, " 251 "));
  free(r);
  remove_conf_dir(dir);
}

/* ---- the log ----------------------------------------------------------------------------- */

/* Runs common_log in a child (the log reads its settings once per process) with FLINT_LOG
 * `level` and FLINT_LOG_FILE in `dir`; returns the log file's text (the caller frees it). */
static char *log_in_child(const char *dir, const char *level) {
  char path[128];
  snprintf(path, sizeof path, "%s/log.txt", dir);
  unlink(path);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("FLINT_LOG", level, 1);
    setenv("FLINT_LOG_FILE", path, 1);
    common_log(LOG_INFO, "an info line %d", 1);
    common_log(LOG_DEBUG, "a debug line");
    common_log(LOG_ERROR, "an error line");
    _exit(common_log_enabled(LOG_DEBUG) ? 3 : 0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *text = calloc(1, 4096);
  assert_non_null(text);
  assert_true(fread(text, 1, 4095, f) > 0);
  fclose(f);
  return text;
}

static bool dated(const char *line) {
  /* "2026-11-28 09:20:01.123 " */
  static const char shape[] = "dddd-dd-dd dd:dd:dd.ddd ";
  for (size_t i = 0; i < sizeof shape - 1; i++)
    if (shape[i] == 'd' ? !isdigit((unsigned char)line[i]) : line[i] != shape[i]) return false;
  return true;
}

static void test_log_file_dates_levels(void **state) {
  (void)state;
  char dir[64];
  make_conf_dir(dir, "");
  char *text = log_in_child(dir, "info");
  assert_true(dated(text));
  assert_non_null(strstr(text, " INFO flint: an info line 1\n"));
  assert_non_null(strstr(text, " ERROR flint: an error line\n"));
  assert_null(strstr(text, "debug line"));
  assert_int_equal(occurrences(text, "\n"), 2);
  assert_true(dated(strchr(text, '\n') + 1));
  free(text);
  text = log_in_child(dir, "debug");
  assert_non_null(strstr(text, " DEBUG flint: a debug line\n"));
  free(text);
  /* an unknown level: a warning that names it and the levels, then info */
  text = log_in_child(dir, "verbose");
  assert_non_null(
      strstr(text, "WARN flint: FLINT_LOG=verbose is not a level (error, warn, info or debug): using info"));
  assert_non_null(strstr(text, "an info line"));
  assert_null(strstr(text, "debug line"));
  free(text);
  remove_conf_dir(dir);
  /* ... which the flint command refuses */
  setenv("FLINT_LOG", "verbose", 1);
  run_result *r = RUN_FLINT("status", "--master", "flint://127.0.0.1:1");
  unsetenv("FLINT_LOG");
  expect_status(r, 1);
  assert_non_null(strstr(r->err, "flint status: FLINT_LOG: 'verbose' is not a level (error, warn, info or debug)"));
  free(r);
}

/* The job binary `name` of this build, beside the flint command: built with it, so a
 * missing one fails the test rather than skipping it. */
static void built_job(char *out, size_t len, const char *name) {
  snprintf(out, len, "%s", flint_path);
  char *slash = strrchr(out, '/');
  assert_non_null(slash);
  snprintf(slash + 1, len - (size_t)(slash + 1 - out), "%s", name);
  if (access(out, R_OK) != 0) fail_msg("%s is not built", out);
}

/* The scheduler's events, in a cluster's driver: jobs and stages at info, tasks at debug;
 * and --conf reaching the processes that local-cluster starts (FLINT_LOG_FILE). */
static void test_scheduler_events_logged(void **state) {
  (void)state;
  char job[PATH_MAX + 32], dir[64], conf[160], path[128];
  built_job(job, sizeof job, "pi.so");
  make_conf_dir(dir, "log debug\n");
  snprintf(path, sizeof path, "%s/log.txt", dir);
  snprintf(conf, sizeof conf, "log_file=%s", path);
  setenv("FLINT_CONF_DIR", dir, 1);
  run_result *r = RUN_FLINT("submit", "--conf", conf, "--master", "local-cluster[2,1,256]", job);
  unsetenv("FLINT_CONF_DIR");
  expect_status(r, 0);
  assert_non_null(strstr(r->out, "pi is roughly"));
  assert_null(strstr(r->err, " INFO ")); /* in the file */
  free(r);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *text = calloc(1, 1 << 16);
  assert_non_null(text);
  assert_true(fread(text, 1, (1 << 16) - 1, f) > 0);
  fclose(f);
  assert_true(dated(text));
  assert_non_null(strstr(text, " INFO driver: job 1: starts: 2 partitions"));
  assert_non_null(strstr(text, " INFO driver: job 1: stage 0 (result of dataset "));
  assert_non_null(strstr(text, " INFO driver: job 1: stage 0 ends: 2 tasks done"));
  assert_non_null(strstr(text, " INFO driver: job 1: ends: ok after "));
  assert_non_null(strstr(text, " DEBUG driver: job 1: stage 0: task 0 (partition 0, attempt 1) starts on executor "));
  assert_non_null(strstr(text, " DEBUG driver: job 1: stage 0: task 1 (partition 1, attempt 1) ends: ok after "));
  assert_non_null(strstr(text, " INFO executor 1: "));
  free(text);
  remove_conf_dir(dir);
}

/* flint submit: --conf before JOB.so is flint's, after it the job's own argument; a local
 * context logs its jobs at debug. */
static void test_submit_conf_ends_at_job(void **state) {
  (void)state;
  char job[PATH_MAX + 32], dir[64], conf[160], path[128];
  built_job(job, sizeof job, "job_exit3.so");
  make_conf_dir(dir, "");
  snprintf(path, sizeof path, "%s/log.txt", dir);
  snprintf(conf, sizeof conf, "--conf=log_file=%s", path);
  run_result *r = RUN_FLINT("submit", "--conf", "log=debug", conf, "--master", "local[2]", job, "--conf", "a=b");
  expect_status(r, 3);
  assert_non_null(strstr(r->out, "job_exit3 args: --conf a=b\n"));
  free(r);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char text[8192] = "";
  assert_true(fread(text, 1, sizeof text - 1, f) > 0);
  fclose(f);
  assert_non_null(strstr(text, " DEBUG flint: job 1: starts: 2 partitions"));
  assert_non_null(strstr(text, " DEBUG flint: job 1: stage 0: task 1 (partition 1, attempt 1) starts\n"));
  remove_conf_dir(dir);
}

static void find_flint(void) {
  char dir[PATH_MAX];
  const char *env = getenv("FLINT_BIN");
  if (env && *env) {
    snprintf(dir, sizeof dir, "%s", env);
  } else { /* this test's own folder: the build puts the binaries there too */
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0) {
      fprintf(stderr, "test_config: set FLINT_BIN to the folder of the flint binary\n");
      exit(1);
    }
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
  }
  snprintf(flint_path, sizeof flint_path, "%s/flint", dir);
  if (access(flint_path, X_OK) != 0) {
    fprintf(stderr, "test_config: no flint binary at %s (set FLINT_BIN)\n", flint_path);
    exit(1);
  }
}

int main(void) {
  find_flint();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_log_file_dates_levels), /* first: its children must log afresh */
      cmocka_unit_test(test_table_is_well_formed),
      cmocka_unit_test(test_every_default_reads),
      cmocka_unit_test(test_valid_values),
      cmocka_unit_test(test_booleans),
      cmocka_unit_test(test_empty_and_zero),
      cmocka_unit_test(test_invalid_values),
      cmocka_unit_test(test_check_names_the_variable),
      cmocka_unit_test(test_memory_bare_number_is_mib),
      cmocka_unit_test(test_warns_once_per_value),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_readme_table_matches_registry),
      cmocka_unit_test(test_flint_config_table),
      cmocka_unit_test(test_flint_config_json),
      cmocka_unit_test(test_flint_config_usage),
      cmocka_unit_test(test_file_parsing),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_precedence),
      cmocka_unit_test(test_flint_config_file_source),
      cmocka_unit_test(test_scheduler_events_logged),
      cmocka_unit_test(test_submit_conf_ends_at_job),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
