/*
 * log.c: one line per message of the long-running processes (common.h), on stderr or
 * appended to FLINT_LOG_FILE.
 *
 * Stateless but for the role, the level and the log file's descriptor, which every library
 * that links this file keeps a copy of (common.h: flint's add-on libraries link the
 * stateless part of common/): the role is set where driver and executor start, in libflint,
 * so a line logged from an add-on library says "flint" where libflint's says "executor 3".
 * The level and the file are read once, at the first line (a race of two first lines reads
 * them twice, to the same result; the loser's descriptor is closed).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"

static char log_role[64] = "flint";
/* LOG_DEBUG lets every line through to common_log, which reads FLINT_LOG at the first. */
atomic_int common_log_threshold = LOG_DEBUG;
static atomic_bool log_ready;
static atomic_int log_fd = 2;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void common_log_set_role(const char *role) { snprintf(log_role, sizeof log_role, "%s", role); }

const char *common_log_role(void) { return log_role; }

/* FLINT_LOG's level; -1 when it names none. */
static int level_of(const char *text) {
  if (!text) return LOG_INFO;
  for (int i = 0; i < 4; i++)
    if (strcmp(text, level_names[i]) == 0) return i;
  return -1;
}

fl_status common_log_check(void) {
  const char *text = config_text(CONFIG_LOG);
  if (level_of(text) >= 0) return FL_OK;
  return fl_set_error(FL_EINVAL, "FLINT_LOG: '%s' is not a level (error, warn, info or debug)", text);
}

static void write_line(int fd, const char *line, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, line, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    line += n;
    len -= (size_t)n;
  }
}

static void log_line(int fd, common_log_level level, const char *msg) {
  static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  char line[1200];
  int n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, tags[level],
                   log_role, msg);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) { /* cut short: still one line */
    n = sizeof line - 1;
    line[n - 1] = '\n';
  }
  /* One write per line, so lines of concurrent threads and processes do not interleave. */
  write_line(fd, line, (size_t)n);
}

/* Reads FLINT_LOG and FLINT_LOG_FILE; warns (once) about what it cannot use. */
static void log_setup(void) {
  const char *text = config_text(CONFIG_LOG);
  int level = level_of(text);
  char warning[256] = "";
  if (level < 0) {
    snprintf(warning, sizeof warning, "FLINT_LOG=%s is not a level (error, warn, info or debug): using info", text);
    level = LOG_INFO;
  }
  const char *path = config_text(CONFIG_LOG_FILE);
  if (path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      int old = 2;
      if (!atomic_compare_exchange_strong(&log_fd, &old, fd)) close(fd);
    } else if (!warning[0]) {
      snprintf(warning, sizeof warning, "FLINT_LOG_FILE: cannot open %s (%s): logging to stderr", path,
               strerror(errno));
    }
  }
  atomic_store(&common_log_threshold, level);
  atomic_store(&log_ready, true);
  if (warning[0] && level >= LOG_WARN) log_line(atomic_load(&log_fd), LOG_WARN, warning);
}

void common_log(common_log_level level, const char *fmt, ...) {
  if (!atomic_load_explicit(&log_ready, memory_order_acquire)) log_setup();
  if (!common_log_enabled(level)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log_line(atomic_load_explicit(&log_fd, memory_order_relaxed), level, msg);
}
