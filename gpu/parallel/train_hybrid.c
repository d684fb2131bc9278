/*
 * gpu/parallel/train_hybrid.c: `flint train --model transformer`: the transformer
 * (gpu/parallel/transformer.h) trained on a grid of dp x tp x pp ranks
 * (gpu/parallel/pipeline.h) as ONE barrier stage, with the data-parallel trainer's client,
 * data, schedule, reports and retries (gpu/parallel/train_dp.c).
 *
 * The model reads an image as a sequence: its channels x height rows are the tokens and its
 * width the features of a token (Fashion-MNIST: 28 tokens of 28 features). `--model gpt`
 * reads windows of seq + 1 bytes of text (gpu/data/text.c) instead: the first seq bytes are
 * the tokens, the last seq the targets (text_tokens).
 *
 * The data. There is one barrier task per grid rank, numbered replica by replica (task
 * t = d x tp x pp + q is replica d's q-th rank; its rank in the communicators is the grid's,
 * pp_grid_rank). The cached data set's partition t holds runs of b = batch / world
 * consecutive images (data_options.run): of every global batch of B images, images
 * [t b, (t + 1) b). A step, each task reads its b images and the replica's ranks allgather
 * theirs in task order, so that every rank of replica d holds rows [d B / dp, (d + 1) B / dp)
 * of the global batch, in order (the first stage reads the images, the last the labels).
 * Without shuffling, the global batch of step k is then images [k B, (k + 1) B) in order on
 * every grid, as for one rank, and dropout masks, keyed by a row's place in the global batch,
 * are the same too: any grid takes the same steps as one rank up to float rounding, with
 * dropout on. (With shuffling, each task permutes its own images, which depends on the grid.)
 *
 * The test set (laid out the same way): every rank evaluates as many images as the smallest
 * share of any rank (so fewer than one global batch of the test set is left out), in batches
 * gathered over the replica as in training.
 *
 * Checkpoints. Every rank's state is its own (its chunks' weights and velocity), so the
 * stage's checkpoint is a sharded one: each rank encodes each chunk as a checkpoint blob
 * (gpu/nn/checkpoint.c) and the shards meet at rank 0 through the barrier's all_gather (in
 * pieces: its messages are at most 1 MiB), which puts:
 *   off  size
 *     0     8  magic "FLNTSHRD"
 *     8     4  version (1; 2 with replicated stages)
 *    12    16  dp, tp, pp, chunks (u32 each)
 *    28     4  n = pp x chunks + 1, then n u32: the stage cut (unit boundaries), which a
 *              retry builds its trainer with (the partitioner's profile might cut otherwise)
 *   ..         version 2 (replicated stages) only: pp u32, each stage's replicas
 *   ..         per task in task order: u64 bytes, then per chunk: u64 bytes, a checkpoint blob
 * A retried attempt restores its own shard after checking the grid; `--checkpoint` writes the
 * same blob to the file.
 *
 * The timeline: each rank keeps the events of its last training step; at the end they meet
 * at rank 0 with every rank's peak activation bytes, in its second output record:
 *   u32 world, then per rank: u64 bytes, u32 rank, u32 pipeline index, u64 peak bytes,
 *   u64 events, events x {i32 kind, i32 micro-batch, i32 chunk, i32 0, f64 t0, f64 t1}.
 * The client (train_hybrid_finish) writes them as CSV and SVG.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "common/config.h"
#include "gpu/data/data.h"
#include "gpu/parallel/pipeline.h"
#include "gpu/parallel/train_rank.h"

#define SHARD_MAGIC "FLNTSHRD"
#define SHARD_VERSION 1u
#define SHARD_VERSION_REPLICATED 2u /* version 1 and the stages' replica counts */
#define GATHER_PIECE (1u << 20) /* fl_barrier_all_gather's limit per message */
#define EVENT_BYTES 32u

typedef struct hybrid_rank {
  fl_barrier *b;
  const train_arg *a;
  uint32_t rank, world, attempt;
  pp_grid grid;
  pp_coords me;
  int grid_rank; /* in the communicators (pp_grid_rank); tasks are numbered otherwise */
  fl_device *dev;
  fl_comm *comm;    /* the world: NCCL for cuda, else host */
  fl_comm *stages;  /* a host world for the pipeline's transfers when comm is NCCL */
  fl_comm *replica; /* the tp x pp ranks of this rank's data-parallel index */
  pp_trainer *trainer;
  data_reader *train, *test;
  uint32_t local;      /* images this rank reads a step: batch / world */
  size_t image_floats; /* channels x height x width */
  float *images_h;     /* local images */
  int32_t *labels_h;
  float *pack_h;       /* local x (image_floats + 1): images, then labels as floats */
  float *gathered_h;   /* replica size x the same */
  float *x_h;          /* the replica's batch */
  int32_t *y_h;
  float *xw_h;         /* pipedream, 2bw: a window of the replica's batches, and their rates */
  int32_t *yw_h;
  float *lr_h;
  fl_tensor pack_t, gathered_t; /* the same on the device, for the replica's allgather */
  pp_event *events;    /* the last training step's timeline */
  size_t nevents;
  uint64_t peak_bytes; /* the most activation bytes this rank held in a step */
  /* replicated stages: each stage's replicas (--replicas, or a retry's checkpoint, or after
   * the trainer's creation the partitioner's with auto:W); all 0: not replicated */
  uint32_t plan[GPU_TRAIN_MAX_STAGES];
} hybrid_rank;

static void put_u32(fl_buf *b, uint32_t v, fl_status *s) {
  if (*s == FL_OK) *s = fl_buf_append(b, &v, sizeof v);
}
static void put_u64(fl_buf *b, uint64_t v, fl_status *s) {
  if (*s == FL_OK) *s = fl_buf_append(b, &v, sizeof v);
}

/* A bounded reader over untrusted bytes. */
typedef struct cursor {
  const uint8_t *p, *end;
} cursor;
static bool cursor_take(cursor *c, void *dst, size_t n) {
  if ((size_t)(c->end - c->p) < n) return false;
  memcpy(dst, c->p, n);
  c->p += n;
  return true;
}
/* A length-prefixed piece: its view, the cursor moved past it. */
static bool cursor_take_piece(cursor *c, cursor *piece) {
  uint64_t n;
  if (!cursor_take(c, &n, sizeof n) || n > (uint64_t)(c->end - c->p)) return false;
  *piece = (cursor){c->p, c->p + n};
  c->p += n;
  return true;
}

/* Every rank's `mine` (of any size) at rank 0, in pieces small enough for all_gather: *all
 * (rank 0 only; world buffers) gets them in rank order. Collective over the stage. */
static fl_status gather_to_rank0(hybrid_rank *r, fl_bytes mine, fl_buf *all) {
  fl_status status = FL_OK;
  fl_records *got = NULL;
  uint64_t len = mine.len, most = 0;
  FL_CHECK(fl_barrier_all_gather(r->b, fl_bytes_of(&len, sizeof len), 0, &got));
  for (uint32_t i = 0; i < r->world; i++) {
    fl_bytes rec = fl_records_get(got, i);
    uint64_t v;
    if (rec.len != sizeof v) FL_CHECK(fl_set_error(FL_EPROTO, "rank %u sent a length of %zu bytes", i, rec.len));
    memcpy(&v, rec.data, sizeof v);
    if (v > most) most = v;
  }
  fl_records_free(got);
  got = NULL;
  for (uint64_t off = 0; off < most; off += GATHER_PIECE) {
    size_t n = off < mine.len ? (size_t)(mine.len - off < GATHER_PIECE ? mine.len - off : GATHER_PIECE) : 0;
    FL_CHECK(fl_barrier_all_gather(r->b, fl_bytes_of(mine.data + (n ? off : 0), n), 0, &got));
    if (r->rank == 0)
      for (uint32_t i = 0; i < r->world; i++) {
        fl_bytes rec = fl_records_get(got, i);
        FL_CHECK(fl_buf_append(&all[i], rec.data, rec.len));
      }
    fl_records_free(got);
    got = NULL;
  }
cleanup:
  fl_records_free(got);
  return status;
}

/* ---- the replica's batch ------------------------------------------------------------------ */

/* GPT: each row of x_h is a window of seq + 1 bytes; the model reads the first seq
 * ([rows, seq, 1], compacted in place: a row never moves past its own window) and predicts
 * the last seq (y_h, [rows, seq]). */
/* What the trainer takes of a gathered row: its input floats and its targets. */
static size_t row_inputs(const hybrid_rank *r) { return r->a->gpt ? r->a->seq : r->image_floats; }
static size_t row_targets(const hybrid_rank *r) { return r->a->gpt ? r->a->seq : 1; }

static void text_tokens(hybrid_rank *r, uint32_t rows) {
  size_t seq = r->a->seq, w = seq + 1;
  for (size_t i = 0; i < rows; i++)
    for (size_t t = 0; t < seq; t++) r->y_h[i * seq + t] = (int32_t)r->x_h[i * w + t + 1];
  for (size_t i = 0; i < rows; i++) memmove(r->x_h + i * seq, r->x_h + i * w, seq * sizeof(float));
}

/* The replica's batch from each of its ranks' n images (images_h, labels_h): rows in the
 * order of the replica's ranks, into x_h and y_h. */
static fl_status gather_batch(hybrid_rank *r, uint32_t n) {
  fl_status status = FL_OK;
  size_t F = r->image_floats, per = (size_t)n * (F + 1);
  int size = fl_comm_size(r->replica);
  memcpy(r->pack_h, r->images_h, (size_t)n * F * sizeof(float));
  for (uint32_t i = 0; i < n; i++) r->pack_h[(size_t)n * F + i] = (float)r->labels_h[i];
  if (size == 1) {
    memcpy(r->gathered_h, r->pack_h, per * sizeof(float));
  } else {
    int64_t one[1] = {(int64_t)per}, all[1] = {(int64_t)per * size};
    FL_CHECK(tensor_ensure(&r->pack_t, r->dev, 1, one));
    FL_CHECK(tensor_ensure(&r->gathered_t, r->dev, 1, all));
    FL_CHECK(fl_tensor_write(&r->pack_t, r->pack_h, per));
    FL_CHECK(fl_comm_allgather(r->replica, &r->pack_t, &r->gathered_t));
    FL_CHECK(fl_tensor_read(&r->gathered_t, r->gathered_h, per * (size_t)size));
  }
  for (int q = 0; q < size; q++) {
    const float *block = r->gathered_h + (size_t)q * per;
    memcpy(r->x_h + (size_t)q * n * F, block, (size_t)n * F * sizeof(float));
    for (uint32_t i = 0; i < n; i++) r->y_h[(size_t)q * n + i] = (int32_t)block[(size_t)n * F + i];
  }
  if (r->a->gpt) text_tokens(r, n * (uint32_t)size);
cleanup:
  return status;
}

/* ---- checkpoints -------------------------------------------------------------------------- */

static fl_status encode_shard(hybrid_rank *r, const checkpoint_state *cs, fl_buf *out) {
  fl_status status = FL_OK;
  fl_buf one = FL_BUF_INIT;
  out->len = 0;
  for (int c = 0; c < pp_trainer_num_chunks(r->trainer); c++) {
    tfm_chunk *ch = pp_trainer_chunk(r->trainer, c);
    FL_CHECK(checkpoint_encode(tfm_chunk_values(ch), NULL, pp_trainer_chunk_optimizer(r->trainer, c), cs, &one));
    put_u64(out, one.len, &status);
    if (status == FL_OK) status = fl_buf_append(out, one.data, one.len);
    FL_CHECK(status);
  }
cleanup:
  fl_buf_free(&one);
  return status;
}

/* Puts the stage's checkpoint: every rank's shard, joined at rank 0. With emit, rank 0 keeps
 * the joined blob in *joined. */
static fl_status put_checkpoint(hybrid_rank *r, const checkpoint_state *cs, fl_buf *joined) {
  fl_status status = FL_OK;
  fl_buf shard = FL_BUF_INIT;
  fl_buf *all = common_calloc(r->world, sizeof *all);
  if (!all) return fl_set_error(FL_ENOMEM, "rank %u: out of memory for the checkpoint", r->rank);
  FL_CHECK(encode_shard(r, cs, &shard));
  FL_CHECK(gather_to_rank0(r, fl_buf_bytes(&shard), all));
  if (r->rank == 0) {
    joined->len = 0;
    FL_CHECK(fl_buf_append(joined, SHARD_MAGIC, 8));
    put_u32(joined, r->plan[0] ? SHARD_VERSION_REPLICATED : SHARD_VERSION, &status);
    put_u32(joined, (uint32_t)r->grid.dp, &status);
    put_u32(joined, (uint32_t)r->grid.tp, &status);
    put_u32(joined, (uint32_t)r->grid.pp, &status);
    put_u32(joined, (uint32_t)pp_trainer_num_chunks(r->trainer), &status);
    /* The stage cut: a retry must cut the model as this attempt did (the partitioner's
     * profile could choose another). */
    uint32_t nb = (uint32_t)(r->grid.pp * pp_trainer_num_chunks(r->trainer)) + 1;
    put_u32(joined, nb, &status);
    for (uint32_t i = 0; i < nb; i++) put_u32(joined, (uint32_t)pp_trainer_bounds(r->trainer)[i], &status);
    if (r->plan[0])
      for (int s = 0; s < r->grid.pp; s++) put_u32(joined, r->plan[s], &status);
    for (uint32_t i = 0; i < r->world && status == FL_OK; i++) {
      put_u64(joined, all[i].len, &status);
      if (status == FL_OK) status = fl_buf_append(joined, all[i].data, all[i].len);
    }
    FL_CHECK(status);
    FL_CHECK(fl_barrier_checkpoint_put(r->b, fl_buf_bytes(joined)));
  }
cleanup:
  for (uint32_t i = 0; i < r->world; i++) fl_buf_free(&all[i]);
  common_free(all);
  fl_buf_free(&shard);
  return status;
}

/* Reads a joined checkpoint's header: checks it against the run's grid, v chunks and replicas
 * (all 0: none; with auto_w, W of --replicas auto:W, g.pp is the most stages and the
 * checkpoint's plan is taken) and copies the stage cut into bounds (pp x v + 1 of them) and
 * the replicas into plan, their stages into *pp; *c is left at rank 0's shard. FL_EFORMAT
 * names what is wrong. */
static fl_status read_header(fl_bytes blob, pp_grid g, uint32_t chunks, const uint32_t *replicas, uint32_t auto_w,
                             int *bounds, uint32_t *plan, int *pp, cursor *c) {
  *c = (cursor){blob.data, blob.data + blob.len};
  char magic[8];
  uint32_t head[6];
  if (!cursor_take(c, magic, 8) || memcmp(magic, SHARD_MAGIC, 8) != 0 || !cursor_take(c, head, sizeof head))
    return fl_set_error(FL_EFORMAT, "the stage's checkpoint is not a sharded one (magic %s)", SHARD_MAGIC);
  bool replicated = replicas[0] || auto_w;
  uint32_t want = replicated ? SHARD_VERSION_REPLICATED : SHARD_VERSION;
  if (head[0] != want)
    return fl_set_error(FL_EFORMAT, "sharded checkpoint version %u, but this run's is %u (%s)", head[0], want,
                        replicated ? "replicated stages" : "no replicated stage");
  if (auto_w && head[3] >= 1 && head[3] <= (uint32_t)g.pp) g.pp = (int)head[3]; /* the partitioner's */
  uint32_t nb = (uint32_t)g.pp * chunks + 1;
  if (head[1] != (uint32_t)g.dp || head[2] != (uint32_t)g.tp || head[3] != (uint32_t)g.pp || head[4] != chunks ||
      head[5] != nb)
    return fl_set_error(FL_EFORMAT, "the checkpoint is of a %ux%ux%u grid with %u chunks, this run %dx%dx%d with %u",
                        head[1], head[2], head[3], head[4], g.dp, g.tp, g.pp, chunks);
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t b;
    if (!cursor_take(c, &b, sizeof b) || b > (1u << 20) || (i > 0 && (int)b <= bounds[i - 1]))
      return fl_set_error(FL_EFORMAT, "the checkpoint's stage cut is malformed at boundary %u", i);
    bounds[i] = (int)b;
  }
  uint32_t sum = 0;
  memset(plan, 0, GPU_TRAIN_MAX_STAGES * sizeof *plan);
  for (int s = 0; replicated && s < g.pp; s++) {
    uint32_t n;
    if (!cursor_take(c, &n, sizeof n) || n < 1 || n > 64 || (!auto_w && n != replicas[s]))
      return fl_set_error(FL_EFORMAT, "the checkpoint's stage %d has other replicas than this run's", s);
    plan[s] = n;
    sum += n;
  }
  if (auto_w && sum != auto_w)
    return fl_set_error(FL_EFORMAT, "the checkpoint's replicas add up to %u ranks, --replicas auto:%u", sum, auto_w);
  *pp = g.pp;
  return FL_OK;
}

/* Restores this rank's shard of a joined checkpoint (its header already read into *c). */
static fl_status restore_checkpoint(hybrid_rank *r, cursor c, checkpoint_state *cs) {
  cursor shard, piece;
  int chunks = pp_trainer_num_chunks(r->trainer);
  for (uint32_t i = 0; i <= r->rank; i++)
    if (!cursor_take_piece(&c, &shard)) return fl_set_error(FL_EFORMAT, "the checkpoint is truncated at rank %u's shard", i);
  for (int k = 0; k < chunks; k++) {
    if (!cursor_take_piece(&shard, &piece))
      return fl_set_error(FL_EFORMAT, "rank %u's shard is truncated at chunk %d", r->rank, k);
    tfm_chunk *ch = pp_trainer_chunk(r->trainer, k);
    fl_status s = checkpoint_decode(fl_bytes_of(piece.p, (size_t)(piece.end - piece.p)), tfm_chunk_values(ch), NULL,
                                    pp_trainer_chunk_optimizer(r->trainer, k), cs);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

/* ---- the rank ----------------------------------------------------------------------------- */

static void hybrid_free(hybrid_rank *r) {
  pp_trainer_destroy(r->trainer);
  fl_comm_destroy(r->replica);
  fl_comm_destroy(r->stages);
  fl_comm_destroy(r->comm);
  tensor_release(&r->pack_t);
  tensor_release(&r->gathered_t);
  common_free(r->images_h);
  common_free(r->labels_h);
  common_free(r->pack_h);
  common_free(r->gathered_h);
  common_free(r->x_h);
  common_free(r->y_h);
  common_free(r->xw_h);
  common_free(r->yw_h);
  common_free(r->lr_h);
  common_free(r->events);
  fl_device_close(r->dev);
  data_reader_destroy(r->train);
  data_reader_destroy(r->test);
}

/* bounds: the stage cut to use (NULL: the partitioner's). */
static fl_status hybrid_setup(hybrid_rank *r, fl_iter *in, const int *bounds) {
  const train_arg *a = r->a;
  fl_status status = FL_OK;
  int replicas[GPU_TRAIN_MAX_STAGES];
  uint32_t replica_size = a->tp * a->pp, q;
  if (r->plan[0]) {
    /* Replicated stages (r->grid.pp of them): a replica is a pipeline of sum(replicas) ranks,
     * stage by stage, and the communicators' order is the tasks'. */
    replica_size = 0;
    for (int s = 0; s < r->grid.pp; s++) replica_size += r->plan[s];
    if (replica_size * a->dp != r->world)
      FL_CHECK(fl_set_error(FL_EINVAL, "rank %u: --dp %u x the replicas' %u ranks is not the stage's %u tasks", r->rank,
                            a->dp, replica_size, r->world));
    q = r->rank % replica_size;
    r->me = (pp_coords){.dp = (int)(r->rank / replica_size)};
    for (uint32_t s = 0, base = 0; s < (uint32_t)r->grid.pp; base += r->plan[s], s++) {
      replicas[s] = (int)r->plan[s];
      if (q >= base) r->me.pp = (int)s;
    }
    r->grid_rank = (int)r->rank;
  } else if (a->replicas_auto) {
    /* The partitioner places this rank (its stage is known once the trainer is made). */
    replica_size = a->replicas_auto;
    if (replica_size * a->dp != r->world)
      FL_CHECK(fl_set_error(FL_EINVAL, "rank %u: --dp %u x auto:%u ranks is not the stage's %u tasks", r->rank, a->dp,
                            replica_size, r->world));
    r->me = (pp_coords){.dp = (int)(r->rank / replica_size)};
    r->grid_rank = (int)r->rank;
  } else {
    FL_CHECK(pp_grid_check(r->grid, (int)r->world));
    /* Tasks are numbered replica by replica (their partitions hold the replicas' rows in
     * order); the grid's rank order puts tensor-parallel ranks innermost, then replicas. */
    q = r->rank % replica_size;
    r->me = (pp_coords){.dp = (int)(r->rank / replica_size), .tp = (int)(q % a->tp), .pp = (int)(q / a->tp)};
    r->grid_rank = pp_grid_rank(r->grid, r->me);
  }
  r->local = a->batch / r->world;
  FL_CHECK(data_reader_create(r->local, &r->train));
  FL_CHECK(data_reader_create(r->local, &r->test));
  data_reader_set_prefetch(r->train, config_bool(CONFIG_TRAIN_PREFETCH));
  data_reader_set_prefetch(r->test, config_bool(CONFIG_TRAIN_PREFETCH));
  FL_CHECK(data_reader_add_all(in, r->train, r->test));
  if (data_reader_images(r->train) &&
      (data_reader_channels(r->train) != a->channels || data_reader_height(r->train) != a->height ||
       data_reader_width(r->train) != a->width || data_reader_classes(r->train) != a->classes))
    FL_CHECK(fl_set_error(FL_ECORRUPT, "rank %u: its images are %ux%ux%u of %u classes, the run's %ux%ux%u of %u",
                          r->rank, data_reader_channels(r->train), data_reader_height(r->train),
                          data_reader_width(r->train), data_reader_classes(r->train), a->channels, a->height,
                          a->width, a->classes));
  r->image_floats = (size_t)a->channels * a->height * a->width;
  size_t rows = (size_t)r->local * replica_size;
  r->images_h = common_malloc((size_t)r->local * r->image_floats * sizeof(float));
  r->labels_h = common_malloc((size_t)r->local * sizeof(int32_t));
  r->pack_h = common_malloc((size_t)r->local * (r->image_floats + 1) * sizeof(float));
  r->gathered_h = common_malloc(replica_size * r->local * (r->image_floats + 1) * sizeof(float));
  r->x_h = common_malloc(rows * r->image_floats * sizeof(float));
  r->y_h = common_malloc(rows * (a->gpt ? a->seq : 1) * sizeof(int32_t)); /* GPT: a target per byte */
  if (!r->images_h || !r->labels_h || !r->pack_h || !r->gathered_h || !r->x_h || !r->y_h)
    FL_CHECK(fl_set_error(FL_ENOMEM, "rank %u: out of memory for batches of %zu rows", r->rank, rows));
  if (a->pipeline == PP_PIPEDREAM || a->pipeline == PP_2BW) {
    /* A window keeps each batch as the trainer takes it: GPT rows are seq tokens (text_tokens
     * packed them) with seq targets, image rows image_floats with one label. */
    r->xw_h = common_malloc(a->window * rows * row_inputs(r) * sizeof(float));
    r->yw_h = common_malloc(a->window * rows * row_targets(r) * sizeof(int32_t));
    r->lr_h = common_malloc(a->window * sizeof(float));
    if (!r->xw_h || !r->yw_h || !r->lr_h)
      FL_CHECK(fl_set_error(FL_ENOMEM, "rank %u: out of memory for a window of %u batches of %zu rows", r->rank,
                            a->window, rows));
  }
  FL_CHECK(train_device_open(r->b, a->device, a->precision, &r->dev));
  FL_CHECK(train_connect(r->b, r->dev, a->device, a->allreduce, false, r->grid_rank, &r->comm));
  if (a->pp > 1 && strcmp(fl_comm_backend(r->comm), "host") != 0)
    FL_CHECK(train_connect(r->b, r->dev, a->device, a->allreduce, true, r->grid_rank, &r->stages));
  pp_options po = {.spec = {.seq = a->gpt ? (int)a->seq : (int)(a->channels * a->height), .features = (int)a->width,
                            .hidden = (int)a->hidden, .heads = (int)a->heads, .ffn = (int)a->ffn,
                            .blocks = (int)a->blocks, .classes = (int)a->classes, .dropout = a->dropout,
                            .seed = a->seed, .kind = a->gpt ? TFM_GPT : TFM_ENCODER,
                            .vocab = a->gpt ? (int)a->classes : 0, .sequence_parallel = a->sequence_parallel,
                            .selective_recompute = a->recompute_selective, .experts = (int)a->experts,
                            .top_k = (int)a->top_k, .capacity_factor = a->capacity_factor, .moe_alpha = a->moe_alpha,
                            .moe_every = (int)a->moe_every},
                   .grid = r->grid, .schedule = a->pipeline, .microbatches = (int)a->microbatches,
                   .chunks = (int)a->chunks, .recompute = a->recompute, .optim = a->optim,
                   .bounds = bounds, .stage_world = r->stages, .vertical_sync = a->vertical_sync,
                   .replicas = r->plan[0] ? replicas : NULL,
                   .replicas_auto = r->plan[0] ? 0 : (int)a->replicas_auto};
  FL_CHECK(pp_trainer_create(r->dev, r->comm, &po, &r->trainer));
  if (po.replicas_auto) { /* the partitioner's plan, from here on as if given */
    r->grid.pp = pp_trainer_num_stages(r->trainer);
    r->me.pp = pp_trainer_coords(r->trainer).pp;
    for (int s = 0; s < r->grid.pp; s++) r->plan[s] = (uint32_t)pp_trainer_stage_replicas(r->trainer, s);
  }
  /* After the trainer's splits, in the same order on every rank. */
  FL_CHECK(fl_comm_split(r->comm, r->me.dp, (int)r->rank, &r->replica));
cleanup:
  return status;
}

static fl_status keep_timeline(hybrid_rank *r, const pp_step_stats *st) {
  if (st->num_events > r->nevents || !r->events) {
    pp_event *e = common_realloc(r->events, (st->num_events ? st->num_events : 1) * sizeof *e);
    if (!e) return fl_set_error(FL_ENOMEM, "rank %u: out of memory for the timeline", r->rank);
    r->events = e;
  }
  memcpy(r->events, st->events, st->num_events * sizeof *r->events);
  r->nevents = st->num_events;
  if (st->peak_activation_bytes > r->peak_bytes) r->peak_bytes = st->peak_activation_bytes;
  return FL_OK;
}

/* One test batch (train_evaluate_share's): the replica's rows gathered, then its forward. */
static fl_status hybrid_eval_batch(void *user, uint32_t n, double *loss_sum, double *correct) {
  hybrid_rank *r = user;
  fl_status status = gather_batch(r, n);
  if (status != FL_OK) return status;
  return pp_trainer_evaluate(r->trainer, r->x_h, r->y_h, (int)(n * (uint32_t)fl_comm_size(r->replica)), loss_sum,
                             correct);
}

/* This rank's peak and timeline, as in the record described at the top. */
static fl_status encode_timeline(hybrid_rank *r, fl_buf *out) {
  fl_status status = FL_OK;
  put_u32(out, (uint32_t)r->grid_rank, &status);
  put_u32(out, (uint32_t)r->me.pp, &status);
  put_u64(out, r->peak_bytes, &status);
  put_u64(out, r->nevents, &status);
  for (size_t i = 0; i < r->nevents && status == FL_OK; i++) {
    const pp_event *e = &r->events[i];
    int32_t ints[4] = {(int32_t)e->kind, e->microbatch, e->chunk, 0};
    double ts[2] = {e->t0, e->t1};
    status = fl_buf_append(out, ints, sizeof ints);
    if (status == FL_OK) status = fl_buf_append(out, ts, sizeof ts);
  }
  return status;
}

static fl_status emit_timelines(hybrid_rank *r, fl_emitter *out) {
  fl_status status = FL_OK;
  fl_buf mine = FL_BUF_INIT, joined = FL_BUF_INIT;
  fl_buf *all = common_calloc(r->world, sizeof *all);
  if (!all) return fl_set_error(FL_ENOMEM, "rank %u: out of memory for the timelines", r->rank);
  FL_CHECK(encode_timeline(r, &mine));
  FL_CHECK(gather_to_rank0(r, fl_buf_bytes(&mine), all));
  if (r->rank == 0) {
    put_u32(&joined, r->world, &status);
    for (uint32_t i = 0; i < r->world && status == FL_OK; i++) {
      put_u64(&joined, all[i].len, &status);
      if (status == FL_OK) status = fl_buf_append(&joined, all[i].data, all[i].len);
    }
    FL_CHECK(status);
    FL_CHECK(fl_emit(out, joined.data, joined.len));
  }
cleanup:
  for (uint32_t i = 0; i < r->world; i++) fl_buf_free(&all[i]);
  common_free(all);
  fl_buf_free(&mine);
  fl_buf_free(&joined);
  return status;
}

FL_API fl_status gpu_train_hybrid_rank(fl_barrier *b, fl_iter *in, fl_emitter *out, const void *arg) {
  train_arg a;
  memcpy(&a, arg, sizeof a);
  hybrid_rank r = {.b = b, .a = &a, .rank = fl_barrier_rank(b), .world = fl_barrier_world(b),
                   .attempt = fl_barrier_attempt(b)};
  fl_status status = FL_OK;
  fl_buf blob = FL_BUF_INIT;
  /* A retry first reads the checkpoint: it holds the stage cut to build the trainer with. */
  checkpoint_state cs = {0};
  cursor shards = {0};
  int *bounds = NULL;
  bool restore = false;
  r.grid = (pp_grid){(int)a.dp, (int)a.tp, (int)a.pp};
  memcpy(r.plan, a.replicas, sizeof r.plan);
  if (r.attempt > 0) {
    fl_status got = fl_barrier_checkpoint_get(b, &blob);
    if (got == FL_OK) {
      if (!(bounds = common_malloc(((size_t)a.pp * a.chunks + 1) * sizeof *bounds)))
        FL_CHECK(fl_set_error(FL_ENOMEM, "rank %u: out of memory for the stage cut", r.rank));
      FL_CHECK(read_header(fl_buf_bytes(&blob), r.grid, a.chunks, a.replicas, a.replicas_auto, bounds, r.plan,
                           &r.grid.pp, &shards));
      restore = true;
    } else if (got != FL_ENOENT) {
      FL_CHECK(got);
    }
  }
  /* The checkpoint's cut, else --plan auto's, else the partitioner's. */
  FL_CHECK(hybrid_setup(&r, in, restore ? bounds : a.plan_cut ? (const int *)a.plan_bounds : NULL));
  if (restore) FL_CHECK(restore_checkpoint(&r, shards, &cs));

  uint64_t steps = 0;
  FL_CHECK(train_agree_min(b, data_reader_batches(r.train, false), &steps));
  if (steps == 0)
    FL_CHECK(fl_set_error(FL_EINVAL, "a rank has fewer than %u training images (batch %u over %u ranks): make "
                          "--batch smaller or the data larger", r.local, a.batch, r.world));
  const uint32_t resumed = cs.epoch;
  const uint32_t rows = r.local * (uint32_t)fl_comm_size(r.replica);
  uint64_t report_every = steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH ? steps / TRAIN_PROGRESS_REPORTS_PER_EPOCH : 1;
  train_report last = {0};
  double lr = cs.lr;
  for (uint32_t epoch = cs.epoch; epoch < a.epochs; epoch++) {
    double t0 = common_now_s(), loss = 0, acc = 0, bubble = 0, theory = 0, aux = 0, dropped = 0;
    data_reader_start_epoch(r.train, a.seed, epoch, a.shuffle, steps, false);
    /* pipedream and 2bw train a window of batches at once (the weights change inside it);
     * the other schedules one batch a step. */
    const bool async = a.pipeline == PP_PIPEDREAM || a.pipeline == PP_2BW;
    for (uint64_t i = 0; i < steps;) {
      uint64_t count = async && steps - i > a.window ? a.window : async ? steps - i : 1;
      pp_step_stats st;
      pp_window_stats ws = {0};
      for (uint64_t j = 0; j < count; j++) {
        uint32_t n = data_reader_next(r.train, r.images_h, r.labels_h);
        if (n != r.local)
          FL_CHECK(fl_set_error(FL_EINTERNAL, "rank %u: step %llu of epoch %u got %u images, not %u", r.rank,
                                (unsigned long long)(i + j), epoch + 1, n, r.local));
        FL_CHECK(gather_batch(&r, n));
        if (async) {
          size_t xs = (size_t)rows * row_inputs(&r), ys = (size_t)rows * row_targets(&r);
          memcpy(r.xw_h + j * xs, r.x_h, xs * sizeof(float));
          memcpy(r.yw_h + j * ys, r.y_h, ys * sizeof(int32_t));
          r.lr_h[j] = (float)optim_lr_at(&a.schedule, epoch + (double)(i + j) / (double)steps);
        }
      }
      if (async) {
        FL_CHECK(pp_trainer_train_window(r.trainer, r.xw_h, r.yw_h, (int)rows, (int)count, cs.step, r.lr_h, &ws));
        st = ws.step;
      } else {
        FL_CHECK(pp_trainer_compute_gradients(r.trainer, r.x_h, r.y_h, (int)rows, cs.step, &st));
      }
      for (uint64_t j = 0; j < count; j++, i++) {
        double step_loss = async ? ws.loss[j] : st.loss, step_acc = async ? ws.accuracy[j] : st.accuracy;
        lr = async ? r.lr_h[j] : optim_lr_at(&a.schedule, epoch + (double)i / (double)steps);
        /* The loss is the world's (allreduced): every rank sees it non-finite at the same step
         * and stops there, returning FL_OK (a retry would only diverge again); the client fails
         * the run with rank 0's report. */
        if (!isfinite(step_loss)) {
          train_report bad = {.kind = REPORT_DIVERGED, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                              .step = cs.step + 1, .steps_per_epoch = steps, .done = i + 1, .loss = step_loss,
                              .lr = lr, .pid = (int64_t)getpid()};
          if (r.rank == 0) FL_CHECK(fl_emit(out, &bad, sizeof bad));
          goto cleanup;
        }
        if (!async) FL_CHECK(pp_trainer_apply(r.trainer, (float)lr, &st));
        if (j + 1 == count) FL_CHECK(keep_timeline(&r, &st));
        loss += step_loss;
        acc += step_acc;
        bubble += st.bubble; /* a window's bubble counts for each of its steps */
        aux += st.aux_loss;
        dropped += st.dropped_fraction;
        theory = st.bubble_theory;
        cs.step++;
        if (r.rank == 0 && ((i + 1) % report_every == 0 || i + 1 == steps)) {
          double secs = common_now_s() - t0;
          train_report rep = {.kind = REPORT_PROGRESS, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                              .step = cs.step, .steps_per_epoch = steps, .done = i + 1, .loss = loss / (double)(i + 1),
                              .acc = acc / (double)(i + 1), .lr = lr,
                              .images_per_s = secs > 0 ? (double)(i + 1) * a.batch / secs : 0, .seconds = secs,
                              .resumed_epoch = resumed, .pid = (int64_t)getpid(), .aux_loss = aux / (double)(i + 1),
                              .dropped_fraction = dropped / (double)(i + 1)};
          FL_CHECK(fl_barrier_report(b, fl_bytes_of(&rep, sizeof rep)));
        }
      }
    }
    double train_secs = common_now_s() - t0;
    double test_loss = NAN, test_acc = NAN;
    /* GPT: the loss and accuracy are per byte predicted. */
    FL_CHECK(train_evaluate_share(b, r.test, a.seed, epoch, r.images_h, r.labels_h, a.gpt ? a.seq : 1,
                                  hybrid_eval_batch, &r, &test_loss, &test_acc));
    cs.epoch = epoch + 1;
    cs.position = epoch + 1;
    cs.lr = lr;
    last = (train_report){.kind = REPORT_EPOCH, .epoch = epoch + 1, .epochs = a.epochs, .attempt = r.attempt,
                          .step = cs.step, .steps_per_epoch = steps, .done = steps, .loss = loss / (double)steps,
                          .acc = acc / (double)steps, .test_loss = test_loss, .test_acc = test_acc, .lr = lr,
                          .images_per_s = train_secs > 0 ? (double)steps * a.batch / train_secs : 0,
                          .seconds = common_now_s() - t0, .resumed_epoch = resumed, .pid = (int64_t)getpid(),
                          .bubble = bubble / (double)steps, .bubble_theory = theory,
                          .aux_loss = aux / (double)steps, .dropped_fraction = dropped / (double)steps,
                          .link_bytes_per_s = pp_trainer_link_bytes_per_s(r.trainer)};
    /* The checkpoint goes first, so that an epoch the client has seen is never trained again. */
    FL_CHECK(put_checkpoint(&r, &cs, &blob));
    if (r.rank == 0) FL_CHECK(fl_barrier_report(b, fl_bytes_of(&last, sizeof last)));
  }
  if (r.rank == 0) FL_CHECK(fl_emit(out, &last, sizeof last));
  FL_CHECK(emit_timelines(&r, out));
  /* Rank 0's blob is the last it put, or (an attempt that resumed after the last epoch) the
   * one it restored. */
  if (r.rank == 0 && a.emit_checkpoint) FL_CHECK(fl_emit(out, blob.data, blob.len));
cleanup:
  common_free(bounds);
  fl_buf_free(&blob);
  hybrid_free(&r);
  return status;
}

/* ---- the client ---------------------------------------------------------------------------- */

fl_status train_hybrid_finish(const gpu_train_options *o, fl_bytes ranks, gpu_train_result *res) {
  fl_status status = FL_OK;
  cursor c = {ranks.data, ranks.data + ranks.len};
  uint32_t world;
  if (!cursor_take(&c, &world, sizeof world) || world != gpu_train_world(o))
    return fl_set_error(FL_EFORMAT, "rank 0's timelines are not of %u ranks", gpu_train_world(o));
  pp_event **events = common_calloc(world, sizeof *events);
  size_t *counts = common_calloc(world, sizeof *counts);
  if (!events || !counts) FL_CHECK(fl_set_error(FL_ENOMEM, "out of memory for %u timelines", world));
  double end = 0;
  res->stages = 0; /* (with --replicas auto:W the partitioner's count, at most o->pp) */
  memset(res->stage_peak_bytes, 0, sizeof res->stage_peak_bytes);
  memset(res->stage_replicas, 0, sizeof res->stage_replicas);
  for (uint32_t i = 0; i < world; i++) { /* task i's record, of grid rank g */
    cursor rec;
    uint32_t head[2] = {0, 0};
    uint64_t peak = 0, n = 0;
    if (!cursor_take_piece(&c, &rec) || !cursor_take(&rec, head, sizeof head) || !cursor_take(&rec, &peak, 8) ||
        !cursor_take(&rec, &n, 8) || head[0] >= world || events[head[0]] || head[1] >= o->pp ||
        n > (uint64_t)(rec.end - rec.p) / EVENT_BYTES)
      FL_CHECK(fl_set_error(FL_EFORMAT, "task %u's timeline record is malformed", i));
    uint32_t g = head[0];
    if (peak > res->stage_peak_bytes[head[1]]) res->stage_peak_bytes[head[1]] = peak;
    if (head[1] + 1 > res->stages) res->stages = head[1] + 1;
    /* the first pipeline's tasks (the first world / dp) count each stage's ranks */
    if (i < world / o->ranks && (o->replicas[0] || o->replicas_auto)) res->stage_replicas[head[1]]++;
    else if (!o->replicas[0] && !o->replicas_auto) res->stage_replicas[head[1]] = 1;
    events[g] = common_calloc(n ? n : 1, sizeof **events);
    if (!events[g]) FL_CHECK(fl_set_error(FL_ENOMEM, "out of memory for rank %u's timeline", g));
    for (uint64_t k = 0; k < n; k++) {
      int32_t ints[4] = {0}; /* gcc cannot see that FL_CHECK of an error leaves the loop */
      double ts[2] = {0};
      if (!cursor_take(&rec, ints, sizeof ints) || !cursor_take(&rec, ts, sizeof ts))
        FL_CHECK(fl_set_error(FL_EFORMAT, "task %u's timeline record ends inside event %llu", i, (unsigned long long)k));
      if ((unsigned)ints[0] >= PP_EV_KINDS) FL_CHECK(fl_set_error(FL_EFORMAT, "rank %u sent event kind %d", g, ints[0]));
      events[g][k] = (pp_event){(pp_event_kind)ints[0], ints[1], ints[2], ts[0], ts[1]};
      end = fmax(end, ts[1]);
    }
    counts[g] = (size_t)n;
  }
  if (o->timeline_csv_path)
    FL_CHECK(pp_timeline_write_csv(o->timeline_csv_path, (int)world, (const pp_event *const *)events, counts));
  if (o->timeline_svg_path) {
    char title[200], reps[96] = "";
    for (uint32_t s = 0, at = 0; o->replicas[0] && s < o->pp && at < sizeof reps; s++)
      at += (uint32_t)snprintf(reps + at, sizeof reps - at, "%s%u", s ? "," : " (replicas ", o->replicas[s]);
    if (o->replicas[0] && strlen(reps) + 2 < sizeof reps) strcat(reps, ")");
    snprintf(title, sizeof title, "transformer, dp %u x tp %u x pp %u%s, %s, m %u%s: the last step", o->ranks, o->tp,
             o->pp, reps, pp_schedule_name(o->schedule), o->microbatches, o->recompute ? ", recompute" : "");
    FL_CHECK(pp_timeline_write_svg(o->timeline_svg_path, (int)world, (const pp_event *const *)events, counts, end,
                                   title));
  }
cleanup:
  if (events)
    for (uint32_t i = 0; i < world; i++) common_free(events[i]);
  common_free(events);
  common_free(counts);
  return status;
}

void train_hybrid_pipeline_json(const gpu_train_options *o, fl_bytes ranks, fl_buf *out) {
  out->len = 0;
  cursor c = {ranks.data, ranks.data + ranks.len};
  uint32_t world;
  if (!cursor_take(&c, &world, sizeof world) || world != gpu_train_world(o)) return;
  /* Stage s's row is the first record of stage s in task order: grid rank (0, 0, s)'s
   * timeline, or with replicated stages its first replica's in the first pipeline. */
  fl_buf *rows = common_calloc(o->pp, sizeof *rows);
  bool ok = rows != NULL;
  for (uint32_t i = 0; ok && i < world; i++) {
    cursor rec;
    uint32_t head[2] = {0, 0};
    uint64_t peak = 0, n = 0;
    ok = cursor_take_piece(&c, &rec) && cursor_take(&rec, head, sizeof head) && cursor_take(&rec, &peak, 8) &&
         cursor_take(&rec, &n, 8) && head[0] < world && n <= (uint64_t)(rec.end - rec.p) / EVENT_BYTES;
    if (!ok || head[1] >= o->pp || rows[head[1]].len) continue;
    fl_buf *row = &rows[head[1]];
    ok = fl_buf_append(row, "[", 1) == FL_OK;
    bool first = true;
    for (uint64_t k = 0; ok && k < n; k++) {
      int32_t ints[4];
      double ts[2];
      ok = cursor_take(&rec, ints, sizeof ints) && cursor_take(&rec, ts, sizeof ts);
      if (!ok || (ints[0] != PP_EV_FORWARD && ints[0] != PP_EV_BACKWARD)) continue;
      char item[128];
      int len = snprintf(item, sizeof item, "%s{\"Op\":\"%s\",\"MicroBatch\":%d,\"Start\":%.4f,\"End\":%.4f}",
                         first ? "" : ",", ints[0] == PP_EV_FORWARD ? "F" : "B", ints[1], ts[0] * 1e3, ts[1] * 1e3);
      ok = fl_buf_append(row, item, (size_t)len) == FL_OK && row->len < TRAIN_PIPELINE_JSON_MAX;
      first = false;
    }
    ok = ok && fl_buf_append(row, "]", 1) == FL_OK;
  }
  ok = ok && fl_buf_append(out, "[", 1) == FL_OK;
  for (uint32_t s = 0; ok && s < o->pp; s++)
    ok = fl_buf_append(out, s ? "," : "", s ? 1 : 0) == FL_OK &&
         fl_buf_append(out, rows[s].len ? (const char *)rows[s].data : "[]", rows[s].len ? rows[s].len : 2) == FL_OK &&
         out->len < TRAIN_PIPELINE_JSON_MAX;
  ok = ok && fl_buf_append(out, "]", 2) == FL_OK; /* with its NUL, not counted in len */
  if (ok) out->len--;
  if (!ok) out->len = 0;
  for (uint32_t s = 0; rows && s < o->pp; s++) fl_buf_free(&rows[s]);
  common_free(rows);
}
