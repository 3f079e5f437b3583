/* test_token_server.c - server/token.h: the API token list and a job's
 * report token compared by one function, whole entries only. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "server/token.h"

static void test_equal(void **state) {
  (void)state;
  assert_true(token_equal("abc", "abc"));
  assert_true(token_equal("", ""));
  assert_false(token_equal("abc", "abd"));
  assert_false(token_equal("abc", "ab")); /* a prefix is not the token */
  assert_false(token_equal("ab", "abc"));
  assert_false(token_equal("", "a"));
}

static void test_listed(void **state) {
  (void)state;
  assert_true(token_listed("one,two", "two"));
  assert_true(token_listed(" one , two ", "one"));
  assert_true(token_listed("one two", "two"));
  assert_false(token_listed("one,two", "tw"));
  assert_false(token_listed("one,two", "one,two"));
  assert_false(token_listed("one,two", "twos"));
  assert_false(token_listed("", "x"));
  assert_false(token_listed(",,", ""));
}

static void test_required(void **state) {
  (void)state;
  assert_false(token_required(""));
  assert_false(token_required(" , ,"));
  assert_true(token_required(",a"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equal),
      cmocka_unit_test(test_listed),
      cmocka_unit_test(test_required),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
