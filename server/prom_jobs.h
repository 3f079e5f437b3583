/* prom_jobs.h - the per-job, per-rank series of trainyardd's /metrics
 * (Prometheus text exposition format 0.0.4): for each rank of the newest
 * attempt of every job in starting or running, labelled job_id, name and
 * rank; a job that ends leaves the next scrape. */
#ifndef TY_SERVER_PROM_JOBS_H
#define TY_SERVER_PROM_JOBS_H

#include <stddef.h>

#include "db/db_obs.h"

/* in as a label value: '\\' -> "\\\\", '"' -> "\\\"", newline -> "\\n",
 * into out (cap bytes, always terminated; truncated when short). Returns
 * the length written. */
size_t prom_label_escape(const char *in, char *out, size_t cap);

/* The series of n ranks (HELP and TYPE lines for every family, even with
 * no rank), at unix time now: a new string, the caller's. */
char *prom_jobs_text(const db_rank_figures_t *ranks, size_t n, double now);

#endif
