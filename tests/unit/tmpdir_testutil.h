/* tmpdir_testutil.h - one scratch directory per cmocka test group:
 * tmpdir_setup creates g_dir under /tmp, tmpdir_teardown removes it with
 * everything the tests wrote there. Include once, in a test's .c file. */
#ifndef TY_TESTS_TMPDIR_TESTUTIL_H
#define TY_TESTS_TMPDIR_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>

static char g_dir[256];

static int tmpdir_setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/ty_unit_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int tmpdir_teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

#endif
