/*
 * test_ui_store.c: the UI's store and event log without HTTP (driver/ui/): events posted in
 * any state, malformed ones dropped with the rest kept, retention of old jobs, a log with a
 * damaged middle line and a truncated last one, and the checks of programs' events.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "driver/ui/ui_internal.h"
#include "test_util.h"

static ui *make_ui(const char *log_dir) {
  ui_config cfg = {.port = -1, .title = "test", .app_prefix = "test", .log_dir = log_dir};
  ui *u = NULL;
  must_ok(ui_create(&cfg, &u));
  return u;
}

static json_t *api(ui *u, const char *path) {
  fl_buf body = FL_BUF_INIT;
  const char *type;
  int code = ui_get(u, path, NULL, &body, &type);
  assert_int_equal(code, 200);
  assert_string_equal(type, "application/json");
  json_t *v = json_loadb((const char *)body.data, body.len, 0, NULL);
  assert_non_null(v);
  fl_buf_free(&body);
  return v;
}

static void test_malformed_events_are_dropped(void **state) {
  (void)state;
  ui *u = make_ui(NULL);
  ui_post(u, "{\"Event\":\"ApplicationStart\",\"App\":1,\"Name\":\"a\"}");
  ui_post(u, "not json at all");
  ui_post(u, "[1,2,3]");
  ui_post(u, "{\"NoEvent\":1}");
  ui_post(u, "{\"Event\":\"JobStart\",\"App\":1,\"Job\":1,\"Stages\":\"not a list\"}");
  ui_post(u, "{\"Event\":\"TaskEnd\",\"App\":1,\"Job\":9,\"Stage\":9,\"Task\":1}"); /* of nothing known */
  ui_post(u, "{\"Event\":\"JobStart\",\"App\":1,\"Job\":2,\"Name\":\"ok\",\"Stages\":[{\"Stage\":0,\"Tasks\":2}]}");
  ui_sync(u);
  json_t *jobs = api(u, "/api/v1/applications/app-test-0001/jobs");
  assert_int_equal(json_array_size(jobs), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 0), "name")), "ok");
  json_decref(jobs);
  ui_destroy(u);
}

static void test_old_jobs_are_forgotten(void **state) {
  (void)state;
  ui *u = make_ui(NULL);
  ui_post(u, "{\"Event\":\"ApplicationStart\",\"App\":1,\"Name\":\"a\"}");
  for (int j = 1; j <= 1010; j++)
    ui_postf(u, "{\"Event\":\"JobStart\",\"App\":1,\"Job\":%d,\"Stages\":[{\"Stage\":%d,\"Tasks\":1}]}", j, j);
  ui_sync(u);
  json_t *jobs = api(u, "/api/v1/applications/app-test-0001/jobs");
  assert_int_equal(json_array_size(jobs), 1000);
  assert_int_equal(json_integer_value(json_object_get(json_array_get(jobs, 999), "jobId")), 11);
  json_decref(jobs);
  json_t *stages = api(u, "/api/v1/applications/app-test-0001/stages");
  assert_int_equal(json_array_size(stages), 1000); /* their stages went with them */
  json_decref(stages);
  ui_destroy(u);
}

static void test_replay_skips_damaged_lines(void **state) {
  (void)state;
  char dir[PATH_MAX], path[PATH_MAX + 32];
  test_tmpdir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/app-x-0001.jsonl", dir);
  const char *log = "{\"Event\":\"ApplicationStart\",\"App\":\"app-x-0001\",\"Name\":\"n\",\"Time\":1}\n"
                    "{\"Event\":\"JobStart\",\"App\":\"app-x-0001\",\"Job\":1,\"Stages\":[],\"Time\":2}\n"
                    "garbage in the middle\n"
                    "{\"Event\":\"JobEnd\",\"App\":\"app-x-0001\",\"Job\":1,\"Result\":\"SUCCEEDED\",\"Time\":3}\n"
                    "{\"Event\":\"JobStart\",\"App\":\"app-x-0001\",\"Jo";
  test_write_file(path, log, strlen(log));
  ui *u = make_ui(NULL);
  must_ok(ui_history_load(u, dir));
  json_t *jobs = api(u, "/api/v1/applications/app-x-0001/jobs");
  assert_int_equal(json_array_size(jobs), 1);
  assert_string_equal(json_string_value(json_object_get(json_array_get(jobs, 0), "status")), "SUCCEEDED");
  json_decref(jobs);
  assert_int_equal(ui_history_load(u, "/nonexistent/flint"), FL_EIO);
  assert_non_null(strstr(fl_last_error(), "/nonexistent/flint"));
  ui_destroy(u);
  test_rmtree(dir);
}

/* What is logged is what the store applied: a replay gives the same answers. */
static void test_log_round_trip(void **state) {
  (void)state;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir);
  ui *u = make_ui(dir);
  ui_post(u, "{\"Event\":\"ExecutorAdded\",\"Executor\":1,\"Host\":\"h:1\",\"Cores\":2,\"Memory\":100,\"GPU\":-1}");
  ui_post_application(u, 1, "round trip", "local[1]");
  ui_post(u, "{\"Event\":\"JobStart\",\"App\":1,\"Job\":1,\"Name\":\"count\",\"Stages\":[{\"Stage\":0,\"Tasks\":1}]}");
  ui_post(u, "{\"Event\":\"StageSubmitted\",\"App\":1,\"Job\":1,\"Stage\":0,\"Attempt\":0,\"Tasks\":1}");
  ui_post(u, "{\"Event\":\"TaskStart\",\"App\":1,\"Job\":1,\"Stage\":0,\"Task\":7,\"Executor\":1}");
  ui_post(u, "{\"Event\":\"TaskEnd\",\"App\":1,\"Job\":1,\"Stage\":0,\"Task\":7,\"Executor\":1,\"Status\":\"SUCCESS\","
             "\"Duration\":1.5,\"RunTime\":1.0,\"InputBytes\":10}");
  ui_post(u, "{\"Event\":\"BlockUpdated\",\"App\":1,\"RDD\":3,\"Partition\":0,\"Executor\":1,\"Memory\":64,\"Disk\":0}");
  ui_post(u, "{\"Event\":\"ApplicationEnd\",\"App\":1}");
  ui_sync(u);
  static const char *const paths[] = {"/api/v1/applications/current/jobs", "/api/v1/applications/current/stages/0",
                                      "/api/v1/applications/current/executors",
                                      "/api/v1/applications/current/storage/rdd"};
  json_t *live[4];
  for (int i = 0; i < 4; i++) live[i] = api(u, paths[i]);
  ui_destroy(u);
  ui *h = make_ui(NULL);
  must_ok(ui_history_load(h, dir));
  for (int i = 0; i < 4; i++) {
    json_t *again = api(h, paths[i]);
    assert_true(json_equal(live[i], again));
    json_decref(again);
    json_decref(live[i]);
  }
  ui_destroy(h);
  test_rmtree(dir);
}

/* Tasks' notes go straight into the store when no log is kept, and through their events when
 * one is: both ways give the same answers. */
static void feed_notes(ui *u) {
  ui_post_application(u, 1, "notes", "local[2]");
  ui_post(u, "{\"Event\":\"JobStart\",\"App\":1,\"Job\":1,\"Name\":\"count\",\"Stages\":[{\"Stage\":4,\"Tasks\":3}]}");
  for (uint32_t i = 0; i < 3; i++) {
    sched_note n = {.kind = SCHED_TASK_STARTED, .job = 1, .group = 1, .stage = 4, .index = i, .attempt = 1,
                    .task_id = 10 + i, .executor = 1 + i % 2, .locality = SCHED_NODE_LOCAL, .speculative = i == 2};
    ui_scheduler_note(u, &n);
    n.kind = SCHED_TASK_ENDED;
    n.duration_ns = 1500000 * (i + 1);
    n.run_ns = 1000000;
    n.input_bytes = 100 * i;
    n.shuffle_write_bytes = 7;
    n.status = i == 1 ? FL_EIO : i == 2 ? FL_ECANCELLED : FL_OK;
    n.error = i == 1 ? "disk gone" : NULL;
    ui_scheduler_note(u, &n);
  }
  ui_sync(u);
}

/* Drops the wall-clock times (fields named ...Time) the two UIs stamp a moment apart. */
static void strip_times(json_t *v) {
  if (json_is_array(v)) {
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) strip_times(x);
  } else if (json_is_object(v)) {
    const char *k;
    json_t *x;
    void *tmp;
    json_object_foreach_safe(v, tmp, k, x) {
      size_t n = strlen(k);
      if (n >= 4 && strcmp(k + n - 4, "Time") == 0) json_object_del(v, k);
      else strip_times(x);
    }
  }
}

static void test_note_paths_agree(void **state) {
  (void)state;
  char dir[PATH_MAX];
  test_tmpdir(dir, sizeof dir);
  ui *direct = make_ui(NULL), *logged = make_ui(dir);
  feed_notes(direct);
  feed_notes(logged);
  static const char *const paths[] = {"/api/v1/applications/current/jobs", "/api/v1/applications/current/stages/4",
                                      "/api/v1/applications/current/executors"};
  for (int i = 0; i < 3; i++) {
    json_t *a = api(direct, paths[i]), *b = api(logged, paths[i]);
    strip_times(a);
    strip_times(b);
    if (!json_equal(a, b)) {
      char *ta = json_dumps(a, 0), *tb = json_dumps(b, 0);
      fail_msg("%s differs:\n%s\n%s", paths[i], ta, tb);
    }
    json_decref(a);
    json_decref(b);
  }
  json_t *st = api(direct, "/api/v1/applications/current/stages/4");
  json_t *stage = json_array_get(st, 0);
  assert_int_equal(json_integer_value(json_object_get(stage, "numCompleteTasks")), 1);
  assert_int_equal(json_integer_value(json_object_get(stage, "numFailedTasks")), 1);
  assert_int_equal(json_integer_value(json_object_get(stage, "numKilledTasks")), 1);
  assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(stage, "tasks"), "11"),
                                                        "errorMessage")),
                      "disk gone");
  json_decref(st);
  ui_destroy(direct);
  ui_destroy(logged);
  test_rmtree(dir);
}

static void test_program_events_are_checked(void **state) {
  (void)state;
  ui *u = make_ui(NULL);
  assert_int_equal(ui_post_program_event(u, 1, "not json"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "not a JSON object"));
  assert_int_equal(ui_post_program_event(u, 1, "[1]"), FL_EINVAL);
  assert_int_equal(ui_post_program_event(u, 1, "{\"Event\":\"JobEnd\"}"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "JobEnd"));
  char *big = malloc(UI_PROGRAM_EVENT_MAX + 64);
  snprintf(big, 64, "{\"Event\":\"TrainStep\",\"Pad\":\"");
  memset(big + strlen(big), 'x', UI_PROGRAM_EVENT_MAX);
  strcpy(big + UI_PROGRAM_EVENT_MAX + 20, "\"}");
  assert_int_equal(ui_post_program_event(u, 1, big), FL_EINVAL);
  free(big);
  must_ok(ui_post_program_event(u, 1, "{\"Event\":\"TrainStep\",\"Run\":1,\"Epoch\":1,\"Loss\":0.5}"));
  ui_sync(u);
  json_t *runs = api(u, "/api/v1/applications/app-test-0001/training");
  assert_int_equal(json_array_size(json_object_get(json_array_get(runs, 0), "steps")), 1);
  json_decref(runs);
  ui_destroy(u);
}

/* A UI whose HTTP server stops as soon as it started (a short program with --ui): every
 * stop returns, also when it comes before the server's thread (at the lowest priority) has
 * entered its loop. Before the fix the stop could be lost there and the join hang. */
static void test_server_stopped_at_once(void **state) {
  (void)state;
  for (int i = 0; i < 200; i++) {
    ui_config cfg = {.port = 0, .title = "test", .app_prefix = "test"};
    ui *u = NULL;
    must_ok(ui_create(&cfg, &u));
    assert_true(ui_port(u) > 0);
    ui_destroy(u);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_malformed_events_are_dropped, test_bound_arm),
      cmocka_unit_test_setup(test_old_jobs_are_forgotten, test_bound_arm),
      cmocka_unit_test_setup(test_replay_skips_damaged_lines, test_bound_arm),
      cmocka_unit_test_setup(test_log_round_trip, test_bound_arm),
      cmocka_unit_test_setup(test_program_events_are_checked, test_bound_arm),
      cmocka_unit_test_setup(test_note_paths_agree, test_bound_arm),
      cmocka_unit_test_setup(test_server_stopped_at_once, test_bound_arm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
