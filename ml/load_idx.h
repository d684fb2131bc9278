/*
 * load_idx.h: fl_ml_load of IDX files (load_idx.c), for load.c.
 */
#ifndef FLINT_ML_LOAD_IDX_H
#define FLINT_ML_LOAD_IDX_H

#include "ml/ml.h"

/* Loads the IDX images at `path` with o->labels_path into data (blocks persisted and
 * described); parts: the partitions wanted. Errors as fl_ml_load's. */
fl_status ml_load_idx(fl_context *ctx, const char *path, const fl_ml_load_options *o, uint32_t parts,
                      fl_ml_data *data);

#endif
