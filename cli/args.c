/*
 * cli/args.c: strict parsing of the numbers that the subcommands take as options. The whole
 * text must be the number: no leading space, no sign for counts, no trailing text. Also the
 * getopt_long glue and the one error form that every command shares (flint-train too, which
 * links this file and not usage.c).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/cli.h"
#include "common/common.h"
#include "flint/flint.h"

bool cli_parse_double(const char *text, double *out) {
  if (!*text || isspace((unsigned char)*text)) return false;
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (*end || errno == ERANGE || !isfinite(v)) return false;
  *out = v;
  return true;
}

/* Digits only: strtoull would take a sign and wrap "-1" around. */
bool cli_parse_u64(const char *text, uint64_t max, uint64_t *out) {
  if (!isdigit((unsigned char)*text)) return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (*end || errno == ERANGE || v > max) return false;
  *out = v;
  return true;
}

bool cli_parse_u32(const char *text, uint32_t *out) {
  uint64_t v;
  if (!cli_parse_u64(text, UINT32_MAX, &v)) return false;
  *out = (uint32_t)v;
  return true;
}

/* getopt_long has left optind past the option it could not take (argv[optind - 1]), unless
 * the option was one letter among others ("-xh"), which only optopt names. */
int cli_option_error(const char *cmd, int c, char **argv, const struct option *longopts) {
  const char *arg = argv[optind - 1];
  bool is_long = strncmp(arg, "--", 2) == 0;
  if (c == ':') {
    if (is_long) return cli_usage_error(cmd, "%s needs a value", arg);
    return cli_usage_error(cmd, "-%c needs a value", optopt);
  }
  if (!is_long) return cli_usage_error(cmd, "unknown option '-%c'", optopt ? optopt : '?');
  const char *eq = strchr(arg, '=');
  if (eq) { /* "--detach=yes": an option that takes no value, given one */
    size_t len = (size_t)(eq - arg - 2);
    for (const struct option *o = longopts; o->name; o++)
      if (o->has_arg == no_argument && strlen(o->name) == len && strncmp(o->name, arg + 2, len) == 0)
        return cli_usage_error(cmd, "--%s takes no value ('%s')", o->name, arg);
  }
  return cli_usage_error(cmd, "unknown option '%s'", arg);
}

/* The one reader of memory sizes is common's, which the memory settings share; an option's
 * memory is never 0. */
bool cli_parse_memory(const char *text, uint64_t *bytes) {
  uint64_t v;
  if (!common_parse_memory(text, &v) || v == 0) return false;
  *bytes = v;
  return true;
}

static void verror(const char *cmd, const char *fmt, va_list ap) {
  if (cmd) fprintf(stderr, "flint %s: ", cmd);
  else fputs("flint: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

void cli_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(cmd, fmt, ap);
  va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  fflush(stdout);
  va_list ap;
  va_start(ap, fmt);
  verror(cmd, fmt, ap);
  va_end(ap);
  if (cmd) fprintf(stderr, "Run 'flint %s --help' for usage.\n", cmd);
  else fputs("Run 'flint --help' for usage.\n", stderr);
  return 2;
}

int cli_failure(const char *cmd, const char *fmt, ...) {
  fflush(stdout); /* what the work printed comes before why it stopped */
  va_list ap;
  va_start(ap, fmt);
  verror(cmd, fmt, ap);
  va_end(ap);
  return 1;
}

int cli_print_version(void) {
  printf("flint %s\n", FL_VERSION_STRING);
  return 0;
}
