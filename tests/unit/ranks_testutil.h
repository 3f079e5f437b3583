/* ranks_testutil.h - what the collective tests share about the ranks they
 * fork: waiting for every one and failing the test with the first that did
 * not exit 0. Include in a test's .c file after cmocka.h. */
#ifndef TY_TESTS_RANKS_TESTUTIL_H
#define TY_TESTS_RANKS_TESTUTIL_H

#include <sys/types.h>
#include <sys/wait.h>

/* Waits for the world ranks pids[]; fails naming a rank that exited
 * non-zero or on a signal. */
static inline void tu_wait_ranks_ok(int world, const pid_t *pids) {
  for (int r = 0; r < world; r++) {
    int st;
    assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      fail_msg("rank %d of %d: %s %d", r, world, WIFEXITED(st) ? "exit" : "signal",
               WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  }
}

#endif
