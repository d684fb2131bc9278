/*
 * jobs.c: the jobs of applications. A RunJob call records what it carries (plan nodes,
 * small broadcasts, storage levels, released datasets) and submits its job to the scheduler;
 * it is answered from the scheduler thread when the job ends (run_job_ended), so that no
 * thread waits on a job. A reply carries the results inline up to DRIVER_RESULT_INLINE bytes;
 * the rest wait on the driver (parked) for FetchResult. The client's going away, or
 * CancelJobs, cancels the job. Each application keeps a record of its last jobs for status.
 *
 * Threading: RunJob starts on the rpc queue's thread and never blocks; replies are packed on
 * the scheduler thread, or on d->replies when large. Job records are under d->lock, parked
 * results under app->lock.
 */
#include <stdio.h>
#include <string.h>

#include "driver/driver_internal.h"

/* A RunJob reply carries results inline up to this many bytes in all; the rest wait on the
 * driver and are read with FetchResult, this many bytes a call. */
#define DRIVER_RESULT_INLINE ((size_t)16 << 20)
#define DRIVER_RESULT_CHUNK ((size_t)32 << 20)

/* Records a job of the application that starts now; returns its id (1, 2, ... within the
 * application; 0 when the application is gone). */
static uint64_t job_note_start(driver_state *d, uint64_t app_id, uint32_t tasks) {
  uint64_t id = 0;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = apps_find(d, app_id);
  if (e) {
    id = ++e->num_jobs;
    job_record *j = &e->jobs[(id - 1) % JOBS_KEPT];
    *j = (job_record){.id = id, .tasks = tasks, .running = true, .status = FL_OK};
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return id;
}

/* Records how job `job_id` ended, unless newer jobs pushed its record out of the ring. */
static void job_note_end(driver_state *d, uint64_t app_id, uint64_t job_id, fl_status status, const char *error) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  app_entry *e = apps_find(d, app_id);
  job_record *j = e && job_id ? &e->jobs[(job_id - 1) % JOBS_KEPT] : NULL;
  if (j && j->id == job_id) {
    j->running = false;
    j->status = status;
    snprintf(j->error, sizeof j->error, "%s", error ? error : "");
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* Moves results[i] to the application's parked results; false when out of memory. */
static bool park_result(driver_app *app, uint64_t operation_id, uint32_t index, fl_buf *result) {
  parked_result *p = common_calloc(1, sizeof *p);
  if (!p) return false;
  p->operation_id = operation_id;
  p->index = index;
  p->data = *result;
  *result = (fl_buf)FL_BUF_INIT;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  p->next = app->parked;
  app->parked = p;
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  return true;
}

/* Drops what a failed reply parked: the client will not ask for it. */
static void unpark_operation(driver_app *app, uint64_t operation_id) {
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  for (parked_result **p = &app->parked; *p;) {
    if ((*p)->operation_id == operation_id) {
      parked_result *gone = *p;
      *p = gone->next;
      fl_buf_free(&gone->data);
      common_free(gone);
    } else {
      p = &(*p)->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
}

/* A RunJob call while its job runs: started on the rpc queue's thread (run_job_start), it
 * is answered from the scheduler thread when the job ends (run_job_ended), so no thread
 * waits on a job and the call costs no hand-off to a handler thread and back. */
typedef struct run_job {
  task_pool_work work; /* first: a large reply is packed on d->replies */
  driver_state *d;
  driver_app *app;
  Flint__RunJobRequest *req;
  rpc_deferred *call;
  driver_action action;
  bool have_action;
  rdd *r;
  fl_buf *results;
  rdd_batch reports_left;
  sched_job_stats stats;
  uint64_t job_id; /* the application's job number, for status (job_note_start) */
} run_job;

static void run_job_free(run_job *j) {
  rdd_batch_free(&j->reports_left);
  if (j->results)
    for (size_t i = 0; i < j->req->n_partitions; i++) fl_buf_free(&j->results[i]);
  common_free(j->results);
  if (j->have_action) rdd_action_clear(&j->action.action);
  if (j->r) rdd_release(j->r);
  apps_unpin(j->d, j->app);
  flint__run_job_request__free_unpacked(j->req, NULL);
  common_free(j);
}

/* The reply of a job that succeeded: results inline while they fit (the rest parked for
 * FetchResult), accumulator updates, the job's figures and barrier reports left. */
static fl_status run_job_reply(run_job *j, fl_buf *response) {
  driver_app *app = j->app;
  const Flint__RunJobRequest *req = j->req;
  fl_buf *results = j->results;
  fl_status status = FL_OK;
  ProtobufCBinaryData *report_bins = NULL;
  Flint__RunJobReply reply = FLINT__RUN_JOB_REPLY__INIT;
  ProtobufCBinaryData *bins = common_calloc(req->n_partitions + 1, sizeof *bins);
  uint64_t *sizes = common_calloc(req->n_partitions + 1, sizeof *sizes);
  /* Accumulator updates: taken from the application now, sent as one list. */
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  fl_buf accs = app->accumulators;
  app->accumulators = (fl_buf)FL_BUF_INIT;
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  size_t n_accs = 0;
  rdd_cursor c = {accs.data, accs.data + accs.len};
  while (c.p < c.end) {
    uint64_t id, len;
    size_t a = common_varint_get(c.p, c.end, &id);
    size_t b = a ? common_varint_get(c.p + a, c.end, &len) : 0;
    if (!b) break;
    c.p += a + b + len;
    n_accs++;
  }
  Flint__AccUpdate *acc_items = common_calloc(n_accs + 1, sizeof *acc_items);
  Flint__AccUpdate **acc_ptrs = common_calloc(n_accs + 1, sizeof *acc_ptrs);
  bool parked = false;
  if (!bins || !sizes || !acc_items || !acc_ptrs) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    /* Results inline, in order, while they fit; the rest wait for FetchResult. */
    size_t inline_bytes = 0;
    for (size_t i = 0; i < req->n_partitions && status == FL_OK; i++) {
      sizes[i] = results[i].len;
      if (results[i].len == 0) continue;
      if (inline_bytes + results[i].len <= DRIVER_RESULT_INLINE) {
        inline_bytes += results[i].len;
        bins[i] = (ProtobufCBinaryData){results[i].len, results[i].data};
      } else if (park_result(app, req->operation_id, (uint32_t)i, &results[i])) {
        parked = true;
      } else {
        status = FL_ERR(FL_ENOMEM, "out of memory");
      }
    }
    reply.n_results = req->n_partitions;
    reply.results = bins;
    reply.n_sizes = req->n_partitions;
    reply.sizes = sizes;
    c = (rdd_cursor){accs.data, accs.data + accs.len};
    for (size_t i = 0; i < n_accs; i++) {
      uint64_t id = 0, len = 0;
      c.p += common_varint_get(c.p, c.end, &id);
      c.p += common_varint_get(c.p, c.end, &len);
      flint__acc_update__init(&acc_items[i]);
      acc_items[i].id = id;
      acc_items[i].value = (ProtobufCBinaryData){len, (uint8_t *)c.p};
      acc_ptrs[i] = &acc_items[i];
      c.p += len;
    }
    reply.n_acc_updates = n_accs;
    reply.acc_updates = acc_ptrs;
    reply.attempts = j->stats.attempts;
    reply.attempts_failed = j->stats.attempts_failed;
    reply.task_ns = j->stats.task_ns;
    reply.blocks_mapped = j->stats.blocks_mapped;
    reply.blocks_fetched = j->stats.blocks_fetched;
    reply.input_bytes = j->stats.input_bytes;
    reply.shuffle_read_bytes = j->stats.shuffle_read_bytes;
    reply.shuffle_write_bytes = j->stats.shuffle_write_bytes;
    if (j->reports_left.count && (report_bins = common_calloc(j->reports_left.count, sizeof *report_bins))) {
      rdd_cursor rc = {j->reports_left.buf.data, j->reports_left.buf.data + j->reports_left.buf.len};
      fl_bytes rec;
      while (reply.n_barrier_reports < j->reports_left.count && rdd_cursor_next(&rc, &rec))
        report_bins[reply.n_barrier_reports++] = (ProtobufCBinaryData){rec.len, (uint8_t *)rec.data};
      reply.barrier_reports = report_bins;
    }
    if (status == FL_OK) status = proto_pack(&reply.base, response);
  }
  if (status != FL_OK && parked) unpark_operation(app, req->operation_id);
  common_free(report_bins);
  common_free(sizes);
  common_free(bins);
  common_free(acc_items);
  common_free(acc_ptrs);
  fl_buf_free(&accs);
  return status;
}

/* Answers the call with the job's outcome and frees j (any thread). j goes first: once the
 * reply is out, a stopping driver may free what j points to. */
static void run_job_answer(run_job *j, fl_status status, const char *error) {
  job_note_end(j->d, j->app->id, j->job_id, status, error);
  fl_buf response = FL_BUF_INIT;
  char message[1024] = "";
  if (status == FL_OK) status = run_job_reply(j, &response);
  else snprintf(message, sizeof message, "%s", error ? error : fl_strerror(status));
  if (status != FL_OK && !*message) snprintf(message, sizeof message, "%s", fl_last_error());
  rpc_deferred *call = j->call;
  run_job_free(j);
  rpc_deferred_reply(call, status, message, &response);
}

/* Results of more bytes than this are packed (copied twice: protobuf, gRPC) on a pool
 * thread, so that the scheduler thread does not stop every other job for milliseconds. The
 * pool is fixed (DRIVER_REPLY_THREADS): under load, replies wait in its queue, in the order their
 * jobs ended, instead of each taking a thread of its own. The queue holds at most one entry
 * per RunJob call in flight, whose results the driver holds already. */
#define RUN_JOB_REPLY_OFFLOAD ((size_t)1 << 20)

static void run_job_answer_work(task_pool_work *w) { run_job_answer((run_job *)w, FL_OK, NULL); }

/* The job ended (the scheduler thread): the call gets its reply. */
static void run_job_ended(void *arg, fl_status status, const char *error) {
  run_job *j = arg;
  size_t bytes = 0;
  for (size_t i = 0; status == FL_OK && i < j->req->n_partitions; i++) bytes += j->results[i].len;
  if (bytes > RUN_JOB_REPLY_OFFLOAD) {
    j->work.run = run_job_answer_work;
    task_pool_submit(j->d->replies, &j->work); /* never blocks */
    return;
  }
  run_job_answer(j, status, error);
}

/* ---- service calls (fl_service_call) ---- */

/* A service runs on a thread of its own: it runs jobs one after another (each blocks this
 * thread, not the scheduler's), and the call is answered when it returns. */
static void *service_main(void *arg) {
  run_job *j = arg;
  driver_state *d = j->d;
  const char *name = j->req->service;
  fl_service_fn fn = rdd_service_find(name);
  fl_status st = fn ? fn(j->r, (fl_bytes){j->req->service_request.data, j->req->service_request.len}, &j->results[0])
                    : FL_ERR(FL_ENOENT, "the driver has no service '%s' (services are registered by the libraries "
                             "that provide them, and the flint command's driver loads flint's own)", name);
  run_job_answer(j, st, st == FL_OK ? NULL : fl_last_error());
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  d->services_running--;
  pthread_cond_broadcast(&d->changed);
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return NULL;
}

static fl_status service_start(run_job *j) {
  driver_state *d = j->d;
  if (j->req->n_partitions != 1) return FL_ERR(FL_EPROTO, "RunJob: a service call with %zu partitions", j->req->n_partitions);
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  bool stopped = d->services_stopped;
  if (!stopped) d->services_running++;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  if (stopped) return FL_ERR(FL_ECANCELLED, "the driver is stopping: service '%s' does not start", j->req->service);
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, service_main, j);
  pthread_attr_destroy(&attr);
  if (rc == 0) return FL_OK;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  d->services_running--;
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  return FL_ERR(FL_ENOMEM, "cannot start a thread for service '%s'", j->req->service);
}

void jobs_services_stop(driver_state *d) {
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  d->services_stopped = true;
  for (app_entry *e = d->apps; e; e = e->next)
    if (e->app) {
      atomic_store(&e->app->closing, true);
      scheduler_cancel(d->sched, e->app->id, 0);
    }
  while (d->services_running > 0) FL_PCHECK(pthread_cond_wait(&d->changed, &d->lock));
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
}

/* Checks and records the request (plan, broadcasts, storage levels, released datasets) and
 * submits its job. */
fl_status jobs_run_start(driver_state *d, const rpc_request *call) {
  UNPACK(Flint__RunJobRequest, req, call->body, "RunJob");
  if (req->operation_id == 0) {
    flint__run_job_request__free_unpacked(req, NULL);
    return FL_ERR(FL_EPROTO, "RunJob: operation id 0");
  }
  run_job *j = common_calloc(1, sizeof *j);
  if (!j) {
    flint__run_job_request__free_unpacked(req, NULL);
    return FL_ERR(FL_ENOMEM, "out of memory");
  }
  j->d = d;
  j->req = req;
  fl_status status = apps_lookup(d, req->app_id, req->incarnation, &j->app);
  if (status != FL_OK) goto fail;
  driver_app *app = j->app;
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  if (req->plan.len) status = rdd_plan_add(app->plan, (fl_bytes){req->plan.data, req->plan.len});
  if (status == FL_OK) status = broadcasts_take(app, req);
  for (size_t i = 0; status == FL_OK && i < req->n_levels; i++) {
    rdd *x = rdd_plan_find(app->plan, req->levels[i]->rdd_id);
    if (x && req->levels[i]->level <= FL_DISK_ONLY) atomic_store(&x->level, req->levels[i]->level);
  }
  if (status == FL_OK && !(j->r = rdd_plan_find(app->plan, req->rdd_id)))
    status = FL_ERR(FL_EPROTO, "RunJob: unknown dataset %llu", (unsigned long long)req->rdd_id);
  if (status == FL_OK) {
    rdd_retain(j->r);
    status = rdd_action_decode(app->plan, (fl_bytes){req->action.data, req->action.len}, &j->action.action);
    j->have_action = status == FL_OK;
    j->action.encoded = (fl_bytes){req->action.data, req->action.len};
  }
  for (size_t i = 0; status == FL_OK && i < req->n_partitions; i++)
    if (req->partitions[i] >= j->r->num_partitions)
      status = FL_ERR(FL_EPROTO, "RunJob: partition %u of a dataset with %u", req->partitions[i],
                      j->r->num_partitions);
  /* Datasets the client freed (their cached blocks and shuffles go with them). */
  for (size_t i = 0; status == FL_OK && i < req->n_released; i++) rdd_plan_release(app->plan, req->released[i]);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status != FL_OK) goto fail;

  j->results = common_calloc(req->n_partitions ? req->n_partitions : 1, sizeof *j->results);
  if (!j->results) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto fail;
  }
  j->job_id = job_note_start(d, app->id, (uint32_t)req->n_partitions);
  j->call = rpc_defer(call);
  if (req->service && req->service[0]) {
    status = service_start(j);
    if (status != FL_OK) run_job_answer(j, status, fl_last_error());
    return FL_OK;
  }
  /* The client's going away (its connection drops) cancels the job, as does CancelJobs. */
  sched_job_opts opts = {.group = app->id, .tag = req->operation_id, .abandoned = rpc_deferred_cancelled(j->call),
                         .reports_left = &j->reports_left, .stats = &j->stats};
  status = scheduler_submit_job(d->sched, j->r, req->partitions, (uint32_t)req->n_partitions, &j->action.action,
                                &opts, j->results, run_job_ended, j);
  if (status != FL_OK) run_job_answer(j, status, fl_last_error()); /* not submitted: answered here */
  return FL_OK;
fail:
  run_job_free(j);
  return status;
}

/* A chunk of a parked result; the result goes once its last byte is read. */
fl_status jobs_handle_fetch_result(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__FetchResultRequest, req, body, "FetchResult");
  driver_app *app;
  fl_status status = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (status != FL_OK) {
    flint__fetch_result_request__free_unpacked(req, NULL);
    return status;
  }
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  parked_result **p = &app->parked;
  while (*p && ((*p)->operation_id != req->operation_id || (*p)->index != req->index)) p = &(*p)->next;
  if (!*p) {
    status = FL_ERR(FL_ENOENT, "FetchResult: no result %u of operation %llu waits on the driver",
                    req->index, (unsigned long long)req->operation_id);
  } else if (req->offset >= (*p)->data.len) {
    status = FL_ERR(FL_EPROTO, "FetchResult: offset %llu of a result of %zu bytes",
                    (unsigned long long)req->offset, (*p)->data.len);
  } else {
    size_t n = (*p)->data.len - req->offset;
    if (n > DRIVER_RESULT_CHUNK) n = DRIVER_RESULT_CHUNK;
    Flint__FetchResultReply reply = FLINT__FETCH_RESULT_REPLY__INIT;
    reply.chunk = (ProtobufCBinaryData){n, (*p)->data.data + req->offset};
    status = proto_pack(&reply.base, response);
    if (status == FL_OK && req->offset + n == (*p)->data.len) {
      parked_result *done = *p;
      *p = done->next;
      fl_buf_free(&done->data);
      common_free(done);
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  apps_unpin(d, app);
  flint__fetch_result_request__free_unpacked(req, NULL);
  return status;
}

fl_status jobs_handle_cancel(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__CancelJobsRequest, req, body, "CancelJobs");
  driver_app *app;
  fl_status status = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (status == FL_OK) {
    status = scheduler_cancel(d->sched, app->id, req->operation_id);
    apps_unpin(d, app);
  }
  flint__cancel_jobs_request__free_unpacked(req, NULL);
  return status == FL_OK ? driver_empty_reply(response) : status;
}
