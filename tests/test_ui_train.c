/*
 * test_ui_train: training runs and parameter-server tables in a local context's web UI
 * (docs/ui.md), read back over HTTP as a browser would: a run of fl_train shows its
 * configuration (the allreduce algorithm the ranks ran), a step per report of the ranks and
 * its end; a failed run ends FAILED and its caller still reads its own message; a table shows
 * its shards; fl_context_post_event refuses bad events, naming the cause.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "flint/ps.h"
#include "flint/train.h"
#include "gpu/parallel/train.h"
#include "fashion_data.h"
#include "ui_client.h"
#include "train_examples.h"

#define assert_ok(call)                                                                      \
  do {                                                                                       \
    fl_status s_ = (call);                                                                   \
    if (s_ != FL_OK) fail_msg("%s: %s: %s", #call, fl_status_name(s_), fl_last_error());    \
  } while (0)


/* GET the context's UI + path as JSON (NULL unless 200 and JSON), with tests/ui_client.h. */
static json_t *api_json(fl_context *ctx, const char *path) {
  const char *base = fl_context_ui_url(ctx);
  assert_non_null(base);
  char url[512];
  snprintf(url, sizeof url, "%s%s", base, path);
  reply r = http(NULL, url, NULL);
  json_t *j = r.code == 200 ? json_loads((const char *)r.body.data, 0, NULL) : NULL;
  fl_buf_free(&r.body);
  return j;
}

static void sleep_ms(long ms) { nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000}, NULL); }

/* The run numbered `run`'s entry once it has ended (events are applied by the UI's thread, a
 * moment after they are posted): polls for up to 20 s. */
static json_t *ended_run(fl_context *ctx, json_int_t run) {
  for (int i = 0; i < 400; i++) {
    json_t *runs = api_json(ctx, "/api/v1/applications/current/training");
    size_t k;
    json_t *r;
    json_array_foreach(runs, k, r) {
      const char *st = json_string_value(json_object_get(r, "status"));
      if (json_integer_value(json_object_get(r, "run")) == run && st && strcmp(st, "RUNNING") != 0) {
        json_incref(r);
        json_decref(runs);
        return r;
      }
    }
    json_decref(runs);
    sleep_ms(50);
  }
  fail_msg("run %lld did not end in the UI within 20 s", (long long)run);
  return NULL;
}


static fl_status small_model(fl_model *m, uint32_t classes) {
  fl_status s = fl_model_linear(m, "fc1", 32, true);
  if (s == FL_OK) s = fl_model_relu(m);
  if (s == FL_OK) s = fl_model_linear(m, "fc2", (int)classes, true);
  return s;
}

static fl_status wrong_classes(fl_model *m, uint32_t classes) {
  return fl_model_linear(m, "fc", (int)classes + 1, true);
}

/* The number of the context's first run, once the UI shows it (polls for up to 20 s). */
static json_int_t first_run(fl_context *ctx) {
  for (int i = 0; i < 400; i++) {
    json_t *runs = api_json(ctx, "/api/v1/applications/current/training");
    json_int_t run = json_integer_value(json_object_get(json_array_get(runs, 0), "run"));
    json_decref(runs);
    if (run > 0) return run;
    sleep_ms(50);
  }
  fail_msg("no run in the UI within 20 s");
  return 0;
}

static void test_training_run(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  assert_non_null(fl_context_ui_url(ctx));
  fl_dataset *train = examples(ctx, 600, 1), *test = examples(ctx, 150, 2);
  fl_train_options o = FL_TRAIN_OPTIONS_INIT;
  o.ranks = 2;
  o.batch = 32;
  o.schedule.lr = 0.4;
  o.epochs = 2;
  int64_t shape[1] = {FEATURES};
  fl_train_result r;
  assert_ok(fl_train(ctx, train, test, 1, shape, CLASSES, small_model, &o, &r));

  /* Runs are numbered in the process, one after another. */
  json_int_t number = first_run(ctx);
  json_t *run = ended_run(ctx, number);
  assert_string_equal(json_string_value(json_object_get(run, "status")), "FINISHED");
  json_t *cfg = json_object_get(run, "config");
  assert_int_equal(json_integer_value(json_object_get(cfg, "ranks")), 2);
  assert_int_equal(json_integer_value(json_object_get(cfg, "batch")), 32);
  assert_string_equal(json_string_value(json_object_get(cfg, "sync")), "bsp");
  /* The host backend's AUTO names what it ran: the cost model's pick (gpu/comm/cost_model.h),
   * which depends on the links the communicator measured, so any algorithm it names. */
  const char *picked = json_string_value(json_object_get(cfg, "allreduce"));
  assert_non_null(picked);
  assert_true(strncmp(picked, "auto: ", 6) == 0);
  char names[128];
  snprintf(names, sizeof names, "%s", picked + 6);
  int named = 0;
  for (char *save = NULL, *name = strtok_r(names, " ", &save); name; name = strtok_r(NULL, " ", &save)) {
    if (strcmp(name, "and") == 0) continue;
    fl_allreduce_algo algo;
    assert_ok(fl_allreduce_algo_parse(name, &algo));
    assert_true(algo != FL_ALLREDUCE_AUTO);
    named++;
  }
  assert_true(named >= 1);

  /* A step per report: rank 0 reports every step of an epoch shorter than 40 steps, and the
   * epoch's row; the rows carry the test accuracy, the last one the run's result. */
  json_t *steps = json_object_get(run, "steps");
  assert_int_equal(json_array_size(steps), r.steps + r.epochs);
  size_t k, rows = 0;
  json_t *s, *last_row = NULL;
  json_int_t prev_step = 0, prev_bytes = 0;
  json_array_foreach(steps, k, s) {
    json_int_t step = json_integer_value(json_object_get(s, "step"));
    assert_true(step >= prev_step);
    prev_step = step;
    assert_true(json_is_number(json_object_get(s, "loss")));
    json_int_t bytes = json_integer_value(json_object_get(s, "bytesSent"));
    assert_true(bytes >= prev_bytes);
    prev_bytes = bytes;
    if (json_is_number(json_object_get(s, "testAccuracy"))) {
      rows++;
      last_row = s;
    }
  }
  assert_int_equal(rows, r.epochs);
  assert_non_null(last_row);
  assert_int_equal(json_integer_value(json_object_get(last_row, "epoch")), r.epochs);
  assert_int_equal(json_integer_value(json_object_get(last_row, "step")), r.steps);
  assert_true(json_number_value(json_object_get(last_row, "loss")) == r.train_loss);
  assert_true(json_number_value(json_object_get(last_row, "accuracy")) == r.train_acc);
  assert_true(json_number_value(json_object_get(last_row, "testAccuracy")) == r.test_acc);
  assert_true(prev_bytes > 0); /* two ranks allreduced gradients */
  json_decref(run);

  /* A run that fails ends FAILED with its message, which its caller still reads. */
  assert_int_equal(fl_train(ctx, train, test, 1, shape, CLASSES, wrong_classes, &o, &r), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "output is [n, 4], expected [n, 3]"));
  run = ended_run(ctx, number + 1);
  assert_string_equal(json_string_value(json_object_get(run, "status")), "FAILED");
  assert_non_null(strstr(json_string_value(json_object_get(run, "error")), "output is [n, 4], expected [n, 3]"));
  assert_int_equal(json_array_size(json_object_get(run, "steps")), 0);
  json_decref(run);

  fl_dataset_free(train);
  fl_dataset_free(test);
  fl_context_close(ctx);
}

/* The transformer on two pipeline stages: its configuration names the schedule and the
 * measured last step's forwards and backwards come as TrainPipeline, a row per stage. */
static void test_pipeline_timeline(void **state) {
  (void)state;
  NEED_DATA(); /* the transformer reads Fashion-MNIST */
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  gpu_train_options o = GPU_TRAIN_OPTIONS_INIT;
  o.model = NN_TRANSFORMER;
  o.ranks = 1;
  o.tp = 1;
  o.pp = 2;
  o.schedule = PP_1F1B;
  o.microbatches = 4;
  o.hidden = 32;
  o.heads = 4;
  o.blocks = 2;
  o.dropout = 0;
  o.batch = 32;
  o.epochs = 1;
  o.lr = 0.5;
  o.shuffle = false;
  o.max_train_images = 2 * 32;
  o.max_test_images = 32;
  o.csv_path = o.svg_path = NULL;
  gpu_train_result r;
  assert_ok(gpu_train_run_in(ctx, &o, &r));
  json_t *run = ended_run(ctx, first_run(ctx));
  json_t *cfg = json_object_get(run, "config");
  assert_string_equal(json_string_value(json_object_get(cfg, "schedule")), "1f1b");
  assert_int_equal(json_integer_value(json_object_get(cfg, "pp")), 2);
  assert_int_equal(json_integer_value(json_object_get(cfg, "microBatches")), 4);
  json_t *stages = json_object_get(run, "pipeline");
  assert_int_equal(json_array_size(stages), 2);
  size_t i, k;
  json_t *stage, *op;
  json_array_foreach(stages, i, stage) {
    int forwards = 0, backwards = 0;
    json_array_foreach(stage, k, op) {
      const char *kind = json_string_value(json_object_get(op, "Op"));
      assert_non_null(kind);
      forwards += strcmp(kind, "F") == 0;
      backwards += strcmp(kind, "B") == 0;
      json_int_t mb = json_integer_value(json_object_get(op, "MicroBatch"));
      assert_true(mb >= 0 && mb < 4);
      assert_true(json_number_value(json_object_get(op, "Start")) <=
                  json_number_value(json_object_get(op, "End")));
    }
    assert_int_equal(forwards, 4);
    assert_int_equal(backwards, 4);
  }
  json_decref(run);
  fl_context_close(ctx);
}

/* Worker w ends n iterations (its clock at the servers goes to n). */
static void clock_n(fl_ps_worker *w, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t ticket;
    assert_ok(fl_ps_clock(w, &ticket));
    assert_ok(fl_ps_wait(w, ticket, NULL));
  }
}

/* The context's one parameter-server table as /ps shows it, once the UI has it (up to 20 s). */
static json_t *wait_table(fl_context *ctx) {
  json_t *table = NULL;
  for (int i = 0; i < 400 && !table; i++) {
    json_t *all = api_json(ctx, "/api/v1/applications/current/ps");
    if (json_array_size(all) == 1) table = json_incref(json_array_get(all, 0));
    json_decref(all);
    if (!table) sleep_ms(50);
  }
  assert_non_null(table);
  return table;
}

static void test_ps_table(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[2]", NULL, &ctx));
  fl_ps_options po = FL_PS_OPTIONS_INIT;
  po.keys = 100;
  po.width = 2;
  po.shards = 3;
  po.workers = 2;
  fl_ps_table *t;
  assert_ok(fl_ps_table_create(ctx, &po, &t));
  fl_ps_worker *w;
  assert_ok(fl_ps_worker_open(fl_ps_table_handle(t), 0, &w));
  clock_n(w, 3);
  json_t *table = wait_table(ctx);
  assert_string_equal(json_string_value(json_object_get(table, "name")), "dense, 100 keys x 2 floats");
  json_t *shards = json_object_get(table, "shards");
  assert_int_equal(json_array_size(shards), 3);
  size_t k;
  json_t *s;
  json_array_foreach(shards, k, s) {
    assert_int_equal(json_integer_value(json_object_get(s, "shard")), k);
    assert_int_equal(json_integer_value(json_object_get(s, "primary")), 0); /* the local executor */
    assert_int_equal(json_array_size(json_object_get(s, "backups")), 1);
    /* the live clocks, from the primaries: worker 0 ended 3 iterations, worker 1 none */
    json_t *clocks = json_object_get(s, "clocks");
    assert_int_equal(json_object_size(clocks), 2);
    assert_int_equal(json_integer_value(json_object_get(clocks, "0")), 3);
    assert_int_equal(json_integer_value(json_object_get(clocks, "1")), 0);
  }
  json_decref(table);
  fl_ps_worker_close(w);
  fl_ps_table_destroy(t);
  /* A dropped table is asked no more: its clocks are gone, its shards stay as posted. */
  json_t *all = api_json(ctx, "/api/v1/applications/current/ps");
  assert_int_equal(json_array_size(all), 1);
  json_array_foreach(json_object_get(json_array_get(all, 0), "shards"), k, s)
      assert_null(json_object_get(s, "clocks"));
  json_decref(all);
  fl_context_close(ctx);
}

/* On a local cluster the driver places the table on its executors, posts it, and its live
 * source adds each shard's workers' clocks, asked of the primaries. */
static void test_cluster_ps_clocks(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local-cluster[2,1,256]", NULL, &ctx));
  fl_ps_options po = FL_PS_OPTIONS_INIT;
  po.keys = 10;
  po.shards = 2;
  po.workers = 2;
  fl_ps_table *t;
  assert_ok(fl_ps_table_create(ctx, &po, &t));
  fl_ps_worker *w;
  assert_ok(fl_ps_worker_open(fl_ps_table_handle(t), 1, &w));
  clock_n(w, 2);
  json_t *table = wait_table(ctx);
  json_t *shards = json_object_get(table, "shards");
  assert_int_equal(json_array_size(shards), 2);
  size_t k;
  json_t *s;
  json_array_foreach(shards, k, s) {
    json_int_t primary = json_integer_value(json_object_get(s, "primary"));
    json_t *backups = json_object_get(s, "backups");
    assert_int_equal(json_array_size(backups), 1);
    assert_true(primary >= 1 && json_integer_value(json_array_get(backups, 0)) != primary);
    json_t *clocks = json_object_get(s, "clocks");
    assert_int_equal(json_integer_value(json_object_get(clocks, "0")), 0);
    assert_int_equal(json_integer_value(json_object_get(clocks, "1")), 2);
  }
  json_decref(table);
  fl_ps_worker_close(w);
  fl_ps_table_destroy(t);
  fl_context_close(ctx);
}

static void test_post_event_refused(void **state) {
  (void)state;
  fl_context *ctx;
  assert_ok(fl_context_open("local[1]", NULL, &ctx));
  assert_int_equal(fl_context_post_event(ctx, "not json"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "not a JSON object"));
  assert_int_equal(fl_context_post_event(ctx, "[1, 2]"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "not a JSON object: another value"));
  assert_int_equal(fl_context_post_event(ctx, "{\"Event\":\"JobStart\",\"Job\":1}"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "event 'JobStart' is not one a program may post"));
  assert_int_equal(fl_context_post_event(ctx, "{\"Run\":1}"), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "(no Event field)"));
  size_t big = (64u << 10) + 100;
  char *text = malloc(big + 1);
  assert_non_null(text);
  int n = snprintf(text, big + 1, "{\"Event\":\"TrainStep\",\"Run\":7,\"Pad\":\"");
  memset(text + n, 'x', big - (size_t)n - 2);
  memcpy(text + big - 2, "\"}", 3);
  assert_int_equal(fl_context_post_event(ctx, text), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "an event of 65636 bytes (at most 65536)"));
  free(text);
  assert_int_equal(fl_context_post_event(ctx, NULL), FL_EINVAL);
  /* None of them reached the UI; a good one does. */
  assert_ok(fl_context_post_event(ctx, "{\"Event\":\"TrainStart\",\"Run\":9,\"Name\":\"mine\",\"Config\":{}}"));
  json_t *run = NULL;
  for (int i = 0; i < 400 && !run; i++) {
    json_t *runs = api_json(ctx, "/api/v1/applications/current/training");
    assert_true(json_array_size(runs) <= 1);
    if (json_array_size(runs) == 1) run = json_incref(json_array_get(runs, 0));
    json_decref(runs);
    if (!run) sleep_ms(50);
  }
  assert_non_null(run);
  assert_int_equal(json_integer_value(json_object_get(run, "run")), 9);
  assert_string_equal(json_string_value(json_object_get(run, "name")), "mine");
  assert_int_equal(json_array_size(json_object_get(run, "steps")), 0);
  json_decref(run);
  fl_context_close(ctx);
}

int main(void) {
  /* Every context of this program serves its UI, on a free port. */
  setenv("FLINT_UI", "1", 1);
  setenv("FLINT_UI_PORT", "0", 1);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_training_run),
      cmocka_unit_test(test_pipeline_timeline),
      cmocka_unit_test(test_ps_table),
      cmocka_unit_test(test_cluster_ps_clocks),
      cmocka_unit_test(test_post_event_refused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  curl_global_cleanup();
  return rc;
}
