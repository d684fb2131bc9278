/*
 * rdd/service.c: the process's services (flint.h, fl_service_register) and fl_service_call,
 * which runs one here or, for a context whose scheduler is elsewhere (a cluster's driver),
 * through the context's runtime.
 *
 * Threading: the registry is under one mutex; a service runs on the caller's thread here, on
 * an rpc handler thread in a driver.
 */
#include <pthread.h>
#include <string.h>

#include "rdd/rdd.h"

#define SERVICES_MAX 32
#define NAME_MAX_LEN 63

static pthread_mutex_t services_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char name[NAME_MAX_LEN + 1];
  fl_service_fn fn;
} services[SERVICES_MAX];
static int num_services;

fl_status fl_service_register(const char *name, fl_service_fn fn) {
  common_error_clear();
  if (!name || !*name || strlen(name) > NAME_MAX_LEN || !fn)
    return FL_ERR(FL_EINVAL, "fl_service_register: a name of 1 to %d bytes and a function", NAME_MAX_LEN);
  fl_status st = FL_OK;
  pthread_mutex_lock(&services_mu);
  int i = 0;
  while (i < num_services && strcmp(services[i].name, name) != 0) i++;
  if (i == num_services && num_services == SERVICES_MAX)
    st = FL_ERR(FL_ELIMIT, "fl_service_register: %d services already", SERVICES_MAX);
  if (st == FL_OK) {
    strcpy(services[i].name, name);
    services[i].fn = fn;
    if (i == num_services) num_services++;
  }
  pthread_mutex_unlock(&services_mu);
  return st;
}

fl_service_fn rdd_service_find(const char *name) {
  fl_service_fn fn = NULL;
  pthread_mutex_lock(&services_mu);
  for (int i = 0; i < num_services && !fn; i++)
    if (strcmp(services[i].name, name) == 0) fn = services[i].fn;
  pthread_mutex_unlock(&services_mu);
  return fn;
}

fl_status fl_service_call(fl_dataset *job, const char *name, fl_bytes request, fl_buf *reply) {
  common_error_clear();
  if (!job || !name || !reply || (request.len && !request.data))
    return FL_ERR(FL_EINVAL, "fl_service_call: NULL argument");
  const rdd_runtime_ops *rt = job->ctx->runtime;
  if (rt->call_service) return rt->call_service(job->ctx->runtime_impl, job, name, request, reply);
  fl_service_fn fn = rdd_service_find(name);
  if (!fn) return FL_ERR(FL_ENOENT, "no service '%s' is registered in this process", name);
  return fn(job, request, reply);
}
