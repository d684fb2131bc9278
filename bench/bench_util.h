/* bench_util.h: what every benchmark in bench/ shares: a monotonic clock, the report of a
 * failed flint call, strict parsing of count and row options, and the lines of the table. Header-only; each benchmark is one
 * program. BENCH_NAME must be defined before including it. */
#ifndef FLINT_BENCH_UTIL_H
#define FLINT_BENCH_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "flint/flint.h"

/* flint's monotonic clock (common_now_s), under the name every benchmark uses. */
static inline double now_s(void) { return common_now_s(); }

/* The python3 whose torch imports, for the PyTorch peers (bench/peers/): Debian's
 * /usr/bin/python3 first (a pyenv python3 on PATH does not see Debian's packages, which
 * scripts/setup-peers installs). NULL: none. */
static inline const char *bench_torch_python(void) {
  static const char *const candidates[] = {"/usr/bin/python3", "python3"};
  for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", candidates[i]);
    if (system(cmd) == 0) return candidates[i];
  }
  return NULL;
}

/* Runs a peer's command and keeps the last line it prints that holds `key` (its JSON line) in
 * line; false (saying so on stderr) when it fails or prints none. */
static inline bool bench_peer_line(const char *cmd, const char *key, char *line, size_t cap) {
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  char buf[1024];
  bool found = false;
  while (fgets(buf, sizeof buf, p))
    if (strstr(buf, key)) {
      snprintf(line, cap, "%s", buf);
      found = true;
    }
  int rc = pclose(p);
  if (rc != 0 || !found) fprintf(stderr, "peer failed: %s\n", cmd);
  return rc == 0 && found;
}

/* The number after "\"KEY\": " in a JSON line (0 when absent). */
static inline double bench_json_number(const char *line, const char *key) {
  char want[64];
  snprintf(want, sizeof want, "\"%s\": ", key);
  const char *at = strstr(line, want);
  return at ? atof(at + strlen(want)) : 0;
}

/* qsort's comparison of doubles; the median of v[0, n) (sorted in place; the mean of the two
 * middle values for an even n). */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static inline double bench_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* All of n bytes to or from a pipe or socket (retrying EINTR and short transfers): 0, or -1
 * when it fails or the peer closed. */
static inline int bench_write_all(int fd, const void *p, size_t n) {
  const char *c = (const char *)p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w, n -= (size_t)w;
  }
  return 0;
}
static inline int bench_read_all(int fd, void *p, size_t n) {
  char *c = (char *)p;
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    c += r, n -= (size_t)r;
  }
  return 0;
}

static inline void fail_flint(const char *what) {
  fprintf(stderr, BENCH_NAME ": %s failed: %s\n", what, fl_last_error());
}

/* A count in 1..max written as plain digits; false for anything else. */
static inline bool parse_count(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  if (!*s || *s == '-' || *s == '+') return false;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end != '\0' || v == 0 || v > max) return false;
  *out = v;
  return true;
}

/* The command line of the benchmarks that run on cpu and cuda (bench_train, bench_pipeline):
 * [--json] [--device cpu|cuda|all] [--steps N] [--quick]. a holds the defaults on entry;
 * false, after saying why on stderr, on anything else. */
typedef struct bench_device_args {
  bool json, quick;
  const char *which; /* cpu, cuda or all */
  uint64_t steps;    /* 1..max_steps */
} bench_device_args;

static inline bool bench_device_args_parse(int argc, char **argv, uint64_t max_steps, bench_device_args *a) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      a->json = true;
    } else if (strcmp(argv[i], "--quick") == 0) {
      a->quick = true;
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      a->which = argv[++i];
      if (strcmp(a->which, "cpu") && strcmp(a->which, "cuda") && strcmp(a->which, "all")) {
        fprintf(stderr, BENCH_NAME ": --device takes cpu, cuda or all, not '%s'\n", a->which);
        return false;
      }
    } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      if (!parse_count(argv[++i], max_steps, &a->steps)) {
        fprintf(stderr, BENCH_NAME ": --steps takes a count from 1 to %llu, not '%s'\n",
                (unsigned long long)max_steps, argv[i]);
        return false;
      }
    } else {
      fprintf(stderr, "usage: " BENCH_NAME " [--json] [--device cpu|cuda|all] [--steps N] [--quick]\n");
      return false;
    }
  }
  return true;
}

/* The index of row `name` among names[0..n-1], or -1 (for --skip ROW). */
static inline int bench_row_index(const char *const *names, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

/* The widths of a benchmark's table: bench, metric, value (right-aligned) and target. */
typedef struct bench_columns {
  int bench, metric, value, target;
} bench_columns;

/* One line of the table, without trailing blanks. */
static inline void bench_print_row(const bench_columns *w, const char *bench, const char *metric,
                                   const char *value, const char *target, const char *met) {
  char line[320];
  int n = snprintf(line, sizeof line, "%-*s %-*s %*s  %-*s %s", w->bench, bench, w->metric, metric, w->value,
                   value, w->target, target, met);
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  while (n > 0 && line[n - 1] == ' ') line[--n] = '\0';
  puts(line);
}

#endif
