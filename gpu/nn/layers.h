/*
 * gpu/nn/layers.h: the layers that models are built from, written once against the device
 * operations of gpu/device/device.h.
 *
 * A layer is a small vtable (forward, backward, destroy) over a common header. Every layer
 * owns its output and its input gradient, embedded tensors that grow with tensor_ensure only
 * when a batch needs more memory than an earlier one. Forward remembers its input (borrowed:
 * it must stay valid and unchanged until backward); backward reads the output gradient,
 * ACCUMULATES parameter gradients and overwrites the input gradient.
 *
 * Parameters are not allocated by the layers: each layer registers its parameters with the
 * parameter store of gpu/nn/nn.h while it is created, and the store puts them in one flat
 * value buffer and one flat gradient buffer. A layer's parameters are the contiguous range
 * [first_param, first_param + nparams) of the store.
 *
 * Threading: a store and its layers are used by one thread at a time.
 */
#ifndef FLINT_GPU_LAYERS_H
#define FLINT_GPU_LAYERS_H

#include "gpu/nn/nn.h"

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
/* The value and gradient of the layer's i-th parameter (i < l->nparams), after finish. */
float *layer_param_value(const layer *l, size_t i);
float *layer_param_grad(const layer *l, size_t i);

/* ---- for the layer kinds (gpu/nn/layers*.c) ---------------------------------------------- */

/* A zeroed layer of `size` bytes (its kind's struct, which starts with `struct layer`) named
 * `name` on store s; its parameters are those registered until layer_done. */
fl_status layer_new(layer_store *s, const layer_ops *ops, const char *name, size_t size,
                    layer **out);
void layer_done(layer *l);
/* FL_EINVAL naming the layer, x's shape and the shape it expected. */
fl_status layer_bad_input(const layer *l, const fl_tensor *x, const char *expected);
/* Shapes t like `like` on the layer's device (tensor_ensure). */
fl_status layer_ensure_like(layer *l, fl_tensor *t, const fl_tensor *like);
/* The output size of a window of k with stride and padding over `in`. */
int layer_out_size(int in, int k, int stride, int pad);

/* ---- the layers -------------------------------------------------------------------------- */

/* The layers. `name` prefixes their parameters ("fc1" -> "fc1.weight", "fc1.bias"). Images
 * are NCHW; shapes of the input are checked at forward. */
/* y = x W[out, in]^T + b over the last dimension: x [n, ..., in] -> y [n, ..., out]. */
fl_status layer_linear_create(layer_store *s, const char *name, int in, int out, bool bias, layer **out_l);
fl_status layer_relu_create(layer_store *s, layer **out_l);
/* k x k convolution, im2col + GEMM; bias only when asked (not before batch norm). */
fl_status layer_conv2d_create(layer_store *s, const char *name, int in_c, int out_c, int k,
                              int stride, int pad, bool bias, layer **out_l);
/* The same in `groups` groups (PyTorch's groups; in_c groups: depthwise): group g's out_c /
 * groups outputs see only its in_c / groups inputs; weight [out_c, in_c / groups, k, k]. */
fl_status layer_conv2d_grouped_create(layer_store *s, const char *name, int in_c, int out_c, int k, int stride,
                                      int pad, int groups, bool bias, layer **out_l);
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
/* GELU, tanh approximation (device_ops.gelu_*). */
fl_status layer_gelu_create(layer_store *s, layer **out_l);
/* Inverted dropout with probability p in [0, 1) in training, identity otherwise; the mask of
 * element j of sample i is keyed by (the store's seed, the store's step, `key`, i, j). */
fl_status layer_dropout_create(layer_store *s, float p, uint64_t key, layer **out_l);
/* Layer norm over the last dimension (gamma 1, beta 0). */
fl_status layer_layernorm_create(layer_store *s, const char *name, int cols, float eps, layer **out_l);
/* ids [n, ...] (floats holding whole numbers) -> [n, ..., dim]; weight [vocab, dim] N(0, 1). */
fl_status layer_embedding_create(layer_store *s, const char *name, int vocab, int dim, layer **out_l);
/* Multi-head self-attention over [n, tokens, hidden] (gpu/nn/layers_seq.c). */
fl_status layer_attention_create(layer_store *s, const char *name, int hidden, int heads, layer **out_l);
/* [n, tokens, h] -> [n, h]: the mean over tokens. */
fl_status layer_mean_tokens_create(layer_store *s, layer **out_l);
/* A residual block: y = main(x) + shortcut(x), each path a sequence of layers (the shortcut
 * the identity when empty). Create it, create its layers on the same store in parameter
 * order and append each to its path (the block owns them from then on, also on failure),
 * then close it, which makes the parameters of all of them the block's. */
fl_status layer_residual_create(layer_store *s, const char *name, layer **out_l);
fl_status layer_residual_append(layer *l, bool shortcut, layer *child);
void layer_residual_close(layer *l);

#endif /* FLINT_GPU_LAYERS_H */
