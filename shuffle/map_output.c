/* map_output.c: the map-output table: for every shuffle, which map tasks have written their
 * output and how many bytes each wrote per reduce partition. The scheduler consults it to
 * skip map stages whose output exists (a second action on a shuffled dataset does not run
 * its map stage again) and the status pages report its sizes. */
#include <string.h>

#include "shuffle/shuffle.h"

typedef struct shuffle_outputs {
  uint64_t shuffle_id;
  uint32_t num_maps, present;
  uint64_t *bytes; /* per map: total bytes written; UINT64_MAX when missing */
  struct shuffle_outputs *next;
} shuffle_outputs;

struct map_output_table {
  pthread_mutex_t lock;
  shuffle_outputs *head;
};

fl_status map_output_table_create(map_output_table **out) {
  map_output_table *t = common_calloc(1, sizeof *t);
  if (!t) return FL_ERR(FL_ENOMEM, "cannot allocate the map-output table");
  FL_PCHECK(pthread_mutex_init(&t->lock, NULL));
  *out = t;
  return FL_OK;
}

static void outputs_free(shuffle_outputs *o) {
  common_free(o->bytes);
  common_free(o);
}

void map_output_table_destroy(map_output_table *t) {
  if (!t) return;
  while (t->head) {
    shuffle_outputs *next = t->head->next;
    outputs_free(t->head);
    t->head = next;
  }
  pthread_mutex_destroy(&t->lock);
  common_free(t);
}

static shuffle_outputs *find(map_output_table *t, uint64_t shuffle_id) {
  for (shuffle_outputs *o = t->head; o; o = o->next)
    if (o->shuffle_id == shuffle_id) return o;
  return NULL;
}

fl_status map_output_register(map_output_table *t, uint64_t shuffle_id, uint32_t num_maps,
                              uint32_t map, fl_bytes status) {
  if (status.len % 8 != 0 || map >= num_maps)
    return FL_ERR(FL_EINTERNAL, "shuffle %llu: bad map status from map %u", (unsigned long long)shuffle_id, map);
  uint64_t total = 0;
  for (size_t i = 0; i < status.len; i += 8) {
    uint64_t b;
    memcpy(&b, status.data + i, 8);
    total += b;
  }
  fl_status st = FL_OK;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  shuffle_outputs *o = find(t, shuffle_id);
  if (!o) {
    o = common_calloc(1, sizeof *o);
    uint64_t *bytes = common_malloc(num_maps * sizeof *bytes);
    if (!o || !bytes) {
      common_free(o);
      common_free(bytes);
      st = FL_ERR(FL_ENOMEM, "cannot record the output of shuffle %llu", (unsigned long long)shuffle_id);
      goto unlock;
    }
    for (uint32_t i = 0; i < num_maps; i++) bytes[i] = UINT64_MAX;
    o->shuffle_id = shuffle_id;
    o->num_maps = num_maps;
    o->bytes = bytes;
    o->next = t->head;
    t->head = o;
  }
  if (o->bytes[map] == UINT64_MAX) o->present++;
  o->bytes[map] = total;
unlock:
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return st;
}

bool map_output_complete(map_output_table *t, uint64_t shuffle_id) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  shuffle_outputs *o = find(t, shuffle_id);
  bool complete = o && o->present == o->num_maps;
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return complete;
}

bool map_output_has(map_output_table *t, uint64_t shuffle_id, uint32_t map) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  shuffle_outputs *o = find(t, shuffle_id);
  bool has = o && map < o->num_maps && o->bytes[map] != UINT64_MAX;
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return has;
}

uint64_t map_output_bytes(map_output_table *t, uint64_t shuffle_id) {
  uint64_t total = 0;
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  shuffle_outputs *o = find(t, shuffle_id);
  for (uint32_t i = 0; o && i < o->num_maps; i++)
    if (o->bytes[i] != UINT64_MAX) total += o->bytes[i];
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
  return total;
}

void map_output_forget(map_output_table *t, uint64_t shuffle_id) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  for (shuffle_outputs **p = &t->head; *p; p = &(*p)->next) {
    if ((*p)->shuffle_id != shuffle_id) continue;
    shuffle_outputs *o = *p;
    *p = o->next;
    outputs_free(o);
    break;
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}

void map_output_unregister(map_output_table *t, uint64_t shuffle_id, uint32_t map) {
  FL_PCHECK(pthread_mutex_lock(&t->lock));
  shuffle_outputs *o = find(t, shuffle_id);
  if (o && map < o->num_maps && o->bytes[map] != UINT64_MAX) {
    o->bytes[map] = UINT64_MAX;
    o->present--;
  }
  FL_PCHECK(pthread_mutex_unlock(&t->lock));
}
