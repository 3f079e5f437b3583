/* worker_train.h - TRAINYARD_MODE=train: one rank of a training job, from
 * the worker contract's environment (DESIGN.md "Worker contract") to the
 * job's outputs. */
#ifndef TY_WORKER_WORKER_TRAIN_H
#define TY_WORKER_WORKER_TRAIN_H

#include <stdint.h>

#include "api/jobspec.h"

/* What the environment says about this rank. */
typedef struct {
  const char *spec_path; /* TRAINYARD_SPEC */
  const char *job_id;    /* TRAINYARD_JOB_ID, default "local" */
  int attempt;           /* TRAINYARD_ATTEMPT, default 1 */
  int rank, world_size;  /* TRAINYARD_RANK, TRAINYARD_WORLD_SIZE */
} worker_env_t;

/* Reads the environment into e; 0, or TY_EINVAL with the variable at fault
 * in err. */
int worker_env_read(worker_env_t *e, char *err, size_t errlen);

/* Reads and validates the normalized spec at path into s. */
int worker_read_spec(const char *path, jobspec_t *s, char *err, size_t errlen);

/* Runs the rank: loads or initialises the model, trains, writes the
 * outputs (rank 0), reporting every phase. Returns the process exit status:
 * 0 on success, 1 after a "failed" report naming the reason. */
int worker_train_main(const worker_env_t *e);

#endif
