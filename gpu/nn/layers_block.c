/*
 * gpu/nn/layers_block.c: the ResNet basic block of gpu/nn/layers.h, a layer made of layers
 * (two convolutions with batch norm, and the shortcut).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

/* ---- ResNet basic block ---------------------------------------------------------------- */

typedef struct block_layer {
  layer base;
  layer *conv1, *bn1, *relu1, *conv2, *bn2;
  layer *down_conv, *down_bn; /* NULL for an identity shortcut */
  fl_tensor g;                /* gradient at the sum, before the final relu */
} block_layer;

static fl_status block_forward(layer *l, const fl_tensor *x, bool train) {
  block_layer *K = (block_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *t = NULL, *shortcut = x; /* = NULL: gcc 13 cannot see through FL_CHECK */
  fl_status status = FL_OK;
  FL_CHECK(layer_forward(K->conv1, x, train, &t));
  FL_CHECK(layer_forward(K->bn1, t, train, &t));
  FL_CHECK(layer_forward(K->relu1, t, train, &t));
  FL_CHECK(layer_forward(K->conv2, t, train, &t));
  FL_CHECK(layer_forward(K->bn2, t, train, &t));
  if (K->down_conv) {
    const fl_tensor *d;
    FL_CHECK(layer_forward(K->down_conv, x, train, &d));
    FL_CHECK(layer_forward(K->down_bn, d, train, &shortcut));
  }
  if (shortcut->numel != t->numel) {
    char want[64];
    snprintf(want, sizeof want, "as many elements as the block's output (%zu)", t->numel);
    FL_CHECK(layer_bad_input(l, x, want));
  }
  FL_CHECK(layer_ensure_like(l, &l->y, t));
  FL_CHECK(dev->ops->copy(dev, l->y.data, t->data, t->numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, t->numel, 1.0f, shortcut->data, l->y.data));
  FL_CHECK(dev->ops->relu_forward(dev, l->y.numel, l->y.data, l->y.data));
cleanup:
  return status;
}

static fl_status block_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  block_layer *K = (block_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *t, *dx_main = NULL, *dx_short = &K->g;
  fl_status status = FL_OK;
  FL_CHECK(layer_ensure_like(l, &K->g, &l->y));
  FL_CHECK(dev->ops->relu_backward(dev, dy->numel, l->y.data, dy->data, K->g.data));
  FL_CHECK(layer_backward(K->bn2, &K->g, true, &t));
  FL_CHECK(layer_backward(K->conv2, t, true, &t));
  FL_CHECK(layer_backward(K->relu1, t, true, &t));
  FL_CHECK(layer_backward(K->bn1, t, true, &t));
  FL_CHECK(layer_backward(K->conv1, t, need_dx, &dx_main));
  if (K->down_conv) {
    FL_CHECK(layer_backward(K->down_bn, &K->g, true, &t));
    FL_CHECK(layer_backward(K->down_conv, t, need_dx, &dx_short));
  }
  if (!need_dx) goto cleanup;
  FL_CHECK(layer_ensure_like(l, &l->dx, l->x));
  FL_CHECK(dev->ops->copy(dev, l->dx.data, dx_main->data, l->dx.numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, l->dx.numel, 1.0f, dx_short->data, l->dx.data));
cleanup:
  return status;
}

static void block_destroy(layer *l) {
  block_layer *K = (block_layer *)l;
  layer_destroy(K->conv1);
  layer_destroy(K->bn1);
  layer_destroy(K->relu1);
  layer_destroy(K->conv2);
  layer_destroy(K->bn2);
  layer_destroy(K->down_conv);
  layer_destroy(K->down_bn);
  tensor_release(&K->g);
}

static const layer_ops block_ops = {"basic_block", block_forward, block_backward, block_destroy};

fl_status layer_basic_block_create(layer_store *s, const char *name, int in_c, int out_c,
                                   int stride, layer **out_l) {
  if (in_c < 1 || out_c < 1 || stride < 1)
    return fl_set_error(FL_EINVAL, "basic block %s: bad geometry (in %d, out %d, stride %d)",
                        name, in_c, out_c, stride);
  layer *l = NULL;
  fl_status status = layer_new(s, &block_ops, name, sizeof(block_layer), &l);
  if (status != FL_OK) return status;
  block_layer *K = (block_layer *)l;
  char sub[96];
#define SUB(suffix) (snprintf(sub, sizeof sub, "%s.%s", name, suffix), sub)
  FL_CHECK(layer_conv2d_create(s, SUB("conv1"), in_c, out_c, 3, stride, 1, false, &K->conv1));
  FL_CHECK(layer_batchnorm_create(s, SUB("bn1"), out_c, &K->bn1));
  FL_CHECK(layer_relu_create(s, &K->relu1));
  FL_CHECK(layer_conv2d_create(s, SUB("conv2"), out_c, out_c, 3, 1, 1, false, &K->conv2));
  FL_CHECK(layer_batchnorm_create(s, SUB("bn2"), out_c, &K->bn2));
  if (stride != 1 || in_c != out_c) {
    FL_CHECK(layer_conv2d_create(s, SUB("downsample.0"), in_c, out_c, 1, stride, 0, false,
                                 &K->down_conv));
    FL_CHECK(layer_batchnorm_create(s, SUB("downsample.1"), out_c, &K->down_bn));
  }
#undef SUB
  layer_done(l);
  *out_l = l;
  return FL_OK;
cleanup:
  layer_destroy(l);
  return status;
}
