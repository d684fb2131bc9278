/*
 * plan_registry.c: which operations and builtins plans know, module by module. rdd's own
 * tables are here from the start; a module above rdd/ adds its own with rdd_plan_register
 * (shuffle/plan_codec.c, from a constructor), so that rdd/ needs to know nothing of it.
 *
 * Threads: registration happens before any plan is encoded or decoded (at load time); a
 * module's entry is written before the count that publishes it (release), and readers load
 * the count first (acquire), so lookups need no lock.
 */
#include <string.h>

#include "rdd/ops.h"
#include "rdd/plan_internal.h"

#define MAX_MODULES 8

typedef struct plan_module {
  const rdd_op_codec *codecs; /* ended by ops == NULL; may be NULL */
  const rdd_builtin *builtins; /* ended by name == NULL; may be NULL */
} plan_module;

static plan_module modules[MAX_MODULES] = {
    {rdd_source_codecs, NULL},
    {rdd_file_codecs, NULL},
    {rdd_narrow_codecs, NULL},
    {rdd_checkpoint_codecs, rdd_partitioner_builtins},
};
static atomic_size_t num_modules = 4;

void rdd_plan_register(const rdd_op_codec *codecs, const rdd_builtin *builtins) {
  size_t n = atomic_load_explicit(&num_modules, memory_order_relaxed);
  FL_ASSERT(n < MAX_MODULES);
  modules[n] = (plan_module){codecs, builtins};
  atomic_store_explicit(&num_modules, n + 1, memory_order_release);
}

static size_t module_count(void) { return atomic_load_explicit(&num_modules, memory_order_acquire); }

const rdd_op_codec *rdd_plan_codec_by_ops(const rdd_ops *ops) {
  for (size_t m = 0, n = module_count(); m < n; m++)
    for (const rdd_op_codec *c = modules[m].codecs; c && c->ops; c++)
      if (c->ops == ops) return c;
  return NULL;
}

const rdd_op_codec *rdd_plan_codec_by_name(const char *op) {
  for (size_t m = 0, n = module_count(); m < n; m++)
    for (const rdd_op_codec *c = modules[m].codecs; c && c->ops; c++)
      if (strcmp(c->ops->name, op) == 0) return c;
  return NULL;
}

const char *rdd_plan_known_kind(const char *kind) {
  for (size_t m = 0, n = module_count(); m < n; m++)
    for (const rdd_op_codec *c = modules[m].codecs; c && c->ops; c++) {
      if (strcmp(c->ops->name, kind) == 0) return c->ops->name;
      for (const char *const *k = c->kinds; k && *k; k++)
        if (strcmp(*k, kind) == 0) return *k;
    }
  return NULL;
}

const rdd_builtin *rdd_plan_builtin_by_fn(void (*fn)(void)) {
  for (size_t m = 0, n = module_count(); m < n; m++)
    for (const rdd_builtin *b = modules[m].builtins; b && b->name; b++)
      if (b->fn == fn) return b;
  return NULL;
}

const rdd_builtin *rdd_plan_builtin_by_name(const char *name) {
  for (size_t m = 0, n = module_count(); m < n; m++)
    for (const rdd_builtin *b = modules[m].builtins; b && b->name; b++)
      if (strcmp(b->name, name) == 0) return b;
  return NULL;
}
