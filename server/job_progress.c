/* job_progress.c - the service's side of server/progress.h: a job's
 * figures read from its ranks, in the job views and in each "progress"
 * event; see service.h (svc_job_view, svc_report_progress). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/jobspec.h"
#include "common/dtype.h"
#include "db/db_obs.h"
#include "server/progress.h"
#include "server/service.h"

/* The progress of job id in state, from its ranks' rows, with report r
 * (optional) in place of its rank's row. */
static void compute(svc_t *s, const char *id, int state, const db_report_t *r, progress_t *out) {
  db_rank_figures_t *f = NULL;
  size_t n = 0;
  if (db_rank_figures(svc_db(s), id, &f, &n)) n = 0;
  progress_rank_t *pr = calloc(n ? n : 1, sizeof *pr);
  int attempt = 0;
  for (size_t i = 0; pr && i < n; i++) {
    attempt = f[i].attempt;
    pr[i] = (progress_rank_t){.phase = f[i].phase,
                              .step = f[i].step,
                              .total_steps = f[i].total_steps,
                              .tokens_per_s = f[i].tokens_per_s,
                              .bytes_loaded = f[i].bytes_loaded,
                              .bytes_total = f[i].bytes_total};
    if (r && r->rank == f[i].rank && r->attempt == f[i].attempt)
      pr[i] = (progress_rank_t){.phase = r->phase,
                                .step = r->step,
                                .total_steps = r->total_steps,
                                .tokens_per_s = r->tokens_per_s,
                                .bytes_loaded = r->bytes_loaded,
                                .bytes_total = r->bytes_total};
  }
  int64_t steps[PROGRESS_RECENT_STEPS];
  double t[PROGRESS_RECENT_STEPS];
  int npts = 0;
  if (n && db_recent_steps(svc_db(s), id, attempt, 0, PROGRESS_RECENT_STEPS, steps, t, &npts))
    npts = 0;
  progress_compute(state, pr, pr ? (int)n : 0, steps, t, npts, out);
  free(pr);
  free(f);
}

/* The base model's size, which the page draws the ranks' memory against:
 * its parameters and their bytes in the job's dtype (left out where the
 * count cannot be known: a config.json gone). */
static void model_size_to_json(const db_job_t *j, json_t *o) {
  jobspec_t spec;
  jobspec_init(&spec);
  ty_errlist_t errs = TY_ERRLIST_INIT;
  int64_t n = jobspec_parse_json(&spec, j->spec, strlen(j->spec), &errs) == 0 && !errs.len
                  ? jobspec_param_count(&spec)
                  : 0;
  ty_errlist_clear(&errs);
  if (n <= 0) return;
  json_object_set_new(o, "param_count", json_integer(n));
  json_object_set_new(o, "model_bytes", json_integer(n * (int64_t)ty_dtype_size(spec.dtype)));
}

json_t *svc_job_view(svc_t *s, const db_job_t *j) {
  json_t *o = svc_job_json(j);
  model_size_to_json(j, o);
  progress_t p;
  compute(s, j->id, j->state, NULL, &p);
  progress_to_json(&p, "", o);
  return o;
}

void svc_report_progress(svc_t *s, const char *id, int state, db_report_t *r) {
  progress_t p;
  compute(s, id, state, r, &p);
  r->has_job_progress = true;
  r->job_progress = p.progress;
  r->job_eta_seconds = p.eta_seconds;
  r->job_tokens_per_s = p.tokens_per_s;
  snprintf(r->job_progress_phase, sizeof r->job_progress_phase, "%s", p.phase);
}
