/* db_internal.h - what the db_*.c files share: the connection, its lock and
 * the small statement helpers. Not for use outside db/. */
#ifndef TY_DB_INTERNAL_H
#define TY_DB_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
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

/* A report of a group-commit batch, copied so that it is written again
 * once the database takes writes if the batch cannot be committed (a full
 * disk, an I/O error): a rank was told it arrived. The fields of
 * db_report_t up to sample_prompt are copied (all ingest reads); the
 * progress and sample events are kept as rendered. */
typedef struct dbi_kept {
  struct dbi_kept *next;
  char id[DB_ID_MAX];
  db_report_t head; /* sample_prompt and after unused */
  char *ev_text, *sample_text; /* owned; sample_text may be NULL */
} dbi_kept_t;
#define DBI_KEPT_HEAD offsetof(db_report_t, sample_prompt)
/* Reports kept at most; past this, a report is refused (TY_EUNAVAILABLE,
 * 503) and its rank keeps it (worker/rank/report.c). */
#define DBI_KEPT_MAX 4096

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
  dbi_kept_t *batch_head, **batch_tail; /* the open batch's reports, oldest first */
  /* Reports of batches that could not be committed, oldest first, written
   * before any other write (dbi_flush), so that what the ranks reported
   * lands in order before their ends and the job's state change. */
  dbi_kept_t *kept_head, **kept_tail;
  size_t kept_n;
  double kept_backoff, kept_retry_at; /* seconds; db_now() of the next try */
  /* A write failed for the disk or the file (full, I/O error, read-only,
   * the file deleted) and none has committed since: the server is not
   * healthy even while nothing is kept (db_write_failing). */
  bool write_failed;
  double probe_at;
  bool faults;      /* opened through the fault-injecting VFS (tests) */
  bool told_open;   /* a transaction left open was reported in the log */ /* db_now() of the next db_write_probe */
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
/* Commits an open report batch and writes the kept reports (caller holds
 * db->lock); after it, no transaction is open. TY_EUNAVAILABLE while kept
 * reports cannot be written (the batch's reports are kept then), so that
 * no later write overtakes them. force: try the kept ones now, not only
 * when their backoff is due. */
int dbi_flush(db_t *db, bool force);
/* BEGIN IMMEDIATE for a durable write, after dbi_flush. */
int dbi_begin(db_t *db);
/* Ends the transaction dbi_begin opened: with rc 0, checks the database
 * file (dbi_file_ok) and commits; otherwise, or when that fails, rolls
 * back. Whatever SQLite did on an error (it may or may not have rolled
 * back already: sqlite3_get_autocommit tells), no transaction is left open
 * afterwards. Returns rc, or the failure of the commit. */
int dbi_end(db_t *db, int rc);
/* Rolls back a transaction that an error left open (SQLite keeps it after
 * some errors, not after others), unless it is the open report batch; a
 * batch that SQLite rolled back has its reports kept. Caller holds the
 * lock. */
void dbi_settle(db_t *db);
/* Whether the name the database was opened by still reaches the file held
 * (one stat, one fstat): 0, else TY_EUNAVAILABLE with the reason recorded
 * as the last error, so that nothing is acknowledged into a deleted file. */
int dbi_file_ok(db_t *db);
/* sqlite3_step with the test fault hook (db_faults.c: "N interrupt" makes
 * the Nth statement fail with SQLITE_INTERRUPT, as SQLite's own
 * interruption does: a write then rolls back its transaction, a read
 * leaves it open). */
int dbi_step(db_t *db, sqlite3_stmt *st);
/* Whether the next statement step is to be interrupted (tests only). */
bool dbi_fault_step(void);
/* The ingest of one report inside the caller's transaction (db_ranks.c). */
int dbi_ingest_locked(db_t *db, const char *id, const db_report_t *r, const char *ev_text,
                      const char *sample_text, bool *progressed);
/* Frees a list of kept reports. */
void dbi_kept_free(dbi_kept_t *k);
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
