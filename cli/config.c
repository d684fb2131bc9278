/*
 * cli/config.c: flint config [--json]: every setting of common/config.h with its value as
 * --conf, this environment and flint-defaults.conf give it, where the value came from
 * (--conf, environment, file, default, or invalid), its unit, the processes that read it and
 * what it does. A table, then the file in use (or where none was found) and what is invalid;
 * or with --json one JSON object per setting (one a line).
 *
 * The values are what a process started from here would read (the driver and executors
 * that local-cluster starts inherit the environment, --conf's included, and read the same
 * file). A secret's value is never printed.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/config.h"

/* Values wider than this overflow their column rather than widen it for every row. */
#define VALUE_COLUMN_MAX 30

/* What `flint config` shows of one setting. */
typedef struct shown {
  const config_setting *s;
  config_source source;
  const char *value; /* the text given, the default's, or "(hidden)" */
  const char *given; /* the text given (NULL: none; "(hidden)" for secrets) */
  config_source given_by; /* where `given` comes from (CONFIG_FROM_DEFAULT: nowhere) */
} shown;

static shown show(config_id id) {
  shown r = {.s = config_setting_of(id), .source = config_source_of(id)};
  r.given = config_text_from(id, &r.given_by);
  if (r.given && (r.s->flags & CONFIG_HIDDEN)) r.given = "(hidden)";
  r.value = r.source != CONFIG_FROM_DEFAULT && r.source != CONFIG_FROM_INVALID ? r.given : r.s->default_text;
  return r;
}

static const char *source_name(config_source source) {
  switch (source) {
  case CONFIG_FROM_ENVIRONMENT: return "environment";
  case CONFIG_FROM_FILE: return "file";
  case CONFIG_FROM_COMMAND_LINE: return "--conf";
  case CONFIG_FROM_INVALID: return "invalid";
  default: return "default";
  }
}

/* `text` as a JSON string, quotes included. */
static void put_json_string(FILE *out, const char *text) {
  if (!text) {
    fputs("null", out);
    return;
  }
  fputc('"', out);
  for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
    if (*c == '"' || *c == '\\') fprintf(out, "\\%c", *c);
    else if (*c == '\n') fputs("\\n", out);
    else if (*c == '\t') fputs("\\t", out);
    else if (*c < 0x20) fprintf(out, "\\u%04x", *c);
    else fputc(*c, out);
  }
  fputc('"', out);
}

static const char *flag(const config_setting *s, unsigned f) { return s->flags & f ? "true" : "false"; }

static void print_json(FILE *out) {
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    shown r = show((config_id)i);
    const config_setting *s = r.s;
    fputs("{\"name\": ", out);
    put_json_string(out, s->name);
    fputs(", \"value\": ", out);
    put_json_string(out, r.value);
    fprintf(out, ", \"source\": \"%s\", \"given\": ", source_name(r.source));
    put_json_string(out, r.given);
    fprintf(out, ", \"given_by\": \"%s\"", source_name(r.given_by));
    if (r.given_by == CONFIG_FROM_FILE)
      fprintf(out, ", \"file\": \"%s:%u\"", config_file_path(), config_file_line((config_id)i));
    fprintf(out, ", \"type\": \"%s\", \"unit\": \"%s\", \"default\": ", config_type_name(s->type),
            config_unit(s->type));
    put_json_string(out, s->default_text);
    fprintf(out, ", \"computed_default\": %s, \"read_by\": \"%s\"", flag(s, CONFIG_COMPUTED),
            config_readers_text(s->readers));
    fprintf(out, ", \"strict\": %s, \"internal\": %s, \"test_only\": %s", flag(s, CONFIG_STRICT),
            flag(s, CONFIG_INTERNAL), flag(s, CONFIG_TEST_ONLY));
    fputs(", \"description\": ", out);
    put_json_string(out, s->description);
    fputs("}\n", out);
  }
}

static void print_table(FILE *out) {
  int name_w = (int)strlen("NAME"), value_w = (int)strlen("VALUE"), source_w = (int)strlen("SOURCE");
  int unit_w = (int)strlen("UNIT"), readers_w = (int)strlen("READ BY");
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    shown r = show((config_id)i);
    int n = (int)strlen(r.s->name), v = (int)strlen(r.value), src = (int)strlen(source_name(r.source));
    int u = (int)strlen(config_unit(r.s->type)), rd = (int)strlen(config_readers_text(r.s->readers));
    if (n > name_w) name_w = n;
    if (v > value_w && v <= VALUE_COLUMN_MAX) value_w = v;
    if (src > source_w) source_w = src;
    if (u > unit_w) unit_w = u;
    if (rd > readers_w) readers_w = rd;
  }
  fprintf(out, "%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", name_w, "NAME", value_w, "VALUE", source_w, "SOURCE",
          unit_w, "UNIT", readers_w, "READ BY", "DESCRIPTION");
  int invalid = common_log_check() != FL_OK;
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++) {
    shown r = show((config_id)i);
    invalid += r.source == CONFIG_FROM_INVALID;
    fprintf(out, "%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", name_w, r.s->name, value_w, r.value, source_w,
            source_name(r.source), unit_w, config_unit(r.s->type), readers_w, config_readers_text(r.s->readers),
            r.s->description);
  }
  fputc('\n', out);
  if (config_file_status() != FL_OK) fputs("file: invalid, not used (below)\n", out);
  else if (config_file_path()) fprintf(out, "file: %s\n", config_file_path());
  else fprintf(out, "file: none (%s)\n", CONFIG_FILE_ORDER);
  if (!invalid) return;
  /* The rows say "invalid" and show the default, which the processes use (or refuse to start). */
  if (common_log_check() != FL_OK) fprintf(out, "invalid: %s (flint commands refuse to start)\n", fl_last_error());
  for (unsigned i = 0; i < CONFIG_SETTINGS; i++)
    if (config_check((config_id)i) != FL_OK)
      fprintf(out, "invalid: %s (%s)\n", fl_last_error(),
              config_setting_of((config_id)i)->flags & CONFIG_STRICT ? "its readers fail" : "the default is used");
}

int cmd_config(int argc, char **argv) {
  enum { OPT_JSON = 256 };
  static const struct option longopts[] = {{"json", no_argument, NULL, OPT_JSON}, CLI_COMMON_LONG_OPTIONS, {0}};
  bool json = false;
  int c;
  optind = 0; /* afresh; argv - 1 is the command's name, getopt's argv[0] */
  while ((c = getopt_long(argc + 1, argv - 1, ":hV", longopts, NULL)) != -1) {
    switch (c) {
    case CLI_OPT_HELP: fputs(cli_config_usage, stdout); return 0;
    case CLI_OPT_VERSION: return cli_print_version();
    case OPT_JSON: json = true; break;
    default: return cli_option_error("config", c, argv - 1, longopts);
    }
  }
  if (optind - 1 < argc) return cli_usage_error("config", "unexpected argument '%s'", argv[optind - 1]);
  /* A file that is not used is an error here too, after what the settings are without it. */
  fl_status file = config_file_status();
  if (json) print_json(stdout);
  else print_table(stdout);
  if (file != FL_OK) return cli_failure("config", "%s (the file is not used)", fl_last_error());
  return 0;
}
