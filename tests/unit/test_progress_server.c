/* test_progress_server.c - a job's progress, ETA and throughput
 * (server/progress.c) in each phase and state, and the per-rank series of
 * /metrics (server/prom_jobs.c): label values escaped, a rank without a
 * loss or a report left out of those families, HELP and TYPE always. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "db/db.h"
#include "server/progress.h"
#include "server/prom_jobs.h"

static void test_loading_by_bytes(void **state) {
  (void)state;
  progress_rank_t r[2] = {{"loading", 0, 100, 0, 30, 100}, {"loading", 0, 100, 0, 10, 100}};
  progress_t p;
  progress_compute(DB_JOB_RUNNING, r, 2, NULL, NULL, 0, &p);
  assert_string_equal(p.phase, "loading");
  assert_true(fabs(p.progress - 0.2) < 1e-12);
  assert_true(isnan(p.eta_seconds));
  assert_true(p.tokens_per_s == 0);
  /* Before any byte count: nothing known. */
  progress_rank_t s[1] = {{"starting", 0, 0, 0, 0, 0}};
  progress_compute(DB_JOB_STARTING, s, 1, NULL, NULL, 0, &p);
  assert_string_equal(p.phase, "");
  assert_true(p.progress == 0);
}

static void test_training_slowest_rank_and_eta(void **state) {
  (void)state;
  progress_rank_t r[2] = {{"training", 40, 100, 500, 0, 0}, {"training", 38, 100, 450, 0, 0}};
  /* Rank 0's recent steps: 10 steps in 5 s, 2 steps/s. */
  int64_t steps[3] = {30, 35, 40};
  double t[3] = {1000.0, 1002.5, 1005.0};
  progress_t p;
  progress_compute(DB_JOB_RUNNING, r, 2, steps, t, 3, &p);
  assert_string_equal(p.phase, "training");
  assert_true(fabs(p.progress - 0.38) < 1e-12);
  assert_true(fabs(p.eta_seconds - 31.0) < 1e-9); /* (100 - 38) / 2 */
  assert_true(p.tokens_per_s == 950);
  /* One point gives no rate. */
  progress_compute(DB_JOB_RUNNING, r, 2, steps, t, 1, &p);
  assert_true(isnan(p.eta_seconds));
  /* A rank still loading while another trains: training, from step 0. */
  progress_rank_t m[2] = {{"training", 5, 100, 100, 0, 0}, {"loading", 0, 100, 0, 5, 10}};
  progress_compute(DB_JOB_RUNNING, m, 2, NULL, NULL, 0, &p);
  assert_string_equal(p.phase, "training");
  assert_true(p.progress == 0);
  assert_true(p.tokens_per_s == 100);
}

static void test_ended_jobs(void **state) {
  (void)state;
  progress_rank_t r[1] = {{"training", 50, 100, 500, 0, 0}};
  int64_t steps[2] = {40, 50};
  double t[2] = {0, 10};
  progress_t p;
  progress_compute(DB_JOB_CANCELLED, r, 1, steps, t, 2, &p);
  assert_true(fabs(p.progress - 0.5) < 1e-12);
  assert_true(isnan(p.eta_seconds));
  assert_true(p.tokens_per_s == 0);
  progress_compute(DB_JOB_SUCCEEDED, r, 1, steps, t, 2, &p);
  assert_true(p.progress == 1 && p.eta_seconds == 0);
  assert_string_equal(p.phase, "done");
  progress_compute(DB_JOB_QUEUED, NULL, 0, NULL, NULL, 0, &p);
  assert_true(p.progress == 0 && isnan(p.eta_seconds));
  /* Every step done while still running: nothing left to wait for. */
  progress_rank_t d[1] = {{"saving", 100, 100, 500, 0, 0}};
  progress_compute(DB_JOB_RUNNING, d, 1, steps, t, 2, &p);
  assert_true(p.progress == 1 && p.eta_seconds == 0);
}

static void test_progress_json(void **state) {
  (void)state;
  progress_t p = {0.25, "training", NAN, 12.5};
  json_t *o = json_object();
  progress_to_json(&p, "job_", o);
  assert_true(json_real_value(json_object_get(o, "job_progress")) == 0.25);
  assert_string_equal(json_string_value(json_object_get(o, "job_progress_phase")), "training");
  assert_true(json_is_null(json_object_get(o, "job_eta_seconds")));
  assert_true(json_real_value(json_object_get(o, "job_tokens_per_s")) == 12.5);
  json_decref(o);
}

static void test_label_escape(void **state) {
  (void)state;
  char out[64];
  assert_int_equal(prom_label_escape("a\"b\\c\nd", out, sizeof out), 10);
  assert_string_equal(out, "a\\\"b\\\\c\\nd");
  /* Too small a buffer: cut before an escape is split. */
  char small[4];
  prom_label_escape("ab\"c", small, sizeof small);
  assert_string_equal(small, "ab");
}

static void test_series_text(void **state) {
  (void)state;
  db_rank_figures_t r[2];
  memset(r, 0, sizeof r);
  snprintf(r[0].job_id, sizeof r[0].job_id, "j1");
  snprintf(r[0].name, sizeof r[0].name, "we\"ird");
  r[0].rank = 0, r[0].step = 7, r[0].loss = 2.5, r[0].tokens_per_s = 100;
  r[0].host_peak_bytes = 1 << 20, r[0].last_report_at = 990;
  r[1] = r[0];
  r[1].rank = 1, r[1].loss = NAN, r[1].last_report_at = 0;
  char *t = prom_jobs_text(r, 2, 1000);
  assert_non_null(strstr(t, "# TYPE trainyard_job_rank_step gauge\n"));
  assert_non_null(
      strstr(t, "trainyard_job_rank_step{job_id=\"j1\",name=\"we\\\"ird\",rank=\"1\"} 7\n"));
  assert_non_null(
      strstr(t, "trainyard_job_rank_loss{job_id=\"j1\",name=\"we\\\"ird\",rank=\"0\"} 2.5\n"));
  assert_null(strstr(t, "trainyard_job_rank_loss{job_id=\"j1\",name=\"we\\\"ird\",rank=\"1\"}"));
  assert_non_null(strstr(
      t,
      "trainyard_job_rank_seconds_since_report{job_id=\"j1\",name=\"we\\\"ird\",rank=\"0\"} 10\n"));
  assert_null(strstr(t, "seconds_since_report{job_id=\"j1\",name=\"we\\\"ird\",rank=\"1\"}"));
  free(t);
  t = prom_jobs_text(NULL, 0, 0);
  assert_non_null(strstr(t, "# HELP trainyard_job_rank_loss "));
  assert_null(strstr(t, "{"));
  free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_loading_by_bytes), cmocka_unit_test(test_training_slowest_rank_and_eta),
      cmocka_unit_test(test_ended_jobs),       cmocka_unit_test(test_progress_json),
      cmocka_unit_test(test_label_escape),     cmocka_unit_test(test_series_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
