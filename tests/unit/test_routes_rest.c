/* test_routes_rest.c - REST path patterns: captures, their bounds, and no
 * stale bytes left in the capture slots a pattern does not use (the pool
 * threads reuse their stacks, so stale bytes would leak between requests). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/rest_internal.h"

static void test_captures(void **state) {
  (void)state;
  char p[REST_MAX_PARAMS][128];
  assert_true(rest_route_match("/v1/jobs/{id}", "/v1/jobs/j-12ab", p));
  assert_string_equal(p[0], "j-12ab");
  assert_true(rest_route_match("/v1/jobs/{id}:cancel", "/v1/jobs/j-1:cancel", p));
  assert_string_equal(p[0], "j-1");
  assert_true(rest_route_match("/v1/jobs/{id}/ranks/{rank}/log", "/v1/jobs/j-1/ranks/3/log", p));
  assert_string_equal(p[0], "j-1");
  assert_string_equal(p[1], "3");
}

static void test_refusals(void **state) {
  (void)state;
  char p[REST_MAX_PARAMS][128];
  assert_false(rest_route_match("/v1/jobs/{id}", "/v1/jobs/", p));    /* empty segment */
  assert_false(rest_route_match("/v1/jobs/{id}", "/v1/jobs/a/b", p)); /* one segment only */
  assert_false(rest_route_match("/v1/jobs/{id}", "/v1/jobs/a:cancel", p));
  assert_false(rest_route_match("/v1/jobs", "/v1/jobs/", p));
  assert_false(rest_route_match("/", "/index", p));
  char long_path[300] = "/v1/jobs/";
  memset(long_path + 9, 'x', 200);
  assert_false(rest_route_match("/v1/jobs/{id}", long_path, p)); /* over 127 bytes */
}

static void test_unused_slots_are_empty(void **state) {
  (void)state;
  char p[REST_MAX_PARAMS][128];
  memset(p, 'x', sizeof p);
  assert_true(rest_route_match("/", "/", p));
  for (int i = 0; i < REST_MAX_PARAMS; i++) assert_int_equal(p[i][0], '\0');
  memset(p, 'x', sizeof p);
  assert_true(rest_route_match("/assets/{file}", "/assets/app.js", p));
  assert_string_equal(p[0], "app.js");
  for (int i = 1; i < REST_MAX_PARAMS; i++) assert_int_equal(p[i][0], '\0');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_captures),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_unused_slots_are_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
