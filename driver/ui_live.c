/*
 * ui_live.c: what the driver's web UI shows beyond its events (ui_config.live): the
 * executors' last heartbeats, from the cluster backend's registry, as the API merges them
 * into /executors, and the parameter servers' workers' clocks (ps_placement.c), into /ps.
 * Runs on the UI's HTTP thread; takes the backend's lock briefly, and asks the servers with a
 * short timeout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "driver/driver_internal.h"

/* {"<executor id>": {"lastHeartbeat": ms since the epoch, ...}, ...} */
static char *executors_live(driver_state *d) {
  void **infos = NULL;
  size_t n = 0;
  if (cluster_describe(d->cluster, &infos, &n) != FL_OK) return NULL;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  uint64_t now_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
  fl_buf b = FL_BUF_INIT;
  bool ok = common_buf_printf(&b, "{") == FL_OK;
  for (size_t i = 0; i < n; i++) {
    Flint__ExecutorInfo *x = infos[i];
    ok = ok && common_buf_printf(&b, "%s\"%llu\":{\"lastHeartbeat\":%llu,\"cachedBytes\":%llu}", i ? "," : "",
                                 (unsigned long long)x->id, (unsigned long long)(now_ms - x->heartbeat_age_ms),
                                 (unsigned long long)x->cached_bytes) == FL_OK;
    common_free(x->address);
    common_free(x);
  }
  common_free(infos);
  ok = ok && common_buf_printf(&b, "}") == FL_OK;
  if (!ok) {
    fl_buf_free(&b);
    return NULL;
  }
  char *text = strdup((const char *)b.data);
  fl_buf_free(&b);
  return text;
}

char *driver_ui_live(void *arg, const char *what, uint64_t app) {
  driver_state *d = arg;
  if (strcmp(what, "executors") == 0) return executors_live(d);
  if (strcmp(what, "ps") == 0) return placement_live_json(d, app);
  return NULL;
}
