/*
 * gpu/parallel/pipeline_trainer.c: the hybrid trainer of gpu/parallel/pipeline.h: the grid,
 * its communicators, the stage cut (balanced over a profile when not given) and the trainer's
 * creation and destruction. The step is gpu/parallel/pipeline_step.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_internal.h"

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

/* ---- the stage cut ------------------------------------------------------------------------ */

/* Rank 0's profile: each unit alone (tensor parallel 1) forward and backward on `rows`
 * random samples, the median of 3 timings, its output's bytes and (weights not NULL) its
 * weights' bytes. */
static fl_status profile_units(pp_trainer *t, int rows, double *secs, double *bytes, double *weights) {
  tfm_spec one = t->o.spec;
  one.sequence_parallel = false; /* a unit alone, on one rank */
  const tfm_spec *sp = &one;
  int units = tfm_units(sp);
  fl_status status = FL_OK;
  fl_tensor x = {0}, dy = {0};
  tfm_chunk *c = NULL;
  for (int u = 0; u < units && status == FL_OK; u++) {
    int64_t shape[3] = {rows, sp->seq, u == 0 ? tfm_input_width(sp) : sp->hidden};
    FL_CHECK(tensor_ensure(&x, t->dev, 3, shape));
    /* GPT's first unit reads token ids: 1 is one. */
    FL_CHECK(t->dev->ops->fill(t->dev, x.numel, u == 0 && sp->kind == TFM_GPT ? 1.0f : 0.5f, x.data));
    FL_CHECK(tfm_chunk_create(t->dev, sp, u, u + 1, NULL, 0, 1, &c));
    if (weights) weights[u] = (double)tfm_chunk_values(c)->numel * sizeof(float);
    double best[3];
    tfm_batch b = {0};
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
/* The link measurement: round trips of this many bytes between two stages, the fastest of
 * LINK_TRIPS after one to warm the connection up. Large enough that the per-message cost is
 * small beside the bytes, small enough to take milliseconds. */
#define LINK_BYTES (4u << 20)
#define LINK_TRIPS 3

/* The bandwidth between this pipeline group's first two stages: pipeline rank 0 sends
 * LINK_BYTES to the first rank of stage 1, which sends them back; bytes per second of the
 * fastest round trip (2 x LINK_BYTES moved). Collective over the pipeline group (ranks of
 * other stages return 0 at once). */
static fl_status measure_link(pp_trainer *t, double *bytes_per_s) {
  int me = fl_comm_rank(t->pp), peer = t->stage_replicas ? t->stage_rank0[1] : 1;
  *bytes_per_s = 0;
  if (me != 0 && me != peer) return FL_OK;
  size_t count = LINK_BYTES / sizeof(float);
  float *buf = common_calloc(count, sizeof *buf);
  if (!buf) return FL_ERR(FL_ENOMEM, "out of memory measuring the link between stages");
  fl_status status = FL_OK;
  fl_tensor msg = pp_host_tensor(t, buf, count);
  double best = INFINITY;
  for (int trip = 0; trip <= LINK_TRIPS; trip++) {
    uint64_t t0 = common_now_ns();
    if (me == 0) {
      FL_CHECK(fl_comm_send(t->pp, &msg, peer));
      FL_CHECK(fl_comm_recv(t->pp, &msg, peer));
    } else {
      FL_CHECK(fl_comm_recv(t->pp, &msg, 0));
      FL_CHECK(fl_comm_send(t->pp, &msg, 0));
    }
    double secs = (double)(common_now_ns() - t0) * 1e-9;
    if (trip > 0 && secs < best) best = secs;
  }
  *bytes_per_s = best > 0 ? 2.0 * LINK_BYTES / best : 0;
cleanup:
  common_free(buf);
  return status;
}

/* World rank 0 plans alone and broadcasts the plan; when it fails it still broadcasts (a
 * marker instead of the plan), so that every rank returns an error instead of waiting in the
 * broadcast. Its own message is kept across the broadcast, which clears the last error. */
typedef struct rank0_failure {
  fl_status status;
  char message[512];
} rank0_failure;

static void rank0_failure_keep(rank0_failure *f, fl_status st) {
  f->status = st;
  if (st != FL_OK) snprintf(f->message, sizeof f->message, "%s", fl_last_error());
}

static fl_status rank0_failure_status(const rank0_failure *f, const char *what) {
  if (f->status != FL_OK) return fl_set_error(f->status, "%s", f->message);
  return fl_set_error(FL_EINTERNAL, "world rank 0 could not %s (its error is in its log)", what);
}

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
  double *secs = common_calloc((size_t)units, sizeof *secs), *bytes = common_calloc((size_t)units, sizeof *bytes);
  size_t *cut = common_calloc((size_t)n + 1, sizeof *cut);
  fl_tensor share = {0};
  int64_t shape[1] = {n + 2}; /* the cut, then the measured link */
  double link = 0;
  if (!secs || !bytes || !cut) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for the profile"));
  FL_CHECK(tensor_ensure(&share, t->dev, 1, shape));
  /* The partitioner's transfer term uses the bandwidth measured between rank 0's first two
   * stages, not a guess (the host backend's over loopback varies with the machine). */
  /* Only world rank 0's pipeline measures (its figure is the one broadcast): the others'
   * round trips at the same time would share the host's links and skew it. */
  if (t->o.grid.pp > 1 && t->me.dp == 0 && t->me.tp == 0) FL_CHECK(measure_link(t, &link));
  rank0_failure failed = {FL_OK, ""};
  if (fl_comm_rank(t->world) == 0) {
    float host[n + 2];
    double bottleneck;
    fl_status planned = profile_units(t, PROFILE_ROWS, secs, bytes, NULL);
    if (planned == FL_OK) planned = pp_partition(secs, bytes, (size_t)units, n, link, cut, &bottleneck);
    for (int s = 0; s <= n; s++) host[s] = planned == FL_OK ? (float)cut[s] : 0;
    host[n + 1] = planned == FL_OK ? (float)link : -1; /* -1: the others fail too, not wait */
    rank0_failure_keep(&failed, planned);
    FL_CHECK(t->dev->ops->from_host(t->dev, share.data, host, sizeof host));
  }
  FL_CHECK(fl_comm_broadcast(t->world, &share, 0));
  {
    float host[n + 2];
    FL_CHECK(t->dev->ops->to_host(t->dev, host, share.data, sizeof host));
    if (host[n + 1] < 0) FL_CHECK(rank0_failure_status(&failed, "cut the model into stages"));
    for (int s = 0; s <= n; s++) t->bounds[s] = (int)host[s];
    t->link_bytes_per_s = host[n + 1];
  }
cleanup:
  common_free(secs);
  common_free(bytes);
  common_free(cut);
  tensor_release(&share);
  return status;
}

/* ---- the replicated plan (replicas_auto) ------------------------------------------------------ */

#define AUTO_MAX_STAGES 64

/* PipeDream's partitioner with replication over the pipeline's W = o->replicas_auto ranks, at
 * most o->grid.pp stages: world rank 0 profiles the units (with their weights' bytes, which
 * the replicas allreduce) and, with the link measured between world ranks 0 and 1, runs
 * pp_partition_replicated; the plan is broadcast. Collective over world. */
static fl_status auto_plan(fl_device *dev, fl_comm *world, const pp_options *o, int *reps, int *bounds, int *nstages,
                           double *link) {
  int w = o->replicas_auto, units = tfm_units(&o->spec);
  int most = o->grid.pp < AUTO_MAX_STAGES ? o->grid.pp : AUTO_MAX_STAGES;
  if (w < 1 || w > 1024 || o->grid.dp < 1 || (long)o->grid.dp * w != fl_comm_size(world))
    return fl_set_error(FL_EINVAL, "automatic replication over %d ranks a pipeline x dp %d, but the world has %d", w,
                        o->grid.dp, fl_comm_size(world));
  if (o->grid.tp != 1 || (o->chunks != 0 && o->chunks != 1) || o->schedule == PP_INTERLEAVED || o->bounds || o->replicas)
    return fl_set_error(FL_EINVAL, "automatic replication needs tp 1, one chunk, no given cut or replicas and a "
                        "schedule other than interleaved");
  fl_status status = FL_OK;
  pp_trainer probe = {.dev = dev, .o = *o, .pp = o->stage_world ? o->stage_world : world};
  double *secs = common_calloc((size_t)units, sizeof *secs), *bytes = common_calloc((size_t)units, sizeof *bytes);
  double *weights = common_calloc((size_t)units, sizeof *weights);
  pp_stage_plan *plan = common_calloc((size_t)units, sizeof *plan);
  float host[2 + AUTO_MAX_STAGES + AUTO_MAX_STAGES + 1] = {0}; /* stages, link, replicas, cut */
  fl_tensor share = {0};
  int64_t shape[1] = {(int64_t)(sizeof host / sizeof *host)};
  if (!secs || !bytes || !weights || !plan) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for the profile"));
  FL_CHECK(cpu_device_init(&probe.host));
  *link = 0;
  if (w > 1) FL_CHECK(measure_link(&probe, link));
  FL_CHECK(tensor_ensure(&share, dev, 1, shape));
  rank0_failure failed = {FL_OK, ""};
  if (fl_comm_rank(world) == 0) {
    int n = 0;
    double bottleneck;
    fl_status planned = profile_units(&probe, PROFILE_ROWS, secs, bytes, weights);
    if (planned == FL_OK)
      planned = pp_partition_replicated(secs, bytes, weights, (size_t)units, w, most, *link, plan, &n, &bottleneck);
    if (planned == FL_OK) {
      host[0] = (float)n;
      host[1] = (float)*link;
      for (int s = 0; s < n; s++) {
        host[2 + s] = (float)plan[s].replicas;
        host[2 + AUTO_MAX_STAGES + s] = (float)plan[s].first;
      }
      host[2 + AUTO_MAX_STAGES + n] = (float)units;
    } /* else 0 stages: the others fail too, not wait */
    rank0_failure_keep(&failed, planned);
    FL_CHECK(dev->ops->from_host(dev, share.data, host, sizeof host));
  }
  FL_CHECK(fl_comm_broadcast(world, &share, 0));
  FL_CHECK(dev->ops->to_host(dev, host, share.data, sizeof host));
  if (host[0] < 1) FL_CHECK(rank0_failure_status(&failed, "plan the replicated stages"));
  *nstages = (int)host[0];
  *link = host[1];
  for (int s = 0; s < *nstages; s++) reps[s] = (int)host[2 + s];
  for (int s = 0; s <= *nstages; s++) bounds[s] = (int)host[2 + AUTO_MAX_STAGES + s];
cleanup:
  if (probe.host.ops && probe.host.ops->destroy) probe.host.ops->destroy(&probe.host);
  tensor_release(&share);
  common_free(secs);
  common_free(bytes);
  common_free(weights);
  common_free(plan);
  return status;
}

/* ---- create and destroy --------------------------------------------------------------------- */

/* Replicated stages: tp 1, one chunk, not interleaved, world = dp x sum. */
static fl_status check_replicas(const pp_options *o, int world) {
  if (o->grid.dp < 1 || o->grid.tp != 1 || o->grid.pp < 1 || (o->chunks != 0 && o->chunks != 1))
    return fl_set_error(FL_EINVAL, "replicated stages need tp 1 and one chunk per stage (got %dx%dx%d, %d "
                        "chunks)", o->grid.dp, o->grid.tp, o->grid.pp, o->chunks);
  if (o->schedule == PP_INTERLEAVED)
    return fl_set_error(FL_EINVAL, "replicated stages run gpipe, 1f1b, pipedream or 2bw (1F1B-RR), not %s",
                        pp_schedule_name(o->schedule));
  long sum = 0;
  for (int s = 0; s < o->grid.pp; s++) {
    if (o->replicas[s] < 1 || o->replicas[s] > 64)
      return fl_set_error(FL_EINVAL, "stage %d has %d replicas (needs 1..64)", s, o->replicas[s]);
    sum += o->replicas[s];
  }
  if (sum * o->grid.dp != world)
    return fl_set_error(FL_EINVAL, "the stages' replicas add up to %ld ranks a pipeline, x dp %d = %ld, but the "
                        "world has %d", sum, o->grid.dp, sum * o->grid.dp, world);
  return FL_OK;
}

static fl_status check_options(const pp_options *o, int world) {
  fl_status s = o->replicas ? check_replicas(o, world) : pp_grid_check(o->grid, world);
  if (s != FL_OK) return s;
  if ((o->replicas || o->replicas_auto) && o->spec.experts > 0)
    return fl_set_error(FL_EINVAL, "stage replication does not run with experts (they are spread over the "
                        "data-parallel group)");
  if (o->spec.experts > 0 && (o->schedule == PP_PIPEDREAM || o->schedule == PP_2BW))
    return fl_set_error(FL_EINVAL, "experts run with the gpipe, 1f1b and interleaved schedules, not %s",
                        pp_schedule_name(o->schedule));
  if (o->vertical_sync && o->schedule != PP_PIPEDREAM)
    return fl_set_error(FL_EINVAL, "vertical sync is an option of the pipedream schedule, not %s",
                        pp_schedule_name(o->schedule));
  if (o->schedule == PP_2BW && o->microbatches < o->grid.pp)
    return fl_set_error(FL_EINVAL, "2bw needs at least as many micro-batches as stages (m %d < pp %d): a stage "
                        "would need a third weight version", o->microbatches, o->grid.pp);
  if (o->microbatches < 1) return fl_set_error(FL_EINVAL, "micro-batches must be >= 1 (got %d)", o->microbatches);
  int v = o->chunks ? o->chunks : 1;
  if (v < 1) return fl_set_error(FL_EINVAL, "chunks per pipeline rank must be >= 1 (got %d)", o->chunks);
  if (v > 1 && o->schedule != PP_INTERLEAVED)
    return fl_set_error(FL_EINVAL, "%d chunks per pipeline rank need the interleaved schedule, not %s",
                        v, pp_schedule_name(o->schedule));
  /* A tensor-parallel rank holds a slice of a weight, whose norm is not the weight's. */
  if ((o->optim.kind == OPTIM_LARS || o->optim.kind == OPTIM_LAMB) && o->grid.tp > 1)
    return fl_set_error(FL_EINVAL, "%s needs each weight's whole norm, but tp %d splits weights over ranks",
                        optim_kind_name(o->optim.kind), o->grid.tp);
  if (o->synthetic_forward_s < 0 || o->synthetic_forward_s > 10)
    return fl_set_error(FL_EINVAL, "synthetic forward time %g s is outside [0, 10]", o->synthetic_forward_s);
  return tfm_spec_check(&o->spec, o->grid.tp);
}

void pp_trainer_destroy(pp_trainer *t) {
  if (!t) return;
  pp_transfer_stop(t);
  pp_versions_free(t);
  common_free(t->stage_rank0);
  common_free(t->stage_replicas);
  for (int c = 0; c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    for (int k = 0; k < cs->nslots; k++) {
      tensor_release(&cs->slots[k].input);
      tensor_release(&cs->slots[k].grad_in);
      tensor_release(&cs->slots[k].dlogits);
      if (cs->slots[k].labels) t->dev->ops->free(t->dev, cs->slots[k].labels);
    }
    common_free(cs->slots);
    common_free(cs->slot_of);
    optim_destroy(cs->opt);
    tfm_chunk_destroy(cs->chunk);
  }
  common_free(t->chunks);
  common_free(t->bounds);
  common_free(t->ops);
  common_free(t->events);
  tensor_release(&t->stats);
  tensor_release(&t->moe_sums);
  fl_comm_destroy(t->tp);
  fl_comm_destroy(t->dp);
  fl_comm_destroy(t->pp);
  if (t->host.ops && t->host.ops->destroy) t->host.ops->destroy(&t->host);
  common_free(t);
}

/* A chunk's optimizer over its parameters, grouped by the default rule (gpu/nn/nn.h). */
static fl_status chunk_optimizer(fl_device *dev, tfm_chunk *chunk, const optim_options *o, optim **out) {
  size_t np = tfm_chunk_param_count(chunk);
  optim_param *params = common_calloc(np ? np : 1, sizeof *params);
  if (!params) return FL_ERR(FL_ENOMEM, "out of memory for a chunk's optimizer");
  for (size_t i = 0; i < np; i++) params[i] = optim_param_of(tfm_chunk_param(chunk, i), o);
  fl_status s = optim_create(dev, o, tfm_chunk_values(chunk)->numel, params, np, out);
  common_free(params);
  return s;
}

fl_status pp_trainer_create(fl_device *dev, fl_comm *world, const pp_options *o, pp_trainer **out) {
  if (!dev || !world || !o || !out) return fl_set_error(FL_EINVAL, "pp_trainer_create: NULL argument");
  *out = NULL;
  if (o->replicas_auto) {
    /* The partitioner's plan, then a trainer with that cut and those replicas. */
    int reps[AUTO_MAX_STAGES], bounds[AUTO_MAX_STAGES + 1], n = 0;
    double link = 0;
    fl_status s = auto_plan(dev, world, o, reps, bounds, &n, &link);
    if (s != FL_OK) return s;
    pp_options planned = *o;
    planned.replicas_auto = 0;
    planned.grid.pp = n;
    planned.replicas = reps;
    planned.bounds = bounds;
    s = pp_trainer_create(dev, world, &planned, out);
    if (s == FL_OK) (*out)->link_bytes_per_s = link;
    return s;
  }
  fl_status status = check_options(o, fl_comm_size(world));
  if (status != FL_OK) return status;
  pp_trainer *t = common_calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "out of memory for a trainer");
  t->dev = dev;
  t->world = world;
  t->o = *o;
  t->o.bounds = NULL;
  t->o.stage_world = NULL;
  t->o.chunks = o->chunks ? o->chunks : 1;
  t->nchunks = t->o.chunks;
  t->nstages = o->grid.pp * t->nchunks;
  t->o.replicas = NULL;
  t->me = pp_grid_coords(o->grid, fl_comm_rank(world));
  pp_transfer_init(t);
  FL_CHECK(cpu_device_init(&t->host));
  pp_grid g = o->grid;
  if (o->replicas) {
    /* Pipeline d is world ranks [d S, (d + 1) S) (S = the sum of the replicas), its stage s
     * ranks [stage_rank0[s], + replicas[s]) of them: the world's order is the pipelines'. */
    t->stage_rank0 = common_calloc((size_t)g.pp, sizeof *t->stage_rank0);
    t->stage_replicas = common_calloc((size_t)g.pp, sizeof *t->stage_replicas);
    if (!t->stage_rank0 || !t->stage_replicas) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for a trainer"));
    int rank = fl_comm_rank(world), per = fl_comm_size(world) / g.dp, q = rank % per;
    for (int s = 0, base = 0; s < g.pp; base += o->replicas[s], s++) {
      t->stage_rank0[s] = base;
      t->stage_replicas[s] = o->replicas[s];
      if (q >= base && q < base + o->replicas[s]) {
        t->me = (pp_coords){.dp = rank / per, .tp = 0, .pp = s};
        t->replica = q - base;
      }
    }
  }
  pp_coords me = t->me;
  /* The three splits, in the same order on every rank (each is collective over world). With
   * replicated stages the tensor group is the rank alone, the data-parallel group every
   * replica of the rank's stage in every pipeline (their gradients are summed) and the
   * pipeline group the rank's pipeline. */
  int rank = fl_comm_rank(world);
  int dp_key = o->replicas ? me.dp * o->replicas[me.pp] + t->replica : me.dp;
  FL_CHECK(fl_comm_split(world, o->replicas ? rank : me.pp * g.dp + me.dp, me.tp, &t->tp));
  FL_CHECK(fl_comm_split(world, me.pp * g.tp + me.tp, dp_key, &t->dp));
  fl_comm *stages = o->stage_world ? o->stage_world : world;
  if (fl_comm_size(stages) != fl_comm_size(world) || fl_comm_rank(stages) != fl_comm_rank(world))
    FL_CHECK(fl_set_error(FL_EINVAL, "the stage communicator is rank %d of %d, the world rank %d of %d",
                          fl_comm_rank(stages), fl_comm_size(stages), fl_comm_rank(world), fl_comm_size(world)));
  FL_CHECK(fl_comm_split(stages, o->replicas ? me.dp : me.dp * g.tp + me.tp, o->replicas ? rank : me.pp, &t->pp));
  if (g.pp > 1 && strcmp(fl_comm_backend(t->pp), "host") != 0)
    FL_CHECK(fl_set_error(FL_EINVAL, "pipeline stages exchange activations over the host backend, "
                          "but the world communicator is %s", fl_comm_backend(t->pp)));
  t->bounds = common_calloc((size_t)t->nstages + 1, sizeof *t->bounds);
  t->chunks = common_calloc((size_t)t->nchunks, sizeof *t->chunks);
  if (!t->bounds || !t->chunks) FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory for a trainer"));
  FL_CHECK(choose_bounds(t, o->bounds));
  for (int c = 0; c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    cs->stage = pp_stage_of(g.pp, me.pp, c);
    cs->first_unit = t->bounds[cs->stage];
    cs->end_unit = t->bounds[cs->stage + 1];
    /* Experts spread over the data-parallel group (GShard's ep = dp). */
    FL_CHECK(tfm_chunk_create_ep(dev, &o->spec, cs->first_unit, cs->end_unit, g.tp > 1 ? t->tp : NULL, me.tp,
                                 g.tp, o->spec.experts > 0 && g.dp > 1 ? t->dp : NULL, &cs->chunk));
    FL_CHECK(chunk_optimizer(dev, cs->chunk, &o->optim, &cs->opt));
  }
  int64_t two[1] = {2};
  FL_CHECK(tensor_ensure(&t->stats, dev, 1, two));
  if (fl_comm_size(t->pp) > 1) FL_CHECK(pp_transfer_start(t));
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
int pp_trainer_num_stages(const pp_trainer *t) { return t->nstages; }
int pp_trainer_stage_replicas(const pp_trainer *t, int stage) {
  if (stage < 0 || stage >= t->nstages) return 0;
  return t->stage_replicas ? t->stage_replicas[stage] : 1;
}
double pp_trainer_link_bytes_per_s(const pp_trainer *t) { return t->link_bytes_per_s; }
optim *pp_trainer_chunk_optimizer(pp_trainer *t, int chunk) {
  return chunk >= 0 && chunk < t->nchunks ? t->chunks[chunk].opt : NULL;
}
