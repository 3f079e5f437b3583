/* test_worker_contract.c - the worker contract's two tables: the rank
 * environment (common/rankenv.h: what a launcher passes on, what a rank
 * reads) and the progress report (api/report_wire.h: one writer, one
 * parser). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/report_wire.h"
#include "common/rankenv.h"

static bool has(char **env, const char *kv) {
  for (; *env; env++)
    if (!strcmp(*env, kv)) return true;
  return false;
}

static bool names(char **env, const char *prefix) {
  for (; *env; env++)
    if (!strncmp(*env, prefix, strlen(prefix))) return true;
  return false;
}

static void test_names_are_the_contract(void **state) {
  (void)state;
  assert_string_equal(rankenv_name(RANKENV_SPEC), "TRAINYARD_SPEC");
  assert_string_equal(rankenv_name(RANKENV_WORLD_SIZE), "TRAINYARD_WORLD_SIZE");
  for (int i = 0; i < RANKENV_COUNT; i++) {
    assert_non_null(rankenv_meaning((rankenv_id_t)i));
    for (int j = i + 1; j < RANKENV_COUNT; j++)
      assert_string_not_equal(rankenv_name((rankenv_id_t)i), rankenv_name((rankenv_id_t)j));
  }
}

static void test_launcher_environments(void **state) {
  (void)state;
  char *base[] = {"PATH=/bin",
                  "TRAINYARD_RANK=7",
                  "TRAINYARD_THREADS=2",
                  "TRAINYARD_READ_ROOTS=/x",
                  "TRAINYARD_DB=/db",
                  "CUDA_VISIBLE_DEVICES=3",
                  NULL};
  rankenv_t e = {0};
  rankenv_set_long(&e, RANKENV_RANK, 1);
  rankenv_set(&e, RANKENV_SPEC, "/s.json");
  rankenv_set(&e, RANKENV_SPEC, NULL); /* unset again */
  rankenv_set(&e, RANKENV_MODE, "load");
  const char *extra[] = {"X=1", NULL};
  /* The CLI's: the caller's tuning passes, the launcher's own do not. */
  char **env = rankenv_envp(&e, base, RANKENV_INHERIT_TUNING, NULL, extra);
  assert_true(has(env, "PATH=/bin"));
  assert_true(has(env, "TRAINYARD_RANK=1"));
  assert_false(has(env, "TRAINYARD_RANK=7"));
  assert_true(has(env, "TRAINYARD_THREADS=2"));
  assert_false(names(env, "TRAINYARD_READ_ROOTS="));
  assert_false(names(env, "TRAINYARD_SPEC="));
  assert_true(has(env, "TRAINYARD_MODE=load"));
  assert_true(has(env, "X=1"));
  rankenv_envp_free(env);
  /* trainyardd's: none of its own TRAINYARD_ variables, and what it drops. */
  const char *drop[] = {"CUDA_VISIBLE_DEVICES=", NULL};
  env = rankenv_envp(&e, base, RANKENV_INHERIT_NONE, drop, NULL);
  assert_true(has(env, "PATH=/bin"));
  assert_true(has(env, "TRAINYARD_RANK=1"));
  assert_false(names(env, "TRAINYARD_THREADS="));
  assert_false(names(env, "TRAINYARD_DB="));
  assert_false(names(env, "CUDA_VISIBLE_DEVICES="));
  rankenv_envp_free(env);
  rankenv_clear(&e);
}

static void test_rank_reads_numbers(void **state) {
  (void)state;
  long v = -1;
  unsetenv("TRAINYARD_HEARTBEAT_MS");
  assert_int_equal(rankenv_long(RANKENV_HEARTBEAT_MS, &v, NULL, 0), 0);
  assert_int_equal(v, 15000); /* the table's default */
  setenv("TRAINYARD_HEARTBEAT_MS", "250", 1);
  assert_int_equal(rankenv_long(RANKENV_HEARTBEAT_MS, &v, NULL, 0), 0);
  assert_int_equal(v, 250);
  char err[256];
  setenv("TRAINYARD_RANK", "2", 1);
  assert_int_equal(rankenv_long_in(RANKENV_RANK, 0, 1, &v, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "TRAINYARD_RANK='2' is not a whole number in 0..1"));
  v = 42;
  unsetenv("TRAINYARD_THREADS"); /* no default in the table: the caller's stays */
  assert_int_equal(rankenv_long(RANKENV_THREADS, &v, NULL, 0), 0);
  assert_int_equal(v, 42);
  setenv("TRAINYARD_GLOO_HOST", "", 1);
  assert_null(rankenv_str(RANKENV_GLOO_HOST));
  unsetenv("TRAINYARD_HEARTBEAT_MS");
  unsetenv("TRAINYARD_RANK");
  unsetenv("TRAINYARD_GLOO_HOST");
}

/* A rank that srun started has no TRAINYARD_ rank of its own: it reads
 * Slurm's numbering, and an error names the variable it read; its own
 * variables win where both are set. */
static void test_rank_from_slurm(void **state) {
  (void)state;
  long rank = -1, world = -1;
  char err[256];
  unsetenv("TRAINYARD_RANK");
  unsetenv("TRAINYARD_WORLD_SIZE");
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  assert_int_equal(rankenv_long(RANKENV_WORLD_SIZE, &world, err, sizeof err), 0);
  assert_int_equal(world, 4);
  assert_int_equal(rankenv_long_in(RANKENV_RANK, 0, world - 1, &rank, err, sizeof err), 0);
  assert_int_equal(rank, 3);
  assert_string_equal(rankenv_str(RANKENV_RANK), "3");
  setenv("SLURM_PROCID", "4", 1);
  assert_int_equal(rankenv_long_in(RANKENV_RANK, 0, world - 1, &rank, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "SLURM_PROCID='4'"));
  setenv("TRAINYARD_RANK", "1", 1);
  setenv("TRAINYARD_WORLD_SIZE", "2", 1);
  assert_int_equal(rankenv_long(RANKENV_WORLD_SIZE, &world, err, sizeof err), 0);
  assert_int_equal(rankenv_long_in(RANKENV_RANK, 0, world - 1, &rank, err, sizeof err), 0);
  assert_int_equal(world, 2);
  assert_int_equal(rank, 1);
  /* Neither: the table's defaults, a single rank. */
  unsetenv("TRAINYARD_RANK");
  unsetenv("TRAINYARD_WORLD_SIZE");
  unsetenv("SLURM_PROCID");
  unsetenv("SLURM_NTASKS");
  assert_int_equal(rankenv_long(RANKENV_WORLD_SIZE, &world, err, sizeof err), 0);
  assert_int_equal(world, 1);
  assert_string_equal(rankenv_name(RANKENV_SLURM_NODE), "SLURM_NODEID");
  assert_string_equal(rankenv_name(RANKENV_SLURM_LOCAL_RANK), "SLURM_LOCALID");
}

/* A rank's GPU: its index on its node under Slurm (srun's SLURM_LOCALID),
 * else its rank, modulo the GPUs it sees. */
static void test_rank_gpu(void **state) {
  (void)state;
  char err[256];
  int gpu = -1;
  unsetenv("SLURM_LOCALID");
  assert_int_equal(rankenv_gpu(6, 4, &gpu, err, sizeof err), 0);
  assert_int_equal(gpu, 2);
  assert_int_equal(rankenv_gpu(6, 1, &gpu, err, sizeof err), 0);
  assert_int_equal(gpu, 0);
  /* Rank 6 as the second task of its node (srun's cyclic distribution
   * over several nodes): its node's GPU 1, whatever its rank. */
  setenv("SLURM_LOCALID", "1", 1);
  assert_int_equal(rankenv_gpu(6, 4, &gpu, err, sizeof err), 0);
  assert_int_equal(gpu, 1);
  /* srun bound one GPU to the task: it sees only that one. */
  assert_int_equal(rankenv_gpu(6, 1, &gpu, err, sizeof err), 0);
  assert_int_equal(gpu, 0);
  setenv("SLURM_LOCALID", "one", 1);
  assert_int_equal(rankenv_gpu(6, 4, &gpu, err, sizeof err), TY_EINVAL);
  assert_non_null(strstr(err, "SLURM_LOCALID"));
  unsetenv("SLURM_LOCALID");
}

static void test_report_round_trip(void **state) {
  (void)state;
  report_wire_t a, b;
  report_wire_init(&a);
  snprintf(a.job_id, sizeof a.job_id, "j1");
  a.attempt = 2, a.rank = 1, a.world_size = 4;
  a.phase = REPORT_PHASE_TRAINING;
  a.step = 5, a.total_steps = 9, a.loss = 2.5, a.tokens_per_s = INFINITY;
  a.bytes_loaded = 10, a.bytes_total = 20;
  snprintf(a.message, sizeof a.message, "hi");
  snprintf(a.sample_prompt, sizeof a.sample_prompt, "Once upon");
  snprintf(a.sample_text, sizeof a.sample_text, " a time \xC3\xA9");
  json_t *o = report_wire_json(&a);
  assert_non_null(o);
  assert_string_equal(json_string_value(json_object_get(o, "phase")), "training");
  assert_true(json_is_real(json_object_get(o, "tokens_per_s"))); /* unknown: 0 */
  ty_errlist_t errs = TY_ERRLIST_INIT;
  assert_int_equal(report_wire_parse(o, &b, &errs), 0);
  assert_int_equal(errs.len, 0);
  assert_string_equal(b.job_id, "j1");
  assert_int_equal(b.phase, REPORT_PHASE_TRAINING);
  assert_int_equal(b.step, 5);
  assert_true(b.loss == 2.5);
  assert_true(b.tokens_per_s == 0.0);
  assert_string_equal(b.message, "hi");
  assert_string_equal(b.sample_prompt, "Once upon");
  assert_string_equal(b.sample_text, " a time \xC3\xA9");
  assert_false(report_wire_progressed(&a, &b));
  b.step = 6;
  assert_true(report_wire_progressed(&a, &b));
  a.loss = NAN;
  json_decref(o);
  o = report_wire_json(&a);
  assert_true(json_is_null(json_object_get(o, "loss")));
  char *line = json_dumps(o, JSON_COMPACT);
  assert_true(report_wire_parse_line(line, &b));
  assert_true(isnan(b.loss));
  free(line);
  json_decref(o);
  ty_errlist_clear(&errs);
}

static void test_report_refusals(void **state) {
  (void)state;
  report_wire_t r;
  ty_errlist_t errs = TY_ERRLIST_INIT;
  json_t *o = json_pack("{s:i, s:i, s:s, s:i, s:s}", "attempt", 1, "rank", -1, "phase", "flying",
                        "step", 3, "loss", "low");
  assert_int_equal(report_wire_parse(o, &r, &errs), TY_EINVAL);
  /* rank out of range, world_size missing, phase unknown, loss not a number */
  assert_int_equal(errs.len, 4);
  json_decref(o);
  ty_errlist_clear(&errs);
  assert_false(report_wire_parse_line("[rank 0/1] train step 1/2", &r));
  assert_false(report_wire_parse_line("{\"phase\":\"done\"}", &r));
  assert_false(report_wire_parse_line("{not json", &r));
  report_phase_t p;
  assert_true(report_phase_parse("saving", &p));
  assert_int_equal(p, REPORT_PHASE_SAVING);
  assert_false(report_phase_parse(NULL, &p));
  assert_string_equal(report_phase_name(REPORT_PHASE_FAILED), "failed");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names_are_the_contract),
      cmocka_unit_test(test_launcher_environments),
      cmocka_unit_test(test_rank_reads_numbers),
      cmocka_unit_test(test_rank_from_slurm),
      cmocka_unit_test(test_rank_gpu),
      cmocka_unit_test(test_report_round_trip),
      cmocka_unit_test(test_report_refusals),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
