/*
 * ml/ml.h: what the files of ml/ share. ml uses flint's public API only (flint/flint.h,
 * flint/ml.h) plus OpenBLAS and LAPACKE.
 *
 * Task functions (FL_ML_KERNEL) are exported so that cluster mode can name them by symbol:
 * executors load libflint_ml as they load any user library.
 */
#ifndef FLINT_ML_INTERNAL_H
#define FLINT_ML_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "flint/ml.h"

#define FL_ML_KERNEL __attribute__((visibility("default")))

/* Default partitions per core: Sandblaster's many small tasks. */
#define ML_PARTITIONS_PER_CORE 4
/* Default block size: about this many bytes of feature values. */
#define ML_BLOCK_BYTES (1u << 20)

/* fl_ml_load_options.partitions / synthetic partitions when 0. */
uint32_t ml_default_partitions(fl_context *ctx, uint32_t requested);

/* Counts rows of a block dataset and its width: one job. */
fl_status ml_data_describe(fl_ml_data *data);

#endif
