/*
 * service.c: an executor process (`flint executor`). It registers with the driver, runs the
 * tasks the driver launches on a pool of task threads, keeps cached blocks and shuffle output
 * in one block manager, serves them to peers from a block server, and reports task ends in
 * batches.
 *
 * Design. Each application has its own context here (struct exec_app): the datasets decoded
 * from the plan parts the driver sends (rdd/plan.c), a shared-variable registry that fetches
 * broadcasts on first use from the client that made them (its address comes with launches), and a cache view onto the executor's one block
 * manager in which the application's dataset and shuffle ids are prefixed by its id, so that
 * applications never see each other's blocks. Libraries are content-addressed and kept for the
 * executor's life: fetched from the driver once, stored in the work dir, dlopen()ed once.
 *
 * Threads: gRPC's (the control-plane server and its handlers, which decode launches), the
 * block server's and the fetch client's event loops, the task threads, one thread sending
 * status updates (every ended task waiting at that moment goes in one call) and one sending
 * heartbeats. Task threads never touch sockets: fetches are handed to the fetch client's loop.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "executor/executor.h"
#include "net/net.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"
#include "shuffle/shuffle.h"

#define RPC_TIMEOUT_MS 30000
/* Whole objects (libraries, broadcasts) come in a small first request that tells their
 * length, then in large ranges. */
#define FETCH_FIRST (1u << 20)
#define FETCH_CHUNK (64u << 20)
#define FETCH_MAX (8ull << 30)
/* Applications' ids are put above the ids of their datasets and shuffles in the shared block
 * manager: 2^40 datasets per application, 2^24 applications per executor life. */
#define APP_SHIFT 40
/* Task results above this size stay here as blocks for the driver to fetch; smaller ones
 * travel inline in the status update. */
#define INLINE_RESULT_MAX (1u << 20)

typedef struct exec_service exec_service;

/* A library this executor has loaded. */
typedef struct exec_library {
  char id[64];
  void *handle;
  struct exec_library *next;
} exec_library;

/* Where one map task's output of a shuffle lives. */
typedef struct map_location {
  uint64_t shuffle_id;
  uint32_t map;
  char address[64];
} map_location;

/* Where a cached partition of another executor is. */
typedef struct block_location {
  uint64_t rdd_id;
  uint32_t partition;
  char address[64];
  uint32_t pid;  /* the holder's process, when it is on this node; else 0 */
} block_location;

/* A large task result waiting for the driver to fetch it. */
typedef struct result_block {
  uint64_t task_key;
  fl_buf bytes;
  struct result_block *next;
} result_block;

typedef struct exec_app {
  fl_context ctx; /* first: the datasets' ctx is this struct */
  exec_service *svc;
  uint64_t id;
  rdd_plan *plan;
  pthread_mutex_t lock; /* plan, locations */
  map_location *maps;
  size_t num_maps, cap_maps;
  char broadcast_address[DP_ADDRESS_MAX]; /* the client's block server; "" until known */
  block_location *blocks;
  size_t num_blocks, cap_blocks;
  char work_dir[PATH_MAX + 32];
  atomic_int tasks_running; /* holds, changed under svc->lock: queued and running tasks, and a
                               Remove handler using it */
  bool removed;             /* the driver removed it while tasks were queued: it goes with the last */
  uint64_t incarnation;     /* of the driver that launched it: its tasks' ends go to that one only */
  struct exec_app *next;
} exec_app;

/* One task attempt. */
typedef struct exec_task {
  task_pool_work work;
  exec_app *app;
  rdd *rdd; /* retained */
  rdd_action action;
  bool owns_action;
  uint64_t key;
  claim_table *claims; /* where it is claimed: this executor's table, or an offer's owner's */
  struct peer_claims *peer; /* an offer's: the owner's table entry, referenced until freed */
  bool offer;          /* another executor's task on this node (TaskDescription.offer) */
  bool claimed;        /* its owner found it claimed by a peer: TaskStatus.claimed */
  uint64_t claimed_ns; /* an offer: when this executor claimed it (0: not yet) */
  bool claim_told;     /* an offer: the driver was told that this executor runs it */
  rdd_task rt;
  atomic_bool cancelled;
  fl_buf result;
  struct exec_task *next; /* running list, then the status queue */
} exec_task;

struct exec_service {
  executor_config cfg;
  uint64_t id;
  /* The driver's incarnation (RegisterExecutorReply), which every call between the two
   * carries; 0 while registering, when the first call from a driver (a launch may come before
   * the registration's reply) sets it. Applications of one incarnation are all gone before
   * another is taken (driver_forget), so their ids never meet here. */
  _Atomic uint64_t incarnation; /* INCARNATION_NONE between drivers: every call is refused */
  uint64_t driver_timeout_ns; /* FLINT_DRIVER_TIMEOUT_MS: silence after which the driver is lost */
  atomic_bool fatal;          /* the process must end (executor_serve returns fatal_error) */
  bool supervised;            /* a supervised child (report.c): its supervisor reports its death */
  char fatal_error[256];
  uint32_t heartbeat_ms;
  char driver_data[96]; /* the driver's block server, once driver_known */
  /* Set once a registration's reply is in: a launch may come before it (the driver launches
   * as soon as it has registered the executor), and its library fetch then waits for it. */
  atomic_bool driver_known;
  char node[SHARED_NODE_MAX]; /* shared_block_node */
  uint32_t pid;               /* this process's, read once: a syscall costs microseconds in a VM */
  claim_table *claims;        /* this executor's: its tasks are claimed there */
  struct peer_claims {        /* node peers' tables, mapped on first use (under lock) */
    uint32_t pid;
    uint64_t executor;        /* the owner's id: a reused pid is another executor */
    claim_table *table;
    uint32_t refs;            /* queued or running offers of it; unmapped at 0 when room is needed */
  } peers[16];
  size_t num_peers;
  rpc_channel *driver;
  rpc_server *server;
  dp_server *blocks_server;
  dp_client *fetcher;
  block_manager *blocks;
  task_pool *pool;
  char work_dir[PATH_MAX];
  bool own_work_dir;

  pthread_mutex_t lock; /* apps, libraries, running, the status queue */
  pthread_cond_t wake;      /* the status thread's: something to send, or stop */
  pthread_cond_t stop_wake; /* the heartbeat thread's: stop (task ends must not wake it) */
  exec_app *apps;
  exec_library *libraries;
  exec_task *running;
  exec_task *done_head, *done_tail;
  result_block *results;
  bool stopping;
  /* Set on stop, so that calls to the driver give up (it may never answer): heartbeats and
   * barrier calls at once; the last statuses after STATUS_STOP_GRACE_MS. */
  atomic_bool abandon, abandon_statuses;
  atomic_uint_fast64_t tasks_run, tasks_failed;
  atomic_bool none_pending; /* the last launch's none_pending */
  /* Own tasks queued and not started: what holds statuses back. Offers do not count: they
   * may never run here, and the driver must hear of the own tasks' ends to send more. */
  atomic_size_t own_queued;
  pthread_t status_thread, heartbeat_thread;
  /* Fault injection (tests and benchmarks only; see settings_read). */
  uint64_t fault_exit_after; /* tasks after which the process dies; 0: never */
  double fault_slowdown;     /* every task takes this many times as long; <= 1: as it is */
};

/* A data-plane request's deadline (FLINT_FETCH_TIMEOUT_MS, default 60 s): how long a task
 * waits on a peer that stopped answering (a cut link) before it reports a fetch failure. */
static int64_t svc_fetch_timeout_ms = 60000;

/* The process's exit status when fault injection kills it. */
#define FAULT_EXIT_STATUS 86

/* How long an executor goes on without an answer from its driver before it takes the driver
 * for lost: it then drops every application's state and registers again once one answers. */
#define DRIVER_TIMEOUT_MS_DEFAULT 30000
/* exec_service.incarnation between one driver and the next (drivers draw 63-bit ones). */
#define INCARNATION_NONE UINT64_MAX

/* Settings from the environment: FLINT_FETCH_TIMEOUT_MS (above), FLINT_DRIVER_TIMEOUT_MS, and
 * test-only switches:
 *   FLINT_FAULT_EXIT_AFTER_TASKS=K  the executor dies (_exit 86, no goodbye, as kill -9 would
 *                                   leave things) as its K-th task ends, before reporting it;
 *   FLINT_FAULT_SLOWDOWN=F          each task runs F times as long (it sleeps (F - 1) times
 *                                   its run time afterwards, waking for kills): a slow machine. */
static void settings_read(exec_service *svc) {
  const char *t = getenv("FLINT_FETCH_TIMEOUT_MS");
  if (t && *t && strtoll(t, NULL, 10) > 0) svc_fetch_timeout_ms = strtoll(t, NULL, 10);
  const char *d = getenv("FLINT_DRIVER_TIMEOUT_MS");
  long long driver_ms = d && *d ? strtoll(d, NULL, 10) : DRIVER_TIMEOUT_MS_DEFAULT;
  if (driver_ms <= 0) {
    common_log(LOG_WARN, "FLINT_DRIVER_TIMEOUT_MS=%s is not a positive number of milliseconds: using %d", d,
               DRIVER_TIMEOUT_MS_DEFAULT);
    driver_ms = DRIVER_TIMEOUT_MS_DEFAULT;
  }
  svc->driver_timeout_ns = (uint64_t)driver_ms * 1000000ull;
  const char *k = getenv("FLINT_FAULT_EXIT_AFTER_TASKS"), *f = getenv("FLINT_FAULT_SLOWDOWN");
  if (k && *k) svc->fault_exit_after = strtoull(k, NULL, 10);
  if (f && *f) svc->fault_slowdown = strtod(f, NULL);
  if (svc->fault_exit_after || svc->fault_slowdown > 1)
    common_log(LOG_WARN, "fault injection: exit after %llu tasks, slowdown %.1fx",
               (unsigned long long)svc->fault_exit_after, svc->fault_slowdown > 1 ? svc->fault_slowdown : 1.0);
}

/* Sleeps `ns`, waking every 10 ms to see whether the task was killed. */
static void fault_nap(const rdd_task *rt, uint64_t ns) {
  uint64_t end = common_now_ns() + ns;
  while (!rdd_task_cancelled(rt)) {
    uint64_t now = common_now_ns();
    if (now >= end) break;
    uint64_t step = end - now < 10000000u ? end - now : 10000000u;
    struct timespec ts = {0, (long)step};
    nanosleep(&ts, NULL);
  }
}

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

/* Where another executor holds a cached partition; false when none does. */
static bool find_block_location(exec_app *a, rdd_block_key key, block_location *out) {
  bool found = false;
  FL_PCHECK(pthread_mutex_lock(&a->lock));
  for (size_t i = 0; i < a->num_blocks && !found; i++)
    if (a->blocks[i].rdd_id == key.rdd_id && a->blocks[i].partition == key.partition) {
      *out = a->blocks[i];
      found = true;
    }
  FL_PCHECK(pthread_mutex_unlock(&a->lock));
  return found && !self_address(a->svc, out->address);
}

/* A cached partition held by an executor on this node, mapped in place (a node-local read,
 * with no copy); false when it cannot be, and the data plane then fetches it. */
static bool map_peer_block(exec_app *a, const block_location *loc, rdd_block_key key, const rdd_batch **batch,
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
static bool fetch_remote_block(exec_app *a, const block_location *loc, rdd_block_key key, rdd_batch *out) {
  const char *peer = loc->address;
  dp_request req = {.kind = DP_BLOCK, .key = {a->id, key.rdd_id, key.partition, 0}};
  fl_buf bytes = FL_BUF_INIT;
  fl_status st = dp_fetch(a->svc->fetcher, peer, &req, svc_fetch_timeout_ms, &bytes, NULL);
  if (st == FL_OK) st = rdd_batch_decode(fl_buf_bytes(&bytes), "a remote cached block", out);
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
  block_location loc;
  if (!find_block_location(a, key, &loc)) {
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

static void app_remove_rdd(void *impl, uint64_t rdd_id) {
  exec_app *a = impl;
  block_manager_cache_ops.remove_rdd(a->svc->blocks, app_key(a, rdd_id));
}

static void app_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
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
  for (size_t i = 0; i < a->num_maps; i++)
    if (a->maps[i].shuffle_id == shuffle_id && a->maps[i].map == map) {
      snprintf(peer, len, "%s", a->maps[i].address);
      found = true;
      break;
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
    fl_status st = dp_fetch(svc->fetcher, peer, &req, svc_fetch_timeout_ms, &scratch, block_len);
    fl_buf_free(&scratch);
    if (st != FL_OK) goto failed;
    return FL_OK;
  }
  fl_status st = dp_fetch(svc->fetcher, peer, &req, svc_fetch_timeout_ms, out, block_len);
  if (st == FL_OK) return FL_OK;
failed:
  return common_error_wrap(FL_EFETCH, "fetch failed: shuffle %llu, map %u, reduce %u from %s: ",
                           (unsigned long long)shuffle_id, map, reduce, peer);
}

static void app_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {
  exec_app *a = impl;
  block_manager_cache_ops.shuffle_remove(a->svc->blocks, app_key(a, shuffle_id), num_maps);
}

static const rdd_cache_ops app_cache_ops = {app_get,          app_put,          app_release,
                                            app_remove_rdd,   app_info,         app_shuffle_path,
                                            app_shuffle_fetch, app_shuffle_remove};

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
  fl_status st = dp_fetch(svc->fetcher, peer, &req, svc_fetch_timeout_ms, out, &total);
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
    if ((st = dp_fetch(svc->fetcher, peer, &req, svc_fetch_timeout_ms, out, NULL)) != FL_OK) return st;
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

static void app_destroy(exec_app *a) {
  if (!a) return;
  rdd_plan_destroy(a->plan);
  rdd_shared_destroy(a->ctx.shared);
  map_output_table_destroy(a->ctx.map_outputs);
  common_free(a->maps);
  common_free(a->blocks);
  if (a->work_dir[0]) common_remove_tree(a->work_dir);
  pthread_mutex_destroy(&a->lock);
  common_free(a);
}

/* A call to the driver that gives up once *abandon is set (the executor stopping), so that a
 * driver that does not answer (stopped, cut off) cannot hold the stop for the call's deadline. */
static fl_status driver_call(exec_service *svc, const char *method, fl_bytes body, int64_t timeout_ms,
                             const atomic_bool *abandon, fl_buf *reply) {
  rpc_pending *p;
  fl_status st = rpc_call_begin(svc->driver, method, body, timeout_ms, &p);
  return st == FL_OK ? rpc_call_end_unless(p, abandon, reply) : st;
}

/* How long a stopping executor lets its last statuses take before it gives them up. */
#define STATUS_STOP_GRACE_MS 1000

/* ---- barrier tasks: calls to the driver's coordinator (driver/barrier.c) --------------------- */

/* A barrier RPC's deadline beyond the wait it asks the driver for. */
#define BARRIER_RPC_SLACK_MS 10000

static fl_status barrier_rpc(exec_service *svc, const char *method, const ProtobufCMessage *msg, int64_t timeout_ms,
                             fl_buf *reply) {
  fl_buf body = FL_BUF_INIT;
  fl_status st = proto_pack(msg, &body);
  if (st == FL_OK) st = driver_call(svc, method, fl_buf_bytes(&body), timeout_ms, &svc->abandon, reply);
  fl_buf_free(&body);
  return st;
}

static fl_status exec_gather(void *impl, const rdd_task *task, uint32_t round, fl_bytes mine, uint32_t timeout_ms,
                             rdd_batch *all) {
  exec_service *svc = impl;
  Flint__BarrierGatherRequest req = FLINT__BARRIER_GATHER_REQUEST__INIT;
  req.job_id = task->job_id;
  req.stage = task->barrier.stage;
  req.attempt = task->barrier.attempt;
  req.rank = task->partition;
  req.round = round;
  req.message = (ProtobufCBinaryData){mine.len, (uint8_t *)mine.data};
  req.timeout_ms = timeout_ms;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = barrier_rpc(svc, "/flint.Driver/BarrierGather", &req.base, (int64_t)timeout_ms + BARRIER_RPC_SLACK_MS,
                             &reply);
  if (st == FL_OK) {
    Flint__BarrierGatherReply *rep = flint__barrier_gather_reply__unpack(NULL, reply.len, reply.data);
    if (!rep) st = FL_ERR(FL_EPROTO, "BarrierGather: malformed reply");
    for (size_t i = 0; rep && st == FL_OK && i < rep->n_messages; i++)
      st = rdd_batch_append(all, rep->messages[i].data, rep->messages[i].len);
    if (rep) flint__barrier_gather_reply__free_unpacked(rep, NULL);
  }
  fl_buf_free(&reply);
  return st;
}

static fl_status exec_report(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes message) {
  Flint__BarrierReportRequest req = FLINT__BARRIER_REPORT_REQUEST__INIT;
  req.job_id = task->job_id;
  req.rdd_id = rdd_id;
  req.rank = task->partition;
  req.message = (ProtobufCBinaryData){message.len, (uint8_t *)message.data};
  fl_buf reply = FL_BUF_INIT;
  fl_status st = barrier_rpc(impl, "/flint.Driver/BarrierReport", &req.base, RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

static fl_status exec_put(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes state) {
  Flint__BarrierCheckpointRequest req = FLINT__BARRIER_CHECKPOINT_REQUEST__INIT;
  req.job_id = task->job_id;
  req.stage = task->barrier.stage;
  req.attempt = task->barrier.attempt;
  req.rdd_id = rdd_id;
  req.state = (ProtobufCBinaryData){state.len, (uint8_t *)state.data};
  fl_buf reply = FL_BUF_INIT;
  fl_status st = barrier_rpc(impl, "/flint.Driver/BarrierCheckpoint", &req.base, RPC_TIMEOUT_MS * 4, &reply);
  fl_buf_free(&reply);
  return st;
}

static fl_status exec_get(void *impl, const rdd_task *task, uint64_t rdd_id, fl_buf *out) {
  Flint__BarrierCheckpointRequest req = FLINT__BARRIER_CHECKPOINT_REQUEST__INIT;
  req.job_id = task->job_id;
  req.stage = task->barrier.stage;
  req.attempt = task->barrier.attempt;
  req.rdd_id = rdd_id;
  req.get = true;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = barrier_rpc(impl, "/flint.Driver/BarrierCheckpoint", &req.base, RPC_TIMEOUT_MS * 4, &reply);
  if (st == FL_OK) {
    Flint__BarrierCheckpointReply *rep = flint__barrier_checkpoint_reply__unpack(NULL, reply.len, reply.data);
    if (!rep) st = FL_ERR(FL_EPROTO, "BarrierCheckpoint: malformed reply");
    else st = fl_buf_append(out, rep->state.data, rep->state.len);
    if (rep) flint__barrier_checkpoint_reply__free_unpacked(rep, NULL);
  }
  fl_buf_free(&reply);
  return st;
}

static const rdd_barrier_ops exec_barrier_ops = {exec_gather, exec_report, exec_put, exec_get};

/* FL_OK when a call of driver incarnation `incarnation` is from this executor's driver: an
 * executor registering takes the first that comes (a launch may overtake the registration's
 * reply). Anything else is an earlier driver process's, or a later one's that this executor
 * has not registered with, and is refused. */
static fl_status check_incarnation(exec_service *svc, uint64_t incarnation, const char *what) {
  uint64_t mine = 0;
  if (incarnation && incarnation != INCARNATION_NONE &&
      (atomic_compare_exchange_strong(&svc->incarnation, &mine, incarnation) || mine == incarnation))
    return FL_OK;
  return FL_ERR(FL_ESTATE, "%s of driver incarnation %016llx refused: this executor serves %016llx", what,
                (unsigned long long)incarnation, (unsigned long long)mine);
}

/* The application's context, made on its first launch. Caller holds svc->lock. */
static fl_status app_get_or_create(exec_service *svc, uint64_t app_id, exec_app **out) {
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
  app_destroy(a);
  return status;
}

/* ---- tasks ----------------------------------------------------------------------------- */

static void task_free(exec_task *t);

/* Drops one hold on `a` (a queued or running task, or a handler using it): the application
 * goes with the last once the driver has removed it. svc->lock held; returns the application
 * to destroy (app_remove_all), unlinked, or NULL. */
static exec_app *app_release_locked(exec_service *svc, exec_app *a) {
  if (atomic_fetch_sub(&a->tasks_running, 1) != 1 || !a->removed) return NULL;
  for (exec_app **p = &svc->apps; *p; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      return a;
    }
  return NULL;
}

/* A task has ended (reported, or an offer dropped). svc->lock held. */
static exec_app *task_done_locked(exec_service *svc, exec_task *t) {
  if (t->peer) t->peer->refs--;
  t->peer = NULL;
  return app_release_locked(svc, t->app);
}

static void app_remove_all(exec_service *svc, exec_app *a) {
  block_manager_remove_range(svc->blocks, a->id << APP_SHIFT, (a->id + 1) << APP_SHIFT);
  app_destroy(a);
}

static void task_free(exec_task *t) {
  if (t->owns_action) rdd_action_clear(&t->action);
  if (t->rdd) rdd_release(t->rdd);
  rdd_task_clear(&t->rt);
  fl_buf_free(&t->result);
  common_free(t);
}

/* Takes an ended (or skipped) task off the running list; svc->lock held. */
static void running_remove(exec_service *svc, exec_task *t) {
  for (exec_task **p = &svc->running; *p; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      break;
    }
  t->next = NULL;
}

/* Whether t runs here: a killed task does (to report its end), anything else once claimed.
 * The kill handler cancels before it claims, so a claim lost to a kill reads as killed; an
 * offer is only ever run once claimed. */
static bool task_claim(exec_task *t) {
  if (t->offer) /* a cancelled offer (this executor stops) is nobody's business here */
    return !rdd_task_cancelled(&t->rt) && claim_table_take(t->claims, t->key, false);
  if (!t->claims || rdd_task_cancelled(&t->rt)) return true;
  if (claim_table_take(t->claims, t->key, true)) return true;
  return rdd_task_cancelled(&t->rt);
}

static void task_run(task_pool_work *work) {
  exec_task *t = (exec_task *)work;
  exec_service *svc = t->app->svc;
  uint64_t t0 = common_now_ns();
  if (!t->offer) atomic_fetch_sub(&svc->own_queued, 1);
  bool skip = !task_claim(t);
  if (!skip && t->offer) { /* the status thread tells the driver if it runs long (claims_due) */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    t->claimed_ns = t0;
    pthread_cond_signal(&svc->wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  if (skip && t->offer) { /* the owner or another peer has it: nothing to report */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    running_remove(svc, t);
    if (svc->done_head && atomic_load(&svc->own_queued) == 0) pthread_cond_signal(&svc->wake);
    exec_app *gone = task_done_locked(svc, t);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    task_free(t);
    if (gone) app_remove_all(svc, gone);
    return;
  }
  /* Ended tasks held while own tasks were queued go once none is (the driver should send
   * more; offers queued behind hold nothing), unless the driver has nothing waiting and they
   * are all of this task's job: then a report could not end the job before this task does,
   * and waking the status thread now would take this task's core. They go with this task's
   * end, or at the hold's deadline. */
  if (atomic_load(&svc->own_queued) == 0) {
    bool hold = atomic_load(&svc->none_pending);
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    for (exec_task *d = svc->done_head; d && hold; d = d->next)
      hold = d->app == t->app && d->rt.job_id == t->rt.job_id;
    if (svc->done_head && !hold) pthread_cond_signal(&svc->wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  if (skip) { /* an owner's task that a peer claimed: the peer reports its end */
    t->claimed = true;
    rdd_task_fail(&t->rt, FL_ERR(FL_ECANCELLED, "claimed by another executor of this node"));
  } else {
    common_trace_partition("task.start", t->rt.partition);
    executor_report_task named = {t->key, t->app->id, t->rdd->id, t->rt.partition};
    executor_report_running(&named); /* for the last words, if user code ends the process */
    if (!rdd_task_cancelled(&t->rt)) rdd_task_run(&t->rt, t->rdd, &t->action, &t->result);
    else rdd_task_fail(&t->rt, FL_ERR(FL_ECANCELLED, "task killed"));
    executor_report_running(NULL);
    common_trace_partition("task.end", t->rt.partition);
  }
  if (svc->fault_slowdown > 1) fault_nap(&t->rt, (uint64_t)((double)(common_now_ns() - t0) * (svc->fault_slowdown - 1)));
  if (svc->fault_exit_after && atomic_load(&svc->tasks_run) + 1 >= svc->fault_exit_after) {
    common_log(LOG_WARN, "fault injection: exiting after %llu tasks", (unsigned long long)svc->fault_exit_after);
    _exit(FAULT_EXIT_STATUS);
  }
  if (!skip) {
    atomic_fetch_add(&svc->tasks_run, 1);
    if (t->rt.status != FL_OK) atomic_fetch_add(&svc->tasks_failed, 1);
  }
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  running_remove(svc, t);
  /* The status thread waits for a first ended task, then holds while tasks are queued and
   * all went well: only those changes wake it (each wake-up takes a core from the tasks). A
   * claimed task is no failure: its report can wait with the others. */
  bool wake = !svc->done_head || (t->rt.status != FL_OK && !skip) || atomic_load(&svc->own_queued) == 0;
  if (svc->done_tail) svc->done_tail->next = t;
  else svc->done_head = t;
  svc->done_tail = t;
  if (wake) pthread_cond_signal(&svc->wake);
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
}

/* Frees a list of ended tasks, and each application whose last hold one was. */
static void tasks_release(exec_service *svc, exec_task *list) {
  while (list) {
    exec_task *next = list->next;
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = task_done_locked(svc, list);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    task_free(list);
    if (gone) app_remove_all(svc, gone);
    list = next;
  }
}

/* Ended tasks wait (svc->lock held) while more are queued here, up to STATUS_HOLD_NS, so
 * that one call reports several: where every core runs a task, each call takes a core from
 * them. A failure (the driver retries it), a task ending with the queue empty, the queue
 * emptying when the driver may have more to send (task_run), or the deadline sends at once;
 * the deadline bounds what speculation sees late. */
#define STATUS_HOLD_NS 20000000ull

static bool status_may_wait(exec_service *svc) {
  if (svc->stopping || atomic_load(&svc->own_queued) == 0) return false;
  for (exec_task *t = svc->done_head; t; t = t->next)
    if (t->rt.status != FL_OK && !t->claimed) return false;
  return true;
}

/* Waits on svc->wake (svc->lock held) for at most ns nanoseconds. */
static void status_sleep(exec_service *svc, uint64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* svc->wake runs on the realtime clock */
  ns += (uint64_t)ts.tv_nsec;
  ts.tv_sec += (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  pthread_cond_timedwait(&svc->wake, &svc->lock, &ts);
}

static void status_hold(exec_service *svc) {
  uint64_t deadline = common_now_ns() + STATUS_HOLD_NS;
  while (status_may_wait(svc)) {
    uint64_t now = common_now_ns();
    if (now >= deadline) return;
    status_sleep(svc, deadline - now);
  }
}

/* A node peer's task that this executor claimed and still runs after this long is told to
 * the driver (TaskStatus.claimed from the claimer): until its owner reaches it in its queue,
 * the driver would take it for the owner's, and could put a backup copy behind it here.
 * Shorter ones cost no message: their end says where they ran. */
#define CLAIM_TELL_NS 20000000ull

/* When the next claimed offer is due to be told (svc->lock); 0: none is. */
static uint64_t claim_due_ns(exec_service *svc) {
  uint64_t due = 0;
  for (exec_task *t = svc->running; t; t = t->next)
    if (t->claimed_ns && !t->claim_told && (!due || t->claimed_ns + CLAIM_TELL_NS < due))
      due = t->claimed_ns + CLAIM_TELL_NS;
  return due;
}

/* Waits (svc->lock held) for an ended task, a claim due to be told, or the stop. */
static void status_wait(exec_service *svc) {
  while (!svc->done_head && !svc->stopping) {
    uint64_t due = claim_due_ns(svc), now = common_now_ns();
    if (!due) {
      pthread_cond_wait(&svc->wake, &svc->lock);
      continue;
    }
    if (due <= now) return;
    status_sleep(svc, due - now);
  }
}

/* The keys of the claimed offers due to be told, at most max (svc->lock); marks them told. */
static size_t claims_due(exec_service *svc, uint64_t *keys, size_t max) {
  uint64_t now = common_now_ns();
  size_t n = 0;
  for (exec_task *t = svc->running; t && n < max; t = t->next)
    if (t->claimed_ns && !t->claim_told && t->claimed_ns + CLAIM_TELL_NS <= now) {
      t->claim_told = true;
      keys[n++] = t->key;
    }
  return n;
}

/* Sends every ended task waiting at the moment, and the claims due, in one StatusUpdate. */
static void *status_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-status");
  exec_service *svc = arg;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    status_wait(svc);
    status_hold(svc);
    exec_task *batch = svc->done_head;
    svc->done_head = svc->done_tail = NULL;
    uint64_t incarnation = atomic_load(&svc->incarnation);
    exec_task *stale = NULL; /* tasks of an earlier driver (driver_forget): not reported */
    for (exec_task **p = &batch; *p;) {
      exec_task *t = *p;
      if (t->app->incarnation == incarnation) {
        p = &t->next;
        continue;
      }
      *p = t->next;
      t->next = stale;
      stale = t;
    }
    uint64_t told[64];
    size_t num_told = claims_due(svc, told, sizeof told / sizeof *told);
    bool stopping = svc->stopping;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    tasks_release(svc, stale);
    if (!batch && !num_told) {
      if (stopping) return NULL;
      continue;
    }
    size_t n = num_told;
    for (exec_task *t = batch; t; t = t->next) n++;
    Flint__TaskStatus *statuses = common_calloc(n, sizeof *statuses);
    Flint__TaskStatus **ptrs = common_calloc(n, sizeof *ptrs);
    size_t nacc = 0;
    for (exec_task *t = batch; t; t = t->next) nacc += t->rt.num_acc_updates;
    Flint__AccUpdate *accs = common_calloc(nacc ? nacc : 1, sizeof *accs);
    Flint__AccUpdate **acc_ptrs = common_calloc(nacc ? nacc : 1, sizeof *acc_ptrs);
    if (statuses && ptrs && accs && acc_ptrs) {
      size_t i = 0, k = 0;
      for (; i < num_told; i++) { /* "this executor runs it": a claim, from the claimer */
        flint__task_status__init(&statuses[i]);
        statuses[i].task_key = told[i];
        statuses[i].claimed = true;
        ptrs[i] = &statuses[i];
      }
      for (exec_task *t = batch; t; t = t->next, i++) {
        Flint__TaskStatus *s = &statuses[i];
        flint__task_status__init(s);
        s->task_key = t->key;
        s->status = t->rt.status;
        s->error = t->rt.error ? t->rt.error : "";
        s->fetch_failed = t->rt.fetch_failed;
        s->fetch_shuffle_id = t->rt.fetch_shuffle_id;
        s->fetch_map = t->rt.fetch_map;
        s->run_ns = t->rt.run_ns;
        s->blocks_mapped = t->rt.blocks_mapped;
        s->blocks_fetched = t->rt.blocks_fetched;
        s->claimed = t->claimed;
        if (t->result.len > INLINE_RESULT_MAX) {
          result_block *rb = common_calloc(1, sizeof *rb);
          if (rb) {
            rb->task_key = t->key;
            rb->bytes = t->result; /* handed over */
            t->result = (fl_buf)FL_BUF_INIT;
            s->result_block_size = rb->bytes.len;
            FL_PCHECK(pthread_mutex_lock(&svc->lock));
            rb->next = svc->results;
            svc->results = rb;
            FL_PCHECK(pthread_mutex_unlock(&svc->lock));
          } else {
            s->status = FL_ENOMEM;
            s->error = "out of memory for a large task result";
          }
        } else {
          s->result.data = t->result.data;
          s->result.len = t->result.len;
        }
        s->acc_updates = &acc_ptrs[k];
        for (uint32_t j = 0; j < t->rt.num_acc_updates; j++, k++) {
          flint__acc_update__init(&accs[k]);
          accs[k].id = t->rt.acc_updates[j].id;
          accs[k].value.data = t->rt.acc_updates[j].value.data;
          accs[k].value.len = t->rt.acc_updates[j].value.len;
          acc_ptrs[k] = &accs[k];
          s->n_acc_updates++;
        }
        ptrs[i] = s;
      }
      Flint__StatusUpdateRequest req = FLINT__STATUS_UPDATE_REQUEST__INIT;
      req.executor_id = svc->id;
      req.incarnation = incarnation;
      req.n_statuses = n;
      req.statuses = ptrs;
      fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
      if (proto_pack(&req.base, &body) == FL_OK) {
        if (driver_call(svc, "/flint.Driver/StatusUpdate", fl_buf_bytes(&body), RPC_TIMEOUT_MS,
                        &svc->abandon_statuses, &reply) != FL_OK &&
            !atomic_load(&svc->abandon_statuses))
          common_log(LOG_WARN, "status update of %zu tasks failed: %s", n, fl_last_error());
      }
      fl_buf_free(&body);
      fl_buf_free(&reply);
    } else {
      common_log(LOG_ERROR, "out of memory: %zu task statuses lost", n);
    }
    common_free(statuses);
    common_free(ptrs);
    common_free(accs);
    common_free(acc_ptrs);
    tasks_release(svc, batch);
  }
}

/* ---- control-plane handlers ------------------------------------------------------------ */

/* The claim table of node peer `executor` (process `pid`), mapped on first use and referenced
 * for the offer; NULL when it cannot be mapped, or 16 peers' tables are in use: its offers
 * are then left to their owner. A table no queued offer uses is unmapped when another peer's
 * needs the room (peers come and go; a gone one's table lives while it is mapped). svc->lock
 * held. */
static struct peer_claims *peer_claims(exec_service *svc, uint32_t pid, uint64_t executor) {
  struct peer_claims *free_entry = NULL;
  for (size_t i = 0; i < svc->num_peers; i++) {
    struct peer_claims *p = &svc->peers[i];
    if (p->pid == pid && p->executor == executor) {
      p->refs++;
      return p;
    }
    if (!p->refs && !free_entry) free_entry = p;
  }
  if (svc->num_peers < sizeof svc->peers / sizeof *svc->peers) free_entry = &svc->peers[svc->num_peers];
  if (!free_entry) return NULL;
  claim_table *t = NULL;
  if (claim_table_open(pid, &t) != FL_OK) {
    common_log(LOG_DEBUG, "offers of executor %llu (process %u) left to it: %s", (unsigned long long)executor, pid,
               fl_last_error());
    return NULL;
  }
  if (free_entry == &svc->peers[svc->num_peers]) svc->num_peers++;
  else claim_table_free(free_entry->table);
  *free_entry = (struct peer_claims){pid, executor, t, 1};
  return free_entry;
}

/* Forgets where the blocks of datasets rdd_ids[0, n) and the outputs of shuffles
 * shuffle_ids[0, m) are: they are gone (app->lock held). Without this a long-lived
 * application's tables would grow with every job. */
static void app_forget_locations(exec_app *app, const uint64_t *rdd_ids, size_t n, const uint64_t *shuffle_ids,
                                 size_t m) {
  for (size_t k = 0; k < app->num_blocks;) {
    bool gone = false;
    for (size_t i = 0; i < n && !gone; i++) gone = app->blocks[k].rdd_id == rdd_ids[i];
    if (gone) app->blocks[k] = app->blocks[--app->num_blocks];
    else k++;
  }
  for (size_t k = 0; k < app->num_maps;) {
    bool gone = false;
    for (size_t i = 0; i < m && !gone; i++) gone = app->maps[k].shuffle_id == shuffle_ids[i];
    if (gone) app->maps[k] = app->maps[--app->num_maps];
    else k++;
  }
}

static fl_status handle_launch(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__LaunchTasksRequest *req = flint__launch_tasks_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "LaunchTasks: malformed message");
  fl_status status = check_incarnation(svc, req->incarnation, "LaunchTasks");
  exec_app *app = NULL;
  if (status != FL_OK) goto cleanup;
  /* The launch holds the application (driver_forget may run meanwhile); checked again under
   * the lock, so that no application of a driver being forgotten is made. */
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  status = atomic_load(&svc->incarnation) == req->incarnation
               ? app_get_or_create(svc, req->app_id, &app)
               : FL_ERR(FL_ESTATE, "LaunchTasks: the executor is leaving the driver of incarnation %016llx",
                        (unsigned long long)req->incarnation);
  if (status == FL_OK) atomic_fetch_add(&app->tasks_running, 1);
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  if (status != FL_OK) goto cleanup;

  FL_PCHECK(pthread_mutex_lock(&app->lock));
  if (req->plan.len) status = rdd_plan_add(app->plan, (fl_bytes){req->plan.data, req->plan.len});
  /* Datasets the driver dropped: their nodes go (the tasks that hold one keep it alive). */
  for (size_t i = 0; status == FL_OK && i < req->n_released; i++) rdd_plan_release(app->plan, req->released[i]);
  if (status == FL_OK) app_forget_locations(app, req->released, req->n_released, NULL, 0);
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
    for (size_t j = 0; j < sl->n_maps; j++) {
      const Flint__MapLocation *ml = sl->maps[j];
      size_t k = 0;
      for (; k < app->num_maps; k++)
        if (app->maps[k].shuffle_id == sl->shuffle_id && app->maps[k].map == ml->map) break;
      if (k == app->num_maps) {
        if (app->num_maps == app->cap_maps) {
          size_t cap = app->cap_maps ? app->cap_maps * 2 : 64;
          map_location *grown = common_realloc(app->maps, cap * sizeof *grown);
          if (!grown) {
            status = FL_ERR(FL_ENOMEM, "out of memory");
            break;
          }
          app->maps = grown;
          app->cap_maps = cap;
        }
        app->num_maps++;
      }
      app->maps[k].shuffle_id = sl->shuffle_id;
      app->maps[k].map = ml->map;
      snprintf(app->maps[k].address, sizeof app->maps[k].address, "%s", ml->address);
    }
  }
  for (size_t i = 0; status == FL_OK && i < req->n_blocks; i++) {
    const Flint__BlockLocation *bl = req->blocks[i];
    size_t k = 0;
    for (; k < app->num_blocks; k++)
      if (app->blocks[k].rdd_id == bl->rdd_id && app->blocks[k].partition == bl->partition) break;
    if (k == app->num_blocks) {
      if (app->num_blocks == app->cap_blocks) {
        size_t cap = app->cap_blocks ? app->cap_blocks * 2 : 64;
        block_location *grown = common_realloc(app->blocks, cap * sizeof *grown);
        if (!grown) {
          status = FL_ERR(FL_ENOMEM, "out of memory");
          break;
        }
        app->blocks = grown;
        app->cap_blocks = cap;
      }
      app->num_blocks++;
    }
    app->blocks[k].rdd_id = bl->rdd_id;
    app->blocks[k].partition = bl->partition;
    snprintf(app->blocks[k].address, sizeof app->blocks[k].address, "%s", bl->address);
    bool same_node = svc->node[0] && strcmp(bl->node, svc->node) == 0 && bl->pid != svc->pid;
    app->blocks[k].pid = same_node ? bl->pid : 0;
  }
  /* Decode every task before starting any, so that a bad one refuses the whole batch. */
  /* tasks[0, n) as decoded; tasks[n, 2n) the order they are queued in */
  exec_task **tasks = common_calloc(req->n_tasks ? 2 * req->n_tasks : 1, sizeof *tasks);
  if (!tasks && status == FL_OK) status = FL_ERR(FL_ENOMEM, "out of memory");
  for (size_t i = 0; status == FL_OK && i < req->n_tasks; i++) {
    const Flint__TaskDescription *d = req->tasks[i];
    exec_task *t = tasks[i] = common_calloc(1, sizeof *t);
    if (!t) {
      status = FL_ERR(FL_ENOMEM, "out of memory");
      break;
    }
    t->app = app;
    t->key = d->task_key;
    t->offer = d->offer;
    if (d->shuffle_id == 0 && (d->action_index == 0 || d->action_index > req->n_actions)) {
      status = FL_ERR(FL_EPROTO, "task %llu: action %u of a batch of %zu", (unsigned long long)d->task_key,
                      d->action_index, req->n_actions);
      break;
    }
    t->rdd = rdd_plan_find(app->plan, d->rdd_id);
    if (!t->rdd) {
      status = FL_ERR(FL_EPROTO, "task %llu: unknown dataset %llu", (unsigned long long)d->task_key,
                      (unsigned long long)d->rdd_id);
      break;
    }
    rdd_retain(t->rdd);
    if (d->partition >= t->rdd->num_partitions) {
      status = FL_ERR(FL_EPROTO, "task %llu: partition %u of a dataset with %u",
                      (unsigned long long)d->task_key, d->partition, t->rdd->num_partitions);
      break;
    }
    if (d->shuffle_id == 0) { /* a result task (an encoded action may be empty: count) */
      const ProtobufCBinaryData *a = &req->actions[d->action_index - 1];
      status = rdd_action_decode(app->plan, (fl_bytes){a->data, a->len}, &t->action);
      t->owns_action = status == FL_OK;
    } else {
      const rdd_shuffle_dep *dep = rdd_plan_find_shuffle(app->plan, d->shuffle_id);
      if (!dep || dep->parent != t->rdd)
        status = FL_ERR(FL_EPROTO, "task %llu: no shuffle %llu over dataset %llu",
                        (unsigned long long)d->task_key, (unsigned long long)d->shuffle_id,
                        (unsigned long long)d->rdd_id);
      t->action.kind = RDD_ACTION_SHUFFLE_WRITE;
      t->action.dep = dep;
    }
    atomic_init(&t->cancelled, false);
    t->rt.ctx = &app->ctx;
    t->rt.job_id = d->job_id;
    t->rt.partition = d->partition;
    t->rt.attempt = d->attempt;
    t->rt.cancelled = &t->cancelled;
    if (d->barrier) {
      if (d->barrier_world == 0 || d->partition >= d->barrier_world) {
        status = FL_ERR(FL_EPROTO, "task %llu: rank %u of a barrier stage of %u", (unsigned long long)d->task_key,
                        d->partition, d->barrier_world);
        break;
      }
      t->rt.barrier = (rdd_barrier_info){.on = true, .stage = d->barrier_stage, .attempt = d->barrier_attempt,
                                         .world = d->barrier_world, .gpu = svc->cfg.gpu};
    }
    t->work.run = task_run;
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status == FL_OK) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    size_t kept = 0;
    for (size_t i = 0; i < req->n_tasks; i++) {
      exec_task *t = tasks[i];
      const Flint__TaskDescription *d = req->tasks[i];
      /* An offer this executor cannot claim (its owner's table is not to be had here, or the
       * offer makes no sense: a barrier task, this very process) is left to its owner. */
      if (t->offer && !d->barrier && d->owner_pid && d->owner_pid != svc->pid)
        t->peer = peer_claims(svc, d->owner_pid, d->owner_executor);
      t->claims = t->offer ? (t->peer ? t->peer->table : NULL) : svc->claims;
      if (t->offer && !t->claims) {
        task_free(t);
        continue;
      }
      tasks[kept++] = t;
      t->next = svc->running;
      svc->running = t;
      atomic_fetch_add(&app->tasks_running, 1);
      if (app->removed) atomic_store(&t->cancelled, true); /* its driver is being forgotten */
    }
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    atomic_store(&svc->none_pending, req->none_pending); /* launches arrive in order: one sender */
    /* Own tasks in launch order, then the offers from the last: a peer starts its tasks from
     * the first, so the two meet in the middle, as in work stealing. The order is settled
     * before the first submit: a submitted task may end and be freed at once. */
    size_t own = 0, offers = 0;
    exec_task **order = tasks + req->n_tasks;
    for (size_t i = 0; i < kept; i++) own += !tasks[i]->offer;
    for (size_t i = 0; i < kept; i++)
      if (tasks[i]->offer) order[kept - 1 - offers++] = tasks[i];
      else order[i - offers] = tasks[i];
    atomic_fetch_add(&svc->own_queued, own);
    uint64_t newest = 0, oldest = 0;
    for (size_t i = 0; i < kept; i++)
      if (!tasks[i]->offer && tasks[i]->key > newest) newest = tasks[i]->key;
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    for (exec_task *t = svc->running; t; t = t->next)
      if (!t->offer && (!oldest || t->key < oldest)) oldest = t->key;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (svc->claims && newest) claim_table_trim(svc->claims, newest, oldest); /* before the submits free them */
    for (size_t i = 0; i < kept; i++) task_pool_submit(svc->pool, &order[i]->work);
  } else if (tasks) {
    for (size_t i = 0; i < req->n_tasks; i++)
      if (tasks[i]) task_free(tasks[i]);
  }
  common_free(tasks);
  if (status == FL_OK) {
    Flint__Empty empty = FLINT__EMPTY__INIT;
    status = proto_pack(&empty.base, response);
  }
cleanup:
  if (app) { /* the launch's hold */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = app_release_locked(svc, app);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) app_remove_all(svc, gone);
  }
  flint__launch_tasks_request__free_unpacked(req, NULL);
  return status;
}

static fl_status handle_kill(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__KillTasksRequest *req = flint__kill_tasks_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "KillTasks: malformed message");
  fl_status st = check_incarnation(svc, req->incarnation, "KillTasks");
  if (st != FL_OK) {
    flint__kill_tasks_request__free_unpacked(req, NULL);
    return st;
  }
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  for (exec_task *t = svc->running; t; t = t->next)
    for (size_t i = 0; i < req->n_task_keys; i++)
      if (t->key == req->task_keys[i]) {
        atomic_store(&t->cancelled, true);
        /* A killed task no peer has claimed yet stays here, where it ends at once. */
        if (t->claims && !t->offer) claim_table_take(t->claims, t->key, true);
      }
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  flint__kill_tasks_request__free_unpacked(req, NULL);
  Flint__Empty empty = FLINT__EMPTY__INIT;
  return proto_pack(&empty.base, response);
}

static fl_status handle_remove(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__RemoveRequest *req = flint__remove_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "Remove: malformed message");
  fl_status st = check_incarnation(svc, req->incarnation, "Remove");
  if (st != FL_OK) {
    flint__remove_request__free_unpacked(req, NULL);
    return st;
  }
  exec_app *app = NULL;
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  for (exec_app *a = svc->apps; a && !app; a = a->next)
    if (a->id == req->app_id) {
      app = a;
      /* A finished application's context goes with the last hold on it: this call's, or a
       * task's (offers of node peers may still be queued: the driver does not count them). */
      atomic_fetch_add(&app->tasks_running, 1);
      if (req->whole_application) app->removed = true;
    }
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  if (app) {
    for (size_t i = 0; i < req->n_broadcast_ids; i++) rdd_shared_forget(app->ctx.shared, req->broadcast_ids[i]);
    for (size_t i = 0; i < req->n_rdd_ids; i++) app_remove_rdd(app, req->rdd_ids[i]);
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    for (size_t i = 0; i < req->n_shuffle_ids; i++) {
      rdd_shuffle_dep const *dep = rdd_plan_find_shuffle(app->plan, req->shuffle_ids[i]);
      if (dep) app_shuffle_remove(app, req->shuffle_ids[i], dep->parent->num_partitions);
    }
    app_forget_locations(app, req->rdd_ids, req->n_rdd_ids, req->shuffle_ids, req->n_shuffle_ids);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = app_release_locked(svc, app);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) app_remove_all(svc, gone);
  }
  flint__remove_request__free_unpacked(req, NULL);
  Flint__Empty empty = FLINT__EMPTY__INIT;
  return proto_pack(&empty.base, response);
}

static fl_status handle_storage_info(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__StorageInfoRequest *req = flint__storage_info_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "StorageInfo: malformed message");
  fl_status st = check_incarnation(svc, req->incarnation, "StorageInfo");
  if (st != FL_OK) {
    flint__storage_info_request__free_unpacked(req, NULL);
    return st;
  }
  fl_storage_info info = {0};
  block_manager_stats whole = {0};
  bool known = false;
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  for (exec_app *a = svc->apps; a; a = a->next)
    if (a->id == req->app_id) {
      known = true;
      if (req->rdd_id) app_info(a, req->rdd_id, &info); /* the block manager's own lock */
    }
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  /* rdd_id 0: the whole application (fl_context_stats); app ids are checked by app_key's
   * users, here the range is empty for an id out of bounds. */
  if (known && !req->rdd_id && req->app_id < (1ull << (64 - APP_SHIFT))) {
    block_manager_range_stats(svc->blocks, req->app_id << APP_SHIFT, (req->app_id + 1) << APP_SHIFT, &whole);
    info = (fl_storage_info){.cached_partitions = (uint32_t)(whole.blocks_in_memory + whole.blocks_on_disk),
                             .memory_bytes = whole.memory_used,
                             .disk_bytes = whole.disk_used};
  }
  flint__storage_info_request__free_unpacked(req, NULL);
  Flint__StorageInfoReply reply = FLINT__STORAGE_INFO_REPLY__INIT;
  reply.cached_partitions = info.cached_partitions;
  reply.memory_bytes = info.memory_bytes;
  reply.disk_bytes = info.disk_bytes;
  reply.evictions = whole.evictions;
  return proto_pack(&reply.base, response);
}

/* Launches and kills come on every job's path and only decode and enqueue, so the rpc
 * queue's thread answers them itself; a launch whose plan needs a library not loaded yet
 * (a fetch) is left to a handler thread, which replays it: plan nodes already added are
 * skipped and the rest of a launch's state is set idempotently. */
static const char *const quick_methods[] = {"/flint.Executor/LaunchTasks", "/flint.Executor/KillTasks", NULL};

static bool executor_quick(void *arg, const rpc_request *req, fl_buf *response, fl_status *status) {
  exec_service *svc = arg;
  if (strcmp(req->method, quick_methods[1]) == 0) {
    *status = handle_kill(svc, req->body, response);
    return true;
  }
  on_quick_path = true;
  quick_would_block = false;
  *status = handle_launch(svc, req->body, response);
  on_quick_path = false;
  if (!quick_would_block) return true;
  fl_buf_free(response);
  return false;
}

static fl_status executor_handle(void *arg, const rpc_request *req, fl_buf *response) {
  exec_service *svc = arg;
  if (strcmp(req->method, "/flint.Executor/LaunchTasks") == 0) return handle_launch(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/KillTasks") == 0) return handle_kill(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/Remove") == 0) return handle_remove(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/StorageInfo") == 0) return handle_storage_info(svc, req->body, response);
  return FL_ERR(FL_EINVAL, "unknown method %s", req->method);
}

/* ---- block server ---------------------------------------------------------------------- */

static fl_status serve_block(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                             uint64_t *total) {
  exec_service *svc = arg;
  if (req->kind == DP_BLOCK) {
    if (req->key[0] == 0 || req->key[0] >= (1ull << (64 - APP_SHIFT)) || req->key[1] >= (1ull << APP_SHIFT) ||
        req->key[2] > UINT32_MAX)
      return FL_ERR(FL_EPROTO, "block request out of range");
    rdd_block_key key = {(req->key[0] << APP_SHIFT) | req->key[1], (uint32_t)req->key[2]};
    const rdd_batch *batch;
    void *handle;
    if (!block_manager_cache_ops.get(svc->blocks, key, &batch, &handle))
      return FL_ERR(FL_ENOENT, "dataset %llu partition %u is not cached here",
                    (unsigned long long)req->key[1], (unsigned)req->key[2]);
    fl_buf encoded = FL_BUF_INIT;
    fl_status st = rdd_batch_encode(batch, &encoded);
    block_manager_cache_ops.release(svc->blocks, handle);
    if (st == FL_OK) {
      *total = encoded.len;
      uint64_t off = req->offset < encoded.len ? req->offset : encoded.len;
      uint64_t n = encoded.len - off;
      if (req->len && req->len < n) n = req->len;
      st = fl_buf_append(out, encoded.data + off, n);
    }
    fl_buf_free(&encoded);
    return st;
  }
  if (req->kind == DP_RESULT) {
    fl_status st = FL_OK;
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    result_block **p = &svc->results;
    while (*p && (*p)->task_key != req->key[0]) p = &(*p)->next;
    result_block *rb = *p;
    if (!rb) {
      st = FL_ERR(FL_ENOENT, "no result of task %llu here", (unsigned long long)req->key[0]);
    } else {
      *total = rb->bytes.len;
      uint64_t off = req->offset < rb->bytes.len ? req->offset : rb->bytes.len;
      uint64_t n = rb->bytes.len - off;
      if (req->len && req->len < n) n = req->len;
      st = fl_buf_append(out, rb->bytes.data + off, n);
      if (st == FL_OK && off + n == rb->bytes.len) { /* read to its end: the driver has it */
        *p = rb->next;
        fl_buf_free(&rb->bytes);
        common_free(rb);
      }
    }
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    return st;
  }
  if (req->kind != DP_SHUFFLE) return FL_ERR(FL_ENOENT, "this executor serves shuffle and cached blocks and results only");
  uint64_t app = req->key[0], shuffle = req->key[1];
  if (app == 0 || app >= (1ull << (64 - APP_SHIFT)) || shuffle >= (1ull << APP_SHIFT) ||
      req->key[2] > UINT32_MAX || req->key[3] > UINT32_MAX)
    return FL_ERR(FL_EPROTO, "shuffle request out of range");
  uint64_t len = req->len ? req->len : FETCH_CHUNK;
  if (len > 64u << 20) len = 64u << 20;
  return block_manager_cache_ops.shuffle_fetch(svc->blocks, (app << APP_SHIFT) | shuffle,
                                               (uint32_t)req->key[2], (uint32_t)req->key[3],
                                               req->offset, len, out, total);
}

/* ---- registration and heartbeats ------------------------------------------------------- */

/* Registers with the driver (a first time, or afresh after driver_forget), waiting up to
 * timeout_ms for its answer. */
static fl_status register_with_driver(exec_service *svc, int64_t timeout_ms) {
  Flint__RegisterExecutorRequest req = FLINT__REGISTER_EXECUTOR_REQUEST__INIT;
  req.host = (char *)svc->cfg.host;
  req.rpc_port = (uint32_t)rpc_server_port(svc->server);
  req.data_port = (uint32_t)dp_server_port(svc->blocks_server);
  req.cores = svc->cfg.cores;
  req.memory = svc->cfg.memory;
  req.pid = svc->pid;
  req.node = svc->node;
  req.supervised = svc->supervised;
  req.has_gpu = svc->cfg.gpu >= 0;
  req.gpu = svc->cfg.gpu >= 0 ? (uint32_t)svc->cfg.gpu : 0;
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  fl_status status = proto_pack(&req.base, &body);
  /* A new driver's keys may repeat an earlier one's: no claim of those may stand. */
  if (svc->claims) claim_table_clear(svc->claims);
  atomic_store(&svc->incarnation, 0); /* the first call of a driver says which */
  atomic_store(&svc->driver_known, false);
  if (status == FL_OK)
    status = driver_call(svc, "/flint.Driver/RegisterExecutor", fl_buf_bytes(&body), timeout_ms, &svc->abandon,
                         &reply);
  if (status == FL_OK) {
    Flint__RegisterExecutorReply *r = flint__register_executor_reply__unpack(NULL, reply.len, reply.data);
    uint64_t first = 0;
    if (!r || r->executor_id == 0 || r->driver_data_port == 0 || r->driver_data_port > 65535 ||
        r->incarnation == 0 || r->incarnation == INCARNATION_NONE) {
      status = FL_ERR(FL_EPROTO, "RegisterExecutor: malformed reply from the driver");
    } else if (!atomic_compare_exchange_strong(&svc->incarnation, &first, r->incarnation) &&
               first != r->incarnation) {
      status = FL_ERR(FL_ESTATE, "RegisterExecutor: driver incarnation %016llx answered, after a call of %016llx",
                      (unsigned long long)r->incarnation, (unsigned long long)first);
    } else {
      svc->id = r->executor_id;
      executor_report_registered(svc->id, r->incarnation, svc->cfg.driver, svc->work_dir);
      svc->heartbeat_ms = r->heartbeat_ms ? r->heartbeat_ms : 1000;
      /* The driver's block server is on the driver's host. */
      char host[64];
      snprintf(host, sizeof host, "%s", svc->cfg.driver);
      char *colon = strrchr(host, ':');
      if (colon) *colon = 0;
      snprintf(svc->driver_data, sizeof svc->driver_data, "%s:%u", host, r->driver_data_port);
      atomic_store(&svc->driver_known, true);
      char role[48];
      snprintf(role, sizeof role, "executor %llu", (unsigned long long)svc->id);
      common_log_set_role(role);
    }
    if (r) flint__register_executor_reply__free_unpacked(r, NULL);
  }
  if (status != FL_OK) atomic_store(&svc->incarnation, INCARNATION_NONE);
  fl_buf_free(&body);
  fl_buf_free(&reply);
  return status;
}

/* How long driver_forget waits for the killed tasks of the lost driver to end; a task in
 * user code that never returns to flint keeps its application's blocks, so the process ends. */
#define FORGET_DRAIN_MS 20000

/* Drops everything of the driver this executor served: its applications (datasets, cached
 * blocks, shuffle outputs, broadcasts, work folders), their tasks (killed; their ends are not
 * reported) and the large results waiting to be fetched. Called by the heartbeat thread when
 * the driver no longer knows this executor or has not answered for the driver timeout, before
 * it registers again. False when killed tasks did not end within FORGET_DRAIN_MS. */
static bool driver_forget(exec_service *svc) {
  atomic_store(&svc->incarnation, INCARNATION_NONE); /* nothing more of the old driver */
  /* A status update in flight to a driver that does not answer holds its tasks' applications
   * for its deadline: give it up (its ends are the old driver's). */
  atomic_store(&svc->abandon_statuses, true);
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  size_t num_apps = 0;
  for (exec_app *a = svc->apps; a; a = a->next) num_apps++;
  exec_app **apps = common_calloc(num_apps ? num_apps : 1, sizeof *apps);
  size_t held = 0;
  for (exec_app *a = svc->apps; a && apps; a = a->next)
    if (!a->removed) { /* a removed one goes with its last task already */
      a->removed = true;
      atomic_fetch_add(&a->tasks_running, 1);
      apps[held++] = a;
    }
  for (exec_task *t = svc->running; t; t = t->next) atomic_store(&t->cancelled, true);
  result_block *results = svc->results;
  svc->results = NULL;
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  while (results) {
    result_block *next = results->next;
    fl_buf_free(&results->bytes);
    common_free(results);
    results = next;
  }
  for (size_t i = 0; i < held; i++) { /* drop the hold taken above: idle ones go now */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = app_release_locked(svc, apps[i]);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) app_remove_all(svc, gone);
  }
  common_free(apps);
  if (!apps && num_apps) return false; /* out of memory: they cannot be dropped */
  /* The killed tasks end at their next batch; the status thread drops their ends, and the
   * last of each application removes it. */
  uint64_t deadline = common_now_ns() + (uint64_t)FORGET_DRAIN_MS * 1000000u;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool drained = svc->apps == NULL;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (drained && !atomic_load(&svc->abandon)) atomic_store(&svc->abandon_statuses, false);
    if (drained) return true;
    if (common_now_ns() >= deadline || atomic_load(&svc->abandon)) return false;
    usleep(10000);
  }
}

/* Waits up to ms on the stop (svc->lock held); false once the executor stops. */
static bool heartbeat_sleep(exec_service *svc, uint64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t ns = (uint64_t)ts.tv_nsec + ms * 1000000u;
  ts.tv_sec += (time_t)(ns / 1000000000u);
  ts.tv_nsec = (long)(ns % 1000000000u);
  while (!svc->stopping && pthread_cond_timedwait(&svc->stop_wake, &svc->lock, &ts) != ETIMEDOUT) {
  }
  return !svc->stopping;
}

/* The executor must end: executor_serve returns `why`. */
static void service_fail(exec_service *svc, const char *why) {
  common_log(LOG_ERROR, "%s", why);
  snprintf(svc->fatal_error, sizeof svc->fatal_error, "%s", why);
  atomic_store(&svc->fatal, true);
}

/* After driver_forget: registers with whichever driver answers at the configured address,
 * once a heartbeat period, quietly; false once the executor stops. */
static bool register_again(exec_service *svc) {
  for (;;) {
    /* A launch that overtook a registration that then failed left an application behind. */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool leftovers = svc->apps != NULL;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (leftovers && !driver_forget(svc)) {
      if (!atomic_load(&svc->abandon))
        service_fail(svc, "tasks of an earlier registration did not stop within 20 s of being killed");
      return false;
    }
    if (register_with_driver(svc, (int64_t)svc->heartbeat_ms * 5) == FL_OK) {
      common_log(LOG_INFO, "registered afresh with the driver at %s as executor %llu", svc->cfg.driver,
                 (unsigned long long)svc->id);
      return true;
    }
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool go_on = heartbeat_sleep(svc, svc->heartbeat_ms);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (!go_on) return false;
  }
}

/* The driver this executor served is gone (`why`): its state goes, and the executor registers
 * afresh, or ends when the state cannot go. False once the executor stops or must end. */
static bool driver_lost(exec_service *svc, const char *why) {
  common_log(LOG_WARN, "%s: dropping every application's blocks, shuffle outputs and tasks, and registering "
             "afresh when a driver answers at %s", why, svc->cfg.driver);
  if (!driver_forget(svc)) {
    if (!atomic_load(&svc->abandon))
      service_fail(svc, "tasks of the lost driver did not stop within 20 s of being killed: the executor ends "
                   "so that none of their state outlives it");
    return false;
  }
  return register_again(svc);
}

/* Heartbeats, and the driver's liveness: one line when a heartbeat first fails, one when the
 * driver is taken for lost (silent for the driver timeout, or it does not know this executor),
 * and none for each retry. */
static void *heartbeat_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-heartbeat");
  exec_service *svc = arg;
  uint64_t last_answer = common_now_ns();
  bool failing = false;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    bool go_on = heartbeat_sleep(svc, svc->heartbeat_ms);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (!go_on) return NULL;
    block_manager_stats bs;
    block_manager_stats_get(svc->blocks, &bs);
    Flint__HeartbeatRequest req = FLINT__HEARTBEAT_REQUEST__INIT;
    req.executor_id = svc->id;
    req.incarnation = atomic_load(&svc->incarnation);
    req.cached_bytes = bs.memory_used + bs.disk_used;
    req.tasks_run = atomic_load(&svc->tasks_run);
    req.tasks_failed = atomic_load(&svc->tasks_failed);
    fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
    uint64_t wait_ms = svc->driver_timeout_ns / 1000000u;
    bool unknown = false, answered = proto_pack(&req.base, &body) == FL_OK &&
        driver_call(svc, "/flint.Driver/Heartbeat", fl_buf_bytes(&body),
                    (int64_t)(wait_ms < RPC_TIMEOUT_MS ? wait_ms : RPC_TIMEOUT_MS), &svc->abandon, &reply) == FL_OK;
    if (answered) {
      Flint__HeartbeatReply *r = flint__heartbeat_reply__unpack(NULL, reply.len, reply.data);
      unknown = r && r->unknown;
      if (r) flint__heartbeat_reply__free_unpacked(r, NULL);
    }
    char error[200];
    snprintf(error, sizeof error, "%s", answered ? "" : fl_last_error());
    fl_buf_free(&body);
    fl_buf_free(&reply);
    if (atomic_load(&svc->abandon)) return NULL;
    uint64_t now = common_now_ns();
    if (answered && !unknown) {
      if (failing) common_log(LOG_INFO, "the driver at %s answers again", svc->cfg.driver);
      failing = false;
      last_answer = now;
      continue;
    }
    char why[320];
    if (unknown) {
      snprintf(why, sizeof why, "the driver at %s does not know this executor (it restarted, or took this "
               "executor for lost)", svc->cfg.driver);
    } else if (now - last_answer >= svc->driver_timeout_ns) {
      snprintf(why, sizeof why, "no answer from the driver at %s for %.0f s (FLINT_DRIVER_TIMEOUT_MS)",
               svc->cfg.driver, (double)(now - last_answer) / 1e9);
    } else {
      if (!failing)
        common_log(LOG_WARN, "heartbeat to the driver at %s failed: %s; retrying for up to %.0f s", svc->cfg.driver,
                   error, (double)svc->driver_timeout_ns / 1e9);
      failing = true;
      continue;
    }
    if (!driver_lost(svc, why)) return NULL;
    failing = false;
    last_answer = common_now_ns();
  }
}

/* ---- the process ----------------------------------------------------------------------- */

static void service_destroy(exec_service *svc) {
  atomic_store(&svc->abandon, true);
  if (svc->status_thread || svc->heartbeat_thread) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    svc->stopping = true;
    pthread_cond_broadcast(&svc->wake);
    pthread_cond_broadcast(&svc->stop_wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  rpc_server_stop(svc->server); /* no new launches */
  if (svc->pool) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    for (exec_task *t = svc->running; t; t = t->next) atomic_store(&t->cancelled, true);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    task_pool_destroy(svc->pool);
  }
  if (svc->status_thread) {
    /* The ended tasks' statuses (results the driver need not compute again) get a grace. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)STATUS_STOP_GRACE_MS * 1000000u;
    until.tv_sec += (time_t)(ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    if (pthread_timedjoin_np(svc->status_thread, NULL, &until) != 0) {
      atomic_store(&svc->abandon_statuses, true);
      pthread_join(svc->status_thread, NULL);
    }
  }
  if (svc->heartbeat_thread) pthread_join(svc->heartbeat_thread, NULL);
  while (svc->done_head) { /* ended after the last status update went out */
    exec_task *t = svc->done_head;
    svc->done_head = t->next;
    task_free(t);
  }
  svc->done_tail = NULL;
  dp_server_stop(svc->blocks_server);
  while (svc->apps) {
    exec_app *next = svc->apps->next;
    app_destroy(svc->apps);
    svc->apps = next;
  }
  block_manager_destroy(svc->blocks);
  claim_table_free(svc->claims);
  for (size_t i = 0; i < svc->num_peers; i++) claim_table_free(svc->peers[i].table);
  while (svc->results) {
    result_block *next = svc->results->next;
    fl_buf_free(&svc->results->bytes);
    common_free(svc->results);
    svc->results = next;
  }
  dp_client_destroy(svc->fetcher);
  rpc_channel_destroy(svc->driver);
  while (svc->libraries) {
    exec_library *next = svc->libraries->next;
    common_free(svc->libraries); /* the handles stay loaded until the process ends */
    svc->libraries = next;
  }
  if (svc->own_work_dir) common_remove_tree(svc->work_dir);
  pthread_cond_destroy(&svc->wake);
  pthread_cond_destroy(&svc->stop_wake);
  pthread_mutex_destroy(&svc->lock);
}

/* While the first registration waits for the driver: a stop request gives it up. */
typedef struct stop_watch {
  exec_service *svc;
  volatile sig_atomic_t *stop;
  atomic_bool done; /* the registration returned */
} stop_watch;

static void *stop_watch_main(void *arg) {
  stop_watch *w = arg;
  while (!atomic_load(&w->done) && !*w->stop) usleep(20000);
  if (*w->stop) atomic_store(&w->svc->abandon, true);
  return NULL;
}

fl_status executor_serve(const executor_config *cfg, volatile sig_atomic_t *stop) {
  if (!cfg->driver || !*cfg->driver) return FL_ERR(FL_EINVAL, "executor: no driver address");
  if (cfg->cores == 0 || cfg->cores > 1024) return FL_ERR(FL_EINVAL, "executor: --cores must be 1 to 1024");
  if (cfg->memory < (1u << 20)) return FL_ERR(FL_EINVAL, "executor: --memory must be at least 1m");
  exec_service svc;
  memset(&svc, 0, sizeof svc);
  svc.cfg = *cfg;
  if (!svc.cfg.host || !*svc.cfg.host) svc.cfg.host = "127.0.0.1";
  if (!svc.cfg.shuffle_memory) svc.cfg.shuffle_memory = 64u << 20;
  FL_PCHECK(pthread_mutex_init(&svc.lock, NULL));
  FL_PCHECK(pthread_cond_init(&svc.wake, NULL));
  FL_PCHECK(pthread_cond_init(&svc.stop_wake, NULL));
  common_log_set_role("executor");
  common_spin_default_for_server();
  settings_read(&svc);
  fl_status status = FL_OK;

  const char *base = cfg->work_dir && *cfg->work_dir ? cfg->work_dir : getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  FL_CHECK(common_mkdirs(base));
  snprintf(svc.work_dir, sizeof svc.work_dir, "%s/flint-executor-XXXXXX", base);
  if (!mkdtemp(svc.work_dir)) {
    status = FL_ERR(FL_EIO, "cannot create a work folder in %s: %s", base, strerror(errno));
    goto cleanup;
  }
  svc.own_work_dir = true;
  char sub[PATH_MAX + 16];
  snprintf(sub, sizeof sub, "%s/lib", svc.work_dir);
  FL_CHECK(common_mkdirs(sub));
  snprintf(sub, sizeof sub, "%s/blocks", svc.work_dir);
  FL_CHECK(common_mkdirs(sub));
  const char *report_fd = getenv(EXECUTOR_REPORT_FD_ENV);
  if (report_fd && *report_fd) {
    FL_CHECK(executor_report_open(report_fd, getenv(EXECUTOR_RUNNING_FD_ENV), svc.work_dir));
    svc.supervised = true;
  }
  /* Every shared block keeps a descriptor: allow as many as the hard limit does. */
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  FL_CHECK(block_manager_create(cfg->memory, sub, true, &svc.blocks));
  shared_block_node(svc.node);
  svc.pid = (uint32_t)getpid();
  if (claim_table_create(&svc.claims) != FL_OK) /* then its tasks are its own: none is offered */
    common_log(LOG_WARN, "no claim table, so node peers cannot take this executor's tasks: %s", fl_last_error());
  FL_CHECK(task_pool_create(cfg->cores, "fl-task", &svc.pool));
  FL_CHECK(dp_client_create(cfg->secret, &svc.fetcher));
  FL_CHECK(dp_server_start(svc.cfg.host, 0, cfg->secret, serve_block, &svc, &svc.blocks_server));
  char listen[96];
  snprintf(listen, sizeof listen, "%s:0", svc.cfg.host);
  rpc_server_config rc = {.listen = listen, .secret = cfg->secret, .handler = executor_handle,
                          .quick = executor_quick, .quick_methods = quick_methods,
                          .handler_arg = &svc};
  FL_CHECK(rpc_server_start(&rc, &svc.server));
  /* Large enough for a barrier checkpoint (512 MiB) and its envelope. */
  FL_CHECK(rpc_channel_create(cfg->driver, cfg->secret, RDD_BARRIER_CHECKPOINT_MAX + ((size_t)1 << 20), &svc.driver));
  stop_watch watch = {&svc, stop, false};
  pthread_t watcher;
  bool watching = pthread_create(&watcher, NULL, stop_watch_main, &watch) == 0;
  status = register_with_driver(&svc, RPC_TIMEOUT_MS);
  atomic_store(&watch.done, true);
  if (watching) pthread_join(watcher, NULL);
  if (status != FL_OK && *stop) { /* stopped while the driver did not answer: not an error */
    common_log(LOG_INFO, "stopped before the driver at %s answered the registration", cfg->driver);
    status = FL_OK;
    goto cleanup;
  }
  if (status != FL_OK) {
    common_error_wrap(status, "cannot register with the driver at %s: ", cfg->driver);
    goto cleanup;
  }
  common_log(LOG_INFO, "registered with the driver at %s: %u cores, %llu MiB, blocks on port %d",
             cfg->driver, cfg->cores, (unsigned long long)(cfg->memory >> 20),
             dp_server_port(svc.blocks_server));
  if (pthread_create(&svc.status_thread, NULL, status_main, &svc) != 0 ||
      pthread_create(&svc.heartbeat_thread, NULL, heartbeat_main, &svc) != 0) {
    status = FL_ERR(FL_ENOMEM, "cannot start the executor's threads");
    goto cleanup;
  }
  while (!*stop && !atomic_load(&svc.fatal)) usleep(20000);
  if (atomic_load(&svc.fatal)) {
    /* Tasks that ignore kills hold pool threads, which a clean stop would join for ever: the
     * process ends here (its supervisor starts a clean one), leaving only its folder behind. */
    fprintf(stderr, "flint executor: %s\n", svc.fatal_error);
    if (svc.own_work_dir) common_remove_tree(svc.work_dir);
    _exit(1);
  }
  common_log(LOG_INFO, "stopping");
cleanup:
  service_destroy(&svc);
  return status;
}
