/*
 * progress.c: what every progress line shares: whether it may redraw itself in place (a
 * terminal, FLINT_PROGRESS on) and its ETA. Stateless: part of common's base, which the
 * add-on libraries (flint train's, flint ml's) link too.
 */
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"

bool common_progress_on_terminal(int fd) { return config_bool(CONFIG_PROGRESS) && isatty(fd) == 1; }

int common_progress_eta(char *buf, size_t cap, double elapsed_s, double fraction) {
  if (!(fraction > 0) || !(elapsed_s >= 0) || !isfinite(elapsed_s)) return snprintf(buf, cap, "ETA --:--");
  if (fraction > 1) fraction = 1;
  double left = elapsed_s * (1 - fraction) / fraction;
  if (left > 359999) left = 359999; /* 99:59:59 */
  unsigned long s = (unsigned long)(left + 0.5);
  if (s >= 3600) return snprintf(buf, cap, "ETA %lu:%02lu:%02lu", s / 3600, s / 60 % 60, s % 60);
  return snprintf(buf, cap, "ETA %02lu:%02lu", s / 60, s % 60);
}
