/*
 * gpu/parallel/train_opts.c: the training options' names, checks and schedule. Pure functions,
 * apart from gpu/parallel/train_dp.c (the trainer), so that the CLI and tests can check options
 * without running anything.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/data/data.h"
#include "gpu/parallel/compress.h"
#include "gpu/parallel/train.h"
#include "gpu/parallel/train_rank.h"

static const char *const dataset_names[] = {"fashion-mnist", "synthetic-imagenet", "libsvm", "csv", "idx", "datasets",
                                            "imagefolder", "text"};
#define DATASETS (sizeof dataset_names / sizeof dataset_names[0])

fl_status gpu_train_model_parse(const char *text, nn_model_kind *out) {
  return nn_model_kind_parse(text ? text : "(null)", out);
}

fl_status gpu_train_dataset_parse(const char *text, gpu_train_dataset *out) {
  return gpu_train_source_parse(text, out, NULL);
}

fl_status gpu_train_sync_parse(const char *text, gpu_train_sync *sync, uint32_t *tau, uint32_t *staleness) {
  if (!text) return fl_set_error(FL_EINVAL, "--sync: NULL");
  const char *arg = NULL;
  *staleness = 0;
  if (strcmp(text, "bsp") == 0 || strcmp(text, "asp") == 0) {
    *sync = text[0] == 'b' ? GPU_TRAIN_SYNC_BSP : GPU_TRAIN_SYNC_ASP;
    *tau = 1;
    return FL_OK;
  }
  if (strcmp(text, "adacomm") == 0) {
    *sync = GPU_TRAIN_SYNC_ADACOMM;
    *tau = 16;
    return FL_OK;
  }
  if (strncmp(text, "local:", 6) == 0) arg = text + 6;
  else if (strncmp(text, "adacomm:", 8) == 0) arg = text + 8;
  else if (strncmp(text, "ssp:", 4) == 0) arg = text + 4;
  bool ssp = text[0] == 's';
  char *end = NULL;
  unsigned long v = arg && *arg >= '0' && *arg <= '9' ? strtoul(arg, &end, 10) : 0;
  if (!arg || !end || *end || v < (ssp ? 0u : 1u) || v > 100000)
    return fl_set_error(FL_EINVAL, "--sync '%s': expected bsp, local:TAU, adacomm[:TAU0], asp or ssp:S (TAU: steps "
                        "between averages, 1 to 100000; S: the steps a worker may run ahead of the slowest, 0 to "
                        "100000)", text);
  if (ssp) {
    *sync = GPU_TRAIN_SYNC_SSP;
    *tau = 1;
    *staleness = (uint32_t)v;
    return FL_OK;
  }
  *sync = text[0] == 'l' ? GPU_TRAIN_SYNC_LOCAL : GPU_TRAIN_SYNC_ADACOMM;
  *tau = (uint32_t)v;
  return FL_OK;
}

fl_status gpu_train_source_parse(const char *text, gpu_train_dataset *out, const char **path) {
  if (path) *path = NULL;
  for (size_t i = 0; text && i < DATASETS; i++) {
    if (i == GPU_TRAIN_EXAMPLES) continue; /* datasets come from the API only */
    size_t n = strlen(dataset_names[i]);
    bool file = i >= GPU_TRAIN_LIBSVM;
    if (strncmp(text, dataset_names[i], n) != 0 || (file ? text[n] != ':' : text[n] != '\0')) continue;
    if (file && (!path || !text[n + 1]))
      return fl_set_error(FL_EINVAL, "data set '%s' needs its %s: %s:%s", text,
                          i == GPU_TRAIN_IMAGE_FOLDER ? "folder" : "file", dataset_names[i],
                          i == GPU_TRAIN_IDX ? "PATH (IMAGES,LABELS)" : i == GPU_TRAIN_IMAGE_FOLDER ? "DIR" : "PATH");
    if (i == GPU_TRAIN_IDX && !strchr(text + n + 1, ','))
      return fl_set_error(FL_EINVAL, "data set '%s': idx: takes IMAGES,LABELS (two files)", text);
    *out = (gpu_train_dataset)i;
    if (file) *path = text + n + 1;
    return FL_OK;
  }
  return fl_set_error(FL_EINVAL, "unknown data set '%s' (fashion-mnist, synthetic-imagenet, libsvm:PATH, csv:PATH, "
                      "idx:IMAGES,LABELS, imagefolder:DIR or text:PATH)", text ? text : "(null)");
}

const char *gpu_train_dataset_name(gpu_train_dataset data) {
  return (unsigned)data < DATASETS ? dataset_names[data] : "unknown";
}

void gpu_train_schedule(const gpu_train_options *o, optim_schedule *s) {
  memset(s, 0, sizeof *s);
  s->base_lr = o->lr;
  s->global_batch = o->batch;
  s->reference_batch = 256;
  s->warmup_epochs = o->warmup_epochs;
  s->epochs = o->epochs;
  s->decay = o->decay;
  if (o->decay == OPTIM_DECAY_STEP) {
    if (o->num_milestones > 0 && o->num_milestones <= OPTIM_MAX_MILESTONES) {
      memcpy(s->milestones, o->milestones, sizeof(double) * (size_t)o->num_milestones);
      s->num_milestones = o->num_milestones;
    } else {
      optim_schedule_default_milestones(s);
    }
  }
  s->step_factor = 0.1;
  s->power = o->decay_power;
}

static uint64_t replicas_sum(const gpu_train_options *o) {
  uint64_t sum = 0;
  for (int s = 0; s < GPU_TRAIN_MAX_STAGES; s++) sum += o->replicas[s];
  return sum;
}

uint32_t gpu_train_world(const gpu_train_options *o) {
  if (o->model != NN_TRANSFORMER) return o->ranks;
  if (o->plan_auto) return o->plan_world;
  if (o->replicas_auto) return o->ranks * o->replicas_auto;
  return o->replicas[0] ? o->ranks * (uint32_t)replicas_sum(o) : o->ranks * o->tp * o->pp;
}

fl_status gpu_train_replicas_parse(const char *text, uint32_t out[GPU_TRAIN_MAX_STAGES], uint32_t *stages,
                                   uint32_t *auto_ranks) {
  if (!text || !out || !stages || !auto_ranks) return fl_set_error(FL_EINVAL, "gpu_train_replicas_parse: NULL argument");
  memset(out, 0, GPU_TRAIN_MAX_STAGES * sizeof *out);
  *stages = *auto_ranks = 0;
  if (strncmp(text, "auto:", 5) == 0) {
    char *end = NULL;
    unsigned long w = text[5] >= '0' && text[5] <= '9' ? strtoul(text + 5, &end, 10) : 0;
    if (end && *end == '\0' && w >= 1 && w <= 1024) {
      *auto_ranks = (uint32_t)w;
      return FL_OK;
    }
    return fl_set_error(FL_EINVAL, "--replicas '%s': auto:W takes W, the ranks of a pipeline, 1 to 1024", text);
  }
  uint32_t n = 0;
  for (const char *p = text;; p++) {
    char *end = NULL;
    if (*p < '0' || *p > '9') break; /* strtoul would take a sign or blanks */
    unsigned long v = strtoul(p, &end, 10);
    if (end == p || v < 1 || v > 64 || n == GPU_TRAIN_MAX_STAGES) break;
    out[n++] = (uint32_t)v;
    if (*end == '\0') {
      *stages = n;
      return FL_OK;
    }
    if (*end != ',') break;
    p = end;
  }
  memset(out, 0, GPU_TRAIN_MAX_STAGES * sizeof *out);
  return fl_set_error(FL_EINVAL, "--replicas '%s' is not a list of replica counts, one per stage, each 1 to 64 "
                      "(e.g. 1,2; at most %d stages)", text, GPU_TRAIN_MAX_STAGES);
}

/* --replicas: a count per stage or auto:W, with what the replicated runtime supports. */
static fl_status validate_replicas(const gpu_train_options *o) {
  if (o->replicas_auto) {
    if (replicas_sum(o)) return fl_set_error(FL_EINVAL, "--replicas is either counts or auto:W, not both");
    if (o->replicas_auto > 1024) return fl_set_error(FL_EINVAL, "--replicas auto:%u is above 1024 ranks", o->replicas_auto);
    /* PipeDream's replicated partitioner takes stages x units^2 x W^2 steps on one rank while
     * the others wait: refuse what would take minutes rather than hang a stage start. */
    double units = (double)o->blocks + 2, work = (double)o->pp * units * units * o->replicas_auto * o->replicas_auto;
    if (work > 2e9)
      return fl_set_error(FL_EINVAL, "--replicas auto:%u over %u blocks with at most %u stages is too large for the "
                          "replicated partitioner (stages x units^2 x W^2 = %.2g steps, above 2e9): give the "
                          "replicas per stage, or fewer ranks or stages", o->replicas_auto, o->blocks, o->pp, work);
    if (o->tp != 1 || o->chunks != 1)
      return fl_set_error(FL_EINVAL, "--replicas needs --tp 1 and --chunks 1 (a replicated stage is one whole rank; "
                          "got --tp %u, --chunks %u)", o->tp, o->chunks);
    if (o->schedule == PP_INTERLEAVED)
      return fl_set_error(FL_EINVAL, "--replicas runs --schedule gpipe, 1f1b, pipedream or 2bw, not interleaved (a "
                          "replicated stage is one chunk)");
    return FL_OK;
  }
  uint32_t n = 0;
  while (n < GPU_TRAIN_MAX_STAGES && o->replicas[n]) n++;
  for (uint32_t s = n; s < GPU_TRAIN_MAX_STAGES; s++)
    if (o->replicas[s]) return fl_set_error(FL_EINVAL, "--replicas: stage %u has 0 replicas", n);
  for (uint32_t s = 0; s < n; s++)
    if (o->replicas[s] > 64) return fl_set_error(FL_EINVAL, "--replicas: stage %u has %u replicas (1 to 64)", s, o->replicas[s]);
  if (n != o->pp)
    return fl_set_error(FL_EINVAL, "--replicas names %u stages but --pp is %u", n, o->pp);
  if (o->tp != 1 || o->chunks != 1)
    return fl_set_error(FL_EINVAL, "--replicas needs --tp 1 and --chunks 1 (a replicated stage is one whole rank; "
                        "got --tp %u, --chunks %u)", o->tp, o->chunks);
  if (o->schedule == PP_INTERLEAVED)
    return fl_set_error(FL_EINVAL, "--replicas runs --schedule gpipe, 1f1b, pipedream or 2bw, not interleaved (a "
                        "replicated stage is one chunk)");
  return FL_OK;
}

void gpu_train_experts(const gpu_train_options *o, uint32_t *top_k, uint32_t *every, float *capacity_factor,
                       float *alpha) {
  *top_k = o->top_k ? o->top_k : 2;
  *every = o->moe_every ? o->moe_every : 1;
  *capacity_factor = o->capacity_factor > 0 ? (float)o->capacity_factor : 1.25f;
  *alpha = o->moe_alpha >= 0 ? (float)o->moe_alpha : 0.01f;
}

/* --experts and its settings: only with the transformer, experts spread over --dp. */
static fl_status validate_experts(const gpu_train_options *o) {
  if (!o->experts) {
    if (o->top_k || o->moe_every || o->capacity_factor != 0 || o->moe_alpha >= 0)
      return fl_set_error(FL_EINVAL, "--top-k, --capacity-factor, --aux-alpha and --moe-every need --experts");
    return FL_OK;
  }
  if (o->model != NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--experts is for --model transformer or gpt");
  uint32_t top_k, every;
  float cf, alpha;
  gpu_train_experts(o, &top_k, &every, &cf, &alpha);
  if (o->experts > 4096) return fl_set_error(FL_EINVAL, "--experts %u is above 4096", o->experts);
  if (o->experts % o->ranks)
    return fl_set_error(FL_EINVAL, "--experts %u must be a multiple of --dp %u (each data-parallel rank holds "
                        "experts / dp of them)", o->experts, o->ranks);
  if (top_k > o->experts) return fl_set_error(FL_EINVAL, "--top-k %u is more than --experts %u", top_k, o->experts);
  if (every > o->blocks)
    return fl_set_error(FL_EINVAL, "--moe-every %u is more than --blocks %u: no block would have experts", every,
                        o->blocks);
  if (!(cf > 0) || !(alpha >= 0))
    return fl_set_error(FL_EINVAL, "--capacity-factor must be above 0 and --aux-alpha at least 0");
  if (o->sequence_parallel)
    return fl_set_error(FL_EINVAL, "--experts does not run with --sequence-parallel (the experts are replicated "
                        "over the tensor-parallel ranks)");
  if (o->schedule == PP_PIPEDREAM || o->schedule == PP_2BW)
    return fl_set_error(FL_EINVAL, "--experts runs with the gpipe, 1f1b and interleaved schedules, not %s",
                        pp_schedule_name(o->schedule));
  if (o->plan_auto)
    return fl_set_error(FL_EINVAL, "--experts does not run with --plan auto (the plan's profile and cost model "
                        "have no experts)");
  if (o->replicas[0] || o->replicas_auto)
    return fl_set_error(FL_EINVAL, "--experts does not run with --replicas (the experts are spread over the "
                        "data-parallel ranks)");
  return FL_OK;
}

/* The grid's and the transformer's options (--model transformer), or their absence. */
/* --plan auto and its options; the grid it chooses is checked as a given one would be. */
static fl_status validate_plan(const gpu_train_options *o) {
  if (!o->plan_auto) {
    if (o->plan_world || o->plan_memory_mb != 0 || o->plan_max_microbatches)
      return fl_set_error(FL_EINVAL, "--world, --plan-memory and --plan-max-microbatches are for --plan auto");
    return FL_OK;
  }
  if (o->model != NN_TRANSFORMER) return fl_set_error(FL_EINVAL, "--plan auto is for --model transformer");
  /* The profile and the model are the image transformer's, without the 2022 options. */
  if (o->gpt || o->sequence_parallel || o->recompute_selective)
    return fl_set_error(FL_EINVAL, "--plan auto plans --model transformer without --sequence-parallel or selective "
                        "recomputation (not --model gpt)");
  if (o->ranks != 1 || o->tp != 1 || o->pp != 1 || o->microbatches != 1 || o->chunks != 1 ||
      o->schedule != PP_1F1B || o->recompute || o->replicas[0] || o->replicas_auto)
    return fl_set_error(FL_EINVAL, "--plan auto chooses --dp, --tp, --pp and --microbatches itself (1f1b, no "
                        "--chunks, --recompute or --replicas): leave them out and give --world");
  if (o->plan_world < 1 || o->plan_world > 1024)
    return fl_set_error(FL_EINVAL, "--plan auto needs --world W, the ranks to plan for (1 to 1024)");
  if (o->batch % o->plan_world)
    return fl_set_error(FL_EINVAL, "--batch %u is not a multiple of --world %u (each rank reads batch / world "
                        "images a step)", o->batch, o->plan_world);
  if (!(o->plan_memory_mb >= 0) || !isfinite(o->plan_memory_mb))
    return fl_set_error(FL_EINVAL, "--plan-memory %g MiB must be a number >= 0 (0: no limit)", o->plan_memory_mb);
  if (o->plan_max_microbatches > 1024)
    return fl_set_error(FL_EINVAL, "--plan-max-microbatches %u is over 1024", o->plan_max_microbatches);
  if (o->max_test_images && o->max_test_images < o->plan_world)
    return fl_set_error(FL_EINVAL, "--test-images %llu is less than the %u ranks (each rank evaluates a share)",
                        (unsigned long long)o->max_test_images, o->plan_world);
  return FL_OK;
}

/* The sample shape {C, H, W} when the options alone fix it; false when it is in the data's
 * files (libsvm, csv, idx), known once they are read. */
static bool known_shape(const gpu_train_options *o, uint32_t sh[3]) {
  switch (o->data) {
  case GPU_TRAIN_FASHION_MNIST: sh[0] = 1, sh[1] = sh[2] = 28; return true;
  case GPU_TRAIN_SYNTHETIC_IMAGENET: sh[0] = DATA_IMAGENET_CHANNELS, sh[1] = sh[2] = DATA_IMAGENET_SIZE; return true;
  case GPU_TRAIN_IMAGE_FOLDER: sh[0] = 3, sh[1] = sh[2] = o->image_size ? o->image_size : 224; return true;
  case GPU_TRAIN_EXAMPLES: memcpy(sh, o->sample_shape, 3 * sizeof *sh); return true;
  default: return false;
  }
}

fl_status gpu_train_options_validate_shape(const gpu_train_options *o, uint32_t channels, uint32_t height,
                                           uint32_t width) {
  (void)width;
  if (!o) return fl_set_error(FL_EINVAL, "gpu_train: options are NULL");
  /* The encoder's tokens are the image's rows, channel after channel (gpu/parallel/train_hybrid.c). */
  uint64_t seq = (uint64_t)channels * height;
  if (o->model == NN_TRANSFORMER && !o->gpt && o->sequence_parallel && o->tp && seq % o->tp)
    return fl_set_error(FL_EINVAL, "--sequence-parallel needs the sequence to be a multiple of --tp %u, but the "
                        "encoder's is %llu tokens (an image's rows: channels x height = %u x %u)", o->tp,
                        (unsigned long long)seq, channels, height);
  return FL_OK;
}

static fl_status validate_hybrid(const gpu_train_options *o) {
  fl_status ps = validate_plan(o);
  if (ps != FL_OK) return ps;
  if (o->model != NN_TRANSFORMER) {
    if (o->tp != 1 || o->pp != 1 || o->chunks != 1 || o->microbatches != 1 || o->recompute || o->window || o->vertical_sync ||
        o->timeline_csv_path || o->timeline_svg_path || o->sequence_parallel || o->recompute_selective ||
        replicas_sum(o) || o->replicas_auto)
      return fl_set_error(FL_EINVAL, "--tp, --pp, --schedule, --microbatches, --chunks, --recompute, --window, "
                          "--vertical-sync, --sequence-parallel, --replicas and --timeline-* are for --model transformer");
    return FL_OK;
  }
  if (o->sequence_parallel && o->tp < 2)
    return fl_set_error(FL_EINVAL, "--sequence-parallel splits the sequence over the tensor-parallel ranks: it "
                        "needs --tp 2 or more (this run's is %u)", o->tp);
  uint32_t seq = o->seq ? o->seq : GPU_TRAIN_DEFAULT_SEQ;
  if (o->sequence_parallel && o->gpt && seq % o->tp)
    return fl_set_error(FL_EINVAL, "--sequence-parallel needs --seq %u to be a multiple of --tp %u", seq, o->tp);
  uint32_t sh[3];
  if (o->tp >= 1 && known_shape(o, sh)) {
    fl_status s = gpu_train_options_validate_shape(o, sh[0], sh[1], sh[2]);
    if (s != FL_OK) return s;
  }
  if (o->tp < 1 || o->tp > 1024) return fl_set_error(FL_EINVAL, "--tp %u must be 1 to 1024", o->tp);
  if (o->pp < 1 || o->pp > GPU_TRAIN_MAX_STAGES)
    return fl_set_error(FL_EINVAL, "--pp %u must be 1 to %d", o->pp, GPU_TRAIN_MAX_STAGES);
  bool replicated = replicas_sum(o) || o->replicas_auto;
  if (replicated) {
    fl_status s = validate_replicas(o);
    if (s != FL_OK) return s;
  }
  uint64_t world = replicated ? (uint64_t)o->ranks * (o->replicas_auto ? o->replicas_auto : replicas_sum(o))
                              : (uint64_t)o->ranks * o->tp * o->pp;
  const char *per = o->replicas_auto ? "W of --replicas auto:W" : replicated ? "the sum of --replicas" : "--tp x --pp";
  if (world > 1024)
    return fl_set_error(FL_EINVAL, "--dp %u x %s = %llu ranks, over 1024", o->ranks, per, (unsigned long long)world);
  if (o->batch % world)
    return fl_set_error(FL_EINVAL, "--batch %u is not a multiple of %s = %llu (each rank reads batch / ranks "
                        "images a step)", o->batch, replicated ? (o->replicas_auto ? "--dp x W of --replicas auto:W"
                                                                                : "--dp x the sum of --replicas")
                                                               : "--dp x --tp x --pp",
                        (unsigned long long)world);
  if ((unsigned)o->schedule > PP_2BW)
    return fl_set_error(FL_EINVAL, "--schedule: unknown schedule %d", (int)o->schedule);
  if (o->vertical_sync && o->schedule != PP_PIPEDREAM)
    return fl_set_error(FL_EINVAL, "--vertical-sync is for --schedule pipedream, not %s", pp_schedule_name(o->schedule));
  if (o->window && o->schedule != PP_PIPEDREAM && o->schedule != PP_2BW)
    return fl_set_error(FL_EINVAL, "--window is for --schedule pipedream or 2bw, not %s", pp_schedule_name(o->schedule));
  if (o->window > 4096) return fl_set_error(FL_EINVAL, "--window %u is above 4096", o->window);
  if (o->schedule == PP_2BW && o->microbatches < o->pp)
    return fl_set_error(FL_EINVAL, "--schedule 2bw needs --microbatches >= --pp (%u < %u): a stage would need a "
                        "third weight version", o->microbatches, o->pp);
  uint32_t replica = o->batch / o->ranks;
  if (o->microbatches < 1 || replica % o->microbatches)
    return fl_set_error(FL_EINVAL, "--microbatches %u must divide the replica's batch, --batch %u / --dp %u = %u",
                        o->microbatches, o->batch, o->ranks, replica);
  if (o->chunks < 1) return fl_set_error(FL_EINVAL, "--chunks must be >= 1");
  if (o->chunks > 1 && o->schedule != PP_INTERLEAVED)
    return fl_set_error(FL_EINVAL, "--chunks %u needs --schedule interleaved", o->chunks);
  if (o->hidden < 1 || o->heads < 1 || o->blocks < 1)
    return fl_set_error(FL_EINVAL, "--hidden, --heads and --blocks must be >= 1");
  if (o->hidden > 65536 || o->ffn > 262144 || o->blocks > 1024)
    return fl_set_error(FL_EINVAL, "--hidden %u, --ffn %u or --blocks %u is too large", o->hidden, o->ffn,
                        o->blocks);
  if (o->hidden % o->heads) return fl_set_error(FL_EINVAL, "--heads %u must divide --hidden %u", o->heads, o->hidden);
  if (o->heads % o->tp)
    return fl_set_error(FL_EINVAL, "--heads %u must be a multiple of --tp %u (attention splits by heads)", o->heads,
                        o->tp);
  uint32_t ffn = o->ffn ? o->ffn : 4 * o->hidden;
  if (ffn % o->tp)
    return fl_set_error(FL_EINVAL, "--ffn %u must be a multiple of --tp %u (the MLP splits its inner width)", ffn,
                        o->tp);
  uint64_t stages = (uint64_t)o->pp * o->chunks, units = (uint64_t)o->blocks + 2;
  if (stages > units)
    return fl_set_error(FL_EINVAL, "--pp %u x --chunks %u = %llu stages, but the model has only %llu units "
                        "(--blocks %u + embedding + head)", o->pp, o->chunks, (unsigned long long)stages,
                        (unsigned long long)units, o->blocks);
  if (!(o->dropout >= 0 && o->dropout < 1)) return fl_set_error(FL_EINVAL, "--dropout %g must be in [0, 1)", o->dropout);
  if (o->max_test_images && o->max_test_images < world)
    return fl_set_error(FL_EINVAL, "--test-images %llu is less than the %llu ranks (each rank evaluates a share)",
                        (unsigned long long)o->max_test_images, (unsigned long long)world);
  if (o->resume_path)
    return fl_set_error(FL_EINVAL, "--resume is for the data-parallel models (the transformer's checkpoint is "
                        "sharded over its grid)");
  if (o->bucket_bytes)
    return fl_set_error(FL_EINVAL, "--bucket-mb is for the data-parallel models (the transformer averages each "
                        "chunk's gradients after backward)");
  return FL_OK;
}

/* --trick (gpu/parallel/train_trick.c): the cnn, synchronous, with what a rank holding a
 * shard of the FC layers can do. */
static fl_status validate_trick(const gpu_train_options *o) {
  if (!o->trick) return FL_OK;
  if (o->model != NN_CNN)
    return fl_set_error(FL_EINVAL, "--trick is for --model cnn (its convolutions data parallel, its fully connected "
                        "layers split over the ranks), not %s", nn_model_kind_name(o->model));
  if (TRICK_FC % o->ranks)
    return fl_set_error(FL_EINVAL, "--trick: --ranks %u must divide the FC layers' %d units (each rank holds an "
                        "equal share): use 1, 2, 4, 8, ...", o->ranks, TRICK_FC);
  if (o->sync != GPU_TRAIN_SYNC_BSP)
    return fl_set_error(FL_EINVAL, "--trick needs --sync bsp (a rank's FC shard is the only copy: there is nothing "
                        "to average or push)");
  if (o->checkpoint_path || o->resume_path)
    return fl_set_error(FL_EINVAL, "--checkpoint and --resume are not available with --trick (each rank holds a shard "
                        "of the FC layers)");
  if (o->clip_grad_norm > 0 || o->label_smoothing > 0 || (o->accumulate && o->accumulate > 1) || o->bucket_bytes)
    return fl_set_error(FL_EINVAL, "--clip-grad-norm, --label-smoothing, --accumulate and --bucket-mb are not "
                        "available with --trick");
  compress_spec spec;
  if (compress_spec_parse(o->compress, &spec) == FL_OK && spec.kind != COMPRESS_NONE)
    return fl_set_error(FL_EINVAL, "--compress is not available with --trick (it allreduces only the convolutions' "
                        "gradients, uncompressed)");
  if (o->precision == FL_PRECISION_FP16)
    return fl_set_error(FL_EINVAL, "--precision fp16 is not available with --trick (its loss scaler checks all of the "
                        "gradients): use bf16");
  if ((o->optim.kind == OPTIM_LARS || o->optim.kind == OPTIM_LAMB) && o->ranks > 1)
    return fl_set_error(FL_EINVAL, "--optimizer %s needs each weight's whole norm, but --trick splits the FC weights "
                        "over ranks: use sgd, adam or adamw", optim_kind_name(o->optim.kind));
  return FL_OK;
}

/* The optimizer's options as the CLI spells them (optim_options_validate's checks, named). */
static fl_status validate_optimizer(const gpu_train_options *o) {
  const optim_options *p = &o->optim;
  if ((unsigned)p->kind > OPTIM_ADAGRAD)
    return fl_set_error(FL_EINVAL, "--optimizer: unknown optimizer %d", (int)p->kind);
  const char *name = optim_kind_name(p->kind);
  if (!(p->momentum >= 0 && p->momentum < 1))
    return fl_set_error(FL_EINVAL, "--momentum %g must be in [0, 1)", (double)p->momentum);
  if (!(p->weight_decay >= 0) || !isfinite(p->weight_decay))
    return fl_set_error(FL_EINVAL, "--weight-decay %g must be a number >= 0", (double)p->weight_decay);
  if (p->nesterov && p->kind != OPTIM_SGD)
    return fl_set_error(FL_EINVAL, "--nesterov is for --optimizer sgd (this run's is %s)", name);
  if (p->nesterov && p->momentum == 0) return fl_set_error(FL_EINVAL, "--nesterov needs --momentum > 0");
  if (p->kind == OPTIM_ADAGRAD && !(p->eps > 0 && isfinite(p->eps)))
    return fl_set_error(FL_EINVAL, "--eps %g must be a number > 0", (double)p->eps);
  if (p->kind == OPTIM_ADAM || p->kind == OPTIM_ADAMW || p->kind == OPTIM_LAMB) {
    if (!(p->beta1 >= 0 && p->beta1 < 1)) return fl_set_error(FL_EINVAL, "--beta1 %g must be in [0, 1)", (double)p->beta1);
    if (!(p->beta2 >= 0 && p->beta2 < 1)) return fl_set_error(FL_EINVAL, "--beta2 %g must be in [0, 1)", (double)p->beta2);
    if (!(p->eps > 0) || !isfinite(p->eps)) return fl_set_error(FL_EINVAL, "--eps %g must be a number > 0", (double)p->eps);
  }
  if (p->kind == OPTIM_LARS && (!(p->trust_coef > 0) || !isfinite(p->trust_coef)))
    return fl_set_error(FL_EINVAL, "--trust-coef %g must be a number > 0", (double)p->trust_coef);
  if (!(o->clip_grad_norm >= 0) || !isfinite(o->clip_grad_norm))
    return fl_set_error(FL_EINVAL, "--clip-grad-norm %g must be a number > 0 (0: no clipping)", o->clip_grad_norm);
  if (o->decay_power != 0 && o->decay != OPTIM_DECAY_POLY) return fl_set_error(FL_EINVAL, "--power is for --decay poly");
  if (!(o->decay_power >= 0 && o->decay_power <= 100))
    return fl_set_error(FL_EINVAL, "--power %g must be in (0, 100]", o->decay_power);
  if (o->model == NN_TRANSFORMER) {
    /* A tensor-parallel rank holds a slice of a weight: its norm is not the weight's. */
    if ((p->kind == OPTIM_LARS || p->kind == OPTIM_LAMB) && o->tp > 1)
      return fl_set_error(FL_EINVAL, "--optimizer %s needs each weight's whole norm, but --tp %u splits weights "
                          "over ranks: use --tp 1, or sgd, adam or adamw", name, o->tp);
    if (o->clip_grad_norm > 0)
      return fl_set_error(FL_EINVAL, "--clip-grad-norm is for the data-parallel models (the transformer's "
                          "gradients are spread over its grid)");
  }
  /* Adagrad is the servers' update alone (validate_ps checks the rest of its options). */
  if (p->kind == OPTIM_ADAGRAD && GPU_TRAIN_SYNC_IS_PS(o->sync)) return FL_OK;
  return optim_options_validate(p);
}

/* --sync asp and ssp:S (gpu/parallel/train_ps.c): what the parameter servers can train, and
 * Downpour's --ps-fetch and --ps-push. */
static fl_status validate_ps(const gpu_train_options *o) {
  if (!GPU_TRAIN_SYNC_IS_PS(o->sync)) {
    if (o->ps_fetch > 1 || o->ps_push > 1 || o->staleness)
      return fl_set_error(FL_EINVAL, "--ps-fetch, --ps-push and a staleness are for --sync asp and ssp:S");
    return FL_OK;
  }
  const char *mode = o->sync == GPU_TRAIN_SYNC_ASP ? "asp" : "ssp";
  const optim_options *p = &o->optim;
  if (o->staleness > 100000) return fl_set_error(FL_EINVAL, "--sync ssp:%u: S must be 0 to 100000", o->staleness);
  if (o->sync == GPU_TRAIN_SYNC_ASP && o->staleness)
    return fl_set_error(FL_EINVAL, "--sync asp has no staleness bound (use ssp:%u)", o->staleness);
  if (o->ps_fetch > 100000 || o->ps_push > 100000)
    return fl_set_error(FL_EINVAL, "--ps-fetch %u and --ps-push %u must be 1 to 100000", o->ps_fetch, o->ps_push);
  if (o->model == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--sync %s is for the data-parallel models (the transformer's tensor and pipeline "
                        "ranks hold different weights)", mode);
  /* The servers apply each worker's push as it comes: SGD's momentum would need a velocity
   * per worker or on the servers, whose stale mixes are not the momentum of synchronous SGD. */
  if (p->kind == OPTIM_SGD && p->momentum != 0)
    return fl_set_error(FL_EINVAL, "--momentum %g with --sync %s: the parameter servers apply plain SGD steps (each "
                        "push w -= lr g / workers), with no velocity; give --momentum 0, or use --optimizer adagrad or "
                        "adam (the servers' own updates)", (double)p->momentum, mode);
  if (p->kind != OPTIM_SGD && p->kind != OPTIM_ADAGRAD && p->kind != OPTIM_ADAM)
    return fl_set_error(FL_EINVAL, "--optimizer %s with --sync %s: the parameter servers update with sgd, adagrad or "
                        "adam (%s needs whole-weight norms or decoupled decay on the servers)",
                        optim_kind_name(p->kind), mode, optim_kind_name(p->kind));
  if (p->kind != OPTIM_SGD && (o->warmup_epochs > 0 || o->decay != OPTIM_DECAY_NONE))
    return fl_set_error(FL_EINVAL, "--optimizer %s with --sync %s runs on the servers at a fixed rate (--lr x --batch / "
                        "256): give --decay none and no --warmup", optim_kind_name(p->kind), mode);
  if (o->precision == FL_PRECISION_FP16)
    return fl_set_error(FL_EINVAL, "--precision fp16 needs --sync bsp (its loss scaler decides on averaged gradients)");
  if (o->accumulate > 1)
    return fl_set_error(FL_EINVAL, "--accumulate is for --sync bsp, local and adacomm (a parameter-server worker "
                        "pushes each step's gradients; see --ps-push)");
  if (o->resume_path)
    return fl_set_error(FL_EINVAL, "--resume with --sync %s: the servers' weights start from the seed (resume with "
                        "--sync bsp)", mode);
  return FL_OK;
}

/* --compress (gpu/parallel/compress.h): a spec that parses, on gradients that are allreduced. */
static fl_status validate_compress(const gpu_train_options *o) {
  compress_spec spec;
  fl_status s = compress_spec_parse(o->compress, &spec);
  if (s != FL_OK || spec.kind == COMPRESS_NONE) return s;
  if (o->model == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--compress %s is for the data-parallel models (the transformer averages each "
                        "chunk's gradients over its grid after backward)", o->compress);
  if (o->sync == GPU_TRAIN_SYNC_LOCAL || o->sync == GPU_TRAIN_SYNC_ADACOMM)
    return fl_set_error(FL_EINVAL, "--compress %s needs --sync bsp: local SGD and AdaComm allreduce no gradients "
                        "(each rank steps on its own and the weights are averaged every tau steps)", o->compress);
  if (GPU_TRAIN_SYNC_IS_PS(o->sync))
    return fl_set_error(FL_EINVAL, "--compress %s needs --sync bsp: with asp and ssp the workers push their "
                        "gradients to the parameter servers, with no allreduce to hook", o->compress);
  return FL_OK;
}

fl_status gpu_train_options_validate(const gpu_train_options *o) {
  if (!o) return fl_set_error(FL_EINVAL, "gpu_train: options are NULL");
  if ((unsigned)o->model > NN_RESNET50) return fl_set_error(FL_EINVAL, "--model: unknown model %d", (int)o->model);
  if ((o->model == NN_LIBRARY) != (o->model_library != NULL || o->builder != NULL))
    return fl_set_error(FL_EINVAL, o->model == NN_LIBRARY ? "gpu_train: a library model without its library or builder"
                                                         : "gpu_train: a model library or builder with a built-in model");
  if (!(o->label_smoothing >= 0 && o->label_smoothing < 1))
    return fl_set_error(FL_EINVAL, "--label-smoothing %g must be in [0, 1)", o->label_smoothing);
  if ((unsigned)o->sync > GPU_TRAIN_SYNC_SSP) return fl_set_error(FL_EINVAL, "--sync: unknown mode %d", (int)o->sync);
  if (o->tau < 1 || o->tau > 100000) return fl_set_error(FL_EINVAL, "--sync: a period of %u steps (1 to 100000)", o->tau);
  if ((o->sync == GPU_TRAIN_SYNC_LOCAL || o->sync == GPU_TRAIN_SYNC_ADACOMM) && o->model == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--sync local and adacomm are for the data-parallel models (the transformer's "
                        "tensor and pipeline ranks hold different weights)");
  if ((o->sync == GPU_TRAIN_SYNC_LOCAL || o->sync == GPU_TRAIN_SYNC_ADACOMM) && o->precision == FL_PRECISION_FP16)
    return fl_set_error(FL_EINVAL, "--precision fp16 needs --sync bsp: its loss scaler decides on the averaged "
                        "gradients, which local SGD does not form (use bf16)");
  if ((unsigned)o->precision > FL_PRECISION_FP16)
    return fl_set_error(FL_EINVAL, "--precision: unknown precision %d", (int)o->precision);
  if (o->precision != FL_PRECISION_FP32 && o->device != FL_DEVICE_CUDA)
    return fl_set_error(FL_EINVAL, "--precision %s needs --device cuda: the cpu device computes in fp32 only",
                        fl_precision_name(o->precision));
  if (o->precision == FL_PRECISION_FP16 && o->model == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--precision fp16 is for the data-parallel models (its loss scaler checks all of "
                        "the gradients, which the transformer spreads over its grid): use bf16");
  if ((unsigned)o->data >= DATASETS) return fl_set_error(FL_EINVAL, "--data: unknown data set %d", (int)o->data);
  if (o->data == GPU_TRAIN_EXAMPLES) {
    if (!o->train_examples || !o->test_examples)
      return fl_set_error(FL_EINVAL, "gpu_train: training on datasets needs a training and a test dataset");
    if (o->sample_ndim < 1 || o->sample_ndim > 3 || !o->sample_shape[0] || !o->sample_shape[1] || !o->sample_shape[2])
      return fl_set_error(FL_EINVAL, "gpu_train: a sample shape of %u dimensions (%u, %u, %u)", o->sample_ndim,
                          o->sample_shape[0], o->sample_shape[1], o->sample_shape[2]);
    if (o->classes < 1) return fl_set_error(FL_EINVAL, "gpu_train: training on datasets needs the classes (>= 1)");
  }
  bool folder = o->data == GPU_TRAIN_IMAGE_FOLDER, text = o->data == GPU_TRAIN_TEXT;
  if (o->gpt && (o->model != NN_TRANSFORMER || !text))
    return fl_set_error(FL_EINVAL, "--model gpt trains on --data text:PATH (this run's data is %s)",
                        gpu_train_dataset_name(o->data));
  if (text && !o->gpt) return fl_set_error(FL_EINVAL, "--data text:PATH is for --model gpt");
  if (text && (!o->data_path || !*o->data_path)) return fl_set_error(FL_EINVAL, "--data text:PATH needs its file");
  if (text && o->test_path)
    return fl_set_error(FL_EINVAL, "--test-data is not for --data text: (its test set is the file's last tenth)");
  if (o->seq && !o->gpt) return fl_set_error(FL_EINVAL, "--seq is for --model gpt");
  if (o->seq > 4096) return fl_set_error(FL_EINVAL, "--seq %u must be 1 to 4096", o->seq);
  bool files = (o->data >= GPU_TRAIN_LIBSVM && o->data <= GPU_TRAIN_IDX) || folder;
  if (folder && (!o->data_path || !*o->data_path))
    return fl_set_error(FL_EINVAL, "--data imagefolder:DIR needs its folder DIR (with DIR/train and DIR/val)");
  if (files && !folder && (!o->data_path || !o->test_path))
    return fl_set_error(FL_EINVAL, "--data %s needs %s", gpu_train_dataset_name(o->data),
                        o->data_path ? "--test-data (the set each epoch is evaluated on, in the same format)"
                                     : "its training file");
  if (!files && !text && (o->data_path || o->test_path))
    return fl_set_error(FL_EINVAL, "--test-data is for --data libsvm:, csv: and idx: (and imagefolder:; %s has its "
                        "own test set)", gpu_train_dataset_name(o->data));
  if (o->image_size && !folder) return fl_set_error(FL_EINVAL, "--image-size is for --data imagefolder:DIR");
  if (o->image_size > 1024) return fl_set_error(FL_EINVAL, "--image-size %u must be 1 to 1024", o->image_size);
  if (o->no_augment && !folder) return fl_set_error(FL_EINVAL, "--no-augment is for --data imagefolder:DIR");
  if (folder && o->model == NN_TRANSFORMER && !o->no_augment)
    return fl_set_error(FL_EINVAL, "--model transformer reads --data imagefolder:DIR with --no-augment only (its "
                        "ranks read image blocks)");
  if (o->device != FL_DEVICE_CPU && o->device != FL_DEVICE_CUDA)
    return fl_set_error(FL_EINVAL, "--device: unknown device kind %d", (int)o->device);
  if (o->ranks < 1 || o->ranks > 1024) return fl_set_error(FL_EINVAL, "--ranks %u must be 1 to 1024", o->ranks);
  if (o->batch < 1) return fl_set_error(FL_EINVAL, "--batch must be >= 1");
  if (o->batch % o->ranks)
    return fl_set_error(FL_EINVAL, "--batch %u is not a multiple of --ranks %u (each rank takes batch / ranks "
                        "images a step)", o->batch, o->ranks);
  if (o->batch > (1u << 20)) return fl_set_error(FL_EINVAL, "--batch %u is over 1048576", o->batch);
  uint32_t k = o->accumulate ? o->accumulate : 1;
  if (k > 1 && o->model == NN_TRANSFORMER)
    return fl_set_error(FL_EINVAL, "--accumulate is for the data-parallel models (the transformer splits a "
                        "replica's batch with --microbatches)");
  if (o->batch % ((uint64_t)o->ranks * k))
    return fl_set_error(FL_EINVAL, "--batch %u is not a multiple of --ranks %u x --accumulate %u = %llu (each rank "
                        "splits its batch / ranks images into --accumulate micro-batches of equal size)", o->batch,
                        o->ranks, k, (unsigned long long)o->ranks * k);
  if (!(o->lr > 0) || !isfinite(o->lr)) return fl_set_error(FL_EINVAL, "--lr %g must be a number > 0", o->lr);
  if (o->epochs < 1 || o->epochs > 100000) return fl_set_error(FL_EINVAL, "--epochs %u must be 1 to 100000", o->epochs);
  if (!(o->warmup_epochs >= 0) || !(o->warmup_epochs < o->epochs))
    return fl_set_error(FL_EINVAL, "--warmup %g must be >= 0 and less than --epochs %u", o->warmup_epochs, o->epochs);
  if ((unsigned)o->decay > OPTIM_DECAY_POLY) return fl_set_error(FL_EINVAL, "--decay: unknown decay %d", (int)o->decay);
  if (o->num_milestones < 0 || o->num_milestones > OPTIM_MAX_MILESTONES)
    return fl_set_error(FL_EINVAL, "--milestones: %d of them (at most %d)", o->num_milestones, OPTIM_MAX_MILESTONES);
  if (o->num_milestones && o->decay != OPTIM_DECAY_STEP)
    return fl_set_error(FL_EINVAL, "--milestones is for --decay step");
  for (int i = 0; i < o->num_milestones; i++)
    if (!(o->milestones[i] > 0) || !(o->milestones[i] < o->epochs) || (i && !(o->milestones[i] > o->milestones[i - 1])))
      return fl_set_error(FL_EINVAL, "--milestones: %g must be inside (0, --epochs %u) and after the one before",
                          o->milestones[i], o->epochs);
  fl_status os = validate_optimizer(o);
  if (os == FL_OK) os = validate_ps(o);
  if (os != FL_OK) return os;
  if ((unsigned)o->allreduce >= FL_ALLREDUCE_ALGO_COUNT)
    return fl_set_error(FL_EINVAL, "--allreduce: unknown algorithm %d", (int)o->allreduce);
  if (o->bucket_bytes && o->bucket_bytes < 4)
    return fl_set_error(FL_EINVAL, "--bucket-mb: a bucket must hold at least one float");
  if ((o->max_train_images || o->max_test_images) && o->data != GPU_TRAIN_FASHION_MNIST)
    return fl_set_error(FL_EINVAL, "--train-images and --test-images are for --data fashion-mnist "
                        "(synthetic-imagenet has --synthetic-images)");
  if (o->max_train_images && o->max_train_images < o->batch)
    return fl_set_error(FL_EINVAL, "--train-images %llu is less than one --batch %u: no step to take",
                        (unsigned long long)o->max_train_images, o->batch);
  if (o->max_test_images && o->max_test_images < o->ranks)
    return fl_set_error(FL_EINVAL, "--test-images %llu is less than --ranks %u (each rank evaluates a share)",
                        (unsigned long long)o->max_test_images, o->ranks);
  fl_status hs = validate_trick(o);
  if (hs == FL_OK) hs = validate_hybrid(o);
  if (hs == FL_OK) hs = validate_experts(o);
  if (hs == FL_OK) hs = validate_compress(o);
  if (hs != FL_OK) return hs;
  optim_schedule s;
  gpu_train_schedule(o, &s);
  return optim_schedule_validate(&s);
}
