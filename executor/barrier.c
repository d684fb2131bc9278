/*
 * barrier.c: barrier tasks' side of barrier stages: the rdd_barrier_ops of an application's
 * context, each a call to the driver's coordinator (driver/scheduler/barrier.c): gather a round of
 * messages, report, and put or get a checkpoint.
 *
 * Threading: called from task threads; each call blocks until the driver answers, and gives
 * up at once when the executor stops (svc->abandon). No state of its own.
 */
#include "executor/internal.h"

/* A barrier RPC's deadline beyond the wait it asks the driver for. */
#define BARRIER_RPC_SLACK_MS 10000

static fl_status barrier_rpc(exec_service *svc, const char *method, const ProtobufCMessage *msg, int64_t timeout_ms,
                             fl_buf *reply) {
  fl_buf body = FL_BUF_INIT;
  fl_status st = proto_pack(msg, &body);
  if (st == FL_OK) st = exec_driver_call(svc, method, fl_buf_bytes(&body), timeout_ms, &svc->abandon, reply);
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

const rdd_barrier_ops exec_barrier_ops = {exec_gather, exec_report, exec_put, exec_get};
