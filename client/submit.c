/*
 * submit.c: `flint submit` (fl_submit): sends a job binary to a driver, which runs it in a
 * child process as an application, and streams the job's output back here until it exits.
 * A stop asked meanwhile (a signal handler sets *stop) cancels the submission once. A
 * detached job binary is watched by its id: fl_submission_status, _logs, _follow and _kill.
 *
 * Threading: fl_submit blocks its caller until the job ends (or at once when detached); it
 * keeps no state between calls.
 */
#include <string.h>

#include "client/client_internal.h"
#include "flint/cluster.h"

/* Writes job binary id's output from its start, and then as it comes, until it has ended
 * (*exit_code: its status, 128 + N for signal N). A stop set meanwhile: with cancel, asks
 * the driver once to stop the job and goes on until it ends; without, returns FL_ECANCELLED
 * at once (the job goes on). Each call waits at most 5 s for output (250 ms with a stop). */
static fl_status stream_output(rpc_channel *ch, uint64_t id, FILE *out, FILE *err, volatile sig_atomic_t *stop,
                               bool cancel, int *exit_code) {
  fl_buf reply = FL_BUF_INIT;
  fl_status st = FL_OK;
  uint64_t out_off = 0, err_off = 0;
  bool cancel_sent = false;
  /* The console bar of the job's stages, under its output, while it runs. */
  client_progress *bar = NULL;
  client_progress_driver source = {ch, 0, id};
  if (common_progress_on_terminal(fileno(err)) &&
      client_progress_create(fileno(err), 0, client_progress_ask_driver, &source, &bar) == FL_OK)
    client_progress_begin(bar);
  for (;;) {
    if (stop && *stop && !cancel) {
      st = FL_ERR(FL_ECANCELLED, "stopped following job binary %llu, which goes on", (unsigned long long)id);
      break;
    }
    if (stop && *stop && !cancel_sent) {
      Flint__CancelSubmissionRequest creq = FLINT__CANCEL_SUBMISSION_REQUEST__INIT;
      creq.submission_id = id;
      if ((st = client_rpc_call(ch, "/flint.Driver/CancelSubmission", &creq.base, CLIENT_RPC_TIMEOUT_MS,
                                &reply)) != FL_OK)
        break;
      fprintf(stderr, "flint: interrupted: job binary %llu is being stopped\n", (unsigned long long)id);
      cancel_sent = true;
    }
    Flint__OutputRequest oreq = FLINT__OUTPUT_REQUEST__INIT;
    oreq.submission_id = id;
    oreq.stdout_offset = out_off;
    oreq.stderr_offset = err_off;
    oreq.wait_ms = stop ? 250 : 5000; /* short waits: a stop is seen at once */
    if ((st = client_rpc_call(ch, "/flint.Driver/Output", &oreq.base, CLIENT_RPC_TIMEOUT_MS, &reply)) != FL_OK)
      break;
    Flint__OutputReply *o = flint__output_reply__unpack(NULL, reply.len, reply.data);
    if (!o) {
      st = FL_ERR(FL_EPROTO, "Output: malformed reply");
      break;
    }
    if (o->stdout_data.len || o->stderr_data.len) client_progress_clear(bar);
    /* An empty bytes field has NULL data, which fwrite must not get (UBSan). */
    if (o->stdout_data.len) fwrite(o->stdout_data.data, 1, o->stdout_data.len, out);
    if (o->stderr_data.len) fwrite(o->stderr_data.data, 1, o->stderr_data.len, err);
    fflush(out);
    fflush(err);
    out_off += o->stdout_data.len;
    err_off += o->stderr_data.len;
    bool exited = o->exited && !o->stdout_data.len && !o->stderr_data.len;
    int code = o->signal ? 128 + o->signal : o->exit_code;
    int sig = o->signal;
    flint__output_reply__free_unpacked(o, NULL);
    if (exited) {
      client_progress_clear(bar);
      if (sig) fprintf(err, "flint: the job was killed by signal %d (%s)\n", sig, strsignal(sig));
      if (exit_code) *exit_code = code;
      break;
    }
  }
  client_progress_end(bar);
  client_progress_destroy(bar);
  fl_buf_free(&reply);
  return st;
}

fl_status fl_submit(const char *master, const char *path, const char *app_name, int argc, char **argv,
                    bool detach, volatile sig_atomic_t *stop, uint64_t *submission, int *exit_code) {
  common_error_clear();
  if (!path || (argc && !argv)) return FL_ERR(FL_EINVAL, "fl_submit: NULL argument");
  rpc_channel *ch = NULL;
  fl_buf lib = FL_BUF_INIT, reply = FL_BUF_INIT;
  fl_status st = client_rpc_connect(master, &ch);
  if (st != FL_OK) goto done;
  if ((st = common_read_file(path, &lib)) != FL_OK) goto done;
  Flint__SubmitRequest req = FLINT__SUBMIT_REQUEST__INIT;
  const char *slash = strrchr(path, '/');
  req.name = (char *)(slash ? slash + 1 : path);
  req.app_name = (char *)(app_name && *app_name ? app_name : req.name);
  req.library = (ProtobufCBinaryData){lib.len, lib.data};
  req.n_args = (size_t)argc;
  req.args = argv;
  if ((st = client_rpc_call(ch, "/flint.Driver/Submit", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply)) != FL_OK)
    goto done;
  Flint__SubmitReply *sr = flint__submit_reply__unpack(NULL, reply.len, reply.data);
  if (!sr) {
    st = FL_ERR(FL_EPROTO, "Submit: malformed reply");
    goto done;
  }
  uint64_t id = sr->submission_id;
  flint__submit_reply__free_unpacked(sr, NULL);
  if (submission) *submission = id;
  if (detach) goto done;
  st = stream_output(ch, id, stdout, stderr, stop, true, exit_code);
  if (st != FL_OK && st != FL_ECANCELLED)
    /* What the job wrote before is printed already; its driver ends it (PDEATHSIG). */
    common_error_wrap(st, "lost the driver at %s while job binary %llu ran (its output up to then is above): ",
                      master + 8, (unsigned long long)id);
done:
  fl_buf_free(&lib);
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}

fl_status fl_submission_follow(const char *master, uint64_t id, FILE *out, FILE *err, volatile sig_atomic_t *stop,
                               int *exit_code) {
  common_error_clear();
  if (!out || !err || !exit_code) return FL_ERR(FL_EINVAL, "fl_submission_follow: NULL argument");
  rpc_channel *ch = NULL;
  fl_status st = client_rpc_connect(master, &ch);
  if (st == FL_OK) st = stream_output(ch, id, out, err, stop, false, exit_code);
  if (st != FL_OK && st != FL_ECANCELLED && st != FL_ENOENT)
    common_error_wrap(st, "lost the driver at %s while following job binary %llu (its output up to then is above): ",
                      master + 8, (unsigned long long)id);
  rpc_channel_destroy(ch);
  return st;
}

/* One call about job binary `id` whose reply is unpacked into *out (free it with
 * protobuf_c_message_free_unpacked). */
static fl_status submission_call(const char *master, const char *method, uint64_t id, int64_t timeout_ms,
                                 const ProtobufCMessageDescriptor *reply_type, ProtobufCMessage **out) {
  common_error_clear();
  *out = NULL;
  rpc_channel *ch = NULL;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_connect(master, &ch);
  if (st != FL_OK) goto done;
  Flint__SubmissionRequest req = FLINT__SUBMISSION_REQUEST__INIT;
  req.submission_id = id;
  char path[64];
  snprintf(path, sizeof path, "/flint.Driver/%s", method);
  if ((st = client_rpc_call(ch, path, &req.base, timeout_ms, &reply)) != FL_OK) goto done;
  if (!(*out = protobuf_c_message_unpack(reply_type, NULL, reply.len, reply.data)))
    st = FL_ERR(FL_EPROTO, "%s: malformed reply", method);
done:
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}

static void copy_info(const Flint__SubmissionInfo *from, fl_submission_info *to) {
  memset(to, 0, sizeof *to);
  to->id = from->submission_id;
  snprintf(to->name, sizeof to->name, "%s", from->name);
  snprintf(to->app_name, sizeof to->app_name, "%s", from->app_name);
  snprintf(to->state, sizeof to->state, "%s", from->state);
  to->exit_code = from->exit_code;
  to->signal = from->signal;
  to->seconds = from->seconds;
  to->stdout_bytes = from->stdout_bytes;
  to->stderr_bytes = from->stderr_bytes;
}

fl_status fl_submission_status(const char *master, uint64_t id, fl_submission_info *out) {
  if (!out) return FL_ERR(FL_EINVAL, "fl_submission_status: NULL argument");
  ProtobufCMessage *m;
  fl_status st = submission_call(master, "SubmissionStatus", id, CLIENT_RPC_TIMEOUT_MS,
                                 &flint__submission_info__descriptor, &m);
  if (st == FL_OK) copy_info((Flint__SubmissionInfo *)m, out);
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  return st;
}

fl_status fl_submission_kill(const char *master, uint64_t id, bool *was_running, fl_submission_info *info) {
  ProtobufCMessage *m;
  fl_status st = submission_call(master, "KillSubmission", id, CLIENT_RPC_TIMEOUT_MS,
                                 &flint__kill_submission_reply__descriptor, &m);
  if (st == FL_OK) {
    Flint__KillSubmissionReply *r = (Flint__KillSubmissionReply *)m;
    if (was_running) *was_running = r->was_running;
    if (info && r->info) copy_info(r->info, info);
  }
  if (m) protobuf_c_message_free_unpacked(m, NULL);
  return st;
}

fl_status fl_submission_logs(const char *master, uint64_t id, FILE *out, FILE *err) {
  common_error_clear();
  if (!out || !err) return FL_ERR(FL_EINVAL, "fl_submission_logs: NULL argument");
  rpc_channel *ch = NULL;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_connect(master, &ch);
  if (st != FL_OK) goto done;
  Flint__OutputRequest req = FLINT__OUTPUT_REQUEST__INIT;
  req.submission_id = id; /* from offset 0, without waiting: what it has written so far */
  if ((st = client_rpc_call(ch, "/flint.Driver/Output", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply)) != FL_OK)
    goto done;
  Flint__OutputReply *o = flint__output_reply__unpack(NULL, reply.len, reply.data);
  if (!o) {
    st = FL_ERR(FL_EPROTO, "Output: malformed reply");
    goto done;
  }
  if (o->stdout_data.len) fwrite(o->stdout_data.data, 1, o->stdout_data.len, out);
  if (o->stderr_data.len) fwrite(o->stderr_data.data, 1, o->stderr_data.len, err);
  fflush(out);
  fflush(err);
  flint__output_reply__free_unpacked(o, NULL);
done:
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}
