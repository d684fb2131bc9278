/*
 * gpu/parallel/pipeline_step.c: the hybrid trainer's step (gpu/parallel/pipeline.h): each
 * pipeline rank runs its schedule's operations in order (forward_op, backward_op), receiving
 * and sending activations and gradients through gpu/parallel/pipeline_transfer.c and
 * recording the timeline; then the data-parallel gradient average, the loss over the world,
 * the bubble; evaluation (forward only) and the optimizer step.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_internal.h"

/* ---- one step ------------------------------------------------------------------------------- */

static fl_status slot_acquire(chunk_state *cs, int mb, int m, int *out) {
  if (cs->slot_of_cap < m) {
    int *p = common_realloc(cs->slot_of, (size_t)m * sizeof *p);
    if (!p) return FL_ERR(FL_ENOMEM, "out of memory for micro-batch slots");
    cs->slot_of = p;
    cs->slot_of_cap = m;
  }
  int k = 0;
  while (k < cs->nslots && cs->slots[k].busy) k++;
  if (k == cs->nslots) {
    slot *s = common_realloc(cs->slots, (size_t)(k + 1) * sizeof *s);
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

/* A micro-batch's dropout key: its rows' place in the global batch (this replica's rows come
 * after the earlier replicas'), so that masks do not depend on dp, pp or m. In a PipeDream
 * window micro-batch mb is number mb % m of mini-batch mb / m, whose step is sc->step + that. */
static tfm_batch batch_key(const pp_trainer *t, const step_ctx *sc, int mb) {
  int m = t->o.microbatches;
  return (tfm_batch){.row0 = (int64_t)t->me.dp * sc->batch + (int64_t)(mb % m) * sc->mbs,
                     .step = sc->step + (uint64_t)(mb / m),
                     .aux_weight = 1.0f / (float)sc->batch};
}

/* The pipeline rank that runs stage `stage` for micro-batch mb (its replica, round robin). */
static int stage_peer(const pp_trainer *t, int stage, int mb) {
  int pp = t->o.grid.pp;
  if (!t->stage_replicas) return stage % pp;
  return t->stage_rank0[stage] + pp_replica_of(mb, t->stage_replicas[stage]);
}

/* The loss gradient's scale: the mean over the replica's batch (of `per` predictions a
 * sample); with replicated stages, over the global batch, as the stage's replicas in every
 * pipeline then SUM their gradients. */
static float grad_scale(const pp_trainer *t, const step_ctx *sc, int per) {
  return 1.0f / ((float)sc->batch * (float)per * (float)(t->stage_replicas ? t->o.grid.dp : 1));
}

static fl_status forward_op(pp_trainer *t, const step_ctx *sc, const pp_op *op, bool train) {
  const tfm_spec *sp = &t->o.spec;
  chunk_state *cs = &t->chunks[op->chunk];
  int stage = cs->stage, last = t->nstages - 1, mb = op->microbatch, k = 0;
  fl_status status = slot_acquire(cs, mb, sc->total, &k);
  if (status != FL_OK) return status;
  slot *sl = &cs->slots[k];
  int64_t in_shape[3] = {sc->mbs, sp->seq, stage == 0 ? tfm_input_width(sp) : sp->hidden};
  FL_CHECK(tensor_ensure(&sl->input, t->dev, 3, in_shape));
  t->inputs_held += sl->input.numel * sizeof(float);
  if (stage == 0) {
    const float *rows = sc->x + (size_t)mb * sc->mbs * sp->seq * tfm_input_width(sp);
    FL_CHECK(t->dev->ops->from_host(t->dev, sl->input.data, rows, sl->input.numel * sizeof(float)));
  } else {
    double t0 = pp_timeline_now(t);
    FL_CHECK(pp_transfer_recv(t, stage_peer(t, stage - 1, mb), MSG_ACTIVATION, stage, mb, &sl->input));
    FL_CHECK(pp_timeline_add(t, PP_EV_RECV, mb, op->chunk, t0));
  }
  double t0 = pp_timeline_now(t);
  tfm_batch b = batch_key(t, sc, mb);
  const fl_tensor *y;
  if (t->async) FL_CHECK(pp_versions_load(t, op->chunk, mb, PP_FORWARD));
  FL_CHECK(tfm_chunk_forward(cs->chunk, t->o.recompute || !train ? 0 : k, &sl->input, &b, train, &y));
  if (stage == last) {
    /* One prediction per sample (the encoder) or per token (GPT: the next token's id). */
    int per = tfm_targets_per_sample(sp), rows = sc->mbs * per;
    if (sl->labels_cap < rows) {
      if (sl->labels) t->dev->ops->free(t->dev, sl->labels);
      sl->labels = NULL;
      sl->labels_cap = 0;
      FL_CHECK(t->dev->ops->alloc(t->dev, (size_t)rows * sizeof(int32_t), (void **)&sl->labels));
      sl->labels_cap = rows;
    }
    FL_CHECK(t->dev->ops->from_host(t->dev, sl->labels, sc->labels + (size_t)mb * rows,
                                    (size_t)rows * sizeof(int32_t)));
    FL_CHECK(tensor_ensure(&sl->dlogits, t->dev, y->ndim, y->shape));
    FL_CHECK(t->dev->ops->softmax_xent(t->dev, rows, tfm_output_classes(sp), y->data, sl->labels, 0.0f,
                                       train ? grad_scale(t, sc, per) : 0.0f, sl->dlogits.data,
                                       t->stats.data));
    /* a replica of the last stage runs only some of the mini-batch's forwards: it adds each */
    if (t->async && ((mb + 1) % t->o.microbatches == 0 || t->stage_replicas))
      FL_CHECK(pp_versions_take_sums(t, mb / t->o.microbatches));
  }
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  sleep_s(t->o.synthetic_forward_s);
  FL_CHECK(pp_timeline_add(t, PP_EV_FORWARD, mb, op->chunk, t0));
  t->busy_s += t->events[t->nevents - 1].t1 - t0;
  note_peak(t);
  if (stage != last) {
    double s0 = pp_timeline_now(t);
    FL_CHECK(pp_transfer_send(t, stage_peer(t, stage + 1, mb), MSG_ACTIVATION, stage + 1, mb, y));
    FL_CHECK(pp_timeline_add(t, PP_EV_SEND, mb, op->chunk, s0));
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
    double t0 = pp_timeline_now(t);
    FL_CHECK(pp_transfer_recv(t, stage_peer(t, stage + 1, mb), MSG_GRADIENT, stage, mb, &sl->grad_in));
    FL_CHECK(pp_timeline_add(t, PP_EV_RECV, mb, op->chunk, t0));
    dy = &sl->grad_in;
  }
  double t0 = pp_timeline_now(t);
  if (t->async) FL_CHECK(pp_versions_load(t, op->chunk, mb, PP_BACKWARD));
  if (t->o.recompute) {
    tfm_batch b = batch_key(t, sc, mb);
    const fl_tensor *y;
    FL_CHECK(tfm_chunk_forward(cs->chunk, 0, &sl->input, &b, true, &y));
    note_peak(t);
  }
  FL_CHECK(tfm_chunk_backward(cs->chunk, t->o.recompute ? 0 : k, dy, stage == 0 ? NULL : &dx));
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  sleep_s(2 * t->o.synthetic_forward_s);
  FL_CHECK(pp_timeline_add(t, PP_EV_BACKWARD, mb, op->chunk, t0));
  t->busy_s += t->events[t->nevents - 1].t1 - t0;
  t->last_backward_end = t->events[t->nevents - 1].t1;
  if (stage != 0) {
    double s0 = pp_timeline_now(t);
    FL_CHECK(pp_transfer_send(t, stage_peer(t, stage - 1, mb), MSG_GRADIENT, stage - 1, mb, dx));
    FL_CHECK(pp_timeline_add(t, PP_EV_SEND, mb, op->chunk, s0));
  }
  sl->busy = false;
  t->inputs_held -= sl->input.numel * sizeof(float);
  /* (a replicated stage's replicas update at their PP_UPDATE ops instead, rank_ops) */
  if (t->async && !t->stage_replicas && (mb + 1) % t->o.microbatches == 0)
    FL_CHECK(pp_versions_update(t, op->chunk, mb / t->o.microbatches));
cleanup:
  return status;
}

/* The pipeline group's bubble from every member's busy time and last backward. */
static fl_status measure_bubble(pp_trainer *t, pp_step_stats *st) {
  int p = fl_comm_size(t->pp); /* with replicated stages, more than grid.pp */
  float mine[2] = {(float)t->busy_s, (float)t->last_backward_end}, all[2 * 64];
  if (p > 64) return fl_set_error(FL_EINVAL, "pipeline group of %d ranks is above 64", p);
  fl_tensor in = pp_host_tensor(t, mine, 2), out = pp_host_tensor(t, all, 2 * (size_t)p);
  fl_status s = p > 1 ? fl_comm_allgather(t->pp, &in, &out) : FL_OK;
  if (s != FL_OK) return s;
  if (p == 1) memcpy(all, mine, sizeof mine);
  double busy = 0, end = 0;
  for (int r = 0; r < p; r++) busy += all[2 * r], end = fmax(end, all[2 * r + 1]);
  st->pipeline_s = end;
  st->bubble = end > 0 ? 1.0 - busy / (p * end) : 0;
  return FL_OK;
}

/* Mixture of experts: the step's balancing loss (each replica's is a mean over its samples:
 * their mean) and the fraction of expert choices dropped, over the world (once per
 * tensor-parallel group, which replicates the experts). */
static fl_status world_moe(pp_trainer *t, pp_step_stats *st) {
  fl_status status = FL_OK;
  float host[3] = {0, 0, 0};
  for (int c = 0; c < t->nchunks; c++) {
    tfm_moe_stats m = tfm_chunk_take_moe_stats(t->chunks[c].chunk);
    if (t->me.tp != 0) continue;
    host[0] += (float)m.aux_loss;
    host[1] += (float)m.choices;
    host[2] += (float)m.dropped;
  }
  FL_CHECK(pp_world_sum(t, host, 3, &t->moe_sums));
  st->aux_loss = host[0] / t->o.grid.dp;
  st->dropped_fraction = host[1] > 0 ? host[2] / host[1] : 0;
cleanup:
  return status;
}

/* The loss sum and correct count of the step over the world: the last stage's (once per
 * tensor-parallel group, every data-parallel replica's). */
static fl_status world_sums(pp_trainer *t, double out[2]) {
  fl_status status = FL_OK;
  float host[2] = {0, 0};
  bool counts = t->chunks[t->nchunks - 1].stage == t->nstages - 1 && t->me.tp == 0;
  if (counts) FL_CHECK(t->dev->ops->to_host(t->dev, host, t->stats.data, sizeof host));
  FL_CHECK(pp_world_sum(t, host, 2, &t->stats));
  out[0] = host[0];
  out[1] = host[1];
cleanup:
  return status;
}

/* This rank's op list for `total` micro-batches (cached): the schedule's, and on a replicated
 * stage only this replica's micro-batches. A replica's list is a subsequence of the
 * unreplicated stage's, so any run of the unreplicated lists orders the replicated ones too:
 * they cannot deadlock where the schedule does not. Under pipedream and 2bw a replica's list
 * also holds mini-batch k's update (PP_UPDATE, which sums the gradients over the stage's
 * replicas, a collective) where the unreplicated stage updates: right after its backward of
 * the mini-batch's last micro-batch, whichever replica runs that. So every replica updates
 * between the same ops of the unreplicated order, and its forwards see the versions of the
 * unreplicated plan (pp_replicated_ops proves the lists deadlock-free with the simulator). */
static fl_status rank_ops(pp_trainer *t, int total) {
  if (t->ops && t->ops_m == total) return FL_OK;
  common_free(t->ops);
  t->ops = NULL;
  t->ops_m = 0;
  int stage = t->chunks[0].stage, p = t->stage_replicas ? t->nstages : t->o.grid.pp;
  fl_status status;
  if (t->stage_replicas)
    status = pp_replicated_ops(t->o.schedule, p, total, t->o.microbatches, stage, t->stage_replicas[stage], t->replica,
                               &t->ops, &t->nops);
  else
    status = pp_schedule_ops(t->o.schedule, p, total, t->nchunks, t->me.pp, &t->ops, &t->nops);
  if (status != FL_OK) return status;
  t->ops_m = total;
  return FL_OK;
}

/* Runs this rank's ops from a start that a barrier aligns, drains the sends and measures the
 * bubble. */
static fl_status run_schedule(pp_trainer *t, const step_ctx *sc, pp_step_stats *st) {
  fl_status status = FL_OK;
  FL_CHECK(rank_ops(t, sc->total));
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
    if (op->kind == PP_UPDATE) FL_CHECK(pp_versions_update(t, op->chunk, op->microbatch));
    else FL_CHECK(op->kind == PP_FORWARD ? forward_op(t, sc, op, true) : backward_op(t, sc, op));
  }
  FL_CHECK(pp_transfer_drain(t));
  FL_CHECK(measure_bubble(t, st));
cleanup:
  return status;
}

static bool async_schedule(pp_schedule s) { return s == PP_PIPEDREAM || s == PP_2BW; }

fl_status pp_trainer_compute_gradients(pp_trainer *t, const float *x, const int32_t *labels,
                                       int batch, uint64_t step, pp_step_stats *st) {
  if (!t || !x || !labels || !st) return fl_set_error(FL_EINVAL, "pp_trainer_compute_gradients: NULL argument");
  int m = t->o.microbatches;
  if (async_schedule(t->o.schedule))
    return fl_set_error(FL_EINVAL, "the %s schedule updates weights inside the pipeline: train it with "
                        "pp_trainer_train_window, not a step at a time", pp_schedule_name(t->o.schedule));
  if (batch < m || batch % m != 0)
    return fl_set_error(FL_EINVAL, "a batch of %d rows cannot be cut into %d equal micro-batches", batch, m);
  fl_status status = FL_OK;
  step_ctx sc = {x, labels, batch, batch / m, step, m};
  FL_CHECK(run_schedule(t, &sc, st));
  if (t->stage_replicas && fl_comm_size(t->dp) > 1) {
    /* Each replica holds its micro-batches' share of the global batch's mean gradient (every
     * pipeline's replicas of the stage are in the group). */
    double t0 = pp_timeline_now(t);
    FL_CHECK(fl_comm_allreduce(t->dp, tfm_chunk_grads(t->chunks[0].chunk), FL_REDUCE_SUM));
    FL_CHECK(pp_timeline_add(t, PP_EV_ALLREDUCE, -1, -1, t0));
  } else if (t->o.grid.dp > 1) {
    double t0 = pp_timeline_now(t);
    for (int c = 0; c < t->nchunks; c++)
      FL_CHECK(tfm_chunk_average_grads(t->chunks[c].chunk, t->dp));
    FL_CHECK(pp_timeline_add(t, PP_EV_ALLREDUCE, -1, -1, t0));
  }
  {
    double sums[2];
    FL_CHECK(world_sums(t, sums));
    double global = (double)batch * t->o.grid.dp * tfm_targets_per_sample(&t->o.spec);
    st->loss = sums[0] / global;
    st->accuracy = sums[1] / global;
  }
  if (t->o.spec.experts > 0) FL_CHECK(world_moe(t, st));
  st->busy_s = t->busy_s;
  st->bubble_theory = pp_bubble_theory(t->o.schedule, t->o.grid.pp, m, t->nchunks);
  st->peak_activation_bytes = t->peak_bytes;
  st->seconds = pp_timeline_now(t);
  st->events = t->events;
  st->num_events = t->nevents;
cleanup:
  return status;
}

fl_status pp_trainer_train_window(pp_trainer *t, const float *x, const int32_t *labels, int batch,
                                  int minibatches, uint64_t step0, const float *lr,
                                  pp_window_stats *st) {
  if (!t || !x || !labels || !lr || !st) return fl_set_error(FL_EINVAL, "pp_trainer_train_window: NULL argument");
  int m = t->o.microbatches;
  if (!async_schedule(t->o.schedule))
    return fl_set_error(FL_EINVAL, "pp_trainer_train_window runs the pipedream and 2bw schedules, not %s "
                        "(which flushes every step: use pp_trainer_compute_gradients)", pp_schedule_name(t->o.schedule));
  if (minibatches < 1) return fl_set_error(FL_EINVAL, "a window of %d mini-batches (needs at least 1)", minibatches);
  if (batch < m || batch % m != 0)
    return fl_set_error(FL_EINVAL, "a batch of %d rows cannot be cut into %d equal micro-batches", batch, m);
  if ((long long)m * minibatches > (1 << 24))
    return fl_set_error(FL_EINVAL, "a window of %d mini-batches of %d micro-batches is above 2^24 micro-batches",
                        minibatches, m);
  fl_status status = FL_OK;
  memset(st, 0, sizeof *st);
  step_ctx sc = {x, labels, batch, batch / m, step0, m * minibatches};
  FL_CHECK(pp_versions_begin(t, minibatches, lr));
  t->async = true;
  status = run_schedule(t, &sc, &st->step);
  t->async = false;
  FL_CHECK(status);
  FL_CHECK(pp_versions_end(t, st));
  double global = (double)batch * t->o.grid.dp * tfm_targets_per_sample(&t->o.spec), loss = 0, acc = 0;
  for (int k = 0; k < minibatches; k++) {
    t->win_loss[k] = t->win_sums[2 * k] / global;
    t->win_acc[k] = t->win_sums[2 * k + 1] / global;
    loss += t->win_loss[k];
    acc += t->win_acc[k];
  }
  st->step.loss = loss / minibatches;
  st->step.accuracy = acc / minibatches;
  st->step.busy_s = t->busy_s;
  st->step.bubble_theory = pp_bubble_theory(t->o.schedule, t->o.grid.pp, m * minibatches, 1);
  st->step.peak_activation_bytes = t->peak_bytes;
  st->step.seconds = pp_timeline_now(t);
  st->step.events = t->events;
  st->step.num_events = t->nevents;
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
  step_ctx sc = {x, labels, batch, batch / m, 0, m};
  fl_status status = FL_OK;
  FL_CHECK(t->dev->ops->memset0(t->dev, t->stats.data, 2 * sizeof(float)));
  t->step_start_ns = common_now_ns();
  t->nevents = 0;
  for (int mb = 0; mb < m; mb++)
    for (int c = 0; c < t->nchunks; c++) {
      pp_op op = {PP_FORWARD, mb, c};
      if (t->stage_replicas && pp_replica_of(mb, t->stage_replicas[t->chunks[c].stage]) != t->replica) continue;
      FL_CHECK(forward_op(t, &sc, &op, false));
      chunk_state *cs = &t->chunks[c];
      cs->slots[cs->slot_of[mb]].busy = false;
      t->inputs_held -= cs->slots[cs->slot_of[mb]].input.numel * sizeof(float);
    }
  FL_CHECK(pp_transfer_drain(t));
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
  double t0 = pp_timeline_now(t);
  for (int c = 0; c < t->nchunks; c++) {
    tfm_chunk *ch = t->chunks[c].chunk;
    FL_CHECK(optim_step(t->chunks[c].opt, lr, tfm_chunk_grads(ch), tfm_chunk_values(ch)));
    FL_CHECK(tfm_chunk_zero_grad(ch));
  }
  FL_CHECK(t->dev->ops->synchronize(t->dev));
  FL_CHECK(pp_timeline_add(t, PP_EV_OPTIMIZER, -1, -1, t0));
  if (st) {
    st->seconds = pp_timeline_now(t);
    st->events = t->events;
    st->num_events = t->nevents;
  }
cleanup:
  return status;
}
