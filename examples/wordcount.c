/*
 * wordcount: the most frequent words of text files, as Spark's JavaWordCount, with a sort.
 *
 *   flint submit --master local[4] build/bin/wordcount.so [PATH] [TOP]
 *
 * PATH is a file, a folder or a glob (default /usr/share/common-licenses); TOP is how many
 * words to print (default 10). Each line is split into lowercase words (runs of ASCII
 * letters and digits; every other byte separates words), each word becomes a pair (word,
 * int64 1), and reduce_by_key sums the ones per word (combined map-side first, so each map
 * task shuffles one pair per distinct word it saw). The counts are then re-keyed as
 * (count, word) pairs and sorted by sort_by_key in descending order: the key is the count
 * as a big-endian uint64 (so that bytewise order is numeric order) followed by the word,
 * compared by by_count_then_word so that words of equal count come out in alphabetical
 * order and the output is the same on every run and thread count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "flint/flint.h"

#define DEFAULT_PATH "/usr/share/common-licenses"
#define DEFAULT_TOP 10

static bool is_word_byte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Line -> (word, int64 1) for every word of the line, lowercased. */
fl_status split_words(fl_bytes line, fl_emitter *out, const void *arg) {
  (void)arg;
  static const int64_t one = 1;
  fl_buf word = FL_BUF_INIT, pair = FL_BUF_INIT;
  fl_status s = FL_OK;
  size_t i = 0;
  while (s == FL_OK && i < line.len) {
    while (i < line.len && !is_word_byte(line.data[i])) i++;
    if (i == line.len) break;
    word.len = 0;
    for (; i < line.len && is_word_byte(line.data[i]) && s == FL_OK; i++) {
      uint8_t c = line.data[i];
      if (c >= 'A' && c <= 'Z') c = (uint8_t)(c - 'A' + 'a');
      s = fl_buf_append(&word, &c, 1);
    }
    pair.len = 0;
    if (s == FL_OK) s = fl_buf_put_pair(&pair, fl_buf_bytes(&word), fl_bytes_of(&one, 8));
    if (s == FL_OK) s = fl_emit(out, pair.data, pair.len);
  }
  fl_buf_free(&word);
  fl_buf_free(&pair);
  return s;
}

fl_status add_i64(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg) {
  (void)arg;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(a) + (uint64_t)fl_i64(b)));
}

/* (word, count) -> (big-endian count + word, word). */
fl_status by_count(fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes word, count;
  fl_status s = fl_pair(rec, &word, &count);
  if (s != FL_OK) return s;
  uint64_t c = (uint64_t)fl_i64(count);
  uint8_t key[8];
  for (int i = 0; i < 8; i++) key[i] = (uint8_t)(c >> (56 - 8 * i));
  fl_buf k = FL_BUF_INIT;
  if ((s = fl_buf_append(&k, key, 8)) == FL_OK && (s = fl_buf_append(&k, word.data, word.len)) == FL_OK)
    s = fl_buf_put_pair(out, fl_buf_bytes(&k), word);
  fl_buf_free(&k);
  return s;
}

static int bytes_cmp(fl_bytes a, fl_bytes b) {
  size_t n = a.len < b.len ? a.len : b.len;
  int c = n ? memcmp(a.data, b.data, n) : 0;
  if (c != 0) return c;
  return (a.len > b.len) - (a.len < b.len);
}

/* Keys are [8-byte big-endian count][word]. Counts compare numerically; equal counts compare
 * their words in reverse, so that the descending sort lists them alphabetically. */
int by_count_then_word(fl_bytes a, fl_bytes b, const void *arg) {
  (void)arg;
  fl_bytes ca = fl_bytes_of(a.data, a.len < 8 ? a.len : 8), cb = fl_bytes_of(b.data, b.len < 8 ? b.len : 8);
  int c = bytes_cmp(ca, cb);
  if (c != 0) return c;
  return -bytes_cmp(fl_bytes_of(a.data + ca.len, a.len - ca.len), fl_bytes_of(b.data + cb.len, b.len - cb.len));
}

/* aggregate: acc (int64) += the count of a (word, count) pair. */
fl_status add_count(fl_bytes acc, fl_bytes rec, fl_buf *out, const void *arg) {
  (void)arg;
  fl_bytes word, count;
  fl_status s = fl_pair(rec, &word, &count);
  if (s != FL_OK) return s;
  return fl_buf_put_i64(out, (int64_t)((uint64_t)fl_i64(acc) + (uint64_t)fl_i64(count)));
}

static uint64_t be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

__attribute__((visibility("default"))) int flint_main(fl_context *ctx, int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : DEFAULT_PATH;
  long long top = DEFAULT_TOP;
  if (argc > 2) {
    char *end;
    top = strtoll(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0') top = 0;
  }
  if (argc > 3 || !*path || top <= 0) {
    fprintf(stderr, "usage: wordcount [PATH (file, folder or glob; default %s)] [TOP > 0 (default %d)]\n",
            DEFAULT_PATH, DEFAULT_TOP);
    return 2;
  }
  struct stat sb;
  if (argc <= 1 && stat(DEFAULT_PATH, &sb) != 0) {
    fprintf(stderr, "wordcount: the default input %s is missing (it comes with Debian's base-files); "
                    "give a PATH\n", DEFAULT_PATH);
    return 1;
  }

  fl_dataset *lines = NULL, *words = NULL, *counts = NULL, *keyed = NULL, *sorted = NULL;
  fl_records *best = NULL;
  fl_buf total = FL_BUF_INIT;
  const int64_t zero = 0;
  uint64_t distinct = 0;
  int rc = 1;
  if (fl_text_file(ctx, path, 0, &lines) != FL_OK ||
      fl_flat_map(lines, split_words, NULL, 0, &words) != FL_OK ||
      fl_reduce_by_key(words, add_i64, NULL, 0, NULL, 0, &counts) != FL_OK ||
      fl_cache(counts) != FL_OK || /* read by three jobs below: count, total, sort */
      fl_count(counts, &distinct) != FL_OK ||
      fl_aggregate(counts, fl_bytes_of(&zero, 8), add_count, add_i64, NULL, 0, &total) != FL_OK ||
      fl_map(counts, by_count, NULL, 0, &keyed) != FL_OK ||
      fl_sort_by_key(keyed, false, by_count_then_word, NULL, 0, 0, &sorted) != FL_OK ||
      fl_take(sorted, (size_t)top, &best) != FL_OK) {
    fprintf(stderr, "wordcount: %s\n", fl_last_error());
    goto done;
  }
  printf("wordcount of %s: %lld words, %llu distinct (%u partitions, %u threads)\n", path,
         (long long)fl_i64(fl_buf_bytes(&total)), (unsigned long long)distinct,
         fl_dataset_partitions(lines), fl_context_cores(ctx));
  printf("top %zu:\n", fl_records_count(best));
  for (size_t i = 0; i < fl_records_count(best); i++) {
    fl_bytes key, word;
    if (fl_pair(fl_records_get(best, i), &key, &word) != FL_OK || key.len < 8) {
      fprintf(stderr, "wordcount: malformed sorted record %zu\n", i);
      goto done;
    }
    printf("%4zu. %-24.*s %10llu\n", i + 1, (int)word.len, (const char *)word.data,
           (unsigned long long)be64(key.data));
  }
  rc = 0;
done:
  fl_records_free(best);
  fl_buf_free(&total);
  fl_dataset_free(sorted);
  fl_dataset_free(keyed);
  fl_dataset_free(counts);
  fl_dataset_free(words);
  fl_dataset_free(lines);
  return rc;
}
