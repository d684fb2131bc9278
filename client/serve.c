/*
 * serve.c: the public entry points of a cluster's processes (flint/cluster.h), which
 * `flint driver` and `flint executor` call: each reads the shared secret as a client does
 * (rpc.c) and runs the process until *stop becomes nonzero. They live here, above driver/
 * and executor/, because the secret is read in one place.
 *
 * Threading: each blocks its caller for the process's life.
 */
#include "client/client_internal.h"
#include "flint/cluster.h"

fl_status fl_driver_serve(const fl_driver_options *o, volatile sig_atomic_t *stop) {
  common_error_clear();
  if (!o || !stop) return FL_ERR(FL_EINVAL, "fl_driver_serve: NULL argument");
  char *secret = NULL;
  fl_status st = config_secret(&secret);
  if (st != FL_OK) return st;
  driver_config cfg = {.listen = o->listen, .secret = secret, .work_dir = o->work_dir, .port_file = o->port_file};
  st = driver_serve(&cfg, stop);
  common_free(secret);
  return st;
}

int fl_executor_supervise(char *const *argv, volatile sig_atomic_t *stop) {
  common_error_clear();
  char *secret = NULL;
  if (config_secret(&secret) != FL_OK) {
    fprintf(stderr, "flint executor: %s\n", fl_last_error());
    return 1;
  }
  int rc = executor_supervise(argv, secret, stop);
  common_free(secret);
  return rc;
}

fl_status fl_executor_serve(const fl_executor_options *o, volatile sig_atomic_t *stop) {
  common_error_clear();
  if (!o || !stop) return FL_ERR(FL_EINVAL, "fl_executor_serve: NULL argument");
  char *secret = NULL;
  fl_status st = config_secret(&secret);
  if (st != FL_OK) return st;
  executor_config cfg = {.driver = o->driver, .host = o->host, .cores = o->cores, .memory = o->memory,
                         .work_dir = o->work_dir, .secret = secret, .gpu = o->has_gpu ? (int32_t)o->gpu : -1};
  st = executor_serve(&cfg, stop);
  common_free(secret);
  return st;
}
