/*
 * model_user: model builders as a user writes them (include/flint/train.h), for
 * `flint train --model model_user.so[:SYMBOL]` in test_gpu_train_cli. flint_model is a small
 * residual MLP; the others are wrong on purpose.
 */
#include "flint/train.h"

#define MODEL_EXPORT __attribute__((visibility("default")))

MODEL_EXPORT fl_status flint_model(fl_model *m, uint32_t classes) {
  fl_status s = fl_model_flatten(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc1", 64, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_residual_begin(m, "block");
  if (s == FL_OK) s = fl_model_linear(m, "block.fc", 64, true);
  if (s == FL_OK) s = fl_model_gelu(m);
  if (s == FL_OK) s = fl_model_dropout(m, 0.1);
  if (s == FL_OK) s = fl_model_residual_end(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc2", (int)classes, true);
  return s;
}

/* Seven scores, whatever the classes. */
MODEL_EXPORT fl_status wrong_output(fl_model *m, uint32_t classes) {
  (void)classes;
  return fl_model_linear(m, "fc", 7, true);
}

/* A builder that gives up, with its reason. */
MODEL_EXPORT fl_status gives_up(fl_model *m, uint32_t classes) {
  (void)m;
  return fl_set_error(FL_EINVAL, "this builder wants %u classes to be 3", classes);
}
