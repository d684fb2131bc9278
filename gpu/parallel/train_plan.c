/*
 * gpu/parallel/train_plan.c: `flint train --model transformer --plan auto`: the client
 * profiles the model (gpu/parallel/plan_profile.h), searches the plan (gpu/parallel/plan.h)
 * and sets the run's grid, micro-batches and stage cut to it before the barrier stage starts.
 *
 * The data set is laid out by the world's size alone (each task reads batch / world images a
 * step, whatever the grid), so the client loads it for --world ranks first and plans after,
 * with the images' shape in hand.
 */
#include <math.h>
#include <stdio.h>

#include "common/common.h"
#include "gpu/parallel/plan_profile.h"
#include "gpu/parallel/train_rank.h"

#define PLAN_PRINTED 5 /* the chosen plan and up to 4 runner-ups */

fl_status train_plan_choose(gpu_train_options *o, uint32_t channels, uint32_t height, uint32_t width,
                            uint32_t classes, train_arg *a, gpu_train_result *res) {
  int world = (int)o->plan_world, batch = (int)o->batch;
  int max_m = o->plan_max_microbatches ? (int)o->plan_max_microbatches : 32;
  tfm_spec spec = {.seq = (int)(channels * height), .features = (int)width, .hidden = (int)o->hidden,
                   .heads = (int)o->heads, .ffn = (int)o->ffn, .blocks = (int)o->blocks, .classes = (int)classes,
                   .dropout = (float)o->dropout, .seed = o->seed};
  int rows[PLAN_MAX_ROWS];
  int nrows = plan_microbatch_sizes(world, batch, max_m, rows);
  plan_profile pr = {0};
  plan_choice best[PLAN_PRINTED];
  size_t n = 0;
  double t0 = common_now_s();
  fl_status status = plan_profile_measure(o->device, &spec, &o->optim, world, rows, nrows, &pr);
  if (status != FL_OK) return status;
  double profile_s = common_now_s() - t0;
  plan_problem p = {.world = world, .batch = batch, .max_microbatches = max_m,
                    .memory_bytes = o->plan_memory_mb * (1 << 20)};
  plan_profile_problem(&pr, &p);
  FL_CHECK(plan_search(&p, best, PLAN_PRINTED, &n));
  if (o->plan_report) {
    FILE *f = o->plan_report;
    char line[512];
    fprintf(f, "plan         profiled %d units at tp", pr.units);
    for (int k = 0; k < pr.ntp; k++) fprintf(f, "%s%d", k ? "," : " ", pr.tp[k]);
    fprintf(f, " and micro-batches of %d..%d in %.1f s; %s", rows[0], rows[nrows - 1], profile_s,
            pr.cores ? "" : "a device per rank");
    if (pr.cores) fprintf(f, "%d ranks share %d cores (measured: they get %.2f)", world, pr.cores, p.cores);
    if (p.memory_bytes > 0) fprintf(f, "; %.1f MiB a rank", o->plan_memory_mb);
    fprintf(f, "\n");
    for (size_t i = 0; i < n; i++) {
      plan_choice_format(&best[i], line, sizeof line);
      fprintf(f, "plan         %s %s\n", i ? "runner-up" : "chosen   ", line);
    }
    fflush(f);
  }
  const plan_choice *c = &best[0];
  o->ranks = (uint32_t)c->grid.dp;
  o->tp = (uint32_t)c->grid.tp;
  o->pp = (uint32_t)c->grid.pp;
  o->microbatches = (uint32_t)c->microbatches;
  o->schedule = c->schedule;
  a->dp = o->ranks;
  a->tp = o->tp;
  a->pp = o->pp;
  a->microbatches = o->microbatches;
  a->pipeline = o->schedule;
  a->plan_cut = true;
  for (int k = 0; k <= c->grid.pp; k++) a->plan_bounds[k] = c->bounds[k];
  res->plan_dp = o->ranks;
  res->plan_tp = o->tp;
  res->plan_pp = o->pp;
  res->plan_microbatches = o->microbatches;
  res->plan_step_s = c->step_s;
cleanup:
  plan_profile_free(&pr);
  return status;
}
