/* test_memstat.c - VmHWM rises with touched memory and resets on request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "common/memstat.h"

static void test_peak_follows_touched_pages(void **state) {
  (void)state;
  memstat_t before, after, reset;
  assert_int_equal(memstat_read(&before), 0);
  assert_true(before.rss_bytes > 0);
  assert_true(before.hwm_bytes >= before.rss_bytes);
  const size_t n = 64u << 20;
  /* mmap, not malloc: the pages are the process's own until munmap. */
  char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(p != MAP_FAILED);
  memset(p, 1, n);
  assert_int_equal(memstat_read(&after), 0);
  assert_true(after.hwm_bytes >= before.rss_bytes + n - (4u << 20));
  munmap(p, n);
  if (memstat_reset_peak() == 0) {
    assert_int_equal(memstat_read(&reset), 0);
    assert_true(reset.hwm_bytes < after.hwm_bytes - n / 2);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_peak_follows_touched_pages)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
