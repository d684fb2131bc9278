/*
 * gpu/parallel/keyed.h: the keyed draw of initial weights shared by the model-parallel models
 * (transformer.c, moe.c, hybrid_cnn.c): element g of parameter `name` depends only on the
 * seed, the name and g, so a shard drawn on any rank holds its slice of the unsplit tensor.
 * The counters go through splitmix64 (dropout_mix of gpu/device/device.h), the name through FNV-1a.
 */
#ifndef FLINT_GPU_KEYED_H
#define FLINT_GPU_KEYED_H

#include <stdint.h>

/* FNV-1a of the name: a parameter's key is seed ^ keyed_name_hash(name). */
uint64_t keyed_name_hash(const char *name);
/* Uniform in (0, 1), never 0 (log() of it stays finite). */
double keyed_uniform(uint64_t key, uint64_t counter);
/* N(0, 1) for element g, from the uniforms 2g and 2g + 1 through Box-Muller. */
double keyed_normal(uint64_t key, uint64_t g);
/* Uniform in [-1, 1) for element g. */
double keyed_symmetric(uint64_t key, uint64_t g);

#endif /* FLINT_GPU_KEYED_H */
