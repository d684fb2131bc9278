/*
 * test_ui.c: the web UI and REST API (docs/ui.md) with a real HTTP client (libcurl): a local
 * context's UI while a job runs and after it; a local cluster's driver UI against what ran,
 * its event log replayed by `flint history` into the same figures; bad requests (404, 405,
 * 413); the shared secret's cases; a truncated event log.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
#include <curl/curl.h>
#include <jansson.h>

#include "flint/flint.h"

#define TEST_TIME_BOUND_S 240
#include "test_util.h"
#include "tls_certs.h"
#include "ui_client.h"

fl_status ui_key_mod10(fl_bytes rec, fl_buf *out, const void *arg);
fl_status ui_sum(fl_bytes a, fl_bytes b, fl_buf *out, const void *arg);
fl_status ui_wait_file(fl_bytes rec, fl_buf *out, const void *arg);

static json_int_t int_of(const json_t *o, const char *key) { return json_integer_value(json_object_get(o, key)); }
static const char *str_of(const json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* Every page answers 200 with HTML, the page of `stage` with its DAG and task timeline (two
 * SVGs); an unknown stage or page 404. */
static void check_pages(const char *base, json_int_t job, json_int_t stage) {
  char pages[9][64];
  snprintf(pages[0], 64, "/");
  snprintf(pages[1], 64, "/jobs/");
  snprintf(pages[2], 64, "/job/?id=%lld", (long long)job);
  snprintf(pages[3], 64, "/stage/?id=%lld", (long long)stage);
  snprintf(pages[4], 64, "/storage/");
  snprintf(pages[5], 64, "/executors/");
  snprintf(pages[6], 64, "/environment/");
  snprintf(pages[7], 64, "/ps/");
  snprintf(pages[8], 64, "/training/");
  for (int i = 0; i < 9; i++) {
    char url[256];
    snprintf(url, sizeof url, "%s%s", base, pages[i]);
    reply r = http(NULL, url, NULL);
    if (r.code != 200) fail_msg("GET %s: %ld", url, r.code);
    assert_non_null(strstr((char *)r.body.data, "<html"));
    if (i == 3) {
      const char *svg = strstr((char *)r.body.data, "<svg");
      assert_non_null(svg);
      assert_non_null(strstr(svg + 4, "<svg"));
    }
    fl_buf_free(&r.body);
  }
  char url[256];
  snprintf(url, sizeof url, "%s/stage/?id=99999", base);
  reply r = http(NULL, url, NULL);
  assert_int_equal(r.code, 404);
  fl_buf_free(&r.body);
  snprintf(url, sizeof url, "%s/no-such-page", base);
  r = http(NULL, url, NULL);
  assert_int_equal(r.code, 404);
  fl_buf_free(&r.body);
}

/* Polls until the application's job `job` has `status` (the UI applies events on its own
 * thread, a moment after they happen). */
static json_t *wait_job(const char *base, json_int_t job, const char *status) {
  char path[128];
  snprintf(path, sizeof path, "/api/v1/applications/current/jobs/%lld", (long long)job);
  for (int i = 0; i < 3000; i++) {
    if (get_code(base, path) == 200) {
      json_t *j = get_json(base, path);
      if (strcmp(str_of(j, "status"), status) == 0) return j;
      json_decref(j);
    }
    usleep(10000);
  }
  fail_msg("job %lld never became %s", (long long)job, status);
  return NULL;
}

/* ---- the jobs ----------------------------------------------------------------------------- */
/* A shuffle job (range -> key by residue -> reduce by key, 4 map and 3 reduce partitions)
 * and a count of a cached dataset twice: jobs 1, 2 and 3. */
static fl_dataset *cached_ds; /* run_jobs' cached dataset, left to its caller */

static void run_jobs(fl_context *ctx) {
  fl_dataset *nums, *keyed, *sums, *cached;
  must_ok(fl_range(ctx, 0, 1000, 1, 4, &nums));
  must_ok(fl_key_by(nums, ui_key_mod10, NULL, 0, &keyed));
  must_ok(fl_reduce_by_key(keyed, ui_sum, NULL, 0, NULL, 3, &sums));
  fl_records *out;
  must_ok(fl_collect(sums, &out));
  assert_int_equal(fl_records_count(out), 10);
  fl_records_free(out);
  must_ok(fl_range(ctx, 0, 100, 1, 2, &cached));
  must_ok(fl_cache(cached));
  uint64_t n;
  must_ok(fl_count(cached, &n));
  must_ok(fl_count(cached, &n));
  assert_int_equal(n, 100);
  cached_ds = cached;
  fl_dataset_free(sums);
  fl_dataset_free(keyed);
  fl_dataset_free(nums);
}

/* What the API says of run_jobs' jobs, checked against what ran. */
static void check_jobs(const char *base) {
  json_t *jobs = get_json(base, "/api/v1/applications/current/jobs");
  assert_int_equal(json_array_size(jobs), 3);
  json_t *shuffle = json_array_get(jobs, 2); /* newest first */
  assert_int_equal(int_of(shuffle, "jobId"), 1);
  assert_string_equal(str_of(shuffle, "status"), "SUCCEEDED");
  assert_int_equal(json_array_size(json_object_get(shuffle, "stageIds")), 2);
  assert_int_equal(int_of(shuffle, "numCompletedTasks"), 4 + 3);
  assert_int_equal(int_of(shuffle, "numActiveTasks"), 0);
  /* its stages: the map stage (4 tasks) is the result stage's parent */
  json_int_t result_id = json_integer_value(json_array_get(json_object_get(shuffle, "stageIds"), 0));
  json_int_t map_id = json_integer_value(json_array_get(json_object_get(shuffle, "stageIds"), 1));
  char path[160];
  snprintf(path, sizeof path, "/api/v1/applications/current/stages/%lld", (long long)map_id);
  json_t *maps = get_json(base, path), *map = json_array_get(maps, 0);
  assert_string_equal(str_of(map, "status"), "COMPLETE");
  assert_int_equal(int_of(map, "numTasks"), 4);
  assert_int_equal(int_of(map, "numCompleteTasks"), 4);
  assert_int_equal(json_object_size(json_object_get(map, "tasks")), 4);
  const char *k;
  json_t *t;
  json_object_foreach(json_object_get(map, "tasks"), k, t) {
    assert_string_equal(str_of(t, "status"), "SUCCESS");
    assert_non_null(str_of(t, "executorId"));
    assert_non_null(str_of(t, "taskLocality"));
    assert_true(json_number_value(json_object_get(t, "duration")) >= 0);
  }
  snprintf(path, sizeof path, "/api/v1/applications/current/stages/%lld", (long long)result_id);
  json_t *results = get_json(base, path), *result = json_array_get(results, 0);
  assert_int_equal(int_of(result, "numTasks"), 3);
  assert_int_equal(json_integer_value(json_array_get(json_object_get(result, "parentIds"), 0)), map_id);
  /* the shuffle's bytes: what the map tasks wrote, the reduce tasks read */
  assert_true(int_of(map, "shuffleWriteBytes") > 0);
  assert_int_equal(int_of(result, "shuffleReadBytes"), int_of(map, "shuffleWriteBytes"));
  snprintf(path, sizeof path, "/api/v1/applications/current/stages/%lld/0/taskList", (long long)result_id);
  json_t *list = get_json(base, path);
  assert_int_equal(json_array_size(list), 3);
  json_decref(list);
  json_decref(maps);
  json_decref(results);
  /* every task ran on an executor the API lists, which counts them */
  json_t *execs = get_json(base, "/api/v1/applications/current/executors");
  json_int_t completed = 0;
  size_t i;
  json_t *x;
  json_array_foreach(execs, i, x) completed += int_of(x, "completedTasks");
  assert_int_equal(completed, 4 + 3 + 2 + 2);
  json_decref(jobs);
  json_decref(execs);
}

/* ---- local mode --------------------------------------------------------------------------- */
typedef struct waiting_job {
  fl_context *ctx;
  char flag[PATH_MAX + 16];
  fl_status status;
} waiting_job;

static void *run_waiting(void *arg) {
  waiting_job *w = arg;
  fl_dataset *nums = NULL, *held = NULL;
  w->status = fl_range(w->ctx, 0, 8, 1, 2, &nums);
  if (w->status == FL_OK) w->status = fl_map(nums, ui_wait_file, w->flag, strlen(w->flag) + 1, &held);
  uint64_t n = 0;
  if (w->status == FL_OK) w->status = fl_count(held, &n);
  fl_dataset_free(held);
  fl_dataset_free(nums);
  return NULL;
}

static void test_local_ui_while_and_after(void **state) {
  (void)state;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir);
  setenv("FLINT_UI", "1", 1);
  setenv("FLINT_UI_PORT", "0", 1);
  fl_context *ctx;
  must_ok(fl_context_open("local[2]", NULL, &ctx));
  const char *base = fl_context_ui_url(ctx);
  assert_non_null(base);
  /* a job seen while it runs: its tasks wait for a file */
  waiting_job w = {.ctx = ctx};
  snprintf(w.flag, sizeof w.flag, "%s/release", dir);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, run_waiting, &w), 0);
  json_t *running = wait_job(base, 1, "RUNNING");
  for (int i = 0; i < 3000 && int_of(running, "numActiveTasks") < 2; i++) {
    json_decref(running);
    usleep(10000);
    running = wait_job(base, 1, "RUNNING");
  }
  assert_int_equal(int_of(running, "numActiveTasks"), 2);
  json_t *stages = get_json(base, "/api/v1/applications/current/stages");
  assert_string_equal(str_of(json_array_get(stages, 0), "status"), "ACTIVE");
  check_pages(base, 1, int_of(json_array_get(stages, 0), "stageId"));
  json_decref(stages);
  json_decref(running);
  test_write_file(w.flag, "", 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  must_ok(w.status);
  json_decref(wait_job(base, 1, "SUCCEEDED"));
  check_pages(base, 1, 0);
  /* the application, its executor ("driver") and environment */
  json_t *apps = get_json(base, "/api/v1/applications");
  assert_int_equal(json_array_size(apps), 1);
  json_decref(apps);
  json_t *execs = get_json(base, "/api/v1/applications/current/executors");
  assert_string_equal(str_of(json_array_get(execs, 0), "id"), "driver");
  assert_int_equal(int_of(json_array_get(execs, 0), "totalCores"), 2);
  json_decref(execs);
  json_t *env = get_json(base, "/api/v1/applications/current/environment");
  assert_true(json_array_size(json_object_get(env, "flintProperties")) > 10);
  json_decref(env);
  /* bad requests */
  assert_int_equal(get_code(base, "/api/v1/applications/no-such-app/jobs"), 404);
  assert_int_equal(get_code(base, "/api/v1/applications/current/jobs/999"), 404);
  assert_int_equal(get_code(base, "/api/v1/applications/current/stages/x"), 404);
  assert_int_equal(get_code(base, "/api/v1/nothing"), 404);
  char url[256];
  snprintf(url, sizeof url, "%s/api/v1/applications", base);
  reply r = http("POST", url, NULL);
  assert_int_equal(r.code, 405);
  fl_buf_free(&r.body);
  char *big = malloc(100 << 10);
  memcpy(big, "X-Big: ", 7);
  memset(big + 7, 'a', (100 << 10) - 8);
  big[(100 << 10) - 1] = 0;
  r = http(NULL, url, big);
  assert_int_equal(r.code, 413);
  fl_buf_free(&r.body);
  free(big);
  fl_context_close(ctx);
  unsetenv("FLINT_UI");
  unsetenv("FLINT_UI_PORT");
  test_rmtree(dir);
}

/* A local context without FLINT_UI serves nothing. */
static void test_local_ui_off_by_default(void **state) {
  (void)state;
  fl_context *ctx;
  must_ok(fl_context_open("local[1]", NULL, &ctx));
  assert_null(fl_context_ui_url(ctx));
  fl_context_close(ctx);
}

/* ---- the history server ------------------------------------------------------------------- */
typedef struct history {
  pid_t pid;
  char base[64];
} history;

/* History servers a failed test left running (their stderr is ctest's pipe). */
static pid_t running_history;

static int stop_leftovers(void **state) {
  (void)state;
  if (running_history > 0) {
    kill(running_history, SIGKILL);
    waitpid(running_history, NULL, 0);
    running_history = 0;
  }
  return 0;
}

static history history_start(const char *dir, const char *secret) {
  char port_file[PATH_MAX + 16], bin[PATH_MAX];
  snprintf(port_file, sizeof port_file, "%s.port", dir);
  unlink(port_file);
  snprintf(bin, sizeof bin, "%s/flint", getenv("FLINT_BIN"));
  history h = {0};
  h.pid = fork();
  assert_true(h.pid >= 0);
  if (h.pid == 0) {
    if (secret) setenv("FLINT_SECRET", secret, 1);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execl(bin, "flint", "history", "--dir", dir, "--listen", "127.0.0.1:0", "--port-file", port_file, (char *)NULL);
    _exit(127);
  }
  running_history = h.pid;
  for (int i = 0; i < 3000; i++) {
    FILE *f = fopen(port_file, "r");
    int port = 0;
    if (f && fscanf(f, "%d", &port) == 1 && port > 0) {
      fclose(f);
      snprintf(h.base, sizeof h.base, "http://127.0.0.1:%d", port);
      unlink(port_file);
      return h;
    }
    if (f) fclose(f);
    usleep(10000);
  }
  fail_msg("flint history did not start");
  return h;
}

static void history_stop(history *h) {
  kill(h->pid, SIGTERM);
  int st;
  waitpid(h->pid, &st, 0);
  running_history = 0;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* What the live UI and the history server must agree on: every endpoint's JSON, less the
 * live-only figures. */
static const char *const compared[] = {"/jobs", "/stages", "/stages/0", "/stages/1", "/executors", "/environment"};

static json_t *snapshot(const char *base, const char *app) {
  json_t *all = json_object();
  for (size_t i = 0; i < sizeof compared / sizeof *compared; i++) {
    char path[256];
    snprintf(path, sizeof path, "/api/v1/applications/%s%s", app, compared[i]);
    json_t *v = get_json(base, path);
    if (strcmp(compared[i], "/executors") == 0) {
      size_t k;
      json_t *x;
      json_array_foreach(v, k, x) {
        json_object_del(x, "lastHeartbeat");
        json_object_del(x, "cachedBytes");
      }
    }
    json_object_set_new(all, compared[i], v);
  }
  return all;
}

static void test_cluster_ui_and_history(void **state) {
  (void)state;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir);
  setenv("FLINT_EVENT_LOG_DIR", dir, 1);
  setenv("FLINT_UI_PORT", "0", 1);
  fl_context *ctx;
  must_ok(fl_context_open("local-cluster[2,1,512]", NULL, &ctx));
  const char *url = fl_context_ui_url(ctx);
  assert_non_null(url);
  char base[128];
  snprintf(base, sizeof base, "%s", url);
  run_jobs(ctx);
  json_decref(wait_job(base, 3, "SUCCEEDED"));
  check_jobs(base);
  check_pages(base, 1, 1);
  json_t *apps = get_json(base, "/api/v1/applications");
  char app[96];
  snprintf(app, sizeof app, "%s", str_of(json_array_get(apps, 0), "id"));
  json_decref(apps);
  /* The log goes on to the application's end, when its blocks go: compare the live UI once
   * they went (unpersisted; the executors report it with their next heartbeats). */
  must_ok(fl_unpersist(cached_ds));
  fl_dataset_free(cached_ds);
  for (int i = 0; i < 3000; i++) {
    json_t *execs = get_json(base, "/api/v1/applications/current/executors");
    json_int_t blocks = 0;
    size_t k;
    json_t *x;
    json_array_foreach(execs, k, x) blocks += int_of(x, "rddBlocks");
    json_decref(execs);
    if (blocks == 0) break;
    usleep(10000);
  }
  json_t *live = snapshot(base, app);
  fl_context_close(ctx);
  unsetenv("FLINT_EVENT_LOG_DIR");
  unsetenv("FLINT_UI_PORT");

  /* the event log, replayed: the same figures */
  history h = history_start(dir, NULL);
  json_t *replayed = snapshot(h.base, app);
  if (!json_equal(live, replayed)) {
    char *a = json_dumps(live, JSON_INDENT(1)), *b = json_dumps(replayed, JSON_INDENT(1));
    char pa[PATH_MAX + 32], pb[PATH_MAX + 32];
    snprintf(pa, sizeof pa, "%s/live.json", dir);
    snprintf(pb, sizeof pb, "%s/replayed.json", dir);
    test_write_file(pa, a, strlen(a));
    test_write_file(pb, b, strlen(b));
    history_stop(&h);
    fail_msg("the history server differs from the live UI: diff %s %s", pa, pb);
  }
  check_pages(h.base, 1, 1);
  json_t *happs = get_json(h.base, "/api/v1/applications");
  assert_true(json_is_true(json_object_get(json_array_get(json_object_get(json_array_get(happs, 0), "attempts"), 0),
                                           "completed")));
  json_decref(happs);
  history_stop(&h);

  /* a driver killed mid-line: the truncated last line is skipped, nothing else lost */
  char log[PATH_MAX + 128];
  snprintf(log, sizeof log, "%s/%s.jsonl", dir, app);
  FILE *f = fopen(log, "a");
  assert_non_null(f);
  fputs("{\"Event\":\"JobStart\",\"App\":\"", f);
  fclose(f);
  h = history_start(dir, NULL);
  json_t *again = snapshot(h.base, app);
  assert_true(json_equal(live, again));
  history_stop(&h);
  json_decref(again);
  json_decref(replayed);
  json_decref(live);
  test_rmtree(dir);
}

/* With a shared secret, every request must carry it. */
static void test_secret(void **state) {
  (void)state;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir);
  history h = history_start(dir, "s3cret");
  char url[256];
  snprintf(url, sizeof url, "%s/api/v1/applications", h.base);
  reply r = http(NULL, url, NULL);
  assert_int_equal(r.code, 401);
  fl_buf_free(&r.body);
  r = http(NULL, url, "Authorization: Bearer wrong");
  assert_int_equal(r.code, 401);
  fl_buf_free(&r.body);
  r = http(NULL, url, "Authorization: Bearer s3cret");
  assert_int_equal(r.code, 200);
  fl_buf_free(&r.body);
  /* basic auth: any user, the secret as password ("me:s3cret") */
  r = http(NULL, url, "Authorization: Basic bWU6czNjcmV0");
  assert_int_equal(r.code, 200);
  fl_buf_free(&r.body);
  r = http(NULL, url, "Authorization: Basic bWU6d3Jvbmc="); /* me:wrong */
  assert_int_equal(r.code, 401);
  fl_buf_free(&r.body);
  /* ?token= once, then its cookie */
  char with_token[300];
  snprintf(with_token, sizeof with_token, "%s?token=s3cret", url);
  r = http(NULL, with_token, NULL);
  assert_int_equal(r.code, 200);
  assert_true(strncmp(r.cookie, "flint_token=", 12) == 0);
  char cookie[300];
  snprintf(cookie, sizeof cookie, "Cookie: %s", r.cookie);
  fl_buf_free(&r.body);
  r = http(NULL, url, cookie);
  assert_int_equal(r.code, 200);
  fl_buf_free(&r.body);
  history_stop(&h);
  test_rmtree(dir);
}

/* With TLS, the UI speaks HTTPS with the cluster's certificate (and still wants the secret). */
static void test_https(void **state) {
  (void)state;
  char certs[256], dir[PATH_MAX];
  assert_true(tls_make_certs(certs, sizeof certs, "127.0.0.1"));
  test_tmpdir(dir, sizeof dir);
  tls_env_on(certs);
  history h = history_start(dir, "s3cret");
  tls_env_off();
  char url[256], ca[300];
  snprintf(ca, sizeof ca, "%s/ca.pem", certs);
  int port = atoi(strrchr(h.base, ':') + 1);
  snprintf(url, sizeof url, "https://127.0.0.1:%d/api/v1/applications", port);
  CURL *c = curl_easy_init();
  reply r = {0};
  struct curl_slist *headers = curl_slist_append(NULL, "Authorization: Bearer s3cret");
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_CAINFO, ca);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) fail_msg("GET %s: %s", url, curl_easy_strerror(rc));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.code);
  assert_int_equal(r.code, 200);
  curl_slist_free_all(headers);
  curl_easy_cleanup(c);
  fl_buf_free(&r.body);
  /* plain HTTP gets no answer from it */
  snprintf(url, sizeof url, "http://127.0.0.1:%d/api/v1/applications", port);
  c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  reply r2 = {0};
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r2);
  rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  assert_true(rc != CURLE_OK || code != 200);
  curl_easy_cleanup(c);
  fl_buf_free(&r2.body);
  history_stop(&h);
  test_rmtree(dir);
  test_rmtree(certs);
}

/* Runs a shell command, its output into out; its exit status (-1: no normal exit). */
static int run_shell(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The command line's flag: `flint submit --ui` serves a local master's UI; fl_options too. */
static void test_ui_flag_and_option(void **state) {
  (void)state;
  char cmd[PATH_MAX * 2];
  snprintf(cmd, sizeof cmd, "%s/flint submit --ui --conf ui_port=0 --master 'local[1]' %s/pi.so 1000 2>&1",
           getenv("FLINT_BIN"), getenv("FLINT_BIN"));
  char out[8192];
  if (run_shell(cmd, out, sizeof out) != 0) fail_msg("%s: %s", cmd, out);
  assert_non_null(strstr(out, "web UI available at http://127.0.0.1:"));
  fl_options o = FL_OPTIONS_INIT;
  o.web_ui = true;
  setenv("FLINT_UI_PORT", "0", 1);
  fl_context *ctx;
  must_ok(fl_context_open("local[1]", &o, &ctx));
  assert_non_null(fl_context_ui_url(ctx));
  /* the UI applies events on its own thread, a moment after they happen */
  size_t seen = 0;
  for (int i = 0; i < 3000 && seen == 0; i++) {
    json_t *apps = get_json(fl_context_ui_url(ctx), "/api/v1/applications");
    seen = json_array_size(apps);
    json_decref(apps);
    if (!seen) usleep(10000);
  }
  assert_int_equal(seen, 1);
  fl_context_close(ctx);
  unsetenv("FLINT_UI_PORT");
}

/* flint history on a folder it cannot read fails with a message that names it. */
static void test_history_bad_dir(void **state) {
  (void)state;
  char cmd[PATH_MAX + 128];
  snprintf(cmd, sizeof cmd, "%s/flint history --dir /nonexistent/flint-logs 2>&1", getenv("FLINT_BIN"));
  char out[1024];
  assert_int_equal(run_shell(cmd, out, sizeof out), 1);
  assert_non_null(strstr(out, "/nonexistent/flint-logs"));
}

int main(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_local_ui_off_by_default, test_bound_arm),
      cmocka_unit_test_setup(test_local_ui_while_and_after, test_bound_arm),
      cmocka_unit_test_setup_teardown(test_cluster_ui_and_history, test_bound_arm, stop_leftovers),
      cmocka_unit_test_setup_teardown(test_secret, test_bound_arm, stop_leftovers),
      cmocka_unit_test_setup_teardown(test_https, test_bound_arm, stop_leftovers),
      cmocka_unit_test_setup(test_ui_flag_and_option, test_bound_arm),
      cmocka_unit_test_setup(test_history_bad_dir, test_bound_arm),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
