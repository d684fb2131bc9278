/*
 * cluster_task_ends.c: task ends from executors (StatusUpdate). Executors report the ends
 * of attempts in batches: each end is matched to its attempt by the task key, its result is
 * taken (fetched over the data plane from its executor when over 1 MiB), and the batch is
 * posted to the scheduler as task ends. A status may instead report a claim: an executor of
 * the attempt's node runs it in its placement's stead (node-shared tasks).
 *
 * Threading: the rpc queue's thread (which declines updates with a result to fetch) or a
 * handler thread; the in-flight list and claims under cb->lock.
 */
#include <stdio.h>
#include <string.h>

#include "driver/cluster_internal.h"

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
    if (cluster_att(cb->inflight[i])->key == key) t = cb->inflight[i];
  if (!t || !reporter) return NULL; /* its end came first */
  cluster_attempt *a = cluster_att(t);
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
  for (executor_ref *e = cb->executors; e; e = e->next) live_peer |= !e->lost && cluster_ran_on(t, e);
  if (live_peer && owner->peer_lost_ns < t->launched_ns) return NULL;
  return cluster_inflight_take(cb, key);
}

fl_status cluster_status_update(cluster_backend *cb, fl_bytes body, bool may_block, bool *declined) {
  *declined = false;
  Flint__StatusUpdateRequest *req = flint__status_update_request__unpack(NULL, body.len, body.data);
  if (!req) return FL_ERR(FL_EPROTO, "StatusUpdate: malformed message");
  if (req->incarnation != cb->cfg.incarnation) { /* tasks of an earlier driver process */
    unsigned long long theirs = (unsigned long long)req->incarnation;
    flint__status_update_request__free_unpacked(req, NULL);
    return FL_ERR(FL_ESTATE, "StatusUpdate: tasks of driver incarnation %016llx; this is %016llx", theirs,
                  (unsigned long long)cb->cfg.incarnation);
  }
  for (size_t i = 0; i < req->n_statuses && !may_block; i++) *declined |= req->statuses[i]->result_block_size != 0;
  if (*declined) {
    flint__status_update_request__free_unpacked(req, NULL);
    return FL_OK;
  }
  if ((req->n_blocks || req->blocks_dropped) && cb->cfg.blocks_reported) {
    FL_PCHECK(pthread_mutex_lock(&cb->lock));
    bool live = cluster_find_executor(cb, req->executor_id) != NULL; /* a lost one's blocks are gone */
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (live)
      cb->cfg.blocks_reported(cb->cfg.executor_lost_arg, req->executor_id, req->blocks, req->n_blocks,
                              req->blocks_dropped);
  }
  /* The ends go to the scheduler together: posted one by one, each would wake the scheduler
   * thread, which on a busy core takes the CPU back and forth with this one. */
  sched_task *ended[64];
  size_t num_ended = 0;
  for (size_t i = 0; i < req->n_statuses; i++) {
    const Flint__TaskStatus *s = req->statuses[i];
    FL_PCHECK(pthread_mutex_lock(&cb->lock));
    executor_ref *reporter = cluster_find_executor(cb, req->executor_id);
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
    sched_task *t = cluster_inflight_take(cb, s->task_key);
    FL_PCHECK(pthread_mutex_unlock(&cb->lock));
    if (!t) continue; /* killed or already failed: its end no longer matters */
    /* Ran by a node peer that claimed it (the runner is who reports; find_executor gives
     * no lost one, whose report then reads as the placement's, as before). */
    cluster_attempt *a = cluster_att(t);
    if (reporter && reporter != a->placement) a->runner = reporter;
    executor_ref *e = a->runner ? a->runner : a->placement;
    t->rt.status = status_known(s->status) ? (fl_status)s->status : FL_EINTERNAL;
    t->rt.run_ns = s->run_ns;
    t->rt.blocks_mapped = s->blocks_mapped;
    t->rt.blocks_fetched = s->blocks_fetched;
    t->rt.input_bytes = s->input_bytes;
    t->rt.shuffle_read_bytes = s->shuffle_read_bytes;
    t->rt.shuffle_write_bytes = s->shuffle_write_bytes;
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
