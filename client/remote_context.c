/*
 * client.c: contexts whose scheduler is a driver process (masters flint://HOST:PORT and
 * local-cluster[E,C,MB]), and the flint command's submit and status calls.
 *
 * As in Spark Connect, the client builds lineage and sends plans: an action encodes the
 * datasets the driver has not seen yet (rdd/plan.c) and the action, and waits for the
 * results; accumulator updates come back with them and are merged here. Functions travel as
 * (library, symbol): each library is uploaded once per application under its content id.
 * Freed datasets are told to the driver with the next job, so that it frees them too.
 *
 * Broadcasts stay here, as a Spark driver keeps its TorrentBroadcast values: the first one
 * starts a block server in this process that lends the values in the registry
 * (rdd_shared_lend) to the executors, which fetch each once; the driver is only told the
 * broadcast's id, length and this server's address. The address's host is the one this
 * machine uses toward the driver (the server listens there only), or FLINT_CLIENT_HOST (the
 * server listens on every interface).
 *
 * local-cluster[E,C,MB] starts a driver and E executors as child processes of this one on
 * 127.0.0.1 and stops them on close; they also end when this process dies (PDEATHSIG).
 *
 * Their folders are in one folder of the cluster, which close removes. A program that dies
 * instead (SIGTERM, SIGKILL, a crash) cannot remove it, and a signal handler of ours would
 * not do: the program may have its own, SIGKILL has none, and a handler may not remove a
 * tree. So the children remove it: each gets its path (FL_LOCAL_CLUSTER_DIR_ENV) and, as it
 * ends, after removing its own folder, tries rmdir() on it, which only succeeds once the
 * folder is empty, so the last one out removes it, whatever the order. The driver's port
 * file is removed as soon as it is read, so that nothing else stays in the folder.
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver/driver.h"
#include "flint/cluster.h"
#include "proto/flint.pb-c.h"
#include "proto/pack.h"
#include "shuffle/shuffle.h"

#define RPC_TIMEOUT_MS 30000
#define START_TIMEOUT_MS 30000

typedef struct library_ref {
  char *path;
  char id[33];
} library_ref;

typedef struct remote_context {
  fl_context pub; /* first */
  rpc_channel *driver;
  char driver_address[256]; /* HOST:PORT */
  char *secret;
  uint64_t app_id;
  uint64_t incarnation; /* the driver process's (OpenApplicationReply): sent with app_id */
  pthread_mutex_t lock; /* everything below */
  uint8_t *shipped;     /* bitmap by dataset id: the driver has its plan node */
  size_t shipped_bytes;
  uint64_t *released;
  size_t num_released, cap_released;
  library_ref *libraries;
  size_t num_libraries;
  uint64_t jobs_run, jobs_failed, tasks_run, tasks_failed, task_ns; /* fl_context_stats */
  uint64_t blocks_mapped, blocks_fetched;
  atomic_uint_fast64_t next_operation; /* RunJob's operation ids, from 1 */
  /* Small broadcasts (BROADCAST_INLINE_MAX), which go with each RunJob until one succeeds
   * (`sent`); once offered, the driver may have one, so its destruction is told too. */
  struct {
    uint64_t id, len;
    bool offered, sent;
  } *inline_live;
  size_t num_inline, cap_inline, inline_bytes;
  uint64_t *inline_removed;
  size_t num_inline_removed, cap_inline_removed;
  /* The lease: a thread says the client is alive every keepalive_ms (OpenApplicationReply),
   * so that the driver closes the application of a client that died. */
  uint32_t keepalive_ms;
  pthread_t keepalive;
  bool keepalive_started, keepalive_stop; /* under lock */
  pthread_cond_t keepalive_wake;
  dp_server *blocks; /* serves the large broadcasts; started with the first one */
  char blocks_address[DP_ADDRESS_MAX];
  /* local-cluster */
  pid_t *children;
  uint32_t num_children;
  char *cluster_dir;
} remote_context;

/* ---- secrets --------------------------------------------------------------------------- */

fl_status client_secret(char **out) {
  *out = NULL;
  const char *env = getenv("FLINT_SECRET");
  if (env && *env) {
    if (!(*out = common_strdup(env))) return FL_ERR(FL_ENOMEM, "out of memory");
    return FL_OK;
  }
  const char *file = getenv("FLINT_SECRET_FILE");
  if (!file || !*file) return FL_OK;
  FILE *f = fopen(file, "r");
  if (!f) return FL_ERR(FL_EAUTH, "cannot read the secret file %s: %s", file, strerror(errno));
  char buf[1024];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
  buf[n] = 0;
  if (n == 0) return FL_ERR(FL_EAUTH, "the secret file %s is empty", file);
  if (!(*out = common_strdup(buf))) return FL_ERR(FL_ENOMEM, "out of memory");
  return FL_OK;
}

/* ---- calls ----------------------------------------------------------------------------- */

static fl_status call(rpc_channel *ch, const char *method, const ProtobufCMessage *msg,
                      int64_t timeout_ms, fl_buf *reply) {
  fl_buf body = FL_BUF_INIT;
  fl_status st = proto_pack(msg, &body);
  if (st == FL_OK) {
    reply->len = 0;
    st = rpc_call(ch, method, fl_buf_bytes(&body), timeout_ms, reply);
  }
  fl_buf_free(&body);
  return st;
}

/* ---- libraries ------------------------------------------------------------------------- */

/* A content id: two independent 64-bit hashes, as 32 hex digits. Libraries are not trusted
 * by their id (the driver stores what it is sent); the id only avoids sending one twice. */
static void content_id(fl_bytes data, char id[33]) {
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < data.len; i++) fnv = (fnv ^ data.data[i]) * 0x100000001b3ull;
  snprintf(id, 33, "%016llx%016llx", (unsigned long long)common_hash_bytes(data.data, data.len),
           (unsigned long long)(fnv ^ data.len));
}

static fl_status library_id(void *arg, const char *path, bool in_main_program, char *id, size_t len) {
  remote_context *c = arg;
  if (in_main_program)
    return FL_ERR(FL_EINVAL,
                  "it lives in the main program (%s), which is not a shared library: in cluster "
                  "mode user functions must be in a shared library (build the job as a .so and "
                  "run it with flint submit, or move the functions into a library)",
                  path);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t i = 0; i < c->num_libraries; i++)
    if (strcmp(c->libraries[i].path, path) == 0) {
      snprintf(id, len, "%s", c->libraries[i].id);
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
  if ((st = call(c->driver, "/flint.Driver/HasLibrary", &has.base, RPC_TIMEOUT_MS, &reply)) != FL_OK)
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
    if ((st = call(c->driver, "/flint.Driver/UploadLibrary", &up.base, RPC_TIMEOUT_MS, &reply)) != FL_OK)
      goto done;
  }
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  library_ref *grown = common_realloc(c->libraries, (c->num_libraries + 1) * sizeof *grown);
  char *p = common_strdup(path);
  if (grown) c->libraries = grown;
  if (grown && p) {
    c->libraries[c->num_libraries].path = p;
    memcpy(c->libraries[c->num_libraries].id, cid, 33);
    c->num_libraries++;
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

/* Appends x to a growing list of ids; false when out of memory. */
static bool ids_push(uint64_t **ids, size_t *n, size_t *cap, uint64_t x) {
  if (*n == *cap) {
    size_t grown_cap = *cap ? *cap * 2 : 16;
    uint64_t *grown = common_realloc(*ids, grown_cap * sizeof *grown);
    if (!grown) return false;
    *ids = grown;
    *cap = grown_cap;
  }
  (*ids)[(*n)++] = x;
  return true;
}

/* ---- shipped datasets ------------------------------------------------------------------ */

static bool shipped_has(remote_context *c, uint64_t id) {
  return id / 8 < c->shipped_bytes && (c->shipped[id / 8] >> (id % 8) & 1);
}

static void shipped_mark(remote_context *c, uint64_t id) {
  if (id / 8 >= c->shipped_bytes) {
    size_t n = c->shipped_bytes ? c->shipped_bytes : 64;
    while (n <= id / 8) n *= 2;
    uint8_t *grown = common_realloc(c->shipped, n);
    if (!grown) return; /* sent again next time: the driver skips nodes it has */
    memset(grown + c->shipped_bytes, 0, n - c->shipped_bytes);
    c->shipped = grown;
    c->shipped_bytes = n;
  }
  c->shipped[id / 8] |= (uint8_t)(1u << (id % 8));
}

typedef struct encode_ctx {
  remote_context *c;
  uint64_t *sent;
  size_t count, cap;
} encode_ctx;

static bool known_or_note(void *arg, uint64_t id) {
  encode_ctx *e = arg;
  FL_PCHECK(pthread_mutex_lock(&e->c->lock));
  bool shipped = shipped_has(e->c, id);
  FL_PCHECK(pthread_mutex_unlock(&e->c->lock));
  if (shipped) return true;
  if (e->count == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 16;
    uint64_t *grown = common_realloc(e->sent, cap * sizeof *grown);
    if (!grown) return false;
    e->sent = grown;
    e->cap = cap;
  }
  e->sent[e->count++] = id;
  return false;
}

/* The storage levels that a RunJob carries: one per persisted dataset of the lineage, as
 * many as there are. */
typedef struct level_list {
  Flint__Level *items;
  Flint__Level **ptrs; /* into items, made once items stops growing */
  size_t count, cap;
  const rdd **seen; /* datasets visited (a lineage is a graph: shared parents) */
  size_t num_seen, cap_seen;
} level_list;

static void level_list_free(level_list *l) {
  common_free(l->items);
  common_free(l->ptrs);
  common_free(l->seen);
}

static fl_status collect_levels_of(const rdd *r, level_list *l) {
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
static fl_status collect_levels(const rdd *r, level_list *l) {
  fl_status st = collect_levels_of(r, l);
  if (st == FL_OK && l->count && !(l->ptrs = common_calloc(l->count, sizeof *l->ptrs)))
    st = FL_ERR(FL_ENOMEM, "out of memory listing the storage levels of a job");
  for (size_t i = 0; st == FL_OK && i < l->count; i++) l->ptrs[i] = &l->items[i];
  return st;
}

/* ---- the runtime ----------------------------------------------------------------------- */

/* Reads result `index` of an operation, which waits on the driver, into *out in chunks. */
static fl_status fetch_parked(remote_context *c, uint64_t operation_id, uint32_t index, uint64_t size,
                              fl_buf *out) {
  out->len = 0;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = fl_buf_reserve(out, size);
  while (st == FL_OK && out->len < size) {
    Flint__FetchResultRequest req = FLINT__FETCH_RESULT_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    req.operation_id = operation_id;
    req.index = index;
    req.offset = out->len;
    st = call(c->driver, "/flint.Driver/FetchResult", &req.base, RPC_TIMEOUT_MS, &reply);
    if (st != FL_OK) break;
    Flint__FetchResultReply *rep = flint__fetch_result_reply__unpack(NULL, reply.len, reply.data);
    if (!rep || rep->chunk.len == 0 || rep->chunk.len > size - out->len)
      st = FL_ERR(FL_EPROTO, "FetchResult: a malformed chunk of result %u from the driver", index);
    else
      st = fl_buf_append(out, rep->chunk.data, rep->chunk.len);
    if (rep) flint__fetch_result_reply__free_unpacked(rep, NULL);
  }
  fl_buf_free(&reply);
  return st;
}

/* A RunJob reply's results into results[0..num_parts): inline ones copied, the others read
 * from the driver. */
static fl_status take_results(remote_context *c, uint64_t operation_id, const Flint__RunJobReply *rep,
                              uint32_t num_parts, fl_buf *results) {
  if (rep->n_results != num_parts || rep->n_sizes != num_parts)
    return FL_ERR(FL_EPROTO, "RunJob: a reply with %zu results for %u partitions", rep->n_results, num_parts);
  for (uint32_t i = 0; i < num_parts; i++) {
    const ProtobufCBinaryData *r = &rep->results[i];
    if (r->len != rep->sizes[i] && r->len != 0)
      return FL_ERR(FL_EPROTO, "RunJob: result %u of %zu bytes, announced %llu", i, r->len,
                    (unsigned long long)rep->sizes[i]);
  }
  fl_status st = FL_OK;
  for (uint32_t i = 0; i < num_parts && st == FL_OK; i++) {
    const ProtobufCBinaryData *r = &rep->results[i];
    results[i].len = 0;
    st = r->len == rep->sizes[i] ? fl_buf_append(&results[i], r->data, r->len)
                                 : fetch_parked(c, operation_id, i, rep->sizes[i], &results[i]);
  }
  return st;
}

/* ---- barrier reports: read while the job runs, delivered on the action's thread ---------- */

static void deliver_report(rdd *r, fl_bytes rec) {
  uint64_t rdd_id;
  uint32_t rank;
  fl_bytes msg;
  if (rec.len >= 12) {
    memcpy(&rdd_id, rec.data, 8);
    memcpy(&rank, rec.data + 8, 4);
    msg = (fl_bytes){rec.data + 12, rec.len - 12};
    rdd_barrier_deliver(r, rdd_id, rank, msg);
  }
}

typedef struct run_call {
  remote_context *c;
  const Flint__RunJobRequest *req;
  fl_buf *reply;
  fl_status status;
  char error[1024];
  atomic_bool done;
} run_call;

static void *run_call_main(void *p) {
  pthread_setname_np(pthread_self(), "fl-call");
  run_call *rc = p;
  rc->status = call(rc->c->driver, "/flint.Driver/RunJob", &rc->req->base, 0, rc->reply);
  if (rc->status != FL_OK) snprintf(rc->error, sizeof rc->error, "%s", fl_last_error());
  atomic_store(&rc->done, true);
  return NULL;
}

/* Reports wait in the driver; RunJob blocks until the job ends. So RunJob goes on a thread
 * of its own while this one reads reports (long polls) and calls on_report; what is left at
 * the end comes in RunJob's reply. */
static fl_status run_job_with_reports(remote_context *c, rdd *r, const Flint__RunJobRequest *req, fl_buf *reply) {
  run_call rc = {.c = c, .req = req, .reply = reply};
  atomic_init(&rc.done, false);
  pthread_t th;
  if (pthread_create(&th, NULL, run_call_main, &rc) != 0) return FL_ERR(FL_ENOMEM, "cannot start a thread");
  fl_buf got = FL_BUF_INIT;
  while (!atomic_load(&rc.done)) {
    Flint__BarrierReportsRequest q = FLINT__BARRIER_REPORTS_REQUEST__INIT;
    q.app_id = c->app_id;
    q.incarnation = c->incarnation;
    q.operation_id = req->operation_id;
    q.wait_ms = 200;
    if (call(c->driver, "/flint.Driver/BarrierReports", &q.base, RPC_TIMEOUT_MS, &got) != FL_OK) {
      usleep(50000); /* the RunJob call will say what is wrong */
      continue;
    }
    Flint__BarrierReportsReply *rep = flint__barrier_reports_reply__unpack(NULL, got.len, got.data);
    for (size_t i = 0; rep && i < rep->n_reports; i++)
      deliver_report(r, (fl_bytes){rep->reports[i].data, rep->reports[i].len});
    if (rep) flint__barrier_reports_reply__free_unpacked(rep, NULL);
  }
  pthread_join(th, NULL);
  fl_buf_free(&got);
  if (rc.status != FL_OK) return fl_set_error(rc.status, "%s", rc.error);
  return FL_OK;
}

/* What a RunJob tells of the small broadcasts: the ones the driver does not have yet (their
 * bytes lent by the registry for the call) and the ones destroyed since the last job. */
typedef struct inline_out {
  Flint__InlineBroadcast *items, **ptrs;
  dp_loan *loans;
  size_t n;
  uint64_t *removed;
  size_t num_removed;
} inline_out;

static void inline_take(remote_context *c, inline_out *o) {
  memset(o, 0, sizeof *o);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  size_t want = 0;
  for (size_t i = 0; i < c->num_inline; i++) want += !c->inline_live[i].sent;
  o->items = common_calloc(want + 1, sizeof *o->items);
  o->ptrs = common_calloc(want + 1, sizeof *o->ptrs);
  o->loans = common_calloc(want + 1, sizeof *o->loans);
  for (size_t i = 0; i < c->num_inline && o->items && o->ptrs && o->loans; i++) {
    uint64_t total;
    if (c->inline_live[i].sent ||
        rdd_shared_lend(c->pub.shared, c->inline_live[i].id, 0, 0, &o->loans[o->n], &total) != FL_OK)
      continue;
    Flint__InlineBroadcast *b = &o->items[o->n];
    flint__inline_broadcast__init(b);
    b->id = c->inline_live[i].id;
    b->value = (ProtobufCBinaryData){o->loans[o->n].len, (uint8_t *)o->loans[o->n].data};
    o->ptrs[o->n++] = b;
    c->inline_live[i].offered = true; /* a destroy from now on is told to the driver */
  }
  o->removed = c->inline_removed;
  o->num_removed = c->num_inline_removed;
  c->inline_removed = NULL;
  c->num_inline_removed = c->cap_inline_removed = 0;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
}

/* After the RunJob: what the driver did not get goes with the next one. */
static void inline_settle(remote_context *c, inline_out *o, bool delivered) {
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t k = 0; delivered && k < o->n; k++)
    for (size_t i = 0; i < c->num_inline; i++)
      if (c->inline_live[i].id == o->items[k].id) c->inline_live[i].sent = true;
  for (size_t k = 0; !delivered && k < o->num_removed; k++)
    if (!ids_push(&c->inline_removed, &c->num_inline_removed, &c->cap_inline_removed, o->removed[k])) break;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  for (size_t k = 0; k < o->n; k++) o->loans[k].release(o->loans[k].arg);
  common_free(o->items);
  common_free(o->ptrs);
  common_free(o->loans);
  common_free(o->removed);
}

static fl_status remote_run_job(void *impl, rdd *r, const uint32_t *parts, uint32_t num_parts,
                                const rdd_action *action, fl_buf *results) {
  remote_context *c = impl;
  rdd_fn_codec codec = {.library_id = library_id, .arg = c};
  encode_ctx enc = {c, NULL, 0, 0};
  fl_buf plan = FL_BUF_INIT, act = FL_BUF_INIT, reply = FL_BUF_INIT;
  level_list levels = {0};
  uint64_t *released = NULL;
  size_t num_released = 0;
  fl_status st;
  st = rdd_plan_encode(r, known_or_note, &enc, &codec, &plan);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  released = c->released;
  num_released = c->num_released;
  c->released = NULL;
  c->num_released = c->cap_released = 0;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  if (st != FL_OK) goto done;
  if ((st = rdd_action_encode(action, &codec, &act)) != FL_OK) goto done;
  if ((st = collect_levels(r, &levels)) != FL_OK) goto done;

  Flint__RunJobRequest req = FLINT__RUN_JOB_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.plan = (ProtobufCBinaryData){plan.len, plan.data};
  req.rdd_id = r->id;
  req.n_partitions = num_parts;
  req.partitions = (uint32_t *)parts;
  req.action = (ProtobufCBinaryData){act.len, act.data};
  req.n_levels = levels.count;
  req.levels = levels.ptrs;
  req.n_released = num_released;
  req.released = released;
  req.operation_id = atomic_fetch_add(&c->next_operation, 1);
  inline_out bcasts;
  inline_take(c, &bcasts);
  req.n_broadcasts = bcasts.n;
  req.broadcasts = bcasts.ptrs;
  req.n_removed_broadcasts = bcasts.num_removed;
  req.removed_broadcasts = bcasts.removed;
  bool reports = rdd_barrier_reports_wanted(r);
  if (reports) st = run_job_with_reports(c, r, &req, &reply);
  else st = call(c->driver, "/flint.Driver/RunJob", &req.base, 0, &reply);
  /* A failed call may have reached the driver or not: what it carried goes again (the driver
   * takes a broadcast it has, or the removal of one it lacks, as a no-op). */
  inline_settle(c, &bcasts, st == FL_OK);
  if (st == FL_OK) {
    num_released = 0; /* the driver has them */
    FL_PCHECK(pthread_mutex_lock(&c->lock));
    for (size_t i = 0; i < enc.count; i++) shipped_mark(c, enc.sent[i]);
    c->jobs_run++;
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
    Flint__RunJobReply *rep = flint__run_job_reply__unpack(NULL, reply.len, reply.data);
    if (!rep) {
      st = FL_ERR(FL_EPROTO, "RunJob: malformed reply from the driver");
    } else {
      st = take_results(c, req.operation_id, rep, num_parts, results);
      FL_PCHECK(pthread_mutex_lock(&c->lock));
      c->tasks_run += rep->attempts;
      c->tasks_failed += rep->attempts_failed;
      c->task_ns += rep->task_ns;
      c->blocks_mapped += rep->blocks_mapped;
      c->blocks_fetched += rep->blocks_fetched;
      FL_PCHECK(pthread_mutex_unlock(&c->lock));
      for (size_t i = 0; reports && i < rep->n_barrier_reports; i++)
        deliver_report(r, (fl_bytes){rep->barrier_reports[i].data, rep->barrier_reports[i].len});
      for (size_t i = 0; i < rep->n_acc_updates; i++) {
        fl_status as = rdd_shared_merge_update(c->pub.shared, rep->acc_updates[i]->id,
                                               (fl_bytes){rep->acc_updates[i]->value.data,
                                                          rep->acc_updates[i]->value.len});
        if (as != FL_OK) fprintf(stderr, "flint: %s\n", fl_last_error());
      }
    }
    if (rep) flint__run_job_reply__free_unpacked(rep, NULL);
  } else {
    FL_PCHECK(pthread_mutex_lock(&c->lock));
    c->jobs_failed++;
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
  }
done:
  if (num_released) { /* not delivered: keep them for the next job */
    FL_PCHECK(pthread_mutex_lock(&c->lock));
    for (size_t i = 0; i < num_released; i++)
      if (!ids_push(&c->released, &c->num_released, &c->cap_released, released[i])) break;
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
  }
  level_list_free(&levels);
  common_free(released);
  common_free(enc.sent);
  fl_buf_free(&plan);
  fl_buf_free(&act);
  fl_buf_free(&reply);
  return st;
}

/* The executors' fetches of this client's broadcasts. Block-server worker threads. */
static fl_status serve_broadcast(void *arg, const dp_request *req, fl_buf *out, dp_loan *loan,
                                 uint64_t *total) {
  remote_context *c = arg;
  if (req->kind != DP_BROADCAST || req->key[0] != c->app_id)
    return FL_ERR(FL_ENOENT, "this client serves only the broadcasts of application %llu",
                  (unsigned long long)c->app_id);
  return rdd_shared_lend(c->pub.shared, req->key[1], req->offset, req->len, loan, total);
}

/* The address of this machine that packets to `peer` (HOST:PORT) leave from: a UDP socket
 * connect()ed to it sends nothing, but the kernel picks the route and so the source. */
static fl_status local_host_toward(const char *peer, char *host, size_t len) {
  char name[256];
  const char *colon = strrchr(peer, ':');
  size_t n = colon ? (size_t)(colon - peer) : 0;
  const char *h = peer;
  if (n >= 2 && peer[0] == '[' && colon[-1] == ']') {
    h++;
    n -= 2;
  }
  if (!colon || n == 0 || n >= sizeof name)
    return FL_ERR(FL_EINVAL, "the driver's address %s is not HOST:PORT", peer);
  memcpy(name, h, n);
  name[n] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM};
  struct addrinfo *res = NULL;
  int rc = getaddrinfo(name, colon + 1, &hints, &res);
  if (rc != 0 || !res)
    return FL_ERR(FL_ENET, "cannot resolve the driver's host %s: %s", name, gai_strerror(rc));
  struct sockaddr_storage local;
  socklen_t local_len = sizeof local;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&local, &local_len) == 0;
  int err = errno;
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (ok && local.ss_family == AF_INET)
    ok = inet_ntop(AF_INET, &((struct sockaddr_in *)&local)->sin_addr, host, (socklen_t)len) != NULL;
  else if (ok && local.ss_family == AF_INET6)
    ok = inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&local)->sin6_addr, host, (socklen_t)len) != NULL;
  if (!ok)
    return FL_ERR(FL_ENET, "cannot find this machine's address toward the driver at %s: %s (set FLINT_CLIENT_HOST)",
                  peer, strerror(err));
  return FL_OK;
}

/* Starts the block server that serves this client's broadcasts, once; copies its address
 * ("HOST:PORT") into address. */
static fl_status broadcast_server(remote_context *c, char address[DP_ADDRESS_MAX]) {
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (!c->blocks) {
    char host[INET6_ADDRSTRLEN + 64];
    const char *env = getenv("FLINT_CLIENT_HOST");
    if (env && *env) {
      if (strlen(env) >= sizeof host - 2)
        st = FL_ERR(FL_EINVAL, "FLINT_CLIENT_HOST=%s is too long", env);
      else
        snprintf(host, sizeof host, "%s", env);
    } else {
      st = local_host_toward(c->driver_address, host, sizeof host);
    }
    /* A host given by name may be one this machine cannot bind (behind a NAT, say): the
     * server then listens on every interface. */
    if (st == FL_OK)
      st = dp_server_start(env && *env ? NULL : host, 0, c->secret, serve_broadcast, c, &c->blocks);
    if (st == FL_OK) {
      int port = dp_server_port(c->blocks);
      bool v6 = strchr(host, ':') != NULL;
      int n = snprintf(c->blocks_address, sizeof c->blocks_address, v6 ? "[%s]:%d" : "%s:%d", host, port);
      if (n < 0 || (size_t)n >= sizeof c->blocks_address) {
        st = FL_ERR(FL_EINVAL, "the broadcast server's address %s:%d is too long", host, port);
        dp_server_stop(c->blocks);
        c->blocks = NULL;
      }
    }
    if (st != FL_OK) common_error_wrap(st, "cannot serve broadcasts: ");
  }
  memcpy(address, c->blocks_address, DP_ADDRESS_MAX);
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return st;
}

/* A small broadcast is only noted: it goes to the driver with the next RunJob. */
static bool inline_note(remote_context *c, uint64_t id, uint64_t len) {
  bool noted = false;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (len <= BROADCAST_INLINE_MAX && c->inline_bytes + len <= BROADCAST_INLINE_TOTAL) {
    if (c->num_inline == c->cap_inline) {
      size_t cap = c->cap_inline ? c->cap_inline * 2 : 16;
      void *grown = common_realloc(c->inline_live, cap * sizeof *c->inline_live);
      if (grown) {
        c->inline_live = grown;
        c->cap_inline = cap;
      }
    }
    if (c->num_inline < c->cap_inline) {
      c->inline_live[c->num_inline].id = id;
      c->inline_live[c->num_inline].len = len;
      c->inline_live[c->num_inline].offered = false;
      c->inline_live[c->num_inline].sent = false;
      c->num_inline++;
      c->inline_bytes += len;
      noted = true;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return noted;
}

/* Drops a small broadcast; one the driver has is removed with the next RunJob. False when
 * `id` is not a small one. */
static bool inline_drop(remote_context *c, uint64_t id) {
  bool found = false;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (size_t i = 0; i < c->num_inline; i++) {
    if (c->inline_live[i].id != id) continue;
    found = true;
    if (c->inline_live[i].offered) /* lost on no memory: the driver keeps it until the close */
      ids_push(&c->inline_removed, &c->num_inline_removed, &c->cap_inline_removed, id);
    c->inline_bytes -= c->inline_live[i].len;
    c->inline_live[i] = c->inline_live[--c->num_inline];
    break;
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return found;
}

static fl_status remote_broadcast_created(void *impl, uint64_t id, uint64_t len) {
  remote_context *c = impl;
  if (inline_note(c, id, len)) return FL_OK;
  char address[DP_ADDRESS_MAX];
  fl_status st = broadcast_server(c, address);
  if (st != FL_OK) return st;
  Flint__BroadcastPutRequest req = FLINT__BROADCAST_PUT_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.broadcast_id = id;
  req.total = len;
  req.address = address;
  fl_buf reply = FL_BUF_INIT;
  st = call(c->driver, "/flint.Driver/BroadcastPut", &req.base, RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

static void remote_broadcast_destroyed(void *impl, uint64_t id) {
  remote_context *c = impl;
  if (inline_drop(c, id)) return;
  Flint__BroadcastRemoveRequest req = FLINT__BROADCAST_REMOVE_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.broadcast_id = id;
  fl_buf reply = FL_BUF_INIT;
  if (call(c->driver, "/flint.Driver/BroadcastRemove", &req.base, RPC_TIMEOUT_MS, &reply) != FL_OK)
    fprintf(stderr, "flint: cannot remove broadcast %llu on the driver: %s\n", (unsigned long long)id,
            fl_last_error());
  fl_buf_free(&reply);
}

static void remote_rdd_destroyed(void *impl, uint64_t id) {
  remote_context *c = impl;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  if (shipped_has(c, id)) {
    c->shipped[id / 8] &= (uint8_t)~(1u << (id % 8));
    ids_push(&c->released, &c->num_released, &c->cap_released, id); /* lost on no memory: kept until close */
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
}

static const rdd_runtime_ops remote_runtime = {.run_job = remote_run_job,
                                               .broadcast_created = remote_broadcast_created,
                                               .broadcast_destroyed = remote_broadcast_destroyed,
                                               .rdd_destroyed = remote_rdd_destroyed};

/* ---- the cache, as a client sees it: the driver knows ---------------------------------- */

static bool rc_get(void *impl, rdd_block_key key, const rdd_batch **b, void **h) { return false; }
static fl_status rc_put(void *impl, rdd_block_key key, fl_storage_level level, rdd_batch *batch,
                        const rdd_batch **stored, void **handle) {
  return FL_ERR(FL_ESTATE, "a client stores no blocks");
}
static void rc_release(void *impl, void *handle) {}
static void rc_remove_rdd(void *impl, uint64_t rdd_id) {
  remote_context *c = impl;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  bool shipped = shipped_has(c, rdd_id);
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  if (!shipped) return;
  Flint__UnpersistRequest req = FLINT__UNPERSIST_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.rdd_id = rdd_id;
  fl_buf reply = FL_BUF_INIT;
  if (call(c->driver, "/flint.Driver/Unpersist", &req.base, RPC_TIMEOUT_MS, &reply) != FL_OK)
    fprintf(stderr, "flint: unpersist of dataset %llu on the driver failed: %s\n",
            (unsigned long long)rdd_id, fl_last_error());
  fl_buf_free(&reply);
}
static void rc_info(void *impl, uint64_t rdd_id, fl_storage_info *out) {
  remote_context *c = impl;
  Flint__StorageInfoRequest req = FLINT__STORAGE_INFO_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.rdd_id = rdd_id;
  fl_buf reply = FL_BUF_INIT;
  if (call(c->driver, "/flint.Driver/StorageInfo", &req.base, RPC_TIMEOUT_MS, &reply) == FL_OK) {
    Flint__StorageInfoReply *r = flint__storage_info_reply__unpack(NULL, reply.len, reply.data);
    if (r) {
      out->cached_partitions = r->cached_partitions;
      out->memory_bytes = r->memory_bytes;
      out->disk_bytes = r->disk_bytes;
      flint__storage_info_reply__free_unpacked(r, NULL);
    }
  }
  fl_buf_free(&reply);
}
static void rc_shuffle_path(void *impl, uint64_t s, uint32_t m, char *path, size_t len) {
  snprintf(path, len, "/nonexistent");
}
static fl_status rc_shuffle_fetch(void *impl, uint64_t s, uint32_t m, uint32_t r, uint64_t off,
                                  uint64_t len, fl_buf *out, uint64_t *block_len) {
  return FL_ERR(FL_ESTATE, "a client holds no shuffle output");
}
/* The driver removes a shuffle's output when it frees the dataset. */
static void rc_shuffle_remove(void *impl, uint64_t shuffle_id, uint32_t num_maps) {}

static const rdd_cache_ops remote_cache = {rc_get,        rc_put,          rc_release,
                                           rc_remove_rdd, rc_info,         rc_shuffle_path,
                                           rc_shuffle_fetch, rc_shuffle_remove};

/* ---- local-cluster --------------------------------------------------------------------- */

/* The flint command next to this library (or the one FLINT_EXECUTABLE names). */
static fl_status flint_executable(char *out, size_t len) {
  const char *env = getenv("FLINT_EXECUTABLE");
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return access(out, X_OK) == 0 ? FL_OK : FL_ERR(FL_ENOENT, "FLINT_EXECUTABLE=%s is not executable", env);
  }
  Dl_info info;
  char dir[PATH_MAX - 32];
  if (dladdr((void *)fl_context_open, &info) && info.dli_fname) {
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    const char *tries[] = {"%s/flint", "%s/../bin/flint"};
    for (int i = 0; i < 2; i++) {
      snprintf(out, len, tries[i], dir);
      if (access(out, X_OK) == 0) return FL_OK;
    }
  }
  const char *bin = getenv("FLINT_BIN");
  if (bin && *bin) {
    snprintf(out, len, "%s/flint", bin);
    if (access(out, X_OK) == 0) return FL_OK;
  }
  return FL_ERR(FL_ENOENT, "cannot find the flint command to start a local cluster: set FLINT_EXECUTABLE");
}

/* envp: made before the fork, as the child of a threaded program may not allocate. */
static pid_t spawn(char *const argv[], char *const envp[]) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    /* End with the program that started the cluster, also when it exits on an error. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    execve(argv[0], argv, envp);
    _exit(127);
  }
  return pid;
}

/* This process's environment with FL_LOCAL_CLUSTER_DIR_ENV=dir, for the children; NULL when
 * out of memory. Free with free_environment. */
static char **cluster_environment(const char *dir) {
  size_t n = 0, prefix = strlen(FL_LOCAL_CLUSTER_DIR_ENV "=");
  while (environ[n]) n++;
  char **env = common_calloc(n + 2, sizeof *env);
  size_t len = prefix + strlen(dir) + 1;
  char *mine = common_malloc(len);
  if (!env || !mine) {
    common_free(env);
    common_free(mine);
    return NULL;
  }
  snprintf(mine, len, "%s=%s", FL_LOCAL_CLUSTER_DIR_ENV, dir);
  size_t k = 0;
  env[k++] = mine;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], FL_LOCAL_CLUSTER_DIR_ENV "=", prefix) != 0) env[k++] = environ[i];
  return env;
}

static void free_environment(char **env) {
  if (env) common_free(env[0]);
  common_free(env);
}

/* The driver (children[0]) goes first, so that it sends nothing more to executors that are
 * stopping; then the executors, together. */
static void stop_children(remote_context *c) {
  uint64_t deadline = common_now_ns() + 10000000000ull;
  for (uint32_t i = 0; i < c->num_children; i++) {
    if (i <= 1)
      for (uint32_t j = i; j < (i == 0 ? 1 : c->num_children); j++)
        if (c->children[j] > 0) kill(c->children[j], SIGTERM);
    if (c->children[i] <= 0) continue;
    for (;;) {
      pid_t r = waitpid(c->children[i], NULL, WNOHANG);
      if (r == c->children[i] || (r < 0 && errno != EINTR)) break;
      if (common_now_ns() > deadline) {
        kill(c->children[i], SIGKILL);
        waitpid(c->children[i], NULL, 0);
        break;
      }
      usleep(5000);
    }
    c->children[i] = 0;
  }
}

static fl_status parse_local_cluster(const char *master, uint32_t *e, uint32_t *cores, uint32_t *mb) {
  unsigned long a, b, m;
  char close_bracket, extra;
  if (sscanf(master, "local-cluster[%lu,%lu,%lu%c%c", &a, &b, &m, &close_bracket, &extra) != 4 ||
      close_bracket != ']')
    return FL_ERR(FL_EINVAL, "master '%s': expected local-cluster[EXECUTORS,CORES,MEGABYTES]", master);
  if (a < 1 || a > 64 || b < 1 || b > 1024 || m < 16 || m > (1ul << 22))
    return FL_ERR(FL_EINVAL,
                  "master '%s': 1 to 64 executors, 1 to 1024 cores each and 16 to 4194304 MB each",
                  master);
  *e = (uint32_t)a;
  *cores = (uint32_t)b;
  *mb = (uint32_t)m;
  return FL_OK;
}

/* Starts the driver and executors; sets addr to the driver's HOST:PORT. */
static fl_status start_local_cluster(remote_context *c, const char *master, char *addr, size_t len,
                                     uint32_t *executors) {
  uint32_t n = 0, cores = 0, mb = 0;
  fl_status st = parse_local_cluster(master, &n, &cores, &mb);
  if (st != FL_OK) return st;
  char exe[PATH_MAX];
  if ((st = flint_executable(exe, sizeof exe)) != FL_OK) return st;
  const char *base = getenv("FLINT_WORK_DIR");
  if (!base || !*base) base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/flint-cluster-XXXXXX", base);
  if (!mkdtemp(dir)) return FL_ERR(FL_EIO, "cannot create a folder in %s: %s", base, strerror(errno));
  if (!(c->cluster_dir = common_strdup(dir))) return FL_ERR(FL_ENOMEM, "out of memory");
  if (!(c->children = common_calloc(n + 1, sizeof *c->children))) return FL_ERR(FL_ENOMEM, "out of memory");
  char port_file[PATH_MAX + 16];
  snprintf(port_file, sizeof port_file, "%s/driver.port", dir);
  char **env = cluster_environment(dir);
  if (!env) return FL_ERR(FL_ENOMEM, "out of memory");
  char *dargv[] = {exe, "driver", "--listen", "127.0.0.1:0", "--port-file", port_file, "--work-dir", dir, NULL};
  if ((c->children[c->num_children++] = spawn(dargv, env)) < 0) {
    free_environment(env);
    return FL_ERR(FL_EIO, "cannot start the driver: %s", strerror(errno));
  }
  uint64_t deadline = common_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;
  int port = 0;
  while (!port) {
    FILE *f = fopen(port_file, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (port) break;
    if (waitpid(c->children[0], NULL, WNOHANG) == c->children[0]) {
      c->children[0] = 0;
      free_environment(env);
      return FL_ERR(FL_EIO, "the local cluster's driver exited at start (its log is above)");
    }
    if (common_now_ns() > deadline) {
      free_environment(env);
      return FL_ERR(FL_ETIMEDOUT, "the local cluster's driver did not start");
    }
    usleep(5000);
  }
  unlink(port_file); /* read: the folder keeps only the children's own (see the top) */
  snprintf(addr, len, "127.0.0.1:%d", port);
  char cores_s[16], mem_s[32];
  snprintf(cores_s, sizeof cores_s, "%u", cores);
  snprintf(mem_s, sizeof mem_s, "%um", mb);
  /* FLINT_LOCAL_CLUSTER_GPUS=G (flint.h): the first G executors get --gpu 0 .. G-1. */
  unsigned long gpus = 0;
  const char *gpus_env = getenv("FLINT_LOCAL_CLUSTER_GPUS");
  if (gpus_env && *gpus_env) {
    char *end;
    gpus = strtoul(gpus_env, &end, 10);
    if (*end || gpus > n) {
      free_environment(env);
      return FL_ERR(FL_EINVAL, "FLINT_LOCAL_CLUSTER_GPUS=%s: a number of at most %u executors", gpus_env, n);
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    char gpu_s[16];
    snprintf(gpu_s, sizeof gpu_s, "%u", i);
    char *eargv[] = {exe, "executor", "--driver", addr, "--cores", cores_s, "--memory", mem_s,
                     "--work-dir", dir, i < gpus ? "--gpu" : NULL, gpu_s, NULL};
    if ((c->children[c->num_children++] = spawn(eargv, env)) < 0) {
      free_environment(env);
      return FL_ERR(FL_EIO, "cannot start an executor: %s", strerror(errno));
    }
  }
  free_environment(env);
  *executors = n;
  return FL_OK;
}

/* Waits until the driver lists `want` executors. */
static fl_status wait_for_executors(remote_context *c, uint32_t want) {
  uint64_t deadline = common_now_ns() + (uint64_t)START_TIMEOUT_MS * 1000000u;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = FL_OK;
  for (;;) {
    Flint__Empty req = FLINT__EMPTY__INIT;
    if ((st = call(c->driver, "/flint.Driver/Status", &req.base, RPC_TIMEOUT_MS, &reply)) != FL_OK) break;
    Flint__StatusReply *r = flint__status_reply__unpack(NULL, reply.len, reply.data);
    size_t have = r ? r->n_executors : 0;
    if (r) flint__status_reply__free_unpacked(r, NULL);
    if (have >= want) break;
    for (uint32_t i = 1; i < c->num_children; i++)
      if (c->children[i] > 0 && waitpid(c->children[i], NULL, WNOHANG) == c->children[i]) {
        c->children[i] = 0;
        st = FL_ERR(FL_EIO, "an executor of the local cluster exited at start (its log is above)");
      }
    if (st != FL_OK) break;
    if (common_now_ns() > deadline) {
      st = FL_ERR(FL_ETIMEDOUT, "only %zu of %u executors registered in %d s", have, want,
                  START_TIMEOUT_MS / 1000);
      break;
    }
    usleep(5000);
  }
  fl_buf_free(&reply);
  return st;
}

/* ---- open and close -------------------------------------------------------------------- */

/* The lease's thread: a KeepAlive every keepalive_ms until the context closes. A failed one
 * is not fatal (the next may pass); the driver's lease is three periods long. */
static void *keepalive_main(void *arg) {
  pthread_setname_np(pthread_self(), "fl-keepalive");
  remote_context *c = arg;
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  for (;;) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)c->keepalive_ms * 1000000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    while (!c->keepalive_stop && pthread_cond_timedwait(&c->keepalive_wake, &c->lock, &ts) != ETIMEDOUT) {
    }
    if (c->keepalive_stop) break;
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
    Flint__AppRequest req = FLINT__APP_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    fl_buf reply = FL_BUF_INIT;
    call(c->driver, "/flint.Driver/KeepAlive", &req.base, c->keepalive_ms, &reply);
    fl_buf_free(&reply);
    FL_PCHECK(pthread_mutex_lock(&c->lock));
  }
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  return NULL;
}

static void remote_close(fl_context *ctx) {
  remote_context *c = (remote_context *)ctx;
  if (c->keepalive_started) {
    FL_PCHECK(pthread_mutex_lock(&c->lock));
    c->keepalive_stop = true;
    pthread_cond_signal(&c->keepalive_wake);
    FL_PCHECK(pthread_mutex_unlock(&c->lock));
    pthread_join(c->keepalive, NULL);
  }
  pthread_cond_destroy(&c->keepalive_wake);
  if (c->app_id) {
    Flint__AppRequest req = FLINT__APP_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    fl_buf reply = FL_BUF_INIT;
    call(c->driver, "/flint.Driver/CloseApplication", &req.base, RPC_TIMEOUT_MS, &reply);
    fl_buf_free(&reply);
  }
  rpc_channel_destroy(c->driver);
  dp_server_stop(c->blocks); /* before the registry: it returns every loan */
  if (c->num_children) stop_children(c);
  if (c->cluster_dir) common_remove_tree(c->cluster_dir);
  common_free(c->cluster_dir);
  common_free(c->children);
  rdd_shared_destroy(c->pub.shared);
  map_output_table_destroy(c->pub.map_outputs);
  for (size_t i = 0; i < c->num_libraries; i++) common_free(c->libraries[i].path);
  common_free(c->libraries);
  common_free(c->shipped);
  common_free(c->released);
  common_free(c->inline_live);
  common_free(c->inline_removed);
  common_free(c->secret);
  pthread_mutex_destroy(&c->lock);
  common_free(c);
}

static fl_status remote_cancel(fl_context *ctx) {
  remote_context *c = (remote_context *)ctx;
  Flint__CancelJobsRequest req = FLINT__CANCEL_JOBS_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = call(c->driver, "/flint.Driver/CancelJobs", &req.base, RPC_TIMEOUT_MS, &reply);
  fl_buf_free(&reply);
  return st;
}

static fl_status remote_stats(fl_context *ctx, fl_context_stats *out) {
  remote_context *c = (remote_context *)ctx;
  memset(out, 0, sizeof *out);
  FL_PCHECK(pthread_mutex_lock(&c->lock));
  out->jobs_run = c->jobs_run;
  out->jobs_failed = c->jobs_failed;
  out->tasks_run = c->tasks_run;
  out->tasks_failed = c->tasks_failed;
  out->task_seconds = (double)c->task_ns * 1e-9;
  out->blocks_read_mapped = c->blocks_mapped;
  out->blocks_read_fetched = c->blocks_fetched;
  FL_PCHECK(pthread_mutex_unlock(&c->lock));
  /* The cached blocks are the executors': the driver asks the live ones (dataset 0: the
   * whole application). */
  Flint__StorageInfoRequest req = FLINT__STORAGE_INFO_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = call(c->driver, "/flint.Driver/StorageInfo", &req.base, RPC_TIMEOUT_MS, &reply);
  if (st == FL_OK) {
    Flint__StorageInfoReply *r = flint__storage_info_reply__unpack(NULL, reply.len, reply.data);
    if (r) {
      out->memory_used = r->memory_bytes;
      out->blocks_evicted = r->evictions;
      flint__storage_info_reply__free_unpacked(r, NULL);
    } else {
      st = FL_ERR(FL_EPROTO, "StorageInfo: malformed reply from the driver");
    }
  }
  fl_buf_free(&reply);
  return st;
}

fl_status client_context_open(const char *master, const fl_options *options, fl_context **out) {
  remote_context *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "cannot allocate a context");
  FL_PCHECK(pthread_mutex_init(&c->lock, NULL));
  FL_PCHECK(pthread_cond_init(&c->keepalive_wake, NULL));
  fl_status status = FL_OK;
  char addr[256];
  uint32_t executors = 0;
  FL_CHECK(rdd_shared_create(&c->pub.shared));
  FL_CHECK(map_output_table_create(&c->pub.map_outputs));
  FL_CHECK(client_secret(&c->secret));
  if (strncmp(master, "flint://", 8) == 0) {
    const char *hostport = master + 8;
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1] || strlen(hostport) >= sizeof addr) {
      status = FL_ERR(FL_EINVAL, "master '%s': expected flint://HOST:PORT", master);
      goto cleanup;
    }
    snprintf(addr, sizeof addr, "%s", hostport);
  } else {
    FL_CHECK(start_local_cluster(c, master, addr, sizeof addr, &executors));
  }
  snprintf(c->driver_address, sizeof c->driver_address, "%s", addr);
  FL_CHECK(rpc_channel_create(addr, c->secret, DRIVER_MAX_MESSAGE, &c->driver));
  if (executors) FL_CHECK(wait_for_executors(c, executors));

  Flint__OpenApplicationRequest req = FLINT__OPEN_APPLICATION_REQUEST__INIT;
  const char *name = options && options->app_name && *options->app_name ? options->app_name : getenv("FLINT_APP_NAME");
  req.name = (char *)(name && *name ? name : program_invocation_short_name);
  req.pid = (uint32_t)getpid();
  fl_buf reply = FL_BUF_INIT;
  status = call(c->driver, "/flint.Driver/OpenApplication", &req.base, RPC_TIMEOUT_MS, &reply);
  if (status != FL_OK) {
    fl_buf_free(&reply);
    common_error_wrap(status, "cannot open an application on the driver at %s: ", addr);
    goto cleanup;
  }
  Flint__OpenApplicationReply *r = flint__open_application_reply__unpack(NULL, reply.len, reply.data);
  fl_buf_free(&reply);
  if (!r || r->app_id == 0) {
    if (r) flint__open_application_reply__free_unpacked(r, NULL);
    status = FL_ERR(FL_EPROTO, "OpenApplication: malformed reply from %s", addr);
    goto cleanup;
  }
  c->app_id = r->app_id;
  c->incarnation = r->incarnation;
  c->keepalive_ms = r->keepalive_ms;
  uint32_t cores = r->cores ? r->cores : 1;
  flint__open_application_reply__free_unpacked(r, NULL);

  c->pub.runtime = &remote_runtime;
  c->pub.runtime_impl = c;
  c->pub.cache = &remote_cache;
  c->pub.cache_impl = c;
  c->pub.cores = cores;
  c->pub.default_parallelism =
      options && options->default_parallelism ? options->default_parallelism : cores;
  c->pub.shuffle_memory = options && options->shuffle_memory ? options->shuffle_memory : 64u << 20;
  c->pub.work_dir = "/nonexistent"; /* no task runs here */
  c->pub.close = remote_close;
  c->pub.stats = remote_stats;
  c->pub.cancel = remote_cancel;
  atomic_init(&c->pub.next_rdd_id, 1);
  atomic_init(&c->next_operation, 1);
  if (c->keepalive_ms) {
    if (pthread_create(&c->keepalive, NULL, keepalive_main, c) != 0) {
      status = FL_ERR(FL_ENOMEM, "cannot start the client's keep-alive thread");
      goto cleanup;
    }
    c->keepalive_started = true;
  }
  *out = &c->pub;
  return FL_OK;
cleanup:
  remote_close(&c->pub);
  return status;
}

/* ---- flint submit and flint status ----------------------------------------------------- */

static fl_status connect_master(const char *master, rpc_channel **ch) {
  if (!master || strncmp(master, "flint://", 8) != 0 || !strchr(master + 8, ':'))
    return FL_ERR(FL_EINVAL, "master '%s': expected flint://HOST:PORT", master ? master : "");
  char *secret = NULL;
  fl_status st = client_secret(&secret);
  if (st == FL_OK) st = rpc_channel_create(master + 8, secret, DRIVER_MAX_MESSAGE, ch);
  common_free(secret);
  return st;
}

fl_status fl_submit(const char *master, const char *path, const char *app_name, int argc, char **argv,
                    bool detach, volatile sig_atomic_t *stop, uint64_t *submission, int *exit_code) {
  common_error_clear();
  if (!path || (argc && !argv)) return FL_ERR(FL_EINVAL, "fl_submit: NULL argument");
  rpc_channel *ch = NULL;
  fl_buf lib = FL_BUF_INIT, reply = FL_BUF_INIT;
  fl_status st = connect_master(master, &ch);
  if (st != FL_OK) goto done;
  if ((st = common_read_file(path, &lib)) != FL_OK) goto done;
  Flint__SubmitRequest req = FLINT__SUBMIT_REQUEST__INIT;
  const char *slash = strrchr(path, '/');
  req.name = (char *)(slash ? slash + 1 : path);
  req.app_name = (char *)(app_name && *app_name ? app_name : req.name);
  req.library = (ProtobufCBinaryData){lib.len, lib.data};
  req.n_args = (size_t)argc;
  req.args = argv;
  if ((st = call(ch, "/flint.Driver/Submit", &req.base, RPC_TIMEOUT_MS, &reply)) != FL_OK) goto done;
  Flint__SubmitReply *sr = flint__submit_reply__unpack(NULL, reply.len, reply.data);
  if (!sr) {
    st = FL_ERR(FL_EPROTO, "Submit: malformed reply");
    goto done;
  }
  uint64_t id = sr->submission_id;
  flint__submit_reply__free_unpacked(sr, NULL);
  if (submission) *submission = id;
  if (detach) goto done;
  uint64_t out_off = 0, err_off = 0;
  bool cancel_sent = false;
  for (;;) {
    if (stop && *stop && !cancel_sent) {
      Flint__CancelSubmissionRequest creq = FLINT__CANCEL_SUBMISSION_REQUEST__INIT;
      creq.submission_id = id;
      if ((st = call(ch, "/flint.Driver/CancelSubmission", &creq.base, RPC_TIMEOUT_MS, &reply)) != FL_OK) goto lost;
      fprintf(stderr, "flint: interrupted: job binary %llu is being stopped\n", (unsigned long long)id);
      cancel_sent = true;
    }
    Flint__OutputRequest oreq = FLINT__OUTPUT_REQUEST__INIT;
    oreq.submission_id = id;
    oreq.stdout_offset = out_off;
    oreq.stderr_offset = err_off;
    oreq.wait_ms = stop ? 250 : 5000; /* short waits: a stop is seen at once */
    if ((st = call(ch, "/flint.Driver/Output", &oreq.base, RPC_TIMEOUT_MS, &reply)) != FL_OK) goto lost;
    Flint__OutputReply *o = flint__output_reply__unpack(NULL, reply.len, reply.data);
    if (!o) {
      st = FL_ERR(FL_EPROTO, "Output: malformed reply");
      goto done;
    }
    /* An empty bytes field has NULL data, which fwrite must not get (UBSan). */
    if (o->stdout_data.len) fwrite(o->stdout_data.data, 1, o->stdout_data.len, stdout);
    if (o->stderr_data.len) fwrite(o->stderr_data.data, 1, o->stderr_data.len, stderr);
    fflush(stdout);
    fflush(stderr);
    out_off += o->stdout_data.len;
    err_off += o->stderr_data.len;
    bool exited = o->exited && !o->stdout_data.len && !o->stderr_data.len;
    int code = o->signal ? 128 + o->signal : o->exit_code;
    int sig = o->signal;
    flint__output_reply__free_unpacked(o, NULL);
    if (exited) {
      if (sig) fprintf(stderr, "flint: the job was killed by signal %d (%s)\n", sig, strsignal(sig));
      if (exit_code) *exit_code = code;
      break;
    }
  }
  goto done;
lost:
  /* What the job wrote before is printed already; its driver ends it (PDEATHSIG). */
  common_error_wrap(st, "lost the driver at %s while job binary %llu ran (its output up to then is above): ",
                    master + 8, (unsigned long long)id);
done:
  fl_buf_free(&lib);
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}

fl_status fl_print_status(const char *master, FILE *out) {
  common_error_clear();
  rpc_channel *ch = NULL;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = connect_master(master, &ch);
  if (st != FL_OK) goto done;
  Flint__Empty req = FLINT__EMPTY__INIT;
  if ((st = call(ch, "/flint.Driver/Status", &req.base, RPC_TIMEOUT_MS, &reply)) != FL_OK) goto done;
  Flint__StatusReply *r = flint__status_reply__unpack(NULL, reply.len, reply.data);
  if (!r) {
    st = FL_ERR(FL_EPROTO, "Status: malformed reply");
    goto done;
  }
  fprintf(out, "executors: %zu\n", r->n_executors);
  fprintf(out, "  %-4s %-22s %5s %10s %12s %10s %8s %4s %s\n", "id", "address", "cores", "memory",
          "cached", "tasks", "failed", "gpu", "state");
  for (size_t i = 0; i < r->n_executors; i++) {
    Flint__ExecutorInfo *e = r->executors[i];
    char gpu[16] = "-";
    if (e->has_gpu) snprintf(gpu, sizeof gpu, "%u", e->gpu);
    fprintf(out, "  %-4llu %-22s %5u %8lluMi %10lluKi %10llu %8llu %4s %s\n", (unsigned long long)e->id,
            e->address, e->cores, (unsigned long long)(e->memory >> 20),
            (unsigned long long)(e->cached_bytes >> 10), (unsigned long long)e->tasks_run,
            (unsigned long long)e->tasks_failed, gpu, e->alive ? "alive" : "lost");
  }
  fprintf(out, "applications: %zu\n", r->n_applications);
  for (size_t i = 0; i < r->n_applications; i++) {
    Flint__AppInfo *a = r->applications[i];
    fprintf(out, "  %llu %s (%s), %zu recent jobs\n", (unsigned long long)a->id, a->name, a->state,
            a->n_jobs);
    for (size_t j = 0; j < a->n_jobs; j++)
      fprintf(out, "    job %llu: %s, %u tasks%s%s\n", (unsigned long long)a->jobs[j]->id,
              a->jobs[j]->state, a->jobs[j]->tasks, a->jobs[j]->error[0] ? ": " : "",
              a->jobs[j]->error);
  }
  flint__status_reply__free_unpacked(r, NULL);
done:
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  return st;
}

fl_status fl_driver_serve(const fl_driver_options *o, volatile sig_atomic_t *stop) {
  common_error_clear();
  if (!o || !stop) return FL_ERR(FL_EINVAL, "fl_driver_serve: NULL argument");
  char *secret = NULL;
  fl_status st = client_secret(&secret);
  if (st != FL_OK) return st;
  driver_config cfg = {.listen = o->listen, .secret = secret, .work_dir = o->work_dir, .port_file = o->port_file};
  st = driver_serve(&cfg, stop);
  common_free(secret);
  return st;
}

int fl_executor_supervise(char *const *argv, volatile sig_atomic_t *stop) {
  common_error_clear();
  char *secret = NULL;
  if (client_secret(&secret) != FL_OK) {
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
  fl_status st = client_secret(&secret);
  if (st != FL_OK) return st;
  executor_config cfg = {.driver = o->driver, .host = o->host, .cores = o->cores, .memory = o->memory,
                         .work_dir = o->work_dir, .secret = secret, .gpu = o->has_gpu ? (int32_t)o->gpu : -1};
  st = executor_serve(&cfg, stop);
  common_free(secret);
  return st;
}
