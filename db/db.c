/* db.c - opening the database, the ordered migrations, the statement
 * helpers and THE job state change (db_job_transition); see db.h. */
#include "db/db_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/xalloc.h"

/* Schema versions, applied in order: migration i brings user_version from i
 * to i + 1. Never edit a released entry; append a new one. */
static const char *const g_migrations[] = {
    /* 1: the first schema. */
    "CREATE TABLE jobs ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " id TEXT NOT NULL UNIQUE,"
    " name TEXT NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN"
    "  ('queued','starting','running','succeeded','failed','cancelled')),"
    " reason TEXT NOT NULL DEFAULT '',"
    " spec TEXT NOT NULL,"
    " idempotency_key TEXT UNIQUE,"
    " token TEXT NOT NULL,"
    " world_size INTEGER NOT NULL CHECK (world_size >= 1),"
    " device TEXT NOT NULL,"
    " max_restarts INTEGER NOT NULL DEFAULT 0,"
    " attempt INTEGER NOT NULL DEFAULT 0,"
    " created_at REAL NOT NULL, updated_at REAL NOT NULL,"
    " started_at REAL, finished_at REAL);"
    "CREATE INDEX jobs_by_state ON jobs(state, seq);"
    "CREATE TABLE attempts ("
    " job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    " attempt INTEGER NOT NULL,"
    " state TEXT NOT NULL,"
    " reason TEXT NOT NULL DEFAULT '',"
    " started_at REAL NOT NULL, finished_at REAL,"
    " PRIMARY KEY (job_id, attempt));"
    "CREATE TABLE ranks ("
    " job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " pid INTEGER, pid_start INTEGER, log_path TEXT,"
    " state TEXT NOT NULL DEFAULT 'starting',"
    " phase TEXT NOT NULL DEFAULT 'starting',"
    " step INTEGER NOT NULL DEFAULT 0, total_steps INTEGER NOT NULL DEFAULT 0,"
    " loss REAL, tokens_per_s REAL NOT NULL DEFAULT 0,"
    " bytes_loaded INTEGER NOT NULL DEFAULT 0, bytes_total INTEGER NOT NULL DEFAULT 0,"
    " host_peak_bytes INTEGER NOT NULL DEFAULT 0, device_peak_bytes INTEGER NOT NULL DEFAULT 0,"
    " load_seconds REAL NOT NULL DEFAULT 0,"
    " message TEXT NOT NULL DEFAULT '', exit_code INTEGER,"
    " reports INTEGER NOT NULL DEFAULT 0, last_report_at REAL, finished_at REAL,"
    " PRIMARY KEY (job_id, attempt, rank),"
    " FOREIGN KEY (job_id, attempt) REFERENCES attempts(job_id, attempt) ON DELETE CASCADE);"
    "CREATE TABLE metrics ("
    " job_id TEXT NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " step INTEGER NOT NULL, loss REAL, tokens_per_s REAL NOT NULL, t REAL NOT NULL,"
    " PRIMARY KEY (job_id, attempt, rank, step),"
    " FOREIGN KEY (job_id, attempt, rank) REFERENCES ranks(job_id, attempt, rank)"
    "  ON DELETE CASCADE);"
    "CREATE TABLE events ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " job_id TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,"
    " t REAL NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL);"
    "CREATE INDEX events_by_job ON events(job_id, seq);",
    /* 2: each job's output folder, resolved, so that a submit can find an
     * unfinished job writing the same one (db_job_insert). */
    "ALTER TABLE jobs ADD COLUMN output_dir TEXT NOT NULL DEFAULT '';"
    "UPDATE jobs SET output_dir = coalesce(json_extract(spec, '$.output_dir'), '');"
    "CREATE INDEX jobs_unfinished_by_output ON jobs(output_dir)"
    " WHERE state IN ('queued','starting','running');",
    /* 3: a preference-tuning step's metrics (train.objective dpo) with its
     * point, TRL's rewards/... and logps/... as columns; NULL elsewhere. */
    "ALTER TABLE metrics ADD COLUMN rewards_chosen REAL;"
    "ALTER TABLE metrics ADD COLUMN rewards_rejected REAL;"
    "ALTER TABLE metrics ADD COLUMN rewards_accuracies REAL;"
    "ALTER TABLE metrics ADD COLUMN rewards_margins REAL;"
    "ALTER TABLE metrics ADD COLUMN logps_chosen REAL;"
    "ALTER TABLE metrics ADD COLUMN logps_rejected REAL;",
};
#define N_MIGRATIONS ((int)(sizeof g_migrations / sizeof g_migrations[0]))

static const char *const g_state_names[] = {
#define TY_X(id, name) name,
    DB_JOB_STATES(TY_X)
#undef TY_X
};

const char *db_state_name(int state) {
  return state >= 0 && state < DB_JOB_STATE_COUNT ? g_state_names[state] : NULL;
}

int db_state_parse(const char *name) {
  for (int i = 0; i < DB_JOB_STATE_COUNT; i++)
    if (!strcmp(name, g_state_names[i])) return i;
  return -1;
}

bool db_state_final(int state) { return (DB_MASK_FINAL & DB_MASK(state)) != 0; }
int db_schema_version(void) { return N_MIGRATIONS; }

double db_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int dbi_err(db_t *db, int rc, const char *what) {
  /* Said once while it lasts: a write retried every few seconds against a
   * full disk must not fill the log with the same line. */
  char text[sizeof db->last_err];
  snprintf(text, sizeof text, "%s (%d)", sqlite3_errmsg(db->conn), rc);
  if (strcmp(text, db->last_err)) ty_error("sqlite: %s: %s", what, text);
  snprintf(db->last_err, sizeof db->last_err, "%s", text);
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_INTERRUPT: /* only the tests' fault hook interrupts */
      db->write_failed = true;
      return TY_EUNAVAILABLE; /* the disk or the file, not the request */
    case SQLITE_CORRUPT:
      return TY_EDATALOSS;
  }
  return TY_EINTERNAL;
}

static int interrupt_now(void *ctx) {
  (void)ctx;
  return 1;
}

int dbi_step(db_t *db, sqlite3_stmt *st) {
  if (!db->faults || !dbi_fault_step()) return sqlite3_step(st);
  /* sqlite3_interrupt is a no-op while no statement runs: a progress
   * handler interrupts this one from inside, as a real interrupt would. */
  sqlite3_progress_handler(db->conn, 1, interrupt_now, NULL);
  int rc = sqlite3_step(st);
  sqlite3_progress_handler(db->conn, 0, NULL, NULL);
  return rc;
}

int dbi_prepare(db_t *db, const char *sql, sqlite3_stmt **st) {
  dbi_cached_t *free_slot = NULL;
  for (int i = 0; i < DBI_CACHE; i++) {
    dbi_cached_t *c = &db->cache[i];
    if (!c->sql) {
      if (!free_slot) free_slot = c;
      continue;
    }
    if (!c->busy && !strcmp(c->sql, sql)) {
      c->busy = 1;
      *st = c->st;
      return 0;
    }
  }
  int rc = sqlite3_prepare_v3(db->conn, sql, -1, free_slot ? SQLITE_PREPARE_PERSISTENT : 0, st,
                              NULL);
  if (rc != SQLITE_OK) return dbi_err(db, rc, sql);
  if (free_slot) {
    free_slot->sql = xstrdup(sql);
    free_slot->st = *st;
    free_slot->busy = 1;
  }
  return 0;
}

void dbi_finish(db_t *db, sqlite3_stmt *st) {
  for (int i = 0; i < DBI_CACHE; i++)
    if (db->cache[i].st == st && db->cache[i].busy) {
      sqlite3_reset(st);
      sqlite3_clear_bindings(st);
      db->cache[i].busy = 0;
      return;
    }
  sqlite3_finalize(st);
}

int dbi_file_ok(db_t *db) {
  struct stat now, held;
  if (!stat(db->path, &now) && now.st_dev == db->dev && now.st_ino == db->ino &&
      (db->lock_fd < 0 || fstat(db->lock_fd, &held) || held.st_nlink > 0))
    return 0;
  char text[sizeof db->last_err];
  snprintf(text, sizeof text,
           "the database file %.300s was deleted or replaced while this server ran; nothing is "
           "written into it",
           db->path);
  if (strcmp(text, db->last_err)) ty_error("database: %s", text);
  snprintf(db->last_err, sizeof db->last_err, "%s", text);
  db->write_failed = true;
  return TY_EUNAVAILABLE;
}

/* Gives back every cached statement (reset), so that a ROLLBACK that an
 * active statement held up can go through. */
static void reset_all(db_t *db) {
  for (int i = 0; i < DBI_CACHE; i++)
    if (db->cache[i].st) sqlite3_reset(db->cache[i].st);
}

/* Rolls back whatever transaction is open, trying twice. */
static void rollback_open(db_t *db) {
  if (sqlite3_get_autocommit(db->conn)) return;
  if (dbi_run(db, "ROLLBACK") && !sqlite3_get_autocommit(db->conn)) {
    reset_all(db);
    if (dbi_run(db, "ROLLBACK"))
      ty_error("database: a transaction cannot be rolled back (%s); writes fail until it can",
               db->last_err);
  }
}

void dbi_kept_free(dbi_kept_t *k) {
  while (k) {
    dbi_kept_t *next = k->next;
    free(k->ev_text);
    free(k->sample_text);
    free(k);
    k = next;
  }
}

/* Moves the open batch's reports to the end of the kept ones. */
static void keep_batch(db_t *db) {
  db->batch_open = false;
  db->batch_n = 0;
  if (!db->batch_head) return;
  size_t n = 0;
  for (dbi_kept_t *k = db->batch_head; k; k = k->next) n++;
  if (!db->kept_head) db->kept_tail = &db->kept_head;
  *db->kept_tail = db->batch_head;
  db->kept_tail = db->batch_tail;
  db->batch_head = NULL;
  db->batch_tail = &db->batch_head;
  if (!db->kept_n) {
    db->kept_backoff = 0.1;
    ty_warn("database: %zu progress report%s could not be committed (%s); kept in memory and "
            "written, in order, once the database takes writes",
            n, n == 1 ? "" : "s", db->last_err);
  }
  db->kept_n += n;
  db->kept_retry_at = db_now() + db->kept_backoff;
  db->write_failed = true;
}

void dbi_settle(db_t *db) {
  if (sqlite3_get_autocommit(db->conn)) {
    if (db->batch_open) keep_batch(db); /* SQLite rolled the batch back on an error */
    return;
  }
  if (db->batch_open) return;
  if (!db->told_open) {
    db->told_open = true;
    ty_warn("database: a transaction that an error left open is rolled back (%s)", db->last_err);
  }
  rollback_open(db);
}

int dbi_end(db_t *db, int rc) {
  if (!rc) rc = dbi_file_ok(db);
  if (!rc) rc = dbi_run(db, "COMMIT");
  if (rc) rollback_open(db); /* SQLite may or may not have rolled back: never leave it open */
  return rc;
}

/* Writes the kept reports in one transaction, in order; a report the
 * database refuses now (its rank has finished, its job was deleted) is
 * left out. 0, or the failure (all stay kept, tried again after a
 * backoff). */
static int write_kept(db_t *db) {
  /* The log moved into the database file and cut back first: on a disk
   * that filled, that may be the space the kept reports need. */
  sqlite3_wal_checkpoint_v2(db->conn, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
  int rc = dbi_file_ok(db);
  if (!rc) rc = dbi_run(db, "BEGIN IMMEDIATE");
  for (dbi_kept_t *k = db->kept_head; !rc && k; k = k->next) {
    if ((rc = dbi_run(db, "SAVEPOINT report"))) break;
    int irc = dbi_ingest_locked(db, k->id, &k->head, k->ev_text, k->sample_text, NULL);
    if (sqlite3_get_autocommit(db->conn)) {
      rc = irc ? irc : TY_EUNAVAILABLE; /* the whole transaction is gone */
      break;
    }
    if (irc == TY_EUNAVAILABLE) {
      rc = irc;
      break;
    }
    if (irc) rc = dbi_run(db, "ROLLBACK TO report");
    if (!rc) rc = dbi_run(db, "RELEASE report");
  }
  rc = dbi_end(db, rc);
  if (rc) {
    db->kept_backoff = db->kept_backoff * 2 > 1.0 ? 1.0 : db->kept_backoff * 2;
    db->kept_retry_at = db_now() + db->kept_backoff;
    return rc;
  }
  ty_info("database: %zu kept progress report%s written", db->kept_n, db->kept_n == 1 ? "" : "s");
  dbi_kept_free(db->kept_head);
  db->kept_head = NULL;
  db->kept_tail = &db->kept_head;
  db->kept_n = 0;
  return 0;
}

int dbi_flush(db_t *db, bool force) {
  int rc = 0;
  if (db->batch_open && !sqlite3_get_autocommit(db->conn)) {
    db->batch_open = false;
    db->batch_n = 0;
    rc = dbi_end(db, 0);
    if (rc) {
      db->batch_open = true; /* for keep_batch */
      keep_batch(db);
      return rc;
    }
    dbi_kept_free(db->batch_head);
    db->batch_head = NULL;
    db->batch_tail = &db->batch_head;
  }
  dbi_settle(db); /* a batch SQLite rolled back is kept; any other transaction ends */
  if (!db->kept_n) return 0;
  if (!force && db_now() < db->kept_retry_at) return TY_EUNAVAILABLE;
  return write_kept(db);
}

int dbi_begin(db_t *db) {
  int rc = dbi_flush(db, true);
  return rc ? rc : dbi_run(db, "BEGIN IMMEDIATE");
}

/* A small write that tells whether the database takes writes again after
 * one failed while nothing else is waiting to be written: a checkpoint
 * first (it moves the log into the database file and truncates it, giving
 * back the space a full disk held), then the schema version written again
 * (page 1, one frame). */
static void probe(db_t *db) {
  double now = db_now();
  if (now < db->probe_at) return;
  db->probe_at = now + 0.25; /* a small write four times a second at most */
  sqlite3_wal_checkpoint_v2(db->conn, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
  char sql[64];
  snprintf(sql, sizeof sql, "PRAGMA user_version = %d", db_schema_version());
  int rc = dbi_begin(db);
  if (!rc) rc = dbi_run(db, sql);
  if (!dbi_end(db, rc)) ty_info("database: writes work again");
}

int db_flush(db_t *db) {
  pthread_mutex_lock(&db->lock);
  int rc = dbi_flush(db, false);
  if (!rc && db->write_failed) probe(db);
  pthread_mutex_unlock(&db->lock);
  return rc;
}

bool db_write_failing(db_t *db, char *why, size_t size) {
  pthread_mutex_lock(&db->lock);
  bool failing = db->write_failed || db->kept_n;
  if (failing && why && size) {
    if (db->kept_n) /* no count: the cause is logged each time it changes */
      snprintf(why, size,
               "the database cannot be written (%s): progress reports are kept in memory and "
               "written, in order, once it can",
               db->last_err[0] ? db->last_err : "?");
    else
      snprintf(why, size, "the database cannot be written (%s)",
               db->last_err[0] ? db->last_err : "?");
  }
  pthread_mutex_unlock(&db->lock);
  return failing;
}

bool db_in_transaction(db_t *db) {
  pthread_mutex_lock(&db->lock);
  bool open = !sqlite3_get_autocommit(db->conn) && !db->batch_open;
  pthread_mutex_unlock(&db->lock);
  return open;
}

size_t db_kept_reports(db_t *db) {
  pthread_mutex_lock(&db->lock);
  size_t n = db->kept_n;
  pthread_mutex_unlock(&db->lock);
  return n;
}

void dbi_cache_clear(db_t *db) {
  for (int i = 0; i < DBI_CACHE; i++) {
    if (db->cache[i].st) sqlite3_finalize(db->cache[i].st);
    free(db->cache[i].sql);
    memset(&db->cache[i], 0, sizeof db->cache[i]);
  }
}

int dbi_exec(db_t *db, const char *sql) {
  char *err = NULL;
  int rc = sqlite3_exec(db->conn, sql, NULL, NULL, &err);
  if (rc == SQLITE_OK) return 0;
  ty_error("sqlite: %s: %s", sql, err ? err : "?");
  sqlite3_free(err);
  return rc == SQLITE_BUSY ? TY_EUNAVAILABLE : TY_EINTERNAL;
}

int dbi_run(db_t *db, const char *sql) {
  /* A failed COMMIT (disk full, I/O error) has already rolled back. */
  if (!strcmp(sql, "ROLLBACK") && sqlite3_get_autocommit(db->conn)) return 0;
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, sql, &st);
  if (rc) return rc;
  int s;
  while ((s = sqlite3_step(st)) == SQLITE_ROW) {
  }
  rc = s == SQLITE_DONE ? 0 : dbi_err(db, s, sql);
  dbi_finish(db, st);
  if (!rc && !strcmp(sql, "COMMIT")) {
    db->last_err[0] = '\0';
    db->write_failed = false;
    db->told_open = false;
  }
  return rc;
}

void db_last_error(db_t *db, char *buf, size_t size) {
  pthread_mutex_lock(&db->lock);
  snprintf(buf, size, "%s", db->last_err[0] ? db->last_err : "no error recorded");
  pthread_mutex_unlock(&db->lock);
}

char *dbi_text_dup(sqlite3_stmt *st, int col) {
  const unsigned char *t = sqlite3_column_text(st, col);
  return t ? xstrdup((const char *)t) : NULL;
}

void dbi_text_copy(sqlite3_stmt *st, int col, char *buf, size_t size) {
  const unsigned char *t = sqlite3_column_text(st, col);
  snprintf(buf, size, "%s", t ? (const char *)t : "");
}

int64_t dbi_event_append_text(db_t *db, const char *id, const char *type, const char *data) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "INSERT INTO events(job_id, t, type, data) VALUES (?,?,?,?)", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 2, db_now());
  sqlite3_bind_text(st, 3, type, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 4, data ? data : "{}", -1, SQLITE_STATIC);
  rc = dbi_step(db, st);
  dbi_finish(db, st);
  if (rc != SQLITE_DONE) return dbi_err(db, rc, "insert event");
  return sqlite3_last_insert_rowid(db->conn);
}

int64_t dbi_event_append(db_t *db, const char *id, const char *type, json_t *data) {
  char *text = ty_json_dumps(data, JSON_COMPACT);
  int64_t seq = dbi_event_append_text(db, id, type, text);
  free(text);
  return seq;
}

/* mkdir -p of the directory that holds path. */
static int make_parent_dir(const char *path, char *msg, size_t msgsz) {
  char *copy = xstrdup(path);
  char *dir = dirname(copy);
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", dir);
  free(copy);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(buf, 0755) && errno != EEXIST) goto fail;
    *p = '/';
  }
  if (mkdir(buf, 0755) && errno != EEXIST) goto fail;
  return 0;
fail:
  if (msg) snprintf(msg, msgsz, "cannot create directory %s: %s", buf, strerror(errno));
  return TY_EUNAVAILABLE;
}

static int migrate(db_t *db, char *msg, size_t msgsz) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "PRAGMA user_version", &st);
  if (rc) return rc;
  int version = sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
  dbi_finish(db, st);
  if (version > N_MIGRATIONS) {
    if (msg)
      snprintf(msg, msgsz,
               "the database has schema version %d but this trainyardd knows only up to %d; "
               "run a newer trainyardd or point --db at another file",
               version, N_MIGRATIONS);
    return TY_EPRECONDITION;
  }
  for (int v = version; v < N_MIGRATIONS; v++) {
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA user_version = %d", v + 1);
    if ((rc = dbi_exec(db, "BEGIN IMMEDIATE"))) return rc;
    if ((rc = dbi_exec(db, g_migrations[v])) || (rc = dbi_exec(db, pragma))) {
      dbi_exec(db, "ROLLBACK");
      if (msg) snprintf(msg, msgsz, "schema migration %d failed (see the log)", v + 1);
      return rc;
    }
    if ((rc = dbi_exec(db, "COMMIT"))) {
      if (!sqlite3_get_autocommit(db->conn)) dbi_exec(db, "ROLLBACK");
      if (msg) snprintf(msg, msgsz, "schema migration %d could not be committed (see the log)", v + 1);
      return rc;
    }
    ty_info("database: applied schema version %d", v + 1);
  }
  return 0;
}

/* The pid that holds a flock on the file (dev, ino), from /proc/locks; 0
 * when none is listed. */
static long lock_holder(dev_t dev, ino_t ino) {
  FILE *f = fopen("/proc/locks", "r");
  if (!f) return 0;
  char line[256];
  long pid = 0, any = 0;
  while (fgets(line, sizeof line, f)) {
    char kind[16];
    long who;
    unsigned maj, min;
    unsigned long long inode;
    if (sscanf(line, "%*[^:]: %15s %*s %*s %ld %x:%x:%llu", kind, &who, &maj, &min, &inode) != 5 ||
        strcmp(kind, "FLOCK") || inode != (unsigned long long)ino)
      continue;
    /* Overlay file systems may list another device number: an inode
     * match alone is the fallback. */
    if (maj == major(dev) && min == minor(dev)) pid = who;
    if (!any) any = who;
  }
  fclose(f);
  return pid ? pid : any;
}

/* Makes the database this open's alone: an exclusive flock on the database
 * file itself (flock, not the POSIX locks SQLite uses and would lose when
 * another descriptor of the file closed), so that whatever name reaches the
 * file (a symlink, a hard link, another spelling) finds it held. Two
 * servers on one database would each take the other's running ranks for
 * leftovers of a crash and stop them. <path>-owner names the holder's pid
 * for people; the lock is the file's. */
static int take_owner(db_t *db, const char *path, char *msg, size_t msgsz) {
  char owner[PATH_MAX];
  if (snprintf(owner, sizeof owner, "%s-owner", path) >= (int)sizeof owner ||
      strlen(path) >= sizeof db->path) {
    if (msg) snprintf(msg, msgsz, "database path too long: %.64s...", path);
    return TY_EINVAL;
  }
  snprintf(db->path, sizeof db->path, "%s", path);
  db->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  struct stat st;
  if (db->lock_fd < 0 || fstat(db->lock_fd, &st)) {
    if (msg) snprintf(msg, msgsz, "cannot open database %s: %s", path, strerror(errno));
    return TY_EUNAVAILABLE;
  }
  db->dev = st.st_dev;
  db->ino = st.st_ino;
  int rc = ty_flock_try(db->lock_fd);
  if (rc == TY_EPRECONDITION) {
    char pid[32] = "";
    long holder = lock_holder(st.st_dev, st.st_ino);
    if (holder > 0) {
      snprintf(pid, sizeof pid, "%ld", holder);
    } else {
      int fd = open(owner, O_RDONLY | O_CLOEXEC);
      ssize_t n = fd >= 0 ? pread(fd, pid, sizeof pid - 1, 0) : -1;
      if (fd >= 0) close(fd);
      pid[n > 0 ? n : 0] = '\0';
      pid[strcspn(pid, "\n")] = '\0';
    }
    if (msg)
      snprintf(msg, msgsz,
               "database %s is in use by another trainyardd (pid %s, holding a lock on the "
               "file, device %u:%u inode %llu, by whatever name it was given); one database "
               "takes one server, or each would stop the other's ranks: stop that server "
               "first, or give this one another --db",
               path, *pid ? pid : "unknown", major(st.st_dev), minor(st.st_dev),
               (unsigned long long)st.st_ino);
    return rc;
  }
  if (rc) {
    if (msg) snprintf(msg, msgsz, "cannot lock %s: %s", path, strerror(errno));
    return TY_EUNAVAILABLE;
  }
  db->owner_fd = open(owner, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (db->owner_fd < 0 || ftruncate(db->owner_fd, 0) ||
      pwrite(db->owner_fd, pid, (size_t)len, 0) != len)
    ty_warn("cannot write this process's id into %s: %s", owner, strerror(errno));
  return 0;
}

int db_file_check(db_t *db, char *msg, size_t msgsz) {
  struct stat now, held;
  bool gone = stat(db->path, &now) != 0;
  if (!gone && now.st_dev == db->dev && now.st_ino == db->ino &&
      (fstat(db->lock_fd, &held) || held.st_nlink > 0))
    return 0;
  if (msg)
    snprintf(msg, msgsz,
             "the database file %s was %s while this server ran: what it writes now no longer "
             "reaches that name; stop this trainyardd and put the file back (or restart it on "
             "the new one)",
             db->path, gone ? "deleted" : "deleted or replaced by another file");
  return TY_EDATALOSS;
}

/* PRAGMA quick_check: a damaged database is refused at start, naming what
 * SQLite found, instead of failing later in the middle of a job's life. */
static int check_integrity(db_t *db, const char *path, char *msg, size_t msgsz) {
  sqlite3_stmt *st = NULL;
  int rc = sqlite3_prepare_v2(db->conn, "PRAGMA quick_check(3)", -1, &st, NULL);
  char found[600] = "";
  size_t used = 0;
  int s = rc;
  if (rc == SQLITE_OK) {
    while ((s = sqlite3_step(st)) == SQLITE_ROW) {
      const char *t = (const char *)sqlite3_column_text(st, 0);
      if (t && strcmp(t, "ok") && used < sizeof found)
        used += (size_t)snprintf(found + used, sizeof found - used, "%s%s", used ? "; " : "", t);
    }
  }
  if (s != SQLITE_DONE && !found[0]) snprintf(found, sizeof found, "%s", sqlite3_errmsg(db->conn));
  sqlite3_finalize(st);
  if (!found[0]) return 0;
  if (msg)
    snprintf(msg, msgsz,
             "database %s is damaged (PRAGMA quick_check: %s); trainyardd will not run on it: "
             "restore it from a backup, or move it (with its -wal and -shm files) aside to "
             "start with an empty one",
             path, found);
  return TY_EDATALOSS;
}

/* The tables and columns the migrations make, from an empty database in
 * memory: what a file at the current schema version must hold. */
static int expected_schema(sqlite3 **mem) {
  if (sqlite3_open_v2(":memory:", mem, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) return -1;
  for (int v = 0; v < N_MIGRATIONS; v++)
    if (sqlite3_exec(*mem, g_migrations[v], NULL, NULL, NULL) != SQLITE_OK) return -1;
  return 0;
}

/* A file whose schema version is current but which lacks a table, an
 * index or a column the migrations made (dropped by hand, a restore gone
 * wrong) is refused at start, naming what is missing, as a damaged file
 * is: every query on it would fail later, in the middle of a job's life. */
static int check_schema(db_t *db, const char *path, char *msg, size_t msgsz) {
  sqlite3 *mem = NULL;
  char missing[512] = "";
  size_t used = 0;
  if (expected_schema(&mem)) { /* cannot happen: the migrations run on every start */
    sqlite3_close(mem);
    return 0;
  }
  sqlite3_stmt *want = NULL, *have = NULL;
  sqlite3_prepare_v2(mem,
                     "SELECT s.type, s.name, coalesce(c.name, '') FROM sqlite_schema s"
                     " LEFT JOIN pragma_table_info(s.name) c ON s.type = 'table'"
                     " WHERE s.name NOT LIKE 'sqlite_%' ORDER BY s.type DESC, s.name, c.cid",
                     -1, &want, NULL);
  sqlite3_prepare_v2(db->conn,
                     "SELECT (SELECT count(*) FROM sqlite_schema WHERE type = ?1 AND name = ?2),"
                     " ?3 = '' OR EXISTS (SELECT 1 FROM pragma_table_info(?2) WHERE name = ?3)",
                     -1, &have, NULL);
  char last[128] = "";
  while (want && have && sqlite3_step(want) == SQLITE_ROW && used < sizeof missing - 64) {
    const char *type = (const char *)sqlite3_column_text(want, 0);
    const char *name = (const char *)sqlite3_column_text(want, 1);
    const char *col = (const char *)sqlite3_column_text(want, 2);
    sqlite3_bind_text(have, 1, type, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(have, 2, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(have, 3, col, -1, SQLITE_TRANSIENT);
    int s = sqlite3_step(have);
    bool has_obj = s == SQLITE_ROW && sqlite3_column_int(have, 0) > 0;
    bool has_col = s == SQLITE_ROW && sqlite3_column_int(have, 1) > 0;
    sqlite3_reset(have);
    if (!has_obj && strcmp(last, name)) {
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%s '%s'",
                               used ? ", " : "", type, name);
      snprintf(last, sizeof last, "%s", name);
    } else if (has_obj && !has_col) {
      used += (size_t)snprintf(missing + used, sizeof missing - used, "%scolumn '%s.%s'",
                               used ? ", " : "", name, col);
    }
  }
  sqlite3_finalize(want);
  sqlite3_finalize(have);
  sqlite3_close(mem);
  if (!missing[0]) return 0;
  if (msg)
    snprintf(msg, msgsz,
             "database %s is damaged: its schema version is %d (current) but it lacks %s; "
             "trainyardd will not run on it: restore it from a backup, or move it (with its "
             "-wal and -shm files) aside to start with an empty one",
             path, N_MIGRATIONS, missing);
  return TY_EDATALOSS;
}

int db_open(const char *path, db_t **out, char *msg, size_t msgsz) {
  *out = NULL;
  int rc = make_parent_dir(path, msg, msgsz);
  if (rc) return rc;
  db_t *db = xcalloc(1, sizeof *db);
  db->owner_fd = db->lock_fd = -1;
  db->batch_tail = &db->batch_head;
  db->kept_tail = &db->kept_head;
  db->kept_backoff = 0.1;
  pthread_mutex_init(&db->lock, NULL);
  if ((rc = take_owner(db, path, msg, msgsz))) {
    db_close(db);
    return rc;
  }
  const char *vfs = dbi_faults_vfs();
  db->faults = vfs != NULL;
  int src = sqlite3_open_v2(path, &db->conn,
                            SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, vfs);
  if (src != SQLITE_OK) {
    if (msg) snprintf(msg, msgsz, "cannot open database %s: %s", path, sqlite3_errstr(src));
    db_close(db);
    return TY_EUNAVAILABLE;
  }
  sqlite3_busy_timeout(db->conn, 5000);
  if ((rc = check_integrity(db, path, msg, msgsz))) {
    db_close(db);
    return rc;
  }
  /* WAL: readers never block the writer; synchronous=NORMAL keeps every
   * committed transaction across a crash of the process (only a power loss
   * can drop the newest ones). */
  /* The log is checkpointed every 128 pages (512 KiB) and cut back to
   * 512 KiB after each checkpoint, not left at its largest: on a small or
   * nearly full disk the log alone would otherwise take the space that
   * the database needs (SQLite's default lets it reach 4 MiB first). */
  if ((rc = dbi_exec(db, "PRAGMA journal_mode = WAL")) ||
      (rc = dbi_exec(db, "PRAGMA wal_autocheckpoint = 128")) ||
      (rc = dbi_exec(db, "PRAGMA journal_size_limit = 524288")) ||
      (rc = dbi_exec(db, "PRAGMA synchronous = NORMAL")) ||
      (rc = dbi_exec(db, "PRAGMA foreign_keys = ON"))) {
    if (msg) snprintf(msg, msgsz, "cannot configure database %s (see the log)", path);
    db_close(db);
    return rc;
  }
  if ((rc = migrate(db, msg, msgsz)) || (rc = check_schema(db, path, msg, msgsz))) {
    db_close(db);
    return rc;
  }
  *out = db;
  return 0;
}

void db_close(db_t *db) {
  if (!db) return;
  if (db->conn) {
    pthread_mutex_lock(&db->lock);
    dbi_flush(db, true);
    pthread_mutex_unlock(&db->lock);
  }
  if (db->kept_n)
    ty_error("database: %zu progress report%s could not be written before shutdown (%s)",
             db->kept_n, db->kept_n == 1 ? "" : "s", db->last_err);
  dbi_kept_free(db->kept_head);
  dbi_kept_free(db->batch_head);
  dbi_cache_clear(db);
  if (db->conn) sqlite3_close_v2(db->conn);
  if (db->owner_fd >= 0) close(db->owner_fd);
  if (db->lock_fd >= 0) close(db->lock_fd); /* after SQLite: the next owner finds it whole */
  pthread_mutex_destroy(&db->lock);
  free(db);
}

/* The attempt's final state for a job state left from starting/running. */
static const char *attempt_outcome(int to) {
  switch (to) {
    case DB_JOB_SUCCEEDED: return "succeeded";
    case DB_JOB_CANCELLED: return "cancelled";
    default: return "failed";
  }
}

/* Steps of a transition inside the open transaction; see db_job_transition. */
static int tx_transition(db_t *db, const char *id, unsigned from_mask, int to, const char *reason,
                         int *cur, int *attempt_out) {
  sqlite3_stmt *st;
  int rc = dbi_prepare(db, "SELECT state, attempt, world_size FROM jobs WHERE id = ?", &st);
  if (rc) return rc;
  sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
  int s = dbi_step(db, st);
  if (s != SQLITE_ROW) { /* a read that failed is no "not found": the change is kept */
    dbi_finish(db, st);
    return s == SQLITE_DONE ? TY_ENOTFOUND : dbi_err(db, s, "read job state");
  }
  char from_name[16];
  dbi_text_copy(st, 0, from_name, sizeof from_name);
  int attempt = sqlite3_column_int(st, 1), world = sqlite3_column_int(st, 2);
  dbi_finish(db, st);
  int from = db_state_parse(from_name);
  if (cur) *cur = from;
  if (from < 0 || !(from_mask & DB_MASK(from))) return TY_EPRECONDITION;
  double now = db_now();

  if ((DB_MASK_ACTIVE & DB_MASK(from)) && !(DB_MASK_ACTIVE & DB_MASK(to))) {
    if ((rc = dbi_prepare(db,
                          "UPDATE attempts SET state = ?, reason = ?, finished_at = ?"
                          " WHERE job_id = ? AND attempt = ?",
                          &st)))
      return rc;
    sqlite3_bind_text(st, 1, attempt_outcome(to), -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 3, now);
    sqlite3_bind_text(st, 4, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 5, attempt);
    rc = dbi_step(db, st);
    dbi_finish(db, st);
    if (rc != SQLITE_DONE) return dbi_err(db, rc, "close attempt");
  }
  if (to == DB_JOB_STARTING) {
    attempt++;
    if ((rc = dbi_prepare(db, "INSERT INTO attempts(job_id, attempt, state, started_at)"
                              " VALUES (?, ?, 'running', ?)", &st)))
      return rc;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, attempt);
    sqlite3_bind_double(st, 3, now);
    rc = dbi_step(db, st);
    dbi_finish(db, st);
    if (rc != SQLITE_DONE) return dbi_err(db, rc, "open attempt");
    if ((rc = dbi_prepare(db, "INSERT INTO ranks(job_id, attempt, rank) VALUES (?, ?, ?)", &st)))
      return rc;
    for (int r = 0; r < world; r++) {
      sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
      sqlite3_bind_int(st, 2, attempt);
      sqlite3_bind_int(st, 3, r);
      rc = dbi_step(db, st);
      sqlite3_reset(st);
      if (rc != SQLITE_DONE) {
        dbi_finish(db, st);
        return dbi_err(db, rc, "insert rank");
      }
    }
    dbi_finish(db, st);
  }
  if ((rc = dbi_prepare(db,
                        "UPDATE jobs SET state = ?, reason = ?, updated_at = ?, attempt = ?,"
                        " started_at = CASE WHEN ? AND started_at IS NULL THEN ? ELSE started_at END,"
                        " finished_at = CASE WHEN ? THEN ? ELSE NULL END WHERE id = ?",
                        &st)))
    return rc;
  sqlite3_bind_text(st, 1, db_state_name(to), -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, reason, -1, SQLITE_STATIC);
  sqlite3_bind_double(st, 3, now);
  sqlite3_bind_int(st, 4, attempt);
  sqlite3_bind_int(st, 5, to == DB_JOB_STARTING);
  sqlite3_bind_double(st, 6, now);
  sqlite3_bind_int(st, 7, db_state_final(to));
  sqlite3_bind_double(st, 8, now);
  sqlite3_bind_text(st, 9, id, -1, SQLITE_STATIC);
  rc = dbi_step(db, st);
  dbi_finish(db, st);
  if (rc != SQLITE_DONE) return dbi_err(db, rc, "update job state");

  json_t *ev = json_pack("{s:s, s:s, s:s, s:i}", "from", from_name, "to", db_state_name(to),
                         "reason", reason, "attempt", attempt);
  int64_t seq = dbi_event_append(db, id, "state", ev);
  json_decref(ev);
  if (seq < 0) return (int)seq;
  if (attempt_out) *attempt_out = attempt;
  return 0;
}

int db_job_transition(db_t *db, const char *id, unsigned from_mask, int to, const char *reason,
                      int *cur, int *attempt) {
  if (!db_state_name(to)) return TY_EINVAL;
  pthread_mutex_lock(&db->lock);
  int rc = dbi_begin(db);
  if (!rc) {
    rc = tx_transition(db, id, from_mask, to, reason ? reason : "", cur, attempt);
    rc = dbi_end(db, rc);
  }
  pthread_mutex_unlock(&db->lock);
  return rc;
}

int dbi_created_event(db_t *db, const char *id, const char *reason) {
  json_t *ev = json_pack("{s:n, s:s, s:s, s:i}", "from", "to", "queued", "reason", reason,
                         "attempt", 0);
  int64_t seq = dbi_event_append(db, id, "state", ev);
  json_decref(ev);
  return seq < 0 ? (int)seq : 0;
}
