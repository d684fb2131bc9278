/*
 * gpu/nn/layers_block.c: the residual block of gpu/nn/layers.h, a layer made of layers: a main
 * path and a shortcut (the identity when it has no layers), whose outputs are added.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "gpu/nn/layers.h"

typedef struct path {
  layer **layers;
  size_t n, cap;
} path;

typedef struct residual_layer {
  layer base;
  path main, shortcut;
  bool closed;
} residual_layer;

/* Runs a path's forward from x; *y is x itself for an empty path. */
static fl_status path_forward(const path *p, const fl_tensor *x, bool train, const fl_tensor **y) {
  const fl_tensor *t = x;
  for (size_t i = 0; i < p->n; i++) {
    fl_status st = layer_forward(p->layers[i], t, train, &t);
    if (st != FL_OK) return st;
  }
  *y = t;
  return FL_OK;
}

/* Backward through a path from dy; *dx is dy itself for an empty path (NULL when !need_dx). */
static fl_status path_backward(const path *p, const fl_tensor *dy, bool need_dx, const fl_tensor **dx) {
  const fl_tensor *t = dy;
  for (size_t i = p->n; i-- > 0;) {
    fl_status st = layer_backward(p->layers[i], t, i > 0 || need_dx, &t);
    if (st != FL_OK) return st;
  }
  *dx = need_dx ? t : NULL;
  return FL_OK;
}

static fl_status residual_forward(layer *l, const fl_tensor *x, bool train) {
  residual_layer *R = (residual_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *main_y = NULL, *short_y = NULL;
  fl_status status = FL_OK;
  FL_CHECK(path_forward(&R->main, x, train, &main_y));
  FL_CHECK(path_forward(&R->shortcut, x, train, &short_y));
  if (short_y->numel != main_y->numel) {
    char want[96];
    snprintf(want, sizeof want, "an input whose two paths give as many elements (%zu and %zu)", main_y->numel,
             short_y->numel);
    FL_CHECK(layer_bad_input(l, x, want));
  }
  FL_CHECK(layer_ensure_like(l, &l->y, main_y));
  FL_CHECK(dev->ops->copy(dev, l->y.data, main_y->data, main_y->numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, main_y->numel, 1.0f, short_y->data, l->y.data));
cleanup:
  return status;
}

static fl_status residual_backward(layer *l, const fl_tensor *dy, bool need_dx) {
  residual_layer *R = (residual_layer *)l;
  fl_device *dev = l->store->dev;
  const fl_tensor *dx_main = NULL, *dx_short = NULL;
  fl_status status = FL_OK;
  FL_CHECK(path_backward(&R->main, dy, need_dx, &dx_main));
  FL_CHECK(path_backward(&R->shortcut, dy, need_dx, &dx_short));
  if (!need_dx) goto cleanup;
  FL_CHECK(layer_ensure_like(l, &l->dx, l->x));
  FL_CHECK(dev->ops->copy(dev, l->dx.data, dx_main->data, l->dx.numel * sizeof(float)));
  FL_CHECK(dev->ops->axpy(dev, l->dx.numel, 1.0f, dx_short->data, l->dx.data));
cleanup:
  return status;
}

static void path_destroy(path *p) {
  for (size_t i = 0; i < p->n; i++) layer_destroy(p->layers[i]);
  common_free(p->layers);
}

static void residual_destroy(layer *l) {
  residual_layer *R = (residual_layer *)l;
  path_destroy(&R->main);
  path_destroy(&R->shortcut);
}

static const layer_ops residual_ops = {"residual", residual_forward, residual_backward, residual_destroy};

fl_status layer_residual_create(layer_store *s, const char *name, layer **out_l) {
  return layer_new(s, &residual_ops, name, sizeof(residual_layer), out_l);
}

fl_status layer_residual_append(layer *l, bool shortcut, layer *child) {
  FL_ASSERT(l->ops == &residual_ops);
  residual_layer *R = (residual_layer *)l;
  FL_ASSERT(!R->closed);
  path *p = shortcut ? &R->shortcut : &R->main;
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 8;
    layer **grown = common_realloc(p->layers, cap * sizeof *grown);
    if (!grown) {
      layer_destroy(child);
      return FL_ERR(FL_ENOMEM, "residual block %s: out of memory", l->name);
    }
    p->layers = grown;
    p->cap = cap;
  }
  p->layers[p->n++] = child;
  return FL_OK;
}

void layer_residual_close(layer *l) {
  FL_ASSERT(l->ops == &residual_ops);
  ((residual_layer *)l)->closed = true;
  layer_done(l);
}
