/*
 * gpu/parallel/compress.c: --compress's specs, and the rank's compressor, which stages a
 * bucket in host memory, finds the bucket's state and runs the hook on it (the contract is in
 * gpu/parallel/compress.h; the hooks are compress_half.c, compress_topk.c,
 * compress_powersgd.c and compress_onebit.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "gpu/device/device.h"
#include "gpu/parallel/compress.h"

#define POWERSGD_MAX_RANK 1024

/* ---- specs ---------------------------------------------------------------------------------- */

static fl_status spec_error(const char *text, const char *why) {
  return fl_set_error(FL_EINVAL, "--compress '%s': %s (expected none, fp16, bf16, topk:RATIO with RATIO in (0, 1], "
                      "powersgd:R with R 1 to %d, or onebit)", text, why, POWERSGD_MAX_RANK);
}

fl_status compress_spec_parse(const char *text, compress_spec *out) {
  *out = (compress_spec){.kind = COMPRESS_NONE, .ratio = 0.01, .rank = 1, .min_rate = 1};
  if (!text || strcmp(text, "none") == 0) return FL_OK;
  if (strcmp(text, "fp16") == 0 || strcmp(text, "bf16") == 0) {
    out->kind = text[0] == 'f' ? COMPRESS_FP16 : COMPRESS_BF16;
    return FL_OK;
  }
  if (strcmp(text, "onebit") == 0) {
    out->kind = COMPRESS_ONEBIT;
    return FL_OK;
  }
  const char *colon = strchr(text, ':');
  size_t name = colon ? (size_t)(colon - text) : strlen(text);
  const char *arg = colon ? colon + 1 : NULL;
  if (name == 4 && strncmp(text, "topk", 4) == 0) {
    out->kind = COMPRESS_TOPK;
    if (!arg) return FL_OK;
    char *end = NULL;
    errno = 0;
    double r = *arg ? strtod(arg, &end) : NAN;
    if (!end || *end || errno) return spec_error(text, "the ratio is not a number");
    if (!(r > 0 && r <= 1)) return spec_error(text, "the ratio is outside (0, 1]");
    out->ratio = r;
    return FL_OK;
  }
  if (name == 8 && strncmp(text, "powersgd", 8) == 0) {
    out->kind = COMPRESS_POWERSGD;
    if (!arg) return FL_OK;
    char *end = NULL;
    errno = 0;
    long r = strtol(arg, &end, 10);
    if (end == arg || *end || errno) return spec_error(text, "the rank is not a whole number");
    if (r < 1) return spec_error(text, "the rank is less than 1");
    if (r > POWERSGD_MAX_RANK) return spec_error(text, "the rank is too large");
    out->rank = (uint32_t)r;
    return FL_OK;
  }
  if ((name == 4 && (strncmp(text, "fp16", 4) == 0 || strncmp(text, "bf16", 4) == 0)) ||
      (name == 6 && strncmp(text, "onebit", 6) == 0) || (name == 4 && strncmp(text, "none", 4) == 0))
    return spec_error(text, "this method takes no argument");
  return spec_error(text, "unknown method");
}

void compress_spec_format(const compress_spec *s, char *out, size_t cap) {
  switch (s->kind) {
  case COMPRESS_FP16: snprintf(out, cap, "fp16"); break;
  case COMPRESS_BF16: snprintf(out, cap, "bf16"); break;
  case COMPRESS_TOPK: snprintf(out, cap, "topk:%g", s->ratio); break;
  case COMPRESS_POWERSGD: snprintf(out, cap, "powersgd:%u", s->rank); break;
  case COMPRESS_ONEBIT: snprintf(out, cap, "onebit"); break;
  default: snprintf(out, cap, "none"); break;
  }
}

/* ---- collectives on host memory -------------------------------------------------------------- */

static fl_tensor host_tensor(compress_io *io, float *data, size_t n) {
  return (fl_tensor){.dev = io->cpu, .ndim = 1, .shape = {(int64_t)n}, .numel = n, .data = data, .owns = false};
}

fl_status compress_allreduce(compress_io *io, float *data, size_t n, fl_reduce_op op) {
  if (n == 0) return FL_OK;
  fl_tensor t = host_tensor(io, data, n);
  io->sent += n * sizeof(float);
  return fl_comm_allreduce(io->comm, &t, op);
}

fl_status compress_allgather(compress_io *io, const float *in, size_t n, float *out) {
  fl_tensor a = host_tensor(io, (float *)in, n);
  fl_tensor b = host_tensor(io, out, n * (size_t)fl_comm_size(io->comm));
  io->sent += n * sizeof(float);
  return fl_comm_allgather(io->comm, &a, &b);
}

/* ---- the compressor ---------------------------------------------------------------------------- */

typedef struct bucket_state {
  size_t offset, n;
  size_t first, nparams; /* its parameters: params[first, first + nparams) */
  void *state;
} bucket_state;

struct compressor {
  compress_spec spec;
  const compress_hook *hook;
  compress_param *params;
  size_t nparams, total;
  int world;
  fl_device *cpu;
  bucket_state *buckets;
  size_t nbuckets, cap_buckets;
  float *stage; /* host copy of a bucket of a device model */
  size_t stage_cap;
  uint64_t sent;
};

static const compress_hook *hook_of(compress_kind kind) {
  switch (kind) {
  case COMPRESS_FP16:
  case COMPRESS_BF16: return &compress_hook_half;
  case COMPRESS_TOPK: return &compress_hook_topk;
  case COMPRESS_POWERSGD: return &compress_hook_powersgd;
  case COMPRESS_ONEBIT: return &compress_hook_onebit;
  default: return NULL;
  }
}

static int param_cmp(const void *a, const void *b) {
  size_t x = ((const compress_param *)a)->offset, y = ((const compress_param *)b)->offset;
  return x < y ? -1 : x > y;
}

fl_status compressor_create(const compress_spec *spec, const compress_param *params, size_t nparams, size_t total,
                            int world, compressor **out) {
  const compress_hook *hook = hook_of(spec->kind);
  if (!hook) return fl_set_error(FL_EINVAL, "compressor_create: no hook for compression kind %d", (int)spec->kind);
  compressor *c = common_calloc(1, sizeof *c);
  if (!c) return FL_ERR(FL_ENOMEM, "out of memory for a gradient compressor");
  fl_status status = FL_OK;
  c->spec = *spec;
  c->hook = hook;
  c->total = total;
  c->world = world;
  c->nparams = nparams;
  c->params = common_malloc((nparams ? nparams : 1) * sizeof *params);
  if (!c->params) {
    status = FL_ERR(FL_ENOMEM, "out of memory for a gradient compressor");
    goto cleanup;
  }
  if (nparams) memcpy(c->params, params, nparams * sizeof *params);
  qsort(c->params, nparams, sizeof *c->params, param_cmp);
  FL_CHECK(fl_device_open(FL_DEVICE_CPU, 0, &c->cpu));
  *out = c;
  return FL_OK;
cleanup:
  compressor_destroy(c);
  return status;
}

void compressor_destroy(compressor *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nbuckets; i++) c->hook->destroy(c->buckets[i].state);
  common_free(c->buckets);
  common_free(c->stage);
  common_free(c->params);
  fl_device_close(c->cpu);
  common_free(c);
}

/* The first parameter whose offset is >= offset. */
static size_t param_at(const compressor *c, size_t offset) {
  size_t lo = 0, hi = c->nparams;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->params[mid].offset < offset) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static bucket_state *find_bucket(compressor *c, size_t offset) {
  for (size_t i = 0; i < c->nbuckets; i++)
    if (c->buckets[i].offset == offset) return &c->buckets[i];
  return NULL;
}

/* The bucket [offset, offset + n)'s state, made on its first run. */
static fl_status bucket_of(compressor *c, size_t offset, size_t n, compress_bucket *b, bucket_state **out) {
  bucket_state *bs = find_bucket(c, offset);
  if (bs && bs->n == n) {
    b->params = c->params + bs->first;
    b->nparams = bs->nparams;
    *out = bs;
    return FL_OK;
  }
  if (bs)
    return fl_set_error(FL_EINVAL, "gradient compression: the bucket at element %zu holds %zu elements, not %zu as "
                        "before (buckets must be the same every step)", offset, n, bs->n);
  size_t first = param_at(c, offset), last = param_at(c, offset + n);
  const compress_param *end = last > first ? &c->params[last - 1] : NULL;
  if (first == c->nparams || c->params[first].offset != offset || !end ||
      end->offset + end->rows * end->cols != offset + n)
    return fl_set_error(FL_EINVAL, "gradient compression: elements [%zu, %zu) are not whole parameters", offset,
                        offset + n);
  if (c->nbuckets == c->cap_buckets) {
    size_t cap = c->cap_buckets ? 2 * c->cap_buckets : 16;
    bucket_state *nb = common_realloc(c->buckets, cap * sizeof *nb);
    if (!nb) return FL_ERR(FL_ENOMEM, "out of memory for a gradient bucket's state");
    c->buckets = nb;
    c->cap_buckets = cap;
  }
  b->params = c->params + first;
  b->nparams = last - first;
  bucket_state fresh = {.offset = offset, .n = n, .first = first, .nparams = last - first};
  fl_status s = c->hook->create(&c->spec, b, c->world, &fresh.state);
  if (s != FL_OK) return s;
  c->buckets[c->nbuckets] = fresh;
  *out = &c->buckets[c->nbuckets++];
  return FL_OK;
}

fl_status compressor_run(compressor *c, fl_comm *comm, const fl_tensor *grads, fl_tensor *bucket) {
  size_t n = bucket->numel;
  if (n == 0) return FL_OK;
  if (bucket->dev != grads->dev || bucket->data < grads->data || bucket->data + n > grads->data + grads->numel)
    return fl_set_error(FL_EINVAL, "gradient compression: the bucket is not inside the gradient buffer");
  size_t offset = (size_t)(bucket->data - grads->data);
  compress_bucket b = {.n = n, .offset = offset};
  bucket_state *bs = NULL;
  fl_status s = bucket_of(c, offset, n, &b, &bs);
  if (s != FL_OK) return s;
  bool staged = fl_device_kind_of(bucket->dev) != FL_DEVICE_CPU;
  if (staged) {
    if (c->stage_cap < n) {
      float *p = common_realloc(c->stage, n * sizeof(float));
      if (!p) return FL_ERR(FL_ENOMEM, "out of memory for a gradient bucket's host copy (%zu floats)", n);
      c->stage = p;
      c->stage_cap = n;
    }
    s = bucket->dev->ops->to_host(bucket->dev, c->stage, bucket->data, n * sizeof(float));
    if (s != FL_OK) return s;
  }
  b.data = staged ? c->stage : bucket->data;
  compress_io io = {.comm = comm, .cpu = c->cpu};
  s = c->hook->run(bs->state, &io, &b);
  c->sent += io.sent;
  if (s == FL_OK && staged) s = bucket->dev->ops->from_host(bucket->dev, bucket->data, c->stage, n * sizeof(float));
  return s;
}

uint64_t compressor_sent(const compressor *c) { return c ? c->sent : 0; }

const float *compressor_residual(const compressor *c, size_t offset) {
  bucket_state *bs = find_bucket((compressor *)c, offset);
  return bs && c->hook->residual ? c->hook->residual(bs->state) : NULL;
}
