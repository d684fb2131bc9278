/*
 * logreg: multinomial logistic regression on Fashion-MNIST (60000 training and 10000 test
 * images of 28 x 28 pixels, 10 classes) with libflint_ml: the images load into cached row
 * blocks, L-BFGS minimizes the mean log-loss plus (lambda / 2) |W|^2, each evaluation one
 * stage of small tasks over the blocks (the Sandblaster pattern), and the run ends with the
 * accuracy on the training and the test images. The main job of `make run`.
 *
 *   flint submit --master local[*] build/bin/logreg.so [DIR] [ITERATIONS] [LAMBDA]
 *
 * DIR holds {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz (default: where the Debian
 * package dataset-fashion-mnist puts them); ITERATIONS defaults to 100, LAMBDA to 1e-4.
 * The job links libflint_ml, so in cluster mode the executors load it as they load the
 * job (the driver learns its path with dladdr).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flint/ml.h"

#define DEFAULT_DIR "/usr/share/datasets/fashion-mnist"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

fl_status logreg_progress(void *arg, const fl_ml_iteration *it) {
  (void)arg;
  printf("iter %3u  loss %.10f  |grad| %.3e  step %.2e  evals %u  %.2f s\n", it->iteration, it->loss, it->grad_norm,
         it->step, it->evaluations, it->seconds);
  fflush(stdout);
  return FL_OK;
}

/* Loads images and labels DIR/PREFIX-{images-idx3,labels-idx1}-ubyte.gz. */
static fl_status load_split(fl_context *ctx, const char *dir, const char *prefix, fl_ml_data **out) {
  char images[4096], labels[4096];
  snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
  snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
  fl_ml_load_options o = {.labels_path = labels};
  double t0 = now_s();
  fl_status s = fl_ml_load(ctx, images, FL_ML_IDX, &o, out);
  if (s == FL_OK)
    printf("loaded %s: %llu images of %u pixels, %u partitions, %.2f s\n", prefix, (unsigned long long)(*out)->rows,
           (*out)->cols, fl_dataset_partitions((*out)->blocks), now_s() - t0);
  return s;
}

static bool parse_positive(const char *text, double *out) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (end == text || *end || errno || !isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : DEFAULT_DIR;
  double iterations = 100, lambda = 1e-4;
  if ((argc > 2 && (!parse_positive(argv[2], &iterations) || iterations < 1 || iterations > 1e6 ||
                    iterations != floor(iterations))) ||
      (argc > 3 && !parse_positive(argv[3], &lambda)) || argc > 4) {
    fprintf(stderr, "usage: logreg [DIR] [ITERATIONS >= 1] [LAMBDA >= 0]\n");
    return 2;
  }
  static const char *const files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                      "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  for (int i = 0; i < 4; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (access(path, R_OK) != 0) {
      fprintf(stderr,
              "logreg: Fashion-MNIST is missing: cannot read %s (%s).\n"
              "Install the Debian package dataset-fashion-mnist (scripts/setup does), or pass the folder that "
              "holds the four files as the first argument.\n",
              path, strerror(errno));
      return 1;
    }
  }

  fl_ml_data *train = NULL, *test = NULL;
  fl_ml_model *model = NULL;
  fl_ml_metrics train_m, test_m;
  int rc = 1;
  double t0 = now_s();
  if (load_split(ctx, dir, "train", &train) != FL_OK || load_split(ctx, dir, "t10k", &test) != FL_OK) goto done;
  /* Pixels scaled to [0, 1] (the loader's default) need no standardization; a little L2
   * keeps the softmax weights bounded and costs nothing in test accuracy. */
  fl_ml_train_options o = {.solver = FL_ML_SOLVER_LBFGS, .l2 = lambda, .max_iterations = (uint32_t)iterations,
                           .tol = 1e-5, .progress = logreg_progress};
  printf("multinomial logistic regression, L-BFGS, lambda %g, at most %u iterations, %u task threads\n", lambda,
         o.max_iterations, fl_context_cores(ctx));
  if (fl_ml_logreg(train, &o, &model) != FL_OK) goto done;
  if (fl_ml_evaluate(model, train, &train_m) != FL_OK || fl_ml_evaluate(model, test, &test_m) != FL_OK) goto done;
  printf("%u classes, %u iterations (%s), training %.2f s\n", model->classes, model->num_history,
         model->converged ? "converged" : "not converged", model->train_seconds);
  printf("train accuracy %.4f  log-loss %.4f\n", train_m.accuracy, train_m.log_loss);
  printf("test  accuracy %.4f  log-loss %.4f\n", test_m.accuracy, test_m.log_loss);
  printf("total %.2f s\n", now_s() - t0);
  rc = 0;
done:
  if (rc) fprintf(stderr, "logreg: %s\n", fl_last_error());
  fl_ml_model_free(model);
  fl_ml_data_free(test);
  fl_ml_data_free(train);
  return rc;
}
