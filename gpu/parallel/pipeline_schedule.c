/*
 * gpu/parallel/pipeline_schedule.c: the pipeline-parallel schedules, their simulator and the
 * stage partitioner (see gpu/parallel/pipeline_schedule.h for the contract).
 *
 * The interleaved schedule follows Megatron-LM's forward_backward_pipelining_with_interleaving:
 * the m*v (micro-batch, chunk) pairs of a device form one sequence of "virtual
 * micro-batches"; the device runs `warmup` forwards of that sequence, then one forward and one
 * backward in turn, then the remaining backwards. The sequence walks groups of p
 * micro-batches through chunk 0, 1, ..., v-1 (backwards through v-1 down to 0). When
 * m % p != 0 the sequence is built for m rounded up to a multiple of p and the padding's ops
 * are dropped as they come (the header says why that cannot deadlock); dropping them from the
 * finished sequence rather than shrinking the last group keeps every real op where Megatron
 * puts it. Warm-up is Megatron's (p - r - 1) * 2 + (v - 1) * p: enough
 * forwards that the first backward (chunk v-1 of micro-batch 0, which needs the forwards of all
 * p*v stages) has arrived by the time the device asks for it.
 *
 * The simulator does not need an event queue: each device runs its ops in its own order, and
 * an op starts at max(the device is free, its inputs are done), so sweeping the devices and
 * running every op whose inputs are done, until none can run, gives the same times as a
 * time-ordered simulation. If ops remain when no device can run one, the schedule deadlocks.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/parallel/pipeline_schedule.h"

static const char *const schedule_names[] = {"gpipe", "1f1b", "interleaved", "pipedream", "2bw"};
#define SCHEDULE_COUNT ((int)(sizeof schedule_names / sizeof *schedule_names))

/* Bounds (m + p) * v so that the (padded) 2*m*v ops and every index fit an int with room. */
#define PP_MAX_VIRTUAL (1 << 28)

fl_status pp_schedule_parse(const char *text, pp_schedule *out) {
  if (!text || !out) return fl_set_error(FL_EINVAL, "pp_schedule_parse: NULL argument");
  for (int i = 0; i < SCHEDULE_COUNT; i++)
    if (strcmp(text, schedule_names[i]) == 0) {
      *out = (pp_schedule)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown pipeline schedule '%s' (expected gpipe, 1f1b, "
                      "interleaved, pipedream or 2bw)", text);
}

const char *pp_schedule_name(pp_schedule s) {
  if ((int)s < 0 || (int)s >= SCHEDULE_COUNT) return "unknown";
  return schedule_names[s];
}

/* The one place the shape of a schedule is checked. */
static fl_status check_shape(pp_schedule s, int p, int m, int v, int rank) {
  if ((int)s < 0 || (int)s >= SCHEDULE_COUNT)
    return fl_set_error(FL_EINVAL, "unknown pipeline schedule %d", (int)s);
  if (p < 1) return fl_set_error(FL_EINVAL, "pipeline of %d devices (needs at least 1)", p);
  if (m < 1) return fl_set_error(FL_EINVAL, "%d micro-batches (needs at least 1)", m);
  if (v < 1) return fl_set_error(FL_EINVAL, "%d model chunks per device (needs at least 1)", v);
  if (s != PP_INTERLEAVED && v != 1)
    return fl_set_error(FL_EINVAL, "schedule %s runs one model chunk per device, not %d (use "
                        "interleaved for more)", pp_schedule_name(s), v);
  if ((long long)(m + p) * v > PP_MAX_VIRTUAL)
    return fl_set_error(FL_EINVAL, "schedule too large: (%d micro-batches + %d devices) x %d "
                        "chunks is above %d", m, p, v, PP_MAX_VIRTUAL);
  if (rank < 0 || rank >= p)
    return fl_set_error(FL_EINVAL, "device rank %d outside the pipeline's 0..%d", rank, p - 1);
  return FL_OK;
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* The k-th virtual micro-batch (0..m*v-1) of the interleaved order (Megatron's mapping):
 * groups of p micro-batches, each walked chunk by chunk; m is a multiple of p here. */
static pp_op interleaved_virtual(int p, int v, int k, pp_op_kind kind) {
  int chunk = (k / p) % v;
  pp_op op = {kind, (k / (p * v)) * p + k % p, kind == PP_FORWARD ? chunk : v - 1 - chunk};
  return op;
}

/* Warm-up forwards, then one forward and one backward in turn, then the last backwards: the
 * shape of both 1F1B schedules, over the m*v virtual micro-batches, leaving out those of
 * micro-batches >= real_m (the padding of the interleaved schedule). Returns the ops written. */
static size_t one_f_one_b(int p, int m, int v, int real_m, int warmup, pp_op *out) {
  size_t n = 0;
  int total = m * v, fwd = 0, bwd = 0;
  while (fwd < total || bwd < total) {
    pp_op op = fwd < total && (fwd < warmup || fwd - warmup <= bwd)
                   ? interleaved_virtual(p, v, fwd++, PP_FORWARD)
                   : interleaved_virtual(p, v, bwd++, PP_BACKWARD);
    if (op.microbatch < real_m) out[n++] = op;
  }
  return n;
}

fl_status pp_schedule_ops(pp_schedule s, int p, int m, int v, int rank, pp_op **ops, size_t *n) {
  if (!ops || !n) return fl_set_error(FL_EINVAL, "pp_schedule_ops: NULL out-parameter");
  fl_status st = check_shape(s, p, m, v, rank);
  if (st != FL_OK) return st;
  /* The interleaved order is built for m rounded up to a multiple of p, then the padding's
   * ops are left out: room for the padded list, of which 2*m*v entries are kept. */
  int padded = s == PP_INTERLEAVED ? (m + p - 1) / p * p : m;
  pp_op *out = common_malloc(2 * (size_t)padded * v * sizeof *out);
  if (!out) return FL_ERR(FL_ENOMEM, "out of memory for a schedule of %d ops", 2 * padded * v);
  if (s == PP_GPIPE) {
    for (int i = 0; i < m; i++) {
      out[i] = (pp_op){PP_FORWARD, i, 0};
      out[m + i] = (pp_op){PP_BACKWARD, i, 0};
    }
  } else if (s == PP_1F1B || s == PP_PIPEDREAM || s == PP_2BW || v == 1) {
    /* With one chunk the virtual order is the micro-batch order; the asynchronous schedules
     * are 1F1B over the whole window. */
    one_f_one_b(p, m, 1, m, min_int(p - rank - 1, m), out);
  } else {
    int warmup = min_int((p - rank - 1) * 2 + (v - 1) * p, padded * v);
    size_t kept = one_f_one_b(p, padded, v, m, warmup, out);
    FL_ASSERT(kept == 2 * (size_t)m * v);
  }
  *ops = out;
  *n = 2 * (size_t)m * v;
  return FL_OK;
}

double pp_bubble_theory(pp_schedule s, int p, int m, int v) {
  if ((int)s < 0 || (int)s >= SCHEDULE_COUNT || p < 1 || m < 1 || v < 1) return NAN;
  if (s != PP_INTERLEAVED && v != 1) return NAN;
  double plain = (double)(p - 1) / (double)(m + p - 1);
  return s == PP_INTERLEAVED ? plain / v : plain;
}

int pp_schedule_peak_inflight(pp_schedule s, int p, int m, int v, int rank) {
  pp_op *ops = NULL;
  size_t n = 0;
  if (pp_schedule_ops(s, p, m, v, rank, &ops, &n) != FL_OK) return -1;
  int held = 0, peak = 0;
  for (size_t i = 0; i < n; i++) {
    held += ops[i].kind == PP_FORWARD ? 1 : -1;
    if (held > peak) peak = held;
  }
  common_free(ops);
  return peak;
}

/* ---- the simulator ----------------------------------------------------------------------- */

static const char *kind_name(pp_op_kind k) { return k == PP_FORWARD ? "forward" : "backward"; }

/* Done times of every (stage, micro-batch), forward and backward; -1 while not done. */
typedef struct sim_state {
  int p, v, m;
  double *done[2]; /* [kind][stage * m + microbatch] */
} sim_state;

static double *done_at(sim_state *st, pp_op_kind kind, int stage, int mb) {
  return &st->done[kind][(size_t)stage * st->m + mb];
}

/* The op that `op` on device d waits for, if any: *dep_kind and *dep_stage, or false when
 * nothing but the op's own device order is needed. */
static bool input_of(const sim_state *st, int d, pp_op op, pp_op_kind *dep_kind, int *dep_stage) {
  int stage = pp_stage_of(st->p, d, op.chunk), stages = st->p * st->v;
  if (op.kind == PP_FORWARD) {
    *dep_kind = PP_FORWARD;
    *dep_stage = stage - 1;
    return stage > 0;
  }
  *dep_kind = PP_BACKWARD;
  *dep_stage = stage + 1;
  return stage < stages - 1;
}

/* When op on device d may start as far as its inputs go; -1 when one is not done yet. */
static double inputs_ready(sim_state *st, int d, pp_op op) {
  int stage = pp_stage_of(st->p, d, op.chunk);
  double ready = 0;
  if (op.kind == PP_BACKWARD) {
    ready = *done_at(st, PP_FORWARD, stage, op.microbatch);
    if (ready < 0) return -1;
  }
  pp_op_kind dk;
  int ds;
  if (input_of(st, d, op, &dk, &ds)) {
    double t = *done_at(st, dk, ds, op.microbatch);
    if (t < 0) return -1;
    if (t > ready) ready = t;
  }
  return ready;
}

/* Checks the lists: ranges, no op twice, every (stage, micro-batch) forward and backward
 * present. Uses st->done as scratch (left all -1). */
static fl_status check_lists(sim_state *st, const pp_op *const *ops, const size_t *n) {
  for (int d = 0; d < st->p; d++)
    for (size_t i = 0; i < n[d]; i++) {
      double *slot = done_at(st, ops[d][i].kind, pp_stage_of(st->p, d, ops[d][i].chunk),
                             ops[d][i].microbatch);
      if (*slot == 0)
        return fl_set_error(FL_EINVAL, "device %d runs the %s of micro-batch %d, chunk %d "
                            "twice (again at op %zu)", d, kind_name(ops[d][i].kind),
                            ops[d][i].microbatch, ops[d][i].chunk, i);
      *slot = 0;
    }
  for (int k = 0; k < 2; k++)
    for (int stage = 0; stage < st->p * st->v; stage++)
      for (int mb = 0; mb < st->m; mb++) {
        double *slot = done_at(st, (pp_op_kind)k, stage, mb);
        if (*slot != 0)
          return fl_set_error(FL_EINVAL, "device %d never runs the %s of micro-batch %d, chunk "
                              "%d", stage % st->p, kind_name((pp_op_kind)k), mb, stage / st->p);
        *slot = -1;
      }
  return FL_OK;
}

fl_status pp_simulate_ops(int p, int v, const pp_op *const *ops, const size_t *n, double t_fwd,
                          double t_bwd, double *makespan, double *bubble) {
  if (!ops || !n || !makespan || !bubble)
    return fl_set_error(FL_EINVAL, "pp_simulate_ops: NULL argument");
  if (p < 1 || v < 1 || (long long)p * v > PP_MAX_VIRTUAL)
    return fl_set_error(FL_EINVAL, "pipeline of %d devices with %d chunks each", p, v);
  if (!(t_fwd >= 0) || !(t_bwd >= 0) || !isfinite(t_fwd) || !isfinite(t_bwd))
    return fl_set_error(FL_EINVAL, "op times must be finite and >= 0 (forward %g, backward %g)",
                        t_fwd, t_bwd);
  int m = 0;
  for (int d = 0; d < p; d++) {
    if (n[d] && !ops[d]) return fl_set_error(FL_EINVAL, "device %d has %zu ops at NULL", d, n[d]);
    for (size_t i = 0; i < n[d]; i++) {
      pp_op op = ops[d][i];
      if ((op.kind != PP_FORWARD && op.kind != PP_BACKWARD) || op.chunk < 0 || op.chunk >= v ||
          op.microbatch < 0 || op.microbatch >= PP_MAX_VIRTUAL / v)
        return fl_set_error(FL_EINVAL, "device %d op %zu is out of range (kind %d, micro-batch "
                            "%d, chunk %d of %d)", d, i, (int)op.kind, op.microbatch, op.chunk, v);
      if (op.microbatch >= m) m = op.microbatch + 1;
    }
  }
  fl_status status = FL_OK;
  size_t cells = (size_t)p * v * (size_t)m;
  sim_state st = {p, v, m, {NULL, NULL}};
  double *clock = NULL;
  size_t *next = NULL;
  st.done[0] = common_malloc(cells * sizeof(double));
  st.done[1] = common_malloc(cells * sizeof(double));
  clock = common_calloc((size_t)p, sizeof *clock);
  next = common_calloc((size_t)p, sizeof *next);
  if (!st.done[0] || !st.done[1] || !clock || !next) {
    status = FL_ERR(FL_ENOMEM, "out of memory simulating %d devices", p);
    goto cleanup;
  }
  for (size_t i = 0; i < cells; i++) st.done[0][i] = st.done[1][i] = -1;
  FL_CHECK(check_lists(&st, ops, n));

  double busy = 0, end = 0;
  size_t left = 0;
  for (int d = 0; d < p; d++) left += n[d];
  while (left > 0) {
    size_t ran = 0;
    for (int d = 0; d < p; d++)
      while (next[d] < n[d]) {
        pp_op op = ops[d][next[d]];
        double ready = inputs_ready(&st, d, op);
        if (ready < 0) break;
        double t = op.kind == PP_FORWARD ? t_fwd : t_bwd;
        double start = ready > clock[d] ? ready : clock[d];
        clock[d] = start + t;
        *done_at(&st, op.kind, pp_stage_of(p, d, op.chunk), op.microbatch) = clock[d];
        busy += t;
        if (clock[d] > end) end = clock[d];
        next[d]++;
        ran++;
      }
    if (ran == 0) {
      /* Name a device that waits for its own later forward (a backward listed before the
       * forward it needs) if there is one: that is where the list is wrong. Otherwise the
       * first blocked device and the op it waits for. */
      int d = -1;
      for (int e = 0; e < p && d < 0; e++)
        if (next[e] < n[e] && ops[e][next[e]].kind == PP_BACKWARD &&
            *done_at(&st, PP_FORWARD, pp_stage_of(p, e, ops[e][next[e]].chunk),
                     ops[e][next[e]].microbatch) < 0)
          d = e;
      pp_op op, wait;
      int wait_device;
      if (d >= 0) {
        op = ops[d][next[d]];
        wait = (pp_op){PP_FORWARD, op.microbatch, op.chunk};
        wait_device = d;
      } else {
        d = 0;
        while (next[d] == n[d]) d++;
        op = ops[d][next[d]];
        pp_op_kind dk;
        int ds;
        FL_ASSERT(input_of(&st, d, op, &dk, &ds));
        wait = (pp_op){dk, op.microbatch, ds / p};
        wait_device = ds % p;
      }
      status = fl_set_error(FL_ESTATE, "pipeline schedule deadlocks: device %d is blocked at op "
                            "%zu (%s of micro-batch %d, chunk %d), waiting for the %s of "
                            "micro-batch %d, chunk %d on device %d, which can never run",
                            d, next[d], kind_name(op.kind), op.microbatch, op.chunk,
                            kind_name(wait.kind), wait.microbatch, wait.chunk, wait_device);
      goto cleanup;
    }
    left -= ran;
  }
  *makespan = end;
  *bubble = end > 0 ? 1 - busy / (p * end) : 0;

cleanup:
  common_free(next);
  common_free(clock);
  common_free(st.done[1]);
  common_free(st.done[0]);
  return status;
}

fl_status pp_schedule_simulate(pp_schedule s, int p, int m, int v, double t_fwd, double t_bwd,
                               double *makespan, double *bubble) {
  if (!makespan || !bubble)
    return fl_set_error(FL_EINVAL, "pp_schedule_simulate: NULL out-parameter");
  fl_status status = check_shape(s, p, m, v, 0);
  if (status != FL_OK) return status;
  pp_op **ops = common_calloc((size_t)p, sizeof *ops);
  size_t *n = common_calloc((size_t)p, sizeof *n);
  if (!ops || !n) {
    status = FL_ERR(FL_ENOMEM, "out of memory for the schedules of %d devices", p);
    goto cleanup;
  }
  for (int d = 0; d < p; d++) FL_CHECK(pp_schedule_ops(s, p, m, v, d, &ops[d], &n[d]));
  status = pp_simulate_ops(p, v, (const pp_op *const *)ops, n, t_fwd, t_bwd, makespan, bubble);

cleanup:
  for (int d = 0; ops && d < p; d++) common_free(ops[d]);
  common_free(n);
  common_free(ops);
  return status;
}

/* ---- the partitioner --------------------------------------------------------------------- */

fl_status pp_partition(const double *layer_time, const double *out_bytes, size_t n, int p,
                       double bytes_per_s, size_t *bounds, double *bottleneck) {
  bool comm = bytes_per_s > 0;
  if (!layer_time || !bounds || !bottleneck || (comm && !out_bytes))
    return fl_set_error(FL_EINVAL, "pp_partition: NULL array (out_bytes may be NULL only when "
                        "bytes_per_s <= 0)");
  if (n < 1) return fl_set_error(FL_EINVAL, "pp_partition: no layers to cut");
  if (p < 1 || (size_t)p > n)
    return fl_set_error(FL_EINVAL, "cannot cut %zu layers into %d non-empty stages", n, p);
  for (size_t i = 0; i < n; i++) {
    if (!(layer_time[i] >= 0) || !isfinite(layer_time[i]))
      return fl_set_error(FL_EINVAL, "layer %zu has time %g (needs a finite time >= 0)", i,
                          layer_time[i]);
    if (comm && (!(out_bytes[i] >= 0) || !isfinite(out_bytes[i])))
      return fl_set_error(FL_EINVAL, "layer %zu has output size %g bytes (needs a finite "
                          "size >= 0)", i, out_bytes[i]);
  }
  if (!isfinite(bytes_per_s))
    return fl_set_error(FL_EINVAL, "pp_partition: bandwidth %g bytes/s is not finite",
                        bytes_per_s);

  /* Rows 1..p-1 of best and cut are used (row 0 would be "no stage").
   * best[k][j]: the least slowest stage cutting layers [0, j) into k stages that all send
   * their output (every stage but the pipeline's last); cut[k][j]: where its last stage starts.
   * The last stage, which sends nothing, is added at the end. */
  fl_status status = FL_OK;
  size_t width = n + 1;
  double *prefix = common_malloc(width * sizeof *prefix);
  double *best = common_malloc((size_t)p * width * sizeof *best);
  size_t *cut = common_malloc((size_t)p * width * sizeof *cut);
  if (!prefix || !best || !cut) {
    status = FL_ERR(FL_ENOMEM, "out of memory partitioning %zu layers", n);
    goto cleanup;
  }
  prefix[0] = 0;
  for (size_t i = 0; i < n; i++) prefix[i + 1] = prefix[i] + layer_time[i];
#define SEND(j) (comm ? out_bytes[(j) - 1] / bytes_per_s : 0.0) /* after layer j-1 */
  for (size_t j = 1; p > 1 && j <= n; j++) {
    best[1 * width + j] = prefix[j] + SEND(j);
    cut[1 * width + j] = 0;
  }
  for (int k = 2; k < p; k++)
    for (size_t j = (size_t)k; j <= n; j++) {
      double lowest = INFINITY;
      size_t at = (size_t)k - 1;
      for (size_t i = (size_t)k - 1; i < j; i++) {
        double stage = prefix[j] - prefix[i] + SEND(j);
        double before = best[(size_t)(k - 1) * width + i];
        double worst = before > stage ? before : stage;
        if (worst < lowest) {
          lowest = worst;
          at = i;
        }
      }
      best[(size_t)k * width + j] = lowest;
      cut[(size_t)k * width + j] = at;
    }
#undef SEND
  /* The last stage [i, n) closes the pipeline. */
  double lowest = prefix[n];
  size_t at = 0;
  if (p > 1) {
    lowest = INFINITY;
    for (size_t i = (size_t)p - 1; i < n; i++) {
      double stage = prefix[n] - prefix[i];
      double before = best[(size_t)(p - 1) * width + i];
      double worst = before > stage ? before : stage;
      if (worst < lowest) {
        lowest = worst;
        at = i;
      }
    }
  }
  bounds[p] = n;
  bounds[p - 1] = at;
  for (int k = p - 1; k >= 1; k--) bounds[k - 1] = cut[(size_t)k * width + bounds[k]];
  *bottleneck = lowest;

cleanup:
  common_free(cut);
  common_free(best);
  common_free(prefix);
  return status;
}

/* ---- asynchronous schedules: weight versions ------------------------------------------- */

static fl_status check_async(pp_schedule s, int p, int m, int minibatches, int rank) {
  if (s != PP_PIPEDREAM && s != PP_2BW)
    return fl_set_error(FL_EINVAL, "weight versions are for the pipedream and 2bw schedules, not %s",
                        pp_schedule_name(s));
  if (minibatches < 1)
    return fl_set_error(FL_EINVAL, "a window of %d mini-batches (needs at least 1)", minibatches);
  if (m < 1) return fl_set_error(FL_EINVAL, "%d micro-batches (needs at least 1)", m);
  if ((long long)m * minibatches + p > PP_MAX_VIRTUAL)
    return fl_set_error(FL_EINVAL, "window too large: %d mini-batches of %d micro-batches",
                        minibatches, m);
  if (s == PP_2BW && m < p)
    return fl_set_error(FL_EINVAL, "2bw needs at least as many micro-batches per mini-batch as "
                        "stages (m %d < p %d), or a device would need a third weight version", m, p);
  return check_shape(s, p, m * minibatches, 1, rank);
}

/* The newest version on `rank` at each of its forwards: the updates (one after each
 * mini-batch's last backward) listed before the forward. */
static fl_status newest_at_forward(int p, int m, int total, int rank, int *version) {
  pp_op *ops = NULL;
  size_t n = 0;
  fl_status st = pp_schedule_ops(PP_PIPEDREAM, p, total, 1, rank, &ops, &n);
  if (st != FL_OK) return st;
  int updates = 0;
  for (size_t i = 0; i < n; i++) {
    if (ops[i].kind == PP_FORWARD) version[ops[i].microbatch] = updates;
    else if ((ops[i].microbatch + 1) % m == 0) updates++;
  }
  common_free(ops);
  return FL_OK;
}

fl_status pp_weight_versions(pp_schedule s, bool vertical_sync, int p, int m, int minibatches,
                             int rank, int *version) {
  if (!version) return fl_set_error(FL_EINVAL, "pp_weight_versions: NULL version array");
  fl_status st = check_async(s, p, m, minibatches, rank);
  if (st != FL_OK) return st;
  int total = m * minibatches;
  if (s == PP_2BW) {
    for (int i = 0; i < total; i++) version[i] = i / m > 0 ? i / m - 1 : 0;
    return FL_OK;
  }
  return newest_at_forward(p, m, total, vertical_sync ? 0 : rank, version);
}

int pp_weight_versions_peak(pp_schedule s, bool vertical_sync, int p, int m, int minibatches,
                            int rank) {
  fl_status st = check_async(s, p, m, minibatches, rank);
  if (st != FL_OK) return -1;
  int total = m * minibatches, *version = common_malloc((size_t)total * sizeof *version);
  pp_op *ops = NULL;
  size_t n = 0;
  if (!version) {
    FL_ERR(FL_ENOMEM, "out of memory for %d weight versions", total);
    return -1;
  }
  int peak = -1;
  if (pp_weight_versions(s, vertical_sync, p, m, minibatches, rank, version) != FL_OK ||
      pp_schedule_ops(s, p, total, 1, rank, &ops, &n) != FL_OK)
    goto cleanup;
  /* Backwards run in micro-batch order, so the oldest in flight is the count done. */
  int newest = 0, backwards = 0;
  peak = 1;
  for (size_t i = 0; i < n; i++) {
    if (ops[i].kind == PP_FORWARD || (ops[i].microbatch + 1) % m != 0) {
      backwards += ops[i].kind == PP_BACKWARD;
      continue;
    }
    backwards++;
    int oldest = backwards < total ? version[backwards] : newest + 1;
    if (oldest > newest + 1) oldest = newest + 1;
    newest++; /* the update stores version newest after dropping those below oldest */
    if (newest - oldest + 1 > peak) peak = newest - oldest + 1;
  }
cleanup:
  common_free(ops);
  common_free(version);
  return peak;
}

/* ---- the partitioner with replicated stages ----------------------------------------------- */

typedef struct repl_ctx {
  const double *time_prefix, *weight_prefix, *out_bytes;
  double bytes_per_s;
} repl_ctx;

/* Layers [i, j) on r replicas: compute shared by the replicas, their weights' ring allreduce
 * and, when the stage sends, its output. */
static double replicated_stage(const repl_ctx *c, size_t i, size_t j, int r, bool sends) {
  double t = (c->time_prefix[j] - c->time_prefix[i]) / r;
  if (c->bytes_per_s > 0) {
    if (r > 1) t += 2.0 * (r - 1) / r * (c->weight_prefix[j] - c->weight_prefix[i]) / c->bytes_per_s;
    if (sends) t += c->out_bytes[j - 1] / c->bytes_per_s;
  }
  return t;
}

fl_status pp_partition_replicated(const double *layer_time, const double *out_bytes,
                                  const double *weight_bytes, size_t n, int world,
                                  int max_stages, double bytes_per_s, pp_stage_plan *stages,
                                  int *nstages, double *bottleneck) {
  bool comm = bytes_per_s > 0;
  if (!layer_time || !stages || !nstages || !bottleneck || (comm && (!out_bytes || !weight_bytes)))
    return fl_set_error(FL_EINVAL, "pp_partition_replicated: NULL array (out_bytes and "
                        "weight_bytes may be NULL only when bytes_per_s <= 0)");
  if (n < 1) return fl_set_error(FL_EINVAL, "pp_partition_replicated: no layers to cut");
  if (world < 1 || max_stages < 1)
    return fl_set_error(FL_EINVAL, "cannot place layers on %d ranks in at most %d stages", world,
                        max_stages);
  if (!isfinite(bytes_per_s))
    return fl_set_error(FL_EINVAL, "pp_partition_replicated: bandwidth %g bytes/s is not finite",
                        bytes_per_s);
  for (size_t i = 0; i < n; i++) {
    if (!(layer_time[i] >= 0) || !isfinite(layer_time[i]))
      return fl_set_error(FL_EINVAL, "layer %zu has time %g (needs a finite time >= 0)", i,
                          layer_time[i]);
    if (comm && (!(out_bytes[i] >= 0) || !isfinite(out_bytes[i]) || !(weight_bytes[i] >= 0) ||
                 !isfinite(weight_bytes[i])))
      return fl_set_error(FL_EINVAL, "layer %zu has output %g and weights %g bytes (need finite "
                          "sizes >= 0)", i, out_bytes[i], weight_bytes[i]);
  }
  int smax = max_stages;
  if (smax > world) smax = world;
  if ((size_t)smax > n) smax = (int)n;
  fl_status status = FL_OK;
  size_t nj = n + 1, nw = (size_t)world + 1, cells = (size_t)(smax + 1) * nj * nw;
  double *tp = common_malloc(nj * sizeof *tp), *wp = common_malloc(nj * sizeof *wp);
  double *best = common_malloc(cells * sizeof *best);
  size_t *cut = common_malloc(cells * sizeof *cut);
  int *reps = common_malloc(cells * sizeof *reps);
  if (!tp || !wp || !best || !cut || !reps) {
    status = FL_ERR(FL_ENOMEM, "out of memory partitioning %zu layers over %d ranks", n, world);
    goto cleanup;
  }
  tp[0] = wp[0] = 0;
  for (size_t i = 0; i < n; i++) {
    tp[i + 1] = tp[i] + layer_time[i];
    wp[i + 1] = wp[i] + (comm ? weight_bytes[i] : 0);
  }
  repl_ctx c = {tp, wp, out_bytes, bytes_per_s};
#define AT(k, j, w) (((size_t)(k) * nj + (j)) * nw + (size_t)(w))
  for (size_t x = 0; x < cells; x++) best[x] = INFINITY;
  /* best[k][j][w]: the least slowest stage placing layers [0, j) as k stages on exactly w
   * ranks, every stage sending its output; cut/reps: where its last stage starts, and on how
   * many replicas. */
  for (size_t j = 1; j <= n; j++)
    for (int w = 1; w <= world; w++) {
      best[AT(1, j, w)] = replicated_stage(&c, 0, j, w, true);
      cut[AT(1, j, w)] = 0;
      reps[AT(1, j, w)] = w;
    }
  for (int k = 2; k < smax; k++)
    for (size_t j = (size_t)k; j <= n; j++)
      for (int w = k; w <= world; w++)
        for (size_t i = (size_t)k - 1; i < j; i++)
          for (int r = 1; r <= w - (k - 1); r++) {
            double worst = fmax(best[AT(k - 1, i, w - r)], replicated_stage(&c, i, j, r, true));
            if (worst < best[AT(k, j, w)]) {
              best[AT(k, j, w)] = worst;
              cut[AT(k, j, w)] = i;
              reps[AT(k, j, w)] = r;
            }
          }
  /* The last stage sends nothing; fewer stages win ties. */
  double lowest = replicated_stage(&c, 0, n, world, false);
  int kbest = 1, rlast = world;
  size_t ilast = 0;
  for (int k = 2; k <= smax; k++)
    for (size_t i = (size_t)k - 1; i < n; i++)
      for (int r = 1; r <= world - (k - 1); r++) {
        double worst = fmax(best[AT(k - 1, i, world - r)], replicated_stage(&c, i, n, r, false));
        if (worst < lowest) {
          lowest = worst;
          kbest = k;
          ilast = i;
          rlast = r;
        }
      }
  stages[kbest - 1] = (pp_stage_plan){ilast, n, rlast};
  size_t j = ilast;
  int w = world - rlast;
  for (int k = kbest - 1; k >= 1; k--) {
    size_t i = cut[AT(k, j, w)];
    int r = reps[AT(k, j, w)];
    stages[k - 1] = (pp_stage_plan){i, j, r};
    j = i;
    w -= r;
  }
  FL_ASSERT(j == 0 && w == 0);
#undef AT
  *nstages = kbest;
  *bottleneck = lowest;

cleanup:
  common_free(reps);
  common_free(cut);
  common_free(best);
  common_free(wp);
  common_free(tp);
  return status;
}

/* ---- replicated stages --------------------------------------------------------------------- */

fl_status pp_replicated_ops(pp_schedule s, int p, int total, int m, int stage, int replicas, int replica,
                            pp_op **ops, size_t *n) {
  if (!ops || !n) return fl_set_error(FL_EINVAL, "pp_replicated_ops: NULL out-parameter");
  if (s == PP_INTERLEAVED) return fl_set_error(FL_EINVAL, "replicated stages run one chunk per device, not interleaved");
  if (replicas < 1 || replica < 0 || replica >= replicas)
    return fl_set_error(FL_EINVAL, "replica %d of %d is out of range", replica, replicas);
  if (m < 1 || total % m != 0)
    return fl_set_error(FL_EINVAL, "%d micro-batches are not whole mini-batches of %d", total, m);
  pp_op *all = NULL;
  size_t na = 0;
  fl_status status = pp_schedule_ops(s, p, total, 1, stage, &all, &na);
  if (status != FL_OK) return status;
  bool async = s == PP_PIPEDREAM || s == PP_2BW;
  pp_op *out = common_malloc((na + (size_t)(total / m)) * sizeof *out);
  if (!out) {
    common_free(all);
    return FL_ERR(FL_ENOMEM, "out of memory for a replica's %zu ops", na);
  }
  size_t k = 0;
  for (size_t i = 0; i < na; i++) {
    if (pp_replica_of(all[i].microbatch, replicas) == replica) out[k++] = all[i];
    if (async && all[i].kind == PP_BACKWARD && (all[i].microbatch + 1) % m == 0)
      out[k++] = (pp_op){PP_UPDATE, all[i].microbatch / m, 0};
  }
  common_free(all);
  *ops = out;
  *n = k;
  return FL_OK;
}

fl_status pp_simulate_replicated(pp_schedule s, int p, int total, int m, const int *replicas, double t_fwd,
                                 double t_bwd, double *makespan, double *bubble) {
  if (!replicas || !makespan || !bubble) return fl_set_error(FL_EINVAL, "pp_simulate_replicated: NULL argument");
  if (p < 1 || p > 1024) return fl_set_error(FL_EINVAL, "pipeline of %d stages", p);
  if (total < 1 || (long long)total * p > PP_MAX_VIRTUAL)
    return fl_set_error(FL_EINVAL, "%d micro-batches on %d stages", total, p);
  if (!(t_fwd >= 0) || !(t_bwd >= 0) || !isfinite(t_fwd) || !isfinite(t_bwd))
    return fl_set_error(FL_EINVAL, "op times must be finite and >= 0 (forward %g, backward %g)", t_fwd, t_bwd);
  int devices = 0;
  for (int st = 0; st < p; st++) {
    if (replicas[st] < 1 || replicas[st] > 64)
      return fl_set_error(FL_EINVAL, "stage %d has %d replicas (needs 1..64)", st, replicas[st]);
    devices += replicas[st];
  }
  fl_status status = FL_OK;
  pp_op **ops = common_calloc((size_t)devices, sizeof *ops);
  size_t *n = common_calloc((size_t)devices, sizeof *n), *next = common_calloc((size_t)devices, sizeof *next);
  int *stage_of = common_calloc((size_t)devices, sizeof *stage_of), *first = common_calloc((size_t)p, sizeof *first);
  double *clock = common_calloc((size_t)devices, sizeof *clock);
  double *done[2] = {common_malloc((size_t)p * total * sizeof(double)), common_malloc((size_t)p * total * sizeof(double))};
  if (!ops || !n || !next || !stage_of || !first || !clock || !done[0] || !done[1])
    FL_CHECK(FL_ERR(FL_ENOMEM, "out of memory simulating %d devices", devices));
  for (size_t i = 0; i < (size_t)p * total; i++) done[0][i] = done[1][i] = -1;
  for (int st = 0, d = 0; st < p; st++) {
    first[st] = d;
    for (int j = 0; j < replicas[st]; j++, d++) {
      stage_of[d] = st;
      FL_CHECK(pp_replicated_ops(s, p, total, m, st, replicas[st], j, &ops[d], &n[d]));
    }
  }
  double busy = 0, end = 0;
  for (;;) {
    size_t ran = 0, left = 0;
    for (int d = 0; d < devices; d++)
      while (next[d] < n[d]) {
        pp_op op = ops[d][next[d]];
        int st = stage_of[d];
        if (op.kind == PP_UPDATE) {
          /* a barrier of the stage's replicas: all at this update, then all past it */
          double at = 0;
          bool all = true;
          for (int e = first[st]; e < first[st] + replicas[st] && all; e++) {
            all = next[e] < n[e] && ops[e][next[e]].kind == PP_UPDATE && ops[e][next[e]].microbatch == op.microbatch;
            if (all && clock[e] > at) at = clock[e];
          }
          if (!all) break;
          for (int e = first[st]; e < first[st] + replicas[st]; e++) {
            clock[e] = at;
            next[e]++;
          }
          ran++;
          continue;
        }
        size_t at = (size_t)st * total + (size_t)op.microbatch;
        double ready = 0;
        if (op.kind == PP_FORWARD) {
          if (st > 0) ready = done[0][at - (size_t)total];
        } else {
          ready = done[0][at];
          if (ready >= 0 && st < p - 1) {
            double grad = done[1][at + (size_t)total];
            ready = grad < 0 ? -1 : fmax(ready, grad);
          }
        }
        if (ready < 0) break;
        double t = op.kind == PP_FORWARD ? t_fwd : t_bwd, start = fmax(ready, clock[d]);
        clock[d] = start + t;
        done[op.kind][at] = clock[d];
        busy += t;
        end = fmax(end, clock[d]);
        next[d]++;
        ran++;
      }
    for (int d = 0; d < devices; d++) left += n[d] - next[d];
    if (left == 0) break;
    if (ran == 0) {
      int d = 0;
      while (next[d] == n[d]) d++;
      pp_op op = ops[d][next[d]];
      FL_CHECK(fl_set_error(FL_ESTATE, "replicated pipeline deadlocks: replica %d of stage %d is blocked at op %zu "
                            "(%s of %s %d)", d - first[stage_of[d]], stage_of[d], next[d],
                            op.kind == PP_UPDATE ? "update" : kind_name(op.kind),
                            op.kind == PP_UPDATE ? "mini-batch" : "micro-batch", op.microbatch));
    }
  }
  *makespan = end;
  *bubble = end > 0 ? 1 - busy / (devices * end) : 0;
cleanup:
  for (int d = 0; ops && d < devices; d++) common_free(ops[d]);
  common_free(ops);
  common_free(n);
  common_free(next);
  common_free(stage_of);
  common_free(first);
  common_free(clock);
  common_free(done[0]);
  common_free(done[1]);
  return status;
}
