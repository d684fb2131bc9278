/*
 * cluster_registry.c: the executor registry. Executors register (RegisterExecutor: their
 * addresses, cores, memory, GPU, node) and heartbeat with their figures; their supervisors
 * report their death (ExecutorExited), which charges the attempt that killed them. The
 * driver's calls to every executor at once (dropping an application's blocks or a broadcast,
 * asking what they cache) and the executors' description for status are here too.
 *
 * Threading: any handler thread; the registry is under cb->lock, and executors join the
 * scheduler on its thread.
 */
#include <stdio.h>
#include <string.h>

#include "driver/cluster_internal.h"

#define INFO_TIMEOUT_MS 5000 /* a StorageInfo call to one executor */

/* A live executor by id (cb->lock, or the scheduler thread). */
executor_ref *cluster_find_executor(cluster_backend *cb, uint64_t id) {
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (e->id == id && !e->lost) return e;
  return NULL;
}

/* An executor by id, lost or not (kept until pruned). */
executor_ref *cluster_find_any_executor(cluster_backend *cb, uint64_t id) {
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (e->id == id) return e;
  return NULL;
}

/* On the scheduler thread: tasks may be placed on the executor, unless it was lost before. */
static void executor_joined(scheduler *s, void *arg) {
  executor_ref *e = arg;
  if (e->removed) return;
  sched_executor_info info = {.id = e->id, .node = e->node, .cores = e->cores, .slots = e->slots, .gpu = e->gpu};
  scheduler_executor_added(s, &info);
}

fl_status cluster_register(cluster_backend *cb, const char *host, uint32_t rpc_port,
                           uint32_t data_port, uint32_t ps_port, uint32_t cores, uint64_t memory, int32_t gpu, const char *node,
                           uint32_t pid, bool supervised, uint64_t *id) {
  if (!host || !*host || strlen(host) > 60 || rpc_port == 0 || rpc_port > 65535 || data_port == 0 ||
      data_port > 65535 || cores == 0 || cores > 1024)
    return FL_ERR(FL_EPROTO, "RegisterExecutor: invalid host, ports or cores");
  if (node && strlen(node) >= sizeof ((executor_ref *)0)->node)
    return FL_ERR(FL_EPROTO, "RegisterExecutor: a node id of %zu bytes (at most 39)", strlen(node));
  executor_ref *e = common_calloc(1, sizeof *e);
  if (!e) return FL_ERR(FL_ENOMEM, "out of memory");
  snprintf(e->node, sizeof e->node, "%s", node ? node : "");
  e->pid = pid;
  e->supervised = supervised;
  snprintf(e->rpc_address, sizeof e->rpc_address, "%s:%u", host, rpc_port);
  snprintf(e->data_address, sizeof e->data_address, "%s:%u", host, data_port);
  if (ps_port > 0 && ps_port <= 65535) snprintf(e->ps_address, sizeof e->ps_address, "%s:%u", host, ps_port);
  e->cores = cores;
  e->gpu = gpu;
  e->slots = cores * cb->cfg.slots_per_core;
  e->memory = memory;
  e->last_heartbeat_ns = common_now_ns();
  fl_status st = rpc_channel_create(e->rpc_address, cb->cfg.secret, 0, &e->channel);
  if (st != FL_OK) {
    common_free(e);
    return st;
  }
  cluster_sender_args *args = common_malloc(sizeof *args);
  FL_PCHECK(pthread_cond_init(&e->sender_wake, NULL));
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  e->id = ++cb->next_executor_id;
  if (args) *args = (cluster_sender_args){cb, e};
  if (!args || pthread_create(&e->sender, NULL, cluster_sender_main, args) != 0) {
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    common_free(args);
    pthread_cond_destroy(&e->sender_wake);
    rpc_channel_destroy(e->channel);
    common_free(e);
    return FL_ERR(FL_ENOMEM, "cannot start a sender thread");
  }
  e->cb = cb;
  e->next = cb->executors;
  cb->executors = e;
  cb->no_executor_since_ns = 0;
  cb->ever_registered = true;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  *id = e->id;
  char gpu_s[24] = "";
  if (gpu >= 0) snprintf(gpu_s, sizeof gpu_s, ", GPU %d", (int)gpu);
  common_log(LOG_INFO, "executor %llu registered: %s, %u cores, %llu MiB%s", (unsigned long long)e->id,
             e->rpc_address, cores, (unsigned long long)(memory >> 20), gpu_s);
  ui_postf(cb->cfg.ui, "{\"Event\":\"ExecutorAdded\",\"Executor\":%llu,\"Host\":\"%s\",\"Cores\":%u,\"Memory\":%llu,\"GPU\":%d}",
           (unsigned long long)e->id, e->rpc_address, cores, (unsigned long long)memory, (int)gpu);
  return scheduler_post_call(cb->base.sched, executor_joined, e);
}

bool cluster_heartbeat(cluster_backend *cb, uint64_t executor, uint64_t incarnation,
                       uint64_t cached_bytes, uint64_t tasks_run, uint64_t tasks_failed) {
  if (incarnation != cb->cfg.incarnation) return false; /* an earlier driver's executor id */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = cluster_find_executor(cb, executor);
  if (e) {
    e->cached_bytes = cached_bytes;
    e->tasks_run = tasks_run;
    e->tasks_failed = tasks_failed;
    e->last_heartbeat_ns = common_now_ns();
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return e != NULL;
}

/* A late report's charge, for the scheduler thread. */
typedef struct late_charge {
  uint64_t job;
  uint32_t stage, index;
  char why[];
} late_charge;

static void charge_late(scheduler *s, void *arg) {
  late_charge *c = arg;
  scheduler_charge_task(s, c->job, c->stage, c->index, c->why);
  common_free(c);
}

bool cluster_executor_exited(cluster_backend *cb, uint64_t executor, uint64_t incarnation, const uint64_t *charged,
                             size_t num_charged, const char *why) {
  if (incarnation != cb->cfg.incarnation) return false;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = cb->executors;
  while (e && e->id != executor) e = e->next;
  bool live = e && !e->lost;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!e) return false;
  if (live && cluster_executor_lose(cb, e, why, charged, num_charged)) return true;
  /* Lost already, when a call to it failed before the report came: the attempts that killed
   * it are charged now, by task (they may be running again elsewhere). */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  common_log(LOG_WARN, "executor %llu at %s: %s", (unsigned long long)e->id, e->rpc_address, why);
  for (size_t i = 0; i < e->num_swept; i++) {
    late_charge *c = NULL;
    if (!cluster_key_in(e->swept[i].key, charged, num_charged) || !(c = common_malloc(sizeof *c + strlen(why) + 1))) continue;
    c->job = e->swept[i].job;
    c->stage = e->swept[i].stage;
    c->index = e->swept[i].index;
    strcpy(c->why, why);
    if (scheduler_post_call(cb->base.sched, charge_late, c) != FL_OK) common_free(c);
  }
  e->num_swept = 0; /* charged once */
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return true;
}

size_t cluster_ps_servers(cluster_backend *cb, cluster_ps_server *out, size_t max) {
  size_t n = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (!e->lost && e->ps_address[0]) {
      if (n < max) out[n] = (cluster_ps_server){.executor = e->id};
      if (n < max) snprintf(out[n].address, sizeof out[n].address, "%s", e->ps_address);
      n++;
    }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  /* Oldest first (the list is newest first): placements do not depend on arrival order. */
  size_t m = n < max ? n : max;
  for (size_t i = 0; i < m / 2; i++) {
    cluster_ps_server t = out[i];
    out[i] = out[m - 1 - i];
    out[m - 1 - i] = t;
  }
  return n;
}

uint32_t cluster_cores(cluster_backend *cb) {
  uint32_t n = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (!e->lost) n += e->cores;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return n;
}

fl_status cluster_describe(cluster_backend *cb, void ***infos, size_t *count) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  size_t n = 0;
  for (executor_ref *e = cb->executors; e; e = e->next) n++;
  Flint__ExecutorInfo **out = common_calloc(n + 1, sizeof *out);
  size_t k = 0;
  for (executor_ref *e = cb->executors; out && e; e = e->next) {
    Flint__ExecutorInfo *x = common_calloc(1, sizeof *x);
    if (!x) break;
    flint__executor_info__init(x);
    x->id = e->id;
    x->address = common_strdup(e->rpc_address);
    x->cores = e->cores;
    x->memory = e->memory;
    x->cached_bytes = e->cached_bytes;
    x->tasks_run = e->tasks_run;
    x->tasks_failed = e->tasks_failed;
    x->alive = !e->lost;
    x->has_gpu = e->gpu >= 0;
    x->gpu = e->gpu >= 0 ? (uint32_t)e->gpu : 0;
    x->heartbeat_age_ms = (common_now_ns() - e->last_heartbeat_ns) / 1000000u;
    out[k++] = x;
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!out) return FL_ERR(FL_ENOMEM, "out of memory");
  *infos = (void **)out;
  *count = k;
  return FL_OK;
}

/* Queues a Remove call for every live executor (best effort: what fails to go goes when the
 * application or the executor ends). */
static void remove_on_executors(cluster_backend *cb, const Flint__RemoveRequest *req) {
  fl_buf body = FL_BUF_INIT;
  if (proto_pack(&req->base, &body) != FL_OK) return; /* best effort, as below */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next) {
    if (e->lost) continue;
    outgoing *o = common_calloc(1, sizeof *o);
    if (!o || fl_buf_append(&o->body, body.data, body.len) != FL_OK) {
      common_free(o);
      continue; /* best effort: the blocks go when the application or executor ends */
    }
    o->method = "/flint.Executor/Remove";
    cluster_sender_push_or_drop_locked(cb, e, o);
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  fl_buf_free(&body);
}

void cluster_remove(cluster_backend *cb, uint64_t app, const uint64_t *rdd_ids, size_t num_rdds,
                    const uint64_t *shuffle_ids, size_t num_shuffles, bool whole_application) {
  Flint__RemoveRequest req = FLINT__REMOVE_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.n_rdd_ids = num_rdds;
  req.rdd_ids = (uint64_t *)rdd_ids;
  req.n_shuffle_ids = num_shuffles;
  req.shuffle_ids = (uint64_t *)shuffle_ids;
  req.whole_application = whole_application;
  remove_on_executors(cb, &req);
}

void cluster_remove_broadcast(cluster_backend *cb, uint64_t app, uint64_t broadcast_id) {
  Flint__RemoveRequest req = FLINT__REMOVE_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.n_broadcast_ids = 1;
  req.broadcast_ids = &broadcast_id;
  remove_on_executors(cb, &req);
}

/* Asks every live executor what it holds of the dataset (its block manager's figures) and
 * adds them up. False when none answered. */
bool cluster_storage_info(cluster_backend *cb, uint64_t app, uint64_t rdd_id, fl_storage_info *out,
                          uint64_t *evictions) {
  Flint__StorageInfoRequest req = FLINT__STORAGE_INFO_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.rdd_id = rdd_id;
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  if (proto_pack(&req.base, &body) != FL_OK) return false;
  executor_ref **asked = NULL;
  size_t n = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next) n += !e->lost;
  if (n && (asked = common_calloc(n, sizeof *asked))) {
    n = 0;
    for (executor_ref *e = cb->executors; e; e = e->next)
      if (!e->lost) {
        e->queries++;
        asked[n++] = e;
      }
  } else {
    n = 0;
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  bool any = false;
  for (size_t i = 0; i < n; i++) { /* one at a time: a few ms each on a local network */
    reply.len = 0;
    if (rpc_call(asked[i]->channel, "/flint.Executor/StorageInfo", fl_buf_bytes(&body), INFO_TIMEOUT_MS, &reply) != FL_OK)
      continue;
    Flint__StorageInfoReply *r = flint__storage_info_reply__unpack(NULL, reply.len, reply.data);
    if (!r) continue;
    out->cached_partitions += r->cached_partitions;
    out->memory_bytes += r->memory_bytes;
    out->disk_bytes += r->disk_bytes;
    if (evictions) *evictions += r->evictions;
    any = true;
    flint__storage_info_reply__free_unpacked(r, NULL);
  }
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (size_t i = 0; i < n; i++) asked[i]->queries--;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  common_free(asked);
  fl_buf_free(&reply);
  fl_buf_free(&body);
  return any;
}
