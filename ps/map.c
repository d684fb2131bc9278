/*
 * ps/map.c: a table's map as bytes (ps/ps.h), the handle that tasks open their workers
 * with. Little-endian:
 *    0 8  magic "FLNTPSMP"   8 u32 version (1)   12 u32 table   16 u32 shards   20 u32 workers
 *   24    the table's spec, shards, index 0 and workers as HOST carries them (ps/wire.c), with
 *         an empty backup address: 56 bytes
 *   80    per shard: the primary's and the backup's address, PS_ADDRESS_MAX bytes each, zero-padded
 *   end   u32 CRC-32C of every byte before it
 */
#include <string.h>

#include "ps/wire.h"

#define MAGIC "FLNTPSMP"
#define FIXED 80u

fl_status ps_map_encode(const ps_map *map, fl_buf *out) {
  uint8_t head[24] = {0};
  memcpy(head, MAGIC, 8);
  common_put_u32(head + 8, 1);
  common_put_u32(head + 12, map->table);
  common_put_u32(head + 16, map->shards);
  common_put_u32(head + 20, map->workers);
  size_t start = out->len;
  ps_host_request h = {.spec = map->spec, .shards = map->shards, .workers = map->workers};
  fl_status st = fl_buf_append(out, head, sizeof head) == FL_OK ? ps_wire_host_encode(&h, out)
                                                                : FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t s = 0; st == FL_OK && s < map->shards; s++) {
    char addr[2][PS_ADDRESS_MAX] = {{0}};
    memcpy(addr[0], map->places[s].primary, strnlen(map->places[s].primary, PS_ADDRESS_MAX - 1));
    memcpy(addr[1], map->places[s].backup, strnlen(map->places[s].backup, PS_ADDRESS_MAX - 1));
    if (fl_buf_append(out, addr, sizeof addr) != FL_OK) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  }
  uint8_t crc[4];
  common_put_u32(crc, common_crc32c(0, out->data + start, out->len - start));
  if (st == FL_OK && fl_buf_append(out, crc, 4) != FL_OK) st = FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  if (st != FL_OK) out->len = start;
  return st;
}

fl_status ps_map_decode(fl_bytes in, ps_map *out) {
  memset(out, 0, sizeof *out);
  if (in.len < FIXED + 4 || memcmp(in.data, MAGIC, 8) != 0)
    return fl_set_error(FL_EFORMAT, "parameter server: not a table handle (%zu bytes)", in.len);
  if (common_get_u32(in.data + in.len - 4) != common_crc32c(0, in.data, in.len - 4))
    return fl_set_error(FL_ECORRUPT, "parameter server: a table handle's checksum does not match");
  if (common_get_u32(in.data + 8) != 1) return fl_set_error(FL_EFORMAT, "parameter server: a table handle of another version");
  uint32_t shards = common_get_u32(in.data + 16);
  if (shards < 1 || (in.len - FIXED - 4) / (2 * PS_ADDRESS_MAX) != shards || (in.len - FIXED - 4) % (2 * PS_ADDRESS_MAX))
    return fl_set_error(FL_EFORMAT, "parameter server: a table handle's shard list is malformed");
  ps_host_request h;
  fl_status st = ps_wire_host_decode(fl_bytes_of(in.data + 24, FIXED - 24), &h);
  if (st == FL_OK) st = ps_table_spec_check(&h.spec);
  if (st != FL_OK) return common_error_wrap(FL_EFORMAT, "parameter server: a table handle: ");
  out->table = common_get_u32(in.data + 12);
  out->shards = shards;
  out->workers = common_get_u32(in.data + 20);
  out->spec = h.spec;
  if (out->workers < 1) return fl_set_error(FL_EFORMAT, "parameter server: a table handle with no workers");
  out->places = common_calloc(shards, sizeof *out->places);
  if (!out->places) return FL_ERR(FL_ENOMEM, "parameter server: out of memory");
  for (uint32_t s = 0; s < shards; s++) {
    const uint8_t *at = in.data + FIXED + (size_t)s * 2 * PS_ADDRESS_MAX;
    memcpy(out->places[s].primary, at, PS_ADDRESS_MAX);
    memcpy(out->places[s].backup, at + PS_ADDRESS_MAX, PS_ADDRESS_MAX);
    out->places[s].primary[PS_ADDRESS_MAX - 1] = out->places[s].backup[PS_ADDRESS_MAX - 1] = 0;
    if (!out->places[s].primary[0]) {
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
