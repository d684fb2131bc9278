/*
 * cli/shell_session.c: a `flint shell` session: each input becomes a C file of its own,
 * compiled by the system compiler into a shared library that is loaded (RTLD_GLOBAL) and run.
 *
 * Design (as cling and spark-shell do it, simply): the session keeps a prelude, the text
 * that every later input sees before its own: flint's header and a few standard ones, the
 * user's directives and type definitions verbatim, an `extern` for each variable and a
 * prototype for each function defined so far. An input is classified by its first tokens:
 *   - a directive (#include, #define) or a type definition (typedef; struct/union/enum with
 *     a body and no variable): compiled once, then added to the prelude verbatim;
 *   - a function definition (`TYPE NAME(PARAMS) { ... }`): compiled into its input's
 *     library, exported; later inputs get its prototype, so `fl_map(ds, square, ...)` in
 *     input 5 names a function of library 4, and in cluster mode the function travels as
 *     (library 4, "square") like any job binary's;
 *   - a declaration `TYPE NAME = EXPR;` or `TYPE NAME;`, or of several names (`int a = 1,
 *     *b;`): each NAME becomes a global of its input's library (later inputs see `extern
 *     TYPE NAME;`) and the assignments run at once, in order, so a dataset made in one input
 *     stays usable (and cached) in the next. A brace initializer (`int xs[] = {1, 2};`)
 *     stays on the global and must be constant; declaring the same name again with the same
 *     type assigns it. `static` is dropped (later inputs are other libraries); a `const`
 *     global is defined without its const, assigned its value at once, and declared const
 *     to later inputs, so its initializer need not be constant and later inputs cannot
 *     assign it;
 *   - anything else: statements, run as the body of `void flint_shell_input_N(fl_context
 *     *ctx)`; declarations among several statements are local to that input.
 * The input's text follows `#line 1 "input N"`, so the compiler's messages name the input
 * and its own lines. A failed compile changes nothing in the session.
 *
 * Crashes: SIGSEGV, SIGBUS, SIGFPE and SIGILL raised on the shell's thread while an input
 * runs end that input (sigsetjmp/siglongjmp, on an alternate signal stack) and the session
 * goes on. A crash on a task thread (a map function in local mode) fails that task and its
 * job, which the input sees as the action's error: the shell opens its context with
 * contain_task_crashes, whose handler (installed after this one, which it hands the shell
 * thread's crashes) libflint keeps. Limits: memory or locks that the input or task held when
 * it crashed stay as they were, so a session after a crash inside flint's own calls may
 * misbehave.
 *
 * Single-threaded: all of it runs on the shell's thread.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/shell.h"

/* One name the session defined: a variable (its declaration, e.g. "fl_dataset *squares")
 * or a function. */
typedef struct shell_name {
  char *name;
  char *decl; /* variables: the declaration without initializer; functions: the prototype */
  bool is_function;
  unsigned input;
} shell_name;

struct shell_session {
  fl_context *ctx;
  char dir[PATH_MAX];         /* the session's temporary folder */
  char include_dir[PATH_MAX]; /* holds flint/flint.h */
  char *prelude;              /* what every input sees first (see the design above) */
  size_t prelude_len;
  shell_name *names;
  size_t name_count;
  unsigned next_input; /* inputs are numbered from 1 */
  bool loaded;         /* whether the last input's library was loaded (it may then have crashed) */
  pthread_t interrupt_watcher; /* cancels the jobs on Ctrl-C (see run_guarded) */
  bool watching;
};

/* ---- text helpers ------------------------------------------------------------------------ */

static char *dup_range(const char *start, size_t len) {
  char *p = malloc(len + 1);
  if (!p) abort(); /* the shell cannot go on without memory for its own text */
  memcpy(p, start, len);
  p[len] = '\0';
  return p;
}

static char *dup_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dup_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *p = NULL;
  if (vasprintf(&p, fmt, ap) < 0) abort();
  va_end(ap);
  return p;
}

static void prelude_add(shell_session *s, const char *text) {
  size_t n = strlen(text);
  char *p = realloc(s->prelude, s->prelude_len + n + 2);
  if (!p) abort();
  memcpy(p + s->prelude_len, text, n);
  s->prelude_len += n;
  p[s->prelude_len++] = '\n';
  p[s->prelude_len] = '\0';
  s->prelude = p;
}

/* Trims white space at both ends, in place; returns the start. */
static char *trim(char *text) {
  while (isspace((unsigned char)*text)) text++;
  size_t n = strlen(text);
  while (n && isspace((unsigned char)text[n - 1])) text[--n] = '\0';
  return text;
}

static bool is_ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* Scans C text outside strings, characters and comments: calls `visit` for each such
 * character with the bracket depth before it; stops when visit returns false. Returns
 * false when a string, character or comment is left open. */
typedef bool (*scan_fn)(const char *at, int depth, void *arg);
static bool scan_code(const char *text, scan_fn visit, void *arg) {
  int depth = 0;
  for (const char *c = text; *c; c++) {
    if (c[0] == '/' && c[1] == '*') {
      const char *end = strstr(c + 2, "*/");
      if (!end) return false;
      c = end + 1;
      continue;
    }
    if (c[0] == '/' && c[1] == '/') {
      while (c[1] && c[1] != '\n') c++;
      continue;
    }
    if (*c == '"' || *c == '\'') {
      char q = *c;
      for (c++; *c && *c != q; c++)
        if (*c == '\\' && c[1]) c++;
      if (!*c) return false;
      continue;
    }
    if (visit && !visit(c, depth, arg)) return true;
    if (*c == '(' || *c == '[' || *c == '{') depth++;
    else if (*c == ')' || *c == ']' || *c == '}') depth--;
  }
  return true;
}

static bool count_depth(const char *at, int depth, void *arg) {
  int *final = arg;
  *final = depth + (*at == '(' || *at == '[' || *at == '{') - (*at == ')' || *at == ']' || *at == '}');
  return true;
}

bool shell_input_complete(const char *text) {
  int depth = 0;
  if (!scan_code(text, count_depth, &depth)) return false;
  size_t n = strlen(text);
  while (n && isspace((unsigned char)text[n - 1])) n--;
  if (n && text[n - 1] == '\\') return false;
  return depth <= 0;
}

/* What mark_top finds at bracket depth 0: the first '{', the first '(' and the ';'s. */
typedef struct top_marks {
  const char *brace, *paren;
  int semicolons;
  const char *last_semicolon;
} top_marks;

static bool mark_top(const char *at, int depth, void *arg) {
  top_marks *m = arg;
  if (depth != 0) return true;
  if (*at == '{' && !m->brace) m->brace = at;
  if (*at == '(' && !m->paren) m->paren = at;
  if (*at == ';') {
    m->semicolons++;
    m->last_semicolon = at;
  }
  return true;
}

static const char *const statement_words[] = {
    "if", "else", "for", "while", "do", "switch", "return", "goto", "break", "continue",
    "case", "default", "sizeof", NULL};

static bool is_statement_word(const char *word, size_t len) {
  for (int i = 0; statement_words[i]; i++)
    if (strlen(statement_words[i]) == len && strncmp(statement_words[i], word, len) == 0) return true;
  return false;
}

/* Whether `head` (start..end) reads as a declaration's type and name: at least two words
 * made of identifiers and '*', the last an identifier (the name, written to *name), maybe
 * followed by one [...] (an array). The first word must not start a statement. */
static bool parse_declarator(const char *start, const char *end, const char **name, size_t *name_len) {
  while (end > start && isspace((unsigned char)end[-1])) end--;
  if (end > start && end[-1] == ']') { /* one array suffix */
    const char *open = end - 1;
    while (open > start && *open != '[') open--;
    if (*open != '[') return false;
    end = open;
    while (end > start && isspace((unsigned char)end[-1])) end--;
  }
  int idents = 0;
  const char *first = NULL, *last = NULL;
  size_t first_len = 0, last_len = 0;
  for (const char *c = start; c < end;) {
    if (isspace((unsigned char)*c) || *c == '*') {
      c++;
      continue;
    }
    if (!is_ident_char(*c) || isdigit((unsigned char)*c)) return false;
    const char *w = c;
    while (c < end && is_ident_char(*c)) c++;
    if (!idents) first = w, first_len = (size_t)(c - w);
    last = w, last_len = (size_t)(c - w);
    idents++;
  }
  if (idents < 2 || is_statement_word(first, first_len)) return false;
  if (last + last_len != end) return false; /* the name ends the declarator ("int *" is not one) */
  *name = last;
  *name_len = last_len;
  return true;
}

/* ---- the session's names ----------------------------------------------------------------- */

static shell_name *find_name(shell_session *s, const char *name) {
  for (size_t i = 0; i < s->name_count; i++)
    if (strcmp(s->names[i].name, name) == 0) return &s->names[i];
  return NULL;
}

static void add_name(shell_session *s, char *name, char *decl, bool is_function, unsigned input) {
  shell_name *n = realloc(s->names, (s->name_count + 1) * sizeof *n);
  if (!n) abort();
  s->names = n;
  s->names[s->name_count++] = (shell_name){name, decl, is_function, input};
}

/* Collapses white space to single spaces and drops it around '*', so that two spellings of
 * one declaration compare equal. */
static char *normalized(const char *decl) {
  char *out = dup_range(decl, strlen(decl)), *o = out;
  for (const char *c = decl; *c; c++) {
    if (isspace((unsigned char)*c)) {
      while (isspace((unsigned char)c[1])) c++;
      if (o > out && o[-1] != '*' && c[1] != '*' && c[1]) *o++ = ' ';
      continue;
    }
    *o++ = *c;
  }
  *o = '\0';
  return out;
}

/* ---- compiling and running ------------------------------------------------------------------ */

static sigjmp_buf guard_jump;
static volatile sig_atomic_t guard_armed;
static pthread_t guard_thread;
static const int guarded_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

static void guard_handler(int sig) {
  if (guard_armed && pthread_equal(pthread_self(), guard_thread)) {
    guard_armed = 0;
    siglongjmp(guard_jump, sig);
  }
  /* Not the input's own crash: the default action, as if the shell had no handler. */
  signal(sig, SIG_DFL);
  raise(sig);
}

void shell_guard_install(void) {
  static bool installed;
  if (installed) return;
  installed = true;
  static char alternate_stack[1 << 16]; /* for the process's life: the handler may run any time */
  stack_t st = {.ss_sp = alternate_stack, .ss_size = sizeof alternate_stack};
  sigaltstack(&st, NULL);
  struct sigaction sa = {.sa_handler = guard_handler, .sa_flags = SA_ONSTACK};
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof guarded_signals / sizeof guarded_signals[0]; i++)
    sigaction(guarded_signals[i], &sa, NULL);
}

/* Ctrl-C while an input runs: the handler (which may only do async-signal-safe things)
 * writes a byte to a pipe, and a watcher thread cancels the context's running jobs, whose
 * actions then return FL_ECANCELLED to the input. Until that input ends the watcher also
 * cancels every job it starts later (polling), so a Ctrl-C that lands before the input's
 * first job (still building its data sets, or between two jobs) is not lost. The handler
 * gives SIGINT back its default action, so a second Ctrl-C (an input looping in its own code)
 * ends the shell. At the prompt Ctrl-C keeps its default action. */
static int interrupt_pipe[2] = {-1, -1};
/* run_guarded's inputs so far and whether one runs; the watcher checks them and cancels
 * under the lock, so an input cannot end and the next one start between the two. */
static pthread_mutex_t input_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned input_number;
static bool input_running;

enum { RECANCEL_MS = 50 };

static void interrupt_handler(int sig) {
  char one = 1;
  ssize_t n = write(interrupt_pipe[1], &one, 1);
  (void)n;
  signal(sig, SIG_DFL);
}

static void cancel_jobs(shell_session *s) {
  if (fl_cancel_jobs(s->ctx) != FL_OK) fprintf(stderr, "flint shell: cannot cancel the jobs: %s\n", fl_last_error());
}

static void set_input_running(bool running) {
  pthread_mutex_lock(&input_lock);
  if (running) input_number++;
  input_running = running;
  pthread_mutex_unlock(&input_lock);
}

static void *interrupt_watch(void *arg) {
  shell_session *s = arg;
  bool interrupted = false;
  unsigned interrupted_input = 0;
  for (;;) {
    struct pollfd p = {.fd = interrupt_pipe[0], .events = POLLIN};
    int ready = poll(&p, 1, interrupted ? RECANCEL_MS : -1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) { /* the interrupted input's later jobs, while it runs */
      pthread_mutex_lock(&input_lock);
      interrupted = input_running && input_number == interrupted_input;
      if (interrupted) cancel_jobs(s);
      pthread_mutex_unlock(&input_lock);
      continue;
    }
    char b;
    ssize_t n = read(interrupt_pipe[0], &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || b == 0) return NULL; /* 0: the session ends */
    fprintf(stderr, "\nflint shell: Ctrl-C: cancelling the running jobs (Ctrl-C again ends the shell)\n");
    pthread_mutex_lock(&input_lock);
    interrupted = input_running;
    interrupted_input = input_number;
    cancel_jobs(s);
    pthread_mutex_unlock(&input_lock);
  }
}

/* Runs fn(ctx); false (after saying so) when it crashed. */
static bool run_guarded(void (*fn)(fl_context *), fl_context *ctx, unsigned input) {
  struct sigaction on_interrupt = {.sa_handler = interrupt_handler}, before;
  sigemptyset(&on_interrupt.sa_mask);
  bool interruptible = interrupt_pipe[1] >= 0 && sigaction(SIGINT, &on_interrupt, &before) == 0;
  guard_thread = pthread_self();
  set_input_running(true);
  int sig = sigsetjmp(guard_jump, 1);
  if (sig == 0) {
    guard_armed = 1;
    fn(ctx);
    guard_armed = 0;
    set_input_running(false);
    if (interruptible) sigaction(SIGINT, &before, NULL);
    fflush(stdout);
    return true;
  }
  set_input_running(false);
  if (interruptible) sigaction(SIGINT, &before, NULL);
  fflush(stdout);
  fprintf(stderr, "flint shell: input %u crashed (%s); the session goes on, but what it held "
                  "(memory, locks) stays as it was\n", input, strsignal(sig));
  return false;
}

/* Prints the file at `path` on stderr (a compiler's messages). */
static void print_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stderr);
  fclose(f);
}

/* Writes `source` as input N's file and compiles it into input N's library (syntax only
 * when `check_only`). Returns true on success; the compiler's messages go to stderr
 * either way. */
static bool compile(shell_session *s, unsigned input, const char *source, bool check_only) {
  char c_path[PATH_MAX + 32], so_path[PATH_MAX + 32], log_path[PATH_MAX + 32];
  snprintf(c_path, sizeof c_path, "%s/input_%u.c", s->dir, input);
  snprintf(so_path, sizeof so_path, "%s/input_%u.so", s->dir, input);
  snprintf(log_path, sizeof log_path, "%s/input_%u.log", s->dir, input);
  FILE *f = fopen(c_path, "w");
  if (!f || fputs(source, f) < 0 || fclose(f) != 0) {
    fprintf(stderr, "flint shell: cannot write %s: %s\n", c_path, strerror(errno));
    return false;
  }
  const char *cc = getenv("CC");
  if (!cc || !*cc) cc = "cc";
  /* The session's paths are mkdtemp's and the include folder was checked for quotes. */
  char *command = dup_printf("%s -std=gnu11 -fPIC -O1 -g -Wall -Wno-unused-variable -Wno-unused-but-set-variable "
                             "-Wno-unused-function -Werror=implicit-function-declaration -fdiagnostics-color=never -I'%s' %s '%s' -o '%s' "
                             "-lm >'%s' 2>&1",
                             cc, s->include_dir, check_only ? "-fsyntax-only" : "-shared", c_path,
                             so_path, log_path);
  int status = system(command);
  free(command);
  print_file(log_path);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 127)
      fprintf(stderr, "flint shell: cannot run the C compiler '%s' (set CC)\n", cc);
    return false;
  }
  return true;
}

/* Loads input N's library and runs its flint_shell_input_N, when it has one. */
static bool load_and_run(shell_session *s, unsigned input, bool has_function) {
  char so_path[PATH_MAX + 32], symbol[64];
  snprintf(so_path, sizeof so_path, "%s/input_%u.so", s->dir, input);
  void *lib = dlopen(so_path, RTLD_NOW | RTLD_GLOBAL);
  s->loaded = lib != NULL;
  if (!lib) {
    fprintf(stderr, "flint shell: input %u: cannot load: %s\n", input, dlerror());
    return false;
  }
  if (!has_function) return true;
  snprintf(symbol, sizeof symbol, "flint_shell_input_%u", input);
  void *addr = dlsym(lib, symbol);
  if (!addr) {
    fprintf(stderr, "flint shell: input %u: no %s in its library\n", input, symbol);
    return false;
  }
  void (*fn)(fl_context *);
  *(void **)&fn = addr;
  return run_guarded(fn, s->ctx, input);
}

/* The source of input N: the prelude, then `body`. */
static char *source_of(const shell_session *s, unsigned input, const char *body) {
  return dup_printf("/* flint shell, input %u */\n"
                    "#include <flint/flint.h>\n"
                    "#include <inttypes.h>\n#include <stdbool.h>\n#include <stdint.h>\n"
                    "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n"
                    "%s%s",
                    input, s->prelude ? s->prelude : "", body);
}

/* The input's function around `statements`; `line` is the #line directive for them. */
static char *statement_body(unsigned input, const char *line, const char *statements) {
  return dup_printf("void flint_shell_input_%u(fl_context *ctx) {\n  (void)ctx;\n%s%s\n}\n", input, line,
                    statements);
}

/* ---- evaluating an input -------------------------------------------------------------------- */

/* `TYPE NAME = EXPR;` as `     NAME = EXPR;`: the type blanked out (new lines kept), so that
 * the compiler's line and column numbers are the input's. */
static char *blank_type(const char *text, const char *name) {
  char *out = dup_range(text, strlen(text));
  for (char *c = out; c < out + (name - text); c++)
    if (*c != '\n') *c = ' ';
  return out;
}

static bool starts_with_word(const char *text, const char *word) {
  size_t n = strlen(word);
  return strncmp(text, word, n) == 0 && !is_ident_char(text[n]);
}

/* Blanks each whole word `word` in [from, to) (columns stay the input's). */
static void blank_word(char *from, const char *to, const char *word) {
  size_t n = strlen(word);
  for (char *w = from; w + n <= to; w++)
    if ((w == from || !is_ident_char(w[-1])) && strncmp(w, word, n) == 0 && !is_ident_char(w[n])) memset(w, ' ', n);
}

/* The declaration that defines a global's storage, for `decl` whose name starts at
 * name_off: the `const` that makes the object itself read-only (`const int n`, `char *const
 * p`) is blanked, so that its first value can be assigned at run time (an initializer need
 * not be constant); later inputs see `decl` as written, so the name stays read-only there. */
static char *storage_decl(const char *decl, size_t name_off) {
  char *out = dup_range(decl, strlen(decl));
  char *from = out;
  for (char *c = out; c < out + name_off; c++)
    if (*c == '*') from = c + 1; /* a const before the last '*' is the pointee's */
  blank_word(from, out + name_off, "const");
  return out;
}

/* The first '=' at depth 0 of [start, end) that assigns (not ==, !=, <=, +=, ...); NULL when
 * none comes before a string or comment. */
static const char *first_assign(const char *start, const char *end) {
  int depth = 0;
  for (const char *c = start; c < end; c++) {
    if (*c == '"' || *c == '\'' || (*c == '/' && (c[1] == '/' || c[1] == '*'))) return NULL;
    if (*c == '(' || *c == '[' || *c == '{') depth++;
    else if (*c == ')' || *c == ']' || *c == '}') depth--;
    else if (depth == 0 && *c == '=' && c[1] != '=' && c > start && !strchr("=!<>+-*/%&|^", c[-1])) return c;
  }
  return NULL;
}

/* Compiles `body` after the prelude and runs the input's function when it has one. */
static bool build_and_run(shell_session *s, unsigned input, const char *body, bool has_function) {
  char *source = source_of(s, input, body);
  s->loaded = false;
  bool ok = compile(s, input, source, false) && load_and_run(s, input, has_function);
  free(source);
  return ok;
}

/* The commas at depth 0 (scan_code's visitor): where a declaration's declarators part. */
#define MAX_DECLARATORS 64
typedef struct top_commas {
  const char *at[MAX_DECLARATORS];
  int n;
  bool too_many;
} top_commas;

static bool mark_commas(const char *at, int depth, void *arg) {
  top_commas *c = arg;
  if (depth == 0 && *at == ',') {
    if (c->n == MAX_DECLARATORS) c->too_many = true;
    else c->at[c->n++] = at;
  }
  return true;
}

/* One declarator of a declaration of several. */
typedef struct declared {
  char *decl; /* "fl_dataset *few" */
  char *name;
  char *init; /* the initializer's text, or NULL */
  size_t name_off;
} declared;

/* [start, end) without the white space at either end, copied. */
static char *dup_trimmed(const char *start, const char *end) {
  while (start < end && isspace((unsigned char)*start)) start++;
  while (end > start && isspace((unsigned char)end[-1])) end--;
  return dup_range(start, (size_t)(end - start));
}

/* `TYPE A [= X], B [= Y], ...;` (several declarators, text ends with its only ';'): each name
 * becomes a global as one declaration alone would (see the top), all in this input's one
 * library, assigned in order. Returns -1, changing nothing, when the text is not such a
 * declaration; else whether it compiled and ran. */
static int eval_declarations(shell_session *s, unsigned input, const char *line, char *text, size_t len) {
  top_commas commas = {.n = 0};
  scan_code(text, mark_commas, &commas);
  if (!commas.n || commas.too_many) return -1;
  const char *part_end[MAX_DECLARATORS + 1];
  for (int i = 0; i < commas.n; i++) part_end[i] = commas.at[i];
  part_end[commas.n] = text + len - 1; /* the ';' */
  /* The first declarator gives the type: its text up to its first '*', else up to its name. */
  const char *assign0 = first_assign(text, part_end[0]);
  const char *decl0_end = assign0 ? assign0 : part_end[0];
  const char *name0;
  size_t name0_len;
  if (memchr(text, '(', (size_t)(decl0_end - text)) || memchr(text, '{', (size_t)(decl0_end - text)) ||
      !parse_declarator(text, decl0_end, &name0, &name0_len))
    return -1;
  const char *star = memchr(text, '*', (size_t)(name0 - text));
  const char *spec_end = star ? star : name0;
  char *spec = dup_trimmed(text, spec_end);
  blank_word(spec, spec + strlen(spec), "static"); /* later inputs see it from other libraries */
  int n = commas.n + 1;
  declared items[MAX_DECLARATORS + 1];
  memset(items, 0, sizeof items);
  int result = -1;
  for (int i = 0; i < n; i++) {
    const char *start = i == 0 ? spec_end : part_end[i - 1] + 1;
    const char *assign = first_assign(start, part_end[i]);
    const char *decl_end = assign ? assign : part_end[i];
    char *declarator = dup_trimmed(start, decl_end);
    bool plain = !strchr(declarator, '(') && !strchr(declarator, '{') && *declarator;
    char *decl = dup_printf("%s %s", spec, declarator);
    free(declarator);
    const char *name;
    size_t name_len;
    if (!plain || !parse_declarator(decl, decl + strlen(decl), &name, &name_len)) {
      free(decl);
      goto cleanup; /* not a declaration: statements, then */
    }
    items[i] = (declared){decl, dup_range(name, name_len), assign ? dup_trimmed(assign + 1, part_end[i]) : NULL,
                          (size_t)(name - decl)};
  }
  result = 0;
  char *globals = dup_printf("%s", line), *assignments = dup_printf("%s", "");
  bool defines[MAX_DECLARATORS + 1] = {false};
  for (int i = 0; i < n; i++) {
    declared *d = &items[i];
    char *more_globals = NULL, *more_assignments = NULL;
    shell_name *known = find_name(s, d->name);
    if (known) {
      char *a = normalized(known->decl), *b = normalized(d->decl);
      bool same = !known->is_function && strcmp(a, b) == 0;
      free(a);
      free(b);
      if (!same || !d->init || *d->init == '{') {
        fprintf(stderr, "flint shell: input %u: '%s' is already declared as '%s' (input %u); "
                        "assign it or choose another name\n", input, d->name, known->decl, known->input);
        free(globals);
        free(assignments);
        goto cleanup;
      }
      more_assignments = dup_printf("%s  %s = %s;\n", assignments, d->name, d->init);
    } else if (d->init && *d->init == '{') { /* a constant brace initializer stays on the global */
      more_globals = dup_printf("%s%s = %s;\n", globals, d->decl, d->init);
    } else if (d->init) {
      char *store = storage_decl(d->decl, d->name_off);
      more_globals = dup_printf("%s%s;\n", globals, store);
      more_assignments = dup_printf("%s  %s = %s;\n", assignments, d->name, d->init);
      free(store);
    } else {
      more_globals = dup_printf("%s%s;\n", globals, d->decl);
    }
    defines[i] = !known;
    if (more_globals) free(globals), globals = more_globals;
    if (more_assignments) free(assignments), assignments = more_assignments;
  }
  bool has_function = *assignments != '\0';
  char *fn = has_function ? statement_body(input, line, assignments) : dup_printf("%s", "");
  char *body = dup_printf("%s%s", globals, fn);
  bool ok = build_and_run(s, input, body, has_function);
  free(body);
  free(fn);
  free(globals);
  free(assignments);
  /* Globals whose initializer crashed are still defined: later inputs may assign them. */
  if (ok || s->loaded)
    for (int i = 0; i < n; i++) {
      if (!defines[i]) continue;
      char *ext = dup_printf("extern %s;", items[i].decl);
      prelude_add(s, ext);
      free(ext);
      add_name(s, items[i].name, items[i].decl, false, input);
      items[i].name = items[i].decl = NULL; /* the session's now */
    }
  result = ok;
cleanup:
  for (int i = 0; i < n; i++) {
    free(items[i].decl);
    free(items[i].name);
    free(items[i].init);
  }
  free(spec);
  return result;
}

bool shell_session_eval(shell_session *s, const char *input_text) {
  return shell_session_eval_at(s, input_text, NULL, 1);
}

bool shell_session_eval_at(shell_session *s, const char *input_text, const char *file, unsigned first_line) {
  fflush(stdout); /* what earlier inputs printed comes before this one's messages */
  char *copy = dup_range(input_text, strlen(input_text));
  char *text = trim(copy);
  bool ok = true;
  unsigned input = s->next_input++;
  if (!*text) goto done;

  top_marks m = {0};
  /* The first '=' at depth 0 that assigns (not ==, !=, <=, +=, ...), before any string or
   * comment: in `TYPE NAME = EXPR;` it comes before both. */
  scan_code(text, mark_top, &m);
  const char *assign = NULL;
  {
    int depth = 0;
    for (const char *c = text; *c; c++) {
      if (*c == '"' || *c == '\'' || (*c == '/' && (c[1] == '/' || c[1] == '*'))) break;
      if (*c == '(' || *c == '[' || *c == '{') depth++;
      else if (*c == ')' || *c == ']' || *c == '}') depth--;
      else if (depth == 0 && *c == '=' && c[1] != '=' && c > text && !strchr("=!<>+-*/%&|^", c[-1])) {
        assign = c;
        break;
      }
    }
  }
  size_t len = strlen(text);
  /* Leading blank lines were trimmed: count them so that line numbers stay the input's. */
  for (const char *c = copy; c < text; c++)
    if (*c == '\n') first_line++;
  char *line = file && !strpbrk(file, "\"\\\n") ? dup_printf("#line %u \"%s\"\n", first_line, file)
                                                : dup_printf("#line %u \"input %u\"\n", first_line, input);

  /* A directive, or a type definition: into the prelude once it compiles. */
  bool is_type = starts_with_word(text, "typedef") ||
                 ((starts_with_word(text, "struct") || starts_with_word(text, "union") ||
                   starts_with_word(text, "enum")) &&
                  m.brace && (!assign || assign > m.brace) && (!m.paren || m.paren > m.brace) &&
                  strcmp(text + len - 1, ";") == 0 && strstr(text, "}") &&
                  (size_t)(strrchr(text, '}') - text) + 2 == len);
  if (text[0] == '#' || is_type) {
    char *body = dup_printf("%s%s\n", line, text);
    char *source = source_of(s, input, body);
    ok = compile(s, input, source, true);
    if (ok) prelude_add(s, body);
    free(source);
    free(body);
    goto done_line;
  }

  /* A function definition: TYPE NAME(PARAMS) { ... }. `static` and `inline` in front are
   * dropped: later inputs call it from their own libraries, so it must be exported. */
  if (m.brace && text[len - 1] == '}' && m.paren && m.paren < m.brace && !assign) {
    /* Blanked rather than cut, so that the compiler's columns stay the input's. */
    for (char *w = text;;) {
      if (!starts_with_word(w, "static") && !starts_with_word(w, "inline")) break;
      memset(w, ' ', 6);
      while (isspace((unsigned char)*w)) w++;
    }
  }
  if (m.brace && text[len - 1] == '}' && m.paren && m.paren < m.brace && (!assign || assign > m.brace)) {
    const char *head_end = m.brace;
    while (head_end > text && isspace((unsigned char)head_end[-1])) head_end--;
    const char *name;
    size_t name_len;
    if (head_end > text && head_end[-1] == ')' && parse_declarator(text, m.paren, &name, &name_len)) {
      char *fname = dup_range(name, name_len);
      shell_name *known = find_name(s, fname);
      if (known) {
        fprintf(stderr, "flint shell: input %u: '%s' is already defined (input %u); choose another name\n",
                input, fname, known->input);
        free(fname);
        ok = false;
        goto done_line;
      }
      char *body = dup_printf("%s%s\n", line, text);
      ok = build_and_run(s, input, body, false);
      free(body);
      if (ok) {
        const char *head = text;
        while (isspace((unsigned char)*head)) head++;
        char *proto = dup_printf("%.*s;", (int)(head_end - head), head);
        prelude_add(s, proto);
        add_name(s, fname, proto, true, input);
      } else {
        free(fname);
      }
      goto done_line;
    }
  }

  /* Several declarators: TYPE A = X, *B, C[2] = {...}; */
  if (m.semicolons == 1 && m.last_semicolon == text + len - 1) {
    int r = eval_declarations(s, input, line, text, len);
    if (r >= 0) {
      ok = r;
      goto done_line;
    }
  }

  /* One declaration: TYPE NAME = EXPR; or TYPE NAME; */
  if (m.semicolons == 1 && m.last_semicolon == text + len - 1) {
    const char *decl_end = assign ? assign : text + len - 1;
    const char *name;
    size_t name_len;
    bool plain = !m.paren || (assign && m.paren > assign);
    if (plain && (!m.brace || (assign && m.brace > assign)) && parse_declarator(text, decl_end, &name, &name_len)) {
      /* `static` would hide the global from later inputs' libraries: blanked, as for functions */
      blank_word(text, name, "static");
      const char *e = decl_end;
      while (e > text && isspace((unsigned char)e[-1])) e--;
      const char *d0 = text;
      while (d0 < e && isspace((unsigned char)*d0)) d0++;
      char *decl = dup_range(d0, (size_t)(e - d0));
      char *vname = dup_range(name, name_len);
      const char *init = assign ? assign + 1 : NULL;
      while (init && isspace((unsigned char)*init)) init++;
      shell_name *known = find_name(s, vname);
      char *body;
      bool defines = true;
      if (known) {
        char *a = normalized(known->decl), *b = normalized(decl);
        bool same = !known->is_function && strcmp(a, b) == 0;
        free(a);
        free(b);
        if (!same || !init || *init == '{') {
          fprintf(stderr, "flint shell: input %u: '%s' is already declared as '%s' (input %u); "
                          "assign it or choose another name\n", input, vname, known->decl, known->input);
          free(decl);
          free(vname);
          ok = false;
          goto done_line;
        }
        defines = false;
        char *assignment = blank_type(text, name);
        body = statement_body(input, line, assignment);
        free(assignment);
        ok = build_and_run(s, input, body, true);
      } else if (init && *init == '{') { /* a constant brace initializer stays on the global */
        body = dup_printf("%s%s\n", line, text);
        ok = build_and_run(s, input, body, false);
      } else if (init) {
        char *assignment = blank_type(text, name);
        char *fn = statement_body(input, line, assignment);
        char *store = storage_decl(decl, (size_t)(name - d0));
        body = dup_printf("%s%s;\n%s", line, store, fn);
        free(store);
        free(fn);
        free(assignment);
        ok = build_and_run(s, input, body, true);
      } else {
        body = dup_printf("%s%s;\n", line, decl);
        ok = build_and_run(s, input, body, false);
      }
      free(body);
      /* A global whose initializer crashed is still defined: later inputs may assign it. */
      bool loaded = ok || s->loaded;
      if (defines && loaded) {
        char *ext = dup_printf("extern %s;", decl);
        prelude_add(s, ext);
        free(ext);
        add_name(s, vname, decl, false, input);
      } else {
        free(decl);
        free(vname);
      }
      goto done_line;
    }
  }

  /* Statements. An expression without its ';' gets one. */
  {
    bool needs_semicolon = text[len - 1] != ';' && text[len - 1] != '}';
    char *statements = dup_printf("%s%s", text, needs_semicolon ? ";" : "");
    char *body = statement_body(input, line, statements);
    ok = build_and_run(s, input, body, true);
    free(body);
    free(statements);
  }

done_line:
  free(line);
done:
  free(copy);
  fflush(stdout);
  return ok;
}

bool shell_session_type(shell_session *s, const char *expr) {
  /* The compiler names the type in its complaint about a pointer to it: "initialization of
   * 'TYPE *' from incompatible pointer type 'struct flint_shell_probe *'". */
  unsigned input = s->next_input++;
  char *fn = dup_printf("struct flint_shell_probe { char c; };\n"
                        "void flint_shell_type_%u(fl_context *ctx) {\n  (void)ctx;\n"
                        "#line 1 \"input %u\"\n__typeof__(%s) *flint_shell_probe = (struct flint_shell_probe *)0;\n}\n",
                        input, input, expr);
  char *source = source_of(s, input, fn);
  free(fn);
  char c_path[PATH_MAX + 32], log_path[PATH_MAX + 32];
  snprintf(c_path, sizeof c_path, "%s/input_%u.c", s->dir, input);
  snprintf(log_path, sizeof log_path, "%s/input_%u.log", s->dir, input);
  FILE *f = fopen(c_path, "w");
  bool ok = f && fputs(source, f) >= 0;
  if (f && fclose(f) != 0) ok = false;
  free(source);
  if (!ok) return false;
  const char *cc = getenv("CC");
  char *command = dup_printf("LC_ALL=C %s -std=gnu11 -fsyntax-only -fdiagnostics-color=never -I'%s' '%s' >'%s' 2>&1",
                             cc && *cc ? cc : "cc", s->include_dir, c_path, log_path);
  int status = system(command);
  free(command);
  char buf[8192] = "";
  f = fopen(log_path, "r");
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  const char *key = "initialization of '";
  char *at = strstr(buf, key);
  char *end = at ? strstr(at + strlen(key), "' from") : NULL;
  if (status != -1 && at && end) {
    at += strlen(key);
    while (end > at && end[-1] == ' ') end--;
    if (end > at && end[-1] == '*') end--; /* the probe's own pointer */
    while (end > at && end[-1] == ' ') end--;
    printf("%.*s\n", (int)(end - at), at);
    return true;
  }
  fputs(buf, stderr); /* the expression does not compile: the compiler says why */
  return false;
}

void shell_session_list(const shell_session *s) {
  for (size_t i = 0; i < s->name_count; i++)
    printf("input %u: %s%s\n", s->names[i].input, s->names[i].decl, s->names[i].is_function ? "" : ";");
  if (!s->name_count) printf("(nothing defined yet)\n");
}

/* Whether `dir` holds flint/flint.h. */
static bool has_header(const char *dir) {
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/flint/flint.h", dir);
  return access(path, R_OK) == 0;
}

/* Finds the folder user code includes flint/flint.h from, in this order: $FLINT_INCLUDE_DIR;
 * beside this program in an installed layout (PREFIX/bin/flint: PREFIX/include/flint-dataflow,
 * then PREFIX/include); the source tree this program was built from (FLINT_SOURCE_DIR). */
static bool find_include_dir(char *out, size_t size) {
  const char *env = getenv("FLINT_INCLUDE_DIR");
  if (env && *env) {
    if (!has_header(env)) {
      fprintf(stderr, "flint shell: FLINT_INCLUDE_DIR=%s has no flint/flint.h\n", env);
      return false;
    }
    snprintf(out, size, "%s", env);
    return true;
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0 && n < (ssize_t)sizeof self - 1) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    const char *suffixes[] = {"/../include/flint-dataflow", "/../include"};
    for (size_t i = 0; i < 2; i++) {
      char dir[PATH_MAX + 64];
      snprintf(dir, sizeof dir, "%s%s", self, suffixes[i]);
      char real[PATH_MAX];
      if (realpath(dir, real) && has_header(real)) {
        snprintf(out, size, "%s", real);
        return true;
      }
    }
  }
#ifdef FLINT_SOURCE_DIR
  if (has_header(FLINT_SOURCE_DIR "/include")) {
    snprintf(out, size, "%s", FLINT_SOURCE_DIR "/include");
    return true;
  }
#endif
  fprintf(stderr, "flint shell: cannot find flint/flint.h (looked beside this program in "
                  "../include/flint-dataflow and ../include); set FLINT_INCLUDE_DIR\n");
  return false;
}

shell_session *shell_session_create(fl_context *ctx) {
  shell_session *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->ctx = ctx;
  s->next_input = 1;
  if (!find_include_dir(s->include_dir, sizeof s->include_dir) || strchr(s->include_dir, '\'')) {
    free(s);
    return NULL;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(s->dir, sizeof s->dir, "%s/flint-shell-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(s->dir)) {
    fprintf(stderr, "flint shell: cannot make a folder %s: %s\n", s->dir, strerror(errno));
    free(s);
    return NULL;
  }
  shell_guard_install(); /* done already by cmd_shell, before the context opened */
  if (interrupt_pipe[0] < 0 && pipe2(interrupt_pipe, O_CLOEXEC) != 0) interrupt_pipe[0] = interrupt_pipe[1] = -1;
  if (interrupt_pipe[0] >= 0) s->watching = pthread_create(&s->interrupt_watcher, NULL, interrupt_watch, s) == 0;
  return s;
}

const char *shell_session_include_dir(const shell_session *s) { return s->include_dir; }

void shell_session_destroy(shell_session *s) {
  if (!s) return;
  if (s->watching) {
    char zero = 0;
    if (write(interrupt_pipe[1], &zero, 1) == 1) pthread_join(s->interrupt_watcher, NULL);
  }
  for (size_t i = 0; i < s->name_count; i++) {
    shell_name *n = &s->names[i];
    if (!n->is_function) {
      char *d = normalized(n->decl);
      char *expect = dup_printf("fl_dataset*%s", n->name);
      if (strcmp(d, expect) == 0) {
        fl_dataset **ds = dlsym(RTLD_DEFAULT, n->name);
        if (ds && *ds) {
          fl_dataset_free(*ds);
          *ds = NULL;
        }
      }
      free(expect);
      free(d);
    }
    free(n->name);
    free(n->decl);
  }
  free(s->names);
  free(s->prelude);
  /* The libraries stay loaded, but their files can go: the process has them mapped. */
  char *command = dup_printf("rm -rf '%s'", s->dir);
  if (system(command) != 0) fprintf(stderr, "flint shell: could not remove %s\n", s->dir);
  free(command);
  free(s);
}
