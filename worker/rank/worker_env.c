/* worker_env.c - the rank's environment and spec (worker_env.h). */
#include "worker/rank/worker_env.h"
#include "worker/ckpt/loader.h"
#include "worker/dist/comm.h"
#include "common/xalloc.h"

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

/* Double quantization's tensor-wide mean of the absmax (loader.h):
 * every rank's gathered, in rank order, so every rank (and every world
 * size) computes the same float. */
int worker_q4_mean(void *ctx, int64_t numel, const float *absmax, size_t nb, float *out, char *err,
                   size_t errlen) {
  comm_t *comm = ctx;
  const int world = comm_world_size(comm);
  size_t *counts = xcalloc((size_t)world, sizeof *counts), all = 0;
  for (int r = 0; r < world; r++) {
    loader_q4_piece_t p;
    loader_q4_piece(numel, r, world, true, &p);
    counts[r] = p.nblocks;
    all += p.nblocks;
  }
  int rc = counts[comm_rank(comm)] == nb ? 0 : TY_EINTERNAL;
  float *every = rc ? NULL : malloc((all ? all : 1) * sizeof *every);
  if (rc)
    ty_errf(err, errlen, rc, "4-bit load: this rank has %zu blocks, its piece %zu", nb,
            counts[comm_rank(comm)]);
  else if (!every)
    rc = ty_errf(err, errlen, TY_EEXHAUSTED, "cannot allocate %zu absmax floats", all);
  else if ((rc = comm_all_gather(comm, absmax, every, counts)))
    ty_errf(err, errlen, rc, "gathering the absmax statistics: %s", comm_error(comm));
  else
    *out = q4_mean(every, all);
  free(every);
  free(counts);
  return rc;
}
