/* worker_env.c - the rank's environment and spec (worker_env.h). */
#include "worker/rank/worker_env.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "common/rankenv.h"
#include "worker/model/cpu_pool.h"

int worker_env_read(worker_env_t *e, char *err, size_t errlen) {
  e->spec_path = getenv(rankenv_name(RANKENV_SPEC));
  e->job_id = rankenv_str(RANKENV_JOB_ID);
  if (!e->job_id) e->job_id = "local";
  long attempt = 1, world = 1, rank = 0, threads;
  int rc = rankenv_long(RANKENV_ATTEMPT, &attempt, err, errlen);
  if (!rc) rc = rankenv_long(RANKENV_WORLD_SIZE, &world, err, errlen);
  if (!rc) rc = rankenv_long_in(RANKENV_RANK, 0, world - 1, &rank, err, errlen);
  if (!rc) rc = rankenv_long(RANKENV_HEARTBEAT_MS, &e->heartbeat_ms, err, errlen);
  if (!rc) rc = pool_threads_env(&threads, err, errlen);
  e->attempt = (int)attempt, e->world_size = (int)world, e->rank = (int)rank;
  return rc;
}

int worker_read_spec(const char *path, jobspec_t *s, char *err, size_t errlen) {
  ty_errlist_t errs = TY_ERRLIST_INIT;
  jobspec_init(s);
  int rc = jobspec_parse_file(s, path, &errs);
  if (!rc) rc = jobspec_validate(s, false, &errs);
  const char *field = errs.len ? errs.items[0].field : "";
  if (rc)
    snprintf(err, errlen, "spec %s: %s%s%s", path, field, field[0] ? ": " : "",
             errs.len ? errs.items[0].message : "invalid");
  ty_errlist_clear(&errs);
  return rc;
}

ckpt_q4_kind_t worker_q4_kind(const jobspec_t *s) {
  return (ckpt_q4_kind_t){
      .type = s->quantization.bnb_4bit_quant_type == JOBSPEC_QUANT_FP4 ? Q4_FP4 : Q4_NF4,
      .double_quant = s->quantization.bnb_4bit_use_double_quant,
      .compute = s->quantization.bnb_4bit_compute_dtype};
}
