/* test_cpu_pool.c - pool_for covers every index exactly once, in ranges that
 * depend only on n and the thread count, inline for small n, and
 * back-to-back calls (the pool's threads sleeping in between) all finish. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/model/cpu_pool.h"

typedef struct {
  int *hits;
  size_t calls;
} ctx_t;

/* Ranges are disjoint, so threads never touch the same hit. */
static void mark(void *p, size_t b, size_t e) {
  ctx_t *c = p;
  for (size_t i = b; i < e; i++) c->hits[i]++;
}

/* Counts calls too: only for a call that must run inline. */
static void mark_count(void *p, size_t b, size_t e) {
  mark(p, b, e);
  ((ctx_t *)p)->calls++;
}

static void test_covers_once(void **state) {
  (void)state;
  assert_true(pool_threads() >= 1);
  size_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, 100003};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    ctx_t c = {calloc(n + 1, sizeof(int)), 0};
    for (int rep = 0; rep < 50; rep++) pool_for(n, 1, mark, &c);
    for (size_t i = 0; i < n; i++) assert_int_equal(c.hits[i], 50);
    assert_int_equal(c.hits[n], 0);
    free(c.hits);
  }
}

static void test_small_runs_inline(void **state) {
  (void)state;
  ctx_t c = {calloc(10, sizeof(int)), 0};
  pool_for(10, 100, mark_count, &c); /* 10 < 2 * 100: one call on the whole range */
  assert_int_equal(c.calls, 1);
  for (int i = 0; i < 10; i++) assert_int_equal(c.hits[i], 1);
  free(c.hits);
}

/* A child forked after the pool started gets a pool of its own. */
static void test_after_fork(void **state) {
  (void)state;
  ctx_t c = {calloc(100000, sizeof(int)), 0};
  pool_for(100000, 1, mark, &c);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20); /* a child waiting on its parent's threads would hang */
    pool_for(100000, 1, mark, &c);
    for (int i = 0; i < 100000; i++)
      if (c.hits[i] != 2) _exit(1);
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(c.hits);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_covers_once),
                                     cmocka_unit_test(test_small_runs_inline),
                                     cmocka_unit_test(test_after_fork)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
