/*
 * report.c: what a supervised executor process tells its supervisor (executor/supervisor.c)
 * over a pipe: each registration with a driver, and, when user code takes the process down,
 * its last words.
 *
 * A task's function that crashes (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) or calls exit()
 * ends the whole process. Before it goes, the thread that ran the function writes one line
 * naming the task (its attempt key, application, dataset and partition) and the function:
 * the innermost frame of its stack that lies in an application's library (functions of
 * applications are exported, so dladdr names them). The supervisor hands that to the driver,
 * which fails the task with it, and starts a fresh executor.
 *
 * What every task thread runs is also in a small table shared with the supervisor (a memfd
 * it made: a slot per thread, the attempt's key while it runs), so that a death that says
 * nothing (an _exit, a SIGKILL) still tells which attempts were running: those are charged,
 * not the ones queued behind them.
 *
 * Lines (text, one write(2) each, so that they never interleave):
 *   registered EXECUTOR INCARNATION DRIVER WORKDIR
 *   died TASK APP DATASET PARTITION SIGNAL EXIT LIBRARY SYMBOL   ("-" for an unknown word)
 * The signal handler formats with its own code: snprintf is not async-signal-safe. backtrace
 * and dladdr are not promised to be either; they are what crash reporters use, and a process
 * that is going anyway loses little if they fail.
 */
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "executor/executor.h"

#define LIBRARY_DIR_MAX 512

static int report_fd = -1;
static char library_dir[LIBRARY_DIR_MAX]; /* "<work dir>/lib/": applications' libraries */
static size_t library_dir_len;
static _Thread_local const executor_report_task *running; /* the task this thread runs */
static volatile sig_atomic_t reported;                    /* one last word per process */
static _Atomic uint64_t *running_table;                   /* the shared table, or NULL */
static atomic_uint next_slot;
static _Thread_local int my_slot = -1;                    /* this thread's slot in it */
static _Thread_local bool alt_stack;                      /* sigaltstack set up */

/* ---- formatting without the C library ----------------------------------------------------- */

typedef struct line {
  char text[1024];
  size_t len;
} line;

static void put(line *l, const char *s) {
  while (*s && l->len < sizeof l->text - 2) l->text[l->len++] = *s == ' ' || *s == '\n' ? '_' : *s, s++;
}

static void put_word(line *l, const char *s) {
  if (l->len) l->text[l->len++] = ' ';
  put(l, s && *s ? s : "-");
}

static void put_u64(line *l, uint64_t v) {
  char digits[24];
  int n = 0;
  do digits[n++] = (char)('0' + v % 10);
  while ((v /= 10) && n < 23);
  if (l->len) l->text[l->len++] = ' ';
  while (n && l->len < sizeof l->text - 2) l->text[l->len++] = digits[--n];
}

static void send_line(line *l) {
  if (report_fd < 0) return;
  l->text[l->len++] = '\n';
  ssize_t n = write(report_fd, l->text, l->len);
  (void)n; /* nothing to do about a supervisor that is gone */
}

/* ---- the last words ----------------------------------------------------------------------- */

/* The innermost frame of this thread's stack in an application's library: its file's base
 * name (the content id and ".so") and symbol, or, when that frame's function has no exported
 * name (a static helper), the innermost one that has; false when no frame is there. */
static bool user_frame(const char **library, const char **symbol) {
  if (!library_dir_len) return false;
  void *frames[64];
  int n = backtrace(frames, 64);
  for (int i = 0; i < n; i++) {
    /* A frame's address is where its call returns to, which is past the end of a function
     * whose last instruction calls a noreturn one (abort, exit): look a byte earlier. */
    Dl_info info;
    if (!dladdr((char *)frames[i] - 1, &info) || !info.dli_fname) continue;
    if (strncmp(info.dli_fname, library_dir, library_dir_len) != 0) continue;
    if (!*library) *library = info.dli_fname + library_dir_len;
    if (info.dli_sname) {
      *library = info.dli_fname + library_dir_len;
      *symbol = info.dli_sname;
      return true;
    }
  }
  return *library != NULL;
}

static void last_words(int signal_number, int exit_code) {
  if (report_fd < 0 || reported) return;
  reported = 1;
  const executor_report_task *t = running;
  const char *library = NULL, *symbol = NULL;
  if (t) user_frame(&library, &symbol);
  line l = {.len = 0};
  put_word(&l, "died");
  put_u64(&l, t ? t->key : 0);
  put_u64(&l, t ? t->app : 0);
  put_u64(&l, t ? t->rdd : 0);
  put_u64(&l, t ? t->partition : 0);
  put_u64(&l, (uint64_t)signal_number);
  put_u64(&l, (uint64_t)(exit_code & 0xff));
  put_word(&l, library);
  put_word(&l, symbol);
  send_line(&l);
}

static void on_fatal_signal(int signal_number) {
  last_words(signal_number, 0);
  /* SA_RESETHAND restored the default action (and did not block the signal): raised again,
   * it ends the process now, as it would have without this handler, also when it came from
   * kill() or raise() rather than a fault. */
  raise(signal_number);
}

/* exit() called by a task's function (the thread that calls exit runs the atexit handlers). */
static void on_exit_call(int code, void *arg) {
  (void)arg;
  if (running) last_words(0, code);
}

static const int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

fl_status executor_report_open(const char *fd_text, const char *running_fd_text, const char *work_dir) {
  char *end;
  long fd = strtol(fd_text, &end, 10);
  if (*end || end == fd_text || fd < 3 || fd > 1 << 20)
    return FL_ERR(FL_EINVAL, "FLINT_EXECUTOR_REPORT_FD=%s is not a descriptor", fd_text);
  if (strlen(work_dir) + 6 >= sizeof library_dir)
    return FL_ERR(FL_EINVAL, "the executor's folder path is too long: %s", work_dir);
  report_fd = (int)fd;
  library_dir_len = (size_t)snprintf(library_dir, sizeof library_dir, "%s/lib/", work_dir);
  void *warm[1];
  backtrace(warm, 1); /* loads the unwinder now: the first call allocates */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = (int)(SA_RESETHAND | SA_ONSTACK); /* a stack overflow leaves no stack to run on */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof fatal_signals / sizeof *fatal_signals; i++) sigaction(fatal_signals[i], &sa, NULL);
  on_exit(on_exit_call, NULL);
  long running_fd = running_fd_text ? strtol(running_fd_text, &end, 10) : -1;
  if (running_fd >= 3 && !*end) {
    void *map = mmap(NULL, EXECUTOR_RUNNING_SLOTS * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED,
                     (int)running_fd, 0);
    if (map != MAP_FAILED) running_table = map;
  }
  return FL_OK;
}

void executor_report_registered(uint64_t executor, uint64_t incarnation, const char *driver, const char *work_dir) {
  if (report_fd < 0) return;
  line l = {.len = 0};
  put_word(&l, "registered");
  put_u64(&l, executor);
  put_u64(&l, incarnation);
  put_word(&l, driver);
  put_word(&l, work_dir);
  send_line(&l);
}

/* A stack of its own for the fatal signals' handler, once per thread: recursion that runs out
 * of stack still gets its last words said. Only where the thread has none (a sanitizer gives
 * each thread its own, and unmaps it when the thread ends); mapped, never freed: task threads
 * live as long as the process. */
static void thread_alt_stack(void) {
  alt_stack = true;
  stack_t old;
  if (sigaltstack(NULL, &old) != 0 || !(old.ss_flags & SS_DISABLE)) return;
  stack_t ss = {.ss_size = 64 << 10};
  ss.ss_sp = mmap(NULL, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ss.ss_sp != MAP_FAILED && sigaltstack(&ss, NULL) != 0) munmap(ss.ss_sp, ss.ss_size);
}

void executor_report_running(const executor_report_task *t) {
  if (report_fd < 0) return;
  if (!alt_stack) thread_alt_stack();
  running = t;
  if (!running_table) return;
  if (my_slot < 0) {
    unsigned slot = atomic_fetch_add(&next_slot, 1);
    my_slot = slot < EXECUTOR_RUNNING_SLOTS ? (int)slot : EXECUTOR_RUNNING_SLOTS; /* past the end: untracked */
  }
  if (my_slot < EXECUTOR_RUNNING_SLOTS) atomic_store_explicit(&running_table[my_slot], t ? t->key : 0, memory_order_relaxed);
}
