/* test_json_util.c - ty_json_kind's names for every JSON type and for NULL;
 * ty_json_dump_file replacing a file whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The file is replaced whole: the old one stays until the new is written,
 * and a write that cannot be made leaves it and no part of its own. */
static void test_dump_file_replaces_whole(void **state) {
  (void)state;
  char dir[] = "/tmp/ty-json-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128], partial[160];
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(partial, sizeof partial, "%s.partial", path);
  json_t *a = json_pack("{s:i}", "hidden_size", 64), *b = json_pack("{s:i}", "hidden_size", 128);
  assert_int_equal(ty_json_dump_file(a, path, JSON_INDENT(2)), 0);
  assert_int_equal(ty_json_dump_file(b, path, JSON_INDENT(2)), 0);
  json_t *got = json_load_file(path, 0, NULL);
  assert_true(json_equal(got, b));
  json_decref(got);
  assert_int_equal(access(partial, F_OK), -1);
  /* Where the partial file cannot be made (a directory in its way), the
   * write fails with errno and the file is as it was. */
  assert_int_equal(mkdir(partial, 0755), 0);
  assert_int_equal(ty_json_dump_file(a, path, 0), -1);
  got = json_load_file(path, 0, NULL);
  assert_true(json_equal(got, b));
  json_decref(got);
  assert_int_equal(rmdir(partial), 0);
  json_decref(a);
  json_decref(b);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kind_names_each_type),
      cmocka_unit_test(test_dump_file_replaces_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
