/* db_internal.h - what the db_*.c files share: the connection, its lock and
 * the small statement helpers. Not for use outside db/. */
#ifndef TY_DB_INTERNAL_H
#define TY_DB_INTERNAL_H

#include <pthread.h>

#include <sqlite3.h>

#include "db/db.h"

struct db {
  sqlite3 *conn;
  pthread_mutex_t lock; /* one statement sequence or transaction at a time */
};

/* Prepares sql on db->conn; logs and returns TY_EINTERNAL on failure. */
int dbi_prepare(db_t *db, const char *sql, sqlite3_stmt **st);
/* Runs sql (no results) on db->conn; TY_EINTERNAL on failure (logged). */
int dbi_exec(db_t *db, const char *sql);
/* Maps an sqlite result code to a TY_E* code, logging what failed. */
int dbi_err(db_t *db, int rc, const char *what);
/* A copy of a text column (NULL for SQL NULL), the caller's. */
char *dbi_text_dup(sqlite3_stmt *st, int col);
/* Copies a text column into buf (size bytes, always terminated). */
void dbi_text_copy(sqlite3_stmt *st, int col, char *buf, size_t size);
/* Appends an event row inside the caller's transaction; returns its seq or
 * a negative TY_E* code. data is borrowed. */
int64_t dbi_event_append(db_t *db, const char *id, const char *type, json_t *data);

/* The "state" event of a new job (from null to queued), written by
 * db_job_insert inside its transaction; same shape as a transition's. */
int dbi_created_event(db_t *db, const char *id, const char *reason);

#endif
