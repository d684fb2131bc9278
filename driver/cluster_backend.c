/*
 * cluster_backend.c: the cluster backend's backend_ops and life: launching an attempt on
 * the executor the task scheduler placed it on (and offering it to that executor's node
 * peers, which map its cached input in place), forgetting it once its end is handled
 * (recording a success's output and accumulator updates with its application), killing a
 * job's attempts or one attempt, checking an executor whose output could not be read, and
 * telling speculation what the executors hold. See cluster_internal.h for the whole.
 *
 * Threading: the backend_ops run on the scheduler thread; in-flight attempts and claims are
 * under cb->lock.
 */
#include <stdio.h>
#include <string.h>

#include "driver/cluster_internal.h"

backend *cluster_backend_base(cluster_backend *cb) { return &cb->base; }

/* The live executor that caches t's input partition, or NULL (none, or not computed yet). */
static executor_ref *input_holder(cluster_backend *cb, const sched_task *t) {
  uint64_t where = locations_input(cluster_app_of(t), sched_task_rdd(t), t->rt.partition);
  executor_ref *e = where ? cluster_find_executor(cb, where) : NULL;
  return e && !e->removed ? e : NULL;
}

uint64_t cluster_input_at(void *arg, const sched_task *t) {
  executor_ref *e = input_holder(arg, t);
  return e ? e->id : 0;
}

/* Launch order: keys grow with each launch. */
static int by_key(const void *a, const void *b) {
  uint64_t x = cluster_att(((const sched_attempt *)a)->task)->key;
  uint64_t y = cluster_att(((const sched_attempt *)b)->task)->key;
  return x < y ? -1 : x > y;
}

/* The attempts in flight, in launch order, with their claims, and the executors lost but not
 * removed yet (speculation's view: sched_attempts). */
static fl_status cluster_attempts(backend *b, sched_attempts *out) {
  cluster_backend *cb = cluster_of(b);
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  size_t lost = 0;
  for (executor_ref *e = cb->executors; e; e = e->next) lost += e->lost && !e->removed;
  out->items = common_calloc(cb->num_inflight + 1, sizeof *out->items);
  out->lost = common_calloc(lost + 1, sizeof *out->lost);
  if (!out->items || !out->lost) {
    st = FL_ERR(FL_ENOMEM, "out of memory");
  } else {
    for (size_t i = 0; i < cb->num_inflight; i++) {
      sched_task *t = cb->inflight[i];
      const cluster_attempt *a = cluster_att(t);
      out->items[i] = (sched_attempt){t, a->runner ? a->runner->id : 0, a->claimed, a->offered};
    }
    out->count = cb->num_inflight;
    for (executor_ref *e = cb->executors; e; e = e->next)
      if (e->lost && !e->removed) out->lost[out->num_lost++] = e->id;
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (st != FL_OK) {
    common_free(out->items);
    common_free(out->lost);
    *out = (sched_attempts){0};
    return st;
  }
  qsort(out->items, out->count, sizeof *out->items, by_key);
  return FL_OK;
}

/* Whether t's attempt may be offered to the other executors of its executor's node: a task
 * over a partition cached on that node (which they map in place), not a backup (it runs away
 * from its original) nor a barrier task (its rank's place is fixed). A partition not cached
 * yet is not offered: where it is computed, it is cached, and the slots spread that evenly
 * where offers would follow the executors' speed. */
static bool offerable(cluster_backend *cb, const sched_task *t) {
  const executor_ref *e = cluster_att(t)->placement;
  if (!cb->cfg.offer_node_tasks || !e->node[0] || !e->pid || t->rt.barrier.on || t->original) return false;
  const executor_ref *holder = input_holder(cb, t);
  return holder && strcmp(holder->node, e->node) == 0;
}

static void cluster_launch(backend *b, sched_task *t) {
  cluster_backend *cb = cluster_of(b);
  executor_ref *e = cluster_find_any_executor(cb, t->executor); /* removed executors get no tasks */
  cluster_attempt *a = common_calloc(1, sizeof *a);
  FL_ASSERT(e);
  if (!a) { /* the attempt ends at once, and runs again */
    t->rt.status = FL_ENOMEM;
    t->rt.error = common_strdup("out of memory: cannot launch the task");
    scheduler_post_task_end(cb->base.sched, t);
    return;
  }
  a->key = ++cb->next_key;
  a->placement = e;
  t->attempt = a;
  e->attempts++;
  cluster_list_push(&e->batch, &e->batch_len, &e->batch_cap, t);
  if (offerable(cb, t)) {
    uint64_t now = common_now_ns();
    for (executor_ref *p = cb->executors; p; p = p->next)
      if (p != e && !p->removed && !scheduler_executor_excluded(cb->base.sched, p->id, now) && p->pid &&
          p->pid != e->pid && strcmp(p->node, e->node) == 0) {
        cluster_list_push(&p->offers, &p->num_offers, &p->cap_offers, t);
        a->offered = true;
      }
  }
  cluster_inflight_add(cb, t);
}

/* What a successful attempt leaves on executor `executor`. */
static void cluster_record_success(sched_task *t, uint64_t executor) {
  driver_app *app = cluster_app_of(t);
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  locations_task_succeeded(app, sched_task_shuffle_dep(t), sched_task_rdd(t), t->rt.partition, executor);
  /* Accumulator updates go to the client with the job's results. */
  for (uint32_t i = 0; i < t->rt.num_acc_updates; i++) {
    rdd_acc_update *u = &t->rt.acc_updates[i];
    uint8_t head[2 * COMMON_VARINT_MAX];
    size_t h = common_varint_put(head, u->id);
    h += common_varint_put(head + h, u->value.len);
    if (fl_buf_append(&app->accumulators, head, h) != FL_OK ||
        fl_buf_append(&app->accumulators, u->value.data, u->value.len) != FL_OK)
      common_log(LOG_ERROR, "out of memory: an accumulator update of application %llu is lost",
                 (unsigned long long)app->id);
  }
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  /* Committed once, here: the scheduler's commit finds no updates. */
  rdd_task_clear_accumulators(&t->rt);
}

/* The scheduler is about to handle the attempt's end: its record goes. A success that
 * counts is recorded with its application: where its output and cached partitions are, and
 * its accumulator updates (for the client, with the job's results). Returns the executor
 * that ran it. */
static uint64_t cluster_ended(backend *b, sched_task *t, bool counts) {
  (void)b;
  cluster_attempt *a = cluster_att(t);
  if (!a) return 0; /* its launch failed */
  executor_ref *e = a->runner ? a->runner : a->placement;
  a->placement->attempts--;
  t->attempt = NULL;
  common_free(a);
  if (counts) cluster_record_success(t, e->id);
  return e->id;
}

/* Ends the in-flight attempts of `job` now (their executors' reports, when they come, find
 * nothing), so that a cancelled job returns without waiting for user code, and tells each
 * executor to stop them with one KillTasks call (through its sender: after the launches
 * queued before it). */
/* Whether e may hold attempt t as an offer (cb->lock): t was offered to its placement's node. */
static bool offered_to(const sched_task *t, const executor_ref *e) {
  const cluster_attempt *a = cluster_att(t);
  const executor_ref *placed = a->placement;
  return a->offered && placed && e != placed && e->pid != placed->pid && strcmp(e->node, placed->node) == 0;
}

static void cluster_kill(backend *b, sched_job *job) {
  cluster_backend *cb = cluster_of(b);
  sched_task **killed = NULL;
  uint64_t *keys = NULL;
  size_t num_killed = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  if (cb->num_inflight) {
    killed = common_calloc(cb->num_inflight, sizeof *killed);
    keys = common_calloc(cb->num_inflight, sizeof *keys);
  }
  for (size_t i = 0; killed && keys && i < cb->num_inflight;) {
    sched_task *t = cb->inflight[i];
    if (t->job != job) {
      i++;
      continue;
    }
    killed[num_killed++] = t;
    cb->inflight[i] = cb->inflight[--cb->num_inflight];
  }
  /* Each executor hears of its attempts, and of those offered to it: a node peer may have
   * claimed one and be running it. */
  for (executor_ref *e = cb->executors; e && killed && keys; e = e->next) {
    size_t n = 0;
    for (size_t i = 0; i < num_killed; i++)
      if (cluster_att(killed[i])->placement == e || offered_to(killed[i], e)) keys[n++] = cluster_att(killed[i])->key;
    if (!n) continue;
    Flint__KillTasksRequest req = FLINT__KILL_TASKS_REQUEST__INIT;
    req.incarnation = cb->cfg.incarnation;
    req.n_task_keys = n;
    req.task_keys = keys;
    outgoing *o = common_calloc(1, sizeof *o);
    if (!o || proto_pack(&req.base, &o->body) != FL_OK) {
      common_log(LOG_WARN, "out of memory: tasks of job %llu on executor %llu run to their end",
                 (unsigned long long)killed[0]->rt.job_id, (unsigned long long)e->id);
      if (o) fl_buf_free(&o->body);
      common_free(o);
      continue;
    }
    o->method = "/flint.Executor/KillTasks";
    cluster_sender_push_or_drop_locked(cb, e, o);
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  for (size_t i = 0; i < num_killed; i++) {
    killed[i]->rt.status = FL_ECANCELLED;
    scheduler_post_task_end(cb->base.sched, killed[i]);
  }
  common_free(killed);
  common_free(keys);
}

/* Queues a KillTasks call of attempt `key` for e's sender (cb->lock held); false when e is
 * lost or memory ran out (the attempt then runs to its end, and its report finds nothing).
 * on_reply: the sender ends the attempt when the call returns, whatever the reply. */
static bool kill_push_locked(cluster_backend *cb, executor_ref *e, uint64_t key, bool on_reply) {
  Flint__KillTasksRequest req = FLINT__KILL_TASKS_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.n_task_keys = 1;
  req.task_keys = &key;
  outgoing *o = common_calloc(1, sizeof *o);
  if (!o) return false;
  o->method = "/flint.Executor/KillTasks";
  if (on_reply) {
    o->keys = common_malloc(sizeof *o->keys);
    o->num_keys = o->keys ? 1 : 0;
    if (o->keys) o->keys[0] = key;
    o->kill_on_reply = true;
  }
  if ((on_reply && !o->keys) || proto_pack(&req.base, &o->body) != FL_OK || !cluster_sender_push_locked(cb, e, o)) {
    cluster_outgoing_free(o);
    return false;
  }
  return true;
}

/* Stops one attempt: the loser of a task and its backup, or a task of an abandoned barrier
 * attempt. Its executor is told with one KillTasks call (through its sender: after the
 * launches queued before it).
 *
 * A loser ends now: its task is done and nothing is placed by where it ran. A barrier task
 * ends only when the KillTasks call is answered (FL_ECANCELLED) or fails (a network failure
 * declares the executor lost first, and the loss ends it as a lost attempt), because the
 * stage's next attempt is placed once every task of this one ended. Ended earlier, a task
 * of an executor that died (kill -9: the other ranks fail at once on their connections to
 * it, seconds before a ping finds it silent) gave back an executor that looks idle and
 * alive, and the next attempt went there and failed too. The wait is bounded: every call
 * of the sender has a deadline (LAUNCH_TIMEOUT_MS), and its first network failure or
 * timeout declares the executor lost, which ends all of its attempts. */
static void cluster_kill_attempt(backend *b, sched_task *t) {
  cluster_backend *cb = cluster_of(b);
  bool on_reply = t->rt.barrier.on;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  cluster_attempt *a = cluster_att(t);
  bool mine = a && cluster_inflight_has(cb, a->key); /* else its end is on the way */
  bool queued = mine && kill_push_locked(cb, a->placement, a->key, on_reply);
  for (executor_ref *e = cb->executors; mine && e; e = e->next) /* a peer may have claimed it */
    if (offered_to(t, e) && !e->lost) kill_push_locked(cb, e, a->key, false);
  bool end_now = mine && !(on_reply && queued);
  if (end_now) cluster_inflight_take(cb, a->key);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!end_now) return;
  t->rt.status = FL_ECANCELLED;
  scheduler_post_task_end(cb->base.sched, t);
}

/* A reduce task could not read a map output: if the executor that wrote it is gone, a ping
 * finds out now (its loss then marks everything it held lost at once). */
static void cluster_fetch_failed(backend *b, sched_task *t) {
  cluster_backend *cb = cluster_of(b);
  uint64_t where = locations_map_output(cluster_app_of(t), t->rt.fetch_shuffle_id, t->rt.fetch_map);
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = where ? cluster_find_executor(cb, where) : NULL;
  if (e) cluster_ping_locked(cb, e);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
}

static void cluster_destroy(backend *b) {
  cluster_backend *cb = cluster_of(b);
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  cb->stopping = true;
  pthread_cond_signal(&cb->monitor_wake);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  pthread_join(cb->monitor, NULL);
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next) {
    e->stopping = true;
    atomic_store(&e->abandon, true);
    pthread_cond_signal(&e->sender_wake);
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  while (cb->executors) {
    executor_ref *e = cb->executors;
    cb->executors = e->next;
    cluster_executor_free(e);
  }
  common_free(cb->inflight);
  dp_client_destroy(cb->fetcher);
  pthread_cond_destroy(&cb->monitor_wake);
  pthread_mutex_destroy(&cb->lock);
  common_free(cb);
}

static const backend_ops cluster_ops = {.name = "cluster",
                                        .launch = cluster_launch,
                                        .flush = cluster_flush,
                                        .ended = cluster_ended,
                                        .kill_job = cluster_kill,
                                        .kill_attempt = cluster_kill_attempt,
                                        .fetch_failed = cluster_fetch_failed,
                                        .attempts = cluster_attempts,
                                        .destroy = cluster_destroy};

fl_status cluster_backend_create(scheduler *sched, const cluster_config *cfg, cluster_backend **out) {
  cluster_backend *cb = common_calloc(1, sizeof *cb);
  if (!cb) return FL_ERR(FL_ENOMEM, "cannot allocate the cluster backend");
  FL_PCHECK(pthread_mutex_init(&cb->lock, NULL));
  pthread_condattr_t attr; /* the monitor's deadlines are common_now_ns times */
  FL_PCHECK(pthread_condattr_init(&attr));
  FL_PCHECK(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC));
  FL_PCHECK(pthread_cond_init(&cb->monitor_wake, &attr));
  pthread_condattr_destroy(&attr);
  cb->cfg = *cfg;
  cb->no_executor_since_ns = common_now_ns(); /* none registered yet */
  fl_status st = dp_client_create(cfg->secret, &cb->fetcher);
  if (st == FL_OK && pthread_create(&cb->monitor, NULL, cluster_monitor_main, cb) != 0) {
    dp_client_destroy(cb->fetcher);
    st = FL_ERR(FL_ENOMEM, "cannot start the executor monitor thread");
  }
  if (st != FL_OK) {
    pthread_cond_destroy(&cb->monitor_wake);
    pthread_mutex_destroy(&cb->lock);
    common_free(cb);
    return st;
  }
  if (!cb->cfg.slots_per_core) cb->cfg.slots_per_core = 2;
  /* Keys start at a random point, so that an executor that outlives its driver and registers
   * with a new one is offered no old task under a new task's key (its table is cleared at
   * registration, its peers' queues are not). */
  uint64_t bits = common_random_u64();
  cb->next_key = (bits >> 1) & ~(((uint64_t)1 << 32) - 1); /* 31 random bits above 2^32 keys */
  cb->base.ops = &cluster_ops;
  cb->base.sched = sched;
  cb->base.threads = 0; /* tasks run on the executors it adds, which bring their slots */
  cb->base.slots = 0;
  *out = cb;
  return FL_OK;
}
