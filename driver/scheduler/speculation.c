/*
 * speculation.c: backup attempts (Spark's speculation; Sandblaster's backup tasks). Two
 * kinds of attempt get a second copy on another executor, and the first copy to succeed
 * counts (task_scheduler.c kills the other):
 *   - slow ones: once enough of a stage's tasks succeeded, a task running much longer than
 *     their median (speculation_check_slow, every SPECULATION_PERIOD_NS);
 *   - queued ones (late binding): the cluster backend hands executors more attempts than
 *     they have cores (their queue), so a slow executor's queue can hold attempts that an idle
 *     one could run now; with nothing pending, each idle core takes a copy of one that has
 *     waited at least the speculation minimum (speculation_back_up_queued).
 * What the executors hold (their queues, and which executor of a node runs an attempt that
 * was offered to all of them) comes from the backend (backend_ops.attempts); what to back up,
 * and where a backup goes, is decided here. Scheduler thread only.
 */
#include <stdio.h>
#include <string.h>

#include "driver/scheduler/scheduler_internal.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* A second attempt of running task `t`, pending; it will be placed away from t's executor. */
static bool back_up(scheduler *s, sched_task *t) {
  sched_task *b = common_calloc(1, sizeof *b);
  if (!b) return false;
  sched_job *job = t->job;
  b->job = job;
  b->stage = t->stage;
  b->index = t->index;
  b->rt.ctx = t->rt.ctx;
  b->rt.job_id = t->rt.job_id;
  b->rt.partition = t->rt.partition;
  b->rt.cancelled = t->rt.cancelled;
  b->original = t;
  t->backup = b;
  b->next_copy = job->copies;
  job->copies = b;
  atomic_fetch_add(&s->tasks_speculated, 1);
  task_queue_push(s, b);
  return true;
}

/* ---- slow attempts ------------------------------------------------------------------------ */

/* One stage: once enough of its tasks succeeded, backups for the slow running ones. */
static void speculate_stage(scheduler *s, sched_job *job, sched_stage *st, uint64_t now) {
  const sched_speculation *sp = &s->speculation;
  uint32_t n = st->num_tasks, done = 0;
  for (uint32_t i = 0; i < n; i++) done += st->tasks[i].done;
  if (done == 0 || done == n || (double)done < sp->quantile * n) return;
  uint64_t *d = common_calloc(done, sizeof *d);
  if (!d) return;
  for (uint32_t i = 0, k = 0; i < n; i++)
    if (st->tasks[i].done) d[k++] = st->tasks[i].duration_ns;
  qsort(d, done, sizeof *d, cmp_u64);
  uint64_t median = d[done / 2];
  common_free(d);
  uint64_t threshold = (uint64_t)(sp->multiplier * (double)median);
  if (threshold < sp->min_ns) threshold = sp->min_ns;
  for (uint32_t i = 0; i < n; i++) {
    sched_task *t = &st->tasks[i];
    if (t->done || !t->running || t->backup || now - t->launched_ns <= threshold) continue;
    if (!back_up(s, t)) return;
    common_log(LOG_INFO, "job %llu: partition %u of dataset %llu has run %.0f ms (median %.0f ms): "
               "a backup copy runs elsewhere", (unsigned long long)job->id, t->rt.partition,
               (unsigned long long)st->rdd->id, (double)(now - t->launched_ns) / 1e6, (double)median / 1e6);
  }
}

void speculation_check_slow(scheduler *s) {
  uint64_t now = common_now_ns();
  for (sched_job *job = s->active; job; job = job->active_next) {
    if (job->status != FL_OK) continue;
    for (sched_stage *st = job->stages; st; st = st->next)
      if (st->submitted && !st->finished && st->tasks && !st->barrier) speculate_stage(s, job, st, now);
  }
}

/* ---- what the executors hold ---------------------------------------------------------------- */

static bool id_in(uint64_t id, const uint64_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

static void attempts_free(sched_attempts *v) {
  common_free(v->items);
  common_free(v->lost);
  *v = (sched_attempts){0};
}

/* Fills every executor's own_now and free_cores from the backend's view. An attempt's slot
 * is its placement's until it ends, wherever it runs, so the attempts a node peer claimed are
 * taken off their owner and, where the claimer told, put on it. Returns the free cores of
 * all. */
static uint32_t count_busy(scheduler *s, const sched_attempts *v, uint64_t now) {
  for (sched_executor *x = s->executors; x; x = x->next) {
    x->own_now = x->running;
    x->claimed_in = 0;
  }
  for (size_t i = 0; i < v->count; i++) {
    const sched_attempt *a = &v->items[i];
    if (!a->claimed) continue;
    sched_executor *owner = executors_find(s, a->task->executor);
    sched_executor *runner = a->runner ? executors_find(s, a->runner) : NULL;
    if (owner && owner->own_now) owner->own_now--;
    if (runner) runner->claimed_in++;
  }
  uint32_t total = 0;
  for (sched_executor *x = s->executors; x; x = x->next) {
    uint32_t busy = x->own_now + x->claimed_in;
    bool lost = id_in(x->id, v->lost, v->num_lost);
    x->free_cores = x->removed || lost || executors_excluded(x, now) || busy >= x->cores ? 0 : x->cores - busy;
    total += x->free_cores;
  }
  return total;
}

/* ---- backups of queued attempts --------------------------------------------------------------- */

/* How many of x's attempts out were launched before the one at `index` (v's order). The
 * executor starts its attempts in launch order on its cores, passing over those a node peer
 * claimed, so a position of at least x->cores means the attempt is still queued there. */
static uint32_t launch_position(const sched_attempts *v, const sched_executor *x, size_t index) {
  uint32_t before = 0;
  for (size_t i = 0; i < index; i++) before += v->items[i].task->executor == x->id && !v->items[i].claimed;
  return before;
}

/* Queued attempts for free cores to back up: at most one per free core, the latest launched
 * first (they would start last). An attempt offered to its node's executors is one only while
 * a core off that node is free: an idle executor of the node takes it itself, and the driver
 * may not know yet that one has (the owner reports a claim when it reaches the attempt, the
 * claimer once it has run it a while). */
static size_t queued_behind(scheduler *s, const sched_attempts *v, uint64_t launched_before_ns, sched_task **out,
                            size_t max) {
  uint64_t now = common_now_ns();
  size_t n = 0, offered = 0;
  sched_executor **placed = common_calloc(v->count + 1, sizeof *placed);
  if (!placed) return 0;
  for (size_t i = 0; i < v->count; i++) placed[i] = executors_find(s, v->items[i].task->executor);
  uint32_t free = count_busy(s, v, now);
  for (sched_executor *x = s->executors; x; x = x->next) {
    x->steal_below = x->own_now > x->cores ? SIZE_MAX : 0;
    x->node_free = x->free_cores;
    for (const sched_executor *f = s->executors; f && x->node[0]; f = f->next)
      if (f != x && strcmp(f->node, x->node) == 0) x->node_free += f->free_cores;
  }
  if (free < max) max = free;
  while (n < max) {
    size_t best = SIZE_MAX;
    for (size_t i = 0; i < v->count; i++) {
      const sched_attempt *a = &v->items[i];
      const sched_task *t = a->task;
      const sched_executor *x = placed[i];
      if (!x || x->removed || i >= x->steal_below || t->original || t->backup || t->done || !t->running ||
          a->claimed || t->launched_ns > launched_before_ns || (a->offered && free - x->node_free <= offered))
        continue;
      best = i; /* the latest launched that qualifies */
    }
    if (best == SIZE_MAX) break;
    sched_executor *x = placed[best];
    if (launch_position(v, x, best) < x->cores) {
      x->steal_below = 0; /* the rest of x's attempts are running */
      continue;
    }
    x->steal_below = best;
    offered += v->items[best].offered;
    out[n++] = v->items[best].task;
  }
  common_free(placed);
  return n;
}

void speculation_back_up_queued(scheduler *s) {
  enum { MAX_AT_ONCE = 16 };
  const backend_ops *ops = s->backend->ops;
  if (!s->speculation.enabled || !ops->attempts || s->pending_head || !s->active) return;
  uint64_t now = common_now_ns();
  sched_attempts v = {0};
  if (ops->attempts(s->backend, &v) != FL_OK) return;
  sched_task *found[MAX_AT_ONCE];
  size_t n = queued_behind(s, &v, now - s->speculation.min_ns, found, MAX_AT_ONCE);
  attempts_free(&v);
  for (size_t i = 0; i < n; i++) {
    sched_task *t = found[i];
    if (t->job->status != FL_OK || t->stage->barrier || !back_up(s, t)) continue;
    common_log(LOG_INFO, "job %llu: partition %u of dataset %llu has waited %.0f ms in a busy executor's "
               "queue while another executor is idle: a backup copy runs elsewhere",
               (unsigned long long)t->job->id, t->rt.partition, (unsigned long long)t->stage->rdd->id,
               (double)(now - t->launched_ns) / 1e6);
  }
}

/* ---- where backups go ------------------------------------------------------------------------- */

/* Whether x is on the node of offered attempt a's placement: every such executor has the
 * attempt queued already, as its own or as an offer. */
static bool has_offer(scheduler *s, const sched_attempt *a, const sched_executor *x) {
  const sched_executor *placed = executors_find(s, a->task->executor);
  return a->offered && placed && strcmp(x->node, placed->node) == 0;
}

/* Where a backup of offered attempt `a` goes, or NULL for the usual placement. Every
 * executor of its node has it queued, as its own or as an offer: the owner once a peer
 * claimed it (it has passed the attempt by, the one executor known not to run it), if a core
 * of it is free; else the executor off the node with the most free cores. */
static sched_executor *backup_of_offered(scheduler *s, const sched_attempts *v, const sched_attempt *a,
                                         uint64_t now) {
  count_busy(s, v, now);
  sched_executor *owner = executors_find(s, a->task->executor);
  if (a->claimed && a->runner != a->task->executor && owner && owner->free_cores) return owner;
  sched_executor *best = NULL;
  for (sched_executor *x = s->executors; x; x = x->next)
    if (x->free_cores && !has_offer(s, a, x) && (!best || x->free_cores > best->free_cores)) best = x;
  return best;
}

bool speculation_place_backup(scheduler *s, const sched_task *t, uint64_t now, uint64_t *to, uint64_t *avoid) {
  const backend_ops *ops = s->backend->ops;
  sched_attempts v = {0};
  if (!ops->attempts || ops->attempts(s->backend, &v) != FL_OK) return false;
  const sched_attempt *a = NULL;
  for (size_t i = 0; i < v.count && !a; i++)
    if (v.items[i].task == t->original) a = &v.items[i];
  sched_executor *x = NULL;
  if (a && a->offered) {
    x = backup_of_offered(s, &v, a, now);
    if (a->runner) *avoid = a->runner;
  }
  attempts_free(&v);
  if (!x) return false;
  *to = x->id;
  return true;
}
