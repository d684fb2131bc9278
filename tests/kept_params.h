/*
 * kept_params.h: the parameters a rank of the hybrid trainer (gpu/parallel/pipeline.h) holds,
 * copied after a run, and their comparison with a single rank's whole tensors, for the tests
 * that check a grid trains as one rank does (test_gpu_pipeline, test_gpu_gpt,
 * test_gpu_moe_transformer).
 */
#ifndef FLINT_TEST_KEPT_PARAMS_H
#define FLINT_TEST_KEPT_PARAMS_H

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "gpu/parallel/pipeline.h"

/* What a run keeps per parameter: its name, place and gradient (or value) after the run. */
typedef struct kept_param {
  char name[96];
  tfm_param_place place;
  int64_t lrows, lcols; /* the shard's shape (vectors: one row) */
  float *data;
  size_t n;
} kept_param;

static inline void kept_free(kept_param *k, size_t n) {
  for (size_t i = 0; k && i < n; i++) free(k[i].data);
  free(k);
}

/* Copies every parameter of t's chunks: values, or gradients. On failure nothing is left. */
static inline fl_status kept_take(pp_trainer *t, bool values, kept_param **out, size_t *nout) {
  size_t total = 0;
  for (int c = 0; c < pp_trainer_num_chunks(t); c++) total += tfm_chunk_param_count(pp_trainer_chunk(t, c));
  kept_param *k = calloc(total ? total : 1, sizeof *k);
  if (!k) return FL_ENOMEM;
  size_t i = 0;
  for (int c = 0; c < pp_trainer_num_chunks(t); c++) {
    tfm_chunk *ch = pp_trainer_chunk(t, c);
    for (size_t p = 0; p < tfm_chunk_param_count(ch); p++, i++) {
      nn_param *np = tfm_chunk_param(ch, p);
      const fl_tensor *src = values ? &np->value : &np->grad;
      snprintf(k[i].name, sizeof k[i].name, "%s", np->name);
      k[i].place = tfm_chunk_param_place(ch, p);
      k[i].n = src->numel;
      k[i].lrows = src->ndim == 1 ? 1 : src->shape[0];
      k[i].lcols = k[i].lrows ? (int64_t)src->numel / k[i].lrows : 0;
      k[i].data = malloc(src->numel * sizeof(float));
      if (!k[i].data) {
        kept_free(k, i);
        return FL_ENOMEM;
      }
      memcpy(k[i].data, src->data, src->numel * sizeof(float));
    }
  }
  *out = k;
  *nout = total;
  return FL_OK;
}

static inline const kept_param *kept_find(const kept_param *ref, size_t nref, const char *name) {
  for (size_t i = 0; i < nref; i++)
    if (strcmp(ref[i].name, name) == 0) return &ref[i];
  return NULL;
}

/* The largest difference between any rank's shard (kept[r], nkept[r] of them, for `ranks`
 * ranks) and its slice of the single rank's tensor (ref), relative to that tensor's largest
 * magnitude, but never to less than a hundredth of the model's largest: a gradient that is a
 * sum of terms cancelling to near zero (the position embedding's over a batch) carries the
 * rounding of its terms, not of its result. Shards above report_above are printed. Every
 * shard must be of a reference parameter; held (NULL: not wanted; else nref counts, zeroed
 * by the caller) counts the shards held of each, and without it every reference parameter
 * must be held by some rank. A NaN anywhere makes the result NaN. */
static inline double kept_worst_difference(kept_param *const *kept, const size_t *nkept, int ranks,
                                           const kept_param *ref, size_t nref, double report_above,
                                           const char *what, int *held) {
  double worst = 0, floor_scale = 0;
  bool nan = false; /* sticky: a comparison with NaN is false, so a max alone would lose it */
  for (size_t i = 0; i < nref; i++)
    for (size_t j = 0; j < ref[i].n; j++) floor_scale = fmax(floor_scale, fabs(ref[i].data[j]));
  floor_scale *= 1e-2;
  int *count = held ? held : calloc(nref ? nref : 1, sizeof *count);
  assert_non_null(count);
  for (int r = 0; r < ranks; r++)
    for (size_t i = 0; i < nkept[r]; i++) {
      const kept_param *k = &kept[r][i], *w = kept_find(ref, nref, k->name);
      if (!w) fail_msg("%s: rank %d holds '%s', which the single rank does not", what, r, k->name);
      count[w - ref]++;
      double scale = floor_scale, diff = 0;
      for (size_t j = 0; j < w->n; j++) scale = fmax(scale, fabs(w->data[j]));
      /* The shard is [lrows, lcols] at (row0, col0) of the full [rows, cols]. */
      assert_int_equal(k->lrows * k->lcols, (int64_t)k->n);
      for (int64_t a = 0; a < k->lrows; a++)
        for (int64_t b = 0; b < k->lcols; b++) {
          double want = w->data[(k->place.row0 + a) * k->place.cols + k->place.col0 + b];
          double d = fabs(k->data[a * k->lcols + b] - want);
          if (isnan(d)) nan = true;
          else if (d > diff) diff = d;
        }
      double rel = scale > 0 ? diff / scale : diff;
      if (rel > worst) worst = rel;
      if (rel > report_above)
        fprintf(stderr, "  %s: rank %d '%s' differs by %.3g of its largest magnitude %.3g\n", what, r, k->name,
                rel, scale);
    }
  if (!held) {
    for (size_t i = 0; i < nref; i++)
      if (count[i] == 0) fail_msg("%s: no rank holds '%s'", what, ref[i].name);
    free(count);
  }
  return nan ? NAN : worst; /* NaN fails every caller's bound */
}

#endif /* FLINT_TEST_KEPT_PARAMS_H */
