/* db_ranks.c - ranks, progress reports, metrics and events; see db.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_util.h"
#include "common/xalloc.h"
#include "db/db_internal.h"

/* Runs a prepared single-step statement and finalizes it; 0 or TY_E*. */
static int step_done(db_t *db, sqlite3_stmt *st, const char *what) {
  int rc = dbi_step(db, st);
  dbi_finish(db, st);
  return rc == SQLITE_DONE ? 0 : dbi_err(db, rc, what);
}

int db_rank_spawned(db_t *db, const char *id, int attempt, int rank, int pid, int64_t pid_start,
                    const char *log_path) {
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_begin(db);
  if (rc) goto out;
  rc = dbi_prepare(db,
                       "UPDATE ranks SET pid = ?, pid_start = ?, log_path = ?, state = 'running'"
                       " WHERE job_id = ? AND attempt = ? AND rank = ?",
                       &st);
  if (!rc) {
    sqlite3_bind_int(st, 1, pid);
    sqlite3_bind_int64(st, 2, pid_start);
    sqlite3_bind_text(st, 3, log_path, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, attempt);
    sqlite3_bind_int(st, 6, rank);
    rc = step_done(db, st, "rank spawned");
  }
  rc = dbi_end(db, rc);
out:
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_rank_finished(db_t *db, const char *id, int attempt, int rank, const char *state,
                     int exit_code, const char *message) {
  pthread_mutex_lock(&db->lock);
  int rc = dbi_begin(db);
  if (rc) goto out;
  sqlite3_stmt *st;
  rc = dbi_prepare(db,
                   "UPDATE ranks SET state = ?, exit_code = ?, finished_at = ?,"
                   " message = CASE WHEN ? <> '' THEN ? ELSE message END"
                   " WHERE job_id = ? AND attempt = ? AND rank = ? AND finished_at IS NULL",
                   &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, state, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, exit_code);
    sqlite3_bind_double(st, 3, db_now());
    sqlite3_bind_text(st, 4, message, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, message, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 7, attempt);
    sqlite3_bind_int(st, 8, rank);
    rc = step_done(db, st, "rank finished");
  }
  if (!rc) {
    json_t *ev = json_pack("{s:i, s:i, s:s, s:i, s:s}", "attempt", attempt, "rank", rank, "state",
                           state, "exit_code", exit_code, "message", message);
    int64_t seq = dbi_event_append(db, id, "rank", ev);
    json_decref(ev);
    if (seq < 0) rc = (int)seq;
  }
  rc = dbi_end(db, rc); /* a COMMIT that failed wrote nothing */
out:
  pthread_mutex_unlock(&db->lock);
  return rc;
}

static json_t *report_json(const db_report_t *r) {
  json_t *o = json_pack(
      "{s:i, s:i, s:i, s:s, s:I, s:I, s:o, s:f, s:I, s:I, s:I, s:I, s:f, s:s}", "attempt",
      r->attempt, "rank", r->rank, "world_size", r->world_size, "phase", r->phase, "step",
      (json_int_t)r->step, "total_steps", (json_int_t)r->total_steps, "loss",
      isfinite(r->loss) ? json_real(r->loss) : json_null(), "tokens_per_s", r->tokens_per_s,
      "bytes_loaded", (json_int_t)r->bytes_loaded, "bytes_total", (json_int_t)r->bytes_total,
      "host_peak_bytes", (json_int_t)r->host_peak_bytes, "device_peak_bytes",
      (json_int_t)r->device_peak_bytes, "load_seconds", r->load_seconds, "message", r->message);
  if (o && r->has_job_progress) {
    json_object_set_new(o, "job_progress", json_real(r->job_progress));
    json_object_set_new(o, "job_progress_phase", json_string(r->job_progress_phase));
    json_object_set_new(o, "job_eta_seconds",
                        isfinite(r->job_eta_seconds) ? json_real(r->job_eta_seconds) : json_null());
    json_object_set_new(o, "job_tokens_per_s", json_real(r->job_tokens_per_s));
  }
  json_t *dpo = o && r->has_dpo ? report_dpo_json(r->dpo) : NULL;
  if (dpo) json_object_set_new(o, "dpo", dpo);
  return o;
}

/* ev_text: the report's "progress" event, rendered before the lock. */
int dbi_ingest_locked(db_t *db, const char *id, const db_report_t *r, const char *ev_text,
                         const char *sample_text, bool *progressed) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "SELECT phase, step, finished_at IS NOT NULL FROM ranks"
                       " WHERE job_id = ? AND attempt = ? AND rank = ?",
                       &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 2, r->attempt);
  sqlite3_bind_int(st, 3, r->rank);
  int s = dbi_step(db, st);
  if (s != SQLITE_ROW) {
    dbi_finish(db, st);
    return s == SQLITE_DONE ? TY_ENOTFOUND : dbi_err(db, s, "read rank");
  }
  char phase[16];
  dbi_text_copy(st, 0, phase, sizeof phase);
  int64_t step = sqlite3_column_int64(st, 1);
  int finished = sqlite3_column_int(st, 2);
  dbi_finish(db, st);
  if (finished) return TY_EPRECONDITION;
  bool changed = strcmp(phase, r->phase) || step != r->step;
  double now = db_now();

  if ((rc = dbi_prepare(db,
                        "UPDATE ranks SET phase = ?, step = ?, total_steps = ?, loss = ?,"
                        " tokens_per_s = ?, bytes_loaded = ?, bytes_total = ?,"
                        " host_peak_bytes = ?, device_peak_bytes = ?, load_seconds = ?,"
                        " message = ?, reports = reports + 1, last_report_at = ?"
                        " WHERE job_id = ? AND attempt = ? AND rank = ?",
                        &st)))
    return rc;
  sqlite3_bind_text(st, 1, r->phase, -1, SQLITE_STATIC);
  sqlite3_bind_int64(st, 2, r->step);
  sqlite3_bind_int64(st, 3, r->total_steps);
  if (isfinite(r->loss))
    sqlite3_bind_double(st, 4, r->loss);
  else
    sqlite3_bind_null(st, 4);
  sqlite3_bind_double(st, 5, r->tokens_per_s);
  sqlite3_bind_int64(st, 6, r->bytes_loaded);
  sqlite3_bind_int64(st, 7, r->bytes_total);
  sqlite3_bind_int64(st, 8, r->host_peak_bytes);
  sqlite3_bind_int64(st, 9, r->device_peak_bytes);
  sqlite3_bind_double(st, 10, r->load_seconds);
  sqlite3_bind_text(st, 11, r->message, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 12, now);
  sqlite3_bind_text(st, 13, id, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 14, r->attempt);
  sqlite3_bind_int(st, 15, r->rank);
  if ((rc = step_done(db, st, "ingest report"))) return rc;

  if (!strcmp(r->phase, "training") && r->step > 0 && step != r->step) {
    if ((rc = dbi_prepare(db,
                          "INSERT OR REPLACE INTO metrics(job_id, attempt, rank, step, loss,"
                          " tokens_per_s, t, rewards_chosen, rewards_rejected,"
                          " rewards_accuracies, rewards_margins, logps_chosen, logps_rejected)"
                          " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          &st)))
      return rc;
    for (int i = 0; i < REPORT_DPO_N; i++)
      if (r->has_dpo && isfinite(r->dpo[i]))
        sqlite3_bind_double(st, 8 + i, r->dpo[i]);
      else
        sqlite3_bind_null(st, 8 + i);
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, r->attempt);
    sqlite3_bind_int(st, 3, r->rank);
    sqlite3_bind_int64(st, 4, r->step);
    if (isfinite(r->loss))
      sqlite3_bind_double(st, 5, r->loss);
    else
      sqlite3_bind_null(st, 5);
    sqlite3_bind_double(st, 6, r->tokens_per_s);
    sqlite3_bind_double(st, 7, now);
    if ((rc = step_done(db, st, "insert metric"))) return rc;
  }
  if (changed) {
    int64_t seq = dbi_event_append_text(db, id, "progress", ev_text);
    if (seq < 0) return (int)seq;
  }
  if (sample_text) {
    int64_t seq = dbi_event_append_text(db, id, "sample", sample_text);
    if (seq < 0) return (int)seq;
    changed = true;
  }
  if (progressed) *progressed = changed;
  return 0;
}

/* Keeps a report (its events as rendered, owned by the entry) at the end
 * of list *tail. */
static void append_report(dbi_kept_t ***tail, const char *id, const db_report_t *r,
                          char *ev_text, char *sample_text) {
  dbi_kept_t *k = xcalloc(1, sizeof *k);
  snprintf(k->id, sizeof k->id, "%s", id);
  memcpy(&k->head, r, DBI_KEPT_HEAD);
  k->ev_text = ev_text;
  k->sample_text = sample_text;
  **tail = k;
  *tail = &k->next;
}

/* Keeps a report that cannot be written now behind the kept ones: 0, or
 * TY_EUNAVAILABLE when DBI_KEPT_MAX are kept (its rank keeps it then). */
static int keep_report(db_t *db, const char *id, const db_report_t *r, char **ev_text,
                       char **sample_text) {
  if (db->kept_n >= DBI_KEPT_MAX) return TY_EUNAVAILABLE;
  if (!db->kept_head) db->kept_tail = &db->kept_head;
  append_report(&db->kept_tail, id, r, *ev_text, *sample_text);
  *ev_text = *sample_text = NULL;
  if (db->kept_n++ == 0) {
    db->kept_backoff = 0.1;
    db->kept_retry_at = db_now() + db->kept_backoff;
  }
  db->write_failed = true;
  return 0;
}

/* One report into the open batch (opened here when none is): 0 with the
 * report in the batch or kept; or its refusal (TY_ENOTFOUND,
 * TY_EPRECONDITION, ...), the batch left as it was. */
static int ingest_batch(db_t *db, const char *id, const db_report_t *r, char **ev_text,
                        char **sample_text, bool *progressed) {
  dbi_settle(db); /* a batch SQLite rolled back after an error is kept */
  if (db->kept_n) (void)dbi_flush(db, false);
  if (db->kept_n) return keep_report(db, id, r, ev_text, sample_text);
  int rc = 0;
  if (!db->batch_open) {
    rc = dbi_file_ok(db);
    if (!rc) rc = dbi_run(db, "BEGIN IMMEDIATE");
    if (rc == TY_EUNAVAILABLE) return keep_report(db, id, r, ev_text, sample_text);
    if (rc) return rc;
    db->batch_open = true;
    db->batch_since = db_now();
  }
  /* A savepoint per report: a report that is refused leaves the batch
   * intact. An error SQLite answers by rolling back the whole batch
   * (sqlite3_get_autocommit tells) has the batch's reports kept. */
  if ((rc = dbi_run(db, "SAVEPOINT report"))) {
    dbi_settle(db);
    return db->kept_n ? keep_report(db, id, r, ev_text, sample_text) : rc;
  }
  rc = dbi_ingest_locked(db, id, r, *ev_text, *sample_text, progressed);
  if (sqlite3_get_autocommit(db->conn)) {
    dbi_settle(db);
    if (progressed) *progressed = false;
    return rc == TY_EUNAVAILABLE || !rc ? keep_report(db, id, r, ev_text, sample_text) : rc;
  }
  int end = rc ? dbi_run(db, "ROLLBACK TO report") : 0;
  if (!end) end = dbi_run(db, "RELEASE report");
  if (end) { /* the batch cannot go on: it is rolled back and kept */
    if (progressed) *progressed = false;
    if (!sqlite3_get_autocommit(db->conn)) dbi_run(db, "ROLLBACK");
    dbi_settle(db);
    return rc && rc != TY_EUNAVAILABLE ? rc : keep_report(db, id, r, ev_text, sample_text);
  }
  if (rc == TY_EUNAVAILABLE) return keep_report(db, id, r, ev_text, sample_text);
  if (rc) return rc;
  append_report(&db->batch_tail, id, r, *ev_text, *sample_text);
  *ev_text = *sample_text = NULL;
  db->batch_n++;
  return 0;
}

int db_report_ingest(db_t *db, const char *id, const db_report_t *r, bool *progressed) {
  if (progressed) *progressed = false;
  /* Rendered outside the lock: every report that moves is an event. */
  json_t *ev = report_json(r);
  char *ev_text = ty_json_dumps(ev, JSON_COMPACT);
  json_decref(ev);
  char *sample_text = NULL;
  if (r->sample_prompt[0]) {
    json_t *se = json_pack("{s:i, s:i, s:I, s:s, s:s}", "attempt", r->attempt, "rank", r->rank,
                           "step", (json_int_t)r->step, "prompt", r->sample_prompt, "text",
                           r->sample_text);
    sample_text = ty_json_dumps(se, JSON_COMPACT);
    json_decref(se);
  }
  pthread_mutex_lock(&db->lock);
  int rc = ingest_batch(db, id, r, &ev_text, &sample_text, progressed);
  if (db->batch_open &&
      (db->batch_n >= DBI_BATCH_N || db_now() - db->batch_since > DBI_BATCH_S))
    (void)dbi_flush(db, false); /* a batch that cannot be committed is kept */
  pthread_mutex_unlock(&db->lock);
  free(ev_text);
  free(sample_text);
  return rc;
}

int db_attempt_set_preempted(db_t *db, const char *id, int attempt) {
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_begin(db);
  if (rc) goto out;
  rc = dbi_prepare(db, "UPDATE attempts SET state = 'preempted' WHERE job_id = ? AND attempt = ?",
                   &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    rc = step_done(db, st, "attempt preempted");
  }
  rc = dbi_end(db, rc);
out:
  pthread_mutex_unlock(&db->lock);
  return rc;
}

/* The count sql (one parameter: the job's id) returns, into *n. */
static int count_of_job(db_t *db, const char *sql, const char *id, int *n) {
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, sql, &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) *n = sqlite3_column_int(st, 0);
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_job_preemptions(db_t *db, const char *id, int *n) {
  return count_of_job(db, "SELECT count(*) FROM attempts WHERE job_id = ? AND state = 'preempted'",
                      id, n);
}

int db_job_unfinished_ranks(db_t *db, const char *id, int *n) {
  return count_of_job(db,
                      "SELECT count(*) FROM ranks r JOIN jobs j"
                      " ON j.id = r.job_id AND j.attempt = r.attempt"
                      " WHERE j.id = ? AND r.pid IS NOT NULL AND r.finished_at IS NULL",
                      id, n);
}

int db_live_ranks_each(db_t *db, db_live_rank_fn fn, void *ctx) {
  /* Copy the rows out first: fn may call back into db. */
  typedef struct {
    char id[DB_ID_MAX];
    int attempt, rank, pid;
    int64_t start;
  } row_t;
  row_t *rows = NULL;
  size_t n = 0, cap = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "SELECT job_id, attempt, rank, coalesce(pid, 0), coalesce(pid_start, 0)"
                       " FROM ranks WHERE finished_at IS NULL ORDER BY job_id, attempt, rank",
                       &st);
  if (!rc) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      if (n == cap) rows = xrealloc(rows, (cap = cap ? cap * 2 : 16) * sizeof *rows);
      dbi_text_copy(st, 0, rows[n].id, sizeof rows[n].id);
      rows[n].attempt = sqlite3_column_int(st, 1);
      rows[n].rank = sqlite3_column_int(st, 2);
      rows[n].pid = sqlite3_column_int(st, 3);
      rows[n].start = sqlite3_column_int64(st, 4);
      n++;
    }
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  for (size_t i = 0; i < n; i++)
    fn(rows[i].id, rows[i].attempt, rows[i].rank, rows[i].pid, rows[i].start, ctx);
  free(rows);
  return rc;
}

/* The newest attempt of a job when attempt <= 0; TY_ENOTFOUND for no job. */
static int resolve_attempt(db_t *db, const char *id, int *attempt) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "SELECT attempt FROM jobs WHERE id = ?", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  if (sqlite3_step(st) == SQLITE_ROW) {
    if (*attempt <= 0) *attempt = sqlite3_column_int(st, 0);
  } else {
    rc = TY_ENOTFOUND;
  }
  dbi_finish(db, st);
  return rc;
}

static json_t *column_json(sqlite3_stmt *st, int col) {
  switch (sqlite3_column_type(st, col)) {
    case SQLITE_INTEGER: return json_integer(sqlite3_column_int64(st, col));
    case SQLITE_FLOAT: return json_real(sqlite3_column_double(st, col));
    case SQLITE_TEXT: return json_string((const char *)sqlite3_column_text(st, col));
    default: return json_null();
  }
}

int db_ranks_json(db_t *db, const char *id, int attempt, json_t **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = resolve_attempt(db, id, &attempt);
  sqlite3_stmt *st;
  if (!rc)
    rc = dbi_prepare(db,
                     "SELECT rank, state, phase, pid, step, total_steps, loss, tokens_per_s,"
                     " bytes_loaded, bytes_total, host_peak_bytes, device_peak_bytes,"
                     " load_seconds, message, exit_code, reports, last_report_at, finished_at"
                     " FROM ranks WHERE job_id = ? AND attempt = ? ORDER BY rank",
                     &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
      json_t *o = json_object();
      int ncol = sqlite3_column_count(st);
      for (int c = 0; c < ncol; c++)
        json_object_set_new(o, sqlite3_column_name(st, c), column_json(st, c));
      json_array_append_new(arr, o);
    }
    dbi_finish(db, st);
    *out = json_pack("{s:s, s:i, s:o}", "job_id", id, "attempt", attempt, "ranks", arr);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_metrics_json(db_t *db, const char *id, int attempt, json_t **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = resolve_attempt(db, id, &attempt);
  sqlite3_stmt *st;
  if (!rc)
    rc = dbi_prepare(db,
                     "SELECT rank, step, loss, tokens_per_s, t FROM metrics"
                     " WHERE job_id = ? AND attempt = ? ORDER BY rank, step",
                     &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    json_t *ranks = json_array(), *cur = NULL;
    int cur_rank = -1;
    while (sqlite3_step(st) == SQLITE_ROW) {
      int rank = sqlite3_column_int(st, 0);
      if (!cur || rank != cur_rank) {
        cur = json_pack("{s:i, s:[], s:[], s:[], s:[]}", "rank", rank, "steps", "loss",
                        "tokens_per_s", "t");
        json_array_append_new(ranks, cur);
        cur_rank = rank;
      }
      json_array_append_new(json_object_get(cur, "steps"), column_json(st, 1));
      json_array_append_new(json_object_get(cur, "loss"), column_json(st, 2));
      json_array_append_new(json_object_get(cur, "tokens_per_s"), column_json(st, 3));
      json_array_append_new(json_object_get(cur, "t"), column_json(st, 4));
    }
    dbi_finish(db, st);
    *out = json_pack("{s:s, s:i, s:o}", "job_id", id, "attempt", attempt, "ranks", ranks);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_events_json(db_t *db, const char *id, int64_t after_seq, int limit, json_t **out,
                   int64_t *last_seq) {
  *out = NULL;
  *last_seq = after_seq;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "SELECT seq, t, type, data FROM events WHERE job_id = ? AND seq > ?"
                       " ORDER BY seq LIMIT ?",
                       &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, limit);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
      int64_t seq = sqlite3_column_int64(st, 0);
      const char *data = (const char *)sqlite3_column_text(st, 3);
      json_t *d = data ? json_loads(data, 0, NULL) : NULL;
      json_array_append_new(arr, json_pack("{s:I, s:s, s:f, s:s, s:o}", "seq", (json_int_t)seq,
                                           "job_id", id, "t", sqlite3_column_double(st, 1),
                                           "type", (const char *)sqlite3_column_text(st, 2),
                                           "data", d ? d : json_object()));
      *last_seq = seq;
    }
    dbi_finish(db, st);
    *out = arr;
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_rank_log_path(db_t *db, const char *id, int attempt, int rank, char **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = resolve_attempt(db, id, &attempt);
  sqlite3_stmt *st;
  if (!rc)
    rc = dbi_prepare(db, "SELECT log_path FROM ranks WHERE job_id = ? AND attempt = ? AND rank = ?",
                     &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    sqlite3_bind_int(st, 3, rank);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) == SQLITE_TEXT)
      *out = dbi_text_dup(st, 0);
    else
      rc = TY_ENOTFOUND;
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_attempts_close_stale(db_t *db, const char *reason, int *n) {
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_begin(db);
  if (rc) goto out;
  rc = dbi_prepare(db,
                     "UPDATE attempts SET state = 'failed', reason = ?, finished_at = ?"
                     " WHERE finished_at IS NULL AND NOT EXISTS (SELECT 1 FROM jobs j"
                     " WHERE j.id = attempts.job_id AND j.attempt = attempts.attempt"
                     " AND j.state IN ('starting', 'running'))",
                     &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, reason, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, db_now());
    rc = step_done(db, st, "close stale attempts");
    if (!rc) *n = sqlite3_changes(db->conn);
  }
  rc = dbi_end(db, rc);
  if (rc) *n = 0;
out:
  pthread_mutex_unlock(&db->lock);
  return rc;
}
