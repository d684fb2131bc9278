/*
 * context.c: fl_context_open and the calls on any context. The master picks the kind:
 * local, local[N] and local[*] run the scheduler in this process (local_context.c);
 * flint://HOST:PORT and local-cluster[E,C,MB] send jobs to a driver process
 * (remote_context.c). Each kind fills the context's close, stats and cancel slots.
 *
 * Threading: stateless; a context's slots say theirs.
 */
#include <string.h>

#include "client/client_internal.h"

fl_status fl_context_open(const char *master, const fl_options *options, fl_context **out) {
  common_error_clear();
  if (!master || !out) return FL_ERR(FL_EINVAL, "fl_context_open: master and out must not be NULL");
  if (strncmp(master, "flint://", 8) == 0 || strncmp(master, "local-cluster[", 14) == 0)
    return client_remote_context_open(master, options, out);
  return client_local_context_open(master, options, out);
}

void fl_context_close(fl_context *ctx) {
  if (ctx) ctx->close(ctx);
}

uint32_t fl_context_cores(const fl_context *ctx) { return ctx ? ctx->cores : 0; }

/* A remote client has no barrier runtime: its tasks run on executors. */
bool fl_context_is_local(const fl_context *ctx) { return ctx && ctx->barrier != NULL; }

fl_status fl_cancel_jobs(fl_context *ctx) {
  common_error_clear();
  if (!ctx) return FL_ERR(FL_EINVAL, "fl_cancel_jobs: NULL context");
  return ctx->cancel(ctx);
}

const char *fl_context_ui_url(fl_context *ctx) { return ctx && ctx->ui_url[0] ? ctx->ui_url : NULL; }

fl_status fl_context_post_event(fl_context *ctx, const char *json) {
  common_error_clear();
  if (!ctx || !json) return FL_ERR(FL_EINVAL, "fl_context_post_event: NULL argument");
  if (!ctx->runtime->post_event) return FL_OK;
  return ctx->runtime->post_event(ctx->runtime_impl, json);
}

fl_status fl_context_stats_get(fl_context *ctx, fl_context_stats *out) {
  common_error_clear();
  if (!ctx || !out) return FL_ERR(FL_EINVAL, "fl_context_stats_get: NULL argument");
  return ctx->stats(ctx, out);
}
