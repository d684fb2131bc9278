/* test_ui_pages.c: the web UI's HTML pages (driver/ui/pages.c, svg.c) over a fake REST API that
 * answers fixture JSON: every page's content and charts, escaping, 404s, empty lists, huge
 * values and running out of memory. */
#include "test_util.h"

#include <limits.h>

#include <jansson.h>

#include "driver/ui/ui_internal.h"

#define APP "app-1-0001"
#define EMPTY "app-1-0002"
#define HUGE_APP "app-huge"

/* ---- the fake API ---------------------------------------------------------------------- */

typedef struct fake {
  json_t *routes; /* API path -> its answer */
  char paths[256][512];
  int n_paths;
} fake;

/* Answers routes; "/applications/current..." is APP's (the newest application). */
static json_t *fake_api(void *arg, const char *path, int *status) {
  fake *f = arg;
  if (f->n_paths < 256) snprintf(f->paths[f->n_paths++], sizeof f->paths[0], "%s", path);
  char real[512];
  if (!strncmp(path, "/applications/current", 21))
    snprintf(real, sizeof real, "/applications/" APP "%s", path + 21);
  else
    snprintf(real, sizeof real, "%s", path);
  json_t *v = json_object_get(f->routes, real);
  if (!v) {
    *status = 404;
    return NULL;
  }
  *status = 200;
  return json_incref(v);
}

/* JSON written with single quotes (\u0027 for a quote inside a string). */
static json_t *J(const char *text) {
  char *s = strdup(text);
  assert_non_null(s);
  for (char *c = s; *c; c++)
    if (*c == '\'') *c = '"';
  json_error_t err;
  json_t *v = json_loads(s, JSON_DECODE_ANY, &err);
  if (!v) fail_msg("fixture: %s at line %d col %d", err.text, err.line, err.column);
  free(s);
  return v;
}

static void route(fake *f, const char *path, json_t *v) {
  assert_non_null(v);
  assert_int_equal(json_object_set_new(f->routes, path, v), 0);
}

#define TASK(id, index, attempt, exec, status, err, spec) TASK_OF(id, index, attempt, 0, 400, exec, status, err, spec)
#define TASK_OF(id, index, attempt, stage_attempt, duration, exec, status, err, spec)                                \
  "'" #id "': {'taskId': " #id ", 'index': " #index ", 'attempt': " #attempt ", 'stageAttemptId': " #stage_attempt \
  ", 'launchTime': 1764353113000, 'duration': " #duration ", 'executorId': '" exec "', 'host': 'h" exec "', 'status': '" status "', "                         \
  "'taskLocality': 'PROCESS_LOCAL', 'speculative': " spec ", 'errorMessage': '" err "', "                           \
  "'taskMetrics': {'executorRunTime': 350, 'inputMetrics': {'bytesRead': 2048}, "                                  \
  "'shuffleReadMetrics': {'remoteBytesRead': 1024}, 'shuffleWriteMetrics': {'bytesWritten': 512}}}"

#define STAGE0                                                                                                       \
  "'stageId': 0, 'attemptId': 0, 'name': 'map at <stdin>:3', 'status': 'COMPLETE', 'jobIds': [0], "              \
  "'parentIds': [], 'numTasks': 2, 'numActiveTasks': 0, 'numCompleteTasks': 2, 'numFailedTasks': 0, "              \
  "'numKilledTasks': 0, 'submissionTime': 1764353112000, 'completionTime': 1764353113000, "                        \
  "'executorRunTime': 700, 'inputBytes': 4096, 'shuffleReadBytes': 0, 'shuffleWriteBytes': 2048, "                 \
  "'rddInfos': [{'id': 0, 'name': 'textFile', 'op': 'source'}]"
#define STAGE1                                                                                                       \
  "'stageId': 1, 'attemptId': 0, 'name': 'reduceByKey & collect', 'status': 'COMPLETE', 'jobIds': [0], "          \
  "'parentIds': [0], 'numTasks': 3, 'numActiveTasks': 0, 'numCompleteTasks': 2, 'numFailedTasks': 1, "             \
  "'numKilledTasks': 0, 'submissionTime': 1764353113000, 'completionTime': 1764353114000, "                        \
  "'executorRunTime': 900, 'inputBytes': 0, 'shuffleReadBytes': 2048, 'shuffleWriteBytes': 0, "                    \
  "'rddInfos': [{'id': 1, 'name': 'shuffled', 'op': 'shuffle'}, {'id': 2, 'name': 'mapValues <x>', 'op': 'map'}, " \
  "{'id': 3, 'name': 'collect', 'op': 'action'}]"
/* Stage 2 as the store keeps it: one entry (the newest attempt) with the tasks of all. */
#define STAGE2                                                                                                       \
  "'stageId': 2, 'attemptId': 1, 'name': 'count', 'status': 'ACTIVE', 'jobIds': [1], 'parentIds': [], "            \
  "'numTasks': 4, 'numActiveTasks': 1, 'numCompleteTasks': 0, 'numFailedTasks': 0, 'numKilledTasks': 0, "          \
  "'submissionTime': 1764353115000, 'completionTime': -1, 'failureReason': 'fetch <failed>', "                     \
  "'rddInfos': [{'id': 4, 'name': 'words', 'numPartitions': 4, 'cached': true}]"
/* Stage 3 in Spark's shape: an entry per attempt; no tasks. */
#define STAGE3(attempt, status)                                                                                      \
  "'stageId': 3, 'attemptId': " #attempt ", 'name': 'count', 'status': '" status "', 'jobIds': [1], "              \
  "'parentIds': [2], 'numTasks': 4, 'numActiveTasks': 0, 'numCompleteTasks': 0, 'numFailedTasks': 0, "             \
  "'numKilledTasks': 0, 'submissionTime': -1, 'completionTime': -1, 'rddInfos': []"

/* Five steps; the test accuracy only at steps 3 and 5; the bytes sent so far (1000 a step). */
#define STEP(i, test) \
  "{'epoch': 0, 'step': " #i ", 'time': 17643531" #i "0000, 'loss': 2." #i ", 'accuracy': 0." #i test               \
  ", 'imagesPerSecond': 100" #i ", 'bytesSent': " #i "000}"

static fake *fixture(void) {
  fake *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->routes = json_object();
  route(f, "/applications",
        J("[{'id': '" APP "', 'name': 'demo <script>alert(\\u0027x\\u0027)</script> & co', 'attempts': "
          "[{'startTime': 1764353112000, 'endTime': 0, 'duration': 5000, 'completed': false, 'sparkUser': 'ann'}]},"
          "{'id': '" EMPTY "', 'name': 'empty', 'attempts': [{'startTime': 1764353000000, 'endTime': 1764353001000, "
          "'duration': 1000, 'completed': true, 'sparkUser': 'bob'}]}]"));
  /* APP is found through the list; EMPTY through /applications/{app}. */
  route(f, "/applications/" EMPTY, J("{'id': '" EMPTY "', 'name': 'empty', 'attempts': []}"));

  const char *job1 = "{'jobId': 1, 'name': 'count <i>words</i> & more', 'submissionTime': 1764353115000, "
                     "'completionTime': -1, 'stageIds': [2, 3], 'status': 'RUNNING', 'numTasks': 4, 'numActiveTasks': 2, "
                     "'numCompletedTasks': 1, 'numFailedTasks': 1, 'numKilledTasks': 0, 'errorMessage': ''}";
  const char *job0 = "{'jobId': 0, 'name': 'collect', 'submissionTime': 1764353112000, "
                     "'completionTime': 1764353114000, 'stageIds': [0, 1], 'status': 'SUCCEEDED', 'numTasks': 5, "
                     "'numActiveTasks': 0, 'numCompletedTasks': 5, 'numFailedTasks': 0, 'numKilledTasks': 0, "
                     "'errorMessage': ''}";
  char buf[4096];
  snprintf(buf, sizeof buf, "[%s, %s]", job1, job0);
  route(f, "/applications/" APP "/jobs", J(buf));
  route(f, "/applications/" APP "/jobs/1", J(job1));
  route(f, "/applications/" APP "/jobs/0", J(job0));
  route(f, "/applications/" APP "/stages",
        J("[{" STAGE0 "}, {" STAGE1 "}, {" STAGE2 "}, {" STAGE3(1, "PENDING") "}, {" STAGE3(0, "FAILED") "}]"));
  route(f, "/applications/" APP "/stages/0",
        J("[{" STAGE0 ", 'tasks': {" TASK(0, 0, 0, "1", "SUCCESS", "", "false") ", " TASK(1, 1, 0, "2", "SUCCESS", "",
                                                                                           "false") "}}]"));
  route(f, "/applications/" APP "/stages/1",
        J("[{" STAGE1 ", 'tasks': {" TASK(2, 0, 0, "1", "SUCCESS", "", "false") ", " TASK(
            3, 1, 0, "2", "FAILED", "boom <oops> & \\u0027quote\\u0027", "false") ", " TASK(4, 1, 1, "10", "SUCCESS", "",
                                                                                         "true") "}}]"));
  route(f, "/applications/" APP "/stages/2",
        J("[{" STAGE2 ", 'tasks': {" TASK_OF(5, 0, 0, 0, 100, "1", "FAILED", "fetch failed", "false") ", " TASK_OF(
            6, 0, 0, 1, -1, "2", "RUNNING", "", "false") "}}]"));
  route(f, "/applications/" APP "/stages/3",
        J("[{" STAGE3(0, "FAILED") ", 'failureReason': 'lost <map> output', 'tasks': {}}, {" STAGE3(1, "PENDING") ", "
          "'tasks': {}}]"));
  route(f, "/applications/" APP "/storage/rdd",
        J("[{'id': 3, 'name': 'cached <rdd>', 'numPartitions': 4, 'numCachedPartitions': 2, 'storageLevel': "
          "'MEMORY_ONLY', 'memoryUsed': 4096, 'diskUsed': 0, 'dataDistribution': [{'address': 'h1:7078', "
          "'memoryUsed': 2048, 'diskUsed': 0}, {'address': 'h2:7078', 'memoryUsed': 2048, 'diskUsed': 0}], "
          "'partitions': [{'blockName': 'rdd_3_0', 'memoryUsed': 2048, 'diskUsed': 0, 'executors': ['1']}, "
          "{'blockName': 'rdd_3_1', 'memoryUsed': 2048, 'diskUsed': 0, 'executors': ['2']}]}]"));
  route(f, "/applications/" APP "/executors",
        J("[{'id': '1', 'hostPort': 'h1:7078', 'isActive': true, 'totalCores': 4, 'maxMemory': 1073741824, "
          "'gpu': 0, 'rddBlocks': 1, 'memoryUsed': 2048, 'diskUsed': 0, 'activeTasks': 2, 'failedTasks': 0, "
          "'completedTasks': 7, 'totalTasks': 9, 'totalDuration': 5000, 'addTime': 1764353111000, "
          "'lastHeartbeat': 1764353116000},"
          "{'id': '2', 'hostPort': 'h2:7078', 'isActive': false, 'totalCores': 2, 'maxMemory': 536870912, "
          "'gpu': -1, 'rddBlocks': 0, 'memoryUsed': 0, 'diskUsed': 0, 'activeTasks': 0, 'failedTasks': 1, "
          "'completedTasks': 1, 'totalTasks': 2, 'totalDuration': 900, 'addTime': 1764353111000, "
          "'removeTime': 1764353114500, 'removeReason': 'lost <heartbeat> & gone', 'lastHeartbeat': 1764353114000}]"));
  route(f, "/applications/" APP "/environment",
        J("{'flintProperties': [['flint.master', 'local[2]'], ['weird', '<a href=\\u0027x\\u0027>&']]}"));
  route(f, "/applications/" APP "/ps",
        J("[{'table': 0, 'name': 'weights <w>', 'shards': [{'shard': 0, 'primary': 1, 'backups': [2], "
          "'clocks': {'w0': 5, 'w1': 4}}, {'shard': 1, 'primary': 2, 'backups': []}]}]"));
  route(f, "/applications/" APP "/training",
        J("[{'run': 1, 'name': 'resnet <tiny>', 'status': 'RUNNING', 'config': {'model': 'tiny_resnet', "
          "'ranks': 2, 'dp': 1, 'tp': 1, 'pp': 2, 'schedule': '1f1b', 'allreduce': 'ring'}, 'steps': [" STEP(1, "") ", " STEP(
              2, "") ", " STEP(3, ", 'testAccuracy': 0.5") ", " STEP(4, "") ", " STEP(5, ", 'testAccuracy': 0.6") "], "
          "'pipeline': [[{'op': 'F', 'microBatch': 0, 'start': 0, 'end': 10}, {'op': 'F', 'microBatch': 1, "
          "'start': 10, 'end': 20}, {'op': 'B', 'microBatch': 0, 'start': 30, 'end': 50}], "
          "[{'Op': 'F', 'MicroBatch': 0, 'Start': 10, 'End': 20}, {'Op': 'B', 'MicroBatch': 0, 'Start': 20, "
          "'End': 30}]]}]"));

  /* EMPTY: an application with nothing in it, and a run with no steps. */
  route(f, "/applications/" EMPTY "/jobs", J("[]"));
  route(f, "/applications/" EMPTY "/stages", J("[]"));
  route(f, "/applications/" EMPTY "/storage/rdd", J("[]"));
  route(f, "/applications/" EMPTY "/executors", J("[]"));
  route(f, "/applications/" EMPTY "/environment", J("{'flintProperties': []}"));
  route(f, "/applications/" EMPTY "/ps", J("[]"));
  route(f, "/applications/" EMPTY "/training",
        J("[{'run': 7, 'name': 'empty run', 'status': 'RUNNING', 'config': {}, 'steps': [], 'pipeline': null}]"));
  return f;
}

static void fake_free(fake *f) {
  json_decref(f->routes);
  free(f);
}

/* ---- helpers --------------------------------------------------------------------------- */

static int render(fake *f, const char *title, const char *path, const char *query, fl_buf *html) {
  html->len = 0;
  int status = pages_render(fake_api, f, title, path, query, html);
  /* pages_render leaves a NUL after the text. */
  assert_true(html->cap > html->len);
  assert_int_equal(html->data[html->len], 0);
  assert_int_equal(strlen((char *)html->data), html->len);
  return status;
}

static size_t count(const char *hay, const char *needle) {
  size_t n = 0, len = strlen(needle);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + len, needle)) n++;
  return n;
}

static void assert_contains(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) fail_msg("page lacks '%s'", needle);
}

/* No text from the API came out as markup. */
static void assert_escaped(const char *html) {
  assert_null(strstr(html, "<script"));
  assert_null(strstr(html, "<i>"));
  assert_null(strstr(html, "<oops>"));
  assert_null(strstr(html, "<rdd>"));
  assert_null(strstr(html, "<heartbeat>"));
  assert_null(strstr(html, "<tiny>"));
  assert_null(strstr(html, "<a href='x'>"));
  assert_null(strstr(html, "<stdin>"));
  assert_null(strstr(html, "<w>"));
  assert_null(strstr(html, "<map>"));
  assert_null(strstr(html, "<failed>"));
}

/* The number of points of the n-th (from 0) polyline of the page. */
static size_t polyline_points(const char *html, int nth) {
  const char *p = html;
  for (int i = 0; i <= nth; i++) {
    p = strstr(p, "<polyline");
    assert_non_null(p);
    p++;
  }
  p = strstr(p, "points=\"");
  assert_non_null(p);
  p += 8;
  size_t n = 1;
  for (; *p != '"'; p++) {
    assert_true(*p);
    if (*p == ' ') n++;
  }
  return n;
}

static const char *const APP_PAGES[] = {"/jobs/", "/storage/", "/executors/", "/environment/", "/ps/", "/training/"};

/* ---- pages ----------------------------------------------------------------------------- */

static void test_applications_page_lists_and_links_apps(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/", NULL, &html), 200);
  const char *h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"app\">"), 2);
  assert_contains(h, "href=\"/jobs/?app=" APP "\"");
  assert_contains(h, "href=\"/jobs/?app=" EMPTY "\"");
  assert_contains(h, "demo &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co");
  assert_contains(h, "<meta http-equiv=\"refresh\" content=\"2\">");
  assert_escaped(h);
  /* The history server's pages do not refresh. */
  assert_int_equal(render(f, "history", "/", NULL, &html), 200);
  assert_null(strstr((char *)html.data, "http-equiv"));
  fl_buf_free(&html);
  fake_free(f);
}

static void test_jobs_page_has_table_progress_and_timeline(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/jobs/", "app=" APP, &html), 200);
  const char *h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"job\">"), 2);
  assert_contains(h, "href=\"/job/?app=" APP "&amp;id=0\"");
  assert_contains(h, "href=\"/job/?app=" APP "&amp;id=1\"");
  assert_contains(h, "count &lt;i&gt;words&lt;/i&gt; &amp; more");
  assert_contains(h, "class=\"pb\""); /* the tasks' bars */
  assert_contains(h, " 5/5");
  assert_contains(h, " 1/4 (2 running) ");
  assert_contains(h, "2/2</td>"); /* job 0's stages, both complete */
  assert_contains(h, "0/2</td>");
  /* The timeline: a bar per job. */
  assert_int_equal(count(h, "<svg class=\"chart\""), 1);
  assert_int_equal(count(h, "<rect class=\"bar\""), 2);
  /* The app's name in the banner (found through /applications) and every tab. */
  assert_contains(h, "demo &lt;script&gt;");
  for (size_t i = 0; i < sizeof APP_PAGES / sizeof APP_PAGES[0]; i++) {
    char link[128];
    snprintf(link, sizeof link, "href=\"%s?app=" APP "\"", APP_PAGES[i]);
    assert_contains(h, link);
  }
  assert_escaped(h);
  fl_buf_free(&html);
  fake_free(f);
}

static void test_job_page_lists_its_stages_with_dag(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/job/", "app=" APP "&id=0", &html), 200);
  const char *h = (const char *)html.data;
  assert_contains(h, "Job 0: collect");
  assert_int_equal(count(h, "<tr class=\"stage\">"), 2);
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=0\"");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=1\"");
  assert_contains(h, "reduceByKey &amp; collect");
  /* The DAG: a box per stage, one arrow (0 to 1). */
  assert_int_equal(count(h, "<svg class=\"dag\""), 1);
  assert_int_equal(count(h, "<g class=\"node\">"), 2);
  assert_int_equal(count(h, "<line class=\"edge\""), 1);
  assert_escaped(h);

  /* Job 1: stage 3's newest attempt (1, PENDING) only, after stage 2. */
  assert_int_equal(render(f, "driver", "/job/", "app=" APP "&id=1", &html), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"stage\">"), 2);
  assert_contains(h, ">ACTIVE<");
  assert_contains(h, ">PENDING<");
  assert_null(strstr(h, ">FAILED<"));
  assert_int_equal(count(h, "<line class=\"edge\""), 1);
  fl_buf_free(&html);
  fake_free(f);
}

static void test_stage_page_has_dag_tasks_and_timeline(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=1", &html), 200);
  const char *h = (const char *)html.data;
  assert_contains(h, "Stage 1 (attempt 0): reduceByKey &amp; collect");
  /* The DAG: parent stage 0 and the three datasets; arrows 0 -> first, and along the chain. */
  assert_int_equal(count(h, "<svg class=\"dag\""), 1);
  assert_int_equal(count(h, "<g class=\"node\">"), 4);
  assert_int_equal(count(h, "<line class=\"edge\""), 3);
  assert_contains(h, "mapValues &lt;x&gt;");
  assert_contains(h, "map at &lt;stdin&gt;:3"); /* the parent's name, from the stage list */
  /* A row per task, with every column. */
  assert_int_equal(count(h, "<tr class=\"task\">"), 3);
  assert_int_equal(count(h, "<tr class=\"task\"><td class=\"n\">"), 3);
  assert_contains(h, "boom &lt;oops&gt; &amp; &#39;quote&#39;");
  assert_contains(h, "PROCESS_LOCAL");
  assert_contains(h, "<td>yes</td>"); /* the speculative copy */
  assert_contains(h, "2.0 KiB");      /* input */
  assert_contains(h, "1.0 KiB");      /* shuffle read */
  assert_contains(h, "512 B");        /* shuffle write */
  assert_contains(h, ">h10<");
  /* The timeline: a row per executor (1, 2, 10 in that order), a bar per task. */
  assert_int_equal(count(h, "<svg class=\"chart\""), 1);
  assert_int_equal(count(h, "<rect class=\"bar\""), 3);
  const char *e1 = strstr(h, ">executor 1<"), *e2 = strstr(h, ">executor 2<"), *e10 = strstr(h, ">executor 10<");
  assert_non_null(e1);
  assert_non_null(e2);
  assert_non_null(e10);
  assert_true(e1 < e2 && e2 < e10);
  assert_contains(h, "fill=\"#d9534f\""); /* the failed task in red */
  assert_contains(h, "href=\"/job/?app=" APP "&amp;id=0\"");
  assert_escaped(h);
  fl_buf_free(&html);
  fake_free(f);
}

static void test_stage_attempts_and_no_tasks(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  /* The store's shape: the newest attempt's figures, its own tasks, a link to the older. */
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=2", &html), 200);
  const char *h = (const char *)html.data;
  assert_contains(h, "Stage 2 (attempt 1)");
  assert_int_equal(count(h, "<tr class=\"task\">"), 1);
  assert_contains(h, ">RUNNING<");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=2&amp;attempt=0\"");
  assert_contains(h, "words");
  assert_contains(h, "[4], 4 partitions, cached");
  assert_int_equal(count(h, "<rect class=\"bar\""), 1); /* the running task, up to now */
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=2&attempt=0", &html), 200);
  h = (const char *)html.data;
  assert_contains(h, "Stage 2 (attempt 0)");
  assert_contains(h, "the tasks are attempt 0's");
  assert_int_equal(count(h, "<tr class=\"task\">"), 1);
  assert_contains(h, "fetch failed");
  assert_contains(h, "fetch &lt;failed&gt;");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=2&amp;attempt=1\"");
  /* Spark's shape: an entry per attempt; the newest by default. No tasks at all. */
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=3", &html), 200);
  h = (const char *)html.data;
  assert_contains(h, "Stage 3 (attempt 1)");
  assert_contains(h, ">PENDING<");
  assert_int_equal(count(h, "<tr class=\"task\">"), 0);
  assert_contains(h, "No tasks yet.");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=3&amp;attempt=0\"");
  /* The parent stage and the stage's own box (no datasets), one arrow. */
  assert_int_equal(count(h, "<g class=\"node\">"), 2);
  assert_int_equal(count(h, "<line class=\"edge\""), 1);
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=3&attempt=0", &html), 200);
  h = (const char *)html.data;
  assert_contains(h, "Stage 3 (attempt 0)");
  assert_contains(h, "lost &lt;map&gt; output");
  assert_null(strstr(h, "the tasks are"));
  fl_buf_free(&html);
  fake_free(f);
}

static void test_storage_executors_environment_ps_pages(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/storage/", "app=" APP, &html), 200);
  const char *h = (const char *)html.data;
  assert_contains(h, "cached &lt;rdd&gt; [3]");
  assert_contains(h, "MEMORY_ONLY");
  assert_contains(h, "2 of 4");
  assert_contains(h, "50%");
  assert_int_equal(count(h, "<tr class=\"dist\">"), 2);
  assert_int_equal(count(h, "<tr class=\"part\">"), 2);
  assert_contains(h, "rdd_3_1");
  assert_escaped(h);

  assert_int_equal(render(f, "driver", "/executors/", "app=" APP, &html), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"executor\">"), 2);
  assert_contains(h, "1 active (4 cores, 2 tasks running), 1 removed");
  assert_contains(h, "lost &lt;heartbeat&gt; &amp; gone");
  assert_contains(h, "1.0 GiB");
  assert_contains(h, ">none<"); /* executor 2 has no GPU */
  assert_contains(h, "2025-11-28 18:05:16"); /* the first executor's last heartbeat */
  assert_escaped(h);

  assert_int_equal(render(f, "driver", "/environment/", "app=" APP, &html), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"prop\">"), 2);
  assert_contains(h, "local[2]");
  assert_contains(h, "&lt;a href=&#39;x&#39;&gt;&amp;");
  assert_escaped(h);

  assert_int_equal(render(f, "driver", "/ps/", "app=" APP, &html), 200);
  h = (const char *)html.data;
  assert_contains(h, "Table 0: weights &lt;w&gt; (2 shards)");
  assert_int_equal(count(h, "<tr class=\"shard\">"), 2);
  assert_contains(h, "w0: 5, w1: 4");
  assert_contains(h, ">none<"); /* shard 1 has no backups */
  fl_buf_free(&html);
  fake_free(f);
}

static void test_training_page_curves_and_pipeline(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/training/", "app=" APP, &html), 200);
  const char *h = (const char *)html.data;
  assert_contains(h, "resnet &lt;tiny&gt;");
  assert_contains(h, "<tr class=\"hl\"><td>allreduce</td><td>ring</td></tr>");
  assert_contains(h, "1f1b");
  /* Loss, accuracy, throughput charts and the pipeline's timeline. */
  assert_int_equal(count(h, "<svg class=\"chart\""), 4);
  /* A polyline each for loss, accuracy, test accuracy and throughput: a point per step,
   * the test accuracy where measured. */
  assert_int_equal(count(h, "<polyline"), 4);
  assert_int_equal(polyline_points(h, 0), 5);
  assert_int_equal(polyline_points(h, 1), 5);
  assert_int_equal(polyline_points(h, 2), 2);
  assert_int_equal(polyline_points(h, 3), 5);
  assert_contains(h, "class=\"tk\" text-anchor=\"end\">2.2</text>"); /* a tick of the loss axis */
  assert_contains(h, ">step</text>");
  /* The pipeline: a row per stage, an F or B box per pass (both spellings of the fields). */
  assert_contains(h, ">stage 0<");
  assert_contains(h, ">stage 1<");
  assert_int_equal(count(h, "<rect class=\"bar\""), 5);
  assert_contains(h, ">F1</text>");
  assert_contains(h, ">B0</text>");
  assert_contains(h, "4.9 KiB"); /* bytes sent over the five steps: the last step's count */
  assert_escaped(h);
  fl_buf_free(&html);
  fake_free(f);
}

static void test_empty_application_renders_every_page(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  for (size_t i = 0; i < sizeof APP_PAGES / sizeof APP_PAGES[0]; i++) {
    assert_int_equal(render(f, "local", APP_PAGES[i], "app=" EMPTY, &html), 200);
    assert_contains((char *)html.data, "</html>");
    assert_contains((char *)html.data, "empty (" EMPTY ")"); /* found through /applications/{app} */
  }
  assert_int_equal(render(f, "local", "/jobs/", "app=" EMPTY, &html), 200);
  assert_contains((char *)html.data, "No jobs yet.");
  assert_int_equal(render(f, "local", "/training/", "app=" EMPTY, &html), 200);
  assert_contains((char *)html.data, "empty run");
  assert_contains((char *)html.data, "no data");
  assert_int_equal(count((char *)html.data, "<polyline"), 0);
  /* No applications at all. */
  json_object_del(f->routes, "/applications");
  assert_int_equal(render(f, "local", "/", NULL, &html), 200);
  assert_contains((char *)html.data, "No applications yet.");
  fl_buf_free(&html);
  fake_free(f);
}

static void test_current_is_passed_to_the_api_and_resolved_for_links(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/jobs/", "app=current", &html), 200);
  bool asked = false;
  for (int i = 0; i < f->n_paths; i++) asked |= !strcmp(f->paths[i], "/applications/current/jobs");
  assert_true(asked);
  /* The newest application in the list is APP; links name it. */
  assert_contains((char *)html.data, "href=\"/job/?app=" APP "&amp;id=1\"");
  assert_int_equal(count((char *)html.data, "<tr class=\"job\">"), 2);
  /* No app given: the current one. */
  assert_int_equal(render(f, "driver", "/jobs", NULL, &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"job\">"), 2);
  /* A percent-encoded id is decoded. */
  assert_int_equal(render(f, "driver", "/executors/", "x=1&app=app%2D1-0001", &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"executor\">"), 2);
  fl_buf_free(&html);
  fake_free(f);
}

static void test_unknown_page_app_job_stage_are_404(void **state) {
  (void)state;
  fake *f = fixture();
  fl_buf html = FL_BUF_INIT;
  struct {
    const char *path, *query, *expect;
  } cases[] = {
      {"/nope/", "app=" APP, "No page <code>/nope/</code>"},
      {"/<script>x</script>", NULL, "No page <code>/&lt;script&gt;x&lt;/script&gt;</code>"},
      {"/jobs/", "app=app-unknown", "No application <code>app-unknown</code>"},
      {"/training/", "app=app-unknown", "No application"},
      {"/storage/", "app=app-unknown", "No application"},
      {"/executors/", "app=app-unknown", "No application"},
      {"/environment/", "app=app-unknown", "No application"},
      {"/ps/", "app=app-unknown", "No application"},
      {"/jobs/", "app=%3Cscript%3E", "No application <code>&lt;script&gt;</code>"},
      {"/jobs/", "app=../x", "No application <code>../x</code>"},
      {"/jobs/", "app=", "No application"},
      {"/job/", "app=" APP "&id=99", "No job <code>99</code>"},
      {"/job/", "app=" APP "&id=abc", "No job <code>abc</code>"},
      {"/job/", "app=" APP "&id=-1", "No job"},
      {"/job/", "app=" APP "&id=99999999999999999999999", "No job"},
      {"/job/", "app=" APP, "No job <code>(none given)</code>"},
      {"/job/", "app=app-unknown&id=0", "No job"},
      {"/stage/", "app=" APP "&id=9", "No stage <code>9</code>"},
      {"/stage/", "app=" APP "&id=1&attempt=5", "No stage <code>1, attempt 5</code>"},
      {"/stage/", "app=" APP "&id=2&attempt=2", "No stage <code>2, attempt 2</code>"},
      {"/stage/", "app=" APP "&id=3&attempt=2", "No stage"},
      {"/stage/", "app=" APP "&id=1&attempt=x", "No stage"},
      {"/stage/", "app=app-unknown&id=1", "No stage"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    f->n_paths = 0;
    int status = render(f, "driver", cases[i].path, cases[i].query, &html);
    if (status != 404 || !strstr((char *)html.data, cases[i].expect))
      fail_msg("%s?%s: %d %s", cases[i].path, cases[i].query ? cases[i].query : "", status, (char *)html.data);
    assert_contains((char *)html.data, "<h1>Not found</h1>");
    assert_null(strstr((char *)html.data, "<script"));
    assert_null(strstr((char *)html.data, "http-equiv"));
    /* A malformed application never reaches the API. */
    for (int k = 0; k < f->n_paths; k++) assert_null(strstr(f->paths[k], ".."));
  }
  fl_buf_free(&html);
  fake_free(f);
}

/* ---- over the real store and API ----------------------------------------------------------- */

static json_t *store_api(void *arg, const char *path, int *status) { return api_answer(arg, NULL, NULL, path, status, NULL); }

static void test_pages_over_the_store_and_api(void **state) {
  (void)state;
  static const char *const events[] = {
      "{'Event': 'ApplicationStart', 'App': 'app-t-0001', 'Time': 1764353112000, 'Name': 'word <count>', "
      "'User': 'ann', 'Master': 'local[2]'}",
      "{'Event': 'Environment', 'App': 'app-t-0001', 'Properties': [['flint.master', 'local[2]']]}",
      "{'Event': 'ExecutorAdded', 'App': 'app-t-0001', 'Executor': 1, 'Host': 'h1:7078', 'Cores': 4, "
      "'Memory': 1073741824, 'GPU': -1}",
      "{'Event': 'JobStart', 'App': 'app-t-0001', 'Time': 1764353112100, 'Job': 0, 'Name': 'collect & <go>', "
      "'Stages': [{'Stage': 0, 'Name': 'map', 'Tasks': 2, 'Parents': [], 'RDDs': [{'RDD': 0, 'Name': 'text', "
      "'Op': 'source'}]}, {'Stage': 1, 'Name': 'reduce', 'Tasks': 2, 'Parents': [0], 'RDDs': [{'RDD': 1, "
      "'Name': 'shuffled', 'Op': 'shuffle'}, {'RDD': 2, 'Name': 'out', 'Op': 'map'}]}]}",
      "{'Event': 'StageSubmitted', 'App': 'app-t-0001', 'Time': 1764353112100, 'Job': 0, 'Stage': 0, "
      "'Attempt': 0, 'Tasks': 2}",
      "{'Event': 'TaskStart', 'App': 'app-t-0001', 'Time': 1764353112200, 'Job': 0, 'Stage': 0, 'Task': 0, "
      "'Index': 0, 'Attempt': 0, 'Executor': 1, 'Locality': 'PROCESS_LOCAL', 'Speculative': false}",
      "{'Event': 'TaskStart', 'App': 'app-t-0001', 'Time': 1764353112200, 'Job': 0, 'Stage': 0, 'Task': 1, "
      "'Index': 1, 'Attempt': 0, 'Executor': 1, 'Locality': 'ANY', 'Speculative': false}",
      "{'Event': 'TaskEnd', 'App': 'app-t-0001', 'Time': 1764353112300, 'Job': 0, 'Stage': 0, 'Task': 0, "
      "'Index': 0, 'Attempt': 0, 'Executor': 1, 'Status': 'SUCCESS', 'Duration': 100, 'RunTime': 90, "
      "'InputBytes': 2048, 'ShuffleReadBytes': 0, 'ShuffleWriteBytes': 512}",
      "{'Event': 'TaskEnd', 'App': 'app-t-0001', 'Time': 1764353112400, 'Job': 0, 'Stage': 0, 'Task': 1, "
      "'Index': 1, 'Attempt': 0, 'Executor': 1, 'Status': 'FAILED', 'Duration': 200, 'RunTime': 190, "
      "'InputBytes': 0, 'ShuffleReadBytes': 0, 'ShuffleWriteBytes': 0, 'Error': 'bad <input>'}",
      "{'Event': 'StageCompleted', 'App': 'app-t-0001', 'Time': 1764353112500, 'Job': 0, 'Stage': 0, "
      "'Attempt': 0, 'Failed': false}",
      "{'Event': 'StageSubmitted', 'App': 'app-t-0001', 'Time': 1764353112500, 'Job': 0, 'Stage': 1, "
      "'Attempt': 0, 'Tasks': 2}",
      "{'Event': 'TaskStart', 'App': 'app-t-0001', 'Time': 1764353112600, 'Job': 0, 'Stage': 1, 'Task': 2, "
      "'Index': 0, 'Attempt': 0, 'Executor': 1, 'Locality': 'NODE_LOCAL', 'Speculative': true}",
      "{'Event': 'BlockUpdated', 'App': 'app-t-0001', 'RDD': 2, 'Name': 'out <cached>', 'Partition': 0, "
      "'Executor': 1, 'Memory': 4096, 'Disk': 0, 'Level': 'MEMORY_ONLY'}",
      "{'Event': 'PsTable', 'App': 'app-t-0001', 'Table': 0, 'Name': 'w', 'Shards': [{'Shard': 0, "
      "'Replicas': [1]}]}",
      "{'Event': 'TrainStart', 'App': 'app-t-0001', 'Run': 1, 'Name': 'mlp', 'Config': {'allreduce': 'ring'}}",
      "{'Event': 'TrainStep', 'App': 'app-t-0001', 'Run': 1, 'Epoch': 0, 'Step': 1, 'Loss': 2.0, "
      "'Accuracy': 0.1, 'ImagesPerSecond': 10.0, 'BytesSent': 10}",
      "{'Event': 'TrainStep', 'App': 'app-t-0001', 'Run': 1, 'Epoch': 0, 'Step': 2, 'Loss': 1.5, "
      "'Accuracy': 0.2, 'ImagesPerSecond': 11.0, 'BytesSent': 10}",
      "{'Event': 'TrainStep', 'App': 'app-t-0001', 'Run': 1, 'Epoch': 0, 'Step': 3, 'Loss': 1.0, "
      "'Accuracy': 0.4, 'TestAccuracy': 0.3, 'ImagesPerSecond': 12.0, 'BytesSent': 10}",
      "{'Event': 'TrainPipeline', 'App': 'app-t-0001', 'Run': 1, 'Stages': [[{'Op': 'F', 'MicroBatch': 0, "
      "'Start': 0, 'End': 5}, {'Op': 'B', 'MicroBatch': 0, 'Start': 6, 'End': 12}], [{'Op': 'F', "
      "'MicroBatch': 0, 'Start': 5, 'End': 6}]]}",
  };
  ui_store *store = NULL;
  assert_int_equal(store_create(&store), FL_OK);
  for (size_t i = 0; i < sizeof events / sizeof events[0]; i++) {
    json_t *ev = J(events[i]);
    store_apply(store, ev);
    json_decref(ev);
  }
  fl_buf html = FL_BUF_INIT;
  const char *h;
#define RENDER(path, query) \
  (html.len = 0, pages_render(store_api, store, "local", path, query, &html))
  assert_int_equal(RENDER("/", NULL), 200);
  h = (const char *)html.data;
  assert_contains(h, "href=\"/jobs/?app=app-t-0001\"");
  assert_contains(h, "word &lt;count&gt;");
  assert_int_equal(RENDER("/jobs/", "app=current"), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"job\">"), 1);
  assert_contains(h, "collect &amp; &lt;go&gt;");
  assert_contains(h, "word &lt;count&gt; (app-t-0001)");
  assert_contains(h, "href=\"/job/?app=app-t-0001&amp;id=0\"");
  assert_int_equal(RENDER("/job/", "app=app-t-0001&id=0"), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"stage\">"), 2);
  assert_int_equal(count(h, "<line class=\"edge\""), 1);
  assert_int_equal(RENDER("/stage/", "app=app-t-0001&id=0"), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"task\">"), 2);
  assert_int_equal(count(h, "<rect class=\"bar\""), 2);
  assert_contains(h, "bad &lt;input&gt;");
  assert_int_equal(RENDER("/stage/", "app=app-t-0001&id=1"), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"task\">"), 1);
  assert_contains(h, ">RUNNING<");
  assert_contains(h, "NODE_LOCAL");
  assert_int_equal(count(h, "<g class=\"node\">"), 3); /* stage 0, then shuffled and out */
  assert_int_equal(RENDER("/storage/", "app=app-t-0001"), 200);
  assert_contains((char *)html.data, "out &lt;cached&gt; [2]");
  assert_contains((char *)html.data, "4.0 KiB");
  assert_int_equal(RENDER("/executors/", "app=app-t-0001"), 200);
  assert_contains((char *)html.data, "h1:7078");
  assert_int_equal(RENDER("/environment/", "app=app-t-0001"), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"prop\">"), 1);
  assert_int_equal(RENDER("/ps/", "app=app-t-0001"), 200);
  assert_contains((char *)html.data, "Table 0: w (1 shards)");
  assert_int_equal(RENDER("/training/", "app=app-t-0001"), 200);
  h = (const char *)html.data;
  assert_int_equal(polyline_points(h, 0), 3);
  assert_int_equal(polyline_points(h, 2), 1); /* the one test accuracy */
  assert_contains(h, "<tr class=\"hl\"><td>allreduce</td><td>ring</td></tr>");
  assert_int_equal(count(h, "<rect class=\"bar\""), 3); /* the pipeline's passes */
  assert_int_equal(RENDER("/job/", "app=app-t-0001&id=9"), 404);
  assert_int_equal(RENDER("/stage/", "app=app-t-0001&id=9"), 404);
  assert_int_equal(RENDER("/jobs/", "app=app-t-0002"), 404);
#undef RENDER
  fl_buf_free(&html);
  store_destroy(store);
}

/* A run of 5000 steps: its curves are thinned to at most SVG_MAX_POINTS points (and the last). */
static void test_long_runs_are_thinned(void **state) {
  (void)state;
  fake *f = fixture();
  json_t *steps = json_array();
  for (int i = 0; i < 5000; i++)
    json_array_append_new(steps, json_pack("{s:i, s:i, s:f, s:f}", "epoch", 0, "step", i, "loss", 1.0 / (i + 1),
                                           "accuracy", i / 5000.0));
  route(f, "/applications/" APP "/training",
        json_pack("[{s:i, s:s, s:s, s:{}, s:o}]", "run", 1, "name", "long", "status", "FINISHED", "config", "steps",
                  steps));
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/training/", "app=" APP, &html), 200);
  size_t points = polyline_points((char *)html.data, 0);
  assert_true(points >= SVG_MAX_POINTS / 2 && points <= SVG_MAX_POINTS + 1);
  assert_contains((char *)html.data, "<dd>5000</dd>");
  /* The last step is drawn: the loss line's last point is at the plot's right edge (x 544). */
  const char *line = strstr((char *)html.data, "<polyline");
  const char *end = strchr(strstr(line, "points=\"") + 8, '"');
  const char *last = end;
  while (last[-1] != ' ') last--;
  assert_int_equal(strncmp(last, "544.0,", 6), 0);
  fl_buf_free(&html);
  fake_free(f);
}

/* ---- long tables -------------------------------------------------------------------------- */

static void test_long_tables_come_a_page_at_a_time(void **state) {
  (void)state;
  fake *f = fixture();
  /* A stage of 1203 tasks and an application of 1201 jobs. */
  json_t *tasks = json_object(), *jobs = json_array();
  for (int i = 0; i < 1203; i++) {
    char key[16];
    snprintf(key, sizeof key, "%d", i);
    json_object_set_new(tasks, key,
                        json_pack("{s:i, s:i, s:i, s:i, s:I, s:i, s:s, s:s, s:s}", "taskId", i, "index", i, "attempt", 0,
                                  "stageAttemptId", 0, "launchTime", (json_int_t)1764353113000 + i, "duration", 10,
                                  "executorId", i % 2 ? "1" : "2", "status", "SUCCESS", "host", "h"));
  }
  for (int i = 1200; i >= 0; i--)
    json_array_append_new(jobs, json_pack("{s:i, s:s, s:I, s:I, s:[], s:s}", "jobId", i, "name", "j", "submissionTime",
                                          (json_int_t)1764353113000 + i, "completionTime",
                                          (json_int_t)1764353113010 + i, "stageIds", "status", "SUCCEEDED"));
  route(f, "/applications/" APP "/stages/5",
        json_pack("[{s:i, s:i, s:s, s:s, s:[i], s:[], s:o}]", "stageId", 5, "attemptId", 0, "name", "big", "status",
                  "COMPLETE", "jobIds", 0, "parentIds", "tasks", tasks));
  route(f, "/applications/" APP "/jobs", jobs);
  fl_buf html = FL_BUF_INIT;
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=5", &html), 200);
  const char *h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"task\">"), 500);
  assert_contains(h, "Rows 1 to 500 of 1203 (page 1 of 3).");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=5&amp;page=2\">next</a>");
  assert_contains(h, "href=\"/stage/?app=" APP "&amp;id=5&amp;page=3\">last</a>");
  assert_null(strstr(h, ">previous</a>"));
  assert_int_equal(count(h, "<rect class=\"bar\""), 1000); /* the timeline's first 1000 */
  assert_contains(h, "Summary of 1203 finished tasks");
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=5&page=3", &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"task\">"), 203);
  assert_contains((char *)html.data, "Rows 1001 to 1203 of 1203 (page 3 of 3).");
  assert_contains((char *)html.data, ">previous</a>");
  /* Past the end: the last page; not a number: the first. */
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=5&page=99", &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"task\">"), 203);
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=5&page=x", &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"task\">"), 500);
  assert_int_equal(render(f, "driver", "/stage/", "app=" APP "&id=5&page=0", &html), 200);
  assert_int_equal(count((char *)html.data, "<tr class=\"task\">"), 500);

  assert_int_equal(render(f, "driver", "/jobs/", "app=" APP "&page=3", &html), 200);
  h = (const char *)html.data;
  assert_int_equal(count(h, "<tr class=\"job\">"), 201);
  assert_int_equal(count(h, "<rect class=\"bar\""), 200); /* the timeline's newest 200 */
  assert_contains(h, "href=\"/jobs/?app=" APP "&amp;page=1\">first</a>");
  assert_contains(h, "\">200</a>");  /* the last page's first row: job 200 */
  assert_null(strstr(h, "\">201</a>"));
  fl_buf_free(&html);
  fake_free(f);
}

/* ---- huge values ----------------------------------------------------------------------- */

static void route_huge(fake *f) {
  size_t len = 100000;
  char *name = malloc(len + 1);
  assert_non_null(name);
  for (size_t i = 0; i < len; i++) name[i] = "<&\"'x"[i % 5];
  name[len] = '\0';
  json_int_t big = LLONG_MAX;
  json_array_append_new(json_object_get(f->routes, "/applications"),
                        json_pack("{s:s, s:s, s:[]}", "id", HUGE_APP, "name", name, "attempts"));
  route(f, "/applications/" HUGE_APP,
        json_pack("{s:s, s:s, s:[{s:f, s:I, s:f, s:b, s:s}]}", "id", HUGE_APP, "name", name, "attempts", "startTime",
                  1e308, "endTime", big, "duration", 1e300, "completed", 1, "sparkUser", name));
  json_t *job = json_pack("{s:I, s:s, s:f, s:f, s:[I, I], s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "jobId", big, "name", name,
                          "submissionTime", 1e308, "completionTime", -1e308, "stageIds", big, (json_int_t)0, "status",
                          name, "numTasks", big, "numActiveTasks", big, "numCompletedTasks", big, "numFailedTasks", big,
                          "numKilledTasks", big, "errorMessage", name);
  route(f, "/applications/" HUGE_APP "/jobs", json_pack("[O]", job));
  route(f, "/applications/" HUGE_APP "/jobs/9223372036854775807", job);
  json_t *task = json_pack("{s:I, s:I, s:I, s:f, s:f, s:s, s:s, s:s, s:s, s:b, s:s, s:{s:I, s:{s:I}, s:{s:f}, s:{s:I}}}",
                           "taskId", big, "index", big, "attempt", big, "launchTime", 1e308, "duration", 1e308,
                           "executorId", name, "host", name, "status", "RUNNING", "taskLocality", name, "speculative", 1,
                           "errorMessage", name, "taskMetrics", "executorRunTime", big, "inputMetrics", "bytesRead", big,
                           "shuffleReadMetrics", "remoteBytesRead", 1e308, "shuffleWriteMetrics", "bytesWritten", big);
  json_t *stage = json_pack("{s:I, s:I, s:s, s:s, s:[I], s:[I, I], s:I, s:I, s:I, s:f, s:f, s:I, s:f, s:[{s:I, s:s, s:s}], "
                            "s:{s:o, s:o}}",
                            "stageId", (json_int_t)0, "attemptId", big, "name", name, "status", name, "jobIds", big,
                            "parentIds", big, (json_int_t)0, "numTasks", big, "numCompleteTasks", big, "numActiveTasks",
                            big, "submissionTime", 1e308, "inputBytes", 1e308, "shuffleReadBytes", big,
                            "shuffleWriteBytes", -1e308, "rddInfos", "id", big, "name", name, "op", name, "tasks", "1",
                            task, "2", json_deep_copy(task));
  route(f, "/applications/" HUGE_APP "/stages", json_pack("[O]", stage));
  route(f, "/applications/" HUGE_APP "/stages/0", json_pack("[o]", stage));
  route(f, "/applications/" HUGE_APP "/executors",
        json_pack("[{s:s, s:s, s:b, s:I, s:I, s:I, s:f, s:I, s:f, s:I, s:f, s:s}]", "id", name, "hostPort", name,
                  "isActive", 0, "totalCores", big, "maxMemory", big, "gpu", big, "memoryUsed", 1e300, "diskUsed", big,
                  "totalDuration", 1e308, "addTime", big, "removeTime", 1e308, "removeReason", name));
  json_t *steps = json_array();
  double values[] = {1e308, -1e308, 0, 1e-308, 5e307};
  for (int i = 0; i < 5; i++)
    json_array_append_new(steps, json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:I}", "epoch", big, "step", big, "loss",
                                           values[i], "accuracy", values[4 - i], "testAccuracy", values[i],
                                           "imagesPerSecond", values[i], "bytesSent", big));
  route(f, "/applications/" HUGE_APP "/training",
        json_pack("[{s:I, s:s, s:s, s:{s:s, s:s}, s:o, s:[[{s:s, s:I, s:f, s:f}]]}]", "run", big, "name", name, "status",
                  name, "config", name, name, "allreduce", name, "steps", steps, "pipeline", "op", name, "microBatch",
                  big, "start", -1e308, "end", 1e308));
  route(f, "/applications/" HUGE_APP "/storage/rdd",
        json_pack("[{s:I, s:s, s:I, s:f, s:s, s:f, s:I, s:[{s:s, s:f, s:I}], s:[{s:s, s:I, s:f, s:[s]}]}]", "id", big,
                  "name", name, "numPartitions", big, "numCachedPartitions", 1e308, "storageLevel", name, "memoryUsed",
                  1e308, "diskUsed", big, "dataDistribution", "address", name, "memoryUsed", 1e308, "diskUsed", big,
                  "partitions", "blockName", name, "memoryUsed", big, "diskUsed", 1e308, "executors", name));
  route(f, "/applications/" HUGE_APP "/ps",
        json_pack("[{s:s, s:[{s:I, s:s, s:[s], s:{s:I}}]}]", "table", name, "shards", "shard", big, "primary", name,
                  "backups", name, "clocks", name, big));
  route(f, "/applications/" HUGE_APP "/environment", json_pack("{s:[[s, s]]}", "flintProperties", name, name));
  free(name);
}

static void test_huge_values_render(void **state) {
  (void)state;
  fake *f = fixture();
  route_huge(f);
  fl_buf html = FL_BUF_INIT;
  const char *pages[][2] = {{"/jobs/", "app=" HUGE_APP},
                            {"/job/", "app=" HUGE_APP "&id=9223372036854775807"},
                            {"/stage/", "app=" HUGE_APP "&id=0"},
                            {"/storage/", "app=" HUGE_APP},
                            {"/executors/", "app=" HUGE_APP},
                            {"/environment/", "app=" HUGE_APP},
                            {"/ps/", "app=" HUGE_APP},
                            {"/training/", "app=" HUGE_APP},
                            {"/", NULL}};
  for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
    int status = render(f, "driver", pages[i][0], pages[i][1], &html);
    if (status != 200) fail_msg("%s?%s: %d", pages[i][0], pages[i][1], status);
    const char *h = (const char *)html.data;
    assert_contains(h, "</html>");
    /* The 100000-character name, escaped whole at least once. */
    assert_true(html.len > 100000 * 3);
    assert_contains(h, "&lt;&amp;&quot;&#39;x&lt;");
    assert_null(strstr(h, "<&"));
    assert_null(strstr(h, "nan"));
    assert_null(strstr(h, "inf\""));
  }
  render(f, "driver", "/training/", "app=" HUGE_APP, &html);
  assert_int_equal(polyline_points((char *)html.data, 0), 5);
  fl_buf_free(&html);
  fake_free(f);
}

/* ---- out of memory --------------------------------------------------------------------- */

static void test_out_of_memory_fails_cleanly(void **state) {
  (void)state;
  fake *f = fixture();
  const char *pages[][2] = {{"/", NULL},           {"/jobs/", "app=" APP},       {"/job/", "app=" APP "&id=0"},
                            {"/stage/", "app=" APP "&id=1"}, {"/storage/", "app=" APP}, {"/executors/", "app=" APP},
                            {"/training/", "app=" APP},      {"/ps/", "app=" APP},      {"/environment/", "app=" APP}};
  for (size_t i = 0; i < sizeof pages / sizeof pages[0]; i++) {
    bool rendered = false;
    for (long n = 0; n < 100000 && !rendered; n++) {
      fl_buf html = FL_BUF_INIT;
      flint_test_fail_alloc_after(n);
      int status = pages_render(fake_api, f, "driver", pages[i][0], pages[i][1], &html);
      flint_test_fail_alloc_after(-1);
      if (status == 200) {
        rendered = true;
        assert_non_null(strstr((char *)html.data, "</html>"));
      } else {
        assert_int_equal(status, 500);
      }
      fl_buf_free(&html);
    }
    assert_true(rendered);
  }
  fake_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_applications_page_lists_and_links_apps),
      cmocka_unit_test(test_jobs_page_has_table_progress_and_timeline),
      cmocka_unit_test(test_job_page_lists_its_stages_with_dag),
      cmocka_unit_test(test_stage_page_has_dag_tasks_and_timeline),
      cmocka_unit_test(test_stage_attempts_and_no_tasks),
      cmocka_unit_test(test_storage_executors_environment_ps_pages),
      cmocka_unit_test(test_training_page_curves_and_pipeline),
      cmocka_unit_test(test_empty_application_renders_every_page),
      cmocka_unit_test(test_current_is_passed_to_the_api_and_resolved_for_links),
      cmocka_unit_test(test_unknown_page_app_job_stage_are_404),
      cmocka_unit_test(test_pages_over_the_store_and_api),
      cmocka_unit_test(test_long_runs_are_thinned),
      cmocka_unit_test(test_long_tables_come_a_page_at_a_time),
      cmocka_unit_test(test_huge_values_render),
      cmocka_unit_test(test_out_of_memory_fails_cleanly),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
