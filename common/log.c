/*
 * log.c: one line on stderr per message of the long-running processes (common.h).
 *
 * Stateless but for the role and the level, which every library that links this file keeps
 * a copy of (common.h: flint's add-on libraries link the stateless part of common/): the
 * role is set where driver and executor start, in libflint, so a line logged from an add-on
 * library says "flint" where libflint's says "executor 3".
 */
#include <stdarg.h>
#include <string.h>

#include "common/config.h"

static char log_role[64] = "flint";
static int log_threshold = -1;

void common_log_set_role(const char *role) { snprintf(log_role, sizeof log_role, "%s", role); }

const char *common_log_role(void) { return log_role; }

void common_log(common_log_level level, const char *fmt, ...) {
  if (log_threshold < 0) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    const char *env = config_text(CONFIG_LOG);
    int t = LOG_INFO;
    for (int i = 0; env && i < 4; i++)
      if (strcmp(env, names[i]) == 0) t = i;
    log_threshold = t;
  }
  if ((int)level > log_threshold) return;
  static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  localtime_r(&ts.tv_sec, &tm);
  /* One write per line, so lines of concurrent threads do not interleave. */
  fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
          ts.tv_nsec / 1000000, tags[level], log_role, line);
}
