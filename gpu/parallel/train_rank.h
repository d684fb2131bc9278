/*
 * gpu/parallel/train_rank.h: what the two trainers' barrier tasks and their client share,
 * inside libflint_gpu: gpu/parallel/train_dp.c (the data-parallel models),
 * gpu/parallel/train_hybrid.c (the transformer on a data x tensor x pipeline grid) and
 * gpu/parallel/train_client.c (the client of both). The stage's argument, the reports a rank
 * sends the client, and (gpu/parallel/train_rank.c) joining the ranks and agreeing on counts.
 */
#ifndef FLINT_GPU_TRAIN_RANK_H
#define FLINT_GPU_TRAIN_RANK_H

#include "flint/image.h"
#include "gpu/data/data.h"
#include "gpu/parallel/compress.h"
#include "gpu/parallel/hybrid_cnn.h"
#include "gpu/parallel/train.h"

/* Reports from a rank to the client, as fl_barrier_report messages. REPORT_DIVERGED is
 * instead rank 0's only output record when the loss turned non-finite (step, epoch, loss and
 * lr of the first such step; every rank stopped there and returned FL_OK, so that the stage is
 * not retried): the client fails the run with train_diverged_error. */
enum { REPORT_PROGRESS = 1, REPORT_EPOCH = 2, REPORT_DIVERGED = 3 };
/* REPORT_PROGRESS messages per epoch (at most; rank 0 sends them). */
#define TRAIN_PROGRESS_REPORTS_PER_EPOCH 20
typedef struct train_report {
  uint32_t kind, epoch, epochs, attempt; /* epoch: 1-based */
  uint64_t step, steps_per_epoch, done;  /* step: global steps so far; done: this epoch's */
  double loss, acc, test_loss, test_acc, lr, images_per_s, seconds;
  uint32_t resumed_epoch;                /* the epochs this attempt restored */
  uint32_t buckets;                      /* allreduces of the last step's gradients */
  int64_t pid;                           /* rank 0's process */
  double bubble, bubble_theory;          /* transformer: the epoch's mean, and the theory */
  uint32_t tau;                          /* local SGD, AdaComm: the period now (0: bsp) */
  uint64_t reduced_bytes;                /* bytes this rank allreduced so far (payload) */
  double loss_scale;                     /* fp16: the loss scale now (0: no scaler) ... */
  uint64_t skipped_steps;                /* ... and the steps it skipped so far */
  /* The data-parallel models, rank 0's, this epoch so far: seconds its thread waited in
   * data_reader_next for training batches, seconds it spent copying them to the device, and
   * the training part of `seconds` (steps only, no evaluation). */
  double input_wait_s, upload_s, train_s;
  uint64_t max_staleness;                /* asp, ssp: the epoch's most steps a pull was behind */
  uint32_t allreduce_algos;              /* what this rank's allreduces ran so far: bits
                                          * train_allreduce_bit (0: none yet, or not counted) */
  uint64_t sent_bytes;                   /* bytes this rank handed to collectives so far:
                                          * reduced_bytes, or the compressed payload */
  double link_bytes_per_s;               /* transformer: the link between stages, measured */
  double aux_loss, dropped_fraction;     /* transformer with experts: means so far this epoch */
} train_report;

/* train_report.allreduce_algos: bit (1u << algo) for each host algorithm that ran (what AUTO
 * picked for each size), or TRAIN_ALLREDUCE_NCCL (NCCL picks its own). */
#define TRAIN_ALLREDUCE_NCCL (1u << 31)
/* The bit of one allreduce of `bytes` over `comm` with `algo` (0 for a NULL comm). Reads only
 * what the communicator fixed when it was made, so any thread may call it. */
uint32_t train_allreduce_bit(const fl_comm *comm, fl_allreduce_algo algo, size_t bytes);

/* The most bytes of a parameter-server table's handle (a few hundred) the argument carries. */
#define TRAIN_PS_HANDLE_MAX 2048

/* The stage's argument: plain values only (it travels to executors as bytes). */
typedef struct train_arg {
  nn_model_kind model;
  fl_device_kind device;
  uint32_t ranks, batch, epochs; /* ranks: the world (dp x tp x pp for the transformer) */
  uint32_t channels, height, width, classes;
  uint64_t seed;
  optim_options optim;
  double clip_grad_norm; /* > 0: clip the averaged gradients to this global norm */
  float label_smoothing; /* the training loss's, in [0, 1) (evaluation: none) */
  fl_precision precision; /* every rank's device's (fp16: with a loss scaler) */
  optim_schedule schedule;
  fl_allreduce_algo allreduce;
  uint64_t bucket_bytes;
  bool emit_checkpoint; /* rank 0 emits the final checkpoint blob after its result */
  /* NN_LIBRARY: the library's bytes as a broadcast, its builder's symbol, its name */
  uint64_t model_library_id; /* 0: none shipped (the builder below, in the client's process) */
  char model_symbol[64];
  char model_library_name[192];
  uint64_t builder_fn; /* fl_train's builder, callable where the process is the client's */
  int64_t client_pid;
  uint32_t sample_ndim; /* the model's input: {F} (1), {H, W} (2) or {C, H, W} (3, and 0) */
  bool resume;          /* --resume: a first attempt starts from broadcast resume_id's blob */
  uint64_t resume_id;
  bool shuffle;
  bool overlap; /* buckets allreduced on the communication thread during backward */
  gpu_train_sync sync; /* bsp: gradients every step; local, adacomm: weights every tau steps */
  uint32_t tau;
  uint32_t accumulate; /* micro-batches per step, >= 1, dividing batch / ranks */
  compress_spec compress; /* bsp's gradient compression hook (kind none: plain allreduces) */
  /* the transformer (gpu/parallel/train_hybrid.c) */
  uint32_t dp, tp, pp, microbatches, chunks;
  pp_schedule pipeline;
  bool recompute;
  uint32_t hidden, heads, ffn, blocks;
  float dropout;
  /* --data imagefolder: the training split is image records, transformed by `aug` as the
   * rank's reader hands them out (data_reader_set_transform). */
  bool augment;
  fl_image_transform aug;
  /* --sync asp and ssp:S (gpu/parallel/train_ps.c): the table's handle and Downpour's periods */
  uint32_t staleness, ps_fetch, ps_push;
  double wall_t0; /* the client's wall clock (seconds) as the job started: rows' elapsed time */
  uint32_t ps_handle_len;
  uint8_t ps_handle[TRAIN_PS_HANDLE_MAX];
  bool trick; /* --model cnn --trick (gpu/parallel/train_trick.c) */
  /* the transformer's pipedream and 2bw schedules: mini-batches per window, vertical sync */
  uint32_t window;
  bool vertical_sync;
  /* --model gpt: the transformer's GPT form on windows of seq bytes (width seq + 1) */
  bool gpt;
  uint32_t seq;
  bool sequence_parallel, recompute_selective;
  /* --plan auto: the plan's stage cut (pp + 1 unit boundaries) when plan_cut; else the
   * partitioner's */
  bool plan_cut;
  int32_t plan_bounds[GPU_TRAIN_MAX_STAGES + 1];
  /* the transformer's replicated stages (gpu_train_options.replicas; all 0: none) */
  uint32_t replicas[GPU_TRAIN_MAX_STAGES];
  uint32_t replicas_auto; /* --replicas auto:W: W (0: off) */
  /* --experts (0: none) and the rest with their defaults applied */
  uint32_t experts, top_k, moe_every;
  float capacity_factor, moe_alpha;
} train_arg;

/* Joins the stage's ranks into one communicator: NCCL for cuda unless `host` is set or
 * FLINT_TRAIN_COMM=host (NCCL needs a GPU per rank), else the host backend listening on
 * FLINT_COMM_HOST (default 127.0.0.1) with `algo`. This task is rank comm_rank in it (-1:
 * its barrier rank; the ranks must be a permutation of 0 .. world - 1). Collective over the
 * stage. */
fl_status train_connect(fl_barrier *b, fl_device *dev, fl_device_kind kind, fl_allreduce_algo algo,
                        bool host, int comm_rank, fl_comm **out);
/* Opens the rank's device: cuda on its executor's GPU (else rank mod the GPUs), or the cpu;
 * its products in `precision`. */
fl_status train_device_open(fl_barrier *b, fl_device_kind kind, fl_precision precision, fl_device **out);
/* True when train_connect(host = false) makes a NCCL communicator. */
bool train_uses_nccl(fl_device_kind kind);
/* The test-only straggler of the consistency benchmarks, FLINT_PS_SLOW_WORKER=K:F (one
 * setting for the parameter servers' workers, which fl_ps_clock slows, and the data-parallel
 * ranks): F for rank K, else 1 (a malformed value is warned about and ignored). */
double train_slowdown_of(uint32_t rank);
/* Sleeps (factor - 1) times the time since `since` (common_now_s): a step that took factor
 * times as long. factor <= 1: returns at once. */
void train_straggle(double factor, double since);
/* The smallest of every rank's `mine`, on every rank. */
fl_status train_agree_min(fl_barrier *b, uint64_t mine, uint64_t *out);
/* One test batch of n images, read into the buffers the caller gave train_evaluate_share:
 * its loss sum and correct count (the trainer's, whose forward may be collective). */
typedef fl_status (*train_eval_batch_fn)(void *user, uint32_t n, double *loss_sum, double *correct);
/* The test set's loss and accuracy over every rank's smallest common share (so that every rank
 * runs as many batches: a batch's forward may be a collective): starts `test`'s epoch
 * (unshuffled), reads its batches into images and labels, cuts the last to the share and
 * hands each to `batch`; the sums are divided by share x world x `units` (what one image
 * predicts: 1, or a GPT window's bytes). Collective over the barrier. */
fl_status train_evaluate_share(fl_barrier *b, data_reader *test, uint64_t seed, uint32_t epoch, float *images,
                               int32_t *labels, uint32_t units, train_eval_batch_fn batch, void *user, double *loss,
                               double *acc);

/* ---- the model (gpu/parallel/train_model.c) ---- */
/* The client's check of a model library: reads `path` into *bytes, loads it, finds `symbol`
 * and builds its model for the data's shape once (on `dev`, or a cpu device when NULL); the
 * model goes to *model when that is not NULL. Errors name the file: FL_ENOENT/FL_EIO (the
 * file), FL_EFORMAT (not a loadable library), FL_ENOENT (no such symbol), the builder's own
 * status, FL_EINVAL (an output that is not [n, classes]). */
fl_status train_model_library_read(const char *path, const char *symbol, uint32_t ndim, uint32_t channels,
                                   uint32_t height, uint32_t width, uint32_t classes, uint64_t seed, fl_buf *bytes,
                                   fl_device *dev, nn_model **model);
/* The model of `builder` (in this process) for samples of `ndim` dimensions (the last of
 * c x h x w), checked as the library's are; `what` names it in messages. */
fl_status train_model_build_with(fl_model_builder builder, const char *what, fl_device *dev, uint32_t ndim, uint32_t c,
                                 uint32_t h, uint32_t w, uint32_t classes, uint64_t seed, nn_model **out);
/* The run's model on a rank's device: nn_model_create for the built-in kinds; for NN_LIBRARY
 * the client's builder itself in the client's process (local mode), else the shipped
 * library's. */
fl_status train_model_build(const train_arg *a, fl_device *dev, nn_model **out);

/* The barrier tasks, shipped by symbol (exported for the flint command's executors). */
FL_API fl_status gpu_train_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg);
FL_API fl_status gpu_train_hybrid_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg);

/* ---- parameter-server modes (gpu/parallel/train_ps.c) ---- */
/* --sync asp and ssp:S, run by the client: makes the model's table on the servers from
 * `model` (the client's copy, built from the seed on a cpu device; one without batch-norm
 * statistics), runs the workers (ordinary tasks, one per partition of `pair`, with `a`), then
 * hands each epoch's row to `on_row` as a train_report's bytes (as the ranks' reports), in
 * order. *last: the last row, or a REPORT_DIVERGED report; *sum: what the run's result adds;
 * with a->emit_checkpoint, *checkpoint: the servers' final
 * weights as a checkpoint blob (no optimizer state). FL_ESLOTS with fewer task slots than
 * workers; the job's and the servers' errors. */
typedef struct train_ps_summary {
  uint64_t max_staleness;
  uint32_t resumed_workers;
  uint64_t worker_steps_min; /* the fewest steps the servers' clocks hold for a worker */
} train_ps_summary;
fl_status train_ps_run(fl_context *ctx, const gpu_train_options *o, train_arg *a, fl_dataset *pair, nn_model *model,
                       void (*on_row)(uint32_t rank, fl_bytes row, void *user), void *user, train_report *last,
                       fl_buf *checkpoint, train_ps_summary *sum);
/* The workers' task function, shipped by symbol. */
FL_API fl_status gpu_train_ps_worker(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg);

/* The client's side of a transformer run: `ranks` is rank 0's second output record (every
 * rank's peak activation bytes and its last step's timeline); fills res->stages and
 * res->stage_peak_bytes and writes the timeline files the options name. FL_EFORMAT for a
 * malformed record, FL_EIO for the files. */
fl_status train_hybrid_finish(const gpu_train_options *o, fl_bytes ranks, gpu_train_result *res);
/* --plan auto: profiles the transformer of o (its images channels x height x width of
 * `classes`), searches the plan for o->plan_world ranks, prints it on o->plan_report and sets
 * o's ranks, tp, pp and microbatches and a's stage cut to it; res gets its grid and
 * prediction. FL_EINVAL or FL_ELIMIT (nothing fits --plan-memory) naming the cause. */
fl_status train_plan_choose(gpu_train_options *o, uint32_t channels, uint32_t height, uint32_t width,
                            uint32_t classes, train_arg *a, gpu_train_result *res);
/* The same record's forwards and backwards of one data-parallel, tensor-parallel replica (dp
 * and tp index 0), a stage a row, as TrainPipeline's Stages (docs/ui.md): a JSON array into
 * *out, times in ms since the step's start (the measured last step). Left empty when the
 * record is malformed or the text would pass TRAIN_PIPELINE_JSON_MAX (the UI's limit on an
 * event is 64 KiB). */
#define TRAIN_PIPELINE_JSON_MAX (60u << 10)
void train_hybrid_pipeline_json(const gpu_train_options *o, fl_bytes ranks, fl_buf *out);

/* ---- the run's events for the web UI (gpu/parallel/train_events.c) ---- */
typedef struct train_events {
  fl_context *ctx;
  uint64_t run;     /* TrainStart's Run: unique within the process */
  int64_t start_ms; /* its Time, kept when it is posted again */
  uint32_t algos;   /* the allreduce algorithms its configuration names (train_allreduce_bit) */
} train_events;
/* Posts TrainStart (the options as its Config). */
void train_events_start(train_events *ev, fl_context *ctx, const gpu_train_options *o);
/* A TrainStep for a REPORT_PROGRESS or REPORT_EPOCH report (others: nothing); TrainStart
 * again first when the report names allreduce algorithms the configuration did not. */
void train_events_report(train_events *ev, const gpu_train_options *o, const train_report *rep);
/* TrainPipeline with `stages` (train_hybrid_pipeline_json's; empty: nothing). */
void train_events_pipeline(train_events *ev, const fl_buf *stages);
/* TrainEnd: FINISHED, or FAILED with the thread's message, which it leaves as it found it. */
void train_events_end(train_events *ev, fl_status status);

/* ---- --model cnn --trick (gpu/parallel/train_trick.c) ---- */
/* The width of its two hidden FC layers: --ranks must divide it. */
#define TRICK_FC 512
/* Its network (gpu/parallel/hybrid_cnn.h) for the data's images. */
hcnn_spec train_trick_spec(uint32_t channels, uint32_t height, uint32_t width, uint32_t classes, uint64_t seed);
FL_API fl_status gpu_train_trick_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg);

#endif /* FLINT_GPU_TRAIN_RANK_H */
