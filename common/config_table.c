/*
 * config_table.c: the settings table (config.h), what it says of each setting, and a
 * setting's raw text: what the log, which config.c warns through, reads its level with.
 *
 * Threads: any; the table is constant.
 */
#include <string.h>

#include "common/config.h"

static const config_setting settings[CONFIG_SETTINGS] = {
#define CONFIG_ROW_(name, type, readers, flags, min, max, def, doc)                                             \
  {"FLINT_" #name, CONFIG_TYPE_##type, CONFIG_READ_##readers, (flags), (min), (max), (def), (doc)},
    CONFIG_TABLE(CONFIG_ROW_)
#undef CONFIG_ROW_
};

/* ---- the table ------------------------------------------------------------------------- */

const config_setting *config_setting_of(config_id id) {
  FL_ASSERT((unsigned)id < CONFIG_SETTINGS);
  return &settings[id];
}

bool config_find(const char *name, config_id *out) {
  for (unsigned i = 0; name && i < CONFIG_SETTINGS; i++)
    if (strcmp(settings[i].name, name) == 0) {
      *out = (config_id)i;
      return true;
    }
  return false;
}

const char *config_type_name(config_type type) {
  static const char *const names[] = {"bool", "count", "ms", "us", "size", "real", "string", "path"};
  return (unsigned)type < sizeof names / sizeof *names ? names[type] : "?";
}

const char *config_unit(config_type type) {
  switch (type) {
  case CONFIG_TYPE_MS: return "ms";
  case CONFIG_TYPE_US: return "us";
  case CONFIG_TYPE_SIZE: return "bytes";
  default: return "";
  }
}

const char *config_readers_text(config_readers readers) {
  switch (readers) {
  case CONFIG_READ_ANY: return "any";
  case CONFIG_READ_CLIENT: return "client";
  case CONFIG_READ_DRIVER: return "driver";
  case CONFIG_READ_EXECUTOR: return "executor";
  case CONFIG_READ_SERVERS: return "driver, executor";
  case CONFIG_READ_TASKS: return "client, executor";
  }
  return "?";
}

/* ---- the raw text ---------------------------------------------------------------------- */

const char *config_text(config_id id) {
  const char *text = getenv(config_setting_of(id)->name);
  return text && *text ? text : NULL;
}
