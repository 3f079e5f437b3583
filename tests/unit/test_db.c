/* test_db.c - the SQLite state: migrations, the one state-change function
 * with its events, idempotency keys, listing, reports and metrics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

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

static void insert(db_t *db, const char *id, const char *key, const char *spec, int rc_want) {
  db_job_t j = {0};
  snprintf(j.id, sizeof j.id, "%s", id);
  j.name = (char *)"t";
  j.spec = (char *)spec;
  j.idempotency_key = (char *)key;
  snprintf(j.token, sizeof j.token, "tok-%s", id);
  j.world_size = 2;
  snprintf(j.device, sizeof j.device, "cpu");
  db_job_t *existing = NULL;
  assert_int_equal(db_job_insert(db, &j, &existing), rc_want);
  if (rc_want == TY_EEXISTS) {
    assert_non_null(existing);
    assert_string_equal(existing->idempotency_key, key);
  }
  db_job_free(existing);
  free(j.reason); /* the only field insert allocates */
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
  insert(f->db, "j2", "k", "{\"a\":2}", TY_EEXISTS);
  db_job_t *j;
  assert_int_equal(db_job_get(f->db, "j2", &j), TY_ENOTFOUND);
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
      cmocka_unit_test_setup_teardown(test_list_pages_and_filters, setup, teardown),
      cmocka_unit_test(test_state_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
