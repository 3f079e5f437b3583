/* dispatcher.h - how trainyardd runs an attempt's ranks: an engine behind
 * a small interface, so that the scheduler does not know where ranks run.
 * The engine built in is the local one (server/dispatch.c: one
 * trainyard-worker process per rank on this host, in its own process
 * group); another (a cluster's batch system, such as Slurm) is a second
 * dispatcher_ops_t beside it. Every engine gives each rank the worker
 * contract's environment (common/rankenv.h) and hands the scheduler the
 * reports a rank prints (api/report_wire.h); reports POSTed to the server
 * reach it through the service. */
#ifndef TY_SERVER_DISPATCHER_H
#define TY_SERVER_DISPATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/config.h"

typedef struct dispatcher dispatcher_t;
/* One attempt's ranks, as an engine started them (engine-owned). */
typedef struct dispatch_run dispatch_run_t;

/* What one attempt's ranks are told (all borrowed but line_ctx). */
typedef struct {
  const char *worker;           /* program to run */
  const char *spec_path;        /* the normalized spec, as a file */
  const char *job_id;           /* the job's id */
  int attempt;                  /* from 1 */
  int world_size;               /* ranks */
  const char *rendezvous;       /* where they meet */
  const char *report_url;       /* where they POST reports */
  const char *token;            /* the job's token */
  const int *gpus;              /* world_size entries: the GPU of each rank, or -1 */
  const char *const *log_paths; /* world_size entries: where each rank's output goes */
  int64_t log_max;              /* bytes of output kept per rank */
  int64_t gpu_mem_limit_mib;    /* device memory a GPU rank may allocate; 0: no cap */
  int heartbeat_ms;             /* how often a rank repeats its last report while busy */
  /* For an engine that places ranks on other hosts (the local one reads
   * none of these): */
  const char *job_name;      /* the spec's name */
  const char *dir;           /* the attempt's folder (shared with the nodes) */
  int nodes, ranks_per_node; /* resources: world_size = nodes x ranks_per_node */
  bool cuda;                 /* GPU ranks: a GPU each */
  int64_t mem_mib_per_rank;  /* host memory a rank holds at least (the memory rules); 0: unknown */
  int grace_s;               /* seconds between SIGTERM and SIGKILL */
  /* Called (from an engine's thread) with each line a rank prints that
   * starts with '{' (a report; see DESIGN.md "Worker contract"),
   * NUL-terminated, without its newline; may be NULL. line_ctx is taken
   * over: freed with free() once the run is released, or when start fails
   * before any rank started. */
  void (*on_line)(void *ctx, int rank, const char *line);
  void *line_ctx;
} dispatch_attempt_t;

typedef struct {
  const char *name; /* "local" */
  /* Starts the attempt's ranks, in rank order. *run is set whenever at
   * least one rank started (*started says how many); returns 0 when all
   * did, else a TY_E* code with msg saying why rank *started could not. */
  int (*start)(dispatcher_t *d, const dispatch_attempt_t *a, dispatch_run_t **run, int *started,
               char *msg, size_t msgsz);
  /* Where rank i runs, as the database records it for recovery. */
  void (*where)(const dispatch_run_t *run, int rank, int *pid, int64_t *start_ticks);
  /* Sends sig (SIGTERM to stop, SIGKILL to end) to rank i and everything
   * it started. */
  void (*signal)(dispatch_run_t *run, int rank, int sig);
  /* Whether rank i has ended, without blocking; its wait status in
   * *status (exit status, or killed by a signal). Asked once it said so,
   * it says so again. */
  bool (*ended)(dispatch_run_t *run, int rank, int *status);
  /* After every rank ended: ends whatever they left running. */
  void (*clear)(dispatch_run_t *run);
  /* Waits for the engine's threads of the run (a rank's output still
   * being copied) and frees it; NULL is fine. */
  void (*release)(dispatch_run_t *run);
  /* Engines that queue attempts themselves (a batch system): the
   * scheduler counts no slots of its own for them, and a rank still queued
   * there is not timed out for its silence. false for the local engine. */
  bool queues;
  /* Whether the run is still waiting for its resources (NULL: never). */
  bool (*waiting)(dispatch_run_t *run);
  /* Why the engine saw rank i end, when it knows more than the wait
   * status (a time limit, a failed node, ...), into buf; false where it
   * has nothing to add. NULL: never. */
  bool (*why)(dispatch_run_t *run, int rank, char *buf, size_t size);
  /* Takes over a run an earlier trainyardd started and the engine still
   * runs (as `where` recorded it: pid, start_ticks), of world ranks; NULL
   * where it cannot. NULL op: runs are never taken over (the local
   * engine's ranks die with their watcher's pipes). */
  dispatch_run_t *(*adopt)(dispatcher_t *d, int pid, int64_t start_ticks, int world);
  /* Recovery of ranks an earlier trainyardd started (as `where` said):
   * whether one still runs, and a signal to it and all it started. */
  bool (*recorded_alive)(dispatcher_t *d, int pid, int64_t start_ticks);
  void (*recorded_signal)(dispatcher_t *d, int pid, int64_t start_ticks, int sig);
} dispatcher_ops_t;

struct dispatcher {
  const dispatcher_ops_t *ops;
  void *impl; /* the engine's own state */
};

/* The local engine (server/dispatch.c); it has no state of its own. */
extern dispatcher_t dispatch_local;

/* The Slurm engine (server/dispatch_slurm.c): each attempt one batch job
 * (sbatch), srun starting its ranks on the allocated nodes; cfg (a
 * srv_config_t, borrowed for the engine's life) gives the sbatch options.
 * A rank's `where` is the batch job's id as pid, with start_ticks
 * DISPATCH_SLURM_TICKS. */
#define DISPATCH_SLURM_TICKS (-2)
void dispatch_slurm_init(dispatcher_t *d, const srv_config_t *cfg);

#endif
