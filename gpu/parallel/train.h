/*
 * gpu/parallel/train.h: synchronous data-parallel training, the engine behind `flint train`.
 *
 * gpu_train_run loads the data set into a cached dataset of image blocks (gpu/data/data.h) with
 * one partition per rank and runs ONE barrier stage over it (fl_barrier_map_partitions):
 * rank r reads partition r into host memory, opens its device, builds the model from the
 * same seed as every other rank, joins the communicator, and then, for each epoch:
 *   - takes steps_per_epoch steps (the same count on every rank: the smallest rank's
 *     full batches), each: forward, loss, backward whose grads-ready callback hands buckets
 *     of the flat gradient buffer, as they become final, to the rank's communication thread,
 *     which allreduces (averages) them in order while backward goes on (opts->overlap; else
 *     the callback allreduces each one itself); then, once every bucket is reduced, clipping
 *     to opts->clip_grad_norm when set and one optimizer step (opts->optim) at the schedule's
 *     rate for (epoch + step / steps_per_epoch);
 *   - evaluates on the test set (each rank its share of the test blocks, sums allreduced);
 *   - puts a checkpoint of weights, batch-norm buffers, optimizer state and position
 *     (fl_barrier_checkpoint_put), then reports the epoch's row to the client
 *     (fl_barrier_report): an epoch the client has seen is one a retry will not redo.
 * A retried attempt (fl_barrier_attempt > 0) restores the last checkpoint
 * (fl_barrier_checkpoint_get) and goes on from the epoch after it; its reports and the
 * result say which epoch it resumed from (resumed_epoch), and its rows replace the rows of
 * the epochs it repeats, so the curves keep one row per epoch. A first attempt (or a retry
 * before any epoch was put) given opts->resume_path starts the same way from that file's
 * checkpoint, which the client checked against the model and broadcast to the ranks.
 *
 * On the client, the reports drive the progress line (opts->progress) and the curves, which
 * are written to opts->csv_path and opts->svg_path at the end.
 *
 * Batch semantics: `batch` is the GLOBAL mini-batch (all ranks together), as in Goyal et al.;
 * each rank takes b = batch / ranks images a step, so batch must be a multiple of ranks. The
 * rate follows the linear scaling rule: peak = lr * batch / 256. With gradient accumulation
 * (accumulate = K > 1) a rank's b images go through forward and backward as K micro-batches
 * of b / K, each loss scaled by 1 / b so that the gradients add up to the mean over b, and
 * the allreduce runs once, after the last: the step and the rate are the same.
 *
 * Which images a rank takes. Training images are assigned to ranks interleaved, as PyTorch's
 * DistributedSampler does: of R ranks, rank r holds images r, r + R, r + 2R, ... (of the
 * first max_train_images images when that is set). Without shuffling (shuffle = false), rank
 * r's k-th batch is images {(k b + j) R + r : j < b}, and the union over the ranks is exactly
 * images [k B, (k + 1) B): the global batch a 1-rank run with batch B takes at step k. Each
 * rank's loss is the mean over its b images and the gradients are AVERAGED over ranks, so
 * the step is the gradient of the mean over the global batch, as with 1 rank: R ranks and 1
 * rank reach the same weights up to float rounding (tests/test_gpu_train.c checks it).
 * With shuffle (the default), each epoch every rank permutes the positions of its own
 * images with the same seeded permutation (seed, epoch): ranks hold disjoint images, and a
 * global permutation of the whole set would need every rank to hold every image. The
 * epoch's batches are then a seeded shuffle of groups of R images {g R + r : r < R}, which
 * depends on R: only runs without shuffling are equivalent across R.
 *
 * --model transformer (gpu/parallel/train_hybrid.c) runs the same client over a dp x tp x pp
 * grid of ranks instead: ranks x tp x pp barrier tasks, the transformer cut and split by
 * gpu/parallel/pipeline.h, batches gathered per replica, a sharded checkpoint, and the bubble,
 * the stages' peak activations and the last step's timelines in the result and files.
 *
 * Environment (read by each rank): FLINT_COMM_HOST, the address a rank's host-backend
 * endpoint listens on and its peers dial (default 127.0.0.1: one machine);
 * FLINT_TRAIN_COMM=host to use the host backend for cuda ranks too (NCCL, the default, needs a
 * GPU per rank).
 */
#ifndef FLINT_GPU_TRAIN_H
#define FLINT_GPU_TRAIN_H

#include <stdio.h>

#include "flint/gpu.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"
#include "gpu/parallel/pipeline_schedule.h"

typedef enum gpu_train_dataset {
  GPU_TRAIN_FASHION_MNIST = 0,    /* 60000 + 10000 images 1x28x28, 10 classes */
  GPU_TRAIN_SYNTHETIC_IMAGENET = 1, /* seeded 3x224x224 images, 1000 classes (throughput) */
  /* Files named by data_path and test_path ("FORMAT:PATH"): */
  GPU_TRAIN_LIBSVM = 2, /* rows of features, 1 x 1 x F (fl_ml_load), classes from the labels */
  GPU_TRAIN_CSV = 3,    /* the same from CSV: the label in the first column, no header */
  GPU_TRAIN_IDX = 4,    /* an IDX pair "IMAGES,LABELS": 1 x H x W images, 10 classes */
  GPU_TRAIN_EXAMPLES = 5, /* flint datasets of example records (fl_train; options' examples) */
  /* "imagefolder:DIR": DIR/train and DIR/val, or DIR and test_path when given, each
   * CLASS/NAME.jpg|jpeg|png (include/flint/image.h): 3 x image_size^2 images */
  GPU_TRAIN_IMAGE_FOLDER = 6,
  /* "text:PATH": byte-level text (gpu/data/text.c), windows of seq + 1 bytes, the last tenth
   * of the file held out as the test set; for --model gpt only */
  GPU_TRAIN_TEXT = 7,
} gpu_train_dataset;

/* One epoch as the ranks report it (to on_epoch). */
typedef struct gpu_train_epoch {
  uint32_t epoch, epochs;  /* 1-based */
  uint32_t attempt;        /* the stage attempt that trained it (0: the first) */
  uint32_t resumed_epoch;  /* epochs that attempt restored from the checkpoint (0: none) */
  uint64_t step;           /* optimizer steps so far */
  double train_loss, train_acc, test_loss, test_acc, lr, images_per_s, seconds;
  int64_t pid;             /* the process of the task running rank 0 (an executor's in
                            * cluster mode, this one's in local mode) */
  uint32_t tau;            /* local SGD and AdaComm: the period at the epoch's end (0: bsp) */
  uint64_t reduced_bytes;  /* a rank's bytes of gradients or weights allreduced so far */
  double loss_scale;       /* --precision fp16: the loss scale after the epoch (0: none) */
  uint64_t skipped_steps;  /* and the steps skipped for overflowed gradients so far */
  /* Data-parallel models (0 for the transformer): rank 0's seconds blocked in the reader for
   * training batches, copying them to the device, and training (the steps, no evaluation). */
  double input_wait_s, upload_s, train_seconds;
  uint64_t max_staleness;  /* asp and ssp: this epoch's (see gpu_train_result) */
  uint64_t sent_bytes;     /* a rank's bytes handed to collectives so far: reduced_bytes, or
                            * less with --compress (compress.h's measure) */
} gpu_train_epoch;

/* How the data-parallel ranks keep their replicas together (--sync). */
typedef enum gpu_train_sync {
  GPU_TRAIN_SYNC_BSP = 0,     /* every step allreduces the gradients: synchronous SGD */
  GPU_TRAIN_SYNC_LOCAL = 1,   /* local SGD: each rank steps alone; the weights are averaged
                               * every tau steps (and at each epoch's end) */
  GPU_TRAIN_SYNC_ADACOMM = 2, /* local SGD whose period adapts (Wang and Joshi's AdaComm):
                               * tau starts at tau and shrinks as the training loss falls */
  /* Parameter-server modes (gpu/parallel/train_ps.c): the weights live in one table on the
   * parameter servers (flint/ps.h) and the ranks are its workers, ordinary tasks that pull
   * weights and push gradients (Downpour SGD, Dean et al.): */
  GPU_TRAIN_SYNC_ASP = 3,     /* workers never wait for each other */
  GPU_TRAIN_SYNC_SSP = 4,     /* a worker at most `staleness` steps ahead of the slowest
                               * waits (Ho et al.); 0 is synchronous SGD through the servers */
} gpu_train_sync;

/* True for asp and ssp: the modes whose workers are parameter-server workers. */
#define GPU_TRAIN_SYNC_IS_PS(s) ((s) == GPU_TRAIN_SYNC_ASP || (s) == GPU_TRAIN_SYNC_SSP)

/* Most pipeline stages (--pp), whose peak activation memory a result reports. */
#define GPU_TRAIN_MAX_STAGES 64

typedef struct gpu_train_options {
  const char *master;    /* the context's master (NULL: "local[*]") */
  nn_model_kind model;   /* mlp, cnn, resnet18 */
  gpu_train_dataset data;
  const char *data_dir;  /* Fashion-MNIST's folder (NULL: /usr/share/datasets/fashion-mnist) */
  uint64_t synthetic_train_images; /* synthetic-imagenet images per epoch (0: 4 * batch) */
                                   /* (an image is 588 KiB: cached, and copied by its rank) */
  uint64_t synthetic_test_images;  /* (0: batch) */
  uint32_t ranks;        /* data-parallel ranks, >= 1: one barrier task each (asp, ssp: one
                          * ordinary task each, the parameter servers' workers) */
  fl_device_kind device; /* cpu, or cuda (rank r uses the GPU of its executor, else r mod GPUs) */
  uint32_t batch;        /* the global batch, a multiple of ranks */
  double lr;             /* base rate for a batch of 256 (linear scaling), > 0 */
  double warmup_epochs;  /* gradual warmup, >= 0 and < epochs */
  uint32_t epochs;       /* >= 1 */
  optim_decay decay;     /* after warmup: none, step (x0.1 at milestones), cosine or poly (to 0) */
  double milestones[OPTIM_MAX_MILESTONES]; /* step decay's epochs (0 of them: 50% and 75%) */
  int num_milestones;
  double decay_power;    /* poly decay's power (0: 2) */
  optim_options optim;   /* the optimizer and its settings (gpu/nn/nn.h): sgd by default */
  double clip_grad_norm; /* > 0: clip the averaged gradients to this global norm each step */
  double label_smoothing; /* the training loss's, in [0, 1): PyTorch's CrossEntropyLoss's */
  fl_precision precision; /* of the matrix products (flint/gpu.h); not fp32: cuda only; fp16
                           * trains with dynamic loss scaling */
  uint64_t seed;         /* weights, shuffles and synthetic data */
  fl_allreduce_algo allreduce; /* host backend's algorithm */
  size_t bucket_bytes;   /* gradient bytes per allreduce bucket (0: 4 MiB) */
  gpu_train_sync sync;   /* bsp (default), local SGD or AdaComm: data-parallel models only */
  uint32_t tau;          /* local SGD's period, AdaComm's first one, in steps (>= 1) */
  bool overlap;          /* allreduce buckets on a communication thread while backward goes
                          * on (default); false: in backward's callback, holding it up */
  const char *csv_path;  /* curves as CSV (NULL: not written) */
  const char *svg_path;  /* curves as SVG (NULL: not written) */
  const char *checkpoint_path; /* the final checkpoint blob (gpu/nn/nn.h; NULL: not written) */
  const char *resume_path; /* start from this checkpoint file (what checkpoint_path wrote; NULL: from
                            * scratch): training goes on from its epoch to `epochs`. Data-parallel
                            * models only; a file that is not a checkpoint of this model is FL_EFORMAT
                            * / FL_EINVAL naming it. */
  FILE *progress;        /* the per-epoch progress line (NULL: quiet) */
  bool shuffle;          /* a seeded shuffle each epoch (see "Which images" above) */
  uint64_t max_train_images; /* Fashion-MNIST: train on the first N images (0: all 60000) */
  uint64_t max_test_images;  /* Fashion-MNIST: evaluate on the first N images (0: all 10000) */
  /* Called on the client's thread, inside gpu_train_run, after each epoch's checkpoint was
   * put, with that epoch's row (NULL: none). It must not block for long: it holds up the
   * client's event handling. For progress displays and tests. */
  void (*on_epoch)(const gpu_train_epoch *epoch, void *user);
  void *user;
  /* --model transformer only (gpu/parallel/train_hybrid.c): the grid is ranks (data parallel) x tp x
   * pp, one barrier task per grid rank. */
  uint32_t tp, pp;          /* tensor- and pipeline-parallel ranks, >= 1 */
  pp_schedule schedule;     /* gpipe, 1f1b, interleaved */
  uint32_t microbatches;    /* m per replica's batch, dividing batch / ranks */
  uint32_t chunks;          /* v model chunks per pipeline rank (interleaved), >= 1 */
  bool recompute;           /* keep stage inputs only, forward again before backward */
  uint32_t hidden, heads, ffn, blocks; /* the transformer (ffn 0: 4 x hidden) */
  double dropout;           /* every dropout site, in [0, 1) */
  const char *timeline_csv_path; /* the last step's timeline of every rank (NULL: none) */
  const char *timeline_svg_path;
  /* model NN_LIBRARY: a user's model (include/flint/train.h's fl_model_builder) */
  const char *model_library; /* the shared library's path */
  const char *model_symbol;  /* its builder (NULL: FL_MODEL_BUILDER_SYMBOL) */
  /* data libsvm, csv, idx, imagefolder: the training and the test files or folders (the text
   * after "FORMAT:"; imagefolder's test_path may be NULL: data_path/val, training on
   * data_path/train) */
  const char *data_path, *test_path;
  /* data examples: datasets of fl_example_put records, their samples' shape and classes */
  fl_dataset *train_examples, *test_examples;
  uint32_t sample_ndim;          /* 1 to 3: the shape the model is created for */
  uint32_t sample_shape[3];      /* {C, H, W}: a 1-D sample is {1, 1, F} */
  uint32_t classes;
  /* model NN_LIBRARY from a program: the builder itself (no model_library) */
  fl_model_builder builder;
  /* GPU_TRAIN_IMAGE_FOLDER: the side of the square images the model sees (0: 224). Both
   * folders are decoded on the executors once and cached with the shorter side at
   * image_size * 256 / 224. Training images get the standard augmentation anew each epoch
   * (RandomResizedCrop, flip, normalisation, seeded by (seed, epoch, image): the rank's
   * reader transforms its cached images as it batches them); test images, and training
   * images with no_augment, are resized and centre-cropped once (the evaluation transform). */
  uint32_t image_size;
  bool no_augment;
  /* Gradient accumulation (the data-parallel models): each rank splits its batch / ranks
   * images of a step into `accumulate` micro-batches of batch / (ranks x accumulate), runs
   * forward and backward on each, adding into the gradients, and allreduces once, after the
   * last (its buckets go out during that last backward only). The step is the same as
   * without it, up to float rounding, for models without batch norm (whose statistics are
   * then a micro-batch's); it bounds the activations' memory by the micro-batch. batch must
   * be a multiple of ranks x accumulate. 0 or 1: none. */
  uint32_t accumulate;
  /* --sync ssp:S: S, the steps a worker may run ahead of the slowest (0: every step waits) */
  uint32_t staleness;
  /* asp and ssp, Downpour's n_fetch and n_push: a worker pulls the weights every ps_fetch
   * steps and pushes the gradients it accumulated over ps_push steps (0: 1, every step) */
  uint32_t ps_fetch, ps_push;
  /* Gradient compression (gpu/parallel/compress.h), --sync bsp with several ranks: NULL or
   * "none", "fp16", "bf16", "topk:RATIO", "powersgd:R", "onebit" (compress_spec_parse's
   * text). The hooks run on host memory over the host backend: not with NCCL. */
  const char *compress;
  /* --model cnn --trick (gpu/parallel/train_trick.c): Krizhevsky's data-parallel
   * convolutions and model-parallel FC layers over the ranks (gpu/parallel/hybrid_cnn.h) */
  bool trick;
  /* --schedule pipedream and 2bw: the mini-batches trained back to back between two flushes
   * (0: 8), and pipedream's vertical sync (gpu/parallel/pipeline_schedule.h) */
  uint32_t window;
  bool vertical_sync;
  /* --model gpt: model NN_TRANSFORMER in its GPT form (transformer.h's TFM_GPT) on --data
   * text:PATH, windows of seq bytes (0: GPU_TRAIN_DEFAULT_SEQ); loss and accuracy are then
   * per byte (the next byte's cross-entropy and argmax). */
  bool gpt;
  uint32_t seq;
  /* --model transformer and gpt: --sequence-parallel (tp > 1 dividing the sequence) and
   * --recompute selective (transformer.h's tfm_spec) */
  bool sequence_parallel;
  bool recompute_selective;
  /* --plan auto (--model transformer, gpu/parallel/plan.h): the grid, the micro-batches and
   * the stage cut are chosen for plan_world ranks from a profile this process takes after
   * loading the data; ranks, tp, pp, microbatches, chunks, schedule and recompute must then be
   * left at their defaults (the plan sets them: 1F1B, no interleaving, no recompute). The plan,
   * its runner-ups and its predicted step time are printed on plan_report (NULL: not). */
  bool plan_auto;
  uint32_t plan_world;
  double plan_memory_mb;          /* a rank's memory for the plan (0: no limit) */
  uint32_t plan_max_microbatches; /* largest m tried (0: 32) */
  FILE *plan_report;
  /* --replicas R0,R1,...: stage s of the pipeline runs on replicas[s] ranks that take its
   * micro-batches round robin (PipeDream's 1F1B-RR, pp_options.replicas); pp entries, the rest
   * 0 (all 0: one rank a stage). Then the world is ranks x sum(replicas) barrier tasks, pipeline
   * d being tasks [d S, (d + 1) S) (S the sum), stage by stage; --tp 1, --chunks 1, any
   * schedule but interleaved. */
  uint32_t replicas[GPU_TRAIN_MAX_STAGES];
  /* --replicas auto:W: the stages and their replicas chosen by PipeDream's partitioner
   * (pp_options.replicas_auto) over pipelines of W ranks, at most pp stages; ranks x W tasks
   * (0: off) */
  uint32_t replicas_auto;
  /* --model transformer and gpt: --experts E makes the MLP of every --moe-every-th block
   * (0: 1, every block) a mixture of E experts (transformer.h's spec.experts), spread over
   * the --dp ranks (E a multiple of dp), routed to --top-k experts a token (0: 2) with
   * --capacity-factor (0: 1.25) and the balancing loss weighted by --aux-alpha (< 0: 0.01). */
  uint32_t experts, top_k, moe_every;
  double capacity_factor, moe_alpha;
} gpu_train_options;
#define GPU_TRAIN_DEFAULT_SEQ 64u

#define GPU_TRAIN_OPTIONS_INIT                                                                \
  {NULL, NN_MLP, GPU_TRAIN_FASHION_MNIST, NULL, 0, 0, 1, FL_DEVICE_CPU, 256, 0.1, 0, 10,        \
   OPTIM_DECAY_COSINE, {0}, 0, 0, {OPTIM_SGD, 0.9f, false, 0.9f, 0.999f, 1e-8f, 5e-4f, 0.001f, false}, 0, \
   0, FL_PRECISION_FP32, 1, FL_ALLREDUCE_AUTO, 0, GPU_TRAIN_SYNC_BSP, 1, true, NULL, NULL, NULL, NULL, NULL, true, 0, 0, NULL, NULL, 1, 1, PP_1F1B, 1, 1,  \
   false, 64, 4, 0, 2, 0.1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, {0}, 0, NULL, 0, false, 1, 0, 0, 0, NULL, \
   false, 0, false, false, 0, false, false, \
   false, 0, 0, 0, NULL, {0}, 0, 0, 0, 0, 0, -1}


typedef struct gpu_train_result {
  uint32_t epochs;        /* epochs completed */
  uint64_t steps;         /* optimizer steps taken */
  uint32_t attempts;      /* barrier-stage attempts (1 when nothing failed) */
  uint32_t resumed_epoch; /* epochs the last attempt restored from a checkpoint, the stage's
                           * or --resume's (0: none) */
  double train_loss, train_acc; /* of the last epoch */
  double test_loss, test_acc;   /* of the last evaluation */
  double images_per_s;    /* training images per second over the run (all ranks) */
  double seconds;         /* wall time of the training stage */
  double final_lr;        /* the rate of the last step */
  uint32_t buckets;       /* gradient allreduces in the last step (0 with one rank) */
  uint32_t tau;           /* local SGD and AdaComm: the last period (0: bsp) */
  uint64_t reduced_bytes; /* a rank's bytes of gradients or weights allreduced (0 with one rank) */
  /* Data-parallel models (0 for the transformer), over the epochs of the run's rows: rank
   * 0's seconds blocked in its reader for training batches (the input wait), and copying them
   * to the device; input_wait_share is the wait over the epochs' training time, in [0, 1]. */
  double input_wait_s, upload_s, input_wait_share;
  /* --model transformer: the last epoch's mean measured bubble over its steps, the
   * theory's (p-1)/(m+p-1) [/ v], and each pipeline stage's (rank's) peak activation bytes
   * over the run, the most over its data- and tensor-parallel ranks. */
  double bubble, bubble_theory;
  uint32_t stages;
  uint64_t stage_peak_bytes[GPU_TRAIN_MAX_STAGES];
  /* --model transformer: each stage's ranks a pipeline (1 each unreplicated; with --replicas
   * auto:W, the partitioner's choice; `stages` of them) */
  uint32_t stage_replicas[GPU_TRAIN_MAX_STAGES];
  /* asp and ssp: the most steps a pull's weights were behind the pulling worker (its clock
   * less the servers' freshness, over every pull of the run: at most S under ssp:S), the
   * workers whose task was retried and resumed at the servers' clock for it, and the fewest
   * steps the servers counted for one worker (epochs x its batches when all its data was
   * trained on) */
  uint64_t max_staleness;
  uint32_t resumed_workers;
  uint64_t worker_steps_min; /* the fewest steps the servers counted for one worker */
  /* A rank's bytes handed to collectives over the run: reduced_bytes without --compress, the
   * compressed payload with it (divide by steps for a step's) */
  uint64_t sent_bytes;
  /* --model transformer: the bandwidth between pipeline stages measured for the partitioner
   * (bytes/s; 0 with one stage or a given cut) */
  double link_bytes_per_s;
  /* --plan auto: the plan run (its grid is dp x tp x pp) and its predicted step time; the
   * measured one is batch / images_per_s */
  uint32_t plan_dp, plan_tp, plan_pp, plan_microbatches;
  double plan_step_s;
  /* --experts: the last epoch's mean balancing loss (weighted, not in train_loss) and the
   * fraction of expert choices dropped over capacity */
  double aux_loss, dropped_fraction;
} gpu_train_result;

/* "mlp", "cnn", "resnet18", "transformer" (the CLI's names, nn_model_kind_name's);
 * FL_EINVAL otherwise. */
/* The calls marked FL_API are exported from libflint_gpu for the flint command, which must
 * reach the trainer through the shared library (its barrier function ships by symbol). */
FL_API fl_status gpu_train_model_parse(const char *text, nn_model_kind *out);
/* --experts' settings with their defaults applied (top-k 2, every block, capacity factor
 * 1.25, alpha 0.01 where the options leave them 0, or alpha < 0). */
FL_API void gpu_train_experts(const gpu_train_options *o, uint32_t *top_k, uint32_t *every, float *capacity_factor,
                              float *alpha);
/* "fashion-mnist", "synthetic-imagenet"; FL_EINVAL otherwise. */
FL_API fl_status gpu_train_dataset_parse(const char *text, gpu_train_dataset *out);
/* "fashion-mnist", "synthetic-imagenet", or "libsvm:PATH", "csv:PATH", "idx:IMAGES,LABELS",
 * "imagefolder:DIR":
 * *path points at PATH inside text (NULL for the first two). FL_EINVAL names the text. */
FL_API fl_status gpu_train_source_parse(const char *text, gpu_train_dataset *out, const char **path);
/* --sync: "bsp", "local:TAU" or "adacomm" / "adacomm:TAU0" (TAU0 16 when not given), TAU
 * 1 to 100000 steps; "asp"; "ssp:S", S 0 to 100000 steps (*staleness; 0 otherwise). FL_EINVAL
 * names the text otherwise. */
FL_API fl_status gpu_train_sync_parse(const char *text, gpu_train_sync *sync, uint32_t *tau, uint32_t *staleness);
FL_API const char *gpu_train_dataset_name(gpu_train_dataset data);
/* The barrier tasks a run has: --ranks for the data-parallel models; for the transformer
 * dp x tp x pp, or dp x sum(replicas) with replicated stages. */
FL_API uint32_t gpu_train_world(const gpu_train_options *opts);
/* --replicas "R0,R1,...": 1 to GPU_TRAIN_MAX_STAGES counts, each 1 to 64, into out (the rest
 * zeroed) and their number into *stages, *auto_ranks 0; or "auto:W", W 1 to 1024: out and
 * *stages zeroed, *auto_ranks W. FL_EINVAL names the text. */
FL_API fl_status gpu_train_replicas_parse(const char *text, uint32_t out[GPU_TRAIN_MAX_STAGES], uint32_t *stages,
                                          uint32_t *auto_ranks);
/* Checks every field and their combinations (batch a multiple of ranks, warmup shorter than
 * training, ...): FL_EINVAL with a message naming the option as the CLI spells it ("--batch
 * 100 is not a multiple of --ranks 3"). Pure; gpu_train_run calls it first. */
FL_API fl_status gpu_train_options_validate(const gpu_train_options *opts);
/* The checks that need the data's sample shape (C x H x W): --sequence-parallel with the
 * encoder, whose sequence is its C x H rows. gpu_train_options_validate makes them where the
 * options fix the shape; gpu_train_run, for data read from files, once it has read them and
 * before any rank starts. FL_EINVAL as gpu_train_options_validate's. */
FL_API fl_status gpu_train_options_validate_shape(const gpu_train_options *opts, uint32_t channels, uint32_t height,
                                                  uint32_t width);
/* The schedule the options make (base rate, global batch, warmup, decay, milestones). */
FL_API void gpu_train_schedule(const gpu_train_options *opts, optim_schedule *out);

/* Trains as described at the top, in a context opened on opts->master (closed before it
 * returns). *result (may be NULL) is filled on success. Blocks until training ends.
 * Errors: FL_EINVAL (options), the data set's (FL_ENOENT / FL_EFORMAT naming the file),
 * FL_ESLOTS (fewer task slots than ranks), FL_EDEVICE, FL_EPEER, the stage's after its
 * retries, FL_EIO for the output files. A loss that turns non-finite (the rate is too high)
 * stops every rank at that step (with several data-parallel ranks, at the next progress
 * report: a twentieth of an epoch) and fails the run, without retrying it, with FL_EINVAL
 * naming the first such step, its loss and its learning rate; no output file is written. */
FL_API fl_status gpu_train_run(const gpu_train_options *opts, gpu_train_result *result);
/* The same in a context the caller owns (tests, job binaries). */
FL_API fl_status gpu_train_run_in(fl_context *ctx, const gpu_train_options *opts, gpu_train_result *result);

/* ---- comparing runs (`flint train compare`, gpu/parallel/curves.c): training loss against
 * time and against bytes sent, one series per run (issue 35's comparison of sync modes). ---- */
#define CURVES_COMPARE_MAX 20
typedef struct curves_run {
  char label[64];
  double *elapsed, *mb, *loss; /* n of each; NaN where not measured */
  size_t n;
} curves_run;
/* Reads a curves CSV by its header's names: train_loss (or loss), elapsed_s, and sent_mb (or
 * reduced_mb); other columns are ignored. label NULL: the file's name. FL_ENOENT or FL_EIO
 * naming the file; FL_EFORMAT naming file:line for a missing column, a ragged row or a field
 * that is not a number, or no rows. */
FL_API fl_status curves_run_read(const char *path, const char *label, curves_run *out);
FL_API void curves_run_free(curves_run *r);
/* An SVG of two panels: training loss against elapsed seconds and against MiB sent, a series
 * (and legend entry) per run. 1 to CURVES_COMPARE_MAX runs, else FL_EINVAL. */
FL_API fl_status curves_compare_svg(const curves_run *runs, size_t n, const char *title, fl_buf *out);
FL_API fl_status curves_write_compare_svg(const curves_run *runs, size_t n, const char *title, const char *path);

#endif /* FLINT_GPU_TRAIN_H */
