/* test_json_util.c - ty_json_kind's names for every JSON type and for NULL;
 * ty_json_dumps' shortest reals; ty_json_dump_file replacing a file whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* Reals in their shortest form that reads back; integers, strings (with
 * digits and escapes inside) and the layout as jansson writes them. */
static void test_dumps_shortest_reals(void **state) {
  (void)state;
  json_t *j = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:s,s:[f,f,i]}", "a", 3e-4, "b", 1e-6,
                        "c", 16.0, "d", 0.1 + 0.2, "e", 1e20, "f", -2.5e-300, "g", -0.0, "h",
                        (json_int_t)-42, "s", "1.50e3 \"0.1\" \\", "l", 5.5, 1.0 / 3, 7);
  char *t = ty_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
  assert_string_equal(t,
                      "{\"a\":0.0003,\"b\":1e-6,\"c\":16.0,\"d\":0.30000000000000004,"
                      "\"e\":1e20,\"f\":-2.5e-300,\"g\":-0.0,\"h\":-42,"
                      "\"l\":[5.5,0.3333333333333333,7],\"s\":\"1.50e3 \\\"0.1\\\" \\\\\"}");
  free(t);
  /* A precision asked for is ignored: nothing is cut. */
  t = ty_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(3));
  assert_non_null(strstr(t, "0.30000000000000004"));
  free(t);
  /* Indented output keeps jansson's layout. */
  json_t *one = json_pack("{s:f}", "lr", 3e-4);
  t = ty_json_dumps(one, JSON_INDENT(2));
  assert_string_equal(t, "{\n  \"lr\": 0.0003\n}");
  free(t);
  json_decref(one);
  json_decref(j);
}

/* Every real reads back to the same double, and is never longer than
 * jansson's own 17 digits: doubles of every magnitude, from their bits. */
static void test_dumps_reals_read_back(void **state) {
  (void)state;
  uint64_t x = 0x9E3779B97F4A7C15u;
  json_t *arr = json_array();
  for (int i = 0; i < 20000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    double d;
    memcpy(&d, &x, sizeof d);
    if (isfinite(d)) json_array_append_new(arr, json_real(i % 2 ? d : (double)(x % 100000) / 1e4));
  }
  char *ours = ty_json_dumps(arr, JSON_COMPACT);
  char *theirs = json_dumps(arr, JSON_COMPACT | JSON_REAL_PRECISION(17));
  assert_true(strlen(ours) <= strlen(theirs));
  json_t *back = json_loads(ours, 0, NULL);
  assert_non_null(back);
  assert_int_equal(json_array_size(back), json_array_size(arr));
  for (size_t i = 0; i < json_array_size(arr); i++) {
    assert_true(json_is_real(json_array_get(back, i)));
    double want = json_real_value(json_array_get(arr, i));
    double got = json_real_value(json_array_get(back, i));
    assert_memory_equal(&got, &want, sizeof got);
  }
  json_decref(back);
  free(ours);
  free(theirs);
  json_decref(arr);
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
  /* Its reals as ty_json_dumps writes them. */
  json_t *eps = json_pack("{s:f}", "rms_norm_eps", 1e-6);
  assert_int_equal(ty_json_dump_file(eps, path, JSON_COMPACT), 0);
  json_decref(eps);
  char text[64] = "";
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  assert_non_null(fgets(text, sizeof text, f));
  fclose(f);
  assert_string_equal(text, "{\"rms_norm_eps\":1e-6}");
  assert_int_equal(ty_json_dump_file(b, path, JSON_INDENT(2)), 0);
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
      cmocka_unit_test(test_dumps_shortest_reals),
      cmocka_unit_test(test_dumps_reals_read_back),
      cmocka_unit_test(test_dump_file_replaces_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
