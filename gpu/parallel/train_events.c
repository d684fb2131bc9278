/*
 * gpu/parallel/train_events.c: a training run as the web UI sees it (docs/ui.md): the client
 * posts TrainStart, a TrainStep per report of the ranks (progress and epoch rows), one
 * TrainPipeline for the transformer (the last step's measured timeline) and TrainEnd, through
 * the public fl_context_post_event, so that a cluster's driver and a local context show them
 * alike. Each event is one short line of JSON built here with snprintf.
 *
 * Posting never fails the training: a refused or lost event is logged at debug level and the
 * run goes on; the thread's error message is kept across TrainEnd's post, which happens as the
 * run returns its own status.
 *
 * Threading: the client's thread (the caller's, and client_on_report's inside the action).
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "gpu/parallel/train_rank.h"

/* Runs are numbered within the process, so within every context it opens. */
static atomic_uint_fast64_t next_run = 1;

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void post(train_events *ev, const char *json) {
  if (!ev->ctx) return;
  fl_status st = fl_context_post_event(ev->ctx, json);
  if (st != FL_OK) common_log(LOG_DEBUG, "training run %llu: the web UI did not take an event (%s): %s",
                              (unsigned long long)ev->run, fl_status_name(st), fl_last_error());
}

/* `s` as a JSON string into buf (quotes and escapes; cut to fit). */
static void json_str(char *buf, size_t cap, const char *s) {
  size_t n = 0;
  if (cap < 3) return;
  buf[n++] = '"';
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p && n + 8 < cap; p++) {
    if (*p == '"' || *p == '\\') {
      buf[n++] = '\\';
      buf[n++] = (char)*p;
    } else if (*p < 0x20) {
      n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", *p);
    } else {
      buf[n++] = (char)*p;
    }
  }
  buf[n++] = '"';
  buf[n] = 0;
}

/* A number as JSON: null for NaN and infinities (JSON has none). */
static const char *json_num(char *buf, size_t cap, double v) {
  if (!isfinite(v)) snprintf(buf, cap, "null");
  else snprintf(buf, cap, "%.17g", v);
  return buf;
}

static const char *model_name(const gpu_train_options *o) {
  if (o->model_library) {
    const char *base = strrchr(o->model_library, '/');
    return base ? base + 1 : o->model_library;
  }
  return o->builder ? "the program's model" : nn_model_kind_name(o->model);
}

/* What the ranks' gradient (or weight) allreduces run: the algorithms the reports name
 * (`algos`, train_allreduce_bit's bits) when they named some, else what the options make of
 * them (the forced algorithm, "auto", "nccl"): before any ran, and always for the
 * transformer, whose ranks do not report them. */
static void allreduce_text(const gpu_train_options *o, uint32_t algos, char *out, size_t cap) {
  out[0] = 0;
  if (GPU_TRAIN_SYNC_IS_PS(o->sync)) {
    snprintf(out, cap, "none (parameter servers)");
    return;
  }
  if (o->ranks <= 1) {
    snprintf(out, cap, "none (one data-parallel rank)");
    return;
  }
  if (algos & TRAIN_ALLREDUCE_NCCL) {
    snprintf(out, cap, "nccl");
    return;
  }
  if (!algos) {
    snprintf(out, cap, "%s", train_uses_nccl(o->device) ? "nccl" : fl_allreduce_algo_name(o->allreduce));
    return;
  }
  /* AUTO picks by size, so buckets of different sizes may run different algorithms. */
  size_t n = (size_t)snprintf(out, cap, "%s", o->allreduce == FL_ALLREDUCE_AUTO ? "auto: " : "");
  int named = 0;
  for (int a = FL_ALLREDUCE_RING; a < FL_ALLREDUCE_ALGO_COUNT && n < cap; a++)
    if (algos & (1u << a))
      n += (size_t)snprintf(out + n, cap - n, "%s%s", named++ ? " and " : "", fl_allreduce_algo_name((fl_allreduce_algo)a));
}

static void post_start(train_events *ev, const gpu_train_options *o) {
  char name[512], model[256], allreduce[96], algo_json[128], sync[48], lr[40];
  char data[64], title[400];
  json_str(model, sizeof model, model_name(o));
  snprintf(title, sizeof title, "%s on %s", model_name(o), gpu_train_dataset_name(o->data));
  json_str(name, sizeof name, title);
  json_str(data, sizeof data, gpu_train_dataset_name(o->data));
  allreduce_text(o, ev->algos, allreduce, sizeof allreduce);
  json_str(algo_json, sizeof algo_json, allreduce);
  switch (o->sync) {
  case GPU_TRAIN_SYNC_LOCAL: snprintf(sync, sizeof sync, "local:%u", o->tau); break;
  case GPU_TRAIN_SYNC_ADACOMM: snprintf(sync, sizeof sync, "adacomm:%u", o->tau); break;
  case GPU_TRAIN_SYNC_ASP: snprintf(sync, sizeof sync, "asp"); break;
  case GPU_TRAIN_SYNC_SSP: snprintf(sync, sizeof sync, "ssp:%u", o->staleness); break;
  default: snprintf(sync, sizeof sync, "bsp"); break;
  }
  snprintf(lr, sizeof lr, "%.15g", o->lr); /* as given: 0.4, not 0.40000000000000002 */
  bool hybrid = o->model == NN_TRANSFORMER;
  uint32_t tp = hybrid ? o->tp : 1, pp = hybrid ? o->pp : 1;
  char line[2048];
  snprintf(line, sizeof line,
           "{\"Event\":\"TrainStart\",\"Time\":%lld,\"Run\":%llu,\"Name\":%s,\"Config\":{\"model\":%s,\"data\":%s,"
           "\"device\":\"%s\",\"ranks\":%u,\"dp\":%u,\"tp\":%u,\"pp\":%u,\"schedule\":%s%s%s,\"microBatches\":%u,"
           "\"sync\":\"%s\",\"allreduce\":%s,\"batch\":%u,\"lr\":%s,\"epochs\":%u}}",
           (long long)ev->start_ms, (unsigned long long)ev->run, name, model, data,
           o->device == FL_DEVICE_CUDA ? "cuda" : "cpu", gpu_train_world(o), o->ranks, tp, pp, hybrid ? "\"" : "",
           hybrid ? pp_schedule_name(o->schedule) : "null", hybrid ? "\"" : "",
           hybrid ? o->microbatches : (o->accumulate > 1 ? o->accumulate : 1), sync, algo_json, o->batch,
           isfinite(o->lr) ? lr : "null", o->epochs);
  post(ev, line);
}

void train_events_start(train_events *ev, fl_context *ctx, const gpu_train_options *o) {
  *ev = (train_events){.ctx = ctx, .run = atomic_fetch_add(&next_run, 1), .start_ms = wall_ms()};
  post_start(ev, o);
}

void train_events_report(train_events *ev, const gpu_train_options *o, const train_report *rep) {
  if (rep->kind != REPORT_PROGRESS && rep->kind != REPORT_EPOCH) return;
  /* The first report that names the algorithms the allreduces ran (AUTO's picks) makes the
   * configuration say them: TrainStart again, with its first Time, so that the run keeps its
   * start. */
  if (rep->allreduce_algos && (rep->allreduce_algos | ev->algos) != ev->algos) {
    ev->algos |= rep->allreduce_algos;
    post_start(ev, o);
  }
  char loss[40], acc[40], test[40], ips[40], line[512];
  snprintf(line, sizeof line,
           "{\"Event\":\"TrainStep\",\"Run\":%llu,\"Epoch\":%u,\"Step\":%llu,\"Loss\":%s,\"Accuracy\":%s,"
           "\"TestAccuracy\":%s,\"ImagesPerSecond\":%s,\"BytesSent\":%llu}",
           (unsigned long long)ev->run, rep->epoch, (unsigned long long)rep->step,
           json_num(loss, sizeof loss, rep->loss), json_num(acc, sizeof acc, rep->acc),
           rep->kind == REPORT_EPOCH ? json_num(test, sizeof test, rep->test_acc) : "null",
           json_num(ips, sizeof ips, rep->images_per_s), (unsigned long long)rep->reduced_bytes);
  post(ev, line);
}

void train_events_pipeline(train_events *ev, const fl_buf *stages) {
  if (!stages->len) return;
  char head[96];
  int n = snprintf(head, sizeof head, "{\"Event\":\"TrainPipeline\",\"Run\":%llu,\"Stages\":",
                   (unsigned long long)ev->run);
  fl_buf line = FL_BUF_INIT;
  if (fl_buf_append(&line, head, (size_t)n) == FL_OK && fl_buf_append(&line, stages->data, stages->len) == FL_OK &&
      fl_buf_append(&line, "}", 2) == FL_OK)
    post(ev, (const char *)line.data);
  fl_buf_free(&line);
}

void train_events_end(train_events *ev, fl_status status) {
  char why[1024], error[1100], line[1300];
  snprintf(why, sizeof why, "%s", status == FL_OK ? "" : fl_last_error());
  json_str(error, sizeof error, why);
  snprintf(line, sizeof line, "{\"Event\":\"TrainEnd\",\"Run\":%llu,\"Status\":\"%s\"%s%s}",
           (unsigned long long)ev->run, status == FL_OK ? "FINISHED" : "FAILED", status == FL_OK ? "" : ",\"Error\":",
           status == FL_OK ? "" : error);
  post(ev, line);
  /* The run's caller reads its message after this post. */
  if (status != FL_OK) fl_set_error(status, "%s", why);
}
