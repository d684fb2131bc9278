/*
 * test_services: fl_service_register and fl_service_call (flint.h): a service runs actions
 * on the job it is given as often as it needs, where the scheduler lives. In local mode it
 * runs in this process; in cluster mode in the driver, which has flint's own services only
 * (libflint_ml's "ml.sandblaster": test_ml_solvers fits through it on a local cluster).
 */
#include "test_util.h"

#include "flint/flint.h"

/* Counts the job's records three times (three jobs) and answers the total. */
static fl_status count_thrice(fl_dataset *job, fl_bytes request, fl_buf *reply) {
  if (request.len != 1 || request.data[0] != 'x') return fl_set_error(FL_EINVAL, "count_thrice: a bad request");
  uint64_t total = 0;
  for (int i = 0; i < 3; i++) {
    uint64_t n;
    fl_status st = fl_count(job, &n);
    if (st != FL_OK) return st;
    total += n;
  }
  return fl_buf_append(reply, &total, sizeof total);
}

static void test_local_service(void **state) {
  (void)state;
  assert_int_equal(fl_service_register("test.count_thrice", count_thrice), FL_OK);
  fl_context *ctx;
  assert_int_equal(fl_context_open("local[2]", NULL, &ctx), FL_OK);
  fl_dataset *d;
  assert_int_equal(fl_range(ctx, 0, 100, 1, 4, &d), FL_OK);
  fl_buf reply = FL_BUF_INIT;
  assert_int_equal(fl_service_call(d, "test.count_thrice", fl_bytes_str("x"), &reply), FL_OK);
  uint64_t total;
  assert_int_equal(reply.len, sizeof total);
  memcpy(&total, reply.data, sizeof total);
  assert_int_equal(total, 300);
  /* The service's own failure is the call's. */
  assert_int_equal(fl_service_call(d, "test.count_thrice", fl_bytes_str("y"), &reply), FL_EINVAL);
  assert_non_null(strstr(fl_last_error(), "bad request"));
  assert_int_equal(fl_service_call(d, "test.nothing", fl_bytes_str("x"), &reply), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "test.nothing"));
  assert_int_equal(fl_service_call(NULL, "test.count_thrice", fl_bytes_str("x"), &reply), FL_EINVAL);
  assert_int_equal(fl_service_register("", count_thrice), FL_EINVAL);
  assert_int_equal(fl_service_register("test.none", NULL), FL_EINVAL);
  fl_buf_free(&reply);
  fl_dataset_free(d);
  fl_context_close(ctx);
}

/* A cluster's driver runs only the services registered in its own process. */
static void test_driver_lacks_a_service(void **state) {
  (void)state;
  assert_int_equal(fl_service_register("test.count_thrice", count_thrice), FL_OK);
  fl_context *ctx;
  if (fl_context_open("local-cluster[1,1,256]", NULL, &ctx) != FL_OK) fail_msg("%s", fl_last_error());
  fl_dataset *d;
  assert_int_equal(fl_range(ctx, 0, 10, 1, 2, &d), FL_OK);
  fl_buf reply = FL_BUF_INIT;
  assert_int_equal(fl_service_call(d, "test.count_thrice", fl_bytes_str("x"), &reply), FL_ENOENT);
  assert_non_null(strstr(fl_last_error(), "the driver has no service 'test.count_thrice'"));
  uint64_t n; /* the application goes on */
  assert_int_equal(fl_count(d, &n), FL_OK);
  assert_int_equal(n, 10);
  fl_buf_free(&reply);
  fl_dataset_free(d);
  fl_context_close(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_service),
      cmocka_unit_test(test_driver_lacks_a_service),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
