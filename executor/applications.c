/*
 * applications.c: an executor's applications (struct exec_app). Each has its own context
 * (fl_context), made on its first launch: the datasets decoded from the plan parts the driver
 * sends, a shared-variable registry that fetches broadcasts from the client that made them,
 * a cache view onto the executor's one block manager (the application's dataset and shuffle
 * ids prefixed by its id: applications never see each other's blocks) that reads other
 * executors' blocks and map outputs where the driver says they are (each launch says what
 * changed: exec_app_launch_update), and the barrier calls of its tasks. The libraries that its functions come from are the executor's: content-addressed,
 * fetched from the driver once, stored in the work dir and dlopen()ed once. An application
 * goes with the last hold on it (its queued and running tasks, a handler using it) once the
 * driver has removed it.
 *
 * Threading: svc->lock guards the list of applications, their holds and the libraries; an
 * application's lock its plan, broadcast address and location tables. The cache view runs on
 * task threads (and the handlers); its fetches go through the fetch client's event loop, and
 * no lock is held over a fetch.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "executor/internal.h"
#include "shuffle/shuffle.h"

/* ---- the application's view of the block manager --------------------------------------- */

static uint64_t app_key(const exec_app *a, uint64_t id) { return (a->id << APP_SHIFT) | id; }

/* What a reader of the application's cache holds: a block of this executor, or a copy of one
 * fetched from the executor that caches it. */
typedef struct app_handle {
  void *local;
  rdd_batch remote;
} app_handle;

static bool self_address(exec_service *svc, const char *address) {
  char self[64];
  snprintf(self, sizeof self, "%s:%d", svc->cfg.host, dp_server_port(svc->blocks_server));
  return strcmp(self, address) == 0;
}

/* ---- where peers keep blocks (the launches' location tables; a->lock held) ------------- */

static peer_location *location_find(const location_table *t, uint64_t id, uint32_t index) {
  for (size_t i = 0; i < t->n; i++)
    if (t->items[i].id == id && t->items[i].index == index) return &t->items[i];
  return NULL;
}

static fl_status location_put(location_table *t, uint64_t id, uint32_t index, const char *address, uint32_t pid) {
  peer_location *l = location_find(t, id, index);
  if (!l) {
    peer_location *grown = common_grow(t->items, sizeof *grown, t->n, &t->cap, 64);
    if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
    t->items = grown;
    l = &t->items[t->n++];
    l->id = id;
    l->index = index;
  }
  snprintf(l->address, sizeof l->address, "%s", address);
  l->pid = pid;
  return FL_OK;
}

/* Drops every location of ids[0, n). */
static void location_forget(location_table *t, const uint64_t *ids, size_t n) {
  for (size_t k = 0; k < t->n;) {
    bool gone = false;
    for (size_t i = 0; i < n && !gone; i++) gone = t->items[k].id == ids[i];
    if (gone) t->items[k] = t->items[--t->n];
    else k++;
  }
}

/* Where another executor holds a cached partition; false when none does. */
static bool find_peer_location(exec_app *a, rdd_block_key key, peer_location *out) {
  FL_PCHECK(pthread_mutex_lock(&a->lock));
  const peer_location *l = location_find(&a->blocks, key.rdd_id, key.partition);
  if (l) *out = *l;
  FL_PCHECK(pthread_mutex_unlock(&a->lock));
  return l && !self_address(a->svc, out->address);
}

/* A cached partition held by an executor on this node, mapped in place (a node-local read,
 * with no copy); false when it cannot be, and the data plane then fetches it. */
static bool map_peer_block(exec_app *a, const peer_location *loc, rdd_block_key key, const rdd_batch **batch,
                           void **handle) {
  if (!loc->pid) return false;
  rdd_block_key app_local = {app_key(a, key.rdd_id), key.partition};
  fl_status st = block_manager_get_peer(a->svc->blocks, app_local, loc->pid, batch, handle);
  if (st != FL_OK && st != FL_ENOENT)
    common_log(LOG_WARN, "dataset %llu partition %u of executor process %u: %s", (unsigned long long)key.rdd_id,
               key.partition, loc->pid, fl_last_error());
  return st == FL_OK;
}

/* A cached partition held by another executor, fetched and decoded; false when it cannot be. */
static bool fetch_remote_block(exec_app *a, const peer_location *loc, rdd_block_key key, rdd_batch *out) {
  const char *peer = loc->address;
  dp_request req = {.kind = DP_BLOCK, .key = {a->id, key.rdd_id, key.partition, 0}};
  fl_buf bytes = FL_BUF_INIT;
  fl_status st = dp_fetch(a->svc->fetcher, peer, &req, a->svc->fetch_timeout_ms, &bytes, NULL);
  if (st == FL_OK) st = rdd_batch_decode(fl_buf_bytes(&bytes), "a remote cached block", out);
  rdd_task *task = rdd_task_current();
  if (st == FL_OK && task) task->input_bytes += bytes.len; /* the encoded block, as fetched */
  fl_buf_free(&bytes);
  /* Not fatal: the partition is computed from its lineage instead. */
  if (st != FL_OK)
    common_log(LOG_DEBUG, "dataset %llu partition %u from %s: %s", (unsigned long long)key.rdd_id,
               key.partition, peer, fl_last_error());
  return st == FL_OK;
}

static bool app_get(void *impl, rdd_block_key key, const rdd_batch **batch, void **handle) {
  exec_app *a = impl;
  app_handle *h = common_calloc(1, sizeof *h);
  if (!h) return false;
  rdd_block_key local = {app_key(a, key.rdd_id), key.partition};
  if (block_manager_cache_ops.get(a->svc->blocks, local, batch, &h->local)) {
    *handle = h;
    return true;
  }
  peer_location loc;
  if (!find_peer_location(a, key, &loc)) {
    common_free(h);
    return false;
  }
  rdd_task *task = rdd_task_current();
  if (map_peer_block(a, &loc, key, batch, &h->local)) {
    if (task) task->blocks_mapped++;
    *handle = h;
    return true;
  }
  if (fetch_remote_block(a, &loc, key, &h->remote)) {
    if (task) task->blocks_fetched++;
    *batch = &h->remote;
    *handle = h;
    return true;
  }
  common_free(h);
  return false;
}

static fl_status app_put(void *impl, rdd_block_key key, fl_storage_level level, rdd_batch *batch,
                         const rdd_batch **stored, void **handle) {
  exec_app *a = impl;
  app_handle *h = common_calloc(1, sizeof *h);
  if (!h) return FL_ERR(FL_ENOMEM, "out of memory");
  key.rdd_id = app_key(a, key.rdd_id);
  fl_status st = block_manager_cache_ops.put(a->svc->blocks, key, level, batch, stored, &h->local);
  if (st != FL_OK) {
    common_free(h);
    return st;
  }
  *handle = h;
  return FL_OK;
}

static void app_release(void *impl, void *handle) {
  app_handle *h = handle;
  if (h->local) block_manager_cache_ops.release(((exec_app *)impl)->svc->blocks, h->local);
  rdd_batch_free(&h->remote);
  common_free(h);
}

void exec_app_remove_rdd(void *impl, uint64_t rdd_id) {
  exec_app *a = impl;
  block_manager_cache_ops.remove_rdd(a->svc->blocks, app_key(a, rdd_id));
}

void exec_app_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
  exec_app *a = impl;
  block_manager_cache_ops.info(a->svc->blocks, app_key(a, rdd_id), out);
}

static void app_shuffle_path(void *impl, uint64_t shuffle_id, uint32_t map, char *path, size_t len) {
  exec_app *a = impl;
  block_manager_cache_ops.shuffle_path(a->svc->blocks, app_key(a, shuffle_id), map, path, len);
}

/* The peer holding a map task's output, or NULL when it is this executor (or unknown). */
static bool map_peer(exec_app *a, uint64_t shuffle_id, uint32_t map, char *peer, size_t len) {
  bool found = false;
  FL_PCHECK(pthread_mutex_lock(&a->lock));
  const peer_location *l = location_find(&a->maps, shuffle_id, map);
  if (l) {
    snprintf(peer, len, "%s", l->address);
    found = true;
  }
  FL_PCHECK(pthread_mutex_unlock(&a->lock));
  return found;
}

static fl_status app_shuffle_fetch(void *impl, uint64_t shuffle_id, uint32_t map, uint32_t reduce,
                                   uint64_t offset, uint64_t len, fl_buf *out, uint64_t *block_len) {
  exec_app *a = impl;
  exec_service *svc = a->svc;
  char peer[64];
  if (!map_peer(a, shuffle_id, map, peer, sizeof peer) || self_address(svc, peer))
    return block_manager_cache_ops.shuffle_fetch(svc->blocks, app_key(a, shuffle_id), map, reduce,
                                                 offset, len, out, block_len);
  dp_request req = {.kind = DP_SHUFFLE, .key = {a->id, shuffle_id, map, reduce}, .offset = offset,
                    .len = len};
  out->len = 0;
  if (len == 0) { /* only the block's length is wanted: ask for one byte */
    req.len = 1;
    fl_buf scratch = FL_BUF_INIT;
    fl_status st = dp_fetch(svc->fetcher, peer, &req, svc->fetch_timeout_ms, &scratch, block_len);
    fl_buf_free(&scratch);
    if (st != FL_OK) goto failed;
    return FL_OK;
  }
  fl_status st = dp_fetch(svc->fetcher, peer, &req, svc->fetch_timeout_ms, out, block_len);
  if (st == FL_OK) return FL_OK;
failed:
  return common_error_wrap(FL_EFETCH, "fetch failed: shuffle %llu, map %u, reduce %u from %s: ",
                           (unsigned long long)shuffle_id, map, reduce, peer);
}

void exec_app_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {
  exec_app *a = impl;
  block_manager_cache_ops.shuffle_remove(a->svc->blocks, app_key(a, shuffle_id), num_maps);
}

static const rdd_cache_ops app_cache_ops = {app_get,          app_put,          app_release,
                                            exec_app_remove_rdd,   exec_app_info,         app_shuffle_path,
                                            app_shuffle_fetch, exec_app_shuffle_remove};

static fl_status app_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t n,
                             const rdd_action *action, fl_buf *results) {
  return FL_ERR(FL_ESTATE, "a task cannot run a job (dataset %llu)", (unsigned long long)r->id);
}

static const rdd_runtime_ops app_runtime = {.run_job = app_run_job};

/* ---- fetching whole objects: libraries from the driver, broadcasts from clients ------- */

/* Fetches a whole object from the block server at `peer`: a first small request learns its
 * length, then the buffer is made once (in huge pages when large) and the rest comes in
 * FETCH_CHUNK requests, each a single stream from the server's memory into the buffer. */
static fl_status fetch_whole(exec_service *svc, const char *peer, uint8_t kind,
                             const uint64_t key[4], fl_buf *out) {
  dp_request req = {.kind = kind, .key = {key[0], key[1], key[2], key[3]}, .len = FETCH_FIRST};
  uint64_t total = 0;
  out->len = 0;
  fl_status st = dp_fetch(svc->fetcher, peer, &req, svc->fetch_timeout_ms, out, &total);
  if (st != FL_OK) return st;
  if (total > out->len) {
    if (total >= FETCH_MAX)
      return FL_ERR(FL_ELIMIT, "%s offers an object of %llu bytes", peer, (unsigned long long)total);
    if ((st = fl_buf_reserve(out, total - out->len)) != FL_OK) return st;
    if (total >= (8u << 20)) common_advise_huge(out->data + out->len, total - out->len);
  }
  while (out->len < total) {
    size_t before = out->len;
    req.offset = out->len;
    req.len = FETCH_CHUNK;
    if ((st = dp_fetch(svc->fetcher, peer, &req, svc->fetch_timeout_ms, out, NULL)) != FL_OK) return st;
    if (out->len == before)
      return FL_ERR(FL_EPROTO, "%s sent no bytes at offset %zu of %llu", peer, before,
                    (unsigned long long)total);
  }
  return FL_OK;
}

/* A broadcast comes from the block server of the client that made it. */
static fl_status fetch_broadcast(void *arg, uint64_t id, fl_buf *out) {
  exec_app *a = arg;
  uint64_t key[4] = {a->id, id, 0, 0};
  char peer[DP_ADDRESS_MAX];
  FL_PCHECK(pthread_mutex_lock(&a->lock));
  memcpy(peer, a->broadcast_address, sizeof peer);
  FL_PCHECK(pthread_mutex_unlock(&a->lock));
  if (!peer[0])
    return FL_ERR(FL_ENOENT, "application %llu has not said where its broadcasts are",
                  (unsigned long long)a->id);
  fl_status st = fetch_whole(a->svc, peer, DP_BROADCAST, key, out);
  if (st != FL_OK)
    return common_error_wrap(st, "cannot fetch it from the client's block server at %s: ", peer);
  return FL_OK;
}

/* Library ids are 32 hex digits: two uint64 keys for the block server. */
static bool library_key(const char *id, uint64_t key[4]) {
  if (strlen(id) != 32) return false;
  for (int i = 0; i < 32; i++)
    if (!strchr("0123456789abcdef", id[i])) return false;
  char half[17];
  memcpy(half, id, 16);
  half[16] = 0;
  key[0] = strtoull(half, NULL, 16);
  memcpy(half, id + 16, 16);
  key[1] = strtoull(half, NULL, 16);
  key[2] = key[3] = 0;
  return true;
}

/* Set on the rpc queue's thread while the quick handler decodes a launch: a library that is
 * not loaded yet would need a fetch, so the launch goes to a handler thread instead. */
static __thread bool on_quick_path, quick_would_block;

void exec_app_quick_begin(void) {
  on_quick_path = true;
  quick_would_block = false;
}

bool exec_app_quick_end(void) {
  on_quick_path = false;
  return quick_would_block;
}

static void *library_find(exec_service *svc, const char *id) {
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  void *h = NULL;
  for (exec_library *l = svc->libraries; l && !h; l = l->next)
    if (strcmp(l->id, id) == 0) h = l->handle;
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  return h;
}

/* The loaded library `id`, fetched and dlopen()ed on first use, without svc->lock held over
 * the fetch (which may take seconds; task ends and status reports need the lock). */
/* How long a library fetch waits for the registration reply that says where the driver's
 * block server is (the launch that needs it may overtake the reply). */
#define REGISTRATION_WAIT_MS 10000

static fl_status library_load(exec_service *svc, const char *id, void **handle) {
  if ((*handle = library_find(svc, id))) return FL_OK;
  if (on_quick_path) {
    quick_would_block = true;
    return FL_ERR(FL_ESTATE, "library %s is not loaded yet", id);
  }
  uint64_t key[4];
  if (!library_key(id, key)) return FL_ERR(FL_EPROTO, "malformed library id '%.40s'", id);
  fl_buf content = FL_BUF_INIT;
  for (int i = 0; i < REGISTRATION_WAIT_MS / 5 && !atomic_load(&svc->driver_known); i++) usleep(5000);
  if (!atomic_load(&svc->driver_known))
    return FL_ERR(FL_ESTATE, "library %s: the driver's registration reply did not come within %d s", id,
                  REGISTRATION_WAIT_MS / 1000);
  fl_status st = fetch_whole(svc, svc->driver_data, DP_LIBRARY, key, &content);
  if (st != FL_OK) {
    fl_buf_free(&content);
    return common_error_wrap(st, "library %s: ", id);
  }
  /* Two threads may load one library at once: each writes its own temporary file, and the
   * rename makes the same content appear at the same path. */
  char path[PATH_MAX + 64], tmp[PATH_MAX + 96];
  snprintf(path, sizeof path, "%s/lib/%s.so", svc->work_dir, id);
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)gettid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
  st = fd >= 0 ? common_write_all(fd, content.data, content.len, tmp)
               : FL_ERR(FL_EIO, "cannot create %s: %s", tmp, strerror(errno));
  if (fd >= 0) close(fd);
  fl_buf_free(&content);
  if (st == FL_OK && rename(tmp, path) != 0)
    st = FL_ERR(FL_EIO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
  if (st != FL_OK) {
    unlink(tmp);
    return common_error_wrap(st, "cannot store library %s: ", id);
  }
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* never closed: decoded datasets point into it */
  if (!h) return FL_ERR(FL_ENOENT, "cannot load library %s: %s", id, dlerror());
  exec_library *l = common_calloc(1, sizeof *l);
  if (!l) return FL_ERR(FL_ENOMEM, "out of memory");
  snprintf(l->id, sizeof l->id, "%s", id);
  l->handle = h; /* dlopen of one path gives one handle, whichever thread got here first */
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  bool known = false;
  for (exec_library *k = svc->libraries; k && !known; k = k->next) known = strcmp(k->id, id) == 0;
  if (!known) {
    l->next = svc->libraries;
    svc->libraries = l;
  }
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  if (known) common_free(l);
  *handle = h;
  return FL_OK;
}

static fl_status resolve_fn(void *arg, const char *id, const char *symbol, void (**fn)(void)) {
  exec_service *svc = arg;
  void *handle;
  fl_status st = library_load(svc, id, &handle);
  if (st != FL_OK) return st;
  void *p = dlsym(handle, symbol);
  if (!p) return FL_ERR(FL_ENOENT, "function '%s' is not in library %s", symbol, id);
  *fn = (void (*)(void))p;
  return FL_OK;
}

/* ---- applications ---------------------------------------------------------------------- */

void exec_app_destroy(exec_app *a) {
  if (!a) return;
  rdd_plan_destroy(a->plan);
  rdd_shared_destroy(a->ctx.shared);
  map_output_table_destroy(a->ctx.map_outputs);
  common_free(a->maps.items);
  common_free(a->blocks.items);
  if (a->work_dir[0]) common_remove_tree(a->work_dir);
  pthread_mutex_destroy(&a->lock);
  common_free(a);
}

/* The application's context, made on its first launch. Caller holds svc->lock. */
fl_status exec_app_get_or_create(exec_service *svc, uint64_t app_id, exec_app **out) {
  for (exec_app *a = svc->apps; a; a = a->next)
    if (a->id == app_id) {
      *out = a;
      return FL_OK;
    }
  if (app_id == 0 || app_id >= (1ull << (64 - APP_SHIFT)))
    return FL_ERR(FL_EPROTO, "application id %llu out of range", (unsigned long long)app_id);
  exec_app *a = common_calloc(1, sizeof *a);
  if (!a) return FL_ERR(FL_ENOMEM, "out of memory");
  FL_PCHECK(pthread_mutex_init(&a->lock, NULL));
  a->svc = svc;
  a->id = app_id;
  a->incarnation = atomic_load(&svc->incarnation);
  fl_status status = FL_OK;
  snprintf(a->work_dir, sizeof a->work_dir, "%s/app-%llu", svc->work_dir, (unsigned long long)app_id);
  FL_CHECK(common_mkdirs(a->work_dir));
  FL_CHECK(rdd_shared_create(&a->ctx.shared));
  rdd_shared_set_remote(a->ctx.shared, fetch_broadcast, a);
  FL_CHECK(map_output_table_create(&a->ctx.map_outputs));
  a->ctx.runtime = &app_runtime;
  a->ctx.barrier = &exec_barrier_ops;
  a->ctx.barrier_impl = svc;
  a->ctx.runtime_impl = a;
  a->ctx.cache = &app_cache_ops;
  a->ctx.cache_impl = a;
  a->ctx.cores = svc->cfg.cores;
  a->ctx.default_parallelism = svc->cfg.cores;
  a->ctx.shuffle_memory = svc->cfg.shuffle_memory;
  a->ctx.work_dir = a->work_dir;
  atomic_init(&a->ctx.next_rdd_id, 1);
  rdd_fn_codec codec = {.resolve = resolve_fn, .arg = svc};
  FL_CHECK(rdd_plan_create(&a->ctx, &codec, &a->plan));
  a->next = svc->apps;
  svc->apps = a;
  *out = a;
  return FL_OK;
cleanup:
  exec_app_destroy(a);
  return status;
}

/* Drops one hold on `a` (a queued or running task, or a handler using it): the application
 * goes with the last once the driver has removed it. svc->lock held; returns the application
 * to destroy (exec_app_remove_all), unlinked, or NULL. */
exec_app *exec_app_release_locked(exec_service *svc, exec_app *a) {
  if (atomic_fetch_sub(&a->tasks_running, 1) != 1 || !a->removed) return NULL;
  for (exec_app **p = &svc->apps; *p; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      return a;
    }
  return NULL;
}

void exec_app_remove_all(exec_service *svc, exec_app *a) {
  block_manager_remove_range(svc->blocks, a->id << APP_SHIFT, (a->id + 1) << APP_SHIFT);
  exec_app_destroy(a);
}

/* Forgets where the blocks of datasets rdd_ids[0, n) and the outputs of shuffles
 * shuffle_ids[0, m) are: they are gone (app->lock held). Without this a long-lived
 * application's tables would grow with every job. */
void exec_app_forget_locations(exec_app *app, const uint64_t *rdd_ids, size_t n, const uint64_t *shuffle_ids,
                               size_t m) {
  location_forget(&app->blocks, rdd_ids, n);
  location_forget(&app->maps, shuffle_ids, m);
}

/* Takes in what a launch says of application `app`: plan parts, datasets the driver dropped,
 * broadcasts (where they are, those to forget, those sent inline), storage levels, and where
 * map outputs and cached blocks are. app->lock held. */
fl_status exec_app_launch_update(exec_app *app, const Flint__LaunchTasksRequest *req) {
  exec_service *svc = app->svc;
  fl_status status = FL_OK;
  if (req->plan.len) status = rdd_plan_add(app->plan, (fl_bytes){req->plan.data, req->plan.len});
  /* Datasets the driver dropped: their nodes go (the tasks that hold one keep it alive). */
  for (size_t i = 0; status == FL_OK && i < req->n_released; i++) rdd_plan_release(app->plan, req->released[i]);
  if (status == FL_OK) exec_app_forget_locations(app, req->released, req->n_released, NULL, 0);
  if (req->broadcast_address[0]) {
    if (strlen(req->broadcast_address) >= sizeof app->broadcast_address)
      status = FL_ERR(FL_EPROTO, "LaunchTasks: broadcast address too long");
    else
      snprintf(app->broadcast_address, sizeof app->broadcast_address, "%s", req->broadcast_address);
  }
  for (size_t i = 0; i < req->n_forget_broadcasts; i++) rdd_shared_forget(app->ctx.shared, req->forget_broadcasts[i]);
  for (size_t i = 0; status == FL_OK && i < req->n_broadcasts; i++) {
    const Flint__InlineBroadcast *b = req->broadcasts[i];
    if (b->id == 0 || b->id > UINT32_MAX)
      status = FL_ERR(FL_EPROTO, "LaunchTasks: broadcast id %llu out of range", (unsigned long long)b->id);
    else
      status = rdd_shared_put_broadcast(app->ctx.shared, b->id, (fl_bytes){b->value.data, b->value.len});
  }
  for (size_t i = 0; status == FL_OK && i < req->n_levels; i++) {
    rdd *r = rdd_plan_find(app->plan, req->levels[i]->rdd_id);
    if (r && req->levels[i]->level <= FL_DISK_ONLY) atomic_store(&r->level, req->levels[i]->level);
  }
  for (size_t i = 0; status == FL_OK && i < req->n_shuffles; i++) {
    const Flint__ShuffleLocations *sl = req->shuffles[i];
    for (size_t j = 0; status == FL_OK && j < sl->n_maps; j++)
      status = location_put(&app->maps, sl->shuffle_id, sl->maps[j]->map, sl->maps[j]->address, 0);
  }
  for (size_t i = 0; status == FL_OK && i < req->n_blocks; i++) {
    const Flint__BlockLocation *bl = req->blocks[i];
    bool same_node = svc->node[0] && strcmp(bl->node, svc->node) == 0 && bl->pid != svc->pid;
    status = location_put(&app->blocks, bl->rdd_id, bl->partition, bl->address, same_node ? bl->pid : 0);
  }
  return status;
}
