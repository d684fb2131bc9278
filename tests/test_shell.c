/*
 * test_shell: `flint shell` driven through a pseudo-terminal, as a user types at it.
 *
 * The flint binary is $FLINT_BIN/flint (ctest sets FLINT_BIN to <build>/bin). Each session
 * runs under forkpty with TERM=dumb and HOME in a temporary folder (libedit's history goes
 * there); every wait for output is bounded, and a session that does not end after :quit is
 * killed. Outputs are checked by values that the typed text does not contain (the terminal
 * echoes the input), e.g. printf("sum=%d", 40 + 2) is expected as "sum=42".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "test_util.h"

#define WAIT_MS 60000 /* for one expected output; local-cluster start-up included */

typedef struct session {
  pid_t pid;
  int fd;           /* the pseudo-terminal's master side */
  char out[1 << 18]; /* everything the shell printed */
  size_t len, mark; /* expect() searches from mark */
  char home[64];
} session;

static session the_session; /* one at a time; static so that a failed assert leaks nothing */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Reads what the shell printed for up to `ms`; false at its end (EOF or EIO). */
static bool pump(session *s, int ms) {
  struct pollfd p = {.fd = s->fd, .events = POLLIN};
  if (poll(&p, 1, ms) <= 0) return true;
  if (s->len + 1 >= sizeof s->out) return false;
  ssize_t n = read(s->fd, s->out + s->len, sizeof s->out - 1 - s->len);
  if (n <= 0) return false;
  s->len += (size_t)n;
  s->out[s->len] = '\0';
  return true;
}

static void dump(const session *s) { fprintf(stderr, "---- the session so far ----\n%s\n----\n", s->out); }

/* Waits (bounded) until `text` appears after the mark; moves the mark past it. */
static bool expect(session *s, const char *text) {
  double end = now_ms() + WAIT_MS;
  for (;;) {
    char *at = strstr(s->out + s->mark, text);
    if (at) {
      s->mark = (size_t)(at - s->out) + strlen(text);
      return true;
    }
    if (now_ms() > end || !pump(s, 100)) break;
  }
  fprintf(stderr, "expected \"%s\"\n", text);
  dump(s);
  return false;
}

#define EXPECT(s, text) assert_true(expect((s), (text)))

static void type_line(session *s, const char *line) {
  /* Wait for the prompt first, so that libedit does not see the line before it is ready. */
  assert_true(expect(s, "> "));
  size_t n = strlen(line);
  assert_int_equal(write(s->fd, line, n), (ssize_t)n);
  assert_int_equal(write(s->fd, "\n", 1), 1);
}

static void start(session *s, const char *master) {
  memset(s, 0, sizeof *s);
  const char *bin = getenv("FLINT_BIN");
  assert_non_null(bin);
  char flint[PATH_MAX];
  snprintf(flint, sizeof flint, "%s/flint", bin);
  snprintf(s->home, sizeof s->home, "/tmp/flint-shell-test-XXXXXX");
  assert_non_null(mkdtemp(s->home));
  struct winsize ws = {.ws_row = 50, .ws_col = 200};
  s->pid = forkpty(&s->fd, NULL, NULL, &ws);
  assert_true(s->pid >= 0);
  if (s->pid == 0) {
    setenv("TERM", "dumb", 1);
    setenv("HOME", s->home, 1);
    alarm(120); /* kept across exec: a hung shell ends */
    execl(flint, flint, "shell", "--master", master, (char *)NULL);
    _exit(127);
  }
  EXPECT(s, "shell on ");
}

/* Types :quit and waits (bounded) for the shell to exit 0. */
static void finish(session *s) {
  type_line(s, ":quit");
  int status = -1;
  double end = now_ms() + WAIT_MS;
  while (waitpid(s->pid, &status, WNOHANG) == 0) {
    if (now_ms() > end) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, &status, 0);
      dump(s);
      fail_msg("the shell did not exit after :quit");
    }
    if (!pump(s, 50)) usleep(10000);
  }
  close(s->fd);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf %s", s->home);
  assert_int_equal(system(rm), 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) dump(s);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* A dataset built and cached in one input, a map function defined in another and used in a
 * third, a count printed; `calls` counts the map's calls where they run in this process. */
static void build_map_count(session *s, bool in_process) {
  type_line(s, "fl_dataset *nums = NULL;");
  type_line(s, "fl_range(ctx, 0, 1000, 1, 4, &nums);");
  type_line(s, "long calls;");
  /* A function over several lines: the shell reads until the braces balance. */
  type_line(s, "fl_status square(fl_bytes rec, fl_buf *out, const void *arg) {");
  type_line(s, "  int64_t v; memcpy(&v, rec.data, sizeof v); (void)arg;");
  type_line(s, in_process ? "  __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED); return fl_buf_put_i64(out, v * v);"
                          : "  return fl_buf_put_i64(out, v * v);");
  type_line(s, "}");
  type_line(s, "fl_dataset *squares = NULL;");
  type_line(s, "if (fl_map(nums, square, NULL, 0, &squares) != FL_OK || fl_cache(squares) != FL_OK) printf(\"map failed: %s\\n\", fl_last_error());");
  type_line(s, "uint64_t n = 0;");
  type_line(s, "fl_status st = fl_count(squares, &n);");
  type_line(s, "printf(\"count=%d status=%s\\n\", (int)n + 0, fl_status_name(st))");
  EXPECT(s, "count=1000 status=FL_OK");
  /* The cached squares: a second count computes nothing again. */
  type_line(s, "st = fl_count(squares, &n); printf(\"again=%d\\n\", (int)n + 0);");
  EXPECT(s, "again=1000");
  if (in_process) {
    type_line(s, "printf(\"calls=%ld\\n\", calls + 0);");
    EXPECT(s, "calls=1000");
  }
  type_line(s, "fl_dataset *ten = NULL;");
  type_line(s, "fl_range(ctx, 0, 10, 1, 2, &ten); fl_count(ten, &n); printf(\"ten=%d\\n\", (int)n + 0);");
  EXPECT(s, "ten=10");
}

static void test_local_session(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local[2]");
  build_map_count(s, true);
  finish(s);
}

/* A compile error shows the compiler's message with the input's own line numbers (input 2
 * here, its second line), and the session goes on; so does a crash in user code. */
static void test_errors_and_crash(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local[1]");
  type_line(s, "int good = 40;");
  type_line(s, "{ int a = 1;");
  type_line(s, "  a = no_such_name; }");
  EXPECT(s, "input 2:2:");
  EXPECT(s, "no_such_name");
  type_line(s, "printf(\"sum=%d\\n\", good + 2);");
  EXPECT(s, "sum=42");
  type_line(s, "int *nowhere = NULL;");
  type_line(s, "*nowhere = 1;");
  EXPECT(s, "crashed (Segmentation fault)");
  type_line(s, "printf(\"after=%d\\n\", good * 2);");
  EXPECT(s, "after=80");
  type_line(s, ":type good + 0.5");
  EXPECT(s, "double");
  /* :load runs a file's items as if typed; its messages give the file's own lines. */
  char path[] = "/tmp/flint-shell-load-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *file = "#include <math.h>\n"
                     "// a helper, then a use of it\n"
                     "static double half(double v) {\n  return v / 2;\n}\n"
                     "double halved = 0;\n"
                     "halved = half(sqrt(1764.0) * 2);\n"
                     "int broken =\n  half(no_such_thing);\n";
  assert_int_equal(write(fd, file, strlen(file)), (ssize_t)strlen(file));
  assert_int_equal(close(fd), 0);
  char load[64];
  snprintf(load, sizeof load, ":load %s", path);
  type_line(s, load);
  char where[64];
  snprintf(where, sizeof where, "%s:9:8: error", path); /* line 9, column 8 of the file */
  EXPECT(s, where);
  type_line(s, "printf(\"halved=%.0f\\n\", halved + half(0));");
  EXPECT(s, "halved=42");
  assert_int_equal(unlink(path), 0);
  type_line(s, ":nonsense");
  EXPECT(s, "unknown command");
  finish(s);
}

/* A crash in user code on a task thread (a map function, local mode) ends only that input:
 * its action fails naming the signal and the function, and the next inputs run jobs. */
static void test_task_crash(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local[2]");
  type_line(s, "fl_status crashy(fl_bytes rec, fl_buf *out, const void *arg) { volatile int *p = (volatile int *)arg; if (fl_i64(rec) == 5) *p = 1; return fl_buf_append(out, rec.data, rec.len); }");
  type_line(s, "fl_dataset *few = NULL, *bad = NULL;");
  type_line(s, "fl_range(ctx, 0, 10, 1, 2, &few); fl_map(few, crashy, NULL, 0, &bad);");
  type_line(s, "uint64_t k = 0;");
  type_line(s, "fl_status ks = fl_count(bad, &k); printf(\"status: %s\\n\", fl_status_name(ks) + 0);");
  EXPECT(s, "task crashed: signal 11 (Segmentation fault) in function crashy of ");
  EXPECT(s, "status: FL_EJOB");
  type_line(s, "fl_status again = fl_count(few, &k); printf(\"after: %d %s\\n\", (int)k * 10, fl_status_name(again));");
  EXPECT(s, "after: 100 FL_OK");
  finish(s);
}

/* Declarations as users write them: several declarators (each name a global of its own,
 * assigned in order), const globals (any initializer; read-only afterwards) and static
 * ones (usable by later inputs, which are other libraries). */
static void test_declarations(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local[1]");
  type_line(s, "int a, b;");
  type_line(s, "a = 6; b = 7;");
  type_line(s, "printf(\"ab=%d\\n\", a * b);");
  EXPECT(s, "ab=42");
  type_line(s, "int c = 1, d = c + 1, *p = &c;");
  type_line(s, "printf(\"cdp=%d\\n\", c * 100 + d * 10 + *p);");
  EXPECT(s, "cdp=121");
  type_line(s, "fl_dataset *few = NULL, *none = NULL;");
  type_line(s, "fl_range(ctx, 0, 10, 1, 2, &few); uint64_t k = 0; fl_count(few, &k); printf(\"few=%d none=%d\\n\", (int)k * 2, none == NULL);");
  EXPECT(s, "few=20 none=1");
  type_line(s, "int xs[3] = {1, 2, 3}, y = 4;");
  type_line(s, "printf(\"xsy=%d\\n\", xs[2] * 10 + y);");
  EXPECT(s, "xsy=34");
  type_line(s, "const int n = 5;");
  type_line(s, "printf(\"n=%d\\n\", n * 3);");
  EXPECT(s, "n=15");
  type_line(s, "n = 6;"); /* read-only, as in C */
  EXPECT(s, "read-only variable");
  type_line(s, "const int len = (int)strlen(\"abcdef\"), twice = len * 2;"); /* not constant */
  type_line(s, "printf(\"len=%d\\n\", len * 100 + twice);");
  EXPECT(s, "len=612");
  type_line(s, "static int counter = 10;");
  type_line(s, "counter++;");
  type_line(s, "printf(\"counter=%d\\n\", counter + 0);");
  EXPECT(s, "counter=11");
  type_line(s, "static const char *const greeting = \"he\" \"llo\";");
  type_line(s, "printf(\"g=%s!\\n\", greeting);");
  EXPECT(s, "g=hello!");
  /* Declaring a name again with its type assigns it, in a list as alone. */
  type_line(s, "int a = 1, q = 2;");
  type_line(s, "printf(\"aq=%d\\n\", a * 10 + q);");
  EXPECT(s, "aq=12");
  /* Not a declaration: a comma expression stays a statement. */
  type_line(s, "a = 3, b = 4;");
  type_line(s, "printf(\"ab=%d\\n\", a * 10 + b);");
  EXPECT(s, "ab=34");
  finish(s);
}

/* Ctrl-C while an input's job runs cancels the job (its action returns FL_ECANCELLED) and
 * the session goes on. */
static void interrupt_a_job(session *s) {
  type_line(s, "#include <unistd.h>");
  /* Each process running `slow` says so once: the sign that the job has started, whether its
   * tasks run in the shell (local) or in an executor, whose stderr is the session's too. */
  type_line(s, "fl_status slow(fl_bytes rec, fl_buf *out, const void *arg) { static int said; if (!said++) fprintf(stderr, \"slow task %s\\n\", \"running\"); (void)arg; usleep(2000); return fl_buf_append(out, rec.data, rec.len); }");
  type_line(s, "fl_dataset *big = NULL;");
  type_line(s, "fl_range(ctx, 0, 100000, 1, 2, &big);");
  type_line(s, "fl_dataset *slowed = NULL;");
  type_line(s, "fl_map(big, slow, NULL, 0, &slowed);");
  type_line(s, "uint64_t m = 0;");
  type_line(s, "fl_status cs = fl_count(slowed, &m); printf(\"count: %s\\n\", fl_status_name(cs) + 0);");
  /* The job takes 100 s uncancelled; Ctrl-C once a task runs (not after a fixed sleep: on a
   * busy machine the input may still be compiling, and Ctrl-C then only clears the line). */
  EXPECT(s, "slow task running");
  assert_int_equal(write(s->fd, "\x03", 1), 1);
  EXPECT(s, "cancelling the running jobs");
  EXPECT(s, "count: FL_ECANCELLED");
  type_line(s, "printf(\"alive=%d\\n\", 6 * 7);");
  EXPECT(s, "alive=42");
  /* A Ctrl-C before the input's first job (here while it sleeps) cancels the jobs it starts
   * afterwards; it is not lost for want of a running job. */
  type_line(s, "fprintf(stderr, \"before %s\\n\", \"the job\"); sleep(3); fl_status late = fl_count(slowed, &m); printf(\"late: %s\\n\", fl_status_name(late) + 0);");
  EXPECT(s, "before the job");
  assert_int_equal(write(s->fd, "\x03", 1), 1);
  EXPECT(s, "cancelling the running jobs");
  EXPECT(s, "late: FL_ECANCELLED");
  /* The next input's jobs run. */
  type_line(s, "fl_dataset *few = NULL; fl_range(ctx, 0, 7, 1, 1, &few); fl_count(few, &m); fl_dataset_free(few); printf(\"after=%d\\n\", (int)m + 0);");
  EXPECT(s, "after=7");
}

static void test_interrupt(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local[2]");
  interrupt_a_job(s);
  finish(s);
}

/* The same session through a driver and two executors: each input's library ships to the
 * executors, which run `square` from input 4's library. Then a Ctrl-C: the terminal sends it
 * to its foreground process group, which the cluster's processes are not in, so the job is
 * cancelled and the cluster runs the next one. */
static void test_local_cluster_session(void **state) {
  (void)state;
  session *s = &the_session;
  start(s, "local-cluster[2,1,256]");
  build_map_count(s, false);
  interrupt_a_job(s);
  type_line(s, "st = fl_count(ten, &n); printf(\"still=%d status=%s\\n\", (int)n * 2, fl_status_name(st) + 0);");
  EXPECT(s, "still=20 status=FL_OK");
  finish(s);
}

/* Runs `flint shell ARGS` with stdin from /dev/null; returns its exit status and the
 * first line of its output (stdout and stderr) in `first`. */
static int run_plain(const char *args, char *first, size_t size) {
  char command[PATH_MAX + 256];
  snprintf(command, sizeof command, "timeout 60 '%s/flint' shell %s </dev/null 2>&1", getenv("FLINT_BIN"), args);
  FILE *p = popen(command, "r");
  assert_non_null(p);
  first[0] = '\0';
  char line[1024];
  bool got = false;
  while (fgets(line, sizeof line, p))
    if (!got) {
      snprintf(first, size, "%s", line);
      got = true;
    }
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The command line's habits: --help exits 0 with the usage, a bad option or argument 2, a
 * master that cannot open 1; stdin that is not a terminal is read as plain lines. */
static void test_command_line(void **state) {
  (void)state;
  char first[1024];
  assert_int_equal(run_plain("--help", first, sizeof first), 0);
  assert_non_null(strstr(first, "usage: flint shell"));
  assert_int_equal(run_plain("--no-such-option", first, sizeof first), 2);
  assert_non_null(strstr(first, "flint shell: "));
  assert_int_equal(run_plain("extra", first, sizeof first), 2);
  assert_int_equal(run_plain("--master 'nowhere['", first, sizeof first), 1);
  assert_non_null(strstr(first, "flint shell: "));
  char script[] = "/tmp/flint-shell-script-XXXXXX";
  int fd = mkstemp(script);
  assert_true(fd >= 0);
  const char *text = "int k = 6;\nprintf(\"k=%d\\n\", k * 7);\n";
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  assert_int_equal(close(fd), 0);
  char command[2 * PATH_MAX + 256];
  snprintf(command, sizeof command, "timeout 60 '%s/flint' shell --master local < %s", getenv("FLINT_BIN"), script);
  FILE *p = popen(command, "r");
  assert_non_null(p);
  char out[256] = "";
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  assert_int_equal(pclose(p), 0);
  assert_int_equal(unlink(script), 0);
  assert_string_equal(out, "k=42\n");
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_command_line),
      cmocka_unit_test(test_local_session),
      cmocka_unit_test(test_errors_and_crash),
      cmocka_unit_test(test_task_crash),
      cmocka_unit_test(test_declarations),
      cmocka_unit_test(test_interrupt),
      cmocka_unit_test(test_local_cluster_session),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
