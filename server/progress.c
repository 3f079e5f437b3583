/* progress.c - a job's progress, ETA and throughput; see progress.h. */
#include "server/progress.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "db/db.h"

/* Whether a rank is past loading: it has done a step or says so. */
static bool past_loading(const progress_rank_t *r) {
  return r->step > 0 || !strcmp(r->phase, "training") || !strcmp(r->phase, "saving") ||
         !strcmp(r->phase, "done");
}

static bool stepping(const progress_rank_t *r) {
  return !strcmp(r->phase, "training") || !strcmp(r->phase, "saving");
}

void progress_compute(int state, const progress_rank_t *ranks, int n, const int64_t *steps,
                      const double *t, int npts, progress_t *out) {
  *out = (progress_t){.progress = 0, .phase = "", .eta_seconds = NAN, .tokens_per_s = 0};
  if (state == DB_JOB_SUCCEEDED) {
    *out = (progress_t){.progress = 1, .phase = "done", .eta_seconds = 0, .tokens_per_s = 0};
    return;
  }
  if (n <= 0) return;
  const bool active = (DB_MASK_ACTIVE & DB_MASK(state)) != 0;
  bool training = false;
  for (int i = 0; i < n; i++) training |= past_loading(&ranks[i]);
  if (!training) {
    /* While a rank tokenizes a JSONL file, its bytes are the file's; while
     * it scores the reference's pairs (dpo), they are pairs. The latest
     * phase any rank is in counts. */
    const char *phase = "loading";
    for (int i = 0; i < n; i++)
      if (!strcmp(ranks[i].phase, "reference") ||
          (!strcmp(ranks[i].phase, "tokenizing") && strcmp(phase, "reference")))
        phase = ranks[i].phase;
    const bool named = strcmp(phase, "loading") != 0;
    int64_t done = 0, total = 0;
    for (int i = 0; i < n; i++)
      if (ranks[i].bytes_total > 0 && (!named || !strcmp(ranks[i].phase, phase)))
        done += ranks[i].bytes_loaded, total += ranks[i].bytes_total;
    if (total > 0) {
      out->phase = !strcmp(phase, "reference") ? "reference" : named ? "tokenizing" : "loading";
      out->progress = (double)done / (double)total;
      if (out->progress > 1) out->progress = 1;
    }
    return;
  }
  int64_t slowest = ranks[0].step, total = 0;
  for (int i = 0; i < n; i++) {
    if (ranks[i].step < slowest) slowest = ranks[i].step;
    if (ranks[i].total_steps > total) total = ranks[i].total_steps;
    if (active && stepping(&ranks[i]) && isfinite(ranks[i].tokens_per_s))
      out->tokens_per_s += ranks[i].tokens_per_s;
  }
  out->phase = "training";
  if (total > 0) out->progress = slowest >= total ? 1 : (double)slowest / (double)total;
  if (!active) return;
  if (slowest >= total) {
    out->eta_seconds = 0;
    return;
  }
  if (npts >= 2 && t[npts - 1] > t[0] && steps[npts - 1] > steps[0]) {
    double rate = (double)(steps[npts - 1] - steps[0]) / (t[npts - 1] - t[0]); /* steps/s */
    out->eta_seconds = (double)(total - slowest) / rate;
  }
}

void progress_to_json(const progress_t *p, const char *prefix, json_t *o) {
  char key[64];
  snprintf(key, sizeof key, "%sprogress", prefix);
  json_object_set_new(o, key, json_real(p->progress));
  snprintf(key, sizeof key, "%sprogress_phase", prefix);
  json_object_set_new(o, key, json_string(p->phase));
  snprintf(key, sizeof key, "%seta_seconds", prefix);
  json_object_set_new(o, key, isfinite(p->eta_seconds) ? json_real(p->eta_seconds) : json_null());
  snprintf(key, sizeof key, "%stokens_per_s", prefix);
  json_object_set_new(o, key, json_real(p->tokens_per_s));
}
