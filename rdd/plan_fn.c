/*
 * plan_fn.c: functions in plans, and the helpers every node codec uses.
 *
 * A function travels as (library id, symbol), found with dladdr() and named by the caller's
 * codec, or as the stable name of one of flint's own functions (the rdd_builtin tables of
 * each module), which are hidden and need no shipping. Decoding resolves the pair through
 * the plan's codec; without one (the driver, which never runs user code) a function gets a
 * placeholder that aborts if it is ever called.
 *
 * protobuf-c allocates through flint's allocator here, so that out-of-memory injection
 * reaches decoding and a NULL from an unpack can be told apart from bad input.
 */
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "rdd/plan_internal.h"

/* ---- protobuf-c through flint's allocator ------------------------------------------------ */

/* protobuf-c answers NULL both for bad input and for no memory: this tells them apart. */
static _Thread_local bool pb_out_of_memory;

static void *pb_alloc(void *data, size_t size) {
  (void)data;
  void *p = common_malloc(size ? size : 1);
  if (!p) pb_out_of_memory = true;
  return p;
}
static void pb_free(void *data, void *p) {
  (void)data;
  common_free(p);
}
ProtobufCAllocator rdd_plan_pb_allocator = {pb_alloc, pb_free, NULL};

void rdd_plan_unpack_start(void) { pb_out_of_memory = false; }

fl_status rdd_plan_unpack_failed(const char *what, size_t len) {
  if (pb_out_of_memory) return FL_ERR(FL_ENOMEM, "out of memory decoding %s (%zu bytes)", what, len);
  return fl_set_error(FL_EPROTO, "bad plan: %s (%zu bytes) is not well-formed", what, len);
}

/* ---- encoding ----------------------------------------------------------------------------- */

void *rdd_plan_enc_alloc(rdd_plan_enc *e, size_t size) {
  if (e->num_allocs == e->cap_allocs) {
    size_t cap = e->cap_allocs ? e->cap_allocs * 2 : 16;
    void **grown = common_realloc(e->allocs, cap * sizeof *grown);
    if (!grown) return NULL;
    e->allocs = grown;
    e->cap_allocs = cap;
  }
  void *p = common_calloc(1, size ? size : 1);
  if (p) e->allocs[e->num_allocs++] = p;
  return p;
}

void rdd_plan_enc_reset(rdd_plan_enc *e) {
  for (size_t i = 0; i < e->num_allocs; i++) common_free(e->allocs[i]);
  e->num_allocs = 0;
}

void rdd_plan_enc_free(rdd_plan_enc *e) {
  rdd_plan_enc_reset(e);
  common_free(e->allocs);
  e->allocs = NULL;
  e->cap_allocs = 0;
}

fl_status rdd_plan_enc_nomem(void) { return FL_ERR(FL_ENOMEM, "out of memory encoding a plan"); }

static char *enc_strdup(rdd_plan_enc *e, const char *s) {
  size_t n = strlen(s) + 1;
  char *c = rdd_plan_enc_alloc(e, n);
  if (c) memcpy(c, s, n);
  return c;
}

static const char *of_what(const rdd_plan_enc *e, char *buf, size_t len) {
  if (e->id) snprintf(buf, len, "of dataset %llu", (unsigned long long)e->id);
  else snprintf(buf, len, "of the action");
  return buf;
}

/* ---- the main program's address range ------------------------------------------------------- */

static uintptr_t main_lo, main_hi;
static pthread_once_t main_once = PTHREAD_ONCE_INIT;

/* The first object dl_iterate_phdr reports is the main program. */
static int main_range_cb(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size, (void)data;
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD) continue;
    uintptr_t a = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
    if (a < lo) lo = a;
    if (a + ph->p_memsz > hi) hi = a + ph->p_memsz;
  }
  if (lo < hi) {
    main_lo = lo;
    main_hi = hi;
  }
  return 1;
}

static void main_range_init(void) { dl_iterate_phdr(main_range_cb, NULL); }

static bool in_main_program(const void *addr) {
  pthread_once(&main_once, main_range_init);
  return (uintptr_t)addr >= main_lo && (uintptr_t)addr < main_hi;
}

/* ---- naming a function -------------------------------------------------------------------- */

fl_status rdd_plan_encode_fn(rdd_plan_enc *e, void (*fn)(void), const char *what, Flint__PlanFn **out) {
  *out = NULL;
  if (!fn) return FL_OK;
  Flint__PlanFn *m = rdd_plan_enc_alloc(e, sizeof *m);
  if (!m) return rdd_plan_enc_nomem();
  flint__plan_fn__init(m);
  char whose[64];
  const rdd_builtin *b = rdd_plan_builtin_by_fn(fn);
  if (b) {
    m->builtin = (char *)b->name;
    *out = m;
    return FL_OK;
  }
  void *addr = (void *)(uintptr_t)fn;
  Dl_info info;
  if (!dladdr(addr, &info) || !info.dli_fname || !info.dli_fbase)
    return FL_ERR(FL_EINVAL, "%s function at %p %s is in no loaded program or library", what, addr,
                  of_what(e, whose, sizeof whose));
  const char *base = strrchr(info.dli_fname, '/');
  base = base ? base + 1 : info.dli_fname;
  if (!info.dli_sname || info.dli_saddr != addr)
    return FL_ERR(FL_EINVAL,
                  "%s function at %s+0x%lx %s is not exported: make it non-static with default "
                  "visibility",
                  what, base, (unsigned long)((uintptr_t)addr - (uintptr_t)info.dli_fbase),
                  of_what(e, whose, sizeof whose));
  if (strlen(info.dli_sname) >= RDD_PLAN_MAX_NAME)
    return FL_ERR(FL_ELIMIT, "%s function '%.64s...' %s: its name is longer than %d bytes", what,
                  info.dli_sname, of_what(e, whose, sizeof whose), RDD_PLAN_MAX_NAME - 1);
  if (!e->codec || !e->codec->library_id)
    return FL_ERR(FL_EINVAL, "%s function '%s' %s: no codec to name its library %s", what,
                  info.dli_sname, of_what(e, whose, sizeof whose), base);
  char id[RDD_PLAN_MAX_NAME];
  id[0] = '\0';
  fl_status s = e->codec->library_id(e->codec->arg, info.dli_fname, in_main_program(addr), id,
                                     sizeof id);
  if (s != FL_OK)
    return common_error_wrap(s, "%s function '%s' %s: ", what, info.dli_sname,
                             of_what(e, whose, sizeof whose));
  if (!id[0] || !memchr(id, '\0', sizeof id))
    return FL_ERR(FL_EINTERNAL, "%s function '%s' %s: the codec gave an empty or unterminated library id",
                  what, info.dli_sname, of_what(e, whose, sizeof whose));
  if (!(m->library = enc_strdup(e, id)) || !(m->symbol = enc_strdup(e, info.dli_sname)))
    return rdd_plan_enc_nomem();
  *out = m;
  return FL_OK;
}

/* ---- resolving a function ------------------------------------------------------------------ */

fl_status rdd_plan_bad(const rdd_plan_dec *d, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return fl_set_error(FL_EPROTO, "bad plan: %s: %s", d->what, msg);
}

rdd_plan *rdd_plan_dec_plan(const rdd_plan_dec *d) { return d->p; }

/* What unresolved functions point to on the driver, which never runs user code. */
static void plan_unresolved_fn(void) {
  common_assert_failed(__FILE__, __LINE__, "a function of a plan decoded without a resolver was called");
}

fl_status rdd_plan_decode_fn_builtin(rdd_plan_dec *d, const Flint__PlanFn *m, const char *what,
                                     void (**out)(void), const rdd_builtin **builtin) {
  *out = NULL;
  if (builtin) *builtin = NULL;
  if (!m) return FL_OK;
  bool has_builtin = m->builtin && m->builtin[0];
  bool has_lib = m->library && m->library[0], has_sym = m->symbol && m->symbol[0];
  if (has_builtin) {
    if (has_lib || has_sym) return rdd_plan_bad(d, "%s function names both a builtin and a library", what);
    const rdd_builtin *b = rdd_plan_builtin_by_name(m->builtin);
    if (!b) return rdd_plan_bad(d, "%s function: unknown builtin '%.100s'", what, m->builtin);
    if (builtin) *builtin = b;
    *out = b->fn;
    return FL_OK;
  }
  if (!has_lib || !has_sym) return rdd_plan_bad(d, "%s function lacks its library or symbol", what);
  if (strlen(m->library) >= RDD_PLAN_MAX_NAME || strlen(m->symbol) >= RDD_PLAN_MAX_NAME)
    return rdd_plan_bad(d, "%s function: library id or symbol longer than %d bytes", what,
                        RDD_PLAN_MAX_NAME - 1);
  const rdd_fn_codec *codec = rdd_plan_fn_codec(d->p);
  if (!codec || !codec->resolve) {
    *out = plan_unresolved_fn;
    return FL_OK;
  }
  void (*fn)(void) = NULL;
  fl_status s = codec->resolve(codec->arg, m->library, m->symbol, &fn);
  if (s != FL_OK)
    return common_error_wrap(s, "%s: cannot resolve %s function '%s' of library %s: ", d->what,
                             what, m->symbol, m->library);
  if (!fn)
    return fl_set_error(FL_ENOENT, "%s: %s function '%s' of library %s resolved to nothing",
                        d->what, what, m->symbol, m->library);
  *out = fn;
  return FL_OK;
}

fl_status rdd_plan_decode_fn(rdd_plan_dec *d, const Flint__PlanFn *m, const char *what,
                             void (**out)(void)) {
  return rdd_plan_decode_fn_builtin(d, m, what, out, NULL);
}
