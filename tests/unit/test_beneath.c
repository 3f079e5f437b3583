/* test_beneath.c - common/beneath: opening beneath a directory refuses '..'
 * above it, absolute links, links that climb out and /proc magic links,
 * and follows links that stay inside, both through openat2 and through the
 * O_NOFOLLOW walk; the process's roots: a path under no root, writing into
 * a read root, folders made, renamed and removed through links, a tree
 * checked for links out; nothing is ever made outside. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/errors.h"
#include "common/beneath.h"
#include "tmpdir_testutil.h"

/* g_dir/root: the root; g_dir/outside: a folder beside it. */
static char g_root[300], g_out[300];

static void put(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void link_at(const char *target, const char *dir, const char *name) {
  char p[1200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  assert_int_equal(symlink(target, p), 0);
}

static bool exists(const char *dir, const char *name) {
  char p[600];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return lstat(p, &st) == 0;
}

/* Entries of dir, as one sorted-by-readdir string ("a,b,"). */
static void listing(const char *dir, char *out, size_t n) {
  out[0] = '\0';
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      strncat(out, e->d_name, n - strlen(out) - 2), strcat(out, ",");
  closedir(d);
}

static int setup(void **state) {
  if (tmpdir_setup(state)) return -1;
  snprintf(g_root, sizeof g_root, "%s/root", g_dir);
  snprintf(g_out, sizeof g_out, "%s/outside", g_dir);
  char p[600];
  mkdir(g_root, 0755), mkdir(g_out, 0755);
  snprintf(p, sizeof p, "%s/sub", g_root), mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/in.txt", g_root), put(p, "inside");
  snprintf(p, sizeof p, "%s/secret.txt", g_out), put(p, "outside");
  link_at("../in.txt", g_root, "sub/up");          /* inside, relative */
  link_at("sub", g_root, "ldir");                  /* a folder link inside */
  link_at("../outside/secret.txt", g_root, "esc"); /* climbs out */
  snprintf(p, sizeof p, "%s/in.txt", g_root);
  link_at(p, g_root, "abs");                  /* absolute, even into the root */
  link_at("/proc/self/cwd", g_root, "magic"); /* absolute, to a magic link */
  link_at("loop2", g_root, "loop1");
  link_at("loop1", g_root, "loop2");
  link_at("../outside/new.txt", g_root, "dangling"); /* names nothing, outside */
  link_at("../outside", g_root, "outdir");
  return 0;
}

static void read_text(int fd, const char *want) {
  assert_true(fd >= 0);
  char buf[64] = {0};
  assert_true(read(fd, buf, sizeof buf - 1) > 0);
  close(fd);
  assert_string_equal(buf, want);
}

static void check_openat(ty_beneath_how_t how) {
  int root = open(g_root, O_PATH | O_DIRECTORY);
  assert_true(root >= 0);
  read_text(ty_beneath_openat(root, "in.txt", O_RDONLY, 0, how), "inside");
  read_text(ty_beneath_openat(root, "sub/up", O_RDONLY, 0, how), "inside");
  read_text(ty_beneath_openat(root, "ldir/up", O_RDONLY, 0, how), "inside");
  read_text(ty_beneath_openat(root, "sub/../in.txt", O_RDONLY, 0, how), "inside");
  read_text(ty_beneath_openat(root, "./sub//up", O_RDONLY, 0, how), "inside");
  int d = ty_beneath_openat(root, "", O_RDONLY | O_DIRECTORY, 0, how);
  assert_true(d >= 0);
  close(d);
  assert_int_equal(ty_beneath_openat(root, "../outside/secret.txt", O_RDONLY, 0, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "sub/../../outside/secret.txt", O_RDONLY, 0, how),
                   -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "esc", O_RDONLY, 0, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "abs", O_RDONLY, 0, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "magic", O_RDONLY | O_DIRECTORY, 0, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "outdir/secret.txt", O_RDONLY, 0, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "loop1", O_RDONLY, 0, how), -ELOOP);
  assert_int_equal(ty_beneath_openat(root, "in.txt/x", O_RDONLY, 0, how), -ENOTDIR);
  assert_int_equal(ty_beneath_openat(root, "none", O_RDONLY, 0, how), -ENOENT);
  /* O_PATH stays beneath too, and sees a link inside as what it names. */
  int p = ty_beneath_openat(root, "ldir", O_PATH | O_DIRECTORY, 0, how);
  assert_true(p >= 0);
  close(p);
  assert_int_equal(ty_beneath_openat(root, "outdir", O_PATH, 0, how), -EXDEV);
  /* The caller's O_NOFOLLOW: the last link itself, never what it names. */
  assert_int_equal(ty_beneath_openat(root, "sub/up", O_RDONLY | O_NOFOLLOW, 0, how), -ELOOP);
  p = ty_beneath_openat(root, "esc", O_PATH | O_NOFOLLOW, 0, how);
  assert_true(p >= 0);
  close(p);
  /* Creating through a link that leads out makes nothing there. */
  assert_int_equal(ty_beneath_openat(root, "dangling", O_WRONLY | O_CREAT, 0644, how), -EXDEV);
  assert_int_equal(ty_beneath_openat(root, "outdir/made.txt", O_WRONLY | O_CREAT, 0644, how),
                   -EXDEV);
  assert_false(exists(g_out, "new.txt"));
  assert_false(exists(g_out, "made.txt"));
  /* ...and a file inside is made. */
  int c = ty_beneath_openat(root, "sub/made.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644, how);
  assert_true(c >= 0);
  close(c);
  close(root);
  /* /proc magic links: refused where the walk meets one beneath /proc. */
  int proc = open("/proc/self", O_PATH | O_DIRECTORY);
  assert_true(proc >= 0);
  assert_int_equal(ty_beneath_openat(proc, "cwd", O_RDONLY | O_DIRECTORY, 0, how), -ELOOP);
  assert_int_equal(ty_beneath_openat(proc, "root/etc", O_PATH, 0, how), -ELOOP);
  int st = ty_beneath_openat(proc, "status", O_RDONLY, 0, how);
  assert_true(st >= 0);
  close(st);
  close(proc);
}

static void test_openat2(void **state) {
  (void)state;
  check_openat(TY_BENEATH_AUTO);
}

static void test_walk(void **state) {
  (void)state;
  check_openat(TY_BENEATH_WALK);
}

/* The process's roots: root is written, g_dir/ro only read. */
static void check_roots(bool walk) {
  char ro[400], err[1024], p[600], before[512], after[512];
  snprintf(ro, sizeof ro, "%s/ro", g_dir);
  mkdir(ro, 0755);
  snprintf(p, sizeof p, "%s/data.txt", ro), put(p, "data");
  assert_int_equal(ty_beneath_set_roots(ro, g_root, false, err, sizeof err), 0);
  ty_beneath_force_walk(walk);
  assert_true(ty_beneath_confined());
  assert_string_equal(ty_beneath_roots(false), ro);
  assert_string_equal(ty_beneath_roots(true), g_root);
  listing(g_out, before, sizeof before);

  read_text(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), "data");
  /* A read root is not written. */
  assert_int_equal(ty_beneath_open(p, O_WRONLY | O_TRUNC, 0, err, sizeof err), TY_EPERM);
  assert_int_equal(errno, EXDEV);
  assert_non_null(strstr(err, "outside the output roots"));
  /* A path under no root; the message names the path and the roots. */
  snprintf(p, sizeof p, "%s/secret.txt", g_out);
  assert_int_equal(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, p));
  assert_non_null(strstr(err, g_root));
  /* A link out of the root: the message names it and the root. */
  snprintf(p, sizeof p, "%s/esc", g_root);
  assert_null(ty_beneath_fopen(p, "r", err, sizeof err));
  assert_int_equal(errno, EXDEV);
  assert_non_null(strstr(err, p));
  assert_non_null(strstr(err, "leads outside the root"));
  assert_non_null(strstr(err, "esc is a symbolic link to ../outside/secret.txt"));
  /* '..' spelled in the path. */
  snprintf(p, sizeof p, "%s/sub/../../outside/secret.txt", g_root);
  assert_int_equal(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), TY_EPERM);
  /* A link inside works; relative paths too. */
  snprintf(p, sizeof p, "%s/ldir/up", g_root);
  read_text(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), "inside");
  struct stat st;
  assert_int_equal(ty_beneath_stat(p, &st, err, sizeof err), 0);
  assert_int_equal((int)st.st_size, 6);
  snprintf(p, sizeof p, "%s/none", g_root);
  assert_int_equal(ty_beneath_stat(p, &st, err, sizeof err), TY_ENOTFOUND);

  /* Folders: made inside, and through a link inside; never through one out. */
  snprintf(p, sizeof p, "%s/runs/a/b", g_root);
  assert_int_equal(ty_beneath_mkdirs(p, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/ldir/c/d", g_root);
  assert_int_equal(ty_beneath_mkdirs(p, err, sizeof err), 0);
  assert_true(exists(g_root, "sub/c/d"));
  snprintf(p, sizeof p, "%s/outdir/x/y", g_root);
  assert_int_equal(ty_beneath_mkdirs(p, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "outdir"));
  assert_non_null(strstr(err, g_root));
  snprintf(p, sizeof p, "%s/in.txt/x", g_root);
  assert_int_equal(ty_beneath_mkdirs(p, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "a file of that name exists"));
  snprintf(p, sizeof p, "%s/x", ro);
  assert_int_equal(ty_beneath_mkdirs(p, err, sizeof err), TY_EPERM);
  assert_false(exists(ro, "x"));

  /* Rename and remove act on the entry, never on what a link names. */
  char q[600];
  snprintf(p, sizeof p, "%s/runs/a/b", g_root);
  snprintf(q, sizeof q, "%s/runs/a/c", g_root);
  assert_int_equal(ty_beneath_rename(p, q, err, sizeof err), 0);
  assert_true(exists(g_root, "runs/a/c"));
  snprintf(p, sizeof p, "%s/outdir/secret.txt", g_root);
  assert_int_equal(ty_beneath_rename(q, p, err, sizeof err), TY_EPERM);
  assert_int_equal(ty_beneath_remove(p, false, err, sizeof err), TY_EPERM);
  snprintf(p, sizeof p, "%s/outdir", g_root);
  assert_int_equal(ty_beneath_remove(p, false, err, sizeof err), 0); /* the link itself */
  assert_false(exists(g_root, "outdir"));
  assert_true(exists(g_out, "secret.txt"));
  link_at("../outside", g_root, "outdir");
  snprintf(p, sizeof p, "%s/runs/a/c", g_root);
  assert_int_equal(ty_beneath_remove(p, true, err, sizeof err), 0);
  assert_int_equal(ty_beneath_remove(p, true, err, sizeof err), TY_ENOTFOUND);

  /* A tree with a link out is found; one without is fine. */
  snprintf(p, sizeof p, "%s/runs", g_root);
  assert_int_equal(ty_beneath_check_tree(p, true, 3, err, sizeof err), 0);
  snprintf(q, sizeof q, "%s/runs/a", g_root);
  link_at("../../../outside", q, "checkpoints");
  assert_int_equal(ty_beneath_check_tree(p, true, 3, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "runs/a/checkpoints"));
  assert_int_equal(ty_beneath_check_tree(p, true, 1, err, sizeof err), 0); /* not that deep */
  snprintf(q, sizeof q, "%s/runs/a/checkpoints/step-1", g_root);
  assert_int_equal(ty_beneath_mkdirs(q, err, sizeof err), TY_EPERM);
  snprintf(q, sizeof q, "%s/runs/a/checkpoints", g_root);
  assert_int_equal(ty_beneath_remove(q, false, err, sizeof err), 0);

  listing(g_out, after, sizeof after);
  assert_string_equal(before, after);
  ty_beneath_force_walk(false);
  assert_int_equal(ty_beneath_set_roots(NULL, NULL, false, err, sizeof err), 0);
}

static void test_roots(void **state) {
  (void)state;
  check_roots(false);
}

static void test_roots_walk(void **state) {
  (void)state;
  check_roots(true);
}

static void test_unconfined_and_bad_roots(void **state) {
  (void)state;
  char err[1024], p[600];
  assert_int_equal(ty_beneath_set_roots("", NULL, false, err, sizeof err), 0);
  assert_false(ty_beneath_confined());
  snprintf(p, sizeof p, "%s/esc", g_root); /* no roots: links are followed */
  read_text(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), "outside");
  snprintf(p, sizeof p, "%s/nothing-here", g_dir);
  assert_int_equal(ty_beneath_set_roots(p, NULL, false, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "does not exist"));
  /* Left out when allowed: confined, and nothing is inside. */
  assert_int_equal(ty_beneath_set_roots(p, NULL, true, err, sizeof err), 0);
  assert_true(ty_beneath_confined());
  snprintf(p, sizeof p, "%s/in.txt", g_root);
  assert_int_equal(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), TY_EPERM);
  assert_int_equal(errno, EXDEV);
  /* The root "/" holds everything, absolute links too. */
  assert_int_equal(ty_beneath_set_roots("/", NULL, false, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/abs", g_root);
  read_text(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), "inside");
  /* The environment: a value that is no 0 or 1 is named. */
  setenv("TRAINYARD_BENEATH_WALK", "2", 1);
  assert_int_equal(ty_beneath_roots_from_env(err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "TRAINYARD_BENEATH_WALK"));
  setenv("TRAINYARD_BENEATH_WALK", "1", 1);
  setenv("TRAINYARD_READ_ROOTS", g_out, 1);
  setenv("TRAINYARD_WRITE_ROOTS", g_root, 1);
  assert_int_equal(ty_beneath_roots_from_env(err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/esc", g_root);
  assert_int_equal(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), TY_EPERM);
  snprintf(p, sizeof p, "%s/secret.txt", g_out);
  read_text(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), "outside");
  /* Set but empty: confined to nothing (a server none of whose roots exists). */
  setenv("TRAINYARD_READ_ROOTS", "", 1);
  setenv("TRAINYARD_WRITE_ROOTS", "", 1);
  assert_int_equal(ty_beneath_roots_from_env(err, sizeof err), 0);
  assert_true(ty_beneath_confined());
  assert_int_equal(ty_beneath_open(p, O_RDONLY, 0, err, sizeof err), TY_EPERM);
  assert_non_null(strstr(err, "none exists"));
  unsetenv("TRAINYARD_BENEATH_WALK");
  unsetenv("TRAINYARD_READ_ROOTS");
  unsetenv("TRAINYARD_WRITE_ROOTS");
  ty_beneath_force_walk(false);
  assert_int_equal(ty_beneath_set_roots(NULL, NULL, false, err, sizeof err), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_openat2), cmocka_unit_test(test_walk), cmocka_unit_test(test_roots),
      cmocka_unit_test(test_roots_walk), cmocka_unit_test(test_unconfined_and_bad_roots)};
  return cmocka_run_group_tests(tests, setup, tmpdir_teardown);
}
