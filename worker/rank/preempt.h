/* preempt.h - a rank asked to stop (SIGTERM: a cancel with grace, Slurm's
 * --signal before a time limit, a preemption) finishes the step it is in;
 * at the step boundary all ranks agree (one all-reduce of a flag), write a
 * checkpoint together and exit with RANKPROC_EXIT_PREEMPTED, which
 * trainyardd records as preempted: the attempt is resubmitted and resumes
 * from that checkpoint without counting against max_restarts. */
#ifndef TY_WORKER_RANK_PREEMPT_H
#define TY_WORKER_RANK_PREEMPT_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/dist/comm.h"

/* Installs the SIGTERM handler, as the training rank starts. Until the
 * first step boundary (preempt_at_step's first call: while the rank
 * tokenizes, loads, or takes its first step) there is nothing newer than
 * the last checkpoint to keep, so SIGTERM ends the rank at once with
 * RANKPROC_EXIT_PREEMPTED (a preemption during a long load is no failure);
 * from then on it asks for the stop at the next boundary. */
void preempt_install(void);

/* Called at each step boundary by every rank (installing the handler
 * where preempt_install was not called). *stop is true on every rank when
 * any rank has received SIGTERM. 0, or the collective's error with err. */
int preempt_at_step(comm_t *comm, bool *stop, char *err, size_t errlen);

#endif
