/*
 * gpu/parallel/plan_profile.h: the measurements behind the automatic plan (plan.h): each unit
 * of the transformer timed at every tensor-parallel degree the world allows, its parameters,
 * activations and output measured, the host backend's cost model calibrated, the optimizer's
 * step timed.
 *
 * How ranks run here decides what a time means. The profile is taken in this process: for
 * each tensor-parallel degree t, t threads form a host communicator over loopback (as the
 * ranks of a local run do) and every thread times each unit's forward and backward on its
 * shard, in step with the others since the blocks allreduce. Rank 0's median of 3 is the
 * unit's wall time at t; the model's prediction of its allreduces is taken off (the plan
 * adds it back from the same model), and when the t threads outnumber the cores, each had
 * only cores / t of one, so the time is scaled by that: what is left is one rank's compute
 * alone. The plan then adds the contention of the whole world back (plan_problem.cores: the
 * pipeline cannot be faster than all ranks' compute spread over the cores). "The cores" are
 * measured, not counted: one block timed by one thread and by `world` threads at once gives
 * the cores the world really gets (fewer than the host's when something else runs there, or
 * when the cores are hyper-threads). And the runtime's own cost of a micro-batch is measured
 * on a one-rank trainer (pipeline.h): its step with one micro-batch and with many, less the
 * profile's compute of each. Times are taken
 * at every micro-batch size the search can meet (small matrices are not linear in their
 * rows), and a line through the smallest and largest is kept for any other size.
 *
 * Threading: plan_profile_measure blocks (it starts and joins its threads); a profile is
 * read-only afterwards and may be shared.
 */
#ifndef FLINT_GPU_PLAN_PROFILE_H
#define FLINT_GPU_PLAN_PROFILE_H

#include "gpu/comm/comm.h"
#include "gpu/parallel/plan.h"

typedef struct plan_profile {
  int world;
  int nrows, rows[PLAN_MAX_ROWS]; /* the micro-batch sizes measured */
  int units;
  plan_unit *unit; /* units of them (owned) */
  int ntp, tp[PLAN_MAX_TPS];
  comm_cost_params *comm;     /* calibrated on `world` host ranks (the defaults for 1); owned */
  double optimizer_s_per_byte;
  double state_copies;        /* gradients + the optimizer's state slots */
  int cores;                  /* online CPUs on cpu; 0 on cuda (a GPU each) */
  double microbatch_s;        /* the runtime's own cost of a micro-batch on a stage (plan_problem's) */
  double cores_measured;      /* the cores `world` threads really got at once (0: not measured) */
} plan_profile;

/* Measures spec on a device of `kind` (cuda: device 0 for every thread) for a world of
 * `world` ranks, at micro-batches of rows[0] < rows[1] < ... (nrows of them, 1 to
 * PLAN_MAX_ROWS; the plan uses these times at exactly these sizes, and between them the line
 * through the first and the last), with optimizer o. tp degrees: the divisors of world that divide the heads and the MLP (at
 * most PLAN_MAX_TPS, smallest first). FL_EINVAL for a bad spec or argument; the device's,
 * the communicator's or FL_ENOMEM otherwise. *out is filled only on FL_OK. */
fl_status plan_profile_measure(fl_device_kind kind, const tfm_spec *spec, const optim_options *o, int world,
                               const int *rows, int nrows, plan_profile *out);
void plan_profile_free(plan_profile *pr);

/* Points p's profile, tp degrees, state copies, optimizer cost, cores and communication model
 * at pr (borrowed: it must outlive p's use), and sets the step's fixed cost to the runtime's
 * three small collectives over the world a step (its barrier, the pipeline's bubble
 * measurement, the loss's allreduce) by the model. The rest of p is left as it is. */
void plan_profile_problem(const plan_profile *pr, plan_problem *p);

#endif /* FLINT_GPU_PLAN_PROFILE_H */
