/*
 * block_reports.c: what the driver learns of this executor's cached blocks, for its web UI's
 * storage page (docs/ui.md, BlockUpdated). The block manager tells every change of a block
 * (stored, moved to disk, gone) to exec_block_reports_changed, which queues it; the changes
 * ride on messages the executor sends anyway, with no call of their own: the status update
 * that ends the tasks that stored them, and the heartbeat for those outside tasks (an
 * unpersist, an application's end).
 *
 * Bounded: the queue holds EXEC_BLOCK_UPDATES_MAX changes and drops the oldest beyond (the
 * next message says how many went), and a message carries at most EXEC_BLOCK_UPDATES_PER_CALL
 * (the rest go with the next).
 *
 * Order: a block's changes must reach the driver in the order they happened, but status
 * updates and heartbeats go on two threads. So a sender holds `sending` from taking changes
 * to its call's answer, and the other thread, finding it held, sends its message without
 * changes: the driver handles one call before the next is made. The changes of a call that
 * fails stay queued for the next.
 *
 * Threading: exec_block_reports_changed runs under the block manager's lock (on task and
 * handler threads) and takes only `lock`; begin and end run on the status and heartbeat
 * threads.
 */
#include <string.h>

#include "executor/internal.h"

typedef struct block_change {
  uint64_t app, rdd_id, memory, disk;
  uint32_t partition;
  int32_t level;
} block_change;

struct exec_block_reports {
  pthread_mutex_t lock;    /* the queue */
  pthread_mutex_t sending; /* held by the thread whose message carries changes, until its answer */
  block_change queue[EXEC_BLOCK_UPDATES_MAX]; /* a ring: head is the oldest */
  size_t head, count;
  size_t in_flight;     /* the oldest `in_flight` changes are in the message being sent */
  uint64_t dropped;     /* changes dropped since the last report that told it */
  uint64_t dropped_told; /* of `dropped`, how many the message being sent tells */
  /* The message being sent: its changes (only the holder of `sending` uses these). */
  Flint__BlockUpdate items[EXEC_BLOCK_UPDATES_PER_CALL];
  Flint__BlockUpdate *ptrs[EXEC_BLOCK_UPDATES_PER_CALL];
};

fl_status exec_block_reports_create(exec_block_reports **out) {
  exec_block_reports *r = common_calloc(1, sizeof *r);
  if (!r) return FL_ERR(FL_ENOMEM, "out of memory for the block reports' queue");
  FL_PCHECK(pthread_mutex_init(&r->lock, NULL));
  FL_PCHECK(pthread_mutex_init(&r->sending, NULL));
  *out = r;
  return FL_OK;
}

void exec_block_reports_destroy(exec_block_reports *r) {
  if (!r) return;
  pthread_mutex_destroy(&r->lock);
  pthread_mutex_destroy(&r->sending);
  common_free(r);
}

void exec_block_reports_changed(void *arg, rdd_block_key key, fl_storage_level level, uint64_t memory,
                                uint64_t disk) {
  exec_block_reports *r = arg;
  uint64_t app = key.rdd_id >> APP_SHIFT;
  if (app == 0) return; /* every block of this executor is an application's (exec_app's cache view) */
  FL_PCHECK(pthread_mutex_lock(&r->lock));
  if (r->count == EXEC_BLOCK_UPDATES_MAX) { /* full: the oldest goes */
    r->head = (r->head + 1) % EXEC_BLOCK_UPDATES_MAX;
    r->count--;
    if (r->in_flight) r->in_flight--; /* it is in the message being sent: told if that one arrives */
    else r->dropped++;
  }
  r->queue[(r->head + r->count) % EXEC_BLOCK_UPDATES_MAX] =
      (block_change){app, key.rdd_id & ((1ull << APP_SHIFT) - 1), memory, disk, key.partition, (int32_t)level};
  r->count++;
  FL_PCHECK(pthread_mutex_unlock(&r->lock));
}

void exec_block_reports_clear(exec_block_reports *r) {
  FL_PCHECK(pthread_mutex_lock(&r->lock));
  r->head = r->count = r->in_flight = 0;
  r->dropped = r->dropped_told = 0;
  FL_PCHECK(pthread_mutex_unlock(&r->lock));
}

bool exec_block_reports_begin(exec_block_reports *r, Flint__BlockUpdate ***blocks, size_t *n, uint64_t *dropped) {
  *blocks = NULL;
  *n = 0;
  *dropped = 0;
  if (pthread_mutex_trylock(&r->sending) != 0) return false; /* the other thread's message has them */
  FL_PCHECK(pthread_mutex_lock(&r->lock));
  size_t take = r->count < EXEC_BLOCK_UPDATES_PER_CALL ? r->count : EXEC_BLOCK_UPDATES_PER_CALL;
  for (size_t i = 0; i < take; i++) {
    const block_change *c = &r->queue[(r->head + i) % EXEC_BLOCK_UPDATES_MAX];
    Flint__BlockUpdate *u = &r->items[i];
    flint__block_update__init(u);
    u->app_id = c->app;
    u->rdd_id = c->rdd_id;
    u->partition = c->partition;
    u->memory = c->memory;
    u->disk = c->disk;
    u->level = c->level;
    r->ptrs[i] = u;
  }
  r->in_flight = take;
  r->dropped_told = r->dropped;
  FL_PCHECK(pthread_mutex_unlock(&r->lock));
  if (take == 0 && r->dropped_told == 0) {
    FL_PCHECK(pthread_mutex_unlock(&r->sending));
    return false;
  }
  *blocks = r->ptrs;
  *n = take;
  *dropped = r->dropped_told;
  return true;
}

void exec_block_reports_end(exec_block_reports *r, bool told) {
  FL_PCHECK(pthread_mutex_lock(&r->lock));
  if (told) {
    r->head = (r->head + r->in_flight) % EXEC_BLOCK_UPDATES_MAX;
    r->count -= r->in_flight;
    r->dropped = r->dropped > r->dropped_told ? r->dropped - r->dropped_told : 0;
  }
  r->in_flight = 0;
  r->dropped_told = 0;
  FL_PCHECK(pthread_mutex_unlock(&r->lock));
  FL_PCHECK(pthread_mutex_unlock(&r->sending));
}
