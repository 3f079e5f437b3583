/* worker_load.h - RANKENV_MODE=load: a rank that only loads its shard
 * (checkpoint or from scratch, by the spec's path), reports its figures
 * and exits. It answers "will this checkpoint fit, and what will each rank
 * hold?" before a long job. */
#ifndef TY_WORKER_WORKER_LOAD_H
#define TY_WORKER_WORKER_LOAD_H

#include <stdint.h>

#include "api/jobspec.h"
#include "worker/ckpt/loader.h"
#include "worker/rank/worker_env.h"

/* Loads this rank's shard as spec says (init_from_scratch, or model_path by
 * the standard or the memory-efficient path), on the CPU placement. While
 * loading it reports phase "loading" at most once a second; at the end one
 * "done" report with bytes_loaded, bytes_total, host_peak_bytes,
 * device_peak_bytes and load_seconds (or one "failed" report with the
 * reason), through worker/rank/report.h (report_open must have been called).
 * Returns the process exit status (0, or 1 after a "failed" report). */
int wload_run(const jobspec_t *spec, const worker_env_t *who);

/* The whole of RANKENV_MODE=load: reads the environment and the spec
 * file (RANKENV_SPEC), then wload_run. Bad environment: exit status 2. */
int wload_main(void);

#endif
