/* job_progress.h - the CLI's words for a job's progress figures, as the
 * server computes them (server/progress.h): list's PROGRESS column and
 * watch's job line. */
#ifndef TY_CLI_JOB_PROGRESS_H
#define TY_CLI_JOB_PROGRESS_H

#include <stddef.h>

#include <jansson.h>

/* "training 45%  eta 1m23s  2000 tok/s", from o's <prefix>progress,
 * <prefix>progress_phase, <prefix>eta_seconds and <prefix>tokens_per_s
 * (prefix "" for a job, "job_" for a progress event); "-" when o has no
 * phase. The ETA and the rate are left out while unknown or 0. */
void cli_progress_text(const json_t *o, const char *prefix, char *out, size_t size);

#endif
