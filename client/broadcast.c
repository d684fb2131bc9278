/*
 * broadcast.c: a remote context's broadcasts, which stay in this process as a Spark driver
 * keeps its TorrentBroadcast values. A small one (BROADCAST_INLINE_MAX, while the live ones
 * total at most BROADCAST_INLINE_TOTAL) is only noted: it goes to the driver with the next
 * RunJob (job.c), until one succeeds. A larger one is lent to the executors by this
 * process's block server (broadcast_server.c), which they fetch it from, each once; the
 * driver is only told its id, length and the server's address.
 *
 * Threading: the runtime's broadcast_created and broadcast_destroyed come from the user's
 * threads; the lists are under the context's lock, which no call to the driver holds.
 */
#include <string.h>

#include "client/client_internal.h"

/* A small broadcast is only noted: it goes to the driver with the next RunJob. */
static bool inline_note(remote_context *c, uint64_t id, uint64_t len) {
  client_broadcasts *b = &c->broadcasts;
  bool noted = false;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (len <= BROADCAST_INLINE_MAX && b->inline_bytes + len <= BROADCAST_INLINE_TOTAL) {
    if (b->num_inline == b->cap_inline) {
      size_t cap = b->cap_inline ? b->cap_inline * 2 : 16;
      void *grown = common_realloc(b->inline_live, cap * sizeof *b->inline_live);
      if (grown) {
        b->inline_live = grown;
        b->cap_inline = cap;
      }
    }
    if (b->num_inline < b->cap_inline) {
      b->inline_live[b->num_inline].id = id;
      b->inline_live[b->num_inline].len = len;
      b->inline_live[b->num_inline].offered = false;
      b->inline_live[b->num_inline].sent = false;
      b->num_inline++;
      b->inline_bytes += len;
      noted = true;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return noted;
}

/* Drops a small broadcast; one the driver has is removed with the next RunJob. False when
 * `id` is not a small one. */
static bool inline_drop(remote_context *c, uint64_t id) {
  client_broadcasts *b = &c->broadcasts;
  bool found = false;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t i = 0; i < b->num_inline; i++) {
    if (b->inline_live[i].id != id) continue;
    found = true;
    if (b->inline_live[i].offered) /* lost on no memory: the driver keeps it until the close */
      client_ids_push(&b->inline_removed, &b->num_inline_removed, &b->cap_inline_removed, id);
    b->inline_bytes -= b->inline_live[i].len;
    b->inline_live[i] = b->inline_live[--b->num_inline];
    break;
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return found;
}

void client_broadcast_take_inline(remote_context *c, client_inline_out *o) {
  client_broadcasts *b = &c->broadcasts;
  memset(o, 0, sizeof *o);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  size_t want = 0;
  for (size_t i = 0; i < b->num_inline; i++) want += !b->inline_live[i].sent;
  o->items = common_calloc(want + 1, sizeof *o->items);
  o->ptrs = common_calloc(want + 1, sizeof *o->ptrs);
  o->loans = common_calloc(want + 1, sizeof *o->loans);
  for (size_t i = 0; i < b->num_inline && o->items && o->ptrs && o->loans; i++) {
    uint64_t total;
    if (b->inline_live[i].sent ||
        rdd_shared_lend(c->pub.shared, b->inline_live[i].id, 0, 0, &o->loans[o->n], &total) != FL_OK)
      continue;
    Flint__InlineBroadcast *item = &o->items[o->n];
    flint__inline_broadcast__init(item);
    item->id = b->inline_live[i].id;
    item->value = (ProtobufCBinaryData){o->loans[o->n].len, (uint8_t *)o->loans[o->n].data};
    o->ptrs[o->n++] = item;
    b->inline_live[i].offered = true; /* a destroy from now on is told to the driver */
  }
  o->removed = b->inline_removed;
  o->num_removed = b->num_inline_removed;
  b->inline_removed = NULL;
  b->num_inline_removed = b->cap_inline_removed = 0;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
}

/* After the RunJob: what the driver did not get goes with the next one. */
void client_broadcast_settle_inline(remote_context *c, client_inline_out *o, bool delivered) {
  client_broadcasts *b = &c->broadcasts;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t k = 0; delivered && k < o->n; k++)
    for (size_t i = 0; i < b->num_inline; i++)
      if (b->inline_live[i].id == o->items[k].id) b->inline_live[i].sent = true;
  for (size_t k = 0; !delivered && k < o->num_removed; k++)
    if (!client_ids_push(&b->inline_removed, &b->num_inline_removed, &b->cap_inline_removed, o->removed[k]))
      break;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  for (size_t k = 0; k < o->n; k++) o->loans[k].release(o->loans[k].arg);
  common_free(o->items);
  common_free(o->ptrs);
  common_free(o->loans);
  common_free(o->removed);
}

fl_status client_broadcast_created(void *impl, uint64_t id, uint64_t len) {
  remote_context *c = impl;
  if (inline_note(c, id, len)) return FL_OK;
  char address[DP_ADDRESS_MAX];
  fl_status st = client_broadcast_server_address(c, address);
  if (st != FL_OK) return st;
  Flint__BroadcastPutRequest req = FLINT__BROADCAST_PUT_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.broadcast_id = id;
  req.total = len;
  req.address = address;
  fl_buf reply = FL_BUF_INIT;
  st = client_rpc_call(c->driver, "/flint.Driver/BroadcastPut", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

void client_broadcast_destroyed(void *impl, uint64_t id) {
  remote_context *c = impl;
  if (inline_drop(c, id)) return;
  Flint__BroadcastRemoveRequest req = FLINT__BROADCAST_REMOVE_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.broadcast_id = id;
  fl_buf reply = FL_BUF_INIT;
  if (client_rpc_call(c->driver, "/flint.Driver/BroadcastRemove", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply) !=
      FL_OK)
    fprintf(stderr, "flint: cannot remove broadcast %llu on the driver: %s\n", (unsigned long long)id,
            fl_last_error());
  fl_buf_free(&reply);
}

void client_broadcast_free(remote_context *c) {
  common_free(c->broadcasts.inline_live);
  common_free(c->broadcasts.inline_removed);
}
