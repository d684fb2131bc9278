/*
 * gpu/nn/nn.h: layers and models with forward and backward on any device.
 *
 * A model is a sequence of layers. All its parameters live in one flat device buffer and
 * their gradients in another, in parameter order (the order of the layers' forward pass),
 * so that the optimizer takes one step over the whole buffer and data-parallel training
 * allreduces contiguous ranges of it (buckets). Backward finishes parameters in reverse
 * order and says so through a callback as each layer's gradients are final, which lets the
 * trainer start a bucket's allreduce while backward goes on (overlap).
 *
 * Threading: a model is used by one thread at a time.
 */
#ifndef FLINT_GPU_NN_H
#define FLINT_GPU_NN_H

#include "gpu/device/device.h"

/* NN_TRANSFORMER names gpu/parallel/transformer.h's model for the trainer's options; it is built in
 * chunks (tfm_chunk_create), not by nn_model_create. */
typedef enum nn_model_kind { NN_MLP = 0, NN_CNN = 1, NN_RESNET18 = 2, NN_TRANSFORMER = 3 } nn_model_kind;

typedef struct nn_model_spec {
  nn_model_kind kind;
  int channels, height, width; /* input images, NCHW */
  int classes;
  int hidden;    /* MLP: width of its hidden layers (0: 256) */
  int width_mult; /* ResNet-18: channels of its first stage (0: 64) */
  uint64_t seed; /* weight initialisation (He/Kaiming), the same on every rank */
} nn_model_spec;

/* One parameter: views into the model's flat value and gradient buffers. */
typedef struct nn_param {
  const char *name; /* "conv1.weight", "layer2.0.bn1.bias", ... */
  fl_tensor value;
  fl_tensor grad;
  size_t offset; /* in elements, into the flat buffers */
} nn_param;

typedef struct nn_model nn_model;

/* "mlp", "cnn", "resnet18", "transformer"; FL_EINVAL otherwise. */
FL_API fl_status nn_model_kind_parse(const char *text, nn_model_kind *out);
FL_API const char *nn_model_kind_name(nn_model_kind kind);
/* Builds the model on dev with seeded weights. FL_EINVAL names a spec that cannot work
 * (an image too small for the network's downsampling, zero classes, ...). */
fl_status nn_model_create(fl_device *dev, const nn_model_spec *spec, nn_model **out);
void nn_model_destroy(nn_model *m);

size_t nn_model_param_count(const nn_model *m);
nn_param *nn_model_param(nn_model *m, size_t i);
/* The flat buffers: n elements each (the number of trainable weights). */
fl_tensor *nn_model_values(nn_model *m);
fl_tensor *nn_model_grads(nn_model *m);
/* Non-trainable state that a checkpoint must keep (batch-norm running mean and var),
 * also one flat buffer; 0 elements for models without batch norm. */
fl_tensor *nn_model_buffers(nn_model *m);

/* Forward of a batch x [n, channels, height, width]; *logits [n, classes] is owned by the
 * model and valid until the next forward. `train` selects batch statistics in batch norm. */
fl_status nn_model_forward(nn_model *m, const fl_tensor *x, bool train, const fl_tensor **logits);
/* Softmax cross-entropy of the last forward against labels (int32, device memory, n of
 * them): sets the gradient of the logits to (softmax - onehot) * grad_scale and adds the
 * loss sum and correct count to stats (device, 2 floats). */
fl_status nn_model_loss(nn_model *m, const int32_t *labels, float grad_scale, float *stats);

/* Called during backward when the gradients of parameters [first, first + count) are final
 * (they are queued on the device stream; the callee orders its own work after them). */
typedef fl_status (*nn_grads_ready_fn)(size_t first, size_t count, void *user);
/* Backward from the loss's logit gradient, ACCUMULATING parameter gradients. `ready` may be
 * NULL. */
fl_status nn_model_backward(nn_model *m, nn_grads_ready_fn ready, void *user);
fl_status nn_model_zero_grad(nn_model *m);

#endif /* FLINT_GPU_NN_H */
