/* progress.h - a job's progress, ETA and throughput, computed here and
 * nowhere else: the job views of REST and gRPC, the SSE and WatchJob
 * "progress" events, and through them the CLI and the web page, all show
 * these figures.
 *
 *   progress        0..1 of the phase the job is in (progress_phase):
 *                   "tokenizing", the bytes of the JSONL file tokenized
 *                   (while any rank tokenizes it);
 *                   "loading", the bytes loaded over all ranks' bytes to
 *                   load; "training", the slowest rank's steps done over
 *                   total_steps; "done" (succeeded) is 1; "" before any
 *                   rank reported
 *   eta_seconds     the steps left over the recent step rate (rank 0's last
 *                   PROGRESS_RECENT_STEPS steps); NaN (null) while unknown,
 *                   loading, or once the job has ended (0 when succeeded)
 *   tokens_per_s    the job's: the sum over its ranks that are training;
 *                   0 when none is (or the job has ended) */
#ifndef TY_SERVER_PROGRESS_H
#define TY_SERVER_PROGRESS_H

#include <stdint.h>

#include <jansson.h>

#define PROGRESS_RECENT_STEPS 20

/* One rank's last report (borrowed phase). */
typedef struct {
  const char *phase;
  int64_t step, total_steps;
  double tokens_per_s;
  int64_t bytes_loaded, bytes_total;
} progress_rank_t;

typedef struct {
  double progress;
  const char *phase; /* static string */
  double eta_seconds;
  double tokens_per_s;
} progress_t;

/* The figures of a job in state (db_job_state_t) with n ranks of its
 * newest attempt, and rank 0's recent steps: steps[i] done at t[i] (unix
 * seconds), oldest first, npts of them. */
void progress_compute(int state, const progress_rank_t *ranks, int n, const int64_t *steps,
                      const double *t, int npts, progress_t *out);

/* Sets "progress", "progress_phase", "eta_seconds" (null when unknown) and
 * "tokens_per_s" on o, each named prefix + field. */
void progress_to_json(const progress_t *p, const char *prefix, json_t *o);

#endif
