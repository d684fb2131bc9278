/*
 * cluster_liveness.c: each executor's calls and its liveness. Calls to an executor go one
 * at a time, in order, through its sender thread, which waits for each reply, so the
 * scheduler thread never blocks on the network; a call with none ahead of it is sent at once
 * by the thread that queues it (gRPC's send does not wait). An executor is lost when a call
 * to it fails (network or timeout), when it is silent past FLINT_EXECUTOR_TIMEOUT_MS (the
 * monitor pings one silent for a few seconds, so that a dead process is found sooner), or
 * when its supervisor says its process died (cluster_registry.c). Its attempts then run again
 * elsewhere, and the driver forgets what it held. The monitor also fails jobs that wait too
 * long with no live executor.
 *
 * Threading: one sender thread per executor and one monitor thread; queues, losses and
 * heartbeats are under cb->lock; an executor's removal and pruning run on the scheduler
 * thread.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "driver/cluster_internal.h"

/* Monitor rounds; a silent executor is pinged after this long (heartbeats come every
 * second), so that a dead process is found in seconds, before its heartbeat timeout. */
#define MONITOR_PERIOD_NS 200000000ull
#define PING_AFTER_NS 2500000000ull
/* While jobs wait with no live executor, the driver says so this often (Spark's "Initial
 * job has not accepted any resources" comes every 15 s); FLINT_NO_EXECUTOR_WARN_MS. */
#define NO_EXECUTOR_WARN_NS 15000000000ull

/* ---- calls --------------------------------------------------------------------------------- */

void cluster_outgoing_free(outgoing *o) {
  /* A call begun on queueing is always the queue's head, and the sender, which drains the
   * queue before it returns, ends it: none reaches here (where cb->lock may be held). */
  FL_ASSERT(!o->pending);
  fl_buf_free(&o->body);
  common_free(o->keys);
  common_free(o);
}

/* Queues a call for e's sender (cb->lock held); false when e is lost (nothing is queued:
 * its sender may have returned). A call that is next in line is sent here and now, so that a
 * launch leaves from the scheduler thread without waiting for the sender thread to wake (a
 * wake-up that costs a job a tenth of a millisecond on a small virtual machine); the sender
 * then only waits for its reply. Calls still go one at a time and in order. */
bool cluster_sender_push_locked(cluster_backend *cb, executor_ref *e, outgoing *o) {
  if (e->lost) return false;
  if (!e->calling && !e->out_head && !e->stopping &&
      rpc_call_begin(e->channel, o->method, fl_buf_bytes(&o->body), LAUNCH_TIMEOUT_MS, &o->pending) != FL_OK)
    o->pending = NULL; /* the sender makes the call itself, and reports its failure */
  o->next = NULL;
  if (e->out_tail) e->out_tail->next = o;
  else e->out_head = o;
  e->out_tail = o;
  pthread_cond_signal(&e->sender_wake);
  return true;
}

bool cluster_sender_push(cluster_backend *cb, executor_ref *e, outgoing *o) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  bool queued = cluster_sender_push_locked(cb, e, o);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return queued;
}

/* Queues a call that may be dropped when e is lost (a ping, a kill, a removal). */
void cluster_sender_push_or_drop_locked(cluster_backend *cb, executor_ref *e, outgoing *o) {
  if (!cluster_sender_push_locked(cb, e, o)) cluster_outgoing_free(o);
}

void *cluster_sender_main(void *p) {
  pthread_setname_np(pthread_self(), "fl-launch");
  cluster_sender_args args = *(cluster_sender_args *)p;
  common_free(p);
  cluster_backend *cb = args.cb;
  executor_ref *e = args.e;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&cb->lock));
    e->calling = false;
    while (!e->out_head && !e->stopping) pthread_cond_wait(&e->sender_wake, &cb->lock);
    outgoing *o = e->out_head;
    if (o) {
      e->out_head = o->next;
      if (!e->out_head) e->out_tail = NULL;
    }
    if (!o) e->sender_done = true;
    e->calling = o != NULL;
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (!o) return NULL;
    rpc_pending *pending = o->pending;
    o->pending = NULL;
    fl_status st;
    if (pending) /* begun when queued */
      st = rpc_call_end_unless(pending, &e->abandon, NULL);
    else if (atomic_load(&e->abandon))
      st = FL_ERR(FL_ECANCELLED, "%s on %s: not sent (the executor is lost or the driver stopping)", o->method,
                  e->rpc_address);
    else if ((st = rpc_call_begin(e->channel, o->method, fl_buf_bytes(&o->body), LAUNCH_TIMEOUT_MS, &pending)) ==
             FL_OK)
      st = rpc_call_end_unless(pending, &e->abandon, NULL);
    if (st != FL_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "executor %llu at %s: %s", (unsigned long long)e->id,
               e->rpc_address, fl_last_error());
      bool lost = st == FL_ENET || st == FL_ETIMEDOUT;
      if (lost) cluster_executor_lose(cb, e, fl_last_error(), NULL, 0); /* its attempts run elsewhere */
      else if (!atomic_load(&e->abandon)) common_log(LOG_WARN, "%s", msg);
      /* Launched after the loss swept its attempts, or not a network failure (an executor
       * that refused a kill answered all the same: it is alive, the attempt ends). */
      fl_status end = o->kill_on_reply ? FL_ECANCELLED : st;
      for (size_t i = 0; i < o->num_keys; i++) cluster_fail_attempt(cb, o->keys[i], end, msg, lost);
    } else if (o->kill_on_reply) {
      char msg[128];
      snprintf(msg, sizeof msg, "killed on executor %llu", (unsigned long long)e->id);
      for (size_t i = 0; i < o->num_keys; i++) cluster_fail_attempt(cb, o->keys[i], FL_ECANCELLED, msg, false);
    }
    cluster_outgoing_free(o);
  }
}

/* ---- losses -------------------------------------------------------------------------------- */

/* Lost executors kept for status; older ones are freed once nothing refers to them. */
#define MAX_LOST_KEPT 16

void cluster_executor_free(executor_ref *e) {
  pthread_join(e->sender, NULL);
  pthread_cond_destroy(&e->sender_wake);
  while (e->out_head) { /* calls never sent: their attempts ended with the executor */
    outgoing *o = e->out_head;
    e->out_head = o->next;
    cluster_outgoing_free(o);
  }
  rpc_channel_destroy(e->channel);
  common_free(e->batch);
  common_free(e->offers);
  common_free(e->known);
  common_free(e->swept);
  common_free(e);
}

/* On the scheduler thread: frees lost executors beyond the newest MAX_LOST_KEPT whose
 * attempts have all ended and whose sender has returned, so that a long-running driver
 * with executors coming and going stays bounded. */
static void prune_lost(cluster_backend *cb) {
  executor_ref *gone = NULL;
  uint32_t lost = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref **p = &cb->executors; *p;) {
    executor_ref *e = *p;
    if (e->lost && ++lost > MAX_LOST_KEPT && e->removed && e->attempts == 0 && e->sender_done && e->queries == 0) {
      *p = e->next;
      e->next = gone;
      gone = e;
    } else {
      p = &e->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  while (gone) {
    executor_ref *e = gone;
    gone = e->next;
    cluster_executor_free(e);
  }
}

/* On the scheduler thread, before the lost executor's attempts end: its slots go, and the
 * driver forgets the map outputs and cached blocks it held. */
static void executor_removed(scheduler *s, void *arg) {
  executor_ref *e = arg;
  cluster_backend *cb = e->cb;
  prune_lost(cb);
  e->removed = true;
  e->batch_len = 0; /* launched, not sent: their attempts end below like the others */
  scheduler_executor_removed(s, e->id);
  if (cb->cfg.executor_lost) cb->cfg.executor_lost(cb->cfg.executor_lost_arg, e->id);
}

/* Declares e lost (once; any thread; false when it was already): its attempts in flight end
 * with FL_ENET and run again elsewhere, at no cost to their tasks, but for those whose keys
 * are in charged[0, num_charged): attempts whose code killed its process (ExecutorExited from
 * its supervisor: the one its last words name, else those that were running; Spark's
 * ExecutorLostFailure caused by the app) fail as any failed attempt does. What e held is
 * computed again when needed. */
bool cluster_executor_lose(cluster_backend *cb, executor_ref *e, const char *why, const uint64_t *charged,
                          size_t num_charged) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  if (e->lost || cb->stopping) { /* stopping: the scheduler has stopped, nothing to recover */
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    return false;
  }
  e->lost = true;
  e->stopping = true;
  if (cb->cfg.ui) {
    fl_buf reason = FL_BUF_INIT;
    if (ui_json_string(&reason, why) == FL_OK)
      ui_postf(cb->cfg.ui, "{\"Event\":\"ExecutorRemoved\",\"Executor\":%llu,\"Reason\":%.*s}",
               (unsigned long long)e->id, (int)reason.len, (const char *)reason.data);
    fl_buf_free(&reason);
  }
  uint64_t now = common_now_ns();
  for (executor_ref *x = cb->executors; x; x = x->next)
    if (x != e && x->node[0] && strcmp(x->node, e->node) == 0) x->peer_lost_ns = now;
  atomic_store(&e->abandon, true);
  pthread_cond_signal(&e->sender_wake);
  size_t n = 0;
  sched_task **gone = cb->num_inflight ? common_calloc(cb->num_inflight, sizeof *gone) : NULL;
  for (size_t i = 0; gone && i < cb->num_inflight;) {
    if (cluster_ran_on(cb->inflight[i], e)) {
      gone[n++] = cb->inflight[i];
      cb->inflight[i] = cb->inflight[--cb->num_inflight];
    } else {
      i++;
    }
  }
  /* A supervised executor lost before its supervisor said why (a call to it failed first):
   * the report, when it comes, charges from these (cluster_executor_exited). */
  if (e->supervised && !num_charged && n && (e->swept = common_calloc(n, sizeof *e->swept)))
    for (size_t i = 0; i < n; i++) {
      const sched_task *t = gone[i]->original ? gone[i]->original : gone[i];
      e->swept[e->num_swept++] =
          (struct swept_attempt){cluster_att(gone[i])->key, t->rt.job_id, sched_task_stage(t), t->index};
    }
  bool any_live = false;
  for (executor_ref *x = cb->executors; x; x = x->next) any_live |= !x->lost;
  if (!any_live) cb->no_executor_since_ns = common_now_ns();
  snprintf(cb->last_loss, sizeof cb->last_loss, "executor %llu at %s: %s", (unsigned long long)e->id,
           e->rpc_address, why);
  char msg[512];
  snprintf(msg, sizeof msg, "executor %llu at %s lost: %s", (unsigned long long)e->id, e->rpc_address, why);
  uint64_t id = e->id;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  common_log(LOG_WARN, "%s; %zu running tasks run again elsewhere", msg, n);
  /* Queued first, so that the scheduler never places the retries on e. */
  if (scheduler_post_call(cb->base.sched, executor_removed, e) != FL_OK)
    common_log(LOG_ERROR, "out of memory: executor %llu keeps its slots", (unsigned long long)id);
  for (size_t i = 0; i < n; i++) {
    gone[i]->rt.status = FL_ENET;
    gone[i]->rt.error = common_strdup(msg);
    gone[i]->executor_lost = !cluster_key_in(cluster_att(gone[i])->key, charged, num_charged);
  }
  if (gone) scheduler_post_task_ends(cb->base.sched, gone, n);
  common_free(gone);
  return true;
}

/* Sends e a call that does nothing (KillTasks of no task): if e is gone, the sender's
 * failure declares it lost. cb->lock held. */
void cluster_ping_locked(cluster_backend *cb, executor_ref *e) {
  Flint__KillTasksRequest req = FLINT__KILL_TASKS_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  outgoing *o = common_calloc(1, sizeof *o);
  if (!o || proto_pack(&req.base, &o->body) != FL_OK) {
    common_free(o);
    return;
  }
  o->method = "/flint.Executor/KillTasks";
  e->ping_sent_ns = common_now_ns();
  cluster_sender_push_or_drop_locked(cb, e, o);
}

/* ---- the monitor ----------------------------------------------------------------------------- */

/* One running job's wait for an executor (check_waiting_jobs). */
typedef struct waiting_jobs {
  scheduler *s;
  uint64_t since, now, timeout, longest;
  size_t waiting;
  bool ever;
  const char *loss;
} waiting_jobs;

static void check_waiting_job(void *arg, uint64_t job, uint64_t submitted_ns) {
  waiting_jobs *w = arg;
  uint64_t from = submitted_ns > w->since ? submitted_ns : w->since;
  uint64_t waited = w->now > from ? w->now - from : 0;
  if (w->timeout && waited > w->timeout) {
    if (w->ever)
      scheduler_fail_job(w->s, job, FL_ENET,
                         "job %llu failed: every executor was lost (the last: %s) and none registered "
                         "within %g s (FLINT_NO_EXECUTOR_TIMEOUT_MS)",
                         (unsigned long long)job, w->loss, (double)w->timeout / 1e9);
    else
      scheduler_fail_job(w->s, job, FL_ETIMEDOUT,
                         "job %llu failed: no executor has registered with the driver within %g s "
                         "(FLINT_NO_EXECUTOR_TIMEOUT_MS); start executors with `flint executor "
                         "--driver HOST:PORT` and check that they reach the driver",
                         (unsigned long long)job, (double)w->timeout / 1e9);
    return;
  }
  w->waiting++;
  if (waited > w->longest) w->longest = waited;
}

/* On the scheduler thread, while no executor is live: a job cannot wait for one for ever.
 * Each job's wait counts from its submission or from when the last executor went, whichever
 * is later; past no_executor_timeout_ns it fails, naming the cause and the setting, and
 * meanwhile the driver warns every no_executor_warn_ns, as Spark does. */
static void check_waiting_jobs(scheduler *s, void *arg) {
  cluster_backend *cb = arg;
  char loss[sizeof cb->last_loss];
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  cb->wait_check_posted = false;
  uint64_t since = cb->no_executor_since_ns;
  bool ever = cb->ever_registered;
  snprintf(loss, sizeof loss, "%s", cb->last_loss);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!since) return;
  waiting_jobs w = {.s = s, .since = since, .now = common_now_ns(), .timeout = cb->cfg.no_executor_timeout_ns,
                    .ever = ever, .loss = loss};
  scheduler_each_job(s, check_waiting_job, &w);
  uint64_t now = w.now, timeout = w.timeout, longest = w.longest;
  size_t waiting = w.waiting;
  uint64_t every = cb->cfg.no_executor_warn_ns ? cb->cfg.no_executor_warn_ns : NO_EXECUTOR_WARN_NS;
  if (!waiting || longest < every || now - cb->last_wait_warning_ns < every) return;
  cb->last_wait_warning_ns = now;
  char until[96] = "";
  if (timeout) snprintf(until, sizeof until, "; it fails after %g s (FLINT_NO_EXECUTOR_TIMEOUT_MS)", (double)timeout / 1e9);
  if (ever)
    common_log(LOG_WARN, "every executor was lost (the last: %s); %zu jobs are waiting for one to register, the "
               "longest for %.0f s%s", loss, waiting, (double)longest / 1e9, until);
  else
    common_log(LOG_WARN, "no executor has registered; the job is waiting (%zu jobs, the longest for %.0f s): "
               "check that executors are started with --driver pointing at this driver and reach it%s",
               waiting, (double)longest / 1e9, until);
}

void *cluster_monitor_main(void *p) {
  pthread_setname_np(pthread_self(), "fl-monitor");
  cluster_backend *cb = p;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  while (!cb->stopping) {
    uint64_t deadline = common_now_ns() + MONITOR_PERIOD_NS;
    struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
    pthread_cond_timedwait(&cb->monitor_wake, &cb->lock, &ts);
    if (cb->stopping) break;
    uint64_t now = common_now_ns();
    executor_ref *silent = NULL;
    for (executor_ref *e = cb->executors; e && !silent; e = e->next) {
      if (e->lost) continue;
      uint64_t quiet = now - e->last_heartbeat_ns;
      if (cb->cfg.executor_timeout_ns && quiet > cb->cfg.executor_timeout_ns) silent = e;
      else if (quiet > PING_AFTER_NS && now - e->ping_sent_ns > PING_AFTER_NS) cluster_ping_locked(cb, e);
    }
    bool check = cb->no_executor_since_ns && !cb->wait_check_posted;
    cb->wait_check_posted |= check;
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (silent) {
      char why[96];
      snprintf(why, sizeof why, "no heartbeat for %.1f s", (double)(now - silent->last_heartbeat_ns) / 1e9);
      cluster_executor_lose(cb, silent, why, NULL, 0);
    }
    if (check && scheduler_post_call(cb->base.sched, check_waiting_jobs, cb) != FL_OK) {
      common_log(LOG_ERROR, "out of memory: cannot check the jobs waiting for executors");
      FL_PCHECK(pthread_mutex_lock(&cb->lock));
      cb->wait_check_posted = false;
      FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    }
    FL_PCHECK(pthread_mutex_lock(&cb->lock));
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return NULL;
}
