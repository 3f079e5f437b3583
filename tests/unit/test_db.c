/* test_db.c - the SQLite state: migrations, the one state-change function
 * with its events, idempotency keys, listing, reports and metrics, and
 * deleting a finished job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "db/db.h"

typedef struct {
  char dir[64];
  char path[128];
  db_t *db;
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/ty-test-db-XXXXXX");
  if (!mkdtemp(f->dir)) return -1;
  snprintf(f->path, sizeof f->path, "%s/sub/state.db", f->dir);
  char msg[256];
  if (db_open(f->path, &f->db, msg, sizeof msg)) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  db_close(f->db);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system(cmd)) return -1;
  free(f);
  return 0;
}

/* Inserts job id (spec text, idempotency key and output folder may be
 * NULL) expecting rc_want; holder: the job db_job_insert names when it
 * refuses (the key's, or the folder's). A refused job is not stored. */
static void insert_job(db_t *db, const char *id, const char *key, const char *spec,
                       const char *out, int rc_want, const char *holder) {
  db_job_t j = {0};
  snprintf(j.id, sizeof j.id, "%s", id);
  j.name = (char *)"t";
  j.spec = (char *)(spec ? spec : "{}");
  j.idempotency_key = (char *)key;
  j.output_dir = (char *)out;
  snprintf(j.token, sizeof j.token, "tok-%s", id);
  j.world_size = 2;
  snprintf(j.device, sizeof j.device, "cpu");
  db_job_t *existing = NULL;
  assert_int_equal(db_job_insert(db, &j, &existing), rc_want);
  if (holder) {
    assert_non_null(existing);
    assert_string_equal(existing->id, holder);
  }
  db_job_free(existing);
  free(j.reason); /* the only field insert allocates */
  db_job_t *got = NULL;
  assert_int_equal(db_job_get(db, id, &got), rc_want ? TY_ENOTFOUND : 0);
  if (!rc_want) assert_string_equal(got->output_dir, out ? out : "");
  db_job_free(got);
}

static void insert(db_t *db, const char *id, const char *key, const char *spec, int rc_want) {
  insert_job(db, id, key, spec, NULL, rc_want, NULL);
}

static void test_reopen_keeps_schema_and_rows(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", NULL, "{}", 0);
  db_close(f->db);
  char msg[256];
  assert_int_equal(db_open(f->path, &f->db, msg, sizeof msg), 0);
  db_job_t *j;
  assert_int_equal(db_job_get(f->db, "j1", &j), 0);
  assert_int_equal(j->state, DB_JOB_QUEUED);
  assert_string_equal(j->token, "tok-j1");
  db_job_free(j);
  assert_int_equal(db_job_get(f->db, "nope", &j), TY_ENOTFOUND);
}

static void test_transitions_write_events_and_attempts(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", NULL, "{}", 0);
  int cur, attempt;
  /* A transition from the wrong state changes nothing. */
  assert_int_equal(db_job_transition(f->db, "j1", DB_MASK(DB_JOB_RUNNING), DB_JOB_FAILED, "x",
                                     &cur, NULL),
                   TY_EPRECONDITION);
  assert_int_equal(cur, DB_JOB_QUEUED);
  assert_int_equal(db_job_transition(f->db, "j1", DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING,
                                     "slots free", &cur, &attempt),
                   0);
  assert_int_equal(attempt, 1);
  json_t *ranks;
  assert_int_equal(db_ranks_json(f->db, "j1", 0, &ranks), 0);
  assert_int_equal(json_array_size(json_object_get(ranks, "ranks")), 2);
  json_decref(ranks);

  db_report_t r = {.attempt = 1, .rank = 1, .world_size = 2, .phase = "training", .step = 3,
                   .total_steps = 10, .loss = 2.5};
  bool progressed;
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  assert_true(progressed);
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  assert_false(progressed); /* a heartbeat: no new event */
  r.step = 4;
  r.loss = NAN;
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  r.rank = 7;
  assert_int_equal(db_report_ingest(f->db, "j1", &r, NULL), TY_ENOTFOUND);

  json_t *m;
  assert_int_equal(db_metrics_json(f->db, "j1", 0, &m), 0);
  json_t *series = json_array_get(json_object_get(m, "ranks"), 0);
  assert_int_equal(json_integer_value(json_object_get(series, "rank")), 1);
  assert_int_equal(json_array_size(json_object_get(series, "steps")), 2);
  assert_true(json_is_null(json_array_get(json_object_get(series, "loss"), 1)));
  json_decref(m);

  assert_int_equal(db_job_transition(f->db, "j1", DB_MASK_ACTIVE, DB_JOB_FAILED,
                                     "rank 1 failed: boom", NULL, NULL),
                   0);
  db_job_t *j;
  assert_int_equal(db_job_get(f->db, "j1", &j), 0);
  assert_int_equal(j->state, DB_JOB_FAILED);
  assert_string_equal(j->reason, "rank 1 failed: boom");
  assert_true(j->finished_at > 0);
  db_job_free(j);

  json_t *ev;
  int64_t last;
  assert_int_equal(db_events_json(f->db, "j1", 0, 100, &ev, &last), 0);
  /* created, starting, progress step 3, progress step 4, failed */
  assert_int_equal(json_array_size(ev), 5);
  json_t *fin = json_array_get(ev, 4);
  assert_string_equal(json_string_value(json_object_get(fin, "type")), "state");
  assert_string_equal(json_string_value(json_object_get(json_object_get(fin, "data"), "reason")),
                      "rank 1 failed: boom");
  json_decref(ev);
  /* Resuming after the last seq gives nothing more. */
  assert_int_equal(db_events_json(f->db, "j1", last, 100, &ev, &last), 0);
  assert_int_equal(json_array_size(ev), 0);
  json_decref(ev);
}

/* A report carrying a sample (train.sample_prompts) becomes a "sample"
 * event even at a step already reported; without one, no event. */
static void test_sample_reports_are_events(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", NULL, "{}", 0);
  assert_int_equal(db_job_transition(f->db, "j1", DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, "go",
                                     NULL, NULL),
                   0);
  db_report_t r = {.attempt = 1, .rank = 0, .world_size = 2, .phase = "training", .step = 2,
                   .total_steps = 4, .loss = 1.5};
  bool progressed;
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  snprintf(r.sample_prompt, sizeof r.sample_prompt, "Once upon");
  snprintf(r.sample_text, sizeof r.sample_text, " a time");
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  assert_true(progressed);
  r.sample_prompt[0] = r.sample_text[0] = '\0';
  assert_int_equal(db_report_ingest(f->db, "j1", &r, &progressed), 0);
  assert_false(progressed);
  json_t *ev;
  int64_t last;
  assert_int_equal(db_events_json(f->db, "j1", 0, 100, &ev, &last), 0);
  /* created, starting, progress step 2, the sample */
  assert_int_equal(json_array_size(ev), 4);
  json_t *smp = json_array_get(ev, 3), *d = json_object_get(smp, "data");
  assert_string_equal(json_string_value(json_object_get(smp, "type")), "sample");
  assert_int_equal(json_integer_value(json_object_get(d, "step")), 2);
  assert_int_equal(json_integer_value(json_object_get(d, "rank")), 0);
  assert_string_equal(json_string_value(json_object_get(d, "prompt")), "Once upon");
  assert_string_equal(json_string_value(json_object_get(d, "text")), " a time");
  json_decref(ev);
}

/* Reports are group-committed; closing the database commits them. */
static void test_batched_reports_survive_close(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", NULL, "{}", 0);
  assert_int_equal(db_job_transition(f->db, "j1", DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, "go",
                                     NULL, NULL),
                   0);
  for (int step = 1; step <= 5; step++) {
    db_report_t r = {.attempt = 1, .rank = 0, .world_size = 2, .phase = "training",
                     .step = step, .total_steps = 5, .loss = 1.0};
    assert_int_equal(db_report_ingest(f->db, "j1", &r, NULL), 0);
  }
  db_close(f->db);
  char msg[256];
  assert_int_equal(db_open(f->path, &f->db, msg, sizeof msg), 0);
  json_t *m;
  assert_int_equal(db_metrics_json(f->db, "j1", 0, &m), 0);
  json_t *series = json_array_get(json_object_get(m, "ranks"), 0);
  assert_int_equal(json_array_size(json_object_get(series, "steps")), 5);
  json_decref(m);
}

static void test_idempotency_key_is_unique(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", "k", "{\"a\":1}", 0);
  insert_job(f->db, "j2", "k", "{\"a\":2}", NULL, TY_EEXISTS, "j1");
  db_job_t *j;
  assert_int_equal(db_job_get(f->db, "j2", &j), TY_ENOTFOUND);
}

static void insert_out(db_t *db, const char *id, const char *out, int rc_want,
                       const char *holder) {
  insert_job(db, id, NULL, NULL, out, rc_want, holder);
}

static void test_output_dir_held_until_finished(void **state) {
  fixture_t *f = *state;
  insert_out(f->db, "a1", "/runs/a", 0, NULL);
  insert_out(f->db, "a2", "/runs/a", TY_EPRECONDITION, "a1");
  insert_out(f->db, "b1", "/runs/a/b", 0, NULL); /* another folder */
  insert_out(f->db, "n1", "", 0, NULL);          /* none kept: never a conflict */
  insert_out(f->db, "n2", NULL, 0, NULL);
  db_job_t *u = NULL;
  assert_int_equal(db_job_output_user(f->db, "/runs/a", &u), 0);
  assert_string_equal(u->id, "a1");
  db_job_free(u);
  assert_int_equal(db_job_output_user(f->db, "/runs/none", &u), TY_ENOTFOUND);
  assert_null(u);
  /* Held while queued, starting and running; free once the job ends. */
  assert_int_equal(db_job_transition(f->db, "a1", DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING,
                                     "spawned", NULL, NULL),
                   0);
  insert_out(f->db, "a2", "/runs/a", TY_EPRECONDITION, "a1");
  assert_int_equal(db_job_transition(f->db, "a1", DB_MASK(DB_JOB_STARTING), DB_JOB_RUNNING,
                                     "running", NULL, NULL),
                   0);
  insert_out(f->db, "a2", "/runs/a", TY_EPRECONDITION, "a1");
  assert_int_equal(db_job_transition(f->db, "a1", DB_MASK(DB_JOB_RUNNING), DB_JOB_FAILED,
                                     "rank 0 failed", NULL, NULL),
                   0);
  insert_out(f->db, "a2", "/runs/a", 0, NULL);
  /* An Idempotency-Key replay names its own job, not a conflict. */
  insert_job(f->db, "k1", "key", NULL, "/runs/k", 0, NULL);
  insert_job(f->db, "k2", "key", NULL, "/runs/k", TY_EEXISTS, "k1");
}

/* A database of schema version 1 (before output folders were kept) gets
 * them from its jobs' specs, so its unfinished jobs still hold theirs. */
static void test_migration_keeps_output_dirs(void **state) {
  fixture_t *f = *state;
  db_close(f->db);
  f->db = NULL;
  sqlite3 *c;
  assert_int_equal(sqlite3_open(f->path, &c), SQLITE_OK);
  const char *v1 =
      "DROP INDEX jobs_unfinished_by_output;"
      "ALTER TABLE jobs DROP COLUMN output_dir;"
      "ALTER TABLE metrics DROP COLUMN rewards_chosen;"
      "ALTER TABLE metrics DROP COLUMN rewards_rejected;"
      "ALTER TABLE metrics DROP COLUMN rewards_accuracies;"
      "ALTER TABLE metrics DROP COLUMN rewards_margins;"
      "ALTER TABLE metrics DROP COLUMN logps_chosen;"
      "ALTER TABLE metrics DROP COLUMN logps_rejected;"
      "INSERT INTO jobs(id, name, state, spec, token, world_size, device, created_at,"
      " updated_at) VALUES"
      " ('old', 'o', 'running', '{\"output_dir\": \"/runs/old\"}', 't', 1, 'cpu', 0, 0),"
      " ('done', 'd', 'succeeded', '{\"output_dir\": \"/runs/done\"}', 't', 1, 'cpu', 0, 0);"
      "PRAGMA user_version = 1;";
  char *err = NULL;
  assert_int_equal(sqlite3_exec(c, v1, NULL, NULL, &err), SQLITE_OK);
  sqlite3_close(c);
  char msg[256];
  assert_int_equal(db_open(f->path, &f->db, msg, sizeof msg), 0);
  insert_out(f->db, "new", "/runs/old", TY_EPRECONDITION, "old");
  insert_out(f->db, "new", "/runs/done", 0, NULL);
  db_job_t *j = NULL;
  assert_int_equal(db_job_get(f->db, "old", &j), 0);
  assert_string_equal(j->output_dir, "/runs/old");
  db_job_free(j);
}

/* One open at a time: a second open (of any process) is refused, naming the
 * holder, and loses nothing; once the first closes, the database opens. */
static void test_second_open_is_refused(void **state) {
  fixture_t *f = *state;
  insert(f->db, "kept", NULL, "{}", 0);
  db_t *other = NULL;
  char msg[512], want[64];
  assert_int_equal(db_open(f->path, &other, msg, sizeof msg), TY_EPRECONDITION);
  assert_null(other);
  snprintf(want, sizeof want, "in use by another trainyardd (pid %ld, ", (long)getpid());
  assert_non_null(strstr(msg, want));
  assert_non_null(strstr(msg, "give this one another --db"));
  db_job_t *j = NULL;
  assert_int_equal(db_job_get(f->db, "kept", &j), 0);
  db_job_free(j);
  db_close(f->db);
  f->db = NULL;
  assert_int_equal(db_open(f->path, &f->db, msg, sizeof msg), 0);
  assert_int_equal(db_job_get(f->db, "kept", &j), 0);
  db_job_free(j);
}

static void test_list_pages_and_filters(void **state) {
  fixture_t *f = *state;
  char id[16];
  for (int i = 0; i < 7; i++) {
    snprintf(id, sizeof id, "j%d", i);
    insert(f->db, id, NULL, "{}", 0);
  }
  assert_int_equal(db_job_transition(f->db, "j3", DB_MASK(DB_JOB_QUEUED), DB_JOB_CANCELLED,
                                     "cancelled by a client", NULL, NULL),
                   0);
  db_job_t **jobs;
  size_t n;
  assert_int_equal(db_job_list(f->db, 0, 0, 3, &jobs, &n), 0);
  assert_int_equal(n, 3);
  assert_string_equal(jobs[0]->id, "j6");
  int64_t next = jobs[2]->seq;
  db_jobs_free(jobs, n);
  assert_int_equal(db_job_list(f->db, 0, next, 10, &jobs, &n), 0);
  assert_int_equal(n, 4);
  assert_string_equal(jobs[0]->id, "j3");
  db_jobs_free(jobs, n);
  assert_int_equal(db_job_list(f->db, DB_MASK(DB_JOB_CANCELLED), 0, 10, &jobs, &n), 0);
  assert_int_equal(n, 1);
  db_jobs_free(jobs, n);
  assert_int_equal(db_job_list_fifo(f->db, DB_MASK(DB_JOB_QUEUED), 0, 10, &jobs, &n), 0);
  assert_int_equal(n, 6);
  assert_string_equal(jobs[0]->id, "j0");
  db_jobs_free(jobs, n);
  int64_t counts[DB_JOB_STATE_COUNT];
  assert_int_equal(db_job_count_by_state(f->db, counts), 0);
  assert_int_equal(counts[DB_JOB_QUEUED], 6);
  assert_int_equal(counts[DB_JOB_CANCELLED], 1);
}

/* Rows of table whose job_id is id (the test reads the file directly). */
static int rows_of(const char *path, const char *table, const char *id) {
  sqlite3 *c;
  assert_int_equal(sqlite3_open_v2(path, &c, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  char sql[128];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM %s WHERE job_id = ?", table);
  sqlite3_stmt *st;
  assert_int_equal(sqlite3_prepare_v2(c, sql, -1, &st, NULL), SQLITE_OK);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(st), SQLITE_ROW);
  int n = sqlite3_column_int(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(c);
  return n;
}

/* Only a finished job whose ranks have all ended is deleted; then every row
 * of it goes, its key is free again, and other jobs keep theirs. */
static void test_delete_only_finished(void **state) {
  fixture_t *f = *state;
  insert(f->db, "j1", "key-1", "{}", 0);
  insert(f->db, "j2", NULL, "{}", 0);
  db_job_t *j = NULL;
  assert_int_equal(db_job_delete(f->db, "nope", &j), TY_ENOTFOUND);
  assert_null(j);
  assert_int_equal(db_job_delete(f->db, "j1", &j), TY_EPRECONDITION);
  assert_int_equal(j->state, DB_JOB_QUEUED);
  db_job_free(j);
  for (const char *id = "j1"; id; id = strcmp(id, "j1") ? NULL : "j2") {
    assert_int_equal(
        db_job_transition(f->db, id, DB_MASK(DB_JOB_QUEUED), DB_JOB_STARTING, "go", NULL, NULL), 0);
    for (int r = 0; r < 2; r++)
      assert_int_equal(db_rank_spawned(f->db, id, 1, r, 100 + r, 7, "l"), 0);
    db_report_t rep = {.attempt = 1,
                       .rank = 0,
                       .world_size = 2,
                       .phase = "training",
                       .step = 1,
                       .total_steps = 2,
                       .loss = 1.0};
    assert_int_equal(db_report_ingest(f->db, id, &rep, NULL), 0);
    assert_int_equal(
        db_job_transition(f->db, id, DB_MASK_ACTIVE, DB_JOB_CANCELLED, "stop", NULL, NULL), 0);
  }
  /* Cancelled, but rank 1 has not been seen to end: not yet. */
  assert_int_equal(db_rank_finished(f->db, "j1", 1, 0, "stopped", 143, "x"), 0);
  assert_int_equal(db_job_delete(f->db, "j1", &j), TY_EUNAVAILABLE);
  assert_int_equal(j->state, DB_JOB_CANCELLED);
  db_job_free(j);
  assert_int_equal(db_rank_finished(f->db, "j1", 1, 1, "stopped", 143, "x"), 0);
  assert_int_equal(db_job_delete(f->db, "j1", &j), 0);
  assert_string_equal(j->id, "j1");
  assert_string_equal(j->reason, "stop");
  db_job_free(j);
  db_flush(f->db);
  const char *tables[] = {"attempts", "ranks", "metrics", "events"};
  for (int t = 0; t < 4; t++) {
    assert_int_equal(rows_of(f->path, tables[t], "j1"), 0);
    assert_true(rows_of(f->path, tables[t], "j2") > 0);
  }
  assert_int_equal(db_job_get(f->db, "j1", &j), TY_ENOTFOUND);
  assert_int_equal(db_job_delete(f->db, "j1", &j), TY_ENOTFOUND);
  insert(f->db, "j3", "key-1", "{}", 0); /* the key is free again */
}

static void test_state_names(void **state) {
  (void)state;
  assert_string_equal(db_state_name(DB_JOB_RUNNING), "running");
  assert_int_equal(db_state_parse("cancelled"), DB_JOB_CANCELLED);
  assert_int_equal(db_state_parse("bogus"), -1);
  assert_null(db_state_name(99));
  assert_true(db_state_final(DB_JOB_SUCCEEDED));
  assert_false(db_state_final(DB_JOB_QUEUED));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reopen_keeps_schema_and_rows, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transitions_write_events_and_attempts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_idempotency_key_is_unique, setup, teardown),
      cmocka_unit_test_setup_teardown(test_batched_reports_survive_close, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sample_reports_are_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_list_pages_and_filters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_output_dir_held_until_finished, setup, teardown),
      cmocka_unit_test_setup_teardown(test_migration_keeps_output_dirs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_second_open_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_delete_only_finished, setup, teardown),
      cmocka_unit_test(test_state_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
