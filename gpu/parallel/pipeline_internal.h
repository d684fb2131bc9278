/*
 * gpu/parallel/pipeline_internal.h: the hybrid trainer's state, shared by its files and private
 * to them: gpu/parallel/pipeline_trainer.c (the grid, the stage cut, create and destroy),
 * gpu/parallel/pipeline_transfer.c (messages between stages and the sender thread),
 * gpu/parallel/pipeline_step.c (the schedule's execution, evaluation, the optimizer step) and
 * gpu/parallel/pipeline_timeline.c (the step's events and the timeline files).
 *
 * Threading: a trainer is used by its rank's thread; the fields under "the sender thread" are
 * shared with that thread under `lock`.
 */
#ifndef FLINT_GPU_PIPELINE_INTERNAL_H
#define FLINT_GPU_PIPELINE_INTERNAL_H

#include <pthread.h>

#include "gpu/parallel/pipeline.h"

/* ---- messages between stages (gpu/parallel/pipeline_transfer.c) ------------------------- */


enum { MSG_ACTIVATION = 1, MSG_GRADIENT = 2, MSG_HEADER_FLOATS = 4 };

typedef struct message {
  struct message *next; /* in the outbox or the mailbox */
  int peer; /* pipeline rank it goes to or came from */
  float header[MSG_HEADER_FLOATS]; /* kind, stage, micro-batch, floats */
  float *data;
  size_t count;
} message;


/* ---- the trainer ------------------------------------------------------------------------ */


/* One micro-batch in flight on a chunk: its input (received or read from the batch, kept
 * until backward, which reads it), its output gradient, and on the last stage its labels and
 * logit gradient. */
typedef struct slot {
  fl_tensor input, grad_in, dlogits;
  int32_t *labels; /* device, `labels_cap` of them */
  int labels_cap;
  bool busy;
} slot;

/* A stashed copy of a chunk's weights (PipeDream, gpu/parallel/pipeline_versions.c). */
typedef struct weight_version {
  int version; /* -1: free */
  fl_tensor w;
} weight_version;

typedef struct chunk_state {
  tfm_chunk *chunk;
  optim *opt;
  int first_unit, end_unit, stage;
  slot *slots;
  int nslots;
  int *slot_of; /* micro-batch -> slot */
  int slot_of_cap;
  /* PipeDream's weight versions: the stash, the newest, the one in the chunk's values */
  weight_version *versions;
  int nversions, newest, loaded;
} chunk_state;

/* What one run of a schedule reads (pipeline_step.c). */
typedef struct step_ctx {
  const float *x;
  const int32_t *labels;
  int batch, mbs;
  uint64_t step;
  int total; /* micro-batches in the run: m, or m x K in a PipeDream window */
} step_ctx;

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
  /* PipeDream's window (gpu/parallel/pipeline_versions.c), while async is set */
  bool async;
  int win_k, win_total;
  const float *win_lr;
  int *plan_version;             /* [win_total]: the version each micro-batch uses here */
  int *fwd_version, *bwd_version; /* [nchunks * win_total], what was used */
  float *win_sums;               /* [2 K]: loss sum and correct count per mini-batch */
  double *win_loss, *win_acc;    /* [K] */
  fl_tensor win_dev;             /* [2 K] on dev, for a non-host world */
  int peak_versions;
  /* stage replication: my replica and each stage's first rank and count (pipeline ranks) */
  int replica, *stage_rank0, *stage_replicas;
  double link_bytes_per_s;
  fl_tensor moe_sums; /* [3] on dev, for a non-host world: aux loss, choices, dropped */
};


/* ---- transfers (gpu/parallel/pipeline_transfer.c) ---------------------------------------- */

/* Sets up the sender's queue (before anything can fail, so that pp_transfer_stop may run). */
void pp_transfer_init(pp_trainer *t);
/* Starts the sender thread. FL_EINTERNAL when it cannot. */
fl_status pp_transfer_start(pp_trainer *t);
/* Stops the sender thread (when started) and frees the queue and the early messages. */
void pp_transfer_stop(pp_trainer *t);
/* Copies y (on the device) into a message for pipeline rank `peer` and queues it. */
fl_status pp_transfer_send(pp_trainer *t, int peer, int kind, int stage, int mb, const fl_tensor *y);
/* Receives the message (kind, stage, mb) from pipeline rank `peer` into dst (on the device,
 * already shaped): from the mailbox if it came earlier, else from the connection, keeping
 * whatever arrives before it. */
fl_status pp_transfer_recv(pp_trainer *t, int peer, int kind, int stage, int mb, fl_tensor *dst);
/* Waits until the sender thread has sent everything queued. */
fl_status pp_transfer_drain(pp_trainer *t);
/* A host buffer as a tensor of the trainer's cpu device, for the host communicator. */
fl_tensor pp_host_tensor(pp_trainer *t, float *data, size_t count);
/* Sums `count` floats at `host` over the world, in place. The host backend reduces host
 * memory itself; another (NCCL) reduces device memory: dev_buf, made [count] floats here (a
 * trainer tensor it may overwrite). */
fl_status pp_world_sum(pp_trainer *t, float *host, size_t count, fl_tensor *dev_buf);

/* ---- PipeDream's weight versions (gpu/parallel/pipeline_versions.c) --------------------- */

/* Starts a window of K mini-batches of m micro-batches: plans the versions, stashes every
 * chunk's weights as version 0, zeroes the gradients and the records. */
fl_status pp_versions_begin(pp_trainer *t, int minibatches, const float *lr);
/* Loads the version micro-batch mb uses into chunk c's values, recording it for the forward
 * or backward. */
fl_status pp_versions_load(pp_trainer *t, int c, int mb, pp_op_kind kind);
/* After chunk c's backward of mini-batch k's last micro-batch: averages the gradients over
 * the data-parallel group, one optimizer step on the newest
 * weights, drops the versions no micro-batch may still use and stashes the new one. */
fl_status pp_versions_update(pp_trainer *t, int c, int k);
/* The last stage, after mini-batch k's last forward: keeps its loss sum and correct count. */
fl_status pp_versions_take_sums(pp_trainer *t, int k);
/* Ends the window: every chunk's values hold its newest weights; the mini-batches' sums over
 * the world into the stats. */
fl_status pp_versions_end(pp_trainer *t, pp_window_stats *st);
/* Frees the stash and the window's arrays. */
void pp_versions_free(pp_trainer *t);

/* ---- the step's timeline (gpu/parallel/pipeline_timeline.c) ----------------------------- */

/* Seconds since the step started. */
double pp_timeline_now(const pp_trainer *t);
/* Records an event from t0 to now. FL_ENOMEM. */
fl_status pp_timeline_add(pp_trainer *t, pp_event_kind kind, int mb, int chunk, double t0);

#endif /* FLINT_GPU_PIPELINE_INTERNAL_H */
