/*
 * ps_tables.c: flint/ps.h's tables as the user's process makes them. A local context hosts
 * them on servers of its own (client_ps_local: four ps_servers on 127.0.0.1, started with the
 * first table); a remote context asks its driver (CreatePsTable), which places the shards on
 * the executors' servers (driver/ps_placement.c). Either way the table's handle is its map
 * (ps/map.c), which workers open anywhere (ps/api.c).
 *
 * Threading: a table may be used from any thread; the local servers' start is under their lock.
 */
#include <string.h>

#include "client/client_internal.h"
#include "common/config.h"
#include "driver/ui/ui.h"
#include "flint/ps.h"
#include "proto/pack.h"
#include "ps/ps.h"

#define LOCAL_DEFAULT_SHARDS 2

struct fl_ps_table {
  fl_context *ctx;
  bool remote;
  struct fl_ps_table *next_local; /* in client_ps_local.tables */
  ps_map map;
  fl_buf handle;
  char *secret;
  ps_client *admin; /* save and load, made on first use */
};

static fl_status spec_of(const fl_ps_options *o, ps_table_spec *out) {
  if ((unsigned)o->update > FL_PS_ADAM) return FL_ERR(FL_EINVAL, "fl_ps_table_create: unknown update function %d", (int)o->update);
  *out = (ps_table_spec){.sparse = o->sparse, .keys = o->keys, .width = o->width,
                         .update = {(ps_update_kind)o->update, o->lr, o->beta1, o->beta2, o->eps}};
  fl_status st = ps_table_spec_check(out);
  if (st == FL_OK && o->workers < 1) st = FL_ERR(FL_EINVAL, "fl_ps_table_create: a table needs 1 worker at least");
  if (st == FL_OK && o->shards > 4096) st = FL_ERR(FL_EINVAL, "fl_ps_table_create: %u shards (at most 4096)", o->shards);
  if (st == FL_OK && o->replicate && o->backups > PS_MAX_BACKUPS)
    st = FL_ERR(FL_EINVAL, "fl_ps_table_create: %u backups a shard (at most %d)", o->backups, PS_MAX_BACKUPS);
  if (st == FL_OK && (unsigned)o->replication > FL_PS_CHAIN)
    st = FL_ERR(FL_EINVAL, "fl_ps_table_create: unknown replication %d", (int)o->replication);
  return st == FL_OK ? st : common_error_wrap(st, "fl_ps_table_create: ");
}

/* PsTable (docs/ui.md) for a local context's web UI: every replica is in this process, the
 * local context's one executor (0), on one of its four servers. */
static void post_local_table(ui *u, const ps_map *m) {
  if (!u) return;
  fl_buf b = FL_BUF_INIT;
  if (ps_table_event(&b, 0, m, NULL) == FL_OK) ui_post(u, (const char *)b.data);
  fl_buf_free(&b);
}

/* The tables' live view for the context's web UI (client_ps_local.live_json): every replica
 * is the one executor, 0. */
static char *client_ps_local_live_json(client_ps_local *p) {
  size_t n = 0, cap = 0;
  ps_live_shard *shards = NULL;
  bool ok = true;
  FL_PCHECK(pthread_mutex_lock(&p->lock)); /* held briefly: creations hold it only to link */
  for (fl_ps_table *t = p->tables; ok && t; t = t->next_local)
    for (uint32_t s = 0; ok && s < t->map.shards; s++) {
      ps_live_shard *grown = common_grow(shards, sizeof *shards, n, &cap, 16);
      if (!(ok = grown != NULL)) break;
      shards = grown;
      shards[n] = (ps_live_shard){.table = t->map.table, .shard = s,
                                  .members = 1 + ps_place_backups(&t->map.places[s])};
      snprintf(shards[n++].primary, PS_ADDRESS_MAX, "%s", t->map.places[s].primary);
    }
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  char *text = ok ? ps_live_json(shards, n, NULL) : NULL;
  common_free(shards);
  return text;
}

static fl_status create_local(fl_ps_table *t, const fl_ps_options *o, const ps_table_spec *spec) {
  client_ps_local *p = client_local_context_ps(t->ctx);
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  for (int i = 0; st == FL_OK && i < CLIENT_PS_LOCAL_SERVERS; i++)
    if (!p->servers[i]) {
      ps_server_options o = PS_SERVER_OPTIONS_INIT;
      o.timeout_ms = (uint32_t)config_ms(CONFIG_PS_TIMEOUT_MS);
      st = ps_server_start("127.0.0.1", 0, &o, &p->servers[i]);
    }
  uint32_t id = p->next_table++;
  p->live_json = client_ps_local_live_json; /* the context's web UI asks through it */
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  if (st != FL_OK) return st;
  uint32_t shards = o->shards ? o->shards : LOCAL_DEFAULT_SHARDS;
  uint32_t backups = o->replicate ? (o->backups ? o->backups : 1) : 0;
  t->map = (ps_map){.table = id, .spec = *spec, .shards = shards, .workers = o->workers,
                    .replication = (ps_replication)o->replication};
  if (!(t->map.places = common_calloc(shards, sizeof *t->map.places))) return FL_ERR(FL_ENOMEM, "out of memory");
  for (uint32_t s = 0; s < shards; s++) {
    ps_place *pl = &t->map.places[s];
    snprintf(pl->primary, PS_ADDRESS_MAX, "127.0.0.1:%d", ps_server_port(p->servers[s % CLIENT_PS_LOCAL_SERVERS]));
    for (uint32_t b = 0; b < backups; b++)
      snprintf(pl->backups[b], PS_ADDRESS_MAX, "127.0.0.1:%d",
               ps_server_port(p->servers[(s + 1 + b) % CLIENT_PS_LOCAL_SERVERS]));
  }
  st = ps_table_create(&t->map, NULL, (uint32_t)config_ms(CONFIG_PS_TIMEOUT_MS));
  if (st != FL_OK) return st;
  post_local_table(client_local_context_ui(t->ctx), &t->map);
  FL_PCHECK(pthread_mutex_lock(&p->lock));
  t->next_local = p->tables;
  p->tables = t;
  FL_PCHECK(pthread_mutex_unlock(&p->lock));
  return FL_OK;
}

static fl_status create_remote(fl_ps_table *t, const fl_ps_options *o, const ps_table_spec *spec) {
  remote_context *c = (remote_context *)t->ctx;
  Flint__PsTableSpec ws = FLINT__PS_TABLE_SPEC__INIT;
  ws.sparse = spec->sparse;
  ws.keys = spec->keys;
  ws.width = spec->width;
  ws.update = (uint32_t)spec->update.kind;
  ws.lr = spec->update.lr, ws.beta1 = spec->update.beta1, ws.beta2 = spec->update.beta2, ws.eps = spec->update.eps;
  Flint__CreatePsTableRequest req = FLINT__CREATE_PS_TABLE_REQUEST__INIT;
  req.app_id = c->app_id;
  req.incarnation = c->incarnation;
  req.spec = &ws;
  req.shards = o->shards;
  req.workers = o->workers;
  req.replicate = o->replicate;
  req.backups = o->backups;
  req.replication = (uint32_t)o->replication;
  fl_buf reply = FL_BUF_INIT;
  fl_status st = client_rpc_call(c->driver, "/flint.Driver/CreatePsTable", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
  Flint__CreatePsTableReply *r = NULL;
  if (st == FL_OK && !(r = flint__create_ps_table_reply__unpack(NULL, reply.len, reply.data)))
    st = FL_ERR(FL_EPROTO, "CreatePsTable: a malformed reply");
  if (st == FL_OK) st = ps_map_decode(fl_bytes_of(r->handle.data, r->handle.len), &t->map);
  if (r) flint__create_ps_table_reply__free_unpacked(r, NULL);
  fl_buf_free(&reply);
  if (st == FL_OK && c->secret && !(t->secret = common_strdup(c->secret))) st = FL_ERR(FL_ENOMEM, "out of memory");
  return st;
}

fl_status fl_ps_table_create(fl_context *ctx, const fl_ps_options *options, fl_ps_table **out) {
  common_error_clear();
  if (!ctx || !options || !out) return FL_ERR(FL_EINVAL, "fl_ps_table_create: NULL argument");
  ps_table_spec spec;
  fl_status st = spec_of(options, &spec);
  if (st != FL_OK) return st;
  fl_ps_table *t = common_calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "out of memory");
  t->ctx = ctx;
  t->remote = !fl_context_is_local(ctx);
  st = t->remote ? create_remote(t, options, &spec) : create_local(t, options, &spec);
  if (st == FL_OK) st = ps_map_encode(&t->map, &t->handle);
  if (st != FL_OK) {
    fl_ps_table_destroy(t);
    return st;
  }
  *out = t;
  return FL_OK;
}

void fl_ps_table_destroy(fl_ps_table *t) {
  if (!t) return;
  ps_client_destroy(t->admin);
  if (t->remote && t->map.places) {
    remote_context *c = (remote_context *)t->ctx;
    Flint__DropPsTableRequest req = FLINT__DROP_PS_TABLE_REQUEST__INIT;
    req.app_id = c->app_id;
    req.incarnation = c->incarnation;
    req.table = t->map.table;
    fl_buf reply = FL_BUF_INIT;
    client_rpc_call(c->driver, "/flint.Driver/DropPsTable", &req.base, CLIENT_RPC_TIMEOUT_MS, &reply);
    fl_buf_free(&reply);
  } else if (t->map.places) {
    client_ps_local *p = client_local_context_ps(t->ctx);
    FL_PCHECK(pthread_mutex_lock(&p->lock));
    for (fl_ps_table **at = &p->tables; *at; at = &(*at)->next_local)
      if (*at == t) {
        *at = t->next_local;
        break;
      }
    FL_PCHECK(pthread_mutex_unlock(&p->lock));
    for (uint32_t s = 0; s < t->map.shards; s++) {
      ps_shard_drop(t->map.places[s].primary, NULL, t->map.table, s, 0);
      for (uint32_t b = 0; b < ps_place_backups(&t->map.places[s]); b++)
        ps_shard_drop(t->map.places[s].backups[b], NULL, t->map.table, s, 0);
    }
  }
  ps_map_free(&t->map);
  fl_buf_free(&t->handle);
  common_free(t->secret);
  common_free(t);
}

fl_bytes fl_ps_table_handle(const fl_ps_table *t) {
  return t ? fl_buf_bytes(&t->handle) : fl_bytes_of(NULL, 0);
}

static fl_status admin(fl_ps_table *t) {
  if (t->admin) return FL_OK;
  return ps_client_create(&t->map, 0, t->secret, (uint32_t)config_ms(CONFIG_PS_TIMEOUT_MS), &t->admin);
}

fl_status fl_ps_table_save(fl_ps_table *t, const char *path) {
  common_error_clear();
  if (!t || !path) return FL_ERR(FL_EINVAL, "fl_ps_table_save: NULL argument");
  fl_status st = admin(t);
  return st == FL_OK ? ps_table_save(t->admin, path) : st;
}

fl_status fl_ps_table_load(fl_ps_table *t, const char *path) {
  common_error_clear();
  if (!t || !path) return FL_ERR(FL_EINVAL, "fl_ps_table_load: NULL argument");
  fl_status st = admin(t);
  return st == FL_OK ? ps_table_load(t->admin, path) : st;
}
