/* locations.c: which executor holds each map output and cached block of an application.
 * A flat array of (id, index, executor) entries: the driver holds at most a few thousand per
 * application, and lookups happen once per task, so a scan costs less than it would to keep
 * a hash table. Not thread-safe: the owner (driver_app) locks. */
#include "driver/driver.h"

typedef struct location {
  uint64_t id, executor;
  uint32_t index;
} location;

struct location_table {
  location *items;
  size_t count, cap;
};

fl_status location_table_create(location_table **out) {
  if (!(*out = common_calloc(1, sizeof **out))) return FL_ERR(FL_ENOMEM, "out of memory");
  return FL_OK;
}

void location_table_destroy(location_table *t) {
  if (!t) return;
  common_free(t->items);
  common_free(t);
}

fl_status location_set(location_table *t, uint64_t id, uint32_t index, uint64_t executor) {
  for (size_t i = 0; i < t->count; i++)
    if (t->items[i].id == id && t->items[i].index == index) {
      t->items[i].executor = executor;
      return FL_OK;
    }
  if (t->count == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    location *grown = common_realloc(t->items, cap * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
    t->items = grown;
    t->cap = cap;
  }
  t->items[t->count++] = (location){id, executor, index};
  return FL_OK;
}

uint64_t location_get(const location_table *t, uint64_t id, uint32_t index) {
  for (size_t i = 0; i < t->count; i++)
    if (t->items[i].id == id && t->items[i].index == index) return t->items[i].executor;
  return 0;
}

static void forget_where(location_table *t, bool by_id, uint64_t value,
                         void (*gone)(void *arg, uint64_t id, uint32_t index), void *arg) {
  size_t kept = 0;
  for (size_t i = 0; i < t->count; i++) {
    if ((by_id ? t->items[i].id : t->items[i].executor) != value) t->items[kept++] = t->items[i];
    else if (gone) gone(arg, t->items[i].id, t->items[i].index);
  }
  t->count = kept;
}

void location_forget_id(location_table *t, uint64_t id) { forget_where(t, true, id, NULL, NULL); }
void location_forget_executor(location_table *t, uint64_t executor,
                              void (*gone)(void *arg, uint64_t id, uint32_t index), void *arg) {
  forget_where(t, false, executor, gone, arg);
}

void location_each(const location_table *t, uint64_t id,
                   void (*fn)(void *arg, uint32_t index, uint64_t executor), void *arg) {
  for (size_t i = 0; i < t->count; i++)
    if (t->items[i].id == id) fn(arg, t->items[i].index, t->items[i].executor);
}
