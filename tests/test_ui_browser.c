/*
 * test_ui_browser.c: the web UI in a real browser. A driver and two executors run a job with
 * shuffles (examples/pagerank) and a training run (flint train, cpu); Debian's chromium,
 * headless, loads each page, dumps its DOM and takes a screenshot. The DOM must show the
 * job's stages and the training run's curves (SVG polylines with one point per step).
 * Skipped without chromium (scripts/setup installs it); labelled `browser`. FLINT_TEST_KEEP=1
 * keeps the screenshots and prints where.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define TEST_TIME_BOUND_S 280
#include "test_util.h"
#include "ui_client.h"

#define CHROMIUM "/usr/bin/chromium"
#define MAX_CHILDREN 4

static char dir[PATH_MAX];
static pid_t children[MAX_CHILDREN];
static int num_children;

/* Starts `flint ARGS...` in the background with its output in dir/NAME.log. */
static pid_t start(const char *name, const char *const *args) {
  char log[PATH_MAX + 64], bin[PATH_MAX];
  snprintf(log, sizeof log, "%s/%s.log", dir, name);
  snprintf(bin, sizeof bin, "%s/flint", getenv("FLINT_BIN"));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const char *argv[24] = {"flint"};
    for (int i = 0; args[i] && i < 22; i++) argv[i + 1] = args[i];
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  children[num_children++] = pid;
  return pid;
}

/* Runs `flint ARGS...` to its end (bounded by the test's time bound); its exit status. */
static int run(const char *name, const char *const *args) {
  pid_t pid = start(name, args);
  int st;
  waitpid(pid, &st, 0);
  children[--num_children] = 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  fl_buf b = FL_BUF_INIT;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) fl_buf_append(&b, chunk, n);
  fclose(f);
  fl_buf_append(&b, "", 1);
  return (char *)b.data;
}

/* The driver's web UI address, from its log line "web UI available at URL". */
static void wait_ui_url(char *url, size_t cap) {
  char log[PATH_MAX + 64];
  snprintf(log, sizeof log, "%s/driver.log", dir);
  for (int i = 0; i < 3000; i++) {
    char *text = slurp_file(log);
    const char *at = text ? strstr(text, "web UI available at ") : NULL;
    if (at) {
      snprintf(url, cap, "%.*s", (int)strcspn(at + 20, " \n"), at + 20);
      free(text);
      return;
    }
    free(text);
    usleep(10000);
  }
  fail_msg("the driver printed no web UI address");
}

/* Loads base+page in headless chromium: its DOM (returned) and a screenshot (checked: a PNG). */
static char *browse(const char *base, const char *page, const char *shot_name) {
  char url[512], cmd[PATH_MAX * 3], dom[PATH_MAX + 64], shot[PATH_MAX + 64];
  snprintf(url, sizeof url, "%s%s", base, page);
  snprintf(dom, sizeof dom, "%s/%s.html", dir, shot_name);
  snprintf(shot, sizeof shot, "%s/%s.png", dir, shot_name);
  const char *common = "--headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars";
  snprintf(cmd, sizeof cmd, "timeout 60 " CHROMIUM " %s --user-data-dir='%s/chromium' --dump-dom '%s' > '%s' 2>/dev/null",
           common, dir, url, dom);
  assert_int_equal(system(cmd), 0);
  snprintf(cmd, sizeof cmd,
           "timeout 60 " CHROMIUM " %s --user-data-dir='%s/chromium' --window-size=1280,1000 --screenshot='%s' '%s' "
           "> /dev/null 2>&1",
           common, dir, shot, url);
  assert_int_equal(system(cmd), 0);
  char *png = slurp_file(shot);
  assert_non_null(png);
  assert_memory_equal(png, "\x89PNG", 4);
  free(png);
  char *text = slurp_file(dom);
  assert_non_null(text);
  if (!strstr(text, "</html>")) fail_msg("%s: no whole page in the DOM: %.300s", url, text);
  return text;
}

static size_t count(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

static void test_pages_in_chromium(void **state) {
  (void)state;
  if (access(CHROMIUM, X_OK) != 0) {
    printf("chromium is not installed (scripts/setup installs it): skipped\n");
    skip();
  }
  test_tmpdir(dir, sizeof dir);
  char port_file[PATH_MAX + 16], master[96], base[128];
  snprintf(port_file, sizeof port_file, "%s/port", dir);
  setenv("FLINT_UI_PORT", "0", 1);
  start("driver", (const char *const[]){"driver", "--listen", "127.0.0.1:0", "--port-file", port_file, NULL});
  int port = 0;
  for (int i = 0; i < 3000 && port <= 0; i++) {
    FILE *f = fopen(port_file, "r");
    if (!f || fscanf(f, "%d", &port) != 1) port = 0;
    if (f) fclose(f);
    if (port <= 0) usleep(10000);
  }
  assert_true(port > 0);
  snprintf(master, sizeof master, "flint://127.0.0.1:%d", port);
  wait_ui_url(base, sizeof base);
  for (int e = 0; e < 2; e++)
    start(e ? "executor2" : "executor1",
          (const char *const[]){"executor", "--driver", master + 8, "--cores", "1", "--memory", "256m", NULL});

  /* a job with shuffles, then a training run */
  char pagerank[PATH_MAX];
  snprintf(pagerank, sizeof pagerank, "%s/pagerank.so", getenv("FLINT_BIN"));
  assert_int_equal(run("pagerank", (const char *const[]){"submit", "--master", master, pagerank, "2000", "2", "4",
                                                          NULL}),
                   0);
  assert_int_equal(run("train", (const char *const[]){"train", "--model", "mlp", "--data", "fashion-mnist",
                                                       "--train-images", "2048", "--batch", "256", "--epochs", "2",
                                                       "--ranks", "1", "--device", "cpu", "--master", master,
                                                       "--quiet", NULL}),
                   0);

  /* the applications: pagerank's first, the training run's newest */
  json_t *apps = get_json(base, "/api/v1/applications");
  assert_int_equal(json_array_size(apps), 2);
  char job_app[96], train_app[96];
  snprintf(train_app, sizeof train_app, "%s", json_string_value(json_object_get(json_array_get(apps, 0), "id")));
  snprintf(job_app, sizeof job_app, "%s", json_string_value(json_object_get(json_array_get(apps, 1), "id")));
  json_decref(apps);

  char path[256], page[256];
  char *dom = browse(base, "/", "applications");
  assert_non_null(strstr(dom, job_app));
  assert_non_null(strstr(dom, train_app));
  free(dom);
  /* every stage of pagerank's first job is on its page, and its DAG draws them */
  snprintf(path, sizeof path, "/api/v1/applications/%s/jobs/1", job_app);
  json_t *job = get_json(base, path);
  json_t *stage_ids = json_object_get(job, "stageIds");
  assert_true(json_array_size(stage_ids) >= 2);
  snprintf(page, sizeof page, "/job/?app=%s&id=1", job_app);
  dom = browse(base, page, "job");
  assert_non_null(strstr(dom, "<svg"));
  size_t i;
  json_t *id;
  json_array_foreach(stage_ids, i, id) {
    char name[64];
    snprintf(name, sizeof name, "Stage %lld", (long long)json_integer_value(id));
    if (!strstr(dom, name)) fail_msg("the job page lacks %s", name);
  }
  free(dom);
  /* a stage with a shuffle behind it: its DAG, task table and timeline */
  long long stage = json_integer_value(json_array_get(stage_ids, 0));
  json_decref(job);
  snprintf(page, sizeof page, "/stage/?app=%s&id=%lld", job_app, stage);
  dom = browse(base, page, "stage");
  assert_true(count(dom, "<svg") >= 2);
  free(dom);
  static const char *const tabs[] = {"jobs", "storage", "executors", "environment", "ps"};
  for (size_t t = 0; t < sizeof tabs / sizeof *tabs; t++) {
    snprintf(page, sizeof page, "/%s/?app=%s", tabs[t], job_app);
    dom = browse(base, page, tabs[t]);
    free(dom);
  }
  /* the training run's curves: one point a step */
  snprintf(path, sizeof path, "/api/v1/applications/%s/training", train_app);
  json_t *runs = get_json(base, path);
  assert_int_equal(json_array_size(runs), 1);
  size_t steps = json_array_size(json_object_get(json_array_get(runs, 0), "steps"));
  assert_true(steps >= 2);
  json_decref(runs);
  snprintf(page, sizeof page, "/training/?app=%s", train_app);
  dom = browse(base, page, "training");
  assert_true(count(dom, "<polyline") >= 1);
  free(dom);

  for (int c = num_children - 1; c >= 0; c--) {
    kill(children[c], SIGTERM);
    int st;
    waitpid(children[c], &st, 0);
  }
  num_children = 0;
  unsetenv("FLINT_UI_PORT");
  /* FLINT_TEST_KEEP=1 keeps the pages' DOMs and screenshots to look at */
  if (getenv("FLINT_TEST_KEEP")) printf("screenshots kept in %s\n", dir);
  else test_rmtree(dir);
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {cmocka_unit_test_setup(test_pages_in_chromium, test_bound_arm)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  for (int c = 0; c < num_children; c++) kill(children[c], SIGKILL);
  curl_global_cleanup();
  return rc;
}
