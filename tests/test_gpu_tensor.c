/* test_gpu_tensor.c: the public tensor API on the cpu device (shapes, copies and every bad
 * input), and the internal views and embedded tensors of gpu/device/device.h. */
#include "test_util.h"

#include "common/common.h"
#include "gpu/device/device.h"

static int setup_device(void **state) {
  fl_device *dev = NULL;
  if (fl_device_open(FL_DEVICE_CPU, 0, &dev) != FL_OK) return -1;
  *state = dev;
  return 0;
}

static int teardown_device(void **state) {
  fl_device_close(*state);
  return 0;
}

static void test_create_is_zero_filled_with_shape(void **state) {
  fl_device *dev = *state;
  int64_t shape[4] = {2, 3, 4, 5};
  fl_tensor *t = NULL;
  assert_ok(fl_tensor_create(dev, 4, shape, &t));
  assert_int_equal(fl_tensor_ndim(t), 4);
  for (int i = 0; i < 4; i++) assert_int_equal(fl_tensor_dim(t, i), shape[i]);
  assert_int_equal(fl_tensor_dim(t, 4), 0);
  assert_int_equal(fl_tensor_dim(t, -1), 0);
  assert_int_equal(fl_tensor_numel(t), 120);
  assert_ptr_equal(fl_tensor_device(t), dev);
  float buf[120];
  memset(buf, 0xff, sizeof buf);
  assert_ok(fl_tensor_read(t, buf, 120));
  for (int i = 0; i < 120; i++) assert_true(buf[i] == 0.0f);
  fl_tensor_destroy(t);
}

static void test_write_then_read_round_trips(void **state) {
  fl_device *dev = *state;
  int64_t shape[2] = {3, 7};
  fl_tensor *t = NULL;
  assert_ok(fl_tensor_create(dev, 2, shape, &t));
  float in[21], out[21];
  for (int i = 0; i < 21; i++) in[i] = (float)i * 0.5f - 3;
  assert_ok(fl_tensor_write(t, in, 21));
  assert_ok(fl_tensor_read(t, out, 21));
  assert_memory_equal(in, out, sizeof in);
  fl_tensor_destroy(t);
}

static void test_empty_tensor_has_no_elements(void **state) {
  fl_device *dev = *state;
  int64_t shape[2] = {0, 5};
  fl_tensor *t = NULL;
  assert_ok(fl_tensor_create(dev, 2, shape, &t));
  assert_int_equal(fl_tensor_numel(t), 0);
  assert_ok(fl_tensor_write(t, NULL, 0));
  assert_ok(fl_tensor_read(t, NULL, 0));
  fl_tensor_destroy(t);
}

static void test_create_rejects_bad_shapes(void **state) {
  fl_device *dev = *state;
  fl_tensor *t = NULL;
  int64_t ok[1] = {4};
  int64_t negative[2] = {3, -2};
  int64_t five[5] = {1, 1, 1, 1, 1};
  int64_t huge[4] = {INT32_MAX, INT32_MAX, INT32_MAX, 4};
  int64_t wide[1] = {(int64_t)INT32_MAX + 1};
  assert_fails_with(fl_tensor_create(dev, 0, ok, &t), FL_EINVAL, "ndim 0");
  assert_fails_with(fl_tensor_create(dev, 5, five, &t), FL_EINVAL, "ndim 5");
  assert_fails_with(fl_tensor_create(dev, -1, ok, &t), FL_EINVAL, "ndim -1");
  assert_fails_with(fl_tensor_create(dev, 2, negative, &t), FL_EINVAL, "dimension 1 is negative");
  assert_fails_with(fl_tensor_create(dev, 4, huge, &t), FL_EINVAL, "too large");
  assert_fails_with(fl_tensor_create(dev, 1, wide, &t), FL_EINVAL, "too large");
  assert_fails_with(fl_tensor_create(dev, 1, NULL, &t), FL_EINVAL, "shape is NULL");
  assert_fails_with(fl_tensor_create(NULL, 1, ok, &t), FL_EINVAL, "dev is NULL");
  assert_fails_with(fl_tensor_create(dev, 1, ok, NULL), FL_EINVAL, "out is NULL");
  assert_null(t);
}

static void test_create_reports_out_of_memory(void **state) {
  fl_device *dev = *state;
  int64_t shape[1] = {8};
  fl_tensor *t = NULL;
  flint_test_fail_alloc_after(0);
  fl_status st = fl_tensor_create(dev, 1, shape, &t);
  flint_test_fail_alloc_after(-1);
  assert_int_equal(st, FL_ENOMEM);
  assert_null(t);
}

static void test_copies_reject_bad_counts_and_null(void **state) {
  fl_device *dev = *state;
  int64_t shape[2] = {2, 3};
  fl_tensor *t = NULL;
  assert_ok(fl_tensor_create(dev, 2, shape, &t));
  float buf[7] = {0};
  assert_fails_with(fl_tensor_write(t, buf, 7), FL_EINVAL, "count 7 does not match the tensor's 6");
  assert_fails_with(fl_tensor_read(t, buf, 5), FL_EINVAL, "count 5 does not match the tensor's 6");
  assert_fails_with(fl_tensor_write(t, NULL, 6), FL_EINVAL, "host buffer is NULL");
  assert_fails_with(fl_tensor_read(t, NULL, 6), FL_EINVAL, "host buffer is NULL");
  assert_fails_with(fl_tensor_write(NULL, buf, 6), FL_EINVAL, "tensor is NULL");
  assert_fails_with(fl_tensor_read(NULL, buf, 6), FL_EINVAL, "tensor is NULL");
  fl_tensor_destroy(t);
}

static void test_destroy_and_getters_take_null(void **state) {
  (void)state;
  fl_tensor_destroy(NULL);
  tensor_release(NULL);
  assert_int_equal(fl_tensor_ndim(NULL), 0);
  assert_int_equal(fl_tensor_dim(NULL, 0), 0);
  assert_int_equal(fl_tensor_numel(NULL), 0);
  assert_null(fl_tensor_device(NULL));
}

static void test_view_shares_memory_and_checks_bounds(void **state) {
  fl_device *dev = *state;
  int64_t shape[1] = {12};
  fl_tensor *t = NULL;
  assert_ok(fl_tensor_create(dev, 1, shape, &t));
  float in[12];
  for (int i = 0; i < 12; i++) in[i] = (float)i;
  assert_ok(fl_tensor_write(t, in, 12));

  fl_tensor v;
  int64_t vs[2] = {2, 3};
  assert_ok(tensor_view(t, 4, 2, vs, &v));
  assert_false(v.owns);
  assert_int_equal(v.numel, 6);
  assert_int_equal(v.shape[0], 2);
  assert_int_equal(v.shape[1], 3);
  float out[6];
  assert_ok(fl_tensor_read(&v, out, 6));
  for (int i = 0; i < 6; i++) assert_true(out[i] == (float)(i + 4));
  /* Writing through the view writes the base. */
  float ones[6] = {1, 1, 1, 1, 1, 1};
  assert_ok(fl_tensor_write(&v, ones, 6));
  float all[12];
  assert_ok(fl_tensor_read(t, all, 12));
  assert_true(all[3] == 3.0f && all[4] == 1.0f && all[9] == 1.0f && all[10] == 10.0f);
  /* A view that ends exactly at the end fits; one element more does not. */
  int64_t tail[1] = {6};
  assert_ok(tensor_view(t, 6, 1, tail, &v));
  assert_fails_with(tensor_view(t, 7, 1, tail, &v), FL_EINVAL, "do not fit");
  assert_fails_with(tensor_view(t, 13, 1, tail, &v), FL_EINVAL, "do not fit");
  assert_fails_with(tensor_view(t, 0, 0, tail, &v), FL_EINVAL, "ndim 0");
  int64_t neg[1] = {-1};
  assert_fails_with(tensor_view(t, 0, 1, neg, &v), FL_EINVAL, "negative");
  assert_fails_with(tensor_view(NULL, 0, 1, tail, &v), FL_EINVAL, "NULL");
  /* Releasing a view leaves the base alone. */
  tensor_release(&v);
  assert_ok(fl_tensor_read(t, all, 12));
  fl_tensor_destroy(t);
}

static void test_ensure_grows_only_when_needed(void **state) {
  fl_device *dev = *state;
  fl_tensor t = {0};
  int64_t big[2] = {8, 5}, small[3] = {2, 2, 5}, bigger[1] = {41};
  assert_ok(tensor_ensure(&t, dev, 2, big));
  assert_true(t.owns);
  assert_int_equal(t.numel, 40);
  assert_int_equal(t.capacity, 40);
  float *first = t.data;
  for (int i = 0; i < 40; i++) first[i] = (float)i; /* the cpu device's memory is host memory */
  assert_ok(tensor_ensure(&t, dev, 3, small));
  assert_ptr_equal(t.data, first);
  assert_int_equal(t.ndim, 3);
  assert_int_equal(t.numel, 20);
  assert_int_equal(t.shape[2], 5);
  /* Back to the larger shape: the memory is still there. */
  assert_ok(tensor_ensure(&t, dev, 2, big));
  assert_ptr_equal(t.data, first);
  assert_ok(tensor_ensure(&t, dev, 1, bigger));
  assert_int_equal(t.capacity, 41);
  assert_int_equal(t.numel, 41);
  int64_t bad[1] = {-3};
  assert_fails_with(tensor_ensure(&t, dev, 1, bad), FL_EINVAL, "negative");
  assert_int_equal(t.numel, 41);
  tensor_release(&t);
  assert_null(t.data);
  assert_int_equal(t.capacity, 0);
  tensor_release(&t); /* twice is harmless */
}

static void test_device_parse_and_cuda_without_gpu(void **state) {
  fl_device *dev = *state;
  assert_string_equal(fl_device_name(dev), "cpu");
  assert_int_equal(fl_device_kind_of(dev), FL_DEVICE_CPU);
  assert_ok(fl_device_synchronize(dev));
  fl_device_kind kind;
  int ordinal;
  assert_ok(fl_device_parse("cuda:3", &kind, &ordinal));
  assert_int_equal(kind, FL_DEVICE_CUDA);
  assert_int_equal(ordinal, 3);
  assert_fails_with(fl_device_parse("tpu", &kind, &ordinal), FL_EINVAL, "tpu");
  if (fl_cuda_device_count() == 0) {
    fl_device *cuda = NULL;
    assert_int_equal(fl_device_open(FL_DEVICE_CUDA, 0, &cuda), FL_ENODEVICE);
    assert_null(cuda);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_is_zero_filled_with_shape),
      cmocka_unit_test(test_write_then_read_round_trips),
      cmocka_unit_test(test_empty_tensor_has_no_elements),
      cmocka_unit_test(test_create_rejects_bad_shapes),
      cmocka_unit_test(test_create_reports_out_of_memory),
      cmocka_unit_test(test_copies_reject_bad_counts_and_null),
      cmocka_unit_test(test_destroy_and_getters_take_null),
      cmocka_unit_test(test_view_shares_memory_and_checks_bounds),
      cmocka_unit_test(test_ensure_grows_only_when_needed),
      cmocka_unit_test(test_device_parse_and_cuda_without_gpu),
  };
  return cmocka_run_group_tests(tests, setup_device, teardown_device);
}
