/*
 * ps/table.c: a table's specification, its update functions' names and its partitioning over
 * shards (ps/ps.h).
 */
#include <math.h>
#include <string.h>

#include "ps/ps.h"

static const char *const update_names[] = {"add", "sgd", "adagrad", "adam"};
#define UPDATES (sizeof update_names / sizeof update_names[0])

void ps_update_put(uint8_t out[PS_UPDATE_BYTES], const ps_update *u) {
  common_put_u32(out, (uint32_t)u->kind);
  memcpy(out + 4, &u->lr, 4);
  memcpy(out + 8, &u->beta1, 4);
  memcpy(out + 12, &u->beta2, 4);
  memcpy(out + 16, &u->eps, 4);
}

uint32_t ps_update_get(const uint8_t in[PS_UPDATE_BYTES], ps_update *u) {
  uint32_t kind = common_get_u32(in);
  u->kind = (ps_update_kind)kind;
  memcpy(&u->lr, in + 4, 4);
  memcpy(&u->beta1, in + 8, 4);
  memcpy(&u->beta2, in + 12, 4);
  memcpy(&u->eps, in + 16, 4);
  return kind;
}

fl_status ps_update_parse(const char *text, ps_update_kind *out) {
  for (unsigned i = 0; text && i < UPDATES; i++)
    if (strcmp(text, update_names[i]) == 0) {
      *out = (ps_update_kind)i;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown update function '%s' (add, sgd, adagrad or adam)", text ? text : "(null)");
}

const char *ps_update_name(ps_update_kind kind) { return (unsigned)kind < UPDATES ? update_names[kind] : "?"; }

static bool positive(float x) { return x > 0 && isfinite(x); }

fl_status ps_table_spec_check(const ps_table_spec *spec) {
  if (!spec) return fl_set_error(FL_EINVAL, "parameter server table: NULL spec");
  if (spec->width < 1 || spec->width > 65536)
    return fl_set_error(FL_EINVAL, "parameter server table: width %u (1 to 65536 floats a key)", spec->width);
  if (!spec->sparse && spec->keys < 1) return fl_set_error(FL_EINVAL, "parameter server table: a dense table of 0 keys");
  if (spec->sparse && spec->keys) return fl_set_error(FL_EINVAL, "parameter server table: a sparse table has no key count");
  const ps_update *u = &spec->update;
  if ((unsigned)u->kind >= UPDATES) return fl_set_error(FL_EINVAL, "parameter server table: update function %d", (int)u->kind);
  if (u->kind != PS_UPDATE_ADD && !positive(u->lr))
    return fl_set_error(FL_EINVAL, "parameter server table: %s's rate %g must be a finite number > 0",
                        ps_update_name(u->kind), (double)u->lr);
  if ((u->kind == PS_UPDATE_ADAGRAD || u->kind == PS_UPDATE_ADAM) && !positive(u->eps))
    return fl_set_error(FL_EINVAL, "parameter server table: %s's eps %g must be > 0", ps_update_name(u->kind),
                        (double)u->eps);
  if (u->kind == PS_UPDATE_ADAM && !(u->beta1 >= 0 && u->beta1 < 1 && u->beta2 >= 0 && u->beta2 < 1))
    return fl_set_error(FL_EINVAL, "parameter server table: adam's betas %g and %g must be in [0, 1)",
                        (double)u->beta1, (double)u->beta2);
  return FL_OK;
}

uint64_t ps_range_lo(const ps_table_spec *spec, uint32_t shards, uint32_t shard) {
  uint64_t base = spec->keys / shards, extra = spec->keys % shards;
  return (uint64_t)shard * base + (shard < extra ? shard : extra);
}

uint32_t ps_shard_of(const ps_table_spec *spec, uint32_t shards, uint64_t key) {
  if (spec->sparse) return (uint32_t)(common_hash64(key) % shards);
  uint64_t base = spec->keys / shards, extra = spec->keys % shards;
  /* The first `extra` shards hold base + 1 keys each. */
  uint64_t long_keys = extra * (base + 1);
  if (key < long_keys) return (uint32_t)(key / (base + 1));
  return (uint32_t)(extra + (key - long_keys) / (base ? base : 1));
}
