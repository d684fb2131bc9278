/*
 * gpu/parallel/train_model.c: the model a training run trains, built-in or a user's.
 *
 * A user's model comes from a shared library that exports an fl_model_builder
 * (include/flint/train.h). The client reads the library file, loads it and builds the model
 * once on the cpu, so that a missing file, a missing symbol or a builder that fails or makes
 * the wrong output is refused before any rank starts; then the file's bytes travel to the ranks
 * as a broadcast, as Spark ships a job's jars. Each process that runs ranks writes the bytes
 * to a temporary file, loads it (once per broadcast: its ranks share the handle) and removes
 * the file; the mapping stays.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/parallel/train_rank.h"

/* Builds the model with `builder` for samples c x h x w, given to the builder with `ndim`
 * dimensions (the last ones: {w}, {h, w} or {c, h, w}; 0 reads as 3), and checks its output.
 * `what` names the library or builder for messages. */
static fl_status build_with(fl_model_builder builder, const char *what, fl_device *dev, uint32_t ndim, uint32_t c,
                            uint32_t h, uint32_t w, uint32_t classes, uint64_t seed, nn_model **out) {
  int64_t shape[3] = {c, h, w};
  if (ndim < 1 || ndim > 3) ndim = 3;
  fl_model *m = NULL;
  fl_status status = FL_OK;
  FL_CHECK(fl_model_create(dev, (int)ndim, shape + 3 - ndim, &m));
  status = builder(m, classes);
  if (status != FL_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", fl_last_error());
    status = fl_set_error(status, "model library %s: its builder failed: %s", what, why);
    goto cleanup;
  }
  int64_t y[FL_MODEL_MAX_SAMPLE_DIMS];
  int nd = fl_model_output_shape(m, y);
  if (nd != 1 || y[0] != (int64_t)classes) {
    char got[64] = "[n";
    for (int i = 0; i < nd; i++) snprintf(got + strlen(got), sizeof got - strlen(got), ", %lld", (long long)y[i]);
    status = fl_set_error(FL_EINVAL, "model library %s: its model's output is %s], expected [n, %u] (one score a "
                          "class)", what, got, classes);
    goto cleanup;
  }
  FL_CHECK(fl_model_finish(m, seed));
  *out = m;
  return FL_OK;
cleanup:
  fl_model_destroy(m);
  return status;
}

/* The builder `symbol` of the loaded library `handle`. */
static fl_status find_builder(void *handle, const char *symbol, const char *what, fl_model_builder *out) {
  dlerror();
  void *fn = dlsym(handle, symbol);
  if (!fn)
    return fl_set_error(FL_ENOENT, "model library %s exports no %s (an fl_model_builder, include/flint/train.h)",
                        what, symbol);
  *(void **)out = fn;
  return FL_OK;
}

fl_status train_model_library_read(const char *path, const char *symbol, uint32_t ndim, uint32_t channels,
                                   uint32_t height, uint32_t width, uint32_t classes, uint64_t seed, fl_buf *bytes,
                                   fl_device *dev, nn_model **model) {
  fl_status status = checkpoint_load_file(path, bytes); /* any whole file, naming it */
  if (status != FL_OK) return common_error_wrap(status, "--model: ");
  if (bytes->len == 0) return fl_set_error(FL_EINVAL, "--model %s: the file is empty", path);
  /* A path without a slash would make dlopen search the library path instead. */
  char where[4096];
  snprintf(where, sizeof where, "%s%s", strchr(path, '/') ? "" : "./", path);
  void *handle = dlopen(where, RTLD_NOW | RTLD_LOCAL);
  if (!handle) return fl_set_error(FL_EFORMAT, "--model %s: cannot load it as a shared library: %s", path, dlerror());
  fl_model_builder builder = NULL;
  fl_device *cpu = NULL;
  nn_model *m = NULL;
  FL_CHECK(find_builder(handle, symbol, path, &builder));
  if (!dev) FL_CHECK(fl_device_open(FL_DEVICE_CPU, 0, &cpu));
  FL_CHECK(build_with(builder, path, dev ? dev : cpu, ndim, channels, height, width, classes, seed, &m));
  if (model) {
    *model = m; /* the builder only appended flint's layers: the model needs nothing of the library */
    m = NULL;
  }
cleanup:
  nn_model_destroy(m);
  fl_device_close(cpu);
  dlclose(handle);
  return status;
}

/* ---- on the ranks' side --------------------------------------------------------------------- */

#define LOADED_MAX 16

/* Libraries loaded in this process, by broadcast: ranks of one process (local mode, or an
 * executor running several) and a retried attempt load each once. */
typedef struct loaded_library {
  uint64_t id;
  void *handle;
} loaded_library;
static struct {
  pthread_mutex_t lock;
  loaded_library loaded[LOADED_MAX];
  int count;
} libraries = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Writes the broadcast library to a temporary file and loads it. */
static fl_status load_shipped(uint64_t id, const char *what, void **out) {
  fl_bytes bytes;
  fl_status status = fl_broadcast_value(id, &bytes);
  if (status != FL_OK) return status;
  const char *tmp = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/flint-model-XXXXXX.so", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemps(path, 3);
  if (fd < 0) return fl_set_error(FL_EIO, "model library %s: cannot make a file beside %s: %s", what, path, strerror(errno));
  FILE *f = fdopen(fd, "wb");
  if (!f || fwrite(bytes.data, 1, bytes.len, f) != bytes.len) status = fl_set_error(FL_EIO, "model library %s: cannot write %s: %s", what, path, strerror(errno));
  if (f ? fclose(f) != 0 : close(fd) != 0) {
    if (status == FL_OK) status = fl_set_error(FL_EIO, "model library %s: cannot write %s: %s", what, path, strerror(errno));
  }
  if (status == FL_OK) {
    *out = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!*out) status = fl_set_error(FL_EFORMAT, "model library %s: cannot load it here: %s", what, dlerror());
  }
  unlink(path);
  return status;
}

static fl_status shipped_builder(const train_arg *a, fl_model_builder *out) {
  fl_status status = FL_OK;
  void *handle = NULL;
  FL_PCHECK(pthread_mutex_lock(&libraries.lock));
  for (int i = 0; i < libraries.count && !handle; i++)
    if (libraries.loaded[i].id == a->model_library_id) handle = libraries.loaded[i].handle;
  if (!handle) {
    status = load_shipped(a->model_library_id, a->model_library_name, &handle);
    if (status == FL_OK && libraries.count < LOADED_MAX)
      libraries.loaded[libraries.count++] = (loaded_library){a->model_library_id, handle};
    /* Beyond LOADED_MAX (a long-lived executor of many runs) the handle stays open unlisted. */
  }
  FL_PCHECK(pthread_mutex_unlock(&libraries.lock));
  if (status != FL_OK) return status;
  return find_builder(handle, a->model_symbol, a->model_library_name, out);
}

fl_status train_model_build(const train_arg *a, fl_device *dev, nn_model **out) {
  if (a->model != NN_LIBRARY) {
    nn_model_spec spec = {.kind = a->model, .channels = (int)a->channels, .height = (int)a->height,
                          .width = (int)a->width, .classes = (int)a->classes, .seed = a->seed};
    return nn_model_create(dev, &spec, out);
  }
  fl_model_builder builder = NULL;
  fl_status status = FL_OK;
  if (a->builder_fn && a->client_pid == (int64_t)getpid()) {
    *(void **)&builder = (void *)(uintptr_t)a->builder_fn; /* local mode: the client's own function */
  } else if (a->model_library_id) {
    status = shipped_builder(a, &builder);
  } else {
    status = fl_set_error(FL_EINVAL, "the model builder %s is in the client's program, which this process is not: in "
                          "cluster mode put it in a shared library (as a job's functions)", a->model_library_name);
  }
  if (status != FL_OK) return status;
  return build_with(builder, a->model_library_name, dev, a->sample_ndim, a->channels, a->height, a->width, a->classes,
                    a->seed, out);
}

fl_status train_model_build_with(fl_model_builder builder, const char *what, fl_device *dev, uint32_t ndim, uint32_t c,
                                 uint32_t h, uint32_t w, uint32_t classes, uint64_t seed, nn_model **out) {
  return build_with(builder, what, dev, ndim, c, h, w, classes, seed, out);
}
