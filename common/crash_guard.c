/*
 * crash_guard.c: runs a call behind a per-thread sigsetjmp guard, so that a SIGSEGV, SIGBUS,
 * SIGFPE or SIGILL raised by it on its thread ends that call rather than the process (local
 * mode's contain_task_crashes: a crash in a task's user code fails that task).
 *
 * Design: one handler per process for the four signals, installed once and never removed.
 * A thread inside common_crash_guard_run has a jump buffer (thread-local); the handler,
 * running on the faulting thread, saves the signal and the thread's stack (backtrace) and
 * siglongjmps there. A signal on any other thread, or on this one outside a guarded call,
 * goes to the handler installed before ours (the shell's own guard), else gets the default
 * action, as if ours were not there. Handlers installed after ours replace it: install it
 * last (the shell installs its own guard before it opens its context).
 *
 * The caveat that comes with any longjmp out of a fault: what the call held when it crashed
 * (memory it allocated, locks it took, half-written structures) stays as it was. A stack
 * overflow is caught only on a thread with an alternate signal stack (sigaltstack); task
 * threads have none, so it still ends the process.
 *
 * backtrace in a signal handler is not promised async-signal-safe; report.c's crash reports
 * rely on it alike (the unwinder is loaded at install, so the handler does not load it).
 */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include "common/common.h"

#define CRASH_FRAMES 48

static const int guarded[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
static struct sigaction previous[sizeof guarded / sizeof *guarded];
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static fl_status install_status;

static _Thread_local sigjmp_buf *volatile guard_jump; /* set while a guarded call runs */
static _Thread_local volatile sig_atomic_t crash_signal;
static _Thread_local void *crash_frames[CRASH_FRAMES];
static _Thread_local int crash_num_frames;
static _Thread_local void *crash_pc; /* the faulting instruction, from the signal's context; NULL: unknown */

/* The interrupted instruction of a signal's context (NULL where this port does not know it). */
static void *context_pc(void *context) {
  const ucontext_t *uc = context;
#if defined(__x86_64__)
  return uc ? (void *)(uintptr_t)uc->uc_mcontext.gregs[REG_RIP] : NULL;
#elif defined(__aarch64__)
  return uc ? (void *)(uintptr_t)uc->uc_mcontext.pc : NULL;
#else
  (void)uc;
  return NULL;
#endif
}

/* The default action (or the handler before ours) for a signal that is not a guarded call's. */
static void chain(int sig, siginfo_t *info, void *context) {
  for (size_t i = 0; i < sizeof guarded / sizeof *guarded; i++) {
    if (guarded[i] != sig) continue;
    const struct sigaction *p = &previous[i];
    if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction) {
      p->sa_sigaction(sig, info, context);
      return;
    }
    if (!(p->sa_flags & SA_SIGINFO) && p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
      p->sa_handler(sig);
      return;
    }
  }
  /* As if there were no handler: the signal, blocked while this runs, ends the process when
   * the handler returns (a fault would also come again at the same instruction). */
  signal(sig, SIG_DFL);
  raise(sig);
}

static void on_signal(int sig, siginfo_t *info, void *context) {
  sigjmp_buf *jump = guard_jump;
  /* Only a fault or a raise() of this thread's own: a kill() from outside is not the call's. */
  bool own = info->si_code > 0 || info->si_code == SI_TKILL;
  if (!jump || !own) {
    chain(sig, info, context);
    return;
  }
  guard_jump = NULL;
  crash_signal = sig;
  crash_pc = context_pc(context);
  crash_num_frames = backtrace(crash_frames, CRASH_FRAMES);
  siglongjmp(*jump, 1);
}

static void install(void) {
  void *warm[1];
  backtrace(warm, 1); /* loads the unwinder now: its first call allocates */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof guarded / sizeof *guarded; i++)
    if (sigaction(guarded[i], &sa, &previous[i]) != 0) {
      install_status = FL_ERR(FL_EIO, "cannot install the task crash guard for signal %d: %s", guarded[i],
                              strerror(errno));
      return;
    }
}

fl_status common_crash_guard_install(void) {
  pthread_once(&install_once, install);
  return install_status;
}

/* The file's base name. */
static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* The sanitizers' runtimes (libasan, libubsan, libtsan) pass signals through frames of their own
 * on the way to the handler: they are no more the crash's place than the handler is. */
static bool is_sanitizer_runtime(const char *path) {
  const char *b = base_name(path);
  return strncmp(b, "libasan", 7) == 0 || strncmp(b, "libubsan", 8) == 0 || strncmp(b, "libtsan", 7) == 0;
}

/* Names where the crash happened, from the stack the handler saw: past the handler's own
 * frames (this file's) and the C library's (the signal trampoline, and a libc function that
 * user code called with a bad pointer: strlen(NULL) names its caller), the innermost frame;
 * when its function has no exported name (dladdr names exported functions only: a static
 * helper), the innermost frame of the same file that has one, as executor/report.c does. */
static void name_crash(common_crash *crash) {
  Dl_info self, libc;
  const char *self_file = dladdr((void *)(uintptr_t)on_signal, &self) ? self.dli_fname : NULL;
  const char *libc_file = dladdr((void *)(uintptr_t)abort, &libc) ? libc.dli_fname : NULL;
  int i = 0;
  Dl_info info;
  /* A return address lies past its call; one byte back is inside the calling function. */
#define FRAME_INFO(k) (dladdr((char *)crash_frames[k] - 1, &info) && info.dli_fname)
  /* The faulting instruction, where the port knows it: the backtrace's frame at it is the
   * crash's (the frames before it are the handler's and whatever runtime passed the signal
   * on). Failing that, past the handler's frames, then the C library's and the sanitizers'
   * (in either order); not the handler's file again: it may be the program that crashed. */
  int at_pc = -1;
  for (int k = 0; crash_pc && k < crash_num_frames; k++)
    if (crash_frames[k] == crash_pc) at_pc = k;
  if (at_pc >= 0) {
    /* The faulting address is the instruction itself, not a return address past a call. */
    crash_frames[at_pc] = (char *)crash_frames[at_pc] + 1;
    i = at_pc;
  } else {
    while (i < crash_num_frames && FRAME_INFO(i) && self_file && strcmp(info.dli_fname, self_file) == 0) i++;
    while (i < crash_num_frames && FRAME_INFO(i) &&
           ((libc_file && strcmp(info.dli_fname, libc_file) == 0) || is_sanitizer_runtime(info.dli_fname)))
      i++;
  }
  if (i >= crash_num_frames || !FRAME_INFO(i)) return;
  const char *file = info.dli_fname; /* the loader's string: stays */
  snprintf(crash->library, sizeof crash->library, "%s", base_name(file));
  crash->offset = (uintptr_t)crash_frames[i] - (uintptr_t)info.dli_fbase;
  for (; i < crash_num_frames; i++)
    if (FRAME_INFO(i) && strcmp(info.dli_fname, file) == 0 && info.dli_sname) {
      snprintf(crash->function, sizeof crash->function, "%s", info.dli_sname);
      return;
    }
#undef FRAME_INFO
}

bool common_crash_guard_run(void (*fn)(void *), void *arg, common_crash *crash) {
  FL_ASSERT(!guard_jump); /* not nested */
  sigjmp_buf jump;
  memset(crash, 0, sizeof *crash);
  if (sigsetjmp(jump, 1) == 0) {
    guard_jump = &jump;
    fn(arg);
    guard_jump = NULL;
    return true;
  }
  crash->signal = crash_signal;
  name_crash(crash);
  return false;
}
