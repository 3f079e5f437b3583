/* test_shm_name.c - the one rule for the ranks' shared-memory segment
 * names (common/shm_name.h): the path of a rendezvous, trainyardd's
 * attempt names read back, and the sweep of segments whose local launcher
 * is gone (killed during its ranks' rendezvous). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/shm_name.h"

static void test_paths_and_server_names(void **state) {
  (void)state;
  char path[256], err[256], id[40], rdv[128];
  assert_int_equal(ty_shm_path("shm:ty-j-1-2", path, sizeof path, err, sizeof err), 0);
  assert_string_equal(path, "/trainyard-ty-j-1-2");
  assert_int_equal(ty_shm_path("nccl:x", path, sizeof path, err, sizeof err), TY_EINVAL);
  assert_int_equal(ty_shm_path("shm:a/b", path, sizeof path, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "has '/' at 1"));
  ty_shm_server_rendezvous("j-00ff", 3, rdv, sizeof rdv);
  assert_string_equal(rdv, "shm:ty-j-00ff-3");
  int attempt = 0;
  assert_true(ty_shm_server_parse("trainyard-ty-j-00ff-3", id, sizeof id, &attempt));
  assert_string_equal(id, "j-00ff");
  assert_int_equal(attempt, 3);
  assert_false(ty_shm_server_parse("trainyard-ty-j-00ff-x", id, sizeof id, &attempt));
  assert_false(ty_shm_server_parse("trainyard-local-1-2-1", id, sizeof id, &attempt));
  assert_false(ty_shm_server_parse("trainyard-ty--1", id, sizeof id, &attempt));
}

static void make_segment(const char *name) {
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  assert_true(fd >= 0);
  close(fd);
}

static bool exists(const char *name) {
  char path[300];
  snprintf(path, sizeof path, "/dev/shm%s", name);
  return access(path, F_OK) == 0;
}

static void test_sweep_removes_only_dead_launchers(void **state) {
  (void)state;
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) _exit(0);
  assert_int_equal(waitpid(child, NULL, 0), child); /* its pid names no process now */
  char dead[128], live[128];
  snprintf(dead, sizeof dead, "/trainyard-local-%d-12345-1", (int)child);
  snprintf(live, sizeof live, "/trainyard-local-%d-12345-1", (int)getpid());
  make_segment(dead);
  make_segment(live);
  assert_true(ty_shm_sweep_local() >= 1);
  assert_false(exists(dead));
  assert_true(exists(live));
  shm_unlink(live);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_paths_and_server_names),
      cmocka_unit_test(test_sweep_removes_only_dead_launchers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
