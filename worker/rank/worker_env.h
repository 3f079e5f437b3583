/* worker_env.h - what a rank is told: the worker contract's environment
 * (DESIGN.md "Worker contract") and the job's normalized spec, read the
 * same way by every mode (train, load) and by the reporter. */
#ifndef TY_WORKER_WORKER_ENV_H
#define TY_WORKER_WORKER_ENV_H

#include <stddef.h>

#include "api/jobspec.h"
#include "worker/ckpt/ckpt_q4.h"

/* What the environment says about this rank. */
typedef struct {
  const char *spec_path; /* RANKENV_SPEC */
  const char *job_id;    /* RANKENV_JOB_ID, default "local" */
  int attempt;           /* RANKENV_ATTEMPT, default 1 */
  int rank, world_size;  /* RANKENV_RANK, RANKENV_WORLD_SIZE */
  long heartbeat_ms;     /* RANKENV_HEARTBEAT_MS: the last report is sent
                          * again after this long without one (0: never);
                          * default 15000 */
} worker_env_t;

/* Reads the environment into e (RANKENV_SPEC as it is: each mode says
 * what its absence means) and checks the pool's RANKENV_THREADS; 0, or
 * TY_EINVAL with the variable at fault, its value and its range in err. */
int worker_env_read(worker_env_t *e, char *err, size_t errlen);

/* Reads and validates the normalized spec at path into s. */
int worker_read_spec(const char *path, jobspec_t *s, char *err, size_t errlen);

/* The 4 bits of a QLoRA spec (quantization.*), as the worker's modules
 * take them. */
ckpt_q4_kind_t worker_q4_kind(const jobspec_t *s);

/* loader_q4_t's mean over a comm_t (ctx): every rank's absmax of the
 * tensor gathered in rank order, so every rank, whatever the world size,
 * computes the same float (q4_mean). A collective. */
int worker_q4_mean(void *ctx, int64_t numel, const float *absmax, size_t nb, float *out, char *err,
                   size_t errlen);

#endif
