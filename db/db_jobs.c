/* db_jobs.c - job rows: insert (with Idempotency-Key), get, list, counts,
 * delete; see db.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/xalloc.h"
#include "db/db_internal.h"

#define JOB_COLS                                                                    \
  "seq, id, name, state, reason, spec, idempotency_key, token, world_size, device," \
  " max_restarts, attempt, created_at, updated_at, coalesce(started_at, 0),"        \
  " coalesce(finished_at, 0), output_dir"

void db_job_free(db_job_t *j) {
  if (!j) return;
  free(j->name);
  free(j->reason);
  free(j->spec);
  free(j->idempotency_key);
  free(j->output_dir);
  free(j);
}

void db_jobs_free(db_job_t **jobs, size_t n) {
  for (size_t i = 0; jobs && i < n; i++) db_job_free(jobs[i]);
  free(jobs);
}

/* Copies the JOB_COLS of the current row into a new job. */
static db_job_t *job_from_row(sqlite3_stmt *st) {
  db_job_t *j = xcalloc(1, sizeof *j);
  j->seq = sqlite3_column_int64(st, 0);
  dbi_text_copy(st, 1, j->id, sizeof j->id);
  j->name = dbi_text_dup(st, 2);
  char state[16];
  dbi_text_copy(st, 3, state, sizeof state);
  j->state = db_state_parse(state);
  j->reason = dbi_text_dup(st, 4);
  j->spec = dbi_text_dup(st, 5);
  j->idempotency_key = dbi_text_dup(st, 6);
  dbi_text_copy(st, 7, j->token, sizeof j->token);
  j->world_size = sqlite3_column_int(st, 8);
  dbi_text_copy(st, 9, j->device, sizeof j->device);
  j->max_restarts = sqlite3_column_int(st, 10);
  j->attempt = sqlite3_column_int(st, 11);
  j->created_at = sqlite3_column_double(st, 12);
  j->updated_at = sqlite3_column_double(st, 13);
  j->started_at = sqlite3_column_double(st, 14);
  j->finished_at = sqlite3_column_double(st, 15);
  j->output_dir = dbi_text_dup(st, 16);
  if (!j->name) j->name = xstrdup("");
  if (!j->reason) j->reason = xstrdup("");
  if (!j->spec) j->spec = xstrdup("{}");
  if (!j->output_dir) j->output_dir = xstrdup("");
  return j;
}

/* The first job (oldest) of "SELECT ... FROM jobs WHERE <where>" with value
 * bound to its one parameter, without taking the lock (the caller holds
 * it). TY_ENOTFOUND when no row matches. */
static int job_get_locked(db_t *db, const char *where, const char *value, db_job_t **out) {
  char sql[512];
  snprintf(sql, sizeof sql, "SELECT " JOB_COLS " FROM jobs WHERE %s ORDER BY seq LIMIT 1", where);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, sql, &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, value, -1, SQLITE_STATIC);
  int s = dbi_step(db, st);
  if (s == SQLITE_ROW) {
    *out = job_from_row(st);
    rc = 0;
  } else {
    rc = s == SQLITE_DONE ? TY_ENOTFOUND : dbi_err(db, s, "get job");
  }
  dbi_finish(db, st);
  return rc;
}

/* Matches jobs_unfinished_by_output's WHERE term for term, so that SQLite
 * uses that index. */
#define OUTPUT_USER_WHERE "output_dir = ? AND state IN ('queued','starting','running')"

int db_job_get(db_t *db, const char *id, db_job_t **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = job_get_locked(db, "id = ?", id, out);
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_job_output_user(db_t *db, const char *output_dir, db_job_t **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = job_get_locked(db, OUTPUT_USER_WHERE, output_dir, out);
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_job_brief(db_t *db, const char *id, db_job_brief_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "SELECT state, attempt, world_size, token FROM jobs WHERE id = ?", &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
      char state[16];
      dbi_text_copy(st, 0, state, sizeof state);
      out->state = db_state_parse(state);
      out->attempt = sqlite3_column_int(st, 1);
      out->world_size = sqlite3_column_int(st, 2);
      dbi_text_copy(st, 3, out->token, sizeof out->token);
    } else {
      rc = s == SQLITE_DONE ? TY_ENOTFOUND : dbi_err(db, s, "job brief");
    }
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

static int insert_locked(db_t *db, db_job_t *j, db_job_t **existing) {
  if (j->idempotency_key) {
    int rc = job_get_locked(db, "idempotency_key = ?", j->idempotency_key, existing);
    if (rc == 0) return TY_EEXISTS;
    if (rc != TY_ENOTFOUND) return rc;
  }
  const char *out_dir = j->output_dir ? j->output_dir : "";
  if (out_dir[0]) {
    int rc = job_get_locked(db, OUTPUT_USER_WHERE, out_dir, existing);
    if (rc == 0) return TY_EPRECONDITION;
    if (rc != TY_ENOTFOUND) return rc;
  }
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "INSERT INTO jobs(id, name, state, reason, spec, idempotency_key, token,"
                       " world_size, device, max_restarts, created_at, updated_at, output_dir)"
                       " VALUES (?, ?, 'queued', 'submitted', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       &st);
  if (rc) return rc;
  j->created_at = j->updated_at = db_now();
  sqlite3_bind_text(st, 1, j->id, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, j->name ? j->name : "", -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 3, j->spec, -1, SQLITE_STATIC);
  if (j->idempotency_key)
    sqlite3_bind_text(st, 4, j->idempotency_key, -1, SQLITE_STATIC);
  else
    sqlite3_bind_null(st, 4);
  sqlite3_bind_text(st, 5, j->token, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 6, j->world_size);
  sqlite3_bind_text(st, 7, j->device, -1, SQLITE_STATIC);
  sqlite3_bind_int(st, 8, j->max_restarts);
  sqlite3_bind_double(st, 9, j->created_at);
  sqlite3_bind_double(st, 10, j->updated_at);
  sqlite3_bind_text(st, 11, out_dir, -1, SQLITE_STATIC);
  rc = dbi_step(db, st);
  dbi_finish(db, st);
  if (rc != SQLITE_DONE) return dbi_err(db, rc, "insert job");
  j->seq = sqlite3_last_insert_rowid(db->conn);
  j->state = DB_JOB_QUEUED;
  j->attempt = 0;
  return dbi_created_event(db, j->id, "submitted");
}

int db_job_insert(db_t *db, db_job_t *j, db_job_t **existing) {
  *existing = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = dbi_begin(db);
  if (!rc) {
    rc = insert_locked(db, j, existing);
    rc = dbi_end(db, rc);
  }
  pthread_mutex_unlock(&db->lock);
  if (!rc) {
    free(j->reason);
    j->reason = xstrdup("submitted");
  }
  return rc;
}

/* Whether a started rank of any attempt of job id has no recorded end
 * (the caller holds the lock): 1, 0, or a negative TY_E* code. */
static int has_unfinished_rank_locked(db_t *db, const char *id) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db,
                       "SELECT 1 FROM ranks WHERE job_id = ? AND pid IS NOT NULL"
                       " AND finished_at IS NULL LIMIT 1",
                       &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int s = dbi_step(db, st);
  rc = s == SQLITE_ROW ? 1 : s == SQLITE_DONE ? 0 : dbi_err(db, s, "unfinished ranks");
  dbi_finish(db, st);
  return rc;
}

static int delete_locked(db_t *db, const char *id, db_job_t **out) {
  int rc = job_get_locked(db, "id = ?", id, out);
  if (rc) return rc;
  if (!db_state_final((*out)->state)) return TY_EPRECONDITION;
  if ((rc = has_unfinished_rank_locked(db, id)) != 0) return rc > 0 ? TY_EUNAVAILABLE : rc;
  sqlite3_stmt *st;
  if ((rc = dbi_prepare(db, "DELETE FROM jobs WHERE id = ?", &st))) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int s = dbi_step(db, st);
  dbi_finish(db, st);
  return s == SQLITE_DONE ? 0 : dbi_err(db, s, "delete job");
}

int db_job_delete(db_t *db, const char *id, db_job_t **out) {
  *out = NULL;
  pthread_mutex_lock(&db->lock);
  int rc = dbi_begin(db);
  if (!rc) {
    rc = delete_locked(db, id, out);
    rc = dbi_end(db, rc);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_job_set_reason(db_t *db, const char *id, unsigned state_mask, const char *reason) {
  pthread_mutex_lock(&db->lock);
  int rc = dbi_begin(db);
  sqlite3_stmt *st;
  if (!rc) rc = dbi_prepare(db, "SELECT state FROM jobs WHERE id = ?", &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    int s = dbi_step(db, st);
    char state[16] = "";
    if (s == SQLITE_ROW) dbi_text_copy(st, 0, state, sizeof state);
    dbi_finish(db, st);
    int cur = db_state_parse(state);
    rc = s == SQLITE_ROW ? (cur >= 0 && (state_mask & DB_MASK(cur)) ? 0 : TY_EPRECONDITION)
         : s == SQLITE_DONE ? TY_ENOTFOUND
                            : dbi_err(db, s, "job state");
  }
  if (!rc) rc = dbi_prepare(db, "UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?", &st);
  if (!rc) {
    sqlite3_bind_text(st, 1, reason, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 2, db_now());
    sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
    int s = dbi_step(db, st);
    dbi_finish(db, st);
    if (s != SQLITE_DONE) rc = dbi_err(db, s, "job reason");
  }
  rc = dbi_end(db, rc);
  pthread_mutex_unlock(&db->lock);
  return rc;
}

/* Appends " AND state IN (...)" for the states of mask to sql. */
static void append_state_filter(char *sql, size_t size, unsigned mask) {
  if (!mask) return;
  size_t len = strlen(sql);
  len += (size_t)snprintf(sql + len, size - len, " AND state IN (");
  const char *sep = "";
  for (int s = 0; s < DB_JOB_STATE_COUNT; s++) {
    if (!(mask & DB_MASK(s))) continue;
    len += (size_t)snprintf(sql + len, size - len, "%s'%s'", sep, db_state_name(s));
    sep = ",";
  }
  snprintf(sql + len, size - len, ")");
}

static int list_query(db_t *db, const char *sql, int64_t bound, int limit, db_job_t ***out,
                      size_t *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, sql, &st);
  if (rc) goto done;
  sqlite3_bind_int64(st, 1, bound);
  sqlite3_bind_int(st, 2, limit);
  db_job_t **jobs = xcalloc((size_t)(limit > 0 ? limit : 1), sizeof *jobs);
  size_t count = 0;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW && count < (size_t)limit)
    jobs[count++] = job_from_row(st);
  if (s != SQLITE_ROW && s != SQLITE_DONE) {
    rc = dbi_err(db, s, "list jobs");
    db_jobs_free(jobs, count);
  } else {
    *out = jobs;
    *n = count;
  }
  dbi_finish(db, st);
done:
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int db_job_list(db_t *db, unsigned state_mask, int64_t before_seq, int limit, db_job_t ***out,
                size_t *n) {
  char sql[512] = "SELECT " JOB_COLS " FROM jobs WHERE seq < ?";
  append_state_filter(sql, sizeof sql, state_mask);
  strncat(sql, " ORDER BY seq DESC LIMIT ?", sizeof sql - strlen(sql) - 1);
  return list_query(db, sql, before_seq > 0 ? before_seq : INT64_MAX, limit, out, n);
}

int db_job_list_fifo(db_t *db, unsigned state_mask, int64_t after_seq, int limit,
                     db_job_t ***out, size_t *n) {
  char sql[512] = "SELECT " JOB_COLS " FROM jobs WHERE seq > ?";
  append_state_filter(sql, sizeof sql, state_mask);
  strncat(sql, " ORDER BY seq ASC LIMIT ?", sizeof sql - strlen(sql) - 1);
  return list_query(db, sql, after_seq, limit, out, n);
}

int db_job_count_by_state(db_t *db, int64_t *counts) {
  memset(counts, 0, DB_JOB_STATE_COUNT * sizeof *counts);
  pthread_mutex_lock(&db->lock);
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "SELECT state, count(*) FROM jobs GROUP BY state", &st);
  if (!rc) {
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
      char name[16];
      dbi_text_copy(st, 0, name, sizeof name);
      int k = db_state_parse(name);
      if (k >= 0) counts[k] = sqlite3_column_int64(st, 1);
    }
    if (s != SQLITE_DONE) rc = dbi_err(db, s, "count jobs");
    dbi_finish(db, st);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}
