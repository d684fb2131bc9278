/*
 * plan_send.c: what a job tells the driver of its lineage. The client sends each dataset's
 * plan node once (rdd/plan.c skips the ones the driver has), the storage level of every
 * persisted dataset with each job, and the datasets freed since the last job, so that the
 * driver frees them too. Functions travel as (library, symbol): each library is uploaded once
 * per application under its content id.
 *
 * Threading: the context's lock guards c->plans; it is released around the calls that
 * upload a library, so two jobs may upload one library at once (the driver keeps one).
 */
#include <string.h>

#include "client/client_internal.h"

/* ---- libraries ------------------------------------------------------------------------- */

/* A content id: two independent 64-bit hashes, as 32 hex digits. Libraries are not trusted
 * by their id (the driver stores what it is sent); the id only avoids sending one twice. */
static void content_id(fl_bytes data, char id[33]) {
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < data.len; i++) fnv = (fnv ^ data.data[i]) * 0x100000001b3ull;
  snprintf(id, 33, "%016llx%016llx", (unsigned long long)common_hash_bytes(data.data, data.len),
           (unsigned long long)(fnv ^ data.len));
}

/* rdd_fn_codec.library_id: the id of the library at `path`, uploaded first when the
 * application lacks it. */
static fl_status library_id(void *arg, const char *path, bool in_main_program, char *id, size_t len) {
  remote_context *c = arg;
  if (in_main_program)
    return FL_ERR(FL_EINVAL,
                  "it lives in the main program (%s), which is not a shared library: in cluster "
                  "mode user functions must be in a shared library (build the job as a .so and "
                  "run it with flint submit, or move the functions into a library)",
                  path);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t i = 0; i < c->plans.num_libraries; i++)
    if (strcmp(c->plans.libraries[i].path, path) == 0) {
      snprintf(id, len, "%s", c->plans.libraries[i].id);
      FL_PCHECK(pthread_mutex_unlock(&c->lock));
      return FL_OK;
    }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));

  fl_buf content = FL_BUF_INIT, reply = FL_BUF_INIT;
  char cid[33];
  fl_status st = common_read_file(path, &content);
  if (st != FL_OK) goto done;
  content_id(fl_buf_bytes(&content), cid);
  Flint__HasLibraryRequest has = FLINT__HAS_LIBRARY_REQUEST__INIT;
  has.app_id = c->app_id;
  has.incarnation = c->incarnation;
  has.id = cid;
  const char *slash = strrchr(path, '/');
  has.name = (char *)(slash ? slash + 1 : path);
  if ((st = client_rpc_call(c->driver, "/flint.Driver/HasLibrary", &has.base, CLIENT_RPC_TIMEOUT_MS, &reply)) !=
      FL_OK)
    goto done;
  Flint__HasLibraryReply *r = flint__has_library_reply__unpack(NULL, reply.len, reply.data);
  bool present = r && r->present;
  if (r) flint__has_library_reply__free_unpacked(r, NULL);
  if (!present) {
    Flint__UploadLibraryRequest up = FLINT__UPLOAD_LIBRARY_REQUEST__INIT;
    up.app_id = c->app_id;
    up.incarnation = c->incarnation;
    up.id = cid;
    up.name = (char *)path;
    up.content = (ProtobufCBinaryData){content.len, content.data};
    if ((st = client_rpc_call(c->driver, "/flint.Driver/UploadLibrary", &up.base, CLIENT_RPC_TIMEOUT_MS,
                              &reply)) != FL_OK)
      goto done;
  }
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  client_library *grown = common_realloc(c->plans.libraries, (c->plans.num_libraries + 1) * sizeof *grown);
  char *p = common_strdup(path);
  if (grown) c->plans.libraries = grown;
  if (grown && p) {
    c->plans.libraries[c->plans.num_libraries].path = p;
    memcpy(c->plans.libraries[c->plans.num_libraries].id, cid, 33);
    c->plans.num_libraries++;
  } else {
    common_free(p);
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  snprintf(id, len, "%s", cid);
done:
  fl_buf_free(&content);
  fl_buf_free(&reply);
  return st;
}

/* ---- shipped datasets ------------------------------------------------------------------ */

/* Under c->lock. */
static bool shipped_has(remote_context *c, uint64_t id) {
  return id / 8 < c->plans.shipped_bytes && (c->plans.shipped[id / 8] >> (id % 8) & 1);
}

/* Under c->lock. */
static void shipped_mark(remote_context *c, uint64_t id) {
  client_plans *p = &c->plans;
  if (id / 8 >= p->shipped_bytes) {
    size_t n = p->shipped_bytes ? p->shipped_bytes : 64;
    while (n <= id / 8) n *= 2;
    uint8_t *grown = common_realloc(p->shipped, n);
    if (!grown) return; /* sent again next time: the driver skips nodes it has */
    memset(grown + p->shipped_bytes, 0, n - p->shipped_bytes);
    p->shipped = grown;
    p->shipped_bytes = n;
  }
  p->shipped[id / 8] |= (uint8_t)(1u << (id % 8));
}

typedef struct encode_ctx {
  remote_context *c;
  client_plan *p;
} encode_ctx;

/* rdd_plan_encode's `known`: true for a dataset the driver has; notes the others, whose
 * nodes the plan carries. */
static bool known_or_note(void *arg, uint64_t id) {
  encode_ctx *e = arg;
  FL_PCHECK(pthread_mutex_lock(&e->c->lock));
  bool shipped = shipped_has(e->c, id);
  FL_PCHECK(pthread_mutex_unlock(&e->c->lock));
  if (shipped) return true;
  client_ids_push(&e->p->sent, &e->p->num_sent, &e->p->cap_sent, id);
  return false;
}

bool client_plan_send_shipped(remote_context *c, uint64_t id) {
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  bool shipped = shipped_has(c, id);
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return shipped;
}

void client_plan_send_forget(void *impl, uint64_t id) {
  remote_context *c = impl;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (shipped_has(c, id)) {
    c->plans.shipped[id / 8] &= (uint8_t)~(1u << (id % 8));
    /* lost on no memory: kept until close */
    client_ids_push(&c->plans.released, &c->plans.num_released, &c->plans.cap_released, id);
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
}

/* ---- storage levels -------------------------------------------------------------------- */

static fl_status collect_levels_of(const rdd *r, client_level_list *l) {
  if (!r) return FL_OK;
  for (size_t i = 0; i < l->num_seen; i++)
    if (l->seen[i] == r) return FL_OK;
  if (l->num_seen == l->cap_seen) {
    size_t cap = l->cap_seen ? l->cap_seen * 2 : 32;
    const rdd **grown = common_realloc(l->seen, cap * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "out of memory listing the datasets of a job");
    l->seen = grown;
    l->cap_seen = cap;
  }
  l->seen[l->num_seen++] = r;
  fl_storage_level level = atomic_load(&r->level);
  if (level != FL_STORAGE_NONE) {
    if (l->count == l->cap) {
      size_t cap = l->cap ? l->cap * 2 : 16;
      Flint__Level *grown = common_realloc(l->items, cap * sizeof *grown);
      if (!grown) return FL_ERR(FL_ENOMEM, "out of memory listing the storage levels of a job");
      l->items = grown;
      l->cap = cap;
    }
    Flint__Level *item = &l->items[l->count++];
    flint__level__init(item);
    item->rdd_id = r->id;
    item->level = level;
  }
  fl_status st = FL_OK;
  for (uint32_t i = 0; i < r->num_parents && st == FL_OK; i++) st = collect_levels_of(r->parents[i], l);
  for (uint32_t i = 0; i < r->num_shuffle_deps && st == FL_OK; i++)
    st = collect_levels_of(r->shuffle_deps[i]->parent, l);
  return st;
}

/* Fills l with the storage levels of every persisted dataset of r's lineage. A job without
 * them would run with datasets that the driver does not cache, so a failure fails the job. */
static fl_status collect_levels(const rdd *r, client_level_list *l) {
  fl_status st = collect_levels_of(r, l);
  if (st == FL_OK && l->count && !(l->ptrs = common_calloc(l->count, sizeof *l->ptrs)))
    st = FL_ERR(FL_ENOMEM, "out of memory listing the storage levels of a job");
  for (size_t i = 0; st == FL_OK && i < l->count; i++) l->ptrs[i] = &l->items[i];
  return st;
}

/* ---- a job's request ------------------------------------------------------------------- */

fl_status client_plan_send_encode(remote_context *c, rdd *r, const rdd_action *action, client_plan *out) {
  memset(out, 0, sizeof *out);
  rdd_fn_codec codec = {.library_id = library_id, .arg = c};
  encode_ctx enc = {c, out};
  fl_status st = rdd_plan_encode(r, known_or_note, &enc, &codec, &out->plan);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  out->released = c->plans.released;
  out->num_released = c->plans.num_released;
  c->plans.released = NULL;
  c->plans.num_released = c->plans.cap_released = 0;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  if (st != FL_OK) return st;
  if ((st = rdd_action_encode(action, &codec, &out->action)) != FL_OK) return st;
  return collect_levels(r, &out->levels);
}

void client_plan_send_settle(remote_context *c, client_plan *p, bool delivered) {
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (delivered) {
    for (size_t i = 0; i < p->num_sent; i++) shipped_mark(c, p->sent[i]);
  } else { /* keep the released ones for the next job */
    for (size_t i = 0; i < p->num_released; i++)
      if (!client_ids_push(&c->plans.released, &c->plans.num_released, &c->plans.cap_released, p->released[i]))
        break;
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  common_free(p->levels.items);
  common_free(p->levels.ptrs);
  common_free(p->levels.seen);
  common_free(p->released);
  common_free(p->sent);
  fl_buf_free(&p->plan);
  fl_buf_free(&p->action);
}

void client_plan_send_free(remote_context *c) {
  for (size_t i = 0; i < c->plans.num_libraries; i++) common_free(c->plans.libraries[i].path);
  common_free(c->plans.libraries);
  common_free(c->plans.shipped);
  common_free(c->plans.released);
}
