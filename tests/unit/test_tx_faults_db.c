/* test_tx_faults_db.c - the open-transaction audit of db/: after SQLITE_FULL,
 * SQLITE_IOERR or an interrupted statement SQLite may or may not have rolled
 * back the transaction (sqlite3_get_autocommit tells). For every write of
 * the database layer, a fault is swept over each of its statement steps
 * ("N interrupt once": a write's transaction rolled back, a read's left
 * open) and each of its file writes ("N full once", "N ioerr once"); after
 * each call no transaction is left open, what was acknowledged is stored,
 * and once the fault is gone the next writes work. Also: a database whose
 * schema version is current but which lacks a table is refused at open,
 * naming it; nothing is acknowledged into a deleted database file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "db/db.h"
#include "tmpdir_testutil.h"

static char g_ctl[300];

static void arm(const char *text) {
  char tmp[320];
  snprintf(tmp, sizeof tmp, "%s.new", g_ctl);
  FILE *f = fopen(tmp, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  assert_int_equal(rename(tmp, g_ctl), 0); /* a new inode: the count starts again */
  char p[340];
  snprintf(p, sizeof p, "%s.hits", g_ctl);
  unlink(p);
}

static bool hit(void) {
  char p[340];
  snprintf(p, sizeof p, "%s.hits", g_ctl);
  return access(p, F_OK) == 0;
}

static void disarm(void) { unlink(g_ctl); }

static int insert(db_t *db, const char *id) {
  db_job_t j = {0};
  snprintf(j.id, sizeof j.id, "%s", id);
  j.name = (char *)"t";
  j.spec = (char *)"{}";
  snprintf(j.token, sizeof j.token, "tok-%s", id);
  j.world_size = 2;
  snprintf(j.device, sizeof j.device, "cpu");
  j.max_restarts = 3;
  db_job_t *existing = NULL;
  int rc = db_job_insert(db, &j, &existing);
  db_job_free(existing);
  free(j.reason);
  return rc;
}

static int state_of(db_t *db, const char *id) {
  db_job_t *j = NULL;
  if (db_job_get(db, id, &j)) return -1;
  int s = j->state;
  db_job_free(j);
  return s;
}

static db_report_t report(int attempt, int rank, int step) {
  db_report_t r;
  memset(&r, 0, sizeof r);
  r.attempt = attempt, r.rank = rank, r.world_size = 2;
  snprintf(r.phase, sizeof r.phase, "training");
  r.step = step, r.total_steps = 1000, r.loss = 1.0 / step, r.tokens_per_s = 10;
  return r;
}

/* Steps of rank 0 stored for job id, attempt 1. */
static size_t metric_steps(db_t *db, const char *id, bool *seen, size_t max) {
  json_t *m = NULL;
  assert_int_equal(db_metrics_json(db, id, 1, &m), 0);
  size_t n = 0, i;
  json_t *rk;
  json_array_foreach(json_object_get(m, "ranks"), i, rk) {
    if (json_integer_value(json_object_get(rk, "rank")) != 0) continue;
    size_t k;
    json_t *s;
    json_array_foreach(json_object_get(rk, "steps"), k, s) {
      json_int_t v = json_integer_value(s);
      if (v >= 0 && (size_t)v < max) seen[v] = true;
      n++;
    }
  }
  json_decref(m);
  return n;
}

typedef struct {
  db_t *db;
  char id[32];
  int n; /* the sweep position, for names */
} ctx_t;

/* One write path: does its write with the fault armed; returns its rc.
 * prepare (optional) puts the job where the write applies, without faults. */
typedef struct {
  const char *name;
  void (*prepare)(ctx_t *c);
  int (*write)(ctx_t *c);
  /* after the fault is gone: whether what write acknowledged (rc 0) is
   * stored, and a write of the same kind works */
  void (*check)(ctx_t *c, int rc);
} path_t;

static void prep_queued(ctx_t *c) { assert_int_equal(insert(c->db, c->id), 0); }
static void prep_running(ctx_t *c) {
  prep_queued(c);
  assert_int_equal(db_job_transition(c->db, c->id, DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING,
                                     "go", NULL, NULL),
                   0);
  assert_int_equal(db_rank_spawned(c->db, c->id, 1, 0, 4242, 7, "/tmp/r0.log"), 0);
  assert_int_equal(db_rank_spawned(c->db, c->id, 1, 1, 4243, 7, "/tmp/r1.log"), 0);
  assert_int_equal(db_job_transition(c->db, c->id, DB_MASK(DB_JOB_STARTING), DB_JOB_RUNNING,
                                     "rank 0 reported", NULL, NULL),
                   0);
}
static void prep_ended(ctx_t *c) {
  prep_running(c);
  assert_int_equal(db_job_transition(c->db, c->id, DB_MASK_ACTIVE, DB_JOB_FAILED, "boom", NULL,
                                     NULL),
                   0);
  for (int r = 0; r < 2; r++)
    assert_int_equal(db_rank_finished(c->db, c->id, 1, r, "failed", 1, "boom"), 0);
}

static int w_insert(ctx_t *c) { return insert(c->db, c->id); }
static void k_insert(ctx_t *c, int rc) {
  assert_int_equal(state_of(c->db, c->id), rc ? -1 : DB_JOB_QUEUED);
  if (rc) assert_int_equal(insert(c->db, c->id), 0);
}

static int w_start(ctx_t *c) {
  return db_job_transition(c->db, c->id, DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, "go", NULL,
                           NULL);
}
static void k_start(ctx_t *c, int rc) {
  assert_int_equal(state_of(c->db, c->id), rc ? DB_JOB_QUEUED : DB_JOB_STARTING);
  if (rc) assert_int_equal(w_start(c), 0);
  json_t *r = NULL;
  assert_int_equal(db_ranks_json(c->db, c->id, 1, &r), 0);
  assert_int_equal(json_array_size(json_object_get(r, "ranks")), 2); /* the attempt is whole */
  json_decref(r);
}

static int w_spawned(ctx_t *c) {
  return db_rank_spawned(c->db, c->id, 1, 0, 999, 5, "/tmp/x.log");
}
static void k_spawned(ctx_t *c, int rc) {
  char *log = NULL;
  if (rc) assert_int_equal(w_spawned(c), 0);
  assert_int_equal(db_rank_log_path(c->db, c->id, 1, 0, &log), 0);
  assert_string_equal(log, "/tmp/x.log");
  free(log);
}

static int w_finished(ctx_t *c) {
  return db_rank_finished(c->db, c->id, 1, 0, "exited", 0, "");
}
static void k_finished(ctx_t *c, int rc) {
  if (rc) assert_int_equal(w_finished(c), 0);
  int n = -1;
  assert_int_equal(db_job_unfinished_ranks(c->db, c->id, &n), 0);
  assert_int_equal(n, 1);
}

static int w_end(ctx_t *c) {
  return db_job_transition(c->db, c->id, DB_MASK_ACTIVE, DB_JOB_SUCCEEDED, "all done", NULL,
                           NULL);
}
static void k_end(ctx_t *c, int rc) {
  if (rc) assert_int_equal(w_end(c), 0);
  assert_int_equal(state_of(c->db, c->id), DB_JOB_SUCCEEDED);
}

static int w_reason(ctx_t *c) {
  return db_job_set_reason(c->db, c->id, DB_MASK(DB_JOB_RUNNING), "all 2 ranks training");
}
static void k_reason(ctx_t *c, int rc) {
  if (rc) assert_int_equal(w_reason(c), 0);
  db_job_t *j = NULL;
  assert_int_equal(db_job_get(c->db, c->id, &j), 0);
  assert_string_equal(j->reason, "all 2 ranks training");
  assert_int_equal(j->state, DB_JOB_RUNNING);
  db_job_free(j);
}

static int w_preempted(ctx_t *c) { return db_attempt_set_preempted(c->db, c->id, 1); }
static void k_preempted(ctx_t *c, int rc) {
  if (rc) assert_int_equal(w_preempted(c), 0);
  int n = 0;
  assert_int_equal(db_job_preemptions(c->db, c->id, &n), 0);
  assert_int_equal(n, 1);
}

static int w_delete(ctx_t *c) {
  db_job_t *j = NULL;
  int rc = db_job_delete(c->db, c->id, &j);
  db_job_free(j);
  return rc;
}
static void k_delete(ctx_t *c, int rc) {
  if (rc) assert_int_equal(w_delete(c), 0);
  assert_int_equal(state_of(c->db, c->id), -1);
}

/* Reports of a running job: 40 steps of rank 0, a batch committed along
 * the way by db_flush; every report answered 0 (stored or kept) is
 * stored once the fault is gone, none twice, none missing. */
static int w_reports(ctx_t *c) {
  int bad = 0;
  for (int s = 1; s <= 40; s++) {
    db_report_t r = report(1, 0, s);
    int rc = db_report_ingest(c->db, c->id, &r, NULL);
    if (rc) bad = rc; /* a refusal is the rank's to keep: it sends it again */
    if (rc) {
      disarm();
      assert_int_equal(db_report_ingest(c->db, c->id, &r, NULL), 0);
    }
    if (s % 10 == 0) (void)db_flush(c->db);
  }
  return bad;
}
static void k_reports(ctx_t *c, int rc) {
  (void)rc;
  /* A state change writes the kept reports before itself, in order. */
  assert_int_equal(w_end(c), 0);
  assert_int_equal(db_kept_reports(c->db), 0);
  bool seen[64] = {false};
  assert_int_equal(metric_steps(c->db, c->id, seen, 64), 40);
  for (int s = 1; s <= 40; s++) assert_true(seen[s]);
}

static const path_t g_paths[] = {
    {"insert", NULL, w_insert, k_insert},
    {"transition to starting (opens an attempt)", prep_queued, w_start, k_start},
    {"rank spawned", prep_running, w_spawned, k_spawned},
    {"rank finished", prep_running, w_finished, k_finished},
    {"transition to an end (closes the attempt)", prep_running, w_end, k_end},
    {"reason set", prep_running, w_reason, k_reason},
    {"attempt preempted", prep_ended, w_preempted, k_preempted},
    {"delete", prep_ended, w_delete, k_delete},
    {"reports (group commit)", prep_running, w_reports, k_reports},
};

static void sweep(const char *kind) {
  char path[300], msg[1024];
  snprintf(path, sizeof path, "%s/%s.db", g_dir, kind);
  snprintf(g_ctl, sizeof g_ctl, "%s/faults", g_dir); /* one for the process: the VFS reads the first it is given */
  setenv("TRAINYARD_TEST_DB_FAULTS", g_ctl, 1);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  int total = 0;
  for (size_t p = 0; p < sizeof g_paths / sizeof g_paths[0]; p++) {
    const path_t *pa = &g_paths[p];
    int n;
    for (n = 1; n < 400; n++) {
      ctx_t c = {.db = db, .n = n};
      snprintf(c.id, sizeof c.id, "%s-%zu-%d", kind, p, n);
      disarm();
      if (pa->prepare) pa->prepare(&c);
      char text[64];
      snprintf(text, sizeof text, "%d %s once\n", n, kind);
      arm(text);
      int rc = pa->write(&c);
      bool was_hit = hit();
      disarm();
      if (db_in_transaction(db))
        fail_msg("%s: a %s at step/write %d left a transaction open (rc %d)", pa->name, kind, n,
                 rc);
      if (rc != 0 && rc != TY_EUNAVAILABLE)
        fail_msg("%s: a %s at step/write %d: rc %d", pa->name, kind, n, rc);
      pa->check(&c, rc);
      assert_false(db_in_transaction(db));
      if (!was_hit) break; /* n is past the path's last step or write */
      total++;
    }
    assert_true(n > 1); /* the path was swept */
  }
  /* Reopened: everything acknowledged is there (a fresh job works too). */
  db_close(db);
  unsetenv("TRAINYARD_TEST_DB_FAULTS");
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  assert_int_equal(insert(db, "after-reopen"), 0);
  db_close(db);
  print_message("# %s: %d fault positions over %zu write paths\n", kind, total,
                sizeof g_paths / sizeof g_paths[0]);
}

static void test_interrupted_statements(void **state) {
  (void)state;
  sweep("interrupt");
}
static void test_disk_full(void **state) {
  (void)state;
  sweep("full");
}
static void test_io_error(void **state) {
  (void)state;
  sweep("ioerr");
}

/* A batch whose statement is interrupted mid-way loses its transaction
 * (SQLite rolls a write's back): the reports already answered 0 are kept
 * and written, and the next state change is written, not refused. */
static void test_batch_rolled_back_by_sqlite(void **state) {
  (void)state;
  char path[300], msg[1024];
  snprintf(path, sizeof path, "%s/batch.db", g_dir);
  snprintf(g_ctl, sizeof g_ctl, "%s/faults", g_dir);
  setenv("TRAINYARD_TEST_DB_FAULTS", g_ctl, 1);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  ctx_t c = {.db = db};
  snprintf(c.id, sizeof c.id, "batch");
  prep_running(&c);
  db_report_t r = report(1, 0, 1);
  assert_int_equal(db_report_ingest(db, c.id, &r, NULL), 0); /* opens the batch */
  arm("3 interrupt once\n"); /* the second report's UPDATE: a write */
  r = report(1, 0, 2);
  assert_int_equal(db_report_ingest(db, c.id, &r, NULL), 0);
  assert_true(hit());
  disarm();
  assert_false(db_in_transaction(db));
  r = report(1, 0, 3);
  assert_int_equal(db_report_ingest(db, c.id, &r, NULL), 0);
  assert_int_equal(db_rank_finished(db, c.id, 1, 0, "exited", 0, ""), 0);
  bool seen[8] = {false};
  assert_int_equal(metric_steps(db, c.id, seen, 8), 3);
  assert_true(seen[1] && seen[2] && seen[3]);
  assert_false(db_write_failing(db, NULL, 0));
  db_close(db);
  unsetenv("TRAINYARD_TEST_DB_FAULTS");
}

static void test_missing_table_is_refused(void **state) {
  (void)state;
  char path[300], msg[1024];
  const char *drops[][2] = {{"DROP TABLE metrics", "table 'metrics'"},
                            {"DROP INDEX events_by_job", "index 'events_by_job'"},
                            {"ALTER TABLE jobs DROP COLUMN output_dir", "column 'jobs.output_dir'"}};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/schema%d.db", g_dir, i);
    db_t *db = NULL;
    assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
    assert_int_equal(insert(db, "kept"), 0);
    db_close(db);
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    if (i == 2) sqlite3_exec(raw, "DROP INDEX jobs_unfinished_by_output", NULL, NULL, NULL);
    assert_int_equal(sqlite3_exec(raw, drops[i][0], NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    assert_int_equal(db_open(path, &db, msg, sizeof msg), TY_EDATALOSS);
    assert_null(db);
    char want[64];
    snprintf(want, sizeof want, "schema version is %d (current)", db_schema_version());
    assert_non_null(strstr(msg, want));
    if (!strstr(msg, drops[i][1])) fail_msg("%s: message does not name %s", msg, drops[i][1]);
  }
}

static void test_nothing_acknowledged_into_a_deleted_file(void **state) {
  (void)state;
  char path[300], msg[1024], why[1024];
  snprintf(path, sizeof path, "%s/deleted.db", g_dir);
  db_t *db = NULL;
  assert_int_equal(db_open(path, &db, msg, sizeof msg), 0);
  assert_int_equal(insert(db, "before"), 0);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(insert(db, "after-delete"), TY_EUNAVAILABLE);
  assert_true(db_write_failing(db, why, sizeof why));
  assert_non_null(strstr(why, "was deleted or replaced"));
  assert_false(db_in_transaction(db));
  db_report_t r = report(1, 0, 1); /* a report too is not committed into it */
  (void)db_report_ingest(db, "before", &r, NULL);
  db_close(db);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_batch_rolled_back_by_sqlite),
      cmocka_unit_test(test_interrupted_statements),
      cmocka_unit_test(test_disk_full),
      cmocka_unit_test(test_io_error),
      cmocka_unit_test(test_missing_table_is_refused),
      cmocka_unit_test(test_nothing_acknowledged_into_a_deleted_file),
  };
  return cmocka_run_group_tests(tests, tmpdir_setup, tmpdir_teardown);
}
