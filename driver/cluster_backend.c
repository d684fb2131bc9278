/*
 * cluster_backend.c: the executor backend of the driver process. Tasks run on executor
 * processes that registered over the control plane.
 *
 * Design. The scheduler thread places each task (place: the executor caching its partition
 * when it has room, waiting up to the locality wait for it, else the least busy executor),
 * launches it into that executor's batch, and after each round flushes every batch as one
 * LaunchTasks call per (executor, application). A batch carries what the executor lacks to
 * run it: the plan nodes it has not seen (each executor's known set), storage levels, where
 * the map outputs of the shuffles it reads are, and the tasks. Calls to an executor go one at
 * a time, in order, through its sender thread, which waits for each reply, so the scheduler
 * thread never blocks on the network; a call with none ahead of it is sent at once by the
 * thread that queues it (gRPC's send does not wait). Executors report task ends in batches
 * (cluster_status_update, on the rpc queue's thread or a handler thread): each end is matched
 * to its attempt by the task key, and the batch is posted to the scheduler as task ends.
 *
 * Threading: executors, in-flight attempts and stats are under cb->lock; batches, known sets
 * and placement counts are the scheduler thread's.
 */
#include <string.h>

#include "driver/driver_internal.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"
#include "shuffle/shuffle.h"

#define LAUNCH_TIMEOUT_MS 30000
#define INFO_TIMEOUT_MS 5000

typedef struct outgoing {
  fl_buf body;
  const char *method;
  uint64_t *keys; /* by key (an attempt ended meanwhile may be freed): a launch's attempts,
                     failed if the call fails; a kill's (kill_on_reply), ended by its reply */
  size_t num_keys;
  bool kill_on_reply; /* a KillTasks whose attempts stay in flight until it is answered */
  rpc_pending *pending; /* sent already (by whoever queued it), for the sender to wait for */
  struct outgoing *next;
} outgoing;

typedef struct executor_ref {
  uint64_t id;
  char host[64];
  char node[64]; /* RegisterExecutorRequest.node ("" for none) */
  uint32_t pid;
  bool supervised; /* run by `flint executor`'s supervisor, which reports its process's death */
  char rpc_address[96], data_address[96];
  uint32_t cores, slots;
  int32_t gpu; /* --gpu, or -1 */
  uint64_t memory;
  rpc_channel *channel;
  /* stats from heartbeats (cb->lock) */
  uint64_t cached_bytes, tasks_run, tasks_failed, last_heartbeat_ns;
  /* scheduler thread */
  uint32_t attempts; /* records of attempts placed on it, not ended (it is not freed before) */
  sched_task **batch;
  size_t batch_len, batch_cap;
  sched_task **offers; /* node peers' tasks launched this round, offered to it */
  size_t num_offers, cap_offers;
  uint64_t *known; /* (app << 40 | dataset id) whose plan nodes it has */
  size_t num_known, cap_known;
  /* the sender */
  pthread_t sender;
  pthread_cond_t sender_wake; /* with cb->lock: a call to send, or stop (one per sender, so
                                 that a launch wakes only its own) */
  outgoing *out_head, *out_tail;
  bool calling; /* the sender is in a call: what is queued now waits for it */
  bool stopping;
  /* Set once e is lost or the driver stops: the call in flight is cancelled (its reply may
   * never come from an executor that hangs) and what is queued is not sent. */
  atomic_bool abandon;
  /* loss (cb->lock) */
  bool lost;
  uint64_t peer_lost_ns; /* when an executor of its node was last lost (claim_reported) */
  bool sender_done; /* its sender thread returned */
  /* A supervised executor lost before its supervisor said why (a call to it failed first):
   * the attempts its loss ended, so that the report, when it comes, can still charge the one
   * that killed it (cluster_executor_exited). */
  struct swept_attempt {
    uint64_t key, job;
    uint32_t stage, index;
  } *swept;
  size_t num_swept;
  uint32_t queries; /* storage-info calls using its channel: it is not freed meanwhile */
  uint64_t ping_sent_ns;
  bool removed; /* the scheduler thread's: lost, and its slots gone */
  struct cluster_backend *cb;
  struct executor_ref *next;
} executor_ref;

/* The backend's record of an attempt out (sched_task.attempt), from its launch to the
 * scheduler's handling of its end (cluster_ended). Executors of a node may run each other's
 * queued attempts (executor/claim_table.c): the executor that claimed an attempt (runner,
 * NULL until it tells or unknown), whether a claim was reported (by the placement or by the
 * claimer: the claimer reports the end), and whether it was offered to any. Claims arrive on
 * the status thread, under cb->lock. */
typedef struct cluster_attempt {
  uint64_t key; /* driver-wide: how executors name the attempt */
  executor_ref *placement, *runner;
  bool claimed;
  bool offered; /* offered to placement's node peers (kills go to them too) */
} cluster_attempt;

struct cluster_backend {
  backend base;
  cluster_config cfg;
  pthread_mutex_t lock;
  executor_ref *executors;
  uint64_t next_executor_id;
  sched_task **inflight; /* launched attempts whose end has not come */
  size_t num_inflight, cap_inflight;
  uint64_t next_key; /* scheduler thread */
  dp_client *fetcher; /* large task results */
  /* the monitor thread: heartbeats, liveness pings, a cluster with no live executor */
  pthread_t monitor;
  pthread_cond_t monitor_wake;
  bool stopping;
  uint64_t no_executor_since_ns; /* no live executor since then (the start, or the last
                                    loss); 0: some live */
  bool ever_registered;
  bool wait_check_posted; /* check_waiting_jobs is queued on the scheduler */
  char last_loss[256];
  /* the scheduler thread's (check_waiting_jobs) */
  uint64_t last_wait_warning_ns;
};

/* Monitor rounds; a silent executor is pinged after this long (heartbeats come every
 * second), so that a dead process is found in seconds, before its heartbeat timeout. */
#define MONITOR_PERIOD_NS 200000000ull
#define PING_AFTER_NS 2500000000ull
/* While jobs wait with no live executor, the driver says so this often (Spark's "Initial
 * job has not accepted any resources" comes every 15 s); FLINT_NO_EXECUTOR_WARN_MS. */
#define NO_EXECUTOR_WARN_NS 15000000000ull

backend *cluster_backend_base(cluster_backend *cb) { return &cb->base; }

static cluster_backend *of(backend *b) { return (cluster_backend *)b; }
static driver_app *app_of(const sched_task *t) { return (driver_app *)sched_task_rdd(t)->ctx; }
static cluster_attempt *att(const sched_task *t) { return t->attempt; }

/* ---- lineage walks ---------------------------------------------------------------------- */

typedef struct walk {
  const rdd **seen;
  size_t count, cap;
} walk;

static bool walk_visit(walk *w, const rdd *r) {
  for (size_t i = 0; i < w->count; i++)
    if (w->seen[i] == r) return false;
  if (w->count == w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 32;
    const rdd **grown = common_realloc(w->seen, cap * sizeof *grown);
    if (!grown) return false;
    w->seen = grown;
    w->cap = cap;
  }
  w->seen[w->count++] = r;
  return true;
}

/* Every dataset of the lineage (through shuffle dependencies too), each once. */
static void walk_lineage(walk *w, const rdd *r, bool cross_shuffles) {
  if (!r || !walk_visit(w, r)) return;
  for (uint32_t i = 0; i < r->num_parents; i++) walk_lineage(w, r->parents[i], cross_shuffles);
  if (cross_shuffles)
    for (uint32_t i = 0; i < r->num_shuffle_deps; i++) walk_lineage(w, r->shuffle_deps[i]->parent, true);
}

/* ---- attempts and where they run ---------------------------------------------------------- */

/* A live executor by id (cb->lock, or the scheduler thread). */
static executor_ref *find_executor(cluster_backend *cb, uint64_t id) {
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (e->id == id && !e->lost) return e;
  return NULL;
}

/* An executor by id, lost or not (kept until pruned). */
static executor_ref *find_any_executor(cluster_backend *cb, uint64_t id) {
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (e->id == id) return e;
  return NULL;
}

/* The live executor that caches t's input partition, or NULL (none, or not computed yet). */
static executor_ref *input_holder(cluster_backend *cb, const sched_task *t) {
  uint64_t where = locations_input(app_of(t), sched_task_rdd(t), t->rt.partition);
  executor_ref *e = where ? find_executor(cb, where) : NULL;
  return e && !e->removed ? e : NULL;
}

uint64_t cluster_input_at(void *arg, const sched_task *t) {
  executor_ref *e = input_holder(arg, t);
  return e ? e->id : 0;
}

static int by_key(const void *a, const void *b) {
  uint64_t x = att(((const sched_attempt *)a)->task)->key, y = att(((const sched_attempt *)b)->task)->key;
  return x < y ? -1 : x > y;
}

/* The attempts in flight, in launch order, with their claims, and the executors lost but not
 * removed yet (speculation's view: sched_attempts). */
static fl_status cluster_attempts(backend *b, sched_attempts *out) {
  cluster_backend *cb = of(b);
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
      const cluster_attempt *a = att(t);
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

static void list_push(sched_task ***list, size_t *len, size_t *cap, sched_task *t) {
  if (*len == *cap) {
    size_t grown_cap = *cap ? *cap * 2 : 16;
    sched_task **grown = common_realloc(*list, grown_cap * sizeof *grown);
    FL_ASSERT(grown); /* a few pointers; out of memory here has no way back */
    *list = grown;
    *cap = grown_cap;
  }
  (*list)[(*len)++] = t;
}

/* Whether t's attempt may be offered to the other executors of its executor's node: a task
 * over a partition cached on that node (which they map in place), not a backup (it runs away
 * from its original) nor a barrier task (its rank's place is fixed). A partition not cached
 * yet is not offered: where it is computed, it is cached, and the slots spread that evenly
 * where offers would follow the executors' speed. */
static bool offerable(cluster_backend *cb, const sched_task *t) {
  const executor_ref *e = att(t)->placement;
  if (!cb->cfg.offer_node_tasks || !e->node[0] || !e->pid || t->rt.barrier.on || t->original) return false;
  const executor_ref *holder = input_holder(cb, t);
  return holder && strcmp(holder->node, e->node) == 0;
}

static void cluster_launch(backend *b, sched_task *t) {
  cluster_backend *cb = of(b);
  executor_ref *e = find_any_executor(cb, t->executor); /* removed executors get no tasks */
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
  list_push(&e->batch, &e->batch_len, &e->batch_cap, t);
  if (offerable(cb, t)) {
    uint64_t now = common_now_ns();
    for (executor_ref *p = cb->executors; p; p = p->next)
      if (p != e && !p->removed && !scheduler_executor_excluded(cb->base.sched, p->id, now) && p->pid &&
          p->pid != e->pid && strcmp(p->node, e->node) == 0) {
        list_push(&p->offers, &p->num_offers, &p->cap_offers, t);
        a->offered = true;
      }
  }
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  if (cb->num_inflight == cb->cap_inflight) {
    size_t cap = cb->cap_inflight ? cb->cap_inflight * 2 : 64;
    sched_task **grown = common_realloc(cb->inflight, cap * sizeof *grown);
    FL_ASSERT(grown);
    cb->inflight = grown;
    cb->cap_inflight = cap;
  }
  cb->inflight[cb->num_inflight++] = t;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
}

/* Takes attempt `key` out of the in-flight list; NULL when it is not there (it ended). */
static sched_task *inflight_take(cluster_backend *cb, uint64_t key) {
  for (size_t i = 0; i < cb->num_inflight; i++)
    if (att(cb->inflight[i])->key == key) {
      sched_task *t = cb->inflight[i];
      cb->inflight[i] = cb->inflight[--cb->num_inflight];
      return t;
    }
  return NULL;
}

/* Whether attempt `key` is in flight (cb->lock). */
static bool inflight_has(const cluster_backend *cb, uint64_t key) {
  for (size_t i = 0; i < cb->num_inflight; i++)
    if (att(cb->inflight[i])->key == key) return true;
  return false;
}

/* Ends attempt `key` if it is still in flight (it never reached its executor, or its job
 * was killed). lost: its executor is gone (a retry that does not count as a failure). */
static void fail_attempt(cluster_backend *cb, uint64_t key, fl_status status, const char *msg, bool lost) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  sched_task *t = inflight_take(cb, key);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!t) return;
  t->rt.status = status;
  t->rt.error = common_strdup(msg);
  t->executor_lost = lost;
  scheduler_post_task_end(cb->base.sched, t);
}

/* ---- executor loss --------------------------------------------------------------------- */

static bool sender_push_locked(cluster_backend *cb, executor_ref *e, outgoing *o);

static void outgoing_free(outgoing *o) {
  /* A call begun on queueing is always the queue's head, and the sender, which drains the
   * queue before it returns, ends it: none reaches here (where cb->lock may be held). */
  FL_ASSERT(!o->pending);
  fl_buf_free(&o->body);
  common_free(o->keys);
  common_free(o);
}

/* Queues a call that may be dropped when e is lost (a ping, a kill, a removal). */
static void sender_push_or_drop_locked(cluster_backend *cb, executor_ref *e, outgoing *o) {
  if (!sender_push_locked(cb, e, o)) outgoing_free(o);
}

/* Lost executors kept for status; older ones are freed once nothing refers to them. */
#define MAX_LOST_KEPT 16

static void executor_free(executor_ref *e) {
  pthread_join(e->sender, NULL);
  pthread_cond_destroy(&e->sender_wake);
  while (e->out_head) { /* calls never sent: their attempts ended with the executor */
    outgoing *o = e->out_head;
    e->out_head = o->next;
    outgoing_free(o);
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
    executor_free(e);
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

/* Whether attempt t (in flight) runs or may run on e, whose loss then ends it (cb->lock): the
 * node peer that told it claimed the attempt (runner); else its placement, or, once the
 * placement has said a node peer claimed it, any executor of its node but the placement. */
static bool ran_on(const sched_task *t, const executor_ref *e) {
  const cluster_attempt *a = att(t);
  const executor_ref *placed = a->placement;
  if (a->runner) return a->runner == e;
  if (!a->claimed) return placed == e;
  return placed != e && placed && strcmp(placed->node, e->node) == 0;
}

static bool key_in(uint64_t key, const uint64_t *keys, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (keys[i] == key) return true;
  return false;
}

/* Declares e lost (once; any thread; false when it was already): its attempts in flight end
 * with FL_ENET and run again elsewhere, at no cost to their tasks, but for those whose keys
 * are in charged[0, num_charged): attempts whose code killed its process (ExecutorExited from
 * its supervisor: the one its last words name, else those that were running; Spark's
 * ExecutorLostFailure caused by the app) fail as any failed attempt does. What e held is
 * computed again when needed. */
static bool executor_lose(cluster_backend *cb, executor_ref *e, const char *why, const uint64_t *charged,
                          size_t num_charged) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  if (e->lost || cb->stopping) { /* stopping: the scheduler has stopped, nothing to recover */
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    return false;
  }
  e->lost = true;
  e->stopping = true;
  uint64_t now = common_now_ns();
  for (executor_ref *x = cb->executors; x; x = x->next)
    if (x != e && x->node[0] && strcmp(x->node, e->node) == 0) x->peer_lost_ns = now;
  atomic_store(&e->abandon, true);
  pthread_cond_signal(&e->sender_wake);
  size_t n = 0;
  sched_task **gone = cb->num_inflight ? common_calloc(cb->num_inflight, sizeof *gone) : NULL;
  for (size_t i = 0; gone && i < cb->num_inflight;) {
    if (ran_on(cb->inflight[i], e)) {
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
          (struct swept_attempt){att(gone[i])->key, t->rt.job_id, sched_task_stage(t), t->index};
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
    gone[i]->executor_lost = !key_in(att(gone[i])->key, charged, num_charged);
  }
  if (gone) scheduler_post_task_ends(cb->base.sched, gone, n);
  common_free(gone);
  return true;
}

/* Sends e a call that does nothing (KillTasks of no task): if e is gone, the sender's
 * failure declares it lost. cb->lock held. */
static void ping_locked(cluster_backend *cb, executor_ref *e) {
  Flint__KillTasksRequest req = FLINT__KILL_TASKS_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  outgoing *o = common_calloc(1, sizeof *o);
  if (!o || proto_pack(&req.base, &o->body) != FL_OK) {
    common_free(o);
    return;
  }
  o->method = "/flint.Executor/KillTasks";
  e->ping_sent_ns = common_now_ns();
  sender_push_or_drop_locked(cb, e, o);
}

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

static void *monitor_loop(void *p) {
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
      else if (quiet > PING_AFTER_NS && now - e->ping_sent_ns > PING_AFTER_NS) ping_locked(cb, e);
    }
    bool check = cb->no_executor_since_ns && !cb->wait_check_posted;
    cb->wait_check_posted |= check;
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (silent) {
      char why[96];
      snprintf(why, sizeof why, "no heartbeat for %.1f s", (double)(now - silent->last_heartbeat_ns) / 1e9);
      executor_lose(cb, silent, why, NULL, 0);
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

/* ---- batches --------------------------------------------------------------------------- */

static bool known_has(executor_ref *e, uint64_t key) {
  for (size_t i = 0; i < e->num_known; i++)
    if (e->known[i] == key) return true;
  return false;
}

typedef struct known_ctx {
  executor_ref *e;
  uint64_t app;
} known_ctx;

/* Asked of every node the plan encoder visits: known ones are skipped; the others are sent
 * now, so they count as known from here on. */
static bool known_or_mark(void *arg, uint64_t id) {
  known_ctx *k = arg;
  uint64_t key = k->app << 40 | id;
  if (known_has(k->e, key)) return true;
  if (k->e->num_known == k->e->cap_known) {
    size_t cap = k->e->cap_known ? k->e->cap_known * 2 : 64;
    uint64_t *grown = common_realloc(k->e->known, cap * sizeof *grown);
    if (!grown) return false;
    k->e->known = grown;
    k->e->cap_known = cap;
  }
  k->e->known[k->e->num_known++] = key;
  return false;
}

/* Known keys of small broadcasts (app << 40 | KNOWN_BROADCAST | id), beside plan nodes'. */
#define KNOWN_BROADCAST (1ull << 39)

/* The application's small broadcasts that e lacks, marked known, and the ones e has that the
 * client destroyed, forgotten (app->lock held; scheduler thread). */
static fl_status launch_broadcasts(executor_ref *e, const driver_app *app, Flint__InlineBroadcast ***ship,
                                   size_t *num_ship, uint64_t **forget, size_t *num_forget) {
  const uint64_t prefix = app->id << 40 | KNOWN_BROADCAST;
  *ship = common_calloc(app->num_broadcasts + 1, sizeof **ship);
  *forget = NULL;
  size_t cap_forget = 0;
  if (!*ship) return FL_ERR(FL_ENOMEM, "out of memory");
  for (size_t i = 0; i < e->num_known;) {
    uint64_t key = e->known[i];
    bool live = (key & ~((KNOWN_BROADCAST - 1))) != prefix;
    for (size_t k = 0; k < app->num_broadcasts && !live; k++) live = (prefix | app->broadcasts[k].id) == key;
    if (live) {
      i++;
      continue;
    }
    if (*num_forget == cap_forget) {
      cap_forget = cap_forget ? 2 * cap_forget : 8;
      uint64_t *grown = common_realloc(*forget, cap_forget * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      *forget = grown;
    }
    (*forget)[(*num_forget)++] = key & (KNOWN_BROADCAST - 1);
    e->known[i] = e->known[--e->num_known];
  }
  known_ctx known = {e, app->id};
  for (size_t k = 0; k < app->num_broadcasts; k++) {
    if (known_or_mark(&known, KNOWN_BROADCAST | app->broadcasts[k].id)) continue;
    /* a copy: the client may remove it once app->lock is let go, before the call is packed */
    const fl_buf *v = &app->broadcasts[k].value;
    Flint__InlineBroadcast *b = common_malloc(sizeof *b + v->len);
    if (!b) return FL_ERR(FL_ENOMEM, "out of memory");
    flint__inline_broadcast__init(b);
    b->id = app->broadcasts[k].id;
    b->value = (ProtobufCBinaryData){v->len, (uint8_t *)(b + 1)};
    if (v->len) memcpy(b + 1, v->data, v->len);
    (*ship)[(*num_ship)++] = b;
  }
  return FL_OK;
}

typedef struct shuffle_loc_ctx {
  Flint__ShuffleLocations *sl;
  Flint__MapLocation *items;
  cluster_backend *cb;
} shuffle_loc_ctx;

static void add_map_location(void *arg, uint32_t map, uint64_t executor) {
  shuffle_loc_ctx *c = arg;
  executor_ref *e = find_executor(c->cb, executor);
  if (!e || c->sl->n_maps >= c->sl->num_maps) return;
  Flint__MapLocation *m = &c->items[c->sl->n_maps];
  flint__map_location__init(m);
  m->map = map;
  m->address = e->data_address;
  c->sl->maps[c->sl->n_maps++] = m;
}

typedef struct block_loc_ctx {
  Flint__BlockLocation ***items;
  size_t *count, *cap;
  cluster_backend *cb;
  uint64_t rdd_id;
} block_loc_ctx;

static void add_block_location(void *arg, uint32_t partition, uint64_t executor) {
  block_loc_ctx *c = arg;
  executor_ref *e = find_executor(c->cb, executor);
  if (!e) return;
  if (*c->count == *c->cap) {
    size_t cap = *c->cap ? *c->cap * 2 : 32;
    Flint__BlockLocation **grown = common_realloc(*c->items, cap * sizeof *grown);
    if (!grown) return; /* a hint only: the partition is computed instead */
    *c->items = grown;
    *c->cap = cap;
  }
  Flint__BlockLocation *b = common_calloc(1, sizeof *b);
  if (!b) return;
  flint__block_location__init(b);
  b->rdd_id = c->rdd_id;
  b->partition = partition;
  b->address = e->data_address;
  b->pid = e->pid;
  b->node = e->node;
  (*c->items)[(*c->count)++] = b;
}

/* Encodes one LaunchTasks call for the tasks of one application in e's batch. */
/* The datasets of app that e has plan nodes of but the driver's plan no longer holds: taken
 * off e's known set and returned (*out, *count; the caller frees it), for the launch to tell
 * e to release them. app->lock held; scheduler thread. */
static fl_status launch_released(executor_ref *e, driver_app *app, uint64_t **out, size_t *count) {
  *out = NULL;
  *count = 0;
  size_t cap = 0;
  for (size_t i = 0; i < e->num_known;) {
    uint64_t key = e->known[i], id = key & (KNOWN_BROADCAST - 1);
    if (key >> 40 != app->id || (key & KNOWN_BROADCAST) || rdd_plan_find(app->plan, id)) {
      i++;
      continue;
    }
    if (*count == cap) {
      cap = cap ? 2 * cap : 16;
      uint64_t *grown = common_realloc(*out, cap * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      *out = grown;
    }
    (*out)[(*count)++] = id;
    e->known[i] = e->known[--e->num_known];
  }
  return FL_OK;
}

/* tasks[0, n): e's own; tasks[n, n + offered): its node peers' tasks offered to it. */
static fl_status encode_launch(cluster_backend *cb, executor_ref *e, driver_app *app, sched_task **tasks,
                               size_t n, size_t offered, bool more_pending, fl_buf *out) {
  size_t own = n;
  n += offered;
  fl_status status = FL_OK;
  fl_buf plan = FL_BUF_INIT;
  walk lineage = {0}, stage_part = {0};
  known_ctx known = {e, app->id};
  Flint__TaskDescription *descs = common_calloc(n, sizeof *descs);
  Flint__TaskDescription **desc_ptrs = common_calloc(n, sizeof *desc_ptrs);
  ProtobufCBinaryData *actions = common_calloc(n, sizeof *actions); /* one per job in the batch */
  size_t num_actions = 0;
  Flint__Level *levels = NULL, **level_ptrs = NULL;
  Flint__ShuffleLocations *shuffles = NULL, **shuffle_ptrs = NULL;
  Flint__MapLocation **map_items = NULL;
  size_t num_levels = 0, num_shuffles = 0;
  Flint__BlockLocation **blocks = NULL;
  size_t num_blocks = 0, cap_blocks = 0;
  Flint__InlineBroadcast **ship = NULL;
  uint64_t *forget = NULL, *released = NULL;
  size_t num_ship = 0, num_forget = 0, num_released = 0;
  if (!descs || !desc_ptrs || !actions) {
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  FL_PCHECK(pthread_mutex_lock(&app->lock));
  status = launch_released(e, app, &released, &num_released);
  for (size_t i = 0; i < n && status == FL_OK; i++) {
    const rdd *r = sched_task_rdd(tasks[i]);
    const rdd_shuffle_dep *dep = sched_task_shuffle_dep(tasks[i]);
    /* A map task needs the node that holds its shuffle dependency: the reading dataset. */
    const rdd *owner = dep ? rdd_plan_shuffle_owner(app->plan, dep->shuffle_id) : r;
    if (!owner) {
      status = FL_ERR(FL_EINTERNAL, "no dataset reads shuffle %llu", (unsigned long long)dep->shuffle_id);
      break;
    }
    status = rdd_plan_encode_stored(app->plan, owner->id, known_or_mark, &known, &plan);
    walk_lineage(&lineage, r, true);
    walk_lineage(&stage_part, r, false);
  }
  if (status != FL_OK) {
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    goto cleanup;
  }
  /* Storage levels of the lineage's persisted datasets. */
  levels = common_calloc(lineage.count + 1, sizeof *levels);
  level_ptrs = common_calloc(lineage.count + 1, sizeof *level_ptrs);
  /* Map outputs of the shuffles that the stage reads. */
  shuffles = common_calloc(2 * stage_part.count + 1, sizeof *shuffles);
  shuffle_ptrs = common_calloc(2 * stage_part.count + 1, sizeof *shuffle_ptrs);
  map_items = common_calloc(2 * stage_part.count + 1, sizeof *map_items);
  if (!levels || !level_ptrs || !shuffles || !shuffle_ptrs || !map_items) {
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    status = FL_ERR(FL_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (size_t i = 0; i < lineage.count; i++) {
    fl_storage_level level = atomic_load(&lineage.seen[i]->level);
    if (level == FL_STORAGE_NONE) continue;
    flint__level__init(&levels[num_levels]);
    levels[num_levels].rdd_id = lineage.seen[i]->id;
    levels[num_levels].level = level;
    level_ptrs[num_levels] = &levels[num_levels];
    num_levels++;
  }
  for (size_t i = 0; i < stage_part.count && status == FL_OK; i++) {
    const rdd *r = stage_part.seen[i];
    for (uint32_t d = 0; d < r->num_shuffle_deps; d++) {
      const rdd_shuffle_dep *dep = r->shuffle_deps[d];
      Flint__ShuffleLocations *sl = &shuffles[num_shuffles];
      flint__shuffle_locations__init(sl);
      sl->shuffle_id = dep->shuffle_id;
      sl->num_maps = dep->parent->num_partitions;
      Flint__MapLocation *items = common_calloc(sl->num_maps + 1, sizeof *items);
      sl->maps = common_calloc(sl->num_maps + 1, sizeof *sl->maps);
      map_items[num_shuffles] = items;
      shuffle_ptrs[num_shuffles++] = sl;
      if (!items || !sl->maps) {
        status = FL_ERR(FL_ENOMEM, "out of memory");
        break;
      }
      shuffle_loc_ctx c = {sl, items, cb};
      locations_each(app->maps, dep->shuffle_id, add_map_location, &c);
    }
  }
  /* Where the stage's cached inputs are, so that a task placed away from its partition reads
   * it from the executor that has it rather than computing it again. */
  for (size_t i = 0; i < stage_part.count && status == FL_OK; i++) {
    const rdd *r = stage_part.seen[i];
    if (atomic_load(&r->level) == FL_STORAGE_NONE) continue;
    block_loc_ctx bc = {&blocks, &num_blocks, &cap_blocks, cb, r->id};
    locations_each(app->blocks, r->id, add_block_location, &bc);
  }
  if (status == FL_OK) status = launch_broadcasts(e, app, &ship, &num_ship, &forget, &num_forget);
  char broadcast_address[DP_ADDRESS_MAX];
  memcpy(broadcast_address, app->broadcast_address, sizeof broadcast_address);
  FL_PCHECK(pthread_mutex_unlock(&app->lock));
  if (status != FL_OK) goto cleanup;

  for (size_t i = 0; i < n; i++) {
    sched_task *t = tasks[i];
    Flint__TaskDescription *d = &descs[i];
    flint__task_description__init(d);
    d->task_key = att(t)->key;
    d->rdd_id = sched_task_rdd(t)->id;
    d->partition = t->rt.partition;
    d->attempt = t->rt.attempt;
    d->job_id = t->rt.job_id;
    d->barrier = t->rt.barrier.on;
    d->barrier_stage = t->rt.barrier.stage;
    d->barrier_attempt = t->rt.barrier.attempt;
    d->barrier_world = t->rt.barrier.world;
    if (i >= own) {
      d->offer = true;
      d->owner_pid = att(t)->placement->pid;
      d->owner_executor = att(t)->placement->id;
    }
    if (sched_task_shuffle_dep(t)) {
      d->shuffle_id = sched_task_shuffle_dep(t)->shuffle_id;
    } else {
      const driver_action *a = (const driver_action *)sched_task_action(t);
      size_t k = 0;
      while (k < num_actions && actions[k].data != a->encoded.data) k++;
      if (k == num_actions) actions[num_actions++] = (ProtobufCBinaryData){a->encoded.len, (uint8_t *)a->encoded.data};
      d->action_index = (uint32_t)k + 1;
    }
    desc_ptrs[i] = d;
  }
  Flint__LaunchTasksRequest req = FLINT__LAUNCH_TASKS_REQUEST__INIT;
  req.app_id = app->id;
  req.incarnation = cb->cfg.incarnation;
  req.plan.data = plan.data;
  req.plan.len = plan.len;
  req.n_levels = num_levels;
  req.levels = level_ptrs;
  req.n_shuffles = num_shuffles;
  req.shuffles = shuffle_ptrs;
  req.n_blocks = num_blocks;
  req.blocks = blocks;
  req.n_tasks = n;
  req.tasks = desc_ptrs;
  req.broadcast_address = broadcast_address;
  req.n_broadcasts = num_ship;
  req.broadcasts = ship;
  req.n_forget_broadcasts = num_forget;
  req.forget_broadcasts = forget;
  req.n_actions = num_actions;
  req.actions = actions;
  req.none_pending = !more_pending;
  req.n_released = num_released;
  req.released = released;
  status = proto_pack(&req.base, out);
cleanup:
  if (status != FL_OK) /* the executor may not get these nodes: forget they were sent */
    for (size_t i = 0; i < e->num_known;) {
      if (e->known[i] >> 40 == app->id) e->known[i] = e->known[--e->num_known];
      else i++;
    }
  for (size_t i = 0; i < num_shuffles; i++) {
    common_free(shuffles[i].maps);
    common_free(map_items[i]);
  }
  for (size_t i = 0; i < num_blocks; i++) common_free(blocks[i]);
  common_free(blocks);
  common_free(released);
  for (size_t i = 0; i < num_ship; i++) common_free(ship[i]);
  common_free(ship);
  common_free(forget);
  common_free(map_items);
  common_free(shuffles);
  common_free(shuffle_ptrs);
  common_free(levels);
  common_free(level_ptrs);
  common_free(descs);
  common_free(desc_ptrs);
  common_free(actions);
  common_free(lineage.seen);
  common_free(stage_part.seen);
  fl_buf_free(&plan);
  return status;
}

/* Queues a call for e's sender (cb->lock held); false when e is lost (nothing is queued:
 * its sender may have returned). A call that is next in line is sent here and now, so that a
 * launch leaves from the scheduler thread without waiting for the sender thread to wake (a
 * wake-up that costs a job a tenth of a millisecond on a small virtual machine); the sender
 * then only waits for its reply. Calls still go one at a time and in order. */
static bool sender_push_locked(cluster_backend *cb, executor_ref *e, outgoing *o) {
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

static bool sender_push(cluster_backend *cb, executor_ref *e, outgoing *o) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  bool queued = sender_push_locked(cb, e, o);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return queued;
}

static void cluster_flush(backend *b, bool more_pending) {
  cluster_backend *cb = of(b);
  for (executor_ref *e = cb->executors; e; e = e->next) {
    while (e->batch_len || e->num_offers) {
      /* The tasks of the first task's application go in one call, with the offers of it. */
      driver_app *app = app_of(e->batch_len ? e->batch[0] : e->offers[0]);
      size_t n = 0, offered = 0;
      for (size_t i = 0; i < e->batch_len; i++)
        if (app_of(e->batch[i]) == app) n++;
      for (size_t i = 0; i < e->num_offers; i++)
        if (app_of(e->offers[i]) == app) offered++;
      outgoing *o = common_calloc(1, sizeof *o);
      sched_task **tasks = common_calloc(n + offered, sizeof *tasks);
      uint64_t *keys = common_calloc(n + 1, sizeof *keys); /* the own tasks': an offer's launch
                                                              failing leaves it to its owner */
      size_t k = 0, kept = 0;
      for (size_t i = 0; i < e->batch_len; i++) {
        if (app_of(e->batch[i]) == app) {
          if (tasks && keys) {
            tasks[k] = e->batch[i];
            keys[k++] = att(e->batch[i])->key;
          }
        } else {
          e->batch[kept++] = e->batch[i];
        }
      }
      e->batch_len = kept;
      kept = 0;
      for (size_t i = 0; i < e->num_offers; i++) {
        if (app_of(e->offers[i]) == app) {
          if (tasks) tasks[k++] = e->offers[i];
        } else {
          e->offers[kept++] = e->offers[i];
        }
      }
      e->num_offers = kept;
      fl_status st = o && tasks && keys ? encode_launch(cb, e, app, tasks, n, offered, more_pending, &o->body)
                                        : FL_ERR(FL_ENOMEM, "out of memory");
      common_free(tasks);
      if (st != FL_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "cannot launch on executor %llu: %s", (unsigned long long)e->id,
                 fl_last_error());
        for (size_t i = 0; keys && i < n; i++) fail_attempt(cb, keys[i], st, msg, false);
        if (o) fl_buf_free(&o->body);
        common_free(o);
        common_free(keys);
        continue;
      }
      o->method = "/flint.Executor/LaunchTasks";
      o->keys = keys;
      o->num_keys = n;
      if (common_trace_on()) {
        char detail[64];
        snprintf(detail, sizeof detail, "executor-%llu,%zu-tasks", (unsigned long long)e->id, n);
        common_trace("launch.queued", detail);
      }
      if (!sender_push(cb, e, o)) { /* lost since it was placed there: run them elsewhere */
        char msg[256];
        snprintf(msg, sizeof msg, "executor %llu at %s was lost before its launch", (unsigned long long)e->id,
                 e->rpc_address);
        for (size_t i = 0; i < n; i++) fail_attempt(cb, keys[i], FL_ENET, msg, true);
        outgoing_free(o); /* and keys */
      }
    }
  }
}

typedef struct sender_args {
  cluster_backend *cb;
  executor_ref *e;
} sender_args;

static void *sender_loop(void *p) {
  pthread_setname_np(pthread_self(), "fl-launch");
  sender_args args = *(sender_args *)p;
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
      if (lost) executor_lose(cb, e, fl_last_error(), NULL, 0); /* its attempts run elsewhere */
      else if (!atomic_load(&e->abandon)) common_log(LOG_WARN, "%s", msg);
      /* Launched after the loss swept its attempts, or not a network failure (an executor
       * that refused a kill answered all the same: it is alive, the attempt ends). */
      fl_status end = o->kill_on_reply ? FL_ECANCELLED : st;
      for (size_t i = 0; i < o->num_keys; i++) fail_attempt(cb, o->keys[i], end, msg, lost);
    } else if (o->kill_on_reply) {
      char msg[128];
      snprintf(msg, sizeof msg, "killed on executor %llu", (unsigned long long)e->id);
      for (size_t i = 0; i < o->num_keys; i++) fail_attempt(cb, o->keys[i], FL_ECANCELLED, msg, false);
    }
    outgoing_free(o);
  }
}

/* ---- task ends ------------------------------------------------------------------------- */

/* What a successful attempt leaves on executor `executor`. */
static void cluster_record_success(sched_task *t, uint64_t executor) {
  driver_app *app = app_of(t);
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
  cluster_attempt *a = att(t);
  if (!a) return 0; /* its launch failed */
  executor_ref *e = a->runner ? a->runner : a->placement;
  a->placement->attempts--;
  t->attempt = NULL;
  common_free(a);
  if (counts) cluster_record_success(t, e->id);
  return e->id;
}


/* Whether an executor's status is one of the table's (the whole table: a fixed bound
 * read FL_EDEVICE and the codes after it as FL_EINTERNAL). */
static bool status_known(int32_t status) {
  switch (status) {
#define STATUS_KNOWN_(name, value, text) case value:
    FL_STATUS_TABLE(STATUS_KNOWN_)
#undef STATUS_KNOWN_
    return true;
  }
  return false;
}

/* A large result kept on its executor, fetched in chunks over the data plane. Runs on the
 * gRPC handler thread of the status update. */
static fl_status fetch_result(cluster_backend *cb, executor_ref *e, uint64_t key, uint64_t size,
                              fl_buf *out) {
  if (size > (4ull << 30)) return FL_ERR(FL_ELIMIT, "a task result of %llu bytes", (unsigned long long)size);
  out->len = 0;
  fl_status st = fl_buf_reserve(out, size);
  uint64_t total = size;
  while (st == FL_OK && out->len < total) {
    dp_request req = {.kind = DP_RESULT, .key = {key, 0, 0, 0}, .offset = out->len, .len = 16u << 20};
    size_t before = out->len;
    st = dp_fetch(cb->fetcher, e->data_address, &req, 60000, out, &total);
    if (st == FL_OK && (out->len == before || total != size))
      st = FL_ERR(FL_EPROTO, "executor %llu sent a result of %llu bytes, announced %llu",
                  (unsigned long long)e->id, (unsigned long long)total, (unsigned long long)size);
  }
  return st;
}

/* A claim of offered attempt `key` reported by `reporter` (cb->lock). From a node peer, the
 * claimer: it runs the attempt (runner), whose loss alone now ends it. From the owner: a peer
 * claimed it. The attempt stays in flight for the claimer's report of its end, and unless the
 * claimer is known, the loss of any executor of the node but the owner now ends it (ran_on);
 * returns it, taken out of flight, when none of them is live any more. */
static sched_task *claim_reported(cluster_backend *cb, uint64_t key, executor_ref *reporter) {
  sched_task *t = NULL;
  for (size_t i = 0; i < cb->num_inflight && !t; i++)
    if (att(cb->inflight[i])->key == key) t = cb->inflight[i];
  if (!t || !reporter) return NULL; /* its end came first */
  cluster_attempt *a = att(t);
  executor_ref *owner = a->placement;
  if (reporter != owner) {
    if (a->offered && reporter->pid != owner->pid && strcmp(reporter->node, owner->node) == 0) {
      a->claimed = true;
      a->runner = reporter;
    }
    return NULL;
  }
  a->claimed = true;
  if (a->runner) return NULL; /* the claimer told, and is live: its loss takes t out of flight */
  /* A peer of the node lost since the launch may be the claimer: its loss could not end the
   * attempt then (it was not known to be claimed), so it ends now, and runs again. */
  bool live_peer = false;
  for (executor_ref *e = cb->executors; e; e = e->next) live_peer |= !e->lost && ran_on(t, e);
  if (live_peer && owner->peer_lost_ns < t->launched_ns) return NULL;
  return inflight_take(cb, key);
}

fl_status cluster_status_update(cluster_backend *cb, fl_bytes body, bool may_block, bool *declined) {
  *declined = false;
  Flint__StatusUpdateRequest *req = flint__status_update_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "StatusUpdate: malformed message");
  if (req->incarnation != cb->cfg.incarnation) { /* tasks of an earlier driver process */
    flint__status_update_request__free_unpacked(req, NULL);
    return FL_ERR(FL_ESTATE, "StatusUpdate: tasks of driver incarnation %016llx; this is %016llx",
                  (unsigned long long)req->incarnation, (unsigned long long)cb->cfg.incarnation);
  }
  for (size_t i = 0; i < req->n_statuses && !may_block; i++) *declined |= req->statuses[i]->result_block_size != 0;
  if (*declined) {
    flint__status_update_request__free_unpacked(req, NULL);
    return FL_OK;
  }
  /* The ends go to the scheduler together: posted one by one, each would wake the scheduler
   * thread, which on a busy core takes the CPU back and forth with this one. */
  sched_task *ended[64];
  size_t num_ended = 0;
  for (size_t i = 0; i < req->n_statuses; i++) {
    const Flint__TaskStatus *s = req->statuses[i];
    FL_PCHECK(pthread_mutex_lock(&cb->lock));
    executor_ref *reporter = find_executor(cb, req->executor_id);
    if (s->claimed) { /* the owner (a node peer runs it) or the claimer (it runs it here) */
      sched_task *t = claim_reported(cb, s->task_key, reporter);
      FL_PCHECK(pthread_mutex_unlock(&cb->lock));
      if (t) {
        t->rt.status = FL_ENET;
        t->rt.error = common_strdup("claimed by an executor that was lost");
        t->executor_lost = true;
        ended[num_ended++] = t;
      }
      if (num_ended == sizeof ended / sizeof *ended) {
        scheduler_post_task_ends(cb->base.sched, ended, num_ended);
        num_ended = 0;
      }
      continue;
    }
    sched_task *t = inflight_take(cb, s->task_key);
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (!t) continue; /* killed or already failed: its end no longer matters */
    /* Ran by a node peer that claimed it (the runner is who reports; find_executor gives
     * no lost one, whose report then reads as the placement's, as before). */
    cluster_attempt *a = att(t);
    if (reporter && reporter != a->placement) a->runner = reporter;
    executor_ref *e = a->runner ? a->runner : a->placement;
    t->rt.status = status_known(s->status) ? (fl_status)s->status : FL_EINTERNAL;
    t->rt.run_ns = s->run_ns;
    t->rt.blocks_mapped = s->blocks_mapped;
    t->rt.blocks_fetched = s->blocks_fetched;
    if (t->rt.status != FL_OK) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s (on executor %llu)", s->error && *s->error ? s->error : fl_strerror(t->rt.status),
               e ? (unsigned long long)e->id : 0ull);
      t->rt.error = common_strdup(msg);
      if (t->rt.status == FL_EFETCH && s->fetch_failed) {
        t->rt.fetch_failed = true;
        t->rt.fetch_shuffle_id = s->fetch_shuffle_id;
        t->rt.fetch_map = s->fetch_map;
      }
    } else if (s->result_block_size) {
      scheduler_post_task_ends(cb->base.sched, ended, num_ended); /* not held up by the fetch */
      num_ended = 0;
      fl_status st = e ? fetch_result(cb, e, s->task_key, s->result_block_size, &t->result)
                       : FL_ERR(FL_EINTERNAL, "a result from no executor");
      if (st != FL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "cannot fetch the result of %llu bytes from executor %llu: %s",
                 (unsigned long long)s->result_block_size, e ? (unsigned long long)e->id : 0ull,
                 fl_last_error());
        t->rt.status = st;
        t->rt.error = common_strdup(msg);
      }
    } else {
      t->result.len = 0;
      if (fl_buf_append(&t->result, s->result.data, s->result.len) != FL_OK) {
        t->rt.status = FL_ENOMEM;
        t->rt.error = common_strdup("out of memory for a task result");
      }
      for (size_t k = 0; k < s->n_acc_updates && t->rt.status == FL_OK; k++)
        if (rdd_task_add_accumulator(&t->rt, s->acc_updates[k]->id,
                                     (fl_bytes){s->acc_updates[k]->value.data,
                                                s->acc_updates[k]->value.len}) != FL_OK) {
          t->rt.status = FL_ENOMEM;
          t->rt.error = common_strdup("out of memory for accumulator updates");
        }
    }
    ended[num_ended++] = t;
    if (num_ended == sizeof ended / sizeof *ended) {
      scheduler_post_task_ends(cb->base.sched, ended, num_ended);
      num_ended = 0;
    }
  }
  scheduler_post_task_ends(cb->base.sched, ended, num_ended);
  flint__status_update_request__free_unpacked(req, NULL);
  return FL_OK;
}

/* ---- executors ------------------------------------------------------------------------- */

/* On the scheduler thread: tasks may be placed on the executor, unless it was lost before. */
static void executor_joined(scheduler *s, void *arg) {
  executor_ref *e = arg;
  if (e->removed) return;
  sched_executor_info info = {.id = e->id, .node = e->node, .cores = e->cores, .slots = e->slots, .gpu = e->gpu};
  scheduler_executor_added(s, &info);
}

fl_status cluster_register(cluster_backend *cb, const char *host, uint32_t rpc_port,
                           uint32_t data_port, uint32_t cores, uint64_t memory, int32_t gpu, const char *node,
                           uint32_t pid, bool supervised, uint64_t *id) {
  if (!host || !*host || strlen(host) > 60 || rpc_port == 0 || rpc_port > 65535 || data_port == 0 ||
      data_port > 65535 || cores == 0 || cores > 1024)
    return FL_ERR(FL_EPROTO, "RegisterExecutor: invalid host, ports or cores");
  if (node && strlen(node) >= sizeof ((executor_ref *)0)->node)
    return FL_ERR(FL_EPROTO, "RegisterExecutor: a node id of %zu bytes (at most 39)", strlen(node));
  executor_ref *e = common_calloc(1, sizeof *e);
  if (!e) return FL_ERR(FL_ENOMEM, "out of memory");
  snprintf(e->host, sizeof e->host, "%s", host);
  snprintf(e->node, sizeof e->node, "%s", node ? node : "");
  e->pid = pid;
  e->supervised = supervised;
  snprintf(e->rpc_address, sizeof e->rpc_address, "%s:%u", host, rpc_port);
  snprintf(e->data_address, sizeof e->data_address, "%s:%u", host, data_port);
  e->cores = cores;
  e->gpu = gpu;
  e->slots = cores * cb->cfg.slots_per_core;
  e->memory = memory;
  e->last_heartbeat_ns = common_now_ns();
  fl_status st = rpc_channel_create(e->rpc_address, cb->cfg.secret, 0, &e->channel);
  if (st != FL_OK) {
    common_free(e);
    return st;
  }
  sender_args *args = common_malloc(sizeof *args);
  FL_PCHECK(pthread_cond_init(&e->sender_wake, NULL));
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  e->id = ++cb->next_executor_id;
  if (args) *args = (sender_args){cb, e};
  if (!args || pthread_create(&e->sender, NULL, sender_loop, args) != 0) {
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    common_free(args);
    pthread_cond_destroy(&e->sender_wake);
    rpc_channel_destroy(e->channel);
    common_free(e);
    return FL_ERR(FL_ENOMEM, "cannot start a sender thread");
  }
  e->cb = cb;
  e->next = cb->executors;
  cb->executors = e;
  cb->no_executor_since_ns = 0;
  cb->ever_registered = true;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  *id = e->id;
  char gpu_s[24] = "";
  if (gpu >= 0) snprintf(gpu_s, sizeof gpu_s, ", GPU %d", (int)gpu);
  common_log(LOG_INFO, "executor %llu registered: %s, %u cores, %llu MiB%s", (unsigned long long)e->id,
             e->rpc_address, cores, (unsigned long long)(memory >> 20), gpu_s);
  return scheduler_post_call(cb->base.sched, executor_joined, e);
}

bool cluster_heartbeat(cluster_backend *cb, uint64_t executor, uint64_t incarnation,
                       uint64_t cached_bytes, uint64_t tasks_run, uint64_t tasks_failed) {
  if (incarnation != cb->cfg.incarnation) return false; /* an earlier driver's executor id */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = find_executor(cb, executor);
  if (e) {
    e->cached_bytes = cached_bytes;
    e->tasks_run = tasks_run;
    e->tasks_failed = tasks_failed;
    e->last_heartbeat_ns = common_now_ns();
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return e != NULL;
}

/* A late report's charge, for the scheduler thread. */
typedef struct late_charge {
  uint64_t job;
  uint32_t stage, index;
  char why[];
} late_charge;

static void charge_late(scheduler *s, void *arg) {
  late_charge *c = arg;
  scheduler_charge_task(s, c->job, c->stage, c->index, c->why);
  common_free(c);
}

bool cluster_executor_exited(cluster_backend *cb, uint64_t executor, uint64_t incarnation, const uint64_t *charged,
                             size_t num_charged, const char *why) {
  if (incarnation != cb->cfg.incarnation) return false;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = cb->executors;
  while (e && e->id != executor) e = e->next;
  bool live = e && !e->lost;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!e) return false;
  if (live && executor_lose(cb, e, why, charged, num_charged)) return true;
  /* Lost already, when a call to it failed before the report came: the attempts that killed
   * it are charged now, by task (they may be running again elsewhere). */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  common_log(LOG_WARN, "executor %llu at %s: %s", (unsigned long long)e->id, e->rpc_address, why);
  for (size_t i = 0; i < e->num_swept; i++) {
    late_charge *c = NULL;
    if (!key_in(e->swept[i].key, charged, num_charged) || !(c = common_malloc(sizeof *c + strlen(why) + 1))) continue;
    c->job = e->swept[i].job;
    c->stage = e->swept[i].stage;
    c->index = e->swept[i].index;
    strcpy(c->why, why);
    if (scheduler_post_call(cb->base.sched, charge_late, c) != FL_OK) common_free(c);
  }
  e->num_swept = 0; /* charged once */
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return true;
}

uint32_t cluster_cores(cluster_backend *cb) {
  uint32_t n = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next)
    if (!e->lost) n += e->cores;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  return n;
}

fl_status cluster_describe(cluster_backend *cb, void ***infos, size_t *count) {
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  size_t n = 0;
  for (executor_ref *e = cb->executors; e; e = e->next) n++;
  Flint__ExecutorInfo **out = common_calloc(n + 1, sizeof *out);
  size_t k = 0;
  for (executor_ref *e = cb->executors; out && e; e = e->next) {
    Flint__ExecutorInfo *x = common_calloc(1, sizeof *x);
    if (!x) break;
    flint__executor_info__init(x);
    x->id = e->id;
    x->address = common_strdup(e->rpc_address);
    x->cores = e->cores;
    x->memory = e->memory;
    x->cached_bytes = e->cached_bytes;
    x->tasks_run = e->tasks_run;
    x->tasks_failed = e->tasks_failed;
    x->alive = !e->lost;
    x->has_gpu = e->gpu >= 0;
    x->gpu = e->gpu >= 0 ? (uint32_t)e->gpu : 0;
    out[k++] = x;
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!out) return FL_ERR(FL_ENOMEM, "out of memory");
  *infos = (void **)out;
  *count = k;
  return FL_OK;
}

static void remove_on_executors(cluster_backend *cb, const Flint__RemoveRequest *req);

void cluster_remove(cluster_backend *cb, uint64_t app, const uint64_t *rdd_ids, size_t num_rdds,
                    const uint64_t *shuffle_ids, size_t num_shuffles, bool whole_application) {
  Flint__RemoveRequest req = FLINT__REMOVE_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.n_rdd_ids = num_rdds;
  req.rdd_ids = (uint64_t *)rdd_ids;
  req.n_shuffle_ids = num_shuffles;
  req.shuffle_ids = (uint64_t *)shuffle_ids;
  req.whole_application = whole_application;
  remove_on_executors(cb, &req);
}

void cluster_remove_broadcast(cluster_backend *cb, uint64_t app, uint64_t broadcast_id) {
  Flint__RemoveRequest req = FLINT__REMOVE_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.n_broadcast_ids = 1;
  req.broadcast_ids = &broadcast_id;
  remove_on_executors(cb, &req);
}

/* Asks every live executor what it holds of the dataset (its block manager's figures) and
 * adds them up. False when none answered. */
bool cluster_storage_info(cluster_backend *cb, uint64_t app, uint64_t rdd_id, fl_storage_info *out,
                          uint64_t *evictions) {
  Flint__StorageInfoRequest req = FLINT__STORAGE_INFO_REQUEST__INIT;
  req.incarnation = cb->cfg.incarnation;
  req.app_id = app;
  req.rdd_id = rdd_id;
  fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
  if (proto_pack(&req.base, &body) != FL_OK) return false;
  executor_ref **asked = NULL;
  size_t n = 0;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next) n += !e->lost;
  if (n && (asked = common_calloc(n, sizeof *asked))) {
    n = 0;
    for (executor_ref *e = cb->executors; e; e = e->next)
      if (!e->lost) {
        e->queries++;
        asked[n++] = e;
      }
  } else {
    n = 0;
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  bool any = false;
  for (size_t i = 0; i < n; i++) { /* one at a time: a few ms each on a local network */
    reply.len = 0;
    if (rpc_call(asked[i]->channel, "/flint.Executor/StorageInfo", fl_buf_bytes(&body), INFO_TIMEOUT_MS, &reply) != FL_OK)
      continue;
    Flint__StorageInfoReply *r = flint__storage_info_reply__unpack(NULL, reply.len, reply.data);
    if (!r) continue;
    out->cached_partitions += r->cached_partitions;
    out->memory_bytes += r->memory_bytes;
    out->disk_bytes += r->disk_bytes;
    if (evictions) *evictions += r->evictions;
    any = true;
    flint__storage_info_reply__free_unpacked(r, NULL);
  }
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (size_t i = 0; i < n; i++) asked[i]->queries--;
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  common_free(asked);
  fl_buf_free(&reply);
  fl_buf_free(&body);
  return any;
}

static void remove_on_executors(cluster_backend *cb, const Flint__RemoveRequest *req) {
  fl_buf body = FL_BUF_INIT;
  if (proto_pack(&req->base, &body) != FL_OK) return; /* best effort, as below */
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  for (executor_ref *e = cb->executors; e; e = e->next) {
    if (e->lost) continue;
    outgoing *o = common_calloc(1, sizeof *o);
    if (!o || fl_buf_append(&o->body, body.data, body.len) != FL_OK) {
      common_free(o);
      continue; /* best effort: the blocks go when the application or executor ends */
    }
    o->method = "/flint.Executor/Remove";
    sender_push_or_drop_locked(cb, e, o);
  }
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  fl_buf_free(&body);
}

/* ---- lifetime -------------------------------------------------------------------------- */

static void cluster_destroy(backend *b) {
  cluster_backend *cb = of(b);
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
    executor_free(e);
  }
  common_free(cb->inflight);
  dp_client_destroy(cb->fetcher);
  pthread_cond_destroy(&cb->monitor_wake);
  pthread_mutex_destroy(&cb->lock);
  common_free(cb);
}

/* Ends the in-flight attempts of `job` now (their executors' reports, when they come, find
 * nothing), so that a cancelled job returns without waiting for user code, and tells each
 * executor to stop them with one KillTasks call (through its sender: after the launches
 * queued before it). */
/* Whether e may hold attempt t as an offer (cb->lock): t was offered to its placement's node. */
static bool offered_to(const sched_task *t, const executor_ref *e) {
  const cluster_attempt *a = att(t);
  const executor_ref *placed = a->placement;
  return a->offered && placed && e != placed && e->pid != placed->pid && strcmp(e->node, placed->node) == 0;
}

static void cluster_kill(backend *b, sched_job *job) {
  cluster_backend *cb = of(b);
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
      if (att(killed[i])->placement == e || offered_to(killed[i], e)) keys[n++] = att(killed[i])->key;
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
    sender_push_or_drop_locked(cb, e, o);
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
  if ((on_reply && !o->keys) || proto_pack(&req.base, &o->body) != FL_OK || !sender_push_locked(cb, e, o)) {
    outgoing_free(o);
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
  cluster_backend *cb = of(b);
  bool on_reply = t->rt.barrier.on;
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  cluster_attempt *a = att(t);
  bool mine = a && inflight_has(cb, a->key); /* else its end is on the way */
  bool queued = mine && kill_push_locked(cb, a->placement, a->key, on_reply);
  for (executor_ref *e = cb->executors; mine && e; e = e->next) /* a peer may have claimed it */
    if (offered_to(t, e) && !e->lost) kill_push_locked(cb, e, a->key, false);
  bool end_now = mine && !(on_reply && queued);
  if (end_now) inflight_take(cb, a->key);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
  if (!end_now) return;
  t->rt.status = FL_ECANCELLED;
  scheduler_post_task_end(cb->base.sched, t);
}

/* A reduce task could not read a map output: if the executor that wrote it is gone, a ping
 * finds out now (its loss then marks everything it held lost at once). */
static void cluster_fetch_failed(backend *b, sched_task *t) {
  cluster_backend *cb = of(b);
  uint64_t where = locations_map_output(app_of(t), t->rt.fetch_shuffle_id, t->rt.fetch_map);
  FL_PCHECK(pthread_mutex_lock(&cb->lock));
  executor_ref *e = where ? find_executor(cb, where) : NULL;
  if (e) ping_locked(cb, e);
  FL_PCHECK(pthread_mutex_unlock(&cb->lock));
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
  if (st == FL_OK && pthread_create(&cb->monitor, NULL, monitor_loop, cb) != 0) {
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
