/* recovery.h - what trainyardd does at start with the state a previous
 * instance left (after kill -9, a crash or a power loss): no job stays in a
 * non-final state it can never leave, and no rank of a previous instance
 * keeps running unwatched. */
#ifndef TY_SERVER_RECOVERY_H
#define TY_SERVER_RECOVERY_H

#include <stddef.h>
#include <stdint.h>

#include "server/config.h"

typedef struct svc svc_t;
typedef struct dispatcher dispatcher_t;

/* Before the scheduler starts: every rank whose end is not recorded, of any
 * job (a cancelled or failed one whose ranks were still stopping included),
 * that is still alive (as disp, the engine that started it, finds it) gets
 * SIGTERM, then SIGKILL after the grace period; every such rank is recorded
 * as stopped, with the reason, which ends the job's event streams and lets
 * it be deleted. Each job left starting or running is queued again while
 * its max_restarts allows, else failed, each change an event with its
 * reason; attempts left open are closed. What the dead attempts left is
 * removed: their /dev/shm segments (of jobs this database knows), NCCL
 * rendezvous files and unfinished checkpoints (checkpoints/step-N.tmp,
 * where no other run holds the output folder). Queued jobs stay queued.
 * Returns the number of jobs left starting or running that were reconciled,
 * or a TY_E* code. */
/* An attempt whose ranks an engine that queues attempts itself (Slurm)
 * still runs: recovery leaves it be, and the scheduler watches it again
 * (sched_adopt). */
typedef struct {
  char id[64];
  int attempt;
  int pid; /* where its ranks run, as the engine recorded it */
  int64_t start;
} recovery_adopt_t;

/* With an engine that can take over a run (dispatcher_ops_t.adopt), the
 * attempts it still runs are left running and listed in *adopt (n entries;
 * the caller frees the array; NULL when none) instead. */
int recovery_run(svc_t *svc, const srv_config_t *cfg, dispatcher_t *disp, recovery_adopt_t **adopt,
                 size_t *nadopt);

/* The checkpoints an attempt's ranks left unfinished in output_dir
 * (checkpoints/step-N.tmp, a rank killed while writing one) removed, each
 * said in the log for job id. The caller holds the folder's lock
 * (ty_dir_lock): no rank of another run writes there. */
void recovery_remove_unfinished(const char *output_dir, const char *id);

#endif
