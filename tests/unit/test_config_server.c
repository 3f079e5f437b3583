/* test_config_server.c - trainyardd's option table: defaults, the config
 * file < environment < flags order, bounds, and the loopback rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "server/config.h"

static void test_defaults(void **state) {
  (void)state;
  srv_config_t c;
  srv_config_init(&c);
  assert_string_equal(c.listen, "127.0.0.1:8080");
  assert_string_equal(c.db, "./var/trainyard.db");
  assert_int_equal(c.page_max, 500);
  assert_true(c.grace == 10.0);
  char msg[256];
  assert_int_equal(srv_config_check(&c, msg, sizeof msg), 0);
  assert_true(c.cpu_slots >= 1); /* 0 resolved to the online CPUs */
  assert_true(c.http_threads >= 1); /* likewise */
  srv_config_free(&c);
}

static void test_file_env_flags_order(void **state) {
  (void)state;
  char path[] = "/tmp/ty-test-config-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *text = "# comment\n grace = 3\ncpu_slots=2\nlisten = 127.0.0.1:9000\n";
  assert_int_equal(write(fd, text, strlen(text)), (int)strlen(text));
  close(fd);
  setenv("TRAINYARD_CPU_SLOTS", "5", 1);
  setenv("TRAINYARD_LISTEN", "127.0.0.1:9001", 1);
  /* The variable trainyard train reads for the same setting. */
  setenv("TRAINYARD_PROGRESS_TIMEOUT_S", "42", 1);
  char cfgflag[64];
  snprintf(cfgflag, sizeof cfgflag, "--config=%s", path);
  char *argv[] = {"trainyardd", cfgflag, "--listen", "127.0.0.1:9002", "--page-max=7", NULL};
  srv_config_t c;
  srv_config_init(&c);
  bool help;
  char msg[256];
  assert_int_equal(srv_config_load(&c, 5, argv, &help, msg, sizeof msg), 0);
  assert_false(help);
  assert_true(c.grace == 3.0);                  /* file */
  assert_int_equal(c.cpu_slots, 5);             /* env over file */
  assert_string_equal(c.listen, "127.0.0.1:9002"); /* flag over env */
  assert_int_equal(c.page_max, 7);
  assert_true(c.progress_timeout == 42.0);
  srv_config_free(&c);
  unsetenv("TRAINYARD_PROGRESS_TIMEOUT_S");
  unsetenv("TRAINYARD_CPU_SLOTS");
  unsetenv("TRAINYARD_LISTEN");
  unlink(path);
}

static void test_errors_name_the_option(void **state) {
  (void)state;
  srv_config_t c;
  srv_config_init(&c);
  char msg[256];
  assert_int_equal(srv_config_set(&c, "grace", "0", "--grace", msg, sizeof msg), -3);
  assert_non_null(strstr(msg, "grace must be between 0.05 and 3600"));
  /* Whole numbers are digits alone, as every number trainyard reads. */
  const char *not_whole[] = {"two", "+5", " 5", "5 ", "0x10", "1e3", "2.0", ""};
  for (size_t i = 0; i < sizeof not_whole / sizeof not_whole[0]; i++) {
    assert_int_equal(srv_config_set(&c, "cpu_slots", not_whole[i], "--cpu_slots", msg, sizeof msg),
                     -3);
    assert_non_null(strstr(msg, "cpu_slots must be a whole number, got '"));
  }
  assert_int_equal(srv_config_set(&c, "cpu_slots", "5000", "--cpu_slots", msg, sizeof msg), -3);
  assert_non_null(strstr(msg, "cpu_slots must be between 0 and 4096, got 5000"));
  assert_int_equal(srv_config_set(&c, "cpu_slots", "007", "--cpu_slots", msg, sizeof msg), 0);
  assert_int_equal(c.cpu_slots, 7);
  assert_int_equal(srv_config_set(&c, "nope", "1", "x", msg, sizeof msg), -3);
  assert_non_null(strstr(msg, "unknown option 'nope'"));
  bool help;
  char *argv[] = {"trainyardd", "--grace", NULL};
  assert_int_equal(srv_config_load(&c, 2, argv, &help, msg, sizeof msg), -3);
  assert_non_null(strstr(msg, "needs a value"));
  srv_config_free(&c);
}

static void test_token_required_off_loopback(void **state) {
  (void)state;
  srv_config_t c;
  srv_config_init(&c);
  char msg[256];
  assert_int_equal(srv_config_set(&c, "listen", "0.0.0.0:8080", "t", msg, sizeof msg), 0);
  assert_int_equal(srv_config_check(&c, msg, sizeof msg), -3);
  assert_non_null(strstr(msg, "without an API token"));
  assert_int_equal(srv_config_set(&c, "tokens", "abc", "t", msg, sizeof msg), 0);
  assert_int_equal(srv_config_check(&c, msg, sizeof msg), 0);
  assert_true(srv_config_is_loopback("[::1]:80"));
  assert_true(srv_config_is_loopback("127.0.0.2:80"));
  assert_false(srv_config_is_loopback("10.0.0.1:80"));
  srv_config_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_file_env_flags_order),
      cmocka_unit_test(test_errors_name_the_option),
      cmocka_unit_test(test_token_required_off_loopback),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
