/* db_obs.h - what observability reads of the ranks: each live rank's last
 * report (for /metrics and the jobs' progress) and a rank's recent step
 * times (for the ETA). Values are copies, the caller's. */
#ifndef TY_DB_DB_OBS_H
#define TY_DB_DB_OBS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/report_wire.h"
#include "db/db.h"

#define DB_NAME_MAX 128

/* One rank of a job's newest attempt, as its last report left it. */
typedef struct {
  char job_id[DB_ID_MAX];
  char name[DB_NAME_MAX]; /* the job's */
  int state;              /* the job's (db_job_state_t) */
  int attempt, rank;
  char phase[16];
  int64_t step, total_steps;
  double loss; /* NaN when none yet */
  double tokens_per_s;
  int64_t bytes_loaded, bytes_total, host_peak_bytes, device_peak_bytes;
  double last_report_at; /* unix seconds; 0 before the first report */
  bool finished;         /* its process's end is recorded */
} db_rank_figures_t;

/* The ranks of the newest attempt of job id (any state), or with id NULL
 * of every job in starting or running, ordered by job (oldest first) and
 * rank. *out is the caller's (free()); none: *out NULL, *n 0. */
int db_rank_figures(db_t *db, const char *id, db_rank_figures_t **out, size_t *n);

/* The last (at most max) metric points of a rank of an attempt, oldest
 * first: steps[i] at t[i] (unix seconds). *n receives the count. */
int db_recent_steps(db_t *db, const char *id, int attempt, int rank, int max, int64_t *steps,
                    double *t, int *n);

/* One metrics point of a rank (a training step). */
typedef struct {
  int rank;
  int64_t step;
  double loss; /* NaN when the report had none */
  double tokens_per_s;
  double t;                 /* unix seconds */
  double dpo[REPORT_DPO_N]; /* train.objective dpo's metrics; NaN when none */
} db_metric_point_t;

/* The metric points of attempt (the newest when <= 0; *attempt_out says
 * which) of job id whose step is in [from_step, to_step], ordered by rank
 * and step. *out is the caller's (free()). TY_ENOTFOUND for no such job. */
int db_metric_points(db_t *db, const char *id, int attempt, int64_t from_step, int64_t to_step,
                     int *attempt_out, db_metric_point_t **out, size_t *n);

#endif
