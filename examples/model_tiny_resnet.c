/*
 * model_tiny_resnet: a model of your own for `flint train --model model_tiny_resnet.so`: a
 * small residual network for 28x28 images, written against include/flint/train.h. The trainer
 * creates the model for the data's samples and calls this builder on every rank.
 *
 *   flint train --model build/bin/model_tiny_resnet.so --data fashion-mnist --epochs 2
 */
#include <flint/train.h>

/* conv-bn-relu twice around an identity shortcut, then relu. */
static fl_status block(fl_model *m, const char *name, const char *conv_a, const char *bn_a, const char *conv_b,
                       const char *bn_b, int channels) {
  const fl_conv2d_options conv = {.out_channels = channels, .kernel = 3, .padding = 1};
  fl_status s = fl_model_residual_begin(m, name);
  if (s == FL_OK) s = fl_model_conv2d(m, conv_a, &conv);
  if (s == FL_OK) s = fl_model_batchnorm(m, bn_a, false);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_conv2d(m, conv_b, &conv);
  if (s == FL_OK) s = fl_model_batchnorm(m, bn_b, true); /* the block starts as the identity */
  if (s == FL_OK) s = fl_model_residual_end(m);
  if (s == FL_OK) s = fl_model_relu(m);
  return s;
}

__attribute__((visibility("default"))) fl_status flint_model(fl_model *m, uint32_t classes) {
  const fl_conv2d_options stem = {.out_channels = 16, .kernel = 3, .padding = 1};
  const fl_conv2d_options widen = {.out_channels = 32, .kernel = 3, .stride = 2, .padding = 1};
  fl_status s = fl_model_conv2d(m, "stem", &stem);
  if (s == FL_OK) s = fl_model_batchnorm(m, "stem_bn", false);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = block(m, "block1", "block1.conv1", "block1.bn1", "block1.conv2", "block1.bn2", 16);
  if (s == FL_OK) s = fl_model_conv2d(m, "widen", &widen);
  if (s == FL_OK) s = fl_model_batchnorm(m, "widen_bn", false);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = block(m, "block2", "block2.conv1", "block2.bn1", "block2.conv2", "block2.bn2", 32);
  if (s == FL_OK) s = fl_model_global_avgpool(m);
  if (s == FL_OK) s = fl_model_dropout(m, 0.1);
  if (s == FL_OK) s = fl_model_linear(m, "fc", (int)classes, true);
  return s;
}
