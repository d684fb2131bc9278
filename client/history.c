/*
 * history.c: the history server (fl_history_serve, `flint history`): the web UI over event
 * logs. It replays every log of the folder into a UI of its own (driver/ui/), then serves it;
 * the secret, when one is configured, is required as by a driver's UI.
 *
 * Threading: blocks its caller while it serves; the UI's threads do the rest.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "driver/ui/ui.h"
#include "flint/cluster.h"

/* HOST and PORT of "HOST:PORT" (NULL: 127.0.0.1 and FLINT_UI_PORT). */
static fl_status parse_listen(const char *listen, char *host, size_t cap, int *port, bool *retries) {
  *retries = false;
  if (!listen) {
    snprintf(host, cap, "127.0.0.1");
    *port = (int)config_count(CONFIG_UI_PORT);
    *retries = !config_given(CONFIG_UI_PORT);
    return FL_OK;
  }
  const char *colon = strrchr(listen, ':');
  char *end = NULL;
  long p = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || colon == listen || (size_t)(colon - listen) >= cap || !end || *end || end == colon + 1 || p < 0 ||
      p > 65535)
    return FL_ERR(FL_EINVAL, "--listen '%s' is not HOST:PORT", listen);
  snprintf(host, cap, "%.*s", (int)(colon - listen), listen);
  *port = (int)p;
  return FL_OK;
}

fl_status fl_history_serve(const fl_history_options *o, volatile sig_atomic_t *stop) {
  common_error_clear();
  if (!o || !o->dir || !stop) return FL_ERR(FL_EINVAL, "fl_history_serve: NULL argument");
  char host[256];
  int port = 0;
  bool retries = false;
  fl_status st = parse_listen(o->listen, host, sizeof host, &port, &retries);
  if (st != FL_OK) return st;
  if (access(o->dir, R_OK | X_OK) != 0)
    return FL_ERR(FL_EIO, "cannot read the event log folder %s: %s", o->dir, strerror(errno));
  char *secret = NULL;
  if ((st = config_secret(&secret)) != FL_OK) return st;
  ui_config uc = {.host = host, .port = port, .port_retries = retries, .secret = secret, .title = "history"};
  ui *u = NULL;
  st = ui_create(&uc, &u);
  common_free(secret);
  if (st == FL_OK) st = ui_history_load(u, o->dir);
  if (st == FL_OK && o->port_file) {
    FILE *f = fopen(o->port_file, "w");
    if (!f || fprintf(f, "%d\n", ui_port(u)) < 0 || fclose(f) != 0)
      st = FL_ERR(FL_EIO, "cannot write the port file %s: %s", o->port_file, strerror(errno));
  }
  if (st == FL_OK) {
    common_log(LOG_INFO, "history server of %s available at http://%s:%d", o->dir, host, ui_port(u));
    while (!*stop) usleep(20000);
  }
  ui_destroy(u);
  return st;
}
