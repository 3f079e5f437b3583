/* test_errors.c - the error table and the API error model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"

static void test_codes_map_to_grpc_and_http(void **state) {
  (void)state;
  assert_int_equal(ty_err_grpc_status(TY_EINVAL), 3);
  assert_int_equal(ty_err_http_status(TY_EINVAL), 400);
  assert_int_equal(ty_err_http_status(TY_ENOTFOUND), 404);
  assert_int_equal(ty_err_http_status(TY_EEXISTS), 409);
  assert_int_equal(ty_err_http_status(TY_EUNAUTHENTICATED), 401);
  assert_int_equal(ty_err_grpc_status(TY_EUNAUTHENTICATED), 16);
  assert_string_equal(ty_err_name(TY_ENOTFOUND), "NOT_FOUND");
  assert_int_equal(ty_err_from_name("ALREADY_EXISTS"), TY_EEXISTS);
  assert_int_equal(ty_err_from_name("NO_SUCH"), TY_EUNKNOWN);
  assert_string_equal(ty_err_name(-999), "UNKNOWN");
}

static void test_error_json_has_details(void **state) {
  (void)state;
  ty_errlist_t l = TY_ERRLIST_INIT;
  ty_errlist_add(&l, "world_size", "must be >= 1, got %d", 0);
  ty_errlist_add(&l, "fsdp.bucket_mb", "must be >= 1");
  json_t *j = ty_error_json(TY_EINVAL, "the job spec is invalid", &l);
  json_t *e = json_object_get(j, "error");
  assert_string_equal(json_string_value(json_object_get(e, "code")), "INVALID_ARGUMENT");
  json_t *d = json_object_get(e, "details");
  assert_int_equal(json_array_size(d), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "field")),
                      "world_size");
  assert_string_equal(json_string_value(json_object_get(json_array_get(d, 0), "message")),
                      "must be >= 1, got 0");
  json_decref(j);
  ty_errlist_clear(&l);
  assert_int_equal(l.len, 0);
  j = ty_error_json(TY_ENOTFOUND, NULL, NULL);
  e = json_object_get(j, "error");
  assert_string_equal(json_string_value(json_object_get(e, "message")), "NOT_FOUND");
  assert_int_equal(json_array_size(json_object_get(e, "details")), 0);
  json_decref(j);
}

/* ty_errf writes at most errlen bytes (cut, terminated), tolerates no
 * buffer, and always hands back the code it was given. */
static void test_errf_formats_and_returns_code(void **state) {
  (void)state;
  char buf[16];
  memset(buf, 'x', sizeof buf);
  assert_int_equal(ty_errf(buf, sizeof buf, TY_EINVAL, "rank %d of %d", 3, 2), TY_EINVAL);
  assert_string_equal(buf, "rank 3 of 2");
  assert_int_equal(ty_errf(buf, 6, TY_ENOTFOUND, "%s", "a long message"), TY_ENOTFOUND);
  assert_string_equal(buf, "a lon");
  assert_int_equal(ty_errf(NULL, 64, TY_EPERM, "ignored %d", 1), TY_EPERM);
  buf[0] = 'q';
  assert_int_equal(ty_errf(buf, 0, TY_EINTERNAL, "ignored"), TY_EINTERNAL);
  assert_int_equal(buf[0], 'q');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codes_map_to_grpc_and_http),
      cmocka_unit_test(test_error_json_has_details),
      cmocka_unit_test(test_errf_formats_and_returns_code),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
