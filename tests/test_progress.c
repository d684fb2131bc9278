/*
 * test_progress: console progress (docs/ui.md, "Progress bars"). The renderer of Spark's bar
 * (client_progress_render) and the drawer's rules on a simulated clock (a stage shows after
 * 500 ms, redraws at most every 200 ms and only when changed, the line is erased when no
 * stage is left or an action ends); scheduler_progress with nothing running; and the flint
 * command run as a user runs it: with stdout and stderr on a pseudo-terminal, a slow job's
 * bar is drawn (local[2], and local-cluster[2,1,512] through the driver's StageProgress) and
 * `flint submit` to a driver shows its job binary's bar (StageProgress by submission id);
 * `flint ml` and `flint train` redraw their lines with an ETA; into a file, none of them
 * writes a "\r". No assertion is on elapsed time.
 *
 * The binaries are $FLINT_BIN/flint and $FLINT_BIN/job_slow.so (ctest sets FLINT_BIN).
 */
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pty.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "client/client_internal.h"

#define CHILD_ALARM_S 100 /* a child still running then is killed (kept across exec) */
#define OUTPUT_CAP (1 << 20)

static char flint_path[PATH_MAX], job_path[PATH_MAX], tmp_dir[PATH_MAX];

/* ---- the renderer ------------------------------------------------------------------------ */

static sched_stage_progress stage(uint32_t id, uint32_t tasks, uint32_t completed, uint32_t running) {
  return (sched_stage_progress){id, tasks, completed, running};
}

static void test_render_one_stage(void **state) {
  (void)state;
  char buf[256], want[256];
  sched_stage_progress s = stage(3, 40, 12, 4);
  /* "[Stage 3:" (9) + "(12 + 4) / 40]" (14): a bar of 57, of which 57 * 12 / 40 = 17 done */
  size_t len = client_progress_render(&s, 1, 80, buf, sizeof buf);
  snprintf(want, sizeof want, "[Stage 3:%.*s>%*s(12 + 4) / 40]", 17, "=================", 39, "");
  assert_string_equal(buf, want);
  assert_int_equal(len, 80);
  assert_int_equal(strlen(buf), 80);
}

static void test_render_edges(void **state) {
  (void)state;
  char buf[256];
  /* done == total: all '=' and no head */
  sched_stage_progress s = stage(7, 4, 4, 0);
  client_progress_render(&s, 1, 30, buf, sizeof buf);
  assert_string_equal(buf, "[Stage 7:=========(4 + 0) / 4]");
  /* no task at all: the head alone, no division by zero */
  s = stage(0, 0, 0, 0);
  client_progress_render(&s, 1, 30, buf, sizeof buf);
  assert_string_equal(buf, "[Stage 0:>" "        " "(0 + 0) / 0]"); /* 9 + 1 + 8 + 12 */
  /* nothing done yet */
  s = stage(1, 10, 0, 2);
  client_progress_render(&s, 1, 30, buf, sizeof buf);
  assert_string_equal(buf, "[Stage 1:>" "       " "(0 + 2) / 10]"); /* 9 + 1 + 7 + 13 */
  /* the text alone fills the width: no bar, the text whole */
  s = stage(123, 1000, 100, 20);
  client_progress_render(&s, 1, 20, buf, sizeof buf);
  assert_string_equal(buf, "[Stage 123:(100 + 20) / 1000]");
  /* no stage: an empty line */
  assert_int_equal(client_progress_render(NULL, 0, 80, buf, sizeof buf), 0);
  assert_string_equal(buf, "");
}

static void test_render_several_stages(void **state) {
  (void)state;
  char buf[256];
  sched_stage_progress s[3] = {stage(1, 8, 4, 4), stage(2, 6, 0, 1), stage(3, 2, 2, 0)};
  /* 80 columns for 3 stages: 26 each */
  size_t len = client_progress_render(s, 3, 80, buf, sizeof buf);
  assert_int_equal(len, 78);
  assert_string_equal(buf, "[Stage 1:==>  (4 + 4) / 8]"
                           "[Stage 2:>    (0 + 1) / 6]"
                           "[Stage 3:=====(2 + 0) / 2]");
  /* two in 100 columns: 50 each */
  len = client_progress_render(s, 2, 100, buf, sizeof buf);
  assert_int_equal(len, 100);
  assert_memory_equal(buf + 50, "[Stage 2:>", 10);
  /* a buffer too small for all: the stages that fit, whole */
  len = client_progress_render(s, 3, 80, buf, 60);
  assert_int_equal(len, 52);
  assert_int_equal(strlen(buf), 52);
  assert_memory_equal(buf + 26, "[Stage 2:", 9);
}

/* ---- the drawer on a simulated clock ----------------------------------------------------- */

typedef struct fake_source {
  sched_stage_progress stages[4];
  uint32_t count;
  fl_status status;
  uint32_t calls;
} fake_source;

static fl_status fake_poll(void *arg, sched_stage_progress *out, uint32_t cap, uint32_t *count) {
  fake_source *f = arg;
  f->calls++;
  *count = 0;
  if (f->status != FL_OK) return fl_set_error(f->status, "the fake source fails");
  for (uint32_t i = 0; i < f->count && i < cap; i++) out[i] = f->stages[i];
  *count = f->count;
  return FL_OK;
}

/* What the drawer wrote to fd since the last call (into buf, NUL-terminated). */
static size_t written_since(int fd, off_t *seen, char *buf, size_t cap) {
  off_t end = lseek(fd, 0, SEEK_END);
  assert_true(end >= *seen);
  size_t n = (size_t)(end - *seen);
  assert_true(n < cap);
  assert_int_equal(pread(fd, buf, n, *seen), (ssize_t)n);
  buf[n] = '\0';
  *seen = end;
  return n;
}

static bool is_erase(const char *s, size_t n, size_t width) {
  if (n != width + 2 || s[0] != '\r' || s[n - 1] != '\r') return false;
  for (size_t i = 1; i + 1 < n; i++)
    if (s[i] != ' ') return false;
  return true;
}

#define MS 1000000ull

/* "\r" + the bar of stages[0..n) in `width` columns + "\r". */
static const char *drawn(const sched_stage_progress *stages, uint32_t n, uint32_t width) {
  static char line[512];
  line[0] = '\r';
  size_t len = client_progress_render(stages, n, width, line + 1, sizeof line - 2);
  line[len + 1] = '\r';
  line[len + 2] = '\0';
  return line;
}

static void test_drawer_throttle(void **state) {
  (void)state;
  int fd = memfd_create("progress", 0);
  assert_true(fd >= 0);
  fake_source src = {.count = 1, .stages = {stage(5, 4, 0, 2)}};
  client_progress *p;
  assert_ok(client_progress_create(fd, 60, fake_poll, &src, &p));
  char out[4096];
  off_t seen = 0;
  uint64_t t0 = 1000 * MS;

  /* A stage younger than 500 ms is not shown (a short job draws nothing). */
  client_progress_tick(p, t0);
  client_progress_tick(p, t0 + 400 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  /* At 500 ms: "\r" + the bar + "\r". */
  client_progress_tick(p, t0 + 500 * MS);
  size_t n = written_since(fd, &seen, out, sizeof out);
  assert_string_equal(out, drawn(src.stages, 1, 60));
  assert_int_equal(n, 62);
  assert_memory_equal(out, "\r[Stage 5:>", 11);
  /* Changed 100 ms later: held back (at most every 200 ms). */
  src.stages[0] = stage(5, 4, 1, 2);
  client_progress_tick(p, t0 + 600 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  /* 200 ms after the last draw: drawn. */
  client_progress_tick(p, t0 + 700 * MS);
  written_since(fd, &seen, out, sizeof out);
  assert_string_equal(out, drawn(src.stages, 1, 60));
  assert_memory_equal(out, "\r[Stage 5:=========>", 20); /* 39 columns, a quarter done */
  /* Unchanged: not written again (until a minute has passed). */
  client_progress_tick(p, t0 + 900 * MS);
  client_progress_tick(p, t0 + 30000 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  client_progress_tick(p, t0 + 61000 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 62);

  /* A second stage shows once it is 500 ms old, beside the first, in half the width each. */
  src.stages[1] = stage(6, 2, 0, 1);
  src.count = 2;
  uint64_t t1 = t0 + 62000 * MS;
  client_progress_tick(p, t1);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0); /* the same bar: stage 6 is too young */
  client_progress_tick(p, t1 + 500 * MS);
  written_since(fd, &seen, out, sizeof out);
  assert_string_equal(out, drawn(src.stages, 2, 60));
  assert_memory_equal(out + 31, "[Stage 6:>", 10);

  /* A failing source changes nothing on the terminal. */
  src.status = FL_ETIMEDOUT;
  client_progress_tick(p, t1 + 1000 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  src.status = FL_OK;

  /* Stage 5 ends: stage 6 alone, in the whole width. */
  src.stages[0] = src.stages[1];
  src.count = 1;
  client_progress_tick(p, t1 + 1200 * MS);
  written_since(fd, &seen, out, sizeof out);
  assert_string_equal(out, drawn(src.stages, 1, 60));

  /* No stage left: the line is erased ("\r", blanks, "\r"), once. */
  src.count = 0;
  client_progress_tick(p, t1 + 1400 * MS);
  n = written_since(fd, &seen, out, sizeof out);
  assert_true(is_erase(out, n, 60));
  client_progress_tick(p, t1 + 1600 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  /* A stage seen again after its end is not remembered as old: 500 ms again. */
  src.stages[0] = stage(5, 4, 3, 1);
  src.count = 1;
  client_progress_tick(p, t1 + 1800 * MS);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  client_progress_tick(p, t1 + 2300 * MS);
  assert_true(written_since(fd, &seen, out, sizeof out) > 0);

  /* An action's end erases the bar at once; a clear too; with nothing drawn, neither writes. */
  client_progress_end(p);
  n = written_since(fd, &seen, out, sizeof out);
  assert_true(is_erase(out, n, 60));
  client_progress_clear(p);
  client_progress_end(p);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  client_progress_destroy(p);
  assert_int_equal(written_since(fd, &seen, out, sizeof out), 0);
  close(fd);
}

/* The thread: started by the first action, polling while one runs; stopped at destroy. No
 * assertion on how often it polls, only that it does and that the line ends erased. */
static void test_drawer_thread(void **state) {
  (void)state;
  int fd = memfd_create("progress", 0);
  assert_true(fd >= 0);
  fake_source src = {.count = 1, .stages = {stage(0, 2, 1, 1)}};
  client_progress *p;
  assert_ok(client_progress_create(fd, 50, fake_poll, &src, &p));
  client_progress_begin(p);
  struct timespec nap = {0, 20 * 1000000L};
  for (int i = 0; i < 500 && lseek(fd, 0, SEEK_END) == 0; i++) nanosleep(&nap, NULL); /* <= 10 s */
  client_progress_end(p);
  client_progress_destroy(p);
  client_progress_destroy(NULL);
  client_progress_begin(NULL);
  client_progress_end(NULL);
  char out[65536];
  off_t seen = 0;
  size_t n = written_since(fd, &seen, out, sizeof out);
  assert_true(src.calls > 0);
  assert_non_null(strstr(out, "\r[Stage 0:"));
  assert_true(n >= 52 && is_erase(out + n - 52, 52, 50)); /* the last thing written: the erase */
  close(fd);
}

static void test_scheduler_progress_idle(void **state) {
  (void)state;
  scheduler *s;
  backend *b;
  assert_ok(scheduler_create(4, &s));
  assert_ok(local_backend_create(s, 2, false, &b));
  scheduler_set_backend(s, b);
  sched_stage_progress out[4];
  uint32_t count = 99;
  assert_ok(scheduler_progress(s, 0, out, 4, &count));
  assert_int_equal(count, 0);
  assert_ok(scheduler_progress(s, 7, NULL, 0, &count));
  assert_int_equal(count, 0);
  scheduler_destroy(s);
}

/* ---- the flint command on a terminal and into a file -------------------------------------- */

typedef struct output {
  int status; /* exit status; 128 + signal */
  char *text;
  size_t len;
} output;

static void output_free(output *o) {
  free(o->text);
  free(o);
}

static void dump(const output *o) {
  fprintf(stderr, "exit status %d; output (%zu bytes):\n", o->status, o->len);
  for (size_t i = 0; i < o->len; i++) {
    unsigned char c = (unsigned char)o->text[i];
    if (c == '\r') fputs("\\r", stderr);
    else if (c == '\n' || (c >= 32 && c < 127)) fputc(c, stderr);
    else fprintf(stderr, "\\x%02x", c);
  }
  fputc('\n', stderr);
}

static void child_env(const char *progress) {
  alarm(CHILD_ALARM_S);
  if (progress) setenv("FLINT_PROGRESS", progress, 1);
  else unsetenv("FLINT_PROGRESS");
  unsetenv("FLINT_LOG_FILE");
  unsetenv("COLUMNS");
}

static int wait_status(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0) assert_int_equal(errno, EINTR);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* `flint ARGS...` with stdin, stdout and stderr on a pseudo-terminal 100 columns wide;
 * everything it wrote there. */
static output *run_on_pty(const char *progress, const char *const *args) {
  output *o = calloc(1, sizeof *o);
  assert_non_null(o);
  assert_non_null(o->text = malloc(OUTPUT_CAP + 1));
  struct winsize ws = {.ws_row = 30, .ws_col = 100};
  int master;
  fflush(NULL);
  pid_t pid = forkpty(&master, NULL, NULL, &ws);
  assert_true(pid >= 0);
  if (pid == 0) {
    child_env(progress);
    execv(flint_path, (char *const *)args);
    _exit(127);
  }
  /* Read until the child's side closes (EIO on Linux); the child's alarm bounds it. */
  for (;;) {
    if (o->len == OUTPUT_CAP) break;
    ssize_t n = read(master, o->text + o->len, OUTPUT_CAP - o->len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    o->len += (size_t)n;
  }
  o->text[o->len] = '\0';
  close(master);
  o->status = wait_status(pid);
  return o;
}

/* The same with stdout and stderr into one file. */
static output *run_into_file(const char *progress, const char *const *args) {
  output *o = calloc(1, sizeof *o);
  assert_non_null(o);
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/output", tmp_dir);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    child_env(progress);
    int null = open("/dev/null", O_RDONLY);
    if (null < 0 || dup2(null, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(126);
    execv(flint_path, (char *const *)args);
    _exit(127);
  }
  o->status = wait_status(pid);
  off_t len = lseek(fd, 0, SEEK_END);
  assert_true(len >= 0 && len <= OUTPUT_CAP);
  assert_non_null(o->text = malloc((size_t)len + 1));
  assert_int_equal(pread(fd, o->text, (size_t)len, 0), (ssize_t)len);
  o->len = (size_t)len;
  o->text[len] = '\0';
  close(fd);
  unlink(path);
  return o;
}

static void expect(const output *o, int status, const char *needle) {
  if (o->status != status || (needle && !memmem(o->text, o->len, needle, strlen(needle)))) {
    fprintf(stderr, "expected exit status %d and '%s'\n", status, needle ? needle : "");
    dump(o);
  }
  assert_int_equal(o->status, status);
  if (needle) assert_non_null(memmem(o->text, o->len, needle, strlen(needle)));
}

static void expect_absent(const output *o, const char *needle) {
  if (memmem(o->text, o->len, needle, strlen(needle))) {
    fprintf(stderr, "unexpected '%s'\n", needle);
    dump(o);
  }
  assert_null(memmem(o->text, o->len, needle, strlen(needle)));
}

/* The bar of job_slow's stage (4 tasks) was drawn in place and erased: "\r[Stage N:...
 * (D + R) / 4]\r", and a line of blanks between "\r"s. */
static void expect_bar(const output *o) {
  expect(o, 0, "job_slow count: 4");
  const char *bar = memmem(o->text, o->len, "\r[Stage ", 8);
  if (!bar) dump(o);
  assert_non_null(bar);
  const char *end = strstr(bar, ") / 4]\r");
  if (!end || !memchr(bar, '(', (size_t)(end - bar)) || !memmem(bar, (size_t)(end - bar), " + ", 3)) dump(o);
  assert_non_null(end);
  char erase[103];
  erase[0] = '\r';
  memset(erase + 1, ' ', 100);
  erase[101] = '\r';
  if (!memmem(o->text, o->len, erase, 102)) dump(o);
  assert_non_null(memmem(o->text, o->len, erase, 102));
}

#define SLOW_JOB(master) flint_path, "submit", "--master", master, job_path, "4", "1500", NULL

static void test_local_bar_on_terminal(void **state) {
  (void)state;
  output *o = run_on_pty(NULL, (const char *const[]){SLOW_JOB("local[2]")});
  expect_bar(o);
  output_free(o);
}

static void test_local_no_bar_into_file(void **state) {
  (void)state;
  output *o = run_into_file(NULL, (const char *const[]){SLOW_JOB("local[2]")});
  expect(o, 0, "job_slow count: 4");
  expect_absent(o, "[Stage ");
  expect_absent(o, "\r");
  output_free(o);
}

static void test_progress_off_on_terminal(void **state) {
  (void)state;
  output *o = run_on_pty("0", (const char *const[]){SLOW_JOB("local[2]")});
  expect(o, 0, "job_slow count: 4");
  expect_absent(o, "[Stage ");
  output_free(o);
}

/* A cluster context asks its driver (StageProgress). */
static void test_cluster_bar_on_terminal(void **state) {
  (void)state;
  output *o = run_on_pty(NULL, (const char *const[]){SLOW_JOB("local-cluster[2,1,512]")});
  expect_bar(o);
  output_free(o);
}

/* flint submit to a driver: the job binary runs on the driver, and the submitter asks for
 * the stages of its application (StageProgress by submission id). */
static void test_submit_bar_on_terminal(void **state) {
  (void)state;
  client_local_cluster lc = {0};
  char addr[256], master[300];
  uint32_t executors = 0;
  rpc_channel *ch = NULL;
  assert_ok(client_local_cluster_start(&lc, "local-cluster[2,1,512]", addr, sizeof addr, &executors));
  snprintf(master, sizeof master, "flint://%s", addr);
  assert_ok(client_rpc_connect(master, &ch));
  assert_ok(client_local_cluster_wait(&lc, ch, executors));
  output *o = run_on_pty(NULL, (const char *const[]){SLOW_JOB(master)});
  expect_bar(o);
  output_free(o);
  /* Into a file: the job's output, no bar. */
  o = run_into_file(NULL, (const char *const[]){SLOW_JOB(master)});
  expect(o, 0, "job_slow count: 4");
  expect_absent(o, "\r");
  output_free(o);
  /* A StageProgress of nothing running, and of an unknown job binary: no stage. */
  client_progress_driver src = {ch, 0, 12345};
  sched_stage_progress stages[4];
  uint32_t count = 99;
  assert_ok(client_progress_ask_driver(&src, stages, 4, &count));
  assert_int_equal(count, 0);
  src = (client_progress_driver){ch, 1, 0};
  assert_ok(client_progress_ask_driver(&src, stages, 4, &count));
  assert_int_equal(count, 0);
  /* Bytes no message decodes from: refused, naming the call. */
  static const uint8_t garbage[] = {0x0f, 0x0f, 0x0f};
  fl_buf reply = FL_BUF_INIT;
  assert_fails_with(rpc_call(ch, "/flint.Driver/StageProgress", (fl_bytes){garbage, sizeof garbage}, 5000, &reply),
                    FL_EPROTO, "StageProgress: malformed");
  fl_buf_free(&reply);
  rpc_channel_destroy(ch);
  client_local_cluster_stop(&lc);
}

/* y = 1 + 2 x1 - 3 x2 + a little noise, the label first. */
static const char *write_csv(void) {
  static char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/tiny.csv", tmp_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 200; i++) {
    double x1 = (i % 17) / 8.0 - 1, x2 = (i % 11) / 5.0 - 1;
    fprintf(f, "%.6f,%.6f,%.6f\n", 1 + 2 * x1 - 3 * x2 + 0.01 * ((i * 7919) % 13 - 6) / 6.0, x1, x2);
  }
  assert_int_equal(fclose(f), 0);
  return path;
}

#define ML_RUN(csv)                                                                                          \
  flint_path, "ml", "linreg", "--master", "local[2]", "--data", csv, "--format", "csv", "--solver", "lbfgs", \
      "--partitions", "2", NULL

static void test_ml_lines(void **state) {
  (void)state;
  const char *csv = write_csv();
  output *o = run_on_pty(NULL, (const char *const[]){ML_RUN(csv)});
  expect(o, 0, "\riter   1/100  loss ");
  expect(o, 0, "ETA ");
  expect_absent(o, "[Stage "); /* its own line stands for the stage bar */
  output_free(o);
  o = run_into_file(NULL, (const char *const[]){ML_RUN(csv)});
  expect(o, 0, "\niter   1  loss ");
  expect(o, 0, "\niter   2  loss ");
  expect_absent(o, "\r");
  output_free(o);
  unlink(csv);
}

/* Two overlapping classes in 2 features. */
static const char *write_libsvm(void) {
  static char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/tiny.svm", tmp_dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 300; i++) {
    int y = i % 2;
    fprintf(f, "%d 1:%.4f 3:%.4f\n", y, (i % 23) / 11.0 - 1 + (y ? 0.6 : -0.6), (i % 19) / 9.0 - 1);
  }
  assert_int_equal(fclose(f), 0);
  return path;
}

#define ML_PS_RUN(svm)                                                                                          \
  flint_path, "ml", "logreg", "--master", "local[2]", "--data", svm, "--format", "libsvm", "--solver", "ps",   \
      "--epochs", "3", "--batch", "25", "--lr", "0.3", "--partitions", "2", NULL

/* The ps solver's epochs likewise. */
static void test_ml_ps_lines(void **state) {
  (void)state;
  const char *svm = write_libsvm();
  output *o = run_on_pty(NULL, (const char *const[]){ML_PS_RUN(svm)});
  expect(o, 0, "\repoch ");
  expect(o, 0, "/3  loss ");
  expect(o, 0, "ETA ");
  output_free(o);
  o = run_into_file(NULL, (const char *const[]){ML_PS_RUN(svm)});
  expect(o, 0, "\nepoch   3  loss ");
  expect_absent(o, "\r");
  expect_absent(o, "ETA");
  output_free(o);
  unlink(svm);
}

#define TRAIN_RUN(csv, svg)                                                                                       \
  flint_path, "train", "--model", "mlp", "--data", "fashion-mnist", "--batch", "64", "--epochs", "2",            \
      "--train-images", "640", "--test-images", "64", "--master", "local[2]", "--csv", csv, "--svg", svg, NULL

static void test_train_lines(void **state) {
  (void)state;
  char csv[PATH_MAX + 32], svg[PATH_MAX + 32];
  snprintf(csv, sizeof csv, "%s/c.csv", tmp_dir);
  snprintf(svg, sizeof svg, "%s/c.svg", tmp_dir);
  output *o = run_on_pty(NULL, (const char *const[]){TRAIN_RUN(csv, svg)});
  expect(o, 0, "\repoch 1/2 [");
  expect(o, 0, "ETA ");
  expect_absent(o, "[Stage ");
  output_free(o);
  o = run_into_file(NULL, (const char *const[]){TRAIN_RUN(csv, svg)});
  expect(o, 0, "\nepoch 1/2 [####################] 100% loss ");
  expect(o, 0, "\nepoch 2/2 [####################] 100% loss ");
  expect_absent(o, "\r");
  expect_absent(o, "epoch 1/2 [#.");                    /* no partial epoch's line */
  output_free(o);
  unlink(csv);
  unlink(svg);
}

static void find_binaries(void) {
  const char *dir = getenv("FLINT_BIN");
  snprintf(flint_path, sizeof flint_path, "%s/flint", dir ? dir : ".");
  snprintf(job_path, sizeof job_path, "%s/job_slow.so", dir ? dir : ".");
  if (access(flint_path, X_OK) != 0 || access(job_path, R_OK) != 0) {
    fprintf(stderr, "test_progress: %s or %s is missing (set FLINT_BIN)\n", flint_path, job_path);
    exit(1);
  }
}

int main(void) {
  find_binaries();
  test_tmpdir(tmp_dir, sizeof tmp_dir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_render_one_stage, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_render_edges, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_render_several_stages, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_drawer_throttle, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_drawer_thread, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_scheduler_progress_idle, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_local_bar_on_terminal, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_local_no_bar_into_file, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_progress_off_on_terminal, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_cluster_bar_on_terminal, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_submit_bar_on_terminal, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_ml_lines, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_ml_ps_lines, test_bound_arm, test_bound_disarm),
      cmocka_unit_test_setup_teardown(test_train_lines, test_bound_arm, test_bound_disarm),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  test_rmtree(tmp_dir);
  return failed;
}
