/*
 * config.c: the settings' getters (config.h): parsing, defaults and warnings. The table and
 * the raw text are config_table.c's, below this file and the log it warns through.
 *
 * Threads: every call reads the environment afresh and parses it; the only state is, per
 * setting, a hash of the last invalid text warned about (an atomic), so that a setting read in
 * a loop warns once per bad value rather than at every read.
 */
#include <ctype.h>
#include <stdio.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "common/config.h"

/* Per setting: common_hash64 of the invalid text last warned about; 0: none. */
static atomic_uint_fast64_t warned[CONFIG_SETTINGS];

/* ---- sizes (common.h) ---------------------------------------------------------------- */

bool common_parse_size(const char *s, uint64_t *out) {
  /* strtoull would skip spaces and accept a sign: only plain digits are a size. */
  if (!s || *s < '0' || *s > '9') return false;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  uint64_t mult = 1;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': mult = 1ull << 10; end++; break;
  case 'm': case 'M': mult = 1ull << 20; end++; break;
  case 'g': case 'G': mult = 1ull << 30; end++; break;
  case 't': case 'T': mult = 1ull << 40; end++; break;
  default: return false;
  }
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0' || v > UINT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

bool common_parse_memory(const char *text, uint64_t *bytes) {
  /* Digits with at most one '.', then the unit: no sign, space, exponent or hex. */
  if (!text || !isdigit((unsigned char)*text)) return false;
  const char *p = text;
  int dots = 0;
  for (; isdigit((unsigned char)*p) || *p == '.'; p++) dots += *p == '.';
  char number[64];
  size_t len = (size_t)(p - text);
  if (dots > 1 || len >= sizeof number) return false;
  memcpy(number, text, len);
  number[len] = '\0';
  double v = strtod(number, NULL);
  static const struct { char letter; double scale; } units[] = {
      {'b', 1.0}, {'k', 1024.0}, {'m', 1048576.0}, {'g', 1073741824.0}, {'t', 1099511627776.0}};
  double scale = 1048576.0; /* a bare number is MiB, as Spark reads --executor-memory */
  if (*p) {
    char letter = (char)tolower((unsigned char)*p);
    scale = 0;
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
      if (units[i].letter == letter) scale = units[i].scale;
    if (scale == 0) return false;
    const char *rest = p + 1;
    /* "b" stands alone; the others may add "b" or "ib" (KB, KiB: both 1024, as in Spark). */
    if (letter != 'b' && *rest && strcasecmp(rest, "b") != 0 && strcasecmp(rest, "ib") != 0) return false;
    if (letter == 'b' && *rest) return false;
  }
  double total = v * scale;
  /* 0 is zero bytes (a setting's range decides whether it may be); a fraction of a byte is
   * no size */
  if (total != 0.0 && !(total >= 1.0)) return false;
  if (total >= 4611686018427387904.0) return false; /* 2^62 */
  *bytes = (uint64_t)(total + 0.5);
  return true;
}

/* ---- parsing --------------------------------------------------------------------------- */

typedef union config_value {
  uint64_t number; /* bool (0 or 1), count, ms, us, size, memory (bytes) */
  double real;
  const char *text; /* string, path */
} config_value;

static bool is_number_type(config_type type) {
  return type == CONFIG_TYPE_BOOL || type == CONFIG_TYPE_COUNT || type == CONFIG_TYPE_MS ||
         type == CONFIG_TYPE_US || type == CONFIG_TYPE_SIZE || type == CONFIG_TYPE_MEMORY;
}

/* Reads `text` by the rules of s's type (config.h); false when it is invalid. */
static bool parse(const config_setting *s, const char *text, config_value *out) {
  switch (s->type) {
  case CONFIG_TYPE_STRING:
  case CONFIG_TYPE_PATH:
    out->text = text;
    return true;
  case CONFIG_TYPE_REAL: {
    /* strtod would skip spaces: only a number that starts the text is one */
    if (isspace((unsigned char)*text)) return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno == ERANGE || !isfinite(v)) return false;
    out->real = v;
    return true;
  }
  case CONFIG_TYPE_SIZE:
    if (!common_parse_size(text, &out->number)) return false;
    break;
  case CONFIG_TYPE_MEMORY:
    if (!common_parse_memory(text, &out->number)) return false;
    break;
  default: {
    /* strtoull would skip spaces and take a sign (wrapping "-1" around): digits only */
    if (!isdigit((unsigned char)*text)) return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end || errno == ERANGE) return false;
    out->number = v;
    break;
  }
  }
  if (out->number < s->min || out->number > s->max) return false;
  if (s->type == CONFIG_TYPE_BOOL) out->number = out->number != 0;
  return true;
}

/* What an invalid value of s should have been, for messages: "a number of milliseconds". */
static void expected(const config_setting *s, char *buf, size_t len) {
  const char *what;
  switch (s->type) {
  case CONFIG_TYPE_BOOL: what = "a whole number (0: off, others: on)"; break;
  case CONFIG_TYPE_COUNT: what = "a whole number"; break;
  case CONFIG_TYPE_MS: what = "a whole number of milliseconds"; break;
  case CONFIG_TYPE_US: what = "a whole number of microseconds"; break;
  case CONFIG_TYPE_SIZE: what = "a size (examples: 512m, 2g, 1048576)"; break;
  case CONFIG_TYPE_MEMORY: what = "a size (examples: 512m, 1.5g, 2048 for 2 GiB)"; break;
  default: what = "a decimal number"; break;
  }
  bool numeric = is_number_type(s->type) && s->type != CONFIG_TYPE_BOOL;
  bool capped = numeric && s->max != CONFIG_MAX_I64 && s->max != UINT64_MAX;
  unsigned long long lo = s->min, hi = s->max;
  if (numeric && s->min > 0 && capped) snprintf(buf, len, "%s from %llu to %llu", what, lo, hi);
  else if (numeric && s->min > 0) snprintf(buf, len, "%s of at least %llu", what, lo);
  else if (capped) snprintf(buf, len, "%s of at most %llu", what, hi);
  else snprintf(buf, len, "%s", what);
}

/* The value of `id` in *out and where it comes from; the table's default when the
 * environment gives none (zero for CONFIG_COMPUTED settings). `warn`: log an invalid value. */
static config_source lookup(config_id id, bool warn, config_value *out) {
  const config_setting *s = config_setting_of(id);
  config_source from;
  const char *text = config_text_from(id, &from);
  if (text) {
    if (parse(s, text, out)) return from;
    uint64_t h = common_hash_bytes(text, strlen(text)) | 1; /* never 0, "none" */
    if (warn && atomic_exchange(&warned[id], h) != h) {
      char what[96];
      expected(s, what, sizeof what);
      char where[PATH_MAX + 32] = "";
      if (from == CONFIG_FROM_FILE)
        snprintf(where, sizeof where, " (%s:%u)", config_file_path(), config_file_line(id));
      common_log(LOG_WARN, "%s=%s%s is not %s: using %s%s", s->name, text, where, what,
                 s->flags & CONFIG_COMPUTED ? "the default, " : "", s->default_text);
    }
  }
  memset(out, 0, sizeof *out);
  if (!(s->flags & CONFIG_COMPUTED)) {
    bool ok = parse(s, s->default_text, out);
    FL_ASSERT(ok); /* tests/test_config.c reads every default */
  }
  return text ? CONFIG_FROM_INVALID : CONFIG_FROM_DEFAULT;
}

/* ---- reading --------------------------------------------------------------------------- */

config_source config_source_of(config_id id) {
  config_value v;
  return lookup(id, false, &v);
}

fl_status config_check(config_id id) {
  config_value v;
  if (lookup(id, false, &v) != CONFIG_FROM_INVALID) return FL_OK;
  const config_setting *s = config_setting_of(id);
  config_source from;
  const char *text = config_text_from(id, &from);
  char what[96], where[PATH_MAX + 32] = "";
  expected(s, what, sizeof what);
  if (from == CONFIG_FROM_FILE) snprintf(where, sizeof where, " (%s:%u)", config_file_path(), config_file_line(id));
  /* FLINT_MEMORY's message as fl_context_open gave it before there was a registry */
  return fl_set_error(FL_EINVAL, "%s: '%s'%s is not %s", s->name, text ? text : "", where, what);
}

bool config_given(config_id id) {
  config_value v;
  config_source from = lookup(id, true, &v);
  return from != CONFIG_FROM_DEFAULT && from != CONFIG_FROM_INVALID;
}

/* The value of a setting that must be of type `type` (a getter of another type is a bug). */
static config_value get(config_id id, config_type type) {
  FL_ASSERT(config_setting_of(id)->type == type);
  config_value v;
  lookup(id, true, &v);
  return v;
}

bool config_bool(config_id id) { return get(id, CONFIG_TYPE_BOOL).number != 0; }
uint64_t config_count(config_id id) { return get(id, CONFIG_TYPE_COUNT).number; }
uint64_t config_ms(config_id id) { return get(id, CONFIG_TYPE_MS).number; }
uint64_t config_us(config_id id) { return get(id, CONFIG_TYPE_US).number; }
uint64_t config_size(config_id id) { return get(id, CONFIG_TYPE_SIZE).number; }
uint64_t config_memory(config_id id) { return get(id, CONFIG_TYPE_MEMORY).number; }
double config_real(config_id id) { return get(id, CONFIG_TYPE_REAL).real; }

const char *config_string(config_id id) {
  const config_setting *s = config_setting_of(id);
  FL_ASSERT(s->type == CONFIG_TYPE_STRING || s->type == CONFIG_TYPE_PATH);
  config_value v;
  lookup(id, true, &v);
  return v.text;
}

int64_t config_limit(config_id id) {
  const config_setting *s = config_setting_of(id);
  FL_ASSERT((s->flags & CONFIG_NO_LIMIT) && (s->type == CONFIG_TYPE_COUNT || s->type == CONFIG_TYPE_MS));
  FL_ASSERT(s->max <= CONFIG_MAX_I64);
  config_value v;
  lookup(id, true, &v);
  return v.number == 0 ? -1 : (int64_t)v.number;
}

fl_status config_secret(char **out) {
  *out = NULL;
  const char *env = config_string(CONFIG_SECRET);
  if (env) {
    if (!(*out = common_strdup(env))) return FL_ERR(FL_ENOMEM, "out of memory");
    return FL_OK;
  }
  const char *file = config_string(CONFIG_SECRET_FILE);
  if (!file) return FL_OK;
  FILE *f = fopen(file, "r");
  if (!f) return FL_ERR(FL_EAUTH, "cannot read the secret file %s: %s", file, strerror(errno));
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
  buf[n] = 0;
  if (n == 0) return FL_ERR(FL_EAUTH, "the secret file %s is empty", file);
  if (!(*out = common_strdup(buf))) return FL_ERR(FL_ENOMEM, "out of memory");
  return FL_OK;
}
