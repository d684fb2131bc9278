/*
 * live.c: the parameter servers as the web UI shows them live (ps_live_json): each shard's
 * replicas, and its workers' clocks asked of its primary (CLOCKS), each with a short timeout
 * and all within a bound, so that a page never waits long on a slow or lost server. The
 * driver (its placed tables) and a local context (its own servers) both answer /ps with it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps/ps.h"

/* Each primary is asked for this long at most, and all of them for this long. */
#define LIVE_CALL_TIMEOUT_MS 500
#define LIVE_TOTAL_MS 2000

static bool put(fl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool put(fl_buf *b, const char *fmt, ...) {
  char item[160];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(item, sizeof item, fmt, ap);
  va_end(ap);
  return len >= 0 && (size_t)len < sizeof item && fl_buf_append(b, item, (size_t)len) == FL_OK;
}

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
  ok = ok && fl_buf_append(&b, "}", 2) == FL_OK; /* with the NUL */
  char *text = ok ? strdup((const char *)b.data) : NULL;
  fl_buf_free(&b);
  return text;
}
