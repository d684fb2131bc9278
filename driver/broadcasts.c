/*
 * broadcasts.c: applications' broadcast variables on the driver. A client serves the values
 * of its broadcasts itself (its block server), and tells the driver where (BroadcastPut), so
 * that executors fetch them from there; small ones (BROADCAST_INLINE_MAX) come with its
 * RunJob calls instead, and the driver ships them with the launches of the application's
 * tasks (cluster_launch.c), so that they cost no call of their own. A destroyed broadcast is
 * dropped by every executor (BroadcastRemove).
 *
 * Threading: any handler thread; an application's broadcasts are under app->lock.
 */
#include <errno.h>
#include <string.h>

#include "driver/driver_internal.h"

/* Whether a client's block-server address is HOST:PORT (or [V6]:PORT) that fits where
 * executors keep it, with printable characters only. */
static bool broadcast_address_valid(const char *a) {
  size_t n = strlen(a);
  const char *colon = strrchr(a, ':');
  if (n == 0 || n >= DP_ADDRESS_MAX || !colon || colon == a) return false;
  for (size_t i = 0; i < n; i++)
    if (a[i] <= ' ' || a[i] > '~') return false;
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  return colon[1] && !*end && !errno && port > 0 && port <= 65535;
}

/* Records where the client serves its broadcasts: executors fetch them from there. */
fl_status broadcasts_handle_put(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BroadcastPutRequest, req, body, "BroadcastPut");
  driver_app *app = NULL;
  fl_status st = FL_OK;
  if (!broadcast_address_valid(req->address))
    st = FL_ERR(FL_EPROTO, "BroadcastPut: broadcast %llu has an invalid address \"%.64s\" (want HOST:PORT)",
                (unsigned long long)req->broadcast_id, req->address);
  else if (req->broadcast_id == 0 || req->broadcast_id > UINT32_MAX)
    st = FL_ERR(FL_EPROTO, "BroadcastPut: broadcast id %llu out of range", (unsigned long long)req->broadcast_id);
  if (st == FL_OK) st = apps_lookup(d, req->app_id, req->incarnation, &app);
  if (st == FL_OK) {
    FL_PCHECK(pthread_mutex_lock(&app->lock));
    snprintf(app->broadcast_address, sizeof app->broadcast_address, "%s", req->address);
    FL_PCHECK(pthread_mutex_unlock(&app->lock));
    common_log(LOG_DEBUG, "application %llu: broadcast %llu of %llu bytes served by %s",
               (unsigned long long)req->app_id, (unsigned long long)req->broadcast_id,
               (unsigned long long)req->total, req->address);
    st = driver_empty_reply(response);
  }
  apps_unpin(d, app);
  flint__broadcast_put_request__free_unpacked(req, NULL);
  return st;
}

fl_status broadcasts_handle_remove(driver_state *d, fl_bytes body, fl_buf *response) {
  UNPACK(Flint__BroadcastRemoveRequest, req, body, "BroadcastRemove");
  uint64_t incarnation = req->incarnation, app_id = req->app_id, id = req->broadcast_id;
  flint__broadcast_remove_request__free_unpacked(req, NULL);
  if (incarnation != d->incarnation) /* another application of that id is this driver's */
    return FL_ERR(FL_ENOENT, "no running application %llu on this driver process: it belongs to an earlier "
                  "driver process", (unsigned long long)app_id);
  cluster_remove_broadcast(d->cluster, app_id, id);
  return driver_empty_reply(response);
}

fl_status broadcasts_take(driver_app *app, const Flint__RunJobRequest *req) {
  for (size_t k = 0; k < req->n_removed_broadcasts; k++)
    for (size_t i = 0; i < app->num_broadcasts; i++)
      if (app->broadcasts[i].id == req->removed_broadcasts[k]) {
        app->broadcast_bytes -= app->broadcasts[i].value.len;
        fl_buf_free(&app->broadcasts[i].value);
        app->broadcasts[i] = app->broadcasts[--app->num_broadcasts];
        break;
      }
  for (size_t k = 0; k < req->n_broadcasts; k++) {
    const Flint__InlineBroadcast *b = req->broadcasts[k];
    if (b->id == 0 || b->id > UINT32_MAX)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast id %llu out of range", (unsigned long long)b->id);
    if (b->value.len > BROADCAST_INLINE_MAX)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast %llu has %zu bytes, over the %zu that go with a job",
                    (unsigned long long)b->id, b->value.len, BROADCAST_INLINE_MAX);
    bool have = false;
    for (size_t i = 0; i < app->num_broadcasts && !have; i++) have = app->broadcasts[i].id == b->id;
    if (have) continue;
    if (app->broadcast_bytes + b->value.len > BROADCAST_INLINE_TOTAL)
      return FL_ERR(FL_EPROTO, "RunJob: broadcast %llu would take the application's small broadcasts over %zu bytes",
                    (unsigned long long)b->id, BROADCAST_INLINE_TOTAL);
    if (app->num_broadcasts == app->cap_broadcasts) {
      size_t cap = app->cap_broadcasts ? app->cap_broadcasts * 2 : 8;
      inline_broadcast *grown = common_realloc(app->broadcasts, cap * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory");
      app->broadcasts = grown;
      app->cap_broadcasts = cap;
    }
    inline_broadcast *nb = &app->broadcasts[app->num_broadcasts];
    nb->id = b->id;
    nb->value = (fl_buf)FL_BUF_INIT;
    if (fl_buf_append(&nb->value, b->value.data, b->value.len) != FL_OK) return FL_ERR(FL_ENOMEM, "out of memory");
    app->num_broadcasts++;
    app->broadcast_bytes += b->value.len;
  }
  return FL_OK;
}
