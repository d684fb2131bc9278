/*
 * handlers.c: the driver's RPC methods (service flint.Driver, proto/flint.proto): the
 * dispatch to each concern's file, and the calls of executors (registration, heartbeats,
 * their supervisors' reports of their death, task ends) and of barrier tasks (all_gather,
 * reports, checkpoints; the scheduler's barrier coordinator answers them).
 *
 * Threading: task statuses, heartbeats and RunJob come all the time and only decode and
 * post to the scheduler, so the rpc queue's thread takes them itself (handlers_quick), but
 * for a status update with a large result to fetch from its executor; every other call runs
 * on a handler thread of the rpc server's pool, and may block (a barrier gather waits for
 * its ranks, a long poll for output).
 */
#include <string.h>

#include "driver/driver_internal.h"

#define HEARTBEAT_MS 1000

/* ---- executors ------------------------------------------------------------------------------ */

static fl_status handle_register(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__RegisterExecutorRequest, req, body, "RegisterExecutor");
  uint64_t id = 0;
  fl_status st = req->has_gpu && req->gpu > 1023
                     ? FL_ERR(FL_EPROTO, "RegisterExecutor: GPU %u", req->gpu)
                     : cluster_register(d->cluster, req->host, req->rpc_port, req->data_port, req->ps_port, req->cores,
                                        req->memory, req->has_gpu ? (int32_t)req->gpu : -1, req->node, req->pid,
                                        req->supervised, &id);
  flint__register_executor_request__free_unpacked(req, NULL);
  if (st != FL_OK) return st;
  Flint__RegisterExecutorReply reply = FLINT__REGISTER_EXECUTOR_REPLY__INIT;
  reply.executor_id = id;
  reply.heartbeat_ms = HEARTBEAT_MS;
  reply.driver_data_port = (uint32_t)dp_server_port(d->blocks);
  reply.incarnation = d->incarnation;
  return proto_pack(&reply.base, response);
}

static fl_status handle_heartbeat(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__HeartbeatRequest, req, body, "Heartbeat");
  Flint__HeartbeatReply reply = FLINT__HEARTBEAT_REPLY__INIT;
  reply.unknown = !cluster_heartbeat(d->cluster, req->executor_id, req->incarnation, req->cached_bytes,
                                     req->tasks_run, req->tasks_failed);
  if (!reply.unknown && (req->n_blocks || req->blocks_dropped))
    apps_blocks_reported(d, req->executor_id, req->blocks, req->n_blocks, req->blocks_dropped);
  flint__heartbeat_request__free_unpacked(req, NULL);
  return proto_pack(&reply.base, response);
}

/* An executor's supervisor says its process died: the executor is lost now (its running
 * tasks fail, and count as failures: Spark's ExecutorLostFailure caused by the app), with the
 * cause in words: the signal or exit status and, from its last words, the function and the
 * partition that ran it. */
static fl_status handle_executor_exited(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__ExecutorExitedRequest, req, body, "ExecutorExited");
  char why[640], function[400] = "";
  int n = req->signal ? snprintf(why, sizeof why, "its process died by signal %d (%s)", req->signal,
                                 req->signal > 0 && req->signal < 65 ? strsignal(req->signal) : "unknown")
                      : snprintf(why, sizeof why, "its process exited with status %d", req->exit_code);
  if (req->task_key) {
    char library[160] = "";
    if (req->library[0]) libraries_name_of(d, req->library, library, sizeof library);
    if (req->symbol[0] || library[0])
      snprintf(function, sizeof function, " in function %s%s%s", req->symbol[0] ? req->symbol : "?",
               library[0] ? " of " : "", library);
    snprintf(why + n, sizeof why - (size_t)n, "%s, running partition %u of dataset %llu", function, req->partition,
             (unsigned long long)req->rdd_id);
  }
  /* The attempt that ran the fatal code, or, unnamed (an _exit, a kill), those that ran. */
  const uint64_t *charged = req->task_key ? &req->task_key : req->running;
  size_t num_charged = req->task_key ? 1 : req->n_running;
  bool known = cluster_executor_exited(d->cluster, req->executor_id, req->incarnation, charged, num_charged, why);
  flint__executor_exited_request__free_unpacked(req, NULL);
  if (!known) common_log(LOG_INFO, "an executor this driver no longer knows: %s", why);
  return driver_empty_reply(response);
}

/* ---- barrier stages (docs/barrier.md) ------------------------------------------------------- */

/* An executor's barrier task waits here (an RPC handler thread) for the other ranks. */
static fl_status handle_barrier_gather(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__BarrierGatherRequest, req, body, "BarrierGather");
  fl_status st = FL_OK;
  rdd_batch all = {FL_BUF_INIT, 0};
  ProtobufCBinaryData *bins = NULL;
  if (req->message.len > RDD_BARRIER_GATHER_MAX) {
    st = FL_ERR(FL_ELIMIT, "BarrierGather: a message of %zu bytes", req->message.len);
    goto done;
  }
  uint32_t timeout = req->timeout_ms ? req->timeout_ms : RDD_BARRIER_TIMEOUT_MS;
  st = barrier_gather(scheduler_barriers(d->sched), req->job_id, req->stage, req->attempt, req->rank, req->round,
                      (fl_bytes){req->message.data, req->message.len},
                      common_now_ns() + (uint64_t)timeout * 1000000u, call->cancelled, NULL, &all);
  if (st != FL_OK) goto done;
  Flint__BarrierGatherReply reply = FLINT__BARRIER_GATHER_REPLY__INIT;
  if (!(bins = common_calloc(all.count + 1, sizeof *bins))) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
    goto done;
  }
  rdd_cursor c = {all.buf.data, all.buf.data + all.buf.len};
  fl_bytes rec;
  while (reply.n_messages < all.count && rdd_cursor_next(&c, &rec))
    bins[reply.n_messages++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
  reply.messages = bins;
  st = proto_pack(&reply.base, response);
done:
  common_free(bins);
  rdd_batch_free(&all);
  flint__barrier_gather_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_barrier_report(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BarrierReportRequest, req, body, "BarrierReport");
  fl_status st = req->message.len > RDD_BARRIER_REPORT_MAX
                     ? FL_ERR(FL_ELIMIT, "BarrierReport: a message of %zu bytes", req->message.len)
                     : barrier_report(scheduler_barriers(d->sched), req->job_id, req->rdd_id, req->rank,
                                      (fl_bytes){req->message.data, req->message.len});
  flint__barrier_report_request__free_unpacked(req, NULL);
  return st == FL_OK ? driver_empty_reply(response) : st;
}

static fl_status handle_barrier_checkpoint(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BarrierCheckpointRequest, req, body, "BarrierCheckpoint");
  fl_status st;
  if (req->get) {
    fl_buf state = FL_BUF_INIT;
    st = barrier_checkpoint_get(scheduler_barriers(d->sched), req->job_id, req->rdd_id, &state);
    if (st == FL_OK) {
      Flint__BarrierCheckpointReply reply = FLINT__BARRIER_CHECKPOINT_REPLY__INIT;
      reply.state = (ProtobufCBinaryData){state.len, state.data};
      st = proto_pack(&reply.base, response);
    }
    fl_buf_free(&state);
  } else {
    st = req->state.len > RDD_BARRIER_CHECKPOINT_MAX
             ? FL_ERR(FL_ELIMIT, "BarrierCheckpoint: a state of %zu bytes", req->state.len)
             : barrier_checkpoint_put(scheduler_barriers(d->sched), req->job_id, req->stage, req->attempt, req->rdd_id,
                                      (fl_bytes){req->state.data, req->state.len});
    if (st == FL_OK) st = driver_empty_reply(response);
  }
  flint__barrier_checkpoint_request__free_unpacked(req, NULL);
  return st;
}

/* A client reads the reports of its running job (long poll). */
static fl_status handle_barrier_reports(driver_state *d, fl_bytes body, fl_buf *response, const rpc_request *call) {
  UNPACK(Flint__BarrierReportsRequest, req, body, "BarrierReports");
  driver_app *app;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st != FL_OK) {
    flint__barrier_reports_request__free_unpacked(req, NULL);
    return st;
  }
  uint32_t wait = req->wait_ms > MAX_WAIT_MS ? MAX_WAIT_MS : req->wait_ms;
  rdd_batch got = {FL_BUF_INIT, 0};
  barrier_wait_reports(scheduler_barriers(d->sched), app->id, req->operation_id,
                       common_now_ns() + (uint64_t)wait * 1000000u, call->cancelled, &got);
  Flint__BarrierReportsReply reply = FLINT__BARRIER_REPORTS_REPLY__INIT;
  ProtobufCBinaryData *bins = common_calloc(got.count + 1, sizeof *bins);
  if (!bins) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    rdd_cursor c = {got.buf.data, got.buf.data + got.buf.len};
    fl_bytes rec;
    while (reply.n_reports < got.count && rdd_cursor_next(&c, &rec))
      bins[reply.n_reports++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
    reply.reports = bins;
    st = proto_pack(&reply.base, response);
  }
  common_free(bins);
  rdd_batch_free(&got);
  apps_unpin(d, app);
  flint__barrier_reports_request__free_unpacked(req, NULL);
  return st;
}

/* ---- parameter-server tables (ps_placement.c) ---------------------------------------------- */

static fl_status handle_create_ps_table(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__CreatePsTableRequest, req, body, "CreatePsTable");
  driver_app *app = NULL;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) st = placement_create(d, req->app_id, req, response);
  apps_unpin(d, app);
  flint__create_ps_table_request__free_unpacked(req, NULL);
  return st;
}

static fl_status handle_drop_ps_table(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__DropPsTableRequest, req, body, "DropPsTable");
  driver_app *app = NULL;
  fl_status st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) st = placement_drop(d, req->app_id, req->table);
  apps_unpin(d, app);
  flint__drop_ps_table_request__free_unpacked(req, NULL);
  return st == FL_OK ? driver_empty_reply(response) : st;
}

/* ---- progress bars ---------------------------------------------------------------------------- */

#define PROGRESS_MAX_APPS 8    /* of one job binary */
#define PROGRESS_MAX_STAGES 64 /* in one reply */

/* StageProgress: the active stages of an application, or of a job binary's applications
 * (client/progress.c draws them). Blocks up to a second per application on the scheduler. */
static fl_status handle_stage_progress(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__StageProgressRequest, req, body, "StageProgress");
  uint64_t apps[PROGRESS_MAX_APPS];
  size_t num_apps = 0;
  if (req->submission_id) {
    FL_PCHECK(pthread_mutex_lock(&d->lock));
    pid_t pid = submissions_pid(d, req->submission_id);
    for (app_entry *a = d->apps; pid && a && num_apps < PROGRESS_MAX_APPS; a = a->next)
      if (a->app && a->pid == (uint32_t)pid) apps[num_apps++] = a->id;
    FL_PCHECK(pthread_mutex_unlock(&d->lock));
  } else if (req->app_id) {
    apps[num_apps++] = req->app_id;
  }
  flint__stage_progress_request__free_unpacked(req, NULL);
  sched_stage_progress stages[PROGRESS_MAX_STAGES];
  uint32_t n = 0;
  for (size_t i = 0; i < num_apps && n < PROGRESS_MAX_STAGES; i++) {
    uint32_t count;
    fl_status st = scheduler_progress(d->sched, apps[i], stages + n, PROGRESS_MAX_STAGES - n, &count);
    if (st != FL_OK) return st;
    n += count < PROGRESS_MAX_STAGES - n ? count : PROGRESS_MAX_STAGES - n;
  }
  Flint__StageProgress items[PROGRESS_MAX_STAGES], *ptrs[PROGRESS_MAX_STAGES];
  for (uint32_t i = 0; i < n; i++) {
    flint__stage_progress__init(&items[i]);
    items[i].stage = stages[i].stage;
    items[i].tasks = stages[i].tasks;
    items[i].completed = stages[i].completed;
    items[i].running = stages[i].running;
    ptrs[i] = &items[i];
  }
  Flint__StageProgressReply reply = FLINT__STAGE_PROGRESS_REPLY__INIT;
  reply.n_stages = n;
  reply.stages = ptrs;
  return proto_pack(&reply.base, response);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

/* Task statuses, heartbeats and jobs come all the time and only decode and post to the
 * scheduler, so the rpc queue's thread takes them itself, except a status update with a large
 * result to fetch from its executor. A job's call is answered when the job ends. */
const char *const handlers_quick_methods[] = {"/flint.Driver/StatusUpdate", "/flint.Driver/Heartbeat",
                                              "/flint.Driver/RunJob", NULL};

bool handlers_quick(void *arg, const rpc_request *call, fl_buf *response, fl_status *status) {
  driver_state *d = arg;
  if (strcmp(call->method, handlers_quick_methods[1]) == 0) {
    *status = handle_heartbeat(d, call->body, response);
    return true;
  }
  if (strcmp(call->method, handlers_quick_methods[2]) == 0) {
    *status = jobs_run_start(d, call);
    return true;
  }
  bool declined;
  *status = cluster_status_update(d->cluster, call->body, false, &declined);
  if (declined) return false;
  if (*status == FL_OK) *status = driver_empty_reply(response);
  return true;
}

fl_status handlers_dispatch(void *arg, const rpc_request *call, fl_buf *response) {
  driver_state *d = arg;
  const char *m = call->method;
  const char *prefix = "/flint.Driver/";
  if (strncmp(m, prefix, strlen(prefix)) != 0) return FL_ERR(FL_EINVAL, "unknown method %s", m);
  m += strlen(prefix);
  fl_bytes b = call->body;
  if (strcmp(m, "RegisterExecutor") == 0) return handle_register(d, b, response);
  if (strcmp(m, "Heartbeat") == 0) return handle_heartbeat(d, b, response);
  if (strcmp(m, "ExecutorExited") == 0) return handle_executor_exited(d, b, response);
  if (strcmp(m, "StatusUpdate") == 0) {
    bool declined;
    fl_status st = cluster_status_update(d->cluster, b, true, &declined);
    return st == FL_OK ? driver_empty_reply(response) : st;
  }
  if (strcmp(m, "OpenApplication") == 0) return apps_handle_open(d, b, response);
  if (strcmp(m, "CloseApplication") == 0) return apps_handle_close(d, b, response);
  if (strcmp(m, "KeepAlive") == 0) return apps_handle_keepalive(d, b, response);
  if (strcmp(m, "PostEvent") == 0) return apps_handle_post_event(d, b, response);
  if (strcmp(m, "CancelSubmission") == 0) return submissions_handle_cancel(d, b, response);
  if (strcmp(m, "HasLibrary") == 0) return libraries_handle_has(d, b, response);
  if (strcmp(m, "UploadLibrary") == 0) return libraries_handle_upload(d, b, response);
  if (strcmp(m, "BroadcastPut") == 0) return broadcasts_handle_put(d, b, response);
  if (strcmp(m, "BroadcastRemove") == 0) return broadcasts_handle_remove(d, b, response);
  if (strcmp(m, "RunJob") == 0) return jobs_run_start(d, call); /* answered at the job's end */
  if (strcmp(m, "FetchResult") == 0) return jobs_handle_fetch_result(d, b, response);
  if (strcmp(m, "CancelJobs") == 0) return jobs_handle_cancel(d, b, response);
  if (strcmp(m, "StorageInfo") == 0) return apps_handle_storage_info(d, b, response);
  if (strcmp(m, "Unpersist") == 0) return apps_handle_unpersist(d, b, response);
  if (strcmp(m, "Submit") == 0) return submissions_handle_submit(d, b, response);
  if (strcmp(m, "Output") == 0) return submissions_handle_output(d, b, response, call);
  if (strcmp(m, "SubmissionStatus") == 0) return submissions_handle_status(d, b, response);
  if (strcmp(m, "KillSubmission") == 0) return submissions_handle_kill(d, b, response, call);
  if (strcmp(m, "Status") == 0) return status_reply(d, response);
  if (strcmp(m, "StageProgress") == 0) return handle_stage_progress(d, b, response);
  if (strcmp(m, "BarrierGather") == 0) return handle_barrier_gather(d, b, response, call);
  if (strcmp(m, "BarrierReport") == 0) return handle_barrier_report(d, b, response);
  if (strcmp(m, "BarrierCheckpoint") == 0) return handle_barrier_checkpoint(d, b, response);
  if (strcmp(m, "BarrierReports") == 0) return handle_barrier_reports(d, b, response, call);
  if (strcmp(m, "CreatePsTable") == 0) return handle_create_ps_table(d, b, response);
  if (strcmp(m, "DropPsTable") == 0) return handle_drop_ps_table(d, b, response);
  return FL_ERR(FL_EINVAL, "unknown method %s", call->method);
}
