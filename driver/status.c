/*
 * status.c: the driver's status (`flint status`, the Status method): its executors (live and
 * lately lost, with their figures from heartbeats), its applications, running or finished,
 * and their last jobs, and the job binaries it keeps. Any handler thread; reads under d->lock and the backend's lock.
 */
#include "common/config.h"
#include "driver/driver_internal.h"

fl_status status_reply(driver_state *d, fl_buf *response) {
  Flint__StatusReply reply = FLINT__STATUS_REPLY__INIT;
  void **execs = NULL;
  size_t num_execs = 0;
  fl_status st = cluster_describe(d->cluster, &execs, &num_execs);
  if (st != FL_OK) return st;
  reply.incarnation = d->incarnation;
  reply.ui_port = ui_port(d->ui) > 0 ? (uint32_t)ui_port(d->ui) : 0;
  reply.ui_https = config_bool(CONFIG_TLS);
  reply.n_executors = num_execs;
  reply.executors = (Flint__ExecutorInfo **)execs;
  FL_PCHECK(pthread_mutex_lock(&d->lock));
  size_t n = 0;
  for (app_entry *a = d->apps; a; a = a->next) n++;
  Flint__AppInfo *apps = common_calloc(n + 1, sizeof *apps);
  Flint__AppInfo **app_ptrs = common_calloc(n + 1, sizeof *app_ptrs);
  Flint__JobInfo *jobs = common_calloc(JOBS_KEPT * n + 1, sizeof *jobs);
  Flint__JobInfo **job_ptrs = common_calloc(JOBS_KEPT * n + 1, sizeof *job_ptrs);
  size_t num_subs = submissions_count(d);
  Flint__SubmissionInfo *subs = common_calloc(num_subs + 1, sizeof *subs);
  Flint__SubmissionInfo **sub_ptrs = common_calloc(num_subs + 1, sizeof *sub_ptrs);
  if (!apps || !app_ptrs || !jobs || !job_ptrs || !subs || !sub_ptrs) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    size_t i = 0, k = 0;
    for (app_entry *a = d->apps; a; a = a->next, i++) {
      flint__app_info__init(&apps[i]);
      apps[i].id = a->id;
      apps[i].name = a->name;
      apps[i].state = a->app ? "running" : "finished";
      apps[i].jobs = &job_ptrs[k];
      uint64_t count = a->num_jobs < JOBS_KEPT ? a->num_jobs : JOBS_KEPT;
      for (uint64_t j = 0; j < count; j++, k++) {
        job_record *r = &a->jobs[(a->num_jobs - count + j) % JOBS_KEPT];
        flint__job_info__init(&jobs[k]);
        jobs[k].id = r->id;
        jobs[k].state = r->running ? "running" : r->status == FL_OK ? "succeeded" : "failed";
        jobs[k].tasks = r->tasks;
        jobs[k].error = r->error;
        job_ptrs[k] = &jobs[k];
        apps[i].n_jobs++;
      }
      app_ptrs[i] = &apps[i];
    }
    reply.n_applications = n;
    reply.applications = app_ptrs;
    submissions_describe(d, subs, sub_ptrs);
    reply.n_submissions = num_subs;
    reply.submissions = sub_ptrs;
    st = proto_pack(&reply.base, response);
  }
  FL_PCHECK(pthread_mutex_unlock(&d->lock));
  for (size_t i = 0; i < num_execs; i++) {
    Flint__ExecutorInfo *x = execs[i];
    common_free(x->address);
    common_free(x);
  }
  common_free(execs);
  common_free(apps);
  common_free(app_ptrs);
  common_free(jobs);
  common_free(job_ptrs);
  common_free(subs);
  common_free(sub_ptrs);
  return st;
}
