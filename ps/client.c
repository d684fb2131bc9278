/*
 * ps/client.c: a worker's client of one parameter-server table (ps/ps.h), as ps-lite's
 * KVWorker: push, pull and their range forms return a ticket at once, and wait(ticket)
 * blocks until every shard has answered.
 *
 * Design. The client has a channel per shard: a connection and a thread that sends the
 * channel's queued parts one after another and reads each answer, so a worker's requests
 * reach a shard in the order made (a clock end after the pushes before it) while the shards
 * work in parallel. An operation splits into parts, one per shard it touches; keyed batches
 * are copied per shard into the operation's own buffer, ranges point into the caller's.
 *
 * Faults. A channel that loses its primary (the connection fails or closes) promotes the
 * shard's first backup that answers and sends the part again, with the same sequence number, so the backup
 * skips what it already applied as a forward.
 *
 * Threading: the calls may come from any one thread at a time (a worker); the channel
 * threads touch only their parts and the operation's counters.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ps/wire.h"

#define DEFAULT_TIMEOUT_MS 30000u
#define TABLE_FILE_MAGIC "FLNTPSTB"

typedef struct op op;

typedef struct part {
  common_qnode node; /* first: the channel's queue holds parts */
  op *op;
  uint32_t shard;
  ps_frame f;
  const void *a, *b; /* the payload's two pieces */
  size_t alen, blen;
  float *out;               /* pulls: the values' destination (ranges) */
  const uint64_t *scatter;  /* keyed pulls: each answer row's row in the caller's out */
  size_t rows;              /* the rows the answer must carry */
  fl_buf *blob;             /* save: the answer's bytes */
  uint8_t column;           /* COLUMN: its ps_column_kind */
  bool fixed_seq;           /* the caller numbered it (a once-push): the channel does not */
  double partial;           /* column DOT: this shard's sum */
  uint8_t desc[PS_WIRE_COLUMN_BYTES]; /* COLUMN: the descriptor sent */
} part;

struct op {
  uint64_t ticket;
  atomic_uint pending;
  pthread_mutex_t mu; /* status, message, fresh */
  fl_status status;
  char message[PS_WIRE_MESSAGE_MAX + 1];
  uint64_t fresh;
  double *dot; /* column DOT: the caller's, written by the wait (the parts' sums, in shard order) */
  common_event done;
  fl_buf owned; /* keyed batches' per-shard copies */
  part *parts;
  uint32_t nparts;
  op *next;
};

typedef struct channel {
  struct ps_client *client;
  uint32_t shard;
  common_queue q;
  pthread_t thread;
  int fd;
  uint32_t member; /* whom it talks to: 0 the primary, i the place's backup i - 1 */
  uint64_t refreshed_ns; /* when the place was last asked of the replicas (refresh_place) */
  char address[PS_ADDRESS_MAX];
  uint64_t seq;
  fl_buf reply;
} channel;

struct ps_client {
  ps_map map;
  uint32_t worker, staleness, timeout_ms;
  char *secret;
  uint64_t clock; /* the clock ends sent */
  uint64_t next_ticket;
  pthread_mutex_t mu; /* ops */
  op *ops;
  channel *channels;
  atomic_uint_fast64_t bytes_sent, bytes_received, failovers;
};

/* ---- channels ---- */

static void op_fail(op *o, fl_status st, const char *message) {
  pthread_mutex_lock(&o->mu);
  if (o->status == FL_OK) {
    o->status = st;
    snprintf(o->message, sizeof o->message, "%s", message);
  }
  pthread_mutex_unlock(&o->mu);
}

static void part_end(part *p) {
  op *o = p->op;
  if (atomic_fetch_sub(&o->pending, 1) == 1) common_event_set(&o->done);
}

static fl_status channel_connect(channel *ch) {
  ps_client *c = ch->client;
  fl_status st = ps_wire_connect(ch->address, c->timeout_ms, &ch->fd);
  if (st != FL_OK) return st;
  if (!c->secret) return FL_OK;
  ps_frame f = {.op = PS_OP_HELLO}, r;
  st = ps_wire_send(ch->fd, &f, c->secret, strlen(c->secret), NULL, 0, ps_wire_deadline(c->timeout_ms), ch->address);
  if (st == FL_OK)
    st = ps_wire_recv(ch->fd, &r, &ch->reply, PS_WIRE_MESSAGE_MAX, ps_wire_deadline(c->timeout_ms), c->timeout_ms,
                      ch->address, NULL);
  if (st == FL_OK && r.status != FL_OK)
    st = fl_set_error((fl_status)r.status, "%.*s", (int)ch->reply.len, (const char *)ch->reply.data);
  if (st != FL_OK) close(ch->fd), ch->fd = -1;
  return st;
}

/* One request and its answer on the channel's connection. Transport failures are
 * returned; the server's own answer (any status) is FL_OK with *r filled. */
static fl_status exchange(channel *ch, part *p, ps_frame *r) {
  ps_client *c = ch->client;
  fl_status st = FL_OK;
  if (ch->fd < 0 && (st = channel_connect(ch)) != FL_OK) return st;
  /* A pull may wait for slower workers on the server, up to the server's own timeout: the
   * client allows that and its own on top. */
  uint32_t wait_ms = c->timeout_ms * 2;
  st = ps_wire_send(ch->fd, &p->f, p->a, p->alen, p->b, p->blen, ps_wire_deadline(c->timeout_ms), ch->address);
  fl_status sent = st;
  /* A server that refuses a frame (too large) answers and closes before reading it all: read
   * the answer even when the send failed, to give its reason. */
  st = ps_wire_recv(ch->fd, r, &ch->reply, PS_MESSAGE_MAX_DEFAULT + PS_WIRE_HEADER,
                    ps_wire_deadline(sent == FL_OK ? wait_ms : 1000), c->timeout_ms, ch->address, NULL);
  if (st == FL_OK && sent != FL_OK && r->status == FL_OK) st = sent;
  if (st != FL_OK) {
    close(ch->fd);
    ch->fd = -1;
    return sent != FL_OK && st == FL_ENET ? sent : st;
  }
  atomic_fetch_add(&c->bytes_sent, PS_WIRE_HEADER + p->alen + p->blen);
  atomic_fetch_add(&c->bytes_received, PS_WIRE_HEADER + ch->reply.len);
  if ((r->op & ~PS_OP_REPLY) != p->f.op || r->seq != p->f.seq) {
    close(ch->fd);
    ch->fd = -1;
    return fl_set_error(FL_EPROTO, "parameter server %s: an answer to another request", ch->address);
  }
  /* The server closes a connection after refusing a frame: the next request dials anew. */
  if (r->status == FL_EPROTO || r->status == FL_ELIMIT || r->status == FL_ECORRUPT || r->status == FL_EAUTH) {
    close(ch->fd);
    ch->fd = -1;
  }
  return FL_OK;
}

/* The next backup takes over: PROMOTE (primary-backup: with the backups after it as its
 * targets; a chain's replica keeps its own), then this channel talks to it. FL_ENET when no
 * backup is left. */
static fl_status fail_over(channel *ch) {
  ps_client *c = ch->client;
  const ps_place *pl = &c->map.places[ch->shard];
  uint32_t backups = ps_place_backups(pl);
  fl_status st = FL_ENET;
  while (st == FL_ENET && ch->member < backups) {
    const char *next = pl->backups[ch->member];
    common_log(LOG_WARN, "parameter server: table %u shard %u: %s lost (%s); promoting backup %s", c->map.table,
               ch->shard, ch->address, fl_last_error(), next);
    ch->member++;
    snprintf(ch->address, sizeof ch->address, "%s", next);
    fl_buf targets = FL_BUF_INIT;
    st = c->map.replication == PS_REPLICATION_PRIMARY_BACKUP
             ? ps_wire_targets_encode(pl->backups + ch->member, backups - ch->member, &targets)
             : FL_OK;
    part promote = {.f = {.op = PS_OP_PROMOTE, .table = c->map.table, .shard = ch->shard, .worker = c->worker},
                    .a = targets.data, .alen = targets.len};
    ps_frame r;
    if (st == FL_OK) st = exchange(ch, &promote, &r);
    if (st == FL_OK && r.status != FL_OK)
      st = fl_set_error((fl_status)r.status, "%.*s", (int)ch->reply.len, (const char *)ch->reply.data);
    fl_buf_free(&targets);
  }
  if (st == FL_OK) atomic_fetch_add(&c->failovers, 1);
  return st;
}

static void take_answer(channel *ch, part *p, const ps_frame *r) {
  op *o = p->op;
  ps_client *c = ch->client;
  if (r->status != FL_OK) {
    char msg[PS_WIRE_MESSAGE_MAX + 1];
    size_t n = ch->reply.len < PS_WIRE_MESSAGE_MAX ? ch->reply.len : PS_WIRE_MESSAGE_MAX;
    memcpy(msg, ch->reply.data, n);
    msg[n] = 0;
    op_fail(o, (fl_status)r->status, msg);
    return;
  }
  uint8_t op = p->f.op;
  if (op == PS_OP_PULL || op == PS_OP_PULL_RANGE) {
    size_t row = (size_t)c->map.spec.width * 4;
    if (ch->reply.len != p->rows * row) {
      op_fail(o, FL_EPROTO, "parameter server: a pull's answer has the wrong size");
      return;
    }
    if (p->scatter) {
      for (size_t i = 0; i < p->rows; i++) memcpy((uint8_t *)p->out + p->scatter[i] * row, ch->reply.data + i * row, row);
    } else {
      memcpy(p->out, ch->reply.data, ch->reply.len);
    }
    pthread_mutex_lock(&o->mu);
    if (r->clock < o->fresh) o->fresh = r->clock;
    pthread_mutex_unlock(&o->mu);
  } else if (op == PS_OP_COLUMN && (p->column == PS_COLUMN_PULL || p->column == PS_COLUMN_DOT)) {
    size_t want = p->column == PS_COLUMN_PULL ? p->rows * 4 : 8;
    if (ch->reply.len != want) {
      op_fail(o, FL_EPROTO, "parameter server: a column answer has the wrong size");
      return;
    }
    if (p->column == PS_COLUMN_PULL) memcpy(p->out, ch->reply.data, want);
    else memcpy(&p->partial, ch->reply.data, 8);
    pthread_mutex_lock(&o->mu);
    if (r->clock < o->fresh) o->fresh = r->clock;
    pthread_mutex_unlock(&o->mu);
  } else if (op == PS_OP_CLOCK_OF) {
    if (ch->reply.len != 8) {
      op_fail(o, FL_EPROTO, "parameter server: a clock-of answer of the wrong size");
      return;
    }
    uint64_t last = common_get_u64(ch->reply.data); /* numbered on past a lost attempt's changes */
    if (last > ch->seq) ch->seq = last;
    pthread_mutex_lock(&o->mu);
    if (r->clock < o->fresh) o->fresh = r->clock;
    pthread_mutex_unlock(&o->mu);
  } else if (op == PS_OP_SAVE) {
    if (fl_buf_append(p->blob, ch->reply.data, ch->reply.len) != FL_OK)
      op_fail(o, FL_ENOMEM, "parameter server: out of memory for a shard's state");
  }
}

static fl_status ask(const char *address, const char *secret, uint32_t timeout_ms, ps_frame *f, fl_bytes body,
                     fl_buf *answer);

/* The driver backs a shard up again after a loss, on replicas this client was not told of:
 * every REFRESH_NS a channel asks the replica it talks to (and, along a chain, the next ones)
 * whom they forward to, and takes that as its place, so that it survives later losses too.
 * A failed refresh changes nothing (the request that follows finds out what is wrong). */
#define REFRESH_NS 2000000000ull
static void refresh_place(channel *ch) {
  ps_client *c = ch->client;
  ps_place fresh;
  memset(&fresh, 0, sizeof fresh);
  snprintf(fresh.primary, sizeof fresh.primary, "%s", ch->address);
  const char *at = ch->address;
  uint32_t have = 0;
  fl_buf answer = FL_BUF_INIT;
  fl_status st = FL_OK;
  while (st == FL_OK && have < PS_MAX_BACKUPS) {
    ps_frame f = {.op = PS_OP_WHERE, .table = c->map.table, .shard = ch->shard};
    answer.len = 0;
    char targets[PS_MAX_BACKUPS][PS_ADDRESS_MAX];
    uint32_t n;
    size_t used;
    st = ask(at, c->secret, c->timeout_ms, &f, fl_bytes_of(NULL, 0), &answer);
    if (st == FL_OK) st = ps_wire_targets_decode(fl_buf_bytes(&answer), targets, &n, &used);
    if (st != FL_OK) break;
    for (uint32_t i = 0; i < n && have < PS_MAX_BACKUPS; i++) memcpy(fresh.backups[have++], targets[i], PS_ADDRESS_MAX);
    if (c->map.replication != PS_REPLICATION_CHAIN || n == 0) break;
    at = fresh.backups[have - 1];
  }
  fl_buf_free(&answer);
  if (st == FL_OK) {
    c->map.places[ch->shard] = fresh;
    ch->member = 0;
  }
  ch->refreshed_ns = common_now_ns();
}

static void *channel_main(void *arg) {
  channel *ch = arg;
  common_qnode *n;
  while ((n = common_queue_pop(&ch->q, 0)) != NULL) {
    part *p = (part *)n;
    if (common_now_ns() - ch->refreshed_ns > REFRESH_NS) refresh_place(ch);
    /* A worker's changes are numbered so that a resend applies once; a load (a table's
     * owner, not a worker) replaces the state wholesale, so a resend is harmless unnumbered. */
    bool numbered = p->f.op == PS_OP_PUSH || p->f.op == PS_OP_PUSH_RANGE || p->f.op == PS_OP_SET_RANGE ||
                    p->f.op == PS_OP_CLOCK || p->f.op == PS_OP_RETIRE ||
                    (p->f.op == PS_OP_COLUMN && ps_column_mutates((ps_column_kind)p->column));
    if (numbered && !p->fixed_seq) p->f.seq = ++ch->seq;
    ps_frame r;
    fl_status st = exchange(ch, p, &r);
    while (st == FL_ENET && fail_over(ch) == FL_OK) st = exchange(ch, p, &r);
    if (st != FL_OK)
      op_fail(p->op, st, fl_last_error());
    else
      take_answer(ch, p, &r);
    part_end(p);
  }
  return NULL;
}

/* ---- operations ---- */

static op *op_new(ps_client *c, uint32_t nparts) {
  op *o = common_calloc(1, sizeof *o);
  if (o && nparts && !(o->parts = common_calloc(nparts, sizeof *o->parts))) {
    common_free(o);
    o = NULL;
  }
  if (!o) return NULL;
  o->nparts = nparts;
  o->fresh = UINT64_MAX;
  pthread_mutex_init(&o->mu, NULL);
  common_event_init(&o->done);
  for (uint32_t i = 0; i < nparts; i++) {
    part *p = &o->parts[i];
    p->op = o;
    p->f.table = c->map.table;
    p->f.worker = c->worker;
  }
  return o;
}

static void op_free(op *o) {
  if (!o) return;
  fl_buf_free(&o->owned);
  common_free(o->parts);
  common_event_destroy(&o->done);
  pthread_mutex_destroy(&o->mu);
  common_free(o);
}

/* Queues the op's parts (those with a shard set; nparts of them) and returns its ticket. */
static fl_status op_submit(ps_client *c, op *o, uint64_t *ticket) {
  pthread_mutex_lock(&c->mu);
  o->ticket = ++c->next_ticket;
  o->next = c->ops;
  c->ops = o;
  pthread_mutex_unlock(&c->mu);
  atomic_store(&o->pending, o->nparts);
  if (o->nparts == 0) common_event_set(&o->done);
  for (uint32_t i = 0; i < o->nparts; i++) common_queue_push(&c->channels[o->parts[i].shard].q, &o->parts[i].node);
  if (ticket) *ticket = o->ticket;
  return FL_OK;
}

fl_status ps_client_wait(ps_client *c, uint64_t ticket, uint64_t *fresh) {
  pthread_mutex_lock(&c->mu);
  op **p = &c->ops;
  while (*p && (*p)->ticket != ticket) p = &(*p)->next;
  op *o = *p;
  if (o) *p = o->next;
  pthread_mutex_unlock(&c->mu);
  if (!o) return fl_set_error(FL_EINVAL, "parameter server: no operation with ticket %llu", (unsigned long long)ticket);
  common_event_wait(&o->done, 0);
  fl_status st = o->status;
  if (st != FL_OK) fl_set_error(st, "%s", o->message);
  if (st == FL_OK && fresh) *fresh = o->fresh;
  if (st == FL_OK && o->dot) {
    double sum = 0;
    for (uint32_t i = 0; i < o->nparts; i++) sum += o->parts[i].partial;
    *o->dot = sum;
  }
  op_free(o);
  return st;
}

static fl_status check_key(const ps_client *c, uint64_t key) {
  if (!c->map.spec.sparse && key >= c->map.spec.keys)
    return fl_set_error(FL_EINVAL, "parameter server: key %llu is outside table %u's %llu keys",
                        (unsigned long long)key, c->map.table, (unsigned long long)c->map.spec.keys);
  return FL_OK;
}

static fl_status check_size(uint64_t bytes, const char *what) {
  if (bytes > PS_MESSAGE_MAX_DEFAULT)
    return fl_set_error(FL_ELIMIT, "parameter server: a %s of %llu bytes to one shard is over the limit of %llu bytes",
                        what, (unsigned long long)bytes, (unsigned long long)PS_MESSAGE_MAX_DEFAULT);
  return FL_OK;
}

/* Keyed push (grads) or pull (out): per-shard copies of the keys (and gradients) in one
 * buffer, laid out shard after shard as [keys][values]; pulls keep each key's position. */
static fl_status keyed(ps_client *c, uint8_t opcode, const uint64_t *keys, size_t n, const float *grads, float *out,
                       uint64_t *ticket) {
  if (n && !keys) return fl_set_error(FL_EINVAL, "parameter server: NULL keys");
  uint32_t S = c->map.shards, width = c->map.spec.width;
  size_t row = (size_t)width * 4;
  size_t *count = common_calloc(S, sizeof *count), *at = common_calloc(S, sizeof *at);
  fl_status st = count && at ? FL_OK : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (size_t i = 0; st == FL_OK && i < n; i++) {
    if ((st = check_key(c, keys[i])) == FL_OK) count[ps_shard_of(&c->map.spec, S, keys[i])]++;
  }
  uint32_t nparts = 0;
  size_t total = 0;
  for (uint32_t s = 0; st == FL_OK && s < S; s++) {
    if (!count[s]) continue;
    nparts++;
    /* keys, then values (push) or each key's caller row (pull): 8-byte multiples, aligned */
    size_t bytes = count[s] * 8 + (opcode == PS_OP_PUSH ? (count[s] * row + 7) / 8 * 8 : count[s] * 8);
    st = check_size(count[s] * (8 + row), opcode == PS_OP_PUSH ? "push" : "pull");
    at[s] = total;
    total += bytes;
  }
  op *o = st == FL_OK ? op_new(c, nparts) : NULL;
  if (st == FL_OK && !o) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (st == FL_OK && fl_buf_reserve(&o->owned, total) != FL_OK) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (st == FL_OK) {
    uint8_t *base = o->owned.data;
    o->owned.len = total;
    size_t *filled = common_calloc(S, sizeof *filled);
    if (!filled) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
    for (size_t i = 0; st == FL_OK && i < n; i++) {
      uint32_t s = ps_shard_of(&c->map.spec, S, keys[i]);
      uint8_t *k = base + at[s], *v = k + count[s] * 8;
      memcpy(k + filled[s] * 8, &keys[i], 8);
      if (opcode == PS_OP_PUSH)
        memcpy(v + filled[s] * row, (const uint8_t *)grads + i * row, row);
      else
        ((uint64_t *)v)[filled[s]] = i;
      filled[s]++;
    }
    common_free(filled);
    for (uint32_t s = 0, j = 0; st == FL_OK && s < S; s++) {
      if (!count[s]) continue;
      part *p = &o->parts[j++];
      p->shard = s;
      p->f.op = opcode;
      p->f.shard = s;
      p->f.arg = count[s];
      p->f.clock = c->clock;
      p->f.staleness = c->staleness;
      p->a = base + at[s];
      p->alen = count[s] * 8;
      if (opcode == PS_OP_PUSH) {
        p->b = base + at[s] + count[s] * 8;
        p->blen = count[s] * row;
      } else {
        p->out = out;
        p->scatter = (const uint64_t *)(base + at[s] + count[s] * 8);
        p->rows = count[s];
      }
    }
  }
  common_free(count);
  common_free(at);
  if (st != FL_OK) {
    op_free(o);
    return st;
  }
  return op_submit(c, o, ticket);
}

fl_status ps_client_push(ps_client *c, const uint64_t *keys, size_t n, const float *grads, uint64_t *ticket) {
  if (n && !grads) return fl_set_error(FL_EINVAL, "parameter server: push without gradients");
  return keyed(c, PS_OP_PUSH, keys, n, grads, NULL, ticket);
}

fl_status ps_client_pull(ps_client *c, const uint64_t *keys, size_t n, float *out, uint64_t *ticket) {
  if (n && !out) return fl_set_error(FL_EINVAL, "parameter server: pull without an output");
  return keyed(c, PS_OP_PULL, keys, n, NULL, out, ticket);
}

/* A dense range: one part per shard whose key range meets [lo, lo + count). */
static fl_status ranged(ps_client *c, uint8_t opcode, uint64_t lo, uint64_t count, const float *in, float *out,
                        uint64_t *ticket) {
  const ps_table_spec *spec = &c->map.spec;
  if (spec->sparse) return fl_set_error(FL_EINVAL, "parameter server: table %u is sparse: ranges are for dense tables", c->map.table);
  if (count > spec->keys || lo > spec->keys - count)
    return fl_set_error(FL_EINVAL, "parameter server: keys [%llu, %llu) are outside table %u's %llu keys",
                        (unsigned long long)lo, (unsigned long long)(lo + count), c->map.table,
                        (unsigned long long)spec->keys);
  if (count && !(in || out)) return fl_set_error(FL_EINVAL, "parameter server: NULL values");
  uint32_t S = c->map.shards, first = count ? ps_shard_of(spec, S, lo) : 0;
  uint32_t last = count ? ps_shard_of(spec, S, lo + count - 1) : 0;
  uint32_t nparts = count ? last - first + 1 : 0;
  size_t row = (size_t)spec->width * 4;
  for (uint32_t s = first; nparts && s <= last; s++) {
    uint64_t a = ps_range_lo(spec, S, s), b = ps_range_lo(spec, S, s + 1);
    uint64_t from = a > lo ? a : lo, to = b < lo + count ? b : lo + count;
    fl_status st = check_size((to - from) * row, opcode == PS_OP_PULL_RANGE ? "pull" : "push");
    if (st != FL_OK) return st;
  }
  op *o = op_new(c, nparts);
  if (!o) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  /* The pulls' counts travel as their payload: kept in the op's buffer. */
  if (opcode == PS_OP_PULL_RANGE && fl_buf_reserve(&o->owned, (size_t)nparts * 8) != FL_OK) {
    op_free(o);
    return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  for (uint32_t j = 0; j < nparts; j++) {
    uint32_t s = first + j;
    uint64_t a = ps_range_lo(spec, S, s), b = ps_range_lo(spec, S, s + 1);
    uint64_t from = a > lo ? a : lo, to = b < lo + count ? b : lo + count;
    part *p = &o->parts[j];
    p->shard = s;
    p->f.op = opcode;
    p->f.shard = s;
    p->f.arg = from;
    p->f.clock = c->clock;
    p->f.staleness = c->staleness;
    if (opcode == PS_OP_PULL_RANGE) {
      uint64_t n = to - from;
      memcpy(o->owned.data + (size_t)j * 8, &n, 8);
      p->a = o->owned.data + (size_t)j * 8;
      p->alen = 8;
      p->out = (float *)((uint8_t *)out + (from - lo) * row);
      p->rows = (size_t)n;
    } else {
      p->a = (const uint8_t *)in + (from - lo) * row;
      p->alen = (to - from) * row;
    }
  }
  return op_submit(c, o, ticket);
}

fl_status ps_client_push_range(ps_client *c, uint64_t lo, uint64_t count, const float *grads, uint64_t *ticket) {
  return ranged(c, PS_OP_PUSH_RANGE, lo, count, grads, NULL, ticket);
}
fl_status ps_client_pull_range(ps_client *c, uint64_t lo, uint64_t count, float *out, uint64_t *ticket) {
  return ranged(c, PS_OP_PULL_RANGE, lo, count, NULL, out, ticket);
}
fl_status ps_client_set_range(ps_client *c, uint64_t lo, uint64_t count, const float *values, uint64_t *ticket) {
  return ranged(c, PS_OP_SET_RANGE, lo, count, values, NULL, ticket);
}

/* A column operation: one part per shard whose range meets [lo, lo + count), each with its
 * own descriptor; pushed and set values point into the caller's buffer. */
static fl_status columned(ps_client *c, const ps_column_op *req, const float *in, float *out, double *dot,
                          bool fixed_seq, uint64_t seq, uint64_t *ticket) {
  const ps_table_spec *spec = &c->map.spec;
  if (!req) return fl_set_error(FL_EINVAL, "parameter server: NULL column operation");
  fl_status st = ps_column_check(spec, req);
  if (st != FL_OK) return st;
  ps_column_op cop = *req;
  const char *name = ps_column_name(cop.kind);
  if (cop.count == PS_COLUMN_TO_END && cop.lo <= spec->keys) cop.count = spec->keys - cop.lo;
  if (cop.count > spec->keys || cop.lo > spec->keys - cop.count)
    return fl_set_error(FL_EINVAL, "parameter server column %s: keys [%llu, %llu) are outside table %u's %llu keys",
                        name, (unsigned long long)cop.lo, (unsigned long long)(cop.lo + cop.count), c->map.table,
                        (unsigned long long)spec->keys);
  bool carries = cop.kind == PS_COLUMN_PUSH || cop.kind == PS_COLUMN_SET;
  if (cop.count && ((carries && !in) || (cop.kind == PS_COLUMN_PULL && !out)))
    return fl_set_error(FL_EINVAL, "parameter server column %s: NULL values", name);
  if (cop.kind == PS_COLUMN_DOT && !dot) return fl_set_error(FL_EINVAL, "parameter server column dot: NULL result");
  if (fixed_seq && seq == 0) return fl_set_error(FL_EINVAL, "parameter server: a once-push needs a sequence number >= 1");
  uint32_t S = c->map.shards, first = cop.count ? ps_shard_of(spec, S, cop.lo) : 0;
  uint32_t last = cop.count ? ps_shard_of(spec, S, cop.lo + cop.count - 1) : 0;
  uint32_t nparts = cop.count ? last - first + 1 : 0;
  for (uint32_t s = first; nparts && s <= last; s++) {
    uint64_t a = ps_range_lo(spec, S, s), b = ps_range_lo(spec, S, s + 1);
    uint64_t from = a > cop.lo ? a : cop.lo, to = b < cop.lo + cop.count ? b : cop.lo + cop.count;
    if ((st = check_size((to - from) * 4 + PS_WIRE_COLUMN_BYTES, name)) != FL_OK) return st;
  }
  op *o = op_new(c, nparts);
  if (!o) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (cop.kind == PS_COLUMN_DOT) {
    o->dot = dot;
    *dot = 0; /* an empty range's sum, and what an unwaited or failed dot leaves */
  }
  for (uint32_t j = 0; j < nparts; j++) {
    uint32_t s = first + j;
    uint64_t a = ps_range_lo(spec, S, s), b = ps_range_lo(spec, S, s + 1);
    uint64_t from = a > cop.lo ? a : cop.lo, to = b < cop.lo + cop.count ? b : cop.lo + cop.count;
    part *p = &o->parts[j];
    ps_column_op piece = cop;
    piece.lo = from;
    piece.count = to - from;
    ps_wire_column_encode(&piece, p->desc);
    p->shard = s;
    p->column = (uint8_t)cop.kind;
    p->fixed_seq = fixed_seq;
    p->f.op = PS_OP_COLUMN;
    p->f.shard = s;
    p->f.seq = fixed_seq ? seq : 0;
    p->f.clock = c->clock;
    p->f.staleness = c->staleness;
    p->a = p->desc;
    p->alen = PS_WIRE_COLUMN_BYTES;
    if (carries) {
      p->b = in + (from - cop.lo);
      p->blen = (size_t)(to - from) * 4;
    } else if (cop.kind == PS_COLUMN_PULL) {
      p->out = out + (from - cop.lo);
      p->rows = (size_t)(to - from);
    }
  }
  return op_submit(c, o, ticket);
}

fl_status ps_client_column(ps_client *c, const ps_column_op *op, const float *in, float *out, double *dot,
                           uint64_t *ticket) {
  return columned(c, op, in, out, dot, false, 0, ticket);
}

fl_status ps_client_push_column_once(ps_client *c, uint32_t column, uint64_t lo, uint64_t count, const float *grads,
                                     uint64_t seq, uint64_t *ticket) {
  ps_column_op op = {.kind = PS_COLUMN_PUSH, .y = column, .lo = lo, .count = count};
  return columned(c, &op, grads, NULL, NULL, true, seq, ticket);
}

/* One part on every shard, without a payload (clock, retire, save). */
static fl_status everywhere(ps_client *c, uint8_t opcode, fl_buf *blobs, uint64_t *ticket) {
  op *o = op_new(c, c->map.shards);
  if (!o) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t s = 0; s < c->map.shards; s++) {
    o->parts[s].shard = s;
    o->parts[s].f.op = opcode;
    o->parts[s].f.shard = s;
    o->parts[s].blob = blobs ? &blobs[s] : NULL;
  }
  return op_submit(c, o, ticket);
}

fl_status ps_client_clock(ps_client *c, uint64_t *ticket) {
  fl_status st = everywhere(c, PS_OP_CLOCK, NULL, ticket);
  if (st == FL_OK) c->clock++;
  return st;
}

fl_status ps_client_retire(ps_client *c, uint64_t *ticket) { return everywhere(c, PS_OP_RETIRE, NULL, ticket); }

void ps_client_set_staleness(ps_client *c, uint32_t staleness) { c->staleness = staleness; }
uint64_t ps_client_clock_now(const ps_client *c) { return c->clock; }
uint32_t ps_client_worker(const ps_client *c) { return c->worker; }

ps_client_stats ps_client_stats_get(ps_client *c) {
  return (ps_client_stats){atomic_load(&c->bytes_sent), atomic_load(&c->bytes_received), atomic_load(&c->failovers)};
}

/* ---- checkpoints: "FLNTPSTB", u32 version 1, u32 table, u32 shards, u32 zero, then per
 * shard a u64 length and the shard's blob (each with its own CRC-32C) ---- */

fl_status ps_table_save(ps_client *c, const char *path) {
  uint32_t S = c->map.shards;
  fl_buf *blobs = common_calloc(S, sizeof *blobs);
  if (!blobs) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  uint64_t ticket;
  fl_status st = everywhere(c, PS_OP_SAVE, blobs, &ticket);
  if (st == FL_OK) st = ps_client_wait(c, ticket, NULL);
  FILE *f = st == FL_OK ? fopen(path, "wb") : NULL;
  if (st == FL_OK && !f) st = fl_set_error(FL_EIO, "parameter server: cannot write %s: %s", path, strerror(errno));
  if (f) {
    uint8_t head[24] = {0};
    memcpy(head, TABLE_FILE_MAGIC, 8);
    common_put_u32(head + 8, 1);
    common_put_u32(head + 12, c->map.table);
    common_put_u32(head + 16, S);
    bool ok = fwrite(head, sizeof head, 1, f) == 1;
    for (uint32_t s = 0; ok && s < S; s++) {
      uint8_t len[8];
      common_put_u64(len, blobs[s].len);
      ok = fwrite(len, 8, 1, f) == 1 && fwrite(blobs[s].data, 1, blobs[s].len, f) == blobs[s].len;
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) st = fl_set_error(FL_EIO, "parameter server: cannot write %s: %s", path, strerror(errno));
  }
  for (uint32_t s = 0; s < S; s++) fl_buf_free(&blobs[s]);
  common_free(blobs);
  return st;
}

fl_status ps_table_load(ps_client *c, const char *path) {
  fl_buf file = FL_BUF_INIT;
  fl_status st = common_read_file(path, &file);
  if (st != FL_OK) return st == FL_ENOENT ? fl_set_error(FL_ENOENT, "parameter server: no checkpoint %s", path) : st;
  uint32_t S = c->map.shards;
  op *o = NULL;
  if (file.len < 24 || memcmp(file.data, TABLE_FILE_MAGIC, 8) != 0 || common_get_u32(file.data + 8) != 1)
    st = fl_set_error(FL_EFORMAT, "parameter server: %s is not a table checkpoint", path);
  else if (common_get_u32(file.data + 16) != S)
    st = fl_set_error(FL_EINVAL, "parameter server: %s holds %u shards, the table has %u", path,
                      common_get_u32(file.data + 16), S);
  if (st == FL_OK && !(o = op_new(c, S))) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  size_t at = 24;
  for (uint32_t s = 0; st == FL_OK && s < S; s++) {
    uint64_t len = at + 8 <= file.len ? common_get_u64(file.data + at) : UINT64_MAX;
    if (len > file.len - at - 8) {
      st = fl_set_error(FL_EFORMAT, "parameter server: %s is cut short in shard %u", path, s);
      break;
    }
    part *p = &o->parts[s];
    p->shard = s;
    p->f.op = PS_OP_LOAD;
    p->f.shard = s;
    p->a = file.data + at + 8;
    p->alen = (size_t)len;
    at += 8 + (size_t)len;
  }
  if (st == FL_OK && at != file.len) st = fl_set_error(FL_EFORMAT, "parameter server: %s has bytes after its last shard", path);
  uint64_t ticket;
  if (st == FL_OK) {
    op_submit(c, o, &ticket);
    o = NULL;
    st = ps_client_wait(c, ticket, NULL);
    if (st != FL_OK) common_error_wrap(st, "loading %s: ", path);
  }
  op_free(o);
  fl_buf_free(&file);
  return st;
}

/* ---- tables and clients ---- */

/* One request on a connection of its own; the answer's payload goes to *answer (may be NULL). */
static fl_status ask(const char *address, const char *secret, uint32_t timeout_ms, ps_frame *f, fl_bytes body,
                     fl_buf *answer) {
  channel ch = {.fd = -1};
  ps_client tmp = {.secret = (char *)secret, .timeout_ms = timeout_ms};
  ch.client = &tmp;
  snprintf(ch.address, sizeof ch.address, "%s", address);
  part p = {.f = *f, .a = body.data, .alen = body.len};
  ps_frame r;
  fl_status st = exchange(&ch, &p, &r);
  if (st == FL_OK && r.status != FL_OK)
    st = fl_set_error((fl_status)r.status, "%.*s", (int)ch.reply.len, (const char *)ch.reply.data);
  if (st == FL_OK && answer && fl_buf_append(answer, ch.reply.data, ch.reply.len) != FL_OK)
    st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (ch.fd >= 0) close(ch.fd);
  fl_buf_free(&ch.reply);
  return st;
}

static fl_status one_request(const char *address, const char *secret, uint32_t timeout_ms, ps_frame *f, fl_bytes body) {
  return ask(address, secret, timeout_ms, f, body, NULL);
}

fl_status ps_shard_promote(const char *server, const char *secret, uint32_t table, uint32_t shard, uint32_t timeout_ms) {
  ps_frame f = {.op = PS_OP_PROMOTE, .table = table, .shard = shard};
  return one_request(server, secret && secret[0] ? secret : NULL, timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS, &f,
                     fl_bytes_of(NULL, 0));
}

fl_status ps_shard_replicate(const char *primary, const char *secret, uint32_t table, uint32_t shard,
                             const char *backup, uint32_t timeout_ms) {
  ps_frame f = {.op = PS_OP_REPLICATE, .table = table, .shard = shard};
  return one_request(primary, secret && secret[0] ? secret : NULL, timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS, &f,
                     fl_bytes_str(backup));
}

fl_status ps_shard_drop(const char *server, const char *secret, uint32_t table, uint32_t shard, uint32_t timeout_ms) {
  ps_frame f = {.op = PS_OP_DROP, .table = table, .shard = shard};
  return one_request(server, secret && secret[0] ? secret : NULL, timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS, &f,
                     fl_bytes_of(NULL, 0));
}

fl_status ps_shard_clocks(const char *server, const char *secret, uint32_t table, uint32_t shard,
                          uint32_t timeout_ms, uint64_t **clocks, uint32_t *n) {
  ps_frame f = {.op = PS_OP_CLOCKS, .table = table, .shard = shard};
  fl_buf answer = FL_BUF_INIT;
  *clocks = NULL;
  *n = 0;
  fl_status st = ask(server, secret && secret[0] ? secret : NULL, timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS, &f,
                     fl_bytes_of(NULL, 0), &answer);
  uint32_t count = answer.len >= 8 ? common_get_u32(answer.data) : 0;
  if (st == FL_OK && (answer.len < 8 || count > PS_WIRE_CLOCKS_MAX || answer.len != 8 + (size_t)count * 8))
    st = fl_set_error(FL_EPROTO, "parameter server %s: a malformed clocks answer of %zu bytes", server, answer.len);
  if (st == FL_OK && !(*clocks = common_calloc(count ? count : 1, sizeof **clocks)))
    st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t w = 0; st == FL_OK && w < count; w++) (*clocks)[w] = common_get_u64(answer.data + 8 + (size_t)w * 8);
  if (st == FL_OK) *n = count;
  fl_buf_free(&answer);
  return st;
}

fl_status ps_shard_targets(const char *server, const char *secret, uint32_t table, uint32_t shard,
                           const char (*targets)[PS_ADDRESS_MAX], uint32_t n, uint32_t timeout_ms) {
  ps_frame f = {.op = PS_OP_TARGETS, .table = table, .shard = shard};
  fl_buf body = FL_BUF_INIT;
  fl_status st = ps_wire_targets_encode(targets, n, &body);
  if (st == FL_OK)
    st = one_request(server, secret && secret[0] ? secret : NULL, timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS, &f,
                     fl_buf_bytes(&body));
  fl_buf_free(&body);
  return st;
}

fl_status ps_table_create(const ps_map *map, const char *secret, uint32_t timeout_ms) {
  if (!map || !map->places || map->shards < 1 || map->workers < 1)
    return fl_set_error(FL_EINVAL, "parameter server: a table needs places, shards and workers");
  fl_status st = ps_table_spec_check(&map->spec);
  if (st != FL_OK) return st;
  if (secret && !secret[0]) secret = NULL;
  if (!timeout_ms) timeout_ms = DEFAULT_TIMEOUT_MS;
  fl_buf body = FL_BUF_INIT;
  for (uint32_t s = 0; st == FL_OK && s < map->shards; s++) {
    const ps_place *pl = &map->places[s];
    /* The last replica first: every replica's targets exist before anyone forwards. */
    for (uint32_t m = ps_place_backups(pl) + 1; st == FL_OK && m-- > 0;) {
      ps_host_request h = {.spec = map->spec, .shards = map->shards, .index = s, .workers = map->workers};
      ps_place_targets(pl, map->replication, m, h.targets, &h.num_targets);
      body.len = 0;
      st = ps_wire_host_encode(&h, &body);
      ps_frame f = {.op = PS_OP_HOST, .table = map->table, .shard = s, .arg = m > 0}; /* arg 1: a backup */
      if (st == FL_OK) st = one_request(m ? pl->backups[m - 1] : pl->primary, secret, timeout_ms, &f, fl_buf_bytes(&body));
    }
  }
  fl_buf_free(&body);
  return st;
}

fl_status ps_client_create(const ps_map *map, uint32_t worker, const char *secret, uint32_t timeout_ms,
                           ps_client **out) {
  if (!map || !map->places || map->shards < 1 || worker >= map->workers)
    return fl_set_error(FL_EINVAL, "parameter server: worker %u of a table of %u workers", worker,
                        map ? map->workers : 0);
  fl_status st = ps_table_spec_check(&map->spec);
  if (st != FL_OK) return st;
  ps_client *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  c->map = *map;
  c->worker = worker;
  c->staleness = PS_STALENESS_ASYNC;
  c->timeout_ms = timeout_ms ? timeout_ms : DEFAULT_TIMEOUT_MS;
  pthread_mutex_init(&c->mu, NULL);
  c->map.places = common_memdup(map->places, map->shards * sizeof *map->places);
  c->channels = common_calloc(map->shards, sizeof *c->channels);
  if (secret && secret[0]) c->secret = common_strdup(secret);
  if (!c->map.places || !c->channels || (secret && secret[0] && !c->secret)) {
    common_free(c->map.places);
    common_free(c->channels);
    common_free(c->secret);
    pthread_mutex_destroy(&c->mu);
    common_free(c);
    return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  uint32_t started = 0;
  for (; started < map->shards; started++) {
    channel *ch = &c->channels[started];
    ch->client = c;
    ch->shard = started;
    ch->fd = -1;
    snprintf(ch->address, sizeof ch->address, "%s", map->places[started].primary);
    common_queue_init(&ch->q);
    if (pthread_create(&ch->thread, NULL, channel_main, ch) != 0) {
      common_queue_destroy(&ch->q);
      break;
    }
  }
  if (started < map->shards) {
    c->map.shards = started;
    ps_client_destroy(c);
    return FL_ERR(FL_EINTERNAL, "parameter server: cannot start a channel thread");
  }
  /* A worker opened again (its task retried) goes on from the clock the shards have for it:
   * the smallest, should a clock end have reached only some of them before it was lost. */
  uint64_t ticket, clock = 0;
  st = everywhere(c, PS_OP_CLOCK_OF, NULL, &ticket);
  if (st == FL_OK) st = ps_client_wait(c, ticket, &clock);
  if (st != FL_OK) {
    ps_client_destroy(c);
    return st;
  }
  c->clock = clock;
  *out = c;
  return FL_OK;
}

void ps_client_destroy(ps_client *c) {
  if (!c) return;
  for (uint32_t s = 0; s < c->map.shards; s++) common_queue_close(&c->channels[s].q);
  for (uint32_t s = 0; s < c->map.shards; s++) {
    channel *ch = &c->channels[s];
    pthread_join(ch->thread, NULL);
    common_queue_destroy(&ch->q);
    if (ch->fd >= 0) close(ch->fd);
    fl_buf_free(&ch->reply);
  }
  while (c->ops) { /* operations never waited for: their parts have all run */
    op *o = c->ops;
    c->ops = o->next;
    op_free(o);
  }
  common_free(c->channels);
  common_free(c->map.places);
  common_free(c->secret);
  pthread_mutex_destroy(&c->mu);
  common_free(c);
}
