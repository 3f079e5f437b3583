/* test_numbers.c - ty_parse_long and ty_env_long: whole numbers in range
 * are taken, the bounds included; everything else is refused (by
 * ty_env_long with a message naming the variable, its value, the range and
 * what the number means) and the caller's value is left alone; an unset or
 * empty variable keeps the default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/numbers.h"

#define VAR "TY_TEST_ENV_NUMBER"

static int read_env(const char *value, long lo, long hi, long *v, char *err, size_t errlen) {
  if (value)
    setenv(VAR, value, 1);
  else
    unsetenv(VAR);
  err[0] = '\0';
  return ty_env_long(VAR, lo, hi, "widgets per batch; 0: none", v, err, errlen);
}

static void test_default_and_taken(void **state) {
  (void)state;
  char err[256];
  long v = 42;
  assert_int_equal(read_env(NULL, 0, 9, &v, err, sizeof err), 0);
  assert_int_equal(v, 42);
  assert_int_equal(read_env("", 0, 9, &v, err, sizeof err), 0);
  assert_int_equal(v, 42);
  assert_string_equal(err, "");
  static const struct {
    const char *s;
    long lo, hi, want;
  } ok[] = {{"0", 0, 9, 0},
            {"9", 0, 9, 9},
            {"007", 0, 9, 7},
            {"-3", -5, 5, -3},
            {"-5", -5, 5, -5},
            {"86400000", 1, 86400000, 86400000},
            {"1048576", 0, 1L << 20, 1L << 20}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    v = 42;
    assert_int_equal(read_env(ok[i].s, ok[i].lo, ok[i].hi, &v, err, sizeof err), 0);
    assert_int_equal(v, ok[i].want);
  }
  unsetenv(VAR);
}

static void test_refused(void **state) {
  (void)state;
  static const char *const bad[] = {"abc", "12x", "1.5", " 5",   "5 ",  "+5",
                                    "-1",  "10",  "-",   "0x10", "1e3", "99999999999999999999"};
  char err[256], want[128];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    long v = 42;
    assert_int_equal(read_env(bad[i], 0, 9, &v, err, sizeof err), TY_EINVAL);
    assert_int_equal(v, 42);
    snprintf(want, sizeof want, VAR "='%s' is not a whole number in 0..9", bad[i]);
    if (!strstr(err, want)) fail_msg("'%s': %s", bad[i], err);
    assert_non_null(strstr(err, "(widgets per batch; 0: none)"));
  }
  /* A long value is cut, and says so. */
  char big[200];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  long v = 42;
  assert_int_equal(read_env(big, 0, 9, &v, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "='xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...' is not"));
  assert_true(strlen(err) < 160);
  unsetenv(VAR);
}

/* The text parser alone, as the CLI's flags use it. */
static void test_parse(void **state) {
  (void)state;
  long v = 7;
  assert_true(ty_parse_long("12", 1, 12, &v));
  assert_int_equal(v, 12);
  assert_true(ty_parse_long("-2", -2, 0, &v));
  assert_int_equal(v, -2);
  static const char *const bad[] = {"", "13", "0", "x", "1 ", "+1", "0x1", "-", "--1", "1.0"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    v = 7;
    if (ty_parse_long(bad[i], 1, 12, &v)) fail_msg("'%s' taken", bad[i]);
    assert_int_equal(v, 7);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_default_and_taken),
                                     cmocka_unit_test(test_refused), cmocka_unit_test(test_parse)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
