/* report.h - a rank's progress reports (DESIGN.md "Progress" and "Worker
 * contract"). Each report goes as one JSON object by HTTP POST to
 * RANKENV_REPORT_URL with "Authorization: Bearer <RANKENV_TOKEN>", or,
 * when RANKENV_REPORT_URL is unset, as one JSON line on stdout; the same
 * report is also written to stderr as the human-readable line:
 *   [rank 1/2] load  512.0/1024.0 MiB  host-peak 70 MiB
 *   [rank 1/2] train step 40/200 loss 2.314  1530 tok/s  host-peak 212 MiB
 *
 * Sent to a server, the last report is also sent again every
 * RANKENV_HEARTBEAT_MS (worker_env_t.heartbeat_ms) while no other report
 * goes, from a thread of the reporter's own: a load or a step longer than
 * the server's heartbeat_timeout is not taken for a dead rank. A repeat is
 * not written to stderr. A report that does not get through (trainyardd
 * restarting, a network fault) is kept, up to 4096 of them, and sent in
 * order before any newer one once the server answers again (by the next
 * report or the heartbeat, 256 at a time), so that the job's curves have
 * no gap; the server answering that the attempt is over drops them.
 *
 * One reporter per process (a rank is one process); report_send from one
 * thread. */
#ifndef TY_WORKER_REPORT_H
#define TY_WORKER_REPORT_H

#include <stdint.h>

#include "api/report_wire.h"
#include "worker/rank/worker_env.h"

/* One report, written as api/report_wire.h says. job_id, attempt, rank and
 * world_size come from the rank given to report_open. loss is NaN while
 * unknown (sent as null). message (may be NULL) says why, for "failed". */
typedef struct {
  report_phase_t phase;
  int64_t step, total_steps;
  double loss;
  double tokens_per_s;
  int64_t bytes_loaded, bytes_total;
  int64_t host_peak_bytes, device_peak_bytes;
  double load_seconds;
  const char *message;
  /* A sample of train.sample_prompts at step (NULL or "": none): sent to
   * the server, which keeps it as a "sample" event, and never repeated by
   * the heartbeat, which resends the last report without a sample. */
  const char *sample_prompt, *sample_text;
  /* train.objective dpo, phase training: the step's metrics
   * [REPORT_DPO_N] (api/report_wire.h); NULL otherwise. */
  const double *dpo;
} report_t;

/* Reports as the rank e (worker_env_read's: job id, attempt, rank, world
 * size, heartbeat), to RANKENV_REPORT_URL with RANKENV_TOKEN from the
 * environment. Returns 0, or TY_EUNAVAILABLE when libcurl or the heartbeat's
 * thread cannot be set up. Calling it again starts over. */
int report_open(const worker_env_t *e);

/* Sends one report. Returns 0; TY_EPRECONDITION when the server answered
 * that this attempt is over (the rank should stop); TY_EUNAVAILABLE when the
 * server could not be reached or refused the report (the rank may go on:
 * reports are heartbeats and the next one may pass). Never blocks more than
 * a few seconds. */
int report_send(const report_t *r);

/* Stops the heartbeat and releases what report_open holds. */
void report_close(void);

#endif
