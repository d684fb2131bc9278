/*
 * common.h: what every layer of flint may use. Errors and check macros, the replaceable
 * allocator, varints, time, seeded random numbers, and the spin-then-block queue used for
 * every hot hand-off between threads.
 */
#ifndef FLINT_COMMON_H
#define FLINT_COMMON_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flint/flint.h"

/* Everything declared here is hidden: libflint exports only the public API (include/flint/).
 * flint's add-on libraries (libflint_gpu) and the flint command use common.h too; what they
 * call keeps one copy per process because it is either stateless (common/error.c, random.c,
 * log.c and config.c are linked into them as well; the log's role is libflint's alone) or
 * inline over the public API (the allocator, the spin budget), and the thread's message, the
 * allocator's test hook and the trace switch live in libflint alone. (config_table.c keeps
 * flint-defaults.conf and --conf per copy: each copy reads the same file, and --conf reaches
 * the others through the environment.) */
#define FL_INTERNAL __attribute__((visibility("hidden")))

/* ---- errors ---------------------------------------------------------------------------- */

/* Logging for the long-running processes (driver, executor): one line with the local date
 * and time ("2026-11-28 09:20:01.123"), the level, the process's role ("driver", "executor
 * 3", set once by common_log_set_role) and the message, on stderr or appended to
 * FLINT_LOG_FILE (one write per line). Levels below FLINT_LOG (error, warn, info, debug;
 * default info) are dropped; an unknown level is warned about once and info used (the flint
 * command refuses to start on it instead: common_log_check). */
typedef enum common_log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } common_log_level;
FL_INTERNAL void common_log(common_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The most verbose level logged; LOG_DEBUG until the first common_log reads FLINT_LOG. */
FL_INTERNAL extern atomic_int common_log_threshold;
/* Whether `level` may be logged: one load and one branch, for lines built at some cost
 * (common_log itself checks again). */
static inline bool common_log_enabled(common_log_level level) {
  return (int)level <= atomic_load_explicit(&common_log_threshold, memory_order_relaxed);
}
/* FL_OK when FLINT_LOG is unset or a level, else FL_EINVAL naming the value and the levels. */
FL_INTERNAL fl_status common_log_check(void);
FL_INTERNAL void common_log_set_role(const char *role);
/* The role set last ("flint" before any), for the trace's lines. */
FL_INTERNAL const char *common_log_role(void);

/* The job path's timeline, for finding where a job's fixed cost goes (docs/design-notes.md,
 * "Where a cluster job's fixed cost goes"). With FLINT_TRACE=FILE set, every process that
 * inherits it (client, driver, executors) appends one line per event to FILE:
 * "<CLOCK_MONOTONIC us> <pid> <role> <thread> <event> <detail>", one write each, so lines of
 * processes on one host interleave whole and sort by time. scripts/trace-hops prints the
 * median delay between the events of a job. Off (one load and branch) without the variable;
 * a FILE that cannot be opened is reported once and tracing stays off. */
FL_INTERNAL bool common_trace_on(void);
FL_INTERNAL void common_trace(const char *event, const char *detail);
/* A task's event with its partition as the detail (task.start and task.end, as executors and
 * local mode run tasks). */
FL_INTERNAL void common_trace_partition(const char *event, uint32_t partition);
#define COMMON_TRACE(event, detail)                                                                \
  do {                                                                                             \
    if (common_trace_on()) common_trace((event), (detail));                                       \
  } while (0)

/* Sets the thread's message and returns `status`. Failures that are not the user's to fix
 * (FL_ENOMEM, FL_EINTERNAL) get the source position in front ("rdd/source.c:120: ...");
 * messages about input, files and state read as plain sentences that name the cause. */
#define FL_ERR(status, ...) common_error_at(__FILE__, __LINE__, (status), __VA_ARGS__)
FL_INTERNAL fl_status common_error_at(const char *file, int line, fl_status status,
                                      const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Puts `prefix` (formatted) in front of the thread's current message. Returns `status`. */
FL_INTERNAL fl_status common_error_wrap(fl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Clears the thread's message (at the start of every public call that can fail). */
FL_INTERNAL void common_error_clear(void);

/* Runs `call`; on failure stores its status in `status` and jumps to the cleanup label. */
#define FL_CHECK(call)                                                                       \
  do {                                                                                       \
    fl_status check_status_ = (call);                                                        \
    if (check_status_ != FL_OK) {                                                            \
      status = check_status_;                                                                \
      goto cleanup;                                                                          \
    }                                                                                        \
  } while (0)

/* Broken invariants are bugs: report and abort. Never for bad input. */
#define FL_ASSERT(cond)                                                                      \
  do {                                                                                       \
    if (!(cond)) common_assert_failed(__FILE__, __LINE__, #cond);                            \
  } while (0)
FL_INTERNAL _Noreturn void common_assert_failed(const char *file, int line, const char *what);

/* pthread calls that cannot fail on a correct program. */
#define FL_PCHECK(call) FL_ASSERT((call) == 0)

/* ---- memory: every allocation of flint goes through flint's allocator (common/alloc.c) -- */
static inline void *common_malloc(size_t size) { return fl_malloc(size); }
static inline void *common_calloc(size_t count, size_t size) { return fl_calloc(count, size); }
static inline void *common_realloc(void *p, size_t size) { return fl_realloc(p, size); }
static inline void common_free(void *p) { fl_free(p); }
static inline void *common_memdup(const void *p, size_t len) {
  void *q = fl_malloc(len);
  if (q && len) memcpy(q, p, len);
  return q;
}
static inline char *common_strdup(const char *s) { return (char *)common_memdup(s, strlen(s) + 1); }
/* A growing array with room for one more: `items` holds `count` items of `size` bytes in
 * *cap; when full, *cap doubles (from `first`). Returns the array (moved perhaps), or NULL
 * when out of memory, with `items` and *cap untouched. */
static inline void *common_grow(void *items, size_t size, size_t count, size_t *cap, size_t first) {
  if (count < *cap) return items;
  size_t grown_cap = *cap ? *cap * 2 : first;
  void *grown = fl_realloc(items, grown_cap * size);
  if (grown) *cap = grown_cap;
  return grown;
}
/* Test hook (unit tests link libflint's objects statically): the allocation after `n` more
 * successful ones fails (-1: never). */
FL_INTERNAL void flint_test_fail_alloc_after(long n);

/* ---- varints (LEB128) ------------------------------------------------------------------ */
#define COMMON_VARINT_MAX 10
static inline size_t common_varint_put(uint8_t *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}
/* Reads a varint from [p, end). Returns its length in bytes, or 0 if malformed/truncated. */
static inline size_t common_varint_get(const uint8_t *p, const uint8_t *end, uint64_t *v) {
  if (p < end && *p < 0x80) {
    *v = *p;
    return 1;
  }
  uint64_t r = 0;
  for (size_t i = 0; i < COMMON_VARINT_MAX && p + i < end; i++) {
    r |= (uint64_t)(p[i] & 0x7f) << (7 * i);
    if (!(p[i] & 0x80)) {
      *v = r;
      return i + 1;
    }
  }
  return 0;
}

/* ---- time ------------------------------------------------------------------------------ */
/* The monotonic clock in nanoseconds. Inline, so that flint's add-on libraries and the
 * benchmarks read it without a symbol of libflint. */
static inline uint64_t common_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
/* The monotonic clock in seconds, for durations and rates. */
static inline double common_now_s(void) { return (double)common_now_ns() * 1e-9; }

/* 64 unpredictable bits (getrandom; the clock and pid if the kernel has none to give), for
 * ids that must not repeat across processes and restarts. */
FL_INTERNAL uint64_t common_random_u64(void);

/* ---- little-endian fields of wire formats and files (the host order on every platform
 * flint supports; memcpy keeps unaligned offsets legal) ---------------------------------- */
static inline void common_put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static inline void common_put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void common_put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t common_get_u16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline uint32_t common_get_u32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t common_get_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* ---- checksums (common/crc32c.c) ------------------------------------------------------- */
/* CRC32C (Castagnoli) of data, continuing from crc (0 to start). Uses the SSE4.2 instruction
 * when the CPU has it and a table otherwise. Any thread. */
FL_INTERNAL uint32_t common_crc32c(uint32_t crc, const void *data, size_t len);

/* ---- seeded random numbers (xoshiro256**, seeded through splitmix64) ------------------- */
typedef struct common_rng {
  uint64_t s[4];
} common_rng;
FL_INTERNAL void common_rng_seed(common_rng *rng, uint64_t seed);
FL_INTERNAL uint64_t common_rng_next(common_rng *rng);
/* Uniform in [0, 1). */
FL_INTERNAL double common_rng_uniform(common_rng *rng);
/* Poisson(mean) by inversion for small means, normal approximation above 30. */
FL_INTERNAL uint32_t common_rng_poisson(common_rng *rng, double mean);
FL_INTERNAL uint64_t common_hash64(uint64_t x);
/* A 64-bit hash of a byte string (8 bytes a step through common_hash64). */
FL_INTERNAL uint64_t common_hash_bytes(const void *data, size_t len);

/* ---- queue: an intrusive FIFO with a spin-then-block pop ------------------------------- */
/*
 * Waking a sleeping thread costs 25-60 us on these machines while a spinning hand-off costs
 * well under one, so pop spins (yielding the core now and then) for a short while before it
 * sleeps on a condition variable. Only one popper of a queue spins at a time: the others
 * sleep at once, so that a pool of idle threads does not herd onto the queue's lock (and onto
 * the cores: eight rpc handler threads spinning after every call). Items embed a
 * common_qnode; the queue never allocates, so its depth is bounded by the items that exist
 * (tasks, events) and is reported.
 */
typedef struct common_qnode {
  struct common_qnode *next;
} common_qnode;

typedef struct common_queue {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  common_qnode *head, *tail;
  atomic_size_t depth;
  atomic_bool spinning; /* a popper spins now */
  int sleepers;
  bool closed;
} common_queue;

FL_INTERNAL void common_queue_init(common_queue *q);
FL_INTERNAL void common_queue_destroy(common_queue *q);
/* Never blocks (beyond the short lock). */
FL_INTERNAL void common_queue_push(common_queue *q, common_qnode *node);
/* Pushes the chain first..last (linked by next, count nodes) at once, with one wake-up: a
 * consumer that wakes per node would take the CPU back and forth with the producer. */
FL_INTERNAL void common_queue_push_chain(common_queue *q, common_qnode *first, common_qnode *last, size_t count);
/* Waits for an item; NULL once the queue is closed and empty. spin_ns: how long to spin. */
FL_INTERNAL common_qnode *common_queue_pop(common_queue *q, uint64_t spin_ns);
/* As pop, but returns NULL at deadline_ns (common_now_ns time) when nothing came. */
FL_INTERNAL common_qnode *common_queue_pop_until(common_queue *q, uint64_t spin_ns,
                                                 uint64_t deadline_ns);
/* Wakes every waiter; later pops return what is left, then NULL. */
FL_INTERNAL void common_queue_close(common_queue *q);

/* A one-shot flag that a thread can wait on the same way (spin, then block). */
typedef struct common_event {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  atomic_bool set;
} common_event;
FL_INTERNAL void common_event_init(common_event *e);
FL_INTERNAL void common_event_destroy(common_event *e);
FL_INTERNAL void common_event_set(common_event *e);
FL_INTERNAL void common_event_wait(common_event *e, uint64_t spin_ns);
/* Blocks until the event is set (true) or deadline_ns (common_now_ns time) passes (false). */
FL_INTERNAL bool common_event_wait_until(common_event *e, uint64_t deadline_ns);

/* How long hot hand-offs spin before they sleep is fl_spin_ns (flint.h; common/queue.c). */
/* Driver and executor processes call this at start: on a machine of at most 4 cores they do
 * not spin by default. Their hand-offs wait on the network anyway, and where a few cores run
 * several such processes (local-cluster) a spinning scheduler or task thread takes the core
 * that the thread it waits for needs. */
FL_INTERNAL void common_spin_default_for_server(void);

/* ---- crash guards (crash_guard.c) ------------------------------------------------------ */
/* Where a guarded call crashed. */
typedef struct common_crash {
  int signal;         /* SIGSEGV, SIGBUS, SIGFPE or SIGILL */
  char function[160]; /* the innermost named function outside libflint and libc, or "" */
  char library[160];  /* the base name of its file (else of the innermost such frame's), or "" */
  uintptr_t offset;   /* with no function: the innermost frame's offset in `library` */
} common_crash;
/* Installs the guard's handler of SIGSEGV, SIGBUS, SIGFPE and SIGILL, once per process and
 * for good (later calls return the first result). Those signals outside a guarded call go to
 * the handler installed before (or get the default action). Any thread; FL_EIO when
 * sigaction fails. */
FL_INTERNAL fl_status common_crash_guard_install(void);
/* Runs fn(arg) on this thread: true when it returned; false when it raised one of those
 * signals on this thread, which then ended it (siglongjmp): *crash says which and where.
 * What fn held (memory, locks) stays as the crash left it. Not nested; after
 * common_crash_guard_install. */
FL_INTERNAL bool common_crash_guard_run(void (*fn)(void *), void *arg, common_crash *crash);

/* ---- misc ------------------------------------------------------------------------------ */
/* Number of online cores (at least 1). */
FL_INTERNAL uint32_t common_cores(void);
/* fl_parse_size without the error message: false when `text` is not a size (config.c). */
FL_INTERNAL bool common_parse_size(const char *text, uint64_t *out);
/* A memory size as Spark reads one (--executor-memory, spark.executor.memory), the one reader
 * of `flint submit/executor --memory` and of the memory settings (FLINT_MEMORY,
 * FLINT_SHUFFLE_MEMORY): a bare number is MiB ("2048" is 2 GiB); else a number (one '.' at
 * most) and a unit of 1024s, b, k, m, g or t, alone or followed by "b" or "ib", in any case
 * ("64k", "1.5g", "1GiB"). No sign, space or exponent; 0 is 0 bytes, a fraction of a byte or
 * 2^62 bytes and more are not sizes. False (and *bytes untouched) when `text` is not one. */
FL_INTERNAL bool common_parse_memory(const char *text, uint64_t *bytes);
/* Name of the function at `fn` ("parse_line" or "0x7f..." when it has no symbol). Writes
 * into buf and returns it. */
FL_INTERNAL const char *common_symbol_name(const void *fn, char *buf, size_t len);
/* mkdir -p; rm -rf. */
FL_INTERNAL fl_status common_mkdirs(const char *path);
/* Appends a whole file to *out. FL_ENOENT when it is missing, FL_EIO naming it otherwise.
 * Blocks on disk. */
FL_INTERNAL fl_status common_read_file(const char *path, fl_buf *out);
/* Appends printf-formatted text to *b, with a NUL after it that b->len does not count (so
 * b->data is a string). FL_ENOMEM, or FL_EFORMAT for a format vsnprintf refuses. */
FL_INTERNAL fl_status common_buf_printf(fl_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FL_INTERNAL fl_status common_buf_vprintf(fl_buf *b, const char *fmt, va_list ap);
/* Writes all of data to fd (retrying short writes and EINTR); FL_EIO naming `what` and the
 * cause otherwise. */
FL_INTERNAL fl_status common_write_all(int fd, const void *data, size_t len, const char *what);
/* Asks for transparent huge pages over the whole pages of [p, p + len): touching fresh
 * memory costs about 2.5 ms per 1 MB in small pages on these machines and a tenth of that in
 * huge ones. For large buffers about to be filled (broadcasts, fetched blocks). */
FL_INTERNAL void common_advise_huge(void *p, size_t len);
FL_INTERNAL void common_remove_tree(const char *path);

/* ---- progress lines (progress.c) ------------------------------------------------------- */
/* Whether progress may be redrawn in place on fd: fd is a terminal and FLINT_PROGRESS is on.
 * Elsewhere (a file, a pipe) progress goes as whole lines, without "\r". */
FL_INTERNAL bool common_progress_on_terminal(int fd);
/* "ETA 1:02:03", "ETA 02:05" (minutes and seconds) for what is left of a task `fraction`
 * (0..1) done after elapsed_s seconds; "ETA --:--" before anything is done. Returns what
 * snprintf returns. */
FL_INTERNAL int common_progress_eta(char *buf, size_t cap, double elapsed_s, double fraction);

#endif /* FLINT_COMMON_H */
