/*
 * ps/server.c: a parameter server (ps/ps.h): hosted shards and the threads that serve them.
 *
 * Design. An acceptor thread takes connections; each connection gets a thread that reads a
 * request, answers it and reads the next. A connection is one worker's (or one primary's)
 * ordered stream: its pushes and clock ends must apply in the order sent, and a pull under
 * SSP may block until slower workers end their clocks, which then arrive on their own
 * connections. A thread per connection gives both without a queue of parked pulls; the
 * connections of a table are its workers and primaries, tens, not thousands. (The data
 * plane's event loop serves many short block fetches; this serves few long streams.)
 *
 * A hosted shard has a mutex held while it is read or changed. A replica with targets (the
 * primary: every backup, primary-backup; each replica of a chain: the next) forwards each
 * mutating request to them while it still holds that mutex, so they see the same order,
 * and answers only when they have answered: an acknowledged update is on every replica. A
 * target that cannot be reached is dropped with a warning and the replica goes on without
 * it (degraded, until the driver backs the shard up again).
 *
 * Duplicates. A mutating request carries (worker, seq); the shard applies seq only when it
 * is above the worker's last, which the replicas keep too. A client that lost the primary
 * after a backup applied its push resends it to the promoted backup, which skips it but
 * forwards it all the same: a replica that the dead primary had not reached gets it so.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ps/wire.h"

#define DEFAULT_TIMEOUT_MS 30000u

typedef struct hosted {
  uint32_t table, index, shards, workers;
  pthread_mutex_t mu;
  ps_shard *shard;
  ps_clocks *clocks;
  uint64_t *last_seq; /* per worker: the last mutating request applied */
  bool primary;
  uint32_t num_targets; /* the replicas it forwards to */
  char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
  int target_fd[PS_MAX_BACKUPS]; /* -1 until the first forward */
  fl_buf forward_reply;
  struct hosted *next;
} hosted;

typedef struct conn {
  struct ps_server *server;
  int fd;
  pthread_t thread;
  atomic_bool done;
  char peer[PS_ADDRESS_MAX];
  struct conn *next;
} conn;

struct ps_server {
  int listen_fd, port;
  char *secret;
  uint64_t max_message;
  uint32_t timeout_ms;
  pthread_t acceptor;
  pthread_mutex_t mu; /* tables, conns */
  hosted *tables;
  conn *conns;
  atomic_bool stopping;
  atomic_uint_fast64_t requests, pushes, pulls, forwards, duplicates, bytes_in, bytes_out;
};

/* ---- hosted shards ---- */

static hosted *hosted_find(ps_server *s, uint32_t table, uint32_t index) {
  pthread_mutex_lock(&s->mu);
  hosted *h = s->tables;
  while (h && (h->table != table || h->index != index)) h = h->next;
  pthread_mutex_unlock(&s->mu);
  return h; /* shards live until the server stops */
}

static void hosted_free(hosted *h) {
  if (!h) return;
  for (uint32_t i = 0; i < h->num_targets; i++)
    if (h->target_fd[i] >= 0) close(h->target_fd[i]);
  ps_shard_destroy(h->shard);
  ps_clocks_destroy(h->clocks);
  common_free(h->last_seq);
  fl_buf_free(&h->forward_reply);
  pthread_mutex_destroy(&h->mu);
  common_free(h);
}

static bool spec_equal(const ps_table_spec *a, const ps_table_spec *b) {
  return a->sparse == b->sparse && a->keys == b->keys && a->width == b->width && a->update.kind == b->update.kind &&
         a->update.lr == b->update.lr && a->update.beta1 == b->update.beta1 && a->update.beta2 == b->update.beta2 &&
         a->update.eps == b->update.eps;
}

static fl_status host_shard(ps_server *s, uint32_t table, const ps_host_request *req, bool as_backup) {
  if (req->workers < 1 || req->workers > 1u << 20)
    return fl_set_error(FL_EINVAL, "parameter server: table %u: %u workers", table, req->workers);
  pthread_mutex_lock(&s->mu);
  hosted *h = s->tables;
  while (h && (h->table != table || h->index != req->index)) h = h->next;
  fl_status st = FL_OK;
  bool dropped_here = false;
  if (h) {
    pthread_mutex_lock(&h->mu);
    dropped_here = h->shard == NULL;
    bool same = !dropped_here && spec_equal(ps_shard_spec(h->shard), &req->spec);
    pthread_mutex_unlock(&h->mu);
    if (dropped_here) h = NULL; /* a new entry goes in front of the dropped one: finds see the new one */
    else if (!same || h->shards != req->shards || h->workers != req->workers)
      st = fl_set_error(FL_EEXIST, "parameter server: table %u shard %u is already hosted here with another spec",
                        table, req->index);
  }
  if (h) {
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  h = common_calloc(1, sizeof *h);
  if (!h) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (st == FL_OK) {
    h->table = table, h->index = req->index, h->shards = req->shards, h->workers = req->workers;
    h->primary = !as_backup;
    h->num_targets = req->num_targets;
    for (uint32_t i = 0; i < PS_MAX_BACKUPS; i++) {
      memcpy(h->targets[i], req->targets[i], PS_ADDRESS_MAX);
      h->target_fd[i] = -1;
    }
    pthread_mutex_init(&h->mu, NULL);
    st = ps_shard_create(&req->spec, req->shards, req->index, &h->shard);
  }
  if (st == FL_OK) st = ps_clocks_create(req->workers, &h->clocks);
  if (st == FL_OK && !(h->last_seq = common_calloc(req->workers, sizeof *h->last_seq)))
    st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (st == FL_OK) {
    h->next = s->tables;
    s->tables = h;
  } else if (h) {
    hosted_free(h);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

static fl_status dropped(const ps_frame *f) {
  return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u was dropped", f->table, f->shard);
}

/* One request to another server and its answer's status (a primary to its backup). */
static fl_status exchange_with(int fd, ps_server *s, const ps_frame *f, const fl_buf *payload, const char *peer,
                               fl_buf *reply) {
  ps_frame r;
  fl_status st = ps_wire_send(fd, f, payload->data, payload->len, NULL, 0, ps_wire_deadline(s->timeout_ms), peer);
  if (st == FL_OK)
    st = ps_wire_recv(fd, &r, reply, PS_WIRE_MESSAGE_MAX, ps_wire_deadline(s->timeout_ms), s->timeout_ms, peer, NULL);
  if (st == FL_OK && r.status != FL_OK)
    st = fl_set_error((fl_status)r.status, "%.*s", (int)reply->len, (const char *)reply->data);
  return st;
}

/* ---- forwarding to the targets (under h->mu) ---- */

static fl_status hello(int fd, const char *secret, uint32_t timeout_ms, const char *peer, fl_buf *scratch) {
  ps_frame f = {.op = PS_OP_HELLO};
  size_t n = secret ? strlen(secret) : 0;
  fl_status st = ps_wire_send(fd, &f, secret, n, NULL, 0, ps_wire_deadline(timeout_ms), peer);
  ps_frame r;
  if (st == FL_OK) st = ps_wire_recv(fd, &r, scratch, PS_WIRE_MESSAGE_MAX, ps_wire_deadline(timeout_ms), timeout_ms, peer, NULL);
  if (st == FL_OK && r.status != FL_OK)
    st = fl_set_error((fl_status)r.status, "%.*s", (int)scratch->len, (const char *)scratch->data);
  return st;
}

static void close_targets(hosted *h) {
  for (uint32_t i = 0; i < h->num_targets; i++) {
    if (h->target_fd[i] >= 0) close(h->target_fd[i]);
    h->target_fd[i] = -1;
  }
}

static void drop_target(hosted *h, uint32_t i, const char *why) {
  common_log(LOG_WARN, "parameter server: table %u shard %u lost its replica %s (%s); going on without it",
             h->table, h->index, h->targets[i], why);
  if (h->target_fd[i] >= 0) close(h->target_fd[i]);
  for (uint32_t j = i; j + 1 < h->num_targets; j++) {
    memcpy(h->targets[j], h->targets[j + 1], PS_ADDRESS_MAX);
    h->target_fd[j] = h->target_fd[j + 1];
  }
  h->num_targets--;
  h->targets[h->num_targets][0] = 0;
  h->target_fd[h->num_targets] = -1;
}

static void forward(ps_server *s, hosted *h, const ps_frame *req, const fl_buf *payload) {
  ps_frame f = *req;
  f.op |= PS_OP_FORWARDED;
  for (uint32_t i = 0; i < h->num_targets;) {
    fl_status st = FL_OK;
    if (h->target_fd[i] < 0) {
      st = ps_wire_connect(h->targets[i], s->timeout_ms, &h->target_fd[i]);
      if (st == FL_OK) st = hello(h->target_fd[i], s->secret, s->timeout_ms, h->targets[i], &h->forward_reply);
    }
    if (st == FL_OK) st = exchange_with(h->target_fd[i], s, &f, payload, h->targets[i], &h->forward_reply);
    if (st != FL_OK) {
      drop_target(h, i, fl_last_error()); /* the next one moved to i */
      continue;
    }
    atomic_fetch_add(&s->forwards, 1);
    i++;
  }
}

/* A new replica after this one (the driver's recovery after a loss): under the shard's
 * mutex, so that no change slips between the copy and the first forward, the new backup is
 * made (HOST as a backup, with no targets) and adopts the whole replica state; then it is
 * one of this replica's targets. */
static fl_status replicate(ps_server *s, hosted *h, const ps_frame *f, const fl_buf *payload) {
  if (payload->len == 0 || payload->len >= PS_ADDRESS_MAX)
    return fl_set_error(FL_EPROTO, "parameter server: a replicate request without a backup address");
  char address[PS_ADDRESS_MAX];
  memcpy(address, payload->data, payload->len);
  address[payload->len] = 0;
  fl_buf body = FL_BUF_INIT;
  int fd = -1;
  pthread_mutex_lock(&h->mu);
  fl_status st = h->shard ? FL_OK : dropped(f);
  if (st == FL_OK && h->num_targets == PS_MAX_BACKUPS)
    st = fl_set_error(FL_ELIMIT, "parameter server: table %u shard %u has %d replicas after it already", h->table,
                      h->index, PS_MAX_BACKUPS);
  ps_host_request req = {.shards = h->shards, .index = h->index, .workers = h->workers};
  if (st == FL_OK) {
    req.spec = *ps_shard_spec(h->shard);
    st = ps_wire_host_encode(&req, &body);
  }
  if (st == FL_OK) st = ps_wire_connect(address, s->timeout_ms, &fd);
  if (st == FL_OK) st = hello(fd, s->secret, s->timeout_ms, address, &h->forward_reply);
  ps_frame host = {.op = PS_OP_HOST, .table = h->table, .shard = h->index, .arg = 1};
  if (st == FL_OK) st = exchange_with(fd, s, &host, &body, address, &h->forward_reply);
  if (st == FL_OK) {
    body.len = 0;
    st = ps_wire_replica_encode(h->shard, h->clocks, h->last_seq, h->workers, &body);
  }
  ps_frame adopt = {.op = PS_OP_ADOPT | PS_OP_FORWARDED, .table = h->table, .shard = h->index};
  if (st == FL_OK) st = exchange_with(fd, s, &adopt, &body, address, &h->forward_reply);
  if (st == FL_OK) {
    memcpy(h->targets[h->num_targets], address, PS_ADDRESS_MAX);
    h->target_fd[h->num_targets++] = fd;
    fd = -1;
    common_log(LOG_INFO, "parameter server: table %u shard %u is backed up on %s again", h->table, h->index, address);
  }
  pthread_mutex_unlock(&h->mu);
  if (fd >= 0) close(fd);
  fl_buf_free(&body);
  return st;
}

/* ---- requests ---- */

/* Checks a request's shard and role; *out the shard. */
static fl_status find(ps_server *s, const ps_frame *f, bool mutating, hosted **out) {
  hosted *h = hosted_find(s, f->table, f->shard);
  if (!h) return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u is not hosted here", f->table, f->shard);
  bool forwarded = (f->op & PS_OP_FORWARDED) != 0;
  if (forwarded != !h->primary && (mutating || !h->primary))
    return fl_set_error(FL_ESTATE, "parameter server: table %u shard %u is a %s here: a %s %s refused", f->table,
                        f->shard, h->primary ? "primary" : "backup", forwarded ? "forwarded" : "worker's",
                        ps_op_name(f->op));
  if (mutating && f->seq && f->worker >= h->workers)
    return fl_set_error(FL_EINVAL, "parameter server: worker %u of a table of %u workers", f->worker, h->workers);
  *out = h;
  return FL_OK;
}

static fl_status check_values(const ps_shard *sh, uint64_t count, size_t have, const char *what) {
  uint64_t width = ps_shard_spec(sh)->width;
  if (count > SIZE_MAX / 4 / width || have != count * width * 4)
    return fl_set_error(FL_EPROTO, "parameter server: a %s of %llu keys carries %zu bytes of values, not %llu", what,
                        (unsigned long long)count, have, (unsigned long long)(count * width * 4));
  return FL_OK;
}

/* A mutating request: apply once, forward, remember the seq. */
static fl_status apply(ps_server *s, hosted *h, const ps_frame *f, const fl_buf *payload,
                       uint64_t *clock) {
  uint8_t op = f->op & (uint8_t) ~PS_OP_FORWARDED;
  fl_status st = FL_OK;
  pthread_mutex_lock(&h->mu);
  if (!h->shard) {
    pthread_mutex_unlock(&h->mu);
    return dropped(f);
  }
  ps_shard *sh = h->shard;
  if (!h->shard) {
    pthread_mutex_unlock(&h->mu);
    return dropped(f);
  }
  if (f->seq && f->seq <= h->last_seq[f->worker]) { /* a resend of what this shard has applied */
    atomic_fetch_add(&s->duplicates, 1);
    forward(s, h, f, payload); /* a target the lost primary had not reached applies it now */
    *clock = ps_clocks_of(h->clocks, f->worker);
    pthread_mutex_unlock(&h->mu);
    return FL_OK;
  }
  uint64_t width = ps_shard_spec(sh)->width;
  switch (op) {
  case PS_OP_PUSH: {
    uint64_t n = f->arg;
    if (n > payload->len / 8 || (st = check_values(sh, n, payload->len - n * 8, "push")) != FL_OK) {
      if (st == FL_OK) st = fl_set_error(FL_EPROTO, "parameter server: a push of %llu keys in %zu bytes",
                                         (unsigned long long)n, payload->len);
      break;
    }
    /* The keys come first, 8-byte aligned in the payload buffer. */
    st = ps_shard_push(sh, (const uint64_t *)payload->data, (size_t)n, (const float *)(payload->data + n * 8));
    atomic_fetch_add(&s->pushes, 1);
    break;
  }
  case PS_OP_PUSH_RANGE:
  case PS_OP_SET_RANGE: {
    uint64_t count = payload->len / 4 / width;
    st = check_values(sh, count, payload->len, op == PS_OP_PUSH_RANGE ? "push" : "set");
    if (st == FL_OK && op == PS_OP_PUSH_RANGE)
      st = ps_shard_push_range(sh, f->arg, count, (const float *)payload->data);
    else if (st == FL_OK)
      st = ps_shard_set_range(sh, f->arg, count, (const float *)payload->data);
    atomic_fetch_add(&s->pushes, 1);
    break;
  }
  case PS_OP_COLUMN: {
    ps_column_op c;
    st = ps_wire_column_decode(fl_buf_bytes(payload), &c);
    if (st != FL_OK) break;
    bool carries = c.kind == PS_COLUMN_PUSH || c.kind == PS_COLUMN_SET;
    size_t values = payload->len - PS_WIRE_COLUMN_BYTES;
    if (!ps_column_mutates(c.kind) || (carries ? c.count > values / 4 || values != c.count * 4 : values != 0)) {
      st = fl_set_error(FL_EPROTO, "parameter server: a column %s of %llu keys carries %zu bytes of values",
                        ps_column_name(c.kind), (unsigned long long)c.count, values);
      break;
    }
    st = ps_shard_column(sh, &c, carries ? (const float *)(payload->data + PS_WIRE_COLUMN_BYTES) : NULL, NULL, NULL);
    atomic_fetch_add(&s->pushes, 1);
    break;
  }
  case PS_OP_CLOCK: st = ps_clocks_advance(h->clocks, f->worker, NULL); break;
  case PS_OP_RETIRE: st = ps_clocks_retire(h->clocks, f->worker); break;
  case PS_OP_LOAD: st = ps_shard_decode(sh, fl_buf_bytes(payload)); break;
  case PS_OP_ADOPT: st = ps_wire_replica_adopt(fl_buf_bytes(payload), sh, h->clocks, h->last_seq, h->workers); break;
  default: st = fl_set_error(FL_EPROTO, "parameter server: %s is not a change", ps_op_name(f->op));
  }
  if (st == FL_OK) {
    forward(s, h, f, payload);
    if (f->seq) h->last_seq[f->worker] = f->seq;
  }
  *clock = f->worker < h->workers ? ps_clocks_of(h->clocks, f->worker) : 0;
  pthread_mutex_unlock(&h->mu);
  return st;
}

static fl_status read_values(ps_server *s, hosted *h, const ps_frame *f, const fl_buf *payload,
                             fl_buf *out, uint64_t *fresh) {
  uint8_t op = f->op;
  pthread_mutex_lock(&h->mu);
  ps_shard *sh = h->shard; /* read under the lock only: a drop may free it once it is released */
  uint64_t width = sh ? ps_shard_spec(sh)->width : 1, n;
  bool sparse = sh && ps_shard_spec(sh)->sparse;
  pthread_mutex_unlock(&h->mu);
  if (!sh) return dropped(f);
  fl_status st = FL_OK;
  const uint64_t *k = NULL; /* NULL: the range [f->arg, f->arg + n) */
  if (op == PS_OP_PULL) {
    n = payload->len / 8;
    if (payload->len % 8 || n != f->arg)
      return fl_set_error(FL_EPROTO, "parameter server: a pull of %llu keys in %zu bytes", (unsigned long long)f->arg,
                          payload->len);
    k = (const uint64_t *)payload->data;
  } else {
    if (payload->len != 8) return fl_set_error(FL_EPROTO, "parameter server: a range pull without its count");
    n = common_get_u64(payload->data);
    if (sparse) return fl_set_error(FL_EINVAL, "parameter server: a range of a sparse table");
  }
  if (n > (s->max_message / 4) / width)
    return fl_set_error(FL_ELIMIT, "parameter server: a pull of %llu keys would answer over the limit of %llu bytes",
                        (unsigned long long)n, (unsigned long long)s->max_message);
  /* Consistency first: the read waits, without the shard's mutex, for the slowest worker. */
  st = ps_clocks_wait(h->clocks, f->clock, f->staleness, s->timeout_ms, fresh);
  if (st != FL_OK) return st;
  out->len = 0;
  if (fl_buf_reserve(out, n * width * 4) != FL_OK) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  pthread_mutex_lock(&h->mu);
  st = !h->shard ? dropped(f)
       : k        ? ps_shard_pull(sh, k, (size_t)n, (float *)out->data)
                  : ps_shard_pull_range(sh, f->arg, n, (float *)out->data);
  pthread_mutex_unlock(&h->mu);
  if (st == FL_OK) out->len = n * width * 4;
  atomic_fetch_add(&s->pulls, 1);
  return st;
}

/* A column read (PULL, DOT): waits on the clocks as a pull does, then answers the values or
 * the partial sum (8 bytes). */
static fl_status read_column(ps_server *s, hosted *h, const ps_frame *f, const ps_column_op *c, size_t extra,
                             fl_buf *out, uint64_t *fresh) {
  if (extra != 0)
    return fl_set_error(FL_EPROTO, "parameter server: a column %s carries %zu bytes of values", ps_column_name(c->kind),
                        extra);
  if (c->kind == PS_COLUMN_PULL && c->count > s->max_message / 4)
    return fl_set_error(FL_ELIMIT, "parameter server: a column pull of %llu keys would answer over the limit of %llu bytes",
                        (unsigned long long)c->count, (unsigned long long)s->max_message);
  fl_status st = ps_clocks_wait(h->clocks, f->clock, f->staleness, s->timeout_ms, fresh);
  if (st != FL_OK) return st;
  size_t bytes = c->kind == PS_COLUMN_PULL ? (size_t)c->count * 4 : 8;
  out->len = 0;
  if (fl_buf_reserve(out, bytes) != FL_OK) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  double dot = 0;
  pthread_mutex_lock(&h->mu);
  st = h->shard ? ps_shard_column(h->shard, c, NULL, (float *)out->data, &dot) : dropped(f);
  pthread_mutex_unlock(&h->mu);
  if (st != FL_OK) return st;
  if (c->kind == PS_COLUMN_DOT) memcpy(out->data, &dot, 8);
  out->len = bytes;
  atomic_fetch_add(&s->pulls, 1);
  return FL_OK;
}

/* Serves one request; the answer's payload goes to *out, its clock to *clock. */
static fl_status serve(ps_server *s, const ps_frame *f, const fl_buf *payload, fl_buf *out,
                       uint64_t *clock) {
  uint8_t op = f->op & (uint8_t) ~PS_OP_FORWARDED;
  hosted *h = NULL;
  fl_status st;
  switch (op) {
  case PS_OP_HOST: {
    ps_host_request req;
    st = ps_wire_host_decode(fl_buf_bytes(payload), &req);
    if (st == FL_OK) st = ps_table_spec_check(&req.spec);
    if (st == FL_OK && (req.shards < 1 || req.index >= req.shards))
      st = fl_set_error(FL_EINVAL, "parameter server: shard %u of %u", req.index, req.shards);
    return st == FL_OK ? host_shard(s, f->table, &req, f->arg == 1) : st;
  }
  case PS_OP_PULL:
  case PS_OP_PULL_RANGE:
    if ((st = find(s, f, false, &h)) != FL_OK) return st;
    return read_values(s, h, f, payload, out, clock);
  case PS_OP_COLUMN: {
    ps_column_op c;
    if ((st = ps_wire_column_decode(fl_buf_bytes(payload), &c)) != FL_OK) return st;
    bool mutating = ps_column_mutates(c.kind);
    if ((st = find(s, f, mutating, &h)) != FL_OK) return st;
    if (mutating) return apply(s, h, f, payload, clock);
    return read_column(s, h, f, &c, payload->len - PS_WIRE_COLUMN_BYTES, out, clock);
  }
  case PS_OP_SAVE:
    if ((st = find(s, f, false, &h)) != FL_OK) return st;
    pthread_mutex_lock(&h->mu);
    st = h->shard ? ps_shard_encode(h->shard, out) : dropped(f);
    pthread_mutex_unlock(&h->mu);
    return st;
  case PS_OP_DROP:
    if ((h = hosted_find(s, f->table, f->shard)) == NULL) return FL_OK; /* never hosted or gone: done */
    pthread_mutex_lock(&h->mu);
    ps_clocks_close(h->clocks); /* pulls waiting on it end */
    ps_shard_destroy(h->shard);
    h->shard = NULL;
    close_targets(h);
    h->num_targets = 0;
    pthread_mutex_unlock(&h->mu);
    return FL_OK;
  case PS_OP_TARGETS: {
    if ((h = hosted_find(s, f->table, f->shard)) == NULL)
      return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u is not hosted here", f->table, f->shard);
    char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
    uint32_t n;
    size_t used;
    st = ps_wire_targets_decode(fl_buf_bytes(payload), targets, &n, &used);
    if (st == FL_OK && used != payload->len) st = fl_set_error(FL_EPROTO, "parameter server: a target list has trailing bytes");
    if (st != FL_OK) return st;
    pthread_mutex_lock(&h->mu);
    close_targets(h);
    h->num_targets = n;
    memcpy(h->targets, targets, sizeof targets);
    pthread_mutex_unlock(&h->mu);
    return FL_OK;
  }
  case PS_OP_REPLICATE: /* to a primary-backup's primary, or to a chain's last replica */
    if ((h = hosted_find(s, f->table, f->shard)) == NULL)
      return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u is not hosted here", f->table, f->shard);
    return replicate(s, h, f, payload);
  case PS_OP_WHERE: /* the replicas this one forwards to: a client keeps its places current */
    if ((h = hosted_find(s, f->table, f->shard)) == NULL)
      return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u is not hosted here", f->table, f->shard);
    pthread_mutex_lock(&h->mu);
    st = ps_wire_targets_encode((const char(*)[PS_ADDRESS_MAX])h->targets, h->num_targets, out);
    pthread_mutex_unlock(&h->mu);
    return st;
  case PS_OP_CLOCK_OF:
    if ((st = find(s, f, false, &h)) != FL_OK) return st;
    if (f->worker >= h->workers)
      return fl_set_error(FL_EINVAL, "parameter server: worker %u of a table of %u workers", f->worker, h->workers);
    /* The clock, and the last change it applied of the worker: a worker opened again (its
     * task retried) numbers its changes on from there, or they would read as resends. */
    pthread_mutex_lock(&h->mu);
    *clock = ps_clocks_of(h->clocks, f->worker);
    uint8_t last[8];
    common_put_u64(last, h->last_seq[f->worker]);
    pthread_mutex_unlock(&h->mu);
    return fl_buf_append(out, last, 8) == FL_OK ? FL_OK : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  case PS_OP_CLOCKS: { /* every worker's clock (the web UI's live view), bounded */
    if ((st = find(s, f, false, &h)) != FL_OK) return st;
    pthread_mutex_lock(&h->mu);
    uint32_t n = h->workers < PS_WIRE_CLOCKS_MAX ? h->workers : PS_WIRE_CLOCKS_MAX;
    st = fl_buf_reserve(out, 8 + (size_t)n * 8);
    if (st == FL_OK) {
      common_put_u32(out->data + out->len, n);
      common_put_u32(out->data + out->len + 4, 0);
      for (uint32_t w = 0; w < n; w++) {
        bool retired = false;
        uint64_t c = ps_clocks_state(h->clocks, w, &retired);
        common_put_u64(out->data + out->len + 8 + (size_t)w * 8, retired ? UINT64_MAX : c);
      }
      out->len += 8 + (size_t)n * 8;
    }
    pthread_mutex_unlock(&h->mu);
    return st == FL_OK ? FL_OK : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  case PS_OP_PROMOTE: {
    h = hosted_find(s, f->table, f->shard);
    if (!h) return fl_set_error(FL_ENOENT, "parameter server: table %u shard %u is not hosted here", f->table, f->shard);
    /* With a target list (primary-backup: the backups after it), it forwards to those. */
    char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
    uint32_t n = 0;
    size_t used = 0;
    if (payload->len) {
      fl_status st2 = ps_wire_targets_decode(fl_buf_bytes(payload), targets, &n, &used);
      if (st2 == FL_OK && used != payload->len)
        st2 = fl_set_error(FL_EPROTO, "parameter server: a target list has trailing bytes");
      if (st2 != FL_OK) return st2;
    }
    pthread_mutex_lock(&h->mu);
    bool first = !h->primary;
    if (first)
      common_log(LOG_INFO, "parameter server: table %u shard %u: the backup becomes the primary", f->table,
                 f->shard);
    h->primary = true;
    /* Only the promotion that makes it primary sets its targets: a client with an older map
     * must not undo the backups the driver has given it since (TARGETS does that). */
    if (payload->len && first) {
      close_targets(h);
      h->num_targets = n;
      memcpy(h->targets, targets, sizeof targets);
    }
    pthread_mutex_unlock(&h->mu);
    return FL_OK;
  }
  default:
    if ((st = find(s, f, true, &h)) != FL_OK) return st;
    return apply(s, h, f, payload, clock);
  }
}

static void *conn_main(void *arg) {
  conn *c = arg;
  ps_server *s = c->server;
  fl_buf payload = FL_BUF_INIT, out = FL_BUF_INIT;
  bool authed = !s->secret;
  for (;;) {
    ps_frame f;
    bool eof = false;
    fl_status st = ps_wire_recv(c->fd, &f, &payload, s->max_message, 0, s->timeout_ms, c->peer, &eof);
    if (st == FL_ENET || st == FL_ETIMEDOUT || atomic_load(&s->stopping)) {
      if (!eof && !atomic_load(&s->stopping)) common_log(LOG_DEBUG, "%s", fl_last_error());
      break;
    }
    bool close_after = st != FL_OK; /* a malformed or oversized frame: the stream cannot go on */
    if (st == FL_EPROTO) f = (ps_frame){.op = PS_OP_HELLO}; /* the header itself was bad */
    uint64_t clock = 0;
    out.len = 0;
    if (st == FL_OK) {
      atomic_fetch_add(&s->requests, 1);
      atomic_fetch_add(&s->bytes_in, PS_WIRE_HEADER + payload.len);
      if (!authed) {
        authed = f.op == PS_OP_HELLO && payload.len == strlen(s->secret) &&
                 memcmp(payload.data, s->secret, payload.len) == 0;
        if (!authed) st = fl_set_error(FL_EAUTH, "parameter server: the connection's secret is missing or wrong");
        close_after = !authed;
      } else if (f.op != PS_OP_HELLO) {
        st = serve(s, &f, &payload, &out, &clock);
      }
    }
    ps_frame r = {.op = (uint8_t)(f.op | PS_OP_REPLY), .status = (uint16_t)st, .table = f.table, .shard = f.shard,
                  .worker = f.worker, .seq = f.seq, .clock = clock};
    const void *body = out.data;
    size_t blen = out.len;
    if (st != FL_OK) {
      body = fl_last_error();
      blen = strnlen(body, PS_WIRE_MESSAGE_MAX);
    }
    st = ps_wire_send(c->fd, &r, body, blen, NULL, 0, ps_wire_deadline(s->timeout_ms), c->peer);
    atomic_fetch_add(&s->bytes_out, PS_WIRE_HEADER + blen);
    if (st != FL_OK || close_after) break;
    if (payload.cap > ((size_t)64 << 20)) fl_buf_free(&payload); /* do not keep a huge push's buffer idle */
    if (out.cap > ((size_t)64 << 20)) fl_buf_free(&out);
  }
  fl_buf_free(&payload);
  fl_buf_free(&out);
  shutdown(c->fd, SHUT_RDWR);
  atomic_store(&c->done, true);
  return NULL;
}

static void reap(ps_server *s, bool all) {
  conn **p = &s->conns;
  while (*p) {
    conn *c = *p;
    if (all) shutdown(c->fd, SHUT_RDWR);
    if (all || atomic_load(&c->done)) {
      pthread_join(c->thread, NULL);
      close(c->fd);
      *p = c->next;
      common_free(c);
    } else {
      p = &c->next;
    }
  }
}

static void *accept_main(void *arg) {
  ps_server *s = arg;
  while (!atomic_load(&s->stopping)) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (atomic_load(&s->stopping)) break;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        common_log(LOG_WARN, "parameter server: accept: %s", strerror(errno));
        usleep(100000);
        continue;
      }
      break;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn *c = common_calloc(1, sizeof *c);
    pthread_mutex_lock(&s->mu);
    reap(s, false);
    if (c) {
      c->server = s, c->fd = fd;
      snprintf(c->peer, sizeof c->peer, "client of port %d", s->port);
      if (pthread_create(&c->thread, NULL, conn_main, c) == 0) {
        c->next = s->conns;
        s->conns = c;
        c = NULL, fd = -1;
      }
    }
    pthread_mutex_unlock(&s->mu);
    if (fd >= 0) {
      common_log(LOG_WARN, "parameter server: no memory or thread for a connection; closed");
      close(fd);
      common_free(c);
    }
  }
  return NULL;
}

fl_status ps_server_start(const char *host, int port, const ps_server_options *options, ps_server **out) {
  ps_server_options o = PS_SERVER_OPTIONS_INIT;
  if (options) o = *options;
  ps_server *s = common_calloc(1, sizeof *s);
  if (!s) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  s->listen_fd = -1;
  s->max_message = o.max_message ? o.max_message : PS_MESSAGE_MAX_DEFAULT;
  s->timeout_ms = o.timeout_ms ? o.timeout_ms : DEFAULT_TIMEOUT_MS;
  if (o.secret && o.secret[0] && !(s->secret = common_strdup(o.secret))) {
    common_free(s);
    return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  pthread_mutex_init(&s->mu, NULL);
  fl_status st = ps_wire_listen(host, port, &s->listen_fd, &s->port);
  if (st == FL_OK && pthread_create(&s->acceptor, NULL, accept_main, s) != 0)
    st = FL_ERR(FL_EINTERNAL, "parameter server: cannot start its acceptor thread");
  if (st != FL_OK) {
    if (s->listen_fd >= 0) close(s->listen_fd);
    pthread_mutex_destroy(&s->mu);
    common_free(s->secret);
    common_free(s);
    return st;
  }
  *out = s;
  return FL_OK;
}

int ps_server_port(const ps_server *s) { return s->port; }

ps_server_stats ps_server_stats_get(ps_server *s) {
  return (ps_server_stats){atomic_load(&s->requests), atomic_load(&s->pushes), atomic_load(&s->pulls),
                           atomic_load(&s->forwards), atomic_load(&s->duplicates), atomic_load(&s->bytes_in),
                           atomic_load(&s->bytes_out)};
}

void ps_server_stop(ps_server *s) {
  if (!s) return;
  atomic_store(&s->stopping, true);
  shutdown(s->listen_fd, SHUT_RDWR); /* wakes accept() */
  pthread_join(s->acceptor, NULL);
  close(s->listen_fd);
  pthread_mutex_lock(&s->mu);
  for (hosted *h = s->tables; h; h = h->next) ps_clocks_close(h->clocks); /* pulls waiting on clocks end */
  pthread_mutex_unlock(&s->mu);
  reap(s, true);
  while (s->tables) {
    hosted *h = s->tables;
    s->tables = h->next;
    hosted_free(h);
  }
  pthread_mutex_destroy(&s->mu);
  common_free(s->secret);
  common_free(s);
}
