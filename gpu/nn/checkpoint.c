/*
 * gpu/nn/checkpoint.c: one byte blob holding a training run's state: the model's flat weights,
 * its batch-norm buffers, the optimizer's state (a velocity, or Adam's moments, and its step
 * count) and where training stands (epoch, step, schedule position). The data-parallel
 * trainer puts it in the barrier stage's checkpoint each epoch (fl_barrier_checkpoint_put)
 * and a retried attempt restores it; `flint train` can also write it to a file.
 *
 * Layout (little-endian, the host order on every platform flint supports):
 *   off  size
 *     0     8  magic "FLNTCKPT"
 *     8     4  version (2)
 *    12     4  header bytes (88)
 *    16     8  values: float count of the flat weights
 *    24     8  buffers: float count of the batch-norm buffers (0 for none)
 *    32     8  state: float count of the optimizer's state (0 for none)
 *    40     4  epoch (epochs completed)
 *    44     4  the optimizer's kind (optim_kind: 0 sgd, 1 adam, 2 adamw, 3 lars, 4 lamb)
 *    48     8  step (optimizer steps taken)
 *    56     8  position (f64, the schedule's position in epochs)
 *    64     8  lr (f64, the rate of the last step)
 *    72     8  the optimizer's own step count (Adam's bias correction)
 *    80     4  the loss scale (f32; 0: no loss scaler, --precision fp16 only)
 *    84     4  the loss scaler's finite steps in a row
 *    88        values, buffers, state as float32, back to back
 *   end-4   4  CRC-32 (zlib's) of every byte before it
 * Version 1 had a 72-byte header without the last two fields, 0 at offset 44, and SGD's
 * velocity as its state: decode reads it as SGD state (its step count is the run's step).
 *
 * Everything from a blob is untrusted: decode checks the magic, version, header size, the
 * counts against the blob's length (with overflow checks), the checksum and the shapes of
 * the model and optimizer before it writes a single byte.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/common.h"
#include "flint/train.h"
#include "gpu/nn/nn.h"

#define HEADER_BYTES 88u
#define V1_HEADER_BYTES 72u
#define TRAILER_BYTES 4u

typedef struct ckpt_header {
  uint32_t version, header_bytes;
  uint64_t values, buffers, state;
  uint32_t kind; /* optim_kind of the state */
  uint64_t optim_steps;
  checkpoint_state st;
} ckpt_header;

/* zlib's crc32 takes a uInt length: feed it in pieces. */
static uint32_t crc_of(const uint8_t *p, size_t len) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (len) {
    uInt piece = len > (1u << 30) ? (1u << 30) : (uInt)len;
    crc = crc32(crc, p, piece);
    p += piece;
    len -= piece;
  }
  return (uint32_t)crc;
}

static size_t numel_of(const fl_tensor *t) { return t ? t->numel : 0; }

fl_status checkpoint_encode(const fl_tensor *values, const fl_tensor *buffers, optim *opt,
                            const checkpoint_state *st, fl_buf *out) {
  if (!values || !st || !out) return fl_set_error(FL_EINVAL, "checkpoint_encode: NULL argument");
  size_t nv = values->numel, nb = numel_of(buffers);
  size_t nvel = opt ? optim_size(opt) * optim_state_slots(optim_get_options(opt)->kind) : 0;
  size_t total = HEADER_BYTES + (nv + nb + nvel) * sizeof(float) + TRAILER_BYTES;
  out->len = 0;
  fl_status s = fl_buf_reserve(out, total);
  if (s != FL_OK) return s;
  uint8_t *p = out->data;
  memcpy(p, CHECKPOINT_MAGIC, 8);
  common_put_u32(p + 8, CHECKPOINT_VERSION);
  common_put_u32(p + 12, HEADER_BYTES);
  common_put_u64(p + 16, nv);
  common_put_u64(p + 24, nb);
  common_put_u64(p + 32, nvel);
  common_put_u32(p + 40, st->epoch);
  common_put_u32(p + 44, opt ? (uint32_t)optim_get_options(opt)->kind : 0);
  common_put_u64(p + 48, st->step);
  memcpy(p + 56, &st->position, 8);
  memcpy(p + 64, &st->lr, 8);
  common_put_u64(p + 72, opt ? optim_steps(opt) : 0);
  memcpy(p + 80, &st->loss_scale, 4);
  common_put_u32(p + 84, st->loss_scale_good);
  size_t off = HEADER_BYTES;
  /* to_host copies bytes (memcpy / cudaMemcpy): the blob's offsets need no alignment. */
  if (nv) {
    s = values->dev->ops->to_host(values->dev, p + off, values->data, nv * sizeof(float));
    if (s != FL_OK) return s;
    off += nv * sizeof(float);
  }
  if (nb) {
    s = buffers->dev->ops->to_host(buffers->dev, p + off, buffers->data, nb * sizeof(float));
    if (s != FL_OK) return s;
    off += nb * sizeof(float);
  }
  if (nvel) {
    fl_device *dev = optim_device(opt);
    s = dev->ops->to_host(dev, p + off, optim_state(opt), nvel * sizeof(float));
    if (s != FL_OK) return s;
    off += nvel * sizeof(float);
  }
  common_put_u32(p + off, crc_of(p, off));
  out->len = off + TRAILER_BYTES;
  return FL_OK;
}

/* Checks everything about the blob itself (not the model): FL_EFORMAT / FL_ECORRUPT. */
static fl_status parse_header(fl_bytes blob, ckpt_header *h) {
  if (blob.len < 8 || memcmp(blob.data, CHECKPOINT_MAGIC, 8) != 0)
    return fl_set_error(FL_EFORMAT, "checkpoint: not a flint checkpoint (no \"%s\" magic at the start of "
                        "%zu bytes)", CHECKPOINT_MAGIC, blob.len);
  if (blob.len < V1_HEADER_BYTES + TRAILER_BYTES)
    return fl_set_error(FL_EFORMAT, "checkpoint: truncated: %zu bytes, shorter than its %u-byte header",
                        blob.len, V1_HEADER_BYTES + TRAILER_BYTES);
  const uint8_t *p = blob.data;
  h->version = common_get_u32(p + 8);
  h->header_bytes = common_get_u32(p + 12);
  if (h->version != CHECKPOINT_VERSION && h->version != 1)
    return fl_set_error(FL_EFORMAT, "checkpoint: version %u, this flint reads versions 1 and %u", h->version,
                        CHECKPOINT_VERSION);
  uint32_t want = h->version == 1 ? V1_HEADER_BYTES : HEADER_BYTES;
  if (h->header_bytes != want)
    return fl_set_error(FL_EFORMAT, "checkpoint: header of %u bytes, expected %u for version %u", h->header_bytes,
                        want, h->version);
  if (blob.len < want + TRAILER_BYTES)
    return fl_set_error(FL_EFORMAT, "checkpoint: truncated: %zu bytes, shorter than its %u-byte header",
                        blob.len, want + TRAILER_BYTES);
  h->values = common_get_u64(p + 16);
  h->buffers = common_get_u64(p + 24);
  h->state = common_get_u64(p + 32);
  h->st.epoch = common_get_u32(p + 40);
  h->kind = common_get_u32(p + 44); /* version 1: 0, SGD */
  h->st.step = common_get_u64(p + 48);
  memcpy(&h->st.position, p + 56, 8);
  memcpy(&h->st.lr, p + 64, 8);
  h->optim_steps = h->version == 1 ? h->st.step : common_get_u64(p + 72);
  if (h->version != 1) {
    memcpy(&h->st.loss_scale, p + 80, 4);
    h->st.loss_scale_good = common_get_u32(p + 84);
  }
  /* Each count is checked against the length before the sum, so nothing overflows. */
  uint64_t room = (blob.len - want - TRAILER_BYTES) / sizeof(float);
  if (h->values > room || h->buffers > room - h->values || h->state > room - h->values - h->buffers)
    return fl_set_error(FL_EFORMAT, "checkpoint: truncated: %zu bytes hold fewer than the %llu + %llu + %llu "
                        "floats its header announces", blob.len, (unsigned long long)h->values,
                        (unsigned long long)h->buffers, (unsigned long long)h->state);
  size_t expected = want + (size_t)(h->values + h->buffers + h->state) * sizeof(float) + TRAILER_BYTES;
  if (blob.len != expected)
    return fl_set_error(FL_EFORMAT, "checkpoint: %zu bytes, but its header makes it %zu (trailing bytes)",
                        blob.len, expected);
  uint32_t stored = common_get_u32(p + expected - TRAILER_BYTES), actual = crc_of(p, expected - TRAILER_BYTES);
  if (stored != actual)
    return fl_set_error(FL_ECORRUPT, "checkpoint: checksum mismatch (stored %08x, computed %08x): the blob is "
                        "corrupt", stored, actual);
  /* 0: no scaler; else what a loss scaler can hold, [2^-24, 2^24]. */
  if (h->st.loss_scale != 0 && !(h->st.loss_scale >= 0x1p-24f && h->st.loss_scale <= 0x1p24f))
    return fl_set_error(FL_EFORMAT, "checkpoint: a loss scale of %g (0, or 2^-24 to 2^24)", (double)h->st.loss_scale);
  if (h->state && h->kind > OPTIM_LAMB)
    return fl_set_error(FL_EFORMAT, "checkpoint: state of an unknown optimizer %u", h->kind);
  return FL_OK;
}

static fl_status check_size(const char *what, uint64_t in_blob, size_t here) {
  if (in_blob == here) return FL_OK;
  return fl_set_error(FL_EINVAL, "checkpoint: %s of %llu floats does not match this model's %zu (another "
                      "model or options?)", what, (unsigned long long)in_blob, here);
}

/* The optimizer's state in the blob against opt's: the same kind, then the same size. */
static fl_status check_state(const ckpt_header *h, optim *opt) {
  optim_kind kind = optim_get_options(opt)->kind;
  size_t want = optim_size(opt) * optim_state_slots(kind);
  if (!h->state && want)
    return fl_set_error(FL_EINVAL, "checkpoint: it holds weights only, no optimizer state (fl_model_save's, or "
                        "written without an optimizer): load it without one");
  if (h->state && h->kind != (uint32_t)kind)
    return fl_set_error(FL_EINVAL, "checkpoint: it holds %s's optimizer state%s, but this run's optimizer is %s",
                        optim_kind_name((optim_kind)h->kind), h->version == 1 ? " (a version 1 file)" : "",
                        optim_kind_name(kind));
  return check_size("optimizer state", h->state, want);
}

fl_status checkpoint_decode(fl_bytes blob, fl_tensor *values, fl_tensor *buffers, optim *opt,
                            checkpoint_state *st) {
  if (!values || !st || (!blob.data && blob.len)) return fl_set_error(FL_EINVAL, "checkpoint_decode: NULL argument");
  ckpt_header h = {0};
  fl_status s = parse_header(blob, &h);
  if (s != FL_OK) return s;
  if ((s = check_size("weights", h.values, values->numel)) != FL_OK ||
      (s = check_size("batch-norm buffers", h.buffers, numel_of(buffers))) != FL_OK)
    return s;
  /* Without an optimizer (evaluation only) the state is skipped. */
  if (opt && (s = check_state(&h, opt)) != FL_OK) return s;
  const uint8_t *p = blob.data + h.header_bytes;
  if (h.values) {
    s = values->dev->ops->from_host(values->dev, values->data, p, h.values * sizeof(float));
    if (s != FL_OK) return s;
  }
  p += h.values * sizeof(float);
  if (h.buffers) {
    s = buffers->dev->ops->from_host(buffers->dev, buffers->data, p, h.buffers * sizeof(float));
    if (s != FL_OK) return s;
  }
  p += h.buffers * sizeof(float);
  if (opt && h.state) {
    fl_device *dev = optim_device(opt);
    s = dev->ops->from_host(dev, optim_state(opt), p, h.state * sizeof(float));
    if (s != FL_OK) return s;
  }
  if (opt) optim_set_steps(opt, h.optim_steps);
  *st = h.st;
  return FL_OK;
}

fl_status checkpoint_save_file(const char *path, fl_bytes blob) {
  if (!path || !*path) return fl_set_error(FL_EINVAL, "checkpoint_save_file: no path");
  size_t n = strlen(path) + 32;
  char *tmp = common_malloc(n);
  if (!tmp) return fl_set_error(FL_ENOMEM, "checkpoint_save_file: out of memory");
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  fl_status s = FL_OK;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    s = fl_set_error(FL_EIO, "checkpoint: cannot create %s: %s", tmp, strerror(errno));
    goto cleanup;
  }
  bool ok = (blob.len == 0 || fwrite(blob.data, 1, blob.len, f) == blob.len) && fflush(f) == 0 &&
            fsync(fileno(f)) == 0;
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok || rename(tmp, path) != 0) {
    if (ok) err = errno;
    unlink(tmp);
    s = fl_set_error(FL_EIO, "checkpoint: cannot write %s: %s", path, strerror(err));
  }
cleanup:
  common_free(tmp);
  return s;
}

fl_status checkpoint_load_file(const char *path, fl_buf *out) {
  if (!path || !out) return fl_set_error(FL_EINVAL, "checkpoint_load_file: NULL argument");
  FILE *f = fopen(path, "rb");
  if (!f)
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "checkpoint: cannot open %s: %s", path,
                        strerror(errno));
  out->len = 0;
  fl_status s = FL_OK;
  for (;;) {
    if ((s = fl_buf_reserve(out, 1 << 20)) != FL_OK) break;
    size_t got = fread(out->data + out->len, 1, out->cap - out->len, f);
    out->len += got;
    if (got == 0) {
      if (ferror(f)) s = fl_set_error(FL_EIO, "checkpoint: cannot read %s: %s", path, strerror(errno));
      break;
    }
    if (out->len > ((size_t)4 << 30)) {
      s = fl_set_error(FL_ELIMIT, "checkpoint: %s is larger than 4 GiB", path);
      break;
    }
  }
  fclose(f);
  return s;
}

/* ---- fl_model_save and fl_model_load (include/flint/train.h): weights on disk ------------------------------------------------------------------- */

/* The public calls' one body each: `who` names the call in messages. */
static fl_status save_as(const char *who, fl_model *m, fl_optimizer *opt, uint32_t epoch, uint64_t step,
                         const char *path) {
  common_error_clear();
  if (!m || !path) return fl_set_error(FL_EINVAL, "%s: NULL argument", who);
  if (!fl_model_weights(m)) return fl_set_error(FL_ESTATE, "%s: the model is not finished", who);
  if (opt && optim_public_model(opt) != m) return fl_set_error(FL_EINVAL, "%s: the optimizer steps another model", who);
  fl_buf blob = FL_BUF_INIT;
  checkpoint_state st = {.epoch = epoch, .step = step, .position = epoch};
  fl_status status = checkpoint_encode(fl_model_weights(m), nn_model_buffers(m), optim_of_public(opt), &st, &blob);
  if (status == FL_OK) status = checkpoint_save_file(path, fl_buf_bytes(&blob));
  fl_buf_free(&blob);
  return status;
}

static fl_status load_as(const char *who, fl_model *m, fl_optimizer *opt, const char *path, checkpoint_state *st) {
  common_error_clear();
  if (!m || !path) return fl_set_error(FL_EINVAL, "%s: NULL argument", who);
  if (!fl_model_weights(m)) return fl_set_error(FL_ESTATE, "%s: the model is not finished", who);
  if (opt && optim_public_model(opt) != m) return fl_set_error(FL_EINVAL, "%s: the optimizer steps another model", who);
  fl_buf blob = FL_BUF_INIT;
  fl_status status = checkpoint_load_file(path, &blob);
  if (status == FL_OK)
    status = checkpoint_decode(fl_buf_bytes(&blob), fl_model_weights(m), nn_model_buffers(m), optim_of_public(opt), st);
  fl_buf_free(&blob);
  if (status != FL_OK && status != FL_ENOENT && status != FL_EIO) {
    char why[512];
    snprintf(why, sizeof why, "%s", fl_last_error());
    return fl_set_error(status, "%s %s: %s", who, path, why);
  }
  return status;
}

fl_status fl_model_save(fl_model *m, const char *path) { return save_as("fl_model_save", m, NULL, 0, 0, path); }

fl_status fl_model_load(fl_model *m, const char *path) {
  checkpoint_state st;
  return load_as("fl_model_load", m, NULL, path, &st);
}

/* ---- fl_checkpoint_save and fl_checkpoint_load: weights, optimizer state and position ---- */

fl_status fl_checkpoint_save(fl_model *m, fl_optimizer *opt, uint32_t epoch, uint64_t step, const char *path) {
  return save_as("fl_checkpoint_save", m, opt, epoch, step, path);
}

fl_status fl_checkpoint_load(fl_model *m, fl_optimizer *opt, const char *path, uint32_t *epoch, uint64_t *step) {
  checkpoint_state st;
  fl_status status = load_as("fl_checkpoint_load", m, opt, path, &st);
  if (status == FL_OK) {
    fl_model_set_step(m, st.step);
    if (epoch) *epoch = st.epoch;
    if (step) *step = st.step;
  }
  return status;
}
