/*
 * gpu/parallel/pipeline_trainer.c: the hybrid trainer of gpu/parallel/pipeline.h: the grid's communicators, the stage
 * cut, the schedule's execution with non-blocking sends, and the step's timeline.
 */
#include "gpu/parallel/pipeline.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "gpu/device/device.h"

/* ---- the grid ------------------------------------------------------------------------------ */

fl_status pp_grid_check(pp_grid g, int world) {
  if (g.dp < 1 || g.tp < 1 || g.pp < 1)
    return fl_set_error(FL_EINVAL, "the grid %dx%dx%d (dp x tp x pp) needs every dimension >= 1",
                        g.dp, g.tp, g.pp);
  if ((long)g.dp * g.tp * g.pp != world)
    return fl_set_error(FL_EINVAL, "the grid dp %d x tp %d x pp %d = %ld ranks, but the world has %d",
                        g.dp, g.tp, g.pp, (long)g.dp * g.tp * g.pp, world);
  return FL_OK;
}

pp_coords pp_grid_coords(pp_grid g, int rank) {
  return (pp_coords){.tp = rank % g.tp, .dp = (rank / g.tp) % g.dp, .pp = rank / (g.tp * g.dp)};
}

int pp_grid_rank(pp_grid g, pp_coords c) { return (c.pp * g.dp + c.dp) * g.tp + c.tp; }

fl_status pp_grid_parse(const char *text, pp_grid *out) {
  int d, t, p, used = 0;
  if (!text || !out) return fl_set_error(FL_EINVAL, "pp_grid_parse: NULL argument");
  if (sscanf(text, "%dx%dx%d%n", &d, &t, &p, &used) != 3 || text[used] != '\0' || d < 1 || t < 1 ||
      p < 1)
    return fl_set_error(FL_EINVAL, "grid '%s' is not DPxTPxPP with each >= 1 (e.g. 2x1x2)", text);
  *out = (pp_grid){d, t, p};
  return FL_OK;
}

const char *pp_event_kind_name(pp_event_kind k) {
  static const char *const names[PP_EV_KINDS] = {"forward", "backward", "recv",
                                                 "send",    "allreduce", "optimizer"};
  return (unsigned)k < PP_EV_KINDS ? names[k] : "?";
}

/* ---- messages between stages ------------------------------------------------------------ */

enum { MSG_ACTIVATION = 1, MSG_GRADIENT = 2, MSG_HEADER_FLOATS = 4 };

typedef struct message {
  struct message *next; /* in the outbox or the mailbox */
  int peer; /* pipeline rank it goes to or came from */
  float header[MSG_HEADER_FLOATS]; /* kind, stage, micro-batch, floats */
  float *data;
  size_t count;
} message;

static void message_free(message *m) {
  if (!m) return;
  free(m->data);
  free(m);
}

/* ---- the trainer ---------------------------------------------------------------------------- */

/* One micro-batch in flight on a chunk: its input (received or read from the batch, kept
 * until backward, which reads it), its output gradient, and on the last stage its labels and
 * logit gradient. */
typedef struct slot {
  fl_tensor input, grad_in, dlogits;
  int32_t *labels; /* device, `labels_cap` of them */
  int labels_cap;
  bool busy;
} slot;

typedef struct chunk_state {
  tfm_chunk *chunk;
  optim_sgd *opt;
  int first_unit, end_unit, stage;
  slot *slots;
  int nslots;
  int *slot_of; /* micro-batch -> slot */
  int slot_of_cap;
} chunk_state;

struct pp_trainer {
  fl_device *dev;
  fl_device host; /* a cpu device: wraps the host buffers that messages travel in */
  fl_comm *world, *tp, *dp, *pp;
  pp_options o;
  pp_coords me;
  int nstages, *bounds;
  chunk_state *chunks;
  int nchunks;
  pp_op *ops; /* this pipeline rank's schedule, for the last m it was built for */
  size_t nops;
  int ops_m;
  fl_tensor stats; /* [2] on dev: loss sum, correct */
  /* this step */
  pp_event *events;
  size_t nevents, events_cap;
  uint64_t step_start_ns;
  size_t inputs_held, peak_bytes;
  double busy_s, last_backward_end;
  /* the sender thread */
  pthread_t sender;
  bool sender_started;
  pthread_mutex_t lock;
  pthread_cond_t ready, drained;
  message *out_head, *out_tail; /* the outbox, under lock */
  bool closing;
  size_t pending;        /* messages queued or being sent */
  fl_status send_error;  /* the first failure of the sender thread */
  char send_msg[384];
  message *mailbox; /* received ahead of their turn */
};

static double since_start(const pp_trainer *t) {
  return (double)(common_now_ns() - t->step_start_ns) * 1e-9;
}

static fl_status event_add(pp_trainer *t, pp_event_kind kind, int mb, int chunk, double t0) {
  if (t->nevents == t->events_cap) {
    size_t cap = t->events_cap ? 2 * t->events_cap : 64;
    pp_event *e = realloc(t->events, cap * sizeof *e);
    if (!e) return FL_ERR(FL_ENOMEM, "out of memory for the timeline");
    t->events = e;
    t->events_cap = cap;
  }
  t->events[t->nevents++] = (pp_event){kind, mb, chunk, t0, since_start(t)};
  return FL_OK;
}

/* A host buffer as a tensor of the trainer's cpu device, for the host communicator. */
static fl_tensor host_tensor(pp_trainer *t, float *data, size_t count) {
  fl_tensor v = {.dev = &t->host, .ndim = 1, .numel = count, .data = data, .owns = false};
  v.shape[0] = (int64_t)count;
  return v;
}

static void *sender_main(void *arg) {
  pp_trainer *t = arg;
  for (;;) {
    pthread_mutex_lock(&t->lock);
    while (!t->out_head && !t->closing) pthread_cond_wait(&t->ready, &t->lock);
    message *m = t->out_head;
    if (m) {
      t->out_head = m->next;
      if (!t->out_head) t->out_tail = NULL;
    }
    bool failed = t->send_error != FL_OK;
    pthread_mutex_unlock(&t->lock);
    if (!m) break;
    if (!failed) {
      fl_tensor h = host_tensor(t, m->header, MSG_HEADER_FLOATS), d = host_tensor(t, m->data, m->count);
      fl_status s = fl_comm_send(t->pp, &h, m->peer);
      if (s == FL_OK && m->count) s = fl_comm_send(t->pp, &d, m->peer);
      if (s != FL_OK) {
        pthread_mutex_lock(&t->lock);
        if (t->send_error == FL_OK) {
          t->send_error = s;
          snprintf(t->send_msg, sizeof t->send_msg, "%s", fl_last_error());
        }
        pthread_mutex_unlock(&t->lock);
      }
    }
    message_free(m);
    pthread_mutex_lock(&t->lock);
    if (--t->pending == 0) pthread_cond_broadcast(&t->drained);
    pthread_mutex_unlock(&t->lock);
  }
  return NULL;
}

static fl_status sender_failure(pp_trainer *t) {
  pthread_mutex_lock(&t->lock);
  fl_status s = t->send_error;
  pthread_mutex_unlock(&t->lock);
  if (s == FL_OK) return FL_OK;
  return fl_set_error(s, "pipeline rank %d: sending to the next or previous stage failed: %s",
                      t->me.pp, t->send_msg);
}

/* Copies y (on the device) into a message for pipeline rank `peer` and queues it. */
static fl_status send_tensor(pp_trainer *t, int peer, int kind, int stage, int mb, const fl_tensor *y) {
  fl_status s = sender_failure(t);
  if (s != FL_OK) return s;
  message *m = calloc(1, sizeof *m);
  if (!m) return FL_ERR(FL_ENOMEM, "out of memory for a message");
  m->peer = peer;
  m->count = y->numel;
  m->header[0] = (float)kind, m->header[1] = (float)stage, m->header[2] = (float)mb;
  m->header[3] = (float)y->numel;
  m->data = malloc((y->numel ? y->numel : 1) * sizeof(float));
  if (!m->data) {
    message_free(m);
    return FL_ERR(FL_ENOMEM, "out of memory for a message of %zu floats", y->numel);
  }
  if (y->numel) {
    s = t->dev->ops->to_host(t->dev, m->data, y->data, y->numel * sizeof(float));
    if (s != FL_OK) {
      message_free(m);
      return s;
    }
  }
  pthread_mutex_lock(&t->lock);
  t->pending++;
  if (t->out_tail) t->out_tail->next = m;
  else t->out_head = m;
  t->out_tail = m;
  pthread_cond_signal(&t->ready);
  pthread_mutex_unlock(&t->lock);
  return FL_OK;
}

/* Waits until the sender thread has sent everything queued. */
static fl_status sender_drain(pp_trainer *t) {
  pthread_mutex_lock(&t->lock);
  while (t->pending > 0) pthread_cond_wait(&t->drained, &t->lock);
  pthread_mutex_unlock(&t->lock);
  return sender_failure(t);
}

static bool message_is(const message *m, int peer, int kind, int stage, int mb) {
  return m->peer == peer && (int)m->header[0] == kind && (int)m->header[1] == stage &&
         (int)m->header[2] == mb;
}

/* Receives the message (kind, stage, mb) from pipeline rank `peer` into dst (on the device,
 * already shaped): from the mailbox if it came earlier, else from the connection, keeping
 * whatever arrives before it. */
static fl_status recv_tensor(pp_trainer *t, int peer, int kind, int stage, int mb, fl_tensor *dst) {
  message *m = NULL;
  for (message **p = &t->mailbox; *p; p = &(*p)->next) {
    if (message_is(*p, peer, kind, stage, mb)) {
      m = *p;
      *p = m->next;
      break;
    }
  }
  while (!m) {
    message *in = calloc(1, sizeof *in);
    if (!in) return FL_ERR(FL_ENOMEM, "out of memory for a message");
    in->peer = peer;
    fl_tensor h = host_tensor(t, in->header, MSG_HEADER_FLOATS);
    fl_status s = fl_comm_recv(t->pp, &h, peer);
    if (s != FL_OK) {
      message_free(in);
      return s;
    }
    float n = in->header[3];
    int k = (int)in->header[0];
    if ((k != MSG_ACTIVATION && k != MSG_GRADIENT) || !(n >= 0) || n > 1e9f) {
      double kind_seen = in->header[0];
      message_free(in);
      return fl_set_error(FL_EPROTO, "pipeline rank %d: a message from pipeline rank %d has a bad "
                          "header (kind %g, %g floats)", t->me.pp, peer, kind_seen, (double)n);
    }
    in->count = (size_t)n;
    in->data = malloc((in->count ? in->count : 1) * sizeof(float));
    if (!in->data) {
      size_t count = in->count;
      message_free(in);
      return FL_ERR(FL_ENOMEM, "out of memory for a message of %zu floats", count);
    }
    fl_tensor d = host_tensor(t, in->data, in->count);
    if (in->count && (s = fl_comm_recv(t->pp, &d, peer)) != FL_OK) {
      message_free(in);
      return s;
    }
    if (message_is(in, peer, kind, stage, mb)) {
      m = in;
    } else {
      in->next = t->mailbox;
      t->mailbox = in;
    }
  }
  fl_status s = FL_OK;
  if (m->count != dst->numel)
    s = fl_set_error(FL_EPROTO, "pipeline rank %d: the %s of stage %d micro-batch %d from pipeline "
                     "rank %d has %zu floats, expected %zu", t->me.pp,
                     kind == MSG_ACTIVATION ? "activation" : "gradient", stage, mb, peer, m->count,
                     dst->numel);
  else if (m->count)
    s = t->dev->ops->from_host(t->dev, dst->data, m->data, m->count * sizeof(float));
  message_free(m);
  return s;
}

/* ---- the stage cut ------------------------------------------------------------------------ */

/* Rank 0's profile: each unit alone (tensor parallel 1) forward and backward on `rows`
 * random samples, the median of 3 timings, and its output's bytes. */
static fl_status profile_units(pp_trainer *t, int rows, double *secs, double *bytes) {
  const tfm_spec *sp = &t->o.spec;
  int units = tfm_units(sp);
  fl_status status = FL_OK;
  fl_tensor x = {0}, dy = {0};
  tfm_chunk *c = NULL;
  for (int u = 0; u < units && status == FL_OK; u++) {
    int64_t shape[3] = {rows, sp->seq, u == 0 ? sp->features : sp->hidden};
    FL_CHECK(tensor_ensure(&x, t->dev, 3, shape));
    FL_CHECK(t->dev->ops->fill(t->dev, x.numel, 0.5f, x.data));
    FL_CHECK(tfm_chunk_create(t->dev, sp, u, u + 1, NULL, 0, 1, &c));
    double best[3];
    tfm_batch b = {0, 0};
    for (int r = 0; r < 3; r++) {
      uint64_t t0 = common_now_ns();
      const fl_tensor *y, *dx;
      FL_CHECK(tfm_chunk_forward(c, 0, &x, &b, true, &y));
      FL_CHECK(tensor_ensure(&dy, t->dev, y->ndim, y->shape));
      FL_CHECK(t->dev->ops->fill(t->dev, dy.numel, 1e-3f, dy.data));
      FL_CHECK(tfm_chunk_backward(c, 0, &dy, u == 0 ? NULL : &dx));
      FL_CHECK(t->dev->ops->synchronize(t->dev));
      best[r] = (double)(common_now_ns() - t0) * 1e-9;
      bytes[u] = (double)y->numel * sizeof(float);
    }
    secs[u] = fmax(fmin(best[0], best[1]), fmin(fmax(best[0], best[1]), best[2])); /* median */
    tfm_chunk_destroy(c);
    c = NULL;
  }
cleanup:
  tfm_chunk_destroy(c);
  tensor_release(&x);
  tensor_release(&dy);
  return status;
}

#define PROFILE_ROWS 8
/* The host backend's bandwidth on one machine, for the partitioner's transfer term. */
#define ASSUMED_LINK_BYTES_PER_S 2e9

static fl_status choose_bounds(pp_trainer *t, const int *given) {
  int units = tfm_units(&t->o.spec), n = t->nstages;
  if (n > units)
    return fl_set_error(FL_EINVAL, "%d pipeline stages (pp %d x chunks %d) but the model has only "
                        "%d units (embedding, %d blocks, head)", n, t->o.grid.pp, t->nchunks,
                        units, t->o.spec.blocks);
  if (given) {
    for (int s = 0; s <= n; s++) t->bounds[s] = given[s];
    if (t->bounds[0] != 0 || t->bounds[n] != units)
      return fl_set_error(FL_EINVAL, "the stage boundaries must start at 0 and end at %d (units)", units);
    for (int s = 0; s < n; s++)
      if (t->bounds[s + 1] <= t->bounds[s])
        return fl_set_error(FL_EINVAL, "stage %d is empty or reversed (units %d..%d)", s,
                            t->bounds[s], t->bounds[s + 1]);
    return FL_OK;
  }
  fl_status status = FL_OK;
  double *secs = calloc((size_t)units, sizeof *secs), *bytes = calloc((size_t)units, sizeof *bytes);
  size_t *cut = calloc((size_t)n + 1, sizeof *cut);
  fl_tensor share = {0};
  int64_t shape[1] = {n + 1};
  if (!secs || !bytes || !cut) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for the profile"));
  FL_CHECK(tensor_ensure(&share, t->dev, 1, shape));
  if (fl_comm_rank(t->world) == 0) {
    float host[n + 1];
    double bottleneck;
    FL_CHECK(profile_units(t, PROFILE_ROWS, secs, bytes));
    FL_CHECK(pp_partition(secs, bytes, (size_t)units, n, ASSUMED_LINK_BYTES_PER_S, cut, &bottleneck));
    for (int s = 0; s <= n; s++) host[s] = (float)cut[s];
    FL_CHECK(t->dev->ops->from_host(t->dev, share.data, host, sizeof host));
  }
  FL_CHECK(fl_comm_broadcast(t->world, &share, 0));
  {
    float host[n + 1];
    FL_CHECK(t->dev->ops->to_host(t->dev, host, share.data, sizeof host));
    for (int s = 0; s <= n; s++) t->bounds[s] = (int)host[s];
  }
cleanup:
  free(secs);
  free(bytes);
  free(cut);
  tensor_release(&share);
  return status;
}

/* ---- create and destroy --------------------------------------------------------------------- */

static fl_status check_options(const pp_options *o, int world) {
  fl_status s = pp_grid_check(o->grid, world);
  if (s != FL_OK) return s;
  if (o->microbatches < 1) return fl_set_error(FL_EINVAL, "micro-batches must be >= 1 (got %d)", o->microbatches);
  int v = o->chunks ? o->chunks : 1;
  if (v < 1) return fl_set_error(FL_EINVAL, "chunks per pipeline rank must be >= 1 (got %d)", o->chunks);
  if (v > 1 && o->schedule != PP_INTERLEAVED)
    return fl_set_error(FL_EINVAL, "%d chunks per pipeline rank need the interleaved schedule, not %s",
                        v, pp_schedule_name(o->schedule));
  if (o->synthetic_forward_s < 0 || o->synthetic_forward_s > 10)
    return fl_set_error(FL_EINVAL, "synthetic forward time %g s is outside [0, 10]", o->synthetic_forward_s);
  return tfm_spec_check(&o->spec, o->grid.tp);
}

void pp_trainer_destroy(pp_trainer *t) {
  if (!t) return;
  if (t->sender_started) {
    pthread_mutex_lock(&t->lock);
    t->closing = true;
    pthread_cond_signal(&t->ready);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->sender, NULL);
  }
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->ready);
  pthread_cond_destroy(&t->drained);
  for (message *m = t->mailbox, *next; m; m = next) {
    next = m->next;
    message_free(m);
  }
  for (int c = 0; c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    for (int k = 0; k < cs->nslots; k++) {
      tensor_release(&cs->slots[k].input);
      tensor_release(&cs->slots[k].grad_in);
      tensor_release(&cs->slots[k].dlogits);
      if (cs->slots[k].labels) t->dev->ops->free(t->dev, cs->slots[k].labels);
    }
    free(cs->slots);
    free(cs->slot_of);
    optim_sgd_destroy(cs->opt);
    tfm_chunk_destroy(cs->chunk);
  }
  free(t->chunks);
  free(t->bounds);
  free(t->ops);
  free(t->events);
  tensor_release(&t->stats);
  fl_comm_destroy(t->tp);
  fl_comm_destroy(t->dp);
  fl_comm_destroy(t->pp);
  if (t->host.ops && t->host.ops->destroy) t->host.ops->destroy(&t->host);
  free(t);
}

fl_status pp_trainer_create(fl_device *dev, fl_comm *world, const pp_options *o, pp_trainer **out) {
  if (!dev || !world || !o || !out) return fl_set_error(FL_EINVAL, "pp_trainer_create: NULL argument");
  *out = NULL;
  fl_status status = check_options(o, fl_comm_size(world));
  if (status != FL_OK) return status;
  pp_trainer *t = calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "out of memory for a trainer");
  t->dev = dev;
  t->world = world;
  t->o = *o;
  t->o.bounds = NULL;
  t->o.stage_world = NULL;
  t->o.chunks = o->chunks ? o->chunks : 1;
  t->nchunks = t->o.chunks;
  t->nstages = o->grid.pp * t->nchunks;
  t->me = pp_grid_coords(o->grid, fl_comm_rank(world));
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->ready, NULL);
  pthread_cond_init(&t->drained, NULL);
  FL_CHECK(cpu_device_init(&t->host));
  pp_grid g = o->grid;
  pp_coords me = t->me;
  /* The three splits, in the same order on every rank (each is collective over world). */
  FL_CHECK(fl_comm_split(world, me.pp * g.dp + me.dp, me.tp, &t->tp));
  FL_CHECK(fl_comm_split(world, me.pp * g.tp + me.tp, me.dp, &t->dp));
  fl_comm *stages = o->stage_world ? o->stage_world : world;
  if (fl_comm_size(stages) != fl_comm_size(world) || fl_comm_rank(stages) != fl_comm_rank(world))
    FL_CHECK(fl_set_error(FL_EINVAL, "the stage communicator is rank %d of %d, the world rank %d of %d",
                          fl_comm_rank(stages), fl_comm_size(stages), fl_comm_rank(world), fl_comm_size(world)));
  FL_CHECK(fl_comm_split(stages, me.dp * g.tp + me.tp, me.pp, &t->pp));
  if (g.pp > 1 && strcmp(fl_comm_backend(t->pp), "host") != 0)
    FL_CHECK(fl_set_error(FL_EINVAL, "pipeline stages exchange activations over the host backend, "
                          "but the world communicator is %s", fl_comm_backend(t->pp)));
  t->bounds = calloc((size_t)t->nstages + 1, sizeof *t->bounds);
  t->chunks = calloc((size_t)t->nchunks, sizeof *t->chunks);
  if (!t->bounds || !t->chunks) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for a trainer"));
  FL_CHECK(choose_bounds(t, o->bounds));
  for (int c = 0; c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    cs->stage = pp_stage_of(g.pp, me.pp, c);
    cs->first_unit = t->bounds[cs->stage];
    cs->end_unit = t->bounds[cs->stage + 1];
    FL_CHECK(tfm_chunk_create(dev, &o->spec, cs->first_unit, cs->end_unit, g.tp > 1 ? t->tp : NULL,
                              me.tp, g.tp, &cs->chunk));
    FL_CHECK(optim_sgd_create(dev, tfm_chunk_values(cs->chunk)->numel, &o->sgd, &cs->opt));
  }
  int64_t two[1] = {2};
  FL_CHECK(tensor_ensure(&t->stats, dev, 1, two));
  if (g.pp > 1) {
    if (pthread_create(&t->sender, NULL, sender_main, t) != 0)
      FL_CHECK(FL_ERR(FL_EINTERNAL, "cannot start the pipeline's sender thread"));
    t->sender_started = true;
  }
  *out = t;
  return FL_OK;
cleanup:
  pp_trainer_destroy(t);
  return status;
}

pp_coords pp_trainer_coords(const pp_trainer *t) { return t->me; }
int pp_trainer_num_chunks(const pp_trainer *t) { return t->nchunks; }
tfm_chunk *pp_trainer_chunk(pp_trainer *t, int chunk) {
  return chunk >= 0 && chunk < t->nchunks ? t->chunks[chunk].chunk : NULL;
}
void pp_trainer_chunk_units(const pp_trainer *t, int chunk, int *first, int *end) {
  *first = t->chunks[chunk].first_unit;
  *end = t->chunks[chunk].end_unit;
}
const int *pp_trainer_bounds(const pp_trainer *t) { return t->bounds; }
optim_sgd *pp_trainer_chunk_optimizer(pp_trainer *t, int chunk) {
  return chunk >= 0 && chunk < t->nchunks ? t->chunks[chunk].opt : NULL;
}

/* ---- one step ------------------------------------------------------------------------------- */

static fl_status slot_acquire(chunk_state *cs, int mb, int m, int *out) {
  if (cs->slot_of_cap < m) {
    int *p = realloc(cs->slot_of, (size_t)m * sizeof *p);
    if (!p) return FL_ERR(FL_ENOMEM, "out of memory for micro-batch slots");
    cs->slot_of = p;
    cs->slot_of_cap = m;
  }
  int k = 0;
  while (k < cs->nslots && cs->slots[k].busy) k++;
  if (k == cs->nslots) {
    slot *s = realloc(cs->slots, (size_t)(k + 1) * sizeof *s);
    if (!s) return FL_ERR(FL_ENOMEM, "out of memory for micro-batch slots");
    cs->slots = s;
    memset(&s[k], 0, sizeof s[k]);
    cs->nslots++;
  }
  cs->slots[k].busy = true;
  cs->slot_of[mb] = k;
  *out = k;
  return FL_OK;
}

/* Activation memory held now (slots in flight and stashed inputs); keeps the step's peak. */
static void note_peak(pp_trainer *t) {
  size_t b = t->inputs_held;
  for (int c = 0; c < t->nchunks; c++) b += tfm_chunk_activation_bytes(t->chunks[c].chunk);
  if (b > t->peak_bytes) t->peak_bytes = b;
}

static void sleep_s(double s) {
  if (s <= 0) return;
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

typedef struct step_ctx {
  const float *x;
  const int32_t *labels;
  int batch, mbs;
  uint64_t step;
} step_ctx;

/* A micro-batch's dropout key: its rows' place in the global batch (this replica's rows come
 * after the earlier replicas'), so that masks do not depend on dp, pp or m. */
static tfm_batch batch_key(const pp_trainer *t, const step_ctx *sc, int mb) {
  return (tfm_batch){.row0 = (int64_t)t->me.dp * sc->batch + (int64_t)mb * sc->mbs, .step = sc->step};
}

static fl_status forward_op(pp_trainer *t, const step_ctx *sc, const pp_op *op, bool train) {
  const tfm_spec *sp = &t->o.spec;
  chunk_state *cs = &t->chunks[op->chunk];
  int stage = cs->stage, last = t->nstages - 1, mb = op->microbatch, k = 0;
  fl_status status = slot_acquire(cs, mb, t->o.microbatches, &k);
  if (status != FL_OK) return status;
  slot *sl = &cs->slots[k];
  int64_t in_shape[3] = {sc->mbs, sp->seq, stage == 0 ? sp->features : sp->hidden};
  FL_CHECK(tensor_ensure(&sl->input, t->dev, 3, in_shape));
  t->inputs_held += sl->input.numel * sizeof(float);
  if (stage == 0) {
    const float *rows = sc->x + (size_t)mb * sc->mbs * sp->seq * sp->features;
    FL_CHECK(t->dev->ops->from_host(t->dev, sl->input.data, rows, sl->input.numel * sizeof(float)));
  } else {
    double t0 = since_start(t);
    FL_CHECK(recv_tensor(t, (stage - 1) % t->o.grid.pp, MSG_ACTIVATION, stage, mb, &sl->input));
    FL_CHECK(event_add(t, PP_EV_RECV, mb, op->chunk, t0));
  }
  double t0 = since_start(t);
  tfm_batch b = batch_key(t, sc, mb);
  const fl_tensor *y;
  FL_CHECK(tfm_chunk_forward(cs->chunk, t->o.recompute || !train ? 0 : k, &sl->input, &b, train, &y));
  if (stage == last) {
    if (sl->labels_cap < sc->mbs) {
      if (sl->labels) t->dev->ops->free(t->dev, sl->labels);
      sl->labels = NULL;
      sl->labels_cap = 0;
      FL_CHECK(t->dev->ops->alloc(t->dev, (size_t)sc->mbs * sizeof(int32_t), (void **)&sl->labels));
      sl->labels_cap = sc->mbs;
    }
    FL_CHECK(t->dev->ops->from_host(t->dev, sl->labels, sc->labels + (size_t)mb * sc->mbs,
                                    (size_t)sc->mbs * sizeof(int32_t)));
    FL_CHECK(tensor_ensure(&sl->dlogits, t->dev, y->ndim, y->shape));
    FL_CHECK(t->dev->ops->softmax_xent(t->dev, sc->mbs, sp->classes, y->data, sl->labels,
                                       train ? 1.0f / (float)sc->batch : 0.0f, sl->dlogits.data,
                                       t->stats.data));
  }
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  sleep_s(t->o.synthetic_forward_s);
  FL_CHECK(event_add(t, PP_EV_FORWARD, mb, op->chunk, t0));
  t->busy_s += t->events[t->nevents - 1].t1 - t0;
  note_peak(t);
  if (stage != last) {
    double s0 = since_start(t);
    FL_CHECK(send_tensor(t, (stage + 1) % t->o.grid.pp, MSG_ACTIVATION, stage + 1, mb, y));
    FL_CHECK(event_add(t, PP_EV_SEND, mb, op->chunk, s0));
  }
cleanup:
  return status;
}

static fl_status backward_op(pp_trainer *t, const step_ctx *sc, const pp_op *op) {
  chunk_state *cs = &t->chunks[op->chunk];
  int stage = cs->stage, last = t->nstages - 1, mb = op->microbatch;
  int k = cs->slot_of[mb];
  slot *sl = &cs->slots[k];
  fl_status status = FL_OK;
  const fl_tensor *dy = &sl->dlogits, *dx = NULL;
  if (stage != last) {
    const tfm_spec *sp = &t->o.spec;
    int64_t shape[3] = {sc->mbs, sp->seq, sp->hidden};
    FL_CHECK(tensor_ensure(&sl->grad_in, t->dev, 3, shape));
    double t0 = since_start(t);
    FL_CHECK(recv_tensor(t, (stage + 1) % t->o.grid.pp, MSG_GRADIENT, stage, mb, &sl->grad_in));
    FL_CHECK(event_add(t, PP_EV_RECV, mb, op->chunk, t0));
    dy = &sl->grad_in;
  }
  double t0 = since_start(t);
  if (t->o.recompute) {
    tfm_batch b = batch_key(t, sc, mb);
    const fl_tensor *y;
    FL_CHECK(tfm_chunk_forward(cs->chunk, 0, &sl->input, &b, true, &y));
    note_peak(t);
  }
  FL_CHECK(tfm_chunk_backward(cs->chunk, t->o.recompute ? 0 : k, dy, stage == 0 ? NULL : &dx));
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  sleep_s(2 * t->o.synthetic_forward_s);
  FL_CHECK(event_add(t, PP_EV_BACKWARD, mb, op->chunk, t0));
  t->busy_s += t->events[t->nevents - 1].t1 - t0;
  t->last_backward_end = t->events[t->nevents - 1].t1;
  if (stage != 0) {
    double s0 = since_start(t);
    FL_CHECK(send_tensor(t, (stage - 1) % t->o.grid.pp, MSG_GRADIENT, stage - 1, mb, dx));
    FL_CHECK(event_add(t, PP_EV_SEND, mb, op->chunk, s0));
  }
  sl->busy = false;
  t->inputs_held -= sl->input.numel * sizeof(float);
cleanup:
  return status;
}

/* The pipeline group's bubble from every member's busy time and last backward. */
static fl_status measure_bubble(pp_trainer *t, pp_step_stats *st) {
  int p = t->o.grid.pp;
  float mine[2] = {(float)t->busy_s, (float)t->last_backward_end}, all[2 * 64];
  if (p > 64) return fl_set_error(FL_EINVAL, "pipeline depth %d is above 64", p);
  fl_tensor in = host_tensor(t, mine, 2), out = host_tensor(t, all, 2 * (size_t)p);
  fl_status s = p > 1 ? fl_comm_allgather(t->pp, &in, &out) : FL_OK;
  if (s != FL_OK) return s;
  if (p == 1) memcpy(all, mine, sizeof mine);
  double busy = 0, end = 0;
  for (int r = 0; r < p; r++) busy += all[2 * r], end = fmax(end, all[2 * r + 1]);
  st->pipeline_s = end;
  st->bubble = end > 0 ? 1.0 - busy / (p * end) : 0;
  return FL_OK;
}

/* The loss sum and correct count of the step over the world: the last stage's (once per
 * tensor-parallel group, every data-parallel replica's). */
static fl_status world_sums(pp_trainer *t, double out[2]) {
  fl_status status = FL_OK;
  float host[2] = {0, 0};
  bool counts = t->chunks[t->nchunks - 1].stage == t->nstages - 1 && t->me.tp == 0;
  if (counts) FL_CHECK(t->dev->ops->to_host(t->dev, host, t->stats.data, sizeof host));
  if (strcmp(fl_comm_backend(t->world), "host") == 0) {
    fl_tensor sums = host_tensor(t, host, 2);
    FL_CHECK(fl_comm_allreduce(t->world, &sums, FL_REDUCE_SUM));
  } else {
    FL_CHECK(t->dev->ops->from_host(t->dev, t->stats.data, host, sizeof host));
    FL_CHECK(fl_comm_allreduce(t->world, &t->stats, FL_REDUCE_SUM));
    FL_CHECK(t->dev->ops->to_host(t->dev, host, t->stats.data, sizeof host));
  }
  out[0] = host[0];
  out[1] = host[1];
cleanup:
  return status;
}

fl_status pp_trainer_compute_gradients(pp_trainer *t, const float *x, const int32_t *labels,
                                       int batch, uint64_t step, pp_step_stats *st) {
  if (!t || !x || !labels || !st) return fl_set_error(FL_EINVAL, "pp_trainer_compute_gradients: NULL argument");
  int m = t->o.microbatches;
  if (batch < m || batch % m != 0)
    return fl_set_error(FL_EINVAL, "a batch of %d rows cannot be cut into %d equal micro-batches", batch, m);
  fl_status status = FL_OK;
  if (t->ops_m != m || !t->ops) {
    free(t->ops);
    t->ops = NULL;
    FL_CHECK(pp_schedule_ops(t->o.schedule, t->o.grid.pp, m, t->nchunks, t->me.pp, &t->ops, &t->nops));
    t->ops_m = m;
  }
  step_ctx sc = {x, labels, batch, batch / m, step};
  memset(st, 0, sizeof *st);
  for (int c = 0; c < t->nchunks; c++) tfm_chunk_reset_peak(t->chunks[c].chunk);
  FL_CHECK(t->dev->ops->memset0(t->dev, t->stats.data, 2 * sizeof(float)));
  FL_CHECK(fl_comm_barrier(t->world)); /* aligns the timelines of all ranks */
  t->step_start_ns = common_now_ns();
  t->nevents = 0;
  t->busy_s = t->last_backward_end = 0;
  t->peak_bytes = t->inputs_held = 0;
  for (size_t i = 0; i < t->nops; i++) {
    const pp_op *op = &t->ops[i];
    FL_CHECK(op->kind == PP_FORWARD ? forward_op(t, &sc, op, true) : backward_op(t, &sc, op));
  }
  FL_CHECK(sender_drain(t));
  FL_CHECK(measure_bubble(t, st));
  if (t->o.grid.dp > 1) {
    double t0 = since_start(t);
    for (int c = 0; c < t->nchunks; c++)
      FL_CHECK(fl_comm_allreduce(t->dp, tfm_chunk_grads(t->chunks[c].chunk), FL_REDUCE_AVG));
    FL_CHECK(event_add(t, PP_EV_ALLREDUCE, -1, -1, t0));
  }
  {
    double sums[2];
    FL_CHECK(world_sums(t, sums));
    double global = (double)batch * t->o.grid.dp;
    st->loss = sums[0] / global;
    st->accuracy = sums[1] / global;
  }
  st->busy_s = t->busy_s;
  st->bubble_theory = pp_bubble_theory(t->o.schedule, t->o.grid.pp, m, t->nchunks);
  st->peak_activation_bytes = t->peak_bytes;
  st->seconds = since_start(t);
  st->events = t->events;
  st->num_events = t->nevents;
cleanup:
  return status;
}

/* Forward only: every device runs its chunks' forwards micro-batch by micro-batch in stage
 * order, which needs no schedule (each forward waits only on earlier stages). */
fl_status pp_trainer_evaluate(pp_trainer *t, const float *x, const int32_t *labels, int batch,
                              double *loss_sum, double *correct) {
  if (!t || !x || !labels || !loss_sum || !correct)
    return fl_set_error(FL_EINVAL, "pp_trainer_evaluate: NULL argument");
  if (batch < 1) return fl_set_error(FL_EINVAL, "pp_trainer_evaluate: a batch of %d rows", batch);
  int m = batch % t->o.microbatches == 0 && batch >= t->o.microbatches ? t->o.microbatches : 1;
  step_ctx sc = {x, labels, batch, batch / m, 0};
  fl_status status = FL_OK;
  FL_CHECK(t->dev->ops->memset0(t->dev, t->stats.data, 2 * sizeof(float)));
  t->step_start_ns = common_now_ns();
  t->nevents = 0;
  for (int mb = 0; mb < m; mb++)
    for (int c = 0; c < t->nchunks; c++) {
      pp_op op = {PP_FORWARD, mb, c};
      FL_CHECK(forward_op(t, &sc, &op, false));
      chunk_state *cs = &t->chunks[c];
      cs->slots[cs->slot_of[mb]].busy = false;
      t->inputs_held -= cs->slots[cs->slot_of[mb]].input.numel * sizeof(float);
    }
  FL_CHECK(sender_drain(t));
  double sums[2];
  FL_CHECK(world_sums(t, sums));
  *loss_sum = sums[0];
  *correct = sums[1];
cleanup:
  return status;
}

fl_status pp_trainer_apply(pp_trainer *t, float lr, pp_step_stats *st) {
  if (!t) return fl_set_error(FL_EINVAL, "pp_trainer_apply: NULL trainer");
  fl_status status = FL_OK;
  double t0 = since_start(t);
  for (int c = 0; c < t->nchunks; c++) {
    tfm_chunk *ch = t->chunks[c].chunk;
    FL_CHECK(optim_sgd_step(t->chunks[c].opt, lr, tfm_chunk_grads(ch), tfm_chunk_values(ch)));
    FL_CHECK(tfm_chunk_zero_grad(ch));
  }
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  FL_CHECK(event_add(t, PP_EV_OPTIMIZER, -1, -1, t0));
  if (st) {
    st->seconds = since_start(t);
    st->events = t->events;
    st->num_events = t->nevents;
  }
cleanup:
  return status;
}

/* ---- the timeline as files ------------------------------------------------------------------ */

static const char *const event_colour[PP_EV_KINDS] = {"#4c78a8", "#f58518", "#e45756",
                                                       "#9d755d", "#72b7b2", "#54a24b"};

fl_status pp_timeline_write_csv(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n) {
  FILE *f = fopen(path, "w");
  if (!f) return fl_set_error(FL_EIO, "cannot write the timeline '%s': %s", path, strerror(errno));
  fprintf(f, "rank,kind,microbatch,chunk,t0,t1\n");
  for (int r = 0; r < ranks; r++)
    for (size_t i = 0; i < n[r]; i++) {
      const pp_event *e = &events[r][i];
      fprintf(f, "%d,%s,%d,%d,%.6f,%.6f\n", r, pp_event_kind_name(e->kind), e->microbatch, e->chunk,
              e->t0, e->t1);
    }
  if (fclose(f) != 0) return fl_set_error(FL_EIO, "cannot write the timeline '%s': %s", path, strerror(errno));
  return FL_OK;
}

fl_status pp_timeline_write_svg(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n, double seconds, const char *title) {
  const double left = 70, top = 40, row_h = 26, width = 900;
  double height = top + ranks * row_h + 50, scale = seconds > 0 ? width / seconds : 0;
  FILE *f = fopen(path, "w");
  if (!f) return fl_set_error(FL_EIO, "cannot write the timeline chart '%s': %s", path, strerror(errno));
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
             "font-family=\"sans-serif\" font-size=\"11\">\n", left + width + 20, height);
  fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
  fprintf(f, "<text x=\"%.0f\" y=\"20\" font-size=\"13\">%s</text>\n", left, title ? title : "");
  for (int r = 0; r < ranks; r++) {
    double y = top + r * row_h;
    fprintf(f, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + row_h * 0.65, r);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"#f2f2f2\"/>\n", left, y,
            width, row_h - 4);
    for (size_t i = 0; i < n[r]; i++) {
      const pp_event *e = &events[r][i];
      double x0 = left + e->t0 * scale, w = fmax((e->t1 - e->t0) * scale, 0.5);
      fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\">"
                 "<title>%s mb %d chunk %d: %.3f-%.3f ms</title></rect>\n",
              x0, y, w, row_h - 4, event_colour[e->kind], pp_event_kind_name(e->kind), e->microbatch,
              e->chunk, e->t0 * 1e3, e->t1 * 1e3);
      if ((e->kind == PP_EV_FORWARD || e->kind == PP_EV_BACKWARD) && w > 14)
        fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" fill=\"white\" font-size=\"9\">%d</text>\n", x0 + 2,
                y + row_h * 0.6, e->microbatch);
    }
  }
  double ay = top + ranks * row_h + 14;
  fprintf(f, "<text x=\"%.0f\" y=\"%.1f\">0</text><text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.2f ms"
             "</text>\n", left, ay, left + width, ay, seconds * 1e3);
  for (int k = 0; k < PP_EV_KINDS; k++)
    fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\"/><text x=\"%.0f\" "
               "y=\"%.1f\">%s</text>\n", left + k * 110, ay + 12, event_colour[k], left + k * 110 + 14,
            ay + 21, pp_event_kind_name((pp_event_kind)k));
  fprintf(f, "</svg>\n");
  if (fclose(f) != 0)
    return fl_set_error(FL_EIO, "cannot write the timeline chart '%s': %s", path, strerror(errno));
  return FL_OK;
}
