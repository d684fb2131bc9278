/*
 * ps_placement.c: the parameter-server tables of the applications (flint/ps.h): where their
 * shards live, and what happens when an executor that holds one is lost.
 *
 * Every executor runs a parameter server (ps/ps.h) and says where at registration. A table's
 * shard s goes to the live servers in turn, its primary on one executor and its backups (as
 * many as the table asks, chained or all fed by the primary) on the next ones, starting at a
 * place that turns with the table's id so that tables spread. When an executor is lost, the
 * shards it held close ranks: a lost primary's first backup is promoted, a lost backup's
 * predecessor forwards past it; then every shard short of backups is backed up again on other
 * executors (the replica that feeds the new one copies its whole state there under its lock,
 * then forwards to it). Training goes on, and a later loss loses nothing either, as long as
 * it comes after the copy. A table goes with its application.
 *
 * Threading: the handlers run on rpc handler threads and block on the servers; a loss comes
 * on the scheduler thread, which only queues it (under a lock of its own) for the recovery
 * thread. The tables' lock is held across the servers' calls: recoveries and creations are
 * rare and short, and must not interleave.
 */
#include <string.h>
#include <time.h>

#include "driver/driver_internal.h"
#include "driver/ui/ui.h"
#include "ps/ps.h"

#define CALL_TIMEOUT_MS 30000
#define MAX_SERVERS 1024
/* The web UI's live clocks (placement_live_json) run on its HTTP thread: they wait this long
 * for the tables' lock (held across recoveries' server calls), this long for each primary,
 * and stop asking after this long in all (the shards left show no clocks). */
#define LIVE_LOCK_WAIT_MS 200

#define MEMBERS (1 + PS_MAX_BACKUPS)

typedef struct placed_table {
  uint64_t app;
  uint32_t backups; /* asked for a shard */
  ps_map map;       /* its places are this struct's */
  uint64_t (*members)[MEMBERS]; /* each shard's executors: [0] the primary, then the backups; 0 after the last */
  struct placed_table *next;
} placed_table;

struct driver_placement {
  pthread_mutex_t lock; /* the tables; held across the servers' calls */
  placed_table *tables;
  pthread_mutex_t queue_lock; /* what follows: the scheduler thread must never wait on a server */
  pthread_cond_t wake;
  uint64_t *lost;
  size_t num_lost, cap_lost;
  pthread_t thread;
  bool started, stop;
  uint32_t next_table;
};

static void post_table(driver_state *d, const placed_table *t);

static void table_free(placed_table *t) {
  if (!t) return;
  ps_map_free(&t->map);
  common_free(t->members);
  common_free(t);
}

/* Member m's address: the primary's or a backup's. */
static char *member_address(ps_place *p, uint32_t m) { return m == 0 ? p->primary : p->backups[m - 1]; }

static uint32_t member_count(const uint64_t members[MEMBERS]) {
  uint32_t n = 0;
  while (n < MEMBERS && members[n]) n++;
  return n;
}

static void drop_everywhere(driver_state *d, placed_table *t) {
  for (uint32_t s = 0; s < t->map.shards; s++)
    for (uint32_t m = 0; m < MEMBERS; m++) {
      const char *a = member_address(&t->map.places[s], m);
      if (a[0] && ps_shard_drop(a, d->cfg.secret, t->map.table, s, CALL_TIMEOUT_MS) != FL_OK)
        common_log(LOG_DEBUG, "dropping a shard: %s", fl_last_error());
    }
}

/* ---- recovery ---- */

/* A live server that holds no replica of the shard, after `after` in the list (so that
 * replicas spread). */
static const cluster_ps_server *another(const cluster_ps_server *servers, size_t n, const uint64_t members[MEMBERS],
                                        uint64_t after) {
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    if (servers[i].executor == after) at = i;
  for (size_t k = 1; k <= n; k++) {
    const cluster_ps_server *c = &servers[(at + k) % n];
    bool taken = false;
    for (uint32_t m = 0; m < MEMBERS; m++) taken |= members[m] == c->executor;
    if (!taken) return c;
  }
  return NULL;
}

/* Tells replica m whom it forwards to now (after a loss among its targets). */
static void retarget(driver_state *d, placed_table *t, uint32_t s, uint32_t m) {
  ps_place *p = &t->map.places[s];
  char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
  uint32_t n;
  ps_place_targets(p, t->map.replication, m, targets, &n);
  if (ps_shard_targets(member_address(p, m), d->cfg.secret, t->map.table, s, targets, n, CALL_TIMEOUT_MS) != FL_OK)
    common_log(LOG_WARN, "parameter server: table %u shard %u: %s", t->map.table, s, fl_last_error());
}

static void recover_shard(driver_state *d, placed_table *t, uint32_t s, uint64_t lost, const cluster_ps_server *servers,
                          size_t n) {
  ps_place *p = &t->map.places[s];
  uint64_t *mem = t->members[s];
  uint32_t id = t->map.table, count = member_count(mem), at = 0;
  while (at < count && mem[at] != lost) at++;
  if (at == count) return;
  /* The members close ranks over the lost one. */
  for (uint32_t m = at; m + 1 < count; m++) {
    mem[m] = mem[m + 1];
    memcpy(member_address(p, m), member_address(p, m + 1), PS_ADDRESS_MAX);
  }
  count--;
  mem[count] = 0;
  member_address(p, count)[0] = 0;
  if (count == 0) {
    common_log(LOG_ERROR, "parameter server: table %u lost shard %u with executor %llu (it had no backup)", id, s,
               (unsigned long long)lost);
    return;
  }
  if (at == 0) {
    char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
    uint32_t nt;
    ps_place_targets(p, t->map.replication, 0, targets, &nt);
    if (ps_shard_promote(p->primary, d->cfg.secret, id, s, CALL_TIMEOUT_MS) != FL_OK) {
      common_log(LOG_ERROR, "parameter server: table %u shard %u: cannot promote its backup: %s", id, s,
                 fl_last_error());
      return;
    }
    common_log(LOG_INFO, "parameter server: table %u shard %u: executor %llu lost, its backup on executor %llu "
               "is the primary", id, s, (unsigned long long)lost, (unsigned long long)mem[0]);
    retarget(d, t, s, 0);
  } else {
    /* primary-backup: the primary feeds the rest; chain: the lost one's predecessor skips it */
    retarget(d, t, s, t->map.replication == PS_REPLICATION_CHAIN ? at - 1 : 0);
  }
  /* Back up again: the new replica joins the end of the chain, or the primary's list. */
  while (count < 1 + t->backups) {
    uint32_t feeder = t->map.replication == PS_REPLICATION_CHAIN ? count - 1 : 0;
    const cluster_ps_server *b = another(servers, n, mem, mem[count - 1]);
    if (!b) {
      common_log(LOG_WARN, "parameter server: table %u shard %u has %u backups of %u: no other executor", id, s,
                 count - 1, t->backups);
      return;
    }
    if (ps_shard_replicate(member_address(p, feeder), d->cfg.secret, id, s, b->address, CALL_TIMEOUT_MS) != FL_OK) {
      common_log(LOG_WARN, "parameter server: table %u shard %u: cannot back it up on executor %llu: %s", id, s,
                 (unsigned long long)b->executor, fl_last_error());
      return;
    }
    mem[count] = b->executor;
    snprintf(member_address(p, count), PS_ADDRESS_MAX, "%s", b->address);
    count++;
  }
}

static void *recovery_main(void *arg) {
  driver_state *d = arg;
  driver_placement *pl = d->placement;
  cluster_ps_server *servers = common_calloc(MAX_SERVERS, sizeof *servers);
  FL_PCHECK(pthread_mutex_lock(&pl->queue_lock));
  while (!pl->stop) {
    if (pl->num_lost == 0) {
      FL_PCHECK(pthread_cond_wait(&pl->wake, &pl->queue_lock));
      continue;
    }
    uint64_t lost = pl->lost[--pl->num_lost];
    FL_PCHECK(pthread_mutex_unlock(&pl->queue_lock));
    FL_PCHECK(pthread_mutex_lock(&pl->lock));
    size_t n = servers ? cluster_ps_servers(d->cluster, servers, MAX_SERVERS) : 0;
    if (n > MAX_SERVERS) n = MAX_SERVERS;
    for (placed_table *t = pl->tables; t; t = t->next) {
      bool changed = false;
      for (uint32_t s = 0; s < t->map.shards; s++) {
        uint64_t before[MEMBERS];
        memcpy(before, t->members[s], sizeof before);
        recover_shard(d, t, s, lost, servers, n);
        changed = changed || memcmp(before, t->members[s], sizeof before) != 0;
      }
      if (changed) post_table(d, t); /* the UI shows the replicas now */
    }
    FL_PCHECK(pthread_mutex_unlock(&pl->lock));
    FL_PCHECK(pthread_mutex_lock(&pl->queue_lock));
  }
  FL_PCHECK(pthread_mutex_unlock(&pl->queue_lock));
  common_free(servers);
  return NULL;
}

void placement_executor_lost(driver_state *d, uint64_t executor) {
  driver_placement *pl = d->placement;
  if (!pl) return;
  FL_PCHECK(pthread_mutex_lock(&pl->queue_lock));
  uint64_t *grown = pl->stop ? NULL : common_grow(pl->lost, sizeof *pl->lost, pl->num_lost, &pl->cap_lost, 8);
  if (pl->stop) {
    /* the driver stops: nothing to recover */
  } else if (grown) {
    pl->lost = grown;
    pl->lost[pl->num_lost++] = executor;
    pthread_cond_signal(&pl->wake);
  } else {
    common_log(LOG_ERROR, "parameter server: out of memory: executor %llu's shards are not recovered",
               (unsigned long long)executor);
  }
  FL_PCHECK(pthread_mutex_unlock(&pl->queue_lock));
}

/* ---- the web UI ---- */

/* PsTable (docs/ui.md): the table's shards and their executors, primary first. Under lock. */
static void post_table(driver_state *d, const placed_table *t) {
  if (!d->ui) return;
  fl_buf b = FL_BUF_INIT;
  if (ps_table_event(&b, t->app, &t->map, (const uint64_t(*)[MEMBERS])t->members) == FL_OK)
    ui_post(d->ui, (const char *)b.data);
  else common_log(LOG_DEBUG, "parameter server: table %u: out of memory for the web UI's event", t->map.table);
  fl_buf_free(&b);
}

static bool lock_within(pthread_mutex_t *mu, uint32_t ms) {
  for (uint32_t waited = 0;; waited += 10) {
    if (pthread_mutex_trylock(mu) == 0) return true;
    if (waited >= ms) return false;
    nanosleep(&(struct timespec){0, 10 * 1000000}, NULL);
  }
}

char *placement_live_json(driver_state *d, uint64_t app) {
  driver_placement *pl = d->placement;
  if (!pl || !lock_within(&pl->lock, LIVE_LOCK_WAIT_MS)) return NULL;
  /* The places, copied: the servers are asked without the lock. */
  size_t n = 0, cap = 0;
  ps_live_shard *shards = NULL;
  bool ok = true;
  for (placed_table *t = pl->tables; ok && t; t = t->next)
    for (uint32_t s = 0; ok && t->app == app && s < t->map.shards; s++) {
      ps_live_shard *grown = common_grow(shards, sizeof *shards, n, &cap, 16);
      if (!(ok = grown != NULL)) break;
      shards = grown;
      ps_live_shard *l = &shards[n++];
      *l = (ps_live_shard){.table = t->map.table, .shard = s, .members = member_count(t->members[s])};
      memcpy(l->member, t->members[s], sizeof l->member);
      snprintf(l->primary, sizeof l->primary, "%s", t->map.places[s].primary);
    }
  FL_PCHECK(pthread_mutex_unlock(&pl->lock));
  char *text = ok ? ps_live_json(shards, n, d->cfg.secret) : NULL;
  common_free(shards);
  return text;
}

/* ---- tables ---- */

static fl_status spec_of(const Flint__PsTableSpec *in, ps_table_spec *out) {
  if (!in) return FL_ERR(FL_EPROTO, "CreatePsTable: no spec");
  if (in->update > PS_UPDATE_ADAM) return FL_ERR(FL_EINVAL, "parameter server: unknown update function %u", in->update);
  *out = (ps_table_spec){.sparse = in->sparse, .keys = in->keys, .width = in->width,
                         .update = {(ps_update_kind)in->update, in->lr, in->beta1, in->beta2, in->eps}};
  return ps_table_spec_check(out);
}

static fl_status place(driver_state *d, uint64_t app, const ps_table_spec *spec, uint32_t shards, uint32_t workers,
                       uint32_t backups, ps_replication mode, placed_table **out) {
  driver_placement *pl = d->placement;
  cluster_ps_server *servers = common_calloc(MAX_SERVERS, sizeof *servers);
  if (!servers) return FL_ERR(FL_ENOMEM, "out of memory");
  size_t n = cluster_ps_servers(d->cluster, servers, MAX_SERVERS);
  if (n > MAX_SERVERS) n = MAX_SERVERS;
  fl_status st = FL_OK;
  if (backups > PS_MAX_BACKUPS) st = FL_ERR(FL_EINVAL, "parameter server: %u backups (at most %d)", backups, PS_MAX_BACKUPS);
  else if (n == 0) st = FL_ERR(FL_ESTATE, "parameter server: no executor to host a table (none has registered)");
  else if (n < 1 + backups)
    st = FL_ERR(FL_ESTATE, "parameter server: a table with %u backup%s a shard needs %u executors and the cluster has "
                "%zu (ask for fewer backups, or add executors)", backups, backups == 1 ? "" : "s", 1 + backups, n);
  if (shards == 0) shards = (uint32_t)n;
  if (st == FL_OK && (workers < 1 || shards > 4096))
    st = FL_ERR(FL_EINVAL, "parameter server: %u shards and %u workers (1 to 4096 shards, 1 worker at least)",
                shards, workers);
  placed_table *t = st == FL_OK ? common_calloc(1, sizeof *t) : NULL;
  if (st == FL_OK && t) {
    t->map.places = common_calloc(shards, sizeof *t->map.places);
    t->members = common_calloc(shards, sizeof *t->members);
  }
  if (st == FL_OK && (!t || !t->map.places || !t->members)) st = FL_ERR(FL_ENOMEM, "out of memory");
  if (st == FL_OK) {
    t->app = app;
    t->backups = backups;
    t->map.replication = mode;
    t->map.table = pl->next_table++;
    t->map.spec = *spec;
    t->map.shards = shards;
    t->map.workers = workers;
    for (uint32_t s = 0; s < shards; s++)
      for (uint32_t m = 0; m <= backups; m++) {
        const cluster_ps_server *c = &servers[(t->map.table + s + m) % n];
        t->members[s][m] = c->executor;
        snprintf(member_address(&t->map.places[s], m), PS_ADDRESS_MAX, "%s", c->address);
      }
    st = ps_table_create(&t->map, d->cfg.secret, CALL_TIMEOUT_MS);
    if (st != FL_OK) drop_everywhere(d, t);
  }
  common_free(servers);
  if (st != FL_OK) {
    table_free(t);
    return st;
  }
  *out = t;
  return FL_OK;
}

fl_status placement_create(driver_state *d, uint64_t app, const Flint__CreatePsTableRequest *req, fl_buf *response) {
  ps_table_spec spec;
  fl_status st = spec_of(req->spec, &spec);
  if (st != FL_OK) return st;
  placed_table *t = NULL;
  driver_placement *pl = d->placement;
  FL_PCHECK(pthread_mutex_lock(&pl->lock));
  uint32_t backups = req->replicate ? (req->backups ? req->backups : 1) : 0;
  if (req->replication > PS_REPLICATION_CHAIN)
    st = FL_ERR(FL_EINVAL, "parameter server: unknown replication %u", req->replication);
  else
    st = place(d, app, &spec, req->shards, req->workers, backups, (ps_replication)req->replication, &t);
  if (st == FL_OK) {
    t->next = pl->tables;
    pl->tables = t;
    post_table(d, t);
  }
  Flint__CreatePsTableReply reply = FLINT__CREATE_PS_TABLE_REPLY__INIT;
  fl_buf handle = FL_BUF_INIT;
  if (st == FL_OK) st = ps_map_encode(&t->map, &handle);
  if (st == FL_OK) {
    reply.table = t->map.table;
    reply.handle.data = handle.data;
    reply.handle.len = handle.len;
    st = proto_pack(&reply.base, response);
    common_log(LOG_INFO, "parameter server: application %llu made table %u: %u shards, %u backups each%s",
               (unsigned long long)app, t->map.table, t->map.shards, t->backups,
               t->backups > 1 && t->map.replication == PS_REPLICATION_CHAIN ? " (chain)" : "");
  }
  fl_buf_free(&handle);
  FL_PCHECK(pthread_mutex_unlock(&pl->lock));
  return st;
}

/* Unlinks and drops the tables that match (one id of an app, or every table of the app). */
static size_t drop_matching(driver_state *d, uint64_t app, bool all, uint32_t id) {
  driver_placement *pl = d->placement;
  size_t dropped = 0;
  FL_PCHECK(pthread_mutex_lock(&pl->lock));
  for (placed_table **p = &pl->tables; *p;) {
    placed_table *t = *p;
    if (t->app == app && (all || t->map.table == id)) {
      *p = t->next;
      drop_everywhere(d, t);
      table_free(t);
      dropped++;
    } else {
      p = &t->next;
    }
  }
  FL_PCHECK(pthread_mutex_unlock(&pl->lock));
  return dropped;
}

fl_status placement_drop(driver_state *d, uint64_t app, uint32_t table) {
  if (drop_matching(d, app, false, table) == 0)
    return FL_ERR(FL_ENOENT, "parameter server: application %llu has no table %u", (unsigned long long)app, table);
  return FL_OK;
}

void placement_app_closed(driver_state *d, uint64_t app) {
  if (d->placement) drop_matching(d, app, true, 0);
}

fl_status placement_start(driver_state *d) {
  driver_placement *pl = common_calloc(1, sizeof *pl);
  if (!pl) return FL_ERR(FL_ENOMEM, "out of memory");
  FL_PCHECK(pthread_mutex_init(&pl->lock, NULL));
  FL_PCHECK(pthread_mutex_init(&pl->queue_lock, NULL));
  FL_PCHECK(pthread_cond_init(&pl->wake, NULL));
  /* Ids differ between driver processes: executors outlive a driver with their shards. */
  pl->next_table = (uint32_t)(d->incarnation >> 32) | 1u;
  d->placement = pl;
  if (pthread_create(&pl->thread, NULL, recovery_main, d) != 0) {
    placement_free(d);
    return FL_ERR(FL_ENOMEM, "cannot start the parameter server's recovery thread");
  }
  pl->started = true;
  return FL_OK;
}

void placement_stop(driver_state *d) {
  driver_placement *pl = d->placement;
  if (!pl) return;
  FL_PCHECK(pthread_mutex_lock(&pl->queue_lock));
  pl->stop = true;
  pthread_cond_signal(&pl->wake);
  FL_PCHECK(pthread_mutex_unlock(&pl->queue_lock));
  if (pl->started) pthread_join(pl->thread, NULL);
  pl->started = false;
  while (pl->tables) {
    placed_table *t = pl->tables;
    pl->tables = t->next;
    table_free(t);
  }
}

void placement_free(driver_state *d) {
  driver_placement *pl = d->placement;
  if (!pl) return;
  placement_stop(d);
  common_free(pl->lost);
  pthread_cond_destroy(&pl->wake);
  pthread_mutex_destroy(&pl->queue_lock);
  pthread_mutex_destroy(&pl->lock);
  common_free(pl);
  d->placement = NULL;
}
