/*
 * gpu/parallel/pipeline.h: hybrid data x tensor x pipeline parallel training of the transformer
 * (gpu/parallel/transformer.h) on a grid of ranks, one trainer per rank.
 *
 * The grid. world = dp x tp x pp ranks, tensor-parallel ranks innermost (they exchange the
 * most, so they are neighbours, as Megatron-LM places them):
 *   rank = (pp_index * dp + dp_index) * tp + tp_index.
 * Each rank splits the world communicator into one communicator per dimension
 * (fl_comm_split): its tensor-parallel group (allreduces inside the blocks), its
 * data-parallel group (gradient averaging after backward) and its pipeline group (the
 * activations and their gradients between stages).
 *
 * The stages. The model's units are cut into pp x v contiguous stages (v = chunks per
 * pipeline rank, > 1 only for the interleaved schedule), by the caller or, when no cut is
 * given, balanced by PipeDream's partitioner (pp_partition) over a profile that world rank 0
 * measures (each unit's forward and backward time at the micro-batch size) and broadcasts.
 * Pipeline rank r holds stages r, r + pp, ... (pp_stage_of).
 *
 * One step. The replica's mini-batch is cut into m micro-batches; each pipeline rank runs its
 * operations in the schedule's order (gpu/parallel/pipeline_schedule.h). A forward takes its
 * input from the batch (first stage) or receives it from the previous stage; the last stage's
 * forward computes the loss (the mean over the replica's batch) and keeps the logit gradient
 * for that micro-batch's backward. Backward receives the output gradient from the next
 * stage, ACCUMULATES parameter gradients and sends the input gradient back. Every chunk
 * holds one activation slot per micro-batch in flight, so GPipe holds m and 1F1B at most pp
 * (the peak is measured); with recompute a chunk keeps only its stage inputs and runs the
 * forward again right before each backward (Chen et al.'s checkpointing at stage borders).
 * After the last backward the data-parallel group averages every chunk's gradients, and one
 * SGD step per chunk follows: the update of the whole mini-batch, as one rank would take it.
 *
 * Transfers between stages never block the sender: a rank's sends go through its own sender
 * thread (a queue of copies), receives block. That is the semantics under which the
 * schedules are proved deadlock-free (pp_schedule_simulate). Each message carries a header
 * (kind, stage, micro-batch, length) and a receiver keeps messages that arrive ahead of the
 * one it waits for, so order between two ranks never matters (with pp = 2 and interleaving,
 * activations and gradients share one connection). Transfers go over the host backend
 * through host memory (cuda activations are copied out and in): the pipeline communicator
 * must be a host one (pp_options.stage_world, when the world is NCCL); tensor and data
 * parallel groups use the world's backend.
 *
 * The timeline. Each step records this rank's forwards, backwards, receive waits, sends,
 * gradient averaging and optimizer step (seconds from the step's start, which a barrier
 * aligns across ranks), and measures the pipeline's bubble: 1 - (sum of the pipeline
 * group's busy time) / (pp x the time until its last backward ends).
 *
 * Threading: one trainer per rank, used by that rank's thread (plus its own sender thread).
 */
#ifndef FLINT_GPU_PIPELINE_H
#define FLINT_GPU_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/nn/nn.h"
#include "gpu/parallel/pipeline_schedule.h"
#include "gpu/parallel/transformer.h"

typedef struct pp_grid {
  int dp, tp, pp;
} pp_grid;

typedef struct pp_coords {
  int dp, tp, pp;
} pp_coords;

/* FL_EINVAL naming the dimension when one is < 1 or dp x tp x pp != world. */
fl_status pp_grid_check(pp_grid g, int world);
pp_coords pp_grid_coords(pp_grid g, int rank);
int pp_grid_rank(pp_grid g, pp_coords c);
/* Parses "DxTxP" (e.g. "2x1x2"); FL_EINVAL naming the text. */
fl_status pp_grid_parse(const char *text, pp_grid *out);

typedef enum pp_event_kind {
  PP_EV_FORWARD = 0,
  PP_EV_BACKWARD,
  PP_EV_RECV,      /* waiting for an activation or a gradient */
  PP_EV_SEND,      /* copying a message out for the sender thread */
  PP_EV_ALLREDUCE, /* the data-parallel gradient average */
  PP_EV_OPTIMIZER,
  PP_EV_KINDS
} pp_event_kind;
const char *pp_event_kind_name(pp_event_kind k);

typedef struct pp_event {
  pp_event_kind kind;
  int microbatch, chunk; /* -1 for events of the whole step */
  double t0, t1;         /* seconds since the step's start */
} pp_event;

typedef struct pp_options {
  tfm_spec spec;
  pp_grid grid;
  pp_schedule schedule;
  int microbatches; /* m >= 1 */
  int chunks;       /* v: chunks per pipeline rank; 1 unless interleaved (0: 1) */
  bool recompute;   /* keep stage inputs only; forward again before each backward */
  /* pp x v + 1 unit boundaries (0 = b[0] < b[1] < ... = tfm_units), or NULL: balanced. */
  const int *bounds;
  optim_options optim; /* each chunk's optimizer (gpu/nn/nn.h) */
  /* Tests and benchmarks: each forward also sleeps this long and each backward twice as
   * long, so that stages have a known equal cost even with more ranks than cores. */
  double synthetic_forward_s;
  /* The communicator the pipeline groups are split from (NULL: world). Stages exchange
   * activations over the host backend, so with a NCCL world (cuda, a GPU per rank) the
   * caller passes a host communicator over the same ranks here; borrowed, it must outlive
   * the trainer. Collective like world: every rank passes one or none. */
  fl_comm *stage_world;
  /* PP_PIPEDREAM only: every stage uses, for a micro-batch, the weight version that was the
   * first stage's newest when the micro-batch entered it (pipeline_schedule.h). */
  bool vertical_sync;
  /* Stage replication (PipeDream's 1F1B-RR): replicas[s] ranks run stage s, taking its
   * micro-batches round robin (pp_replica_of); the stage's replicas of every data-parallel
   * pipeline sum their gradients (each took its micro-batches' share of the global batch's
   * mean) after the flush, or under pipedream and 2bw at each update (pp_replicated_ops).
   * grid.pp entries, NULL: one each. Only with tp 1, one chunk and any schedule but
   * interleaved; the world then has dp x S ranks (S = sum(replicas)): pipeline d is ranks
   * [d S, (d + 1) S), its stage s on the ranks after those of stages 0..s-1. Borrowed during
   * pp_trainer_create. */
  const int *replicas;
  /* > 0: replicated stages chosen by PipeDream's partitioner (pp_partition_replicated) over a
   * pipeline of this many ranks, at most grid.pp stages: world rank 0 profiles the units and
   * the link to world rank 1 and broadcasts the cut and the replica counts (then read them
   * with pp_trainer_num_stages, pp_trainer_stage_replicas, pp_trainer_bounds). The world is
   * dp x replicas_auto ranks; tp 1, one chunk, not interleaved, replicas and bounds NULL. */
  int replicas_auto;
} pp_options;

typedef struct pp_step_stats {
  double loss;     /* mean over the global batch (the same on every rank) */
  double accuracy; /* fraction of the global batch whose argmax was the label */
  double seconds;  /* the step on this rank, from the aligned start to its end */
  double busy_s;   /* forward and backward time of this rank */
  double pipeline_s; /* until the pipeline group's last backward ended */
  double bubble;     /* measured, over the pipeline group */
  double bubble_theory;
  size_t peak_activation_bytes; /* this rank's chunks and stashed inputs, most at once */
  const pp_event *events;       /* this rank's timeline (owned by the trainer, valid until the next step) */
  size_t num_events;
  /* Mixture of experts (spec.experts > 0; else 0): the balancing loss of the step (weighted,
   * a mean over the global batch's samples; not in loss) and the fraction of the expert
   * choices dropped over capacity. */
  double aux_loss;
  double dropped_fraction;
} pp_step_stats;

/* What pp_trainer_train_window reports. The arrays are the trainer's, valid until its next
 * call. */
typedef struct pp_window_stats {
  pp_step_stats step;  /* the window as one step: loss and accuracy its mean, the bubble, the
                        * timeline */
  int minibatches, microbatches; /* K and M = m x K */
  const double *loss, *accuracy; /* [K]: each mini-batch's over the global batch */
  /* [c * M + i]: the weight version that micro-batch i's forward and backward used on this
   * rank's local chunk c (version j: the chunk's weights after j of the window's updates) */
  const int *forward_version, *backward_version;
  int peak_versions; /* the most weight versions one chunk kept at once */
  int updates;       /* updates applied per chunk (K) */
} pp_window_stats;

typedef struct pp_trainer pp_trainer;

/* Collective over world (every rank calls it with the same options): splits the grid's
 * communicators, cuts the model (profiling it when o->bounds is NULL) and builds this
 * rank's chunks. */
fl_status pp_trainer_create(fl_device *dev, fl_comm *world, const pp_options *o,
                            pp_trainer **out);
void pp_trainer_destroy(pp_trainer *t);

/* Forward and backward of one mini-batch: afterwards every chunk's gradients are the mean
 * gradient over the global batch (averaged over the data-parallel group). x: this replica's
 * batch rows [batch, seq, features] and labels [batch] (GPT: token ids [batch, seq, 1] and
 * the next tokens [batch, seq]; loss and accuracy are then per token), host memory (every rank of the
 * replica passes the same; the first stage reads x, the last the labels); m must divide
 * batch. The replica's rows are rows [dp_index x batch, ...) of the global batch (dropout
 * keys), as a single rank with batch x dp would take them. */
fl_status pp_trainer_compute_gradients(pp_trainer *t, const float *x, const int32_t *labels,
                                       int batch, uint64_t step, pp_step_stats *stats);
/* Evaluation (no dropout, no gradients) of a replica's batch, micro-batched as training is
 * when m divides batch: the loss sum and the correct count over the world's batches (GPT:
 * over their tokens). */
fl_status pp_trainer_evaluate(pp_trainer *t, const float *x, const int32_t *labels, int batch,
                              double *loss_sum, double *correct);
/* PipeDream (o->schedule PP_PIPEDREAM or PP_2BW; collective over world): trains K =
 * minibatches mini-batches of `batch` rows back to back without a flush between them (see
 * "Asynchronous schedules" in pipeline_schedule.h): x holds this replica's K batches one after
 * another ([K x batch, seq, features], host), labels likewise, lr[k] is mini-batch k's rate and
 * step0 + k its step (dropout keys). Each chunk applies mini-batch k's update right after its
 * backward of the mini-batch's last micro-batch (the data-parallel group averaging the
 * gradients first), keeping one weight version per
 * micro-batch in flight so that each backward uses its forward's weights. The pipeline drains
 * at the window's end, when every chunk holds its newest weights. A window of one mini-batch
 * with vertical sync is exactly GPipe's step and update. FL_EINVAL for another schedule, K < 1,
 * a batch m does not divide or a NULL argument. */
fl_status pp_trainer_train_window(pp_trainer *t, const float *x, const int32_t *labels, int batch,
                                  int minibatches, uint64_t step0, const float *lr,
                                  pp_window_stats *stats);

/* The bandwidth between pipeline stages that the partitioner used, in bytes per second:
 * measured at creation by timed transfers between world rank 0 and the next stage's first
 * rank (0 with one stage or a given cut). */
double pp_trainer_link_bytes_per_s(const pp_trainer *t);

/* One SGD step of every chunk at rate lr, then zeroes the gradients. */
fl_status pp_trainer_apply(pp_trainer *t, float lr, pp_step_stats *stats);

pp_coords pp_trainer_coords(const pp_trainer *t);
int pp_trainer_num_chunks(const pp_trainer *t);
tfm_chunk *pp_trainer_chunk(pp_trainer *t, int chunk);
/* The optimizer of local chunk c (its state, for checkpoints). */
optim *pp_trainer_chunk_optimizer(pp_trainer *t, int chunk);
/* The unit range [*first, *end) of local chunk c. */
void pp_trainer_chunk_units(const pp_trainer *t, int chunk, int *first, int *end);
/* The stage boundaries in use (pp x v + 1 of them). */
const int *pp_trainer_bounds(const pp_trainer *t);
/* The pipeline's stages (pp x v; with replicas_auto, the partitioner's count) and stage s's
 * replicas (1 unreplicated; 0 for a stage out of range). */
int pp_trainer_num_stages(const pp_trainer *t);
int pp_trainer_stage_replicas(const pp_trainer *t, int stage);

/* The timelines of a step as an SVG chart, one row per rank (events[r], n[r]), coloured by
 * kind, with the measured and theoretical bubble in the title. */
fl_status pp_timeline_write_svg(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n, double seconds, const char *title);
/* The same as CSV rows: rank,kind,microbatch,chunk,t0,t1. */
fl_status pp_timeline_write_csv(const char *path, int ranks, const pp_event *const *events,
                                const size_t *n);

#endif /* FLINT_GPU_PIPELINE_H */
