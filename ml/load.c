/*
 * load.c: fl_ml_load. LIBSVM and CSV text is parsed on the executors into row blocks (here);
 * IDX (MNIST) is load_idx.c: headers and labels are checked on the client, and each task
 * reads its range of images (bad images are reported as bad lines are, below).
 *
 * Text design. Errors must name the file and the line (1-based, in that file), but a task
 * sees only its split of the lines. The client therefore lists the input files itself (as
 * fl_text_file does: a file, a folder's visible files sorted, or a glob's matches sorted),
 * reads each with its own fl_text_file and joins them with fl_union, so that it knows which
 * file every partition comes from. One counting job (the pass fl_zip_with_index would run
 * too) gives the lines of every partition; from them the client knows each partition's first
 * line number in its file and puts that table, with the file names, into the parse kernel's
 * argument blob. For CSV the client also reads the first data line (fl_take) to fix the
 * field count every line must have. The parsed blocks are coalesced to the requested
 * partition count (never more; fewer where fl_text_file makes fewer, as for .gz files),
 * persisted, and described by one more job (ml_data_describe).
 *
 * Bad lines do not fail tasks: a parse error is deterministic, so retries would only read
 * the split again (and a cluster would exclude executors that did nothing wrong). The
 * kernel counts bad lines in an i64 accumulator and keeps the first one's "file:line:
 * cause" (the smallest file and line) in a second; without skip_bad_lines a partition stops
 * at its first bad line. After the describing job fl_ml_load returns FL_EFORMAT with that
 * message, the first bad line of the input whatever the task order, or, with
 * skip_bad_lines, prints one line to stderr and sets fl_ml_data.skipped.
 *
 * Kernels (FL_ML_KERNEL, ml_load_*) are exported so that cluster executors find them by
 * symbol; their argument blobs hold no pointers.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "ml/load_bad.h"
#include "ml/load_idx.h"

/* ---- argument blob of the text kernels --------------------------------------------------- */

/* Followed in the blob by: u64 first_line[num_parts] (the 0-based line number, in its file,
 * of the partition's first line), u32 file_of[num_parts], u32 name_at[num_files] (offsets
 * of NUL-terminated names in the bytes that follow), then the names. */
typedef struct ml_load_text_arg {
  uint32_t format;         /* FL_ML_LIBSVM, FL_ML_CSV or FL_ML_TEXT */
  uint32_t rows_per_block; /* 0: the builder's default */
  uint32_t num_features;   /* LIBSVM: 0 = unbounded */
  uint32_t fields;         /* CSV: fields per line */
  uint32_t label_field;    /* CSV: the label's field (0-based) */
  uint32_t hash_bits;      /* LIBSVM, TEXT: features hashed into 2^hash_bits columns (0: not) */
  uint32_t num_parts, num_files;
  char delimiter;
  uint8_t zero_based, header, skip_bad_lines;
  uint64_t bad_acc, first_acc; /* accumulator ids: bad lines, the first bad line */
} ml_load_text_arg;

static uint64_t arg_first_line(const ml_load_text_arg *a, uint32_t p) {
  uint64_t v;
  memcpy(&v, (const uint8_t *)(a + 1) + (size_t)p * 8, 8);
  return v;
}

static uint32_t arg_u32(const ml_load_text_arg *a, size_t index) {
  uint32_t v;
  memcpy(&v, (const uint8_t *)(a + 1) + (size_t)a->num_parts * 8 + index * 4, 4);
  return v;
}

static uint32_t arg_file_of(const ml_load_text_arg *a, uint32_t p) { return arg_u32(a, p); }

static const char *arg_name(const ml_load_text_arg *a, uint32_t file) {
  const char *names = (const char *)(a + 1) + (size_t)a->num_parts * 12 + (size_t)a->num_files * 4;
  return names + arg_u32(a, (size_t)a->num_parts + file);
}

/* ---- parsing one line -------------------------------------------------------------------- */

/* A whole token as a double. */
static bool parse_double(const char *s, double *out) {
  if (!*s || isspace((unsigned char)*s)) return false;
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end) return false;
  *out = v;
  return true;
}

static bool is_blank(const char *s) {
  while (*s && isspace((unsigned char)*s)) s++;
  return *s == '\0';
}

typedef struct parse_state {
  const ml_load_text_arg *arg;
  fl_buf idx, values; /* u32, f64 of the row being parsed */
  char cause[ML_LOAD_CAUSE_MAX];
} parse_state;

/* Returns FL_OK, FL_EFORMAT with ps->cause set, or FL_ENOMEM. */
static fl_status parse_libsvm(parse_state *ps, char *line, double *label, uint32_t *nnz) {
  const ml_load_text_arg *a = ps->arg;
  ps->idx.len = ps->values.len = 0;
  char *save = NULL, *tok = strtok_r(line, " \t", &save);
  if (!parse_double(tok, label)) {
    snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "bad label '%.64s'", tok);
    return FL_EFORMAT;
  }
  if (!isfinite(*label)) {
    snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "label '%.64s' is not finite", tok);
    return FL_EFORMAT;
  }
  uint32_t n = 0;
  uint64_t prev = 0;
  while ((tok = strtok_r(NULL, " \t", &save))) {
    char *colon = strchr(tok, ':');
    if (!colon) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "missing ':' in '%.64s' (expected index:value)", tok);
      return FL_EFORMAT;
    }
    *colon = '\0';
    const char *val = colon + 1;
    char *end;
    errno = 0;
    unsigned long long written = isdigit((unsigned char)tok[0]) ? strtoull(tok, &end, 10) : 0;
    if (!isdigit((unsigned char)tok[0]) || *end || errno) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "bad index '%.64s'", tok);
      return FL_EFORMAT;
    }
    if (written == 0 && !a->zero_based) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "index 0 in a 1-based file (pass zero_based)");
      return FL_EFORMAT;
    }
    uint64_t index = a->zero_based ? written : written - 1;
    if (index >= UINT32_MAX) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "index %llu is too large", written);
      return FL_EFORMAT;
    }
    if (!a->hash_bits && a->num_features && index >= a->num_features) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "index %llu beyond num_features %u", written, a->num_features);
      return FL_EFORMAT;
    }
    if (n > 0 && index <= prev) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "indices not ascending (%llu after %llu)", written,
               (unsigned long long)(a->zero_based ? prev : prev + 1));
      return FL_EFORMAT;
    }
    double v;
    if (!parse_double(val, &v)) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "bad value '%.64s' of index %llu", val, written);
      return FL_EFORMAT;
    }
    if (!isfinite(v)) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "value '%.64s' of index %llu is not finite", val, written);
      return FL_EFORMAT;
    }
    uint32_t i32 = (uint32_t)index;
    fl_status s = fl_buf_append(&ps->idx, &i32, 4);
    if (s == FL_OK) s = fl_buf_append(&ps->values, &v, 8);
    if (s != FL_OK) return s;
    prev = index;
    n++;
  }
  *nnz = n;
  return FL_OK;
}

/* ---- the hashing trick ------------------------------------------------------------------ */

/* splitmix64's finalizer: every bit of x stirred into every bit of the result. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A token's hash: FNV-1a over its bytes, then mixed. */
static uint64_t token_hash(const char *t) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *t; t++) h = (h ^ (unsigned char)*t) * 0x100000001b3ull;
  return mix64(h);
}

typedef struct hashed_entry {
  uint32_t col;
  double value;
} hashed_entry;

static int entry_cmp(const void *x, const void *y) {
  uint32_t a = ((const hashed_entry *)x)->col, b = ((const hashed_entry *)y)->col;
  return a < b ? -1 : a > b;
}

/* Appends a feature of hash h and value v to the row being parsed (ps->idx, ps->values):
 * column h mod 2^bits, signed by the top bit (so that collisions cancel on average). */
static fl_status hashed_append(parse_state *ps, uint64_t h, double v) {
  const ml_load_text_arg *a = ps->arg;
  uint32_t col = (uint32_t)(h & (((uint64_t)1 << a->hash_bits) - 1));
  double signed_v = (h >> 63) ? -v : v;
  fl_status s = fl_buf_append(&ps->idx, &col, 4);
  if (s == FL_OK) s = fl_buf_append(&ps->values, &signed_v, 8);
  return s;
}

/* Sorts the hashed row by column and adds up the values that met in one (dropping sums of
 * 0), as the builder wants strictly ascending columns. */
static fl_status hashed_finish(parse_state *ps, uint32_t *nnz) {
  size_t n = ps->idx.len / 4;
  hashed_entry *e = malloc((n ? n : 1) * sizeof *e);
  if (!e) return fl_set_error(FL_ENOMEM, "ml load: out of memory for a row of %zu features", n);
  const uint32_t *cols = (const uint32_t *)ps->idx.data;
  const double *vals = (const double *)ps->values.data;
  for (size_t i = 0; i < n; i++) e[i] = (hashed_entry){cols[i], vals[i]};
  qsort(e, n, sizeof *e, entry_cmp);
  uint32_t *oc = (uint32_t *)ps->idx.data;
  double *ov = (double *)ps->values.data;
  size_t m = 0;
  for (size_t i = 0; i < n;) {
    uint32_t c = e[i].col;
    double sum = 0;
    for (; i < n && e[i].col == c; i++) sum += e[i].value;
    if (sum != 0) oc[m] = c, ov[m] = sum, m++;
  }
  free(e);
  ps->idx.len = m * 4;
  ps->values.len = m * 8;
  *nnz = (uint32_t)m;
  return FL_OK;
}

/* LIBSVM with hash_bits: the parsed (index, value) pairs become hashed columns. */
static fl_status hash_libsvm_row(parse_state *ps, uint32_t *nnz) {
  size_t n = ps->idx.len / 4;
  fl_buf idx = ps->idx, values = ps->values;
  ps->idx = (fl_buf)FL_BUF_INIT;
  ps->values = (fl_buf)FL_BUF_INIT;
  fl_status s = FL_OK;
  for (size_t i = 0; i < n && s == FL_OK; i++) {
    uint32_t index;
    double v;
    memcpy(&index, idx.data + 4 * i, 4);
    memcpy(&v, values.data + 8 * i, 8);
    s = hashed_append(ps, mix64(index), v);
  }
  fl_buf_free(&idx);
  fl_buf_free(&values);
  return s == FL_OK ? hashed_finish(ps, nnz) : s;
}

/* TEXT: "LABEL TOKEN TOKEN ...", every token a feature of value 1. */
static fl_status parse_text(parse_state *ps, char *line, double *label, uint32_t *nnz) {
  ps->idx.len = ps->values.len = 0;
  char *save = NULL, *tok = strtok_r(line, " \t", &save);
  if (!parse_double(tok, label) || !isfinite(*label)) {
    snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "bad label '%.64s' (a text line is LABEL TOKEN TOKEN ...)", tok);
    return FL_EFORMAT;
  }
  fl_status s = FL_OK;
  while (s == FL_OK && (tok = strtok_r(NULL, " \t", &save))) s = hashed_append(ps, token_hash(tok), 1.0);
  return s == FL_OK ? hashed_finish(ps, nnz) : s;
}

/* Splits a CSV line in place into fields (trimmed of blanks that are not the delimiter). */
static uint32_t split_csv(char *line, char delim, char **fields, uint32_t max) {
  uint32_t n = 0;
  char *p = line;
  for (;;) {
    char *end = strchr(p, delim);
    if (end) *end = '\0';
    while (*p && *p != delim && (*p == ' ' || *p == '\t')) p++;
    size_t len = strlen(p);
    while (len && p[len - 1] != delim && (p[len - 1] == ' ' || p[len - 1] == '\t')) p[--len] = '\0';
    if (n < max) fields[n] = p;
    n++;
    if (!end) break;
    p = end + 1;
  }
  return n;
}

static fl_status parse_csv(parse_state *ps, char *line, double *label) {
  const ml_load_text_arg *a = ps->arg;
  ps->values.len = 0;
  fl_status s = fl_buf_reserve(&ps->values, (size_t)a->fields * (sizeof(char *) + 8));
  if (s != FL_OK) return s;
  /* The field pointers live after the row's values in the same buffer. */
  double *x = (double *)ps->values.data;
  char **fields = (char **)(ps->values.data + (size_t)a->fields * 8);
  uint32_t n = split_csv(line, a->delimiter, fields, a->fields);
  if (n != a->fields) {
    snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "expected %u fields, found %u", a->fields, n);
    return FL_EFORMAT;
  }
  uint32_t k = 0;
  for (uint32_t f = 0; f < n; f++) {
    double v;
    if (!*fields[f]) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "field %u is empty", f + 1);
      return FL_EFORMAT;
    }
    if (!parse_double(fields[f], &v)) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "field %u '%.64s' is not a number", f + 1, fields[f]);
      return FL_EFORMAT;
    }
    if (!isfinite(v)) {
      snprintf(ps->cause, ML_LOAD_CAUSE_MAX, "field %u '%.64s' is not finite", f + 1, fields[f]);
      return FL_EFORMAT;
    }
    if (f == a->label_field) *label = v;
    else x[k++] = v;
  }
  return FL_OK;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* One int64 record per partition: its number of lines. */
FL_ML_KERNEL fl_status ml_load_count_lines(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  (void)arg;
  int64_t n = 0;
  fl_bytes line;
  while (fl_iter_next(in, &line)) n++;
  return fl_emit(out, &n, 8);
}

static fl_status emit_block(fl_ml_block_builder *b, fl_buf *rec, fl_emitter *out) {
  fl_status s = fl_ml_block_builder_take(b, rec);
  if (s == FL_OK && rec->len) s = fl_emit(out, rec->data, rec->len);
  return s;
}

/* Parses one partition of text lines into row blocks. */
FL_ML_KERNEL fl_status ml_load_parse_text(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  const ml_load_text_arg *a = arg;
  if (partition >= a->num_parts)
    return fl_set_error(FL_EINTERNAL, "ml load: partition %u of %u", partition, a->num_parts);
  uint32_t file = arg_file_of(a, partition);
  const char *name = arg_name(a, file);
  uint64_t line_no = arg_first_line(a, partition);
  bool libsvm = a->format == FL_ML_LIBSVM, text_format = a->format == FL_ML_TEXT, noted = false;
  bool sparse = libsvm || text_format;
  fl_ml_block_builder *b = NULL;
  fl_status s = fl_ml_block_builder_create(sparse ? a->num_features : a->fields - 1, sparse, false,
                                           a->rows_per_block, &b);
  if (s != FL_OK) return s;
  parse_state ps = {.arg = a};
  fl_buf text = FL_BUF_INIT, rec = FL_BUF_INIT;
  fl_bytes line;
  while (s == FL_OK && fl_iter_next(in, &line)) {
    line_no++;
    if (a->format == FL_ML_CSV && a->header && line_no == 1) continue;
    text.len = 0;
    if ((s = fl_buf_append(&text, line.data, line.len)) != FL_OK || (s = fl_buf_append(&text, "", 1)) != FL_OK) break;
    char *t = (char *)text.data;
    if (memchr(t, '\0', line.len)) {
      snprintf(ps.cause, ML_LOAD_CAUSE_MAX, "a NUL byte in the line");
      s = FL_EFORMAT;
    } else {
      if (libsvm) {
        char *hash = strchr(t, '#');
        if (hash) *hash = '\0';
      }
      if (is_blank(t)) continue;
      double label = 0;
      uint32_t nnz = 0;
      s = libsvm ? parse_libsvm(&ps, t, &label, &nnz) : text_format ? parse_text(&ps, t, &label, &nnz)
                                                                 : parse_csv(&ps, t, &label);
      if (s == FL_OK && libsvm && a->hash_bits) s = hash_libsvm_row(&ps, &nnz);
      if (s == FL_OK && sparse)
        s = fl_ml_block_builder_add_sparse(b, label, 1, (const uint32_t *)ps.idx.data, (const double *)ps.values.data, nnz);
      else if (s == FL_OK)
        s = fl_ml_block_builder_add_dense(b, label, 1, (const double *)ps.values.data);
      if (s == FL_OK && fl_ml_block_builder_full(b)) s = emit_block(b, &rec, out);
    }
    if (s == FL_EFORMAT) {
      if (!noted) { /* lines come in order: a partition's first bad line is its smallest */
        char message[ML_LOAD_CAUSE_MAX + 512];
        snprintf(message, sizeof message, "%s:%llu: %s", name, (unsigned long long)line_no, ps.cause);
        s = ml_load_note_bad_line(a->bad_acc, a->first_acc, file, line_no, message);
        noted = true;
      } else {
        (void)fl_accumulator_add_i64(a->bad_acc, 1);
        s = FL_OK;
      }
      if (!a->skip_bad_lines) break; /* the load fails: the rest of the partition is moot */
    }
  }
  if (s == FL_OK) s = emit_block(b, &rec, out);
  fl_buf_free(&rec);
  fl_buf_free(&text);
  fl_buf_free(&ps.idx);
  fl_buf_free(&ps.values);
  fl_ml_block_builder_free(b);
  return s;
}

/* ---- dense storage of mostly dense LIBSVM -------------------------------------------------- */

/* Whether `rows` rows of `cols` features with `nnz` stored values take no more bytes dense
 * (8 a value) than in CSR (8 a row offset, 12 a non-zero): past about 2/3 non-zero. Dense
 * blocks also run BLAS instead of CSR loops. */
static bool dense_is_smaller(uint64_t rows, uint32_t cols, uint64_t nnz) {
  return rows > 0 && cols > 0 && (unsigned __int128)rows * cols * 8 <= (unsigned __int128)(rows + 1) * 8 + (unsigned __int128)nnz * 12;
}

/* Rewrites each sparse block of a partition dense, `cols` (the argument, u32) wide; dense
 * blocks pass through. */
FL_ML_KERNEL fl_status ml_load_densify(uint32_t partition, fl_iter *in, fl_emitter *out, const void *arg) {
  (void)partition;
  uint32_t cols;
  memcpy(&cols, arg, sizeof cols);
  double *row = calloc(cols, sizeof *row);
  if (!row) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_status s = FL_OK;
  fl_buf scratch = FL_BUF_INIT, rec_out = FL_BUF_INIT;
  fl_bytes rec;
  while (s == FL_OK && fl_iter_next(in, &rec)) {
    fl_ml_block b;
    if ((s = fl_ml_block_view(rec, &scratch, &b)) != FL_OK) break;
    if (b.cols > cols || (!b.sparse && b.cols != cols)) {
      s = fl_set_error(FL_EINVAL, "a row block has %u features, the data %u", b.cols, cols);
      break;
    }
    if (!b.sparse || b.rows == 0) {
      s = fl_emit(out, rec.data, rec.len);
      continue;
    }
    fl_ml_block_builder *bb = NULL;
    if ((s = fl_ml_block_builder_create(cols, false, b.weights != NULL, b.rows, &bb)) != FL_OK) break;
    for (uint32_t i = 0; s == FL_OK && i < b.rows; i++) {
      for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) row[b.col[k]] = b.x[k];
      s = fl_ml_block_builder_add_dense(bb, b.labels[i], b.weights ? b.weights[i] : 1.0, row);
      for (uint64_t k = b.row_ptr[i]; k < b.row_ptr[i + 1]; k++) row[b.col[k]] = 0;
    }
    if (s == FL_OK && (s = fl_ml_block_builder_take(bb, &rec_out)) == FL_OK && rec_out.len)
      s = fl_emit(out, rec_out.data, rec_out.len);
    fl_ml_block_builder_free(bb);
  }
  fl_buf_free(&rec_out);
  fl_buf_free(&scratch);
  free(row);
  return s;
}

/* Replaces a loaded sparse data set that is mostly non-zero (as a whole: its blocks stay one
 * kind) with dense blocks of data->cols columns. The width is known only after the first
 * describing job, hence a second pass, over the cached sparse blocks (no parsing); the
 * sparse blocks are then unpersisted, and a lost dense block is made again from lineage. */
static fl_status densify(fl_ml_data *data) {
  fl_dataset *dense = NULL;
  uint32_t cols = data->cols;
  fl_status s = fl_map_partitions(data->blocks, ml_load_densify, &cols, sizeof cols, &dense);
  if (s == FL_OK) s = fl_persist(dense, ML_STORAGE);
  if (s != FL_OK) {
    fl_dataset_free(dense);
    return s;
  }
  fl_dataset *sparse = data->blocks;
  data->blocks = dense;
  s = ml_data_describe(data, NULL);
  (void)fl_unpersist(sparse);
  fl_dataset_free(sparse);
  return s;
}

/* Says on stderr, once per loaded data set, how much of it did not fit in the memory for
 * cached blocks (the block manager's line names only its first block): those blocks are
 * read from local disk in every pass, or (a level without disk) recomputed. */
static void format_bytes(uint64_t n, char *buf, size_t len) {
  if (n < (1ull << 20)) snprintf(buf, len, "%.1f KiB", (double)n / 1024);
  else if (n < (1ull << 30)) snprintf(buf, len, "%.1f MiB", (double)n / (1 << 20));
  else snprintf(buf, len, "%.2f GiB", (double)n / (1ull << 30));
}

static void warn_if_not_in_memory(const char *path, const fl_ml_data *data) {
  fl_storage_info info;
  if (fl_storage_info_get(data->blocks, &info) != FL_OK) return;
  uint32_t missing = info.partitions - info.cached_partitions;
  if (info.disk_bytes == 0 && missing == 0) return;
  char mem[32], disk[32], lost[96] = "";
  format_bytes(info.memory_bytes, mem, sizeof mem);
  format_bytes(info.disk_bytes, disk, sizeof disk);
  if (missing) snprintf(lost, sizeof lost, "; %u of %u partitions are not cached and are recomputed", missing, info.partitions);
  fprintf(stderr,
          "flint ml: warning: %s does not fit in the memory for cached blocks: %s of its row blocks are in memory "
          "and %s (LZ4) on local disk, which every pass reads%s. More memory keeps it all in memory (FLINT_MEMORY, "
          "fl_options.memory_limit, an executor's --memory)\n",
          path, mem, disk, lost);
}

/* ---- the client's side of text ------------------------------------------------------------ */

typedef struct file_list {
  char **paths;
  uint64_t *sizes;
  uint32_t count, cap;
} file_list;

static void file_list_free(file_list *l) {
  for (uint32_t i = 0; i < l->count; i++) free(l->paths[i]);
  free(l->paths);
  free(l->sizes);
  memset(l, 0, sizeof *l);
}

/* Adds a regular file (others are skipped, as fl_text_file skips them). */
static fl_status file_list_add(file_list *l, const char *path, bool must_exist) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (!must_exist) return FL_OK;
    return fl_set_error(errno == ENOENT ? FL_ENOENT : FL_EIO, "cannot read %s: %s", path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) return FL_OK;
  if (l->count == l->cap) {
    uint32_t cap = l->cap ? l->cap * 2 : 8;
    char **paths = realloc(l->paths, cap * sizeof *paths);
    if (!paths) return fl_set_error(FL_ENOMEM, "out of memory listing files");
    l->paths = paths;
    uint64_t *sizes = realloc(l->sizes, cap * sizeof *sizes);
    if (!sizes) return fl_set_error(FL_ENOMEM, "out of memory listing files");
    l->sizes = sizes;
    l->cap = cap;
  }
  if (!(l->paths[l->count] = strdup(path))) return fl_set_error(FL_ENOMEM, "out of memory listing files");
  l->sizes[l->count++] = (uint64_t)st.st_size;
  return FL_OK;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The files fl_text_file would read for `path`, in its order. */
static fl_status list_files(const char *path, file_list *out) {
  struct stat st;
  fl_status s = FL_OK;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return fl_set_error(FL_EIO, "cannot open folder %s: %s", path, strerror(errno));
    struct dirent *e;
    char full[4096];
    while (s == FL_OK && (e = readdir(d))) {
      if (e->d_name[0] == '.' || e->d_name[0] == '_') continue;
      if ((size_t)snprintf(full, sizeof full, "%s/%s", path, e->d_name) >= sizeof full)
        s = fl_set_error(FL_ELIMIT, "path %s/%s is too long", path, e->d_name);
      else
        s = file_list_add(out, full, false);
    }
    closedir(d);
    if (s == FL_OK && out->count == 0) s = fl_set_error(FL_ENOENT, "no files in folder %s", path);
    if (s == FL_OK) {
      /* Sort names and sizes together: sort the names, then look the sizes up again. */
      qsort(out->paths, out->count, sizeof *out->paths, compare_names);
      for (uint32_t i = 0; i < out->count; i++)
        out->sizes[i] = stat(out->paths[i], &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    return s;
  }
  if (strpbrk(path, "*?[")) {
    glob_t g;
    int rc = glob(path, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH) return fl_set_error(FL_ENOENT, "no files match %s", path);
    if (rc != 0) return fl_set_error(FL_EIO, "cannot expand %s", path);
    for (size_t i = 0; i < g.gl_pathc && s == FL_OK; i++) s = file_list_add(out, g.gl_pathv[i], false);
    globfree(&g);
    if (s == FL_OK && out->count == 0) s = fl_set_error(FL_ENOENT, "no files match %s", path);
    return s;
  }
  return file_list_add(out, path, true);
}

/* Where the text dataset's lines come from: per partition, its file and first line. */
typedef struct line_map {
  uint32_t parts;
  uint32_t *file_of;
  uint64_t *first_line, *count;
} line_map;

static void line_map_free(line_map *m) {
  free(m->file_of);
  free(m->first_line);
  free(m->count);
  memset(m, 0, sizeof *m);
}

/* Reads every file with its own fl_text_file, joined by fl_union, and counts the lines of
 * each partition (one job). */
static fl_status open_lines(fl_context *ctx, const file_list *files, uint32_t parts, fl_dataset **lines,
                            line_map *map) {
  uint64_t plain = 0;
  for (uint32_t i = 0; i < files->count; i++)
    if (!ml_is_gzip_name(files->paths[i])) plain += files->sizes[i];
  fl_status s = FL_OK;
  fl_dataset *all = NULL, *counts_ds = NULL;
  fl_records *counts = NULL;
  uint32_t *file_parts = calloc(files->count, sizeof *file_parts);
  if (!file_parts) return fl_set_error(FL_ENOMEM, "out of memory");
  for (uint32_t i = 0; i < files->count && s == FL_OK; i++) {
    uint64_t share = plain ? (uint64_t)parts * files->sizes[i] / plain : 1;
    fl_dataset *one = NULL, *joined = NULL;
    s = fl_text_file(ctx, files->paths[i], share ? (uint32_t)share : 1, &one);
    if (s != FL_OK) break;
    file_parts[i] = fl_dataset_partitions(one);
    if (!all) {
      all = one;
      continue;
    }
    s = fl_union(all, one, &joined);
    fl_dataset_free(one);
    fl_dataset_free(all);
    all = joined;
  }
  if (s == FL_OK) s = fl_map_partitions(all, ml_load_count_lines, NULL, 0, &counts_ds);
  if (s == FL_OK) s = fl_collect(counts_ds, &counts);
  uint32_t n = all ? fl_dataset_partitions(all) : 0;
  if (s == FL_OK && fl_records_count(counts) != n)
    s = fl_set_error(FL_EINTERNAL, "line counts of %zu partitions, expected %u", fl_records_count(counts), n);
  if (s == FL_OK) {
    map->parts = n;
    map->file_of = calloc(n ? n : 1, sizeof *map->file_of);
    map->first_line = calloc(n ? n : 1, sizeof *map->first_line);
    map->count = calloc(n ? n : 1, sizeof *map->count);
    if (!map->file_of || !map->first_line || !map->count) s = fl_set_error(FL_ENOMEM, "out of memory");
  }
  if (s == FL_OK) {
    uint32_t p = 0;
    for (uint32_t f = 0; f < files->count; f++) {
      uint64_t line = 0;
      for (uint32_t k = 0; k < file_parts[f]; k++, p++) {
        map->file_of[p] = f;
        map->first_line[p] = line;
        map->count[p] = (uint64_t)fl_i64(fl_records_get(counts, p));
        line += map->count[p];
      }
    }
    *lines = all;
    all = NULL;
  } else {
    line_map_free(map);
  }
  fl_records_free(counts);
  fl_dataset_free(counts_ds);
  fl_dataset_free(all);
  free(file_parts);
  return s;
}

/* CSV: the field count and label field, from the first data line. */
static fl_status csv_shape(fl_dataset *lines, const line_map *map, const file_list *files, const fl_ml_load_options *o,
                           char delim, uint32_t *fields, uint32_t *label_field) {
  uint64_t total = 0;
  for (uint32_t p = 0; p < map->parts; p++) total += map->count[p];
  fl_status s = FL_OK;
  fl_buf text = FL_BUF_INIT;
  bool found = false;
  uint64_t want = 16;
  uint64_t skipped_until = 0; /* lines known to hold no data */
  while (s == FL_OK && !found && skipped_until < total) {
    if (want > total) want = total;
    fl_records *r = NULL;
    if ((s = fl_take(lines, (size_t)want, &r)) != FL_OK) break;
    uint32_t p = 0;
    uint64_t before = 0; /* lines of the partitions before p */
    for (uint64_t g = 0; g < fl_records_count(r) && !found && s == FL_OK; g++) {
      while (p < map->parts && g >= before + map->count[p]) before += map->count[p++];
      uint64_t line_no = map->first_line[p] + (g - before) + 1;
      if (g < skipped_until || (o->header && line_no == 1)) continue;
      fl_bytes b = fl_records_get(r, g);
      text.len = 0;
      if ((s = fl_buf_append(&text, b.data, b.len)) != FL_OK || (s = fl_buf_append(&text, "", 1)) != FL_OK) break;
      if (is_blank((char *)text.data)) continue;
      found = true;
      uint32_t n = split_csv((char *)text.data, delim, NULL, 0);
      const char *name = files->paths[map->file_of[p]];
      if (n < 2)
        s = fl_set_error(FL_EFORMAT, "%s:%llu: a CSV line needs a label and a feature, found %u field", name,
                         (unsigned long long)line_no, n);
      else if (o->label_column >= (int64_t)n)
        s = fl_set_error(FL_EINVAL, "%s:%llu: label_column %d out of range (the line has %u fields)", name,
                         (unsigned long long)line_no, o->label_column, n);
      *fields = n;
      *label_field = o->label_column < 0 ? n - 1 : (uint32_t)o->label_column;
    }
    bool short_take = fl_records_count(r) < want;
    skipped_until = fl_records_count(r);
    fl_records_free(r);
    if (short_take) break;
    want *= 4;
  }
  fl_buf_free(&text);
  if (s == FL_OK && !found) s = fl_set_error(FL_EEMPTY, "%s: no data lines", files->count ? files->paths[0] : "");
  return s;
}

/* The kernel's argument blob (see ml_load_text_arg). */
static fl_status text_arg(const ml_load_text_arg *head, const line_map *map, const file_list *files, fl_buf *out) {
  fl_status s = fl_buf_append(out, head, sizeof *head);
  for (uint32_t p = 0; p < map->parts && s == FL_OK; p++) s = fl_buf_append(out, &map->first_line[p], 8);
  for (uint32_t p = 0; p < map->parts && s == FL_OK; p++) s = fl_buf_append(out, &map->file_of[p], 4);
  uint32_t at = 0;
  for (uint32_t f = 0; f < files->count && s == FL_OK; f++) {
    s = fl_buf_append(out, &at, 4);
    at += (uint32_t)strlen(files->paths[f]) + 1;
  }
  for (uint32_t f = 0; f < files->count && s == FL_OK; f++)
    s = fl_buf_append(out, files->paths[f], strlen(files->paths[f]) + 1);
  return s;
}

static fl_status load_text(fl_context *ctx, const char *path, fl_ml_format format, const fl_ml_load_options *o,
                           uint32_t parts, fl_ml_data *data) {
  file_list files = {0};
  line_map map = {0};
  fl_dataset *lines = NULL, *parsed = NULL;
  fl_accumulator *bad = NULL, *first = NULL;
  fl_buf arg = FL_BUF_INIT, first_value = FL_BUF_INIT;
  ml_load_text_arg head = {.format = (uint32_t)format, .rows_per_block = o->rows_per_block,
                           .num_features = o->hash_bits ? 1u << o->hash_bits
                                           : format == FL_ML_LIBSVM ? o->num_features : 0,
                           .hash_bits = o->hash_bits,
                           .delimiter = o->delimiter ? o->delimiter : ',', .zero_based = o->zero_based,
                           .header = o->header, .skip_bad_lines = o->skip_bad_lines};
  fl_status s = list_files(path, &files);
  if (s == FL_OK) s = open_lines(ctx, &files, parts, &lines, &map);
  if (s == FL_OK && format == FL_ML_CSV)
    s = csv_shape(lines, &map, &files, o, head.delimiter, &head.fields, &head.label_field);
  if (s == FL_OK) {
    ml_bad_line none = ML_BAD_LINE_NONE;
    s = fl_accumulator_create_i64(ctx, &bad);
    if (s == FL_OK)
      s = fl_accumulator_create(ctx, fl_bytes_of(&none, sizeof none), ml_load_first_bad_line, NULL, 0, &first);
    if (s == FL_OK) {
      head.bad_acc = fl_accumulator_id(bad);
      head.first_acc = fl_accumulator_id(first);
    }
  }
  if (s == FL_OK) {
    head.num_parts = map.parts;
    head.num_files = files.count;
    s = text_arg(&head, &map, &files, &arg);
  }
  if (s == FL_OK) s = fl_map_partitions(lines, ml_load_parse_text, arg.data, arg.len, &parsed);
  if (s == FL_OK) {
    if (fl_dataset_partitions(parsed) > parts) {
      s = fl_coalesce(parsed, parts, &data->blocks);
    } else {
      data->blocks = parsed;
      parsed = NULL;
    }
  }
  data->cols = head.num_features;
  uint64_t nnz = 0;
  if (s == FL_OK) s = fl_persist(data->blocks, ML_STORAGE);
  if (s == FL_OK) s = ml_data_describe(data, &nnz);
  if (s == FL_OK && data->sparse && dense_is_smaller(data->rows, data->cols, nnz)) s = densify(data);
  int64_t bad_lines = 0;
  if (s == FL_OK) s = fl_accumulator_value_i64(bad, &bad_lines);
  if (s == FL_OK && bad_lines > 0) s = fl_accumulator_value(first, &first_value);
  if (s == FL_OK && bad_lines > 0) {
    const char *message = (const char *)first_value.data + sizeof(ml_bad_line);
    int len = first_value.len > sizeof(ml_bad_line) ? (int)(first_value.len - sizeof(ml_bad_line)) : 0;
    if (!o->skip_bad_lines)
      s = fl_set_error(FL_EFORMAT, "%.*s", len, message);
    else
      fprintf(stderr, "flint ml: skipped %lld bad lines of %s (first: %.*s)\n", (long long)bad_lines, path, len,
              message);
    data->skipped = (uint64_t)bad_lines;
  }
  if (s == FL_OK && data->rows == 0)
    s = fl_set_error(FL_EEMPTY, "%s: no rows (%llu bad lines skipped)", path, (unsigned long long)data->skipped);
  fl_buf_free(&first_value);
  fl_buf_free(&arg);
  fl_accumulator_destroy(first);
  fl_accumulator_destroy(bad);
  fl_dataset_free(parsed);
  fl_dataset_free(lines);
  line_map_free(&map);
  file_list_free(&files);
  return s;
}

/* ---- entry points ------------------------------------------------------------------------ */

fl_status fl_ml_format_parse(const char *name, fl_ml_format *out) {
  if (!out) return fl_set_error(FL_EINVAL, "fl_ml_format_parse: NULL out");
  static const struct {
    const char *name;
    fl_ml_format format;
  } formats[] = {{"libsvm", FL_ML_LIBSVM}, {"csv", FL_ML_CSV}, {"idx", FL_ML_IDX}, {"text", FL_ML_TEXT}};
  for (size_t i = 0; name && i < sizeof formats / sizeof formats[0]; i++)
    if (strcmp(name, formats[i].name) == 0) {
      *out = formats[i].format;
      return FL_OK;
    }
  return fl_set_error(FL_EINVAL, "unknown data format '%s' (choose libsvm, csv, idx or text)", name ? name : "(null)");
}

fl_status fl_ml_load(fl_context *ctx, const char *path, fl_ml_format format, const fl_ml_load_options *opt,
                     fl_ml_data **out) {
  if (!ctx || !path || !out) return fl_set_error(FL_EINVAL, "fl_ml_load: NULL %s", !ctx ? "ctx" : !path ? "path" : "out");
  if (format != FL_ML_LIBSVM && format != FL_ML_CSV && format != FL_ML_IDX && format != FL_ML_TEXT)
    return fl_set_error(FL_EINVAL, "fl_ml_load: unknown format %d (FL_ML_LIBSVM, FL_ML_CSV, FL_ML_IDX or FL_ML_TEXT)",
                        (int)format);
  fl_ml_load_options o = {0};
  if (opt) o = *opt;
  if (o.hash_bits > 31) return fl_set_error(FL_EINVAL, "fl_ml_load: hash_bits %u (1 to 31)", o.hash_bits);
  if (o.hash_bits && format != FL_ML_LIBSVM && format != FL_ML_TEXT)
    return fl_set_error(FL_EINVAL, "fl_ml_load: hash_bits is for libsvm and text data");
  if (o.hash_bits && o.num_features)
    return fl_set_error(FL_EINVAL, "fl_ml_load: num_features %u with hash_bits %u (hashed rows are 2^hash_bits wide)",
                        o.num_features, o.hash_bits);
  if (format == FL_ML_TEXT && !o.hash_bits)
    return fl_set_error(FL_EINVAL, "fl_ml_load: text data needs hash_bits (its tokens become columns by hashing)");
  if (o.label_column < -1)
    return fl_set_error(FL_EINVAL, "fl_ml_load: label_column %d (a 0-based column, or -1 for the last)", o.label_column);
  if (o.delimiter && (isdigit((unsigned char)o.delimiter) || strchr(".+-\n\r", o.delimiter)))
    return fl_set_error(FL_EINVAL, "fl_ml_load: delimiter '%c' would split numbers or lines", o.delimiter);
  if (!isfinite(o.pixel_scale)) return fl_set_error(FL_EINVAL, "fl_ml_load: pixel_scale is not finite");
  uint32_t parts = ml_default_partitions(ctx, o.partitions);
  fl_ml_data *data = calloc(1, sizeof *data);
  if (!data) return fl_set_error(FL_ENOMEM, "out of memory");
  fl_status s = format == FL_ML_IDX ? ml_load_idx(ctx, path, &o, parts, data) : load_text(ctx, path, format, &o, parts, data);
  if (s == FL_OK) warn_if_not_in_memory(path, data);
  if (s != FL_OK) {
    fl_ml_data_free(data);
    return s;
  }
  *out = data;
  return FL_OK;
}
