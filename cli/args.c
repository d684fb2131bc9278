/*
 * cli/args.c: strict parsing of the numbers that the subcommands take as options. The whole
 * text must be the number: no leading space, no sign for counts, no trailing text.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "cli/cli.h"

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
