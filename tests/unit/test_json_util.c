/* test_json_util.c - ty_json_kind's names for every JSON type and for NULL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/json_util.h"

static void test_kind_names_each_type(void **state) {
  (void)state;
  json_t *v = json_loads("[{}, [], \"s\", 1, 1.5, true, false, null]", 0, NULL);
  assert_non_null(v);
  assert_string_equal(ty_json_kind(json_array_get(v, 0)), "an object");
  assert_string_equal(ty_json_kind(json_array_get(v, 1)), "an array");
  assert_string_equal(ty_json_kind(json_array_get(v, 2)), "a string");
  assert_string_equal(ty_json_kind(json_array_get(v, 3)), "an integer");
  assert_string_equal(ty_json_kind(json_array_get(v, 4)), "a number");
  assert_string_equal(ty_json_kind(json_array_get(v, 5)), "a boolean");
  assert_string_equal(ty_json_kind(json_array_get(v, 6)), "a boolean");
  assert_string_equal(ty_json_kind(json_array_get(v, 7)), "null");
  assert_string_equal(ty_json_kind(NULL), "nothing");
  json_decref(v);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kind_names_each_type),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
