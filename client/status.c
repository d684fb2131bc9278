/*
 * status.c: `flint status` (fl_print_status): the driver's executors, applications and
 * recent jobs, and its job binaries, as one table. Stateless; blocks on one call to the driver.
 */
#include <string.h>

#include "client/client_internal.h"
#include "flint/cluster.h"

fl_status fl_print_status(const char *master, FILE *out) {
  common_error_clear();
  rpc_channel *ch = NULL;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_connect(master, &ch);
  if (st != FL_OK) goto done;
  Flint__Empty req = FLINT__EMPTY__INIT;
  if ((st = client_rpc_call(ch, "/flint.Driver/Status", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply)) != FL_OK)
    goto done;
  Flint__StatusReply *r = flint__status_reply__unpack(NULL, reply.len, reply.data);
  if (!r) {
    st = FL_ERR(FL_EPROTO, "Status: malformed reply");
    goto done;
  }
  if (r->ui_port) { /* on the host dialled */
    const char *host = strstr(master, "://") ? strstr(master, "://") + 3 : master;
    const char *colon = strrchr(host, ':');
    fprintf(out, "web UI: %s://%.*s:%u\n", r->ui_https ? "https" : "http",
            (int)(colon ? colon - host : (ptrdiff_t)strlen(host)), host, r->ui_port);
  }
  fprintf(out, "executors: %zu\n", r->n_executors);
  fprintf(out, "  %-4s %-22s %5s %10s %12s %10s %8s %4s %s\n", "id", "address", "cores", "memory",
          "cached", "tasks", "failed", "gpu", "state");
  for (size_t i = 0; i < r->n_executors; i++) {
    Flint__ExecutorInfo *e = r->executors[i];
    char gpu[16] = "-";
    if (e->has_gpu) snprintf(gpu, sizeof gpu, "%u", e->gpu);
    fprintf(out, "  %-4llu %-22s %5u %8lluMi %10lluKi %10llu %8llu %4s %s\n", (unsigned long long)e->id,
            e->address, e->cores, (unsigned long long)(e->memory >> 20),
            (unsigned long long)(e->cached_bytes >> 10), (unsigned long long)e->tasks_run,
            (unsigned long long)e->tasks_failed, gpu, e->alive ? "alive" : "lost");
  }
  fprintf(out, "applications: %zu\n", r->n_applications);
  for (size_t i = 0; i < r->n_applications; i++) {
    Flint__AppInfo *a = r->applications[i];
    fprintf(out, "  %llu %s (%s), %zu recent jobs\n", (unsigned long long)a->id, a->name, a->state,
            a->n_jobs);
    for (size_t j = 0; j < a->n_jobs; j++)
      fprintf(out, "    job %llu: %s, %u tasks%s%s\n", (unsigned long long)a->jobs[j]->id,
              a->jobs[j]->state, a->jobs[j]->tasks, a->jobs[j]->error[0] ? ": " : "",
              a->jobs[j]->error);
  }
  fprintf(out, "submissions: %zu\n", r->n_submissions);
  for (size_t i = 0; i < r->n_submissions; i++) {
    Flint__SubmissionInfo *s = r->submissions[i];
    fprintf(out, "  %llu %s (application %s): %s", (unsigned long long)s->submission_id, s->name, s->app_name,
            s->state);
    if (strcmp(s->state, "running") != 0)
      fprintf(out, s->signal ? ", signal %d" : ", exit status %d", s->signal ? s->signal : s->exit_code);
    fprintf(out, ", %.1f s\n", s->seconds);
  }
  flint__status_reply__free_unpacked(r, NULL);
done:
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}
