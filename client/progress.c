/*
 * progress.c: the console progress bar of actions, as Spark's ConsoleProgressBar:
 *
 *   [Stage 3:=====>                (12 + 4) / 40][Stage 4:>         (0 + 2) / 8]
 *
 * A drawer polls a source (the local scheduler, or the driver for a cluster context or a
 * submitted job binary) every PROGRESS_PERIOD_NS while actions run, and redraws the line in
 * place on a terminal: only stages that have run for PROGRESS_FIRST_DELAY_NS (short jobs
 * draw nothing), at most PROGRESS_MAX_SHOWN of them, at most once per period, and only when
 * the bar changed. The line is erased when no stage is left to show and when an action ends,
 * so that what the program prints next starts on a clean line.
 *
 * Threading: one thread per drawer, started with the first action; the source is called on
 * it without the drawer's lock, which guards everything else (and every write to fd).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "client/client_internal.h"

#define PROGRESS_PERIOD_NS 200000000ull      /* Spark's spark.ui.consoleProgress.update.interval */
#define PROGRESS_FIRST_DELAY_NS 500000000ull /* Spark's: stages younger than this are not shown */
#define PROGRESS_REFRESH_NS 60000000000ull   /* an unchanged bar is rewritten this often (ssh idles) */
#define PROGRESS_MAX_SHOWN 3                 /* stages side by side, as Spark */
#define PROGRESS_MAX_TRACKED 32              /* stages whose first sighting is remembered */
#define PROGRESS_DEFAULT_WIDTH 80
#define PROGRESS_MAX_WIDTH 1024

size_t client_progress_render(const sched_stage_progress *stages, uint32_t n, uint32_t width, char *buf,
                              size_t cap) {
  size_t len = 0;
  if (cap == 0) return 0;
  buf[0] = '\0';
  if (n == 0) return 0;
  uint32_t each = width / n;
  for (uint32_t i = 0; i < n; i++) {
    const sched_stage_progress *s = &stages[i];
    char header[32], tailer[64];
    int hl = snprintf(header, sizeof header, "[Stage %u:", s->stage);
    int tl = snprintf(tailer, sizeof tailer, "(%u + %u) / %u]", s->completed, s->running, s->tasks);
    int w = (int)each - hl - tl;
    /* Spark's bar: '=' for the done share of w, '>' at its head, blanks after. */
    uint64_t full = w > 0 && s->tasks ? (uint64_t)w * (s->completed < s->tasks ? s->completed : s->tasks) / s->tasks
                                       : 0;
    if (len + (size_t)hl + (size_t)tl + (w > 0 ? (size_t)w : 0) + 1 > cap) break;
    memcpy(buf + len, header, (size_t)hl);
    len += (size_t)hl;
    for (int j = 0; j < w; j++) buf[len++] = (uint64_t)j < full ? '=' : (uint64_t)j == full ? '>' : ' ';
    memcpy(buf + len, tailer, (size_t)tl);
    len += (size_t)tl;
  }
  buf[len] = '\0';
  return len;
}

typedef struct seen_stage {
  uint32_t stage;
  uint64_t first_ns;
} seen_stage;

struct client_progress {
  int fd;
  uint32_t width; /* 0: the terminal's */
  client_progress_source source;
  void *arg;
  pthread_mutex_t lock; /* everything below */
  pthread_cond_t wake;  /* an action started, or stop */
  pthread_t thread;
  bool started, stop;
  uint32_t active;  /* actions running */
  uint64_t ends;    /* actions ended and clears so far: a poll begun before one is stale */
  seen_stage seen[PROGRESS_MAX_TRACKED];
  uint32_t num_seen;
  char last[PROGRESS_MAX_WIDTH + 1]; /* the bar on the terminal; "" when none */
  size_t last_len;
  uint64_t last_draw_ns;
  bool drawn; /* something was drawn since the last erase */
};

static uint32_t terminal_width(const client_progress *p) {
  if (p->width) return p->width;
  struct winsize ws;
  if (ioctl(p->fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *cols = getenv("COLUMNS");
  long n = cols ? strtol(cols, NULL, 10) : 0;
  return n > 0 ? (uint32_t)n : PROGRESS_DEFAULT_WIDTH;
}

/* A terminal that cannot be written to loses its bar, never the program's work. */
static void put(client_progress *p, const char *s, size_t len) {
  while (len > 0) {
    ssize_t n = write(p->fd, s, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    s += n;
    len -= (size_t)n;
  }
}

/* Under p->lock. */
static void erase_locked(client_progress *p) {
  if (!p->drawn) return;
  char line[PROGRESS_MAX_WIDTH + 2];
  uint32_t w = terminal_width(p);
  if (w > PROGRESS_MAX_WIDTH) w = PROGRESS_MAX_WIDTH;
  if (w < p->last_len) w = (uint32_t)p->last_len;
  line[0] = '\r';
  memset(line + 1, ' ', w);
  line[w + 1] = '\r';
  put(p, line, (size_t)w + 2);
  p->drawn = false;
  p->last[0] = '\0';
  p->last_len = 0;
}

/* Under p->lock: remembers when each active stage was first seen (stages gone are forgotten)
 * and keeps, in stages[], those seen long enough ago; returns how many. */
static uint32_t old_enough(client_progress *p, sched_stage_progress *stages, uint32_t n, uint64_t now_ns) {
  seen_stage seen[PROGRESS_MAX_TRACKED];
  uint32_t num_seen = 0, kept = 0;
  for (uint32_t i = 0; i < n && num_seen < PROGRESS_MAX_TRACKED; i++) {
    uint64_t first = now_ns;
    for (uint32_t j = 0; j < p->num_seen; j++)
      if (p->seen[j].stage == stages[i].stage) first = p->seen[j].first_ns;
    seen[num_seen++] = (seen_stage){stages[i].stage, first};
    if (now_ns - first >= PROGRESS_FIRST_DELAY_NS && kept < PROGRESS_MAX_SHOWN) stages[kept++] = stages[i];
  }
  memcpy(p->seen, seen, num_seen * sizeof seen[0]);
  p->num_seen = num_seen;
  return kept;
}

void client_progress_tick(client_progress *p, uint64_t now_ns) {
  if (!p) return;
  sched_stage_progress stages[PROGRESS_MAX_TRACKED];
  uint32_t count = 0;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  uint64_t ends = p->ends;
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  fl_status st = p->source(p->arg, stages, PROGRESS_MAX_TRACKED, &count);
  if (count > PROGRESS_MAX_TRACKED) count = PROGRESS_MAX_TRACKED;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  if (st != FL_OK || ends != p->ends) goto done; /* no answer, or one from before an action ended */
  uint32_t shown = old_enough(p, stages, count, now_ns);
  if (shown == 0) {
    erase_locked(p);
    goto done;
  }
  if (p->drawn && now_ns - p->last_draw_ns < PROGRESS_PERIOD_NS) goto done;
  char bar[PROGRESS_MAX_WIDTH + 1];
  uint32_t w = terminal_width(p);
  size_t len = client_progress_render(stages, shown, w < PROGRESS_MAX_WIDTH ? w : PROGRESS_MAX_WIDTH, bar,
                                      sizeof bar);
  if (p->drawn && strcmp(bar, p->last) == 0 && now_ns - p->last_draw_ns < PROGRESS_REFRESH_NS) goto done;
  /* "\r", the bar, blanks over the rest of a longer last bar, "\r" (as Spark, the cursor
   * waits at the start of the line, so that other output overwrites the bar). */
  char line[2 * PROGRESS_MAX_WIDTH + 3];
  size_t n = 0;
  line[n++] = '\r';
  memcpy(line + n, bar, len);
  n += len;
  for (size_t i = len; i < p->last_len; i++) line[n++] = ' ';
  line[n++] = '\r';
  put(p, line, n);
  memcpy(p->last, bar, len + 1);
  p->last_len = len;
  p->last_draw_ns = now_ns;
  p->drawn = true;
done:
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
}

static void *drawer_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-progress");
  client_progress *p = arg;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  while (!p->stop) {
    if (p->active == 0) {
      FL_PCHECK(pthread_cond_wait(&p->wake, &p->lock));
      continue;
    }
    FL_PCHECK(pthread_mutex_unlock(&p->lock));
    client_progress_tick(p, common_now_ns());
    FL_PCHECK(pthread_mutex_lock(&p->lock));
    uint64_t at = common_now_ns() + PROGRESS_PERIOD_NS;
    struct timespec ts = {(time_t)(at / 1000000000u), (long)(at % 1000000000u)};
    while (!p->stop && p->active > 0 && common_now_ns() < at)
      if (pthread_cond_timedwait(&p->wake, &p->lock, &ts) == ETIMEDOUT) break;
  }
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  return NULL;
}

fl_status client_progress_create(int fd, uint32_t width, client_progress_source source, void *arg,
                                 client_progress **out) {
  *out = NULL;
  client_progress *p = common_calloc(1, sizeof *p);
  if (!p) return FL_ERR(FL_ENOMEM, "out of memory");
  p->fd = fd;
  p->width = width;
  p->source = source;
  p->arg = arg;
  FL_PCHECK(pthread_mutex_init(&p->lock, NULL));
  pthread_condattr_t attr; /* monotonic, as common_now_ns */
  FL_PCHECK(pthread_condattr_init(&attr));
  FL_PCHECK(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC));
  FL_PCHECK(pthread_cond_init(&p->wake, &attr));
  pthread_condattr_destroy(&attr);
  *out = p;
  return FL_OK;
}

void client_progress_begin(client_progress *p) {
  if (!p) return;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  if (!p->started && !p->stop) {
    /* Without a thread there is no bar; the action runs all the same. */
    p->started = pthread_create(&p->thread, NULL, drawer_main, p) == 0;
  }
  p->active++;
  FL_PCHECK(pthread_cond_broadcast(&p->wake));
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
}

void client_progress_end(client_progress *p) {
  if (!p) return;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  if (p->active > 0) p->active--;
  p->ends++;
  erase_locked(p);
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
}

void client_progress_clear(client_progress *p) {
  if (!p) return;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  p->ends++;
  erase_locked(p);
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
}

void client_progress_destroy(client_progress *p) {
  if (!p) return;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  p->stop = true;
  FL_PCHECK(pthread_cond_broadcast(&p->wake));
  bool started = p->started;
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  if (started) pthread_join(p->thread, NULL);
  erase_locked(p); /* alone now */
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->lock);
  common_free(p);
}

/* ---- the driver as a source ---------------------------------------------------------------- */

/* A driver slower than this to say skips a redraw or a few. */
#define PROGRESS_RPC_TIMEOUT_MS 2000

fl_status client_progress_ask_driver(void *arg, sched_stage_progress *out, uint32_t cap, uint32_t *count) {
  const client_progress_driver *src = arg;
  *count = 0;
  Flint__StageProgressRequest req = FLINT__STAGE_PROGRESS_REQUEST__INIT;
  req.app_id = src->app_id;
  req.submission_id = src->submission_id;
  fl_buf reply = FL_BUF_INIT;
  fl_status st =
      client_rpc_call(src->driver, "/flint.Driver/StageProgress", &req.base, PROGRESS_RPC_TIMEOUT_MS, &reply);
  if (st == FL_OK) {
    Flint__StageProgressReply *r = flint__stage_progress_reply__unpack(NULL, reply.len, reply.data);
    if (!r) {
      st = FL_ERR(FL_EPROTO, "StageProgress: malformed reply");
    } else {
      for (size_t i = 0; i < r->n_stages && i < cap; i++)
        out[i] = (sched_stage_progress){r->stages[i]->stage, r->stages[i]->tasks, r->stages[i]->completed,
                                        r->stages[i]->running};
      *count = (uint32_t)r->n_stages;
      flint__stage_progress_reply__free_unpacked(r, NULL);
    }
  }
  fl_buf_free(&reply);
  return st;
}
