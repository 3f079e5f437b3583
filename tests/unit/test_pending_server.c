/* test_pending_server.c - no lost state change (server/pending.c): writes
 * the database cannot take (disk full, through the fault-injecting VFS) are
 * kept in order, the health condition names the cause while they are,
 * writes a client waits on are refused meanwhile, and everything lands, in
 * order, once the database takes writes again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "db/db.h"
#include "server/health.h"
#include "server/pending.h"
#include "tmpdir_testutil.h"

typedef struct {
  char seen[8][32]; /* what on_written heard, in order */
  int n;
} heard_t;

static void on_written(void *ctx, const pend_op_t *op) {
  heard_t *h = ctx;
  if (h->n < 8)
    snprintf(h->seen[h->n++], sizeof h->seen[0], "%s:%d",
             op->kind == PEND_TRANSITION ? db_state_name(op->to) : op->state, op->rank);
}

static void arm(const char *ctl, const char *text) {
  char tmp[320];
  snprintf(tmp, sizeof tmp, "%s.new", ctl);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(rename(tmp, ctl), 0);
}

static void test_kept_in_order_until_written(void **state) {
  (void)state;
  char path[300], ctl[300], msg[512], why[1024];
  snprintf(path, sizeof path, "%s/state.db", g_dir);
  snprintf(ctl, sizeof ctl, "%s/faults", g_dir);
  setenv("TRAINYARD_TEST_DB_FAULTS", ctl, 1);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  unsetenv("TRAINYARD_TEST_DB_FAULTS");
  db_job_t j = {0};
  snprintf(j.id, sizeof j.id, "j1");
  j.name = (char *)"t";
  j.spec = (char *)"{}";
  snprintf(j.token, sizeof j.token, "tok");
  j.world_size = 1;
  snprintf(j.device, sizeof j.device, "cpu");
  db_job_t *existing = NULL;
  assert_int_equal(db_job_insert(db, &j, &existing), 0);
  free(j.reason); /* filled in by db_job_insert */
  assert_int_equal(
      db_job_transition(db, "j1", DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, "go", NULL, NULL), 0);
  health_t *health = health_new();
  heard_t heard = {0};
  pend_t *p = pend_new(db, health, on_written, &heard);

  arm(ctl, "1 full\n");
  pend_op_t run = {.kind = PEND_TRANSITION,
                   .from_mask = DB_MASK_ACTIVE,
                   .to = DB_JOB_RUNNING,
                   .text = "reported"};
  snprintf(run.id, sizeof run.id, "j1");
  assert_int_equal(pend_write(p, &run, NULL, NULL), 1);
  assert_false(health_ok(health, why, sizeof why));
  assert_non_null(strstr(why, "database or disk is full"));
  assert_non_null(strstr(why, "kept in memory and retried"));
  pend_op_t fin = {.kind = PEND_FINISHED, .attempt = 1, .rank = 0, .text = ""};
  snprintf(fin.id, sizeof fin.id, "j1");
  snprintf(fin.state, sizeof fin.state, "exited");
  assert_int_equal(pend_write(p, &fin, NULL, NULL), 1); /* behind the first */
  pend_op_t done = run;
  done.to = DB_JOB_SUCCEEDED;
  done.text = "all 1 rank finished";
  assert_int_equal(pend_write(p, &done, NULL, NULL), 1);
  assert_true(pend_has_job(p, "j1"));
  assert_false(pend_has_job(p, "j2"));
  /* A write a client waits on is refused while others are kept. */
  pend_op_t cancel = run;
  cancel.to = DB_JOB_CANCELLED;
  assert_int_equal(pend_write_now(p, &cancel, NULL, NULL), TY_EUNAVAILABLE);
  assert_int_equal(pend_retry(p, true), 3);
  assert_int_equal(heard.n, 0);
  db_job_t *got = NULL;
  assert_int_equal(db_job_get(db, "j1", &got), 0);
  assert_int_equal(got->state, DB_JOB_STARTING);
  db_job_free(got);

  unlink(ctl);
  assert_int_equal(pend_retry(p, true), 0);
  assert_true(health_ok(health, why, sizeof why));
  assert_int_equal(heard.n, 3);
  assert_string_equal(heard.seen[0], "running:0");
  assert_string_equal(heard.seen[1], "exited:0");
  assert_string_equal(heard.seen[2], "succeeded:0");
  assert_int_equal(db_job_get(db, "j1", &got), 0);
  assert_int_equal(got->state, DB_JOB_SUCCEEDED);
  db_job_free(got);
  int live = -1;
  assert_int_equal(db_job_unfinished_ranks(db, "j1", &live), 0);
  assert_int_equal(live, 0);
  /* Now the cancel is refused by the job's state, not by the database. */
  int cur = -1;
  assert_int_equal(pend_write_now(p, &cancel, &cur, NULL), TY_EPRECONDITION);
  assert_int_equal(cur, DB_JOB_SUCCEEDED);
  pend_free(p);
  health_free(health);
  db_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kept_in_order_until_written),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
