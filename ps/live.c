/*
 * live.c: the parameter servers as the web UI shows them live (ps_live_json): each shard's
 * replicas, and its workers' clocks asked of its primary (CLOCKS), each with a short timeout
 * and all within a bound, so that a page never waits long on a slow or lost server. The
 * driver (its placed tables) and a local context (its own servers) both answer /ps with it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps.h"

/* Each primary is asked for this long at most, and all of them for this long. */
#define LIVE_CALL_TIMEOUT_MS 500
#define LIVE_TOTAL_MS 2000

/* Appends printf-formatted text; false when out of memory. */
#define put(b, ...) (common_buf_printf((b), __VA_ARGS__) == FL_OK)

char *ps_live_json(const ps_live_shard *shards, size_t n, const char *secret) {
  fl_buf b = FL_BUF_INIT;
  bool ok = put(&b, "{");
  uint64_t deadline = common_now_ns() + (uint64_t)LIVE_TOTAL_MS * 1000000u;
  for (size_t i = 0; ok && i < n; i++) {
    const ps_live_shard *l = &shards[i];
    bool first_of_table = i == 0 || shards[i - 1].table != l->table;
    bool last_of_table = i + 1 == n || shards[i + 1].table != l->table;
    if (first_of_table) ok = put(&b, "%s\"%u\":{\"shards\":[", i ? "," : "", l->table);
    else ok = put(&b, ",");
    ok = ok && put(&b, "{\"shard\":%u,\"primary\":%llu,\"backups\":[", l->shard,
                   (unsigned long long)(l->members ? l->member[0] : 0));
    for (uint32_t m = 1; ok && m < l->members; m++)
      ok = put(&b, "%s%llu", m > 1 ? "," : "", (unsigned long long)l->member[m]);
    ok = ok && put(&b, "],\"clocks\":{");
    uint64_t *clocks = NULL;
    uint32_t workers = 0;
    if (ok && l->members && common_now_ns() < deadline &&
        ps_shard_clocks(l->primary, secret, l->table, l->shard, LIVE_CALL_TIMEOUT_MS, &clocks, &workers) != FL_OK)
      common_log(LOG_DEBUG, "web UI: table %u shard %u's clocks: %s", l->table, l->shard, fl_last_error());
    bool first = true;
    for (uint32_t w = 0; ok && w < workers; w++) {
      if (clocks[w] == UINT64_MAX) continue; /* retired */
      ok = put(&b, "%s\"%u\":%llu", first ? "" : ",", w, (unsigned long long)clocks[w]);
      first = false;
    }
    common_free(clocks);
    ok = ok && put(&b, last_of_table ? "}}]}" : "}}");
  }
  ok = ok && put(&b, "}");
  char *text = ok ? strdup((const char *)b.data) : NULL;
  fl_buf_free(&b);
  return text;
}

fl_status ps_table_event(fl_buf *b, uint64_t app, const ps_map *m, const uint64_t (*members)[1 + PS_MAX_BACKUPS]) {
  bool ok = m->spec.sparse ? put(b, "{\"Event\":\"PsTable\",\"App\":%llu,\"Table\":%u,\"Name\":\"sparse, %u floats a key\"",
                                 (unsigned long long)app, m->table, m->spec.width)
                           : put(b, "{\"Event\":\"PsTable\",\"App\":%llu,\"Table\":%u,\"Name\":\"dense, %llu keys x %u "
                                 "floats\"", (unsigned long long)app, m->table, (unsigned long long)m->spec.keys,
                                 m->spec.width);
  ok = ok && put(b, ",\"Shards\":[");
  for (uint32_t s = 0; ok && s < m->shards; s++) {
    ok = put(b, "%s{\"Shard\":%u,\"Replicas\":[", s ? "," : "", s);
    /* without members: the primary and its backups, all on executor 0 */
    uint32_t n = 1 + ps_place_backups(&m->places[s]);
    for (uint32_t r = 0; ok && r < 1 + PS_MAX_BACKUPS && (members ? members[s][r] != 0 : r < n); r++)
      ok = put(b, "%s%llu", r ? "," : "", (unsigned long long)(members ? members[s][r] : 0));
    ok = ok && put(b, "]}");
  }
  return ok && put(b, "]}") ? FL_OK : FL_ERR(FL_ENOMEM, "out of memory");
}
