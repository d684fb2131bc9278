/*
 * gpu/nn/layers.h: the layers that models are built from, written once against the device
 * operations of gpu/device.h.
 *
 * A layer is a small vtable (forward, backward, destroy) over a common header. Every layer
 * owns its output and its input gradient, embedded tensors that grow with tensor_ensure only
 * when a batch needs more memory than an earlier one. Forward remembers its input (borrowed:
 * it must stay valid and unchanged until backward); backward reads the output gradient,
 * ACCUMULATES parameter gradients and overwrites the input gradient.
 *
 * Parameters are not allocated by the layers: each layer registers its parameters (shape and
 * initialisation) with a layer_store while it is created, and the store then puts all of
 * them in one flat value buffer and one flat gradient buffer (layer_store_finish), as
 * gpu/nn/nn.h promises. A layer's parameters are the contiguous range
 * [first_param, first_param + nparams) of the store. Non-trainable state (batch-norm running
 * statistics) goes to a third flat buffer the same way.
 *
 * Threading: a store and its layers are used by one thread at a time.
 */
#ifndef FLINT_GPU_LAYERS_H
#define FLINT_GPU_LAYERS_H

#include "gpu/nn/nn.h"

typedef enum layer_init {
  LAYER_INIT_HE = 0, /* normal, std sqrt(2 / fan_in) (Kaiming, for layers before a relu) */
  LAYER_INIT_ZERO,   /* biases, batch-norm beta */
  LAYER_INIT_ONE,    /* batch-norm gamma */
} layer_init;

typedef struct layer_param_info {
  layer_init init;
  int fan_in;
} layer_param_info;

typedef struct layer_buffer_info {
  size_t offset, count;
  float value; /* initial value */
} layer_buffer_info;

typedef struct layer_store {
  fl_device *dev;
  nn_param *params; /* names owned by the store; value/grad are views after finish */
  layer_param_info *info;
  size_t nparams, cap_params;
  size_t nvalues;   /* elements of all parameters */
  layer_buffer_info *buffer_info;
  size_t nbuffer_ranges, cap_buffers;
  size_t nbuffers; /* elements of all buffers */
  bool finished;
  fl_tensor values, grads, buffers;
  /* Scratch shared by the convolutions (im2col columns and the pre-transpose output): one
   * convolution runs at a time, so one pair serves them all. */
  fl_tensor work[2];
} layer_store;

/* An empty store on dev; layer_store_release frees what it holds. */
void layer_store_init(layer_store *s, fl_device *dev);
void layer_store_release(layer_store *s);
/* Registers a parameter named "<prefix>.<suffix>" (or suffix alone when prefix is empty) and
 * returns its index. Only before finish. */
fl_status layer_store_add_param(layer_store *s, const char *prefix, const char *suffix,
                                int ndim, const int64_t *shape, layer_init init, int fan_in,
                                size_t *index);
/* Registers `count` non-trainable elements starting at `value`; returns their offset into
 * the buffers tensor. Only before finish. */
fl_status layer_store_add_buffer(layer_store *s, size_t count, float value, size_t *offset);
/* Allocates the flat buffers, points every parameter's value and grad at its range, fills
 * the values from a generator seeded with `seed` (deterministic: the same seed gives the
 * same weights on every rank and device), zeroes the gradients and fills the buffers. */
fl_status layer_store_finish(layer_store *s, uint64_t seed);

typedef struct layer layer;

typedef struct layer_ops {
  const char *name;
  /* Sets l->y from x. */
  fl_status (*forward)(layer *l, const fl_tensor *x, bool train);
  /* From dy (shaped as l->y): parameter gradients accumulated, and l->dx overwritten when
   * need_dx (the first layer of a model skips it). */
  fl_status (*backward)(layer *l, const fl_tensor *dy, bool need_dx);
  /* Frees what the layer holds beyond the common header (sublayers, scratch). */
  void (*destroy)(layer *l);
} layer_ops;

struct layer {
  const layer_ops *ops;
  layer_store *store;
  char name[64]; /* for messages: "conv1", "layer2.0", "relu" */
  size_t first_param, nparams;
  const fl_tensor *x; /* the last forward's input, borrowed */
  fl_tensor y, dx;
};

/* Runs forward and returns the layer's output (owned by the layer, valid until its next
 * forward). FL_EINVAL names a layer given an input of the wrong shape. */
fl_status layer_forward(layer *l, const fl_tensor *x, bool train, const fl_tensor **y);
/* Runs backward after a forward; *dx (when dx is not NULL and need_dx) is owned by the
 * layer. FL_ESTATE without a forward, or when dy is not shaped as the output. */
fl_status layer_backward(layer *l, const fl_tensor *dy, bool need_dx, const fl_tensor **dx);
void layer_destroy(layer *l);
/* "[2, 3, 4]": t's shape for messages, cut to fit len. */
void layer_shape_text(const fl_tensor *t, char *buf, size_t len);
/* The value and gradient of the layer's i-th parameter (i < l->nparams), after finish. */
float *layer_param_value(const layer *l, size_t i);
float *layer_param_grad(const layer *l, size_t i);

/* The layers. `name` prefixes their parameters ("fc1" -> "fc1.weight", "fc1.bias"). Images
 * are NCHW; shapes of the input are checked at forward. */
/* y[n, out] = x[n, in] W[out, in]^T + b; x may have any shape [n, ...] with in elements a row. */
fl_status layer_linear_create(layer_store *s, const char *name, int in, int out, layer **out_l);
fl_status layer_relu_create(layer_store *s, layer **out_l);
/* k x k convolution, im2col + GEMM; bias only when asked (not before batch norm). */
fl_status layer_conv2d_create(layer_store *s, const char *name, int in_c, int out_c, int k,
                              int stride, int pad, bool bias, layer **out_l);
fl_status layer_maxpool_create(layer_store *s, int k, int stride, int pad, layer **out_l);
/* Average pooling counts padding as zeros (count_include_pad). */
fl_status layer_avgpool_create(layer_store *s, int k, int stride, int pad, layer **out_l);
/* [n, c, h, w] -> [n, c]: the mean of each plane (any h and w). */
fl_status layer_global_avgpool_create(layer_store *s, layer **out_l);
/* Batch norm over channels (dimension 1) of [n, c, ...]: batch statistics of this rank in
 * training, running statistics (momentum 0.1, eps 1e-5) otherwise. */
fl_status layer_batchnorm_create(layer_store *s, const char *name, int c, layer **out_l);
/* [n, ...] -> [n, rest]; output and input gradient are views (no copy). */
fl_status layer_flatten_create(layer_store *s, layer **out_l);
/* ResNet basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is
 * the identity, or a 1x1 convolution with `stride` and batch norm when stride != 1 or the
 * channels change. Parameters as PyTorch names them (conv1, bn1, conv2, bn2, downsample.0,
 * downsample.1). */
fl_status layer_basic_block_create(layer_store *s, const char *name, int in_c, int out_c,
                                   int stride, layer **out_l);

#endif /* FLINT_GPU_LAYERS_H */
