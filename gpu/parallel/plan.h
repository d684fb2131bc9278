/*
 * gpu/parallel/plan.h: an automatic parallel plan for the transformer (Alpa, Zheng et al.
 * 2022): from a profile of its units and a communication model, the dp x tp x pp grid, the
 * micro-batch count and the stage cut of least predicted step time that fits the memory of a
 * rank.
 *
 * Alpa searches two levels: inter-operator (which layers form a pipeline stage: dynamic
 * programming over the layers) and intra-operator (how each stage is split over its devices).
 * Alpa lets every stage choose its own intra-operator split; flint's runtime
 * (gpu/parallel/pipeline.h) runs one dp x tp for all stages, so the search is over what the
 * runtime can execute: every grid dp x tp x pp = world with tp dividing the heads and the MLP,
 * every micro-batch count m dividing the replica's batch (up to max_microbatches), and for
 * each the cut of the units into pp stages by dynamic programming. The schedule is 1F1B: GPipe
 * has the same predicted time and holds more activations, and interleaving is not searched.
 *
 * The model of one step of a plan (dp, tp, pp, m, cut), micro-batches of r = batch / (dp m)
 * samples:
 *   - stage s's forward f_s: the sum of its units' forward time at tp and r samples (plus
 *     the runtime's own cost of a micro-batch on a stage, microbatch_s, with backward), plus the
 *     tensor-parallel allreduces of its blocks (tp_allreduces per unit, each of the unit's
 *     output, r x out_row_bytes, over tp ranks), plus sending its output to the next stage;
 *     its backward b_s likewise (the same allreduces, Megatron's f, and the input gradient
 *     sent back to the previous stage);
 *   - the pipeline: sum_s (f_s + b_s) + (m - 1) max_s (f_s + b_s): one micro-batch through
 *     every stage (fill and drain) and the slowest stage for the others (Alpa's formula;
 *     1F1B and GPipe have this critical path);
 *   - ranks that share cores (ranks as threads, `cores` > 0 and world > cores): the
 *     pipeline cannot be faster than the whole world's compute spread over the cores:
 *     pipeline = max(the above, dp x tp x m x sum of the units' compute / cores);
 *   - then the data-parallel gradient allreduce of the largest stage's parameters over dp
 *     ranks, and the optimizer over them (optimizer_s_per_byte; x world / cores when the
 *     ranks share cores), and step_fixed_s, what the runtime spends a step whatever the plan.
 * Memory of the rank holding stage s at pipeline position k: its parameters x (1 +
 * state_copies) plus min(m, pp - k) micro-batches of activations (1F1B's most in flight).
 *
 * The cut: for a grid and m, the stages that minimise the pipeline term under the memory
 * limit. Its max makes it no sum of stage costs, so, as Alpa does, for every candidate slowest
 * stage T (the cost of some contiguous range of units) a dynamic program finds the cut of
 * least sum with every stage at most T and within memory; the best sum + (m - 1) T over the
 * candidates is the optimum (candidates in increasing order stop once (m - 1) T alone is
 * above the best found).
 *
 * Pure logic: no device, no communicator (gpu/parallel/plan_profile.c measures the profile);
 * plain functions of their arguments, usable from any thread.
 */
#ifndef FLINT_GPU_PLAN_H
#define FLINT_GPU_PLAN_H

#include <stddef.h>

#include "gpu/parallel/pipeline.h"

#define PLAN_MAX_TPS 8     /* tensor-parallel degrees a profile may hold */
#define PLAN_MAX_STAGES 64 /* pipeline stages of a plan */
#define PLAN_MAX_UNITS 1024
#define PLAN_MAX_ROWS 16   /* micro-batch sizes a profile may have measured */

/* A time linear in the micro-batch's samples r: fixed_s + r x row_s. */
typedef struct plan_cost {
  double fixed_s, row_s;
} plan_cost;

/* One unit (embedding, block, head) at each tensor-parallel degree of the profile (index k:
 * plan_problem.tp[k]); times and bytes are one rank's. */
typedef struct plan_unit {
  plan_cost fwd[PLAN_MAX_TPS], bwd[PLAN_MAX_TPS]; /* compute only, no communication */
  /* Measured at plan_problem.rows[i] samples, when the problem lists them (used instead of
   * the line above at exactly those sizes): */
  double fwd_at[PLAN_MAX_TPS][PLAN_MAX_ROWS], bwd_at[PLAN_MAX_TPS][PLAN_MAX_ROWS];
  double param_bytes[PLAN_MAX_TPS];   /* this rank's share of the unit's parameters */
  double act_row_bytes[PLAN_MAX_TPS]; /* activations held from forward to backward, per sample */
  double out_row_bytes;               /* the unit's output per sample (sent between stages) */
  int tp_allreduces; /* allreduces of the output in forward (and as many in backward) at tp > 1 */
} plan_unit;

typedef struct plan_problem {
  int world; /* ranks, >= 1 */
  int batch; /* the global batch: a multiple of world */
  int units;
  const plan_unit *unit;
  int ntp;                /* tensor-parallel degrees profiled, 1..PLAN_MAX_TPS */
  int tp[PLAN_MAX_TPS];   /* increasing, tp[0] = 1; only those dividing world are tried */
  int max_microbatches;   /* largest m tried (0: 32) */
  int nrows;              /* micro-batch sizes with measured times in the units (0: none) */
  int rows[PLAN_MAX_ROWS];
  double memory_bytes;    /* per rank (0: no limit) */
  double state_copies;    /* parameter-sized buffers besides the values: gradients and optimizer state */
  double optimizer_s_per_byte; /* the optimizer step per parameter byte of a rank */
  double cores;           /* ranks share this many cores (threads on one host); 0: each its own */
  double step_fixed_s;    /* the runtime's own cost a step, whatever the plan (its barrier, the loss's allreduce) */
  double microbatch_s;    /* the runtime's own cost of a micro-batch's forward and backward on a stage */
  /* The communication model: seconds of an allreduce of `bytes` over `ranks` (> 1) ranks,
   * and of sending `bytes` to the next pipeline stage. Must be >= 0 and finite. */
  double (*allreduce_s)(void *user, int ranks, double bytes);
  double (*send_s)(void *user, double bytes);
  void *user;
} plan_problem;

typedef struct plan_choice {
  pp_grid grid;
  pp_schedule schedule; /* PP_1F1B */
  int microbatches;
  int bounds[PLAN_MAX_STAGES + 1]; /* pp + 1 unit boundaries */
  double step_s;      /* predicted: pipeline_s + allreduce_s + optimizer_s + the step's fixed cost */
  double pipeline_s;  /* forwards and backwards of the m micro-batches */
  double path_s;      /* the pipeline's critical path (sum + (m - 1) max) */
  double allreduce_s; /* the data-parallel gradient average */
  double optimizer_s;
  double slowest_stage_s; /* max_s (f_s + b_s) */
  double memory_bytes;    /* the most any rank holds */
} plan_choice;

/* FL_OK when p can be searched; FL_EINVAL naming the field otherwise (world, batch, units,
 * tp degrees, a negative or non-finite time or size, missing callbacks). */
fl_status plan_problem_check(const plan_problem *p);

/* The best plan of every grid (its best m and cut), best first: out[0] is the plan chosen,
 * the others the runner-ups, at most max_out of them (*n_out written). Grids none of whose
 * plans fits the memory are left out. FL_EINVAL as plan_problem_check, or max_out 0;
 * FL_ENOMEM; FL_ELIMIT naming the least memory any plan needs when none fits. */
fl_status plan_search(const plan_problem *p, plan_choice *out, size_t max_out, size_t *n_out);

/* The prediction of one given plan (grid, m, bounds: NULL for the best cut of that grid and
 * m). FL_EINVAL for a grid that is not the world, a tp not in the profile, an m that does not
 * divide the replica's batch, or bad bounds; FL_ELIMIT when it does not fit the memory (with
 * bounds given, out is still filled, its memory_bytes saying how much it needs). */
fl_status plan_evaluate(const plan_problem *p, pp_grid grid, int microbatches, const int *bounds,
                        plan_choice *out);

/* The pipeline term alone for a grid and m: the cut (pp + 1 bounds) minimising
 * sum_s (f_s + b_s) + (m - 1) max_s (f_s + b_s) with every stage within memory, and that
 * value. FL_ELIMIT when no cut fits; FL_EINVAL as plan_evaluate. */
fl_status plan_cut(const plan_problem *p, pp_grid grid, int microbatches, int *bounds, double *path_s);

/* The micro-batch sizes the search meets for world, batch and max_microbatches (0: 32):
 * batch / (dp m), distinct, increasing, into rows (at most PLAN_MAX_ROWS; when there are more,
 * that many spread over them, the smallest and the largest kept). Returns how many. */
int plan_microbatch_sizes(int world, int batch, int max_microbatches, int rows[PLAN_MAX_ROWS]);

/* One line for a printout: "dp 2 x tp 1 x pp 2, 1f1b, m 4, cut 0|2|4: 12.3 ms (pipeline 10.1,
 * allreduce 1.2, optimizer 1.0), 3.4 MiB a rank". */
void plan_choice_format(const plan_choice *c, char *buf, size_t size);

#endif /* FLINT_GPU_PLAN_H */
