/*
 * tasks.c: task attempts and the reports of their ends. A launched task (struct exec_task) is
 * decoded from its description, queued, and run on a thread of the task pool; a node peer's
 * task offered here (an offer) runs only once claimed in its owner's claim table (mapped here
 * on first use), and an own task that a peer claimed is reported as such.
 * The status thread sends every ended task waiting at the moment in one StatusUpdate, holding
 * them a little while more tasks are queued (STATUS_HOLD_NS); a large result stays here as a
 * block that the driver fetches (handlers.c serves it).
 *
 * Threading: exec_task_decode and exec_task_queue run on the thread that handles a launch,
 * task_run on task threads, exec_task_status_main is the status thread. svc->lock guards the
 * running list, the status queue (done_head, done_tail), the results and the peers' claim
 * tables; svc->wake wakes the status thread, which ended tasks signal only when it must send
 * (each wake-up takes a core from the tasks). Task threads never touch sockets.
 */
#include <string.h>
#include <unistd.h>

#include "executor/internal.h"

/* Task results above this size stay here as blocks for the driver to fetch; smaller ones
 * travel inline in the status update. */
#define INLINE_RESULT_MAX (1u << 20)

/* The process's exit status when fault injection kills it. */
#define FAULT_EXIT_STATUS 86

/* Sleeps `ns`, waking every 10 ms to see whether the task was killed. */
static void fault_nap(const rdd_task *rt, uint64_t ns) {
  uint64_t end = common_now_ns() + ns;
  while (!rdd_task_cancelled(rt)) {
    uint64_t now = common_now_ns();
    if (now >= end) break;
    uint64_t step = end - now < 10000000u ? end - now : 10000000u;
    struct timespec ts = {0, (long)step};
    nanosleep(&ts, NULL);
  }
}

/* A task has ended (reported, or an offer dropped). svc->lock held. */
static exec_app *task_done_locked(exec_service *svc, exec_task *t) {
  if (t->peer) t->peer->refs--;
  t->peer = NULL;
  return exec_app_release_locked(svc, t->app);
}

void exec_task_free(exec_task *t) {
  if (t->owns_action) rdd_action_clear(&t->action);
  if (t->rdd) rdd_release(t->rdd);
  rdd_task_clear(&t->rt);
  fl_buf_free(&t->result);
  common_free(t);
}

/* Takes an ended (or skipped) task off the running list; svc->lock held. */
static void running_remove(exec_service *svc, exec_task *t) {
  for (exec_task **p = &svc->running; *p; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      break;
    }
  t->next = NULL;
}

/* Whether t runs here: a killed task does (to report its end), anything else once claimed.
 * The kill handler cancels before it claims, so a claim lost to a kill reads as killed; an
 * offer is only ever run once claimed. */
static bool task_claim(exec_task *t) {
  if (t->offer) /* a cancelled offer (this executor stops) is nobody's business here */
    return !rdd_task_cancelled(&t->rt) && claim_table_take(t->claims, t->key, false);
  if (!t->claims || rdd_task_cancelled(&t->rt)) return true;
  if (claim_table_take(t->claims, t->key, true)) return true;
  return rdd_task_cancelled(&t->rt);
}

static void task_run(task_pool_work *work) {
  exec_task *t = (exec_task *)work;
  exec_service *svc = t->app->svc;
  uint64_t t0 = common_now_ns();
  if (!t->offer) atomic_fetch_sub(&svc->own_queued, 1);
  bool skip = !task_claim(t);
  if (!skip && t->offer) { /* the status thread tells the driver if it runs long (claims_due) */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    t->claimed_ns = t0;
    pthread_cond_signal(&svc->wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  if (skip && t->offer) { /* the owner or another peer has it: nothing to report */
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    running_remove(svc, t);
    if (svc->done_head && atomic_load(&svc->own_queued) == 0) pthread_cond_signal(&svc->wake);
    exec_app *gone = task_done_locked(svc, t);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    exec_task_free(t);
    if (gone) exec_app_remove_all(svc, gone);
    return;
  }
  /* Ended tasks held while own tasks were queued go once none is (the driver should send
   * more; offers queued behind hold nothing), unless the driver has nothing waiting and they
   * are all of this task's job: then a report could not end the job before this task does,
   * and waking the status thread now would take this task's core. They go with this task's
   * end, or at the hold's deadline. */
  if (atomic_load(&svc->own_queued) == 0) {
    bool hold = atomic_load(&svc->none_pending);
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    for (exec_task *d = svc->done_head; d && hold; d = d->next)
      hold = d->app == t->app && d->rt.job_id == t->rt.job_id;
    if (svc->done_head && !hold) pthread_cond_signal(&svc->wake);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  }
  if (skip) { /* an owner's task that a peer claimed: the peer reports its end */
    t->claimed = true;
    rdd_task_fail(&t->rt, FL_ERR(FL_ECANCELLED, "claimed by another executor of this node"));
  } else {
    common_trace_partition("task.start", t->rt.partition);
    executor_report_task named = {t->key, t->app->id, t->rdd->id, t->rt.partition};
    executor_report_running(&named); /* for the last words, if user code ends the process */
    if (!rdd_task_cancelled(&t->rt)) rdd_task_run(&t->rt, t->rdd, &t->action, &t->result);
    else rdd_task_fail(&t->rt, FL_ERR(FL_ECANCELLED, "task killed"));
    executor_report_running(NULL);
    common_trace_partition("task.end", t->rt.partition);
  }
  if (svc->fault_slowdown > 1) fault_nap(&t->rt, (uint64_t)((double)(common_now_ns() - t0) * (svc->fault_slowdown - 1)));
  if (svc->fault_exit_after && atomic_load(&svc->tasks_run) + 1 >= svc->fault_exit_after) {
    common_log(LOG_WARN, "fault injection: exiting after %llu tasks", (unsigned long long)svc->fault_exit_after);
    _exit(FAULT_EXIT_STATUS);
  }
  if (!skip) {
    atomic_fetch_add(&svc->tasks_run, 1);
    if (t->rt.status != FL_OK) atomic_fetch_add(&svc->tasks_failed, 1);
  }
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  running_remove(svc, t);
  /* The status thread waits for a first ended task, then holds while tasks are queued and
   * all went well: only those changes wake it (each wake-up takes a core from the tasks). A
   * claimed task is no failure: its report can wait with the others. */
  bool wake = !svc->done_head || (t->rt.status != FL_OK && !skip) || atomic_load(&svc->own_queued) == 0;
  if (svc->done_tail) svc->done_tail->next = t;
  else svc->done_head = t;
  svc->done_tail = t;
  if (wake) pthread_cond_signal(&svc->wake);
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
}

/* The claim table of node peer `executor` (process `pid`), mapped on first use and referenced
 * for the offer; NULL when it cannot be mapped, or 16 peers' tables are in use: its offers
 * are then left to their owner. A table no queued offer uses is unmapped when another peer's
 * needs the room (peers come and go; a gone one's table lives while it is mapped). svc->lock
 * held. */
static struct peer_claims *peer_claims(exec_service *svc, uint32_t pid, uint64_t executor) {
  struct peer_claims *free_entry = NULL;
  for (size_t i = 0; i < svc->num_peers; i++) {
    struct peer_claims *p = &svc->peers[i];
    if (p->pid == pid && p->executor == executor) {
      p->refs++;
      return p;
    }
    if (!p->refs && !free_entry) free_entry = p;
  }
  if (svc->num_peers < sizeof svc->peers / sizeof *svc->peers) free_entry = &svc->peers[svc->num_peers];
  if (!free_entry) return NULL;
  claim_table *t = NULL;
  if (claim_table_open(pid, &t) != FL_OK) {
    common_log(LOG_DEBUG, "offers of executor %llu (process %u) left to it: %s", (unsigned long long)executor, pid,
               fl_last_error());
    return NULL;
  }
  if (free_entry == &svc->peers[svc->num_peers]) svc->num_peers++;
  else claim_table_free(free_entry->table);
  *free_entry = (struct peer_claims){pid, executor, t, 1};
  return free_entry;
}

/* Fills task `t` (zeroed) from description `d` of launch `req` of application `app`: its
 * dataset, its action or the shuffle it writes, its barrier rank. app->lock held. On an error,
 * `t` is left for exec_task_free. */
fl_status exec_task_decode(exec_app *app, const Flint__LaunchTasksRequest *req, const Flint__TaskDescription *d,
                           exec_task *t) {
  exec_service *svc = app->svc;
  fl_status status = FL_OK;
  t->app = app;
  t->key = d->task_key;
  t->offer = d->offer;
  if (d->shuffle_id == 0 && (d->action_index == 0 || d->action_index > req->n_actions))
    return FL_ERR(FL_EPROTO, "task %llu: action %u of a batch of %zu", (unsigned long long)d->task_key,
                  d->action_index, req->n_actions);
  t->rdd = rdd_plan_find(app->plan, d->rdd_id);
  if (!t->rdd)
    return FL_ERR(FL_EPROTO, "task %llu: unknown dataset %llu", (unsigned long long)d->task_key,
                  (unsigned long long)d->rdd_id);
  rdd_retain(t->rdd);
  if (d->partition >= t->rdd->num_partitions)
    return FL_ERR(FL_EPROTO, "task %llu: partition %u of a dataset with %u",
                  (unsigned long long)d->task_key, d->partition, t->rdd->num_partitions);
  if (d->shuffle_id == 0) { /* a result task (an encoded action may be empty: count) */
    const ProtobufCBinaryData *a = &req->actions[d->action_index - 1];
    status = rdd_action_decode(app->plan, (fl_bytes){a->data, a->len}, &t->action);
    t->owns_action = status == FL_OK;
  } else {
    const rdd_shuffle_dep *dep = rdd_plan_find_shuffle(app->plan, d->shuffle_id);
    if (!dep || dep->parent != t->rdd)
      status = FL_ERR(FL_EPROTO, "task %llu: no shuffle %llu over dataset %llu",
                      (unsigned long long)d->task_key, (unsigned long long)d->shuffle_id,
                      (unsigned long long)d->rdd_id);
    t->action.kind = RDD_ACTION_SHUFFLE_WRITE;
    t->action.dep = dep;
  }
  atomic_init(&t->cancelled, false);
  t->rt.ctx = &app->ctx;
  t->rt.job_id = d->job_id;
  t->rt.partition = d->partition;
  t->rt.attempt = d->attempt;
  t->rt.cancelled = &t->cancelled;
  if (d->barrier) {
    if (d->barrier_world == 0 || d->partition >= d->barrier_world)
      return FL_ERR(FL_EPROTO, "task %llu: rank %u of a barrier stage of %u", (unsigned long long)d->task_key,
                    d->partition, d->barrier_world);
    t->rt.barrier = (rdd_barrier_info){.on = true, .stage = d->barrier_stage, .attempt = d->barrier_attempt,
                                       .world = d->barrier_world, .gpu = svc->cfg.gpu};
  }
  t->work.run = task_run;
  return status;
}

/* Queues the decoded tasks[0, n) of launch `req` of application `app` and takes them over;
 * `tasks` has room for 2n (the second half holds the order they are queued in). An offer that
 * cannot be claimed here is dropped; the others join the running list, hold the application and
 * go to the pool: own tasks in launch order, then the offers from the last. */
void exec_task_queue(exec_app *app, const Flint__LaunchTasksRequest *req, exec_task **tasks) {
  exec_service *svc = app->svc;
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  size_t kept = 0;
  for (size_t i = 0; i < req->n_tasks; i++) {
    exec_task *t = tasks[i];
    const Flint__TaskDescription *d = req->tasks[i];
    /* An offer this executor cannot claim (its owner's table is not to be had here, or the
     * offer makes no sense: a barrier task, this very process) is left to its owner. */
    if (t->offer && !d->barrier && d->owner_pid && d->owner_pid != svc->pid)
      t->peer = peer_claims(svc, d->owner_pid, d->owner_executor);
    t->claims = t->offer ? (t->peer ? t->peer->table : NULL) : svc->claims;
    if (t->offer && !t->claims) {
      exec_task_free(t);
      continue;
    }
    tasks[kept++] = t;
    t->next = svc->running;
    svc->running = t;
    atomic_fetch_add(&app->tasks_running, 1);
    if (app->removed) atomic_store(&t->cancelled, true); /* its driver is being forgotten */
  }
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  atomic_store(&svc->none_pending, req->none_pending); /* launches arrive in order: one sender */
  /* Own tasks in launch order, then the offers from the last: a peer starts its tasks from
   * the first, so the two meet in the middle, as in work stealing. The order is settled
   * before the first submit: a submitted task may end and be freed at once. */
  size_t own = 0, offers = 0;
  exec_task **order = tasks + req->n_tasks;
  for (size_t i = 0; i < kept; i++) own += !tasks[i]->offer;
  for (size_t i = 0; i < kept; i++)
    if (tasks[i]->offer) order[kept - 1 - offers++] = tasks[i];
    else order[i - offers] = tasks[i];
  atomic_fetch_add(&svc->own_queued, own);
  uint64_t newest = 0, oldest = 0;
  for (size_t i = 0; i < kept; i++)
    if (!tasks[i]->offer && tasks[i]->key > newest) newest = tasks[i]->key;
  FL_PCHECK(pthread_mutex_lock(&svc->lock));
  for (exec_task *t = svc->running; t; t = t->next)
    if (!t->offer && (!oldest || t->key < oldest)) oldest = t->key;
  FL_PCHECK(pthread_mutex_unlock(&svc->lock));
  if (svc->claims && newest) claim_table_trim(svc->claims, newest, oldest); /* before the submits free them */
  for (size_t i = 0; i < kept; i++) task_pool_submit(svc->pool, &order[i]->work);
}

/* Frees a list of ended tasks, and each application whose last hold one was. */
static void tasks_release(exec_service *svc, exec_task *list) {
  while (list) {
    exec_task *next = list->next;
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    exec_app *gone = task_done_locked(svc, list);
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    exec_task_free(list);
    if (gone) exec_app_remove_all(svc, gone);
    list = next;
  }
}

/* Ended tasks wait (svc->lock held) while more are queued here, up to STATUS_HOLD_NS, so
 * that one call reports several: where every core runs a task, each call takes a core from
 * them. A failure (the driver retries it), a task ending with the queue empty, the queue
 * emptying when the driver may have more to send (task_run), or the deadline sends at once;
 * the deadline bounds what speculation sees late. */
#define STATUS_HOLD_NS 20000000ull

static bool status_may_wait(exec_service *svc) {
  if (svc->stopping || atomic_load(&svc->own_queued) == 0) return false;
  for (exec_task *t = svc->done_head; t; t = t->next)
    if (t->rt.status != FL_OK && !t->claimed) return false;
  return true;
}

/* Waits on svc->wake (svc->lock held) for at most ns nanoseconds. */
static void status_sleep(exec_service *svc, uint64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* svc->wake runs on the realtime clock */
  ns += (uint64_t)ts.tv_nsec;
  ts.tv_sec += (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  pthread_cond_timedwait(&svc->wake, &svc->lock, &ts);
}

static void status_hold(exec_service *svc) {
  uint64_t deadline = common_now_ns() + STATUS_HOLD_NS;
  while (status_may_wait(svc)) {
    uint64_t now = common_now_ns();
    if (now >= deadline) return;
    status_sleep(svc, deadline - now);
  }
}

/* A node peer's task that this executor claimed and still runs after this long is told to
 * the driver (TaskStatus.claimed from the claimer): until its owner reaches it in its queue,
 * the driver would take it for the owner's, and could put a backup copy behind it here.
 * Shorter ones cost no message: their end says where they ran. */
#define CLAIM_TELL_NS 20000000ull

/* When the next claimed offer is due to be told (svc->lock); 0: none is. */
static uint64_t claim_due_ns(exec_service *svc) {
  uint64_t due = 0;
  for (exec_task *t = svc->running; t; t = t->next)
    if (t->claimed_ns && !t->claim_told && (!due || t->claimed_ns + CLAIM_TELL_NS < due))
      due = t->claimed_ns + CLAIM_TELL_NS;
  return due;
}

/* Waits (svc->lock held) for an ended task, a claim due to be told, or the stop. */
static void status_wait(exec_service *svc) {
  while (!svc->done_head && !svc->stopping) {
    uint64_t due = claim_due_ns(svc), now = common_now_ns();
    if (!due) {
      pthread_cond_wait(&svc->wake, &svc->lock);
      continue;
    }
    if (due <= now) return;
    status_sleep(svc, due - now);
  }
}

/* The keys of the claimed offers due to be told, at most max (svc->lock); marks them told. */
static size_t claims_due(exec_service *svc, uint64_t *keys, size_t max) {
  uint64_t now = common_now_ns();
  size_t n = 0;
  for (exec_task *t = svc->running; t && n < max; t = t->next)
    if (t->claimed_ns && !t->claim_told && t->claimed_ns + CLAIM_TELL_NS <= now) {
      t->claim_told = true;
      keys[n++] = t->key;
    }
  return n;
}

/* Sends every ended task waiting at the moment, and the claims due, in one StatusUpdate. */
void *exec_task_status_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-status");
  exec_service *svc = arg;
  for (;;) {
    FL_PCHECK(pthread_mutex_lock(&svc->lock));
    status_wait(svc);
    status_hold(svc);
    exec_task *batch = svc->done_head;
    svc->done_head = svc->done_tail = NULL;
    uint64_t incarnation = atomic_load(&svc->incarnation);
    exec_task *stale = NULL; /* tasks of an earlier driver (driver_forget): not reported */
    for (exec_task **p = &batch; *p;) {
      exec_task *t = *p;
      if (t->app->incarnation == incarnation) {
        p = &t->next;
        continue;
      }
      *p = t->next;
      t->next = stale;
      stale = t;
    }
    uint64_t told[64];
    size_t num_told = claims_due(svc, told, sizeof told / sizeof *told);
    bool stopping = svc->stopping;
    FL_PCHECK(pthread_mutex_unlock(&svc->lock));
    tasks_release(svc, stale);
    if (!batch && !num_told) {
      if (stopping) return NULL;
      continue;
    }
    size_t n = num_told;
    for (exec_task *t = batch; t; t = t->next) n++;
    Flint__TaskStatus *statuses = common_calloc(n, sizeof *statuses);
    Flint__TaskStatus **ptrs = common_calloc(n, sizeof *ptrs);
    size_t nacc = 0;
    for (exec_task *t = batch; t; t = t->next) nacc += t->rt.num_acc_updates;
    Flint__AccUpdate *accs = common_calloc(nacc ? nacc : 1, sizeof *accs);
    Flint__AccUpdate **acc_ptrs = common_calloc(nacc ? nacc : 1, sizeof *acc_ptrs);
    if (statuses && ptrs && accs && acc_ptrs) {
      size_t i = 0, k = 0;
      for (; i < num_told; i++) { /* "this executor runs it": a claim, from the claimer */
        flint__task_status__init(&statuses[i]);
        statuses[i].task_key = told[i];
        statuses[i].claimed = true;
        ptrs[i] = &statuses[i];
      }
      for (exec_task *t = batch; t; t = t->next, i++) {
        Flint__TaskStatus *s = &statuses[i];
        flint__task_status__init(s);
        s->task_key = t->key;
        s->status = t->rt.status;
        s->error = t->rt.error ? t->rt.error : "";
        s->fetch_failed = t->rt.fetch_failed;
        s->fetch_shuffle_id = t->rt.fetch_shuffle_id;
        s->fetch_map = t->rt.fetch_map;
        s->run_ns = t->rt.run_ns;
        s->blocks_mapped = t->rt.blocks_mapped;
        s->blocks_fetched = t->rt.blocks_fetched;
        s->input_bytes = t->rt.input_bytes;
        s->shuffle_read_bytes = t->rt.shuffle_read_bytes;
        s->shuffle_write_bytes = t->rt.shuffle_write_bytes;
        s->claimed = t->claimed;
        if (t->result.len > INLINE_RESULT_MAX) {
          result_block *rb = common_calloc(1, sizeof *rb);
          if (rb) {
            rb->task_key = t->key;
            rb->bytes = t->result; /* handed over */
            t->result = (fl_buf)FL_BUF_INIT;
            s->result_block_size = rb->bytes.len;
            FL_PCHECK(pthread_mutex_lock(&svc->lock));
            rb->next = svc->results;
            svc->results = rb;
            FL_PCHECK(pthread_mutex_unlock(&svc->lock));
          } else {
            s->status = FL_ENOMEM;
            s->error = "out of memory for a large task result";
          }
        } else {
          s->result.data = t->result.data;
          s->result.len = t->result.len;
        }
        s->acc_updates = &acc_ptrs[k];
        for (uint32_t j = 0; j < t->rt.num_acc_updates; j++, k++) {
          flint__acc_update__init(&accs[k]);
          accs[k].id = t->rt.acc_updates[j].id;
          accs[k].value.data = t->rt.acc_updates[j].value.data;
          accs[k].value.len = t->rt.acc_updates[j].value.len;
          acc_ptrs[k] = &accs[k];
          s->n_acc_updates++;
        }
        ptrs[i] = s;
      }
      Flint__StatusUpdateRequest req = FLINT__STATUS_UPDATE_REQUEST__INIT;
      req.executor_id = svc->id;
      req.incarnation = incarnation;
      req.n_statuses = n;
      req.statuses = ptrs;
      /* the blocks these tasks stored, and the evictions that made room for them */
      bool blocks = exec_block_reports_begin(svc->block_reports, &req.blocks, &req.n_blocks, &req.blocks_dropped);
      bool told = false;
      fl_buf body = FL_BUF_INIT, reply = FL_BUF_INIT;
      if (proto_pack(&req.base, &body) == FL_OK) {
        told = exec_driver_call(svc, "/flint.Driver/StatusUpdate", fl_buf_bytes(&body), RPC_TIMEOUT_MS,
                                &svc->abandon_statuses, &reply) == FL_OK;
        if (!told && !atomic_load(&svc->abandon_statuses))
          common_log(LOG_WARN, "status update of %zu tasks failed: %s", n, fl_last_error());
      }
      if (blocks) exec_block_reports_end(svc->block_reports, told);
      fl_buf_free(&body);
      fl_buf_free(&reply);
    } else {
      common_log(LOG_ERROR, "out of memory: %zu task statuses lost", n);
    }
    common_free(statuses);
    common_free(ptrs);
    common_free(accs);
    common_free(acc_ptrs);
    tasks_release(svc, batch);
  }
}

