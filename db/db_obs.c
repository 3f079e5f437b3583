/* db_obs.c - live ranks' figures and recent step times; see db_obs.h. */
#include "db/db_obs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"
#include "db/db_internal.h"

#define FIGURES_SELECT                                                               \
  "SELECT j.id, j.name, j.state, r.attempt, r.rank, r.phase, r.step, r.total_steps," \
  " r.loss, r.tokens_per_s, r.bytes_loaded, r.bytes_total, r.host_peak_bytes,"       \
  " r.device_peak_bytes, coalesce(r.last_report_at, 0), r.finished_at IS NOT NULL"   \
  " FROM jobs j JOIN ranks r ON r.job_id = j.id AND r.attempt = j.attempt"

int db_rank_figures(db_t *db, const char *id, db_rank_figures_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       id ? FIGURES_SELECT " WHERE j.id = ? ORDER BY r.rank"
                          : FIGURES_SELECT
                           " WHERE j.state IN ('starting', 'running')"
                           " ORDER BY j.seq, r.rank",
                       &st);
  if (rc) goto out;
  if (id) sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  size_t cap = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (*n == cap) *out = xrealloc(*out, (cap = cap ? cap * 2 : 8) * sizeof **out);
    db_rank_figures_t *f = &(*out)[(*n)++];
    memset(f, 0, sizeof *f);
    dbi_text_copy(st, 0, f->job_id, sizeof f->job_id);
    dbi_text_copy(st, 1, f->name, sizeof f->name);
    char state[16];
    dbi_text_copy(st, 2, state, sizeof state);
    f->state = db_state_parse(state);
    f->attempt = sqlite3_column_int(st, 3);
    f->rank = sqlite3_column_int(st, 4);
    dbi_text_copy(st, 5, f->phase, sizeof f->phase);
    f->step = sqlite3_column_int64(st, 6);
    f->total_steps = sqlite3_column_int64(st, 7);
    f->loss = sqlite3_column_type(st, 8) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 8);
    f->tokens_per_s = sqlite3_column_double(st, 9);
    f->bytes_loaded = sqlite3_column_int64(st, 10);
    f->bytes_total = sqlite3_column_int64(st, 11);
    f->host_peak_bytes = sqlite3_column_int64(st, 12);
    f->device_peak_bytes = sqlite3_column_int64(st, 13);
    f->last_report_at = sqlite3_column_double(st, 14);
    f->finished = sqlite3_column_int(st, 15) != 0;
  }
  dbi_finish(db, st);
out:
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_recent_steps(db_t *db, const char *id, int attempt, int rank, int max, int64_t *steps,
                    double *t, int *n) {
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "SELECT step, t FROM metrics WHERE job_id = ? AND attempt = ? AND rank = ?"
                       " ORDER BY step DESC LIMIT ?",
                       &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    sqlite3_bind_int(st, 3, rank);
    sqlite3_bind_int(st, 4, max);
    while (*n < max && sqlite3_step(st) == SQLITE_ROW) {
      steps[*n] = sqlite3_column_int64(st, 0);
      t[*n] = sqlite3_column_double(st, 1);
      (*n)++;
    }
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  /* Newest first from the query; oldest first for the caller. */
  for (int i = 0, j = *n - 1; i < j; i++, j--) {
    int64_t s = steps[i];
    steps[i] = steps[j], steps[j] = s;
    double x = t[i];
    t[i] = t[j], t[j] = x;
  }
  return rc;
}

int db_metric_points(db_t *db, const char *id, int attempt, int64_t from_step, int64_t to_step,
                     int *attempt_out, db_metric_point_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = 0;
  if (attempt <= 0) {
    if (!(rc = dbi_prepare(db, "SELECT attempt FROM jobs WHERE id = ?", &st))) {
      sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
      if (sqlite3_step(st) == SQLITE_ROW)
        attempt = sqlite3_column_int(st, 0);
      else
        rc = TY_ENOTFOUND;
      dbi_finish(db, st);
    }
  }
  *attempt_out = attempt;
  if (!rc)
    rc = dbi_prepare(db,
                     "SELECT rank, step, loss, tokens_per_s, t, rewards_chosen,"
                     " rewards_rejected, rewards_accuracies, rewards_margins, logps_chosen,"
                     " logps_rejected FROM metrics WHERE job_id = ?"
                     " AND attempt = ? AND step BETWEEN ? AND ? ORDER BY rank, step",
                     &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    sqlite3_bind_int64(st, 3, from_step);
    sqlite3_bind_int64(st, 4, to_step);
    size_t cap = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
      if (*n == cap) *out = xrealloc(*out, (cap = cap ? cap * 2 : 256) * sizeof **out);
      db_metric_point_t *p = &(*out)[(*n)++];
      p->rank = sqlite3_column_int(st, 0);
      p->step = sqlite3_column_int64(st, 1);
      p->loss = sqlite3_column_type(st, 2) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 2);
      p->tokens_per_s = sqlite3_column_double(st, 3);
      p->t = sqlite3_column_double(st, 4);
      for (int i = 0; i < REPORT_DPO_N; i++)
        p->dpo[i] =
            sqlite3_column_type(st, 5 + i) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 5 + i);
    }
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}
