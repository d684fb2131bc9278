/*
 * iterative: least-squares regression by full-batch gradient descent over a cached dataset,
 * the pattern of iterative ML on flint. Each step broadcasts the weights, sums the gradient
 * over all partitions with tree_aggregate, and updates the weights on the driver.
 *
 *   flint submit --master local[*] build/bin/iterative.so [POINTS] [DIMS] [STEPS] [PARTITIONS]
 *
 * The points are generated from known weights (plus small noise), so the run ends by
 * printing how far the fitted weights are from the true ones.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flint/flint.h"

#define MAX_DIMS 64

typedef struct gen_args {
  uint32_t dims;
  double true_w[MAX_DIMS];
} gen_args;

typedef struct grad_args {
  uint64_t weights; /* broadcast id of dims doubles */
  uint32_t dims;
} grad_args;

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double uniform(uint64_t *state) { return (double)(mix((*state)++) >> 11) / 9007199254740992.0; }

/* Point index -> record of dims features (uniform in [-1, 1]) and the label, as doubles. */
fl_status make_point(fl_bytes rec, fl_buf *out, const void *arg) {
  const gen_args *g = arg;
  uint64_t state = (uint64_t)fl_i64(rec) * 1000003u;
  double row[MAX_DIMS + 1], y = 0;
  for (uint32_t j = 0; j < g->dims; j++) {
    row[j] = 2 * uniform(&state) - 1;
    y += g->true_w[j] * row[j];
  }
  row[g->dims] = y + 0.01 * (uniform(&state) - 0.5);
  return fl_buf_append(out, row, (g->dims + 1) * sizeof(double));
}

/* acc = [gradient (dims), loss, count] += the point's share. */
fl_status add_gradient(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  const grad_args *a = arg;
  fl_bytes wb;
  fl_status s = fl_broadcast_value(a->weights, &wb);
  if (s != FL_OK) return s;
  if (rec.len != (a->dims + 1) * sizeof(double))
    return fl_set_error(FL_EFORMAT, "point of %zu bytes, expected %zu", rec.len,
                        (a->dims + 1) * sizeof(double));
  double w[MAX_DIMS], x[MAX_DIMS + 1], g[MAX_DIMS + 2];
  memcpy(w, wb.data, a->dims * sizeof(double));
  memcpy(x, rec.data, rec.len);
  memcpy(g, acc.data, (a->dims + 2) * sizeof(double));
  double err = -x[a->dims];
  for (uint32_t j = 0; j < a->dims; j++) err += w[j] * x[j];
  for (uint32_t j = 0; j < a->dims; j++) g[j] += err * x[j];
  g[a->dims] += 0.5 * err * err;
  g[a->dims + 1] += 1;
  return fl_buf_append(out, g, (a->dims + 2) * sizeof(double));
}

fl_status merge_gradients(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  const grad_args *ga = arg;
  double x[MAX_DIMS + 2], y[MAX_DIMS + 2];
  memcpy(x, a.data, (ga->dims + 2) * sizeof(double));
  memcpy(y, b.data, (ga->dims + 2) * sizeof(double));
  for (uint32_t j = 0; j < ga->dims + 2; j++) x[j] += y[j];
  return fl_buf_append(out, x, (ga->dims + 2) * sizeof(double));
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  long long points = argc > 1 ? atoll(argv[1]) : 200000;
  long long dims = argc > 2 ? atoll(argv[2]) : 10;
  long long steps = argc > 3 ? atoll(argv[3]) : 10;
  long long partitions = argc > 4 ? atoll(argv[4]) : 0;
  if (points <= 0 || dims <= 0 || dims > MAX_DIMS || steps <= 0 || partitions < 0) {
    fprintf(stderr, "usage: iterative [POINTS > 0] [DIMS 1..%d] [STEPS > 0] [PARTITIONS >= 0]\n", MAX_DIMS);
    return 2;
  }
  gen_args gen = {.dims = (uint32_t)dims};
  for (uint32_t j = 0; j < gen.dims; j++) gen.true_w[j] = (double)(j % 5) - 2.0 + 0.25 * j / gen.dims;

  fl_dataset *ids = NULL, *data = NULL;
  fl_buf total = FL_BUF_INIT;
  int rc = 1;
  if (fl_range(ctx, 0, points, 1, (uint32_t)partitions, &ids) != FL_OK ||
      fl_map(ids, make_point, &gen, sizeof gen, &data) != FL_OK || fl_cache(data) != FL_OK) {
    fprintf(stderr, "iterative: %s\n", fl_last_error());
    goto done;
  }
  printf("least squares by gradient descent: %lld points, %lld features, %u partitions, %u threads\n",
         points, dims, fl_dataset_partitions(data), fl_context_cores(ctx));
  double w[MAX_DIMS] = {0}, zero[MAX_DIMS + 2] = {0};
  /* Features are uniform in [-1, 1] (variance 1/3): a step of 1.5 is stable and fast. */
  const double step_size = 1.5;
  for (long long step = 1; step <= steps; step++) {
    fl_broadcast *bw;
    if (fl_broadcast_create(ctx, w, gen.dims * sizeof(double), &bw) != FL_OK) {
      fprintf(stderr, "iterative: %s\n", fl_last_error());
      goto done;
    }
    grad_args ga = {fl_broadcast_id(bw), gen.dims};
    fl_status s = fl_tree_aggregate(data, fl_bytes_of(zero, (gen.dims + 2) * sizeof(double)),
                                    add_gradient, merge_gradients, &ga, sizeof ga, 2, &total);
    fl_broadcast_destroy(bw);
    if (s != FL_OK) {
      fprintf(stderr, "iterative: %s\n", fl_last_error());
      goto done;
    }
    double g[MAX_DIMS + 2];
    memcpy(g, total.data, (gen.dims + 2) * sizeof(double));
    double n = g[gen.dims + 1];
    for (uint32_t j = 0; j < gen.dims; j++) w[j] -= step_size * g[j] / n;
    printf("step %2lld  loss %.6f\n", step, g[gen.dims] / n);
  }
  double dist = 0;
  for (uint32_t j = 0; j < gen.dims; j++) dist += (w[j] - gen.true_w[j]) * (w[j] - gen.true_w[j]);
  printf("distance from the true weights: %.6f\n", sqrt(dist));
  rc = 0;
done:
  fl_buf_free(&total);
  fl_dataset_free(data);
  fl_dataset_free(ids);
  return rc;
}
