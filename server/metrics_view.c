/* metrics_view.c - GET /v1/jobs/{id}/metrics: an attempt's curves over a
 * step range, thinned per rank to at most max_points (server/thin.h); see
 * service.h (svc_metrics_range). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/xalloc.h"
#include "db/db_obs.h"
#include "server/service.h"
#include "server/thin.h"

/* One rank's run of points p[0..n) as its JSON series, thinned. */
static json_t *rank_series(const db_metric_point_t *p, size_t n, int64_t max_points) {
  double *y = xmalloc((n ? n : 1) * sizeof *y);
  size_t *keep = xmalloc((n ? n : 1) * sizeof *keep);
  for (size_t i = 0; i < n; i++) y[i] = p[i].loss;
  size_t k = max_points > 0 ? thin_pick(y, n, (size_t)max_points, keep) : n;
  if (max_points <= 0)
    for (size_t i = 0; i < n; i++) keep[i] = i;
  json_t *o = json_pack("{s:i, s:I, s:[], s:[], s:[], s:[]}", "rank", p[0].rank, "points",
                        (json_int_t)n, "steps", "loss", "tokens_per_s", "t");
  json_t *steps = json_object_get(o, "steps"), *loss = json_object_get(o, "loss"),
         *tps = json_object_get(o, "tokens_per_s"), *t = json_object_get(o, "t");
  /* train.objective dpo: its metrics, one series each under "dpo", where
   * any point has them. */
  bool dpo = false;
  for (size_t i = 0; i < n && !dpo; i++) dpo = isfinite(p[i].dpo[REPORT_DPO_rewards_margins]);
  json_t *series[REPORT_DPO_N] = {0};
  if (dpo) {
    json_t *d = json_object();
    for (int m = 0; m < REPORT_DPO_N; m++)
      json_object_set_new(d, report_dpo_names[m], series[m] = json_array());
    json_object_set_new(o, "dpo", d);
  }
  for (size_t j = 0; j < k; j++) {
    const db_metric_point_t *q = &p[keep[j]];
    json_array_append_new(steps, json_integer(q->step));
    json_array_append_new(loss, isfinite(q->loss) ? json_real(q->loss) : json_null());
    json_array_append_new(tps, json_real(q->tokens_per_s));
    json_array_append_new(t, json_real(q->t));
    for (int m = 0; dpo && m < REPORT_DPO_N; m++)
      json_array_append_new(series[m], isfinite(q->dpo[m]) ? json_real(q->dpo[m]) : json_null());
  }
  free(y);
  free(keep);
  return o;
}

int svc_metrics_range(svc_t *s, const char *id, int attempt, int64_t from_step, int64_t to_step,
                      int64_t max_points, json_t **out, char *msg, size_t msgsz) {
  *out = NULL;
  db_job_brief_t b;
  int rc = db_job_brief(svc_db(s), id, &b);
  if (rc == TY_ENOTFOUND) snprintf(msg, msgsz, "no job with id '%s'", id);
  if (rc) return rc;
  if (attempt > b.attempt) {
    snprintf(msg, msgsz, "job %s has had %d attempt%s, so no attempt %d", id, b.attempt,
             b.attempt == 1 ? "" : "s", attempt);
    return TY_ENOTFOUND;
  }
  db_metric_point_t *p = NULL;
  size_t n = 0;
  int used = attempt;
  rc = db_metric_points(svc_db(s), id, attempt, from_step, to_step, &used, &p, &n);
  if (rc) {
    if (rc == TY_ENOTFOUND) snprintf(msg, msgsz, "no job with id '%s'", id);
    return rc;
  }
  json_t *ranks = json_array();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && p[j].rank == p[i].rank) j++;
    json_array_append_new(ranks, rank_series(p + i, j - i, max_points));
    i = j;
  }
  free(p);
  *out = json_pack("{s:s, s:i, s:I, s:o, s:o, s:o}", "job_id", id, "attempt", used, "from_step",
                   (json_int_t)from_step, "to_step",
                   to_step == INT64_MAX ? json_null() : json_integer(to_step), "max_points",
                   max_points > 0 ? json_integer(max_points) : json_null(), "ranks", ranks);
  return 0;
}
