/* test_block_reports.c: the executor's queue of block changes for the driver
 * (executor/block_reports.c): changes go out oldest first, at most a message's worth at a
 * time, and stay for the next message when a call fails; beyond its bound the oldest are
 * dropped and counted once; one message at a time carries them; application 0's are none. */
#include "test_util.h"

#include "executor/internal.h"

static rdd_block_key key_of(uint64_t app, uint64_t rdd_id, uint32_t partition) {
  return (rdd_block_key){app << APP_SHIFT | rdd_id, partition};
}

static void change(exec_block_reports *r, uint64_t app, uint64_t rdd_id, uint32_t partition, uint64_t memory) {
  exec_block_reports_changed(r, key_of(app, rdd_id, partition), FL_MEMORY_AND_DISK, memory, memory ? 0 : 7);
}

static void test_changes_go_oldest_first(void **state) {
  (void)state;
  exec_block_reports *r;
  assert_int_equal(exec_block_reports_create(&r), FL_OK);
  Flint__BlockUpdate **u;
  size_t n;
  uint64_t dropped;
  assert_false(exec_block_reports_begin(r, &u, &n, &dropped)); /* nothing to tell */
  change(r, 3, 12, 4, 1000);
  change(r, 0, 1, 1, 1000); /* no application's: not told */
  change(r, 3, 12, 4, 0);
  assert_true(exec_block_reports_begin(r, &u, &n, &dropped));
  assert_int_equal(n, 2);
  assert_int_equal(dropped, 0);
  assert_int_equal(u[0]->app_id, 3);
  assert_int_equal(u[0]->rdd_id, 12);
  assert_int_equal(u[0]->partition, 4);
  assert_int_equal(u[0]->memory, 1000);
  assert_int_equal(u[0]->disk, 0);
  assert_int_equal(u[0]->level, FL_MEMORY_AND_DISK);
  assert_int_equal(u[1]->memory, 0);
  assert_int_equal(u[1]->disk, 7);
  /* while one message carries them, another carries none */
  Flint__BlockUpdate **other;
  size_t other_n;
  uint64_t other_dropped;
  assert_false(exec_block_reports_begin(r, &other, &other_n, &other_dropped));
  assert_int_equal(other_n, 0);
  exec_block_reports_end(r, false); /* the call failed: they stay */
  assert_true(exec_block_reports_begin(r, &u, &n, &dropped));
  assert_int_equal(n, 2);
  exec_block_reports_end(r, true);
  assert_false(exec_block_reports_begin(r, &u, &n, &dropped));
  exec_block_reports_destroy(r);
}

static void test_bounded(void **state) {
  (void)state;
  exec_block_reports *r;
  assert_int_equal(exec_block_reports_create(&r), FL_OK);
  for (uint32_t i = 0; i < EXEC_BLOCK_UPDATES_MAX + 5; i++) change(r, 1, 2, i, 100);
  Flint__BlockUpdate **u;
  size_t n, total = 0;
  uint64_t dropped;
  assert_true(exec_block_reports_begin(r, &u, &n, &dropped));
  assert_int_equal(n, EXEC_BLOCK_UPDATES_PER_CALL);
  assert_int_equal(dropped, 5);
  assert_int_equal(u[0]->partition, 5); /* the oldest five went */
  /* more while this message is out: its own changes are not counted as dropped */
  for (uint32_t i = 0; i < 3; i++) change(r, 1, 3, i, 100);
  exec_block_reports_end(r, true);
  total += n;
  uint32_t next = 5 + EXEC_BLOCK_UPDATES_PER_CALL; /* the first not sent */
  assert_true(exec_block_reports_begin(r, &u, &n, &dropped));
  assert_int_equal(dropped, 0);
  assert_int_equal(u[0]->partition, next);
  exec_block_reports_end(r, true);
  total += n;
  while (exec_block_reports_begin(r, &u, &n, &dropped)) {
    assert_true(n <= EXEC_BLOCK_UPDATES_PER_CALL);
    total += n;
    exec_block_reports_end(r, true);
  }
  /* every change but the five dropped: the three that pushed out changes already in flight
   * cost nothing */
  assert_int_equal(total, EXEC_BLOCK_UPDATES_MAX + 5 + 3 - 5);
  /* cleared (a new driver): nothing of the earlier one's, not even its count of dropped */
  for (uint32_t i = 0; i < EXEC_BLOCK_UPDATES_MAX + 1; i++) change(r, 1, 2, i, 100);
  exec_block_reports_clear(r);
  assert_false(exec_block_reports_begin(r, &u, &n, &dropped));
  exec_block_reports_destroy(r);
  exec_block_reports_destroy(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_changes_go_oldest_first),
      cmocka_unit_test(test_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
