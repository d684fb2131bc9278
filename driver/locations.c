/*
 * locations.c: which executor holds each map output and cached block of an application, the
 * one place where the driver records and forgets them. A table is a flat array of (id,
 * index, executor) entries: the driver holds at most a few thousand per application, and
 * lookups happen once per task, so a scan costs less than it would to keep a hash table.
 *
 * What is where is inferred from task ends: a map task's output is where it ran, and the
 * first executor to compute a partition of a persisted dataset caches it (a later task
 * elsewhere reads it from there rather than caching a copy). An executor's loss forgets
 * everything it held.
 *
 * Threading: tables are not thread-safe; the owner (driver_app) locks app->lock.
 */
#include "driver/driver_internal.h"
#include "shuffle/shuffle.h"

typedef struct location {
  uint64_t id, executor;
  uint32_t index;
} location;

struct location_table {
  location *items;
  size_t count, cap;
};

fl_status locations_create(location_table **out) {
  if (!(*out = common_calloc(1, sizeof **out))) return FL_ERR(FL_ENOMEM, "out of memory");
  return FL_OK;
}

void locations_destroy(location_table *t) {
  if (!t) return;
  common_free(t->items);
  common_free(t);
}

fl_status locations_set(location_table *t, uint64_t id, uint32_t index, uint64_t executor) {
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

uint64_t locations_get(const location_table *t, uint64_t id, uint32_t index) {
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

void locations_forget_id(location_table *t, uint64_t id) { forget_where(t, true, id, NULL, NULL); }

void locations_each(const location_table *t, uint64_t id,
                    void (*fn)(void *arg, uint32_t index, uint64_t executor), void *arg) {
  for (size_t i = 0; i < t->count; i++)
    if (t->items[i].id == id) fn(arg, t->items[i].index, t->items[i].executor);
}

/* ---- an application's locations ------------------------------------------------------------ */

/* The persisted dataset whose partition p a task of r reads first: r or one below it through
 * one-to-one narrow parents. 0 when there is none. */
static uint64_t cached_input(const rdd *r) {
  while (r) {
    if (atomic_load(&r->level) != FL_STORAGE_NONE) return r->id;
    if (r->num_parents != 1 || r->num_shuffle_deps || r->parents[0]->num_partitions != r->num_partitions) return 0;
    r = r->parents[0];
  }
  return 0;
}

uint64_t locations_input(driver_app *app, const rdd *r, uint32_t partition) {
  uint64_t cached = cached_input(r);
  if (!cached) return 0;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  uint64_t where = locations_get(app->blocks, cached, partition);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return where;
}

uint64_t locations_map_output(driver_app *app, uint64_t shuffle_id, uint32_t map) {
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  uint64_t where = locations_get(app->maps, shuffle_id, map);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return where;
}

void locations_task_succeeded(driver_app *app, const rdd_shuffle_dep *dep, const rdd *r, uint32_t p,
                              uint64_t executor) {
  if (dep) locations_set(app->maps, dep->shuffle_id, p, executor);
  /* The executor now caches the partition of every persisted dataset on the way. */
  for (const rdd *c = r; c; c = c->num_parents == 1 && !c->num_shuffle_deps ? c->parents[0] : NULL) {
    /* The first executor to compute a partition caches it; a later task elsewhere read it
     * from there rather than caching a copy (the executors' remote reads). */
    if (atomic_load(&c->level) != FL_STORAGE_NONE && !locations_get(app->blocks, c->id, p))
      locations_set(app->blocks, c->id, p, executor);
    if (c->num_parents == 1 && c->parents[0]->num_partitions != c->num_partitions) break;
  }
}

static void unregister_output(void *table, uint64_t shuffle_id, uint32_t map) {
  map_output_unregister(table, shuffle_id, map);
}

void locations_forget_executor(driver_app *app, uint64_t executor) {
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  forget_where(app->maps, false, executor, unregister_output, app->ctx.map_outputs);
  forget_where(app->blocks, false, executor, NULL, NULL);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
}
