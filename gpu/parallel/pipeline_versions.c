/*
 * gpu/parallel/pipeline_versions.c: PipeDream's weight versions for the hybrid trainer's
 * asynchronous schedules (PP_PIPEDREAM, PP_2BW; gpu/parallel/pipeline_schedule.h says which
 * version each micro-batch uses).
 *
 * A chunk's values (tfm_chunk_values) are its working weights; the stash holds copies, one
 * per version some micro-batch may still use, and the newest. Before each forward or
 * backward the micro-batch's version is copied into the values when another is loaded (its
 * activations live in its own slot, so only the weights need swapping). An update loads the
 * newest version, steps the optimizer on it with the gradients accumulated over the
 * mini-batch (so updates chain: W(k+1) = step(W(k), grad), the gradient taken on whichever
 * versions the micro-batches used), then drops the versions below the oldest still needed
 * and stashes the result. The plan (pp_weight_versions) is known in advance, so no message
 * needs to carry a version: vertical sync is the first stage's plan on every stage.
 *
 * Threading: the trainer's rank thread only.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_internal.h"

static weight_version *find_version(chunk_state *cs, int version) {
  for (int i = 0; i < cs->nversions; i++)
    if (cs->versions[i].version == version) return &cs->versions[i];
  return NULL;
}

/* Copies the chunk's values into a free stash entry as `version`. */
static fl_status stash(pp_trainer *t, chunk_state *cs, int version) {
  weight_version *v = find_version(cs, -1);
  if (!v) {
    weight_version *grown = common_realloc(cs->versions, (size_t)(cs->nversions + 1) * sizeof *grown);
    if (!grown) return FL_ERR(FL_ENOMEM, "out of memory for a weight version");
    cs->versions = grown;
    v = &grown[cs->nversions++];
    memset(v, 0, sizeof *v);
  }
  const fl_tensor *values = tfm_chunk_values(cs->chunk);
  fl_status status = tensor_ensure(&v->w, t->dev, values->ndim, values->shape);
  if (status == FL_OK) status = t->dev->ops->copy(t->dev, v->w.data, values->data, values->numel * sizeof(float));
  v->version = status == FL_OK ? version : -1;
  int held = 0;
  for (int i = 0; i < cs->nversions; i++) held += cs->versions[i].version >= 0;
  if (held > t->peak_versions) t->peak_versions = held;
  return status;
}

static fl_status load(pp_trainer *t, chunk_state *cs, int version) {
  if (cs->loaded == version) return FL_OK;
  weight_version *v = find_version(cs, version);
  if (!v)
    return fl_set_error(FL_EINTERNAL, "stage %d has no weight version %d (newest %d): the version "
                        "plan and the schedule disagree", cs->stage, version, cs->newest);
  fl_tensor *values = tfm_chunk_values(cs->chunk);
  fl_status status = t->dev->ops->copy(t->dev, values->data, v->w.data, values->numel * sizeof(float));
  if (status == FL_OK) cs->loaded = version;
  return status;
}

void pp_versions_free(pp_trainer *t) {
  for (int c = 0; t->chunks && c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    for (int i = 0; i < cs->nversions; i++) tensor_release(&cs->versions[i].w);
    common_free(cs->versions);
    cs->versions = NULL;
    cs->nversions = 0;
  }
  common_free(t->plan_version);
  common_free(t->fwd_version);
  common_free(t->bwd_version);
  common_free(t->win_sums);
  common_free(t->win_loss);
  common_free(t->win_acc);
  t->plan_version = t->fwd_version = t->bwd_version = NULL;
  t->win_sums = NULL;
  t->win_loss = t->win_acc = NULL;
  tensor_release(&t->win_dev);
}

fl_status pp_versions_begin(pp_trainer *t, int minibatches, const float *lr) {
  int m = t->o.microbatches, total = m * minibatches;
  size_t records = (size_t)t->nchunks * total;
  common_free(t->plan_version);
  common_free(t->fwd_version);
  common_free(t->bwd_version);
  common_free(t->win_sums);
  common_free(t->win_loss);
  common_free(t->win_acc);
  t->plan_version = common_malloc((size_t)total * sizeof(int));
  t->fwd_version = common_malloc(records * sizeof(int));
  t->bwd_version = common_malloc(records * sizeof(int));
  t->win_sums = common_calloc(2 * (size_t)minibatches, sizeof(float));
  t->win_loss = common_calloc((size_t)minibatches, sizeof(double));
  t->win_acc = common_calloc((size_t)minibatches, sizeof(double));
  if (!t->plan_version || !t->fwd_version || !t->bwd_version || !t->win_sums || !t->win_loss || !t->win_acc)
    return FL_ERR(FL_ENOMEM, "out of memory for a window of %d micro-batches", total);
  for (size_t i = 0; i < records; i++) t->fwd_version[i] = t->bwd_version[i] = -1;
  fl_status status = pp_weight_versions(t->o.schedule, t->o.vertical_sync, t->o.grid.pp, m, minibatches,
                                        t->me.pp, t->plan_version);
  if (status != FL_OK) return status;
  t->win_k = minibatches;
  t->win_total = total;
  t->win_lr = lr;
  t->peak_versions = 0;
  for (int c = 0; c < t->nchunks; c++) {
    chunk_state *cs = &t->chunks[c];
    for (int i = 0; i < cs->nversions; i++) cs->versions[i].version = -1;
    cs->newest = cs->loaded = 0;
    FL_CHECK(tfm_chunk_zero_grad(cs->chunk));
    FL_CHECK(stash(t, cs, 0));
  }
cleanup:
  return status;
}

fl_status pp_versions_load(pp_trainer *t, int c, int mb, pp_op_kind kind) {
  chunk_state *cs = &t->chunks[c];
  int version = t->plan_version[mb];
  fl_status status = load(t, cs, version);
  if (status != FL_OK) return status;
  int *record = kind == PP_FORWARD ? t->fwd_version : t->bwd_version;
  record[(size_t)c * t->win_total + mb] = version;
  return FL_OK;
}

fl_status pp_versions_update(pp_trainer *t, int c, int k) {
  chunk_state *cs = &t->chunks[c];
  fl_status status = FL_OK;
  fl_tensor *grads = tfm_chunk_grads(cs->chunk);
  double t0 = pp_timeline_now(t);
  if (t->stage_replicas && fl_comm_size(t->dp) > 1) {
    /* every replica of the stage in every pipeline holds its share of the global mean */
    FL_CHECK(fl_comm_allreduce(t->dp, grads, FL_REDUCE_SUM));
    FL_CHECK(pp_timeline_add(t, PP_EV_ALLREDUCE, -1, c, t0));
  } else if (!t->stage_replicas && t->o.grid.dp > 1) {
    FL_CHECK(tfm_chunk_average_grads(cs->chunk, t->dp));
    FL_CHECK(pp_timeline_add(t, PP_EV_ALLREDUCE, -1, c, t0));
  }
  t0 = pp_timeline_now(t);
  FL_CHECK(load(t, cs, cs->newest));
  FL_CHECK(optim_step(cs->opt, t->win_lr[k], grads, tfm_chunk_values(cs->chunk)));
  FL_CHECK(tfm_chunk_zero_grad(cs->chunk));
  {
    /* Backwards run in micro-batch order: the oldest in flight is the next to go back. */
    int next = (k + 1) * t->o.microbatches;
    int oldest = next < t->win_total ? t->plan_version[next] : cs->newest + 1;
    if (oldest > cs->newest + 1) oldest = cs->newest + 1;
    for (int i = 0; i < cs->nversions; i++)
      if (cs->versions[i].version >= 0 && cs->versions[i].version < oldest) cs->versions[i].version = -1;
  }
  cs->newest++;
  cs->loaded = cs->newest;
  FL_CHECK(stash(t, cs, cs->newest));
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  FL_CHECK(pp_timeline_add(t, PP_EV_OPTIMIZER, k, c, t0));
cleanup:
  return status;
}

fl_status pp_versions_take_sums(pp_trainer *t, int k) {
  fl_status status = FL_OK;
  /* Counted once per tensor-parallel group, as world_sums counts them. */
  float sums[2];
  if (t->me.tp == 0) {
    FL_CHECK(t->dev->ops->to_host(t->dev, sums, t->stats.data, sizeof sums));
    t->win_sums[2 * k] += sums[0]; /* a replica adds each of its forwards */
    t->win_sums[2 * k + 1] += sums[1];
  }
  FL_CHECK(t->dev->ops->memset0(t->dev, t->stats.data, 2 * sizeof(float)));
cleanup:
  return status;
}

fl_status pp_versions_end(pp_trainer *t, pp_window_stats *st) {
  fl_status status = FL_OK;
  int k = t->win_k;
  for (int c = 0; c < t->nchunks; c++) FL_CHECK(load(t, &t->chunks[c], t->chunks[c].newest));
  FL_CHECK(pp_world_sum(t, t->win_sums, 2 * (size_t)k, &t->win_dev));
  st->minibatches = k;
  st->microbatches = t->win_total;
  st->loss = t->win_loss;
  st->accuracy = t->win_acc;
  st->forward_version = t->fwd_version;
  st->backward_version = t->bwd_version;
  st->peak_versions = t->peak_versions;
  st->updates = k;
cleanup:
  return status;
}
