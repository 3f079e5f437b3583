/* test_listen_server.c - running without an API token is allowed only on
 * loopback, judged by every address the listen name resolves to, never by
 * its spelling ("127.lan" may name any host); names resolved by an
 * injected resolver, numbers and localhost by the system's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/errors.h"
#include "server/config.h"

/* A resolver for made-up names: each resolves to the numeric addresses
 * listed for it (comma-separated); other names do not resolve. */
static int fake_resolve(const char *node, const char *service, const struct addrinfo *hints,
                        struct addrinfo **res) {
  static const struct {
    const char *name, *addrs;
  } table[] = {
      {"127.lan", "10.1.2.3"},
      {"loop.lan", "127.0.0.5,::1"},
      {"mixed.lan", "127.0.0.1,192.168.1.2"},
      {"mapped.lan", "::ffff:127.0.0.9"},
      {"mapped-out.lan", "::ffff:10.0.0.1"},
  };
  (void)service;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    if (strcmp(node, table[i].name)) continue;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", table[i].addrs);
    struct addrinfo **tail = res;
    *res = NULL;
    for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
      struct addrinfo h = *hints;
      h.ai_flags |= AI_NUMERICHOST;
      if (getaddrinfo(a, NULL, &h, tail)) return EAI_FAIL;
      while (*tail) tail = &(*tail)->ai_next;
    }
    return 0;
  }
  return EAI_NONAME;
}

static void test_names_are_resolved(void **state) {
  (void)state;
  assert_false(srv_listen_is_loopback("127.lan:8080", fake_resolve));
  assert_true(srv_listen_is_loopback("loop.lan:8080", fake_resolve));
  assert_false(srv_listen_is_loopback("mixed.lan:8080", fake_resolve));
  assert_true(srv_listen_is_loopback("mapped.lan:8080", fake_resolve));
  assert_false(srv_listen_is_loopback("mapped-out.lan:8080", fake_resolve));
  assert_false(srv_listen_is_loopback("nowhere.lan:8080", fake_resolve));
}

static void test_numbers_and_wildcards(void **state) {
  (void)state;
  assert_true(srv_config_is_loopback("127.0.0.1:8080"));
  assert_true(srv_config_is_loopback("127.9.9.9:0"));
  assert_true(srv_config_is_loopback("[::1]:80"));
  assert_true(srv_config_is_loopback("[::ffff:127.0.0.1]:80"));
  assert_true(srv_config_is_loopback("localhost:80"));
  assert_false(srv_config_is_loopback("0.0.0.0:80"));
  assert_false(srv_config_is_loopback("[::]:80"));
  assert_false(srv_config_is_loopback(":80"));
  assert_false(srv_config_is_loopback("10.0.0.1:80"));
  assert_false(srv_config_is_loopback("127.lan.invalid:80"));
}

static void test_check_refuses_without_token(void **state) {
  (void)state;
  srv_config_t c;
  srv_config_init(&c);
  char msg[512];
  assert_int_equal(srv_config_set(&c, "listen", "127.lan.invalid:8080", "t", msg, sizeof msg), 0);
  assert_int_equal(srv_config_check(&c, msg, sizeof msg), TY_EINVAL);
  assert_non_null(strstr(msg, "not every address it resolves to is a loopback one"));
  srv_config_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_are_resolved),
      cmocka_unit_test(test_numbers_and_wildcards),
      cmocka_unit_test(test_check_refuses_without_token),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
