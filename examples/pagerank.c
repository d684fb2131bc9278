/*
 * pagerank: PageRank over a generated graph, the example of the RDD paper (Zaharia et al.,
 * NSDI 2012, section 3.2.2) and of Spark's SparkPageRank.
 *
 *   flint submit --master local[4] build/bin/pagerank.so [PAGES] [ITERATIONS] [PARTITIONS]
 *
 * The graph: page p links to 1 to 10 distinct other pages, chosen from a hash of p, so the
 * graph is the same on any number of threads. Its first link is to page p + 1 (mod PAGES),
 * so that every page has a link in and a link out: no page drops out of the inner join,
 * no rank is lost, and the sum of the ranks stays at PAGES, which the run prints as a check.
 *
 * links = (page, int64 array of the pages it links to), placed by fl_partition_by with a
 * hash partitioner over PARTITIONS (0: the default parallelism) and cached. ranks start at
 * 1.0 from fl_map_values over links, which keeps links' partitioner. Each iteration:
 *
 *   contribs = join(links, ranks).flat_map((dest, rank / outdegree) for each link)
 *   ranks    = reduce_by_key(contribs, +, the same partitioner).map_values(0.15 + 0.85 * sum)
 *
 * Since links and ranks are partitioned alike, the join reads both from their partitions in
 * place (a narrow dependency): only the contributions are shuffled, and the big links
 * dataset never moves after the first step. The run prints the tasks of each iteration (from
 * fl_context_stats_get) and, at the end, one iteration joined against an unpartitioned copy
 * of links for comparison, where links is shuffled again.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "flint/flint.h"

#define MAX_LINKS 10
#define TOP_PAGES 5

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Page id -> (page, its out-links as int64s). arg: the number of pages (int64). */
fl_status make_links(fl_bytes rec, fl_buf *out, const void *arg) {
  int64_t pages, page = fl_i64(rec);
  memcpy(&pages, arg, sizeof pages);
  uint64_t h = mix((uint64_t)page);
  int64_t want = 1 + (int64_t)(h % MAX_LINKS);
  if (want > pages - 1) want = pages - 1;
  int64_t dest[MAX_LINKS];
  int n = 0;
  dest[n++] = (page + 1) % pages;
  for (uint64_t j = 1; n < want; j++) {
    int64_t d = (int64_t)(mix(h ^ (j * 0xd6e8feb86659fd93ull)) % (uint64_t)pages);
    bool seen = d == page;
    for (int k = 0; k < n && !seen; k++) seen = dest[k] == d;
    if (!seen) dest[n++] = d;
  }
  return fl_buf_put_pair(out, fl_bytes_of(&page, 8), fl_bytes_of(dest, (size_t)n * 8));
}

fl_status initial_rank(fl_bytes value, fl_buf *out, const void *arg) {
  (void)value, (void)arg;
  return fl_buf_put_f64(out, 1.0);
}

/* (page, joined(links, rank)) -> (dest, rank / outdegree) for each link. */
fl_status contributions(fl_bytes rec, fl_emitter *out, const void *arg) {
  (void)arg;
  fl_bytes page, joined, links, rank;
  bool has_links, has_rank;
  fl_status s = fl_pair(rec, &page, &joined);
  if (s == FL_OK) s = fl_joined_get(joined, &has_links, &links, &has_rank, &rank);
  if (s != FL_OK) return s;
  size_t n = links.len / 8;
  if (n == 0 || links.len % 8 != 0 || rank.len != 8)
    return fl_set_error(FL_EFORMAT, "page with %zu bytes of links and %zu of rank", links.len, rank.len);
  double share = fl_f64(rank) / (double)n;
  fl_buf one = FL_BUF_INIT;
  for (size_t i = 0; i < n && s == FL_OK; i++) {
    one.len = 0;
    if ((s = fl_buf_put_pair(&one, fl_bytes_of(links.data + 8 * i, 8), fl_bytes_of(&share, 8))) == FL_OK)
      s = fl_emit(out, one.data, one.len);
  }
  fl_buf_free(&one);
  return s;
}

fl_status add_f64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_f64(out, fl_f64(a) + fl_f64(b));
}

fl_status damp(fl_bytes sum, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_f64(out, 0.15 + 0.85 * fl_f64(sum));
}

/* aggregate: acc (double) += the rank of a (page, rank) pair. */
fl_status add_rank(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes page, rank;
  fl_status s = fl_pair(rec, &page, &rank);
  return s == FL_OK ? fl_buf_put_f64(out, fl_f64(acc) + fl_f64(rank)) : s;
}

/* The best TOP_PAGES of a list of (page, rank), kept sorted: rank descending, then page. */
typedef struct ranked {
  int64_t page;
  double rank;
} ranked;

static bool better(ranked a, ranked b) { return a.rank > b.rank || (a.rank == b.rank && a.page < b.page); }

static void keep_best(ranked *best, size_t *n, ranked r) {
  if (*n == TOP_PAGES && !better(r, best[TOP_PAGES - 1])) return;
  size_t i = *n < TOP_PAGES ? (*n)++ : TOP_PAGES - 1;
  while (i > 0 && better(r, best[i - 1])) {
    best[i] = best[i - 1];
    i--;
  }
  best[i] = r;
}

/* map_partitions: a partition's best TOP_PAGES pages, as ranked records. */
fl_status partition_top(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition, (void)arg;
  ranked best[TOP_PAGES];
  size_t n = 0;
  fl_bytes rec, page, rank;
  while (fl_iter_next(in, &rec)) {
    fl_status s = fl_pair(rec, &page, &rank);
    if (s != FL_OK) return s;
    keep_best(best, &n, (ranked){fl_i64(page), fl_f64(rank)});
  }
  for (size_t i = 0; i < n; i++) {
    fl_status s = fl_emit(out, &best[i], sizeof best[i]);
    if (s != FL_OK) return s;
  }
  return FL_OK;
}

static uint64_t tasks_run(fl_context *ctx) {
  fl_context_stats st;
  return fl_context_stats_get(ctx, &st) == FL_OK ? st.tasks_run : 0;
}

/* One iteration: the new ranks from links and ranks, cached, and the sum of the ranks (an
 * action, which computes and caches them). The intermediate handles are freed here: the new
 * ranks hold their lineage. */
static fl_status iterate(fl_dataset *links, fl_dataset *ranks, const fl_partitioner *part,
                         fl_dataset **new_ranks, double *sum) {
  fl_dataset *joined = NULL, *contribs = NULL, *summed = NULL, *next = NULL;
  fl_buf total = FL_BUF_INIT;
  const double zero = 0;
  fl_status s;
  if ((s = fl_join(links, ranks, FL_JOIN_INNER, part, 0, &joined)) == FL_OK &&
      (s = fl_flat_map(joined, contributions, NULL, 0, &contribs)) == FL_OK &&
      (s = fl_reduce_by_key(contribs, add_f64, NULL, 0, part, 0, &summed)) == FL_OK &&
      (s = fl_map_values(summed, damp, NULL, 0, &next)) == FL_OK && (s = fl_cache(next)) == FL_OK &&
      (s = fl_aggregate(next, fl_bytes_of(&zero, 8), add_rank, add_f64, NULL, 0, &total)) == FL_OK) {
    *sum = fl_f64(fl_buf_bytes(&total));
    *new_ranks = next;
    next = NULL;
  }
  fl_buf_free(&total);
  fl_dataset_free(next);
  fl_dataset_free(summed);
  fl_dataset_free(contribs);
  fl_dataset_free(joined);
  return s;
}

static bool parse_arg(const char *s, long long *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (*s == '\0' || *end != '\0') return false;
  *out = v;
  return true;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  long long pages = 10000, iterations = 10, partitions = 0;
  if (argc > 4 || (argc > 1 && !parse_arg(argv[1], &pages)) ||
      (argc > 2 && !parse_arg(argv[2], &iterations)) || (argc > 3 && !parse_arg(argv[3], &partitions)) ||
      pages < 2 || iterations <= 0 || partitions < 0 || partitions > 100000) {
    fprintf(stderr, "usage: pagerank [PAGES >= 2 (default 10000)] [ITERATIONS > 0 (default 10)] "
                    "[PARTITIONS >= 0 (default 0: the default parallelism)]\n");
    return 2;
  }
  int64_t n_pages = pages;
  fl_dataset *ids = NULL, *raw_links = NULL, *links = NULL, *ranks = NULL, *next = NULL,
             *tops = NULL, *compare = NULL;
  fl_partitioner *part = NULL;
  fl_records *best_recs = NULL;
  uint64_t link_count = 0;
  int rc = 1;
  double t0 = now_s();
  uint64_t tasks0 = tasks_run(ctx);
  if (fl_range(ctx, 0, n_pages, 1, (uint32_t)partitions, &ids) != FL_OK ||
      fl_map(ids, make_links, &n_pages, sizeof n_pages, &raw_links) != FL_OK ||
      fl_partitioner_hash(fl_dataset_partitions(ids), &part) != FL_OK ||
      fl_partition_by(raw_links, part, &links) != FL_OK || fl_cache(links) != FL_OK ||
      fl_count(links, &link_count) != FL_OK || /* shuffles links once, and caches them */
      fl_map_values(links, initial_rank, NULL, 0, &ranks) != FL_OK) {
    fprintf(stderr, "pagerank: %s\n", fl_last_error());
    goto done;
  }
  uint32_t p = fl_partitioner_partitions(part);
  fl_storage_info info = {0};
  fl_storage_info_get(links, &info);
  printf("pagerank: %lld pages, %lld iterations, %u partitions, %u threads\n", pages, iterations, p,
         fl_context_cores(ctx));
  printf("links: partitioned by a hash partitioner over %u partitions and cached (%" PRIu64
         " bytes in memory): %.3f s, %" PRIu64 " tasks\n",
         p, info.memory_bytes, now_s() - t0, tasks_run(ctx) - tasks0);

  uint64_t iter_tasks = 0;
  for (long long it = 1; it <= iterations; it++) {
    double t = now_s(), sum = 0;
    uint64_t before = tasks_run(ctx);
    if (iterate(links, ranks, part, &next, &sum) != FL_OK) {
      fprintf(stderr, "pagerank: iteration %lld: %s\n", it, fl_last_error());
      goto done;
    }
    /* The old ranks' blocks are no longer read (the new ones are cached); the dataset itself
     * stays as part of the new ranks' lineage. */
    fl_unpersist(ranks);
    fl_dataset_free(ranks);
    ranks = next;
    next = NULL;
    iter_tasks = tasks_run(ctx) - before;
    printf("iteration %3lld: sum of ranks %.6f  %.3f s  %" PRIu64 " tasks\n", it, sum, now_s() - t,
           iter_tasks);
  }
  printf("Each iteration runs %u + %u tasks: %u map tasks that join links with ranks and shuffle the\n"
         "contributions, then %u reduce tasks that sum them into the new ranks. links (partitioned,\n"
         "cached) and ranks (reduce_by_key and map_values with the same partitioner) are placed\n"
         "alike, so the join reads links' cached partitions in place: no shuffle of links.\n",
         p, p, p, p);

  /* For comparison: one iteration joined with a copy of links that has no partitioner, as
   * if links had not been partitioned: the join must shuffle all of links again. */
  {
    double t = now_s(), sum = 0;
    uint64_t before = tasks_run(ctx);
    if (fl_cache(raw_links) != FL_OK || fl_count(raw_links, &link_count) != FL_OK) {
      fprintf(stderr, "pagerank: %s\n", fl_last_error());
      goto done;
    }
    uint64_t fill = tasks_run(ctx) - before;
    t = now_s();
    before = tasks_run(ctx);
    if (iterate(raw_links, ranks, part, &compare, &sum) != FL_OK) {
      fprintf(stderr, "pagerank: comparison: %s\n", fl_last_error());
      goto done;
    }
    printf("for comparison, one more iteration joined with an unpartitioned cached copy of links\n"
           "(cached first, %" PRIu64 " tasks): sum of ranks %.6f  %.3f s  %" PRIu64 " tasks, i.e. %" PRIu64
           " more: the tasks that shuffle links\n",
           fill, sum, now_s() - t, tasks_run(ctx) - before, tasks_run(ctx) - before - iter_tasks);
    fl_unpersist(raw_links);
  }

  if (fl_map_partitions(ranks, partition_top, NULL, 0, &tops) != FL_OK ||
      fl_collect(tops, &best_recs) != FL_OK) {
    fprintf(stderr, "pagerank: %s\n", fl_last_error());
    goto done;
  }
  ranked best[TOP_PAGES];
  size_t n_best = 0;
  for (size_t i = 0; i < fl_records_count(best_recs); i++) {
    fl_bytes r = fl_records_get(best_recs, i);
    ranked x;
    if (r.len != sizeof x) {
      fprintf(stderr, "pagerank: malformed top record of %zu bytes\n", r.len);
      goto done;
    }
    memcpy(&x, r.data, sizeof x);
    keep_best(best, &n_best, x);
  }
  printf("top %zu pages by rank:\n", n_best);
  for (size_t i = 0; i < n_best; i++) printf("  page %8" PRId64 "  rank %.6f\n", best[i].page, best[i].rank);
  printf("total: %.3f s\n", now_s() - t0);
  rc = 0;
done:
  fl_records_free(best_recs);
  fl_dataset_free(tops);
  fl_dataset_free(compare);
  fl_dataset_free(next);
  fl_dataset_free(ranks);
  fl_dataset_free(links);
  fl_dataset_free(raw_links);
  fl_dataset_free(ids);
  fl_partitioner_free(part);
  return rc;
}
