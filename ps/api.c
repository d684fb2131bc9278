/*
 * ps/api.c: the worker's side of flint/ps.h: a worker is a ps_client of the table whose
 * handle (an encoded ps_map, ps/map.c) it was opened with. The tables themselves are made
 * by the context (client/ps_tables.c) or the driver (driver/ps_tables.c).
 *
 * Threading: as ps_client (one thread at a time per worker).
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "flint/ps.h"
#include "ps/ps.h"

struct fl_ps_worker {
  ps_client *client;
  double slowdown;       /* FLINT_PS_SLOW_WORKER names this worker: each clock takes this many times as long */
  uint64_t last_clock_ns;
};

/* FLINT_PS_SLOW_WORKER=K:F: F when `worker` is K (F >= 1), else 1. A malformed value is
 * warned about once per worker and ignored. */
static double slowdown_of(uint32_t worker) {
  const char *v = config_string(CONFIG_PS_SLOW_WORKER);
  if (!v || !*v || strcmp(v, "none") == 0) return 1; /* the default */
  unsigned k;
  double f;
  char extra;
  if (sscanf(v, "%u:%lf%c", &k, &f, &extra) != 2 || !(f >= 1 && f <= 1000)) {
    common_log(LOG_WARN, "FLINT_PS_SLOW_WORKER=%s is not K:F (F from 1 to 1000): ignored", v);
    return 1;
  }
  return k == worker ? f : 1;
}

fl_status fl_ps_worker_open(fl_bytes handle, uint32_t worker, fl_ps_worker **out) {
  common_error_clear();
  if (!out) return FL_ERR(FL_EINVAL, "fl_ps_worker_open: NULL out");
  ps_map map;
  fl_status st = ps_map_decode(handle, &map);
  if (st != FL_OK) return st;
  char *secret = NULL;
  fl_ps_worker *w = NULL;
  st = config_secret(&secret);
  if (st == FL_OK && !(w = common_calloc(1, sizeof *w))) st = FL_ERR(FL_ENOMEM, "out of memory");
  if (st == FL_OK) st = ps_client_create(&map, worker, secret, (uint32_t)config_ms(CONFIG_PS_TIMEOUT_MS), &w->client);
  if (st == FL_OK) {
    w->slowdown = slowdown_of(worker);
    w->last_clock_ns = common_now_ns();
  }
  common_free(secret);
  ps_map_free(&map);
  if (st != FL_OK) {
    common_free(w);
    return st;
  }
  *out = w;
  return FL_OK;
}

size_t fl_ps_handle_size(const void *handle) { return ps_map_size(handle); }

void fl_ps_worker_close(fl_ps_worker *w) {
  if (!w) return;
  ps_client_destroy(w->client);
  common_free(w);
}

void fl_ps_worker_set_staleness(fl_ps_worker *w, uint32_t staleness) {
  if (w) ps_client_set_staleness(w->client, staleness);
}

#define WORKER_CALL(w, call)                                                                \
  do {                                                                                      \
    common_error_clear();                                                                   \
    if (!(w)) return FL_ERR(FL_EINVAL, "parameter server: NULL worker");                   \
    return (call);                                                                          \
  } while (0)

fl_status fl_ps_push(fl_ps_worker *w, const uint64_t *keys, size_t n, const float *grads, uint64_t *ticket) {
  WORKER_CALL(w, ps_client_push(w->client, keys, n, grads, ticket));
}
fl_status fl_ps_pull(fl_ps_worker *w, const uint64_t *keys, size_t n, float *out, uint64_t *ticket) {
  WORKER_CALL(w, ps_client_pull(w->client, keys, n, out, ticket));
}
fl_status fl_ps_push_range(fl_ps_worker *w, uint64_t lo, uint64_t count, const float *grads, uint64_t *ticket) {
  WORKER_CALL(w, ps_client_push_range(w->client, lo, count, grads, ticket));
}
fl_status fl_ps_pull_range(fl_ps_worker *w, uint64_t lo, uint64_t count, float *out, uint64_t *ticket) {
  WORKER_CALL(w, ps_client_pull_range(w->client, lo, count, out, ticket));
}
fl_status fl_ps_set_range(fl_ps_worker *w, uint64_t lo, uint64_t count, const float *values, uint64_t *ticket) {
  WORKER_CALL(w, ps_client_set_range(w->client, lo, count, values, ticket));
}
static fl_status column(fl_ps_worker *w, ps_column_kind kind, double alpha, uint32_t x, uint32_t y, uint64_t lo,
                        uint64_t count, const float *in, float *out, double *dot, uint64_t *ticket) {
  ps_column_op op = {.kind = kind, .x = x, .y = y, .alpha = alpha, .lo = lo, .count = count};
  WORKER_CALL(w, ps_client_column(w->client, &op, in, out, dot, ticket));
}
fl_status fl_ps_push_column(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *grads,
                            uint64_t *ticket) {
  return column(w, PS_COLUMN_PUSH, 0, 0, y, lo, count, grads, NULL, NULL, ticket);
}
/* FLINT_PS_STALL_PUSH=K:DIR: whether this once-push is the one to stall (worker K, and the
 * first attempt anywhere to make DIR/stalled); *dir gets DIR. */
static bool stall_this(uint32_t worker, char *dir, size_t len) {
  const char *v = config_string(CONFIG_PS_STALL_PUSH);
  if (!v || !*v || strcmp(v, "none") == 0) return false;
  unsigned k;
  int at = 0;
  if (sscanf(v, "%u:%n", &k, &at) != 1 || at == 0 || !v[at]) {
    common_log(LOG_WARN, "FLINT_PS_STALL_PUSH=%s is not K:DIR: ignored", v);
    return false;
  }
  if (k != worker) return false;
  snprintf(dir, len, "%s", v + at);
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/stalled", dir);
  int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return false; /* another attempt stalled already (or no such folder) */
  close(fd);
  return true;
}

/* The stalled push: waits for DIR/release (bounded), pushes and waits for it, then makes
 * DIR/pushed; the caller's ticket is an empty push's, done at once. */
static fl_status stalled_push(fl_ps_worker *w, const char *dir, uint32_t y, uint64_t lo, uint64_t count,
                              const float *grads, uint64_t seq, uint64_t *ticket) {
  char path[PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/release", dir);
  uint64_t until = common_now_ns() + (uint64_t)config_ms(CONFIG_PS_TIMEOUT_MS) * 1000000u;
  while (access(path, F_OK) != 0 && common_now_ns() < until) usleep(10000);
  uint64_t t;
  fl_status st = ps_client_push_column_once(w->client, y, lo, count, grads, seq, &t);
  if (st == FL_OK) st = ps_client_wait(w->client, t, NULL);
  snprintf(path, sizeof path, "%s/pushed", dir);
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  if (st != FL_OK) return st;
  return ps_client_push_column_once(w->client, y, lo, 0, grads, seq, ticket);
}

fl_status fl_ps_push_range_once(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *grads,
                                uint64_t seq, uint64_t *ticket) {
  char dir[PATH_MAX];
  if (w && stall_this(ps_client_worker(w->client), dir, sizeof dir)) {
    common_error_clear();
    return stalled_push(w, dir, y, lo, count, grads, seq, ticket);
  }
  WORKER_CALL(w, ps_client_push_column_once(w->client, y, lo, count, grads, seq, ticket));
}
fl_status fl_ps_set_column(fl_ps_worker *w, uint32_t y, uint64_t lo, uint64_t count, const float *values,
                           uint64_t *ticket) {
  return column(w, PS_COLUMN_SET, 0, 0, y, lo, count, values, NULL, NULL, ticket);
}
fl_status fl_ps_pull_column(fl_ps_worker *w, uint32_t x, uint64_t lo, uint64_t count, float *out, uint64_t *ticket) {
  return column(w, PS_COLUMN_PULL, 0, x, 0, lo, count, NULL, out, NULL, ticket);
}
fl_status fl_ps_dot(fl_ps_worker *w, uint32_t x, uint32_t y, uint64_t lo, uint64_t count, double *out,
                    uint64_t *ticket) {
  return column(w, PS_COLUMN_DOT, 0, x, y, lo, count, NULL, NULL, out, ticket);
}
fl_status fl_ps_axpy(fl_ps_worker *w, double alpha, uint32_t x, uint32_t y, uint64_t lo, uint64_t count,
                     uint64_t *ticket) {
  return column(w, PS_COLUMN_AXPY, alpha, x, y, lo, count, NULL, NULL, NULL, ticket);
}
fl_status fl_ps_scale(fl_ps_worker *w, double alpha, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket) {
  return column(w, PS_COLUMN_SCALE, alpha, 0, y, lo, count, NULL, NULL, NULL, ticket);
}
fl_status fl_ps_copy(fl_ps_worker *w, uint32_t x, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket) {
  return column(w, PS_COLUMN_COPY, 0, x, y, lo, count, NULL, NULL, NULL, ticket);
}
fl_status fl_ps_fill(fl_ps_worker *w, double alpha, uint32_t y, uint64_t lo, uint64_t count, uint64_t *ticket) {
  return column(w, PS_COLUMN_FILL, alpha, 0, y, lo, count, NULL, NULL, NULL, ticket);
}

fl_status fl_ps_clock(fl_ps_worker *w, uint64_t *ticket) {
  if (w && w->slowdown > 1) { /* the injected straggler: its iteration took slowdown times as long */
    uint64_t now = common_now_ns();
    uint64_t extra = (uint64_t)((double)(now - w->last_clock_ns) * (w->slowdown - 1));
    struct timespec ts = {(time_t)(extra / 1000000000u), (long)(extra % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    w->last_clock_ns = common_now_ns();
  }
  WORKER_CALL(w, ps_client_clock(w->client, ticket));
}
fl_status fl_ps_retire(fl_ps_worker *w, uint64_t *ticket) { WORKER_CALL(w, ps_client_retire(w->client, ticket)); }
fl_status fl_ps_wait(fl_ps_worker *w, uint64_t ticket, uint64_t *fresh) {
  WORKER_CALL(w, ps_client_wait(w->client, ticket, fresh));
}

fl_ps_worker_stats fl_ps_worker_stats_get(fl_ps_worker *w) {
  fl_ps_worker_stats out = {0};
  if (!w) return out;
  ps_client_stats s = ps_client_stats_get(w->client);
  out.bytes_sent = s.bytes_sent;
  out.bytes_received = s.bytes_received;
  out.failovers = s.failovers;
  out.clock = ps_client_clock_now(w->client);
  return out;
}
