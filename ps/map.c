/*
 * ps/map.c: a table's map as bytes (ps/ps.h), the handle that tasks open their workers
 * with, and which replica forwards to which. Little-endian:
 *    0 8  magic "FLNTPSMP"   8 u32 version (2)   12 u32 table   16 u32 shards   20 u32 workers
 *   24 u32 replication (ps_replication)   28 u32 zero
 *   32    the table's spec, shards, index 0 and workers as HOST carries them (ps/wire.c), with
 *         no targets: 52 bytes
 *   84    per shard: the primary's and PS_MAX_BACKUPS backups' addresses, PS_ADDRESS_MAX bytes
 *         each, zero-padded ("" for none)
 *   end   u32 CRC-32C of every byte before it
 */
#include <string.h>

#include "ps/wire.h"

#define MAGIC "FLNTPSMP"
#define VERSION 2u
#define HEAD 32u
#define FIXED 84u
#define PLACE_BYTES ((size_t)(1 + PS_MAX_BACKUPS) * PS_ADDRESS_MAX)

void ps_place_targets(const ps_place *p, ps_replication mode, uint32_t member, char (*out)[PS_ADDRESS_MAX],
                      uint32_t *n) {
  uint32_t backups = ps_place_backups(p);
  *n = 0;
  if (mode == PS_REPLICATION_CHAIN) {
    if (member < backups) memcpy(out[(*n)++], p->backups[member], PS_ADDRESS_MAX);
  } else if (member == 0) {
    for (uint32_t i = 0; i < backups; i++) memcpy(out[(*n)++], p->backups[i], PS_ADDRESS_MAX);
  }
}

fl_status ps_map_encode(const ps_map *map, fl_buf *out) {
  uint8_t head[HEAD] = {0};
  memcpy(head, MAGIC, 8);
  common_put_u32(head + 8, VERSION);
  common_put_u32(head + 12, map->table);
  common_put_u32(head + 16, map->shards);
  common_put_u32(head + 20, map->workers);
  common_put_u32(head + 24, (uint32_t)map->replication);
  size_t start = out->len;
  ps_host_request h = {.spec = map->spec, .shards = map->shards, .workers = map->workers};
  fl_status st = fl_buf_append(out, head, sizeof head) == FL_OK ? ps_wire_host_encode(&h, out)
                                                                : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t s = 0; st == FL_OK && s < map->shards; s++) {
    char addr[1 + PS_MAX_BACKUPS][PS_ADDRESS_MAX] = {{0}};
    const ps_place *p = &map->places[s];
    memcpy(addr[0], p->primary, strnlen(p->primary, PS_ADDRESS_MAX - 1));
    for (int b = 0; b < PS_MAX_BACKUPS; b++) memcpy(addr[1 + b], p->backups[b], strnlen(p->backups[b], PS_ADDRESS_MAX - 1));
    if (fl_buf_append(out, addr, sizeof addr) != FL_OK) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  uint8_t crc[4];
  if (st == FL_OK) {
    common_put_u32(crc, common_crc32c(0, out->data + start, out->len - start));
    if (fl_buf_append(out, crc, 4) != FL_OK) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  if (st != FL_OK) out->len = start;
  return st;
}

size_t ps_map_size(const void *p) {
  const uint8_t *b = p;
  if (!b || memcmp(b, MAGIC, 8) != 0 || common_get_u32(b + 8) != VERSION) return 0;
  uint32_t shards = common_get_u32(b + 16);
  if (shards < 1 || shards > (1u << 20)) return 0;
  return FIXED + (size_t)shards * PLACE_BYTES + 4;
}

fl_status ps_map_decode(fl_bytes in, ps_map *out) {
  memset(out, 0, sizeof *out);
  if (in.len < FIXED + 4 || memcmp(in.data, MAGIC, 8) != 0)
    return fl_set_error(FL_EFORMAT, "parameter server: not a table handle (%zu bytes)", in.len);
  if (common_get_u32(in.data + in.len - 4) != common_crc32c(0, in.data, in.len - 4))
    return fl_set_error(FL_ECORRUPT, "parameter server: a table handle's checksum does not match");
  if (common_get_u32(in.data + 8) != VERSION)
    return fl_set_error(FL_EFORMAT, "parameter server: a table handle of another version");
  uint32_t shards = common_get_u32(in.data + 16), mode = common_get_u32(in.data + 24);
  if (shards < 1 || (in.len - FIXED - 4) / PLACE_BYTES != shards || (in.len - FIXED - 4) % PLACE_BYTES)
    return fl_set_error(FL_EFORMAT, "parameter server: a table handle's shard list is malformed");
  if (mode > PS_REPLICATION_CHAIN) return fl_set_error(FL_EFORMAT, "parameter server: a table handle's replication %u", mode);
  ps_host_request h;
  fl_status st = ps_wire_host_decode(fl_bytes_of(in.data + HEAD, FIXED - HEAD), &h);
  if (st == FL_OK) st = ps_table_spec_check(&h.spec);
  if (st != FL_OK) return common_error_wrap(FL_EFORMAT, "parameter server: a table handle: ");
  out->table = common_get_u32(in.data + 12);
  out->shards = shards;
  out->workers = common_get_u32(in.data + 20);
  out->replication = (ps_replication)mode;
  out->spec = h.spec;
  if (out->workers < 1) return fl_set_error(FL_EFORMAT, "parameter server: a table handle with no workers");
  out->places = common_calloc(shards, sizeof *out->places);
  if (!out->places) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t s = 0; s < shards; s++) {
    const uint8_t *at = in.data + FIXED + (size_t)s * PLACE_BYTES;
    ps_place *p = &out->places[s];
    memcpy(p->primary, at, PS_ADDRESS_MAX);
    p->primary[PS_ADDRESS_MAX - 1] = 0;
    for (int b = 0; b < PS_MAX_BACKUPS; b++) {
      memcpy(p->backups[b], at + (size_t)(1 + b) * PS_ADDRESS_MAX, PS_ADDRESS_MAX);
      p->backups[b][PS_ADDRESS_MAX - 1] = 0;
    }
    if (!p->primary[0]) {
      ps_map_free(out);
      return fl_set_error(FL_EFORMAT, "parameter server: a table handle without shard %u's primary", s);
    }
  }
  return FL_OK;
}

void ps_map_free(ps_map *map) {
  common_free(map->places);
  map->places = NULL;
}
