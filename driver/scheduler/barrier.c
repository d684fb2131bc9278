/*
 * barrier.c: the coordinator of barrier stages (see docs/barrier.md): one table per
 * scheduler that holds, per job, the stages' all_gather rendezvous, the reports on their
 * way to the client and the checkpoints that outlive an attempt.
 *
 * Design. The scheduler thread starts an attempt of a stage (barrier_stage_start) before it
 * launches the tasks, and aborts it (barrier_stage_abort) when a task fails or its executor
 * is lost: every gather of that attempt then returns FL_ECANCELLED, and later calls of the
 * old attempt do too. A gather is a round: rank k's n-th all_gather deposits its message in
 * round n and waits until every rank deposited one. A rank can only be one round ahead of
 * the slowest (it deposits round n+1 after round n completed, which needs everyone's round
 * n), so two slots, by round parity, hold every live round.
 *
 * Threads: task threads (local mode) and RPC handler threads (cluster mode) block here on
 * one condition variable; the scheduler thread only takes the lock briefly. Everything is
 * under the table's lock.
 */
#include <string.h>
#include <time.h>

#include "driver/scheduler/scheduler_internal.h"

typedef struct gather_round {
  uint32_t round;
  bool used, complete;
  uint32_t arrived;
  fl_buf *msgs; /* [world] */
  bool *have;   /* [world] */
} gather_round;

typedef struct barrier_stage {
  uint32_t id, attempt, world;
  bool aborted;
  gather_round rounds[2];
  struct barrier_stage *next;
} barrier_stage;

typedef struct barrier_ckpt {
  uint64_t rdd_id;
  fl_buf state;
  struct barrier_ckpt *next;
} barrier_ckpt;

typedef struct barrier_job {
  uint64_t id, group, tag;
  bool closed; /* the job ended: gathers fail, reports are refused */
  barrier_stage *stages;
  barrier_ckpt *ckpts;
  rdd_batch reports; /* records: u64 rdd id, u32 rank, message */
  struct barrier_job *next;
} barrier_job;

struct barrier_table {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  barrier_job *jobs;
};

/* Bytes of reports a job may have waiting for its client. */
#define REPORTS_MAX ((size_t)64 << 20)
/* A waiter looks at its cancel flag at least this often. */
#define POLL_NS 50000000ull

fl_status barrier_table_create(barrier_table **out) {
  barrier_table *t = common_calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "out of memory");
  pthread_condattr_t ca;
  FL_PCHECK(pthread_condattr_init(&ca));
  FL_PCHECK(pthread_condattr_setclock(&ca, CLOCK_MONOTONIC));
  FL_PCHECK(pthread_cond_init(&t->changed, &ca));
  pthread_condattr_destroy(&ca);
  FL_PCHECK(pthread_mutex_init(&t->lock, NULL));
  *out = t;
  return FL_OK;
}

static void round_clear(gather_round *r, uint32_t world) {
  if (r->msgs)
    for (uint32_t i = 0; i < world; i++) fl_buf_free(&r->msgs[i]);
  common_free(r->msgs);
  common_free(r->have);
  memset(r, 0, sizeof *r);
}

static void stage_free(barrier_stage *st) {
  round_clear(&st->rounds[0], st->world);
  round_clear(&st->rounds[1], st->world);
  common_free(st);
}

static void job_free(barrier_job *j) {
  while (j->stages) {
    barrier_stage *st = j->stages;
    j->stages = st->next;
    stage_free(st);
  }
  while (j->ckpts) {
    barrier_ckpt *c = j->ckpts;
    j->ckpts = c->next;
    fl_buf_free(&c->state);
    common_free(c);
  }
  rdd_batch_free(&j->reports);
  common_free(j);
}

void barrier_table_destroy(barrier_table *t) {
  if (!t) return;
  while (t->jobs) {
    barrier_job *j = t->jobs;
    t->jobs = j->next;
    job_free(j);
  }
  pthread_cond_destroy(&t->changed);
  pthread_mutex_destroy(&t->lock);
  common_free(t);
}

static barrier_job *job_find(barrier_table *t, uint64_t job_id) {
  for (barrier_job *j = t->jobs; j; j = j->next)
    if (j->id == job_id) return j;
  return NULL;
}

static barrier_stage *stage_find(barrier_job *j, uint32_t stage) {
  for (barrier_stage *st = j ? j->stages : NULL; st; st = st->next)
    if (st->id == stage) return st;
  return NULL;
}

fl_status barrier_stage_start(barrier_table *t, uint64_t job_id, uint64_t group, uint64_t tag, uint32_t stage,
                              uint32_t attempt, uint32_t world) {
  fl_status status = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_job *j = job_find(t, job_id);
  if (!j) {
    if (!(j = common_calloc(1, sizeof *j))) {
      status = FL_ERR(FL_ENOMEM, "out of memory");
      goto done;
    }
    j->id = job_id;
    j->group = group;
    j->tag = tag;
    j->next = t->jobs;
    t->jobs = j;
  }
  barrier_stage *st = stage_find(j, stage);
  if (!st) {
    if (!(st = common_calloc(1, sizeof *st))) {
      status = FL_ERR(FL_ENOMEM, "out of memory");
      goto done;
    }
    st->id = stage;
    st->next = j->stages;
    j->stages = st;
  }
  round_clear(&st->rounds[0], st->world);
  round_clear(&st->rounds[1], st->world);
  st->attempt = attempt;
  st->world = world;
  st->aborted = false;
  pthread_cond_broadcast(&t->changed);
done:
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return status;
}

void barrier_stage_abort(barrier_table *t, uint64_t job_id, uint32_t stage) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_stage *st = stage_find(job_find(t, job_id), stage);
  if (st) {
    st->aborted = true;
    pthread_cond_broadcast(&t->changed);
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

void barrier_job_abort(barrier_table *t, uint64_t job_id) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_job *j = job_find(t, job_id);
  if (j) {
    j->closed = true;
    pthread_cond_broadcast(&t->changed);
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

void barrier_job_close(barrier_table *t, uint64_t job_id, rdd_batch *reports_left) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  for (barrier_job **p = &t->jobs; *p; p = &(*p)->next)
    if ((*p)->id == job_id) {
      barrier_job *j = *p;
      *p = j->next;
      if (reports_left) {
        *reports_left = j->reports;
        j->reports = (rdd_batch){FL_BUF_INIT, 0};
      }
      job_free(j);
      pthread_cond_broadcast(&t->changed);
      break;
    }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

/* Why a caller of (job, stage, attempt) must stop, or FL_OK. Under the lock. */
static fl_status attempt_gone(barrier_table *t, uint64_t job_id, uint32_t stage, uint32_t attempt,
                              barrier_stage **out) {
  barrier_job *j = job_find(t, job_id);
  barrier_stage *st = stage_find(j, stage);
  if (!j || j->closed || !st)
    return FL_ERR(FL_ECANCELLED, "the job of this barrier stage ended or was cancelled");
  if (st->attempt != attempt || st->aborted)
    return FL_ERR(FL_ECANCELLED, "attempt %u of barrier stage %u was abandoned (another task of it failed "
                  "or its executor was lost)", attempt, stage);
  *out = st;
  return FL_OK;
}

static void deadline_ts(uint64_t ns, struct timespec *ts) {
  ts->tv_sec = (time_t)(ns / 1000000000ull);
  ts->tv_nsec = (long)(ns % 1000000000ull);
}

fl_status barrier_gather(barrier_table *t, uint64_t job_id, uint32_t stage, uint32_t attempt, uint32_t rank,
                         uint32_t round, fl_bytes mine, uint64_t deadline_ns, const atomic_bool *cancel_a,
                         const atomic_bool *cancel_b, rdd_batch *all) {
  fl_status status = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_stage *st = NULL;
  if ((status = attempt_gone(t, job_id, stage, attempt, &st)) != FL_OK) goto done;
  if (rank >= st->world) {
    status = FL_ERR(FL_EPROTO, "all_gather: rank %u of a world of %u", rank, st->world);
    goto done;
  }
  gather_round *r = &st->rounds[round % 2];
  if (!r->used || r->round != round) {
    if (r->used && r->round > round) {
      status = FL_ERR(FL_EPROTO, "all_gather: rank %u is at round %u, others at %u", rank, round, r->round);
      goto done;
    }
    round_clear(r, st->world);
    r->msgs = common_calloc(st->world, sizeof *r->msgs);
    r->have = common_calloc(st->world, sizeof *r->have);
    if (!r->msgs || !r->have) {
      round_clear(r, st->world);
      status = FL_ERR(FL_ENOMEM, "out of memory");
      goto done;
    }
    r->used = true;
    r->round = round;
  }
  if (!r->have[rank]) { /* a repeated deposit (an RPC sent again) keeps the first */
    if ((status = fl_buf_append(&r->msgs[rank], mine.data, mine.len)) != FL_OK) goto done;
    r->have[rank] = true;
    if (++r->arrived == st->world) {
      r->complete = true;
      pthread_cond_broadcast(&t->changed);
    }
  }
  for (;;) {
    if ((status = attempt_gone(t, job_id, stage, attempt, &st)) != FL_OK) goto done;
    r = &st->rounds[round % 2];
    if (r->used && r->round == round && r->complete) break;
    uint64_t now = common_now_ns();
    if ((cancel_a && atomic_load(cancel_a)) || (cancel_b && atomic_load(cancel_b))) {
      status = FL_ERR(FL_ECANCELLED, "all_gather: the task was killed");
      goto done;
    }
    if (now >= deadline_ns) {
      uint32_t arrived = r->used && r->round == round ? r->arrived : 0;
      status = FL_ERR(FL_ETIMEDOUT, "all_gather round %u of barrier stage %u: %u of %u ranks arrived in time",
                      round, stage, arrived, st->world);
      goto done;
    }
    struct timespec ts;
    deadline_ts(now + POLL_NS < deadline_ns ? now + POLL_NS : deadline_ns, &ts);
    pthread_cond_timedwait(&t->changed, &t->lock, &ts);
  }
  for (uint32_t i = 0; i < st->world && status == FL_OK; i++)
    status = rdd_batch_append(all, r->msgs[i].data, r->msgs[i].len);
done:
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return status;
}

fl_status barrier_report(barrier_table *t, uint64_t job_id, uint64_t rdd_id, uint32_t rank, fl_bytes message) {
  fl_status status = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_job *j = job_find(t, job_id);
  if (!j || j->closed) {
    status = FL_ERR(FL_ECANCELLED, "report: the job of this barrier stage ended");
  } else if (j->reports.buf.len + message.len > REPORTS_MAX) {
    status = FL_ERR(FL_ELIMIT, "report: %zu bytes of reports wait for the client already", j->reports.buf.len);
  } else {
    uint8_t head[12];
    memcpy(head, &rdd_id, 8);
    memcpy(head + 8, &rank, 4);
    uint8_t len[COMMON_VARINT_MAX];
    size_t n = common_varint_put(len, 12 + message.len);
    if ((status = fl_buf_reserve(&j->reports.buf, n + 12 + message.len)) == FL_OK) {
      fl_buf_append(&j->reports.buf, len, n);
      fl_buf_append(&j->reports.buf, head, 12);
      fl_buf_append(&j->reports.buf, message.data, message.len);
      j->reports.count++;
      pthread_cond_broadcast(&t->changed);
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return status;
}

bool barrier_report_split(fl_bytes rec, uint64_t *rdd_id, uint32_t *rank, fl_bytes *message) {
  if (rec.len < 12) return false;
  memcpy(rdd_id, rec.data, 8);
  memcpy(rank, rec.data + 8, 4);
  *message = (fl_bytes){rec.data + 12, rec.len - 12};
  return true;
}

/* Moves the reports of matching jobs into *out. Under the lock. */
static void take_locked(barrier_table *t, bool by_tag, uint64_t a, uint64_t b, rdd_batch *out) {
  for (barrier_job *j = t->jobs; j; j = j->next) {
    if (by_tag ? j->group != a || j->tag != b : j->id != a) continue;
    if (!j->reports.count) continue;
    if (!out->count) {
      *out = j->reports;
    } else if (fl_buf_append(&out->buf, j->reports.buf.data, j->reports.buf.len) == FL_OK) {
      out->count += j->reports.count;
      rdd_batch_free(&j->reports);
    } else {
      continue; /* out of memory: they stay for the next take */
    }
    j->reports = (rdd_batch){FL_BUF_INIT, 0};
  }
}

void barrier_take_reports(barrier_table *t, uint64_t job_id, rdd_batch *out) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  take_locked(t, false, job_id, 0, out);
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

void barrier_wait_reports(barrier_table *t, uint64_t group, uint64_t tag, uint64_t deadline_ns,
                          const atomic_bool *cancel, rdd_batch *out) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  for (;;) {
    take_locked(t, true, group, tag, out);
    uint64_t now = common_now_ns();
    if (out->count || now >= deadline_ns || (cancel && atomic_load(cancel))) break;
    struct timespec ts;
    deadline_ts(now + POLL_NS < deadline_ns ? now + POLL_NS : deadline_ns, &ts);
    pthread_cond_timedwait(&t->changed, &t->lock, &ts);
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

fl_status barrier_checkpoint_put(barrier_table *t, uint64_t job_id, uint32_t stage, uint32_t attempt,
                                 uint64_t rdd_id, fl_bytes state) {
  fl_buf copy = FL_BUF_INIT;
  fl_status status = fl_buf_append(&copy, state.data, state.len);
  if (status != FL_OK) return status;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_stage *st;
  if ((status = attempt_gone(t, job_id, stage, attempt, &st)) == FL_OK) {
    barrier_job *j = job_find(t, job_id);
    barrier_ckpt *c = j->ckpts;
    while (c && c->rdd_id != rdd_id) c = c->next;
    if (!c && (c = common_calloc(1, sizeof *c))) {
      c->rdd_id = rdd_id;
      c->next = j->ckpts;
      j->ckpts = c;
    }
    if (!c) {
      status = FL_ERR(FL_ENOMEM, "out of memory");
    } else {
      fl_buf old = c->state;
      c->state = copy;
      copy = old;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  fl_buf_free(&copy);
  return status;
}

fl_status barrier_checkpoint_get(barrier_table *t, uint64_t job_id, uint64_t rdd_id, fl_buf *out) {
  fl_status status = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  barrier_job *j = job_find(t, job_id);
  barrier_ckpt *c = j ? j->ckpts : NULL;
  while (c && c->rdd_id != rdd_id) c = c->next;
  if (!c) status = FL_ERR(FL_ENOENT, "no checkpoint was put for barrier dataset %llu", (unsigned long long)rdd_id);
  else status = fl_buf_append(out, c->state.data, c->state.len);
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return status;
}

/* ---- local mode: a task calls the table directly ----------------------------------------- */

static fl_status local_gather(void *impl, const rdd_task *task, uint32_t round, fl_bytes mine, uint32_t timeout_ms,
                              rdd_batch *all) {
  return barrier_gather(impl, task->job_id, task->barrier.stage, task->barrier.attempt, task->partition, round,
                        mine, common_now_ns() + (uint64_t)timeout_ms * 1000000u, task->cancelled, NULL, all);
}
static fl_status local_report(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes message) {
  return barrier_report(impl, task->job_id, rdd_id, task->partition, message);
}
static fl_status local_put(void *impl, const rdd_task *task, uint64_t rdd_id, fl_bytes state) {
  return barrier_checkpoint_put(impl, task->job_id, task->barrier.stage, task->barrier.attempt, rdd_id, state);
}
static fl_status local_get(void *impl, const rdd_task *task, uint64_t rdd_id, fl_buf *out) {
  return barrier_checkpoint_get(impl, task->job_id, rdd_id, out);
}
const rdd_barrier_ops barrier_local_ops = {local_gather, local_report, local_put, local_get};
