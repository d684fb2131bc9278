/*
 * gpu/comm/cost_model.h: the alpha-beta-gamma cost model of the allreduce algorithms and the
 * calibration that measures its parameters when a host communicator forms, private to
 * gpu/comm/. AUTO (comm_pick_algo) is the argmin of the model's predictions; bench_allreduce
 * prints each prediction beside the measured time. docs/collectives.md, "The cost model",
 * has every formula.
 *
 * A link class (ranks on one host, ranks on different hosts) has a latency alpha (seconds
 * per message) and a cost per byte beta (seconds per byte, a full-duplex exchange: both ends
 * send and receive the bytes at once, as in most steps of the algorithms), which depends on
 * the message's size (measured at three); gamma is seconds per byte summed into a vector.
 * Ring steps whose block is within [copy_min, copy_max] bytes move by a single copy
 * (gpu/comm/host_transport.h) and cost beta_ring per byte instead.
 */
#ifndef FLINT_GPU_COMM_COST_MODEL_H
#define FLINT_GPU_COMM_COST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flint/gpu.h"

/* The message sizes at which beta is measured: per byte, a 32 KiB exchange costs more than a
 * 1 MiB one (per-message work), and one of several MiB more again (past the caches and the
 * socket buffers); between them beta is interpolated on log2 of the size. */
#define COMM_COST_SIZES 3
extern const double comm_cost_sizes[COMM_COST_SIZES];

typedef struct comm_link {
  double alpha;                        /* seconds per message */
  double beta[COMM_COST_SIZES];        /* seconds per byte of an exchange (both directions at
                                        * once) of comm_cost_sizes[i] bytes */
  double beta_ring[COMM_COST_SIZES];   /* the same for ring steps that move by single copy */
} comm_link;

/* beta (or beta_ring) for a message of `bytes`: interpolated between the measured sizes on
 * log2 of the size, the end values outside them. */
double comm_link_beta(const double beta[COMM_COST_SIZES], double bytes);

/* The vector sizes at which gamma is measured: in the caches, and past them (where a sum
 * reads and writes memory: 4-5x slower per byte on the 2-core machine). Between them gamma
 * is interpolated on log2 of the size, the end values outside them. */
#define COMM_GAMMA_SIZES 2
extern const double comm_gamma_sizes[COMM_GAMMA_SIZES];

typedef struct comm_cost_params {
  comm_link intra, inter; /* ranks on one host; ranks on different hosts */
  double gamma[COMM_GAMMA_SIZES]; /* seconds per byte reduced (dst += src over fp32) at each
                                   * of comm_gamma_sizes */
  uint64_t copy_min;      /* ring steps of copy_min..copy_max bytes cost beta_ring; 0: none */
  uint64_t copy_max;      /* UINT64_MAX: no limit */
  bool calibrated;        /* measured (false: comm_cost_defaults) */
} comm_cost_params;

/* gamma for summing vectors of `bytes`, interpolated the same way. */
double comm_cost_gamma(const comm_cost_params *q, double bytes);

/* Where the ranks are: the model needs the count, the hosts and the most ranks on one host
 * (hierarchical). Every rank of a group computes the same shape. */
typedef struct comm_cost_shape {
  int size, nhosts, max_local;
} comm_cost_shape;

typedef struct comm_cost_model {
  comm_cost_params params;
  comm_cost_shape shape;
} comm_cost_model;

/* The parameters used when calibration is off (FLINT_COMM_CALIBRATE=0) or impossible (one
 * rank): loopback TCP on one host, 10 GbE between hosts, no single copy. */
void comm_cost_defaults(comm_cost_params *out);
/* A model for `size` ranks on one host with the default parameters (what a communicator
 * starts with before calibration, and what the NCCL backend keeps, unused). */
void comm_cost_model_init(comm_cost_model *m, int size);

/* Whether AUTO may pick `algo` on this shape (hierarchical: more than one host and some host
 * with more than one rank; AUTO itself: never). */
bool comm_cost_applies(const comm_cost_model *m, fl_allreduce_algo algo);
/* Predicted seconds of an allreduce of `bytes` by `algo` (not AUTO) on m's shape; 0 for one
 * rank or no bytes, a negative number for AUTO or an algorithm that does not apply. */
double comm_cost_predict(const comm_cost_model *m, fl_allreduce_algo algo, size_t bytes);
/* The algorithm of least predicted time among those that apply (ties: the first in the
 * model's table, ring first). The same on every rank given the same model. */
fl_allreduce_algo comm_cost_best(const comm_cost_model *m, size_t bytes);

/* ---- for the communicator and the benchmark (gpu/comm/comm.c) --------------------------- */
typedef struct fl_comm fl_comm;
/* c's model (its calibrated parameters and shape); NULL for a NULL c. */
const comm_cost_model *comm_cost_of(const fl_comm *c);
/* Gives c the model m (and forgets AUTO's picks made with the old one). Only while no other
 * thread uses c: a pick made with the old model at the same time could be stored after the
 * clearing, and a rank whose pick differs from its peers' deadlocks them. */
void comm_set_cost_model(fl_comm *c, const comm_cost_model *m);
/* Predicted seconds of an allreduce of `bytes` on c by `algo` (AUTO: by what AUTO picks);
 * negative when algo does not apply to c. */
double comm_predict_seconds(const fl_comm *c, fl_allreduce_algo algo, size_t bytes);

/* ---- calibration (gpu/comm/calibrate.c) -------------------------------------------------- */
typedef struct comm_host comm_host;
/* Measures alpha, beta and beta_ring of each link class that this group has, and gamma, by
 * a few timed exchanges between pairs of ranks (same-host pairs, then pairs of hosts), and
 * gives every rank the same parameters (an allgather of every rank's measurements, combined
 * alike on every rank), in a few milliseconds. FLINT_COMM_CALIBRATE=0 on any rank: every rank
 * keeps comm_cost_defaults. Collective over h's ranks; blocks; fills *out (model and shape)
 * only on FL_OK, else a transport failure naming the peer. */
fl_status comm_host_calibrate(comm_host *h, comm_cost_model *out);

#endif /* FLINT_GPU_COMM_COST_MODEL_H */
