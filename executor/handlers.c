/*
 * handlers.c: what the executor answers: the driver's control-plane calls (LaunchTasks,
 * KillTasks, Remove, StorageInfo) and the block server's requests (cached blocks for peers,
 * shuffle output for reducers, large task results for the driver).
 *
 * Threading: launches and kills are answered on the rpc queue's thread (exec_handle_quick), the
 * rest, and a launch that must fetch a library first, on gRPC's handler threads; block
 * requests on the block server's event loop. A handler takes svc->lock or an application's
 * lock only while it reads or changes their state, never over a fetch, and holds the
 * application it works on so that it cannot go meanwhile.
 */
#include <string.h>

#include "executor/internal.h"

/* ---- control-plane handlers ------------------------------------------------------------ */

/* Unpacks a driver's request (`desc`, called `name` in errors) into *out, and refuses one of
 * another driver incarnation (every such message has the field `incarnation`). On failure
 * *out is NULL and nothing is left to free. */
static fl_status unpack_from_driver(exec_service *svc, const ProtobufCMessageDescriptor *desc, const char *name,
                                    fl_bytes body, void *out) {
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, body.len, body.data);
  *(void **)out = NULL;
  if (!m) return FL_ERR(FL_EPROTO, "%s: malformed message", name);
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(desc, "incarnation");
  FL_ASSERT(f && f->type == PROTOBUF_C_TYPE_UINT64);
  uint64_t incarnation;
  memcpy(&incarnation, (const char *)m + f->offset, sizeof incarnation);
  fl_status st = exec_driver_check_incarnation(svc, incarnation, name);
  if (st != FL_OK) {
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
  }
  *(void **)out = m;
  return FL_OK;
}

static fl_status handle_launch(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__LaunchTasksRequest *req;
  fl_status status = unpack_from_driver(svc, &flint__launch_tasks_request__descriptor, "LaunchTasks", body, &req);
  if (status != FL_OK) return status;
  exec_app *app = NULL;
  /* The launch holds the application (driver_forget may run meanwhile); checked again under
   * the lock, so that no application of a driver being forgotten is made. */
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  status = atomic_load(&svc->incarnation) == req->incarnation
               ? exec_app_get_or_create(svc, req->app_id, &app)
               : FL_ERR(FL_ESTATE, "LaunchTasks: the executor is leaving the driver of incarnation %016llx",
                        (unsigned long long)req->incarnation);
  if (status == FL_OK) atomic_fetch_add(&app->tasks_running, 1);
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  if (status != FL_OK) goto cleanup;

  FL_PCHECK(pthread_mutex_lock(&app->lock));
  status = exec_app_launch_update(app, req);
  /* Decode every task before starting any, so that a bad one refuses the whole batch. */
  /* tasks[0, n) as decoded; tasks[n, 2n) the order they are queued in */
  exec_task **tasks = common_calloc(req->n_tasks ? 2 * req->n_tasks : 1, sizeof *tasks);
  if (!tasks && status == FL_OK) status = FL_ERR(FL_ENOMEM, "out of memory");
  for (size_t i = 0; status == FL_OK && i < req->n_tasks; i++) {
    exec_task *t = tasks[i] = common_calloc(1, sizeof *t);
    status = t ? exec_task_decode(app, req, req->tasks[i], t) : FL_ERR(FL_ENOMEM, "out of memory");
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status == FL_OK) {
    exec_task_queue(app, req, tasks);
  } else if (tasks) {
    for (size_t i = 0; i < req->n_tasks; i++)
      if (tasks[i]) exec_task_free(tasks[i]);
  }
  common_free(tasks);
  if (status == FL_OK) {
    Flint__Empty empty = FLINT__EMPTY__INIT;
    status = proto_pack(&empty.base, response);
  }
cleanup:
  if (app) { /* the launch's hold */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = exec_app_release_locked(svc, app);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) exec_app_remove_all(svc, gone);
  }
  flint__launch_tasks_request__free_unpacked(req, NULL);
  return status;
}

static fl_status handle_kill(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__KillTasksRequest *req;
  fl_status st = unpack_from_driver(svc, &flint__kill_tasks_request__descriptor, "KillTasks", body, &req);
  if (st != FL_OK) return st;
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
  Flint__RemoveRequest *req;
  fl_status st = unpack_from_driver(svc, &flint__remove_request__descriptor, "Remove", body, &req);
  if (st != FL_OK) return st;
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
    for (size_t i = 0; i < req->n_rdd_ids; i++) exec_app_remove_rdd(app, req->rdd_ids[i]);
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    for (size_t i = 0; i < req->n_shuffle_ids; i++) {
      rdd_shuffle_dep const *dep = rdd_plan_find_shuffle(app->plan, req->shuffle_ids[i]);
      if (dep) exec_app_shuffle_remove(app, req->shuffle_ids[i], dep->parent->num_partitions);
    }
    exec_app_forget_locations(app, req->rdd_ids, req->n_rdd_ids, req->shuffle_ids, req->n_shuffle_ids);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = exec_app_release_locked(svc, app);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    if (gone) exec_app_remove_all(svc, gone);
  }
  flint__remove_request__free_unpacked(req, NULL);
  Flint__Empty empty = FLINT__EMPTY__INIT;
  return proto_pack(&empty.base, response);
}

static fl_status handle_storage_info(exec_service *svc, fl_bytes body, fl_buf *response) {
  Flint__StorageInfoRequest *req;
  fl_status st = unpack_from_driver(svc, &flint__storage_info_request__descriptor, "StorageInfo", body, &req);
  if (st != FL_OK) return st;
  fl_storage_info info = {0};
  block_manager_stats whole = {0};
  bool known = false;
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  for (exec_app *a = svc->apps; a; a = a->next)
    if (a->id == req->app_id) {
      known = true;
      if (req->rdd_id) exec_app_info(a, req->rdd_id, &info); /* the block manager's own lock */
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
const char *const exec_handle_quick_methods[] = {"/flint.Executor/LaunchTasks", "/flint.Executor/KillTasks", NULL};

bool exec_handle_quick(void *arg, const rpc_request *req, fl_buf *response, fl_status *status) {
  exec_service *svc = arg;
  if (strcmp(req->method, exec_handle_quick_methods[1]) == 0) {
    *status = handle_kill(svc, req->body, response);
    return true;
  }
  exec_app_quick_begin();
  *status = handle_launch(svc, req->body, response);
  if (!exec_app_quick_end()) return true;
  fl_buf_free(response);
  return false;
}

fl_status exec_handle_rpc(void *arg, const rpc_request *req, fl_buf *response) {
  exec_service *svc = arg;
  if (strcmp(req->method, "/flint.Executor/LaunchTasks") == 0) return handle_launch(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/KillTasks") == 0) return handle_kill(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/Remove") == 0) return handle_remove(svc, req->body, response);
  if (strcmp(req->method, "/flint.Executor/StorageInfo") == 0) return handle_storage_info(svc, req->body, response);
  return FL_ERR(FL_EINVAL, "unknown method %s", req->method);
}

/* ---- block server ---------------------------------------------------------------------- */

fl_status exec_handle_block(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
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

