/*
 * bench_soak: a long-lived application, as a notebook or a service keeps one: many small
 * jobs in one context on local-cluster[2,1,512], to show that nothing grows with the number
 * of jobs. Each round runs three jobs: a count, a reduce_by_key (a shuffle) and a map that
 * reads a fresh broadcast, then frees what it made.
 *
 *   bench_soak [--json] [--jobs N] [--window W]
 *
 * N jobs in all (default 100000); the first and the last W jobs (default N / 10) are the two
 * windows compared. Rows: jobs/s, and the RSS and open descriptors of the driver and the
 * executors (summed), each as last / first: after the first window and at the end. Targets
 * (issue 31): RSS and descriptors last / first <= 1.05, jobs/s last / first >= 0.95.
 * Output: a table on stdout, or with --json one JSON object per row.
 */
#define BENCH_NAME "bench_soak"
#include <dirent.h>
#include <unistd.h>

#include "bench_util.h"

/* From bench_cluster_fns.c. */
fl_status bcf_make_pair(fl_bytes rec, fl_buf *out, const void *arg);
fl_status bcf_add(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status bcf_broadcast_probe(fl_bytes rec, fl_buf *out, const void *arg);

#define MASTER "local-cluster[2,1,512]"
#define ROUND_JOBS 3

/* What /proc says of the processes a context started. */
typedef struct footprint {
  uint64_t driver_kb, executors_kb;
  uint64_t driver_fds, executors_fds;
  double driver_cpu_s, executors_cpu_s, client_cpu_s; /* user + system so far */
  int executors;
} footprint;

static uint64_t status_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  uint64_t kb = 0;
  size_t n = strlen(field);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0) kb = strtoull(line + n, NULL, 10);
  if (f) fclose(f);
  return kb;
}

static uint64_t open_fds(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  uint64_t n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

/* User + system seconds of a process so far. */
static double cpu_s(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  unsigned long long user = 0, sys = 0;
  if (f) {
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')');
    if (close) sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &user, &sys);
    fclose(f);
  }
  return (double)(user + sys) / (double)sysconf(_SC_CLK_TCK);
}

static pid_t parent_of(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  int ppid = 0;
  if (f) {
    char buf[512];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')'); /* the name may hold blanks */
    if (close) sscanf(close + 2, "%*c %d", &ppid);
    fclose(f);
  }
  return (pid_t)ppid;
}

/* The driver is this process's child; executors run under their supervisors, which are its
 * children too: an executor is a grandchild. */
static footprint measure(void) {
  footprint fp = {0};
  pid_t self = getpid();
  DIR *d = opendir("/proc");
  for (struct dirent *e; d && (e = readdir(d));) {
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 0) continue;
    pid_t parent = parent_of(pid);
    if (parent == self) {
      char path[64], cmd[256] = "";
      snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
      FILE *f = fopen(path, "r");
      size_t n = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
      if (f) fclose(f);
      for (size_t i = 0; i < n; i++)
        if (!cmd[i]) cmd[i] = ' ';
      if (strstr(cmd, " driver ")) {
        fp.driver_kb = status_kb(pid, "VmRSS:");
        fp.driver_fds = open_fds(pid);
        fp.driver_cpu_s = cpu_s(pid);
      }
    } else if (parent > 0 && parent_of(parent) == self) {
      fp.executors_kb += status_kb(pid, "VmRSS:");
      fp.executors_fds += open_fds(pid);
      fp.executors_cpu_s += cpu_s(pid);
      fp.executors++;
    }
  }
  if (d) closedir(d);
  fp.client_cpu_s = cpu_s(self);
  return fp;
}

/* One round: three jobs. */
static bool round_run(fl_context *ctx, uint64_t i) {
  fl_dataset *src = NULL, *pairs = NULL, *sums = NULL, *one = NULL, *probed = NULL;
  fl_broadcast *b = NULL;
  uint64_t keys = 7, n = 0, id = 0;
  char value[64];
  snprintf(value, sizeof value, "round %llu", (unsigned long long)i);
  bool ok = fl_range(ctx, 0, 1000, 1, 4, &src) == FL_OK && fl_count(src, &n) == FL_OK && n == 1000 &&
            fl_map(src, bcf_make_pair, &keys, sizeof keys, &pairs) == FL_OK &&
            fl_reduce_by_key(pairs, bcf_add, NULL, 0, NULL, 2, &sums) == FL_OK && fl_count(sums, &n) == FL_OK &&
            n == keys && fl_broadcast_create(ctx, value, strlen(value), &b) == FL_OK &&
            (id = fl_broadcast_id(b), fl_range(ctx, 0, 2, 1, 2, &one) == FL_OK) &&
            fl_map(one, bcf_broadcast_probe, &id, sizeof id, &probed) == FL_OK && fl_count(probed, &n) == FL_OK &&
            n == 2;
  if (!ok) fail_flint("a round of jobs");
  fl_dataset_free(probed);
  fl_dataset_free(one);
  fl_broadcast_destroy(b);
  fl_dataset_free(sums);
  fl_dataset_free(pairs);
  fl_dataset_free(src);
  return ok;
}

static void row(bool json, const char *metric, double first, double last, bool higher_better) {
  double ratio = first > 0 ? last / first : 0;
  bool met = higher_better ? ratio >= 0.95 : ratio <= 1.05;
  const char *target = higher_better ? ">= 0.95" : "<= 1.05";
  if (json) {
    printf("{\"bench\": \"soak\", \"master\": \"%s\", \"metric\": \"%s\", \"first\": %.1f, \"last\": %.1f"
           ", \"ratio\": %.3f, \"target\": \"last/first %s\", \"met\": %s}\n",
           MASTER, metric, first, last, ratio, target, met ? "true" : "false");
    return;
  }
  static const bench_columns w = {5, 34, 22, 10};
  char v[64];
  snprintf(v, sizeof v, "%.3f (%.0f -> %.0f)", ratio, first, last);
  bench_print_row(&w, "soak", metric, v, target, met ? "yes" : "NO");
}

/* A row without a target: first and last window. */
static void info_row(bool json, const char *metric, double first, double last) {
  if (json) {
    printf("{\"bench\": \"soak\", \"master\": \"%s\", \"metric\": \"%s\", \"first\": %.1f, \"last\": %.1f}\n", MASTER,
           metric, first, last);
    return;
  }
  static const bench_columns w = {5, 34, 22, 10};
  char v[64];
  snprintf(v, sizeof v, "%.0f -> %.0f", first, last);
  bench_print_row(&w, "soak", metric, v, "", "");
}

int main(int argc, char **argv) {
  bool json = false;
  uint64_t jobs = 100000, window = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (strcmp(argv[i], "--jobs") == 0 && i + 1 < argc && parse_count(argv[i + 1], 100000000, &jobs)) {
      i++;
    } else if (strcmp(argv[i], "--window") == 0 && i + 1 < argc && parse_count(argv[i + 1], 100000000, &window)) {
      i++;
    } else {
      fprintf(stderr, "usage: " BENCH_NAME " [--json] [--jobs N] [--window W]\n");
      return 2;
    }
  }
  uint64_t rounds = jobs / ROUND_JOBS, window_rounds = (window ? window : jobs / 10) / ROUND_JOBS;
  if (window_rounds < 1 || 2 * window_rounds > rounds) {
    fprintf(stderr, BENCH_NAME ": the windows need at least %d jobs each and may not overlap\n", ROUND_JOBS);
    return 2;
  }
  fl_context *ctx;
  if (fl_context_open(MASTER, NULL, &ctx) != FL_OK) {
    fail_flint("fl_context_open(" MASTER ")");
    return 1;
  }
  double t0 = now_s(), first_rate = 0, last_start = 0;
  footprint start = measure(), first = {0}, before_last = {0};
  int rc = 0;
  for (uint64_t r = 0; r < rounds; r++) {
    if (!round_run(ctx, r)) {
      rc = 1;
      break;
    }
    if (r + 1 == window_rounds) {
      first_rate = (double)(window_rounds * ROUND_JOBS) / (now_s() - t0);
      first = measure();
    }
    if (r + window_rounds == rounds) {
      before_last = measure();
      last_start = now_s();
    }
    if (!json && (r + 1) % (rounds / 10 ? rounds / 10 : 1) == 0)
      fprintf(stderr, BENCH_NAME ": %llu of %llu jobs\n", (unsigned long long)((r + 1) * ROUND_JOBS),
              (unsigned long long)jobs);
  }
  if (rc == 0) {
    double last_rate = (double)(window_rounds * ROUND_JOBS) / (now_s() - last_start);
    footprint last = measure();
    if (!json) {
      printf("%llu jobs in one application on %s (%d executor processes); windows of %llu jobs\n",
             (unsigned long long)(rounds * ROUND_JOBS), MASTER, last.executors,
             (unsigned long long)(window_rounds * ROUND_JOBS));
      static const bench_columns w = {5, 34, 22, 10};
      bench_print_row(&w, "bench", "metric (last / first)", "value", "target", "met");
      bench_print_row(&w, "-----", "----------------------------------", "----------------------", "----------",
                      "---");
    }
    row(json, "jobs/s", first_rate, last_rate, true);
    row(json, "executor RSS KiB (summed)", (double)first.executors_kb, (double)last.executors_kb, false);
    row(json, "driver RSS KiB", (double)first.driver_kb, (double)last.driver_kb, false);
    row(json, "executor open fds (summed)", (double)first.executors_fds, (double)last.executors_fds, false);
    row(json, "driver open fds", (double)first.driver_fds, (double)last.driver_fds, false);
    /* Where a slowdown would come from: CPU time per 1000 jobs in each window (no target). */
    double per = 1000.0 / (double)(window_rounds * ROUND_JOBS);
    info_row(json, "client CPU ms / 1000 jobs", (first.client_cpu_s - start.client_cpu_s) * per * 1e3,
             (last.client_cpu_s - before_last.client_cpu_s) * per * 1e3);
    info_row(json, "driver CPU ms / 1000 jobs", (first.driver_cpu_s - start.driver_cpu_s) * per * 1e3,
             (last.driver_cpu_s - before_last.driver_cpu_s) * per * 1e3);
    info_row(json, "executor CPU ms / 1000 jobs", (first.executors_cpu_s - start.executors_cpu_s) * per * 1e3,
             (last.executors_cpu_s - before_last.executors_cpu_s) * per * 1e3);
  }
  fl_context_close(ctx);
  return rc;
}
