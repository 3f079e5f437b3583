/* test_fsutil.c - ty_mkdirs: parents created, existing directories accepted,
 * a file in the way reported by name; ty_dir_lock: one holder at a time,
 * released on close, not handed to programs started meanwhile; ty_rmtree:
 * a tree removed, links not followed. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/fsutil.h"

static int is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_mkdirs(void **state) {
  (void)state;
  char root[] = "/tmp/ty-fsutil-XXXXXX";
  assert_non_null(mkdtemp(root));
  char p[512], err[256];
  snprintf(p, sizeof p, "%s/a/b/c", root);
  assert_int_equal(ty_mkdirs(p, err, sizeof err), 0);
  assert_true(is_dir(p));
  /* Again: an existing directory is success; a trailing slash too. */
  assert_int_equal(ty_mkdirs(p, err, sizeof err), 0);
  strcat(p, "/");
  assert_int_equal(ty_mkdirs(p, err, sizeof err), 0);
  /* A regular file where a directory should be. */
  char f[512];
  snprintf(f, sizeof f, "%s/file", root);
  FILE *fp = fopen(f, "w");
  assert_non_null(fp);
  fclose(fp);
  snprintf(p, sizeof p, "%s/file/sub", root);
  assert_int_equal(ty_mkdirs(p, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "/file"));
  assert_int_equal(ty_mkdirs(f, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "a file of that name exists"));
  /* Relative paths work from the current directory. */
  char cwd[512];
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(root), 0);
  assert_int_equal(ty_mkdirs("x/y", err, sizeof err), 0);
  assert_true(is_dir("x/y"));
  assert_int_equal(chdir(cwd), 0);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
}

static void test_dir_lock(void **state) {
  (void)state;
  char root[] = "/tmp/ty-fsutil-XXXXXX";
  assert_non_null(mkdtemp(root));
  char d[512], err[256];
  snprintf(d, sizeof d, "%s/runs/a", root);
  int a = ty_dir_lock(d, err, sizeof err); /* made when missing */
  assert_true(a >= 0);
  assert_true(is_dir(d));
  /* Any other open of the folder is refused while a holds it, also from
   * another spelling of it. */
  assert_int_equal(ty_dir_lock(d, err, sizeof err), TY_EPRECONDITION);
  char other[600];
  snprintf(other, sizeof other, "%s/runs/../runs/a/", root);
  assert_int_equal(ty_dir_lock(other, err, sizeof err), TY_EPRECONDITION);
  /* A program started while it is held does not keep it: once the child
   * has exec'd (its end of a close-on-exec pipe closes then), closing a
   * frees the folder. */
  int p[2];
  assert_int_equal(pipe2(p, O_CLOEXEC), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  char c;
  assert_int_equal(read(p[0], &c, 1), 0);
  close(p[0]);
  close(a);
  int b = ty_dir_lock(d, err, sizeof err);
  assert_true(b >= 0);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  close(b);
  /* A file in the way is named. */
  char f[512];
  snprintf(f, sizeof f, "%s/file", root);
  FILE *fp = fopen(f, "w");
  assert_non_null(fp);
  fclose(fp);
  assert_int_equal(ty_dir_lock(f, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "a file of that name exists"));
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  assert_int_equal(system(cmd), 0);
}

/* This test runs from <build>/tests: the worker is found in ../worker/. */
static void touch(const char *dir, const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("x", f);
  fclose(f);
}

/* ty_rmtree removes a tree, removes links without following them, and
 * treats a missing folder as done. */
static void test_rmtree(void **state) {
  (void)state;
  char root[] = "/tmp/ty-fsutil-XXXXXX";
  assert_non_null(mkdtemp(root));
  char tree[512], deep[600], keep[512], link[600], err[256];
  snprintf(tree, sizeof tree, "%s/job", root);
  snprintf(deep, sizeof deep, "%s/attempt-1/sub", tree);
  snprintf(keep, sizeof keep, "%s/keep", root);
  assert_int_equal(ty_mkdirs(deep, err, sizeof err), 0);
  assert_int_equal(ty_mkdirs(keep, err, sizeof err), 0);
  touch(tree, "spec.json");
  touch(deep, "rank-0.log");
  touch(keep, "precious");
  snprintf(link, sizeof link, "%s/attempt-1/to-keep", tree);
  assert_int_equal(symlink(keep, link), 0);
  assert_int_equal(ty_rmtree(tree, err, sizeof err), 0);
  assert_false(is_dir(tree));
  char precious[600];
  snprintf(precious, sizeof precious, "%s/precious", keep);
  assert_int_equal(access(precious, F_OK), 0);           /* the link's target is untouched */
  assert_int_equal(ty_rmtree(tree, err, sizeof err), 0); /* gone already: done */
  /* A folder whose entry cannot be removed says which. */
  if (geteuid() != 0) {
    snprintf(deep, sizeof deep, "%s/locked", tree);
    assert_int_equal(ty_mkdirs(deep, err, sizeof err), 0);
    touch(deep, "f");
    assert_int_equal(chmod(deep, 0500), 0);
    assert_int_equal(ty_rmtree(tree, err, sizeof err), TY_EPERM);
    assert_non_null(strstr(err, "locked/f"));
    assert_int_equal(chmod(deep, 0700), 0);
    assert_int_equal(ty_rmtree(tree, err, sizeof err), 0);
  }
  assert_int_equal(ty_rmtree(root, err, sizeof err), 0);
  assert_false(is_dir(root));
}

static void test_find_worker(void **state) {
  (void)state;
  char path[4096];
  assert_int_equal(ty_find_worker(path, sizeof path), 0);
  const char *tail = "/tests/../worker/trainyard-worker";
  size_t n = strlen(path);
  assert_true(n > strlen(tail));
  assert_string_equal(path + n - strlen(tail), tail);
  assert_int_equal(access(path, X_OK), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_mkdirs), cmocka_unit_test(test_dir_lock),
                                     cmocka_unit_test(test_rmtree),
                                     cmocka_unit_test(test_find_worker)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
