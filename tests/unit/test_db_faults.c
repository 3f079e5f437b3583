/* test_db_faults.c - the database on a bad day: one server per database
 * file whatever name reaches it (symlink, hard link), a file deleted or
 * replaced under an open database is noticed, a damaged file is refused at
 * open (PRAGMA quick_check), and the fault-injecting VFS fails the Nth
 * write as its control file says and stops failing once it is gone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "db/db.h"
#include "tmpdir_testutil.h"

static int insert(db_t *db, const char *id, size_t spec_len) {
  db_job_t j = {0};
  snprintf(j.id, sizeof j.id, "%s", id);
  j.name = (char *)"t";
  char *spec = malloc(spec_len + 16);
  snprintf(spec, spec_len + 16, "{\"pad\":\"%0*d\"}", (int)spec_len, 7);
  j.spec = spec;
  snprintf(j.token, sizeof j.token, "tok-%s", id);
  j.world_size = 1;
  snprintf(j.device, sizeof j.device, "cpu");
  db_job_t *existing = NULL;
  int rc = db_job_insert(db, &j, &existing);
  db_job_free(existing);
  free(j.reason); /* filled in by db_job_insert */
  free(spec);
  return rc;
}

static void test_one_server_per_file_by_any_name(void **state) {
  (void)state;
  char path[300], sym[300], hard[300], msg[1024], want[64];
  snprintf(path, sizeof path, "%s/a/state.db", g_dir);
  snprintf(sym, sizeof sym, "%s/sym.db", g_dir);
  snprintf(hard, sizeof hard, "%s/hard.db", g_dir);
  db_t *db = NULL, *other = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  assert_int_equal(symlink(path, sym), 0);
  assert_int_equal(link(path, hard), 0);
  snprintf(want, sizeof want, "in use by another trainyardd (pid %ld, ", (long)getpid());
  const char *names[] = {sym, hard};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(db_open(names[i], &other, msg, sizeof msg), TY_EPRECONDITION);
    assert_null(other);
    assert_non_null(strstr(msg, want));
    assert_non_null(strstr(msg, "by whatever name it was given"));
  }
  assert_int_equal(db_file_check(db, msg, sizeof msg), 0);
  db_close(db);
  /* Free again once closed, by any name. */
  assert_int_equal(db_open(hard, &db, msg, sizeof msg), 0);
  db_close(db);
}

static void test_deleted_or_replaced_file_is_noticed(void **state) {
  (void)state;
  char path[300], repl[300], msg[1024];
  snprintf(path, sizeof path, "%s/b/state.db", g_dir);
  snprintf(repl, sizeof repl, "%s/b/other.db", g_dir);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  assert_int_equal(db_file_check(db, msg, sizeof msg), 0);
  int fd = open(repl, O_CREAT | O_WRONLY, 0644);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(rename(repl, path), 0);
  assert_int_equal(db_file_check(db, msg, sizeof msg), TY_EDATALOSS);
  assert_non_null(strstr(msg, "replaced by another file"));
  assert_int_equal(unlink(path), 0);
  assert_int_equal(db_file_check(db, msg, sizeof msg), TY_EDATALOSS);
  assert_non_null(strstr(msg, "was deleted while this server ran"));
  db_close(db);
}

static void test_damaged_file_is_refused(void **state) {
  (void)state;
  char path[300], msg[1024];
  snprintf(path, sizeof path, "%s/c/state.db", g_dir);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  for (int i = 0; i < 64; i++) {
    char id[16];
    snprintf(id, sizeof id, "j%d", i);
    assert_int_equal(insert(db, id, 1500), 0);
  }
  db_close(db); /* the last connection checkpoints the WAL into the file */
  /* Page 3 (4096-byte pages) overwritten with garbage: a b-tree page. */
  int fd = open(path, O_WRONLY);
  assert_true(fd >= 0);
  char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 7 + 13);
  assert_int_equal(pwrite(fd, junk, sizeof junk, 2 * 4096), (ssize_t)sizeof junk);
  close(fd);
  assert_int_equal(db_open(path, &db, msg, sizeof msg), TY_EDATALOSS);
  assert_null(db);
  assert_non_null(strstr(msg, "is damaged (PRAGMA quick_check: "));
  assert_non_null(strstr(msg, "restore it from a backup"));
}

static void write_ctl(const char *ctl, const char *text) {
  char tmp[320];
  snprintf(tmp, sizeof tmp, "%s.new", ctl);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(rename(tmp, ctl), 0); /* a new inode: read again, count from 0 */
}

static void test_fault_vfs_fails_the_nth_write(void **state) {
  (void)state;
  char path[300], ctl[300], msg[1024];
  snprintf(path, sizeof path, "%s/d/state.db", g_dir);
  snprintf(ctl, sizeof ctl, "%s/faults", g_dir);
  setenv("TRAINYARD_TEST_DB_FAULTS", ctl, 1);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  unsetenv("TRAINYARD_TEST_DB_FAULTS");
  assert_int_equal(insert(db, "before", 10), 0);
  /* Every write from the first on: disk full. */
  write_ctl(ctl, "1 full\n");
  assert_int_equal(insert(db, "full", 10), TY_EUNAVAILABLE);
  db_job_t *j = NULL;
  assert_int_equal(db_job_get(db, "full", &j), TY_ENOTFOUND);
  char err[512];
  db_last_error(db, err, sizeof err);
  assert_non_null(strstr(err, "database or disk is full"));
  /* Once the control file is gone, writes work again on the same open. */
  unlink(ctl);
  assert_int_equal(insert(db, "after", 10), 0);
  db_last_error(db, err, sizeof err);
  assert_string_equal(err, "no error recorded");
  /* The second write only, as an I/O error: the first insert's frames
   * take more than one write, so it fails; the next works. */
  write_ctl(ctl, "2 ioerr once\n");
  assert_int_equal(insert(db, "io", 10), TY_EUNAVAILABLE);
  assert_int_equal(insert(db, "io2", 10), 0);
  unlink(ctl);
  assert_int_equal(db_job_get(db, "before", &j), 0);
  db_job_free(j);
  assert_int_equal(db_job_get(db, "after", &j), 0);
  db_job_free(j);
  db_close(db);
  /* Reopened without faults: everything acknowledged is there. */
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  assert_int_equal(db_job_get(db, "io2", &j), 0);
  db_job_free(j);
  db_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_server_per_file_by_any_name),
      cmocka_unit_test(test_deleted_or_replaced_file_is_noticed),
      cmocka_unit_test(test_damaged_file_is_refused),
      cmocka_unit_test(test_fault_vfs_fails_the_nth_write),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
