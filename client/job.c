/*
 * job.c: an action of a remote context, run as one RunJob on the driver. The request carries
 * what the driver lacks of the lineage (plan_send.c) and of the small broadcasts
 * (broadcast.c); the reply carries the results, inline or parked on the driver to be read in
 * chunks, the job's counters and its accumulator updates, which are merged here. A lineage
 * with a barrier stage whose reports are wanted has them read while the job runs and
 * delivered on the action's thread.
 *
 * Threading: client_job_run runs on the action's thread and blocks until the job ends; jobs
 * of one context may run at once from several threads. With barrier reports, the RunJob
 * call goes on a thread of its own (fl-call) while the action's thread reads the reports.
 */
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"

/* ---- results --------------------------------------------------------------------------- */

/* Reads result `index` of an operation, which waits on the driver, into *out in chunks. */
static fl_status fetch_parked(remote_context *c, uint64_t operation_id, uint32_t index, uint64_t size,
                              fl_buf *out) {
  out->len = 0;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = fl_buf_reserve(out, size);
  while (st == FL_OK && out->len < size) {
    Flint__FetchResultRequest req = FLINT__FETCH_RESULT_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    req.operation_id = operation_id;
    req.index = index;
    req.offset = out->len;
    st = client_rpc_call(c->driver, "/flint.Driver/FetchResult", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
    if (st != FL_OK) break;
    Flint__FetchResultReply *rep = flint__fetch_result_reply__unpack(NULL, reply.len, reply.data);
    if (!rep || rep->chunk.len == 0 || rep->chunk.len > size - out->len)
      st = FL_ERR(FL_EPROTO, "FetchResult: a malformed chunk of result %u from the driver", index);
    else
      st = fl_buf_append(out, rep->chunk.data, rep->chunk.len);
    if (rep) flint__fetch_result_reply__free_unpacked(rep, NULL);
  }
  fl_buf_free(&reply);
  return st;
}

/* A RunJob reply's results into results[0..num_parts): inline ones copied, the others read
 * from the driver. */
static fl_status take_results(remote_context *c, uint64_t operation_id, const Flint__RunJobReply *rep,
                              uint32_t num_parts, fl_buf *results) {
  if (rep->n_results != num_parts || rep->n_sizes != num_parts)
    return FL_ERR(FL_EPROTO, "RunJob: a reply with %zu results for %u partitions", rep->n_results, num_parts);
  for (uint32_t i = 0; i < num_parts; i++) {
    const ProtobufCBinaryData *r = &rep->results[i];
    if (r->len != rep->sizes[i] && r->len != 0)
      return FL_ERR(FL_EPROTO, "RunJob: result %u of %zu bytes, announced %llu", i, r->len,
                    (unsigned long long)rep->sizes[i]);
  }
  fl_status st = FL_OK;
  for (uint32_t i = 0; i < num_parts && st == FL_OK; i++) {
    const ProtobufCBinaryData *r = &rep->results[i];
    results[i].len = 0;
    st = r->len == rep->sizes[i] ? fl_buf_append(&results[i], r->data, r->len)
                                 : fetch_parked(c, operation_id, i, rep->sizes[i], &results[i]);
  }
  return st;
}

/* ---- barrier reports: read while the job runs, delivered on the action's thread ---------- */

static void deliver_report(rdd *r, fl_bytes rec) {
  uint64_t rdd_id;
  uint32_t rank;
  fl_bytes msg;
  if (rec.len >= 12) {
    memcpy(&rdd_id, rec.data, 8);
    memcpy(&rank, rec.data + 8, 4);
    msg = (fl_bytes){rec.data + 12, rec.len - 12};
    rdd_barrier_deliver(r, rdd_id, rank, msg);
  }
}

typedef struct run_call {
  remote_context *c;
  const Flint__RunJobRequest *req;
  fl_buf *reply;
  fl_status status;
  char error[1024];
  atomic_bool done;
} run_call;

static void *run_call_main(void *p) {
  pthread_setname_np(pthread_self(), "fl-call");
  run_call *rc = p;
  rc->status = client_rpc_call(rc->c->driver, "/flint.Driver/RunJob", &rc->req->base, 0, rc->reply);
  if (rc->status != FL_OK) snprintf(rc->error, sizeof rc->error, "%s", fl_last_error());
  atomic_store(&rc->done, true);
  return NULL;
}

/* Reports wait in the driver; RunJob blocks until the job ends. So RunJob goes on a thread
 * of its own while this one reads reports (long polls) and calls on_report; what is left at
 * the end comes in RunJob's reply. */
static fl_status run_job_with_reports(remote_context *c, rdd *r, const Flint__RunJobRequest *req, fl_buf *reply) {
  run_call rc = {.c = c, .req = req, .reply = reply};
  atomic_init(&rc.done, false);
  pthread_t th;
  if (pthread_create(&th, NULL, run_call_main, &rc) != 0) return FL_ERR(FL_ENOMEM, "cannot start a thread");
  fl_buf got = FL_BUF_INIT;
  while (!atomic_load(&rc.done)) {
    Flint__BarrierReportsRequest q = FLINT__BARRIER_REPORTS_REQUEST__INIT;
    q.app_id = c->app_id;
    q.incarnation = c->incarnation;
    q.operation_id = req->operation_id;
    q.wait_ms = 200;
    if (client_rpc_call(c->driver, "/flint.Driver/BarrierReports", &q.base, CLIENT_RPC_TIMEOUT_MS, &got) !=
        FL_OK) {
      usleep(50000); /* the RunJob call will say what is wrong */
      continue;
    }
    Flint__BarrierReportsReply *rep = flint__barrier_reports_reply__unpack(NULL, got.len, got.data);
    for (size_t i = 0; rep && i < rep->n_reports; i++)
      deliver_report(r, (fl_bytes){rep->reports[i].data, rep->reports[i].len});
    if (rep) flint__barrier_reports_reply__free_unpacked(rep, NULL);
  }
  pthread_join(th, NULL);
  fl_buf_free(&got);
  if (rc.status != FL_OK) return fl_set_error(rc.status, "%s", rc.error);
  return FL_OK;
}

/* ---- the job --------------------------------------------------------------------------- */

/* A delivered RunJob's reply: results, counters, the reports left and accumulator updates. */
static fl_status take_reply(remote_context *c, rdd *r, uint64_t operation_id, bool reports, fl_buf *reply,
                            uint32_t num_parts, fl_buf *results) {
  Flint__RunJobReply *rep = flint__run_job_reply__unpack(NULL, reply->len, reply->data);
  if (!rep) return FL_ERR(FL_EPROTO, "RunJob: malformed reply from the driver");
  fl_status st = take_results(c, operation_id, rep, num_parts, results);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  c->tasks_run += rep->attempts;
  c->tasks_failed += rep->attempts_failed;
  c->task_ns += rep->task_ns;
  c->blocks_mapped += rep->blocks_mapped;
  c->blocks_fetched += rep->blocks_fetched;
  c->input_bytes += rep->input_bytes;
  c->shuffle_read_bytes += rep->shuffle_read_bytes;
  c->shuffle_write_bytes += rep->shuffle_write_bytes;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  for (size_t i = 0; reports && i < rep->n_barrier_reports; i++)
    deliver_report(r, (fl_bytes){rep->barrier_reports[i].data, rep->barrier_reports[i].len});
  for (size_t i = 0; i < rep->n_acc_updates; i++) {
    fl_status as = rdd_shared_merge_update(c->pub.shared, rep->acc_updates[i]->id,
                                           (fl_bytes){rep->acc_updates[i]->value.data,
                                                      rep->acc_updates[i]->value.len});
    if (as != FL_OK) fprintf(stderr, "flint: %s\n", fl_last_error());
  }
  flint__run_job_reply__free_unpacked(rep, NULL);
  return st;
}

/* A RunJob: the job, or (service not NULL) a service call on r. */
static fl_status run_on_driver(remote_context *c, rdd *r, const uint32_t *parts, uint32_t num_parts,
                               const rdd_action *action, const char *service, fl_bytes request, fl_buf *results) {
  client_plan plan;
  fl_status st = client_plan_send_encode(c, r, action, &plan);
  if (st != FL_OK) {
    client_plan_send_settle(c, &plan, false);
    return st;
  }
  Flint__RunJobRequest req = FLINT__RUN_JOB_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.plan = (ProtobufCBinaryData){plan.plan.len, plan.plan.data};
  req.rdd_id = r->id;
  req.n_partitions = num_parts;
  req.partitions = (uint32_t *)parts;
  req.action = (ProtobufCBinaryData){plan.action.len, plan.action.data};
  req.n_levels = plan.levels.count;
  req.levels = plan.levels.ptrs;
  req.n_released = plan.num_released;
  req.released = plan.released;
  req.operation_id = atomic_fetch_add(&c->next_operation, 1);
  client_inline_out bcasts;
  client_broadcast_take_inline(c, &bcasts);
  req.n_broadcasts = bcasts.n;
  req.broadcasts = bcasts.ptrs;
  req.n_removed_broadcasts = bcasts.num_removed;
  req.removed_broadcasts = bcasts.removed;
  if (service) {
    req.service = (char *)service;
    req.service_request = (ProtobufCBinaryData){request.len, (uint8_t *)request.data};
  }
  bool reports = !service && rdd_barrier_reports_wanted(r);
  fl_buf reply = FL_BUF_INIT;
  if (reports) st = run_job_with_reports(c, r, &req, &reply);
  else st = client_rpc_call(c->driver, "/flint.Driver/RunJob", &req.base, 0, &reply);
  /* A failed call may have reached the driver or not: what it carried goes again (the driver
   * takes a broadcast it has, or the removal of one it lacks, as a no-op). */
  client_broadcast_settle_inline(c, &bcasts, st == FL_OK);
  client_plan_send_settle(c, &plan, st == FL_OK);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (st == FL_OK) c->jobs_run++;
  else c->jobs_failed++;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  if (st == FL_OK) st = take_reply(c, r, req.operation_id, reports, &reply, num_parts, results);
  fl_buf_free(&reply);
  return st;
}

fl_status client_job_run(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                         const rdd_action *action, fl_buf *results) {
  return run_on_driver(impl, r, parts, num_parts, action, NULL, fl_bytes_of(NULL, 0), results);
}

/* rdd_runtime_ops.call_service: the driver runs the service; its reply is the one result. */
fl_status client_call_service(void *impl, rdd *job, const char *name, fl_bytes request, fl_buf *reply) {
  if (job->num_partitions == 0) return FL_ERR(FL_EEMPTY, "fl_service_call: a dataset of no partitions");
  rdd_action collect = {.kind = RDD_ACTION_COLLECT}; /* carried, not run */
  uint32_t first = 0;
  fl_buf result = FL_BUF_INIT;
  fl_status st = run_on_driver(impl, job, &first, 1, &collect, name, request, &result);
  if (st == FL_OK && fl_buf_append(reply, result.data, result.len) != FL_OK) st = FL_ERR(FL_ENOMEM, "out of memory");
  fl_buf_free(&result);
  return st;
}
