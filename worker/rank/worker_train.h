/* worker_train.h - RANKENV_MODE=train: one rank of a training job, from
 * the worker contract's environment (DESIGN.md "Worker contract") to the
 * job's outputs. */
#ifndef TY_WORKER_WORKER_TRAIN_H
#define TY_WORKER_WORKER_TRAIN_H

#include <stdint.h>

#include "api/jobspec.h"
#include "worker/rank/worker_env.h"

/* Runs the rank: loads or initialises the model, trains, writes the
 * outputs (rank 0), reporting every phase. Returns the process exit status:
 * 0 on success, 1 after a "failed" report naming the reason. */
int worker_train_main(const worker_env_t *e);

#endif
