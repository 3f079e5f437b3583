/* db_internal.h - what the db_*.c files share: the connection, its lock and
 * the small statement helpers. Not for use outside db/. */
#ifndef TY_DB_INTERNAL_H
#define TY_DB_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include <sqlite3.h>

#include "db/db.h"

/* Prepared statements are kept for reuse (preparing costs more than most
 * of our queries): one slot per distinct SQL text, at most DBI_CACHE. */
#define DBI_CACHE 64
typedef struct {
  char *sql;         /* owned copy of the text */
  sqlite3_stmt *st;
  int busy;          /* handed out and not yet finished */
} dbi_cached_t;

struct db {
  sqlite3 *conn;
  int owner_fd;    /* <path>-owner, which names this process's pid; -1 */
  int lock_fd;     /* the database file itself, flock'ed while open; -1 */
  char path[4096]; /* the name it was opened by */
  dev_t dev;       /* ... and the file that name reached then */
  ino_t ino;
  char last_err[512];   /* the last SQLite error logged; "" after a commit */
  pthread_mutex_t lock; /* one statement sequence or transaction at a time */
  dbi_cached_t cache[DBI_CACHE];
  /* Reports are committed in batches (group commit): a transaction opened
   * by db_report_ingest stays open for up to DBI_BATCH_S seconds or
   * DBI_BATCH_N reports, until db_flush, or until any other write, which
   * commits it first. */
  bool batch_open;
  int batch_n;
  double batch_since;   /* db_now() when the batch began */
};
#define DBI_BATCH_S 0.005
#define DBI_BATCH_N 512

/* Prepares sql on db->conn, or hands out its cached statement; logs and
 * returns TY_EINTERNAL on failure. Every statement is given back with
 * dbi_finish (the caller holds db->lock, or is the opener). */
int dbi_prepare(db_t *db, const char *sql, sqlite3_stmt **st);
/* Resets a statement from dbi_prepare for its next use (or finalizes one
 * that was not cached). */
void dbi_finish(db_t *db, sqlite3_stmt *st);
/* Commits an open report batch (caller holds db->lock). */
int dbi_flush(db_t *db);
/* BEGIN IMMEDIATE for a durable write, after committing an open batch. */
int dbi_begin(db_t *db);
/* Finalizes every cached statement (before closing). */
void dbi_cache_clear(db_t *db);
/* Runs sql (no results) on db->conn; TY_EINTERNAL on failure (logged). */
int dbi_exec(db_t *db, const char *sql);
/* dbi_exec for one statement without parameters that runs often (BEGIN,
 * SAVEPOINT, COMMIT, ...): prepared once, through the statement cache. */
int dbi_run(db_t *db, const char *sql);
/* Maps an sqlite result code to a TY_E* code, logging what failed. */
int dbi_err(db_t *db, int rc, const char *what);
/* A copy of a text column (NULL for SQL NULL), the caller's. */
char *dbi_text_dup(sqlite3_stmt *st, int col);
/* Copies a text column into buf (size bytes, always terminated). */
void dbi_text_copy(sqlite3_stmt *st, int col, char *buf, size_t size);
/* Appends an event row inside the caller's transaction; returns its seq or
 * a negative TY_E* code. data is borrowed. */
/* dbi_event_append with data already rendered as JSON text (NULL: {}). */
int64_t dbi_event_append_text(db_t *db, const char *id, const char *type, const char *data);
int64_t dbi_event_append(db_t *db, const char *id, const char *type, json_t *data);

/* The "state" event of a new job (from null to queued), written by
 * db_job_insert inside its transaction; same shape as a transition's. */
int dbi_created_event(db_t *db, const char *id, const char *reason);

/* The name of the fault-injecting VFS (db_faults.c) when the environment
 * asks for it (tests only), else NULL: SQLite's default. */
const char *dbi_faults_vfs(void);

#endif
