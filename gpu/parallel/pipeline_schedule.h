/*
 * gpu/parallel/pipeline_schedule.h: what each device of a pipeline-parallel job runs, and in
 * which order, for one mini-batch; a simulator that proves an order free of deadlock and
 * measures its bubble; and PipeDream's partitioner that cuts a model's layers into stages.
 *
 * Pure logic: no device, no communicator. The pipeline runtime asks for its rank's op list
 * and runs it, sending each forward's output to the next stage and each backward's input
 * gradient to the previous one; the simulator models exactly those semantics (buffered
 * asynchronous sends, blocking receives), so a schedule that passes it cannot hang the
 * runtime.
 *
 * The schedules (p devices, m micro-batches, v model chunks per device):
 * - PP_GPIPE (Huang et al. 2019): all m forwards in micro-batch order, then all m backwards
 *   in the same order (first in, first out). Holds m micro-batches' activations at once.
 * - PP_1F1B (PipeDream-flush, Megatron-LM's non-interleaved schedule): device r runs
 *   min(p - r - 1, m) warm-up forwards, then one forward and one backward in turn while
 *   forwards remain, then the remaining backwards. Same bubble as GPipe, at most p - r
 *   micro-batches held.
 * - PP_INTERLEAVED (Megatron-LM's interleaved 1F1B, Narayanan et al. 2021): the model is cut
 *   into p*v stages and device r holds stages r, r+p, r+2p, ...; the fill and drain shrink
 *   by v. Micro-batches go in groups of p: each group runs through chunk 0 on every device,
 *   then chunk 1, and so on (backwards: chunk v-1 first). Megatron needs m % p == 0; for any
 *   other m the order is Megatron's for m rounded up to a multiple of p, with the ops of the
 *   padding micro-batches left out. That cannot deadlock: the padded schedule is Megatron's,
 *   which runs to the end, and every dependency is between ops of one micro-batch, so the same
 *   run restricted to the real micro-batches is a valid run of the reduced lists. (Shrinking
 *   the last group instead deadlocks, e.g. p = 8, m = 18, v = 2.) v == 1 is PP_1F1B.
 * - PP_PIPEDREAM and PP_2BW (Narayanan et al. 2019, 2021): 1F1B's order over a window of
 *   several mini-batches with weight updates inside it; see "Asynchronous schedules" below.
 *
 * Threading: plain functions of their arguments; usable from any thread.
 */
#ifndef FLINT_GPU_PIPELINE_SCHEDULE_H
#define FLINT_GPU_PIPELINE_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>

#include "flint/flint.h"

/* PP_PIPEDREAM and PP_2BW (see "Asynchronous schedules" below) run 1F1B's order over a window
 * of several mini-batches without a flush between them. */
typedef enum pp_schedule {
  PP_GPIPE = 0,
  PP_1F1B = 1,
  PP_INTERLEAVED = 2,
  PP_PIPEDREAM = 3,
  PP_2BW = 4
} pp_schedule;

/* "gpipe", "1f1b", "interleaved", "pipedream" or "2bw" (exact, lower case) into *out.
 * FL_EINVAL naming the text and the choices for anything else or a NULL argument. */
FL_API fl_status pp_schedule_parse(const char *text, pp_schedule *out);
/* The name pp_schedule_parse reads back; "unknown" for a value outside the enum. */
FL_API const char *pp_schedule_name(pp_schedule s);

/* PP_UPDATE appears only in pp_replicated_ops's lists (replicated stages under pipedream and
 * 2bw): mini-batch `microbatch`'s update, a collective over the stage's replicas. */
typedef enum pp_op_kind { PP_FORWARD = 0, PP_BACKWARD = 1, PP_UPDATE = 2 } pp_op_kind;
typedef struct pp_op {
  pp_op_kind kind;
  int microbatch; /* 0..m-1 (PP_UPDATE: the mini-batch) */
  int chunk;      /* the device's local model chunk, 0..v-1 (always 0 unless interleaved) */
} pp_op;

/* Global stage of a (device rank, local chunk): chunk * p + rank. The model is cut into p*v
 * stages; device r holds stages r, r+p, r+2p, ... (Megatron's interleaving). Stage s's
 * forward input comes from stage s-1 (device (s-1) % p), its output goes to stage s+1;
 * backward the other way. */
static inline int pp_stage_of(int p, int rank, int chunk) { return chunk * p + rank; }

/* The ordered list of 2*m*v operations device `rank` (0..p-1) runs in one mini-batch under
 * schedule s with p devices, m micro-batches and v chunks per device (v must be 1 unless
 * interleaved; interleaved takes any v >= 1, v == 1 giving PP_1F1B's order). On success
 * *ops is allocated (release it with common_free()) and *n is 2*m*v; on failure both are
 * untouched. FL_EINVAL for p < 1, m < 1, v < 1, rank out of range, v != 1 for gpipe/1f1b,
 * (m + p) * v above 2^28, an unknown schedule or a NULL out-parameter; FL_ENOMEM. */
fl_status pp_schedule_ops(pp_schedule s, int p, int m, int v, int rank, pp_op **ops, size_t *n);

/* The bubble fraction in theory: (p-1)/(m+p-1) for gpipe and 1f1b, that divided by v for
 * interleaved (Megatron's rule of thumb). The simulator, where t_fwd and t_bwd are the times
 * of one chunk's op, measures interleaved with m % p == 0 as exactly (p-1)/(v*m+p-1): a
 * device works v*m*(t_fwd+t_bwd) and the fill and drain cost (p-1)*(t_fwd+t_bwd). That is
 * Megatron's bubble-to-work ratio (p-1)/(v*m) as a fraction of the whole, and it equals
 * this value only for p == 1 or v == 1 (above it otherwise). NaN for bad arguments. */
double pp_bubble_theory(pp_schedule s, int p, int m, int v);

/* Runs the schedule of all p devices in a discrete-event simulation with the runtime's
 * semantics: a send is asynchronous (buffered, never blocks), a receive blocks until the
 * message has arrived; a forward of (stage, mb) needs the forward of (stage-1, mb) done
 * (stage 0 needs nothing); a backward of (stage, mb) needs its own forward and the backward
 * of (stage+1, mb) (the last stage's backward needs only its own forward); each op takes
 * t_fwd or t_bwd on its device, transfers take 0. Each device starts an op as soon as it is
 * free and the op's inputs are done.
 * *makespan: time until all devices are done; *bubble: 1 - (total busy time) /
 * (p * makespan), 0 when the makespan is 0.
 * FL_ESTATE when the schedule deadlocks (no device can progress), naming a blocked device,
 * its op and the op it waits for: a device whose backward waits for its own later forward if
 * there is one (the list at fault), else the first blocked device. FL_EINVAL as
 * pp_schedule_ops, or for a negative or non-finite time or a NULL out-parameter. */
fl_status pp_schedule_simulate(pp_schedule s, int p, int m, int v, double t_fwd, double t_bwd,
                               double *makespan, double *bubble);

/* The simulator over hand-made op lists, which pp_schedule_simulate feeds with its own:
 * ops[d] holds n[d] ops of device d (0..p-1). The micro-batches are 0..M-1 with M one more
 * than the largest in any list. FL_EINVAL for a bad argument, an op out of range, an op
 * listed twice or a (stage, micro-batch) whose forward or backward no device runs; FL_ESTATE
 * on a deadlock, as above. */
fl_status pp_simulate_ops(int p, int v, const pp_op *const *ops, const size_t *n, double t_fwd,
                          double t_bwd, double *makespan, double *bubble);

/* The peak number of micro-batches whose activations device `rank` holds at once (forwarded,
 * not yet backwarded, each chunk counted apart), walking its op list: m for gpipe,
 * min(m, p - rank) for 1f1b, for interleaved with m % p == 0
 * min(m*v, (p-rank-1)*2 + (v-1)*p + 1) (its warm-up and the first steady forward; with
 * m % p != 0 at most that, as the left-out padding holds nothing). -1, with FL_EINVAL or
 * FL_ENOMEM in fl_last_error(), for what pp_schedule_ops refuses. */
int pp_schedule_peak_inflight(pp_schedule s, int p, int m, int v, int rank);

/* PipeDream's partitioner: cuts n layers (in order) into p contiguous non-empty stages
 * minimising the slowest stage, where a stage's time is the sum of its layers' times plus,
 * for every stage but the last, the time to send its last layer's output:
 * out_bytes[last] / bytes_per_s (bytes_per_s <= 0: communication is free, and out_bytes may
 * then be NULL). Dynamic programming, O(n^2 p) time, O(n p) memory. bounds has p+1 entries:
 * stage k is layers [bounds[k], bounds[k+1]), bounds[0] = 0, bounds[p] = n; *bottleneck is
 * the slowest stage's time. FL_EINVAL when p > n, p < 1, n < 1, a negative or non-finite
 * time or size, a non-finite bytes_per_s, or a NULL array; FL_ENOMEM. */
fl_status pp_partition(const double *layer_time, const double *out_bytes, size_t n, int p,
                       double bytes_per_s, size_t *bounds, double *bottleneck);

/* ---- asynchronous schedules (PipeDream, PipeDream-2BW) ---------------------------------- *
 *
 * A window is `minibatches` mini-batches of m micro-batches each, M = m x minibatches
 * micro-batches numbered across the window (mini-batch k is micro-batches [k m, (k+1) m)).
 * pp_schedule_ops(PP_PIPEDREAM or PP_2BW, p, M, 1, rank) is 1F1B's order over all M: after
 * the warm-up every device alternates one forward and one backward across mini-batch
 * boundaries, and the pipeline drains only at the window's end, so the bubble is
 * (p-1)/(M+p-1) and goes to 0 as the window grows (pp_schedule_simulate measures it).
 *
 * Updates: a device applies mini-batch k's update right after its backward of micro-batch
 * k m + m - 1 (the mini-batch's last): the gradients of the mini-batch's m micro-batches,
 * accumulated, one optimizer step. With m = 1 that is PipeDream's update after every
 * micro-batch; m > 1 adds gradient accumulation, which is what lets a flush every mini-batch
 * (a window of one) reproduce GPipe exactly. Version j of a device's weights is the weights
 * after j of the window's updates (0: as the window found them).
 *
 * Which version a micro-batch uses (its backward always uses its forward's version: weight
 * stashing):
 * - PP_PIPEDREAM: the newest version on the device when the forward starts;
 * - PP_PIPEDREAM with vertical sync: the newest version on device 0 when the micro-batch
 *   entered the pipeline, on every device (every device has made that version by then:
 *   device r's forward of micro-batch i follows its backward of i - p + r, device 0's
 *   follows that of i - p);
 * - PP_2BW: mini-batch k uses version max(0, k - 1), so update k + 1 is
 *   W(k+1) = W(k) - lr grad(W(k-1)) (1-stale, Narayanan et al. 2021); needs m >= p, and then
 *   a device holds at most 2 versions. */

/* The version each of the window's M = m x minibatches micro-batches uses on device `rank`,
 * into version[0..M-1] (non-decreasing). vertical_sync applies to PP_PIPEDREAM only.
 * FL_EINVAL for a schedule other than PP_PIPEDREAM or PP_2BW, p < 1, m < 1,
 * minibatches < 1, rank out of range, M above 2^28, PP_2BW with m < p, or a NULL version;
 * FL_ENOMEM. */
fl_status pp_weight_versions(pp_schedule s, bool vertical_sync, int p, int m, int minibatches,
                             int rank, int *version);

/* The most weight versions device `rank` keeps at once when it keeps exactly those it may
 * still need: from the version of its oldest micro-batch not yet backwarded (the next
 * forward's when none is in flight) to its newest, dropping the old ones before each update
 * stores the new one. -1, with fl_last_error(), for what pp_weight_versions refuses. */
int pp_weight_versions_peak(pp_schedule s, bool vertical_sync, int p, int m, int minibatches,
                            int rank);

/* 1F1B-RR (PipeDream): the replica, of `replicas`, of a replicated stage that runs
 * micro-batch mb: round robin, mb % replicas. */
static inline int pp_replica_of(int mb, int replicas) { return mb % replicas; }

/* ---- the partitioner with replicated stages ---------------------------------------------- */

typedef struct pp_stage_plan {
  size_t first, end; /* layers [first, end) */
  int replicas;      /* ranks that run the stage, round robin (pp_replica_of) */
} pp_stage_plan;

/* PipeDream's partitioner with stage replication (Narayanan et al. 2019, section 3.1): cuts n
 * layers into contiguous stages over exactly `world` ranks, stage k replicated r_k times
 * (sum r_k = world), minimising the slowest stage. A stage of layers [i, j) on r replicas
 * takes  sum(layer_time[i..j)) / r  +  2 (r - 1) / r x sum(weight_bytes[i..j)) / bytes_per_s
 * (a ring allreduce of its weights among the replicas)  +  out_bytes[j-1] / bytes_per_s (sending
 * its output; not for the last stage). bytes_per_s <= 0: communication is free, and
 * out_bytes and weight_bytes may be NULL. max_stages (>= 1) bounds the number of stages.
 * stages has room for min(world, max_stages, n) entries; *nstages and *bottleneck (the slowest
 * stage's time) are set. O(n^2 world^2). FL_EINVAL for n < 1, world < 1, max_stages < 1, a
 * negative or non-finite time or size, a non-finite bandwidth or a NULL array; FL_ENOMEM. */
fl_status pp_partition_replicated(const double *layer_time, const double *out_bytes,
                                  const double *weight_bytes, size_t n, int world,
                                  int max_stages, double bytes_per_s, pp_stage_plan *stages,
                                  int *nstages, double *bottleneck);

/* ---- replicated stages under every schedule (PipeDream's 1F1B-RR) ------------------------ *
 *
 * Stage s on r_s replicas: replica j runs the unreplicated stage's op list restricted to its
 * micro-batches (pp_replica_of(mb, r_s) == j), in the same order. Under pipedream and 2bw the
 * list also holds, for every mini-batch k, PP_UPDATE k where the unreplicated stage updates:
 * right after its backward of micro-batch k m + m - 1, whichever replica runs that. The update
 * sums the mini-batch's gradients over the stage's replicas (a collective: every replica must
 * reach it), so all replicas apply the same updates between the same ops of the unreplicated
 * order and a micro-batch's forward sees the version of the unreplicated plan
 * (pp_weight_versions). */

/* Replica `replica` of `replicas` of stage `stage` (0..p-1) of schedule s (gpipe, 1f1b,
 * pipedream or 2bw; one chunk) over `total` micro-batches of mini-batches of m (m divides
 * total; m matters only for the updates of pipedream and 2bw). *ops is allocated (release it
 * with common_free()). FL_EINVAL as pp_schedule_ops, for interleaved, replicas < 1, a replica
 * out of range, or m < 1 or not dividing total; FL_ENOMEM. */
fl_status pp_replicated_ops(pp_schedule s, int p, int total, int m, int stage, int replicas, int replica,
                            pp_op **ops, size_t *n);

/* The simulator of pp_schedule_simulate over replicated stages: stage s on replicas[s] devices
 * running pp_replicated_ops's lists, with PP_UPDATE a barrier of the stage's replicas that
 * takes no time (it starts when the last replica reaches it). Forwards and backwards depend on
 * the same ops as unreplicated, whichever replica runs them. *bubble counts every device.
 * FL_ESTATE naming a blocked replica when the lists deadlock; FL_EINVAL as pp_replicated_ops or
 * for a replica count above 64 or a NULL argument; FL_ENOMEM. */
fl_status pp_simulate_replicated(pp_schedule s, int p, int total, int m, const int *replicas, double t_fwd,
                                 double t_bwd, double *makespan, double *bubble);

#endif
