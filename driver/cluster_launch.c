/*
 * cluster_launch.c: launches. The scheduler thread puts each attempt in its executor's
 * batch (cluster_backend.c), and after each round of launches every batch goes as one
 * LaunchTasks call per (executor, application), carrying what the executor lacks to run it:
 * the plan nodes it has not seen (each executor's known set), the datasets it may release,
 * storage levels, where the map outputs of the shuffles the tasks read are and where their
 * cached inputs are, the application's small broadcasts it lacks, the actions and the
 * tasks, with the attempts offered to it by its node's executors.
 *
 * Threading: the scheduler thread only; an application's plan, locations and broadcasts are
 * read under app->lock.
 */
#include <stdio.h>
#include <string.h>

#include "driver/cluster_internal.h"

typedef struct walk {
  const rdd **seen;
  size_t count, cap;
} walk;

static bool walk_visit(walk *w, const rdd *r) {
  for (size_t i = 0; i < w->count; i++)
    if (w->seen[i] == r) return false;
  if (w->count == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 32;
    const rdd **grown = common_realloc(w->seen, cap * sizeof *grown);
    if (!grown) return false;
    w->seen = grown;
    w->cap = cap;
  }
  w->seen[w->count++] = r;
  return true;
}

/* Every dataset of the lineage (through shuffle dependencies too), each once. */
static void walk_lineage(walk *w, const rdd *r, bool cross_shuffles) {
  if (!r || !walk_visit(w, r)) return;
  for (uint32_t i = 0; i < r->num_parents; i++) walk_lineage(w, r->parents[i], cross_shuffles);
  if (cross_shuffles)
    for (uint32_t i = 0; i < r->num_shuffle_deps; i++) walk_lineage(w, r->shuffle_deps[i]->parent, true);
}

void cluster_list_push(sched_task ***list, size_t *len, size_t *cap, sched_task *t) {
  if (*len == *cap) {
    size_t grown_cap = *cap ? *cap * 2 : 16;
    sched_task **grown = common_realloc(*list, grown_cap * sizeof *grown);
    FL_ASSERT(grown); /* a few pointers; out of memory here has no way back */
    *list = grown;
    *cap = grown_cap;
  }
  (*list)[(*len)++] = t;
}

static bool known_has(executor_ref *e, uint64_t key) {
  for (size_t i = 0; i < e->num_known; i++)
    if (e->known[i] == key) return true;
  return false;
}

typedef struct known_ctx {
  executor_ref *e;
  uint64_t app;
} known_ctx;

/* Asked of every node the plan encoder visits: known ones are skipped; the others are sent
 * now, so they count as known from here on. */
static bool known_or_mark(void *arg, uint64_t id) {
  known_ctx *k = arg;
  uint64_t key = k->app << 40 | id;
  if (known_has(k->e, key)) return true;
  if (k->e->num_known == k->e->cap_known) {
    size_t cap = k->e->cap_known ? k->e->cap_known * 2 : 64;
    uint64_t *grown = common_realloc(k->e->known, cap * sizeof *grown);
    if (!grown) return false;
    k->e->known = grown;
    k->e->cap_known = cap;
  }
  k->e->known[k->e->num_known++] = key;
  return false;
}

/* Known keys of small broadcasts (app << 40 | KNOWN_BROADCAST | id), beside plan nodes'. */
#define KNOWN_BROADCAST (1ull << 39)

/* The application's small broadcasts that e lacks, marked known, and the ones e has that the
 * client destroyed, forgotten (app->lock held; scheduler thread). */
static fl_status launch_broadcasts(executor_ref *e, const driver_app *app, Flint__InlineBroadcast ***ship,
                                   size_t *num_ship, uint64_t **forget, size_t *num_forget) {
  const uint64_t prefix = app->id << 40 | KNOWN_BROADCAST;
  *ship = common_calloc(app->num_broadcasts + 1, sizeof **ship);
  *forget = NULL;
  size_t cap_forget = 0;
  if (!*ship) return FL_ERR(FL_ENOMEM, "out of memory");
  for (size_t i = 0; i < e->num_known;) {
    uint64_t key = e->known[i];
    bool live = (key & ~((KNOWN_BROADCAST - 1))) != prefix;
    for (size_t k = 0; k < app->num_broadcasts && !live; k++) live = (prefix | app->broadcasts[k].id) == key;
    if (live) {
      i++;
      continue;
    }
    if (*num_forget == cap_forget) {
      cap_forget = cap_forget ? 2 * cap_forget : 8;
      uint64_t *grown = common_realloc(*forget, cap_forget * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      *forget = grown;
    }
    (*forget)[(*num_forget)++] = key & (KNOWN_BROADCAST - 1);
    e->known[i] = e->known[--e->num_known];
  }
  known_ctx known = {e, app->id};
  for (size_t k = 0; k < app->num_broadcasts; k++) {
    if (known_or_mark(&known, KNOWN_BROADCAST | app->broadcasts[k].id)) continue;
    /* a copy: the client may remove it once app->lock is let go, before the call is packed */
    const fl_buf *v = &app->broadcasts[k].value;
    Flint__InlineBroadcast *b = common_malloc(sizeof *b + v->len);
    if (!b) return FL_ERR(FL_ENOMEM, "out of memory");
    flint__inline_broadcast__init(b);
    b->id = app->broadcasts[k].id;
    b->value = (ProtobufCBinaryData){v->len, (uint8_t *)(b + 1)};
    if (v->len) memcpy(b + 1, v->data, v->len);
    (*ship)[(*num_ship)++] = b;
  }
  return FL_OK;
}

typedef struct shuffle_loc_ctx {
  Flint__ShuffleLocations *sl;
  Flint__MapLocation *items;
  cluster_backend *cb;
} shuffle_loc_ctx;

static void add_map_location(void *arg, uint32_t map, uint64_t executor) {
  shuffle_loc_ctx *c = arg;
  executor_ref *e = cluster_find_executor(c->cb, executor);
  if (!e || c->sl->n_maps >= c->sl->num_maps) return;
  Flint__MapLocation *m = &c->items[c->sl->n_maps];
  flint__map_location__init(m);
  m->map = map;
  m->address = e->data_address;
  c->sl->maps[c->sl->n_maps++] = m;
}

typedef struct block_loc_ctx {
  Flint__BlockLocation ***items;
  size_t *count, *cap;
  cluster_backend *cb;
  uint64_t rdd_id;
} block_loc_ctx;

static void add_block_location(void *arg, uint32_t partition, uint64_t executor) {
  block_loc_ctx *c = arg;
  executor_ref *e = cluster_find_executor(c->cb, executor);
  if (!e) return;
  if (*c->count == *c->cap) {
    size_t cap = *c->cap ? *c->cap * 2 : 32;
    Flint__BlockLocation **grown = common_realloc(*c->items, cap * sizeof *grown);
    if (!grown) return; /* a hint only: the partition is computed instead */
    *c->items = grown;
    *c->cap = cap;
  }
  Flint__BlockLocation *b = common_calloc(1, sizeof *b);
  if (!b) return;
  flint__block_location__init(b);
  b->rdd_id = c->rdd_id;
  b->partition = partition;
  b->address = e->data_address;
  b->pid = e->pid;
  b->node = e->node;
  (*c->items)[(*c->count)++] = b;
}

/* Encodes one LaunchTasks call for the tasks of one application in e's batch. */
/* The datasets of app that e has plan nodes of but the driver's plan no longer holds: taken
 * off e's known set and returned (*out, *count; the caller frees it), for the launch to tell
 * e to release them. app->lock held; scheduler thread. */
static fl_status launch_released(executor_ref *e, driver_app *app, uint64_t **out, size_t *count) {
  *out = NULL;
  *count = 0;
  size_t cap = 0;
  for (size_t i = 0; i < e->num_known;) {
    uint64_t key = e->known[i], id = key & (KNOWN_BROADCAST - 1);
    if (key >> 40 != app->id || (key & KNOWN_BROADCAST) || rdd_plan_find(app->plan, id)) {
      i++;
      continue;
    }
    if (*count == cap) {
      cap = cap ? 2 * cap : 16;
      uint64_t *grown = common_realloc(*out, cap * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      *out = grown;
    }
    (*out)[(*count)++] = id;
    e->known[i] = e->known[--e->num_known];
  }
  return FL_OK;
}

/* tasks[0, n): e's own; tasks[n, n + offered): its node peers' tasks offered to it. */
static fl_status encode_launch(cluster_backend *cb, executor_ref *e, driver_app *app, sched_task **tasks,
                               size_t n, size_t offered, bool more_pending, fl_buf *out) {
  size_t own = n;
  n += offered;
  fl_status status = FL_OK;
  fl_buf plan = FL_BUF_INIT;
  walk lineage = {0}, stage_part = {0};
  known_ctx known = {e, app->id};
  Flint__TaskDescription *descs = common_calloc(n, sizeof *descs);
  Flint__TaskDescription **desc_ptrs = common_calloc(n, sizeof *desc_ptrs);
  ProtobufCBinaryData *actions = common_calloc(n, sizeof *actions); /* one per job in the batch */
  size_t num_actions = 0;
  Flint__Level *levels = NULL, **level_ptrs = NULL;
  Flint__ShuffleLocations *shuffles = NULL, **shuffle_ptrs = NULL;
  Flint__MapLocation **map_items = NULL;
  size_t num_levels = 0, num_shuffles = 0;
  Flint__BlockLocation **blocks = NULL;
  size_t num_blocks = 0, cap_blocks = 0;
  Flint__InlineBroadcast **ship = NULL;
  uint64_t *forget = NULL, *released = NULL;
  size_t num_ship = 0, num_forget = 0, num_released = 0;
  if (!descs || !desc_ptrs || !actions) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  status = launch_released(e, app, &released, &num_released);
  for (size_t i = 0; i < n && status == FL_OK; i++) {
    const rdd *r = sched_task_rdd(tasks[i]);
    const rdd_shuffle_dep *dep = sched_task_shuffle_dep(tasks[i]);
    /* A map task needs the node that holds its shuffle dependency: the reading dataset. */
    const rdd *owner = dep ? rdd_plan_shuffle_owner(app->plan, dep->shuffle_id) : r;
    if (!owner) {
      status = FL_ERR(FL_EINTERNAL, "no dataset reads shuffle %llu", (unsigned long long)dep->shuffle_id);
      break;
    }
    status = rdd_plan_encode_stored(app->plan, owner->id, known_or_mark, &known, &plan);
    walk_lineage(&lineage, r, true);
    walk_lineage(&stage_part, r, false);
  }
  if (status != FL_OK) {
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    goto cleanup;
  }
  /* Storage levels of the lineage's persisted datasets. */
  levels = common_calloc(lineage.count + 1, sizeof *levels);
  level_ptrs = common_calloc(lineage.count + 1, sizeof *level_ptrs);
  /* Map outputs of the shuffles that the stage reads. */
  shuffles = common_calloc(2 * stage_part.count + 1, sizeof *shuffles);
  shuffle_ptrs = common_calloc(2 * stage_part.count + 1, sizeof *shuffle_ptrs);
  map_items = common_calloc(2 * stage_part.count + 1, sizeof *map_items);
  if (!levels || !level_ptrs || !shuffles || !shuffle_ptrs || !map_items) {
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (size_t i = 0; i < lineage.count; i++) {
    fl_storage_level level = atomic_load(&lineage.seen[i]->level);
    if (level == FL_STORAGE_NONE) continue;
    flint__level__init(&levels[num_levels]);
    levels[num_levels].rdd_id = lineage.seen[i]->id;
    levels[num_levels].level = level;
    level_ptrs[num_levels] = &levels[num_levels];
    num_levels++;
  }
  for (size_t i = 0; i < stage_part.count && status == FL_OK; i++) {
    const rdd *r = stage_part.seen[i];
    for (uint32_t d = 0; d < r->num_shuffle_deps; d++) {
      const rdd_shuffle_dep *dep = r->shuffle_deps[d];
      Flint__ShuffleLocations *sl = &shuffles[num_shuffles];
      flint__shuffle_locations__init(sl);
      sl->shuffle_id = dep->shuffle_id;
      sl->num_maps = dep->parent->num_partitions;
      Flint__MapLocation *items = common_calloc(sl->num_maps + 1, sizeof *items);
      sl->maps = common_calloc(sl->num_maps + 1, sizeof *sl->maps);
      map_items[num_shuffles] = items;
      shuffle_ptrs[num_shuffles++] = sl;
      if (!items || !sl->maps) {
        status = FL_ERR(FL_ENOMEM, "out of memory");
        break;
      }
      shuffle_loc_ctx c = {sl, items, cb};
      locations_each(app->maps, dep->shuffle_id, add_map_location, &c);
    }
  }
  /* Where the stage's cached inputs are, so that a task placed away from its partition reads
   * it from the executor that has it rather than computing it again. */
  for (size_t i = 0; i < stage_part.count && status == FL_OK; i++) {
    const rdd *r = stage_part.seen[i];
    if (atomic_load(&r->level) == FL_STORAGE_NONE) continue;
    block_loc_ctx bc = {&blocks, &num_blocks, &cap_blocks, cb, r->id};
    locations_each(app->blocks, r->id, add_block_location, &bc);
  }
  if (status == FL_OK) status = launch_broadcasts(e, app, &ship, &num_ship, &forget, &num_forget);
  char broadcast_address[DP_ADDRESS_MAX];
  memcpy(broadcast_address, app->broadcast_address, sizeof broadcast_address);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status != FL_OK) goto cleanup;

  for (size_t i = 0; i < n; i++) {
    sched_task *t = tasks[i];
    Flint__TaskDescription *d = &descs[i];
    flint__task_description__init(d);
    d->task_key = cluster_att(t)->key;
    d->rdd_id = sched_task_rdd(t)->id;
    d->partition = t->rt.partition;
    d->attempt = t->rt.attempt;
    d->job_id = t->rt.job_id;
    d->barrier = t->rt.barrier.on;
    d->barrier_stage = t->rt.barrier.stage;
    d->barrier_attempt = t->rt.barrier.attempt;
    d->barrier_world = t->rt.barrier.world;
    if (i >= own) {
      d->offer = true;
      d->owner_pid = cluster_att(t)->placement->pid;
      d->owner_executor = cluster_att(t)->placement->id;
    }
    if (sched_task_shuffle_dep(t)) {
      d->shuffle_id = sched_task_shuffle_dep(t)->shuffle_id;
    } else {
      const driver_action *a = (const driver_action *)sched_task_action(t);
      size_t k = 0;
      while (k < num_actions && actions[k].data != a->encoded.data) k++;
      if (k == num_actions) actions[num_actions++] = (ProtobufCBinaryData){a->encoded.len, (uint8_t *)a->encoded.data};
      d->action_index = (uint32_t)k + 1;
    }
    desc_ptrs[i] = d;
  }
  Flint__LaunchTasksRequest req = FLINT__LAUNCH_TASKS_REQUEST__INIT;
  req.app_id = app->id;
  req.incarnation = cb->cfg.incarnation;
  req.plan.data = plan.data;
  req.plan.len = plan.len;
  req.n_levels = num_levels;
  req.levels = level_ptrs;
  req.n_shuffles = num_shuffles;
  req.shuffles = shuffle_ptrs;
  req.n_blocks = num_blocks;
  req.blocks = blocks;
  req.n_tasks = n;
  req.tasks = desc_ptrs;
  req.broadcast_address = broadcast_address;
  req.n_broadcasts = num_ship;
  req.broadcasts = ship;
  req.n_forget_broadcasts = num_forget;
  req.forget_broadcasts = forget;
  req.n_actions = num_actions;
  req.actions = actions;
  req.none_pending = !more_pending;
  req.n_released = num_released;
  req.released = released;
  status = proto_pack(&req.base, out);
cleanup:
  if (status != FL_OK) /* the executor may not get these nodes: forget they were sent */
    for (size_t i = 0; i < e->num_known;) {
      if (e->known[i] >> 40 == app->id) e->known[i] = e->known[--e->num_known];
      else i++;
    }
  for (size_t i = 0; i < num_shuffles; i++) {
    common_free(shuffles[i].maps);
    common_free(map_items[i]);
  }
  for (size_t i = 0; i < num_blocks; i++) common_free(blocks[i]);
  common_free(blocks);
  common_free(released);
  for (size_t i = 0; i < num_ship; i++) common_free(ship[i]);
  common_free(ship);
  common_free(forget);
  common_free(map_items);
  common_free(shuffles);
  common_free(shuffle_ptrs);
  common_free(levels);
  common_free(level_ptrs);
  common_free(descs);
  common_free(desc_ptrs);
  common_free(actions);
  common_free(lineage.seen);
  common_free(stage_part.seen);
  fl_buf_free(&plan);
  return status;
}

void cluster_flush(backend *b, bool more_pending) {
  cluster_backend *cb = cluster_of(b);
  for (executor_ref *e = cb->executors; e; e = e->next) {
    while (e->batch_len || e->num_offers) {
      /* The tasks of the first task's application go in one call, with the offers of it. */
      driver_app *app = cluster_app_of(e->batch_len ? e->batch[0] : e->offers[0]);
      size_t n = 0, offered = 0;
      for (size_t i = 0; i < e->batch_len; i++)
        if (cluster_app_of(e->batch[i]) == app) n++;
      for (size_t i = 0; i < e->num_offers; i++)
        if (cluster_app_of(e->offers[i]) == app) offered++;
      outgoing *o = common_calloc(1, sizeof *o);
      sched_task **tasks = common_calloc(n + offered, sizeof *tasks);
      uint64_t *keys = common_calloc(n + 1, sizeof *keys); /* the own tasks': an offer's launch
                                                              failing leaves it to its owner */
      size_t k = 0, kept = 0;
      for (size_t i = 0; i < e->batch_len; i++) {
        if (cluster_app_of(e->batch[i]) == app) {
          if (tasks && keys) {
            tasks[k] = e->batch[i];
            keys[k++] = cluster_att(e->batch[i])->key;
          }
        } else {
          e->batch[kept++] = e->batch[i];
        }
      }
      e->batch_len = kept;
      kept = 0;
      for (size_t i = 0; i < e->num_offers; i++) {
        if (cluster_app_of(e->offers[i]) == app) {
          if (tasks) tasks[k++] = e->offers[i];
        } else {
          e->offers[kept++] = e->offers[i];
        }
      }
      e->num_offers = kept;
      fl_status st = o && tasks && keys ? encode_launch(cb, e, app, tasks, n, offered, more_pending, &o->body)
                                        : FL_ERR(FL_ENOMEM, "out of memory");
      common_free(tasks);
      if (st != FL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot launch on executor %llu: %s", (unsigned long long)e->id,
                 fl_last_error());
        for (size_t i = 0; keys && i < n; i++) cluster_fail_attempt(cb, keys[i], st, msg, false);
        if (o) fl_buf_free(&o->body);
        common_free(o);
        common_free(keys);
        continue;
      }
      o->method = "/flint.Executor/LaunchTasks";
      o->keys = keys;
      o->num_keys = n;
      if (common_trace_on()) {
        char detail[64];
        snprintf(detail, sizeof detail, "executor-%llu,%zu-tasks", (unsigned long long)e->id, n);
        common_trace("launch.queued", detail);
      }
      if (!cluster_sender_push(cb, e, o)) { /* lost since it was placed there: run them elsewhere */
        char msg[256];
        snprintf(msg, sizeof msg, "executor %llu at %s was lost before its launch", (unsigned long long)e->id,
                 e->rpc_address);
        for (size_t i = 0; i < n; i++) cluster_fail_attempt(cb, keys[i], FL_ENET, msg, true);
        cluster_outgoing_free(o); /* and keys */
      }
    }
  }
}
